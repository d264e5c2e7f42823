"""A sparse mixture-of-experts block: a router picks `top_k` experts per token, the experts' gated MLPs run on
their tokens, and their outputs, weighted by the router, are summed; shared experts (where the family has them)
run on every token and are added.

Routing, per family (`Routing`): softmax over the experts then the top k (Qwen3-MoE, Mixtral), renormalized or
not; sigmoid scores with a correction bias that only chooses, group-limited (the best `top_k_groups` of
`num_groups` groups by the sum of each group's two best scores, then the top k among them), renormalized and
scaled by `scaling_factor` (GLM-4-MoE, DeepSeek-V3); or the top k logits then a softmax over those k (gpt-oss).

Experts (`Experts`): every expert's weights stacked, `gate_up_proj` [num_experts, 2 * intermediate, hidden]
(gate rows, then up rows) and `down_proj` [num_experts, hidden, intermediate], read from per-expert checkpoint
tensors (`ExpertShard`s), from tensors already stacked in that layout (transformers' own, which newer checkpoints
ship), or from gpt-oss's stacked layout ([num_experts, hidden, 2 * intermediate] with gate and up interleaved
column by column, down [num_experts, intermediate, hidden]; de-interleaved and transposed here). The activation is
SiLU-and-mul, or gpt-oss's clamped SwiGLU. How the experts run is their `method`'s: unquantized weights run the
fused Triton kernels on CUDA (gpu/kernels/fused_moe.py: tokens sorted by expert once per step, grouped GEMMs with the
activation and the routing weights fused; at a decode step's few tokens gpu/kernels/moe_decode.py's GEMV per (token,
expert) pair instead) and the torch reference elsewhere, which loops over the experts a step hits as transformers
does, so float32 parity is exact. A quantized format brings its own method
(gpu/quant/method.py's ExpertsQuantMethod: its stored parameters, their loading, its kernel and its dequantization,
which a CPU runs); nothing else here knows the format.

The block's input norm: where gpu/layers/linear.py's `norm_prologue_config` allows (a few rows, Llama's norm, a
router in the model dtype), the router's skinny GEMM computes the norm in its prologue and writes the normed x for
the experts and shared experts, so no norm kernel runs of its own (`Router.forward_normed`).

Tensor parallelism: the experts' (and shared experts') intermediate size is split over the ranks, like the dense
MLP's: each rank holds its rows of gate/up and its columns of down for every expert, and the block's output is
one all-reduce of the routed and shared partial sums. The router is replicated (every rank routes alike).
"""

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.distributed import SINGLE, TensorParallel
from gpu.kernels import HAS_TRITON
from gpu.layers.activation import times_sigmoid
from gpu.layers.linear import Linear, linear, norm_prologue_config
from gpu.layers.mlp import MLP, MLPSpec
from gpu.layers.norm import NormInput
from gpu.loader import CheckpointTensor, ExpertShard
from gpu.quant.method import ExpertsQuantMethod

SCORINGS = ("softmax", "sigmoid", "top_k_softmax")
ACTIVATIONS = ("silu", "clamped_swiglu")


@dataclass(frozen=True)
class Routing:
    """How a family's router turns logits into each token's experts and their weights."""

    num_experts: int
    top_k: int
    scoring: str = "softmax"  # one of SCORINGS; top_k_softmax: a softmax over the top k logits (gpt-oss)
    renormalize: bool = True  # the top k weights divided by their sum (softmax and sigmoid scorings)
    num_groups: int = 1  # experts in this many groups, of which the best top_k_groups are eligible
    top_k_groups: int = 1
    scaling_factor: float = 1.0  # applied to the final weights
    has_correction_bias: bool = False  # added to the scores to choose, not to weigh (sigmoid scoring)
    has_bias: bool = False  # the router's linear layer has a bias (gpt-oss)
    float32_logits: bool = False  # the router's weight and logits in float32 (GLM-4-MoE)

    def __post_init__(self) -> None:
        if self.scoring not in SCORINGS:
            raise ValueError(f"router scoring {self.scoring!r} is not supported (supported: {SCORINGS})")
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok ({self.top_k}) must be in 1..{self.num_experts}")
        if self.num_experts % self.num_groups or not 0 < self.top_k_groups <= self.num_groups:
            raise ValueError(f"{self.num_experts} experts cannot be routed in {self.num_groups} groups, "
                             f"{self.top_k_groups} of them chosen")
        if self.num_groups > 1 and self.top_k > self.top_k_groups * (self.num_experts // self.num_groups):
            raise ValueError(f"top {self.top_k} experts cannot come from {self.top_k_groups} groups of "
                             f"{self.num_experts // self.num_groups}")


@dataclass(frozen=True)
class MoeSpec:
    """A family's sparse MLP block, read from its config (gpu/models/)."""

    routing: Routing
    intermediate_size: int  # of one expert
    activation: str = "silu"  # one of ACTIVATIONS
    swiglu_alpha: float = 1.702  # clamped_swiglu: gate * sigmoid(alpha * gate) * (up + 1), both clamped at limit
    swiglu_limit: float = 7.0
    has_expert_bias: bool = False  # biases on each expert's gate/up and down projections (gpt-oss)
    shared_intermediate_size: int = 0  # 0: no shared experts
    has_shared_expert_gate: bool = False  # the shared experts' output scaled by sigmoid(a linear of x) (Qwen3-Next)
    is_gpt_oss_layout: bool = False  # the checkpoint stacks the experts as gpt-oss does

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"expert activation {self.activation!r} is not supported (supported: {ACTIVATIONS})")


