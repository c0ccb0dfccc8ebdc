/* Projections of the native engine (engines/pytorch/linear.py): the packed float32 / bfloat16 GEMM, its variants
   on GGUF blocks (gemm_blocks.h; float16 / bfloat16 panels of float32 models) and AMX, the fused gate-up-SiLU job,
   and the dense layers' elementwise kernels (RMSNorm, SiLU-and-multiply; for Gemma-like layers RMSNorm with the
   residual add, per-head RMSNorm, GELU-tanh-and-multiply and the logit soft-cap; for Granite the scaled residual add
   and the logits' division), with their `*_par` entry points on the helper-thread pool. Built by native.py. */
#include "gemm_common.h"
#include "type_suffix.h"

#define TYPE_SUFFIX f32
#include "gemm_panels.h"
#undef TYPE_SUFFIX
#define TYPE_SUFFIX bf16w
#include "gemm_panels.h"
#undef TYPE_SUFFIX
#define TYPE_SUFFIX f16w
#include "gemm_panels.h"
#undef TYPE_SUFFIX
#include "gemm_blocks.h"
#include "gemm_blocks_int8.h"
#include "gemm_grouped.h"
/* y += bias, then y += residual, each rounded once: what `F.linear` and a following `+` compute. */
static void epilogue_f32(const float* bias, const float* residual, int64_t ldr, float* y, int64_t ldy, int M, int NB) {
    if (bias || residual)
        for (int m = 0; m < M; m++) {
            float* ym = y + m * ldy;
            if (bias) for (int n = 0; n < NB * 16; n++) ym[n] = ym[n] + bias[n];
            if (residual) {
                const float* r = residual + m * ldr;
                for (int n = 0; n < NB * 16; n++) ym[n] = ym[n] + r[n];
            }
        }
}

/* y[M, NB * 16] = x[M, K] @ W.T (+ bias) (+ residual); W packed as [NB, K, 16] (zero padded columns).
   x, residual and y rows are ldx, ldr and ldy floats apart. bias (NB * 16 floats) and residual may be NULL.
   The epilogue adds bias, then residual, each rounded once: what `F.linear` and a following `+` compute. */
void gemm_f32(const float* x, int64_t ldx, const float* wp, const float* bias, const float* residual, int64_t ldr,
              float* y, int64_t ldy, int M, int NB, int K) {
    gemm_core_f32(x, ldx, wp, y, ldy, M, NB, K);
    epilogue_f32(bias, residual, ldr, y, ldy, M, NB);
}

/* The bfloat16 version: x is given as float32 (converted exactly by the caller), W packed as [NB, K, 16]
   bfloat16; sums in float32 into acc (M x NB * 16 floats, ldy apart), then y = bf16(acc + bias) and, with a
   residual, y = bf16(residual + y): one rounding per op, as torch's bfloat16 addmm and `+` do. */
void gemm_bf16w(const float* x, int64_t ldx, const uint16_t* wp, const uint16_t* bias, const uint16_t* residual,
                int64_t ldr, float* acc, uint16_t* y, int64_t ldy, int M, int NB, int K) {
    gemm_core_bf16w(x, ldx, wp, acc, ldy, M, NB, K);
    for (int m = 0; m < M; m++) {
        const float* am = acc + m * ldy;
        uint16_t* ym = y + m * ldy;
        for (int n = 0; n < NB * 16; n++) {
            uint16_t v = f32_to_bf16(bias ? am[n] + bf16_to_f32(bias[n]) : am[n]);
            if (residual) v = f32_to_bf16(bf16_to_f32(residual[m * ldr + n]) + bf16_to_f32(v));
            ym[n] = v;
        }
    }
}

/* ---- elementwise helpers of the dense layers (float32) ---- */

#include "simd_exp.h"
EXP8_AVX2
TANH8_AVX2

/* Rows of an elementwise kernel: all of them, or (next != NULL) chunks of ROW_CHUNK taken from the atomic counter
   *next, so helper threads can share a large step. Loops `for (int m0, m1; next_rows(...);) for (m = m0; m < m1...`. */
#define ROW_CHUNK 32
static inline int next_rows(int* next, int M, int* m0, int* m1, int* done) {
    if (!next) { if (*done) return 0; *done = 1; *m0 = 0; *m1 = M; return 1; }
    *m0 = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED) * ROW_CHUNK;
    *m1 = *m0 + ROW_CHUNK < M ? *m0 + ROW_CHUNK : M;
    return *m0 < M;
}

/* y = silu(g) * u over n floats, silu(g) = g / (1 + exp(-g)) as torch computes it (each op rounded). */
static inline void silu_mul_row(const float* g, const float* u, float* y, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, gv))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) {
        float t[8] = {0}, o[8];
        t[0] = -g[i];
        _mm256_storeu_ps(o, exp8(_mm256_loadu_ps(t)));
        y[i] = (g[i] / (1.0f + o[0])) * u[i];
    }
}

/* bfloat16 SiLU-and-multiply as transformers gets it from torch: silu(g) = g / (1 + exp(-g)) in float32 with torch's
   vectorized exp_u20 (its AVX-512 algorithm: a degree-5 polynomial after range reduction, 2^n applied as 2^(n-1) * 2),
   rounded to bfloat16, then times u, rounded again. torch runs its vector loop 64 elements at a time and the rest
   through the scalar op, with libm's expf: so do we. Checked bit for bit in tests/engines/pytorch/test_dense_ops.py. */
#ifdef __AVX512F__
static inline __m512 exp_u20_16(__m512 x) {
    const __m512 lo = _mm512_castsi512_ps(_mm512_set1_epi32(0xc2aeac50));  /* log(FLT_MIN) */
    const __m512 hi = _mm512_castsi512_ps(_mm512_set1_epi32(0x42b17218));  /* log(FLT_MAX) */
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OS);
    const __m512 s = _mm512_max_ps(_mm512_min_ps(x, hi), lo);
    __m512 n = _mm512_fmadd_ps(s, _mm512_castsi512_ps(_mm512_set1_epi32(0x3fb8aa3b)), _mm512_set1_ps(0.5f));
    n = _mm512_cvtepi32_ps(_mm512_cvt_roundps_epi32(n, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
    const __m512 r = _mm512_fnmadd_ps(n, _mm512_castsi512_ps(_mm512_set1_epi32(0x3f317218)), s);  /* s - n ln 2 */
    __m512 p = _mm512_fmadd_ps(r, _mm512_set1_ps(0.00828929059f), _mm512_set1_ps(0.0418978221f));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.166676521f));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.499991506f));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.999999701f));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_cvtps_epi32(_mm512_sub_ps(n, _mm512_set1_ps(1.0f)));
    const __m512 half_scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, _mm512_mask_blend_ps(under, half_scale, _mm512_setzero_ps())),
                         _mm512_set1_ps(2.0f));
}
static inline __m512 bf16_round16(__m512 v) {  /* to the nearest bfloat16, as a float32 (NaN stays NaN) */
    const __m512i u = _mm512_castps_si512(v);
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                       _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    const __m512i t = _mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_blend_ps(nan, _mm512_castsi512_ps(t), v);
}
#endif
static inline void silu_mul_bf16_row(const uint16_t* g, const uint16_t* u, uint16_t* y, int n) {
    int i = 0;
#ifdef __AVX512F__
    for (; i < n / 64 * 64; i += 16) {
        const __m512 gv = widen_bf16(_mm256_loadu_si256((const __m256i*)(g + i)));
        const __m512 sv = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f),
                                                          exp_u20_16(_mm512_xor_ps(gv, _mm512_set1_ps(-0.0f)))));
        const __m512 out = bf16_round16(_mm512_mul_ps(bf16_round16(sv),
                                                      widen_bf16(_mm256_loadu_si256((const __m256i*)(u + i)))));
        _mm256_storeu_si256((__m256i*)(y + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(out), 16)));
    }
#endif
    for (; i < n; i++) {
        const float gf = bf16_to_f32(g[i]);
        y[i] = f32_to_bf16(bf16_to_f32(f32_to_bf16(gf / (1.0f + expf(-gf)))) * bf16_to_f32(u[i]));
    }
}
/* Whether silu_mul_bf16 gives torch's bits here: its vector loop needs AVX-512 (with AVX2 torch's exp_u20 is
   another function, which we do not reproduce). */
