"""Verifying steps laid out on the device (core/device_verification.py, gpu/device_verification.py) on the tiny model:
greedy output equals the output without speculation (stops, max_tokens and the context's end inside an accepted run,
aborts while such a step is in flight, a request arriving mid-run, logprobs), every block is free at the end, and the
steps really ran so and overlapped: each launched while the step before it was still in flight.
"""

import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from core.block_manager import BlockManager
from core.device_verification import DeviceVerification
from core.engine import LLMEngine, _DeviceStep, _LaunchedStep
from core.outputs import FinishReason, RequestOutput
from core.sequence import Sequence
from core.speculative_config import SpeculativeConfig
from core.tiny_model import build_tiny_model
from gpu.batch import Batch
from gpu.device_verification import (
    DeviceVerifiedStep,
    DeviceVerifyBatch,
    device_inputs,
    lay_out,
    num_accepted,
    step_shape,
    warm_up,
)
from gpu.kv_cache_groups import KVCacheGroup
from gpu.mixed_graphs import MixedGraphs
from gpu.token_history import HistoryFill, TokenHistory
from tests.tiny_specs import TINY_SPECS

COMMON = dict(max_model_len=256, block_size=8, max_num_seqs=8, max_num_batched_tokens=64, dtype="float32",
              device="cpu", kv_cache_blocks=160)
REPEATING = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [40, 41, 42, 40, 41, 42, 40, 41], [70, 71, 72, 73] * 6]
# Like a code edit: a block of text, then the same block again with a few tokens changed, cut partway.
_BLOCK = [200 + (i * 7) % 53 for i in range(48)]
CODE_EDIT = [_BLOCK + [9, 9] + _BLOCK[:20] + [11] + _BLOCK[21:30]]
PLAIN = [list(range(100, 137))]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("devverify") / "qwen3", TINY_SPECS["qwen3"])


@pytest.fixture(scope="module")
def plain_engine(model_dir: Path) -> LLMEngine:
    return LLM(str(model_dir), **COMMON).engine  # type: ignore[arg-type]


def speculating_engine(model_dir: Path, on_device: bool = True, **settings: object) -> LLMEngine:
    config = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False, "prompt_lookup_max": 3,
              "verify_on_device": on_device}
    return LLM(str(model_dir), speculative_config=config, **{**COMMON, **settings}).engine  # type: ignore[arg-type]


@dataclass
class DeviceSteps:
    """Counts the device-laid steps an engine launches, those launched with one in flight, those launched with a
    plain step (or a prompt's) in flight, and the plain ones (no drafts)."""

    engine: LLMEngine
    num_launched: int = 0
    num_overlapped: int = 0
    num_entered: int = 0
    num_plain: int = 0
    num_rows: int = 0

    def __post_init__(self) -> None:
        launch = self.engine.runner.launch_verification_on_device  # type: ignore[attr-defined]

        def record(batch: DeviceVerifyBatch) -> DeviceVerifiedStep:
            self.num_launched += 1
            self.num_rows += batch.num_rows
            self.num_overlapped += isinstance(self.engine._in_flight, _DeviceStep)
            self.num_entered += isinstance(self.engine._in_flight, _LaunchedStep)
            self.num_plain += batch.num_drafts == 0
            return launch(batch)

        self.engine.runner.launch_verification_on_device = record  # type: ignore[attr-defined]


Request = tuple[list[int], SamplingParams]


def run(engine: LLMEngine, requests: dict[str, Request], later: dict[int, dict[str, Request]] | None = None,
        aborts: dict[int, str] | None = None) -> dict[str, tuple[list[int], FinishReason | None]]:
    """Runs the requests (`later`: added after that many steps; `aborts`: aborted after that many) to the end."""
    outputs: dict[str, list[RequestOutput]] = {}
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    num_steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        num_steps += 1
        for request_id, (prompt, params) in (later or {}).get(num_steps, {}).items():
            engine.add_request(request_id, prompt, params)
        if aborts and num_steps in aborts:
            engine.abort_request(aborts[num_steps])
    stats = engine.stats()
    assert stats.num_used_blocks == 0
    assert stats.num_free_blocks + stats.num_evictable_blocks == stats.num_total_blocks
    if engine.device_verification is not None:
        assert engine.device_verification.slots.num_free == engine.config.scheduler.max_num_seqs
    return {rid: ([t for o in outs for t in o.new_token_ids], outs[-1].finish_reason) for rid, outs in outputs.items()}


