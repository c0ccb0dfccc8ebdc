/* What every part of the projections' library (gemm.c) shares: weight types and loads per weight type, bfloat16
   conversions, blocking constants and the 512-bit micro-kernels' row macros. */
#ifndef SWITCHYARD_GEMM_COMMON_H
#define SWITCHYARD_GEMM_COMMON_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

typedef float WT_f32;
typedef uint16_t WT_bf16w;
typedef uint16_t WT_f16w;
static inline __m256 LOADW_f32(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 LOADW_bf16w(const uint16_t* p) {  /* 8 bfloat16 -> float32, exactly */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
static inline __m256 LOADW_f16w(const uint16_t* p) {  /* 8 float16 -> float32, exactly (F16C) */
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
#ifdef __AVX512F__
static inline __m512 LOADZ_f16w(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
static inline __m512 LOADZ_f32(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 widen_bf16(__m256i h) {  /* 16 bfloat16 -> float32, exactly */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline __m512 LOADZ_bf16w(const uint16_t* p) { return widen_bf16(_mm256_loadu_si256((const __m256i*)p)); }
#endif
static inline float bf16_to_f32(uint16_t x) { uint32_t u = (uint32_t)x << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f32_to_bf16(float f) {  /* round to nearest even, as torch converts */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* NaN stays NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* (KC, MC) K is split only when a panel (K x 16 floats) would not stay in L2. M is blocked at 96 rows (8 row blocks
   of the 512-bit kernel, x block in L2) for large prefills: +15% at 2048 x 576 against streaming all of x from L3
   for every panel pair, no change at 512 rows or below. */
#define KC 2048
#define PF1 32  /* rows ahead a one-row step prefetches (16: the same, 64: slower) */
#define MC 96
#define ZROWS 12     /* rows of the 512-bit micro-kernel: 12 x 2 panels = 24 of the 32 vector registers accumulate */
#define ZMIN_ROWS 4  /* below this a step is memory-bound and the 256-bit kernels stream the weights as fast */

/* F(0) F(1) ... F(r - 1): the rows of an r-row micro-kernel (r = 1..ZROWS). */
#define ZREPEAT_1(F) F(0)
#define ZREPEAT_2(F) ZREPEAT_1(F) F(1)
#define ZREPEAT_3(F) ZREPEAT_2(F) F(2)
#define ZREPEAT_4(F) ZREPEAT_3(F) F(3)
#define ZREPEAT_5(F) ZREPEAT_4(F) F(4)
#define ZREPEAT_6(F) ZREPEAT_5(F) F(5)
#define ZREPEAT_7(F) ZREPEAT_6(F) F(6)
#define ZREPEAT_8(F) ZREPEAT_7(F) F(7)
#define ZREPEAT_9(F) ZREPEAT_8(F) F(8)
#define ZREPEAT_10(F) ZREPEAT_9(F) F(9)
#define ZREPEAT_11(F) ZREPEAT_10(F) F(10)
#define ZREPEAT_12(F) ZREPEAT_11(F) F(11)
/* One row i of a 512-bit micro-kernel: its two accumulators (a panel pair), their start (zero, or y when a later K
   block continues the same FMA chain), the FMA chain's step over k (x[k] of row i, `X` the row block's x, times the
   pair's k row w0, w1) and the store. */
#define ZROW_DECL(i) __m512 a##i##0, a##i##1;
#define ZROW_ZERO(i) __m512 a##i##0 = _mm512_setzero_ps(), a##i##1 = _mm512_setzero_ps();
#define ZROW_INIT(i) if (init) { a##i##0 = _mm512_loadu_ps(y + i * ldy); a##i##1 = _mm512_loadu_ps(y + i * ldy + 16); } \
                     else { a##i##0 = _mm512_setzero_ps(); a##i##1 = _mm512_setzero_ps(); }
#define ZROW_FMA_(i, X) { const __m512 xb = _mm512_set1_ps(X[i * ldx + k]); a##i##0 = _mm512_fmadd_ps(xb, w0, a##i##0); \
                          a##i##1 = _mm512_fmadd_ps(xb, w1, a##i##1); }
#define ZROW_FMA_X(i) ZROW_FMA_(i, x)
#define ZROW_FMA_XK(i) ZROW_FMA_(i, xk)
#define ZROW_STORE(i) _mm512_storeu_ps(y + i * ldy, a##i##0); _mm512_storeu_ps(y + i * ldy + 16, a##i##1);
/* mkz_<r>_<type>: r rows of x against a panel pair of packed weights over k = 0..kc-1. With pf, every pf_every k it
   also prefetches the next k row of the next panel pair (pf_row onwards) towards the core. */
#define MKZ(r)                                                                                                      \
    static inline void SFX(mkz_##r)(const float* x, int64_t ldx, const SFX(WT)* w, int64_t panel, float* y,         \
                                    int64_t ldy, int kc, int init, const SFX(WT)* pf, int64_t pf_row, int pf_every) { \
        int pf_count = 0;                                                                                           \
        ZREPEAT_##r(ZROW_DECL)                                                                                      \
        ZREPEAT_##r(ZROW_INIT)                                                                                      \
        for (int k = 0; k < kc; k++) {                                                                              \
            if (pf && ++pf_count == pf_every) {                                                                     \
                pf_count = 0;                                                                                       \
                _mm_prefetch((const char*)(pf + pf_row * 16), _MM_HINT_T1);                                         \
                _mm_prefetch((const char*)(pf + panel + pf_row * 16), _MM_HINT_T1);                                 \
                pf_row++;                                                                                           \
            }                                                                                                       \
            const __m512 w0 = SFX(LOADZ)(w + k * 16), w1 = SFX(LOADZ)(w + panel + k * 16);                         \
            ZREPEAT_##r(ZROW_FMA_X)                                                                                 \
        }                                                                                                           \
        ZREPEAT_##r(ZROW_STORE)                                                                                     \
    }

#endif
