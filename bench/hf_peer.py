"""The peer: Hugging Face transformers generating the same workload from the same checkpoint.

transformers' own continuous batching (paged attention): a manager from
`model.init_continuous_batching(...)` gets every request through `add_request(input_ids,
max_new_tokens=..., eos_token_id=-1)` (-1: no EOS, as ignore_eos), so each request keeps its own
length. transformers' API moves fast (the GPU machine has 5.17, developers' machines newer): where
it is missing or fails, the run fails and bench.throughput records why. Runs in its own process
(`python -m bench.hf_peer`) so its GPU memory is its own.
"""

import argparse
import inspect
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bench.workload import Request, nano_vllm_workload

TEMPERATURE = 0.6


@dataclass
class PeerRun:
    method: str  # "continuous_batching"
    num_requests: int
    num_output_tokens: int
    seconds: float
    is_partial: bool = False  # stopped by --max-seconds: the figures cover the requests that finished

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.seconds


def load_model(model_dir: str, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    return model.to(device).eval()


def generation_config(model: torch.nn.Module) -> object:
    from transformers import GenerationConfig

    # top_k=0 and top_p=1.0 turn transformers' default filters off: plain temperature sampling, as ours.
    return GenerationConfig(do_sample=True, temperature=TEMPERATURE, top_k=0, top_p=1.0, eos_token_id=-1,
                            pad_token_id=0, max_new_tokens=1024)


def run_continuous_batching(model: torch.nn.Module, requests: list[Request], max_seconds: float | None) -> PeerRun:
    manager = model.init_continuous_batching(generation_config=generation_config(model), **_workload_hints(requests))
    if hasattr(manager, "warmup"):
        manager.warmup()  # captures CUDA graphs where transformers uses them: kept out of the timed run
    manager.start()
    is_partial = True
    try:
        _cb_generate(manager, _warmup_requests(requests), None)
        num_tokens, seconds, is_partial = _cb_generate(manager, requests, max_seconds)
    finally:
        # A hard stop fails the requests still running (after --max-seconds) instead of finishing them.
        hard = {"hard_stop": True} if is_partial and "hard_stop" in inspect.signature(manager.stop).parameters else {}
        manager.stop(block=True, timeout=30, **hard)
    return PeerRun("continuous_batching", len(requests), num_tokens, seconds, is_partial)


def _workload_hints(requests: list[Request]) -> dict[str, object]:
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints
    except ImportError:
        return {}
    return {"workload_hints": WorkloadHints(
        max_prompt_length=max(len(r.prompt_token_ids) for r in requests),
        max_generated_length=max(r.max_tokens for r in requests), num_requests=len(requests))}


def _cb_generate(manager: object, requests: list[Request], max_seconds: float | None) -> tuple[int, float, bool]:
    """Adds every request, waits for all; returns (tokens generated, seconds, stopped early)."""
    start = time.perf_counter()
    ids = [manager.add_request(r.prompt_token_ids, max_new_tokens=r.max_tokens, eos_token_id=-1) for r in requests]
    pending, num_tokens = set(ids), 0
    while pending:
        if max_seconds is not None and time.perf_counter() - start > max_seconds:
            return num_tokens, time.perf_counter() - start, True
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                raise RuntimeError("transformers' generation thread died")
            continue
        if result.is_finished() and result.request_id in pending:
            if result.error is not None:
                raise RuntimeError(f"request {result.request_id} failed: {result.error}")
            pending.discard(result.request_id)
            num_tokens += len(result.generated_tokens)
    return num_tokens, time.perf_counter() - start, False


def _warmup_requests(requests: list[Request]) -> list[Request]:
    return [Request(r.prompt_token_ids, 16) for r in requests[:8]]


def run_peer(args: argparse.Namespace) -> PeerRun:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    requests = nano_vllm_workload(seed=args.seed)[: args.num_requests]
    return run_continuous_batching(load_model(args.model, device), requests, args.max_seconds)


def main(argv: list[str] | None = None) -> None:
    import transformers

    p = argparse.ArgumentParser(prog="python -m bench.hf_peer", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--num-requests", type=int, default=256, help="the first N requests of the workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    run = run_peer(args)
    result = {**asdict(run), "tokens_per_s": round(run.tokens_per_s, 1), "transformers": transformers.__version__}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
