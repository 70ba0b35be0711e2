/*
 * tiers/kvs_writer.c — the key-value store's writer thread (kvstore.h): it
 * takes the queued SETs and DELs in order, a batch at a time, and for each
 * batch keeps the write order (DESIGN.md §4):
 *   1. room: if the file lacks space, least recently used values are evicted:
 *      their rows deleted and committed, then their extents freed;
 *   2. the batch's chunk records are put through the record store (T2: one
 *      fdatasync for the batch): durable;
 *   3. the rows (INSERT OR REPLACE for a SET, DELETE for a DEL, in the ops'
 *      order) commit in one transaction;
 *   4. the tickets are acknowledged; the extents the rows no longer name are
 *      freed (under free_lock, so no GET is reading them).
 * A crash between 2 and 3 leaves extents no row names: free at the next open.
 */
#include "kvs_int.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#define BATCH_OPS 256u
#define BATCH_BYTES (256ull << 20)

/* One SET of a batch being written. */
typedef struct kvs_w {
	kvs_op *op;
	kvt_kvs_val *val;         /* a ref; NULL: nothing to write (skipped) */
	uint64_t sum;             /* XXH3-64 of the value */
	uint64_t expires_ms;      /* its expiry, as set (read under mu) */
	kvt_t2_loc *locs;         /* [n] where its chunks went */
	uint32_t n;
	bool ok;                  /* every chunk durable */
} kvs_w;

kvt_kvs_ticket kvs_queue_locked(kvt_kvs *s, int kind, kvs_ent *e)
{
	kvs_op *op = calloc(1, sizeof(*op));
	if (!op) {
		KVT_LOGE("store: out of memory queueing a write: the value stays in RAM only");
		return 0;
	}
	op->kind = kind;
	op->e = e;
	op->version = e->version;
	op->bytes = kind == KVS_OP_SET ? e->len : 0;
	op->ticket = ++s->next_ticket;
	e->refs++;
	e->pending++;
	if (s->q_tail)
		s->q_tail->next = op;
	else
		s->q_head = op;
	s->q_tail = op;
	s->q_len++;
	pthread_cond_signal(&s->cv_work);
	return op->ticket;
}

void kvs_freelist_add(kvs_freelist *fl, const kvt_t2_loc *locs, uint32_t n)
{
	if (!n)
		return;
	if (fl->n + n > fl->cap) {
		size_t cap = (fl->n + n) * 2;
		kvt_t2_loc *l = realloc(fl->locs, cap * sizeof(*l));
		if (!l) {
			KVT_LOGE("store: out of memory: %u extent(s) stay used until the next start", n);
			return;
		}
		fl->locs = l;
		fl->cap = cap;
	}
	memcpy(fl->locs + fl->n, locs, n * sizeof(*locs));
	fl->n += n;
}

void kvs_free_extents(kvt_kvs *s, kvs_freelist *fl)
{
	if (fl->n) {
		pthread_rwlock_wrlock(&s->free_lock);
		for (size_t i = 0; i < fl->n; i++)
			kvt_t2_free(s->t2, &fl->locs[i]);
		pthread_rwlock_unlock(&s->free_lock);
	}
	free(fl->locs);
	memset(fl, 0, sizeof(*fl));
}

static uint64_t extent_of(uint64_t raw)
{
	return (KVT_T2_HEADER_BYTES + raw + KVT_T2_UNIT_BYTES - 1) / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES;
}

static uint64_t value_extents(uint64_t len)
{
	uint64_t whole = len / KVT_KVS_CHUNK_BYTES, rest = len % KVT_KVS_CHUNK_BYTES;
	return whole * extent_of(KVT_KVS_CHUNK_BYTES) + (rest ? extent_of(rest) : 0);
}

/* ---- step 1: room ---- */

/* Under mu: unlink least recently used values on NVMe until `need` bytes would be free. */
static size_t pick_victims_locked(kvt_kvs *s, uint64_t need, uint64_t free_now, kvs_ent **v, size_t cap)
{
	size_t n = 0;
	double now = kvs_mono();
	for (kvs_ent *e = s->lru_tail; e && free_now < need && n < cap;) {
		kvs_ent *prev = e->lprev;
		if (e->n_locs && !e->pending && e->lease_until <= now) {
			free_now += value_extents(e->nvme_len);
			s->ten[e->tenant].evicted++;
			e->refs++;
			kvs_unlink_locked(s, e);
			v[n++] = e;
		}
		e = prev;
	}
	return n;
}

