/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/gemm_bf16.c — y = beta * y + bf16(x) · w^T for prefill with BF16 weights, in
 * AVX-512 BF16 tiles (see gemm_bf16.h for the contract).
 *
 * Blocking as gemm_f32's (BLIS's order): for each block of NC weight rows and KC elements of
 * k, the weight block is packed into panels of NR = 32 rows, pair-major (panel[kp][32]: the
 * 32-bit pairs w_j[2 kp], w_j[2 kp + 1] of the 32 rows, as vdpbf16ps pairs them); then for
 * each block of MC activation rows, their KC elements are rounded to bf16 once (32 at a time,
 * vcvtne2ps2bf16, zeros past K), and the 8 x 32 tile runs over the panels: per pair of k, two
 * loads of weights, eight broadcast pairs of activations, sixteen vdpbf16ps. Rounding the
 * activations again for every block of NC weight rows costs 1/NC of the products — and more
 * where callers split N into chunks of less than NC, each chunk rounding every row again: a
 * prefill on two threads rounded each activation row 8 to 32 times a product (a tenth of the
 * time in the tiles, perf record). gemm_bf16_rounded takes rows rounded once before
 * (gemm_bf16_round, which the backend runs once per product for all its chunks); the same
 * roundings, so the same bits. gemm_bf16_packed takes weights packed once (at load, by
 * gemm_bf16_pack) into the same panels, each over all of K: no packing in the product (7% of
 * a one-thread BF16 prefill, and all but a tenth of a one-row product), the same tiles over
 * the same pairs in the same order, so the same bits again.
 */
#include "kernels/cpu/gemm_bf16.h"

#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/gemm_pack.h"
#include "kernels/cpu/quant.h"

#include <string.h>

#define WT_F32  0 /* weight types: quant.h's numbers, ggml's */
#define WT_F16  1
#define WT_BF16 30

#if defined(__x86_64__)
#include <immintrin.h>

#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

#define KC 256 /* k per packed block: even, so every block starts on a pair */
#define NR 32  /* weight rows per panel: two zmm of 16 */
#define MR 8   /* activation rows per tile: 16 accumulators */
#define MC 64  /* activation rows rounded at a time: a multiple of MR */
#define NC 128 /* weight rows per packed block: a multiple of NR */
#define MP 256 /* activation rows a pass over weights packed once (gemm_bf16_packed) */

