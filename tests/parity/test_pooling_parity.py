"""Pooling models against sentence-transformers and transformers on the same tiny random checkpoints
(float32 on a CPU): embeddings (last-token, mean and CLS pooling over a decoder, BERT and ModernBERT),
Matryoshka truncation, a cross-encoder's scores, a yes/no reranker's p(yes); chunked prompts against whole
ones, and a batch of mixed lengths against one prompt at a time."""

from pathlib import Path

import numpy as np
import pytest
import torch

from core import LLM
from core.pooling_model import read_pooling_model
from core.pooling_output import score
from tests.pooling_models import cross_encoder, embedding_model, yes_no_reranker

pytest.importorskip("sentence_transformers")
from sentence_transformers import CrossEncoder, SentenceTransformer  # noqa: E402

TEXTS = ["the quick brown fox jumps over the lazy dog " * 4, "hello world", "what is the capital of france?",
         "a server streams tokens to many clients how are you"]
ATOL = 2e-6  # float32 rounding of vectors of length 1


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pooling-models")


def _llm(model_dir: Path, **settings: object) -> LLM:
    return LLM(str(model_dir), device="cpu", dtype="float32", max_num_seqs=8, **settings)


@pytest.mark.parametrize(("kind", "pooling"), [("qwen3", "lasttoken"), ("qwen3", "mean"), ("bert", "mean"),
                                               ("bert", "cls"), ("modernbert", "mean"), ("modernbert", "cls")])
def test_embeddings_equal_sentence_transformers(root: Path, kind: str, pooling: str) -> None:
    model_dir = embedding_model(root, kind, pooling)
    expected = SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS, prompt_name="query")
    got = np.stack(_llm(model_dir).embed(["query: " + text for text in TEXTS]))
    np.testing.assert_allclose(got, expected, atol=ATOL)
    assert not np.allclose(got[0], got[1], atol=1e-3)  # the vectors are not all one


def test_matryoshka_truncation_then_normalization(root: Path) -> None:
    model_dir = embedding_model(root, "qwen3", "lasttoken")
    st = SentenceTransformer(str(model_dir), device="cpu")
    expected = st.encode(TEXTS, truncate_dim=16, normalize_embeddings=True)
    got = np.stack(_llm(model_dir).embed(TEXTS, dimensions=16))
    np.testing.assert_allclose(got, expected, atol=ATOL)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize(("kind", "pooling"), [("qwen3", "lasttoken"), ("qwen3", "mean"), ("qwen3", "cls")])
def test_chunked_prompts_pool_as_whole_ones(root: Path, kind: str, pooling: str) -> None:
    """A prompt longer than the step's budget (16 tokens) runs in chunks; pooled over them it equals the
    prompt run whole, and sentence-transformers."""
    model_dir = embedding_model(root, kind, pooling)
    long_text = TEXTS[0]
    chunked = _llm(model_dir, max_num_batched_tokens=16, enable_prefix_caching=False)
    assert len(chunked.tokenizer.encode(long_text)) > 3 * 16
    whole = _llm(model_dir, max_num_batched_tokens=256)
    expected = SentenceTransformer(str(model_dir), device="cpu").encode([long_text])[0]
    np.testing.assert_allclose(chunked.embed(long_text)[0], whole.embed(long_text)[0], atol=ATOL)
    np.testing.assert_allclose(chunked.embed(long_text)[0], expected, atol=ATOL)


@pytest.mark.parametrize(("kind", "pooling"), [("bert", "mean"), ("modernbert", "cls"), ("qwen3", "mean")])
def test_mixed_lengths_in_one_batch_equal_one_by_one(root: Path, kind: str, pooling: str) -> None:
    llm = _llm(embedding_model(root, kind, pooling))
    together = np.stack(llm.embed(TEXTS))
    alone = np.stack([llm.embed(text)[0] for text in TEXTS])
    np.testing.assert_allclose(together, alone, atol=ATOL)


def test_last_token_pooling_reuses_the_prefix_cache(root: Path) -> None:
    """Decoder last-token pooling may take a prompt's prefix from the cache: the same vector, with hits."""
    llm = _llm(embedding_model(root, "qwen3", "lasttoken"))
    first = llm.embed(TEXTS[0])[0]
    again = llm.embed(TEXTS[0])[0]
    assert llm.engine.stats().num_prefix_cache_hit_tokens > 0
    np.testing.assert_allclose(again, first, atol=ATOL)


def test_mean_pooling_takes_nothing_from_the_prefix_cache(root: Path) -> None:
    llm = _llm(embedding_model(root, "qwen3", "mean"))
    llm.embed([TEXTS[0], TEXTS[0]])
    llm.embed(TEXTS[0])
    assert llm.engine.stats().num_prefix_cache_hit_tokens == 0


def test_cross_encoder_scores_equal_sentence_transformers(root: Path) -> None:
    model_dir = cross_encoder(root)
    pairs = [("what is the capital of france?", "paris"), ("hello world", "the lazy dog jumps"),
             ("query", "a passage about search and retrieval")]
    expected = CrossEncoder(str(model_dir), device="cpu").predict(pairs)
    model = read_pooling_model(model_dir)
    assert model is not None and model.activation == "sigmoid"
    llm = _llm(model_dir)
    tokenizer = llm.tokenizer
    from core.pooling_params import PoolingParams

    for i, (query, document) in enumerate(pairs):
        encoded = tokenizer(query, document)
        llm.engine.add_request(str(i), encoded["input_ids"], PoolingParams(tuple(encoded["token_type_ids"])))
    outputs = _run(llm)
    got = [score(outputs[str(i)], model) for i in range(len(pairs))]
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert len({round(float(s), 4) for s in got}) == len(pairs)


def test_yes_no_reranker_equals_the_model_card_formula(root: Path) -> None:
    """p(yes) = softmax(logit_no, logit_yes)[yes] at the last token, computed with transformers."""
    from transformers import AutoModelForCausalLM

    from core.pooling_params import PoolingParams

    model_dir = yes_no_reranker(root)
    model = read_pooling_model(model_dir, "score")
    assert model is not None
    llm = _llm(model_dir, task="score")
    no_id, yes_id = (llm.tokenizer.convert_tokens_to_ids(word) for word in ("no", "yes"))
    assert model.pooler.token_ids == (no_id, yes_id)
    prompts = [llm.tokenizer.encode(text) for text in TEXTS]
    for i, prompt in enumerate(prompts):
        llm.engine.add_request(str(i), prompt, PoolingParams())
    outputs = _run(llm)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            logits = reference(torch.tensor([prompt])).logits[0, -1]
        expected = torch.log_softmax(logits[[no_id, yes_id]], dim=-1)[1].exp().item()
        assert score(outputs[str(i)], model) == pytest.approx(expected, abs=1e-6)


def _run(llm: LLM) -> dict[str, np.ndarray]:
    outputs = {}
    while llm.engine.has_unfinished_requests():
        outputs.update((o.request_id, o.pooled) for o in llm.engine.step() if o.pooled is not None)
    return outputs
