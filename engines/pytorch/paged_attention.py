"""Attention that reads the paged KV cache in place: small C kernels, built on first use, with a torch fallback.

A decode step has one new query per sequence. Done with torch ops it needs each layer to copy every sequence's
keys and values out of the paged cache into a dense tensor (a gather of B x context rows, twice) before
`scaled_dot_product_attention`, whose CPU kernel is also slow for one query row. Both cost more than the
projections at batch 32. The decode kernel rotates the step's new query and key (rope), writes the key and value
rows into their cache slots and then, for each sequence and KV head, scores the query heads of that group against
the cached keys (found through the block table), takes a softmax and sums the values, with no copy.

Prefill rows (a chunk of new queries per sequence) are rotated and their keys and values written first (every row
may read keys another row wrote), then each row attends causally to its sequence's cached positions up to its
own. On AVX-512 tiles of 16 consecutive rows of a sequence go through the cache together, one KV head at a time, in
one pass (online softmax): the query rows of a head are the lanes of the registers, so a key's scores against 16
of them are one FMA chain per lane (no horizontal sums) and the softmax runs in the lanes too: 1.7-2.3x faster than
the four-row tiles with a dot product per score it replaced (16 prompts of 128 rows: 1.85x; one 2048-token prompt:
2.2x). In bfloat16 the softmax weights are rounded to bfloat16 before they weigh the values, as torch's flash
attention does (greedy parity with transformers: 8 of 12 prompts with it, 7 without).
Each row's arithmetic does not depend on its tile or chunk (tested).

The kernels are built by `native.py`. Without a compiler, or if the build fails, `PagedAttention` falls back to a
torch gather + SDPA path with the same results up to float rounding.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from engines.pytorch.native import EXP8_AVX2, EXP16_AVX512, POOL_CLIENT, HelperThreads, load_library

_COMMON = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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
/* s[t] = exp(s[t] - m) for t < n (m: at least their maximum); returns their sum. */
static inline float exp_sum(float* s, int n, float m) {
    float sum = 0.0f;
    int t = 0;
#if VEC
    const __m256 vm = _mm256_set1_ps(m);
    __m256 vsum = _mm256_setzero_ps();
    for (; t + 8 <= n; t += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vm));
        _mm256_storeu_ps(s + t, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    sum = hsum8(vsum);
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

/* Rounding of one elementwise op's result to the storage type, as torch does after each op. */
static inline float round_f32(float v) { return v; }
static inline float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

/* transformers' rotary embedding x * cos + rotate_half(x) * sin, with rotate_half's sign folded into `sin`
   (-a * b == a * -b exactly): three ops, each rounded to the storage type (the file is built without FMA
   contraction, so this is bit for bit what torch computes). */
static inline float rope_f32(float x, float xr, float c, float s) { return round_f32(round_f32(x * c) + round_f32(xr * s)); }
static inline float rope_bf16(float x, float xr, float c, float s) { return round_bf16(round_bf16(x * c) + round_bf16(xr * s)); }
"""

