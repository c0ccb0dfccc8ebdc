/* A kernel library's side of the helper-thread pool (pool.c): `POOL_RUN(fn, arg)` runs a job on the pool once
   Python has handed the library the pool's `pool_run` (`set_pool`), else on the caller alone. Included by one
   source per library. */
#ifndef SWITCHYARD_POOL_CLIENT_H
#define SWITCHYARD_POOL_CLIENT_H
typedef void (*pool_task_fn)(void*);
static void (*pool_run_fn)(pool_task_fn, void*);
void set_pool(void* run) { pool_run_fn = (void (*)(pool_task_fn, void*))run; }
#define POOL_RUN(fn, arg) (pool_run_fn ? pool_run_fn((fn), (arg)) : (fn)(arg))
#endif