int exact_silu_bf16(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}
void silu_mul_bf16(const uint16_t* gu, int64_t ldg, uint16_t* y, int64_t ldy, int M, int I, int* next) {
    for (int m0, m1, done = 0; next_rows(next, M, &m0, &m1, &done);)
        for (int m = m0; m < m1; m++) silu_mul_bf16_row(gu + m * ldg, gu + m * ldg + I, y + m * ldy, I);
}

/* y = silu(gu[:, :I]) * gu[:, I:]. */
void silu_mul_f32(const float* gu, int64_t ldg, float* y, int64_t ldy, int M, int I, int* next) {
    for (int m0, m1, done = 0; next_rows(next, M, &m0, &m1, &done);)
        for (int m = m0; m < m1; m++) silu_mul_row(gu + m * ldg, gu + m * ldg + I, y + m * ldy, I);
}

/* The sum of x[0..H) squared in torch's order for a float32 row (SumKernel's cascade sum, which transformers'
   RMSNorm mean runs): 8-float vectors, 4 interleaved accumulators flushed up a level every 16 steps of 4 vectors,
   then the vectors left over, the 4 accumulators, the scalar tail and the 8 lanes in turn. Checked bit for bit
   against torch in tests/engines/pytorch/test_dense_ops.py. x: H floats, or (bf16) H bfloat16 read as float32. */
static inline __m256 load8(const void* x, int64_t i, int bf16) {
    if (!bf16) return _mm256_loadu_ps((const float*)x + i);
    const __m128i h = _mm_loadu_si128((const __m128i*)((const uint16_t*)x + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static float torch_sum_squares(const void* x, int H, int bf16) {
    const int64_t nv = H / 8, rows = nv / 4;
    const int log2 = rows <= 2 ? 1 : 64 - __builtin_clzll((unsigned long long)rows - 1);
    const int power = log2 / 4 > 4 ? log2 / 4 : 4;
    const int64_t step = (int64_t)1 << power, mask = step - 1;
    __m256 acc[4][4];
    for (int l = 0; l < 4; l++) for (int k = 0; k < 4; k++) acc[l][k] = _mm256_setzero_ps();
#define SQ(v) _mm256_mul_ps(load8(x, (v) * 8, bf16), load8(x, (v) * 8, bf16))
    int64_t i = 0;
    while (i + step <= rows) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < 4; k++) acc[0][k] = _mm256_add_ps(acc[0][k], SQ(i * 4 + k));
        for (int l = 1; l < 4; l++) {
            for (int k = 0; k < 4; k++) {
                acc[l][k] = _mm256_add_ps(acc[l][k], acc[l - 1][k]);
                acc[l - 1][k] = _mm256_setzero_ps();
            }
            if (i & (mask << (l * power))) break;
        }
    }
    for (; i < rows; i++)
        for (int k = 0; k < 4; k++) acc[0][k] = _mm256_add_ps(acc[0][k], SQ(i * 4 + k));
    for (int l = 1; l < 4; l++) for (int k = 0; k < 4; k++) acc[0][k] = _mm256_add_ps(acc[0][k], acc[l][k]);
    __m256 p = acc[0][0];
    for (int64_t v = rows * 4; v < nv; v++) p = _mm256_add_ps(p, SQ(v));
    for (int k = 1; k < 4; k++) p = _mm256_add_ps(p, acc[0][k]);
#undef SQ
    float s = 0.0f, lanes[8];
    for (int64_t t = nv * 8; t < H; t++) {
        const float v = bf16 ? bf16_to_f32(((const uint16_t*)x)[t]) : ((const float*)x)[t];
        s += v * v;
    }
    _mm256_storeu_ps(lanes, p);
    for (int l = 0; l < 8; l++) s += lanes[l];
    return s;
}

/* y = w * (x * (1 / sqrt(mean(x * x) + eps))): transformers' float32 RMSNorm, bit for bit. */
void rms_norm_f32(const float* x, int64_t ldx, const float* w, float eps, float* y, int64_t ldy, int M, int H,
                  int* next) {
    for (int m0, m1, done = 0; next_rows(next, M, &m0, &m1, &done);)
    for (int m = m0; m < m1; m++) {
        const float* xm = x + m * ldx;
        float* ym = y + m * ldy;
        const float r = 1.0f / sqrtf(torch_sum_squares(xm, H, 0) / (float)H + eps);
        for (int i = 0; i < H; i++) ym[i] = w[i] * (xm[i] * r);
    }
}

/* The same for bfloat16 x, w and y, as transformers computes it: x in float32, its normalized value rounded to
   bfloat16, then times w (rounded again). */
void rms_norm_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, float eps, uint16_t* y, int64_t ldy, int M,
                   int H, int* next) {
    for (int m0, m1, done = 0; next_rows(next, M, &m0, &m1, &done);)
    for (int m = m0; m < m1; m++) {
        const uint16_t* xm = x + m * ldx;
        uint16_t* ym = y + m * ldy;
        const float r = 1.0f / sqrtf(torch_sum_squares(xm, H, 1) / (float)H + eps);
        for (int i = 0; i < H; i++)
            ym[i] = f32_to_bf16(bf16_to_f32(w[i]) * bf16_to_f32(f32_to_bf16(bf16_to_f32(xm[i]) * r)));
    }
}

/* y = r + w * (x * (1 / sqrt(mean(x * x) + eps))): a block's output norm and the residual add after it (Gemma 2 and
   3's sandwich norms, OLMo 2's), each op rounded as transformers' norm and the following `+` round it. */
void rms_norm_add_f32(const float* x, int64_t ldx, const float* w, float eps, const float* r, int64_t ldr, float* y,
                      int64_t ldy, int M, int H, int* next) {
    for (int m0, m1, done = 0; next_rows(next, M, &m0, &m1, &done);)
    for (int m = m0; m < m1; m++) {
        const float* xm = x + m * ldx;
        const float* rm = r + m * ldr;
        float* ym = y + m * ldy;
        const float s = 1.0f / sqrtf(torch_sum_squares(xm, H, 0) / (float)H + eps);
        for (int i = 0; i < H; i++) ym[i] = rm[i] + w[i] * (xm[i] * s);
    }
}

/* rms_norm_f32 of every head of every row: x [M][heads][D] with rows ldx apart and heads D apart (q or k, a view of
   the fused qkv projection's output), y likewise with rows ldy apart. Qwen3 and Gemma 3's per-head q/k norms. */
void rms_norm_heads_f32(const float* x, int64_t ldx, const float* w, float eps, float* y, int64_t ldy, int M,
                        int heads, int D, int* next) {
    for (int m0, m1, done = 0; next_rows(next, M * heads, &m0, &m1, &done);)
    for (int m = m0; m < m1; m++) {
        const float* xm = x + (int64_t)(m / heads) * ldx + (int64_t)(m % heads) * D;
        float* ym = y + (int64_t)(m / heads) * ldy + (int64_t)(m % heads) * D;
        const float s = 1.0f / sqrtf(torch_sum_squares(xm, D, 0) / (float)D + eps);
        for (int i = 0; i < D; i++) ym[i] = w[i] * (xm[i] * s);
    }
}

/* x = tanh(x / cap) * cap in place, over N floats of M rows ldx apart: transformers' `final_logit_softcapping`
   (Gemma 2's logits), each op rounded as its three torch ops round them. */
static inline __m256 softcap8(__m256 v, float cap) {
    const __m256 c = _mm256_set1_ps(cap);
    return _mm256_mul_ps(tanh8(_mm256_div_ps(v, c)), c);
}
void softcap_f32(float* x, int64_t ldx, float cap, int M, int N, int* next) {
    for (int m0, m1, done = 0; next_rows(next, M, &m0, &m1, &done);)
    for (int m = m0; m < m1; m++) {
        float* xm = x + m * ldx;
        int i = 0;
        for (; i + 8 <= N; i += 8) _mm256_storeu_ps(xm + i, softcap8(_mm256_loadu_ps(xm + i), cap));
        if (i < N) {  /* the tail through a padded vector: every element gets the same value wherever it is */
            float t[8] = {0};
            for (int k = i; k < N; k++) t[k - i] = xm[k];
            _mm256_storeu_ps(t, softcap8(_mm256_loadu_ps(t), cap));
            for (int k = i; k < N; k++) xm[k] = t[k - i];
        }
    }
}

