/*
 * tests/powerloss.h — a power-loss fault layer for crash trials: what a power
 * cut leaves of a data directory, where kill -9 leaves everything the process
 * wrote (the page cache survives a killed process, not a power cut).
 *
 * The files it covers: the T2 file, through the store's I/O ops table
 * (kvt_t2_io_ops, thread-pool engine so every data write passes the hook);
 * the SQLite index and its WAL, through a shim VFS registered as SQLite's
 * default (it wraps the unix VFS; index/db.c needs no change); and the
 * session journal and the tmp file a rewrite of it builds, through the
 * index's journal I/O seam (kvt_db_config.journal_io = &powerloss_sj_io).
 * For each file
 * the layer keeps, beside it under DIR/pl/:
 *   NAME.durable  the bytes a completed sync covered (the durable image);
 *   NAME.journal  every write (and truncate) since the last completed sync,
 *                 appended after the real write returned: off, length, bytes.
 * A write goes to the real file (reads see it, as they see the page cache),
 * then into the journal and a pending list in memory. A sync (fdatasync of
 * the T2 file, xSync of a SQLite file) that returns 0 copies the entries that
 * were pending when it started into NAME.durable and empties the journal; a
 * failed sync promotes nothing. NOTE: the journal is emptied even of entries
 * that arrived during the sync: they are not covered by it, so a crash may
 * drop them, and their own later sync still promotes them from memory.
 *
 * After the process is killed, powerloss_cut() makes each real file what a
 * power cut could leave: NAME.durable, then each journal entry in order
 * either dropped, applied, or torn (seeded). Torn, at 512-byte sectors: the
 * T2 file gets an arbitrary subset of the entry's sectors (its records are
 * checksummed end to end); a SQLite file gets a prefix of them, as SQLite
 * assumes a write reaches the disk linearly (https://sqlite.org/atomiccommit.html,
 * "Hardware assumptions"). Sector-sized pieces are atomic (so is the T2
 * superblock, whose fields fit its first sector). Leniencies, noted: a file's
 * creation and deletion count as durable at once (SQLite syncs the directory
 * itself, outside any VFS file), and a truncate is an entry like a write
 * (applied or not). The journal's rewrite (tmp file synced, renamed over the
 * journal, directory fsync'ed) counts its rename as durable at once: the
 * journal's durable image and pending writes become the tmp file's.
 *
 * powerloss_settle() runs in the parent before each trial: the files as they
 * are (what the previous cut and the recovery after it left) become the
 * durable images, the journals empty. powerloss_begin() runs in the process
 * under test, after fork: it opens the journals and installs the VFS;
 * powerloss_t2_ops is the table for kvt_t2_config.io, powerloss_sj_io for
 * kvt_db_config.journal_io. Thread-safe: one mutex serializes every hook.
 */
#ifndef KVT_TEST_POWERLOSS_H
#define KVT_TEST_POWERLOSS_H

#include "index.h"
#include "t2_store.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { PL_T2 = 0, PL_DB = 1, PL_WAL = 2, PL_SJ = 3, PL_SJ_TMP = 4, PL_N_FILES = 5 };
static const char *const pl_names[PL_N_FILES] = { KVT_DATA_T2_FILE, KVT_DATA_INDEX_FILE, KVT_DATA_INDEX_FILE "-wal",
						  KVT_DATA_SESSIONS_FILE, KVT_DATA_SESSIONS_FILE ".tmp" };

#define PL_MAGIC 0x45574c50u /* "PLWE" */
#define PL_END 0x444e4550u   /* "PEND" */
enum { PL_WRITE = 1, PL_TRUNC = 2 };

typedef struct pl_entry {
	struct pl_entry *next; /* pending list, in completion order */
	uint64_t seq;          /* per file, from 1 */
	int type;              /* PL_WRITE or PL_TRUNC */
	uint64_t off;          /* write: offset; truncate: the new size */
	uint32_t n;            /* write: bytes */
	uint8_t data[];        /* write: the bytes */
} pl_entry;

