/* Small float32 functions the kernels' loops vectorize (libm's are calls, one value at a time). Included by the
 * kernels' sources; compiled into each. */
#ifndef OPENAI_SERVE_VECTOR_MATH_H
#define OPENAI_SERVE_VECTOR_MATH_H

#include <stdint.h>
#include <string.h>

/* x rounded to the nearest integer, ties to even, for |x| < 2^22: adding 1.5 * 2^23 leaves no fraction bits. */
static inline float round_even(float x) { return (x + 12582912.0f) - 12582912.0f; }

/* exp(x) as 2^n * p(r) with x = n ln2 + r, |r| <= ln2 / 2, p of degree 6: relative error under 2e-7 (libm's expf
 * to a unit or two in the last place). x is clamped to where float32 holds the result. */
static inline float exp_approx(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = round_even(x * 1.44269504f);
    float r = x - n * 0.693145752f - n * 1.42860677e-6f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

#endif
