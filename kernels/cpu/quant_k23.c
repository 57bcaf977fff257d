/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_k23.c — Q2_K, Q3_K and IQ4_XS with AVX-512 VNNI and Q8_K activations, in
 * the arithmetic of quant_kquants.c's Q4_K/Q6_K kernels (quant_internal.h, qk_kt_*): for each
 * weight row, activation row and 256 elements, the exact integer sum I of the products times
 * the sub-block scales, and for Q2_K the exact sum M of its minimums times the activations'
 * sums per 16; then one float step, acc = fma(I, d dx, acc), and for Q2_K acc = fnmadd(M,
 * dmin dx, acc). A few activation rows (qk_kt1_k23) dot the weights as they lie; more
 * (qk_kt_rows_k23) take tiles of VT_COLS weight rows unpacked to unsigned bytes
 * (qk_kt_pack_k23), 4 of them against 16 weight rows in one vpdpbusd. Both form the same
 * integers and take the same float steps, so a row alone gets the bits it gets in a batch.
 *
 * The three as bytes: Q2_K's values 0..3 (4-bit scale and minimum per 16); Q3_K's 0..7 less
 * 4 (signed 6-bit scale per 16; the 4 met by the sums of x per 16, in a tile packed as q + 28
 * and met by -32 x those sums, kt_x's c16); IQ4_XS's grid values + 128, unsigned (6-bit scale
 * per 32), less 128 x the sums of x.
 */
#include "kernels/cpu/quant_internal.h"

#if QK_X86

#define AI __attribute__((always_inline))

/* One superblock unpacked in element order (the tiles' packing): q[z] the values of elements
 * 64z..64z+63 (Q2_K 0..3, Q3_K 0..7, IQ4_XS the signed grid values); s16 Q3_K's sixteen
 * scales, Q2_K's sixteen minimums, IQ4_XS's eight scales, in int16; s: d and (Q2_K) dmin. */
typedef struct k23_sb {
    __m512i q[4];
    __m256i s16;
    __m128 s;
} k23_sb;

static inline size_t k23_block_bytes(const int TYPE)
{
    return TYPE == Q_Q2_K   ? sizeof(blk_q2_k)
           : TYPE == Q_Q3_K ? sizeof(blk_q3_k)
                            : sizeof(blk_iq4_xs);
}

/* The 2-bit fields of 64 bytes' worth of chunks: chunks 2z and 2z + 1 of a Q2_K or Q3_K block
 * are bits 4 (z % 2) and 4 (z % 2) + 2 of the 32 bytes of qs at 32 (z / 2). */
VNNI512 static inline AI __m512i k23_two_bits(const uint8_t *qs, int z)
{
    const __m512i Q =
        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * (z / 2))));
    const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * (z % 2))),
                                          _mm256_set1_epi16((short)(4 * (z % 2) + 2)), 1);
    return _mm512_and_si512(_mm512_srlv_epi16(Q, sh), _mm512_set1_epi8(3));
}

/* Q3_K's sixteen 6-bit scales less their bias 32, int8 (q3k_scales): from the 12 bytes a0 a1
 * a2, scale j's low nibble from a0 (j < 4: bits 0-3; 8..11: 4-7) or a1 (4..7, 12..15), its
 * high 2 bits from a2 at 2 (j / 4). */
VNNI512 static inline AI __m128i k23_q3k_scales(const blk_q3_k *x)
{
    const __m128i a = _mm_maskz_loadu_epi8(0x0FFF, x->scales);
    const __m128i lo = _mm_and_si128(
        _mm_srlv_epi32(_mm_shuffle_epi32(a, _MM_SHUFFLE(1, 0, 1, 0)), _mm_setr_epi32(0, 0, 4, 4)),
        _mm_set1_epi8(0x0F));
    const __m128i hi =
        _mm_slli_epi32(_mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(a, _MM_SHUFFLE(2, 2, 2, 2)),
                                                    _mm_setr_epi32(0, 2, 4, 6)),
                                     _mm_set1_epi8(3)),
                       4);
    return _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32));
}

