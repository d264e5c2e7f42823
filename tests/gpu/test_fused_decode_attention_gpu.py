"""The fused decode attention (gpu/kernels/fused_decode_attention.py) on CUDA against the two launches it replaces,
qk_norm_rope_store_kv then decode_attention: eager with and without PDL at served head shapes, the variants and an FP8
cache; captured in a CUDA graph behind a PDL kernel that writes qkv, replayed with new positions, lengths and qkv and
the own tokens' slots poisoned with NaN before each replay; and whole tiny Qwen3 / Qwen3-MoE models, whose decode
steps take the fused path on the Triton backend, against the same models with the two launches.

The two sides agree to the bit but where a float32 sum of squares (a head's norm) is reduced in another order in the
two kernels, which can move a bf16/fp16 rounding by one unit on rare elements (and in float32, where this kernel may
contract a product and a sum into an FMA that qk_norm_rope, built without, does not); so the caches are compared by
the share of differing elements and the outputs with a tolerance (tests/unit/fused_decode_attention_interpreted_cases.py
checks exact equality under the interpreter)."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels need CUDA", allow_module_level=True)

from core.config import engine_config  # noqa: E402
from core.engine import runner_config  # noqa: E402
from core.tiny_model import TinyModelSpec, build_tiny_model  # noqa: E402
from gpu.attention import triton_backend  # noqa: E402
from gpu.attention.qkv_heads import QkvHeads  # noqa: E402
from gpu.attention.variant import PLAIN, AttentionVariant  # noqa: E402
from gpu.kernels.decode_attention import decode_attention  # noqa: E402
from gpu.kernels.fused_decode_attention import fused_decode_attention  # noqa: E402
from gpu.kernels.qk_norm_rope import qk_norm_rope_store_kv  # noqa: E402
from gpu.kernels.rms_norm import rms_norm  # noqa: E402
from gpu.model_runner import ModelRunner  # noqa: E402
from tests.gpu.graph_capture import captured  # noqa: E402
from tests.gpu.test_fused_kernels import compare, prefill_then_decode_logits  # noqa: E402
from tests.moe_models import build_moe_model  # noqa: E402

DEVICE = torch.device("cuda")
BLOCK_SIZE, MAX_POSITION = 16, 8192
TOLERANCES = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}
MAX_DIFFERING = 0.001  # share of cache elements allowed to differ (rounding-boundary flips only)
# (num_heads, num_kv_heads, head_dim): Qwen3-30B-A3B, Qwen3-8B, a group of 8 at head_dim 64.
HEADS = [(32, 4, 128), (32, 8, 128), (8, 1, 64)]
# One long row; rows of several lengths with a padding row; own tokens either side of block and tile edges.
LENS = [[1088], [1088, 37, 1, 4096, 0], [64, 65, 16, 17]]


def paged_rows(lens: list[int], num_kv_heads: int, head_dim: int, cache_dtype: torch.dtype,
               width: int = MAX_POSITION // BLOCK_SIZE) -> tuple[torch.Tensor, ...]:
    """(k_cache, v_cache, block_tables, context_lens, positions, slots): shuffled blocks, a table as wide as a decode
    graph's, each row's own token at its last position (slot -1 for a padding row of length 0)."""
    rows = len(lens)
    shape = (rows * width, BLOCK_SIZE, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(2, *shape, device=DEVICE).to(cache_dtype).unbind(0)
    tables = torch.randperm(rows * width, device=DEVICE, dtype=torch.int32).view(rows, width).contiguous()
    context_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    positions, slots = own_slots(tables, context_lens)
    return k_cache, v_cache, tables, context_lens, positions, slots


def own_slots(tables: torch.Tensor, context_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    positions = (context_lens.to(torch.int64) - 1).clamp_min(0)
    blocks = tables.gather(1, (positions // BLOCK_SIZE)[:, None]).view(-1).to(torch.int64)
    return positions, torch.where(context_lens > 0, blocks * BLOCK_SIZE + positions % BLOCK_SIZE, -1)


def layout_of(heads: tuple[int, int, int], dtype: torch.dtype, has_norm: bool = True, rotary_dim: int | None = None,
              **options: object) -> QkvHeads:
    head_dim = heads[2]
    angles = torch.arange(MAX_POSITION, device=DEVICE)[:, None] * torch.rand((rotary_dim or head_dim) // 2,
                                                                             device=DEVICE)[None, :]
    rotary = (angles.cos().repeat(1, 2).contiguous(), angles.sin().repeat(1, 2).contiguous())
    norms = tuple((1 + 0.5 * torch.randn(2, head_dim, device=DEVICE)).to(dtype)) if has_norm else None
    return QkvHeads(heads, rotary, norms, **options)


def random_qkv(layout: QkvHeads, rows: int, dtype: torch.dtype) -> torch.Tensor:
    num_heads, num_kv_heads, head_dim = layout.heads
    width = ((2 if layout.has_output_gate else 1) * num_heads + 2 * num_kv_heads) * head_dim
    return (2 * torch.randn(rows, width, device=DEVICE)).to(dtype)


def two_launches(qkv: torch.Tensor, positions: torch.Tensor, layout: QkvHeads, kv_cache: tuple[torch.Tensor, ...],
                 paged: tuple[torch.Tensor, torch.Tensor], variant: AttentionVariant = PLAIN,
                 use_pdl: bool = False) -> torch.Tensor:
    q = qk_norm_rope_store_kv(qkv, positions, layout.rotary, layout.heads, layout.norm_weights, layout.eps, kv_cache,
                              use_pdl, layout.norm_convention, layout.kv_scales, layout.has_output_gate)
    return decode_attention(q, kv_cache[0], kv_cache[1], *paged, 0.088, use_pdl=use_pdl, variant=variant)


def assert_caches_agree(cache: torch.Tensor, expected: torch.Tensor, label: str) -> None:
    """Equal but for rare rounding flips; in float32 (no rounding to a narrower type after the rotation's products,
    which this kernel may contract into FMAs and qk_norm_rope does not) within a few ulps."""
    differing = (cache.float() != expected.float()).float().mean().item()
    print(f"{label}: {differing:.4%} of cache elements differ")
    if cache.dtype == torch.float32:
        torch.testing.assert_close(cache, expected, atol=1e-5, rtol=1e-5)
        return
    assert differing <= MAX_DIFFERING, f"{label}: {differing:.4%} of cache elements differ"
    if cache.dtype != torch.float8_e4m3fn:
        tol = TOLERANCES[cache.dtype]
        torch.testing.assert_close(cache.float(), expected.float(), atol=tol, rtol=tol)


def assert_outputs_agree(out: torch.Tensor, expected: torch.Tensor, label: str) -> None:
    assert not out.isnan().any(), f"{label}: NaN in the output"
    diff = (out.float() - expected.float()).abs()
    print(f"{label}: max_abs_err={diff.max().item():.2e} differing={(diff > 0).float().mean().item():.2%}")
    tol = TOLERANCES[out.dtype]
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)


def run_both(layout: QkvHeads, lens: list[int], dtype: torch.dtype, cache_dtype: torch.dtype | None = None,
             variant: AttentionVariant = PLAIN, use_pdl: bool = False) -> None:
    """Both paths on the same inputs and copies of one cache: outputs and caches agree."""
    num_heads, num_kv_heads, head_dim = layout.heads
    k_cache, v_cache, tables, lens_t, positions, slots = paged_rows(lens, num_kv_heads, head_dim, cache_dtype or dtype)
    qkv = random_qkv(layout, len(lens), dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected = two_launches(qkv, positions, layout, (expected_k, expected_v, slots), (tables, lens_t), variant,
                            use_pdl)
    out = fused_decode_attention(qkv, positions, layout, (k_cache, v_cache, slots), (tables, lens_t, None), 0.088,
                                 variant, use_pdl=use_pdl)
    label = f"{layout.heads} {lens} {dtype}"
    assert_caches_agree(k_cache, expected_k, f"{label} keys")
    assert torch.equal(v_cache.view(torch.uint8), expected_v.view(torch.uint8)), f"{label}: values differ"
    assert_outputs_agree(out, expected, label)
    padding = lens_t == 0
    assert torch.equal(out[padding], torch.zeros_like(out[padding]))


@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("lens", LENS, ids=str)
@pytest.mark.parametrize("use_pdl", [False, True])
def test_fused_equals_two_launches(heads: tuple[int, int, int], lens: list[int], use_pdl: bool) -> None:
    run_both(layout_of(heads, torch.bfloat16), lens, torch.bfloat16, use_pdl=use_pdl)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_other_dtypes(dtype: torch.dtype) -> None:
    run_both(layout_of(HEADS[0], dtype), LENS[1], dtype)


def test_llama_rows_without_norms() -> None:
    run_both(layout_of(HEADS[1], torch.bfloat16, has_norm=False), LENS[1], torch.bfloat16, use_pdl=True)


@pytest.mark.parametrize("lens", LENS[:2], ids=str)
def test_window_sinks_and_softcap(lens: list[int]) -> None:
    variant = AttentionVariant(sliding_window=100, sinks=torch.randn(32, device=DEVICE), softcap=30.0)
    run_both(layout_of(HEADS[0], torch.bfloat16), lens, torch.bfloat16, variant=variant, use_pdl=True)


def test_fp8_cache_with_its_scales() -> None:
    layout = layout_of(HEADS[0], torch.bfloat16, kv_scales=(0.5, 0.25))
    run_both(layout, LENS[1], torch.bfloat16, cache_dtype=torch.float8_e4m3fn, use_pdl=True)


def test_partial_rotation_gates_and_gemmas_norm_convention() -> None:
    layout = layout_of((16, 2, 128), torch.bfloat16, rotary_dim=32, norm_convention=(1.0, True),
                       has_output_gate=True)
    run_both(layout, LENS[1], torch.bfloat16, use_pdl=True)


@pytest.mark.parametrize("lens", [[1088], [1088, 37, 1, 4096]], ids=str)
def test_graph_replays_with_new_positions_behind_a_pdl_writer_of_qkv(lens: list[int]) -> None:
    """Captured: a PDL kernel writing qkv (an RMSNorm), then the fused kernel with PDL, which reads its first tiles
    before waiting on that kernel, and must read qkv only after. Between replays qkv's source, the lengths, the
    positions and the slots change in place and the own slots are poisoned with NaN. Each replay's output equals an
    eager fused launch's bit for bit and agrees with the two launches."""
    dtype, layout = torch.bfloat16, layout_of(HEADS[0], torch.bfloat16)
    num_heads, num_kv_heads, head_dim = layout.heads
    k_cache, v_cache, tables, context_lens, positions, slots = paged_rows(lens, num_kv_heads, head_dim, dtype)
    x = random_qkv(layout, len(lens), dtype)
    weight = torch.ones(x.shape[1], device=DEVICE, dtype=dtype)

    def step() -> torch.Tensor:
        qkv, _ = rms_norm(x, weight, 1e-6, use_pdl=True)
        return fused_decode_attention(qkv, positions, layout, (k_cache, v_cache, slots), (tables, context_lens, None),
                                      0.088, use_pdl=True)

    graph, static_out = captured(step)
    generator = torch.Generator().manual_seed(0)
    for replay in range(12):
        x.copy_(random_qkv(layout, len(lens), dtype))
        new_lens = [max(1, n - int(torch.randint(0, 40, (1,), generator=generator))) for n in lens]
        context_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        new_positions, new_slots = own_slots(tables, context_lens)
        positions.copy_(new_positions)
        slots.copy_(new_slots)
        k_cache.view(-1, num_kv_heads, head_dim)[slots] = float("nan")
        v_cache.view(-1, num_kv_heads, head_dim)[slots] = float("nan")
        graph.replay()
        assert not static_out.isnan().any(), f"replay {replay}: a poisoned own token was read"
        replayed_k = k_cache.clone()
        qkv, _ = rms_norm(x, weight, 1e-6)
        assert torch.equal(static_out, fused_decode_attention(
            qkv, positions, layout, (k_cache, v_cache, slots), (tables, context_lens, None), 0.088)), f"{replay}"
        expected_k, expected_v = k_cache.clone(), v_cache.clone()
        expected = two_launches(qkv, positions, layout, (expected_k, expected_v, slots), (tables, context_lens))
        assert_caches_agree(replayed_k, expected_k, f"replay {replay} keys")
        assert_outputs_agree(static_out, expected, f"replay {replay} {new_lens}")


