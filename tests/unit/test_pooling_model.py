"""What a checkpoint's files say about pooling (core/pooling_model.py): sentence-transformers' pooling in its old
and new spellings, normalization, prompts, limits, a CrossEncoder's activation; and the refusals."""

import json
from pathlib import Path

import pytest

from core.pooling_model import ScoreKind, read_pooling_model
from core.tiny_model import build_tiny_model
from gpu.pooling import PoolerHead, PoolingMethod


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("decoder"))


def _with_st_files(directory: Path, pooling: dict, normalize: bool = True, **st_config: object) -> Path:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (directory / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 100}))
    return directory


def test_a_decoder_generates_unless_asked(decoder: Path) -> None:
    assert read_pooling_model(decoder) is None
    embed = read_pooling_model(decoder, "embed")
    assert embed is not None and embed.pooler.method is PoolingMethod.LAST and embed.normalize
    assert embed.score_kind is ScoreKind.COSINE and not embed.is_encoder


def test_a_decoder_without_yes_and_no_tokens_cannot_score(decoder: Path) -> None:
    with pytest.raises(ValueError, match='"no" and "yes"'):
        read_pooling_model(decoder, "score")


def test_old_sentence_transformers_pooling_flags(decoder: Path, tmp_path: Path) -> None:
    directory = build_tiny_model(tmp_path / "m")
    _with_st_files(directory, {"word_embedding_dimension": 64, "pooling_mode_cls_token": False,
                               "pooling_mode_mean_tokens": False, "pooling_mode_lasttoken": True,
                               "include_prompt": True}, prompts={"query": "Instruct: x\nQuery:"},
                   default_prompt_name="query")
    model = read_pooling_model(directory)
    assert model is not None and model.embeds
    assert model.pooler.method is PoolingMethod.LAST and model.pooler.head is PoolerHead.EMBED
    assert model.prompt_texts == {"query": "Instruct: x\nQuery:"} and model.default_prompt_name == "query"
    assert model.max_model_len == 100 and not model.is_matryoshka


@pytest.mark.parametrize(("pooling", "error"), [
    ({"pooling_mode": "max"}, "pooling max"),
    ({"pooling_mode": "mean", "include_prompt": False}, "include_prompt"),
    ({"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}, "pooling"),
])
def test_unsupported_pooling_is_refused(tmp_path: Path, pooling: dict, error: str) -> None:
    directory = _with_st_files(build_tiny_model(tmp_path / "m"), pooling)
    with pytest.raises(ValueError, match=error):
        read_pooling_model(directory)


def test_unknown_modules_are_refused(tmp_path: Path) -> None:
    directory = _with_st_files(build_tiny_model(tmp_path / "m"), {"pooling_mode": "mean"})
    modules = json.loads((directory / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (directory / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="Dense"):
        read_pooling_model(directory)


def test_message_format_is_refused(tmp_path: Path) -> None:
    directory = _with_st_files(build_tiny_model(tmp_path / "m"), {"pooling_mode": "mean"}, normalize=False)
    (directory / "sentence_bert_config.json").write_text(json.dumps({"modality_config": {"message": {}}}))
    with pytest.raises(ValueError, match="message format"):
        read_pooling_model(directory)


def test_generating_an_encoder_is_refused(tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(tmp_path)
    model = read_pooling_model(tmp_path)
    assert model is not None and model.is_encoder and model.pooler.method is PoolingMethod.MEAN
    with pytest.raises(ValueError, match="does not generate"):
        read_pooling_model(tmp_path, "generate")
