"""ModernBERT: a pre-LayerNorm encoder with rotary positions, a GeGLU MLP and alternating attention: most
layers see only keys within half the local window on either side (`local_attention` // 2), every
`global_attn_every_n_layers`-th layer (from the first) sees the whole prompt. Each kind of layer has its
own RoPE base (`layer_types` and `rope_parameters`, as transformers' config spells them).

For pooling only, like gpu/models/bert.py: a prompt runs whole in one step, no KV cache. The classifier
(`ModernBertForSequenceClassification`) pools as its config says (`classifier_pooling`: cls or mean),
then runs its head (dense, activation, LayerNorm) and a linear classifier.
"""

from types import SimpleNamespace

import torch
from torch import nn
from transformers import PretrainedConfig

from gpu.attention.metadata import AttentionMetadata
from gpu.layers.encoder_attention import PaddedLayout, encoder_attention
from gpu.layers.rotary import RotaryEmbedding

SLIDING = "sliding_attention"


def _layer_norm(config: PretrainedConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernBertAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, rotary: RotaryEmbedding, is_local: bool) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.rotary = rotary
        self.is_local = is_local

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, layout: PaddedLayout,
                window: torch.Tensor | None) -> torch.Tensor:
        qkv = self.Wqkv(hidden).view(hidden.shape[0], 3, self.num_heads, self.head_dim)
        q, k = self.rotary(positions, qkv[:, 0], qkv[:, 1])
        out = encoder_attention(q, k, qkv[:, 2], layout, self.head_dim**-0.5, window if self.is_local else None)
        return self.Wo(out)


class ModernBertMLP(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act = _activation(config.hidden_activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.act(value) * gate)


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, rotary: RotaryEmbedding, index: int) -> None:
        super().__init__()
        self.attn_norm = nn.Identity() if index == 0 else _layer_norm(config)
        self.attn = ModernBertAttention(config, rotary, config.layer_types[index] == SLIDING)
        self.mlp_norm = _layer_norm(config)
        self.mlp = ModernBertMLP(config)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, layout: PaddedLayout,
                window: torch.Tensor | None) -> torch.Tensor:
        hidden = hidden + self.attn(self.attn_norm(hidden), positions, layout, window)
        return hidden + self.mlp(self.mlp_norm(hidden))


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = _layer_norm(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))


def _rotary(config: PretrainedConfig, layer_type: str, max_position: int) -> RotaryEmbedding:
    params = dict(config.rope_parameters[layer_type])
    head_dim = config.hidden_size // config.num_attention_heads
    return RotaryEmbedding(SimpleNamespace(rope_parameters=params), head_dim, max_position)  # type: ignore[arg-type]


class ModernBertModel(nn.Module):
    is_encoder = True

    def __init__(self, config: PretrainedConfig, max_position: int = 0, *_: object) -> None:
        super().__init__()
        self.config = config
        max_position = max(max_position, config.max_position_embeddings)
        rotaries = {kind: _rotary(config, kind, max_position) for kind in set(config.layer_types)}
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, rotaries[config.layer_types[i]], i)
                                    for i in range(config.num_hidden_layers))
        self.final_norm = _layer_norm(config)
        self.half_window = config.local_attention // 2

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        layout = PaddedLayout.of(meta, input_ids.shape[0])
        window = layout.window_mask(self.half_window) if SLIDING in self.config.layer_types else None
        hidden = self.embeddings(input_ids)
        for layer in self.layers:
            hidden = layer(hidden, positions, layout, window)
        return self.final_norm(hidden)  # [num_tokens, hidden_size]


class ModernBertPredictionHead(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = _activation(config.classifier_activation)
        self.norm = _layer_norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class ModernBertForSequenceClassification(nn.Module):
    is_encoder = True

    def __init__(self, config: PretrainedConfig, max_position: int = 0, *_: object) -> None:
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config, max_position)
        self.head = ModernBertPredictionHead(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, meta)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.head(pooled))


def _activation(name: str) -> nn.Module:
    # Imported here: transformers.activations imports its model-loading stack (torch.distributed's tensors,
    # accelerate), which every engine start would otherwise import for the encoder families alone.
    from transformers.activations import ACT2FN

    return ACT2FN[name]
