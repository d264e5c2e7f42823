"""Triton kernel: x scaled by sigmoid(gate), the output gates of Qwen3-Next's and Qwen3.5's full attention (a gate per
element) and of their shared experts (a gate per token), in one launch:
    out = round(x * round(sigmoid(gate)))
rounded where the torch code (gpu/layers/activation.py's `times_sigmoid`) rounds: torch's sigmoid of a gate in the
activations' dtype is rounded to it, and the product of two such values, exact in float32, is rounded once; torch's own
exp and division (gpu/kernels/triton_math.py). Grid: (token, group, block of columns). Invariants the wrapper checks:
x [tokens, groups, size] with unit stride along size, gate broadcastable to it (a per-element gate with unit stride
along size, or one per token), both in one dtype. The output is a new contiguous tensor; shapes depend only on the
inputs', so the call is safe inside a CUDA graph.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.triton_math import exp, round_to


@triton.jit
def _sigmoid_gate_kernel(
    x_ptr, gate_ptr, out_ptr, x_token_stride, x_group_stride, gate_token_stride, gate_group_stride,
    NUM_GROUPS: tl.constexpr, SIZE: tl.constexpr, GATE_PER_ELEMENT: tl.constexpr, BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_start(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    cols = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < SIZE
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + token * x_token_stride + group * x_group_stride + cols, mask=mask, other=0.0).to(tl.float32)
    gate_row = gate_ptr + token * gate_token_stride + group * gate_group_stride
    if GATE_PER_ELEMENT:
        gate = tl.load(gate_row + cols, mask=mask, other=0.0).to(tl.float32)
    else:
        gate = tl.load(gate_row).to(tl.float32)
    sigmoid = round_to(tl.math.div_rn(1.0, 1.0 + exp(-gate)), dtype).to(tl.float32)
    tl.store(out_ptr + (token * NUM_GROUPS + group) * SIZE + cols, round_to(x * sigmoid, dtype), mask=mask)


def sigmoid_gate(
    x: torch.Tensor,  # [num_tokens, groups, size]
    gate: torch.Tensor,  # [num_tokens, groups, size], or [num_tokens, 1, 1]: one gate a token
    use_pdl: bool = False,  # a programmatic dependent launch where the GPU has it (gpu/kernels/pdl.py)
) -> torch.Tensor:
    """x * sigmoid(gate), [num_tokens, groups, size] in x's dtype."""
    _check(x, gate)
    num_tokens, num_groups, size = x.shape
    out = torch.empty((num_tokens, num_groups, size), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    block = min(triton.next_power_of_2(size), 1024)
    is_per_element = gate.shape == x.shape
    pdl = uses_pdl(use_pdl, x)
    _sigmoid_gate_kernel[(num_tokens, num_groups, triton.cdiv(size, block))](
        x, gate, out, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1) if is_per_element else 0,
        NUM_GROUPS=num_groups, SIZE=size, GATE_PER_ELEMENT=is_per_element, BLOCK=block, USE_PDL=pdl,
        launch_pdl=pdl,
        num_warps=4 if block >= 512 else 1,
    )
    return out


def _check(x: torch.Tensor, gate: torch.Tensor) -> None:
    if x.dim() != 3 or x.stride(2) != 1 or gate.dtype != x.dtype:
        raise ValueError(f"x must be [num_tokens, groups, size] with unit stride along size and the gate's dtype, got "
                         f"{x.dtype} {tuple(x.shape)} strides {x.stride()}, gate {gate.dtype}")
    per_token = (x.shape[0], 1, 1)
    if not (gate.shape == per_token or (gate.shape == x.shape and gate.stride(2) == 1)):
        raise ValueError(f"gate must be {tuple(x.shape)} with unit stride along size, or {per_token}, got "
                         f"{tuple(gate.shape)} strides {gate.stride()}")