/* y = gelu_tanh(g) * u with gelu_tanh(g) = 0.5 * g * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 * g^3))) in torch's
   order of ops (its `gelu(approximate="tanh")`; GELU-tanh gated MLPs: Gemma). tanh is tanh8's, within a few ulp. */
static inline __m256 gelu_tanh_mul8(__m256 g, __m256 u) {
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 inner = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                                       _mm256_add_ps(g, _mm256_mul_ps(_mm256_set1_ps(0.044715f), cube)));
    const __m256 gelu = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), g),
                                      _mm256_add_ps(_mm256_set1_ps(1.0f), tanh8(inner)));
    return _mm256_mul_ps(gelu, u);
}
void gelu_tanh_mul_f32(const float* gu, int64_t ldg, float* y, int64_t ldy, int M, int I, int* next) {
    for (int m0, m1, done = 0; next_rows(next, M, &m0, &m1, &done);)
    for (int m = m0; m < m1; m++) {
        const float *g = gu + m * ldg, *u = g + I;
        float* ym = y + m * ldy;
        int i = 0;
        for (; i + 8 <= I; i += 8)
            _mm256_storeu_ps(ym + i, gelu_tanh_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
        if (i < I) {  /* the tail through padded vectors, as softcap_f32's */
            float tg[8] = {0}, tu[8] = {0};
            for (int k = i; k < I; k++) tg[k - i] = g[k], tu[k - i] = u[k];
            _mm256_storeu_ps(tg, gelu_tanh_mul8(_mm256_loadu_ps(tg), _mm256_loadu_ps(tu)));
            for (int k = i; k < I; k++) ym[k] = tg[k - i];
        }
    }
}

/* y = r + x * s: a block's output times a multiplier, then the residual add (Granite's `residual_multiplier`), the
   product rounded first, as transformers' `residual + out * multiplier`. Plain C: whichever vectors the compiler
   picks (AVX-512, AVX2, SSE), each op rounds as one float32 op, so every build gives torch's bits. */
void scale_add_f32(const float* x, int64_t ldx, float s, const float* r, int64_t ldr, float* y, int64_t ldy, int M,
                   int N, int* next) {
    for (int m0, m1, done = 0; next_rows(next, M, &m0, &m1, &done);)
    for (int m = m0; m < m1; m++) {
        const float *xm = x + m * ldx, *rm = r + m * ldr;
        float* ym = y + m * ldy;
        for (int i = 0; i < N; i++) ym[i] = rm[i] + xm[i] * s;
    }
}

/* x = x / d in place (Granite's `logits_scaling`): a true division, as torch's `logits / scaling` (not times 1 / d,
   which rounds differently where d is not a power of two). Plain C, the same bits on every build. */
void div_f32(float* x, int64_t ldx, float d, int M, int N, int* next) {
    for (int m0, m1, done = 0; next_rows(next, M, &m0, &m1, &done);)
    for (int m = m0; m < m1; m++) {
        float* xm = x + m * ldx;
        for (int i = 0; i < N; i++) xm[i] = xm[i] / d;
    }
}

/* ---- the same on the helper-thread pool (native.py): one job, the work handed out by a counter in it ---- */

#include "pool_client.h"

/* gemm_f32 or gemm_bf16w shared by several threads: each takes tiles of `chunk` column panels x `mchunk` rows
   from a counter until none are left, so a thread that gets less CPU simply does fewer tiles. Every output element is
   computed exactly as by one call over the whole matrix (the same FMA chain over k). Tiles run row-block fastest,
   so the two threads tend to work on one panel chunk at a time. With y16 (bfloat16 weights), y is the float32
   accumulator, ldy apart too. */
typedef struct {
    const float* x; const void *wp, *bias, *residual; float* y; uint16_t* y16; int64_t ldx, ldr, ldy;
    int M, NB, K, chunk, mchunk, next;
    int amx;  /* 1: runs of quantized panels go through the tile unit (tile_prepare); 2: through the int8 kernels
                 (x quantized by tile_prepare; gemm_blocks_int8.h); 3: bfloat16 wp (tiles) */
    const int* segs; const int64_t* seg_ptr; int nseg;  /* GGUF blocks in place of wp: nseg runs of panels, run s ending at
                                                            panel segs[2s] (exclusive), of type segs[2s + 1] (BT_*),
                                                            its panels at address seg_ptr[s] */
    const uint16_t* xa; const float* xs;  /* x split for the tile unit (tile_prepare); amx 3: x itself */
    const int8_t* x8q; const float *x8d, *x8s;  /* amx 2: x quantized (tile_prepare; gemm_blocks_int8.h's x8_rows) */
    int failed;  /* set when a thread could not allocate its scratch */
} gemm_job;

static inline int tile_count(const gemm_job* j) {
    return (j->NB + j->chunk - 1) / j->chunk * ((j->M + j->mchunk - 1) / j->mchunk);
}
/* Tile t of the job: panels n0..n0+nb-1, rows m0..m0+mc-1 (row blocks fastest). */
static inline void tile_at(const gemm_job* j, int t, int* n0, int* m0, int* nb, int* mc) {
    const int row_tiles = (j->M + j->mchunk - 1) / j->mchunk;
    *n0 = t / row_tiles * j->chunk;
    *m0 = t % row_tiles * j->mchunk;
    *nb = j->NB - *n0 < j->chunk ? j->NB - *n0 : j->chunk;
    *mc = j->M - *m0 < j->mchunk ? j->M - *m0 : j->mchunk;
}
/* The next tile from the job's counter (tile_at). 0: none left. */
static inline int next_tile(gemm_job* j, int* n0, int* m0, int* nb, int* mc) {
    const int t = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
    if (t >= tile_count(j)) return 0;
    tile_at(j, t, n0, m0, nb, mc);
    return 1;
}

/* ---- AMX (CPUs with AMX-BF16): GGUF panels on the tile unit, for prompt rows and large decode steps ----
   The same panels as the register kernels (gemm_blocks.h), every quantized type. x is split once per call into
   three bfloat16 parts whose sum is x exactly (8 + 8 + 8 significant bits), and q (0..31, Q6_K's q - 32, -128..127,
   or MXFP4's table value, -12..12) is exact in bfloat16, so every product in the tile unit is exact and only float32
   sums round: per 32-k group C = sum_k x_k q_k (three tile products, one per part), then y = b * sum_k x_k + (a * C
   + y) with the group's scale a and offset b as the register kernels form them (group_decode; Q8_0, MXFP4 and Q6_K:
   no offset; Q6_K's 16-k halves, which have scales of their own, are two such products, each with the other half's q
   zero). The result is float32-accurate (closer to the float64 product than the FMA kernel's,
   tests/engines/pytorch/test_linear.py) but not the FMA kernel's bits; a row's bits depend only on that row and the
   weight, at any number of rows the caller sends here. Each group's q are expanded per call into the tile unit's
   layout for B ([16 k pairs][16 columns][2] bfloat16). */
#if defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <sys/syscall.h>
#include <unistd.h>
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } amx_tilecfg;
/* A thread's scratch of at least `need` bytes (64-byte aligned), grown and kept between calls; NULL: out of memory. */
typedef struct { void* p; size_t capacity; } amx_scratch;
static void* amx_reserve(amx_scratch* s, size_t need) {
    if (need > s->capacity) {
        free(s->p);
        s->p = aligned_alloc(64, need);
        s->capacity = s->p ? need : 0;
    }
    return s->p;
}
/* Tiles 0-2: x's parts (rows x 32 bfloat16), 4-5: C (rows x 16 float32), 6-7: q (16 k pairs x 16 columns). */
static void amx_configure(int rows) {
    amx_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) { c.colsb[t] = 64; c.rows[t] = t >= 6 ? 16 : rows; }
    _tile_loadconfig(&c);
}
/* Up to 16 rows of x as one row tile: per 32-k block the three parts (xa: [KB][3][16][32], rows past `rows`
   zero) and the block's sums (xs: [KB][16]). */