/* IQ4_XS's eight 6-bit scales less their bias 32, int16: scale ib is nibble ib % 2 of
 * scales_l[ib / 2] with bits 2 ib, 2 ib + 1 of scales_h above it. */
VNNI512 static inline AI __m128i k23_iq4xs_scales(const blk_iq4_xs *x)
{
    const __m128i sl =
        _mm_cvtsi32_si128((int)((uint32_t)x->scales_l[0] | (uint32_t)x->scales_l[1] << 8 |
                                (uint32_t)x->scales_l[2] << 16 | (uint32_t)x->scales_l[3] << 24));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_cvtepu8_epi16(
        _mm_unpacklo_epi8(_mm_and_si128(sl, m4), _mm_and_si128(_mm_srli_epi16(sl, 4), m4)));
    const __m128i hi =
        _mm_slli_epi16(_mm_and_si128(_mm_srlv_epi16(_mm_set1_epi16((short)x->scales_h),
                                                    _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14)),
                                     _mm_set1_epi16(3)),
                       4);
    return _mm_sub_epi16(_mm_or_si128(lo, hi), _mm_set1_epi16(32));
}

VNNI512 static inline AI void k23_unpack(const int TYPE, const char *b, k23_sb *u)
{
    if (TYPE == Q_Q2_K) {
        const blk_q2_k *x = (const blk_q2_k *)b;
        const __m128i raw = _mm_loadu_si128((const __m128i *)x->scales), m4 = _mm_set1_epi8(0x0F);
        u->s16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
        int dd; /* d, dmin */
        memcpy(&dd, &x->d, sizeof dd);
        u->s = _mm_cvtph_ps(_mm_cvtsi32_si128(dd));
#pragma GCC unroll 4
        for (int z = 0; z < 4; z++) u->q[z] = k23_two_bits(x->qs, z);
    } else if (TYPE == Q_Q3_K) {
        const blk_q3_k *x = (const blk_q3_k *)b;
        u->s16 = _mm256_cvtepi8_epi16(k23_q3k_scales(x));
        u->s = _mm_cvtph_ps(_mm_cvtsi32_si128(x->d));
        const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x->hmask));
#pragma GCC unroll 4
        for (int z = 0; z < 4; z++) {
            /* bit c of hmask, chunk c's: 4 added where it is set */
            const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * z))),
                                                   _mm256_set1_epi8((char)(1 << (2 * z + 1))), 1);
            const __m512i lo2 = k23_two_bits(x->qs, z);
            u->q[z] =
                _mm512_mask_add_epi8(lo2, _mm512_test_epi8_mask(H, bit), lo2, _mm512_set1_epi8(4));
        }
    } else { /* Q_IQ4_XS */
        const blk_iq4_xs *x = (const blk_iq4_xs *)b;
        const __m128i sc8 = k23_iq4xs_scales(x);
        u->s16 = _mm256_zextsi128_si256(sc8);
        u->s = _mm_cvtph_ps(_mm_cvtsi32_si128(x->d));
        const __m512i grid =
            _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qk_iq4nl_values));
        /* 128-bit lanes: the low nibbles of 16 bytes (block 2z's first 16), their high
         * nibbles, then the same of the next 16 (block 2z + 1) */
        const __m512i sh = _mm512_setr_epi64(0, 0, 0x0004000400040004LL, 0x0004000400040004LL, 0, 0,
                                             0x0004000400040004LL, 0x0004000400040004LL);
#pragma GCC unroll 4
        for (int z = 0; z < 4; z++) {
            const __m512i Y =
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * z)));
            const __m512i idx = _mm512_and_si512(
                _mm512_srlv_epi16(_mm512_shuffle_i64x2(Y, Y, _MM_SHUFFLE(1, 1, 0, 0)), sh),
                _mm512_set1_epi8(0x0F));
            u->q[z] = _mm512_shuffle_epi8(grid, idx);
        }
    }
}

/* y[0..15] (mask: the columns that exist) = v, or beta y + v. */
VNNI512 static inline AI void k23_store(float *yr, __m512 v, float beta, __mmask16 mask)
{
    if (beta != 0.0f)
        v = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mask, yr)), v);
    _mm512_mask_storeu_ps(yr, mask, v);
}

