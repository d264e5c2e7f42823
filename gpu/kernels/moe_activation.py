"""Triton helper: the MoE experts' activation over their gate and up products, shared by the grouped GEMMs
(gpu/kernels/fused_moe.py) and the decode kernels (gpu/kernels/moe_decode.py).

SiLU-and-mul (silu(gate) * up), or gpt-oss's clamped SwiGLU ((clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)
with g = min(gate, limit)), in float32.
"""

import triton
import triton.language as tl

ACTIVATIONS = {"silu": 0, "clamped_swiglu": 1}
SILU = tl.constexpr(0)


@triton.jit
def activate(gate, up, ACTIVATION: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr):
    if ACTIVATION == SILU:
        return gate / (1.0 + tl.exp(-gate)) * up
    gate = tl.minimum(gate, LIMIT)
    up = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
    return (up + 1.0) * (gate / (1.0 + tl.exp(-ALPHA * gate)))
