"""Each format's reference dequantization (gpu/quant/) on small tensors written by hand from the format's
specification, loaded through the layer's own loaders: the values every kernel and the CPU path are checked
against. GGUF's block types also against the `gguf` package's own dequantization, on random valid blocks."""

import struct

import gguf
import numpy as np
import pytest
import torch

from gpu.layers.linear import Linear, MergedLinear
from gpu.loader import CheckpointTensor, TensorSlice
from gpu.quant import gguf_blocks
from gpu.quant.awq import AwqScheme
from gpu.quant.fp8 import Fp8Scheme
from gpu.quant.gguf import GgufScheme
from gpu.quant.gptq import GptqScheme
from tests.quant_checkpoints import random_gguf_blocks


def dequantized(scheme: object, out_features: int, in_features: int, tensors: dict[str, torch.Tensor]
                ) -> torch.Tensor:
    """The weight a layer of `scheme` holds after loading `tensors` (its checkpoint tensors by suffix)."""
    layer = Linear(in_features, out_features, bias=False)
    method = scheme.method_for(["layer"], layer.weight_layout())  # type: ignore[attr-defined]
    layer.use_quant_method(method)
    for name, tensor in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, CheckpointTensor(name, TensorSlice(tensor)), None)
    method.finish_loading(layer, torch.float32)
    return method.dequantize(layer)


def words(values: list[int], bits: int) -> int:
    """Values packed from the low bits into one int32's bits."""
    word = sum(v << (bits * i) for i, v in enumerate(values))
    return word - (1 << 32) if word >= 1 << 31 else word


def test_fp8_blocks_scale_each_block() -> None:
    levels = torch.tensor([[1.0, -2.0, 0.5, 4.0], [3.0, 0.25, -1.5, 2.0]]).to(torch.float8_e4m3fn)
    scales = torch.tensor([[2.0, 0.5]])  # one 2x2 block per scale
    scheme = Fp8Scheme({"quant_method": "fp8", "weight_block_size": [2, 2], "activation_scheme": "dynamic"})
    weight = dequantized(scheme, 2, 4, {"weight": levels, "weight_scale_inv": scales})
    assert weight.tolist() == [[2.0, -4.0, 0.25, 2.0], [6.0, 0.5, -0.75, 1.0]]


def test_fp8_per_tensor_scale() -> None:
    levels = torch.tensor([[1.0, -2.0], [0.5, 448.0]]).to(torch.float8_e4m3fn)
    scheme = Fp8Scheme({"quant_method": "fp8", "activation_scheme": "static"})
    weight = dequantized(scheme, 2, 2, {"weight": levels, "weight_scale": torch.tensor(0.125),
                                        "input_scale": torch.tensor(0.5)})
    assert weight.tolist() == [[0.125, -0.25], [0.0625, 56.0]]


def test_fp8_fused_checkpoint_tensor_fills_every_shard_of_a_merged_layer() -> None:
    """Phi-3 style: one checkpoint tensor holds q's rows, then k's; a merged layer loads both from it."""
    levels = torch.tensor([[1.0, 2.0, -1.0, 0.5], [3.0, -4.0, 2.0, 1.0], [0.25, 1.0, 6.0, -2.0],
                           [8.0, 0.5, 1.5, -0.5]]).to(torch.float8_e4m3fn)
    scales = torch.tensor([[1.0, 2.0], [0.5, 4.0]])
    layer = MergedLinear(4, {"q": 2, "k": 2}, bias=False)
    scheme = Fp8Scheme({"quant_method": "fp8", "weight_block_size": [2, 2], "activation_scheme": "dynamic"})
    method = scheme.method_for(["q", "k"], layer.weight_layout())
    layer.use_quant_method(method)
    for name, tensor in (("weight", levels), ("weight_scale_inv", scales)):
        param = getattr(layer, name)
        param.weight_loader(param, CheckpointTensor(name, TensorSlice(tensor)), None)
    assert method.dequantize(layer).tolist() == [[1.0, 2.0, -2.0, 1.0], [3.0, -4.0, 4.0, 2.0],
                                                 [0.125, 0.5, 24.0, -8.0], [4.0, 0.25, 6.0, -2.0]]