static void amx_split_rows(const float* x, int64_t ldx, int rows, int K, uint16_t* xa, float* xs) {
    for (int kb = 0; kb < K / 32; kb++) {
        uint16_t* a = xa + (int64_t)kb * 1536;
        for (int r = 0; r < 16; r++) {
            if (r >= rows) {
                for (int part = 0; part < 3; part++) memset(a + part * 512 + r * 32, 0, 64);
                xs[kb * 16 + r] = 0.0f;
                continue;
            }
            __m512 v0 = _mm512_loadu_ps(x + r * ldx + kb * 32), v1 = _mm512_loadu_ps(x + r * ldx + kb * 32 + 16);
            xs[kb * 16 + r] = _mm512_reduce_add_ps(_mm512_add_ps(v0, v1));
            for (int part = 0; part < 3; part++) {  /* the part, then what it left over (exact in float32) */
                const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
                _mm512_storeu_si512(a + part * 512 + r * 32, h);
                v0 = _mm512_sub_ps(v0, widen_bf16(_mm512_castsi512_si256(h)));
                v1 = _mm512_sub_ps(v1, widen_bf16(_mm512_extracti64x4_epi64(h, 1)));
            }
        }
    }
}
typedef struct { const float* x; int64_t ldx; uint16_t* xa; float* xs; int M, K, next; } amx_split_job;
static void amx_split_task(void* p) {
    amx_split_job* j = (amx_split_job*)p;
    const int kb = j->K / 32;
    for (int rt; (rt = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) * 16 < j->M;)
        amx_split_rows(j->x + rt * 16 * j->ldx, j->ldx, j->M - rt * 16 < 16 ? j->M - rt * 16 : 16, j->K,
                       j->xa + (int64_t)rt * kb * 1536, j->xs + (int64_t)rt * kb * 16);
}
/* True for the panel types the tile unit reads: every quantized one. */
static inline int amx_type(int t) { return t <= BT_Q6_K || t == BT_MXFP4; }
/* Expanded q of a 32-k group, in bfloat16 elements: the B tile's 16 k-pair rows; Q6_K's two 16-k halves have scales
   of their own, so its rows are stored as [k 0..15][8 zero rows][k 16..31], and the tiles loaded at row 0 and row 8
   each hold one half (amx_expand_group). */
static inline int amx_group_elems(int t) { return t == BT_Q6_K ? 768 : 512; }
/* The high bits of q (bits 4 and up: `bits` of them, 1 for the Q5 types, 2 for Q6_K) for k rows k and k + 1 (k even)
   of a group, interleaved by column as the B tile wants them: packed with k = 4 bits i + j at bits `bits` i of byte
   16 j + column (block_panels._high_bits), and k, k + 1 share i. 16-bit shifts: after the mask, each byte's bits
   came from its own byte. */
static inline __m256i amx_high_pair(const uint8_t* high, int k, int bits) {
    const int per = 4 * bits;
    const __m128i a = _mm_loadu_si128((const __m128i*)(high + 16 * (k % per)));
    const __m128i b = _mm_loadu_si128((const __m128i*)(high + 16 * (k % per + 1)));
    const __m256i pairs = _mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b));
    const int s = 4 - bits * (k / per);
    const __m256i moved = s > 0 ? _mm256_slli_epi16(pairs, s) : s < 0 ? _mm256_srli_epi16(pairs, -s) : pairs;
    return _mm256_and_si256(moved, _mm256_set1_epi8((char)(((1 << bits) - 1) << 4)));
}
/* One 32-k group's q (v: gemm_blocks.h's group_decode of it) as the B tile, bfloat16 (exact): k rows 2r and 2r + 1
   interleaved column by column; 4- and 5-bit q by table (the low nibbles are k 0..15, the high ones k 16..31; MXFP4's
   table holds its values), Q6_K's as q - 32 by a 64-entry table (amx_group_elems' layout), Q8_0's int8 by float. */
static inline void amx_expand_group(int t, const group_view* v, uint16_t* b) {
    if (t == BT_Q8_0) {
        for (int r = 0; r < 16; r++) {
            const __m128i k0 = load16(v->q8 + 32 * r), k1 = load16(v->q8 + 32 * r + 16);
            const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi8(k0, k1)));
            const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpackhi_epi8(k0, k1)));
            _mm512_store_si512(b + 32 * r, (__m512i)_mm512_cvtne2ps_pbh(f1, f0));
        }
        return;
    }
    const int six = t == BT_Q6_K;
    const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512 first = _mm512_set1_ps(six ? -32.0f : 0.0f);  /* table entry i: the bfloat16 of first + i */
    const __m512 mx = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(mxfp4_table()));  /* MXFP4: entries 0..15 its values */
    const __m512i bf16_lo = t == BT_MXFP4 ? (__m512i)_mm512_cvtne2ps_pbh(mx, mx)
                          : (__m512i)_mm512_cvtne2ps_pbh(_mm512_add_ps(iota, _mm512_add_ps(first, _mm512_set1_ps(16))),
                                                         _mm512_add_ps(iota, first));
    const __m512i bf16_hi = (__m512i)_mm512_cvtne2ps_pbh(_mm512_add_ps(iota, _mm512_add_ps(first, _mm512_set1_ps(48))),
                                                         _mm512_add_ps(iota, _mm512_add_ps(first, _mm512_set1_ps(32))));
    const __m256i low4 = _mm256_set1_epi8(15);
    uint16_t* const upper = b + (six ? 32 * 16 : 32 * 8);  /* k 16..31's rows (Q6_K: after 8 zero rows) */
    if (six) memset(b + 32 * 8, 0, 8 * 64);
    for (int r = 0; r < 8; r++) {
        const __m128i k0 = load16(v->nib + 32 * r), k1 = load16(v->nib + 32 * r + 16);
        const __m256i pairs = _mm256_set_m128i(_mm_unpackhi_epi8(k0, k1), _mm_unpacklo_epi8(k0, k1));
        __m256i lo = _mm256_and_si256(pairs, low4), hi = _mm256_and_si256(_mm256_srli_epi16(pairs, 4), low4);
        if (v->high) {
            lo = _mm256_or_si256(lo, amx_high_pair(v->high, 2 * r, six ? 2 : 1));
            hi = _mm256_or_si256(hi, amx_high_pair(v->high, 2 * r + 16, six ? 2 : 1));
        }
        _mm512_store_si512(b + 32 * r, _mm512_permutex2var_epi16(bf16_lo, _mm512_cvtepu8_epi16(lo), bf16_hi));
        _mm512_store_si512(upper + 32 * r, _mm512_permutex2var_epi16(bf16_lo, _mm512_cvtepu8_epi16(hi), bf16_hi));
    }
}
/* C (tile c) = the row tile's parts (tiles 0-2) times q (tile b), stored to cb. */
#define AMX_PRODUCT(c, b, cb) do { _tile_zero(c); _tile_dpbf16ps(c, 0, b); _tile_dpbf16ps(c, 1, b); \
    _tile_dpbf16ps(c, 2, b); _tile_stored(c, cb, 64); } while (0)
/* y (rows x 16) = b0 * xs + (a0 * C + y) for one panel's C (16 x 16, 16 floats apart) of 32-k group kb, with the
   group's scale a0 and offset b0 (group_decode: d, m or -8 d, -16 d; the K types' d * sc, -dmin * min; Q8_0 and
   MXFP4 none). Q6_K, half h of the group: y = a_h * C + y (its q were expanded as q - 32: no offset). */
static inline void amx_fold(const float* c, const float* s, int t, const uint8_t* panel, float* y, int64_t ldy,
                            int rows, int kb, int h) {
    group_view v;
    group_decode(t, panel, kb, &v);
    const __m512 a = h ? v.a1 : v.a0;
    for (int r = 0; r < rows; r++) {
        const __m512 prev = kb || h ? _mm512_loadu_ps(y + r * ldy) : _mm512_setzero_ps();
        const __m512 scaled = _mm512_fmadd_ps(a, _mm512_load_ps(c + r * 16), prev);
        const int no_offset = t == BT_Q8_0 || t == BT_Q6_K || t == BT_MXFP4;
        _mm512_storeu_ps(y + r * ldy, no_offset ? scaled : _mm512_fmadd_ps(v.b0, _mm512_set1_ps(s[r]), scaled));
    }
}
static __thread amx_scratch amx_q;  /* a thread's expanded q: [K / 32][16 panels][amx_group_elems] */
#define AMX_LAG 4  /* C tiles stored ahead of their fold: the tile unit's stores reach ordinary loads late */
/* y[M, NB * 16] = x @ W.T from x's parts (xa, xs: amx_split_rows' layout, M rows) and the panels wq. Per 16 panels
   and row tile, per 32-k block: the parts are loaded once, each panel's q is loaded while the previous one's
   products run, and its C is folded into the row tile's y (16 x 256 floats: L1) AMX_LAG panels later. The q are
   expanded once, block by block as the first row tile reaches them (the next block prefetched, so the weight stream
   overlaps the products), and kept for the other row tiles (amx_q: up to 768 KB, L2). -1: out of memory. */
