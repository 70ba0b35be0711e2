/*
 * core/kvt.h — what every kvtier module shares: result codes, assertions and
 * the log.
 *
 * Design: a function that can fail returns int, KVT_OK or a negative KVT_E*
 * code, and writes its results through trailing out-parameters only on
 * success. The function that detects a failure logs it once, naming the object
 * and the cause; callers pass the code up without logging again.
 *
 * core/ sits below every other module (engine -> tiers -> {index, gpu} ->
 * core). It holds no policy: only these codes, the log sink and small helpers
 * for overflow-checked size arithmetic used by every parser of untrusted bytes.
 */
#ifndef KVT_H
#define KVT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kvt_result {
	KVT_OK = 0,
	KVT_ENOMEM = -1,   /* an allocation failed */
	KVT_EIO = -2,      /* a read, write or sync failed */
	KVT_ECORRUPT = -3, /* bytes failed a format or checksum check */
	KVT_EDEVICE = -4,  /* the device (CUDA) reported an error */
	KVT_EINVAL = -5,   /* an argument or input value is not acceptable */
	KVT_EFULL = -6,    /* no room: pool, tier or caller buffer */
	KVT_ENOTFOUND = -7,/* key, tensor, block or file not present */
	KVT_EUNSUPPORTED = -8, /* well-formed, but a feature we do not handle */
	KVT_EBUSY = -9,    /* held by another process (a data directory a running daemon holds) */
	KVT_ESTOPPED = -10,/* stopping (draining): takes no new work */
};

/* Name of a result code, e.g. "KVT_ECORRUPT". Never NULL. */
const char *kvt_strerror(int rc);

enum kvt_log_level {
	KVT_LOG_ERROR = 0,
	KVT_LOG_WARN = 1,
	KVT_LOG_INFO = 2,
	KVT_LOG_DEBUG = 3,
};

/* A log sink receives each formatted line (no trailing newline). */
typedef void (*kvt_log_fn)(int level, const char *msg, void *user);

/*
 * Log one line. Lines above the current level are dropped. The default sink
 * writes "kvtier: error: msg\n" to stderr. Thread-safe: each line is formatted
 * into a local buffer and handed to the sink under a mutex.
 */
void kvt_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvt_vlog(int level, const char *fmt, va_list ap);
/* Replace the sink (NULL restores stderr). Returns nothing; not for hot paths. */
void kvt_log_set_sink(kvt_log_fn fn, void *user);
void kvt_log_set_level(int level);
int kvt_log_get_level(void);

#define KVT_LOGE(...) kvt_log(KVT_LOG_ERROR, __VA_ARGS__)
#define KVT_LOGW(...) kvt_log(KVT_LOG_WARN, __VA_ARGS__)
#define KVT_LOGI(...) kvt_log(KVT_LOG_INFO, __VA_ARGS__)
#define KVT_LOGD(...) kvt_log(KVT_LOG_DEBUG, __VA_ARGS__)

/* Always on. For programmer errors only; bad input never reaches one. */
void kvt_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define KVT_ASSERT(x) ((x) ? (void)0 : kvt_assert_fail(#x, __FILE__, __LINE__))
#ifdef KVT_DEBUG
#define KVT_DEBUG_ASSERT(x) KVT_ASSERT(x)
#else
#define KVT_DEBUG_ASSERT(x) ((void)0)
#endif

/* Overflow-checked size arithmetic: return false (and leave *out alone) on overflow. */
static inline bool kvt_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	if (a > UINT64_MAX - b)
		return false;
	*out = a + b;
	return true;
}
static inline bool kvt_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	if (a != 0 && b > UINT64_MAX / a)
		return false;
	*out = a * b;
	return true;
}

/* Monotonic clock in seconds. */
double kvt_now_s(void);
/* Wall clock in microseconds since the epoch (for times stored on disk). */
uint64_t kvt_wall_us(void);

/* The index of the largest of x[0..n): the first of equal ones, NaNs skipped, 0 when x[0] is a NaN
 * or n is 0 (what `if (x[i] > x[best]) best = i` from best = 0 gives; core/argmax.c). */
uint32_t kvt_argmax_f32(const float *x, uint32_t n);

/* IEEE half <-> float, round-to-nearest-even; exact for every half value. */
float kvt_f16_to_f32(uint16_t h);
uint16_t kvt_f32_to_f16(float f);
/* bfloat16 (top 16 bits of a float) <-> float, round-to-nearest-even. */
static inline float kvt_bf16_to_f32(uint16_t h)
{
	union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
	return v.f;
}

/* The value of hex digit c (0-9, a-f, A-F), or -1 when c is not one. */
static inline int kvt_hexval(int c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
	       c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

#endif
