"""What the model runner needs to know to load a model, size its KV cache and choose its kernels."""

from dataclasses import dataclass

ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash-attn")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class KernelConfig:
    """Which of our own kernels run on CUDA where torch code (or cuBLAS) could do the same work.

    The defaults are what the engine runs. The other settings exist so that tests and A/B measurements can
    build a runner with one path off and compare; a runner keeps the choice it was built with.
    """

    fused_elementwise: bool = True  # residual add + RMSNorm, q/k norm + RoPE, SiLU-and-mul as Triton kernels
    fused_sampling: bool = True  # rows without top-k/top-p/min-p sampled by the Triton kernel
    skinny_gemm: bool = True  # linear layers on few rows through the skinny GEMM kernel where its table says so
    skinny_gemm_pdl: bool = False  # ... launched as programmatic dependent launches (Hopper)
    order_decode_rows: bool = True  # decode attention starts the longest contexts first (decode graphs' inputs)


DEFAULT_KERNELS = KernelConfig()


@dataclass(frozen=True)
class RunnerConfig:
    model_path: str
    dtype: str = "auto"
    device: str = "auto"  # auto: cuda when available, else cpu
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: size from memory (gpu_memory_utilization on CUDA)
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    enforce_eager: bool = False
    attention_backend: str = "auto"
    seed: int = 0
    kernels: KernelConfig = DEFAULT_KERNELS

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
