"""Structured output through xgrammar: checking a constraint, compiling it against the model's
vocabulary, and each sequence's matcher and token masks.

Why xgrammar rather than llguidance: it fills a full batch's token masks several times faster
(docs/performance.md), and the engine fills them every step while the device runs. Both took every
schema feature we tried except
that llguidance refuses `not`, `if`/`then`/`else` and `uniqueItems` outright, while xgrammar
accepts them and does not enforce them: `check` refuses those keywords here, so nothing a schema
asks is silently dropped.

- `check` (any thread, milliseconds, no vocabulary needed): builds the grammar, raising
  StructuredOutputError with the engine's reason; the front ends run it on every request, so a
  checked constraint always compiles.
- `Grammars` (engine thread): compiles each constraint once (cached) on a worker thread, off the
  engine's step, makes a matcher per sequence, and books a step's tokens and fills its masks in one
  batched call each.
Masks cover the tokenizer's own vocabulary (and the stop ids), not the model's padded one: ids past
the tokenizer's are never allowed in a constrained row (the runner disallows everything past a
mask's words; `fill` clears the last word's bits past the mask's ids, which xgrammar may set).
xgrammar treats every id between the two as a special token that each fill clears and each
accepted token is searched for one at a time, which made a row's fill and accept an order of
magnitude slower.
Compiled JSON follows xgrammar's strict mode (as vLLM does): properties a schema does not list are
not generated, so every output is also an instance of the schema as written.
"""

import json
import re
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache

import numpy as np
import xgrammar as xgr

from core.structured_output import StructuredOutput, StructuredOutputError

# Keywords xgrammar 0.2.8 compiles without enforcing (outputs that break them were accepted when tried).
UNENFORCED_KEYWORDS = frozenset({"not", "if", "then", "else", "uniqueItems", "dependentSchemas"})
_ANY_OBJECT_SCHEMA = '{"type": "object"}'
_LENGTH_BOUNDED_CHARS = r'[^\"\\\r\n]'  # as xgrammar writes it in EBNF
_JSON_STRING_CHARS = r'[^\0-\x1f\"\\]'
_MAX_CACHED_GRAMMARS = 256


def check(constraint: StructuredOutput) -> None:
    """Raises StructuredOutputError (naming the request's field) when the constraint cannot be compiled."""
    _checked(constraint)


@lru_cache(maxsize=1024)  # a client usually sends the same few schemas again and again
def _checked(constraint: StructuredOutput) -> None:
    if constraint.json_schema is not None:
        _check_keywords(constraint)
    _grammar(constraint)


def _grammar(constraint: StructuredOutput) -> xgr.Grammar:
    try:
        if constraint.json_schema is not None:
            return _json(constraint.json_schema, strict_mode=True)
        if constraint.json_object:
            return _json(_ANY_OBJECT_SCHEMA, strict_mode=False)
        if constraint.regex is not None:
            return xgr.Grammar.from_regex(constraint.regex)
        if constraint.choice is not None:
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(c) for c in constraint.choice))
        if constraint.structural_tag is not None:
            return xgr.Grammar.from_structural_tag(constraint.structural_tag)
        assert constraint.grammar is not None
        return xgr.Grammar.from_ebnf(constraint.grammar)
    except (RuntimeError, ValueError) as exc:  # xgrammar's errors, and its invalid structural tags
        raise StructuredOutputError(constraint.param, _reason(exc)) from exc


def _json(schema: str, strict_mode: bool) -> xgr.Grammar:
    # JSON in json.dumps's layout ({"a": 1, "b": [2, 3]}), not any whitespace anywhere (vLLM's default):
    # with free whitespace, small models (and random weights) pad between tokens until max_tokens.
    return _json_strings_fixed(xgr.Grammar.from_json_schema(schema, strict_mode=strict_mode, any_whitespace=False))


def _json_strings_fixed(grammar: xgr.Grammar) -> xgr.Grammar:
    """xgrammar 0.2.8 lets any character but quote, backslash, CR and LF into a string with minLength or
    maxLength, so raw control characters (invalid in JSON) got through: they are excluded here, as xgrammar
    does in its other JSON strings."""
    text = str(grammar)
    fixed = text.replace(_LENGTH_BOUNDED_CHARS, _JSON_STRING_CHARS)
    return grammar if fixed == text else xgr.Grammar.from_ebnf(fixed)


def grammar_vocab_size(tokenizer: object, model_vocab_size: int, stop_token_ids: Sequence[int]) -> int:
    """The ids a mask covers: the tokenizer's (as xgrammar counts them), the stop ids too, at most the model's."""
    vocab = tokenizer.get_vocab()  # type: ignore[attr-defined]
    tokenizer_size = max(len(vocab), max(vocab.values(), default=-1) + 1, max(stop_token_ids, default=-1) + 1)
    return min(tokenizer_size, model_vocab_size)


def _check_keywords(constraint: StructuredOutput) -> None:
    try:
        schema = json.loads(constraint.json_schema or "")
    except json.JSONDecodeError as exc:
        raise StructuredOutputError(constraint.param, f"the JSON schema is not valid JSON: {exc}") from exc
    for path, keyword in _keywords(schema, "#"):
        if keyword in UNENFORCED_KEYWORDS:
            raise StructuredOutputError(constraint.param, f"the JSON schema keyword '{keyword}' (at {path}) is not "
                                        "supported by this server's grammar engine")


