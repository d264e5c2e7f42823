"""The tiny random checkpoints the tests build (tests/conftest.py builds them once per session)."""

from core.tiny_model import TinyModelSpec

# The families' tiny checkpoints: windows of 16-24 tokens (the parity prompts run past them and past a KV block),
# each family's own config features switched on, norm weights off their initial values.
FAMILY_SPECS = {
    "mistral": TinyModelSpec(architecture="mistral", seed=3, tie_word_embeddings=False, perturbs_norms=True,
                             overrides=(("sliding_window", 24),)),
    "mistral_full": TinyModelSpec(architecture="mistral", seed=4, overrides=(("sliding_window", None),)),
    "phi3": TinyModelSpec(architecture="phi3", seed=5, tie_word_embeddings=False, perturbs_norms=True, overrides=(
        ("sliding_window", 20), ("partial_rotary_factor", 0.5), ("original_max_position_embeddings", 2048),
        ("rope_scaling", {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0],
                          "long_factor": [2.0, 3.0, 5.0, 8.0]}))),
    "gemma3": TinyModelSpec(architecture="gemma3", num_layers=3, seed=6, perturbs_norms=True, overrides=(
        ("sliding_window", 16), ("layer_types", ["sliding_attention", "full_attention", "sliding_attention"]),
        ("query_pre_attn_scalar", 24), ("rope_scaling", {"rope_type": "linear", "factor": 4.0}),
        ("final_logit_softcapping", 6.0))),
    "gemma3_vision": TinyModelSpec(architecture="gemma3_vision", seed=7, tie_word_embeddings=False,
                                   perturbs_norms=True, overrides=(
        ("sliding_window", 20), ("layer_types", ["sliding_attention", "full_attention"]))),
    "gemma4": TinyModelSpec(architecture="gemma4", num_layers=4, seed=8, perturbs_norms=True, overrides=(
        ("sliding_window", 16), ("layer_types", ["sliding_attention", "full_attention"] * 2),
        ("global_head_dim", 32), ("num_global_key_value_heads", 1), ("attention_k_eq_v", True),
        ("num_kv_shared_layers", 2), ("hidden_size_per_layer_input", 8), ("vocab_size_per_layer_input", 512),
        ("use_double_wide_mlp", True), ("final_logit_softcapping", 10.0))),
}

TINY_SPECS = {
    "qwen3": TinyModelSpec(architecture="qwen3", tie_word_embeddings=True),
    "llama": TinyModelSpec(architecture="llama", tie_word_embeddings=False, num_kv_heads=1, seed=1),
    "qwen2": TinyModelSpec(architecture="qwen2", tie_word_embeddings=True, num_kv_heads=4, seed=2),
    **FAMILY_SPECS,
}
