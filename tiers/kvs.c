/*
 * tiers/kvs.c — the key-value store (kvstore.h): the map of entries, the LRU
 * list, RAM copies and their budget, the tenants' figures, and the calls the
 * listener makes. NVMe writes, eviction from NVMe and the write order are the
 * writer's (kvs_writer.c); rows are kvs_sql.c's. Locking: kvs_int.h.
 */
#include "kvs_int.h"

#include "blake3.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <xxhash.h>

#define KVS_READ_NVME 1 /* get_locked: the value is on NVMe only: read it */

void kvt_kvs_config_default(kvt_kvs_config *c)
{
	memset(c, 0, sizeof(*c));
	c->ram_bytes = 256ull << 20;
	c->max_value_bytes = KVT_KVS_MAX_VALUE_DEFAULT;
	c->durable = true;
	c->exists_lease_s = 5.0;
	c->io_mode = KVT_T2_IO_AUTO;
}

double kvs_mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t kvs_wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- values ---- */

kvt_kvs_val *kvt_kvs_val_new(size_t cap)
{
	kvt_kvs_val *v = calloc(1, sizeof(*v));
	if (!v)
		return NULL;
	v->data = malloc(cap ? cap : 1);
	if (!v->data) {
		free(v);
		return NULL;
	}
	v->cap = cap;
	v->refs = 1;
	return v;
}

int kvt_kvs_val_reserve(kvt_kvs_val *v, size_t cap)
{
	if (cap <= v->cap)
		return KVT_OK;
	uint8_t *d = realloc(v->data, cap);
	if (!d)
		return KVT_ENOMEM;
	v->data = d;
	v->cap = cap;
	return KVT_OK;
}

void kvt_kvs_val_ref(kvt_kvs_val *v)
{
	atomic_fetch_add_explicit((_Atomic int *)&v->refs, 1, memory_order_relaxed);
}

void kvt_kvs_val_unref(kvt_kvs_val *v)
{
	if (!v || atomic_fetch_sub_explicit((_Atomic int *)&v->refs, 1, memory_order_acq_rel) != 1)
		return;
	free(v->data);
	free(v);
}

/* ---- names ---- */

void kvs_id(const char *ns, const void *key, size_t klen, uint8_t out[32])
{
	size_t nl = strlen(ns);
	uint8_t *b = malloc(nl + 1 + klen);
	if (!b) { /* a fixed-size fallback: hash the two parts' hashes */
		uint8_t h[64];
		kvt_blake3(ns, nl, h);
		kvt_blake3(key, klen, h + 32);
		kvt_blake3(h, sizeof(h), out);
		return;
	}
	memcpy(b, ns, nl);
	b[nl] = 0;
	memcpy(b + nl + 1, key, klen);
	kvt_blake3(b, nl + 1 + klen, out);
	free(b);
}

void kvs_chunk_hash(const uint8_t id[32], uint64_t version, uint32_t idx, uint8_t out[32])
{
	uint8_t b[32 + 8 + 4];
	memcpy(b, id, 32);
	for (int i = 0; i < 8; i++)
		b[32 + i] = (uint8_t)(version >> (8 * i));
	for (int i = 0; i < 4; i++)
		b[40 + i] = (uint8_t)(idx >> (8 * i));
	kvt_blake3(b, sizeof(b), out);
}

uint32_t kvs_n_chunks(uint64_t len)
{
	return (uint32_t)((len + KVT_KVS_CHUNK_BYTES - 1) / KVT_KVS_CHUNK_BYTES);
}

/* ---- tenants ---- */

/* The namespace's tenant row, or -1. */
static int tenant_find_locked(const kvt_kvs *s, const char *ns)
{
	for (uint32_t i = 0; i < s->n_ten; i++)
		if (!strcmp(s->ten[i].ns, ns))
			return (int)i;
	return -1;
}

/* The namespace's row, added if new; -1 when KVT_KVS_MAX_TENANTS namespaces exist (the row is the key's namespace). */
int kvs_tenant_find_or_add_locked(kvt_kvs *s, const char *ns)
{
	int t = tenant_find_locked(s, ns);
	if (t >= 0 || s->n_ten == KVT_KVS_MAX_TENANTS)
		return t;
	snprintf(s->ten[s->n_ten].ns, sizeof(s->ten[0].ns), "%s", ns);
	return (int)s->n_ten++;
}

