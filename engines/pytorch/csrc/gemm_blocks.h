/* Weights kept as a GGUF file's quantized blocks (engines/pytorch/gguf_blocks.py), repacked at load into panels of
   16 output columns (engines/pytorch/block_panels.py writes this layout), and expanded to the exact float32 weight
   as the GEMM runs. Included by gemm.c after the float32 panel kernels (gemm_core_from_f32).

   Every type's float32 weight, as gguf-py (and so transformers) dequantizes it, is one rounding of A * q + B with A
   and B exact float32 values per column and sub-block and q a small integer: Q4_0 d*(q-8), Q5_0 d*(q-16), Q8_0
   d*q, Q4_1/Q5_1 d*q+m, Q4_K/Q5_K (d*sc)*q-(dmin*m), Q6_K (d*sc)*(q-32); d*sc and dmin*m are exact in float32
   (11 x 8 significant bits at most). MXFP4 is d*v with d = 2^(e-128) (its E8M0 byte e) and v an int8 that the
   nibble q picks from a 16-entry table (E2M1 doubled, ggml's: not evenly spaced, so no A * q + B of q itself): the
   expansion permutes the nibbles into their values (one byte shuffle, mxfp4_table), then fma(d, v, -0) as Q8_0.
   So fma(A, q, B) is that very weight, bit for bit (up to the sign of a zero), and the float32 kernel's FMA chain
   over k then gives the float32 kernel's bits on the dequantized weight.

   Layout: a panel (16 columns) is a run of records over k, RK = 32 k (256 for the K-quants), nothing shared
   between panels; within a record every field is per column, 16 side by side:
     32-k types   [d f16 x16; MXFP4: d bf16 x16, exact] [m f16 x16: Q4_1, Q5_1] then Q8_0: [q int8 32 k x 16]
                  else [nibbles 16 x 16 bytes] [high bits 4 x 16 bytes: Q5_0, Q5_1]
     Q4_K, Q5_K   [d f16 x16] [dmin f16 x16], then 8 groups of 32 k: [sc u8 x16] [m u8 x16] [nibbles]
                  [high bits 4 x 16 bytes: Q5_K]
     Q6_K         [d f16 x16], then 8 groups of 32 k: [sc int8 x16 for k 0-15] [sc for k 16-31] [nibbles]
                  [high bits 8 x 16 bytes]
   Nibbles: byte j*16 + c holds q of k = j (low nibble) and k = 16 + j (high nibble) of column c. High bits (bit 4
   of a 5-bit q): byte j*16 + c, bit i for k = j + 4i; (bits 4-5 of Q6_K's 6-bit q): bits 2i, 2i+1 for k = j + 8i.
   So a k row's 16 high parts are one 16-byte load, a shift by a constant and a mask; and a run of 4 k (j = 0..3 at
   one i) is 64 contiguous bytes of nibbles and 64 of high bits, which AVX-512 with VBMI and GFNI decodes at once
   (run_decode). Bytes per weight: the file's (Q4_K, Q5_K: +1/8 bit for their sc/m as bytes; MXFP4: +1/4 bit for d as
   a bfloat16: its records are then Q4_0's 288 bytes, whose 32-byte halves of a run each lie in one cache line, see
   load64; with the file's 272, half the records' would straddle two).

   Steps of up to BLOCK_REG_ROWS rows expand each k row of a panel pair in registers, straight into the FMA chains
   (reg_kernel), prefetching the panels a few groups ahead. Larger steps expand a panel pair over up to BLOCK_K k
   (all of K for most models) into a per-thread float32 scratch (at most 256 KB: L2, reused by every row of the tile)
   and run the float32 kernel over it, continuing each output's FMA chain from piece to piece (gemm_core_from_f32).
   No float32 copy of the weight is ever kept. */
#ifndef SWITCHYARD_GEMM_BLOCKS_H
#define SWITCHYARD_GEMM_BLOCKS_H

