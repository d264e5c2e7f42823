"""Launch parameters of the quantized GEMMs (gpu/kernels/fp8_gemm.py, int_gemm.py): which path, and its tiles.

`quant_tiles` is the one place that chooses: a per-GPU table keyed by (kind, row bucket, N, K) where a sweep
(`python -m bench.kernels.skinny_gemm --weights fp8 --sweep`, or int4) measured one, else the rules below. Its answer is
`GemvTiles` (gpu/kernels/quant_gemv.py's GEMV path), `WideGemvTiles` (int4_wide_gemv.py's) or `QuantTiles` (the
tensor-core kernels). Many rows leave the kernels for cuBLAS: FP8 from FP8_CUBLAS_MIN_ROWS, integers with 16-bit
activations from INT_CUBLAS_MIN_ROWS (their weight dequantized once a call).

GEMV rule, as the sweep measured it against the tensor-core rule: FP8 at one row takes the GEMV (it measured faster
on every dense shape swept; at two rows on some and at four or more on none); 8-bit integers never (their GEMV
measured faster on few shapes at any row count: it stays for a table's entry to choose). 4-bit integers at one row
take gpu/kernels/int4_wide_gemv.py (`WideGemvTiles`) where K spans two of its tiles or more (WIDE_MIN_K: with one,
no tile lies ahead to fetch), else int4_row_gemv.py, its register-prefetching twin (as does a table's `GemvTiles`
entry); at more rows the tensor cores, but for small products (rows x N x K up to SMALL_INT4_MAX, a verifying
step's at a model of hundreds of millions of parameters), which take quant_gemv's one weight row a program at 2..8
rows (`small_int4_tiles`): there the tensor cores' split-K and reduce cost several one-row GEMVs' time, while every
weight read once a program for all rows is latency, not bandwidth (the H200's sweep of the default model's products
at 2, 4 and 8 rows: this tile beat the tensor cores on each product it takes; the bound lies between the largest
product that won and the smallest that lost). Past 8 rows such products (N x K under NARROW_INT4_MAX_WEIGHTS, up to
NARROW_INT4_MAX_ROWS: a verifying step's rows x (k + 1), a batch's decode rows) take narrow tensor-core tiles without
split-K (`narrow_int4_tiles`): 128-wide tiles leave most multiprocessors idle on a few hundred weight rows, and a
split's reduce costs as much as its product (the H200's sweep of the default model's qkv and gate_up at 16-320 rows:
such tiles beat the 128-wide rule at every row count).
GEMV_MAX_ROWS holds this. Tiles of BLOCK_N 4 weight rows
by 512 bytes of each (2 KB for 128 threads: 16 bytes a thread), narrow so that every product makes hundreds of
programs and the weight stream stays full without split-K;
the columns halve while the float32 sums (rows x tile elements per thread) would pass 64 registers a thread. The
4-bit row GEMVs hold a sum per row and 32 columns instead: ROW_GEMV_BLOCK_N rows, so that each thread multiplies 4
rows with the 32 columns of x it converts once; the row GEMV's tiles up to 4,096 columns, a warp per 1,024 (up to 4);
the wide one's 2,048 columns a warp (two 16-byte loads of each row a thread), one warp a program (its sums reduce
without shared memory), the next two tiles fetched into L2, and K split while its programs would give a
multiprocessor fewer than WIDE_MIN_WARPS warps.

Tensor-core rule: both kernels put the weight tile on the tensor cores' M side (BLOCK_N output columns) and the rows
of x on the N side (BLOCK_M, padded to 16), so a decode step's few rows waste no weight bytes: each weight tile is
read once from memory and multiplied with every row of the step. Few rows make few tiles, so K is split until the
grid holds about two programs per multiprocessor (each slice still two tiles long, so its loads overlap); many rows
take wide row tiles and no split. The weight tile is the kernel's unit of work: BLOCK_K columns of BLOCK_N rows,
32 KB of FP8 or 8 KB of int4 per pipeline stage.

The rule holds for any shape. This module needs no triton.
"""

import functools
from dataclasses import dataclass

from gpu.kernels.device_tables import table_named
from gpu.kernels.skinny_gemm_configs import row_bucket

