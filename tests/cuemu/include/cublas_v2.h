/*
 * tests/cuemu/include/cublas_v2.h — stands in for cuBLAS under the CPU
 * emulator: the handle calls and a reference GEMM (cublasSgemm, cublasGemmEx
 * with fp16/fp32 inputs and fp32 compute) exactly per cuBLAS's column-major
 * definition, C = alpha op(A) op(B) + beta C, accumulated in double. Enum
 * values are cuBLAS's. Functions are C++ in namespace cuemu_api.
 */
#pragma once
#include "cuemu.h"

typedef struct cuemu_blas *cublasHandle_t;
typedef enum {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_NOT_INITIALIZED = 1,
	CUBLAS_STATUS_ALLOC_FAILED = 3,
	CUBLAS_STATUS_INVALID_VALUE = 7,
	CUBLAS_STATUS_ARCH_MISMATCH = 8,
	CUBLAS_STATUS_MAPPING_ERROR = 11,
	CUBLAS_STATUS_EXECUTION_FAILED = 13,
	CUBLAS_STATUS_INTERNAL_ERROR = 14,
	CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum {
	CUBLAS_DEFAULT_MATH = 0,
	CUBLAS_TENSOR_OP_MATH = 1,
	CUBLAS_PEDANTIC_MATH = 2,
	CUBLAS_TF32_TENSOR_OP_MATH = 3,
} cublasMath_t;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_PEDANTIC = 69 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

namespace cuemu_api {
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
			   const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
			   float *C, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
			    const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
			    cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
			    cublasComputeType_t compute, cublasGemmAlgo_t algo);
} // namespace cuemu_api
