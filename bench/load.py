"""The load generator's client side: streamed /v1/completions requests over aiohttp, read as a client.

The body is read as raw bytes and cut into server-sent events here (`SSEParser`), so nothing of a server's SDK is
trusted. A chunk counts as a token arrival when one of its choices carries text; the usage chunk gives the token
count, else the text chunks are counted. A request fails when the status is not 200, the stream carries an error, it
ends before a choice finished, or it returns another number of tokens than asked for, which `ignore_eos` promises. A
stream that ends after its finish_reason without `data: [DONE]` is complete, as the OpenAI SDK sees it. Chunks that
arrive in one network read share their timestamp.
"""

import asyncio
import time
from dataclasses import dataclass

import aiohttp
import orjson

from bench.stats import RequestRecord

DONE = "[DONE]"


class SSEParser:
    """Incremental server-sent-events parser: bytes in, each complete event's data out, by the EventSource rules:
    `data:` lines (one leading space dropped) joined by newlines, an event ended by a blank line, comments and other
    fields ignored, CRLF accepted."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data
        # A trailing CR may be half of a CRLF split across reads: keep it for the next read.
        usable, tail = (self._buffer[:-1], b"\r") if self._buffer.endswith(b"\r") else (self._buffer, b"")
        blocks = usable.replace(b"\r\n", b"\n").split(b"\n\n")
        self._buffer = blocks.pop() + tail
        return [event for block in blocks if (event := _event_data(block)) is not None]


def _event_data(block: bytes) -> str | None:
    lines = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines).decode() if lines else None


@dataclass(frozen=True)
class RequestSpec:
    url: str  # the full /v1/completions URL
    body: dict[str, object]
    expect_tokens: int  # asked for with ignore_eos: exactly this many tokens, or the request failed


async def send(session: aiohttp.ClientSession, spec: RequestSpec) -> RequestRecord:
    """Sends one streamed request and records what the client saw; never raises for a server's fault."""
    record = RequestRecord(start=time.perf_counter())
    try:
        async with session.post(spec.url, json=spec.body) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.text())[:300]}"
                return record
            await _read_stream(response, record)
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    if record.error is None and record.num_output_tokens != spec.expect_tokens:
        record.error = f"{record.num_output_tokens} tokens, {spec.expect_tokens} asked for with ignore_eos"
    return record


async def _read_stream(response: aiohttp.ClientResponse, record: RequestRecord) -> None:
    parser = SSEParser()
    num_text_chunks, usage_tokens, last_time, is_finished = 0, None, 0.0, False
    async for data in response.content.iter_any():
        last_time = time.perf_counter()
        for event in parser.feed(data):
            if event == DONE:
                _complete(record, last_time, usage_tokens, num_text_chunks)
                return
            chunk = orjson.loads(event)
            if not isinstance(chunk, dict) or "error" in chunk:
                record.error = f"error in stream: {event[:300]}"
                return
            choices = chunk.get("choices") or ()
            if any(c.get("text") for c in choices):
                record.chunk_times.append(last_time)
                num_text_chunks += 1
            is_finished = is_finished or any(c.get("finish_reason") for c in choices)
            if usage := chunk.get("usage"):
                usage_tokens = int(usage["completion_tokens"])
    if not is_finished:
        record.error = "the stream ended without a finish_reason or data: [DONE]"
        return
    _complete(record, last_time, usage_tokens, num_text_chunks)


def _complete(record: RequestRecord, end: float, usage_tokens: int | None, num_text_chunks: int) -> None:
    record.end = end
    record.num_output_tokens = usage_tokens if usage_tokens is not None else num_text_chunks


async def run_conversations(session: aiohttp.ClientSession, conversations: list[list[RequestSpec]], concurrency: int,
                            deadline: float | None = None) -> tuple[list[list[RequestRecord]], float]:
    """Sends each conversation's turns in order, a turn when the previous one has finished, with at most
    `concurrency` conversations in flight; returns each conversation's records (one per turn sent) and the wall time.

    A closed loop: a conversation starts as soon as one in flight ends. Past `deadline` (a perf_counter time) none
    starts; one started runs to its end. A failed turn ends its conversation: the turns after it would extend a
    history the server never answered.
    """
    pending = iter(conversations)
    done: list[list[RequestRecord]] = []

    async def worker() -> None:
        while deadline is None or time.perf_counter() < deadline:
            if (conversation := next(pending, None)) is None:
                return
            records: list[RequestRecord] = []
            done.append(records)
            for spec in conversation:
                records.append(await send(session, spec))
                if not records[-1].is_ok:
                    break

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(conversations)))))
    return done, time.perf_counter() - start


def new_session(concurrency: int, read_timeout_s: float) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=read_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)
