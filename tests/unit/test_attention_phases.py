"""Attention backends per step phase on CPU: candidates, routing, the start-up choice, and the padded
inputs of mixed-step CUDA graphs (their host side: the graphs themselves are tested in tests/gpu)."""

import numpy as np
import pytest
import torch

from gpu import backend_choice
from gpu.attention.backend import PhasedBackend, TorchBackend, candidate_names, flash_attn_unavailable
from gpu.attention.metadata import AttentionMetadata
from gpu.attention.variant import PLAIN
from gpu.batch import Batch, GroupTables
from gpu.mixed_graphs import (
    FEW_ROWS,
    LinearRows,
    MixedGraphs,
    StaticInputs,
    fill_host_inputs,
    int32_size,
    token_buckets,
)
from gpu.state_cache import sequential_rows

CPU = torch.device("cpu")


def test_candidates_on_cpu() -> None:
    assert candidate_names("auto", CPU, torch.float32) == (["cpu"], None)
    assert candidate_names("torch", CPU, torch.float32) == (["torch"], None)
    assert candidate_names("cpu", CPU, torch.bfloat16) == (["cpu"], None)
    for name in ("triton", "flash-attn"):
        with pytest.raises(ValueError, match="needs CUDA"):
            candidate_names(name, CPU, torch.float32)
    with pytest.raises(ValueError, match="runs on a CPU"):
        candidate_names("cpu", torch.device("cuda"), torch.bfloat16)
    with pytest.raises(ValueError, match="unknown attention backend"):
        candidate_names("xformers", CPU, torch.float32)


def test_flash_attn_refuses_cpu_float32_and_heads_past_256() -> None:
    assert "CUDA" in flash_attn_unavailable(CPU, torch.bfloat16)
    assert "float16 or bfloat16" in flash_attn_unavailable(torch.device("cuda"), torch.float32)
    assert "[256, 512]" in flash_attn_unavailable(torch.device("cuda"), torch.bfloat16, (256, 512, 256))


class _Recorder(TorchBackend):
    def __init__(self, name: str) -> None:
        self.name, self.calls = name, 0

    def forward(self, query, k_cache, v_cache, meta, scale, variant=PLAIN) -> torch.Tensor:  # noqa: ANN001
        self.calls += 1
        return query


def _meta(is_decode_only: bool) -> AttentionMetadata:
    empty = torch.zeros(0, dtype=torch.int32)
    return AttentionMetadata(empty, empty, empty, empty.view(0, 0), 1, 1, is_decode_only)


def test_phased_backend_routes_by_phase() -> None:
    decode, prefill = _Recorder("a"), _Recorder("b")
    phased = PhasedBackend(decode, prefill)
    assert phased.name == "decode=a, prefill=b"
    q = torch.zeros(1, 1, 1)
    phased.forward(q, q, q, _meta(True), 1.0)
    assert (decode.calls, prefill.calls) == (1, 0)
    phased.forward(q, q, q, _meta(False), 1.0)
    assert (decode.calls, prefill.calls) == (1, 1)
    assert PhasedBackend(decode, decode).name == "a"


def test_choose_phases_picks_the_faster_per_phase_and_sums_steps() -> None:
    fast_decode, fast_prefill = _Recorder("triton"), _Recorder("flash-attn")
    steps = {"decode": ["d1", "d2"], "prefill": ["p"]}
    cost = {("triton", "d1"): 1.0, ("triton", "d2"): 5.0, ("flash-attn", "d1"): 3.0, ("flash-attn", "d2"): 3.5,
            ("triton", "p"): 2.0, ("flash-attn", "p"): 1.5}
    seen_graphed = []

    def time_step(backend, batch, graphed: bool) -> float:  # noqa: ANN001
        seen_graphed.append((backend.name, batch, graphed))
        return cost[(backend.name, batch)]

    chosen, times = backend_choice.choose_phases(
        [fast_decode, fast_prefill], steps, lambda backend, phase: phase == "decode", time_step)
    assert times == {"decode": {"triton": 6.0, "flash-attn": 6.5}, "prefill": {"triton": 2.0, "flash-attn": 1.5}}
    assert chosen.decode is fast_decode and chosen.prefill is fast_prefill
    assert ("flash-attn", "p", False) in seen_graphed and ("triton", "d2", True) in seen_graphed


