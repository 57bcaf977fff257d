/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_xq.c — the activation quantizer of the integer path: each row of x to
 * 8 bits per 32 elements (portable; AVX2), laid out for the kernels of the instruction set
 * in use (q_xq_prepare), once for all the weight matrices that read it; where the K types'
 * kernels read them, to Q8_K too (quant_q8k.c).
 */
#include "kernels/cpu/quant_internal.h"

static float xq8_scale(float amax, float *id)
{
    *id = amax != 0.0f ? 127.0f / amax : 0.0f;
    return qk_f16_to_f32(qk_f32_to_f16(amax / 127.0f));
}

void qk_xq8_row_portable(const float *x, int8_t *q, float *d, float *s, int64_t k)
{
    for (int64_t b = 0; b < k / 32; b++, x += 32, q += 32) {
        float amax = 0.0f, id;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        d[b] = xq8_scale(amax, &id);
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            q[j] = (int8_t)nearbyintf(x[j] * id);
            sum += q[j];
        }
        s[b] = d[b] * (float)sum;
    }
}

void qk_xq8_pairs(const int8_t *q, int8_t *qp, int64_t k)
{
    int64_t e = 0;
    for (; e + 256 <= k; e += 256)
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < 2; h++)
                for (int b = 0; b < 2; b++) /* block j, then j + 4 */
                    memcpy(qp + e + 64 * j + 32 * h + 16 * b, q + e + 32 * (j + 4 * b) + 16 * h,
                           16);
    memcpy(qp + e, q + e, (size_t)(k - e));
}

#if QK_X86

SIMD void qk_xq8_row_avx2(const float *x, int8_t *q, float *d, float *s, int64_t k)
{
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < k / 32; b++, x += 32, q += 32) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m =
            _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                          _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float id;
        d[b] = xq8_scale(_mm_cvtss_f32(h), &id);
        const __m256 vid = _mm256_set1_ps(id);
        const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, vid), rnd));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, vid), rnd));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, vid), rnd));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, vid), rnd));
        /* packs work within 128-bit lanes: the permute puts the 32 bytes back in order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, perm);
        _mm256_storeu_si256((__m256i *)q, p);
        __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        s[b] = d[b] * (float)_mm_cvtsi128_si32(s4);
    }
}

/* ---- AVX-512 VNNI layouts ----------------------------------------------------------- */

/* The rows of xq (row-major, as the kernels above take them) block-major, with the integer
 * sums Q8_0 starts from. */
VNNI512 void qk_vt_layout(const xq8 *xq, int rows, int r0, int r1, int64_t k, const vt_x *t)
{
    const int64_t nb = k / 32;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int r = r0; r < r1; r++)
        for (int64_t b = 0; b < nb; b++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(xq->q + (size_t)r * k + b * 32));
            _mm256_storeu_si256((__m256i *)(t->q + ((size_t)b * rows + r) * 32), v);
            t->d[(size_t)b * rows + r] = xq->d[(size_t)r * nb + b];
            t->s[(size_t)b * rows + r] = xq->s[(size_t)r * nb + b];
            /* byte sums of v ^ 0x80 per 8 bytes are the signed sums + 8 x 128 */
            const __m256i s8 = _mm256_sad_epu8(_mm256_xor_si256(v, flip), _mm256_setzero_si256());
            const int s0 = _mm256_extract_epi32(s8, 0) + _mm256_extract_epi32(s8, 2) - 2048;
            const int s1 = _mm256_extract_epi32(s8, 4) + _mm256_extract_epi32(s8, 6) - 2048;
            t->c32[(size_t)b * rows + r] = -128 * (s0 + s1);
        }
}

/* The Q8_K rows block-major for the K tiles (qk_kt_rows_*), with the sums they start from:
 * Q4_K's per 32 in int16 pairs, Q6_K's -32 x those per 16. */
VNNI512 void qk_kt_layout(const xq8 *xq, int rows, int r0, int r1, int64_t k, const kt_x *t)
{
    const int64_t nb = k / 32, nsb = k / QK_K;
    for (int r = r0; r < r1; r++) {
        for (int64_t b = 0; b < nb; b++)
            _mm256_storeu_si256(
                (__m256i *)(t->q + ((size_t)b * rows + r) * 32),
                _mm256_loadu_si256((const __m256i *)(xq->kq + (size_t)r * k + b * 32)));
        const int16_t *ks = xq->ks + (size_t)r * (k / 16);
        for (int64_t sb = 0; sb < nsb; sb++) {
            t->d[sb * rows + r] = xq->kd[(size_t)r * nsb + sb];
            for (int p = 0; p < 4; p++) {
                const int16_t *g = ks + sb * 16 + 4 * p;
                const uint32_t lo = (uint16_t)(g[0] + g[1]), hi = (uint16_t)(g[2] + g[3]);
                t->bs[((size_t)sb * rows + r) * 4 + p] = (int32_t)(lo | hi << 16);
            }
        }
        for (int64_t g = 0; g < k / 16; g++) t->c16[g * rows + r] = -32 * ks[g];
    }
}

