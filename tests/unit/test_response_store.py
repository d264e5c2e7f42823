"""The stored responses' bounds: a number of entries and an age, oldest out first; a background
response that leaves the store is cancelled."""

import asyncio

from openai_serve.parsers.selection import OutputParsing
from openai_serve.protocol.responses import parse_responses_request
from openai_serve.protocol.tools import ToolRequest
from openai_serve.response_run import ResponseRun
from openai_serve.response_store import ResponseStore


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def new_run(background: bool = False) -> ResponseRun:
    body = parse_responses_request({"model": "m", "input": "hi", "background": background})
    return ResponseRun(body, OutputParsing(ToolRequest(), None, None, ""), None)  # type: ignore[arg-type]


def test_the_oldest_leave_when_the_store_is_full() -> None:
    store = ResponseStore(max_entries=2, max_age_s=100, clock=Clock())
    runs = [new_run() for _ in range(3)]
    for run in runs:
        store.put(run)
    assert len(store) == 2 and store.get(runs[0].response_id) is None
    assert store.get(runs[2].response_id).run is runs[2]  # type: ignore[union-attr]


def test_entries_expire_with_age() -> None:
    clock = Clock()
    store = ResponseStore(max_entries=10, max_age_s=60, clock=clock)
    old, new = new_run(), new_run()
    store.put(old)
    clock.now = 30
    store.put(new)
    clock.now = 61
    assert store.get(old.response_id) is None and store.get(new.response_id) is not None and len(store) == 1


def test_a_store_of_size_zero_keeps_nothing() -> None:
    store = ResponseStore(max_entries=0, max_age_s=60)
    run = new_run()
    store.put(run)
    assert not store.is_enabled and store.get(run.response_id) is None


def test_a_running_background_response_that_leaves_is_cancelled() -> None:
    async def scenario() -> None:
        store = ResponseStore(max_entries=1, max_age_s=60)
        run = new_run(background=True)
        task = asyncio.ensure_future(asyncio.sleep(3600))
        store.put(run, task)
        assert store.get(run.response_id).is_running  # type: ignore[union-attr]
        store.put(new_run())  # evicts it
        await asyncio.sleep(0)
        assert task.cancelled() and run.status == "cancelled" and run.is_finished

    asyncio.run(scenario())


def test_delete_cancels_and_forgets() -> None:
    async def scenario() -> None:
        store = ResponseStore(max_entries=4, max_age_s=60)
        run = new_run(background=True)
        task = asyncio.ensure_future(asyncio.sleep(3600))
        store.put(run, task)
        assert store.pop(run.response_id) is not None and store.get(run.response_id) is None
        await asyncio.sleep(0)
        assert task.cancelled() and run.response()["status"] == "cancelled"

    asyncio.run(scenario())
