"""The engine does not trust its caller: a request it cannot run ends alone with FinishReason.ERROR,
and the requests beside it go on with the tokens they would have had without it. A fault that is
the engine's own (every row fails) is raised, for its owner to restart it."""

from pathlib import Path

import pytest

from core import FinishReason, SamplingParams
from core.config import engine_config
from core.engine import LLMEngine, runner_config
from gpu.batch import Batch
from gpu.model_runner import ModelRunner
from gpu.pending_step import PendingStep

POISON = 77  # a token id the faulty runner below cannot run
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True)


class FaultyRunner:
    """The real runner, except that a batch holding POISON raises (as a sampler indexing the logits
    with a bad id does), and every batch raises once `is_broken` (as a lost device does)."""

    def __init__(self, runner: ModelRunner) -> None:
        self._runner = runner
        self.is_broken = False
        self.num_failed_launches = 0

    def launch(self, batch: Batch) -> PendingStep:
        if self.is_broken or POISON in batch.token_ids:
            self.num_failed_launches += 1
            raise IndexError(f"index {POISON} is out of bounds")
        return self._runner.launch(batch)

    def __getattr__(self, name: str) -> object:
        return getattr(self._runner, name)


@pytest.fixture(scope="module")
def runner(tiny_qwen3_dir: Path) -> ModelRunner:
    return ModelRunner(runner_config(_config(tiny_qwen3_dir)))


def _config(model_dir: Path):  # noqa: ANN202 - an EngineConfig
    return engine_config(str(model_dir), max_model_len=256, block_size=16, kv_cache_blocks=64, max_num_seqs=8,
                         max_num_batched_tokens=64)


def _engine(model_dir: Path, runner: ModelRunner) -> tuple[LLMEngine, FaultyRunner]:
    faulty = FaultyRunner(runner)
    return LLMEngine(_config(model_dir), runner=faulty), faulty  # type: ignore[arg-type]


def run_all(engine: LLMEngine) -> dict[str, list]:
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def tokens_of(outputs: list) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


GOOD = {"a": ([5, 6, 7, 8], GREEDY), "b": ([9] * 40, SEEDED), "c": ([10, 11], GREEDY)}


def clean_run(model_dir: Path, runner: ModelRunner) -> dict[str, list[int]]:
    engine, _ = _engine(model_dir, runner)
    for request_id, (prompt, params) in GOOD.items():
        engine.add_request(request_id, prompt, params)
    return {rid: tokens_of(outs) for rid, outs in run_all(engine).items()}


@pytest.mark.parametrize(("prompt", "params"), [
    ([5, 6, 100_000], GREEDY),  # a prompt id outside the vocabulary
    ([5, 6], SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=(100_000,))),  # indexes the logits
    ([5, 6], SamplingParams(max_tokens=4, stop_token_ids=(2**64 - 1,))),
    ([5] * 300, GREEDY),  # longer than the context
    ([], GREEDY),
])
def test_a_request_the_front_end_should_have_refused_ends_alone(
    tiny_qwen3_dir: Path, runner: ModelRunner, prompt: list[int], params: SamplingParams
) -> None:
    expected = clean_run(tiny_qwen3_dir, runner)
    engine, faulty = _engine(tiny_qwen3_dir, runner)
    engine.add_request("a", *GOOD["a"])
    engine.add_request("bad", prompt, params)
    engine.add_request("b", *GOOD["b"])
    engine.add_request("c", *GOOD["c"])
    outputs = run_all(engine)
    assert [o.finish_reason for o in outputs.pop("bad")] == [FinishReason.ERROR]
    assert {rid: tokens_of(outs) for rid, outs in outputs.items()} == expected
    assert faulty.num_failed_launches == 0  # refused at the door, before any step
    assert engine.stats().num_used_blocks == 0


def test_a_live_request_id_is_not_taken_twice(tiny_qwen3_dir: Path, runner: ModelRunner) -> None:
    engine, _ = _engine(tiny_qwen3_dir, runner)
    engine.add_request("a", *GOOD["a"])
    engine.step()
    engine.add_request("a", [1, 2, 3], GREEDY)
    outputs = run_all(engine)["a"]
    assert outputs[0].finish_reason is FinishReason.ERROR  # the second one, refused
    assert outputs[-1].finish_reason is FinishReason.LENGTH and len(tokens_of(outputs)) == 12
    assert engine.stats().num_used_blocks == 0


