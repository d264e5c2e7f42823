"""llama.cpp's quantized block types as bytes, as integer levels with a scale per sub-block (gpu/quant/int_weights.py's
`IntGroups`, which the GPU kernel reads and whose dequantization is the reference), in torch.

A row of a GGUF weight is a run of blocks along its columns; each block holds `BLOCK_SIZES[type]` weights in
`TYPE_SIZES[type]` bytes. The rules, from llama.cpp's ggml-quants.c (fp16 values little-endian):
- Q4_0 (32 in 18): d, then 16 bytes of 4-bit levels (weight j in the low nibble of byte j, weight j + 16 in its high
  nibble); w = (q - 8) * d.
- Q4_1 (32 in 20): d, m, nibbles as Q4_0; w = q * d + m.
- Q5_0 (32 in 22): d, a 32-bit word of fifth bits (bit j for weight j), nibbles as Q4_0; w = (q - 16) * d.
- Q8_0 (32 in 34): d, 32 int8 levels; w = q * d.
- Q4_K (256 in 144): d, dmin, 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes of nibbles: each 64 weights are
  32 bytes, the first 32 weights in their low nibbles, the next 32 in their high nibbles; sub-block s of 32 weights
  has w = d * scale_s * q - dmin * min_s.
- Q5_K (256 in 176): as Q4_K with 32 bytes of fifth bits before the nibbles: weight l of the 64-weight chunk c
  (l < 32) takes bit 2c of byte l, weight l + 32 bit 2c + 1.
- Q6_K (256 in 210): 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 int8 scales, then d; each half of
  128 weights is four quarters of 32 (low/high nibbles of two 32-byte runs, high parts at bits 0, 2, 4, 6 of one
  32-byte run); w = d * scale_(16 weights) * (q - 32).
"""

import torch

from gpu.quant.int_weights import IntGroups

BLOCK_SIZES = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q8_0": 32, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
TYPE_SIZES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
TYPES = tuple(BLOCK_SIZES)


def row_bytes(gguf_type: str, columns: int) -> int:
    block = BLOCK_SIZES[gguf_type]
    if columns % block:
        raise ValueError(f"{columns} columns are not whole {gguf_type} blocks of {block}")
    return columns // block * TYPE_SIZES[gguf_type]


def dequantize(data: torch.Tensor, gguf_type: str) -> torch.Tensor:
    """[rows, row bytes] uint8 -> [rows, columns] float32."""
    return int_groups(data, gguf_type).dequantize()


def int_groups(data: torch.Tensor, gguf_type: str) -> IntGroups:
    """[rows, row bytes] uint8 as levels with a scale (and a zero or an offset) per sub-block: every type is
    w = (level - zero) * scale + offset, which is how llama.cpp computes it. 5- and 6-bit levels are held in 8 bits."""
    rows = data.shape[0]
    blocks = data.reshape(-1, TYPE_SIZES[gguf_type])
    bits, levels, scales, offsets, zero = _DECODERS[gguf_type](blocks)

    def per_row(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.reshape(rows, -1)

    return IntGroups(bits, per_row(levels).to(torch.int32), per_row(scales), zero=zero,  # type: ignore[union-attr]
                     offsets=per_row(offsets))


Decoded = tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None, float]  # bits, levels, scales, offsets, zero


def _half(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 at bytes [offset, offset + 2) of each block, as float32 [blocks, 1]."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[blocks, n] bytes -> [blocks, 2n]: the low nibbles, then the high ones."""
    return torch.cat([qs & 0xF, qs >> 4], dim=1)


def _q4_0(b: torch.Tensor) -> Decoded:
    return 4, _nibbles(b[:, 2:]), _half(b, 0), None, 8.0


def _q4_1(b: torch.Tensor) -> Decoded:
    return 4, _nibbles(b[:, 4:]), _half(b, 0), _half(b, 2), 0.0


def _q5_0(b: torch.Tensor) -> Decoded:
    high = b[:, 2:6].contiguous().view(torch.int32)  # [blocks, 1]
    bits = (high >> torch.arange(32, dtype=torch.int32, device=b.device)) & 1
    return 8, _nibbles(b[:, 6:]) + 16 * bits, _half(b, 0), None, 16.0


def _q8_0(b: torch.Tensor) -> Decoded:
    return 8, b[:, 2:].contiguous().view(torch.int8).to(torch.int32) + 128, _half(b, 0), None, 128.0


def _k_scales(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit (scale, min) pairs of a Q4_K/Q5_K block at bytes 4..16: [blocks, 8] each."""
    s = b[:, 4:16].long()
    low_scales, low_mins = s[:, 0:4] & 63, s[:, 4:8] & 63
    high_scales = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    high_mins = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return torch.cat([low_scales, high_scales], 1).float(), torch.cat([low_mins, high_mins], 1).float()


def _k_levels(qs: torch.Tensor) -> torch.Tensor:
    """128 bytes -> 256 levels: each 32-byte chunk's low nibbles, then its high nibbles."""
    chunks = qs.reshape(-1, 4, 32)
    return torch.stack([chunks & 0xF, chunks >> 4], dim=2).reshape(-1, 256)


def _k_affine(b: torch.Tensor, bits: int, levels: torch.Tensor) -> Decoded:
    """Q4_K/Q5_K: sub-block s of 32 weights has w = d * scale_s * q - dmin * min_s."""
    scales, mins = _k_scales(b)
    return bits, levels, _half(b, 0) * scales, -(_half(b, 2) * mins), 0.0


def _q4_k(b: torch.Tensor) -> Decoded:
    return _k_affine(b, 4, _k_levels(b[:, 16:144]))


def _q5_k(b: torch.Tensor) -> Decoded:
    high = b[:, 16:48]  # [blocks, 32]
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device)
    fifth = ((high.unsqueeze(1) >> shifts.view(1, 8, 1)) & 1).reshape(-1, 256)  # bit 2c (+1) -> chunk c
    return _k_affine(b, 8, _k_levels(b[:, 48:176]) + 16 * fifth)


def _q6_k(b: torch.Tensor) -> Decoded:
    ql, qh = b[:, 0:128].long().view(-1, 2, 2, 32), b[:, 128:192].long().view(-1, 2, 1, 32)
    low = torch.stack([ql[:, :, 0] & 0xF, ql[:, :, 1] & 0xF, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], 2)  # [b, 2, 4, 32]
    high = (qh >> torch.tensor([0, 2, 4, 6], device=b.device).view(1, 1, 4, 1)) & 3
    scales = b[:, 192:208].contiguous().view(torch.int8).float()  # one per 16 weights
    return 8, (low | (high << 4)).reshape(-1, 256), _half(b, 208) * scales, None, 32.0


_DECODERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k,
             "Q6_K": _q6_k}
