"""POST /tokenize and POST /detokenize, in vLLM's shapes (`model` is optional on both).

/tokenize takes a `prompt` string, or chat `messages` (with `tools`, `reasoning_effort` ...) rendered
through the chat template exactly as /v1/chat/completions renders them, so its count is the
prompt_tokens a chat request reports. Unknown fields are treated as on the generation endpoints.
"""

from starlette.requests import Request
from starlette.responses import Response

from core import RequestRejected
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
        return _tokenize_messages(state, body)
    fields = Fields(body, unknown=UnknownFields(state.config.strict_request_fields))
    state.check_model(fields.get_str("model", None))
    token_ids = _tokenize_prompt(state, fields)
    return _tokens(state, token_ids, fields.get_bool("return_token_strs", False), fields)


def _tokens(state: ServingState, token_ids: list[int], with_strs: bool, fields: Fields) -> Response:
    fields.check_unknown()
    token_strs = state.tokenizer.convert_ids_to_tokens(token_ids) if with_strs else None
    response = json_response({"count": len(token_ids), "max_model_len": state.engine.max_model_len,
                              "tokens": token_ids, "token_strs": token_strs})
    return name_ignored_fields(response, tuple(fields.unknown.names))


def _tokenize_prompt(state: ServingState, fields: Fields) -> list[int]:
    prompt = fields.get_str("prompt", None)
    if prompt is None:
        raise bad_request("send either 'prompt' (a string) or 'messages'", "prompt")
    return state.tokenizer.encode(prompt, add_special_tokens=fields.get_bool("add_special_tokens", True))


def _tokenize_messages(state: ServingState, body: dict[str, object]) -> Response:
    """The messages as a chat request would render them (vLLM's /tokenize takes the same fields)."""
    unknown = UnknownFields(state.config.strict_request_fields)
    fields = Fields(body, unknown=unknown)
    state.check_model(fields.get_str("model", None))
    with_strs = fields.get_bool("return_token_strs", False)
    chat = ChatRequest(
        common=CommonRequest(model=""), messages=parse_messages(fields.raw("messages"), unknown),
        template_kwargs=read_template_kwargs(fields),
        add_generation_prompt=fields.get_bool("add_generation_prompt", True),
        continue_final_message=fields.get_bool("continue_final_message", False),
        tools=read_tools(fields),
    )
    token_ids = state.chat_template.tokenize(state.chat_template.render(chat))
    return _tokens(state, token_ids, with_strs, fields)


async def detokenize(request: Request) -> Response:
    state = serving_state(request)
    fields = Fields(await read_json(request), unknown=UnknownFields(state.config.strict_request_fields))
    state.check_model(fields.get_str("model", None))
    token_ids = list(fields.int_list("tokens"))
    fields.check_unknown()
    try:
        state.engine.limits.check_token_ids(token_ids, "tokens")
    except RequestRejected as exc:
        raise refused(exc) from exc
    response = json_response({"prompt": state.tokenizer.decode(token_ids)})
    return name_ignored_fields(response, tuple(fields.unknown.names))
