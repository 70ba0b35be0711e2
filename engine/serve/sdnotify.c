/*
 * engine/serve/sdnotify.c — sd_notify(3) without libsystemd (engine/serve/sdnotify.h).
 *
 * Design: each notification opens a fresh SOCK_DGRAM|SOCK_CLOEXEC socket,
 * sends once (sendto, MSG_NOSIGNAL) and closes it. That costs a few syscalls,
 * but notifications are rare (start, stop, status changes, a watchdog ping
 * every few seconds), and it keeps every call thread-safe with no shared
 * state. A datagram socket delivers the whole message or nothing, so there is
 * no partial send to retry; EINTR is retried.
 */
#define _GNU_SOURCE
#include "sdnotify.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int kvt_sd_notify(const char *state)
{
	const char *name = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa;
	socklen_t sa_len;
	size_t n;

	if (!name || !name[0])
		return KVT_OK;
	if (!state)
		return KVT_EINVAL;
	n = strlen(name);
	if ((name[0] != '/' && name[0] != '@') || n >= sizeof(sa.sun_path)) {
		KVT_LOGW("sd_notify: NOTIFY_SOCKET \"%s\" is not an absolute path or @abstract name that fits a "
			 "socket address",
			 name);
		return KVT_EINVAL;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, name, n);
	if (name[0] == '@') {
		sa.sun_path[0] = '\0'; /* abstract namespace: the length, not a NUL, ends the name */
		sa_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
	} else {
		sa_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
	}

	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		KVT_LOGW("sd_notify: socket: %s", strerror(errno));
		return KVT_EIO;
	}
	ssize_t r;
	do
		r = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (const struct sockaddr *)&sa, sa_len);
	while (r < 0 && errno == EINTR);
	int e = errno;
	close(fd);
	if (r < 0) {
		KVT_LOGW("sd_notify: send to %s: %s", name, strerror(e));
		return KVT_EIO;
	}
	return KVT_OK;
}

int kvt_sd_ready(void)
{
	return kvt_sd_notify("READY=1");
}

int kvt_sd_stopping(void)
{
	return kvt_sd_notify("STOPPING=1");
}

int kvt_sd_reloading(void)
{
	return kvt_sd_notify("RELOADING=1");
}

int kvt_sd_watchdog(void)
{
	return kvt_sd_notify("WATCHDOG=1");
}

int kvt_sd_status(const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	memcpy(buf, "STATUS=", 7);
	va_start(ap, fmt);
	vsnprintf(buf + 7, sizeof(buf) - 7, fmt, ap);
	va_end(ap);
	for (char *p = buf; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' '; /* one assignment per line: a newline would start another */
	return kvt_sd_notify(buf);
}

/* A positive decimal integer with nothing after it. */
static bool parse_pos_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	if (!s || !*s)
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		if (!kvt_mul_u64(v, 10, &v) || !kvt_add_u64(v, (uint64_t)(*s - '0'), &v))
			return false;
	}
	if (v == 0)
		return false;
	*out = v;
	return true;
}

bool kvt_sd_watchdog_usec(uint64_t *usec)
{
	uint64_t v, pid;
	if (!parse_pos_u64(getenv("WATCHDOG_USEC"), &v))
		return false;
	const char *p = getenv("WATCHDOG_PID");
	if (p && p[0]) {
		if (!parse_pos_u64(p, &pid) || pid != (uint64_t)getpid())
			return false; /* meant for another process (e.g. our parent) */
	}
	*usec = v;
	return true;
}
