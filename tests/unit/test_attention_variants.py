"""Sliding windows, attention sinks and score soft-caps in the torch reference and the `cpu` backend, against
transformers' own pieces: its sliding-window mask function (masking_utils) and gpt-oss's eager attention, the
oracle for sinks. Rows are decode rows, prefill chunks after a cached prefix and both in one step, with
contexts longer than the window and than a block; a windowed row's table entries before its window name a
block full of NaN, which must not reach the output (the blocks a windowed layer no longer reads)."""

import pytest
import torch
from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function
from transformers.models.gemma3.modeling_gemma3 import eager_attention_forward as gemma3_attention
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_attention

from gpu.attention.backend import TorchBackend
from gpu.attention.cpu_backend import CpuBackend
from gpu.attention.metadata import AttentionMetadata
from gpu.attention.variant import AttentionVariant
from gpu.cpu_kernels import load_cpu_kernels

BLOCK_SIZE, HEAD_DIM, SCALE = 4, 16, 0.3
NUM_HEADS, NUM_KV_HEADS = 6, 2
STEPS = [([1, 1, 1], [3, 18, 41]), ([9, 5], [9, 30]), ([1, 7, 1, 0], [22, 13, 40, 4]), ([12], [12])]


class Paged:
    """Rows' contexts in a paged cache (each row's blocks scattered), and the same contexts dense."""

    def __init__(self, query_lens: list[int], context_lens: list[int], garbage_before: list[int]) -> None:
        generator = torch.Generator().manual_seed(sum(context_lens))
        self.query_lens, self.context_lens = query_lens, context_lens
        self.dense = [torch.randn(2, n, NUM_KV_HEADS, HEAD_DIM, generator=generator) for n in context_lens]
        blocks_per_row = [-(-n // BLOCK_SIZE) for n in context_lens]
        num_blocks = sum(blocks_per_row) + 1  # the last block: NaN, named where a row's reads must not go
        order = torch.randperm(num_blocks - 1, generator=generator).tolist()
        caches = torch.full((2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM), float("nan"))
        table = torch.full((len(context_lens), max(blocks_per_row)), num_blocks - 1, dtype=torch.int32)
        used = 0
        for row, kv in enumerate(self.dense):
            for i in range(blocks_per_row[row]):
                block = order[used + i]
                rows = kv[:, i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]
                caches[:, block, : rows.shape[1]] = rows
                if i * BLOCK_SIZE + BLOCK_SIZE <= garbage_before[row]:
                    table[row, i] = num_blocks - 1  # wholly before the row's window: never read
                else:
                    table[row, i] = block
            used += blocks_per_row[row]
        self.k_cache, self.v_cache = caches[0], caches[1]
        self.query = torch.randn(sum(query_lens), NUM_HEADS, HEAD_DIM, generator=generator)
        self.meta = AttentionMetadata(
            slot_mapping=torch.zeros(0, dtype=torch.int64),
            query_start_loc=torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32),
            context_lens=torch.tensor(context_lens, dtype=torch.int32), block_tables=table,
            max_query_len=max(query_lens), max_context_len=max(context_lens), is_decode_only=max(query_lens) == 1)


def transformers_attention(paged: Paged, variant: AttentionVariant) -> torch.Tensor:
    """Each row through transformers' eager attention with its mask functions: gpt-oss's (sinks) or Gemma 3's
    (soft-cap, or plain), on the dense keys and values."""
    outputs, start = [], 0
    mask_function = (causal_mask_function if variant.sliding_window is None
                     else sliding_window_causal_mask_function(variant.sliding_window))
    for query_len, context_len, (keys, values) in zip(paged.query_lens, paged.context_lens, paged.dense,
                                                       strict=True):
        query = paged.query[start : start + query_len]
        start += query_len
        if query_len == 0:
            continue
        q_idx = torch.arange(context_len - query_len, context_len).view(-1, 1)
        visible = mask_function(0, 0, q_idx, torch.arange(context_len).view(1, -1))
        mask = torch.zeros(visible.shape).masked_fill_(~visible, float("-inf"))[None, None]
        module = torch.nn.Module()
        module.num_key_value_groups, module.training = NUM_HEADS // NUM_KV_HEADS, False
        args = (query.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None], mask)
        if variant.sinks is not None:
            module.sinks = variant.sinks
            out, _ = gpt_oss_attention(module, *args, scaling=SCALE)
        else:
            out, _ = gemma3_attention(module, *args, scaling=SCALE, softcap=variant.softcap)
        outputs.append(out[0])
    return torch.cat(outputs)


VARIANTS = {
    "window-5": AttentionVariant(sliding_window=5),
    "window-16": AttentionVariant(sliding_window=16),
    "window-1": AttentionVariant(sliding_window=1),
    "sinks": AttentionVariant(sinks=torch.linspace(-2.0, 3.0, NUM_HEADS)),
    "window-7-sinks": AttentionVariant(sliding_window=7, sinks=torch.linspace(1.0, -1.5, NUM_HEADS)),
    "softcap": AttentionVariant(softcap=2.0),
    "window-9-softcap": AttentionVariant(sliding_window=9, softcap=1.5),
}


# The cpu backend with its C kernels too: they take plain attention only, a variant keeps the torch code.
@pytest.mark.parametrize("backend", [TorchBackend(), CpuBackend(), CpuBackend(load_cpu_kernels(None).attention)],
                         ids=["torch", "cpu", "cpu with its C kernels"])
@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize(("query_lens", "context_lens"), STEPS, ids=str)
def test_variant_equals_transformers(backend: object, name: str, query_lens: list[int],
                                     context_lens: list[int]) -> None:
    variant = VARIANTS[name]
    window = variant.sliding_window
    # Blocks wholly before the earliest query's window name the NaN block.
    garbage = [0 if window is None else n - q - window + 1 for q, n in zip(query_lens, context_lens, strict=True)]
    paged = Paged(query_lens, context_lens, garbage)
    got = backend.forward(paged.query, paged.k_cache, paged.v_cache, paged.meta, SCALE, variant)  # type: ignore[attr-defined]
    computed = torch.cat([torch.arange(int(paged.meta.query_start_loc[i]), int(paged.meta.query_start_loc[i + 1]))
                          for i, n in enumerate(query_lens) if n])
    torch.testing.assert_close(got[computed], transformers_attention(paged, variant), rtol=1e-5, atol=1e-5)


def test_a_window_changes_the_output() -> None:
    """A context longer than the window: attention differs from unwindowed attention (the test above bites)."""
    paged = Paged([1], [30], [0])
    plain = TorchBackend().forward(paged.query, paged.k_cache, paged.v_cache, paged.meta, SCALE)
    windowed = TorchBackend().forward(paged.query, paged.k_cache, paged.v_cache, paged.meta, SCALE,
                                      AttentionVariant(sliding_window=8))
    assert (plain - windowed).abs().max() > 1e-2


def test_a_variant_checks_its_values() -> None:
    with pytest.raises(ValueError, match="sliding_window"):
        AttentionVariant(sliding_window=0)
    with pytest.raises(ValueError, match="softcap"):
        AttentionVariant(softcap=-1.0)
