"""gpu/kernels/verify_layout.py compiled on CUDA: a verifying step's layout and acceptance equal
gpu/device_verification.py's torch functions on random steps (tests/unit/verify_layout_cases.py), and a CUDA graph
that captured both lays out and accepts from whatever history its replay finds."""

import random

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels need CUDA", allow_module_level=True)

from gpu import device_verification as verification  # noqa: E402
from gpu.device_verification import StepInputs, StepShape  # noqa: E402
from gpu.token_history import TokenHistory  # noqa: E402
from tests.gpu.graph_capture import captured  # noqa: E402
from tests.unit.verify_layout_cases import check_random_steps  # noqa: E402

CUDA = torch.device("cuda")


def test_random_steps_lay_out_and_accept_as_the_torch_functions() -> None:
    check_random_steps(random.Random(0), CUDA, 300)


@pytest.mark.parametrize("num_drafts", [0, 3])
def test_a_captured_step_lays_out_and_accepts_from_the_history_at_replay(num_drafts: int) -> None:
    rng = random.Random(num_drafts)
    num_rows, max_model_len, block_size = 4, 512, 16
    history, twin = (TokenHistory(num_rows, max_model_len, CUDA) for _ in range(2))
    max_blocks = max_model_len // block_size
    inputs = StepInputs(torch.arange(num_rows, device=CUDA), torch.full((num_rows,), max_blocks, device=CUDA),
                        torch.arange(num_rows * max_blocks, dtype=torch.int32, device=CUDA).view(num_rows, -1))
    shape = StepShape(num_drafts, 1, 4, block_size, max_model_len)
    sampled = torch.zeros(num_rows * (num_drafts + 1), dtype=torch.int64, device=CUDA)

    def step() -> tuple[verification.VerifyInputs, torch.Tensor]:
        laid_out = verification.kernel_lay_out(history, inputs, shape)
        return laid_out, verification.kernel_accept(history, inputs, laid_out, sampled)

    history.lengths[:num_rows] = 1
    graph, (laid_out, counts) = captured(step)
    for _ in range(10):
        lengths = [rng.randint(1, max_model_len - num_drafts - 1) for _ in range(num_rows)]
        tokens = torch.randint(0, 4, (num_rows + 1, max_model_len + 1), dtype=torch.int32, device=CUDA)
        for h in (history, twin):
            h.tokens.copy_(tokens)
            h.lengths[:num_rows] = torch.tensor(lengths, dtype=torch.int32)
        expected = verification.torch_lay_out(twin, inputs, shape)
        agreeing = torch.cat([expected.drafts, torch.zeros_like(expected.num_drafts)[:, None]], dim=1).reshape(-1)
        sampled.copy_(torch.where(torch.rand(sampled.shape, device=CUDA) < 0.7, agreeing, 3))
        expected_counts = verification.torch_accept(twin, inputs, expected, sampled)
        graph.replay()
        assert torch.equal(laid_out.token_ids, expected.token_ids) and torch.equal(laid_out.drafts, expected.drafts)
        assert torch.equal(laid_out.meta.slot_mapping, expected.meta.slot_mapping)
        assert torch.equal(counts, expected_counts)
        assert torch.equal(history.lengths, twin.lengths)
        assert torch.equal(history.tokens[:, :-1], twin.tokens[:, :-1])
