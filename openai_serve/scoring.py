"""Text pairs (a query and a document) into pooled prompts, and their pooled outputs into scores, as each
kind of score model reads a pair (core/pooling_model.py's ScoreKind):
- a cross-encoder reads the pair as its tokenizer joins two texts ([CLS] a [SEP] b [SEP], with BERT's
  segment ids), as sentence-transformers' CrossEncoder does;
- a yes/no reranker (Qwen3-Reranker) reads its model card's prompt: a system line asking for "yes" or
  "no", the instruction, query and document, then an empty thinking block, each part tokenized alone;
- an embedding model embeds each distinct text once (a query with its sentence-transformers prompt
  `query`, a document with `document`, where the model has them) and scores by cosine similarity.
"""

from collections.abc import Callable
from dataclasses import dataclass

from core.pooling_model import PoolingModel, ScoreKind
from core.pooling_output import cosine, embedding, score
from openai_serve.pooling_run import Pooled, PooledPrompt, truncated
from openai_serve.state import ServingState

YES_NO_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
                 'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
YES_NO_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@dataclass(frozen=True)
class ScoringPlan:
    """The prompts to pool for some pairs, and how their outputs become one score per pair."""

    prompts: list[PooledPrompt]
    scores_of: Callable[[Pooled], list[float]]


def plan_scores(state: ServingState, pairs: list[tuple[str, str]], truncate: int | None) -> ScoringPlan:
    model = state.engine.pooling
    assert model is not None, "the route checked that the model pools"
    limit = state.engine.max_model_len
    if model.score_kind is ScoreKind.COSINE:
        return _cosine_plan(state, model, pairs, truncate)
    if model.score_kind is ScoreKind.YES_NO:
        prompts = [PooledPrompt(truncated(_yes_no_ids(state, q, d), truncate, limit)) for q, d in pairs]
    else:
        prompts = [_pair_prompt(state, model, q, d, truncate) for q, d in pairs]
    return ScoringPlan(prompts, lambda pooled: [score(v, model) for v in pooled.vectors])


def _pair_prompt(state: ServingState, model: PoolingModel, query: str, document: str, truncate: int | None
                 ) -> PooledPrompt:
    encoded = state.tokenizer(query, document, return_token_type_ids=model.uses_token_types)
    token_ids = truncated(list(encoded["input_ids"]), truncate, state.engine.max_model_len)
    if not model.uses_token_types:
        return PooledPrompt(token_ids)
    types = truncated(list(encoded["token_type_ids"]), truncate, state.engine.max_model_len)
    return PooledPrompt(token_ids, tuple(types))


def _yes_no_ids(state: ServingState, query: str, document: str) -> list[int]:
    encode = state.tokenizer.encode
    body = f"<Instruct>: {DEFAULT_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
    return [*encode(YES_NO_PREFIX, add_special_tokens=False), *encode(body, add_special_tokens=False),
            *encode(YES_NO_SUFFIX, add_special_tokens=False)]


def _cosine_plan(state: ServingState, model: PoolingModel, pairs: list[tuple[str, str]], truncate: int | None
                 ) -> ScoringPlan:
    prompts_by_role = model.prompt_texts
    texts = list(dict.fromkeys([prompts_by_role.get("query", "") + q for q, _ in pairs] +
                               [prompts_by_role.get("document", "") + d for _, d in pairs]))
    index = {text: i for i, text in enumerate(texts)}
    limit = state.engine.max_model_len
    prompts = [PooledPrompt(truncated(state.tokenizer.encode(t), truncate, limit)) for t in texts]

    def scores_of(pooled: Pooled) -> list[float]:
        vectors = [embedding(v, model) for v in pooled.vectors]
        return [cosine(vectors[index[prompts_by_role.get("query", "") + q]],
                       vectors[index[prompts_by_role.get("document", "") + d]]) for q, d in pairs]

    return ScoringPlan(prompts, scores_of)
