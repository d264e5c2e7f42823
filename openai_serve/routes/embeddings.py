"""POST /v1/embeddings: one vector per input, from an embedding model (see protocol/embeddings.py).

Text inputs get the model's sentence-transformers prompt (`prompt_name`, else its default one) in
front, as sentence-transformers' encode does; token-id inputs are taken as they are. Each vector is
shortened to `dimensions` and normalized as core/pooling_output.py says. A generation model, or a
score model, answers 400.
"""

import base64
import time
import uuid

from starlette.requests import Request
from starlette.responses import Response

from core.pooling_model import PoolingModel
from core.pooling_output import embedding
from openai_serve.cpu_work import items_size
from openai_serve.errors import bad_request
from openai_serve.http_io import read_json
from openai_serve.ignored_fields import name_ignored_fields
from openai_serve.pooling_run import PooledPrompt, check_task, pool, truncated
from openai_serve.protocol.embeddings import EmbeddingRequest, parse_embedding_request
from openai_serve.protocol.fields import UnknownFields
from openai_serve.routes.responding import client_gone, json_response
from openai_serve.state import ServingState, serving_state


async def create_embedding(request: Request) -> Response:
    state = serving_state(request)
    raw = await read_json(request)
    unknown = UnknownFields(state.config.strict_request_fields)
    body = await state.cpu_work.run(items_size(raw, "input"), lambda: parse_embedding_request(raw, unknown))
    state.check_model(body.model)
    check_task(state, "embed", "embeddings")
    state.ignored_fields.note(body.ignored_fields)
    model = state.engine.pooling
    assert model is not None
    _check_dimensions(model, body.dimensions)
    prefix = _prompt_prefix(model, body.prompt_name)
    _check_sizes(state, body)
    texts = [p for p in body.inputs if isinstance(p, str)]
    prompts = await state.cpu_work.run(sum(map(len, texts)), lambda: [
        PooledPrompt(_tokens(state, body, prefix, p)) for p in body.inputs])
    response_id = f"embd-{uuid.uuid4().hex}"
    pooled = await pool(request, state, prompts, response_id, "input")
    if pooled is None:
        return client_gone()
    data = [{"object": "embedding", "index": i, "embedding": _encoded(embedding(v, model, body.dimensions),
                                                                      body.encoding_format)}
            for i, v in enumerate(pooled.vectors)]
    answer = {"id": response_id, "object": "list", "created": int(time.time()), "model": body.model, "data": data,
              "usage": pooled.usage()}
    return name_ignored_fields(json_response(answer), body.ignored_fields)


def _check_dimensions(model: PoolingModel, dimensions: int | None) -> None:
    if dimensions is None:
        return
    if not model.is_matryoshka:
        raise bad_request("'dimensions' is not supported by this model: its embeddings cannot be shortened "
                          "(it is not a Matryoshka model)", "dimensions")
    allowed = model.matryoshka_dimensions
    if (allowed is not None and dimensions not in allowed) or dimensions > model.hidden_size:
        choices = ", ".join(map(str, allowed)) if allowed is not None else f"1 to {model.hidden_size}"
        raise bad_request(f"'dimensions' must be one of this model's sizes ({choices}), got {dimensions}",
                          "dimensions")


def _prompt_prefix(model: PoolingModel, prompt_name: str | None) -> str:
    prompts = model.prompt_texts
    name = prompt_name or model.default_prompt_name
    if name is None:
        return ""
    if name not in prompts:
        raise bad_request(f"'prompt_name' must be one of this model's prompts ({', '.join(prompts) or 'none'}), "
                          f"got {name!r}", "prompt_name")
    return prompts[name]


def _check_sizes(state: ServingState, body: EmbeddingRequest) -> None:
    """What can never fit, refused before tokenizing (request_limits.py)."""
    if len(body.inputs) > state.config.max_prompts_per_request:
        raise bad_request(f"'input' holds {len(body.inputs)} inputs; at most {state.config.max_prompts_per_request} "
                          "are allowed per request (--max-prompts-per-request)", "input")
    if body.truncate_prompt_tokens is None:
        for text in body.inputs:
            if isinstance(text, str):
                state.limits.check_text(len(text), "input")


def _tokens(state: ServingState, body: EmbeddingRequest, prefix: str, prompt: str | tuple[int, ...]) -> list[int]:
    if isinstance(prompt, str):
        token_ids = state.tokenizer.encode(prefix + prompt, add_special_tokens=body.add_special_tokens)
    else:
        token_ids = list(prompt)
    return truncated(token_ids, body.truncate_prompt_tokens, state.engine.max_model_len)


def _encoded(vector, encoding_format: str) -> list[float] | str:  # noqa: ANN001 - a float32 numpy vector
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
