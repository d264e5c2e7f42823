"""Where the host's time goes in constrained steps at a full batch: the real engine, the device emulated.

The engine (scheduler, batch building, grammars, booking) runs as it does on the GPU machine; the model
runner is replaced by one that computes nothing: a constrained row gets a random token its mask allows
(as random weights sample), a free row any token. Each engine phase is timed per step: booking the
previous step's tokens (`_postprocess`, which feeds every constrained row's token to its matcher), filling
the masks (`Grammars.fill`), scheduling, building and launching. The emulator's own time is reported apart
and left out of the engine's. On the GPU machine the engine's host time overlaps the device's step (about
14 ms at 256 rows of the Qwen3-0.6B shape); once it exceeds it, the host sets the pace.

The model is the Qwen3-0.6B shape's config (no weights: nothing runs) with the tokenizer of --tokenizer
beside it and that tokenizer's EOS, as bench/sampling_cost.py's; --model-eos-id puts another EOS id in
the config (Qwen3's, 151645, is what that benchmark used before: an id past a 49k tokenizer's).
Each run also reports the time spent in Python's garbage collector per generation (a full collection
scans every object of the start-up heap: transformers, the tokenizer); --freeze-gc moves the heap into
the collector's permanent generation after the warm-up run (`gc.freeze()`, as vLLM does after start-up).

    python -m bench.constrained_step_host --tokenizer DIR [--rows 256] [--max-tokens 64] [--freeze-gc] [--out OUT.json]
"""

import argparse
import gc
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.bench_model import QWEN3_0P6B
from bench.common import write_result
from bench.sampling_cost import SCHEMA, TEMPERATURE, is_tokenizer_file
from core import CacheConfig, EngineConfig, LLMEngine, ModelConfig, SamplingParams, SchedulerConfig
from core.structured_output import StructuredOutput
from core.tokenizer import load_tokenizer
from gpu.batch import Batch, StepResult, TokenMask
from gpu.pending_step import PendingLogits

_NUM_CANDIDATES = 64  # random ids tried per constrained row before the emulator lists the allowed ones


class _Done:
    def __init__(self, token_ids: list[int]) -> None:
        self._token_ids = token_ids

    def result(self) -> StepResult:
        return StepResult(self._token_ids, [None] * len(self._token_ids))


class EmulatedRunner:
    """Samples without a model: a random allowed token per constrained row, a random id per free row."""

    def __init__(self, num_kv_blocks: int, tokenizer_size: int, times: dict[str, float]) -> None:
        self.num_kv_blocks = num_kv_blocks
        self._tokenizer_size = tokenizer_size
        self._rng = np.random.default_rng(0)
        self._times = times

    def launch(self, batch: Batch) -> PendingLogits | _Done:
        rows = [r for r in batch.sampling if r is not None]
        if batch.has_token_masks:
            return PendingLogits(torch.empty(0), rows, batch.penalty_slot_inits)
        return _Done(self._rng.integers(3, self._tokenizer_size, len(rows)).tolist())

    def sample_masked(self, pending: PendingLogits, token_mask: TokenMask) -> _Done:
        start = time.perf_counter()
        token_ids = self._rng.integers(3, self._tokenizer_size, len(pending.rows))
        for mask_row, row in enumerate(token_mask.row_indices):
            token_ids[row] = self._allowed(token_mask.bitmask[mask_row])
        self._times["emulator"] += time.perf_counter() - start
        return _Done(token_ids.tolist())

    def _allowed(self, words: np.ndarray) -> int:
        candidates = self._rng.integers(0, 32 * len(words), _NUM_CANDIDATES)
        is_allowed = (words[candidates >> 5] >> (candidates & 31)) & 1
        if is_allowed.any():
            return int(candidates[np.argmax(is_allowed)])
        allowed = np.unpackbits(words.view(np.uint8), bitorder="little").nonzero()[0]
        return int(allowed[self._rng.integers(len(allowed))])

    def close(self) -> None:
        pass


