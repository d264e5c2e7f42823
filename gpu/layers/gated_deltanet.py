"""A Gated DeltaNet layer (Qwen3-Next, Qwen3.5): linear attention with a recurrent state and a short causal
convolution instead of a KV cache.

    [q; k; v], z, b, a = in_proj(x)           (one merged product)
    q, k, v = silu(causal_conv1d([q; k; v]))   (depthwise, kernel K, the previous K - 1 inputs kept as conv state)
    beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)
    o = gated_delta_rule(q, k, v, g, beta)     (gpu/layers/gated_delta_rule.py; the recurrent state kept)
    out_proj(rms_norm(o) * silu(z))            (per value head)

Checkpoints name the input projections two ways, both loaded into `in_proj` (rows q, k, v, z, b, a, each part over
all of its heads): Qwen3.5's `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`; Qwen3-Next's fused
`in_proj_qkvz` and `in_proj_ba`, grouped by key head ([q, k, v, z] of key head 0, then of key head 1, ...), which the
loader regroups.

On CUDA a decode step's delta rule runs as one Triton kernel (gpu/kernels/gated_delta_decode.py) that updates the
rows' states in place; a step with prompts runs short rows token after token in one Triton kernel
(gpu/kernels/gated_delta_rows.py) and longer ones through flash-linear-attention's chunked kernel over every row at
once where `fla` is installed (else the torch code, row by row), their convolution in one kernel that reads and
writes the conv states in place (gpu/kernels/causal_conv_rows.py); beta and g come from one kernel
(gpu/kernels/gated_delta_gates.py) and the gated output norm from another (gpu/kernels/gated_rms_norm.py), each in
place of a chain of small torch operations, rounding where they round. The torch code is the reference all are tested
against.

State (gpu/state_cache.py): per sequence slot, `conv_state` [slots, conv_dim, K - 1] in the model's dtype and
`recurrent_state` [slots, value_heads, key_dim, value_dim] in float32 (the delta rule accumulates into it at every
token), views of every layer's states stacked (written in place, never assigned). A step reads each row's slot
(zeros where the row starts its sequence) and writes it back.

Tensor parallelism: each rank holds its share of the key heads and of the value heads (a key head's value heads
with it): their rows of in_proj, their convolution channels, decays and states; out_proj is row-parallel.
"""

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from gpu.attention.metadata import AttentionMetadata, LinearStateMetadata, PieceLevel
from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.distributed import SINGLE, TensorParallel
from gpu.kernels import HAS_TRITON
from gpu.layers import gated_delta_rule
from gpu.layers.linear import Linear
from gpu.layers.norm import NormInput
from gpu.layers.parallel_linear import RowParallelLinear
from gpu.loader import CheckpointTensor

logger = logging.getLogger(__name__)

# flash-linear-attention's chunked kernel for prompts on CUDA, where it is installed (import name `fla`).
HAS_FLA = importlib.util.find_spec("fla") is not None


@cache
def fla_chunked_rule() -> Callable | None:
    """fla's chunk_gated_delta_rule, or None where it does not import (then the torch code runs, logged once)."""
    if not HAS_FLA:
        return None
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as error:  # noqa: BLE001 - any failure to import leaves the torch path
        logger.warning("flash-linear-attention does not import (%s): prompts run the torch delta rule", error)
        return None
    return chunk_gated_delta_rule

# Checkpoint parts of the input projection, by family: Qwen3.5's separate tensors, Qwen3-Next's fused ones.
SEPARATE_PARTS = ("qkv", "z", "b", "a")
FUSED_PARTS = ("qkvz", "ba")


