"""Batched sampling on the device: greedy, temperature, top-k, top-p, min-p, banned tokens, logprobs,
after the logits are adjusted for logit bias, repetition penalties and allowed-token masks.

Random rows pick argmax(probs / noise) with noise ~ Exp(1), which draws from `probs` without
`torch.multinomial`. A seeded row's noise depends on (seed, output_index) alone, so it draws the
same token whatever else is in the batch and after a recompute.

Two implementations of the same draw:
- On CUDA with triton, rows without top-k/top-p/min-p go through one Triton kernel
  (gpu/kernels/sampling.py) that reads the model-dtype logits once: argmax for greedy rows,
  argmax(logits / T - log(E)) for random rows with E ~ Exp(1) from in-kernel Philox keyed per row.
  A seeded row's key is `_row_seed(seed, output_index)`; unseeded rows get fresh keys each step
  from one numpy generator seeded with the sampler's seed (host-side, so no sync and no generator
  object per row). Rows that use a filter take the torch path below, only those rows.
- Elsewhere (CPU, no triton, or built with `KernelConfig.fused_kernels` off) the torch code below does it all.
The two draw from the same distribution with different random streams: a seeded request gets
other tokens on CUDA than on CPU (each reproducible on its own device), as with vLLM.

Adjusting (in vLLM's order): logit bias, then penalties (gpu/penalties.py), then banned tokens and
token masks to -inf. A step with none of these takes the logits as the model made them (no copy);
otherwise a float32 copy is adjusted, every row's at once. On CUDA with triton (unless built with
`KernelConfig.fused_kernels` off) penalties and masks are one Triton pass each
(gpu/kernels/penalties.py, token_mask.py) that gives the same floats as the torch code, which reads and
writes the whole logits block a dozen times more. Each row's adjustment depends on that
row alone, so a seeded row still draws the same tokens alone or in any batch. Logprobs are always
those of the raw distribution.

Memory: the warm-up's heaviest sampling step (every row filtered, with logprobs) is in the peak that sizes the KV
cache. The torch path and the logprobs therefore take the rows in chunks of a bounded float32 [rows, vocab] size
(`row_chunks`), each chunk's work giving the floats the whole batch would (every op is per row); only the noise,
drawn as one block so the generator's stream is the one-pass stream, is as large as the batch. One exception on
CUDA: ATen picks cumsum's thread layout from the row count, so in a batch many times a chunk's rows the top-p mass
can differ from the one pass's in its last bit (as it already differs between batches of different sizes).
"""

from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch

from gpu.batch import PenaltySlotInit, RowSampling, StepResult, TokenMask
from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.host_to_device import to_device
from gpu.kernels import HAS_TRITON
from gpu.penalties import PenaltyState, apply_logit_bias
from gpu.pending_step import PendingStep, SampledRows
from gpu.token_mask import apply_token_bitmask

FUSED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The float32 [rows, vocab] size of one chunk of the torch path's and the logprobs' work. About twelve blocks of it
# are live at once on CUDA, in the sort (its outputs, ATen's index buffers and cub's double buffers): small against the
# KV cache it leaves room for, large enough that a chunk's few launches cost little against its sort.
SAMPLING_CHUNK_BYTES = 32 * 2**20


@dataclass
class SamplingTensors:
    temperatures: torch.Tensor  # [num_rows] float32, 1.0 on greedy rows
    is_greedy: torch.Tensor  # [num_rows] bool
    top_ks: torch.Tensor | None  # [num_rows] int64, vocab size where off; None when no row uses it
    top_ps: torch.Tensor | None  # [num_rows] float32
    min_ps: torch.Tensor | None  # [num_rows] float32

    def rows(self, chunk: slice) -> "SamplingTensors":
        """Those of a range of rows; a filter stays on (or off) for every chunk as for the whole batch."""
        def cut(column: torch.Tensor | None) -> torch.Tensor | None:
            return None if column is None else column[chunk]

        return SamplingTensors(self.temperatures[chunk], self.is_greedy[chunk], cut(self.top_ks), cut(self.top_ps),
                               cut(self.min_ps))


