/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/gemm_small.c — y = beta * y + x · w^T for batches of a few rows (see
 * gemm_small.h for the contract and why the summation order is fixed).
 *
 * Blocking: tiles of 4 weight rows × 2 batch rows. A tile keeps its 8 accumulators and the
 * 4 weight vectors of the current k step in registers (13 of AVX2's 16), so per 8 floats
 * of k it loads 6 vectors for 8 multiply-adds, and its 4 weight rows (at most 4 × K floats,
 * 32 KiB at K = 2048) stay in L1 while the batch rows pass over them: each weight row
 * comes from memory once per call, for all M rows. Leftover weight rows (N % 4) and an odd
 * last batch row use narrower tiles of the same code, so they sum in the same order.
 *
 * In the AVX2 and AVX-512 paths a tile's 4 weight rows are one from each quarter of the N
 * rows (n0, q + n0, 2q + n0, 3q + n0 with q = N / 4): the weights are read as 4 long
 * sequential streams, which the hardware prefetcher follows, where 4 adjacent rows were 4
 * streams of one row each (3 KiB at K = 768) that it did not, even with software prefetch
 * one tile ahead. One Zen 4 thread, one batch row, stories110M's projections from memory
 * (perf/gemm_bench --rows 1 --clock cpu, load 5-6): 1.3-1.9x (the classifier 7.7 -> 4.1 ms,
 * 24 GB/s); software prefetch on top of the quarters cost 5-15% at one row, so there is none
 * there. From 2 rows the AVX-512 tiles prefetch the weights of a later tile into L2 (below).
 */
#include "kernels/cpu/gemm_small.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "kernels/cpu/gemm_tile_avx2.h"
#define GEMM_HAVE_AVX2 1
#else
#define GEMM_HAVE_AVX2 0
#endif

#define NR 4 /* weight rows per tile */
#define MR 2 /* batch rows per tile */

/* ---- portable path: GNU C vectors (two SSE halves on baseline x86-64, NEON on arm64) -- */

typedef float v8f __attribute__((vector_size(32), aligned(4))); /* unaligned loads allowed */

/* Vectors never cross a function boundary here (that would change the ABI on baseline
 * x86-64): helpers take pointers and are always inlined. */

/* *v = the first r (< 8) floats of p, zero-padded: the last step of k. */
static inline __attribute__((always_inline)) void tail8(v8f *v, const float *p, int r)
{
    *v = (v8f){0};
    memcpy(v, p, (size_t)r * sizeof(float));
}

static inline __attribute__((always_inline)) float reduce8(const v8f *v)
{
    const v8f a = *v;
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* One nr × mr tile (nr <= NR, mr <= MR, compile-time constants at every call site, so the
 * loops unroll and the accumulators live in registers). */
static inline __attribute__((always_inline)) void tile_portable(int nr, int mr, int K,
                                                                const float *x, int ld_x,
                                                                const float *w, int ld_w,
                                                                float beta, float *y, int ld_y)
{
    v8f acc[NR][MR];
#pragma GCC unroll 4
    for (int n = 0; n < nr; n++)
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) acc[n][m] = (v8f){0};
    const int K8 = K & ~7;
    for (int k = 0; k < K8; k += 8) {
        v8f wv[NR];
#pragma GCC unroll 4
        for (int n = 0; n < nr; n++) wv[n] = *(const v8f *)(w + (size_t)n * ld_w + k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const v8f xv = *(const v8f *)(x + (size_t)m * ld_x + k);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++) acc[n][m] += xv * wv[n];
        }
    }
    if (K8 < K) {
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            v8f xv, wv;
            tail8(&xv, x + (size_t)m * ld_x + K8, K - K8);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++) {
                tail8(&wv, w + (size_t)n * ld_w + K8, K - K8);
                acc[n][m] += xv * wv;
            }
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
        for (int n = 0; n < nr; n++) {
            float s = reduce8(&acc[n][m]);
            float *out = y + (size_t)m * ld_y + n;
            *out = beta == 0.0f ? s : *out + s;
        }
}