FP8_CUBLAS_MIN_ROWS = 65  # FP8 products of this many rows or more run in cuBLAS (gpu/quant/fp8.py); fewer, here
# Integer products of 16-bit x from this many rows dequantize the weight once and run in cuBLAS (int_gemm.py): the
# tensor-core kernel dequantizes every weight tile again for every tile of rows, and at prompt steps' rows that
# arithmetic, not the weight's bytes, sets its time.
INT_CUBLAS_MIN_ROWS = 256
NUM_SMS_DEFAULT = 132  # an H100's multiprocessors: the tiles Triton's interpreter runs are those a GPU would
GEMV_MAX_ROWS = {"fp8": 1, "int4": 1, "int8": 0}  # rows the GEMV rule takes per kind: the docstring's reasons
ROW_GEMV_BLOCK_N = 4  # the 4-bit row GEMV's rows per program, each thread's: x converted once for 4 rows
GEMV_MAX_SUMS = 64  # float32 sums a thread holds: rows x its tile elements
SMALL_INT4_MAX = 5 << 20  # rows x N x K up to which 4-bit products at 2..8 rows take `small_int4_tiles`
NARROW_INT4_MAX_WEIGHTS = 1 << 21  # N x K under which 4-bit products past 8 rows take `narrow_int4_tiles`
NARROW_INT4_MAX_ROWS = 512  # ... up to this row bucket (a prefill chunk's thousands of rows fill the GPU in wide tiles)
WIDE_MIN_K = 4096  # columns from which one-row 4-bit products take the wide row GEMV's rule: two of its tiles
WIDE_MIN_WARPS = 6  # warps a multiprocessor the wide row GEMV's programs give it at least, K split if need be


@dataclass(frozen=True)
class QuantTiles:
    block_m: int  # rows of x per program (the MMA's N side: 16 .. 128)
    block_n: int  # output columns per program (weight rows)
    block_k: int  # columns per loop iteration
    split_k: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class GemvTiles:
    rows: int  # rows of x per program (1, 2, 4, 8): the sums' leading axis (1 at more rows: a row's own programs)
    block_n: int  # output columns per program (weight rows)
    block_k: int  # columns per loop iteration
    num_warps: int
    # one row: the one-row kernel of the weights' kind (fp8_row_gemv.py, int4_row_gemv.py) where it takes the
    # arguments; False: quant_gemv.py's GEMV, where the sweep measured that one faster
    is_row_gemv: bool = True
    ahead: bool = False  # quant_gemv's integer GEMV: the next tile's x and group values loaded before this one's use


@dataclass(frozen=True)
class WideGemvTiles:
    """gpu/kernels/int4_wide_gemv.py's tiles (4-bit weights, one row of x): each thread issues block_n x block_k /
    (1,024 num_warps) 16-byte weight loads an iteration, tiles `prefetch` ahead are fetched into L2, K in `split_k`
    slices at most."""

    block_n: int  # weight rows per program, all of them each thread's
    block_k: int  # columns per loop iteration: 1,024 a warp for each 16-byte load a thread issues per row
    num_warps: int
    split_k: int
    prefetch: int  # tiles ahead fetched into L2 (0: none)
    in_order: bool = False  # the weights' loads volatile, which ptxas issues in order: all before the first use

    def __post_init__(self) -> None:
        is_power_of_two = [size > 0 and size & (size - 1) == 0 for size in (self.block_n, self.block_k)]
        if not all(is_power_of_two) or self.block_k < 1024 * self.num_warps:
            raise ValueError(f"block_n and block_k must be powers of two, block_k 1,024 columns a warp or more: {self}")
        if self.split_k < 1 or self.prefetch < 0:
            raise ValueError(f"split_k must be 1 or more, prefetch 0 or more: {self}")


Tiles = QuantTiles | GemvTiles | WideGemvTiles
Table = dict[tuple[str, int, int, int], Tiles]  # (kind, row bucket, N, K) -> the tiles measured fastest there

