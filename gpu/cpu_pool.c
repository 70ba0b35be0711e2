/*
 * gpu/cpu_pool.c — worker threads for the CPU backend (see cpu_pool.h), and
 * how many the process should start (kvt_cpu_budget_get, dev.h).
 *
 * Protocol: the caller publishes fn/ctx/n_tasks, resets the task counter and
 * the count of workers still busy, then bumps the job word (release): the
 * job's generation and how many threads take part in it (n_active). A
 * worker that sees a new word (acquire) and is one of the first n_active
 * claims tasks until the counter passes n_tasks and then decrements busy
 * (release); one that is not parks on park_cv until n_active includes it
 * again. The caller, after claiming tasks itself, waits for busy to reach 0
 * (acquire). Sleepers are woken under the mutex, so a worker cannot miss a
 * bump between its last check and its wait. n_active changes only between
 * jobs, on the caller's thread: a worker counted in a job is always waited
 * for, so the word cannot move past a job it takes part in.
 *
 * Degrading when cores are busy: a job is only as fast as its slowest
 * thread, and a worker whose core another process holds is descheduled for
 * a time slice (milliseconds) while a decode job lasts tens of
 * microseconds, so two threads on two cores, one of them busy, ran decode
 * at half the speed of one thread. The caller therefore measures, on one
 * job in SAMPLE_EVERY, the job's wall time against a one-thread estimate
 * (its own CPU time per task x the tasks), sums them over an epoch of
 * EPOCH_JOBS jobs, and from that speed-up chooses n_active: halved when
 * threads made it slower than one thread in BAD_EPOCHS epochs running; a
 * neighbour (one more, or one fewer) tried for one epoch every probe
 * interval and kept when it is faster by PROBE_GAIN; the interval doubles
 * after each failed probe (up to PROBE_MAX_EPOCHS), so trying costs little
 * when the answer stays the same.
 *
 * NOTE: leaving out the jobs that had to wake a sleeping worker, and the
 * run of bad epochs, are what keep a quiet machine at full speed. A decode
 * step starts with its workers asleep (the sampler ran alone), and waking
 * one costs ~100 us in a VM against a 20-40 us job: one such job among an
 * epoch's 16 samples pulled the ratio under 1.0, the pool halved, and a
 * probe back up could fail the same way (measured on Gemma 3 decode: 22-25%
 * of the jobs of 3 runs in 4 on one thread). That wake-up is a cost of the
 * pause before the job, not of sharing it, and is paid once a token. The
 * estimate stays a ratio of sums, not a median of ratios: a busy core
 * shows as a minority of very slow jobs, which a median would not see
 * (measured: busy auto fell from 0.93x to 0.84x of one thread).
 */
#define _GNU_SOURCE
#include "cpu_pool.h"
#include "dev.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Spin this many polls, then yield this many times, then sleep. */
#define SPIN_POLLS 4000
#define YIELD_POLLS 200
/* Adaptive thread count (see above). */
#define SAMPLE_EVERY 16      /* jobs per measured job (a thread CPU clock read costs ~2.5 us in a VM) */
#define EPOCH_JOBS 256       /* jobs per decision */
#define PROBE_MIN_EPOCHS 16  /* epochs between probes, at first and after a successful one */
#define PROBE_MAX_EPOCHS 512 /* ... at most, after failed ones */
#define PROBE_GAIN 1.05      /* a probed count must be this much faster to be kept */
#define BAD_EPOCHS 2         /* epochs running slower than one thread before n_active halves */


#define JOB_WORD(gen, active) (((uint64_t)(gen) << 16) | (uint64_t)(active))
#define JOB_ACTIVE(w) ((uint32_t)((w) & 0xffffu))

typedef struct worker_arg {
	kvt_cpu_pool *pool;  /* owner */
	uint32_t index;      /* worker number, 1.. */
} worker_arg;