def test_gptq_int4_with_zero_points_stored_minus_one() -> None:
    # 8 rows, 8 columns, one group: level(n, k) = (n + k) % 16, zero(n) = n % 4 + 1 (stored as n % 4), scale (n+1)/4.
    qweight = torch.tensor([[words([(n + k) % 16 for k in range(8)], 4) for n in range(8)]], dtype=torch.int32)
    qzeros = torch.tensor([[words([n % 4 for n in range(8)], 4)]], dtype=torch.int32)
    scales = torch.tensor([[(n + 1) / 4 for n in range(8)]], dtype=torch.float16)
    scheme = GptqScheme({"quant_method": "gptq", "bits": 4, "group_size": 8, "desc_act": False})
    weight = dequantized(scheme, 8, 8, {"qweight": qweight, "qzeros": qzeros, "scales": scales,
                                        "g_idx": torch.zeros(8, dtype=torch.int32)})
    expected = [[((n + k) % 16 - (n % 4 + 1)) * (n + 1) / 4 for k in range(8)] for n in range(8)]
    assert weight.tolist() == expected


def test_gptq_act_order_picks_each_columns_group() -> None:
    # 8 rows, 16 columns in two groups of 8 by g_idx; gptq_v2 stores zeros as they are.
    g_idx = [1, 0] * 8
    levels = [[(3 * n + k) % 16 for k in range(16)] for n in range(8)]
    qweight = torch.tensor([[words([levels[n][k] for k in range(8 * w, 8 * w + 8)], 4) for n in range(8)]
                            for w in range(2)], dtype=torch.int32)
    zeros = [[8, 7, 6, 5, 4, 3, 2, 1], [1, 2, 3, 4, 5, 6, 7, 8]]  # [group][row]
    qzeros = torch.tensor([[words(zeros[g], 4)] for g in range(2)], dtype=torch.int32)
    scales = torch.tensor([[0.5] * 8, [0.25] * 8], dtype=torch.float16)
    scheme = GptqScheme({"quant_method": "gptq", "bits": 4, "group_size": 8, "desc_act": True,
                         "checkpoint_format": "gptq_v2"})
    weight = dequantized(scheme, 8, 16, {"qweight": qweight, "qzeros": qzeros, "scales": scales,
                                         "g_idx": torch.tensor(g_idx, dtype=torch.int32)})
    expected = [[(levels[n][k] - zeros[g_idx[k]][n]) * [0.5, 0.25][g_idx[k]] for k in range(16)] for n in range(8)]
    assert weight.tolist() == expected


def test_awq_unpacks_rows_in_awqs_order() -> None:
    # 8 rows (one word per column, row AWQ_ORDER[i] at bits 4i), 8 columns, one group: level(n, k) = (2n + k) % 16.
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    qweight = torch.tensor([[words([(2 * order[i] + k) % 16 for i in range(8)], 4)] for k in range(8)],
                           dtype=torch.int32)
    qzeros = torch.tensor([[words([order[i] + 4 for i in range(8)], 4)]], dtype=torch.int32)  # zero(n) = n + 4
    scales = torch.tensor([[0.5] * 4 + [2.0] * 4], dtype=torch.float16)
    scheme = AwqScheme({"quant_method": "awq", "bits": 4, "group_size": 8, "version": "gemm", "zero_point": True})
    weight = dequantized(scheme, 8, 8, {"qweight": qweight, "qzeros": qzeros, "scales": scales})
    expected = [[((2 * n + k) % 16 - (n + 4)) * (0.5 if n < 4 else 2.0) for k in range(8)] for n in range(8)]
    assert weight.tolist() == expected


