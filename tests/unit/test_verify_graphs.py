"""Verify graphs (gpu/verify_graphs.py) on the CPU, run eagerly on their static buffers (CUDA captures the same
function: tests/gpu/test_verify_graphs_gpu.py): greedy output equals the output without speculation with padded rows,
the padding slot keeps nothing, the runner's rule sends the steps a graph cannot take to the eager path, and both paths
run the one step function, dispatching the same operations outside the model's."""

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from core import SamplingParams
from core.engine import LLMEngine
from gpu import device_verification
from gpu.batch import LogitBias, RowSampling
from gpu.device_verification import DeviceVerifyBatch
from gpu.token_history import HistoryFill
from gpu.verify_graphs import Lookup, VerifyGraphs, max_positions
from tests.unit.test_device_verification import (
    CODE_EDIT,
    PLAIN,
    REPEATING,
    greedy,
    model_dir,  # noqa: F401 - a fixture
    named,
    plain_engine,  # noqa: F401 - a fixture
    run,
    speculating_engine,
)


def with_verify_graphs(engine: LLMEngine) -> VerifyGraphs:
    """The engine's runner given verify graphs (none captured: each step runs eagerly on their buffers), drawing
    greedily (the fused kernel's greedy draw, which the CPU lacks)."""
    runner, c = engine.runner, engine.runner.config  # type: ignore[attr-defined]
    max_drafts, min_n, max_n = c.device_ngram
    positions = max_positions(c.max_num_seqs, max_drafts, c.max_num_batched_tokens)
    logits = torch.empty(positions, runner.vocab_size, dtype=runner.dtype)

    def logits_into(hidden: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(runner.model.compute_logits(hidden))

    def draw(logits: torch.Tensor, keys: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1)

    runner.verify = VerifyGraphs(runner.token_history, runner.model, logits_into, logits, draw,
                                 Lookup(max_drafts, min_n, max_n), c.max_num_seqs, c.max_model_len, c.block_size)
    return runner.verify


def counting(graphs: VerifyGraphs) -> list[int]:
    """The rows of each step the graphs run, recorded."""
    rows: list[int] = []
    graphs_run = graphs.run

    def record(batch: DeviceVerifyBatch, draw: object) -> device_verification.VerifiedOutputs:
        rows.append(batch.num_rows)
        return graphs_run(batch, draw)  # type: ignore[arg-type]

    graphs.run = record  # type: ignore[method-assign]
    return rows


def test_greedy_output_with_padded_rows(plain_engine: LLMEngine, model_dir: Path) -> None:  # noqa: F811
    """Three and one rows run in the buckets of 4 and 1: the padding row reads the padding slot and keeps nothing."""
    engine = speculating_engine(model_dir)
    graphs = with_verify_graphs(engine)
    assert (4, 4) in graphs.keys and (8, 4) in graphs.keys and graphs.max_positions == 40
    rows = counting(graphs)
    requests = named(REPEATING, greedy(60))
    assert run(engine, requests) == run(plain_engine, requests)
    assert len(rows) > 10 and 3 in rows  # steps of three rows, padded to four
    history = graphs.history
    assert history.lengths[history.padding_slot] == 1
    assert not history.tokens[history.padding_slot, : history.max_model_len].any()  # nothing kept


def test_plain_steps_on_their_buffers(plain_engine: LLMEngine, model_dir: Path,  # noqa: F811
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain steps laid out on the device (draft length 0, leaving verification) run in their own keys' buffers,
    three rows padded to four; the output is the output without speculation."""
    engine = speculating_engine(model_dir)
    graphs = with_verify_graphs(engine)
    assert (4, 0) in graphs.keys
    choices = itertools.cycle([4, 4, 0, 0, 0])
    monkeypatch.setattr(engine.speculation.controller, "choose", lambda *args: next(choices))  # type: ignore[union-attr]
    keys: list[tuple[int, int]] = []
    key_for = graphs.key_for
    monkeypatch.setattr(graphs, "key_for", lambda batch: keys.append(key := key_for(batch)) or key)
    requests = named(REPEATING, greedy(60))
    assert run(engine, requests) == run(plain_engine, requests)
    assert (4, 0) in keys and (4, 4) in keys


def test_logprobs_and_the_rule(plain_engine: LLMEngine, model_dir: Path) -> None:  # noqa: F811
    """Logprobs come from the graph's logits; rows with top-p, a logit bias, or more rows than any graph holds take
    the eager path, and give the output they give there."""
    engine = speculating_engine(model_dir)
    rows = counting(with_verify_graphs(engine))
    requests = named(CODE_EDIT + PLAIN, greedy(40, logprobs=2))
    got, want = run_with_logprobs(engine, requests), run_with_logprobs(plain_engine, requests)
    assert [t for t, _ in got.values()] == [t for t, _ in want.values()] and len(rows) > 5
    for (_, got_logprobs), (_, want_logprobs) in zip(got.values(), want.values(), strict=True):
        assert [lp.top_token_ids for lp in got_logprobs] == [lp.top_token_ids for lp in want_logprobs]
        assert [lp.logprob for lp in got_logprobs] == pytest.approx([lp.logprob for lp in want_logprobs], abs=1e-4)
    runner = engine.runner
    sampling = [RowSampling(temperature=0.0), RowSampling(temperature=0.7)]
    batch = DeviceVerifyBatch([0, 1], [[1], [2]], sampling, 4, 1, 3, 16)
    assert runner._verify_graph_draw(batch, device_verification.position_rows(batch)) is not None
    bias = LogitBias(np.array([3]), np.array([1.0], np.float32))
    for other in (RowSampling(temperature=0.7, top_p=0.9), RowSampling(temperature=0.0, logit_bias=bias)):
        mixed = DeviceVerifyBatch([0, 1], [[1], [2]], [sampling[0], other], 4, 1, 3, 16)
        assert runner._verify_graph_draw(mixed, device_verification.position_rows(mixed)) is None
    too_many = DeviceVerifyBatch(list(range(9)), [[1]] * 9, [sampling[0]] * 9, 4, 1, 3, 16)
    assert runner.verify.key_for(too_many) is None  # max_num_seqs 8: no bucket of 9 rows (and 9 x 5 positions)
    filtered = named(REPEATING, SamplingParams(temperature=0.7, top_p=0.9, max_tokens=30, ignore_eos=True))
    engine = speculating_engine(model_dir)
    rows = counting(with_verify_graphs(engine))
    assert all(len(tokens) == 30 for tokens, _ in run(engine, filtered).values()) and rows == []


def run_with_logprobs(engine: LLMEngine, requests: dict) -> dict[str, tuple[list[int], list]]:
    outputs: dict[str, tuple[list[int], list]] = {}
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens, logprobs = outputs.setdefault(out.request_id, ([], []))
            tokens.extend(out.new_token_ids)
            logprobs.extend(out.new_logprobs)
    return outputs


class OpNames(TorchDispatchMode):
    """The names of the torch operations dispatched while it is on, but for those of the n-gram lookup (one kernel
    on CUDA, gpu/kernels/ngram_drafts.py; a few dozen operations here), named once each."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.is_in_lookup = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if not self.is_in_lookup:
            name = str(func.overloadpacket.__name__)
            is_by_mask = name in ("index", "index_put", "index_put_") and any(  # its shape depends on the values
                isinstance(index, torch.Tensor) and index.dtype == torch.bool for index in args[1])
            self.names.append(name + " by mask" if is_by_mask else name)
        return func(*args, **(kwargs or {}))


@contextmanager
def step_ops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """Per call of the step function, the operations of its layout and acceptance (what the step adds to the
    model's forward, logits and draw), recorded."""
    steps: list[list[str]] = []
    recorder: list[OpNames] = []

    def recorded(function: Callable) -> Callable:
        def call(*args: object) -> object:
            with OpNames() as ops:
                recorder[:] = [ops]
                result = function(*args)
            steps[-1].extend(ops.names)
            return result
        return call

    def lookup(*args: object) -> object:
        recorder[0].is_in_lookup = True
        result = drafts(*args)
        recorder[0].is_in_lookup = False
        recorder[0].names.append("ngram_drafts")
        return result

    step, drafts = device_verification.verify_step, device_verification._drafts

    def verify_step(*args: object) -> object:
        steps.append([])
        return step(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(device_verification, "lay_out", recorded(device_verification.lay_out))
    monkeypatch.setattr(device_verification, "accept", recorded(device_verification.accept))
    monkeypatch.setattr(device_verification, "_drafts", lookup)
    monkeypatch.setattr(device_verification, "verify_step", verify_step)
    yield steps


def one_step(engine: LLMEngine, num_rows: int) -> None:
    """One verifying step laid out on the device, of `num_rows` rows of repeating tokens."""
    runner = engine.runner
    fills = [HistoryFill(slot, 0, [5, 6, 7, 8] * 3) for slot in range(num_rows)]
    batch = DeviceVerifyBatch(list(range(num_rows)), [[slot * 2, slot * 2 + 1] for slot in range(num_rows)],
                              [RowSampling(temperature=0.0)] * num_rows, 4, 1, 3, 16, fills)
    result = runner.launch_verification_on_device(batch).result()  # type: ignore[attr-defined]
    assert result.num_drafts == [4] * num_rows and result.num_accepted[0] <= 4


def test_both_paths_run_the_one_step_function(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The eager path and the graphs' body are `verify_step`, and its operations beside the model's are the same
    in both: a few dozen, which a graph replays in one launch, none of which waits for the device."""
    engine = speculating_engine(model_dir)
    rows = counting(with_verify_graphs(engine))
    with step_ops(monkeypatch) as steps:
        one_step(engine, 3)  # the graphs' path, padded to 4 rows
        engine.runner.verify = None
        one_step(engine, 3)  # the eager path
    assert rows == [3]
    assert len(steps) == 2 and steps[0] == steps[1]
    assert 30 <= len(steps[0]) <= 80, steps[0]  # views included: each a launch or more where run eagerly
    # Nothing a CUDA graph cannot hold: no read of a value on the host, no shape that depends on values.
    assert not {"_local_scalar_dense", "nonzero", "masked_select", "unique"} & set(steps[0])
    assert not [name for name in steps[0] if name.endswith(" by mask")]
