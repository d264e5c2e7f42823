"""/v1/embeddings, /v1/score and /v1/rerank through a real server, against sentence-transformers on the
same tiny checkpoints: the official SDK (float and base64), LangChain's OpenAIEmbeddings, Open WebUI's
recorded request bodies, a cross-encoder's and a yes/no reranker's scores, the errors, the metrics."""

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from tests.e2e.serving import RunningServer, assert_error_shape, start_server
from tests.pooling_models import cross_encoder, embedding_model, yes_no_reranker

pytest.importorskip("sentence_transformers")
from sentence_transformers import CrossEncoder, SentenceTransformer  # noqa: E402

MODEL = "tiny"
TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world", "what is the capital of france?"]
DOCUMENTS = ["paris is the capital of france", "the lazy dog", "a server streams tokens to many clients"]
QUERY = "what is the capital of france?"
ATOL = 2e-6

# Recorded from Open WebUI's source (github.com/open-webui/open-webui):
# backend/open_webui/retrieval/utils.py, generate_openai_batch_embeddings, POSTs to {url}/embeddings
#   json_data = {"input": texts, "model": model}  (plus a prefix field only when RAG_EMBEDDING_PREFIX_FIELD_NAME
#   is configured; by default the prefix is prepended to each text instead)
OPEN_WEBUI_EMBEDDINGS_BODY = {"input": TEXTS, "model": MODEL}
# backend/open_webui/retrieval/models/external.py, ExternalReranker.predict, POSTs to the configured URL
# (default http://localhost:8080/v1/rerank) and reads results[i].index and .relevance_score
OPEN_WEBUI_RERANK_BODY = {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "top_n": len(DOCUMENTS)}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("retrieval-models")
    return {"embed": embedding_model(root, "qwen3", "lasttoken"), "cross": cross_encoder(root),
            "yes_no": yes_no_reranker(root)}


@pytest.fixture(scope="module")
def embed_server(models: dict[str, Path]) -> Iterator[RunningServer]:
    running = start_server(models["embed"], max_model_len=128)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def cross_server(models: dict[str, Path]) -> Iterator[RunningServer]:
    running = start_server(models["cross"], max_model_len=128)
    yield running
    running.stop()


def _st_vectors(model_dir: Path, texts: list[str], **kwargs: object) -> np.ndarray:
    return SentenceTransformer(str(model_dir), device="cpu").encode(texts, **kwargs)


def test_sdk_embeddings_float_and_base64(embed_server: RunningServer, models: dict[str, Path]) -> None:
    client = embed_server.client()
    expected = _st_vectors(models["embed"], TEXTS)
    as_float = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    as_base64 = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="base64")  # the strings as sent
    by_default = client.embeddings.create(model=MODEL, input=TEXTS)  # the SDK asks for base64 and decodes it
    for response in (as_float, by_default):
        assert [d.index for d in response.data] == [0, 1, 2]
        np.testing.assert_allclose(np.array([d.embedding for d in response.data]), expected, atol=ATOL)
    decoded = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4").tolist() for d in as_base64.data]
    assert decoded == [d.embedding for d in as_float.data] == [d.embedding for d in by_default.data]
    tokenizer = SentenceTransformer(str(models["embed"]), device="cpu").tokenizer
    num_tokens = sum(len(tokenizer(text)["input_ids"]) for text in TEXTS)
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens == num_tokens


def test_token_id_inputs_and_one_string(embed_server: RunningServer, models: dict[str, Path]) -> None:
    client = embed_server.client()
    tokenizer = SentenceTransformer(str(models["embed"]), device="cpu").tokenizer
    ids = [tokenizer(text)["input_ids"] for text in TEXTS]
    from_ids = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    from_texts = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert [d.embedding for d in from_ids.data] == [d.embedding for d in from_texts.data]
    one_list = client.embeddings.create(model=MODEL, input=ids[1], encoding_format="float")
    one_text = client.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float")
    assert one_list.data[0].embedding == one_text.data[0].embedding == from_texts.data[1].embedding


def test_dimensions_and_prompt_name(embed_server: RunningServer, models: dict[str, Path]) -> None:
    client = embed_server.client()
    short = client.embeddings.create(model=MODEL, input=TEXTS, dimensions=16, encoding_format="float")
    expected = _st_vectors(models["embed"], TEXTS, truncate_dim=16, normalize_embeddings=True)
    np.testing.assert_allclose(np.array([d.embedding for d in short.data]), expected, atol=ATOL)
    with embed_server.http() as http:
        error = assert_error_shape(http.post("/v1/embeddings", json={"model": MODEL, "input": "hi",
                                                                     "dimensions": 20}), 400)
        assert error["param"] == "dimensions" and "16, 32, 64" in error["message"]
        queried = http.post("/v1/embeddings", json={"model": MODEL, "input": TEXTS, "prompt_name": "query"}).json()
        error = assert_error_shape(http.post("/v1/embeddings", json={"model": MODEL, "input": "hi",
                                                                     "prompt_name": "nope"}), 400)
        assert error["param"] == "prompt_name"
    expected = _st_vectors(models["embed"], TEXTS, prompt_name="query")
    np.testing.assert_allclose(np.array([d["embedding"] for d in queried["data"]]), expected, atol=ATOL)