def test_compressed_tensors_int4_zero_points_and_act_order() -> None:
    pytest.importorskip("compressed_tensors")
    from gpu.quant.compressed_tensors import CompressedTensorsScheme

    config = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                                           "group_size": 8, "actorder": "group"}}}}
    # 8 rows, 16 columns, two groups picked by g_idx; stored levels are the signed level + 8, zeros likewise.
    g_idx = [0, 1] * 8
    stored = [[(n + 5 * k) % 16 for k in range(16)] for n in range(8)]
    packed = torch.tensor([[words(stored[n][8 * w : 8 * w + 8], 4) for w in range(2)] for n in range(8)],
                          dtype=torch.int32)
    zero_stored = [[(n + g) % 16 for g in range(2)] for n in range(8)]  # [row][group], zero + 8
    zero_points = torch.tensor([[words([zero_stored[n][g] for n in range(8)], 4) for g in range(2)]],
                               dtype=torch.int32)
    scales = torch.tensor([[0.5, 0.125]] * 8, dtype=torch.bfloat16)
    weight = dequantized(CompressedTensorsScheme(config), 8, 16, {
        "weight_packed": packed, "weight_scale": scales, "weight_zero_point": zero_points,
        "weight_g_idx": torch.tensor(g_idx, dtype=torch.int32), "weight_shape": torch.tensor([8, 16])})
    expected = [[(stored[n][k] - zero_stored[n][g_idx[k]]) * [0.5, 0.125][g_idx[k]] for k in range(16)]
                for n in range(8)]
    assert weight.tolist() == expected


