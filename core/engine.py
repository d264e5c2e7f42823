"""The engine: one step = drain the inbox, schedule, launch, postprocess; outputs are returned.

With async scheduling (the default) a step queues its work on the device and then postprocesses
the PREVIOUS step, whose results are ready by then: the device computes step N while the host
waits for, and books, step N-1's tokens and then schedules step N+1. Tokens sampled by a step
still in flight are pending (see core/sequence.py) and reach the next step on the device. The price
is a wasted row now and then: a sequence that samples EOS at step N was already queued in N+1,
whose token for it is dropped. A sequence that ends by length is known to end, and is not.

Structured output: a request waits, unscheduled, until its grammar is compiled on core/grammar.py's
worker thread. xgrammar and the tokenizer are imported with the first such request, not at start-up (as
vLLM builds its grammar backend): together they are most of the engine's import time.
A step with constrained rows is launched in two parts: its forward pass first; then,
while the device runs it, the previous step's tokens are booked (each constrained sequence's
matcher accepts its token) and the rows' token masks are filled; then its sampling is queued.

Requests come checked: the front ends (the offline LLM, the server) check each one with `limits`
(core/request_checks.py) and keep request ids unique among live requests. The engine does not trust
them blindly: it checks each request again as it takes it from the inbox, and a request that fails
the check ends alone with FinishReason.ERROR. A step that raises while it is built or launched
(a fault that only some request's rows provoke) is run again one row at a time: the rows that still
raise end their requests with ERROR and the others go on. A fault that is not a request's (every
row fails, or steps keep failing) is raised: the engine is broken, and its owner restarts it.

Speculative decoding (core/speculation.py): a step whose controller asks for drafts books the step in flight
first (drafts are proposed from known tokens), and is itself booked before the next step is scheduled (what it
accepts decides what comes next); its rows verify their drafts, each sampled at every verified position. Prompt
lookup's decode-only steps of ordinary rows are laid out on the device instead (core/device_verification.py): drafts,
inputs, acceptance and the next step's first tokens stay there, so such a step is launched before the one in flight
is booked, as a plain step is, and books its rows' tokens a step late.

Pooling models (embeddings, scores: core/pooling_model.py) run the same loop: their requests are
prefill-only sequences, finished by the step that computes their last prompt token, whose output is
the pooled state the runner returns instead of a sampled token.

Threading: `add_request`, `abort_request` and `stats` are safe from any thread (they enqueue, or
read counters); everything else, and every touch of the scheduler, the block manager and the
device, happens on the one thread that calls `step`.
"""

import concurrent.futures
import gc
import logging
import queue
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.batch_builder import build_batch
from core.block_manager import BlockManager
from core.config import EngineConfig
from core.device_verification import DeviceVerification
from core.engine_metrics import EngineMetrics, EngineObservations
from core.engine_stats import EngineStats
from core.model_files.cache import cache_dir_for
from core.outputs import FinishReason, RequestOutput, RequestRejected
from core.penalty_slots import PenaltySlots
from core.pooling_model import PoolingModel, read_pooling_model
from core.pooling_params import PoolingParams
from core.request_checks import EngineLimits
from core.sampling_params import SamplingParams
from core.scheduler import ScheduledSequence, Scheduler
from core.sequence import Sequence, SequenceStatus
from core.speculation import Speculation
from core.startup_gc import freeze_startup_objects
from core.state_snapshots import DraftStates, LinearStates, StateSnapshots
from gpu.batch import TokenLogprobs, TokenMask
from gpu.config import RunnerConfig
from gpu.device_verification import DeviceVerifiedStep
from gpu.kv_cache_groups import KVCacheGroup, context_block_limit
from gpu.loader import has_tensors_named
from gpu.model_info import ModelInfo, load_hf_config, read_model_info
from gpu.models import mtp_checkpoint_prefix
from gpu.runner import Runner, StepInFlight
from gpu.runner_factory import AwaitingMasks, make_runner
from gpu.token_history import MAX_LOOKUP

if TYPE_CHECKING:
    from core.grammar import Grammars

logger = logging.getLogger(__name__)

_NOTHING_SAMPLED = SamplingParams(max_tokens=None)  # a pooling sequence's: it never samples

# Failed steps in a row, none of whose rows could run alone, before the engine gives up (its fault,
# not a request's).
_MAX_FAILED_STEPS_IN_A_ROW = 3


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _LaunchedStep:
    scheduled: list[ScheduledSequence]
    sampled_seqs: list[Sequence]  # the sequences of the step's sampled rows, in row order
    pending: StepInFlight | AwaitingMasks  # AwaitingMasks: its sampling waits for token masks
    scored_seqs: list[Sequence]  # the sequences of the step's prompt_logprobs rows, in order
    pooled_seqs: list[Sequence]  # the pooling sequences whose prompt the step ends, in row order
    # Speculative decoding: per sampled sequence, the drafts its row verifies and the index of its first sampled
    # position among the result's (a row with d drafts has d + 1); None: no row verifies drafts.
    draft_counts: list[int] | None = None
    first_positions: list[int] | None = None
    num_decode_rows: int = 0  # its rows when every one decodes (one token, or one and its drafts); else 0


@dataclass(frozen=True)
class _DeviceStep:
    """A verifying step laid out on the device (core/device_verification.py): a row per sequence, k + 1 positions."""

    seqs: list[Sequence]
    pending: DeviceVerifiedStep
    num_drafts: int


