"""Launch parameters of the skinny GEMM (gpu/kernels/skinny_gemm.py): measured tables per GPU, and the rules.

A config is chosen by (row bucket, N, K) from the table of the GPU it runs on: rows are padded up to a power of two
(1, 2, 4, 8, 16, then 32, 64, 128, 256), the sizes the decode graphs' batches and the mixed graphs' token buckets
fall in, so a handful of configs serves every row count and all of them compile at warm-up. Each table is the
fastest config per key in `python -m bench.kernels.skinny_gemm --sweep` on that GPU (bf16, CUDA graphs, weights from
HBM), or None where cuBLAS measured as fast (gpu/layers/linear.py then keeps F.linear).

The one rule for which table: the device's name contains "H100" -> the H100 table, anything else -> the H200 table.
A shape a table lacks: up to 16 rows the rule of `default_config`, which the tables bear out on both GPUs; more rows
stay with cuBLAS (`preferred_config` returns None), since a real GEMM is only worth taking from cuBLAS where it was
measured to win. This module needs no triton (gpu/layers/linear.py
reads its row limits at import).
"""

import functools
from dataclasses import dataclass

FEW_ROWS = 16  # up to here one tile holds every row (fma, or dot with rows padded to 16); more rows: tiles of rows
MAX_ROWS = 256  # the widest row bucket measured; more rows are cuBLAS's GEMM


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int
    block_k: int
    split_k: int = 1
    use_dot: bool = False
    num_warps: int = 4
    num_stages: int = 3
    block_m: int = 16  # rows per tile of the dot path (fma: every row, up to 8, in one tile)
    use_tma: bool = False  # the dot path's tiles brought by the tensor memory accelerator (Hopper)


Table = dict[tuple[int, int, int], SkinnyConfig | None]


def row_bucket(num_rows: int) -> int:
    """1, 2, 4, ..., 256: the padded row count one config serves."""
    return 1 << max(0, num_rows - 1).bit_length()


def _fma(block_n: int = 4, block_k: int = 1024, split_k: int = 1, num_warps: int = 4) -> SkinnyConfig:
    return SkinnyConfig(block_n, block_k, split_k, use_dot=False, num_warps=num_warps, num_stages=1)


def _dot(block_n: int, block_k: int, split_k: int = 1, num_warps: int = 4, num_stages: int = 4,
         block_m: int = 16, use_tma: bool = False) -> SkinnyConfig:
    return SkinnyConfig(block_n, block_k, split_k, True, num_warps, num_stages, block_m, use_tma)


# H200, up to 16 rows. The Qwen3-0.6B shapes: qkv (4096, 1024), o_proj (1024, 2048), gate_up (6144, 1024),
# down (1024, 3072), lm_head (151936, 1024).
H200_TABLE: Table = {
    (1, 4096, 1024): None, (1, 1024, 2048): _fma(), (1, 6144, 1024): None, (1, 1024, 3072): _fma(),
    (2, 4096, 1024): None, (2, 1024, 2048): _fma(), (2, 6144, 1024): None, (2, 1024, 3072): _fma(),
    (4, 4096, 1024): _dot(64, 256), (4, 1024, 2048): _fma(), (4, 6144, 1024): None, (4, 1024, 3072): _dot(64, 128, 4),
    (8, 4096, 1024): _dot(64, 256), (8, 1024, 2048): _dot(64, 128, 4), (8, 6144, 1024): None,
    (8, 1024, 3072): _dot(64, 128, 4),
    (16, 4096, 1024): _dot(32, 128), (16, 1024, 2048): _dot(64, 128, 4), (16, 6144, 1024): None,
    (16, 1024, 3072): _dot(64, 128, 4),
    (1, 151936, 1024): _dot(128, 128, num_warps=8, num_stages=3), (2, 151936, 1024): _dot(128, 128, num_warps=8),
    (4, 151936, 1024): _dot(128, 128, num_warps=8), (8, 151936, 1024): _dot(128, 128, num_warps=8, num_stages=3),
    (16, 151936, 1024): _dot(32, 512, num_stages=2),
}

