"""Random verifying steps for gpu/kernels/verify_layout.py's tests (under Triton's interpreter here, compiled in
tests/gpu): the kernels' layout and acceptance against gpu/device_verification.py's torch functions, output by
output."""

import random
from dataclasses import fields

import torch

from gpu import device_verification as verification
from gpu.device_verification import StepInputs, StepShape, VerifyInputs
from gpu.token_history import TokenHistory


def random_step(rng: random.Random, device: torch.device) -> tuple[TokenHistory, StepInputs, StepShape]:
    """A history of slots of random lengths (some full) in a small vocabulary, so that lookups match, and a step of
    rows on distinct slots, some padding rows, some rows whose blocks do not cover every position."""
    num_slots, max_model_len, block_size = rng.randint(1, 10), rng.choice([8, 40, 300]), rng.choice([4, 16])
    history = TokenHistory(num_slots, max_model_len, device)
    vocab = rng.choice([2, 5, 50])
    history.tokens[:num_slots] = torch.randint(0, vocab, (num_slots, max_model_len + 1), dtype=torch.int32,
                                               generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
    lengths = [rng.choice([1, 2, max_model_len, rng.randint(1, max_model_len)]) for _ in range(num_slots)]
    history.lengths[:num_slots] = torch.tensor(lengths, dtype=torch.int32)
    k = rng.randint(0, 5)
    max_blocks = -(-max_model_len // block_size)
    slots = rng.sample(range(num_slots), rng.randint(1, num_slots)) + [history.padding_slot] * rng.randint(0, 2)
    num_blocks = []
    for slot in slots:
        needed = -(-(int(history.lengths[slot]) + k) // block_size)
        covered = needed if rng.random() < 0.8 else rng.randint(0, needed)
        num_blocks.append(0 if slot == history.padding_slot else min(max_blocks, covered))
    tables = torch.tensor([[rng.randrange(1000) for _ in range(max_blocks)] for _ in slots], dtype=torch.int32)
    inputs = StepInputs(torch.tensor(slots, device=device), torch.tensor(num_blocks, device=device),
                        tables.to(device))
    min_n = rng.randint(1, 3)
    return history, inputs, StepShape(k, min_n, rng.randint(min_n, 5), block_size, max_model_len)


def laid_out_alike(fused: VerifyInputs, reference: VerifyInputs) -> None:
    for name in ("token_ids", "positions", "drafts", "num_drafts"):
        assert torch.equal(getattr(fused, name), getattr(reference, name)), name
    for field in fields(reference.meta):
        mine, theirs = getattr(fused.meta, field.name), getattr(reference.meta, field.name)
        if field.name == "query_rows" and theirs is not None:
            for part in ("rows", "context_lens", "block_tables", "queries_per_row"):
                assert _equal(getattr(mine, part), getattr(theirs, part)), part
        else:
            assert _equal(mine, theirs), field.name


def check_random_steps(rng: random.Random, device: torch.device, num_steps: int) -> None:
    """Layout, then acceptance of sampled tokens that agree with the drafts for a random stretch: every output and the
    histories after (but their spare column) equal the torch functions'."""
    for _ in range(num_steps):
        history, inputs, shape = random_step(rng, device)
        reference = verification.torch_lay_out(history, inputs, shape)
        fused = verification.kernel_lay_out(history, inputs, shape)
        laid_out_alike(fused, reference)
        k, num_rows = shape.num_drafts, inputs.slots.shape[0]
        sampled = torch.randint(0, 5, (num_rows, k + 1), generator=torch.Generator().manual_seed(rng.randrange(99)))
        sampled = sampled.to(device)
        for row in range(num_rows):
            agree = rng.randint(0, k)
            sampled[row, :agree] = reference.drafts[row, :agree]
        twin = TokenHistory(history.padding_slot, history.max_model_len, device)
        twin.tokens.copy_(history.tokens)
        twin.lengths.copy_(history.lengths)
        expected = verification.torch_accept(history, inputs, reference, sampled.reshape(-1))
        counts = verification.kernel_accept(twin, inputs, fused, sampled.reshape(-1))
        assert torch.equal(counts, expected)
        assert torch.equal(twin.lengths, history.lengths)
        assert torch.equal(twin.tokens[:, :-1], history.tokens[:, :-1])


def _equal(a: object, b: object) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
