"""Packed float16 arithmetic for Triton kernels: two float16 values in the halves of an int32 (the low half first),
which Hopper multiplies and adds in one instruction (HFMA2) where Triton, having no packed type, would issue one per
value. Compiled, each helper is a few lines of PTX; Triton's interpreter cannot run PTX, so under it each helper's
twin computes the same bits from integer and float operations (float16 results rounded once, as the PTX rounds
them: a float64 product of two float16 values is exact). Two helpers take bfloat16 pairs alike (IS_BF16), a largest
magnitude and a product, with which a kernel scales x by a power of two into float16's range.
tests/unit/test_f16x2_interpreted.py checks the twins against a model of the PTX instructions;
tests/gpu/test_quantized_gpu.py checks PTX and twins against each other on a GPU.
"""

import triton
import triton.language as tl

from gpu.kernels.triton_math import IS_INTERPRETED

# 1024.0 in both halves: a 4-bit level ORed into a half's low mantissa bits reads as the float16 1024 + level, and
# one at bits 4-7 as 1024 + 16 * level, exactly (the spacing of float16 from 1024 to 2048 is 1)
MAGIC_1024: tl.constexpr = tl.constexpr(0x64006400)
LOW_LEVELS: tl.constexpr = tl.constexpr(0x000F000F)  # the levels at bits 0-3 of each half
HIGH_LEVELS: tl.constexpr = tl.constexpr(0x00F000F0)  # the levels at bits 4-7 of each half
SIGN_BITS: tl.constexpr = tl.constexpr(-0x7FFF8000)  # 0x80008000 as an int32: each half's sign


