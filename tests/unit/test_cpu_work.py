"""cpu_work.py: which inputs are worked off the event loop."""

import asyncio
import threading

from openai_serve.cpu_work import INLINE_CHARS, CpuWork, items_size


def test_items_size_weighs_message_objects_above_ids_and_strings() -> None:
    assert items_size({"messages": [{"role": "user", "content": "x"}] * 200}, "messages") == 64 * 200
    assert items_size({"prompt": [7] * 5000}, "prompt") == 5000
    assert items_size({"prompt": ["a", "b"]}, "prompt") == 2
    assert items_size({"prompt": [[1, 2, 3], [4] * 10]}, "prompt") == 13
    assert items_size({"prompt": "a long string is sized when it is tokenized"}, "prompt") == 0
    assert items_size({"prompt": []}, "prompt") == items_size([1, 2], "prompt") == 0


def test_large_work_runs_on_a_thread_small_work_on_the_loop() -> None:
    work = CpuWork()

    async def thread_names() -> tuple[str, str]:
        small = await work.run(INLINE_CHARS, lambda: threading.current_thread().name)
        large = await work.run(INLINE_CHARS + 1, lambda: threading.current_thread().name)
        return small, large

    try:
        small, large = asyncio.run(thread_names())
    finally:
        work.close()
    assert small == threading.current_thread().name and large.startswith("cpu-work")
