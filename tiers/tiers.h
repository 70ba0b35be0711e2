/*
 * tiers/tiers.h — the KV block pools: T0, the device block pool the engine's
 * paged attention reads (host memory on the CPU backend), and T1, the pinned
 * host pool of packed (fp16 / FP8 / INT8) blocks, with the mover that carries
 * blocks between them through the device codecs. The NVMe tier is
 * tiers/t2_store.h and the tiering manager tiers/manager.h (they depend on
 * the index module, which this header does not).
 *
 * A T0 slot holds one block record (all layers, K and V, fp16, the layout of
 * kvt_kv_layout). Slots are carved once at creation from one device
 * allocation; nothing is allocated afterwards. Each slot has a reference
 * count: kvt_t0_alloc hands out a slot with count 1, kvt_t0_ref adds a
 * holder (a second sequence sharing a prefix block), kvt_t0_unref drops one
 * and returns the slot to the free list at zero. A slot with a non-zero count
 * is never handed out again.
 *
 * Thread rules: all calls are safe from any thread (one mutex; the hot path
 * takes it once per block, not per token).
 */
#ifndef KVT_TIERS_H
#define KVT_TIERS_H

#include "dev.h"

typedef struct kvt_t0_pool kvt_t0_pool;

/*
 * Create a pool of n_slots blocks shaped like *shape (its pool and n_slots
 * fields are ignored) in device memory of d (borrowed; must outlive the
 * pool). KVT_ENOMEM when the device cannot hold it.
 */
int kvt_t0_create(kvt_dev *d, const kvt_kv_layout *shape, uint32_t n_slots, kvt_t0_pool **out);
void kvt_t0_destroy(kvt_t0_pool *p); /* NULL is a no-op */

/* The full layout, pool pointer included, for the device ops. */
const kvt_kv_layout *kvt_t0_layout(const kvt_t0_pool *p);
size_t kvt_t0_block_bytes(const kvt_t0_pool *p);
uint32_t kvt_t0_n_slots(const kvt_t0_pool *p);
uint32_t kvt_t0_n_free(const kvt_t0_pool *p);

/* Take a free slot (count 1). KVT_EFULL when none is free (not logged: callers evict). */
int kvt_t0_alloc(kvt_t0_pool *p, int32_t *slot);
/* Add a holder to a slot in use. */
void kvt_t0_ref(kvt_t0_pool *p, int32_t slot);
/* Drop a holder; at zero the slot is free again. */
void kvt_t0_unref(kvt_t0_pool *p, int32_t slot);
uint32_t kvt_t0_refcount(const kvt_t0_pool *p, int32_t slot);
/*
 * Walk the pool and check its invariants: every free-list entry is a slot in
 * range with count 0, listed once, and the slots with count 0 are exactly
 * those listed. KVT_ECORRUPT (logged, naming the slot) if not. Debug and test
 * builds call it; it takes the pool's mutex.
 */
int kvt_t0_check(const kvt_t0_pool *p);


/* ------------------------------------------------------------------------ */
/* T1: the pinned host pool (tiers/t1_pool.c)                               */
/* ------------------------------------------------------------------------ */

/*
 * A T1 slot holds one packed block (dev.h, kvt_kv_pack: fp16 bit for bit, or
 * FP8 E4M3 / INT8 codes [layer][K,V][kv_head][token][dim] followed by fp32
 * scales: [layer][K,V][kv_head][token] for FP8, [layer][K,V][kv_head][token][group]
 * for INT8, a group being 32 dims, or the whole head when head_dim is not a
 * multiple of 32) in pinned host memory, so the copies
 * to and from the device run asynchronously at bus speed. The slot bytes are
 * also exactly the payload of a T2 record. Slots are carved once at creation
 * from one kvt_dev_host_alloc; each has a reference count with the same rules
 * as T0 (alloc = 1, ref/unref, free at 0, a slot with holders is never handed
 * out again).
 *
 * Error bound of a round trip T0 -> T1 -> T0 (per element x, fp16 in and
 * out, s = the scale of x's group = amax / qmax over the group: the token and
 * KV head for FP8, the token, KV head and 32 dims for INT8):
 *   F16:  exact (bit for bit);
 *   INT8: |x' - x| <= s / 2 + r(x')              (s = amax / 127);
 *   FP8:  |x' - x| <= 2^-4 |x| + 2^-10 s + r(x')  (s = amax / 448: 3 mantissa
 *         bits, a subnormal step of 2^-9 s),
 * where r(x') = max(2^-11 |x'|, 2^-25) is the final rounding to fp16 (half
 * an ulp, or half the fp16 subnormal step).
 * tests/test_t1_pool.c checks these on every element; tiers/README.md has the
 * measured errors on real KV.
 *
 * Thread rules: every call is safe from any thread (one mutex). The slot
 * memory itself is the holders' to synchronize.
 */
