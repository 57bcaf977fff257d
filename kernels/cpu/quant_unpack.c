/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_unpack.c — the types that unpack to 8-bit integers: Q4_0, Q4_1, Q5_0,
 * Q5_1, IQ4_NL (blocks of 32) and Q2_K, Q3_K, Q5_K, IQ4_XS (blocks of 256); layouts in
 * quant.h. A unit of up to 8 blocks of 32 elements (one block of a K type) is unpacked into
 * a qu_tile: 256 signed bytes q and, per 16 elements, a scale a and an offset o, so that
 * element e is a[e/16] * q[e] + o[e/16] (ggml's dequantization, step for step).
 *
 * From the tile: dequantization (prefill's tiles into SGEMM), the fused dot with float
 * activations (q_dot), and the portable integer dots of q_matmul's small batches: the
 * activations quantized to 8 bits per 32 elements (as llama.cpp quantizes them to Q8_0 / Q8_1
 * for the 32-element types; for the K types it uses one scale per 256, Q8_K), each unit
 * unpacked once for all rows of a group, the products summed exactly in integers per 16
 * elements and scaled in float; the offsets meet the quantized activations' sums per 16
 * (xq8.s16).
 *
 * The K types among them (Q2_K, Q3_K, Q5_K, IQ4_XS) take Q8_K activations instead
 * (kernels/cpu/quant_q8k.c, as llama.cpp), with AVX-512 VNNI too: there its AVX2 kernels
 * beat the ones below with 8 bits per 32 by 1.5-2x (perf/quant_bench, Zen 4).
 *
 * AVX2 (decode and small batches): no tile. Each block of 32 is unpacked in registers
 * (block_q) once for all activation rows of a group and dotted with maddubs; Q2_K's and
 * Q3_K's 16-element scales are integers, multiplied in by the madd that widens the sums, so
 * one float step per block of 32 remains, as for Q8_0; the minimums meet the activations'
 * sums per 32 (xq8.s; Q2_K's per 16, s16). At one row the tile's stores and loads, not the
 * memory, bounded the old kernel (Q4_0 decoded at 0.7x Q8_0's speed). The 32-element types
 * take each whole unit of 8 blocks in pairs (unit_pairs: blocks j and j + 4 in the two halves
 * of a register, the activations laid out to match in xq8.qp), the 8 blocks' exact integer
 * sums in one vector and one float step per unit.
 */
#include "kernels/cpu/quant_internal.h"

/* IQ4_NL's and IQ4_XS's sixteen values (ggml's kvalues_iq4nl), a non-linear 4-bit grid. */
const int8_t qk_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};

bool qk_is_unpacked(int type)
{
    switch (type) {
    case Q_Q4_0:
    case Q_Q4_1:
    case Q_Q5_0:
    case Q_Q5_1:
    case Q_IQ4_NL:
    case Q_Q2_K:
    case Q_Q3_K:
    case Q_Q5_K:
    case Q_IQ4_XS: return true;
    default: return false;
    }
}

/* Whether the tile's offsets o are used (the types with minimums). */
static bool has_offsets(int type)
{
    return type == Q_Q4_1 || type == Q_Q5_1 || type == Q_Q2_K || type == Q_Q5_K;
}

/* The scales and offsets of a unit (the same on every path: the f16 conversions are exact). */
#define UNIT_SCALES(NAME, ATTR, F16)                                                               \
    ATTR static inline __attribute__((always_inline)) void NAME(int type, const void *row,         \
                                                                int64_t b32, int nb, qu_tile *t)   \
    {                                                                                              \
        switch (type) {                                                                            \
        case Q_Q4_0:                                                                               \
        case Q_IQ4_NL:                                                                             \
            for (int j = 0; j < nb; j++)                                                           \
                t->a[2 * j] = t->a[2 * j + 1] = F16(((const blk_q4_0 *)row)[b32 + j].d);           \
            break;                                                                                 \
        case Q_Q5_0:                                                                               \
            for (int j = 0; j < nb; j++)                                                           \
                t->a[2 * j] = t->a[2 * j + 1] = F16(((const blk_q5_0 *)row)[b32 + j].d);           \
            break;                                                                                 \
        case Q_Q4_1:                                                                               \
            for (int j = 0; j < nb; j++) {                                                         \
                const blk_q4_1 *x = (const blk_q4_1 *)row + b32 + j;                               \
                t->a[2 * j] = t->a[2 * j + 1] = F16(x->d);                                         \
                t->o[2 * j] = t->o[2 * j + 1] = F16(x->m);                                         \
            }                                                                                      \
            break;                                                                                 \
        case Q_Q5_1:                                                                               \
            for (int j = 0; j < nb; j++) {                                                         \
                const blk_q5_1 *x = (const blk_q5_1 *)row + b32 + j;                               \
                t->a[2 * j] = t->a[2 * j + 1] = F16(x->d);                                         \
                t->o[2 * j] = t->o[2 * j + 1] = F16(x->m);                                         \
            }                                                                                      \
            break;                                                                                 \
        case Q_Q2_K: {                                                                             \
            const blk_q2_k *x = (const blk_q2_k *)row + b32 / 8;                                   \
            const float d = F16(x->d), dmin = F16(x->dmin);                                        \
            for (int g = 0; g < 16; g++) {                                                         \
                t->a[g] = d * (float)(x->scales[g] & 0xF);                                         \
                t->o[g] = -(dmin * (float)(x->scales[g] >> 4));                                    \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
        case Q_Q3_K: {                                                                             \
            const blk_q3_k *x = (const blk_q3_k *)row + b32 / 8;                                   \
            const float d = F16(x->d);                                                             \
            uint8_t sc[16];                                                                        \
            q3k_scales(x->scales, sc);                                                             \
            for (int g = 0; g < 16; g++) t->a[g] = d * (float)((int)sc[g] - 32);                   \
            break;                                                                                 \
        }                                                                                          \
        case Q_Q5_K: {                                                                             \
            const blk_q5_k *x = (const blk_q5_k *)row + b32 / 8;                                   \
            const float d = F16(x->d), dmin = F16(x->dmin);                                        \
            for (int j = 0; j < 8; j++) {                                                          \
                uint8_t sc, m;                                                                     \
                scale_min_k4(j, x->scales, &sc, &m);                                               \
                t->a[2 * j] = t->a[2 * j + 1] = d * (float)sc;                                     \
                t->o[2 * j] = t->o[2 * j + 1] = -(dmin * (float)m);                                \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
        case Q_IQ4_XS: {                                                                           \
            const blk_iq4_xs *x = (const blk_iq4_xs *)row + b32 / 8;                               \
            const float d = F16(x->d);                                                             \
            for (int ib = 0; ib < 8; ib++) {                                                       \
                const int ls = ((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) |                     \
                               (((x->scales_h >> 2 * ib) & 3) << 4);                               \
                t->a[2 * ib] = t->a[2 * ib + 1] = d * (float)(ls - 32);                            \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
        }                                                                                          \
    }
UNIT_SCALES(unit_scales, , qk_f16_to_f32)

/* The bytes of blocks b32 .. b32+nb-1 of a row (for the K types b32 is a multiple of 8 and
 * nb is 8), portable. */
static void unpack_portable(int type, const void *row, int64_t b32, int nb, qu_tile *t)
{
    unit_scales(type, row, b32, nb, t);
    int8_t *q = t->q;
    switch (type) {
    case Q_Q4_0:
    case Q_Q4_1:
    case Q_IQ4_NL: {
        const size_t bb = q_row_bytes(type, 32);
        const size_t qs_at = type == Q_Q4_1 ? 4 : 2;
        for (int j = 0; j < nb; j++, q += 32) {
            const uint8_t *qs = (const uint8_t *)row + (size_t)(b32 + j) * bb + qs_at;
            for (int l = 0; l < 16; l++) {
                const int lo = qs[l] & 0x0f, hi = qs[l] >> 4;
                if (type == Q_IQ4_NL) {
                    q[l] = qk_iq4nl_values[lo];
                    q[l + 16] = qk_iq4nl_values[hi];
                } else {
                    const int off = type == Q_Q4_0 ? 8 : 0;
                    q[l] = (int8_t)(lo - off);
                    q[l + 16] = (int8_t)(hi - off);
                }
            }
        }
        break;
    }
    case Q_Q5_0:
    case Q_Q5_1: {
        const size_t bb = q_row_bytes(type, 32), qh_at = type == Q_Q5_1 ? 4 : 2;
        const int off = type == Q_Q5_0 ? 16 : 0;
        for (int j = 0; j < nb; j++, q += 32) {
            const uint8_t *blk = (const uint8_t *)row + (size_t)(b32 + j) * bb;
            uint32_t qh;
            memcpy(&qh, blk + qh_at, 4);
            const uint8_t *qs = blk + qh_at + 4;
            for (int l = 0; l < 16; l++) {
                q[l] = (int8_t)(((qs[l] & 0x0f) | ((qh >> l) & 1) << 4) - off);
                q[l + 16] = (int8_t)(((qs[l] >> 4) | ((qh >> (l + 16)) & 1) << 4) - off);
            }
        }
        break;
    }
    case Q_Q2_K: {
        const blk_q2_k *x = (const blk_q2_k *)row + b32 / 8;
        for (int n = 0; n < 2; n++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    q[128 * n + 32 * j + l] = (int8_t)((x->qs[32 * n + l] >> (2 * j)) & 3);
        break;
    }
    case Q_Q3_K: {
        const blk_q3_k *x = (const blk_q3_k *)row + b32 / 8;
        for (int n = 0; n < 2; n++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++) {
                    const int q2 = (x->qs[32 * n + l] >> (2 * j)) & 3;
                    const int h = (x->hmask[l] >> (4 * n + j)) & 1;
                    q[128 * n + 32 * j + l] = (int8_t)(q2 - (h ? 0 : 4));
                }
        break;
    }
    case Q_Q5_K: {
        const blk_q5_k *x = (const blk_q5_k *)row + b32 / 8;
        for (int jj = 0; jj < 4; jj++) {
            const uint8_t *ql = x->qs + 32 * jj;
            for (int l = 0; l < 32; l++) {
                q[64 * jj + l] = (int8_t)((ql[l] & 0xF) + (((x->qh[l] >> (2 * jj)) & 1) << 4));
                q[64 * jj + 32 + l] =
                    (int8_t)((ql[l] >> 4) + (((x->qh[l] >> (2 * jj + 1)) & 1) << 4));
            }
        }
        break;
    }
    case Q_IQ4_XS: {
        const blk_iq4_xs *x = (const blk_iq4_xs *)row + b32 / 8;
        for (int ib = 0; ib < 8; ib++)
            for (int l = 0; l < 16; l++) {
                q[32 * ib + l] = qk_iq4nl_values[x->qs[16 * ib + l] & 0xf];
                q[32 * ib + 16 + l] = qk_iq4nl_values[x->qs[16 * ib + l] >> 4];
            }
        break;
    }
    }
}

/* Elements of the tile as floats (nb blocks of 32). */
static void tile_floats(int type, const qu_tile *t, int nb, float *out)
{
    const bool off = has_offsets(type);
    for (int e = 0; e < 32 * nb; e++)
        out[e] = off ? t->a[e / 16] * (float)t->q[e] + t->o[e / 16] : t->a[e / 16] * (float)t->q[e];
}

void qk_dequant_unpacked(int type, const void *row, float *out, int64_t k)
{
    const int64_t nb = k / 32;
    qu_tile t;
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        const int m = nb - b0 < 8 ? (int)(nb - b0) : 8;
        unpack_portable(type, row, b0, m, &t);
        tile_floats(type, &t, m, out + b0 * 32);
    }
}

float qk_dot_unpacked(int type, const void *row, const float *x, int64_t k)
{
    const int64_t nb = k / 32;
    qu_tile t;
    float w[256], sum = 0.0f;
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        const int m = nb - b0 < 8 ? (int)(nb - b0) : 8;
        unpack_portable(type, row, b0, m, &t);
        tile_floats(type, &t, m, w);
        const float *xb = x + b0 * 32;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int j = 0; j < 32 * m; j += 4) {
            s0 += w[j] * xb[j];
            s1 += w[j + 1] * xb[j + 1];
            s2 += w[j + 2] * xb[j + 2];
            s3 += w[j + 3] * xb[j + 3];
        }
        sum += (s0 + s1) + (s2 + s3);
    }
    return sum;
}

/* ---- integer dots, portable ------------------------------------------------------------ */

void qk_rows_unpacked_portable(int type, const void *w, int n, int64_t k, const xq8 *x, int rows,
                               float beta, float *y, int ld_y)
{
    const int64_t nb = k / 32;
    const size_t rb = q_row_bytes(type, k);
    const bool off = has_offsets(type);
    qu_tile t;
    for (int i = 0; i < n; i++) {
        const char *row = (const char *)w + (size_t)i * rb;
        float sum[Q8_GROUP_ROWS] = {0}, osum[Q8_GROUP_ROWS] = {0};
        for (int64_t b0 = 0; b0 < nb; b0 += 8) {
            const int m = nb - b0 < 8 ? (int)(nb - b0) : 8;
            unpack_portable(type, row, b0, m, &t);
            for (int r = 0; r < rows; r++) {
                const int8_t *xq = x->q + (size_t)r * k + b0 * 32;
                for (int g = 0; g < 2 * m; g++) {
                    int s = 0;
                    for (int l = 0; l < 16; l++) s += t.q[16 * g + l] * xq[16 * g + l];
                    sum[r] += t.a[g] * x->d[(size_t)r * nb + b0 + g / 2] * (float)s;
                }
                for (int g = 0; g < 2 * m && off; g++)
                    osum[r] += t.o[g] * x->s16[(size_t)r * 2 * nb + 2 * b0 + g];
            }
        }
        for (int r = 0; r < rows; r++) {
            float *yr = y + (size_t)r * ld_y + i;
            const float v = sum[r] + osum[r];
            *yr = beta == 0.0f ? v : beta * *yr + v;
        }
    }
}

/* Above Q_INT_MAX_ROWS rows (prefill) with AVX-512 VNNI the 32-element types of this file take
 * the tiles of Q8_0 and Q4_K (quant_vnni.c): each block of 32 a scale a (the weight's ds) and,
 * for the unsigned values, a minimum m = -o, the products exact integer sums per block as
 * there. Dequantized into float tiles for SGEMM they ran at a third of Q8_0's tiles
 * (perf/gemm_bench --prefill, Zen 4: Q4_0 68-77 GFLOP/s against Q8_0's 179-260). The K types
 * of this file (Q2_K, Q3_K, Q5_K, IQ4_XS) take Q8_K activations and the K tiles at every row
 * count instead (quant.c matmul_ktiles): a row's bits then do not depend on the batch, and a
 * 256-row prefill ran 1.06x (IQ4_XS), 1.09x (Q5_K), 2.7x (Q2_K) and 3.1x (Q3_K) faster than
 * in these tiles or dequantized (one Zen 4 thread, engine_bench --clock cpu). */
bool qk_vt_unpacked(int type)
{
    return qk_is_unpacked(type) && !qk_q8k_type(type);
}

/* The 32-element types take those tiles at every row count with AVX-512 VNNI (decode too):
 * from 2 rows packed (matmul_vnni), one row dotted as it lies (qk_vt1_unpacked). On the AVX2
 * kernels, which each row group unpacks again, 32 rows took 3x Q8_0's tiles' time (Zen 4). */
bool qk_vt_decode(int type)
{
    return type == Q_Q4_0 || type == Q_Q4_1 || type == Q_Q5_0 || type == Q_Q5_1 || type == Q_IQ4_NL;
}

/* ---- AVX2 ------------------------------------------------------------------------------ */

#if QK_X86

/* The 32 nibbles of 16 bytes: low nibbles (elements 0-15), then high (16-31). */
SIMD static inline __m256i nib32(const uint8_t *qs)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}

/* 0x10 in byte l where bit l of x32 is set (ggml's bytes_from_bits_32). */
SIMD static inline __m256i bits32_x10_v(uint32_t x32)
{
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}

/* The same of the 32 bits at p. */
SIMD static inline __m256i bits32_x10(const uint8_t *p)
{
    uint32_t x32;
    memcpy(&x32, p, 4);
    return bits32_x10_v(x32);
}

SIMD static inline __m256i iq4_grid(void)
{
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qk_iq4nl_values));
}

/* Whether the type's bytes are dotted signed (IQ4_NL's and IQ4_XS's grid, with the sign
 * trick: |q| times x with q's sign); the others' are unsigned (0..31) and dotted as they are,
 * their zero points (Q4_0's 8, Q5_0's 16, Q3_K's 4) and minimums met as offsets: on this
 * path's first machine (Zen 1, 128-bit units) the two signs per block cost a third of the
 * dot. */
static inline bool is_signed(int type)
{
    return type == Q_IQ4_NL || type == Q_IQ4_XS;
}

/* The bytes of a block of a 32-element type, inline (q_row_bytes is a call: in a kernel's
 * loop it cost a third of one row's time, with the vzeroupper before it). */
static inline size_t b32_bytes(int type)
{
    return type == Q_Q4_1   ? sizeof(blk_q4_1)
           : type == Q_Q5_0 ? sizeof(blk_q5_0)
           : type == Q_Q5_1 ? sizeof(blk_q5_1)
                            : sizeof(blk_q4_0);
}

static inline bool is_k256(int type)
{
    return type == Q_Q2_K || type == Q_Q3_K || type == Q_Q5_K || type == Q_IQ4_XS;
}

/* The 32 bytes of block j (0..7) of the unit at block b0 (of 32 elements) of a row, unpacked
 * in registers, in the order of the tile above, the zero points not subtracted. */
SIMD static inline __attribute__((always_inline)) __m256i block_q(const int type, const char *row,
                                                                  int64_t b0, const int j)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    switch (type) {
    case Q_Q4_0: return nib32(((const blk_q4_0 *)row)[b0 + j].qs);
    case Q_Q4_1: return nib32(((const blk_q4_1 *)row)[b0 + j].qs);
    case Q_IQ4_NL:
        return _mm256_shuffle_epi8(iq4_grid(), nib32(((const blk_iq4_nl *)row)[b0 + j].qs));
    case Q_Q5_0: {
        const blk_q5_0 *x = (const blk_q5_0 *)row + b0 + j;
        return _mm256_or_si256(nib32(x->qs), bits32_x10(x->qh));
    }
    case Q_Q5_1: {
        const blk_q5_1 *x = (const blk_q5_1 *)row + b0 + j;
        return _mm256_or_si256(nib32(x->qs), bits32_x10(x->qh));
    }
    case Q_Q2_K: {
        const blk_q2_k *x = (const blk_q2_k *)row + b0 / 8;
        const __m256i v = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * (j / 4)));
        return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (j % 4))),
                                _mm256_set1_epi8(3));
    }
    case Q_Q3_K: { /* the low 2 bits, and 4 where the high bit (bit j of hmask) is set */
        const blk_q3_k *x = (const blk_q3_k *)row + b0 / 8;
        const __m256i v = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * (j / 4)));
        const __m256i q2 = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (j % 4))),
                                            _mm256_set1_epi8(3));
        const __m256i bm = _mm256_set1_epi8((char)(1 << j));
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x->hmask);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bm), bm);
        return _mm256_or_si256(q2, _mm256_and_si256(set, _mm256_set1_epi8(4)));
    }
    case Q_Q5_K: { /* nibbles of qs[32 (j/2)], low or high, and bit j of qh as 16 */
        const blk_q5_k *x = (const blk_q5_k *)row + b0 / 8;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * (j / 2)));
        const __m256i lo = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
        const __m256i bm = _mm256_set1_epi8((char)(1 << j));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)x->qh);
        const __m256i h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bm), bm),
                                           _mm256_set1_epi8(0x10));
        return _mm256_or_si256(lo, h);
    }
    default: { /* Q_IQ4_XS */
        const blk_iq4_xs *x = (const blk_iq4_xs *)row + b0 / 8;
        return _mm256_shuffle_epi8(iq4_grid(), nib32(x->qs + 16 * j));
    }
    }
}

