/* Attention's elementwise work and single-query attention on a CPU, each in one call per layer.
 *
 * rope_store: a step's fused q/k/v projection -> the rotated queries, and the rotated keys and the values written
 * to their cache slots (optionally after per-head RMSNorms of q and k, Qwen3's or Gemma's), as
 * gpu/layers/attention.py's torch code computes them: the same float32 operations in the same order
 * (x * cos + swapped(x) * signed_sin), so a float32 run gives the same bits (compiled without floating-point
 * contraction).
 *
 * decode_attention: every row whose step has one query (a decode) attends to its whole context (or the last `window`
 * positions of it: a sliding-window layer) through its block table; a head group reads its KV head once. Scores and
 * softmax in float32, as the torch reference; sums in another order, so results equal it to float32 rounding. Rows
 * with more queries (prefill chunks) are left to the caller.
 *
 * Tensors are float32 or bfloat16 (one dtype for the activations and the cache); positions and slots int64, the
 * block tables, context lengths and query starts int32, as gpu/attention/metadata.py holds them.
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

static inline float load(const void *base, int64_t i, int is_bf16) {
    if (!is_bf16) return ((const float *)base)[i];
    uint32_t bits = (uint32_t)((const uint16_t *)base)[i] << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline void store(void *base, int64_t i, float f, int is_bf16) {
    if (!is_bf16) {
        ((float *)base)[i] = f;
        return;
    }
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffff) > 0x7f800000) {
        ((uint16_t *)base)[i] = (uint16_t)((bits >> 16) | 0x40);
        return;
    }
    bits += 0x7fff + ((bits >> 16) & 1); /* round to nearest even, as torch does */
    ((uint16_t *)base)[i] = (uint16_t)(bits >> 16);
}

typedef struct {
    const void *qkv;
    int64_t qkv_stride;
    const int64_t *positions;
    const void *cos, *signed_sin; /* [max_position, head_dim], in the activations' dtype (the model's buffers) */
    int64_t num_heads, num_kv_heads, head_dim;
    const void *q_norm, *k_norm; /* [head_dim] or NULL */
    float eps;
    float norm_offset; /* the norms scale by norm_offset + weight (Gemma 3: 1) */
    int norm_f32;      /* Gemma's convention: normed * scale in float32, rounded once; else Llama's */
    void *k_cache, *v_cache; /* [num_blocks * block_size, num_kv_heads, head_dim] */
    const int64_t *slots;
    void *q_out; /* [num_tokens, num_heads, head_dim] */
    int is_bf16;
} RopeStore;

/* One head: optional RMSNorm (float32; Llama's convention: the weight applied after rounding to the dtype, Gemma's:
 * the scale in float32, then rounded, as RMSNorm.forward), then the rotation, written to dst[0 .. head_dim). */
static void rotate_head(const RopeStore *a, const void *src, int64_t src_at, const void *norm, int64_t position,
                        void *dst, int64_t dst_at) {
    int64_t d = a->head_dim, half = d / 2;
    float x[1024];
    for (int64_t i = 0; i < d; i++) x[i] = load(src, src_at + i, a->is_bf16);
    if (norm != NULL) {
        float squares = 0.0f;
        for (int64_t i = 0; i < d; i++) squares += x[i] * x[i];
        float inverse = 1.0f / sqrtf(squares / (float)d + a->eps);
        for (int64_t i = 0; i < d; i++) {
            float normed = x[i] * inverse;
            if (a->norm_f32) normed *= a->norm_offset + load(norm, i, a->is_bf16);
            if (a->is_bf16) { /* rounded to the dtype (Llama's: before the weight), as the torch code */
                uint16_t rounded;
                store(&rounded, 0, normed, 1);
                normed = load(&rounded, 0, 1);
            }
            x[i] = a->norm_f32 ? normed : (a->norm_offset + load(norm, i, a->is_bf16)) * normed;
        }
    }
    int64_t row = position * d;
    for (int64_t i = 0; i < d; i++) {
        float swapped = x[i < half ? i + half : i - half];
        float rotated = x[i] * load(a->cos, row + i, a->is_bf16) + swapped * load(a->signed_sin, row + i, a->is_bf16);
        store(dst, dst_at + i, rotated, a->is_bf16);
    }
}

