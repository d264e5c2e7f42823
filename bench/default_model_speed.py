"""Batch-1 decode speed of the default model (SmolLM2-135M-Instruct), ours beside transformers'.

One request at a time, greedy, a 32-token prompt, `--tokens` new tokens (EOS ignored): the speed a
single user sees. Ours is timed from the first new token to the last (decode only) and over the
whole request; transformers' `generate` over the whole request (it has no per-token hook).

    python -m bench.default_model_speed --out bench/results/current/default_model_cpu.json
    python -m bench.default_model_speed --device cuda --dtype bfloat16 --random-weights /tmp/smollm2-random ...

`--random-weights DIR` builds a random checkpoint of the same shape in DIR (the GPU machine cannot
fetch the model; speed does not depend on the values).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from bench.common import write_result
from core import CacheConfig, EngineConfig, LLMEngine, ModelConfig, SamplingParams, SchedulerConfig
from core.model_files import resolve_model

PROMPT_IDS = list(range(100, 132))  # 32 tokens: the speed does not depend on which
# The default model's config.json as our GGUF conversion writes it, for --random-weights where it cannot be fetched.
SMOLLM2_135M = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=576, intermediate_size=1536,
    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
    max_position_embeddings=8192, rope_theta=100000.0, vocab_size=49152, tie_word_embeddings=True, bos_token_id=1,
    eos_token_id=2,
)


def ours(model_dir: Path, device: str, dtype: str, num_tokens: int, repeats: int) -> dict[str, float]:
    engine = LLMEngine(EngineConfig(
        model=ModelConfig(model=str(model_dir), device=device, dtype=dtype, max_model_len=1024),
        cache=CacheConfig(num_blocks=128), scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024)))
    runs = [_one_request(engine, PROMPT_IDS, num_tokens, f"r{i}") for i in range(repeats + 1)][1:]  # the first warms
    decode = min(r[0] for r in runs)
    whole = min(r[1] for r in runs)
    return {"decode_tok_s": (num_tokens - 1) / decode, "request_tok_s": num_tokens / whole}


def _one_request(engine: LLMEngine, prompt: list[int], num_tokens: int, request_id: str) -> tuple[float, float]:
    """(seconds from the first new token to the last, seconds for the whole request)"""
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    start = time.perf_counter()
    engine.add_request(request_id, prompt, params)
    first = None
    while engine.has_unfinished_requests():
        if engine.step() and first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    return end - (first or start), end - start


def transformers_speed(model_dir: Path, device: str, dtype: str, num_tokens: int, repeats: int) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    torch_dtype = torch.float32 if dtype == "auto" and device == "cpu" else getattr(torch, dtype, torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).to(device).eval()
    ids = torch.tensor([PROMPT_IDS])
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids.to(device), max_new_tokens=num_tokens, min_new_tokens=num_tokens, do_sample=False)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {"request_tok_s": num_tokens / min(times[1:])}


def random_checkpoint(directory: Path) -> Path:
    """SmolLM2-135M's shape with random weights (transformers' initialisation) and a word tokenizer over its
    vocabulary (bench/bench_model.py), built once in `directory`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.bench_model import build_word_tokenizer

    if not (directory / "config.json").exists():
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).save_pretrained(directory)
        build_word_tokenizer(directory, SMOLLM2_135M["vocab_size"])  # type: ignore[arg-type]
    return directory


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a checkpoint (default: the default model, through the same resolution as the CLI)")
    p.add_argument("--random-weights", metavar="DIR", help="build and time a random checkpoint of the default "
                   "model's shape in DIR instead (where the model cannot be fetched)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peer", choices=["transformers", "none"], default="transformers")
    p.add_argument("--out", help="write the result here as JSON")
    args = p.parse_args(argv)
    if args.random_weights:
        model_dir = random_checkpoint(Path(args.random_weights))
    else:
        model_dir = Path(args.model) if args.model else resolve_model(None, args.dtype, args.device).path
    result: dict[str, object] = {
        "model": str(model_dir), "random_weights": bool(args.random_weights), "dtype": args.dtype,
        "tokens": args.tokens, "threads": torch.get_num_threads(),
        "openai_serve": ours(model_dir, args.device, args.dtype, args.tokens, args.repeats),
    }
    if args.peer == "transformers":
        result["transformers"] = transformers_speed(model_dir, args.device, args.dtype, args.tokens, args.repeats)
    print(json.dumps(result, indent=1))
    if args.out:
        write_result(args.out, result, "bench.default_model_speed", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