def model_dir(tokenizer_dir: Path, target: Path, eos_token_id: int | None) -> Path:
    """The Qwen3-0.6B shape's config.json (no weights) with the tokenizer beside it."""
    target.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.is_file() and is_tokenizer_file(f):
            shutil.copy(f, target / f.name)
    eos = eos_token_id if eos_token_id is not None else load_tokenizer(str(target)).eos_token_id
    config = {**QWEN3_0P6B, "eos_token_id": eos, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
    (target / "config.json").write_text(json.dumps(config))
    return target


def _timed(times: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times[name] += time.perf_counter() - start
    return run


class GcTimer:
    """Seconds and collections of the garbage collector per generation, from gc.callbacks."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1

    def summary(self) -> dict[str, Any]:
        return {"collections": list(self.collections), "ms": [round(1e3 * t, 1) for t in self.seconds]}


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, times: dict[str, float]
        ) -> dict[str, Any]:
    times.clear()
    gc_timer = GcTimer()
    gc.callbacks.append(gc_timer)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{time.monotonic_ns()}-{i}", prompt, params)
    num_steps = num_tokens = 0
    reasons: Counter[str] = Counter()
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            num_tokens += len(out.new_token_ids)
            reasons.update([out.finish_reason.value] if out.finish_reason is not None else [])
        num_steps += 1
    seconds = time.perf_counter() - start
    gc.callbacks.remove(gc_timer)
    engine_ms = 1e3 * (seconds - times.get("emulator", 0.0)) / num_steps
    return {"num_steps": num_steps, "num_output_tokens": num_tokens, "finish_reasons": dict(reasons),
            "engine_ms_per_step": round(engine_ms, 3), "gc_by_generation": gc_timer.summary(),
            "ms_per_step": {name: round(1e3 * t / num_steps, 3) for name, t in sorted(times.items())}}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.constrained_step_host", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--model-eos-id", type=int, default=None, help="the config's EOS id (default: the tokenizer's)")
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--freeze-gc", action="store_true", help="gc.freeze() after the warm-up run")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    directory = model_dir(Path(args.tokenizer), Path(tempfile.mkdtemp()) / "model", args.model_eos_id)
    num_blocks = 2 * args.rows * (-(-(args.prompt_len + args.max_tokens) // 16) + 1)
    config = EngineConfig(model=ModelConfig(model=str(directory), device="cpu", max_model_len=4096),
                          cache=CacheConfig(block_size=16, num_blocks=num_blocks, enable_prefix_caching=False),
                          scheduler=SchedulerConfig(max_num_seqs=args.rows, max_num_batched_tokens=8192))
    times: dict[str, float] = defaultdict(float)
    tokenizer_size = len(load_tokenizer(str(directory)))
    engine = LLMEngine(config, EmulatedRunner(num_blocks, tokenizer_size, times))  # type: ignore[arg-type]
    for name in ("_postprocess", "_sample_masked", "_schedule", "_launch"):
        setattr(engine, name, _timed(times, name.lstrip("_"), getattr(engine, name)))
    engine.grammars.fill = _timed(times, "grammars.fill", engine.grammars.fill)  # type: ignore[method-assign]
    rng = random.Random(0)
    prompts = [[rng.randrange(3, tokenizer_size) for _ in range(args.prompt_len)] for _ in range(args.rows)]
    schema = StructuredOutput(json_schema=json.dumps(SCHEMA))
    json_params = SamplingParams(temperature=TEMPERATURE, max_tokens=args.max_tokens, structured_output=schema)
    free_params = SamplingParams(temperature=TEMPERATURE, max_tokens=args.max_tokens, ignore_eos=True)
    run(engine, prompts[:8], json_params, times)  # compiles the grammar
    if args.freeze_gc:
        gc.collect()
        gc.freeze()
    try:
        runs = {"json": run(engine, prompts, json_params, times), "none": run(engine, prompts, free_params, times)}
    finally:
        gc.unfreeze()  # a caller's heap (tests) collectable again
    for name, r in runs.items():
        phases = "  ".join(f"{k} {v:.2f}" for k, v in r["ms_per_step"].items())
        print(f"{name:5} {r['engine_ms_per_step']:7.2f} ms/step engine  ({r['num_steps']} steps; {phases}; "
              f"gc ms by generation {r['gc_by_generation']['ms']})")
    result = {"kind": "constrained_step_host", "freeze_gc": args.freeze_gc, "model_eos_id": engine.eos_token_ids[0],
              "tokenizer_size": tokenizer_size, "model_vocab_size": engine.vocab_size,
              "config": {k: v for k, v in vars(args).items() if k != "out"}, "runs": runs}
    if args.out:
        write_result(args.out, result, "bench.constrained_step_host", argv)


if __name__ == "__main__":
    main()
