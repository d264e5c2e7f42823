"""Streams whose reader falls behind: the server merges what piled up into fewer chunks, and the
client still reads exactly the non-streamed answer."""

import socket
import time

import httpx
import orjson
import pytest

from tests.e2e.serving import MODEL, RunningServer
from tests.e2e.sse_client import DONE, iter_events

# A tiny receive window makes the server's writes block (uvicorn pauses the stream) within a few
# hundred kilobytes, so the engine runs ahead of the stream and outputs queue up behind it.
SMALL_RECEIVE_BUFFER = [(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)]


def read_slowly(server: RunningServer, body: dict) -> list[dict]:
    transport = httpx.HTTPTransport(socket_options=SMALL_RECEIVE_BUFFER)
    with httpx.Client(base_url=server.base_url, transport=transport, timeout=60) as http, \
            http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        pieces = []
        for piece in response.iter_raw(2048):
            pieces.append(piece)
            time.sleep(0.005)  # at most 400 kB/s, slower than the engine makes this stream here
    events = list(iter_events(b"".join(pieces).decode().split("\n")))
    assert events[-1] == DONE
    return [orjson.loads(e) for e in events[:-1]]


@pytest.mark.alone  # the server must outrun the reader
def test_a_slow_reader_gets_every_token_merged_into_fewer_chunks(server: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "n": 2, "seed": 7, "logprobs": 5,
            "ignore_eos": True}
    with server.http() as http:
        full = http.post("/v1/completions", json=body).json()
    chunks = read_slowly(server, body | {"stream": True, "stream_options": {"include_usage": True}})

    *content, last = chunks
    assert last["choices"] == [] and last["usage"] == full["usage"]
    for expected in full["choices"]:
        mine = [c["choices"][0] for c in content if c["choices"][0]["index"] == expected["index"]]
        assert "".join(c["text"] for c in mine) == expected["text"]
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            assert [x for c in mine if c["logprobs"] for x in c["logprobs"][key]] == expected["logprobs"][key]
        assert [c["finish_reason"] for c in mine] == [None] * (len(mine) - 1) + ["length"]
        # Fewer chunks than tokens: the stream did fall behind and merged (else this test proves nothing).
        assert len(mine) - 1 < len(expected["logprobs"]["tokens"]) == 400
