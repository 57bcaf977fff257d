/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_kpack.c — Q4_K and Q6_K weights packed once at load for the products of
 * a few activation rows (decode), with AVX-512 VNNI: the layout (qk_p1_*) and its kernels.
 *
 * As they lie, one weight row after another (quant_kquants.c's qk_kt1_*), every 256 weights
 * of a row cost their own scale unpacking, two vpdpbusd per 64 bytes of x and a horizontal
 * reduction (vpackssdw, vpdpwssd, extracts): ~35 vector operations per 144 bytes, so one
 * thread read Q4_K at 12-19 GB/s, short of memory. Packed, 16 weight rows lie side by side:
 * each dword of a zmm is 4 bytes of a different row, so one vpdpbusd with 4 bytes of x
 * broadcast serves 16 rows and the rows' sums stay in their lanes to the end (no reduction);
 * the scales are bytes already unpacked. Per 16 rows and 256 elements (a "tile superblock"):
 *
 *   Q4_K, 2368 bytes (16 x 144 + 64):
 *     q    [32][16][4]  dword v of each row's 128 bytes of nibbles (the bytes as they lie:
 *                       low nibbles elements 64 (v / 8) + 4 (v % 8) + 0..3, high ones 32 on)
 *     d    [16] f16, dmin [16] f16
 *     sc   [8][16]      the 6-bit scale of each block of 32, a byte a row
 *     mn   [4][16][2]   the minimums of blocks 2p and 2p + 1, a byte each, side by side
 *   Q6_K, 3392 bytes (16 x 210 + 32, padded to a cache line):
 *     q    [2][8][3][16][4]  for each half h and group g of 4 elements of each chunk c of 32
 *                       (elements 128 h + 32 c + 4 g + 0..3), three bytes an element: the
 *                       6-bit values of chunks 0, 1 and 2 in their low bits, chunk 3's value
 *                       two bits in the top of each (0-1, 2-3, 4-5), in the order the kernel
 *                       reads them (laid out as ql and qh apart the lines came from memory at
 *                       half the speed; ql and qh interleaved took 13 operations to unpack)
 *     sc   [16][16]     the int8 scale of each 16 elements
 *     d    [16] f16
 *
 * A tile holds nsb = k / 256 such superblocks, one after the other; tiles follow each other
 * (the rows of the last past n are zero and never stored). The arithmetic is qk_kt1_*'s and
 * kt_kernel's: per weight row, activation row and 256, the same exact integer sums (I: the
 * products times the sub-block scales, Q6_K's from -32 x the sums of x per 16; M: Q4_K's
 * minimums times the sums of x per 32), then the same float steps in the same order, so a
 * product read from the packing has the bits of one read as the weights lie, alone or in a
 * batch.
 *
 * The kernels ask for no line ahead: a tile follows the one before it, so a worker's rows
 * are one stream that the hardware prefetchers follow. The first version fetched each line
 * 4 KiB ahead into L1 (prefetcht0), which made them slower, the more so the busier the
 * memory: on a Zen 4 with others' traffic on the bus one thread took 1.17x the time at one
 * row from memory and 1.6-1.9x at four, and two threads decoding one sequence of a Q4_K_M
 * file ran 0.83x as fast as without it (on the quiet machine, slower than the weights as
 * they lie). 1 or 2 KiB ahead, or into L2 or as non-temporal, were slower than none too
 * (results/2026-12-08-kquant-packing-zen4-s16.md).
 */
#include "kernels/cpu/quant_internal.h"

#define P1_ROWS   16
#define P1_Q4K_SB 2368
#define P1_Q6K_SB 3392

/* The offsets of the parts of a tile superblock. */
enum { P1_Q4K_D = 2048, P1_Q4K_DMIN = 2080, P1_Q4K_SC = 2112, P1_Q4K_MN = 2240 };
enum { P1_Q6K_SC = 3072, P1_Q6K_D = 3328 };

bool qk_p1_type(int type)
{
    return type == Q_Q4_K || type == Q_Q6_K;
}

size_t qk_p1_bytes(int type, int n, int64_t k)
{
    if (!qk_p1_type(type) || n <= 0 || k <= 0 || k % QK_K) return 0;
    const size_t tiles = (size_t)(n + P1_ROWS - 1) / P1_ROWS;
    return tiles * (size_t)(k / QK_K) * (type == Q_Q4_K ? P1_Q4K_SB : P1_Q6K_SB);
}

