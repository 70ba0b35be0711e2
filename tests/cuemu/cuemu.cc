/*
 * tests/cuemu/cuemu.cc — the CPU emulator's runtime: the fiber scheduler that
 * runs kernels (see include/cuemu.h for the execution model), device memory,
 * streams and events, and the reference cuBLAS.
 *
 * Fibers. One per CUDA thread of the largest block seen, each with a 64 KiB
 * stack and a guard page, made once and reused by every block of every
 * launch. A fiber loops: run the kernel body for the thread it is given,
 * mark itself DONE, switch back to the scheduler. The switch saves only the
 * callee-saved registers and rsp (cuemu_switch below): glibc swapcontext
 * would make a sigprocmask system call on every one of tens of millions of
 * switches.
 *
 * Scheduler, per block: run each warp's fibers until they block or exit,
 * releasing the warp whenever all its lanes wait at a shuffle (the scheduler
 * moves the values); then release the block barrier if every live thread
 * waits at it, else report a deadlock and abort (run_block).
 *
 * Memory. cudaMalloc is aligned_alloc(256); live allocations are tracked so
 * that copies are bounds-checked against them and frees of unknown pointers
 * fail. Streams do their work at issue time, so every event is complete.
 *
 * Graphs. A capturing stream records its launches, copies, memsets and
 * cuBLAS calls (parameters by value, as CUDA does) instead of running them;
 * a graph launch runs the records in order. As on a GPU, a capture fails
 * (cudaErrorStreamCaptureInvalidated at its end) when the host waits on the
 * stream meanwhile, and a captured copy to or from host memory must use
 * pinned memory (cudaHostAlloc), whose address the replays read again.
 */
#include "cuemu.h"
#include "cublas_v2.h"

#include <cuda_fp16.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <map>
#include <mutex>
#include <vector>

/* void cuemu_switch(void **save_sp, void *to_sp): SysV x86-64, callee-saved registers only. */
asm(R"(
	.text
	.globl cuemu_switch
	.hidden cuemu_switch
	.type cuemu_switch, @function
cuemu_switch:
	pushq %rbp
	pushq %rbx
	pushq %r12
	pushq %r13
	pushq %r14
	pushq %r15
	movq %rsp, (%rdi)
	movq %rsi, %rsp
	popq %r15
	popq %r14
	popq %r13
	popq %r12
	popq %rbx
	popq %rbp
	ret
	.size cuemu_switch, .-cuemu_switch

	.globl cuemu_fiber_entry
	.hidden cuemu_fiber_entry
	.type cuemu_fiber_entry, @function
cuemu_fiber_entry:
	movq %r12, %rdi
	callq *%r13
	ud2
	.size cuemu_fiber_entry, .-cuemu_fiber_entry
)");
extern "C" void cuemu_switch(void **save_sp, void *to_sp);
extern "C" void cuemu_fiber_entry(void);

