"""Runs one engine step on the device: batch description in, sampled token ids out.

Owns the model, its KV cache, the sampler and its penalty state. The only host sync of a step is
the copy of the sampled tokens (and logprobs) back to the host.

A batch with token masks (structured output) is launched in two parts: `launch` queues the forward
pass and returns the logits still waiting to be sampled; the caller fills the masks on the host
while the device runs, then `sample_masked` queues the sampling.

Under tensor parallelism one runner runs in each worker process (gpu/tensor_parallel_worker.py), on its
shard of the model, all of them on the same batches. Rank 0 samples from the gathered logits and
broadcasts the sampled tokens, so every rank can feed them back into the next step on its device; the
other ranks take part in every collective (the logits' gathers included) and return no result.
"""

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from tqdm import tqdm
from transformers import PretrainedConfig

from gpu import (
    backend_choice,
    device_verification,
    kv_cache,
    kv_cache_groups,
    remembered_backends,
    state_cache,
    verify_graphs,
)
from gpu.attention.backend import (
    AttentionBackend,
    PhasedBackend,
    backend_named,
    candidate_names,
    without_flash_attn_for_fp8_cache,
)
from gpu.attention.metadata import MAX_QUERIES_AS_ROWS, AttentionMetadata, QueryRows, query_rows_of_host_rows
from gpu.batch import Batch, GroupTables, PackedBlockTables, Penalties, RowSampling, StepResult, TokenMask
from gpu.config import RunnerConfig
from gpu.cpu_decode import CpuDecodeSteps, unavailable_reason
from gpu.cpu_kernels import NO_CPU_KERNELS, CpuKernels, load_cpu_kernels
from gpu.cpu_packing import cpu_packing, first_layer_on_a_grid, has_native_bfloat16, pack_linear_layers
from gpu.cuda_graphs import DecodeGraphs, ForwardFn
from gpu.device_verification import DeviceVerifiedStep, DeviceVerifyBatch
from gpu.distributed import SINGLE, TensorParallel
from gpu.dummy_weights import DEFAULT_STD, init_dummy_weights
from gpu.host_to_device import pack_block_tables, to_device, write_block_tables
from gpu.kernels import HAS_TRITON, gated_gemm
from gpu.kernels.skinny_gemm_configs import FEW_ROWS
from gpu.kv_cache_groups import KVCacheGroup
from gpu.layers.linear import warm_up_skinny_gemm
from gpu.loader import load_weights
from gpu.mixed_graphs import LinearRows, MixedGraphs
from gpu.model_info import checkpoint_dtype, load_hf_config
from gpu.models import model_class
from gpu.models.causal_lm import DecoderStack
from gpu.models.eagle3 import Eagle3Drafter, Eagle3Head, default_aux_layers, read_eagle3_config
from gpu.penalties import PenaltyState
from gpu.pending_step import PendingLogits, PendingStep, SampledRows, feed_back_tokens
from gpu.prompt_logprobs import PackedPromptLogprobs, prompt_logprobs
from gpu.quant import (
    cast_float_params,
    finish_loading,
    quant_scheme,
    quantize_layers,
    warm_up_quantized,
    weight_summary,
)
from gpu.quant.method import QuantScheme
from gpu.runner import run_step
from gpu.sampler import FUSED_DTYPES, GraphDraw, Sampler
from gpu.token_history import TokenHistory
from gpu.verify_graphs import VerifyGraphs

logger = logging.getLogger(__name__)


def resolve_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("device cuda was requested but CUDA is not available")
    return torch.device(requested)


def resolve_dtype(requested: str, checkpoint_dtype: str | None, device: torch.device) -> torch.dtype:
    """The dtype a runner serves in; on a CPU `auto` as it is without the int8 dot-product kernels (`cpu_auto_dtype`
    says what the runner picks with them)."""
    if requested != "auto":
        return getattr(torch, requested)
    if device.type == "cpu":
        return cpu_auto_dtype(checkpoint_dtype, NO_CPU_KERNELS, None)[0]
    return torch.float16 if checkpoint_dtype == "float16" else torch.bfloat16


def cpu_auto_dtype(checkpoint_dtype: str | None, cpu_kernels: CpuKernels, model_dir: Path | None
                   ) -> tuple[torch.dtype, str]:
    """`--dtype auto` on a CPU, and why (for the log). `model_dir`: the checkpoint's files (None: none to read)."""
    if (checkpoint_dtype == "float32" and cpu_kernels.int8_dot is not None and model_dir is not None
            and first_layer_on_a_grid(model_dir)):
        # Its projections go through the int8 dot products at a fifth of float32's bytes, and the rest of the step
        # keeps the reference's precision.
        return torch.float32, ("a float32 checkpoint whose projections lie on a GGUF grid, and the int8 dot-product "
                               f"kernels built ({cpu_kernels.int8_dot.ISA})")
    if has_native_bfloat16():
        # As vLLM's CPU backend: half the bytes a decode step reads, weights packed at load (gpu/cpu_packing.py).
        return torch.bfloat16, "the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX)"
    return torch.float32, "no bfloat16 instructions: its matmuls would be emulated"


