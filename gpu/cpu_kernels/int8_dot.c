/* Linear layers on a CPU with integer dot products: activations as int8 times 4- or 8-bit weights, as llama.cpp
 * multiplies its Q4_1 and Q8_0 blocks, with the activations carried to 16 bits.
 *
 * Weights keep their GGUF grid: groups of 32 input columns, each with a float16 scale (and, for 4-bit groups, a
 * float16 minimum): w = scale * level + minimum (level 0..15) or w = scale * level (level -127..127); a weight whose
 * scales are no float16 (Q4_K's: a 6-bit integer times a float16) holds them in float32. An 8-bit weight may have a
 * scale per half group of 16 columns instead (Q6_K's sub-blocks: `per_half`). Activations are
 * quantized per row and group of 32 with their own float32 scale (largest magnitude / 127), as llama.cpp's Q8_1, and
 * their remainders again in 256ths of that step: two int8 passes through the same weights, whose dot products combine
 * into that of a 16-bit activation: one pass alone (llama.cpp's) parts from float32's greedy choices far more often,
 * and the second costs little where the weights' bytes bound the time (a decode step; docs/performance.md has the
 * figures). A 4-bit group's minimum multiplies the exact float32 sum of its activations. Each group's integer dot product is exact in int32 and is scaled once, in float32.
 * The functions take their rows' input and compute it first where asked: RMSNorm after a residual add (in Llama's
 * convention or Gemma's, optionally after a norm of the input itself: Gemma's post-attention and post-MLP norms), or
 * SiLU-and-mul or GELU(tanh)-and-mul (the prologues the CUDA skinny GEMM has too).
 *
 * Layout (written by gpu/layers/int8_dot_linear.py): output rows in tiles of TILE_ROWS (one SIMD lane per row), so
 * no horizontal sums are needed; a tile's groups follow each other, and a group holds its 32 columns as 8 quads of
 * 4 consecutive columns, each quad a [TILE_ROWS, 4] byte vector that one dpbusd multiplies by 4 broadcast activations.
 * 4-bit: quads j and j + 4 share bytes (j in the low nibble); 8-bit: level + 128 as unsigned bytes where the CPU has
 * VNNI (dpbusd multiplies unsigned by signed), else the signed level (AVX2's maddubs would saturate on the sum).
 * Scales: [tiles, groups, TILE_ROWS] float16 (float32 where scale_f32); [tiles, groups, 2, TILE_ROWS] per half group.
 *
 * Compiled on the machine that runs it (-march=native, gpu/cpu_kernels/build.py): AVX512-VNNI (16 rows a tile), or
 * AVX2 with or without AVX-VNNI (8 rows). Threads: OpenMP, torch's own runtime (one pool for both).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_math.h"

#define GROUP 32

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define TILE_ROWS 16
#define ROW_CHUNK 4 /* activation rows that share one pass over a tile's weights (registers: 3 vectors each) */
#define ISA "avx512-vnni"
#define OFFSET_BYTES 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TILE_ROWS 8
#define ROW_CHUNK 2 /* 16 vector registers */
#if defined(__AVXVNNI__)
#define ISA "avx-vnni"
#define OFFSET_BYTES 1
#else
#define ISA "avx2"
#define OFFSET_BYTES 0
#endif
#else
#error "int8_dot.c needs AVX2 (with FMA and F16C) or AVX512-VNNI"
#endif

/* ---- activations ---- */

typedef struct {
    int8_t *q;      /* [2, rows, k]: the first pass's levels, then the remainder's */
    float *scale;   /* [rows, groups]: what one unit of the combined levels is worth */
    float *sum;     /* [rows, groups]: the float32 sum of the group's activations */
    int32_t *qsum;  /* [rows, groups]: the sum of its combined levels */
    int32_t *qsum_half; /* [rows, groups, 2]: that sum over each half group of 16 columns */
    float *row;     /* [rows, k]: the activations in float32, after the prologue */
    int64_t plane;  /* rows * k: from one pass's levels to the next's */
} Quantized;

