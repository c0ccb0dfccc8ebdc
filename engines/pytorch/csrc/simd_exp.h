/* One vectorised exp for every kernel (SiLU in the dense layers, softmax in attention), and the tanh built on it
   (GELU-tanh, the logit soft-caps), written once for both vector widths: exp8 / tanh8 (AVX2 + FMA, 8 floats) and
   exp16 / tanh16 (AVX-512, 16 floats) do the same operations, so every lane gets the same value from either. A source
   defines them where it writes EXP8_AVX2 / EXP16_AVX512, then TANH8_AVX2 / TANH16_AVX512. */
#ifndef SWITCHYARD_SIMD_EXP_H
#define SWITCHYARD_SIMD_EXP_H

/* exp(x) for |x| <= 88: Cody-Waite range reduction and a degree-6 polynomial, within 2 ulp of expf.
   Exact powers of two scale the result, so it is the same whichever kernel calls it. 2^n is applied in two
   halves so that n = 128 does not overflow the exponent field. */
#define SIMD_EXP(name, v, vi, mm, bits, round)                                                                     \
    static inline v name(v x) {                                                                                    \
        x = mm##min_ps(mm##max_ps(x, mm##set1_ps(-87.0f)), mm##set1_ps(88.0f));                                    \
        v n = round(mm##mul_ps(x, mm##set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); \
        v r = mm##fnmadd_ps(n, mm##set1_ps(0.693359375f), x);                                                      \
        r = mm##fnmadd_ps(n, mm##set1_ps(-2.12194440e-4f), r);                                                     \
        v p = mm##set1_ps(1.9875691500e-4f);                                                                       \
        p = mm##fmadd_ps(p, r, mm##set1_ps(1.3981999507e-3f));                                                     \
        p = mm##fmadd_ps(p, r, mm##set1_ps(8.3334519073e-3f));                                                     \
        p = mm##fmadd_ps(p, r, mm##set1_ps(4.1665795894e-2f));                                                     \
        p = mm##fmadd_ps(p, r, mm##set1_ps(1.6666665459e-1f));                                                     \
        p = mm##fmadd_ps(p, r, mm##set1_ps(5.0000001201e-1f));                                                     \
        p = mm##add_ps(mm##fmadd_ps(p, mm##mul_ps(r, r), r), mm##set1_ps(1.0f));                                   \
        vi e = mm##cvtps_epi32(n);                                                                                 \
        vi e1 = mm##srai_epi32(e, 1), e2 = mm##sub_epi32(e, e1);                                                   \
        v s1 = mm##castsi##bits##_ps(mm##slli_epi32(mm##add_epi32(e1, mm##set1_epi32(127)), 23));                  \
        v s2 = mm##castsi##bits##_ps(mm##slli_epi32(mm##add_epi32(e2, mm##set1_epi32(127)), 23));                  \
        return mm##mul_ps(mm##mul_ps(p, s1), s2);                                                                  \
    }

#define EXP8_AVX2 SIMD_EXP(exp8, __m256, __m256i, _mm256_, 256, _mm256_round_ps)
#define EXP16_AVX512 SIMD_EXP(exp16, __m512, __m512i, _mm512_, 512, _mm512_roundscale_ps)

/* tanh(x) from the exp above, the operations of paged attention's scalar softcap1 lane by lane (no FMA): near 0
   (|x| < 0.125, where 1 - e loses digits) its odd series to x^7, else (1 - e) / (1 + e) with e = exp(-2|x|); within
   a few ulp of tanhf. `lt_blend(a, b, lo, hi)`: lo where a < b, else hi (a blend on AVX2, a mask on AVX-512). */
#define SIMD_TANH(name, exp, v, mm, bits, lt_blend)                                                               \
    static inline v name(v x) {                                                                                    \
        const v sign = mm##set1_ps(-0.0f), one = mm##set1_ps(1.0f);                                                \
        const v a = mm##castsi##bits##_ps(                                                                         \
            mm##andnot_si##bits(mm##castps_si##bits(sign), mm##castps_si##bits(x)));                               \
        const v a2 = mm##mul_ps(a, a);                                                                             \
        v p = mm##add_ps(mm##set1_ps(0.133333333f), mm##mul_ps(a2, mm##set1_ps(-0.053968254f)));                   \
        p = mm##add_ps(mm##set1_ps(-0.333333333f), mm##mul_ps(a2, p));                                             \
        const v series = mm##mul_ps(a, mm##add_ps(one, mm##mul_ps(a2, p)));                                        \
        const v e = exp(mm##mul_ps(mm##set1_ps(-2.0f), a));                                                        \
        const v big = mm##div_ps(mm##sub_ps(one, e), mm##add_ps(one, e));                                          \
        const v t = lt_blend(a, mm##set1_ps(0.125f), series, big);                                                 \
        return mm##castsi##bits##_ps(mm##or_si##bits(                                                              \
            mm##castps_si##bits(t), mm##and_si##bits(mm##castps_si##bits(x), mm##castps_si##bits(sign))));        \
    }
#define SIMD_LT_BLEND8(a, b, lo, hi) _mm256_blendv_ps(hi, lo, _mm256_cmp_ps(a, b, _CMP_LT_OQ))
#define SIMD_LT_BLEND16(a, b, lo, hi) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), hi, lo)
#define TANH8_AVX2 SIMD_TANH(tanh8, exp8, __m256, _mm256_, 256, SIMD_LT_BLEND8)
#define TANH16_AVX512 SIMD_TANH(tanh16, exp16, __m512, _mm512_, 512, SIMD_LT_BLEND16)

#endif
