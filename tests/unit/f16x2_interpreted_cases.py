"""gpu/kernels/f16x2.py's helpers under Triton's interpreter (their twins: the interpreter cannot run PTX) against a
numpy model of the PTX each stands for: lop3/shr on the bits, fma.rn.f16x2 rounding a * b + c once to float16,
cvt.rn.f16x2.f32 rounding to nearest, cvt.f32.f16 exact. What the PTX itself computes is checked against the twins on
a GPU (tests/gpu/test_quantized_gpu.py::test_f16x2_ptx_equals_its_twins)."""

import os

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gpu.kernels import f16x2  # noqa: E402

SIZE = 4096


@triton.jit
def _helpers_kernel(a_ptr, b_ptr, c_ptr, v_ptr, out_ptr, BLOCK: tl.constexpr):
    """Each helper on a block of inputs: out rows fma, bf16 -> f16, splat, sum (float32 bits), 4 nibble pairs."""
    offs = tl.arange(0, BLOCK)
    a, b, c = tl.load(a_ptr + offs), tl.load(b_ptr + offs), tl.load(c_ptr + offs)
    v = tl.load(v_ptr + offs)
    tl.store(out_ptr + offs, f16x2.f16x2_fma(a, b, c))
    tl.store(out_ptr + BLOCK + offs, f16x2.f16x2_of_bf16x2(a))
    tl.store(out_ptr + 2 * BLOCK + offs, f16x2.f16x2_splat(v))
    tl.store(out_ptr + 3 * BLOCK + offs, f16x2.f16x2_sum(a).to(tl.int32, bitcast=True))
    pair_0, pair_1, pair_2, pair_3 = f16x2.nibbles_less_zero(a, b, c)
    tl.store(out_ptr + 4 * BLOCK + offs, pair_0)
    tl.store(out_ptr + 5 * BLOCK + offs, pair_1)
    tl.store(out_ptr + 6 * BLOCK + offs, pair_2)
    tl.store(out_ptr + 7 * BLOCK + offs, pair_3)


def _halves(bits: np.ndarray) -> np.ndarray:
    """int32 [n] -> float16 [n, 2] (low half first)."""
    return bits.astype(np.int32).view(np.float16).reshape(-1, 2)


def _packed(halves: np.ndarray) -> np.ndarray:
    return halves.astype(np.float16).reshape(-1).view(np.int32)


def _run(a: np.ndarray, b: np.ndarray, c: np.ndarray, v: np.ndarray) -> np.ndarray:
    out = torch.zeros(8 * SIZE, dtype=torch.int32)
    _helpers_kernel[(1,)](*(torch.from_numpy(t) for t in (a, b, c, v)), out, BLOCK=SIZE)
    return out.numpy().reshape(8, SIZE)


def _random_halves(rng: np.random.Generator) -> np.ndarray:
    """float16 pairs of every magnitude (subnormal to near the largest), both signs."""
    values = rng.standard_normal(2 * SIZE) * np.exp2(rng.integers(-20, 14, 2 * SIZE))
    return _packed(values.astype(np.float16).reshape(-1, 2))


def test_packed_arithmetic_rounds_as_the_ptx() -> None:
    rng = np.random.default_rng(0)
    a, b, c = (_random_halves(rng) for _ in range(3))
    a[:4] = np.array([0x7F7F4780, 0x00010001, 0x477FC780, 0x3F803F80], dtype=np.uint32).view(np.int32)  # bf16 edges
    v = (rng.standard_normal(SIZE) * np.exp2(rng.integers(-26, 18, SIZE))).astype(np.float32)
    out = _run(a, b, c, v)
    exact = _halves(a).astype(np.float64) * _halves(b) + _halves(c)  # float16 products are exact in float64
    assert (out[0] == _packed(exact)).all()
    as_float32 = np.stack([a << 16, a & np.int32(-65536)], axis=1).view(np.float32)  # bf16 halves, exactly
    assert (out[1] == _packed(as_float32)).all()  # beyond float16's range: infinite, as cvt.rn rounds
    assert (out[2] == _packed(np.stack([v, v], axis=1))).all()
    sums = _halves(a).astype(np.float32)
    assert (out[3] == (sums[:, 0] + sums[:, 1]).view(np.int32)).all()


