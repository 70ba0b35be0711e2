/*
 * tiers/t2_io.c — the T2 I/O engines: io_uring, and the pread/pwrite thread
 * pool that takes over where io_uring_setup is refused.
 *
 * Design: the store owns a few I/O contexts; a batch call takes one for its
 * duration, so batches from different threads run side by side. A context
 * owns a staging arena of 2 x `depth` slots (in 2 MiB transparent huge pages
 * where the kernel grants them: see arena_alloc; registered with its ring as
 * one fixed buffer), a ring of `depth` + 1 entries (uring mode;
 * the extra one for a background fdatasync) and a completion queue (thread
 * mode). kvt_t2_io_run drives one batch as a
 * pipeline: it keeps up to `depth` I/Os in flight, calls the batch's prep()
 * to fill a free slot (encode a record, or name the extent to read) and its
 * done() as each I/O completes (verify, decompress). The spare slots let it
 * queue the next I/Os BEFORE it runs done() on the finished ones, so the
 * device stays `depth` deep while the CPU verifies.
 *
 * Short transfers are resubmitted for the rest (both paths); -EAGAIN and
 * -EINTR are retried (bounded: KVT_T2_MAX_AGAIN, then the I/O fails with
 * -EAGAIN); a transfer of 0 bytes (end of file) is -EIO. On the io_uring path
 * each completion first passes the ops' uring_result hook (fault injection).
 *
 * Invariants: a slot is either free (on the context's stack) or owned by
 * exactly one job in flight; a context is used by one batch at a time.
 * The thread pool is shared by all contexts: workers take jobs from one queue
 * and post each finished job to its context's completion queue.
 */
#define _GNU_SOURCE /* fallocate */
#include "t2_int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define KVT_T2_MAX_AGAIN 1000u
#define KVT_T2_HUGE_BYTES (2u << 20) /* x86-64 / arm64 (4 KiB base) transparent huge page */

struct kvt_t2_ioctx {
	kvt_t2_io *io;          /* owner */
	bool busy;              /* held by a batch (io->mu) */
	uint32_t depth;         /* max I/Os in flight */
	uint32_t n_slots;       /* staging slots: 2 x depth */
	uint8_t *staging;       /* [n_slots][slot_bytes], 2 MiB aligned (huge pages), registered with ring */
	size_t staging_bytes;   /* mapped bytes of staging (a multiple of 2 MiB) */
	uint8_t *scratch;       /* [slot_bytes] for shuffles */
	kvt_t2_job *jobs;       /* [n_slots] one per slot */
	int *free_slots;        /* [n_slots] stack */
	uint32_t n_free;
	struct io_uring ring;   /* uring mode */
	bool ring_ok;           /* ring initialised */
	bool fixed;             /* staging registered: use read_fixed/write_fixed */
	pthread_mutex_t mu;     /* thread mode: guards done_q, n_done */
	pthread_cond_t cv;      /* signalled when a job is posted to done_q */
	kvt_t2_job **done_q;    /* [n_slots + 1] finished jobs */
	kvt_t2_job sync_job;    /* the intermediate fdatasync of a write batch */
	uint32_t n_done;
};

struct kvt_t2_io {
	kvt_t2_io_cfg cfg;      /* copy; cfg.ops borrowed */
	bool uring;             /* io_uring path (else the thread pool) */
	kvt_t2_ioctx *ctxs;     /* [n_ctx] */
	uint32_t n_ctx;
	pthread_mutex_t mu;     /* guards ctxs[].busy */
	pthread_cond_t cv;      /* a context became idle */
	/* thread pool */
	pthread_t *threads;     /* [n_threads] */
	uint32_t n_threads;
	pthread_mutex_t qmu;    /* guards queue, q_head, q_n, stop */
	pthread_cond_t qcv;     /* work arrived or stop */
	kvt_t2_job **queue;     /* ring of q_cap pending jobs */
	uint32_t q_cap, q_head, q_n;
	bool stop;
};

static void sleep_us(long us)
{
	struct timespec ts = { 0, us * 1000 };
	nanosleep(&ts, NULL);
}

