"""What fusion could take off a prompts-only step (8 prompts of 1024 tokens, Qwen3-0.6B), kernel by kernel.

- gate/up + SiLU-and-mul: the engine's product (gpu/layers/linear.py's routing: the skinny GEMM up to 256 rows where
  its table says so, else cuBLAS) then our SiLU kernel, against quack's gated GEMM
  (`quack.gemm_interface.gemm_act`, activation "swiglu", the [gate; up] weight as it is stored), its default config
  and its autotuned one; with how many outputs differ from the pair's and by how much.
- the plain products of the step (q/k/v, o, down): cuBLAS against quack's `gemm`, for reference.
- the gated product's first call per row count (whether quack compiles per row count).
- the residual add + RMSNorm between the products, deferred into them (quack's `gemm_rms`: the o and down products
  add the residual in their epilogue, write it and its normed-weight product x * w, and reduce each row's sum of
  squares; the next product scales its rows by rstd in its epilogue, `norm_act_mod`), against the engine's chain
  (its norm kernel between cuBLAS / the gated GEMM); four layers of distinct weights per call, attention left out.
- causal prefill attention: FA4 over our paged cache (16-token pages laid on scattered blocks, as a served cache
  is), also with the inputs padded as a prefill graph pads them (256 rows, 8 of them real), against FA4 over the
  step's own keys and values (varlen, `cu_seqlens_k`), contiguous and as views of the q/k/v projection's output.

Each figure is triton's do_bench median (L2 flushed between calls) and the median replay of a CUDA graph of 10
calls, in ms per call. Needs the FA4 wheels (flash-attn-4, quack-kernels; ../shared/device/fa4_wheels.sh). bf16.

    python -m bench.prefill_fusion_bench --out result.json
"""

import argparse
import sys
import time
from collections.abc import Callable

import torch

from bench.common import write_result
from bench.cuda_timing import graph_ms, median_ms

DEVICE, DTYPE = torch.device("cuda"), torch.bfloat16
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 1024, 3072, 16, 8, 128  # Qwen3-0.6B
BLOCK = 16
PADDED_ROWS, MAX_MODEL_LEN = 256, 4096  # the serving benchmark's max_num_seqs and max_model_len


def timed(fn: Callable[[], object]) -> dict[str, object]:
    """The two timings, or the error that stopped them (a variant that fails leaves the others measured)."""
    try:
        return {"median_ms": round(median_ms(fn), 4), "graph_ms": round(graph_ms(fn, 10), 4)}
    except Exception as exc:  # noqa: BLE001 - reported in the results
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def gated_rows(rows: int) -> list[dict[str, object]]:
    from quack.gemm_interface import gemm_act

    from gpu.config import DEFAULT_KERNELS
    from gpu.kernels.silu_and_mul import silu_and_mul
    from gpu.layers.linear import linear

    x = torch.randn(rows, HIDDEN, device=DEVICE, dtype=DTYPE)
    w = torch.randn(2 * INTERMEDIATE, HIDDEN, device=DEVICE, dtype=DTYPE) / HIDDEN**0.5  # [gate; up], as stored
    post = torch.empty(rows, INTERMEDIATE, device=DEVICE, dtype=DTYPE)
    product = torch.empty(rows, 2 * INTERMEDIATE, device=DEVICE, dtype=DTYPE)

    def pair() -> torch.Tensor:  # the engine's unfused path: its linear routing (skinny GEMM or cuBLAS), then SiLU
        return silu_and_mul(linear(x, w, None, DEFAULT_KERNELS, out=product), use_pdl=True)

    def fused(tuned: bool) -> Callable[[], object]:
        return lambda: gemm_act(x, w.t(), activation="swiglu", postact_out=post, store_preact=False,
                                concat_layout=("B",), tuned=tuned)

    reference = pair()
    out = []
    for name, fn in (("engine_linear+silu_kernel", pair), ("quack_gated_default", fused(False)),
                     ("quack_gated_tuned", fused(True))):
        row: dict[str, object] = {"op": "gate_up+silu", "rows": rows, "variant": name, **timed(fn)}
        if name != "engine_linear+silu_kernel" and "error" not in row:
            fn()
            diff = (post.float() - reference.float()).abs()
            row["share_not_bit_equal"] = round(float((post != reference).float().mean()), 5)
            row["max_abs_diff"] = float(diff.max())
            row["max_abs_ref"] = float(reference.float().abs().max())
        out.append(row)
        print(row, flush=True)
    return out


