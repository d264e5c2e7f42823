"""Random weights instead of a checkpoint's (`--load-format dummy`, as vLLM's): a model at its real shape from its
config.json alone, for benchmarks, where writing and reading tens of gigabytes of random checkpoint would take
longer than the measurement.

Values, drawn in place on the model's device by one generator seeded alike on every tensor-parallel rank (so the
replicated weights, routers among them, are the same everywhere): every matrix from N(0, initializer_range), as
transformers initializes a model; norms at one; biases, attention sinks and routers' correction biases at zero;
parameters a checkpoint may lack (`is_optional`) at their defaults.
Activations stay finite through any depth, and a router's logits are small and differ from token to token, so
tokens spread over the experts nearly uniformly (what a benchmark's ideal assumes for the experts a step touches).
"""

import torch
from torch import nn

DEFAULT_STD = 0.02  # transformers' initializer_range when a config has none


@torch.no_grad()
def init_dummy_weights(model: nn.Module, std: float, seed: int) -> None:
    """Fills every parameter of `model` (each once: a tied weight is one parameter)."""
    generator: torch.Generator | None = None
    for name, param in model.named_parameters():
        if generator is None:
            generator = torch.Generator(param.device).manual_seed(seed)
        if getattr(param, "is_optional", False):
            continue  # what a checkpoint may lack keeps its default, as a load without it does (an FP8 cache's scales)
        if name.endswith("bias") or (param.dim() == 1 and "norm" not in name):
            param.zero_()
        elif param.dim() == 1:
            param.fill_(1.0)
        else:
            param.normal_(0.0, std, generator=generator)
