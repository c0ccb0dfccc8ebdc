/* The paged attention kernels, once per pair of types: paged_attention.c includes this header with TYPE_SUFFIX (the
   activations: queries, new keys and values, outputs) f32 or bf16, and CACHE_SUFFIX (the KV cache) f32 or bf16.
   SFX(T) is the activations' type, CFX(T) the cache's. No include guard: it is meant to be included once per pair
   (type_suffix.h). */
#if ZVEC
/* Scores of 8 consecutive cached rows against one query head of size 64: 8 independent FMA chains of 16 lanes, the
   two halves of each added, then a transposing horizontal add gives the 8 sums in one register. */
static inline __m256 SFX(dot8x64)(const float* q, const CFX(T)* k, int64_t row) {
    __m512 a[8];
    for (int t = 0; t < 8; t++) a[t] = _mm512_setzero_ps();
    for (int j = 0; j < 64; j += 16) {
        const __m512 qj = _mm512_loadu_ps(q + j);
        for (int t = 0; t < 8; t++) a[t] = _mm512_fmadd_ps(qj, CFX(loadz)(k + t * row + j), a[t]);
    }
    __m256 h[8];
    for (int t = 0; t < 8; t++)
        h[t] = _mm256_add_ps(_mm512_castps512_ps256(a[t]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[t]), 1)));
    return sum8x8(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
}
#elif VEC
/* Scores of 8 consecutive cached rows against one query head of size 64: 8 independent FMA chains, then a
   transposing horizontal add gives the 8 sums in one register. */
static inline __m256 SFX(dot8x64)(const float* q, const CFX(T)* k, int64_t row) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int j = 0; j < 64; j += 8) {
        __m256 qj = _mm256_loadu_ps(q + j);
        a0 = _mm256_fmadd_ps(qj, CFX(load8)(k + j), a0);
        a1 = _mm256_fmadd_ps(qj, CFX(load8)(k + row + j), a1);
        a2 = _mm256_fmadd_ps(qj, CFX(load8)(k + 2 * row + j), a2);
        a3 = _mm256_fmadd_ps(qj, CFX(load8)(k + 3 * row + j), a3);
        a4 = _mm256_fmadd_ps(qj, CFX(load8)(k + 4 * row + j), a4);
        a5 = _mm256_fmadd_ps(qj, CFX(load8)(k + 5 * row + j), a5);
        a6 = _mm256_fmadd_ps(qj, CFX(load8)(k + 6 * row + j), a6);
        a7 = _mm256_fmadd_ps(qj, CFX(load8)(k + 7 * row + j), a7);
    }
    return sum8x8(a0, a1, a2, a3, a4, a5, a6, a7);
}
#endif

static inline float SFX(dot)(const float* q, const CFX(T)* k, int D) {
#if VEC
    if (D % 8 == 0) {
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < D; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), CFX(load8)(k + j), acc);
        return hsum8(acc);
    }
#endif
    float s = 0.0f;
    for (int j = 0; j < D; j++) s += q[j] * CFX(load1)(k + j);
    return s;
}

#if ZVEC
/* acc (4 query rows of 64 floats) = acc * alpha + sum over t < kn of p[t * ldp + r] * v row t (value rows `row`
   elements apart): the tile kernel's output rows, rescaled for their new maximum and summed in registers. */
