/* Waiting on another thread's store (a ready flag, the helpers leaving a job): a pause between loads (the core's
   sibling hyperthread keeps running, the loop does not flood the memory pipeline), and after SPIN_PAUSES of them a
   yield of the core at every check. Where runnable threads outnumber cores (two vCPUs with the server's event loop
   busy) the thread being waited for may be off its core, and spinning through the waiter's time slice only keeps it
   off. Included by pool.c and by the kernel libraries that wait inside a pool job. */
#ifndef SWITCHYARD_SPIN_WAIT_H
#define SWITCHYARD_SPIN_WAIT_H
#include <sched.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPIN_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define SPIN_PAUSE() __asm__ __volatile__("yield")
#else
#define SPIN_PAUSE() ((void)0)
#endif
/* About 10 to 150 us (a pause is 10 to 150 cycles by CPU): far longer than the waits a kernel expects (another
   thread's rope of a few heads, a helper's last tile), far shorter than a scheduler's time slice. */
#define SPIN_PAUSES 1024

static inline void spin_wait_step(unsigned* spins) {
    if (*spins < SPIN_PAUSES) {
        ++*spins;
        SPIN_PAUSE();
    } else {
        sched_yield();
    }
}
#endif
