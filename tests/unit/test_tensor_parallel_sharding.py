"""How a model is cut into tensor-parallel shards, checked in one process (no collective runs while a model is
built and loaded): each rank's parameters are exactly its slices of the checkpoint; the batch travels to the
workers and back unchanged; KV heads are split or replicated as the rank count asks."""

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from gpu.batch import (
    Batch,
    GroupTables,
    PackedBlockTables,
    Penalties,
    PenaltySlotInit,
    PromptLogprobsRow,
    RowSampling,
    TokenMask,
)
from gpu.batch_wire import decode, decode_mask, encode, encode_mask
from gpu.distributed import TensorParallel
from gpu.layers.attention import kv_heads_of_rank
from gpu.loader import checkpoint_files, load_weights
from gpu.model_info import load_hf_config
from gpu.model_runner import _padded_block_tables
from gpu.models import model_class
from tests.parity.test_tensor_parallel_cpu import build_llama_with_biases


def rank_of(rank: int, size: int) -> TensorParallel:
    return TensorParallel(rank, size, group=object())  # type: ignore[arg-type]  # never used: no collective here


@pytest.mark.parametrize(("num_kv_heads", "size", "expected"), [
    (8, 2, [(0, 4), (4, 4)]),
    (2, 2, [(0, 1), (1, 1)]),
    (1, 2, [(0, 1), (0, 1)]),  # one head, replicated on both ranks
    (2, 4, [(0, 1), (0, 1), (1, 1), (1, 1)]),  # ranks 0-1 read head 0, ranks 2-3 head 1
])
def test_kv_heads_are_split_or_replicated(num_kv_heads: int, size: int, expected: list[tuple[int, int]]) -> None:
    assert [kv_heads_of_rank(num_kv_heads, rank_of(r, size)) for r in range(size)] == expected


@pytest.mark.parametrize(("num_kv_heads", "size"), [(3, 2), (2, 3)])
def test_uneven_kv_heads_are_refused(num_kv_heads: int, size: int) -> None:
    with pytest.raises(ValueError, match="key/value heads"):
        kv_heads_of_rank(num_kv_heads, rank_of(0, size))


def checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys()})  # noqa: SIM118
    return tensors


def test_each_rank_loads_exactly_its_slices(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    # Two KV heads, biases everywhere, an untied head and a vocabulary of 509 (rank 1's share is padded).
    model_dir = build_llama_with_biases(tmp_path / "model", tiny_model_dirs["llama"])
    full = checkpoint(model_dir)
    hd, vocab = 16, 509
    for rank in (0, 1):
        model = model_class(["LlamaForCausalLM"])(load_hf_config(model_dir), 64, tp=rank_of(rank, 2))
        load_weights(model, model_dir)
        layer = model.model.layers[0]
        qkv = layer.self_attn.qkv_proj.weight
        q, k, v = (full[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv")
        heads, kv_heads = slice(rank * 2 * hd, (rank + 1) * 2 * hd), slice(rank * hd, (rank + 1) * hd)
        assert torch.equal(qkv, torch.cat([q[heads], k[kv_heads], v[kv_heads]]))
        o_bias = full["model.layers.0.self_attn.o_proj.bias"]
        assert torch.equal(layer.self_attn.o_proj.weight, full["model.layers.0.self_attn.o_proj.weight"][:, heads])
        assert torch.equal(layer.self_attn.o_proj.bias, o_bias if rank == 0 else torch.zeros_like(o_bias))
        mlp = slice(rank * 64, (rank + 1) * 64)
        assert torch.equal(layer.mlp.down_proj.weight, full["model.layers.0.mlp.down_proj.weight"][:, mlp])
        assert torch.equal(layer.mlp.gate_up_proj.bias, torch.cat([full[f"model.layers.0.mlp.{n}_proj.bias"][mlp]
                                                                   for n in ("gate", "up")]))
        rows = slice(rank * 255, min((rank + 1) * 255, vocab))
        for name, param in (("model.embed_tokens.weight", model.model.embed_tokens.weight),
                            ("lm_head.weight", model.lm_head.weight)):
            assert param.shape[0] == 255
            assert torch.equal(param[: rows.stop - rows.start], full[name][rows])
            assert not param[rows.stop - rows.start :].any(), "padding rows past the vocabulary are zeros"


def test_batch_reaches_every_rank_as_built() -> None:
    sampling = [RowSampling(temperature=0.7, seed=3, output_index=2, penalties=Penalties(slot=1, presence=0.5)),
                None, RowSampling(num_top_logprobs=2, has_token_mask=True)]
    batch = Batch(token_ids=[5, 6, 7, 8, 0, 9], positions=[0, 1, 2, 3, 4, 7], slot_mapping=[16, 17, 18, 40, 41, 70],
                  query_lens=[3, 2, 1], context_lens=[3, 5, 8], block_tables=[[1], [2, 10], [3, 4]],
                  sampling=sampling, fed_back_token_indices=[4], fed_back_rows=[1],
                  penalty_slot_inits=[PenaltySlotInit(1, [5, 6, 7], [])], has_token_masks=True,
                  prompt_logprobs=[PromptLogprobsRow(0, [6, 7], 2)],
                  other_groups=[GroupTables([4, 5, 6, 80, 81, 33], [[0], [9, 5], [12, 4]])])
    first, other = (decode(message) for message in encode(batch))
    for received in (first, other):
        for name in ("token_ids", "positions", "slot_mapping", "query_lens", "context_lens",
                     "fed_back_token_indices", "fed_back_rows", "prompt_logprobs"):
            assert getattr(received, name) == getattr(batch, name), name
        assert isinstance(received.block_tables, PackedBlockTables)
        assert np.array_equal(_padded_block_tables(received.block_tables), _padded_block_tables(batch.block_tables))
        (group,), (sent,) = received.other_groups, batch.other_groups  # a further KV-cache group's, as built
        assert group.slot_mapping == sent.slot_mapping and isinstance(group.block_tables, PackedBlockTables)
        assert np.array_equal(_padded_block_tables(group.block_tables), _padded_block_tables(sent.block_tables))
        assert [row is None for row in received.sampling] == [False, True, False]
    # Only rank 0 samples: it alone gets the rows' settings, the penalty slots and the masks that follow.
    assert (first.sampling, first.penalty_slot_inits, first.has_token_masks) == \
        (sampling, batch.penalty_slot_inits, True)
    assert other.penalty_slot_inits == [] and not other.has_token_masks
    assert all(row is None or row.penalties is None for row in other.sampling)
    mask = TokenMask([1], np.array([[5, 0]], dtype=np.int32))
    received_mask = decode_mask(encode_mask(mask))
    assert received_mask.row_indices == [1] and np.array_equal(received_mask.bitmask, mask.bitmask)
