"""The prefix-heavy serving benchmark: conversations sent turn by turn (scripted stub server), the server's counters
read from /metrics, and a run against the real server, whose prefix cache serves the shared system prompt."""

import asyncio
import json
from pathlib import Path

from bench import prefix_serve, serve
from bench.load import RequestSpec, new_session, run_conversations
from tests.bench.stub_server import running_stub
from tests.e2e.serving import start_server


def _conversations(url: str, model: str, num: int, turns: int) -> list[list[RequestSpec]]:
    body = {"model": model, "prompt": [1, 2, 3], "max_tokens": 3, "stream": True}
    return [[RequestSpec(url + "/v1/completions", {**body, "user": f"{chat}/{turn}"}, 3) for turn in range(turns)]
            for chat in range(num)]


def _run(specs: list[list[RequestSpec]], concurrency: int) -> list[list[object]]:
    async def go() -> list[list[object]]:
        async with new_session(concurrency, 30) as session:
            return (await run_conversations(session, specs, concurrency))[0]  # type: ignore[return-value]

    return asyncio.run(go())


def test_turns_go_in_order_one_after_another_with_the_chats_in_parallel() -> None:
    with running_stub() as (app, url):
        conversations = _run(_conversations(url, "good", num=5, turns=3), concurrency=2)
        assert app.max_in_flight == 2  # two chats at once, never two turns of one chat
        sent = [b["user"] for b in app.bodies]
        app.bodies.clear()
        failing = _run(_conversations(url, "http-error", num=3, turns=3), concurrency=2)
    assert sorted(len(chat) for chat in conversations) == [3] * 5
    for chat in conversations:
        assert all(r.is_ok for r in chat)  # type: ignore[attr-defined]
        for turn, after in zip(chat, chat[1:], strict=False):
            assert turn.end <= after.start  # type: ignore[attr-defined]
    for chat in range(5):
        turns = [s for s in sent if s.startswith(f"{chat}/")]
        assert turns == [f"{chat}/0", f"{chat}/1", f"{chat}/2"]
    # A failed turn ends its chat: the later turns would extend a history the server never answered.
    assert [len(chat) for chat in failing] == [1, 1, 1]


def test_counters_are_read_from_the_exposition_and_give_the_hit_rate() -> None:
    exposition = "\n".join([
        "# HELP openai_serve:prefix_cache_hits_total Prefix cache hits.",
        "# TYPE openai_serve:prefix_cache_hits_total counter",
        'openai_serve:prefix_cache_hits_total{model_name="m"} 300.0',
        'openai_serve:prefix_cache_queries_total{model_name="m"} 400.0',
        'openai_serve:prompt_tokens_total{model_name="m"} 100.0',
        'openai_serve:prompt_tokens_created{model_name="m"} 1.7e9',
        'vllm:prefix_cache_hits_total{model_name="other"} 20.0',  # another namespace: counted too
        'openai_serve:num_requests_running{model_name="m"} 3.0',
    ])
    before = serve.parse_counters(exposition)
    assert before == {"prefix_cache_hits_total": 320.0, "prefix_cache_queries_total": 400.0,
                      "prompt_tokens_total": 100.0}
    after = {"prefix_cache_hits_total": 1220.0, "prefix_cache_queries_total": 1600.0, "prompt_tokens_total": 400.0}
    figures = serve.counter_figures(before, after, duration_s=2.0)
    assert figures == {"prefix_cache_queried_tokens": 1200.0, "prefix_cache_hit_tokens": 900.0,
                       "prefix_hit_rate": 0.75, "prompt_tokens": 300.0, "prompt_tokens_per_s": 150.0,
                       "computed_prompt_tokens": 300.0}
    # A server without these counters: no figure, not a zero.
    assert serve.counter_figures({}, {}, 2.0)["prefix_hit_rate"] is None


def test_against_openai_serve(tmp_path: Path, tiny_bench_model: Path) -> None:
    """The real server (in a thread) on a tiny model: every turn after the first of the first chat finds the system
    prompt and the earlier turns in the prefix cache, the engine computes only the rest."""
    server = start_server(tiny_bench_model, max_model_len=512, num_blocks=256)
    try:
        out = tmp_path / "prefix.json"
        prefix_serve.main(["--base-url", server.base_url, "--levels", "2", "--num-chats", "3", "--turns", "3",
                           "--system-len", "64", "--user-len", "16", "--max-tokens", "4", "--warmup-requests", "1",
                           "--out", str(out)])
    finally:
        server.stop()
    result = json.loads(out.read_text())
    assert result["kind"] == "prefix-serve" and result["is_complete"] and "bench.prefix_serve" in result["command"]
    (variant,) = result["variants"]
    (level,) = variant["levels"]
    assert (level["num_conversations"], level["num_requests"], level["num_failed"]) == (3, 9, 0)
    assert level["num_output_tokens"] == 9 * 4
    # Prompts: 80, 100 and 120 tokens per chat (system 64 + user 16, then + reply 4 + user 16 per turn).
    assert level["prefix_cache_queried_tokens"] == 3 * (80 + 100 + 120)
    # Cached: whole 16-token blocks only. The first turns: the system prompt's 4 blocks, except for the chat that
    # computed it first (two chats start together, so one or two of the three miss it); later turns: their previous
    # prompt's whole blocks (80 -> 80, 100 -> 96).
    hits = level["prefix_cache_hit_tokens"]
    assert 3 * (80 + 96) + 64 <= hits <= 3 * (80 + 96) + 2 * 64
    assert level["prompt_tokens"] == level["prefix_cache_queried_tokens"]  # no preemption: each prompt queried once
    assert level["computed_prompt_tokens"] == level["prefix_cache_queried_tokens"] - hits
    assert 0.6 < level["prefix_hit_rate"] < 0.8
    assert level["ttft_ms_first_turn"]["p50"] > 0 and level["ttft_ms_later_turns"]["p50"] > 0
