"""POST /v1/embeddings: the request body, parsed and validated.

`input` is a string, an array of strings, an array of token ids or an array of arrays of token ids
(OpenAI's four shapes); `encoding_format` float or base64 (little-endian float32, as OpenAI's SDK
decodes it); `dimensions` shortens the vectors where the model allows it (checked by the route,
which knows the model); `user` is accepted and unused, as by OpenAI. Extras, named as vLLM and
sentence-transformers name them: `truncate_prompt_tokens` (keep the last N tokens of a longer input;
-1: the model's limit), `add_special_tokens`, and `prompt_name` (one of the model's
sentence-transformers prompts, prefixed to every text input; default: the model's default prompt).
"""

from dataclasses import dataclass, replace

from openai_serve.errors import bad_request
from openai_serve.protocol.common import read_model
from openai_serve.protocol.completions import Prompt, parse_prompts
from openai_serve.protocol.fields import Fields, UnknownFields

ENCODING_FORMATS = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[Prompt, ...]
    encoding_format: str = "float"
    dimensions: int | None = None
    truncate_prompt_tokens: int | None = None  # -1: to the model's limit
    add_special_tokens: bool = True
    prompt_name: str | None = None
    ignored_fields: tuple[str, ...] = ()


def parse_embedding_request(body: object, unknown: UnknownFields | None = None) -> EmbeddingRequest:
    """`unknown`: where fields nobody reads go (None: each is a 400, as `--strict-request-fields`)."""
    fields = Fields(body, unknown=unknown)
    request = EmbeddingRequest(
        model=read_model(fields),
        inputs=parse_prompts(fields.raw("input"), "input"),
        encoding_format=fields.get_str("encoding_format", "float"),
        dimensions=fields.get_int("dimensions", None),
        truncate_prompt_tokens=read_truncation(fields),
        add_special_tokens=fields.get_bool("add_special_tokens", True),
        prompt_name=fields.get_str("prompt_name", None),
    )
    if request.encoding_format not in ENCODING_FORMATS:
        raise bad_request(f"'encoding_format' must be one of {', '.join(ENCODING_FORMATS)}, got "
                          f"{request.encoding_format!r}", "encoding_format")
    if request.dimensions is not None and request.dimensions < 1:
        raise bad_request(f"'dimensions' must be >= 1, got {request.dimensions}", "dimensions")
    fields.get_str("user", None)  # OpenAI's end-user id: accepted, nothing to do with it
    return replace(request, ignored_fields=fields.ignored_fields())


def read_truncation(fields: Fields) -> int | None:
    """vLLM's `truncate_prompt_tokens`: a positive count, or -1 for the model's limit."""
    value = fields.get_int("truncate_prompt_tokens", None)
    if value is not None and value < 1 and value != -1:
        raise bad_request(f"'truncate_prompt_tokens' must be >= 1 or -1, got {value}", "truncate_prompt_tokens")
    return value