static void gemm_portable(int M, int N, int K, const float *x, int ld_x, const float *w, int ld_w,
                          float beta, float *y, int ld_y)
{
    int n0 = 0;
    for (; n0 + NR <= N; n0 += NR) {
        const float *wn = w + (size_t)n0 * ld_w;
        int m0 = 0;
        for (; m0 + MR <= M; m0 += MR)
            tile_portable(NR, MR, K, x + (size_t)m0 * ld_x, ld_x, wn, ld_w, beta,
                          y + (size_t)m0 * ld_y + n0, ld_y);
        if (m0 < M)
            tile_portable(NR, 1, K, x + (size_t)m0 * ld_x, ld_x, wn, ld_w, beta,
                          y + (size_t)m0 * ld_y + n0, ld_y);
    }
    for (; n0 < N; n0++) {
        const float *wn = w + (size_t)n0 * ld_w;
        int m0 = 0;
        for (; m0 + MR <= M; m0 += MR)
            tile_portable(1, MR, K, x + (size_t)m0 * ld_x, ld_x, wn, ld_w, beta,
                          y + (size_t)m0 * ld_y + n0, ld_y);
        if (m0 < M)
            tile_portable(1, 1, K, x + (size_t)m0 * ld_x, ld_x, wn, ld_w, beta,
                          y + (size_t)m0 * ld_y + n0, ld_y);
    }
}

/* ---- AVX2 + FMA path ------------------------------------------------------------------ */

#if GEMM_HAVE_AVX2
#define AVX2 __attribute__((target("avx2,fma")))

/* Lane j of the mask is on for j < r: a zero-padded load of the last r floats of a row,
 * which never touches memory past the row. */
static const int32_t tail_mask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};


static inline __attribute__((always_inline)) AVX2 void
tile_avx2(int nr, int mr, int K, const float *x, int ld_x, const float *w, size_t ld_w, float beta,
          float *y, int ld_y, size_t ld_yn)
{
    __m256 acc[NR][MR];
#pragma GCC unroll 4
    for (int n = 0; n < nr; n++)
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) acc[n][m] = _mm256_setzero_ps();
    const int K8 = K & ~7;
    for (int k = 0; k < K8; k += 8) {
        __m256 wv[NR];
#pragma GCC unroll 4
        for (int n = 0; n < nr; n++) wv[n] = _mm256_loadu_ps(w + (size_t)n * ld_w + k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)m * ld_x + k);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++) acc[n][m] = _mm256_fmadd_ps(xv, wv[n], acc[n][m]);
        }
    }
    if (K8 < K) {
        const __m256i mask = _mm256_loadu_si256((const __m256i *)(tail_mask + 8 - (K - K8)));
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m256 xv = _mm256_maskload_ps(x + (size_t)m * ld_x + K8, mask);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++)
                acc[n][m] = _mm256_fmadd_ps(xv, _mm256_maskload_ps(w + (size_t)n * ld_w + K8, mask),
                                            acc[n][m]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        float *out = y + (size_t)m * ld_y;
        if (nr == NR) {
            gemm_store4(gemm_reduce4(acc[0][m], acc[1][m], acc[2][m], acc[3][m]), beta, out, ld_yn);
        } else {
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++) {
                float s = _mm_cvtss_f32(gemm_reduce4(acc[n][m], acc[n][m], acc[n][m], acc[n][m]));
                out[n] = beta == 0.0f ? s : out[n] + s;
            }
        }
    }
}

