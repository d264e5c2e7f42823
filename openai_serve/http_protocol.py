"""uvicorn's HTTP protocol (httptools) with the connection hygiene uvicorn leaves out.

- A connection cap: past `max_connections` open connections a new one is answered 503 and closed
  at once (so idle clients cannot exhaust the process's file descriptors), logged at most once per
  10 s with the count refused.
- A deadline for a request's head (request line and headers): a client that has not sent them all
  within `header_timeout_s` of connecting, or of starting its next request, gets a 408 and is closed
  (a slow-header client holds nothing for long). Idle keep-alive connections are uvicorn's
  `timeout_keep_alive`; a slow body is read_json's deadline (http_io.py).
- Limits on the URL (8 KiB, 414) and on the headers (64 KiB, 431): httptools has none.
- A bounded socket send buffer (`SEND_BUFFER_BYTES`): the kernel would otherwise let it grow to
  tcp_wmem's maximum (4 MiB on Linux) for a client that stops reading; past it, writes wait and the
  bridge stops the generation of a response left unread (--max-unread-steps, engine_bridge.py).
  LLM output is slow, so a smaller buffer costs no throughput.
- uvicorn's own errors (a malformed request, a bad Content-Length) in OpenAI's error shape. The
  connection is then closed as Apache's "lingering close" does: the write side first, the rest of
  what the client sends read and dropped for up to `LINGER_S`; closing with unread bytes would
  make the kernel answer them with a reset, which can reach the client before it read the error
  (a 100 KB URL's 414 was lost that way now and then). The requests before the broken bytes on the
  same connection (pipelined ones, or one whose body ran past its Content-Length) are answered
  first, as nginx does: the refusal follows their answers, never cuts into one.
- HTTP/1.0 clients get a stream as HTTP/1.0 allows it: no chunked framing, the connection closed at
  its end (uvicorn would send chunks, which an HTTP/1.0 client cannot read).

It reaches into uvicorn's protocol (its `cycle`, `url`, `send_400_response`), whose version is
pinned by the tests in tests/reliability, which check each behaviour against a real server.
"""

import logging
import socket
import time
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

logger = logging.getLogger(__name__)

MAX_URL_BYTES = 8 * 1024
MAX_HEADER_BYTES = 64 * 1024
SEND_BUFFER_BYTES = 256 * 1024  # Linux doubles it for its own bookkeeping
_REFUSAL_LOG_INTERVAL_S = 10.0
LINGER_S = 2.0  # how long a refused request's connection reads what is still coming before it closes


class _Refused(Exception):
    """Stops the parser: the request breaks one of the limits above (its response is set)."""


def error_response(status: int, message: str, code: str) -> bytes:
    """A whole HTTP response in OpenAI's error shape, that closes the connection."""
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": code}})
    head = b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n" % len(body)
    if status == 503:
        head += b"retry-after: 1\r\n"
    return STATUS_LINE[status] + head + b"\r\n" + body


class _RefusalLog:
    """Logs refused connections at most once per interval, with how many since the last line."""

    def __init__(self) -> None:
        self.num_refused = 0
        self._last = 0.0

    def refused(self, limit: int) -> None:
        self.num_refused += 1
        now = time.monotonic()
        if now - self._last >= _REFUSAL_LOG_INTERVAL_S:
            logger.warning("%d connection(s) refused: %d are open, the limit (--max-connections)", self.num_refused,
                           limit)
            self._last, self.num_refused = now, 0


class GuardedHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, max_connections: int, header_timeout_s: float, refusals: _RefusalLog,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_connections = max_connections
        self._header_timeout_s = header_timeout_s
        self._refusals = refusals
        self._head_timer: Any = None
        self._head_bytes = 0
        self._refusal: bytes | None = None
        self._is_lingering = False
        self._refusal_after_answers: bytes | None = None

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        if len(self.connections) > self._max_connections:
            self._refusals.refused(self._max_connections)
            self._respond_and_close(error_response(503, "The server has too many open connections. Retry shortly.",
                                                   "too_many_connections"))
            return
        self._start_head_timer()

    def data_received(self, data: bytes) -> None:
        if not self._is_lingering:  # (what comes after a refusal is dropped)
            super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._start_head_timer()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > MAX_URL_BYTES:
            self._refuse(414, f"The URL is longer than {MAX_URL_BYTES} bytes.", "uri_too_long")

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > MAX_HEADER_BYTES:
            self._refuse(431, f"The request's headers are longer than {MAX_HEADER_BYTES} bytes.",
                         "headers_too_large")

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()
        if self.scope.get("http_version") == "1.0" and self.cycle is not None:
            _send_close_delimited(self.cycle)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse, or to one this protocol refused: at once, or once the
        requests parsed before it are answered."""
        refusal = self._refusal or error_response(400, f"{msg} The request is not valid HTTP/1.1.",
                                                  "invalid_http_request")
        self._is_lingering = True  # nothing after the broken bytes is parsed
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self._respond_and_close(refusal, is_lingering=True)
        elif cycle.more_body or cycle.response_started:  # the broken bytes are its body, or cut into its answer
            cycle.disconnected = True  # its app sees a client gone, and what it still sends is dropped
            cycle.message_event.set()
            if cycle.response_started:
                self.transport.close()
            else:
                self._respond_and_close(refusal, is_lingering=True)
        else:
            self._refusal_after_answers = refusal

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refusal_after_answers is not None and self.cycle is not None and self.cycle.response_complete:
            self._respond_and_close(self._refusal_after_answers, is_lingering=True)

    def _refuse(self, status: int, message: str, code: str) -> None:
        self._refusal = error_response(status, message, code)
        raise _Refused()  # httptools raises it out of feed_data as a parser error: send_400_response

    def _start_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self._header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()  # a response is being written: no second one can start
            return
        self._respond_and_close(error_response(408, f"The request's headers did not arrive within "
                                               f"{self._header_timeout_s:g} s.", "request_timeout"))

    def _respond_and_close(self, response: bytes, is_lingering: bool = False) -> None:
        """`is_lingering`: a lingering close (the module's docstring), for a refusal whose request may still be
        arriving."""
        self._cancel_head_timer()
        if self.transport.is_closing():
            return
        self.transport.write(response)
        if not (is_lingering and self.transport.can_write_eof()):
            self.transport.close()
            return
        self.transport.write_eof()  # the client reads the answer, then its end; the connection closes on its FIN
        self._is_lingering = True
        self.loop.call_later(LINGER_S, self.transport.close)


def _send_close_delimited(cycle: RequestResponseCycle) -> None:
    """Makes a response without Content-Length go out unframed, ended by closing the connection (HTTP/1.0)."""
    send = cycle.send
    is_unframed = False

    async def close_delimited_send(message: Any) -> None:
        nonlocal is_unframed
        if message["type"] == "http.response.start" and not cycle.response_started:
            headers = list(message.get("headers", []))
            names = {name.lower() for name, _ in headers}
            if b"content-length" not in names and b"transfer-encoding" not in names:
                is_unframed = True
                cycle.keep_alive = False  # uvicorn says `connection: close`, and closes after the last body
                cycle.chunked_encoding = False
                cycle.expected_content_length = 1 << 62  # uvicorn counts it down: never reached
                message = {**message, "headers": [(n, v) for n, v in headers if n.lower() != b"connection"]}
        elif is_unframed and message["type"] == "http.response.body" and not message.get("more_body", False):
            cycle.expected_content_length = len(message.get("body", b""))  # its end is this last body
        await send(message)

    cycle.send = close_delimited_send  # type: ignore[method-assign]


def guarded_protocol(max_connections: int, header_timeout_s: float) -> Any:
    """The protocol class uvicorn's Config(http=...) takes, with these limits."""
    refusals = _RefusalLog()

    def create(*args: Any, **kwargs: Any) -> GuardedHttpProtocol:
        return GuardedHttpProtocol(*args, max_connections=max_connections, header_timeout_s=header_timeout_s,
                                   refusals=refusals, **kwargs)

    return create
