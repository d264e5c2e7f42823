"""Greedy answers of the default model in a faster dtype against float32's: where they part, and why.

Eight chat questions (tests/parity/test_parity_smollm2.py's), greedy, `--tokens` new tokens each,
for each contender of ours against our float32 run (which equals transformers' float32 tokens:
that parity test). Where a contender's answer first differs, transformers' float32 model scores
the common prefix: the float32 logit margin between float32's token and the contender's, and the
rank of the contender's token among float32's. A difference that is a rounding decision shows a
small margin and rank 2; a broken path would part early with large margins.

    python -m bench.default_model_answers --out bench/results/current/DATE-cpu-default-model-answers.json
"""

import argparse
import sys
from pathlib import Path

import torch

from bench.common import write_result
from bench.default_model_speed import Ours
from core import SamplingParams
from core.model_files import resolve_model

QUESTIONS = [
    "What is the capital of France?", "What is 2+3?", "Name three colors.", "Who wrote Romeo and Juliet?",
    "Write a haiku about the sea.", "What is the boiling point of water?", "Translate 'thank you' into Spanish.",
    "Give me a synonym for happy.",
]


def greedy_answers(contender: Ours, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    engine = contender.engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"q{i}", prompt, SamplingParams(temperature=0.0, max_tokens=num_tokens))
    answers: dict[str, list[int]] = {f"q{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            answers[out.request_id] += out.new_token_ids
    return list(answers.values())


def compare(reference: list[int], answer: list[int], prompt: list[int], hf_model: torch.nn.Module) -> dict[str, object]:
    """Where `answer` first differs from `reference`, and float32's view of that choice."""
    index = next((i for i, (a, b) in enumerate(zip(reference, answer, strict=False)) if a != b), None)
    if index is None:
        return {"same_tokens": min(len(reference), len(answer)), "first_difference": None}
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + reference[:index]])).logits[0, -1]
    chosen = logits[answer[index]]
    return {"same_tokens": index, "first_difference": index,
            "float32_margin": round((logits[reference[index]] - chosen).item(), 4),
            "float32_rank_of_its_token": int((logits > chosen).sum()) + 1}


def _rows(reference: list[list[int]], answers: list[list[int]], prompts: list[list[int]], tokenizer: object,
          hf_model: torch.nn.Module) -> list[dict[str, object]]:
    return [{"question": question, **compare(ref, answer, prompt, hf_model), "reference": tokenizer.decode(ref),
             "answer": tokenizer.decode(answer)}  # type: ignore[attr-defined]
            for question, prompt, ref, answer in zip(QUESTIONS, prompts, reference, answers, strict=True)]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a checkpoint (default: the default model, through the same resolution as the CLI)")
    p.add_argument("--ours", default="auto,bfloat16:unpacked", help="contenders against float32, comma-separated")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--out", help="write the result here as JSON")
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(args.model) if args.model else resolve_model(None, "auto", "cpu").path
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False) for q in QUESTIONS]
    float32 = Ours(model_dir, "cpu", "float32")
    reference = greedy_answers(float32, prompts, args.tokens)
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        hf_answers = [hf_model.generate(torch.tensor([p]), max_new_tokens=args.tokens, do_sample=False)[0, len(p):]
                      .tolist() for p in prompts]
    # Ours in float32 against transformers' float32 first (the oracle), then each contender against ours in float32.
    results = {f"{float32.name} against transformers float32": _rows(hf_answers, reference, prompts, tokenizer,
                                                                    hf_model)}
    for spec in args.ours.split(","):
        contender = Ours(model_dir, "cpu", spec)
        answers = greedy_answers(contender, prompts, args.tokens)
        results[f"{contender.name} against float32"] = _rows(reference, answers, prompts, tokenizer, hf_model)
    for name, rows in results.items():
        for row in rows:
            print(f"{name} | {row['question']} | first difference: {row['first_difference']}"
                  + (f", float32 margin {row['float32_margin']}, rank {row['float32_rank_of_its_token']}"
                     if row["first_difference"] is not None else ""))
    result = {"model": str(model_dir), "tokens": args.tokens, "threads": torch.get_num_threads(), "results": results}
    if args.out:
        write_result(args.out, result, "bench.default_model_answers", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
