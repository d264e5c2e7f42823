"""The engine: scheduling, paged KV-cache blocks with prefix caching, and the offline LLM API."""

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.engine import LLMEngine
from core.llm import LLM, GenerationOutput
from core.outputs import FinishReason, RequestOutput, RequestRejected, TokenLogprobs
from core.sampling_params import SamplingParams, SamplingParamsError

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