static bool ns_ok(const char *ns)
{
	size_t n = ns ? strlen(ns) : 0;
	return n >= 1 && n <= KVT_KVS_NS_MAX;
}

/* ---- the map and the LRU list ---- */

static uint64_t key_hash(uint16_t tenant, const void *key, size_t klen)
{
	return XXH3_64bits_withSeed(key, klen, 0x6b76734b56ull ^ tenant);
}

static void lru_unlink(kvt_kvs *s, kvs_ent *e)
{
	if (e->lprev)
		e->lprev->lnext = e->lnext;
	else
		s->lru_head = e->lnext;
	if (e->lnext)
		e->lnext->lprev = e->lprev;
	else
		s->lru_tail = e->lprev;
	e->lprev = e->lnext = NULL;
}

static void lru_push_head(kvt_kvs *s, kvs_ent *e)
{
	e->lprev = NULL;
	e->lnext = s->lru_head;
	if (s->lru_head)
		s->lru_head->lprev = e;
	s->lru_head = e;
	if (!s->lru_tail)
		s->lru_tail = e;
}

static void lru_touch(kvt_kvs *s, kvs_ent *e)
{
	if (s->lru_head == e)
		return;
	lru_unlink(s, e);
	lru_push_head(s, e);
}

static int map_grow(kvt_kvs *s)
{
	size_t nb = s->n_buckets ? s->n_buckets * 2 : 1024;
	kvs_ent **b = calloc(nb, sizeof(*b));
	if (!b)
		return KVT_ENOMEM;
	for (size_t i = 0; i < s->n_buckets; i++) {
		kvs_ent *e = s->buckets[i];
		while (e) {
			kvs_ent *n = e->hnext;
			e->hnext = b[e->hv & (nb - 1)];
			b[e->hv & (nb - 1)] = e;
			e = n;
		}
	}
	free(s->buckets);
	s->buckets = b;
	s->n_buckets = nb;
	return KVT_OK;
}

static kvs_ent *map_find(kvt_kvs *s, uint16_t tenant, const void *key, size_t klen, uint64_t hv)
{
	if (!s->n_buckets)
		return NULL;
	for (kvs_ent *e = s->buckets[hv & (s->n_buckets - 1)]; e; e = e->hnext)
		if (e->hv == hv && e->tenant == tenant && e->klen == klen && !memcmp(e->key, key, klen))
			return e;
	return NULL;
}

static void map_remove(kvt_kvs *s, kvs_ent *e)
{
	kvs_ent **pp = &s->buckets[e->hv & (s->n_buckets - 1)];
	while (*pp && *pp != e)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = e->hnext;
	e->hnext = NULL;
	s->n_ents--;
}

void kvs_nvme_account_locked(kvt_kvs *s, kvs_ent *e, int sign)
{
	if (!e->n_locs || e->dead)
		return;
	kvt_kvs_tenant_stats *t = &s->ten[e->tenant];
	if (sign > 0)
		t->nvme_bytes += e->nvme_len;
	else
		t->nvme_bytes -= e->nvme_len;
}

static void drop_ram_locked(kvt_kvs *s, kvs_ent *e)
{
	if (!e->ram)
		return;
	s->ram_used -= e->ram->len;
	if (!e->dead)
		s->ten[e->tenant].ram_bytes -= e->ram->len;
	kvt_kvs_val_unref(e->ram);
	e->ram = NULL;
}

void kvs_unlink_locked(kvt_kvs *s, kvs_ent *e)
{
	if (e->dead)
		return;
	drop_ram_locked(s, e);
	kvs_nvme_account_locked(s, e, -1);
	kvt_kvs_tenant_stats *t = &s->ten[e->tenant];
	t->keys--;
	t->bytes -= e->len;
	map_remove(s, e);
	lru_unlink(s, e);
	e->dead = true;
	kvs_ent_unref_locked(s, e); /* the map's */
}

