"""KV memory of a windowed model (CPU): a Gemma 3 context costs its full-attention layers' blocks plus a window.

A tiny Gemma 3 at Gemma 3's own window (512 tokens) and an 8k context: two sliding layers and one full layer. One
request runs a prompt of almost 8k tokens, chunked, then decodes; after each step the blocks it holds are counted per
KV-cache group. The full-attention group holds a block for every token; the windowed group holds the window's
blocks (ceil(W / block_size) + 1 while decoding, and the chunk's while prefilling). The test fails if windowed layers
keep every block. Greedy parity with transformers on windowed families is in test_parity_cpu.py.
"""

from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from core.tiny_model import TinyModelSpec, build_tiny_model

WINDOW = 512
BLOCK = 16
CONTEXT = 8192
CHUNK = 512  # tokens per step


@pytest.fixture(scope="module")
def long_gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinyModelSpec(architecture="gemma3", num_layers=3, seed=11, max_position_embeddings=CONTEXT, overrides=(
        ("sliding_window", WINDOW), ("layer_types", ["sliding_attention", "sliding_attention", "full_attention"]),
        ("query_pre_attn_scalar", 16)))
    return build_tiny_model(tmp_path_factory.mktemp("gemma3-8k") / "gemma3", spec)


def test_windowed_layers_hold_a_window_of_blocks_at_8k_context(long_gemma3_dir: Path) -> None:
    llm = LLM(str(long_gemma3_dir), dtype="float32", block_size=BLOCK, max_model_len=CONTEXT, max_num_seqs=2,
              max_num_batched_tokens=CHUNK)
    engine = llm.engine
    full, windowed = engine.runner.kv_cache_groups
    assert (full.sliding_window, windowed.sliding_window) == (None, WINDOW)
    full_pool, windowed_pool = engine.block_manager.pools
    prompt = torch.randint(3, 500, (CONTEXT - 4,), generator=torch.Generator().manual_seed(0)).tolist()
    engine.add_request("long", prompt, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    held = []  # per step: (the context once the step's K/V are written, full blocks, windowed blocks, chunk)
    for _ in range(CONTEXT // CHUNK + 8):  # the prompt's chunks, the decodes and a step in flight
        engine.step()
        for seq in engine.scheduler.running:
            num_windowed = sum(b != windowed_pool.null_block for b in seq.block_tables[1])
            held.append((seq.num_computed_tokens, len(seq.block_tables[0]), num_windowed))
    assert not engine.has_unfinished_requests()
    window_blocks = -(-WINDOW // BLOCK) + 1
    for context, num_full, num_windowed in held:
        assert num_full == -(-context // BLOCK)
        assert num_windowed <= window_blocks + CHUNK // BLOCK
    context, num_full, num_windowed = held[-1]  # the last decode step: an 8k context
    assert context == CONTEXT - 1 and num_full == CONTEXT // BLOCK
    assert num_windowed <= window_blocks
    decode_steps = [h for h in held if h[0] > len(prompt)]
    assert decode_steps and all(num_windowed <= window_blocks for _, _, num_windowed in decode_steps)
    # Beside one sequence's blocks the groups hold nothing: what each pool has in use is what the sequence held.
    assert full_pool.num_blocks - full_pool.num_available_blocks == 0  # finished: freed (cached, evictable)
    # The windowed layers' tensors are sized for windows (max_num_seqs of them and two steps' chunks), not contexts.
    sliding_layer = engine.runner.model.attention_layers()[0]
    assert sliding_layer.k_cache.shape[0] == windowed.num_blocks + 1  # and its null block
    assert windowed.num_blocks <= 2 * (window_blocks + 1) + 2 * CHUNK // BLOCK < CONTEXT // BLOCK
    assert full.num_blocks >= 2 * CONTEXT // BLOCK
