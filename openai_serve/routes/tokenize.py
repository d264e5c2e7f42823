"""POST /tokenize and POST /detokenize, in vLLM's shapes (`model` is optional on both).

/tokenize takes a `prompt` string, or chat `messages` rendered through the chat template exactly
as /v1/chat/completions renders them, so its count is the prompt_tokens a chat request reports.
"""

from starlette.requests import Request
from starlette.responses import Response

from core import RequestRejected
from openai_serve.errors import bad_request, refused
from openai_serve.http_io import read_json
from openai_serve.protocol.chat import ChatRequest, parse_messages
from openai_serve.protocol.common import CommonRequest
from openai_serve.protocol.fields import Fields
from openai_serve.routes.responding import json_response
from openai_serve.state import ServingState, serving_state


async def tokenize(request: Request) -> Response:
    state = serving_state(request)
    fields = Fields(await read_json(request))
    state.check_model(fields.get_str("model", None))
    token_ids = _tokenize_messages(state, fields) if fields.has("messages") else _tokenize_prompt(state, fields)
    with_strs = fields.get_bool("return_token_strs", False)
    fields.reject_unknown()
    token_strs = state.tokenizer.convert_ids_to_tokens(token_ids) if with_strs else None
    return json_response({"count": len(token_ids), "max_model_len": state.engine.max_model_len,
                          "tokens": token_ids, "token_strs": token_strs})


def _tokenize_prompt(state: ServingState, fields: Fields) -> list[int]:
    prompt = fields.get_str("prompt", None)
    if prompt is None:
        raise bad_request("send either 'prompt' (a string) or 'messages'", "prompt")
    return state.tokenizer.encode(prompt, add_special_tokens=fields.get_bool("add_special_tokens", True))


def _tokenize_messages(state: ServingState, fields: Fields) -> list[int]:
    kwargs = fields.get_object("chat_template_kwargs")
    chat = ChatRequest(
        common=CommonRequest(model=""), messages=parse_messages(fields.raw("messages")),
        template_kwargs={} if kwargs is None else kwargs.raw_items(),
        add_generation_prompt=fields.get_bool("add_generation_prompt", True),
        continue_final_message=fields.get_bool("continue_final_message", False),
    )
    return state.chat_template.tokenize(state.chat_template.render(chat))


async def detokenize(request: Request) -> Response:
    state = serving_state(request)
    fields = Fields(await read_json(request))
    state.check_model(fields.get_str("model", None))
    token_ids = list(fields.int_list("tokens"))
    fields.reject_unknown()
    try:
        state.engine.limits.check_token_ids(token_ids, "tokens")
    except RequestRejected as exc:
        raise refused(exc) from exc
    return json_response({"prompt": state.tokenizer.decode(token_ids)})