void kvs_ent_unref_locked(kvt_kvs *s, kvs_ent *e)
{
	if (--e->refs > 0)
		return;
	(void)s;
	kvt_kvs_val_unref(e->ram);
	free(e->locs);
	free(e->key);
	free(e);
}

static kvs_ent *ent_new(kvt_kvs *s, uint16_t tenant, const void *key, size_t klen, uint64_t hv, const char *ns)
{
	if (s->n_ents + 1 > s->n_buckets && map_grow(s))
		return NULL;
	kvs_ent *e = calloc(1, sizeof(*e));
	if (!e || !(e->key = malloc(klen))) {
		free(e);
		return NULL;
	}
	memcpy(e->key, key, klen);
	e->klen = (uint32_t)klen;
	e->tenant = tenant;
	e->hv = hv;
	e->refs = 1;
	kvs_id(ns, key, klen, e->id);
	size_t b = hv & (s->n_buckets - 1);
	e->hnext = s->buckets[b];
	s->buckets[b] = e;
	s->n_ents++;
	lru_push_head(s, e);
	s->ten[tenant].keys++;
	return e;
}

/* Make room in RAM for need bytes: RAM copies leave, least recently used first. */
static void ram_make_room_locked(kvt_kvs *s, uint64_t need, const kvs_ent *keep)
{
	kvs_ent *e = s->lru_tail;
	while (e && s->ram_used + need > s->cfg.ram_bytes) {
		kvs_ent *prev = e->lprev;
		if (e != keep && e->ram && !e->pending) {
			kvt_kvs_tenant_stats *t = &s->ten[e->tenant];
			if (e->n_locs && e->nvme_version == e->version) {
				drop_ram_locked(s, e);
				t->evicted_ram++;
			} else if (!s->t2 || e->too_big) { /* RAM is its only home: the value goes */
				t->evicted++;
				kvs_unlink_locked(s, e);
			}
		}
		e = prev;
	}
}

int kvs_insert_loaded(kvt_kvs *s, const char *ns, const uint8_t *key, uint32_t klen, uint64_t version, uint64_t len,
		      uint64_t sum, uint64_t expires_ms, kvt_t2_loc *locs, uint32_t n_locs)
{
	int t = kvs_tenant_find_or_add_locked(s, ns);
	if (t < 0)
		return KVT_EFULL;
	uint64_t hv = key_hash((uint16_t)t, key, klen);
	if (map_find(s, (uint16_t)t, key, klen, hv))
		return KVT_EINVAL;
	kvs_ent *e = ent_new(s, (uint16_t)t, key, klen, hv, ns);
	if (!e)
		return KVT_ENOMEM;
	e->version = e->nvme_version = version;
	e->len = e->nvme_len = len;
	e->nvme_sum = sum;
	e->expires_ms = expires_ms;
	e->locs = locs;
	e->n_locs = n_locs;
	s->ten[t].bytes += len;
	kvs_nvme_account_locked(s, e, +1);
	if (version >= s->next_version)
		s->next_version = version + 1;
	return KVT_OK;
}

/* The live entry for (ns, key), or NULL (an expired one is dropped here). */
static kvs_ent *lookup_locked(kvt_kvs *s, const char *ns, const void *key, size_t klen)
{
	int t = tenant_find_locked(s, ns);
	if (t < 0)
		return NULL;
	kvs_ent *e = map_find(s, (uint16_t)t, key, klen, key_hash((uint16_t)t, key, klen));
	if (e && e->expires_ms && e->expires_ms <= kvs_wall_ms()) {
		s->ten[e->tenant].expired++;
		if (e->n_locs && s->t2)
			kvs_queue_locked(s, KVS_OP_DEL, e);
		kvs_unlink_locked(s, e);
		return NULL;
	}
	return e;
}

static bool args_ok(const kvt_kvs *s, const char *ns, size_t klen)
{
	(void)s;
	return ns_ok(ns) && klen >= 1 && klen <= KVT_KVS_KEY_MAX;
}

/* ---- the API ---- */