class LLMEngine:
    def __init__(self, config: EngineConfig, runner: Runner | None = None) -> None:
        """`runner`: the model runner to drive (a benchmark's, built with its own kernel choices);
        None builds one from `config` (see runner_config)."""
        self.config = config
        info = read_model_info(config.model.model)
        self.pooling: PoolingModel | None = read_pooling_model(config.model.model, config.model.task)
        limit = info.max_position_embeddings if self.pooling is None else self.pooling.max_model_len
        self.max_model_len = _resolve_max_model_len(config.model.max_model_len, limit)
        if self.pooling is not None and self.pooling.is_encoder:
            _check_whole_prompts_fit(self.max_model_len, config.scheduler.max_num_batched_tokens)
        self.vocab_size = info.vocab_size
        self.eos_token_ids = info.eos_token_ids
        spec_config = config.scheduler.speculative_config
        if spec_config is not None and spec_config.method in DRAFT_HEAD_METHODS:
            _check_draft_head(config, spec_config.method)
        self.runner = runner if runner is not None else make_runner(
            runner_config(config, self.max_model_len), None if self.pooling is None else self.pooling.pooler)
        self.block_size = config.cache.block_size
        self.linear_states = self._linear_states(config, info)
        # An encoder's blocks hold nothing to reuse; nor do a hybrid model's without state snapshots (a hit must also
        # restore its linear-attention layers' state at the hit's end).
        is_cacheable = not (self.pooling is not None and self.pooling.is_encoder) and not (
            self.linear_states is not None and self.linear_states.snapshots is None)
        self.block_manager = BlockManager(
            self.runner.kv_cache_groups, self.block_size, config.cache.enable_prefix_caching and is_cacheable)
        self.scheduler = Scheduler(config.scheduler, self.block_manager,
                                   snapshots=self.linear_states.snapshots if self.linear_states else None)
        context_blocks = context_block_limit(self.runner.kv_cache_groups, self.block_size, self.max_model_len,
                                             config.scheduler.max_num_batched_tokens)
        self.limits = EngineLimits(self.vocab_size, self.max_model_len, self.block_size, context_blocks)
        self._inbox: queue.SimpleQueue[Sequence | _Abort] = queue.SimpleQueue()
        self._taken_from_inbox: deque[Sequence | _Abort] = deque()  # by wait_for_work, in order
        self._sequences: dict[str, Sequence] = {}
        self._in_flight: _LaunchedStep | _DeviceStep | None = None  # launched, results not yet taken
        # The last step's (decode rows or 0, draft length, start): the speculation controller is given its time when
        # the next step starts (core/speculation_control.py says why).
        self._timed_step: tuple[int, int, float] | None = None
        self._num_failed_steps_in_a_row = 0
        self.penalty_slots = PenaltySlots(config.scheduler.max_num_seqs)
        self.pooling_slots = PenaltySlots(config.scheduler.max_num_seqs)  # the same kind of pool, for pooling state
        self._grammars: Grammars | None = None  # built at the first structured-output request
        self._compiling: dict[Sequence, concurrent.futures.Future] = {}  # waiting for their grammar, unscheduled
        self.metrics = EngineMetrics()
        if spec_config is not None and self.pooling is not None:
            raise ValueError("speculative_config: a pooling model generates no tokens to speculate on")
        draft_runner = None if spec_config is None else self._draft_runner()
        # A draft model's runner is the engine's to stop with its own (its tensor-parallel workers); a head's is the
        # target's.
        self._draft_model_runner = draft_runner if draft_runner is not self.runner else None
        self.speculation = None if spec_config is None else Speculation(
            spec_config, self.max_model_len, draft_runner, self.block_size, config.scheduler.max_num_batched_tokens)
        self.device_verification = self._device_verification()

    def _draft_runner(self) -> Runner | None:
        """The draft model's runner (speculative method draft_model): the target's KV blocks and tensor-parallel size
        (its own worker processes, one per GPU of the target's, as vLLM runs a draft under the target's TP); for
        methods mtp and eagle3 the target's own, built with the head (sharded as the target)."""
        spec = self.config.scheduler.speculative_config
        if spec is not None and spec.method in DRAFT_HEAD_METHODS:
            return self.runner
        if spec is None or spec.model is None:
            return None
        draft_info = read_model_info(spec.model)
        if draft_info.vocab_size != self.vocab_size:
            raise ValueError(f"speculative_config.model {spec.model!r}: its vocabulary is not the target's")
        if draft_info.has_linear_attention:  # its batches carry no state slots of its own
            raise ValueError(f"speculative_config.model {spec.model!r}: a draft model with linear-attention layers "
                             "is not supported")
        # The draft writes its K/V through the target's block tables, of a single full-attention group (a windowed
        # group's tables name the null block before the window, where a draft catching up would still write).
        if not _is_full_attention_only(self.runner.kv_cache_groups):
            raise ValueError(f"speculative_config.model: a draft model needs a target whose layers all keep the whole "
                             f"context; {self.config.model.model!r} has sliding-window layers")
        config = replace(runner_config(self.config, self.max_model_len), model_path=spec.model,
                         num_kv_blocks=self.runner.kv_cache_groups[0].num_blocks, load_format="auto")
        runner = make_runner(config)
        if not _is_full_attention_only(runner.kv_cache_groups):
            runner.close()  # its tensor-parallel workers, if any
            raise ValueError(f"speculative_config.model {spec.model!r}: a draft model with sliding-window layers "
                             f"is not supported (it reads the target's block tables, of full attention)")
        return runner

    def _device_verification(self) -> DeviceVerification | None:
        """Prompt lookup's verifying steps are laid out on the device where the runner keeps the token history (built
        for method ngram in one process: runner_config) and the model keeps one full-attention KV group (the history
        knows nothing of windows or linear-attention states)."""
        spec = self.config.scheduler.speculative_config
        if (spec is None or getattr(self.runner, "token_history", None) is None or self.linear_states is not None
                or not _is_full_attention_only(self.runner.kv_cache_groups)):
            return None
        return DeviceVerification(spec, self.block_manager, self.max_model_len, self.config.scheduler.max_num_seqs,
                                  self.eos_token_ids)

    @property
    def grammars(self) -> "Grammars":
        """Built at the first structured-output request: its own tokenizer, for the vocabulary the grammars
        are compiled against (the engine never tokenizes)."""
        if self._grammars is None:
            from core.grammar import Grammars  # noqa: PLC0415 - imported with the first structured request (docstring)
            from core.tokenizer import load_tokenizer  # noqa: PLC0415 - as Grammars
            tokenizer = load_tokenizer(self.config.model.tokenizer or self.config.model.model)
            spec = self.config.scheduler.speculative_config
            positions_per_row = 1 + (spec.num_speculative_tokens if spec is not None else 0)  # verified positions
            self._grammars = Grammars(tokenizer, self.vocab_size, self.eos_token_ids,
                                      self.config.scheduler.max_num_seqs * positions_per_row)
            if gc.get_freeze_count():  # start-up's objects were frozen (core/startup_gc.py): these last as long
                freeze_startup_objects()
        return self._grammars

    # Any thread.

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | PoolingParams
                    ) -> None:
        """Enqueues a request its caller checked with `limits` (see the module's docstring), under an id
        that no live request has. PoolingParams: a pooling model's prompt (embeddings, scores)."""
        if isinstance(params, PoolingParams):
            self._inbox.put(self._pooling_sequence(request_id, prompt_token_ids, params))
            return
        max_tokens = self.limits.max_tokens_of(len(prompt_token_ids), params)
        self._inbox.put(Sequence(request_id, prompt_token_ids, params, max_tokens))

    def _pooling_sequence(self, request_id: str, prompt_token_ids: list[int], params: PoolingParams) -> Sequence:
        seq = Sequence(request_id, prompt_token_ids, _NOTHING_SAMPLED, max_tokens=0)
        seq.pooling = params
        if self.pooling is not None:
            seq.pools_every_token = self.pooling.pooler.needs_every_token
            seq.must_run_whole = self.pooling.is_encoder
        return seq

    def add_requests(self, requests: Iterable[tuple[str, list[int], SamplingParams | PoolingParams]]) -> None:
        for request_id, prompt_token_ids, params in requests:
            self.add_request(request_id, prompt_token_ids, params)

    def abort_request(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            num_total_blocks=bm.num_blocks, num_free_blocks=bm.num_free_blocks,
            num_evictable_blocks=bm.num_evictable_blocks, num_used_blocks=bm.num_used_blocks,
            num_preemptions=self.scheduler.num_preemptions,
            num_prefix_cache_hit_tokens=self.scheduler.num_prefix_hit_tokens,
            num_prefix_cache_queried_tokens=self.scheduler.num_prefix_queried_tokens,
            num_prompt_tokens=self.metrics.num_prompt_tokens, num_generation_tokens=self.metrics.num_generation_tokens,
            **self._speculation_stats(),
        )

    def _speculation_stats(self) -> dict[str, object]:
        if self.speculation is None:
            return {}
        c = self.speculation.counts
        return {"num_spec_drafts": c.num_drafts, "num_spec_draft_tokens": c.num_draft_tokens,
                "num_spec_accepted_tokens": c.num_accepted_tokens,
                "num_spec_accepted_per_position": tuple(c.accepted_per_position)}

    # The stepping thread only (the engine process's main thread, or the server's bridge thread).

    def take_observations(self) -> EngineObservations | None:
        """Request-phase timings observed since the last call (core/engine_metrics.py); None if none."""
        return self.metrics.take_observations()

    def has_unfinished_requests(self) -> bool:
        return (self.scheduler.has_unfinished() or self._in_flight is not None or bool(self._taken_from_inbox)
                or not self._inbox.empty() or bool(self._compiling))

    def wait_for_work(self, timeout: float | None = None) -> None:
        """Blocks until the inbox has something (or the timeout passes); the next step takes it."""
        self._timed_step = None  # waiting for work is no step's cost
        if self._taken_from_inbox:
            return
        try:
            self._taken_from_inbox.append(self._inbox.get(timeout=timeout))
        except queue.Empty:
            return

    def next_outputs(self, idle_timeout: float) -> list[RequestOutput]:
        """One step if there is work; otherwise waits up to idle_timeout for some and returns []."""
        if not self.has_unfinished_requests():
            self.wait_for_work(timeout=idle_timeout)
            return []
        return self.step()

    def close(self) -> None:
        """Stops the grammar compiler's thread and the runners' tensor-parallel workers (the target's, a draft
        model's), if any (the interface of core.engine_process.EngineProcess)."""
        if self._grammars is not None:
            self._grammars.close()
        self.runner.close()
        if self._draft_model_runner is not None:
            self._draft_model_runner.close()

    def restarted(self) -> "LLMEngine":
        """A fresh engine in place of this failed one: new requests, blocks and scheduler on the same model
        runner (a device fault that broke the runner fails the new engine too), or on new tensor-parallel
        workers (a failed worker took the others with it)."""
        self.close()
        return LLMEngine(self.config, runner=self.runner.restarted())

    def step(self) -> list[RequestOutput]:
        started = time.perf_counter()
        if self._timed_step is not None:
            rows, drafts, at = self._timed_step
            self.speculation.observe_step(rows, drafts, started - at)  # type: ignore[union-attr]
            self._timed_step = None
        outputs = self._drain_inbox()
        if self._compiling:
            outputs += self._schedule_compiled()
        num_drafts = 0
        if self.speculation is not None and self.scheduler.running:
            num_drafts = self.speculation.controller.choose(len(self.scheduler.running), self.scheduler.has_prompt_work)
            self.speculation.follow_drafts(self.scheduler.running)
            if num_drafts and self.device_verification is not None and self._verify_on_device(
                    num_drafts, started, outputs):
                return outputs
        if isinstance(self._in_flight, _DeviceStep) and not num_drafts and self._leave_on_device(started, outputs):
            return outputs
        if isinstance(self._in_flight, _DeviceStep):  # the next step is laid out on the host, from every token
            outputs += self._postprocess(self._in_flight)
            self._in_flight = None
        if num_drafts:
            outputs += self._propose_drafts(num_drafts)
        scheduled = self._schedule()
        try:
            if num_drafts:
                self.speculation.fill(scheduled)  # type: ignore[union-attr]
            launched = self._launch(scheduled) if scheduled else None
        except Exception:  # noqa: BLE001 - which request provoked it is found by running its rows alone
            return outputs + self._recover(scheduled)
        if self._in_flight is not None:
            outputs += self._postprocess(self._in_flight)  # the device works on `launched` meanwhile
            self._in_flight = None
        if launched is not None:
            if isinstance(launched.pending, AwaitingMasks):
                try:
                    launched = self._sample_masked(launched)
                except Exception:  # noqa: BLE001 - as a launch that raised
                    return outputs + self._recover(scheduled)
            self._advance(launched)
            if self.config.scheduler.async_scheduling and launched.draft_counts is None:
                self._in_flight = launched
            else:
                outputs += self._postprocess(launched)  # a verifying step: what it accepts decides the next
            if self.speculation is not None and self.has_unfinished_requests():
                # Timed until the next step starts; where none is due (the last request ended, a caller such as
                # LLM.generate returns), the wait for the next request would be counted as this step's cost.
                self._timed_step = (launched.num_decode_rows, num_drafts, started)
        return outputs

    def _verify_on_device(self, num_drafts: int, started: float, outputs: list[RequestOutput]) -> bool:
        """Where the rule allows it (core/device_verification.py), launches a verifying step laid out on the device,
        then books the step in flight while the device runs it (its outputs go to `outputs`); whether it did (else
        the step is laid out on the host)."""
        if self.scheduler.has_prompt_work():
            return False
        in_flight = self._in_flight  # a plain step (host-verifying steps are booked at once), or one laid out so
        running = list(self.scheduler.running)
        pending = self._launch_laid_out(running, num_drafts, outputs)
        if pending is None:
            return False
        if isinstance(in_flight, _LaunchedStep):
            # Entering from a plain step: the rows' pending tokens were copied to the history on the device; the step
            # is booked while the device works on the new one.
            outputs += self._postprocess(in_flight)
        elif isinstance(in_flight, _DeviceStep):
            outputs += self._book_device_step(in_flight, num_drafts)  # the device works on the new step meanwhile
        self._keep_in_flight(_DeviceStep(running, pending, num_drafts), len(running), num_drafts, started, outputs)
        return True

    def _leave_on_device(self, started: float, outputs: list[RequestOutput]) -> bool:
        """After a verifying step laid out on the device and still in flight, where plain decoding is chosen or a
        prompt is due: a plain step laid out on the device too, where the rule allows it (core/device_verification.py),
        so that leaving verification waits for nothing. The verifying step is booked while the device runs the plain
        one, whose token a row is then pending, as a plain step's (the next step is laid out on the host at once).
        Whether it launched one (its outputs go to `outputs`)."""
        step = self._in_flight
        assert isinstance(step, _DeviceStep)
        running = list(self.scheduler.running)
        pending = self._launch_laid_out(running, 0, outputs)
        if pending is None:
            return False
        outputs += self._book_device_step(step, 0)  # the device works on the plain step meanwhile
        scheduled = []
        for row, seq in enumerate(running):
            if seq.is_finished:
                continue  # ended by the verifying step's tokens: its row's token is dropped
            scheduled.append(ScheduledSequence(seq, seq.num_tokens - 1, 1))
            seq.num_computed_tokens = seq.num_tokens
            seq.add_pending_token(row, is_last=self._reaches_length_limit(seq, seq.num_tokens + 1))
            seq.num_history_tokens = seq.num_tokens  # the step appends its token to the history
        plain = _LaunchedStep(scheduled, running, pending, [], [], num_decode_rows=len(running))
        self._keep_in_flight(plain, len(running), 0, started, outputs)
        return True

    def _launch_laid_out(self, running: list[Sequence], num_drafts: int, outputs: list[RequestOutput]
                         ) -> DeviceVerifiedStep | None:
        """Launches a step of the running rows laid out on the device, verifying `num_drafts` drafts a row (0: a
        plain step), behind the step in flight, where the rule allows it (core/device_verification.py); None where it
        did not. A launch that fails books the step in flight (its outputs go to `outputs`): the host lays the next
        step out from every token, where a request's fault is found alone."""
        assert self.device_verification is not None
        in_flight = self._in_flight
        in_flight_drafts = in_flight.num_drafts if isinstance(in_flight, _DeviceStep) else None
        if not self.device_verification.can_lay_out(running, num_drafts, in_flight_drafts):
            return None
        batch = self.device_verification.reserve(running, num_drafts, in_flight_drafts)
        try:
            return self.runner.launch_verification_on_device(batch)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - the host lays the step out instead
            logger.exception("a step laid out on the device failed to launch; the host lays it out")
            if in_flight is not None:
                outputs += self._postprocess(in_flight)
                self._in_flight = None
            self.device_verification.forget_history(running)  # after the booking, which counts what it appended
            return None

    def _keep_in_flight(self, step: _LaunchedStep | _DeviceStep, num_rows: int, num_drafts: int, started: float,
                        outputs: list[RequestOutput]) -> None:
        """A step laid out on the device, launched: left in flight (booked at once without async scheduling), and
        timed until the next step starts (as in `step`)."""
        self._in_flight = step
        if not self.config.scheduler.async_scheduling:
            outputs += self._postprocess(step)
            self._in_flight = None
        if self.has_unfinished_requests():
            self._timed_step = (num_rows, num_drafts, started)

    def _propose_drafts(self, num_drafts: int) -> list[RequestOutput]:
        """Books the step in flight (drafts are proposed from known tokens), then gives the running sequences
        their drafts (core/speculation.py)."""
        assert self.speculation is not None
        outputs = []
        if self._in_flight is not None:
            outputs = self._postprocess(self._in_flight)
            self._in_flight = None
        self.speculation.propose(self.scheduler.running, num_drafts, self._grammars)
        return outputs

    def _schedule(self) -> list[ScheduledSequence]:
        out = self.scheduler.schedule()
        for seq in out.preempted:
            self._release_penalty_slot(seq)  # it takes one anew, filled from its tokens, when it samples again
            if self.device_verification is not None:  # as the penalty slot
                self.device_verification.release(seq)
            self._release_pooling_slot(seq)  # its pooling starts again from its first token
            if self.linear_states is not None:  # its recomputation starts its state again (or from a snapshot)
                self.linear_states.release(seq)
        if out.admitted:
            now = time.monotonic()
            for seq in out.admitted:
                self.metrics.on_admitted(seq, now)
        return out.scheduled

    def _launch(self, scheduled: list[ScheduledSequence]) -> _LaunchedStep:
        scored: list[Sequence] = []
        batch = build_batch(scheduled, self.block_size, self.eos_token_ids, self.penalty_slots, scored,
                            self.pooling_slots, self.linear_states)
        sampled_seqs = [s.seq for s, row in zip(scheduled, batch.sampling, strict=True) if row is not None]
        pooled_seqs = [scheduled[row.row].seq for row in batch.pooling if row.ends_prompt]
        draft_counts = first_positions = None
        num_decode_rows = batch.num_rows if batch.is_decode_only else 0
        if batch.num_draft_tokens is not None:
            draft_counts = [n for n, row in zip(batch.num_draft_tokens, batch.sampling, strict=True) if row is not None]
            first_positions = list(accumulate((n + 1 for n in draft_counts[:-1]), initial=0))
            is_decoding = len(batch.token_ids) == batch.num_rows + sum(batch.num_draft_tokens)
            num_decode_rows = batch.num_rows if is_decoding else 0
        return _LaunchedStep(scheduled, sampled_seqs, self.runner.launch(batch), scored, pooled_seqs, draft_counts,
                             first_positions, num_decode_rows)

    def _recover(self, scheduled: list[ScheduledSequence]) -> list[RequestOutput]:
        """After a step failed to launch: books the step still in flight, then runs each scheduled row
        alone, launched and booked at once. A row that still raises ends its request with ERROR."""
        logger.exception("a step of %d rows failed; running its rows one at a time", len(scheduled))
        outputs = self._postprocess(self._in_flight) if self._in_flight is not None else []
        self._in_flight = None
        failed, num_run = [], 0
        for s in scheduled:
            if s.seq.is_finished:
                continue  # ended by the token the step in flight gave it
            self._forget_unlaunched(s.seq)
            try:
                alone = self._launch([s])
                if isinstance(alone.pending, AwaitingMasks):
                    alone = self._sample_masked(alone)
            except Exception as exc:  # noqa: BLE001 - this request's rows fail the step: it ends alone
                logger.error("request %s: its rows fail the step (%s: %s); it is ended", s.seq.request_id,
                             type(exc).__name__, exc)
                failed.append(s.seq)
                continue
            num_run += 1
            self._advance(alone)
            outputs += self._postprocess(alone)
        self._check_not_broken(num_run, len(failed))
        for seq in failed:
            self._finish(seq, FinishReason.ERROR)
            outputs.append(_output(seq, [], []))
        return outputs

    def _forget_unlaunched(self, seq: Sequence) -> None:
        """Undoes what building the failed batch booked for a sequence, none of which reached the device: its
        penalty slot (taken anew, and filled from its tokens, all known now, when its row runs again) and the
        prompt positions the batch was to score."""
        self._release_penalty_slot(seq)
        if seq.prompt_logprobs is not None:
            seq.next_prompt_logprob = len(seq.prompt_logprobs)

    def _check_not_broken(self, num_run: int, num_failed: int) -> None:
        """Raises when the failures are the engine's: every row of a step failed, or no row ran in several
        steps in a row (a device fault fails whatever is sent to it)."""
        self._num_failed_steps_in_a_row = 0 if num_run else self._num_failed_steps_in_a_row + 1
        if num_failed > 1 and not num_run:
            raise RuntimeError(f"every row of a step of {num_failed} rows failed: the engine is broken")
        if self._num_failed_steps_in_a_row >= _MAX_FAILED_STEPS_IN_A_ROW:
            raise RuntimeError(f"{self._num_failed_steps_in_a_row} steps in a row failed: the engine is broken")

    def _advance(self, step: _LaunchedStep) -> None:
        """Books what the launched step will have computed, before its results are back."""
        for s in step.scheduled:
            if not s.seq.is_finished:  # else: ended by the previous step's tokens after this one was queued
                s.seq.num_computed_tokens = s.start + s.num_new_tokens
        for row, seq in enumerate(step.sampled_seqs):
            if not seq.is_finished:
                # A length limit is known before the token is: such a sequence is not scheduled again.
                seq.add_pending_token(row, is_last=self._reaches_length_limit(seq, seq.num_tokens + 1))

    def _sample_masked(self, step: _LaunchedStep) -> _LaunchedStep:
        """Fills the token masks of the step's constrained rows from their matchers, which have taken every
        token up to the previous step's, and queues the step's sampling."""
        assert isinstance(step.pending, AwaitingMasks)
        rows = [i for i, seq in enumerate(step.sampled_seqs) if seq.grammar is not None]
        # A sequence that ended meanwhile gets an unmasked row: its token will be dropped.
        matchers = [None if step.sampled_seqs[i].is_finished else step.sampled_seqs[i].grammar for i in rows]
        if step.first_positions is None or step.draft_counts is None:
            token_mask = TokenMask(rows, self.grammars.fill(matchers))
        else:  # a verifying step: a mask per verified position
            counts, firsts = step.draft_counts, step.first_positions
            drafts = [step.sampled_seqs[i].draft_token_ids[: counts[i]] for i in rows]
            positions = [firsts[i] + j for i in rows for j in range(counts[i] + 1)]
            token_mask = TokenMask(positions, self.grammars.fill_along_drafts(matchers, drafts))
        return replace(step, pending=self.runner.sample_masked(step.pending, token_mask))

    def _drain_inbox(self) -> list[RequestOutput]:
        outputs = []
        while True:
            try:
                item = self._taken_from_inbox.popleft() if self._taken_from_inbox else self._inbox.get_nowait()
            except queue.Empty:
                return outputs
            if isinstance(item, Sequence):
                refusal = self._refusal(item)
                if refusal is not None:
                    logger.error("request %s refused by the engine: %s", item.request_id, refusal)
                    item.status, item.finish_reason = SequenceStatus.FINISHED, FinishReason.ERROR
                    outputs.append(_output(item, [], []))
                    continue
                self._sequences[item.request_id] = item
                if item.params.structured_output is None:
                    self.scheduler.add(item)
                else:
                    self._compiling[item] = self.grammars.compile(item.params.structured_output)
            elif (seq := self._sequences.get(item.request_id)) is not None:
                self._finish(seq, FinishReason.ABORT)
                outputs.append(_output(seq, [], []))

    def _schedule_compiled(self) -> list[RequestOutput]:
        """Hands the sequences whose grammar is compiled to the scheduler. With nothing else to do, waits a
        little for a compile first (the idle engine would otherwise spin on it)."""
        if not self.scheduler.has_unfinished() and self._in_flight is None:
            concurrent.futures.wait(self._compiling.values(), timeout=0.01, return_when="FIRST_COMPLETED")
        outputs = []
        for seq, future in list(self._compiling.items()):
            if not future.done():
                continue
            if future.exception() is None:
                del self._compiling[seq]
                seq.grammar = self.grammars.matcher(future.result())
                self.scheduler.add(seq)
            else:  # never for a checked request (core/request_checks.py): it fails alone
                logger.error("request %s: its grammar did not compile: %s", seq.request_id, future.exception())
                self._finish(seq, FinishReason.ERROR)  # takes it out of _compiling
                outputs.append(_output(seq, [], []))
        return outputs

    def _refusal(self, seq: Sequence) -> str | None:
        """Why the engine cannot take this request (its front end should have refused it), or None."""
        if seq.request_id in self._sequences:
            return "its id is the id of a live request"
        if (seq.pooling is None) != (self.pooling is None):
            return "a pooling request to a generating model, or the other way round"
        if seq.pooling is not None:
            try:
                self.limits.check_pooled_prompt(seq.token_ids)
            except RequestRejected as exc:
                return str(exc)
            return None
        return self.limits.refusal(seq.token_ids, seq.params)

    def _postprocess(self, step: _LaunchedStep | _DeviceStep) -> list[RequestOutput]:
        """Waits for the step's tokens (the one host sync) and books them."""
        if isinstance(step, _DeviceStep):
            return self._book_device_step(step, None)
        result = step.pending.result()
        for seq, entries in zip(step.scored_seqs, result.prompt_logprobs, strict=True):
            seq.prompt_logprobs.extend(entries)  # type: ignore[union-attr]
        if step.draft_counts is not None:
            return self._book_verified(step, result.token_ids, result.logprobs)
        refused = self._book_constrained(step.sampled_seqs, result.token_ids)
        now = time.monotonic()
        outputs = []
        first_token_seqs = []
        for seq, token_id, logprobs in zip(step.sampled_seqs, result.token_ids, result.logprobs, strict=True):
            if seq.is_finished:
                continue  # aborted, or ended by EOS, while this step was in flight: the token is dropped
            seq.resolve_pending_token(token_id)
            if seq.first_token_time is None:  # the one per-token cost of metrics: a comparison
                seq.first_token_time = now
                first_token_seqs.append(seq)
            finish_reason = self._finish_reason(seq, token_id)
            if refused and seq in refused:
                logger.error("request %s: token %d is outside its grammar; ended", seq.request_id, token_id)
                finish_reason = FinishReason.ERROR
            if finish_reason is not None:
                self._finish(seq, finish_reason)
            outputs.append(_output(seq, [token_id], [logprobs]))
        self.metrics.on_tokens(first_token_seqs, len(outputs), now)
        if step.pooled_seqs:
            outputs += self._book_pooled(step.pooled_seqs, result.pooled, now)
        return outputs

    def _book_verified(self, step: _LaunchedStep, token_ids: list[int], logprobs: list[TokenLogprobs | None]
                       ) -> list[RequestOutput]:
        """A step that verified drafts: each sequence takes the drafts its sampled tokens confirm and one more
        token (core/speculation.py), up to the first that ends it; the K/V slots of the rest are given back."""
        assert self.speculation is not None and step.draft_counts is not None and step.first_positions is not None
        refused = self._book_constrained(step.sampled_seqs, token_ids, step.first_positions)
        now = time.monotonic()
        outputs, first_token_seqs, num_tokens = [], [], 0
        for seq, first, num_drafts in zip(step.sampled_seqs, step.first_positions, step.draft_counts, strict=True):
            if seq.is_finished:
                continue  # aborted while the step ran
            sampled = token_ids[first : first + num_drafts + 1]
            num_accepted = self.speculation.num_accepted(sampled, seq.draft_token_ids[:num_drafts])
            seq.draft_token_ids = []
            num_tokens_before = seq.num_tokens - 1  # the pending token counts already
            num_kept, finish_reason = self._take_tokens(seq, sampled[: num_accepted + 1])
            if seq.grammar is not None and num_kept > 1 and not all(map(seq.grammar.accept_token, sampled[1:num_kept])):
                finish_reason = FinishReason.ERROR  # never: each was drawn under the mask of its position
            if num_drafts:  # K/V is computed for the kept tokens but the last; the rejected drafts' slots go
                seq.num_computed_tokens = seq.num_tokens - 1
                self.block_manager.release_tail(seq, seq.num_computed_tokens)
                self.speculation.on_verified(seq, num_tokens_before, num_drafts)
                if self.linear_states is not None and self.linear_states.drafts is not None:
                    self.linear_states.drafts.after_verified(seq, num_tokens_before - 1, num_drafts)
            if seq.first_token_time is None:
                seq.first_token_time = now
                first_token_seqs.append(seq)
            if refused and seq in refused:
                logger.error("request %s: token %d is outside its grammar; ended", seq.request_id, sampled[0])
                finish_reason = FinishReason.ERROR
            if finish_reason is not None:
                self._finish(seq, finish_reason)
            outputs.append(_output(seq, sampled[:num_kept], logprobs[first : first + num_kept]))
            num_tokens += num_kept
        self.metrics.on_tokens(first_token_seqs, num_tokens, now)
        return outputs

    def _book_device_step(self, step: _DeviceStep, next_num_drafts: int | None) -> list[RequestOutput]:
        """Waits for a verifying step laid out on the device and books each row's accepted drafts and bonus token,
        up to the first that ends it (later ones are dropped, as the row of such a sequence in the step after). A
        row's blocks are kept up to what the next step, in flight with `next_num_drafts` (None: none is), can
        write; the rest go back."""
        assert self.speculation is not None
        result = step.pending.result()
        self.speculation.on_device_verified(result.num_drafts, result.num_accepted, step.num_drafts)
        width = step.num_drafts + 1
        outputs, num_tokens = [], 0
        for row, (seq, num_accepted) in enumerate(zip(step.seqs, result.num_accepted, strict=True)):
            if seq.is_finished:
                continue  # aborted, or ended by the step before, while this one ran
            first = row * width
            sampled = result.token_ids[first : first + num_accepted + 1]
            seq.add_pending_token(row, is_last=False)  # the row's first token, then its accepted ones
            num_kept, finish_reason = self._take_tokens(seq, sampled)
            seq.num_computed_tokens = seq.num_tokens - 1  # its last token's K/V is the next step's
            seq.num_history_tokens = seq.num_tokens
            kept = seq.num_computed_tokens if next_num_drafts is None else seq.num_tokens + next_num_drafts
            self.block_manager.release_tail(seq, kept)
            if finish_reason is not None:
                self._finish(seq, finish_reason)
            outputs.append(_output(seq, sampled[:num_kept], result.logprobs[first : first + num_kept]))
            num_tokens += num_kept
        self.metrics.on_tokens([], num_tokens, time.monotonic())
        return outputs

    def _take_tokens(self, seq: Sequence, token_ids: list[int]) -> tuple[int, FinishReason | None]:
        """Books the sampled token and the accepted ones after it, up to the first that ends the sequence: how
        many it kept, and why it ends (None: it goes on)."""
        num_kept = self._num_kept(seq, token_ids)
        seq.resolve_pending_token(token_ids[0])
        if num_kept > 1:
            seq.append_accepted_tokens(token_ids[1:num_kept])
        return num_kept, self._finish_reason(seq, token_ids[num_kept - 1])

    def _num_kept(self, seq: Sequence, token_ids: list[int]) -> int:
        """How many of a step's tokens for `seq` (its pending token's first) it keeps: up to the first that ends it,
        as `_finish_reason` finds it, in one pass over them (a verifying step books several tokens a row)."""
        params = seq.params
        num_outputs = seq.num_output_tokens  # with the pending token: the count each token i adds to is this + i
        room = min(seq.max_tokens - num_outputs, self.max_model_len - seq.num_tokens)  # tokens after the first
        num_kept = min(len(token_ids), room + 1)
        for i in range(max(0, params.min_tokens - num_outputs), num_kept):  # min_tokens bans stops before
            if self._is_stop_token(params, token_ids[i]):
                return i + 1
        return num_kept

    def _book_pooled(self, seqs: list[Sequence], pooled: list[np.ndarray], now: float) -> list[RequestOutput]:
        """Pooling sequences end with their pooled output (counted as their first token is, in the metrics)."""
        outputs, finished = [], []
        for seq, vector in zip(seqs, pooled, strict=True):
            if seq.is_finished:
                continue  # aborted while the step was in flight
            seq.first_token_time = now
            self._finish(seq, FinishReason.STOP)
            output = _output(seq, [], [])
            output.pooled = vector
            outputs.append(output)
            finished.append(seq)
        self.metrics.on_pooled(finished, now)
        return outputs

    def _book_constrained(self, seqs: list[Sequence], token_ids: list[int],
                          positions: list[int] | None = None) -> set[Sequence]:
        """Each live constrained sequence's matcher takes its token (seqs[i]'s at token_ids[positions[i]], or at
        token_ids[i] without positions), in one batched call; returns those whose grammar refused it. Positions are
        looked up for constrained rows only, so a step without grammars builds nothing."""
        if self._grammars is None:  # no request has asked for structured output: no sequence has a grammar
            return set()
        rows = [i for i, seq in enumerate(seqs) if seq.grammar is not None and not seq.is_finished]
        if not rows:
            return set()
        tokens = [token_ids[i if positions is None else positions[i]] for i in rows]
        accepted = self.grammars.accept([seqs[i].grammar for i in rows], tokens)  # type: ignore[misc]
        return {seqs[i] for i, ok in zip(rows, accepted, strict=True) if not ok}

    def _finish_reason(self, seq: Sequence, token_id: int) -> FinishReason | None:
        params = seq.params
        if seq.num_output_tokens >= params.min_tokens and self._is_stop_token(params, token_id):
            return FinishReason.STOP
        if self._reaches_length_limit(seq, seq.num_tokens):
            return FinishReason.LENGTH
        return None

    def _is_stop_token(self, params: SamplingParams, token_id: int) -> bool:
        """Whether `token_id` ends a sequence once it has its `min_tokens`: a stop token of the request's, or EOS
        unless it ignores EOS (checked per row and step: no tuple built)."""
        return token_id in params.stop_token_ids or (not params.ignore_eos and token_id in self.eos_token_ids)

    def _reaches_length_limit(self, seq: Sequence, num_tokens: int) -> bool:
        return num_tokens - seq.num_prompt_tokens >= seq.max_tokens or num_tokens >= self.max_model_len

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        if self._compiling.pop(seq, None) is not None:
            seq.status = SequenceStatus.FINISHED  # never reached the scheduler
        else:
            # A failed request's blocks may hold K/V its failed step never wrote: they leave the prefix cache.
            self.scheduler.finish(seq, keep_cached=reason is not FinishReason.ERROR)
        self._release_penalty_slot(seq)
        self._release_pooling_slot(seq)
        if self.linear_states is not None:
            self.linear_states.release(seq)
        if self.device_verification is not None:
            self.device_verification.release(seq)
        seq.finish_reason = reason
        if self.speculation is not None:
            self.speculation.on_finished(seq)
        self.metrics.on_finished(seq)
        del self._sequences[seq.request_id]

    def _linear_states(self, config: EngineConfig, info: ModelInfo) -> LinearStates | None:
        """A hybrid model's state slots (one per sequence that may run) and snapshots (after the slots' rows)."""
        if not info.has_linear_attention:
            return None
        max_num_seqs = config.scheduler.max_num_seqs
        num_snapshots = num_state_snapshots(config, info)
        if not num_snapshots and config.cache.enable_prefix_caching:
            logger.info("prefix caching off: the model's linear-attention layers keep no state snapshots")
        snapshots = StateSnapshots(num_snapshots, max_num_seqs, self.block_size) if num_snapshots else None
        spec = config.scheduler.speculative_config
        drafts = None if spec is None else DraftStates(max_num_seqs + num_snapshots, spec.num_speculative_tokens)
        return LinearStates(PenaltySlots(max_num_seqs), snapshots, drafts)

    def _release_penalty_slot(self, seq: Sequence) -> None:
        if seq.penalty_slot is not None:
            self.penalty_slots.release(seq.penalty_slot)
            seq.penalty_slot = None
            seq.steady_sampling = None  # it named the slot


    def _release_pooling_slot(self, seq: Sequence) -> None:
        if seq.pooling_slot is not None:
            self.pooling_slots.release(seq.pooling_slot)
            seq.pooling_slot = None



