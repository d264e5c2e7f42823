"""Runs a pooling model's steps: prompts in, one pooled output per finished prompt out (gpu/pooling.py).

Every step is prefill only: nothing is sampled, nothing decodes, so there is no sampler, no penalty
state and no CUDA graph (a step is a few large matrix products). A decoder (Qwen3-Embedding, a
Qwen3-Reranker) runs as for generation: its prompts' K/V go to the paged cache, chunked prompts and
prefix-cache hits read it back, through the prefill backend (on CUDA flash-attn where it can run, else
triton; on a CPU the cpu backend). An encoder (BERT, XLM-RoBERTa, ModernBERT) keeps no cache: a
prompt runs whole in one step (gpu/layers/encoder_attention.py), and its KV blocks are bookkeeping
only (its blocks are what max_num_seqs full contexts need; no memory stands behind them). Every layer is in one
KV-cache group, a windowed one too (its window's start masks what it does not see): a prompt's blocks are freed
with it, so freeing them earlier would gain little.

One process only: tensor parallelism is for generation.
"""

import logging
import time

import numpy as np
import torch

from gpu import kv_cache
from gpu.attention.backend import PhasedBackend, backend_named, candidate_names
from gpu.batch import Batch, PoolingRow, StepResult, TokenMask
from gpu.config import RunnerConfig
from gpu.host_to_device import to_device
from gpu.kv_cache_groups import KVCacheGroup
from gpu.model_info import checkpoint_dtype, load_hf_config
from gpu.model_runner import build_model, resolve_device, resolve_dtype, step_inputs
from gpu.pooling import Pooler, PoolerHead, PoolingSlots

logger = logging.getLogger(__name__)

ONE_GROUP = (None,)  # the windows of its KV-cache groups: one, keeping every block


class PendingPooled:
    """A launched step's pooled outputs on their way to the host."""

    def __init__(self, pooled: torch.Tensor | None) -> None:
        self._host = None if pooled is None else pooled.to("cpu", non_blocking=True)
        self._ready: torch.cuda.Event | None = None
        if pooled is not None and pooled.is_cuda:
            self._ready = torch.cuda.Event()
            self._ready.record()

    def result(self) -> StepResult:
        if self._ready is not None:
            self._ready.synchronize()
        return StepResult([], [], pooled=[] if self._host is None else list(self._host.numpy()))


class PoolingRunner:
    def __init__(self, config: RunnerConfig, pooler: Pooler) -> None:
        if config.tensor_parallel_size != 1:
            raise ValueError("pooling models run on one device (tensor_parallel_size 1)")
        if config.is_fp8_kv_cache:
            raise ValueError("pooling models keep their KV cache in the model's dtype: kv_cache_dtype fp8 is for "
                             "generation")
        self.config, self.pooler = config, pooler
        self.device = resolve_device(config.device)
        hf_config = load_hf_config(config.model_path)
        self.dtype = resolve_dtype(config.dtype, checkpoint_dtype(hf_config), self.device)
        start = time.perf_counter()
        self.model = build_model(config, hf_config, self.device, self.dtype)
        logger.info("loaded the pooling model (%s, %s pooling, %s head) in %.1f s", type(self.model).__name__,
                    pooler.method, pooler.head, time.perf_counter() - start)
        self.is_encoder = bool(getattr(self.model, "is_encoder", False))
        self.slots = PoolingSlots(config.max_num_seqs, hf_config.hidden_size, self.device)
        num_blocks = self._virtual_blocks() if self.is_encoder else self._allocate_kv_cache()
        self.kv_cache_groups = (KVCacheGroup(None, num_blocks),)
        self._run_first_step()

    def _virtual_blocks(self) -> int:
        c = self.config
        num_blocks = c.num_kv_blocks or c.max_num_seqs * -(-c.max_model_len // c.block_size)
        logger.info("an encoder keeps no KV cache: %d blocks of bookkeeping only", num_blocks)
        return num_blocks

    def _allocate_kv_cache(self) -> int:
        c = self.config
        layers = self.model.attention_layers()
        names, _ = candidate_names(c.attention_backend, self.device, self.dtype)
        # Prefill steps only: flash-attn where it is a candidate (its varlen kernel), else the one there is.
        backend = backend_named("flash-attn" if "flash-attn" in names else names[0])
        for layer in layers:
            layer.backend = PhasedBackend(backend, backend)
        block_bytes = kv_cache.bytes_per_block(layers, c.block_size, self.dtype)
        if c.num_kv_blocks is None and self.device.type == "cuda":
            num_tokens = min(c.max_num_batched_tokens, c.max_model_len)
            kv_cache.allocate(layers, [-(-num_tokens // c.block_size)], ONE_GROUP, c.block_size, self.dtype,
                              self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.launch(_dummy_batch([num_tokens], c.block_size)).result()
        num_blocks, = kv_cache.num_blocks_per_group(c, ONE_GROUP, [block_bytes], self.device)
        kv_cache.allocate(layers, [num_blocks], ONE_GROUP, c.block_size, self.dtype, self.device)
        logger.info("KV cache: %d blocks of %d tokens; attention backend %s (prefill steps only)", num_blocks,
                    c.block_size, backend.name)
        return num_blocks

    def _run_first_step(self) -> None:
        """A prompt's step before the first request, so that its one-time costs are not a request's."""
        c = self.config
        self.launch(_dummy_batch([min(c.block_size, c.max_model_len)] * 2, c.block_size)).result()

    @torch.inference_mode()
    def launch(self, batch: Batch) -> PendingPooled:
        input_ids, positions, meta = step_inputs(batch, self.device)
        if self.is_encoder:
            token_types = None
            if batch.token_type_ids is not None:
                token_types = to_device(np.asarray(batch.token_type_ids), np.int64, self.device)
            hidden = self.model(input_ids, positions, meta, token_types)
        else:
            hidden = self.model(input_ids, positions, meta)
        if not any(row.ends_prompt for row in batch.pooling):
            self.slots.pool(hidden, batch, self.pooler.method)  # leaves the chunks' state in the slots
            return PendingPooled(None)
        return PendingPooled(self._head(self.slots.pool(hidden, batch, self.pooler.method)))

    def _head(self, pooled: torch.Tensor) -> torch.Tensor:
        """[rows, output size] float32 (see gpu/pooling.py)."""
        if self.pooler.head is PoolerHead.CLASSIFY:
            return self.model.classify(pooled.to(self.dtype)).float()
        if self.pooler.head is PoolerHead.TOKEN_LOGITS:
            token_ids = to_device(np.asarray(self.pooler.token_ids), np.int64, self.device)
            return self.model.compute_logits(pooled.to(self.dtype))[:, token_ids].float()
        return pooled

    def sample_masked(self, pending: object, token_mask: TokenMask) -> PendingPooled:
        raise RuntimeError("a pooling model samples nothing: no step waits for token masks")

    def close(self) -> None:
        """Nothing to stop: one process."""

    def restarted(self) -> "PoolingRunner":
        return self


def _dummy_batch(prompt_lens: list[int], block_size: int) -> Batch:
    """Whole prompts of token 0 that write nothing to the cache (slot -1) and read block 0."""
    num_tokens = sum(prompt_lens)
    return Batch(
        token_ids=[0] * num_tokens, positions=[p for n in prompt_lens for p in range(n)],
        slot_mapping=[-1] * num_tokens, query_lens=prompt_lens, context_lens=prompt_lens,
        block_tables=[[0] * -(-n // block_size) for n in prompt_lens], sampling=[None] * len(prompt_lens),
        pooling=[PoolingRow(i, n, True, True) for i, n in enumerate(prompt_lens)],
    )
