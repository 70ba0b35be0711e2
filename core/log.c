/*
 * core/log.c — the process-wide log, result-code names and the clock.
 *
 * One sink, one level, guarded by a mutex so lines from the engine, tier and
 * index threads never interleave. Tests install a sink to read the exact error
 * a bad input produced.
 */
#include "kvt.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static kvt_log_fn log_fn;   /* NULL: stderr */
static void *log_user;      /* passed to log_fn */
static int log_level = KVT_LOG_INFO;

const char *kvt_strerror(int rc)
{
	switch (rc) {
	case KVT_OK: return "KVT_OK";
	case KVT_ENOMEM: return "KVT_ENOMEM";
	case KVT_EIO: return "KVT_EIO";
	case KVT_ECORRUPT: return "KVT_ECORRUPT";
	case KVT_EDEVICE: return "KVT_EDEVICE";
	case KVT_EINVAL: return "KVT_EINVAL";
	case KVT_EFULL: return "KVT_EFULL";
	case KVT_ENOTFOUND: return "KVT_ENOTFOUND";
	case KVT_EUNSUPPORTED: return "KVT_EUNSUPPORTED";
	case KVT_EBUSY: return "KVT_EBUSY";
	case KVT_ESTOPPED: return "KVT_ESTOPPED";
	}
	return "KVT_E(unknown)";
}

void kvt_vlog(int level, const char *fmt, va_list ap)
{
	static const char *names[] = { "error", "warning", "info", "debug" };
	char buf[1024];

	if (level > log_level)
		return;
	vsnprintf(buf, sizeof(buf), fmt, ap);
	pthread_mutex_lock(&log_mu);
	if (log_fn)
		log_fn(level, buf, log_user);
	else
		fprintf(stderr, "kvtier: %s: %s\n", names[level < 0 ? 0 : level > 3 ? 3 : level], buf);
	pthread_mutex_unlock(&log_mu);
}

void kvt_log(int level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	kvt_vlog(level, fmt, ap);
	va_end(ap);
}

void kvt_log_set_sink(kvt_log_fn fn, void *user)
{
	pthread_mutex_lock(&log_mu);
	log_fn = fn;
	log_user = user;
	pthread_mutex_unlock(&log_mu);
}

void kvt_log_set_level(int level)
{
	log_level = level;
}

int kvt_log_get_level(void)
{
	return log_level;
}

void kvt_assert_fail(const char *expr, const char *file, int line)
{
	fprintf(stderr, "kvtier: assertion failed: %s (%s:%d)\n", expr, file, line);
	abort();
}

uint64_t kvt_wall_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

double kvt_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