bool gemm_bf16_supported(void)
{
    static int ok = -1; /* every thread computes the same value: relaxed atomics */
    int v = __atomic_load_n(&ok, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
        __atomic_store_n(&ok, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* ---- packing ---------------------------------------------------------------------------- */

/* Element k of a row of wtype as bf16: BF16 as it lies, F32 and F16 rounded to the nearest
 * (q_f32_to_bf16; vcvtneps2bf16 below rounds alike, but for subnormals, which it flushes). */
static inline uint32_t bf16_at(int wtype, const void *row, int k)
{
    switch (wtype) {
    case WT_F32: return q_f32_to_bf16(((const float *)row)[k]);
    case WT_F16: return q_f32_to_bf16(q_f16_to_f32(((const uint16_t *)row)[k]));
    default: return ((const uint16_t *)row)[k];
    }
}

/* The pair of a row at k and k + 1 (k + 1 < kend, or 0 in its place): low half the first. */
static inline uint32_t pair_at(int wtype, const void *row, int k, int kend)
{
    return bf16_at(wtype, row, k) | (k + 1 < kend ? bf16_at(wtype, row, k + 1) << 16 : 0u);
}

/* Elements k .. k + 15 of a row as 16 bf16 (8 pairs) */
static inline __attribute__((always_inline)) BF16 __m256 load16(int wtype, const void *row, int k)
{
    if (wtype == WT_F32) return (__m256)_mm512_cvtneps_pbh(_mm512_loadu_ps((const float *)row + k));
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k));
    if (wtype == WT_F16) return (__m256)_mm512_cvtneps_pbh(_mm512_cvtph_ps(h));
    return _mm256_castsi256_ps(h);
}

/* out[kp * NR + j] = pair of rows[j] at k + 2 kp, for j < 8 and kp < 8: the 32-bit pairs
 * transposed as floats. */
static inline __attribute__((always_inline)) BF16 void pack8x8(int wtype, const void *const *rows,
                                                               int k, uint32_t *out)
{
    gemm_tr8x8(load16(wtype, rows[0], k), load16(wtype, rows[1], k), load16(wtype, rows[2], k),
               load16(wtype, rows[3], k), load16(wtype, rows[4], k), load16(wtype, rows[5], k),
               load16(wtype, rows[6], k), load16(wtype, rows[7], k), (float *)out, NR);
}

/* One panel of nr rows (zeros up to NR) over k0 .. k0 + kc of rows K long, (kc + 1) / 2
 * pairs (the last one's high half 0 where kc is odd). WTYPE a constant at each call site. */
static inline __attribute__((always_inline)) BF16 void pack_panel_t(const int wtype, const char *w,
                                                                    size_t rb, int nr, int k0,
                                                                    int kc, int K, uint32_t *out)
{
    const void *rows[NR];
    for (int j = 0; j < nr; j++) rows[j] = w + (size_t)j * rb;
    const int kp_n = (kc + 1) / 2, kp8 = (kc / 2) & ~7, kend = k0 + kc < K ? k0 + kc : K;
    for (int g = 0; g < NR; g += 8) {
        if (g + 8 <= nr) {
            for (int kp = 0; kp < kp8; kp += 8)
                pack8x8(wtype, rows + g, k0 + 2 * kp, out + (size_t)kp * NR + g);
            for (int kp = kp8; kp < kp_n; kp++)
                for (int j = 0; j < 8; j++)
                    out[(size_t)kp * NR + g + j] = pair_at(wtype, rows[g + j], k0 + 2 * kp, kend);
        } else {
            for (int kp = 0; kp < kp_n; kp++)
                for (int j = 0; j < 8; j++)
                    out[(size_t)kp * NR + g + j] =
                        g + j < nr ? pair_at(wtype, rows[g + j], k0 + 2 * kp, kend) : 0u;
        }
    }
}

static BF16 void pack_panel(int wtype, const char *w, size_t rb, int nr, int k0, int kc, int K,
                            uint32_t *out)
{
    switch (wtype) {
    case WT_F32: pack_panel_t(WT_F32, w, rb, nr, k0, kc, K, out); break;
    case WT_F16: pack_panel_t(WT_F16, w, rb, nr, k0, kc, K, out); break;
    default: pack_panel_t(WT_BF16, w, rb, nr, k0, kc, K, out); break;
    }
}

/* xb[r][k0 .. k1) = bf16(x[r][k0 .. k1)) for r < mr, and where k1 = kc the zeros after kc up to
 * roundup(kc, 32); rows of x ld_x and of xb ld_xb apart, x and xb at element 0 of a row. Each
 * element on its own (vcvtneps2bf16), so a row rounded in parts of columns, by whichever task
 * made each part, is the row rounded whole. */
static BF16 void round_part(const float *x, int ld_x, int mr, int kc, int k0, int k1, uint16_t *xb,
                            int ld_xb)
{
    const int kend = k1 == kc ? (kc + 31) / 32 * 32 : k1;
    for (int r = 0; r < mr; r++) {
        const float *xr = x + (size_t)r * ld_x;
        uint16_t *o = xb + (size_t)r * ld_xb;
        for (int i = k0; i < kend; i += 16) {
            const int left = k1 - i, n = kend - i < 16 ? kend - i : 16;
            const __mmask16 in = left >= 16  ? 0xFFFF
                                 : left <= 0 ? 0
                                             : (__mmask16)((1u << left) - 1),
                            out = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1);
            const __m512 a = _mm512_maskz_loadu_ps(in, xr + i);
            _mm256_mask_storeu_epi16(o + i, out, (__m256i)_mm512_cvtneps_pbh(a));
        }
    }
}

/* xb[r][0 .. roundup(kc, 32)) = bf16(x[r][0 .. kc)), zeros after kc, for r < mr; rows of xb
 * ld_xb apart. */