namespace cuemu {

fiber *g_cur;
uint3 g_block;
dim3 g_bdim, g_gdim;

namespace {

const size_t STACK_BYTES = 64 * 1024, GUARD_BYTES = 4096;
const size_t SMEM_DEFAULT = 48 * 1024, SMEM_MAX = 227 * 1024;

std::mutex launch_mu;             /* one launch at a time, from any host thread */
std::vector<fiber *> fibers;      /* the pool, grown to the largest block */
void *sched_sp;                   /* the scheduler's saved stack pointer */
void (*cur_body)(void *);         /* the launch's per-thread body */
void *cur_ctx;                    /* and its argument */
const char *cur_name;             /* kernel name, for messages */
std::vector<unsigned char> smem;  /* dynamic shared memory of the launch */
size_t smem_bytes;                /* its size */

std::mutex err_mu;
cudaError_t last_error = cudaSuccess; /* cudaGetLastError's */

std::map<const void *, int> smem_limits; /* cudaFuncSetAttribute's max dynamic smem */
const void *cur_fn;                      /* the running kernel */

/* A __shared__ variable, registered by the first thread to reach it. */
struct shared_var {
	const void *fn; /* the kernel running then */
	void *p;        /* its storage */
	size_t bytes;   /* its size */
};
std::vector<shared_var> shared_vars;

void set_error(cudaError_t e)
{
	std::lock_guard<std::mutex> g(err_mu);
	if (last_error == cudaSuccess)
		last_error = e;
}

[[noreturn]] void fiber_main(fiber *f)
{
	for (;;) {
		cur_body(cur_ctx);
		f->state = DONE;
		cuemu_switch(&f->sp, sched_sp);
	}
}

fiber *fiber_new()
{
	fiber *f = new fiber();
	void *m = mmap(NULL, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		perror("cuemu: fiber stack");
		abort();
	}
	mprotect(m, GUARD_BYTES, PROT_NONE); /* an overflow faults instead of corrupting a neighbour */
	f->stack = m;
	/* initial frame popped by cuemu_switch: r15 r14 r13(fn) r12(arg) rbx rbp, then ret -> entry */
	uintptr_t top = ((uintptr_t)m + STACK_BYTES + GUARD_BYTES) & ~(uintptr_t)15;
	void **sp = (void **)(top - 16 - 7 * sizeof(void *));
	sp[0] = NULL;
	sp[1] = NULL;
	sp[2] = (void *)&fiber_main;
	sp[3] = f;
	sp[4] = NULL;
	sp[5] = NULL;
	sp[6] = (void *)&cuemu_fiber_entry;
	f->sp = sp;
	f->state = DONE;
	return f;
}

const char *state_name(int s)
{
	switch (s) {
	case RUN: return "runnable";
	case AT_BARRIER: return "__syncthreads";
	case AT_SHFL: return "shuffle";
	default: return "exited";
	}
}

/* Runs of threads in the same wait (state and line) print as one line. */
[[noreturn]] void die_block(unsigned n, const char *why)
{
	fprintf(stderr, "cuemu: kernel %s, block (%u,%u,%u) of grid (%u,%u,%u), %u threads: %s\n", cur_name, g_block.x,
		g_block.y, g_block.z, g_gdim.x, g_gdim.y, g_gdim.z, n, why);
	for (unsigned i = 0; i < n;) {
		const fiber *f = fibers[i];
		unsigned j = i + 1;
		while (j < n && fibers[j]->state == f->state && (f->state == DONE || f->state == RUN || fibers[j]->line == f->line))
			j++;
		if (f->state == DONE)
			fprintf(stderr, "  threads %u..%u: exited\n", i, j - 1);
		else if (f->state == RUN)
			fprintf(stderr, "  threads %u..%u: runnable (not yet at a wait)\n", i, j - 1);
		else
			fprintf(stderr, "  threads %u..%u: wait at %s, line %d\n", i, j - 1, state_name(f->state), f->line);
		i = j;
	}
	fflush(stderr);
	abort();
}

/* The lane a shuffle reads, per PTX shfl.sync (clamp c as CUDA's intrinsics set it). */
int shfl_src(int lane, int mode, int b, int width)
{
	const int seg = (32 - width) & 31;           /* segmask: c[12:8] */
	const int cval = mode == 1 ? 0 : 31;         /* .up clamps at the segment start */
	const int max_lane = (lane & seg) | (cval & ~seg), min_lane = lane & seg;
	int j;
	bool ok;
	switch (mode) {
	case 0: j = min_lane | (b & ~seg); ok = j <= max_lane; break;
	case 1: j = lane - b; ok = j >= max_lane; break;
	case 2: j = lane + b; ok = j <= max_lane; break;
	default: j = lane ^ b; ok = j <= max_lane; break;
	}
	return ok ? j : lane;
}

/* Release warp w0/32 if its lanes all wait at one shuffle (the values move now); returns whether it was. */
bool release_warp(unsigned n, unsigned w0)
{
	const unsigned lanes = n - w0 < 32 ? n - w0 : 32;
	unsigned at = 0, done = 0;
	for (unsigned l = 0; l < lanes; l++) {
		at += fibers[w0 + l]->state == AT_SHFL;
		done += fibers[w0 + l]->state == DONE;
	}
	if (!at || at + done < lanes)
		return false; /* others still run or wait at __syncthreads: the deadlock check catches that */
	if (done)
		die_block(n, "a shuffle with a full mask while a lane of the warp has exited");
	if (lanes < 32)
		die_block(n, "a full-mask shuffle in a partial warp");
	fiber *f0 = fibers[w0];
	for (unsigned l = 1; l < 32; l++) {
		fiber *f = fibers[w0 + l];
		if (f->line != f0->line || f->shfl_mode != f0->shfl_mode || f->shfl_width != f0->shfl_width)
			die_block(n, "lanes of a warp wait at different shuffles");
	}
	for (unsigned l = 0; l < 32; l++) {
		fiber *f = fibers[w0 + l];
		f->shfl_out = fibers[w0 + shfl_src((int)l, f->shfl_mode, f->shfl_b, f->shfl_width)]->shfl_val;
		f->state = RUN;
	}
	return true;
}

/*
 * One block. Each warp runs as far as it can (through its shuffles) before
 * the next one starts, so a warp gets far ahead of the others between two
 * __syncthreads: a missing barrier shows as a wrong result instead of
 * passing by luck. Even blocks take warps and lanes in ascending order, odd
 * blocks in descending order, so both orders of a race are tried.
 */
void run_block(unsigned n, bool reverse)
{
	for (unsigned i = 0; i < n; i++) {
		fiber *f = fibers[i];
		f->tid.x = i % g_bdim.x;
		f->tid.y = i / g_bdim.x % g_bdim.y;
		f->tid.z = i / (g_bdim.x * g_bdim.y);
		f->state = RUN;
	}
	if (smem_bytes)
		memset(smem.data(), 0xff, smem_bytes); /* uninitialised shared memory reads as NaN */
	for (const shared_var &v : shared_vars)
		if (v.fn == cur_fn)
			memset(v.p, 0xff, v.bytes);
	const unsigned n_warps = (n + 31) / 32;
	for (;;) {
		for (unsigned wi = 0; wi < n_warps; wi++) {
			const unsigned w0 = 32 * (reverse ? n_warps - 1 - wi : wi);
			const unsigned lanes = n - w0 < 32 ? n - w0 : 32;
			do {
				for (unsigned li = 0; li < lanes; li++) {
					fiber *f = fibers[w0 + (reverse ? lanes - 1 - li : li)];
					if (f->state == RUN) {
						g_cur = f;
						cuemu_switch(&sched_sp, f->sp);
					}
				}
			} while (release_warp(n, w0));
		}
		unsigned done = 0, at_bar = 0;
		for (unsigned i = 0; i < n; i++) {
			done += fibers[i]->state == DONE;
			at_bar += fibers[i]->state == AT_BARRIER;
		}
		if (done == n)
			return;
		if (at_bar && at_bar + done == n) {
			for (unsigned i = 0; i < n; i++)
				if (fibers[i]->state == AT_BARRIER)
					fibers[i]->state = RUN;
			continue;
		}
		die_block(n, "deadlock: no thread can run");
	}
}

} // namespace

void misaligned(const void *p, size_t align)
{
	fprintf(stderr, "cuemu: kernel %s, block (%u,%u,%u), thread (%u,%u,%u): a %zu-byte load from %p, not %zu-byte aligned\n",
		cur_name, g_block.x, g_block.y, g_block.z, g_cur->tid.x, g_cur->tid.y, g_cur->tid.z, align, p, align);
	fflush(stderr);
	abort();
}

void syncthreads(int line)
{
	fiber *f = g_cur;
	f->state = AT_BARRIER;
	f->line = line;
	cuemu_switch(&f->sp, sched_sp);
}

uint64_t shfl(uint32_t mask, uint64_t bits, int mode, int b, int width, int line)
{
	fiber *f = g_cur;
	f->line = line;
	if (mask != 0xffffffffu || width < 1 || width > 32 || (width & (width - 1))) {
		f->state = AT_SHFL;
		unsigned n = g_bdim.x * g_bdim.y * g_bdim.z;
		char why[128];
		snprintf(why, sizeof why, "shuffle with mask 0x%08x width %d (the emulator takes full masks, widths 2^k <= 32)",
			 mask, width);
		die_block(n, why);
	}
	f->state = AT_SHFL;
	f->shfl_mode = mode;
	f->shfl_b = b & 31;
	f->shfl_width = width;
	f->shfl_mask = mask;
	f->shfl_val = bits;
	cuemu_switch(&f->sp, sched_sp);
	return f->shfl_out;
}

void *dyn_smem() { return smem_bytes ? smem.data() : NULL; }

bool shared_register(void *p, size_t bytes)
{
	/* runs inside a fiber, under launch_mu held by run_grid */
	memset(p, 0xff, bytes); /* this block's first thread is here before any use */
	shared_vars.push_back(shared_var{ cur_fn, p, bytes });
	return true;
}

void register_smem_limit(const void *fn, int bytes)
{
	std::lock_guard<std::mutex> g(launch_mu);
	smem_limits[fn] = bytes;
}

cudaError_t run_grid(const void *fn, const char *name, dim3 grid, dim3 block, size_t smem_n, cudaStream_t st,
		     void (*body)(void *), void *ctx)
{
	(void)st; /* work happens at issue time on every stream */
	const uint64_t n = (uint64_t)block.x * block.y * block.z;
	if (!n || n > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || !grid.x || !grid.y || !grid.z ||
	    grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
		fprintf(stderr, "cuemu: kernel %s: invalid configuration grid (%u,%u,%u) block (%u,%u,%u)\n", name,
			grid.x, grid.y, grid.z, block.x, block.y, block.z);
		set_error(cudaErrorInvalidConfiguration);
		return cudaErrorInvalidConfiguration;
	}
	std::lock_guard<std::mutex> g(launch_mu);
	size_t limit = SMEM_DEFAULT;
	auto it = smem_limits.find(fn);
	if (it != smem_limits.end())
		limit = (size_t)it->second;
	if (smem_n > limit || smem_n > SMEM_MAX) {
		fprintf(stderr, "cuemu: kernel %s: %zu bytes of dynamic shared memory over the limit of %zu\n", name,
			smem_n, limit < SMEM_MAX ? limit : SMEM_MAX);
		set_error(cudaErrorInvalidValue);
		return cudaErrorInvalidValue;
	}
	while (fibers.size() < n)
		fibers.push_back(fiber_new());
	if (smem.size() < smem_n)
		smem.resize(smem_n);
	smem_bytes = smem_n;
	cur_body = body;
	cur_ctx = ctx;
	cur_name = name;
	cur_fn = fn;
	g_gdim = grid;
	g_bdim = block;
	for (unsigned z = 0; z < grid.z; z++)
		for (unsigned y = 0; y < grid.y; y++)
			for (unsigned x = 0; x < grid.x; x++) {
				g_block.x = x;
				g_block.y = y;
				g_block.z = z;
				run_block((unsigned)n, (x + y + z) % 2);
			}
	g_cur = NULL;
	return cudaSuccess;
}

} // namespace cuemu

