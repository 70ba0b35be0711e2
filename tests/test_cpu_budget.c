/* ctest-labels: unit */
/*
 * tests/test_cpu_budget.c — how many threads the CPU backend starts, and its
 * pool's adaptive thread count.
 *
 *  - cgroup quotas read from temporary trees laid out as the kernel does:
 *    v2 cpu.max (the smallest along the path wins; "max" is none), v1
 *    cpu.cfs_quota_us / cpu.cfs_period_us (-1 is none), a container that
 *    sees its own cgroup at the root, no cpu controller at all;
 *  - the process's real budget: n_affinity is the affinity mask's count;
 *    restricted to one CPU (sched_setaffinity, as taskset does) auto is 1
 *    and a CPU device created with threads = 0 starts 1 thread;
 *  - the pool runs every task of every job exactly once while its active
 *    count changes, and with two threads confined to one CPU (the worker
 *    can only take the caller's core) it comes down to one active thread;
 *  - its decisions, from measurements fed in (no timing): jobs that had to
 *    wake a sleeping worker do not take a quiet pool down to one thread, one
 *    slow epoch does not either but two running do, and a minority of very
 *    slow jobs (a busy core) does.
 */
#define _GNU_SOURCE
#include "check.h"
#include "cpu_pool.h"
#include "dev.h"

#include <sched.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char dir[256];

static void put(const char *rel, const char *text)
{
	char path[600], tmp[600];
	snprintf(path, sizeof(path), "%s/%s", dir, rel);
	/* make the parent folders */
	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + strlen(dir) + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			mkdir(tmp, 0700);
			*p = '/';
		}
	}
	FILE *f = fopen(path, "w");
	CHECK(f != NULL);
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static double quota(const char *proc_rel, const char *root_rel, char *src, size_t cap)
{
	char proc[600], root[600];
	double q = -1;
	snprintf(proc, sizeof(proc), "%s/%s", dir, proc_rel);
	snprintf(root, sizeof(root), "%s/%s", dir, root_rel);
	kvt_cpu_quota_read(proc, root, &q, src, cap);
	return q;
}

