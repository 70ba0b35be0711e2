/*
 * core/fault.h — named fault points: places in the write paths where a crash
 * trial (tests/test_crash_index.c) can make the process die on purpose, at
 * the moments a random kill almost never lands on (between "bytes durable"
 * and "row committed", inside a group commit between the journal's fdatasync
 * and the SQLite COMMIT, between a row's deletion and its space's release).
 *
 * Design: always compiled in, no #ifdef. kvt_fault_point(name) costs one
 * relaxed atomic load and a predicted branch while nothing is armed (every
 * production run); only an armed process compares names. One point is armed
 * at a time, process-wide (kvt_fault_arm): at its nth hit (counted from the
 * arming, by every thread together) the fire function runs — by default
 * raise(SIGKILL), a death as abrupt as the kill -9 of a random trial.
 *
 * Names are "<module>.<path>.<moment>", e.g. "idx.commit.journal_synced";
 * each is documented where it is placed, and test_crash_index lists the
 * ones it arms.
 *
 * Thread rules: arm before the threads that hit the point start (or accept
 * that a hit racing the arming may be missed); points may be hit from any
 * thread.
 */
#ifndef KVT_FAULT_H
#define KVT_FAULT_H

#include <stdatomic.h>
#include <stdint.h>

/* Non-zero while a point is armed (read by kvt_fault_point; set only by kvt_fault_arm). */
extern atomic_int kvt_fault_armed;

/* The armed path: count a hit of name, fire at the nth. Call through kvt_fault_point. */
void kvt_fault_hit(const char *name);

/* A named fault point: nothing unless armed with this name. */
static inline void kvt_fault_point(const char *name)
{
	if (__builtin_expect(atomic_load_explicit(&kvt_fault_armed, memory_order_relaxed), 0))
		kvt_fault_hit(name);
}

/*
 * Arm the point name (copied; NULL disarms) to fire at its nth hit (>= 1):
 * fire(name) runs on the hitting thread, then the process raises SIGKILL
 * (and _exit(137)s should that return); fire may be NULL (the kill alone).
 * Replaces any earlier arming and resets the hit count.
 */
void kvt_fault_arm(const char *name, uint64_t nth, void (*fire)(const char *name));

/* Hits of the armed point since it was armed. */
uint64_t kvt_fault_hits(void);

#endif