class ModelRunner:
    def __init__(self, config: RunnerConfig, tp: TensorParallel = SINGLE) -> None:
        self.tp = tp
        self.device = resolve_device(config.device)
        hf_config = load_hf_config(config.model_path)
        self.cpu_kernels = load_cpu_kernels_for(self.device, config.cache_dir, config.kernels.cpu_march)
        if self.device.type == "cpu" and config.dtype == "auto":
            weights = Path(config.model_path) if config.load_format != "dummy" else None
            self.dtype, why = cpu_auto_dtype(checkpoint_dtype(hf_config), self.cpu_kernels, weights)
            logger.info("dtype auto: %s (%s)", str(self.dtype).removeprefix("torch."), why)
        else:
            self.dtype = resolve_dtype(config.dtype, checkpoint_dtype(hf_config), self.device)
        self.config = config
        self._probe_gated_gemm()
        self.vocab_size = hf_config.vocab_size
        start = time.perf_counter()
        self.model = self._build_model(hf_config)
        logger.info("loaded the weights (%.2f GiB, %s) in %.1f s", _num_bytes(self.model) / 2**30,
                    str(self.dtype).removeprefix("torch."), time.perf_counter() - start)
        # Speculative decoding's draft head (method mtp: the model's own; eagle3: a head of its own checkpoint).
        self.drafter = self._build_drafter(hf_config)
        self.layers = self.model.attention_layers() + (
            [self.drafter.head.layers[0].self_attn] if isinstance(self.drafter, Eagle3Drafter) else [])
        for layer in self.layers:
            layer.cpu_kernels = self._cpu_attention_kernels()
        # Layers with a state per sequence (linear attention): a slot for each sequence that may run.
        self.linear_layers = self.model.linear_attention_layers() if hasattr(self.model, "linear_attention_layers") \
            else []
        self.num_state_slots = config.max_num_seqs if self.linear_layers else 0  # then the snapshots' rows
        head_dims = tuple(layer.head_dim for layer in self.layers)
        names, flash_attn_reason = candidate_names(config.attention_backend, self.device, self.dtype, head_dims)
        self.kv_dtype = torch.float8_e4m3fn if config.is_fp8_kv_cache else self.dtype
        if config.is_fp8_kv_cache:
            for layer in self.layers:
                layer.use_fp8_cache()
            if self.device.type == "cuda":
                names, flash_attn_reason = without_flash_attn_for_fp8_cache(names, config.attention_backend)
        if flash_attn_reason is not None:
            logger.info("attention backend flash-attn not a candidate: %s", flash_attn_reason)
        first = self._backend_named(names[0])
        self._set_backend(PhasedBackend(first, first))  # for the warm-up pass
        # Before the KV cache is sized, so its memory is counted: [max_num_seqs, vocab] int32 + bool.
        self.penalty_state = PenaltyState(config.max_num_seqs, self.vocab_size, self.device)
        self.sampler = Sampler(self.device, config.seed, config.kernels, self.penalty_state)
        # Speculative decoding by prompt lookup, verified in steps laid out on the device (gpu/device_verification.py):
        # [max_num_seqs, max_model_len + 1] int32, allocated before the KV cache is sized too.
        self.token_history = (TokenHistory(config.max_num_seqs, config.max_model_len, self.device)
                              if config.device_ngram is not None else None)
        # The decode graphs' logits when they sample (_samples_in_graphs), counted before the KV cache is sized too.
        # The verify graphs' logits too (gpu/verify_graphs.py), where they may hold more positions than decode rows.
        self._graph_logits = (torch.empty(self._graph_logits_rows(), self.vocab_size, dtype=self.dtype,
                                          device=self.device) if self._samples_in_graphs() else None)
        self.stacked_states = self._allocate_state_cache()  # before the KV cache is sized, so its memory is counted
        self.decode: DecodeGraphs | None = None  # set after the KV cache exists
        self.cpu_decode: CpuDecodeSteps | None = None  # set after the KV cache exists (the warm-up pass runs without)
        self.mixed: MixedGraphs | None = None
        self.verify: VerifyGraphs | None = None  # set after the KV cache exists
        self._last_sampled_ids: torch.Tensor | None = None  # [rows] on the device, of the last launched step
        # Per phase, each candidate's summed step milliseconds when `auto` measured them, now or at an earlier start.
        self.attention_times: dict[str, dict[str, float]] | None = None
        self.target_hidden: torch.Tensor | None = None  # set once the KV cache exists
        self.kv_cache_groups = self._allocate_kv_cache()
        # The draft head's inputs (methods mtp, eagle3): what it reads of the target at each KV slot it computed.
        self.target_hidden = self._allocate_target_hidden(hf_config)
        self._last_mtp_hidden: torch.Tensor | None = None  # [sampled rows, hidden] of the last head step
        self.backend, why = self._choose_backend(names, first, hf_config)
        self._set_backend(self.backend)
        logger.info("attention backend: %s (requested %s, device %s: %s)", self.backend.name, config.attention_backend,
                    self.device, why)
        # An EAGLE-3 head reads the target's layers' inputs, which the CPU's C decode steps do not keep.
        keeps_aux = config.eagle3_head is not None
        if keeps_aux and self.device.type == "cpu":
            logger.info("speculative method eagle3: CPU decode steps run the model's layers (not the C kernels')")
        self.cpu_decode = None if keeps_aux else self._cpu_decode_steps()
        if self.device.type == "cuda":
            start = time.perf_counter()
            self._capture_graphs()
            logger.info("CUDA graph capture took %.1f s", time.perf_counter() - start)
            self._compile_device_steps()
        self._run_first_request_shapes()

    def _compile_device_steps(self) -> None:
        """The layout and acceptance of verifying steps laid out on the device, compiled for every draft length the
        engine may choose, so that no request waits for a compile (where no verify graph takes a step, it runs
        eagerly)."""
        if self.token_history is None or self.config.device_ngram is None:
            return
        max_drafts, min_n, max_n = self.config.device_ngram
        device_verification.warm_up(self.token_history, max_drafts, min_n, max_n, self.config.block_size)

    def _allocate_state_cache(self) -> state_cache.StackedStates | None:
        if not self.linear_layers:
            return None
        # One row more on CUDA: the padded rows of the decode graphs read and write it (gpu/cuda_graphs.py).
        num_rows = self.num_state_slots + self.config.num_state_snapshots + (self.device.type == "cuda")
        slot_bytes = state_cache.bytes_per_slot(self.linear_layers, self.dtype)
        try:
            states = state_cache.allocate(self.linear_layers, num_rows, self.dtype, self.device)
        except torch.OutOfMemoryError as error:
            raise RuntimeError(
                f"no memory for the linear-attention state of {self.num_state_slots} sequences and "
                f"{self.config.num_state_snapshots} snapshots ({num_rows * slot_bytes / 2**30:.2f} GiB): lower "
                "--max-num-seqs or --state-snapshots") from error
        logger.info("linear-attention state: %d layers, %d sequence slots and %d snapshots of %.1f MiB = %.2f GiB",
                    len(self.linear_layers), self.num_state_slots, self.config.num_state_snapshots,
                    slot_bytes / 2**20, num_rows * slot_bytes / 2**30)
        if self.device.type == "cuda" and self.config.kernels.fused_kernels:
            from gpu.layers.gated_deltanet import fla_chunked_rule

            prompts = "flash-linear-attention's chunked kernel" if fla_chunked_rule() else "torch (no fla)"
            logger.info("delta rule: decodes by our Triton kernel, prompts by %s", prompts)
        return states

    def _probe_gated_gemm(self) -> None:
        """Runs quack's gated GEMM once here (layers take it only where this probe found it working) and logs why
        not where it cannot run. A failure an earlier start remembered for this GPU, dtype and packages is taken as
        it is, without compiling or running anything (gpu/remembered_backends.py)."""
        if not self.config.kernels.fused_kernels or self.device.type != "cuda":
            return
        reason = gated_gemm.requirement_unmet(self.device, self.dtype)
        how = "not probed"
        if reason is None:
            directory = Path(self.config.cache_dir) if self.config.cache_dir is not None else None
            setting = {"gpu": torch.cuda.get_device_name(self.device), "dtype": str(self.dtype).removeprefix("torch."),
                       "installed_at": gated_gemm.install_locations()}
            key = remembered_backends.probe_key("gated-gemm", setting, gated_gemm.PROBE_CODE)
            reason, how = remembered_backends.probe_once(directory, key,
                                                         lambda: gated_gemm.probe(self.device, self.dtype))
        if reason is None:
            logger.info("gate/up products of %d+ rows compute SiLU-and-mul in their epilogue (quack's gated GEMM; %s)",
                        gated_gemm.MIN_ROWS, how)
        else:
            logger.info("gated GEMM off: %s (%s)", reason, how)

    def _backend_named(self, name: str) -> AttentionBackend:
        return backend_named(name, self._cpu_attention_kernels())

    def _cpu_attention_kernels(self) -> ModuleType | None:
        """gpu/cpu_kernels/attention.c where it is built and the fused kernels are on (off: the torch reference)."""
        return self.cpu_kernels.attention if self.config.kernels.fused_kernels else None

    def _cpu_decode_steps(self) -> CpuDecodeSteps | None:
        """On a CPU, decode-only steps as a few C kernel calls per layer (gpu/cpu_decode.py) where the model allows;
        logs which and why."""
        if self.device.type != "cpu":
            return None
        int8_dot = self.cpu_kernels.int8_dot if self.config.kernels.cpu_packed_weights else None
        reason = unavailable_reason(self.model, int8_dot, self._cpu_attention_kernels(), self.dtype)
        if reason is not None:
            logger.info("CPU decode steps: the model's layers (not the C kernels' layer steps: %s)", reason)
            return None
        logger.info("CPU decode steps: six C kernel calls per layer")
        assert int8_dot is not None and self.cpu_kernels.attention is not None
        return CpuDecodeSteps(self.model.model, int8_dot, self.cpu_kernels.attention, self.dtype)

    def _set_backend(self, backend: AttentionBackend) -> None:
        for layer in self.layers:
            layer.backend = backend

    def _choose_backend(self, names: list[str], first: AttentionBackend,
                        hf_config: PretrainedConfig) -> tuple[PhasedBackend, str]:
        """The only candidate for both phases, or per phase the one measured faster here (gpu/backend_choice.py) at
        this start or an earlier one (gpu/remembered_backends.py); and why, for the log."""
        backend, why = PhasedBackend(first, first), "the only candidate"
        if len(names) > 1:
            c = self.config
            num_blocks = self.kv_cache_groups[0].num_blocks
            steps = backend_choice.synthetic_steps(backend_choice.StepShape(
                c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len, c.block_size, num_blocks, self.vocab_size))
            if backend_choice.blocks_used(steps) <= num_blocks:
                backend, why = self._remembered_or_measured(names, first, steps, hf_config)
            else:
                why = "the KV cache is too small to time the candidates"
        self._compile_flash_attn(backend)
        return backend, why

    def _remembered_or_measured(self, names: list[str], first: AttentionBackend, steps: dict[str, list[Batch]],
                                hf_config: PretrainedConfig) -> tuple[PhasedBackend, str]:
        """The choice an earlier start remembered for this setting (rank 0's, under tensor parallelism: every rank
        measures or none does, as the forward passes hold collectives), else the one measured now, remembered."""
        directory = Path(self.config.cache_dir) if self.config.cache_dir is not None else None
        key = remembered_backends.choice_key(self._choice_setting(names, steps, hf_config))
        recalled = remembered_backends.recall(directory, key, names) if directory and self.tp.is_first else None
        pair = self._first_rank_pair((recalled.decode, recalled.prefill) if recalled else None, names)
        if pair is not None:
            by_name = {first.name: first} | {name: self._backend_named(name) for name in set(pair) - {first.name}}
            backend = PhasedBackend(by_name[pair[0]], by_name[pair[1]])
            if recalled is None:
                return backend, "rank 0's remembered choice"
            self.attention_times = recalled.times_ms
            return backend, f"read from {recalled.path}, measured on {recalled.measured_on}"
        backend, self.attention_times = self._measure_phases([first, *map(self._backend_named, names[1:])], steps)
        if directory is None or not self.tp.is_first:
            return backend, "measured now"
        saved = remembered_backends.remember(directory, key, backend.decode.name, backend.prefill.name,
                                             self.attention_times)
        return backend, "measured now" + (f", remembered in {saved.path}" if saved is not None else "")

    def _choice_setting(self, names: list[str], steps: dict[str, list[Batch]],
                        hf_config: PretrainedConfig) -> dict[str, object]:
        """What the attention choice was measured for, beside the packages and our code (remembered_backends.py)."""
        c = self.config
        return {
            "gpu": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "model": remembered_backends.model_shape(hf_config), "dtype": str(self.dtype).removeprefix("torch."),
            "kv_cache_dtype": str(self.kv_dtype).removeprefix("torch."), "block_size": c.block_size,
            "max_num_seqs": c.max_num_seqs, "max_model_len": c.max_model_len,
            "max_num_batched_tokens": c.max_num_batched_tokens, "enforce_eager": c.enforce_eager,
            "tensor_parallel_size": self.tp.size, "candidates": names,
            "steps": remembered_backends.steps_digest(steps),
        }

    @torch.inference_mode()
    def _measure_phases(self, candidates: list[AttentionBackend], steps: dict[str, list[Batch]]
                        ) -> tuple[PhasedBackend, dict[str, dict[str, float]]]:
        """Per phase the candidate measured faster (rank 0's under tensor parallelism), and each one's milliseconds."""
        num_blocks = backend_choice.blocks_used(steps)
        for layer in self.layers:  # random contexts: timing on zeros can flatter a kernel
            layer.k_cache[:num_blocks].normal_()
            layer.v_cache[:num_blocks].normal_()

        def is_graphed(backend: AttentionBackend, phase: str) -> bool:
            # (a model with linear-attention layers: its steps with prompts timed eagerly, as those whose rows are
            # past the sequential delta rule run; the synthetic steps' inputs are not the mixed graphs' padded ones)
            graph_safe = backend.supports_cuda_graphs if phase == "decode" else (
                backend.supports_mixed_graphs and not self.linear_layers)
            return graph_safe and not self.config.enforce_eager

        def time_step(backend: AttentionBackend, batch: Batch, graphed: bool) -> float:
            self._set_backend(PhasedBackend(backend, backend))
            inputs = self._prepare(self._in_every_group(batch))
            return backend_choice.time_forward(lambda: self.model(*inputs), graphed)

        backend, times = backend_choice.choose_phases(candidates, steps, is_graphed, time_step)
        for layer in self.layers:
            layer.k_cache[:num_blocks].zero_()
            layer.v_cache[:num_blocks].zero_()
        # Rank 0's choice on every rank: each timed the candidates itself, but a step's collectives must have the same
        # shapes everywhere (a step with prefill replays a padded graph with one backend, runs unpadded with another).
        by_name = {c.name: c for c in candidates}
        shared = self._first_rank_pair((backend.decode.name, backend.prefill.name), list(by_name))
        assert shared is not None  # rank 0 measured too
        return PhasedBackend(by_name[shared[0]], by_name[shared[1]]), times

    def _first_rank_pair(self, pair: tuple[str, str] | None, names: list[str]) -> tuple[str, str] | None:
        """Tensor-parallel rank 0's (decode, prefill) backend names on every rank (None where rank 0 has none)."""
        if self.tp.size == 1:
            return pair
        picks = torch.tensor([names.index(name) for name in pair] if pair else [-1, -1], device=self.device)
        decode, prefill = self.tp.broadcast_from_first(picks).tolist()
        return None if decode < 0 else (names[decode], names[prefill])

    def _compile_flash_attn(self, backend: PhasedBackend) -> None:
        """Every FA4 kernel variant a step can use, compiled now rather than at a request: one layer of each kind
        (heads, head size, window, sinks, soft-cap) the model has."""
        kinds = {}
        for layer in self.layers:
            if layer.owns_kv_cache:
                variant = layer.variant
                kind = (layer.num_heads, layer.head_dim, variant.sliding_window, variant.sinks is None, variant.softcap)
                kinds.setdefault(kind, layer)
        for phase_backend in {id(b): b for b in (backend.decode, backend.prefill)}.values():
            if compile_variants := getattr(phase_backend, "compile_variants", None):
                for layer in kinds.values():
                    compile_variants(layer.num_heads, layer.k_cache, layer.v_cache, layer.scale,
                                     self.config.max_num_seqs, layer.variant)

    def _capture_graphs(self) -> None:
        """Graphs for decode-only steps and, when the backend allows, for steps with prefill (one pool)."""
        c = self.config
        num_groups = len(self.kv_cache_groups)
        padding_state_slot = self.num_state_slots + c.num_state_snapshots if self.linear_layers else None
        self.decode = DecodeGraphs(self.model, c.max_num_seqs, c.max_model_len, c.block_size, self.device,
                                   self.model.compute_logits_into if self._graph_logits is not None else None,
                                   self._graph_logits, num_groups, padding_state_slot)
        if self.backend.supports_mixed_graphs and (not self.linear_layers or self._linear_layers_pad()):
            self.mixed = MixedGraphs(self.model, c.max_num_batched_tokens, c.max_num_seqs, c.max_model_len,
                                     c.block_size, self.device, num_groups, self._linear_rows(padding_state_slot))
        if c.enforce_eager:
            logger.info("CUDA graphs off (--enforce-eager)")
            return
        if self.mixed is not None:
            self.mixed.capture()
            self.decode.pool = self.mixed.pool
        if self.backend.supports_cuda_graphs:
            self.decode.capture()
        else:
            logger.info("CUDA graphs for decode steps off (%s)", self.backend.name)
        self.verify = self._verify_graphs()
        if self.verify is not None:
            self.verify.pool = self.decode.pool  # the mixed graphs' too, which the verify graphs need
            self.verify.capture()

    def _verify_graphs(self) -> VerifyGraphs | None:
        """Graphs of whole verifying steps laid out on the device (gpu/verify_graphs.py): where the runner keeps the
        token history, the decode graphs sample (the verify graphs draw with the same kernel into the same logits
        buffer), the backend's steps of several query tokens a row are safe to capture (as the mixed graphs') and the
        model keeps one KV-cache group and no linear-attention state (as the device layout does)."""
        c = self.config
        if (c.device_ngram is None or self.token_history is None or self._graph_logits is None
                or not self.backend.supports_mixed_graphs or len(self.kv_cache_groups) != 1 or self.linear_layers):
            return None
        from gpu.kernels.sampling import sample_tokens  # noqa: PLC0415 - Triton, only where there is a GPU

        max_drafts, min_n, max_n = c.device_ngram
        positions = verify_graphs.max_positions(c.max_num_seqs, max_drafts, c.max_num_batched_tokens)
        return VerifyGraphs(
            self.token_history, self.model, self.model.compute_logits_into, self._graph_logits[:positions],
            lambda logits, keys, temperatures: sample_tokens(logits, keys, temperatures, use_pdl=True),
            verify_graphs.Lookup(max_drafts, min_n, max_n), c.max_num_seqs, c.max_model_len, c.block_size)

    def _linear_layers_pad(self) -> bool:
        """Whether the linear-attention layers' steps with prompts can run padded (in the mixed graphs): through the
        Triton kernels, whose sequential rows read every index from the device; the torch path (and fla's chunked
        kernel, for longer rows) builds indices on the host."""
        kernels = self.config.kernels
        return kernels.fused_kernels and HAS_TRITON and kernels.sequential_delta_rule_max_tokens > 0

    def _linear_rows(self, padding_state_slot: int | None) -> LinearRows | None:
        """The mixed graphs' state inputs of a model with linear-attention layers (None: no such layer)."""
        if padding_state_slot is None:
            return None
        limit = self.config.kernels.sequential_delta_rule_max_tokens
        return LinearRows(self.num_state_slots, padding_state_slot, limit)

    def _graph_logits_rows(self) -> int:
        """The rows of the graphs' logits buffer: the decode graphs' most rows, or the verify graphs' most positions
        where they are captured and hold more."""
        c = self.config
        if c.device_ngram is None or c.enforce_eager:
            return c.max_num_seqs
        return max(c.max_num_seqs, verify_graphs.max_positions(c.max_num_seqs, c.device_ngram[0],
                                                               c.max_num_batched_tokens))

    def _samples_in_graphs(self) -> bool:
        """Whether the decode graphs compute the logits and draw the tokens too: on CUDA, one GPU (under tensor
        parallelism the logits are gathered to rank 0 only), with the fused sampling kernel."""
        return (self.device.type == "cuda" and self.tp.size == 1 and self.config.kernels.fused_kernels
                and HAS_TRITON and self.dtype in FUSED_DTYPES)

    def _build_model(self, hf_config: PretrainedConfig) -> torch.nn.Module:
        return build_model(self.config, hf_config, self.device, self.dtype, self.tp, self.cpu_kernels)

    def _allocate_kv_cache(self) -> tuple[KVCacheGroup, ...]:
        """Groups the layers by what they keep (gpu/kv_cache_groups.py) and allocates each group's blocks."""
        c = self.config
        windows = kv_cache_groups.group_windows(self.layers, c.max_model_len)
        kv_cache_groups.assign_groups(self.layers, windows, c.max_model_len)
        block_bytes = kv_cache.group_bytes_per_block(self.layers, len(windows), c.block_size, self.kv_dtype)
        if self.drafter is not None and None in windows:  # the draft head's hidden-state cache, per full-group slot
            element_size = torch.empty(0, dtype=self.dtype).element_size()
            width = self._target_hidden_width(self.model.config)
            block_bytes[windows.index(None)] += c.block_size * width * element_size
        if c.num_kv_blocks is None and self.device.type == "cuda":
            self._warm_up(windows)
        counts = kv_cache.num_blocks_per_group(c, windows, block_bytes, self.device)
        counts = [self.tp.min_over_ranks(n, self.device) for n in counts]  # every rank holds the same blocks
        kv_cache.allocate(self.layers, counts, windows, c.block_size, self.kv_dtype, self.device)
        for group, (window, num_blocks, group_bytes) in enumerate(zip(windows, counts, block_bytes, strict=True)):
            # An FP8 cache's scales are each layer's own: the log gives their range over the group's layers.
            scales = (sorted({layer.kv_scales for layer in self.layers if layer.kv_group == group})
                      if c.is_fp8_kv_cache else [])
            logger.info("KV cache, %s: %d blocks of %d tokens = %d tokens, %.2f GiB (%s%s)",
                        "full attention" if window is None else f"sliding window {window}", num_blocks, c.block_size,
                        num_blocks * c.block_size, num_blocks * group_bytes / 2**30,
                        str(self.kv_dtype).removeprefix("torch."),
                        "" if not scales else f", (k, v) scales {scales[0]}"
                        + (f" .. {scales[-1]}" if len(scales) > 1 else ""))
        return tuple(KVCacheGroup(w, n) for w, n in zip(windows, counts, strict=True))

    def _build_drafter(self, hf_config: PretrainedConfig) -> torch.nn.Module | None:
        """The draft head: the model itself for method mtp (built with its head), an Eagle3Drafter for eagle3."""
        c = self.config
        if c.mtp_head:
            return self.model
        if c.eagle3_head is None:
            return None
        head_config = read_eagle3_config(c.eagle3_head)
        stack = self.model.model
        if type(stack).forward is not DecoderStack.forward:
            raise ValueError(f"speculative_config.method 'eagle3': not supported for {hf_config.architectures} (its "
                             "decoder does not keep its layers' inputs)")
        num_layers = len(stack.layers)
        aux = head_config.aux_layers or default_aux_layers(num_layers)
        if len(aux) != 3 or not all(0 <= i < num_layers for i in aux):
            raise ValueError(f"speculative_config.method 'eagle3': the head reads layers {list(aux)}, not three of the "
                             f"target's {num_layers}")
        # Every forward of the target (eager, or a decode or mixed graph's) writes the rows of its step here.
        stack.keep_layer_inputs(tuple(aux), max(c.max_num_batched_tokens, c.max_num_seqs), hf_config.hidden_size,
                                self.dtype, self.device)
        with torch.device(self.device), _default_dtype(self.dtype):
            head = Eagle3Head(head_config, Path(c.eagle3_head), hf_config.hidden_size, hf_config.vocab_size,
                              c.max_model_len, c.kernels, self.tp)
        load_weights(head, Path(c.eagle3_head))
        finish_loading(head, self.dtype)
        head.eval().requires_grad_(False)
        cast_float_params(head, self.dtype)
        head.load_draft_to_target()
        logger.info("EAGLE-3 head %s: %d draft tokens, reading the target's layers %s", c.eagle3_head,
                    head_config.draft_vocab_size, list(aux))
        return Eagle3Drafter(head, self.model)

    def _allocate_target_hidden(self, hf_config: PretrainedConfig) -> torch.Tensor | None:
        if self.drafter is None:
            return None
        if len(self.kv_cache_groups) != 1 or self.kv_cache_groups[0].sliding_window is not None:
            # The head's inputs and K/V sit at the slots of the target's positions, through one full-attention table.
            raise ValueError("speculative_config.method mtp / eagle3: a draft head needs a target whose layers all "
                             "keep the whole context; this one has sliding-window layers")
        num_slots = self.kv_cache_groups[0].num_blocks * self.config.block_size
        return torch.zeros(num_slots, self._target_hidden_width(hf_config), dtype=self.dtype, device=self.device)

    def _target_hidden_width(self, hf_config: PretrainedConfig) -> int:
        """What the draft head reads of the target per token: its last hidden state (MTP), or the inputs of three
        of its layers (EAGLE-3)."""
        return hf_config.hidden_size * (3 if isinstance(self.drafter, Eagle3Drafter) else 1)

    def _keep_target_hidden(self, batch: Batch, hidden: torch.Tensor) -> None:
        """A target step's hidden states for the draft head, at their tokens' KV slots."""
        if self.target_hidden is not None and batch.slot_mapping:
            if isinstance(self.drafter, Eagle3Drafter):  # the target's layers' inputs, written by every forward
                hidden = self.model.model.aux_hidden
            slots = to_device(np.asarray(batch.slot_mapping, dtype=np.int64), np.int64, self.device)
            self.target_hidden[slots] = hidden[: len(batch.slot_mapping)].to(self.target_hidden.dtype)

    def _launch_mtp(self, batch: Batch) -> PendingStep | PendingLogits:
        """A step of the draft head (Batch.mtp; an MTP or EAGLE-3 head): its hidden inputs from the hidden-state cache
        or the previous head step; each sampled row draws from its last token's logits."""
        assert batch.mtp is not None and self.target_hidden is not None
        input_ids, positions, meta = step_inputs(batch, self.device)
        if batch.fed_back_token_indices:
            where = self._to_device(np.array([batch.fed_back_token_indices, batch.fed_back_rows], dtype=np.int64))
            feed_back_tokens(input_ids, where[0], where[1], self._last_sampled_ids)
        if batch.mtp.hidden_slots is not None:
            hidden = self.target_hidden[self._to_device(np.asarray(batch.mtp.hidden_slots, dtype=np.int64))]
        else:
            assert self._last_mtp_hidden is not None, "a later draft's head step follows one that sampled"
            hidden = self._last_mtp_hidden[self._to_device(np.asarray(batch.fed_back_rows, dtype=np.int64))]
        assert self.drafter is not None
        out = self.drafter.run_draft_head(input_ids, hidden, positions, meta)
        sampled_rows = [i for i, row in enumerate(batch.sampling) if row is not None]
        self._last_mtp_hidden = out[self._to_device(np.cumsum(batch.query_lens)[sampled_rows] - 1)] \
            if sampled_rows else None
        rows = [row for row in batch.sampling if row is not None]
        logits = self.drafter.draft_logits(self._last_mtp_hidden) if sampled_rows else None
        return self._sample(batch, rows, logits, None)

    @torch.inference_mode()
    def _warm_up(self, windows: tuple[int | None, ...]) -> None:
        """The largest prefill and the largest sampling step, against a tiny cache, to find peak memory."""
        c = self.config
        num_tokens = min(c.max_num_batched_tokens, c.max_model_len)
        num_blocks = -(-num_tokens // c.block_size)
        kv_cache.allocate(self.layers, [num_blocks] * len(windows), windows, c.block_size, self.kv_dtype, self.device)
        batch = _in_every_group(Batch(
            token_ids=[0] * num_tokens, positions=list(range(num_tokens)), slot_mapping=[-1] * num_tokens,
            query_lens=[num_tokens], context_lens=[num_tokens], block_tables=[list(range(num_blocks))],
            sampling=[None],
        ), [num_blocks] * len(windows))
        torch.cuda.reset_peak_memory_stats(self.device)
        hidden = self._forward(batch)
        num_rows = min(c.max_num_seqs, num_tokens)
        heaviest = [RowSampling(temperature=1.0, top_p=0.9, top_k=50, min_p=0.01, num_top_logprobs=20,
                                penalties=Penalties(slot=i, presence=0.5, frequency=0.5, repetition=1.2))
                    for i in range(num_rows)]
        logits = self.model.compute_logits(hidden[:num_rows])
        if logits is not None:  # None on tensor-parallel ranks other than 0, which never sample
            # Token masks too: their kernel (and the penalties') compiled now, not at a request.
            every_token = TokenMask(list(range(num_rows)), np.full((num_rows, -(-logits.shape[1] // 32)), -1, np.int32))
            # The logits in the model's dtype, as a step gives them: a float32 copy held here would count memory that
            # no step holds (the sampler upcasts chunk by chunk).
            self.sampler(logits, heaviest, token_mask=every_token)
            # The plain rows' path too (the fused sampling kernel on CUDA): compiled now, not on the first request.
            plain = [RowSampling(temperature=0.6 if i % 2 == 0 else 0.0) for i in range(num_rows)]
            self.sampler(logits, plain)
        torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def _run_first_request_shapes(self) -> None:
        """Runs what a server's first requests run, so none of it is built at a request: a prompt's
        prefill, and decode steps of every row count up to 16 (without a sampling head in the decode graphs the
        lm_head after a graph runs eagerly on the unpadded rows) and of every graph bucket, greedy and sampled rows;
        and every linear layer and the lm_head once per row bucket of the skinny GEMM (its configs for 17..256 rows
        meet prefills of any length too).
        On CPU nothing is compiled per shape: one short prefill and one decode step pay the first-call
        costs (thread pool, oneDNN/MKL set-up, the sampler's paths). Nothing is written to the cache
        (slot -1); every row reads block 0."""
        start = time.perf_counter()
        c = self.config
        if self.device.type == "cuda":
            prompt = min(1024, c.max_num_batched_tokens, c.max_model_len)
            skinny_rows = range(1, min(FEW_ROWS, c.max_num_seqs) + 1)
            warm_up_skinny_gemm(self.model, c.max_num_batched_tokens)
            warm_up_quantized(self.model, c.max_num_batched_tokens, self.dtype)
            row_counts = sorted(set(skinny_rows) | set(self.decode.buckets if self.decode else []))
        else:
            prompt, row_counts = min(c.block_size, c.max_num_batched_tokens, c.max_model_len), [min(2, c.max_num_seqs)]
        batches = [self._in_every_group(_dummy_batch(query_lens, c.block_size))
                   for query_lens in [[prompt], *([1] * n for n in row_counts)]]
        for batch in tqdm(batches, desc="warming up", unit="step", disable=None):
            self.execute(batch)
        self._last_sampled_ids = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        logger.info("warmed up the first requests' steps (%d) in %.1f s", len(batches), time.perf_counter() - start)

    def close(self) -> None:
        """Nothing to stop in one process (the surface of gpu.tensor_parallel_runner.TensorParallelRunner)."""

    def restarted(self) -> "ModelRunner":
        """The runner a restarted engine drives: this one (its model and cache stay; the engine's bookkeeping
        is new, and what the cache holds is never read without it)."""
        return self

    def execute(self, batch: Batch, token_mask: TokenMask | None = None) -> StepResult:
        """Runs one step and waits for its tokens on the host."""
        return run_step(self, batch, token_mask)

    @torch.inference_mode()
    def launch(self, batch: Batch) -> PendingStep | PendingLogits:
        """Queues one step on the device and returns without waiting for it. A batch with token masks
        returns its logits awaiting them: pass those to `sample_masked` before the next launch. On a
        tensor-parallel rank other than 0 the step has no result (rank 0 returns the tokens). A row verifying
        draft tokens is sampled at each of its last d + 1 positions (Batch.sampled_positions)."""
        if batch.mtp is not None:
            return self._launch_mtp(batch)
        if batch.num_draft_tokens is not None:
            return self._launch_verification(batch)
        rows = [row for row in batch.sampling if row is not None]
        logits = None
        state_cache.copy_rows(self.stacked_states, batch.state_restores, self.device)
        if self._replays_decode_graph(batch):
            assert self.decode is not None
            draw = self._graph_draw(batch, rows)
            out = self.decode.run(batch, self._last_sampled_ids, draw)
            state_cache.copy_rows(self.stacked_states, state_cache.saves_at_row_ends(batch), self.device)
            if draw is not None:  # the graph drew the tokens: no launch from here to the copy to the host
                assert out.logits is not None and out.token_ids is not None
                pending = self._launched(self.sampler.finish_graph_draw(out.logits, out.token_ids, rows, draw), None)
                self._keep_target_hidden(batch, out.hidden)  # after the copy is queued
                return pending
            hidden = out.hidden
            if len(rows) == batch.num_rows:
                logits = out.logits  # computed by the graph (None without a sampling head)
        else:
            hidden = self._forward(batch)
            state_cache.copy_rows(self.stacked_states, state_cache.saves_at_row_ends(batch), self.device)
        self._keep_target_hidden(batch, hidden)
        prompt = None
        if batch.prompt_logprobs:
            prompt = prompt_logprobs(hidden, batch.prompt_logprobs, self.model.compute_logits)
        if logits is None:
            logits = self._logits(batch, hidden)
        return self._sample(batch, rows, logits, prompt)

    def _launch_verification(self, batch: Batch) -> PendingStep | PendingLogits:
        """A step with draft tokens (speculative decoding): never decode-only, so it runs as any step with prefill
        (eagerly or in a mixed graph), and samples at every verified position; the engine accepts the drafts."""
        rows, token_indices = batch.sampled_positions()
        state_cache.copy_rows(self.stacked_states, batch.state_restores, self.device)
        hidden = self._forward(batch)
        state_cache.copy_rows(self.stacked_states, state_cache.saves_at_row_ends(batch), self.device)
        self._keep_target_hidden(batch, hidden)
        prompt = None
        if batch.prompt_logprobs:
            prompt = prompt_logprobs(hidden, batch.prompt_logprobs, self.model.compute_logits)
        logits = self.model.compute_logits(hidden[to_device(token_indices, np.int64, self.device)]) if rows else None
        return self._sample(batch, rows, logits, prompt)

    @torch.inference_mode()
    def launch_verification_on_device(self, batch: DeviceVerifyBatch) -> DeviceVerifiedStep:
        """Queues a verifying step laid out on the device from the token history (gpu/device_verification.py) and
        returns without waiting for it: its drafts, acceptance and history update run on the device too, so the
        next such step can be queued before this one's tokens reach the host. One replay of a verify graph where
        one takes the step (`_verify_graph_draw`), else eagerly. A fill's pending token is the previous step's
        (a plain step still in flight), copied from its sampled tokens on the device."""
        assert self.token_history is not None and self.tp.is_first, "a runner built to keep the token history"
        self.token_history.fill(batch.fills, self._last_sampled_ids)
        rows = device_verification.position_rows(batch)
        draw = self._verify_graph_draw(batch, rows)
        if draw is not None:
            assert self.verify is not None
            out = self.verify.run(batch, draw)
        else:
            out = self._verify_eagerly(batch, rows)
        # A verifying step's tokens reach the next step through the history; a plain one's (k = 0: one a row) are fed
        # back as any plain step's, for a step laid out on the host after it.
        self._last_sampled_ids = None if batch.num_drafts else out.token_ids[: batch.num_rows]
        return DeviceVerifiedStep(self.sampler.with_logprobs(out.logits, out.token_ids, rows), out.counts)

    def _verify_graph_draw(self, batch: DeviceVerifyBatch, rows: list[RowSampling]) -> GraphDraw | None:
        """The rule for which verifying steps a verify graph takes: one holds the batch's rows and draft length, and
        every position's draw is the fused kernel's alone (greedy or unseeded random rows without top-k, top-p,
        min-p or logit bias: the graph accepts drafts before the host could draw such a row again); then the
        graph's draw inputs, else None (the eager path)."""
        if self.verify is None or self.verify.key_for(batch) is None:
            return None
        draw = self.sampler.graph_draw(rows, self.vocab_size)
        return None if draw is None or draw.filtered else draw

    def _verify_eagerly(self, batch: DeviceVerifyBatch, rows: list[RowSampling]
                        ) -> device_verification.VerifiedOutputs:
        """The verify graphs' function run eagerly, its forward in the mixed-step graph that holds the step (its
        static inputs written from the device's layout) where one does, and any row's draw the sampler's."""
        functions = device_verification.StepFunctions(self._laid_out_forward(batch), self.model.compute_logits,
                                                      lambda logits: self.sampler.draw(logits, rows))
        return device_verification.verify_step(self.token_history, device_verification.device_inputs(
            batch, self.device), device_verification.step_shape(batch, self.config.block_size), functions)

    def _laid_out_forward(self, batch: DeviceVerifyBatch) -> ForwardFn:
        """The forward of an eager verifying step: the mixed-step graph that holds it, else `_eager_forward`."""
        shape = device_verification.host_shape(batch)
        if self.mixed is None or self.mixed.bucket_for(shape) is None:
            return self._eager_forward
        mixed = self.mixed

        def forward(token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
            return mixed.run(shape, None, (token_ids, positions, meta.slot_mapping, meta.context_lens))
        return forward

    def _sample(self, batch: Batch, rows: list[int], logits: torch.Tensor | None,
                prompt: PackedPromptLogprobs | None) -> PendingStep | PendingLogits:
        """Rank 0 samples the rows' logits, or queues them where token masks must be filled first; the other ranks
        (their share of the logits went to rank 0) take rank 0's tokens."""
        if not self.tp.is_first:
            return self._tokens_from_first(len(rows))
        if logits is None:
            return self._launched(None, prompt)
        if batch.has_token_masks:
            return PendingLogits(logits, rows, batch.penalty_slot_inits, prompt)
        return self._launched(self.sampler.sample(logits, rows, batch.penalty_slot_inits), prompt)

    @torch.inference_mode()
    def sample_masked(self, pending: PendingLogits, token_mask: TokenMask) -> PendingStep:
        """Queues the sampling of a launched step whose token masks are now filled."""
        sampled = self.sampler.sample(pending.logits, pending.rows, pending.slot_inits, token_mask)
        return self._launched(sampled, pending.prompt)

    def _launched(self, sampled: SampledRows | None, prompt: PackedPromptLogprobs | None) -> PendingStep:
        if sampled is not None:
            self.tp.broadcast_from_first(sampled.token_ids.contiguous())  # the other ranks feed them back too
        pending = PendingStep(sampled, prompt)
        self._last_sampled_ids = pending.sampled_token_ids
        return pending

    def _tokens_from_first(self, num_sampled_rows: int) -> PendingStep:
        """A rank other than 0: the tokens rank 0 sampled (once it has), for the next step to feed back."""
        self._last_sampled_ids = None
        if num_sampled_rows:
            token_ids = torch.empty(num_sampled_rows, dtype=torch.int64, device=self.device)
            self._last_sampled_ids = self.tp.broadcast_from_first(token_ids)
        return PendingStep(None)

    def _logits(self, batch: Batch, hidden: torch.Tensor) -> torch.Tensor | None:
        """[num_sampled_rows, vocab] in the model's dtype (the sampler upcasts where it must); None: no row samples."""
        sampled_rows = [i for i, row in enumerate(batch.sampling) if row is not None]
        if not sampled_rows:
            return None
        if batch.is_decode_only and len(sampled_rows) == batch.num_rows:
            last_hidden = hidden  # one token per row, every row sampled: no gather (and no copy to the device)
        else:
            last_token_index = np.cumsum(batch.query_lens)[sampled_rows] - 1
            last_hidden = hidden[to_device(last_token_index, np.int64, self.device)]
        return self.model.compute_logits(last_hidden)

    def _replays_decode_graph(self, batch: Batch) -> bool:
        """A decode step that one of the decode graphs' buckets holds (replayed, or eager on their buffers)."""
        return self.decode is not None and batch.is_decode_only and self.decode.bucket_for(batch.num_rows) is not None

    def _graph_draw(self, batch: Batch, rows: list[RowSampling]) -> GraphDraw | None:
        """The in-graph draw's inputs when the decode graphs sample and every row's sampling is plain."""
        if self.decode is None or not self.decode.samples or len(rows) != batch.num_rows or batch.has_token_masks:
            return None
        return self.sampler.graph_draw(rows, self.vocab_size)

    @torch.inference_mode()
    def _forward(self, batch: Batch) -> torch.Tensor:
        """[num_tokens, hidden_size] of a step the decode graphs do not hold (`launch` replays those itself)."""
        if self.mixed is not None and not batch.is_decode_only and self.mixed.bucket_for(batch) is not None:
            return self.mixed.run(batch, self._last_sampled_ids)
        return self._eager_forward(*self._prepare(batch))

    def _eager_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
                       ) -> torch.Tensor:
        """A step no graph holds: on a CPU, decode rows on the decode kernels (one token a row, or a verifying step's
        queries laid out as rows: AttentionMetadata.query_rows), else the model's modules."""
        if self.cpu_decode is not None and meta.is_decode_only:
            return self.cpu_decode.run(input_ids, positions, meta)
        if self.cpu_decode is not None and meta.query_rows is not None:
            return self.cpu_decode.run_queries(input_ids, positions, meta)
        return self.model(input_ids, positions, meta)

    def _prepare(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        input_ids, positions, meta = step_inputs(batch, self.device, self.num_state_slots)
        if batch.fed_back_token_indices:
            where = self._to_device(np.array([batch.fed_back_token_indices, batch.fed_back_rows], dtype=np.int64))
            feed_back_tokens(input_ids, where[0], where[1], self._last_sampled_ids)
        return input_ids, positions, meta

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        return to_device(array, array.dtype, self.device)

    def _in_every_group(self, batch: Batch) -> Batch:
        return _in_every_group(batch, [group.num_blocks for group in self.kv_cache_groups])


def load_cpu_kernels_for(device: torch.device, cache_dir: str | None, march: str) -> CpuKernels:
    """On a CPU, the C kernels built for it (gpu/cpu_kernels) with -march=`march`, whichever switches are off: the dtype
    `auto` picks does not depend on them."""
    if device.type != "cpu":
        return NO_CPU_KERNELS
    kernels = load_cpu_kernels(cache_dir, march)
    logger.info("CPU kernels (-march=%s): %s", march, "; ".join(kernels.reasons))
    return kernels


def build_model(config: RunnerConfig, hf_config: PretrainedConfig, device: torch.device, dtype: torch.dtype,
                tp: TensorParallel = SINGLE, cpu_kernels: CpuKernels = NO_CPU_KERNELS) -> torch.nn.Module:
    """The checkpoint's model on `device` in `dtype`, its weights loaded (on a CPU, packed where a kernel takes them:
    gpu/cpu_packing.py)."""
    torch.manual_seed(config.seed)
    packing = None
    if device.type == "cpu" and config.kernels.cpu_packed_weights:
        packing, which = cpu_packing(dtype, cpu_kernels, is_reference=config.dtype == "float32")
        logger.info("CPU linear kernels: %s", which)
    scheme = quant_scheme(hf_config)
    # Packing finds weights on a grid exactly, so it reads a float32 checkpoint's own values (a quantized one's
    # dequantized in float32). Built in the dtype it loads in: a large model never exists in float32 first.
    is_exact = checkpoint_dtype(hf_config) == "float32" or scheme is not None
    load_dtype = torch.float32 if packing and is_exact else dtype
    with torch.device(device), _default_dtype(load_dtype):
        model = model_class(hf_config.architectures)(hf_config, config.max_model_len, config.kernels, tp)
        if config.mtp_head:
            if not hasattr(model, "build_mtp_head"):
                raise ValueError(f"speculative_config.method 'mtp': {hf_config.architectures} has no MTP head we run")
            model.build_mtp_head(config.max_model_len, config.kernels, tp)
    if scheme is not None:
        quantize_layers(model, scheme)
    if config.load_format == "dummy":
        init_dummy_weights(model, getattr(hf_config, "initializer_range", DEFAULT_STD), config.seed)
    else:
        load_weights(model, Path(config.model_path))
    finish_loading(model, load_dtype)
    model.eval().requires_grad_(False)
    if packing is not None:
        kinds = pack_linear_layers(model, packing)
        logger.info("linear weights packed for the CPU: %s", ", ".join(f"{n} {k}" for k, n in kinds.items()))
    cast_float_params(model, dtype)
    _log_weight_format(model, scheme, dtype)
    return model


def step_inputs(batch: Batch, device: torch.device, num_state_slots: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A step's token ids, positions and attention metadata on the device (fed-back tokens still placeholders);
    with `num_state_slots` (a model with linear-attention layers), each row's state slot too."""
    block_tables = to_device(_padded_block_tables(batch.block_tables), np.int32, device)
    meta = AttentionMetadata(
        slot_mapping=to_device(np.asarray(batch.slot_mapping, dtype=np.int64), np.int64, device),
        query_start_loc=to_device(np.cumsum([0, *batch.query_lens], dtype=np.int32), np.int32, device),
        context_lens=to_device(np.asarray(batch.context_lens, dtype=np.int32), np.int32, device),
        block_tables=block_tables,
        max_query_len=max(batch.query_lens),
        max_context_len=max(batch.context_lens),
        is_decode_only=batch.is_decode_only,
        linear_state=state_cache.step_inputs(batch, device, num_state_slots) if num_state_slots else None,
        query_rows=_query_rows(batch, block_tables),
    )
    if batch.other_groups:
        meta = meta.with_group_tables(
            [to_device(np.asarray(g.slot_mapping, dtype=np.int64), np.int64, device) for g in batch.other_groups],
            [to_device(_padded_block_tables(g.block_tables), np.int32, device) for g in batch.other_groups])
    input_ids = to_device(np.asarray(batch.token_ids, dtype=np.int64), np.int64, device)
    return input_ids, to_device(np.asarray(batch.positions, dtype=np.int64), np.int64, device), meta


def _query_rows(batch: Batch, block_tables: torch.Tensor) -> QueryRows | None:
    """The step's queries as decode rows where its rows each have a few, not all one (AttentionMetadata.query_rows)."""
    if batch.is_decode_only or max(batch.query_lens) > MAX_QUERIES_AS_ROWS:
        return None
    return query_rows_of_host_rows(np.asarray(batch.query_lens, dtype=np.int64),
                                   np.asarray(batch.context_lens, dtype=np.int64), block_tables)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _log_weight_format(model: torch.nn.Module, scheme: QuantScheme | None, dtype: torch.dtype) -> None:
    num_bytes, num_weights = weight_summary(model)
    is_dequantized = scheme is not None and next(model.parameters()).device.type == "cpu"
    logger.info("weight format: %s, %.2f bytes per parameter%s",
                scheme.description if scheme is not None else str(dtype).removeprefix("torch."),
                num_bytes / max(num_weights, 1), " (dequantized: the CPU runs the float weights)" if is_dequantized
                else "")


def _num_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _dummy_batch(query_lens: list[int], block_size: int) -> Batch:
    """Rows of fresh tokens (context = query) that write nothing, alternately greedy and sampled."""
    num_tokens = sum(query_lens)
    return Batch(
        token_ids=[0] * num_tokens, positions=[p for n in query_lens for p in range(n)], slot_mapping=[-1] * num_tokens,
        query_lens=query_lens, context_lens=query_lens, block_tables=[[0] * -(-n // block_size) for n in query_lens],
        sampling=[RowSampling(temperature=0.0 if i % 2 else 0.6) for i in range(len(query_lens))],
    )


def _in_every_group(batch: Batch, num_blocks: list[int]) -> Batch:
    """A batch that writes nothing (every slot -1), its rows reading in every further KV-cache group the blocks of
    group 0's tables folded into that group's `num_blocks` (warm-up and timing steps)."""
    assert all(slot == -1 for slot in batch.slot_mapping) and isinstance(batch.block_tables, list)
    tables = batch.block_tables
    return replace(batch, other_groups=[GroupTables(batch.slot_mapping, [[b % n for b in row] for row in tables])
                                        for n in num_blocks[1:]])


def _padded_block_tables(block_tables: list[list[int]] | PackedBlockTables) -> np.ndarray:
    """[num_rows, max_blocks] int32, rows padded with block 0 (read by no one: context lengths bound reads)."""
    packed = pack_block_tables(block_tables)
    table = np.zeros((len(packed), int(packed.lengths.max())), dtype=np.int32)
    write_block_tables(table, packed)
    return table