def build_sampling_tensors(rows: list[RowSampling], vocab_size: int, device: torch.device) -> SamplingTensors:
    def column(values: list, dtype: type) -> torch.Tensor:
        return to_device(values, dtype, device)

    uses_top_k = any(r.top_k is not None and r.top_k < vocab_size for r in rows if not r.is_greedy)
    uses_top_p = any(r.top_p < 1.0 for r in rows if not r.is_greedy)
    uses_min_p = any(r.min_p > 0.0 for r in rows if not r.is_greedy)
    return SamplingTensors(
        temperatures=column([r.temperature if not r.is_greedy else 1.0 for r in rows], np.float32),
        is_greedy=column([r.is_greedy for r in rows], np.bool_),
        top_ks=column([min(r.top_k or vocab_size, vocab_size) for r in rows], np.int64) if uses_top_k else None,
        top_ps=column([r.top_p for r in rows], np.float32) if uses_top_p else None,
        min_ps=column([r.min_p for r in rows], np.float32) if uses_min_p else None,
    )


@dataclass(frozen=True)
class GraphDraw:
    """A decode step's inputs to the in-graph draw, and the rows the torch path draws again after it."""

    keys: np.ndarray  # [num_rows] int64 Philox keys
    temperatures: np.ndarray  # [num_rows] float32, 0 on greedy rows
    filtered: list[int]  # rows with top-k, top-p or min-p


