/*
 * gpu/cpu_pool.c — worker threads for the CPU backend (see cpu_pool.h).
 *
 * Protocol: the caller publishes fn/ctx/n_tasks, resets the task counter and
 * the count of workers still busy, then bumps gen (release). A worker that
 * sees a new gen (acquire) claims tasks until the counter passes n_tasks and
 * then decrements busy (release); the caller, after claiming tasks itself,
 * waits for busy to reach 0 (acquire). Sleepers are woken under the mutex, so
 * a worker cannot miss a bump between its last check and its wait.
 */
#include "cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Spin this many polls, then yield this many times, then sleep. */
#define SPIN_POLLS 4000
#define YIELD_POLLS 200

typedef struct worker_arg {
	kvt_cpu_pool *pool;  /* owner */
	uint32_t index;      /* worker number, 1.. */
} worker_arg;

struct kvt_cpu_pool {
	uint32_t n_threads;          /* workers + the caller */
	pthread_t *threads;          /* [n_threads - 1] */
	worker_arg *args;            /* [n_threads - 1] */
	_Atomic uint64_t gen;        /* job generation; bumped per job */
	_Atomic uint32_t next;       /* next task to claim */
	_Atomic uint32_t busy;       /* workers not yet done with this job */
	kvt_cpu_task_fn fn;          /* current job */
	void *ctx;                   /* its context */
	uint32_t n_tasks;            /* its task count */
	bool stop;                   /* workers exit (under mu) */
	pthread_mutex_t mu;          /* guards sleeping and stop */
	pthread_cond_t cv;           /* signalled on a new job or stop */
	uint32_t sleeping;           /* workers waiting on cv */
};

static void claim_tasks(kvt_cpu_pool *p, uint32_t worker)
{
	for (;;) {
		uint32_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
		if (t >= p->n_tasks)
			return;
		p->fn(p->ctx, t, worker);
	}
}

/* Wait until gen differs from seen; false when the pool is stopping. */
static bool wait_job(kvt_cpu_pool *p, uint64_t seen)
{
	for (int i = 0; i < SPIN_POLLS; i++) {
		if (atomic_load_explicit(&p->gen, memory_order_acquire) != seen)
			return true;
		cpu_relax();
	}
	for (int i = 0; i < YIELD_POLLS; i++) {
		if (atomic_load_explicit(&p->gen, memory_order_acquire) != seen)
			return true;
		sched_yield();
	}
	pthread_mutex_lock(&p->mu);
	p->sleeping++;
	while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen && !p->stop)
		pthread_cond_wait(&p->cv, &p->mu);
	p->sleeping--;
	bool go = !p->stop;
	pthread_mutex_unlock(&p->mu);
	return go;
}

static void *worker_main(void *arg)
{
	worker_arg *wa = arg;
	kvt_cpu_pool *p = wa->pool;
	uint64_t seen = 0;

	while (wait_job(p, seen)) {
		seen = atomic_load_explicit(&p->gen, memory_order_acquire);
		claim_tasks(p, wa->index);
		atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
	}
	return NULL;
}

int kvt_cpu_pool_create(uint32_t n_threads, kvt_cpu_pool **out)
{
	kvt_cpu_pool *p = calloc(1, sizeof(*p));

	if (!p || n_threads == 0) {
		free(p);
		return n_threads ? KVT_ENOMEM : KVT_EINVAL;
	}
	p->n_threads = n_threads;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	if (n_threads > 1) {
		p->threads = calloc(n_threads - 1, sizeof(*p->threads));
		p->args = calloc(n_threads - 1, sizeof(*p->args));
		if (!p->threads || !p->args) {
			kvt_cpu_pool_destroy(p);
			return KVT_ENOMEM;
		}
	}
	for (uint32_t i = 0; i + 1 < n_threads; i++) {
		p->args[i] = (worker_arg){ .pool = p, .index = i + 1 };
		int e = pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]);
		if (e) {
			KVT_LOGE("cpu: cannot start worker thread %u (errno %d)", i + 1, e);
			p->n_threads = i + 1; /* only the started ones are joined */
			kvt_cpu_pool_destroy(p);
			return KVT_ENOMEM;
		}
	}
	*out = p;
	return KVT_OK;
}

void kvt_cpu_pool_destroy(kvt_cpu_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	/* spinning or yielding workers see stop only through gen */
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
	for (uint32_t i = 0; p->threads && i + 1 < p->n_threads; i++)
		pthread_join(p->threads[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p->threads);
	free(p->args);
	free(p);
}

uint32_t kvt_cpu_pool_n_threads(const kvt_cpu_pool *p)
{
	return p->n_threads;
}

void kvt_cpu_pool_run(kvt_cpu_pool *p, uint32_t n_tasks, kvt_cpu_task_fn fn, void *ctx)
{
	if (n_tasks == 0)
		return;
	if (p->n_threads == 1 || n_tasks == 1) {
		for (uint32_t t = 0; t < n_tasks; t++)
			fn(ctx, t, 0);
		return;
	}
	p->fn = fn;
	p->ctx = ctx;
	p->n_tasks = n_tasks;
	atomic_store_explicit(&p->next, 0, memory_order_relaxed);
	atomic_store_explicit(&p->busy, p->n_threads - 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
	pthread_mutex_lock(&p->mu);
	if (p->sleeping)
		pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);

	claim_tasks(p, 0);
	for (uint32_t i = 0; atomic_load_explicit(&p->busy, memory_order_acquire) != 0; i++) {
		if (i < SPIN_POLLS)
			cpu_relax();
		else
			sched_yield();
	}
}
