/*
 * core/fault.c — named fault points (fault.h): the armed path.
 *
 * The armed name, count and fire function live in process globals that
 * g_mu guards (written by kvt_fault_arm, read by kvt_fault_hit: a point may
 * be armed while other threads already pass it, and only the armed path ever
 * takes the lock); hits are counted with an atomic, so two threads hitting
 * the point at once still fire it once.
 */
#include "fault.h"

#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

atomic_int kvt_fault_armed;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* guards g_name, g_nth, g_fire */
static char g_name[128];                 /* the armed point */
static uint64_t g_nth;                   /* fire at this hit */
static atomic_uint_fast64_t g_hits;      /* hits since armed */
static void (*g_fire)(const char *name); /* called before the kill, or NULL */

void kvt_fault_hit(const char *name)
{
	pthread_mutex_lock(&g_mu);
	bool mine = strcmp(name, g_name) == 0;
	uint64_t nth = g_nth;
	void (*fire)(const char *) = g_fire;
	pthread_mutex_unlock(&g_mu);
	if (!mine || atomic_fetch_add(&g_hits, 1) + 1 != nth)
		return;
	if (fire)
		fire(name);
	raise(SIGKILL);
	_exit(137);
}

void kvt_fault_arm(const char *name, uint64_t nth, void (*fire)(const char *name))
{
	atomic_store(&kvt_fault_armed, 0);
	atomic_store(&g_hits, 0);
	if (!name)
		return;
	pthread_mutex_lock(&g_mu);
	snprintf(g_name, sizeof(g_name), "%s", name);
	g_nth = nth ? nth : 1;
	g_fire = fire;
	pthread_mutex_unlock(&g_mu);
	atomic_store(&kvt_fault_armed, 1);
}

uint64_t kvt_fault_hits(void)
{
	return atomic_load(&g_hits);
}
