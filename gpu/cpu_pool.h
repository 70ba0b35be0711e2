/*
 * gpu/cpu_pool.h — the CPU backend's worker threads (internal to gpu/).
 *
 * One job at a time: kvt_cpu_pool_run() hands n_tasks tasks to the workers
 * and the calling thread, which claim them from a shared counter, and returns
 * when all have finished. Idle workers spin briefly, then yield the core,
 * then sleep on a condition variable: a decode step issues hundreds of short
 * jobs, so waking must be fast, but on a machine with more runnable threads
 * than cores a spinning waiter must not hold the core its teammate needs
 * (OpenMP's default spin-wait made tests run 10-30x slower there).
 */
#ifndef KVT_CPU_POOL_H
#define KVT_CPU_POOL_H

#include "kvt.h"

typedef struct kvt_cpu_pool kvt_cpu_pool;

/* Runs task number `task` on worker `worker` (0 = the caller; < n_threads). */
typedef void (*kvt_cpu_task_fn)(void *ctx, uint32_t task, uint32_t worker);

/* n_threads counts the caller: n_threads - 1 workers are started. */
int kvt_cpu_pool_create(uint32_t n_threads, kvt_cpu_pool **out);
void kvt_cpu_pool_destroy(kvt_cpu_pool *p); /* NULL is a no-op */
/*
 * Threads taking part in jobs now (1..n_threads): fewer while other
 * processes hold the cores (adaptive; see cpu_pool.c).
 */
uint32_t kvt_cpu_pool_n_active(const kvt_cpu_pool *p);
/* Adapt the active count (default on), or always use every thread (off). Caller's thread. */
void kvt_cpu_pool_set_adaptive(kvt_cpu_pool *p, bool on);
/* Run tasks 0..n_tasks-1 and wait for all. One caller at a time. */
void kvt_cpu_pool_run(kvt_cpu_pool *p, uint32_t n_tasks, kvt_cpu_task_fn fn, void *ctx);
/*
 * Tests: count one job of the adaptive thread count as kvt_cpu_pool_run
 * does, with the times it would measure if it is a sampled one (wall and
 * one-thread estimate, seconds; woke: it had to wake a sleeping worker), and
 * run no tasks. Caller's thread, never beside kvt_cpu_pool_run.
 */
void kvt_cpu_pool_feed(kvt_cpu_pool *p, double wall_s, double one_s, bool woke);

#endif