struct kvt_cpu_pool {
	uint32_t n_threads;          /* workers + the caller */
	pthread_t *threads;          /* [n_threads - 1] */
	worker_arg *args;            /* [n_threads - 1] */
	_Atomic uint64_t job;        /* JOB_WORD(generation, n_active); bumped per job */
	_Atomic uint32_t next;       /* next task to claim */
	_Atomic uint32_t busy;       /* workers not yet done with this job */
	kvt_cpu_task_fn fn;          /* current job */
	void *ctx;                   /* its context */
	uint32_t n_tasks;            /* its task count */
	bool stop;                   /* workers exit (under mu) */
	pthread_mutex_t mu;          /* guards sleeping, park_active and stop */
	pthread_cond_t cv;           /* signalled on a new job or stop */
	pthread_cond_t park_cv;      /* signalled when park_active grows, or stop */
	uint32_t sleeping;           /* workers waiting on cv */
	uint32_t park_active;        /* n_active as parked workers see it (under mu) */
	/* the caller's (one caller at a time) */
	uint64_t gen;                /* jobs published */
	uint32_t n_active;           /* threads taking part in jobs now, 1..n_threads */
	bool adapt;                  /* adapt n_active (false: always n_threads) */
	uint32_t n_jobs;             /* jobs in this epoch */
	double sum_wall, sum_one;    /* this epoch's measured jobs: wall time, one-thread estimate */
	uint32_t n_bad;              /* epochs running whose speed-up was under 1 */
	bool probing;                /* this epoch tries probe_from's neighbour */
	uint32_t probe_from;         /* n_active before the probe */
	double speedup_from;         /* its speed-up */
	uint32_t epochs_to_probe;    /* epochs left until the next probe */
	uint32_t probe_interval;     /* epochs between probes now */
	bool probe_down;             /* the next probe tries one thread fewer */
	uint64_t n_changes;          /* n_active changes (statistics) */
};

static uint32_t claim_tasks(kvt_cpu_pool *p, uint32_t worker)
{
	uint32_t n = 0;
	for (;;) {
		uint32_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
		if (t >= p->n_tasks)
			return n;
		p->fn(p->ctx, t, worker);
		n++;
	}
}

/* Wait until the job word differs from seen; false when the pool is stopping. */
static bool wait_job(kvt_cpu_pool *p, uint64_t seen)
{
	for (int i = 0; i < SPIN_POLLS; i++) {
		if (atomic_load_explicit(&p->job, memory_order_acquire) != seen)
			return true;
		cpu_relax();
	}
	for (int i = 0; i < YIELD_POLLS; i++) {
		if (atomic_load_explicit(&p->job, memory_order_acquire) != seen)
			return true;
		sched_yield();
	}
	pthread_mutex_lock(&p->mu);
	p->sleeping++;
	while (atomic_load_explicit(&p->job, memory_order_acquire) == seen && !p->stop)
		pthread_cond_wait(&p->cv, &p->mu);
	p->sleeping--;
	bool go = !p->stop;
	pthread_mutex_unlock(&p->mu);
	return go;
}

/* Not among the active threads: sleep until the caller counts this worker in again; false on stop. */
static bool park(kvt_cpu_pool *p, uint32_t index)
{
	pthread_mutex_lock(&p->mu);
	while (index >= p->park_active && !p->stop)
		pthread_cond_wait(&p->park_cv, &p->mu);
	bool go = !p->stop;
	pthread_mutex_unlock(&p->mu);
	return go;
}

static void *worker_main(void *arg)
{
	worker_arg *wa = arg;
	kvt_cpu_pool *p = wa->pool;
	uint64_t seen = JOB_WORD(0, p->n_threads);

	while (wait_job(p, seen)) {
		seen = atomic_load_explicit(&p->job, memory_order_acquire);
		if (wa->index >= JOB_ACTIVE(seen)) {
			if (!park(p, wa->index))
				break;
			continue; /* wait for a job newer than the one skipped */
		}
		claim_tasks(p, wa->index);
		atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
	}
	return NULL;
}