@pytest.mark.parametrize(("num_blocks", "max_num_seqs", "budget"), [(40_000, 256, 8192), (24, 16, 32), (512, 16, 512)])
def test_synthetic_steps_fit_the_cache_and_limits(num_blocks: int, max_num_seqs: int, budget: int) -> None:
    shape = backend_choice.StepShape(max_num_seqs, budget, 4096, 16, num_blocks, vocab_size=300)
    steps = backend_choice.synthetic_steps(shape)
    assert backend_choice.blocks_used(steps) <= num_blocks
    for batch in steps["decode"]:
        assert batch.is_decode_only and batch.num_rows <= max_num_seqs
    for prefill in steps["prefill"]:
        assert not prefill.is_decode_only and len(prefill.token_ids) <= budget and prefill.num_rows <= max_num_seqs
    assert min(steps["prefill"][1].query_lens) > 1  # fresh prompts alone: no decode rows
    assert steps["decode"][1].num_rows == max_num_seqs
    for batch in (*steps["decode"], *steps["prefill"]):
        assert len(batch.positions) == sum(batch.query_lens)
        assert 0 <= min(batch.token_ids) and max(batch.token_ids) < 300  # the tests' tiny models have small vocabs
        assert all(len(t) * 16 >= c for t, c in zip(batch.block_tables, batch.context_lens, strict=True))


def test_the_loaded_prefill_step_is_a_busy_servers() -> None:
    """Most of a busy server's prefill time goes to steps of prompts beside many decode rows (where FA4's steps
    measured slower than Triton's, though faster beside 64 rows): the phase is timed on one of those."""
    steps = backend_choice.synthetic_steps(backend_choice.StepShape(256, 8192, 4096, 16, 40_000, vocab_size=300))
    loaded = steps["prefill"][0]
    assert sum(q == 1 for q in loaded.query_lens) == 192 and min(loaded.context_lens) >= 1024
    assert sorted(q for q in loaded.query_lens if q > 1) == [1024] * 7  # the rest of the 8192-token budget


def test_synthetic_rows_sit_on_scattered_blocks_each_its_own() -> None:
    """As a served cache's rows do (FA4's steps measured 4% slower on scattered blocks than on consecutive ones)."""
    steps = backend_choice.synthetic_steps(backend_choice.StepShape(16, 512, 4096, 16, 512, vocab_size=300))
    for batch in (*steps["decode"], *steps["prefill"]):
        blocks = [b for table in batch.block_tables for b in table]
        assert sorted(blocks) == list(range(len(blocks)))  # every block once, none shared
    loaded = [b for table in steps["prefill"][0].block_tables for b in table]
    assert loaded != sorted(loaded)


def test_token_buckets() -> None:
    assert token_buckets(8192)[:8] == [16, 32, 64, 128, 256, 512, 768, 1024]
    assert token_buckets(8192)[-3:] == [7168, 7680, 8192]
    assert token_buckets(100) == [16, 32, 64, 100]
    assert token_buckets(8000)[-1] == 8000


def test_each_bucket_has_a_few_rows_capacity_beside_its_most_rows() -> None:
    """Steps of prompts alone replay a graph padded to FEW_ROWS rows, not to max_num_seqs (FA4's padded rows cost)."""
    inputs = StaticInputs(max_tokens=8192, max_rows=256, max_blocks=4, device=torch.device("cpu"))
    assert FEW_ROWS == 32
    assert inputs.row_capacities(16) == [16]  # never more rows than tokens
    assert inputs.row_capacities(32) == [32]
    assert inputs.row_capacities(64) == [32, 64]
    assert inputs.row_capacities(8192) == [32, 256]
    meta = inputs.metadata(8192, 32, max_model_len=64)
    assert meta.query_start_loc.shape == (33,) and meta.context_lens.shape == (32,)
    assert meta.block_tables.shape == (32, 4) and meta.max_query_len == 8192
    assert StaticInputs(8192, 16, 4, torch.device("cpu")).row_capacities(8192) == [16]