static inline float bf16_to_f32(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffff) > 0x7f800000) return (uint16_t)((bits >> 16) | 0x40); /* NaN stays NaN */
    bits += 0x7fff + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

static inline float load(const void *base, int64_t i, int is_bf16) {
    return is_bf16 ? bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static inline void store(void *base, int64_t i, float f, int is_bf16) {
    if (is_bf16)
        ((uint16_t *)base)[i] = f32_to_bf16(f);
    else
        ((float *)base)[i] = f;
}

static inline float rounded(float f, int is_bf16) { return is_bf16 ? bf16_to_f32(f32_to_bf16(f)) : f; }

/* What the product's input is computed from, in the layer's dtype, rounding where the torch code rounds:
 * NONE: x itself; NORM: RMSNorm(x' + residual) (gpu/layers/norm.py), x' + residual written to `summed`, where x' is
 * x or, with a post_norm, RMSNorm(x) by that weight (Gemma's norm of a block's output before the residual add);
 * SILU_AND_MUL, GELU_TANH_AND_MUL: act(gate) * up of x = [gate | up] (gpu/layers/activation.py). */
enum { NONE, NORM, SILU_AND_MUL, GELU_TANH_AND_MUL };

typedef struct {
    int kind, is_bf16;
    const void *x, *residual, *norm; /* residual: NULL for none; norm: [k] weight */
    int64_t x_stride, residual_stride;
    float eps;
    void *summed;          /* [rows, k] contiguous, where there is a residual */
    const void *post_norm; /* [k] weight or NULL; the same eps and convention as `norm` */
    float norm_offset;     /* a norm scales by norm_offset + weight (Gemma 3: 1) */
    int norm_f32;          /* Gemma's convention: normed * scale in float32, rounded once; else Llama's */
} Prologue;

/* row[0 .. k) RMS-normed in place by `weight` in the prologue's convention. */
static inline __attribute__((always_inline)) void rms_norm_row(const Prologue *p, const void *weight, int64_t k,
                                                               float *row, const int bf) {
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < k; i++) squares += row[i] * row[i];
    float inverse = 1.0f / sqrtf(squares / (float)k + p->eps);
    if (p->norm_f32) {
#pragma omp simd
        for (int64_t i = 0; i < k; i++)
            row[i] = rounded(row[i] * inverse * (p->norm_offset + load(weight, i, bf)), bf);
        return;
    }
#pragma omp simd
    for (int64_t i = 0; i < k; i++) row[i] = rounded(load(weight, i, bf) * rounded(row[i] * inverse, bf), bf);
}

static inline __attribute__((always_inline)) void prologue_row_as(const Prologue *p, int64_t m, int64_t k,
                                                                  float *row, const int bf) {
    const int64_t at = m * p->x_stride;
    if (p->kind == SILU_AND_MUL) {
#pragma omp simd
        for (int64_t i = 0; i < k; i++) {
            float gate = load(p->x, at + i, bf), up = load(p->x, at + k + i, bf);
            row[i] = rounded(rounded(gate / (1.0f + exp_approx(-gate)), bf) * up, bf);
        }
        return;
    }
    /* GELU(tanh): 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)), u = sqrt(2 / pi) (g + 0.044715 g^3) */
    if (p->kind == GELU_TANH_AND_MUL) {
#pragma omp simd
        for (int64_t i = 0; i < k; i++) {
            float gate = load(p->x, at + i, bf), up = load(p->x, at + k + i, bf);
            float u = 0.7978845608f * (gate + 0.044715f * gate * gate * gate);
            row[i] = rounded(rounded(gate / (1.0f + exp_approx(-2.0f * u)), bf) * up, bf);
        }
        return;
    }
#pragma omp simd
    for (int64_t i = 0; i < k; i++) row[i] = load(p->x, at + i, bf);
    if (p->kind == NONE) return;
    if (p->post_norm != NULL) rms_norm_row(p, p->post_norm, k, row, bf);
    if (p->residual != NULL) {
#pragma omp simd
        for (int64_t i = 0; i < k; i++) {
            row[i] = rounded(row[i] + load(p->residual, m * p->residual_stride + i, bf), bf);
            store(p->summed, m * k + i, row[i], bf);
        }
    }
    rms_norm_row(p, p->norm, k, row, bf);
}

