"""Verify graphs on CUDA (gpu/verify_graphs.py): captured at start for every rows bucket and draft length; a replay
gives the eager device path's tokens, accepted counts and token history exactly, step after step with the rows'
positions, lengths, row counts (padded rows) and draft lengths changing between replays; and the engine's greedy
float32 output with them equals the output without speculation (tests/unit/test_verify_graphs.py on the CPU)."""

import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from core import LLM, SamplingParams  # noqa: E402
from core.engine import LLMEngine  # noqa: E402
from core.tiny_model import build_tiny_model  # noqa: E402
from gpu import device_verification  # noqa: E402
from gpu.batch import Batch, RowSampling  # noqa: E402
from gpu.device_verification import DeviceVerifyBatch  # noqa: E402
from gpu.token_history import HistoryFill  # noqa: E402
from tests.tiny_specs import TINY_SPECS  # noqa: E402
from tests.unit.test_device_verification import CODE_EDIT, PLAIN, REPEATING, DeviceSteps, greedy, named, run  # noqa: E402

COMMON = dict(max_model_len=512, block_size=16, kv_cache_blocks=256, max_num_seqs=16, max_num_batched_tokens=256,
              device="cuda")
SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False, "prompt_lookup_max": 3}
BLOCKS_PER_ROW = 24  # row r's blocks: [r * 24, r * 24 + 24), 384 tokens: more than a row reaches


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("verifygraphs") / request.param, TINY_SPECS[request.param])


def engine(model_dir: Path, speculative: bool, dtype: str = "float32") -> LLMEngine:
    config = SPECULATIVE if speculative else None
    return LLM(str(model_dir), speculative_config=config, dtype=dtype, **COMMON).engine  # type: ignore[arg-type]