# One copy per storage type, SFX: f32 | bf16.
_TEMPLATE = r"""
#if VEC
/* Scores of 8 consecutive cached rows against one query head of size 64: 8 independent FMA chains, then a
   transposing horizontal add gives the 8 sums in one register. */
static inline __m256 dot8x64_SFX(const float* q, const T_SFX* k, int64_t row) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int j = 0; j < 64; j += 8) {
        __m256 qj = _mm256_loadu_ps(q + j);
        a0 = _mm256_fmadd_ps(qj, load8_SFX(k + j), a0);
        a1 = _mm256_fmadd_ps(qj, load8_SFX(k + row + j), a1);
        a2 = _mm256_fmadd_ps(qj, load8_SFX(k + 2 * row + j), a2);
        a3 = _mm256_fmadd_ps(qj, load8_SFX(k + 3 * row + j), a3);
        a4 = _mm256_fmadd_ps(qj, load8_SFX(k + 4 * row + j), a4);
        a5 = _mm256_fmadd_ps(qj, load8_SFX(k + 5 * row + j), a5);
        a6 = _mm256_fmadd_ps(qj, load8_SFX(k + 6 * row + j), a6);
        a7 = _mm256_fmadd_ps(qj, load8_SFX(k + 7 * row + j), a7);
    }
    return sum8x8(a0, a1, a2, a3, a4, a5, a6, a7);
}
#endif

static inline float dot_SFX(const float* q, const T_SFX* k, int D) {
#if VEC
    if (D % 8 == 0) {
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < D; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), load8_SFX(k + j), acc);
        return hsum8(acc);
    }
#endif
    float s = 0.0f;
    for (int j = 0; j < D; j++) s += q[j] * load1_SFX(k + j);
    return s;
}

#if ZVEC
/* acc (4 query rows of 64 floats) = acc * alpha + sum over t < kn of p[t * ldp + r] * v row t (value rows `row`
   elements apart): the tile kernel's output rows, rescaled for their new maximum and summed in registers. */
static inline void values4_SFX(float* acc, const float* alpha, const float* p, int ldp, const T_SFX* v, int64_t row,
                               int kn) {
    __m512 o[4][4];
    for (int r = 0; r < 4; r++) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        for (int c = 0; c < 4; c++) o[r][c] = _mm512_mul_ps(a, _mm512_loadu_ps(acc + r * 64 + 16 * c));
    }
    for (int t = 0; t < kn; t++) {
        const T_SFX* vt = v + t * row;
        const __m512 v0 = loadz_SFX(vt), v1 = loadz_SFX(vt + 16), v2 = loadz_SFX(vt + 32), v3 = loadz_SFX(vt + 48);
        for (int r = 0; r < 4; r++) {
            const __m512 pt = _mm512_set1_ps(p[t * ldp + r]);
            o[r][0] = _mm512_fmadd_ps(pt, v0, o[r][0]);
            o[r][1] = _mm512_fmadd_ps(pt, v1, o[r][1]);
            o[r][2] = _mm512_fmadd_ps(pt, v2, o[r][2]);
            o[r][3] = _mm512_fmadd_ps(pt, v3, o[r][3]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc + r * 64 + 16 * c, o[r][c]);
}

/* Prefill rows with D = 64: `n` consecutive positions p0.. of one sequence (row i attends causally to positions
   0..p0 + i), one KV head at a time, in one pass over its cached keys and values (online softmax, as flash
   attention does). The tile's query rows of that head (row i, head g * G + j: query row i * G + j) sit as columns
   of qt ([64][QRP], scaled), so each key's scores against 16 query rows are one register: every score is an FMA
   chain over d in a lane, with no horizontal sums, and the softmax of 16 query rows runs in the lanes too. Keys are
   taken 16 at a time; a row's keys beyond its own position are masked to exactly 0, so a row's bits depend only on
   its position and the cache, not on the tile it is in. qrot: the tile's rotated queries [n][H][64]; scratch:
   tile64_scratch floats. out: [n, H, 64]. */
static void tile64_SFX(const T_SFX* kc, const T_SFX* vc, const int32_t* table, int p0, int n, T_SFX* out,
                       int H, int KVH, int BS, float scale, const float* qrot, float* scratch) {
    const int G = H / KVH, QR = n * G, QRP = (int)tile64_qrp(n, G), last = p0 + n - 1;
    const int64_t row = (int64_t)KVH * 64;
    float *qt = scratch, *acc = qt + (size_t)QRP * 64, *pb = acc + (size_t)QRP * 64, *m = pb + (size_t)QRP * TILE_KEYS;
    float *l = m + QRP, *alpha = l + QRP, *kconv = alpha + QRP;
    int32_t pos[QRP];
    for (int qi = 0; qi < QRP; qi++) pos[qi] = qi < QR ? p0 + qi / G : -1;  /* padding rows see no key */
    for (int g = 0; g < KVH; g++) {
        for (int qi = 0; qi < QRP; qi++) {
            const float* q = qrot + ((int64_t)(qi / G) * H + g * G + qi % G) * 64;
            for (int d = 0; d < 64; d++) qt[d * QRP + qi] = qi < QR ? q[d] * scale : 0.0f;
            m[qi] = -3.0e38f; l[qi] = 0.0f;
        }
        memset(acc, 0, sizeof(float) * (size_t)QRP * 64);
        for (int t0 = 0; t0 <= last; t0 += BS) {
            const int64_t base = (int64_t)table[t0 / BS] * BS * row + (int64_t)g * 64;
            if (t0 + BS <= last) {
                const int64_t next = (int64_t)table[t0 / BS + 1] * BS * row;
                prefetch_block(kc + next, sizeof(T_SFX) * BS * row);
                prefetch_block(vc + next, sizeof(T_SFX) * BS * row);
            }
            for (int tt = 0; tt < BS && t0 + tt <= last; tt += TILE_KEYS) {
                const int k0 = t0 + tt;  /* the group's first key position */
                const int kn = last - k0 + 1 < TILE_KEYS ? (BS - tt < last - k0 + 1 ? BS - tt : last - k0 + 1)
                                                         : (BS - tt < TILE_KEYS ? BS - tt : TILE_KEYS);
                const float* kp[TILE_KEYS];
                key_rows_SFX(kc + base + (int64_t)tt * row, row, kn, kconv, kp);
                for (int c0 = 0; c0 < QRP; c0 += 48) {
                    const int nc = (QRP - c0) / 16 < 3 ? (QRP - c0) / 16 : 3;
                    if (last_pos(pos, c0, c0 + nc * 16, QR) < k0) continue;  /* no row of these chunks sees the keys */
                    scores16(nc, kp, kn, qt + c0, QRP, pb + c0, QRP);
                    for (int c = c0; c < c0 + nc * 16; c += 16) {  /* the softmax of 16 query rows, in the lanes */
                        const __m512i pv = _mm512_loadu_si512(pos + c);
                        __mmask16 vis[TILE_KEYS];
                        const __m512 mold = _mm512_loadu_ps(m + c);
                        __m512 mx = mold;
                        for (int t = 0; t < kn; t++) {
                            vis[t] = _mm512_cmp_epi32_mask(_mm512_set1_epi32(k0 + t), pv, _MM_CMPINT_LE);
                            mx = _mm512_mask_max_ps(mx, vis[t], mx, _mm512_loadu_ps(pb + t * QRP + c));
                        }
                        const __m512 a = exp16(_mm512_sub_ps(mold, mx));
                        __m512 sum = _mm512_setzero_ps();
                        for (int t = 0; t < kn; t++) {
                            const __m512 st = _mm512_loadu_ps(pb + t * QRP + c);
                            const __m512 p = _mm512_maskz_mov_ps(vis[t], exp16(_mm512_sub_ps(st, mx)));
                            _mm512_storeu_ps(pb + t * QRP + c, roundz_SFX(p));  /* the sum keeps p unrounded */
                            sum = _mm512_add_ps(sum, p);
                        }
                        _mm512_storeu_ps(l + c, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(l + c), a), sum));
                        _mm512_storeu_ps(m + c, mx);
                        _mm512_storeu_ps(alpha + c, a);
                    }
                }
                for (int q0 = 0; q0 < QRP; q0 += 4)
                    if (last_pos(pos, q0, q0 + 4, QR) >= k0)  /* rows that see none of these keys: unchanged */
                        values4_SFX(acc + (int64_t)q0 * 64, alpha + q0, pb + q0, QRP, vc + base + (int64_t)tt * row,
                                    row, kn);
            }
        }
        for (int qi = 0; qi < QR; qi++) {
            const float inv = 1.0f / l[qi];
            T_SFX* o = out + ((int64_t)(qi / G) * H + g * G + qi % G) * 64;
            for (int d = 0; d < 64; d++) store1_SFX(o + d, acc[(int64_t)qi * 64 + d] * inv);
        }
    }
}
#endif

/* One sequence: every query head against its ctx cached keys and values. The cache is walked block by block and
   each block's rows (all KV heads, contiguous) are used for every head before moving on, once for the scores and
   once for the values. qf: H * D floats, scores: H * ctx floats, acc: H * D floats (scratch). */
static void sequence_SFX(const T_SFX* kc, const T_SFX* vc, const int32_t* table, int ctx, T_SFX* out,
                         int H, int KVH, int D, int BS, float scale, float* qf, float* scores, float* acc) {
    const int G = H / KVH;
    const int64_t row = (int64_t)KVH * D;
    for (int i = 0; i < H * D; i++) qf[i] *= scale;
    for (int t0 = 0; t0 < ctx; t0 += BS) {
        const T_SFX* kb = kc + (int64_t)table[t0 / BS] * BS * row;
        const int n = ctx - t0 < BS ? ctx - t0 : BS;
        if (t0 + BS < ctx) prefetch_block(kc + (int64_t)table[t0 / BS + 1] * BS * row, sizeof(T_SFX) * BS * row);
        else prefetch_block(vc + (int64_t)table[0] * BS * row, sizeof(T_SFX) * BS * row);  /* the values' first */
        for (int h = 0; h < H; h++) {
            const T_SFX* k = kb + (int64_t)(h / G) * D;
            float* sc = scores + (int64_t)h * ctx + t0;
            int t = 0;
#if VEC
            if (D == 64)
                for (; t + 8 <= n; t += 8) _mm256_storeu_ps(sc + t, dot8x64_SFX(qf + h * D, k + t * row, row));
#endif
            for (; t < n; t++) sc[t] = dot_SFX(qf + h * D, k + t * row, D);
        }
    }
    for (int h = 0; h < H; h++) {
        float* sc = scores + (int64_t)h * ctx;
        float m = sc[0];
        for (int t = 1; t < ctx; t++) m = sc[t] > m ? sc[t] : m;
        const float inv = 1.0f / exp_sum(sc, ctx, m);
        for (int t = 0; t < ctx; t++) sc[t] *= inv;
    }
    for (int i = 0; i < H * D; i++) acc[i] = 0.0f;
    for (int t0 = 0; t0 < ctx; t0 += BS) {
        const T_SFX* vb = vc + (int64_t)table[t0 / BS] * BS * row;
        const int n = ctx - t0 < BS ? ctx - t0 : BS;
        if (t0 + BS < ctx) prefetch_block(vc + (int64_t)table[t0 / BS + 1] * BS * row, sizeof(T_SFX) * BS * row);
        for (int h = 0; h < H; h++) {
            const T_SFX* v = vb + (int64_t)(h / G) * D;
            const float* p = scores + (int64_t)h * ctx + t0;
            float* o = acc + (int64_t)h * D;
#if VEC
            if (D == 64) {  /* the output row stays in registers over the block */
                __m256 o0 = _mm256_loadu_ps(o), o1 = _mm256_loadu_ps(o + 8), o2 = _mm256_loadu_ps(o + 16);
                __m256 o3 = _mm256_loadu_ps(o + 24), o4 = _mm256_loadu_ps(o + 32), o5 = _mm256_loadu_ps(o + 40);
                __m256 o6 = _mm256_loadu_ps(o + 48), o7 = _mm256_loadu_ps(o + 56);
                for (int t = 0; t < n; t++) {
                    const T_SFX* vt = v + t * row;
                    __m256 pt = _mm256_set1_ps(p[t]);
                    o0 = _mm256_fmadd_ps(pt, load8_SFX(vt), o0);
                    o1 = _mm256_fmadd_ps(pt, load8_SFX(vt + 8), o1);
                    o2 = _mm256_fmadd_ps(pt, load8_SFX(vt + 16), o2);
                    o3 = _mm256_fmadd_ps(pt, load8_SFX(vt + 24), o3);
                    o4 = _mm256_fmadd_ps(pt, load8_SFX(vt + 32), o4);
                    o5 = _mm256_fmadd_ps(pt, load8_SFX(vt + 40), o5);
                    o6 = _mm256_fmadd_ps(pt, load8_SFX(vt + 48), o6);
                    o7 = _mm256_fmadd_ps(pt, load8_SFX(vt + 56), o7);
                }
                _mm256_storeu_ps(o, o0); _mm256_storeu_ps(o + 8, o1); _mm256_storeu_ps(o + 16, o2);
                _mm256_storeu_ps(o + 24, o3); _mm256_storeu_ps(o + 32, o4); _mm256_storeu_ps(o + 40, o5);
                _mm256_storeu_ps(o + 48, o6); _mm256_storeu_ps(o + 56, o7);
                continue;
            }
#endif
            for (int t = 0; t < n; t++)
                for (int j = 0; j < D; j++) o[j] += p[t] * load1_SFX(v + t * row + j);
        }
    }
    for (int i = 0; i < H * D; i++) store1_SFX(out + i, acc[i]);
}

/* `heads` rows of D values at x, rotated by c/s (sin with rotate_half's sign folded in, see `rotate`) into out as
   floats, bit for bit torch's rotation; without c, just converted. Two half loops: no index wrap, so they vectorize. */
static void rope_heads_SFX(const T_SFX* x, const T_SFX* c, const T_SFX* s, int heads, int D, float* out) {
    const int half = D / 2;
    for (int h = 0; h < heads; h++, x += D, out += D) {
        if (!c) { for (int j = 0; j < D; j++) out[j] = load1_SFX(x + j); continue; }
        for (int j = 0; j < half; j++) out[j] = rope_SFX(load1_SFX(x + j), load1_SFX(x + j + half), load1_SFX(c + j), load1_SFX(s + j));
        for (int j = half; j < D; j++) out[j] = rope_SFX(load1_SFX(x + j), load1_SFX(x + j - half), load1_SFX(c + j), load1_SFX(s + j));
    }
}

/* The new key (rotated by c/s, or as it is without c) and value of one position into cache slot `slot`. */
static void write_kv_SFX(const T_SFX* k, const T_SFX* v, const T_SFX* c, const T_SFX* s, T_SFX* kc, T_SFX* vc,
                         int64_t slot, int KVH, int D) {
    T_SFX* kdst = kc + slot * KVH * D;
    if (c) {
        float rot[KVH * D];
        rope_heads_SFX(k, c, s, KVH, D, rot);
        for (int i = 0; i < KVH * D; i++) store1_SFX(kdst + i, rot[i]);
    } else {
        memcpy(kdst, k, sizeof(T_SFX) * KVH * D);
    }
    memcpy(vc + slot * KVH * D, v, sizeof(T_SFX) * KVH * D);
}

/* q: [B, H, D] rows `q_stride` elements apart; k_new/v_new: [B, KVH, D] rows `k_stride`/`v_stride` apart;
   cos/sin: [B, D] (sin with rotate_half's sign folded in), or NULL when q and k are already rotated. The new
   key (rotated) and value are written to the cache slot of position ctx_lens[b] - 1 first. caches: [slots, KVH,
   D] of one layer; tables: [B, max_blocks]; out: [B, H, D] contiguous. H is a multiple of KVH, D is even.
   Sequences are taken one at a time from *next (an atomic counter starting at 0), so several threads may call
   this with the same arguments and share the batch; each sequence is computed the same whichever thread takes
   it. Returns 0, or -1 without memory. */
int paged_decode_SFX(const T_SFX* q, int64_t q_stride, const T_SFX* k_new, int64_t k_stride, const T_SFX* v_new,
                     int64_t v_stride, const T_SFX* cos, const T_SFX* sin, T_SFX* kc, T_SFX* vc,
                     const int32_t* tables, int max_blocks, const int32_t* ctx_lens, T_SFX* out,
                     int B, int H, int KVH, int D, int BS, float scale, int* next) {
    int max_ctx = 1;
    for (int b = 0; b < B; b++) if (ctx_lens[b] > max_ctx) max_ctx = ctx_lens[b];
    float* buf = (float*)malloc(sizeof(float) * (size_t)H * ((size_t)max_ctx + 2 * (size_t)D));
    if (!buf) return -1;
    for (int b; (b = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED)) < B;) {
        const int32_t* table = tables + (int64_t)b * max_blocks;
        const int pos = ctx_lens[b] - 1;
        const T_SFX* c = cos ? cos + (int64_t)b * D : 0;
        const T_SFX* s = sin ? sin + (int64_t)b * D : 0;
        write_kv_SFX(k_new + b * k_stride, v_new + b * v_stride, c, s, kc, vc, (int64_t)table[pos / BS] * BS + pos % BS,
                     KVH, D);
        rope_heads_SFX(q + b * q_stride, c, s, H, D, buf);
        sequence_SFX(kc, vc, table, ctx_lens[b], out + (int64_t)b * H * D, H, KVH, D, BS, scale,
                     buf, buf + (size_t)H * D, buf + (size_t)H * (D + max_ctx));
    }
    free(buf);
    return 0;
}

/* The keys (rotated) and values of a prefill chunk's rows into their cache slots: row r is position row_pos[r]
   of sequence row_seq[r] (block table tables + row_seq[r] * max_blocks); rows are taken from *next. */
void prefill_write_SFX(const T_SFX* k_new, int64_t k_stride, const T_SFX* v_new, int64_t v_stride, const T_SFX* cos,
                       const T_SFX* sin, T_SFX* kc, T_SFX* vc, const int32_t* tables, int max_blocks,
                       const int32_t* row_seq, const int32_t* row_pos, int R, int KVH, int D, int BS, int* next) {
    for (int r; (r = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED)) < R;) {
        const int32_t* table = tables + (int64_t)row_seq[r] * max_blocks;
        const int pos = row_pos[r];
        write_kv_SFX(k_new + r * k_stride, v_new + r * v_stride, cos ? cos + (int64_t)r * D : 0,
                     sin ? sin + (int64_t)r * D : 0, kc, vc, (int64_t)table[pos / BS] * BS + pos % BS, KVH, D);
    }
}

/* Attention of a prefill chunk (its keys and values written by prefill_write first): row r of q ([R, H, D], rows
   q_stride apart, rotated here by cos/sin [R, D] unless they are NULL) is the query at position row_pos[r] of
   sequence row_seq[r] and attends to the cached positions 0..row_pos[r]: causal. Rows are taken one at a time
   from *next (an atomic counter starting at 0), as paged_decode takes sequences. max_ctx: the largest row_pos +
   1. out: [R, H, D] contiguous. Returns 0, or -1 without memory. */
int paged_prefill_SFX(const T_SFX* q, int64_t q_stride, const T_SFX* cos, const T_SFX* sin, const T_SFX* kc,
                      const T_SFX* vc, const int32_t* tables, int max_blocks, const int32_t* row_seq,
                      const int32_t* row_pos, T_SFX* out, int R, int H, int KVH, int D, int BS, float scale,
                      int max_ctx, int* next) {
    size_t need = (size_t)H * ((size_t)max_ctx + 2 * (size_t)D);
#if ZVEC
    const size_t tile_need = (size_t)PREFILL_TILE * H * 64 + tile64_scratch(PREFILL_TILE, H / KVH);
    if (D == 64 && tile_need > need) need = tile_need;
#endif
    float* buf = (float*)malloc(sizeof(float) * need);
    if (!buf) return -1;
    for (int w; (w = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED)) * PREFILL_TILE < R;) {
        const int end = (w + 1) * PREFILL_TILE < R ? (w + 1) * PREFILL_TILE : R;
        for (int r = w * PREFILL_TILE, e; r < end; r = e) {
            /* the tile's rows that continue row r's sequence position by position */
            for (e = r + 1; e < end && row_seq[e] == row_seq[r] && row_pos[e] == row_pos[e - 1] + 1; e++) {}
            const int32_t* table = tables + (int64_t)row_seq[r] * max_blocks;
#if ZVEC
            if (D == 64) {
                for (int i = r; i < e; i++)
                    rope_heads_SFX(q + i * q_stride, cos ? cos + (int64_t)i * D : 0, sin ? sin + (int64_t)i * D : 0,
                                   H, D, buf + (size_t)(i - r) * H * D);
                tile64_SFX(kc, vc, table, row_pos[r], e - r, out + (int64_t)r * H * D, H, KVH, BS, scale, buf,
                           buf + (size_t)(e - r) * H * D);
                continue;
            }
#endif
            for (int i = r; i < e; i++) {
                rope_heads_SFX(q + i * q_stride, cos ? cos + (int64_t)i * D : 0, sin ? sin + (int64_t)i * D : 0, H, D,
                               buf);
                sequence_SFX(kc, vc, table, row_pos[i] + 1, out + (int64_t)i * H * D, H, KVH, D, BS, scale, buf,
                             buf + (size_t)H * D, buf + (size_t)H * (D + max_ctx));
            }
        }
    }
    free(buf);
    return 0;
}
/* Both on the helper-thread pool (native.py): one job each, sequences or rows handed out by the counter in it. */
typedef struct {
    const T_SFX *q, *k_new, *v_new, *cos, *sin; T_SFX *kc, *vc, *out; const int32_t *tables, *ctx_lens;
    int64_t q_stride, k_stride, v_stride; int max_blocks, B, H, KVH, D, BS; float scale; int next, rc;
} decode_job_SFX;
static void decode_task_SFX(void* p) {
    decode_job_SFX* j = (decode_job_SFX*)p;
    if (paged_decode_SFX(j->q, j->q_stride, j->k_new, j->k_stride, j->v_new, j->v_stride, j->cos, j->sin, j->kc, j->vc,
                         j->tables, j->max_blocks, j->ctx_lens, j->out, j->B, j->H, j->KVH, j->D, j->BS, j->scale,
                         &j->next) != 0)
        __atomic_store_n(&j->rc, -1, __ATOMIC_RELAXED);
}
int paged_decode_par_SFX(const T_SFX* q, int64_t q_stride, const T_SFX* k_new, int64_t k_stride, const T_SFX* v_new,
                         int64_t v_stride, const T_SFX* cos, const T_SFX* sin, T_SFX* kc, T_SFX* vc,
                         const int32_t* tables, int max_blocks, const int32_t* ctx_lens, T_SFX* out,
                         int B, int H, int KVH, int D, int BS, float scale) {
    decode_job_SFX j = {q, k_new, v_new, cos, sin, kc, vc, out, tables, ctx_lens, q_stride, k_stride, v_stride,
                        max_blocks, B, H, KVH, D, BS, scale, 0, 0};
    POOL_RUN(decode_task_SFX, &j);
    return j.rc;
}

typedef struct {
    const T_SFX *q, *k_new, *v_new, *cos, *sin; T_SFX *kc, *vc, *out; const int32_t *tables, *row_seq, *row_pos;
    int64_t q_stride, k_stride, v_stride; int max_blocks, R, H, KVH, D, BS; float scale; int max_ctx, next_write, next, rc;
} prefill_job_SFX;
static void prefill_write_task_SFX(void* p) {
    prefill_job_SFX* j = (prefill_job_SFX*)p;
    prefill_write_SFX(j->k_new, j->k_stride, j->v_new, j->v_stride, j->cos, j->sin, j->kc, j->vc, j->tables,
                      j->max_blocks, j->row_seq, j->row_pos, j->R, j->KVH, j->D, j->BS, &j->next_write);
}
static void prefill_task_SFX(void* p) {
    prefill_job_SFX* j = (prefill_job_SFX*)p;
    if (paged_prefill_SFX(j->q, j->q_stride, j->cos, j->sin, j->kc, j->vc, j->tables, j->max_blocks, j->row_seq,
                          j->row_pos, j->out, j->R, j->H, j->KVH, j->D, j->BS, j->scale, j->max_ctx, &j->next) != 0)
        __atomic_store_n(&j->rc, -1, __ATOMIC_RELAXED);
}
/* A prefill chunk's rows: prefill_write, then paged_prefill (every row may read keys another row wrote), each
   shared with the helper threads when `share`. Returns 0, or -1 without memory. */
int paged_prefill_run_SFX(const T_SFX* q, int64_t q_stride, const T_SFX* k_new, int64_t k_stride, const T_SFX* v_new,
                          int64_t v_stride, const T_SFX* cos, const T_SFX* sin, T_SFX* kc, T_SFX* vc,
                          const int32_t* tables, int max_blocks, const int32_t* row_seq, const int32_t* row_pos,
                          T_SFX* out, int R, int H, int KVH, int D, int BS, float scale, int max_ctx, int share) {
    prefill_job_SFX j = {q, k_new, v_new, cos, sin, kc, vc, out, tables, row_seq, row_pos, q_stride, k_stride,
                         v_stride, max_blocks, R, H, KVH, D, BS, scale, max_ctx, 0, 0, 0};
    if (share) {
        POOL_RUN(prefill_write_task_SFX, &j);
        POOL_RUN(prefill_task_SFX, &j);
    } else {
        prefill_write_task_SFX(&j);
        prefill_task_SFX(&j);
    }
    return j.rc;
}
"""

