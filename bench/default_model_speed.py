"""Batch-1 decode speed of the default model (SmolLM2-135M-Instruct), or of another model such as Gemma 3 270M:
ours beside transformers and llama.cpp.

One request at a time, greedy, a chat prompt ("What is the capital of France?" in the model's chat template),
`--tokens` new tokens (EOS ignored): the speed a single user sees. Every contender is built first, in this one process
(so all use the same threads); then each repetition runs one request of each contender in turn, so a change in the
machine's load falls on all of them alike. Decode speed is timed from the first new token to the last: ours by the
engine step that returns each token, transformers' by a logits processor that notes when each token's logits are
ready, llama.cpp's by its stream. The whole request's speed (prefill included) is reported beside it, the process's
CPU time per token of a whole request (what a loaded machine's wall clock hides), and the load average before and
after.

    python -m bench.default_model_speed --out result.json
    python -m bench.default_model_speed --ours auto,float32:cpu_packed_weights=0+fused_kernels=0 --peers float32
    python -m bench.default_model_speed --device cuda --ours bfloat16 --peers bfloat16 --random-weights /tmp/smollm2
    python -m bench.default_model_speed --model gemma-3-270m --out result.json

A contender of ours is a dtype (`auto` is the engine's default), optionally with a kernel variant after a colon
(bench.common.kernel_variant: `float32:cpu_packed_weights=0+fused_kernels=0` is the float32 reference, the weights
as loaded and the torch layers); a peer is transformers in a dtype. `--model` takes what `openai-serve --model` takes
(a checkpoint directory, a .gguf file, a built-in name such as gemma-3-270m); where the model comes from a GGUF file,
llama.cpp runs that file as it ships, where llama-cpp-python is installed (`--llama-cpp` off turns it off). A model
without a chat template (a base model) is asked the question as plain text. A CPU run records the CPU's model name and
instruction flags, and which CPU kernels each of ours ran; every run its thread count and the OpenMP variables set
(OMP_WAIT_POLICY=PASSIVE: threads that sleep at a barrier instead of spinning, which a machine whose cores other
processes share needs). The timed requests run with the start-up objects frozen, as
in a served engine (core/startup_gc.py). `--random-weights DIR` builds a random checkpoint of the default model's
shape in DIR, where the model cannot be fetched (random weights lie on no GGUF grid, so a CPU would not pack them as
the real model's).
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Protocol

import torch

from bench.bench_model import SHAPES, build_random_checkpoint
from bench.common import kernel_variant, write_result
from bench.engine_runs import build_engine, startup_objects_frozen
from core import SamplingParams
from core.config import engine_config
from core.model_files import resolve_model
from core.model_files.cache import DEFAULT_CACHE_DIR
from core.model_files.default_model import SMOLLM2
from core.model_files.resolve import BUILTIN_GGUFS
from core.model_files.wheel_gguf import fetch_gguf
from gpu.layers.int8_dot_linear import Int8DotProduct
from gpu.model_runner import ModelRunner

QUESTION = "What is the capital of France?"
# How the OpenMP threads of every contender (torch's, our C kernels', llama.cpp's) run and wait: recorded where set.
OPENMP_ENVIRONMENT = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_PROC_BIND")


class Contender(Protocol):
    name: str

    def request(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        """(seconds from the first new token to the last, seconds for the whole request)"""
        ...


class Ours:
    def __init__(self, model_dir: Path, device: str, spec: str) -> None:
        """spec: DTYPE or DTYPE:VARIANT (a kernel variant, bench.common.kernel_variant)."""
        dtype, _, variant = spec.partition(":")
        config = engine_config(str(model_dir), device=device, dtype=dtype, max_model_len=2048, kv_cache_blocks=256,
                               max_num_seqs=8, max_num_batched_tokens=2048)
        self.engine = build_engine(config, kernel_variant(variant or "default"))
        runner = self.engine.runner
        self.name = f"openai-serve {spec} ({str(runner.dtype).removeprefix('torch.')})"
        self.kernels = cpu_kernels_run(runner) if device == "cpu" else None
        self._count = 0

    def request(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        self._count += 1
        params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
        start = time.perf_counter()
        self.engine.add_request(str(self._count), prompt, params)
        first = None
        while self.engine.has_unfinished_requests():
            if self.engine.step() and first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        return end - (first or start), end - start


class Transformers:
    def __init__(self, model_dir: Path, device: str, dtype: str) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
        self.device = torch.device(device)
        self.name = f"transformers {dtype}"

    def request(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        from transformers import LogitsProcessorList

        stamps: list[float] = []

        def note_time(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            stamps.append(time.perf_counter())
            return scores

        start = time.perf_counter()
        with torch.no_grad():
            self.model.generate(torch.tensor([prompt], device=self.device), max_new_tokens=num_tokens,
                                min_new_tokens=num_tokens, do_sample=False,
                                logits_processor=LogitsProcessorList([note_time]))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        end = time.perf_counter()
        return end - stamps[0], end - start


class LlamaCpp:
    """llama.cpp (llama-cpp-python) on a GGUF file, greedy, its EOS banned so that it makes every token asked for."""

    def __init__(self, gguf: Path) -> None:
        from llama_cpp import Llama

        self.model = Llama(model_path=str(gguf), n_ctx=2048, n_threads=torch.get_num_threads(), verbose=False)
        self.name = f"llama.cpp ({gguf.name})"

    def request(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        self.model.reset()  # no prefix carried over from the previous request
        start, first = time.perf_counter(), None
        for _ in self.model.create_completion(prompt, max_tokens=num_tokens, temperature=0.0, stream=True,
                                              logit_bias={self.model.token_eos(): float("-inf")}):
            first = first or time.perf_counter()
        end = time.perf_counter()
        return end - (first or start), end - start


def model_gguf(model: str | None) -> Path | None:
    """The GGUF file `--model` comes from (the default model's, a built-in one's, a .gguf path), or None."""
    if model is None or model in BUILTIN_GGUFS:
        return fetch_gguf(BUILTIN_GGUFS[model] if model else SMOLLM2, DEFAULT_CACHE_DIR)
    return Path(model) if model.endswith(".gguf") else None


def cpu_kernels_run(runner: ModelRunner) -> dict[str, object]:
    """Which CPU kernels a runner of ours took: the int8 dot products' instruction set where some weight went through
    them (else None), whether attention had its C kernels, whether decode steps ran as C kernel calls per layer."""
    int8_dot = runner.cpu_kernels.int8_dot
    packed = any(isinstance(getattr(m, "packed", None), Int8DotProduct) for m in runner.model.modules())
    return {"int8_dot": int8_dot.ISA if packed and int8_dot is not None else None,
            "attention": runner.config.kernels.fused_kernels and runner.cpu_kernels.attention is not None,
            "decode_steps": runner.cpu_decode is not None}


def llama_cpp(args: argparse.Namespace) -> list[Contender]:
    """llama.cpp on the model's GGUF file, on a CPU, where llama-cpp-python is installed."""
    if args.llama_cpp == "off" or args.random_weights or args.device != "cpu":
        return []
    gguf = model_gguf(args.model)
    return [LlamaCpp(gguf)] if gguf is not None and importlib.util.find_spec("llama_cpp") else []


