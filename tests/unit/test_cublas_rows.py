"""gpu/layers/linear.py's row rounding for eager cuBLAS products: up to CUBLAS_ROW_STEP rows exact, more rows a
multiple of it, never fewer than asked; a CPU product is F.linear's own, bit for bit (the GPU side is
tests/gpu/test_skinny_gemm.py's)."""

import torch
import torch.nn.functional as F

from gpu.config import KernelConfig
from gpu.layers.linear import CUBLAS_ROW_STEP, cublas_rows, linear


def test_rows_round_up_past_the_step_only() -> None:
    for rows in range(1, CUBLAS_ROW_STEP + 1):
        assert cublas_rows(rows) == rows
    for rows in range(CUBLAS_ROW_STEP + 1, 20 * CUBLAS_ROW_STEP):
        padded = cublas_rows(rows)
        assert padded % CUBLAS_ROW_STEP == 0 and rows <= padded < rows + CUBLAS_ROW_STEP
    assert len({cublas_rows(rows) for rows in range(65, 8193)}) == 8192 // CUBLAS_ROW_STEP - 1


def test_cpu_products_are_f_linear_bit_for_bit() -> None:
    x, weight, bias = torch.randn(300, 48), torch.randn(20, 48), torch.randn(20)
    assert torch.equal(linear(x, weight, bias, KernelConfig()), F.linear(x, weight, bias))