/* ---- a few rows against the weights as they lie ------------------------------------------
 *
 * One row dots a superblock in lane order: dword lane t = 4L + p (L the 128-bit lane, p the
 * dword in it) of each of 4 vectors z holds 4 elements of one group of 16 (one scale, Q2_K's
 * one minimum), so that 4 vpdpbusd leave each group's exact sum of products in its own lane;
 * one vpmulld by the 16 scales, less the offsets (Q3_K's 4, IQ4_XS's 128, x the group's sum of
 * x), and one sum of lanes. Lane t of vector z takes, from the weights' bytes, dword
 * (p + z) % 4 of its 128-bit lane (one vpshufd per z; a shift per p):
 *   Q2_K, Q3_K: qs dword 4L + (p + z) % 4 at bits 2p: group 8 (L / 2) + 2p + L % 2, elements
 *     128 (L / 2) + 32p + 16 (L % 2) + 4 ((p + z) % 4) + 0..3; Q3_K's high bit, bit
 *     4 (L / 2) + p of hmask dword 4 (L % 2) + (p + z) % 4;
 *   IQ4_XS: block B = L + 4 (p / 2) (qs's 16 bytes at 16B: the first 64 bytes' lane L, or the
 *     next 64's), nibble p % 2 of its dword (p + z) % 4: group 2B + p % 2, elements
 *     32B + 16 (p % 2) + 4 ((p + z) % 4) + 0..3.
 * The activation rows are laid out so once per product (k23_xlanes), with each lane's offset. */

/* Lane t = 4L + p of vector z: the activation dword (of the 64 in a superblock) it meets, and
 * the group of 16 it belongs to. */
static inline int k23_src(const int TYPE, int z, int t)
{
    const int L = t / 4, p = t % 4, d = (p + z) % 4;
    if (TYPE == Q_IQ4_XS) return 8 * (L + 4 * (p / 2)) + 4 * (p % 2) + d;
    return 32 * (L / 2) + 8 * p + 4 * (L % 2) + d;
}

static inline int k23_group(const int TYPE, int t)
{
    const int L = t / 4, p = t % 4;
    if (TYPE == Q_IQ4_XS) return 2 * (L + 4 * (p / 2)) + p % 2;
    return 8 * (L / 2) + 2 * p + L % 2;
}

/* Bytes of one superblock of one row in k23_xlanes's layout: 4 x 64 bytes of x, then the 16
 * lanes' offsets (int32). */
#define K23_XSB 320

/* The rows of a (Q8_K) in lane order into xp, rows x (k / 256) x K23_XSB bytes: each
 * superblock's 64 dwords gathered (two vpermt2d and a blend per vector), and per lane its
 * group's sum of x times Q3_K's 4 (IQ4_XS: 128; Q2_K: 1, its minimums' sums). */
VNNI512 static inline AI void k23_xlanes(const int TYPE, const struct q_xq *a, int64_t nb,
                                         int8_t *xp)
{
    const xq8 *x = &a->xq;
    const int64_t k = nb * 32, nsb = nb / 8;
    __m512i ix[4], ig;
    __mmask16 hi[4];
    int32_t t32[16];
    for (int z = 0; z < 4; z++) {
        unsigned msk = 0;
        for (int t = 0; t < 16; t++) {
            const int sdw = k23_src(TYPE, z, t);
            t32[t] = sdw & 31;
            msk |= (unsigned)(sdw >= 32) << t;
        }
        ix[z] = _mm512_loadu_si512(t32);
        hi[z] = (__mmask16)msk;
    }
    for (int t = 0; t < 16; t++) t32[t] = k23_group(TYPE, t);
    ig = _mm512_loadu_si512(t32);
    const int shift = TYPE == Q_Q3_K ? 2 : TYPE == Q_IQ4_XS ? 7 : 0;
    for (int r = 0; r < a->rows; r++)
        for (int64_t sb = 0; sb < nsb; sb++) {
            const int8_t *q = x->kq + r * k + sb * QK_K;
            int8_t *o = xp + (r * nsb + sb) * K23_XSB;
            const __m512i X0 = _mm512_loadu_si512(q), X1 = _mm512_loadu_si512(q + 64);
            const __m512i X2 = _mm512_loadu_si512(q + 128), X3 = _mm512_loadu_si512(q + 192);
            for (int z = 0; z < 4; z++)
                _mm512_storeu_si512(o + 64 * z, _mm512_mask_blend_epi32(
                                                    hi[z], _mm512_permutex2var_epi32(X0, ix[z], X1),
                                                    _mm512_permutex2var_epi32(X2, ix[z], X3)));
            const __m512i ks = _mm512_cvtepi16_epi32(
                _mm256_loadu_si256((const __m256i *)(x->ks + r * (k / 16) + sb * 16)));
            _mm512_storeu_si512(o + 256,
                                _mm512_slli_epi32(_mm512_permutexvar_epi32(ig, ks), shift));
        }
}

