"""Triton helpers shared by the decode and prefill attention kernels for a layer's variant (gpu/attention/
variant.py): the scores in the log2 domain with an optional soft-cap, and the sinks folded into a finished online
softmax."""

import triton
import triton.language as tl

from gpu.kernels.triton_math import tanh

LOG2_E = tl.constexpr(1.4426950408889634)  # a constexpr: kernels read no other globals


@triton.jit
def log2_scores(dot, scale_log2, softcap_in, softcap_out, HAS_SOFTCAP: tl.constexpr):
    """q.k scaled into the base-2 softmax domain; with a soft-cap c, c * tanh(q.k * scale / c) there
    (softcap_in = scale / c, softcap_out = c * log2(e))."""
    if HAS_SOFTCAP:
        scores = tanh(dot * softcap_in) * softcap_out
    else:
        scores = dot * scale_log2
    return scores


@triton.jit
def with_sinks(acc, m_i, l_i, sinks_log2):
    """(acc, l) of an online softmax (running max m_i, base 2) with each row's sink logit added to its denominator:
    both rescaled to the larger of m_i and the sink, so neither exponent overflows."""
    m = tl.maximum(m_i, sinks_log2)
    alpha = tl.exp2(m_i - m)
    return acc * alpha[:, None], l_i * alpha + tl.exp2(sinks_log2 - m)


def softcap_factors(scale: float, softcap: float | None) -> tuple[float, float]:
    """(softcap_in, softcap_out) for log2_scores; unused (1, 1) without a soft-cap."""
    return (1.0, 1.0) if softcap is None else (scale / softcap, softcap * LOG2_E.value)

