"""The skinny GEMM kernel (gpu/kernels/skinny_gemm.py) run by Triton's interpreter on the CPU against a float32
matmul: its indexing on small shapes (tiles of rows and columns, split-K and its reduce, the last row re-read for
padding, masks along K, the TMA kernel's block offsets), and the config tables' rules. float16 for the tensor-core
path: the interpreter's bfloat16 dot is not numpy's (tests/gpu/test_skinny_gemm.py checks bf16 on CUDA, and every
config of the tables)."""

import importlib.util
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
    row_bucket,
    table_for,
)

pytest.importorskip("triton")

KERNEL = Path(__file__).resolve().parents[2] / "gpu" / "kernels" / "skinny_gemm.py"


@pytest.fixture(scope="module")
def kernel() -> ModuleType:
    """gpu/kernels/skinny_gemm.py loaded afresh with TRITON_INTERPRET=1 (its kernels decorated as interpreted ones)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
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
