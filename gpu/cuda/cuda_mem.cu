/*
 * gpu/cuda/cuda_mem.cu — the CUDA backend's memory, copies, streams, events
 * and graphs: no kernels, only the runtime calls behind them and the counters
 * (cuda_int.cuh: count_copy, count_launch) that dev.h reports.
 *
 * Copies. copy_h2d and copy_d2h run on the compute stream and wait for it
 * before returning (the caller may reuse host memory at once); such a wait
 * refuses to run inside a graph capture (no_wait_in_capture) and fails the
 * capture. copy_d2d is ordered on the compute stream and does not wait.
 * copy_async and copy_2d_async only enqueue, on the stream given (NULL: the
 * compute stream).
 *
 * Graphs. capture_begin..capture_end records the compute stream's work in
 * thread-local mode (other threads go on using their own streams); what the
 * captured ops counted (kernels, copies, bytes) is kept with the graph and
 * added to the counters on every replay: its kernels as graph_kernels, its
 * copies and bytes as an eager run's would be.
 */
#include "cuda_int.cuh"

/* ---- memory, copies, streams, events ---- */

void kvt_cuda_destroy(kvt_dev *d)
{
	cuda_dev *c = C(d);
	if (c->blas)
		cublasDestroy(c->blas);
	if (c->d_flag)
		cudaFree(c->d_flag);
	if (c->d_tickets)
		cudaFree(c->d_tickets);
	if (c->stream) {
		cudaStreamSynchronize(c->stream);
		cudaStreamDestroy(c->stream);
	}
	free(c);
}

bool kvt_cuda_supports_dtype(const kvt_dev *d, int dtype)
{
	return dtype == KVT_DTYPE_F32 || dtype == KVT_DTYPE_F16 || is_kept_quant(dtype);
}

int kvt_cuda_alloc(kvt_dev *d, size_t n, void **out)
{
	int rc = CU(cudaMalloc(out, n));
	if (rc == KVT_ENOMEM)
		KVT_LOGE("cuda: cannot allocate %zu bytes of device memory", n);
	return rc;
}

void kvt_cuda_free(kvt_dev *d, void *p) { CU(cudaFree(p)); }

static int cuda_copy_sync(kvt_dev *d, void *dst, const void *src, size_t n, int dir)
{
	int rc = no_wait_in_capture(d, dir == KVT_COPY_H2D ? "copy_h2d" : "copy_d2h");
	if (rc)
		return rc;
	count_copy(d, C(d)->stream, dir, n);
	rc = CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, C(d)->stream));
	return rc ? rc : host_wait(d, C(d)->stream);
}

int kvt_cuda_copy_h2d(kvt_dev *d, void *dst, const void *src, size_t n)
{
	return cuda_copy_sync(d, dst, src, n, KVT_COPY_H2D);
}

int kvt_cuda_copy_d2h(kvt_dev *d, void *dst, const void *src, size_t n)
{
	return cuda_copy_sync(d, dst, src, n, KVT_COPY_D2H);
}

int kvt_cuda_copy_d2d(kvt_dev *d, void *dst, const void *src, size_t n)
{
	count_copy(d, C(d)->stream, KVT_COPY_D2D, n);
	return CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, C(d)->stream));
}

int kvt_cuda_sync(kvt_dev *d)
{
	int rc = no_wait_in_capture(d, "sync");
	return rc ? rc : host_wait(d, C(d)->stream);
}

int kvt_cuda_host_alloc(kvt_dev *d, size_t n, void **out)
{
	int rc = CU(cudaHostAlloc(out, n, cudaHostAllocPortable));
	if (rc == KVT_ENOMEM)
		KVT_LOGE("cuda: cannot allocate %zu bytes of pinned host memory", n);
	return rc;
}

void kvt_cuda_host_free(kvt_dev *d, void *p) { CU(cudaFreeHost(p)); }

int kvt_cuda_stream_create(kvt_dev *d, kvt_stream **out)
{
	kvt_stream *s = (kvt_stream *)calloc(1, sizeof *s);
	if (!s)
		return KVT_ENOMEM;
	int rc = CU(cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking));
	if (rc) {
		free(s);
		return rc;
	}
	*out = s;
	return KVT_OK;
}

void kvt_cuda_stream_destroy(kvt_dev *d, kvt_stream *s)
{
	host_wait(d, s->s);
	CU(cudaStreamDestroy(s->s));
	free(s);
}

int kvt_cuda_stream_sync(kvt_dev *d, kvt_stream *s)
{
	int rc = s ? KVT_OK : no_wait_in_capture(d, "stream_sync");
	return rc ? rc : host_wait(d, S(d, s));
}

