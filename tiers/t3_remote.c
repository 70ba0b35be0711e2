/*
 * tiers/t3_remote.c — T3, the remote tier (contract in t3_remote.h): block
 * records and session records over the cluster client, a client pool, the
 * counters.
 *
 * Design: a block's value is the T2 record (t2_record.c) sealed for offset 0
 * and generation KVT_T3_GENERATION, cut after its stored payload (the T2
 * extent's zero padding is not sent; a read pads it back before verifying).
 * The same code that verifies an NVMe record verifies a remote one, so the
 * checks are the same: magic, version, lengths against the bytes received,
 * XXH3 over header and payload, the model fingerprint, the expected block
 * hash. The key is the block hash (which already carries the tenant salt and
 * the model), so two tenants or two models never share a key, and a record
 * put under another key fails the hash check.
 *
 * Invariants: a record that fails verification is never handed out (a miss,
 * counted); no call waits longer than the command timeout per round (the
 * client's deadline); the password is only in the clients.
 */
#include "t2_int.h"
#include "t3_remote.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#define T3_MAX_CLIENTS 8u
#define T3_DEGRADED_S 2.0
#define T3_SES_MAGIC "KVT3SES1"

const double kvt_t3_lat_bounds[KVT_T3_LAT_BUCKETS] = { 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025,
						       0.05, 0.1, 0.25, 0.5, 1.0, 1e300 };

struct kvt_t3 {
	kvt_t3_config cfg;            /* copy; strings below are ours */
	char *seeds, *user, *password, *prefix;
	uint8_t model_fp[KVT_HASH_BYTES];
	pthread_mutex_t mu;           /* the pool and the counters */
	pthread_cond_t cv;            /* a client came back */
	kvt_rc *idle[T3_MAX_CLIENTS]; /* clients not in use */
	uint32_t n_idle, n_clients;   /* idle ones, all created */
	double fail_t;                /* the last failed command (kvt_now_s; 0 none) */
	kvt_t3_stats st;
};

void kvt_t3_config_default(kvt_t3_config *c)
{
	memset(c, 0, sizeof(*c));
	c->rc.cluster = true;
	c->rc.connect_timeout_ms = 200;
	c->rc.command_timeout_ms = 500;
	c->rc.pipeline_depth = 64;
	c->prefix = "kvt:";
	c->write_policy = KVT_T3_WRITE_THROUGH;
}

static char *dup_or_null(const char *s, bool *oom)
{
	if (!s)
		return NULL;
	char *d = strdup(s);
	if (!d)
		*oom = true;
	return d;
}

int kvt_t3_create(const kvt_t3_config *cfg, const uint8_t model_fp[KVT_HASH_BYTES], kvt_t3 **out)
{
	if (!cfg->rc.seeds || !cfg->rc.seeds[0]) {
		KVT_LOGE("tier.remote: seeds is empty");
		return KVT_EINVAL;
	}
	if (cfg->write_policy != KVT_T3_WRITE_THROUGH && cfg->write_policy != KVT_T3_ON_DEMOTE) {
		KVT_LOGE("tier.remote: write_policy %d is not write_through or on_demote", cfg->write_policy);
		return KVT_EINVAL;
	}
	if (!cfg->rc.pipeline_depth || !cfg->rc.command_timeout_ms || !cfg->rc.connect_timeout_ms) {
		KVT_LOGE("tier.remote: pipeline_depth, connect_timeout and command_timeout must be > 0");
		return KVT_EINVAL;
	}
	kvt_t3 *t = calloc(1, sizeof(*t));
	if (!t)
		return KVT_ENOMEM;
	bool oom = false;
	t->cfg = *cfg;
	t->seeds = dup_or_null(cfg->rc.seeds, &oom);
	t->user = dup_or_null(cfg->rc.user, &oom);
	t->password = dup_or_null(cfg->rc.password, &oom);
	t->prefix = dup_or_null(cfg->prefix ? cfg->prefix : "kvt:", &oom);
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	if (oom) {
		kvt_t3_destroy(t);
		return KVT_ENOMEM;
	}
	t->cfg.rc.seeds = t->seeds;
	t->cfg.rc.user = t->user;
	t->cfg.rc.password = t->password;
	t->cfg.prefix = t->prefix;
	memcpy(t->model_fp, model_fp, KVT_HASH_BYTES);
	/* One client up front: a malformed seed list is an error now, not at the first request. */
	kvt_rc *c;
	int rc = kvt_rc_create(&t->cfg.rc, &c);
	if (rc) {
		kvt_t3_destroy(t);
		return rc;
	}
	t->idle[t->n_idle++] = c;
	t->n_clients = 1;
	*out = t;
	return KVT_OK;
}