static struct {
	pthread_mutex_t mu;                  /* guards everything here */
	char dir[1024];                      /* the data directory */
	int journal[PL_N_FILES];             /* journal fds (O_APPEND), -1 = not tracked */
	pl_entry *head[PL_N_FILES], **tail[PL_N_FILES]; /* pending, oldest first */
	uint64_t seq[PL_N_FILES];            /* the last entry's seq */
	uint64_t n_promoted, n_syncs;        /* counters (for the test's report) */
} pl = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void pl_path(char *out, size_t cap, int id, const char *suffix)
{
	snprintf(out, cap, "%s/pl/%s%s", pl.dir, pl_names[id], suffix);
}

static void pl_real_path(char *out, size_t cap, int id)
{
	snprintf(out, cap, "%s/%s", pl.dir, pl_names[id]);
}

/* Copy file from to file to (to removed when from is absent). */
static int pl_copy(const char *from, const char *to)
{
	int in = open(from, O_RDONLY);
	if (in < 0) {
		if (errno != ENOENT)
			return -1;
		return unlink(to) == 0 || errno == ENOENT ? 0 : -1;
	}
	int out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (out < 0) {
		close(in);
		return -1;
	}
	static char buf[1 << 16];
	ssize_t r;
	int rc = 0;
	while ((r = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, (size_t)r) != r)
			rc = -1;
	if (r < 0)
		rc = -1;
	close(in);
	close(out);
	return rc;
}

/* Append one entry to a file's journal and its pending list. Caller holds mu. */
static void pl_track_locked(int id, int type, uint64_t off, const void *buf, uint32_t n)
{
	if (id < 0 || pl.journal[id] < 0)
		return;
	pl_entry *e = malloc(sizeof(*e) + n);
	KVT_ASSERT(e);
	e->next = NULL;
	e->type = type;
	e->off = off;
	e->n = n;
	e->seq = ++pl.seq[id];
	if (n)
		memcpy(e->data, buf, n);
	*pl.tail[id] = e;
	pl.tail[id] = &e->next;
	/* one write(): header, bytes, end marker; a write cut short is an entry the cut drops */
	size_t len = 24 + n + 4;
	uint8_t *rec = malloc(len);
	KVT_ASSERT(rec);
	uint32_t hdr[2] = { PL_MAGIC, (uint32_t)type }, end = PL_END;
	memcpy(rec, hdr, 8);
	memcpy(rec + 8, &off, 8);
	memcpy(rec + 16, &n, 4);
	memset(rec + 20, 0, 4);
	if (n)
		memcpy(rec + 24, buf, n);
	memcpy(rec + 24 + n, &end, 4);
	if (write(pl.journal[id], rec, len) != (ssize_t)len)
		_exit(90);
	free(rec);
}

/* The pending entries of id up to seq upto reached the disk: into the durable image. */
static void pl_promote(int id, uint64_t upto)
{
	char path[1200];
	pl_path(path, sizeof(path), id, ".durable");
	pthread_mutex_lock(&pl.mu);
	int fd = open(path, O_WRONLY | O_CREAT, 0644);
	if (fd < 0)
		_exit(91);
	while (pl.head[id] && pl.head[id]->seq <= upto) {
		pl_entry *e = pl.head[id];
		if (e->type == PL_WRITE ? pwrite(fd, e->data, e->n, (off_t)e->off) != (ssize_t)e->n
					: ftruncate(fd, (off_t)e->off) != 0)
			_exit(92);
		pl.head[id] = e->next;
		if (!pl.head[id])
			pl.tail[id] = &pl.head[id];
		pl.n_promoted++;
		free(e);
	}
	close(fd);
	if (ftruncate(pl.journal[id], 0) != 0)
		_exit(93);
	pl.n_syncs++;
	pthread_mutex_unlock(&pl.mu);
}

/* ---- the T2 file: the store's I/O ops ---- */

static ssize_t pl_t2_pwrite(void *ctx, int fd, const void *buf, size_t n, off_t off)
{
	(void)ctx;
	pthread_mutex_lock(&pl.mu);
	ssize_t r = pwrite(fd, buf, n, off);
	int e = errno;
	if (r > 0)
		pl_track_locked(PL_T2, PL_WRITE, (uint64_t)off, buf, (uint32_t)r);
	pthread_mutex_unlock(&pl.mu);
	errno = e;
	return r;
}