static void prologue_row(const Prologue *p, int64_t m, int64_t k, float *row) {
    if (p->is_bf16)
        prologue_row_as(p, m, k, row, 1);
    else
        prologue_row_as(p, m, k, row, 0);
}

/* Levels q1 = round(x / d), d = largest magnitude / 127, and q2 = round((x - q1 d) / (d / 256)), so that
 * x = (256 q1 + q2) d / 256 to within half of d / 256: 16 bits a group, as two int8 passes. */
static void quantize_group(const float *x, int64_t plane, int8_t *q, float *scale, float *sum, int32_t *qsum,
                           int32_t *qsum_half) {
    float amax = 0.0f, total = 0.0f;
#pragma omp simd reduction(max : amax) reduction(+ : total)
    for (int i = 0; i < GROUP; i++) {
        amax = fmaxf(amax, fabsf(x[i]));
        total += x[i];
    }
    float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t half_sums[2] = {0, 0};
    for (int h = 0; h < 2; h++) {
        int32_t s = 0;
#pragma omp simd reduction(+ : s)
        for (int i = h * GROUP / 2; i < (h + 1) * GROUP / 2; i++) {
            float exact = x[i] * inv;
            float first = round_even(exact);
            float second = round_even((exact - first) * 256.0f);
            second = second > 127.0f ? 127.0f : (second < -127.0f ? -127.0f : second);
            q[i] = (int8_t)first;
            q[plane + i] = (int8_t)second;
            s += 256 * (int32_t)first + (int32_t)second;
        }
        half_sums[h] = s;
    }
    *scale = d / 256.0f;
    *sum = total;
    *qsum = half_sums[0] + half_sums[1];
    qsum_half[0] = half_sums[0];
    qsum_half[1] = half_sums[1];
}

static int quantize(const Prologue *p, int64_t rows, int64_t k, Quantized *out) {
    int64_t groups = k / GROUP;
    out->plane = rows * k;
    out->q = malloc(2 * rows * k);
    out->scale = malloc(rows * groups * sizeof(float));
    out->sum = malloc(rows * groups * sizeof(float));
    out->qsum = malloc(rows * groups * sizeof(int32_t));
    out->qsum_half = malloc(2 * rows * groups * sizeof(int32_t));
    out->row = malloc(rows * k * sizeof(float));
    if (!out->q || !out->scale || !out->sum || !out->qsum || !out->qsum_half || !out->row) return -1;
#pragma omp parallel for schedule(static) if (rows >= 16)
    for (int64_t m = 0; m < rows; m++) {
        float *row = out->row + m * k;
        prologue_row(p, m, k, row);
        for (int64_t g = 0; g < groups; g++)
            quantize_group(row + g * GROUP, out->plane, out->q + m * k + g * GROUP, out->scale + m * groups + g,
                           out->sum + m * groups + g, out->qsum + m * groups + g,
                           out->qsum_half + 2 * (m * groups + g));
    }
    return 0;
}

static void release(Quantized *a) {
    free(a->q);
    free(a->scale);
    free(a->sum);
    free(a->qsum);
    free(a->qsum_half);
    free(a->row);
}

/* ---- SIMD pieces: one lane per output row of a tile ---- */