enum { BT_Q4_0 = 1, BT_Q4_1, BT_Q5_0, BT_Q5_1, BT_Q8_0, BT_Q4_K, BT_Q5_K, BT_Q6_K, BT_BF16, BT_F16, BT_MXFP4 };
/* Bytes of a record of each type (index: BT_*) and k per record. */
static const int BT_RECORD[] = {0, 288, 320, 352, 384, 544, 2368, 2880, 3360, 32, 32, 288};
static const int BT_RK[] = {0, 32, 32, 32, 32, 32, 256, 256, 256, 1, 1, 32};
/* MXFP4's int8 values by nibble, a byte permute's table (gguf_blocks.MXFP4_VALUES: E2M1 doubled, ggml's). */
static inline __m128i mxfp4_table(void) {
    return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}
static inline int64_t bt_panel_bytes(int t, int K) { return (int64_t)K / BT_RK[t] * BT_RECORD[t]; }

/* 16 float32 lanes: one 512-bit register, or two 256-bit ones without AVX-512. */
#ifdef __AVX512F__
typedef __m512 v16;
static inline v16 v16_f16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
static inline v16 v16_u8(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
static inline v16 v16_u8_at(const uint8_t* p) { return v16_u8(_mm_load_si128((const __m128i*)p)); }
static inline v16 v16_i8(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
static inline v16 v16_i8_at(const uint8_t* p) { return v16_i8(_mm_load_si128((const __m128i*)p)); }
static inline v16 v16_bf16(const uint8_t* p) {  /* 16 bfloat16: exact, by a shift */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
static inline v16 v16_fma(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
static inline v16 v16_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
static inline v16 v16_set1(float f) { return _mm512_set1_ps(f); }
static inline v16 v16_neg(v16 a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
static inline void v16_store(float* p, v16 a) { _mm512_storeu_ps(p, a); }
#else
typedef struct { __m256 lo, hi; } v16;
static inline v16 v16_f16(const uint8_t* p) {
    v16 r = {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)),
             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 16)))};
    return r;
}
static inline v16 v16_u8(__m128i b) {
    v16 r = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)),
             _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)))};
    return r;
}
static inline v16 v16_u8_at(const uint8_t* p) {  /* two vpmovzxbd loads: no shuffle for the upper 8 */
    v16 r = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p))),
             _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8))))};
    return r;
}
static inline v16 v16_i8(__m128i b) {
    v16 r = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
             _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))};
    return r;
}
static inline v16 v16_i8_at(const uint8_t* p) {
    v16 r = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p))),
             _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8))))};
    return r;
}
static inline __m256 f8_bf16(const uint8_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
static inline v16 v16_bf16(const uint8_t* p) { v16 r = {f8_bf16(p), f8_bf16(p + 16)}; return r; }
static inline v16 v16_fma(v16 a, v16 b, v16 c) {
    v16 r = {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
    return r;
}
static inline v16 v16_mul(v16 a, v16 b) { v16 r = {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; return r; }
static inline v16 v16_set1(float f) { v16 r = {_mm256_set1_ps(f), _mm256_set1_ps(f)}; return r; }
static inline v16 v16_neg(v16 a) {
    const __m256 s = _mm256_set1_ps(-0.0f);
    v16 r = {_mm256_xor_ps(a.lo, s), _mm256_xor_ps(a.hi, s)};
    return r;
}
static inline void v16_store(float* p, v16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
#endif
static inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128((const __m128i*)p); }
/* ---- steps of a few rows: the weights expanded in registers, k row by k row, straight into the FMA chains ---- */
/* A 32-k group of a panel, decoded: rows k < 16 are fma(a0, q, b0), k >= 16 fma(a1, q, b1); q from nibbles (and high
   bits; MXFP4: the table's int8 value of the nibble) or Q8_0's bytes. */
typedef struct { v16 a0, b0, a1, b1; const uint8_t *nib, *q8, *high; } group_view;
static inline __attribute__((always_inline)) void group_decode(const int t, const uint8_t* panel, int gi,
                                                               group_view* v) {
    v->q8 = v->high = v->nib = 0;
    if (t == BT_MXFP4) {  /* d * v: d from its bfloat16, v the table's value of the nibble (run_decode) */
        const uint8_t* g = panel + (int64_t)gi * BT_RECORD[t];
        v->a0 = v->a1 = v16_bf16(g);
        v->b0 = v->b1 = v16_set1(-0.0f);  /* a zero's sign too, as Q8_0 */
        v->nib = g + 32;
        return;
    }
    if (t <= BT_Q8_0) {
        const uint8_t* g = panel + (int64_t)gi * BT_RECORD[t];
        v->a0 = v->a1 = v16_f16(g);
        if (t == BT_Q8_0) { v->b0 = v->b1 = v16_set1(-0.0f); v->q8 = g + 32; return; }  /* d * q, a zero's sign too */
        const int with_m = t == BT_Q4_1 || t == BT_Q5_1;
        v->b0 = v->b1 = with_m ? v16_f16(g + 32) : v16_mul(v->a0, v16_set1(t == BT_Q4_0 ? -8.0f : -16.0f));
        v->nib = g + (with_m ? 64 : 32);
        if (t == BT_Q5_0 || t == BT_Q5_1) v->high = v->nib + 256;
        return;
    }
    const uint8_t* rec = panel + (int64_t)(gi / 8) * BT_RECORD[t];
    const v16 d = v16_f16(rec);
    if (t == BT_Q6_K) {
        const uint8_t* g = rec + 32 + (gi % 8) * 416;
        const v16 off = v16_set1(-32.0f);
        v->a0 = v16_mul(d, v16_i8(load16(g)));
        v->a1 = v16_mul(d, v16_i8(load16(g + 16)));
        v->b0 = v16_mul(v->a0, off);
        v->b1 = v16_mul(v->a1, off);
        v->nib = g + 32;
        v->high = g + 288;
        return;
    }
    const uint8_t* g = rec + 64 + (gi % 8) * (t == BT_Q5_K ? 352 : 288);
    v->a0 = v->a1 = v16_mul(d, v16_u8(load16(g)));
    v->b0 = v->b1 = v16_neg(v16_mul(v16_f16(rec + 32), v16_u8(load16(g + 16))));
    v->nib = g + 32;
    if (t == BT_Q5_K) v->high = g + 288;
}
/* AVX-512 with VBMI and GFNI: a run of 4 k rows (k = 8 c + 4 h + j, j 0..3) of the 4- to 6-bit types is decoded at
   once, its 4 x 16 q in one 512-bit register as clean bytes (run_decode: the nibbles, shifted down for c >= 2; the
   high bits moved to bits 4 (Q5) or 4-5 (Q6_K) of each byte by one gf2p8affine and merged by one vpternlog), then each
   row's 16 bytes go to 32-bit lanes by one vpermb and to float by one conversion (MXFP4: one vpshufb of the run
   makes its nibbles int8 values, and each row's go to the top byte of their lanes, sign-extended by one shift). Far
   fewer instructions a weight than row by row, and a 5- or 6-bit q costs about what a nibble does. */
#if defined(__AVX512VBMI__) && defined(__AVX512BW__) && defined(__GFNI__)
#define BLOCK_RUNS 1
typedef __m512i run_view;
/* 64 bytes at p as two 32-byte halves: in most records a run's bytes start half way into a cache line, and one
   64-byte load across two lines stalled the weight stream (a Q5_0 step 1.5x slower at K = 576, streamed from
   memory), where halves within one line each do not. */
static inline __attribute__((always_inline)) __m512i load64(const uint8_t* p) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)p)),
                              _mm256_loadu_si256((const __m256i*)(p + 32)), 1);
}
static inline __attribute__((always_inline)) void run_decode(const int t, const group_view* v, const int c,
                                                             const int h, run_view* r) {
    if (t == BT_Q8_0) return;
    const __m512i b = load64(v->nib + 16 * (8 * (c & 1) + 4 * h));
    const __m512i n = c >= 2 ? _mm512_srli_epi16(b, 4) : b;  /* bits 0-3: the nibbles of the run's 4 k */
    /* gf2p8affine: bit o of each byte is the parity of the byte and byte 7 - o of the matrix: here, bit 4 (and 5) of
       the high-bits byte take bit 2 c + h of byte j (Q5) or bits 2 c, 2 c + 1 of byte 4 h + j (Q6_K); others 0 */
    long long m = 0;
    const uint8_t* high = v->high;
    if (t == BT_Q5_0 || t == BT_Q5_1 || t == BT_Q5_K) m = (1LL << (2 * c + h)) << 24;
    else if (t == BT_Q6_K) m = (1LL << (2 * c)) << 24 | (1LL << (2 * c + 1)) << 16, high += 64 * h;
    if (m) {
        const __m512i hs = _mm512_gf2p8affine_epi64_epi8(load64(high), _mm512_set1_epi64(m), 0);
        *r = _mm512_ternarylogic_epi32(n, hs, _mm512_set1_epi8(0x0F), 0xE4);  /* bits 0-3 from n, 4-7 from hs */
    } else {
        *r = _mm512_and_si512(n, _mm512_set1_epi8(0x0F));
    }
    if (t == BT_MXFP4) *r = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(mxfp4_table()), *r);  /* the int8 values */
}
/* vpermb indices: bytes 4 c .. 4 c + 3 of lane c take byte 16 j + c (row j of a run): masked to byte 4 c, its q
   zero-extended; to byte 4 c + 3, shifted down arithmetically, MXFP4's int8 value sign-extended. */
