"""Decode-only steps on a CPU: each decoder layer as six calls of the C kernels, with what they read gathered once.

At batch 1 a decoder layer's torch code (the modules' calls, their checks, a tensor allocated per result) costs
about as much as its arithmetic on a CPU. What CUDA graphs are to a GPU's decode step, this is to a CPU's: the
packed weights' handles, the norms' weights, the KV caches and the rotary tables are read into plain per-layer
records once, and each row count gets its buffers once; a step then runs, per layer,
  RMSNorm + q/k/v -> RoPE + cache write -> attention -> o -> residual add + RMSNorm + gate/up -> act-and-mul + down
with the residual stream summed in place, and the step's embedding and final norm as torch code. A Gemma 3 layer
(gpu/models/gemma.py) runs the same six: its output norms (after the attention, after the MLP) are computed by the
next product's prologue before it adds the residual, its norms scale by 1 + w in float32, its MLP's activation is
GELU(tanh), and its sliding layers attend within their window, rotate with their own tables and read their KV-cache
group's block tables.

The math is the layers' own (the same kernels run there; tests compare the two paths). Built only where every
layer is a Llama-family decoder layer (gpu/models/llama.py) or a Gemma 3 one, whose four products are packed for the
integer dot products, whose attention (plain or windowed) has its C kernels, on one rank; `unavailable_reason` says
why not otherwise.
"""

from dataclasses import dataclass, replace
from types import ModuleType

import torch
from torch import nn

from gpu.attention.cpu_backend import is_windowed_at_most
from gpu.attention.metadata import AttentionMetadata
from gpu.cpu_kernels import ACTIVATION_DTYPES
from gpu.layers.int8_dot_linear import GATED_ACTIVATIONS, Int8DotProduct, norm_convention
from gpu.layers.linear import Linear
from gpu.layers.mlp import MLP
from gpu.layers.norm import RMSNorm
from gpu.models.causal_lm import DecoderStack
from gpu.models.gemma import GemmaDecoderLayer, GemmaModel
from gpu.models.llama import DecoderLayer, DecoderModel


@dataclass(frozen=True)
class LayerRecord:
    """A decoder layer's constant arguments: packed weights' handles and data pointers."""

    qkv: object
    o: object
    gate_up: object
    down: object
    biases: tuple[int | None, int | None, int | None, int | None]  # qkv, o, gate_up, down
    input_norm: int
    mlp_norm: int  # the MLP's input norm: Llama's post_attention_layernorm, Gemma's pre_feedforward_layernorm
    attention_out_norm: int | None  # Gemma's post_attention_layernorm: the attention's output, before the add
    mlp_out_norm: int | None  # Gemma's post_feedforward_layernorm: the MLP's output, before the next layer's add
    eps: float
    norm_convention: tuple[float, int]  # (weight offset, scales in float32): the layer's norms' (gpu/layers/norm.py)
    qk_norms: tuple[int | None, int | None]
    qk_eps: float
    qk_convention: tuple[float, int]
    rotary: tuple[int, int]  # its RoPE tables (cos, signed sin): Gemma's sliding and full layers have their own
    window: int  # its sliding window, 0 for none
    kv_group: int  # its KV-cache group, whose slots and block tables it uses
    activation: int  # the gated activation's code (gpu/layers/int8_dot_linear.py's GATED_ACTIVATIONS)
    k_cache: int
    v_cache: int


@dataclass(frozen=True)
class Buffers:
    """One row count's step buffers (the hidden states, q/k/v, queries, attention, o and gate/up outputs), reused
    by every layer and every step of that many rows."""

    tensors: tuple[torch.Tensor, ...]  # kept alive: the kernels write through the pointers below
    hidden: int
    qkv: int
    queries: int
    attention: int
    o: int
    gate_up: int

    @staticmethod
    def allocate(rows: int, sizes: tuple[int, int, int, int], dtype: torch.dtype) -> "Buffers":
        hidden_size, qkv_size, q_size, gate_up_size = sizes
        widths = (hidden_size, qkv_size, q_size, q_size, hidden_size, gate_up_size)
        tensors = tuple(torch.empty(rows, width, dtype=dtype) for width in widths)
        return Buffers(tensors, *(t.data_ptr() for t in tensors))


