/*
 * tiers/recover.c — the start-up recovery: the state that is not persisted,
 * rebuilt from the durable index (DESIGN.md §4, §8 item 7). There is one;
 * kvt_tm_recover (manager.h) runs it for the daemon (kvt_stack_open) and
 * every test of start-up, the crash and power-loss trials included, and
 * publishes its counts in kvt_tm_stats.
 *
 * What it rebuilds:
 *  - T2's free map. Every extent an index row of this model points at is
 *    marked used, in every namespace of the model (other salts and block
 *    sizes share the model's T2 file); everything else is free, including
 *    the extents of blocks whose bytes were written but whose row never
 *    committed before a crash.
 *  - The block table: this namespace's rows, least recently used first (the
 *    table's LRU order), present in T2 only, clean; their kind (prefix or
 *    chunk: the row's, schema 5) and their retention. (An index rebuilt from
 *    the T2 records, `kvtier rebuild-index`, takes the kind from each
 *    record's flags; a record written before they carried it, or a row
 *    migrated from schema 4, is a prefix block's.)
 *  - The other namespaces' records (kept, never served, reclaimed first).
 * Rows are trusted lazily: each T2 read verifies its record; fsck verifies
 * them all.
 *
 * Bad rows never fail start-up (a daemon that refuses to start over one
 * damaged row loses everything else it holds). A row is bad when its extent
 * is invalid or overlaps an extent an earlier row of the walk claimed (the
 * first claimant keeps it), when it has another block size than its
 * namespace, or when its hash collides in the table with other tokens. It
 * is skipped (its extent is not marked by it, it is not loaded), counted
 * (n_skipped) and logged naming the row and why, and left in the index for
 * `kvtier fsck` to judge (it reads the record and deletes the row that does
 * not match it). NOTE: of two rows claiming one extent, the one the walk
 * meets first keeps it (the index's order: by namespace and hash), whether
 * or not the record there is its own; telling them apart takes a read of
 * the record, which fsck does. Nothing wrong is served either way: a read
 * verifies the record's hash, so the wrong claimant is a miss (its row
 * dropped), and the skipped one a miss until fsck. A row whose extent lies past kvt_t2_intact_bytes (the file
 * was recreated or truncated) is not bad but lost: its bytes are gone for
 * good, so its row is deleted (n_lost) and its sessions recompute it.
 *
 * Runs once, before anything is registered; single-threaded (the db walk
 * runs its callback on the db's writer thread while the caller waits).
 */
#include "tiers_int.h"

#include <stdlib.h>
#include <string.h>

/* Per-row lines logged for skipped rows; the rest are only counted (a whole damaged index must not flood the log). */
#define RECOVER_MAX_LOGGED 32

typedef struct recover_ctx {
	kvt_t2_store *t2;    /* borrowed */
	kvt_btable *bt;      /* borrowed */
	tm_retain *rt;       /* borrowed */
	tm_recovery *out;    /* the results */
	uint64_t intact;     /* kvt_t2_intact_bytes: records at or past it are gone */
	tm_foreign *lost;    /* [out->n_lost] rows whose records are gone (loc unused) */
	uint32_t cap_lost, cap_foreign; /* allocated entries of lost, out->foreign */
	uint8_t (*bad)[KVT_HASH_BYTES]; /* [n_bad] this namespace's rows skipped by the mark pass, sorted after it */
	uint32_t n_bad, cap_bad;
} recover_ctx;

static bool row_lost(const recover_ctx *r, const kvt_db_block_row *row)
{
	return row->loc.off + row->loc.extent_bytes > r->intact;
}

static int push_row(tm_foreign **v, uint32_t *n, uint32_t *cap, const kvt_db_block_row *row)
{
	if (*n == *cap) {
		uint32_t c = *cap ? 2 * *cap : 64;
		tm_foreign *p = realloc(*v, c * sizeof(*p));
		if (!p)
			return KVT_ENOMEM;
		*v = p;
		*cap = c;
	}
	tm_foreign *f = &(*v)[(*n)++];
	f->ns_id = row->ns_id;
	memcpy(f->hash, row->hash, KVT_HASH_BYTES);
	f->loc = row->loc;
	f->last_use = row->last_use;
	return KVT_OK;
}

/* A bad row: counted, and logged (up to RECOVER_MAX_LOGGED of them) naming it and why. */
static void skip_row(recover_ctx *r, const kvt_db_block_row *row, const char *why)
{
	char hex[2 * KVT_HASH_BYTES + 1];
	if (r->out->n_skipped++ >= RECOVER_MAX_LOGGED)
		return;
	kvt_hash_hex(row->hash, hex);
	KVT_LOGW("index recovery: row of namespace %lld block %s at offset %llu (%u bytes) skipped: %s",
		 (long long)row->ns_id, hex, (unsigned long long)row->loc.off, row->loc.extent_bytes, why);
}

static int cmp_hash(const void *a, const void *b)
{
	return memcmp(a, b, KVT_HASH_BYTES);
}

