/* The blocked float32 GEMM over packed panels, once per weight type: gemm.c includes this header with TYPE_SUFFIX
   f32 (float32 weights), bf16w and f16w (bfloat16 / float16 weights, converted to float32 exactly as they are
   loaded; x and the sums are float32). No include guard: it is meant to be included once per type (type_suffix.h). */
/* Micro-kernels: R rows of x against one 16-column panel of packed weights, over k = 0..kc-1. The accumulators
   start at zero (init == 0) or at y (a later K block continues the same FMA chain exactly). */
#undef ROW_DECL
#undef ROW_INIT
#undef ROW_FMA
#undef ROW_STORE
#undef KLOOP
#undef SIG
#define ROW_DECL(r) __m256 a##r##0, a##r##1;
#define ROW_INIT(r) if (init) { a##r##0 = _mm256_loadu_ps(y + r * ldy); a##r##1 = _mm256_loadu_ps(y + r * ldy + 8); } \
                    else { a##r##0 = _mm256_setzero_ps(); a##r##1 = _mm256_setzero_ps(); }
#define ROW_FMA(r) { __m256 xb = _mm256_broadcast_ss(x + r * ldx + k); \
                     a##r##0 = _mm256_fmadd_ps(xb, w0, a##r##0); a##r##1 = _mm256_fmadd_ps(xb, w1, a##r##1); }
#define ROW_STORE(r) { _mm256_storeu_ps(y + r * ldy, a##r##0); _mm256_storeu_ps(y + r * ldy + 8, a##r##1); }
#define KLOOP(BODY) for (int k = 0; k < kc; k++) { \
    __m256 w0 = SFX(LOADW)(w + k * 16), w1 = SFX(LOADW)(w + k * 16 + 8); BODY }
#define SIG(n) static inline void SFX(mk_##n)(const float* x, int64_t ldx, const SFX(WT)* w, float* y, int64_t ldy, int kc, \
                                         int init)
SIG(1) { ROW_DECL(0) ROW_INIT(0) KLOOP(ROW_FMA(0)) ROW_STORE(0) }
SIG(2) { ROW_DECL(0) ROW_DECL(1) ROW_INIT(0) ROW_INIT(1) KLOOP(ROW_FMA(0) ROW_FMA(1)) ROW_STORE(0) ROW_STORE(1) }
SIG(3) { ROW_DECL(0) ROW_DECL(1) ROW_DECL(2) ROW_INIT(0) ROW_INIT(1) ROW_INIT(2)
         KLOOP(ROW_FMA(0) ROW_FMA(1) ROW_FMA(2)) ROW_STORE(0) ROW_STORE(1) ROW_STORE(2) }
SIG(4) { ROW_DECL(0) ROW_DECL(1) ROW_DECL(2) ROW_DECL(3) ROW_INIT(0) ROW_INIT(1) ROW_INIT(2) ROW_INIT(3)
         KLOOP(ROW_FMA(0) ROW_FMA(1) ROW_FMA(2) ROW_FMA(3)) ROW_STORE(0) ROW_STORE(1) ROW_STORE(2) ROW_STORE(3) }
SIG(5) { ROW_DECL(0) ROW_DECL(1) ROW_DECL(2) ROW_DECL(3) ROW_DECL(4)
         ROW_INIT(0) ROW_INIT(1) ROW_INIT(2) ROW_INIT(3) ROW_INIT(4)
         KLOOP(ROW_FMA(0) ROW_FMA(1) ROW_FMA(2) ROW_FMA(3) ROW_FMA(4))
         ROW_STORE(0) ROW_STORE(1) ROW_STORE(2) ROW_STORE(3) ROW_STORE(4) }