# Per GPU (a name the device's contains), entries the sweep measured; an unmeasured shape or GPU takes the rules.
# Qwen3-8B's and Qwen3-30B-A3B's dense products (qkv, o_proj, gate_up, down; qkv, o_proj) at 1..8 rows, the lines
# `python -m bench.kernels.skinny_gemm --weights fp8 --sweep` (H100, H200) and `--weights int4 --sweep` (H200) print;
# int4 at one row: the H200's measured against the wide row GEMV; the H100 takes its rule. The default model's
# (SmolLM2-135M, Q4_1: qkv 960x576, o_proj 576x576, gate_up 3072x576, down 576x1536) at 2..8 rows, a verifying
# step's: `--shapes smol_qkv smol_o_proj smol_gate_up smol_down --rows 2 4 8` (H200; the rule's where it measured best;
# rows=1 at more rows: the row GEMV, a row's own programs, measured at 3..8 rows against the entries swept before),
# and qkv and gate_up at `--rows 16 32 64 128 192 320` (H200).
# FP8 at one row: measured against the one-row kernel on both GPUs.
TABLES: dict[str, Table] = {"H100": {
    ('fp8', 1, 6144, 4096): GemvTiles(rows=1, block_n=16, block_k=512, num_warps=4, is_row_gemv=False),
    ('fp8', 2, 6144, 4096): GemvTiles(rows=2, block_n=8, block_k=256, num_warps=4),
    ('fp8', 4, 6144, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=6, num_warps=4, num_stages=3),
    ('fp8', 8, 6144, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=6, num_warps=4, num_stages=3),
    ('fp8', 1, 4096, 4096): GemvTiles(rows=1, block_n=4, block_k=1024, num_warps=4),
    ('fp8', 2, 4096, 4096): GemvTiles(rows=2, block_n=8, block_k=512, num_warps=4),
    ('fp8', 4, 4096, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=8, num_warps=4, num_stages=3),
    ('fp8', 8, 4096, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=8, num_warps=4, num_stages=3),
    ('fp8', 1, 24576, 4096): GemvTiles(rows=1, block_n=4, block_k=1024, num_warps=4),
    ('fp8', 2, 24576, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=2, num_warps=4, num_stages=3),
    ('fp8', 4, 24576, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=2, num_warps=4, num_stages=3),
    ('fp8', 8, 24576, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=2, num_warps=4, num_stages=3),
    ('fp8', 1, 4096, 12288): GemvTiles(rows=1, block_n=2, block_k=2048, num_warps=8),
    ('fp8', 2, 4096, 12288): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=9, num_warps=4, num_stages=3),
    ('fp8', 4, 4096, 12288): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=9, num_warps=4, num_stages=3),
    ('fp8', 8, 4096, 12288): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=9, num_warps=4, num_stages=3),
    ('fp8', 1, 5120, 2048): GemvTiles(rows=1, block_n=4, block_k=1024, num_warps=8),
    ('fp8', 2, 5120, 2048): GemvTiles(rows=2, block_n=8, block_k=256, num_warps=4),
    ('fp8', 4, 5120, 2048): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=4, num_warps=4, num_stages=3),
    ('fp8', 8, 5120, 2048): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=4, num_warps=4, num_stages=3),
    ('fp8', 1, 2048, 4096): GemvTiles(rows=1, block_n=4, block_k=2048, num_warps=8),
    ('fp8', 2, 2048, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=8, num_warps=4, num_stages=3),
    ('fp8', 4, 2048, 4096): GemvTiles(rows=4, block_n=4, block_k=512, num_warps=4),
    ('fp8', 8, 2048, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=8, num_warps=4, num_stages=3),
}, "H200": {
    ('fp8', 1, 6144, 4096): GemvTiles(rows=1, block_n=4, block_k=1024, num_warps=1),
    ('fp8', 2, 6144, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=6, num_warps=4, num_stages=3),
    ('fp8', 4, 6144, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=6, num_warps=4, num_stages=3),
    ('fp8', 8, 6144, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=6, num_warps=4, num_stages=3),
    ('fp8', 1, 4096, 4096): GemvTiles(rows=1, block_n=2, block_k=1024, num_warps=1),
    ('fp8', 2, 4096, 4096): GemvTiles(rows=2, block_n=8, block_k=512, num_warps=4),
    ('fp8', 4, 4096, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=8, num_warps=4, num_stages=3),
    ('fp8', 8, 4096, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=8, num_warps=4, num_stages=3),
    ('fp8', 1, 24576, 4096): GemvTiles(rows=1, block_n=4, block_k=1024, num_warps=1),
    ('fp8', 2, 24576, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=2, num_warps=4, num_stages=3),
    ('fp8', 4, 24576, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=2, num_warps=4, num_stages=3),
    ('fp8', 8, 24576, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=2, num_warps=4, num_stages=3),
    ('fp8', 1, 4096, 12288): GemvTiles(rows=1, block_n=4, block_k=1024, num_warps=2),
    ('fp8', 2, 4096, 12288): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=9, num_warps=4, num_stages=3),
    ('fp8', 4, 4096, 12288): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=9, num_warps=4, num_stages=3),
    ('fp8', 8, 4096, 12288): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=9, num_warps=4, num_stages=3),
    ('fp8', 1, 5120, 2048): GemvTiles(rows=1, block_n=4, block_k=1024, num_warps=2),
    ('fp8', 2, 5120, 2048): GemvTiles(rows=2, block_n=8, block_k=256, num_warps=4),
    ('fp8', 4, 5120, 2048): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=4, num_warps=4, num_stages=3),
    ('fp8', 8, 5120, 2048): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=4, num_warps=4, num_stages=3),
    ('fp8', 1, 2048, 4096): GemvTiles(rows=1, block_n=4, block_k=2048, num_warps=4),
    ('fp8', 2, 2048, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=8, num_warps=4, num_stages=3),
    ('fp8', 4, 2048, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=8, num_warps=4, num_stages=3),
    ('fp8', 8, 2048, 4096): QuantTiles(block_m=16, block_n=128, block_k=256, split_k=8, num_warps=4, num_stages=3),
    ('int4', 1, 6144, 4096): WideGemvTiles(block_n=4, block_k=2048, num_warps=1, split_k=1, prefetch=2),
    ('int4', 1, 4096, 4096): WideGemvTiles(block_n=4, block_k=4096, num_warps=1, split_k=1, prefetch=1),
    ('int4', 1, 24576, 4096): WideGemvTiles(block_n=4, block_k=1024, num_warps=1, split_k=1, prefetch=2, in_order=True),
    ('int4', 1, 4096, 12288): WideGemvTiles(block_n=4, block_k=4096, num_warps=1, split_k=1, prefetch=1),
    ('int4', 1, 5120, 2048): WideGemvTiles(block_n=4, block_k=2048, num_warps=1, split_k=1, prefetch=1),
    ('int4', 1, 2048, 4096): WideGemvTiles(block_n=4, block_k=4096, num_warps=2, split_k=1, prefetch=2),
    ('int4', 2, 6144, 4096): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=6, num_warps=4, num_stages=4),
    ('int4', 4, 6144, 4096): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=6, num_warps=4, num_stages=4),
    ('int4', 8, 6144, 4096): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=6, num_warps=4, num_stages=4),
    ('int4', 2, 4096, 4096): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=9, num_warps=4, num_stages=4),
    ('int4', 4, 4096, 4096): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=9, num_warps=4, num_stages=4),
    ('int4', 8, 4096, 4096): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=9, num_warps=4, num_stages=4),
    ('int4', 2, 24576, 4096): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=2, num_warps=4, num_stages=4),
    ('int4', 4, 24576, 4096): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=2, num_warps=4, num_stages=4),
    ('int4', 8, 24576, 4096): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=2, num_warps=4, num_stages=4),
    ('int4', 2, 4096, 12288): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=9, num_warps=4, num_stages=4),
    ('int4', 4, 4096, 12288): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=9, num_warps=4, num_stages=4),
    ('int4', 8, 4096, 12288): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=9, num_warps=4, num_stages=4),
    ('int4', 2, 5120, 2048): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=7, num_warps=4, num_stages=4),
    ('int4', 4, 5120, 2048): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=7, num_warps=4, num_stages=4),
    ('int4', 8, 5120, 2048): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=7, num_warps=4, num_stages=4),
    ('int4', 2, 2048, 4096): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=16, num_warps=4, num_stages=4),
    ('int4', 4, 2048, 4096): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=16, num_warps=4, num_stages=4),
    ('int4', 8, 2048, 4096): QuantTiles(block_m=16, block_n=128, block_k=128, split_k=16, num_warps=4, num_stages=4),
    ('int4', 2, 960, 576): GemvTiles(rows=2, block_n=1, block_k=1024, num_warps=1),
    ('int4', 4, 960, 576): GemvTiles(rows=1, block_n=8, block_k=1024, num_warps=1),
    ('int4', 8, 960, 576): GemvTiles(rows=1, block_n=4, block_k=256, num_warps=1),
    ('int4', 2, 576, 576): GemvTiles(rows=2, block_n=1, block_k=1024, num_warps=1),
    ('int4', 4, 576, 576): GemvTiles(rows=1, block_n=4, block_k=1024, num_warps=1),
    ('int4', 8, 576, 576): GemvTiles(rows=1, block_n=4, block_k=1024, num_warps=1),
    ('int4', 2, 3072, 576): GemvTiles(rows=2, block_n=2, block_k=256, num_warps=1),
    ('int4', 4, 3072, 576): GemvTiles(rows=4, block_n=2, block_k=128, num_warps=1),
    ('int4', 8, 3072, 576): QuantTiles(block_m=16, block_n=32, block_k=256, split_k=1, num_warps=4, num_stages=1),
    ('int4', 2, 576, 1536): GemvTiles(rows=1, block_n=2, block_k=1024, num_warps=1),
    ('int4', 4, 576, 1536): GemvTiles(rows=1, block_n=2, block_k=512, num_warps=1),
    ('int4', 8, 576, 1536): GemvTiles(rows=1, block_n=4, block_k=512, num_warps=1),
    ('int4', 16, 3072, 576): QuantTiles(block_m=16, block_n=32, block_k=128, split_k=1, num_warps=4, num_stages=3),
    ('int4', 32, 3072, 576): QuantTiles(block_m=32, block_n=16, block_k=128, split_k=1, num_warps=4, num_stages=3),
    ('int4', 64, 3072, 576): QuantTiles(block_m=32, block_n=16, block_k=128, split_k=1, num_warps=4, num_stages=3),
    ('int4', 128, 3072, 576): QuantTiles(block_m=64, block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=3),
    ('int4', 256, 3072, 576): QuantTiles(block_m=64, block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=3),
    ('int4', 512, 3072, 576): QuantTiles(block_m=64, block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=2),
    ('int4', 16, 960, 576): QuantTiles(block_m=16, block_n=16, block_k=256, split_k=1, num_warps=4, num_stages=3),
    ('int4', 32, 960, 576): QuantTiles(block_m=16, block_n=16, block_k=256, split_k=1, num_warps=4, num_stages=3),
    ('int4', 64, 960, 576): QuantTiles(block_m=32, block_n=16, block_k=128, split_k=1, num_warps=4, num_stages=3),
    ('int4', 128, 960, 576): QuantTiles(block_m=32, block_n=16, block_k=128, split_k=1, num_warps=4, num_stages=3),
    ('int4', 256, 960, 576): QuantTiles(block_m=32, block_n=16, block_k=128, split_k=1, num_warps=4, num_stages=3),
    ('int4', 512, 960, 576): QuantTiles(block_m=16, block_n=32, block_k=128, split_k=1, num_warps=4, num_stages=1),
}}


