"""Renders the tables of docs/performance.md from the results in bench/results/ (no GPU needed).

The page is written by hand around its tables: each sits between a `<!-- table: NAME -->` and an `<!-- end -->` line,
and is replaced by NAME's rendering of every result file, listed under the table it feeds with its device, date,
commit and command. A figure measured by several runs shows their range; other engines' recorded figures
(`kind: peer-figures`) stand beside ours where they measured the same thing.

    python -m bench.report [--results bench/results] [--page docs/performance.md]
"""

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

Result = dict[str, Any]  # one results file, as loaded, with its `file` name
SERVER = "openai-serve"
BLOCK = re.compile(r"(<!-- table: ([\w-]+) -->\n).*?(<!-- end -->)", re.DOTALL)


def load_results(results_dir: Path) -> list[Result]:
    return [{**json.loads(path.read_text()), "file": path.name} for path in sorted(results_dir.glob("*.json"))]


def fmt(value: object, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else "-"


def span(values: list[float], digits: int = 1, unit: str = "") -> str:
    """The range of a figure over runs: `low-high`, or the one value."""
    if not values:
        return "-"
    low, high = fmt(min(values), digits), fmt(max(values), digits)
    return (low if low == high else f"{low}-{high}") + unit


def sources(runs: list[Result]) -> list[str]:
    lines = ["", "Sources, in `bench/results/`:", ""]
    for r in sorted(runs, key=lambda r: r["file"]):
        lines.append(f"- `{r['file']}`: {r['device']}, {r['date']}, commit `{r['commit']}`: `{r['command']}`")
    return lines


def _by(results: list[Result], kind: str, **match: object) -> list[Result]:
    return [r for r in results if r.get("kind") == kind and all(r.get(k) == v for k, v in match.items())]


def offline(results: list[Result]) -> list[str]:
    """nano-vllm's workload: the latest run per model, device and GPU count, beside other engines' recorded figures."""
    latest: dict[tuple[str, str, int], Result] = {}
    for run in sorted(_by(results, "throughput", workload="nano-vllm"), key=lambda r: r["date"]):
        latest[(_model_name(run["model"]), run["device"], run["config"].get("tensor_parallel_size", 1))] = run
    lines = ["| model (random bf16 weights) | device | GPUs | output tok/s | share of ideal | batch 1, ms per token "
             "| batch 1, share of ideal |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for (model, device, gpus), run in sorted(latest.items()):
        tpot = (run.get("batch1") or {}).get("tpot_ms")
        ideal = run["ideal"]["batch1_tpot_ms"]
        lines.append(f"| {model} | {device} | {gpus} | {fmt(run['ours']['tokens_per_s'], 0)} | "
                     f"{run['summary']['share_of_ideal']:.1%} | {fmt(tpot, 3)} | "
                     f"{'-' if not tpot else f'{ideal / tpot:.0%}'} |")
    for peer in _by(results, "peer-figures"):
        lines.append(f"| {peer['model']}: {peer['engine']} (recorded) | {peer['device']} | 1 | "
                     f"{span(peer['offline_tokens_per_s'], 0)} | - | {span(peer['batch1_tpot_ms'], 2)} | - |")
    return lines + sources(list(latest.values()))


def _model_name(path: str) -> str:
    """A benchmark checkpoint's shape name (bench.bench_model's directory names)."""
    return Path(path).name.removesuffix("-bench").removesuffix("-config")


def _reference(run: Result, references: list[Result]) -> Result | None:
    """The offline engine's run on the serving shape just before a server run: the same machine, minutes apart."""
    before = [r for r in references if r["date"] <= run["date"]]
    return max(before, key=lambda r: r["date"]) if before else None


def serving(results: list[Result]) -> list[str]:
    """Per server and concurrency, over its runs: throughput (and its share of the offline engine on the same shape,
    measured just before), TTFT, TPOT; then other engines' recorded figures."""
    references = [r for r in _by(results, "throughput", workload="serve") if not r["config"].get("decode_hold_ms")]
    rows: dict[tuple[str, int], list[tuple[Result, Result]]] = {}
    for run in _by(results, "serve"):
        for level in run["levels"]:
            rows.setdefault((run["server"]["label"], level["concurrency"]), []).append((run, level))
    lines = ["| server | concurrency | runs | output tok/s | share of the offline engine | TTFT p50 ms | TTFT p99 ms "
             "| TPOT p50 ms | failed |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    order = sorted(rows, key=lambda key: (key[0] != SERVER, key[0], key[1]))
    for label, concurrency in order:
        pairs = rows[(label, concurrency)]
        shares = [level["output_tokens_per_s"] / ref["ours"]["tokens_per_s"] for run, level in pairs
                  if label == SERVER and concurrency > 1 and (ref := _reference(run, references))]
        lines.append(f"| {label} | {concurrency} | {len(pairs)} | "
                     f"{span([lv['output_tokens_per_s'] for _, lv in pairs], 0)} | "
                     f"{span([s * 100 for s in shares], 1, '%')} | {span([lv['ttft_ms']['p50'] for _, lv in pairs])} | "
                     f"{span([lv['ttft_ms']['p99'] for _, lv in pairs])} | "
                     f"{span([lv['tpot_ms']['p50'] for _, lv in pairs], 2)} | "
                     f"{sum(lv['num_failed'] for _, lv in pairs)} |")
    for peer in _by(results, "peer-figures"):
        for level in peer.get("serve", []):
            cells = [span(level[k], 0 if k.startswith("output") else 1) if k in level else "-"
                     for k in ("output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms")]
            lines.append(f"| {peer['engine']} (recorded, {peer['device']}) | {level['concurrency']} | - | {cells[0]} | "
                         f"- | {cells[1]} | {cells[2]} | - | - |")
    used = {run["file"]: run for pairs in rows.values() for run, _ in pairs}
    shared = {ref["file"]: ref for (label, c), pairs in rows.items() if label == SERVER and c > 1
              for run, _ in pairs if (ref := _reference(run, references))}
    return lines + sources([*used.values(), *shared.values()])


def chat(results: list[Result]) -> list[str]:
    """The prefix-heavy chats (bench.prefix_serve), the latest run per model: each prefix-caching variant per level."""
    latest = {_model_name(run["variants"][0]["server"]["model"]): run
              for run in sorted(_by(results, "prefix-serve"), key=lambda r: r["date"])}
    lines = ["| model | prefix caching | chats at once | requests | hit rate | prompt tokens computed / all "
             "| TTFT p50 / p99 ms | TTFT p50, first / later turns ms | output tok/s | TPOT p50 ms |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for model, variant in ((name, v) for name, run in sorted(latest.items()) for v in run["variants"]):
        for lv in variant["levels"]:
            rate = lv.get("prefix_hit_rate")
            lines.append(f"| {model} | {variant['prefix_caching']} | {lv['concurrency']} | {lv['num_requests']} | "
                         f"{'-' if rate is None else f'{rate:.1%}'} | {fmt(lv.get('computed_prompt_tokens'), 0)} / "
                         f"{fmt(lv.get('prompt_tokens'), 0)} | {fmt(lv['ttft_ms']['p50'])} / "
                         f"{fmt(lv['ttft_ms']['p99'])} | {fmt(lv['ttft_ms_first_turn']['p50'])} / "
                         f"{fmt(lv['ttft_ms_later_turns']['p50'])} | {fmt(lv['output_tokens_per_s'], 0)} | "
                         f"{fmt(lv['tpot_ms']['p50'], 2)} |")
    return lines + sources(list(latest.values()))


def default_model(results: list[Result]) -> list[str]:
    """The default model (and other small models) at batch 1, every contender of every run (device, model and its
    prompt set where not the question, then contender), with the process's CPU time per token where the run measured
    it; on a CPU the run's conditions (`_cpu_conditions`), and the int8 dot products' instruction set where a contender
    of ours ran them. Runs from before the model was named were the default model's."""
    runs = sorted(_by(results, "default-model-speed"), key=lambda r: (r["device"], r.get("model_name", "")))
    lines = ["| device | model | contender | decode tok/s, median | decode tok/s, each run | "
             "whole request tok/s, median | CPU ms per token, median |",
             "| --- | --- | --- | ---: | --- | ---: | ---: |"]
    for run in runs:
        device = run["device"] + _cpu_conditions(run) + (", random weights" if run.get("random_weights") else "")
        prompts = run.get("prompts", "question")
        model = run.get("model_name", "smollm2-135m-instruct") + ("" if prompts == "question" else f", {prompts}")
        for name, r in run["results"].items():
            each = ", ".join(fmt(x) for x in r.get("decode_tok_s", [])) or "-"
            isa = (r.get("cpu_kernels") or {}).get("int8_dot")
            contender = f"{name}, int8 dot products ({isa})" if isa else name
            lines.append(f"| {device} | {model} | {contender} | {fmt(r.get('decode_tok_s_median'))} | {each} | "
                         f"{fmt(r.get('request_tok_s_median'))} | {fmt(r.get('request_cpu_ms_per_token_median'))} |")
    return lines + sources(runs)


def _cpu_conditions(run: Result) -> str:
    """A CPU run's model, threads and the variables set besides the thread count (how its threads wait, torch's ISA)."""
    cpu = run.get("cpu") or {}
    parts = [cpu["model"]] if cpu.get("model") else []
    threads = run.get("threads")
    parts += [f"{threads} thread{'s' if threads != 1 else ''}"] if threads and cpu else []
    parts += [f"{name}={value}" for name, value in (run.get("openmp_environment") or {}).items()
              if name != "OMP_NUM_THREADS"]
    return "".join(f", {part}" for part in parts)


def skinny_gemm(results: list[Result]) -> list[str]:
    """cuBLAS against the skinny GEMM as shipped, us per call, each shape from its latest run; bold: the faster."""
    latest = {r["shape"]: run for run in sorted(_by(results, "skinny-gemm"), key=lambda r: r["date"])
              for r in run["rows"]}
    rows_of = sorted({r["m"] for shape, run in latest.items() for r in run["rows"] if r["shape"] == shape})
    lines = ["| shape (N x K) | " + " | ".join(str(m) for m in rows_of) + " |", "| --- |" + " ---: |" * len(rows_of)]
    for shape, run in latest.items():
        cells = {r["m"]: r for r in run["rows"] if r["shape"] == shape}
        lines.append(f"| {shape} {cells[min(cells)]['n']}x{cells[min(cells)]['k']} | " + " | ".join(
            _gemm_cell(cells[m]) if m in cells else "-" for m in rows_of) + " |")
    return lines + sources(list({run["file"]: run for run in latest.values()}.values())) if latest else []


def _gemm_cell(row: Result) -> str:
    cublas, kernel = f"{row['cublas_us']:.2f}", f"{row['skinny_us']:.2f}"
    return f"{cublas} / **{kernel}**" if row["skinny_us"] < row["cublas_us"] else f"**{cublas}** / {kernel}"


RENDERERS: dict[str, Callable[[list[Result]], list[str]]] = {
    "offline": offline, "serving": serving, "chat": chat, "default-model": default_model, "skinny-gemm": skinny_gemm}


def render(page: str, results: list[Result]) -> str:
    """The page with every table block rendered anew; a block naming no renderer is an error."""
    def block(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in RENDERERS:
            raise ValueError(f"no table named {name!r}: one of {sorted(RENDERERS)}")
        return match.group(1) + "\n".join(RENDERERS[name](results)) + "\n" + match.group(3)

    return BLOCK.sub(block, page)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="bench/results")
    p.add_argument("--page", default="docs/performance.md")
    args = p.parse_args(argv)
    page = Path(args.page)
    page.write_text(render(page.read_text(), load_results(Path(args.results))))
    print(page)


if __name__ == "__main__":
    main()