def cpu_description() -> dict[str, object]:
    """The CPU's model name and instruction flags, as Linux reports them (`flags` on x86, `Features` on Arm; empty
    elsewhere)."""
    info: dict[str, str] = {}
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in ("model name", "flags", "Features"):
            info.setdefault("flags" if key == "Features" else key, value)
    return {"model": info.get("model name", ""), "flags": info.get("flags", "").split()}


def run_interleaved(contenders: list[Contender], prompt: list[int], num_tokens: int,
                    repeats: int) -> dict[str, dict[str, object]]:
    """One warm-up request each, then `repeats` rounds of one request each, in turn."""
    for contender in contenders:
        contender.request(prompt, 8)
    runs: dict[str, list[tuple[float, float, float]]] = {c.name: [] for c in contenders}
    for _ in range(repeats):
        for contender in contenders:
            cpu_start = time.process_time()
            decode_s, whole_s = contender.request(prompt, num_tokens)
            runs[contender.name].append((decode_s, whole_s, time.process_time() - cpu_start))
    return {name: _summary(times, num_tokens) for name, times in runs.items()}


def _summary(times: list[tuple[float, float, float]], num_tokens: int) -> dict[str, object]:
    """Speeds by the wall clock, and the process's CPU time per token of a whole request: on a loaded machine the
    wall clock counts the time others held the cores, CPU time only the work done (threads spinning included)."""
    decode = [(num_tokens - 1) / d for d, _, _ in times]
    whole = [num_tokens / w for _, w, _ in times]
    cpu_ms = [1000 * c / num_tokens for _, _, c in times]
    return {"decode_tok_s": [round(x, 2) for x in decode], "decode_tok_s_median": round(statistics.median(decode), 2),
            "decode_tok_s_best": round(max(decode), 2), "request_tok_s_median": round(statistics.median(whole), 2),
            "request_cpu_ms_per_token": [round(x, 3) for x in cpu_ms],
            "request_cpu_ms_per_token_median": round(statistics.median(cpu_ms), 3)}


