/*
 * tests/cuemu/include/cuemu.h — the CPU emulator of the CUDA subset that
 * the files of gpu/cuda/ use: kernel-side builtins, the launch template and the
 * runtime declarations. Compiled with the host C++ compiler (C++17), x86-64.
 *
 * Design. A launch runs the grid at once on the calling host thread, one
 * block after another (blockIdx.x fastest); launches from several host
 * threads are serialized by one global mutex, so one block exists at a time.
 * Each CUDA thread of the block is a fiber (its own stack; tests/cuemu/cuemu.cc
 * switches with a small assembly routine). A fiber runs until it exits, or
 * blocks at __syncthreads (a block barrier that exited threads do not hold up)
 * or at a warp shuffle (a warp barrier: the scheduler exchanges the values
 * once every lane of the warp has arrived). A shuffle with a non-full mask,
 * with an exited lane, lanes waiting at different shuffles, or a deadlock
 * aborts with the kernel name and each thread's wait site: real bugs on a GPU.
 *
 * __shared__ is `static`: one storage per kernel instantiation, correct
 * because one block runs at a time. The rewrite registers each such
 * variable (CUEMU_SHARED_REG) the first time a thread reaches it, for the
 * kernel then running; the runtime fills the running kernel's variables
 * with 0xff (NaN as float, -1 as int) before every block, so a read of
 * shared memory that no thread of the block wrote shows. Dynamic shared
 * memory is a per-launch buffer, filled the same way before every block.
 *
 * Invariant: only the scheduler's host thread touches the globals below
 * while a block runs (g_cur is the running fiber).
 *
 * NOTE: the real cuda_runtime_api.h is kept out by defining its include
 * guard (cuda_fp16.h pulls it in through vector_functions.h); the runtime
 * API lives in namespace cuemu_api, so nothing collides with libcudart.
 */
#ifndef CUEMU_H
#define CUEMU_H

#if !defined(__x86_64__)
#error "cuemu: x86-64 only (the fiber switch is x86-64 assembly)"
#endif

#include <builtin_types.h> /* real: vector_types, driver_types (cudaError_t, cudaDeviceProp) */
#include <library_types.h> /* real: cudaDataType */
#define __CUDA_RUNTIME_API_H__ /* keep the real extern "C" runtime declarations out */
#include <vector_functions.h>   /* real: make_float2, ... */

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- qualifiers (host_defines.h made __global__/__device__/__shared__ empty) ---- */
#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif

namespace cuemu {

/* One emulated CUDA thread. */
struct fiber {
	void *sp;           /* saved stack pointer while switched out */
	void *stack;        /* mmap'd stack, guard page at the bottom */
	uint3 tid;          /* threadIdx */
	int state;          /* RUN, AT_BARRIER, AT_SHFL, DONE */
	int line;           /* source line of the wait */
	int shfl_mode;      /* 0 idx, 1 up, 2 down, 3 xor */
	int shfl_b;         /* lane, delta or lane mask */
	int shfl_width;     /* segment width */
	uint32_t shfl_mask; /* member mask */
	uint64_t shfl_val;  /* deposited value bits */
	uint64_t shfl_out;  /* value received */
};

enum { RUN = 0, AT_BARRIER = 1, AT_SHFL = 2, DONE = 3 };

extern fiber *g_cur;   /* the running fiber */
extern uint3 g_block;  /* blockIdx */
extern dim3 g_bdim;    /* blockDim */
extern dim3 g_gdim;    /* gridDim */

void syncthreads(int line);
uint64_t shfl(uint32_t mask, uint64_t bits, int mode, int b, int width, int line);
void *dyn_smem();

/*
 * Stream capture (cudaStreamBeginCapture .. EndCapture): while a stream
 * captures, work issued on it is recorded instead of run (capture_add), and
 * cudaGraphLaunch runs the records in order. capturing() says whether st
 * captures now.
 */
bool capturing(cudaStream_t st);
void capture_add(cudaStream_t st, std::function<cudaError_t()> op);

/* Runs body(ctx) for every thread of the grid; returns a cudaError_t for a bad configuration. */
cudaError_t run_grid(const void *fn, const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t st,
		     void (*body)(void *), void *ctx);

template <class... P> struct launcher {
	void (*fn)(P...);
	const char *name;
	dim3 grid, block;
	size_t smem;
	cudaStream_t st;

	template <class... A> void operator()(A &&...args) const
	{
		static_assert(sizeof...(A) == sizeof...(P), "cuemu: wrong number of kernel arguments");
		/* converted once, as the launch copies them into the parameter space */
		struct ctx_t {
			void (*fn)(P...);
			std::tuple<std::decay_t<P>...> params;
		} ctx{ fn, std::tuple<std::decay_t<P>...>(static_cast<std::decay_t<P>>(std::forward<A>(args))...) };
		/* each thread gets its own copy of the parameters (they are locals on a GPU too) */
		auto body = [](void *p) {
			ctx_t *c = (ctx_t *)p;
			std::apply(c->fn, c->params);
		};
		if (capturing(st)) { /* the parameters as of now, replayed by every launch of the graph */
			auto held = std::make_shared<ctx_t>(ctx);
			const void *f = (const void *)fn;
			const char *nm = name;
			const dim3 g = grid, b = block;
			const size_t sm = smem;
			capture_add(st, [=]() { return run_grid(f, nm, g, b, sm, st, body, held.get()); });
			return;
		}
		run_grid((const void *)fn, name, grid, block, smem, st, body, &ctx);
	}
};

template <class... P>
launcher<P...> launch(void (*fn)(P...), const char *name, dim3 grid, dim3 block, size_t smem = 0,
		      cudaStream_t st = 0)
{
	return launcher<P...>{ fn, name, grid, block, smem, st };
}

template <class T> uint64_t to_bits(T v)
{
	static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "cuemu: shuffle of an unsupported type");
	uint64_t b = 0;
	memcpy(&b, &v, sizeof v);
	return b;
}