static const uint8_t RUN_ROW_INDEX[4][64] __attribute__((aligned(64))) = {
#define RB(j, c) 16 * j + c, 16 * j + c, 16 * j + c, 16 * j + c
#define RI(j) {RB(j, 0), RB(j, 1), RB(j, 2), RB(j, 3), RB(j, 4), RB(j, 5), RB(j, 6), RB(j, 7), RB(j, 8), RB(j, 9), \
               RB(j, 10), RB(j, 11), RB(j, 12), RB(j, 13), RB(j, 14), RB(j, 15)}
    RI(0), RI(1), RI(2), RI(3)
#undef RI
#undef RB
};
#else
/* Without VBMI and GFNI (AVX2 CPUs; AVX-512 before Ice Lake): the run's 4 x 16 q are still made at once, 32 bytes (2 k
   rows) an instruction, and stored; each row is then widened straight from that store (vpmovzxbd's load form). Row by
   row, a 5-bit q took 7 instructions for its 16 bytes before widening (load, shift, mask the nibbles; load, shift,
   mask the high bits; or), and AVX2 a shuffle more for the upper 8; here that is 3.5 a row, and 1.5-2 for the
   4-bit types. A 1-row step from cache (bench/gguf_stream_bench.c, best of 9), against Q4_1's time: AVX-512 without
   VBMI Q5_0 1.20 -> 1.11, Q6_K 1.24 -> 1.15; AVX2 Q5_0 1.29 -> 1.22, Q5_1 1.95 -> 1.21. */
