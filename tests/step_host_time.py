"""The host's time per engine step on a CPU, with a model so small that its compute is a small part of it: plain
decode steps, steps that verify drafts (n-gram, or suffix with --method suffix), and verifying steps entered from a
plain one.

On a GPU at small batches a verifying step costs its host work and its device work one after the other (it books
the step in flight before proposing, and is booked before the next step is scheduled), so the host's part of it is
what this measures. Each sequence's prompt repeats, so prompt lookup finds a draft at every step.

Modes, each on its own engine:
  plain      no speculation: asynchronous decode steps
  verify     drafts of `--drafts` tokens at every step (a fixed draft length)
  alternate  a plain step, then a verifying one, and so on: `enter` is a verifying step after a plain one,
             `leave` a plain step after a verifying one

    python -m tests.step_host_time --rows 1,16 --steps 300 [--profile verify:16]

prints, per mode and row count, the median and the quartiles of the step times in microseconds (one JSON line
each; `--profile MODE:ROWS` prints that case's cProfile instead, sorted by own time).
"""

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from core import LLM, SamplingParams
from core.engine import LLMEngine
from core.tiny_model import TinyModelSpec, build_tiny_model

MODES = ("plain", "verify", "alternate")
MODEL = TinyModelSpec(architecture="qwen3", num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1,
                      intermediate_size=32, vocab_size=512, max_position_embeddings=4096)
MAX_MODEL_LEN = 4096


@dataclass
class Alternating:
    """A draft-length controller that verifies `num_drafts` at every other step (the controller's interface)."""

    num_drafts: int
    _verifies: bool = False

    def choose(self, batch_size: int, has_prompt_work: Callable[[], bool] = lambda: False) -> int:
        self._verifies = not self._verifies
        return self.num_drafts if self._verifies else 0

    def observe_step(self, batch_size: int, num_drafts: int, seconds: float) -> None:
        pass

    def observe_acceptance(self, num_offered: int, accepted_per_position: list[int]) -> None:
        pass


def build_engine(model_dir: Path, mode: str, num_rows: int, num_drafts: int, method: str = "ngram") -> LLMEngine:
    spec = None if mode == "plain" else {"method": method, "num_speculative_tokens": num_drafts, "adaptive": False}
    if method == "ngram" and spec is not None:
        spec["prompt_lookup_max"] = 3
    llm = LLM(str(model_dir), speculative_config=spec, max_model_len=MAX_MODEL_LEN, block_size=16,
              max_num_seqs=max(num_rows, 1), max_num_batched_tokens=8192, dtype="float32", device="cpu",
              kv_cache_blocks=num_rows * MAX_MODEL_LEN // 16 + 16)
    if mode == "alternate":
        llm.engine.speculation.controller = Alternating(num_drafts)  # type: ignore[union-attr]
    return llm.engine


def repeating_prompt(row: int) -> list[int]:
    """A prompt whose tail repeats (a period of 7 tokens, each row its own), so lookup always finds a draft."""
    period = [(row * 13 + i * 37) % 500 + 5 for i in range(7)]
    return [3, 4] + period * 8


class ForwardTimer:
    """Wraps the runner's forward pass (the model's compute, which a GPU runs in a graph) and adds up its time, which
    the step times leave out."""

    def __init__(self, forward: Callable) -> None:
        self.forward = forward
        self.seconds = 0.0

    def __call__(self, *args: object) -> object:
        started = time.perf_counter()
        try:
            return self.forward(*args)
        finally:
            self.seconds += time.perf_counter() - started


def time_steps(engine: LLMEngine, num_rows: int, num_steps: int, profile: cProfile.Profile | None
               ) -> dict[str, list[float]]:
    """Step times in seconds less the model's forward passes, by kind of step, over `num_steps` decode steps of
    `num_rows` sequences (a new set of requests whenever one ends; the steps until every row decodes are not timed)."""
    times: dict[str, list[float]] = {}
    forward = engine.runner._forward = ForwardTimer(engine.runner._forward)  # type: ignore[attr-defined]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_MODEL_LEN - 100, ignore_eos=True)
    round_index = 0
    while sum(map(len, times.values())) < num_steps:
        for row in range(num_rows):
            engine.add_request(f"{round_index}-{row}", repeating_prompt(row), params)
        round_index += 1
        for _ in range(4):  # the prompts, then the first decode steps
            engine.step()
        previous = "plain"
        while sum(map(len, times.values())) < num_steps and engine.scheduler.running and not engine.scheduler.waiting:
            if profile is not None:
                profile.enable()
            forward.seconds, started = 0.0, time.perf_counter()
            engine.step()
            seconds = time.perf_counter() - started - forward.seconds
            if profile is not None:
                profile.disable()
            kind = _kind_of(engine, previous)
            times.setdefault(kind, []).append(seconds)
            previous = "verify" if kind in ("verify", "enter") else "plain"
            if len(engine.scheduler.running) < num_rows:
                break
        for seq in list(engine.scheduler.running):
            engine.abort_request(seq.request_id)
        while engine.has_unfinished_requests():
            engine.step()
    return times


def _kind_of(engine: LLMEngine, previous: str) -> str:
    """The step just run: plain or verify, and for a change between them, enter or leave."""
    timed = engine._timed_step  # (rows, draft length, start) of the step just run
    verifies = timed is not None and timed[1] > 0
    if verifies:
        return "enter" if previous == "plain" and isinstance(engine.speculation.controller, Alternating) else "verify"  # type: ignore[union-attr]
    return "leave" if previous == "verify" else "plain"


def summary(mode: str, num_rows: int, times: dict[str, list[float]]) -> list[dict[str, object]]:
    lines = []
    for kind, seconds in sorted(times.items()):
        us = sorted(s * 1e6 for s in seconds)
        q1, median, q3 = statistics.quantiles(us, n=4) if len(us) > 1 else us * 3
        lines.append({"mode": mode, "rows": num_rows, "kind": kind, "steps": len(us), "median_us": round(median, 1),
                      "q1_us": round(q1, 1), "q3_us": round(q3, 1)})
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--drafts", type=int, default=4)
    parser.add_argument("--method", default="ngram", help="the proposer: ngram, suffix")
    parser.add_argument("--profile", default=None, help="MODE:ROWS: print that case's cProfile instead")
    parser.add_argument("--sort", default="tottime", help="the profile's order: tottime, cumulative")
    parser.add_argument("--model-dir", default=None, help="the tiny checkpoint (built there once); default a temp dir")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the model's compute stays small and on one core, as the host's work is
    model_dir = Path(args.model_dir or tempfile.mkdtemp(prefix="step-host-time-"))
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir, MODEL)
    if args.profile:
        mode, rows = args.profile.split(":")
        profile = cProfile.Profile()
        time_steps(build_engine(model_dir, mode, int(rows), args.drafts, args.method), int(rows), args.steps, profile)
        pstats.Stats(profile).sort_stats(args.sort).print_stats(60)
        return
    for num_rows in map(int, args.rows.split(",")):
        for mode in args.modes.split(","):
            engine = build_engine(model_dir, mode, num_rows, args.drafts, args.method)
            time_steps(engine, num_rows, 20, None)  # warm-up
            for line in summary(mode, num_rows, time_steps(engine, num_rows, args.steps, None)):
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
