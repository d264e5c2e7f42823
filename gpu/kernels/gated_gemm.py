"""The gate/up projection with SiLU-and-mul in its epilogue: quack's gated GEMM (`quack.gemm_interface.gemm_act`,
activation "swiglu"; CuTe DSL, from quack-kernels, which the `flash` extra installs with flash-attn-4), on Hopper,
for products of at least MIN_ROWS rows (prompt steps).

Why: unfused, a prompt step's gate/up product writes [tokens, 2 x intermediate] and the SiLU kernel reads it back
to write half of it; fused, the pair's activation leaves the chip once, at half the width. A plain product through
the same library is level with cuBLAS, so the gain is the fusion's. Below MIN_ROWS the skinny GEMM (up to 256 rows)
or cuBLAS, then the SiLU kernel, are as fast or faster, and run instead.

Rounding: the epilogue computes silu(gate) * up in float32 from the accumulators and rounds once, where the unfused
pair rounds gate, up, silu(gate) and the product to the dtype each, so many outputs differ from the pair's by a unit
or two in the last place. The bf16 parity tests against transformers bound what that does to greedy tokens
(tests/gpu/test_gated_gemm.py), as they do for the two attention backends.

The weight is used as stored (the [gate; up] rows of MergedLinear), read through quack's `concat_layout`. No
autotuning: quack's default config for the shape (its autotuned one was not faster). quack compiles a kernel the
first time it meets a shape class (seconds; a new row count of the same class then takes about a millisecond) and
keeps it on disk (QUACK_CACHE_ENABLED); the runner's probe and warm-up meet it before a request. The runner remembers
a failed probe on disk per GPU, dtype, packages and this file (gpu/remembered_backends.py): a later start neither
compiles nor tests it again. quack fingerprints the functions an epilogue uses and takes those installed under a
`site-packages` (or `dist-packages`) directory as fixed; installed elsewhere (pip --target into another directory) it
reads the CUTLASS DSL's own functions too, meets a value it cannot fingerprint (a ContextVar of CUTLASS DSL 4.8) and
refuses to compile, which the probe reports.
"""

import importlib.util
import os
from pathlib import Path

import torch

MIN_ROWS = 512
DTYPES = (torch.bfloat16, torch.float16)
PROBE_CODE = (Path(__file__),)  # what a remembered verdict of `probe` is keyed on, beside the packages' versions
SITE_DIRECTORIES = ("site-packages", "dist-packages")  # where quack takes installed code as fixed

# Per (device, dtype): why the gated GEMM cannot run there, None where it can.
_probed: dict[tuple[torch.device, torch.dtype], str | None] = {}


def unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the gated GEMM cannot run here, or None when it can: `requirement_unmet`, else `probe`'s verdict."""
    return requirement_unmet(device, dtype) or probe(device, dtype)


def requirement_unmet(device: torch.device, dtype: torch.dtype) -> str | None:
    """What this device, dtype or install lacks for the gated GEMM (None: nothing), found without running a kernel."""
    if device.type != "cuda":
        return f"it needs CUDA (device {device})"
    if dtype not in DTYPES:
        return f"it takes float16 or bfloat16 (dtype {dtype})"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:  # quack has Blackwell kernels too; only Hopper has been measured
        return f"it runs on Hopper (compute capability 9.x) only here (this GPU: {major}.{minor})"
    if importlib.util.find_spec("quack") is None:
        return "quack is not installed (pip install 'openai-serve[flash]')"
    return None


def probe(device: torch.device, dtype: torch.dtype) -> str | None:
    """Runs one product of MIN_ROWS rows (which also compiles the kernel), once per device and dtype: None where it
    ran, else why not. Only a device and dtype probed here with None are `is_ready`. Call it where
    `requirement_unmet` found nothing."""
    key = _key(device, dtype)
    if key not in _probed:
        _probed[key] = _probe(device, dtype)
    return _probed[key]


def is_ready(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `probe` ran for this device and dtype and found nothing against it. Layers ask this,
    never probe themselves (a probe launches kernels, which a CUDA graph being captured must not record)."""
    return device.type == "cuda" and _probed.get(_key(device, dtype), "not probed") is None


def _key(device: torch.device, dtype: torch.dtype) -> tuple[torch.device, torch.dtype]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.device("cuda", index), dtype


def _probe(device: torch.device, dtype: torch.dtype) -> str | None:
    x = torch.zeros(MIN_ROWS, 128, dtype=dtype, device=device)
    weight = torch.zeros(256, 128, dtype=dtype, device=device)
    try:
        silu_and_mul_product(x, weight)
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - any failure means: run the unfused pair
        hint = install_hint(_origin("cutlass"))
        return (f"quack's gated GEMM failed on a test product ({type(exc).__name__}: {str(exc)[:200]})"
                + (f"; {hint}" if hint else ""))
    return None


def install_hint(cutlass_origin: str | None) -> str | None:
    """What to change where the CUTLASS DSL lies outside a site-packages directory (None: it does not, or is not
    found): quack then fingerprints its functions by their source and globals, and refuses any epilogue that reaches
    one it cannot fingerprint."""
    if cutlass_origin is None or any(f"{os.sep}{d}{os.sep}" in cutlass_origin for d in SITE_DIRECTORIES):
        return None
    return (f"the CUTLASS DSL lies outside a site-packages directory ({Path(cutlass_origin).parent.parent}), so quack "
            "fingerprints its code by source: install quack-kernels and nvidia-cutlass-dsl under a site-packages "
            "directory")


def install_locations() -> dict[str, str | None]:
    """Where quack and the CUTLASS DSL are installed (found, not imported): part of what a remembered verdict of
    `probe` is keyed on, as the same versions installed elsewhere can compile where they could not."""
    return {name: _origin(name) for name in ("quack", "cutlass")}


def _origin(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def silu_and_mul_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(x @ gate.T) * (x @ up.T) for weight = [gate; up] ([2 * I, K], contiguous) and x [M, K]: [M, I]."""
    from quack.gemm_interface import gemm_act

    assert x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1] and weight.shape[0] % 2 == 0
    _, activated = gemm_act(x, weight.t(), activation="swiglu", store_preact=False, concat_layout=("B",),
                            tuned=False)
    return activated
