"""When the server restarts a failed engine, and when it stops trying.

A failed engine (its process killed, a device fault, a step that raised) is replaced by a fresh one
built from the same config: the first restart within the window at once, each next one after a
back-off that doubles (1, 2, 4 ... s, at most 30 s). More than `max_restarts` restarts within
`window_s` (a crash loop) and the server stops trying: it stays up answering 503, or exits when
`--exit-on-engine-failure` asks for that (then it never restarts: orchestrators restart the server).
"""

import time
from collections import deque
from dataclasses import dataclass, field

MAX_BACKOFF_S = 30.0


@dataclass
class RestartPolicy:
    max_restarts: int  # within window_s; 0: never restart
    window_s: float = 600.0
    _restarts: deque[float] = field(default_factory=deque)  # monotonic times of the recent ones

    def next_delay(self, now: float | None = None) -> float | None:
        """Seconds to wait before the next restart, counting it; None when no restart is left."""
        now = time.monotonic() if now is None else now
        while self._restarts and now - self._restarts[0] > self.window_s:
            self._restarts.popleft()
        if len(self._restarts) >= self.max_restarts:
            return None
        delay = 0.0 if not self._restarts else min(2.0 ** (len(self._restarts) - 1), MAX_BACKOFF_S)
        self._restarts.append(now + delay)
        return delay

    @property
    def num_recent(self) -> int:
        return len(self._restarts)