/* Evict until `need` bytes of the file are free (as far as values can go). */
static void make_room(kvt_kvs *s, uint64_t need)
{
	kvt_t2_stats st;
	kvt_t2_get_stats(s->t2, &st);
	uint64_t free_now = st.capacity_bytes > st.used_bytes ? st.capacity_bytes - st.used_bytes : 0;
	if (free_now >= need)
		return;
	kvs_ent *v[512];
	pthread_mutex_lock(&s->mu);
	size_t n = pick_victims_locked(s, need, free_now, v, 512);
	pthread_mutex_unlock(&s->mu);
	if (!n)
		return;
	int rc = kvs_sql_begin(s);
	for (size_t i = 0; !rc && i < n; i++)
		rc = kvs_sql_del(s, v[i]);
	if (!rc)
		rc = kvs_sql_commit(s);
	kvs_freelist fl = { 0 };
	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < n; i++) {
		if (!rc)
			kvs_freelist_add(&fl, v[i]->locs, v[i]->n_locs);
		v[i]->n_locs = 0; /* on failure its row stays: its extents too, until a restart finds the row */
		kvs_ent_unref_locked(s, v[i]);
	}
	if (rc) {
		kvs_sql_rollback(s);
		s->write_errors++;
	}
	pthread_mutex_unlock(&s->mu);
	kvs_free_extents(s, &fl);
}

/* ---- step 2: the records ---- */

/* Under mu: what SET op o writes (w->val NULL: nothing — replaced, deleted, or too big). */
static void prepare_w_locked(kvt_kvs *s, kvs_op *o, kvs_w *w, uint64_t capacity)
{
	kvs_ent *e = o->e;
	w->op = o;
	if (e->dead || e->version != o->version || !e->ram)
		return;
	if (value_extents(e->len) > capacity) {
		e->too_big = true;
		return;
	}
	w->val = e->ram;
	w->expires_ms = e->expires_ms;
	kvt_kvs_val_ref(w->val);
	w->n = kvs_n_chunks(e->len);
}

/* The records of values w[0..n) (those with a val), in one array: chunk i of each in order. */
typedef struct kvs_recs {
	kvt_t2_block_meta *m;
	kvt_rstore_rec *r;
	kvt_rstore_loc *locs;
	int *res;
	uint32_t n;
} kvs_recs;

static void recs_free(kvs_recs *x)
{
	free(x->m);
	free(x->r);
	free(x->locs);
	free(x->res);
}

static int recs_build(kvs_recs *x, kvs_w *w, size_t n)
{
	memset(x, 0, sizeof(*x));
	for (size_t i = 0; i < n; i++)
		x->n += w[i].val ? w[i].n : 0;
	x->m = calloc(x->n + 1, sizeof(*x->m));
	x->r = calloc(x->n + 1, sizeof(*x->r));
	x->locs = calloc(x->n + 1, sizeof(*x->locs));
	x->res = calloc(x->n + 1, sizeof(*x->res));
	if (!x->m || !x->r || !x->locs || !x->res)
		return KVT_ENOMEM;
	uint32_t k = 0;
	for (size_t i = 0; i < n; i++) {
		for (uint32_t c = 0; w[i].val && c < w[i].n; c++, k++) {
			uint64_t off = (uint64_t)c * KVT_KVS_CHUNK_BYTES, left = w[i].val->len - off;
			kvs_chunk_hash(w[i].op->e->id, w[i].op->version, c, x->m[k].hash);
			memcpy(x->m[k].parent, w[i].op->e->id, 32);
			x->m[k].raw_bytes = (uint32_t)(left < KVT_KVS_CHUNK_BYTES ? left : KVT_KVS_CHUNK_BYTES);
			x->r[k].meta = &x->m[k];
			x->r[k].payload = w[i].val->data + off;
		}
	}
	return KVT_OK;
}