@triton.jit
def _halves_as_float(v):
    """The low and high float16 halves of int32 `v`, in float32 (exact)."""
    low = (v & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    high = ((v >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return low, high


@triton.jit
def _packed(low, high):
    """float32 `low` and `high` rounded to float16 and packed, low half first."""
    low_bits = low.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    high_bits = high.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return low_bits | (high_bits << 16)


@triton.jit
def f16x2_of_bf16x2_twin(v):
    low = (v << 16).to(tl.float32, bitcast=True)
    high = (v & -65536).to(tl.float32, bitcast=True)
    return _packed(low, high)


@triton.jit
def f16x2_of_bf16x2(v):
    """Two bfloat16 values (an int32) as two float16 values, each rounded to nearest (beyond float16's range:
    infinite)."""
    if IS_INTERPRETED:
        return f16x2_of_bf16x2_twin(v)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 lo, hi; shl.b32 lo, $1, 16; and.b32 hi, $1, 0xFFFF0000; cvt.rn.f16x2.f32 $0, hi, lo; }",
            "=r,r", [v], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def abs_max_x2_twin(a, b):
    low = tl.maximum(a & 0x7FFF, b & 0x7FFF)
    high = tl.maximum((a >> 16) & 0x7FFF, (b >> 16) & 0x7FFF)
    return low | (high << 16) | ((a ^ b) & SIGN_BITS)


@triton.jit
def abs_max_x2(a, b, IS_BF16: tl.constexpr):
    """The larger magnitude of each half of 16-bit float pairs `a` and `b` (bfloat16 where IS_BF16, else float16),
    signed by the xor of theirs (max.xorsign.abs: one instruction a pair; a sign to mask off at the end)."""
    if IS_INTERPRETED:
        return abs_max_x2_twin(a, b)
    else:
        return tl.inline_asm_elementwise(
            "max.xorsign.abs.bf16x2 $0, $1, $2;" if IS_BF16 else "max.xorsign.abs.f16x2 $0, $1, $2;", "=r,r,r",
            [a, b], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _bf16_halves_as_float(v):
    """The low and high bfloat16 halves of int32 `v`, in float32 (exact)."""
    return (v << 16).to(tl.float32, bitcast=True), (v & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _packed_bf16(low, high):
    """float32 `low` and `high` rounded to nearest even bfloat16 and packed, low half first."""
    low_bits, high_bits = low.to(tl.int32, bitcast=True), high.to(tl.int32, bitcast=True)
    low_bits = ((low_bits + 0x7FFF + ((low_bits >> 16) & 1)) >> 16) & 0xFFFF
    high_bits = (high_bits + 0x7FFF + ((high_bits >> 16) & 1)) & -65536
    return low_bits | high_bits


@triton.jit
def mul_x2_twin(a, b, IS_BF16: tl.constexpr):
    if IS_BF16:
        a_low, a_high = _bf16_halves_as_float(a)
        b_low, b_high = _bf16_halves_as_float(b)
        return _packed_bf16(a_low * b_low, a_high * b_high)  # exact in float32 where it is normal: rounded once
    else:
        a_low, a_high = _halves_as_float(a)
        b_low, b_high = _halves_as_float(b)
        return _packed(a_low.to(tl.float64) * b_low.to(tl.float64), a_high.to(tl.float64) * b_high.to(tl.float64))


@triton.jit
def mul_x2(a, b, IS_BF16: tl.constexpr):
    """a * b in each half of 16-bit float pairs (bfloat16 where IS_BF16, else float16), rounded once."""
    if IS_INTERPRETED:
        return mul_x2_twin(a, b, IS_BF16)
    else:
        return tl.inline_asm_elementwise(
            "mul.rn.bf16x2 $0, $1, $2;" if IS_BF16 else "mul.rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b],
            dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def f16x2_splat_twin(v):
    return _packed(v, v)


@triton.jit
def f16x2_splat(v):
    """float32 `v` rounded to float16, in both halves."""
    if IS_INTERPRETED:
        return f16x2_splat_twin(v)
    else:
        return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $1, $1;", "=r,f", [v], dtype=tl.int32, is_pure=True,
                                         pack=1)


@triton.jit
def f16x2_fma_twin(a, b, c):
    a_low, a_high = _halves_as_float(a)
    b_low, b_high = _halves_as_float(b)
    c_low, c_high = _halves_as_float(c)
    low = a_low.to(tl.float64) * b_low.to(tl.float64) + c_low.to(tl.float64)
    high = a_high.to(tl.float64) * b_high.to(tl.float64) + c_high.to(tl.float64)
    return _packed(low, high)


@triton.jit
def f16x2_fma(a, b, c):
    """a * b + c in each half, rounded once."""
    if IS_INTERPRETED:
        return f16x2_fma_twin(a, b, c)
    else:
        return tl.inline_asm_elementwise("fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                         is_pure=True, pack=1)


@triton.jit
def f16x2_sum_twin(v):
    low, high = _halves_as_float(v)
    return low + high


@triton.jit
def f16x2_sum(v):
    """The two halves' sum in float32."""
    if IS_INTERPRETED:
        return f16x2_sum_twin(v)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; .reg .f32 a, b; mov.b32 {lo, hi}, $1; cvt.f32.f16 a, lo; cvt.f32.f16 b, hi; "
            "add.f32 $0, a, b; }", "=f,r", [v], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def nibbles_less_zero_twin(word, zero_low, zero_high):
    shifted = (word >> 8) & 0xFFFFFF
    unit = f16x2_splat_twin(tl.full(word.shape, 0.00390625, tl.float32))
    sixteenth = f16x2_splat_twin(tl.full(word.shape, 0.000244140625, tl.float32))
    pair_0 = f16x2_fma_twin((word & LOW_LEVELS) | MAGIC_1024, unit, zero_low)
    pair_1 = f16x2_fma_twin((word & HIGH_LEVELS) | MAGIC_1024, sixteenth, zero_high)
    pair_2 = f16x2_fma_twin((shifted & LOW_LEVELS) | MAGIC_1024, unit, zero_low)
    pair_3 = f16x2_fma_twin((shifted & HIGH_LEVELS) | MAGIC_1024, sixteenth, zero_high)
    return pair_0, pair_1, pair_2, pair_3


@triton.jit
def nibbles_less_zero(word, zero_low, zero_high):
    """A word's 8 levels (4 bits each, pair j at bits 4j and 16 + 4j) as 4 pairs of float16 (level - zero) / 256,
    exact for integer zero points: a level ORed into 1024's bits (at bits 0-3: 1024 + level, at 4-7: 1024 + 16 level),
    then one multiply-add per pair with `zero_low` = -(1024 + zero) / 256, `zero_high` = -(64 + zero) / 256 (both
    halves). The 1 / 256 keeps a sum of 16 such products with x in float16's range for any float16 x."""
    if IS_INTERPRETED:
        return nibbles_less_zero_twin(word, zero_low, zero_high)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 s, t0, t1, t2, t3, unit, sixteenth;\n"
            "shr.u32 s, $4, 8;\n"
            "mov.b32 unit, 0x1C001C00;\n"  # 1 / 256 in both halves
            "mov.b32 sixteenth, 0x0C000C00;\n"  # 1 / 4096
            "lop3.b32 t0, $4, 0x000F000F, 0x64006400, 0xEA;\n"  # (a & b) | c
            "lop3.b32 t1, $4, 0x00F000F0, 0x64006400, 0xEA;\n"
            "lop3.b32 t2, s, 0x000F000F, 0x64006400, 0xEA;\n"
            "lop3.b32 t3, s, 0x00F000F0, 0x64006400, 0xEA;\n"
            "fma.rn.f16x2 $0, t0, unit, $5;\n"
            "fma.rn.f16x2 $1, t1, sixteenth, $6;\n"
            "fma.rn.f16x2 $2, t2, unit, $5;\n"
            "fma.rn.f16x2 $3, t3, sixteenth, $6; }",
            "=r,=r,=r,=r,r,r,r", [word, zero_low, zero_high], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True, pack=1)


@triton.jit
def _e4m3_as_float(code):
    """An e4m3 code (the low byte of int32 `code`) in float32, exactly: its bits less the sign placed at float16's
    bits 7-14 read as the float16 of value / 256 (subnormals too: both formats' exponents line up 8 apart), then
    times 256. The two NaN codes give a NaN, 0x7E00, where cvt gives 0x7FFF: the only bits the two differ in (weights
    are never NaN)."""
    bits = ((code & 0x7F) << 7).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    value = bits * tl.where((code & 0x80) != 0, -1.0, 1.0)  # compiled negation is 0 - x, which loses -0's sign
    return tl.where((code & 0x7F) == 0x7F, float("nan"), value)


@triton.jit
def f16x2_of_e4m3x4_twin(word):
    pair_0 = _packed(_e4m3_as_float(word), _e4m3_as_float(word >> 8))
    pair_1 = _packed(_e4m3_as_float(word >> 16), _e4m3_as_float(word >> 24))
    return pair_0, pair_1


@triton.jit
def f16x2_of_e4m3x4(word):
    """A word's four e4m3 codes (byte j: element j) as two float16 pairs, bytes 0-1 and 2-3, exactly (every e4m3
    value is a float16): one cvt.rn.f16x2.e4m3x2 a pair (sm_89 and later)."""
    if IS_INTERPRETED:
        return f16x2_of_e4m3x4_twin(word)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r", [word], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
