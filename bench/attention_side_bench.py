"""The attention side of a decode step, per layer, as CUDA-graph replays on the GPU: per variant, 28 layers of
(q/k norm + RoPE, K/V written to the cache, decode attention), Qwen3-0.6B heads (16 query heads, 8 KV heads,
head_dim 128, bf16, block 16), block tables as wide as a 4096-token max_model_len (the engine benches' one, which
fixes the split count of few rows), rows launched through a row order as the decode graphs do. Each layer has
its own cache, or one of several rotating ones where 28 would not fit, so a replay reads its K/V from memory as a
step does (the L2 cache is flushed between replays too).

Variants: `baseline` is the kernels of the checkout given by --baseline (gpu/kernels/decode_attention.py,
qk_norm_rope.py, store_kv.py loaded from there); `kv_store=0` this tree's with a separate store_kv launch;
`default` this tree's as the engine runs them (K/V written by qk_norm_rope_store_kv). For few rows (split-KV
launches) the decode kernel's launch settings are varied too (split cap, warps, stages, tile), each a
DecodeConfig a static-shape rule could choose. Before timing, every variant's attention output is compared with
the default's.

    python -m bench.attention_side_bench --baseline /path/to/other/checkout --out result.json
"""

import argparse
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import torch
import triton

from bench.common import write_result
from bench.cuda_timing import graph_ms
from gpu.kernels import decode_attention, qk_norm_rope, store_kv

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_LAYERS = 16, 8, 128, 16, 28
TABLE_TOKENS = 4096
DTYPE = torch.bfloat16
SHAPES = [(1, 1024), (1, 4096), (4, 1024), (16, 1024), (64, 4096), (256, 1024)]
# Few-row launch settings: (name, split cap or None, block_n, num_warps, num_stages).
FEW_ROW_CONFIGS = [
    ("stages=3", None, 64, 4, 3), ("stages=2", None, 64, 4, 2), ("splits<=32", 32, 64, 4, 1),
    ("splits<=16", 16, 64, 4, 1), ("warps=2", None, 64, 2, 1), ("block_n=32", None, 32, 4, 1),
    ("block_n=32,warps=2", None, 32, 2, 1), ("splits<=32,stages=3", 32, 64, 4, 3),
    ("splits<=16,stages=3", 16, 64, 4, 3),
]
Kernels = tuple[ModuleType, ModuleType, ModuleType]  # decode_attention, qk_norm_rope, store_kv