# H100 80GB HBM3, 1..256 rows, the same shapes: an entry holds a config where two sweeps both measured the kernel
# faster than cuBLAS. The kernel wins on the narrow products (o_proj, down: cuBLAS's tiles leave their 1024 columns to
# few multiprocessors) and the LM head; cuBLAS's GEMM tiles keep qkv and gate_up from 16-32 rows.
_TMA = {"num_warps": 4, "num_stages": 4, "use_tma": True}
H100_TABLE: Table = {
    (1, 4096, 1024): _dot(64, 256, **_TMA), (2, 4096, 1024): _dot(64, 256, **_TMA),
    (4, 4096, 1024): _dot(64, 256, **_TMA), (8, 4096, 1024): _dot(64, 256, **_TMA),
    (16, 4096, 1024): _dot(64, 256, **_TMA),
    (32, 4096, 1024): None, (64, 4096, 1024): None, (128, 4096, 1024): None, (256, 4096, 1024): None,
    (1, 1024, 2048): _fma(4, 2048, num_warps=8), (2, 1024, 2048): _fma(4, 2048, num_warps=8),
    (4, 1024, 2048): _dot(64, 256, **_TMA), (8, 1024, 2048): _dot(64, 256, **_TMA),
    (16, 1024, 2048): _dot(64, 256, **_TMA), (32, 1024, 2048): _dot(64, 256, **_TMA),
    (64, 1024, 2048): _dot(64, 256, **_TMA), (128, 1024, 2048): _dot(64, 256, block_m=32, **_TMA),
    (256, 1024, 2048): None,
    (1, 6144, 1024): _dot(64, 256, **_TMA), (2, 6144, 1024): _dot(64, 256, num_stages=3, use_tma=True),
    (4, 6144, 1024): _dot(64, 256, **_TMA), (8, 6144, 1024): _dot(64, 256, **_TMA),
    (16, 6144, 1024): None, (32, 6144, 1024): None, (64, 6144, 1024): None, (128, 6144, 1024): None,
    (256, 6144, 1024): None,
    (1, 1024, 3072): _fma(4, 1024), (2, 1024, 3072): _fma(4, 1024),
    (4, 1024, 3072): None, (8, 1024, 3072): _dot(64, 256, **_TMA),
    (16, 1024, 3072): _dot(64, 256, 4, **_TMA), (32, 1024, 3072): _dot(64, 256, **_TMA),
    (64, 1024, 3072): _dot(64, 256, **_TMA), (128, 1024, 3072): _dot(64, 256, **_TMA),
    (256, 1024, 3072): _dot(64, 256, block_m=32, **_TMA),
    (1, 151936, 1024): _dot(128, 128, num_warps=8), (2, 151936, 1024): _dot(128, 128, num_warps=8),
    (4, 151936, 1024): _dot(128, 128, num_warps=8), (8, 151936, 1024): _dot(64, 128),
    (16, 151936, 1024): _dot(64, 128),
    # Qwen3-30B-A3B's dense products, 1..16 rows (as above): qkv (5120, 2048), o_proj (2048, 4096), router
    # (128, 2048), lm_head (151936, 2048).
    (1, 5120, 2048): _fma(4, 512), (2, 5120, 2048): None,
    (4, 5120, 2048): _dot(64, 128, **_TMA), (8, 5120, 2048): _dot(64, 128),
    (16, 5120, 2048): _dot(64, 128), (1, 2048, 4096): _fma(4, 2048, num_warps=8),
    (2, 2048, 4096): _dot(64, 128, 4), (4, 2048, 4096): _dot(64, 128, 4),
    (8, 2048, 4096): _dot(64, 128, 4), (16, 2048, 4096): _dot(64, 128, 4),
    (1, 128, 2048): _fma(4, 2048, num_warps=8), (2, 128, 2048): _fma(4, 2048, num_warps=8),
    (4, 128, 2048): _fma(4, 2048, num_warps=8), (8, 128, 2048): _dot(32, 256, 8),
    (16, 128, 2048): _dot(32, 128, 8, num_stages=3), (1, 151936, 2048): _dot(64, 256),
    (2, 151936, 2048): _dot(64, 256), (4, 151936, 2048): _dot(64, 256),
    (8, 151936, 2048): _dot(64, 256), (16, 151936, 2048): _dot(64, 256),
}

TABLES: dict[str, Table] = {"H100": H100_TABLE, "H200": H200_TABLE}

# Prologues (the kernel computes its input: "norm" = residual add + RMSNorm, "silu" = SiLU-and-mul), per GPU: the row
# buckets where a decode step measured faster with them, each run with the fma config (whose programs read whole rows
# of x anyway; the dot paths would make x's padded tiles by pointer loads in every program). GPUs without an entry run
# no prologue.
PROLOGUE_BUCKETS: dict[str, dict[str, tuple[int, ...]]] = {"H100": {"norm": (1,), "silu": (1,)}}


def table_for(device_name: str) -> Table:
    """The table measured on this GPU: the H100's for a name with "H100" in it, else the H200's."""
    return TABLES["H100"] if "H100" in device_name else TABLES["H200"]


@functools.cache
def prologue_buckets_for(device_name: str) -> dict[str, tuple[int, ...]]:
    """The row buckets per prologue kind where this GPU runs prologues (none for an unmeasured GPU), looked up once a
    name."""
    return next((buckets for name, buckets in PROLOGUE_BUCKETS.items() if name in device_name), {})


def prologue_config(num_rows: int, k: int, kind: str, buckets: dict[str, tuple[int, ...]]) -> SkinnyConfig | None:
    """The fma config a product with a `kind` prologue runs with at these rows, or None: no prologue there."""
    if row_bucket(num_rows) not in buckets.get(kind, ()):
        return None
    return _fma(block_k=min(1024, max(16, row_bucket(k))))


def default_config(bucket: int, n: int, k: int) -> SkinnyConfig:
    """The rule for shapes no table holds. One row streams [4, K <= 1024] tiles with FMAs; up to 16 rows use tensor
    cores on [64, 128..256] tiles, split four ways along K when N is too narrow to fill the SMs; more rows take
    [64 columns, up to 64 rows] tiles, split four ways along K for narrow N and long K."""
    if bucket == 1:
        return _fma(block_k=min(1024, max(16, row_bucket(k))))
    if bucket > FEW_ROWS:
        return _dot(64, 64, 4 if n <= 2048 and k >= 1024 else 1, num_stages=3, block_m=min(bucket, 64))
    if n <= 2048 and k >= 512:
        return _dot(64, 128, split_k=4)
    return _dot(64, 256 if k >= 256 else 128)


def preferred_config(num_rows: int, n: int, k: int, table: Table) -> SkinnyConfig | None:
    """The table's entry (None: cuBLAS is as fast there), or for a shape the table lacks the rule up to 16 rows
    and cuBLAS beyond."""
    key = (row_bucket(num_rows), n, k)
    if key in table:
        return table[key]
    return default_config(*key) if key[0] <= FEW_ROWS else None


def config_for(num_rows: int, n: int, k: int, table: Table) -> SkinnyConfig:
    """The config the kernel runs with when given none: the table's, else the rule's."""
    return preferred_config(num_rows, n, k, table) or default_config(row_bucket(num_rows), n, k)
