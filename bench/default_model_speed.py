"""Batch-1 decode speed of a real model (the default one unless `--model` names another): ours beside llama.cpp, and
ours with speculative decoding beside ours without.

One request at a time, greedy, `--tokens` new tokens, each prompt of a set in bench/prompts.toml (`--prompts`) in the
model's chat template. Every contender is built first, in this one process; then each round runs one request of each
in turn per prompt, so a change in the machine's load falls on all alike. Decode speed is timed from the first new
token to the last; beside it, the whole request's speed and the process's CPU time per token. A contender of ours is
a dtype (`auto`: the engine's default), optionally with a kernel variant (bench.common.kernel_variant), once per
`--speculative` config; llama.cpp (the llama-cpp-python that imports, its build's AVX flags in its name) runs the GGUF
file the model comes from. A CPU run records the CPU, the kernels each of ours ran, the threads and the OpenMP
variables set (OMP_WAIT_POLICY=PASSIVE suits a machine whose cores other processes share).

    python -m bench.default_model_speed --model gemma-3-270m --ours auto,auto:cpu_march=haswell --out result.json
    python -m bench.default_model_speed --device cuda --ours bfloat16 --speculative off,ngram,suffix --prompts code_edit
"""

import argparse
import itertools
import json
import os
import statistics
import sys
import time
import tomllib
from dataclasses import asdict
from importlib.util import find_spec
from pathlib import Path
from typing import Protocol

import torch

from bench.common import kernel_variant, write_result
from bench.engine_runs import build_engine, startup_objects_frozen, time_one
from bench.workload import Request
from core.config import engine_config
from core.model_files import resolve_model
from core.model_files.cache import DEFAULT_CACHE_DIR
from core.model_files.default_model import SMOLLM2
from core.model_files.resolve import BUILTIN_GGUFS
from core.model_files.wheel_gguf import fetch_gguf
from gpu.layers.int8_dot_linear import Int8DotProduct
from gpu.model_runner import ModelRunner

PROMPT_SETS = tomllib.loads(Path(__file__).with_name("prompts.toml").read_text())
# Speculative configs by name (--drafts: num_speculative_tokens): n-gram lookup, as many drafts as pay or all (-fixed),
# verified on the device or from the host's drafts (-host); suffix lookup; the target as its own draft; MTP.
SPECULATIVE: dict[str, dict[str, object] | None] = {
    "off": None, "mtp": {"method": "mtp"}, "suffix": {"method": "suffix"}, "draft-self": {"method": "draft_model"},
    "draft-self-fixed": {"method": "draft_model", "adaptive": False}} | {f"ngram{fixed}{host}": {
        "method": "ngram", "prompt_lookup_max": 4, "adaptive": not fixed, "verify_on_device": not host}
        for fixed in ("", "-fixed") for host in ("", "-host")}
# Recorded where set: how every contender's OpenMP threads run and wait, the instruction set torch's kernels take.
OPENMP_ENVIRONMENT = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_PROC_BIND", "ATEN_CPU_CAPABILITY")