#if TILE_ROWS == 16
typedef __m512i ivec;
typedef __m512 fvec;
#define izero() _mm512_setzero_si512()
#define fzero() _mm512_setzero_ps()
#define iload(p) _mm512_loadu_si512((const void *)(p))
#define low_nibbles(v) _mm512_and_si512((v), _mm512_set1_epi8(0x0f))
#define high_nibbles(v) _mm512_and_si512(_mm512_srli_epi16((v), 4), _mm512_set1_epi8(0x0f))
#define broadcast4(p) _mm512_set1_epi32(*(const int32_t *)(p))
#define dot_u8s8(acc, u, s) _mm512_dpbusd_epi32((acc), (u), (s))
#define to_float(v) _mm512_cvtepi32_ps(v)
#define iadd_scalar(v, s) _mm512_add_epi32((v), _mm512_set1_epi32(s))
#define iadd(a, b) _mm512_add_epi32((a), (b))
#define ishl8(v) _mm512_slli_epi32((v), 8)
#define fset1(s) _mm512_set1_ps(s)
#define fmul(a, b) _mm512_mul_ps((a), (b))
#define fmadd(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define fadd(a, b) _mm512_add_ps((a), (b))
#define fload(p) _mm512_loadu_ps(p)
#define fstore(p, v) _mm512_storeu_ps((p), (v))
#define float16s(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#else
typedef __m256i ivec;
typedef __m256 fvec;
#define izero() _mm256_setzero_si256()
#define fzero() _mm256_setzero_ps()
#define iload(p) _mm256_loadu_si256((const __m256i *)(p))
#define low_nibbles(v) _mm256_and_si256((v), _mm256_set1_epi8(0x0f))
#define high_nibbles(v) _mm256_and_si256(_mm256_srli_epi16((v), 4), _mm256_set1_epi8(0x0f))
#define broadcast4(p) _mm256_set1_epi32(*(const int32_t *)(p))
#if OFFSET_BYTES
#define dot_u8s8(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#else
/* maddubs sums pairs into int16: exact while u * s pairs stay under 2^15 (4-bit levels, or |8-bit levels|) */
#define dot_u8s8(acc, u, s) \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1)))
#endif
#define to_float(v) _mm256_cvtepi32_ps(v)
#define iadd_scalar(v, s) _mm256_add_epi32((v), _mm256_set1_epi32(s))
#define iadd(a, b) _mm256_add_epi32((a), (b))
#define ishl8(v) _mm256_slli_epi32((v), 8)
#define fset1(s) _mm256_set1_ps(s)
#define fmul(a, b) _mm256_mul_ps((a), (b))
#define fmadd(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define fadd(a, b) _mm256_add_ps((a), (b))
#define fload(p) _mm256_loadu_ps(p)
#define fstore(p, v) _mm256_storeu_ps((p), (v))
#define float16s(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#endif

#define QUAD_BYTES (TILE_ROWS * 4)
#define Q4_GROUP_BYTES (4 * QUAD_BYTES) /* 8 quads, two to a byte */
#define Q8_GROUP_BYTES (8 * QUAD_BYTES)

typedef struct {
    const uint8_t *levels; /* the packed tiles */
    const void *scale;     /* [tiles, groups, TILE_ROWS] float16, or float32 where scale_f32 */
    const void *minimum;   /* 4-bit only; as `scale` */
    const void *bias;      /* [n] in the activations' dtype, or NULL */
    int64_t n, k;
    int is_q4;
    int scale_f32;
    int per_half; /* 8-bit: a scale per half group of 16 columns */
} Weights;

/* A group's TILE_ROWS scales (or minimums) from `values` at `at`, in float32. */
static inline __attribute__((always_inline)) fvec scales_at(const void *values, int64_t at, int is_f32) {
    return is_f32 ? fload((const float *)values + at) : float16s((const uint16_t *)values + at);
}

typedef struct {
    void *data;
    int64_t stride; /* elements between rows */
    int is_bf16;
} Output;

