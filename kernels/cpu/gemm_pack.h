/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/gemm_pack.h — what the prefill tiles (gemm_f32.c's float panels, gemm_bf16.c's
 * BF16 panels) share: the per-thread buffer they pack weight panels and activations into,
 * and the 8 x 8 transpose of 32-bit elements that packs 8 weight rows at a time.
 */
#ifndef RINGLM_KERNELS_CPU_GEMM_PACK_H
#define RINGLM_KERNELS_CPU_GEMM_PACK_H

#include <stddef.h>

/* Bytes of gemm_pack_buf: gemm_f32's (128 + 16) x 256 floats, more than gemm_bf16 needs. */
#define GEMM_PACK_BUF_BYTES ((size_t)(128 + 16) * 256 * 4)

/* This thread's GEMM_PACK_BUF_BYTES, 64-byte aligned, freed with the thread; NULL without
 * memory. The callers are single-threaded products: one user per thread at a time. */
void *gemm_pack_buf(void);

#if defined(__x86_64__)
#include <immintrin.h>

/* out[i * ld + j] = r_j[i] for i, j < 8: rows in, columns out (out 32-byte aligned, ld a
 * multiple of 8). */
static inline __attribute__((always_inline, target("avx2"))) void
gemm_tr8x8(__m256 r0, __m256 r1, __m256 r2, __m256 r3, __m256 r4, __m256 r5, __m256 r6, __m256 r7,
           float *out, int ld)
{
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_store_ps(out + 0 * ld, _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_store_ps(out + 1 * ld, _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_store_ps(out + 2 * ld, _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_store_ps(out + 3 * ld, _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_store_ps(out + 4 * ld, _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_store_ps(out + 5 * ld, _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_store_ps(out + 6 * ld, _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_store_ps(out + 7 * ld, _mm256_permute2f128_ps(s3, s7, 0x31));
}
#endif

#endif
