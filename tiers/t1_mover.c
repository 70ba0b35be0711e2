/*
 * tiers/t1_mover.c — carries blocks between T0 and pinned host memory
 * through the device codecs, on a stream of its own.
 *
 * Demotion packs on the device (so a GPU quantizes before the bus sees the
 * bytes: FP8/INT8 halve the D2H traffic) and then copies each packed block
 * to its own host destination; promotion copies packed blocks up and
 * unpacks them into T0 slots. When T0 already keeps blocks in the codec's
 * format (f16 to f16; an 8-bit pool to its own codec) packing is the
 * identity, so the blocks are copied straight between their T0 slots and
 * host memory, without the staging hop. Only dev.h operations are used, so the mover
 * runs unchanged on every backend. Each call ends with a stream sync: when
 * it returns, the destination holds the bytes and the staging buffer is
 * free for the next call.
 */
#include "tiers.h"

#include <stdlib.h>

struct kvt_t1_mover {
	kvt_dev *dev;          /* borrowed */
	kvt_t0_pool *t0;       /* borrowed */
	kvt_stream *stream;    /* the mover's own copy stream */
	int codec;             /* enum kvt_kv_codec */
	size_t packed_bytes;   /* one packed block */
	uint32_t max_blocks;   /* staging capacity in blocks */
	unsigned char *d_stage;/* [max_blocks][packed_bytes], device */
};

int kvt_t1_mover_create(kvt_dev *d, kvt_t0_pool *t0, int codec, uint32_t max_blocks, kvt_t1_mover **out)
{
	kvt_t1_mover *m;
	int rc;

	if (!max_blocks || codec < 0 || codec >= KVT_KV_CODEC_COUNT) {
		KVT_LOGE("t1 mover: %u staging blocks, codec %d (need >= 1 block and f16, fp8 or int8)", max_blocks,
			 codec);
		return KVT_EINVAL;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return KVT_ENOMEM;
	m->dev = d;
	m->t0 = t0;
	m->codec = codec;
	m->max_blocks = max_blocks;
	m->packed_bytes = kvt_kv_packed_bytes(kvt_t0_layout(t0), codec);
	rc = kvt_dev_stream_create(d, &m->stream);
	if (rc)
		goto fail;
	rc = kvt_dev_alloc(d, m->packed_bytes * max_blocks, (void **)&m->d_stage);
	if (rc)
		goto fail;
	*out = m;
	return KVT_OK;
fail:
	kvt_dev_stream_destroy(d, m->stream);
	free(m);
	return rc;
}

void kvt_t1_mover_destroy(kvt_t1_mover *m)
{
	if (!m)
		return;
	kvt_dev_stream_destroy(m->dev, m->stream);
	kvt_dev_free(m->dev, m->d_stage);
	free(m);
}

int kvt_t1_mover_wait_event(kvt_t1_mover *m, kvt_event *e)
{
	return kvt_dev_stream_wait_event(m->dev, m->stream, e);
}

static int check_n(const kvt_t1_mover *m, const char *op, uint32_t n)
{
	if (n > m->max_blocks) {
		KVT_LOGE("t1 mover %s: %u blocks, staging holds %u", op, n, m->max_blocks);
		return KVT_EINVAL;
	}
	return KVT_OK;
}

/* Device address of a T0 slot. */
static unsigned char *slot_addr(const kvt_t1_mover *m, int32_t slot)
{
	const kvt_kv_layout *l = kvt_t0_layout(m->t0);
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < l->n_slots);
	return (unsigned char *)l->pool + (size_t)slot * kvt_t0_block_bytes(m->t0);
}

/* T0 already holds blocks in the codec's format (f16 to f16): plain copies, no staging. */
static int copy_direct(kvt_t1_mover *m, uint32_t n, const int32_t *t0_slots, void *const *h, int dir)
{
	int rc = KVT_OK;
	for (uint32_t i = 0; i < n && rc == KVT_OK; i++)
		rc = dir == KVT_COPY_D2H ? kvt_dev_copy_async(m->dev, m->stream, h[i], slot_addr(m, t0_slots[i]),
							     m->packed_bytes, dir)
					 : kvt_dev_copy_async(m->dev, m->stream, slot_addr(m, t0_slots[i]), h[i],
							     m->packed_bytes, dir);
	int rs = kvt_dev_stream_sync(m->dev, m->stream);
	return rc ? rc : rs;
}

int kvt_t1_mover_pack(kvt_t1_mover *m, uint32_t n, const int32_t *t0_slots, void *const *h_dst)
{
	int rc = check_n(m, "pack", n);
	if (rc || !n)
		return rc;
	if (m->codec == kvt_t0_layout(m->t0)->codec)
		return copy_direct(m, n, t0_slots, h_dst, KVT_COPY_D2H);
	kvt_kv_pack_args a = {
		.kv = kvt_t0_layout(m->t0), .codec = m->codec, .n_blocks = n, .h_slots = t0_slots, .dst = m->d_stage,
	};
	rc = kvt_dev_kv_pack(m->dev, m->stream, &a);
	for (uint32_t i = 0; i < n && rc == KVT_OK; i++)
		rc = kvt_dev_copy_async(m->dev, m->stream, h_dst[i], m->d_stage + (size_t)i * m->packed_bytes,
					m->packed_bytes, KVT_COPY_D2H);
	/* NOTE: sync even after a failure, so nothing is left in flight on the staging buffer. */
	int rs = kvt_dev_stream_sync(m->dev, m->stream);
	return rc ? rc : rs;
}

int kvt_t1_mover_unpack(kvt_t1_mover *m, uint32_t n, const void *const *h_src, const int32_t *t0_slots)
{
	int rc = check_n(m, "unpack", n);
	if (rc || !n)
		return rc;
	if (m->codec == kvt_t0_layout(m->t0)->codec)
		return copy_direct(m, n, t0_slots, (void *const *)h_src, KVT_COPY_H2D);
	for (uint32_t i = 0; i < n && rc == KVT_OK; i++)
		rc = kvt_dev_copy_async(m->dev, m->stream, m->d_stage + (size_t)i * m->packed_bytes, h_src[i],
					m->packed_bytes, KVT_COPY_H2D);
	if (rc == KVT_OK) {
		kvt_kv_unpack_args a = {
			.kv = kvt_t0_layout(m->t0), .codec = m->codec, .n_blocks = n, .h_slots = t0_slots,
			.src = m->d_stage,
		};
		rc = kvt_dev_kv_unpack(m->dev, m->stream, &a);
	}
	int rs = kvt_dev_stream_sync(m->dev, m->stream);
	return rc ? rc : rs;
}
