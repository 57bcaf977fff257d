/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_float.c — F32, F16 and BF16 weights: the conversions (exact, round to
 * nearest even), the fused dots (portable C; AVX2 + FMA + F16C), and F16 rows to floats with
 * F16C for the batch path's tiles.
 */
#include "kernels/cpu/quant_internal.h"

float q_f16_to_f32(uint16_t h)
{
    return qk_f16_to_f32(h);
}

uint16_t q_f32_to_f16(float f)
{
    return qk_f32_to_f16(f);
}

float q_bf16_to_f32(uint16_t h)
{
    return qk_bf16_to_f32(h);
}

uint16_t q_f32_to_bf16(float f)
{
    return qk_f32_to_bf16(f);
}

/* ---- fused dot, portable ------------------------------------------------------------ */

float qk_dot_float_portable(int type, const void *row, const float *x, int64_t k)
{
    float sum = 0.0f;
    switch (type) {
    case Q_F32: {
        const float *w = row;
        for (int64_t i = 0; i < k; i++) sum += w[i] * x[i];
        break;
    }
    case Q_F16: {
        const uint16_t *w = row;
        for (int64_t i = 0; i < k; i++) sum += qk_f16_to_f32(w[i]) * x[i];
        break;
    }
    case Q_BF16: {
        const uint16_t *w = row;
        for (int64_t i = 0; i < k; i++) sum += qk_bf16_to_f32(w[i]) * x[i];
        break;
    }
    }
    return sum;
}

#if QK_X86

#include "kernels/cpu/gemm_tile_avx2.h"

/* ---- fused dot, AVX2 + FMA + F16C --------------------------------------------------- */

/* A row of F16 weights as floats with F16C, 8 at a time (exact, as the scalar conversion):
 * the tiles of q_matmul's batch path convert every weight of the model each step, and the
 * scalar conversion made F16 decode of 8 sequences slower than of one. */
SIMD void qk_dequant_f16_avx2(const uint16_t *h, float *out, int64_t k)
{
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < k; i++) out[i] = qk_f16_to_f32(h[i]);
}

/* A row of BF16 weights as floats, 8 at a time: the half shifted into the high bits. */
SIMD void qk_dequant_bf16_avx2(const uint16_t *h, float *out, int64_t k)
{
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < k; i++) out[i] = qk_bf16_to_f32(h[i]);
}

/* 8 halves at h as floats: F16 through F16C, BF16 shifted into the high bits (both exact). */
static inline __attribute__((always_inline)) SIMD __m256 half8(int type, const uint16_t *h)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)h);
    if (type == Q_F16) return _mm256_cvtph_ps(v);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}


/* nr (1 or 4) weight rows (ld_w halves apart) by mr (1..4) activation rows, gemm_small's AVX2
 * tile (gemm_small.c, tile_avx2) with the weights converted in registers: 8 lanes, lane j
 * summing k = j mod 8 in one multiply-add chain, the last step zero-padded, reduce4 at the end;
 * the sums of the 4 weight rows go to y, y + ld_yn, y + 2 ld_yn, y + 3 ld_yn. */
static inline __attribute__((always_inline)) SIMD void half_tile(int type, int nr, int mr, int K,
                                                                 const uint16_t *w, size_t ld_w,
                                                                 const float *x, float beta,
                                                                 float *y, int ld_y, size_t ld_yn)
{
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int n = 0; n < nr; n++)
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) acc[n][m] = _mm256_setzero_ps();
    const int K8 = K & ~7;
    for (int k = 0; k < K8; k += 8) {
        __m256 wv[4];
#pragma GCC unroll 4
        for (int n = 0; n < nr; n++) wv[n] = half8(type, w + (size_t)n * ld_w + k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)m * K + k);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++) acc[n][m] = _mm256_fmadd_ps(xv, wv[n], acc[n][m]);
        }
    }
    if (K8 < K) {
        float xt[4][8] = {{0}}, wt[4][8] = {{0}};
        for (int m = 0; m < mr; m++)
            for (int j = 0; j < K - K8; j++) xt[m][j] = x[(size_t)m * K + K8 + j];
        for (int n = 0; n < nr; n++)
            for (int j = 0; j < K - K8; j++) {
                const uint16_t h = w[(size_t)n * ld_w + K8 + j];
                wt[n][j] = type == Q_F16 ? qk_f16_to_f32(h) : qk_bf16_to_f32(h);
            }
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m256 xv = _mm256_loadu_ps(xt[m]);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++)
                acc[n][m] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wt[n]), acc[n][m]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        float *out = y + (size_t)m * ld_y;
        if (nr == 4)
            gemm_store4(gemm_reduce4(acc[0][m], acc[1][m], acc[2][m], acc[3][m]), beta, out, ld_yn);
        else {
            float s = _mm_cvtss_f32(gemm_reduce4(acc[0][m], acc[0][m], acc[0][m], acc[0][m]));
            out[0] = beta == 0.0f ? s : out[0] + s;
        }
    }
}