static void store_rows(const Weights *w, const Output *out, int64_t tile, int64_t m0, int rows, fvec *acc) {
    float lanes[TILE_ROWS];
    for (int r = 0; r < rows; r++) {
        fvec y = acc[r];
        if (w->bias) {
            for (int i = 0; i < TILE_ROWS; i++) lanes[i] = load(w->bias, tile * TILE_ROWS + i, out->is_bf16);
            y = fadd(y, fload(lanes));
        }
        int64_t offset = (m0 + r) * out->stride + tile * TILE_ROWS;
        if (!out->is_bf16) {
            fstore((float *)out->data + offset, y);
            continue;
        }
        fstore(lanes, y);
        uint16_t *dst = (uint16_t *)out->data + offset;
        for (int i = 0; i < TILE_ROWS; i++) dst[i] = f32_to_bf16(lanes[i]);
    }
}

/* A group's integer dot products of the two passes combined: 256 * first + second (exact in int32: at most
 * 256 * 32 * 255 * 127 + 32 * 255 * 127). */
#define COMBINE(dots, rest) iadd(ishl8(dots), (rest))

#define INLINE static inline __attribute__((always_inline))

/* One group of a 4-bit tile: each row's combined integer dot product, in exact[r]. x: the group's activations. */
INLINE void q4_group(const uint8_t *block, const Quantized *a, const int8_t *x, int64_t k, int rows, ivec *exact) {
    /* Low and high nibbles in separate sums: two dependency chains of 4 instead of one of 8. */
    ivec dots[ROW_CHUNK], dots_high[ROW_CHUNK], rest[ROW_CHUNK], rest_high[ROW_CHUNK];
    for (int r = 0; r < rows; r++) dots[r] = dots_high[r] = rest[r] = rest_high[r] = izero();
    for (int j = 0; j < 4; j++) {
        ivec packed = iload(block + j * QUAD_BYTES);
        ivec low = low_nibbles(packed), high = high_nibbles(packed);
        for (int r = 0; r < rows; r++) {
            const int8_t *xr = x + r * k;
            dots[r] = dot_u8s8(dots[r], low, broadcast4(xr + 4 * j));
            dots_high[r] = dot_u8s8(dots_high[r], high, broadcast4(xr + 4 * (j + 4)));
            rest[r] = dot_u8s8(rest[r], low, broadcast4(xr + a->plane + 4 * j));
            rest_high[r] = dot_u8s8(rest_high[r], high, broadcast4(xr + a->plane + 4 * (j + 4)));
        }
    }
    for (int r = 0; r < rows; r++) exact[r] = COMBINE(iadd(dots[r], dots_high[r]), iadd(rest[r], rest_high[r]));
}

/* An 8-bit quad j (4 columns of each lane's row) times the rows' activations, added to their sums of both passes. */
INLINE void q8_quad(const uint8_t *block, int j, const Quantized *a, const int8_t *x, int64_t k, int rows,
                    ivec *dots, ivec *rest) {
    ivec levels = iload(block + j * QUAD_BYTES);
#if !OFFSET_BYTES
    ivec magnitudes = _mm256_sign_epi8(levels, levels);
#endif
    for (int r = 0; r < rows; r++) {
        const int8_t *xr = x + r * k + 4 * j;
#if OFFSET_BYTES
        dots[r] = dot_u8s8(dots[r], levels, broadcast4(xr));
        rest[r] = dot_u8s8(rest[r], levels, broadcast4(xr + a->plane));
#else
        dots[r] = dot_u8s8(dots[r], magnitudes, _mm256_sign_epi8(broadcast4(xr), levels));
        rest[r] = dot_u8s8(rest[r], magnitudes, _mm256_sign_epi8(broadcast4(xr + a->plane), levels));
#endif
    }
}