typedef struct { uint8_t q[64] __attribute__((aligned(32))); } run_view;
/* Bits moved left by s (right for s < 0) within each byte's reach: 16-bit shifts, whose spill is masked after. */
static inline __attribute__((always_inline)) __m256i shift_bits(__m256i v, const int s) {
    return s > 0 ? _mm256_slli_epi16(v, s) : s < 0 ? _mm256_srli_epi16(v, -s) : v;
}
static inline __attribute__((always_inline)) void run_decode(const int t, const group_view* v, const int c,
                                                             const int h, run_view* r) {
    if (t == BT_Q8_0) return;
    for (int half = 0; half < 2; half++) {  /* rows j = 2 half, 2 half + 1 */
        const __m256i b = _mm256_loadu_si256((const __m256i*)(v->nib + 16 * (8 * (c & 1) + 4 * h) + 32 * half));
        __m256i q = _mm256_and_si256(c >= 2 ? _mm256_srli_epi16(b, 4) : b, _mm256_set1_epi8(0x0F));
        if (t == BT_Q6_K)  /* bits 2c, 2c+1 of byte (4 h + j) to bits 4, 5 */
            q = _mm256_or_si256(q, _mm256_and_si256(
                shift_bits(_mm256_loadu_si256((const __m256i*)(v->high + 64 * h + 32 * half)), 4 - 2 * c),
                _mm256_set1_epi8(0x30)));
        else if (t == BT_Q5_0 || t == BT_Q5_1 || t == BT_Q5_K)  /* bit 2 c + h of byte j to bit 4 */
            q = _mm256_or_si256(q, _mm256_and_si256(
                shift_bits(_mm256_loadu_si256((const __m256i*)(v->high + 32 * half)), 4 - (2 * c + h)),
                _mm256_set1_epi8(0x10)));
        else if (t == BT_MXFP4)  /* the int8 values */
            q = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(mxfp4_table()), q);
        _mm256_store_si256((__m256i*)(r->q + 32 * half), q);
    }
}
#endif
/* Row k = 8 c + 4 h + j (c 0..3, h 0..1, j 0..3) of a decoded group (r: its run, from run_decode): the float32
   weights of its 16 columns. c and h are constants where it is inlined (the shifts of the high bits), j need not be. */
