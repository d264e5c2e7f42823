"""The Gated DeltaNet hybrids on the GPU (skip without CUDA).

- The decode kernel (gpu/kernels/gated_delta_decode.py) against the torch reference, in place in its rows' slots.
- The gates and output-norm kernels (gpu/kernels/gated_delta_gates.py, gated_rms_norm.py) and the output gates'
  (sigmoid_gate.py) against the torch code on CUDA, to the ulp; a whole layer's step with the kernels against the
  torch layer.
- The prompt rows' convolution kernel (gpu/kernels/causal_conv_rows.py) against the torch convolution, its conv
  states to the bit, snapshots inside rows and rows shorter than the convolution's window included.
- Prompt rows, a layer at a time, rows continuing their state and rows starting it, snapshots inside rows: the
  kernel that runs them token after token (gpu/kernels/gated_delta_rows.py) against the torch reference and
  flash-linear-attention's chunked kernel (where `fla` is installed), and fla's against the reference.
- float32 with the kernels, slow decays: the rows kernel gives transformers' tokens through snapshots saved inside
  rows and prefix hits that restore them.
- float32: the torch reference path on CUDA (kernels off) gives transformers' tokens (CPU float32) through chunked
  prefill, preemption and prefix hits that restore snapshots.
- bf16 with the kernels: where tokens differ from transformers' bf16 ones, each side's is in the other's top-5,
  rarely (tests/gpu/test_parity_gpu.py's rule), with prefix hits and chunked prefill; decode steps and steps with
  prompts in CUDA graphs (the mixed graphs' padded steps) give the same tokens as with graphs off, which runs the
  same padded steps eagerly (snapshots restored and saved around the replays); a chat's later turn runs its prompt
  step as one replay; two GPUs (TP=2) against one by the same rule.
"""

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers

from core import LLM, GenerationOutput, SamplingParams
from core.config import engine_config
from core.engine import LLMEngine, runner_config
from gpu.attention.metadata import AttentionMetadata, LinearStateMetadata
from gpu.batch import Batch
from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.layers.gated_deltanet import HAS_FLA, DeltaNetSpec, GatedDeltaNet
from gpu.model_runner import ModelRunner
from gpu.state_cache import step_inputs
from tests.gpu.test_parity_gpu import assert_bf16_departs_no_more_than_transformers_over_checkpoints
from tests.greedy_agreement import generate
from tests.hybrid_models import (
    HYBRID_CONFIGS,
    build_hybrid_model,
    use_transformers_torch_delta_rule,
    with_slow_decays,
)
from tests.parity.test_parity_cpu import hf_greedy, prompts_of_lengths
from tests.ulps import ulps

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# The families this transformers has reference classes of (an older one may lack Qwen3.5).
MODELS = tuple(name for name, (_, model_class, _) in HYBRID_CONFIGS.items() if hasattr(transformers, model_class))
SPEC = DeltaNetSpec(hidden_size=64, num_key_heads=2, num_value_heads=4, key_head_dim=32, value_head_dim=64,
                    conv_kernel_size=4, norm_eps=1e-6, has_fused_projections=False)


@pytest.fixture(scope="module")
def hybrid_dirs(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hybrid-models")
    return {name: build_hybrid_model(root / name, name, tiny_model_dirs["qwen3"]) for name in MODELS}


def layer_pair(dtype: torch.dtype, kernels: KernelConfig = DEFAULT_KERNELS) -> tuple[GatedDeltaNet, GatedDeltaNet]:
    """The same random layer with the kernels and with the torch reference, each with its own state of 8 rows (the
    rows' slots and the snapshots' rows)."""
    torch.manual_seed(0)
    layers = []
    for config in (kernels, KernelConfig(fused_kernels=False)):
        layer = GatedDeltaNet(SPEC, config).cuda()
        with torch.no_grad():
            for param in layer.parameters():
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())) * 0.3)
        layer = layer.to(dtype)
        layer.conv_state = torch.randn(8, SPEC.conv_dim, 3, device="cuda", generator=None).to(dtype)
        layer.recurrent_state = torch.randn(8, 4, 32, 64, device="cuda")
        layers.append(layer)
    layers[1].conv_state.copy_(layers[0].conv_state)
    layers[1].recurrent_state.copy_(layers[0].recurrent_state)
    return layers[0], layers[1]


