"""BERT-family encoders (BERT, RoBERTa, XLM-RoBERTa): bidirectional, post-LayerNorm, absolute positions.

For pooling only (embeddings and cross-encoder scores): a prompt runs whole in one step and keeps no
KV cache (gpu/layers/encoder_attention.py). Parameter names are the checkpoints' own: a bare encoder
(`BertModel`, what sentence-transformers saves) at the top level, a classifier's under `bert.` or
`roberta.`; tensors a checkpoint holds that the forward pass does not read are left out by
`checkpoint_name` (the loader's hook). RoBERTa's positions start after its padding id (fairseq's
convention).

Heads (`classify`): BERT's pooler (dense + tanh of the [CLS] state) then a linear classifier;
RoBERTa's classification head (dense, tanh, out_proj) on the <s> state. The pooling method of a
classifier is the first token's state, as transformers' heads take it.
"""

import torch
from torch import nn
from transformers import PretrainedConfig

from gpu.attention.metadata import AttentionMetadata
from gpu.layers.encoder_attention import PaddedLayout, encoder_attention

# Tensors that checkpoints hold and the forward pass does not read: buffers of older transformers, and a
# bare encoder's pooler, which embedding models do not use.
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def _unless_unused(name: str, unused: tuple[str, ...]) -> str | None:
    return None if any(part in name for part in unused) else name


class BertSelfAttention(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
        heads = (hidden.shape[0], self.num_heads, self.head_dim)
        q, k, v = (proj(hidden).view(heads) for proj in (self.query, self.key, self.value))
        return encoder_attention(q, k, v, layout, self.head_dim**-0.5)


class DenseLayerNorm(nn.Module):
    """dense, then LayerNorm of (it + the residual): BERT's `*Output` blocks."""

    def __init__(self, in_size: int, config: PretrainedConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(in_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = DenseLayerNorm(config.hidden_size, config)

    def forward(self, hidden: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
        return self.output(self.self(hidden, layout), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        # Imported here: transformers.activations imports its model-loading stack (torch.distributed's tensors,
        # accelerate), which every engine start would otherwise import for the encoder families alone.
        from transformers.activations import ACT2FN

        self.act = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = DenseLayerNorm(config.intermediate_size, config)

    def forward(self, hidden: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
        attended = self.attention(hidden, layout)
        return self.output(self.intermediate(attended), attended)


class BertEmbeddings(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        embedded = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(embedded + self.position_embeddings(positions))


class BertEncoder(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))


class BertModel(nn.Module):
    """A bare encoder (what sentence-transformers saves), for embeddings: the hidden state of every token.
    Its pooler, where the checkpoint has one, is used by BERT's classifier only."""

    is_encoder = True

    def __init__(self, config: PretrainedConfig, max_position: int = 0, *_: object, with_pooler: bool = False
                 ) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if with_pooler else None
        # RoBERTa numbers positions from its padding id + 1 (fairseq's make_positions).
        self.position_offset = config.pad_token_id + 1 if config.model_type in ("roberta", "xlm-roberta") else 0

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        layout = PaddedLayout.of(meta, input_ids.shape[0])
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.embeddings(input_ids, positions + self.position_offset, token_type_ids)
        for layer in self.encoder.layer:
            hidden = layer(hidden, layout)
        return hidden  # [num_tokens, hidden_size]

    def checkpoint_name(self, name: str) -> str | None:
        return _unless_unused(name, _BUFFERS + (() if self.pooler is not None else ("pooler.",)))


class BertPooler(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, first_token: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(first_token))


class BertForSequenceClassification(nn.Module):
    """A cross-encoder: [CLS] state -> pooler (dense, tanh) -> classifier (one logit per label). The encoder sits
    under the checkpoint's own prefix (`bert.`, `roberta.`)."""

    is_encoder = True
    encoder_name = "bert"

    def __init__(self, config: PretrainedConfig, max_position: int = 0, *_: object) -> None:
        super().__init__()
        self.config = config
        setattr(self, self.encoder_name, BertModel(config, with_pooler=self.encoder_name == "bert"))
        self.classifier = self._head(config)

    def _head(self, config: PretrainedConfig) -> nn.Module:
        return nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return getattr(self, self.encoder_name)(input_ids, positions, meta, token_type_ids)

    def classify(self, first_token: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.bert.pooler(first_token))

    def checkpoint_name(self, name: str) -> str | None:
        return _unless_unused(name, _BUFFERS)


class RobertaClassificationHead(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, first_token: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(first_token)))


class RobertaForSequenceClassification(BertForSequenceClassification):
    """A RoBERTa / XLM-RoBERTa cross-encoder (bge-reranker): <s> state -> dense, tanh -> out_proj (no pooler)."""

    encoder_name = "roberta"

    def _head(self, config: PretrainedConfig) -> nn.Module:
        return RobertaClassificationHead(config)

    def classify(self, first_token: torch.Tensor) -> torch.Tensor:
        return self.classifier(first_token)