static inline __attribute__((always_inline)) v16 group_row(const int t, const group_view* v, const run_view* r,
                                                           const int c, const int h, int j) {
    const int k = 8 * c + 4 * h + j;
    if (t == BT_Q8_0) return v16_fma(v->a0, v16_i8(load16(v->q8 + 16 * k)), v->b0);
#ifdef BLOCK_RUNS
    const __m512i idx = _mm512_load_si512((const void*)RUN_ROW_INDEX[j]);
    if (t == BT_MXFP4) {
        const __m512i top = _mm512_maskz_permutexvar_epi8(0x8888888888888888ULL, idx, *r);
        return v16_fma(v->a0, _mm512_cvtepi32_ps(_mm512_srai_epi32(top, 24)), v->b0);
    }
    const __m512 qf = _mm512_cvtepi32_ps(_mm512_maskz_permutexvar_epi8(0x1111111111111111ULL, idx, *r));
    return c >= 2 ? v16_fma(v->a1, qf, v->b1) : v16_fma(v->a0, qf, v->b0);
#else
    (void)k;
    const v16 qf = t == BT_MXFP4 ? v16_i8_at(r->q + 16 * j) : v16_u8_at(r->q + 16 * j);
    return c >= 2 ? v16_fma(v->a1, qf, v->b1) : v16_fma(v->a0, qf, v->b0);
#endif
}
/* F(c, h) for the 8 runs of 4 k of a group, in k order. */
#define GROUP_RUNS(F) F(0, 0) F(0, 1) F(1, 0) F(1, 1) F(2, 0) F(2, 1) F(3, 0) F(3, 1)
/* Group gi (k = 32 gi .. 32 gi + 31) of a panel of type t, as float32 w[32][16]. */
static inline __attribute__((always_inline)) void expand_group_t(const int t, const uint8_t* panel, int gi, float* w) {
    group_view g;
    group_decode(t, panel, gi, &g);
#define EXPAND_RUN(c, h) {                                                                                          \
        run_view r;                                                                                                 \
        run_decode(t, &g, c, h, &r);                                                                                \
        for (int j = 0; j < 4; j++) v16_store(w + 16 * (8 * c + 4 * h + j), group_row(t, &g, &r, c, h, j));       \
    }
    GROUP_RUNS(EXPAND_RUN)
#undef EXPAND_RUN
}
/* Groups g0 .. g0 + n - 1 of a panel, one after the other in w (the type's switch and constants once a run). */
static void expand_groups(int t, const uint8_t* panel, int g0, int n, float* w) {
    switch (t) {
#define EXPAND_CASE(T) case T: for (int g = 0; g < n; g++) expand_group_t(T, panel, g0 + g, w + g * 32 * 16); break;
        EXPAND_CASE(BT_Q4_0) EXPAND_CASE(BT_Q4_1) EXPAND_CASE(BT_Q5_0) EXPAND_CASE(BT_Q5_1) EXPAND_CASE(BT_Q8_0)
        EXPAND_CASE(BT_Q4_K) EXPAND_CASE(BT_Q5_K) EXPAND_CASE(BT_Q6_K) EXPAND_CASE(BT_MXFP4)
#undef EXPAND_CASE
    }
}