static int pl_t2_fdatasync(void *ctx, int fd)
{
	(void)ctx;
	pthread_mutex_lock(&pl.mu);
	uint64_t n = pl.seq[PL_T2];
	pthread_mutex_unlock(&pl.mu);
	int r = fdatasync(fd);
	if (r == 0)
		pl_promote(PL_T2, n);
	return r;
}

static const kvt_t2_io_ops powerloss_t2_ops = { .pwrite = pl_t2_pwrite, .fdatasync = pl_t2_fdatasync };

/* ---- the session journal: the index's journal I/O seam ---- */

/* Which tracked file a journal path names: the journal, its rewrite's tmp file, or -1. */
static int pl_sj_id(const char *path)
{
	size_t n = strlen(path), t = strlen(pl_names[PL_SJ_TMP]), j = strlen(pl_names[PL_SJ]);
	if (n >= t && strcmp(path + n - t, pl_names[PL_SJ_TMP]) == 0)
		return PL_SJ_TMP;
	if (n >= j && strcmp(path + n - j, pl_names[PL_SJ]) == 0)
		return PL_SJ;
	return -1;
}

/* A file written before any sync exists in the durable image (its creation counts at once, lenient). Caller holds mu. */
static void pl_touch_durable_locked(int id)
{
	char path[1200];
	pl_path(path, sizeof(path), id, ".durable");
	int fd = open(path, O_WRONLY | O_CREAT, 0644);
	if (fd >= 0)
		close(fd);
}

static ssize_t pl_sj_pwrite(void *ctx, const char *path, int fd, const void *buf, size_t n, off_t off)
{
	(void)ctx;
	int id = pl_sj_id(path);
	pthread_mutex_lock(&pl.mu);
	ssize_t r = pwrite(fd, buf, n, off);
	int e = errno;
	if (r > 0 && id >= 0) {
		pl_touch_durable_locked(id);
		pl_track_locked(id, PL_WRITE, (uint64_t)off, buf, (uint32_t)r);
	}
	pthread_mutex_unlock(&pl.mu);
	errno = e;
	return r;
}

static int pl_sj_fdatasync(void *ctx, const char *path, int fd)
{
	(void)ctx;
	int id = pl_sj_id(path);
	pthread_mutex_lock(&pl.mu);
	uint64_t n = id >= 0 ? pl.seq[id] : 0;
	pthread_mutex_unlock(&pl.mu);
	int r = fdatasync(fd);
	if (r == 0 && id >= 0)
		pl_promote(id, n);
	return r;
}

static int pl_sj_ftruncate(void *ctx, const char *path, int fd, off_t len)
{
	(void)ctx;
	int id = pl_sj_id(path);
	pthread_mutex_lock(&pl.mu);
	int r = ftruncate(fd, len);
	int e = errno;
	if (r == 0 && id >= 0)
		pl_track_locked(id, PL_TRUNC, (uint64_t)len, NULL, 0);
	pthread_mutex_unlock(&pl.mu);
	errno = e;
	return r;
}

