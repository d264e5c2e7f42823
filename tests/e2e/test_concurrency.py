"""Many clients at once: batched greedy output equals one-at-a-time output, shared prefixes hit the
prefix cache, and clients that leave mid-answer free every KV block."""

import asyncio

import httpx
import openai

from tests.e2e.serving import DEVICE, MODEL, RunningServer

SYSTEM = ("You are a helpful assistant who answers in short sentences. Continuous batching keeps the "
          "accelerator busy while paged attention stores keys and values in fixed-size blocks.")
QUESTIONS = [f"Question {i}: what is {i} plus {i * 3}?" for i in range(36)]
LONG = {"max_tokens": 300, "ignore_eos": True}
# A client that leaves before the answer stops reading well before 300 tokens can be made (a GPU makes them in about
# half a second; the tiny model on a CPU's C kernels in not much more).
LEAVE_AFTER_S = 0.1 if DEVICE == "cpu" else 0.05


def chat_kwargs(question: str) -> dict:
    return {"model": MODEL, "temperature": 0, "max_tokens": 10, "extra_body": {"ignore_eos": True},
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}


async def stream_text(client: openai.AsyncOpenAI, question: str) -> str:
    stream = await client.chat.completions.create(stream=True, **chat_kwargs(question))
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


def test_36_concurrent_streams_equal_one_at_a_time(server: RunningServer) -> None:
    sequential = [server.client().chat.completions.create(**chat_kwargs(q)) for q in QUESTIONS]
    assert sequential[-1].usage.prompt_tokens_details.cached_tokens > 0  # the system prompt's blocks were reused

    async def main() -> list[str]:
        async with server.async_client(http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=64))) as c:
            return await asyncio.gather(*(stream_text(c, q) for q in QUESTIONS))

    hits_before = server.metrics()["prefix_cache_hits_total"]
    concurrent = asyncio.run(main())
    assert concurrent == [s.choices[0].message.content for s in sequential]
    assert server.metrics()["prefix_cache_hits_total"] > hits_before
    assert server.wait_idle()["num_kv_blocks_used"] == 0


async def _leave_mid_stream(http: httpx.AsyncClient, index: int) -> int:
    body = {"model": MODEL, "prompt": f"{SYSTEM} Client {index}", "stream": True, "seed": index, **LONG}
    received = 0
    async with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            received += line.startswith("data:")
            if received >= 3:
                break  # leaving the block closes the connection mid-stream
    return received


async def _leave_before_the_answer(http: httpx.AsyncClient, index: int) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"Client {index}"}], **LONG}
    try:
        await http.post("/v1/chat/completions", json=body, timeout=httpx.Timeout(30.0, read=LEAVE_AFTER_S))
    except httpx.ReadTimeout:
        return
    raise AssertionError(f"{LONG['max_tokens']} tokens cannot be ready within {LEAVE_AFTER_S} s")


def test_disconnects_abort_sequences_and_free_every_block(server: RunningServer) -> None:
    async def main() -> None:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.base_url, limits=limits, timeout=30) as http:
            streams = [_leave_mid_stream(http, i) for i in range(24)]
            waits = [_leave_before_the_answer(http, i) for i in range(8)]
            await asyncio.gather(*streams, *waits)

    asyncio.run(main())
    # Unaborted, 32 sequences of 300 tokens would hold their blocks for many seconds more.
    metrics = server.wait_idle(timeout=5.0)
    assert metrics["num_kv_blocks_used"] == 0 and metrics["num_requests_running"] == 0
    assert metrics["num_requests_in_flight"] == 0
    assert metrics["num_kv_blocks_free"] + metrics["num_kv_blocks_evictable"] == metrics["num_kv_blocks"]
    out = server.client().completions.create(model=MODEL, prompt="Still there?", max_tokens=3)
    assert out.usage.completion_tokens >= 1