static int gemm_core_amx(const uint16_t* xa, const float* xs, const uint8_t* wp, int64_t pstride, int t, float* y,
                         int64_t ldy, int M, int NB, int K) {
    const int KB = K / 32, RT = (M + 15) / 16, ge = amx_group_elems(t), halves = t == BT_Q6_K ? 2 : 1;
    uint16_t* const qx = (uint16_t*)amx_reserve(&amx_q, (size_t)KB * 16 * ge * 2);
    if (!qx) return -1;
    float ring[AMX_LAG][256] __attribute__((aligned(64)));
    amx_configure(M < 16 ? M : 16);
    for (int n0 = 0; n0 < NB; n0 += 16) {
        const int nn = NB - n0 < 16 ? NB - n0 : 16;
        const uint8_t* wn = wp + (int64_t)n0 * pstride;
        for (int rt = 0; rt < RT; rt++) {
            const int rows = M - rt * 16 < 16 ? M - rt * 16 : 16;
            float* yt = y + rt * 16 * ldy + n0 * 16;
            int issued = 0, pn[AMX_LAG], pkb[AMX_LAG], ph[AMX_LAG];  /* ring slot -> its panel, block and half */
#define AMX_FOLD(slot) amx_fold(ring[slot], xs + ((int64_t)rt * KB + pkb[slot]) * 16, t, wn + pn[slot] * pstride, \
                                yt + pn[slot] * 16, ldy, rows, pkb[slot], ph[slot])
            for (int kb = 0; kb < KB; kb++) {
                const uint16_t* a = xa + ((int64_t)rt * KB + kb) * 1536;
                const uint16_t* q = qx + (int64_t)kb * 16 * ge;
                if (rt == 0)  /* q expanded as the first row tile needs them, the next block's prefetched */
                    for (int n = 0; n < nn; n++) {
                        group_view v;
                        group_decode(t, wn + n * pstride, kb, &v);
                        if (kb + 1 < KB) prefetch_group(t, wn + n * pstride, wn + n * pstride, 1, pstride, kb + 1);
                        amx_expand_group(t, &v, qx + ((int64_t)kb * 16 + n) * ge);
                    }
                _tile_loadd(0, a, 64);
                _tile_loadd(1, a + 512, 64);
                _tile_loadd(2, a + 1024, 64);
                _tile_loadd(6, q, 64);
                for (int i = 0; i < nn * halves; i++, issued++) {  /* panel i / halves, half i % halves */
                    const int slot = issued % AMX_LAG, more = i + 1 < nn * halves;
                    const uint16_t* next = q + (i + 1) / halves * ge + (i + 1) % halves * 256;
                    if (issued >= AMX_LAG) AMX_FOLD(slot);  /* the C stored AMX_LAG products ago */
                    if (i & 1) { if (more) _tile_loadd(6, next, 64); AMX_PRODUCT(5, 7, ring[slot]); }
                    else { if (more) _tile_loadd(7, next, 64); AMX_PRODUCT(4, 6, ring[slot]); }
                    pn[slot] = i / halves, pkb[slot] = kb, ph[slot] = i % halves;
                }
            }
            for (int i = issued > AMX_LAG ? issued - AMX_LAG : 0; i < issued; i++) AMX_FOLD(i % AMX_LAG);
#undef AMX_FOLD
        }
    }
    _tile_release();
    return 0;
}
/* x split into the caller's buffer (kept between calls: a step's projections all need one of about the same size);
   -1 when it cannot be allocated. */
static __thread amx_scratch amx_parts;
static int amx_split(const float* x, int64_t ldx, int M, int K, uint16_t** xa, float** xs) {
    const size_t tiles = (size_t)(M + 15) / 16 * (K / 32);
    char* const buf = (char*)amx_reserve(&amx_parts, tiles * (1536 * 2 + 64));
    if (!buf) return -1;
    amx_split_job s = {x, ldx, (uint16_t*)buf, (float*)(buf + tiles * 1536 * 2), M, K, 0};
    if (M <= 16) amx_split_task(&s); else POOL_RUN(amx_split_task, &s);  /* one row tile: not worth a wake-up */
    *xa = s.xa;
    *xs = s.xs;
    return 0;
}

/* ---- bfloat16 weights on the tile unit (the bfloat16 mode) ----
   x and W are bfloat16, so each 32-k block is one tile product, and C accumulates the whole of K in the tile
   before y = bf16(C + bias) (then bf16(residual + y)). These are oneDNN's bits for calls of up to 32 rows, i.e.
   torch's bfloat16 F.linear as transformers runs it on every decode step (checked bit for bit in
   tests/engines/pytorch/test_linear.py); oneDNN's larger calls sum K in pieces. Up to 16 rows, 4 panels at a
   time: C in tiles 0-3, x in 4. W: per group of 4 panels (fewer in the last), [K / 32][4 panels][16 k pairs]
   [16 columns][2] (1 KB per panel and 32 k), so a group's weights are one sequential stream. */
static void bf16_amx_rows(const uint16_t* x, int64_t ldx, const uint16_t* wp, const uint16_t* bias,
                          const uint16_t* residual, int64_t ldr, uint16_t* y, int64_t ldy, int rows, int nb, int K) {
    const int KB = K / 32;
    float c[4][256] __attribute__((aligned(64)));
    for (int n = 0; n < nb; n += 4) {
        const int g = nb - n < 4 ? nb - n : 4;
        const uint16_t* w = wp + (int64_t)n * KB * 512;
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int kb = 0; kb < KB; kb++) {
            const uint16_t* b = w + (int64_t)kb * g * 512;
            /* the next block's weights: one row ran 1.05-1.15x faster than without (2 or 4 ahead: slower) */
            for (int l = 0; l < g * 16; l++) _mm_prefetch((const char*)(b + g * 512 + l * 32), _MM_HINT_T0);
            _tile_loadd(4, x + kb * 32, ldx * 2);
            _tile_loadd(6, b, 64);
            _tile_dpbf16ps(0, 4, 6);
            if (g > 1) { _tile_loadd(7, b + 512, 64); _tile_dpbf16ps(1, 4, 7); }
            if (g > 2) { _tile_loadd(6, b + 1024, 64); _tile_dpbf16ps(2, 4, 6); }
            if (g > 3) { _tile_loadd(7, b + 1536, 64); _tile_dpbf16ps(3, 4, 7); }
        }
        _tile_stored(0, c[0], 64);
        if (g > 1) _tile_stored(1, c[1], 64);
        if (g > 2) _tile_stored(2, c[2], 64);
        if (g > 3) _tile_stored(3, c[3], 64);
        for (int p = 0; p < g; p++) {
            const int64_t col = (int64_t)(n + p) * 16;
            const __m512 b = bias ? widen_bf16(_mm256_loadu_si256((const __m256i*)(bias + col))) : _mm512_setzero_ps();
            for (int r = 0; r < rows; r++) {
                __m512 v = _mm512_load_ps(c[p] + r * 16);
                if (bias) v = _mm512_add_ps(v, b);
                __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
                if (residual)
                    h = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(
                        widen_bf16(_mm256_loadu_si256((const __m256i*)(residual + r * ldr + col))), widen_bf16(h)));
                _mm256_storeu_si256((__m256i*)(y + r * ldy + col), h);
            }
        }
    }
}
/* A gemm_job over bfloat16 x (in xa) and W (wp, the layout above), writing bfloat16 y (y16). */
static void bf16_amx_task(void* p) {
    gemm_job* j = (gemm_job*)p;
    const uint16_t *bias = (const uint16_t*)j->bias, *res = (const uint16_t*)j->residual;
    for (int n0, m0, nb, mc; next_tile(j, &n0, &m0, &nb, &mc);) {
        const int64_t c0 = (int64_t)n0 * 16;
        for (int r = 0, configured = 0; r < mc; r += 16) {
            const int rows = mc - r < 16 ? mc - r : 16, m = m0 + r;
            if (rows != configured) amx_configure(configured = rows);
            bf16_amx_rows(j->xa + m * j->ldx, j->ldx, (const uint16_t*)j->wp + (int64_t)n0 * (j->K / 32) * 512,
                          bias ? bias + c0 : 0, res ? res + m * j->ldr + c0 : 0, j->ldr, j->y16 + m * j->ldy + c0,
                          j->ldy, rows, nb, j->K);
        }
    }
    _tile_release();
}
#endif
/* y[M, NB * 16] = x @ W.T (+ bias) (+ residual), all bfloat16, on the tile unit (bf16_amx_rows; K a multiple of
   32). -1: built without the tile unit. */
