"""One HTTP request's pooled prompts in the engine (embeddings, scores): checked, submitted together,
collected whole, aborted together when the client leaves.

The request log and the metrics count them as the generation endpoints count their choices: each
prompt is an engine request that finishes ("stop") with no generated tokens, its time to the pooled
output as its time to first token.
"""

import time
from dataclasses import dataclass

import numpy as np
from starlette.requests import Request

from core import RequestOutput, RequestRejected
from core.pooling_params import PoolingParams
from openai_serve.engine_bridge import RequestHandle
from openai_serve.errors import APIError, bad_request, refused
from openai_serve.http_io import ClientDisconnected, until_disconnect
from openai_serve.request_log import RequestRecord, request_record
from openai_serve.state import ServingState


@dataclass(frozen=True)
class PooledPrompt:
    token_ids: list[int]
    token_type_ids: tuple[int, ...] | None = None  # an encoder's text pair


@dataclass(frozen=True)
class Pooled:
    """Every prompt's pooled output, in order, and the token counts for usage."""

    vectors: list[np.ndarray]
    num_prompt_tokens: int
    num_cached_tokens: int

    def usage(self) -> dict[str, int]:
        """OpenAI's embeddings usage: every token is a prompt token."""
        return {"prompt_tokens": self.num_prompt_tokens, "total_tokens": self.num_prompt_tokens}


def truncated(token_ids: list[int], truncate_prompt_tokens: int | None, max_model_len: int) -> list[int]:
    """vLLM's `truncate_prompt_tokens`: the last N tokens (-1: the model's limit); None: as they are."""
    if truncate_prompt_tokens is None:
        return token_ids
    keep = max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
    return token_ids[-keep:]


def check_task(state: ServingState, wanted: str, what: str) -> None:
    """A 400 unless the model serves this task (`embed`, or `score`: which an embedding model serves too)."""
    pooling = state.engine.pooling
    name = state.model_names[0]
    if pooling is None:
        raise bad_request(f"The model `{name}` generates text; it does not serve {what}. Serve an embedding or "
                          "reranker model (or start the server with --task embed or --task score).", "model",
                          code="model_not_supported")
    if wanted == "embed" and not pooling.embeds:
        raise bad_request(f"The model `{name}` is a {pooling.score_kind.replace('_', ' ')} scorer; it does not make "
                          f"{what}. Use /v1/score or /v1/rerank.", "model", code="model_not_supported")


async def pool(request: Request, state: ServingState, prompts: list[PooledPrompt], response_id: str,
               param: str) -> Pooled | None:
    """Every prompt's pooled output; None when the client left first (the prompts are aborted then).
    `param`: the client's name of the inputs, for errors about them."""
    limits = state.engine.limits
    try:
        for prompt in prompts:
            limits.check_pooled_prompt(prompt.token_ids, param)
    except RequestRejected as exc:
        raise refused(exc) from exc
    record = request_record(request) or RequestRecord("", request.method, request.url.path)
    record.response_id = response_id
    requests = [(f"{response_id}-{i}", p.token_ids, PoolingParams(p.token_type_ids)) for i, p in enumerate(prompts)]
    handle = state.bridge.submit(requests)
    finished: dict[str, tuple[float, RequestOutput]] = {}
    try:
        outputs = await until_disconnect(request, _collect(handle, finished))
    except ClientDisconnected:
        return None
    finally:
        handle.close()
        _report(state, record, prompts, finished)
    by_id = {o.request_id: o for o in outputs}
    ordered = [by_id[request_id] for request_id, _, _ in requests]
    return Pooled([o.pooled for o in ordered], sum(len(p.token_ids) for p in prompts),
                  sum(o.num_cached_prompt_tokens for o in ordered))


async def _collect(handle: RequestHandle, finished: dict[str, tuple[float, RequestOutput]]) -> list[RequestOutput]:
    """Every output, each request's last; `finished` notes when each came (for the log and metrics)."""
    outputs = []
    while len(outputs) < len(handle.request_ids):
        for output in await handle.next_outputs():
            if output.pooled is None:
                raise APIError(500, "The engine ended a pooling request without its output.",
                               error_type="server_error")
            finished[output.request_id] = (time.monotonic(), output)
            outputs.append(output)
    return outputs


def _report(state: ServingState, record: RequestRecord, prompts: list[PooledPrompt],
            finished: dict[str, tuple[float, RequestOutput]]) -> None:
    now = time.monotonic()
    record.prompt_tokens = sum(len(p.token_ids) for p in prompts)
    record.completion_tokens = 0
    record.cached_tokens = sum(o.num_cached_prompt_tokens for _, o in finished.values())
    record.first_token_time = min((t for t, _ in finished.values()), default=None)
    for index, prompt in enumerate(prompts):
        done = finished.get(f"{record.response_id}-{index}")
        reason = "stop" if done is not None else "abort"
        record.finish_reasons.append(reason)
        latency = (done[0] if done else now) - record.start
        state.metrics.observe_choice(reason, len(prompt.token_ids), 0, latency if done else None, latency)
