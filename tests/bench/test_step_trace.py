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
