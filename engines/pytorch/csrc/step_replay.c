/* Replays a decode step's recorded kernel calls in one C call (engines/pytorch/step_replay.py): the same
   functions with the same arguments, in the same order, without returning to Python between them, so the helper
   threads stay hot from one kernel to the next and no Python runs inside the step.

   A call is stored as its function pointer and its arguments sorted into the x86-64 System V classes: integers and
   pointers (passed in rdi, rsi, rdx, rcx, r8, r9, then on the stack in order) and floats (xmm0-7). Calling every
   function through one prototype with REPLAY_INTS integer and REPLAY_FLOATS float parameters therefore puts each
   argument where the callee reads it; the callee ignores the extra ones (the caller pops them), reads an `int` from
   the low half of its register or stack slot, and its return value (an `int` status, or nothing) comes back in eax.
   Before a call, small byte ranges it counts in (work counters passed by reference) are reset to their recorded
   values. Python builds the calls only on x86-64. */
#include <stdint.h>
#include <string.h>

#define REPLAY_INTS 24
#define REPLAY_FLOATS 8
/* One call as int64 words (Python fills a [calls, REPLAY_WORDS] int64 array): */
enum { W_FN, W_RETURNS_INT, W_RESET_FIRST, W_RESET_COUNT, W_INTS, W_FLOATS = W_INTS + REPLAY_INTS,
       REPLAY_WORDS = W_FLOATS + REPLAY_FLOATS / 2 };

typedef int64_t (*replay_fn)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float, float, float,
                             float, float, float, float);

/* The words per call, for Python to check its layout against. */
int replay_words(void) { return REPLAY_WORDS; }

/* Runs calls[0 .. n) in order; resets: [dst, src, bytes] triples. Returns 0, or i + 1 when call i returned a
   nonzero status (the calls after it are not run). */
int replay_run(const int64_t* calls, int n, const int64_t* resets) {
    for (int i = 0; i < n; i++) {
        const int64_t* c = calls + (int64_t)i * REPLAY_WORDS;
        for (int64_t r = c[W_RESET_FIRST]; r < c[W_RESET_FIRST] + c[W_RESET_COUNT]; r++)
            memcpy((void*)resets[3 * r], (const void*)resets[3 * r + 1], (size_t)resets[3 * r + 2]);
        const int64_t* a = c + W_INTS;
        float f[REPLAY_FLOATS];
        memcpy(f, c + W_FLOATS, sizeof f);
        const int64_t rc = ((replay_fn)c[W_FN])(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10],
                                                a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20],
                                                a[21], a[22], a[23], f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]);
        if (c[W_RETURNS_INT] && (int32_t)rc != 0) return i + 1;
    }
    return 0;
}