/* Split the put's results by value: w->ok and w->locs for a value whose chunks all went; the rest freed. */
static void recs_settle(kvt_kvs *s, kvs_recs *x, kvs_w *w, size_t n)
{
	uint32_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (!w[i].val)
			continue;
		bool ok = true;
		for (uint32_t c = 0; c < w[i].n; c++) {
			ok = ok && x->res[k + c] == KVT_OK;
		}
		w[i].ok = ok && (w[i].locs = malloc(w[i].n * sizeof(*w[i].locs)));
		if (w[i].ok)
			memcpy(w[i].locs, x->locs + k, w[i].n * sizeof(*w[i].locs));
		for (uint32_t c = 0; !w[i].ok && c < w[i].n; c++)
			if (x->res[k + c] == KVT_OK)
				kvt_t2_free(s->t2, &x->locs[k + c]); /* no row names it: no reader can */
		k += w[i].n;
	}
}

/* Put the records of w[0..n) (one durable batch); values that did not fit get one more try after eviction. */
static void put_values(kvt_kvs *s, kvs_w *w, size_t n)
{
	kvs_recs x;
	int rc = recs_build(&x, w, n);
	if (rc == KVT_OK)
		s->rs.ops->put(&s->rs, x.n, x.r, x.locs, x.res);
	else
		kvt_rstore_fill(x.n, x.res, rc);
	recs_settle(s, &x, w, n);
	recs_free(&x);
}

static void write_values(kvt_kvs *s, kvs_w *w, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (w[i].val)
			w[i].sum = XXH3_64bits(w[i].val->data, w[i].val->len);
	put_values(s, w, n);
	for (size_t i = 0; i < n; i++) {
		if (!w[i].val || w[i].ok)
			continue;
		make_room(s, value_extents(w[i].val->len) * 2); /* the free space was in pieces: make more, once */
		put_values(s, &w[i], 1);
		if (!w[i].ok)
			KVT_LOGW("store: a value of %llu bytes could not be written to NVMe: it stays in RAM only",
				 (unsigned long long)w[i].val->len);
	}
}

/* ---- step 3: the rows ---- */

static int commit_rows(kvt_kvs *s, kvs_op **ops, size_t n, kvs_w *w)
{
	int rc = kvs_sql_begin(s);
	for (size_t i = 0, j = 0; !rc && i < n; i++) {
		if (ops[i]->kind == KVS_OP_DEL) {
			rc = kvs_sql_del(s, ops[i]->e);
			continue;
		}
		kvs_w *x = &w[j++];
		if (x->ok)
			rc = kvs_sql_put(s, x->op->e, x->op->version, x->val->len, x->sum, x->expires_ms, x->locs, x->n);
	}
	if (!rc)
		rc = kvs_sql_commit(s);
	if (rc)
		kvs_sql_rollback(s);
	return rc;
}

/* ---- step 4: the entries take their new copies; old extents to free ---- */

static void install_locked(kvt_kvs *s, kvs_op **ops, size_t n, kvs_w *w, bool committed, kvs_freelist *fl)
{
	for (size_t i = 0, j = 0; i < n; i++) {
		kvs_ent *e = ops[i]->e;
		if (ops[i]->kind == KVS_OP_DEL) {
			if (committed) {
				kvs_freelist_add(fl, e->locs, e->n_locs);
				e->n_locs = 0;
			}
			continue;
		}
		kvs_w *x = &w[j++];
		if (!x->ok)
			continue;
		if (!committed) {
			kvs_freelist_add(fl, x->locs, x->n);
			continue;
		}
		kvs_freelist_add(fl, e->locs, e->n_locs);
		kvs_nvme_account_locked(s, e, -1);
		free(e->locs);
		e->locs = x->locs;
		x->locs = NULL;
		e->n_locs = x->n;
		e->nvme_version = x->op->version;
		e->nvme_len = x->val->len;
		e->nvme_sum = x->sum;
		kvs_nvme_account_locked(s, e, +1);
	}
}

/* The ops of a batch are done: counts, refs, tickets. Under mu. */
static void retire_locked(kvt_kvs *s, kvs_op **ops, size_t n, kvs_w *w, bool failed)
{
	for (size_t i = 0, j = 0; i < n; i++) {
		kvs_op *o = ops[i];
		if (o->kind == KVS_OP_SET) {
			kvs_w *x = &w[j++];
			kvt_kvs_val_unref(x->val);
			free(x->locs);
		}
		o->e->pending--;
		kvs_ent_unref_locked(s, o->e);
	}
	if (failed) {
		s->fail_lo = ops[0]->ticket;
		s->fail_hi = ops[n - 1]->ticket;
		s->write_errors++;
	}
	s->acked = ops[n - 1]->ticket;
	s->q_len -= n;
	for (size_t i = 0; i < n; i++)
		free(ops[i]);
	pthread_cond_broadcast(&s->cv_ack);
}