static BF16 void round_rows(const float *x, int ld_x, int mr, int kc, uint16_t *xb, int ld_xb)
{
    round_part(x, ld_x, mr, kc, 0, kc, xb, ld_xb);
}

/* ---- the 8 x 32 tile ---------------------------------------------------------------------- */

/* y[r][0..nr) (+)= Σ_kp xb[r] pair kp · panel[kp] for r < R (a constant at each call site);
 * rows of xb ld_xb apart. */
static inline __attribute__((always_inline)) BF16 void tile(const int R, int kp_n,
                                                            const uint16_t *xb, int ld_xb,
                                                            const uint32_t *b, float *y, int ld_y,
                                                            int nr, bool acc)
{
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) c0[r] = c1[r] = _mm512_setzero_ps();
    for (int kp = 0; kp < kp_n; kp++) {
        const __m512bh b0 = (__m512bh)_mm512_load_si512(b + (size_t)kp * NR),
                       b1 = (__m512bh)_mm512_load_si512(b + (size_t)kp * NR + 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            uint32_t p;
            memcpy(&p, xb + (size_t)r * ld_xb + 2 * kp, 4);
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)p);
            c0[r] = _mm512_dpbf16_ps(c0[r], a, b0);
            c1[r] = _mm512_dpbf16_ps(c1[r], a, b1);
        }
    }
    const __mmask16 m0 = nr >= 16 ? 0xFFFF : (__mmask16)((1u << nr) - 1),
                    m1 = nr >= 32   ? 0xFFFF
                         : nr <= 16 ? 0
                                    : (__mmask16)((1u << (nr - 16)) - 1);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        float *yr = y + (size_t)r * ld_y;
        if (acc) {
            c0[r] = _mm512_add_ps(c0[r], _mm512_maskz_loadu_ps(m0, yr));
            c1[r] = _mm512_add_ps(c1[r], _mm512_maskz_loadu_ps(m1, yr + 16));
        }
        _mm512_mask_storeu_ps(yr, m0, c0[r]);
        _mm512_mask_storeu_ps(yr + 16, m1, c1[r]);
    }
}

static BF16 void tile_mr(int mr, int kp_n, const uint16_t *xb, int ld_xb, const uint32_t *b,
                         float *y, int ld_y, int nr, bool acc)
{
    switch (mr) {
    case 8: tile(8, kp_n, xb, ld_xb, b, y, ld_y, nr, acc); break;
    case 7: tile(7, kp_n, xb, ld_xb, b, y, ld_y, nr, acc); break;
    case 6: tile(6, kp_n, xb, ld_xb, b, y, ld_y, nr, acc); break;
    case 5: tile(5, kp_n, xb, ld_xb, b, y, ld_y, nr, acc); break;
    case 4: tile(4, kp_n, xb, ld_xb, b, y, ld_y, nr, acc); break;
    case 3: tile(3, kp_n, xb, ld_xb, b, y, ld_y, nr, acc); break;
    case 2: tile(2, kp_n, xb, ld_xb, b, y, ld_y, nr, acc); break;
    default: tile(1, kp_n, xb, ld_xb, b, y, ld_y, nr, acc); break;
    }
}

/* The product, the activations either as floats (x, rounded here block by block into the
 * buffer after the panels) or rounded before (xr, rows ld_xr apart: gemm_bf16_round). */
