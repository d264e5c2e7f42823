"""Prefix-heavy serving: multi-turn chats sharing one long system prompt, with prefix caching on and then off.

Every chat (bench/workload.py's `multi_turn_chats`) starts with the same `--system-len`-token system prompt, then
`--turns` turns of a `--user-len`-token message asking for `--max-tokens` tokens, each sent when the previous reply
has finished. Per level, `--num-chats` chats at most `--levels` at once, measured as bench/serve.py measures a level.
`--launch` starts openai-serve twice: prefix caching on (`--server-args` as given), then off.

    python -m bench.prefix_serve --launch --server-args "--model DIR --max-model-len 4096" --out result.json
"""

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from bench import serve
from bench.common import write_result
from bench.workload import fixed_workload, multi_turn_chats


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.prefix_serve", description=__doc__.split("\n\n")[0])
    serve.add_server_args(p, "1,64")
    p.add_argument("--log-dir", default=None, help="where the launched servers' output goes (server_VARIANT.log)")
    p.add_argument("--num-chats", default="8,192", help="chats per level: one number, or one per level")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-len", type=int, default=2048)
    p.add_argument("--user-len", type=int, default=128)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    variants: list[dict[str, object]] = []
    if args.base_url:
        run_variant(args, argv, variants, "as running", args.base_url.rstrip("/"), {})
    for variant in ("on", "off") if args.launch else ():
        port = serve.free_port()
        flags = args.server_args + (" --no-enable-prefix-caching" if variant == "off" else "")
        log = str(Path(args.log_dir) / f"server_{variant}.log") if args.log_dir else None
        with serve.launched(serve.openai_serve_command(flags, port), port, log, args.health_timeout) as (url, server):
            run_variant(args, argv, variants, variant, url, server)
    save_result(args, argv, variants, is_complete=True)


def run_variant(args: argparse.Namespace, argv: list[str], variants: list[dict[str, object]], prefix_caching: str,
                base_url: str, server: dict[str, object]) -> None:
    """One variant's levels, each of new chats on the same system prompt; the result file is rewritten after each
    level, so a run cut short keeps them."""
    model = args.model or serve.first_model(base_url)
    entry: dict[str, object] = {"prefix_caching": prefix_caching, "server": {"label": "openai-serve", "model": model,
                                                                             **server}, "levels": []}
    variants.append(entry)
    num_chats = serve.per_level([int(x) for x in args.levels.split(",")], args.num_chats, "--num-chats")
    spec = partial(serve.completion_spec, base_url, model, args=args, tokens=args.max_tokens)

    def level(index: int, concurrency: int) -> serve.Conversations:
        chats = multi_turn_chats(int(num_chats[index]), args.turns, args.system_len, args.user_len, args.max_tokens,
                                 seed=args.seed + 1000 * index + concurrency, system_seed=args.seed)
        return [[spec(turn.prompt_token_ids) for turn in chat] for chat in chats]

    def on_level(levels: list[dict[str, object]]) -> None:
        entry["levels"] = list(levels)
        save_result(args, argv, variants, is_complete=False)

    warm = fixed_workload(args.warmup_requests, args.system_len, args.max_tokens, seed=args.seed + 10**6)
    serve.run_async(serve.run_levels(args, base_url, [spec(r.prompt_token_ids) for r in warm], level, on_level))


def save_result(args: argparse.Namespace, argv: list[str], variants: list[dict[str, object]],
                is_complete: bool) -> None:
    config = {k: getattr(args, k) for k in ("turns", "system_len", "user_len", "max_tokens", "temperature", "seed",
                                            "warmup_requests", "max_seconds_per_level", "levels", "num_chats")}
    write_result(args.out, {"kind": "prefix-serve", "config": config, "variants": json.loads(json.dumps(variants)),
                            "is_complete": is_complete}, "bench.prefix_serve", argv)


if __name__ == "__main__":
    main()