/* ---- runtime API ---- */

struct CUstream_st {
	/* work runs at issue time, unless the stream captures: */
	std::vector<std::function<cudaError_t()>> *cap; /* the records, while capturing */
	bool cap_invalid;                               /* the capture was broken (a host wait) */
};
struct CUgraph_st {
	std::vector<std::function<cudaError_t()>> ops; /* in issue order */
};
struct CUgraphExec_st {
	std::vector<std::function<cudaError_t()>> ops;
};

namespace cuemu {
bool capturing(cudaStream_t st) { return st && st->cap; }
void capture_add(cudaStream_t st, std::function<cudaError_t()> op) { st->cap->push_back(std::move(op)); }
} // namespace cuemu
struct CUevent_st {
	int unused; /* every event is complete */
};
struct cuemu_blas {
	cudaStream_t stream; /* recorded, not needed */
	int math_mode;       /* recorded: the reference GEMM is always plain fp32/double */
};

namespace cuemu_api {
namespace {

const size_t DEVICE_BYTES = (size_t)8 << 30; /* the emulated device's memory */

struct alloc_table {
	std::mutex mu;
	std::map<uintptr_t, size_t> live; /* start -> bytes */
	size_t total = 0;                 /* device bytes in use */
};
alloc_table dev_mem, host_mem;

cudaError_t fail(cudaError_t e)
{
	cuemu::set_error(e);
	return e;
}

/* Is [p, p + n) inside one live allocation of t? */
bool inside(alloc_table &t, const void *p, size_t n)
{
	std::lock_guard<std::mutex> g(t.mu);
	auto it = t.live.upper_bound((uintptr_t)p);
	if (it == t.live.begin())
		return false;
	--it;
	return (uintptr_t)p - it->first + n <= it->second;
}

cudaError_t track_alloc(alloc_table &t, void **p, size_t n, size_t cap)
{
	if (!p)
		return fail(cudaErrorInvalidValue);
	*p = NULL;
	if (n == 0)
		return cudaSuccess;
	std::lock_guard<std::mutex> g(t.mu);
	if (n > cap || t.total + n > cap)
		return fail(cudaErrorMemoryAllocation);
	void *m = aligned_alloc(256, (n + 255) & ~(size_t)255);
	if (!m)
		return fail(cudaErrorMemoryAllocation);
	t.live[(uintptr_t)m] = n;
	t.total += n;
	*p = m;
	return cudaSuccess;
}

cudaError_t track_free(alloc_table &t, void *p)
{
	if (!p)
		return cudaSuccess;
	std::lock_guard<std::mutex> g(t.mu);
	auto it = t.live.find((uintptr_t)p);
	if (it == t.live.end()) {
		fprintf(stderr, "cuemu: free of %p, not a live allocation\n", p);
		return fail(cudaErrorInvalidValue);
	}
	t.total -= it->second;
	t.live.erase(it);
	free(p);
	return cudaSuccess;
}

bool is_dev(const void *p, size_t n) { return inside(dev_mem, p, n); }
bool is_pinned(const void *p, size_t n) { return inside(host_mem, p, n); }

} // namespace

cudaError_t cudaMalloc(void **p, size_t n) { return track_alloc(dev_mem, p, n, DEVICE_BYTES); }
cudaError_t cudaFree(void *p) { return track_free(dev_mem, p); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
	(void)flags;
	return track_alloc(host_mem, p, n, (size_t)64 << 30);
}
cudaError_t cudaFreeHost(void *p) { return track_free(host_mem, p); }

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
	if (!n)
		return cudaSuccess;
	bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
	bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
	if ((dst_dev && !is_dev(dst, n)) || (src_dev && !is_dev(src, n))) {
		fprintf(stderr, "cuemu: memcpy kind %d of %zu bytes %p -> %p: a device side is outside every allocation\n",
			(int)kind, n, src, dst);
		return fail(cudaErrorInvalidValue);
	}
	memmove(dst, src, n);
	return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s)
{
	if (cuemu::capturing(s)) {
		const bool dst_host = !is_dev(dst, n), src_host = !is_dev(src, n);
		if ((dst_host && !is_pinned(dst, n)) || (src_host && !is_pinned(src, n))) {
			fprintf(stderr, "cuemu: captured memcpy of %zu bytes %p -> %p: host memory that is not pinned\n", n,
				src, dst);
			s->cap_invalid = true;
			return fail(cudaErrorStreamCaptureUnsupported);
		}
		cuemu::capture_add(s, [=]() { return cudaMemcpy(dst, src, n, kind); });
		return cudaSuccess;
	}
	return cudaMemcpy(dst, src, n, kind);
}
/* Row by row, each checked (and captured) as cudaMemcpyAsync checks one copy; pitches as CUDA requires. */
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
			      cudaMemcpyKind kind, cudaStream_t s)
{
	if (height > 1 && (dpitch < width || spitch < width))
		return fail(cudaErrorInvalidPitchValue);
	for (size_t r = 0; r < height; r++) {
		cudaError_t e = cudaMemcpyAsync((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind, s);
		if (e != cudaSuccess)
			return e;
	}
	return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t n)
{
	if (n && !is_dev(p, n))
		return fail(cudaErrorInvalidValue);
	memset(p, v, n);
	return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
	if (cuemu::capturing(s)) {
		cuemu::capture_add(s, [=]() { return cudaMemset(p, v, n); });
		return cudaSuccess;
	}
	return cudaMemset(p, v, n);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	(void)flags;
	*s = new CUstream_st();
	return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	if (s)
		delete s->cap;
	delete s;
	return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	if (cuemu::capturing(s)) { /* not allowed on a GPU: it breaks the capture */
		fprintf(stderr, "cuemu: cudaStreamSynchronize on a capturing stream\n");
		s->cap_invalid = true;
		return fail(cudaErrorStreamCaptureUnsupported);
	}
	return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
	(void)mode;
	if (!s || s->cap)
		return fail(cudaErrorIllegalState);
	s->cap = new std::vector<std::function<cudaError_t()>>();
	s->cap_invalid = false;
	return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
	if (!s || !s->cap)
		return fail(cudaErrorIllegalState);
	std::unique_ptr<std::vector<std::function<cudaError_t()>>> ops(s->cap);
	s->cap = NULL;
	*g = NULL;
	if (s->cap_invalid)
		return fail(cudaErrorStreamCaptureInvalidated);
	*g = new CUgraph_st();
	(*g)->ops = std::move(*ops);
	return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status)
{
	*status = cuemu::capturing(s) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
	return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags)
{
	(void)flags;
	if (!g)
		return fail(cudaErrorInvalidValue);
	*exec = new CUgraphExec_st();
	(*exec)->ops = g->ops;
	return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
	if (!exec)
		return fail(cudaErrorInvalidValue);
	if (cuemu::capturing(s)) /* a graph inside a capture: not used by the backend */
		return fail(cudaErrorStreamCaptureUnsupported);
	for (auto &op : exec->ops) {
		cudaError_t e = op();
		if (e != cudaSuccess)
			return e;
	}
	return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
	delete exec;
	return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
	delete g;
	return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
	(void)s;
	(void)flags;
	return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
	(void)flags;
	*e = new CUevent_st();
	return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	delete e;
	return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	(void)s;
	return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle); }
