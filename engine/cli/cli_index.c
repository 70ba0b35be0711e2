/*
 * engine/cli/cli_index.c — index maintenance over a data directory a daemon
 * does not hold: `kvtier fsck` and `kvtier rebuild-index` (DESIGN.md §4).
 * The start-up recovery is not here: there is one, the daemon's
 * (kvt_tm_recover, tiers/recover.c). fsck verifies what that recovery
 * trusts lazily (every row's record, read and compared with the row), and
 * deletes the bad rows that recovery only skips.
 *
 * rebuild-index trusts only the T2 file: every record that verifies becomes
 * a row (the newest generation of each hash). It never deletes the old index:
 * it renames it aside, builds the new one under a temporary name and renames
 * it into place, so an interrupted rebuild leaves either no index (run it
 * again) or a complete one. What only the index knew is lost: sessions'
 * durable counts and retention. A block's kind comes from its record's
 * flags (KVT_T2_FLAG_CHUNK); a record written before records carried it is
 * taken as a prefix block's.
 *
 * Both refuse a data directory a running daemon holds: they take the
 * directory's lock (kvt_datadir_lock_take, the one kvtierd holds for its
 * life) before they open anything, and keep it to the end.
 */
#include "cli_index.h"
#include "fingerprint.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#define PATH_CAP 4096

/* ---- where a data directory's files are -------------------------------------------- */

int kvt_data_paths_dir(const char *dir, kvt_data_paths *p)
{
	memset(p, 0, sizeof(*p));
	if (!dir || !dir[0] || strlen(dir) >= sizeof(p->dir)) {
		KVT_LOGE("data directory: %s path", dir && dir[0] ? "too long a" : "empty");
		return KVT_EINVAL;
	}
	memcpy(p->dir, dir, strlen(dir) + 1);
	return kvt_index_paths(dir, p->t2, p->index, sizeof(p->t2));
}

int kvt_data_paths_config(const kvt_config *c, kvt_data_paths *p)
{
	int rc = kvt_data_paths_dir(c->data_dir, p);
	if (rc)
		return rc;
	/* the same rule as kvtierd's data_path(): a set path wins, else the file in the directory */
	if (c->nvme_path[0])
		snprintf(p->t2, sizeof(p->t2), "%s", c->nvme_path);
	if (c->index_path[0])
		snprintf(p->index, sizeof(p->index), "%s", c->index_path);
	return KVT_OK;
}

/* ---- the T2 superblock's model ---------------------------------------------------- */

int kvt_t2_file_model_fp(const char *t2_path, uint8_t out[32])
{
	kvt_t2_info in;
	int rc = kvt_t2_probe(t2_path, &in); /* logged */
	if (rc == KVT_OK)
		memcpy(out, in.model_fp, 32);
	return rc;
}

/*
 * Open the data directory's T2 file for a tool. repair: a file with no valid
 * superblock gets new copies written from its records (salvage), a truncated
 * one is extended back; else nothing is written (no_repair). The model comes
 * from the superblock, else from model_fp (may be NULL), else the records.
 */
static int open_t2(const char *t2_path, const uint8_t *model_fp, const uint8_t *owner, bool repair, uint32_t max_raw,
		   kvt_t2_store **out)
{
	kvt_t2_config cfg;
	kvt_t2_info in;
	memset(&cfg, 0, sizeof(cfg));
	int rc = kvt_t2_probe(t2_path, &in);
	if (rc == KVT_OK) {
		memcpy(cfg.model_fp, in.model_fp, 32);
		if (model_fp && memcmp(model_fp, cfg.model_fp, 32) != 0) {
			KVT_LOGE("t2 %s: the file holds KV of another model (fingerprint differs from --model)", t2_path);
			return KVT_EINVAL;
		}
	} else if ((rc == KVT_ECORRUPT || rc == KVT_EINVAL) && repair) {
		/*
		 * No superblock copy verifies (a checksum, or both copies' magic, gone): the record scan
		 * of the store's open path decides, as for the daemon (a file with record magics is
		 * salvaged from them; anything else is still refused as not a T2 file).
		 */
		if (model_fp)
			memcpy(cfg.model_fp, model_fp, 32);
		KVT_LOGI("t2 %s: salvaging: new superblock copies are written from the records", t2_path);
	} else {
		return rc;
	}
	cfg.path = t2_path;
	cfg.io_mode = KVT_T2_IO_AUTO;
	cfg.buffered_ok = true;
	cfg.salvage = repair;
	cfg.no_repair = !repair;
	cfg.max_raw_bytes = max_raw;
	cfg.n_io_ctx = 1; /* one batch at a time: staging for the largest record only */
	if (owner)
		memcpy(cfg.owner_id, owner, KVT_T2_OWNER_BYTES);
	return kvt_t2_open(&cfg, out);
}

