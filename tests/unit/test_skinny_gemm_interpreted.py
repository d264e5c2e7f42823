"""The skinny GEMM kernel (gpu/kernels/skinny_gemm.py) run by Triton's interpreter on the CPU against a float32
matmul: its indexing on small shapes (tiles of rows and columns, split-K and its reduce, the last row re-read for
padding, masks along K, the TMA kernel's block offsets), and the config tables' rules. float16 for the tensor-core
path: the interpreter's bfloat16 dot is not numpy's (tests/gpu/test_skinny_gemm.py checks bf16 on CUDA, and every
config of the tables)."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from gpu.kernels.skinny_gemm_configs import (
    FEW_ROWS,
    H100_TABLE,
    H200_TABLE,
    SkinnyConfig,
    config_for,
    preferred_config,
    prologue_buckets_for,
    prologue_config,
    row_bucket,
    table_for,
)

pytest.importorskip("triton")

KERNEL = Path(__file__).resolve().parents[2] / "gpu" / "kernels" / "skinny_gemm.py"


@pytest.fixture(scope="module")
def kernel() -> ModuleType:
    """gpu/kernels/skinny_gemm.py loaded afresh with TRITON_INTERPRET=1 (its kernels decorated as interpreted ones),
    and gpu/kernels/pdl.py with it: an interpreted kernel can't call a jit helper another test imported compiled."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
        env.delitem(sys.modules, "gpu.kernels.pdl", raising=False)
        spec = importlib.util.spec_from_file_location("skinny_gemm_interpreted", KERNEL)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def check(kernel: ModuleType, m: int, n: int, k: int, config: SkinnyConfig, dtype: torch.dtype, has_bias: bool) -> None:
    generator = torch.Generator().manual_seed(m * 1000 + n)
    x = torch.randn(m, k, generator=generator).to(dtype)
    w = (torch.randn(n, k, generator=generator) * k**-0.5).to(dtype)
    bias = torch.randn(n, generator=generator).to(dtype) if has_bias else None
    out = kernel.skinny_gemm(x, w, bias, config)
    ref = x.float() @ w.float().T + (0 if bias is None else bias.float())
    assert out.dtype == dtype and out.shape == (m, n)
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2 * (ref.abs().max().item() + 1))


ROW_TILES = {  # (config, shapes (M, N, K)): N and K no multiple of the blocks, M across the tiles' edges
    "rows16": (SkinnyConfig(32, 32, use_dot=True, num_stages=2), [(17, 70, 100), (33, 40, 64)]),
    "rows32-split": (SkinnyConfig(16, 32, split_k=3, use_dot=True, num_stages=2, block_m=32),
                     [(17, 50, 100), (31, 33, 96), (32, 16, 200), (65, 40, 70)]),
    "rows64": (SkinnyConfig(32, 16, use_dot=True, num_stages=2, block_m=64), [(40, 70, 48), (100, 20, 30)]),
    "rows64-tma-split": (SkinnyConfig(16, 64, split_k=3, use_dot=True, num_stages=2, block_m=64, use_tma=True),
                         [(100, 33, 200), (17, 40, 64)]),  # K * 2 bytes a multiple of 16: the TMA kernel runs
}


@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("tiles", ROW_TILES)
def test_tiles_of_rows_give_the_float32_product(kernel: ModuleType, tiles: str, has_bias: bool) -> None:
    config, shapes = ROW_TILES[tiles]
    for m, n, k in shapes:
        check(kernel, m, n, k, config, torch.float16, has_bias)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_few_rows_fma_path(kernel: ModuleType, dtype: torch.dtype) -> None:
    for m, config in ((1, SkinnyConfig(8, 16)), (3, SkinnyConfig(4, 32, split_k=2, num_stages=1))):
        check(kernel, m, 21, 50, config, dtype, has_bias=True)


# One row (its own loop: x copied to the weight tile's layout, sums along K after the loop): (config, (N, K)) with
# several K tiles, a ragged last tile or none (K a multiple: unmasked loads), N no multiple of the block, split-K.
ONE_ROW = {
    "ragged": (SkinnyConfig(8, 32, num_stages=1), (13, 100)),
    "even-k": (SkinnyConfig(4, 16, num_stages=1), (10, 64)),
    "split": (SkinnyConfig(4, 16, split_k=2, num_stages=1), (21, 70)),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ONE_ROW)