class CpuDecodeSteps:
    def __init__(self, model: DecoderStack, int8_dot: ModuleType, attention: ModuleType, dtype: torch.dtype) -> None:
        self.model = model
        self.int8_dot, self.attention = int8_dot, attention
        self.is_bf16 = int(dtype == torch.bfloat16)
        self.dtype = dtype
        self.layers = [_record(layer) for layer in model.layers]
        first = model.layers[0].self_attn
        self.heads = (first.num_heads, first.num_kv_heads, first.head_dim)
        self.scale, self.block_size = first.scale, first.k_cache.shape[1]
        last = model.layers[-1]  # Gemma's last MLP output is normed before the final norm adds it
        self.last_out_norm = _norm_places(last)[3]
        mlp = model.layers[0].mlp
        self.sizes = (model.norm.weight.shape[0], first.qkv_proj.out_features, first.q_size,
                      mlp.gate_up_proj.out_features)
        self._buffers: dict[int, Buffers] = {}

    def run_queries(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """[tokens, hidden_size]: `run` for a step whose rows have a few queries each (meta.query_rows: a verifying
        step's), one decode row a query. Causal as it is: each layer stores the step's K/V before any query attends,
        and a query's context ends at its own position."""
        one_each = torch.arange(input_ids.shape[0] + 1, dtype=torch.int32)

        def as_rows(group: AttentionMetadata) -> AttentionMetadata:
            queries = group.query_rows
            assert queries is not None, "a step laid out as decode rows, one a query"
            return replace(group, context_lens=queries.context_lens, block_tables=queries.block_tables,
                           query_start_loc=one_each, is_decode_only=True, query_rows=None, other_groups=())

        others = tuple(as_rows(group) for group in meta.other_groups)
        return self.run(input_ids, positions, replace(as_rows(meta), other_groups=others))

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """[rows, hidden_size]: the final norm's output of a decode-only step (one token per row)."""
        rows = input_ids.shape[0]
        b = self._buffers.get(rows) or self._buffers.setdefault(rows, Buffers.allocate(rows, self.sizes, self.dtype))
        residual = self.model.embed(input_ids)  # the residual stream, summed in place from here on
        stream = residual.data_ptr()
        k8, at, bf = self.int8_dot, self.attention, self.is_bf16
        heads, head_dim = self.heads[0], self.heads[2]
        hidden_size, qkv_size, q_size, gate_up_size = self.sizes
        groups = [meta] + list(meta.other_groups)  # each KV-cache group's slots and block tables
        tables = [(m.slot_mapping.data_ptr(), m.block_tables.data_ptr(), m.block_tables.stride(0),
                   m.context_lens.data_ptr(), m.query_start_loc.data_ptr()) for m in groups]
        position_ids = positions.data_ptr()
        previous_out_norm = None
        for i, layer in enumerate(self.layers):
            slots, block_tables, table_stride, context_lens, query_start = tables[layer.kv_group]
            # Layer 0's input is the stream itself, not yet summed with anything.
            x, added = (stream, None) if i == 0 else (b.hidden, stream)
            k8.linear_normed(layer.qkv, x, hidden_size, added, hidden_size, layer.input_norm, layer.eps, stream, rows,
                             layer.biases[0], b.qkv, bf, previous_out_norm, *layer.norm_convention)
            at.rope_store(b.qkv, qkv_size, rows, position_ids, *layer.rotary, *self.heads, *layer.qk_norms,
                          layer.qk_eps, layer.k_cache, layer.v_cache, slots, b.queries, bf, *layer.qk_convention)
            at.decode_attention(b.queries, layer.k_cache, layer.v_cache, b.attention, block_tables, table_stride,
                                context_lens, query_start, rows, self.block_size, *self.heads, self.scale, bf,
                                layer.window)
            k8.linear(layer.o, b.attention, heads * head_dim, rows, layer.biases[1], b.o, bf)
            k8.linear_normed(layer.gate_up, b.o, hidden_size, stream, hidden_size, layer.mlp_norm, layer.eps, stream,
                             rows, layer.biases[2], b.gate_up, bf, layer.attention_out_norm, *layer.norm_convention)
            k8.linear_gated(layer.down, b.gate_up, gate_up_size, rows, layer.biases[3], b.hidden, bf,
                            layer.activation)
            previous_out_norm = layer.mlp_out_norm
        out = b.tensors[0] if self.last_out_norm is None else self.last_out_norm(b.tensors[0])
        hidden, _ = self.model.norm.forward_with_residual(out, residual)
        return hidden


def unavailable_reason(model: nn.Module, int8_dot: ModuleType | None, attention: ModuleType | None,
                       dtype: torch.dtype) -> str | None:
    """Why decode steps cannot run as CpuDecodeSteps on this model, or None when they can."""
    if int8_dot is None or attention is None:
        return "its C kernels are not built, or a switch turned them off"
    if dtype not in ACTIVATION_DTYPES:
        return f"the kernels take float32 or bfloat16 (dtype {dtype})"
    decoder = getattr(model, "model", None)
    if type(decoder) not in (DecoderModel, GemmaModel) or decoder.embed_tokens.tp.size != 1:
        return "it runs Llama-family and Gemma 3 decoders on one rank only"
    for layer in decoder.layers:
        reason = _layer_unavailable_reason(layer, dtype)
        if reason is not None:
            return reason
    # A step passes the first layer's heads, scale and cache block size to every layer's kernels.
    if len({_attention_shape(layer.self_attn) for layer in decoder.layers}) > 1:
        return "its layers differ in heads, scale or cache blocks"
    return None


def _attention_shape(attn: nn.Module) -> tuple[object, ...]:
    return (attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.scale, attn.k_cache.shape[1:])


def _layer_unavailable_reason(layer: nn.Module, dtype: torch.dtype) -> str | None:
    if not (type(layer) in (DecoderLayer, GemmaDecoderLayer) and isinstance(layer.mlp, MLP)
            and layer.mlp.act.activation in GATED_ACTIVATIONS):
        return "it runs Llama-family and Gemma 3 decoder layers with a dense SiLU or GELU MLP only"
    attn = layer.self_attn
    if not is_windowed_at_most(attn.variant) or attn.o_proj.tp.size != 1 or not attn.runs_cpu_kernel(dtype):
        return "it runs plain or windowed attention (no sinks, soft-cap, partial rotation, shared KV) on one rank only"
    norms = _norms(layer)
    if len({(n.convention, n.eps) for n in norms}) > 1:
        return "its norms differ in convention or eps"
    products = (attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
    if not all(isinstance(p.packed, Int8DotProduct) for p in products):
        return "a projection is not packed for the int8 dot products (its weight lies on no GGUF grid)"
    if not _dtypes_agree(dtype, attn.k_cache, attn.rotary.cos, attn.rotary.signed_sin, *(n.weight for n in norms),
                         *(p.bias for p in products)):
        return "its caches, norms, rotary tables and biases are not all in the activations' dtype"
    return None


def _norm_places(layer: DecoderLayer | GemmaDecoderLayer
                 ) -> tuple[RMSNorm, RMSNorm | None, RMSNorm, RMSNorm | None]:
    """A layer's norms of the hidden states, in the order they run: its input's, its attention output's (Gemma's
    post_attention_layernorm, else None), its MLP input's (Llama's post_attention_layernorm) and its MLP output's."""
    if isinstance(layer, GemmaDecoderLayer):
        return (layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
                layer.post_feedforward_layernorm)
    return layer.input_layernorm, None, layer.post_attention_layernorm, None


def _norms(layer: DecoderLayer | GemmaDecoderLayer) -> list[RMSNorm]:
    return [norm for norm in _norm_places(layer) if norm is not None]


def _dtypes_agree(dtype: torch.dtype, *tensors: torch.Tensor | None) -> bool:
    return all(t is None or (t.dtype == dtype and t.is_contiguous()) for t in tensors)


def _record(layer: DecoderLayer | GemmaDecoderLayer) -> LayerRecord:
    attn, mlp = layer.self_attn, layer.mlp
    products: tuple[Linear, ...] = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    handles = [p.packed.handle for p in products]  # type: ignore[union-attr]
    qk_norms, qk_eps, (qk_offset, qk_in_float32) = attn.qk_norms()
    input_norm, attention_out_norm, mlp_norm, mlp_out_norm = (
        None if norm is None else norm.weight.data_ptr() for norm in _norm_places(layer))
    return LayerRecord(
        *handles, tuple(None if p.bias is None else p.bias.data_ptr() for p in products),  # type: ignore[arg-type]
        input_norm, mlp_norm, attention_out_norm, mlp_out_norm, layer.input_layernorm.eps,
        norm_convention(layer.input_layernorm),
        (None, None) if qk_norms is None else (qk_norms[0].data_ptr(), qk_norms[1].data_ptr()), qk_eps,
        (qk_offset, int(qk_in_float32)), (attn.rotary.cos.data_ptr(), attn.rotary.signed_sin.data_ptr()),
        attn.variant.sliding_window or 0, attn.kv_group, GATED_ACTIVATIONS[mlp.act.activation],
        attn.k_cache.data_ptr(), attn.v_cache.data_ptr())
