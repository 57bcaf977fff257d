/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/cuda_probe.cu — hardware baselines measured in the same run as the engine
 * (perf/gpu_bench dlsym()s these): device-to-device copy bandwidth, a large cuBLAS bf16
 * GEMM, and pinned host<->device copies per chunk size. Each is a median over CUDA-event
 * timed repetitions after a warm-up, on non-zero data. Also pinned host allocation for the
 * swap benchmark, and a host run of the device's synthetic-weight formula (for tests that
 * have no device).
 *
 * All return 0 or a negative errno with eng_seterr naming the failed call.
 */
#include "kernels/engine.h"
#include "kernels/cuda/cuda_kernels.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT extern "C" __attribute__((visibility("default")))

#define P_CHECK(call)                                                                         \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            rc = eng_seterr(e_ == cudaErrorMemoryAllocation ? -ENOMEM : -EIO,                 \
                            "cuda probe: %s: %s (%s)", #call, cudaGetErrorString(e_),         \
                            cudaGetErrorName(e_));                                            \
            goto out;                                                                         \
        }                                                                                     \
    } while (0)

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static float median(float *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

static int no_device(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return eng_seterr(-ENODEV, "no CUDA device: cudaGetDeviceCount: %s",
                          e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    return 0;
}

/* "NVIDIA H200 (compute 9.0, 132 SMs, 140 GiB)" */
EXPORT int ringlm_cuda_device_info(char *buf, size_t len)
{
    int rc = no_device();
    if (rc)
        return rc;
    cudaDeviceProp p;
    P_CHECK(cudaGetDeviceProperties(&p, 0));
    snprintf(buf, len, "%s (compute %d.%d, %d SMs, %.0f GiB)", p.name, p.major, p.minor,
             p.multiProcessorCount, (double)p.totalGlobalMem / (1ull << 30));
out:
    return rc;
}

/* Device-to-device cudaMemcpy of `bytes`: *bytes_per_s counts bytes read plus written. */
EXPORT int ringlm_cuda_probe_d2d(size_t bytes, int iters, double *bytes_per_s)
{
    int rc = no_device();
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float *ms = NULL;
    if (rc)
        return rc;
    if (iters < 1)
        iters = 1;
    ms = (float *)calloc((size_t)iters, sizeof *ms);
    if (!ms)
        return eng_seterr(-ENOMEM, "cuda probe: out of memory");
    P_CHECK(cudaMalloc(&a, bytes));
    P_CHECK(cudaMalloc(&b, bytes));
    P_CHECK(ck_fill_pattern(0, a, bytes, 7));
    P_CHECK(ck_fill_pattern(0, b, bytes, 9));
    P_CHECK(cudaEventCreate(&e0));
    P_CHECK(cudaEventCreate(&e1));
    for (int w = 0; w < 3; w++)
        P_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    for (int i = 0; i < iters; i++) {
        P_CHECK(cudaEventRecord(e0, 0));
        P_CHECK(cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0));
        P_CHECK(cudaEventRecord(e1, 0));
        P_CHECK(cudaEventSynchronize(e1));
        P_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    *bytes_per_s = 2.0 * (double)bytes / (median(ms, iters) * 1e-3);
out:
    if (e0) (void)cudaEventDestroy(e0);
    if (e1) (void)cudaEventDestroy(e1);
    if (a) (void)cudaFree(a);
    if (b) (void)cudaFree(b);
    free(ms);
    return rc;
}

/* C[n][n] (fp32) = A[n][n] · B[n][n] in bf16 with fp32 accumulation: 2n^3 FLOP per run. */
EXPORT int ringlm_cuda_probe_gemm(int n, int iters, double *flop_per_s)
{
    int rc = no_device();
    void *a = NULL, *b = NULL, *c = NULL, *ws = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cublasHandle_t h = NULL;
    float *ms = NULL;
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t bs;
    if (rc)
        return rc;
    if (iters < 1)
        iters = 1;
    const size_t nn = (size_t)n * n;
    ms = (float *)calloc((size_t)iters, sizeof *ms);
    if (!ms)
        return eng_seterr(-ENOMEM, "cuda probe: out of memory");
    P_CHECK(cudaMalloc(&a, nn * 2));
    P_CHECK(cudaMalloc(&b, nn * 2));
    P_CHECK(cudaMalloc(&c, nn * 4));
    P_CHECK(cudaMalloc(&ws, (size_t)32 << 20));
    /* Uniform in [-1, 1): real data, never all-zero (sparse-looking data runs faster). */
    P_CHECK(ck_synth_fill(0, a, 1, nn, 11, 1, 0, 1.0f, false));
    P_CHECK(ck_synth_fill(0, b, 1, nn, 13, 1, 0, 1.0f, false));
    P_CHECK(cudaEventCreate(&e0));
    P_CHECK(cudaEventCreate(&e1));
    if ((bs = cublasCreate(&h)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetWorkspace(h, ws, (size_t)32 << 20)) != CUBLAS_STATUS_SUCCESS) {
        rc = eng_seterr(-EIO, "cuda probe: cublas setup: %s", cublasGetStatusString(bs));
        goto out;
    }
    for (int i = -3; i < iters; i++) {
        P_CHECK(cudaEventRecord(e0, 0));
        bs = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b,
                          CUDA_R_16BF, n, &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS) {
            rc = eng_seterr(-EIO, "cuda probe: cublasGemmEx(%d^3): %s", n,
                            cublasGetStatusString(bs));
            goto out;
        }
        P_CHECK(cudaEventRecord(e1, 0));
        P_CHECK(cudaEventSynchronize(e1));
        if (i >= 0)
            P_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    *flop_per_s = 2.0 * (double)n * n * n / (median(ms, iters) * 1e-3);
out:
    if (h) (void)cublasDestroy(h);
    if (e0) (void)cudaEventDestroy(e0);
    if (e1) (void)cudaEventDestroy(e1);
    if (a) (void)cudaFree(a);
    if (b) (void)cudaFree(b);
    if (c) (void)cudaFree(c);
    if (ws) (void)cudaFree(ws);
    free(ms);
    return rc;
}

/* Pinned host <-> device copies of `bytes` in chunks of `chunk` bytes (0: one copy), one
 * stream: *h2d and *d2h in bytes per second (median). */
EXPORT int ringlm_cuda_probe_memcpy(size_t bytes, size_t chunk, int iters, double *h2d,
                                    double *d2h)
{
    int rc = no_device();
    void *host = NULL, *dev = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaStream_t st = NULL;
    float *ms = NULL;
    if (rc)
        return rc;
    if (iters < 1)
        iters = 1;
    if (chunk == 0 || chunk > bytes)
        chunk = bytes;
    ms = (float *)calloc((size_t)iters, sizeof *ms);
    if (!ms)
        return eng_seterr(-ENOMEM, "cuda probe: out of memory");
    P_CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
    for (size_t i = 0; i < bytes; i++)
        ((unsigned char *)host)[i] = (unsigned char)(i * 131u + 7u);
    P_CHECK(cudaMalloc(&dev, bytes));
    P_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    P_CHECK(cudaEventCreate(&e0));
    P_CHECK(cudaEventCreate(&e1));
    for (int dir = 0; dir < 2; dir++) {
        for (int i = -2; i < iters; i++) {
            P_CHECK(cudaEventRecord(e0, st));
            for (size_t off = 0; off < bytes; off += chunk) {
                size_t k = bytes - off < chunk ? bytes - off : chunk;
                if (dir == 0)
                    P_CHECK(cudaMemcpyAsync((char *)dev + off, (char *)host + off, k,
                                            cudaMemcpyHostToDevice, st));
                else
                    P_CHECK(cudaMemcpyAsync((char *)host + off, (char *)dev + off, k,
                                            cudaMemcpyDeviceToHost, st));
            }
            P_CHECK(cudaEventRecord(e1, st));
            P_CHECK(cudaEventSynchronize(e1));
            if (i >= 0)
                P_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
        }
        double bw = (double)bytes / (median(ms, iters) * 1e-3);
        if (dir == 0)
            *h2d = bw;
        else
            *d2h = bw;
    }
out:
    if (e0) (void)cudaEventDestroy(e0);
    if (e1) (void)cudaEventDestroy(e1);
    if (st) (void)cudaStreamDestroy(st);
    if (dev) (void)cudaFree(dev);
    if (host) (void)cudaFreeHost(host);
    free(ms);
    return rc;
}

/* Pinned host memory for the swap benchmark (what the daemon's registered tier looks like). */
EXPORT int ringlm_cuda_host_alloc(size_t bytes, void **out)
{
    int rc = no_device();
    *out = NULL;
    if (rc)
        return rc;
    P_CHECK(cudaHostAlloc(out, bytes, cudaHostAllocDefault));
out:
    return rc;
}

EXPORT void ringlm_cuda_host_free(void *p)
{
    if (p)
        (void)cudaFreeHost(p);
}

/* The device's synthetic-weight formula run on the host (no device needed). */
EXPORT float ringlm_cuda_synth_value_host(uint64_t seed, int tensor_id, uint64_t index,
                                          float scale, int is_norm)
{
    return ck_synth_value(seed, tensor_id, index, scale, is_norm != 0);
}

/* The split-K chunking of a decode row with ctx keys (for tests and docs). */
EXPORT int ringlm_cuda_split_count(int ctx) { return ck_split_count(ctx); }