def test_fill_host_inputs_pads_tokens_and_rows() -> None:
    max_rows, max_blocks, bucket = 8, 4, 16
    int64 = np.full(5 * 32, 99, dtype=np.int64)
    int32 = np.full(int32_size(max_rows, max_blocks), 99, dtype=np.int32)
    batch = Batch(token_ids=[5, 6, 7, 0, 9], positions=[0, 1, 2, 40, 3], slot_mapping=[16, 17, 18, 70, 3],
                  query_lens=[3, 1, 1], context_lens=[3, 41, 4], block_tables=[[1], [2, 3, 4], [0]],
                  fed_back_token_indices=[3], fed_back_rows=[2])
    num_int64, num_int32 = fill_host_inputs(int64, int32, batch, bucket, rows_cap=8, max_blocks=max_blocks)
    assert num_int64 == 5 * bucket and num_int32 == int32_size(8, max_blocks)
    fields = int64[: 5 * bucket].reshape(5, bucket)
    assert fields[0].tolist() == [5, 6, 7, 0, 9] + [0] * 11
    assert fields[1].tolist() == [0, 1, 2, 40, 3] + [0] * 11
    assert fields[2].tolist() == [16, 17, 18, 70, 3] + [-1] * 11
    assert (fields[3, 0], fields[4, 0]) == (3, 2)
    assert int32[:9].tolist() == [0, 3, 4, 5, 5, 5, 5, 5, 5]  # padding rows repeat the token count
    assert int32[9:17].tolist() == [3, 41, 4, 0, 0, 0, 0, 0]
    tables = int32[17:num_int32].reshape(8, max_blocks)
    assert tables[0, 0] == 1 and tables[1, :3].tolist() == [2, 3, 4] and tables[2, 0] == 0


def test_each_kv_cache_group_reads_back_its_slots_and_tables_from_the_filled_inputs() -> None:
    """The host side fills every group's slots and tables where the graph's metadata views of that group read."""
    max_rows, max_blocks, bucket, rows_cap = 8, 4, 16, 8
    inputs = StaticInputs(max_tokens=32, max_rows=max_rows, max_blocks=max_blocks, device=CPU, num_groups=3)
    int64, int32 = inputs.int64.numpy().copy(), inputs.int32.numpy().copy()
    groups = [GroupTables([30, 31, 32, 90, 7], [[5, 6], [9], [2]]), GroupTables([60, 61, 62, 3, 8], [[3], [0], [1]])]
    batch = Batch(token_ids=[5, 6, 7, 0, 9], positions=[0, 1, 2, 40, 3], slot_mapping=[16, 17, 18, 70, 3],
                  query_lens=[3, 1, 1], context_lens=[3, 41, 4], block_tables=[[1], [2, 3, 4], [0]],
                  other_groups=groups)
    num_int64, num_int32 = fill_host_inputs(int64, int32, batch, bucket, rows_cap, max_blocks)
    inputs.int64[:num_int64] = torch.from_numpy(int64[:num_int64])
    inputs.int32[:num_int32] = torch.from_numpy(int32[:num_int32])
    meta = inputs.metadata(bucket, rows_cap, max_model_len=64)
    for group, (slots, tables) in enumerate([(batch.slot_mapping, batch.block_tables),
                                             *((g.slot_mapping, g.block_tables) for g in groups)]):
        view = meta.of_group(group)
        assert view.slot_mapping.tolist() == slots + [-1] * (bucket - len(slots))  # padding writes nothing
        for row, table in enumerate(tables):
            assert view.block_tables[row, : len(table)].tolist() == table
        assert view.context_lens is meta.context_lens and view.query_start_loc is meta.query_start_loc


def _hybrid_batch() -> Batch:
    """A step of a model with linear-attention layers: a one-token row, a prompt chunk that starts its sequence with
    two snapshots saved inside it and one at its end (the runner's copy), a continued chunk."""
    return Batch(token_ids=list(range(12)), positions=list(range(12)), slot_mapping=list(range(12)),
                 query_lens=[1, 8, 3], context_lens=[20, 8, 9], block_tables=[[0], [1], [2]],
                 state_slots=[2, 0, 3], state_saves=[(1, 3, 5), (1, 6, 6), (1, 8, 7), (2, 3, 8)])