AVX2 static void gemm_avx2(int M, int N, int K, const float *x, int ld_x, const float *w, int ld_w,
                           float beta, float *y, int ld_y)
{
    /* one weight row from each quarter a tile (above) */
    const int q = N / NR;
    const size_t ld_wq = (size_t)q * ld_w, ld_yq = (size_t)q;
    for (int n0 = 0; n0 < q; n0++) {
        const float *wn = w + (size_t)n0 * ld_w;
        int m0 = 0;
        for (; m0 + MR <= M; m0 += MR)
            tile_avx2(NR, MR, K, x + (size_t)m0 * ld_x, ld_x, wn, ld_wq, beta,
                      y + (size_t)m0 * ld_y + n0, ld_y, ld_yq);
        if (m0 < M)
            tile_avx2(NR, 1, K, x + (size_t)m0 * ld_x, ld_x, wn, ld_wq, beta,
                      y + (size_t)m0 * ld_y + n0, ld_y, ld_yq);
    }
    for (int n0 = NR * q; n0 < N; n0++) {
        const float *wn = w + (size_t)n0 * ld_w;
        int m0 = 0;
        for (; m0 + MR <= M; m0 += MR)
            tile_avx2(1, MR, K, x + (size_t)m0 * ld_x, ld_x, wn, (size_t)ld_w, beta,
                      y + (size_t)m0 * ld_y + n0, ld_y, 1);
        if (m0 < M)
            tile_avx2(1, 1, K, x + (size_t)m0 * ld_x, ld_x, wn, (size_t)ld_w, beta,
                      y + (size_t)m0 * ld_y + n0, ld_y, 1);
    }
}

/* ---- AVX-512 path ----------------------------------------------------------------------
 * The same scheme with 16-float vectors and tiles of 4 weight rows × 4 batch rows: 16
 * accumulators and 4 weight vectors in AVX-512's 32 registers, 8 loads per 16
 * multiply-adds, twice the AVX2 tile's arithmetic per instruction (it matters from ~8
 * rows, where a batch stops being bound by reading the weights). Lane j takes k ≡ j mod 16;
 * an output is R(lanes 0..7 + lanes 8..15) with the AVX2 path's R: another fixed order,
 * the same for every output on a machine that runs this path. */
#define AVX512      __attribute__((target("avx512f,avx2,fma")))
#define MR16        4
/* From 2 batch rows a tile fetches the weights of the tile PF_DIST ahead into L2 while it
 * runs (prefetcht1, during its first group of batch rows): the hardware prefetcher alone
 * left a tile waiting on its weights once several batch rows made the tile slower than the
 * stream. One Zen 4 thread, perf/gemm_bench --rows 1,2,4,8,32 --cls --clock cpu (load 4-5):
 * 1.3-1.5x at 4 rows, 1.25-1.35x at 8, 1.1x at 32; at one row it did not help (0.98-1.03x),
 * so there is none there. Fetched into L1 (prefetcht0) instead, it cost up to 25%. Where a
 * tile's 4 rows take at most PF_L1_BYTES (k <= 1024), the next tile's rows, in L2 by then, are
 * also fetched into L1 during the last group of batch rows (with two groups or more): the same
 * gemm_bench, 3 alternations, load 7.6-8.0: 1.12-1.16x at 8 rows, 1.11-1.13x at 16, 1.05-1.07x
 * at 32 on wq, w1 and the classifier; at k = 2048 (32 KiB, all of L1) it cost 3-11%. */
#define PF_MIN_ROWS 2
#define PF_DIST     2
#define PF_L1_BYTES (16 * 1024)

