/*
 * engine/serve/sdnotify.h — the systemd notification protocol, in-tree (no
 * libsystemd): kvtierd tells the service manager when it is ready, when it
 * stops, what it is doing, and that it is alive (watchdog).
 *
 * Protocol (sd_notify(3)): one AF_UNIX datagram of "KEY=VALUE\n..." text to
 * the socket named by $NOTIFY_SOCKET; a name starting with '@' is an
 * abstract socket (the '@' becomes a leading NUL byte). Without
 * $NOTIFY_SOCKET (not started by systemd, or Type= is not notify) every call
 * is a no-op returning KVT_OK, so the daemon calls these unconditionally.
 *
 * Threads: every function is safe from any thread (each send opens its own
 * socket). None of them unsets the environment.
 */
#ifndef KVT_SDNOTIFY_H
#define KVT_SDNOTIFY_H

#include "kvt.h"

#include <stdbool.h>
#include <stdint.h>

/*
 * Send state (e.g. "READY=1\nSTATUS=serving") to $NOTIFY_SOCKET. KVT_OK when
 * sent or when $NOTIFY_SOCKET is unset or empty; KVT_EINVAL for a socket name
 * that does not fit a sockaddr_un or is not absolute/abstract; KVT_EIO when
 * the send fails (logged at warning level once per call, with errno).
 */
int kvt_sd_notify(const char *state);

/* READY=1 (start-up finished; with Type=notify systemd waits for this). */
int kvt_sd_ready(void);
/* STOPPING=1 (shutdown began; drain and flush follow). */
int kvt_sd_stopping(void);
/* RELOADING=1 (SIGHUP handling began); send kvt_sd_ready() when done. */
int kvt_sd_reloading(void);
/* STATUS=<printf text> (one line: shown by `systemctl status`; newlines become spaces). */
int kvt_sd_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* WATCHDOG=1 (keep-alive; send at least every usec/2 from kvt_sd_watchdog_usec). */
int kvt_sd_watchdog(void);

/*
 * Whether the service manager expects watchdog keep-alives: true with
 * *usec = $WATCHDOG_USEC when it is a positive integer and $WATCHDOG_PID is
 * unset or equals getpid(); false otherwise (*usec untouched).
 */
bool kvt_sd_watchdog_usec(uint64_t *usec);

#endif