static bool product(int wtype, int M, int N, int K, const float *x, int ld_x, const uint16_t *xr,
                    int ld_xr, const void *w, size_t w_row_bytes, float beta, float *y, int ld_y)
{
    if (!gemm_bf16_supported() || (wtype != WT_F32 && wtype != WT_F16 && wtype != WT_BF16))
        return false;
    if (M <= 0 || N <= 0) return true;
    /* NC x KC / 2 pairs of weight panels, then MC x KC bf16 activations */
    _Static_assert((size_t)NC * KC * 2 + (size_t)MC * KC * 2 <= GEMM_PACK_BUF_BYTES, "buffer");
    uint32_t *buf = gemm_pack_buf();
    if (!buf) return false;
    uint16_t *xb = (uint16_t *)(buf + (size_t)NC * KC / 2);
    for (int jc = 0; jc < N; jc += NC) {
        const int nc = N - jc < NC ? N - jc : NC;
        for (int pc = 0; pc < K; pc += KC) {
            const int kc = K - pc < KC ? K - pc : KC, kp_n = (kc + 1) / 2;
            const bool acc = pc > 0 || beta != 0.0f;
            for (int jr = 0; jr < nc; jr += NR)
                pack_panel(wtype, (const char *)w + (size_t)(jc + jr) * w_row_bytes, w_row_bytes,
                           nc - jr < NR ? nc - jr : NR, pc, kc, K, buf + (size_t)jr * KC / 2);
            for (int ic = 0; ic < M; ic += MC) {
                const int mc = M - ic < MC ? M - ic : MC;
                const uint16_t *a = xr ? xr + (size_t)ic * ld_xr + pc : xb;
                const int ld_a = xr ? ld_xr : KC;
                if (!xr) round_rows(x + (size_t)ic * ld_x + pc, ld_x, mc, kc, xb, KC);
                for (int jr = 0; jr < nc; jr += NR) {
                    const int nr = nc - jr < NR ? nc - jr : NR;
                    const uint32_t *b = buf + (size_t)jr * KC / 2;
                    for (int ir = 0; ir < mc; ir += MR)
                        tile_mr(mc - ir < MR ? mc - ir : MR, kp_n, a + (size_t)ir * ld_a, ld_a, b,
                                y + (size_t)(ic + ir) * ld_y + jc + jr, ld_y, nr, acc);
                }
            }
        }
    }
    return true;
}

bool gemm_bf16(int wtype, int M, int N, int K, const float *x, int ld_x, const void *w,
               size_t w_row_bytes, float beta, float *y, int ld_y)
{
    return product(wtype, M, N, K, x, ld_x, NULL, 0, w, w_row_bytes, beta, y, ld_y);
}

void gemm_bf16_round(int M, int K, const float *x, int ld_x, uint16_t *xr)
{
    if (gemm_bf16_supported()) round_rows(x, ld_x, M, K, xr, gemm_bf16_round_ld(K));
}

void gemm_bf16_round_cols(int M, int K, int k0, int k1, const float *x, int ld_x, uint16_t *xr)
{
    if (gemm_bf16_supported() && 0 <= k0 && k0 < k1 && k1 <= K)
        round_part(x, ld_x, M, K, k0, k1, xr, gemm_bf16_round_ld(K));
}

bool gemm_bf16_rounded(int wtype, int M, int N, int K, const uint16_t *xr, const void *w,
                       size_t w_row_bytes, float beta, float *y, int ld_y)
{
    return product(wtype, M, N, K, NULL, 0, xr, gemm_bf16_round_ld(K), w, w_row_bytes, beta, y,
                   ld_y);
}

/* ---- weights packed once ------------------------------------------------------------- */

/* Pairs of a panel over all of K: KC / 2 for every block of KC (even) but the last,
 * (kc + 1) / 2 for it. */
static size_t panel_pairs(int K)
{
    return ((size_t)K + 1) / 2;
}

bool gemm_bf16_pack(int wtype, int N, int K, const void *w, size_t w_row_bytes, void *out)
{
    if (!gemm_bf16_supported() || (wtype != WT_F32 && wtype != WT_F16 && wtype != WT_BF16))
        return false;
    const size_t pp = panel_pairs(K);
    uint32_t *o = out;
    /* block by block, as product packs them: the same pairs, bit for bit */
    for (int j = 0; j < N; j += NR, o += pp * NR)
        for (int pc = 0; pc < K; pc += KC)
            pack_panel(wtype, (const char *)w + (size_t)j * w_row_bytes, w_row_bytes,
                       N - j < NR ? N - j : NR, pc, K - pc < KC ? K - pc : KC, K,
                       o + (size_t)pc / 2 * NR);
    return true;
}