/* The f16 at p, p + bb, ..., p + 7 bb (the scales of 8 blocks of bb bytes) as 8 floats:
 * exact, as _cvtsh_ss of each. */
SIMD static inline __attribute__((always_inline)) __m256 f16x8_strided(const char *p, size_t bb)
{
    uint16_t h[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) memcpy(&h[j], p + (size_t)j * bb, 2);
    __m128i v = _mm_cvtsi32_si128(h[0]);
#pragma GCC unroll 8
    for (int j = 1; j < 8; j++) v = _mm_insert_epi16(v, h[j], j);
    return _mm256_cvtph_ps(v);
}

/* The 32-element types in pairs of blocks: of the unit at block b0 of a row, blocks b0 + p
 * and b0 + p + 4 (p < 4) unpacked in registers as xq8.qp lays the activations out: lo holds
 * elements 0-15 of the first block in its low 128 bits and of the second in its high 128, hi
 * elements 16-31 (values as block_q's, the zero points not subtracted). */
SIMD static inline __attribute__((always_inline)) void
pair_q(const int type, const char *row, int64_t b0, const int p, __m256i *lo, __m256i *hi)
{
    const size_t bb = b32_bytes(type);
    const size_t qh_at = type == Q_Q5_1 ? 4 : 2; /* Q5_0, Q5_1: the fifth bits */
    const size_t qs_at = type == Q_Q4_1 ? 4 : type == Q_Q5_0 || type == Q_Q5_1 ? qh_at + 4 : 2;
    const char *a = row + (size_t)(b0 + p) * bb, *b = a + 4 * bb;
    const __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a + qs_at))),
        _mm_loadu_si128((const __m128i *)(b + qs_at)), 1);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    *lo = _mm256_and_si256(v, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (type == Q_Q5_0 || type == Q_Q5_1) {
        uint32_t ha, hb;
        memcpy(&ha, a + qh_at, 4);
        memcpy(&hb, b + qh_at, 4);
        *lo = _mm256_or_si256(*lo, bits32_x10_v((ha & 0xFFFFu) | hb << 16));
        *hi = _mm256_or_si256(*hi, bits32_x10_v(ha >> 16 | (hb & 0xFFFF0000u)));
    }
    if (type == Q_IQ4_NL) {
        *lo = _mm256_shuffle_epi8(iq4_grid(), *lo);
        *hi = _mm256_shuffle_epi8(iq4_grid(), *hi);
    }
}

