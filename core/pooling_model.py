"""What a pooling model is (embeddings or scores), read once from its checkpoint directory.

The task: `--task embed|score` (vLLM's older spelling; its newer one is `--runner pooling --convert
embed|classify`), or with `auto` what the checkpoint says: a sentence-transformers model
(`modules.json`) embeds, a sentence-transformers CrossEncoder or a `*ForSequenceClassification`
scores, a bare encoder or decoder (`BertModel`, `Qwen3Model`) embeds; anything else generates.

From the sentence-transformers files, as sentence-transformers applies them: the pooling method
(`1_Pooling/config.json`, both its old and new spellings), normalization (a `Normalize` module),
the longest input (`max_seq_length`), the prompts and the default one (`config_sentence_transformers.json`),
a CrossEncoder's activation. Anything else there that would change the output (a `Dense` module,
pooling that leaves the prompt out) is refused at start, never ignored. Without those files the
defaults are vLLM's: decoders pool their last token, encoders (as sentence-transformers does for a
plain checkpoint) the mean, and embeddings are normalized.

Scores: a cross-encoder's classifier logit through its activation; a decoder asked to score (a
Qwen3-Reranker) gives p(yes) from its "no" and "yes" logits at the last token; an embedding model
scores by cosine similarity, as vLLM's score API.
"""

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpu.model_info import load_hf_config
from gpu.models import MODEL_CLASSES, POOLING_MODEL_CLASSES
from gpu.pooling import Pooler, PoolerHead, PoolingMethod

ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity", "Softmax": "softmax"}
_ST_POOLING_MODES = {"lasttoken": PoolingMethod.LAST, "mean": PoolingMethod.MEAN, "cls": PoolingMethod.CLS}
# Position sentinels tokenizers write when they know no limit.
_NO_LIMIT = 10**7


class ScoreKind(StrEnum):
    CROSS_ENCODER = "cross_encoder"  # a classifier head on the text pair
    YES_NO = "yes_no"  # p("yes") against "no" at the last token of a formatted prompt (Qwen3-Reranker)
    COSINE = "cosine"  # the cosine similarity of the two texts' embeddings


@dataclass(frozen=True)
class PoolingModel:
    task: str  # embed | score
    pooler: Pooler
    is_encoder: bool  # bidirectional: a prompt runs whole in one step, no KV cache
    max_model_len: int  # the longest input the model takes
    score_kind: ScoreKind
    normalize: bool = True  # embeddings are L2-normalized
    is_matryoshka: bool = False  # `dimensions` may shorten an embedding
    matryoshka_dimensions: tuple[int, ...] | None = None  # the lengths it may take (None: any)
    prompts: tuple[tuple[str, str], ...] = ()  # (name, text prefixed to the input)
    default_prompt_name: str | None = None
    activation: str = "sigmoid"  # a cross-encoder's logit -> score
    uses_token_types: bool = False  # pairs carry segment ids (BERT)
    hidden_size: int = 0

    @property
    def prompt_texts(self) -> dict[str, str]:
        return dict(self.prompts)

    @property
    def embeds(self) -> bool:
        return self.task == "embed"


def read_pooling_model(model_dir: str | Path, task: str = "auto") -> PoolingModel | None:
    """The model's pooling, or None when it generates."""
    directory = Path(model_dir)
    config = load_hf_config(directory)
    architecture = next(iter(config.architectures or []), "")
    st_config = _json(directory / "config_sentence_transformers.json")
    has_st = (directory / "modules.json").exists()
    is_classifier = architecture.endswith("ForSequenceClassification")
    if task == "auto":
        task = _auto_task(architecture, has_st, is_classifier, st_config)
    if task == "generate":
        if architecture not in MODEL_CLASSES:
            raise ValueError(f"{architecture} does not generate: serve it with --task embed or --task score")
        return None
    pooling_class = POOLING_MODEL_CLASSES.get(architecture)
    is_encoder = bool(getattr(pooling_class, "is_encoder", False))
    limit = _max_model_len(directory, config, has_st)
    common = {"is_encoder": is_encoder, "max_model_len": limit, "hidden_size": config.hidden_size,
              "uses_token_types": getattr(config, "type_vocab_size", 1) > 1 and is_encoder}
    if task == "score" and is_classifier:
        return PoolingModel("score", Pooler(_classifier_pooling(config), PoolerHead.CLASSIFY), **common,
                            score_kind=ScoreKind.CROSS_ENCODER, activation=_activation(config, st_config))
    if task == "score" and architecture in MODEL_CLASSES:
        return PoolingModel("score", Pooler(PoolingMethod.LAST, PoolerHead.TOKEN_LOGITS, _yes_no_ids(directory)),
                            **common, score_kind=ScoreKind.YES_NO)
    if task not in ("embed", "score") or is_classifier:
        raise ValueError(f"--task {task} is not for {architecture or 'this model'}")
    method, normalize = _st_pooling(directory) if has_st else (
        PoolingMethod.MEAN if is_encoder else PoolingMethod.LAST, True)
    return PoolingModel(
        "embed", Pooler(method), **common, score_kind=ScoreKind.COSINE, normalize=normalize,
        is_matryoshka=bool(_either(config, st_config, "is_matryoshka") or _either(config, st_config,
                                                                                    "matryoshka_dimensions")),
        matryoshka_dimensions=_dimensions(_either(config, st_config, "matryoshka_dimensions")),
        prompts=tuple((st_config.get("prompts") or {}).items()),
        default_prompt_name=st_config.get("default_prompt_name"),
    )


