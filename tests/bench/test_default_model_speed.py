"""bench.default_model_speed: contenders take turns on each prompt (a load change falls on all alike), a warm-up
request each first, and the summary's speeds follow from the times by hand; our contender runs a real engine, with
speculative decoding where asked; llama.cpp's (against a stand-in for llama-cpp-python) streams a greedy request of
exactly the tokens asked for."""

import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench.default_model_speed import LlamaCpp, Ours, chat_prompts, run_interleaved
from gpu.config import KernelConfig
from tests.unit.test_cpu_decode import on_gguf_grids


class _Clock:
    """A contender whose requests take fixed times, recording the order of all calls."""

    def __init__(self, name: str, decode_s: float, whole_s: float, log: list[tuple[str, list[int], int]]) -> None:
        self.name, self.decode_s, self.whole_s, self.log = name, decode_s, whole_s, log

    def request(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        self.log.append((self.name, prompt, num_tokens))
        return self.decode_s, self.whole_s


def test_contenders_take_turns_on_each_prompt_after_a_warm_up_each() -> None:
    log: list[tuple[str, list[int], int]] = []
    a, b = _Clock("a", 0.5, 1.0, log), _Clock("b", 2.0, 4.0, log)
    results = run_interleaved([a, b], [[1, 2, 3], [4, 5]], num_tokens=11, repeats=3)
    rounds = [("a", [1, 2, 3], 11), ("b", [1, 2, 3], 11), ("a", [4, 5], 11), ("b", [4, 5], 11)] * 3
    assert log == [("a", [1, 2, 3], 8), ("b", [1, 2, 3], 8)] + rounds
    cpu_ms = results["a"].pop("request_cpu_ms_per_token")
    assert len(cpu_ms) == 6 and all(ms >= 0 for ms in cpu_ms)  # type: ignore[union-attr]
    assert results["a"].pop("request_cpu_ms_per_token_median") in cpu_ms  # type: ignore[operator]
    assert results["a"] == {"decode_tok_s": [20.0] * 6, "decode_tok_s_median": 20.0, "decode_tok_s_best": 20.0,
                            "request_tok_s_median": 11.0}  # 10 tokens after the first in 0.5 s; 11 in 1 s
    assert results["b"]["decode_tok_s_median"] == 5.0


def test_ours_times_a_real_request(tiny_model_dirs: dict[str, Path]) -> None:
    ours = Ours(tiny_model_dirs["llama"], "cpu", "float32")
    decode_s, whole_s = ours.request([5, 6, 7], 6)
    assert 0 < decode_s < whole_s
    assert not ours.engine.has_unfinished_requests()
    assert ours.name == "openai-serve float32 (float32)"


def test_ours_with_the_target_as_its_own_draft_accepts_every_draft(tiny_model_dirs: dict[str, Path]) -> None:
    ours = Ours(tiny_model_dirs["llama"], "cpu", "float32", "draft-self-fixed", num_drafts=3)
    assert ours.name == "openai-serve float32 (float32), speculative draft-self-fixed"
    ours.request([5, 6, 7], 12)
    speculation = ours.figures()["speculation"]
    assert speculation["draft_tokens"] > 0  # type: ignore[index]
    assert speculation["accepted_tokens"] == speculation["draft_tokens"]  # type: ignore[index]
    assert len(speculation["accepted_per_position"]) == 3  # type: ignore[index,arg-type]
    assert "speculation" not in Ours(tiny_model_dirs["llama"], "cpu", "float32").figures()


def test_a_prompt_set_with_a_context_puts_it_before_each_message(tiny_model_dirs: dict[str, Path]) -> None:
    (question,) = chat_prompts(tiny_model_dirs["llama"], "question")
    code_edits = chat_prompts(tiny_model_dirs["llama"], "code_edit")
    assert len(code_edits) == 2 and code_edits[0][:40] == code_edits[1][:40]  # the same file first
    assert min(map(len, code_edits)) > 10 * len(question)


def test_ours_takes_a_kernel_variant_and_says_which_cpu_kernels_ran(tiny_model_dirs: dict[str, Path]) -> None:
    reference = Ours(tiny_model_dirs["llama"], "cpu", "float32:cpu_packed_weights=0+fused_kernels=0")
    assert reference.name == "openai-serve float32:cpu_packed_weights=0+fused_kernels=0 (float32)"
    torch_isa = torch.backends.cpu.get_cpu_capability()
    assert reference.kernels == {"int8_dot": None, "attention": False, "decode_steps": False, "torch": torch_isa}
    assert reference.engine.runner.config.kernels == KernelConfig(cpu_packed_weights=False, fused_kernels=False)
    default = Ours(tiny_model_dirs["llama"], "cpu", "float32")
    # Random weights lie on no GGUF grid: nothing goes through the int8 dot products, so no decode steps either.
    assert default.kernels == {"int8_dot": None, "decode_steps": False, "torch": torch_isa,
                               "attention": default.engine.runner.cpu_kernels.attention is not None}


def test_ours_on_a_gguf_grid_reports_the_int8_dot_products_and_their_instruction_set(tiny_model_dirs: dict[str, Path],
                                                                                     tmp_path: Path) -> None:
    grid = on_gguf_grids(tiny_model_dirs["llama"], tmp_path / "grid")
    ours = Ours(grid, "cpu", "auto")
    kernels = ours.engine.runner.cpu_kernels
    if kernels.int8_dot is None or kernels.attention is None:
        pytest.skip("the C kernels are not built here")
    torch_isa = torch.backends.cpu.get_cpu_capability()
    assert ours.kernels == {"int8_dot": kernels.int8_dot.ISA, "attention": True, "decode_steps": True,
                            "torch": torch_isa}
    avx2 = Ours(grid, "cpu", "auto:cpu_march=haswell")
    assert avx2.engine.runner.config.kernels == KernelConfig(cpu_march="haswell")
    assert avx2.kernels == {"int8_dot": "avx2", "attention": True, "decode_steps": True, "torch": torch_isa}


def test_llama_cpp_streams_a_fresh_greedy_request_with_its_eos_banned(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[int], dict[str, object]]] = []

    class FakeLlama:  # llama-cpp-python's Llama, as far as the contender uses it
        def __init__(self, model_path: str, **settings: object) -> None:
            self.num_resets = 0

        def reset(self) -> None:
            self.num_resets += 1

        def token_eos(self) -> int:
            return 2

        def create_completion(self, prompt: list[int], **settings: object) -> Iterator[dict[str, object]]:
            calls.append((prompt, settings))
            for _ in range(int(settings["max_tokens"])):  # type: ignore[call-overload]
                time.sleep(0.002)
                yield {"choices": [{"text": "x"}]}

    system_info = b"CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | AVX512 = 0 | AVX512_VNNI = 0 | OPENMP = 1 | "
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama,
                                                                          llama_print_system_info=lambda: system_info))
    contender = LlamaCpp(Path("model.Q4_1.gguf"))
    decode_s, whole_s = contender.request([5, 6, 7], 6)
    assert 5 * 0.002 <= decode_s < whole_s  # from the first streamed token to the last: 5 gaps
    assert calls == [([5, 6, 7], {"max_tokens": 6, "temperature": 0.0, "stream": True,
                                  "logit_bias": {2: float("-inf")}})]
    assert contender.model.num_resets == 1 and contender.name == "llama.cpp (model.Q4_1.gguf, AVX AVX2)"