SIG(6) { ROW_DECL(0) ROW_DECL(1) ROW_DECL(2) ROW_DECL(3) ROW_DECL(4) ROW_DECL(5)
         ROW_INIT(0) ROW_INIT(1) ROW_INIT(2) ROW_INIT(3) ROW_INIT(4) ROW_INIT(5)
         KLOOP(ROW_FMA(0) ROW_FMA(1) ROW_FMA(2) ROW_FMA(3) ROW_FMA(4) ROW_FMA(5))
         ROW_STORE(0) ROW_STORE(1) ROW_STORE(2) ROW_STORE(3) ROW_STORE(4) ROW_STORE(5) }

/* One row against four panels at once: eight independent chains hide the FMA latency of a single row. */
static inline void SFX(mk1x4)(const float* x, const SFX(WT)* w, int64_t panel, float* y, int kc, int init) {
    __m256 a[8];
    for (int i = 0; i < 8; i++) a[i] = init ? _mm256_loadu_ps(y + 8 * i) : _mm256_setzero_ps();
    __m256 a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7];
    for (int k = 0; k < kc; k++) {
        const __m256 xb = _mm256_broadcast_ss(x + k);
        const SFX(WT)* wk = w + k * 16;
        /* a row's step streams the weights from memory: ask for each panel's line PF1 rows ahead (the hardware
           prefetcher stops at every page boundary; a prefetch past the end is harmless) */
        _mm_prefetch((const char*)(wk + PF1 * 16), _MM_HINT_T0);
        _mm_prefetch((const char*)(wk + panel + PF1 * 16), _MM_HINT_T0);
        _mm_prefetch((const char*)(wk + 2 * panel + PF1 * 16), _MM_HINT_T0);
        _mm_prefetch((const char*)(wk + 3 * panel + PF1 * 16), _MM_HINT_T0);
        a0 = _mm256_fmadd_ps(xb, SFX(LOADW)(wk), a0);
        a1 = _mm256_fmadd_ps(xb, SFX(LOADW)(wk + 8), a1);
        a2 = _mm256_fmadd_ps(xb, SFX(LOADW)(wk + panel), a2);
        a3 = _mm256_fmadd_ps(xb, SFX(LOADW)(wk + panel + 8), a3);
        a4 = _mm256_fmadd_ps(xb, SFX(LOADW)(wk + 2 * panel), a4);
        a5 = _mm256_fmadd_ps(xb, SFX(LOADW)(wk + 2 * panel + 8), a5);
        a6 = _mm256_fmadd_ps(xb, SFX(LOADW)(wk + 3 * panel), a6);
        a7 = _mm256_fmadd_ps(xb, SFX(LOADW)(wk + 3 * panel + 8), a7);
    }
    _mm256_storeu_ps(y, a0); _mm256_storeu_ps(y + 8, a1); _mm256_storeu_ps(y + 16, a2);
    _mm256_storeu_ps(y + 24, a3); _mm256_storeu_ps(y + 32, a4); _mm256_storeu_ps(y + 40, a5);
    _mm256_storeu_ps(y + 48, a6); _mm256_storeu_ps(y + 56, a7);
}

/* 512-bit micro-kernels (CPUs with AVX-512): r = 1..ZROWS rows of x against two adjacent 16-column panels (MKZ in
   gemm_common.h). Every lane runs the same FMA chain over k as the 256-bit kernels, so the results are the same bit
   for bit. */
#ifdef __AVX512F__
MKZ(1) MKZ(2) MKZ(3) MKZ(4) MKZ(5) MKZ(6) MKZ(7) MKZ(8) MKZ(9) MKZ(10) MKZ(11) MKZ(12)
static inline void SFX(mkz)(int r, const float* x, int64_t ldx, const SFX(WT)* w, int64_t panel, float* y, int64_t ldy,
                            int kc, int init, const SFX(WT)* pf, int64_t pf_row, int pf_every) {
    switch (r) {
#define MKZ_CASE(i) case i: SFX(mkz_##i)(x, ldx, w, panel, y, ldy, kc, init, pf, pf_row, pf_every); break;
        MKZ_CASE(1) MKZ_CASE(2) MKZ_CASE(3) MKZ_CASE(4) MKZ_CASE(5) MKZ_CASE(6)
        MKZ_CASE(7) MKZ_CASE(8) MKZ_CASE(9) MKZ_CASE(10) MKZ_CASE(11) MKZ_CASE(12)
#undef MKZ_CASE
    }
}
#endif