static inline void SFX(values4)(float* acc, const float* alpha, const float* p, int ldp, const CFX(T)* v, int64_t row,
                               int kn) {
    __m512 o[4][4];
    for (int r = 0; r < 4; r++) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        for (int c = 0; c < 4; c++) o[r][c] = _mm512_mul_ps(a, _mm512_loadu_ps(acc + r * 64 + 16 * c));
    }
    for (int t = 0; t < kn; t++) {
        const CFX(T)* vt = v + t * row;
        const __m512 v0 = CFX(loadz)(vt), v1 = CFX(loadz)(vt + 16), v2 = CFX(loadz)(vt + 32), v3 = CFX(loadz)(vt + 48);
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
   its position and the cache, not on the tile it is in. Under a sliding window (window > 0) a row's keys before
   window_start are masked the same way, and the pass begins at the block of the first row's window; scores are
   soft-capped (softcap_all) when softcap > 0. qrot: the tile's rotated queries [n][H][64]; scratch: tile64_scratch
   floats. out: [n, H, 64]. */
static void SFX(tile64)(const CFX(T)* kc, const CFX(T)* vc, const int32_t* table, int p0, int n, SFX(T)* out,
                       int H, int KVH, int BS, float scale, int window, float softcap, const float* sinks,
                       const float* qrot, float* scratch) {
    const int G = H / KVH, QR = n * G, QRP = (int)tile64_qrp(n, G), last = p0 + n - 1;
    const int64_t row = (int64_t)KVH * 64;
    float *qt = scratch, *acc = qt + (size_t)QRP * 64, *pb = acc + (size_t)QRP * 64, *m = pb + (size_t)QRP * TILE_KEYS;
    float *l = m + QRP, *alpha = l + QRP, *kconv = alpha + QRP;
    int32_t pos[QRP], lop[QRP];  /* each query row's position and its window's first */
    for (int qi = 0; qi < QRP; qi++) {
        pos[qi] = qi < QR ? p0 + qi / G : -1;  /* padding rows see no key */
        lop[qi] = qi < QR ? window_start(pos[qi], window) : 0;
    }
    const int first = window_start(p0, window) / BS * BS;
    for (int g = 0; g < KVH; g++) {
        for (int qi = 0; qi < QRP; qi++) {
            const float* q = qrot + ((int64_t)(qi / G) * H + g * G + qi % G) * 64;
            for (int d = 0; d < 64; d++) qt[d * QRP + qi] = qi < QR ? q[d] * scale : 0.0f;
            m[qi] = -3.0e38f; l[qi] = 0.0f;
        }
        memset(acc, 0, sizeof(float) * (size_t)QRP * 64);
        for (int t0 = first; t0 <= last; t0 += BS) {
            const int64_t base = (int64_t)table[t0 / BS] * BS * row + (int64_t)g * 64;
            if (t0 + BS <= last) {
                const int64_t next = (int64_t)table[t0 / BS + 1] * BS * row;
                prefetch_block(kc + next, sizeof(CFX(T)) * BS * row);
                prefetch_block(vc + next, sizeof(CFX(T)) * BS * row);
            }
            for (int tt = 0; tt < BS && t0 + tt <= last; tt += TILE_KEYS) {
                const int k0 = t0 + tt;  /* the group's first key position */
                const int kn = last - k0 + 1 < TILE_KEYS ? (BS - tt < last - k0 + 1 ? BS - tt : last - k0 + 1)
                                                         : (BS - tt < TILE_KEYS ? BS - tt : TILE_KEYS);
                const float* kp[TILE_KEYS];
                CFX(key_rows)(kc + base + (int64_t)tt * row, row, kn, kconv, kp);
                for (int c0 = 0; c0 < QRP; c0 += 48) {
                    const int nc = (QRP - c0) / 16 < 3 ? (QRP - c0) / 16 : 3;
                    /* no row of these chunks sees the keys: past the last row's position, before the first's window */
                    if (last_pos(pos, c0, c0 + nc * 16, QR) < k0 || lop[c0] > k0 + kn - 1) continue;
                    scores16(nc, kp, kn, qt + c0, QRP, pb + c0, QRP);
                    if (softcap > 0.0f)
                        for (int t = 0; t < kn; t++) softcap_all(pb + t * QRP + c0, nc * 16, softcap);
                    for (int c = c0; c < c0 + nc * 16; c += 16) {  /* the softmax of 16 query rows, in the lanes */
                        const __m512i pv = _mm512_loadu_si512(pos + c), lv = _mm512_loadu_si512(lop + c);
                        __mmask16 vis[TILE_KEYS];
                        const __m512 mold = _mm512_loadu_ps(m + c);
                        __m512 mx = mold;
                        for (int t = 0; t < kn; t++) {
                            const __m512i kv = _mm512_set1_epi32(k0 + t);
                            vis[t] = _mm512_cmp_epi32_mask(kv, pv, _MM_CMPINT_LE) &
                                     _mm512_cmp_epi32_mask(kv, lv, _MM_CMPINT_NLT);
                            mx = _mm512_mask_max_ps(mx, vis[t], mx, _mm512_loadu_ps(pb + t * QRP + c));
                        }
                        const __m512 a = exp16(_mm512_sub_ps(mold, mx));
                        __m512 sum = _mm512_setzero_ps();
                        for (int t = 0; t < kn; t++) {
                            const __m512 st = _mm512_loadu_ps(pb + t * QRP + c);
                            const __m512 p = _mm512_maskz_mov_ps(vis[t], exp16(_mm512_sub_ps(st, mx)));
                            _mm512_storeu_ps(pb + t * QRP + c, SFX(roundz)(p));  /* the sum keeps p unrounded */
                            sum = _mm512_add_ps(sum, p);
                        }
                        _mm512_storeu_ps(l + c, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(l + c), a), sum));
                        _mm512_storeu_ps(m + c, mx);
                        _mm512_storeu_ps(alpha + c, a);
                    }
                }
                for (int q0 = 0; q0 < QRP; q0 += 4)
                    /* rows that see none of these keys: unchanged */
                    if (last_pos(pos, q0, q0 + 4, QR) >= k0 && lop[q0] <= k0 + kn - 1)
                        SFX(values4)(acc + (int64_t)q0 * 64, alpha + q0, pb + q0, QRP, vc + base + (int64_t)tt * row,
                                    row, kn);
            }
        }
        for (int qi = 0; qi < QR; qi++) {
            const float inv = out_scale(m[qi], l[qi], sinks, g * G + qi % G);
            SFX(T)* o = out + ((int64_t)(qi / G) * H + g * G + qi % G) * 64;
            for (int d = 0; d < 64; d++) SFX(store1)(o + d, acc[(int64_t)qi * 64 + d] * inv);
        }
    }
}
#endif