/* ---- rebuild-index ----------------------------------------------------------------- */

typedef struct rec {
	kvt_t2_block_meta meta; /* header fields */
	kvt_t2_loc loc;         /* where */
} rec;

struct scan_ctx {
	rec *v;        /* found records */
	size_t n, cap; /* used, allocated */
};

static int scan_fn(void *arg, const kvt_t2_block_meta *meta, const kvt_t2_loc *loc)
{
	struct scan_ctx *c = arg;
	if (c->n == c->cap) {
		size_t cap = c->cap ? 2 * c->cap : 256;
		rec *v = realloc(c->v, cap * sizeof(*v));
		if (!v)
			return KVT_ENOMEM;
		c->v = v;
		c->cap = cap;
	}
	c->v[c->n].meta = *meta;
	c->v[c->n].loc = *loc;
	c->n++;
	return 0;
}

/* By block size, then hash, then newest generation first. */
static int cmp_rec(const void *a, const void *b)
{
	const rec *x = a, *y = b;
	if (x->meta.n_tokens != y->meta.n_tokens)
		return x->meta.n_tokens < y->meta.n_tokens ? -1 : 1;
	int c = memcmp(x->meta.hash, y->meta.hash, 32);
	if (c)
		return c;
	return x->loc.generation > y->loc.generation ? -1 : x->loc.generation < y->loc.generation;
}

static int fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return KVT_EIO;
	int rc = fsync(fd) == 0 ? KVT_OK : KVT_EIO;
	close(fd);
	return rc;
}

/* Rename path (and its -wal / -shm) to path.broken-<t>, if it exists. */
static int move_aside(const char *path, char *moved, size_t cap)
{
	static const char *const suffix[] = { "", "-wal", "-shm", "-journal" };
	long t = (long)time(NULL);
	moved[0] = '\0';
	for (int i = 0; i < 4; i++) {
		char from[PATH_CAP + 16], to[PATH_CAP + 64];
		snprintf(from, sizeof(from), "%s%s", path, suffix[i]);
		snprintf(to, sizeof(to), "%s.broken-%ld%s", path, t, suffix[i]);
		if (access(from, F_OK) != 0)
			continue;
		if (rename(from, to) != 0) {
			KVT_LOGE("rebuild-index: cannot move %s aside: %s", from, strerror(errno));
			return KVT_EIO;
		}
		if (i == 0)
			snprintf(moved, cap, "%s", to);
	}
	return KVT_OK;
}

int kvt_index_rebuild(const char *data_dir, const uint8_t *model_fp, kvt_rebuild_stats *st)
{
	kvt_data_paths p;
	memset(st, 0, sizeof(*st));
	int rc = kvt_data_paths_dir(data_dir, &p);
	return rc ? rc : kvt_index_rebuild_at(&p, model_fp, st);
}