static kvs_ent *set_entry_locked(kvt_kvs *s, const char *ns, const void *key, size_t klen)
{
	int t = kvs_tenant_find_or_add_locked(s, ns);
	if (t < 0)
		return NULL;
	uint64_t hv = key_hash((uint16_t)t, key, klen);
	kvs_ent *e = map_find(s, (uint16_t)t, key, klen, hv);
	if (e) {
		drop_ram_locked(s, e);
		s->ten[t].bytes -= e->len;
		e->too_big = false;
		lru_touch(s, e);
		return e;
	}
	return ent_new(s, (uint16_t)t, key, klen, hv, ns);
}

/* Not durable: hold the caller while the writer is a RAM budget behind. */
static void backpressure_locked(kvt_kvs *s)
{
	while (!s->cfg.durable && s->t2 && !s->stopping && s->pending_bytes > s->cfg.ram_bytes)
		pthread_cond_wait(&s->cv_ack, &s->mu);
}

int kvt_kvs_set(kvt_kvs *s, const char *ns, const void *key, size_t klen, kvt_kvs_val *v, uint64_t ttl_ms,
		kvt_kvs_ticket *ticket)
{
	if (ticket)
		*ticket = 0;
	if (!args_ok(s, ns, klen) || v->len > s->cfg.max_value_bytes) {
		kvt_kvs_val_unref(v);
		return KVT_EINVAL;
	}
	pthread_mutex_lock(&s->mu);
	backpressure_locked(s);
	if (s->stopping) {
		pthread_mutex_unlock(&s->mu);
		kvt_kvs_val_unref(v);
		return KVT_ESTOPPED;
	}
	kvs_ent *e = set_entry_locked(s, ns, key, klen);
	if (!e) {
		const int rc = tenant_find_locked(s, ns) < 0 ? KVT_EFULL : KVT_ENOMEM; /* a new namespace past the limit */
		pthread_mutex_unlock(&s->mu);
		kvt_kvs_val_unref(v);
		return rc;
	}
	ram_make_room_locked(s, v->len, e);
	e->version = s->next_version++;
	e->len = v->len;
	e->ram = v;
	e->expires_ms = ttl_ms ? kvs_wall_ms() + ttl_ms : 0;
	s->ram_used += v->len;
	kvt_kvs_tenant_stats *t = &s->ten[e->tenant];
	t->bytes += v->len;
	t->ram_bytes += v->len;
	t->sets++;
	kvt_kvs_ticket tk = 0;
	if (s->t2) {
		s->pending_bytes += v->len;
		tk = kvs_queue_locked(s, KVS_OP_SET, e);
	}
	pthread_mutex_unlock(&s->mu);
	if (ticket && s->cfg.durable)
		*ticket = tk;
	return KVT_OK;
}