template <class T> T from_bits(uint64_t b)
{
	T v;
	memcpy(&v, &b, sizeof v);
	return v;
}

template <class T> T shfl_t(uint32_t mask, T v, int mode, int b, int width, int line)
{
	return from_bits<T>(shfl(mask, to_bits(v), mode, b, width, line));
}

void register_smem_limit(const void *fn, int bytes);
[[noreturn]] void misaligned(const void *p, size_t align);
bool shared_register(void *p, size_t bytes);

#define CUEMU_SHARED_REG(v) [[maybe_unused]] static const bool cuemu_reg_##v = cuemu::shared_register(&(v), sizeof(v))

} // namespace cuemu

/* ---- per-thread builtins ---- */
#define threadIdx (cuemu::g_cur->tid)
#define blockIdx (cuemu::g_block)
#define blockDim (cuemu::g_bdim)
#define gridDim (cuemu::g_gdim)
static constexpr int warpSize = 32;

#define __syncthreads() cuemu::syncthreads(__LINE__)
#define __shfl_sync(mask, v, lane, ...) cuemu::shfl_t((mask), (v), 0, (lane), cuemu_width(__VA_ARGS__), __LINE__)
#define __shfl_up_sync(mask, v, d, ...) cuemu::shfl_t((mask), (v), 1, (int)(d), cuemu_width(__VA_ARGS__), __LINE__)
#define __shfl_down_sync(mask, v, d, ...) cuemu::shfl_t((mask), (v), 2, (int)(d), cuemu_width(__VA_ARGS__), __LINE__)
#define __shfl_xor_sync(mask, v, m, ...) cuemu::shfl_t((mask), (v), 3, (int)(m), cuemu_width(__VA_ARGS__), __LINE__)
static inline int cuemu_width(int w = 32) { return w; }

/* A GPU faults on a vector load from an address its size does not divide; x86 would not. */
template <class T> static inline T __ldg(const T *p)
{
	if ((uintptr_t)p % alignof(T))
		cuemu::misaligned(p, alignof(T));
	return *p;
}

/* A load through L2 only (another CTA's store): as __ldg here; blocks run one at a time. */
template <class T> static inline T __ldcg(const T *p) { return __ldg(p); }
/* A memory fence: blocks and threads run one at a time, so every store is already visible. */
static inline void __threadfence(void) {}

/* Atomics: one emulated thread runs at a time, so read-modify-write is atomic. */
template <class T> static inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <class T> static inline T atomicSub(T *p, T v) { T o = *p; *p = o - v; return o; }
template <class T> static inline T atomicMin(T *p, T v) { T o = *p; *p = v < o ? v : o; return o; }
template <class T> static inline T atomicMax(T *p, T v) { T o = *p; *p = v > o ? v : o; return o; }
template <class T> static inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <class T> static inline T atomicCAS(T *p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }
template <class T> static inline T atomicOr(T *p, T v) { T o = *p; *p = o | v; return o; }
template <class T> static inline T atomicAnd(T *p, T v) { T o = *p; *p = o & v; return o; }

static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline int __float2int_rn(float f) { return (int)lrintf(f); } /* default mode: nearest even */
static inline int __float2int_rz(float f) { return (int)f; }

/* CUDA's integer/float min and max overloads (device math headers) */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

/* ---- runtime API (what gpu/cuda/ uses), C++ linkage in its own namespace ---- */
namespace cuemu_api {
cudaError_t cudaMalloc(void **p, size_t n);
template <class T> cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
template <class T> cudaError_t cudaHostAlloc(T **p, size_t n, unsigned flags) { return cudaHostAlloc((void **)p, n, flags); }
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
			      cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s = 0);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaGetLastError();
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaPeekAtLastError();
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cuemu_func_set_attribute(const void *fn, cudaFuncAttribute attr, int value);
template <class F> cudaError_t cudaFuncSetAttribute(F *fn, cudaFuncAttribute attr, int value)
{
	return cuemu_func_set_attribute((const void *)fn, attr, value);
}
/* Threads and shared memory of an sm_90 SM (2048 threads, 32 CTAs, 228 KiB); registers are not modelled. */
cudaError_t cuemu_occupancy(int *n_blocks, int block_threads, size_t smem);
template <class F>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n_blocks, F *fn, int block_threads, size_t smem)
{
	(void)fn;
	return cuemu_occupancy(n_blocks, block_threads, smem);
}
} // namespace cuemu_api
using namespace cuemu_api;

#endif /* CUEMU_H */
