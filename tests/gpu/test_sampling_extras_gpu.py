"""Penalties, logit bias and token masks on CUDA: the device tables equal the CPU reference, the fused
sampling kernel honours masks and keeps seeded rows batch-independent, greedy float32 tokens with
penalties equal transformers', and constrained outputs are valid with CUDA graphs on."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from core import LLM, FinishReason, SamplingParams
from core.structured_output import StructuredOutput
from gpu.batch import LogitBias, Penalties, PenaltySlotInit, RowSampling, TokenMask
from gpu.penalties import PenaltyState
from gpu.sampler import Sampler
from tests.unit.test_penalties_engine import CASES, PROMPTS, hf_greedy
from tests.unit.test_structured_output import CHOICES, REGEX, SCHEMA

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = torch.device("cuda")
VOCAB = 151936


def matches_schema(text: str) -> bool:
    """SCHEMA checked by hand (the GPU machine has no jsonschema); json.loads refuses raw control characters."""
    try:
        v = json.loads(text)
    except ValueError:
        return False
    return (isinstance(v, dict) and {"name", "age", "role"} <= set(v) <= {"name", "age", "role", "tags"}
            and isinstance(v["name"], str) and len(v["name"]) <= 8 and type(v["age"]) is int and 0 <= v["age"] <= 120
            and v["role"] in ("admin", "user")
            and ("tags" not in v or isinstance(v["tags"], list) and len(v["tags"]) <= 3
                 and all(type(t) is bool for t in v["tags"])))


KINDS = {
    "json_schema": (StructuredOutput(json_schema=json.dumps(SCHEMA)), matches_schema),
    "regex": (StructuredOutput(regex=REGEX), lambda text: re.fullmatch(REGEX, text) is not None),
    "choice": (StructuredOutput(choice=CHOICES), lambda text: text in CHOICES),
}


def histories(num_rows: int, seed: int = 0) -> list[PenaltySlotInit]:
    generator = torch.Generator().manual_seed(seed)
    return [PenaltySlotInit(slot, torch.randint(0, VOCAB, (50 + slot,), generator=generator).tolist(),
                            torch.randint(0, 2000, (30 * slot,), generator=generator).tolist())
            for slot in range(num_rows)]


def test_penalty_tables_on_cuda_equal_the_cpu_reference() -> None:
    penalties = [Penalties(slot=i, presence=0.1 * i, frequency=0.2, repetition=1.0 + 0.1 * i) for i in range(8)]
    logits = torch.randn(8, VOCAB) * 4
    results = []
    for device in (torch.device("cpu"), CUDA):
        state = PenaltyState(8, VOCAB, device)
        state.fill(histories(8))
        adjusted = logits.clone().to(device)
        state.apply(adjusted, None, penalties)
        results.append(adjusted.cpu())
    torch.testing.assert_close(results[1], results[0])
    assert not torch.equal(results[0], logits)


def masked_rows(num_rows: int, allowed: list[list[int]]) -> TokenMask:
    bitmask = np.zeros((num_rows, (VOCAB + 31) // 32), dtype=np.uint32)
    for row, token_ids in enumerate(allowed):
        for t in token_ids:
            bitmask[row, t // 32] |= np.uint32(1 << (t % 32))
    return TokenMask(list(range(num_rows)), bitmask.view(np.int32))


def test_fused_path_samples_only_allowed_tokens() -> None:
    allowed = [[5, 31, 32, 151935], [7], list(range(1000, 1100))]
    generator = torch.Generator(CUDA).manual_seed(0)
    logits = (torch.randn(3, VOCAB, device=CUDA, generator=generator) * 3).to(torch.bfloat16)
    logits[:, 0] = 50.0  # the favourite, disallowed everywhere
    # Row 0's allowed ids (bit 31 of word 0, bit 0 of word 1, the last id) equally likely: with random logits one
    # of four could take nearly all the probability and the 200 draws see only it (about 5% of seeds).
    logits[0, allowed[0]] = 1.0
    sampler = Sampler(CUDA, seed=0)
    rows = [RowSampling(temperature=1.0), RowSampling(temperature=0.0), RowSampling(temperature=2.0)]
    seen: list[set[int]] = [set(), set(), set()]
    for _ in range(200):
        for row, token_id in enumerate(sampler(logits, rows, token_mask=masked_rows(3, allowed)).token_ids):
            seen[row].add(token_id)
    assert seen[0] <= set(allowed[0]) and len(seen[0]) > 1
    assert seen[1] == {7}
    assert seen[2] <= set(allowed[2]) and len(seen[2]) > 20


def test_seeded_row_with_penalties_bias_and_mask_draws_the_same_alone_and_batched() -> None:
    logits = (torch.randn(6, VOCAB, device=CUDA) * 3).to(torch.bfloat16)
    init = histories(1, seed=3)[0]
    allowed = list(range(0, VOCAB, 7))

    def draw(rows_before: int, slot: int) -> int:
        state = PenaltyState(8, VOCAB, CUDA)
        sampler = Sampler(CUDA, seed=rows_before, penalty_state=state)
        seeded = RowSampling(temperature=0.8, seed=21, output_index=4,
                             penalties=Penalties(slot, presence=0.5, frequency=0.5, repetition=1.3),
                             logit_bias=LogitBias(np.array([14, 21]), np.array([3.0, -2.0], np.float32)))
        rows = [RowSampling(temperature=1.0)] * rows_before + [seeded, RowSampling(temperature=0.0)]
        batch_logits = torch.cat([logits[1 : 1 + rows_before], logits[:1], logits[5:]])
        mask = masked_rows(1, [allowed])
        mask = TokenMask([rows_before], mask.bitmask)
        return sampler(batch_logits, rows, [PenaltySlotInit(slot, init.prompt_token_ids, init.output_token_ids)],
                       mask).token_ids[rows_before]

    alone = draw(0, 0)
    assert alone % 7 == 0
    assert all(draw(n, slot) == alone for n, slot in [(1, 5), (3, 2), (4, 7)])


def test_float32_penalized_greedy_tokens_match_transformers(tiny_qwen3_dir: Path) -> None:
    llm = LLM(str(tiny_qwen3_dir), dtype="float32", device="cuda", max_model_len=256,
              block_size=16, kv_cache_blocks=64, max_num_seqs=16)
    prompts = [p for p in PROMPTS for _ in CASES]
    params = CASES * len(PROMPTS)
    ours = [o.token_ids for o in llm.generate(prompts, params)]
    assert ours == [hf_greedy(tiny_qwen3_dir, p, c, "cuda") for p, c in zip(prompts, params, strict=True)]


@pytest.mark.parametrize("eager", [False, True])
def test_constrained_outputs_are_valid_on_cuda(tiny_qwen3_dir: Path, eager: bool) -> None:
    llm = LLM(str(tiny_qwen3_dir), dtype="bfloat16", device="cuda", max_model_len=256, enforce_eager=eager,
              block_size=16, kv_cache_blocks=256, max_num_seqs=128)
    prompts, params, kinds = [], [], []
    for name, (constraint, _) in KINDS.items():
        for seed in range(32):
            prompts.append([5 + seed, 6, 7])
            params.append(SamplingParams(temperature=1.0, seed=seed, max_tokens=64, structured_output=constraint,
                                         presence_penalty=0.3 if seed % 2 else 0.0))
            kinds.append(name)
    num_stopped = 0
    for kind, out in zip(kinds, llm.generate(prompts, params), strict=True):
        if out.finish_reason is FinishReason.STOP:
            num_stopped += 1
            assert KINDS[kind][1](out.text), (kind, out.text)
        else:
            assert out.finish_reason is FinishReason.LENGTH
    assert num_stopped >= len(prompts) * 2 // 3
    schema = StructuredOutput(json_schema=json.dumps({"type": "object", "properties": {"n": {"type": "integer"}},
                                                      "required": ["n"]}))
    out = llm.generate([[1, 2]], SamplingParams(temperature=0.0, max_tokens=32, structured_output=schema))[0]
    assert out.finish_reason is FinishReason.LENGTH or re.fullmatch(r'\{"n": -?\d+\}', out.text)


def test_float32_prompt_logprobs_match_transformers(tiny_qwen3_dir: Path) -> None:
    """Over chunked prefill (16-token budget, 60-token prompt), with graphs for steps with prefill where they run."""
    llm = LLM(str(tiny_qwen3_dir), dtype="float32", device="cuda", max_model_len=256, block_size=16,
              kv_cache_blocks=64, max_num_seqs=4, max_num_batched_tokens=16)
    prompt = list(range(100, 160))
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=2))[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        expected = model(torch.tensor([prompt], device="cuda")).logits[0].log_softmax(-1).cpu()
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    ours = [e.logprob for e in out.prompt_logprobs[1:]]
    assert ours == pytest.approx([expected[t - 1, prompt[t]].item() for t in range(1, len(prompt))], abs=1e-3)
