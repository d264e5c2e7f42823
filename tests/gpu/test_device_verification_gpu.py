"""Verifying steps laid out on the device, on CUDA: the layout (Triton drafts) equals the CPU's (torch drafts) on the
same histories, and in float32 the engine's greedy output equals the output without speculation, each such step
launched while the one before it is in flight (tests/unit/test_device_verification.py on the CPU)."""

import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from core import LLM  # noqa: E402
from core.engine import LLMEngine  # noqa: E402
from core.tiny_model import build_tiny_model  # noqa: E402
from gpu.device_verification import DeviceVerifyBatch, device_inputs, lay_out, step_shape  # noqa: E402
from gpu.token_history import HistoryFill, TokenHistory  # noqa: E402
from tests.tiny_specs import TINY_SPECS  # noqa: E402
from tests.unit.ngram_draft_cases import looping_case, random_case  # noqa: E402
from tests.unit.test_device_verification import (  # noqa: E402
    CODE_EDIT,
    PLAIN,
    REPEATING,
    DeviceSteps,
    greedy,
    named,
    run,
)

COMMON = dict(max_model_len=512, block_size=16, kv_cache_blocks=256, max_num_seqs=16, max_num_batched_tokens=256,
              device="cuda", dtype="float32")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("devverify-gpu") / "qwen3", TINY_SPECS["qwen3"])


def engine(model_dir: Path, speculative: bool) -> LLMEngine:
    config = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False, "prompt_lookup_max": 3}
    return LLM(str(model_dir), speculative_config=config if speculative else None, **COMMON).engine  # type: ignore


def test_layout_on_cuda_equals_the_cpus() -> None:
    rng = random.Random(0)
    for index in range(40):
        case = random_case(rng, max_length=200) if index % 2 else looping_case(rng)
        k, bs = case.max_drafts, 16
        batch = DeviceVerifyBatch(
            slots=list(range(len(case.rows)))[::-1], sampling=[], num_drafts=k, min_n=case.min_n, max_n=case.max_n,
            block_tables=[rng.sample(range(100), -(-(len(row) + k) // bs)) for row in case.rows], max_context_len=300)
        laid_out = []
        for device in (torch.device("cpu"), torch.device("cuda")):
            history = TokenHistory(len(case.rows), 256, device)
            history.fill([HistoryFill(slot, 0, row) for slot, row in zip(batch.slots, case.rows, strict=True)])
            inputs = lay_out(history, device_inputs(batch, device), step_shape(batch, bs))
            laid_out.append([t.tolist() for t in (inputs.token_ids, inputs.positions, inputs.meta.slot_mapping,
                                                  inputs.meta.context_lens, inputs.drafts, inputs.num_drafts)])
        assert laid_out[0] == laid_out[1], case


def test_float32_output_equals_output_without_drafts_and_steps_overlap(model_dir: Path) -> None:
    requests = named(REPEATING + CODE_EDIT + PLAIN, greedy(64))
    speculating = engine(model_dir, True)
    steps = DeviceSteps(speculating)
    assert run(speculating, requests) == run(engine(model_dir, False), requests)
    assert speculating.speculation.counts.num_accepted_tokens > 20  # type: ignore[union-attr]
    assert steps.num_launched > 10 and steps.num_overlapped >= steps.num_launched - 2


def test_a_request_arriving_mid_run(model_dir: Path) -> None:
    first, second = named(CODE_EDIT, greedy(64)), {"late": (REPEATING[2], greedy(40))}
    speculating = engine(model_dir, True)
    steps = DeviceSteps(speculating)
    assert run(speculating, first, later={8: second}) == run(engine(model_dir, False), {**first, **second})
    assert steps.num_rows > steps.num_launched