#ifndef BLOCK_PREFETCH
#define BLOCK_PREFETCH 4
#endif
#ifdef __AVX512F__
static inline v16 v16_bcast(const float* p) { return _mm512_set1_ps(*p); }
static inline v16 v16_zero(void) { return _mm512_setzero_ps(); }
#define REG_ROWS 8  /* rows per register kernel: 2 panels x 8 rows of accumulators, 16 of the 32 registers */
#else
static inline v16 v16_bcast(const float* p) { v16 r = {_mm256_broadcast_ss(p), _mm256_broadcast_ss(p)}; return r; }
static inline v16 v16_zero(void) { v16 r = {_mm256_setzero_ps(), _mm256_setzero_ps()}; return r; }
#define REG_ROWS 2  /* 2 panels x 2 rows: 8 of the 16 registers accumulate */
#endif
/* Groups ahead that a panel's bytes are prefetched. Q8_0 (1.06 bytes a weight, the least arithmetic of all) goes twice
   as far and to L2 only: prefetches to L1 are as many as L1 can have outstanding misses, about 15 GB/s on one thread
   here, and Q8_0 needs more than that to keep up with its arithmetic. 1-row Q8_0 step streamed on one thread
   (bench/gguf_stream_bench.c): 0.076-0.080 -> 0.057-0.061 ns a weight, 18 GB/s, the plain read's rate; the other
   types were no faster that way. */
#define PREFETCH_AHEAD(t) ((t) == BT_Q8_0 ? 2 * BLOCK_PREFETCH : BLOCK_PREFETCH)
/* The bytes of group gi (32 k; a K-quant record's share) of panels w0 and w1 (w1 == w0 with `one`), prefetched; past
   the panels' end (pstride bytes each), the next pair's (2 pstride on), which come next. */
static inline __attribute__((always_inline)) void prefetch_group(const int t, const uint8_t* w0, const uint8_t* w1,
                                                                 int one, int64_t pstride, int gi) {
    const int64_t share = BT_RECORD[t] / (BT_RK[t] / 32), end = (gi + 1) * share;
    for (int64_t at = gi * share & ~(int64_t)63; at < end; at += 64) {
        const int64_t to = at < pstride ? at : at + pstride;
        if (t == BT_Q8_0) {
            _mm_prefetch((const char*)(w0 + to), _MM_HINT_T1);
            if (!one) _mm_prefetch((const char*)(w1 + to), _MM_HINT_T1);
        } else {
            _mm_prefetch((const char*)(w0 + to), _MM_HINT_T0);
            if (!one) _mm_prefetch((const char*)(w1 + to), _MM_HINT_T0);
        }
    }
}
/* R rows of x against a panel pair of type t (w1: the second panel, pstride bytes on, or w0 again with `one`: only
   the first is stored) over the whole of K, the weights expanded in registers: every output's FMA chain runs
   k = 0..K-1 as in the float32 kernel.
   The panels are short streams (5-15 KB at SmolLM2's widths) that the hardware prefetcher hardly ramps up on, so
   each group's bytes are prefetched PREFETCH_AHEAD groups ahead, and the last groups' reach the next pair's first
   ones: both of its panels. (Reaching `at` bytes on from each panel instead, the first panel's reach fell on the
   second, already read, and the next pair's second panel started cold: its first groups read at memory latency. A
   1-row step streamed from memory on one thread went from 0.105 to 0.075 ns a weight for Q5_0, 0.092 to 0.071 for
   Q4_1, against 0.060 from cache.) */