def test_langchain_openai_embeddings(embed_server: RunningServer, models: dict[str, Path]) -> None:
    """LangChain tokenizes with tiktoken and sends token ids unless check_embedding_ctx_length=False (then the
    texts); with tiktoken_enabled=False it tokenizes with the model's own tokenizer and sends the decoded
    chunks as texts. Both paths send what the bodies captured here show, and get sentence-transformers'
    vectors."""
    from langchain_openai import OpenAIEmbeddings

    sent: list[object] = []

    def capture(request: httpx.Request) -> None:
        import json

        sent.append(json.loads(request.content)["input"])

    common = {"model": MODEL, "base_url": embed_server.base_url + "/v1", "api_key": "unused",
              "http_client": httpx.Client(event_hooks={"request": [capture]})}
    expected = _st_vectors(models["embed"], TEXTS)
    as_texts = OpenAIEmbeddings(check_embedding_ctx_length=False, **common)
    np.testing.assert_allclose(np.array(as_texts.embed_documents(TEXTS)), expected, atol=ATOL)
    np.testing.assert_allclose(as_texts.embed_query(TEXTS[0]), expected[0], atol=ATOL)
    assert sent[0] == TEXTS
    own_tokenizer = OpenAIEmbeddings(tiktoken_enabled=False, tiktoken_model_name=str(models["embed"]), **common)
    np.testing.assert_allclose(np.array(own_tokenizer.embed_documents(TEXTS)), expected, atol=ATOL)
    assert sent[-1] == TEXTS  # the model's tokenizer decodes these texts back as they were


def test_open_webui_embedding_body(embed_server: RunningServer, models: dict[str, Path]) -> None:
    with embed_server.http() as http:
        response = http.post("/v1/embeddings", json=OPEN_WEBUI_EMBEDDINGS_BODY)
    assert response.status_code == 200, response.text
    vectors = np.array([item["embedding"] for item in response.json()["data"]])
    np.testing.assert_allclose(vectors, _st_vectors(models["embed"], TEXTS), atol=ATOL)


def test_embedding_model_scores_by_cosine(embed_server: RunningServer, models: dict[str, Path]) -> None:
    st = SentenceTransformer(str(models["embed"]), device="cpu")
    query = st.encode([QUERY], prompt_name="query")[0]
    documents = st.encode(DOCUMENTS, prompt_name="document")
    with embed_server.http() as http:
        scored = http.post("/v1/score", json={"model": MODEL, "text_1": QUERY, "text_2": DOCUMENTS}).json()
    np.testing.assert_allclose([d["score"] for d in scored["data"]], documents @ query, atol=ATOL)


def test_embedding_model_refuses_to_generate(embed_server: RunningServer) -> None:
    with embed_server.http() as http:
        chat = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        completion = http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    for response in (chat, completion):
        error = assert_error_shape(response, 400)
        assert "embedding model" in error["message"] and error["code"] == "model_not_supported"


def test_over_long_input_and_truncation(embed_server: RunningServer) -> None:
    ids = list(range(5, 5 + 200))  # the model takes 128 tokens
    with embed_server.http() as http:
        error = assert_error_shape(http.post("/v1/embeddings", json={"model": MODEL, "input": ids}), 400)
        assert error["param"] == "input" and "128" in error["message"]
        cut = http.post("/v1/embeddings", json={"model": MODEL, "input": ids, "truncate_prompt_tokens": 100}).json()
        last = http.post("/v1/embeddings", json={"model": MODEL, "input": ids[-100:]}).json()
        # The same tokens, so the same embedding up to float32 rounding (a loaded CPU's matmul may split its sums
        # over another number of threads from one request to the next).
        assert cut["data"][0]["embedding"] == pytest.approx(last["data"][0]["embedding"], rel=1e-5, abs=1e-6)
        assert cut["usage"]["prompt_tokens"] == 100
        error = assert_error_shape(http.post("/v1/embeddings", json={"model": MODEL, "input": [[]]}), 400)
        assert error["param"] == "input"
        error = assert_error_shape(http.post("/v1/embeddings", json={"model": MODEL, "input": "x",
                                                                     "encoding_format": "int8"}), 400)
        assert error["param"] == "encoding_format"


