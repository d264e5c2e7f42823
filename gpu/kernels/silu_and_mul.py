"""Triton kernel: SiLU-and-multiply (or GELU-tanh-and-multiply) over a merged gate/up projection, [T, 2I] -> [T, I].

out = act(gate) * up with gate = x[:, :I], up = x[:, I:], act SiLU or GELU's tanh approximation (Gemma's
`gelu_pytorch_tanh`: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))). Float32 math, rounded to the model
dtype where the torch path (gpu/layers/activation.py) rounds: after the activation and after the product.
Grid: (token, block of columns). Invariants the wrapper checks: x is 2-d with an even number of
columns and unit stride along them (any row stride). The output is a new contiguous tensor.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.triton_math import tanh

ACTIVATIONS = ("silu", "gelu_tanh")


@triton.jit
def gated_chunk(x_row, cols, mask, INTERMEDIATE: tl.constexpr, IS_GELU_TANH: tl.constexpr, DTYPE: tl.constexpr):
    """act(gate) * up at columns `cols` of one row of [gate; up] (x_row: its first element), in DTYPE, rounded where
    the reference rounds (zeros where not `mask`)."""
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + INTERMEDIATE + cols, mask=mask, other=0.0).to(tl.float32)
    if IS_GELU_TANH:
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)  # sqrt(2 / pi) (g + 0.044715 g^3)
        activated = (0.5 * gate * (1.0 + tanh(inner))).to(DTYPE).to(tl.float32)
    else:
        activated = (gate / (1.0 + tl.exp(-gate))).to(DTYPE).to(tl.float32)
    return (activated * up).to(DTYPE)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    x_stride,
    INTERMEDIATE: tl.constexpr,
    BLOCK: tl.constexpr,
    IS_GELU_TANH: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_start(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTERMEDIATE
    out = gated_chunk(x_ptr + token * x_stride, cols, mask, INTERMEDIATE, IS_GELU_TANH, out_ptr.dtype.element_ty)
    tl.store(out_ptr + token * INTERMEDIATE + cols, out, mask=mask)


def silu_and_mul(x: torch.Tensor, use_pdl: bool = False) -> torch.Tensor:  # [T, 2 * I] -> [T, I]
    """silu(x[:, :I]) * x[:, I:] with I = x.shape[1] // 2; `use_pdl`: a programmatic dependent launch where the
    GPU has it (gpu/kernels/pdl.py)."""
    return gated_activation(x, "silu", use_pdl)


def gated_activation(x: torch.Tensor, activation: str, use_pdl: bool = False) -> torch.Tensor:
    """act(x[:, :I]) * x[:, I:], act one of ACTIVATIONS."""
    check_gated_input(x, activation)
    num_tokens, intermediate = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_tokens, intermediate), dtype=x.dtype, device=x.device)
    if num_tokens == 0 or intermediate == 0:
        return out
    block = min(triton.next_power_of_2(intermediate), 1024)
    pdl = uses_pdl(use_pdl, x)
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(intermediate, block))](
        x, out, x.stride(0),
        INTERMEDIATE=intermediate,
        BLOCK=block,
        IS_GELU_TANH=activation == "gelu_tanh",
        USE_PDL=pdl,
        launch_pdl=pdl,
        num_warps=4 if block >= 512 else 1,
        enable_fp_fusion=False,  # no mul+add into one FMA: torch rounds the product first
    )
    return out


def check_gated_input(x: torch.Tensor, activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {ACTIVATIONS}")
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(1) != 1:
        raise ValueError(f"x must be 2-d [num_tokens, 2 * intermediate] with unit column stride, got "
                         f"{tuple(x.shape)} strides {x.stride()}")