def chat_prompt(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.chat_template is None:  # a base model, or --random-weights' word tokenizer: no template
        return tokenizer.encode(QUESTION)
    return tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)


def print_table(results: dict[str, dict[str, object]]) -> None:
    print("| contender | decode tok/s, median | best | each run | whole request tok/s, median | "
          "CPU ms per token, median |")
    print("| --- | ---: | ---: | --- | ---: | ---: |")
    for name, r in results.items():
        runs = ", ".join(str(x) for x in r["decode_tok_s"])  # type: ignore[attr-defined]
        print(f"| {name} | {r['decode_tok_s_median']} | {r['decode_tok_s_best']} | {runs} "
              f"| {r['request_tok_s_median']} | {r['request_cpu_ms_per_token_median']} |")


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="what openai-serve --model takes: a checkpoint, a .gguf file, a built-in name "
                   "such as gemma-3-270m (default: the default model), through the same resolution as the CLI")
    p.add_argument("--random-weights", metavar="DIR", help="build and time a random checkpoint of the default "
                   "model's shape in DIR instead (where the model cannot be fetched)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--ours", default="auto,float32:cpu_packed_weights=0+fused_kernels=0",
                   help="our dtypes, each optionally DTYPE:KERNEL_VARIANT, comma-separated")
    p.add_argument("--peers", default="float32,bfloat16", help="transformers' dtypes, comma-separated ('' for none)")
    p.add_argument("--llama-cpp", choices=["on", "off"], default="on", help="llama.cpp where it is installed")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", help="write the result here as JSON")
    args = p.parse_args(argv)
    if args.random_weights:
        model_dir = build_random_checkpoint(args.random_weights, SHAPES["smollm2-135m"], torch.float32)
    else:
        model_dir = resolve_model(args.model, "auto", args.device).path
    contenders: list[Contender] = [Ours(model_dir, args.device, spec) for spec in args.ours.split(",") if spec]
    contenders += [Transformers(model_dir, args.device, dtype) for dtype in args.peers.split(",") if dtype]
    contenders += llama_cpp(args)
    prompt = chat_prompt(model_dir)
    load_before = os.getloadavg()
    with startup_objects_frozen():
        results = run_interleaved(contenders, prompt, args.tokens, args.repeats)
    for contender in contenders:
        if getattr(contender, "kernels", None) is not None:
            results[contender.name]["cpu_kernels"] = contender.kernels  # type: ignore[attr-defined]
    result: dict[str, object] = {
        "kind": "default-model-speed", "model": str(model_dir), "model_name": args.model or SMOLLM2.name,
        "random_weights": bool(args.random_weights),
        "prompt_tokens": len(prompt), "tokens": args.tokens, "repeats": args.repeats,
        "threads": torch.get_num_threads(), **({"cpu": cpu_description()} if args.device == "cpu" else {}),
        "openmp_environment": {name: os.environ[name] for name in OPENMP_ENVIRONMENT if name in os.environ},
        "load_average_1_5_15": {"before": [round(x, 2) for x in load_before],
                                "after": [round(x, 2) for x in os.getloadavg()]},
        "results": results,
    }
    print_table(results)
    print(json.dumps({k: v for k, v in result.items() if k not in ("results", "cpu")}))
    if args.out:
        write_result(args.out, result, "bench.default_model_speed", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