/* The ctx a job belongs to: jobs live in their ctx's array. */
static kvt_t2_ioctx *job_ctx(kvt_t2_io *io, const kvt_t2_job *j)
{
	for (uint32_t i = 0; i < io->n_ctx; i++) {
		kvt_t2_ioctx *c = &io->ctxs[i];
		if ((j >= c->jobs && j < c->jobs + c->n_slots) || j == &c->sync_job)
			return c;
	}
	KVT_ASSERT(!"job of no context");
	return NULL;
}

/* One whole transfer with the ops, as a worker or a synchronous call runs it. */
static int xfer_full(const kvt_t2_io_ops *ops, int fd, bool is_write, uint8_t *buf, size_t n, uint64_t off)
{
	size_t done = 0;
	uint32_t n_again = 0;
	while (done < n) {
		ssize_t r = is_write ? ops->pwrite(ops->ctx, fd, buf + done, n - done, (off_t)(off + done))
				     : ops->pread(ops->ctx, fd, buf + done, n - done, (off_t)(off + done));
		if (r < 0) {
			int e = errno ? errno : EIO;
			if ((e == EAGAIN || e == EINTR) && ++n_again < KVT_T2_MAX_AGAIN) {
				if (n_again > 8)
					sleep_us(100);
				continue;
			}
			return -e;
		}
		if (r == 0)
			return -EIO; /* end of file inside the transfer */
		done += (size_t)r;
	}
	return 0;
}

int kvt_t2_io_pread_full(const kvt_t2_io_ops *ops, int fd, void *buf, size_t n, uint64_t off)
{
	return xfer_full(ops, fd, false, buf, n, off);
}

int kvt_t2_io_pwrite_full(const kvt_t2_io_ops *ops, int fd, const void *buf, size_t n, uint64_t off)
{
	return xfer_full(ops, fd, true, (uint8_t *)buf, n, off);
}

static void *worker(void *arg)
{
	kvt_t2_io *io = arg;
	for (;;) {
		pthread_mutex_lock(&io->qmu);
		while (!io->q_n && !io->stop)
			pthread_cond_wait(&io->qcv, &io->qmu);
		if (!io->q_n) {
			pthread_mutex_unlock(&io->qmu);
			return NULL;
		}
		kvt_t2_job *j = io->queue[io->q_head];
		io->q_head = (io->q_head + 1) % io->q_cap;
		io->q_n--;
		pthread_mutex_unlock(&io->qmu);

		if (j->is_sync)
			j->res = io->cfg.ops->fdatasync(io->cfg.ops->ctx, io->cfg.fd) == 0 ? 0 : -(errno ? errno : EIO);
		else
			j->res = xfer_full(io->cfg.ops, io->cfg.fd, j->is_write, j->buf, j->n, j->off);
		kvt_t2_ioctx *c = job_ctx(io, j);
		pthread_mutex_lock(&c->mu);
		c->done_q[c->n_done++] = j;
		pthread_cond_signal(&c->cv);
		pthread_mutex_unlock(&c->mu);
	}
}

/*
 * The staging arena: anonymous memory, 2 MiB aligned and advised for
 * transparent huge pages. NOTE: this is what lets a large record travel as
 * one device request. A registered buffer of 4 KiB pages gives one bio
 * segment per page, so a 1 MiB read is split at the device's max_segments
 * (254 on virtio-blk: 1016 KiB + 8 KiB), and a virtqueue without indirect
 * descriptors (the virtio disk measured) spends one ring descriptor per
 * page: requests wait in the block layer for ring space (about two
 * dispatches per completion were traced) and 1 MiB reads ran at about half
 * of what the disk gives. Within a huge page the pages are physically
 * contiguous and the kernel makes them one segment (io_uring coalesces a
 * registered buffer of huge folios; blk-mq merges contiguous pages into one
 * descriptor), so a 1 MiB read is one 1 MiB request (bench/README.md, T2).
 * Where THP is off the advice is a no-op and the arena is 4 KiB pages:
 * correct, slower. The mapping is rounded up to whole huge pages.
 */