def state_inputs(query_lens: list[int], continues: list[bool], slots: list[int],
                 saves: tuple[tuple[int, int, int], ...] = ()) -> LinearStateMetadata:
    """`saves`: (row, tokens into it, snapshot row) of the states saved inside rows."""
    batch = Batch(token_ids=[0] * sum(query_lens), positions=[0] * sum(query_lens), slot_mapping=[0] * sum(query_lens),
                  query_lens=query_lens, context_lens=[n + c for n, c in zip(query_lens, continues, strict=True)],
                  block_tables=[[0]] * len(query_lens), state_slots=slots, state_saves=list(saves))
    return step_inputs(batch, torch.device("cuda"), 6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernel_matches_the_reference(dtype: torch.dtype) -> None:
    fused, reference = layer_pair(dtype)
    qkv = torch.randn(4, SPEC.conv_dim, device="cuda").to(dtype)
    g, beta = -torch.rand(4, 4, device="cuda"), torch.rand(4, 4, device="cuda").to(dtype)
    state = state_inputs([1] * 4, [True, False, True, True], [5, 0, 3, 1])
    ours, theirs = fused._decode(qkv, g, beta, state), reference._decode(qkv, g, beta, state)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(fused.recurrent_state, reference.recurrent_state, rtol=tolerance, atol=tolerance)



@pytest.mark.parametrize("num_tokens", [1, 7, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_norm_and_gates_kernels_round_as_the_torch_code(dtype: torch.dtype, num_tokens: int) -> None:
    """The compiled kernels call the libdevice functions torch's CUDA kernels call (exp, log1p, rsqrt) and divide as
    they do: beta and g to the ulp; the norm to the bit but where its sum of squares, added in another order, differs
    in its last bit (an output one ulp off, rarely)."""
    from gpu.kernels.gated_delta_gates import gated_delta_gates
    from gpu.kernels.gated_rms_norm import gated_rms_norm

    fused, reference = layer_pair(dtype)
    generator = torch.Generator(device="cuda").manual_seed(num_tokens)
    width = SPEC.conv_dim + SPEC.value_dim + 2 * SPEC.num_value_heads
    projected = (torch.randn(num_tokens, width, device="cuda", generator=generator) * 4).to(dtype)
    _, z, b, a = projected.split([SPEC.conv_dim, SPEC.value_dim, SPEC.num_value_heads, SPEC.num_value_heads], dim=-1)
    g, beta = gated_delta_gates(a, b, fused.A_log, fused.dt_bias)
    expected_g, expected_beta = reference._gates(a, b)
    assert ulps(g, expected_g).max() <= 2 and ulps(beta, expected_beta).max() <= 1
    x = torch.randn(num_tokens, SPEC.num_value_heads, SPEC.value_head_dim, device="cuda", generator=generator)
    gate = z.reshape(num_tokens, SPEC.num_value_heads, SPEC.value_head_dim)
    got = gated_rms_norm(x, gate, fused.norm.weight, SPEC.norm_eps)
    expected = reference.norm(x, gate)
    differ = ulps(got, expected)
    assert differ.max() <= 1 and (differ > 0).float().mean() < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_output_gate_kernel_rounds_as_the_torch_code(dtype: torch.dtype) -> None:
    """The gated attention's and the shared experts' x * sigmoid(gate) (gpu/kernels/sigmoid_gate.py) against torch's
    on CUDA: the same libdevice exp and division, the same two roundings."""
    from gpu.kernels.sigmoid_gate import sigmoid_gate

    generator = torch.Generator(device="cuda").manual_seed(2)
    x = (torch.randn(300, 16, 256, device="cuda", generator=generator) * 3).to(dtype)
    query_gate = (torch.randn(300, 16, 512, device="cuda", generator=generator) * 3).to(dtype)
    per_token = (torch.randn(300, 1, 1, device="cuda", generator=generator) * 3).to(dtype)
    for gate in (query_gate[..., 256:], per_token):
        assert ulps(sigmoid_gate(x, gate), x * torch.sigmoid(gate)).max() <= 1


def layer_inputs(num_tokens: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(num_tokens, SPEC.hidden_size, device="cuda",
                       generator=torch.Generator(device="cuda").manual_seed(num_tokens)).to(dtype)


@pytest.mark.parametrize("rows", [([1] * 4, [True, False, True, True]), ([70, 1, 130, 5], [True, True, False, True])])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layer_with_the_kernels_matches_the_torch_layer(dtype: torch.dtype, rows: tuple[list[int], list[bool]]
                                                        ) -> None:
    """A whole layer's step (projection, gates, convolution, delta rule, norm, out_proj), decode rows and prompt rows:
    with the kernels against the torch code, output and states."""
    from gpu.layers.norm import NormInput, RMSNorm

    fused, reference = layer_pair(dtype)
    query_lens, continues = rows
    slots = [2, 4, 0, 5][: len(query_lens)]
    x = layer_inputs(sum(query_lens), dtype)
    outputs = []
    for layer, kernels in ((fused, DEFAULT_KERNELS), (reference, KernelConfig(fused_kernels=False))):
        norm = RMSNorm(SPEC.hidden_size, SPEC.norm_eps, kernels).cuda().to(dtype)
        meta = AttentionMetadata(torch.empty(0), torch.empty(0), torch.empty(0), torch.empty(0), 0, 0, False,
                                 linear_state=state_inputs(query_lens, continues, slots))
        with torch.no_grad():
            outputs.append(layer(NormInput(norm, x, None), meta)[0].float())
    torch.testing.assert_close(outputs[0], outputs[1], rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(fused.recurrent_state, reference.recurrent_state, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(fused.conv_state, reference.conv_state)


def test_padded_layer_step_matches_the_torch_layer_and_replays_as_it_ran() -> None:
    """A whole layer's step padded as the mixed graphs pad it (gpu/mixed_graphs.py: a token bucket, a row capacity,
    every row through the sequential kernels, padding rows on the padding state row 7): its real tokens and states
    as the torch layer's unpadded step leaves them; captured in a CUDA graph, its replay gives the eager padded
    step's output and states to the bit."""
    from gpu.layers.norm import NormInput, RMSNorm
    from gpu.mixed_graphs import LinearRows, StaticInputs, fill_host_inputs

    dtype, bucket, rows_cap, padding_slot = torch.bfloat16, 256, 8, 7
    fused, reference = layer_pair(dtype)
    query_lens, continues, slots = [70, 1, 130, 5], [True, True, False, True], [2, 4, 0, 5]
    saves = [(0, 48, 1), (2, 16, 3), (2, 100, 6)]
    num_tokens = sum(query_lens)
    batch = Batch(token_ids=[0] * num_tokens, positions=[0] * num_tokens, slot_mapping=[0] * num_tokens,
                  query_lens=query_lens, context_lens=[n + c for n, c in zip(query_lens, continues, strict=True)],
                  block_tables=[[0]] * 4, state_slots=slots, state_saves=saves)
    linear = LinearRows(num_state_slots=6, padding_slot=padding_slot, max_row_tokens=512)
    static = StaticInputs(max_tokens=bucket, max_rows=rows_cap, max_blocks=1, device=torch.device("cuda"),
                          linear=linear)
    int64, int32 = static.int64.cpu().numpy(), static.int32.cpu().numpy()
    num_int64, num_int32 = fill_host_inputs(int64, int32, batch, bucket, rows_cap, 1, linear)
    static.int64[:num_int64].copy_(torch.from_numpy(int64[:num_int64]))
    static.int32[:num_int32].copy_(torch.from_numpy(int32[:num_int32]))
    padded = static.metadata(bucket, rows_cap, max_model_len=256)
    x = layer_inputs(bucket, dtype)
    norms = [RMSNorm(SPEC.hidden_size, SPEC.norm_eps, k).cuda().to(dtype)
             for k in (DEFAULT_KERNELS, KernelConfig(fused_kernels=False))]
    unpadded = AttentionMetadata(torch.empty(0), torch.empty(0), torch.empty(0), torch.empty(0), 0, 0, False,
                                 linear_state=step_inputs(batch, torch.device("cuda"), 6))
    before = fused.conv_state.clone(), fused.recurrent_state.clone()
    with torch.no_grad():
        eager = fused(NormInput(norms[0], x, None), padded)[0].clone()
        expected = reference(NormInput(norms[1], x[:num_tokens], None), unpadded)[0]
        after = fused.conv_state.clone(), fused.recurrent_state.clone()
        real = [row for row in range(8) if row != padding_slot]
        torch.testing.assert_close(eager[:num_tokens].float(), expected.float(), rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(after[1][real], reference.recurrent_state[real], rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(after[0][real], reference.conv_state[real])
        assert torch.equal(after[1][padding_slot], before[1][padding_slot])  # a padding row runs no token

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = fused(NormInput(norms[0], x, None), padded)[0]
        fused.conv_state.copy_(before[0])
        fused.recurrent_state.copy_(before[1])
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed[:num_tokens], eager[:num_tokens])
    assert torch.equal(fused.conv_state, after[0]) and torch.equal(fused.recurrent_state, after[1])


PROMPT_ROWS = ([70, 1, 130, 5], [True, True, False, True], [2, 4, 0, 5])  # query lengths, continues, slots
# Snapshots saved inside rows, into rows no running row's slot is.
INNER_SAVES = [(), ((0, 48, 1), (2, 16, 3), (2, 100, 6))]


def prompt_rows_of(kernels: KernelConfig, dtype: torch.dtype, saves: tuple[tuple[int, int, int], ...]
                   ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """PROMPT_ROWS through `_rows` of the layer with `kernels` and of the torch reference: ((output, state) of the
    kernels' layer, the same of the reference's)."""
    fused, reference = layer_pair(dtype, kernels)
    query_lens, continues, slots = PROMPT_ROWS
    num_tokens = sum(query_lens)
    generator = torch.Generator(device="cuda").manual_seed(1)
    mixed = torch.randn(num_tokens, SPEC.conv_dim, device="cuda", generator=generator).to(dtype)
    g = -torch.rand(num_tokens, 4, device="cuda", generator=generator)
    beta = torch.rand(num_tokens, 4, device="cuda", generator=generator).to(dtype)
    state = state_inputs(query_lens, continues, slots, saves)
    ours, theirs = fused._rows(mixed, g, beta, state), reference._rows(mixed, g, beta, state)
    return (ours.float(), fused.recurrent_state), (theirs, reference.recurrent_state)


# Rows for the convolution: two shorter than its K - 1 = 3 inputs of state (one continuing, one starting), longer ones
# over several token blocks; slots 2, 4, 0, 7, 5, snapshots into rows 1, 3 and 6 (one within a row's first 3 tokens).
CONV_ROWS = ([70, 1, 130, 2, 5], [True, True, False, False, True], [2, 4, 0, 7, 5])
CONV_SAVES = [(), ((0, 48, 1), (2, 16, 3), (2, 100, 6)), ((0, 2, 1), (2, 1, 3), (4, 4, 6))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("saves", CONV_SAVES)
def test_conv_rows_kernel_matches_the_torch_convolution(saves: tuple[tuple[int, int, int], ...], dtype: torch.dtype
                                                        ) -> None:
    """The prompt rows' convolution in one launch (gpu/kernels/causal_conv_rows.py) against the torch code over
    gathered windows: the conv states (copies of inputs) equal to the bit, in the slots and the snapshot rows; the
    outputs within an ulp where the sums, added in another order, round the other way (rarely); float32 within the
    reference convolution's rounding."""
    fused, reference = layer_pair(dtype)
    query_lens, continues, slots = CONV_ROWS
    generator = torch.Generator(device="cuda").manual_seed(3)
    projected = torch.randn(sum(query_lens), SPEC.conv_dim + 9, device="cuda", generator=generator).to(dtype)
    qkv = projected[:, : SPEC.conv_dim]  # a column slice, as the projection's split gives it
    state = state_inputs(query_lens, continues, slots, saves)
    with torch.no_grad():
        ours, theirs = fused._convolved_rows(qkv, state), reference._convolved_rows(qkv, state)
    assert torch.equal(fused.conv_state, reference.conv_state)
    if dtype == torch.float32:
        torch.testing.assert_close(ours, theirs, rtol=2e-3, atol=2e-3)  # cuDNN's float32 may round its inputs (TF32)
        return
    differ = ulps(ours, theirs)
    assert differ.max() <= 1 and (differ > 0).float().mean() < 1e-2


@pytest.mark.skipif(not HAS_FLA, reason="needs flash-linear-attention (fla)")
@pytest.mark.parametrize("saves", INNER_SAVES)
def test_fla_prompt_rows_match_the_reference(saves: tuple[tuple[int, int, int], ...]) -> None:
    chunked_only = KernelConfig(sequential_delta_rule_max_tokens=0)
    (ours, our_state), (theirs, their_state) = prompt_rows_of(chunked_only, torch.bfloat16, saves)
    torch.testing.assert_close(ours, theirs, rtol=3e-2, atol=3e-2)  # fla's in bf16, the torch code's float32
    torch.testing.assert_close(our_state, their_state, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("saves", INNER_SAVES)
def test_rows_kernel_matches_the_reference_and_fla(saves: tuple[tuple[int, int, int], ...], dtype: torch.dtype
                                                   ) -> None:
    """The rows run token after token (the default rule takes them: 130 tokens at most) against the float32 torch
    reference, and against fla's chunked kernel where it is installed, snapshots inside rows included."""
    (ours, our_state), (theirs, their_state) = prompt_rows_of(KernelConfig(), dtype, saves)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2  # float32 math over inputs in `dtype` on both sides
    torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(our_state, their_state, rtol=tolerance, atol=tolerance)
    if HAS_FLA:
        (chunked, chunked_state), _ = prompt_rows_of(KernelConfig(sequential_delta_rule_max_tokens=0), dtype, saves)
        torch.testing.assert_close(ours, chunked, rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(our_state, chunked_state, rtol=3e-2, atol=3e-2)


def test_float32_rows_kernel_gives_transformers_tokens(tiny_model_dirs: dict[str, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny Qwen3.5 with slow decays (a wrong state shows in its tokens), float32 with the kernels on CUDA: prompt
    rows run token after token, snapshots saved inside them, later requests restoring them; transformers' tokens."""
    import gpu.kernels.gated_delta_rows as rows_kernel

    inner_saves: list[int] = []
    original = rows_kernel.gated_delta_rows

    def counted(qkv: torch.Tensor, heads: tuple[int, int, int, int], g: torch.Tensor, beta: torch.Tensor,
                state: torch.Tensor, rows: tuple[torch.Tensor, ...]) -> torch.Tensor:
        inner_saves.append(rows[4].shape[0] - rows[0].shape[0])  # pieces beyond one a row
        return original(qkv, heads, g, beta, state, rows)

    monkeypatch.setattr(rows_kernel, "gated_delta_rows", counted)
    model_dir = with_slow_decays(build_hybrid_model(tmp_path / "qwen3_5", "qwen3_5", tiny_model_dirs["qwen3"]))
    llm = LLM(str(model_dir), dtype="float32", device="cuda", attention_backend="triton", block_size=16,
              kv_cache_blocks=64, max_num_seqs=16, max_num_batched_tokens=40)
    prompts = prompts_of_lengths((9, 7, 30, 17, 60, 4), shared_prefix=37)
    outputs = llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=12))
    outputs += llm.generate(prompts[1:], SamplingParams(temperature=0.0, max_tokens=12))
    assert llm.engine.stats().num_prefix_cache_hit_tokens >= 5 * 32 and max(inner_saves) > 0
    use_transformers_torch_delta_rule()
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.token_ids == hf_greedy(model_dir, prompt)


@pytest.mark.parametrize("model", MODELS)
def test_float32_reference_path_matches_transformers(hybrid_dirs: dict[str, Path], model: str) -> None:
    config = engine_config(str(hybrid_dirs[model]), dtype="float32", device="cuda", attention_backend="triton",
                           block_size=16, kv_cache_blocks=14, max_num_seqs=16, max_num_batched_tokens=40)
    runner = ModelRunner(replace(runner_config(config), kernels=KernelConfig(fused_kernels=False)))
    engine = LLMEngine(config, runner=runner)
    prompts = prompts_of_lengths((1, 7, 16, 17, 40, 100, 3, 64), shared_prefix=20)
    first = generate(engine, prompts[:1], SamplingParams(temperature=0.0, max_tokens=12))
    rest = generate(engine, prompts[1:], SamplingParams(temperature=0.0, max_tokens=12))
    use_transformers_torch_delta_rule()
    for prompt, output in zip(prompts, first + rest, strict=True):
        assert output.token_ids == hf_greedy(hybrid_dirs[model], prompt)
    stats = engine.stats()
    assert stats.num_prefix_cache_hit_tokens > 0 and stats.num_preemptions > 0


@pytest.mark.parametrize("model", MODELS)
def test_graphs_on_give_the_tokens_of_graphs_off(hybrid_dirs: dict[str, Path], model: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The layers' kernels (the gates and the norm among them, counted) captured in the decode graphs."""
    import gpu.kernels.gated_rms_norm as norm_kernel

    norm_launches = []
    original = norm_kernel.gated_rms_norm

    def counted(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        norm_launches.append(torch.cuda.is_current_stream_capturing())
        return original(x, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(norm_kernel, "gated_rms_norm", counted)
    prompts = prompts_of_lengths((1, 7, 17, 40, 100, 3, 64), shared_prefix=20)
    params = SamplingParams(temperature=0.0, max_tokens=24)
    tokens = {}
    for eager in (False, True):
        llm = LLM(str(hybrid_dirs[model]), dtype="bfloat16", device="cuda", attention_backend="triton",
                  enforce_eager=eager, block_size=16, kv_cache_blocks=512, max_num_seqs=16, max_num_batched_tokens=48)
        decode, mixed = llm.engine.runner.decode, llm.engine.runner.mixed
        assert decode is not None and bool(decode.graphs) != eager
        assert mixed is not None and bool(mixed.graphs) != eager  # steps with prompts padded either way
        outputs = llm.generate(prompts[:1], params) + llm.generate(prompts[1:], params)
        assert llm.engine.stats().num_prefix_cache_hit_tokens > 0
        tokens[eager] = [o.token_ids for o in outputs]
    assert tokens[False] == tokens[True]
    assert any(norm_launches) and not all(norm_launches)  # captured in graphs, and run eagerly


def test_a_later_turn_runs_its_prompt_step_as_one_replay(hybrid_dirs: dict[str, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat's later turn (the earlier turn's prompt and answer cached, new tokens after them) on a hybrid MoE: its
    prompt step replays a captured mixed graph, so the host launches none of the linear layers' kernels; a prompt
    row past the sequential delta rule still runs eagerly (flash-linear-attention's chunked kernel, or the torch
    code, builds its indices on the host)."""
    import gpu.kernels.gated_delta_rows as rows_kernel

    model = "qwen3_5_moe" if "qwen3_5_moe" in MODELS else MODELS[-1]
    llm = LLM(str(hybrid_dirs[model]), dtype="bfloat16", device="cuda", attention_backend="triton", block_size=16,
              kv_cache_blocks=512, max_num_seqs=16, max_num_batched_tokens=1024)
    limit = DEFAULT_KERNELS.sequential_delta_rule_max_tokens
    runner = llm.engine.runner
    assert runner.mixed is not None and runner.mixed.graphs
    mixed, original_run = runner.mixed, runner.mixed.run
    steps: list[tuple[tuple[int, int] | None, bool]] = []  # (bucket, whether captured) of each padded step

    def run(batch: Batch, last_sampled_ids: torch.Tensor | None) -> torch.Tensor:
        key = mixed.bucket_for(batch)
        steps.append((key, key in mixed.graphs))
        return original_run(batch, last_sampled_ids)

    rows_launches: list[int] = []
    original_rows = rows_kernel.gated_delta_rows

    def counted(qkv: torch.Tensor, *args: object) -> torch.Tensor:
        rows_launches.append(qkv.shape[0])
        return original_rows(qkv, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(mixed, "run", run)
    monkeypatch.setattr(rows_kernel, "gated_delta_rows", counted)
    params = SamplingParams(temperature=0.0, max_tokens=16)
    first_prompt = prompts_of_lengths((limit + 88,))[0]
    first = llm.generate([first_prompt], params)
    assert not steps, "a prompt row past the sequential delta rule runs eagerly, unpadded"
    later = first_prompt + first[0].token_ids + prompts_of_lengths((40,))[0]
    hits_before = llm.engine.stats().num_prefix_cache_hit_tokens
    llm.generate([later], params)
    assert llm.engine.stats().num_prefix_cache_hit_tokens - hits_before >= limit
    assert steps and all(captured for _, captured in steps), steps
    assert rows_launches == [], "the later turn's prompt step launched the rows kernel from the host"


@pytest.mark.parametrize("tensor_parallel_size", [1, pytest.param(2, marks=pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two GPUs"))])
@pytest.mark.parametrize("model", MODELS)
def test_bf16_departs_from_float32_no_more_than_transformers_bf16(hybrid_dirs: dict[str, Path],
                                                                  tiny_model_dirs: dict[str, Path], model: str,
                                                                  tensor_parallel_size: int, tmp_path: Path) -> None:
    """Counted over three random checkpoints of the family (each bf16 implementation flips its own near ties). Two
    ranks (heads split, partial sums reduced in bf16) are held to the rule one rank is held to."""
    prompts = prompts_of_lengths((1, 7, 16, 17, 40, 100, 3, 64, 150), shared_prefix=20)
    params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=5)
    use_transformers_torch_delta_rule()  # the references: transformers' own rule, float32 and bf16

    def runs() -> Iterator[tuple[Path, list[list[int]], list[GenerationOutput], None]]:
        for seed in range(3):
            model_dir = hybrid_dirs[model] if seed == 0 else build_hybrid_model(
                tmp_path / f"{model}-{seed}", model, tiny_model_dirs["qwen3"], seed=seed)
            llm = LLM(str(model_dir), dtype="bfloat16", device="cuda", attention_backend="triton", block_size=16,
                      kv_cache_blocks=512, max_num_seqs=16, max_num_batched_tokens=48,
                      tensor_parallel_size=tensor_parallel_size)
            try:
                outputs = llm.generate(prompts[:1], params) + llm.generate(prompts[1:], params)
                assert llm.engine.stats().num_prefix_cache_hit_tokens > 0
            finally:
                llm.engine.close()
            yield model_dir, prompts, outputs, None

    assert_bf16_departs_no_more_than_transformers_over_checkpoints(runs())
