"""What the generation endpoints share: their choices started in the engine, then answered in full or streamed."""

from collections.abc import AsyncIterator
from typing import Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response

from openai_serve.generation import CollectedChoice, Generation, GenerationBody, Usage, choice_specs, collect
from openai_serve.http_io import ClientDisconnected, until_disconnect
from openai_serve.sse import Batch, event_stream
from openai_serve.state import ServingState

# nginx's "client closed request": never seen by the client, but it shows in access logs.
_CLIENT_CLOSED_REQUEST = 499


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
    generation = start_generation(state, body, view.response_id, prompts)
    if body.common.stream.stream:
        return event_stream(view.stream(generation), generation.close)
    result = await collect_or_abort(request, generation)
    return client_gone() if result is None else json_response(view.response(*result))


def start_generation(
    state: ServingState, body: GenerationBody, response_id: str, prompts: list[list[int]]
) -> Generation:
    """Every choice of every prompt, checked against the engine's limits and submitted (all or none)."""
    specs = choice_specs(response_id, prompts, body, state.engine.limits)
    generation = Generation(specs, state.token_decoder)
    generation.start(state.bridge)
    return generation


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


def client_gone() -> Response:
    return Response(status_code=_CLIENT_CLOSED_REQUEST)