static inline __attribute__((always_inline)) AVX512 __m256 fold16(__m512 a)
{
    return _mm256_add_ps(_mm512_castps512_ps256(a),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

static inline __attribute__((always_inline)) AVX512 void
tile_avx512(int nr, int mr, int K, const float *x, int ld_x, const float *w, size_t ld_w,
            float beta, float *y, int ld_y, size_t ld_yn, const float *pf, const float *pf0)
{
    /* pf, pf0: NULL, or 4 weight rows ld_w apart to prefetch into L2 / L1 (nr == NR only) */
    __m512 acc[NR][MR16];
#pragma GCC unroll 4
    for (int n = 0; n < nr; n++)
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) acc[n][m] = _mm512_setzero_ps();
    const int K16 = K & ~15;
    for (int k = 0; k < K16; k += 16) {
        if (pf) {
#pragma GCC unroll 4
            for (int n = 0; n < NR; n++)
                _mm_prefetch((const char *)(pf + (size_t)n * ld_w + k), _MM_HINT_T1);
        }
        if (pf0) {
#pragma GCC unroll 4
            for (int n = 0; n < NR; n++)
                _mm_prefetch((const char *)(pf0 + (size_t)n * ld_w + k), _MM_HINT_T0);
        }
        __m512 wv[NR];
#pragma GCC unroll 4
        for (int n = 0; n < nr; n++) wv[n] = _mm512_loadu_ps(w + (size_t)n * ld_w + k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m512 xv = _mm512_loadu_ps(x + (size_t)m * ld_x + k);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++) acc[n][m] = _mm512_fmadd_ps(xv, wv[n], acc[n][m]);
        }
    }
    if (K16 < K) {
        const __mmask16 mask = (__mmask16)((1u << (K - K16)) - 1);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m512 xv = _mm512_maskz_loadu_ps(mask, x + (size_t)m * ld_x + K16);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++)
                acc[n][m] = _mm512_fmadd_ps(
                    xv, _mm512_maskz_loadu_ps(mask, w + (size_t)n * ld_w + K16), acc[n][m]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        float *out = y + (size_t)m * ld_y;
        if (nr == NR) {
            gemm_store4(gemm_reduce4(fold16(acc[0][m]), fold16(acc[1][m]), fold16(acc[2][m]),
                                     fold16(acc[3][m])),
                        beta, out, ld_yn);
        } else {
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++) {
                const __m256 f = fold16(acc[n][m]);
                float s = _mm_cvtss_f32(gemm_reduce4(f, f, f, f));
                out[n] = beta == 0.0f ? s : out[n] + s;
            }
        }
    }
}

/* The batch rows [m0, M) left after the 4-row tiles, for weight rows of width nr. */
#define TAIL_ROWS_512(nr)                                                                          \
    do {                                                                                           \
        const float *xm = x + (size_t)m0 * ld_x;                                                   \
        float *ym = y + (size_t)m0 * ld_y + n0;                                                    \
        switch (M - m0) {                                                                          \
        case 3: tile_avx512(nr, 3, K, xm, ld_x, wn, ld_wt, beta, ym, ld_y, ld_yt, pft, NULL);      \
            break;                                                                                 \
        case 2: tile_avx512(nr, 2, K, xm, ld_x, wn, ld_wt, beta, ym, ld_y, ld_yt, pft, NULL);      \
            break;                                                                                 \
        case 1: tile_avx512(nr, 1, K, xm, ld_x, wn, ld_wt, beta, ym, ld_y, ld_yt, pft, NULL);      \
            break;                                                                                 \
        default: break;                                                                            \
        }                                                                                          \
    } while (0)

AVX512 static void gemm_avx512(int M, int N, int K, const float *x, int ld_x, const float *w,
                               int ld_w, float beta, float *y, int ld_y)
{
    /* one weight row from each quarter a tile (above) */
    const int q = N / NR;
    size_t ld_wt = (size_t)q * ld_w, ld_yt = (size_t)q;
    const bool l1 = (size_t)K * NR * sizeof(float) <= PF_L1_BYTES;
    for (int n0 = 0; n0 < q; n0++) {
        const float *wn = w + (size_t)n0 * ld_w;
        /* the rows of the tile PF_DIST ahead, fetched during the first group of batch rows */
        const float *next = n0 + PF_DIST < q && M >= PF_MIN_ROWS ? wn + PF_DIST * ld_w : NULL;
        const float *pft = M < MR16 ? next : NULL;
        int m0 = 0;
        for (; m0 + MR16 <= M; m0 += MR16)
            tile_avx512(NR, MR16, K, x + (size_t)m0 * ld_x, ld_x, wn, ld_wt, beta,
                        y + (size_t)m0 * ld_y + n0, ld_y, ld_yt, m0 == 0 ? next : NULL,
                        l1 && m0 > 0 && m0 + 2 * MR16 > M && n0 + 1 < q ? wn + ld_w : NULL);
        TAIL_ROWS_512(NR);
    }
    ld_wt = (size_t)ld_w;
    ld_yt = 1;
    for (int n0 = NR * q; n0 < N; n0++) {
        const float *wn = w + (size_t)n0 * ld_w;
        int m0 = 0;
        for (; m0 + MR16 <= M; m0 += MR16)
            tile_avx512(1, MR16, K, x + (size_t)m0 * ld_x, ld_x, wn, ld_wt, beta,
                        y + (size_t)m0 * ld_y + n0, ld_y, ld_yt, NULL, NULL);
        const float *pft = NULL;
        TAIL_ROWS_512(1);
    }
}
#endif