def test_llama_cpp_runs_the_file_the_model_comes_from(tmp_path: Path) -> None:
    from bench.default_model_speed import model_gguf

    assert model_gguf(str(tmp_path / "gemma-3-270m-q4_k_m.gguf")) == tmp_path / "gemma-3-270m-q4_k_m.gguf"
    assert model_gguf(str(tmp_path)) is None  # a checkpoint directory: no GGUF for llama.cpp to run


def test_a_cpu_run_records_the_cpus_flags() -> None:
    from bench.default_model_speed import cpu_description

    cpu = cpu_description()
    if Path("/proc/cpuinfo").is_file():
        assert cpu["flags"] and all(isinstance(flag, str) and " " not in flag for flag in cpu["flags"])
    else:
        assert cpu == {"model": "", "flags": []}


class _Busy:
    """A contender whose requests keep the CPU busy for `cpu_s` seconds."""

    name = "busy"

    def __init__(self, cpu_s: float) -> None:
        self.cpu_s = cpu_s

    def request(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        start = time.process_time()
        while time.process_time() - start < self.cpu_s:
            pass
        return self.cpu_s / 2, self.cpu_s


def test_the_cpu_time_per_token_counts_the_work_a_request_did() -> None:
    results = run_interleaved([_Busy(0.05)], [[1, 2, 3]], num_tokens=10, repeats=2)
    assert all(5.0 <= ms < 50.0 for ms in results["busy"]["request_cpu_ms_per_token"])  # type: ignore[union-attr]