/* The exact integer sums of a pair of blocks (pair_q's lo, hi, and al, ah: their magnitudes
 * where the type is signed) with the activations' xl, xh (xq8.qp): the first block's in int32
 * lanes 0-3, the second's in 4-7. The unsigned types add the two halves' 16-bit pair sums
 * before one madd widens them (at most 2 x 2 x 31 x 127 = 15748: no saturation); IQ4_NL's
 * (up to 2 x 127 x 127 each) are widened apart. */
SIMD static inline __attribute__((always_inline)) __m256i
pair_dot(const bool sgn, __m256i lo, __m256i hi, __m256i al, __m256i ah, __m256i xl, __m256i xh)
{
    const __m256i ones = _mm256_set1_epi16(1);
    if (!sgn)
        return _mm256_madd_epi16(
            _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh)), ones);
    return _mm256_add_epi32(
        _mm256_madd_epi16(_mm256_maddubs_epi16(al, _mm256_sign_epi8(xl, lo)), ones),
        _mm256_madd_epi16(_mm256_maddubs_epi16(ah, _mm256_sign_epi8(xh, hi)), ones));
}

/* The same for IQ4_NL with the magnitudes taken of the activations (axl, axh) instead, the
 * weights' signs moved onto them: the same exact sums, for one or two rows, where the
 * activations' are taken once for the weight rows beside them (a batch takes the weights'
 * once for its rows). */
SIMD static inline __attribute__((always_inline)) __m256i
pair_dot_ax(__m256i lo, __m256i hi, __m256i axl, __m256i axh, __m256i xl, __m256i xh)
{
    const __m256i ones = _mm256_set1_epi16(1);
    return _mm256_add_epi32(
        _mm256_madd_epi16(_mm256_maddubs_epi16(axl, _mm256_sign_epi8(lo, xl)), ones),
        _mm256_madd_epi16(_mm256_maddubs_epi16(axh, _mm256_sign_epi8(hi, xh)), ones));
}

/* Two pairs' sums (lanes: 4 of block j | 4 of block j + 4) added down to 2 lanes each,
 * interleaved: s0's and s1's first two and last two lanes. */
SIMD static inline __m256i pair_fold2(__m256i s0, __m256i s1)
{
    return _mm256_add_epi32(_mm256_unpacklo_epi32(s0, s1), _mm256_unpackhi_epi32(s0, s1));
}

/* The unit's 8 block sums in block order from pair_fold2 of pairs 0, 1 and of 2, 3. */
SIMD static inline __m256i pair_fold4(__m256i t01, __m256i t23)
{
    return _mm256_add_epi32(_mm256_unpacklo_epi64(t01, t23), _mm256_unpackhi_epi64(t01, t23));
}

/* What the blocks of a unit of one weight row share: ds[j], the float scale of block j (Q2_K
 * and Q3_K: d of the whole unit, in every ds[j]; their 16-element scales are integers in sc,
 * each as (s | s << 16) in an int32, for madd); o, the offsets: per block of 32 (o[0..7]:
 * Q4_0's -8 d, Q5_0's -16 d, Q4_1's and Q5_1's m, Q5_K's -dmin m) or per 16 elements (Q2_K's
 * -dmin m, Q3_K's -4 d sc). */
typedef struct unit_hdr {
    float ds[8];
    float o[16];
    __m256i sc[2];
} unit_hdr;

SIMD static inline __attribute__((always_inline)) void unit_header(const int type, const char *row,
                                                                   int64_t b0, int m, unit_hdr *h)
{
    switch (type) {
    case Q_Q4_0:
        for (int j = 0; j < m; j++) {
            h->ds[j] = _cvtsh_ss(((const blk_q4_0 *)row)[b0 + j].d);
            h->o[j] = -8.0f * h->ds[j];
        }
        break;
    case Q_IQ4_NL:
        for (int j = 0; j < m; j++) h->ds[j] = _cvtsh_ss(((const blk_iq4_nl *)row)[b0 + j].d);
        break;
    case Q_Q5_0:
        for (int j = 0; j < m; j++) {
            h->ds[j] = _cvtsh_ss(((const blk_q5_0 *)row)[b0 + j].d);
            h->o[j] = -16.0f * h->ds[j];
        }
        break;
    case Q_Q4_1:
        for (int j = 0; j < m; j++) {
            const blk_q4_1 *x = (const blk_q4_1 *)row + b0 + j;
            h->ds[j] = _cvtsh_ss(x->d);
            h->o[j] = _cvtsh_ss(x->m);
        }
        break;
    case Q_Q5_1:
        for (int j = 0; j < m; j++) {
            const blk_q5_1 *x = (const blk_q5_1 *)row + b0 + j;
            h->ds[j] = _cvtsh_ss(x->d);
            h->o[j] = _cvtsh_ss(x->m);
        }
        break;
    case Q_Q5_K: {
        const blk_q5_k *x = (const blk_q5_k *)row + b0 / 8;
        const float d = _cvtsh_ss(x->d), dmin = _cvtsh_ss(x->dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            scale_min_k4(j, x->scales, &sc, &mn);
            h->ds[j] = d * (float)sc;
            h->o[j] = -(dmin * (float)mn);
        }
        break;
    }
    case Q_IQ4_XS: {
        const blk_iq4_xs *x = (const blk_iq4_xs *)row + b0 / 8;
        const float d = _cvtsh_ss(x->d);
        for (int ib = 0; ib < 8; ib++) {
            const int ls = ((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) |
                           (((x->scales_h >> 2 * ib) & 3) << 4);
            h->ds[ib] = d * (float)(ls - 32);
        }
        break;
    }
    case Q_Q2_K: {
        const blk_q2_k *x = (const blk_q2_k *)row + b0 / 8;
        const __m256 dmin = _mm256_set1_ps(-_cvtsh_ss(x->dmin));
        _mm256_storeu_ps(h->ds, _mm256_set1_ps(_cvtsh_ss(x->d)));
        for (int half = 0; half < 2; half++) {
            const __m256i v =
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x->scales + 8 * half)));
            const __m256i s = _mm256_and_si256(v, _mm256_set1_epi32(0xF));
            h->sc[half] = _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
            _mm256_storeu_ps(h->o + 8 * half,
                             _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4))));
        }
        break;
    }
    default: { /* Q_Q3_K */
        const blk_q3_k *x = (const blk_q3_k *)row + b0 / 8;
        uint8_t sc[16];
        q3k_scales(x->scales, sc);
        const float d = _cvtsh_ss(x->d);
        const __m256 d4 = _mm256_set1_ps(-4.0f * d);
        _mm256_storeu_ps(h->ds, _mm256_set1_ps(d));
        for (int half = 0; half < 2; half++) {
            const __m256i s = _mm256_sub_epi32(
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8 * half))),
                _mm256_set1_epi32(32));
            h->sc[half] = _mm256_or_si256(_mm256_and_si256(s, _mm256_set1_epi32(0xFFFF)),
                                          _mm256_slli_epi32(s, 16));
            _mm256_storeu_ps(h->o + 8 * half, _mm256_mul_ps(d4, _mm256_cvtepi32_ps(s)));
        }
        break;
    }
    }
}