@dataclass(frozen=True)
class DeltaNetSpec:
    hidden_size: int
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel_size: int
    norm_eps: float
    has_fused_projections: bool  # Qwen3-Next's in_proj_qkvz / in_proj_ba

    @staticmethod
    def of(config: PretrainedConfig) -> "DeltaNetSpec":
        return DeltaNetSpec(config.hidden_size, config.linear_num_key_heads, config.linear_num_value_heads,
                            config.linear_key_head_dim, config.linear_value_head_dim, config.linear_conv_kernel_dim,
                            config.rms_norm_eps, config.model_type == "qwen3_next")

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def of_rank(self, tp: TensorParallel) -> "DeltaNetSpec":
        """The layer as one tensor-parallel rank holds it: its share of the key heads and of the value heads."""
        num_key_heads = tp.split(self.num_key_heads, "the Gated DeltaNet key heads")[1]
        num_value_heads = tp.split(self.num_value_heads, "the Gated DeltaNet value heads")[1]
        return replace(self, num_key_heads=num_key_heads, num_value_heads=num_value_heads)


def rank_rows(spec: DeltaNetSpec, tp: TensorParallel) -> dict[str, torch.Tensor]:
    """Per part of the input projection ([q; k; v] over all heads, z, b, a) the rows this rank holds, in order; the
    [q; k; v] rows are also the convolution's channels. On the CPU, where checkpoint tensors are read, whatever
    device the model is built under."""
    local = spec.of_rank(tp)
    key_rows = torch.arange(tp.rank * local.key_dim, (tp.rank + 1) * local.key_dim, device="cpu")
    value_rows = torch.arange(tp.rank * local.value_dim, (tp.rank + 1) * local.value_dim, device="cpu")
    heads = torch.arange(tp.rank * local.num_value_heads, (tp.rank + 1) * local.num_value_heads, device="cpu")
    qkv = torch.cat((key_rows, spec.key_dim + key_rows, 2 * spec.key_dim + value_rows))
    return {"qkv": qkv, "z": value_rows, "b": heads, "a": heads}


class DeltaNetInputProjection(Linear):
    """[q; k; v; z; b; a] rows of this rank's heads, loaded from either family's checkpoint tensors (see the module
    docstring)."""

    def __init__(self, spec: DeltaNetSpec, kernels: KernelConfig, tp: TensorParallel = SINGLE) -> None:
        self.rows_of_rank = rank_rows(spec, tp)
        rows = {name: len(indices) for name, indices in self.rows_of_rank.items()}
        super().__init__(spec.hidden_size, sum(rows.values()), False, kernels)
        self.spec = spec  # the checkpoint's (all heads)
        self.part_rows: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in rows.items():
            self.part_rows[name] = (start, size)
            start += size
        self.weight.weight_loader = self._load  # type: ignore[attr-defined]

    def expected_shards(self, param: nn.Parameter) -> set[str]:
        return set(FUSED_PARTS if self.spec.has_fused_projections else SEPARATE_PARTS)

    def _load(self, param: nn.Parameter, loaded: CheckpointTensor, shard: str | None) -> None:
        if shard not in self.expected_shards(param):
            raise ValueError(f"{loaded.name}: this model's Gated DeltaNet projections are "
                             f"{sorted(self.expected_shards(param))}")
        tensor = loaded.read()
        parts = self._regrouped(tensor, shard) if shard in FUSED_PARTS else {shard: tensor}
        for name, rows in parts.items():
            start, size = self.part_rows[name]
            s = self.spec
            expected = ({"qkv": s.conv_dim, "z": s.value_dim}.get(name, s.num_value_heads), self.in_features)
            if rows.shape != expected:
                raise ValueError(f"{loaded.name}: part {name} has shape {tuple(rows.shape)}, expected {expected}")
            param.data[start : start + size].copy_(rows[self.rows_of_rank[name]])

    def _regrouped(self, tensor: torch.Tensor, shard: str) -> dict[str, torch.Tensor]:
        """Qwen3-Next's fused tensors, grouped by key head, as the separate parts over all heads."""
        s = self.spec
        per_key_head = s.num_value_heads // s.num_key_heads
        grouped = tensor.reshape(s.num_key_heads, -1, tensor.shape[-1])
        if shard == "ba":
            b, a = grouped.split([per_key_head, per_key_head], dim=1)
            return {"b": b.reshape(-1, tensor.shape[-1]), "a": a.reshape(-1, tensor.shape[-1])}
        sizes = [s.key_head_dim, s.key_head_dim, per_key_head * s.value_head_dim, per_key_head * s.value_head_dim]
        q, k, v, z = (part.reshape(-1, tensor.shape[-1]) for part in grouped.split(sizes, dim=1))
        return {"qkv": torch.cat((q, k, v)), "z": z}