static int recover_mark(void *arg, const kvt_db_block_row *row)
{
	recover_ctx *r = arg;
	tm_recovery *o = r->out;
	o->n_rows++;
	if (row_lost(r, row))
		return push_row(&r->lost, &o->n_lost, &r->cap_lost, row);
	kvt_t2_loc l;
	l = row->loc;
	if (kvt_t2_mark_used(r->t2, &l) != KVT_OK) { /* the store logged the extent */
		skip_row(r, row, "its T2 extent is invalid or overlaps another row's");
		if (!row->this_ns)
			return 0;
		if (r->n_bad == r->cap_bad) { /* the load pass must not load it */
			uint32_t c = r->cap_bad ? 2 * r->cap_bad : 16;
			void *p = realloc(r->bad, c * sizeof(*r->bad));
			if (!p)
				return KVT_ENOMEM;
			r->bad = p;
			r->cap_bad = c;
		}
		memcpy(r->bad[r->n_bad++], row->hash, KVT_HASH_BYTES);
		return 0;
	}
	o->n_marked++;
	if (!row->this_ns)
		return push_row(&o->foreign, &o->n_foreign, &r->cap_foreign, row);
	return 0;
}

static int recover_insert(void *arg, const kvt_db_block_row *row)
{
	recover_ctx *r = arg;
	bool created;
	if (row_lost(r, row))
		return 0; /* its record is gone: a miss, and its row is being dropped */
	if (r->n_bad && bsearch(row->hash, r->bad, r->n_bad, sizeof(*r->bad), cmp_hash))
		return 0; /* skipped (and counted) by the mark pass */
	if (row->n_tokens != kvt_btable_block_tokens(r->bt)) {
		skip_row(r, row, "its block size differs from its namespace's");
		return 0;
	}
	int rc = kvt_btable_insert(r->bt, row->hash, row->parent, row->tokens, &created);
	if (rc == KVT_ECORRUPT) { /* the table logged the collision */
		skip_row(r, row, "its hash is in the table with other token ids");
		return 0;
	}
	if (rc == KVT_OK && created) /* before it enters T2: it joins its own kind's lists and counts */
		rc = kvt_btable_set_kind(r->bt, row->hash, row->kind);
	if (rc == KVT_OK)
		rc = kvt_btable_set_nvme(r->bt, row->hash, &row->loc);
	if (rc == KVT_OK && row->retain_until_us)
		(void)tm_retain_recover(r->rt, row, (uint32_t)r->out->n_loaded); /* later rows of a chain were used later */
	if (rc == KVT_OK)
		r->out->n_loaded++;
	return 0; /* a block the table could not take is a miss, not a failed start-up */
}

static int cmp_last_use(const void *a, const void *b)
{
	const tm_foreign *x = a, *y = b;
	return (x->last_use > y->last_use) - (x->last_use < y->last_use);
}

int tm_recover_rows(kvt_db *db, kvt_t2_store *t2, kvt_btable *bt, tm_retain *rt, tm_recovery *out)
{
	recover_ctx r = { .t2 = t2, .bt = bt, .rt = rt, .out = out, .intact = kvt_t2_intact_bytes(t2) };
	memset(out, 0, sizeof(*out));
	/* The T2 file belongs to one model (its superblock says which), so the extents
	 * in use are those of this model's rows, in every namespace of it (other
	 * salts, block sizes); another model's rows never point into this file. */
	int rc = kvt_db_for_each_block(db, KVT_DB_MODEL_NS, recover_mark, &r);
	if (r.n_bad > 1)
		qsort(r.bad, r.n_bad, sizeof(*r.bad), cmp_hash);
	/* Least recently used first: insertion order is the table's LRU order, so
	 * the blocks used longest ago before the restart are the first to go. */
	if (rc == KVT_OK)
		rc = kvt_db_for_each_block(db, KVT_DB_BY_LAST_USE, recover_insert, &r);
	if (rc == KVT_OK && out->n_lost) {
		/* Their bytes are gone for good: drop the rows, so nothing marks or
		 * reads those extents again and the sessions recompute the blocks. */
		uint64_t n_here = 0;
		for (uint32_t i = 0; i < out->n_lost && rc == KVT_OK; i++) {
			n_here += r.lost[i].ns_id == kvt_db_ns_id(db);
			rc = kvt_db_delete_block_ns(db, r.lost[i].ns_id, r.lost[i].hash, NULL, NULL, NULL);
		}
		if (rc == KVT_OK)
			rc = kvt_db_flush(db);
		KVT_LOGE("t2 %s: %u blocks the index lists are gone from the file (%llu of them of this namespace): it "
			 "held %llu bytes of data when opened (made anew or truncated); their rows are dropped and the "
			 "sessions that used them recompute them",
			 kvt_t2_file_path(t2), out->n_lost, (unsigned long long)n_here, (unsigned long long)r.intact);
	}
	if (out->n_skipped)
		KVT_LOGW("index recovery: %llu bad rows skipped (%s): never served, kept in the index; run `kvtier "
			 "fsck` with the daemon stopped to delete them",
			 (unsigned long long)out->n_skipped,
			 out->n_skipped > RECOVER_MAX_LOGGED ? "the first ones named above" : "named above");
	if (out->n_foreign) {
		qsort(out->foreign, out->n_foreign, sizeof(*out->foreign), cmp_last_use);
		KVT_LOGI("t2 %s: %u records of this model's other namespaces (another block size) kept: never served "
			 "here, reclaimed first when the tier needs room",
			 kvt_t2_file_path(t2), out->n_foreign);
	}
	free(r.bad);
	free(r.lost);
	return rc;
}