@pytest.mark.parametrize("zero", [0.0, 1.0, 7.0, 8.0, 15.0])
def test_nibbles_less_zero_are_exact(zero: float) -> None:
    """Every level at each of a word's 8 places, less an integer zero point, divided by 256: exact in float16."""
    rng = np.random.default_rng(int(zero))
    levels = rng.integers(0, 16, (SIZE, 8))
    places = 4 * (np.arange(8) // 2) + 16 * (np.arange(8) % 2)  # column 2j + h at bit 4j + 16h
    words = (levels.astype(np.uint64) << places.astype(np.uint64)).sum(axis=1).astype(np.uint32).view(np.int32)
    low, high = (np.full(SIZE, x, dtype=np.float16) for x in (-(1024 + zero) / 256, -(64 + zero) / 256))
    out = _run(words, _packed(np.stack([low, low], 1)), _packed(np.stack([high, high], 1)),
               np.zeros(SIZE, np.float32))
    for j in range(4):
        expected = ((levels[:, 2 * j : 2 * j + 2] - zero) / 256).astype(np.float16)
        assert (out[4 + j] == _packed(expected)).all(), j


@triton.jit
def _pair_ops_kernel(a_ptr, b_ptr, out_ptr, IS_BF16: tl.constexpr, BLOCK: tl.constexpr):
    """abs_max_x2 and mul_x2 on a block of pairs of x's type: out rows max, product."""
    offs = tl.arange(0, BLOCK)
    a, b = tl.load(a_ptr + offs), tl.load(b_ptr + offs)
    tl.store(out_ptr + offs, f16x2.abs_max_x2(a, b, IS_BF16))
    tl.store(out_ptr + BLOCK + offs, f16x2.mul_x2(a, b, IS_BF16))


def _as_float(bits: np.ndarray, is_bf16: bool) -> np.ndarray:
    """int32 [n] of 16-bit float pairs -> float64 [n, 2] (low half first), exactly."""
    halves = bits.view(np.uint16).astype(np.uint32).reshape(-1, 2)
    return (halves << 16).view(np.float32).astype(np.float64) if is_bf16 else _halves(bits).astype(np.float64)


def _of_float(values: np.ndarray, is_bf16: bool) -> np.ndarray:
    """float64 [n, 2] -> int32 [n] of pairs, each rounded to nearest even once (torch's bfloat16 rounding)."""
    if not is_bf16:
        return _packed(values)
    return torch.from_numpy(values.reshape(-1)).to(torch.bfloat16).view(torch.int16).numpy().view(np.int32)


@pytest.mark.parametrize("is_bf16", [True, False])
def test_pair_max_and_product_as_the_ptx(is_bf16: bool) -> None:
    """max.xorsign.abs (the larger magnitude, signed by the xor of the signs) and mul.rn on pairs of every magnitude
    of bfloat16 or float16; the products by powers of two as the kernels scale x by them, exact where normal."""
    rng = np.random.default_rng(int(is_bf16))
    span = (-60, 60) if is_bf16 else (-12, 12)
    values = [rng.standard_normal((SIZE, 2)) * np.exp2(rng.integers(*span, (SIZE, 2))) for _ in range(2)]
    values[1][SIZE // 2 :] = np.sign(values[1][SIZE // 2 :]) * np.exp2(rng.integers(*span, (SIZE // 2, 2)))
    a, b = (_of_float(v, is_bf16) for v in values)
    out = torch.zeros(2 * SIZE, dtype=torch.int32)
    _pair_ops_kernel[(1,)](torch.from_numpy(a), torch.from_numpy(b), out, IS_BF16=is_bf16, BLOCK=SIZE)
    out = out.numpy().reshape(2, SIZE)
    a_float, b_float = _as_float(a, is_bf16), _as_float(b, is_bf16)
    sign = np.where(np.signbit(a_float) ^ np.signbit(b_float), -1.0, 1.0)
    assert (out[0] == _of_float(sign * np.maximum(np.abs(a_float), np.abs(b_float)), is_bf16)).all()
    assert (out[1] == _of_float(a_float * b_float, is_bf16)).all()  # float64 products of 16-bit floats are exact


@triton.jit
def _e4m3_kernel(words_ptr, out_ptr, BLOCK: tl.constexpr):
    """f16x2_of_e4m3x4 on a block of words: out rows pair 0 (bytes 0-1), pair 1 (bytes 2-3)."""
    offs = tl.arange(0, BLOCK)
    pair_0, pair_1 = f16x2.f16x2_of_e4m3x4(tl.load(words_ptr + offs))
    tl.store(out_ptr + offs, pair_0)
    tl.store(out_ptr + BLOCK + offs, pair_1)


def test_e4m3_codes_become_float16_pairs_exactly() -> None:
    """All 256 e4m3 codes at each of a word's 4 bytes against torch's float8_e4m3fn -> float16 (exact; the NaN
    codes NaN), as cvt.rn.f16x2.e4m3x2 converts them: the low byte into the low half."""
    codes = np.arange(SIZE * 4, dtype=np.uint32).reshape(SIZE, 4) * np.array([1, 7, 13, 29], dtype=np.uint32) % 256
    codes = codes.astype(np.uint8)
    words = codes.reshape(-1).view(np.int32)
    out = torch.zeros(2 * SIZE, dtype=torch.int32)
    _e4m3_kernel[(1,)](torch.from_numpy(words), out, BLOCK=SIZE)
    halves = out.numpy().reshape(2, SIZE).view(np.float16).reshape(2, SIZE, 2)
    got = np.concatenate([halves[0], halves[1]], axis=1)  # [SIZE, 4] in byte order
    expected = torch.from_numpy(codes).view(torch.float8_e4m3fn).to(torch.float16).numpy()
    assert (np.isnan(got) == np.isnan(expected)).all() and np.isnan(expected).any()
    finite = ~np.isnan(expected)
    assert (got[finite].view(np.uint16) == expected[finite].view(np.uint16)).all()  # -0 stays -0
