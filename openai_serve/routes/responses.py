"""The Responses API: POST /v1/responses, and GET, DELETE and POST .../cancel of a stored response,
and GET .../input_items (its input, a page at a time: item_pages.py).

A request runs as the chat request it is (protocol/responses.py) through chat's prompt and parsers
(chat_prompt.py), on the engine like any other. It is answered in full, streamed as typed events
(`event: response.output_text.delta` ... `response.completed`, numbered by `sequence_number`; no
`[DONE]`, as OpenAI streams them), or with `background: true` at once while it runs on (read it
back with GET, stop it with POST .../cancel). As on the other endpoints, a client that leaves
aborts the request (not a background one), and a server that shuts down ends a stream with a
terminal event (`response.failed`) and a request in full with a 503. A response is stored once it
ends (with `store`, the default), and from its start when in the background.
"""

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import Response

from openai_serve.chat_prompt import chat_prompt
from openai_serve.errors import APIError, bad_request, unsupported
from openai_serve.generation import Generation
from openai_serve.ignored_fields import name_ignored_fields
from openai_serve.item_pages import PageQuery, page
from openai_serve.protocol.responses import OUTPUT_LOGPROBS, ResponsesRequest, parse_responses_request, read_include
from openai_serve.response_run import ResponseRun, usage_json
from openai_serve.response_store import StoredResponse
from openai_serve.routes.responding import client_gone, drain, json_response, read_body, run_or_abort, start_generation
from openai_serve.sse import TYPED, Batch, event_stream
from openai_serve.state import ServingState, serving_state

logger = logging.getLogger(__name__)


async def create_response(request: Request) -> Response:
    state = serving_state(request)
    body = await read_body(request, "input", parse_responses_request)
    state.limits.check_generation(1, body.common, body.prompt_param)
    body = _in_context(state, body)
    prompt = await chat_prompt(state, body)
    if body.logprobs is not None and prompt.parsing.new_parser() is not None:
        raise unsupported("include", f"{OUTPUT_LOGPROBS!r} is supported for answers that are all text: not with "
                          "tools to parse or a reasoning parser")
    run = ResponseRun(body, prompt.parsing, state.token_texts)
    generation = start_generation(request, state, prompt.request, run.response_id, [prompt.token_ids])
    if body.background:
        response = _run_in_background(state, run, generation)
    elif body.common.stream.stream:
        response = event_stream(_stream(state, run, generation), generation.close, TYPED)
    else:
        response = await _answer_in_full(request, state, run, generation)
    return name_ignored_fields(response, body.ignored_fields)


def _in_context(state: ServingState, body: ResponsesRequest) -> ResponsesRequest:
    """The request as this server runs it: after the conversation it continues, stored if it can be."""
    if body.background and body.common.stream.stream:
        raise unsupported("background", "with 'stream' is not supported: poll GET /v1/responses/{id} instead")
    if not state.responses.is_enabled:  # --responses-store-max-entries 0: nothing is stored
        if body.background:
            raise bad_request("'background' needs the response store, which this server has switched off "
                              "(--responses-store-max-entries 0)", "background")
        body = replace(body, store=False, settings=body.settings | {"store": False})
    if body.previous_response_id is not None:
        body = body.with_history(_previous(state, body.previous_response_id).run.conversation())
    return body


async def retrieve_response(request: Request) -> Response:
    if request.query_params.get("stream") in ("true", "1"):
        raise unsupported("stream", "is not supported when reading a response back: read it in full")
    return json_response(_stored(request).run.response())


async def list_input_items(request: Request) -> Response:
    """The stored response's own input (not its instructions, nor the conversation it continues)."""
    query = request.query_params
    read_include(query.getlist("include") + query.getlist("include[]"))  # the SDK sends `include[]`
    return json_response(page(_stored(request).run.body.input_items, PageQuery.read(query)))


async def delete_response(request: Request) -> Response:
    state = serving_state(request)
    response_id = _stored(request).run.response_id
    state.responses.pop(response_id)
    return json_response({"id": response_id, "object": "response.deleted", "deleted": True})


async def cancel_response(request: Request) -> Response:
    entry = _stored(request)
    if not entry.run.body.background:
        raise bad_request("Only responses created with 'background': true can be cancelled.", "response_id")
    entry.cancel()  # one that already ended stays as it ended
    return json_response(entry.run.response())


def _stored(request: Request) -> StoredResponse:
    response_id = request.path_params["response_id"]
    entry = serving_state(request).responses.get(response_id)
    if entry is None:
        raise not_found(response_id, "response_id")
    return entry


def _previous(state: ServingState, response_id: str) -> StoredResponse:
    entry = state.responses.get(response_id)
    if entry is None:
        raise not_found(response_id, "previous_response_id")
    if not entry.run.is_finished:
        raise bad_request(f"Response '{response_id}' is still in progress: continue it once it has ended.",
                          "previous_response_id")
    return entry


def not_found(response_id: str, param: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param=param, code="not_found")


async def _stream(state: ServingState, run: ResponseRun, generation: Generation) -> AsyncIterator[Batch]:
    try:
        async for batch in run.events(generation):
            yield batch
    except APIError as error:  # the engine went away: the stream still ends with its terminal event
        yield run.fail(error, usage_json(generation))
    _store(state, run)


async def _answer_in_full(request: Request, state: ServingState, run: ResponseRun, generation: Generation) -> Response:
    if not await run_or_abort(request, generation, run.events(generation)):
        return client_gone()
    _store(state, run)
    return json_response(run.response())


def _run_in_background(state: ServingState, run: ResponseRun, generation: Generation) -> Response:
    async def run_to_the_end() -> None:
        try:
            await drain(run.events(generation))
        except APIError as error:
            run.fail(error, usage_json(generation))
        except Exception:  # a bug: nobody awaits this task, so it is logged here and the response fails
            logger.exception("background response %s failed", run.response_id)
            run.fail(APIError(500, "The server had an error while processing your request.",
                              error_type="server_error"), usage_json(generation))
        finally:
            generation.close()

    state.responses.put(run, asyncio.ensure_future(run_to_the_end()))
    return json_response(run.response())


def _store(state: ServingState, run: ResponseRun) -> None:
    if run.body.store:
        state.responses.put(run)