int kvt_kvs_wait(kvt_kvs *s, kvt_kvs_ticket ticket)
{
	if (!ticket)
		return KVT_OK;
	pthread_mutex_lock(&s->mu);
	while (s->acked < ticket)
		pthread_cond_wait(&s->cv_ack, &s->mu);
	int rc = ticket >= s->fail_lo && ticket <= s->fail_hi ? KVT_EIO : KVT_OK;
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int kvt_kvs_exists(kvt_kvs *s, const char *ns, const void *key, size_t klen)
{
	if (!args_ok(s, ns, klen))
		return 0;
	pthread_mutex_lock(&s->mu);
	kvs_ent *e = lookup_locked(s, ns, key, klen);
	if (e) {
		lru_touch(s, e);
		e->lease_until = kvs_mono() + s->cfg.exists_lease_s;
	}
	pthread_mutex_unlock(&s->mu);
	return e ? 1 : 0;
}

int kvt_kvs_del(kvt_kvs *s, const char *ns, const void *key, size_t klen, kvt_kvs_ticket *ticket)
{
	if (ticket)
		*ticket = 0;
	if (!args_ok(s, ns, klen))
		return 0;
	pthread_mutex_lock(&s->mu);
	kvs_ent *e = lookup_locked(s, ns, key, klen);
	kvt_kvs_ticket tk = 0;
	if (e) {
		s->ten[e->tenant].dels++;
		if (s->t2)
			tk = kvs_queue_locked(s, KVS_OP_DEL, e);
		kvs_unlink_locked(s, e);
	}
	pthread_mutex_unlock(&s->mu);
	if (ticket && s->cfg.durable)
		*ticket = tk;
	return e ? 1 : 0;
}

/* The NVMe copy of e as it is now (under free_lock shared, then mu). */
typedef struct nvme_snap {
	kvt_t2_loc *locs;
	uint32_t n;
	uint64_t version, len, sum;
	uint8_t id[32];
} nvme_snap;

static int read_nvme(kvt_kvs *s, const nvme_snap *sn, kvt_kvs_val **out);

/* Under mu: a RAM hit (*out), a miss, or the NVMe copy to read (*sn, locs malloc'd). */
static int get_locked(kvt_kvs *s, const char *ns, const void *key, size_t klen, kvt_kvs_val **out, nvme_snap *sn,
		      kvs_ent **ep)
{
	kvs_ent *e = lookup_locked(s, ns, key, klen);
	if (!e)
		return KVT_ENOTFOUND;
	lru_touch(s, e);
	if (e->ram) {
		kvt_kvs_val_ref(e->ram);
		*out = e->ram;
		s->ten[e->tenant].hits_ram++;
		return KVT_OK;
	}
	if (!e->n_locs || e->nvme_version != e->version)
		return KVT_ENOTFOUND;
	sn->locs = malloc(e->n_locs * sizeof(*sn->locs));
	if (!sn->locs)
		return KVT_ENOMEM;
	memcpy(sn->locs, e->locs, e->n_locs * sizeof(*sn->locs));
	sn->n = e->n_locs;
	sn->version = e->version;
	sn->len = e->len;
	sn->sum = e->nvme_sum;
	memcpy(sn->id, e->id, 32);
	e->refs++;
	*ep = e;
	return KVS_READ_NVME;
}

/* After a read from NVMe: count it, keep the value in RAM if it is still current, or drop a bad copy. */
static void after_read_locked(kvt_kvs *s, kvs_ent *e, const nvme_snap *sn, int rc, kvt_kvs_val *v)
{
	kvt_kvs_tenant_stats *t = &s->ten[e->tenant];
	if (rc == KVT_OK) {
		t->hits_nvme++;
		if (!e->dead && e->version == sn->version && !e->ram && v->len <= s->cfg.ram_bytes / 4) {
			ram_make_room_locked(s, v->len, e);
			kvt_kvs_val_ref(v);
			e->ram = v;
			s->ram_used += v->len;
			t->ram_bytes += v->len;
		}
	} else {
		t->misses++;
		if (rc == KVT_ECORRUPT) {
			s->corrupt++;
			if (!e->dead && e->version == sn->version) {
				kvs_queue_locked(s, KVS_OP_DEL, e);
				kvs_unlink_locked(s, e);
			}
		}
	}
	kvs_ent_unref_locked(s, e);
}

int kvt_kvs_get(kvt_kvs *s, const char *ns, const void *key, size_t klen, kvt_kvs_val **out)
{
	*out = NULL;
	if (!args_ok(s, ns, klen))
		return KVT_ENOTFOUND;
	nvme_snap sn = { 0 };
	kvs_ent *e = NULL;
	pthread_rwlock_rdlock(&s->free_lock);
	pthread_mutex_lock(&s->mu);
	int rc = get_locked(s, ns, key, klen, out, &sn, &e);
	if (rc == KVT_ENOTFOUND) {
		int t = kvs_tenant_find_or_add_locked(s, ns);
		if (t >= 0)
			s->ten[t].misses++;
	}
	pthread_mutex_unlock(&s->mu);
	if (rc != KVS_READ_NVME) {
		pthread_rwlock_unlock(&s->free_lock);
		return rc == KVT_ENOMEM ? KVT_EIO : rc;
	}
	kvt_kvs_val *v = NULL;
	rc = read_nvme(s, &sn, &v);
	pthread_rwlock_unlock(&s->free_lock);
	free(sn.locs);
	pthread_mutex_lock(&s->mu);
	after_read_locked(s, e, &sn, rc, v);
	pthread_mutex_unlock(&s->mu);
	if (rc != KVT_OK) {
		kvt_kvs_val_unref(v);
		return rc == KVT_ECORRUPT ? KVT_ENOTFOUND : rc;
	}
	*out = v;
	return KVT_OK;
}

/* Read a value's chunks (all of them, verified) and its whole checksum. */
static int read_nvme(kvt_kvs *s, const nvme_snap *sn, kvt_kvs_val **out)
{
	uint32_t n = sn->n;
	kvt_kvs_val *v = kvt_kvs_val_new((size_t)n * KVT_KVS_CHUNK_BYTES);
	uint8_t(*hashes)[32] = malloc(n * sizeof(*hashes));
	void **payloads = malloc(n * sizeof(*payloads));
	int *res = malloc(n * sizeof(*res));
	kvt_t2_block_meta *metas = malloc(n * sizeof(*metas));
	int rc = KVT_ENOMEM;
	if (v && hashes && payloads && res && metas) {
		for (uint32_t i = 0; i < n; i++) {
			kvs_chunk_hash(sn->id, sn->version, i, hashes[i]);
			payloads[i] = v->data + (size_t)i * KVT_KVS_CHUNK_BYTES;
		}
		rc = s->rs.ops->get(&s->rs, n, (const uint8_t(*)[32])hashes, sn->locs, true, metas, payloads,
				     KVT_KVS_CHUNK_BYTES, res);
		uint64_t got = 0;
		for (uint32_t i = 0; rc == KVT_OK && i < n; i++) {
			if (metas[i].raw_bytes != (i + 1 < n ? KVT_KVS_CHUNK_BYTES : sn->len - got))
				rc = KVT_ECORRUPT;
			got += metas[i].raw_bytes;
		}
		if (rc == KVT_OK && (got != sn->len || XXH3_64bits(v->data, sn->len) != sn->sum))
			rc = KVT_ECORRUPT;
		if (rc == KVT_ENOTFOUND) /* an extent not in use under a committed row: the copy is gone */
			rc = KVT_ECORRUPT;
	}
	free(hashes);
	free(payloads);
	free(res);
	free(metas);
	if (rc == KVT_OK) {
		v->len = sn->len;
		*out = v;
	} else {
		kvt_kvs_val_unref(v);
	}
	return rc;
}

static void sum_into(kvt_kvs_tenant_stats *a, const kvt_kvs_tenant_stats *b)
{
	a->keys += b->keys;
	a->bytes += b->bytes;
	a->ram_bytes += b->ram_bytes;
	a->nvme_bytes += b->nvme_bytes;
	a->hits_ram += b->hits_ram;
	a->hits_nvme += b->hits_nvme;
	a->misses += b->misses;
	a->sets += b->sets;
	a->dels += b->dels;
	a->evicted_ram += b->evicted_ram;
	a->evicted += b->evicted;
	a->expired += b->expired;
}

void kvt_kvs_stats_get(kvt_kvs *s, kvt_kvs_stats *st)
{
	memset(st, 0, sizeof(*st));
	kvt_t2_stats t2 = { 0 };
	if (s->t2)
		kvt_t2_get_stats(s->t2, &t2);
	pthread_mutex_lock(&s->mu);
	snprintf(st->total.ns, sizeof(st->total.ns), "*");
	st->n_tenants = s->n_ten;
	for (uint32_t i = 0; i < s->n_ten; i++) {
		st->tenant[i] = s->ten[i];
		sum_into(&st->total, &s->ten[i]);
	}
	st->ram_capacity = s->cfg.ram_bytes;
	st->nvme_capacity = t2.capacity_bytes;
	st->nvme_used = t2.used_bytes;
	st->writes_pending = s->q_len;
	st->write_errors = s->write_errors;
	st->corrupt = s->corrupt;
	st->recovered = s->recovered;
	st->dropped_at_open = s->dropped_at_open;
	pthread_mutex_unlock(&s->mu);
}

/* ---- open and close ---- */

static int open_t2(kvt_kvs *s)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/store.t2", s->dir);
	struct stat sb;
	bool exists = stat(path, &sb) == 0;
	if (!s->cfg.nvme_bytes && !exists)
		return KVT_OK; /* RAM only */
	kvt_t2_config tc = { 0 };
	tc.path = path;
	tc.capacity_bytes = exists ? 0 : s->cfg.nvme_bytes;
	tc.io_mode = s->cfg.io_mode;
	tc.io = s->cfg.io;
	tc.max_raw_bytes = KVT_KVS_CHUNK_BYTES;
	tc.staging_cap_bytes = 24ull << 20;
	tc.n_io_ctx = 2;
	kvt_blake3("kvtier key-value store, format 1", 32, tc.model_fp);
	int rc = kvt_t2_open(&tc, &s->t2);
	if (rc) {
		KVT_LOGE("store: %s: cannot open the store's NVMe file (%s)", path, kvt_strerror(rc));
		return rc;
	}
	kvt_rstore_t2_init(&s->rs, s->t2);
	return KVT_OK;
}

