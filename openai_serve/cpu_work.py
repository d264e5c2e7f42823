"""A request's heavy CPU work (reading long lists, tokenizing, rendering the chat template,
detokenizing) off the event loop.

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


# Reading a message object (a dict whose fields are each checked in Python) costs about 64 times what a
# token id or a string does (microseconds against tens of nanoseconds).
_OBJECT_ITEM_COST = 64


def items_size(body: object, key: str) -> int:
    """About what reading the list in a body's `key` (messages, prompts, token ids) costs, in the units of
    `CpuWork.run`'s size: INLINE_CHARS of them, about half a millisecond (128 messages, or 8k token ids).
    Counts were checked before (request_limits.py: at most a context's
    worth of messages or ids, and --max-prompts-per-request prompts), so this look at the items is bounded."""
    items = body.get(key) if isinstance(body, dict) else None
    if not isinstance(items, list) or not items:
        return 0
    if isinstance(items[0], dict):
        return _OBJECT_ITEM_COST * len(items)
    if isinstance(items[0], list):  # prompts of token ids
        return sum(len(item) if isinstance(item, list) else 1 for item in items)
    return len(items)


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
