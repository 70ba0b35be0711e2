/* ctest-labels: unit */
/*
 * tests/test_dev_blas.c — the CPU backend runs OpenBLAS on kernels this CPU
 * has (gpu/dev_cpu.c blas_core_check).
 *
 * Debian 12's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its SSE3 "Prescott"
 * kernels on CPUs newer than itself (an Emerald Rapids Xeon, family 6 model
 * 207): prefill's sgemm ran 2.6-3.3x slower there. The device asks it again
 * for the kernels that match the CPU's instructions.
 *
 *  - on a CPU with AVX2 and FMA the device's name names an OpenBLAS core that
 *    uses them (whether the library found it or the device switched it);
 *  - a user's OPENBLAS_CORETYPE is kept: a child started with Prescott gets
 *    Prescott, and its sgemm still gives the right numbers;
 *  - an sgemm on the chosen kernels matches a plain triple loop.
 */
#include "check.h"
#include "dev.h"

#include <cblas.h>
#include <spawn.h>
#include <strings.h>
#include <sys/wait.h>

extern char **environ;

static const char *core_of(const char *name)
{
	const char *p = strstr(name, "openblas ");
	return p ? p + strlen("openblas ") : NULL;
}

static bool core_has_avx2(const char *core)
{
	static const char *const good[] = { "Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator" };
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		if (!strncasecmp(core, good[i], strlen(good[i])) && core[strlen(good[i])] == ')')
			return true;
	return false;
}

/* An sgemm big enough to go through the kernels (not a small-matrix path), against a triple loop. */
static void check_sgemm(void)
{
	enum { M = 67, N = 131, K = 257 };
	static float a[M * K], b[N * K], c[M * N];
	check_rng r = { 7 };
	for (int i = 0; i < M * K; i++)
		a[i] = check_rng_f32(&r);
	for (int i = 0; i < N * K; i++)
		b[i] = check_rng_f32(&r);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
	double worst = 0;
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double ref = 0;
			for (int k = 0; k < K; k++)
				ref += (double)a[i * K + k] * b[j * K + k];
			double e = fabs(ref - c[i * N + j]);
			if (e > worst)
				worst = e;
		}
	CHECKF(worst < 1e-3, "sgemm on %s differs from the loop by %g", openblas_get_corename(), worst);
}

static int child(void)
{
	kvt_dev_config cfg = { .kind = KVT_DEV_CPU, .n_threads = 1 };
	kvt_dev *d = NULL;
	CHECK(kvt_dev_create(&cfg, &d) == KVT_OK);
	const char *core = core_of(kvt_dev_name(d));
	CHECKF(core && !strncmp(core, "Prescott)", 9), "OPENBLAS_CORETYPE=Prescott: the device says %s",
	       kvt_dev_name(d));
	check_sgemm();
	kvt_dev_destroy(d);
	return check_done("test_dev_blas (child, OPENBLAS_CORETYPE=Prescott)");
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--child"))
		return child();
	unsetenv("OPENBLAS_CORETYPE"); /* the parent tests the device's own choice */

	kvt_dev_config cfg = { .kind = KVT_DEV_CPU, .n_threads = 1 };
	kvt_dev *d = NULL;
	CHECK(kvt_dev_create(&cfg, &d) == KVT_OK);
	const char *name = kvt_dev_name(d);
	const char *core = core_of(name);
	CHECKF(core != NULL, "the device's name names the OpenBLAS kernels: %s", name);
	__builtin_cpu_init();
	bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	printf("cpu: avx2+fma %s, avx512f %s; device: %s\n", avx2 ? "yes" : "no",
	       __builtin_cpu_supports("avx512f") ? "yes" : "no", name);
	if (avx2 && core)
		CHECKF(core_has_avx2(core), "a CPU with AVX2 and FMA runs OpenBLAS's %s", name);
	check_sgemm();
	/* a second device keeps the choice (the check runs once) */
	kvt_dev *d2 = NULL;
	CHECK(kvt_dev_create(&cfg, &d2) == KVT_OK);
	CHECK(!strcmp(kvt_dev_name(d2), name));
	kvt_dev_destroy(d2);
	kvt_dev_destroy(d);

	/* the user's own choice is kept */
	char *cargv[] = { argv[0], "--child", NULL };
	setenv("OPENBLAS_CORETYPE", "Prescott", 1);
	pid_t pid;
	int st = 0;
	CHECK(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, cargv, environ) == 0);
	unsetenv("OPENBLAS_CORETYPE");
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child with OPENBLAS_CORETYPE=Prescott: status %d", st);
	return check_done("test_dev_blas");
}