/* ---- dispatch ------------------------------------------------------------------------- */

bool gemm_small_supported(gemm_small_path path)
{
    switch (path) {
    case GEMM_SMALL_AUTO:
    case GEMM_SMALL_PORTABLE: return true;
    case GEMM_SMALL_AVX2:
#if GEMM_HAVE_AVX2
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
        return false;
#endif
    case GEMM_SMALL_AVX512:
#if GEMM_HAVE_AVX2
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma");
#else
        return false;
#endif
    }
    return false;
}

gemm_small_path gemm_small_auto_path(void)
{
    /* Resolved once; a benign race (every thread computes the same answer). */
    static _Atomic int resolved = -1;
    int p = resolved;
    if (p < 0) {
        p = gemm_small_supported(GEMM_SMALL_AVX512) ? GEMM_SMALL_AVX512
            : gemm_small_supported(GEMM_SMALL_AVX2) ? GEMM_SMALL_AVX2
                                                    : GEMM_SMALL_PORTABLE;
        resolved = p;
    }
    return (gemm_small_path)p;
}

int gemm_small_max_rows(gemm_small_path path)
{
    if (path == GEMM_SMALL_AUTO) path = gemm_small_auto_path();
    return path == GEMM_SMALL_AVX512 ? 128 : 12;
}

#ifndef GEMM_X_CHUNK_BYTES
#define GEMM_X_CHUNK_BYTES (256 * 1024)
#endif

/* Batch rows per pass over the weights: as many as keep a pass's rows of x within
 * GEMM_X_CHUNK_BYTES (a quarter to half of a current x86 core's L2), so every tile of
 * weight rows finds them in cache; each weight row is then read from memory once per
 * chunk. A multiple of 4 (both tile heights divide it), at least 4. Chunking only
 * changes which rows share a pass, never how an output is summed. */
static int rows_per_pass(int K)
{
    int mc = (int)(GEMM_X_CHUNK_BYTES / ((size_t)K * sizeof(float)));
    mc &= ~3;
    return mc < 4 ? 4 : mc;
}

void gemm_small(gemm_small_path path, int M, int N, int K, const float *x, int ld_x, const float *w,
                int ld_w, float beta, float *y, int ld_y)
{
    if (path == GEMM_SMALL_AUTO) path = gemm_small_auto_path();
    const int mc = rows_per_pass(K);
    for (int m0 = 0; m0 < M; m0 += mc) {
        const int m = M - m0 < mc ? M - m0 : mc;
        const float *xm = x + (size_t)m0 * ld_x;
        float *ym = y + (size_t)m0 * ld_y;
#if GEMM_HAVE_AVX2
        if (path == GEMM_SMALL_AVX512 && gemm_small_supported(GEMM_SMALL_AVX512)) {
            gemm_avx512(m, N, K, xm, ld_x, w, ld_w, beta, ym, ld_y);
            continue;
        }
        if (path == GEMM_SMALL_AVX2 && gemm_small_supported(GEMM_SMALL_AVX2)) {
            gemm_avx2(m, N, K, xm, ld_x, w, ld_w, beta, ym, ld_y);
            continue;
        }
#endif
        gemm_portable(m, N, K, xm, ld_x, w, ld_w, beta, ym, ld_y);
    }
}
