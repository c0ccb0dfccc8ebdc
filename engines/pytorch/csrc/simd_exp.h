/* One vectorised exp for every kernel (SiLU in the dense layers, softmax in attention), written once for both
   vector widths: exp8 (AVX2 + FMA, 8 floats) and exp16 (AVX-512, 16 floats) do the same operations, so every lane
   gets the same value from either. A source defines them where it writes EXP8_AVX2 / EXP16_AVX512. */
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

#endif
