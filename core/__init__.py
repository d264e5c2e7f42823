"""The engine: scheduling, paged KV-cache blocks with prefix caching, and the offline LLM API.

The names below are imported at first use (PEP 562), not with the package: a module that needs one light piece
of `core` (a config, the sampling parameters) does not import the engine, torch and the model code with it. The
server's process starts the engine's process before it imports what serving needs, so both import at once.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from core.engine import LLMEngine
    from core.llm import LLM, GenerationOutput
    from core.outputs import FinishReason, RequestOutput, RequestRejected, TokenLogprobs
    from core.sampling_params import SamplingParams, SamplingParamsError

_MODULES = {
    "CacheConfig": "core.config", "EngineConfig": "core.config", "ModelConfig": "core.config",
    "SchedulerConfig": "core.config", "LLMEngine": "core.engine", "LLM": "core.llm", "GenerationOutput": "core.llm",
    "FinishReason": "core.outputs", "RequestOutput": "core.outputs", "RequestRejected": "core.outputs",
    "TokenLogprobs": "core.outputs", "SamplingParams": "core.sampling_params",
    "SamplingParamsError": "core.sampling_params",
}
__all__ = [
    "LLM",
    "CacheConfig",
    "EngineConfig",
    "FinishReason",
    "GenerationOutput",
    "LLMEngine",
    "ModelConfig",
    "RequestOutput",
    "RequestRejected",
    "SamplingParams",
    "SamplingParamsError",
    "SchedulerConfig",
    "TokenLogprobs",
]


def __getattr__(name: str) -> object:
    if name not in _MODULES:
        raise AttributeError(f"module 'core' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULES[name]), name)