def runs_row_gemv(t: Tiles) -> bool:
    """Whether a product on these tiles runs on its kind's one-row GEMV (where that kernel takes the arguments; the
    4-bit one takes up to 8 rows, each in programs of its own): the one place that chooses between it and
    quant_gemv.py's GEMV."""
    return isinstance(t, GemvTiles) and t.rows == 1 and t.is_row_gemv


@functools.cache
def table_for(device_name: str) -> Table:
    """The table measured on this GPU (empty for a GPU without one, or off CUDA: no name), looked up once a name."""
    table = table_named(TABLES, device_name)
    return {} if table is None else table


def gemv_tiles(num_rows: int, k: int, kind: str) -> GemvTiles:
    """The GEMV rule (module docstring): 4 weight rows of 512 bytes, 4 warps; K tiles halve while the sums would
    pass GEMV_MAX_SUMS a thread, and stay within K's power of two. One row of 4-bit weights: the row GEMV's tiles."""
    rows = row_bucket(num_rows)
    if kind == "int4" and rows == 1:
        return GemvTiles(1, ROW_GEMV_BLOCK_N, min(4096, max(64, row_bucket(k))), 4)
    weights_per_byte = 2 if kind == "int4" else 1
    block_k = 512 * weights_per_byte
    num_warps, block_n = 4, 4
    while block_k > 128 and rows * block_n * block_k > GEMV_MAX_SUMS * 32 * num_warps:
        block_k //= 2
    return GemvTiles(rows, block_n, min(block_k, max(64, row_bucket(k))), num_warps)


