/* ctest-labels: unit */
/*
 * tests/test_sdnotify.c — the in-tree sd_notify on real AF_UNIX datagram
 * sockets: a path socket in a temp dir and an abstract socket each receive
 * exactly the bytes sent (READY, STOPPING, STATUS, WATCHDOG); no
 * NOTIFY_SOCKET is a silent no-op; a bad or absent socket is an error, never
 * a crash; WATCHDOG_USEC / WATCHDOG_PID are read as sd_watchdog_enabled does.
 */
#include "check.h"
#include "sdnotify.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Bind a datagram socket at name (a path, or "@abstract"). -1 on failure. */
static int bind_dgram(const char *name)
{
	struct sockaddr_un sa;
	size_t n = strlen(name);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, name, n);
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
	if (name[0] == '@') {
		sa.sun_path[0] = '\0';
		len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
	}
	if (bind(fd, (struct sockaddr *)&sa, len) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Receive one datagram (waiting up to 2 s) into buf as a string; its length or -1. */
static long recv_one(int fd, char *buf, size_t cap)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	if (poll(&p, 1, 2000) != 1)
		return -1;
	ssize_t n = recv(fd, buf, cap - 1, MSG_DONTWAIT);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	return (long)n;
}

/* Nothing waiting on fd. */
static bool empty(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, 50) == 0;
}

static void check_socket(const char *name)
{
	char buf[1024];
	int fd = bind_dgram(name);
	CHECKF(fd >= 0, "bind %s: %s", name, strerror(errno));
	if (fd < 0)
		return;
	setenv("NOTIFY_SOCKET", name, 1);

	CHECK_EQ_INT(kvt_sd_ready(), KVT_OK);
	CHECK(recv_one(fd, buf, sizeof(buf)) == 7 && strcmp(buf, "READY=1") == 0);
	CHECK_EQ_INT(kvt_sd_stopping(), KVT_OK);
	CHECK(recv_one(fd, buf, sizeof(buf)) > 0 && strcmp(buf, "STOPPING=1") == 0);
	CHECK_EQ_INT(kvt_sd_reloading(), KVT_OK);
	CHECK(recv_one(fd, buf, sizeof(buf)) > 0 && strcmp(buf, "RELOADING=1") == 0);
	CHECK_EQ_INT(kvt_sd_watchdog(), KVT_OK);
	CHECK(recv_one(fd, buf, sizeof(buf)) > 0 && strcmp(buf, "WATCHDOG=1") == 0);
	CHECK_EQ_INT(kvt_sd_status("serving %d requests\non %s", 3, "cpu"), KVT_OK);
	CHECKF(recv_one(fd, buf, sizeof(buf)) > 0 && strcmp(buf, "STATUS=serving 3 requests on cpu") == 0, "got %s",
	       buf);
	CHECK_EQ_INT(kvt_sd_notify("READY=1\nSTATUS=ready\nMAINPID=1"), KVT_OK);
	CHECK(recv_one(fd, buf, sizeof(buf)) > 0 && strcmp(buf, "READY=1\nSTATUS=ready\nMAINPID=1") == 0);
	CHECK(empty(fd));
	close(fd);
	unsetenv("NOTIFY_SOCKET");
}

int main(void)
{
	char dir[] = "/tmp/kvt_sdnotify_XXXXXX", path[128], abs_name[128];
	if (!mkdtemp(dir))
		return 1;
	check_log_capture();

	/* no NOTIFY_SOCKET (or an empty one): a no-op that succeeds */
	unsetenv("NOTIFY_SOCKET");
	CHECK_EQ_INT(kvt_sd_ready(), KVT_OK);
	setenv("NOTIFY_SOCKET", "", 1);
	CHECK_EQ_INT(kvt_sd_ready(), KVT_OK);
	CHECK_EQ_INT(check_log_n_errors, 0);

	/* a socket file in a temp dir, then an abstract socket */
	snprintf(path, sizeof(path), "%s/notify", dir);
	check_socket(path);
	snprintf(abs_name, sizeof(abs_name), "@kvt_sdnotify_test_%ld", (long)getpid());
	check_socket(abs_name);

	/* nobody listening: an I/O error, logged with the socket's name; a relative name: EINVAL */
	setenv("NOTIFY_SOCKET", path, 1); /* the file is still there, unbound */
	check_log_reset();
	CHECK_EQ_INT(kvt_sd_ready(), KVT_EIO);
	CHECKF(strstr(check_log_text, path) != NULL, "log: %s", check_log_text);
	snprintf(path, sizeof(path), "%s/absent", dir);
	setenv("NOTIFY_SOCKET", path, 1);
	CHECK_EQ_INT(kvt_sd_ready(), KVT_EIO);
	setenv("NOTIFY_SOCKET", "relative/sock", 1);
	CHECK_EQ_INT(kvt_sd_ready(), KVT_EINVAL);
	char longname[200];
	memset(longname, 'a', sizeof(longname) - 1);
	longname[0] = '/';
	longname[sizeof(longname) - 1] = '\0';
	setenv("NOTIFY_SOCKET", longname, 1);
	CHECK_EQ_INT(kvt_sd_ready(), KVT_EINVAL);
	unsetenv("NOTIFY_SOCKET");

	/* the watchdog */
	uint64_t us = 7;
	unsetenv("WATCHDOG_USEC");
	unsetenv("WATCHDOG_PID");
	CHECK(!kvt_sd_watchdog_usec(&us) && us == 7);
	setenv("WATCHDOG_USEC", "30000000", 1);
	CHECK(kvt_sd_watchdog_usec(&us) && us == 30000000);
	char pid[32];
	snprintf(pid, sizeof(pid), "%ld", (long)getpid());
	setenv("WATCHDOG_PID", pid, 1);
	us = 7;
	CHECK(kvt_sd_watchdog_usec(&us) && us == 30000000);
	snprintf(pid, sizeof(pid), "%ld", (long)getpid() + 1);
	setenv("WATCHDOG_PID", pid, 1);
	us = 7;
	CHECK(!kvt_sd_watchdog_usec(&us) && us == 7); /* meant for another process */
	unsetenv("WATCHDOG_PID");
	setenv("WATCHDOG_USEC", "0", 1);
	CHECK(!kvt_sd_watchdog_usec(&us));
	setenv("WATCHDOG_USEC", "12abc", 1);
	CHECK(!kvt_sd_watchdog_usec(&us));
	setenv("WATCHDOG_USEC", "99999999999999999999999", 1);
	CHECK(!kvt_sd_watchdog_usec(&us));
	unsetenv("WATCHDOG_USEC");

	snprintf(path, sizeof(path), "%s/notify", dir);
	unlink(path);
	rmdir(dir);
	kvt_log_set_sink(NULL, NULL);
	return check_done("test_sdnotify");
}