static int open_check(const kvt_kvs_config *cfg)
{
	if (!cfg->dir || !cfg->dir[0] || cfg->ram_bytes < (1u << 20) || cfg->exists_lease_s < 0 ||
	    cfg->exists_lease_s > 3600) {
		KVT_LOGE("store: bad config (dir %s, ram_bytes %llu of at least 1 MiB, exists_lease %.1f s of 0..3600)",
			 cfg->dir ? cfg->dir : "(none)", (unsigned long long)cfg->ram_bytes, cfg->exists_lease_s);
		return KVT_EINVAL;
	}
	if (mkdir(cfg->dir, 0700) && errno != EEXIST) {
		KVT_LOGE("store: %s: cannot create the directory: %s", cfg->dir, strerror(errno));
		return KVT_EIO;
	}
	return KVT_OK;
}

static void init_sync(kvt_kvs *s)
{
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv_ack, NULL);
	pthread_cond_init(&s->cv_work, NULL);
	pthread_rwlock_init(&s->free_lock, NULL);
	s->next_version = 1;
}

int kvt_kvs_open(const kvt_kvs_config *cfg, kvt_kvs **out)
{
	*out = NULL;
	int rc = open_check(cfg);
	if (rc)
		return rc;
	kvt_kvs *s = calloc(1, sizeof(*s));
	if (!s || !(s->dir = strdup(cfg->dir))) {
		free(s);
		return KVT_ENOMEM;
	}
	s->cfg = *cfg;
	s->cfg.dir = s->dir;
	if (!s->cfg.max_value_bytes)
		s->cfg.max_value_bytes = KVT_KVS_MAX_VALUE_DEFAULT;
	init_sync(s);
	char path[4200];
	snprintf(path, sizeof(path), "%s/store.sqlite", s->dir);
	if ((rc = open_t2(s)) || (s->t2 && ((rc = kvs_sql_open(s, path)) || (rc = kvs_sql_load(s)))) ||
	    (s->t2 && (rc = kvs_writer_start(s)))) {
		kvt_kvs_close(s);
		return rc;
	}
	KVT_LOGI("store: %s: %llu value(s) on NVMe (%u dropped), RAM %llu MiB, NVMe %s", s->dir,
		 (unsigned long long)s->recovered, (unsigned)s->dropped_at_open,
		 (unsigned long long)(s->cfg.ram_bytes >> 20), s->t2 ? kvt_t2_file_path(s->t2) : "off");
	*out = s;
	return KVT_OK;
}

void kvt_kvs_close(kvt_kvs *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stopping = true;
	pthread_cond_broadcast(&s->cv_ack);
	pthread_mutex_unlock(&s->mu);
	if (s->writer_on)
		kvs_writer_stop(s);
	kvs_sql_close(s);
	kvt_t2_close(s->t2);
	while (s->lru_head)
		kvs_unlink_locked(s, s->lru_head);
	free(s->buckets);
	pthread_rwlock_destroy(&s->free_lock);
	pthread_cond_destroy(&s->cv_work);
	pthread_cond_destroy(&s->cv_ack);
	pthread_mutex_destroy(&s->mu);
	free(s->dir);
	free(s);
}