/* The weight rows one activation row alone (decode) dots at once. In blocks of 32 (the pairs
 * below) one at a time was faster than two: with two the unit's unpacked pairs of both rows
 * no longer fitted in the registers (perf/quant_bench --rows 1 --clock cpu, load 13, time per
 * layer against two: Q4_0 0.83x, Q4_1 0.84x, Q5_0 0.94x, Q5_1 0.94x, IQ4_NL 0.93x). */
#ifndef QU_DECODE_NW
#define QU_DECODE_NW 1
#endif

/* One activation row of a 32-element type prefetches each weight row's blocks QU_PF_GROUPS
 * groups of QU_DECODE_NW rows ahead (Q4_0 at 768 with one row a group: 864 bytes): with two
 * rows a group one thread's Q4_0 rose from 7.4-7.6 to 8.0-8.8 GMAC/s, Q5_0 4.8-5.1 to 5.7-6.2,
 * Q4_1 6.9-7.1 to 7.8-8.3 (perf/quant_bench --rows 1 --clock cpu, at load 7; 1 to 8 groups
 * measured alike from 2). The K types are left as they were. */
#define QU_PF_GROUPS 2

/* A whole unit (8 blocks) of NW weight rows of a 32-element type times R activation rows
 * (xq8.qp), in pairs of blocks (pair_q): the exact integer sum of each block with each row
 * folded into one int32 lane per block, then one float step per unit, the 8 blocks' scales
 * (the weight's times the activation's) in a vector; the offsets (Q4_0's -8 d, Q5_0's -16 d,
 * Q4_1's and Q5_1's m) meet the activations' sums per block in oacc, also once per unit.
 * On Zen 1 vpmaddubsw and vpmaddwd share one pipe, one 128-bit op a cycle
 * (perf/machine_probe --mul: 0.5 of either in 256 bits a cycle, alone or mixed): the unsigned
 * types widen with one madd per two blocks instead of two, and the cvt, FMA and broadcast of
 * each block's float step become one of each per 8 blocks. R <= 2: the pairs in the outer
 * loop, the weights unpacked in registers for the rows; more rows: each row's pairs in turn
 * over the unit unpacked once (the same sums and steps). */
SIMD static inline __attribute__((always_inline)) void
unit_pairs(const int type, const char *const row[4], int64_t b0, int64_t k, const xq8 *x,
           __m256 acc[4][Q8_GROUP_ROWS], __m256 oacc[4][Q8_GROUP_ROWS], const int R, const int NW,
           const size_t pf)
{
    const int64_t nb = k / 32;
    const size_t bb = b32_bytes(type);
    const bool sgn = is_signed(type);
    __m256 ds[4];
#pragma GCC unroll 4
    for (int wi = 0; wi < NW; wi++) {
        /* the 8 scales (and Q4_1's and Q5_1's minimums) converted 8 at a time in registers,
         * the offsets made from them there */
        const char *blk = row[wi] + (size_t)b0 * bb;
        ds[wi] = f16x8_strided(blk, bb);
        const __m256 ov = type == Q_Q4_0   ? _mm256_mul_ps(_mm256_set1_ps(-8.0f), ds[wi])
                          : type == Q_Q5_0 ? _mm256_mul_ps(_mm256_set1_ps(-16.0f), ds[wi])
                          : type == Q_Q4_1 || type == Q_Q5_1 ? f16x8_strided(blk + 2, bb)
                                                             : _mm256_setzero_ps();
        if (type != Q_IQ4_NL)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                oacc[wi][r] =
                    _mm256_fmadd_ps(ov, _mm256_loadu_ps(x->s + (size_t)r * nb + b0), oacc[wi][r]);
    }
    __m256i lo[4][4], hi[4][4], al[4][4], ah[4][4]; /* [wi][p] */
    __m256i t[4][Q8_GROUP_ROWS][2];                 /* [wi][r][pairs 0-1, 2-3] */
    if (R <= 2) {
#pragma GCC unroll 2
        for (int hp = 0; hp < 2; hp++) {
            __m256i s[4][Q8_GROUP_ROWS][2];
#pragma GCC unroll 2
            for (int pp = 0; pp < 2; pp++) {
                const int p = 2 * hp + pp;
#pragma GCC unroll 4
                for (int wi = 0; wi < NW; wi++) {
                    if (pf) _mm_prefetch(row[wi] + (size_t)(b0 + 2 * p) * bb + pf, _MM_HINT_T0);
                    pair_q(type, row[wi], b0, p, &lo[wi][p], &hi[wi][p]);
                }
#pragma GCC unroll 2
                for (int r = 0; r < R; r++) {
                    const int8_t *xp = x->qp + (size_t)r * k + b0 * 32 + 64 * p;
                    const __m256i xl = _mm256_loadu_si256((const __m256i *)xp);
                    const __m256i xh = _mm256_loadu_si256((const __m256i *)(xp + 32));
                    const __m256i axl = _mm256_abs_epi8(xl), axh = _mm256_abs_epi8(xh);
#pragma GCC unroll 4
                    for (int wi = 0; wi < NW; wi++)
                        s[wi][r][pp] = sgn ? pair_dot_ax(lo[wi][p], hi[wi][p], axl, axh, xl, xh)
                                           : pair_dot(false, lo[wi][p], hi[wi][p], lo[wi][p],
                                                      hi[wi][p], xl, xh);
                }
            }
#pragma GCC unroll 4
            for (int wi = 0; wi < NW; wi++)
#pragma GCC unroll 2
                for (int r = 0; r < R; r++) t[wi][r][hp] = pair_fold2(s[wi][r][0], s[wi][r][1]);
        }
    } else {
#pragma GCC unroll 4
        for (int wi = 0; wi < NW; wi++)
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) {
                if (pf) _mm_prefetch(row[wi] + (size_t)(b0 + 2 * p) * bb + pf, _MM_HINT_T0);
                pair_q(type, row[wi], b0, p, &lo[wi][p], &hi[wi][p]);
                al[wi][p] = sgn ? _mm256_abs_epi8(lo[wi][p]) : lo[wi][p];
                ah[wi][p] = sgn ? _mm256_abs_epi8(hi[wi][p]) : hi[wi][p];
            }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const int8_t *xp = x->qp + (size_t)r * k + b0 * 32;
#pragma GCC unroll 4
            for (int wi = 0; wi < NW; wi++) {
                __m256i s[4];
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++)
                    s[p] = pair_dot(sgn, lo[wi][p], hi[wi][p], al[wi][p], ah[wi][p],
                                    _mm256_loadu_si256((const __m256i *)(xp + 64 * p)),
                                    _mm256_loadu_si256((const __m256i *)(xp + 64 * p + 32)));
                t[wi][r][0] = pair_fold2(s[0], s[1]);
                t[wi][r][1] = pair_fold2(s[2], s[3]);
            }
        }
    }
#pragma GCC unroll 4
    for (int wi = 0; wi < NW; wi++) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m256 sx = _mm256_mul_ps(ds[wi], _mm256_loadu_ps(x->d + (size_t)r * nb + b0));
            const __m256i sum = pair_fold4(t[wi][r][0], t[wi][r][1]);
            acc[wi][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), sx, acc[wi][r]);
        }
    }
}

/* R activation rows times NW weight rows at a time (both constants), of `type` (a constant):
 * each block of each weight row unpacked in registers once for all R rows, each activation
 * block loaded once for all NW weight rows (one row alone, decode, dots QU_DECODE_NW weight
 * rows at once); the float scale of each block and row (the weight's times the
 * activation's) multiplied 8 blocks at a time. A weight row's products with an activation
 * row go through the same steps whatever R and NW are, so a row gets the same bits alone as
 * in a batch. n is a multiple of NW. */
