/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/gemm_tile_avx2.h — the reduction and store of gemm_small's AVX2 tile, shared
 * with the float decode tiles (quant_float.c) that must sum in exactly its order: a row's
 * product has the same bits whichever of them computes it. x86 only; the includer has
 * <immintrin.h>.
 */
#ifndef RINGLM_KERNELS_CPU_GEMM_TILE_AVX2_H
#define RINGLM_KERNELS_CPU_GEMM_TILE_AVX2_H

#include <stddef.h>

#include <immintrin.h>

#define GEMM_TILE_AVX2 __attribute__((always_inline, target("avx2,fma")))

/* [R(a0), R(a1), R(a2), R(a3)] with R(a) = ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)): the
 * horizontal adds pair exactly those lanes, so this is reduce8's order, four at a time. */
static inline GEMM_TILE_AVX2 __m128 gemm_reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* The 4 sums of a tile's weight rows into out[0], out[ld_yn], out[2 ld_yn], out[3 ld_yn]
 * (added to what is there with beta 1): one add each, as the contiguous store's. */
static inline GEMM_TILE_AVX2 void gemm_store4(__m128 s, float beta, float *out, size_t ld_yn)
{
    if (ld_yn == 1) {
        if (beta != 0.0f) s = _mm_add_ps(_mm_loadu_ps(out), s);
        _mm_storeu_ps(out, s);
        return;
    }
    float v[4];
    _mm_storeu_ps(v, s);
    for (int j = 0; j < 4; j++)
        out[(size_t)j * ld_yn] = beta == 0.0f ? v[j] : out[(size_t)j * ld_yn] + v[j];
}

#endif
