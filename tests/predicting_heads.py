"""Draft heads whose drafts get accepted, for tests that need accepted drafts from a random checkpoint.

The target's layers are damped (every output projection scaled by `leak`: each layer adds a little to the residual
stream), so its next token is nearly a function of the current one (a bigram map, through its final norm and LM head)
while attention and the MLPs still move the logits. A head is then set to the same map:
- GLM-4-MoE's MTP layer passes the normed embedding of token p + 1 through eh_proj and its (damped) block to the
  target's norm and LM head: it predicts the target's next token after p + 1, so most drafts are accepted.
- An EAGLE-3 head passes the target's residual stream entering its last read layer through fc and its (damped) layer
  to the target's norm and LM head over the whole vocabulary: it predicts the target's token after p again, which is
  accepted where the target repeats a token (a tied embedding makes the bigram map mostly the identity).
"""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

OUTPUT_PROJECTIONS = ("o_proj", "down_proj")


def damp_outputs(tensors: dict[str, torch.Tensor], leak: float, prefix: str = "", but: str | None = None) -> None:
    """Scales, in place, every output projection (attention's and the MLPs', experts' included) under `prefix`, but
    those under `but`."""
    for name, tensor in tensors.items():
        if (name.startswith(prefix) and not (but is not None and name.startswith(but))
                and any(part in name for part in OUTPUT_PROJECTIONS)):
            tensor.mul_(leak)


def lm_head_of(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])


def predicting_glm4_moe_mtp_layer(directory: Path, num_hidden_layers: int, leak: float, head_leak: float) -> None:
    """A checkpoint from tests/mtp_heads.py's add_glm4_moe_mtp_layer, damped by `leak`, its MTP layer set to the
    target's map, its own block and its share of the target's hidden state damped by `head_leak`."""
    path = directory / "model.safetensors"
    tensors = load_file(path)
    prefix = f"model.layers.{num_hidden_layers}."
    damp_outputs(tensors, leak, but=prefix)
    damp_outputs(tensors, head_leak, prefix)
    hidden_size = tensors["model.norm.weight"].shape[0]
    eh_proj = tensors[prefix + "eh_proj.weight"]  # [hidden, 2 * hidden]: the normed embedding's half, the hidden's
    tensors[prefix + "eh_proj.weight"] = torch.cat([torch.eye(hidden_size), head_leak * eh_proj[:, hidden_size:]],
                                                   dim=1)
    tensors[prefix + "enorm.weight"] = torch.ones(hidden_size)
    tensors[prefix + "shared_head.norm.weight"] = tensors["model.norm.weight"].clone()
    tensors[prefix + "shared_head.head.weight"] = lm_head_of(tensors).clone()
    save_file(tensors, path, metadata={"format": "pt"})


def predicting_eagle3_head(head_dir: Path, target_dir: Path, leak: float, head_leak: float, seed: int = 5) -> None:
    """A head from tests/mtp_heads.py's write_eagle3_head over the whole vocabulary (`draft_vocab_size` the target's),
    with `norm_before_residual` off; the target (untied, unit final norm) damped by `leak`, its LM head made a
    permutation's (module docstring) and the head's the permutation applied twice; the head's layer and its share of
    the other read layers damped by `head_leak`."""
    target_path = target_dir / "model.safetensors"
    target = load_file(target_path)
    damp_outputs(target, leak)
    embedding = target["model.embed_tokens.weight"]
    vocab_size, hidden_size = embedding.shape
    # Row y of an LM head that is embedding[before[y]] scores highest the y whose before[y] is the current token.
    before = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))
    target["lm_head.weight"] = embedding[before].clone()
    save_file(target, target_path, metadata={"format": "pt"})
    config = json.loads((head_dir / "config.json").read_text())
    assert not config["norm_before_residual"] and config["draft_vocab_size"] == vocab_size
    head_path = head_dir / "model.safetensors"
    head = load_file(head_path)
    damp_outputs(head, head_leak)
    fc = head["fc.weight"]  # [hidden, 3 * hidden]: the three read layers' inputs; the last one's passes
    head["fc.weight"] = torch.cat([head_leak * fc[:, : 2 * hidden_size], torch.eye(hidden_size)], dim=1)
    head["fc.bias"] = torch.zeros(hidden_size)
    head["norm.weight"] = target["model.norm.weight"].clone()
    head["lm_head.weight"] = embedding[before[before]].clone()
    save_file(head, head_path, metadata={"format": "pt"})
