"""From a pooling model's raw output (gpu/pooling.py) to what a client gets: an embedding, or a score.

- An embedding is truncated to the `dimensions` asked for (Matryoshka), then L2-normalized when the
  model normalizes: the order of vLLM and of OpenAI's text-embedding-3, so a shortened vector has
  length 1 again.
- A cross-encoder's score is its logit through the model's activation (sentence-transformers'
  CrossEncoder default: sigmoid for one label).
- A yes/no reranker's score is p(yes) = softmax(no, yes)[yes] at the last token (Qwen3-Reranker).
- An embedding model scores a pair by the cosine similarity of its embeddings.
"""

import numpy as np

from core.pooling_model import PoolingModel, ScoreKind


def embedding(pooled: np.ndarray, model: PoolingModel, dimensions: int | None = None) -> np.ndarray:
    vector = pooled[:dimensions] if dimensions is not None else pooled
    if model.normalize:
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)  # as torch's F.normalize (eps 1e-12)
    return vector.astype(np.float32)


def score(pooled: np.ndarray, model: PoolingModel) -> float:
    """A pair's score from the pooled output of its one prompt (cross-encoders, yes/no rerankers)."""
    if model.score_kind is ScoreKind.YES_NO:
        no, yes = (float(x) for x in pooled)
        return float(1.0 / (1.0 + np.exp(no - yes)))  # softmax over (no, yes), yes's share
    logit = float(pooled[0])
    if model.activation == "sigmoid":
        return float(1.0 / (1.0 + np.exp(-logit)))
    if model.activation == "softmax":
        return 1.0  # softmax over one label
    return logit


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    denominator = max(float(np.linalg.norm(a)) * float(np.linalg.norm(b)), 1e-12)
    return float(np.dot(a, b) / denominator)