def test_one_row_gives_the_float32_product(kernel: ModuleType, case: str, dtype: torch.dtype) -> None:
    config, (n, k) = ONE_ROW[case]
    check(kernel, 1, n, k, config, dtype, has_bias=case != "even-k")


@pytest.mark.parametrize("tiles", ["rows32-split", "rows64-tma-split"])
def test_writes_into_a_given_buffer(kernel: ModuleType, tiles: str) -> None:
    """`out` with a row stride of its own (a view into wider rows) receives y; what lies beside it stays."""
    config = ROW_TILES[tiles][0]
    x, w = torch.randn(40, 64).half(), (torch.randn(24, 64) / 8).half()
    wide = torch.full((40, 30), float("nan"), dtype=torch.float16)
    y = kernel.skinny_gemm(x, w, None, config, out=wide[:, 2:26])
    assert y.data_ptr() == wide[:, 2:26].data_ptr()
    torch.testing.assert_close(wide[:, 2:26].float(), x.float() @ w.float().T, rtol=1e-2, atol=2e-2)
    assert wide[:, :2].isnan().all() and wide[:, 26:].isnan().all()
    with pytest.raises(ValueError, match="out must be"):
        kernel.skinny_gemm(x, w, None, config, out=wide[:, :23])


def test_fma_path_refuses_many_rows(kernel: ModuleType) -> None:
    with pytest.raises(ValueError, match="fma"):
        kernel.skinny_gemm(torch.zeros(FEW_ROWS + 1, 16, dtype=torch.float16), torch.zeros(8, 16, dtype=torch.float16),
                           None, SkinnyConfig(8, 16))


def test_row_buckets() -> None:
    assert [row_bucket(m) for m in (1, 2, 3, 16, 17, 31, 32, 33, 100, 129, 256)] == \
        [1, 2, 4, 16, 32, 32, 32, 64, 128, 256, 256]


def test_the_table_follows_the_device_name() -> None:
    assert table_for("NVIDIA H100 80GB HBM3") is H100_TABLE
    assert table_for("NVIDIA H200") is H200_TABLE
    assert table_for("NVIDIA A100-SXM4-80GB") is H200_TABLE  # unmeasured GPUs: the first table


def test_many_rows_only_where_a_table_says() -> None:
    """Beyond 16 rows a shape no table holds stays with cuBLAS, while up to 16 the rule serves it; the H200's
    table holds no many-row entry (never measured there)."""
    assert preferred_config(17, 1000, 1000, H100_TABLE) is None
    assert preferred_config(16, 1000, 1000, H100_TABLE) is not None
    assert not any(bucket > FEW_ROWS for bucket, _, _ in H200_TABLE)
    rule = config_for(100, 1000, 1000, H200_TABLE)  # what the kernel runs with when given no config
    assert rule.use_dot and rule.block_m <= 64
    for (bucket, n, k), config in H100_TABLE.items():
        assert preferred_config(bucket, n, k, H100_TABLE) == config
        if config is not None and bucket > FEW_ROWS:
            assert config.use_dot and config.block_m <= bucket and config.block_k * config.split_k <= k


def torch_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """gpu/layers/norm.py's reference: (norm(x + residual), x + residual), rounded where the kernels round."""
    summed = x + residual if residual is not None else x
    s = summed.float()
    return weight * (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype), summed


def assert_float32_product(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    """y is x @ w.T (+ bias) in float32 (what `check` allows): the prologue's product on its own, not only equal to
    the plain kernel's on the same config."""
    ref = x.float() @ w.float().T + (0 if bias is None else bias.float())
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2 * (ref.abs().max().item() + 1))


# (config, dtype, (M, N, K)): K no multiple of the blocks, split-K programs each norming. float16: the interpreter
# rounds float32 to bfloat16 otherwise than CUDA does (tests/gpu/test_skinny_gemm.py checks bf16 to the bit).
PROLOGUE_PATHS = {
    "fma": (SkinnyConfig(8, 32, num_stages=1), torch.float16, (3, 21, 100)),
    "fma-split": (SkinnyConfig(4, 16, split_k=3, num_stages=1), torch.float16, (5, 10, 70)),
    "one-row": (SkinnyConfig(8, 32, num_stages=1), torch.float16, (1, 13, 100)),
    "one-row-even-k": (SkinnyConfig(4, 16, num_stages=1), torch.float16, (1, 6, 64)),
    "one-row-split": (SkinnyConfig(4, 16, split_k=2, num_stages=1), torch.float16, (1, 21, 70)),
    "dot": (SkinnyConfig(16, 32, use_dot=True, num_stages=2), torch.float16, (9, 40, 96)),
    "dot-rows": (SkinnyConfig(16, 32, split_k=2, use_dot=True, num_stages=2, block_m=32), torch.float16, (40, 33, 64)),
    "tma-split": (SkinnyConfig(16, 32, split_k=2, use_dot=True, num_stages=2, use_tma=True), torch.float16,
                  (6, 40, 64)),
}


