/*
 * gpu/cuda/cuda_rows.cu — the row and elementwise ops on the CUDA backend:
 * RMSNorm, RoPE, SwiGLU (and GELU-tanh), add (plain and broadcast bias) and
 * the embedding gather. Each follows the CPU reference's arithmetic in the
 * CPU's order where the order decides the result (RoPE's theta advances by
 * repeated multiplication, as the CPU's does).
 *
 * Grids: RMSNorm one CTA of 256 threads per row (block_sum); RoPE one thread
 * per (row, rotated pair); SwiGLU and add grid-stride loops (grid_for);
 * embed one CTA of 128 threads per row. An untrusted embedding id is
 * checked on the device and read back (one small host wait, refused in a
 * capture), so a bad id is KVT_EINVAL as on the CPU.
 */
#include "cuda_int.cuh"

__global__ void rmsnorm_kernel(const float *x, const float *w, float *y, uint32_t n, float eps)
{
	__shared__ float sh[32];
	const float *xr = x + (size_t)blockIdx.x * n;
	float *yr = y + (size_t)blockIdx.x * n;
	const float r = rms_inv(xr, n, eps, sh);
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
		yr[i] = xr[i] * r * w[i];
}

int kvt_cuda_rmsnorm(kvt_dev *d, const kvt_rmsnorm_args *a)
{
	rmsnorm_kernel<<<a->n_rows, 256, 0, C(d)->stream>>>(a->x, a->w, a->y, a->n_dim, a->eps);
	return LAUNCHED("rmsnorm");
}

/* One thread per (row, rotated pair); theta advances as the CPU's does. */
__global__ void rope_kernel(kvt_rope_args a, float theta_scale)
{
	uint32_t pairs = a.n_rot / 2;
	uint64_t idx = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
	if (idx >= (uint64_t)a.n_rows * pairs)
		return;
	uint32_t m = (uint32_t)(idx / pairs), i = (uint32_t)(idx % pairs);
	float theta = (float)a.pos[m];
	for (uint32_t j = 0; j < i; j++)
		theta *= theta_scale;
	if (a.freq_factors)
		theta /= a.freq_factors[i];
	float c, s;
	sincosf(theta, &s, &c);
	/* the pair's dims: adjacent, or half the rotated width apart (NEOX) */
	const uint32_t i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + pairs : 2 * i + 1;
	for (uint32_t h = 0; h < a.n_heads; h++) {
		float *x = a.x + ((size_t)m * a.n_heads + h) * a.head_dim;
		float x0 = x[i0], x1 = x[i1];
		x[i0] = x0 * c - x1 * s;
		x[i1] = x0 * s + x1 * c;
	}
}

int kvt_cuda_rope(kvt_dev *d, const kvt_rope_args *a)
{
	const float theta_scale = powf(a->freq_base, -2.0f / (float)a->n_rot);
	uint64_t n = (uint64_t)a->n_rows * (a->n_rot / 2);
	rope_kernel<<<div_up(n, 128), 128, 0, C(d)->stream>>>(*a, theta_scale);
	return LAUNCHED("rope");
}

__global__ void swiglu_kernel(const float *g, const float *u, float *y, uint64_t n, int act)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
		float v = g[i];
		if (act == KVT_ACT_GELU_TANH) /* sqrt(2 / pi) */
			y[i] = 0.5f * v * (1.0f + tanhf(0.79788456080286535587989211986876f * v * (1.0f + 0.044715f * v * v))) * u[i];
		else
			y[i] = v / (1.0f + expf(-v)) * u[i];
	}
}

static unsigned grid_for(uint64_t n) { return div_up(n, 256) < 8192 ? div_up(n, 256) : 8192; }

int kvt_cuda_swiglu(kvt_dev *d, const kvt_swiglu_args *a)
{
	swiglu_kernel<<<grid_for(a->n), 256, 0, C(d)->stream>>>(a->gate, a->up, a->y, a->n, a->act);
	return LAUNCHED("swiglu");
}

