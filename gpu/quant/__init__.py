"""Quantized weights: one module per checkpoint format, each with its loading, its kernel per device and its
reference dequantization (gpu/quant/method.py says how they fit a linear layer).

`quant_scheme(config)` reads config.json's `quantization_config`; `quantize_layers` gives every linear layer
(and mixture's experts) of a built model its format's method before loading, and `finish_loading` readies them after.
An unsupported `quant_method` is an error at start that names it and the supported ones.
"""

import logging
from collections.abc import Callable

import torch
from torch import nn
from transformers import PretrainedConfig

from gpu.quant.layout import ColumnSlice, RowSlice, WeightLayout
from gpu.quant.method import ExpertsQuantMethod, QuantMethod, QuantScheme

logger = logging.getLogger(__name__)


def _schemes() -> dict[str, Callable[[dict[str, object]], QuantScheme]]:
    from gpu.quant.awq import AwqScheme
    from gpu.quant.compressed_tensors import CompressedTensorsScheme
    from gpu.quant.fp8 import Fp8Scheme
    from gpu.quant.gguf import GgufScheme
    from gpu.quant.gptq import GptqScheme
    from gpu.quant.mxfp4 import Mxfp4Scheme

    return {"fp8": Fp8Scheme, "compressed-tensors": CompressedTensorsScheme, "awq": AwqScheme, "gptq": GptqScheme,
            "gguf": GgufScheme, "mxfp4": Mxfp4Scheme}


SUPPORTED_METHODS = ("fp8", "compressed-tensors", "awq", "gptq", "gguf", "mxfp4")


def quant_scheme(config: PretrainedConfig) -> QuantScheme | None:
    """The checkpoint's quantization, or None for float weights."""
    settings = getattr(config, "quantization_config", None)
    if settings is None:
        return None
    settings = settings if isinstance(settings, dict) else settings.to_dict()
    method = settings.get("quant_method")
    schemes = _schemes()
    if method not in schemes:
        raise ValueError(f"quantization method {method!r} (config.json's quantization_config) is not supported; "
                         f"supported: {', '.join(SUPPORTED_METHODS)}")
    return schemes[method](settings)


def quantize_layers(model: nn.Module, scheme: QuantScheme) -> int:
    """Gives each linear layer and each mixture's experts the checkpoint quantizes its method (before loading);
    returns how many. Experts the scheme quantizes but has no experts method for are refused by name."""
    from gpu.layers.linear import Linear
    from gpu.layers.moe import Experts

    packed: dict[str, tuple[str, str]] = getattr(model, "packed_modules", {})
    expert_parts: dict[str, str] = getattr(model, "expert_parts", {})
    count = 0
    experts_methods: list[ExpertsQuantMethod] = []
    for name, module in model.named_modules():
        if isinstance(module, Experts):
            experts_method = _experts_method(scheme, name, module, expert_parts)
            if experts_method is not None:
                module.use_quant_method(experts_method)
                experts_methods.append(experts_method)
        if isinstance(module, Linear):
            method = scheme.method_for(checkpoint_names(name, packed), module.weight_layout())
            if method is not None:
                module.use_quant_method(method)
                count += 1
    if experts_methods:
        logger.info("quantized experts in %d mixtures: %s", len(experts_methods), experts_methods[0].description)
    return count + len(experts_methods)


def _experts_method(scheme: QuantScheme, name: str, experts: nn.Module,
                    expert_parts: dict[str, str]) -> ExpertsQuantMethod | None:
    experts_method_for = getattr(scheme, "experts_method_for", None)
    if experts_method_for is not None:
        return experts_method_for(name, experts)
    if scheme.method_for([f"{name}.0.{part}" for part in expert_parts or ("gate_proj",)],
                         _expert_layout(experts)) is not None:
        raise ValueError(f"the checkpoint's experts are quantized ({scheme.description}): quantized mixtures of "
                         "experts in this format are not supported yet (their attention and dense layers are)")
    return None


