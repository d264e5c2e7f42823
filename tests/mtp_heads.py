"""Random multi-token-prediction heads added to the tests' tiny checkpoints (transformers builds no MTP head, so the
tensors are written beside the model's, at the shapes its config implies), and the heads computed with transformers'
own layers as the reference of their drafts.

- Qwen3-Next / Qwen3.5 (`mtp.*`): two norms, `fc` (2 * hidden -> hidden), one full-attention decoder layer, a norm;
  the target's embedding and LM head.
- GLM-4-MoE (`model.layers.{num_hidden_layers}.*`, as DeepSeek V3): enorm, hnorm, eh_proj, a decoder layer (its MoE),
  shared_head.norm and shared_head.head; the target's embedding (the checkpoint's copy is left out).
"""

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

if TYPE_CHECKING:
    from core import LLM

TEMPLATE_LAYER = 1  # a full-attention (and, in the MoE configs, sparse) layer: the head's layer has its shapes


def assert_drafts_are_the_heads(drafted: list[tuple[list[int], list[int]]], model_dir: Path, samples: int
                                ) -> None:
    """About `samples` of the recorded drafts, evenly spread, each equal to the head's greedy prediction as
    transformers' parts compute it (ReferenceMtp)."""
    reference = ReferenceMtp(model_dir)
    for token_ids, drafts in drafted[:: max(1, len(drafted) // samples)]:
        assert reference.drafts(token_ids, len(drafts)) == drafts


def record_drafts(llm: "LLM") -> list[tuple[list[int], list[int]]]:
    """Every draft the engine proposes from now on, with the tokens it followed: (token ids, draft token ids)."""
    speculation = llm.engine.speculation
    assert speculation is not None
    drafted: list[tuple[list[int], list[int]]] = []
    fill = speculation.fill

    def recording_fill(scheduled: list) -> None:
        fill(scheduled)
        drafted.extend((list(s.seq.token_ids), list(s.seq.draft_token_ids)) for s in scheduled if s.seq.draft_token_ids)

    speculation.fill = recording_fill  # type: ignore[method-assign]
    return drafted

def _random_like_layer(tensors: dict[str, torch.Tensor], prefix: str, generator: torch.Generator
                       ) -> dict[str, torch.Tensor]:
    """Layer TEMPLATE_LAYER's tensors under `prefix`, drawn again at their own spread."""
    template = f"model.layers.{TEMPLATE_LAYER}."
    drawn = {}
    for name, tensor in tensors.items():
        if name.startswith(template):
            spread = tensor.std() if tensor.numel() > 1 else torch.tensor(0.2)
            drawn[prefix + name.removeprefix(template)] = torch.randn(tensor.shape, generator=generator) * spread
    return drawn


def add_qwen3_next_mtp_head(directory: Path, seed: int = 1) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(path)
    generator = torch.Generator().manual_seed(seed)
    hidden_size = tensors["model.norm.weight"].shape[0]
    head = {"mtp.fc.weight": torch.randn(hidden_size, 2 * hidden_size, generator=generator) * 0.1}
    for name in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"):
        head[name] = torch.randn(hidden_size, generator=generator) * 0.2
    head |= _random_like_layer(tensors, "mtp.layers.0.", generator)
    save_file({**tensors, **head}, path, metadata={"format": "pt"})


def add_glm4_moe_mtp_layer(directory: Path, num_hidden_layers: int, seed: int = 1) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(path)
    generator = torch.Generator().manual_seed(seed)
    prefix = f"model.layers.{num_hidden_layers}."
    vocab_size, hidden_size = tensors["model.embed_tokens.weight"].shape
    head = {prefix + "eh_proj.weight": torch.randn(hidden_size, 2 * hidden_size, generator=generator) * 0.1,
            prefix + "shared_head.head.weight": torch.randn(vocab_size, hidden_size, generator=generator) * 0.2,
            prefix + "embed_tokens.weight": tensors["model.embed_tokens.weight"].clone()}
    for name in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
        head[prefix + name] = 1.0 + torch.randn(hidden_size, generator=generator) * 0.2
    head |= _random_like_layer(tensors, prefix, generator)
    save_file({**tensors, **head}, path, metadata={"format": "pt"})


def fused_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert checkpoint tensors (`mlp.experts.{e}.gate_proj.weight`, ...) as transformers' fused expert
    parameters ([experts, 2 * intermediate, hidden] gate then up; [experts, hidden, intermediate] down)."""
    experts = sorted({int(k.split(".")[2]) for k in tensors if k.startswith("mlp.experts.") and k.count(".") > 3})
    if not experts:
        return tensors
    fused = {k: v for k, v in tensors.items() if not k.startswith("mlp.experts.")}

    def part(expert: int, name: str) -> torch.Tensor:
        return tensors[f"mlp.experts.{expert}.{name}.weight"]

    fused["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([part(e, "gate_proj"), part(e, "up_proj")])
                                                     for e in experts])
    fused["mlp.experts.down_proj"] = torch.stack([part(e, "down_proj") for e in experts])
    return fused


class ReferenceMtp:
    """A family's MTP head computed with transformers' classes: the target model for its last hidden states (after
    its final norm), a decoder layer of the family with the head's weights, the family's norms; each draft after the
    first runs the head on its own previous output."""

    def __init__(self, model_dir: Path) -> None:
        import transformers

        self.target = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        config = self.target.config
        module = importlib.import_module(type(self.target).__module__)
        family = type(self.target).__name__.removesuffix("ForCausalLM")
        tensors = load_file(model_dir / "model.safetensors")
        self.is_glm = family == "Glm4Moe"
        self.has_position_grids = family.startswith("Qwen3_5")
        prefix = f"model.layers.{config.num_hidden_layers}." if self.is_glm else "mtp."
        head = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        layer_prefix = "" if self.is_glm else "layers.0."
        layer_names = [k for k in head if k.startswith(layer_prefix) and not k.startswith(
            ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens"))]
        layer = getattr(module, family + "DecoderLayer")(config, TEMPLATE_LAYER)
        tensors_of_layer = {k.removeprefix(layer_prefix): head[k] for k in layer_names}
        if "mlp.experts.gate_up_proj" in layer.state_dict():  # transformers' fused experts (not in every version)
            tensors_of_layer = fused_experts(tensors_of_layer)
        layer.load_state_dict(tensors_of_layer)
        self.layer = layer.eval()
        norm_names = ("enorm", "hnorm", "shared_head.norm") if self.is_glm else (
            "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")
        self.norms = []
        for name in norm_names:
            norm = getattr(module, family + "RMSNorm")(config.hidden_size, eps=config.rms_norm_eps)
            norm.weight.data.copy_(head[name + ".weight"])
            self.norms.append(norm)
        self.fc = head["eh_proj.weight" if self.is_glm else "fc.weight"]
        self.lm_head = head["shared_head.head.weight"] if self.is_glm else self.target.lm_head.weight

    @torch.no_grad()
    def drafts(self, token_ids: list[int], num_drafts: int) -> list[int]:
        """The head's greedy drafts after `token_ids`, whose last the target has not computed yet."""
        hidden = self.target.model(torch.tensor([token_ids[:-1]])).last_hidden_state[0]  # positions 0 .. n - 2
        next_tokens = list(token_ids[1:])
        drafts: list[int] = []
        for _ in range(num_drafts):
            out = self._head(torch.tensor(next_tokens), hidden)
            logits = (self.norms[2](out[-1]) if self.is_glm else out[-1]) @ self.lm_head.T
            drafts.append(int(logits.argmax()))
            next_tokens.append(drafts[-1])
            hidden = torch.cat([hidden, out[-1:]])  # the head's own output in place of the target's
        return drafts

    def _head(self, next_tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        model = self.target.model
        n = next_tokens.shape[0]
        embedded = model.embed_tokens(next_tokens)
        if self.is_glm:
            embedded[0] = 0.0  # position 0 has no token before it
        mixed = torch.cat([self.norms[0](embedded), self.norms[1](hidden)], dim=-1) @ self.fc.T
        positions = torch.arange(n)[None]
        # Qwen3.5's rotary takes a position per grid axis; transformers before 5.18 does not broadcast them itself.
        axis_positions = positions.expand(3, 1, n) if self.has_position_grids else positions
        rotary = model.rotary_emb(mixed[None], axis_positions)
        causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = self.layer(mixed[None], position_embeddings=rotary, attention_mask=causal, position_ids=positions)
        out = (out[0] if isinstance(out, tuple) else out)[0]
        return out if self.is_glm else self.norms[2](out)


# EAGLE-3 heads in the speculators format (a directory of their own: config.json and model.safetensors).

EAGLE3_AUX_LAYERS = (0, 2, 3)  # the target's layer 0 (no residual stream yet) among them


def write_eagle3_head(directory: Path, target_dir: Path, draft_vocab_size: int = 256, seed: int = 3,
                      norm_before_residual: bool = True) -> Path:
    """A random EAGLE-3 head for the tiny Llama-family target in `target_dir`, reading its layers EAGLE3_AUX_LAYERS:
    its draft vocabulary a random subset of the target's (d2t), fc with a bias, no embedding of its own."""
    import json

    target = json.loads((target_dir / "config.json").read_text())
    hidden, vocab = target["hidden_size"], target["vocab_size"]
    layer = dict(model_type="llama", hidden_size=hidden, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=96, rms_norm_eps=1e-6, vocab_size=vocab, max_position_embeddings=2048,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
              "transformer_layer_config": layer, "draft_vocab_size": draft_vocab_size,
              "norm_before_residual": norm_before_residual, "eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYERS)}
    generator = torch.Generator().manual_seed(seed)

    def drawn(*shape: int, spread: float = 0.2) -> torch.Tensor:
        return torch.randn(shape, generator=generator) * spread

    targets = torch.randperm(vocab, generator=generator)[:draft_vocab_size].sort().values
    tensors = {"fc.weight": drawn(hidden, 3 * hidden, spread=0.1), "fc.bias": drawn(hidden),
               "layers.0.self_attn.q_proj.weight": drawn(64, 2 * hidden),
               "layers.0.self_attn.k_proj.weight": drawn(32, 2 * hidden),
               "layers.0.self_attn.v_proj.weight": drawn(32, 2 * hidden),
               "layers.0.self_attn.o_proj.weight": drawn(hidden, 64),
               "layers.0.mlp.gate_proj.weight": drawn(96, hidden), "layers.0.mlp.up_proj.weight": drawn(96, hidden),
               "layers.0.mlp.down_proj.weight": drawn(hidden, 96),
               "lm_head.weight": drawn(draft_vocab_size, hidden),
               "d2t": targets - torch.arange(draft_vocab_size),
               "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, targets, True)}
    for name in ("layers.0.input_layernorm", "layers.0.hidden_norm", "layers.0.post_attention_layernorm", "norm"):
        tensors[name + ".weight"] = 1.0 + drawn(hidden)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


class ReferenceEagle3:
    """An EAGLE-3 head computed with transformers' Llama parts as the speculators project defines the head: the
    target's hidden states entering the chosen layers (transformers' output_hidden_states), fc, the layer over
    [input_layernorm(embedding); hidden_norm(h)], the norm, the draft LM head and d2t."""

    def __init__(self, target_dir: Path, head_dir: Path) -> None:
        import json

        import transformers
        from transformers.models.llama import modeling_llama

        self.target = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        config = json.loads((head_dir / "config.json").read_text())
        self.layer_config = transformers.LlamaConfig(**config["transformer_layer_config"])
        self.norm_before_residual = config["norm_before_residual"]
        self.aux_layers = config["eagle_aux_hidden_state_layer_ids"]
        self.w = load_file(head_dir / "model.safetensors")
        self.rotary = modeling_llama.LlamaRotaryEmbedding(self.layer_config)
        self.apply_rotary = modeling_llama.apply_rotary_pos_emb
        self.mlp = modeling_llama.LlamaMLP(self.layer_config)
        self.mlp.load_state_dict({k.removeprefix("layers.0.mlp."): v for k, v in self.w.items()
                                  if k.startswith("layers.0.mlp.")})
        self.norm_class = modeling_llama.LlamaRMSNorm

    def _norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        norm = self.norm_class(x.shape[-1], eps=self.layer_config.rms_norm_eps)
        norm.weight.data.copy_(self.w[name + ".weight"])
        return norm(x)

    @torch.no_grad()
    def drafts(self, token_ids: list[int], num_drafts: int) -> list[int]:
        states = self.target.model(torch.tensor([token_ids[:-1]]), output_hidden_states=True).hidden_states
        aux = torch.cat([states[i][0] for i in self.aux_layers], dim=-1)
        hidden = aux @ self.w["fc.weight"].T + self.w["fc.bias"]
        next_tokens = list(token_ids[1:])
        drafts: list[int] = []
        for _ in range(num_drafts):
            out = self._head(torch.tensor(next_tokens), hidden)
            draft = int((self._norm("norm", out[-1]) @ self.w["lm_head.weight"].T).argmax())
            drafts.append(draft + int(self.w["d2t"][draft]))
            next_tokens.append(drafts[-1])
            hidden = torch.cat([hidden, out[-1:]])  # the head's own output in place of the target's
        return drafts

    def _head(self, next_tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        w, n = self.w, next_tokens.shape[0]
        normed = self._norm("layers.0.hidden_norm", hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self._norm("layers.0.input_layernorm", self.target.model.embed_tokens(next_tokens)), normed], -1)
        q = (x @ w["layers.0.self_attn.q_proj.weight"].T).view(n, 4, 16).transpose(0, 1)[None]
        k = (x @ w["layers.0.self_attn.k_proj.weight"].T).view(n, 2, 16).transpose(0, 1)[None]
        v = (x @ w["layers.0.self_attn.v_proj.weight"].T).view(n, 2, 16).transpose(0, 1)[None]
        cos, sin = self.rotary(x[None], torch.arange(n)[None])
        q, k = self.apply_rotary(q, k, cos, sin)
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        scores = (q @ k.transpose(-1, -2)) / 16**0.5 + torch.full((n, n), float("-inf")).triu(1)
        attended = (scores.softmax(-1) @ v)[0].transpose(0, 1).reshape(n, 64) @ w["layers.0.self_attn.o_proj.weight"].T
        stream = residual + attended
        return stream + self.mlp(self._norm("layers.0.post_attention_layernorm", stream))
