"""POST /v1/completions end to end: the official SDK (sync and async) and raw SSE over a real server."""

import asyncio
import time

import openai
import pytest

from tests.e2e.serving import ALIAS, MODEL, RunningServer
from tests.e2e.sse_client import post_stream, texts_by_index

GREEDY = {"temperature": 0.0}
NO_EOS = {"ignore_eos": True}


def prompt_tokens(server: RunningServer, prompt: str) -> int:
    with server.http() as http:
        return http.post("/tokenize", json={"prompt": prompt}).json()["count"]


def test_sdk_completion_usage_is_exact(server: RunningServer) -> None:
    client = server.client()
    out = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=7, extra_body=NO_EOS)
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    assert len(out.choices) == 1 and out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 7
    assert out.usage.prompt_tokens == prompt_tokens(server, "The quick brown fox")
    assert out.usage.total_tokens == out.usage.prompt_tokens + 7


def test_default_max_tokens_is_16_and_alias_names_the_model(server: RunningServer) -> None:
    out = server.client().completions.create(model=ALIAS, prompt="Hello", extra_body=NO_EOS)
    assert out.usage.completion_tokens == 16
    assert out.model == ALIAS


def test_several_prompts_times_n_are_indexed_prompt_by_prompt(server: RunningServer) -> None:
    prompts = ["Hello there", "Paged attention stores keys"]
    out = server.client().completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=4, seed=3, extra_body=NO_EOS)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.prompt_tokens == sum(prompt_tokens(server, p) for p in prompts)  # each prompt counted once
    assert out.usage.completion_tokens == 4 * 4
    # Choice 2 continues prompt 1 with the seed of choice 0 (seed + j): same as prompt 1 alone.
    alone = server.client().completions.create(model=MODEL, prompt=prompts[1], max_tokens=4, seed=3, extra_body=NO_EOS)
    assert {c.index: c.text for c in out.choices}[2] == alone.choices[0].text


def test_token_id_prompts(server: RunningServer) -> None:
    client = server.client()
    ids = client.completions.create(model=MODEL, prompt=[5, 6, 7, 8], max_tokens=5, extra_body=GREEDY | NO_EOS)
    assert ids.usage.prompt_tokens == 4
    batch = client.completions.create(model=MODEL, prompt=[[5, 6, 7, 8], [9, 10]], max_tokens=5,
                                      extra_body=GREEDY | NO_EOS)
    assert batch.usage.prompt_tokens == 6
    assert {c.index: c.text for c in batch.choices}[0] == ids.choices[0].text