/* v with dword p of each 128-bit lane taken from its dword (p + z) % 4. */
VNNI512 static inline AI __m512i k23_rot(__m512i v, const int z)
{
    switch (z) {
    case 1: return _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0x39);
    case 2: return _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0x4E);
    case 3: return _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0x93);
    default: return v;
    }
}

/* One superblock in lane order: q[z] unsigned bytes (Q2_K 0..3, Q3_K 0..7, IQ4_XS the grid
 * value + 128), sc the 16 lanes' scales (int32), mn Q2_K's sixteen minimums in their own order
 * (int16). */
typedef struct k23_lsb {
    __m512i q[4], sc;
    __m256i mn;
} k23_lsb;

VNNI512 static inline AI void k23_lanes(const int TYPE, const char *b, k23_lsb *u)
{
    /* the groups of lane t in a byte's order (a pshufb of 16 scales) */
    const __m128i perm = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    if (TYPE == Q_Q2_K || TYPE == Q_Q3_K) {
        const uint8_t *qs = TYPE == Q_Q2_K ? ((const blk_q2_k *)b)->qs : ((const blk_q3_k *)b)->qs;
        const __m512i QS = _mm512_loadu_si512(qs);
        const __m512i sh2 = _mm512_set4_epi32(6, 4, 2, 0), m3 = _mm512_set1_epi8(3);
        __m512i H = _mm512_setzero_si512(), rc = H;
        if (TYPE == Q_Q3_K) {
            H = _mm512_broadcast_i64x4(
                _mm256_loadu_si256((const __m256i *)((const blk_q3_k *)b)->hmask));
            /* bit 4 (L / 2) + p of each byte to bit 2: rotated right by that less 2 */
            rc = _mm512_setr_epi32(30, 31, 0, 1, 30, 31, 0, 1, 2, 3, 4, 5, 2, 3, 4, 5);
        }
#pragma GCC unroll 4
        for (int z = 0; z < 4; z++) {
            const __m512i ql = _mm512_and_si512(_mm512_srlv_epi32(k23_rot(QS, z), sh2), m3);
            u->q[z] = TYPE == Q_Q3_K
                          ? _mm512_ternarylogic_epi32(ql, _mm512_rorv_epi32(k23_rot(H, z), rc),
                                                      _mm512_set1_epi8(4), 0xF8)
                          : ql;
        }
        if (TYPE == Q_Q2_K) {
            const __m128i raw = _mm_loadu_si128((const __m128i *)((const blk_q2_k *)b)->scales);
            const __m128i m4 = _mm_set1_epi8(0x0F);
            u->sc = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_shuffle_epi8(raw, perm), m4));
            u->mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
        } else
            u->sc =
                _mm512_cvtepi8_epi32(_mm_shuffle_epi8(k23_q3k_scales((const blk_q3_k *)b), perm));
    } else { /* Q_IQ4_XS */
        const blk_iq4_xs *x = (const blk_iq4_xs *)b;
        const __m512i lo = _mm512_loadu_si512(x->qs), hi = _mm512_loadu_si512(x->qs + 64);
        const __m512i grid = _mm512_xor_si512(
            _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qk_iq4nl_values)),
            _mm512_set1_epi8((char)0x80));
        const __m512i sh4 = _mm512_set4_epi32(4, 0, 4, 0), m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
        for (int z = 0; z < 4; z++) {
            const __m512i v = _mm512_mask_blend_epi32(0xCCCC, k23_rot(lo, z), k23_rot(hi, z));
            u->q[z] = _mm512_shuffle_epi8(grid, _mm512_and_si512(_mm512_srlv_epi32(v, sh4), m4));
        }
        /* lane 4L + p: block L + 4 (p / 2) */
        u->sc = _mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 0, 4, 4, 1, 1, 5, 5, 2, 2, 6, 6, 3, 3, 7, 7),
            _mm512_zextsi256_si512(_mm256_cvtepi16_epi32(k23_iq4xs_scales(x))));
    }
}

