/* The block kernels' decode steps (engines/pytorch/csrc/gemm_blocks.h: the register kernels of a few rows) per GGUF
   type on one thread, from cache and streamed from memory, types timed in turn (one pass of each, then again).

   Why: a 1-row step costs about as much arithmetic as its bytes take to read, so whether a type keeps up with its
   byte stream (and by how much a type with more bits a weight falls behind Q4_1) shows only when the weights come
   from memory, as in a real step (SmolLM2's are 3x the last-level cache), without the noise of threads, Python and
   the rest of the step.

   For each type: 64 MB of random valid panels (float16 scales of normal size) at SmolLM2's widths (K = 576; the
   K-quants 1536, the one SmolLM2 width they fill). "cache": one call over `panels` panels (576 columns by default: a
   projection's share of a thread) repeated, so they stay in L2; "stream": calls of `panels` panels over all 64 MB,
   one after the other, as a thread takes a projection's tiles. Printed: ns a weight (median and best of `reps`
   passes), the stream's GB/s, and both against Q4_1. Also a plain read of a 64 MB buffer: the stream's ceiling.

   cc -O3 -march=native -ffp-contract=off -std=gnu11 -I engines/pytorch/csrc -o /tmp/gguf_stream_bench \
       bench/gguf_stream_bench.c -lm && /tmp/gguf_stream_bench [rows=1] [reps=15] [panels=36]
   (add -mno-avx512vbmi -mno-gfni, or -mno-avx512f, for the other builds' paths) */
#include "gemm.c"

#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
/* Random bytes, then every float16 field of every record set to a normal scale (random ones would make NaNs and
   subnormals, which some CPUs take slow paths for). */
static void fill(int t, uint8_t* p, int64_t panels, int K) {
    uint64_t s = 88172645463325252ULL;
    for (int64_t i = 0; i < panels * bt_panel_bytes(t, K); i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[i] = (uint8_t)s;
    }
    const int f16s = t == BT_Q4_1 || t == BT_Q5_1 || t == BT_Q4_K || t == BT_Q5_K ? 32 : 16;
    for (int64_t n = 0; n < panels; n++)
        for (int r = 0; r < K / BT_RK[t]; r++) {
            uint16_t* rec = (uint16_t*)(p + n * bt_panel_bytes(t, K) + (int64_t)r * BT_RECORD[t]);
            for (int i = 0; i < f16s; i++) rec[i] = (uint16_t)(0x2C00 + (i & 7));
        }
}
static int by_value(const void* a, const void* b) {
    const double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}
#define NTYPES 8
#define MAXREPS 64
int main(int argc, char** argv) {
    static const char* names[] = {"", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"};
    const int types[NTYPES] = {BT_Q4_1, BT_Q4_0, BT_Q5_0, BT_Q5_1, BT_Q8_0, BT_Q4_K, BT_Q5_K, BT_Q6_K};
    const int M = argc > 1 ? atoi(argv[1]) : 1, panels = argc > 3 ? atoi(argv[3]) : 36;
    int reps = argc > 2 ? atoi(argv[2]) : 15;
    if (M < 1 || M > BLOCK_REG_ROWS || panels < 1 || reps < 1) {
        fprintf(stderr, "rows 1..%d, reps >= 1, panels >= 1\n", BLOCK_REG_ROWS);
        return 2;
    }
    if (reps > MAXREPS) reps = MAXREPS;
    float* x = aligned_alloc(64, sizeof(float) * BLOCK_REG_ROWS * 1536);
    float* y = aligned_alloc(64, sizeof(float) * BLOCK_REG_ROWS * panels * 16);
    for (int i = 0; i < BLOCK_REG_ROWS * 1536; i++) x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    uint8_t* buf[NTYPES];
    int64_t count[NTYPES], pbytes[NTYPES];
    int Ks[NTYPES];
    static double cached[NTYPES][MAXREPS], streamed[NTYPES][MAXREPS], plain[MAXREPS];
    for (int i = 0; i < NTYPES; i++) {
        const int t = types[i];
        Ks[i] = BT_RK[t] == 256 ? 1536 : 576;
        pbytes[i] = bt_panel_bytes(t, Ks[i]);
        count[i] = (int64_t)(64e6 / pbytes[i]) / panels * panels;
        buf[i] = aligned_alloc(64, (size_t)(count[i] * pbytes[i] + 63) / 64 * 64);
        if (!buf[i] || count[i] < panels) return 1;
        fill(t, buf[i], count[i], Ks[i]);
    }
    for (int rep = 0; rep < reps; rep++) {
        for (int i = 0; i < NTYPES; i++) {
            const int t = types[i], K = Ks[i], calls = 100;
            double t0 = now();
            for (int c = 0; c < calls; c++) gemm_core_blocks(t, x, K, buf[i], pbytes[i], y, panels * 16, M, panels, K);
            cached[i][rep] = (now() - t0) / calls / ((double)panels * 16 * K);
            t0 = now();
            for (int64_t n = 0; n < count[i]; n += panels)
                gemm_core_blocks(t, x, K, buf[i] + n * pbytes[i], pbytes[i], y, panels * 16, M, panels, K);
            streamed[i][rep] = (now() - t0) / ((double)count[i] * 16 * K);
        }
        const int64_t n = count[0] * pbytes[0] / 32 * 32;
        __m256i acc = _mm256_setzero_si256();
        const double t0 = now();
        for (int64_t at = 0; at < n; at += 32)
            acc = _mm256_add_epi32(acc, _mm256_load_si256((const __m256i*)(buf[0] + at)));
        plain[rep] = n / (now() - t0) / 1e9;
        volatile int sink = _mm256_extract_epi32(acc, 0);
        (void)sink;
    }
    qsort(plain, reps, sizeof(double), by_value);
    printf("%d row(s), %d panels a call, %d passes; plain read on one thread: %.1f GB/s (best), %.1f (median)\n", M,
           panels, reps, plain[reps - 1], plain[reps / 2]);
    printf("| type | K | bytes/weight | cache ns/weight (best) | stream ns/weight (best) | stream GB/s "
           "| stream / cache | cache vs Q4_1 | stream vs Q4_1 |\n|---|---|---|---|---|---|---|---|---|\n");
    double base_c = 0, base_s = 0;
    for (int i = 0; i < NTYPES; i++) {
        qsort(cached[i], reps, sizeof(double), by_value);
        qsort(streamed[i], reps, sizeof(double), by_value);
        const double c = cached[i][reps / 2] * 1e9, s = streamed[i][reps / 2] * 1e9, bpw = pbytes[i] / (16.0 * Ks[i]);
        if (i == 0) base_c = c, base_s = s;
        printf("| %s | %d | %.4f | %.4f (%.4f) | %.4f (%.4f) | %.1f | %.2f | %.2f | %.2f |\n", names[types[i]], Ks[i],
               bpw, c, cached[i][0] * 1e9, s, streamed[i][0] * 1e9, bpw / s, s / c, c / base_c, s / base_s);
    }
    return 0;
}