class Sampler:
    def __init__(self, device: torch.device, seed: int, kernels: KernelConfig = DEFAULT_KERNELS,
                 penalty_state: PenaltyState | None = None, max_chunk_bytes: int = SAMPLING_CHUNK_BYTES) -> None:
        self.device = device
        self.generator = torch.Generator(device=device)  # noise of the torch path
        self.generator.manual_seed(seed)
        self.key_rng = np.random.default_rng(seed)  # per-step Philox keys of the kernel's unseeded rows
        self.kernels = kernels
        self.penalty_state = penalty_state  # needed once a row has penalties
        self.max_chunk_bytes = max_chunk_bytes  # see `row_chunks`

    def __call__(self, logits: torch.Tensor, rows: list[RowSampling], slot_inits: list[PenaltySlotInit] | None = None,
                 token_mask: TokenMask | None = None) -> StepResult:
        """Samples and waits for the result on the host (tests, warm-up); the engine uses `sample`."""
        return PendingStep(self.sample(logits, rows, slot_inits, token_mask)).result()

    def sample(self, logits: torch.Tensor, rows: list[RowSampling], slot_inits: list[PenaltySlotInit] | None = None,
               token_mask: TokenMask | None = None) -> SampledRows:
        """logits: [num_rows, vocab_size] in the model's dtype or float32, one row per entry of `rows`;
        slot_inits: penalty slots to fill first; token_mask: allowed tokens of some rows.
        Queues the work on the device and returns without waiting for it."""
        return self.with_logprobs(logits, self.draw(logits, rows, slot_inits, token_mask), rows)

    def draw(self, logits: torch.Tensor, rows: list[RowSampling], slot_inits: list[PenaltySlotInit] | None = None,
             token_mask: TokenMask | None = None) -> torch.Tensor:
        """`sample`'s tokens ([num_rows] int64 on the device) without the logprobs."""
        adjusted = [i for i, r in enumerate(rows) if r.adjusts_logits]
        if adjusted or token_mask is not None:
            logits = self._adjusted_logits(logits, rows, adjusted, slot_inits, token_mask)
        if all(r.is_greedy for r in rows):
            # No filters, no noise, no per-row tensors to copy to the device, no float32 copy of the
            # logits (upcasting changes no order, so the argmax is the same): one argmax kernel.
            token_ids = logits.argmax(dim=-1)
        elif self._is_fused(logits):
            token_ids = self._fused_token_ids(logits, rows)
        else:
            token_ids = self._torch_token_ids(logits, rows)
        if adjusted:
            self._count_penalized(token_ids, rows, adjusted)
        return token_ids

    def with_logprobs(self, raw_logits: torch.Tensor, token_ids: torch.Tensor, rows: list[RowSampling]
                      ) -> SampledRows:
        """The drawn tokens, with the logprobs of the rows that ask for them (of the raw logits)."""
        return _with_logprobs(raw_logits, token_ids, rows, self.max_chunk_bytes)

    def _adjusted_logits(self, logits: torch.Tensor, rows: list[RowSampling], adjusted: list[int],
                         slot_inits: list[PenaltySlotInit] | None, token_mask: TokenMask | None) -> torch.Tensor:
        """A float32 copy of the logits with bias, penalties, bans and masks applied (see the module's doc)."""
        logits = logits.to(torch.float32, copy=True)
        biased = [i for i in adjusted if rows[i].logit_bias is not None]
        if biased:
            apply_logit_bias(logits, biased, [rows[i].logit_bias for i in biased])  # type: ignore[misc]
        penalized = [i for i in adjusted if rows[i].penalties is not None]
        if slot_inits:
            self._penalties().fill(slot_inits)
        use_kernels = self._uses_adjustment_kernels(logits)
        if penalized:
            self._penalties().apply(logits, self._where(penalized, len(rows)),
                                    [rows[i].penalties for i in penalized], use_kernels)  # type: ignore[misc]
        _ban_tokens(logits, rows, adjusted)
        if token_mask is not None and token_mask.row_indices:
            where = to_device(token_mask.row_indices, np.int64, logits.device)
            bitmask = to_device(token_mask.bitmask, np.int32, logits.device)
            if use_kernels:
                from gpu.kernels.token_mask import apply_token_bitmask as apply_token_bitmask_kernel

                apply_token_bitmask_kernel(logits, where, bitmask)
            else:
                apply_token_bitmask(logits, where, bitmask)
        return logits

    def _uses_adjustment_kernels(self, logits: torch.Tensor) -> bool:
        return self.kernels.fused_kernels and HAS_TRITON and logits.is_cuda

    def _count_penalized(self, token_ids: torch.Tensor, rows: list[RowSampling], adjusted: list[int]) -> None:
        penalized = [i for i in adjusted if rows[i].penalties is not None]
        if penalized:
            self._penalties().count(token_ids, self._where(penalized, len(rows)),
                                    [rows[i].penalties for i in penalized])  # type: ignore[misc]

    def _where(self, row_indices: list[int], num_rows: int) -> torch.Tensor | None:
        """The rows as a device index, or None when they are all of them (no gather needed)."""
        return None if len(row_indices) == num_rows else to_device(row_indices, np.int64, self.device)

    def _penalties(self) -> PenaltyState:
        if self.penalty_state is None:
            raise RuntimeError("a row has penalties but the sampler was given no PenaltyState")
        return self.penalty_state

    def _is_fused(self, logits: torch.Tensor) -> bool:
        return (self.kernels.fused_kernels and HAS_TRITON and logits.is_cuda and logits.dtype in FUSED_DTYPES
                and logits.stride(-1) == 1)

    def _fused_token_ids(self, logits: torch.Tensor, rows: list[RowSampling]) -> torch.Tensor:
        from gpu.kernels.sampling import sample_tokens

        filtered = _filtered_rows(rows, logits.shape[-1])
        if len(filtered) == len(rows):
            return self._torch_token_ids(logits, rows)
        token_ids = sample_tokens(logits, *self._philox_keys(rows), use_pdl=True)
        self._redraw_filtered(logits, token_ids, rows, filtered)
        return token_ids

    def _redraw_filtered(self, logits: torch.Tensor, token_ids: torch.Tensor, rows: list[RowSampling],
                         filtered: list[int]) -> None:
        """The rows with top-k, top-p or min-p drawn by the torch path into `token_ids`, in place: only these rows
        pay for the sort and softmax, and their draw is the torch path's, as alone."""
        if filtered:
            where = to_device(filtered, np.int64, logits.device)
            token_ids[where] = self._torch_token_ids(logits, [rows[i] for i in filtered], where)

    def _philox_keys(self, rows: list[RowSampling]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's 64-bit Philox key and its temperature (0 on greedy rows), in one copy to the device."""
        num_rows = len(rows)
        keys, temperatures = self._keys_and_temperatures(rows)
        packed = to_device(np.concatenate([keys.view(np.uint8), temperatures.view(np.uint8)]), np.uint8, self.device)
        return packed[: 8 * num_rows].view(torch.int64), packed[8 * num_rows :].view(torch.float32)

    def _keys_and_temperatures(self, rows: list[RowSampling]) -> tuple[np.ndarray, np.ndarray]:
        keys = self.key_rng.integers(0, 2**63 - 1, size=len(rows), dtype=np.int64)
        for i, row in enumerate(rows):
            if row.seed is not None:
                keys[i] = _row_seed(row.seed, row.output_index)
        return keys, np.array([r.temperature for r in rows], dtype=np.float32)  # 0 is greedy

    def graph_draw(self, rows: list[RowSampling], vocab_size: int) -> "GraphDraw | None":
        """The Philox keys and temperatures for a decode graph's in-graph draw (gpu/cuda_graphs.py), or None
        when a row adjusts its logits (bias, penalties, bans: the eager `sample` path). The keys are drawn as
        `sample` draws them for the same rows: none for an all-greedy step (its argmax needs none) or one whose
        every row is filtered (the torch path alone), one per row otherwise, so a step draws the same tokens
        with its sampling inside a graph or not. One pass over the rows: this runs every decode step."""
        filtered: list[int] = []
        is_all_greedy = True
        for i, r in enumerate(rows):
            if r.adjusts_logits:
                return None
            if r.temperature != 0.0:
                is_all_greedy = False
                if _uses_filters(r, vocab_size):
                    filtered.append(i)
        if is_all_greedy or len(filtered) == len(rows):
            temperatures = np.array([r.temperature for r in rows], dtype=np.float32)
            return GraphDraw(np.zeros(len(rows), dtype=np.int64), temperatures, filtered)
        return GraphDraw(*self._keys_and_temperatures(rows), filtered)

    def finish_graph_draw(self, logits: torch.Tensor, token_ids: torch.Tensor, rows: list[RowSampling],
                          draw: "GraphDraw") -> SampledRows:
        """A step whose rows a decode graph drew (with `draw`'s inputs): the rows with top-k, top-p or min-p
        drawn again by the torch path, as `sample` does, and the logprobs asked for."""
        self._redraw_filtered(logits, token_ids, rows, draw.filtered)
        return _with_logprobs(logits, token_ids, rows, self.max_chunk_bytes)

    def _torch_token_ids(self, logits: torch.Tensor, rows: list[RowSampling],
                         where: torch.Tensor | None = None) -> torch.Tensor:
        """The tokens of `rows` drawn from logits[where] (every row of `logits` where None): float32 or the model's
        dtype, banned tokens already at -inf. Chunk by chunk of rows (see the module's doc); upcasting per chunk
        changes no float (the division by the temperature computes in float32 either way)."""
        vocab_size = logits.shape[-1]
        tensors = build_sampling_tensors(rows, vocab_size, logits.device)
        noise = self._exponential_noise(rows, vocab_size, logits.device)
        token_ids = []
        for chunk in row_chunks(len(rows), vocab_size, self.max_chunk_bytes):
            chunk_logits = logits[chunk] if where is None else logits[where[chunk]]
            random_ids = _filtered_probs(chunk_logits, tensors.rows(chunk)).div_(noise[chunk]).argmax(dim=-1)
            token_ids.append(torch.where(tensors.is_greedy[chunk], chunk_logits.argmax(dim=-1), random_ids))
        return _joined(token_ids)

    def _exponential_noise(self, rows: list[RowSampling], vocab_size: int, device: torch.device) -> torch.Tensor:
        noise = torch.empty(len(rows), vocab_size, dtype=torch.float32, device=device)
        noise.exponential_(generator=self.generator)
        for i, row in enumerate(rows):
            if row.seed is not None and not row.is_greedy:
                generator = torch.Generator(device=device)
                generator.manual_seed(_row_seed(row.seed, row.output_index))
                noise[i].exponential_(generator=generator)
        return noise  # [num_rows, vocab] float32


def _filtered_rows(rows: list[RowSampling], vocab_size: int) -> list[int]:
    """Indices of the random rows with top-k, top-p or min-p (one tight pass: this runs every step)."""
    return [i for i, r in enumerate(rows) if r.temperature != 0.0 and _uses_filters(r, vocab_size)]


def _uses_filters(row: RowSampling, vocab_size: int) -> bool:
    """top-k, top-p or min-p: the torch path draws the row (on a greedy row they change nothing)."""
    return row.top_p < 1.0 or row.min_p > 0.0 or (row.top_k is not None and row.top_k < vocab_size)


def _ban_tokens(logits: torch.Tensor, rows: list[RowSampling], adjusted: list[int]) -> None:
    """Banned tokens (min_tokens' EOS and stop ids) to -inf, in place."""
    pairs = [(i, token_id) for i in adjusted for token_id in rows[i].banned_token_ids]
    if pairs:
        where = to_device(pairs, np.int64, logits.device)  # [num_banned, 2]: row, token id
        logits[where[:, 0], where[:, 1]] = float("-inf")


def row_chunks(num_rows: int, vocab_size: int, max_bytes: int) -> list[slice]:
    """Consecutive ranges of rows, each of at most max_bytes of float32 [rows, vocab], at least two rows each
    unless num_rows is 1: PyTorch scans (cumsum) a single row on CUDA with other arithmetic than a block of rows."""
    rows_per_chunk = max(2, max_bytes // (4 * vocab_size))
    bounds = [*range(0, num_rows, rows_per_chunk), num_rows]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:
        del bounds[-2]  # a last single row joins the chunk before it
    return [slice(start, end) for start, end in pairwise(bounds)]


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The chunks' results as one tensor; a step of one chunk (the usual one) pays no copy."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _filtered_probs(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """The float32 probabilities after temperature, top-k, top-p and min-p; `logits` is left as it is."""
    scaled = logits / t.temperatures.unsqueeze(1)  # a new float32 block, which the filters change in place
    if t.top_ks is not None or t.top_ps is not None:
        _drop_outside_top_k_top_p(scaled, t.top_ks, t.top_ps)
    probs = scaled.softmax(dim=-1)
    del scaled
    if t.min_ps is not None:
        max_probs = probs.max(dim=-1, keepdim=True).values
        probs.masked_fill_(probs < t.min_ps.unsqueeze(1) * max_probs, 0.0)
    return probs


def _drop_outside_top_k_top_p(logits: torch.Tensor, top_ks: torch.Tensor | None, top_ps: torch.Tensor | None) -> None:
    """Sets to -inf, in place, each row's logits past its top k and then outside its top-p nucleus of what is left."""
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)
    if top_ks is not None:
        ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
        sorted_logits.masked_fill_(ranks >= top_ks.unsqueeze(1), float("-inf"))
    if top_ps is not None:
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1).sub_(sorted_probs)
        del sorted_probs
        sorted_logits.masked_fill_(mass_before >= top_ps.unsqueeze(1), float("-inf"))  # keeps the most likely token
    logits.scatter_(-1, sorted_ids, sorted_logits)  # sorted_ids is a permutation of each row: every entry written


