"""bench/step_trace.py: a step's ideal cost is the roofline's, whatever mix of prefill and decode rows it has."""

from bench.roofline import DeviceLimits, ModelShape, decode_cost, prefill_cost
from bench.step_trace import StepRecord, breakdown, category, sample_step, step_cost
from gpu.batch import Batch, RowSampling

SHAPE = ModelShape(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                   vocab_size=1000, tie_word_embeddings=True)
LIMITS = DeviceLimits(copy_bytes_per_s=1e9, matmul_flops_per_s=1e10)


def _batch(query_lens: list[int], context_lens: list[int]) -> Batch:
    n = sum(query_lens)
    return Batch(token_ids=[0] * n, positions=[0] * n, slot_mapping=[0] * n, query_lens=query_lens,
                 context_lens=context_lens, block_tables=[[0]] * len(query_lens),
                 sampling=[RowSampling()] * len(query_lens))


def test_decode_step_costs_what_the_roofline_says() -> None:
    s = sample_step(_batch([1, 1, 1], [10, 20, 30]))
    assert step_cost(SHAPE, s) == decode_cost(SHAPE, [10, 20, 30])
    assert category(s) == "decode 1-16 rows"


def test_whole_prompt_prefill_costs_what_the_roofline_says() -> None:
    s = sample_step(_batch([7, 5], [7, 5]))
    assert s.num_attention_pairs == 7 * 8 // 2 + 5 * 6 // 2
    cost, expected = step_cost(SHAPE, s), prefill_cost(SHAPE, [7, 5])
    assert cost.num_flops == expected.num_flops and cost.num_bytes == expected.num_bytes
    assert category(s) == "with prefill"


def test_breakdown_times_each_step_from_the_previous_steps_tokens_to_its_own() -> None:
    steps = [StepRecord(_batch([4], [4]), 1.0, 0.1, 1.5), StepRecord(_batch([1], [5]), 1.1, 0.2, 1.75),
             StepRecord(_batch([1], [6]), 1.6, 0.3, 2.0)]
    rows = breakdown(steps, SHAPE, LIMITS)
    assert [r["category"] for r in rows] == ["with prefill", "decode 1-16 rows"]
    assert rows[0]["wall_s"] == 0.5 and rows[1]["wall_s"] == 0.5 and rows[1]["steps"] == 2
    assert abs(rows[1]["wait_s"] - 0.5) < 1e-9


class _Stamp:
    """A recorded CUDA event's one use here: milliseconds to a later one (this box has no GPU)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def elapsed_time(self, later: "_Stamp") -> float:
        return (later.seconds - self.seconds) * 1e3

    def synchronize(self) -> None:
        pass


def test_a_device_timeline_splits_each_step_into_device_time_and_the_idle_time_before_it() -> None:
    events = [(0.0, 0.3), (0.4, 0.6), (0.6, 1.0)]  # the device idle 0.1 s before the second step
    steps = [StepRecord(_batch([4], [4]), 0.0, 0.1, 0.35, (_Stamp(a), _Stamp(b))) for a, b in events[:1]]
    steps += [StepRecord(_batch([1], [5 + i]), 0.1, 0.1, 0.7 + 0.35 * i, (_Stamp(a), _Stamp(b)))
              for i, (a, b) in enumerate(events[1:])]
    rows = breakdown(steps, SHAPE, LIMITS)
    assert abs(rows[0]["device_s"] - 0.3) < 1e-9 and rows[0]["device_idle_s"] == 0.0
    assert abs(rows[1]["device_s"] - 0.6) < 1e-9 and abs(rows[1]["device_idle_s"] - 0.1) < 1e-9
    assert abs(rows[1]["device_ms_per_step"] - 300.0) < 1e-6


def test_without_every_steps_events_the_breakdown_has_no_device_columns() -> None:
    steps = [StepRecord(_batch([4], [4]), 1.0, 0.1, 1.5, (_Stamp(1.0), _Stamp(1.4))),
             StepRecord(_batch([1], [5]), 1.1, 0.2, 1.75)]
    assert all("device_s" not in row for row in breakdown(steps, SHAPE, LIMITS))