/* The one-row kernels stream the weights row after row and leave, per weight row, activation
 * row and 256, the integer sums in 4 lanes at the row's slot (k23_s); a tile's 16 rows then
 * end together: their lanes summed into one vector of 16 sums, the float steps taken for the
 * 16 rows in one vector, as the tiles' kernel takes them (qk_kt1_q4_k's scheme in
 * quant_kquants.c). Each row's own reduction and scalar float steps, in their latency, took
 * about a third of Q2_K's time. */
typedef struct k23_s {
    int8_t *xp;  /* [R][nsb][K23_XSB]: the activation rows in lane order (k23_xlanes) */
    int32_t *I;  /* [R][nsb][16 slots (kt1_slot)][4] */
    int32_t *M;  /* [R][nsb][16 slots][4]: Q2_K's minimums by the sums of x */
    int32_t *dd; /* [nsb][16]: d (low half) and Q2_K's dmin (high) of each weight row, f16 */
} k23_s;

size_t qk_kt1_k23_scratch(int rows, int64_t k)
{
    const size_t nsb = (size_t)(k / QK_K);
    return (size_t)rows * nsb * (K23_XSB + 2 * 256) + nsb * 64;
}

static k23_s k23_carve(int8_t *buf, int rows, int64_t nsb)
{
    const size_t xb = (size_t)rows * (size_t)nsb * K23_XSB, ib = (size_t)rows * (size_t)nsb * 256;
    return (k23_s){.xp = buf,
                   .I = (int32_t *)(buf + xb),
                   .M = (int32_t *)(buf + xb + ib),
                   .dd = (int32_t *)(buf + xb + 2 * ib)};
}

/* The lines of the superblock K23_PF_BYTES ahead of the one at b, to the cache (the hardware
 * prefetcher alone lags a row streamed at this rate; Q4_K's kernels found the same). It may
 * reach past the matrix: a prefetch never faults. */
#define K23_PF_BYTES 4096
VNNI512 static inline AI void k23_prefetch(const char *b)
{
    _mm_prefetch(b + K23_PF_BYTES, _MM_HINT_T0);
    _mm_prefetch(b + K23_PF_BYTES + 64, _MM_HINT_T0);
}

