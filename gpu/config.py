"""What the model runner needs to know to load a model, size its KV cache and choose its kernels, and
the dtypes and attention backends it implements."""

from dataclasses import dataclass

ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton", "flash-attn")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class KernelConfig:
    """Which of our own kernels and weight layouts run where torch code (or cuBLAS) could do the same work.

    The defaults are what the engine runs. The other settings exist so that tests and A/B measurements can
    build a runner with one path off and compare; a runner keeps the choice it was built with.
    """

    fused_elementwise: bool = True  # residual add + RMSNorm, q/k norm + RoPE, SiLU-and-mul as Triton kernels
    # SiLU-and-mul in the gate/up product's epilogue for products of many rows (prompt steps), where quack's gated
    # GEMM runs (gpu/kernels/gated_gemm.py: Hopper, bf16/fp16, the `flash` extra installed).
    gated_gemm: bool = True
    fused_kv_store: bool = True  # ... and the q/k norm + RoPE kernel writes K and V to the cache (no store_kv launch)
    fused_sampling: bool = True  # rows without top-k/top-p/min-p sampled by the Triton kernel
    fused_logit_adjustments: bool = True  # penalties and token masks applied by Triton kernels, one pass each
    skinny_gemm: bool = True  # linear layers on 1..16 rows through the skinny GEMM kernel where its table says so
    skinny_gemm_many_rows: bool = True  # ... and on 17..256 rows (tiles over rows too), where the GPU's table says so
    # Where the GPU's prologue rule says so (1 row on the H100: 0.991 -> 0.965 ms a decode step at a 1k context), the
    # skinny GEMM computes its own input (gpu/layers/linear.py): the residual add + RMSNorm before q/k/v and gate/up
    # (norm_prologues), SiLU-and-mul before down (silu_prologues); one launch less for each.
    norm_prologues: bool = True
    silu_prologues: bool = True
    # Our Triton kernels launched as programmatic dependent launches (Hopper: gpu/kernels/pdl.py), so in a step's graph
    # each kernel's launch overlaps the end of the one before (H100, one row at 1k: 1.189 -> 0.996 ms a decode step).
    pdl_launches: bool = True
    order_decode_rows: bool = True  # decode attention starts the longest contexts first (decode graphs' inputs)
    prefill_step_graphs: bool = True  # steps with prefill replay CUDA graphs per token bucket (gpu/mixed_graphs.py)
    sampling_in_graphs: bool = True  # decode graphs compute the logits and draw plain rows' tokens (gpu/cuda_graphs.py)
    cpu_packed_weights: bool = True  # on a CPU in bfloat16: linear weights packed after loading (gpu/cpu_packing.py)


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
