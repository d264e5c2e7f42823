"""What a pooling request (an embedding, a score) asks of the engine: its prompt pooled, nothing sampled.

How the prompt is pooled is the model's (core/pooling_model.py): the request adds only what differs per
prompt. Normalization, Matryoshka truncation and turning logits into scores happen in the front end,
on the pooled output.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolingParams:
    # An encoder's segment ids, one per prompt token (BERT's token_type_ids of a text pair); None: all 0.
    token_type_ids: tuple[int, ...] | None = None
