/* What both storage types of the paged attention kernels (paged_attention.c) share: bfloat16 conversions, the
   scalar and vector exp, horizontal sums, the AVX-512 prefill tile's score kernel, loads and roundings per type. */
#ifndef SWITCHYARD_PAGED_ATTENTION_COMMON_H
#define SWITCHYARD_PAGED_ATTENTION_COMMON_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "simd_exp.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VEC 1
#else
#define VEC 0
#endif

/* bfloat16 is the upper half of a float32; all arithmetic is float32. */
static inline float bf16_to_f32(uint16_t x) { uint32_t u = (uint32_t)x << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);  /* round to nearest even */
    return (uint16_t)(u >> 16);
}

/* exp(x) for x <= 0 (a score minus the row maximum): Cody-Waite range reduction and a degree-6 polynomial,
   within 2 ulp of expf. */
static inline float exp_neg(float x) {
    if (x < -87.0f) x = -87.0f;
    float n = __builtin_roundf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale; memcpy(&scale, &e, 4);
    return p * scale;
}
#if VEC
EXP8_AVX2
TANH8_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline __m256 load8_f32(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8_bf16(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
/* The 8 sums of a0..a7 (8 floats each) in one register: a transposing horizontal add. */
static inline __m256 sum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
    __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}
#endif
#if VEC && defined(__AVX512F__)
#define ZVEC 1
static inline __m512 loadz_f32(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 loadz_bf16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
EXP16_AVX512
TANH16_AVX512
#define TILE_KEYS 16
/* The largest position among query rows start..end-1 (ascending up to QR, padding after: -1). */
static inline int last_pos(const int32_t* pos, int start, int end, int QR) {
    return start < QR ? pos[(end < QR ? end : QR) - 1] : -1;
}
static inline size_t tile64_qrp(int n, int G) { return ((size_t)n * G + 15) / 16 * 16; }
static inline size_t tile64_scratch(int n, int G) {
    const size_t qrp = tile64_qrp(n, G);
    return qrp * (64 + 64 + TILE_KEYS + 3) + TILE_KEYS * 64;  /* qt, acc, p, m, l, alpha; bf16 keys */
}
static inline __m512 roundz_f32(__m512 x) { return x; }
static inline __m512 roundz_bf16(__m512 x) {  /* to the nearest bfloat16 (even on ties), as float32 */
    __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
    return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u)));
}
/* Float32 rows of kn (<= 16) keys of 64 values, `row` elements apart in the cache: the float32 cache in place,
   bfloat16 converted into conv. kp[t] for t >= kn repeats a valid row (its scores are masked). */
static inline void key_rows_f32(const float* k, int64_t row, int kn, float* conv, const float** kp) {
    (void)conv;
    for (int t = 0; t < 16; t++) kp[t] = k + (t < kn ? t : 0) * row;
}
static inline void key_rows_bf16(const uint16_t* k, int64_t row, int kn, float* conv, const float** kp) {
    for (int t = 0; t < kn; t++)
        for (int c = 0; c < 64; c += 16) _mm512_storeu_ps(conv + t * 64 + c, loadz_bf16(k + t * row + c));
    for (int t = 0; t < 16; t++) kp[t] = conv + (t < kn ? t : 0) * 64;
}
/* s[t * lds + j] = sum over d < 64 of kp[t][d] * qt[d * ldq + j] for 8 keys t and 16 * NC query rows j: each
   score one FMA chain over d in a lane; 8 x NC registers accumulate. */
