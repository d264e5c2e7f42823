"""Engine configuration: one frozen dataclass per concern, validated on construction.

Nothing writes into a config after start-up; values found at run time (the context length a
model allows, the number of KV blocks that fit) live on the engine.
"""

from dataclasses import dataclass, field

from gpu.config import ATTENTION_BACKENDS, DTYPES


@dataclass(frozen=True)
class ModelConfig:
    model: str  # a checkpoint directory (or a Hub id, resolved before it gets here)
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enforce_eager: bool = False
    attention_backend: str = "auto"
    tokenizer: str | None = None  # None: the model directory

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_blocks: int | None = None  # None: sized from memory
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    # Queue step N+1 on the device before waiting for step N's tokens (vLLM's async scheduling):
    # the host's bookkeeping overlaps the device's work. Off: every step waits for its own tokens.
    async_scheduling: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}), or running sequences could not all decode in one step"
            )


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
