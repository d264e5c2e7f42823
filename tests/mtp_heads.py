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

import torch
from safetensors.torch import load_file, save_file

TEMPLATE_LAYER = 1  # a full-attention (and, in the MoE configs, sparse) layer: the head's layer has its shapes


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
        prefix = f"model.layers.{config.num_hidden_layers}." if self.is_glm else "mtp."
        head = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        layer_prefix = "" if self.is_glm else "layers.0."
        layer_names = [k for k in head if k.startswith(layer_prefix) and not k.startswith(
            ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens"))]
        layer = getattr(module, family + "DecoderLayer")(config, TEMPLATE_LAYER)
        layer.load_state_dict(fused_experts({k.removeprefix(layer_prefix): head[k] for k in layer_names}))
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
        rotary = model.rotary_emb(mixed[None], positions)
        causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = self.layer(mixed[None], position_embeddings=rotary, attention_mask=causal, position_ids=positions)
        out = (out[0] if isinstance(out, tuple) else out)[0]
        return out if self.is_glm else self.norms[2](out)