def test_compressed_tensors_fp8_per_channel_and_int8_symmetric() -> None:
    pytest.importorskip("compressed_tensors")
    from gpu.quant.compressed_tensors import CompressedTensorsScheme

    def config(fmt: str, weights: dict[str, object]) -> dict[str, object]:
        return {"quant_method": "compressed-tensors", "format": fmt,
                "config_groups": {"g": {"targets": ["Linear"], "weights": weights}}}

    fp8 = config("float-quantized", {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True})
    levels = torch.tensor([[1.0, -3.0], [0.5, 2.0]]).to(torch.float8_e4m3fn)
    weight = dequantized(CompressedTensorsScheme(fp8), 2, 2, {"weight": levels,
                                                             "weight_scale": torch.tensor([[0.5], [4.0]])})
    assert weight.tolist() == [[0.5, -1.5], [2.0, 8.0]]
    int8 = config("pack-quantized", {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"})
    stored = [[(37 * n + 11 * k) % 256 for k in range(8)] for n in range(2)]  # the signed level + 128
    packed = torch.tensor([[words(stored[n][4 * w : 4 * w + 4], 8) for w in range(2)] for n in range(2)],
                          dtype=torch.int32)
    weight = dequantized(CompressedTensorsScheme(int8), 2, 8, {
        "weight_packed": packed, "weight_scale": torch.tensor([[0.25], [2.0]], dtype=torch.bfloat16),
        "weight_shape": torch.tensor([2, 8])})
    assert weight.tolist() == [[(stored[n][k] - 128) * [0.25, 2.0][n] for k in range(8)] for n in range(2)]


def _half(value: float) -> bytes:
    return struct.pack("<e", value)


# One block of each type, written byte by byte, and the weights llama.cpp's rules give for it.
def _q4_0() -> tuple[bytes, list[float]]:
    nibbles = bytes((j % 16) | ((15 - j % 16) << 4) for j in range(16))  # weight j: low nibble, j + 16: high
    return _half(0.5) + nibbles, [(j - 8) * 0.5 for j in range(16)] + [(15 - j - 8) * 0.5 for j in range(16)]


def _q4_1() -> tuple[bytes, list[float]]:
    nibbles = bytes(j | (j << 4) for j in range(16))
    return _half(0.25) + _half(-1.0) + nibbles, [j * 0.25 - 1.0 for j in range(16)] * 2


def _q5_0() -> tuple[bytes, list[float]]:
    fifth = 0xF0F0F0F0  # weights 4..7, 12..15, ... take 16
    nibbles = bytes(3 | (9 << 4) for _ in range(16))
    levels = [(3 if j < 16 else 9) + 16 * ((fifth >> j) & 1) for j in range(32)]
    return _half(2.0) + struct.pack("<I", fifth) + nibbles, [(q - 16) * 2.0 for q in levels]


def _q8_0() -> tuple[bytes, list[float]]:
    levels = [j - 16 for j in range(32)]
    return _half(0.125) + struct.pack("<32b", *levels), [q * 0.125 for q in levels]


def _k_scales(scales: list[int], mins: list[int]) -> bytes:
    """The 12 bytes of eight 6-bit (scale, min) pairs, as llama.cpp packs them."""
    out = [0] * 12
    for j in range(4):
        out[j] = scales[j] | ((scales[j + 4] >> 4) << 6)
        out[j + 4] = mins[j] | ((mins[j + 4] >> 4) << 6)
        out[j + 8] = (scales[j + 4] & 15) | ((mins[j + 4] & 15) << 4)
    return bytes(out)


K_SCALES, K_MINS = [1, 2, 3, 4, 17, 33, 50, 63], [0, 5, 10, 20, 16, 40, 60, 31]


def _q4_k() -> tuple[bytes, list[float]]:
    qs = bytes(((c * 32 + lane) % 16) | ((15 - lane % 16) << 4) for c in range(4) for lane in range(32))
    weights = []
    for c in range(4):  # 64 weights per 32 bytes: their low nibbles (sub-block 2c), then their high (2c + 1)
        for half, sub in ((0, 2 * c), (1, 2 * c + 1)):
            for lane in range(32):
                q = (c * 32 + lane) % 16 if half == 0 else 15 - lane % 16
                weights.append(0.5 * K_SCALES[sub] * q - 0.25 * K_MINS[sub])
    return _half(0.5) + _half(0.25) + _k_scales(K_SCALES, K_MINS) + qs, weights


def _q5_k() -> tuple[bytes, list[float]]:
    high = bytes(0b10100101 for _ in range(32))  # bit 2c: weight l of chunk c, bit 2c + 1: weight l + 32
    qs = bytes(7 | (12 << 4) for _ in range(128))
    weights = []
    for c in range(4):
        for half, sub in ((0, 2 * c), (1, 2 * c + 1)):
            q = (7 if half == 0 else 12) + 16 * ((0b10100101 >> (2 * c + half)) & 1)
            weights += [2.0 * K_SCALES[sub] * q - 0.5 * K_MINS[sub]] * 32
    return _half(2.0) + _half(0.5) + _k_scales(K_SCALES, K_MINS) + high + qs, weights


def _q6_k() -> tuple[bytes, list[float]]:
    ql = bytes((i % 16) | (((i + 3) % 16) << 4) for i in range(128))
    qh = bytes((i % 4) | (((i + 1) % 4) << 2) | (((i + 2) % 4) << 4) | (((i + 3) % 4) << 6) for i in range(64))
    scales = [s - 8 for s in range(16)]
    weights = []
    for half in range(2):  # 128 weights each: quarters of 32
        for quarter in range(4):
            for lane in range(32):
                byte = ql[64 * half + lane + 32 * (quarter % 2)]
                low = (byte >> (4 * (quarter // 2))) & 15
                high = (qh[32 * half + lane] >> (2 * quarter)) & 3
                scale = scales[8 * half + 2 * quarter + lane // 16]
                weights.append(0.5 * scale * ((low | (high << 4)) - 32))
    return ql + qh + struct.pack("<16b", *scales) + _half(0.5), weights


HAND_BLOCKS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k,
               "Q6_K": _q6_k}


@pytest.mark.parametrize("kind", gguf_blocks.TYPES)
def test_gguf_block_written_by_hand(kind: str) -> None:
    data, expected = HAND_BLOCKS[kind]()
    assert len(data) == gguf_blocks.TYPE_SIZES[kind] and len(expected) == gguf_blocks.BLOCK_SIZES[kind]
    block = gguf_blocks.BLOCK_SIZES[kind]
    rows = torch.frombuffer(bytearray(data * 4), dtype=torch.uint8).view(2, -1)  # two rows of two blocks
    weight = dequantized(GgufScheme({"quant_method": "gguf", "tensor_types": {"layer": kind}}), 2, 2 * block,
                         {"qweight": rows})
    assert weight.view(-1).tolist() == expected * 4


@pytest.mark.parametrize("kind", gguf_blocks.TYPES)
def test_gguf_layer_equals_the_gguf_package(kind: str) -> None:
    rows, cols = 8, 2 * gguf_blocks.BLOCK_SIZES["Q4_K"]
    blocks = random_gguf_blocks(rows, cols, getattr(gguf.GGMLQuantizationType, kind), seed=len(kind))
    scheme = GgufScheme({"quant_method": "gguf", "tensor_types": {"layer": kind}})
    weight = dequantized(scheme, rows, cols, {"qweight": torch.from_numpy(np.ascontiguousarray(blocks))})
    reference = gguf.quants.dequantize(blocks, getattr(gguf.GGMLQuantizationType, kind))
    np.testing.assert_array_equal(weight.numpy(), reference)