/* One tile superblock of the m (<= 16) rows at w, rb bytes apart, their superblock sb. */
static void p1_pack_q4_k(const char *w, size_t rb, int m, int64_t sb, uint8_t *o)
{
    memset(o, 0, P1_Q4K_SB);
    for (int r = 0; r < m; r++) {
        const blk_q4_k *b = (const blk_q4_k *)(w + (size_t)r * rb) + sb;
        for (int v = 0; v < 32; v++) memcpy(o + 64 * v + 4 * r, b->qs + 4 * v, 4);
        memcpy(o + P1_Q4K_D + 2 * r, &b->d, 2);
        memcpy(o + P1_Q4K_DMIN + 2 * r, &b->dmin, 2);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            scale_min_k4(j, b->scales, &sc, &mn);
            o[P1_Q4K_SC + 16 * j + r] = sc;
            o[P1_Q4K_MN + 32 * (j / 2) + 2 * r + j % 2] = mn;
        }
    }
}

static void p1_pack_q6_k(const char *w, size_t rb, int m, int64_t sb, uint8_t *o)
{
    memset(o, 0, P1_Q6K_SB);
    for (int r = 0; r < m; r++) {
        const blk_q6_k *b = (const blk_q6_k *)(w + (size_t)r * rb) + sb;
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 8; g++)
                for (int e = 0; e < 4; e++) {
                    int q[4];
                    for (int c = 0; c < 4; c++) {
                        const uint8_t ql = b->ql[64 * h + 32 * (c & 1) + 4 * g + e];
                        const uint8_t qh = b->qh[32 * h + 4 * g + e];
                        q[c] = (c < 2 ? ql & 0xF : ql >> 4) | ((qh >> (2 * c)) & 3) << 4;
                    }
                    uint8_t *at = o + 192 * (8 * h + g) + 4 * r + e;
                    for (int c = 0; c < 3; c++)
                        at[64 * c] = (uint8_t)(q[c] | (q[3] >> (2 * c)) << 6);
                }
        for (int g = 0; g < 16; g++) o[P1_Q6K_SC + 16 * g + r] = (uint8_t)b->scales[g];
        memcpy(o + P1_Q6K_D + 2 * r, &b->d, 2);
    }
}

bool qk_p1_pack(int type, const void *w, int n, int64_t k, void *out)
{
    if (!qk_p1_bytes(type, n, k)) return false;
    const size_t rb = q_row_bytes(type, k), sbb = type == Q_Q4_K ? P1_Q4K_SB : P1_Q6K_SB;
    const int64_t nsb = k / QK_K;
    uint8_t *o = out;
    for (int i0 = 0; i0 < n; i0 += P1_ROWS) {
        const int m = n - i0 < P1_ROWS ? n - i0 : P1_ROWS;
        const char *wt = (const char *)w + (size_t)i0 * rb;
        for (int64_t sb = 0; sb < nsb; sb++, o += sbb)
            (type == Q_Q4_K ? p1_pack_q4_k : p1_pack_q6_k)(wt, rb, m, sb, o);
    }
    return true;
}

#if QK_X86

/* y[0..15] (mask: the rows that exist) = acc, or beta y + acc (kt_store's steps). */
VNNI512 static inline __attribute__((always_inline)) void p1_store(float *yr, __m512 v, float beta,
                                                                   __mmask16 mask)
{
    if (beta != 0.0f)
        v = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mask, yr)), v);
    _mm512_mask_storeu_ps(yr, mask, v);
}

/* 4 bytes of x at p broadcast to 16 dwords (vpdpbusd's embedded broadcast). */
VNNI512 static inline __attribute__((always_inline)) __m512i p1_x4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Q4_K, one tile (16 rows, m stored) times R activation rows (a constant, 1..KT1_ROWS). Each
 * 64 bytes of q hold 4 bytes of each row: the low nibbles (and 0x0F) are elements of block
 * 2jj, the high ones (and 0xF0: 16 times their value) of block 2jj + 1; the high blocks' sums
 * (16 I) are kept apart and shifted down once per 256, exactly (every term is a multiple of
 * 16; |16 I| < 16 x 4 x 63 x 32 x 15 x 127 < 2^31). */