static uint8_t *arena_alloc(size_t bytes, size_t *mapped)
{
	size_t n = kvt_t2_round_up(bytes, KVT_T2_HUGE_BYTES);
	uint8_t *raw = mmap(NULL, n + KVT_T2_HUGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED)
		return NULL;
	/* keep the 2 MiB aligned run of n bytes; unmap the head and tail around it */
	uint8_t *p = (uint8_t *)kvt_t2_round_up((uintptr_t)raw, KVT_T2_HUGE_BYTES);
	if (p > raw)
		munmap(raw, (size_t)(p - raw));
	munmap(p + n, KVT_T2_HUGE_BYTES - (size_t)(p - raw));
	(void)madvise(p, n, MADV_HUGEPAGE); /* advice only: fails where THP is not built in */
	*mapped = n;
	return p;
}

static void ctx_deinit(kvt_t2_ioctx *c)
{
	if (c->ring_ok) {
		if (c->fixed)
			io_uring_unregister_buffers(&c->ring);
		io_uring_queue_exit(&c->ring);
	}
	if (c->staging)
		munmap(c->staging, c->staging_bytes);
	free(c->scratch);
	free(c->jobs);
	free(c->free_slots);
	free(c->done_q);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
}

/* Allocate a context's buffers; in uring mode also its ring (-errno on refusal). */
static int ctx_init(kvt_t2_io *io, kvt_t2_ioctx *c, bool want_uring)
{
	const kvt_t2_io_cfg *cfg = &io->cfg;
	uint64_t fit = cfg->staging_cap / (2 * cfg->slot_bytes);
	c->io = io;
	c->depth = cfg->queue_depth < fit ? cfg->queue_depth : (fit ? (uint32_t)fit : 1);
	c->n_slots = 2 * c->depth;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	c->staging = arena_alloc((size_t)c->n_slots * cfg->slot_bytes, &c->staging_bytes);
	c->scratch = aligned_alloc(KVT_T2_UNIT_BYTES, cfg->slot_bytes);
	c->jobs = calloc(c->n_slots, sizeof(*c->jobs));
	c->free_slots = malloc(c->n_slots * sizeof(int));
	c->done_q = malloc((c->n_slots + 1) * sizeof(*c->done_q));
	if (!c->staging || !c->scratch || !c->jobs || !c->free_slots || !c->done_q)
		return -ENOMEM;
	for (uint32_t i = 0; i < c->n_slots; i++)
		c->free_slots[i] = (int)(c->n_slots - 1 - i);
	c->n_free = c->n_slots;
	if (!want_uring)
		return 0;
	int r = io_uring_queue_init(c->depth + 1, &c->ring, 0); /* + the intermediate sync */
	if (r < 0)
		return r;
	c->ring_ok = true;
	struct iovec iov = { c->staging, (size_t)c->n_slots * cfg->slot_bytes };
	r = io_uring_register_buffers(&c->ring, &iov, 1);
	if (r == 0)
		c->fixed = true;
	else if (c == &io->ctxs[0])
		KVT_LOGW("t2: io_uring_register_buffers failed (%s); using unregistered buffers", strerror(-r));
	return 0;
}

