"""The row counts cuBLAS's products run at on a GPU: a product's rows padded up to a bucket, so that an eager step's
new row count (each prompt's uncached suffix has its own length) meets a shape cuBLAS has run before.

cuBLAS chooses its kernel per exact shape, and its first product at a row count it has not seen costs milliseconds of
host time; warm-up (gpu/layers/linear.py's `warm_up_cublas_rows`) runs every bucket once, so no request pays it. The
buckets: every row count up to EXACT_ROWS (decode steps: few sizes, which the decode graphs capture), then multiples
of 64 up to 2048, then sixteen steps per power of two (by 128 up to 4096, by 256 up to 8192, ...): the padding stays
under 64 rows, and under a sixteenth of the rows past 1024; 63 buckets above EXACT_ROWS up to 8192.

The padding rows are zeros and their products are dropped; a GEMM's output row depends on its own input row only, so
the rows kept are x's product. Rows run unpadded on a CPU (its matmul chooses nothing per shape) and while a CUDA graph
is captured: a graph pays cuBLAS's choice once, at capture, and its replays would pay the padding's copy every step.
This module needs no triton.
"""

import torch
import torch.nn.functional as F

EXACT_ROWS = 64  # up to here a product runs at its own row count
MIN_STEP = 64  # the buckets' spacing up to 2048 rows
STEPS_PER_DOUBLING = 16  # past 2048: the buckets between two powers of two


def cublas_row_bucket(num_rows: int) -> int:
    """The row count a cuBLAS product over `num_rows` rows runs at: itself up to EXACT_ROWS, else the next multiple of
    the step of its range, max(64, the power of two below it / 16)."""
    if num_rows <= EXACT_ROWS:
        return num_rows
    step = max(MIN_STEP, (1 << ((num_rows - 1).bit_length() - 1)) // STEPS_PER_DOUBLING)
    return -(-num_rows // step) * step


def cublas_row_buckets(max_rows: int) -> list[int]:
    """Every bucket above EXACT_ROWS that a product of at most `max_rows` rows runs at, ascending."""
    buckets = [cublas_row_bucket(EXACT_ROWS + 1)] if max_rows > EXACT_ROWS else []
    while buckets and buckets[-1] < max_rows:
        buckets.append(cublas_row_bucket(buckets[-1] + 1))
    return buckets


def rows_to_run(num_rows: int, device: torch.device) -> int:
    """The rows a cuBLAS product over `num_rows` rows runs at on `device`: its bucket on CUDA outside graph capture,
    else `num_rows` itself."""
    if device.type != "cuda" or num_rows <= EXACT_ROWS:
        return num_rows
    return num_rows if torch.cuda.is_current_stream_capturing() else cublas_row_bucket(num_rows)


def pad_rows(x: torch.Tensor, num_rows: int) -> torch.Tensor:
    """x [M, K] with zero rows appended up to `num_rows` (>= M): a new contiguous tensor, on any device."""
    return F.pad(x, (0, 0, 0, num_rows - x.shape[0]))


def padded_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias), run at `rows_to_run`'s row count."""
    if not x.is_cuda:  # the CPU's path as it was, without a look at the rows
        return F.linear(x, weight, bias)
    num_rows = x.numel() // weight.shape[1]
    padded = rows_to_run(num_rows, x.device)
    return F.linear(x, weight, bias) if padded == num_rows else linear_at_rows(x, weight, bias, padded)


def linear_at_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, num_rows: int) -> torch.Tensor:
    """F.linear(x, weight, bias) computed over x's rows padded with zero rows to `num_rows`, on any device; the result
    is contiguous (the first rows of a contiguous product), shaped as F.linear's."""
    rows = x.reshape(-1, weight.shape[1])
    y = F.linear(pad_rows(rows, num_rows), weight, bias)
    return y[: rows.shape[0]].view(*x.shape[:-1], weight.shape[0])