static void rope_store_token(const RopeStore *a, int64_t t) {
    int64_t d = a->head_dim, h = a->num_heads, kv = a->num_kv_heads;
    int64_t row = t * a->qkv_stride, position = a->positions[t], slot = a->slots[t];
    for (int64_t head = 0; head < h; head++)
        rotate_head(a, a->qkv, row + head * d, a->q_norm, position, a->q_out, (t * h + head) * d);
    if (slot < 0) return; /* a padding token: nothing written */
    for (int64_t head = 0; head < kv; head++) {
        rotate_head(a, a->qkv, row + (h + head) * d, a->k_norm, position, a->k_cache, (slot * kv + head) * d);
        for (int64_t i = 0; i < d; i++)
            store(a->v_cache, (slot * kv + head) * d + i, load(a->qkv, row + (h + kv + head) * d + i, a->is_bf16),
                  a->is_bf16);
    }
}

typedef struct {
    const void *q, *k_cache, *v_cache;
    void *out;
    const int32_t *block_tables, *context_lens, *query_start;
    int64_t table_stride, block_size, num_heads, num_kv_heads, head_dim;
    float scale;
    int is_bf16;
    int64_t window; /* the positions a query sees at most (0: all) */
} Decode;

/* A row's first context position its query sees: its window's first, where the layer has one. */
static inline int64_t first_seen(const Decode *a, int64_t row) {
    int64_t length = a->context_lens[row];
    return a->window > 0 && length > a->window ? length - a->window : 0;
}

/* Context positions a task attends to at most: longer contexts are split, their parts merged. A step with fewer
 * parts than threads splits its rows finer (to MIN_CHUNK), so every thread has a part. */
#define CHUNK 256
#define MIN_CHUNK 32
#define PARALLEL_WORK (1 << 15) /* context positions x query features below which one thread attends alone */

typedef struct {
    float *out; /* [num_heads, head_dim]: the chunk's sum of probabilities times values, unnormalized */
    float *maximum, *total; /* [num_heads]: its largest score, its sum of exp(score - maximum) */
} Partial;

/* Every query head of `row` against context positions [begin, end), keys and values read once per position for all
 * heads (a position's heads lie side by side in the cache). */
/* sum(a[i] * b[i]): vector partial sums, added across lanes once (a reduction loop left to the compiler adds them
 * one lane at a time). */
static inline float dot(const float *a, const float *b, int64_t d) {
    int64_t i = 0;
    float s = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= d; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    s = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    s = _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
#endif
    for (; i < d; i++) s += a[i] * b[i];
    return s;
}

/* A position's keys or values of every KV head [kv * d] as float32: in the cache itself, or converted into `buffer`. */
static inline const float *position_row(const void *cache, int64_t at, int64_t size, int is_bf16, float *buffer) {
    if (!is_bf16) return (const float *)cache + at;
#pragma omp simd
    for (int64_t i = 0; i < size; i++) buffer[i] = load(cache, at + i, 1);
    return buffer;
}

/* Every query head of `row` against context positions [begin, end), keys and values read once per position for all
 * heads (a position's heads lie side by side in the cache). scratch: heads * (n + d) + kv * d floats. */