/* n_x = 0: y += x; else x is a row of n_x broadcast over y's rows (a bias). */
__global__ void add_kernel(const float *x, float *y, uint64_t n, uint64_t n_x)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
		y[i] += x[n_x ? i % n_x : i];
}

int kvt_cuda_add(kvt_dev *d, const kvt_add_args *a)
{
	add_kernel<<<grid_for(a->n), 256, 0, C(d)->stream>>>(a->x, a->y, a->n, a->n_x);
	return LAUNCHED("add");
}

__global__ void scale_kernel(float *y, uint64_t n, float s)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
		y[i] *= s;
}

/* Out-of-range ids are reported through *bad (the first one seen) and leave their row 0. */
__global__ void embed_kernel(kvt_embed_args a, int32_t *bad)
{
	uint32_t m = blockIdx.x;
	int32_t id = a.ids[m];
	float *y = a.y + (size_t)m * a.n_dim;
	if (id < 0 || (uint32_t)id >= a.n_vocab) {
		if (threadIdx.x == 0)
			atomicCAS(bad, INT32_MIN, id);
		for (uint32_t k = threadIdx.x; k < a.n_dim; k += blockDim.x)
			y[k] = 0.0f;
		return;
	}
	if (a.table_dtype == KVT_DTYPE_F32) {
		const float *row = (const float *)a.table + (size_t)id * a.n_dim;
		for (uint32_t k = threadIdx.x; k < a.n_dim; k += blockDim.x)
			y[k] = row[k];
	} else if (a.table_dtype == KVT_DTYPE_F16) {
		const __half *row = (const __half *)a.table + (size_t)id * a.n_dim;
		for (uint32_t k = threadIdx.x; k < a.n_dim; k += blockDim.x)
			y[k] = __half2float(row[k]);
	} else { /* a kept quantized type: a thread per 8 elements */
		const uint8_t *row = (const uint8_t *)a.table + (size_t)id * q_row_bytes(a.table_dtype, a.n_dim);
		for (uint32_t k = threadIdx.x * 8; k < a.n_dim; k += blockDim.x * 8) {
			float wf[8];
			dq8(a.table_dtype, row, k, wf);
			for (int i = 0; i < 8; i++)
				y[k + i] = wf[i];
		}
	}
}

int kvt_cuda_embed(kvt_dev *d, const kvt_embed_args *a)
{
	/* The CPU backend rejects an out-of-range id with KVT_EINVAL; so does this one,
	 * at the cost of one small read-back (ids come from the host anyway). */
	cuda_dev *c = C(d);
	if (a->trusted_ids) {
		embed_kernel<<<a->n_rows, 128, 0, c->stream>>>(*a, c->d_flag);
		return LAUNCHED("embed");
	}
	int rc = no_wait_in_capture(d, "embed (ids not trusted)");
	if (rc)
		return rc;
	int32_t h_bad = INT32_MIN;
	rc = CU(cudaMemcpyAsync(c->d_flag, &h_bad, sizeof h_bad, cudaMemcpyHostToDevice, c->stream));
	if (!rc) {
		embed_kernel<<<a->n_rows, 128, 0, c->stream>>>(*a, c->d_flag);
		rc = LAUNCHED("embed");
		if (!rc && a->scale != 0 && a->scale != 1) {
			const uint64_t n = (uint64_t)a->n_rows * a->n_dim;
			scale_kernel<<<grid_for(n), 256, 0, c->stream>>>(a->y, n, a->scale);
			rc = LAUNCHED("embed scale");
		}
		if (!rc)
			rc = CU(cudaMemcpyAsync(&h_bad, c->d_flag, sizeof h_bad, cudaMemcpyDeviceToHost, c->stream));
	}
	if (!rc) {
		count_copy(d, c->stream, KVT_COPY_H2D, sizeof h_bad);
		count_copy(d, c->stream, KVT_COPY_D2H, sizeof h_bad);
		rc = host_wait(d, c->stream);
	}
	if (!rc && h_bad != INT32_MIN) {
		KVT_LOGE("dev.embed: token id %d out of range (vocab %u)", h_bad, a->n_vocab);
		return KVT_EINVAL;
	}
	return rc;
}