void kvt_t3_destroy(kvt_t3 *t)
{
	if (!t)
		return;
	KVT_ASSERT(t->n_idle == t->n_clients); /* no call in flight */
	for (uint32_t i = 0; i < t->n_idle; i++)
		kvt_rc_destroy(t->idle[i]);
	free(t->seeds);
	free(t->user);
	if (t->password) {
		volatile char *v = t->password;
		while (*v)
			*v++ = 0;
	}
	free(t->password);
	free(t->prefix);
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->cv);
	free(t);
}

int kvt_t3_write_policy(const kvt_t3 *t) { return t->cfg.write_policy; }

static kvt_rc *acquire(kvt_t3 *t)
{
	pthread_mutex_lock(&t->mu);
	for (;;) {
		if (t->n_idle) {
			kvt_rc *c = t->idle[--t->n_idle];
			pthread_mutex_unlock(&t->mu);
			return c;
		}
		if (t->n_clients < T3_MAX_CLIENTS)
			break;
		pthread_cond_wait(&t->cv, &t->mu);
	}
	t->n_clients++;
	pthread_mutex_unlock(&t->mu);
	kvt_rc *c = NULL;
	if (kvt_rc_create(&t->cfg.rc, &c) != KVT_OK) {
		pthread_mutex_lock(&t->mu);
		t->n_clients--;
		pthread_cond_signal(&t->cv);
		pthread_mutex_unlock(&t->mu);
		return NULL;
	}
	return c;
}

static void release(kvt_t3 *t, kvt_rc *c)
{
	pthread_mutex_lock(&t->mu);
	t->idle[t->n_idle++] = c;
	pthread_cond_signal(&t->cv);
	pthread_mutex_unlock(&t->mu);
}

/* Run a round and count it: latency, errors. Writes get at least KVT_T3_WRITE_MIN_MS. */
static int run_round(kvt_t3 *t, kvt_rc_op *ops, uint32_t n, bool write)
{
	kvt_rc *c = acquire(t);
	if (!c) {
		for (uint32_t i = 0; i < n; i++)
			ops[i].rc = KVT_ENOMEM;
		return KVT_ENOMEM;
	}
	double t0 = kvt_now_s();
	uint32_t ms = t->cfg.rc.command_timeout_ms;
	if (write && ms < KVT_T3_WRITE_MIN_MS)
		ms = KVT_T3_WRITE_MIN_MS;
	int rc = kvt_rc_run_timeout(c, ops, n, ms);
	double dt = kvt_now_s() - t0;
	release(t, c);
	if (rc)
		return rc;
	uint32_t n_err = 0;
	for (uint32_t i = 0; i < n; i++)
		n_err += ops[i].rc != KVT_OK && ops[i].rc != KVT_ENOTFOUND;
	pthread_mutex_lock(&t->mu);
	uint32_t b = 0;
	while (b + 1 < KVT_T3_LAT_BUCKETS && dt > kvt_t3_lat_bounds[b])
		b++;
	t->st.lat[b]++;
	t->st.lat_sum_s += dt;
	t->st.n_errors += n_err;
	if (n_err)
		t->fail_t = kvt_now_s();
	pthread_mutex_unlock(&t->mu);
	return KVT_OK;
}

void kvt_t3_block_key(const kvt_t3 *t, const uint8_t hash[KVT_HASH_BYTES], char *out, size_t cap)
{
	char hex[2 * KVT_HASH_BYTES + 1];
	kvt_hash_hex(hash, hex);
	snprintf(out, cap, "%sb:%s", t->prefix, hex);
}