SIMD static inline __attribute__((always_inline)) void
rows_unpacked_r(const int type, const char *w, int n, int64_t k, const xq8 *x, float beta, float *y,
                int ld_y, const int R, const int NW)
{
    const int64_t nb = k / 32;
    const size_t rb = q_row_bytes(type, k);
    const bool sgn = is_signed(type), k256 = is_k256(type);
    const bool isc = type == Q_Q2_K || type == Q_Q3_K;
    const bool off32 =
        type == Q_Q4_0 || type == Q_Q5_0 || type == Q_Q4_1 || type == Q_Q5_1 || type == Q_Q5_K;
    const bool off16 = type == Q_Q2_K || type == Q_Q3_K;
    const __m256i ones = _mm256_set1_epi16(1);
    /* one activation row of a 32-element type: each weight row's blocks prefetched pf rows
     * of NW ahead */
    const size_t bb = q_row_bytes(type, 32);
    const size_t pf = R == 1 && !k256 ? (size_t)QU_PF_GROUPS * (size_t)NW * rb : 0;
    for (int i = 0; i < n; i += NW) {
        const char *row[4];
        __m256 acc[4][Q8_GROUP_ROWS], oacc[4][Q8_GROUP_ROWS];
        float otail[4][Q8_GROUP_ROWS];
#pragma GCC unroll 4
        for (int wi = 0; wi < NW; wi++) {
            row[wi] = w + (size_t)(i + wi) * rb;
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                acc[wi][r] = _mm256_setzero_ps();
                oacc[wi][r] = _mm256_setzero_ps();
                otail[wi][r] = 0.0f;
            }
        }
        for (int64_t b0 = 0; b0 < nb; b0 += 8) {
            /* the K types' units are whole blocks: 8 (a constant the loops unroll to) */
            const int m = k256 || nb - b0 >= 8 ? 8 : (int)(nb - b0);
            unit_hdr h[4];
            float sx[4][Q8_GROUP_ROWS][8] __attribute__((aligned(32)));
            if (!k256 && m == 8 && x->qp) {
                unit_pairs(type, row, b0, k, x, acc, oacc, R, NW, pf);
                continue;
            }
#pragma GCC unroll 4
            for (int wi = 0; wi < NW; wi++) {
                unit_header(type, row[wi], b0, m, &h[wi]);
                if (m == 8) {
                    const __m256 ds = _mm256_loadu_ps(h[wi].ds);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++)
                        _mm256_store_ps(
                            sx[wi][r],
                            _mm256_mul_ps(ds, _mm256_loadu_ps(x->d + (size_t)r * nb + b0)));
                } else {
                    for (int r = 0; r < R; r++)
                        for (int j = 0; j < m; j++)
                            sx[wi][r][j] = h[wi].ds[j] * x->d[(size_t)r * nb + b0 + j];
                }
            }
#pragma GCC unroll 8
            for (int j = 0; j < m; j++) {
                __m256i q[4], aq[4], sc[4];
#pragma GCC unroll 4
                for (int wi = 0; wi < NW; wi++) {
                    if (pf) _mm_prefetch(row[wi] + (size_t)(b0 + j) * bb + pf, _MM_HINT_T0);
                    q[wi] = block_q(type, row[wi], b0, j);
                    aq[wi] = sgn ? _mm256_sign_epi8(q[wi], q[wi]) : q[wi];
                    if (isc) /* lanes 0-3: scale 2j, 4-7: scale 2j+1 */
                        sc[wi] = _mm256_permutevar8x32_epi32(
                            h[wi].sc[j / 4],
                            _mm256_add_epi32(_mm256_set1_epi32(2 * (j % 4)),
                                             _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)));
                    else
                        sc[wi] = ones;
                }
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const __m256i xv =
                        _mm256_loadu_si256((const __m256i *)(x->q + (size_t)r * k + (b0 + j) * 32));
#pragma GCC unroll 4
                    for (int wi = 0; wi < NW; wi++) {
                        const __m256i xs = sgn ? _mm256_sign_epi8(xv, q[wi]) : xv;
                        const __m256i p =
                            _mm256_madd_epi16(_mm256_maddubs_epi16(aq[wi], xs), sc[wi]);
                        acc[wi][r] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&sx[wi][r][j]), acc[wi][r]);
                    }
                }
            }
            if (off32 && m == 8) {
#pragma GCC unroll 4
                for (int wi = 0; wi < NW; wi++) {
                    const __m256 o = _mm256_loadu_ps(h[wi].o);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++)
                        oacc[wi][r] = _mm256_fmadd_ps(
                            o, _mm256_loadu_ps(x->s + (size_t)r * nb + b0), oacc[wi][r]);
                }
            } else if (off32) {
                for (int wi = 0; wi < NW; wi++)
                    for (int r = 0; r < R; r++)
                        for (int j = 0; j < m; j++)
                            otail[wi][r] += h[wi].o[j] * x->s[(size_t)r * nb + b0 + j];
            }
            if (off16) {
#pragma GCC unroll 4
                for (int wi = 0; wi < NW; wi++) {
                    const __m256 o0 = _mm256_loadu_ps(h[wi].o), o1 = _mm256_loadu_ps(h[wi].o + 8);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        const float *s = x->s16 + (size_t)r * 2 * nb + 2 * b0;
                        oacc[wi][r] = _mm256_fmadd_ps(o0, _mm256_loadu_ps(s), oacc[wi][r]);
                        oacc[wi][r] = _mm256_fmadd_ps(o1, _mm256_loadu_ps(s + 8), oacc[wi][r]);
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int wi = 0; wi < NW; wi++)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                float *yr = y + (size_t)r * ld_y + i + wi;
                const float v = hsum8(acc[wi][r]) + (hsum8(oacc[wi][r]) + otail[wi][r]);
                *yr = beta == 0.0f ? v : beta * *yr + v;
            }
    }
}

/* The n weight rows: NW at a time, then the rest one at a time (the same steps per row); NW
 * is QU_DECODE_NW for one activation row, 2 for two, else 1. */
SIMD static inline __attribute__((always_inline)) void rows_nw(const int type, const char *w, int n,
                                                               int64_t k, const xq8 *x, float beta,
                                                               float *y, int ld_y, const int R)
{
    const int NW = R == 1 ? QU_DECODE_NW : R == 2 ? 2 : 1;
    const int n_main = n / NW * NW;
    if (n_main) rows_unpacked_r(type, w, n_main, k, x, beta, y, ld_y, R, NW);
    if (n > n_main)
        rows_unpacked_r(type, w + (size_t)n_main * q_row_bytes(type, k), n - n_main, k, x, beta,
                        y + n_main, ld_y, R, 1);
}

/* The types of this file; each is a constant in its own expansion of rows_nw. */
#define UNPACKED_TYPES(X)                                                                          \
    X(Q_Q4_0) X(Q_Q4_1) X(Q_Q5_0) X(Q_Q5_1) X(Q_IQ4_NL) X(Q_Q2_K) X(Q_Q3_K) X(Q_Q5_K) X(Q_IQ4_XS)

SIMD void qk_rows_unpacked_avx2(int type, const void *wv, int n, int64_t k, const xq8 *x, int rows,
                                float beta, float *y, int ld_y)
{
    const char *w = wv;
#define UNPACKED_CASE(T)                                                                           \
    case T: ROWS_BY_COUNT(rows, rows_nw, T, w, n, k, x, beta, y, ld_y) break;
    switch (type) {
        UNPACKED_TYPES(UNPACKED_CASE)
    }
#undef UNPACKED_CASE
}

/* ---- AVX-512 VNNI tiles (prefill) ------------------------------------------------------ */

/* The 32-element types straight into the tile, a block of the 16 rows at a time: the rows'
 * 16 bytes of nibbles in four zmm (zmm k holds rows k, 4 + k, 8 + k, 12 + k, one a 128-bit
 * lane), their low and high nibbles (elements 0-15, 16-31; IQ4_NL through its grid + 128),
 * Q5_0's and Q5_1's fifth bits added as 16 under a mask, and a 4x4 transpose of dwords in each
 * lane, which with that order of the rows gives the tile's 8 vectors of 16 rows x 4 bytes.
 * The same bytes and scales as unpacking each row and transposing it (below), which spent
 * half the time of 32 activation rows' products on it (perf record of engine_bench --seqs 32,
 * IQ4_NL, one thread). The 16 rows at w, rb bytes apart, all nb blocks. */
VNNI512 static inline __attribute__((always_inline)) void
pack32(const int type, const char *w, size_t rb, int64_t nb, const vt_w *t)
{
    const size_t bb = b32_bytes(type);
    const size_t qh_at = type == Q_Q5_1 ? 4 : 2;
    const size_t qs_at = type == Q_Q4_1 ? 4 : type == Q_Q5_0 || type == Q_Q5_1 ? qh_at + 4 : 2;
    const bool q5 = type == Q_Q5_0 || type == Q_Q5_1, mins = type == Q_Q4_1 || type == Q_Q5_1;
    const __m512i m4 = _mm512_set1_epi8(0x0F), x10 = _mm512_set1_epi8(0x10);
    const __m512i grid =
        _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qk_iq4nl_values)),
                         _mm512_set1_epi8((char)0x80));
    /* Q5: each lane's qh (4 bytes) spread so that byte l of the lane tests bit l (lo) or
     * 16 + l (hi) of it: bytes 0, 1 (2, 3) of the dword, eight times each */
    const __m512i sel_lo =
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m512i sel_hi =
        _mm512_broadcast_i32x4(_mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m512i bit = _mm512_set1_epi64(0x8040201008040201LL);
    for (int64_t b = 0; b < nb; b++) {
        const char *p = w + (size_t)b * bb;
        /* the 16 rows' scales (and minimums: the next f16), fifth bits: scalar loads (a
         * gather, vpgatherdd, took a third of the pack's time on Zen 4) */
        uint32_t d32[16], h32[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            memcpy(&d32[i], p + (size_t)i * rb, 4);
            if (q5) memcpy(&h32[i], p + (size_t)i * rb + qh_at, 4);
        }
        const __m512i dm = _mm512_loadu_si512(d32);
        const __m512 a = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
        _mm512_storeu_ps(t->a + b * 16, a);
        /* the tiles' minimums as qk_vt_pack_unpacked's (vt1_mins32) */
        __m512 mv = _mm512_setzero_ps();
        if (type == Q_Q4_0) mv = _mm512_mul_ps(a, _mm512_set1_ps(8.0f));
        if (type == Q_Q5_0) mv = _mm512_mul_ps(a, _mm512_set1_ps(16.0f));
        if (mins)
            mv = _mm512_xor_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16))),
                               _mm512_castsi512_ps(_mm512_set1_epi32((int)0x80000000u)));
        _mm512_storeu_ps(t->m + b * 16, mv);
        const __m512i H = q5 ? _mm512_loadu_si512(h32) : _mm512_setzero_si512();
        __m512i lo[4], hi[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const char *r = p + qs_at + (size_t)k * rb;
            __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)r));
            z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(r + 4 * rb)), 1);
            z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(r + 8 * rb)), 2);
            z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(r + 12 * rb)), 3);
            lo[k] = _mm512_and_si512(z, m4);
            hi[k] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
            if (q5) { /* lane j: qh of row 4 j + k in every dword */
                const __m512i qk = _mm512_permutexvar_epi32(
                    _mm512_add_epi32(
                        _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12),
                        _mm512_set1_epi32(k)),
                    H);
                lo[k] = _mm512_mask_add_epi8(
                    lo[k], _mm512_test_epi8_mask(_mm512_shuffle_epi8(qk, sel_lo), bit), lo[k], x10);
                hi[k] = _mm512_mask_add_epi8(
                    hi[k], _mm512_test_epi8_mask(_mm512_shuffle_epi8(qk, sel_hi), bit), hi[k], x10);
            }
            if (type == Q_IQ4_NL) {
                lo[k] = _mm512_shuffle_epi8(grid, lo[k]);
                hi[k] = _mm512_shuffle_epi8(grid, hi[k]);
            }
        }
        /* per lane j, dword g of zmm k (row 4 j + k) to dword k of lane j of vector g: row
         * 4 j + k at dword 4 j + k, as the tile wants */
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            const __m512i *z = half ? hi : lo;
            const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]);
            const __m512i t1 = _mm512_unpackhi_epi32(z[0], z[1]);
            const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]);
            const __m512i t3 = _mm512_unpackhi_epi32(z[2], z[3]);
            uint8_t *q = t->q + (b * 8 + 4 * half) * 64;
            _mm512_storeu_si512(q, _mm512_unpacklo_epi64(t0, t2));
            _mm512_storeu_si512(q + 64, _mm512_unpackhi_epi64(t0, t2));
            _mm512_storeu_si512(q + 128, _mm512_unpacklo_epi64(t1, t3));
            _mm512_storeu_si512(q + 192, _mm512_unpackhi_epi64(t1, t3));
        }
    }
}