static void attend_chunk(const Decode *a, int64_t row, int64_t begin, int64_t end, float *scratch, Partial part) {
    int64_t t = a->query_start[row], d = a->head_dim, heads = a->num_heads, kv = a->num_kv_heads;
    int64_t group = heads / kv, n = end - begin, bs = a->block_size;
    const int32_t *table = a->block_tables + row * a->table_stride;
    float *scores = scratch, *q = scratch + heads * n, *buffer = q + heads * d;
    for (int64_t i = 0; i < heads * d; i++) q[i] = load(a->q, t * heads * d + i, a->is_bf16);
    for (int64_t p = begin; p < end; p++) {
        int64_t position_at = ((int64_t)table[p / bs] * bs + p % bs) * kv * d;
        const float *keys = position_row(a->k_cache, position_at, kv * d, a->is_bf16, buffer);
        for (int64_t h = 0; h < heads; h++)
            scores[h * n + p - begin] = dot(q + h * d, keys + (h / group) * d, d) * a->scale;
    }
    for (int64_t h = 0; h < heads; h++) {
        float *sh = scores + h * n, maximum = -INFINITY, total = 0.0f;
        for (int64_t j = 0; j < n; j++) maximum = fmaxf(maximum, sh[j]);
#pragma omp simd reduction(+ : total)
        for (int64_t j = 0; j < n; j++) {
            sh[j] = exp_approx(sh[j] - maximum);
            total += sh[j];
        }
        part.maximum[h] = maximum;
        part.total[h] = total;
    }
    memset(part.out, 0, sizeof(float) * heads * d);
    for (int64_t p = begin; p < end; p++) {
        int64_t position_at = ((int64_t)table[p / bs] * bs + p % bs) * kv * d;
        const float *values = position_row(a->v_cache, position_at, kv * d, a->is_bf16, buffer);
        for (int64_t h = 0; h < heads; h++) {
            float weight = scores[h * n + p - begin], *oh = part.out + h * d;
            const float *value = values + (h / group) * d;
#pragma omp simd
            for (int64_t i = 0; i < d; i++) oh[i] += weight * value[i];
        }
    }
}

/* A row's output from its chunks' partial results: each rescaled to the largest maximum, summed, normalized.
 * weights: room for num_parts floats. */
static void merge_chunks(const Decode *a, int64_t row, const Partial *parts, int64_t num_parts, float *weights) {
    int64_t t = a->query_start[row], d = a->head_dim;
    for (int64_t h = 0; h < a->num_heads; h++) {
        float maximum = -INFINITY, total = 0.0f;
        for (int64_t c = 0; c < num_parts; c++) maximum = fmaxf(maximum, parts[c].maximum[h]);
        for (int64_t c = 0; c < num_parts; c++) {
            weights[c] = num_parts == 1 ? 1.0f : expf(parts[c].maximum[h] - maximum);
            total += weights[c] * parts[c].total[h];
        }
        for (int64_t i = 0; i < d; i++) {
            float sum = 0.0f;
            for (int64_t c = 0; c < num_parts; c++) sum += weights[c] * parts[c].out[h * d + i];
            store(a->out, (t * a->num_heads + h) * d + i, sum / total, a->is_bf16);
        }
    }
}

