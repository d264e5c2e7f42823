"""Writes docs/benchmarks.md and docs/benchmarks.png from the recorded results under bench/results/.

Runs anywhere (no GPU): the figures come from the JSON that the GPU runs wrote. `current/` holds the
figures shown, the latest result of each kind: offline throughput on the nano-vllm workload, offline
throughput on the serving shape (the reference for the server's share), each server's serving
run, the prefix-heavy serving run (bench.prefix_serve) and the offline runs of other model shapes; the
targets of issues 5 and 14 are checked against them, with the margin (bench/targets.py). `archive/YYYY-MM-DD-what/`
holds superseded and A/B results: they appear only in the history of offline runs. `peers/` holds other engines'
figures recorded elsewhere (vLLM's, as ranges), shown beside ours in each workload's table and in the plot.
`notes.md`, written by hand after reading the runs, is copied in as the analysis.

    python -m bench.report [--results bench/results] [--docs docs]
"""

import argparse
import json
from pathlib import Path

from bench.bench_model import DEFAULT_DIR
from bench.targets import (
    ISSUE_5,
    ISSUE_14,
    SERVER,
    Result,
    measure,
    offline_serve_references,
    sweep,
    target_rows,
)

PLOT_NAME = "benchmarks.png"
# The offline runs of the main tables: the random Qwen3-0.6B (bench.throughput's name for it when it built it, or
# the directory run_gpu.sh builds it in). Runs of other checkpoints (the Qwen3-8B shape) have their own table.
MAIN_MODELS = (None, "random Qwen3-0.6B (bf16)", DEFAULT_DIR)


def load_results(results_dir: Path, pattern: str) -> list[Result]:
    """The result files matching `pattern` under `results_dir`; each knows its path from there (`file`)."""
    results = []
    for path in sorted(results_dir.glob(pattern)):
        result = json.loads(path.read_text())
        if isinstance(result, dict):  # other benchmarks' files may sit beside ours
            result["file"] = path.relative_to(results_dir).as_posix()
            results.append(result)
    return results


def latest(results: list[Result], **match: object) -> Result | None:
    """The most recent result whose fields equal `match` (dates are 'YYYY-MM-DD HH:MM UTC', so they sort)."""
    found = [r for r in results if all(r.get(k) == v for k, v in match.items())]
    return max(found, key=lambda r: (str(r["date"]), str(r["file"]))) if found else None


def latest_serve_runs(results: list[Result]) -> list[Result]:
    """Every current openai-serve run, newest first (several runs may share the current figures: fresh starts at
    concurrency 1, a run at 256), then the latest run of each peer."""
    serve = sorted((r for r in results if r.get("kind") == "serve"), key=lambda r: (str(r["date"]), str(r["file"])),
                   reverse=True)
    ours = [r for r in serve if r["server"]["label"] == SERVER]
    labels = sorted({str(r["server"]["label"]) for r in serve} - {SERVER})
    return ours + [next(r for r in serve if r["server"]["label"] == label) for label in labels]


def peer_provenance(peer: Result) -> str:
    return f"{peer['engine']} ({peer['settings']}), {peer['device']}, {peer['date']}: {peer['source']}"


def _span(values: list[float], digits: int) -> str:
    """A peer's range (low, high); whole numbers without decimals (the figures are recorded as measured)."""
    low, high = (fmt(v, 0 if float(v).is_integer() else digits) for v in values)
    return low if low == high else f"{low}-{high}"


def peer_offline_lines(peers: list[Result], tp: Result) -> tuple[list[str], list[str]]:
    """The peers' rows of the offline table, and a line per peer on how this run compares."""
    rows, lines = [], []
    for peer in peers:
        if "offline_tokens_per_s" not in peer:
            continue
        low, high = peer["offline_tokens_per_s"]
        ours = tp["ours"]["tokens_per_s"]
        rows.append(f"| {peer['engine']} (peer figures of {peer['date']}) | {tp['ours']['num_requests']} | - | "
                    f"- | {_span(peer['offline_tokens_per_s'], 0)} | - | - |")
        lines.append(f"openai-serve in this run: {ours / high:.2f}-{ours / low:.2f}x {peer['engine']}'s figures. "
                     f"Peer figures: {peer_provenance(peer)}")
    return rows, lines


