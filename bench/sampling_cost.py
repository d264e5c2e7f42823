"""What penalties and structured output cost: offline tok/s with a JSON schema on every request, with
penalties and logit_bias on every request, and with neither, on the same shape.

One engine, three timed runs after a short warm-up of each kind:
1. json: every request constrained by SCHEMA (as response_format json_schema would), temperature
   0.6, up to --max-tokens; each request's output length is kept;
2. none: other prompts of the same length, each generating exactly the length its json counterpart
   did (ignore_eos), so both runs produce the same tokens per request and step for step the same
   batch shapes;
3. penalties: as none, with presence 0.5, frequency 0.5, repetition 1.1 and a 16-token logit_bias.
Each run draws its own prompts (a prefix cache cannot carry one run's prompts into the next).

Grammars need a real tokenizer: the model directory is the bench model's weights (bench/bench_model.py,
random Qwen3-0.6B) with the tokenizer of --tokenizer beside them (SmolLM2's 49k byte-level BPE on the GPU
machine; token ids past its vocabulary are never allowed in a constrained row), and that tokenizer's EOS as
the model's, as in a real checkpoint (Qwen3's EOS id, 151645, is no token of a 49k vocabulary: a grammar
compiled to allow it would have to cover 100k ids the tokenizer does not have, which no real model asks).

    python -m bench.sampling_cost --tokenizer DIR --out OUT.json
"""

import argparse
import json
import random
import shutil
import sys
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from bench.bench_model import build_bench_model
from bench.common import kernel_variant, write_result
from core import FinishReason, LLMEngine, SamplingParams
from core.config import engine_config
from core.engine import runner_config
from core.structured_output import StructuredOutput
from core.tokenizer import load_tokenizer
from gpu.runner_factory import make_runner

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                    "required": ["street", "city"]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "address", "active"],
}
TEMPERATURE = 0.6
PENALTIES = dict(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1)
NUM_BIASED_TOKENS = 16  # logit_bias of -1 on this many tokens, from the middle of the vocabulary


def penalties(vocab_size: int) -> dict[str, Any]:
    middle = vocab_size // 2
    return {**PENALTIES, "logit_bias": dict.fromkeys(range(middle, middle + NUM_BIASED_TOKENS), -1.0)}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.sampling_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", required=True, help="a tokenizer directory (tokenizer.json and its config)")
    p.add_argument("--model", default=None, help="weights directory (default: the random Qwen3-0.6B, built once)")
    p.add_argument("--model-dir", default="/tmp/qwen3-0.6b-sampling-cost", help="weights + tokenizer go here")
    p.add_argument("--num-requests", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=256, help="the json run's limit per request")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="auto")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--kv-cache-blocks", type=int, default=None)
    p.add_argument("--warmup-requests", type=int, default=64)
    p.add_argument("--kernels", default="default", help="kernel choices for A/B runs: `default`, or gpu.config."
                   "KernelConfig fields as FIELD=0|1 joined by + (fused_logit_adjustments=0: penalties and "
                   "masks by the torch code)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def model_with_tokenizer(weights_dir: Path, tokenizer_dir: Path, target: Path) -> Path:
    """The weights linked into `target`, the tokenizer's files copied there, and the weights' config.json
    written there with the tokenizer's EOS (their generation_config.json, which names the old one, left out)."""
    target.mkdir(parents=True, exist_ok=True)
    for f in weights_dir.iterdir():
        if f.is_file() and not is_tokenizer_file(f) and f.name not in ("config.json", "generation_config.json"):
            (target / f.name).unlink(missing_ok=True)
            (target / f.name).symlink_to(f.resolve())
    (target / "generation_config.json").unlink(missing_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.is_file() and is_tokenizer_file(f):
            (target / f.name).unlink(missing_ok=True)
            shutil.copy(f, target / f.name)
    config = json.loads((weights_dir / "config.json").read_text())
    eos_token_id = load_tokenizer(str(target)).eos_token_id
    if eos_token_id is not None:
        config["eos_token_id"] = eos_token_id
    (target / "config.json").unlink(missing_ok=True)
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


def is_tokenizer_file(f: Path) -> bool:
    return f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja",
                                                         "vocab.json", "merges.txt")


def prompts(n: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(length)] for _ in range(n)]