static inline __attribute__((always_inline)) void reg_kernel(const int t, const int R, const float* x, int64_t ldx,
                                                             const uint8_t* w0, const uint8_t* w1, int one,
                                                             int64_t pstride, float* y, int64_t ldy, int K) {
    v16 acc[REG_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = v16_zero();
    for (int gi = 0; gi < K / 32; gi++) {
        if (BLOCK_PREFETCH) prefetch_group(t, w0, w1, one, pstride, gi + PREFETCH_AHEAD(t));
        group_view g0, g1;
        group_decode(t, w0, gi, &g0);
        group_decode(t, w1, gi, &g1);
        const float* xk = x + gi * 32;
#define REG_RUN(c, h) {                                                                                             \
        run_view r0, r1;                                                                                            \
        run_decode(t, &g0, c, h, &r0);                                                                              \
        run_decode(t, &g1, c, h, &r1);                                                                              \
        _Pragma("GCC unroll 1")                                                                                     \
        for (int j = 0; j < 4; j++) {                                                                               \
            const v16 u0 = group_row(t, &g0, &r0, c, h, j), u1 = group_row(t, &g1, &r1, c, h, j);                 \
            for (int r = 0; r < R; r++) {                                                                           \
                const v16 xb = v16_bcast(xk + r * ldx + 8 * c + 4 * h + j);                                         \
                acc[r][0] = v16_fma(xb, u0, acc[r][0]);                                                             \
                acc[r][1] = v16_fma(xb, u1, acc[r][1]);                                                             \
            }                                                                                                       \
        }                                                                                                           \
    }
        GROUP_RUNS(REG_RUN)  /* k = 0..31 in order */
#undef REG_RUN
    }
    for (int r = 0; r < R; r++) {
        v16_store(y + r * ldy, acc[r][0]);
        if (!one) v16_store(y + r * ldy + 16, acc[r][1]);
    }
}
/* The register kernel of type t for R rows over NB panels (pairs; a last odd panel as a pair with itself). */
static inline __attribute__((always_inline)) void reg_rows_t(const int t, const int R, const float* x, int64_t ldx,
                                                             const uint8_t* wq, int64_t pstride, float* y,
                                                             int64_t ldy, int NB, int K) {
    for (int gi = 0; gi < PREFETCH_AHEAD(t); gi++)  /* the first pair's first groups */
        prefetch_group(t, wq, wq + pstride, NB == 1, pstride, gi);
    for (int nb = 0; nb < NB; nb += 2) {
        const int one = nb + 1 == NB;
        reg_kernel(t, R, x, ldx, wq + nb * pstride, wq + (nb + !one) * pstride, one, pstride, y + nb * 16, ldy, K);
    }
}
static void reg_rows(int t, int r, const float* x, int64_t ldx, const uint8_t* wq, int64_t pstride, float* y,
                     int64_t ldy, int NB, int K) {
#define REG_CASE(T, R) case T: reg_rows_t(T, R, x, ldx, wq, pstride, y, ldy, NB, K); break;
#define REG_TYPES(R) switch (t) { REG_CASE(BT_Q4_0, R) REG_CASE(BT_Q4_1, R) REG_CASE(BT_Q5_0, R) REG_CASE(BT_Q5_1, R) \
                                  REG_CASE(BT_Q8_0, R) REG_CASE(BT_Q4_K, R) REG_CASE(BT_Q5_K, R) REG_CASE(BT_Q6_K, R) \
                                  REG_CASE(BT_MXFP4, R) }
    if (r == 1) REG_TYPES(1)
    else if (r == 2) REG_TYPES(2)
#if REG_ROWS > 2
    else if (r == 3) REG_TYPES(3)
    else if (r == 4) REG_TYPES(4)
    else if (r == 5) REG_TYPES(5)
    else if (r == 6) REG_TYPES(6)
    else if (r == 7) REG_TYPES(7)
    else if (r == 8) REG_TYPES(8)
#endif
#undef REG_TYPES
#undef REG_CASE
}
/* A step of M rows in row blocks of REG_ROWS, then the rest in one block (AVX-512: any 1..8 rows, so a speculative
   verification's 3, 5 or 7 rows expand the weights once) or halving blocks (AVX2: 2, 1). Each block expands the
   weights again. */
static void gemm_core_blocks_reg(int t, const float* x, int64_t ldx, const uint8_t* wq, int64_t pstride, float* y,
                                 int64_t ldy, int M, int NB, int K) {
    for (int m = 0, r; m < M; m += r) {
#if REG_ROWS > 2
        r = M - m < REG_ROWS ? M - m : REG_ROWS;
#else
        for (r = REG_ROWS; r > M - m; r /= 2) {}
#endif
        reg_rows(t, r, x + m * ldx, ldx, wq, pstride, y + m * ldy, ldy, NB, K);
    }
}