def quant_tiles(num_rows: int, n: int, k: int, kind: str, num_sms: int = NUM_SMS_DEFAULT,
                table: Table | None = None) -> Tiles:
    """The path and tiles of an [num_rows, k] x [n, k]^T product with weights of `kind` ("fp8", "int4", "int8"):
    the table's entry for (kind, row bucket, N, K), else the GEMV rule up to GEMV_MAX_ROWS rows, else the
    tensor-core rule."""
    key = (kind, row_bucket(num_rows), n, k)
    if table and key in table:
        return table[key]
    if kind == "int4" and key[1] == 1 and k >= WIDE_MIN_K:
        return wide_gemv_tiles(n, k, num_sms)
    if key[1] <= GEMV_MAX_ROWS[kind]:
        return gemv_tiles(num_rows, k, kind)
    if kind == "int4" and key[1] <= 8 and key[1] * n * k <= SMALL_INT4_MAX:
        return small_int4_tiles(num_rows, k)
    if kind == "int4" and 8 < key[1] <= NARROW_INT4_MAX_ROWS and n * k < NARROW_INT4_MAX_WEIGHTS:
        return narrow_int4_tiles(num_rows)
    return tensor_core_tiles(num_rows, n, k, kind, num_sms)


def narrow_int4_tiles(num_rows: int) -> QuantTiles:
    """The tensor cores' tiles for a small 4-bit product past 8 rows (module docstring): 16 weight rows by 32 rows
    of x a program, 64 past 256 rows; no split."""
    return QuantTiles(min(32, row_tile(num_rows)) if num_rows <= 256 else 64, 16, 128, 1, 4, 3)