def _row_seed(seed: int, output_index: int) -> int:
    # splitmix64 of the pair: nearby seeds and indices give unrelated streams.
    x = (seed * 0x9E3779B97F4A7C15 + output_index + 1) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 31)) & 0x7FFFFFFFFFFFFFFF


def _with_logprobs(raw_logits: torch.Tensor, token_ids: torch.Tensor, rows: list[RowSampling],
                   max_chunk_bytes: int) -> SampledRows:
    """The sampled ids, and where any row asks for logprobs, one packed tensor for a single copy to the host."""
    wanted = [r.num_top_logprobs for r in rows]
    if all(n is None for n in wanted):
        return SampledRows(token_ids, None, wanted)
    num_top = max(n or 0 for n in wanted)
    chunks = row_chunks(raw_logits.shape[0], raw_logits.shape[-1], max_chunk_bytes)
    packed = [_logprob_columns(raw_logits[chunk], token_ids[chunk], num_top) for chunk in chunks]
    return SampledRows(token_ids, _joined(packed), wanted)


def _logprob_columns(raw_logits: torch.Tensor, token_ids: torch.Tensor, num_top: int) -> torch.Tensor:
    """[num_rows, 3 + 2 * num_top] float64: each row's token id, its logprob, its rank, top ids, top logprobs."""
    logprobs = raw_logits.float().log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_ids.unsqueeze(1))  # [num_rows, 1]
    ranks = (logprobs > chosen).sum(dim=-1, keepdim=True) + 1
    top_values, top_ids = logprobs.topk(num_top, dim=-1)  # [num_rows, num_top], possibly 0 wide
    columns = [token_ids.unsqueeze(1), chosen, ranks, top_ids, top_values]
    return torch.cat([c.double() for c in columns], dim=1)