/* The weight tiles as half_rows512's (below): a tile's 4 rows one from each quarter. */
#define HALF_ROWS(T_, MR_)                                                                         \
    do {                                                                                           \
        const int q = n / 4;                                                                       \
        for (int n0 = 0; n0 < q; n0++)                                                             \
            half_tile(T_, 4, MR_, k, w + (size_t)n0 * k, (size_t)q * k, x, beta, y + n0, ld_y,     \
                      (size_t)q);                                                                  \
        for (int n0 = 4 * q; n0 < n; n0++)                                                         \
            half_tile(T_, 1, MR_, k, w + (size_t)n0 * k, (size_t)k, x, beta, y + n0, ld_y, 1);     \
    } while (0)

SIMD void qk_rows_half_avx2(int type, const uint16_t *w, int n, int k, const float *x, int rows,
                            float beta, float *y, int ld_y)
{
    const bool f16 = type == Q_F16;
    switch (rows) {
    case 1:
        if (f16)
            HALF_ROWS(Q_F16, 1);
        else
            HALF_ROWS(Q_BF16, 1);
        break;
    case 2:
        if (f16)
            HALF_ROWS(Q_F16, 2);
        else
            HALF_ROWS(Q_BF16, 2);
        break;
    case 3:
        if (f16)
            HALF_ROWS(Q_F16, 3);
        else
            HALF_ROWS(Q_BF16, 3);
        break;
    default:
        if (f16)
            HALF_ROWS(Q_F16, 4);
        else
            HALF_ROWS(Q_BF16, 4);
    }
}

/* ---- F16 and BF16 rows, AVX-512 ---------------------------------------------------------
 * gemm_small's AVX-512 tiles (gemm_small.c, tile_avx512: 16 lanes, lane j summing k = j mod 16
 * in one multiply-add chain, the last step zero-padded, fold16 then reduce4) with the weights
 * converted in registers, for any number of activation rows: the same bits as converting the
 * rows to floats and calling gemm_small(GEMM_SMALL_AVX512, ...), which this path replaces on
 * AVX-512 machines. That path stored a tile of 8-64 converted weight rows and read it back:
 * BF16 decode read its weights at 0.38 of the machine's bandwidth where llama.cpp read them at
 * 0.89 (docs/results/2026-12-07-llama-compare-zen4-quiet.md). */

#define HALF512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw")))

/* From 2 activation rows a tile fetches the weights of the tile HALF_PF_DIST ahead into L2
 * during its first group of rows, as gemm_small's AVX-512 tiles do: one Zen 4 thread,
 * perf/quant_bench --types F16,BF16 --rows 1,2,4,8,32 --clock cpu (load 4-5), F16 1.2x at 2
 * rows, 1.4x at 4, 1.25x at 8, 1.05x at 32, BF16 (vdpbf16ps) 1.0, 1.4, 1.5, 1.08x; at one
 * row it cost 11-15%, so there is none. Where a tile's 4 rows take at most HALF_PF_L1_BYTES,
 * the next tile's rows are fetched into L1 during the last group of rows (gemm_small's
 * PF_L1_BYTES): the same quant_bench, 3 alternations, load 7.3-7.9, BF16 1.06-1.08x at 8-32
 * rows, F16 0.98-1.05x. */