bool gemm_bf16_packed(int M, int N, int K, const uint16_t *xr, const void *wp, int n0, float beta,
                      float *y, int ld_y)
{
    if (!gemm_bf16_supported() || n0 % NR) return false;
    if (M <= 0 || N <= 0) return true;
    const int ld_a = gemm_bf16_round_ld(K);
    const size_t pp = panel_pairs(K);
    const uint32_t *w0 = (const uint32_t *)wp + (size_t)(n0 / NR) * pp * NR;
    /* Nothing to pack, so no blocks of NC weight rows: each panel's block of k (16 KiB, in
     * L1) serves every tile of MP activation rows (their block of k in L2) before the next;
     * 5% faster than the packing order at 256 rows, 1.2-1.4x at 64 (/tmp harness, one
     * thread, BF16 stories110M shapes). Each output sums its blocks of k in the same order
     * as product's: the same bits. */
    for (int ic = 0; ic < M; ic += MP) {
        const int mc = M - ic < MP ? M - ic : MP;
        for (int jr = 0; jr < N; jr += NR) {
            const int nr = N - jr < NR ? N - jr : NR;
            for (int pc = 0; pc < K; pc += KC) {
                const int kc = K - pc < KC ? K - pc : KC, kp_n = (kc + 1) / 2;
                const bool acc = pc > 0 || beta != 0.0f;
                const uint32_t *b = w0 + (size_t)(jr / NR) * pp * NR + (size_t)pc / 2 * NR;
                for (int ir = 0; ir < mc; ir += MR)
                    tile_mr(mc - ir < MR ? mc - ir : MR, kp_n, xr + (size_t)(ic + ir) * ld_a + pc,
                            ld_a, b, y + (size_t)(ic + ir) * ld_y + jr, ld_y, nr, acc);
            }
        }
    }
    return true;
}

#else /* not x86-64: the float paths take every prefill product */

bool gemm_bf16_supported(void)
{
    return false;
}

bool gemm_bf16(int wtype, int M, int N, int K, const float *x, int ld_x, const void *w,
               size_t w_row_bytes, float beta, float *y, int ld_y)
{
    (void)wtype, (void)M, (void)N, (void)K, (void)x, (void)ld_x, (void)w, (void)w_row_bytes;
    (void)beta, (void)y, (void)ld_y;
    return false;
}

void gemm_bf16_round(int M, int K, const float *x, int ld_x, uint16_t *xr)
{
    (void)M, (void)K, (void)x, (void)ld_x, (void)xr;
}

void gemm_bf16_round_cols(int M, int K, int k0, int k1, const float *x, int ld_x, uint16_t *xr)
{
    (void)M, (void)K, (void)k0, (void)k1, (void)x, (void)ld_x, (void)xr;
}

bool gemm_bf16_rounded(int wtype, int M, int N, int K, const uint16_t *xr, const void *w,
                       size_t w_row_bytes, float beta, float *y, int ld_y)
{
    (void)wtype, (void)M, (void)N, (void)K, (void)xr, (void)w, (void)w_row_bytes;
    (void)beta, (void)y, (void)ld_y;
    return false;
}

bool gemm_bf16_pack(int wtype, int N, int K, const void *w, size_t w_row_bytes, void *out)
{
    (void)wtype, (void)N, (void)K, (void)w, (void)w_row_bytes, (void)out;
    return false;
}

bool gemm_bf16_packed(int M, int N, int K, const uint16_t *xr, const void *wp, int n0, float beta,
                      float *y, int ld_y)
{
    (void)M, (void)N, (void)K, (void)xr, (void)wp, (void)n0, (void)beta, (void)y, (void)ld_y;
    return false;
}

#endif

size_t gemm_bf16_packed_bytes(int N, int K)
{
    return (size_t)(N + 31) / 32 * 32 * (((size_t)K + 1) / 2) * 4;
}

int gemm_bf16_round_ld(int K)
{
    /* whole 32-element stores, and one cache line more: rows 4 KiB apart (K = 2048) would
     * put a block's rows in the same L1 sets */
    return (K + 31) / 32 * 32 + 32;
}

bool gemm_bf16_prefer(int wtype)
{
    if (!gemm_bf16_supported()) return false;
    const gemm_f32_mode m = gemm_f32_mode_get();
    return m == GEMM_F32_BF16 || (m == GEMM_F32_AUTO && wtype == WT_BF16);
}