#endif /* QK_X86 */

/* ---- q_xq --------------------------------------------------------------------------- */

/* Whether rows of k elements get Q8_K too: where the K types' integer path reads it (up to
 * Q_INT_MAX_ROWS rows; with AVX-512 VNNI every row count, Q4_K's and Q6_K's, with the tiles'
 * layout kt_x). */
static bool q8k_wanted(int rows, int k, int isa)
{
    return k % QK_K == 0 && (rows <= Q_INT_MAX_ROWS || isa >= Q_ISA_AVX512);
}

/* Whether rows get xq8.qp: where the AVX2 kernels of the 32-element unpacked types read it
 * (on AVX-512 too, up to Q_INT_MAX_ROWS rows). */
static bool pairs_wanted(int rows, int isa)
{
    return isa > Q_ISA_PORTABLE && rows <= Q_INT_MAX_ROWS;
}

/* The regions of a q_xq for rows x k on isa, as offsets o[] from its 64-aligned start; returns
 * the bytes it needs (with the slack to align an unaligned buffer). */
static size_t xq_plan(int rows, int k, int isa, bool q8k, bool x8, size_t o[18])
{
    const size_t nb = (size_t)k / 32, R = (size_t)rows;
    size_t off = sizeof(struct q_xq);
    memset(o, 0, 18 * sizeof *o);
    if (x8) {
        o[9] = qk_carve(&off, R * nb * 2 * 4);
        o[0] = qk_carve(&off, R * nb * 4);
        o[1] = qk_carve(&off, R * nb * 4);
        o[2] = qk_carve(&off, R * (size_t)k);
    }
    if (x8 && isa >= Q_ISA_AVX512) {
        o[3] = qk_carve(&off, R * (size_t)k);
        o[4] = qk_carve(&off, R * nb * 4);
        o[5] = qk_carve(&off, R * nb * 4);
        o[6] = qk_carve(&off, R * nb * 4);
    }
    if (q8k && q8k_wanted(rows, k, isa)) {
        o[10] = qk_carve(&off, R * (size_t)k);
        o[11] = qk_carve(&off, R * (size_t)k / QK_K * 4);
        o[12] = qk_carve(&off, R * (size_t)k / 16 * 2);
        if (isa >= Q_ISA_AVX512) o[14] = qk_carve(&off, R * (size_t)k);
        if (isa >= Q_ISA_AVX512 && rows > KT1_ROWS) {
            o[15] = qk_carve(&off, R * (size_t)k / QK_K * 4);
            o[16] = qk_carve(&off, R * (size_t)k / QK_K * 16);
            o[17] = qk_carve(&off, R * (size_t)k / 16 * 4);
        }
    }
    if (x8 && pairs_wanted(rows, isa)) o[13] = qk_carve(&off, R * (size_t)k);
    return off + 64;
}

size_t q_xq_bytes(int rows, int k)
{
    size_t o[18];
    return xq_plan(rows, k, q_isa(), true, true, o);
}

/* q_xq_plan, with the 32-element form (and its layouts) only where x8 (q_xq_plan_q8k_only);
 * a q_xq without it has xq.q NULL, which q_xq_fill and matmul_int look at. */