#define HALF_PF_DIST     2
#define HALF_PF_MIN_ROWS 2
#define HALF_PF_L1_BYTES (16 * 1024)

/* 16 halves at h as floats, exact; lanes off in mask read as +0 (the tail of a row). */
static inline __attribute__((always_inline)) HALF512 __m512 half16(int type, const uint16_t *h,
                                                                   __mmask16 mask)
{
    const __m256i v = mask == (__mmask16)0xFFFF ? _mm256_loadu_si256((const __m256i *)h)
                                                : _mm256_maskz_loadu_epi16(mask, h);
    if (type == Q_F16) return _mm512_cvtph_ps(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

static inline __attribute__((always_inline)) HALF512 __m256 fold16(__m512 a)
{
    return _mm256_add_ps(_mm512_castps512_ps256(a),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* nr (1 or 4) weight rows (ld_w halves apart) by mr (1..4) activation rows; the sums of the
 * 4 weight rows go to y, y + ld_yn, y + 2 ld_yn, y + 3 ld_yn. */
static inline __attribute__((always_inline)) HALF512 void
half_tile512(int type, int nr, int mr, int K, const uint16_t *w, size_t ld_w, const float *x,
             float beta, float *y, int ld_y, size_t ld_yn, const uint16_t *pf, const uint16_t *pf0)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int n = 0; n < nr; n++)
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) acc[n][m] = _mm512_setzero_ps();
    const int K16 = K & ~15;
    for (int k = 0; k < K16; k += 16) {
        if (pf && !(k & 31)) {
#pragma GCC unroll 4
            for (int n = 0; n < 4; n++)
                _mm_prefetch((const char *)(pf + (size_t)n * ld_w + k), _MM_HINT_T1);
        }
        if (pf0 && !(k & 31)) {
#pragma GCC unroll 4
            for (int n = 0; n < 4; n++)
                _mm_prefetch((const char *)(pf0 + (size_t)n * ld_w + k), _MM_HINT_T0);
        }
        __m512 wv[4];
#pragma GCC unroll 4
        for (int n = 0; n < nr; n++) wv[n] = half16(type, w + (size_t)n * ld_w + k, 0xFFFF);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m512 xv = _mm512_loadu_ps(x + (size_t)m * K + k);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++) acc[n][m] = _mm512_fmadd_ps(xv, wv[n], acc[n][m]);
        }
    }
    if (K16 < K) {
        const __mmask16 mask = (__mmask16)((1u << (K - K16)) - 1);
        __m512 wv[4];
#pragma GCC unroll 4
        for (int n = 0; n < nr; n++) wv[n] = half16(type, w + (size_t)n * ld_w + K16, mask);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m512 xv = _mm512_maskz_loadu_ps(mask, x + (size_t)m * K + K16);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++) acc[n][m] = _mm512_fmadd_ps(xv, wv[n], acc[n][m]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        float *out = y + (size_t)m * ld_y;
        if (nr == 4)
            gemm_store4(gemm_reduce4(fold16(acc[0][m]), fold16(acc[1][m]), fold16(acc[2][m]),
                                     fold16(acc[3][m])),
                        beta, out, ld_yn);
        else {
            const __m256 f = fold16(acc[0][m]);
            float s = _mm_cvtss_f32(gemm_reduce4(f, f, f, f));
            out[0] = beta == 0.0f ? s : out[0] + s;
        }
    }
}

/* The activation rows m0.. left after the groups of 4, for weight rows of width nr. */
#define HALF512_TAIL(T_, nr_)                                                                      \
    do {                                                                                           \
        const float *xm = x + (size_t)m0 * k;                                                      \
        float *ym = y + (size_t)m0 * ld_y + n0;                                                    \
        switch (rows - m0) {                                                                       \
        case 3: half_tile512(T_, nr_, 3, k, wn, ld_w, xm, beta, ym, ld_y, ld_yn, pft, NULL);       \
            break;                                                                                 \
        case 2: half_tile512(T_, nr_, 2, k, wn, ld_w, xm, beta, ym, ld_y, ld_yn, pft, NULL);       \
            break;                                                                                 \
        case 1: half_tile512(T_, nr_, 1, k, wn, ld_w, xm, beta, ym, ld_y, ld_yn, pft, NULL);       \
            break;                                                                                 \
        default: break;                                                                            \
        }                                                                                          \
    } while (0)