int kvt_cuda_event_create(kvt_dev *d, kvt_event **out)
{
	kvt_event *e = (kvt_event *)calloc(1, sizeof *e);
	if (!e)
		return KVT_ENOMEM;
	int rc = CU(cudaEventCreateWithFlags(&e->e, cudaEventDisableTiming));
	if (rc) {
		free(e);
		return rc;
	}
	*out = e;
	return KVT_OK;
}

void kvt_cuda_event_destroy(kvt_dev *d, kvt_event *e)
{
	CU(cudaEventDestroy(e->e));
	free(e);
}

int kvt_cuda_event_record(kvt_dev *d, kvt_event *e, kvt_stream *s) { return CU(cudaEventRecord(e->e, S(d, s))); }
int kvt_cuda_stream_wait_event(kvt_dev *d, kvt_stream *s, kvt_event *e)
{
	KVT_DEV_COUNT(d, event_waits, 1);
	return CU(cudaStreamWaitEvent(S(d, s), e->e, 0));
}
int kvt_cuda_event_sync(kvt_dev *d, kvt_event *e)
{
	KVT_DEV_COUNT(d, host_syncs, 1);
	return CU(cudaEventSynchronize(e->e));
}

bool kvt_cuda_event_done(kvt_dev *d, kvt_event *e)
{
	cudaError_t r = cudaEventQuery(e->e);
	if (r == cudaErrorNotReady)
		return false;
	return CU(r) == KVT_OK;
}

int kvt_cuda_copy_async(kvt_dev *d, kvt_stream *s, void *dst, const void *src, size_t n, int dir)
{
	static const cudaMemcpyKind kinds[] = { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
						cudaMemcpyDeviceToDevice };
	count_copy(d, S(d, s), dir, n);
	return CU(cudaMemcpyAsync(dst, src, n, kinds[dir], S(d, s)));
}

int kvt_cuda_copy_2d_async(kvt_dev *d, kvt_stream *s, void *dst, size_t dst_pitch, const void *src,
			      size_t src_pitch, size_t row_bytes, size_t n_rows, int dir)
{
	static const cudaMemcpyKind kinds[] = { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
						cudaMemcpyDeviceToDevice };
	count_copy(d, S(d, s), dir, row_bytes * n_rows);
	return CU(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, n_rows, kinds[dir], S(d, s)));
}

/* ---- graphs ---- */

int kvt_cuda_capture_begin(kvt_dev *d)
{
	cuda_dev *c = C(d);
	if (c->capturing) {
		KVT_LOGE("dev.capture_begin: a capture is already in progress");
		return KVT_EINVAL;
	}
	/* thread-local: other threads may go on allocating and copying on their own streams */
	int rc = CU(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
	if (rc)
		return rc;
	memset(&c->cap, 0, sizeof c->cap);
	c->capturing = true;
	c->capture_bad = false;
	return KVT_OK;
}

int kvt_cuda_capture_end(kvt_dev *d, kvt_graph **out)
{
	cuda_dev *c = C(d);
	if (!c->capturing) {
		KVT_LOGE("dev.capture_end: no capture in progress");
		return KVT_EINVAL;
	}
	c->capturing = false;
	cudaGraph_t graph = NULL;
	int rc = CU(cudaStreamEndCapture(c->stream, &graph));
	if (!rc && c->capture_bad) {
		KVT_LOGE("dev.capture_end: an op refused during the capture (above); no graph");
		rc = KVT_EINVAL;
	}
	kvt_graph *g = NULL;
	if (!rc && !(g = (kvt_graph *)calloc(1, sizeof *g)))
		rc = KVT_ENOMEM;
	if (!rc) {
		*g = c->cap;
		g->graph = graph;
		rc = CU(cudaGraphInstantiate(&g->exec, graph, 0));
	}
	if (rc) {
		if (graph)
			cudaGraphDestroy(graph);
		free(g);
		return rc;
	}
	*out = g;
	return KVT_OK;
}

int kvt_cuda_graph_launch(kvt_dev *d, kvt_graph *g)
{
	cuda_dev *c = C(d);
	if (c->capturing) {
		KVT_LOGE("dev.graph_launch: not while capturing");
		return KVT_EINVAL;
	}
	KVT_DEV_COUNT(d, graph_launches, 1);
	KVT_DEV_COUNT(d, graph_kernels, g->n_kernels);
	KVT_DEV_COUNT(d, copies, g->n_copies);
	KVT_DEV_COUNT(d, h2d_bytes, g->h2d);
	KVT_DEV_COUNT(d, d2h_bytes, g->d2h);
	KVT_DEV_COUNT(d, d2d_bytes, g->d2d);
	return CU(cudaGraphLaunch(g->exec, c->stream));
}

void kvt_cuda_graph_destroy(kvt_dev *d, kvt_graph *g)
{
	CU(cudaGraphExecDestroy(g->exec));
	CU(cudaGraphDestroy(g->graph));
	free(g);
}