VNNI512 static inline __attribute__((always_inline)) void p1_q4_k(const uint8_t *t, int64_t nsb,
                                                                  const xq8 *x, int64_t k,
                                                                  float beta, float *y, int ld_y,
                                                                  __mmask16 mask, const int R)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m4h = _mm512_set1_epi8((char)0xF0);
    const __m256i ones = _mm256_set1_epi16(1);
    __m512 acc[KT1_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++, t += P1_Q4K_SB) {
        __m512i Ilo[KT1_ROWS], Ihi[KT1_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) Ilo[r] = Ihi[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int jj = 0; jj < 4; jj++) {
            __m512i plo[KT1_ROWS], phi[KT1_ROWS];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) plo[r] = phi[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m512i v = _mm512_load_si512(t + 64 * (8 * jj + g));
                const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(v, m4h);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const int8_t *xr = x->kq + r * k + sb * QK_K + 64 * jj + 4 * g;
                    plo[r] = _mm512_dpbusd_epi32(plo[r], lo, p1_x4(xr));
                    phi[r] = _mm512_dpbusd_epi32(phi[r], hi, p1_x4(xr + 32));
                }
            }
            const __m512i sclo =
                _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(t + P1_Q4K_SC + 32 * jj)));
            const __m512i schi = _mm512_cvtepu8_epi32(
                _mm_load_si128((const __m128i *)(t + P1_Q4K_SC + 32 * jj + 16)));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                Ilo[r] = _mm512_add_epi32(Ilo[r], _mm512_mullo_epi32(plo[r], sclo));
                Ihi[r] = _mm512_add_epi32(Ihi[r], _mm512_mullo_epi32(phi[r], schi));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(t + P1_Q4K_D)));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(t + P1_Q4K_DMIN)));
        __m512i mn[4];
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            mn[p] =
                _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(t + P1_Q4K_MN + 32 * p)));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float dx = x->kd[r * nsb + sb];
            const __m512i I = _mm512_add_epi32(Ilo[r], _mm512_srai_epi32(Ihi[r], 4));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d, _mm512_set1_ps(dx)),
                                     acc[r]);
            /* the sums of x per 32 from Q8_K's per 16, two to a dword (kt1_end's) */
            const __m256i s32 = _mm256_madd_epi16(
                _mm256_loadu_si256((const __m256i *)(x->ks + r * (k / 16) + sb * 16)), ones);
            const __m128i bs = _mm256_cvtepi32_epi16(s32);
            __m512i M = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                M = _mm512_dpwssd_epi32(M, mn[p],
                                        _mm512_broadcastd_epi32(_mm_shuffle_epi32(bs, p * 0x55)));
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M),
                                      _mm512_mul_ps(dmin, _mm512_set1_ps(dx)), acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) p1_store(y + (size_t)r * ld_y, acc[r], beta, mask);
}

/* Q6_K, a quarter (h, gh: elements 128 h + 32 c + 16 gh .. + 15 of each chunk c) of one tile
 * superblock at t times R activation rows, into I. Per group g of 4 elements of each chunk of
 * 32, the 6-bit values of the 4 chunks from their three bytes (9 operations); each 16
 * elements' sums start from -32 x the sum of x there (Q8_K's sums per 16) and are multiplied
 * by their scale. */
VNNI512 static inline __attribute__((always_inline)) void
p1_q6_k_quarter(const uint8_t *t, const int8_t *xq, const int16_t *xs, int64_t k, const int h,
                const int gh, __m512i *I, const int R)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi8(0x3F);
    const __m512i m03 = _mm512_set1_epi8(0x03);
    __m512i P0[KT1_ROWS], P1[KT1_ROWS], P2[KT1_ROWS], P3[KT1_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const int16_t *s = xs + r * (k / 16) + 8 * h + gh;
        P0[r] = _mm512_set1_epi32(-32 * s[0]);
        P1[r] = _mm512_set1_epi32(-32 * s[2]);
        P2[r] = _mm512_set1_epi32(-32 * s[4]);
        P3[r] = _mm512_set1_epi32(-32 * s[6]);
    }