def _output(seq: Sequence, new_ids: list[int], new_logprobs: list[TokenLogprobs | None]) -> RequestOutput:
    is_first_token = bool(new_ids) and len(seq.token_ids) == seq.num_prompt_tokens + 1
    return RequestOutput(
        request_id=seq.request_id, new_token_ids=new_ids, new_logprobs=new_logprobs,
        finish_reason=seq.finish_reason, num_prompt_tokens=seq.num_prompt_tokens,
        num_output_tokens=seq.num_output_tokens, num_cached_prompt_tokens=seq.num_cached_prompt_tokens,
        prompt_logprobs=seq.prompt_logprobs if is_first_token else None,
    )


# Methods whose head runs in the target's runner, on the target's hidden states (core/mtp_proposer.py).
DRAFT_HEAD_METHODS = ("mtp", "eagle3")


def _is_full_attention_only(groups: tuple[KVCacheGroup, ...]) -> bool:
    return len(groups) == 1 and groups[0].sliding_window is None


def runner_config(config: EngineConfig, max_model_len: int | None = None) -> RunnerConfig:
    """The runner's part of an engine config. `max_model_len`: the engine's, resolved against the
    model (None: resolved here, from the checkpoint's config.json)."""
    c = config
    spec = c.scheduler.speculative_config
    if max_model_len is None:
        limit = read_model_info(c.model.model).max_position_embeddings
        max_model_len = _resolve_max_model_len(c.model.max_model_len, limit)
    return RunnerConfig(
        model_path=c.model.model, dtype=c.model.dtype, device=c.model.device, block_size=c.cache.block_size,
        num_kv_blocks=c.cache.num_blocks, gpu_memory_utilization=c.cache.gpu_memory_utilization,
        kv_cache_dtype=c.cache.kv_cache_dtype,
        max_num_seqs=c.scheduler.max_num_seqs, max_num_batched_tokens=c.scheduler.max_num_batched_tokens,
        max_model_len=max_model_len, enforce_eager=c.model.enforce_eager,
        attention_backend=c.model.attention_backend, seed=c.model.seed,
        tensor_parallel_size=c.model.tensor_parallel_size, cache_dir=str(cache_dir_for(c.model.download_dir)),
        load_format=c.model.load_format, num_state_snapshots=num_state_rows(c, read_model_info(c.model.model)),
        mtp_head=spec is not None and spec.method == "mtp",
        device_ngram=_device_ngram(c),
        eagle3_head=spec.model if spec is not None and spec.method == "eagle3" else None,
    )