/* Every weight tile meets the activation rows in groups of 4; the 4 weight rows stay in L1
 * while the groups pass. A tile's 4 rows are one from each quarter of the rows (i, q + i,
 * 2q + i, 3q + i with q = n / 4), so the weights are read as 4 long sequential streams, not as
 * 4 streams of one row each (1.5 KiB at k = 768) that the hardware prefetcher does not follow:
 * on one Zen 4 thread, one activation row, F16 weights were read at 7-11 GB/s from adjacent
 * rows with software prefetch and at 19-23 GB/s from the quarters without it (software
 * prefetch there cost 10-15%). The sums do not change: a tile's rows share no accumulator. */
static inline __attribute__((always_inline)) HALF512 void half_rows512(int type, const uint16_t *w,
                                                                       int n, int k, const float *x,
                                                                       int rows, float beta,
                                                                       float *y, int ld_y)
{
    const int q = n / 4;
    size_t ld_w = (size_t)q * k, ld_yn = (size_t)q;
    const bool l1 = (size_t)k * 4 * sizeof(uint16_t) <= HALF_PF_L1_BYTES;
    for (int n0 = 0; n0 < q; n0++) {
        const uint16_t *wn = w + (size_t)n0 * k;
        const uint16_t *next =
            n0 + HALF_PF_DIST < q && rows >= HALF_PF_MIN_ROWS ? wn + HALF_PF_DIST * k : NULL;
        const uint16_t *pft = rows < 4 ? next : NULL;
        int m0 = 0;
        for (; m0 + 4 <= rows; m0 += 4)
            half_tile512(type, 4, 4, k, wn, ld_w, x + (size_t)m0 * k, beta,
                         y + (size_t)m0 * ld_y + n0, ld_y, ld_yn, m0 == 0 ? next : NULL,
                         l1 && m0 > 0 && m0 + 8 > rows && n0 + 1 < q ? wn + k : NULL);
        HALF512_TAIL(type, 4);
    }
    ld_w = (size_t)k;
    ld_yn = 1;
    for (int n0 = 4 * q; n0 < n; n0++) {
        const uint16_t *wn = w + (size_t)n0 * k, *pft = NULL;
        int m0 = 0;
        for (; m0 + 4 <= rows; m0 += 4)
            half_tile512(type, 1, 4, k, wn, ld_w, x + (size_t)m0 * k, beta,
                         y + (size_t)m0 * ld_y + n0, ld_y, ld_yn, NULL, NULL);
        HALF512_TAIL(type, 1);
    }
}

/* Activation rows per pass over the weights: as gemm_small's (rows_per_pass), a pass's rows
 * within 256 KiB so that every weight tile finds them in cache; a multiple of 4. */
static int half_rows_per_pass(int k)
{
    int mc = (int)((256 * 1024) / ((size_t)k * sizeof(float)));
    mc &= ~3;
    return mc < 4 ? 4 : mc;
}

HALF512 void qk_rows_half_avx512(int type, const uint16_t *w, int n, int k, const float *x,
                                 int rows, float beta, float *y, int ld_y)
{
    const int mc = half_rows_per_pass(k);
    for (int m0 = 0; m0 < rows; m0 += mc) {
        const int m = rows - m0 < mc ? rows - m0 : mc;
        if (type == Q_F16)
            half_rows512(Q_F16, w, n, k, x + (size_t)m0 * k, m, beta, y + (size_t)m0 * ld_y, ld_y);
        else
            half_rows512(Q_BF16, w, n, k, x + (size_t)m0 * k, m, beta, y + (size_t)m0 * ld_y, ld_y);
    }
}

