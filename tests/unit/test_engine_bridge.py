"""The bridge between asyncio and the engine (its output thread), driven by a small scripted engine (the real
engine is exercised end to end in tests/e2e; here we need an engine that fails on demand)."""

import asyncio
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from core import FinishReason, RequestOutput, RequestRejected, SamplingParams
from openai_serve.engine_bridge import EngineBridge, EngineState
from openai_serve.engine_restarts import RestartPolicy
from openai_serve.errors import APIError

T = TypeVar("T")


# Like a real device step, and long enough that the event loop gets the GIL between steps: with
# microsecond steps a request could run to its end before a scenario's abort or failure lands.
STEP_SECONDS = 0.001
# For scenarios that end requests by abort, shutdown or failure: no request finishes by itself.
ENDLESS = 10**9


class ScriptedEngine:
    """Every step gives each running request one token; a request finishes after `length` tokens."""

    def __init__(self, length: int = 3) -> None:
        self.length = length
        self.inbox: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self.running: dict[str, int] = {}
        self.aborted: list[str] = []
        self.fail = threading.Event()
        self.has_work = threading.Event()
        self.num_steps_with_outputs = 0
        self.closed = False
        self.is_dead = False  # as an engine process that is gone: sending to it raises
        self.error_ids: set[str] = set()  # requests it ends with FinishReason.ERROR

    def restarted(self) -> "ScriptedEngine":
        self.close()
        return ScriptedEngine(self.length)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not prompt_token_ids:
            raise RequestRejected("prompt", "empty")
        if self.is_dead:
            raise RuntimeError("the engine process is gone")
        self.inbox.put(("add", request_id))
        self.has_work.set()

    def add_requests(self, requests: list[tuple[str, list[int], SamplingParams]]) -> None:
        for request in requests:
            self.add_request(*request)

    def abort_request(self, request_id: str) -> None:
        if self.is_dead:
            raise RuntimeError("the engine process is gone")
        self.inbox.put(("abort", request_id))
        self.has_work.set()

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or not self.inbox.empty()

    def wait_for_work(self, timeout: float | None = None) -> None:
        self.has_work.wait(timeout)

    def next_outputs(self, idle_timeout: float) -> list[RequestOutput]:  # as LLMEngine.next_outputs
        if not self.has_unfinished_requests():
            self.wait_for_work(idle_timeout)
            return []
        return self.step()

    def take_observations(self) -> None:
        return None  # the metrics' timings: not scripted here

    def close(self) -> None:
        self.closed = True

    def step(self) -> list[RequestOutput]:
        time.sleep(STEP_SECONDS)
        if self.fail.is_set():
            self.is_dead = True
            raise RuntimeError("device lost")
        outputs = self._drain()
        for request_id in list(self.running):
            self.running[request_id] += 1
            done = self.running[request_id] >= self.length
            outputs.append(_output(request_id, self.running[request_id], FinishReason.LENGTH if done else None))
            if done:
                del self.running[request_id]
        self.num_steps_with_outputs += bool(outputs)
        return outputs

    def _drain(self) -> list[RequestOutput]:
        outputs = []
        self.has_work.clear()
        while not self.inbox.empty():
            kind, request_id = self.inbox.get()
            if kind == "add" and request_id in self.error_ids:
                outputs.append(_output(request_id, 0, FinishReason.ERROR))
            elif kind == "add":
                self.running[request_id] = 0
            elif self.running.pop(request_id, None) is not None:
                self.aborted.append(request_id)
                outputs.append(_output(request_id, 0, FinishReason.ABORT))
        return outputs


def _output(request_id: str, num_output: int, finish: FinishReason | None) -> RequestOutput:
    ids = [num_output] if finish not in (FinishReason.ABORT, FinishReason.ERROR) else []
    return RequestOutput(request_id, ids, [None] * len(ids), finish, 1, num_output)


def run(scenario: Callable[[EngineBridge], Awaitable[T]], engine: ScriptedEngine, max_pending: int = 16,
        max_restarts: int = 0, max_unread_steps: int = 512) -> T:
    async def main() -> T:
        bridge = EngineBridge(engine, max_pending, RestartPolicy(max_restarts), max_unread_steps)  # type: ignore[arg-type]
        bridge.start()
        try:
            return await asyncio.wait_for(scenario(bridge), timeout=10)
        finally:
            await bridge.stop()
            assert bridge.engine.closed, "stopping the bridge closes the engine (an engine process is stopped)"

    return asyncio.run(main())


PARAMS = SamplingParams()