static inline __attribute__((always_inline)) void scores8(int NC, const float* const* kp, const float* qt, int ldq,
                                                          float* s, int lds) {
    __m512 a[8][3];
    for (int t = 0; t < 8; t++)
        for (int c = 0; c < NC; c++) a[t][c] = _mm512_setzero_ps();
    for (int d = 0; d < 64; d++) {
        __m512 q[3];
        for (int c = 0; c < NC; c++) q[c] = _mm512_loadu_ps(qt + d * ldq + 16 * c);
        for (int t = 0; t < 8; t++) {
            const __m512 kb = _mm512_set1_ps(kp[t][d]);
            for (int c = 0; c < NC; c++) a[t][c] = _mm512_fmadd_ps(kb, q[c], a[t][c]);
        }
    }
    for (int t = 0; t < 8; t++)
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(s + t * lds + 16 * c, a[t][c]);
}
static void scores16(int nc, const float* const* kp, int kn, const float* qt, int ldq, float* s, int lds) {
    for (int t0 = 0; t0 < kn; t0 += 8)
        switch (nc) {  /* constant chunk counts: the accumulators stay in registers */
            case 1: scores8(1, kp + t0, qt, ldq, s + t0 * lds, lds); break;
            case 2: scores8(2, kp + t0, qt, ldq, s + t0 * lds, lds); break;
            default: scores8(3, kp + t0, qt, ldq, s + t0 * lds, lds); break;
        }
}
#else
#define ZVEC 0
#endif
/* prefill rows handed out together: with the AVX-512 kernel they share each pass over the cache */
#define PREFILL_TILE (ZVEC ? 16 : 1)
/* The largest of s[0 .. n - 1] (n >= 1), in lanes: max is exact, so the order does not change the result. */
static inline float max_of(const float* s, int n) {
    float m = s[0];
    int t = 0;
#if ZVEC
    if (n >= 16) {
        __m512 v = _mm512_loadu_ps(s);
        for (t = 16; t + 16 <= n; t += 16) v = _mm512_max_ps(v, _mm512_loadu_ps(s + t));
        m = _mm512_reduce_max_ps(v);
    }
#endif
    for (; t < n; t++) m = s[t] > m ? s[t] : m;
    return m;
}
/* s[t] = exp(s[t] - m) for t < n (m: at least their maximum); returns their sum. */
static inline float exp_sum(float* s, int n, float m) {
    float sum = 0.0f;
    int t = 0;
#if ZVEC
    const __m512 zm = _mm512_set1_ps(m);
    __m512 zsum = _mm512_setzero_ps();
    for (; t + 16 <= n; t += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t), zm));
        _mm512_storeu_ps(s + t, e);
        zsum = _mm512_add_ps(zsum, e);
    }
    sum = _mm512_reduce_add_ps(zsum);
#endif
#if VEC
    const __m256 vm = _mm256_set1_ps(m);
    __m256 vsum = _mm256_setzero_ps();
    for (; t + 8 <= n; t += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vm));
        _mm256_storeu_ps(s + t, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    sum += hsum8(vsum);
#endif
    for (; t < n; t++) { s[t] = exp_neg(s[t] - m); sum += s[t]; }
    return sum;
}
typedef float T_f32;
typedef uint16_t T_bf16;
static inline float load1_f32(const float* p) { return *p; }
static inline float load1_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
static inline void store1_f32(float* p, float v) { *p = v; }
static inline void store1_bf16(uint16_t* p, float v) { *p = f32_to_bf16(v); }
/* Ask for the cache block that comes next in a table while this one is used: blocks are scattered over the
   pool, and the hardware prefetcher does not follow a sequence from one block to the next (nor across pages). */
static inline void prefetch_block(const void* p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch((const char*)p + i, 0, 3);
}
/* Part i of n of a block's lines, asked for into L2 while the block before is computed: a few at a time (all at
   once, they stalled the loop) and into L2, not L1 (a prefetch into L1 holds one of the core's few L1 miss buffers
   until its line arrives, so few lines were in flight: a 32-row decode step's attention 1.6x slower). */
static inline void prefetch_part(const void* p, int64_t bytes, int i, int n) {
    const int64_t lines = (bytes + 63) / 64;
    for (int64_t l = lines * i / n; l < lines * (i + 1) / n; l++) __builtin_prefetch((const char*)p + l * 64, 0, 2);
}

