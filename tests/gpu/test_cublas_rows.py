"""cuBLAS's row buckets on the GPU (gpu/kernels/cublas_rows.py, gpu/layers/linear.py's route 4): products run padded
give the unpadded product's rows; a captured graph runs unpadded; `warm_up_cublas_rows` runs every bucket of every
distinct product shape once, the LM head's up to its own limit; after it, a product at a new row count pays no
cuBLAS set-up.

Tolerance: one ulp of bf16 (relative 2^-7) between two roundings of float32 sums that a kernel chosen for another row
count may add in another order; the tests print whether the padded and unpadded products are bitwise equal.
"""

import statistics
import time

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("cuBLAS's row buckets are a GPU's", allow_module_level=True)

from gpu.config import KernelConfig  # noqa: E402
from gpu.distributed import SINGLE  # noqa: E402
from gpu.kernels.cublas_rows import cublas_row_bucket, cublas_row_buckets, padded_linear, rows_to_run  # noqa: E402
from gpu.layers import linear as linear_module  # noqa: E402
from gpu.layers.linear import Linear, warm_up_cublas_rows  # noqa: E402
from gpu.layers.vocab_parallel import ParallelLMHead  # noqa: E402
from tests.gpu.graph_capture import captured  # noqa: E402

DEVICE = torch.device("cuda")
ROWS = [65, 100, 1000, 2049, 5000]
SHAPES = [(4096, 1024), (1024, 3072), (151936, 1024)]  # (N, K): qkv, down, the LM head of Qwen3-0.6B


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_padded_product_is_the_unpadded_products_rows(rows: int, n: int, k: int, dtype: torch.dtype) -> None:
    generator = torch.Generator(DEVICE).manual_seed(rows)
    x = torch.randn(rows, k, device=DEVICE, dtype=dtype, generator=generator)
    weight = torch.randn(n, k, device=DEVICE, dtype=dtype, generator=generator) / k**0.5
    bias = torch.randn(n, device=DEVICE, dtype=dtype, generator=generator)
    assert rows_to_run(rows, DEVICE) == cublas_row_bucket(rows) > rows
    for b in (None, bias):
        y = padded_linear(x, weight, b)
        expected = F.linear(x, weight, b)
        assert y.shape == expected.shape and y.is_contiguous()
        torch.testing.assert_close(y, expected, rtol=2**-7, atol=2**-7)  # one ulp of bf16 apart at most
        exact = (x.float() @ weight.float().t() + (0 if b is None else b.float())).to(dtype)
        torch.testing.assert_close(y, exact, rtol=2**-7, atol=2**-6)
    print(f"{rows} rows, ({n}, {k}) {dtype}: bitwise equal to unpadded: {torch.equal(y, expected)}")


def test_a_3d_input_and_a_linear_layer_go_padded(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu.kernels import cublas_rows

    padded_to: list[int] = []
    real = cublas_rows.linear_at_rows
    monkeypatch.setattr(cublas_rows, "linear_at_rows", lambda *args: padded_to.append(args[-1]) or real(*args))
    layer = Linear(1024, 4096, bias=True).to(DEVICE, torch.bfloat16).requires_grad_(False)
    x = torch.randn(3, 700, 1024, device=DEVICE, dtype=torch.bfloat16)
    y = layer(x)
    assert padded_to == [2176] and y.shape == (3, 700, 4096)
    torch.testing.assert_close(y, F.linear(x, layer.weight, layer.bias), rtol=2**-7, atol=2**-7)


def test_a_captured_product_runs_unpadded_and_replays_the_eager_rows() -> None:
    weight = torch.randn(4096, 1024, device=DEVICE, dtype=torch.bfloat16) / 32
    x = torch.randn(100, 1024, device=DEVICE, dtype=torch.bfloat16)
    seen: list[int] = []

    def run() -> torch.Tensor:
        seen.append(rows_to_run(100, DEVICE))
        return padded_linear(x, weight, None)

    graph, y = captured(run)
    assert seen == [128, 100]  # outside the capture, then inside it
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(y, padded_linear(x, weight, None), rtol=2**-7, atol=2**-7)


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Linear(3072, 1024, bias=False), Linear(3072, 1024, bias=False),  # a shape
                                           Linear(1024, 4096, bias=True), Linear(1024, 4096, bias=False),
                                           torch.nn.Embedding(10, 1024)])
        self.lm_head = ParallelLMHead(1000, 1024, SINGLE)


