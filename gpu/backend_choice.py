"""`auto` attention: per step phase, the backend whose model forward measured faster here, at start-up.

Each candidate runs the whole model's forward on synthetic steps of each phase (gpu/attention/
backend.py), timed the way that phase will run: a step that will replay a CUDA graph is timed on
the device alone (a sleep kernel first, so the host has queued the whole forward before the device
reaches it, as a replay is queued), an eager step from the host's call to the device's end (its
launch cost is part of it). Phase "decode": one row, and max_num_seqs rows, at ~1k tokens of
context; phase "prefill": a loaded server's step, fresh prompts filling the token budget beside decode
rows for three quarters of max_num_seqs (the steps that take much of a busy server's time), and fresh
prompts alone (as a burst of arrivals or a single user's request runs: there the prefill kernel is all
of the attention). Rows sit on cache blocks in a random order, as a served cache's do: a backend can be
faster on consecutive blocks than on scattered ones, and timed on consecutive blocks the choice would
not be the one that serves faster. The sum of a phase's step times decides; ties go to the first
candidate (triton). Contexts read distinct, randomly filled cache blocks (never zeros), and write
nothing (slot -1).
"""

import logging
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpu.attention.backend import AttentionBackend, PhasedBackend
from gpu.batch import Batch, RowSampling

logger = logging.getLogger(__name__)

PHASES = ("decode", "prefill")
TARGET_CONTEXT = 1024
LOADED_DECODE_SHARE = 0.75  # of max_num_seqs: the decode rows beside the prompts of a loaded server's step
FRESH_PROMPTS, FRESH_PROMPT_LEN = 4, 1024
# Tens of milliseconds at a data-center GPU's clock: longer than the host takes to queue one forward.
SLEEP_CYCLES = 100_000_000


@dataclass(frozen=True)
class StepShape:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_kv_blocks: int
    vocab_size: int


def synthetic_steps(shape: StepShape) -> dict[str, list[Batch]]:
    """The steps each phase is timed on, sized to fit the cache and the scheduler's limits."""
    rows, bs = shape.max_num_seqs, shape.block_size
    capacity = shape.num_kv_blocks * bs
    budget = shape.max_num_batched_tokens
    context = max(1, min(TARGET_CONTEXT, shape.max_model_len - 1, capacity // rows - bs))
    # The loaded step: decode rows, then prompts of up to FRESH_PROMPT_LEN in the rest of the budget (half the cache
    # at most), each of the decode rows on the cache that is left.
    decode_rows = max(0, min(int(rows * LOADED_DECODE_SHARE), rows - 1, budget - 1))
    prompt_tokens = max(1, min(budget - decode_rows, capacity // 2))
    loaded_len = max(1, min(FRESH_PROMPT_LEN, prompt_tokens, shape.max_model_len))
    loaded_rows = max(1, min(prompt_tokens // loaded_len, rows - decode_rows))
    loaded_blocks = loaded_rows * -(-loaded_len // bs)
    mixed_context = max(1, min(context, (capacity - loaded_blocks * bs) // max(decode_rows, 1) - bs))
    fresh_rows = max(1, min(FRESH_PROMPTS, rows))
    fresh_len = max(1, min(FRESH_PROMPT_LEN, shape.max_num_batched_tokens // fresh_rows, shape.max_model_len,
                           capacity // fresh_rows - bs))
    vocab = shape.vocab_size
    return {
        "decode": [_step([], 1, context, bs, vocab), _step([], rows, context, bs, vocab)],
        "prefill": [_step([loaded_len] * loaded_rows, decode_rows, mixed_context, bs, vocab),
                    _step([fresh_len] * fresh_rows, 0, context, bs, vocab)],
    }


def _step(prefill_lens: list[int], num_decode_rows: int, context: int, block_size: int, vocab_size: int) -> Batch:
    """Fresh prefill rows, then decode rows with `context` tokens each; every row on its own blocks, in a random order
    (a served cache's rows are scattered over it)."""
    query_lens = prefill_lens + [1] * num_decode_rows
    context_lens = prefill_lens + [context] * num_decode_rows
    blocks_per_row = [-(-n // block_size) for n in context_lens]
    block_ids = list(range(sum(blocks_per_row)))
    random.Random(0).shuffle(block_ids)
    tables, next_block = [], 0
    for num_blocks in blocks_per_row:
        tables.append(block_ids[next_block : next_block + num_blocks])
        next_block += num_blocks
    positions = [p for q, c in zip(query_lens, context_lens, strict=True) for p in range(c - q, c)]
    num_tokens = len(positions)
    return Batch(
        token_ids=[(7 * i) % vocab_size for i in range(num_tokens)], positions=positions,
        slot_mapping=[-1] * num_tokens, query_lens=query_lens, context_lens=context_lens, block_tables=tables,
        sampling=[RowSampling(temperature=0.0)] * len(query_lens),
    )


def blocks_used(steps: dict[str, list[Batch]]) -> int:
    return max(max(b for row in batch.block_tables for b in row) + 1 for batches in steps.values() for batch in batches)


def time_forward(forward: Callable[[], object], is_graphed: bool, repeats: int = 5) -> float:
    """Median milliseconds of `forward` after one untimed call (which compiles what it needs)."""
    forward()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        if is_graphed:
            torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        forward()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


TimeStep = Callable[[AttentionBackend, Batch, bool], float]


def choose_phases(
    candidates: list[AttentionBackend],
    steps: dict[str, list[Batch]],
    is_graphed: Callable[[AttentionBackend, str], bool],
    time_step: TimeStep,
) -> tuple[PhasedBackend, dict[str, dict[str, float]]]:
    """Times every candidate on every phase's steps; returns the choice and the summed milliseconds."""
    step_times: dict[str, dict[str, list[float]]] = {phase: {} for phase in PHASES}
    for phase in PHASES:
        for backend in candidates:
            graphed = is_graphed(backend, phase)
            step_times[phase][backend.name] = [time_step(backend, batch, graphed) for batch in steps[phase]]
    times = {phase: {name: sum(ms) for name, ms in by_backend.items()} for phase, by_backend in step_times.items()}
    by_name = {backend.name: backend for backend in candidates}
    pick = {phase: min(times[phase], key=times[phase].__getitem__) for phase in PHASES}
    for phase in PHASES:
        measured = ", ".join(f"{name} {sum(ms):.3f} ms ({' + '.join(f'{t:.3f}' for t in ms)})"
                             for name, ms in step_times[phase].items())
        logger.info("attention backend for %s steps: %s (measured, per step: %s)", phase, pick[phase], measured)
    return PhasedBackend(by_name[pick["decode"]], by_name[pick["prefill"]]), times
