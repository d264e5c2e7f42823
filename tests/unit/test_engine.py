"""LLMEngine on the tiny model: the checks its front ends make (its limits), aborts, finish reasons,
seeded sampling."""

from pathlib import Path

import numpy as np
import pytest
import torch

from core import LLM, FinishReason, RequestRejected, SamplingParams
from core.engine import LLMEngine
from gpu.batch import Batch, RowSampling, TokenMask


@pytest.fixture(scope="module")
def engine(tiny_qwen3_dir: Path) -> LLMEngine:
    llm = LLM(str(tiny_qwen3_dir), dtype="float32", max_model_len=256, block_size=16, kv_cache_blocks=64,
              max_num_seqs=8, max_num_batched_tokens=64)
    return llm.engine


def run_all(engine: LLMEngine) -> dict[str, list]:
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert engine.stats().num_used_blocks == 0
    return outputs


def tokens_of(outputs: list) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


@pytest.mark.parametrize(
    ("prompt", "params", "param"),
    [
        ([], SamplingParams(), "prompt"),
        ([1, 2, 100_000], SamplingParams(), "prompt"),
        ([-1], SamplingParams(), "prompt"),
        (list(range(3, 259)), SamplingParams(), "prompt"),
        ([5] * 200, SamplingParams(max_tokens=57), "max_tokens"),
    ],
)
def test_requests_that_can_never_fit_are_refused(engine: LLMEngine, prompt: list[int], params: SamplingParams,
                                                 param: str) -> None:
    with pytest.raises(RequestRejected) as error:
        engine.limits.check(prompt, params)
    assert error.value.param == param
    assert not engine.has_unfinished_requests()


def test_request_needing_more_blocks_than_exist_is_refused(tiny_qwen3_dir: Path) -> None:
    small = LLM(str(tiny_qwen3_dir), block_size=16, kv_cache_blocks=4)
    with pytest.raises(RequestRejected, match="KV-cache blocks"):
        small.generate([[5] * 50], SamplingParams(max_tokens=20))


def test_default_max_tokens_is_the_rest_of_the_context(engine: LLMEngine) -> None:
    engine.add_request("rest", [7] * 250, SamplingParams(temperature=1.0, max_tokens=None, ignore_eos=True, seed=1))
    (last, *_) = reversed(run_all(engine)["rest"])
    assert last.finish_reason is FinishReason.LENGTH and last.num_output_tokens == 6


def test_abort_frees_blocks_and_reports_abort(engine: LLMEngine) -> None:
    engine.add_request("running", [9] * 40, SamplingParams(max_tokens=100, ignore_eos=True))
    engine.add_request("waiting", [8] * 40, SamplingParams(max_tokens=100, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.stats().num_used_blocks > 0
    engine.abort_request("running")
    engine.abort_request("waiting")
    engine.abort_request("never-existed")
    outputs = engine.step()
    assert {o.request_id: o.finish_reason for o in outputs} == {"running": FinishReason.ABORT,
                                                                  "waiting": FinishReason.ABORT}
    assert engine.stats().num_used_blocks == 0 and not engine.has_unfinished_requests()


def test_abort_right_after_add_is_not_lost(engine: LLMEngine) -> None:
    engine.add_request("quick", [4] * 10, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.wait_for_work(timeout=1.0)
    engine.abort_request("quick")
    outputs = run_all(engine)
    assert [o.finish_reason for o in outputs["quick"]] == [FinishReason.ABORT]


def test_max_tokens_min_tokens_and_stop_token_ids(engine: LLMEngine) -> None:
    engine.add_request("free", [11, 12, 13], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    free_tokens = tokens_of(run_all(engine)["free"])
    stop_id = free_tokens[4]
    first = free_tokens.index(stop_id)
    engine.add_request("stop", [11, 12, 13], SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=(stop_id,)))
    engine.add_request("late", [11, 12, 13], SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=(stop_id,),
                                                           min_tokens=first + 2, ignore_eos=True))
    outputs = run_all(engine)
    assert tokens_of(outputs["stop"]) == free_tokens[: first + 1]
    assert outputs["stop"][-1].finish_reason is FinishReason.STOP
    late = tokens_of(outputs["late"])
    assert len(late) >= first + 2 and stop_id not in late[: first + 2]


def test_min_tokens_bans_eos(engine: LLMEngine) -> None:
    generator = torch.Generator().manual_seed(0)
    prompts = {str(n): torch.randint(3, 500, (n,), generator=generator).tolist() for n in range(1, 25)}
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=40))
    stopped = {rid: len(tokens_of(outs)) for rid, outs in run_all(engine).items()
               if outs[-1].finish_reason is FinishReason.STOP}
    assert stopped, "some greedy generations end at EOS"
    for request_id, length in stopped.items():
        engine.add_request(request_id, prompts[request_id], SamplingParams(temperature=0.0, max_tokens=40,
                                                                            min_tokens=length + 3))
    for request_id, outs in run_all(engine).items():
        tokens = tokens_of(outs)
        assert len(tokens) >= stopped[request_id] + 3
        assert not set(tokens[: stopped[request_id] + 3]) & set(engine.eos_token_ids)


