"""POST /v1/score (vLLM's) and POST /v1/rerank, /rerank, /v2/rerank (Jina's and Cohere's shape): a score
per text pair from a reranker (a cross-encoder, a yes/no reranker) or, by cosine similarity, from an
embedding model (openai_serve/scoring.py); request bodies in protocol/scores.py.

/v1/score answers `data`: one `{"index", "object": "score", "score"}` per pair, in the request's
order. /v1/rerank answers `results` by descending relevance, the `top_n` first: `{"index",
"relevance_score"}` and, with `return_documents`, `"document": {"text"}`; `usage` counts the prompt
tokens (Jina's `total_tokens` among them), `meta` is Cohere's.
"""

import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response

from openai_serve.cpu_work import items_size
from openai_serve.errors import bad_request
from openai_serve.http_io import read_json
from openai_serve.ignored_fields import name_ignored_fields
from openai_serve.pooling_run import Pooled, check_task, pool
from openai_serve.protocol.fields import UnknownFields
from openai_serve.protocol.scores import parse_rerank_request, parse_score_request
from openai_serve.routes.responding import client_gone, json_response
from openai_serve.scoring import plan_scores
from openai_serve.state import ServingState, serving_state

T = TypeVar("T")


async def _read(request: Request, parse: Callable[[object, UnknownFields], T], list_key: str
                ) -> tuple[ServingState, T]:
    """The request's body parsed (its longest list, `list_key`, read off the event loop when large)."""
    state = serving_state(request)
    raw = await read_json(request)
    unknown = UnknownFields(state.config.strict_request_fields)
    body = await state.cpu_work.run(items_size(raw, list_key), lambda: parse(raw, unknown))
    state.ignored_fields.note(body.ignored_fields)  # type: ignore[attr-defined]
    return state, body


async def create_score(request: Request) -> Response:
    state, body = await _read(request, parse_score_request, "text_2")
    response_id = f"score-{uuid.uuid4().hex}"
    scored = await _scores(request, state, body.model, list(body.pairs), body.truncate_prompt_tokens, response_id)
    if scored is None:
        return client_gone()
    scores, pooled = scored
    data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
    answer = {"id": response_id, "object": "list", "created": int(time.time()),
              "model": body.model or state.model_names[0], "data": data,
              "usage": {**pooled.usage(), "completion_tokens": 0}}
    return name_ignored_fields(json_response(answer), body.ignored_fields)


async def create_rerank(request: Request) -> Response:
    state, body = await _read(request, parse_rerank_request, "documents")
    response_id = f"rerank-{uuid.uuid4().hex}"
    pairs = [(body.query, document) for document in body.documents]
    scored = await _scores(request, state, body.model, pairs, body.truncate_prompt_tokens, response_id)
    if scored is None:
        return client_gone()
    scores, pooled = scored
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[: body.top_n]
    results = [{"index": i, "relevance_score": scores[i]} | (
        {"document": {"text": body.documents[i]}} if body.return_documents else {}) for i in ranked]
    answer = {"id": response_id, "model": body.model or state.model_names[0], "results": results,
              "usage": pooled.usage(), "meta": {"billed_units": {"search_units": 1}}}
    return name_ignored_fields(json_response(answer), body.ignored_fields)


async def _scores(request: Request, state: ServingState, model: str | None, pairs: list[tuple[str, str]],
                  truncate: int | None, response_id: str) -> tuple[list[float], Pooled] | None:
    state.check_model(model)
    check_task(state, "score", "scores")
    if len(pairs) > state.config.max_prompts_per_request:
        raise bad_request(f"{len(pairs)} pairs to score; at most {state.config.max_prompts_per_request} are allowed "
                          "per request (--max-prompts-per-request)", "documents")
    for first, second in pairs:
        if truncate is None:
            state.limits.check_text(len(first) + len(second), "documents")
    plan = await state.cpu_work.run(sum(len(a) + len(b) for a, b in pairs), lambda: plan_scores(state, pairs,
                                                                                                 truncate))
    pooled = await pool(request, state, plan.prompts, response_id, "documents")
    return None if pooled is None else (plan.scores_of(pooled), pooled)