cudaError_t cudaEventQuery(cudaEvent_t e) { return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle); }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaGetDeviceCount(int *n)
{
	*n = 1;
	return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev)
{
	if (dev != 0)
		return fail(cudaErrorInvalidDevice);
	memset(p, 0, sizeof *p);
	snprintf(p->name, sizeof p->name, "cuemu (CPU emulation)");
	p->totalGlobalMem = DEVICE_BYTES;
	p->multiProcessorCount = 4; /* small, but flash-decoding still splits */
	p->major = 9;
	p->minor = 0;
	p->warpSize = 32;
	p->maxThreadsPerBlock = 1024;
	p->sharedMemPerBlock = 48 * 1024;
	p->sharedMemPerBlockOptin = 227 * 1024;
	return cudaSuccess;
}

cudaError_t cudaGetLastError()
{
	std::lock_guard<std::mutex> g(cuemu::err_mu);
	cudaError_t e = cuemu::last_error;
	cuemu::last_error = cudaSuccess;
	return e;
}
cudaError_t cudaPeekAtLastError()
{
	std::lock_guard<std::mutex> g(cuemu::err_mu);
	return cuemu::last_error;
}

const char *cudaGetErrorName(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "cudaSuccess";
	case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
	case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
	case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
	case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
	case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
	case cudaErrorNotReady: return "cudaErrorNotReady";
	case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
	case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
	case cudaErrorIllegalState: return "cudaErrorIllegalState";
	default: return "cudaErrorUnknown (cuemu)";
	}
}
const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorNotReady: return "device not ready";
	case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
	case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
	case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
	default: return "unknown error (cuemu)";
	}
}

