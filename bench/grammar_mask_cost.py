"""What a token mask costs with xgrammar and with llguidance: batch fill of N rows, on this host's CPU.

The choice of grammar engine (issue #11) is made on this figure and on the schema features each
engine supports. Every row runs the same JSON schema through a valid instance, rows staggered so
they sit at different places in it (as a real batch does); each step fills all rows' masks into
one int32 bitmask and then advances every row by its next token. Reported: compile time, mask fill
time per step (median, p90) and per row, for the threads asked for.

    python -m bench.grammar_mask_cost --tokenizer DIR [--rows 256] [--threads 1 2] [--steps 60]
"""

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["street", "city"],
            "additionalProperties": False,
        },
        "score": {"type": "number"},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "address", "score", "active"],
    "additionalProperties": False,
}
INSTANCE = {
    "name": "Ada Lovelace of the Analytical Engine", "age": 36, "role": "admin",
    "tags": ["mathematics", "poetry", "engines", "notes"],
    "address": {"street": "12 St James's Square", "city": "London", "zip": "SW1Y 4JH"},
    "score": 98.25, "active": True,
}


@dataclass(frozen=True)
class Measurement:
    engine: str
    threads: int
    rows: int
    vocab_size: int
    compile_ms: float
    fill_ms_median: float
    fill_ms_p90: float
    fill_us_per_row: float
    advance_ms_median: float


def _instance_tokens(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    return tokenizer.encode(json.dumps(INSTANCE), add_special_tokens=False)


def measure_xgrammar(tokenizer: PreTrainedTokenizerBase, rows: int, threads: int, steps: int) -> Measurement:
    import xgrammar as xgr

    vocab_size = len(tokenizer)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
    begin = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), strict_mode=True)
    compile_ms = 1e3 * (time.perf_counter() - begin)
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
    batch = xgr.BatchGrammarMatcher(max_threads=threads)
    bitmask = xgr.allocate_token_bitmask(rows, vocab_size)

    def fill() -> None:
        batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def advance(token_ids: list[int]) -> None:
        batch.batch_accept_token(matchers, token_ids)

    fill_ms, advance_ms = _run(fill, advance, matchers, _instance_tokens(tokenizer), steps, bitmask)
    return _measurement("xgrammar", threads, rows, vocab_size, compile_ms, fill_ms, advance_ms)


def measure_llguidance(tokenizer: PreTrainedTokenizerBase, rows: int, threads: int, steps: int) -> Measurement:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    vocab_size = len(tokenizer)
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
    begin = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    matchers = [llguidance.LLMatcher(ll_tokenizer, grammar) for _ in range(rows)]
    compile_ms = 1e3 * (time.perf_counter() - begin) / rows  # a matcher is built per row; this is one's cost
    assert not matchers[0].is_error(), matchers[0].get_error()
    executor = llguidance.LLExecutor(num_threads=threads)
    bitmask = llguidance.torch.allocate_token_bitmask(rows, vocab_size)
    indexed = [(m, i) for i, m in enumerate(matchers)]

    def fill() -> None:
        llguidance.torch.fill_next_token_bitmask_par(executor, indexed, bitmask)

    def advance(token_ids: list[int]) -> None:
        executor.consume_token_par(list(zip(matchers, token_ids, strict=True)))

    fill_ms, advance_ms = _run(fill, advance, matchers, _instance_tokens(tokenizer), steps, bitmask)
    return _measurement("llguidance", threads, rows, vocab_size, compile_ms, fill_ms, advance_ms)


def _run(fill: Callable[[], None], advance: Callable[[list[int]], None], matchers: list, tokens: list[int],
         steps: int, bitmask: torch.Tensor) -> tuple[list[float], list[float]]:
    """Row i first takes the instance's first (i mod span) tokens, untimed, so rows sit at different places;
    then each step fills every mask, checks each row's next token is allowed (a broken setup cannot pass
    as fast), and advances every row by it."""
    span = len(tokens) - steps
    assert span > 0, f"the instance has {len(tokens)} tokens: ask for fewer than that many steps"
    offsets = [i % span for i in range(len(matchers))]
    for skip in range(max(offsets)):
        for row, offset in enumerate(offsets):
            if skip < offset:
                advance_one(matchers[row], tokens[skip])
    fill_ms: list[float] = []
    advance_ms: list[float] = []
    words = bitmask.numpy()
    for step in range(steps):
        next_ids = [tokens[offset + step] for offset in offsets]
        begin = time.perf_counter()
        fill()
        fill_ms.append(1e3 * (time.perf_counter() - begin))
        for row, token_id in enumerate(next_ids):
            assert (words[row, token_id // 32] >> (token_id % 32)) & 1, f"row {row}: token {token_id} masked"
        begin = time.perf_counter()
        advance(next_ids)
        advance_ms.append(1e3 * (time.perf_counter() - begin))
    return fill_ms, advance_ms


def advance_one(matcher: object, token_id: int) -> None:
    ok = matcher.accept_token(token_id) if hasattr(matcher, "accept_token") else matcher.consume_token(token_id)
    assert ok, f"token {token_id} refused while placing rows"


def _measurement(engine: str, threads: int, rows: int, vocab_size: int, compile_ms: float,
                 fill_ms: list[float], advance_ms: list[float]) -> Measurement:
    median = statistics.median(fill_ms)
    return Measurement(
        engine=engine, threads=threads, rows=rows, vocab_size=vocab_size, compile_ms=round(compile_ms, 2),
        fill_ms_median=round(median, 3), fill_ms_p90=round(float(np.percentile(fill_ms, 90)), 3),
        fill_us_per_row=round(1e3 * median / rows, 2), advance_ms_median=round(statistics.median(advance_ms), 3),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer directory")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    results = []
    for threads in args.threads:
        for measure in (measure_xgrammar, measure_llguidance):
            result = measure(tokenizer, args.rows, threads, args.steps)
            results.append(asdict(result))
            print(json.dumps(results[-1]))
    print(json.dumps({"cpu": platform.processor() or platform.machine(), "results": results}))


if __name__ == "__main__":
    main()