/* Gemma 2's soft-capped score tanh(s / cap) * cap (transformers' `attn_logit_softcapping`): tanh from exp_neg as
   (1 - e) / (1 + e), e = exp(-2|x|), and near 0 (where 1 - e loses digits) its odd series to x^7, within a few ulp
   of tanhf either way. The scalar build's; the vector builds take simd_exp.h's tanh8 / tanh16, the same operations
   lane by lane over the vector exp. */
static inline float softcap1(float s, float cap) {
    const float x = s / cap, a = __builtin_fabsf(x);
    float t;
    if (a < 0.125f) {
        const float x2 = a * a;
        t = a * (1.0f + x2 * (-0.333333333f + x2 * (0.133333333f + x2 * -0.053968254f)));
    } else {
        const float e = exp_neg(-2.0f * a);
        t = (1.0f - e) / (1.0f + e);
    }
    return (x < 0.0f ? -t : t) * cap;
}
/* Scores s[0 .. n - 1] soft-capped in place (cap <= 0: none): decode rows' spans and the AVX-512 prefill tile's
   score rows. The vector builds run the tail through a masked or padded vector, so a score's value does not depend
   on where it sits in s: both builds and both paths give every score the same bits (the scalar build: softcap1's). */
static inline void softcap_all(float* s, int n, float cap) {
    if (cap <= 0.0f) return;
    int t = 0;
#if ZVEC
    const __m512 zc = _mm512_set1_ps(cap);
    for (; t < n; t += 16) {
        const __mmask16 k = n - t >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - t)) - 1u);
        const __m512 x = _mm512_div_ps(_mm512_maskz_loadu_ps(k, s + t), zc);
        _mm512_mask_storeu_ps(s + t, k, _mm512_mul_ps(tanh16(x), zc));
    }
#elif VEC
    const __m256 vc = _mm256_set1_ps(cap);
    for (; t < n; t += 8) {
        float pad[8] = {0};  /* the tail: a padded copy */
        float* x = n - t >= 8 ? s + t : pad;
        if (x == pad) memcpy(pad, s + t, sizeof(float) * (size_t)(n - t));
        _mm256_storeu_ps(x, _mm256_mul_ps(tanh8(_mm256_div_ps(_mm256_loadu_ps(x), vc)), vc));
        if (x == pad) memcpy(s + t, pad, sizeof(float) * (size_t)(n - t));
    }
#endif
    for (; t < n; t++) s[t] = softcap1(s[t], cap);
}
/* The first position a query at `pos` sees under a sliding window (transformers' rule: p - window < k <= p);
   window <= 0: none, position 0. */
static inline int window_start(int pos, int window) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

/* The factor that turns a head's summed weighted values (m: its scores' maximum, l: the sum of exp(score - m)) into
   its output: 1 / l; with an attention sink (gpt-oss: a learned logit per head in the softmax's denominator that no
   value belongs to; sinks NULL: none) the softmax runs over [scores, sink] and the sink's probability is dropped:
   a / (l * a + exp(sink - M)), M = max(m, sink), a = exp(m - M). */
static inline float out_scale(float m, float l, const float* sinks, int h) {
    if (!sinks) return 1.0f / l;
    const float s = sinks[h], top = s > m ? s : m, a = exp_neg(m - top);
    return a / (l * a + exp_neg(s - top));
}

/* Rounding of one elementwise op's result to the storage type, as torch does after each op. */
static inline float round_f32(float v) { return v; }
static inline float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

/* transformers' rotary embedding x * cos + rotate_half(x) * sin, with rotate_half's sign folded into `sin`
   (-a * b == a * -b exactly): three ops, each rounded to the storage type (the file is built without FMA
   contraction, so this is bit for bit what torch computes). */
static inline float rope_f32(float x, float xr, float c, float s) { return round_f32(round_f32(x * c) + round_f32(xr * s)); }
static inline float rope_bf16(float x, float xr, float c, float s) { return round_bf16(round_bf16(x * c) + round_bf16(xr * s)); }

#endif