/* One group of an 8-bit tile, as q4_group; qsum: the rows' sums of combined levels, a row's `groups` apart. */
INLINE void q8_group(const uint8_t *block, const Quantized *a, const int8_t *x, int64_t k, int rows,
                     const int32_t *qsum, int64_t groups, ivec *exact) {
    ivec dots[ROW_CHUNK], rest[ROW_CHUNK];
    for (int r = 0; r < rows; r++) dots[r] = rest[r] = izero();
    for (int j = 0; j < 8; j++) q8_quad(block, j, a, x, k, rows, dots, rest); /* bandwidth, not this chain, bounds it */
    for (int r = 0; r < rows; r++) {
        exact[r] = COMBINE(dots[r], rest[r]);
#if OFFSET_BYTES
        exact[r] = iadd_scalar(exact[r], -128 * qsum[r * groups]); /* the levels were stored + 128 */
#endif
    }
}

/* One group of an 8-bit tile whose halves have their own scales: as q8_group, each half's combined dot products
 * in exact[r] (columns 0..15) and exact_high[r] (16..31); qsum_half: the rows' sums per half, a row's 2 * groups
 * apart. */
INLINE void q8_halves_group(const uint8_t *block, const Quantized *a, const int8_t *x, int64_t k, int rows,
                            const int32_t *qsum_half, int64_t groups, ivec *exact, ivec *exact_high) {
    ivec dots[2][ROW_CHUNK], rest[2][ROW_CHUNK];
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < rows; r++) dots[h][r] = rest[h][r] = izero();
    for (int j = 0; j < 8; j++) q8_quad(block, j, a, x, k, rows, dots[j / 4], rest[j / 4]);
    for (int r = 0; r < rows; r++) {
        exact[r] = COMBINE(dots[0][r], rest[0][r]);
        exact_high[r] = COMBINE(dots[1][r], rest[1][r]);
#if OFFSET_BYTES
        exact[r] = iadd_scalar(exact[r], -128 * qsum_half[r * 2 * groups]);
        exact_high[r] = iadd_scalar(exact_high[r], -128 * qsum_half[r * 2 * groups + 1]);
#endif
    }
}

enum { Q8, Q4, Q8_HALVES }; /* a weight's kind of groups */

/* One tile of output rows for activation rows m0 .. m0 + rows (kind: the weight's, as a constant). */
INLINE void tile_of(const Weights *w, const Quantized *a, const Output *out, int64_t tile, int64_t m0, int rows,
                    const int kind) {
    const int is_q4 = kind == Q4;
    int64_t groups = w->k / GROUP, group_bytes = is_q4 ? Q4_GROUP_BYTES : Q8_GROUP_BYTES;
    const uint8_t *base = w->levels + tile * groups * group_bytes;
    fvec acc[ROW_CHUNK];
    for (int r = 0; r < rows; r++) acc[r] = fzero();
    for (int64_t g = 0; g < groups; g++) {
        const int8_t *x = a->q + m0 * w->k + g * GROUP;
        ivec exact[ROW_CHUNK];
        if (kind == Q8_HALVES) {
            ivec exact_high[ROW_CHUNK];
            q8_halves_group(base + g * group_bytes, a, x, w->k, rows, a->qsum_half + 2 * (m0 * groups + g), groups,
                            exact, exact_high);
            int64_t at = (tile * groups + g) * 2 * TILE_ROWS;
            fvec scale = scales_at(w->scale, at, w->scale_f32), scale_high = scales_at(w->scale, at + TILE_ROWS,
                                                                                      w->scale_f32);
            for (int r = 0; r < rows; r++) {
                fvec unit = fset1(a->scale[(m0 + r) * groups + g]);
                acc[r] = fmadd(to_float(exact[r]), fmul(scale, unit), acc[r]);
                acc[r] = fmadd(to_float(exact_high[r]), fmul(scale_high, unit), acc[r]);
            }
            continue;
        }
        if (is_q4)
            q4_group(base + g * group_bytes, a, x, w->k, rows, exact);
        else
            q8_group(base + g * group_bytes, a, x, w->k, rows, a->qsum + m0 * groups + g, groups, exact);
        int64_t at = (tile * groups + g) * TILE_ROWS;
        fvec scale = scales_at(w->scale, at, w->scale_f32);
        for (int r = 0; r < rows; r++)
            acc[r] = fmadd(to_float(exact[r]), fmul(scale, fset1(a->scale[(m0 + r) * groups + g])), acc[r]);
        if (is_q4) {
            fvec minimum = scales_at(w->minimum, at, w->scale_f32);
            for (int r = 0; r < rows; r++) acc[r] = fmadd(minimum, fset1(a->sum[(m0 + r) * groups + g]), acc[r]);
        }
    }
    store_rows(w, out, tile, m0, rows, acc);
}

