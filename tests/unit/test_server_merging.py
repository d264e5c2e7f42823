"""Delta merging on the streaming path: a consumer that falls behind the engine gets everything that
arrived in one batch, merged per choice, and what a client reads must not change: per choice the
same text, the same logprobs in the same order, the finish_reason last, the same usage."""

import asyncio
import random
from pathlib import Path

import pytest

from core import FinishReason, RequestOutput, SamplingParams, TokenLogprobs
from core.tokenizer import load_tokenizer
from openai_serve.choice import ChoiceDelta, ChoiceSpec, merge_deltas
from openai_serve.engine_bridge import RequestHandle
from openai_serve.errors import APIError, service_unavailable
from openai_serve.generation import Generation
from openai_serve.logprobs import TokenLogprob
from openai_serve.token_decoder import token_decoder

PROMPT = [5, 6, 7, 8]


class FakeBridge:
    """What Generation needs of the bridge: a handle whose queue the test fills, and aborts recorded."""

    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.handle: RequestHandle | None = None

    def submit(self, requests: list[tuple[str, list[int], SamplingParams]]) -> RequestHandle:
        self.handle = RequestHandle(self, [request_id for request_id, _, _ in requests])  # type: ignore[arg-type]
        return self.handle

    def abort(self, handle: RequestHandle, request_id: str) -> None:
        self.aborted.append(request_id)


def lp(token_id: int) -> TokenLogprobs:
    return TokenLogprobs(logprob=-0.5 - token_id / 1000, rank=1, top_token_ids=(token_id,), top_logprobs=(-0.5,))


def outputs_for(request_id: str, token_ids: list[int], finish: FinishReason, logprobs: bool) -> list[RequestOutput]:
    """One output per token, as the engine publishes a decode step; the last one finishes."""
    return [
        RequestOutput(request_id, [t], [lp(t) if logprobs else None], finish if i == len(token_ids) - 1 else None,
                      len(PROMPT), i + 1, num_cached_prompt_tokens=2)
        for i, t in enumerate(token_ids)
    ]


def make_generation(tokenizer: object, n: int, stop: tuple[str, ...] = (), logprobs: int | None = None) -> Generation:
    params = SamplingParams(max_tokens=64, stop=stop, logprobs=logprobs)
    specs = [ChoiceSpec(i, 0, f"r-{i}", PROMPT, params) for i in range(n)]
    return Generation(specs, tokenizer)  # type: ignore[arg-type]


async def run_stream(generation: Generation, steps: list[list[RequestOutput]], lag: int) -> list[list[ChoiceDelta]]:
    """Feeds the engine's steps `lag` at a time before the consumer may run (lag 1: it keeps up)."""
    bridge = FakeBridge()
    generation.start(bridge)  # type: ignore[arg-type]
    assert bridge.handle is not None
    batches: list[list[ChoiceDelta]] = []
    consumer = asyncio.ensure_future(_consume(generation, batches))
    for i, step in enumerate(steps):
        for output in step:
            bridge.handle.queue.put_nowait(output)
        if (i + 1) % lag == 0:
            for _ in range(5):  # let the consumer drain what is queued
                await asyncio.sleep(0)
    await asyncio.wait_for(consumer, 5)
    return batches


async def _consume(generation: Generation, batches: list[list[ChoiceDelta]]) -> None:
    async for batch in generation.batches():
        batches.append(batch)


def per_choice(batches: list[list[ChoiceDelta]]) -> dict[int, tuple[str, list[TokenLogprob], list[str | None]]]:
    out: dict[int, tuple[str, list[TokenLogprob], list[str | None]]] = {}
    for batch in batches:
        for delta in batch:
            text, logprobs, reasons = out.get(delta.index, ("", [], []))
            out[delta.index] = (text + delta.text, logprobs + delta.logprobs, reasons + [delta.finish_reason])
    return out


def interleaved_steps(token_lists: list[list[int]], logprobs: bool) -> list[list[RequestOutput]]:
    """Step k holds token k of every choice still running, as the engine's batch does."""
    per_request = [outputs_for(f"r-{i}", ids, FinishReason.LENGTH, logprobs) for i, ids in enumerate(token_lists)]
    return [[outs[k] for outs in per_request if k < len(outs)] for k in range(max(map(len, per_request)))]


@pytest.fixture(scope="module")
def decoder(tiny_qwen3_dir: Path) -> object:
    return token_decoder(load_tokenizer(str(tiny_qwen3_dir)))