typedef struct kvt_t1_pool kvt_t1_pool;

/*
 * Create a pool of n_slots packed blocks of codec (enum kvt_kv_codec) for
 * blocks shaped like *shape (its pool and n_slots fields are ignored), in
 * pinned host memory of d (borrowed; must outlive the pool). KVT_EINVAL
 * (logged) for an empty shape, zero slots or a bad codec; KVT_ENOMEM.
 */
int kvt_t1_create(kvt_dev *d, const kvt_kv_layout *shape, int codec, uint32_t n_slots, kvt_t1_pool **out);
void kvt_t1_destroy(kvt_t1_pool *p); /* NULL is a no-op */

int kvt_t1_codec(const kvt_t1_pool *p);        /* enum kvt_kv_codec */
size_t kvt_t1_slot_bytes(const kvt_t1_pool *p); /* kvt_kv_packed_bytes of the shape and codec */
uint32_t kvt_t1_n_slots(const kvt_t1_pool *p);
uint32_t kvt_t1_n_free(const kvt_t1_pool *p);
/* The pinned host bytes of a slot ("h_"; slot_bytes long). */
void *kvt_t1_slot_ptr(const kvt_t1_pool *p, int32_t slot);

/* Take a free slot (count 1). KVT_EFULL when none is free (not logged: callers evict). */
int kvt_t1_alloc(kvt_t1_pool *p, int32_t *slot);
void kvt_t1_ref(kvt_t1_pool *p, int32_t slot);   /* add a holder to a slot in use */
void kvt_t1_unref(kvt_t1_pool *p, int32_t slot); /* drop one; free at zero */
uint32_t kvt_t1_refcount(const kvt_t1_pool *p, int32_t slot);
/* Invariants as kvt_t0_check. KVT_ECORRUPT (logged, naming the slot) if broken. */
int kvt_t1_check(const kvt_t1_pool *p);

/* ------------------------------------------------------------------------ */
/* The T0 <-> T1 mover (tiers/t1_mover.c)                                   */
/* ------------------------------------------------------------------------ */

/*
 * A mover owns one device stream and a device staging buffer of max_blocks
 * packed blocks. Demotion: kvt_dev_kv_pack of the T0 slots into the staging
 * buffer on the mover's stream, then one kvt_dev_copy_async D2H per block
 * into its T1 slot (or any pinned host buffer). Promotion is the reverse: H2D
 * of each packed block into staging, then kvt_dev_kv_unpack into the T0
 * slots. When T0 already holds blocks in the codec's format (f16 to f16, or
 * an 8-bit pool to its own codec) the blocks are copied directly between
 * their slots and host memory. Each call returns once its work on the stream
 * is complete, so the caller may then free the source. Work on the mover's
 * stream overlaps the engine's compute stream; before packing blocks the
 * engine has just written, make the mover wait for them
 * (kvt_t1_mover_wait_event).
 *
 * Thread rules: one mover is driven by one thread at a time; movers are
 * independent of each other (one per manager I/O thread).
 */
typedef struct kvt_t1_mover kvt_t1_mover;

/*
 * A mover between t0 and blocks packed with codec (both borrowed; must
 * outlive the mover). KVT_EINVAL (logged) for max_blocks 0 or a bad codec;
 * KVT_ENOMEM / KVT_EDEVICE.
 */
int kvt_t1_mover_create(kvt_dev *d, kvt_t0_pool *t0, int codec, uint32_t max_blocks, kvt_t1_mover **out);
void kvt_t1_mover_destroy(kvt_t1_mover *m); /* NULL is a no-op; waits for its stream */
/* Make the mover's later work wait (on the device) for event e. */
int kvt_t1_mover_wait_event(kvt_t1_mover *m, kvt_event *e);

/*
 * Pack n (<= max_blocks) T0 slots and copy packed block i to h_dst[i] (pinned
 * host memory, kvt_kv_packed_bytes each). Returns when the bytes are in host
 * memory. KVT_EINVAL (logged) for n > max_blocks; device errors passed up.
 */
int kvt_t1_mover_pack(kvt_t1_mover *m, uint32_t n, const int32_t *t0_slots, void *const *h_dst);
/*
 * Copy packed block i from h_src[i] (pinned host memory) and unpack it into
 * T0 slot t0_slots[i]. Returns when the T0 slots hold the blocks.
 */
int kvt_t1_mover_unpack(kvt_t1_mover *m, uint32_t n, const void *const *h_src, const int32_t *t0_slots);

#endif
