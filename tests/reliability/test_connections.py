"""Connections and HTTP: slow and silent clients, the connection cap, and every error the server or
uvicorn sends in OpenAI's shape where HTTP allows one; HTTP/1.0 clients, a duplicated Authorization
header, the model list, tiny temperatures."""

import json
import logging
import select
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from tests.e2e.serving import MODEL, RunningServer, server_config, start_server

pytestmark = pytest.mark.alone  # its deadlines are measured in wall time

KEY = "sk-connections"
ORIGIN = "https://chat.example"
HEADER_TIMEOUT_S, BODY_TIMEOUT_S = 1.0, 2.0
MAX_CONNECTIONS = 48
MAX_UNREAD_STEPS = 32


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    config = server_config(api_key=KEY, allowed_origins=(ORIGIN,), request_header_timeout=HEADER_TIMEOUT_S,
                           request_body_timeout=BODY_TIMEOUT_S, max_connections=MAX_CONNECTIONS,
                           max_unread_steps=MAX_UNREAD_STEPS)
    running = start_server(model_dir, config)
    yield running
    running.stop()


def connect(server: RunningServer, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # set before connecting: it sizes the window the server may fill
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", int(server.base_url.rsplit(":", 1)[1])))
    return sock


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def exchange(server: RunningServer, raw: bytes) -> bytes:
    """Sends raw bytes; everything the server answers until it closes the connection."""
    with connect(server) as sock:
        sock.sendall(raw)
        return read_all(sock)


def request(method: str, path: str, body: dict | None = None, headers: str = "", version: str = "1.1") -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    return (f"{method} {path} HTTP/{version}\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n{headers}\r\n").encode() + data


def openai_error(raw: bytes, status: int) -> dict:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), raw[:300]
    assert b"content-type: application/json" in head.lower(), head
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize(("raw", "status", "code"), [
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, "invalid_http_request"),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400,
     "invalid_http_request"),
    (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 70_000 + b"\r\n\r\n", 431, "headers_too_large"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40, 400, "invalid_http_request"),  # TLS to HTTP
    (b"GET /health HTTP/9.9\r\n\r\n", 400, "invalid_http_request"),
])
def test_uvicorns_own_errors_are_in_openais_shape(server: RunningServer, raw: bytes, status: int, code: str) -> None:
    assert openai_error(exchange(server, raw), status)["code"] == code


def answers(raw: bytes) -> list[tuple[int, dict]]:
    """Each response on a connection, in order: (status, JSON body), framed by their Content-Length."""
    found = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n")
                          if line.startswith(b"content-length:")))
        found.append((int(head.split(b" ")[1]), orjson.loads(rest[:length])))
        raw = rest[length:]
    return found


@pytest.mark.parametrize(("declared", "first"), [(12, (400, "invalid_json")), (None, (200, None))])
def test_a_body_longer_than_its_content_length_is_answered_then_refused_without_a_traceback(
    server: RunningServer, caplog: pytest.LogCaptureFixture, declared: int | None, first: tuple[int, str | None],
) -> None:
    """The bytes past the Content-Length are the next request, which is not HTTP: the request the Content-Length
    framed is answered first (a 400 for JSON cut short, or its completion), then the rest gets a 400, and the
    log has one line about it, no traceback."""
    body = orjson.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 2})
    framed = request("POST", "/v1/completions", headers="").replace(b"Connection: close\r\n", b"")
    raw = framed.replace(b"Content-Length: 0", b"Content-Length: %d" % (declared or len(body))) + body
    raw += b"" if declared else b', "stream": true}'
    uvicorn_log = logging.getLogger("uvicorn")
    uvicorn_log.addHandler(caplog.handler)  # uvicorn's loggers do not propagate to pytest's
    try:
        with caplog.at_level(logging.INFO):
            got = answers(exchange(server, raw))
            time.sleep(0.2)  # the first request's own log line
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    assert [status for status, _ in got] == [first[0], 400]
    assert got[0][1].get("error", {}).get("code") == first[1] and got[1][1]["error"]["code"] == "invalid_http_request"
    assert not any(r.exc_info for r in caplog.records) and "Traceback" not in caplog.text, caplog.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["Invalid HTTP request received."]


def test_a_duplicated_authorization_header_is_refused(server: RunningServer) -> None:
    raw = request("GET", "/v1/models", headers="Authorization: Bearer someone-else\r\n")
    assert openai_error(exchange(server, raw), 400)["code"] == "duplicate_header"
    assert exchange(server, request("GET", "/v1/models")).startswith(b"HTTP/1.1 200")


def test_a_refused_cors_preflight_is_in_openais_shape(server: RunningServer) -> None:
    preflight = "Origin: {}\r\nAccess-Control-Request-Method: POST\r\n"
    refused = exchange(server, request("OPTIONS", "/v1/chat/completions", headers=preflight.format("https://evil.example")))
    assert openai_error(refused, 400)["code"] == "cors_refused"
    allowed = exchange(server, request("OPTIONS", "/v1/chat/completions", headers=preflight.format(ORIGIN)))
    assert allowed.startswith(b"HTTP/1.1 200") and f"access-control-allow-origin: {ORIGIN}".encode() in allowed.lower()