@pytest.mark.parametrize("lag", [2, 3, 7, 1000])
@pytest.mark.parametrize("n", [1, 3])
def test_a_lagging_consumer_reads_the_same_choices_as_one_that_keeps_up(decoder: object, lag: int, n: int) -> None:
    rng = random.Random(lag * 10 + n)
    # Random ids of a byte-level BPE: many split UTF-8 characters, so text is held back and released.
    token_lists = [[rng.randrange(3, 512) for _ in range(rng.randint(5, 40))] for _ in range(n)]
    steps = interleaved_steps(token_lists, logprobs=True)

    unmerged = asyncio.run(run_stream(make_generation(decoder, n, logprobs=1), steps, lag=1))
    merged_generation = make_generation(decoder, n, logprobs=1)
    merged = asyncio.run(run_stream(merged_generation, steps, lag=lag))

    read, expected = per_choice(merged), per_choice(unmerged)
    assert {i: (text, logprobs) for i, (text, logprobs, _) in read.items()} == \
        {i: (text, logprobs) for i, (text, logprobs, _) in expected.items()}
    assert len(merged) < len(unmerged)  # the lagging consumer did merge
    for index, (_, logprobs, reasons) in read.items():
        assert [e.token_id for e in logprobs] == token_lists[index]  # every token's logprob, in order
        assert reasons[-1] == "length" and set(reasons[:-1]) <= {None}  # finish_reason only last
    for batch in merged:
        assert len({d.index for d in batch}) == len(batch)  # one delta per choice per batch
    usage = merged_generation.usage()
    assert usage.completion_tokens == sum(map(len, token_lists)) and usage.prompt_tokens == len(PROMPT)


def test_a_stop_string_in_a_merged_batch_ends_the_choice_there_and_aborts_it(decoder: object) -> None:
    token_ids = list(range(40, 80))
    full = per_choice(asyncio.run(run_stream(make_generation(decoder, 1), [[o] for o in outputs_for(
        "r-0", token_ids, FinishReason.LENGTH, logprobs=False)], lag=1)))[0][0]
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip() and "\ufffd" not in stop

    generation = make_generation(decoder, 1, stop=(stop,))
    bridge = FakeBridge()
    generation.start(bridge)  # type: ignore[arg-type]
    assert bridge.handle is not None
    for output in outputs_for("r-0", token_ids, FinishReason.LENGTH, logprobs=False):
        bridge.handle.queue.put_nowait(output)  # all queued before the consumer runs: one batch
    batches: list[list[ChoiceDelta]] = []
    asyncio.run(asyncio.wait_for(_consume(generation, batches), 5))

    assert batches == [[ChoiceDelta(0, full[: full.index(stop)], [], "stop")]]
    assert bridge.aborted[0] == "r-0"  # its blocks are freed in the engine's next step
    assert generation.usage().completion_tokens < len(token_ids)  # counted up to the stop


def test_merge_deltas_concatenates_per_choice_in_order() -> None:
    e = [TokenLogprob(i, lp(i), i) for i in range(4)]
    deltas = [ChoiceDelta(1, "a", [e[0]]), ChoiceDelta(0, "x", []), ChoiceDelta(1, "b", [e[1], e[2]]),
              ChoiceDelta(0, "", [], "stop"), ChoiceDelta(1, "c", [e[3]], "length")]
    assert merge_deltas(deltas) == [ChoiceDelta(1, "abc", e, "length"), ChoiceDelta(0, "x", [], "stop")]
    assert merge_deltas(deltas[:1]) == deltas[:1]


def test_next_outputs_drains_in_order_and_delivers_what_came_before_a_shutdown() -> None:
    async def scenario() -> None:
        handle = RequestHandle(FakeBridge(), ["a", "b"])  # type: ignore[arg-type]
        first = outputs_for("a", [1, 2], FinishReason.LENGTH, logprobs=False)
        second = outputs_for("b", [3], FinishReason.LENGTH, logprobs=False)
        for output in (first[0], second[0], first[1]):
            handle.queue.put_nowait(output)
        handle.queue.put_nowait(service_unavailable("The server is shutting down.", "shutting_down"))
        handle.queue.put_nowait(first[1])  # nothing after the terminal event is delivered
        assert await handle.next_outputs() == [first[0], second[0], first[1]]
        with pytest.raises(APIError) as err:
            await handle.next_outputs()
        assert err.value.status_code == 503 and err.value.code == "shutting_down"

    asyncio.run(scenario())