static int read_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected, int64_t *values) {
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "expected %zd arguments, got %zd", expected, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (PyFloat_Check(args[i])) { /* read where it is used */
            values[i] = 0;
            continue;
        }
        values[i] = args[i] == Py_None ? 0 : (int64_t)PyLong_AsLongLong(args[i]);
        if (values[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* rope_store(qkv, qkv_stride, num_tokens, positions, cos, signed_sin, num_heads, num_kv_heads, head_dim, q_norm,
 *            k_norm, eps, k_cache, v_cache, slots, q_out, is_bf16, norm_offset, norm_f32) */
static PyObject *rope_store(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t v[19];
    if (read_args(args, nargs, 19, v) < 0) return NULL;
    double eps = PyFloat_AsDouble(args[11]), offset = PyFloat_AsDouble(args[17]);
    if ((eps == -1.0 || offset == -1.0) && PyErr_Occurred()) return NULL;
    if (v[8] > 1024 || v[8] % 2) {
        PyErr_SetString(PyExc_ValueError, "head_dim must be even and at most 1024");
        return NULL;
    }
    RopeStore a = {(const void *)v[0], v[1], (const int64_t *)v[3], (const void *)v[4], (const void *)v[5], v[6],
                   v[7], v[8], (const void *)v[9], (const void *)v[10], (float)eps, (float)offset, (int)v[18],
                   (void *)v[12], (void *)v[13], (const int64_t *)v[14], (void *)v[15], (int)v[16]};
    int64_t tokens = v[2];
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for schedule(static) if (tokens >= 64)
    for (int64_t t = 0; t < tokens; t++) rope_store_token(&a, t);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* decode_attention(q, k_cache, v_cache, out, block_tables, table_stride, context_lens, query_start, num_rows,
 *                  block_size, num_heads, num_kv_heads, head_dim, scale, is_bf16, window): rows with one query only;
 *                  window 0: the whole context. */
static PyObject *decode_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t v[16];
    if (read_args(args, nargs, 16, v) < 0) return NULL;
    double scale = PyFloat_AsDouble(args[13]);
    if (scale == -1.0 && PyErr_Occurred()) return NULL;
    Decode a = {(const void *)v[0], (const void *)v[1], (const void *)v[2], (void *)v[3], (const int32_t *)v[4],
                (const int32_t *)v[6], (const int32_t *)v[7], v[5], v[9], v[10], v[11], v[12], (float)scale,
                (int)v[14], v[15]};
    int64_t rows = v[8], heads = a.num_heads, d = a.head_dim;
    if (a.num_heads % a.num_kv_heads) {
        PyErr_SetString(PyExc_ValueError, "the query heads must be a multiple of the KV heads");
        return NULL;
    }
    /* Tasks: every single-query row's context in chunks of `chunk` positions; first[r]: row r's first task. */
    int64_t *first = malloc(sizeof(int64_t) * (rows + 1));
    if (first == NULL) return PyErr_NoMemory();
    int64_t work = 0, tasks = 0, chunk = CHUNK, threads = omp_get_max_threads();
    for (int64_t r = 0; r < rows; r++)
        if (a.query_start[r + 1] - a.query_start[r] == 1) {
            int64_t seen = a.context_lens[r] - first_seen(&a, r);
            work += seen;
            tasks += (seen + CHUNK - 1) / CHUNK;
        }
    int parallel = threads > 1 && work * heads * d >= PARALLEL_WORK;
    if (parallel && tasks < threads) {
        chunk = (work / threads + MIN_CHUNK - 1) / MIN_CHUNK * MIN_CHUNK;
        chunk = chunk < MIN_CHUNK ? MIN_CHUNK : chunk;
    }
    tasks = 0;
    for (int64_t r = 0; r < rows; r++) {
        first[r] = tasks;
        if (a.query_start[r + 1] - a.query_start[r] == 1)
            tasks += (a.context_lens[r] - first_seen(&a, r) + chunk - 1) / chunk;
    }
    first[rows] = tasks;
    float *partials = malloc(sizeof(float) * (tasks > 0 ? tasks : 1) * heads * (d + 2));
    int failed = partials == NULL;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel if (!failed && parallel)
    {
        float *scratch = malloc(sizeof(float) * (heads * (chunk + d) + a.num_kv_heads * d));
        if (scratch == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < tasks; task++) {
            int64_t row = 0;
            while (first[row + 1] <= task) row++;
            int64_t begin = first_seen(&a, row) + (task - first[row]) * chunk, end = begin + chunk;
            end = end < a.context_lens[row] ? end : a.context_lens[row];
            float *base = partials + task * heads * (d + 2);
            Partial part = {base, base + heads * d, base + heads * d + heads};
            if (scratch != NULL) attend_chunk(&a, row, begin, end, scratch, part);
        }
        free(scratch);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            int64_t num_parts = first[r + 1] - first[r];
            if (num_parts == 0 || failed) continue;
            Partial *parts = malloc(sizeof(Partial) * num_parts);
            float *weights = malloc(sizeof(float) * num_parts);
            if (parts == NULL || weights == NULL) {
#pragma omp atomic write
                failed = 1;
            } else {
                for (int64_t c = 0; c < num_parts; c++) {
                    float *base = partials + (first[r] + c) * heads * (d + 2);
                    parts[c] = (Partial){base, base + heads * d, base + heads * d + heads};
                }
                merge_chunks(&a, r, parts, num_parts, weights);
            }
            free(parts);
            free(weights);
        }
    }
    Py_END_ALLOW_THREADS
    free(partials);
    free(first);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rope_store", (PyCFunction)(void (*)(void))rope_store, METH_FASTCALL, "rotate q and k, write k and v to the cache"},
    {"decode_attention", (PyCFunction)(void (*)(void))decode_attention, METH_FASTCALL, "single-query rows' attention"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "attention", NULL, -1, methods};

PyMODINIT_FUNC PyInit_attention(void) { return PyModule_Create(&module); }