def greedy(max_tokens: int | None = 40, **settings: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **{"ignore_eos": True, **settings})


def named(prompts: list[list[int]], params: SamplingParams) -> dict[str, Request]:
    return {f"r{i}": (prompt, params) for i, prompt in enumerate(prompts)}


def test_greedy_output_is_the_same_and_steps_overlap(plain_engine: LLMEngine, model_dir: Path) -> None:
    requests = named(REPEATING + CODE_EDIT + PLAIN, greedy(60))
    engine = speculating_engine(model_dir)
    steps = DeviceSteps(engine)
    assert run(engine, requests) == run(plain_engine, requests)
    counts = engine.speculation.counts  # type: ignore[union-attr]
    assert counts.num_accepted_tokens > 30 and counts.num_draft_tokens > counts.num_accepted_tokens
    assert steps.num_launched > 10 and steps.num_overlapped >= steps.num_launched - 2


def test_one_sequence_of_code_edit_text(plain_engine: LLMEngine, model_dir: Path) -> None:
    requests = named(CODE_EDIT, greedy(80))
    engine = speculating_engine(model_dir)
    steps = DeviceSteps(engine)
    assert run(engine, requests) == run(plain_engine, requests)
    assert engine.speculation.counts.num_accepted_tokens > 20  # type: ignore[union-attr]
    # Every step verifies on the device with the step before it in flight: the first, the prompt step's (its first
    # token copied to the history on the device), the others the verifying step before.
    assert steps.num_entered == 1 and steps.num_overlapped == steps.num_launched - 1 and steps.num_launched > 10