/* The rewrite's rename, durable at once (lenient): the journal's durable image, journal and pending list become the tmp file's. */
static int pl_sj_rename(void *ctx, const char *from, const char *to)
{
	(void)ctx;
	int a = pl_sj_id(from), b = pl_sj_id(to);
	pthread_mutex_lock(&pl.mu);
	int r = rename(from, to);
	int e = errno;
	if (r == 0 && a >= 0 && b >= 0 && a != b) {
		char pa[1200], pb[1200];
		pl_path(pa, sizeof(pa), a, ".durable");
		pl_path(pb, sizeof(pb), b, ".durable");
		if (rename(pa, pb) != 0 && errno == ENOENT)
			unlink(pb);
		pl_path(pa, sizeof(pa), a, ".journal");
		pl_path(pb, sizeof(pb), b, ".journal");
		if (rename(pa, pb) != 0)
			_exit(95);
		close(pl.journal[b]);
		pl.journal[b] = pl.journal[a]; /* the fd follows the renamed file */
		pl.journal[a] = open(pa, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
		while (pl.head[b]) {
			pl_entry *x = pl.head[b];
			pl.head[b] = x->next;
			free(x);
		}
		pl.head[b] = pl.head[a];
		pl.tail[b] = pl.head[a] ? pl.tail[a] : &pl.head[b];
		pl.seq[b] = pl.seq[a];
		pl.head[a] = NULL;
		pl.tail[a] = &pl.head[a];
		pl.seq[a] = 0;
	}
	pthread_mutex_unlock(&pl.mu);
	errno = e;
	return r;
}

static const kvt_db_journal_io powerloss_sj_io = { .pwrite = pl_sj_pwrite,
						    .fdatasync = pl_sj_fdatasync,
						    .ftruncate = pl_sj_ftruncate,
						    .rename = pl_sj_rename };

/* ---- the index: a shim VFS over the default one ---- */

typedef struct pl_file {
	sqlite3_file base;  /* pMethods = &pl_io */
	int id;             /* PL_DB, PL_WAL, or -1 (not tracked) */
	sqlite3_file *real; /* the wrapped file (memory right after this struct) */
} pl_file;

static sqlite3_vfs pl_vfs, *pl_base;

static int pl_close(sqlite3_file *f)
{
	pl_file *p = (pl_file *)f;
	return p->real->pMethods->xClose(p->real);
}
static int pl_read(sqlite3_file *f, void *buf, int n, sqlite3_int64 off)
{
	pl_file *p = (pl_file *)f;
	return p->real->pMethods->xRead(p->real, buf, n, off);
}
static int pl_write(sqlite3_file *f, const void *buf, int n, sqlite3_int64 off)
{
	pl_file *p = (pl_file *)f;
	pthread_mutex_lock(&pl.mu);
	int rc = p->real->pMethods->xWrite(p->real, buf, n, off);
	if (rc == SQLITE_OK)
		pl_track_locked(p->id, PL_WRITE, (uint64_t)off, buf, (uint32_t)n);
	pthread_mutex_unlock(&pl.mu);
	return rc;
}
static int pl_truncate(sqlite3_file *f, sqlite3_int64 size)
{
	pl_file *p = (pl_file *)f;
	pthread_mutex_lock(&pl.mu);
	int rc = p->real->pMethods->xTruncate(p->real, size);
	if (rc == SQLITE_OK)
		pl_track_locked(p->id, PL_TRUNC, (uint64_t)size, NULL, 0);
	pthread_mutex_unlock(&pl.mu);
	return rc;
}
static int pl_sync(sqlite3_file *f, int flags)
{
	pl_file *p = (pl_file *)f;
	uint64_t n = 0;
	if (p->id >= 0) {
		pthread_mutex_lock(&pl.mu);
		n = pl.seq[p->id];
		pthread_mutex_unlock(&pl.mu);
	}
	int rc = p->real->pMethods->xSync(p->real, flags);
	if (rc == SQLITE_OK && p->id >= 0)
		pl_promote(p->id, n);
	return rc;
}
static int pl_file_size(sqlite3_file *f, sqlite3_int64 *size)
{
	pl_file *p = (pl_file *)f;
	return p->real->pMethods->xFileSize(p->real, size);
}
static int pl_lock(sqlite3_file *f, int l)
{
	pl_file *p = (pl_file *)f;
	return p->real->pMethods->xLock(p->real, l);
}
static int pl_unlock(sqlite3_file *f, int l)
{
	pl_file *p = (pl_file *)f;
	return p->real->pMethods->xUnlock(p->real, l);
}
static int pl_check_lock(sqlite3_file *f, int *out)
{
	pl_file *p = (pl_file *)f;
	return p->real->pMethods->xCheckReservedLock(p->real, out);
}
static int pl_fcntl(sqlite3_file *f, int op, void *arg)
{
	pl_file *p = (pl_file *)f;
	return p->real->pMethods->xFileControl(p->real, op, arg);
}
static int pl_sector(sqlite3_file *f)
{
	pl_file *p = (pl_file *)f;
	return p->real->pMethods->xSectorSize(p->real);
}
static int pl_devchar(sqlite3_file *f)
{
	pl_file *p = (pl_file *)f;
	return p->real->pMethods->xDeviceCharacteristics(p->real);
}
/* NOTE: the index runs WAL with locking_mode=EXCLUSIVE, so the WAL index lives in heap memory: no xShm* here. */

static const sqlite3_io_methods pl_io = {
	1, pl_close, pl_read, pl_write, pl_truncate, pl_sync, pl_file_size, pl_lock, pl_unlock, pl_check_lock,
	pl_fcntl, pl_sector, pl_devchar, NULL, NULL, NULL, NULL, NULL, NULL,
};

static int pl_id_of(const char *name)
{
	if (!name)
		return -1;
	size_t n = strlen(name), w = strlen(pl_names[PL_WAL]), d = strlen(pl_names[PL_DB]);
	if (n >= w && strcmp(name + n - w, pl_names[PL_WAL]) == 0)
		return PL_WAL;
	if (n >= d && strcmp(name + n - d, pl_names[PL_DB]) == 0)
		return PL_DB;
	return -1;
}

static int pl_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags)
{
	(void)vfs;
	pl_file *p = (pl_file *)f;
	p->real = (sqlite3_file *)(p + 1);
	p->id = pl_id_of(name);
	int rc = pl_base->xOpen(pl_base, name, p->real, flags, out_flags);
	if (rc != SQLITE_OK) {
		p->base.pMethods = NULL;
		return rc;
	}
	if (p->id >= 0) { /* a file created now exists in the durable image too (lenient) */
		char path[1200];
		pl_path(path, sizeof(path), p->id, ".durable");
		int fd = open(path, O_WRONLY | O_CREAT, 0644);
		if (fd >= 0)
			close(fd);
	}
	p->base.pMethods = &pl_io;
	return SQLITE_OK;
}