def _device_ngram(config: EngineConfig) -> tuple[int, int, int] | None:
    """What the runner keeps a token history and compiles the device lookup for (most drafts, min n, max n): method
    ngram verifying on the device, in one process, with a lookup the kernel takes (gpu/kernels/ngram_drafts.py)."""
    spec = config.scheduler.speculative_config
    if (spec is None or spec.method != "ngram" or not spec.verify_on_device or config.model.tensor_parallel_size != 1
            or spec.prompt_lookup_max > MAX_LOOKUP):
        return None
    return spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max


def num_state_snapshots(config: EngineConfig, info: ModelInfo) -> int:
    """Rows of linear-attention state snapshots for prefix caching: none without linear layers or prefix caching."""
    if not info.has_linear_attention or not config.cache.enable_prefix_caching:
        return 0
    requested = config.cache.num_state_snapshots
    return requested if requested is not None else 2 * config.scheduler.max_num_seqs


def num_state_rows(config: EngineConfig, info: ModelInfo) -> int:
    """Rows of the linear-attention state cache after the sequence slots: the snapshots, then speculative decoding's
    states after each draft of a verified row (core/state_snapshots.py DraftStates)."""
    spec = config.scheduler.speculative_config
    num_draft_rows = config.scheduler.max_num_seqs * spec.num_speculative_tokens if spec is not None else 0
    return num_state_snapshots(config, info) + (num_draft_rows if info.has_linear_attention else 0)