int kvt_t2_io_create(const kvt_t2_io_cfg *cfg, kvt_t2_io **out)
{
	kvt_t2_io *io = calloc(1, sizeof(*io));
	if (!io)
		return KVT_ENOMEM;
	io->cfg = *cfg;
	io->n_ctx = cfg->n_ctx;
	pthread_mutex_init(&io->mu, NULL);
	pthread_cond_init(&io->cv, NULL);
	pthread_mutex_init(&io->qmu, NULL);
	pthread_cond_init(&io->qcv, NULL);
	io->ctxs = calloc(io->n_ctx, sizeof(*io->ctxs));
	if (!io->ctxs) {
		kvt_t2_io_destroy(io);
		return KVT_ENOMEM;
	}

	bool want_uring = cfg->mode != KVT_T2_IO_THREADS;
	int refused = 0;
	if (want_uring && cfg->ops->uring_setup) {
		int r = cfg->ops->uring_setup(cfg->ops->ctx);
		if (r < 0)
			refused = r;
	}
	for (uint32_t i = 0; i < io->n_ctx; i++) {
		int r = ctx_init(io, &io->ctxs[i], want_uring && !refused);
		if (r == -ENOMEM) {
			kvt_t2_io_destroy(io);
			return KVT_ENOMEM;
		}
		if (r < 0 && !refused)
			refused = r;
	}
	if (want_uring && refused) {
		if (cfg->mode == KVT_T2_IO_URING) {
			KVT_LOGE("t2: io_uring_setup refused (%s) and io_mode requires io_uring", strerror(-refused));
			kvt_t2_io_destroy(io);
			return KVT_EUNSUPPORTED;
		}
		KVT_LOGW("t2: io_uring_setup refused (%s); using the pread/pwrite thread pool", strerror(-refused));
		for (uint32_t i = 0; i < io->n_ctx; i++) {
			kvt_t2_ioctx *c = &io->ctxs[i];
			if (c->ring_ok) {
				if (c->fixed)
					io_uring_unregister_buffers(&c->ring);
				io_uring_queue_exit(&c->ring);
				c->ring_ok = c->fixed = false;
			}
		}
	}
	io->uring = want_uring && !refused;
	if (!io->uring) {
		uint32_t depth_sum = 0;
		for (uint32_t i = 0; i < io->n_ctx; i++)
			depth_sum += io->ctxs[i].depth + 1;
		io->q_cap = depth_sum;
		io->queue = malloc(io->q_cap * sizeof(*io->queue));
		io->n_threads = io->ctxs[0].depth < 16 ? io->ctxs[0].depth : 16;
		if (io->n_threads < 2)
			io->n_threads = 2;
		io->threads = calloc(io->n_threads, sizeof(pthread_t));
		if (!io->queue || !io->threads) {
			io->n_threads = 0;
			kvt_t2_io_destroy(io);
			return KVT_ENOMEM;
		}
		for (uint32_t i = 0; i < io->n_threads; i++) {
			if (pthread_create(&io->threads[i], NULL, worker, io) != 0) {
				io->n_threads = i;
				KVT_LOGE("t2: cannot start I/O thread %u", i);
				kvt_t2_io_destroy(io);
				return KVT_ENOMEM;
			}
		}
	}
	*out = io;
	return KVT_OK;
}

void kvt_t2_io_destroy(kvt_t2_io *io)
{
	if (!io)
		return;
	pthread_mutex_lock(&io->qmu);
	io->stop = true;
	pthread_cond_broadcast(&io->qcv);
	pthread_mutex_unlock(&io->qmu);
	for (uint32_t i = 0; i < io->n_threads; i++)
		pthread_join(io->threads[i], NULL);
	free(io->threads);
	free(io->queue);
	if (io->ctxs)
		for (uint32_t i = 0; i < io->n_ctx; i++)
			ctx_deinit(&io->ctxs[i]);
	free(io->ctxs);
	pthread_mutex_destroy(&io->mu);
	pthread_cond_destroy(&io->cv);
	pthread_mutex_destroy(&io->qmu);
	pthread_cond_destroy(&io->qcv);
	free(io);
}

bool kvt_t2_io_uring(const kvt_t2_io *io)
{
	return io->uring;
}

kvt_t2_ioctx *kvt_t2_io_acquire(kvt_t2_io *io)
{
	pthread_mutex_lock(&io->mu);
	for (;;) {
		for (uint32_t i = 0; i < io->n_ctx; i++) {
			if (!io->ctxs[i].busy) {
				io->ctxs[i].busy = true;
				pthread_mutex_unlock(&io->mu);
				return &io->ctxs[i];
			}
		}
		pthread_cond_wait(&io->cv, &io->mu);
	}
}

void kvt_t2_io_release(kvt_t2_io *io, kvt_t2_ioctx *c)
{
	pthread_mutex_lock(&io->mu);
	c->busy = false;
	pthread_cond_signal(&io->cv);
	pthread_mutex_unlock(&io->mu);
}

uint8_t *kvt_t2_ioctx_scratch(kvt_t2_ioctx *c)
{
	return c->scratch;
}