static int pl_delete(sqlite3_vfs *vfs, const char *name, int sync_dir)
{
	(void)vfs;
	int id = pl_id_of(name);
	int rc = pl_base->xDelete(pl_base, name, sync_dir);
	if (rc == SQLITE_OK && id >= 0) { /* deletion durable at once (lenient), its pending writes moot */
		char path[1200];
		pthread_mutex_lock(&pl.mu);
		pl_path(path, sizeof(path), id, ".durable");
		unlink(path);
		while (pl.head[id]) {
			pl_entry *e = pl.head[id];
			pl.head[id] = e->next;
			free(e);
		}
		pl.tail[id] = &pl.head[id];
		if (ftruncate(pl.journal[id], 0) != 0)
			_exit(94);
		pthread_mutex_unlock(&pl.mu);
	}
	return rc;
}

/*
 * In the parent, with nothing open on dir: the files as they are now are the
 * durable state (what the last cut and the recovery after it left); empty
 * journals. Run before each trial's fork, never in the process that is
 * killed, so a kill cannot land in the middle of it.
 */
static int powerloss_settle(const char *dir)
{
	char path[1200], real[1200];
	snprintf(pl.dir, sizeof(pl.dir), "%s", dir);
	snprintf(path, sizeof(path), "%s/pl", dir);
	if (mkdir(path, 0755) != 0 && errno != EEXIST)
		return -1;
	for (int id = 0; id < PL_N_FILES; id++) {
		pl_real_path(real, sizeof(real), id);
		pl_path(path, sizeof(path), id, ".durable");
		if (pl_copy(real, path) != 0)
			return -1;
		pl_path(path, sizeof(path), id, ".journal");
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0)
			return -1;
		close(fd);
	}
	return 0;
}

