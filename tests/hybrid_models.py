"""Tiny random checkpoints of the Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5, Qwen3.5-MoE), built with transformers'
own classes (float32), with the tests' tiny tokenizer copied beside them. Each has linear layers before and after a
full-attention layer, more value heads than key heads (grouped), and weights drawn at a spread where every part
(the convolution, the decay, the gates) moves the tokens; norms that transformers starts at zero (a scale of 1 + w)
are drawn too."""

import importlib
import shutil
from pathlib import Path

import torch

COMMON = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=2048, initializer_range=0.2, rms_norm_eps=1e-6, tie_word_embeddings=False,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_conv_kernel_dim=4, num_hidden_layers=4,
              layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)

HYBRID_CONFIGS: dict[str, tuple[str, str, dict]] = {
    # A dense layer among sparse ones (mlp_only_layers), top 2 of 8 renormalized, a shared expert with its gate.
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   dict(COMMON, **MOE, intermediate_size=96, norm_topk_prob=True, mlp_only_layers=[2],
                        decoder_sparse_step=1)),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(COMMON, intermediate_size=96)),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", dict(COMMON, **MOE)),
}


def build_hybrid_model(directory: Path, name: str, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Writes the checkpoint `name` of HYBRID_CONFIGS into `directory` and returns it."""
    import transformers

    config_name, model_name, values = HYBRID_CONFIGS[name]
    eos = transformers.AutoTokenizer.from_pretrained(tokenizer_dir).convert_tokens_to_ids("<|im_end|>")
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**values, eos_token_id=eos))
    with torch.no_grad():
        for param_name, tensor in model.named_parameters():
            if param_name.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight", "model.norm.weight")):
                tensor.normal_(0.0, 0.2)
            elif param_name.endswith(("dt_bias", "linear_attn.norm.weight")):
                tensor.normal_(1.0, 0.2)
    model.save_pretrained(directory)
    for path in tokenizer_dir.glob("tokenizer*"):
        shutil.copy(path, directory / path.name)
    return directory


def with_slow_decays(model_dir: Path) -> Path:
    """The checkpoint's linear layers with slow decays (exp(A_log) in [0.01, 0.1]: the state keeps most of itself over
    tens of tokens), so a state carried, saved or restored wrong shows in the tokens; the random ones forget within a
    few tokens."""
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    generator = torch.Generator().manual_seed(0)
    for name, tensor in tensors.items():
        if name.endswith("A_log"):
            tensors[name] = (0.01 + 0.09 * torch.rand(tensor.shape, generator=generator)).log()
    save_file(tensors, path, metadata={"format": "pt"})
    return model_dir


def use_transformers_torch_delta_rule() -> None:
    """Points transformers' Gated DeltaNet layers back at their torch functions where, fla being installed, it picked
    fla's kernels when its modeling files were imported: the CPU reference runs on CPU tensors, which fla's Triton
    kernels cannot take (transformers keeps each torch function as its kernel wrapper's `__wrapped__`)."""
    for family in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        try:
            module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        except ImportError:
            continue
        for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                     "causal_conv1d_update"):
            function = getattr(module, name, None)
            if function is not None and hasattr(function, "__wrapped__"):
                setattr(module, name, function.__wrapped__)