class Contender(Protocol):
    name: str

    def request(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        """(seconds from the first new token to the last, seconds for the whole request)"""
        ...


class Ours:
    def __init__(self, model_dir: Path, device: str, spec: str, speculative: str = "off", num_drafts: int = 4) -> None:
        """spec: DTYPE or DTYPE:VARIANT (a kernel variant, bench.common.kernel_variant); speculative: a name of
        SPECULATIVE, with `num_drafts` speculative tokens."""
        dtype, _, variant = spec.partition(":")
        speculative_config = SPECULATIVE[speculative]
        if speculative_config is not None:
            speculative_config = {**speculative_config, "num_speculative_tokens": num_drafts}
            if speculative_config["method"] == "draft_model":
                speculative_config["model"] = str(model_dir)
        config = engine_config(str(model_dir), device=device, dtype=dtype, max_model_len=2048, kv_cache_blocks=256,
                               max_num_seqs=8, max_num_batched_tokens=2048, speculative_config=speculative_config)
        self.engine = build_engine(config, kernel_variant(variant or "default"))
        runner = self.engine.runner
        self.name = f"openai-serve {spec} ({str(runner.dtype).removeprefix('torch.')})"
        self.name += f", speculative {speculative}" if speculative_config else ""
        self.kernels = cpu_kernels_run(runner) if device == "cpu" else None

    def request(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        start, token_times = time_one(self.engine, Request(prompt, num_tokens), temperature=0.0)
        return token_times[-1] - token_times[0], token_times[-1] - start

    def figures(self) -> dict[str, object]:
        """The CPU kernels it ran (on a CPU) and vLLM's speculative decoding counters (with speculation)."""
        figures: dict[str, object] = {} if self.kernels is None else {"cpu_kernels": self.kernels}
        if (stats := self.engine.stats()).num_spec_accepted_per_position:
            figures["speculation"] = {name.removeprefix("num_spec_"): value for name, value in asdict(stats).items()
                                      if name.startswith("num_spec_")}
        return figures


class LlamaCpp:
    """llama.cpp (llama-cpp-python) on a GGUF file, greedy, its EOS banned so that it makes every token asked for."""

    def __init__(self, gguf: Path) -> None:
        from llama_cpp import Llama, llama_print_system_info

        self.model = Llama(model_path=str(gguf), n_ctx=2048, n_threads=torch.get_num_threads(), verbose=False)
        built = [flag.removesuffix(" = 1") for flag in llama_print_system_info().decode().split(" | ")]  # its ISA
        self.name = f"llama.cpp ({gguf.name}, {' '.join(f for f in built if f.startswith('AVX') and '=' not in f)})"

    def request(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        self.model.reset()  # no prefix carried over from the previous request
        start, first = time.perf_counter(), None
        for _ in self.model.create_completion(prompt, max_tokens=num_tokens, temperature=0.0, stream=True,
                                              logit_bias={self.model.token_eos(): float("-inf")}):
            first = first or time.perf_counter()
        end = time.perf_counter()
        return end - (first or start), end - start


def cpu_kernels_run(runner: ModelRunner) -> dict[str, object]:
    """Which CPU kernels a runner of ours took: the int8 dot products' instruction set where some weight went through
    them (else None), attention's C kernels, decode steps as C kernel calls per layer; torch's own instruction set."""
    int8_dot = runner.cpu_kernels.int8_dot
    packed = any(isinstance(getattr(m, "packed", None), Int8DotProduct) for m in runner.model.modules())
    return {"int8_dot": int8_dot.ISA if packed and int8_dot is not None else None,
            "attention": runner.config.kernels.fused_kernels and runner.cpu_kernels.attention is not None,
            "decode_steps": runner.cpu_decode is not None, "torch": torch.backends.cpu.get_cpu_capability()}


def model_gguf(model: str | None) -> Path | None:
    """The GGUF file `--model` comes from (the default model's, a built-in one's, a .gguf path), or None."""
    if model is None or model in BUILTIN_GGUFS:
        return fetch_gguf(BUILTIN_GGUFS[model] if model else SMOLLM2, DEFAULT_CACHE_DIR)
    return Path(model) if model.endswith(".gguf") else None


def llama_cpp(args: argparse.Namespace) -> list[Contender]:
    """llama.cpp on the model's GGUF file, on a CPU, where llama-cpp-python is installed."""
    if args.llama_cpp == "off" or args.device != "cpu" or not find_spec("llama_cpp"):
        return []
    return [] if (gguf := model_gguf(args.model)) is None else [LlamaCpp(gguf)]


def cpu_description() -> dict[str, object]:
    """The CPU's model name and instruction flags as Linux reports them (`flags` on x86, `Features` on Arm)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    info = {key.strip(): value.strip() for key, _, value in reversed([line.partition(":") for line in lines])}
    return {"model": info.get("model name", ""), "flags": (info.get("flags") or info.get("Features", "")).split()}


def run_interleaved(contenders: list[Contender], prompts: list[list[int]], num_tokens: int,
                    repeats: int) -> dict[str, dict[str, object]]:
    """One warm-up request each, then `repeats` rounds of one request each per prompt, in turn."""
    for contender in contenders:
        contender.request(prompts[0], 8)
    runs: dict[str, list[tuple[float, float, float]]] = {c.name: [] for c in contenders}
    for _, prompt, contender in itertools.product(range(repeats), prompts, contenders):
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


def chat_prompts(model_dir: Path, name: str) -> list[list[int]]:
    """PROMPT_SETS[name]'s prompts in the model's chat template; as plain text where it has none (a base model, or
    bench/bench_model.py's word tokenizer)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = [PROMPT_SETS[name].get("context", "") + message for message in PROMPT_SETS[name]["messages"]]
    if tokenizer.chat_template is None:
        return [tokenizer.encode(text) for text in texts]
    return [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for text in texts]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.default_model_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="what openai-serve --model takes: a checkpoint (random weights of the default "
                   "model's shape where it cannot be fetched: bench/bench_model.py's smollm2-135m), a .gguf file, a "
                   "built-in name such as gemma-3-270m (default: the default model), resolved as the CLI does")
    p.add_argument("--device", default="cpu")
    p.add_argument("--ours", default="auto,float32:cpu_packed_weights=0+fused_kernels=0",
                   help="our dtypes, each optionally DTYPE:KERNEL_VARIANT, comma-separated")
    p.add_argument("--speculative", default="off", help=f"each of ours with these, from {','.join(SPECULATIVE)}")
    p.add_argument("--drafts", type=int, default=4, help="num_speculative_tokens of the speculative configs")
    p.add_argument("--llama-cpp", choices=["on", "off"], default="on", help="llama.cpp where it is installed")
    p.add_argument("--prompts", choices=list(PROMPT_SETS), default="question", help="a prompt set of prompts.toml")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", help="write the result here as JSON")
    return p.parse_args(argv)


def build_contenders(args: argparse.Namespace, model_dir: Path) -> list[Contender]:
    ours = itertools.product(filter(None, args.ours.split(",")), args.speculative.split(","))
    return [*(Ours(model_dir, args.device, *spec, args.drafts) for spec in ours), *llama_cpp(args)]


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    model_dir = resolve_model(args.model, "auto", args.device).path
    contenders = build_contenders(args, model_dir)
    prompts = chat_prompts(model_dir, args.prompts)
    load_before = os.getloadavg()
    with startup_objects_frozen():
        results = run_interleaved(contenders, prompts, args.tokens, args.repeats)
    for contender in contenders:
        results[contender.name] |= contender.figures() if isinstance(contender, Ours) else {}
        print(f"{contender.name}: decode tok/s {results[contender.name]['decode_tok_s']}", flush=True)
    result: dict[str, object] = {
        "kind": "default-model-speed", "model": str(model_dir), "model_name": args.model or SMOLLM2.name,
        "prompts": args.prompts, "prompt_tokens": [len(prompt) for prompt in prompts], "tokens": args.tokens,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(), **({"cpu": cpu_description()} if args.device == "cpu" else {}),
        "openmp_environment": {name: os.environ[name] for name in OPENMP_ENVIRONMENT if name in os.environ},
        "load_average_1_5_15": {"before": [round(x, 2) for x in load_before],
                                "after": [round(x, 2) for x in os.getloadavg()]}, "results": results,
    }
    print(json.dumps({k: v for k, v in result.items() if k not in ("results", "cpu")}))
    write_result(args.out, result, "bench.default_model_speed", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
