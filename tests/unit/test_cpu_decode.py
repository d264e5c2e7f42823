"""Decode steps as C kernel calls per layer (gpu/cpu_decode.py) against the model's own layers, which call the same
kernels through the modules: the same hidden states to the bit, and the same cache writes, for Llama, Qwen2 (q/k/v
biases), Qwen3 (q/k norms) and Mistral without a window, whose projections lie on a Q4_1 grid; and where the decode
steps are not built (a switch off, weights on no grid, a family's feature they do not take), why."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from core.config import engine_config
from core.engine import runner_config
from gpu.batch import Batch, RowSampling
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


def prefill_then_decode(prompts: list[list[int]]) -> tuple[Batch, Batch]:
    """A step prefilling each prompt into its own blocks, then one decoding a token for every row."""
    tables = [[2 * row, 2 * row + 1] for row in range(len(prompts))]
    slots = [tables[row][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for row, prompt in enumerate(prompts)
             for p in range(len(prompt))]
    prefill = Batch(token_ids=[t for p in prompts for t in p], positions=[i for p in prompts for i in range(len(p))],
                    slot_mapping=slots, query_lens=[len(p) for p in prompts], context_lens=[len(p) for p in prompts],
                    block_tables=tables, sampling=[RowSampling(temperature=0.0)] * len(prompts))
    decode = Batch(token_ids=[7 + row for row in range(len(prompts))], positions=[len(p) for p in prompts],
                   slot_mapping=[tables[row][len(p) // BLOCK_SIZE] * BLOCK_SIZE + len(p) % BLOCK_SIZE
                                 for row, p in enumerate(prompts)],
                   query_lens=[1] * len(prompts), context_lens=[len(p) + 1 for p in prompts], block_tables=tables,
                   sampling=[RowSampling(temperature=0.0)] * len(prompts))
    return prefill, decode


# auto: float32 for these float32 checkpoints on a grid (float32 asked for by name is the unpacked reference).
@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
@pytest.mark.parametrize("model", ["llama", "qwen2", "qwen3", "mistral_full"])
@pytest.mark.parametrize("num_rows", [1, 3])
def test_decode_steps_equal_the_models_layers(grid_dirs: dict[str, Path], model: str, dtype: str,
                                              num_rows: int) -> None:
    r = runner(grid_dirs[model], dtype)
    assert r.dtype == (torch.float32 if dtype == "auto" else torch.bfloat16) and r.cpu_decode is not None
    prompts = [list(range(5 + row, 25 + 3 * row)) for row in range(num_rows)]
    prefill, decode = prefill_then_decode(prompts)
    r.execute(prefill)
    input_ids, positions, meta = r._prepare(decode)
    with torch.inference_mode():
        by_layers = r.model(input_ids, positions, meta)
        caches = [(layer.k_cache.clone(), layer.v_cache.clone()) for layer in r.layers]
        for layer in r.layers:  # what the decode step writes is written again, from nothing
            for cache in (layer.k_cache, layer.v_cache):
                cache.view(-1, *cache.shape[2:])[meta.slot_mapping] = 0
        by_steps = r.cpu_decode.run(input_ids, positions, meta)
    assert torch.equal(by_steps, by_layers)
    for layer, (k_cache, v_cache) in zip(r.layers, caches, strict=True):
        assert torch.equal(layer.k_cache, k_cache) and torch.equal(layer.v_cache, v_cache)


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


# Each family's feature the steps leave to the model's layers: a sliding window (Mistral), a partial rotation and a
# window (Phi-3), Gemma's blocks (their norms, windows and soft-caps; Gemma 4's shared KV).
@pytest.mark.parametrize(("model", "reason"), [("mistral", "plain attention"), ("phi3", "plain attention"),
                                               ("gemma3", "Llama-family decoder"),
                                               ("gemma4", "Llama-family decoder")])
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