int kvt_index_rebuild_at(const kvt_data_paths *dp, const uint8_t *model_fp, kvt_rebuild_stats *st)
{
	char tmp_path[PATH_CAP + 16], moved[PATH_CAP + 64], idx_dir[PATH_CAP], sj_path[PATH_CAP + 32];
	const char *t2_path = dp->t2, *idx_path = dp->index;
	struct scan_ctx sc = { 0 };
	kvt_datadir_lock *lock = NULL;
	kvt_t2_store *t2 = NULL;
	uint8_t fp[32];
	int rc;

	memset(st, 0, sizeof(*st));
	snprintf(idx_dir, sizeof(idx_dir), "%s", idx_path);
	dirname(idx_dir); /* where the renames happen: its entry is what must be durable */
	if ((rc = kvt_datadir_lock_take(dp->dir, "kvtier rebuild-index", &lock)) != KVT_OK)
		return rc;
	snprintf(sj_path, sizeof(sj_path), "%s/%s", dp->dir, KVT_DATA_SESSIONS_FILE);
	if ((rc = open_t2(t2_path, model_fp, NULL, true, 0, &t2)) != KVT_OK)
		goto out;
	if ((rc = kvt_t2_file_model_fp(t2_path, fp)) != KVT_OK)
		goto out;
	/* the new index takes the file's identity, so the daemon accepts the pair */
	uint8_t owner_buf[KVT_T2_OWNER_BYTES];
	const uint8_t *owner = owner_buf;
	kvt_t2_owner_id(t2, owner_buf);
	bool no_owner = true;
	for (int i = 0; i < KVT_T2_OWNER_BYTES; i++)
		no_owner = no_owner && !owner_buf[i];
	if (no_owner)
		owner = NULL; /* a file of no index yet: the new index makes an id, the daemon records it */
	int n_bad = kvt_t2_scan(t2, scan_fn, &sc);
	if (n_bad < 0) {
		rc = n_bad;
		goto out;
	}
	st->n_bad = (uint64_t)n_bad;
	st->n_records = sc.n;
	qsort(sc.v, sc.n, sizeof(*sc.v), cmp_rec);

	/* Build the new index under a temporary name. */
	snprintf(tmp_path, sizeof(tmp_path), "%s.rebuild", idx_path);
	for (int i = 0; i < 2; i++) {
		char p[PATH_CAP + 32];
		snprintf(p, sizeof(p), "%s%s", tmp_path, i ? "-wal" : "");
		if (unlink(p) != 0 && errno != ENOENT) {
			KVT_LOGE("rebuild-index: cannot remove the stale %s: %s", p, strerror(errno));
			rc = KVT_EIO;
			goto out;
		}
	}
	for (size_t i = 0; i < sc.n;) {
		uint32_t bt_n = sc.v[i].meta.n_tokens;
		kvt_db_config cfg;
		kvt_db *db = NULL;
		memset(&cfg, 0, sizeof(cfg));
		cfg.path = tmp_path;
		cfg.create = true;
		cfg.skip_check = true;
		cfg.owner_id = owner;
		cfg.journal_path = sj_path;
		memcpy(cfg.ns.model_fp, fp, 32);
		cfg.ns.layout_version = KVT_KV_LAYOUT_VERSION;
		cfg.ns.block_tokens = bt_n;
		if (bt_n < 1 || bt_n > KVT_BLOCK_MAX_TOKENS) {
			i++; /* scan verified the record; a block of 0 tokens cannot be indexed */
			continue;
		}
		if ((rc = kvt_db_open(&cfg, &db)) != KVT_OK)
			goto out;
		st->n_namespaces++;
		for (; i < sc.n && sc.v[i].meta.n_tokens == bt_n; i++) {
			if (i > 0 && sc.v[i - 1].meta.n_tokens == bt_n && memcmp(sc.v[i - 1].meta.hash, sc.v[i].meta.hash, 32) == 0) {
				st->n_duplicates++;
				continue;
			}
			kvt_db_block_row row;
			const kvt_t2_block_meta *m = &sc.v[i].meta;
			memset(&row, 0, sizeof(row));
			memcpy(row.hash, m->hash, 32);
			memcpy(row.parent, m->parent, 32);
			row.n_tokens = m->n_tokens;
			memcpy(row.tokens, m->tokens, (size_t)m->n_tokens * sizeof(int32_t));
			row.loc = sc.v[i].loc;
			row.kv_dtype = m->kv_dtype;
			row.codec = m->codec;
			row.scale_layout = m->scale_layout;
			row.raw_bytes = m->raw_bytes;
			row.last_use = kvt_wall_us();
			/* the record's flag; a record written before it had one is a prefix block's */
			row.kind = m->flags & KVT_T2_FLAG_CHUNK ? KVT_BLOCK_CHUNK : KVT_BLOCK_PREFIX;
			if ((rc = kvt_db_put_block(db, &row, NULL, NULL, NULL)) != KVT_OK)
				break;
			st->n_rows++;
		}
		int frc = kvt_db_flush(db);
		if (st->n_namespaces == 1) {
			/* the first open of the new file replayed the journal: its sessions, every namespace */
			kvt_db_stats ds;
			kvt_db_get_stats(db, &ds);
			st->n_sessions = ds.n_replayed;
		}
		kvt_db_close(db);
		if (rc == KVT_OK)
			rc = frc;
		if (rc)
			goto out;
	}
	if (st->n_namespaces == 0) { /* no records: still leave an empty, valid index */
		kvt_db_config cfg;
		kvt_db *db = NULL;
		memset(&cfg, 0, sizeof(cfg));
		cfg.path = tmp_path;
		cfg.create = true;
		cfg.skip_check = true;
		cfg.owner_id = owner;
		cfg.journal_path = sj_path;
		if ((rc = kvt_db_open(&cfg, &db)) != KVT_OK)
			goto out;
		kvt_db_stats ds;
		kvt_db_get_stats(db, &ds);
		st->n_sessions = ds.n_replayed;
		kvt_db_close(db);
	}
	if ((rc = move_aside(idx_path, moved, sizeof(moved))) != KVT_OK)
		goto out;
	if (rename(tmp_path, idx_path) != 0) {
		KVT_LOGE("rebuild-index: cannot rename %s to %s: %s", tmp_path, idx_path, strerror(errno));
		rc = KVT_EIO;
		goto out;
	}
	{
		/* The last close checkpoints and removes the WAL; if one is left, it belongs with the file. */
		char from[PATH_CAP + 32], to[PATH_CAP + 32];
		snprintf(from, sizeof(from), "%s-wal", tmp_path);
		snprintf(to, sizeof(to), "%s-wal", idx_path);
		if (access(from, F_OK) == 0 && rename(from, to) != 0) {
			KVT_LOGE("rebuild-index: cannot rename %s to %s: %s", from, to, strerror(errno));
			rc = KVT_EIO;
			goto out;
		}
	}
	fsync_dir(idx_dir);
	if (moved[0])
		KVT_LOGI("rebuild-index: the old index was moved to %s", moved);
out:
	free(sc.v);
	kvt_t2_close(t2);
	kvt_datadir_lock_release(lock);
	return rc;
}