def test_entering_from_a_plain_step_lays_the_step_out_on_the_device(plain_engine: LLMEngine, model_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller that alternates runs of plain steps and verifying ones (an adaptive one's choices): each entry
    verifies on the device with the plain step still in flight (its tokens copied to the history there), none on
    the host; the output is the same."""
    requests = named(CODE_EDIT + REPEATING[:1], greedy(60))
    engine = speculating_engine(model_dir)
    choices = itertools.cycle([0, 0, 4, 4, 4])
    monkeypatch.setattr(engine.speculation.controller, "choose", lambda *args: next(choices))  # type: ignore[union-attr]
    host_laid = []
    propose = engine._propose_drafts
    monkeypatch.setattr(engine, "_propose_drafts", lambda k: host_laid.append(k) or propose(k))
    steps = DeviceSteps(engine)
    assert run(engine, requests) == run(plain_engine, requests)
    assert host_laid == [] and steps.num_launched > 10
    assert steps.num_entered > 3 and steps.num_entered + steps.num_overlapped == steps.num_launched


def test_leaving_for_plain_decoding_lays_a_plain_step_out_on_the_device(plain_engine: LLMEngine, model_dir: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller that leaves verifying runs for plain decoding: the first plain step after a verifying one is laid
    out on the device with that step still in flight (its token a row then pending, fed to the plain steps after it
    from the device), and entering again copies those; the output is the same, logprobs included."""
    requests = named(CODE_EDIT + REPEATING[:2], greedy(60, logprobs=2))
    engine = speculating_engine(model_dir)
    choices = itertools.cycle([4, 4, 4, 0, 0])
    monkeypatch.setattr(engine.speculation.controller, "choose", lambda *args: next(choices))  # type: ignore[union-attr]
    steps = DeviceSteps(engine)
    got_outputs = outputs_of(engine, requests)
    want_outputs = outputs_of(plain_engine, requests)
    assert got_outputs.keys() == want_outputs.keys()
    for request_id, got in got_outputs.items():
        want = want_outputs[request_id]
        assert [t for o in got for t in o.new_token_ids] == [t for o in want for t in o.new_token_ids]
        got_logprobs = [lp for o in got for lp in o.new_logprobs]
        want_logprobs = [lp for o in want for lp in o.new_logprobs]
        assert [lp.top_token_ids for lp in got_logprobs] == [lp.top_token_ids for lp in want_logprobs]
        assert [lp.logprob for lp in got_logprobs] == pytest.approx([lp.logprob for lp in want_logprobs], abs=1e-4)
    assert steps.num_plain > 5 and steps.num_plain <= steps.num_overlapped


def test_a_prompt_due_leaves_verification_through_a_plain_step_on_the_device(
        plain_engine: LLMEngine, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An adaptive controller's rule (no drafts while a prompt is due): a request arriving mid-run is taken after a
    plain step laid out on the device, the verifying step in flight booked meanwhile; the output is the same."""
    first, second = named(CODE_EDIT + REPEATING[:1], greedy(60)), {"late": (REPEATING[2], greedy(40))}
    engine = speculating_engine(model_dir)
    monkeypatch.setattr(engine.speculation.controller, "choose",  # type: ignore[union-attr]
                        lambda batch_size, has_prompt_work: 0 if has_prompt_work() else 4)
    steps = DeviceSteps(engine)
    got = run(engine, first, later={8: second, 20: {"later": (PLAIN[0], greedy(30))}})
    want = run(plain_engine, {**first, **second, "later": (PLAIN[0], greedy(30))})
    assert got == want
    assert steps.num_plain >= 2


def outputs_of(engine: LLMEngine, requests: dict[str, Request]) -> dict[str, list[RequestOutput]]:
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    outputs: dict[str, list[RequestOutput]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def test_stops_inside_an_accepted_run(plain_engine: LLMEngine, model_dir: Path) -> None:
    """A stop token (EOS's path: _is_stop_token), max_tokens and the end of the context met among the tokens a
    step accepts end the output there; the tokens after it, and the next step's in flight, are dropped."""
    free = run(plain_engine, named(REPEATING, greedy(40)))
    stop_id = free["r0"][0][12]
    cases = [dict(params=greedy(40, stop_token_ids=(stop_id,))), dict(params=greedy(13)),
             dict(params=greedy(17, min_tokens=5)), dict(params=greedy(None), max_model_len=48)]
    for case in cases:
        settings = {k: v for k, v in case.items() if k != "params"}
        requests = named(REPEATING, case["params"])  # type: ignore[arg-type]
        plain = plain_engine if not settings else LLM(str(model_dir), **{**COMMON, **settings}).engine
        engine = speculating_engine(model_dir, **settings)
        steps = DeviceSteps(engine)
        got, want = run(engine, requests), run(plain, requests)
        assert got == want, case
        assert steps.num_launched > 2, case
    assert want["r0"][1] is FinishReason.LENGTH and len(want["r0"][0]) == 48 - len(REPEATING[0])


def _device_booked_chunks(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> list[tuple[list[int], bool]]:
    """One request's output, chunk by chunk in order, each with whether a step laid out on the device booked it."""
    device_booked: list[RequestOutput] = []
    book = engine._book_device_step

    def record(step: _DeviceStep, next_num_drafts: int | None) -> list[RequestOutput]:
        outputs = book(step, next_num_drafts)
        device_booked.extend(outputs)
        return outputs

    engine._book_device_step = record  # type: ignore[method-assign]
    engine.add_request("r0", prompt, params)
    chunks = []
    while engine.has_unfinished_requests():
        chunks += [(o.new_token_ids, any(o is b for b in device_booked)) for o in engine.step()]
    return chunks


def test_stop_token_in_the_middle_of_an_accepted_run_is_hit(plain_engine: LLMEngine, model_dir: Path) -> None:
    """The stop lands strictly inside what a step accepted (else the test above could pass by luck), on a token the
    reply has not made before. The tiny model's replies repeat themselves, so a run accepted later copies tokens
    the reply made earlier; the prompt ends with some of the reply's opening instead, so that a run copies them from
    the prompt: the first opening length (of a few tried) that gives a run with a token new to the output inside."""
    opening = run(plain_engine, named(CODE_EDIT, greedy(40)))["r0"][0]
    for length in range(0, 41, 5):
        prompt = CODE_EDIT[0] + opening[:length]
        chunks = _device_booked_chunks(speculating_engine(model_dir), prompt, greedy(40))
        tokens, inside, start = [t for ids, _ in chunks for t in ids], [], 0
        for ids, on_device in chunks:
            if on_device:  # positions with a token of the same step on either side
                inside += [start + i for i in range(1, len(ids) - 1) if tokens[start + i] not in tokens[: start + i]]
            start += len(ids)
        if inside:
            break
    assert inside, "no opening length gave a run with a new token inside"
    position = inside[0]
    params = greedy(40, stop_token_ids=(tokens[position],))
    want = run(plain_engine, {"r0": (prompt, params)})
    assert run(speculating_engine(model_dir), {"r0": (prompt, params)}) == want
    assert want["r0"] == (tokens[: position + 1], FinishReason.STOP)


def test_aborts_while_a_step_is_in_flight(plain_engine: LLMEngine, model_dir: Path) -> None:
    requests = named(REPEATING + CODE_EDIT, greedy(60))
    engine = speculating_engine(model_dir)
    steps = DeviceSteps(engine)
    got = run(engine, requests, aborts={6: "r1", 9: "r3"})
    want = run(plain_engine, requests)
    for rid in ("r0", "r2"):
        assert got[rid] == want[rid]
    for rid in ("r1", "r3"):
        assert got[rid][1] is FinishReason.ABORT and got[rid][0] == want[rid][0][: len(got[rid][0])]
    assert steps.num_overlapped > 5


def test_a_request_arriving_mid_run(plain_engine: LLMEngine, model_dir: Path) -> None:
    """The new prompt's step is laid out on the host (the step in flight booked first); then both rows verify on
    the device together."""
    first, second = named(CODE_EDIT, greedy(60)), {"late": (REPEATING[2], greedy(40))}
    engine = speculating_engine(model_dir)
    steps = DeviceSteps(engine)
    got = run(engine, first, later={8: second})
    want = run(plain_engine, {**first, **second})
    assert got == want
    assert steps.num_rows > steps.num_launched  # some steps verified both rows


def test_logprobs_and_random_rows(plain_engine: LLMEngine, model_dir: Path) -> None:
    """Logprobs are those of each kept position; seeded rows keep the host's verifying steps (their noise needs the
    output index) and draw what they draw without drafts; unseeded random rows verify on the device."""
    engine = speculating_engine(model_dir)
    steps = DeviceSteps(engine)
    params = greedy(30, logprobs=2)
    got_outputs: dict[str, list[RequestOutput]] = {}
    for request_id, (prompt, p) in named(REPEATING, params).items():
        engine.add_request(request_id, prompt, p)
    while engine.has_unfinished_requests():
        for out in engine.step():
            got_outputs.setdefault(out.request_id, []).append(out)
    assert steps.num_launched > 3
    plain_outputs = LLM(str(model_dir), **COMMON).generate(REPEATING, params)
    for request_id, want in zip(("r0", "r1", "r2"), plain_outputs, strict=True):
        logprobs = [lp for o in got_outputs[request_id] for lp in o.new_logprobs]
        assert [t for o in got_outputs[request_id] for t in o.new_token_ids] == want.token_ids
        for x, y in zip(logprobs, want.logprobs, strict=True):
            assert x is not None and y is not None and x.top_token_ids == y.top_token_ids
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
    seeded = {f"s{i}": (prompt, SamplingParams(temperature=0.7, seed=i, max_tokens=30))
              for i, prompt in enumerate(REPEATING)}
    engine = speculating_engine(model_dir)
    steps = DeviceSteps(engine)
    assert run(engine, seeded) == run(plain_engine, seeded) and steps.num_launched == 0
    unseeded = named(REPEATING, SamplingParams(temperature=0.7, max_tokens=30, ignore_eos=True))
    engine = speculating_engine(model_dir)
    steps = DeviceSteps(engine)
    assert all(len(tokens) == 30 for tokens, _ in run(engine, unseeded).values()) and steps.num_launched > 3


def test_off_switch_and_a_short_block_pool(plain_engine: LLMEngine, model_dir: Path) -> None:
    """verify_on_device false keeps every verifying step on the host; with too few free blocks for the worst case,
    steps fall back to the host's verification (and may preempt) and the output is unchanged."""
    requests = named(REPEATING + CODE_EDIT, greedy(50))
    want = run(plain_engine, requests)
    off = speculating_engine(model_dir, on_device=False)
    assert off.device_verification is None and run(off, requests) == want
    short = speculating_engine(model_dir, kv_cache_blocks=40)
    steps = DeviceSteps(short)
    assert run(short, requests) == want and steps.num_launched > 0


def test_lay_out_reads_the_history_and_block_tables() -> None:
    """Positions follow each slot's length, slots come from the block table, the first token is the history's last;
    a row accepts its leading drafts that equal what was sampled before them."""
    cpu = torch.device("cpu")
    history = TokenHistory(num_slots=4, max_model_len=32, device=cpu)
    history.fill([HistoryFill(3, 0, [1, 2, 3, 1, 2]), HistoryFill(1, 0, [7, 8, 9])])
    batch = DeviceVerifyBatch(slots=[3, 1], block_tables=[[5, 6], [2]], sampling=[], num_drafts=3, min_n=1, max_n=2,
                              max_context_len=8)
    inputs = lay_out(history, device_inputs(batch, cpu), step_shape(batch, block_size=4))
    assert inputs.token_ids.tolist() == [2, 3, 1, 2, 9, 0, 0, 0]  # row 1 finds no match: placeholders
    assert inputs.positions.tolist() == [4, 5, 6, 7, 2, 3, 4, 5]
    assert inputs.meta.slot_mapping.tolist() == [24, 25, 26, 27, 10, 11, -1, -1]  # past its blocks: not written
    assert inputs.meta.context_lens.tolist() == [8, 6] and inputs.meta.query_start_loc.tolist() == [0, 4, 8]
    assert inputs.num_drafts.tolist() == [3, 0]
    sampled = torch.tensor([[3, 1, 5, 6], [0, 0, 0, 0]])
    accepted = num_accepted(sampled, inputs.drafts, inputs.num_drafts)
    assert accepted.tolist() == [2, 0]  # 3 and 1 confirmed, 2 != 5; row 1 had no drafts


def test_in_the_buffers_of_a_mixed_step_graph(plain_engine: LLMEngine, model_dir: Path) -> None:
    """Where a mixed-step graph holds the step (CUDA), its static inputs are filled from the device's layout: run here
    eagerly on those padded buffers, the output is the same."""
    engine = speculating_engine(model_dir)
    runner, c = engine.runner, engine.runner.config  # type: ignore[attr-defined]
    runner.mixed = MixedGraphs(runner.model, c.max_num_batched_tokens, c.max_num_seqs, c.max_model_len, c.block_size,
                               runner.device)
    num_laid_out = 0
    mixed_run = runner.mixed.run

    def record(batch: Batch, last_sampled_ids: torch.Tensor | None, laid_out: tuple | None = None) -> torch.Tensor:
        nonlocal num_laid_out
        num_laid_out += laid_out is not None
        return mixed_run(batch, last_sampled_ids, laid_out)

    runner.mixed.run = record
    requests = named(REPEATING + CODE_EDIT + PLAIN, greedy(60))
    assert run(engine, requests) == run(plain_engine, requests)
    assert num_laid_out > 10


def test_a_launch_that_fails_is_laid_out_on_the_host(plain_engine: LLMEngine, model_dir: Path) -> None:
    """A verifying step laid out on the device that fails to launch (after writing part of the history) runs on the
    host instead; the next such step fills the history anew, and nothing changes in the output."""
    engine = speculating_engine(model_dir)
    runner = engine.runner
    launch = runner.launch_verification_on_device  # type: ignore[attr-defined]
    num_calls = 0
    refilled: list[bool] = []

    def fail_some(batch: DeviceVerifyBatch) -> DeviceVerifiedStep:
        nonlocal num_calls
        num_calls += 1
        if num_calls in (5, 10):  # the launch after a failure: every row's slot filled from its first token
            refilled.append(len(batch.fills) == batch.num_rows and all(f.start == 0 for f in batch.fills))
        if num_calls in (4, 9):
            runner.token_history.fill(batch.fills)  # type: ignore[attr-defined]
            runner.token_history.tokens.fill_(3)  # type: ignore[attr-defined]
            raise RuntimeError("a launch that fails")
        return launch(batch)

    runner.launch_verification_on_device = fail_some  # type: ignore[attr-defined]
    requests = named(REPEATING + CODE_EDIT, greedy(50))
    assert run(engine, requests) == run(plain_engine, requests)
    assert num_calls > 12 and refilled == [True, True]


def decoding_seqs(block_size: int, num_blocks: int, prompts: list[int], **params: object
                  ) -> tuple[BlockManager, list[Sequence]]:
    """Running sequences that have computed their prompts and sampled one token (its K/V still to compute)."""
    manager = BlockManager([KVCacheGroup(None, num_blocks)], block_size, enable_prefix_caching=False)
    seqs = []
    for i, length in enumerate(prompts):
        seq = Sequence(f"s{i}", list(range(1, length + 1)), SamplingParams(max_tokens=50, **params), 50)  # type: ignore
        manager.admit(seq, manager.no_hit())
        manager.allocate(seq, length)
        seq.num_computed_tokens = length
        seq.add_pending_token(0, is_last=False)
        seq.resolve_pending_token(99)
        seqs.append(seq)
    return manager, seqs


def test_blocks_cover_the_worst_case_and_slots_are_filled_once() -> None:
    """A step of k drafts covers known + k tokens, or known + k + k_prev + 1 behind a step in flight; a row's slot
    is filled with the tokens the device lacks, once."""
    manager, seqs = decoding_seqs(4, 20, [5, 9])  # 6 and 10 known tokens, 2 and 3 blocks
    verification = DeviceVerification(SpeculativeConfig(num_speculative_tokens=3), manager, 64, 4, (0,))
    assert verification.can_lay_out(seqs, 3, None)
    batch = verification.reserve(seqs, 3, None)
    assert [len(t) for t in batch.block_tables] == [3, 4]  # 9 and 13 tokens
    assert [(f.slot, f.start, len(f.token_ids)) for f in batch.fills] == [(0, 0, 6), (1, 0, 10)]
    assert batch.max_context_len == 13
    again = verification.reserve(seqs, 2, 3)  # behind the step in flight: 6 + 3 + 1 + 2 = 12 and 16 tokens
    assert [len(t) for t in again.block_tables] == [3, 4] and again.fills == [] and again.max_context_len == 16
    assert manager.num_free_blocks == 20 - 7
    assert verification.can_lay_out(seqs, 3, 16)  # 26 and 30 tokens: 8 blocks more, of 13 free
    assert not verification.can_lay_out(seqs, 3, 40)  # 50 and 54 tokens: 20 blocks more
    verification.release(seqs[0])
    assert seqs[0].history_slot is None and verification.slots.num_free == 3


def test_a_pending_token_is_copied_on_the_device_unless_it_ends_the_sequence() -> None:
    """Behind a plain step in flight a row's last token is pending: its fill names the step's sampled row, and the
    history takes that token from the step's tokens on the device; a pending token that ends its sequence by
    length keeps the step on the host."""
    manager, seqs = decoding_seqs(4, 20, [5, 9])
    for row, seq in enumerate(seqs):
        seq.num_computed_tokens += 1  # a plain step in flight computes the last known token and samples the next
        seq.add_pending_token(row, is_last=False)
    verification = DeviceVerification(SpeculativeConfig(num_speculative_tokens=3), manager, 64, 4, (0,))
    assert verification.can_lay_out(seqs, 3, None)
    batch = verification.reserve(seqs, 3, None)
    assert [(f.slot, f.start, len(f.token_ids), f.pending_row, f.end) for f in batch.fills] == [
        (0, 0, 6, 0, 7), (1, 0, 10, 1, 11)]
    assert [len(t) for t in batch.block_tables] == [3, 4]  # 7 + 3 and 11 + 3 tokens
    history = TokenHistory(4, 64, torch.device("cpu"))
    history.fill(batch.fills, torch.tensor([41, 42]))
    assert history.lengths[:2].tolist() == [7, 11]
    assert history.tokens[0, :7].tolist() == [*range(1, 6), 99, 41]
    assert history.tokens[1, :11].tolist() == [*range(1, 10), 99, 42]
    _, ending = decoding_seqs(4, 20, [5])
    ending[0].num_computed_tokens += 1
    ending[0].add_pending_token(0, is_last=True)
    assert not verification.can_lay_out(ending, 3, None)


@pytest.mark.parametrize("params", [dict(seed=1), dict(presence_penalty=0.5), dict(min_tokens=3)])
def test_rows_that_need_the_host_keep_the_step_on_it(params: dict) -> None:
    _, seqs = decoding_seqs(4, 20, [5, 9])
    _, others = decoding_seqs(4, 20, [5, 9], **params)
    manager = BlockManager([KVCacheGroup(None, 20)], 4)
    verification = DeviceVerification(SpeculativeConfig(num_speculative_tokens=3), manager, 64, 4, (0,))
    assert verification.can_lay_out(seqs, 3, None)
    assert not verification.can_lay_out([seqs[0], others[1]], 3, None)
    short = DeviceVerification(SpeculativeConfig(num_speculative_tokens=3), manager, 12, 4, (0,))
    assert not short.can_lay_out(seqs, 3, None)  # the second row's 13 tokens pass the context


def test_a_stop_string_inside_an_accepted_run(model_dir: Path) -> None:
    """A stop string (found by the front end's text tracker, which aborts the request) met among the tokens a
    step accepted ends the text where the output without speculation ends it."""
    config = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False, "prompt_lookup_max": 3}
    plain, speculating = LLM(str(model_dir), **COMMON), LLM(str(model_dir), speculative_config=config, **COMMON)
    free = plain.generate(REPEATING, greedy(40))
    stop = free[2].text[len(free[2].text) // 2 :][:3]
    params = greedy(40, stop=(stop,))
    steps = DeviceSteps(speculating.engine)
    got, want = speculating.generate(REPEATING, params), plain.generate(REPEATING, params)
    assert [(o.token_ids, o.text, o.finish_reason) for o in got] == \
        [(o.token_ids, o.text, o.finish_reason) for o in want]
    assert want[2].finish_reason is FinishReason.STOP and steps.num_overlapped > 3


def test_the_warm_up_leaves_the_history_as_it_was() -> None:
    history = TokenHistory(3, 64, torch.device("cpu"))
    history.fill([HistoryFill(0, 0, [5, 6, 5, 6, 5]), HistoryFill(2, 0, [1, 2]), HistoryFill(3, 0, [7, 7])])
    tokens, lengths = history.tokens.clone(), history.lengths.clone()
    warm_up(history, 4, 1, 3, 16)
    assert torch.equal(history.tokens[:, :-1], tokens[:, :-1]) and torch.equal(history.lengths, lengths)
