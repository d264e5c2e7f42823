"""A verifying step's attention through the Triton backend, which runs its queries as decode rows
(AttentionMetadata.query_rows) on the decode kernel, under Triton's interpreter on the CPU in float32: the same
output as the prefill kernel's for the step's rows, with and without a layer's variant, for 1..3 rows of 2..9
queries whose contexts cross KV blocks and tiles, with one split and several. Both ways the metadata is made: the
host's (gpu/model_runner.py's step_inputs) and the device's (gpu/device_verification.py's lay_out); rows of as many
queries each run in one program a row (QueryRows.queries_per_row), others in one a query.
tests/gpu/test_verify_attention_gpu.py checks the compiled kernels on CUDA."""

import os

import numpy as np
import pytest
import torch

from gpu.attention.metadata import AttentionMetadata, query_rows_of_host_rows, query_rows_of_uniform_rows
from gpu.attention.variant import PLAIN, AttentionVariant

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from gpu.attention.triton_backend import TritonBackend  # noqa: E402
from gpu.kernels.prefill_attention import prefill_attention  # noqa: E402
from tests.unit.attention_variant_kernels_interpreted_cases import NUM_HEADS, paged_step  # noqa: E402

VARIANTS = {
    "plain": PLAIN,
    "window-5": AttentionVariant(sliding_window=5),
    "window-9-sinks": AttentionVariant(sliding_window=9, sinks=torch.tensor([3.0, -2.0, 0.0, 1.0])),
    "softcap-sinks": AttentionVariant(softcap=2.5, sinks=torch.tensor([0.1, 0.2, 0.3, 9.0])),
}
# (query lengths, context lengths) of verifying steps: k + 1 queries a row, the step's tokens included in the context
STEPS = {
    "one-row-2": ([2], [7]),
    "one-row-9": ([9], [40]),
    # the second KV tile holds keys of the last queries only: with splits, earlier queries have none in its segment
    "one-row-5-across-tiles": ([5], [66]),
    "two-rows-5": ([5, 5], [5, 33]),
    "three-rows-uneven": ([3, 9, 2], [12, 71, 18]),
}


def _metadata(query_lens: list[int], context_lens: torch.Tensor, starts: torch.Tensor, table: torch.Tensor,
              on_device: bool) -> AttentionMetadata:
    if on_device:
        positions = context_lens[:, None].long() - query_lens[0] + torch.arange(query_lens[0])
        query_rows = query_rows_of_uniform_rows(positions, table)
    else:
        query_rows = query_rows_of_host_rows(np.array(query_lens), context_lens.numpy(), table)
    return AttentionMetadata(slot_mapping=torch.zeros(0, dtype=torch.int64), query_start_loc=starts,
                             context_lens=context_lens, block_tables=table, max_query_len=max(query_lens),
                             max_context_len=int(context_lens.max()), is_decode_only=False, query_rows=query_rows)


def _not_run(*args: object, **kwargs: object) -> None:
    raise AssertionError("a verifying step laid out as decode rows went to the prefill kernel")


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("variant_name", list(VARIANTS))
@pytest.mark.parametrize("step_name", list(STEPS))
def test_verifying_step_as_decode_rows_equals_prefill(step_name: str, variant_name: str, num_splits: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    query_lens, context_lens = STEPS[step_name]
    variant = VARIANTS[variant_name]
    on_device = len(set(query_lens)) == 1  # lay_out's rows all have k + 1 queries
    query, k_cache, v_cache, starts, table, lens = paged_step(query_lens, context_lens, variant.sliding_window,
                                                              seed=len(query_lens) + num_splits)
    meta = _metadata(query_lens, lens, starts, table, on_device)
    monkeypatch.setattr("gpu.kernels.decode_attention.choose_num_splits", lambda *shape: num_splits)
    monkeypatch.setattr("gpu.attention.triton_backend.prefill_attention", _not_run)
    out = TritonBackend().forward(query, k_cache, v_cache, meta, 0.3, variant)
    expected = prefill_attention(query, k_cache, v_cache, starts, lens, table, 0.3, variant=variant)
    assert out.shape == (sum(query_lens), NUM_HEADS, query.shape[2])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)

