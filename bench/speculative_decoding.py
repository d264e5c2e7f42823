"""Speculative decoding against none, on one engine process: batch-1 decode speed per workload, and closed-loop
throughput at several concurrencies.

Workloads, each a chat prompt in the model's template, answered greedily (EOS ignored, `--tokens` new tokens):
- code_edit: a Python file and an edit to make to it (the answer copies most of the file: lookup has material);
- summarize: a passage and a request to summarize it quoting its phrases (some material);
- free_chat: open questions (no material in the prompt).

Contenders: `off` (no speculation), and speculative configs by name: `ngram` (adaptive draft length, the
default), `ngram-fixed` (all `--drafts` drafts every step, as vLLM), `suffix` (adaptive), `draft-self` (the
target as its own draft model, all drafts every step: every draft is accepted, so its speed is the step-cost
model's best case), `mtp` and `mtp-fixed` (the checkpoint's own multi-token-prediction head, adaptive or all
drafts every step), `eagle3` (the EAGLE-3 head `--eagle3-head` names, adaptive). All
contenders are built first, with explicit KV-cache sizes so they share the device; each repetition runs every
contender in turn, so a change in the machine's load falls on all alike.

Batch 1: decode tokens per second from the first new token to the last, per workload and contender; each
contender's tokens are compared with `off`'s (greedy: equal in float32; in bfloat16 verification and decode
run different kernels, so the count of equal outputs is reported, not asserted). Concurrency: for each level c,
c requests in flight (a new one added as one ends) over the mixed workloads until `--requests-per-level` have
finished: output tokens per second of wall time.

    python -m bench.speculative_decoding --model DIR --out result.json
    python -m bench.speculative_decoding --model DIR --contenders off,ngram,ngram-fixed,draft-self --levels 1,16
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

from transformers import AutoTokenizer

from bench.common import write_result
from core import LLMEngine, SamplingParams
from core.config import engine_config
from core.model_files import resolve_model

CODE = '''import csv
from dataclasses import dataclass


@dataclass
class Item:
    name: str
    price: float
    quantity: int


def load_items(path):
    items = []
    with open(path) as f:
        for row in csv.DictReader(f):
            items.append(Item(row["name"], float(row["price"]), int(row["quantity"])))
    return items


def compute_total(items):
    total = 0.0
    for item in items:
        total += item.price * item.quantity
    return total


def most_expensive(items):
    best = None
    for item in items:
        if best is None or item.price > best.price:
            best = item
    return best


def main(path):
    items = load_items(path)
    print("items:", len(items))
    print("total:", compute_total(items))
    print("most expensive:", most_expensive(items).name)
'''

PASSAGE = (
    "The printing press, developed in the fifteenth century, changed how knowledge moved through Europe. Before it, "
    "books were copied by hand, mostly in monasteries, and a single volume could take months to finish. Johannes "
    "Gutenberg combined movable metal type, an oil-based ink and a press adapted from those used for wine, and the "
    "cost of a book fell sharply. Within fifty years, printing shops had opened in more than two hundred cities, and "
    "millions of volumes were in circulation. Scholars could now compare identical copies of a text, which made "
    "errors easier to find and arguments easier to check. Pamphlets spread news and opinion faster than any "
    "authority could control, and the Reformation owed much of its reach to cheap printed sheets. Literacy rose as "
    "books became affordable, and vernacular languages gained standard spellings because printers needed them. "
    "Historians still debate how quickly these changes happened, but few doubt that the printing press was one of "
    "the turning points between the medieval and the modern world."
)

WORKLOADS = {
    "code_edit": [
        f"Here is a Python file:\n\n{CODE}\nRename the function compute_total to sum_prices everywhere and add type "
        "hints to every function. Reply with the whole updated file only.",
        f"Here is a Python file:\n\n{CODE}\nAdd a docstring to every function. Reply with the whole updated file.",
    ],
    "summarize": [
        f"{PASSAGE}\n\nSummarize the passage above in a few sentences, quoting its key phrases word for word.",
        f"{PASSAGE}\n\nList the main claims of the passage above, one per line, in its own words.",
    ],
    "free_chat": [
        "Write a short poem about the sea at night.",
        "What are some good habits for someone learning a new language? Give reasons.",
    ],
}

CONTENDERS = {
    "off": None,
    "ngram": {"method": "ngram", "prompt_lookup_max": 4},
    "ngram-fixed": {"method": "ngram", "prompt_lookup_max": 4, "adaptive": False},
    "suffix": {"method": "suffix"},
    "draft-self": {"method": "draft_model", "adaptive": False},
    "mtp": {"method": "mtp"},  # the checkpoint's multi-token-prediction head (GLM-4-MoE, Qwen3-Next / Qwen3.5)
    "mtp-fixed": {"method": "mtp", "adaptive": False},
    "eagle3": {"method": "eagle3"},  # the head named by --eagle3-head
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.speculative_decoding", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="what openai-serve --model takes")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--contenders", default="off,ngram,ngram-fixed,suffix", help=f"from {','.join(CONTENDERS)}")
    p.add_argument("--drafts", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--tokens", type=int, default=256, help="new tokens per request")
    p.add_argument("--repeats", type=int, default=3, help="batch-1 rounds (each: every prompt, every contender)")
    p.add_argument("--levels", default="1,16,64,256", help="concurrencies; empty: batch 1 only")
    p.add_argument("--requests-per-level", type=int, default=0, help="requests per level (0: 3 x level, >= 32)")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--kv-cache-blocks", type=int, default=16384, help="per contender (a draft model doubles it)")
    p.add_argument("--eagle3-head", default=None, help="contender eagle3: the head's directory (speculators format)")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def build(name: str, args: argparse.Namespace, model_dir: Path) -> LLMEngine:
    spec = CONTENDERS[name]
    if spec is not None:
        spec = {**spec, "num_speculative_tokens": args.drafts}
        if spec["method"] == "draft_model":
            spec["model"] = str(model_dir)
        elif spec["method"] == "eagle3":
            spec["model"] = args.eagle3_head
    return LLMEngine(engine_config(str(model_dir), dtype=args.dtype, device=args.device,
                                   max_model_len=args.max_model_len, max_num_seqs=256, max_num_batched_tokens=8192,
                                   kv_cache_blocks=args.kv_cache_blocks, speculative_config=spec))


def one_request(engine: LLMEngine, request_id: str, prompt: list[int], num_tokens: int) -> tuple[float, list[int]]:
    """(decode seconds from the first new token to the last, the tokens)"""
    engine.add_request(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True))
    tokens: list[int] = []
    first = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens += out.new_token_ids
            if first is None and tokens:
                first = time.perf_counter()
    return time.perf_counter() - (first or time.perf_counter()), tokens


def batch_one(engines: dict[str, LLMEngine], prompts: dict[str, list[list[int]]], args: argparse.Namespace) -> dict:
    seconds = {(n, w): [] for n in engines for w in prompts}
    tokens: dict[tuple[str, str, int], list[int]] = {}
    for r in range(args.repeats):
        for workload, workload_prompts in prompts.items():
            for i, prompt in enumerate(workload_prompts):
                for name, engine in engines.items():
                    s, out = one_request(engine, f"b1-{r}-{workload}-{i}", prompt, args.tokens)
                    seconds[name, workload].append(s)
                    tokens[name, workload, i] = out
    result = {}
    for workload, workload_prompts in prompts.items():
        row = {}
        for name in engines:
            tok_s = (len(workload_prompts) * args.repeats * (args.tokens - 1)) / sum(seconds[name, workload])
            row[name] = {"decode_tok_s": round(tok_s, 1),
                         "median_request_s": round(statistics.median(seconds[name, workload]), 4),
                         "equal_outputs_to_off": sum(tokens[name, workload, i] == tokens["off", workload, i]
                                                     for i in range(len(workload_prompts)))
                         if "off" in engines else None}
        if "off" in engines:
            for name in engines:
                row[name]["speedup"] = round(row[name]["decode_tok_s"] / row["off"]["decode_tok_s"], 3)
        result[workload] = row
    return result


def closed_loop(engine: LLMEngine, prompts: list[list[int]], concurrency: int, num_requests: int,
                num_tokens: int) -> float:
    """Output tokens per second with `concurrency` requests in flight until `num_requests` have finished."""
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    started = finished = num_output = 0
    start = time.perf_counter()
    while finished < num_requests:
        while started - finished < concurrency and started < num_requests:
            engine.add_request(f"c{concurrency}-{started}-{time.monotonic_ns()}", prompts[started % len(prompts)],
                               params)
            started += 1
        for out in engine.step():
            num_output += len(out.new_token_ids)
            finished += out.finish_reason is not None
    return num_output / (time.perf_counter() - start)


def chat_prompt(tokenizer: AutoTokenizer, text: str) -> list[int]:
    if tokenizer.chat_template is None:  # a base model: the text as it is
        return tokenizer.encode(text)
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)


def spec_counts(engine: LLMEngine) -> dict | None:
    stats = engine.stats()
    if not stats.num_spec_accepted_per_position:
        return None
    return {"drafts": stats.num_spec_drafts, "draft_tokens": stats.num_spec_draft_tokens,
            "accepted_tokens": stats.num_spec_accepted_tokens,
            "accepted_per_position": list(stats.num_spec_accepted_per_position)}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    model_dir = resolve_model(args.model, args.dtype, args.device).path
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = {w: [chat_prompt(tokenizer, text) for text in texts] for w, texts in WORKLOADS.items()}
    engines = {name: build(name, args, model_dir) for name in args.contenders.split(",")}
    result: dict[str, object] = {"model": args.model, "dtype": args.dtype, "drafts": args.drafts,
                                 "tokens": args.tokens, "batch_1": batch_one(engines, prompts, args)}
    result["spec_counts_after_batch_1"] = {name: spec_counts(e) for name, e in engines.items()}
    levels = [int(x) for x in args.levels.split(",") if x]
    mixed = [p for workload_prompts in prompts.values() for p in workload_prompts]
    throughput: dict[str, dict[str, float]] = {name: {} for name in engines}
    for level in levels:
        num_requests = args.requests_per_level or max(32, 3 * level)
        for name, engine in engines.items():
            throughput[name][str(level)] = round(closed_loop(engine, mixed, level, num_requests, args.tokens), 1)
    if levels:
        result["throughput_tok_s"] = throughput
        if "off" in engines:
            off = throughput["off"]
            result["throughput_ratio_to_off"] = {name: {lv: round(v / off[lv], 3) for lv, v in t.items()}
                                                 for name, t in throughput.items()}
    result["spec_counts"] = {name: spec_counts(e) for name, e in engines.items()}
    print(write_result(args.out, result, "bench.speculative_decoding", sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