/* Each (row count, weight kind) its own copy of the tile loop, so that its accumulators live in registers. */
#define TILES_OF(kind)                                             \
    switch (chunk) {                                               \
    case 1: tile_of(w, a, out, t, m0, 1, kind); break;             \
    case 2: tile_of(w, a, out, t, m0, 2, kind); break;             \
    case 3: if (ROW_CHUNK > 2) tile_of(w, a, out, t, m0, 3, kind); break; \
    case 4: if (ROW_CHUNK > 3) tile_of(w, a, out, t, m0, 4, kind); break; \
    }

static void tile_rows(const Weights *w, const Quantized *a, const Output *out, int64_t t, int64_t m0, int chunk) {
    if (w->is_q4)
        TILES_OF(Q4)
    else if (w->per_half)
        TILES_OF(Q8_HALVES)
    else
        TILES_OF(Q8)
}

static void product(const Weights *w, const Quantized *a, int64_t rows, const Output *out) {
    int64_t tiles = w->n / TILE_ROWS;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        for (int64_t m0 = 0; m0 < rows; m0 += ROW_CHUNK) {
            int chunk = rows - m0 < ROW_CHUNK ? (int)(rows - m0) : ROW_CHUNK;
            tile_rows(w, a, out, t, m0, chunk);
        }
    }
}

/* ---- Python interface: tensors travel as data pointers (ints); a packed weight as a capsule ---- */

