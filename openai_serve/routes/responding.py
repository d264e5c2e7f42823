"""What the generation endpoints share: their choices started in the engine, then answered in full or streamed."""

import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response

from core.sampling_params import SamplingParams
from openai_serve.cpu_work import items_size
from openai_serve.errors import bad_request
from openai_serve.generation import CollectedChoice, Generation, GenerationBody, Usage, choice_specs, collect
from openai_serve.http_io import ClientDisconnected, read_json, until_disconnect
from openai_serve.protocol.common import CommonRequest
from openai_serve.protocol.fields import UnknownFields
from openai_serve.request_log import RequestRecord, request_record
from openai_serve.sse import Batch, event_stream
from openai_serve.state import ServingState, serving_state

# nginx's "client closed request": never seen by the client, but it shows in access logs.
_CLIENT_CLOSED_REQUEST = 499


class ParsedBody(Protocol):
    common: CommonRequest
    ignored_fields: tuple[str, ...]  # unknown fields the request sent


Body = TypeVar("Body", bound=ParsedBody)


async def read_body(request: Request, prompt_key: str,
                    parse: Callable[[object, UnknownFields, SamplingParams], Body]) -> Body:
    """The request's JSON body read by `parse` (off the event loop when large), with the model's sampling defaults
    for the fields it leaves out, after the limits that can be checked before reading it; its model checked, and
    its unknown fields logged."""
    state = serving_state(request)
    raw = await read_json(request)
    state.limits.check_body(raw, prompt_key)
    unknown = UnknownFields(state.config.strict_request_fields)
    body = await state.cpu_work.run(items_size(raw, prompt_key), lambda: parse(raw, unknown, state.sampling_defaults))
    state.check_model(body.common.model)
    state.ignored_fields.note(body.ignored_fields)
    return body


class ResponseView(Protocol):
    response_id: str

    def stream(self, generation: Generation) -> AsyncIterator[Batch]:
        """The stream's events: one batch (list) for each time the generation hands out deltas."""
        ...

    def response(self, choices: dict[int, CollectedChoice], usage: Usage) -> dict[str, object]: ...


async def respond(
    request: Request,
    state: ServingState,
    body: GenerationBody,
    view: ResponseView,
    prompts: list[list[int]],
) -> Response:
    """Starts every choice of every prompt in the engine, then streams them or answers in full."""
    generation = start_generation(request, state, body, view.response_id, prompts)
    if body.common.stream.stream:
        return event_stream(view.stream(generation), generation.close)
    result = await collect_or_abort(request, generation)
    return client_gone() if result is None else json_response(view.response(*result))


def start_generation(
    request: Request, state: ServingState, body: GenerationBody, response_id: str, prompts: list[list[int]]
) -> Generation:
    """Every choice of every prompt, checked against the engine's limits and submitted (all or none).
    When it ends, the request's log line and the metrics learn how it went."""
    if (pooling := state.engine.pooling) is not None:
        what = "an embedding model" if pooling.embeds else "a reranker"
        raise bad_request(f"The model `{state.model_names[0]}` is {what}: it does not generate text. Use "
                          f"{'/v1/embeddings' if pooling.embeds else '/v1/score or /v1/rerank'}.", "model",
                          code="model_not_supported")
    specs = choice_specs(response_id, prompts, body, state.engine.limits, state.sampling_defaults)
    record = request_record(request) or RequestRecord("", request.method, request.url.path)
    record.response_id = response_id
    generation = Generation(specs, state.token_decoder, _report(state, record))
    generation.start(state.bridge)
    return generation


def _report(state: ServingState, record: RequestRecord) -> Callable[[Generation], None]:
    """What a generation tells the request log and the metrics when it ends."""

    def report(generation: Generation) -> None:
        now = time.monotonic()
        usage = generation.usage()
        record.prompt_tokens, record.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        record.cached_tokens = usage.cached_tokens
        first_token_times = [d.first_token_time for d in generation.decoders if d.first_token_time is not None]
        record.first_token_time = min(first_token_times, default=None)
        for decoder in generation.decoders:
            reason = decoder.tracker.finish_reason
            finish_reason = "abort" if reason is None else reason.value  # unfinished: the client left, or shutdown
            record.finish_reasons.append(finish_reason)
            ttft = None if decoder.first_token_time is None else decoder.first_token_time - record.start
            latency = (decoder.finish_time or now) - record.start
            state.metrics.observe_choice(finish_reason, len(decoder.spec.prompt_token_ids),
                                         len(decoder.tracker.token_ids), ttft, latency)

    return report


def json_response(payload: object, status_code: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code, media_type="application/json")


async def collect_or_abort(request: Request, generation: Generation) -> tuple[dict[int, CollectedChoice], Usage] | None:
    """Every choice in full; None if the client left first (its sequences are aborted then)."""
    try:
        choices = await until_disconnect(request, collect(generation))
    except ClientDisconnected:
        return None
    finally:
        generation.close()
    return choices, generation.usage()


async def run_or_abort(request: Request, generation: Generation, events: AsyncIterator[Batch]) -> bool:
    """Runs a response's `events` to their end; False if the client left first (its sequences are aborted then)."""
    try:
        await until_disconnect(request, drain(events))
    except ClientDisconnected:
        return False
    finally:
        generation.close()
    return True


async def drain(events: AsyncIterator[Batch]) -> None:
    async for _ in events:
        pass


def client_gone() -> Response:
    return Response(status_code=_CLIENT_CLOSED_REQUEST)