/* pack32 of the m rows at w, copied into tmp first, the rows past m copies of row m - 1
 * (their outputs are never stored): the copy reads the rows one after the other, a stream
 * the prefetchers follow, where pack32 reads 16 rows a block at a time (at 16 and 32
 * activation rows the copy took Q5_1's time per layer from 1.00-1.14x Q8_0's to 0.95-0.99x,
 * Q4_0's and IQ4_NL's by 2-10%: perf/quant_bench --rows 16,32 --clock cpu, load 3-4). */
VNNI512 static inline __attribute__((always_inline)) void
pack32_rows(const int type, const char *w, size_t rb, int m, int64_t nb, const vt_w *t, int8_t *tmp)
{
    memcpy(tmp, w, (size_t)m * rb);
    for (int i = m; i < 16; i++) memcpy((char *)tmp + (size_t)i * rb, w + (size_t)(m - 1) * rb, rb);
    pack32(type, (const char *)tmp, rb, nb, t);
}

/* The 32-element types' rows unpacked and transposed block by block (pack32_rows). */
VNNI512 void qk_vt_pack_unpacked(int type, const char *w, size_t rb, int m, int64_t nb,
                                 const vt_w *t, int8_t *tmp)
{
    switch (type) {
    case Q_Q4_0: pack32_rows(Q_Q4_0, w, rb, m, nb, t, tmp); return;
    case Q_Q4_1: pack32_rows(Q_Q4_1, w, rb, m, nb, t, tmp); return;
    case Q_Q5_0: pack32_rows(Q_Q5_0, w, rb, m, nb, t, tmp); return;
    case Q_Q5_1: pack32_rows(Q_Q5_1, w, rb, m, nb, t, tmp); return;
    case Q_IQ4_NL: pack32_rows(Q_IQ4_NL, w, rb, m, nb, t, tmp); return;
    default: return; /* only qk_vt_unpacked's types come here */
    }
}

/* ---- AVX-512 VNNI, a few rows (decode) ------------------------------------------------ */

/* The activation rows qk_vt1_unpacked dots at once with each unit of a weight row unpacked. */
#define VT1_GROUP   4
/* One activation row prefetches each weight row's units this many rows ahead: the units as
 * they lie cost fewer instructions than the AVX2 kernels' pairs, and QU_PF_GROUPS' 2 rows
 * left the loads waiting for memory (IQ4_NL one thread, engine_bench --seqs 1 --clock cpu,
 * 6 alternating runs at load 4-6, median tok/s: 2 rows 141, 4 150, 8 152-194, a fixed 4 KiB
 * 168-180). */
#define VT1_PF_ROWS 8

/* The float steps of activation row r (of x, nb blocks a row; c32: its -128 x sums, IQ4_NL)
 * over p, the exact sums of blocks b0.. (n of them, 1..8, b0 a multiple of 8; the lanes past n
 * 0) of a weight row whose scales are a (and minimums mn, as the tiles' t->m), as vt_acc adds
 * each block in a tile: block b into chain b % 4 of acc (vt_fold4), so a row alone gets what
 * qk_vt_rows_q8_0 (IQ4_NL) or qk_vt_rows_q4_k32 (the others) give it in a batch. */
VNNI512 static inline __attribute__((always_inline)) void
vt1_step32(const int type, __m256i p, __m256 a, __m256 mn, const xq8 *x, const int32_t *c32, int r,
           int64_t nb, int64_t b0, int n, __m128 *acc)
{
    const __mmask8 k = (__mmask8)((1u << n) - 1);
    const size_t at = (size_t)r * nb + b0;
    if (type == Q_IQ4_NL) p = _mm256_add_epi32(p, _mm256_maskz_loadu_epi32(k, c32 + at));
    const __m256 f = _mm256_cvtepi32_ps(p),
                 t = _mm256_mul_ps(a, _mm256_maskz_loadu_ps(k, x->d + at));
    const __m256 sx = type == Q_IQ4_NL ? t : _mm256_maskz_loadu_ps(k, x->s + at);
    *acc = _mm_fmadd_ps(_mm256_castps256_ps128(f), _mm256_castps256_ps128(t), *acc);
    if (type != Q_IQ4_NL)
        *acc = _mm_fnmadd_ps(_mm256_castps256_ps128(mn), _mm256_castps256_ps128(sx), *acc);
    if (n > 4) {
        *acc = _mm_fmadd_ps(_mm256_extractf128_ps(f, 1), _mm256_extractf128_ps(t, 1), *acc);
        if (type != Q_IQ4_NL)
            *acc = _mm_fnmadd_ps(_mm256_extractf128_ps(mn, 1), _mm256_extractf128_ps(sx, 1), *acc);
    }
}

/* The tiles' minimums (qk_vt_pack_unpacked's t->m) from the blocks' d (a) and m (M): Q4_0's
 * 8 d, Q5_0's 16 d, Q4_1's and Q5_1's -m (IQ4_NL has none). */
VNNI512 static inline __attribute__((always_inline)) __m256 vt1_mins32(const int type, __m256 a,
                                                                       __m256 M)
{
    if (type == Q_Q4_0) return _mm256_mul_ps(a, _mm256_set1_ps(8.0f));
    if (type == Q_Q5_0) return _mm256_mul_ps(a, _mm256_set1_ps(16.0f));
    if (type == Q_Q4_1 || type == Q_Q5_1)
        return _mm256_xor_ps(M, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)));
    return a;
}

/* The activations of the whole units of a row in the order vt1_row32 dots them (xq4): per
 * unit of 8 blocks, elements 0-15 of blocks 0-3, elements 16-31 of blocks 0-3, then the same of
 * blocks 4-7 (64 bytes each), so that one zmm of the weights holds 4 blocks' bytes, one
 * 128-bit lane a block, and its low and high nibbles dot with two of these vectors into the
 * same sums. */
VNNI512 static void vt1_quads(const int8_t *q, int8_t *out, int64_t nb)
{
    for (int64_t b0 = 0; b0 + 8 <= nb; b0 += 8) {
        const int8_t *s = q + b0 * 32;
        int8_t *o = out + b0 * 32;
        for (int h = 0; h < 2; h++) { /* blocks 4 h .. 4 h + 3: 16-byte chunks 0-7 */
            const __m512i c0 = _mm512_loadu_si512(s + 128 * h),
                          c1 = _mm512_loadu_si512(s + 128 * h + 64);
            _mm512_storeu_si512(o + 128 * h, _mm512_shuffle_i64x2(c0, c1, _MM_SHUFFLE(2, 0, 2, 0)));
            _mm512_storeu_si512(o + 128 * h + 64,
                                _mm512_shuffle_i64x2(c0, c1, _MM_SHUFFLE(3, 1, 3, 1)));
        }
    }
}

/* The word indices that gather, from two zmm of a row, (A) the 16 bytes of nibbles of blocks
 * 0-3 of a unit (from bytes 0-127 of the unit) or (B) of blocks 4-7 (from bytes 64-127 and
 * the unit's last 64), one block a 128-bit lane; (C) from bytes 0-127, the f16 d of blocks
 * 0-3 in words 0-3, their m (Q4_1, Q5_1) in words 8-11 and their qh (Q5_0, Q5_1) in dwords
 * 8-11; (D) the same of blocks 4-7 in words 4-7, 12-15 and dwords 12-15 from the second pair.
 * Every field of these blocks starts at an even byte. */
typedef struct vt1_idx {
    __m512i qs_lo, qs_hi, hd_lo, hd_hi;
} vt1_idx;

static inline int vt1_word(size_t at, size_t base2)
{
    /* byte `at` of the unit, in the pair (bytes 64.. as the first zmm, base2.. as the second) */
    return at < 128 ? (int)((at - 64) / 2) : (int)(32 + (at - base2) / 2);
}

VNNI512 static inline __attribute__((always_inline)) vt1_idx vt1_indices(const int type)
{
    const size_t bb = b32_bytes(type), unit = 8 * bb, base2 = unit - 64;
    const size_t qh_at = type == Q_Q5_1 ? 4 : 2;
    const size_t qs_at = type == Q_Q4_1 ? 4 : type == Q_Q5_0 || type == Q_Q5_1 ? qh_at + 4 : 2;
    int16_t ql[32], qhi[32], hl[32] = {0}, hh[32] = {0};
    for (int j = 0; j < 4; j++)
        for (int w = 0; w < 8; w++) {
            ql[8 * j + w] = (int16_t)((j * bb + qs_at) / 2 + w);
            qhi[8 * j + w] = (int16_t)vt1_word((4 + j) * bb + qs_at + 2 * w, base2);
        }
    for (int j = 0; j < 4; j++) {
        hl[j] = (int16_t)(j * bb / 2);
        hl[8 + j] = (int16_t)(j * bb / 2 + 1);
        hl[16 + 2 * j] = (int16_t)((j * bb + qh_at) / 2);
        hl[17 + 2 * j] = (int16_t)((j * bb + qh_at) / 2 + 1);
        hh[4 + j] = (int16_t)vt1_word((4 + j) * bb, base2);
        hh[12 + j] = (int16_t)vt1_word((4 + j) * bb + 2, base2);
        hh[24 + 2 * j] = (int16_t)vt1_word((4 + j) * bb + qh_at, base2);
        hh[25 + 2 * j] = (int16_t)vt1_word((4 + j) * bb + qh_at + 2, base2);
    }
    return (vt1_idx){_mm512_loadu_si512(ql), _mm512_loadu_si512(qhi), _mm512_loadu_si512(hl),
                     _mm512_loadu_si512(hh)};
}

