"""Stored responses of the Responses API, in memory: GET /v1/responses/{id} reads one back,
`previous_response_id` continues its conversation, DELETE forgets it, and a background response
(stored from its start) can be cancelled.

Bounded: at most `max_entries` responses (--responses-store-max-entries), each for at most
`max_age_s` seconds after it was stored (--responses-store-max-age-s); past either, the oldest go
first. A background response that leaves the store (evicted, deleted) is cancelled, so no work runs
that nobody can read. Only the event loop's thread touches the store.
"""

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from openai_serve.response_run import ResponseRun


@dataclass
class StoredResponse:
    run: ResponseRun
    stored_at: float
    task: asyncio.Task[None] | None = None  # a background response's, until it ends

    @property
    def is_running(self) -> bool:
        """A background response still being written (its task may outlive its last event by a moment)."""
        return self.task is not None and not self.task.done() and not self.run.is_finished

    def cancel(self) -> None:
        """A running background response ends `cancelled` (its engine request is aborted); one that
        ended stays as it ended."""
        if self.is_running:
            self.task.cancel()  # type: ignore[union-attr]
            self.run.cancel()


class ResponseStore:
    def __init__(self, max_entries: int, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self._max_age_s = max_age_s
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    @property
    def is_enabled(self) -> bool:
        return self.max_entries > 0

    def put(self, run: ResponseRun, task: asyncio.Task[None] | None = None) -> None:
        """Stores `run` (a background one with its `task`); the oldest leave if the store is full."""
        if not self.is_enabled:
            return
        self._expire()
        while len(self._entries) >= self.max_entries:
            _, oldest = self._entries.popitem(last=False)
            oldest.cancel()
        self._entries[run.response_id] = StoredResponse(run, self._clock(), task)

    def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        return self._entries.get(response_id)

    def pop(self, response_id: str) -> StoredResponse | None:
        self._expire()
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            entry.cancel()
        return entry

    def close(self) -> None:
        """Cancels every background response still running (the server is stopping)."""
        for entry in self._entries.values():
            entry.cancel()

    def _expire(self) -> None:
        deadline = self._clock() - self._max_age_s
        while self._entries:
            response_id, oldest = next(iter(self._entries.items()))
            if oldest.stored_at > deadline:
                return
            del self._entries[response_id]
            oldest.cancel()