# Whole models: decode steps through the fused path against the two launches, same weights, same backend.

@pytest.fixture(scope="module")
def model_dirs(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fused-decode-models")
    d128 = TinyModelSpec(architecture="qwen3", hidden_size=256, num_heads=8, num_kv_heads=2, head_dim=128,
                         intermediate_size=512, num_layers=3)
    d256 = TinyModelSpec(architecture="qwen3", hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=256,
                         intermediate_size=512, num_layers=2)
    return {"qwen3": tiny_model_dirs["qwen3"], "qwen3-d128": build_tiny_model(root / "qwen3-d128", d128),
            "qwen3-d256": build_tiny_model(root / "qwen3-d256", d256),
            "qwen3_moe": build_moe_model(root / "qwen3_moe", "qwen3_moe", tiny_model_dirs["qwen3"])}


def decode_logits(model_dir: Path, fused: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, int]:
    """(logits of a 300-token prefill and one decode step, fused decode launches made); `fused` False: the Triton
    backend as one that cannot take qkv, so the layers launch the two kernels."""
    calls = []

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return fused_decode_attention(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(triton_backend, "fused_decode_attention", counted)
        patch.setattr(triton_backend.TritonBackend, "decodes_from_qkv", fused)
        runner = ModelRunner(runner_config(engine_config(
            str(model_dir), dtype="float32", device="cuda", kv_cache_blocks=64, max_num_seqs=4, max_model_len=512,
            enforce_eager=True, attention_backend="triton")))
        calls.clear()  # start-up's own passes
        with torch.inference_mode():
            return prefill_then_decode_logits(runner, prompt_len=300), len(calls)


@pytest.mark.parametrize("model", ["qwen3", "qwen3-d128", "qwen3_moe"])
def test_model_decode_through_the_fused_kernel(model_dirs: dict[str, Path], model: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (fused, num_fused), (two, num_two) = (decode_logits(model_dirs[model], is_fused, monkeypatch)
                                          for is_fused in (True, False))
    assert num_fused > 0 and num_two == 0, (num_fused, num_two)
    rel, same_top1 = compare(fused, two)
    print(f"model {model}: rel_err={rel:.2e} fused launches={num_fused}")
    assert rel < 1e-5 and same_top1 == 1.0


def test_heads_past_128_keep_the_two_launches(model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The layer's rule: a head of 256 (the fused kernel would spill) decodes through the two kernels."""
    _, num_fused = decode_logits(model_dirs["qwen3-d256"], True, monkeypatch)
    assert num_fused == 0
