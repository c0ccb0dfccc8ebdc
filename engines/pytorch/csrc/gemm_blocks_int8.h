/* GGUF block panels against activations quantized to 8 bits: integer dot products, as llama.cpp computes.
   Included by gemm.c after gemm_blocks.h, whose panel layout, group_decode and run_decode it reads.

   Why: a decode step of the float32 kernels expands every weight to float32 and takes one FMA with it (gemm_blocks.h:
   a permute, a conversion and two FMAs for 16 weights), so on two cores a 1B model's decode is bound by that
   arithmetic, not by the weight stream. Here each row of x is quantized per 32-k group (the group of the block
   types: int8 xq = round(x / d), d = max|x| / 127, and d times the sums of xq over k 0-15 and 16-31), and every
   weight's integer q meets x's xq in vpdpbusd (4 k x 16 columns in one instruction; AVX-512 without VNNI:
   vpmaddubsw + vpmaddwd). Per 16-k half of a group, with the weight w = A q + B of its column (gemm_blocks.h):
       sum_k w_k x_k ~= A d sum_k q_k xq_k + B d sum_k xq_k = sum_k w_k (d xq_k)
   the integer sums exact, the rest float32: the product with x rounded to 8 bits, whose error is sum_k w_k (d xq_k -
   x_k). (The exact sum of x in the offset's term would leave sum_k A q_k (d xq_k - x_k) instead: up to twice as
   large, |A q| reaching twice |w| where B is a block's minimum; SmolLM2's logits moved 7% where llama.cpp's move 3%.)
   That is about a quarter of the instructions a weight, so the step is bound by the weight stream again. The price:
   x is rounded to 8 bits a value (at most half a step: max|x| / 254 of its group), as in llama.cpp, so results differ from the float32 kernels' in the third digit and greedy answers may differ
   from transformers'. Opt-in per model (pytorch.int8_activations); each row is quantized alone and summed in a fixed
   order, so a row's result does not depend on its batch.

   Needs the 4-k runs of gemm_blocks.h (AVX-512 with VBMI and GFNI); the types with an unsigned q (all but Q8_0 and
   the 16-bit ones, which stay on the float32 kernels), and MXFP4, whose signed table value v (-12..12) meets vpdpbusd
   as v + 12 with B = -12 d (w = d (v + 12) - 12 d; past d = 2^124, scales no real file has, -12 d overflows).
   Elsewhere BLOCK_INT8 is undefined and gemm.c runs the float32 kernels for every job. */
#ifndef SWITCHYARD_GEMM_BLOCKS_INT8_H
#define SWITCHYARD_GEMM_BLOCKS_INT8_H

#ifdef BLOCK_RUNS
#define BLOCK_INT8 1
#include <string.h>

/* x quantized for the int8 kernels: row m's xq at q + m K (int8), its scales at d + m K / 32 and its half-group sums
   d * sum(xq) at s + m K / 16. */
typedef struct { const int8_t* q; const float* d; const float* s; int K; } x8_rows;

static inline int i8_type(int t) { return (t != BT_Q8_0 && t <= BT_Q6_K) || t == BT_MXFP4; }

/* M rows of x (K a multiple of 32) into q, d, s as x8_rows lays them out. Rounds to nearest even (vcvtps2dq); a
   group of zeros gets d = 0. */
static void x8_quantize(const float* x, int64_t ldx, int M, int K, int8_t* q, float* d, float* s) {
    for (int m = 0; m < M; m++) {
        const float* xr = x + (int64_t)m * ldx;
        for (int g = 0; g < K / 32; g++) {
            const __m512 lo = _mm512_loadu_ps(xr + 32 * g), hi = _mm512_loadu_ps(xr + 32 * g + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
            const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            const __m512i ql = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));
            const __m512i qh = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
            int8_t* qg = q + (int64_t)m * K + 32 * g;
            _mm_storeu_si128((__m128i*)qg, _mm512_cvtsepi32_epi8(ql));  /* |x / d| <= 127: no clipping */
            _mm_storeu_si128((__m128i*)(qg + 16), _mm512_cvtsepi32_epi8(qh));
            const float dg = amax / 127.0f;
            d[(int64_t)m * (K / 32) + g] = dg;
            s[(int64_t)m * (K / 16) + 2 * g] = dg * (float)_mm512_reduce_add_epi32(ql);
            s[(int64_t)m * (K / 16) + 2 * g + 1] = dg * (float)_mm512_reduce_add_epi32(qh);
        }
    }
}