/* The whole unit of 8 blocks at u of a row, unpacked: z[0] blocks 0-3, z[1] blocks 4-7 (one
 * block a 128-bit lane; low, high nibbles, with their fifth bits, IQ4_NL through its grid +
 * 128), as xq4 lays the activations out; hd: d of blocks 0-7 in words 0-7, m in 8-15, qh in
 * dwords 8-15. Read as three zmm (the unit's first 128 bytes and its last 64), from which
 * word permutes take blocks 0-3's nibbles, blocks 4-7's and all 8 blocks' scales. */
VNNI512 static inline __attribute__((always_inline)) void
vt1_unit(const int type, const char *u, const vt1_idx *ix, __m512i z[2][2], __m512i *hd_out)
{
    const size_t unit = 8 * b32_bytes(type);
    const bool q5 = type == Q_Q5_0 || type == Q_Q5_1;
    const __m512i m4 = _mm512_set1_epi8(0x0F), x10 = _mm512_set1_epi8(0x10);
    const __m512i grid =
        _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qk_iq4nl_values)),
                         _mm512_set1_epi8((char)0x80));
    const __m512i l0 = _mm512_loadu_si512(u), l1 = _mm512_loadu_si512(u + 64),
                  l2 = _mm512_loadu_si512(u + unit - 64);
    const __m512i hd =
        _mm512_mask_blend_epi16(0xFF00F0F0u, _mm512_permutex2var_epi16(l0, ix->hd_lo, l1),
                                _mm512_permutex2var_epi16(l1, ix->hd_hi, l2));
    const __m512i w0 = _mm512_permutex2var_epi16(l0, ix->qs_lo, l1);
    const __m512i w1 = _mm512_permutex2var_epi16(l1, ix->qs_hi, l2);
    z[0][0] = _mm512_and_si512(w0, m4);
    z[0][1] = _mm512_and_si512(_mm512_srli_epi16(w0, 4), m4);
    z[1][0] = _mm512_and_si512(w1, m4);
    z[1][1] = _mm512_and_si512(_mm512_srli_epi16(w1, 4), m4);
    if (q5) { /* qh of block j: bits 0-15 elements 0-15, 16-31 the rest */
        const __m256i h = _mm512_extracti64x4_epi64(hd, 1);
        const __m128i hl = _mm256_cvtepi32_epi16(h),
                      hh = _mm256_cvtepi32_epi16(_mm256_srli_epi32(h, 16));
        z[0][0] = _mm512_mask_add_epi8(z[0][0], _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(hl)),
                                       z[0][0], x10);
        z[1][0] = _mm512_mask_add_epi8(z[1][0], _cvtu64_mask64((uint64_t)_mm_extract_epi64(hl, 1)),
                                       z[1][0], x10);
        z[0][1] = _mm512_mask_add_epi8(z[0][1], _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(hh)),
                                       z[0][1], x10);
        z[1][1] = _mm512_mask_add_epi8(z[1][1], _cvtu64_mask64((uint64_t)_mm_extract_epi64(hh, 1)),
                                       z[1][1], x10);
    }
    if (type == Q_IQ4_NL)
        for (int h = 0; h < 2; h++)
            for (int n = 0; n < 2; n++) z[h][n] = _mm512_shuffle_epi8(grid, z[h][n]);
    *hd_out = hd;
}

/* A unit's products with 256 activation bytes at xp (xq4's order), per 128-bit lane L: the
 * sums of block L (lanes 0, 2: half each) and of block 4 + L (lanes 1, 3). */
VNNI512 static inline __attribute__((always_inline)) __m512i vt1_unit_dot(__m512i z[2][2],
                                                                          const int8_t *xp)
{
    __m512i s[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        s[h] =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), z[h][0], _mm512_loadu_si512(xp + 128 * h));
        s[h] = _mm512_dpbusd_epi32(s[h], z[h][1], _mm512_loadu_si512(xp + 128 * h + 64));
    }
    return _mm512_add_epi32(_mm512_unpacklo_epi32(s[0], s[1]), _mm512_unpackhi_epi32(s[0], s[1]));
}

/* Weight row `row` times the R activation rows from r0 of a into acc[0..R), from block b0 (a
 * multiple of 8): each block's exact integer sums (the signed grid as w + 128, its -128 x sum
 * x added in vt1_step32, as in the tiles) and then its float steps. The row is read from
 * start to end: each whole unit of 8 blocks by vt1_unit, 4 vpdpbusd a unit and row, their
 * lanes folded to the unit's 8 sums in block order. The blocks past the last whole unit one
 * at a time. */
VNNI512 static inline __attribute__((always_inline)) void
vt1_row32(const int type, const char *row, int64_t nb, const xq8 *x, const int8_t *xq4,
          const int32_t *c32, int r0, const int R, size_t pf, const vt1_idx *ix, __m128 acc[],
          int64_t b0)
{
    const int64_t k = nb * 32;
    const size_t bb = b32_bytes(type), unit = 8 * bb;
    const bool mins = type == Q_Q4_1 || type == Q_Q5_1;
    /* lane j of a block's 4 partial sums x 2 vectors to dword j (blocks 0-3), 4 + j (4-7) */
    const __m512i gather = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    for (; b0 + 8 <= nb; b0 += 8) {
        const char *u = row + (size_t)b0 * bb;
        if (pf) {
            _mm_prefetch(u + pf, _MM_HINT_T0);
            _mm_prefetch(u + pf + 64, _MM_HINT_T0);
            _mm_prefetch(u + pf + unit - 1, _MM_HINT_T0);
        }
        __m512i z[2][2], hd;
        vt1_unit(type, u, ix, z, &hd);
        const __m512 dm = _mm512_cvtph_ps(_mm512_castsi512_si256(hd));
        const __m256 a = _mm512_castps512_ps256(dm);
        const __m256 mn = vt1_mins32(type, a, mins ? _mm512_extractf32x8_ps(dm, 1) : a);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            /* lane j: blocks j, 4 + j, j, 4 + j */
            __m512i t = vt1_unit_dot(z, xq4 + (size_t)(r0 + r) * k + b0 * 32);
            t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_BADC));
            vt1_step32(type, _mm512_castsi512_si256(_mm512_permutexvar_epi32(gather, t)), a, mn, x,
                       c32, r0 + r, nb, b0, 8, &acc[r]);
        }
    }
    for (; b0 < nb; b0 += 8) { /* up to 8 blocks, one at a time */
        const int n = nb - b0 < 8 ? (int)(nb - b0) : 8;
        int32_t S[VT1_GROUP][8] = {{0}};
        float A[8] = {0}, M[8] = {0};
        for (int j = 0; j < n; j++) {
            const int64_t b = b0 + j;
            __m256i v = block_q(type, row, b, 0);
            if (type == Q_IQ4_NL) v = _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
            uint16_t h[2];
            memcpy(h, row + (size_t)b * bb, 4);
            A[j] = _cvtsh_ss(h[0]);
            if (mins) M[j] = _cvtsh_ss(h[1]);
            for (int r = 0; r < R; r++) {
                const int8_t *xp = x->q + (size_t)(r0 + r) * k + b * 32;
                const __m256i d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), v,
                                                      _mm256_loadu_si256((const __m256i *)xp));
                __m128i hs =
                    _mm_add_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1));
                hs = _mm_add_epi32(hs, _mm_shuffle_epi32(hs, _MM_SHUFFLE(1, 0, 3, 2)));
                hs = _mm_add_epi32(hs, _mm_shuffle_epi32(hs, _MM_SHUFFLE(2, 3, 0, 1)));
                S[r][j] = _mm_cvtsi128_si32(hs);
            }
        }
        const __m256 a = _mm256_loadu_ps(A);
        const __m256 mn = vt1_mins32(type, a, _mm256_loadu_ps(M));
        for (int r = 0; r < R; r++)
            vt1_step32(type, _mm256_loadu_si256((const __m256i *)S[r]), a, mn, x, c32, r0 + r, nb,
                       b0, n, &acc[r]);
    }
}

/* One product (lane 0 of v) to *yr, or beta *yr + it: vt_store's numbers for one column, with
 * scalar loads and stores (a masked zmm store of one float per row cost more than the row's
 * tail of sums); the same expression as vt_store's, so the same bits. */
VNNI512 static inline __attribute__((always_inline)) void vt1_store(float *yr, __m512 v, float beta)
{
    if (beta != 0.0f)
        v = _mm512_add_ps(
            _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_castps128_ps512(_mm_load_ss(yr))), v);
    _mm_store_ss(yr, _mm512_castps512_ps128(v));
}

/* vt1_mins32 for two weight rows side by side (vt1_pair32's lanes). */
VNNI512 static inline __attribute__((always_inline)) __m512 vt1_mins32x2(const int type, __m512 a,
                                                                         __m512 M)
{
    if (type == Q_Q4_0) return _mm512_mul_ps(a, _mm512_set1_ps(8.0f));
    if (type == Q_Q5_0) return _mm512_mul_ps(a, _mm512_set1_ps(16.0f));
    if (type == Q_Q4_1 || type == Q_Q5_1)
        return _mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(M), _mm512_set1_epi32((int)0x80000000u)));
    return a;
}

/* Weight rows `row` and `row` + rb times activation row r into acc[0] and acc[1]: vt1_row32's
 * numbers for each (the same integer sums, the same float steps in the same order: a row
 * gets the bits it gets alone or in a batch), the two rows' units taken side by side so that
 * the activations are loaded once for both, and their sums folded and their float steps taken
 * in one vector: lanes 0-3 row 0's blocks 0-3, 4-7 row 1's, 8-11 row 0's blocks 4-7, 12-15
 * row 1's, so that each half of a ymm of both rows' chains takes one row's steps (one row at
 * a time per unit: IQ4_NL and Q4_0 in the cache 1.09-1.16x slower, quant_bench --mib 1). */
