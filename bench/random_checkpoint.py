"""Random-weight checkpoints of real model shapes, for speed measurements where no weights can be
downloaded. The Qwen3-0.6B shape is the one the published figures (nano-vllm, vLLM) use."""

from pathlib import Path

import torch

QWEN3_0P6B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=151645,
)


def build_random_qwen3_0p6b(directory: str | Path, tokenizer_from: str | Path | None = None) -> Path:
    """Writes a bf16 Qwen3-0.6B-shaped checkpoint with random weights (built on the GPU if present)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_0P6B)).to(torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)
    if tokenizer_from is not None:
        for path in Path(tokenizer_from).glob("tokenizer*"):
            (directory / path.name).write_bytes(path.read_bytes())
    return directory