def test_an_http_1_0_client_reads_a_stream_without_chunked_framing(server: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 6, "stream": True}
    raw = exchange(server, request("POST", "/v1/completions", body, version="1.0"))
    head, _, stream = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head.lower()
    assert b"connection: close" in head.lower() and b"keep-alive" not in head.lower()
    events = stream.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""] and all(e.startswith("data: {") for e in events[:-2])


def test_the_model_list_shows_served_names_not_paths(server: RunningServer) -> None:
    with server.http() as http:
        cards = http.get("/v1/models").json()["data"]
    assert {card["root"] for card in cards} == {MODEL} and "/" not in json.dumps(cards)


def test_temperatures_too_small_for_float32_sample_greedily(server: RunningServer) -> None:
    with server.http() as http:
        def text(temperature: float) -> str:
            body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 12, "temperature": temperature,
                    "ignore_eos": True}
            return http.post("/v1/completions", json=body).json()["choices"][0]["text"]

        greedy = text(0)
        assert text(1e-39) == text(1e-30) == greedy  # was NaN sampling: one token repeated


def test_slow_header_clients_get_408_and_do_not_hold_others_up(server: RunningServer,
                                                                 figures: dict[str, object]) -> None:
    slow = [connect(server) for _ in range(30)]
    for sock in slow:
        sock.sendall(b"GET /health HTTP/1.1\r\nHo")
    dripping = connect(server)

    def drip() -> None:  # a byte every 0.1 s, slower than the deadline allows
        try:
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"z" * 100:
                if select.select([dripping], [], [], 0.1)[0]:
                    return  # answered: a byte sent after the server closes resets the connection, answer unread
                dripping.sendall(bytes([byte]))
        except OSError:
            pass  # closed by the server

    threading.Thread(target=drip, daemon=True).start()
    started = time.monotonic()
    with server.http() as http:
        assert http.get("/health").status_code == 200
    served_in = time.monotonic() - started
    answers = [read_all(sock) for sock in slow]
    try:
        answers.append(read_all(dripping))
    except ConnectionResetError:
        pass  # the server closed it while a byte was on its way (the drip's check and send race): the 408 was reset
    closed_in = time.monotonic() - started
    for answer in answers:
        assert openai_error(answer, 408)["code"] == "request_timeout"
    assert served_in < 0.5 and closed_in < HEADER_TIMEOUT_S + 2
    for sock in [*slow, dripping]:
        sock.close()
    figures["slow_header_clients"] = {"clients": len(answers), "closed_within_s": round(closed_in, 2)}


def test_a_slow_body_gets_408(server: RunningServer) -> None:
    with connect(server) as sock:
        started = time.monotonic()  # before the bytes go: the server's timer cannot start earlier
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                     + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
        answer = read_all(sock)
    assert openai_error(answer, 408)["code"] == "request_timeout"
    assert BODY_TIMEOUT_S <= time.monotonic() - started < BODY_TIMEOUT_S + 2


def test_connections_past_the_cap_are_refused_at_once_and_logged(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="openai_serve.http_protocol")
    idle = [connect(server) for _ in range(MAX_CONNECTIONS + 12)]
    time.sleep(0.3)  # well within the header deadline: only refusals have been answered
    refused = []
    for sock in idle:
        sock.setblocking(False)
        try:
            refused.append(sock.recv(4096))
        except BlockingIOError:
            pass  # one of the connections within the cap: waiting for its request
    assert len(refused) >= 12
    for answer in refused:
        assert openai_error(answer, 503)["code"] == "too_many_connections"
    assert any("connection(s) refused" in r.getMessage() for r in caplog.records)
    for sock in idle:
        sock.close()
    time.sleep(0.2)
    assert exchange(server, request("GET", "/health")).startswith(b"HTTP/1.1 200")


def test_a_client_that_stops_reading_has_its_generation_stopped(server: RunningServer, caplog: pytest.LogCaptureFixture,
                                                                 figures: dict[str, object]) -> None:
    """It holds no KV blocks long after it stopped reading, while it is still connected; a client that
    reads the same request at the same time gets all of it."""
    caplog.set_level(logging.WARNING, logger="openai_serve.engine_bridge")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 480, "n": 4,
            "ignore_eos": True, "stream": True, "logprobs": True, "top_logprobs": 20}

    def read_stream() -> list[str]:
        with server.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as reading:
            return [line for line in reading.iter_lines() if '"finish_reason":"length"' in line]

    with connect(server, rcvbuf=4096) as silent, ThreadPoolExecutor(1) as pool:
        silent.sendall(request("POST", "/v1/chat/completions", body))
        started = time.monotonic()
        reader = pool.submit(read_stream)  # meanwhile
        while not any("unread" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < started + 30, "the silent client's generation was not stopped"
            time.sleep(0.05)
        stopped_in = time.monotonic() - started
        assert not reader.done(), "the reading client was done first: this shows nothing about it"
        assert len(reader.result(timeout=60)) == 4  # served in full beside it
        metrics = server.wait_idle()
        assert metrics["num_requests_running"] == 0 and metrics["num_kv_blocks_used"] == 0  # while still connected
        answer = read_all(silent)
    assert b'"response_not_read"' in answer[-600:] and b"data: [DONE]" in answer[-100:]  # (in HTTP chunks)
    figures["non_reading_client"] = {"max_unread_steps": MAX_UNREAD_STEPS, "stopped_after_s": round(stopped_in, 2),
                                     "kv_blocks_used_after": metrics["num_kv_blocks_used"]}