/* v's 16 int32 lanes summed into 4 (exact), stored at o. */
VNNI512 static inline AI void k23_put4(int32_t *o, __m512i v)
{
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    _mm_storeu_si128((__m128i *)o,
                     _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

/* R (a constant, 1..KT1_ROWS) activation rows (in lane order, s->xp) times the m (<= VT_COLS)
 * weight rows at w, into y's columns 0..m-1: each superblock unpacked once for the R rows; per
 * row 4 vpdpbusd in two chains, less the offsets, by the scales, to 4 lanes (Q2_K: its
 * minimums by the sums of x per 16, vpmaddwd); then the tile's end. */
VNNI512 static inline AI void kt1_k23_tile(const int TYPE, const char *w, size_t rb, int m,
                                           int64_t nb, const struct q_xq *a, const k23_s *s,
                                           float beta, float *y, int ld_y, const int R)
{
    const int64_t nsb = nb / 8, k = nb * 32;
    const size_t bsz = k23_block_bytes(TYPE);
    const size_t d_at = TYPE == Q_Q2_K   ? offsetof(blk_q2_k, d)
                        : TYPE == Q_Q3_K ? offsetof(blk_q3_k, d)
                                         : offsetof(blk_iq4_xs, d);
    if (m < VT_COLS) /* the rows past m: zero sums and scales, so that their lanes hold numbers */
        for (int64_t sb = 0; sb < nsb; sb++)
            for (int i = m; i < VT_COLS; i++) {
                s->dd[sb * 16 + i] = 0;
                for (int r = 0; r < R; r++) {
                    memset(s->I + ((r * nsb + sb) * 16 + kt1_slot(i)) * 4, 0, 16);
                    memset(s->M + ((r * nsb + sb) * 16 + kt1_slot(i)) * 4, 0, 16);
                }
            }
    for (int i = 0; i < m; i++) {
        const char *b = w + (size_t)i * rb;
        const int slot = kt1_slot(i);
        for (int64_t sb = 0; sb < nsb; sb++, b += bsz) {
            k23_prefetch(b);
            k23_lsb u;
            k23_lanes(TYPE, b, &u);
            if (TYPE == Q_Q2_K)
                memcpy(s->dd + sb * 16 + i, b + d_at, 4); /* d, dmin */
            else {
                uint16_t d;
                memcpy(&d, b + d_at, 2);
                s->dd[sb * 16 + i] = d;
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const int8_t *xr = s->xp + (r * nsb + sb) * K23_XSB;
                __m512i P0 =
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u.q[0], _mm512_loadu_si512(xr));
                __m512i P1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u.q[1],
                                                 _mm512_loadu_si512(xr + 64));
                P0 = _mm512_dpbusd_epi32(P0, u.q[2], _mm512_loadu_si512(xr + 128));
                P1 = _mm512_dpbusd_epi32(P1, u.q[3], _mm512_loadu_si512(xr + 192));
                __m512i P = _mm512_add_epi32(P0, P1);
                const int64_t o = ((r * nsb + sb) * 16 + slot) * 4;
                if (TYPE != Q_Q2_K) P = _mm512_sub_epi32(P, _mm512_loadu_si512(xr + 256));
                k23_put4(s->I + o, _mm512_mullo_epi32(P, u.sc));
                if (TYPE == Q_Q2_K) {
                    const __m256i M8 = _mm256_madd_epi16(
                        u.mn,
                        _mm256_loadu_si256((const __m256i *)(a->xq.ks + r * (k / 16) + sb * 16)));
                    _mm_storeu_si128(
                        (__m128i *)(s->M + o),
                        _mm_add_epi32(_mm256_castsi256_si128(M8), _mm256_extracti128_si256(M8, 1)));
                }
            }
        }
    }
    __m512 acc[KT1_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const __m512i dd = _mm512_loadu_si512(s->dd + sb * 16);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512 dx = _mm512_set1_ps(a->xq.kd[r * nsb + sb]);
            const int64_t o = (r * nsb + sb) * 64;
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(kt1_sum16(s->I + o)), _mm512_mul_ps(d, dx),
                                     acc[r]);
            if (TYPE == Q_Q2_K)
                acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(kt1_sum16(s->M + o)),
                                          _mm512_mul_ps(dmin, dx), acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        k23_store(y + (size_t)r * ld_y, acc[r], beta, (__mmask16)((1u << m) - 1));
}

/* The a->rows activation rows times the n weight rows at w, as they lie, VT_COLS at a time. */
VNNI512 static inline AI void kt1_k23(const int TYPE, const char *w, size_t rb, int n, int64_t nb,
                                      const struct q_xq *a, const k23_s *s, float beta, float *y,
                                      int ld_y, const int R)
{
    k23_xlanes(TYPE, a, nb, s->xp);
    for (int i0 = 0; i0 < n; i0 += VT_COLS)
        kt1_k23_tile(TYPE, w + (size_t)i0 * rb, rb, n - i0 < VT_COLS ? n - i0 : VT_COLS, nb, a, s,
                     beta, y + i0, ld_y, R);
}

#define K23_TYPES(X) X(Q_Q2_K) X(Q_Q3_K) X(Q_IQ4_XS)