def _auto_task(architecture: str, has_st: bool, is_classifier: bool, st_config: dict[str, Any]) -> str:
    if is_classifier or st_config.get("model_type") == "CrossEncoder":
        return "score"
    if has_st or architecture in POOLING_MODEL_CLASSES:
        return "embed"
    return "generate"


def _st_pooling(directory: Path) -> tuple[PoolingMethod, bool]:
    """(pooling method, normalized) from sentence-transformers' modules; an unsupported module is an error."""
    if "message" in (_json(directory / "sentence_bert_config.json").get("modality_config") or {}):
        # sentence-transformers 6 then renders text inputs through the chat template as user messages.
        raise ValueError("sentence-transformers' message format (texts rendered through the chat template) is not "
                         "supported")
    method, normalize = None, False
    for module in json.loads((directory / "modules.json").read_text()):
        kind = module["type"].rsplit(".", 1)[-1]
        if kind == "Pooling":
            method = _pooling_method(_json(directory / module["path"] / "config.json"))
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise ValueError(f"the sentence-transformers module {module['type']} is not supported")
    if method is None:
        raise ValueError("the sentence-transformers model has no Pooling module")
    return method, normalize


def _pooling_method(pooling: dict[str, Any]) -> PoolingMethod:
    if pooling.get("include_prompt") is False:
        raise ValueError("pooling that leaves the prompt out (include_prompt false) is not supported")
    mode = pooling.get("pooling_mode")  # sentence-transformers 6; older ones set one pooling_mode_X flag
    if mode is None:
        flags = {"lasttoken": "pooling_mode_lasttoken", "mean": "pooling_mode_mean_tokens",
                 "cls": "pooling_mode_cls_token"}
        chosen = [name for name, key in flags.items() if pooling.get(key)]
        others = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v and k not in flags.values()]
        mode = chosen[0] if len(chosen) == 1 and not others else f"{chosen + others}"
    if mode not in _ST_POOLING_MODES:
        raise ValueError(f"pooling {mode} is not supported (supported: last token, mean, cls)")
    return _ST_POOLING_MODES[mode]


def _classifier_pooling(config: Any) -> PoolingMethod:
    """transformers' classifiers take the first token's state, but ModernBERT's may take the mean."""
    return PoolingMethod.MEAN if getattr(config, "classifier_pooling", "cls") == "mean" else PoolingMethod.CLS


def _activation(config: Any, st_config: dict[str, Any]) -> str:
    """What sentence-transformers' CrossEncoder applies to the logit by default."""
    if config.num_labels != 1:
        raise ValueError(f"a score model has one label; this one has {config.num_labels}")
    name = st_config.get("activation_fn") or (getattr(config, "sentence_transformers", None) or {}).get(
        "activation_fn") or "Sigmoid"
    short = name.rsplit(".", 1)[-1]
    if short not in ACTIVATIONS:
        raise ValueError(f"the CrossEncoder activation {name} is not supported")
    return ACTIVATIONS[short]


def _yes_no_ids(directory: Path) -> tuple[int, int]:
    """The ids of the tokens "no" and "yes" (Qwen3-Reranker's answer tokens), in that order."""
    from core.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(directory))
    ids = tuple(tokenizer.convert_tokens_to_ids(word) for word in ("no", "yes"))
    if any(not isinstance(i, int) or i == tokenizer.unk_token_id for i in ids):
        raise ValueError('a decoder scores from its "no" and "yes" tokens, which this tokenizer lacks')
    return ids  # type: ignore[return-value]


def _max_model_len(directory: Path, config: Any, has_st: bool) -> int:
    limit = getattr(config, "max_position_embeddings", 4096)
    if config.model_type in ("roberta", "xlm-roberta"):
        limit -= config.pad_token_id + 1  # positions start after the padding id
    if has_st:  # sentence-transformers truncates there: longer inputs were never what the model was made for
        st_limit = _json(directory / "sentence_bert_config.json").get("max_seq_length") or _json(
            directory / "tokenizer_config.json").get("model_max_length")
        if isinstance(st_limit, int) and 0 < st_limit < _NO_LIMIT:
            limit = min(limit, st_limit)
    return limit


def _either(config: Any, st_config: dict[str, Any], key: str) -> Any:
    return getattr(config, key, None) or st_config.get(key)


def _dimensions(value: Any) -> tuple[int, ...] | None:
    return tuple(int(d) for d in value) if isinstance(value, list) and value else None


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}
