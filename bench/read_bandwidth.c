/* Memory read bandwidth for bench/bandwidth_floor.py: `threads` threads each read their contiguous share of a
   buffer (as a decode step's threads each stream their share of a projection's weights), `reps` times; the best
   wall time of a pass over the whole buffer is returned.

   The caller allocates the buffer (with the engine's own allocator, so the pages are the engine's), and makes it
   larger than the last-level cache so that every pass comes from memory. The loop is eight independent 64-bit
   sums per iteration, which the compiler turns into vector loads and adds at -O3: the adds are far cheaper than
   the loads, so the loop is bound by reading.

   Built by the script: cc -O3 -march=native -shared -fPIC -pthread -o read_bandwidth.so read_bandwidth.c */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct {
    const uint64_t* p;
    size_t n;
    uint64_t sum;
} share_t;

static void* read_share(void* arg) {
    share_t* s = (share_t*)arg;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    size_t i = 0;
    for (; i + 8 <= s->n; i += 8) {
        a0 += s->p[i];
        a1 += s->p[i + 1];
        a2 += s->p[i + 2];
        a3 += s->p[i + 3];
        a4 += s->p[i + 4];
        a5 += s->p[i + 5];
        a6 += s->p[i + 6];
        a7 += s->p[i + 7];
    }
    for (; i < s->n; i++) a0 += s->p[i];
    s->sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* Best seconds of `reps` passes over `bytes` bytes (a multiple of 64) on `threads` threads (at most 256); the sum
   of the last pass goes to *checksum so that no pass can be dropped as dead code. */
double read_passes(const void* buf, size_t bytes, int threads, int reps, uint64_t* checksum) {
    pthread_t ids[256];
    share_t shares[256];
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    size_t words = bytes / 8, per = (words / threads) & ~(size_t)7;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double start = now();
        for (int t = 0; t < threads; t++) {
            shares[t].p = (const uint64_t*)buf + per * t;
            shares[t].n = t == threads - 1 ? words - per * t : per;
            if (t > 0) pthread_create(&ids[t], NULL, read_share, &shares[t]);
        }
        read_share(&shares[0]);
        for (int t = 1; t < threads; t++) pthread_join(ids[t], NULL);
        double took = now() - start;
        if (took < best) best = took;
        uint64_t sum = 0;
        for (int t = 0; t < threads; t++) sum += shares[t].sum;
        *checksum = sum;
    }
    return best;
}