/* In the process under test (after powerloss_settle): open the journals, install the VFS. */
static int powerloss_begin(const char *dir)
{
	char path[1200];
	snprintf(pl.dir, sizeof(pl.dir), "%s", dir);
	for (int id = 0; id < PL_N_FILES; id++) {
		pl_path(path, sizeof(path), id, ".journal");
		pl.journal[id] = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
		if (pl.journal[id] < 0)
			return -1;
		pl.head[id] = NULL;
		pl.tail[id] = &pl.head[id];
		pl.seq[id] = 0;
	}
	pl_base = sqlite3_vfs_find(NULL);
	if (!pl_base)
		return -1;
	pl_vfs = *pl_base;
	pl_vfs.zName = "kvt_powerloss";
	pl_vfs.szOsFile = (int)sizeof(pl_file) + pl_base->szOsFile;
	pl_vfs.xOpen = pl_open;
	pl_vfs.xDelete = pl_delete;
	return sqlite3_vfs_register(&pl_vfs, 1) == SQLITE_OK ? 0 : -1;
}

typedef struct powerloss_stats {
	uint64_t n_entries; /* unsynced entries found in the journals */
	uint64_t n_by_file[PL_N_FILES]; /* of those, by file (PL_T2 ... PL_SJ_TMP) */
	uint64_t n_dropped, n_applied, n_torn; /* what the cut did with them */
} powerloss_stats;

/* After the process died: each real file := its durable image plus a seeded choice per unsynced entry. */
static int powerloss_cut(const char *dir, uint64_t seed, powerloss_stats *st)
{
	char path[1200], real[1200];
	snprintf(pl.dir, sizeof(pl.dir), "%s", dir);
	for (int id = 0; id < PL_N_FILES; id++) {
		pl_path(path, sizeof(path), id, ".durable");
		pl_real_path(real, sizeof(real), id);
		if (pl_copy(path, real) != 0)
			return -1;
		pl_path(path, sizeof(path), id, ".journal");
		FILE *j = fopen(path, "rb");
		if (!j)
			continue;
		int fd = open(real, O_WRONLY);
		uint8_t hdr[24];
		while (fd >= 0 && fread(hdr, 1, 24, j) == 24) {
			uint32_t magic, type, n, end;
			uint64_t off;
			memcpy(&magic, hdr, 4);
			memcpy(&type, hdr + 4, 4);
			memcpy(&off, hdr + 8, 8);
			memcpy(&n, hdr + 16, 4);
			if (magic != PL_MAGIC || (type != PL_WRITE && type != PL_TRUNC))
				break;
			uint8_t *data = malloc(n ? n : 1);
			KVT_ASSERT(data);
			if (fread(data, 1, n, j) != n || fread(&end, 1, 4, j) != 4 || end != PL_END) {
				free(data); /* cut short by the kill: never journaled */
				break;
			}
			st->n_entries++;
			st->n_by_file[id]++;
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			unsigned what = (unsigned)(seed >> 33) % 3; /* 0 drop, 1 apply, 2 tear */
			if (what == 0) {
				st->n_dropped++;
			} else if (type == PL_TRUNC) {
				st->n_applied++;
				if (ftruncate(fd, (off_t)off) != 0)
					return -1;
			} else if (what == 1) {
				st->n_applied++;
				if (pwrite(fd, data, n, (off_t)off) != (ssize_t)n)
					return -1;
			} else {
				st->n_torn++;
				uint32_t n_sec = (n + 511) / 512;
				seed = seed * 6364136223846793005ull + 1442695040888963407ull;
				uint32_t prefix = (uint32_t)((seed >> 33) % (n_sec + 1));
				for (uint32_t s = 0; s < n_sec; s++) {
					bool keep;
					if (id == PL_T2) { /* any subset of the sectors */
						seed = seed * 6364136223846793005ull + 1442695040888963407ull;
						keep = (seed >> 40) & 1;
					} else { /* SQLite: a prefix */
						keep = s < prefix;
					}
					uint32_t a = s * 512, b = a + 512 < n ? a + 512 : n;
					if (keep && pwrite(fd, data + a, b - a, (off_t)(off + a)) != (ssize_t)(b - a))
						return -1;
				}
			}
			free(data);
		}
		if (fd >= 0)
			close(fd);
		fclose(j);
	}
	return 0;
}

#endif