def first_call_rows(rows_list: list[int]) -> list[dict[str, object]]:
    """Seconds of the gated product's first call per row count, in a fresh process before any other call: whether
    quack compiles once per shape class or once per row count."""
    from gpu.kernels.gated_gemm import silu_and_mul_product

    w = torch.randn(2 * INTERMEDIATE, HIDDEN, device=DEVICE, dtype=DTYPE)
    out = []
    for rows in rows_list:
        x = torch.randn(rows, HIDDEN, device=DEVICE, dtype=DTYPE)
        torch.cuda.synchronize()
        start = time.perf_counter()
        silu_and_mul_product(x, w)
        torch.cuda.synchronize()
        row = {"op": "gated_first_call", "rows": rows, "seconds": round(time.perf_counter() - start, 3)}
        out.append(row)
        print(row, flush=True)
    return out


def plain_rows(rows: int) -> list[dict[str, object]]:
    from quack.gemm_interface import gemm

    out = []
    for name, n, k in (("qkv", (HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), ("o", HIDDEN, HEADS * HEAD_DIM),
                       ("down", HIDDEN, INTERMEDIATE)):
        x = torch.randn(rows, k, device=DEVICE, dtype=DTYPE)
        w = torch.randn(n, k, device=DEVICE, dtype=DTYPE) / k**0.5
        y = torch.empty(rows, n, device=DEVICE, dtype=DTYPE)
        for variant, fn in (("cublas", lambda x=x, w=w, y=y: torch.mm(x, w.t(), out=y)),
                            ("quack_tuned", lambda x=x, w=w, y=y: gemm(x, w.t(), out=y, tuned=True))):
            row = {"op": name, "rows": rows, "variant": variant, **timed(fn)}
            out.append(row)
            print(row, flush=True)
    return out


def norm_chain_rows(rows: int, autotuned: bool = True, layers: int = 4) -> list[dict[str, object]]:
    """One layer's products and norms (q/k/v, o, gate/up + SiLU, down; attention's output a fixed tensor): the
    engine's chain against the norm deferred into quack's epilogues. ms per layer, and how far the deferred chain's
    residual stream and q/k/v product land from the engine's after `layers` layers."""
    from quack.epilogue.library import norm_act_mod
    from quack.gemm_interface import gemm_norm_act, gemm_rms

    from gpu.config import DEFAULT_KERNELS
    from gpu.kernels.gated_gemm import silu_and_mul_product
    from gpu.kernels.rms_norm import rms_norm
    from gpu.layers.linear import linear

    eps = 1e-6
    q_out = (HEADS + 2 * KV_HEADS) * HEAD_DIM

    def weight(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, device=DEVICE, dtype=DTYPE) / k**0.5

    def norm_weight() -> torch.Tensor:
        return (1 + 0.1 * torch.randn(HIDDEN, device=DEVICE)).to(DTYPE)

    ws = [{"qkv": weight(q_out, HIDDEN), "o": weight(HIDDEN, HEADS * HEAD_DIM),
           "gate_up": weight(2 * INTERMEDIATE, HIDDEN), "down": weight(HIDDEN, INTERMEDIATE),
           "w_in": norm_weight(), "w_post": norm_weight()} for _ in range(layers)]
    attn = [torch.randn(rows, HEADS * HEAD_DIM, device=DEVICE, dtype=DTYPE) for _ in range(layers)]
    x0 = torch.randn(rows, HIDDEN, device=DEVICE, dtype=DTYPE)
    res0 = torch.randn(rows, HIDDEN, device=DEVICE, dtype=DTYPE)
    gated_norm = norm_act_mod("swiglu", gated=True, has_c=False, has_rowvec=False, has_colvec=True)
    act_buf = torch.empty(rows, INTERMEDIATE, device=DEVICE, dtype=DTYPE)
    qkv_buf = torch.empty(rows, q_out, device=DEVICE, dtype=DTYPE)
    qkv_deferred_buf = torch.empty_like(qkv_buf)  # its own: the two chains' last q/k/v products are compared
    scaled = [torch.empty(rows, HIDDEN, device=DEVICE, dtype=DTYPE) for _ in range(2)]
    stream = [torch.empty(rows, HIDDEN, device=DEVICE, dtype=DTYPE) for _ in range(2)]
    outputs: dict[str, torch.Tensor] = {}
    # The deferred chain's first input as the layer before's down product would leave it: the stream x0 + res0,
    # its product with the first norm's weight, and its rstd; made here, outside the calls timed.
    first_stream = x0 + res0
    first_scaled = first_stream * ws[0]["w_in"]
    first_rstd = torch.rsqrt(first_stream.float().square().mean(-1) + eps)

    def engine() -> None:  # the layers only: the stream (x + res) is summed for the comparison after the timing
        x, res = x0, res0
        for w, a in zip(ws, attn, strict=True):
            normed, res = rms_norm(x, w["w_in"], eps, res, use_pdl=True)
            outputs["qkv"] = linear(normed, w["qkv"], None, DEFAULT_KERNELS, out=qkv_buf)
            o = linear(a, w["o"], None, DEFAULT_KERNELS)
            normed, res = rms_norm(o, w["w_post"], eps, res, use_pdl=True)
            x = linear(silu_and_mul_product(normed, w["gate_up"]), w["down"], None, DEFAULT_KERNELS)
        outputs["x"], outputs["res"] = x, res

    def deferred(tuned: bool) -> Callable[[], None]:
        def run() -> None:
            xw, rstd, res = first_scaled, first_rstd, first_stream
            for i, (w, a) in enumerate(zip(ws, attn, strict=True)):
                gemm_norm_act(xw, w["qkv"].t(), rstd=rstd, postact_out=qkv_deferred_buf, tuned=tuned)
                outputs["qkv_deferred"] = qkv_deferred_buf
                xw, rstd = gemm_rms(a, w["o"].t(), C=res, norm_weight=w["w_post"], out=scaled[0],
                                    premult_out=stream[0], eps=eps, tuned=tuned)
                res = stream[0]
                gated_norm(xw, w["gate_up"].t(), None, out={"mAuxOut": act_buf}, store_d=False, tuned=tuned,
                           dynamic_scheduler=False, concat_layout=("B",), mColVecBroadcast=rstd)
                nxt = ws[i + 1]["w_in"] if i + 1 < layers else ws[0]["w_in"]
                xw, rstd = gemm_rms(act_buf, w["down"].t(), C=res, norm_weight=nxt, out=scaled[1],
                                    premult_out=stream[1], eps=eps, tuned=tuned)
                res = stream[1]
            outputs["stream_deferred"] = res
        return run

    out = []
    variants = [("engine_chain", engine), ("deferred_norm_default", deferred(False))]
    if autotuned:
        variants.append(("deferred_norm_tuned", deferred(True)))
    for name, fn in variants:
        row: dict[str, object] = {"op": "layer_products_and_norms", "rows": rows, "variant": name}
        try:
            fn()
            row["ms_per_layer_graph"] = round(graph_ms(fn, 1) / layers, 4)
            row["ms_per_layer_median"] = round(median_ms(fn) / layers, 4)
            fn()  # the outputs compared: from an eager call
            if name == "engine_chain":
                outputs["stream"] = outputs["x"] + outputs["res"]
        except Exception as exc:  # noqa: BLE001 - reported in the results
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        if name != "engine_chain" and "error" not in row:
            for key in ("qkv", "stream"):
                ref, got = outputs[key].float(), outputs[f"{key}_deferred"].float()
                row[f"{key}_max_rel_diff"] = float((got - ref).abs().max() / ref.abs().max())
                row[f"{key}_mean_abs_diff_over_mean_abs"] = float((got - ref).abs().mean() / ref.abs().mean())
        out.append(row)
        print(row, flush=True)
    return out


def attention_rows(num_prompts: int, prompt_len: int) -> list[dict[str, object]]:
    from flash_attn.cute.interface import _flash_attn_fwd

    tokens = num_prompts * prompt_len
    scale = HEAD_DIM**-0.5
    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    qkv = torch.randn(tokens, q_size + 2 * kv_size, device=DEVICE, dtype=DTYPE)
    q = qkv[:, :q_size].contiguous().view(tokens, HEADS, HEAD_DIM)
    k_view = qkv[:, q_size : q_size + kv_size].view(tokens, KV_HEADS, HEAD_DIM)
    v_view = qkv[:, q_size + kv_size :].view(tokens, KV_HEADS, HEAD_DIM)
    k, v = k_view.contiguous(), v_view.contiguous()
    starts = torch.arange(0, tokens + 1, prompt_len, device=DEVICE, dtype=torch.int32)
    lens = torch.full((num_prompts,), prompt_len, device=DEVICE, dtype=torch.int32)
    # The cache: every prompt's blocks scattered over a cache of twice the blocks needed.
    blocks_per_prompt = prompt_len // BLOCK
    num_blocks = 2 * num_prompts * blocks_per_prompt
    table = torch.randperm(num_blocks, device=DEVICE)[: num_prompts * blocks_per_prompt].to(torch.int32)
    table = table.view(num_prompts, blocks_per_prompt)
    k_cache = torch.zeros(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    v_cache = torch.zeros_like(k_cache)
    k_cache[table.flatten().long()] = k.view(-1, BLOCK, KV_HEADS, HEAD_DIM)
    v_cache[table.flatten().long()] = v.view(-1, BLOCK, KV_HEADS, HEAD_DIM)
    out_buf = torch.empty_like(q)
    # As a prefill graph's padded inputs hold them (gpu/mixed_graphs.py): PADDED_ROWS rows of which the first
    # num_prompts are real, the others without queries or context; block tables as wide as max_model_len; the
    # longest query passed as the bucket.
    padded_starts = torch.full((PADDED_ROWS + 1,), tokens, device=DEVICE, dtype=torch.int32)
    padded_starts[: num_prompts + 1] = starts
    padded_lens = torch.zeros(PADDED_ROWS, device=DEVICE, dtype=torch.int32)
    padded_lens[:num_prompts] = lens
    padded_table = torch.zeros(PADDED_ROWS, MAX_MODEL_LEN // BLOCK, device=DEVICE, dtype=torch.int32)
    padded_table[:num_prompts, :blocks_per_prompt] = table

    def paged(rows_starts: torch.Tensor = starts, rows_lens: torch.Tensor = lens, rows_table: torch.Tensor = table,
              longest: int = prompt_len) -> None:
        _flash_attn_fwd(q, k_cache, v_cache, cu_seqlens_q=rows_starts, max_seqlen_q=longest, seqused_k=rows_lens,
                        page_table=rows_table, softmax_scale=scale, causal=True, num_splits=1, out=out_buf)

    def own(kk: torch.Tensor, vv: torch.Tensor) -> Callable[[], None]:
        return lambda: _flash_attn_fwd(q, kk, vv, cu_seqlens_q=starts, cu_seqlens_k=starts, max_seqlen_q=prompt_len,
                                       max_seqlen_k=prompt_len, softmax_scale=scale, causal=True, num_splits=1,
                                       out=out_buf)

    paged()
    reference = out_buf.clone()
    rows = []
    for name, fn in (("fa4_paged_scattered", paged),
                     ("fa4_paged_scattered_longest_as_bucket", lambda: paged(longest=tokens)),
                     (f"fa4_paged_scattered_padded_to_{PADDED_ROWS}_rows",
                      lambda: paged(padded_starts, padded_lens, padded_table, tokens)),
                     ("fa4_own_kv_contiguous", own(k, v)), ("fa4_own_kv_qkv_views", own(k_view, v_view))):
        row: dict[str, object] = {"op": "prefill_attention", "prompts": f"{num_prompts}x{prompt_len}", "variant": name,
                                  **timed(fn)}
        if "error" in row:
            rows.append(row)
            continue
        fn()
        row["max_abs_diff_to_paged"] = float((out_buf.float() - reference.float()).abs().max())
        rows.append(row)
        print(row, flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.prefill_fusion_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="2048,8192", help="token counts of the products, comma-separated")
    p.add_argument("--no-first-calls", dest="first_calls", action="store_false",
                   help="skip the gated product's first-call times")
    p.add_argument("--sections", default="attention,gated,plain,norm_chain",
                   help="what to measure, comma-separated, of: attention, gated, plain, norm_chain")
    p.add_argument("--no-autotuned-chain", dest="autotuned_chain", action="store_false",
                   help="norm_chain without its autotuned variant (quack's tuning takes minutes at 8192 rows)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    sections = set(args.sections.split(","))
    torch.manual_seed(0)
    results: list[dict[str, object]] = first_call_rows([1024, 1280, 3001, 1024, 8192]) if args.first_calls else []
    if "attention" in sections:
        results += attention_rows(8, 1024)
    for rows in (int(r) for r in args.rows.split(",") if r):
        if "gated" in sections:
            results += gated_rows(rows)
        if "plain" in sections:
            results += plain_rows(rows)
        if "norm_chain" in sections:
            results += norm_chain_rows(rows, args.autotuned_chain)
    if args.out:
        write_result(args.out, {"kind": "prefill-fusion", "rows": results}, "bench.prefill_fusion_bench",
                     sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
