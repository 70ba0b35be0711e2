/*
 * engine/serve/stack.c — the serving stack (stack.h).
 */
#include "stack.h"

#include <string.h>
#include <sys/stat.h>

void kvt_stack_config_default(kvt_stack_config *c)
{
	memset(c, 0, sizeof(*c));
	c->block_tokens = 16;
	kvt_tm_config_default(&c->tm);
	kvt_sched_config_default(&c->sched);
	kvt_t3_config_default(&c->t3);
}

int kvt_stack_open(const kvt_stack_config *c, kvt_stack *s)
{
	kvt_kv_layout shape;
	int rc;

	memset(s, 0, sizeof(*s));
	kvt_model_kv_shape(c->model, c->block_tokens, &shape);
	if ((rc = kvt_t0_create(c->dev, &shape, c->t0_slots, &s->t0)) ||
	    (rc = kvt_btable_create(c->block_tokens, c->t0_slots, &s->bt)))
		goto fail;
	if (c->db_path) {
		kvt_db_config dbc = { .path = c->db_path,
				      .create = true,
				      .journal_path = c->journal_path,
				      .reserve_path = c->reserve_path,
				      .reserve_bytes = c->reserve_bytes };
		/* the T2 file's owner, for an index that must be rebuilt from the journal (kvt_db_config.adopt_owner) */
		kvt_t2_info t2i;
		struct stat sb;
		if (c->t2_path && c->journal_path && stat(c->t2_path, &sb) == 0 && sb.st_size > 0 &&
		    kvt_t2_probe(c->t2_path, &t2i) == KVT_OK)
			dbc.adopt_owner = t2i.owner_id;
		memcpy(dbc.ns.model_fp, c->model_fp, KVT_HASH_BYTES);
		dbc.ns.layout_version = KVT_KV_LAYOUT_VERSION;
		dbc.ns.block_tokens = c->block_tokens;
		if ((rc = kvt_db_open(&dbc, &s->db)))
			goto fail;
	}
	if (c->t2_path && c->db_path && c->tm.t1_slots) {
		kvt_t2_config tc = c->t2;
		tc.path = c->t2_path;
		/* the largest record of any format (f16): an f16 NVMe copy, or an older build's 8-bit records */
		tc.max_raw_bytes = (uint32_t)kvt_kv_packed_bytes(&shape, KVT_KV_CODEC_F16);
		memcpy(tc.model_fp, c->model_fp, KVT_HASH_BYTES);
		kvt_db_owner_id(s->db, tc.owner_id); /* the file belongs to this index, and no other */
		if ((rc = kvt_t2_open(&tc, &s->t2))) {
			KVT_LOGE("tier.nvme %s: cannot open: %s", c->t2_path, kvt_strerror(rc));
			goto fail;
		}
	}
	if (c->remote && c->tm.t1_slots && (rc = kvt_t3_create(&c->t3, c->model_fp, &s->t3)))
		goto fail;
	if (c->tm.t1_slots) {
		kvt_tm_config tm = c->tm;
		tm.chunk_share = c->sched.chunk_share; /* the scheduler's knob: the manager applies it */
		tm.t3 = s->t3;
		tm.dev = c->dev;
		tm.t0 = s->t0;
		tm.bt = s->bt;
		tm.t2 = s->t2;
		tm.db = s->db;
		if ((rc = kvt_tm_create(&tm, &s->tm)))
			goto fail;
		/* quotas first: recovery releases the oldest retention of a tenant now over its quota */
		for (size_t i = 0; i < c->n_quotas; i++)
			if ((rc = kvt_tm_set_quota(s->tm, c->quotas[i].tenant, &c->quotas[i].quota)))
				goto fail;
		if (s->t2 && (rc = kvt_tm_recover(s->tm, &s->n_recovered)))
			goto fail;
	}
	kvt_sched_config sc = c->sched;
	sc.dev = c->dev;
	sc.model = c->model;
	sc.tok = c->tok;
	sc.t0 = s->t0;
	sc.tm = s->tm;
	sc.db = s->db;
	memcpy(sc.model_fp, c->model_fp, KVT_HASH_BYTES);
	sc.layout_version = KVT_KV_LAYOUT_VERSION;
	if ((rc = kvt_sched_create(&sc, &s->sched)))
		goto fail;
	return KVT_OK;
fail:
	kvt_stack_close(s);
	return rc;
}

void kvt_stack_close(kvt_stack *s)
{
	kvt_sched_destroy(s->sched); /* flushes the cache to NVMe and commits the index */
	kvt_tm_destroy(s->tm);
	kvt_t3_destroy(s->t3); /* after the manager: its threads use it */
	kvt_db_close(s->db);
	kvt_t2_close(s->t2);
	kvt_btable_destroy(s->bt);
	kvt_t0_destroy(s->t0);
	memset(s, 0, sizeof(*s));
}