/* ---- fsck ---------------------------------------------------------------------------- */

struct fsck_ctx {
	kvt_db_block_row *rows; /* every row (copied: verification runs outside the db walk) */
	size_t n, cap;          /* used, allocated */
};

static int fsck_collect(void *arg, const kvt_db_block_row *row)
{
	struct fsck_ctx *c = arg;
	if (c->n == c->cap) {
		size_t cap = c->cap ? 2 * c->cap : 256;
		kvt_db_block_row *v = realloc(c->rows, cap * sizeof(*v));
		if (!v)
			return KVT_ENOMEM;
		c->rows = v;
		c->cap = cap;
	}
	c->rows[c->n++] = *row;
	return 0;
}

int kvt_index_fsck(const char *data_dir, bool repair, kvt_fsck_stats *st)
{
	kvt_data_paths p;
	memset(st, 0, sizeof(*st));
	int rc = kvt_data_paths_dir(data_dir, &p);
	return rc ? rc : kvt_index_fsck_at(&p, repair, st);
}

int kvt_index_fsck_at(const kvt_data_paths *dp, bool repair, kvt_fsck_stats *st)
{
	const char *t2_path = dp->t2, *idx_path = dp->index;
	char hex[65];
	kvt_datadir_lock *lock = NULL;
	struct fsck_ctx fc = { 0 };
	kvt_t2_store *t2 = NULL;
	kvt_db *db = NULL;
	kvt_t2_block_meta *meta = NULL;
	void *payload = NULL;
	size_t payload_cap = 0;
	kvt_db_config cfg;
	int rc;

	memset(st, 0, sizeof(*st));
	if ((rc = kvt_datadir_lock_take(dp->dir, "kvtier fsck", &lock)) != KVT_OK)
		return rc;
	memset(&cfg, 0, sizeof(cfg));
	cfg.path = idx_path; /* admin handle: no namespace */
	if ((rc = kvt_db_open(&cfg, &db)) != KVT_OK)
		goto out;
	if ((rc = kvt_db_for_each_block(db, KVT_DB_ALL_NS, fsck_collect, &fc)) != KVT_OK)
		goto out;
	/* Reads are sized by the largest row: the rows of every block size are
	 * checked, and a record larger than the default staging slot is no
	 * reason to call it bad. */
	uint32_t max_raw = 0;
	for (size_t i = 0; i < fc.n; i++)
		if (fc.rows[i].raw_bytes > max_raw && fc.rows[i].raw_bytes <= KVT_T2_MAX_RAW_BYTES)
			max_raw = fc.rows[i].raw_bytes;
	uint8_t owner[KVT_DB_OWNER_BYTES];
	kvt_db_owner_id(db, owner);
	if ((rc = open_t2(t2_path, NULL, owner, repair, max_raw, &t2)) != KVT_OK)
		goto out;
	meta = malloc(sizeof(*meta));
	if (!meta) {
		rc = KVT_ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < fc.n; i++) {
		const kvt_db_block_row *r = &fc.rows[i];
		kvt_t2_loc loc;
		const char *why = NULL;
		st->n_rows++;
		loc = r->loc;
		if (r->raw_bytes > payload_cap) {
			void *p = realloc(payload, r->raw_bytes);
			if (!p) {
				rc = KVT_ENOMEM;
				goto out;
			}
			payload = p;
			payload_cap = r->raw_bytes;
		}
		int rrc = kvt_t2_read(t2, &loc, r->hash, meta, payload, payload_cap);
		if (rrc == KVT_EIO) {
			st->n_io++;
			continue;
		}
		if (rrc != KVT_OK)
			why = rrc == KVT_ECORRUPT ? "record fails verification" : "record unreadable at this location";
		else if (meta->n_tokens != r->n_tokens ||
			 memcmp(meta->tokens, r->tokens, (size_t)r->n_tokens * sizeof(int32_t)) != 0)
			why = "record's token ids differ from the row's";
		else if (memcmp(meta->parent, r->parent, 32) != 0)
			why = "record's parent differs from the row's";
		else if (kvt_t2_mark_used(t2, &loc) != KVT_OK)
			why = "extent overlaps another row's";
		if (!why) {
			st->n_ok++;
			continue;
		}
		st->n_bad++;
		kvt_hash_hex(r->hash, hex);
		printf("bad row: namespace %lld block %s at offset %llu: %s%s\n", (long long)r->ns_id, hex,
		       (unsigned long long)r->loc.off, why, repair ? " (deleted)" : "");
		if (repair) {
			if ((rc = kvt_db_delete_block_ns(db, r->ns_id, r->hash, NULL, NULL, NULL)) != KVT_OK)
				goto out;
			st->n_deleted++;
		}
	}
	rc = kvt_db_flush(db);
out:
	free(meta);
	free(payload);
	free(fc.rows);
	kvt_t2_close(t2);
	kvt_db_close(db);
	kvt_datadir_lock_release(lock);
	return rc;
}

