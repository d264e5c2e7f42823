"""POST /v1/score and /v1/rerank (also /rerank, /v2/rerank): the request bodies, parsed and validated.

/v1/score is vLLM's: `text_1` and `text_2`, each a string or an array of strings; one text_1 against
every text_2 (one to many), or arrays of equal length scored pair by pair (one to one).
/v1/rerank is Jina's and Cohere's: a `query`, `documents` (strings, or objects with a `text`),
`top_n` (default: all of them), `return_documents` (default true, as Jina and vLLM).
Both take `truncate_prompt_tokens` as /v1/embeddings does; `model` is optional (any served name).
"""

from dataclasses import dataclass, replace

from openai_serve.errors import bad_request
from openai_serve.protocol.embeddings import read_truncation
from openai_serve.protocol.fields import Fields, UnknownFields


@dataclass(frozen=True)
class ScoreRequest:
    model: str | None
    pairs: tuple[tuple[str, str], ...]  # (text_1, text_2) in the answer's order
    truncate_prompt_tokens: int | None = None
    ignored_fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class RerankRequest:
    model: str | None
    query: str
    documents: tuple[str, ...]
    top_n: int
    return_documents: bool = True
    truncate_prompt_tokens: int | None = None
    ignored_fields: tuple[str, ...] = ()


def parse_score_request(body: object, unknown: UnknownFields | None = None) -> ScoreRequest:
    fields = Fields(body, unknown=unknown)
    model = fields.get_str("model", None)
    firsts, seconds = _texts(fields, "text_1"), _texts(fields, "text_2")
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    elif len(firsts) != len(seconds):
        raise bad_request(f"'text_1' holds {len(firsts)} texts and 'text_2' {len(seconds)}: send one text_1, or as "
                          "many as text_2", "text_2")
    request = ScoreRequest(model, tuple(zip(firsts, seconds, strict=True)), read_truncation(fields))
    return replace(request, ignored_fields=fields.ignored_fields())


def parse_rerank_request(body: object, unknown: UnknownFields | None = None) -> RerankRequest:
    fields = Fields(body, unknown=unknown)
    model = fields.get_str("model", None)
    query = fields.get_str("query", None)
    if query is None:
        raise bad_request("you must provide a query parameter (a string)", "query")
    documents = _documents(fields.raw("documents"))
    top_n = fields.get_int("top_n", len(documents))
    if top_n < 1:
        raise bad_request(f"'top_n' must be >= 1, got {top_n}", "top_n")
    request = RerankRequest(model, query, documents, min(top_n, len(documents)),
                            fields.get_bool("return_documents", True), read_truncation(fields))
    return replace(request, ignored_fields=fields.ignored_fields())


def _texts(fields: Fields, key: str) -> tuple[str, ...]:
    value = fields.raw(key)
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise bad_request(f"'{key}' must be a string or a non-empty array of strings", key)


def _documents(value: object) -> tuple[str, ...]:
    """Strings, or objects with a `text` string (Cohere's and Jina's document objects)."""
    if not isinstance(value, list) or not value:
        raise bad_request("'documents' must be a non-empty array of strings or of objects with a 'text'", "documents")
    texts = []
    for index, document in enumerate(value):
        text = document.get("text") if isinstance(document, dict) else document
        if not isinstance(text, str):
            raise bad_request(f"'documents[{index}]' must be a string or an object with a 'text' string",
                              f"documents[{index}]")
        texts.append(text)
    return tuple(texts)