@dataclass(frozen=True)
class RoutedTokens:
    """Each token's experts and their weights."""

    weights: torch.Tensor  # [num_tokens, top_k] float32
    expert_ids: torch.Tensor  # [num_tokens, top_k] int64 (torch) or int32 (the Triton routing kernel)


def route_reference(logits: torch.Tensor, routing: Routing, correction_bias: torch.Tensor | None) -> RoutedTokens:
    """The top-k experts of each row of `logits` [num_tokens, num_experts], computed as transformers does."""
    if routing.scoring == "top_k_softmax":
        top, ids = torch.topk(logits, routing.top_k, dim=-1)
        return RoutedTokens(torch.softmax(top.float(), dim=-1), ids)
    if routing.scoring == "softmax":
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(scores, routing.top_k, dim=-1)
    else:
        scores = logits.float().sigmoid()
        choice = scores if correction_bias is None else scores + correction_bias
        ids = torch.topk(_in_top_groups(choice, routing), routing.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
    if routing.renormalize:
        # (transformers adds 1e-20 to the sigmoid scores' sum only: a softmax's top k never sum to zero)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if routing.scoring == "sigmoid" else 0.0))
    return RoutedTokens(weights * routing.scaling_factor if routing.scaling_factor != 1.0 else weights, ids)


def _in_top_groups(choice: torch.Tensor, routing: Routing) -> torch.Tensor:
    """`choice` with the experts outside each row's best `top_k_groups` groups set to -inf."""
    if routing.num_groups == 1:
        return choice
    grouped = choice.view(choice.shape[0], routing.num_groups, -1)
    group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)  # [num_tokens, num_groups]: each group's best two
    best_groups = torch.topk(group_scores, routing.top_k_groups, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, best_groups, 1.0).bool()
    return grouped.masked_fill(~group_mask.unsqueeze(-1), float("-inf")).view_as(choice)