def timed_run(engine: LLMEngine, prompt_ids: list[list[int]], params: list[SamplingParams]) -> dict[str, Any]:
    """Generates every request; tok/s = generated tokens / wall time."""
    tokens: dict[str, list[int]] = {}
    reasons: dict[str, FinishReason] = {}
    start = time.perf_counter()
    for i, (p, sp) in enumerate(zip(prompt_ids, params, strict=True)):
        engine.add_request(str(i), p, sp)
        tokens[str(i)] = []
    num_steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            if out.finish_reason is not None:
                reasons[out.request_id] = out.finish_reason
        num_steps += 1
    seconds = time.perf_counter() - start
    lengths = [len(tokens[str(i)]) for i in range(len(prompt_ids))]
    return {"tokens_per_s": round(sum(lengths) / seconds, 1), "seconds": round(seconds, 3),
            "num_output_tokens": sum(lengths), "num_steps": num_steps, "lengths": lengths,
            "finish_reasons": dict(Counter(r.value for r in reasons.values())),
            "_tokens": [tokens[str(i)] for i in range(len(prompt_ids))]}


def json_validity(tokenizer: PreTrainedTokenizerBase, run: dict[str, Any]) -> dict[str, int]:
    """How many outputs parse as JSON: those that ended by EOS must all do."""
    counts: Counter[str] = Counter()
    for token_ids in run["_tokens"]:
        text = tokenizer.decode(token_ids, skip_special_tokens=True)
        try:
            json.loads(text)
            counts["valid"] += 1
        except ValueError:
            counts["invalid"] += 1
    return dict(counts)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    weights = Path(args.model) if args.model else build_bench_model()
    model_dir = model_with_tokenizer(weights, Path(args.tokenizer), Path(args.model_dir))
    config = engine_config(str(model_dir), dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                           kv_cache_blocks=args.kv_cache_blocks, max_num_seqs=args.max_num_seqs,
                           max_num_batched_tokens=args.max_num_batched_tokens)
    kernels = kernel_variant(args.kernels)
    engine = LLMEngine(config, make_runner(replace(runner_config(config), kernels=kernels)))
    tokenizer = load_tokenizer(str(model_dir))
    vocab = len(tokenizer)
    n, length = args.num_requests, args.prompt_len
    schema = StructuredOutput(json_schema=json.dumps(SCHEMA))
    json_params = SamplingParams(temperature=TEMPERATURE, max_tokens=args.max_tokens, structured_output=schema)
    warm = args.warmup_requests
    timed_run(engine, prompts(warm, length, vocab, 10), [json_params] * warm)
    timed_run(engine, prompts(warm, length, vocab, 11), [SamplingParams(temperature=TEMPERATURE, max_tokens=32,
                                                                        ignore_eos=True, **penalties(vocab))] * warm)
    runs: dict[str, dict[str, Any]] = {}
    runs["json"] = timed_run(engine, prompts(n, length, vocab, 1), [json_params] * n)
    runs["json"]["validity"] = json_validity(tokenizer, runs["json"])
    same_lengths = runs["json"]["lengths"]
    for seed, (name, extra) in enumerate([("none", {}), ("penalties", penalties(vocab))], start=2):
        params = [SamplingParams(temperature=TEMPERATURE, max_tokens=m, ignore_eos=True, **extra)
                  for m in same_lengths]
        runs[name] = timed_run(engine, prompts(n, length, vocab, seed), params)
    for run in runs.values():
        del run["_tokens"]
        run["lengths"] = {"mean": round(sum(run["lengths"]) / n, 1), "min": min(run["lengths"]),
                          "max": max(run["lengths"])}
        run["vs_none"] = round(run["tokens_per_s"] / runs["none"]["tokens_per_s"], 4)
    result = {"kind": "sampling_cost", "torch": torch.__version__, "kernels": asdict(kernels), "schema": SCHEMA,
              "penalties": penalties(vocab),
              "config": {k: v for k, v in vars(args).items() if k != "out"}, "runs": runs}
    for name, run in runs.items():
        print(f"{name:10} {run['tokens_per_s']:10.1f} tok/s  x{run['vs_none']:.3f} of none  "
              f"{run['num_output_tokens']} tokens in {run['seconds']:.2f} s, {run['num_steps']} steps, "
              f"{run['finish_reasons']} {run.get('validity', '')}", flush=True)
    if args.out:
        write_result(args.out, result, "bench.sampling_cost", argv)


if __name__ == "__main__":
    main()
