"""Tiny random checkpoints of the MoE families, built with transformers' own classes (float32), with the tests'
tiny tokenizer copied beside them. Routers and experts are drawn at the tiny models' spread (0.2), and every
bias and correction bias transformers would start at zero is drawn too, so that each one changes the output. The
correction biases of the group-limited routers are drawn wider (1.0): at 0.2 their sigmoid scores sit so close that
transformers' own bf16 model left its float32 top-5 on half the prompts, which no bf16 comparison could survive."""

import shutil
from pathlib import Path

import torch
import transformers

COMMON = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=2048, initializer_range=0.2, rms_norm_eps=1e-6, tie_word_embeddings=False)

MOE_CONFIGS: dict[str, tuple[str, dict]] = {
    # A dense layer between sparse ones (mlp_only_layers), 8 experts, top 2 renormalized.
    "qwen3_moe": ("Qwen3Moe", dict(COMMON, num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32,
                                   num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
                                   decoder_sparse_step=1)),
    # Top 3 of 8, not renormalized, sparse on every second layer.
    "qwen3_moe_unnormalized": ("Qwen3Moe", dict(COMMON, num_hidden_layers=2, intermediate_size=96,
                                                moe_intermediate_size=32, num_experts=8, num_experts_per_tok=3,
                                                norm_topk_prob=False, decoder_sparse_step=2)),
    "mixtral": ("Mixtral", dict(COMMON, num_hidden_layers=2, intermediate_size=48, num_local_experts=4,
                                num_experts_per_tok=2)),
    # A dense first layer, then 16 experts in 4 groups (the best 2 eligible), top 4 renormalized and scaled, two
    # shared experts; q/k/v biases (no o bias), q/k norms, half of each head rotated.
    "glm4_moe": ("Glm4Moe", dict(COMMON, num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32,
                                 n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                                 routed_scaling_factor=2.5, norm_topk_prob=True, n_shared_experts=2,
                                 first_k_dense_replace=1, num_nextn_predict_layers=1, attention_bias=True,
                                 use_qk_norm=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                   "partial_rotary_factor": 0.5})),
    # Sliding-window (16 tokens: the parity prompts run past it) and full layers with sinks, YaRN, 8 experts with
    # biases (top 2 of the router's biased logits softmaxed), the clamped SwiGLU with a limit the activations reach
    # where transformers reads the limit from the config (before 5.24 its experts clamp at 7.0 whatever it says).
    "gpt_oss": ("GptOss", dict(COMMON, num_hidden_layers=2, intermediate_size=32, num_local_experts=8,
                               num_experts_per_tok=2, sliding_window=16,
                               layer_types=["sliding_attention", "full_attention"],
                               swiglu_limit=2.0 if hasattr(transformers.GptOssConfig, "swiglu_limit") else 7.0,
                               rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0,
                                                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                "original_max_position_embeddings": 256})),
}


def build_moe_model(directory: Path, name: str, tokenizer_dir: Path, seed: int = 0, **overrides: object) -> Path:
    """Writes the checkpoint `name` of MOE_CONFIGS (with `overrides` of its config) into `directory`; returns it."""
    import transformers

    prefix, values = MOE_CONFIGS[name]
    values = {**values, **overrides}
    config_class = getattr(transformers, f"{prefix}Config")
    model_class = getattr(transformers, f"{prefix}ForCausalLM")
    eos = transformers.AutoTokenizer.from_pretrained(tokenizer_dir).convert_tokens_to_ids("<|im_end|>")
    torch.manual_seed(seed)
    model = model_class(config_class(**values, eos_token_id=eos))
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("e_score_correction_bias"):
                tensor.normal_(0.0, 1.0)
            elif name.endswith("bias"):
                tensor.normal_(0.0, 0.2)  # transformers starts these at zero, which would test nothing
    model.save_pretrained(directory)
    for path in tokenizer_dir.glob("tokenizer*"):
        shutil.copy(path, directory / path.name)
    return directory