int kvt_t3_get_blocks(kvt_t3 *t, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], bool stop_at_miss,
		      kvt_t2_block_meta *metas, void *const *payloads, size_t payload_cap, int *results)
{
	if (!n)
		return KVT_OK;
	const size_t key_cap = strlen(t->prefix) + 2 * KVT_HASH_BYTES + 8;
	kvt_rc_op *ops = calloc(n, sizeof(*ops));
	char *keys = malloc(n * key_cap);
	uint64_t ext_cap = kvt_t2_round_up((uint64_t)KVT_T2_HEADER_BYTES + payload_cap, KVT_T2_UNIT_BYTES);
	uint8_t *scratch = malloc(payload_cap ? payload_cap : 1); /* for a shuffled payload (never written by T3) */
	if (!ops || !keys || !scratch) {
		free(ops);
		free(keys);
		free(scratch);
		return KVT_ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		kvt_t3_block_key(t, hashes[i], keys + i * key_cap, key_cap);
		ops[i].key = keys + i * key_cap;
		ops[i].key_bytes = strlen(ops[i].key);
	}
	int rc = run_round(t, ops, n, false);
	uint64_t hits = 0, misses = 0, corrupt = 0, bytes = 0;
	bool stopped = false;
	for (uint32_t i = 0; i < n; i++) {
		int r = rc ? rc : ops[i].rc;
		if (stopped) {
			results[i] = KVT_ENOTFOUND;
			misses++;
			continue;
		}
		if (r == KVT_OK) {
			bytes += ops[i].data_bytes;
			const char *why = "short record";
			/* Verified in the reply's own bytes: the extent's padding did not travel, it counts as zeros. */
			{
				r = kvt_t2_record_verify_unpadded(ops[i].data, ops[i].data_bytes, ext_cap, 0, t->model_fp,
								  hashes[i], &metas[i], payloads[i], payload_cap, scratch,
								  &why);
				if (r == KVT_OK) {
					/* the tokens must hash, from the parent, to the key: a record is its block */
					uint8_t h[KVT_HASH_BYTES];
					if (kvt_hash_block(metas[i].parent, metas[i].tokens, metas[i].n_tokens, h) != KVT_OK ||
					    memcmp(h, hashes[i], KVT_HASH_BYTES)) {
						r = KVT_ECORRUPT;
						why = "tokens and parent do not hash to the block";
					}
				} else if (r == KVT_EFULL) {
					r = KVT_ECORRUPT;
					why = "record larger than a block";
				}
			}
			if (r != KVT_OK) {
				KVT_LOGW("t3 %s: record fails verification (%s): a miss", ops[i].key, why);
				corrupt++;
			}
		}
		results[i] = r == KVT_OK ? KVT_OK : r == KVT_ECORRUPT ? KVT_ECORRUPT : r == KVT_ENOTFOUND ? KVT_ENOTFOUND : KVT_EIO;
		if (r == KVT_OK)
			hits++;
		else
			misses++;
		if (r != KVT_OK && stop_at_miss)
			stopped = true;
	}
	kvt_rc_ops_release(ops, n);
	pthread_mutex_lock(&t->mu);
	t->st.hits += hits;
	t->st.misses += misses;
	t->st.n_corrupt += corrupt;
	t->st.bytes_in += bytes;
	pthread_mutex_unlock(&t->mu);
	free(ops);
	free(keys);
	free(scratch);
	return rc == KVT_ENOMEM ? KVT_ENOMEM : KVT_OK;
}

int kvt_t3_put_records(kvt_t3 *t, uint32_t n, const kvt_t2_write_req *reqs, int *results)
{
	if (!n)
		return KVT_OK;
	const size_t key_cap = strlen(t->prefix) + 2 * KVT_HASH_BYTES + 8;
	kvt_rc_op *ops = calloc(n, sizeof(*ops));
	char *keys = malloc(n * key_cap);
	uint8_t **recs = calloc(n, sizeof(*recs));
	int rc = KVT_ENOMEM;
	if (!ops || !keys || !recs)
		goto out;
	for (uint32_t i = 0; i < n; i++) {
		const kvt_t2_block_meta *m = reqs[i].meta;
		uint64_t ext = kvt_t2_round_up((uint64_t)KVT_T2_HEADER_BYTES + m->raw_bytes, KVT_T2_UNIT_BYTES);
		if (m->raw_bytes == 0 || m->raw_bytes > KVT_T2_MAX_RAW_BYTES || m->n_tokens > KVT_T2_MAX_TOKENS) {
			KVT_LOGE("t3: block of %u bytes, %u tokens cannot be a record", m->raw_bytes, m->n_tokens);
			rc = KVT_EINVAL;
			goto out;
		}
		if (!(recs[i] = malloc(ext)))
			goto out;
		kvt_t2_sized sz;
		kvt_t2_loc loc;
		kvt_t2_record_pack(m, reqs[i].payload, KVT_T2_COMP_NONE, NULL, recs[i], ext, &sz);
		kvt_t2_record_seal(m, t->model_fp, &sz, 0, KVT_T3_GENERATION, recs[i], &loc);
		kvt_t3_block_key(t, m->hash, keys + i * key_cap, key_cap);
		ops[i] = (kvt_rc_op){ .key = keys + i * key_cap, .key_bytes = strlen(keys + i * key_cap), .val = recs[i],
				      .val_bytes = KVT_T2_HEADER_BYTES + sz.stored_bytes, .ttl_s = t->cfg.ttl_s };
	}
	rc = run_round(t, ops, n, true);
	uint64_t bytes = 0, n_ok = 0;
	for (uint32_t i = 0; i < n; i++) {
		results[i] = rc ? rc : ops[i].rc;
		if (results[i] == KVT_OK) {
			bytes += ops[i].val_bytes;
			n_ok++;
		}
	}
	pthread_mutex_lock(&t->mu);
	t->st.bytes_out += bytes;
	t->st.n_writes += n_ok;
	pthread_mutex_unlock(&t->mu);
out:
	if (recs)
		for (uint32_t i = 0; i < n; i++)
			free(recs[i]);
	free(recs);
	free(ops);
	free(keys);
	return rc;
}