/* ---- the subcommands -------------------------------------------------------------------- */

static void usage_fsck(FILE *f)
{
	fprintf(f, "usage: kvtier fsck (--data-dir DIR | -c FILE) [--dry-run]\n"
		   "  Verifies every index row against its T2 record; deletes bad rows unless --dry-run.\n"
		   "  -c FILE reads index.data_dir, tier.nvme path and index.path from kvtierd's configuration\n"
		   "  (--data-dir then overrides index.data_dir). Refuses a directory a running kvtierd holds.\n"
		   "  Exit: 0 all rows verified, 3 bad rows found, 1 failure, 2 bad usage, 75 held by a daemon.\n");
}

static void usage_rebuild(FILE *f)
{
	fprintf(f, "usage: kvtier rebuild-index (--data-dir DIR | -c FILE) [--model MODEL.gguf]\n"
		   "  Rebuilds the index (DIR/%s) from the record headers in the T2 file (DIR/%s); the old\n"
		   "  index is kept as %s.broken-<time>. Sessions are not recovered.\n"
		   "  -c FILE reads index.data_dir, tier.nvme path and index.path from kvtierd's configuration\n"
		   "  (--data-dir then overrides index.data_dir). Refuses a directory a running kvtierd holds.\n"
		   "  Exit: 0 rebuilt, 1 failure, 2 bad usage, 75 held by a daemon.\n",
		KVT_DATA_INDEX_FILE, KVT_DATA_T2_FILE, KVT_DATA_INDEX_FILE);
}