static q_xq *plan(void *mem, size_t bytes, int rows, int k, bool q8k, bool x8)
{
    const int isa = q_isa();
    size_t o[18];
    if (!q8k || !q8k_wanted(rows, k, isa) || rows > KT1_ROWS) x8 = true;
    if (rows < 1 || k % 32 || bytes < xq_plan(rows, k, isa, q8k, x8, o)) return NULL;
    char *buf = (char *)mem + (64 - (uintptr_t)mem % 64) % 64;
    struct q_xq *a = (struct q_xq *)buf;
    *a = (struct q_xq){.rows = rows, .k = k, .isa = isa};
    if (x8)
        a->xq = (xq8){.d = (float *)(buf + o[0]),
                      .s = (float *)(buf + o[1]),
                      .q = (int8_t *)(buf + o[2]),
                      .s16 = (float *)(buf + o[9])};
    if (x8 && pairs_wanted(rows, isa)) a->xq.qp = (int8_t *)(buf + o[13]);
    if (q8k && q8k_wanted(rows, k, isa)) {
        a->xq.kq = (int8_t *)(buf + o[10]);
        a->xq.kd = (float *)(buf + o[11]);
        a->xq.ks = (int16_t *)(buf + o[12]);
    }
#if QK_X86
    if (isa >= Q_ISA_AVX512) {
        if (x8)
            a->xt = (vt_x){.q = (int8_t *)(buf + o[3]),
                           .d = (float *)(buf + o[4]),
                           .s = (float *)(buf + o[5]),
                           .c32 = (int32_t *)(buf + o[6]),
                           .rows = rows};
        if (a->xq.kq && rows > KT1_ROWS)
            a->kt = (kt_x){.q = (int8_t *)(buf + o[14]),
                           .d = (float *)(buf + o[15]),
                           .bs = (int32_t *)(buf + o[16]),
                           .c16 = (int32_t *)(buf + o[17]),
                           .rows = rows};
        else if (a->xq.kq)
            a->kt = (kt_x){.q1 = (int8_t *)(buf + o[14]), .rows = rows};
    }
#endif
    return a;
}

q_xq *q_xq_plan(void *mem, size_t bytes, int rows, int k, bool q8k)
{
    return plan(mem, bytes, rows, k, q8k, true);
}

q_xq *q_xq_plan_q8k_only(void *mem, size_t bytes, int rows, int k)
{
    return plan(mem, bytes, rows, k, true, false);
}

void q_xq_fill(q_xq *a, const float *x, int r0, int r1)
{
    const int k = a->k, isa = a->isa;
    const size_t nb = (size_t)k / 32;
    (void)isa; /* the portable build has one path */
    void (*row_fn)(const float *, int8_t *, float *, float *, int64_t) = qk_xq8_row_portable;
#if QK_X86
    if (isa > Q_ISA_PORTABLE) row_fn = qk_xq8_row_avx2;
#endif
    const bool x8 = a->xq.q; /* without it the Q8_K form alone (q_xq_plan_q8k_only) */
    for (int r = r0; r < r1 && x8; r++)
        row_fn(x + (size_t)r * k, a->xq.q + (size_t)r * k, a->xq.d + (size_t)r * nb,
               a->xq.s + (size_t)r * nb, k);
    /* the sums per 16 (the unpacked types' offsets), the same on every instruction set */
    for (size_t g = (size_t)r0 * nb * 2; g < (size_t)r1 * nb * 2 && x8; g++) {
        const int8_t *q = a->xq.q + 16 * g;
        int sum = 0;
        for (int l = 0; l < 16; l++) sum += q[l];
        a->xq.s16[g] = a->xq.d[g / 2] * (float)sum;
    }
    if (a->xq.qp)
        for (int r = r0; r < r1; r++)
            qk_xq8_pairs(a->xq.q + (size_t)r * k, a->xq.qp + (size_t)r * k, k);
    if (a->xq.kq) {
        void (*k_fn)(const float *, int8_t *, float *, int16_t *, int64_t) = qk_q8k_row_portable;
#if QK_X86
        if (isa > Q_ISA_PORTABLE) k_fn = qk_q8k_row_avx2;
#endif
        for (int r = r0; r < r1; r++)
            k_fn(x + (size_t)r * k, a->xq.kq + (size_t)r * k, a->xq.kd + (size_t)r * (k / QK_K),
                 a->xq.ks + (size_t)r * (k / 16), k);
    }
#if QK_X86
    if (isa >= Q_ISA_AVX512) {
        const int rows = a->rows;
        if (x8) qk_vt_layout(&a->xq, rows, r0, r1, k, &a->xt);
        if (a->xq.kq && rows > KT1_ROWS) {
            qk_kt_layout(&a->xq, rows, r0, r1, k, &a->kt);
        } else if (a->xq.kq) { /* blocks 0 2 1 3 of each 4 (qk_kt1_q4_k) */
            static const int order[4] = {0, 2, 1, 3};
            for (int64_t e = (int64_t)r0 * k; e < (int64_t)r1 * k; e += 128)
                for (int j = 0; j < 4; j++)
                    memcpy(a->kt.q1 + e + 32 * j, a->xq.kq + e + 32 * order[j], 32);
        }
    }
#endif
}

const q_xq *q_xq_prepare(void *mem, size_t bytes, const float *x, int rows, int k)
{
    q_xq *a = q_xq_plan(mem, bytes, rows, k, true);
    if (a) q_xq_fill(a, x, 0, rows);
    return a;
}