@pytest.mark.parametrize("poison_at", [0, 1, 30])  # in the first prefill chunk, or a later one
def test_a_step_that_raises_fails_only_the_request_whose_rows_raise(
    tiny_qwen3_dir: Path, runner: ModelRunner, poison_at: int
) -> None:
    expected = clean_run(tiny_qwen3_dir, runner)
    engine, faulty = _engine(tiny_qwen3_dir, runner)
    poisoned = [12] * 70
    poisoned[poison_at] = POISON
    engine.add_request("a", *GOOD["a"])
    engine.add_request("b", *GOOD["b"])
    engine.step()  # a and b run; the poisoned one joins a step later, as it would in a server
    engine.add_request("poisoned", poisoned, GREEDY)
    engine.add_request("c", *GOOD["c"])
    outputs = run_all(engine)
    assert [o.finish_reason for o in outputs.pop("poisoned")] == [FinishReason.ERROR]
    assert {rid: tokens_of(outs) for rid, outs in outputs.items()} == expected
    assert faulty.num_failed_launches >= 2  # the step, then its poisoned row alone
    assert engine.stats().num_used_blocks == 0
    engine.add_request("after", *GOOD["a"])  # the engine keeps serving, with the prefix cache intact
    assert tokens_of(run_all(engine)["after"]) == expected["a"]


def test_a_fault_of_every_row_is_the_engines_and_is_raised(tiny_qwen3_dir: Path, runner: ModelRunner) -> None:
    engine, faulty = _engine(tiny_qwen3_dir, runner)
    engine.add_request("a", *GOOD["a"])
    engine.add_request("b", *GOOD["b"])
    engine.step()
    faulty.is_broken = True
    with pytest.raises(RuntimeError, match="engine is broken"):
        run_all(engine)


def test_a_single_row_failing_step_after_step_is_the_engines(tiny_qwen3_dir: Path, runner: ModelRunner) -> None:
    engine, faulty = _engine(tiny_qwen3_dir, runner)
    faulty.is_broken = True
    for i in range(2):  # one request at a time: each could be at fault, so each ends alone
        engine.add_request(f"r{i}", *GOOD["a"])
        assert [o.finish_reason for o in run_all(engine)[f"r{i}"]] == [FinishReason.ERROR]
    engine.add_request("r2", *GOOD["a"])
    with pytest.raises(RuntimeError, match="3 steps in a row failed"):
        run_all(engine)


def test_tiny_temperatures_sample_greedily() -> None:
    assert SamplingParams(temperature=1e-39).temperature == 0.0
    assert SamplingParams(temperature=1e-6).is_greedy
    assert SamplingParams(temperature=1e-4).temperature == 1e-4


def test_a_failed_step_keeps_penalties_and_prompt_logprobs_of_the_requests_beside_it(tiny_qwen3_dir: Path,
                                                                                     runner: ModelRunner) -> None:
    """The failed batch took penalty slots and prompt positions to score for its rows; the rows run alone after
    it fill their slots and score their prompts as if it had never been built."""
    extra = {"pen": ([5, 6, 7, 5, 6], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                                       repetition_penalty=1.8, presence_penalty=1.0)),
             "scored": ([8, 9, 10, 11, 12, 13], SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2))}

    def run(with_poison: bool) -> dict[str, list]:
        engine, _ = _engine(tiny_qwen3_dir, runner)
        for request_id, (prompt, params) in extra.items():
            engine.add_request(request_id, prompt, params)
        if with_poison:
            engine.add_request("poison", [5, POISON], GREEDY)
        return run_all(engine)

    clean, recovered = run(False), run(True)
    assert recovered["poison"][-1].finish_reason is FinishReason.ERROR
    for request_id in extra:
        assert tokens_of(recovered[request_id]) == tokens_of(clean[request_id])
    first = next(o for o in recovered["scored"] if o.prompt_logprobs is not None)
    assert first.prompt_logprobs == next(o for o in clean["scored"] if o.prompt_logprobs is not None).prompt_logprobs
    assert len(first.prompt_logprobs) == 6