VNNI512 void qk_kt1_k23(int type, const char *w, size_t rb, int n, int64_t nb, const struct q_xq *a,
                        int8_t *xp, float beta, float *y, int ld_y)
{
    const k23_s s = k23_carve(xp, a->rows, nb / 8);
#define K23_KT1(T)                                                                                 \
    case T:                                                                                        \
        switch (a->rows) {                                                                         \
        case 1: kt1_k23(T, w, rb, n, nb, a, &s, beta, y, ld_y, 1); break;                          \
        case 2: kt1_k23(T, w, rb, n, nb, a, &s, beta, y, ld_y, 2); break;                          \
        case 3: kt1_k23(T, w, rb, n, nb, a, &s, beta, y, ld_y, 3); break;                          \
        default: kt1_k23(T, w, rb, n, nb, a, &s, beta, y, ld_y, 4); break;                         \
        }                                                                                          \
        break;
    switch (type) {
        K23_TYPES(K23_KT1)
    }
#undef K23_KT1
}

/* The m (<= VT_COLS) weight rows at w, one after the other: each row's superblocks unpacked to
 * unsigned bytes in tmp (Q3_K q + 28, IQ4_XS v + 128), its scales, d, dmin and (Q2_K) minimums
 * in pairs into the tile; then each block of 32 of the 16 rows transposed into the tile's
 * [8][16][4] bytes. */
VNNI512 static inline AI void kt_pack_k23(const int TYPE, const char *w, size_t rb, int m,
                                          int64_t nb, const kt_w *t, int8_t *tmp)
{
    const int64_t k = nb * 32, nsb = nb / 8;
    const size_t bsz = k23_block_bytes(TYPE);
    const bool per16 = TYPE != Q_IQ4_XS;
    for (int i = 0; i < VT_COLS; i++) {
        const char *b = w + (size_t)i * rb;
        for (int64_t sb = 0; sb < nsb; sb++, b += bsz) {
            int16_t s16[16], sc[16];
            float s[4] = {0, 0, 0, 0};
            memset(s16, 0, sizeof s16);
            memset(sc, 0, sizeof sc);
            if (i < m) {
                k23_sb u;
                k23_unpack(TYPE, b, &u);
                for (int z = 0; z < 4; z++) {
                    __m512i v = u.q[z];
                    if (TYPE == Q_Q3_K) v = _mm512_add_epi8(v, _mm512_set1_epi8(28));
                    if (TYPE == Q_IQ4_XS) v = _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
                    _mm512_storeu_si512(tmp + (size_t)i * k + sb * QK_K + 64 * z, v);
                }
                _mm256_storeu_si256((__m256i *)s16, u.s16);
                _mm_storeu_ps(s, u.s);
                if (TYPE == Q_Q2_K) { /* its scales: the low nibbles */
                    const __m128i raw = _mm_loadu_si128((const __m128i *)b);
                    _mm256_storeu_si256((__m256i *)sc, _mm256_cvtepu8_epi16(
                                                           _mm_and_si128(raw, _mm_set1_epi8(0xF))));
                } else
                    memcpy(sc, s16, sizeof sc);
            }
            t->d[sb * 16 + i] = s[0];
            if (TYPE == Q_Q2_K) {
                t->dmin[sb * 16 + i] = s[1];
                for (int p = 0; p < 8; p++)
                    t->mn[(sb * 8 + p) * 16 + i] =
                        (int32_t)((uint32_t)(uint16_t)s16[2 * p] |
                                  (uint32_t)(uint16_t)s16[2 * p + 1] << 16);
            }
            for (int G = 0; G < (per16 ? 16 : 8); G++)
                t->sc[(sb * (per16 ? 16 : 8) + G) * 16 + i] = sc[G];
        }
    }
    for (int64_t bl = 0; bl < nb; bl++) {
        __m512i v[8];
        vt_transpose((const char *)tmp + 32 * bl, (size_t)k, m, v);
        for (int g = 0; g < 8; g++) _mm512_storeu_si512(t->q + (bl * 8 + g) * 64, v[g]);
    }
}