int gemm_bf16_amx_par(const uint16_t* x, int64_t ldx, const uint16_t* wp, const uint16_t* bias,
                      const uint16_t* residual, int64_t ldr, uint16_t* y, int64_t ldy, int M, int NB, int K, int chunk,
                      int mchunk) {
#if defined(__AMX_BF16__) && defined(__AVX512BF16__)
    gemm_job j = {.wp = wp, .bias = bias, .residual = residual, .y16 = y, .ldx = ldx, .ldr = ldr, .ldy = ldy, .M = M,
                  .NB = NB, .K = K, .chunk = chunk, .mchunk = mchunk, .amx = 3, .xa = x};
    POOL_RUN(bf16_amx_task, &j);
    return 0;
#else
    (void)x; (void)ldx; (void)wp; (void)bias; (void)residual; (void)ldr; (void)y; (void)ldy; (void)M; (void)NB;
    (void)K; (void)chunk; (void)mchunk;
    return -1;
#endif
}
/* Whether this CPU and kernel let the process use AMX tiles (asked for once: Linux hands them out per process). */
int amx_supported(void) {
#if defined(__AMX_BF16__) && defined(__AVX512BF16__)
    static int granted = -1;
    if (granted < 0) granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return granted;
#else
    return 0;
#endif
}
/* One tile of a job on GGUF blocks, run by run of panels: the tile unit's kernel for the types it reads where the
   job's x is split for it (amx 1, see tile_prepare), else the expanding kernels (gemm_blocks.h; 16-bit panels: the
   float32 kernel with the weights widened as loaded). */
static void blocks_tile(gemm_job* j, int m0, int n0, float* y, int64_t ldy, int mc, int nb) {
    const float* x = j->x + m0 * j->ldx;
    for (int s = 0, start = 0; s < j->nseg; start = j->segs[2 * s], s++) {
        const int end = j->segs[2 * s], t = j->segs[2 * s + 1];
        const int lo = n0 > start ? n0 : start, hi = n0 + nb < end ? n0 + nb : end;
        if (lo >= hi) continue;
        const int64_t pstride = bt_panel_bytes(t, j->K);
        const uint8_t* panels = (const uint8_t*)(intptr_t)j->seg_ptr[s] + (int64_t)(lo - start) * pstride;
        float* ys = y + (int64_t)(lo - n0) * 16;
        int failed;
#if defined(__AMX_BF16__) && defined(__AVX512BF16__)
        if (j->xa && amx_type(t)) {
            const int64_t at = (int64_t)m0 / 16 * (j->K / 32);
            failed = gemm_core_amx(j->xa + at * 1536, j->xs + at * 16, panels, pstride, t, ys, ldy, mc, hi - lo, j->K);
        } else
#endif
#ifdef BLOCK_INT8
        if (j->x8q && i8_type(t)) {
            const x8_rows x8 = {j->x8q + (int64_t)m0 * j->K, j->x8d + (int64_t)m0 * (j->K / 32),
                                j->x8s + (int64_t)m0 * (j->K / 16), j->K};
            gemm_core_blocks_i8(t, x8, panels, pstride, ys, ldy, mc, hi - lo);
            failed = 0;
        } else
#endif
            failed = gemm_core_blocks(t, x, j->ldx, panels, pstride, ys, ldy, mc, hi - lo, j->K);
        if (failed) __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    }
}
#ifdef BLOCK_INT8
/* x quantized into the calling thread's buffer (kept between calls, as amx_split's), rows shared by the pool on
   large calls; -1 when it cannot be allocated. */
typedef struct { const float* x; int64_t ldx; int8_t* q; float *d, *s; int M, K, next; } x8_job;
static void x8_task(void* p) {
    x8_job* j = (x8_job*)p;
    for (int m; (m = __atomic_fetch_add(&j->next, 16, __ATOMIC_RELAXED)) < j->M;) {
        const int rows = j->M - m < 16 ? j->M - m : 16;
        x8_quantize(j->x + m * j->ldx, j->ldx, rows, j->K, j->q + (int64_t)m * j->K, j->d + (int64_t)m * (j->K / 32),
                    j->s + (int64_t)m * (j->K / 16));
    }
}
static __thread thread_scratch x8_buffer;
static int x8_prepare(gemm_job* j) {
    const size_t q = (size_t)j->M * j->K, d = (size_t)j->M * (j->K / 32);
    char* const buf = (char*)scratch_reserve(&x8_buffer, (q + 63) / 64 * 64 + 3 * d * sizeof(float));
    if (!buf) return -1;
    x8_job s = {j->x, j->ldx, (int8_t*)buf, (float*)(buf + (q + 63) / 64 * 64), 0, j->M, j->K, 0};
    s.s = s.d + d;
    if (j->M <= 16) x8_task(&s); else POOL_RUN(x8_task, &s);
    j->x8q = s.q, j->x8d = s.d, j->x8s = s.s;
    return 0;
}
#endif
int int8_supported(void) {
#ifdef BLOCK_INT8
    return 1;
#else
    return 0;
#endif
}
/* Before a job with amx 1: x split for the tile unit (where it has one; else nothing, and the expanding kernels
   run); amx 2: x quantized for the int8 kernels (where this build has them; else the expanding kernels run). -1: out
   of memory. */
static int tile_prepare(gemm_job* j) {
#ifdef BLOCK_INT8
    if (j->amx == 2) return x8_prepare(j);
#endif
#if defined(__AMX_BF16__) && defined(__AVX512BF16__)
    if (j->amx == 1 && amx_supported())
        return amx_split(j->x, j->ldx, j->M, j->K, (uint16_t**)&j->xa, (float**)&j->xs);
#endif
    (void)j;  /* nothing to prepare */
    return 0;
}

static void gemm_task(void* p) {
    gemm_job* j = (gemm_job*)p;
    for (int n0, m0, nb, mc; next_tile(j, &n0, &m0, &nb, &mc);) {
        const int64_t w0 = (int64_t)n0 * j->K * 16, c0 = (int64_t)n0 * 16, y0 = m0 * j->ldy + c0, r0 = m0 * j->ldr + c0;
        const float* x = j->x + m0 * j->ldx;
        if (j->nseg) {  /* float32 only */
            const float *bias = (const float*)j->bias, *res = (const float*)j->residual;
            blocks_tile(j, m0, n0, j->y + y0, j->ldy, mc, nb);
            epilogue_f32(bias ? bias + c0 : 0, res ? res + r0 : 0, j->ldr, j->y + y0, j->ldy, mc, nb);
        } else if (j->y16) {
            const uint16_t *bias = (const uint16_t*)j->bias, *res = (const uint16_t*)j->residual;
            gemm_bf16w(x, j->ldx, (const uint16_t*)j->wp + w0, bias ? bias + c0 : 0, res ? res + r0 : 0, j->ldr,
                       j->y + y0, j->y16 + y0, j->ldy, mc, nb, j->K);
        } else {
            const float *bias = (const float*)j->bias, *res = (const float*)j->residual;
            gemm_f32(x, j->ldx, (const float*)j->wp + w0, bias ? bias + c0 : 0, res ? res + r0 : 0, j->ldr,
                     j->y + y0, j->ldy, mc, nb, j->K);
        }
    }
}
void gemm_f32_par(const float* x, int64_t ldx, const float* wp, const float* bias, const float* residual, int64_t ldr,
                  float* y, int64_t ldy, int M, int NB, int K, int chunk, int mchunk) {
    gemm_job j = {.x = x, .wp = wp, .bias = bias, .residual = residual, .y = y, .ldx = ldx, .ldr = ldr,
                  .ldy = ldy, .M = M, .NB = NB, .K = K, .chunk = chunk, .mchunk = mchunk};
    POOL_RUN(gemm_task, &j);
}
void gemm_bf16w_par(const float* x, int64_t ldx, const uint16_t* wp, const uint16_t* bias, const uint16_t* residual,
                    int64_t ldr, float* acc, uint16_t* y, int64_t ldy, int M, int NB, int K, int chunk, int mchunk) {
    gemm_job j = {.x = x, .wp = wp, .bias = bias, .residual = residual, .y = acc, .y16 = y, .ldx = ldx, .ldr = ldr,
                  .ldy = ldy, .M = M, .NB = NB, .K = K, .chunk = chunk, .mchunk = mchunk};
    POOL_RUN(gemm_task, &j);
}