def small_int4_tiles(num_rows: int, k: int) -> GemvTiles:
    """quant_gemv's tiles for a small 4-bit product at 2..8 rows (module docstring): one weight row a program, 1,024
    columns of sums a warp across the rows (each thread a word of each row), one warp at 2 rows and two past that."""
    rows = row_bucket(num_rows)
    return GemvTiles(rows, 1, min(1024 // rows, max(64, row_bucket(k))), 1 if rows <= 2 else 2)


def wide_gemv_tiles(n: int, k: int, num_sms: int = NUM_SMS_DEFAULT) -> WideGemvTiles:
    """The wide row GEMV rule (module docstring); each K slice a whole tile at least."""
    block_k = min(2 * 1024, max(1024, row_bucket(k)))
    programs = -(-n // ROW_GEMV_BLOCK_N)
    split = max(1, min(k // block_k, -(-WIDE_MIN_WARPS * num_sms // programs)))
    return WideGemvTiles(ROW_GEMV_BLOCK_N, block_k, 1, split, 2)


def row_tile(num_rows: int) -> int:
    """16, 32, 64 or 128 rows of x per program: the row bucket, within the tensor cores' limits."""
    return min(128, max(16, 1 << max(0, num_rows - 1).bit_length()))


def tensor_core_tiles(num_rows: int, n: int, k: int, kind: str, num_sms: int = NUM_SMS_DEFAULT) -> QuantTiles:
    """The tensor-core kernels' tiles for this product."""
    block_m = row_tile(num_rows)
    few_rows = block_m <= 16
    block_k = 256 if kind == "fp8" and few_rows else 128
    num_warps = 8 if block_m >= 128 else 4
    num_stages = 3 if block_k >= 256 or block_m >= 128 else 4
    tiles = -(-num_rows // block_m) * -(-n // 128)
    most = max(1, k // (2 * block_k))  # each slice at least two tiles long
    split = max(1, min(-(-2 * num_sms // tiles), most)) if block_m <= 64 else 1
    return QuantTiles(block_m, 128, block_k, split, num_warps, num_stages)