def test_seeded_choices_are_seed_plus_index(server: RunningServer) -> None:
    client = server.client()
    two = client.completions.create(model=MODEL, prompt="Once upon a time", n=2, seed=11, max_tokens=8,
                                    extra_body=NO_EOS)
    again = client.completions.create(model=MODEL, prompt="Once upon a time", n=2, seed=11, max_tokens=8,
                                      extra_body=NO_EOS)
    shifted = client.completions.create(model=MODEL, prompt="Once upon a time", seed=12, max_tokens=8,
                                        extra_body=NO_EOS)
    texts = [c.text for c in sorted(two.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    assert texts[1] == shifted.choices[0].text
    assert texts[0] != texts[1]


def test_echo_prepends_the_prompt_streamed_or_not(server: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "Hello! How", "max_tokens": 4, "echo": True, "temperature": 0}
    with server.http() as http:
        full = http.post("/v1/completions", json=body).json()
        streamed = post_stream(http, "/v1/completions", body | {"stream": True})
    assert full["choices"][0]["text"].startswith("Hello! How")
    assert streamed.chunks[0]["choices"][0]["text"] == "Hello! How"
    assert texts_by_index(streamed.chunks)[0] == full["choices"][0]["text"]


def test_logprobs_shape_and_greedy_picks_the_top(server: RunningServer) -> None:
    out = server.client().completions.create(model=MODEL, prompt="Hello", max_tokens=6, logprobs=3,
                                             temperature=0, extra_body=NO_EOS)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert chosen <= 0 and 3 <= len(top) <= 4
        assert chosen == pytest.approx(max(top.values()))  # temperature 0 takes the most likely token
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[-1] <= len(out.choices[0].text)


def test_raw_stream_follows_every_rule(server: RunningServer) -> None:
    body = {"model": MODEL, "prompt": ["Hello", "The quick"], "n": 2, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}, "seed": 5, "ignore_eos": True}
    with server.http() as http:
        stream = post_stream(http, "/v1/completions", body)
        full = http.post("/v1/completions", json=body | {"stream": False, "stream_options": None}).json()
    assert stream.content_type.startswith("text/event-stream")
    chunks = stream.chunks
    assert len({c["id"] for c in chunks}) == 1
    *content, last = chunks
    assert last["choices"] == [] and last["usage"] == full["usage"]
    assert all(c["usage"] is None for c in content)
    for index in range(4):
        mine = [c["choices"][0] for c in content if c["choices"][0]["index"] == index]
        assert [c["finish_reason"] for c in mine] == [None] * (len(mine) - 1) + ["length"]
    assert all(len(c["choices"]) == 1 for c in content)
    assert texts_by_index(content) == {c["index"]: c["text"] for c in full["choices"]}


def test_stream_equals_full_text_for_the_same_seed(server: RunningServer) -> None:
    kwargs = {"model": MODEL, "prompt": "你好，世界 🚀", "max_tokens": 24, "seed": 1234, "n": 2}
    client = server.client()
    full = client.completions.create(**kwargs)
    pieces: dict[int, str] = {}
    for chunk in client.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            pieces[choice.index] = pieces.get(choice.index, "") + choice.text
    assert pieces == {c.index: c.text for c in full.choices}


def test_async_client_streams_concurrently(server: RunningServer) -> None:
    async def one(client: openai.AsyncOpenAI, seed: int) -> tuple[str, str]:
        kwargs = {"model": MODEL, "prompt": "Continuous batching", "max_tokens": 6, "seed": seed}
        full = await client.completions.create(**kwargs)
        text = "".join([c.choices[0].text async for c in await client.completions.create(stream=True, **kwargs)])
        return full.choices[0].text, text

    async def main() -> list[tuple[str, str]]:
        async with server.async_client() as client:
            return await asyncio.gather(*(one(client, seed) for seed in range(4)))

    for full, streamed in asyncio.run(main()):
        assert full == streamed


@pytest.mark.alone  # it times the abort
def test_stop_string_is_never_sent_and_the_sequence_ends_at_once(server: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "Prefix caching reuses", "max_tokens": 300, "temperature": 0,
            "ignore_eos": True}
    with server.http() as http:
        full = http.post("/v1/completions", json=body | {"max_tokens": 20}).json()["choices"][0]["text"]
        stop = full[6:9]
        cut = full[: full.index(stop)]
        started = time.monotonic()
        stream = post_stream(http, "/v1/completions", body | {"stream": True, "stop": [stop, "never-seen"]})
        metrics = server.wait_idle(timeout=2.0)
        elapsed = time.monotonic() - started
    texts = [c["choices"][0]["text"] for c in stream.chunks]
    assert "".join(texts) == cut
    assert all(stop not in t for t in texts)
    assert stream.chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # 300 tokens take several seconds here; the abort freed everything long before that.
    assert metrics["num_kv_blocks_used"] == 0 and metrics["num_requests_running"] == 0
    assert elapsed < 2.5


def test_stop_string_usage_counts_tokens_up_to_the_stop(server: RunningServer) -> None:
    client = server.client()
    full = client.completions.create(model=MODEL, prompt="Hello", max_tokens=20, temperature=0, logprobs=0,
                                     extra_body=NO_EOS)
    text, tokens = full.choices[0].text, full.choices[0].logprobs.tokens
    stop = text[5:8]
    cut = client.completions.create(model=MODEL, prompt="Hello", max_tokens=20, temperature=0, stop=stop,
                                    logprobs=0, extra_body=NO_EOS)
    n = cut.usage.completion_tokens
    assert n < 20 and cut.choices[0].logprobs.tokens == tokens[:n]
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    with_stop = client.completions.create(model=MODEL, prompt="Hello", max_tokens=20, temperature=0, stop=stop,
                                          extra_body=NO_EOS | {"include_stop_str_in_output": True})
    assert with_stop.choices[0].text == text[: text.index(stop) + len(stop)]


def test_stop_token_ids_top_k_and_min_p(server: RunningServer) -> None:
    client = server.client()
    every_id = list(range(server.engine.vocab_size))
    stopped = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=8, temperature=1.0,
                                        extra_body={"stop_token_ids": every_id})
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 1
    greedy = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=8, temperature=0, extra_body=NO_EOS)
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        sampled = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=8, temperature=1.0, seed=9,
                                            extra_body=NO_EOS | extra)
        assert sampled.choices[0].text == greedy.choices[0].text, extra