#pragma GCC unroll 4
    for (int g = 4 * gh; g < 4 * gh + 4; g++) {
        const uint8_t *v = t + 192 * (8 * h + g);
        const __m512i V0 = _mm512_load_si512(v), V1 = _mm512_load_si512(v + 64);
        const __m512i V2 = _mm512_load_si512(v + 128);
        const __m512i q0 = _mm512_and_si512(V0, m6), q1 = _mm512_and_si512(V1, m6);
        const __m512i q2 = _mm512_and_si512(V2, m6);
        /* chunk 3: bits 6-7 of V0, V1, V2 to 0-1, 2-3, 4-5 (16-bit shifts: each byte's own
         * bits land there, the neighbour's are selected away or masked) */
        const __m512i t1 = _mm512_ternarylogic_epi32(m03, _mm512_srli_epi16(V0, 6),
                                                     _mm512_srli_epi16(V1, 4), 0xCA);
        const __m512i q3 =
            _mm512_and_si512(_mm512_ternarylogic_epi32(m4, t1, _mm512_srli_epi16(V2, 2), 0xCA), m6);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const int8_t *xr = xq + r * k + 128 * h + 4 * g;
            P0[r] = _mm512_dpbusd_epi32(P0[r], q0, p1_x4(xr));
            P1[r] = _mm512_dpbusd_epi32(P1[r], q1, p1_x4(xr + 32));
            P2[r] = _mm512_dpbusd_epi32(P2[r], q2, p1_x4(xr + 64));
            P3[r] = _mm512_dpbusd_epi32(P3[r], q3, p1_x4(xr + 96));
        }
    }
    const uint8_t *sc = t + P1_Q6K_SC + 16 * (8 * h + gh);
    const __m512i s0 = _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)sc));
    const __m512i s1 = _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(sc + 32)));
    const __m512i s2 = _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(sc + 64)));
    const __m512i s3 = _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(sc + 96)));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        I[r] = _mm512_add_epi32(
            _mm512_add_epi32(I[r], _mm512_add_epi32(_mm512_mullo_epi32(P0[r], s0),
                                                    _mm512_mullo_epi32(P1[r], s1))),
            _mm512_add_epi32(_mm512_mullo_epi32(P2[r], s2), _mm512_mullo_epi32(P3[r], s3)));
}

/* Q6_K, one tile (16 rows, m stored) times R activation rows: the four quarters, then the
 * float step. */
VNNI512 static inline __attribute__((always_inline)) void p1_q6_k(const uint8_t *t, int64_t nsb,
                                                                  const xq8 *x, int64_t k,
                                                                  float beta, float *y, int ld_y,
                                                                  __mmask16 mask, const int R)
{
    __m512 acc[KT1_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++, t += P1_Q6K_SB) {
        __m512i I[KT1_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) I[r] = _mm512_setzero_si512();
        const int8_t *xq = x->kq + sb * QK_K;
        const int16_t *xs = x->ks + sb * 16;
        p1_q6_k_quarter(t, xq, xs, k, 0, 0, I, R);
        p1_q6_k_quarter(t, xq, xs, k, 0, 1, I, R);
        p1_q6_k_quarter(t, xq, xs, k, 1, 0, I, R);
        p1_q6_k_quarter(t, xq, xs, k, 1, 1, I, R);
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(t + P1_Q6K_D)));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float dx = x->kd[r * nsb + sb];
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(d, _mm512_set1_ps(dx)),
                                     acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) p1_store(y + (size_t)r * ld_y, acc[r], beta, mask);
}

#define P1_BY_ROWS(F, ...)                                                                         \
    switch (rows) {                                                                                \
    case 1: F(__VA_ARGS__, 1); break;                                                              \
    case 2: F(__VA_ARGS__, 2); break;                                                              \
    case 3: F(__VA_ARGS__, 3); break;                                                              \
    default: F(__VA_ARGS__, 4); break;                                                             \
    }

VNNI512 void qk_p1_rows(int type, const void *wp, int n0, int n, int64_t k, const xq8 *x, int rows,
                        float beta, float *y, int ld_y)
{
    const int64_t nsb = k / QK_K;
    const size_t sbb = type == Q_Q4_K ? P1_Q4K_SB : P1_Q6K_SB;
    for (int i0 = 0; i0 < n; i0 += P1_ROWS) {
        const int m = n - i0 < P1_ROWS ? n - i0 : P1_ROWS;
        const __mmask16 mask = (__mmask16)((1u << m) - 1);
        const uint8_t *t = (const uint8_t *)wp + (size_t)((n0 + i0) / P1_ROWS) * nsb * sbb;
        if (type == Q_Q4_K)
            P1_BY_ROWS(p1_q4_k, t, nsb, x, k, beta, y + i0, ld_y, mask)
        else
            P1_BY_ROWS(p1_q6_k, t, nsb, x, k, beta, y + i0, ld_y, mask)
    }
}

#endif /* QK_X86 */