static void test_quota_files(void)
{
	char src[300];
	/* v2: the parent's 1.5 CPUs limit the child whose own is "max" */
	put("v2/proc", "0::/kubepods/pod1\n");
	put("v2/cg/kubepods/pod1/cpu.max", "max 100000\n");
	put("v2/cg/kubepods/cpu.max", "150000 100000\n");
	put("v2/cg/cpu.max", "400000 100000\n");
	CHECK(quota("v2/proc", "v2/cg", src, sizeof(src)) == 1.5);
	CHECKF(strstr(src, "v2/cg/kubepods/cpu.max") != NULL, "source %s", src);
	/* v2 with no quota anywhere */
	put("v2none/proc", "0::/a\n");
	put("v2none/cg/a/cpu.max", "max 100000\n");
	CHECK(quota("v2none/proc", "v2none/cg", src, sizeof(src)) == 0 && src[0] == '\0');
	/* v2 in a container: its cgroup is the mount's root */
	put("v2ns/proc", "0::/\n");
	put("v2ns/cg/cpu.max", "50000 100000\n");
	CHECK(quota("v2ns/proc", "v2ns/cg", src, sizeof(src)) == 0.5);
	/* v1: cpu,cpuacct hierarchy, 2 CPUs */
	put("v1/proc", "12:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n1:name=systemd:/docker/x\n");
	put("v1/cg/cpu,cpuacct/docker/x/cpu.cfs_quota_us", "200000\n");
	put("v1/cg/cpu,cpuacct/docker/x/cpu.cfs_period_us", "100000\n");
	put("v1/cg/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
	put("v1/cg/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
	CHECK(quota("v1/proc", "v1/cg", src, sizeof(src)) == 2.0);
	CHECKF(strstr(src, "docker/x/cpu.cfs_quota_us") != NULL, "source %s", src);
	/* v1 unlimited (-1) */
	put("v1none/proc", "3:cpu:/\n");
	put("v1none/cg/cpu/cpu.cfs_quota_us", "-1\n");
	put("v1none/cg/cpu/cpu.cfs_period_us", "100000\n");
	CHECK(quota("v1none/proc", "v1none/cg", src, sizeof(src)) == 0);
	/* no cpu controller, an unreadable /proc file, junk values */
	put("none/proc", "5:memory:/x\n");
	CHECK(quota("none/proc", "none/cg", src, sizeof(src)) == 0);
	CHECK(quota("missing/proc", "missing/cg", src, sizeof(src)) == 0);
	put("junk/proc", "0::/j\nbroken line\n");
	put("junk/cg/j/cpu.max", "lots 0\n");
	CHECK(quota("junk/proc", "junk/cg", src, sizeof(src)) == 0);
}

static void test_real_budget(void)
{
	kvt_cpu_budget b;
	cpu_set_t set, one;
	kvt_cpu_budget_get(&b);
	CHECK(sched_getaffinity(0, sizeof(set), &set) == 0);
	CHECK_EQ_INT(b.n_affinity, CPU_COUNT(&set));
	CHECK(b.n_auto >= 1 && b.n_auto <= b.n_affinity && b.n_online >= 1);
	printf("  this process: %d online, %d in the mask, quota %.2f (%s): auto %d\n", b.n_online, b.n_affinity,
	       b.quota_cpus, b.quota_source[0] ? b.quota_source : "none", b.n_auto);
	/* as under taskset -c <first CPU> */
	int first = -1;
	for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
		if (CPU_ISSET(c, &set))
			first = c;
	CPU_ZERO(&one);
	CPU_SET(first, &one);
	CHECK(sched_setaffinity(0, sizeof(one), &one) == 0);
	kvt_cpu_budget_get(&b);
	CHECK_EQ_INT(b.n_affinity, 1);
	CHECK_EQ_INT(b.n_auto, 1);
	kvt_dev *d = NULL;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = 0 };
	CHECK(kvt_dev_create(&dc, &d) == KVT_OK);
	if (d)
		CHECK_EQ_INT(kvt_dev_n_threads(d), 1);
	kvt_dev_destroy(d);
	CHECK(sched_setaffinity(0, sizeof(set), &set) == 0);
}

typedef struct job {
	_Atomic uint32_t runs[64]; /* per task */
	uint32_t spin_ns;
} job;

static void task(void *ctx, uint32_t t, uint32_t worker)
{
	job *j = ctx;
	(void)worker;
	atomic_fetch_add(&j->runs[t], 1);
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	do
		clock_gettime(CLOCK_MONOTONIC, &b);
	while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < (long)j->spin_ns);
}

/* Run n jobs of k tasks; false if a task ran other than once. */
static bool run_jobs(kvt_cpu_pool *p, uint32_t n, uint32_t k, uint32_t spin_ns)
{
	static job j;
	for (uint32_t i = 0; i < n; i++) {
		for (uint32_t t = 0; t < k; t++)
			atomic_store(&j.runs[t], 0);
		j.spin_ns = spin_ns;
		kvt_cpu_pool_run(p, k, task, &j);
		for (uint32_t t = 0; t < k; t++)
			if (atomic_load(&j.runs[t]) != 1)
				return false;
	}
	return true;
}

static void test_pool(void)
{
	cpu_set_t set, one;
	CHECK(sched_getaffinity(0, sizeof(set), &set) == 0);
	/* every task once, adaptive or not, with its count switched between jobs */
	kvt_cpu_pool *p = NULL;
	CHECK(kvt_cpu_pool_create(3, &p) == KVT_OK);
	for (int r = 0; r < 6; r++) {
		kvt_cpu_pool_set_adaptive(p, r % 2 == 0);
		CHECK(run_jobs(p, 700, 1 + (uint32_t)r * 9, 0));
	}
	kvt_cpu_pool_destroy(p);

	/* two threads on one CPU: slower than one, so the pool comes down to one */
	int first = -1;
	for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
		if (CPU_ISSET(c, &set))
			first = c;
	CPU_ZERO(&one);
	CPU_SET(first, &one);
	CHECK(sched_setaffinity(0, sizeof(one), &one) == 0); /* the workers inherit it */
	CHECK(kvt_cpu_pool_create(2, &p) == KVT_OK);
	CHECK_EQ_INT(kvt_cpu_pool_n_active(p), 2);
	uint32_t jobs = 0;
	while (kvt_cpu_pool_n_active(p) != 1 && jobs < 256 * 64) {
		CHECK(run_jobs(p, 256, 8, 20000));
		jobs += 256;
	}
	CHECKF(kvt_cpu_pool_n_active(p) == 1, "two threads on one CPU: still %u active after %u jobs",
	       kvt_cpu_pool_n_active(p), jobs);
	printf("  two threads on one CPU: one active after %u jobs\n", jobs);
	kvt_cpu_pool_destroy(p);
	CHECK(sched_setaffinity(0, sizeof(set), &set) == 0);
}

