"""Speculative decoding's settings, by vLLM's `--speculative-config` keys.

`method` names the proposer: `ngram` (prompt lookup: the tokens that followed the latest earlier
occurrence of the sequence's last n tokens, n from `prompt_lookup_max` down to `prompt_lookup_min`),
`suffix` (continuations in the sequence's tokens and earlier outputs, by frequency: the
`suffix_decoding_*` keys), `draft_model` (a smaller checkpoint directory named by `model`, with the
target's tokenizer), `mtp` (the target checkpoint's own multi-token-prediction head: Qwen3-Next, Qwen3.5, Qwen3.5-MoE
and GLM-4-MoE) or `eagle3` (an EAGLE-3 head in the speculators format, a directory named by `model`). A `model`
without a `method` means `draft_model`, as in vLLM.

`num_speculative_tokens` is the most draft tokens a sequence verifies per step; the engine chooses
how many it uses each step (core/speculation_control.py), down to none. One key of ours: `adaptive`
false offers all of them at every step, as vLLM does (the engine never chooses fewer).
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields

METHODS = ("ngram", "suffix", "draft_model", "mtp", "eagle3")
IMPLEMENTED_METHODS = ("ngram", "suffix", "draft_model", "mtp", "eagle3")
METHODS_WITH_MODEL = ("draft_model", "eagle3")  # `model` names the draft checkpoint or head
MAX_SPECULATIVE_TOKENS = 16  # a verify step's row grows by this many tokens at most


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    model: str | None = None  # the draft checkpoint (method draft_model) or head (eagle3)
    # Method suffix (core/suffix_proposer.py), vLLM's names and defaults.
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    # Ours, not vLLM's: false offers num_speculative_tokens drafts at every step, as vLLM does.
    adaptive: bool = True
    # Ours: method ngram lays its verifying steps out on the device where it can (core/device_verification.py), so they
    # overlap the host as plain steps do; false: drafts are always proposed on the host, each verifying step booked
    # before the next is scheduled.
    verify_on_device: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.method not in IMPLEMENTED_METHODS:
            raise ValueError(f"speculative_config.method {self.method!r} is not implemented yet (implemented: "
                             f"{', '.join(IMPLEMENTED_METHODS)})")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        _check_int("prompt_lookup_min", self.prompt_lookup_min, 1, None)
        _check_int("prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min, None)
        _check_int("suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth, 1, None)
        _check_int("suffix_decoding_max_cached_requests", self.suffix_decoding_max_cached_requests, 0, None)
        if not self.suffix_decoding_max_spec_factor > 0:
            raise ValueError("speculative_config.suffix_decoding_max_spec_factor must be > 0, got "
                             f"{self.suffix_decoding_max_spec_factor}")
        if not 0 <= self.suffix_decoding_min_token_prob <= 1:
            raise ValueError("speculative_config.suffix_decoding_min_token_prob must be in [0, 1], got "
                             f"{self.suffix_decoding_min_token_prob}")
        if self.method in METHODS_WITH_MODEL and not self.model:
            raise ValueError("speculative_config.model must name the draft checkpoint (a directory) for method "
                             f"{self.method}")
        if self.model is not None and self.method not in METHODS_WITH_MODEL:
            raise ValueError(f"speculative_config.model names a draft checkpoint, which method {self.method!r} "
                             "does not use")

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> "SpeculativeConfig":
        """From vLLM's keys; an unknown key is an error naming it."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown keys {unknown}; known: {sorted(known)}")
        values = dict(values)
        if values.get("model") is not None and "method" not in values:
            values["method"] = "draft_model"
        for key in ("adaptive", "verify_on_device"):
            if not isinstance(values.get(key, True), bool):
                raise ValueError(f"speculative_config.{key} must be true or false, got {json.dumps(values[key])}")
        integers = ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
                    "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests")
        for key in integers:
            if key in values and (not isinstance(values[key], int) or isinstance(values[key], bool)):
                raise ValueError(f"speculative_config.{key} must be an integer, got {json.dumps(values[key])}")
        for key in ("suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob"):
            if key in values and (not isinstance(values[key], int | float) or isinstance(values[key], bool)):
                raise ValueError(f"speculative_config.{key} must be a number, got {json.dumps(values[key])}")
        if values.get("method") == "suffix" and "num_speculative_tokens" not in values:  # vLLM: the tree's depth
            depth = values.get("suffix_decoding_max_tree_depth", cls.suffix_decoding_max_tree_depth)
            values["num_speculative_tokens"] = min(depth, MAX_SPECULATIVE_TOKENS)  # type: ignore[call-overload]
        if not isinstance(values.get("method", ""), str):
            raise ValueError(f"speculative_config.method must be a string, got {json.dumps(values['method'])}")
        return cls(**values)  # type: ignore[arg-type]


def parse_speculative_config(value: str | Mapping[str, object]) -> SpeculativeConfig:
    """`--speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'`, or the same as a mapping."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative_config must be a JSON object, got {value!r}: {exc}") from exc
    if not isinstance(value, Mapping):
        raise ValueError(f"speculative_config must be a JSON object, got {json.dumps(value)}")
    return SpeculativeConfig.from_mapping(value)


def _check_int(key: str, value: int, low: int, high: int | None) -> None:
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"speculative_config.{key} must be {bound}, got {value}")