_SOURCE = (_COMMON + POOL_CLIENT + "".join(_TEMPLATE.replace("SFX", sfx) for sfx in ("f32", "bf16"))).replace(
    "EXP8_AVX2", EXP8_AVX2).replace("EXP16_AVX512", EXP16_AVX512)

SHARE_MIN_SEQS = 4  # fewer sequences (or prefill rows) are not worth waking a helper thread for


def _load(cache_dir: Path | None) -> ctypes.CDLL | None:
    lib = load_library("paged_attention", _SOURCE, cache_dir)
    if lib is not None and not getattr(lib, "_typed", False):
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        decode = [p, i64, p, i64, p, i64, p, p, p, p, p, i32, p, p, i32, i32, i32, i32, i32, ctypes.c_float]
        prefill = [p, i64, p, i64, p, i64, p, p, p, p, p, i32, p, p, p, i32, i32, i32, i32, i32, ctypes.c_float, i32, i32]
        for sfx in ("f32", "bf16"):
            getattr(lib, f"paged_decode_{sfx}").argtypes = [*decode, p]  # + the work counter
            getattr(lib, f"paged_decode_par_{sfx}").argtypes = decode
            getattr(lib, f"paged_prefill_run_{sfx}").argtypes = prefill  # + share
            for name in ("paged_decode", "paged_decode_par", "paged_prefill_run"):
                getattr(lib, f"{name}_{sfx}").restype = ctypes.c_int
        lib._typed = True
    return lib