/* A thread's scratch of at least `need` bytes (64-byte aligned), grown and kept between calls; NULL: out of memory. */
typedef struct { void* p; size_t capacity; } thread_scratch;
static void* scratch_reserve(thread_scratch* s, size_t need) {
    if (need > s->capacity) {
        free(s->p);
        s->p = aligned_alloc(64, (need + 63) / 64 * 64);
        s->capacity = s->p ? need : 0;
    }
    return s->p;
}
static __thread thread_scratch blocks_scratch;

#define BLOCK_REG_ROWS 16  /* steps of up to this many rows: the register kernels (gemm_core_blocks_reg) */
/* A piece of the scratch: 2 panels x 2048 k (the float32 kernel's KC), so the float32 kernel sees a panel pair over
   all of K as it would on float32 weights, and y is not reloaded and stored again for every 256 k. Against 16 panels
   x 256 k (one thread, Q4_1, SmolLM2's layers): 32-row steps 4.5% and 512-row prefill steps 2% less time. */
#define BLOCK_PANELS 2
#define BLOCK_K 2048
/* y[M, NB * 16] = x[M, K] @ W.T for W as NB panels of type t (any BT_*), `pstride` bytes apart: a piece
   of panels and k expanded into the scratch, then the float32 kernel over it, continuing the FMA chains (steps of
   up to BLOCK_REG_ROWS rows: in registers). -1: out of memory for the scratch. */
static int gemm_core_blocks(int t, const float* x, int64_t ldx, const uint8_t* wq, int64_t pstride, float* y,
                            int64_t ldy, int M, int NB, int K) {
    const int wide16 = t == BT_BF16 || t == BT_F16;
    if (wide16 && M <= BLOCK_REG_ROWS) {  /* widened as the float32 kernel loads them */
        if (t == BT_BF16) gemm_core_bf16w(x, ldx, (const uint16_t*)wq, y, ldy, M, NB, K);
        else gemm_core_f16w(x, ldx, (const uint16_t*)wq, y, ldy, M, NB, K);
        return 0;
    }
    if (M <= BLOCK_REG_ROWS) {
        gemm_core_blocks_reg(t, x, ldx, wq, pstride, y, ldy, M, NB, K);
        return 0;
    }
    const int pmax = BLOCK_PANELS, kmax = BLOCK_K;
    float* const w = (float*)scratch_reserve(&blocks_scratch, sizeof(float) * (size_t)pmax * kmax * 16);
    if (!w) return -1;
    for (int n0 = 0; n0 < NB; n0 += pmax) {
        const int pb = NB - n0 < pmax ? NB - n0 : pmax;
        for (int k0 = 0; k0 < K; k0 += kmax) {
            const int kc = K - k0 < kmax ? K - k0 : kmax;
            for (int p = 0; p < pb; p++) {
                float* wp = w + (int64_t)p * kc * 16;
                if (wide16) {  /* [K][16] 16-bit values: widened once for all the rows of the tile */
                    const uint16_t* h = (const uint16_t*)(wq + (n0 + p) * pstride) + (int64_t)k0 * 16;
                    for (int i = 0; i < kc * 16; i += 8)
                        _mm256_storeu_ps(wp + i, t == BT_BF16 ? LOADW_bf16w(h + i) : LOADW_f16w(h + i));
                } else {
                    expand_groups(t, wq + (n0 + p) * pstride, k0 / 32, kc / 32, wp);
                }
                if (n0 + pmax + p < NB) {  /* the next pair's bytes of this piece, into L2 */
                    const uint8_t* nx = wq + (n0 + pmax + p) * pstride + (int64_t)k0 / BT_RK[t] * BT_RECORD[t];
                    const int64_t nbytes = (int64_t)kc / BT_RK[t] * BT_RECORD[t];
                    for (int64_t at = 0; at < nbytes; at += 64) _mm_prefetch((const char*)(nx + at), _MM_HINT_T1);
                }
            }
            gemm_core_from_f32(x + k0, ldx, w, y + n0 * 16, ldy, M, pb, kc, k0 > 0);
        }
    }
    return 0;
}
#endif
