"""Prefix-heavy serving: multi-turn chats sharing one long system prompt, with prefix caching on and then off.

The workload (bench/workload.py's `multi_turn_chats`): every chat starts with the same `--system-len`-token
system prompt (2048 by default), then `--turns` turns of a `--user-len`-token user message, each asking for
`--max-tokens` tokens with ignore_eos; a turn's prompt is the whole conversation so far, sent as token ids to
the streamed /v1/completions, and the next turn is sent when the reply has finished. Per level, at most
`--levels` chats run at once, `--num-chats` chats of new user messages (the system prompt stays the same).

`--launch` starts openai-serve once per `--variants` entry: `on` with `--server-args` as given, `off` with
`--no-enable-prefix-caching` added, the same workload against each. `--base-url` measures one running server.
Per level: the prefix-cache hit rate (the server's /metrics `prefix_cache_hits_total` over
`prefix_cache_queries_total`, in tokens, read before and after the level), the prompt tokens the engine
computed (queried less hit) and all prompt tokens (`prompt_tokens_total`), TTFT p50/p99 (all turns, first
turns, later turns), TPOT, output tok/s and failed requests (bench/stats.py defines them).

    python -m bench.prefix_serve --launch --server-args "--model DIR --max-model-len 4096" --out result.json
"""

import argparse
import asyncio
import json
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from bench import serve
from bench.common import write_result
from bench.load import new_session, run_conversations
from bench.stats import RequestRecord, percentile, summarize
from bench.workload import fixed_workload, multi_turn_chats

CACHING_OFF_FLAG = "--no-enable-prefix-caching"
COUNTERS = ("prefix_cache_queries_total", "prefix_cache_hits_total", "prompt_tokens_total")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.prefix_serve", description=__doc__.split("\n\n")[0])
    serve.add_server_args(p, "1,64")
    p.add_argument("--variants", default="on,off",
                   help=f"with --launch: prefix caching on (the flags as given) and/or off ({CACHING_OFF_FLAG})")
    p.add_argument("--label", default="openai-serve", help="the server's name in the results")
    p.add_argument("--log-dir", default=None, help="where the launched servers' output goes (server_VARIANT.log)")
    p.add_argument("--num-chats", default="8,192", help="chats per level: one number, or one per level")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-len", type=int, default=2048)
    p.add_argument("--user-len", type=int, default=128)
    return p.parse_args(argv)


# The server's counters