def test_padded_linear_rows_are_the_sequential_rows_then_empty_padding_rows() -> None:
    """The mixed graphs' state inputs of a hybrid step read back from the static buffers: the real rows' pieces as
    the eager step's sequential kernel gets them, each padding row one empty piece at token 0 on the padding slot,
    starting its state; the conv kernel's token blocks from the bucket and the sequential limit only."""
    linear = LinearRows(num_state_slots=4, padding_slot=9, max_row_tokens=512)
    max_rows, max_blocks, bucket, rows_cap = 8, 4, 16, 8
    inputs = StaticInputs(max_tokens=32, max_rows=max_rows, max_blocks=max_blocks, device=CPU, linear=linear)
    int64, int32 = inputs.int64.numpy().copy(), inputs.int32.numpy().copy()
    batch = _hybrid_batch()
    num_int64, num_int32 = fill_host_inputs(int64, int32, batch, bucket, rows_cap, max_blocks, linear)
    inputs.int64[:num_int64] = torch.from_numpy(int64[:num_int64])
    inputs.int32[:num_int32] = torch.from_numpy(int32[:num_int32])
    state = inputs.metadata(bucket, rows_cap, max_model_len=64).linear_state
    assert state is not None and not state.parts and not state.is_one_token_per_row and state.max_row_tokens == 16
    assert state.slots.tolist() == [2, 0, 3] + [9] * 5
    assert state.keeps_state.tolist() == [1.0, 0.0, 1.0] + [0.0] * 5
    rows = state.sequential_rows()
    pieces = (((0, 1, None),), ((1, 4, 5), (4, 7, 6), (7, 9, None)), ((9, 12, None),))
    eager = sequential_rows(pieces, [2, 0, 3], CPU)
    num_pieces = len(eager.piece_ends)
    assert rows.row_starts.tolist() == eager.row_starts.tolist() + [0] * 5
    assert rows.row_pieces.tolist() == eager.row_pieces.tolist() + list(range(num_pieces + 1, num_pieces + 6))
    assert rows.piece_ends[:num_pieces].tolist() == eager.piece_ends.tolist()
    assert rows.piece_states[:num_pieces].tolist() == eager.piece_states.tolist()
    assert rows.piece_ends[num_pieces : num_pieces + 5].tolist() == [0] * 5
    assert rows.piece_states[num_pieces : num_pieces + 5].tolist() == [9] * 5
    assert rows.piece_ends.shape == (bucket + rows_cap,)  # sized by the bucket and the capacity, not the step


def test_mixed_graphs_hold_hybrid_steps_only_within_the_sequential_rule() -> None:
    """Rows past the sequential delta rule (fla's chunked kernel builds its indices on the host) and rows that verify
    drafts (run position by position) keep a hybrid's step out of the mixed graphs; a model without linear layers
    is not limited so."""
    def graphs(linear: LinearRows | None) -> MixedGraphs:
        return MixedGraphs(lambda *args: args[0], 64, 8, 64, 16, CPU, linear=linear)

    hybrid, dense = graphs(LinearRows(4, 9, max_row_tokens=8)), graphs(None)
    batch = _hybrid_batch()
    assert hybrid.bucket_for(batch) == dense.bucket_for(batch) == (16, 8)
    longer = Batch(token_ids=[0] * 10, positions=list(range(10)), slot_mapping=list(range(10)), query_lens=[9, 1],
                   context_lens=[9, 5], block_tables=[[0], [1]], state_slots=[0, 1])
    assert hybrid.bucket_for(longer) is None and dense.bucket_for(longer) == (16, 8)
    verifying = Batch(token_ids=[0] * 4, positions=list(range(4)), slot_mapping=list(range(4)), query_lens=[3, 1],
                      context_lens=[9, 5], block_tables=[[0], [1]], state_slots=[0, 1], num_draft_tokens=[2, 0])
    assert hybrid.bucket_for(verifying) is None and dense.bucket_for(verifying) == (16, 8)