/*
 * The paths from --data-dir and/or -c FILE (kvtierd's configuration, so a T2
 * device or index at a configured path is found). 0, or an exit status
 * (message printed).
 */
static int resolve_paths(const char *cmd, const char *dir, const char *conf, kvt_data_paths *p)
{
	char err[1024];
	int rc;
	if (!conf) {
		if (!dir) {
			fprintf(stderr, "kvtier %s: --data-dir DIR or -c FILE is required\n", cmd);
			return 2;
		}
		if (kvt_data_paths_dir(dir, p) != KVT_OK) {
			fprintf(stderr, "kvtier %s: bad --data-dir '%s'\n", cmd, dir);
			return 2;
		}
		return 0;
	}
	kvt_config *c = malloc(sizeof(*c));
	if (!c) {
		fprintf(stderr, "kvtier %s: out of memory\n", cmd);
		return 1;
	}
	kvt_config_default(c);
	rc = kvt_config_load(c, conf, err, sizeof(err));
	if (rc == KVT_OK && dir)
		rc = kvt_config_set(c, "index", "data_dir", dir, err, sizeof(err));
	if (rc != KVT_OK) {
		fprintf(stderr, "kvtier %s: %s\n", cmd, err);
		free(c);
		return 2;
	}
	rc = kvt_data_paths_config(c, p);
	free(c);
	if (rc != KVT_OK) {
		fprintf(stderr, "kvtier %s: bad index.data_dir in %s\n", cmd, conf);
		return 2;
	}
	return 0;
}

/* The exit status and message of a failed tool run. */
static int tool_failed(const char *cmd, const kvt_data_paths *p, int rc)
{
	if (rc == KVT_EBUSY) {
		fprintf(stderr, "kvtier %s: %s is in use (the line above names the holder); nothing was changed; stop "
				"kvtierd first, or ask it (kvtier stats, kvtier sessions)\n",
			cmd, p->dir);
		return EX_TEMPFAIL;
	}
	fprintf(stderr, "kvtier %s: %s: failed (%s)\n", cmd, p->dir, kvt_strerror(rc));
	return 1;
}