def test_metrics_count_pooling_requests(embed_server: RunningServer) -> None:
    before = embed_server.wait_idle()
    embed_server.client().embeddings.create(model=MODEL, input=TEXTS[:2])
    after = embed_server.wait_idle()
    stops = "request_success_total{finished_reason=stop}"
    assert after[stops] == before[stops] + 2
    assert after["prompt_tokens_total"] > before["prompt_tokens_total"]
    assert after["num_kv_blocks_used"] == 0


def test_rerank_and_score_equal_the_cross_encoder(cross_server: RunningServer, models: dict[str, Path]) -> None:
    expected = CrossEncoder(str(models["cross"]), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    order = list(np.argsort(-expected))
    documents = [DOCUMENTS[0], {"text": DOCUMENTS[1]}, DOCUMENTS[2]]
    with cross_server.http() as http:
        for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
            ranked = http.post(path, json={"query": QUERY, "documents": documents, "top_n": 2}).json()
            assert [r["index"] for r in ranked["results"]] == order[:2]
            np.testing.assert_allclose([r["relevance_score"] for r in ranked["results"]], expected[order[:2]],
                                       atol=1e-6)
            assert [r["document"]["text"] for r in ranked["results"]] == [DOCUMENTS[i] for i in order[:2]]
            assert ranked["usage"]["total_tokens"] > 0
        bare = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, "return_documents": False})
        assert all("document" not in r for r in bare.json()["results"]) and len(bare.json()["results"]) == 3
        one_to_many = http.post("/v1/score", json={"model": MODEL, "text_1": QUERY, "text_2": DOCUMENTS}).json()
        one_to_one = http.post("/v1/score", json={"text_1": [QUERY] * 3, "text_2": DOCUMENTS}).json()
        webui = http.post("/v1/rerank", json=OPEN_WEBUI_RERANK_BODY).json()
        mismatched = http.post("/v1/score", json={"text_1": [QUERY] * 2, "text_2": DOCUMENTS})
        embeddings = http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
    for answer in (one_to_many, one_to_one):
        assert [d["index"] for d in answer["data"]] == [0, 1, 2] and answer["object"] == "list"
        np.testing.assert_allclose([d["score"] for d in answer["data"]], expected, atol=1e-6)
    by_index = sorted(webui["results"], key=lambda r: r["index"])
    np.testing.assert_allclose([r["relevance_score"] for r in by_index], expected, atol=1e-6)
    assert assert_error_shape(mismatched, 400)["param"] == "text_2"
    assert "cross encoder" in assert_error_shape(embeddings, 400)["message"]


def test_yes_no_reranker(models: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openai_serve.scoring import DEFAULT_INSTRUCTION, YES_NO_PREFIX, YES_NO_SUFFIX

    running = start_server(models["yes_no"], task="score")
    try:
        with running.http() as http:
            ranked = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}).json()
    finally:
        running.stop()
    tokenizer = AutoTokenizer.from_pretrained(models["yes_no"])
    reference = AutoModelForCausalLM.from_pretrained(models["yes_no"], dtype=torch.float32)
    no_id, yes_id = tokenizer.convert_tokens_to_ids("no"), tokenizer.convert_tokens_to_ids("yes")
    expected = []
    for document in DOCUMENTS:
        body = f"<Instruct>: {DEFAULT_INSTRUCTION}\n<Query>: {QUERY}\n<Document>: {document}"
        ids = [i for part in (YES_NO_PREFIX, body, YES_NO_SUFFIX) for i in tokenizer.encode(part,
                                                                                           add_special_tokens=False)]
        with torch.no_grad():
            logits = reference(torch.tensor([ids])).logits[0, -1]
        expected.append(torch.softmax(logits[[no_id, yes_id]], dim=-1)[1].item())
    by_index = sorted(ranked["results"], key=lambda r: r["index"])
    np.testing.assert_allclose([r["relevance_score"] for r in by_index], expected, atol=1e-6)


def test_generation_model_refuses_embeddings(tmp_path_factory: pytest.TempPathFactory) -> None:
    from core.tiny_model import build_tiny_model

    running = start_server(build_tiny_model(tmp_path_factory.mktemp("generator")))
    try:
        with running.http() as http:
            embeddings = http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
            rerank = http.post("/v1/rerank", json={"query": "x", "documents": ["y"]})
    finally:
        running.stop()
    for response in (embeddings, rerank):
        error = assert_error_shape(response, 400)
        assert "generates text" in error["message"] and error["param"] == "model"


def test_embeddings_through_the_engine_process(models: dict[str, Path], embed_server: RunningServer) -> None:
    """The engine in its own process (the default): the pooling model's description and the pooled outputs
    cross its pipe."""
    running = start_server(models["embed"], max_model_len=128, engine_process=True)
    try:
        got = running.client().embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    finally:
        running.stop()
    expected = embed_server.client().embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert [d.embedding for d in got.data] == [d.embedding for d in expected.data]
