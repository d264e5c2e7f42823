"""Launch parameters of the quantized GEMMs (gpu/kernels/fp8_gemm.py, int_gemm.py): one rule per row bucket.

Both kernels put the weight tile on the tensor cores' M side (BLOCK_N output columns) and the rows of x on the N
side (BLOCK_M, padded to 16), so a decode step's few rows waste no weight bytes: each weight tile is read once from
memory and multiplied with every row of the step. Few rows make few tiles, so K is split until the grid holds about
two programs per multiprocessor (each slice still two tiles long, so its loads overlap); many rows take wide row
tiles and no split. The weight tile is the kernel's unit of work: BLOCK_K columns of BLOCK_N rows, 32 KB of FP8 or
8 KB of int4 per pipeline stage.

The rule holds for any shape. This module needs no triton.
"""

from dataclasses import dataclass

FP8_CUBLAS_MIN_ROWS = 65  # FP8 products of this many rows or more run in cuBLAS (gpu/quant/fp8.py); fewer, here
NUM_SMS_DEFAULT = 132  # an H100's multiprocessors: the tiles Triton's interpreter runs are those a GPU would


@dataclass(frozen=True)
class QuantTiles:
    block_m: int  # rows of x per program (the MMA's N side: 16 .. 128)
    block_n: int  # output columns per program (weight rows)
    block_k: int  # columns per loop iteration
    split_k: int
    num_warps: int
    num_stages: int


def row_tile(num_rows: int) -> int:
    """16, 32, 64 or 128 rows of x per program: the row bucket, within the tensor cores' limits."""
    return min(128, max(16, 1 << max(0, num_rows - 1).bit_length()))


def quant_tiles(num_rows: int, n: int, k: int, kind: str, num_sms: int = NUM_SMS_DEFAULT) -> QuantTiles:
    """The tiles of an [num_rows, k] x [n, k]^T product with weights of `kind` ("fp8", "int4", "int8")."""
    block_m = row_tile(num_rows)
    few_rows = block_m <= 16
    block_k = 256 if kind == "fp8" and few_rows else 128
    num_warps = 8 if block_m >= 128 else 4
    num_stages = 3 if block_k >= 256 or block_m >= 128 else 4
    tiles = -(-num_rows // block_m) * -(-n // 128)
    most = max(1, k // (2 * block_k))  # each slice at least two tiles long
    split = max(1, min(-(-2 * num_sms // tiles), most)) if block_m <= 64 else 1
    return QuantTiles(block_m, 128, block_k, split, num_warps, num_stages)