def _rows_loader(indices: torch.Tensor) -> Callable[[nn.Parameter, CheckpointTensor, str | None], None]:
    """A weight loader that takes these rows (dimension 0) of the checkpoint tensor: this rank's channels or heads."""
    def load(param: nn.Parameter, loaded: CheckpointTensor, shard: str | None) -> None:
        tensor = loaded.read()
        if tensor.shape[1:] != param.shape[1:] or tensor.shape[0] <= int(indices.max()):
            raise ValueError(f"{loaded.name}: checkpoint shape {tuple(tensor.shape)} does not hold this layer's "
                             f"{tuple(param.shape)}")
        param.data.copy_(tensor[indices])

    return load


def uses_kernels(kernels: KernelConfig, x: torch.Tensor) -> bool:
    """Whether the layer's Triton kernels run over x: on CUDA, with the kernel config's fused kernels."""
    return kernels.fused_kernels and HAS_TRITON and x.is_cuda


class GatedRMSNorm(nn.Module):
    """rms_norm(x) * weight * silu(gate) per head, rounded where transformers rounds; on CUDA with the kernels one
    launch (gpu/kernels/gated_rms_norm.py), the torch code the reference."""

    def __init__(self, size: int, eps: float, kernels: KernelConfig = DEFAULT_KERNELS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.kernels = kernels

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x: the delta rule's output [tokens, heads, head_dim] (float32, or already the gate's dtype), rounded to the
        gate's dtype first; the result in the gate's dtype."""
        if uses_kernels(self.kernels, x):
            from gpu.kernels.gated_rms_norm import gated_rms_norm

            return gated_rms_norm(x, gate, self.weight, self.eps, use_pdl=True)
        dtype = gate.dtype
        x = x.to(dtype).float()
        normed = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)
        return (normed * F.silu(gate.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, spec: DeltaNetSpec, kernels: KernelConfig = DEFAULT_KERNELS, tp: TensorParallel = SINGLE
                 ) -> None:
        """Under tensor parallelism each rank holds its share of the key and value heads (their projections,
        convolution channels, decays and states); out_proj sums the ranks' outputs."""
        super().__init__()
        self.spec = local = spec.of_rank(tp)  # this rank's heads: what it computes and keeps state for
        self.in_proj = DeltaNetInputProjection(spec, kernels, tp)
        self.conv1d = nn.Conv1d(local.conv_dim, local.conv_dim, spec.conv_kernel_size, groups=local.conv_dim,
                                bias=False)
        self.dt_bias = nn.Parameter(torch.ones(local.num_value_heads))
        self.A_log = nn.Parameter(torch.zeros(local.num_value_heads))
        rows = self.in_proj.rows_of_rank
        for param, indices in ((self.conv1d.weight, rows["qkv"]), (self.dt_bias, rows["a"]), (self.A_log, rows["a"])):
            param.weight_loader = _rows_loader(indices)  # type: ignore[attr-defined]
        self.norm = GatedRMSNorm(spec.value_head_dim, spec.norm_eps, kernels)
        self.out_proj = RowParallelLinear(spec.value_dim, spec.hidden_size, False, tp, kernels)
        self.kernels = kernels
        self.conv_state = torch.empty(0)  # [slots, conv_dim, K - 1], a view set by gpu/state_cache.py
        self.recurrent_state = torch.empty(0)  # [slots, value_heads, key_head_dim, value_head_dim] float32

    def forward(self, hidden: NormInput, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """(the layer's output over norm(x + residual), x + residual)."""
        projected, residual = self.in_proj.forward_normed(hidden)
        s = self.spec
        qkv, z, b, a = projected.split([s.conv_dim, s.value_dim, s.num_value_heads, s.num_value_heads], dim=-1)
        g, beta = self._gates(a, b)
        state = meta.linear_state
        assert state is not None, "a model with Gated DeltaNet layers runs with its rows' state slots"
        out = self._convolved_rule(qkv, g, beta, state)
        num_tokens = out.shape[0]
        out = self.norm(out, z.reshape(num_tokens, s.num_value_heads, s.value_head_dim))
        return self.out_proj(out.reshape(num_tokens, s.value_dim)), residual

    def _gates(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g [tokens, value_heads] float32, beta [tokens, value_heads] in b's dtype) from the projection's a and b
        columns: one launch on CUDA with the kernels (gpu/kernels/gated_delta_gates.py), the torch code the
        reference."""
        if self._uses_kernels(a):
            from gpu.kernels.gated_delta_gates import gated_delta_gates

            return gated_delta_gates(a, b, self.A_log, self.dt_bias, use_pdl=True)
        return -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias), b.sigmoid()

    def _convolved_rule(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: LinearStateMetadata
                        ) -> torch.Tensor:
        """The convolution and the delta rule over the step's rows, each part its way: [num_tokens, value_heads,
        value_head_dim] float32."""
        if not state.parts:
            return self._mixed(qkv, g, beta, state)
        s = self.spec
        out = qkv.new_empty((qkv.shape[0], s.num_value_heads, s.value_head_dim), dtype=torch.float32)
        for part, tokens in state.parts:  # fla's prompt rows come in the activations' dtype, the decode rows not
            out[tokens] = self._mixed(qkv[tokens], g[tokens], beta[tokens], part).float()
        return out

    def _mixed(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: LinearStateMetadata
               ) -> torch.Tensor:
        """The convolution and the delta rule over rows of one kind: [num_tokens, value_heads, value_head_dim]."""
        if state.is_one_token_per_row:
            return self._decode(qkv, g, beta, state)
        if state.by_position:
            return self._by_position(qkv, g, beta, state)
        return self._rows(self._convolved_rows(qkv, state), g, beta, state)

    def _split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.spec
        q, k, v = qkv.split([s.key_dim, s.key_dim, s.value_dim], dim=-1)
        shape = qkv.shape[:-1]
        return (q.reshape(*shape, s.num_key_heads, s.key_head_dim), k.reshape(*shape, s.num_key_heads, s.key_head_dim),
                v.reshape(*shape, s.num_value_heads, s.value_head_dim))

    def _uses_kernels(self, x: torch.Tensor) -> bool:
        return uses_kernels(self.kernels, x)

    def _decode(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: LinearStateMetadata
                ) -> torch.Tensor:
        """One token per row, every row at once: [num_rows, value_heads, value_head_dim] float32."""
        slots, keeps = state.slots, state.keeps_state
        conv_state = self.conv_state[slots] * keeps[:, None, None].to(self.conv_state.dtype)
        mixed, conv_state = gated_delta_rule.conv_step(qkv, conv_state, self.conv1d.weight[:, 0])
        self.conv_state[slots] = conv_state
        if self._uses_kernels(mixed):
            from gpu.kernels.gated_delta_decode import gated_delta_decode

            s = self.spec
            heads = (s.num_key_heads, s.num_value_heads, s.key_head_dim, s.value_head_dim)
            return gated_delta_decode(mixed, heads, g, beta.contiguous(), self.recurrent_state, slots, keeps)
        q, k, v = self._split_heads(mixed)
        recurrent_state = self.recurrent_state[slots] * keeps[:, None, None, None]
        out, recurrent_state = gated_delta_rule.recurrent(q, k, v, g, beta, recurrent_state)
        self.recurrent_state[slots] = recurrent_state
        return out

    def _by_position(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: LinearStateMetadata
                     ) -> torch.Tensor:
        """Rows that verify drafts: their i-th tokens as one decode step, for each i, each row's state then copied
        where it is kept after i + 1 tokens (LinearStateMetadata.by_position)."""
        s = self.spec
        out = qkv.new_empty((qkv.shape[0], s.num_value_heads, s.value_head_dim), dtype=torch.float32)
        for step in state.by_position:
            inputs = LinearStateMetadata(step.slots, step.keeps_state, (), (), is_one_token_per_row=True)
            out[step.tokens] = self._decode(qkv[step.tokens], g[step.tokens], beta[step.tokens], inputs)
            self.conv_state[step.saves_to] = self.conv_state[step.slots]
            self.recurrent_state[step.saves_to] = self.recurrent_state[step.slots]
        return out

    def _convolved_rows(self, qkv: torch.Tensor, state: LinearStateMetadata) -> torch.Tensor:
        """Each row's tokens through the causal convolution from its slot's conv state (zeros where it starts its
        sequence), every row at once; the conv state saved where a row saves a snapshot inside it (its K - 1 inputs
        before the cut) and the slots' conv states advanced: [num_tokens, conv_dim]. On CUDA with the kernels one
        launch that reads and writes the states in place (gpu/kernels/causal_conv_rows.py), else the torch code over
        gathered windows, the reference."""
        if self._uses_kernels(qkv):
            return self._convolved_rows_kernel(qkv, state)
        assert state.conv_windows is not None, "rows run row by row come with their conv windows"
        windows = state.conv_windows(self.spec.conv_kernel_size)
        initial = self.conv_state[state.slots] * state.keeps_state[:, None, None].to(self.conv_state.dtype)
        out, window = gated_delta_rule.conv_packed(qkv, initial, self.conv1d.weight[:, 0], windows.gather,
                                                   windows.outputs)
        if windows.saves is not None:
            columns, snapshots = windows.saves
            self.conv_state[snapshots] = window[columns].transpose(1, 2)
        self.conv_state[state.slots] = window[windows.finals].transpose(1, 2)
        return out

    def _convolved_rows_kernel(self, qkv: torch.Tensor, state: LinearStateMetadata) -> torch.Tensor:
        """`_convolved_rows` in one Triton launch over the rows' pieces (the sequential delta rule kernel's, built
        once a step and shared by the layers)."""
        from gpu.kernels.causal_conv_rows import causal_conv_rows

        assert state.sequential_rows is not None, "rows run row by row come with their sequential pieces"
        rows = state.sequential_rows()
        return causal_conv_rows(qkv, self.conv1d.weight[:, 0], self.conv_state,
                                (state.slots, state.keeps_state, rows.row_starts, rows.row_pieces, rows.piece_ends,
                                 rows.piece_states), state.max_row_tokens, use_pdl=True)

    def _rows(self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: LinearStateMetadata
              ) -> torch.Tensor:
        """The delta rule over each row's tokens from its slot's state, each piece's state saved where it ends at a
        snapshot: [num_tokens, value_heads, value_head_dim]. On CUDA, rows of at most the kernel config's
        `sequential_delta_rule_max_tokens` run token after token in one launch (gpu/kernels/gated_delta_rows.py): so
        few sequential tokens cost less than the host time of the chunked kernel's launches, once per level."""
        if self._uses_kernels(mixed) and state.max_row_tokens <= self.kernels.sequential_delta_rule_max_tokens:
            return self._sequential_rows(mixed, g, beta, state)
        return self._levels(mixed, g, beta, state)

    def _sequential_rows(self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: LinearStateMetadata
                         ) -> torch.Tensor:
        """Each row's tokens one after another in one kernel launch, the state stored after each of its pieces (a
        snapshot, then the slot): [num_tokens, value_heads, value_head_dim] float32."""
        from gpu.kernels.gated_delta_rows import gated_delta_rows

        assert state.sequential_rows is not None, "rows run row by row come with their sequential pieces"
        rows = state.sequential_rows()
        s = self.spec
        heads = (s.num_key_heads, s.num_value_heads, s.key_head_dim, s.value_head_dim)
        return gated_delta_rows(mixed.contiguous(), heads, g, beta.contiguous(), self.recurrent_state,
                                (state.slots, state.keeps_state, rows.row_starts, rows.row_pieces, rows.piece_ends,
                                 rows.piece_states))

    def _levels(self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: LinearStateMetadata
                ) -> torch.Tensor:
        """The delta rule over each row's tokens from its slot's state, one level of pieces at a time (the k-th
        pieces of the rows that have one start from the state their previous piece left; one level where no row
        saves a snapshot inside it), each piece's state saved where it ends at a snapshot: [num_tokens, value_heads,
        value_head_dim]; fla's chunked kernel over each level's pieces at once where it is installed (CUDA; its
        output in the activations' dtype), else piece by piece (float32)."""
        chunked_rule = fla_chunked_rule() if self._uses_kernels(mixed) else None
        states = self.recurrent_state[state.slots] * state.keeps_state[:, None, None, None]  # [rows, Hv, dk, dv]
        assert state.levels is not None, "rows run row by row come with their pieces' levels"
        out = None
        for level in state.levels():
            level_mixed, level_g, level_beta = (mixed, g, beta) if level.tokens is None else (
                mixed[level.tokens], g[level.tokens], beta[level.tokens])
            level_inputs = (*self._split_heads(level_mixed), level_g, level_beta)
            initial = states if level.rows is None else states[level.rows]
            if chunked_rule is not None:
                level_out, final = _fla_call(chunked_rule, level_inputs, initial, level)
            else:
                level_out, final = _torch_sequences(level_inputs, initial, level.cu_seqlens_cpu.tolist())
            if level.tokens is None:
                out = level_out
            else:
                if out is None:
                    out = level_out.new_empty((mixed.shape[0], *level_out.shape[1:]))
                out[level.tokens] = level_out
            if level.rows is None:
                states = final
            else:
                states[level.rows] = final
            if level.saves is not None:
                positions, snapshots = level.saves
                self.recurrent_state[snapshots] = final[positions]
        self.recurrent_state[state.slots] = states
        assert out is not None, "a step's rows have at least one level of pieces"
        return out