static void process_batch(kvt_kvs *s, kvs_op **ops, size_t n, size_t n_set, const uint64_t *set_bytes)
{
	kvs_w *w = calloc(n_set ? n_set : 1, sizeof(*w));
	kvt_t2_stats st;
	kvt_t2_get_stats(s->t2, &st);
	pthread_mutex_lock(&s->mu);
	uint64_t need = 0;
	for (size_t i = 0, j = 0; w && i < n; i++)
		if (ops[i]->kind == KVS_OP_SET) {
			prepare_w_locked(s, ops[i], &w[j], st.capacity_bytes);
			need += w[j].val ? value_extents(w[j].val->len) : 0;
			j++;
		}
	pthread_mutex_unlock(&s->mu);
	int rc = KVT_ENOMEM;
	kvs_freelist fl = { 0 };
	if (w) {
		make_room(s, need);
		write_values(s, w, n_set);
		rc = commit_rows(s, ops, n, w);
	}
	pthread_mutex_lock(&s->mu);
	if (w)
		install_locked(s, ops, n, w, rc == KVT_OK, &fl);
	s->pending_bytes -= *set_bytes;
	retire_locked(s, ops, n, w, rc != KVT_OK);
	pthread_mutex_unlock(&s->mu);
	kvs_free_extents(s, &fl);
	free(w);
}

/* Under mu: values past their expiry leave (their rows by a queued DEL). */
static void sweep_locked(kvt_kvs *s)
{
	uint64_t now = kvs_wall_ms();
	for (kvs_ent *e = s->lru_tail; e;) {
		kvs_ent *prev = e->lprev;
		if (e->expires_ms && e->expires_ms <= now) {
			s->ten[e->tenant].expired++;
			if (e->n_locs)
				kvs_queue_locked(s, KVS_OP_DEL, e);
			kvs_unlink_locked(s, e);
		}
		e = prev;
	}
	s->next_sweep = kvs_mono() + 1.0;
}

/* Under mu: wait for work; false when stopping with nothing left. */
static bool wait_work_locked(kvt_kvs *s)
{
	while (!s->q_head && !s->stopping) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&s->cv_work, &s->mu, &ts);
		if (kvs_mono() >= s->next_sweep)
			sweep_locked(s);
	}
	return s->q_head != NULL;
}

/* Under mu: take the next batch off the queue. */
static size_t take_batch_locked(kvt_kvs *s, kvs_op **ops, size_t *n_set, uint64_t *set_bytes)
{
	size_t n = 0;
	*n_set = 0;
	*set_bytes = 0;
	while (s->q_head && n < BATCH_OPS && (n == 0 || *set_bytes < BATCH_BYTES)) {
		kvs_op *o = s->q_head;
		s->q_head = o->next;
		if (!s->q_head)
			s->q_tail = NULL;
		o->next = NULL;
		if (o->kind == KVS_OP_SET) {
			(*n_set)++;
			*set_bytes += o->bytes;
		}
		ops[n++] = o;
	}
	return n;
}

static void *writer_main(void *arg)
{
	kvt_kvs *s = arg;
	kvs_op *ops[BATCH_OPS];
	pthread_mutex_lock(&s->mu);
	while (wait_work_locked(s)) {
		size_t n_set;
		uint64_t set_bytes;
		size_t n = take_batch_locked(s, ops, &n_set, &set_bytes);
		pthread_mutex_unlock(&s->mu);
		process_batch(s, ops, n, n_set, &set_bytes);
		pthread_mutex_lock(&s->mu);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

int kvs_writer_start(kvt_kvs *s)
{
	s->next_sweep = kvs_mono() + 1.0;
	if (pthread_create(&s->writer, NULL, writer_main, s)) {
		KVT_LOGE("store: cannot start the writer thread");
		return KVT_ENOMEM;
	}
	s->writer_on = true;
	return KVT_OK;
}

void kvs_writer_stop(kvt_kvs *s)
{
	pthread_mutex_lock(&s->mu);
	s->stopping = true;
	pthread_cond_broadcast(&s->cv_work);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->writer, NULL);
	s->writer_on = false;
}
