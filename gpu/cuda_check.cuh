// Error checking shared by the gpu/*.cu files: every CUDA and cuBLAS call is
// wrapped so that a failure names the file, the line and the call. The
// macros write a one-line message into (err, errlen), which must be in scope,
// and jump to the enclosing function's `fail:` label.
#ifndef RESNETD_GPU_CUDA_CHECK_CUH
#define RESNETD_GPU_CUDA_CHECK_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>

#define CUDA_TRY(call)                                                                                 \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) {                                                                       \
            snprintf(err, errlen, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            goto fail;                                                                                 \
        }                                                                                              \
    } while (0)

#define CUBLAS_TRY(call)                                                                                  \
    do {                                                                                                  \
        cublasStatus_t s_ = (call);                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                \
            snprintf(err, errlen, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cublasGetStatusString(s_)); \
            goto fail;                                                                                    \
        }                                                                                                 \
    } while (0)

// After a kernel launch: configuration errors surface here, not at the next sync.
#define CUDA_TRY_LAUNCH() CUDA_TRY(cudaGetLastError())

#endif