int kvt_cli_fsck(int argc, char **argv)
{
	const char *dir = NULL, *conf = NULL;
	bool dry = false;
	kvt_fsck_stats st;
	kvt_data_paths p;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--data-dir") && i + 1 < argc) {
			dir = argv[++i];
		} else if (!strcmp(argv[i], "-c") && i + 1 < argc) {
			conf = argv[++i];
		} else if (!strcmp(argv[i], "--dry-run")) {
			dry = true;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage_fsck(stdout);
			return 0;
		} else {
			fprintf(stderr, "kvtier fsck: unexpected argument '%s'\n", argv[i]);
			usage_fsck(stderr);
			return 2;
		}
	}
	int ret = resolve_paths("fsck", dir, conf, &p);
	if (ret) {
		if (ret == 2)
			usage_fsck(stderr);
		return ret;
	}
	int rc = kvt_index_fsck_at(&p, !dry, &st);
	if (rc)
		return tool_failed("fsck", &p, rc);
	printf("fsck %s: %llu rows, %llu ok, %llu bad (%llu deleted), %llu unreadable (I/O error, kept)\n", p.dir,
	       (unsigned long long)st.n_rows, (unsigned long long)st.n_ok, (unsigned long long)st.n_bad,
	       (unsigned long long)st.n_deleted, (unsigned long long)st.n_io);
	return st.n_bad || st.n_io ? 3 : 0;
}

int kvt_cli_rebuild_index(int argc, char **argv)
{
	const char *dir = NULL, *conf = NULL, *model = NULL;
	uint8_t fp[32];
	kvt_rebuild_stats st;
	kvt_data_paths p;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--data-dir") && i + 1 < argc) {
			dir = argv[++i];
		} else if (!strcmp(argv[i], "-c") && i + 1 < argc) {
			conf = argv[++i];
		} else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
			model = argv[++i];
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage_rebuild(stdout);
			return 0;
		} else {
			fprintf(stderr, "kvtier rebuild-index: unexpected argument '%s'\n", argv[i]);
			usage_rebuild(stderr);
			return 2;
		}
	}
	int ret = resolve_paths("rebuild-index", dir, conf, &p);
	if (ret) {
		if (ret == 2)
			usage_rebuild(stderr);
		return ret;
	}
	/*
	 * --model: the file's KV must be that model's, under the fingerprint version the superblock
	 * names (kvt_model_fingerprint_for). With no superblock to read, the records name the model
	 * (so no version is guessed and no record skipped), and it is checked after.
	 */
	uint8_t stored[32];
	bool have_sb = model && kvt_t2_file_model_fp(p.t2, stored) == KVT_OK;
	int version = 0;
	if (have_sb && kvt_model_fingerprint_for(model, NULL, stored, fp, &version) != KVT_OK) {
		fprintf(stderr, "kvtier rebuild-index: cannot fingerprint %s\n", model);
		return 1;
	}
	int rc = kvt_index_rebuild_at(&p, have_sb ? fp : NULL, &st);
	if (rc)
		return tool_failed("rebuild-index", &p, rc);
	if (model && !have_sb) {
		bool known = kvt_t2_file_model_fp(p.t2, stored) == KVT_OK; /* the salvage wrote the records' one */
		if (known && kvt_model_fingerprint_for(model, NULL, stored, fp, &version) != KVT_OK) {
			fprintf(stderr, "kvtier rebuild-index: cannot fingerprint %s\n", model);
			return 1;
		}
		if (!known || memcmp(fp, stored, 32) != 0) {
			fprintf(stderr, "kvtier rebuild-index: %s: its records hold KV of another model than %s; the "
					"index was rebuilt for theirs (nothing was dropped)\n",
				p.t2, model);
			return 1;
		}
	}
	printf("rebuild-index %s: %llu records, %llu corrupt or torn skipped, %llu older duplicates dropped; "
	       "%llu rows in %u namespace(s); %llu session writes replayed from the session journal\n",
	       p.dir, (unsigned long long)st.n_records, (unsigned long long)st.n_bad,
	       (unsigned long long)st.n_duplicates, (unsigned long long)st.n_rows, st.n_namespaces,
	       (unsigned long long)st.n_sessions);
	return 0;
}