/* gemm_f32_par with the weight as GGUF blocks: nseg runs of panels (gemm_job's segs); amx 1: its quantized runs
   through the tile unit where the CPU has one. Returns 0, or -1 when a scratch (the split of x, an expanding
   kernel's) could not be allocated. */
int gemm_blocks_par(const float* x, int64_t ldx, const int* segs, const int64_t* ptrs, int nseg, const float* bias,
                    const float* residual, int64_t ldr, float* y, int64_t ldy, int M, int NB, int K, int chunk,
                    int mchunk, int amx) {
    gemm_job j = {.x = x, .bias = bias, .residual = residual, .y = y, .ldx = ldx, .ldr = ldr, .ldy = ldy, .M = M,
                  .NB = NB, .K = K, .chunk = chunk, .mchunk = mchunk, .amx = amx};
    j.segs = segs, j.seg_ptr = ptrs, j.nseg = nseg;
    if (tile_prepare(&j) != 0) return -1;
    POOL_RUN(gemm_task, &j);
    return j.failed ? -1 : 0;
}

/* Rows of a weight held as runs of GGUF block panels (gemm_blocks_par's segs and ptrs): out[i, :] = W[rows[i], :],
   the exact float32 weight the kernels compute with. For an embedding table tied to its lm_head: the model then
   keeps the table once, as the lm_head's panels. */
void blocks_rows(const int* segs, const int64_t* ptrs, int nseg, int K, const int64_t* rows, int T, float* out) {
    float w[32 * 16];
    for (int i = 0; i < T; i++) {
        const int64_t p = rows[i] / 16;
        const int c = (int)(rows[i] % 16);
        int s = 0;
        while (s < nseg - 1 && p >= segs[2 * s]) s++;
        const int start = s ? segs[2 * s - 2] : 0, t = segs[2 * s + 1];
        const uint8_t* panel = (const uint8_t*)(intptr_t)ptrs[s] + (p - start) * bt_panel_bytes(t, K);
        float* o = out + (int64_t)i * K;
        if (t == BT_BF16 || t == BT_F16) {  /* [K][16] 16-bit values */
            const uint16_t* v = (const uint16_t*)panel + c;
            for (int k = 0; k < K; k++) o[k] = t == BT_F16 ? _cvtsh_ss(v[16 * k]) : bf16_to_f32(v[16 * k]);
            continue;
        }
        for (int g = 0; g < K / 32; g++) {
            expand_groups(t, panel, g, 1, w);
            for (int k = 0; k < 32; k++) o[32 * g + k] = w[16 * k + c];
        }
    }
}

/* y[M, NB / 2 * 16] = silu(x @ G.T) * (x @ U.T), with W packed as gate and up panels in turn (G0 U0 G1 U1 ...:
   NB panels, NB even; or GGUF blocks in that order, as for gemm_blocks_par): each tile of `chunk` panels (even) x
   `mchunk` rows is computed into the thread's scratch and activated from there, so the [M, NB * 16] product of gate
   and up never goes to memory and back. The same bits as gemm_f32 then silu_mul_f32. Returns 0, or -1 when no thread could allocate its scratch. */
/* A tile's gate and up panels (in turn, `ldt` floats a row) activated into the job's y. */
static inline void silu_tile(const gemm_job* j, const float* tile, int64_t ldt, int m0, int n0, int mc, int nb) {
    for (int r = 0; r < mc; r++)
        for (int q = 0; q < nb / 2; q++)
            silu_mul_row(tile + r * ldt + q * 32, tile + r * ldt + q * 32 + 16,
                         j->y + (m0 + r) * j->ldy + (int64_t)(n0 / 2 + q) * 16, 16);
}
static void gemm_silu_task(void* p) {
    gemm_job* j = (gemm_job*)p;
    const int64_t ldt = (int64_t)j->chunk * 16;
    float* tile = (float*)malloc(sizeof(float) * (size_t)ldt * (size_t)j->mchunk);
    if (!tile) return;  /* the other threads take the tiles; the caller reports it if none could */
    for (int n0, m0, nb, mc; next_tile(j, &n0, &m0, &nb, &mc);) {
        const float* x = j->x + m0 * j->ldx;
        if (j->nseg)
            blocks_tile(j, m0, n0, tile, ldt, mc, nb);
        else
            gemm_core_f32(x, j->ldx, (const float*)j->wp + (int64_t)n0 * j->K * 16, tile, ldt, mc, nb, j->K);
        silu_tile(j, tile, ldt, m0, n0, mc, nb);
    }
    free(tile);
}
int gemm_silu_f32_par(const float* x, int64_t ldx, const float* wp, const int* segs, const int64_t* ptrs, int nseg,
                      float* y, int64_t ldy, int M, int NB, int K, int chunk, int mchunk, int amx) {
    gemm_job j = {.x = x, .wp = wp, .y = y, .ldx = ldx, .ldy = ldy, .M = M, .NB = NB, .K = K, .chunk = chunk,
                  .mchunk = mchunk, .amx = amx};
    if (nseg) j.segs = segs, j.seg_ptr = ptrs, j.nseg = nseg;
    if (tile_prepare(&j) != 0) return -1;
    POOL_RUN(gemm_silu_task, &j);
    return j.failed || __atomic_load_n(&j.next, __ATOMIC_RELAXED) < tile_count(&j) ? -1 : 0;  /* tiles no thread took */
}

/* Several projections of one shape (NB panels of K) in one job: rows [start, end) of x through part p's weight
   into the same rows of y; with silu, the fused gate-up-SiLU job's panels and activation (y NB / 2 * 16 wide). An
   MoE block's chosen experts: one hand-off and one join for all of them instead of one per expert, and every
   expert's tiles handed out from one counter, so the thread that finishes first does not wait out a whole tile of
   each expert at its join. A part's rows are computed exactly as gemm_blocks_par / gemm_silu_f32_par compute them
   (same tiles, same kernels; x quantized once for all the parts with amx 2, each row as alone). amx: 0 or 2 (the
   tile unit's split of x is by 16-row blocks, which the parts' rows need not start on: -2). Returns 0, -1 (a
   scratch could not be allocated) or -2. */
