"""The gated delta rule's kernels under Triton's interpreter on the CPU, against the torch reference
(gpu/layers/gated_delta_rule.py): the decode kernel (gpu/kernels/gated_delta_decode.py) and the one that runs rows
token after token (gpu/kernels/gated_delta_rows.py), each row's state read from its slot (zeros where the row starts
its sequence) and updated in place, snapshots inside rows holding the state after their tokens, the other rows
untouched; a layer's steps and a tiny hybrid model through them (and the prompt rows' convolution kernel,
gpu/kernels/causal_conv_rows.py) against the torch path and transformers, unpadded and padded as the mixed-step CUDA
graphs pad them (gpu/mixed_graphs.py, run eagerly here as with --enforce-eager).
tests/gpu/test_gated_deltanet_gpu.py checks the compiled kernels on CUDA."""

import os
from pathlib import Path

import pytest
import torch

from gpu.batch import Batch
from gpu.config import KernelConfig
from gpu.layers import gated_delta_rule, gated_deltanet
from gpu.layers.gated_deltanet import GatedDeltaNet
from gpu.mixed_graphs import LinearRows, MixedGraphs, StaticInputs, fill_host_inputs
from gpu.state_cache import allocate, sequential_rows, step_inputs
from tests.unit.test_gated_deltanet_layer import SPEC, make_layer

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from gpu.kernels.gated_delta_decode import gated_delta_decode  # noqa: E402


@pytest.mark.parametrize("heads", [(2, 4, 16, 16), (1, 1, 8, 40)])  # grouped value heads; value columns in blocks
def test_decode_kernel_matches_the_reference(heads: tuple[int, int, int, int]) -> None:
    num_key_heads, num_value_heads, key_dim, value_dim = heads
    generator = torch.Generator().manual_seed(3)
    rows, num_slots = 3, 5
    qkv = torch.randn(rows, 2 * num_key_heads * key_dim + num_value_heads * value_dim, generator=generator)
    g = -torch.rand(rows, num_value_heads, generator=generator)
    beta = torch.rand(rows, num_value_heads, generator=generator)
    state = torch.randn(num_slots, num_value_heads, key_dim, value_dim, generator=generator)
    slots = torch.tensor([4, 0, 2])
    keeps = torch.tensor([1.0, 0.0, 1.0])
    q, k, v = qkv.split([num_key_heads * key_dim, num_key_heads * key_dim, num_value_heads * value_dim], dim=-1)
    expected, expected_state = gated_delta_rule.recurrent(
        q.reshape(rows, num_key_heads, key_dim), k.reshape(rows, num_key_heads, key_dim),
        v.reshape(rows, num_value_heads, value_dim), g, beta, state[slots] * keeps[:, None, None, None])
    before = state.clone()
    out = gated_delta_decode(qkv, heads, g, beta, state, slots, keeps)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[slots], expected_state, rtol=1e-5, atol=1e-5)
    untouched = [1, 3]
    assert torch.equal(state[untouched], before[untouched])


