"""Embeddings per second: the model as an embedding model (last-token pooling, normalized), against its ideal and
against sentence-transformers on the same device and checkpoint.

`--num-prompts` random prompts of `--prompt-len` tokens are pooled by `LLM.embed`, twice (the first run warms up); the
ideal is their compute alone (2 FLOPs per linear weight and prompt token) at the matmul rate measured in the same run.
The model: a checkpoint directory, or random weights of `--shape` (Qwen3-0.6B's is Qwen3-Embedding-0.6B's).

    python -m bench.embeddings --shape qwen3-0.6b --prompt-len 512 --num-prompts 2048 --out result.json
"""

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.bench_model import DEFAULT_SHAPE, build_random_checkpoint, shape_config
from bench.common import write_result
from bench.roofline import DTYPE_BYTES, ModelShape, measure_limits
from bench.throughput import guarded
from bench.workload import fixed_workload
from core import LLM


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.embeddings", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a checkpoint directory (default: random weights of --shape)")
    p.add_argument("--shape", default=DEFAULT_SHAPE)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--num-prompts", type=int, default=2048)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--st-batch-size", type=int, default=64, help="sentence-transformers' batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the result JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model = args.model or str(build_random_checkpoint(Path("/tmp/bench-models") / args.shape, shape_config(args.shape)))
    limits = measure_limits(torch.device("cuda" if torch.cuda.is_available() else "cpu"), getattr(torch, args.dtype))
    shape = ModelShape.from_dir(model, DTYPE_BYTES.get(args.dtype, 2))
    prompts = [r.prompt_token_ids for r in fixed_workload(args.num_prompts, args.prompt_len, 1, seed=args.seed)]
    ours = timed_twice(our_run(model, args, prompts))
    gc.collect()  # the engine and its memory go before sentence-transformers runs on the same device
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    ideal = 2 * shape.linear_params_per_token * len(prompts) * args.prompt_len / limits.matmul_flops_per_s
    result = {"kind": "embeddings", "model": model, "torch": torch.__version__, "num_prompts": len(prompts),
              "prompt_len": args.prompt_len, "limits": limits.figures(),
              "ours_embeddings_per_s": round(len(prompts) / ours, 1),
              "ideal_embeddings_per_s": round(len(prompts) / ideal, 1), "share_of_ideal": round(ideal / ours, 4)}
    texts = [" ".join(f"w{i}" for i in prompt) for prompt in prompts]
    result["sentence_transformers"] = guarded(lambda: {"embeddings_per_s": round(len(prompts) / timed_twice(
        sentence_transformers_run(model, args, texts)), 1)})
    print(result, flush=True)
    write_result(args.out, result, "bench.embeddings", argv if argv is not None else sys.argv[1:])


def our_run(model: str, args: argparse.Namespace, prompts: list[list[int]]) -> Callable[[], object]:
    llm = LLM(model, task="embed", dtype=args.dtype, max_model_len=args.prompt_len + 8,
              max_num_batched_tokens=args.max_num_batched_tokens)
    return lambda: llm.embed(prompts)


def sentence_transformers_run(model: str, args: argparse.Namespace, texts: list[str]) -> Callable[[], object]:
    """The same checkpoint as a sentence-transformers model of the same pooling."""
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(model, max_seq_length=args.prompt_len,
                                     model_kwargs={"dtype": getattr(torch, args.dtype)})
    tokenizer = transformer.tokenizer
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.convert_ids_to_tokens(0)
    modules = [transformer, models.Pooling(transformer.get_embedding_dimension(), "lasttoken"), models.Normalize()]
    st = SentenceTransformer(modules=modules, device="cuda" if torch.cuda.is_available() else "cpu")
    return lambda: st.encode(texts, batch_size=args.st_batch_size, convert_to_tensor=True)


def timed_twice(run: Callable[[], object]) -> float:
    """Seconds of the second of two runs (the first warms up), the device's work included."""
    run()
    start = time.perf_counter()
    run()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