def _torch_sequences(inputs: tuple[torch.Tensor, ...], initial: torch.Tensor, bounds: list[int]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch delta rule over sequences packed one after another (sequence i: tokens [bounds[i], bounds[i + 1]))
    from their states `initial` [sequences, Hv, dk, dv]: (output [tokens, Hv, dv], each sequence's final state),
    float32."""
    outputs, finals = [], []
    for index, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        q, k, v, g, beta = (x[start:end] for x in inputs)
        if end - start == 1:
            out, final = gated_delta_rule.recurrent(q, k, v, g, beta, initial[index : index + 1])
            final = final[0]
        else:
            out, final = gated_delta_rule.chunked(q, k, v, g, beta, initial[index])
        outputs.append(out)
        finals.append(final)
    return torch.cat(outputs), torch.stack(finals)


def _fla_call(chunk_gated_delta_rule: Callable, inputs: tuple[torch.Tensor, ...], initial: torch.Tensor,
              level: PieceLevel) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's chunked rule over a level's pieces packed one after another: (output [tokens, Hv, dv], each piece's
    final state float32)."""
    q, k, v, g, beta = (x.unsqueeze(0) for x in inputs)
    out, final = chunk_gated_delta_rule(
        q, k, v, g, beta.to(q.dtype), initial_state=initial, output_final_state=True, use_qk_l2norm_in_kernel=True,
        cu_seqlens=level.cu_seqlens, cu_seqlens_cpu=level.cu_seqlens_cpu)
    return out[0], final.float()