def load_kernels(root: Path) -> Kernels:
    """Another checkout's kernel modules, each under a name of its own (its kernels find their helpers there)."""
    modules = []
    for name in ("decode_attention", "qk_norm_rope", "store_kv"):
        spec = importlib.util.spec_from_file_location(f"baseline_{name}", root / "gpu" / "kernels" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        modules.append(module)
    return modules[0], modules[1], modules[2]


class Layers:
    """NUM_LAYERS layers' inputs for a batch of `rows` decode rows at `context` tokens each."""

    def __init__(self, rows: int, context: int) -> None:
        l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
        layer_bytes = rows * context * NUM_KV_HEADS * HEAD_DIM * 2 * DTYPE.itemsize
        self.num_caches = max(1, min(NUM_LAYERS, math.ceil(4 * l2_bytes / layer_bytes)))
        blocks_per_row = TABLE_TOKENS // BLOCK_SIZE
        num_blocks = rows * blocks_per_row
        shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        self.caches = [(torch.randn(shape, device="cuda").to(DTYPE), torch.randn(shape, device="cuda").to(DTYPE))
                       for _ in range(self.num_caches)]
        self.tables = torch.randperm(num_blocks, device="cuda").view(rows, blocks_per_row).to(torch.int32)
        self.context_lens = torch.full((rows,), context, dtype=torch.int32, device="cuda")
        self.positions = torch.full((rows,), context - 1, dtype=torch.int64, device="cuda")
        pages = self.tables[:, (context - 1) // BLOCK_SIZE].long()
        self.slot_mapping = pages * BLOCK_SIZE + (context - 1) % BLOCK_SIZE
        self.qkv = torch.randn(NUM_LAYERS, rows, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, device="cuda").to(DTYPE)
        angles = torch.rand(TABLE_TOKENS, HEAD_DIM // 2, device="cuda") * 6
        self.cos, self.sin = angles.cos().repeat(1, 2).to(DTYPE), angles.sin().repeat(1, 2).to(DTYPE)
        self.norms = (1 + 0.1 * torch.randn(2, HEAD_DIM, device="cuda")).to(DTYPE).unbind(0)
        self.row_order = torch.arange(rows, dtype=torch.int32, device="cuda")

    def run(self, kernels: Kernels, kv_store: bool, config: object = None) -> list[torch.Tensor]:
        decode, rope, store = kernels
        heads, outs = (NUM_HEADS, NUM_KV_HEADS, HEAD_DIM), []
        for layer in range(NUM_LAYERS):
            qkv, (k_cache, v_cache) = self.qkv[layer], self.caches[layer % self.num_caches]
            if kv_store:
                q = rope.qk_norm_rope_store_kv(qkv, self.positions, (self.cos, self.sin), heads, self.norms, 1e-6,
                                               (k_cache, v_cache, self.slot_mapping))
            else:
                q, k = rope.qk_norm_rope(qkv, self.positions, self.cos, self.sin, heads, self.norms, 1e-6)
                v = qkv[:, (NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM :].view(-1, NUM_KV_HEADS, HEAD_DIM)
                store.store_kv(k, v, k_cache, v_cache, self.slot_mapping)
            outs.append(decode.decode_attention(q, k_cache, v_cache, self.tables, self.context_lens, HEAD_DIM**-0.5,
                                                config=config, row_order=self.row_order))
        return outs


def shape_case(rows: int, context: int, baseline: Kernels | None) -> dict:
    layers = Layers(rows, context)
    ours = (decode_attention, qk_norm_rope, store_kv)
    num_splits = decode_attention.choose_num_splits(rows, NUM_KV_HEADS, TABLE_TOKENS,
                                                    torch.cuda.get_device_properties(0).multi_processor_count)
    variants: dict[str, tuple[Kernels, bool, object]] = {"default": (ours, True, None),
                                                         "kv_store=0": (ours, False, None)}
    if baseline is not None:
        variants["baseline"] = (baseline, False, None)
    for name, cap, block_n, warps, stages in FEW_ROW_CONFIGS if num_splits > 1 else []:
        splits = min(num_splits, cap) if cap else None
        config = decode_attention.DecodeConfig(block_n=block_n, num_warps=warps, num_stages=stages, num_splits=splits)
        variants[name] = (ours, True, config)
    expected = torch.stack(layers.run(ours, True)).float()
    result: dict[str, object] = {"rows": rows, "context": context, "caches": layers.num_caches,
                                 "num_splits": num_splits}
    for name, (kernels, kv_store, config) in variants.items():
        out = torch.stack(layers.run(kernels, kv_store, config)).float()
        rel = ((out - expected).norm() / expected.norm()).item()
        assert rel < 1e-2, f"{name} at {rows}x{context} differs from the default: relative error {rel:.2e}"

        def run(kernels: Kernels = kernels, kv_store: bool = kv_store, config: object = config) -> object:
            return layers.run(kernels, kv_store, config)

        ms = graph_ms(run, 1)
        result[name] = {"us_per_layer": round(ms * 1e3 / NUM_LAYERS, 2), "rel_err_vs_default": rel}
    return result


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.attention_side_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=None, help="a checkout whose gpu/kernels to time as `baseline`")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    baseline = load_kernels(Path(args.baseline)) if args.baseline else None
    results = {"kind": "attention-side", "torch": torch.__version__, "triton": triton.__version__,
               "layers": NUM_LAYERS, "table_tokens": TABLE_TOKENS, "baseline": args.baseline,
               "shapes": []}
    for rows, context in SHAPES:
        results["shapes"].append(row := shape_case(rows, context, baseline))
        print(row, flush=True)
    if args.out:
        write_result(args.out, results, "bench.attention_side_bench", argv)


if __name__ == "__main__":
    main()