@pytest.mark.parametrize("has_residual", [True, False])
@pytest.mark.parametrize("path", PROLOGUE_PATHS)
def test_rms_norm_prologue_gives_the_norm_then_the_product(kernel: ModuleType, path: str, has_residual: bool) -> None:
    """norm(x + residual) @ W^T against the torch norm, then the same config's product, and the float32 product;
    x + residual exactly the torch sum. The product of equal tiles in the same order: equal but for a last-bit flip
    in the norm."""
    config, dtype, (m, n, k) = PROLOGUE_PATHS[path]
    generator = torch.Generator().manual_seed(m + n + k)
    x, residual = (torch.randn(m, k, generator=generator).to(dtype) for _ in range(2))
    norm_weight = (1 + torch.randn(k, generator=generator) / 4).to(dtype)
    w = (torch.randn(n, k, generator=generator) * k**-0.5).to(dtype)
    bias = torch.randn(n, generator=generator).to(dtype)
    y, summed = kernel.skinny_gemm_rms_norm(x, residual if has_residual else None, norm_weight, 1e-6, w, bias, config)
    normed, ref_summed = torch_norm(x, residual if has_residual else None, norm_weight, 1e-6)
    assert torch.equal(summed, ref_summed)
    ref = kernel.skinny_gemm(normed, w, bias, config)
    assert y.dtype == dtype and y.shape == (m, n)
    torch.testing.assert_close(y, ref, rtol=1e-3, atol=1e-3 * (ref.abs().max().item() + 1))
    assert_float32_product(y, normed, w, bias)


@pytest.mark.parametrize("path", PROLOGUE_PATHS)
def test_silu_and_mul_prologue_gives_the_activation_then_the_product(kernel: ModuleType, path: str) -> None:
    config, dtype, (m, n, k) = PROLOGUE_PATHS[path]
    generator = torch.Generator().manual_seed(m * n + k)
    wide = torch.randn(m, 2 * k + 6, generator=generator).to(dtype)  # a row stride of its own
    gate_up = wide[:, 3 : 3 + 2 * k]
    w = (torch.randn(n, k, generator=generator) * k**-0.5).to(dtype)
    y = kernel.skinny_gemm_silu_and_mul(gate_up, w, None, config)
    gate, up = gate_up.chunk(2, dim=-1)
    activated = torch.nn.functional.silu(gate) * up
    ref = kernel.skinny_gemm(activated, w, None, config)
    torch.testing.assert_close(y, ref, rtol=1e-3, atol=1e-3 * (ref.abs().max().item() + 1))
    assert_float32_product(y, activated, w, None)


def test_prologues_check_their_inputs(kernel: ModuleType) -> None:
    x, w = torch.zeros(2, 16, dtype=torch.float16), torch.zeros(8, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="residual"):
        kernel.skinny_gemm_rms_norm(x, torch.zeros(2, 8, dtype=torch.float16), torch.ones(16).half(), 1e-6, w)
    with pytest.raises(ValueError, match="norm_weight"):
        kernel.skinny_gemm_rms_norm(x, None, torch.ones(8).half(), 1e-6, w)
    with pytest.raises(ValueError, match=r"x \[M, 32\]"):
        kernel.skinny_gemm_silu_and_mul(x, w)


def test_prologues_run_where_a_gpu_measured_them_faster() -> None:
    """On the H100 the norm and SiLU prologues at 1 row, on the fma path; none on a GPU whose prologues were never
    measured."""
    h100 = prologue_buckets_for("NVIDIA H100 80GB HBM3")
    assert prologue_buckets_for("NVIDIA H200") == {}
    assert [rows for rows in (1, 2, 3, 16) if prologue_config(rows, 1024, "norm", h100)] == [1]
    assert [rows for rows in (1, 2, 3, 16) if prologue_config(rows, 3072, "silu", h100)] == [1]
    config = prologue_config(1, 3072, "silu", h100)
    assert config is not None and not config.use_dot and config.block_k == 1024
    assert prologue_config(1, 1024, "norm", {}) is None
