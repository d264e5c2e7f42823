"""What the draft-length controller (core/speculation_control.py) saw and chose, request by request: one speculative
config of bench.default_model_speed at batch 1, greedy, on a prompt set of bench/prompts.toml, after one warm-up
request, on one engine as that benchmark runs it.

Per request: the draft lengths chosen, the controller's figures at its end (each arm's step time and expected tokens,
the rate they give), and the step times it was given, by kind: plain decode steps, the first decode step after a
prefill, steps that asked for drafts.

    python -m bench.speculation_trace --model SmolLM2-135M-Instruct.Q4_1.gguf --device cuda --dtype bfloat16 \\
        --speculative ngram --prompts summarize --out trace.json
"""

import argparse
import itertools
import json
import statistics
import sys
from collections import Counter

from bench.common import write_result
from bench.default_model_speed import PROMPT_SETS, SPECULATIVE, Ours, chat_prompts
from bench.engine_runs import startup_objects_frozen
from core.model_files import resolve_model
from core.speculation_control import DraftLengthController


def step_time_summary(seconds: list[float]) -> dict[str, object]:
    if not seconds:
        return {"count": 0}
    ordered = sorted(seconds)
    return {"count": len(ordered), "median_ms": round(1000 * statistics.median(ordered), 3),
            "mean_ms": round(1000 * statistics.fmean(ordered), 3),
            "p90_ms": round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 3), "max_ms": round(1000 * ordered[-1], 3)}


def controller_figures(controller: DraftLengthController) -> dict[str, object]:
    bucket = controller._bucket(1)  # noqa: SLF001 - a benchmark's look inside
    arms = []
    for k, arm in enumerate(bucket.arms):
        expected = controller.expected_tokens(k)
        arms.append({"k": k, "step_ms": None if arm.seconds is None else round(1000 * arm.seconds, 3),
                     "expected_tokens": round(expected, 3),
                     "tokens_per_s": None if arm.seconds is None else round(expected / arm.seconds, 1)})
    return {"arms": arms}


def trace(ours: Ours, prompts: list[list[int]], num_tokens: int, repeats: int) -> list[dict[str, object]]:
    speculation = ours.engine.speculation
    assert speculation is not None and isinstance(speculation.controller, DraftLengthController), \
        "an adaptive speculative config"
    controller = speculation.controller
    steps: list[tuple[int, int, float]] = []  # (decoding sequences, draft length, seconds) as the controller got them
    observe = controller.observe_step

    def recording(batch_size: int, num_drafts: int, seconds: float) -> None:
        steps.append((batch_size, num_drafts, seconds))
        observe(batch_size, num_drafts, seconds)

    controller.observe_step = recording  # type: ignore[method-assign]
    ours.request(prompts[0], 8)
    requests = []
    for _, prompt in itertools.product(range(repeats), prompts):
        steps.clear()
        decode_s, _ = ours.request(prompt, num_tokens)
        after_prefill = [s for (b0, _, _), (b, k, s) in itertools.pairwise(steps) if b0 == 0 and b]
        plain = [s for (b0, k0, _), (b, k, s) in itertools.pairwise(steps) if b0 and b and k == k0 == 0]
        drafting = [s for b, k, s in steps if b and k]
        requests.append({"decode_tok_s": round((num_tokens - 1) / decode_s, 2),
                         "draft_lengths_chosen": dict(sorted(Counter(k for b, k, _ in steps if b).items())),
                         "plain_steps": step_time_summary(plain), "first_steps_after_prefill": step_time_summary(
                             after_prefill), "drafting_steps": step_time_summary(drafting),
                         "controller_at_end": controller_figures(controller)})
    return requests


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.speculation_trace", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="as bench.default_model_speed's")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--speculative", default="ngram", choices=[name for name in SPECULATIVE if name != "off"])
    p.add_argument("--drafts", type=int, default=4)
    p.add_argument("--prompts", choices=list(PROMPT_SETS), default="summarize")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", help="write the result here as JSON")
    args = p.parse_args(argv)
    model_dir = resolve_model(args.model, "auto", args.device).path
    ours = Ours(model_dir, args.device, args.dtype, args.speculative, args.drafts)
    prompts = chat_prompts(model_dir, args.prompts)
    with startup_objects_frozen():
        requests = trace(ours, prompts, args.tokens, args.repeats)
    for request in requests:
        print(json.dumps(request), flush=True)
    write_result(args.out, {"kind": "speculation-trace", "model": str(model_dir), "contender": ours.name,
                            "prompts": args.prompts, "tokens": args.tokens, "requests": requests},
                 "bench.speculation_trace", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