/* Queue the (rest of the) transfer of j on c's ring. */
static void uring_queue(kvt_t2_ioctx *c, kvt_t2_job *j)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);
	if (!sqe) { /* cannot happen: at most depth jobs in flight on a depth-entry ring */
		io_uring_submit(&c->ring);
		sqe = io_uring_get_sqe(&c->ring);
		KVT_ASSERT(sqe);
	}
	if (j->is_sync) {
		io_uring_prep_fsync(sqe, c->io->cfg.fd, IORING_FSYNC_DATASYNC);
		io_uring_sqe_set_data(sqe, j);
		return;
	}
	uint8_t *p = j->buf + j->done;
	unsigned len = (unsigned)(j->n - j->done);
	off_t off = (off_t)(j->off + j->done);
	if (c->fixed) {
		if (j->is_write)
			io_uring_prep_write_fixed(sqe, c->io->cfg.fd, p, len, off, 0);
		else
			io_uring_prep_read_fixed(sqe, c->io->cfg.fd, p, len, off, 0);
	} else {
		if (j->is_write)
			io_uring_prep_write(sqe, c->io->cfg.fd, p, len, (uint64_t)off);
		else
			io_uring_prep_read(sqe, c->io->cfg.fd, p, len, (uint64_t)off);
	}
	io_uring_sqe_set_data(sqe, j);
}

/* Act on one io_uring completion; true when the job is finished (j->res set). */
static bool uring_complete(kvt_t2_ioctx *c, kvt_t2_job *j, int res)
{
	const kvt_t2_io_ops *ops = c->io->cfg.ops;
	if (ops->uring_result)
		res = ops->uring_result(ops->ctx, j->is_write, res, j->n - j->done, (off_t)(j->off + j->done));
	if (res == -EAGAIN || res == -EINTR) {
		if (++j->n_again >= KVT_T2_MAX_AGAIN) {
			j->res = res;
			return true;
		}
		if (j->n_again > 8)
			sleep_us(100);
		uring_queue(c, j);
		return false;
	}
	if (res < 0 || j->is_sync) {
		j->res = res < 0 ? res : 0;
		return true;
	}
	if (res == 0) {
		j->res = -EIO; /* end of file inside the transfer */
		return true;
	}
	if ((size_t)res > j->n - j->done) {
		j->res = -EIO; /* a completion larger than asked: treat as failed */
		return true;
	}
	j->done += (size_t)res;
	if (j->done < j->n) {
		uring_queue(c, j); /* short transfer: the rest */
		return false;
	}
	j->res = 0;
	return true;
}

/* Hand a job to the engine: onto the ring (submitted by the caller) or the pool's queue. */
static void post(kvt_t2_io *io, kvt_t2_ioctx *c, kvt_t2_job *j)
{
	if (io->uring) {
		uring_queue(c, j);
		return;
	}
	pthread_mutex_lock(&io->qmu);
	io->queue[(io->q_head + io->q_n) % io->q_cap] = j;
	io->q_n++;
	pthread_cond_signal(&io->qcv);
	pthread_mutex_unlock(&io->qmu);
}

static void submit(kvt_t2_io *io, kvt_t2_ioctx *c)
{
	int r;
	if (!io->uring)
		return;
	do
		r = io_uring_submit(&c->ring);
	while (r == -EINTR || r == -EAGAIN);
}

/* Prep and queue entries while fewer than depth I/Os are in flight and a slot is free. */
static void fill(kvt_t2_io *io, kvt_t2_ioctx *c, uint32_t n, const kvt_t2_batch_cb *cb, uint32_t *next,
		 uint32_t *inflight)
{
	size_t slot_bytes = io->cfg.slot_bytes;
	while (*next < n && *inflight < c->depth && c->n_free > 0) {
		int slot = c->free_slots[--c->n_free];
		kvt_t2_job *j = &c->jobs[slot];
		uint8_t *buf = c->staging + (size_t)slot * slot_bytes;
		memset(j, 0, sizeof(*j));
		j->slot = slot;
		j->idx = *next;
		if (!cb->prep(cb->ctx, (*next)++, buf, slot_bytes, j)) {
			c->free_slots[c->n_free++] = slot;
			continue;
		}
		j->buf = buf;
		(*inflight)++;
		post(io, c, j);
	}
	submit(io, c);
}

