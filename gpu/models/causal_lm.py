"""What every family's causal LM shares around its decoder: the LM head (tied to the embedding where the config
says), the logits (soft-capped by tanh where the config sets `final_logit_softcapping`, as Gemma's are), the list
of attention layers the runner gives caches and backends, and the checkpoint's names.

A family subclasses `CausalLM` with its decoder (`build_decoder`); the runner sees only this surface.
Under tensor parallelism the LM head is split by vocabulary and rank 0 gathers the logits (the others get None).
"""

import torch
from torch import nn
from transformers import PretrainedConfig

from gpu.attention.metadata import AttentionMetadata
from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.distributed import SINGLE, TensorParallel
from gpu.layers.attention import DecoderAttention
from gpu.layers.vocab_parallel import ParallelLMHead


class DecoderStack(nn.Module):
    """A family's decoder: `embed_tokens`, `layers` and the final `norm`. Each layer takes (positions, hidden,
    residual, meta) and returns (hidden, residual), the residual stream kept apart for the next norm to add.

    Where `aux_layers` is set (speculative decoding's EAGLE-3 head reads them, `keep_layer_inputs`), a forward also
    writes the residual stream entering each of those layers, concatenated in their order, into the first rows of
    `aux_hidden` [max tokens, n * hidden]: one buffer for every step, so a CUDA graph's replay writes where the
    eager forward does."""

    aux_layers: tuple[int, ...] = ()
    aux_hidden: torch.Tensor | None = None

    def keep_layer_inputs(self, layers: tuple[int, ...], max_tokens: int, hidden_size: int, dtype: torch.dtype,
                          device: torch.device) -> None:
        """Keep the inputs of `layers` from now on, for steps of up to `max_tokens` tokens."""
        self.aux_layers = layers
        self.aux_hidden = torch.zeros(max_tokens, len(layers) * hidden_size, dtype=dtype, device=device)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.embed(input_ids)
        residual = None
        if self.aux_layers:
            return self._forward_keeping_aux(hidden, positions, meta)
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, meta)
        hidden, _ = self.norm.forward_with_residual(hidden, residual)
        return hidden

    def _forward_keeping_aux(self, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
                             ) -> torch.Tensor:
        residual, kept = None, {}
        for index, layer in enumerate(self.layers):
            if index in self.aux_layers:
                kept[index] = hidden if residual is None else hidden + residual
            hidden, residual = layer(positions, hidden, residual, meta)
        assert self.aux_hidden is not None, "keep_layer_inputs sets the layers and their buffer"
        torch.cat([kept[index] for index in self.aux_layers], dim=-1, out=self.aux_hidden[: hidden.shape[0]])
        hidden, _ = self.norm.forward_with_residual(hidden, residual)
        return hidden


class CausalLM(nn.Module):
    # Checkpoint names of the tensors our merged layers stack: part -> (merged layer, shard).
    packed_modules = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
                      "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up")}
    soft_caps_logits = True  # by the config's final_logit_softcapping, where it sets one

    def __init__(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig = DEFAULT_KERNELS,
                 tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.config = config
        self.model = self.build_decoder(config, max_position, kernels, tp)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp, kernels)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight
        self.final_logit_softcapping: float | None = (getattr(config, "final_logit_softcapping", None)
                                                      if self.soft_caps_logits else None)

    def build_decoder(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig,
                      tp: TensorParallel) -> nn.Module:
        """The family's decoder: embed_tokens, layers (each with `self_attn`), the final norm."""
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)  # [num_tokens, hidden_size]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[num_rows, vocab_size] on tensor-parallel rank 0 (the sampling rank); None on the others."""
        logits = self.lm_head(hidden)
        return self._softcapped(logits) if logits is not None else None

    def compute_logits_into(self, hidden: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """compute_logits written into `out` [num_rows, vocab_size] (single GPU)."""
        return self._softcapped(self.lm_head.forward_into(hidden, out))

    def attention_layers(self) -> list[DecoderAttention]:
        return [layer.self_attn for layer in self.model.layers]

    def checkpoint_name(self, name: str) -> str | None:
        """The parameter a checkpoint tensor loads into (before `packed_modules`), or None to leave it out."""
        return name

    def _softcapped(self, logits: torch.Tensor) -> torch.Tensor:
        """c * tanh(logits / c) in place, in the logits' dtype, as transformers computes it."""
        cap = self.final_logit_softcapping
        return logits if cap is None else logits.div_(cap).tanh_().mul_(cap)