/* ---- BF16 rows, AVX-512 BF16 ------------------------------------------------------------
 * llama.cpp's arithmetic for BF16 weights: the activations rounded to bf16 (to nearest, ties
 * to even: vcvtne2ps2bf16), dotted with the weights as they lie by vdpbf16ps, 32 products an
 * instruction where the float path converts the weights and does 16: twice the arithmetic a
 * cycle (perf/machine_probe --mul), and no conversion. Not the exact float32 product: within
 * gemm_bf16.h's bound, |y - exact| <= (2^-8 + (K + 2) · 2^-24) · Σ_k |x w| (subnormal inputs
 * and results flushed to zero, as vdpbf16ps does).
 *
 * Lane j of an output's accumulator sums the pairs k = 32 t + 2 j, 32 t + 2 j + 1 over t in
 * order (the last step zero-padded), then fold16 and reduce4 as above: one order for every
 * output, whatever the tile, the rows beside it or the row count, so a row alone and in a batch
 * get the same bits. */

#define DPBF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512bf16")))

DPBF16 void qk_round_bf16_avx512(const float *x, int rows, int k, uint16_t *xb, int ld_xb)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * k;
        uint16_t *out = xb + (size_t)r * ld_xb;
        int i = 0;
        for (; i + 32 <= k; i += 32) {
            const __m512bh v =
                _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xr + i + 16), _mm512_loadu_ps(xr + i));
            _mm512_storeu_si512(out + i, (__m512i)v);
        }
        for (; i < ld_xb; i += 32) { /* the tail, zeros up to ld_xb */
            const int left = k - i < 0 ? 0 : k - i;
            const __mmask16 lo = (__mmask16)(left >= 16 ? 0xFFFF : (1u << left) - 1);
            const __mmask16 hi = (__mmask16)(left >= 32  ? 0xFFFF
                                             : left > 16 ? (1u << (left - 16)) - 1
                                                         : 0);
            const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, xr + i + 16),
                                                   _mm512_maskz_loadu_ps(lo, xr + i));
            _mm512_storeu_si512(out + i, (__m512i)v);
        }
    }
}

/* nr (1 or 4) weight rows (ld_w halves apart) by mr (1..4) rounded activation rows (ld_xb
 * halves apart, zero from K on); outputs as half_tile512's. */
static inline __attribute__((always_inline)) DPBF16 void
dp_tile(int nr, int mr, int K, const uint16_t *w, size_t ld_w, const uint16_t *xb, int ld_xb,
        float beta, float *y, int ld_y, size_t ld_yn, const uint16_t *pf, const uint16_t *pf0)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int n = 0; n < nr; n++)
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) acc[n][m] = _mm512_setzero_ps();
    const int K32 = K & ~31;
    for (int k = 0; k < K32; k += 32) {
        if (pf) {
#pragma GCC unroll 4
            for (int n = 0; n < 4; n++)
                _mm_prefetch((const char *)(pf + (size_t)n * ld_w + k), _MM_HINT_T1);
        }
        if (pf0) {
#pragma GCC unroll 4
            for (int n = 0; n < 4; n++)
                _mm_prefetch((const char *)(pf0 + (size_t)n * ld_w + k), _MM_HINT_T0);
        }
        __m512bh wv[4];
#pragma GCC unroll 4
        for (int n = 0; n < nr; n++) wv[n] = (__m512bh)_mm512_loadu_si512(w + (size_t)n * ld_w + k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + (size_t)m * ld_xb + k);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++) acc[n][m] = _mm512_dpbf16_ps(acc[n][m], xv, wv[n]);
        }
    }
    if (K32 < K) {
        const __mmask32 mask = (__mmask32)((1u << (K - K32)) - 1);
        __m512bh wv[4];
#pragma GCC unroll 4
        for (int n = 0; n < nr; n++)
            wv[n] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + (size_t)n * ld_w + K32);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + (size_t)m * ld_xb + K32);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++) acc[n][m] = _mm512_dpbf16_ps(acc[n][m], xv, wv[n]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        float *out = y + (size_t)m * ld_y;
        if (nr == 4)
            gemm_store4(gemm_reduce4(fold16(acc[0][m]), fold16(acc[1][m]), fold16(acc[2][m]),
                                     fold16(acc[3][m])),
                        beta, out, ld_yn);
        else {
            const __m256 f = fold16(acc[0][m]);
            float s = _mm_cvtss_f32(gemm_reduce4(f, f, f, f));
            out[0] = beta == 0.0f ? s : out[0] + s;
        }
    }
}

