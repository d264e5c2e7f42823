"""bench.default_model_speed: contenders take turns (a load change falls on all alike), a warm-up request each
first, and the summary's speeds follow from the times by hand; our contender runs a real engine."""

from pathlib import Path

from bench.default_model_speed import Ours, run_interleaved


class _Clock:
    """A contender whose requests take fixed times, recording the order of all calls."""

    def __init__(self, name: str, decode_s: float, whole_s: float, log: list[tuple[str, int]]) -> None:
        self.name, self.decode_s, self.whole_s, self.log = name, decode_s, whole_s, log

    def request(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        self.log.append((self.name, num_tokens))
        return self.decode_s, self.whole_s


def test_contenders_take_turns_after_a_warm_up_each() -> None:
    log: list[tuple[str, int]] = []
    a, b = _Clock("a", 0.5, 1.0, log), _Clock("b", 2.0, 4.0, log)
    results = run_interleaved([a, b], [1, 2, 3], num_tokens=11, repeats=3)
    assert log == [("a", 8), ("b", 8)] + [("a", 11), ("b", 11)] * 3
    assert results["a"] == {"decode_tok_s": [20.0] * 3, "decode_tok_s_median": 20.0, "decode_tok_s_best": 20.0,
                            "request_tok_s_median": 11.0}  # 10 tokens after the first in 0.5 s; 11 in 1 s
    assert results["b"]["decode_tok_s_median"] == 5.0


def test_ours_times_a_real_request(tiny_model_dirs: dict[str, Path]) -> None:
    ours = Ours(tiny_model_dirs["llama"], "cpu", "float32")
    decode_s, whole_s = ours.request([5, 6, 7], 6)
    assert 0 < decode_s < whole_s
    assert not ours.engine.has_unfinished_requests()
    assert ours.name == "openai-serve float32 (float32)"
