/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/blas.h — the BLAS the CPU backend calls: OpenBLAS's <cblas.h> (libopenblas-dev).
 *
 * `make check-portable` compiles the backend for arm64 with Debian's cross compiler, whose
 * sysroot has no arm64 OpenBLAS (its -dev package needs a multiarch arm64 installation, and
 * the host's x86-64 cblas.h includes an x86-64 openblas_config.h). There, and only there
 * (RINGLM_PORTABLE_CHECK, objects only, never linked), the two calls the backend makes are
 * declared here as the reference CBLAS interface and OpenBLAS declare them; a build that
 * links always uses the real header.
 */
#ifndef RINGLM_KERNELS_CPU_BLAS_H
#define RINGLM_KERNELS_CPU_BLAS_H

#if !defined(RINGLM_PORTABLE_CHECK) || __has_include(<cblas.h>)
#include <cblas.h>
#else
typedef enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 } CBLAS_ORDER;
typedef enum CBLAS_TRANSPOSE {
    CblasNoTrans = 111,
    CblasTrans = 112,
    CblasConjTrans = 113
} CBLAS_TRANSPOSE;
void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb, int m, int n,
                 int k, float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                 float *c, int ldc);
void openblas_set_num_threads(int num_threads);
#endif

#endif