int kvt_cpu_pool_create(uint32_t n_threads, kvt_cpu_pool **out)
{
	kvt_cpu_pool *p = calloc(1, sizeof(*p));

	if (!p || n_threads == 0 || n_threads > 0xffffu) {
		free(p);
		return p || !n_threads ? KVT_EINVAL : KVT_ENOMEM;
	}
	p->n_threads = p->n_active = p->park_active = n_threads;
	p->adapt = n_threads > 1;
	p->probe_interval = p->epochs_to_probe = PROBE_MIN_EPOCHS;
	p->probe_down = true;
	atomic_store(&p->job, JOB_WORD(0, n_threads));
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	pthread_cond_init(&p->park_cv, NULL);
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
	pthread_cond_broadcast(&p->park_cv);
	pthread_mutex_unlock(&p->mu);
	/* spinning or yielding workers see stop only through the job word */
	atomic_store_explicit(&p->job, JOB_WORD(p->gen + 1, p->n_threads), memory_order_release);
	for (uint32_t i = 0; p->threads && i + 1 < p->n_threads; i++)
		pthread_join(p->threads[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	pthread_cond_destroy(&p->park_cv);
	free(p->threads);
	free(p->args);
	free(p);
}

uint32_t kvt_cpu_pool_n_active(const kvt_cpu_pool *p)
{
	return p->n_active;
}

void kvt_cpu_pool_set_adaptive(kvt_cpu_pool *p, bool on)
{
	p->adapt = on && p->n_threads > 1;
	if (!p->adapt)
		p->n_active = p->n_threads; /* published with the next job; parked workers are woken then */
}

static double now_s(clockid_t clk)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* An epoch ended: choose n_active for the next one (see the file comment). */
static void adapt_epoch(kvt_cpu_pool *p)
{
	double sp = p->n_active == 1 ? 1.0 : p->sum_wall > 0 ? p->sum_one / p->sum_wall : 0.0;
	uint32_t before = p->n_active;
	if (p->n_active > 1 && p->sum_wall <= 0) /* nothing measured: decide next epoch */
		return;
	p->n_jobs = 0;
	p->sum_wall = p->sum_one = 0;
	p->n_bad = p->n_active > 1 && sp < 1.0 ? p->n_bad + 1 : 0;
	if (p->probing) {
		p->probing = false;
		if (sp > p->speedup_from * PROBE_GAIN) {
			p->probe_interval = PROBE_MIN_EPOCHS;
		} else {
			p->n_active = p->probe_from;
			p->probe_interval = p->probe_interval * 2 < PROBE_MAX_EPOCHS ? p->probe_interval * 2 : PROBE_MAX_EPOCHS;
		}
		p->epochs_to_probe = p->probe_interval;
	} else if (p->n_bad >= BAD_EPOCHS) {
		p->n_active /= 2; /* slower than one thread: some of ours wait for cores */
		p->n_bad = 0;
		p->probe_interval = p->epochs_to_probe = PROBE_MIN_EPOCHS;
	} else if (--p->epochs_to_probe == 0) {
		bool down = p->n_active == p->n_threads || (p->probe_down && p->n_active > 1);
		p->probe_down = !p->probe_down;
		p->probing = true;
		p->probe_from = p->n_active;
		p->speedup_from = sp;
		p->n_active += down ? -1 : 1;
	}
	if (p->n_active != before)
		p->n_changes++;
}

/* A measured job: its wall time and one-thread estimate, unless it had to wake a worker (see the file comment). */
static void add_sample(kvt_cpu_pool *p, double wall_s, double one_s, bool woke)
{
	if (woke)
		return;
	p->sum_wall += wall_s;
	p->sum_one += one_s;
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
	if (p->adapt && ++p->n_jobs >= EPOCH_JOBS)
		adapt_epoch(p);
	const uint32_t active = p->n_active;
	if (active != p->park_active) {
		pthread_mutex_lock(&p->mu);
		bool grow = active > p->park_active;
		p->park_active = active;
		if (grow)
			pthread_cond_broadcast(&p->park_cv);
		pthread_mutex_unlock(&p->mu);
	}
	if (active == 1) {
		for (uint32_t t = 0; t < n_tasks; t++)
			fn(ctx, t, 0);
		return;
	}
	const bool measure = p->adapt && p->n_jobs % SAMPLE_EVERY == 0;
	double w0 = 0, c0 = 0;
	if (measure) {
		w0 = now_s(CLOCK_MONOTONIC);
		c0 = now_s(CLOCK_THREAD_CPUTIME_ID);
	}
	p->fn = fn;
	p->ctx = ctx;
	p->n_tasks = n_tasks;
	atomic_store_explicit(&p->next, 0, memory_order_relaxed);
	atomic_store_explicit(&p->busy, active - 1, memory_order_relaxed);
	atomic_store_explicit(&p->job, JOB_WORD(++p->gen, active), memory_order_release);
	pthread_mutex_lock(&p->mu);
	const bool woke = p->sleeping > 0;
	if (woke)
		pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);

	uint32_t mine = claim_tasks(p, 0);
	double c1 = measure ? now_s(CLOCK_THREAD_CPUTIME_ID) : 0;
	for (uint32_t i = 0; atomic_load_explicit(&p->busy, memory_order_acquire) != 0; i++) {
		if (i < SPIN_POLLS)
			cpu_relax();
		else
			sched_yield();
	}
	if (measure && mine)
		add_sample(p, now_s(CLOCK_MONOTONIC) - w0, (c1 - c0) * n_tasks / mine, woke);
}

void kvt_cpu_pool_feed(kvt_cpu_pool *p, double wall_s, double one_s, bool woke)
{
	if (p->adapt && ++p->n_jobs >= EPOCH_JOBS)
		adapt_epoch(p);
	if (p->adapt && p->n_active > 1 && p->n_jobs % SAMPLE_EVERY == 0)
		add_sample(p, wall_s, one_s, woke);
}

/* ---- the CPUs this process may use ---- */

/* The first line of a file, NUL-terminated; false if unreadable. */
static bool read_line(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	bool ok = fgets(buf, (int)cap, f) != NULL;
	fclose(f);
	return ok;
}

/* The quota (CPUs) of one cgroup directory, v2 or v1; 0 = none or unreadable. */
static double dir_quota(const char *dir, bool v2, char *source, size_t source_cap)
{
	char path[4200], line[128];
	double q = 0;
	if (v2) {
		snprintf(path, sizeof(path), "%s/cpu.max", dir);
		char max[32];
		long long quota, period;
		if (read_line(path, line, sizeof(line)) && sscanf(line, "%31s %lld", max, &period) == 2 && period > 0 &&
		    strcmp(max, "max") && sscanf(max, "%lld", &quota) == 1 && quota > 0)
			q = (double)quota / (double)period;
	} else {
		long long quota = -1, period = 0;
		snprintf(path, sizeof(path), "%s/cpu.cfs_quota_us", dir);
		if (read_line(path, line, sizeof(line)))
			sscanf(line, "%lld", &quota);
		char ppath[4200];
		snprintf(ppath, sizeof(ppath), "%s/cpu.cfs_period_us", dir);
		if (read_line(ppath, line, sizeof(line)))
			sscanf(line, "%lld", &period);
		if (quota > 0 && period > 0)
			q = (double)quota / (double)period;
	}
	if (q > 0 && source)
		snprintf(source, source_cap, "%s", path);
	return q;
}

/* The smallest quota from root/rel up to root (each level limits those below). */
static double walk_quota(const char *root, const char *rel, bool v2, char *source, size_t source_cap)
{
	char dir[4096], best_src[4200] = "", src[4200];
	double best = 0;
	snprintf(dir, sizeof(dir), "%s%s%s", root, rel[0] == '/' ? "" : "/", rel);
	size_t root_len = strlen(root);
	for (;;) {
		size_t n = strlen(dir);
		while (n > root_len && dir[n - 1] == '/')
			dir[--n] = '\0';
		double q = dir_quota(dir, v2, src, sizeof(src));
		if (q > 0 && (best == 0 || q < best)) {
			best = q;
			snprintf(best_src, sizeof(best_src), "%s", src);
		}
		char *slash = strrchr(dir, '/');
		if (n <= root_len || !slash || (size_t)(slash - dir) < root_len)
			break;
		*slash = '\0';
	}
	if (best > 0 && source)
		snprintf(source, source_cap, "%s", best_src);
	return best;
}

void kvt_cpu_quota_read(const char *proc_cgroup_path, const char *cgroup_root, double *cpus, char *source,
			size_t source_cap)
{
	char line[4096], src[4200] = "";
	double best = 0;
	*cpus = 0;
	if (source && source_cap)
		source[0] = '\0';
	FILE *f = fopen(proc_cgroup_path, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		/* hierarchy-ID:controller-list:cgroup-path */
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2)
			continue;
		*c1 = *c2 = '\0';
		const char *ctrl = c1 + 1, *rel = c2 + 1;
		double q = 0;
		char dir[4200];
		if (!strcmp(line, "0") && !ctrl[0]) { /* v2: the unified hierarchy */
			q = walk_quota(cgroup_root, rel, true, src, sizeof(src));
			if (q == 0) { /* a namespaced container sees its own cgroup at the root */
				snprintf(dir, sizeof(dir), "%s/unified", cgroup_root);
				q = walk_quota(dir, rel, true, src, sizeof(src));
			}
		} else {
			bool has_cpu = false;
			char list[256];
			snprintf(list, sizeof(list), "%s", ctrl);
			for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save))
				has_cpu = has_cpu || !strcmp(t, "cpu");
			if (!has_cpu)
				continue;
			static const char *const mounts[] = { "cpu,cpuacct", "cpu", "cpuacct,cpu" };
			for (size_t m = 0; m < sizeof(mounts) / sizeof(mounts[0]) && q == 0; m++) {
				snprintf(dir, sizeof(dir), "%s/%s", cgroup_root, mounts[m]);
				q = walk_quota(dir, rel, false, src, sizeof(src));
			}
		}
		if (q > 0 && (best == 0 || q < best)) {
			best = q;
			if (source)
				snprintf(source, source_cap, "%s", src);
		}
	}
	fclose(f);
	*cpus = best;
}

void kvt_cpu_budget_get(kvt_cpu_budget *b)
{
	memset(b, 0, sizeof(*b));
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	b->n_online = n > 0 ? (int)n : 1;
	b->n_affinity = b->n_online;
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
		b->n_affinity = CPU_COUNT(&set);
	kvt_cpu_quota_read("/proc/self/cgroup", "/sys/fs/cgroup", &b->quota_cpus, b->quota_source,
			   sizeof(b->quota_source));
	b->n_auto = b->n_affinity;
	if (b->quota_cpus > 0 && ceil(b->quota_cpus) < b->n_auto)
		b->n_auto = (int)ceil(b->quota_cpus);
	if (b->n_auto < 1)
		b->n_auto = 1;
}
