"""What a request asks of generation: validated once, on construction, with errors that name the field.

Each numeric range is stated once, as a `Bounds` below. `SamplingParams` checks its own fields
against them; the server reads a request field that becomes one of these values with the same
`Bounds` and names the field as the client sent it (`top_logprobs`, `max_completion_tokens`).
`SamplingParamsError` carries the offending field's name.

Stop strings, `skip_special_tokens` and `include_stop_str_in_output` are read by the front end
that turns tokens into text (core/text_tracker.py), never by the engine: `for_engine()` is what
the engine is given.
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace

from core.structured_output import StructuredOutput


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
SEED = Bounds(-(2**63), 2**63 - 1)  # a signed 64-bit integer, as vLLM accepts (torch's long)
PRESENCE_PENALTY = Bounds(-2.0, 2.0)  # OpenAI's range
FREQUENCY_PENALTY = Bounds(-2.0, 2.0)
REPETITION_PENALTY = Bounds(0.0, low_open=True)  # vLLM's: any positive factor
LOGIT_BIAS = Bounds(-100.0, 100.0)  # OpenAI's range of a bias value
# A temperature below this samples greedily, as in vLLM (its _SAMPLING_EPS): it is greedy in all but
# name, and below about 1e-37 logits / temperature overflow float32 and sampling draws from NaNs.
GREEDY_TEMPERATURE = 1e-5


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
    # OpenAI's, over the generated tokens: logit -= frequency * count + presence * (count > 0).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # transformers'/vLLM's, over prompt and output: a seen token's logit / penalty if > 0, else * penalty.
    repetition_penalty: float = 1.0
    # (token id, value) pairs added to the logits before anything else; a mapping is accepted too.
    logit_bias: tuple[tuple[int, float], ...] = ()
    structured_output: StructuredOutput | None = None
    # vLLM's: top alternatives per prompt token, with the prompt token's own logprob; None: none at all.
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _as_tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        if 0.0 < self.temperature < GREEDY_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)
        for name, bounds in _BOUNDS.items():
            value = getattr(self, name)
            if value is not None and not bounds.admits(value):
                raise SamplingParamsError(name, f"{name} must be {bounds}, got {value}")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty strings")
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
               "stop_token_ids must be non-negative integers")
        _check(all(isinstance(t, int) and t >= 0 for t, _ in self.logit_bias), "logit_bias",
               "logit_bias keys must be non-negative token ids")
        _check(all(LOGIT_BIAS.admits(v) for _, v in self.logit_bias), "logit_bias",
               f"logit_bias values must be {LOGIT_BIAS}")
        if self.structured_output is not None:
            # The grammar decides where the output ends: it allows EOS exactly when the output is complete.
            _check(self.min_tokens == 0, "min_tokens", "min_tokens cannot be combined with structured output")
            _check(not self.ignore_eos, "ignore_eos", "ignore_eos cannot be combined with structured output")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def for_engine(self) -> "SamplingParams":
        """These params as the engine gets them: without the stop strings, which only the front end reads."""
        return replace(self, stop=()) if self.stop else self


_BOUNDS = {"temperature": TEMPERATURE, "top_p": TOP_P, "top_k": TOP_K, "min_p": MIN_P, "max_tokens": MAX_TOKENS,
           "min_tokens": MIN_TOKENS, "logprobs": LOGPROBS, "prompt_logprobs": LOGPROBS, "seed": SEED,
           "presence_penalty": PRESENCE_PENALTY, "frequency_penalty": FREQUENCY_PENALTY,
           "repetition_penalty": REPETITION_PENALTY}


def offset_seed(seed: int, offset: int) -> int:
    """`seed + offset` wrapped into SEED's range as signed 64-bit arithmetic wraps: a seed derived from any
    accepted one (choice i of a request samples with its seed + i) is an accepted one too."""
    return (seed + offset + 2**63) % 2**64 - 2**63


def _as_tuple(stop: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    return tuple(stop)


def _bias_pairs(bias: Mapping[int, float] | tuple[tuple[int, float], ...] | None) -> tuple[tuple[int, float], ...]:
    """Sorted (token id, value) pairs, one per token (a later pair for the same token wins)."""
    pairs = dict(bias.items() if isinstance(bias, Mapping) else (bias or ()))
    try:
        return tuple(sorted((t, float(v)) for t, v in pairs.items()))
    except (TypeError, ValueError) as exc:
        raise SamplingParamsError("logit_bias", "logit_bias must map token ids to numbers") from exc


def _check(condition: bool, param: str, message: str) -> None:
    if not condition:
        raise SamplingParamsError(param, message)