/*
 * The adaptive count's decisions, from measurements fed in (kvt_cpu_pool_feed,
 * no timing here). Sampled jobs are every 16th; an epoch is 256 jobs. Fed
 * `epochs` epochs of jobs whose sampled ones take wall_us against a
 * one-thread 32 us, every `every`-th sample instead taking odd_us (woke: it
 * had to wake a sleeping worker), returns the share of jobs that ran with one
 * thread active.
 */
static double feed(kvt_cpu_pool *p, int epochs, double wall_us, int every, double odd_us, bool woke)
{
	uint32_t at1 = 0, sample = 0;
	for (int j = 0; j < epochs * 256; j++) {
		bool odd = every && ((j + 1) % 16 == 0) && (++sample % every == 0); /* a sampled job */
		at1 += kvt_cpu_pool_n_active(p) == 1;
		kvt_cpu_pool_feed(p, (odd ? odd_us : wall_us) * 1e-6, 32e-6, odd && woke);
	}
	return (double)at1 / (epochs * 256);
}

static void test_pool_decisions(void)
{
	kvt_cpu_pool *p = NULL;
	/*
	 * A quiet machine: every job 1.6x faster on two threads, but one sampled job
	 * in four pays for waking a sleeping worker (500 us, a decode step's first
	 * job after the sampler ran alone). Those say nothing about sharing the
	 * cores: the pool keeps both threads but for its probes (one epoch in 16 at
	 * first). Counting them (the old estimate) put it on one thread at once.
	 */
	CHECK(kvt_cpu_pool_create(2, &p) == KVT_OK);
	double s1 = feed(p, 64, 20, 4, 500, true);
	CHECKF(s1 < 0.15, "quiet machine, wake-ups: %.0f%% of jobs on one thread", 100 * s1);
	kvt_cpu_pool_destroy(p);
	/* one slow epoch (a neighbour's burst) is not enough; two running are */
	CHECK(kvt_cpu_pool_create(2, &p) == KVT_OK);
	feed(p, 1, 20, 0, 0, false);
	feed(p, 1, 64, 0, 0, false);
	CHECK_EQ_INT(kvt_cpu_pool_n_active(p), 2);
	feed(p, 1, 20, 0, 0, false);
	CHECK_EQ_INT(kvt_cpu_pool_n_active(p), 2);
	feed(p, 2, 64, 0, 0, false);
	CHECK_EQ_INT(kvt_cpu_pool_n_active(p), 1);
	kvt_cpu_pool_destroy(p);
	/*
	 * A busy core: most jobs fast, one in four very slow (the worker waited for
	 * its core; it was not asleep). The time goes to the slow ones, so the
	 * pool comes down (a median of per-job speed-ups would say 1.6x and stay).
	 */
	CHECK(kvt_cpu_pool_create(2, &p) == KVT_OK);
	double s2 = feed(p, 8, 20, 4, 400, false);
	CHECK_EQ_INT(kvt_cpu_pool_n_active(p), 1);
	CHECKF(s2 > 0.5, "busy core: only %.0f%% of jobs on one thread", 100 * s2);
	kvt_cpu_pool_destroy(p);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/kvt_test_cpu_budget_XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	test_quota_files();
	test_real_budget();
	test_pool();
	test_pool_decisions();
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
	return check_done("test_cpu_budget");
}
