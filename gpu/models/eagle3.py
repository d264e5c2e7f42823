"""EAGLE-3 draft heads as the speculators project publishes them (speculative decoding's method `eagle3`): a
directory whose config.json has `speculators_model_type` "eagle3", a Llama `transformer_layer_config`,
`draft_vocab_size`, `norm_before_residual` and maybe `target_hidden_size`, beside tensors `fc` (3 * target hidden ->
hidden, maybe with a bias), `layers.0.*`, `norm`, `lm_head` (over the draft vocabulary), `d2t` (draft token i is
target token i + d2t[i]) and maybe `embed_tokens` (else the target's embedding is read).

The head at position p reads the target's residual stream entering three of its layers at p (`aux_layers`, by
default 2, L / 2 and L - 3 as vLLM's) and token p + 1:

    h = fc([aux_0; aux_1; aux_2])                    (a later draft: the head's own previous output instead)
    x = [input_layernorm(embed(t[p + 1])); hidden_norm(h)]
    r = h (hidden_norm(h) where norm_before_residual) + o_proj(attention(x))   (q/k/v read 2 * hidden)
    out = r + mlp(post_attention_layernorm(r))       (fed back to the next draft)
    logits = lm_head(norm(out)), placed at the target ids d2t names (every other target id is -inf)
"""

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import PretrainedConfig

from gpu.attention.metadata import AttentionMetadata
from gpu.config import KernelConfig
from gpu.distributed import TensorParallel
from gpu.layers.attention import DecoderAttention
from gpu.layers.linear import Linear
from gpu.layers.norm import LLAMA_NORM, NormInput, RMSNorm
from gpu.layers.rotary import RotaryEmbedding
from gpu.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from gpu.loader import checkpoint_files
from gpu.models.causal_lm import CausalLM
from gpu.models.llama import attention_spec, dense_mlp

AUX_LAYERS_KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass(frozen=True)
class Eagle3Config:
    layer: PretrainedConfig  # the head's decoder layer (a Llama config)
    draft_vocab_size: int
    norm_before_residual: bool
    target_hidden_size: int | None
    aux_layers: tuple[int, ...] | None  # None: vLLM's default for the target