def test_logprobs_come_with_each_token(engine: LLMEngine) -> None:
    engine.add_request("lp", [30, 31, 32], SamplingParams(temperature=0.0, max_tokens=5, logprobs=3, ignore_eos=True))
    outputs = run_all(engine)["lp"]
    logprobs = [lp for out in outputs for lp in out.new_logprobs]
    assert len(logprobs) == 5
    assert all(lp is not None and lp.rank == 1 and len(lp.top_token_ids) == 3 for lp in logprobs)
    assert [lp.top_token_ids[0] for lp in logprobs] == tokens_of(outputs)


def test_seeded_sampling_alone_equals_in_a_batch(engine: LLMEngine) -> None:
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=42, max_tokens=20, ignore_eos=True)
    engine.add_request("alone", [50, 51, 52, 53], seeded)
    alone = tokens_of(run_all(engine)["alone"])
    for i in range(5):
        engine.add_request(f"other{i}", [60 + i] * (3 + 7 * i), SamplingParams(temperature=1.0, max_tokens=25))
    engine.step()
    engine.add_request("batched", [50, 51, 52, 53], seeded)
    engine.add_request("other-seeded", [50, 51, 52, 53], SamplingParams(temperature=1.0, seed=7, max_tokens=20,
                                                                        ignore_eos=True))
    outputs = run_all(engine)
    assert tokens_of(outputs["batched"]) == alone
    assert tokens_of(outputs["other-seeded"]) != alone


def test_prompt_strings_are_tokenized_by_llm(tiny_qwen3_dir: Path) -> None:
    llm = LLM(str(tiny_qwen3_dir))
    (out,) = llm.generate("Hello! How are you today?", SamplingParams(temperature=0.0, max_tokens=8))
    assert out.prompt_token_ids == llm.tokenizer.encode("Hello! How are you today?")
    assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_a_step_with_token_masks_runs_to_its_result_with_them(engine: LLMEngine) -> None:
    """gpu.runner.run_step (ModelRunner.execute): a batch that waits for masks is sampled with them."""
    vocab = engine.runner.model.lm_head.weight.shape[0]
    row = RowSampling(temperature=0.0, has_token_mask=True)
    batch = Batch(token_ids=[5, 6, 7], positions=[0, 1, 2], slot_mapping=[-1] * 3, query_lens=[3], context_lens=[3],
                  block_tables=[[0]], sampling=[row], has_token_masks=True)
    bitmask = np.zeros((1, -(-vocab // 32)), dtype=np.int32)
    bitmask[0, 1] = 1 << 9  # only token 41 allowed
    assert engine.runner.execute(batch, TokenMask([0], bitmask)).token_ids == [41]
    with pytest.raises(AssertionError, match="pass them"):
        engine.runner.execute(batch)