/* Queue the context's intermediate sync job. */
static void queue_sync(kvt_t2_io *io, kvt_t2_ioctx *c)
{
	kvt_t2_job *j = &c->sync_job;
	memset(j, 0, sizeof(*j));
	j->is_sync = true;
	j->is_write = true;
	j->slot = -1;
	post(io, c, j);
	submit(io, c);
}

int kvt_t2_io_run(kvt_t2_io *io, kvt_t2_ioctx *c, uint32_t n, const kvt_t2_batch_cb *cb)
{
	uint32_t next = 0, inflight = 0, since_sync = 0;
	bool sync_busy = false;
	int sync_err = 0;
	kvt_t2_job *fin[2049];

	for (;;) {
		fill(io, c, n, cb, &next, &inflight);
		if (!inflight)
			break;
		/* collect finished jobs (short ones are requeued, not finished) */
		uint32_t n_fin = 0;
		if (io->uring) {
			struct io_uring_cqe *cqe;
			int r;
			do
				r = io_uring_wait_cqe(&c->ring, &cqe);
			while (r == -EINTR);
			KVT_ASSERT(r == 0); /* only fails on a broken ring */
			unsigned head, seen = 0;
			io_uring_for_each_cqe(&c->ring, head, cqe) {
				kvt_t2_job *j = io_uring_cqe_get_data(cqe);
				seen++;
				if (uring_complete(c, j, cqe->res))
					fin[n_fin++] = j;
			}
			io_uring_cq_advance(&c->ring, seen);
		} else {
			pthread_mutex_lock(&c->mu);
			while (!c->n_done)
				pthread_cond_wait(&c->cv, &c->mu);
			n_fin = c->n_done;
			memcpy(fin, c->done_q, n_fin * sizeof(*fin));
			c->n_done = 0;
			pthread_mutex_unlock(&c->mu);
		}
		inflight -= n_fin;
		/* keep the device busy with the spare slots, then do the CPU work */
		fill(io, c, n, cb, &next, &inflight);
		for (uint32_t i = 0; i < n_fin; i++) {
			if (fin[i]->is_sync) {
				sync_busy = false;
				if (fin[i]->res && !sync_err)
					sync_err = fin[i]->res;
				continue;
			}
			since_sync += fin[i]->res == 0;
			cb->done(cb->ctx, fin[i]);
			c->free_slots[c->n_free++] = fin[i]->slot;
		}
		/* writes still to come: flush what has landed so far, in the background */
		if (cb->sync_every && !sync_busy && since_sync >= cb->sync_every && next < n) {
			queue_sync(io, c);
			sync_busy = true;
			since_sync = 0;
			inflight++;
		}
	}
	return sync_err;
}

/* ---- the real syscalls, as the default ops ---- */
static ssize_t real_pread(void *ctx, int fd, void *buf, size_t n, off_t off) { return pread(fd, buf, n, off); }
static ssize_t real_pwrite(void *ctx, int fd, const void *buf, size_t n, off_t off) { return pwrite(fd, buf, n, off); }
static int real_fdatasync(void *ctx, int fd) { return fdatasync(fd); }
static int real_fallocate(void *ctx, int fd, off_t off, off_t len) { return fallocate(fd, 0, off, len); }

void kvt_t2_io_ops_resolve(const kvt_t2_io_ops *o, kvt_t2_io_ops *out)
{
	out->pread = o && o->pread ? o->pread : real_pread;
	out->pwrite = o && o->pwrite ? o->pwrite : real_pwrite;
	out->fdatasync = o && o->fdatasync ? o->fdatasync : real_fdatasync;
	out->fallocate = o && o->fallocate ? o->fallocate : real_fallocate;
	out->uring_setup = o ? o->uring_setup : NULL;
	out->uring_result = o ? o->uring_result : NULL;
	out->ctx = o ? o->ctx : NULL;
}

uint64_t kvt_t2_io_blockdev_bytes(int fd)
{
	uint64_t n = 0;
	if (ioctl(fd, BLKGETSIZE64, &n) != 0)
		return 0;
	return n;
}