VNNI512 static inline __attribute__((always_inline)) void
vt1_pair32(const int type, const char *row, size_t rb, int64_t nb, const xq8 *x, const int8_t *xq4,
           const int32_t *c32, int r, size_t pf, const vt1_idx *ix, __m128 acc[2])
{
    const int64_t k = nb * 32;
    const size_t bb = b32_bytes(type), unit = 8 * bb;
    const bool mins = type == Q_Q4_1 || type == Q_Q5_1;
    /* the two rows' blocks in the lanes above, from u = (A, B, C, D) in each 128-bit lane L:
     * row 0's blocks L and 4 + L, row 1's */
    const __m512i gather = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15);
    /* the activations' 8 per-block numbers, for each row's lanes */
    const __m512i twice = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7);
    /* the two rows' d (words 0-15) and m (16-31) in those lanes, from their hd */
    int16_t hix[32];
    for (int i = 0; i < 32; i++) {
        const int blk = (i % 4) + 4 * ((i / 8) % 2), row1 = (i / 4) % 2, m = i / 16;
        hix[i] = (int16_t)(32 * row1 + 8 * m + blk);
    }
    const __m512i hpick = _mm512_loadu_si512(hix);
    /* Q4_0, IQ4_NL: words i and 4 + i the d of block i (at byte 18 i of a row's first zmm),
     * words 8 + i and 12 + i that of block 4 + i (byte 72 + 18 i, the second zmm) */
    int16_t dix[32] = {0};
    for (int i = 0; i < 4; i++) {
        dix[i] = dix[4 + i] = (int16_t)(9 * i);
        dix[8 + i] = dix[12 + i] = (int16_t)(32 + 4 + 9 * i);
    }
    const __m512i dpick = _mm512_loadu_si512(dix);
    __m256 acc2 = _mm256_setzero_ps();
    const int8_t *xr = xq4 + (size_t)r * k;
    int64_t b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8) {
        const char *u0 = row + (size_t)b0 * bb, *u1 = u0 + rb;
        if (pf) { /* the two rows' bytes pf ahead, in memory order: as far into them as the
                   * pair is into its own */
            const char *ahead = row + pf + 2 * (size_t)b0 * bb;
            for (size_t o = 0; o < 2 * unit; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
            _mm_prefetch(ahead + 2 * unit - 1, _MM_HINT_T0);
        }
        __m512i z0[2][2], z1[2][2], hd0, hd1;
        vt1_unit(type, u0, ix, z0, &hd0);
        vt1_unit(type, u1, ix, z1, &hd1);
        /* Q4_0 and IQ4_NL (d only, in each row's first 128 bytes): both rows' d straight from
         * their loads */
        const __m512i hd =
            type == Q_Q4_0 || type == Q_IQ4_NL
                ? _mm512_mask_blend_epi16(0xF0F0u,
                                          _mm512_permutex2var_epi16(_mm512_loadu_si512(u0), dpick,
                                                                    _mm512_loadu_si512(u0 + 64)),
                                          _mm512_permutex2var_epi16(_mm512_loadu_si512(u1), dpick,
                                                                    _mm512_loadu_si512(u1 + 64)))
                : _mm512_permutex2var_epi16(hd0, hpick, hd1);
        const __m512 a = _mm512_cvtph_ps(_mm512_castsi512_si256(hd));
        const __m512 mn =
            vt1_mins32x2(type, a, mins ? _mm512_cvtph_ps(_mm512_extracti64x4_epi64(hd, 1)) : a);
        const __m512i t0 = vt1_unit_dot(z0, xr + b0 * 32), t1 = vt1_unit_dot(z1, xr + b0 * 32);
        __m512i p = _mm512_permutexvar_epi32(
            gather, _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1)));
        const size_t at = (size_t)r * nb + b0;
        if (type == Q_IQ4_NL)
            p = _mm512_add_epi32(
                p, _mm512_permutexvar_epi32(twice, _mm512_castsi256_si512(_mm256_loadu_si256(
                                                       (const __m256i *)(c32 + at)))));
        const __m512 f = _mm512_cvtepi32_ps(p),
                     t = _mm512_mul_ps(
                         a, _mm512_permutexvar_ps(
                                twice, _mm512_castps256_ps512(_mm256_loadu_ps(x->d + at))));
        const __m512 sx =
            type == Q_IQ4_NL
                ? t
                : _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_loadu_ps(x->s + at)));
        acc2 = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm512_castps512_ps256(t), acc2);
        if (type != Q_IQ4_NL)
            acc2 = _mm256_fnmadd_ps(_mm512_castps512_ps256(mn), _mm512_castps512_ps256(sx), acc2);
        acc2 = _mm256_fmadd_ps(_mm512_extractf32x8_ps(f, 1), _mm512_extractf32x8_ps(t, 1), acc2);
        if (type != Q_IQ4_NL)
            acc2 = _mm256_fnmadd_ps(_mm512_extractf32x8_ps(mn, 1), _mm512_extractf32x8_ps(sx, 1),
                                    acc2);
    }
    acc[0] = _mm256_castps256_ps128(acc2);
    acc[1] = _mm256_extractf128_ps(acc2, 1);
    if (b0 < nb) { /* the blocks past the last whole unit, each row as vt1_row32 takes them */
        vt1_row32(type, row, nb, x, xq4, c32, r, 1, 0, ix, &acc[0], b0);
        vt1_row32(type, row + rb, nb, x, xq4, c32, r, 1, 0, ix, &acc[1], b0);
    }
}

/* The R activation rows from r0 of a (a group of VT1_GROUP or the rest) times the m rows. */
VNNI512 static inline __attribute__((always_inline)) void
vt1_group(const int type, const char *w, size_t rb, int m, int64_t nb, const struct q_xq *a,
          const int8_t *xq4, const int32_t *c32, int r0, const int R, float beta, float *y,
          int ld_y, size_t pf)
{
    const vt1_idx ix = vt1_indices(type);
    int i = 0;
    if (R == 1) /* one activation row: the weight rows two at a time */
        for (; i + 2 <= m; i += 2) {
            __m128 acc[2];
            vt1_pair32(type, w + (size_t)i * rb, rb, nb, &a->xq, xq4, c32, r0, pf, &ix, acc);
            vt1_store(y + (size_t)r0 * ld_y + i, vt_fold4(acc[0]), beta);
            vt1_store(y + (size_t)r0 * ld_y + i + 1, vt_fold4(acc[1]), beta);
        }
    for (; i < m; i++) {
        __m128 acc[VT1_GROUP];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r] = _mm_setzero_ps();
        vt1_row32(type, w + (size_t)i * rb, nb, &a->xq, xq4, c32, r0, R, pf, &ix, acc, 0);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            vt1_store(y + (size_t)(r0 + r) * ld_y + i, vt_fold4(acc[r]), beta);
    }
}

VNNI512 static inline __attribute__((always_inline)) void
vt1_unpacked(const int type, const char *w, size_t rb, int m, int64_t nb, const struct q_xq *a,
             int32_t *S, float beta, float *y, int ld_y)
{
    const int rows = a->rows;
    /* IQ4_NL: the rows' -128 x sums, row after row (xt's are block after block) */
    if (type == Q_IQ4_NL)
        for (int r = 0; r < rows; r++)
            for (int64_t b = 0; b < nb; b++)
                S[(size_t)r * nb + b] = a->xt.c32[(size_t)b * a->xt.rows + r];
    /* after them, the rows' activations as vt1_row32 reads them */
    int8_t *xq4 = (int8_t *)(S + (size_t)rows * nb);
    xq4 += (64 - (uintptr_t)xq4 % 64) % 64;
    for (int r = 0; r < rows; r++)
        vt1_quads(a->xq.q + (size_t)r * nb * 32, xq4 + (size_t)r * nb * 32, nb);
    /* one row: each weight row's blocks prefetched VT1_PF_ROWS rows ahead; more: the second
     * group reads them from cache */
    const size_t pf = (size_t)VT1_PF_ROWS * rb;
    /* VT_COLS weight rows at a time, so that the second group of rows finds them in cache */
    for (int i0 = 0; i0 < m; i0 += VT_COLS) {
        const int mm = m - i0 < VT_COLS ? m - i0 : VT_COLS;
        const char *wi = w + (size_t)i0 * rb;
        float *yi = y + i0;
        int r0 = 0;
        for (; r0 + VT1_GROUP <= rows; r0 += VT1_GROUP)
            vt1_group(type, wi, rb, mm, nb, a, xq4, S, r0, VT1_GROUP, beta, yi, ld_y, pf);
        switch (rows - r0) {
        case 1: vt1_group(type, wi, rb, mm, nb, a, xq4, S, r0, 1, beta, yi, ld_y, pf); break;
        case 2: vt1_group(type, wi, rb, mm, nb, a, xq4, S, r0, 2, beta, yi, ld_y, pf); break;
        case 3: vt1_group(type, wi, rb, mm, nb, a, xq4, S, r0, 3, beta, yi, ld_y, pf); break;
        default: break;
        }
    }
}

VNNI512 void qk_vt1_unpacked(int type, const char *w, size_t rb, int m, int64_t nb,
                             const struct q_xq *a, int32_t *S, float beta, float *y, int ld_y)
{
    switch (type) {
    case Q_Q4_0: vt1_unpacked(Q_Q4_0, w, rb, m, nb, a, S, beta, y, ld_y); break;
    case Q_Q4_1: vt1_unpacked(Q_Q4_1, w, rb, m, nb, a, S, beta, y, ld_y); break;
    case Q_Q5_0: vt1_unpacked(Q_Q5_0, w, rb, m, nb, a, S, beta, y, ld_y); break;
    case Q_Q5_1: vt1_unpacked(Q_Q5_1, w, rb, m, nb, a, S, beta, y, ld_y); break;
    default: vt1_unpacked(Q_IQ4_NL, w, rb, m, nb, a, S, beta, y, ld_y); break;
    }
}

#endif /* QK_X86 */
