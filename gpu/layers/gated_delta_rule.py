"""The gated delta rule of Gated DeltaNet layers, in torch: the reference every kernel is tested against, and the CPU
path. Both forms compute, per value head, with S the [key_dim, value_dim] recurrent state (float32):

    S <- exp(g_t) * S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t

with q and k L2-normalized and q scaled by key_dim ** -0.5, as transformers' Qwen3-Next and Qwen3.5 compute it.
`chunked` runs a sequence's tokens in chunks of 64 (a triangular solve per chunk, then one state update per chunk),
`recurrent` one token of many sequences at once (a decode step). Either starts from a given state and returns the
state after its last token, so a prompt computed in several steps (chunked prefill) continues where it stopped.

Grouped heads: each query/key head serves num_value_heads // num_key_heads consecutive value heads.
"""

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64


def l2_normalized(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepared(q: torch.Tensor, k: torch.Tensor, num_value_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k in float32, one head per value head, normalized, q scaled."""
    if q.shape[-2] != num_value_heads:
        q = q.repeat_interleave(num_value_heads // q.shape[-2], dim=-2)
        k = k.repeat_interleave(num_value_heads // k.shape[-2], dim=-2)
    q, k = l2_normalized(q.float()), l2_normalized(k.float())
    return q * q.shape[-1] ** -0.5, k


def recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of each of B sequences: q, k [B, Hk, dk], v [B, Hv, dv], g, beta [B, Hv], state [B, Hv, dk, dv]
    float32. Returns (output [B, Hv, dv] float32, the new state)."""
    q, k = _prepared(q, k, v.shape[-2])
    state = state * g.float().exp()[..., None, None]
    predicted = (state * k.unsqueeze(-1)).sum(dim=-2)  # [B, Hv, dv]
    delta = (v.float() - predicted) * beta.float().unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return (state * q.unsqueeze(-1)).sum(dim=-2), state


def chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The L tokens of one sequence: q, k [L, Hk, dk], v [L, Hv, dv], g, beta [L, Hv], state [Hv, dk, dv] float32.
    Returns (output [L, Hv, dv] float32, the state after the last token)."""
    length, num_heads = v.shape[0], v.shape[1]
    q, k = _prepared(q, k, num_heads)
    # [Hv, L, d] per head, padded to whole chunks (padded tokens have g = 0, beta = 0: they change nothing)
    q, k, v = (x.transpose(0, 1) for x in (q, k, v.float()))
    beta, g = beta.float().transpose(0, 1), g.float().transpose(0, 1)
    pad = (CHUNK_SIZE - length % CHUNK_SIZE) % CHUNK_SIZE
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    k_beta, v_beta = k * beta.unsqueeze(-1), v * beta.unsqueeze(-1)
    q, k, k_beta, v_beta = (x.reshape(num_heads, -1, CHUNK_SIZE, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    cum_g = g.reshape(num_heads, -1, CHUNK_SIZE).cumsum(dim=-1)  # [Hv, chunks, C]
    upper = torch.ones(CHUNK_SIZE, CHUNK_SIZE, dtype=torch.bool, device=q.device).triu(1)
    decay = (cum_g.unsqueeze(-1) - cum_g.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()  # [.., i, j]
    system = (k_beta @ k.transpose(-1, -2)) * decay
    within = (q @ k.transpose(-1, -2)) * decay
    new_values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cum_decay = torch.linalg.solve_triangular(system, k_beta * cum_g.exp().unsqueeze(-1), upper=False,
                                                unitriangular=True)
    q = q * cum_g.exp().unsqueeze(-1)
    k = k * (cum_g[..., -1:] - cum_g).exp().unsqueeze(-1)
    chunk_decay = cum_g[..., -1].exp()[..., None, None]
    out = torch.empty_like(new_values)
    for i in range(new_values.shape[1]):
        v_new = new_values[:, i] - k_cum_decay[:, i] @ state
        out[:, i] = q[:, i] @ state + within[:, i] @ v_new
        state = state * chunk_decay[:, i] + k[:, i].transpose(-1, -2) @ v_new
    return out.reshape(num_heads, -1, out.shape[-1])[:, :length].transpose(0, 1), state


def conv_step(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of each of B sequences through the depthwise causal convolution and SiLU: x [B, C], conv_state
    [B, C, K - 1] (the previous K - 1 inputs), weight [C, K]. Returns (output [B, C], the new conv state)."""
    window = torch.cat((conv_state, x.unsqueeze(-1).to(conv_state.dtype)), dim=-1)  # [B, C, K]
    out = (window.to(weight.dtype) * weight).sum(dim=-1)
    return F.silu(out).to(x.dtype), window[..., 1:]


def conv_packed(x: torch.Tensor, initial: torch.Tensor, weight: torch.Tensor, gather: torch.Tensor | None,
                outputs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens of many sequences at once, each a causal convolution from its own conv state (SiLU after it): x
    [N, C] (the sequences' tokens packed), initial [B, C, K - 1] (each sequence's conv state), weight [C, K]; `gather`
    puts each sequence's K - 1 state inputs before its tokens in one window ([W] indices into [initial's B * (K - 1)
    inputs; x]) and `outputs` picks each token's output among the window's W - K + 1 (gpu/attention/metadata.py's
    ConvWindows; None for one sequence). Returns (output [N, C], the window [W, C] in the conv state's dtype, whose
    columns hold every conv state along the way)."""
    window = torch.cat((initial.transpose(1, 2).reshape(-1, x.shape[1]), x.to(initial.dtype)))
    if gather is not None:
        window = window[gather]  # [W, C]
    out = F.silu(F.conv1d(window.t().unsqueeze(0).to(weight.dtype), weight.unsqueeze(1), groups=weight.shape[0])[0])
    return (out.t()[: x.shape[0]] if outputs is None else out.t()[outputs]).to(x.dtype), window