/* Rows 0 .. R - 1 of one sequence (consecutive positions: a verification step's, or one row), all query heads,
   against cached positions t_begin .. t_end[r] - 1 (t_begin a multiple of BS; t_end ascending): the scores, each
   head's maximum m[r][h], the weights p = exp(score - m), their sum l[r][h] and acc[r][h] = the sum of p times the
   value rows, not yet divided by l. Row r sees positions from t_lo[r] on (its sliding window; t_lo NULL: all from
   t_begin; t_lo ascending, each >= t_begin): blocks wholly before t_lo[0] are not read, and a row that sees no
   position gets m = -3e38, l = 0, acc = 0. Scores are soft-capped (softcap_all) when softcap > 0. The cache is
   walked block by block, once for the scores and once for the values, and each block's rows (all KV heads,
   contiguous) are used for every row and head before moving on, so the block is read from memory once. A row's
   arithmetic is the same whichever rows are computed with it. qf: [R][H][D] scaled queries; scores: R * H * (t_end[R - 1] - t_begin) floats; acc[r]: H * D floats, m[r] and
   l[r]: H floats. The next block is asked for (into L2) while this one is used. */
static void SFX(span)(const CFX(T)* kc, const CFX(T)* vc, const int32_t* table, int t_begin, const int* t_end,
                     const int* t_lo, int R, int H, int KVH, int D, int BS, float softcap, const float* qf,
                     float* scores, float* const* acc, float* const* m, float* const* l) {
    const int G = H / KVH, end = t_end[R - 1], len = end - t_begin;
    const int64_t row = (int64_t)KVH * D;
    int lo[R];
    for (int r = 0; r < R; r++) lo[r] = t_lo ? t_lo[r] : t_begin;
    const int first = (t_lo ? t_lo[0] : t_begin) / BS * BS;  /* the first block any row sees */
    for (int t0 = first; t0 < end; t0 += BS) {
        const CFX(T)* kb = kc + (int64_t)table[t0 / BS] * BS * row;
        /* the next block's keys (after the last, the values' first block), a share with every head */
        const CFX(T)* ahead = t0 + BS < end ? kc + (int64_t)table[t0 / BS + 1] * BS * row
                                            : vc + (int64_t)table[first / BS] * BS * row;
        for (int r = 0; r < R; r++) {
            const int n = t_end[r] - t0 < BS ? t_end[r] - t0 : BS;
            const int t_s = lo[r] > t0 ? lo[r] - t0 : 0;  /* the row's first position in the block */
            for (int h = 0; h < H; h++) {
                if (r == 0) prefetch_part(ahead, sizeof(CFX(T)) * BS * row, h, H);
                const CFX(T)* k = kb + (int64_t)(h / G) * D;
                const float* q = qf + ((int64_t)r * H + h) * D;
                float* sc = scores + ((int64_t)r * H + h) * len + (t0 - t_begin);
                int t = t_s;
#if VEC
                if (D == 64)
                    for (; t + 8 <= n; t += 8) _mm256_storeu_ps(sc + t, SFX(dot8x64)(q, k + t * row, row));
#endif
                for (; t < n; t++) sc[t] = SFX(dot)(q, k + t * row, D);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const int n = t_end[r] - lo[r];
        for (int h = 0; h < H; h++) {
            float* sc = scores + ((int64_t)r * H + h) * len + (lo[r] - t_begin);
            if (n <= 0) { m[r][h] = -3.0e38f; l[r][h] = 0.0f; continue; }
            softcap_all(sc, n, softcap);
            m[r][h] = max_of(sc, n);
            l[r][h] = exp_sum(sc, n, m[r][h]);
        }
        for (int i = 0; i < H * D; i++) acc[r][i] = 0.0f;
    }
    for (int t0 = first; t0 < end; t0 += BS) {
        const CFX(T)* vb = vc + (int64_t)table[t0 / BS] * BS * row;
        const CFX(T)* ahead = t0 + BS < end ? vc + (int64_t)table[t0 / BS + 1] * BS * row : 0;
        for (int r = 0; r < R; r++) {
            const int n = t_end[r] - t0 < BS ? t_end[r] - t0 : BS;
            const int t_s = lo[r] > t0 ? lo[r] - t0 : 0;
            for (int h = 0; h < H; h++) {
                if (ahead && r == 0) prefetch_part(ahead, sizeof(CFX(T)) * BS * row, h, H);
                const CFX(T)* v = vb + (int64_t)(h / G) * D;
                const float* p = scores + ((int64_t)r * H + h) * len + (t0 - t_begin);
                float* o = acc[r] + (int64_t)h * D;
#if ZVEC
                if (D == 64) {  /* the output row stays in registers over the block */
                    __m512 o0 = _mm512_loadu_ps(o), o1 = _mm512_loadu_ps(o + 16), o2 = _mm512_loadu_ps(o + 32);
                    __m512 o3 = _mm512_loadu_ps(o + 48);
                    for (int t = t_s; t < n; t++) {
                        const CFX(T)* vt = v + t * row;
                        const __m512 pt = _mm512_set1_ps(p[t]);
                        o0 = _mm512_fmadd_ps(pt, CFX(loadz)(vt), o0);
                        o1 = _mm512_fmadd_ps(pt, CFX(loadz)(vt + 16), o1);
                        o2 = _mm512_fmadd_ps(pt, CFX(loadz)(vt + 32), o2);
                        o3 = _mm512_fmadd_ps(pt, CFX(loadz)(vt + 48), o3);
                    }
                    _mm512_storeu_ps(o, o0); _mm512_storeu_ps(o + 16, o1); _mm512_storeu_ps(o + 32, o2);
                    _mm512_storeu_ps(o + 48, o3);
                    continue;
                }
#elif VEC
                if (D == 64) {  /* the output row stays in registers over the block */
                    __m256 o0 = _mm256_loadu_ps(o), o1 = _mm256_loadu_ps(o + 8), o2 = _mm256_loadu_ps(o + 16);
                    __m256 o3 = _mm256_loadu_ps(o + 24), o4 = _mm256_loadu_ps(o + 32), o5 = _mm256_loadu_ps(o + 40);
                    __m256 o6 = _mm256_loadu_ps(o + 48), o7 = _mm256_loadu_ps(o + 56);
                    for (int t = t_s; t < n; t++) {
                        const CFX(T)* vt = v + t * row;
                        __m256 pt = _mm256_set1_ps(p[t]);
                        o0 = _mm256_fmadd_ps(pt, CFX(load8)(vt), o0);
                        o1 = _mm256_fmadd_ps(pt, CFX(load8)(vt + 8), o1);
                        o2 = _mm256_fmadd_ps(pt, CFX(load8)(vt + 16), o2);
                        o3 = _mm256_fmadd_ps(pt, CFX(load8)(vt + 24), o3);
                        o4 = _mm256_fmadd_ps(pt, CFX(load8)(vt + 32), o4);
                        o5 = _mm256_fmadd_ps(pt, CFX(load8)(vt + 40), o5);
                        o6 = _mm256_fmadd_ps(pt, CFX(load8)(vt + 48), o6);
                        o7 = _mm256_fmadd_ps(pt, CFX(load8)(vt + 56), o7);
                    }
                    _mm256_storeu_ps(o, o0); _mm256_storeu_ps(o + 8, o1); _mm256_storeu_ps(o + 16, o2);
                    _mm256_storeu_ps(o + 24, o3); _mm256_storeu_ps(o + 32, o4); _mm256_storeu_ps(o + 40, o5);
                    _mm256_storeu_ps(o + 48, o6); _mm256_storeu_ps(o + 56, o7);
                    continue;
                }
#endif
                for (int t = t_s; t < n; t++)
                    for (int j = 0; j < D; j++) o[j] += p[t] * CFX(load1)(v + t * row + j);
            }
        }
    }
}
/* One query row of a sequence: all its heads over cached positions 0 .. ctx - 1 (from window_start(ctx - 1, window)
   on) into out. qf: its H * D rotated queries (scaled here); scores: H * ctx floats; acc: H * D floats. */
static void SFX(sequence)(const CFX(T)* kc, const CFX(T)* vc, const int32_t* table, int ctx, SFX(T)* out, int H,
                         int KVH, int D, int BS, float scale, int window, float softcap, const float* sinks,
                         float* qf, float* scores, float* acc) {
    float mh[H], lh[H];
    float *m = mh, *l = lh;
    const int lo = window_start(ctx - 1, window);
    for (int i = 0; i < H * D; i++) qf[i] *= scale;
    SFX(span)(kc, vc, table, lo / BS * BS, &ctx, &lo, 1, H, KVH, D, BS, softcap, qf, scores, &acc, &m, &l);
    for (int h = 0; h < H; h++) {
        const float inv = out_scale(m[h], l[h], sinks, h);
        for (int j = 0; j < D; j++) SFX(store1)(out + h * D + j, acc[h * D + j] * inv);
    }
}

/* `heads` rows of D values at x, rotated by c/s (sin with rotate_half's sign folded in, see `rotate`) into out as
   floats, bit for bit torch's rotation; without c, just converted. Two half loops: no index wrap, so they vectorize. */
static void SFX(rope_heads)(const SFX(T)* x, const SFX(T)* c, const SFX(T)* s, int heads, int D, float* out) {
    const int half = D / 2;
    for (int h = 0; h < heads; h++, x += D, out += D) {
        if (!c) { for (int j = 0; j < D; j++) out[j] = SFX(load1)(x + j); continue; }
        for (int j = 0; j < half; j++) out[j] = SFX(rope)(SFX(load1)(x + j), SFX(load1)(x + j + half), SFX(load1)(c + j), SFX(load1)(s + j));
        for (int j = half; j < D; j++) out[j] = SFX(rope)(SFX(load1)(x + j), SFX(load1)(x + j - half), SFX(load1)(c + j), SFX(load1)(s + j));
    }
}

/* The new key (rotated by c/s, or as it is without c) and value of one position into cache slot `slot`. */
static void SFX(write_kv)(const SFX(T)* k, const SFX(T)* v, const SFX(T)* c, const SFX(T)* s, CFX(T)* kc, CFX(T)* vc,
                         int64_t slot, int KVH, int D) {
    CFX(T)* kdst = kc + slot * KVH * D;
    if (c) {
        float rot[KVH * D];
        SFX(rope_heads)(k, c, s, KVH, D, rot);
        for (int i = 0; i < KVH * D; i++) CFX(store1)(kdst + i, rot[i]);
    } else {
        for (int i = 0; i < KVH * D; i++) CFX(store1)(kdst + i, SFX(load1)(k + i));
    }
    CFX(T)* vdst = vc + slot * KVH * D;  /* the cache's type: a copy, or a rounding to bfloat16 */
    for (int i = 0; i < KVH * D; i++) CFX(store1)(vdst + i, SFX(load1)(v + i));
}

/* The new key (rotated) and value of every decode row into the cache slot of its position ctx_lens[b] - 1. */
static void SFX(decode_write)(const SFX(T)* k_new, int64_t k_stride, const SFX(T)* v_new, int64_t v_stride,
                             const SFX(T)* cos, const SFX(T)* sin, CFX(T)* kc, CFX(T)* vc, const int32_t* tables,
                             int max_blocks, const int32_t* ctx_lens, int B, int KVH, int D, int BS) {
    for (int b = 0; b < B; b++) {
        const int pos = ctx_lens[b] - 1;
        SFX(write_kv)(k_new + b * k_stride, v_new + b * v_stride, cos ? cos + (int64_t)b * D : 0,
                      sin ? sin + (int64_t)b * D : 0, kc, vc,
                      (int64_t)tables[(int64_t)b * max_blocks + pos / BS] * BS + pos % BS, KVH, D);
    }
}

/* A decode row attends in spans of DECODE_SPAN positions (a multiple of the block size): each span gives every
   head a partial softmax (span), and the row's spans are merged in order (decode_merge). The spans are the work
   shared between threads, so one long sequence keeps every thread busy; a row's bits depend only on its own
   context, never on the rows beside it or on the threads. The rows of a verification step (consecutive positions
   of one sequence) form a group: one work item computes a span for all of them, block by block, so the group
   reads each block's keys and values from memory once and the other rows find them in the core's first cache.
   Under a sliding window a row's spans begin with the one that holds its window's first position: the spans before
   it are not work items, so a row costs O(window), not O(context). Spans are numbered from position 0 whatever the
   window, so a row's bits still depend only on its own context. */
#ifndef DECODE_SPAN
#define DECODE_SPAN 128
#endif
typedef struct {
    const SFX(T)* q; int64_t q_stride; const SFX(T) *cos, *sin; float scale;
    const CFX(T) *kc, *vc; const int32_t *tables, *ctx_lens; SFX(T)* out;
    int max_blocks, B, H, KVH, D, BS, window; float softcap; const float* sinks; int span;
    float* qf;     /* [B][H][D]: every row's rotated, scaled queries */
    int* first;    /* [B + 1]: row b's spans' partial results are parts first[b] .. first[b + 1] - 1 */
    int* lspan;    /* [B]: row b's first span (that of its window's first position; 0 without a window) */
    int* done;     /* [B]: row b's spans computed (whoever computes the last one merges the row) */
    int* row0;     /* [groups + 1]: group g is rows row0[g] .. row0[g + 1] - 1 */
    int* item0;    /* [groups + 1]: group g's spans are items item0[g] .. item0[g + 1] - 1 */
    int* ready;    /* [groups]: the group's queries are in qf (set by whoever takes its first span) */
    int groups;
    float* parts;  /* per part: acc [H][D], then m [H], then l [H] */
    int next, rc;
} SFX(decode_job);

/* Group the rows, number the spans and allocate the queries and the spans' partial results. Returns 0, or -1
   without memory. */
static int SFX(decode_prepare)(SFX(decode_job)* j) {
    const int B = j->B;
    j->span = j->BS >= DECODE_SPAN ? j->BS : (DECODE_SPAN + j->BS - 1) / j->BS * j->BS;
    j->first = (int*)malloc(sizeof(int) * (size_t)(6 * B + 3));
    j->qf = (float*)malloc(sizeof(float) * (size_t)B * j->H * j->D);
    if (!j->first || !j->qf) return -1;
    j->lspan = j->first + B + 1;
    j->done = j->lspan + B;
    j->row0 = j->done + B;
    memset(j->done, 0, sizeof(int) * (size_t)B);
    j->first[0] = 0;
    for (int b = 0; b < B; b++) {
        j->lspan[b] = window_start(j->ctx_lens[b] - 1, j->window) / j->span;
        j->first[b + 1] = j->first[b] + (j->ctx_lens[b] + j->span - 1) / j->span - j->lspan[b];
    }
    int g = 0;
    for (int b = 0; b < B; b++)  /* a row one position past the row before, in the same blocks, joins its group */
        if (b == 0 || j->ctx_lens[b] != j->ctx_lens[b - 1] + 1 ||
            memcmp(j->tables + (int64_t)b * j->max_blocks, j->tables + (int64_t)(b - 1) * j->max_blocks,
                   sizeof(int32_t) * (size_t)j->max_blocks) != 0)
            j->row0[g++] = b;
    j->row0[g] = B;
    j->groups = g;
    j->item0 = j->row0 + g + 1;
    j->ready = j->item0 + g + 1;
    memset(j->ready, 0, sizeof(int) * (size_t)g);
    j->item0[0] = 0;
    for (int i = 0; i < g; i++) {  /* from the group's first row's first span to its last row's last */
        const int last = j->row0[i + 1] - 1;
        j->item0[i + 1] = j->item0[i] + (j->ctx_lens[last] + j->span - 1) / j->span - j->lspan[j->row0[i]];
    }
    j->parts = (float*)malloc(sizeof(float) * (size_t)j->first[B] * j->H * (j->D + 2));
    return j->parts ? 0 : -1;
}

/* Row b's spans into its output, in order: out = the sum of w_s * acc_s over the sum of w_s * l_s, w_s =
   exp(m_s - M) with M the largest m_s (one span: w = 1 exactly). */
static void SFX(decode_merge)(const SFX(decode_job)* j, int b) {
    const int H = j->H, D = j->D, s0 = j->first[b], s1 = j->first[b + 1];
    const size_t size = (size_t)H * (D + 2);
    float o[D];
    for (int h = 0; h < H; h++) {
        float top = -3.0e38f, l = 0.0f;
        for (int s = s0; s < s1; s++) {
            const float m = j->parts[s * size + H * D + h];
            top = m > top ? m : top;
        }
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int s = s0; s < s1; s++) {
            const float* part = j->parts + s * size;
            const float w = exp_neg(part[H * D + h] - top);
            l += w * part[H * D + H + h];
            for (int d = 0; d < D; d++) o[d] += w * part[h * D + d];
        }
        const float inv = out_scale(top, l, j->sinks, h);
        for (int d = 0; d < D; d++) SFX(store1)(j->out + ((int64_t)b * H + h) * D + d, o[d] * inv);
    }
}

/* The work items (a group's span) taken one at a time from j->next: several threads may run this on the same job.
   A group's first span is taken before its others (the counter only grows): its taker rotates the group's
   queries, the others wait for them; whoever computes a row's last span merges the row. */
static void SFX(decode_spans)(SFX(decode_job)* j) {
    const int H = j->H, D = j->D, total = j->item0[j->groups];
    const size_t size = (size_t)H * (D + 2);
    int most = 1;  /* the largest group's rows */
    for (int i = 0; i < j->groups; i++)
        if (j->row0[i + 1] - j->row0[i] > most) most = j->row0[i + 1] - j->row0[i];
    float* scores = (float*)malloc(sizeof(float) * (size_t)most * H * j->span);
    if (!scores) { __atomic_store_n(&j->rc, -1, __ATOMIC_RELAXED); return; }
    int g = 0;
    for (int item; (item = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < total;) {
        while (j->item0[g + 1] <= item) g++;  /* a thread's items only grow */
        const int s = item - j->item0[g], r0 = j->row0[g], r1 = j->row0[g + 1];
        if (s == 0) {
            for (int b = r0; b < r1; b++) {
                float* qf = j->qf + (size_t)b * H * D;
                const int64_t c = (int64_t)b * D;
                SFX(rope_heads)(j->q + b * j->q_stride, j->cos ? j->cos + c : 0, j->sin ? j->sin + c : 0, H, D, qf);
                for (int i = 0; i < H * D; i++) qf[i] *= j->scale;
            }
            __atomic_store_n(&j->ready[g], 1, __ATOMIC_RELEASE);
        } else {
            unsigned spins = 0;  /* the group's first span was taken: its taker is rotating the queries */
            while (!__atomic_load_n(&j->ready[g], __ATOMIC_ACQUIRE)) spin_wait_step(&spins);
        }
        const int S = j->lspan[r0] + s, t0 = S * j->span;  /* the span's number from position 0, its first */
        /* the group's rows whose spans include this one: rs .. re - 1 (contexts and first spans ascend) */
        int rs = r0, re = r1;
        while (rs < r1 && j->lspan[rs] + j->first[rs + 1] - j->first[rs] <= S) rs++;
        while (re > rs && j->lspan[re - 1] > S) re--;
        const int R = re - rs;
        int t_end[R > 0 ? R : 1], t_lo[R > 0 ? R : 1];
        float *acc[R > 0 ? R : 1], *m[R > 0 ? R : 1], *l[R > 0 ? R : 1];
        for (int b = rs; b < re; b++) {
            const int lo = window_start(j->ctx_lens[b] - 1, j->window);
            t_end[b - rs] = t0 + j->span < j->ctx_lens[b] ? t0 + j->span : j->ctx_lens[b];
            t_lo[b - rs] = lo > t0 ? lo : t0;
            acc[b - rs] = j->parts + (size_t)(j->first[b] + S - j->lspan[b]) * size;
            m[b - rs] = acc[b - rs] + H * D;
            l[b - rs] = m[b - rs] + H;
        }
        if (R > 0)
            SFX(span)(j->kc, j->vc, j->tables + (int64_t)rs * j->max_blocks, t0, t_end, t_lo, R, H, j->KVH, D, j->BS,
                      j->softcap, j->qf + (size_t)rs * H * D, scores, acc, m, l);
        for (int b = rs; b < re; b++)
            if (__atomic_add_fetch(&j->done[b], 1, __ATOMIC_ACQ_REL) == j->first[b + 1] - j->first[b])
                SFX(decode_merge)(j, b);
    }
    free(scores);
}
static void SFX(decode_free)(SFX(decode_job)* j) { free(j->first); free(j->qf); free(j->parts); }

static void SFX(decode_task)(void* p) { SFX(decode_spans)((SFX(decode_job)*)p); }

/* q: [B, H, D] rows `q_stride` elements apart; k_new/v_new: [B, KVH, D] rows `k_stride`/`v_stride` apart;
   cos/sin: [B, D] (sin with rotate_half's sign folded in), or NULL when q and k are already rotated. Every row's
   new key (rotated) and value are written to the cache slot of its position ctx_lens[b] - 1 before any row attends:
   rows may be consecutive positions of one sequence (a speculative verification step), each attending over the
   keys of the rows before it. Then row b's query attends over its cached positions 0 .. ctx_lens[b] - 1.
   caches: [slots, KVH, D] of one layer; tables: [B, max_blocks]; out: [B, H, D] contiguous. H is a multiple of
   KVH, D is even. window > 0: row b sees only positions after ctx_lens[b] - 1 - window (a sliding window);
   softcap > 0: scores -> tanh(score / softcap) * softcap; sinks: [H] float32 logits in each head's softmax
   denominator with no value (out_scale; NULL: none). `share`: the spans go to the helper-thread pool, else all
   on this thread. Returns 0, or -1 without memory. */
int SFX(paged_decode)(const SFX(T)* q, int64_t q_stride, const SFX(T)* k_new, int64_t k_stride, const SFX(T)* v_new,
                     int64_t v_stride, const SFX(T)* cos, const SFX(T)* sin, CFX(T)* kc, CFX(T)* vc,
                     const int32_t* tables, int max_blocks, const int32_t* ctx_lens, SFX(T)* out,
                     int B, int H, int KVH, int D, int BS, float scale, int window, float softcap,
                     const float* sinks, int share) {
    /* every row's key and value first: a few hundred floats a row, on this thread */
    SFX(decode_write)(k_new, k_stride, v_new, v_stride, cos, sin, kc, vc, tables, max_blocks, ctx_lens, B, KVH, D, BS);
    SFX(decode_job) j = {q, q_stride, cos, sin, scale, kc, vc, tables, ctx_lens, out, max_blocks, B, H, KVH, D, BS,
                         window, softcap, sinks, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (SFX(decode_prepare)(&j) != 0) {
        SFX(decode_free)(&j);
        return -1;
    }
    if (share) {
        POOL_RUN(SFX(decode_task), &j);
    } else {
        SFX(decode_spans)(&j);
    }
    SFX(decode_free)(&j);
    return j.rc;
}

/* The keys (rotated) and values of a prefill chunk's rows into their cache slots: row r is position row_pos[r]
   of sequence row_seq[r] (block table tables + row_seq[r] * max_blocks); rows are taken from *next. */
void SFX(prefill_write)(const SFX(T)* k_new, int64_t k_stride, const SFX(T)* v_new, int64_t v_stride, const SFX(T)* cos,
                       const SFX(T)* sin, CFX(T)* kc, CFX(T)* vc, const int32_t* tables, int max_blocks,
                       const int32_t* row_seq, const int32_t* row_pos, int R, int KVH, int D, int BS, int* next) {
    for (int r; (r = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED)) < R;) {
        const int32_t* table = tables + (int64_t)row_seq[r] * max_blocks;
        const int pos = row_pos[r];
        SFX(write_kv)(k_new + r * k_stride, v_new + r * v_stride, cos ? cos + (int64_t)r * D : 0,
                     sin ? sin + (int64_t)r * D : 0, kc, vc, (int64_t)table[pos / BS] * BS + pos % BS, KVH, D);
    }
}

/* Attention of a prefill chunk (its keys and values written by prefill_write first): row r of q ([R, H, D], rows
   q_stride apart, rotated here by cos/sin [R, D] unless they are NULL) is the query at position row_pos[r] of
   sequence row_seq[r] and attends to the cached positions 0..row_pos[r]: causal. Rows are taken one at a time
   from *next (an atomic counter starting at 0), so several threads share the chunk. max_ctx: the largest row_pos +
   1. out: [R, H, D] contiguous. window > 0: a row sees only the positions after row_pos[r] - window; softcap > 0:
   soft-capped scores, sinks (as paged_decode). Returns 0, or -1 without memory. */
int SFX(paged_prefill)(const SFX(T)* q, int64_t q_stride, const SFX(T)* cos, const SFX(T)* sin, const CFX(T)* kc,
                      const CFX(T)* vc, const int32_t* tables, int max_blocks, const int32_t* row_seq,
                      const int32_t* row_pos, SFX(T)* out, int R, int H, int KVH, int D, int BS, float scale,
                      int window, float softcap, const float* sinks, int max_ctx, int* next) {
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
                    SFX(rope_heads)(q + i * q_stride, cos ? cos + (int64_t)i * D : 0, sin ? sin + (int64_t)i * D : 0,
                                   H, D, buf + (size_t)(i - r) * H * D);
                SFX(tile64)(kc, vc, table, row_pos[r], e - r, out + (int64_t)r * H * D, H, KVH, BS, scale, window,
                           softcap, sinks, buf, buf + (size_t)(e - r) * H * D);
                continue;
            }
#endif
            for (int i = r; i < e; i++) {
                SFX(rope_heads)(q + i * q_stride, cos ? cos + (int64_t)i * D : 0, sin ? sin + (int64_t)i * D : 0, H, D,
                               buf);
                SFX(sequence)(kc, vc, table, row_pos[i] + 1, out + (int64_t)i * H * D, H, KVH, D, BS, scale, window,
                             softcap, sinks, buf, buf + (size_t)H * D, buf + (size_t)H * (D + max_ctx));
            }
        }
    }
    free(buf);
    return 0;
}
/* A prefill chunk on the helper-thread pool (native.py): one job, rows handed out by the counter in it. */
typedef struct {
    const SFX(T) *q, *k_new, *v_new, *cos, *sin; CFX(T) *kc, *vc; SFX(T)* out; const int32_t *tables, *row_seq, *row_pos;
    int64_t q_stride, k_stride, v_stride; int max_blocks, R, H, KVH, D, BS; float scale; int window; float softcap;
    const float* sinks; int max_ctx, next_write, next, rc;
} SFX(prefill_job);
static void SFX(prefill_write_task)(void* p) {
    SFX(prefill_job)* j = (SFX(prefill_job)*)p;
    SFX(prefill_write)(j->k_new, j->k_stride, j->v_new, j->v_stride, j->cos, j->sin, j->kc, j->vc, j->tables,
                      j->max_blocks, j->row_seq, j->row_pos, j->R, j->KVH, j->D, j->BS, &j->next_write);
}
static void SFX(prefill_task)(void* p) {
    SFX(prefill_job)* j = (SFX(prefill_job)*)p;
    if (SFX(paged_prefill)(j->q, j->q_stride, j->cos, j->sin, j->kc, j->vc, j->tables, j->max_blocks, j->row_seq,
                          j->row_pos, j->out, j->R, j->H, j->KVH, j->D, j->BS, j->scale, j->window, j->softcap,
                          j->sinks, j->max_ctx, &j->next) != 0)
        __atomic_store_n(&j->rc, -1, __ATOMIC_RELAXED);
}
/* A prefill chunk's rows: prefill_write, then paged_prefill (every row may read keys another row wrote), each
   shared with the helper threads when `share`. Returns 0, or -1 without memory. */
int SFX(paged_prefill_run)(const SFX(T)* q, int64_t q_stride, const SFX(T)* k_new, int64_t k_stride, const SFX(T)* v_new,
                          int64_t v_stride, const SFX(T)* cos, const SFX(T)* sin, CFX(T)* kc, CFX(T)* vc,
                          const int32_t* tables, int max_blocks, const int32_t* row_seq, const int32_t* row_pos,
                          SFX(T)* out, int R, int H, int KVH, int D, int BS, float scale, int window, float softcap,
                          const float* sinks, int max_ctx, int share) {
    SFX(prefill_job) j = {q, k_new, v_new, cos, sin, kc, vc, out, tables, row_seq, row_pos, q_stride, k_stride,
                         v_stride, max_blocks, R, H, KVH, D, BS, scale, window, softcap, sinks, max_ctx, 0, 0, 0};
    if (share) {
        POOL_RUN(SFX(prefill_write_task), &j);
        POOL_RUN(SFX(prefill_task), &j);
    } else {
        SFX(prefill_write_task)(&j);
        SFX(prefill_task)(&j);
    }
    return j.rc;
}
