"""Allowed-token bitmasks (structured output) applied to logits on the device.

A mask row is ceil(vocab / 32) int32 words, bit `t % 32` of word `t // 32` set when token t is
allowed: the layout xgrammar and llguidance fill. Tokens past the mask's words are disallowed.
"""

import torch


def apply_token_bitmask(logits: torch.Tensor, where: torch.Tensor, bitmask: torch.Tensor) -> None:
    """logits[where[i], t] = -inf where bitmask[i] disallows token t (logits float32, in place).
    where: [num_masked] int64, bitmask: [num_masked, num_words] int32, both on the logits' device."""
    vocab_size = logits.shape[-1]
    bits = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool().flatten(1)  # [num_masked, 32 * num_words]
    if allowed.shape[1] < vocab_size:
        allowed = torch.nn.functional.pad(allowed, (0, vocab_size - allowed.shape[1]), value=False)
    logits[where] = logits[where].masked_fill(~allowed[:, :vocab_size], float("-inf"))
