"""POST /tokenize and POST /detokenize, in vLLM's shapes (`model` is optional on both).

/tokenize takes a `prompt` string, or chat `messages` (with `tools`, `reasoning_effort` ...) rendered
through the chat template exactly as /v1/chat/completions renders them, so its count is the
prompt_tokens a chat request reports. Unknown fields are treated as on the generation endpoints.
A prompt or messages that can never fit the context are a 400, as on the generation endpoints (they
are not tokenized); /detokenize takes at most a context's worth of tokens. Large inputs are worked
off the event loop (cpu_work.py).
"""

from starlette.requests import Request
from starlette.responses import Response

from core import RequestRejected
from openai_serve.chat_prompt import chat_work_size, render_and_tokenize
from openai_serve.cpu_work import items_size
from openai_serve.errors import bad_request, refused
from openai_serve.http_io import read_json
from openai_serve.ignored_fields import name_ignored_fields
from openai_serve.protocol.chat import ChatRequest, read_template_kwargs
from openai_serve.protocol.common import CommonRequest
from openai_serve.protocol.fields import Fields, UnknownFields
from openai_serve.protocol.messages import parse_messages
from openai_serve.protocol.tools import read_tools
from openai_serve.routes.responding import json_response
from openai_serve.state import ServingState, serving_state


async def tokenize(request: Request) -> Response:
    state = serving_state(request)
    body = await read_json(request)
    if isinstance(body, dict) and body.get("messages") is not None:
        return await _tokenize_messages(state, body)
    fields = Fields(body, unknown=UnknownFields(state.config.strict_request_fields))
    state.check_model(fields.get_str("model", None))
    prompt = fields.get_str("prompt", None)
    if prompt is None:
        raise bad_request("send either 'prompt' (a string) or 'messages'", "prompt")
    state.limits.check_text(len(prompt), "prompt")
    add_special_tokens = fields.get_bool("add_special_tokens", True)
    with_strs = fields.get_bool("return_token_strs", False)
    fields.check_unknown()
    result = await state.cpu_work.run(len(prompt), lambda: _tokens(
        state, state.tokenizer.encode(prompt, add_special_tokens=add_special_tokens), with_strs))
    return name_ignored_fields(json_response(result), tuple(fields.unknown.names))


def _tokens(state: ServingState, token_ids: list[int], with_strs: bool) -> dict[str, object]:
    token_strs = state.tokenizer.convert_ids_to_tokens(token_ids) if with_strs else None
    return {"count": len(token_ids), "max_model_len": state.engine.max_model_len, "tokens": token_ids,
            "token_strs": token_strs}


async def _tokenize_messages(state: ServingState, body: dict[str, object]) -> Response:
    """The messages as a chat request would render them (vLLM's /tokenize takes the same fields)."""
    state.limits.check_body(body, "messages")
    unknown = UnknownFields(state.config.strict_request_fields)
    fields = Fields(body, unknown=unknown)
    state.check_model(fields.get_str("model", None))
    with_strs = fields.get_bool("return_token_strs", False)
    messages = await state.cpu_work.run(items_size(body, "messages"),
                                        lambda: parse_messages(fields.raw("messages"), unknown))
    chat = ChatRequest(
        common=CommonRequest(model=""), messages=messages,
        template_kwargs=read_template_kwargs(fields),
        add_generation_prompt=fields.get_bool("add_generation_prompt", True),
        continue_final_message=fields.get_bool("continue_final_message", False),
        tools=read_tools(fields),
    )
    fields.check_unknown()
    result = await state.cpu_work.run(chat_work_size(chat), lambda: _tokens(
        state, render_and_tokenize(state, chat)[1], with_strs))
    return name_ignored_fields(json_response(result), tuple(fields.unknown.names))


async def detokenize(request: Request) -> Response:
    state = serving_state(request)
    fields = Fields(await read_json(request), unknown=UnknownFields(state.config.strict_request_fields))
    state.check_model(fields.get_str("model", None))
    if not fields.has("tokens"):
        raise bad_request("you must provide a tokens parameter (an array of token ids)", "tokens")
    token_ids = list(fields.int_list("tokens"))
    fields.check_unknown()
    max_model_len = state.engine.max_model_len
    if len(token_ids) > max_model_len:
        raise bad_request(f"'tokens' holds {len(token_ids)} ids, more than this model's context of "
                          f"{max_model_len}", "tokens")
    try:
        state.engine.limits.check_token_ids(token_ids, "tokens")
    except RequestRejected as exc:
        raise refused(exc) from exc
    text = await state.cpu_work.run(len(token_ids), lambda: state.tokenizer.decode(token_ids))
    return name_ignored_fields(json_response({"prompt": text}), tuple(fields.unknown.names))