class PagedAttention:
    """Attention over the paged cache: `decode` (one new query per sequence, its key and value written first) and
    `prefill` (a chunk of new queries per sequence, causal)."""

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
        cache_dir: Path | None, use_kernel: bool = True, helpers: HelperThreads | None = None,
    ) -> None:
        """`helpers`: threads that share the kernels' work (sequences, prefill rows) from SHARE_MIN_SEQS items."""
        self.num_heads, self.num_kv_heads, self.head_dim, self.block_size = num_heads, num_kv_heads, head_dim, block_size
        fits = num_heads % num_kv_heads == 0 and dtype in (torch.float32, torch.bfloat16)
        self._lib = _load(cache_dir) if use_kernel and fits else None
        self._sfx = "f32" if dtype == torch.float32 else "bf16"
        self._share = helpers is not None and self._lib is not None
        if self._share:
            helpers.attach(self._lib)

    @property
    def uses_kernel(self) -> bool:
        return self._lib is not None

    def decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, step: DecodeTables, scale: float,
    ) -> torch.Tensor:
        """Rotate q [B, H, D] and k [B, KVH, D] (rows may be strided views) by cos/sin [B, D] (`sin` with
        rotate_half's sign folded in, see `rotate`), write k and v [B, KVH, D] to their cache slots and attend.
        Caches: [slots, KVH, D]. Returns [B, H * D]."""
        b, h, d = q.shape
        if self._lib is not None and all(x.stride(2) == 1 and x.stride(1) == d for x in (q, k, v)) \
                and cos.is_contiguous() and sin.is_contiguous() and cos.shape == (b, d):
            out = q.new_empty(b, h * d)
            args = (q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), cos.data_ptr(),
                    sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), step.tables.data_ptr(),
                    step.tables.shape[1], step.ctx_lens.data_ptr(), out.data_ptr(), b, h, self.num_kv_heads, d,
                    self.block_size, scale)
            if self._share and b >= SHARE_MIN_SEQS:
                rc = getattr(self._lib, f"paged_decode_par_{self._sfx}")(*args)
            else:
                rc = getattr(self._lib, f"paged_decode_{self._sfx}")(*args, ctypes.byref(ctypes.c_int(0)))
            if rc != 0:
                raise MemoryError("paged attention kernel could not allocate its score buffer")
            return out
        return self._torch(rotate(q, cos[:, None], sin[:, None]), rotate(k, cos[:, None], sin[:, None]), v, k_cache, v_cache, step, scale)

    def prefill(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
        k_cache: torch.Tensor, v_cache: torch.Tensor, rows: PrefillRows, scale: float,
    ) -> torch.Tensor:
        """A prefill chunk: rotate q [R, H, D] and k [R, KVH, D] by cos/sin [R, D] (as `decode`; None when they
        are rotated already), write k and v to their cache slots, then causal attention of every row over its
        sequence's cache: [R, H * D]. Needs the kernel (`uses_kernel`); without it the runner gathers and uses
        SDPA."""
        if self._lib is None:
            raise RuntimeError("prefill attention needs the C kernel")
        r, h, d = q.shape
        q, k, v = (x if x.stride(2) == 1 and x.stride(1) == d else x.contiguous() for x in (q, k, v))
        if cos is not None:
            cos, sin = cos.contiguous(), sin.contiguous()
        out = q.new_empty(r, h * d)
        rc = getattr(self._lib, f"paged_prefill_run_{self._sfx}")(
            q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
            cos.data_ptr() if cos is not None else None, sin.data_ptr() if sin is not None else None,
            k_cache.data_ptr(), v_cache.data_ptr(), rows.tables.data_ptr(), rows.tables.shape[1],
            rows.row_seq.data_ptr(), rows.row_pos.data_ptr(), out.data_ptr(), r, h, self.num_kv_heads, d,
            self.block_size, scale, rows.max_ctx, int(self._share and r >= SHARE_MIN_SEQS),
        )
        if rc != 0:
            raise MemoryError("paged attention kernel could not allocate its score buffer")
        return out

    def _torch(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        step: DecodeTables, scale: float,
    ) -> torch.Tensor:
        b, h, d = q.shape
        kvh, group = self.num_kv_heads, h // self.num_kv_heads
        slots, kv_index, mask = step.torch_index()
        k_cache.index_copy_(0, slots, k)
        v_cache.index_copy_(0, slots, v)
        ctx = kv_index.shape[1]
        keys = k_cache.index_select(0, kv_index.view(-1)).view(b, ctx, kvh, d).transpose(1, 2)
        values = v_cache.index_select(0, kv_index.view(-1)).view(b, ctx, kvh, d).transpose(1, 2)
        # the query heads that share a KV head act as `group` query rows of that head: no GQA expansion
        out = F.scaled_dot_product_attention(q.reshape(b, kvh, group, d), keys, values, attn_mask=mask, scale=scale)
        return out.reshape(b, h * d)