/* values[i] = args[i] as an int for i >= first (None: 0; a float: 0, read where it is used) */
static int read_ints(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected, Py_ssize_t first, int64_t *values) {
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "expected %zd arguments, got %zd", expected, nargs);
        return -1;
    }
    for (Py_ssize_t i = first; i < nargs; i++) {
        if (PyFloat_Check(args[i])) {
            values[i] = 0;
            continue;
        }
        values[i] = args[i] == Py_None ? 0 : (int64_t)PyLong_AsLongLong(args[i]);
        if (values[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

static void free_weights(PyObject *capsule) { free(PyCapsule_GetPointer(capsule, "int8_dot.Weights")); }

/* weights(levels, scale, minimum, n, k, scale_f32, per_half) -> a capsule: the layout's pointers (the caller keeps the
 * tensors alive). minimum: None for 8-bit groups; scale_f32: whether scale and minimum are float32 (else float16);
 * per_half: an 8-bit weight's scales are per half group. */
static PyObject *weights(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t v[7];
    if (read_ints(args, nargs, 7, 0, v) < 0) return NULL;
    if (v[6] && v[2]) {
        PyErr_SetString(PyExc_ValueError, "scales per half group are for 8-bit groups");
        return NULL;
    }
    if (v[3] % TILE_ROWS || v[4] % GROUP || v[4] <= 0) {
        PyErr_SetString(PyExc_ValueError, "n must be whole tiles of rows and k whole groups");
        return NULL;
    }
    Weights *w = malloc(sizeof(Weights));
    if (w == NULL) return PyErr_NoMemory();
    *w = (Weights){(const uint8_t *)v[0], (const void *)v[1], (const void *)v[2], NULL, v[3], v[4], v[2] != 0,
                   v[5] != 0, v[6] != 0};
    return PyCapsule_New(w, "int8_dot.Weights", free_weights);
}

static PyObject *run(PyObject *capsule, const Prologue *p, int64_t rows, const void *bias, void *out) {
    Weights *stored = PyCapsule_GetPointer(capsule, "int8_dot.Weights");
    if (stored == NULL) return NULL;
    Weights w = *stored;
    w.bias = bias;
    Output o = {out, w.n, p->is_bf16};
    Quantized a;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = quantize(p, rows, w.k, &a);
    if (!failed) product(&w, &a, rows, &o);
    release(&a);
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* The products' arguments: tensors as data pointers, in one dtype (is_bf16: bfloat16, else float32); bias: None or
 * [n]. Each writes out[rows, n] (contiguous). */

/* linear(weights, x, x_stride, rows, bias, out, is_bf16): out = x @ W.T + bias */
static PyObject *linear(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t v[7];
    if (read_ints(args, nargs, 7, 1, v) < 0) return NULL; /* argument 0: the weights' capsule */
    Prologue p = {NONE, (int)v[6], (const void *)v[1], NULL, NULL, v[2], 0, 0.0f, NULL, NULL, 0.0f, 0};
    return run(args[0], &p, v[3], (const void *)v[4], (void *)v[5]);
}

/* linear_normed(weights, x, x_stride, residual, residual_stride, norm, eps, summed, rows, bias, out, is_bf16,
 *               post_norm, norm_offset, norm_f32):
 * out = RMSNorm(x' + residual) @ W.T + bias, x' + residual written to `summed` [rows, k] (residual None: nothing
 * summed, nothing written); x' = x, or RMSNorm(x) by post_norm where given; the norms scale by norm_offset + weight,
 * in Gemma's convention where norm_f32, else Llama's. */
static PyObject *linear_normed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t v[15];
    if (read_ints(args, nargs, 15, 1, v) < 0) return NULL;
    double eps = PyFloat_AsDouble(args[6]), offset = PyFloat_AsDouble(args[13]);
    if ((eps == -1.0 || offset == -1.0) && PyErr_Occurred()) return NULL;
    Prologue p = {NORM, (int)v[11], (const void *)v[1], (const void *)v[3], (const void *)v[5], v[2], v[4],
                  (float)eps, (void *)v[7], (const void *)v[12], (float)offset, (int)v[14]};
    return run(args[0], &p, v[8], (const void *)v[9], (void *)v[10]);
}

/* linear_gated(weights, gate_up, stride, rows, bias, out, is_bf16, activation): out = (act(gate) * up) @ W.T + bias,
 * act: 0 SiLU, 1 GELU with the tanh approximation */
static PyObject *linear_gated(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t v[8];
    if (read_ints(args, nargs, 8, 1, v) < 0) return NULL;
    if (v[7] != 0 && v[7] != 1) {
        PyErr_SetString(PyExc_ValueError, "activation: 0 (SiLU) or 1 (GELU tanh)");
        return NULL;
    }
    Prologue p = {v[7] ? GELU_TANH_AND_MUL : SILU_AND_MUL, (int)v[6], (const void *)v[1], NULL, NULL, v[2], 0, 0.0f,
                  NULL, NULL, 0.0f, 0};
    return run(args[0], &p, v[3], (const void *)v[4], (void *)v[5]);
}

static PyMethodDef methods[] = {
    {"weights", (PyCFunction)(void (*)(void))weights, METH_FASTCALL, "a packed weight's handle"},
    {"linear", (PyCFunction)(void (*)(void))linear, METH_FASTCALL, "x @ W.T (+ bias)"},
    {"linear_normed", (PyCFunction)(void (*)(void))linear_normed, METH_FASTCALL, "RMSNorm(x + residual) @ W.T"},
    {"linear_gated", (PyCFunction)(void (*)(void))linear_gated, METH_FASTCALL, "(act(g) * u) @ W.T"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "int8_dot", NULL, -1, methods};

PyMODINIT_FUNC PyInit_int8_dot(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyModule_AddStringConstant(m, "ISA", ISA);
    PyModule_AddIntConstant(m, "TILE_ROWS", TILE_ROWS);
    PyModule_AddIntConstant(m, "OFFSET_BYTES", OFFSET_BYTES);
    return m;
}
