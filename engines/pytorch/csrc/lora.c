/* LoRA updates of one projection for every row of a step in one call (engines/pytorch/lora_kernel.py), punica /
   S-LoRA style: each row runs under its adapter's slot (or none: a row of the base model), and
   out[row] = [residual[row] +] (y[row] + scale * (x[row] @ A^T) @ B^T), the "shrink" (x @ A^T, rank r) then the
   "expand" (times B^T, each output column's part), as PEFT's unmerged layer computes it: the product rounded, times
   the scale rounded, then added to the base projection's output, then the residual added. Rows of the base model
   get y copied (and the residual added): the same bits as without the update.

   The projection's slot table (int64 words, SLOT_WORDS a slot) holds, per slot, its adapter's stacked A [R, K]
   (every part's A, fused projections: q/k/v, gate/up) and up to MAX_PARTS parts: output columns [start, end), the
   part's rank offset into A and rank, its B transposed ([r, end - start], contiguous) and its scale. `panels`: y is
   gate_up's raw product, gate and up in 16-column panels in turn (gated_activation.py
   `GatedActivation.gate_up_panels`), and out the plain [gate | up] layout, N = 2 x intermediate.

   Vector paths (AVX-512, AVX2 with FMA) and a scalar one; each row is computed by one thread, so results do not
   depend on how rows are shared among the helper threads (pool.c) on steps of SHARE_ROWS rows or more. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#include "pool_client.h"

enum { S_A, S_RANK, S_PARTS, S_PART0, MAX_PARTS = 4, SLOT_WORDS = 32 };
enum { P_START, P_END, P_ROFF, P_RANK, P_BT, P_SCALE, P_WORDS = 6 };
enum { SHARE_ROWS = 8 };

int lora_slot_words(void) { return SLOT_WORDS; }
int lora_max_parts(void) { return MAX_PARTS; }

static inline float hsum_dot(const float* x, const float* a, int K) {
    int k = 0;
#if defined(__AVX512F__)
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (; k + 32 <= K; k += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), _mm512_loadu_ps(a + k), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(a + k + 16), s1);
    }
    if (k + 16 <= K) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), _mm512_loadu_ps(a + k), s0), k += 16;
    if (k < K) {
        const __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + k), _mm512_maskz_loadu_ps(m, a + k), s1);
        k = K;
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; k + 16 <= K; k += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(a + k), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), _mm256_loadu_ps(a + k + 8), s1);
    }
    __m256 s = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float total = _mm_cvtss_f32(h);
    for (; k < K; k++) total += x[k] * a[k];
    return total;
#else
    float total = 0.0f;
    for (; k < K; k++) total += x[k] * a[k];
    return total;
#endif
}

/* out[c] += (sum_r t[r] * bt[r][c]) * scale for c in [0, n): the expand of one part. */
static inline void expand(float* out, const float* t, const float* bt, int r, int n, float scale) {
    int c = 0;
#if defined(__AVX512F__)
    const __m512 vs = _mm512_set1_ps(scale);
    for (; c < n; c += 16) {
        const __mmask16 m = n - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - c)) - 1);
        __m512 acc = _mm512_setzero_ps();
        for (int j = 0; j < r; j++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(t[j]), _mm512_maskz_loadu_ps(m, bt + (int64_t)j * n + c), acc);
        _mm512_mask_storeu_ps(out + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + c), _mm512_mul_ps(acc, vs)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 vs = _mm256_set1_ps(scale);
    for (; c + 8 <= n; c += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < r; j++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(t[j]), _mm256_loadu_ps(bt + (int64_t)j * n + c), acc);
        _mm256_storeu_ps(out + c, _mm256_add_ps(_mm256_loadu_ps(out + c), _mm256_mul_ps(acc, vs)));
    }
#endif
    for (; c < n; c++) {
        float acc = 0.0f;
        for (int j = 0; j < r; j++) acc += t[j] * bt[(int64_t)j * n + c];
        out[c] = out[c] + acc * scale;
    }
}

typedef struct {
    const float *x, *y, *residual;
    float* out;
    int64_t ldx, ldy, ldo, ldr;
    const int* slots;
    const int64_t* table;
    int panels, M, K, N, capacity, rmax, next;
} lora_job;

static void lora_row(const lora_job* j, int m, float* t) {
    const float* y = j->y + m * j->ldy;
    float* out = j->out + m * j->ldo;
    const int N = j->N;
    if (j->panels) {  /* gate and up panels of 16 in turn -> [gate | up] */
        const int n = N / 2;
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < n; i += 16)
                memcpy(out + h * n + i, y + (int64_t)(i / 16) * 32 + h * 16, sizeof(float) * (size_t)(n - i < 16 ? n - i : 16));
    } else if (out != y) {
        memcpy(out, y, sizeof(float) * (size_t)N);
    }
    const int s = j->slots[m];
    const int64_t* slot = s >= 0 && s < j->capacity ? j->table + (int64_t)s * SLOT_WORDS : NULL;
    if (slot && slot[S_RANK] > 0) {
        const float* a = (const float*)(intptr_t)slot[S_A];
        const float* x = j->x + m * j->ldx;
        const int R = (int)slot[S_RANK];
        for (int r = 0; r < R; r++) t[r] = hsum_dot(x, a + (int64_t)r * j->K, j->K);
        const int parts = (int)slot[S_PARTS];
        for (int p = 0; p < parts && p < MAX_PARTS; p++) {
            const int64_t* q = slot + S_PART0 + p * P_WORDS;
            float scale;
            const uint32_t bits = (uint32_t)q[P_SCALE];
            memcpy(&scale, &bits, sizeof scale);
            expand(out + q[P_START], t + q[P_ROFF], (const float*)(intptr_t)q[P_BT], (int)q[P_RANK],
                   (int)(q[P_END] - q[P_START]), scale);
        }
    }
    if (j->residual) {
        const float* res = j->residual + m * j->ldr;
        for (int c = 0; c < N; c++) out[c] = res[c] + out[c];
    }
}

static void lora_task(void* p) {
    lora_job* j = (lora_job*)p;
    float* t = (float*)malloc(sizeof(float) * (size_t)(j->rmax > 0 ? j->rmax : 1));
    if (!t) return;  /* the other threads take the rows */
    for (int m; (m = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->M;) lora_row(j, m, t);
    free(t);
}

/* The update of every row of a step (see the top). slots: each row's slot, -1 (or out of [0, capacity)) for a row of
   the base model; `out` may be `y` (not with `panels`); `residual` may be NULL. Returns 0, or -1 when a thread
   could not allocate its scratch. */
int lora_apply_f32(const float* x, int64_t ldx, const float* y, int64_t ldy, int panels, float* out, int64_t ldo,
                   const float* residual, int64_t ldr, int M, int K, int N, const int* slots, const int64_t* table,
                   int capacity) {
    int rmax = 0;
    for (int s = 0; s < capacity; s++)
        if (table[(int64_t)s * SLOT_WORDS + S_RANK] > rmax) rmax = (int)table[(int64_t)s * SLOT_WORDS + S_RANK];
    lora_job j = {x, y, residual, out, ldx, ldy, ldo, ldr, slots, table, panels, M, K, N, capacity, rmax, 0};
    if (M >= SHARE_ROWS) POOL_RUN(lora_task, &j); else lora_task(&j);
    return __atomic_load_n(&j.next, __ATOMIC_RELAXED) < M ? -1 : 0;  /* rows no thread could take */
}