def _keywords(node: object, path: str) -> Iterator[tuple[str, str]]:
    """(path, key) of every schema keyword; property names under `properties` and `$defs` are not keywords."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _keywords(item, f"{path}/{i}")
    elif isinstance(node, dict):
        for key, value in node.items():
            yield path, key
            if key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas") and \
                    isinstance(value, dict):
                for name, sub in value.items():
                    yield from _keywords(sub, f"{path}/{key}/{name}")
            elif key not in ("enum", "const", "default", "examples", "required"):
                yield from _keywords(value, f"{path}/{key}")


def _reason(exc: RuntimeError) -> str:
    """xgrammar's message without its log prefix ("[12:00:00] /project/cpp/x.cc:83: ")."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", message)


class Grammars:
    """The engine's structured-output state: compiled grammars (cached) and batched mask fills."""

    def __init__(self, tokenizer: object, vocab_size: int, stop_token_ids: Sequence[int], max_rows: int) -> None:
        mask_vocab_size = grammar_vocab_size(tokenizer, vocab_size, stop_token_ids)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=mask_vocab_size,
                                                  stop_token_ids=list(stop_token_ids))
        self._compiler = xgr.GrammarCompiler(info, cache_enabled=False)  # cached below, by constraint
        self._compiled: OrderedDict[StructuredOutput, Future[xgr.CompiledGrammar]] = OrderedDict()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
        self._batch = xgr.BatchGrammarMatcher()
        self._bitmask = xgr.allocate_token_bitmask(max_rows, mask_vocab_size)  # [max_rows, words] int32, reused
        # The last word's bits of ids in the mask's vocabulary (None: all 32, a multiple of 32 ids). xgrammar sets
        # the others in a row it fills as "every bit, then clear the refused ones": ids it never saw, left open.
        used = mask_vocab_size % 32
        self._last_word_bits = (1 << used) - 1 if used else None  # < 2**31: an int32

    def compile(self, constraint: StructuredOutput) -> Future[xgr.CompiledGrammar]:
        """The compiled grammar, compiled at most once per constraint on the worker thread."""
        future = self._compiled.get(constraint)
        if future is None or (future.done() and future.exception() is not None):
            future = self._worker.submit(self._compile, constraint)
            self._compiled[constraint] = future
            while len(self._compiled) > _MAX_CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(constraint)
        return future

    def _compile(self, constraint: StructuredOutput) -> xgr.CompiledGrammar:
        return self._compiler.compile_grammar(_grammar(constraint))

    @staticmethod
    def matcher(compiled: xgr.CompiledGrammar) -> xgr.GrammarMatcher:
        return xgr.GrammarMatcher(compiled)

    @staticmethod
    def accept(matchers: list[xgr.GrammarMatcher], token_ids: list[int]) -> list[bool]:
        """Each matcher takes its token (one call for the step); False where its grammar refuses it."""
        return [bool(a) for a in xgr.BatchGrammarMatcher.batch_accept_token(matchers, token_ids)]

    def fill(self, matchers: Sequence[xgr.GrammarMatcher | None]) -> np.ndarray:
        """[len(matchers), words] int32 masks, one row per matcher; None (a row whose sequence has ended,
        its token to be dropped) allows every token of the mask. A live row's fill writes all its words. No row
        allows an id past the mask's vocabulary."""
        bitmask = self._bitmask[: len(matchers)]
        live = [i for i, m in enumerate(matchers) if m is not None]
        if len(live) < len(matchers):
            bitmask[[i for i, m in enumerate(matchers) if m is None]] = -1
        if live:
            self._batch.batch_fill_next_token_bitmask([matchers[i] for i in live], self._bitmask, indices=live)
        if self._last_word_bits is not None:
            bitmask[:, -1] &= self._last_word_bits
        return bitmask.numpy()

    def fill_along_drafts(self, matchers: Sequence[xgr.GrammarMatcher | None], drafts: Sequence[list[int]]
                          ) -> np.ndarray:
        """Speculative decoding: for each matcher, the masks of its d + 1 verified positions (d = its draft's
        length), row after row: position j's is the mask after the first j draft tokens, which its grammar
        accepts (core/speculation.py checks them). Each matcher is back where it was afterwards."""
        starts = np.cumsum([0] + [len(d) + 1 for d in drafts])
        bitmask = self._bitmask[: int(starts[-1])]
        for i, matcher in enumerate(matchers):
            if matcher is None:
                bitmask[int(starts[i]) : int(starts[i + 1])] = -1
        for j in range(max(len(d) for d in drafts) + 1):
            live = [i for i, m in enumerate(matchers) if m is not None and len(drafts[i]) >= j]
            if not live:
                break
            self._batch.batch_fill_next_token_bitmask([matchers[i] for i in live], self._bitmask,
                                                      indices=[int(starts[i]) + j for i in live])
            for i in live:
                if j < len(drafts[i]):
                    is_accepted = matchers[i].accept_token(drafts[i][j])  # type: ignore[union-attr]
                    assert is_accepted, "a draft token its grammar refuses"
        for i, matcher in enumerate(matchers):
            if matcher is not None and drafts[i]:
                matcher.rollback(len(drafts[i]))
        if self._last_word_bits is not None:
            bitmask[:, -1] &= self._last_word_bits
        return bitmask.numpy()

    @staticmethod
    def grammatical_prefix(matcher: xgr.GrammarMatcher, token_ids: list[int]) -> int:
        """How many leading tokens the grammar accepts; the matcher is back where it was afterwards."""
        num_accepted = 0
        for token_id in token_ids:
            if not matcher.accept_token(token_id):
                break
            num_accepted += 1
        if num_accepted:
            matcher.rollback(num_accepted)
        return num_accepted

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
