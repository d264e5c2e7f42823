"""Decode steps as C kernel calls per layer (gpu/cpu_decode.py) against the model's own layers, which call the same
kernels through the modules: the same hidden states to the bit, and the same cache writes, for Llama, Qwen2 (q/k/v
biases), Qwen3 (q/k norms), Mistral with and without a window, and Gemma 3 (its norms, GELU, windowed and full
layers in two KV-cache groups; to float32 rounding, its output norms computed apart), whose projections lie on a Q4_1
grid; and where the decode steps are not built (a switch off, weights on no grid, a family's feature they do not
take), why."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from core import LLM, SamplingParams
from core.config import engine_config
from core.engine import runner_config
from gpu.batch import Batch, GroupTables, RowSampling
from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.cpu_kernels import load_cpu_kernels
from gpu.model_runner import ModelRunner
from tests.unit.test_cpu_linear import q4_1_round_trip, q8_0_round_trip

pytestmark = pytest.mark.skipif(load_cpu_kernels(None).int8_dot is None or load_cpu_kernels(None).attention is None,
                                reason="the C kernels are not built here")

BLOCK_SIZE = 16


def on_gguf_grids(source: Path, target: Path) -> Path:
    """A copy of a checkpoint with its projections as a Q4_1 GGUF gives them back, its embedding and LM head as Q8_0
    ones do, and biases and norms that are not zeros and ones (as a model's initialization leaves them)."""
    target.mkdir()
    for path in source.iterdir():
        if path.suffix != ".safetensors":
            (target / path.name).write_bytes(path.read_bytes())
    tensors = load_file(source / "model.safetensors")
    for name, tensor in tensors.items():
        if name.endswith("_proj.weight"):
            tensors[name] = q4_1_round_trip(tensor)
        elif name in ("lm_head.weight", "model.embed_tokens.weight"):
            tensors[name] = q8_0_round_trip(tensor)
        elif name.endswith(("_proj.bias", "norm.weight")):
            generator = torch.Generator().manual_seed(len(name))
            tensors[name] = tensor + 0.1 * torch.randn(tensor.shape, generator=generator)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


@pytest.fixture(scope="module")
def grid_dirs(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("on-grids")
    return {name: on_gguf_grids(path, root / name) for name, path in tiny_model_dirs.items()}


def runner(model_dir: Path, dtype: str, kernels: KernelConfig = DEFAULT_KERNELS) -> ModelRunner:
    config = runner_config(engine_config(str(model_dir), device="cpu", dtype=dtype, kv_cache_blocks=16,
                                         block_size=BLOCK_SIZE, max_num_seqs=4))
    return ModelRunner(replace(config, kernels=kernels))


def prefill_then_decode(prompts: list[list[int]], num_groups: int = 1) -> tuple[Batch, Batch]:
    """A step prefilling each prompt into its own blocks, then one decoding a token for every row; each KV-cache group
    of `num_groups` (a model with windowed and full layers has two) in blocks of its own numbers."""
    tables = [[[2 * row + 7 * g, 2 * row + 1 + 7 * g] for row in range(len(prompts))] for g in range(num_groups)]

    def slots(positions: list[list[int]], g: int) -> list[int]:
        return [tables[g][row][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for row, ps in enumerate(positions)
                for p in ps]

    def batch(tokens: list[list[int]], positions: list[list[int]]) -> Batch:
        return Batch(token_ids=[t for ts in tokens for t in ts], positions=[p for ps in positions for p in ps],
                     slot_mapping=slots(positions, 0), query_lens=[len(ps) for ps in positions],
                     context_lens=[ps[-1] + 1 for ps in positions], block_tables=tables[0],
                     sampling=[RowSampling(temperature=0.0)] * len(prompts),
                     other_groups=[GroupTables(slots(positions, g), tables[g]) for g in range(1, num_groups)])

    return (batch(prompts, [list(range(len(p))) for p in prompts]),
            batch([[7 + row] for row in range(len(prompts))], [[len(p)] for p in prompts]))


# auto: float32 for these float32 checkpoints on a grid (float32 asked for by name is the unpacked reference).
@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
@pytest.mark.parametrize("model", ["llama", "qwen2", "qwen3", "mistral_full", "mistral", "gemma3"])
@pytest.mark.parametrize("num_rows", [1, 3])
def test_decode_steps_equal_the_models_layers(grid_dirs: dict[str, Path], model: str, dtype: str,
                                              num_rows: int) -> None:
    r = runner(grid_dirs[model], dtype)
    assert r.dtype == (torch.float32 if dtype == "auto" else torch.bfloat16) and r.cpu_decode is not None
    prompts = [list(range(5 + row, 25 + 3 * row)) for row in range(num_rows)]  # past gemma3's window of 16
    prefill, decode = prefill_then_decode(prompts, 1 + max(layer.self_attn.kv_group for layer in r.model.model.layers))
    r.execute(prefill)
    input_ids, positions, meta = r._prepare(decode)
    with torch.inference_mode():
        by_layers = r.model(input_ids, positions, meta)
        caches = [(layer.k_cache.clone(), layer.v_cache.clone()) for layer in r.layers]
        for layer in r.layers:  # what the decode step writes is written again, from nothing
            for cache in (layer.k_cache, layer.v_cache):
                cache.view(-1, *cache.shape[2:])[meta.slot_mapping] = 0
        by_steps = r.cpu_decode.run(input_ids, positions, meta)
    if model == "gemma3":  # its layers norm each block's output in torch code, the steps in the next prologue
        def same(a: torch.Tensor, b: torch.Tensor) -> None:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-4 * b.abs().max().item())
    else:
        def same(a: torch.Tensor, b: torch.Tensor) -> None:
            assert torch.equal(a, b)
    same(by_steps, by_layers)
    for layer, (k_cache, v_cache) in zip(r.layers, caches, strict=True):
        same(layer.k_cache, k_cache)
        same(layer.v_cache, v_cache)


def verifying_step(prompts: list[list[int]], num_queries: list[int]) -> Batch:
    """After `prefill_then_decode`'s prefill, a verifying step: each row's next `num_queries[row]` tokens (its bonus
    token and drafts), across a block edge where the prompt ends near one."""
    tables = [[2 * row, 2 * row + 1] for row in range(len(prompts))]
    positions = [[len(p) + i for i in range(n)] for p, n in zip(prompts, num_queries, strict=True)]
    return Batch(token_ids=[9 + i for n in num_queries for i in range(n)],
                 positions=[q for row in positions for q in row],
                 slot_mapping=[tables[row][q // BLOCK_SIZE] * BLOCK_SIZE + q % BLOCK_SIZE
                               for row, qs in enumerate(positions) for q in qs],
                 query_lens=num_queries, context_lens=[len(p) + n for p, n in zip(prompts, num_queries, strict=True)],
                 block_tables=tables, sampling=[RowSampling(temperature=0.0)] * len(prompts),
                 num_draft_tokens=[n - 1 for n in num_queries])


@pytest.mark.parametrize("num_queries", [[5], [3, 1, 4]])
def test_a_verifying_steps_queries_run_as_decode_rows(grid_dirs: dict[str, Path], num_queries: list[int]) -> None:
    """A verifying step (rows of a few queries) runs its queries as decode rows, one a query: each query's hidden
    state is, to the bit, a decode step's of that token once the tokens before it are in the cache (the keys after
    it in the step unseen), so verifying gives the tokens decoding one at a time would (the model's layers, on
    several tokens a row, multiply on other kernels)."""
    r = runner(grid_dirs["qwen3"], "auto")
    prompts = [list(range(3 + row, 17 + 2 * row)) for row in range(len(num_queries))]  # 14.. tokens: a block edge
    prefill, _ = prefill_then_decode(prompts)
    r.execute(prefill)
    step = verifying_step(prompts, num_queries)
    input_ids, positions, meta = r._prepare(step)
    assert meta.query_rows is not None
    with torch.inference_mode():
        by_rows = r.cpu_decode.run_queries(input_ids, positions, meta)  # type: ignore[union-attr]
        token = 0
        for row, prompt in enumerate(prompts):
            for i in range(num_queries[row]):
                one = replace(step, token_ids=[step.token_ids[token]], positions=[step.positions[token]],
                              slot_mapping=[-1], query_lens=[1], context_lens=[len(prompt) + i + 1],
                              block_tables=[step.block_tables[row]], sampling=[RowSampling(temperature=0.0)],
                              num_draft_tokens=None)
                alone = r.cpu_decode.run(*r._prepare(one))  # type: ignore[union-attr]
                assert torch.equal(alone[0], by_rows[token]), (row, i)
                token += 1


@pytest.mark.parametrize("on_device", [True, False])
def test_speculative_decoding_on_the_decode_steps_gives_the_same_greedy_tokens(grid_dirs: dict[str, Path],
                                                                               on_device: bool) -> None:
    """Drafts verified on the packed path (laid out on the device or by the host): the greedy tokens of decoding
    without them, on text that repeats (drafts are accepted) and text that does not."""
    settings = dict(device="cpu", dtype="auto", max_model_len=256, block_size=BLOCK_SIZE, kv_cache_blocks=64,
                    max_num_seqs=4)
    prompts = [[5, 6, 7, 8, 9] * 6, list(range(40, 70))]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = LLM(str(grid_dirs["qwen3"]), **settings)
    assert plain.engine.runner.cpu_decode is not None  # type: ignore[attr-defined]
    expected = [o.token_ids for o in plain.generate(prompts, params)]
    config = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False, "verify_on_device": on_device}
    speculating = LLM(str(grid_dirs["qwen3"]), speculative_config=config, **settings)
    steps = speculating.engine.runner.cpu_decode  # type: ignore[attr-defined]
    run_queries, calls = steps.run_queries, []
    steps.run_queries = lambda *args: calls.append(1) or run_queries(*args)
    assert [o.token_ids for o in speculating.generate(prompts, params)] == expected
    counts = speculating.engine.speculation.counts  # type: ignore[union-attr]
    assert len(calls) > 10 and counts.num_draft_tokens > 40 and counts.num_accepted_tokens > 0


@pytest.mark.parametrize("kernels", [KernelConfig(cpu_packed_weights=False), KernelConfig(fused_kernels=False)],
                         ids=["unpacked", "no fused kernels"])
def test_no_decode_steps_where_a_switch_is_off(grid_dirs: dict[str, Path], kernels: KernelConfig,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    assert runner(grid_dirs["llama"], "auto", kernels).cpu_decode is None
    assert "CPU decode steps: the model's layers" in caplog.text


def test_no_decode_steps_for_weights_on_no_grid(tiny_model_dirs: dict[str, Path],
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    assert runner(tiny_model_dirs["llama"], "auto").cpu_decode is None
    assert "a projection is not packed" in caplog.text


# Each family's feature the steps leave to the model's layers: a partial rotation (Phi-3), Gemma 4's blocks (shared
# KV, per-layer inputs).
@pytest.mark.parametrize(("model", "reason"), [("phi3", "plain or windowed attention"),
                                               ("gemma4", "Llama-family and Gemma 3 decoders")])
def test_no_decode_steps_for_a_feature_they_do_not_take(grid_dirs: dict[str, Path], model: str, reason: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    assert runner(grid_dirs[model], "auto").cpu_decode is None
    assert reason in caplog.text


def test_float32_asked_for_by_name_is_the_unpacked_reference(grid_dirs: dict[str, Path],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    r = runner(grid_dirs["llama"], "float32")
    assert r.cpu_decode is None and all(m.packed is None for m in r.model.modules() if hasattr(m, "packed"))
    assert "CPU linear kernels: none: float32 asked for by name is the reference" in caplog.text
