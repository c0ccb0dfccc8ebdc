/* The helper-thread pool (its own library, so every kernel library shares one set of threads; native.py's
   HelperThreads). Helpers are plain pthreads that never touch Python: after a job they spin briefly (the next kernel
   of a step follows within microseconds), then sleep on a futex. A job is `fn(arg)` run by the caller and by every
   helper that joins before the caller is done; kernels hand out work through an atomic counter in `arg`, so a
   helper that joins late (or not at all, when its core is busy) simply does less, and the results do not depend on
   who did what. */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <immintrin.h>

#define CLOSED (1 << 30)
#define SPINS 4000
typedef void (*task_fn)(void*);
static unsigned gen;         /* bumped for every job */
static int state;            /* helpers inside the current job, | CLOSED once the caller is done */
static int sleepers, started;
static task_fn job_fn;
static void* job_arg;
static int job_helpers;                /* helpers 0 .. job_helpers - 1 take part in the current job */
static __thread int width = INT_MAX;   /* helpers the calling thread's jobs may take (pool_width) */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void* helper(void* arg) {
    int index = (int)(intptr_t)arg;
    unsigned seen = __atomic_load_n(&gen, __ATOMIC_SEQ_CST);
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = __atomic_load_n(&gen, __ATOMIC_SEQ_CST)) == seen) {
            if (spins++ < SPINS) { _mm_pause(); continue; }
            __atomic_add_fetch(&sleepers, 1, __ATOMIC_SEQ_CST);
            syscall(SYS_futex, &gen, FUTEX_WAIT_PRIVATE, seen, 0, 0, 0);
            __atomic_sub_fetch(&sleepers, 1, __ATOMIC_SEQ_CST);
            spins = 0;
        }
        seen = g;
        int w;
        if (index >= (w = __atomic_load_n(&job_helpers, __ATOMIC_SEQ_CST))) {
            /* left out of this job (its engine's budget is smaller than the pool): sleep, without spinning or
               counting as a sleeper that every job must wake, until a job wants more helpers */
            while (index >= (w = __atomic_load_n(&job_helpers, __ATOMIC_SEQ_CST)))
                syscall(SYS_futex, &job_helpers, FUTEX_WAIT_PRIVATE, w, 0, 0, 0);
            continue;
        }
        int s = __atomic_load_n(&state, __ATOMIC_SEQ_CST);
        while (!(s & CLOSED))
            if (__atomic_compare_exchange_n(&state, &s, s + 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
                job_fn(job_arg);
                __atomic_sub_fetch(&state, 1, __ATOMIC_SEQ_CST);
                break;
            }
    }
    return 0;
}

/* Start helpers until `count` run (process-wide); returns how many run. */
int pool_start(int count) {
    pthread_mutex_lock(&lock);
    while (started < count) {
        pthread_t t;
        if (pthread_create(&t, 0, helper, (void*)(intptr_t)started) != 0) break;
        pthread_detach(t);
        started++;
    }
    pthread_mutex_unlock(&lock);
    return started;
}

/* At most `helpers` helpers join the jobs this thread runs from now on (an engine whose budget is smaller than
   the pool, which only grows, uses no more than its budget). */
void pool_width(int helpers) { width = helpers; }

/* fn(arg) on the caller and on the helpers; returns when all of them are out of it. One job at a time: a
   second caller (another engine's step) runs its job alone rather than wait. */
void pool_run(task_fn fn, void* arg) {
    if (width <= 0 || pthread_mutex_trylock(&lock) != 0) { fn(arg); return; }
    job_fn = fn;
    job_arg = arg;
    int before = __atomic_exchange_n(&job_helpers, width, __ATOMIC_SEQ_CST);
    __atomic_store_n(&state, 0, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&gen, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST) > 0) syscall(SYS_futex, &gen, FUTEX_WAKE_PRIVATE, INT_MAX, 0, 0, 0);
    if (width > before) syscall(SYS_futex, &job_helpers, FUTEX_WAKE_PRIVATE, INT_MAX, 0, 0, 0);
    fn(arg);
    __atomic_fetch_or(&state, CLOSED, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&state, __ATOMIC_SEQ_CST) & ~CLOSED) _mm_pause();
    pthread_mutex_unlock(&lock);
}