def _expert_layout(experts: nn.Module) -> WeightLayout:
    """One expert's gate projection [intermediate, hidden]: what a scheme is asked about the experts."""
    rows, columns = experts.gate_up_proj.shape[1] // 2, experts.gate_up_proj.shape[2]
    return WeightLayout({None: RowSlice.whole(rows)}, ColumnSlice.whole(columns))


def checkpoint_names(module_name: str, packed: dict[str, tuple[str, str]]) -> list[str]:
    """The checkpoint's module names of a layer, in its shards' order: `...qkv_proj` -> `...q_proj`, `...k_proj`,
    `...v_proj` where the model merges them (`packed_modules`); a layer of one tensor keeps its name."""
    parent, _, leaf = module_name.rpartition(".")
    prefix = f"{parent}." if parent else ""
    shards = [checkpoint for checkpoint, (merged, _) in packed.items() if merged == leaf]
    return [prefix + shard for shard in shards] if shards else [module_name]


def finish_loading(model: nn.Module, dtype: torch.dtype) -> None:
    """Readies every quantized layer for `dtype` activations."""
    for module in model.modules():
        if getattr(module, "quant", None) is not None:
            module.finish_loading(dtype)


def warm_up_quantized(model: nn.Module, max_rows: int, dtype: torch.dtype) -> int:
    """Runs every quantized CUDA layer once per row tile of gpu/kernels/quant_gemm_configs.py's rule up to `max_rows`
    rows, so each tile's kernel is compiled before a request meets it; and each distinct product shape that runs in
    cuBLAS (`QuantMethod.cublas_shape`) once per cuBLAS row bucket (gpu/kernels/cublas_rows.py) up to `max_rows`, so
    cuBLAS has chosen its kernel for each. Returns the number of calls made."""
    from gpu.kernels.cublas_rows import cublas_row_buckets
    from gpu.kernels.quant_gemm_configs import row_tile

    rows = sorted({min(max_rows, r) for r in (1, 17, 33, 65, 129)})
    calls = 0
    cublas_layers: dict[tuple[object, ...], nn.Module] = {}
    for module in model.modules():
        method = getattr(module, "quant", None)
        if isinstance(method, QuantMethod) and next(module.parameters()).is_cuda:
            device = next(module.parameters()).device
            for count in {row_tile(r): r for r in rows}.values():
                method.apply(module, torch.zeros(count, method.layout.in_features, dtype=dtype, device=device), None)
                calls += 1
            if (shape := method.cublas_shape()) is not None:
                bias = getattr(module, "bias", None)
                cublas_layers.setdefault((shape, bias is not None, device), module)
    for module in cublas_layers.values():
        device, in_features = next(module.parameters()).device, module.quant.layout.in_features
        for count in cublas_row_buckets(max_rows):
            module.quant.apply(module, torch.zeros(count, in_features, dtype=dtype, device=device),
                               getattr(module, "bias", None))
            calls += 1
    return calls


def cast_float_params(model: nn.Module, dtype: torch.dtype) -> None:
    """model.to(dtype) (each module's own rule kept: a float32 router stays float32) for every tensor but a quantized
    layer's stored ones, whose method chose their dtypes (FP8 weights and float32 scales stay as they are)."""
    def cast(tensor: torch.Tensor) -> torch.Tensor:
        keeps = not tensor.is_floating_point() or hasattr(tensor, "quant_name")
        return tensor if keeps else tensor.to(dtype)

    model._apply(cast)


def weight_summary(model: nn.Module) -> tuple[int, int]:
    """(bytes the weights take, weights they hold): a quantized layer holds out x in weights whatever it stores."""
    num_bytes = num_weights = 0
    seen: set[int] = set()
    for module in model.modules():
        method = getattr(module, "quant", None)
        for param in module.parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            num_bytes += param.numel() * param.element_size()
            num_weights += 0 if hasattr(param, "quant_name") else param.numel()
        if method is not None:
            num_weights += method.num_weights(module)
    return num_bytes, num_weights
