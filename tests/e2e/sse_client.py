"""Raw SSE parsing, as a client without the SDK would do it: `data:` lines, events end at a blank line."""

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import orjson

DONE = "[DONE]"


@dataclass
class RawStream:
    status_code: int
    content_type: str
    events: list[str]  # each event's data, in order, "[DONE]" included

    @property
    def chunks(self) -> list[dict]:
        assert self.events and self.events[-1] == DONE, f"the stream must end with [DONE]: {self.events[-3:]}"
        return [orjson.loads(e) for e in self.events[:-1]]


def iter_events(lines: Iterator[str]) -> Iterator[str]:
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        # comments (": ping") and other fields are ignored, as EventSource does
    if data:
        yield "\n".join(data)


def post_stream(http: httpx.Client, path: str, body: dict) -> RawStream:
    with http.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            response.read()
            return RawStream(response.status_code, response.headers.get("content-type", ""), [response.text])
        events = list(iter_events(response.iter_lines()))
        return RawStream(200, response.headers["content-type"], events)


def texts_by_index(chunks: list[dict], key: str = "text") -> dict[int, str]:
    """Concatenated text per choice index (key "text" for completions, "content" for chat deltas)."""
    out: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            piece = choice["text"] if key == "text" else choice["delta"].get("content") or ""
            out[choice["index"]] = out.get(choice["index"], "") + piece
    return out


def iter_typed_events(lines: Iterator[str]) -> Iterator[tuple[str | None, dict]]:
    """Events with their `event:` name (the Responses API's), each with its data parsed."""
    name: str | None = None
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield name, orjson.loads("\n".join(data))
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield name, orjson.loads("\n".join(data))