VNNI512 void qk_kt_pack_k23(int type, const char *w, size_t rb, int m, int64_t nb, const kt_w *t,
                            int8_t *tmp)
{
#define K23_PACK(T)                                                                                \
    case T: kt_pack_k23(T, w, rb, m, nb, t, tmp); break;
    switch (type) {
        K23_TYPES(K23_PACK)
    }
#undef K23_PACK
}

/* The R (a constant, 1..VT_ROWS) activation rows from r0 (a's Q8_K in the tiles' layout, kt_x)
 * times a packed tile into y's 16 columns: per 16 elements (IQ4_XS: 32), vpdpbusd of 4 bytes
 * of a row with 16 weight rows from Q3_K's -32 x the row's sum (IQ4_XS: -128 x), the sum
 * times the scales added in integers; per 256, Q2_K's minimums by the row's sums per 16
 * (vpdpwssd on int16 pairs), and the float steps. */
VNNI512 static inline AI void kt_k23(const int TYPE, const kt_w *w, int64_t nb,
                                     const struct q_xq *a, int r0, float beta, float *y, int ld_y,
                                     __mmask16 mask, const int R)
{
    const kt_x *x = &a->kt;
    const int rows = x->rows;
    const int64_t k = nb * 32;
    const bool per16 = TYPE != Q_IQ4_XS;
    __m512 acc[VT_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        __m512i I[VT_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) I[r] = _mm512_setzero_si512();
        for (int64_t b = sb * 8; b < sb * 8 + 8; b++) {
            const uint8_t *wq = w->q + b * 512;
            const int8_t *xq = x->q + ((size_t)b * rows + r0) * 32;
            for (int h = 0; h < (per16 ? 2 : 1); h++) {
                __m512i p[VT_ROWS];
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const int32_t *c = x->c16 + (size_t)r0 + r;
                    p[r] = TYPE == Q_Q3_K ? _mm512_set1_epi32(c[(2 * b + h) * rows])
                           : TYPE == Q_IQ4_XS
                               ? _mm512_set1_epi32(4 * (c[2 * b * rows] + c[(2 * b + 1) * rows]))
                               : _mm512_setzero_si512();
                }
                vt_dot_rows(wq, xq, per16 ? 4 * h : 0, per16 ? 4 * h + 4 : 8, p, R);
                const __m512i sc = _mm512_loadu_si512(w->sc + (per16 ? (2 * b + h) : b) * 16);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(p[r], sc));
            }
        }
        const __m512 d = _mm512_loadu_ps(w->d + sb * 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const float dx = x->d[sb * rows + r0 + r];
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(d, _mm512_set1_ps(dx)),
                                     acc[r]);
            if (TYPE == Q_Q2_K) {
                const int16_t *ks = a->xq.ks + (size_t)(r0 + r) * (k / 16) + sb * 16;
                __m512i M = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int p = 0; p < 8; p++) {
                    int32_t pair;
                    memcpy(&pair, ks + 2 * p, 4);
                    M = _mm512_dpwssd_epi32(M, _mm512_loadu_si512(w->mn + (sb * 8 + p) * 16),
                                            _mm512_set1_epi32(pair));
                }
                acc[r] = _mm512_fnmadd_ps(
                    _mm512_cvtepi32_ps(M),
                    _mm512_mul_ps(_mm512_loadu_ps(w->dmin + sb * 16), _mm512_set1_ps(dx)), acc[r]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) k23_store(y + (size_t)(r0 + r) * ld_y, acc[r], beta, mask);
}

VNNI512 void qk_kt_rows_k23(int type, const kt_w *w, int64_t nb, const struct q_xq *a, int r0,
                            int R, float beta, float *y, int ld_y, __mmask16 mask)
{
#define K23_ROWS(T)                                                                                \
    case T: ROWS_BY_COUNT(R, kt_k23, T, w, nb, a, r0, beta, y, ld_y, mask) break;
    switch (type) {
        K23_TYPES(K23_ROWS)
    }
#undef K23_ROWS
}

#endif /* QK_X86 */

bool qk_kt_k23(int type)
{
    return type == Q_Q2_K || type == Q_Q3_K || type == Q_IQ4_XS;
}
