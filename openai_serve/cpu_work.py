"""A request's heavy CPU work (tokenizing, rendering the chat template, detokenizing) off the event loop.

Small inputs are worked on the loop, where a thread hop would cost more than the work. Large ones
(over `INLINE_CHARS` characters, or tokens) go to this module's threads, at most `num_threads` at
once: the tokenizers' Rust code releases Python's interpreter lock while it works (transformers'
fast tokenizers encode through `encode_batch`, which does), and Jinja's pure-Python rendering gives
it back every switch interval, so the loop keeps serving meanwhile. How large an input can be is
bounded before this (request_limits.py), so is the work.
"""

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

INLINE_CHARS = 8192  # below this, tokenizing takes well under a millisecond: not worth a thread hop


class CpuWork:
    def __init__(self, num_threads: int = 2) -> None:
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix="cpu-work")

    async def run(self, size: int, work: Callable[[], T]) -> T:
        """`work()`, on the loop when `size` (characters or tokens of its input) is small, else on a thread."""
        if size <= INLINE_CHARS:
            return work()
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
