"""What a request asks of generation: validated once, on construction, with errors that name the field.

`SamplingParamsError` carries the offending field name so the HTTP layer can answer a 400 that
names the parameter.
"""

from dataclasses import dataclass, field


class SamplingParamsError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    seed: int | None = None
    # None: as many as the context allows (max_model_len - prompt length).
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Number of top alternatives per generated token; None: no logprobs at all.
    logprobs: int | None = None
    extra: dict[str, object] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _as_tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _check(self.temperature >= 0.0, "temperature", f"temperature must be >= 0, got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, "top_p", f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.top_k is None or self.top_k >= 1, "top_k", f"top_k must be >= 1 or None, got {self.top_k}")
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"min_p must be in [0, 1], got {self.min_p}")
        _check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens",
               f"max_tokens must be >= 1, got {self.max_tokens}")
        _check(self.min_tokens >= 0, "min_tokens", f"min_tokens must be >= 0, got {self.min_tokens}")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty strings")
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
               "stop_token_ids must be non-negative integers")
        _check(self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs",
               f"logprobs must be between 0 and 20, got {self.logprobs}")
        _check(self.seed is None or -(2**63) <= self.seed < 2**64, "seed", "seed must fit in 64 bits")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def _as_tuple(stop: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    return tuple(stop)


def _check(condition: bool, param: str, message: str) -> None:
    if not condition:
        raise SamplingParamsError(param, message)