def test_every_bucket_and_draft_length_is_captured(model_dir: Path) -> None:
    graphs = engine(model_dir, True).runner.verify  # type: ignore[attr-defined]
    assert graphs is not None and graphs.max_positions == 80  # 16 rows x 5 positions, within the token budget
    assert set(graphs.graphs) == set(graphs.keys)
    assert {(rows, k) for rows in (1, 2, 4, 8, 16) for k in range(5)} == set(graphs.keys)  # k = 0: plain steps


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_replay_equals_the_eager_paths(model_dir: Path, dtype: str) -> None:
    """Thirty steps of changing rows (padded or not), draft lengths, positions and context lengths. Each is run three
    times from the same history: replayed; eagerly on the graphs' buffers (the same function, shapes and inputs):
    bit for bit the same logits, tokens, counts and history; and by the eager device path (unpadded, its forward in a
    mixed-step graph): in float32 the same tokens, counts and history. The next step starts from the last run's; the
    K/V each run writes are the step's own positions', the same in all three runs where the logits are."""
    runner = engine(model_dir, True, dtype).runner
    graphs, history, rng = runner.verify, runner.token_history, random.Random(0)  # type: ignore[attr-defined]
    lengths = [rng.randint(20, 120) for _ in range(8)]
    prompts = [[rng.randrange(40) for _ in range(9)] * (length // 9) + [1] * (length % 9) for length in lengths]
    history.fill([HistoryFill(slot, 0, prompt) for slot, prompt in enumerate(prompts)])
    prefill(runner, prompts)
    num_accepted = 0
    with torch.inference_mode():
        for step in range(30):
            num_rows, k = rng.choice([1, 3, 5, 8]), rng.randint(1, 4)
            tables = [list(range(r * BLOCKS_PER_ROW, r * BLOCKS_PER_ROW + -(-(lengths[r] + k) // 16)))
                      for r in range(num_rows)]
            batch = DeviceVerifyBatch(list(range(num_rows)), tables, [RowSampling(temperature=0.0)] * num_rows, k, 1,
                                      3, max(lengths[:num_rows]) + k)
            rows = device_verification.position_rows(batch)
            draw = runner._verify_graph_draw(batch, rows)
            assert draw is not None and graphs.key_for(batch) in graphs.graphs
            saved = history.tokens.clone(), history.lengths.clone()
            replayed = _results(graphs.run(batch, draw), history)
            captured, graphs.graphs = graphs.graphs, {}
            _restore(history, saved)
            on_buffers = _results(graphs.run(batch, draw), history)
            graphs.graphs = captured
            for got, want in zip(replayed, on_buffers, strict=True):
                assert torch.equal(got, want), (step, num_rows, k)
            _restore(history, saved)
            eager = _results(runner._verify_eagerly(batch, rows), history)
            if dtype == "float32":
                for got, want in zip(replayed[1:], eager[1:], strict=True):
                    assert torch.equal(got, want), (step, num_rows, k)
            for r, accepted in enumerate(eager[2][:, 0].tolist()):
                lengths[r] += accepted + 1
                num_accepted += accepted
    assert num_accepted > 0  # (the random tiny models accept a few drafts once their own outputs repeat)


def prefill(runner: object, prompts: list[list[int]]) -> None:
    """Each row's K/V but for its last token's (that of a decoding sequence), row r in its blocks."""
    lengths = [len(prompt) - 1 for prompt in prompts]
    slots = [(r * BLOCKS_PER_ROW + p // 16) * 16 + p % 16 for r, n in enumerate(lengths) for p in range(n)]
    runner.execute(Batch(  # type: ignore[attr-defined]
        token_ids=[t for prompt in prompts for t in prompt[:-1]], positions=[p for n in lengths for p in range(n)],
        slot_mapping=slots, query_lens=lengths, context_lens=lengths,
        block_tables=[list(range(r * BLOCKS_PER_ROW, (r + 1) * BLOCKS_PER_ROW)) for r in range(len(prompts))],
        sampling=[None] * len(prompts)))


def _results(out: device_verification.VerifiedOutputs, history: object) -> list[torch.Tensor]:
    """Copies of a step's logits, tokens and counts, and of the history after it (but for the spare column, where
    tokens not kept go: a padded step writes the padding slot's)."""
    return [t.clone() for t in (out.logits, out.token_ids, out.counts, history.tokens[:, :-1], history.lengths)]  # type: ignore


def _restore(history: object, saved: tuple[torch.Tensor, torch.Tensor]) -> None:
    history.tokens.copy_(saved[0])  # type: ignore[attr-defined]
    history.lengths.copy_(saved[1])  # type: ignore[attr-defined]


def replays(speculating: LLMEngine) -> list[bool]:
    """Per step the verify graphs take, whether a captured graph replayed it, recorded."""
    graphs = speculating.runner.verify  # type: ignore[attr-defined]
    replayed: list[bool] = []
    graphs_run = graphs.run

    def record(batch: DeviceVerifyBatch, draw: object) -> device_verification.VerifiedOutputs:
        replayed.append(graphs.key_for(batch) in graphs.graphs)
        return graphs_run(batch, draw)

    graphs.run = record
    return replayed


def test_float32_output_equals_output_without_drafts(model_dir: Path) -> None:
    requests = named(REPEATING + CODE_EDIT + PLAIN, greedy(64))
    speculating = engine(model_dir, True)
    steps, replayed = DeviceSteps(speculating), replays(speculating)
    assert run(speculating, requests) == run(engine(model_dir, False), requests)
    # drafts kept (how many depends on what the random model repeats): the acceptance path ran in the graphs
    assert speculating.speculation.counts.num_accepted_tokens > 0  # type: ignore[union-attr]
    assert steps.num_launched > 10 and len(replayed) == steps.num_launched and all(replayed)
    assert steps.num_overlapped >= steps.num_launched - 2


def test_unseeded_random_rows_replay(model_dir: Path) -> None:
    """Random rows draw inside the graph (a Philox key per position); rows with top-p are verified eagerly."""
    speculating = engine(model_dir, True)
    steps, replayed = DeviceSteps(speculating), replays(speculating)
    params = SamplingParams(temperature=0.8, max_tokens=40, ignore_eos=True)
    outputs = run(speculating, named(REPEATING + CODE_EDIT, params))
    assert all(len(tokens) == 40 for tokens, _ in outputs.values())
    assert steps.num_launched > 5 and len(replayed) == steps.num_launched and all(replayed)
    filtered = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=40, ignore_eos=True)
    speculating = engine(model_dir, True)
    steps, replayed = DeviceSteps(speculating), replays(speculating)
    assert all(len(tokens) == 40 for tokens, _ in run(speculating, named(REPEATING, filtered)).values())
    assert steps.num_launched > 5 and replayed == []
