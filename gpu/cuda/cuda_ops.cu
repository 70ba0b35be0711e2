/*
 * gpu/cuda/cuda_ops.cu — the CUDA backend's ops table (dev_impl.h) and its
 * constructor: the device, the compute stream, cuBLAS bound to it, the
 * embedding's bad-id flag and the fused combine's tickets, and the test and
 * bench overrides read from the environment once, at create
 * (KVT_CUDA_DECODE, KVT_CUDA_COMBINE, KVT_CUDA_STAGE, KVT_CUDA_STAGE_BLOCKS).
 *
 * Every op of struct kvt_dev_ops is filled in (tests/test_dev_ops_checklist.c
 * names each op's parity case).
 */
#include "cuda_int.cuh"

static const struct kvt_dev_ops cuda_ops = {
	.name = "cuda",
	.destroy = kvt_cuda_destroy,
	.supports_dtype = kvt_cuda_supports_dtype,
	.alloc = kvt_cuda_alloc,
	.free = kvt_cuda_free,
	.copy_h2d = kvt_cuda_copy_h2d,
	.copy_d2h = kvt_cuda_copy_d2h,
	.copy_d2d = kvt_cuda_copy_d2d,
	.sync = kvt_cuda_sync,
	.matmul_workspace = kvt_cuda_matmul_workspace,
	.matmul = kvt_cuda_matmul,
	.rmsnorm = kvt_cuda_rmsnorm,
	.rope = kvt_cuda_rope,
	.swiglu = kvt_cuda_swiglu,
	.add = kvt_cuda_add,
	.embed = kvt_cuda_embed,
	.kv_store = kvt_cuda_kv_store,
	.attention_workspace = kvt_cuda_attention_workspace,
	.attention = kvt_cuda_attention,
	.argmax = kvt_cuda_argmax,
	.host_alloc = kvt_cuda_host_alloc,
	.host_free = kvt_cuda_host_free,
	.stream_create = kvt_cuda_stream_create,
	.stream_destroy = kvt_cuda_stream_destroy,
	.stream_sync = kvt_cuda_stream_sync,
	.event_create = kvt_cuda_event_create,
	.event_destroy = kvt_cuda_event_destroy,
	.event_record = kvt_cuda_event_record,
	.stream_wait_event = kvt_cuda_stream_wait_event,
	.event_sync = kvt_cuda_event_sync,
	.event_done = kvt_cuda_event_done,
	.copy_async = kvt_cuda_copy_async,
	.kv_pack = kvt_cuda_kv_pack,
	.kv_unpack = kvt_cuda_kv_unpack,
	.sample_workspace = kvt_cuda_sample_workspace,
	.sample = kvt_cuda_sample,
	.capture_begin = kvt_cuda_capture_begin,
	.capture_end = kvt_cuda_capture_end,
	.graph_launch = kvt_cuda_graph_launch,
	.graph_destroy = kvt_cuda_graph_destroy,
	.norm_matmul = kvt_cuda_norm_matmul,
	.matmul_swiglu = kvt_cuda_matmul_swiglu,
	.rope_store = kvt_cuda_rope_store,
	.copy_2d_async = kvt_cuda_copy_2d_async,
	.kv_load = kvt_cuda_kv_load,
};

extern "C" int kvt_dev_cuda_create(const kvt_dev_config *cfg, kvt_dev **out)
{
	const bool asked = cfg->kind == KVT_DEV_CUDA; /* auto falls back quietly */
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		(void)cudaGetLastError();
		if (asked)
			KVT_LOGE("device cuda: no usable GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
		return KVT_EDEVICE;
	}
	cuda_dev *c = (cuda_dev *)calloc(1, sizeof *c);
	if (!c)
		return KVT_ENOMEM;
	c->base.ops = &cuda_ops;
	c->base.kind = KVT_DEV_CUDA;
	c->base.n_threads = 1;
	c->device = 0;
	cudaDeviceProp prop;
	int rc = CU(cudaSetDevice(c->device));
	if (!rc)
		rc = CU(cudaGetDeviceProperties(&prop, c->device));
	if (!rc)
		rc = CU(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
	if (!rc && cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
		KVT_LOGE("device cuda: cuBLAS did not initialise");
		rc = KVT_EDEVICE;
	}
	if (!rc && cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS)
		rc = KVT_EDEVICE;
	if (!rc)
		cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH); /* no TF32 for the fp32 path */
	if (!rc)
		rc = CU(cudaMalloc((void **)&c->d_flag, sizeof(int32_t)));
	if (!rc)
		rc = CU(cudaMalloc((void **)&c->d_tickets, DECODE_TICKETS * sizeof(uint32_t)));
	if (!rc)
		rc = CU(cudaMemset(c->d_tickets, 0, DECODE_TICKETS * sizeof(uint32_t)));
	if (!rc)
		rc = CU(cudaDeviceSynchronize()); /* the counters are zero before any decode reads them */
	if (rc) {
		kvt_cuda_destroy(&c->base);
		return rc;
	}
	c->n_sm = prop.multiProcessorCount;
	const char *dv = getenv("KVT_CUDA_DECODE");
	c->decode_version = 0; /* decode_choices' */
	if (dv && (strcmp(dv, "1") == 0 || strcmp(dv, "2") == 0 || strcmp(dv, "3") == 0))
		c->decode_version = dv[0] - '0';
	else if (dv && *dv)
		KVT_LOGW("KVT_CUDA_DECODE=%s: not 1, 2 or 3; using the table's decode kernels", dv);
	const char *dc = getenv("KVT_CUDA_COMBINE");
	c->decode_combine = -1;
	if (dc && (strcmp(dc, "fused") == 0 || strcmp(dc, "separate") == 0))
		c->decode_combine = dc[0] == 'f';
	else if (dc && *dc)
		KVT_LOGW("KVT_CUDA_COMBINE=%s: not fused or separate; using the table's", dc);
	const char *ds = getenv("KVT_CUDA_STAGE");
	c->decode_stage = -1;
	if (ds && (strcmp(ds, "0") == 0 || strcmp(ds, "1") == 0))
		c->decode_stage = ds[0] == '1';
	else if (ds && *ds)
		KVT_LOGW("KVT_CUDA_STAGE=%s: not 0 or 1; using the table's", ds);
	const char *sbk = getenv("KVT_CUDA_STAGE_BLOCKS"); /* tests: small rounds to cover the rounds */
	c->stage_blocks = sbk && atol(sbk) > 0 ? (uint32_t)atol(sbk) : 0;
	snprintf(c->base.name, sizeof c->base.name, "cuda (%.48s, sm_%d%d, %.0f GiB)", prop.name, prop.major,
		 prop.minor, (double)prop.totalGlobalMem / (1u << 30));
	*out = &c->base;
	return KVT_OK;
}