def peer_batch1_lines(peers: list[Result], tpot_ms: float) -> list[str]:
    lines = []
    for peer in peers:
        if "batch1_tpot_ms" in peer:
            low, high = peer["batch1_tpot_ms"]
            lines.append(f"{peer['engine']} (peer figures of {peer['date']}): {_span([low, high], 2)} ms per output "
                         f"token; this run's is {low / tpot_ms:.2f}-{high / tpot_ms:.2f}x shorter.")
    return lines


def peer_serve_lines(peers: list[Result]) -> list[str]:
    lines = []
    for peer in peers:
        if not peer.get("serve"):
            continue
        lines += [f"### {peer['engine']} (peer figures)", "", peer_provenance(peer), "",
                  "| concurrency | output tok/s | TTFT p50 ms | TTFT p99 ms |", "| ---: | ---: | ---: | ---: |"]
        for level in peer["serve"]:
            cells = [_span(level[key], 1) if key in level else "-"
                     for key in ("output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms")]
            lines.append(f"| {level['concurrency']} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def provenance(result: Result) -> str:
    return (f"{result['device']}, {result['date']}, commit `{result['commit']}`, file `bench/results/{result['file']}`"
            f"\n\n    {result['command']}\n")


def fmt(value: object, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else "-"


def throughput_section(tp: Result, peer_run: Result | None, peers: list[Result]) -> list[str]:
    """The latest run's table; transformers comes from `peer_run` (the latest run that has one) when it differs,
    the other engines from their recorded figures (`peers`)."""
    s, ideal, ours, limits = tp["summary"], tp["ideal"], tp["ours"], tp["limits"]
    lines = ["## Offline throughput", "", provenance(tp),
             "| engine | requests | output tokens | seconds | output tok/s | share of ideal | vs transformers |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    partial = " (partial: stopped by --max-seconds)" if ours["is_partial"] else ""
    lines.append(f"| openai-serve{partial} | {ours['num_requests']} | {ours['num_output_tokens']:,} | "
                 f"{fmt(ours['seconds'], 2)} | {fmt(ours['tokens_per_s'])} | {s['share_of_ideal']:.1%} | "
                 f"{fmt(_ours_over_peer(tp, peer_run), 2)}x |")
    peer = (peer_run or tp).get("peer") or {}
    if "tokens_per_s" in peer:
        subset = " (first {num_requests} requests only)".format(**peer) if peer.get("is_subset") else ""
        if peer_run is not None and peer_run["file"] != tp["file"]:
            subset += f" (from the run of {peer_run['date']}, `{peer_run['file']}`)"
        lines.append(f"| transformers {peer['transformers']} {peer['method']}{subset} | {peer['num_requests']} | "
                     f"{peer['num_output_tokens']:,} | {fmt(peer['seconds'], 2)} | {fmt(peer['tokens_per_s'])} | "
                     f"{peer['tokens_per_s'] / ideal['tokens_per_s']:.1%} | 1.00x |")
    elif peer:
        lines.append(f"| transformers | - | - | - | - | - | did not run: {next(iter(peer.values()))} |")
    peer_rows, peer_lines = peer_offline_lines(peers, tp)
    lines += peer_rows
    lines.append(f"| ideal (physical limit) | {ours['num_requests']} | - | {fmt(ideal['seconds'], 2)} | "
                 f"{fmt(ideal['tokens_per_s'])} | 100% | - |")
    lines += ["", *peer_lines, "", f"Ideal: {ideal['num_steps']} steps moving {ideal['tera_bytes']} TB "
              f"({ideal['kv_share_of_bytes']:.0%} of it K/V) at the measured copy bandwidth of "
              f"{limits['copy_tb_per_s']} TB/s, and "
              f"{ideal['tera_flops']} TFLOP at the measured matmul rate of {limits['matmul_tflop_per_s']} TFLOP/s "
              "(bench/roofline.py). Our run: "
              f"{ours['num_steps']} steps, {fmt(ours['runner_seconds'], 2)} s of {fmt(ours['seconds'], 2)} s "
              f"inside the model runner, {ours['num_preemptions']} preemptions.", ""]
    if "tpot_ms" in tp.get("batch1", {}):
        b1 = tp["batch1"]
        lines += ["## Batch-1 latency", "",
                  f"One request, a {b1['prompt_len']}-token prompt, {b1['num_output_tokens']} output tokens "
                  f"(median of {len(b1['tpot_samples_ms'])} runs; same run as above): time per output token "
                  f"**{b1['tpot_ms']:.3f} ms** (ideal {ideal['batch1_tpot_ms']:.3f} ms), "
                  f"TTFT {b1['ttft_ms']:.1f} ms" + _runner_split(b1)]
        fresh = tp.get("batch1_fresh", {})
        if "tpot_ms" in fresh:
            lines.append(f"The same on the fresh engine (same process, before the warm-up and timed runs): "
                         f"**{fresh['tpot_ms']:.3f} ms** per output token, TTFT {fresh['ttft_ms']:.1f} ms"
                         + _runner_split(fresh))
        lines += ["", *peer_batch1_lines(peers, b1["tpot_ms"]), ""]
    return lines


def _prompt_form(config: Result) -> str:
    return "token ids" if config.get("prompt_format", "ids") == "ids" else "text that encodes to those ids"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _runner_split(b1: Result) -> str:
    if "runner_ms_per_step" not in b1:
        return "."  # recorded before this split was measured
    return (f"; {b1['runner_ms_per_step']:.3f} ms per step inside the model runner, {b1['gc_ms_total']:.1f} ms of "
            "GC pauses over all repeats.")


def _ours_over_peer(tp: Result, peer_run: Result | None) -> float | None:
    peer = (peer_run or tp).get("peer") or {}
    return tp["ours"]["tokens_per_s"] / peer["tokens_per_s"] if "tokens_per_s" in peer else None


def history_section(runs: list[Result]) -> list[str]:
    """Every recorded offline run of the nano-vllm workload, newest first."""
    lines = ["### Every recorded run", "", "| date | device | commit | output tok/s | share of ideal | "
             "batch-1 ms/token | file |", "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for r in sorted(runs, key=lambda r: (str(r["date"]), str(r["file"])), reverse=True):
        batch1 = (r.get("batch1") or {}).get("tpot_ms")
        lines.append(f"| {r['date']} | {r['device']} | `{r['commit']}` | {fmt(r['ours']['tokens_per_s'])} | "
                     f"{r['summary']['share_of_ideal']:.1%} | {fmt(batch1, 3)} | `{r['file']}` |")
    return lines + [""]


def profile_section(tp: Result) -> list[str]:
    """The top device ops of a few profiled steps: where a missed target's time goes."""
    profile = tp.get("profile") or {}
    if "failed" in profile:
        return ["## Profile", "", f"The profile failed: `{profile['failed']}`", ""]
    lines = ["## Profile", "", "torch.profiler over a few engine steps after the timed run (same process); "
             "'device busy' adds up the kernels' own times, so step time minus device busy is time the GPU waited "
             "on the host.", ""]
    for name, title in (("first_steps_with_prefill", "Steps with prefill, at the workload's start"),
                        ("full_batch_decode", "Full batch, decode"), ("batch1_decode", "Batch 1, decode")):
        if name not in profile:
            continue
        p = profile[name]
        lines += [f"### {title}: {p['num_running']} running, step {fmt(p['step_ms_median'], 3)} ms (median), "
                  f"device busy {fmt(p['device_busy_ms_per_step'], 3)} ms per step in "
                  f"{fmt(p.get('kernels_per_step'), 0)} kernels", "",
                  "| op (device time) | ms per step | calls per step |", "| --- | ---: | ---: |"]
        lines += [f"| `{op['name']}` | {fmt(op['ms_per_step'], 3)} | {fmt(op['calls_per_step'])} |"
                  for op in p["top_device_ops"][:8]]
        lines += ["", "| op (host time) | ms per step | calls per step |", "| --- | ---: | ---: |"]
        lines += [f"| `{op['name']}` | {fmt(op['ms_per_step'], 3)} | {fmt(op['calls_per_step'])} |"
                  for op in p["top_host_ops"][:8]]
        lines.append("")
    return lines


def serve_section(runs: list[Result], offline_serve: Result | None, peers: list[Result]) -> list[str]:
    lines = ["## Online serving", ""]
    if offline_serve is not None:
        lines += [f"Offline engine on the same shape (reference for the server's share): "
                  f"**{fmt(offline_serve['ours']['tokens_per_s'])} tok/s** "
                  f"({offline_serve['ours']['num_requests']} requests; {offline_serve['date']}, "
                  f"`bench/results/{offline_serve['file']}`).", ""]
    for run in runs:
        server, config = run["server"], run["config"]
        lines += [f"### {server['label']}", "", provenance(run),
                  f"Prompts of {config['prompt_len']} random tokens (sent as {_prompt_form(config)}), "
                  f"{config['max_tokens']} output tokens, ignore_eos {config['ignore_eos']}, temperature "
                  f"{config['temperature']}; extra body `{config.get('extra_body', '{}')}`.", "",
                  "| concurrency | requests | failed | output tok/s | req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
                  "| ITL p50 / p99 ms | E2E p50 ms | client CPU | server CPU |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for lv in run["levels"]:
            lines.append(
                f"| {lv['concurrency']} | {lv['num_requests']} | {lv['num_failed']} | "
                f"{fmt(lv['output_tokens_per_s'])} | "
                f"{fmt(lv['request_per_s'], 2)} | {fmt(lv['ttft_ms']['p50'])} / {fmt(lv['ttft_ms']['p99'])} | "
                f"{fmt(lv['tpot_ms']['p50'], 2)} / {fmt(lv['tpot_ms']['p99'], 2)} | {fmt(lv['itl_ms']['p50'], 2)} / "
                f"{fmt(lv['itl_ms']['p99'], 2)} | {fmt(lv['e2e_ms']['p50'], 0)} | {lv['client_cpu_share']:.0%} | "
                f"{_share(lv.get('server_cpu_share'))} |")
        lines.append("")
        without_done = sum(lv.get("num_without_done", 0) for lv in run["levels"])
        if without_done:
            lines += [f"{without_done} complete streams ended without `data: [DONE]` (counted as complete, as the "
                      "OpenAI SDK reads them).", ""]
        errors = sorted({e for lv in run["levels"] for e in lv.get("errors", [])})
        if errors:
            lines += ["Errors seen: " + "; ".join(f"`{e[:200]}`" for e in errors[:5]), ""]
    lines += ["'client CPU' and 'server CPU': each process's CPU time (all its threads; the server's with its child "
              "processes, i.e. the engine's, in runs after cd7af73; up to cd7af73 the HTTP process alone) over the "
              "level's wall time. "
              "The load generator stays far from a full core, so it is not what limits a level. A server near 100% "
              "at every level, c=1 included, keeps one core busy on average: that includes a thread spinning while "
              "it waits for the GPU, so it does not by itself say how much of that core is useful work.", "",
              *peer_serve_lines(peers), f"![serving by concurrency]({PLOT_NAME})", ""]
    return lines


def prefix_section(run: Result) -> list[str]:
    """bench.prefix_serve's run: each prefix-caching variant's levels, and on against off per level."""
    c = run["config"]
    lines = ["## Prefix-heavy serving", "", provenance(run),
             f"Multi-turn chats sharing one {c['system_len']}-token system prompt: {c['turns']} turns each, a "
             f"{c['user_len']}-token user message per turn, {c['max_tokens']} output tokens per reply (ignore_eos, "
             f"temperature {c['temperature']}); each turn's prompt is the whole chat so far (the replies kept in "
             "it are the workload's ids, not the model's), sent as token ids when the previous reply has finished; "
             "'concurrency' is the chats in flight. Hit rate: the server's prefix-cache hits over queries, in "
             "tokens (/metrics); 'computed' the prompt tokens the engine ran, of all prompt tokens."
             + ("" if run.get("is_complete") else " **Partial: the run was cut short.**"), "",
             "| prefix caching | concurrency | chats | requests | failed | hit rate | prompt tokens computed / all "
             "| TTFT p50 / p99 ms | TTFT p50 first / later turns ms | output tok/s | TPOT p50 ms | E2E p50 ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for variant in run["variants"]:
        for lv in variant["levels"]:
            rate = lv.get("prefix_hit_rate")
            lines.append(
                f"| {variant['prefix_caching']} | {lv['concurrency']} | {lv['num_chats']} | {lv['num_requests']} | "
                f"{lv['num_failed']} | {'-' if rate is None else f'{rate:.1%}'} | "
                f"{fmt(lv.get('computed_prompt_tokens'), 0)} / {fmt(lv.get('prompt_tokens'), 0)} | "
                f"{fmt(lv['ttft_ms']['p50'])} / {fmt(lv['ttft_ms']['p99'])} | "
                f"{fmt(lv['ttft_ms_first_turn']['p50'])} / {fmt(lv['ttft_ms_later_turns']['p50'])} | "
                f"{fmt(lv['output_tokens_per_s'])} | {fmt(lv['tpot_ms']['p50'], 2)} | {fmt(lv['e2e_ms']['p50'], 0)} |")
    lines.append("")
    by_variant = {v["prefix_caching"]: {lv["concurrency"]: lv for lv in v["levels"]} for v in run["variants"]}
    on, off = by_variant.get("on", {}), by_variant.get("off", {})
    for concurrency in [c for c in on if c in off]:
        a, b = on[concurrency], off[concurrency]
        lines.append(f"- Concurrency {concurrency}: prefix caching on gives "
                     f"{_ratio(a['output_tokens_per_s'], b['output_tokens_per_s'])}x the output tok/s of off, and "
                     f"TTFT p50 / p99 {_ratio(b['ttft_ms']['p50'], a['ttft_ms']['p50'])}x / "
                     f"{_ratio(b['ttft_ms']['p99'], a['ttft_ms']['p99'])}x shorter.")
    errors = sorted({e for v in run["variants"] for lv in v["levels"] for e in lv.get("errors", [])})
    if errors:
        lines += ["", "Errors seen: " + "; ".join(f"`{e[:200]}`" for e in errors[:5])]
    return lines + [""]


def _ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}" if denominator else "-"


def other_models_section(runs: list[Result]) -> list[str]:
    """The latest offline run of each checkpoint other than the main tables' (the Qwen3-8B shape): throughput and
    batch 1, each against its own ideal, and the KV cache the engine sized for it."""
    lines = ["## Other model shapes, offline", "",
             "nano-vllm's workload on other random-weight checkpoints (`bash bench/run_gpu.sh qwen3-8b OUT_DIR`), "
             "each figure against the ideal of that shape on that GPU (weights and K/V bytes at the measured copy "
             "bandwidth, FLOPs at the measured matmul rate).", "",
             "| model | device | output tok/s | share of ideal | batch-1 ms/token (ideal) | batch-1 share of ideal | "
             "weights GB/step | KV cache | CUDA graphs | date, commit |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    newest: dict[str, Result] = {}
    for run in sorted(runs, key=lambda r: (str(r["date"]), str(r["file"]))):
        newest[str(run.get("model"))] = run
    for model, run in sorted(newest.items()):
        ours, ideal, engine = run["ours"], run["ideal"], run.get("engine", {})
        b1 = run.get("batch1", {})
        tpot = b1.get("tpot_ms")
        partial = " (partial)" if ours.get("is_partial") else ""
        blocks = engine.get("num_kv_blocks")
        kv = f"{blocks:,} blocks of {engine.get('block_size')} tokens" if blocks else "-"
        eager = (run.get("config") or {}).get("enforce_eager")
        lines.append(
            f"| `{Path(model).name}` | {run['device']} | {fmt(ours['tokens_per_s'])}{partial} | "
            f"{run['summary']['share_of_ideal']:.1%} | {fmt(tpot, 3)} ({fmt(ideal.get('batch1_tpot_ms'), 3)}) | "
            f"{_share(ideal['batch1_tpot_ms'] / tpot if tpot else None)} | "
            f"{fmt(ideal.get('weight_bytes_per_step', 0) / 1e9, 1)} | {kv} | {'off' if eager else 'on'} | "
            f"{run['date']}, `{run['commit']}` |")
    lines.append("")
    for model, run in sorted(newest.items()):
        lines += [f"`{Path(model).name}`: " + provenance(run)]
    return lines


def render_markdown(results: list[Result], history: list[Result], notes: str | None,
                    peers: list[Result] | None = None) -> str:
    """`results`: the current figures; `history`: every recorded result, current ones included; `peers`: other
    engines' recorded figures (`peers/*.json`)."""
    peers = peers or []
    offline = [r for r in results if r.get("kind") == "throughput" and r.get("workload") == "nano-vllm"]
    tp = latest([r for r in offline if r.get("model") in MAIN_MODELS])
    offline_serve_runs = offline_serve_references(results)
    offline_serve = latest(offline_serve_runs)
    serve_runs = latest_serve_runs(results)
    ours_serve = [r for r in serve_runs if r["server"]["label"] == SERVER]
    figures = measure(tp, offline_serve_runs, serve_runs)
    failed = sum(lv["num_failed"] for run in ours_serve for lv in run["levels"])  # the diagnostic levels too
    lines = ["# Benchmarks", "",
             "Generated by `python -m bench.report` from `bench/results/current/*.json` (the history of offline "
             "runs from every result under `bench/results/`, the peers' figures from `bench/results/peers/`); do "
             "not edit by hand. "
             "How to reproduce: the command under each table, on a GPU machine, or all of them with "
             "`bash bench/run_gpu.sh offline|serve OUT_DIR`. Model: the Qwen3-0.6B architecture "
             "with random bf16 weights (no weights can be downloaded on the GPU machine) and a word-level tokenizer "
             "over its whole vocabulary (`bench/bench_model.py`), so every sampled token streams as text.", ""]
    for title, targets in (("issue 14", ISSUE_14), ("issue 5", ISSUE_5)):
        lines += [f"## Targets ({title}, on an H100)", "",
                  "| target | goal | measured | verdict | measured on |", "| --- | --- | --- | --- | --- |"]
        lines += ["| " + " | ".join(row) + " |" for row in target_rows(targets, figures)]
        if targets is ISSUE_5 and ours_serve:
            lines.append(f"| failed requests | 0 | {failed} | {'met' if failed == 0 else f'missed by {failed}'} | "
                         f"{ours_serve[0]['device']} |")
        lines.append("")
    lines += ["A figure measured by several current runs is judged by its worst; why a target is missed is in the "
              "analysis below (bench/results/notes.md).", ""]
    if tp is not None:
        # The same model only: other shapes (the tensor-parallel 14B runs) have their own section in the notes.
        offline_runs = [r for r in history if r.get("kind") == "throughput" and r.get("workload") == "nano-vllm"
                        and r.get("model") == tp.get("model")]
        peer_run = max((r for r in offline_runs if "tokens_per_s" in (r.get("peer") or {})),
                       key=lambda r: (str(r["date"]), str(r["file"])), default=None)
        lines += throughput_section(tp, peer_run, peers) + history_section(offline_runs)
    if serve_runs:
        lines += serve_section(serve_runs, offline_serve, peers)
    prefix = latest(results, kind="prefix-serve")
    if prefix is not None:
        lines += prefix_section(prefix)
    others = [r for r in offline if r.get("model") not in MAIN_MODELS]
    if others:
        lines += other_models_section(others)
    if tp is not None:
        lines += profile_section(tp)
    if notes:
        lines += ["## Analysis", "", notes.strip(), ""]
    return "\n".join(lines)


def render_plot(serve_runs: list[Result], offline_serve: Result | None, peers: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    labels = list(dict.fromkeys(str(run["server"]["label"]) for run in serve_runs))
    for index, label in enumerate(labels):  # one color per server, p99 dashed; several runs merge into one series
        color = f"C{index}"
        levels = sorted((lv for run in serve_runs if run["server"]["label"] == label for lv in sweep(run["levels"])),
                        key=lambda lv: lv["concurrency"])
        x = [lv["concurrency"] for lv in levels]
        axes[0].plot(x, [lv["output_tokens_per_s"] for lv in levels], "o-", color=color, label=label)
        for ax, key in ((axes[1], "ttft_ms"), (axes[2], "tpot_ms")):
            ax.plot(x, [lv[key]["p50"] for lv in levels], "o-", color=color, label=f"{label} p50")
            ax.plot(x, [lv[key]["p99"] for lv in levels], "s--", color=color, alpha=0.6, label=f"{label} p99")
    for index, peer in enumerate((p for p in peers if p.get("serve")), start=len(labels)):
        # A peer's figures are ranges over its runs: one bar per concurrency, p50 left of the tick and p99 right.
        for ax, key, shift, alpha in ((axes[0], "output_tokens_per_s", 1.0, 0.6), (axes[1], "ttft_p50_ms", 0.9, 0.6),
                                      (axes[1], "ttft_p99_ms", 1.1, 0.3)):
            spans = [(lv["concurrency"] * shift, *lv[key]) for lv in peer["serve"] if key in lv]
            if spans:
                x, low, high = zip(*spans, strict=True)
                name = "tok/s" if key == "output_tokens_per_s" else key.removeprefix("ttft_").removesuffix("_ms")
                ax.vlines(x, low, high, color=f"C{index}", linewidth=6, alpha=alpha,
                          label=f"{peer['engine']} {name}, range ({peer['date']})")
    if offline_serve is not None:
        axes[0].axhline(offline_serve["ours"]["tokens_per_s"], color="gray", linestyle=":",
                        label="offline engine, same shape")
    titles = ("output tok/s by concurrency", "TTFT (ms)", "TPOT (ms)")
    ticks = sorted({lv["concurrency"] for run in serve_runs for lv in sweep(run["levels"])})
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("max concurrency")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    fig.suptitle(f"Serving, {serve_runs[0]['device']}: prompts of {serve_runs[0]['config']['prompt_len']} tokens, "
                 f"{serve_runs[0]['config']['max_tokens']} output tokens", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def write_report(results_dir: Path, docs_dir: Path) -> Path:
    results = load_results(results_dir, "current/*.json")
    notes_path = results_dir / "notes.md"
    notes = notes_path.read_text() if notes_path.exists() else None
    docs_dir.mkdir(parents=True, exist_ok=True)
    page = docs_dir / "benchmarks.md"
    peers = load_results(results_dir, "peers/*.json")
    page.write_text(render_markdown(results, load_results(results_dir, "**/*.json"), notes, peers))
    serve_runs = latest_serve_runs(results)
    if serve_runs:
        render_plot(serve_runs, latest(offline_serve_references(results)), peers, docs_dir / PLOT_NAME)
    return page


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="bench/results")
    p.add_argument("--docs", default="docs")
    args = p.parse_args(argv)
    print(write_report(Path(args.results), Path(args.docs)))


if __name__ == "__main__":
    main()
