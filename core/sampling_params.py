"""What a request asks of generation: validated once, on construction, with errors that name the field.

Each numeric range is stated once, as a `Bounds` below. `SamplingParams` checks its own fields
against them; the server reads a request field that becomes one of these values with the same
`Bounds` and names the field as the client sent it (`top_logprobs`, `max_completion_tokens`).
`SamplingParamsError` carries the offending field's name.

Stop strings, `skip_special_tokens` and `include_stop_str_in_output` are read by the front end
that turns tokens into text (core/text_tracker.py), never by the engine: `for_engine()` is what
the engine is given.
"""

from dataclasses import dataclass, replace


class SamplingParamsError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Bounds:
    """An allowed numeric range: `low` (exclusive when `low_open`) up to `high`, both inclusive by default."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def admits(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or value <= self.high

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}]"


MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI allows

TEMPERATURE = Bounds(0.0)
TOP_P = Bounds(0.0, 1.0, low_open=True)
TOP_K = Bounds(1)
MIN_P = Bounds(0.0, 1.0)
MAX_TOKENS = Bounds(1)
MIN_TOKENS = Bounds(0)
LOGPROBS = Bounds(0, MAX_LOGPROBS)
SEED = Bounds(-(2**63), 2**64 - 1)  # anything a 64-bit generator seed can hold


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
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _as_tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        for name, bounds in _BOUNDS.items():
            value = getattr(self, name)
            if value is not None and not bounds.admits(value):
                raise SamplingParamsError(name, f"{name} must be {bounds}, got {value}")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty strings")
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
               "stop_token_ids must be non-negative integers")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def for_engine(self) -> "SamplingParams":
        """These params as the engine gets them: without the stop strings, which only the front end reads."""
        return replace(self, stop=()) if self.stop else self


_BOUNDS = {"temperature": TEMPERATURE, "top_p": TOP_P, "top_k": TOP_K, "min_p": MIN_P, "max_tokens": MAX_TOKENS,
           "min_tokens": MIN_TOKENS, "logprobs": LOGPROBS, "seed": SEED}


def _as_tuple(stop: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    return tuple(stop)


def _check(condition: bool, param: str, message: str) -> None:
    if not condition:
        raise SamplingParamsError(param, message)