def read_eagle3_config(head_dir: str | Path) -> Eagle3Config:
    """The head's config.json, checked: an error names what is wrong."""
    path = Path(head_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"speculative_config.model {str(head_dir)!r}: no config.json of an EAGLE-3 head")
    values = json.loads(path.read_text())
    if values.get("speculators_model_type") != "eagle3" or "transformer_layer_config" not in values:
        raise ValueError(f"speculative_config.model {str(head_dir)!r}: not an EAGLE-3 head in the speculators format "
                         "(config.json needs speculators_model_type \"eagle3\" and transformer_layer_config)")
    # Imported here: importing it loads transformers' modeling stack, which only a start with a head needs.
    from transformers import LlamaConfig

    layer = dict(values["transformer_layer_config"])
    aux = values.get(AUX_LAYERS_KEY, layer.get(AUX_LAYERS_KEY))
    return Eagle3Config(LlamaConfig(**layer), int(values.get("draft_vocab_size", layer["vocab_size"])),
                        bool(values.get("norm_before_residual", False)), values.get("target_hidden_size"),
                        tuple(aux) if aux is not None else None)


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    return (2, num_layers // 2, num_layers - 3)


def _tensor_names(head_dir: Path) -> set[str]:
    names: set[str] = set()
    for path in checkpoint_files(head_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            names.update(f.keys())  # noqa: SIM118 - safe_open is not a mapping
    return names


class Eagle3Layer(nn.Module):
    def __init__(self, head: Eagle3Config, max_position: int, kernels: KernelConfig, tp: TensorParallel) -> None:
        super().__init__()
        config, hidden_size = head.layer, head.layer.hidden_size
        spec = replace(attention_spec(config, 0, has_qk_norm=False), input_size=2 * hidden_size, sliding_window=None)
        self.self_attn = DecoderAttention(spec, RotaryEmbedding(config, spec.head_dim, max_position), kernels, tp)
        self.mlp = dense_mlp(config, 0, kernels, tp)
        self.input_layernorm = RMSNorm(hidden_size, config.rms_norm_eps, kernels, LLAMA_NORM)
        self.hidden_norm = RMSNorm(hidden_size, config.rms_norm_eps, kernels, LLAMA_NORM)
        self.post_attention_layernorm = RMSNorm(hidden_size, config.rms_norm_eps, kernels, LLAMA_NORM)
        self.norm_before_residual = head.norm_before_residual

    def forward(self, positions: torch.Tensor, embedded: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata
                ) -> tuple[torch.Tensor, torch.Tensor]:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        attended = self.self_attn.forward_normed_input(
            positions, torch.cat([self.input_layernorm(embedded), normed], dim=-1), meta)
        return self.mlp(NormInput(self.post_attention_layernorm, attended, residual))


class Eagle3Head(nn.Module):
    """The head's modules, named as its checkpoint's tensors (`d2t` read apart: `load_draft_to_target`)."""

    packed_modules = CausalLM.packed_modules

    def __init__(self, head: Eagle3Config, head_dir: Path, target_hidden_size: int, target_vocab_size: int,
                 max_position: int, kernels: KernelConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.config = head.layer  # the loader reads its tie_word_embeddings
        self.head_dir = head_dir
        hidden_size = head.layer.hidden_size
        names = _tensor_names(head_dir)
        self.embed_tokens = (VocabParallelEmbedding(target_vocab_size, hidden_size, tp)
                             if "embed_tokens.weight" in names else None)
        self.fc = Linear(3 * (head.target_hidden_size or target_hidden_size), hidden_size,
                         bias="fc.bias" in names, kernels=kernels)
        self.layers = nn.ModuleList([Eagle3Layer(head, max_position, kernels, tp)])
        self.norm = RMSNorm(hidden_size, head.layer.rms_norm_eps, kernels, LLAMA_NORM)
        self.lm_head = ParallelLMHead(head.draft_vocab_size, hidden_size, tp, kernels)
        self.target_vocab_size = target_vocab_size
        self.draft_to_target = torch.empty(0, dtype=torch.int64)  # [draft vocab] target ids (load_draft_to_target)

    def checkpoint_name(self, name: str) -> str | None:
        """The vocabulary maps are read apart (`load_draft_to_target`); t2d is not needed."""
        return None if name in ("d2t", "t2d") else name

    def load_draft_to_target(self) -> None:
        for path in checkpoint_files(self.head_dir):
            with safe_open(str(path), framework="pt", device="cpu") as f:
                if "d2t" in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    d2t = f.get_tensor("d2t").to(torch.int64)
                    break
        else:
            d2t = torch.zeros(self.lm_head.vocab_size, dtype=torch.int64)  # the vocabularies are the same
        targets = torch.arange(d2t.shape[0]) + d2t
        if d2t.shape[0] != self.lm_head.vocab_size or targets.min() < 0 or targets.max() >= self.target_vocab_size:
            raise ValueError(f"speculative_config.model {str(self.head_dir)!r}: its d2t does not map its "
                             f"{self.lm_head.vocab_size} draft tokens into the target's {self.target_vocab_size}")
        self.draft_to_target = targets.to(self.lm_head.weight.device)


class Eagle3Drafter(nn.Module):
    """The runner's draft head for method eagle3: the head, and the target for its embedding where the head has
    none. The same surface as a model's own MTP head (`run_draft_head`, `draft_logits`)."""

    def __init__(self, head: Eagle3Head, target: nn.Module) -> None:
        super().__init__()
        self.head = head
        self._target = [target]  # not a submodule: its parameters are the target's

    def run_draft_head(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                       meta: AttentionMetadata) -> torch.Tensor:
        head = self.head
        embed = head.embed_tokens if head.embed_tokens is not None else self._target[0].model.embed_tokens
        if hidden.shape[-1] != head.norm.weight.shape[0]:  # the target's three layers, not a previous output
            hidden = head.fc(hidden)
        out, residual = head.layers[0](positions, embed(input_ids), hidden, meta)
        return out + residual

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        head = self.head
        draft = head.lm_head(head.norm(hidden))
        if draft is None:
            return None
        logits = draft.new_full((draft.shape[0], head.target_vocab_size), float("-inf"))
        logits[:, head.draft_to_target] = draft
        return logits