def parse_counters(exposition: str) -> dict[str, float]:
    """COUNTERS from a Prometheus text exposition, summed over label sets; a name matches with any namespace
    (`openai_serve:`, vLLM's `vllm:`). Counters the server does not export are absent."""
    found: dict[str, float] = {}
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = name.rsplit(":", 1)[-1]
        if key in COUNTERS:
            found[key] = found.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def read_counters(base_url: str) -> dict[str, float]:
    """/metrics' counters, empty when the server has no /metrics."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=30) as response:
            return parse_counters(response.read().decode())
    except OSError:
        return {}


def counter_figures(before: dict[str, float], after: dict[str, float], duration_s: float) -> dict[str, object]:
    """The level's prefix-cache hit rate (in tokens), its prompt tokens (all of them: `prompt_tokens_total` counts
    cached ones too) and those the engine computed (queried less hit), from two readings of the counters."""
    delta = {k: after[k] - before[k] for k in COUNTERS if k in before and k in after}
    queries, hits = delta.get("prefix_cache_queries_total"), delta.get("prefix_cache_hits_total")
    prompt = delta.get("prompt_tokens_total")
    computed = queries - hits if queries is not None and hits is not None else None
    return {
        "prefix_cache_queried_tokens": queries, "prefix_cache_hit_tokens": hits,
        "prefix_hit_rate": round(hits / queries, 4) if queries and hits is not None else None,
        "prompt_tokens": prompt, "prompt_tokens_per_s": round(prompt / duration_s, 1) if prompt is not None else None,
        "computed_prompt_tokens": computed,  # the prompt tokens the engine ran through the model
    }


# One variant: the levels against one server


def _ttft_ms(records: list[RequestRecord]) -> dict[str, float]:
    ok = [r.ttft for r in records if r.is_ok]
    return {f"p{q}": round(percentile(ok, q) * 1e3, 3) for q in (50, 99)}


async def run_variant(args: argparse.Namespace, base_url: str, model: str,
                      on_level: Callable[[list[dict[str, object]]], None]) -> list[dict[str, object]]:
    levels = [int(x) for x in args.levels.split(",")]
    results: list[dict[str, object]] = []
    async with new_session(max(levels), args.read_timeout) as session:
        warm = fixed_workload(args.warmup_requests, args.system_len, args.max_tokens, seed=args.seed + 10**6)
        await serve.warm_up(session, [serve.completion_spec(base_url, model, r.prompt_token_ids, args) for r in warm])
        num_chats_per_level = serve.per_level(levels, args.num_chats, "--num-chats")
        for index, (concurrency, num_chats) in enumerate(zip(levels, map(int, num_chats_per_level), strict=True)):
            chats = multi_turn_chats(num_chats, args.turns, args.system_len, args.user_len, args.max_tokens,
                                     seed=args.seed + 1000 * index + concurrency, system_seed=args.seed)
            specs = [[serve.completion_spec(base_url, model, turn.prompt_token_ids, args) for turn in chat]
                     for chat in chats]
            before, deadline = read_counters(base_url), serve.level_deadline(args)
            conversations, duration = await run_conversations(session, specs, concurrency, deadline)
            records = [r for chat in conversations for r in chat]
            counters = counter_figures(before, read_counters(base_url), duration)
            results.append({**asdict(summarize(concurrency, records, duration)), "num_chats": len(conversations),
                            "num_chats_planned": num_chats, **counters,
                            "ttft_ms_first_turn": _ttft_ms([chat[0] for chat in conversations if chat]),
                            "ttft_ms_later_turns": _ttft_ms([r for chat in conversations for r in chat[1:]]),
                            "errors": sorted({r.error for r in records if r.error})[:5]})
            print(format_level(results[-1]), flush=True)
            on_level(results)
    return results


def format_level(lv: dict[str, object]) -> str:
    ttft, first, later = lv["ttft_ms"], lv["ttft_ms_first_turn"], lv["ttft_ms_later_turns"]
    rate = lv["prefix_hit_rate"]
    return (f"c={lv['concurrency']:<4} chats={lv['num_chats']:<4} requests={lv['num_requests']:<5} "
            f"failed={lv['num_failed']:<3} hit rate {'-' if rate is None else f'{rate:.1%}'}  "
            f"{lv['output_tokens_per_s']:>9.1f} tok/s  TTFT p50/p99 {ttft['p50']:.1f}/{ttft['p99']:.1f} ms "  # type: ignore[index]
            f"(first turns {first['p50']:.1f}, later {later['p50']:.1f})  "  # type: ignore[index]
            f"prompt tokens computed {lv['computed_prompt_tokens']} of {lv['prompt_tokens']}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    variants: list[dict[str, object]] = []
    if args.base_url:
        run_one(args, argv, variants, "as running", args.base_url.rstrip("/"), {})
    for variant in args.variants.split(",") if args.launch else []:
        if variant not in ("on", "off"):
            raise SystemExit(f"--variants: 'on' or 'off', not {variant!r}")
        port = serve.free_port()
        flags = args.server_args + (f" {CACHING_OFF_FLAG}" if variant == "off" else "")
        log = str(Path(args.log_dir) / f"server_{variant}.log") if args.log_dir else None
        with serve.launched(serve.openai_serve_command(flags, port), port, log, args.health_timeout) as (url, server):
            run_one(args, argv, variants, variant, url, server)
    save_result(args, argv, variants, is_complete=True)


def run_one(args: argparse.Namespace, argv: list[str], variants: list[dict[str, object]], prefix_caching: str,
            base_url: str, server: dict[str, object]) -> None:
    """One variant's levels; the result file is rewritten after each level, so a run cut short keeps them."""
    model = args.model or serve.first_model(base_url)
    entry: dict[str, object] = {"prefix_caching": prefix_caching, "server": {"label": args.label, "model": model,
                                                                             **server}, "levels": []}
    variants.append(entry)

    def on_level(levels: list[dict[str, object]]) -> None:
        entry["levels"] = list(levels)
        save_result(args, argv, variants, is_complete=False)

    with asyncio.Runner(loop_factory=serve.loop_factory()) as runner:
        runner.run(run_variant(args, base_url, model, on_level))


def save_result(args: argparse.Namespace, argv: list[str], variants: list[dict[str, object]],
                is_complete: bool) -> None:
    config = {k: getattr(args, k) for k in ("turns", "system_len", "user_len", "max_tokens", "temperature", "seed",
                                            "warmup_requests", "max_seconds_per_level", "levels", "num_chats")}
    write_result(args.out, {"kind": "prefix-serve", "config": config, "variants": json.loads(json.dumps(variants)),
                            "is_complete": is_complete}, "bench.prefix_serve", argv)


if __name__ == "__main__":
    main()