/* acc + the 4-byte dot products of unsigned u and signed s, lane by lane (u <= 63 and |s| <= 127: the 16-bit pair sums
   of vpmaddubsw cannot saturate). */
static inline __attribute__((always_inline)) __m512i dot4(__m512i acc, __m512i u, __m512i s) {
#ifdef __AVX512VNNI__
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}

/* vpermb indices: bytes 4 c .. 4 c + 3 (lane c) take bytes c, 16 + c, 32 + c, 48 + c of a decoded run: column c's q
   of the run's 4 k, side by side for vpdpbusd. */
static const uint8_t RUN_DOT_INDEX[64] __attribute__((aligned(64))) = {
#define DI(c) c, 16 + c, 32 + c, 48 + c
    DI(0), DI(1), DI(2), DI(3), DI(4), DI(5), DI(6), DI(7), DI(8), DI(9), DI(10), DI(11), DI(12), DI(13), DI(14), DI(15)
#undef DI
};

#define I8_ROWS 4  /* rows per kernel: 2 panels x 4 rows of float and integer accumulators, 16 of the 32 registers */
/* R rows of quantized x against a panel pair of type t over the whole of K (w1, one, pstride: as reg_kernel). */
static inline __attribute__((always_inline)) void i8_kernel(const int t, const int R, x8_rows x, const uint8_t* w0,
                                                            const uint8_t* w1, int one, int64_t pstride, float* y,
                                                            int64_t ldy) {
    const int K = x.K;
    const __m512i idx = _mm512_load_si512((const void*)RUN_DOT_INDEX);
    v16 acc[I8_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = v16_zero();
    for (int gi = 0; gi < K / 32; gi++) {
        if (BLOCK_PREFETCH) prefetch_group(t, w0, w1, one, pstride, gi + PREFETCH_AHEAD(t));
        group_view g0, g1;
        group_decode(t, w0, gi, &g0);
        group_decode(t, w1, gi, &g1);
        __m512i i0[I8_ROWS], i1[I8_ROWS];
#define I8_RUN(c, h) {                                                                                              \
        run_view r0, r1;                                                                                            \
        run_decode(t, &g0, c, h, &r0);                                                                              \
        run_decode(t, &g1, c, h, &r1);                                                                              \
        if (t == BT_MXFP4) {  /* v + 12: unsigned for vpdpbusd, and B = -12 A (I8_FOLD) */                          \
            r0 = _mm512_add_epi8(r0, _mm512_set1_epi8(12));                                                         \
            r1 = _mm512_add_epi8(r1, _mm512_set1_epi8(12));                                                         \
        }                                                                                                           \
        r0 = _mm512_permutexvar_epi8(idx, r0);                                                                      \
        r1 = _mm512_permutexvar_epi8(idx, r1);                                                                      \
        for (int r = 0; r < R; r++) {                                                                               \
            int32_t four;                                                                                           \
            memcpy(&four, x.q + (int64_t)r * K + 32 * gi + 8 * c + 4 * h, 4);                                      \
            const __m512i xb = _mm512_set1_epi32(four);                                                             \
            i0[r] = dot4(i0[r], r0, xb);                                                                            \
            i1[r] = dot4(i1[r], r1, xb);                                                                            \
        }                                                                                                           \
    }
/* the half's integer sums into the float accumulators: A d sum(q xq) + B d sum(xq), A and B of k 0-15 (a0, b0) or
   16-31 (a1, b1) */
#define I8_FOLD(half, A, B) {                                                                                      \
        const v16 o0 = t == BT_MXFP4 ? v16_mul(g0.A, v16_set1(-12.0f)) : g0.B;                                     \
        const v16 o1 = t == BT_MXFP4 ? v16_mul(g1.A, v16_set1(-12.0f)) : g1.B;                                     \
        for (int r = 0; r < R; r++) {                                                                               \
            const v16 d = v16_set1(x.d[(int64_t)r * (K / 32) + gi]);                                               \
            const v16 s = v16_set1(x.s[(int64_t)r * (K / 16) + 2 * gi + half]);                                    \
            acc[r][0] = v16_fma(v16_mul(g0.A, d), _mm512_cvtepi32_ps(i0[r]), acc[r][0]);                           \
            acc[r][0] = v16_fma(o0, s, acc[r][0]);                                                                 \
            acc[r][1] = v16_fma(v16_mul(g1.A, d), _mm512_cvtepi32_ps(i1[r]), acc[r][1]);                           \
            acc[r][1] = v16_fma(o1, s, acc[r][1]);                                                                 \
        }                                                                                                           \
    }
        for (int r = 0; r < R; r++) i0[r] = i1[r] = _mm512_setzero_si512();
        I8_RUN(0, 0) I8_RUN(0, 1) I8_RUN(1, 0) I8_RUN(1, 1)  /* k 0..15 */
        I8_FOLD(0, a0, b0)
        for (int r = 0; r < R; r++) i0[r] = i1[r] = _mm512_setzero_si512();
        I8_RUN(2, 0) I8_RUN(2, 1) I8_RUN(3, 0) I8_RUN(3, 1)  /* k 16..31 */
        I8_FOLD(1, a1, b1)
#undef I8_FOLD
#undef I8_RUN
    }
    for (int r = 0; r < R; r++) {
        v16_store(y + r * ldy, acc[r][0]);
        if (!one) v16_store(y + r * ldy + 16, acc[r][1]);
    }
}
/* The int8 kernel of type t for R rows over NB panels (pairs; a last odd panel as a pair with itself). */
static inline __attribute__((always_inline)) void i8_rows_t(const int t, const int R, x8_rows x, const uint8_t* wq,
                                                            int64_t pstride, float* y, int64_t ldy, int NB) {
    for (int gi = 0; gi < PREFETCH_AHEAD(t); gi++)  /* the first pair's first groups */
        prefetch_group(t, wq, wq + pstride, NB == 1, pstride, gi);
    for (int nb = 0; nb < NB; nb += 2) {
        const int one = nb + 1 == NB;
        i8_kernel(t, R, x, wq + nb * pstride, wq + (nb + !one) * pstride, one, pstride, y + nb * 16, ldy);
    }
}
static void i8_rows(int t, int r, x8_rows x, const uint8_t* wq, int64_t pstride, float* y, int64_t ldy, int NB) {
#define I8_CASE(T, R) case T: i8_rows_t(T, R, x, wq, pstride, y, ldy, NB); break;
#define I8_TYPES(R) switch (t) { I8_CASE(BT_Q4_0, R) I8_CASE(BT_Q4_1, R) I8_CASE(BT_Q5_0, R) I8_CASE(BT_Q5_1, R)  \
                                 I8_CASE(BT_Q4_K, R) I8_CASE(BT_Q5_K, R) I8_CASE(BT_Q6_K, R) I8_CASE(BT_MXFP4, R) }
    if (r == 1) I8_TYPES(1)
    else if (r == 2) I8_TYPES(2)
    else if (r == 3) I8_TYPES(3)
    else I8_TYPES(4)
#undef I8_TYPES
#undef I8_CASE
}
/* y[M, NB * 16] = x[M, K] @ W.T for W as NB panels of an i8_type t, x quantized (x8_rows of these M rows), in row
   blocks of I8_ROWS (each block decodes the weights again; the integer products dominate from a few rows on). */
static void gemm_core_blocks_i8(int t, x8_rows x, const uint8_t* wq, int64_t pstride, float* y, int64_t ldy, int M,
                                int NB) {
    for (int m = 0, r; m < M; m += r) {
        r = M - m < I8_ROWS ? M - m : I8_ROWS;
        const x8_rows xr = {x.q + (int64_t)m * x.K, x.d + (int64_t)m * (x.K / 32), x.s + (int64_t)m * (x.K / 16), x.K};
        i8_rows(t, r, xr, wq, pstride, y + m * ldy, ldy, NB);
    }
}
#endif
#endif
