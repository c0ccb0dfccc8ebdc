/* The helper-thread pool (its own library, so every kernel library shares one set of threads; native.py's
   HelperThreads). Helpers are plain pthreads that never touch Python: after a job they spin for up to SPIN_NS (the
   next kernel of a step follows within microseconds), then sleep on a futex. A step brackets its kernels with
   pool_wake (sleeping helpers start spinning, so the first job finds them awake) and pool_rest (helpers sleep at
   once rather than spin through the time between steps, when the server's other threads need the cores and a CPU
   quota would be burnt on spinning). A job is `fn(arg)` run by the caller and by every
   helper that joins before the caller is done; kernels hand out work through an atomic counter in `arg`, so a
   helper that joins late (or not at all, when its core is busy) simply does less, and the results do not depend on
   who did what.

   Budgets: each engine's step thread sets how many helpers its jobs may take (pool_width); a thread that never set
   it runs its jobs alone. A job carries its number and width: a helper joins by a CAS on `state`, whose upper half
   is the number of the job it belongs to, so a helper that checked its index against one job's width cannot slip
   into a later, narrower job between that check and its CAS. */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "spin_wait.h"

#define CLOSED (1u << 30)
#define INSIDE (CLOSED - 1)  /* state's low bits: helpers inside the job */
/* How long a helper spins for the next job before it sleeps. By time, not by count: a pause takes from about 10 to
   150 cycles depending on the CPU (60 ns on the AMD EPYC here). Longer than the gaps between a step's jobs (a
   single-threaded attention or norm; tens of microseconds of Python between the kernels where a step is not
   replayed), short enough that a helper does not hold a core long after a step that did not call pool_rest. */
#define SPIN_NS 200000
typedef void (*task_fn)(void*);
static unsigned gen;         /* bumped for every job: the current job's number */
static uint64_t state;       /* the current job's number << 32 | CLOSED once the caller is done | helpers inside */
static int sleepers, started;
static int resting;          /* set by pool_rest: helpers sleep at once instead of spinning */
static task_fn job_fn;
static void* job_arg;
static int job_helpers;                /* helpers 0 .. job_helpers - 1 take part in the current job */
static __thread int width;             /* helpers the calling thread's jobs may take (pool_width); none unset */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* Hand-off counters (pool_stats): what a profile needs to tell the pool's cost from the kernels'. */
static int64_t job_start_ns;           /* when the current job was posted */
static int64_t stat_jobs, stat_woken, stat_join_ns, stat_enter_ns, stat_entered;

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void* helper(void* arg) {
    int index = (int)(intptr_t)arg;
    unsigned seen = __atomic_load_n(&gen, __ATOMIC_SEQ_CST);
    for (;;) {
        unsigned g;
        int spins = 0;
        int64_t spin_from = 0;
        while ((g = __atomic_load_n(&gen, __ATOMIC_SEQ_CST)) == seen) {
            if (!__atomic_load_n(&resting, __ATOMIC_RELAXED)) {
                if (++spins & 63) { SPIN_PAUSE(); continue; }  /* the clock every 64 pauses */
                const int64_t t = now_ns();
                if (!spin_from) spin_from = t;
                if (t - spin_from < SPIN_NS) { SPIN_PAUSE(); continue; }
            }
            __atomic_add_fetch(&sleepers, 1, __ATOMIC_SEQ_CST);
            syscall(SYS_futex, &gen, FUTEX_WAIT_PRIVATE, seen, 0, 0, 0);
            __atomic_sub_fetch(&sleepers, 1, __ATOMIC_SEQ_CST);
            spins = 0;
            spin_from = 0;
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
        /* Join job g only: the CAS fails once `state` belongs to a later job (whose width may leave this helper
           out) or job g is closed. `w` above may be a later job's, but then job g is closed or replaced too. */
        uint64_t s = __atomic_load_n(&state, __ATOMIC_SEQ_CST);
        while ((unsigned)(s >> 32) == g && !(s & CLOSED))
            if (__atomic_compare_exchange_n(&state, &s, s + 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
                __atomic_add_fetch(&stat_enter_ns, now_ns() - __atomic_load_n(&job_start_ns, __ATOMIC_RELAXED),
                                   __ATOMIC_RELAXED);
                __atomic_add_fetch(&stat_entered, 1, __ATOMIC_RELAXED);
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
   the pool, which only grows, uses no more than its budget). Unset, a thread's jobs run on it alone. */
void pool_width(int helpers) { width = helpers; }

/* fn(arg) on the caller and on the helpers; returns when all of them are out of it. One job at a time: a
   second caller (another engine's step) runs its job alone rather than wait. */
void pool_run(task_fn fn, void* arg) {
    if (width <= 0 || pthread_mutex_trylock(&lock) != 0) { fn(arg); return; }
    job_fn = fn;
    job_arg = arg;
    __atomic_store_n(&resting, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&job_start_ns, now_ns(), __ATOMIC_RELAXED);
    int before = __atomic_exchange_n(&job_helpers, width, __ATOMIC_SEQ_CST);
    const unsigned number = __atomic_load_n(&gen, __ATOMIC_SEQ_CST) + 1;  /* only a lock holder bumps gen */
    __atomic_store_n(&state, (uint64_t)number << 32, __ATOMIC_SEQ_CST);
    __atomic_store_n(&gen, number, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST) > 0) {
        syscall(SYS_futex, &gen, FUTEX_WAKE_PRIVATE, INT_MAX, 0, 0, 0);
        stat_woken++;
    }
    if (width > before) syscall(SYS_futex, &job_helpers, FUTEX_WAKE_PRIVATE, INT_MAX, 0, 0, 0);
    fn(arg);
    const int64_t done = now_ns();
    __atomic_fetch_or(&state, CLOSED, __ATOMIC_SEQ_CST);
    unsigned spins = 0;
    while (__atomic_load_n(&state, __ATOMIC_SEQ_CST) & INSIDE) spin_wait_step(&spins);
    stat_join_ns += now_ns() - done;
    stat_jobs++;
    pthread_mutex_unlock(&lock);
}

/* A step's kernels follow: sleeping helpers start spinning now (they wake in tens of microseconds; the step's first
   kernel is not worth waiting for them). */
void pool_wake(void) {
    __atomic_store_n(&resting, 0, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &gen, FUTEX_WAKE_PRIVATE, INT_MAX, 0, 0, 0);
}

/* The step's kernels are done: helpers sleep until the next job instead of spinning. */
void pool_rest(void) { __atomic_store_n(&resting, 1, __ATOMIC_SEQ_CST); }

/* Counters since start, for profiles (bench/step_profile.py): out[0] jobs run on the pool, out[1] of them that
   had to wake a sleeping helper (a futex call), out[2] ns the callers waited after their own share for the helpers
   to leave (the join: hand-off plus the helpers' last tile), out[3] ns from posting a job to a helper entering it,
   summed over out[4] entries. */
void pool_stats(int64_t* out) {
    pthread_mutex_lock(&lock);
    out[0] = stat_jobs;
    out[1] = stat_woken;
    out[2] = stat_join_ns;
    out[3] = __atomic_load_n(&stat_enter_ns, __ATOMIC_RELAXED);
    out[4] = __atomic_load_n(&stat_entered, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&lock);
}
