"""Logprobs in OpenAI's two shapes (legacy completions and chat), and each token's text and bytes.

A token can be part of a UTF-8 character (byte-level BPE splits emoji and CJK). Its `bytes` are
then the raw bytes it stands for and its text is written `bytes:\\xNN...`, as OpenAI does, rather
than a replacement character. Log-probabilities come from the model's raw distribution; -inf is
reported as -9999.0 (OpenAI's floor) since JSON has no infinity.
"""

import re
from functools import cache

from transformers import PreTrainedTokenizerBase

from core.outputs import TokenLogprobs
from core.text_tracker import TokenLogprob

_LOGPROB_FLOOR = -9999.0
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte tokens


@cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted: the printable stand-ins byte-level BPE uses for bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in printable]
    chars = [chr(b) for b in printable] + [chr(256 + i) for i in range(len(extra))]
    return dict(zip(chars, printable + extra, strict=True))


class TokenTexts:
    """Each token's text and bytes, computed once per token id."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self._cache:
            raw = self._raw_bytes(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            self._cache[token_id] = (text, list(raw))
        return self._cache[token_id]

    def _raw_bytes(self, token_id: int) -> bytes:
        decoded = self._tokenizer.decode([token_id], skip_special_tokens=False)
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            if match := _BYTE_FALLBACK.fullmatch(piece):
                return bytes([int(match.group(1), 16)])
            table = _byte_level_decoder()
            if piece and all(ch in table for ch in piece):
                raw = bytes(table[ch] for ch in piece)
                # Only a byte-level tokenizer decodes the piece exactly as its bytes read.
                if raw.decode("utf-8", errors="replace") == decoded:
                    return raw
        return decoded.encode("utf-8")


def _floor(logprob: float) -> float:
    return max(logprob, _LOGPROB_FLOOR)


def completion_logprobs(entries: list[TokenLogprob], texts: TokenTexts) -> dict[str, object]:
    """Legacy shape; like vLLM, each top_logprobs dict also holds the sampled token."""
    top: list[dict[str, float]] = []
    for entry in entries:
        alternatives = {texts.get(t)[0]: _floor(lp) for t, lp in _top(entry.logprobs)}
        alternatives.setdefault(texts.get(entry.token_id)[0], _floor(entry.logprobs.logprob))
        top.append(alternatives)
    return {
        "tokens": [texts.get(e.token_id)[0] for e in entries],
        "token_logprobs": [_floor(e.logprobs.logprob) for e in entries],
        "top_logprobs": top,
        "text_offset": [e.text_offset for e in entries],
    }


def prompt_logprobs_json(prompt_token_ids: list[int], entries: list[TokenLogprobs | None],
                         texts: TokenTexts) -> list[dict[str, dict[str, object]] | None]:
    """vLLM's `prompt_logprobs`: per prompt token (the first None), its own entry and its top alternatives,
    keyed by token id: {"logprob", "rank", "decoded_token"}."""
    result: list[dict[str, dict[str, object]] | None] = [None]
    for token_id, entry in zip(prompt_token_ids[1:], entries[1:], strict=True):
        assert entry is not None
        item = {str(token_id): _vllm_entry(texts, token_id, entry.logprob, entry.rank)}
        for rank, (top_id, logprob) in enumerate(_top(entry), start=1):
            item.setdefault(str(top_id), _vllm_entry(texts, top_id, logprob, rank))
        result.append(item)
    return result


def echo_logprobs(prompt_token_ids: list[int], entries: list[TokenLogprobs | None], prompt_offsets: list[int],
                  generated: list[TokenLogprob], texts: TokenTexts) -> dict[str, object]:
    """The legacy shape over the echoed prompt and then the generated tokens, as OpenAI's `echo` with
    `logprobs`: the prompt's first token has null logprob and null top_logprobs; the generated tokens'
    text offsets follow the prompt's text (`prompt_offsets[-1]` is its length)."""
    prompt_entries = entries[1:]
    prompt_part = completion_logprobs([TokenLogprob(t, e, o) for t, e, o in zip(  # type: ignore[arg-type]
        prompt_token_ids[1:], prompt_entries, prompt_offsets[1:-1], strict=True)], texts)
    generated_part = completion_logprobs(
        [TokenLogprob(e.token_id, e.logprobs, e.text_offset + prompt_offsets[-1]) for e in generated], texts)
    return {
        "tokens": [texts.get(prompt_token_ids[0])[0], *prompt_part["tokens"], *generated_part["tokens"]],
        "token_logprobs": [None, *prompt_part["token_logprobs"], *generated_part["token_logprobs"]],
        "top_logprobs": [None, *prompt_part["top_logprobs"], *generated_part["top_logprobs"]],
        "text_offset": [0, *prompt_part["text_offset"], *generated_part["text_offset"]],
    }


def _vllm_entry(texts: TokenTexts, token_id: int, logprob: float, rank: int) -> dict[str, object]:
    return {"logprob": _floor(logprob), "rank": rank, "decoded_token": texts.get(token_id)[0]}


def chat_logprobs(entries: list[TokenLogprob], texts: TokenTexts) -> dict[str, object]:
    content = []
    for entry in entries:
        item = _chat_token(texts, entry.token_id, entry.logprobs.logprob)
        item["top_logprobs"] = [_chat_token(texts, t, lp) for t, lp in _top(entry.logprobs)]
        content.append(item)
    return {"content": content, "refusal": None}


def _chat_token(texts: TokenTexts, token_id: int, logprob: float) -> dict[str, object]:
    text, raw = texts.get(token_id)
    return {"token": text, "logprob": _floor(logprob), "bytes": raw}


def _top(logprobs: TokenLogprobs) -> list[tuple[int, float]]:
    return list(zip(logprobs.top_token_ids, logprobs.top_logprobs, strict=True))
