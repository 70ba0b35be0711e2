/*
 * index/datadir.c — the data directory's lock: one function that kvtierd and
 * every offline tool (fsck, rebuild-index, stats --offline) call before they
 * touch a directory's T2 file or index (DESIGN.md §4: no tool may touch a
 * data directory a running daemon holds).
 *
 * Design: an flock(LOCK_EX | LOCK_NB) on DIR/KVT_DATA_LOCK_FILE, a small file
 * of its own. The T2 file cannot carry the lock: after a kill -9 the kernel
 * tears the dead process's io_uring down asynchronously, and the ring's
 * reference to the T2 file kept a lock on it alive past the process
 * (tiers/t2_store.h). The lock file is opened O_CLOEXEC and never given to
 * io_uring, so it is closed, and the lock dropped, when the holder's last
 * thread exits. SQLite's EXCLUSIVE locking still guards the index file
 * itself; this lock also covers the steps that never open it (rebuild-index
 * renames it aside) and names the holder in the refusal.
 *
 * Invariants: the lock is exclusive for everyone (a read-only tool included:
 * stats --offline may add an empty namespace row, kvt_db_open has no
 * read-only mode); the file's text is only advice for the message, the flock
 * alone decides.
 */
#include "index_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

struct kvt_datadir_lock {
	int fd; /* the lock file, flock'ed LOCK_EX */
};

int kvt_datadir_lock_take(const char *data_dir, const char *who, kvt_datadir_lock **out)
{
	char path[4096], text[160];
	if (!data_dir || !data_dir[0]) {
		KVT_LOGE("data directory: empty path");
		return KVT_EINVAL;
	}
	int n = snprintf(path, sizeof(path), "%s/%s", data_dir, KVT_DATA_LOCK_FILE);
	if (n < 0 || (size_t)n >= sizeof(path)) {
		KVT_LOGE("data directory %s: path too long", data_dir);
		return KVT_EINVAL;
	}
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		int e = errno;
		KVT_LOGE("data directory %s: cannot open the lock %s: %s", data_dir, path, strerror(e));
		return e == ENOENT ? KVT_ENOTFOUND : KVT_EIO;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		int e = errno;
		if (e == EWOULDBLOCK) {
			ssize_t r = pread(fd, text, sizeof(text) - 1, 0);
			text[r > 0 ? r : 0] = '\0';
			text[strcspn(text, "\n")] = '\0';
			KVT_LOGE("data directory %s is held by %s (lock %s); stop it first", data_dir,
				 text[0] ? text : "another process", path);
		} else {
			KVT_LOGE("data directory %s: cannot lock %s: %s", data_dir, path, strerror(e));
		}
		close(fd);
		return e == EWOULDBLOCK ? KVT_EBUSY : KVT_EIO;
	}
	kvt_datadir_lock *l = malloc(sizeof(*l));
	if (!l) {
		close(fd);
		return KVT_ENOMEM;
	}
	l->fd = fd;
	/* Advice for a refused caller's message only; a failure here changes nothing. */
	n = snprintf(text, sizeof(text), "%s pid %ld\n", who ? who : "a process", (long)getpid());
	if (ftruncate(fd, 0) == 0 && n > 0)
		(void)!pwrite(fd, text, (size_t)n, 0);
	*out = l;
	return KVT_OK;
}

void kvt_datadir_lock_release(kvt_datadir_lock *l)
{
	if (!l)
		return;
	close(l->fd); /* drops the flock */
	free(l);
}