/* y = x @ W.T over k = 0..K-1; with init0 the FMA chains continue from y (the caller's previous k), so a caller
   may run K in pieces (e.g. weights expanded from blocks a piece at a time) and get the bits of one call. */
static void SFX(gemm_core_from)(const float* x, int64_t ldx, const SFX(WT)* wp, float* y, int64_t ldy, int M, int NB,
                                int K, int init0) {
    const int64_t panel = (int64_t)K * 16;
    const int nkb = (K + KC - 1) / KC;
    for (int kb = 0; kb < nkb; kb++) {
        const int k0 = (int)((int64_t)K * kb / nkb), kc = (int)((int64_t)K * (kb + 1) / nkb) - k0;
        const int init = kb > 0 || init0;
        for (int m0 = 0; m0 < M; m0 += MC) {
            const int mc = M - m0 < MC ? M - m0 : MC;
            int nb = 0;
#ifdef __AVX512F__
            if (mc >= ZMIN_ROWS)
                for (; nb + 2 <= NB; nb += 2) {
                    const SFX(WT)* w = wp + nb * panel + (int64_t)k0 * 16;
                    /* the first (up to) 3 row blocks also pull the next panel pair towards the core, each a
                       share of its k rows spread over its loop: the weights of a large step stream from memory,
                       and the hardware prefetcher alone leaves the FMAs waiting (measured at 32 rows: -10% step
                       time against all of it in the first block; spreading over all 8 blocks of a 96-row M block
                       was slower) */
                    const SFX(WT)* next = nb + 4 <= NB ? w + 2 * panel : 0;
                    const int blocks = (mc + ZROWS - 1) / ZROWS, pf_blocks = blocks < 3 ? blocks : 3;
                    for (int i = 0; i < blocks; i++) {
                        const int m = m0 + i * ZROWS, r = m0 + mc - m < ZROWS ? m0 + mc - m : ZROWS;
                        SFX(mkz)(r, x + m * ldx + k0, ldx, w, panel, y + m * ldy + nb * 16, ldy, kc, init,
                                i < pf_blocks ? next : 0, kc * i / pf_blocks, pf_blocks);
                    }
                }
#endif
            if (mc == 1)
                for (; nb + 4 <= NB; nb += 4)
                    SFX(mk1x4)(x + (int64_t)m0 * ldx + k0, wp + nb * panel + (int64_t)k0 * 16, panel,
                          y + (int64_t)m0 * ldy + nb * 16, kc, init);
            for (; nb < NB; nb++) {
                const SFX(WT)* w = wp + nb * panel + (int64_t)k0 * 16;
                int m = m0;
                for (; m + 6 <= m0 + mc; m += 6)
                    SFX(mk_6)(x + m * ldx + k0, ldx, w, y + m * ldy + nb * 16, ldy, kc, init);
                const float* xm = x + m * ldx + k0;
                float* ym = y + m * ldy + nb * 16;
                switch (m0 + mc - m) {
                    case 1: SFX(mk_1)(xm, ldx, w, ym, ldy, kc, init); break;
                    case 2: SFX(mk_2)(xm, ldx, w, ym, ldy, kc, init); break;
                    case 3: SFX(mk_3)(xm, ldx, w, ym, ldy, kc, init); break;
                    case 4: SFX(mk_4)(xm, ldx, w, ym, ldy, kc, init); break;
                    case 5: SFX(mk_5)(xm, ldx, w, ym, ldy, kc, init); break;
                }
            }
        }
    }
}
static inline void SFX(gemm_core)(const float* x, int64_t ldx, const SFX(WT)* wp, float* y, int64_t ldy, int M, int NB,
                                  int K) {
    SFX(gemm_core_from)(x, ldx, wp, y, ldy, M, NB, K, 0);
}