cudaError_t cuemu_func_set_attribute(const void *fn, cudaFuncAttribute attr, int value)
{
	if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
		return cudaSuccess; /* preferences only */
	if (value < 0 || (size_t)value > 227 * 1024)
		return fail(cudaErrorInvalidValue);
	cuemu::register_smem_limit(fn, value);
	return cudaSuccess;
}

cudaError_t cuemu_occupancy(int *n_blocks, int block_threads, size_t smem)
{
	if (!n_blocks || block_threads < 1 || block_threads > 1024)
		return fail(cudaErrorInvalidValue);
	int n = 2048 / block_threads < 32 ? 2048 / block_threads : 32;
	if (smem) { /* 1 KiB reserved per CTA, as on sm_80+ */
		const int by_smem = (int)((size_t)228 * 1024 / (smem + 1024));
		n = by_smem < n ? by_smem : n;
	}
	*n_blocks = n;
	return cudaSuccess;
}

/* ---- cuBLAS: a reference GEMM ---- */

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
	*h = new cuemu_blas();
	return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h)
{
	delete h;
	return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	h->stream = s;
	return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	h->math_mode = (int)mode;
	return CUBLAS_STATUS_SUCCESS;
}

namespace {

/*
 * C (m x n, ldc) = alpha op(A) op(B) + beta C, column-major: element (i, j) of
 * a matrix X with leading dimension ldx is X[i + j * ldx]; op(A) is m x k, so
 * A is m x k (lda >= m) for OP_N and k x m (lda >= k) for OP_T; op(B) is k x n.
 * beta == 0 does not read C (it may hold NaN), as BLAS specifies.
 */
template <class TA, class TB, class LA, class LB>
cublasStatus_t gemm_ref(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
			const TA *A, int lda, const TB *B, int ldb, float beta, float *C, int ldc, LA load_a, LB load_b)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (m < 0 || n < 0 || k < 0 || (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T && ta != CUBLAS_OP_C) ||
	    (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T && tb != CUBLAS_OP_C) || lda < (ta == CUBLAS_OP_N ? (m > 1 ? m : 1) : (k > 1 ? k : 1)) ||
	    ldb < (tb == CUBLAS_OP_N ? (k > 1 ? k : 1) : (n > 1 ? n : 1)) || ldc < (m > 1 ? m : 1))
		return CUBLAS_STATUS_INVALID_VALUE;
	if (!m || !n)
		return CUBLAS_STATUS_SUCCESS;
	/* device pointers: each operand must lie inside one allocation */
	const size_t a_cols = ta == CUBLAS_OP_N ? (size_t)k : (size_t)m, b_cols = tb == CUBLAS_OP_N ? (size_t)n : (size_t)k;
	const size_t a_rows = ta == CUBLAS_OP_N ? (size_t)m : (size_t)k, b_rows = tb == CUBLAS_OP_N ? (size_t)k : (size_t)n;
	if ((k && (!is_dev(A, ((a_cols - 1) * lda + a_rows) * sizeof(TA)) || !is_dev(B, ((b_cols - 1) * ldb + b_rows) * sizeof(TB)))) ||
	    !is_dev(C, (((size_t)n - 1) * ldc + m) * sizeof(float))) {
		fprintf(stderr, "cuemu: cuBLAS gemm operand outside device memory\n");
		return CUBLAS_STATUS_EXECUTION_FAILED;
	}
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			double s = 0.0;
			for (int l = 0; l < k; l++) {
				double a = ta == CUBLAS_OP_N ? load_a(A[i + (size_t)l * lda]) : load_a(A[l + (size_t)i * lda]);
				double b = tb == CUBLAS_OP_N ? load_b(B[l + (size_t)j * ldb]) : load_b(B[j + (size_t)l * ldb]);
				s += a * b;
			}
			float *c = C + i + (size_t)j * ldc;
			*c = beta == 0.0f ? (float)(alpha * s) : (float)(alpha * s + (double)beta * *c);
		}
	return CUBLAS_STATUS_SUCCESS;
}

