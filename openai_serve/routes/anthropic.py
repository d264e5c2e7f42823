"""Anthropic's Messages API: POST /v1/messages and POST /v1/messages/count_tokens.

A request runs as the chat request it is (protocol/anthropic_request.py) through chat's prompt and
parsers (chat_prompt.py), on the engine like any other, so Anthropic clients (its SDKs, Claude Code)
get what chat clients get: the same template, sampling, tools, structured output and parsers. It
is answered in full or streamed as Anthropic's typed events (anthropic_message.py). As on the other
endpoints, a client that leaves aborts the request, and the request log and the metrics count it.
An error is in Anthropic's shape (errors.py), before the stream as a status, after it began as an
`error` event. `anthropic-version` and `anthropic-beta` headers are accepted and change nothing.

The model must be one of the served names, as on chat: a client that asks for Claude by name (as
Claude Code does unless told `--model`, and for its small background model) is told the model does
not exist. Serve under the names it asks for (`--served-model-name local claude-haiku-...`) or point
it at a served name (`ANTHROPIC_MODEL`, `ANTHROPIC_DEFAULT_HAIKU_MODEL`).

/v1/messages/count_tokens renders the same body through the chat template as /v1/messages would
and counts its tokens: the prompt's tokens, which a message reports as `input_tokens` plus
`cache_read_input_tokens`.
"""

from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from openai_serve.anthropic_message import MessageRun, error_event
from openai_serve.chat_prompt import chat_prompt, chat_work_size, render_and_tokenize
from openai_serve.errors import APIError
from openai_serve.generation import Generation
from openai_serve.ignored_fields import name_ignored_fields
from openai_serve.protocol.anthropic_request import parse_count_tokens_request, parse_messages_request
from openai_serve.routes.responding import client_gone, json_response, read_body, run_or_abort, start_generation
from openai_serve.sse import ANTHROPIC, Batch, event_stream
from openai_serve.state import serving_state


async def create_message(request: Request) -> Response:
    state = serving_state(request)
    body = await read_body(request, "messages", parse_messages_request)
    state.limits.check_generation(1, body.common, body.prompt_param)
    prompt = await chat_prompt(state, body)
    body = prompt.request.within_context(len(prompt.token_ids), state.engine.max_model_len)
    run = MessageRun(body, prompt.parsing)
    generation = start_generation(request, state, body, run.message_id, [prompt.token_ids])
    if body.common.stream.stream:
        response = event_stream(_stream(run, generation), generation.close, ANTHROPIC)
    elif await run_or_abort(request, generation, run.events(generation)):
        response = json_response(run.message())
    else:
        response = client_gone()
    return name_ignored_fields(response, body.ignored_fields)


async def count_tokens(request: Request) -> Response:
    state = serving_state(request)
    body = await read_body(request, "messages", lambda raw, unknown, _: parse_count_tokens_request(raw, unknown))
    token_ids = await state.cpu_work.run(chat_work_size(body), lambda: render_and_tokenize(state, body)[1])
    return name_ignored_fields(json_response({"input_tokens": len(token_ids)}), body.ignored_fields)


async def _stream(run: MessageRun, generation: Generation) -> AsyncIterator[Batch]:
    try:
        async for batch in run.events(generation):
            yield batch
    except APIError as error:  # the engine went away: the stream ends with Anthropic's error event
        yield [error_event(error)]