class Router(nn.Module):
    """The linear layer from hidden states to expert logits, and the family's choice of experts."""

    def __init__(self, hidden_size: int, routing: Routing, kernels: KernelConfig = DEFAULT_KERNELS) -> None:
        super().__init__()
        self.routing = routing
        self.kernels = kernels
        dtype = torch.float32 if routing.float32_logits else None
        self.weight = nn.Parameter(torch.empty(routing.num_experts, hidden_size, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(routing.num_experts, dtype=dtype)) if routing.has_bias else None
        self.e_score_correction_bias = (nn.Parameter(torch.empty(routing.num_experts, dtype=torch.float32))
                                        if routing.has_correction_bias else None)

    def forward(self, x: torch.Tensor) -> RoutedTokens:
        """Each token's experts, from x [num_tokens, hidden_size] normed."""
        if self.routing.float32_logits:
            logits = F.linear(x.float(), self.weight, self.bias)
        else:
            logits = linear(x, self.weight, self.bias, self.kernels)  # [num_tokens, num_experts]
        return self._route(logits)

    def forward_normed(self, inp: NormInput) -> tuple[RoutedTokens, torch.Tensor, torch.Tensor]:
        """(each token's experts, norm(x + residual), x + residual): where `norm_prologue_config` gives a config, one
        kernel computes the norm in the logits' prologue and also writes the normed x, which the experts then read
        (no norm kernel of its own); else the norm kernel, then the logits. A float32 router never fuses (its weight
        is not x's dtype)."""
        config = None if self.routing.float32_logits else norm_prologue_config(inp, self.weight, self.kernels)
        if config is None:
            normed, residual = inp.compute()
            return self(normed), normed, residual
        from gpu.kernels.skinny_gemm import skinny_gemm_rms_norm

        normed = torch.empty_like(inp.x)
        logits, residual = skinny_gemm_rms_norm(inp.x, inp.residual, inp.norm.weight, inp.norm.eps, self.weight,
                                                self.bias, config, use_pdl=True, normed_out=normed)
        return self._route(logits), normed, residual

    def _route(self, logits: torch.Tensor) -> RoutedTokens:
        if self.kernels.fused_kernels and HAS_TRITON and logits.is_cuda:
            from gpu.kernels.moe_route import route

            return RoutedTokens(*route(logits, self.routing, self.e_score_correction_bias, use_pdl=True))
        return route_reference(logits, self.routing, self.e_score_correction_bias)

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module's signature
        """A model-wide cast (`model.to(torch.bfloat16)`) leaves a float32 router in float32; moves still apply.
        The correction bias always stays float32: its values differ by less than bfloat16 can tell apart."""
        def keep_float32(t: torch.Tensor) -> torch.Tensor:
            moved = fn(t)
            keeps = self.routing.float32_logits or t is self.e_score_correction_bias
            return t.to(moved.device) if keeps and moved.dtype != t.dtype else moved

        return super()._apply(keep_float32, recurse)


class ExpertsMethod(Protocol):
    """How stacked experts run: unquantized here; a quantized format brings its own per expert weight."""

    def __call__(self, experts: "Experts", x: torch.Tensor, routed: RoutedTokens,
                 add: torch.Tensor | None) -> torch.Tensor: ...


class Experts(nn.Module):
    """Every expert's gated MLP, stacked; this rank's share of each expert's intermediate rows."""

    def __init__(self, hidden_size: int, spec: MoeSpec, tp: TensorParallel = SINGLE,
                 kernels: KernelConfig = DEFAULT_KERNELS) -> None:
        super().__init__()
        num_experts, size = spec.routing.num_experts, spec.intermediate_size
        self.spec, self.tp, self.kernels, self.hidden_size = spec, tp, kernels, hidden_size
        self.start, self.size = tp.split(size, "the experts' intermediate size")
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * self.size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, self.size))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * self.size)) if spec.has_expert_bias else None
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden_size)) if spec.has_expert_bias else None
        for param in self.parameters():
            param.weight_loader = self._load  # type: ignore[attr-defined]
        self.method: ExpertsMethod = run_unquantized
        self.quant: ExpertsQuantMethod | None = None  # a quantized checkpoint's format (gpu/quant/); None: float

    def use_quant_method(self, method: ExpertsQuantMethod) -> None:
        """Replaces the float weights by the method's parameters, named as the checkpoint names its tensors (the
        biases stay float)."""
        device = self.gate_up_proj.device
        for name in ("gate_up_proj", "down_proj"):
            self.register_parameter(name, None)
        for name, tensor in method.create_params(self, device).items():
            param = nn.Parameter(tensor, requires_grad=False)
            param.weight_loader = self._load_quantized  # type: ignore[attr-defined]
            param.quant_name = name  # type: ignore[attr-defined]
            self.register_parameter(name, param)
        self.quant = self.method = method

    def _load_quantized(self, param: nn.Parameter, loaded: CheckpointTensor, shard: ExpertShard | None) -> None:
        assert self.quant is not None
        self.quant.load(self, param.quant_name, param, loaded, shard)  # type: ignore[attr-defined]

    def finish_loading(self, dtype: torch.dtype) -> None:
        """After loading: quantized weights in their kernel's form on a GPU (for `dtype` activations); on a CPU
        dequantized (the reference: the weights exactly), after which the experts are float ones."""
        if self.quant is None:
            return
        self.quant.finish_loading(self, dtype)
        if next(self.parameters()).device.type != "cpu":
            return
        self.use_float_weights(*self.quant.dequantize(self))

    def use_float_weights(self, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        """The float experts from these weights in their layout, the quantized parameters dropped."""
        for name in [n for n, p in self._parameters.items() if p is not None and hasattr(p, "quant_name")]:
            delattr(self, name)
        self.gate_up_proj = nn.Parameter(gate_up, requires_grad=False)
        self.down_proj = nn.Parameter(down, requires_grad=False)
        self.quant, self.method = None, run_unquantized

    def forward(self, x: torch.Tensor, routed: RoutedTokens, add: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's part of sum_k weight_k * expert_k(x) [num_tokens, hidden_size] (the caller reduces), plus
        `add` (the shared experts' part) where given."""
        return self.method(self, x, routed, add)

    def expected_shards(self, param: nn.Parameter) -> set[ExpertShard | None]:
        """The checkpoint shards of `param`: a tensor per expert (gpt-oss: one stacked tensor). A stacked tensor in
        the parameter's own layout counts as all of them (gpu/loader.py)."""
        if self.spec.is_gpt_oss_layout:
            return {None}
        is_down = param is self.down_proj or getattr(param, "quant_name", "").startswith("down")
        parts = ("down",) if is_down else ("gate", "up")
        return {ExpertShard(part, e) for part in parts for e in range(self.spec.routing.num_experts)}

    def _load(self, param: nn.Parameter, loaded: CheckpointTensor, shard: ExpertShard | None) -> None:
        if shard is None:
            read = self._gpt_oss_stacked if self.spec.is_gpt_oss_layout else self._stacked
            stacked = read(param, loaded)
            if stacked.shape != param.shape:
                raise ValueError(f"{loaded.name}: checkpoint shape {loaded.shape} does not fit {tuple(param.shape)}")
            param.data.copy_(stacked)
            return
        num_rows = self.spec.intermediate_size
        if shard.part == "down":  # [hidden, intermediate]: this rank's columns
            _check_shape(loaded, (param.shape[1], num_rows))
            param.data[shard.expert].copy_(loaded.read_slice(1, self.start, self.size))
            return
        _check_shape(loaded, (num_rows, param.shape[2]))  # gate or up [intermediate, hidden]: this rank's rows
        offset = 0 if shard.part == "gate" else self.size
        param.data[shard.expert, offset : offset + self.size].copy_(loaded.read_slice(0, self.start, self.size))

    def _stacked(self, param: nn.Parameter, loaded: CheckpointTensor) -> torch.Tensor:
        """This rank's share of a tensor stacked in the parameter's own layout (transformers')."""
        if param is self.down_proj:  # [E, hidden, intermediate]: this rank's columns
            return loaded.read_slice(2, self.start, self.size)
        total = self.spec.intermediate_size  # gate_up [E, 2 * intermediate, hidden]: this rank's gate and up rows
        gate = loaded.read_slice(1, self.start, self.size)
        return torch.cat((gate, loaded.read_slice(1, total + self.start, self.size)), dim=1)

    def _gpt_oss_stacked(self, param: nn.Parameter, loaded: CheckpointTensor) -> torch.Tensor:
        """This rank's share of a tensor stacked as gpt-oss stacks it, in the parameter's layout."""
        start, size = self.start, self.size
        if param is self.down_proj:  # [E, intermediate, hidden]
            return loaded.read_slice(1, start, size).transpose(1, 2)
        if param is self.down_proj_bias:  # [E, hidden]: added once, on rank 0
            return loaded.read() if self.tp.is_first else torch.zeros(param.shape)
        # Gate and up interleaved along the last dimension: this rank's pairs of columns.
        columns = loaded.read_slice(len(loaded.shape) - 1, 2 * start, 2 * size)
        gate_up = torch.cat((columns[..., 0::2], columns[..., 1::2]), dim=-1)
        return gate_up.transpose(1, 2) if param is self.gate_up_proj else gate_up  # weight [E, hidden, 2I]; bias


def _check_shape(loaded: CheckpointTensor, expected: tuple[int, ...]) -> None:
    if loaded.shape != expected:
        raise ValueError(f"{loaded.name}: checkpoint shape {loaded.shape} != {expected}")


def run_unquantized(experts: Experts, x: torch.Tensor, routed: RoutedTokens, add: torch.Tensor | None) -> torch.Tensor:
    """The fused Triton kernels on CUDA, the torch reference elsewhere (or with `KernelConfig.fused_kernels` off)."""
    if experts.kernels.fused_kernels and HAS_TRITON and x.is_cuda:
        from gpu.kernels.fused_moe import fused_experts

        return fused_experts(x, experts.gate_up_proj, experts.down_proj, routed.weights, routed.expert_ids,
                             activation(experts.spec), experts.gate_up_proj_bias, experts.down_proj_bias,
                             use_pdl=True, add=add)
    out = experts_reference(x, experts, routed)
    return out if add is None else out + add


@dataclass(frozen=True)
class Activation:
    """The experts' activation over [gate; up] (gpu/kernels/fused_moe.py takes the same)."""

    kind: str  # one of ACTIVATIONS
    alpha: float = 0.0
    limit: float = 0.0


def activation(spec: MoeSpec) -> Activation:
    if spec.activation == "silu":
        return Activation("silu")
    return Activation(spec.activation, spec.swiglu_alpha, spec.swiglu_limit)


def activate(gate_up: torch.Tensor, act: Activation) -> torch.Tensor:
    """[num_rows, 2 * I] -> [num_rows, I], rounded where transformers rounds."""
    gate, up = gate_up.chunk(2, dim=-1)
    if act.kind == "silu":
        return F.silu(gate) * up
    gate = gate.clamp(max=act.limit)
    up = up.clamp(min=-act.limit, max=act.limit)
    return (up + 1) * (gate * torch.sigmoid(gate * act.alpha))


def experts_reference(x: torch.Tensor, experts: Experts, routed: RoutedTokens) -> torch.Tensor:
    """The experts one by one over their tokens, in expert order, summed as transformers sums them. Which experts
    a step hits is read on the host; while a CUDA graph is being captured, where nothing may be, every expert runs
    over every token instead, weighted by zero where not routed (the same sums, at E / top_k times the work)."""
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return _experts_over_every_token(x, experts, routed)
    out = torch.zeros_like(x)
    act = activation(experts.spec)
    num_experts = experts.gate_up_proj.shape[0]
    expert_mask = F.one_hot(routed.expert_ids.long(), num_experts).permute(2, 1, 0)  # [experts, top_k, tokens]
    for expert in expert_mask.sum(dim=(1, 2)).nonzero().flatten().tolist():
        slot, token = torch.where(expert_mask[expert])
        b13 = None if experts.gate_up_proj_bias is None else experts.gate_up_proj_bias[expert]
        b2 = None if experts.down_proj_bias is None else experts.down_proj_bias[expert]
        hidden = activate(F.linear(x[token], experts.gate_up_proj[expert], b13), act)
        hidden = F.linear(hidden, experts.down_proj[expert], b2)
        out.index_add_(0, token, (hidden * routed.weights[token, slot, None]).to(out.dtype))
    return out


def _experts_over_every_token(x: torch.Tensor, experts: Experts, routed: RoutedTokens) -> torch.Tensor:
    out = torch.zeros_like(x)
    act = activation(experts.spec)
    ids = routed.expert_ids.long()
    for expert in range(experts.gate_up_proj.shape[0]):
        weight = (routed.weights * (ids == expert)).sum(dim=-1, keepdim=True)  # [num_tokens, 1]: 0 where not routed
        b13 = None if experts.gate_up_proj_bias is None else experts.gate_up_proj_bias[expert]
        b2 = None if experts.down_proj_bias is None else experts.down_proj_bias[expert]
        hidden = F.linear(activate(F.linear(x, experts.gate_up_proj[expert], b13), act), experts.down_proj[expert], b2)
        out += (hidden * weight).to(out.dtype)
    return out


class SparseMoe(nn.Module):
    """The block in a decoder layer's MLP place: forward(NormInput) -> (output, residual), as the dense MLP."""

    def __init__(self, config: PretrainedConfig, spec: MoeSpec, kernels: KernelConfig = DEFAULT_KERNELS,
                 tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.tp, self.kernels = tp, kernels
        self.gate = Router(config.hidden_size, spec.routing, kernels)
        self.experts = Experts(config.hidden_size, spec, tp, kernels)
        shared = MLPSpec(config.hidden_size, spec.shared_intermediate_size, getattr(config, "hidden_act", "silu"))
        self.shared_experts = (MLP(shared, kernels, tp, reduces_output=False)
                               if spec.shared_intermediate_size else None)
        # Replicated: it scales this rank's partial sum of the shared experts, which the all-reduce then sums.
        self.shared_expert_gate = Linear(config.hidden_size, 1, False, kernels) if spec.has_shared_expert_gate else None

    def forward(self, x: NormInput) -> tuple[torch.Tensor, torch.Tensor]:
        # The router first: where it can, its product computes the norm and hands the normed x on.
        routed, normed, residual = self.gate.forward_normed(x)
        shared = self.shared_experts.project(normed) if self.shared_experts is not None else None
        if shared is not None and self.shared_expert_gate is not None:
            gate = self.shared_expert_gate(normed)  # [num_tokens, 1]
            shared = times_sigmoid(shared.unsqueeze(1), gate.unsqueeze(2), self.kernels).squeeze(1)
        return self.tp.all_reduce(self.experts(normed, routed, shared)), residual