int kvt_t3_put_blocks(kvt_t3 *t, uint32_t n, const kvt_t2_block_meta *metas, const void *const *payloads,
		      int *results)
{
	if (!n)
		return KVT_OK;
	kvt_t2_write_req *reqs = malloc((size_t)n * sizeof(*reqs));
	if (!reqs)
		return KVT_ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		reqs[i] = (kvt_t2_write_req){ .meta = &metas[i], .payload = payloads[i] };
	int rc = kvt_t3_put_records(t, n, reqs, results);
	free(reqs);
	return rc;
}

/* One round of a key-only command (DEL, EXISTS) on n blocks' keys: results[i] as kvt_rc_op.rc. */
static int block_keys_round(kvt_t3 *t, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], uint8_t verb,
			    int *results)
{
	if (!n)
		return KVT_OK;
	const size_t key_cap = strlen(t->prefix) + 2 * KVT_HASH_BYTES + 8;
	kvt_rc_op *ops = calloc(n, sizeof(*ops));
	char *keys = malloc(n * key_cap);
	int rc = KVT_ENOMEM;
	if (ops && keys) {
		for (uint32_t i = 0; i < n; i++) {
			kvt_t3_block_key(t, hashes[i], keys + i * key_cap, key_cap);
			ops[i] = (kvt_rc_op){ .key = keys + i * key_cap, .key_bytes = strlen(keys + i * key_cap), .verb = verb };
		}
		rc = run_round(t, ops, n, verb == KVT_RC_DEL);
		for (uint32_t i = 0; i < n; i++)
			results[i] = rc ? rc : ops[i].rc;
		kvt_rc_ops_release(ops, n);
	}
	free(ops);
	free(keys);
	return rc == KVT_ENOMEM ? KVT_ENOMEM : KVT_OK;
}

int kvt_t3_delete_blocks(kvt_t3 *t, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], int *results)
{
	return block_keys_round(t, n, hashes, KVT_RC_DEL, results);
}

int kvt_t3_has_blocks(kvt_t3 *t, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], int *results)
{
	return block_keys_round(t, n, hashes, KVT_RC_EXISTS, results);
}

/* ---- sessions ---- */