def test_outputs_of_one_step_arrive_together_in_order() -> None:
    async def scenario(bridge: EngineBridge) -> list[list[int]]:
        handles = [bridge.submit([(f"r{i}", [1], PARAMS)]) for i in range(3)]
        tokens: list[list[int]] = [[] for _ in handles]
        for _ in range(3):
            first = await handles[0].next_output()
            # One dispatch per step fills every queue in the same callback: sizes never drift apart.
            assert all(h.queue.qsize() == handles[0].queue.qsize() + 1 for h in handles[1:])
            tokens[0] += first.new_token_ids
            for i, h in enumerate(handles[1:], start=1):
                tokens[i] += (await h.next_output()).new_token_ids
        assert bridge.num_pending_requests == 0
        return tokens

    assert run(scenario, ScriptedEngine()) == [[1, 2, 3]] * 3


def test_rejection_aborts_the_siblings_already_added() -> None:
    engine = ScriptedEngine(length=ENDLESS)

    async def scenario(bridge: EngineBridge) -> None:
        with pytest.raises(APIError) as err:
            bridge.submit([("a-0", [1], PARAMS), ("a-1", [], PARAMS)])
        assert err.value.status_code == 400 and err.value.param == "prompt"
        assert bridge.num_pending_requests == 0
        while "a-0" not in engine.aborted:
            await asyncio.sleep(0.01)

    run(scenario, engine)


def test_a_live_request_id_is_refused_until_its_request_finished() -> None:
    engine = ScriptedEngine(length=2)

    async def scenario(bridge: EngineBridge) -> None:
        first = bridge.submit([("a", [1], PARAMS)])
        with pytest.raises(APIError) as err:
            bridge.submit([("b", [1], PARAMS), ("a", [1], PARAMS)])
        assert err.value.status_code == 400 and err.value.param == "request_id"
        assert bridge.num_pending_requests == 1  # its sibling never reached the engine
        with pytest.raises(APIError, match="'c' is already in use"):
            bridge.submit([("c", [1], PARAMS), ("c", [1], PARAMS)])
        assert bridge.num_pending_requests == 1
        while not (await first.next_output()).is_finished:
            pass
        assert "b" not in engine.running and "b" not in engine.aborted
        bridge.submit([("a", [1], PARAMS)])  # free again once finished

    run(scenario, engine)


def test_overload_is_503() -> None:
    async def scenario(bridge: EngineBridge) -> None:
        bridge.submit([("a", [1], PARAMS), ("b", [1], PARAMS)])
        with pytest.raises(APIError) as err:
            bridge.submit([("c", [1], PARAMS)])
        assert err.value.status_code == 503 and err.value.code == "overloaded"

    run(scenario, ScriptedEngine(length=ENDLESS), max_pending=2)


def test_shutdown_gives_running_requests_a_terminal_event_and_aborts_them() -> None:
    engine = ScriptedEngine(length=ENDLESS)

    async def scenario(bridge: EngineBridge) -> None:
        handle = bridge.submit([("a", [1], PARAMS)])
        await handle.next_output()
        bridge.begin_shutdown()
        with pytest.raises(APIError) as err:
            while True:
                await handle.next_output()
        assert err.value.status_code == 503 and err.value.code == "shutting_down"
        with pytest.raises(APIError):
            bridge.submit([("b", [1], PARAMS)])
        assert bridge.refusal().code == "shutting_down"
        while "a" not in engine.aborted:
            await asyncio.sleep(0.01)

    run(scenario, engine)


def test_engine_failure_ends_every_request_and_health() -> None:
    engine = ScriptedEngine(length=ENDLESS)

    async def scenario(bridge: EngineBridge) -> None:
        handles = [bridge.submit([(f"r{i}", [1], PARAMS)]) for i in range(2)]
        await handles[0].next_output()
        engine.fail.set()
        for handle in handles:
            with pytest.raises(APIError) as err:
                while True:
                    await handle.next_output()
            assert err.value.code == "engine_failed" and "device lost" in err.value.message
        assert bridge.refusal().code == "engine_failed"
        with pytest.raises(APIError) as err:
            bridge.submit([("late", [1], PARAMS)])
        assert err.value.status_code == 503

    run(scenario, engine)


def test_late_outputs_of_an_aborted_request_are_dropped() -> None:
    async def scenario(bridge: EngineBridge) -> None:
        handle = bridge.submit([("a", [1], PARAMS), ("b", [1], PARAMS)])
        await handle.next_output()
        handle.abort("a")
        seen = []
        while len(seen) < 3 or seen[-1].request_id != "b" or not seen[-1].is_finished:
            seen.append(await handle.next_output())
            if seen[-1].request_id == "b" and seen[-1].is_finished:
                break
        assert all(o.finish_reason is not FinishReason.ABORT for o in seen)

    run(scenario, ScriptedEngine(length=5))


