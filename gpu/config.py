"""What the model runner needs to know to load a model, size its KV cache and choose its kernels, and
the dtypes and attention backends it implements."""

from dataclasses import dataclass

ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton", "flash-attn")
DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "dummy")  # auto: the checkpoint's safetensors; dummy: random weights (gpu/dummy_weights.py)


@dataclass(frozen=True)
class KernelConfig:
    """Whether the runner uses its own kernels and weight layouts or the plain torch code they are tested against, and
    the instruction set its CPU kernels are built for.

    The defaults are what the engine runs; tests build a runner with one of them off and compare the two.
    """

    # Where they run: the Triton kernels (elementwise, skinny GEMM, sampling, penalties and token masks) and quack's
    # gated GEMM. Off: the torch code and cuBLAS, the reference every one of them is tested against.
    fused_kernels: bool = True
    # With them, on CUDA: a step's prompt rows of at most this many tokens (its longest) run the gated delta rule token
    # after token in one launch, longer ones flash-linear-attention's chunked kernel (0: always the chunked kernel).
    # The bound sits below where the sequential kernel's time, growing with the row, meets the chunked kernel's,
    # which its host-side launches keep nearly flat over short rows (measured on Qwen3.5-35B-A3B's shape).
    sequential_delta_rule_max_tokens: int = 512
    # On a CPU in bfloat16: linear weights packed after loading (gpu/cpu_packing.py). Off: the weights as loaded.
    cpu_packed_weights: bool = True
    # On a CPU: the instruction set the C kernels (gpu/cpu_kernels) are compiled for, a gcc -march value. native: this
    # CPU's own; a narrower one (haswell: AVX2 and FMA, no AVX512) runs here the code a CPU without it would run. Never
    # one wider than this CPU's: its instructions would fault.
    cpu_march: str = "native"

    def __post_init__(self) -> None:
        if self.sequential_delta_rule_max_tokens < 0:
            raise ValueError(f"sequential_delta_rule_max_tokens must be at least 0, got "
                             f"{self.sequential_delta_rule_max_tokens}")


DEFAULT_KERNELS = KernelConfig()


@dataclass(frozen=True)
class RunnerConfig:
    """Built from an engine config (core.engine.runner_config), which holds the defaults and checks
    the values (core/config.py); the kernel choices are the runner's own."""

    model_path: str
    dtype: str  # one of DTYPES
    device: str  # auto: cuda when available, else cpu
    block_size: int
    num_kv_blocks: int | None  # None: size from memory (gpu_memory_utilization on CUDA)
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enforce_eager: bool
    attention_backend: str  # one of ATTENTION_BACKENDS
    seed: int
    kernels: KernelConfig = DEFAULT_KERNELS
    tensor_parallel_size: int = 1  # > 1: one worker process per rank (gpu/tensor_parallel_runner.py)
    cache_dir: str | None = None  # where a start's measured choices are remembered (gpu/remembered_backends.py)
    load_format: str = "auto"  # one of LOAD_FORMATS
    # Rows of linear-attention state snapshots after the sequences' slots (gpu/state_cache.py): prefix caching of
    # hybrid models.
    num_state_snapshots: int = 0
    kv_cache_dtype: str = "auto"  # auto: the model's dtype; fp8 or fp8_e4m3: float8_e4m3fn with per-layer scales
    # Speculative decoding's method mtp: the checkpoint's multi-token-prediction head is built and run, and the target's
    # last hidden states are kept per KV slot for it.
    mtp_head: bool = False
    # Speculative decoding's method eagle3: the EAGLE-3 head's directory (speculators format); the target keeps the
    # inputs of three of its layers per KV slot for it.
    eagle3_head: str | None = None
    # Speculative decoding by prompt lookup with verifying steps laid out on the device: the runner keeps each running
    # sequence's tokens there (gpu/token_history.py) and compiles the lookup at start for (most drafts, min n, max n).
    device_ngram: tuple[int, int, int] | None = None

    @property
    def is_fp8_kv_cache(self) -> bool:
        return self.kv_cache_dtype in ("fp8", "fp8_e4m3")