#define DP_TAIL(nr_)                                                                               \
    do {                                                                                           \
        const uint16_t *xm = xb + (size_t)m0 * ld_xb;                                              \
        float *ym = y + (size_t)m0 * ld_y + n0;                                                    \
        switch (rows - m0) {                                                                       \
        case 3: dp_tile(nr_, 3, k, wn, ld_w, xm, ld_xb, beta, ym, ld_y, ld_yn, pft, NULL); break;  \
        case 2: dp_tile(nr_, 2, k, wn, ld_w, xm, ld_xb, beta, ym, ld_y, ld_yn, pft, NULL); break;  \
        case 1: dp_tile(nr_, 1, k, wn, ld_w, xm, ld_xb, beta, ym, ld_y, ld_yn, pft, NULL); break;  \
        default: break;                                                                            \
        }                                                                                          \
    } while (0)

/* The weight tiles as half_rows512's: a tile's 4 rows one from each quarter of the rows. */
DPBF16 void qk_rows_bf16_dp_avx512(const uint16_t *w, int n, int k, const uint16_t *xb, int ld_xb,
                                   int rows, float beta, float *y, int ld_y)
{
    const int q = n / 4;
    size_t ld_w = (size_t)q * k, ld_yn = (size_t)q;
    const bool l1 = (size_t)k * 4 * sizeof(uint16_t) <= HALF_PF_L1_BYTES;
    for (int n0 = 0; n0 < q; n0++) {
        const uint16_t *wn = w + (size_t)n0 * k;
        const uint16_t *next =
            n0 + HALF_PF_DIST < q && rows >= HALF_PF_MIN_ROWS ? wn + HALF_PF_DIST * k : NULL;
        const uint16_t *pft = rows < 4 ? next : NULL;
        int m0 = 0;
        for (; m0 + 4 <= rows; m0 += 4)
            dp_tile(4, 4, k, wn, ld_w, xb + (size_t)m0 * ld_xb, ld_xb, beta,
                    y + (size_t)m0 * ld_y + n0, ld_y, ld_yn, m0 == 0 ? next : NULL,
                    l1 && m0 > 0 && m0 + 8 > rows && n0 + 1 < q ? wn + k : NULL);
        DP_TAIL(4);
    }
    ld_w = (size_t)k;
    ld_yn = 1;
    for (int n0 = 4 * q; n0 < n; n0++) {
        const uint16_t *wn = w + (size_t)n0 * k, *pft = NULL;
        int m0 = 0;
        for (; m0 + 4 <= rows; m0 += 4)
            dp_tile(1, 4, k, wn, ld_w, xb + (size_t)m0 * ld_xb, ld_xb, beta,
                    y + (size_t)m0 * ld_y + n0, ld_y, ld_yn, NULL, NULL);
        DP_TAIL(1);
    }
}

SIMD float qk_dot_float_avx2(int type, const void *row, const float *x, int64_t k)
{
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    switch (type) {
    case Q_F32: {
        const float *w = row;
        int64_t i = 0;
        for (; i + 16 <= k; i += 16) {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc);
            acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), acc2);
        }
        float tail = 0.0f;
        for (; i < k; i++) tail += w[i] * x[i];
        return hsum8(_mm256_add_ps(acc, acc2)) + tail;
    }
    case Q_F16: {
        const uint16_t *w = row;
        int64_t i = 0;
        for (; i + 8 <= k; i += 8)
            acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))),
                                  _mm256_loadu_ps(x + i), acc);
        float tail = 0.0f;
        for (; i < k; i++) tail += qk_f16_to_f32(w[i]) * x[i];
        return hsum8(acc) + tail;
    }
    case Q_BF16: {
        const uint16_t *w = row;
        int64_t i = 0;
        for (; i + 8 <= k; i += 8) {
            __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i)));
            acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)),
                                  _mm256_loadu_ps(x + i), acc);
        }
        float tail = 0.0f;
        for (; i < k; i++) tail += qk_bf16_to_f32(w[i]) * x[i];
        return hsum8(acc) + tail;
    }
    }
    return 0.0f;
}

#endif /* QK_X86 */