double f32_load(float x) { return x; }
double f16_load(__half x) { return __half2float(x); }

} // namespace

/* A cuBLAS call on a capturing stream: recorded, scalars by value (host pointer mode). */
#define CUEMU_BLAS_CAPTURE(h, call)                                                                     \
	do {                                                                                            \
		if (h && cuemu::capturing(h->stream)) {                                                 \
			cuemu::capture_add(h->stream, [=]() {                                           \
				return call == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;  \
			});                                                                             \
			return CUBLAS_STATUS_SUCCESS;                                                   \
		}                                                                                       \
	} while (0)

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
			   const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
			   float *C, int ldc)
{
	const float al = *alpha, be = *beta;
	CUEMU_BLAS_CAPTURE(h, gemm_ref(h, ta, tb, m, n, k, al, A, lda, B, ldb, be, C, ldc, f32_load, f32_load));
	return gemm_ref(h, ta, tb, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc, f32_load, f32_load);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
			    const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
			    cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
			    cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
	(void)algo;
	if ((compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC) || Ctype != CUDA_R_32F ||
	    Atype != Btype || (Atype != CUDA_R_16F && Atype != CUDA_R_32F))
		return CUBLAS_STATUS_NOT_SUPPORTED; /* only the combinations the backend uses */
	const float al = *(const float *)alpha, be = *(const float *)beta; /* compute 32F: float scalars */
	if (Atype == CUDA_R_16F)
		CUEMU_BLAS_CAPTURE(h, gemm_ref(h, ta, tb, m, n, k, al, (const __half *)A, lda, (const __half *)B, ldb, be,
					       (float *)C, ldc, f16_load, f16_load));
	else
		CUEMU_BLAS_CAPTURE(h, gemm_ref(h, ta, tb, m, n, k, al, (const float *)A, lda, (const float *)B, ldb, be,
					       (float *)C, ldc, f32_load, f32_load));
	if (Atype == CUDA_R_16F)
		return gemm_ref(h, ta, tb, m, n, k, al, (const __half *)A, lda, (const __half *)B, ldb, be, (float *)C,
				ldc, f16_load, f16_load);
	return gemm_ref(h, ta, tb, m, n, k, al, (const float *)A, lda, (const float *)B, ldb, be, (float *)C, ldc,
			f32_load, f32_load);
}

} // namespace cuemu_api