def _check_draft_head(config: EngineConfig, method: str) -> None:
    """Method mtp needs a family whose head we run and a checkpoint that has it (an EAGLE-3 head's directory is
    checked as it loads). Under tensor parallelism each rank runs the head on its shard, as the target."""
    if method != "mtp":
        return
    hf_config = load_hf_config(config.model.model)
    prefix = mtp_checkpoint_prefix(hf_config)
    if prefix is None:
        raise ValueError(f"speculative_config.method 'mtp': no multi-token-prediction head is run for "
                         f"{hf_config.architectures} (it is for Qwen3-Next, Qwen3.5, Qwen3.5-MoE and GLM-4-MoE)")
    if config.model.load_format != "dummy" and not has_tensors_named(Path(config.model.model), prefix):
        raise ValueError(f"speculative_config.method 'mtp': the checkpoint {config.model.model!r} has no "
                         f"multi-token-prediction head (no tensor named {prefix}*)")


def _check_whole_prompts_fit(max_model_len: int, max_num_batched_tokens: int) -> None:
    """An encoder's prompt runs whole in one step: the longest must fit a step's token budget."""
    if max_num_batched_tokens < max_model_len:
        raise ValueError(f"an encoder runs each prompt in one step: max_num_batched_tokens ({max_num_batched_tokens}) "
                         f"must be >= max_model_len ({max_model_len})")


def _resolve_max_model_len(requested: int | None, model_limit: int) -> int:
    if requested is None:
        return model_limit
    if requested > model_limit:
        raise ValueError(f"max_model_len {requested} exceeds the model's max_position_embeddings {model_limit}")
    return requested
