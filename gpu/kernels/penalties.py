"""Triton kernel: repetition, frequency and presence penalties on float32 logits, in place, in one pass.

The torch path (gpu/penalties.py's `PenaltyState.apply`, the reference) reads and writes the whole
[rows, vocab] block some twenty times (a gather of the counts, comparisons, two `where`s, products,
differences, a copy back): about 5 GB per step at 256 rows of 151,936 tokens. This kernel reads each
row's logits, counts and prompt marks once and writes the logits once (about 0.5 GB), with the same
float32 operations in the same order, IEEE division (Triton's `/` is approximate in float32) and no
fused multiply-adds, so its results equal the reference's bit for bit:
    seen = count > 0 or in prompt;  x = seen ? (x < 0 ? x * repetition : x / repetition) : x
    x = (x - frequency * count) - presence * (count > 0)
each line only where the wrapper's flags say a row of the batch uses it (as the reference skips it).

Grid (penalized row, vocab block). Invariants the wrapper checks: logits float32 with unit stride along
the vocab; rows, slots [n] int64 and values [n, 3] float32 (presence, frequency, repetition), contiguous;
counts [slots, vocab] int32 and prompt_seen [slots, vocab] bool, contiguous; all on one device.
"""

import torch
import triton
import triton.language as tl

BLOCK = 2048
NUM_WARPS = 8


# One compiled variant per vocabulary (the flags are read at run time; warm-up compiles it).
@triton.jit(do_not_specialize=["logits_stride", "use_prompt", "use_counts"])
def _penalties_kernel(logits_ptr, rows_ptr, slots_ptr, values_ptr, counts_ptr, prompt_ptr, logits_stride,
                      use_prompt, use_counts, VOCAB: tl.constexpr, BLOCK_: tl.constexpr):
    i = tl.program_id(0)
    ids = tl.program_id(1) * BLOCK_ + tl.arange(0, BLOCK_)
    in_vocab = ids < VOCAB
    row = tl.load(rows_ptr + i)
    slot = tl.load(slots_ptr + i)
    row_ptr = logits_ptr + row * logits_stride
    x = tl.load(row_ptr + ids, mask=in_vocab, other=0.0)
    count = tl.load(counts_ptr + slot * VOCAB + ids, mask=in_vocab, other=0)
    is_generated = count > 0
    if use_prompt != 0:
        repetition = tl.load(values_ptr + 3 * i + 2)
        is_seen = is_generated | (tl.load(prompt_ptr + slot * VOCAB + ids, mask=in_vocab, other=0) != 0)
        penalized = tl.where(x < 0, x * repetition, tl.math.div_rn(x, repetition))
        x = tl.where(is_seen, penalized, x)
    if use_counts != 0:
        presence = tl.load(values_ptr + 3 * i)
        frequency = tl.load(values_ptr + 3 * i + 1)
        x = x - frequency * count.to(tl.float32)
        x = x - presence * is_generated.to(tl.float32)
    tl.store(row_ptr + ids, x, mask=in_vocab)


def apply_penalties(
    logits: torch.Tensor,  # [num_rows, vocab] float32, changed in place
    rows: torch.Tensor,  # [n] int64: the penalized rows of `logits`
    slots: torch.Tensor,  # [n] int64: each row's slot in counts and prompt_seen
    values: torch.Tensor,  # [n, 3] float32: presence, frequency, repetition
    counts: torch.Tensor,  # [num_slots, vocab] int32: generated tokens per slot
    prompt_seen: torch.Tensor,  # [num_slots, vocab] bool: prompt tokens per slot
    use_prompt: bool,  # some row's repetition penalty is not 1
    use_counts: bool,  # some row's frequency or presence penalty is not 0
) -> None:
    """No host sync; the grid depends on shapes only."""
    _check(logits, rows, slots, values, counts, prompt_seen)
    if not len(rows) or not (use_prompt or use_counts):
        return
    vocab = logits.shape[1]
    # No fused multiply-adds: x - frequency * count rounds the product first, as torch's two kernels do.
    _penalties_kernel[(len(rows), triton.cdiv(vocab, BLOCK))](
        logits, rows, slots, values, counts, prompt_seen.view(torch.uint8), logits.stride(0), int(use_prompt),
        int(use_counts), VOCAB=vocab, BLOCK_=BLOCK, num_warps=NUM_WARPS, enable_fp_fusion=False,
    )


def _check(logits: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, values: torch.Tensor,
           counts: torch.Tensor, prompt_seen: torch.Tensor) -> None:
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError(f"logits must be 2-d float32 with unit stride along the vocab, got {logits.dtype} "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    n, vocab = len(rows), logits.shape[1]
    expected = {"rows": (rows, (n,), torch.int64), "slots": (slots, (n,), torch.int64),
                "values": (values, (n, 3), torch.float32),
                "counts": (counts, (counts.shape[0], vocab), torch.int32),
                "prompt_seen": (prompt_seen, (counts.shape[0], vocab), torch.bool)}
    for name, (tensor, shape, dtype) in expected.items():
        if tuple(tensor.shape) != shape or tensor.dtype != dtype or not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous {list(shape)} {dtype}, got {tensor.dtype} "
                             f"{tuple(tensor.shape)} strides {tensor.stride()}")
        if tensor.device != logits.device:
            raise ValueError(f"{name} is on {tensor.device}, logits on {logits.device}")