typedef struct { gemm_job* parts; const int* first; int nparts, tiles, silu, ldt, mchunk, next; } grouped_job;
static void grouped_task(void* p) {
    grouped_job* g = (grouped_job*)p;
    float* tile = 0;
    if (g->silu && !(tile = (float*)malloc(sizeof(float) * (size_t)g->ldt * (size_t)g->mchunk))) return;
    for (int t; (t = __atomic_fetch_add(&g->next, 1, __ATOMIC_RELAXED)) < g->tiles;) {
        int lo = 0, hi = g->nparts - 1;  /* the last part whose first tile is at or before t */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (g->first[mid] <= t) lo = mid;
            else hi = mid - 1;
        }
        gemm_job* j = g->parts + lo;
        int n0, m0, nb, mc;
        tile_at(j, t - g->first[lo], &n0, &m0, &nb, &mc);
        if (g->silu) {
            blocks_tile(j, m0, n0, tile, g->ldt, mc, nb);
            silu_tile(j, tile, g->ldt, m0, n0, mc, nb);
        } else
            blocks_tile(j, m0, n0, j->y + m0 * j->ldy + (int64_t)n0 * 16, j->ldy, mc, nb);
    }
    free(tile);
}
int gemm_grouped_par(const float* x, int64_t ldx, float* y, int64_t ldy, const grouped_part* parts, int nparts,
                     int NB, int K, int chunk, int mchunk, int amx, int silu) {
    if (amx == 1) return -2;
    if (nparts <= 0) return 0;
    gemm_job all = {.x = x, .ldx = ldx, .M = 0, .K = K, .amx = amx};
    for (int p = 0; p < nparts; p++) all.M = parts[p].end > all.M ? parts[p].end : all.M;
    if (tile_prepare(&all) != 0) return -1;
    gemm_job* jobs = (gemm_job*)calloc((size_t)nparts, sizeof(gemm_job));
    int* first = (int*)malloc(sizeof(int) * (size_t)nparts);
    if (!jobs || !first) {
        free(jobs);
        free(first);
        return -1;
    }
    grouped_job g = {.parts = jobs, .first = first, .nparts = nparts, .silu = silu, .ldt = chunk * 16, .mchunk = 1};
    for (int p = 0; p < nparts; p++) {
        const int a = parts[p].start, rows = parts[p].end - a;
        gemm_job* j = jobs + p;
        j->x = x + a * ldx, j->ldx = ldx, j->y = y + a * ldy, j->ldy = ldy, j->M = rows, j->NB = NB, j->K = K;
        j->chunk = chunk, j->mchunk = rows < mchunk ? rows : mchunk;
        j->segs = parts[p].segs, j->seg_ptr = parts[p].ptrs, j->nseg = parts[p].nseg, j->amx = amx;
        if (all.x8q) j->x8q = all.x8q + (int64_t)a * K, j->x8d = all.x8d + (int64_t)a * (K / 32),
                     j->x8s = all.x8s + (int64_t)a * (K / 16);
        first[p] = g.tiles;
        g.tiles += rows > 0 ? tile_count(j) : 0;
        g.mchunk = j->mchunk > g.mchunk ? j->mchunk : g.mchunk;
    }
    POOL_RUN(grouped_task, &g);
    int failed = __atomic_load_n(&g.next, __ATOMIC_RELAXED) < g.tiles;  /* tiles no thread took */
    for (int p = 0; p < nparts; p++) failed |= jobs[p].failed;
    free(jobs);
    free(first);
    return failed ? -1 : 0;
}

typedef struct { const void *x, *w; void* y; int64_t ldx, ldy; float eps; int M, N, next; } rows_job;
static void silu_task(void* p) { rows_job* j = (rows_job*)p; silu_mul_f32(j->x, j->ldx, j->y, j->ldy, j->M, j->N, &j->next); }
static void rms_task(void* p) {
    rows_job* j = (rows_job*)p;
    rms_norm_f32(j->x, j->ldx, j->w, j->eps, j->y, j->ldy, j->M, j->N, &j->next);
}
static void silu_bf16_task(void* p) {
    rows_job* j = (rows_job*)p;
    silu_mul_bf16(j->x, j->ldx, j->y, j->ldy, j->M, j->N, &j->next);
}
static void rms_bf16_task(void* p) {
    rows_job* j = (rows_job*)p;
    rms_norm_bf16(j->x, j->ldx, j->w, j->eps, j->y, j->ldy, j->M, j->N, &j->next);
}
void silu_mul_f32_par(const float* gu, int64_t ldg, float* y, int64_t ldy, int M, int I) {
    rows_job j = {gu, 0, y, ldg, ldy, 0.0f, M, I, 0};
    POOL_RUN(silu_task, &j);
}
void silu_mul_bf16_par(const uint16_t* gu, int64_t ldg, uint16_t* y, int64_t ldy, int M, int I) {
    rows_job j = {gu, 0, y, ldg, ldy, 0.0f, M, I, 0};
    POOL_RUN(silu_bf16_task, &j);
}
void rms_norm_f32_par(const float* x, int64_t ldx, const float* w, float eps, float* y, int64_t ldy, int M, int H) {
    rows_job j = {x, w, y, ldx, ldy, eps, M, H, 0};
    POOL_RUN(rms_task, &j);
}
void rms_norm_bf16_par(const uint16_t* x, int64_t ldx, const uint16_t* w, float eps, uint16_t* y, int64_t ldy, int M,
                       int H) {
    rows_job j = {x, w, y, ldx, ldy, eps, M, H, 0};
    POOL_RUN(rms_bf16_task, &j);
}

/* The same jobs for the kernels of the Gemma-like layers and Granite's multipliers (their extra operands in `r` /
   `ldr` / `heads`, a scalar operand in `eps`). */
typedef struct { const void *x, *w, *r; void* y; int64_t ldx, ldy, ldr; float eps; int M, N, heads, next; } rows2_job;
static void rms_add_task(void* p) {
    rows2_job* j = (rows2_job*)p;
    rms_norm_add_f32(j->x, j->ldx, j->w, j->eps, j->r, j->ldr, j->y, j->ldy, j->M, j->N, &j->next);
}
static void rms_heads_task(void* p) {
    rows2_job* j = (rows2_job*)p;
    rms_norm_heads_f32(j->x, j->ldx, j->w, j->eps, j->y, j->ldy, j->M, j->heads, j->N, &j->next);
}
static void gelu_task(void* p) {
    rows2_job* j = (rows2_job*)p;
    gelu_tanh_mul_f32(j->x, j->ldx, j->y, j->ldy, j->M, j->N, &j->next);
}
static void softcap_task(void* p) {
    rows2_job* j = (rows2_job*)p;
    softcap_f32(j->y, j->ldy, j->eps, j->M, j->N, &j->next);
}
void rms_norm_add_f32_par(const float* x, int64_t ldx, const float* w, float eps, const float* r, int64_t ldr,
                          float* y, int64_t ldy, int M, int H) {
    rows2_job j = {.x = x, .w = w, .r = r, .y = y, .ldx = ldx, .ldy = ldy, .ldr = ldr, .eps = eps, .M = M, .N = H};
    POOL_RUN(rms_add_task, &j);
}
void rms_norm_heads_f32_par(const float* x, int64_t ldx, const float* w, float eps, float* y, int64_t ldy, int M,
                            int heads, int D) {
    rows2_job j = {.x = x, .w = w, .y = y, .ldx = ldx, .ldy = ldy, .eps = eps, .M = M, .N = D, .heads = heads};
    POOL_RUN(rms_heads_task, &j);
}
void gelu_tanh_mul_f32_par(const float* gu, int64_t ldg, float* y, int64_t ldy, int M, int I) {
    rows2_job j = {.x = gu, .y = y, .ldx = ldg, .ldy = ldy, .M = M, .N = I};
    POOL_RUN(gelu_task, &j);
}
void softcap_f32_par(float* x, int64_t ldx, float cap, int M, int N) {
    rows2_job j = {.y = x, .ldy = ldx, .eps = cap, .M = M, .N = N};
    POOL_RUN(softcap_task, &j);
}
static void scale_add_task(void* p) {
    rows2_job* j = (rows2_job*)p;
    scale_add_f32(j->x, j->ldx, j->eps, j->r, j->ldr, j->y, j->ldy, j->M, j->N, &j->next);
}
static void div_task(void* p) {
    rows2_job* j = (rows2_job*)p;
    div_f32(j->y, j->ldy, j->eps, j->M, j->N, &j->next);
}
void scale_add_f32_par(const float* x, int64_t ldx, float s, const float* r, int64_t ldr, float* y, int64_t ldy,
                       int M, int N) {
    rows2_job j = {.x = x, .r = r, .y = y, .ldx = ldx, .ldy = ldy, .ldr = ldr, .eps = s, .M = M, .N = N};
    POOL_RUN(scale_add_task, &j);
}
void div_f32_par(float* x, int64_t ldx, float d, int M, int N) {
    rows2_job j = {.y = x, .ldy = ldx, .eps = d, .M = M, .N = N};
    POOL_RUN(div_task, &j);
}
