"""The `auto` attention choice on a GPU with two candidates (triton and flash-attn): the first engine times them and
remembers the choice under its cache directory; a second with the same setting reads it, times nothing, builds the
same backends and generates the same tokens. The file's rules are tests/unit/test_remembered_backends.py's."""

import importlib.util
import logging
from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from gpu import backend_choice
from tests.parity.test_parity_cpu import prompts_of_lengths

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None
    or importlib.util.find_spec("flash_attn.cute") is None, reason="needs CUDA and flash-attn (two candidates)")


def test_a_second_start_reads_the_choice_the_first_measured(tiny_model_dirs: dict[str, Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpu.model_runner")
    prompts, params = prompts_of_lengths((5, 40, 300)), SamplingParams(temperature=0.0, max_tokens=8)

    def start() -> LLM:
        return LLM(str(tiny_model_dirs["qwen3"]), dtype="bfloat16", device="cuda", attention_backend="auto",
                   block_size=16, kv_cache_blocks=2048, max_num_seqs=16, max_num_batched_tokens=512,
                   download_dir=str(tmp_path))

    first = start()
    runner = first.engine.runner
    assert runner.attention_times is not None and set(runner.attention_times["decode"]) == {"triton", "flash-attn"}
    (path,) = (tmp_path / "attention-backends").iterdir()
    assert f"measured now, remembered in {path}" in caplog.text
    choice, times = (runner.backend.decode.name, runner.backend.prefill.name), runner.attention_times
    tokens = [o.token_ids for o in first.generate(prompts, params)]
    del first, runner
    torch.cuda.empty_cache()

    caplog.clear()
    monkeypatch.setattr(backend_choice, "time_forward", lambda *args, **kwargs: pytest.fail("timed again"))
    second = start()
    assert (second.engine.runner.backend.decode.name, second.engine.runner.backend.prefill.name) == choice
    assert second.engine.runner.attention_times == times
    assert f"read from {path}, measured on" in caplog.text
    assert [o.token_ids for o in second.generate(prompts, params)] == tokens