static void put32le(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64le(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32le(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64le(const uint8_t *p) { return (uint64_t)get32le(p) | (uint64_t)get32le(p + 4) << 32; }

/*
 * Session record: "KVT3SES1", n_tokens u32, id_len u32, tenant_len u32,
 * last_hash[32], created i64, updated i64, id, tenant, tokens (u32 each),
 * then XXH3-64 of everything before it. Little-endian.
 */
enum { S_HDR = 8 + 4 + 4 + 4 + 32 + 8 + 8 };

static void session_key(const kvt_t3 *t, const char *tenant, const char *id, char *out, size_t cap)
{
	snprintf(out, cap, "%ss:%s/%s", t->prefix, tenant, id);
}

int kvt_t3_put_session(kvt_t3 *t, const kvt_db_session *s)
{
	size_t il = strlen(s->id), tl = strlen(s->tenant);
	size_t n = S_HDR + il + tl + 4 * (size_t)s->n_tokens + 8;
	uint8_t *b = malloc(n);
	char key[3 * KVT_NAME_MAX + 64];
	if (!b)
		return KVT_ENOMEM;
	memcpy(b, T3_SES_MAGIC, 8);
	put32le(b + 8, s->n_tokens);
	put32le(b + 12, (uint32_t)il);
	put32le(b + 16, (uint32_t)tl);
	memcpy(b + 20, s->last_hash, KVT_HASH_BYTES);
	int64_t now = (int64_t)kvt_wall_us() / 1000000;
	put64le(b + 52, (uint64_t)(s->created ? s->created : now));
	put64le(b + 60, (uint64_t)now);
	memcpy(b + S_HDR, s->id, il);
	memcpy(b + S_HDR + il, s->tenant, tl);
	for (uint32_t i = 0; i < s->n_tokens; i++)
		put32le(b + S_HDR + il + tl + 4 * i, (uint32_t)s->tokens[i]);
	put64le(b + n - 8, XXH3_64bits(b, n - 8));
	session_key(t, s->tenant, s->id, key, sizeof(key));
	kvt_rc_op op = { .key = key, .key_bytes = strlen(key), .val = b, .val_bytes = n, .ttl_s = t->cfg.ttl_s };
	int rc = run_round(t, &op, 1, true);
	free(b);
	if (rc)
		return rc;
	if (op.rc == KVT_OK) {
		pthread_mutex_lock(&t->mu);
		t->st.n_sessions_put++;
		t->st.bytes_out += n;
		pthread_mutex_unlock(&t->mu);
	}
	return op.rc;
}

int kvt_t3_get_session(kvt_t3 *t, const char *tenant, const char *id, kvt_db_session *out)
{
	char key[3 * KVT_NAME_MAX + 64];
	session_key(t, tenant, id, key, sizeof(key));
	kvt_rc_op op = { .key = key, .key_bytes = strlen(key) };
	int rc = run_round(t, &op, 1, false);
	if (rc)
		return rc;
	if (op.rc != KVT_OK)
		return op.rc == KVT_ENOTFOUND ? KVT_ENOTFOUND : KVT_EIO;
	const uint8_t *b = op.data;
	size_t n = op.data_bytes;
	const char *why = NULL;
	uint32_t nt = 0, il = 0, tl = 0;
	if (n < S_HDR + 8 || memcmp(b, T3_SES_MAGIC, 8)) {
		why = "bad magic or short";
	} else {
		nt = get32le(b + 8), il = get32le(b + 12), tl = get32le(b + 16);
		if (il > KVT_NAME_MAX || tl > KVT_NAME_MAX || nt > (n - S_HDR - 8) / 4 ||
		    (uint64_t)S_HDR + il + tl + 4ull * nt + 8 != n)
			why = "bad lengths";
		else if (XXH3_64bits(b, n - 8) != get64le(b + n - 8))
			why = "checksum mismatch";
		else if (il != strlen(id) || memcmp(b + S_HDR, id, il) || tl != strlen(tenant) ||
			 memcmp(b + S_HDR + il, tenant, tl))
			why = "names another session";
	}
	if (why) {
		KVT_LOGW("t3 %s: session record fails verification (%s): a miss", key, why);
		kvt_rc_ops_release(&op, 1);
		pthread_mutex_lock(&t->mu);
		t->st.n_corrupt++;
		pthread_mutex_unlock(&t->mu);
		return KVT_ECORRUPT;
	}
	memset(out, 0, sizeof(*out));
	snprintf(out->id, sizeof(out->id), "%s", id);
	snprintf(out->tenant, sizeof(out->tenant), "%s", tenant);
	out->n_tokens = nt;
	out->tokens = malloc((nt ? nt : 1) * sizeof(int32_t));
	if (!out->tokens) {
		kvt_rc_ops_release(&op, 1);
		return KVT_ENOMEM;
	}
	for (uint32_t i = 0; i < nt; i++)
		out->tokens[i] = (int32_t)get32le(b + S_HDR + il + tl + 4 * i);
	memcpy(out->last_hash, b + 20, KVT_HASH_BYTES);
	out->created = (int64_t)get64le(b + 52);
	out->updated = (int64_t)get64le(b + 60);
	pthread_mutex_lock(&t->mu);
	t->st.n_sessions_got++;
	t->st.bytes_in += n;
	pthread_mutex_unlock(&t->mu);
	kvt_rc_ops_release(&op, 1);
	return KVT_OK;
}

void kvt_t3_get_stats(kvt_t3 *t, kvt_t3_stats *st)
{
	pthread_mutex_lock(&t->mu);
	*st = t->st;
	st->degraded = t->fail_t > 0 && kvt_now_s() - t->fail_t < T3_DEGRADED_S;
	pthread_mutex_unlock(&t->mu);
}
