/* Greedy picks for a batch of logits (engines/pytorch/argmax.py): per SIMD lane the largest value and its first
   index, then the lanes merged (ties to the lower index). */
#include <math.h>
#include <stdint.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

/* The first index of the largest of row[0 .. n); NaN is never the largest. With `finite`, *finite is cleared when
   the row holds a NaN or an infinity (checked in the same pass). */
static inline int64_t argmax_row(const float* row, int n, int* finite) {
    float best = -INFINITY;
    int64_t at = 0;
    int i = 0;
#ifdef __AVX2__
    if (n >= 8) {
        __m256 vbest = _mm256_loadu_ps(row);
        __m256i vat = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), idx = vat;
        const __m256i eight = _mm256_set1_epi32(8);
        __m256 bad = _mm256_setzero_ps();  /* lanes that met a NaN or an infinity (v - v is NaN there) */
        if (finite) bad = _mm256_cmp_ps(_mm256_sub_ps(vbest, vbest), _mm256_setzero_ps(), _CMP_NEQ_UQ);
        for (i = 8; i + 8 <= n; i += 8) {
            idx = _mm256_add_epi32(idx, eight);
            const __m256 v = _mm256_loadu_ps(row + i);
            if (finite) bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
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
        if (finite && _mm256_movemask_ps(bad)) *finite = 0;
    }
#endif
    for (; i < n; i++) {  /* the tail comes after every index above: strictly larger to replace */
        if (finite && !isfinite(row[i])) *finite = 0;
        if (row[i] > best) best = row[i], at = i;
    }
#ifndef __AVX2__
    if (finite)
        for (int t = 0; t < n; t++) if (!isfinite(row[t])) *finite = 0;
#endif
    return at;
}

/* out[r] = the first index of the largest of the n values of row r (rows ld apart); NaN is never the largest. */
void argmax_rows_f32(const float* x, int64_t ld, int rows, int n, int64_t* out) {
    for (int r = 0; r < rows; r++) out[r] = argmax_row(x + r * ld, n, 0);
}

/* The same, and the number of rows holding a NaN or an infinity (their out[r] is then not to be used: the sampler
   reports such a row as an error). One pass over the logits instead of a finiteness check and an argmax. */
int argmax_rows_finite_f32(const float* x, int64_t ld, int rows, int n, int64_t* out) {
    int bad = 0;
    for (int r = 0; r < rows; r++) {
        int finite = 1;
        out[r] = argmax_row(x + r * ld, n, &finite);
        bad += !finite;
    }
    return bad;
}