@pytest.mark.alone  # it times the ending
def test_engine_failure_ends_every_request_at_once_although_nothing_can_be_sent_to_it() -> None:
    """The dead engine's abort raises (a closed pipe): every handle still gets its terminal event."""
    engine = ScriptedEngine(length=ENDLESS)

    async def scenario(bridge: EngineBridge) -> None:
        handles = [bridge.submit([(f"r{i}-0", [1], PARAMS), (f"r{i}-1", [1], PARAMS)]) for i in range(20)]
        await handles[0].next_output()
        engine.fail.set()
        started = time.monotonic()
        for handle in handles:
            with pytest.raises(APIError) as err:
                while True:
                    await handle.next_output()
            assert err.value.status_code == 503 and err.value.code == "engine_failed"
            handle.close()  # what a route does on its way out: nothing to send, nothing raised
        assert time.monotonic() - started < 1.0 and bridge.num_pending_requests == 0

    run(scenario, engine, max_pending=64)


def test_a_failed_engine_is_replaced_and_the_server_serves_again() -> None:
    engine = ScriptedEngine(length=ENDLESS)

    async def scenario(bridge: EngineBridge) -> None:
        handle = bridge.submit([("a", [1], PARAMS)])
        await handle.next_output()
        engine.fail.set()
        with pytest.raises(APIError):
            while True:
                await handle.next_output()
        while bridge.state is not EngineState.SERVING:
            assert bridge.state is EngineState.RESTARTING
            with pytest.raises(APIError) as err:
                bridge.submit([("b", [1], PARAMS)])
            assert err.value.code == "engine_restarting"
            await asyncio.sleep(0.001)
        assert bridge.engine is not engine and engine.closed and bridge.num_restarts == 1
        bridge.engine.length = 2
        handle = bridge.submit([("a", [1], PARAMS)])
        assert (await handle.next_output()).new_token_ids == [1]
        assert (await handle.next_output()).is_finished

    run(scenario, engine, max_restarts=1)


def test_past_its_restarts_the_server_gives_up_on_the_engine() -> None:
    engine = ScriptedEngine(length=ENDLESS)

    async def scenario(bridge: EngineBridge) -> None:
        for _ in range(2):  # the restart, then a failure of the new engine
            while bridge.state is not EngineState.SERVING:
                await asyncio.sleep(0.001)
            handle = bridge.submit([("a", [1], PARAMS)])
            await handle.next_output()
            bridge.engine.fail.set()
            with pytest.raises(APIError):
                while True:
                    await handle.next_output()
        while bridge.state is EngineState.RESTARTING:
            await asyncio.sleep(0.001)
        assert bridge.state is EngineState.FAILED and bridge.refusal().code == "engine_failed"

    run(scenario, engine, max_restarts=1)


def test_more_generations_than_can_ever_run_at_once_is_400_not_503() -> None:
    async def scenario(bridge: EngineBridge) -> None:
        with pytest.raises(APIError) as err:
            bridge.submit([(f"c{i}", [1], PARAMS) for i in range(3)])
        assert err.value.status_code == 400 and err.value.param == "n"

    run(scenario, ScriptedEngine(), max_pending=2)


def test_a_request_the_engine_cannot_run_ends_with_500_and_its_siblings_are_aborted() -> None:
    engine = ScriptedEngine(length=ENDLESS)
    engine.error_ids.add("x-1")

    async def scenario(bridge: EngineBridge) -> None:
        handle = bridge.submit([("x-0", [1], PARAMS), ("x-1", [1], PARAMS)])
        other = bridge.submit([("y", [1], PARAMS)])
        with pytest.raises(APIError) as err:
            while True:
                await handle.next_output()
        assert err.value.status_code == 500 and err.value.code == "request_failed"
        while "x-0" not in engine.aborted:
            await asyncio.sleep(0.01)
        assert (await other.next_output()).request_id == "y"  # the others go on
        assert bridge.refusal() is None

    run(scenario, engine)


def test_a_consumer_that_stops_reading_has_its_requests_stopped() -> None:
    engine = ScriptedEngine(length=ENDLESS)

    async def scenario(bridge: EngineBridge) -> None:
        handle = bridge.submit([("s-0", [1], PARAMS), ("s-1", [1], PARAMS)])
        reading = bridge.submit([("r", [1], PARAMS)])
        seen = 0
        while "s-0" not in engine.aborted or "s-1" not in engine.aborted:
            seen += len(await reading.next_outputs())  # this one reads on
        assert seen > 8 and bridge.num_pending_requests == 1
        outputs = []
        with pytest.raises(APIError) as err:
            while True:
                outputs.append(await handle.next_output())
        assert err.value.status_code == 408 and err.value.code == "response_not_read"
        assert 2 * 8 <= len(outputs) <= 2 * 8 + 2  # what it was owed, up to the limit, then the error

    run(scenario, engine, max_unread_steps=8)