def test_warm_up_runs_every_bucket_of_every_distinct_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    model = TinyLM().to(DEVICE, torch.bfloat16).requires_grad_(False)
    calls: list[tuple[int, int, int, bool]] = []
    real = linear_module.linear

    def recorded(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kernels: KernelConfig,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        calls.append((x.shape[0], *weight.shape, bias is not None))
        return real(x, weight, bias, kernels, out)

    monkeypatch.setattr(linear_module, "linear", recorded)
    buckets = cublas_row_buckets(8192)
    assert warm_up_cublas_rows(model, 8192, max_head_rows=256) == 3 * 63 + 3 == len(calls)
    body = {(rows, *shape) for rows in buckets for shape in ((1024, 3072, False), (4096, 1024, True),
                                                              (4096, 1024, False))}
    assert sorted(calls) == sorted(body | {(rows, 1000, 1024, False) for rows in (128, 192, 256)})
    calls.clear()
    assert warm_up_cublas_rows(model, 5000) == 4 * len(cublas_row_buckets(5000)) and max(calls)[0] == 5120
    assert warm_up_cublas_rows(model, 64) == 0


def test_after_warm_up_a_new_row_count_pays_no_cublas_set_up() -> None:
    """The first product at each of several new row counts, host time: about a microsecond-scale launch, not cuBLAS's
    milliseconds of choosing a kernel for a shape it has not seen (a shape no other test here runs)."""
    model = torch.nn.Sequential(Linear(1536, 2560, bias=False)).to(DEVICE, torch.bfloat16).requires_grad_(False)
    warm_up_cublas_rows(model, 8192)
    torch.cuda.synchronize()
    times = []
    for rows in (272, 531, 1111, 2900, 4321, 6007):
        x = torch.randn(rows, 1536, device=DEVICE, dtype=torch.bfloat16)
        torch.cuda.synchronize()
        start = time.perf_counter()
        model(x)
        times.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    print(f"first calls at new row counts after warm-up: {[round(t * 1e3, 3) for t in times]} ms")
    assert statistics.median(times) < 1e-3


def test_fp8_warm_up_runs_every_bucket_of_each_distinct_cublas_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two FP8 layers of one shape (128x128 blocks): each runs the Triton kernel's row tiles, their one cuBLAS shape
    every row bucket, its activations padded to it."""
    from gpu.quant import warm_up_quantized
    from gpu.quant.fp8 import Fp8Scheme
    from tests.gpu.test_quantized_gpu import _fp8_weight, _loaded

    scheme = Fp8Scheme({"quant_method": "fp8", "weight_block_size": [128, 128]})
    layers = []
    for seed in (1, 2):
        levels, scales = _fp8_weight((128, 128), torch.Generator(device="cuda").manual_seed(seed))
        layers.append(_loaded(scheme, {"weight": levels, "weight_scale_inv": scales}))
    cublas_rows: list[int] = []
    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda a, *args, **kw: cublas_rows.append(a.shape[0]) or
                        real(a, *args, **kw))
    calls = warm_up_quantized(torch.nn.Sequential(*layers), 8192, torch.bfloat16)
    assert cublas_rows.count(192) == 1 + 2  # the bucket, and each layer's tile of 128 rows (run at 129 rows)
    assert sorted(set(cublas_rows)) == cublas_row_buckets(8192) and len(cublas_rows) == 63 + 2
    assert calls == 2 * 4 + 63  # row tiles 16, 32, 64, 128 per layer (1, 17, 33, 129 rows); the buckets once