def cache_slots(block_table: list[int], block_size: int, end: int) -> torch.Tensor:
    """The cache slots of a sequence's positions 0..end-1 (its blocks' slots in table order)."""
    table = torch.tensor(block_table[: (end + block_size - 1) // block_size], dtype=torch.long)
    return (table[:, None] * block_size + torch.arange(block_size)).flatten()[:end]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' `x * cos + rotate_half(x) * sin` with `sin` = cat(-sin[:d/2], sin[d/2:]) precomputed:
    rotate_half(x) * sin = cat(-x2, x1) * sin = cat(x2, x1) * sin_folded exactly, so the result is bit for bit
    transformers'. x [T, heads, D]; cos/sin broadcast against it."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin


class DecodeTables:
    """Per-step index tensors of the decode rows, shared by every layer."""

    def __init__(self, block_tables: list[list[int]], ctx_lens: list[int], block_size: int) -> None:
        width = max(len(t) for t in block_tables)
        self.tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32)
        self.ctx_lens = torch.tensor(ctx_lens, dtype=torch.int32)
        self.block_size = block_size
        self._torch_index: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def torch_index(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(slots [B], kv_index [B, ctx], mask [B, 1, 1, ctx]) for the torch path, built once per step."""
        if self._torch_index is None:
            bs = self.block_size
            lens = self.ctx_lens.long()
            pos = torch.arange(int(lens.max()))
            index = self.tables.long()[:, pos // bs] * bs + pos % bs
            mask = pos[None, :] < lens[:, None]
            self._torch_index = (
                index.gather(1, (lens - 1)[:, None]).view(-1),
                torch.where(mask, index, 0).contiguous(),  # padding reads slot 0, masked out
                mask[:, None, None, :],
            )
        return self._torch_index


class PrefillRows:
    """Per-step index tensors of the prefill rows, shared by every layer: each row's sequence and position."""

    def __init__(self, block_tables: list[list[int]], starts: list[int], lengths: list[int]) -> None:
        width = max(len(t) for t in block_tables)
        self.tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32)
        self.row_seq = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths))
        self.row_pos = torch.cat([torch.arange(s, s + n, dtype=torch.int32) for s, n in zip(starts, lengths, strict=True)])
        self.max_ctx = max(s + n for s, n in zip(starts, lengths, strict=True))