def _reference_rows(qkv: torch.Tensor, heads: tuple[int, int, int, int], g: torch.Tensor, beta: torch.Tensor,
                    state: torch.Tensor, rows: list[tuple[int, int, int, float]]
                    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The torch rule over each (start, end, slot, keeps) row alone: (output, each row's states after 1, 2, ... of
    its tokens)."""
    num_key_heads, num_value_heads, key_dim, value_dim = heads
    q, k, v = qkv.split([num_key_heads * key_dim, num_key_heads * key_dim, num_value_heads * value_dim], dim=-1)
    q, k = q.reshape(-1, num_key_heads, key_dim), k.reshape(-1, num_key_heads, key_dim)
    v = v.reshape(-1, num_value_heads, value_dim)
    outputs, states_along = [], []
    for start, end, slot, keeps in rows:
        current = state[slot : slot + 1] * keeps
        along = []
        for t in range(start, end):
            out, current = gated_delta_rule.recurrent(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1],
                                                      beta[t : t + 1], current)
            outputs.append(out)
            along.append(current[0])
        _, final = gated_delta_rule.chunked(q[start:end], k[start:end], v[start:end], g[start:end],
                                                beta[start:end], state[slot] * keeps)
        torch.testing.assert_close(final, along[-1], rtol=1e-4, atol=1e-4)  # the two torch forms agree
        states_along.append(torch.stack(along))
    return torch.cat(outputs), states_along


@pytest.mark.parametrize("heads", [(2, 4, 16, 16), (1, 2, 8, 20)])  # grouped value heads; a partial column block
def test_rows_kernel_matches_the_reference_with_snapshots_inside_rows(heads: tuple[int, int, int, int]) -> None:
    from gpu.kernels.gated_delta_rows import gated_delta_rows

    num_key_heads, num_value_heads, key_dim, value_dim = heads
    generator = torch.Generator().manual_seed(5)
    lengths, slots, keeps = [1, 3, 17, 40], [4, 0, 2, 1], [1.0, 0.0, 1.0, 0.0]
    # (tokens into the row, snapshot row) where a row's state is saved inside it, by row
    saves = {1: [(1, 6)], 2: [(5, 7), (16, 8)], 3: [(32, 9)]}
    starts = [sum(lengths[:row]) for row in range(5)]
    num_tokens = starts[-1]
    qkv = torch.randn(num_tokens, 2 * num_key_heads * key_dim + num_value_heads * value_dim, generator=generator)
    g = -torch.rand(num_tokens, num_value_heads, generator=generator)
    beta = torch.rand(num_tokens, num_value_heads, generator=generator)
    state = torch.randn(11, num_value_heads, key_dim, value_dim, generator=generator)
    row_pieces = []
    for row in range(4):
        cuts = [(starts[row] + n, snapshot) for n, snapshot in saves.get(row, [])]
        bounds = [starts[row], *(end for end, _ in cuts)]
        row_pieces.append((*((s, e, snapshot) for s, (e, snapshot) in zip(bounds, cuts, strict=False)),
                           (bounds[-1], starts[row + 1], None)))
    pieces = sequential_rows(tuple(row_pieces), slots, torch.device("cpu"))
    expected, along = _reference_rows(qkv, heads, g, beta, state, [
        (starts[r], starts[r + 1], slots[r], keeps[r]) for r in range(4)])
    before = state.clone()
    out = gated_delta_rows(qkv, heads, g, beta, state, (
        torch.tensor(slots), torch.tensor(keeps), pieces.row_starts, pieces.row_pieces, pieces.piece_ends,
        pieces.piece_states))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for row in range(4):
        torch.testing.assert_close(state[slots[row]], along[row][-1], rtol=1e-5, atol=1e-5)
        for num_tokens_in, snapshot in saves.get(row, []):
            torch.testing.assert_close(state[snapshot], along[row][num_tokens_in - 1], rtol=1e-5, atol=1e-5)
    untouched = [3, 5, 10]
    assert torch.equal(state[untouched], before[untouched])


def _layer(kernels: KernelConfig) -> GatedDeltaNet:
    """The same random layer whatever its kernels, with 12 state rows (slots 0-4, the rest snapshots)."""
    return make_layer(kernels, state_rows=12)


def _on_the_triton_paths(patch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Layers with the kernels take their Triton paths on the CPU as on CUDA (the interpreter runs them); returns the
    list each rows-kernel launch appends its (tokens, rows, pieces) to."""
    import gpu.kernels.gated_delta_rows as rows_kernel

    launches = []
    original = rows_kernel.gated_delta_rows

    def counted(qkv: torch.Tensor, heads: tuple[int, int, int, int], g: torch.Tensor, beta: torch.Tensor,
                state: torch.Tensor, rows: tuple[torch.Tensor, ...]) -> torch.Tensor:
        launches.append((qkv.shape[0], rows[0].shape[0], rows[4].shape[0]))
        return original(qkv, heads, g, beta, state, rows)

    patch.setattr(gated_deltanet, "uses_kernels", lambda kernels, x: kernels.fused_kernels)
    patch.setattr(rows_kernel, "gated_delta_rows", counted)
    return launches


def _counted_conv(patch: pytest.MonkeyPatch) -> list[int]:
    """The list each launch of the prompt rows' convolution kernel (gpu/kernels/causal_conv_rows.py) appends its
    tokens to."""
    import gpu.kernels.causal_conv_rows as conv_kernel

    launches = []
    original = conv_kernel.causal_conv_rows

    def counted(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        launches.append(x.shape[0])
        return original(x, *args, **kwargs)  # type: ignore[arg-type]

    patch.setattr(conv_kernel, "causal_conv_rows", counted)
    return launches


def _counted_glue(patch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the launches of the layer's norm and gates kernels (gpu/kernels/gated_rms_norm.py,
    gated_delta_gates.py), by name."""
    import gpu.kernels.gated_delta_gates as gates_kernel
    import gpu.kernels.gated_rms_norm as norm_kernel

    launches = {"gated_rms_norm": 0, "gated_delta_gates": 0}
    for module in (norm_kernel, gates_kernel):
        name = module.__name__.rsplit(".", 1)[1]
        original = getattr(module, name)

        def counted(*args: object, _name: str = name, _original: object = original, **kwargs: object) -> object:
            launches[_name] += 1
            return _original(*args, **kwargs)  # type: ignore[operator]

        patch.setattr(module, name, counted)
    return launches


@pytest.mark.parametrize("max_tokens", [256, 39])  # every row sequential; the 40-token row past the rule: torch's
def test_layer_step_through_the_rows_kernel_matches_the_torch_path(max_tokens: int) -> None:
    """A step of one-token rows and longer ones, rows cut where snapshots are saved: the kernels' layer (the Triton
    paths taken as on CUDA, one rows launch a step where its longest row is within the rule) against the torch one."""
    generator = torch.Generator().manual_seed(4)
    query_lens, continues, slots = [1, 17, 1, 40, 3], [True, False, True, True, False], [3, 0, 4, 1, 2]
    saves = [(1, 5, 6), (3, 16, 7), (3, 32, 8), (4, 1, 9)]  # (row, tokens into it, snapshot row)
    num_tokens = sum(query_lens)
    inputs = (torch.randn(num_tokens, SPEC.conv_dim, generator=generator),
              -torch.rand(num_tokens, 4, generator=generator), torch.rand(num_tokens, 4, generator=generator))
    batch = Batch(token_ids=[0] * num_tokens, positions=[0] * num_tokens, slot_mapping=[0] * num_tokens,
                  query_lens=query_lens, context_lens=[n + c for n, c in zip(query_lens, continues, strict=True)],
                  block_tables=[[0]] * 5, state_slots=slots, state_saves=saves)
    fused = _layer(KernelConfig(sequential_delta_rule_max_tokens=max_tokens))
    reference = _layer(KernelConfig(fused_kernels=False))
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        launches = _on_the_triton_paths(patch)
        conv_launches = _counted_conv(patch)
        got = fused._convolved_rule(*inputs, step_inputs(batch, torch.device("cpu"), 5))
        expected = reference._convolved_rule(*inputs, step_inputs(batch, torch.device("cpu"), 5))
    # the rows of more than one token in one launch: 3 rows in 2 + 3 + 2 pieces
    assert launches == ([(17 + 40 + 3, 3, 7)] if max_tokens == 256 else [])
    assert conv_launches == [17 + 40 + 3]  # the convolution of those rows in one launch, whichever rule runs them
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fused.recurrent_state, reference.recurrent_state, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fused.conv_state, reference.conv_state)


def test_hybrid_model_through_the_kernels_gives_transformers_tokens(tiny_model_dirs: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    """A tiny Qwen3.5 (float32, slow decays) with its linear layers on the Triton paths as on CUDA: prompts prefilled
    in chunks, a snapshot saved inside a row, later requests resuming from it; greedy tokens equal transformers'."""
    from core import LLM
    from tests.hybrid_models import build_hybrid_model, with_slow_decays
    from tests.parity import test_parity_cpu as dense

    model_dir = with_slow_decays(build_hybrid_model(tmp_path / "qwen3_5", "qwen3_5", tiny_model_dirs["qwen3"]))
    prompts = dense.prompts_of_lengths((9, 30, 4), shared_prefix=37)
    with pytest.MonkeyPatch.context() as patch:
        launches = _on_the_triton_paths(patch)
        glue = _counted_glue(patch)
        conv_launches = _counted_conv(patch)
        llm = LLM(str(model_dir), dtype="float32", block_size=16, kv_cache_blocks=64, max_num_seqs=4,
                  max_num_batched_tokens=40)
        outputs = llm.generate(prompts[:1], dense.GREEDY) + llm.generate(prompts[1:], dense.GREEDY)
    assert llm.engine.stats().num_prefix_cache_hit_tokens >= 2 * 32
    assert any(pieces > rows for _, rows, pieces in launches), "a step saved a snapshot inside a row"
    assert glue["gated_rms_norm"] > 0 and glue["gated_delta_gates"] == glue["gated_rms_norm"]
    assert conv_launches, "prompt rows ran their convolution in the kernel"
    dense.assert_matches_hf(model_dir, prompts, outputs)


def test_layer_step_padded_as_the_mixed_graphs_pad_it_matches_the_torch_path() -> None:
    """The same step padded to a token bucket and a row capacity (gpu/mixed_graphs.py's static inputs: every row
    through the sequential kernels, padding rows one empty piece on the padding state row): the real tokens' outputs
    and every state row but the padding one as the torch path's unpadded step leaves them; the padding row's
    recurrent state untouched (the delta rule runs no token of it), its conv state zeros (an empty piece's window)."""
    generator = torch.Generator().manual_seed(5)
    query_lens, continues, slots = [1, 17, 1, 20, 3], [True, False, True, True, False], [3, 0, 4, 1, 2]
    saves = [(1, 5, 6), (3, 16, 7), (3, 19, 8), (4, 1, 9)]  # (row, tokens into it, snapshot row)
    num_tokens, bucket, rows_cap, padding_slot = sum(query_lens), 48, 8, 11
    inputs = (torch.randn(bucket, SPEC.conv_dim, generator=generator),
              -torch.rand(bucket, 4, generator=generator), torch.rand(bucket, 4, generator=generator))
    batch = Batch(token_ids=[0] * num_tokens, positions=[0] * num_tokens, slot_mapping=[0] * num_tokens,
                  query_lens=query_lens, context_lens=[n + c for n, c in zip(query_lens, continues, strict=True)],
                  block_tables=[[0]] * 5, state_slots=slots, state_saves=saves)
    linear = LinearRows(num_state_slots=5, padding_slot=padding_slot, max_row_tokens=256)
    static = StaticInputs(max_tokens=64, max_rows=rows_cap, max_blocks=1, device=torch.device("cpu"), linear=linear)
    int64, int32 = static.int64.numpy().copy(), static.int32.numpy().copy()
    num_int64, num_int32 = fill_host_inputs(int64, int32, batch, bucket, rows_cap, 1, linear)
    static.int64[:num_int64], static.int32[:num_int32] = torch.from_numpy(int64[:num_int64]), torch.from_numpy(
        int32[:num_int32])
    padded_state = static.metadata(bucket, rows_cap, max_model_len=64).linear_state
    assert padded_state is not None
    fused = _layer(KernelConfig(sequential_delta_rule_max_tokens=256))
    reference = _layer(KernelConfig(fused_kernels=False))
    recurrent_before = fused.recurrent_state[padding_slot].clone()
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        launches = _on_the_triton_paths(patch)
        conv_launches = _counted_conv(patch)
        got = fused._convolved_rule(*inputs, padded_state)
        expected = reference._convolved_rule(*(x[:num_tokens] for x in inputs),
                                             step_inputs(batch, torch.device("cpu"), 5))
    assert launches == [(bucket, rows_cap, bucket + rows_cap)] and conv_launches == [bucket]  # the padded sizes
    torch.testing.assert_close(got[:num_tokens], expected, rtol=1e-4, atol=1e-4)
    real = list(range(padding_slot))
    torch.testing.assert_close(fused.recurrent_state[real], reference.recurrent_state[real], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fused.conv_state[real], reference.conv_state[real])
    assert torch.equal(fused.recurrent_state[padding_slot], recurrent_before)
    assert not fused.conv_state[padding_slot].any()


def _padded_mixed_steps(runner: object, max_row_tokens: int) -> list[Batch]:
    """Gives a CPU runner the mixed graphs' padded steps (run eagerly: no graph is captured on a CPU), with a padding
    state row as on CUDA and rows of at most `max_row_tokens` held; returns the list each padded step appends its
    batch to."""
    c = runner.config
    padding_slot = runner.stacked_states.conv.shape[1]
    runner.stacked_states = allocate(runner.linear_layers, padding_slot + 1, runner.dtype, runner.device)
    mixed = MixedGraphs(runner.model, c.max_num_batched_tokens, c.max_num_seqs, c.max_model_len, c.block_size,
                        runner.device, len(runner.kv_cache_groups),
                        LinearRows(runner.num_state_slots, padding_slot, max_row_tokens))
    padded = []
    original = mixed.run

    def run(batch: Batch, last_sampled_ids: torch.Tensor | None) -> torch.Tensor:
        padded.append(batch)
        return original(batch, last_sampled_ids)

    mixed.run = run  # type: ignore[method-assign]
    runner.mixed = mixed
    return padded


@pytest.mark.parametrize("max_row_tokens", [32, 512])  # a prompt's first chunk past it (run unpadded); every step
def test_hybrid_moe_model_in_padded_mixed_steps_gives_transformers_tokens(tiny_model_dirs: dict[str, Path],
                                                                          tmp_path: Path, max_row_tokens: int) -> None:
    """A tiny Qwen3.5-MoE whose steps with prompts run padded as in the mixed graphs (gpu/mixed_graphs.py): prompts
    prefilled in chunks, decode rows beside prompt rows, a snapshot saved inside a row, later requests resuming from
    it (a later turn's cached prompt); greedy tokens equal transformers'."""
    from core import LLM
    from tests.hybrid_models import build_hybrid_model, with_slow_decays
    from tests.parity import test_parity_cpu as dense

    model_dir = with_slow_decays(build_hybrid_model(tmp_path / "qwen3_5_moe", "qwen3_5_moe",
                                                    tiny_model_dirs["qwen3"]))
    prompts = dense.prompts_of_lengths((9, 30, 4), shared_prefix=37)
    with pytest.MonkeyPatch.context() as patch:
        launches = _on_the_triton_paths(patch)
        llm = LLM(str(model_dir), dtype="float32", block_size=16, kv_cache_blocks=64, max_num_seqs=4,
                  max_num_batched_tokens=40)
        padded = _padded_mixed_steps(llm.engine.runner, max_row_tokens)
        launches.clear()  # the runner's warm-up steps ran before
        outputs = llm.generate(prompts[:1], dense.GREEDY) + llm.generate(prompts[1:], dense.GREEDY)
    assert llm.engine.stats().num_prefix_cache_hit_tokens >= 2 * 32
    assert any(batch.context_lens[r] > batch.query_lens[r] > 1 for batch in padded for r in range(batch.num_rows)), \
        "a padded step continued a prompt from a cached prefix or an earlier chunk"
    assert any(min(batch.query_lens) == 1 < max(batch.query_lens) for batch in padded), "decode rows beside prompts"
    num_unpadded = sum(rows < 4 for _, rows, _ in launches)  # the padded steps' launches have the row capacity, 4
    if max_row_tokens == 512:
        assert num_unpadded == 0, "every step with prompts padded"
        assert any(n < batch.query_lens[r] for batch in padded for r, n, _ in batch.state_saves), \
            "a padded step saved a snapshot inside a row"
    else:
        assert num_unpadded > 0, "the first chunk (40 tokens) ran unpadded"
    dense.assert_matches_hf(model_dir, prompts, outputs)
