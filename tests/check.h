/*
 * tests/check.h — the small harness every test executable is built on.
 *
 * CHECK(x) records a failure (file:line and the expression) and carries on, so
 * one run reports every broken case. check_done() prints a summary line
 * ("N passed, N failed") and returns the exit code: 0 pass, 1 fail.
 * A test that cannot run here (no GPU, no model file) exits 77: CTest
 * reports it as skipped (SKIP_RETURN_CODE).
 */
#ifndef KVT_CHECK_H
#define KVT_CHECK_H

#include "kvt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define CHECK_SKIP 77

static int check_n_pass, check_n_fail;

#define CHECK(x)                                                                 \
	do {                                                                     \
		if (x) {                                                         \
			check_n_pass++;                                          \
		} else {                                                         \
			check_n_fail++;                                          \
			fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #x); \
		}                                                                \
	} while (0)

/* CHECK with a printf-style explanation on failure. */
#define CHECKF(x, ...)                                                           \
	do {                                                                     \
		if (x) {                                                         \
			check_n_pass++;                                          \
		} else {                                                         \
			check_n_fail++;                                          \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #x); \
			fprintf(stderr, __VA_ARGS__);                            \
			fputc('\n', stderr);                                     \
		}                                                                \
	} while (0)

#define CHECK_EQ_INT(a, b) CHECKF((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))

static inline int check_done(const char *name)
{
	printf("%s: %d passed, %d failed\n", name, check_n_pass, check_n_fail);
	return check_n_fail ? 1 : 0;
}

static inline int check_skip(const char *name, const char *why)
{
	printf("%s: skipped: %s\n", name, why);
	return CHECK_SKIP;
}

/*
 * Log capture, for tests that check the exact error a bad input produces:
 * check_log_capture() routes the log here; check_log_text holds every line
 * since check_log_reset(), check_log_n_errors counts the error lines.
 */
static char check_log_text[65536] __attribute__((unused));
static int check_log_n_errors __attribute__((unused));

static inline void check_log_sink(int level, const char *msg, void *user)
{
	size_t n = strlen(check_log_text);
	if (level == KVT_LOG_ERROR)
		check_log_n_errors++;
	snprintf(check_log_text + n, sizeof(check_log_text) - n, "%s\n", msg);
}

static inline void check_log_reset(void)
{
	check_log_text[0] = '\0';
	check_log_n_errors = 0;
}

static inline void check_log_capture(void)
{
	check_log_reset();
	kvt_log_set_sink(check_log_sink, NULL);
}

/* Deterministic xorshift64* generator for seeded test inputs. */
typedef struct { unsigned long long s; } check_rng;
static inline unsigned long long check_rng_u64(check_rng *r)
{
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return r->s * 2685821657736338717ULL;
}
/* Uniform in [-1, 1). */
static inline float check_rng_f32(check_rng *r)
{
	return (float)((check_rng_u64(r) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* Path of the default model (env KVTIER_MODEL overrides), NULL if absent. */
static inline const char *check_default_model(void)
{
	const char *env = getenv("KVTIER_MODEL");
	if (env && *env)
		return env;
#ifdef KVT_SOURCE_DIR
	static char buf[4096];
	snprintf(buf, sizeof(buf), "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", KVT_SOURCE_DIR);
	FILE *f = fopen(buf, "rb");
	if (f) {
		fclose(f);
		return buf;
	}
#endif
	return NULL;
}

/*
 * Run a shell command line (its stderr redirected to err_path by the
 * function), capture stdout into out and stderr into err (NUL-terminated,
 * truncated to the caps); the exit status, or -1 if it did not exit.
 */
static inline int check_run_capture(const char *cmdline, const char *err_path, char *out, size_t out_cap, char *err,
				    size_t err_cap)
{
	char cmd[8192];
	snprintf(cmd, sizeof(cmd), "%s 2>%s </dev/null", cmdline, err_path);
	FILE *p = popen(cmd, "r");
	size_t n = p ? fread(out, 1, out_cap - 1, p) : 0;
	out[n] = 0;
	int st = p ? pclose(p) : -1;
	FILE *f = fopen(err_path, "r");
	n = f ? fread(err, 1, err_cap - 1, f) : 0;
	err[n] = 0;
	if (f)
		fclose(f);
	return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
