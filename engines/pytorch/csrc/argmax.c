/* Greedy picks for a batch of logits (engines/pytorch/argmax.py): per SIMD lane the largest value and its first
   index, then the lanes merged (ties to the lower index). */
#include <math.h>
#include <stdint.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

/* out[r] = the first index of the largest of the n values of row r (rows ld apart); NaN is never the largest. */
void argmax_rows_f32(const float* x, int64_t ld, int rows, int n, int64_t* out) {
    for (int r = 0; r < rows; r++) {
        const float* row = x + r * ld;
        float best = -INFINITY;
        int64_t at = 0;
        int i = 0;
#ifdef __AVX2__
        if (n >= 8) {
            __m256 vbest = _mm256_loadu_ps(row);
            __m256i vat = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), idx = vat;
            const __m256i eight = _mm256_set1_epi32(8);
            for (i = 8; i + 8 <= n; i += 8) {
                idx = _mm256_add_epi32(idx, eight);
                const __m256 v = _mm256_loadu_ps(row + i);
                const __m256 more = _mm256_cmp_ps(v, vbest, _CMP_GT_OQ);  /* strictly: a lane keeps its first */
                vbest = _mm256_blendv_ps(vbest, v, more);
                vat = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(vat), _mm256_castsi256_ps(idx), more));
            }
            float b[8];
            int32_t a[8];
            _mm256_storeu_ps(b, vbest);
            _mm256_storeu_si256((__m256i*)a, vat);
            best = b[0], at = a[0];
            for (int l = 1; l < 8; l++)
                if (b[l] > best || (b[l] == best && a[l] < at)) best = b[l], at = a[l];
        }
#endif
        for (; i < n; i++)  /* the tail comes after every index above: strictly larger to replace */
            if (row[i] > best) best = row[i], at = i;
        out[r] = at;
    }
}
