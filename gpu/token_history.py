"""Each running sequence's tokens, kept on the device, so a verifying step can draft from them and lay itself out
there (gpu/device_verification.py) without waiting for the previous step's tokens on the host.

A sequence owns a slot (a row of `tokens`; core assigns it, as the penalty slots) while it runs. The host writes a
slot's tokens once (the prompt and any tokens a step that kept no history gave it: `fill`); after that each verifying
step appends its accepted tokens on the device (`append`). `lengths[slot]` is the tokens the slot holds; its last
token's K/V is not computed yet (the next verifying step's first input, as a decode row's token).
Invariants: 0 <= lengths <= max_model_len; `tokens` has one column more, where the writes of tokens a step did not
accept go (no mask that would need a host sync). One slot more than core assigns, `padding_slot`, holds one token
for good: the padding rows of a verify graph (gpu/verify_graphs.py) read it and append nothing.
"""

from dataclasses import dataclass

import numpy as np
import torch

from gpu.host_to_device import to_device

# The longest n-gram the device lookup takes (gpu/kernels/ngram_drafts.py keeps n above a 24-bit match end in one
# int32 key); here, where modules that run without Triton can read it.
MAX_LOOKUP = 127


@dataclass(frozen=True)
class HistoryFill:
    """Tokens the host knows and a slot lacks: they go to slot columns [start, start + len(token_ids)), and the slot
    then holds start + len(token_ids) tokens; with `pending_row`, one more: the token the step in flight sampled at
    that row, copied on the device (the host has not booked it yet)."""

    slot: int
    start: int
    token_ids: list[int]
    pending_row: int | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids) + (self.pending_row is not None)


class TokenHistory:
    def __init__(self, num_slots: int, max_model_len: int, device: torch.device) -> None:
        """`num_slots`: the sequences' slots (core's), the padding slot beside them."""
        self.max_model_len = max_model_len
        self.padding_slot = num_slots
        self.tokens = torch.zeros(num_slots + 1, max_model_len + 1, dtype=torch.int32, device=device)
        self.lengths = torch.zeros(num_slots + 1, dtype=torch.int32, device=device)
        self.lengths[self.padding_slot] = 1  # so its row's positions start at 0

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def fill(self, fills: list[HistoryFill], pending_token_ids: torch.Tensor | None = None) -> None:
        """Writes the host's tokens and the slots' lengths, in one copy to the device, and the pending tokens the
        fills name from `pending_token_ids` (the step in flight's sampled tokens, on the device)."""
        if not fills:
            return
        counts = np.fromiter((len(f.token_ids) for f in fills), dtype=np.int64, count=len(fills))
        slots = np.fromiter((f.slot for f in fills), dtype=np.int64, count=len(fills))
        starts = np.fromiter((f.start for f in fills), dtype=np.int64, count=len(fills))
        ends = np.fromiter((f.end for f in fills), dtype=np.int64, count=len(fills))
        pending = np.array([(f.slot, f.end - 1, f.pending_row) for f in fills if f.pending_row is not None],
                           dtype=np.int64).reshape(-1, 3).T  # slots, columns, rows of the step's sampled tokens
        columns = np.repeat(starts - counts.cumsum() + counts, counts) + np.arange(int(counts.sum()))  # start + i
        packed = to_device(np.concatenate([slots, ends, np.repeat(slots, counts), columns, pending.ravel(),
                                           *(f.token_ids for f in fills)]).astype(np.int64), np.int64, self.device)
        num_rows, num_tokens, num_pending = len(fills), int(counts.sum()), pending.shape[1]
        fill_slots, fill_ends, token_slots, token_columns, pending_slots, pending_columns, pending_rows, token_ids = (
            packed.split([num_rows, num_rows, num_tokens, num_tokens, num_pending, num_pending, num_pending,
                          num_tokens]))
        self.tokens[token_slots, token_columns] = token_ids.to(torch.int32)
        if num_pending:
            assert pending_token_ids is not None, "a fill names a pending token but no step's tokens were given"
            self.tokens[pending_slots, pending_columns] = pending_token_ids[pending_rows].to(torch.int32)
        self.lengths[fill_slots] = fill_ends.to(torch.int32)

    def append(self, slots: torch.Tensor, token_ids: torch.Tensor, num_new: torch.Tensor) -> None:
        """Appends token_ids[r, :num_new[r]] to slot slots[r]'s tokens (slots distinct; the rest of each row goes to
        the spare column). slots [R] int64, token_ids [R, W] int64, num_new [R] int64."""
        lengths = self.lengths[slots].to(torch.int64)
        offsets = torch.arange(token_ids.shape[1], device=self.device)
        columns = lengths[:, None] + offsets
        is_kept = (offsets < num_new[:, None]) & (columns < self.max_model_len)
        columns = torch.where(is_kept, columns, self.max_model_len)
        self.tokens[slots[:, None].expand_as(columns), columns] = token_ids.to(torch.int32)
        self.lengths[slots] = torch.clamp(lengths + num_new, max=self.max_model_len).to(torch.int32)


def torch_ngram_drafts(history: torch.Tensor, lengths: torch.Tensor, max_drafts: int, min_n: int, max_n: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """gpu/kernels/ngram_drafts.py's result computed with torch operations (the CPU's path, and the reference the
    kernel's contract restates): each row's core/ngram_proposer.py `lookup_draft` of its first `lengths[row]` tokens,
    as drafts [R, max_drafts] int32 (0 past a row's count) and num_drafts [R] int32 (max_drafts or 0)."""
    num_rows, num_columns = history.shape
    last = torch.clamp(lengths.to(torch.int64), max=num_columns) - 1  # [R]; a match ends before the last token
    ends = torch.arange(num_columns, device=history.device)  # [L]
    is_matching = ends[None, :] < last[:, None]
    n = torch.zeros(num_rows, num_columns, dtype=torch.int64, device=history.device)
    for j in range(max_n):
        is_matching &= ends[None, :] >= j
        suffix_token = history.gather(1, torch.clamp(last - j, min=0)[:, None])
        token = history[:, torch.clamp(ends - j, min=0)]
        is_matching &= token == suffix_token
        n += is_matching
    keys = torch.where(n >= min_n, n * num_columns + ends, -1)  # the longest n, then the latest end
    best = keys.max(dim=1).values if num_columns else torch.full((num_rows,), -1, device=history.device)
    is_found = best >= 0
    end = torch.where(is_found, best % num_columns, 0)
    period = torch.where(is_found, last - end, 1)
    offsets = torch.arange(max_drafts, device=history.device)
    columns = torch.clamp(end[:, None] + 1 + offsets % period[:, None], max=max(num_columns - 1, 0))
    drafts = torch.where(is_found[:, None], history.gather(1, columns), 0).to(torch.int32)
    return drafts, torch.where(is_found, max_drafts, 0).to(torch.int32)
