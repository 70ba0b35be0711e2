/*
 * core/fault.c — named fault points (fault.h): the armed path.
 *
 * The armed name and count live in process globals written only by
 * kvt_fault_arm; kvt_fault_hit compares the name and counts hits with an
 * atomic, so two threads hitting the point at once still fire it once.
 */
#include "fault.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

atomic_int kvt_fault_armed;

static char g_name[128];                 /* the armed point */
static uint64_t g_nth;                   /* fire at this hit */
static atomic_uint_fast64_t g_hits;      /* hits since armed */
static void (*g_fire)(const char *name); /* called before the kill, or NULL */

void kvt_fault_hit(const char *name)
{
	if (strcmp(name, g_name) != 0)
		return;
	if (atomic_fetch_add(&g_hits, 1) + 1 != g_nth)
		return;
	if (g_fire)
		g_fire(name);
	raise(SIGKILL);
	_exit(137);
}

void kvt_fault_arm(const char *name, uint64_t nth, void (*fire)(const char *name))
{
	atomic_store(&kvt_fault_armed, 0);
	atomic_store(&g_hits, 0);
	if (!name)
		return;
	snprintf(g_name, sizeof(g_name), "%s", name);
	g_nth = nth ? nth : 1;
	g_fire = fire;
	atomic_store(&kvt_fault_armed, 1);
}

uint64_t kvt_fault_hits(void)
{
	return atomic_load(&g_hits);
}
