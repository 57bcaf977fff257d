/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/attention_bf16.c — prompt rows' attention with its second product in AVX-512
 * BF16: a block of query vectors of one KV head against its sequence's keys in steps, the
 * online softmax between the two products (flash attention, as attend_block in attention.c):
 *
 *   for each step of AB_KB keys:  S = (Q / scale) · Kᵀ  in float32 (soft-capped, masked)
 *                                 m' = max(m, rowmax S);  P = exp(S - m')
 *                                 l = l·e^(m-m') + rowsum P;  O = O·e^(m-m') + bf16(P) · bf16(V)
 *   out = O / l
 *
 * The scores stay float32: rounding Q and K to bf16 put the real stories260K's prompt-row
 * logits 0.022 from exact (over the 2e-2 bound); Q as two bf16 parts (hi + lo) cost as much
 * as float32 FMAs. P·V is vdpbf16ps, half the float32 FMAs: P (in [0, 1]) and V rounded to
 * bf16, each output off by at most 2^-8 of Σ p|v| relative.
 *
 * A block of 32 query vectors (a tile's rows times the group's query heads) keeps everything
 * transposed, one query vector per lane: Sᵀ [key][lane] by FMAs of broadcast K elements, the
 * running max, sums and rescaling lane-wise, P in pairs of keys [key pair][lane] and the
 * step's V as [key pair][head element] (the two keys' elements interleaved, rounded once per
 * block and step). A block of at most AB_NARROW (attend_narrow) vectorizes over keys and
 * head elements instead, so that its cost follows its rows.
 *
 * What a row's result depends on: its query, its visible keys and values, its position.
 * Steps start at multiples of AB_KB from position 0, whatever rows share the block, so a
 * lane's steps are the same alone or beside others; a key a lane does not see adds exactly
 * zero to its sums (P masked to 0, the running max unchanged, e^0 = 1 exactly below), and
 * padding keys past the block's last are zero rows; both block shapes do each lane's
 * arithmetic in the same order. So a prompt row gets the same bits in any batch and any
 * chunking of its prompt, as eng_batch.prompt_len promises (test_kernels_attention).
 *
 * Only prompt rows come here (cpu.attn_bf16: not eng_options.prompt_exact, nor
 * RINGLM_PREFILL_GEMM=own or =blas, on a CPU with AVX-512 BF16); their logits stay within
 * the prompt-row tolerance of docs/models.md.
 */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

#define AB_QB     32 /* query vectors of a block: two zmm of lanes */
#define AB_KB     64 /* keys a step; steps start at multiples of it */
#define AB_KR     8  /* keys (Q·Kᵀ) or head elements (P·V) a pass: 16 accumulators */
#define AB_NARROW 8  /* blocks of at most this many query vectors: attend_narrow */

/* a head's elements as the scratch rows hold them: a multiple of 32 */
static int head_pad(int hs)
{
    return (hs + 31) & ~31;
}

size_t cpu_attention_bf16_scratch(int head_size)
{
    const size_t hp = (size_t)head_pad(head_size);
    /* Qᵀ, a zero row, V pairs, S/P, P pairs, Oᵀ (in floats), and a cache line for alignment;
     * or attend_narrow's Kᵀ, V pairs, queries, outputs, zero row, scores and P pairs */
    const size_t block =
        hp * AB_QB + hp + AB_KB / 2 * hp + AB_KB * AB_QB + AB_KB / 2 * AB_QB + hp * AB_QB + 16;
    const size_t narrow =
        hp * AB_KB + AB_KB / 2 * hp + 2 * AB_NARROW * hp + hp + AB_KB + AB_KB / 2 + 16;
    return block > narrow ? block : narrow;
}

int cpu_attention_bf16_lanes(void)
{
    return AB_QB;
}

/*
 * x[0..16) = exp(x), the Cephes single-precision polynomial (as exp8 in cpu.h) with the
 * power of two by vscalefps; arguments clamped to [-87.3, 88.3]. exp(0) is exactly 1, so a
 * lane whose running max does not move keeps its sums to the bit.
 */
static inline BF16 __attribute__((always_inline)) __m512 exp16(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y =
        _mm512_fmadd_ps(x, _mm512_set1_ps(1.9875691500e-4f), _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(x, x), x), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

/* 16 pairs (a[j], b[j]) as bf16 in 32-bit lanes: vcvtne2ps2bf16 puts a in the low half and b
 * in the high one, the permutation interleaves them. */
static inline BF16 __attribute__((always_inline)) __m512i pair16(__m512 a, __m512 b)
{
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/*
 * AB_KR rows of Oᵀ (head elements d .. d + AB_KR - 1 at t, AB_QB lanes each, two zmm):
 *
 *   row r = row r · alpha + Σ_{j<n} P[j] · V(j, d + r)
 *
 * P[j] the step's key pair j for every lane (pairs of bf16 in 32-bit lanes, [pair][lane]),
 * V(j, d + r) = w[r + j·w_col] the same two keys' values of element d + r, broadcast; alpha
 * e^(m-m') of lanes 0-15 and 16-31.
 */
static inline BF16 __attribute__((always_inline)) void pair_tile(float *t, const uint32_t *lanes,
                                                                 int n, const uint32_t *w,
                                                                 size_t w_col, const __m512 *alpha)
{
    __m512 acc[2 * AB_KR];
#pragma GCC unroll 8
    for (int r = 0; r < AB_KR; r++) {
        acc[2 * r] = _mm512_mul_ps(_mm512_load_ps(t + r * AB_QB), alpha[0]);
        acc[2 * r + 1] = _mm512_mul_ps(_mm512_load_ps(t + r * AB_QB + 16), alpha[1]);
    }
    for (int j = 0; j < n; j++, lanes += AB_QB, w += w_col) {
        const __m512bh x = (__m512bh)_mm512_load_si512((const __m512i *)lanes);
        const __m512bh y = (__m512bh)_mm512_load_si512((const __m512i *)(lanes + 16));
#pragma GCC unroll 8
        for (int r = 0; r < AB_KR; r++) {
            const __m512bh b = (__m512bh)_mm512_set1_epi32((int)w[r]);
            acc[2 * r] = _mm512_dpbf16_ps(acc[2 * r], x, b);
            acc[2 * r + 1] = _mm512_dpbf16_ps(acc[2 * r + 1], y, b);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < AB_KR; r++) {
        _mm512_store_ps(t + r * AB_QB, acc[2 * r]);
        _mm512_store_ps(t + r * AB_QB + 16, acc[2 * r + 1]);
    }
}

/* Sᵀ = K·Qᵀ in float32 (the scores exact, as attend_block's): AB_KR keys a pass, rows of K
 * at k[r] (each element broadcast), Qᵀ [head element][AB_QB lanes]. */
static inline BF16 __attribute__((always_inline)) void score_tile(float *t, const float *qt, int n,
                                                                  const float *const *k)
{
    __m512 acc[2 * AB_KR];
#pragma GCC unroll 16
    for (int r = 0; r < 2 * AB_KR; r++) acc[r] = _mm512_setzero_ps();
    for (int j = 0; j < n; j++, qt += AB_QB) {
        const __m512 x = _mm512_load_ps(qt), y = _mm512_load_ps(qt + 16);
#pragma GCC unroll 8
        for (int r = 0; r < AB_KR; r++) {
            const __m512 b = _mm512_set1_ps(k[r][j]);
            acc[2 * r] = _mm512_fmadd_ps(x, b, acc[2 * r]);
            acc[2 * r + 1] = _mm512_fmadd_ps(y, b, acc[2 * r + 1]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < AB_KR; r++) {
        _mm512_store_ps(t + r * AB_QB, acc[2 * r]);
        _mm512_store_ps(t + r * AB_QB + 16, acc[2 * r + 1]);
    }
}

/* vp[i / 2][d] = (bf16(v[i][d]), bf16(v[i + 1][d])) for even i < nk, d < hs: the step's V in
 * pairs of keys, the rows at v[i] */
static inline BF16 __attribute__((always_inline)) void
pair_rows(uint32_t *vp, const float *const *v, int nk, int hs, int hp)
{
    for (int i = 0; i < nk; i += 2) {
        uint32_t *out = vp + (size_t)(i / 2) * hp;
        int d = 0;
        for (; d + 16 <= hs; d += 16)
            _mm512_storeu_si512((__m512i *)(out + d),
                                pair16(_mm512_loadu_ps(v[i] + d), _mm512_loadu_ps(v[i + 1] + d)));
        if (d < hs) {
            const __mmask16 k = (__mmask16)((1u << (hs - d)) - 1);
            _mm512_storeu_si512(
                (__m512i *)(out + d),
                pair16(_mm512_maskz_loadu_ps(k, v[i] + d), _mm512_maskz_loadu_ps(k, v[i + 1] + d)));
        }
    }
}

/* rows[0][i], rows[1][i]: where K and V of position t + i (i < AB_KB) of KV head kvh lie,
 * or the zero row outside t_lo .. t_hi; with prefetch, their cache lines fetched. Blocks
 * followed by counters, not a division a row. */
static inline BF16 __attribute__((always_inline)) void
step_rows(const cpu *c, const int32_t *table, int kvh, int t, int t_lo, int t_hi, const float *zero,
          const float *(*rows)[AB_KB], bool prefetch)
{
    const int bs = c->block_size, hs = c->head_size, kv_dim = c->kv_dim;
    const int p0 = t > t_lo ? t : t_lo, p1 = t + AB_KB - 1 < t_hi ? t + AB_KB - 1 : t_hi;
    for (int i = 0; i < AB_KB; i++) rows[0][i] = rows[1][i] = zero;
    int bi = p0 / bs, off = p0 % bs;
    const float *k = NULL, *v = NULL;
    for (int p = p0; p <= p1; p++) {
        if (!k || off == 0) {
            k = kv_at(c, table[bi], c->layer, 0, 0) + (size_t)kvh * hs;
            v = kv_at(c, table[bi], c->layer, 1, 0) + (size_t)kvh * hs;
        }
        const float *kr = k + (size_t)off * kv_dim, *vr = v + (size_t)off * kv_dim;
        rows[0][p - t] = kr;
        rows[1][p - t] = vr;
        if (prefetch)
            for (int x = 0; x < hs; x += 16) {
                _mm_prefetch((const char *)(kr + x), _MM_HINT_T1);
                _mm_prefetch((const char *)(vr + x), _MM_HINT_T1);
            }
        if (++off == bs) off = 0, bi++;
    }
}

/* out[j * stride + i] = rows[i][d0 + j] for i < 16, j < min(16, n): 16 rows' 16 elements
 * transposed in registers (zeros read past n) */
static inline BF16 __attribute__((always_inline)) void transpose16(const float *const *rows, int d0,
                                                                   int n, float *out, size_t stride)
{
    const __mmask16 k = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
    __m512 r[16], t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = _mm512_maskz_loadu_ps(k, rows[i] + d0);
        /* per 128-bit lane q: t[2i] = rows 2i, 2i+1 at 4q, 4q+1; t[2i+1] at 4q+2, 4q+3 */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* r[4i + j], lane q: rows 4i .. 4i + 3 at element 4q + j */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    /* lanes regrouped: then t[j] and t[j + 8] hold elements j and 8 + j, t[j + 4] and
     * t[j + 12] elements 4 + j and 12 + j, of rows 0-7 and 8-15 */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
        t[j + 4] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
        t[j + 8] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
        t[j + 12] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD);
        r[j + 4] = _mm512_shuffle_f32x4(t[j + 4], t[j + 12], 0x88);
        r[j + 12] = _mm512_shuffle_f32x4(t[j + 4], t[j + 12], 0xDD);
    }
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++)
        if (j < n) _mm512_store_ps(out + (size_t)j * stride, r[j]);
}

/*
 * A block of at most AB_NARROW query vectors (a chunk's last rows, a prefix hit's remainder,
 * a decode-sized prompt): the products vectorized over keys and head elements instead of
 * lanes, so that its cost follows its rows, with every lane's arithmetic that of
 * cpu_attend_block_bf16's: each score the same float32 FMA chain over the head (Kᵀ gathered
 * per step), each weight the same exp16, the row sum the same sequence of adds, each output
 * the same vdpbf16ps chain over the key pairs (the pair's products commute). So a row gets
 * the same bits here as in a block of 32 (test_kernels_attention).
 */
static BF16 void attend_narrow(const cpu *c, const struct tile *tl, int kvh, int qi0, int nq,
                               float *scratch)
{
    const eng_batch *b = c->b;
    const int hs = c->head_size, hp = head_pad(hs), group = c->group, dim = c->q_dim;
    const int32_t *table = kv_table(c, tl->seq);
    const float cap = c->hp.attn_softcap;
    /* scratch: Kᵀ [hp][KB], V pairs [KB/2][hp], queries [NARROW][hp], outputs [NARROW][hp],
     * a zero row [hp], one lane's scores [KB] and P pairs [KB/2] */
    float *kt = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    uint32_t *vp = (uint32_t *)(kt + (size_t)hp * AB_KB);
    float *qs = (float *)(vp + (size_t)AB_KB / 2 * hp);
    float *o = qs + (size_t)AB_NARROW * hp;
    float *zero = o + (size_t)AB_NARROW * hp;
    float *sc = zero + hp;
    uint32_t *pp = (uint32_t *)(sc + AB_KB);
    int lo[AB_NARROW], hi[AB_NARROW];
    float m[AB_NARROW], lsum[AB_NARROW];
    size_t at[AB_NARROW];
    int t_lo = INT32_MAX, t_hi = -1;
    const float inv_scale = 1.0f / c->att_div;
    for (int l = 0; l < nq; l++) {
        const int qi = qi0 + l, row = tl->row0 + qi / group, h = kvh * group + qi % group;
        const int pos = b->positions[row];
        at[l] = (size_t)row * dim + (size_t)h * hs;
        for (int j = 0; j < hs; j++) qs[(size_t)l * hp + j] = c->q[at[l] + j] * inv_scale;
        lo[l] = c->window && pos + 1 > c->window ? pos + 1 - c->window : 0;
        hi[l] = pos;
        m[l] = -INFINITY;
        lsum[l] = 0.0f;
        if (lo[l] < t_lo) t_lo = lo[l];
        if (pos > t_hi) t_hi = pos;
    }
    memset(o, 0, (size_t)nq * hp * sizeof *o);
    memset(zero, 0, (size_t)hp * sizeof *zero);
    const float *rows_a[2][AB_KB], *rows_b[2][AB_KB];
    const float *(*cur)[AB_KB] = rows_a, *(*next)[AB_KB] = rows_b;
    const int t0 = t_lo / AB_KB * AB_KB;
    step_rows(c, table, kvh, t0, t_lo, t_hi, zero, cur, false);
    for (int t = t0; t <= t_hi; t += AB_KB) {
        const int last = t_hi - t + 1 < AB_KB ? t_hi - t + 1 : AB_KB;
        const int nk = (last + AB_KR - 1) / AB_KR * AB_KR, nk16 = (nk + 15) & ~15;
        const float *const *kp = cur[0], *const *vr = cur[1];
        if (t + AB_KB <= t_hi) step_rows(c, table, kvh, t + AB_KB, t_lo, t_hi, zero, next, true);
        pair_rows(vp, vr, nk, hs, hp);
        /* Kᵀ, 16 keys by 16 head elements a transposition in registers */
        for (int g = 0; g < nk16; g += 16)
            for (int d = 0; d < hs; d += 16)
                transpose16(kp + g, d, hs - d, kt + (size_t)d * AB_KB + g, AB_KB);
        for (int l = 0; l < nq; l++) {
            /* scores of the step's keys, 16 a vector */
            const float *q = qs + (size_t)l * hp;
            __m512 acc[AB_KB / 16];
            const int ng = nk16 / 16;
            for (int g = 0; g < ng; g++) acc[g] = _mm512_setzero_ps();
            for (int d = 0; d < hs; d++) {
                const __m512 qv = _mm512_set1_ps(q[d]);
                const float *kr = kt + (size_t)d * AB_KB;
                for (int g = 0; g < ng; g++)
                    acc[g] = _mm512_fmadd_ps(qv, _mm512_load_ps(kr + 16 * g), acc[g]);
            }
            for (int g = 0; g < ng; g++) _mm512_store_ps(sc + 16 * g, acc[g]);
            if (cap > 0.0f)
                for (int i = 0; i < nk; i++) sc[i] = cap * tanhf(sc[i] / cap);
            float n = m[l];
            for (int i = 0; i < nk; i++) {
                const int p = t + i;
                if (p < lo[l] || p > hi[l]) sc[i] = -INFINITY;
                n = sc[i] > n ? sc[i] : n;
            }
            const float u = n > -INFINITY ? n : 0.0f;
            const float al = _mm512_cvtss_f32(exp16(_mm512_set1_ps(m[l] - u)));
            const __m512i lov = _mm512_set1_epi32(lo[l]), hiv = _mm512_set1_epi32(hi[l]);
            for (int g = 0; g < ng; g++) {
                const __m512i p = _mm512_add_epi32(
                    _mm512_set1_epi32(t + 16 * g),
                    _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
                const __mmask16 in =
                    _mm512_cmpge_epi32_mask(p, lov) & _mm512_cmple_epi32_mask(p, hiv);
                _mm512_store_ps(
                    sc + 16 * g,
                    _mm512_maskz_mov_ps(
                        in, exp16(_mm512_sub_ps(_mm512_load_ps(sc + 16 * g), _mm512_set1_ps(u)))));
            }
            float ps = 0.0f;
            for (int i = 0; i < nk; i++) ps += sc[i];
            lsum[l] = fmaf(lsum[l], al, ps);
            m[l] = n;
            /* P in pairs of keys, as bf16: consecutive keys are already adjacent */
            for (int g = 0; g < ng; g += 2)
                _mm512_store_si512(
                    (__m512i *)(pp + 8 * g),
                    (__m512i)_mm512_cvtne2ps_pbh(g + 1 < ng ? _mm512_load_ps(sc + 16 * g + 16)
                                                            : _mm512_setzero_ps(),
                                                 _mm512_load_ps(sc + 16 * g)));
            /* O = O·e^(m-m') + Σ V·P, the head 16 elements a vector */
            float *ol = o + (size_t)l * hp;
            const __m512 alv = _mm512_set1_ps(al);
            __m512 ov[512 / 16];
            const int nd = (hs + 15) / 16;
            for (int d = 0; d < nd; d++) ov[d] = _mm512_mul_ps(_mm512_load_ps(ol + 16 * d), alv);
            for (int kq = 0; kq < nk / 2; kq++) {
                const __m512bh pv = (__m512bh)_mm512_set1_epi32((int)pp[kq]);
                const uint32_t *vrow = vp + (size_t)kq * hp;
                for (int d = 0; d < nd; d++)
                    ov[d] = _mm512_dpbf16_ps(
                        ov[d], (__m512bh)_mm512_loadu_si512((const __m512i *)(vrow + 16 * d)), pv);
            }
            for (int d = 0; d < nd; d++) _mm512_store_ps(ol + 16 * d, ov[d]);
        }
        const float *(*swap)[AB_KB] = cur;
        cur = next;
        next = swap;
    }
    for (int l = 0; l < nq; l++) {
        const float inv = 1.0f / lsum[l];
        for (int j = 0; j < hs; j++) c->att[at[l] + j] = o[(size_t)l * hp + j] * inv;
    }
}

BF16 void cpu_attend_block_bf16(const cpu *c, const struct tile *tl, int kvh, int qi0,
                                float *scratch)
{
    const eng_batch *b = c->b;
    const int hs = c->head_size, hp = head_pad(hs), group = c->group;
    const int dim = c->q_dim;
    const int nq_tile = (tl->row1 - tl->row0) * group;
    const int nq = nq_tile - qi0 < AB_QB ? nq_tile - qi0 : AB_QB;
    if (nq <= AB_NARROW) {
        attend_narrow(c, tl, kvh, qi0, nq, scratch);
        return;
    }
    const int32_t *table = kv_table(c, tl->seq);
    const float cap = c->hp.attn_softcap;
    /* scratch, from its first cache line: Qᵀ [hp][QB], a zero row [hp], V pairs [KB/2][hp],
     * S/P [KB][QB], P pairs [KB/2][QB], Oᵀ [hp][QB] */
    float *qt = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *zero = qt + (size_t)hp * AB_QB;
    uint32_t *vp = (uint32_t *)(zero + hp);
    float *st = (float *)(vp + (size_t)AB_KB / 2 * hp);
    uint32_t *pp = (uint32_t *)(st + (size_t)AB_KB * AB_QB);
    float *ot = (float *)(pp + (size_t)AB_KB / 2 * AB_QB);
    /* lane l sees keys lo[l] .. hi[l]; padding lanes (past the tile) see every key, with a
     * zero query, and their output is dropped */
    int lo[AB_QB] __attribute__((aligned(64))), hi[AB_QB] __attribute__((aligned(64)));
    int t_lo = INT32_MAX, t_hi = -1, max_lo = 0, min_hi = INT32_MAX;
    /* lane l's query and output: c->q and c->att + base + at[l] (floats) */
    int at[AB_QB] __attribute__((aligned(64)));
    const size_t base = (size_t)tl->row0 * dim + (size_t)kvh * group * hs;
    for (int l = 0; l < AB_QB; l++) {
        if (l >= nq) {
            at[l] = 0;
            lo[l] = 0;
            hi[l] = INT32_MAX;
            continue;
        }
        const int qi = qi0 + l, row = tl->row0 + qi / group, h = kvh * group + qi % group;
        const int pos = b->positions[row];
        at[l] = (int)((size_t)(row - tl->row0) * dim + (size_t)(h - kvh * group) * hs);
        lo[l] = c->window && pos + 1 > c->window ? pos + 1 - c->window : 0;
        hi[l] = pos;
        if (lo[l] < t_lo) t_lo = lo[l];
        if (lo[l] > max_lo) max_lo = lo[l];
        if (pos > t_hi) t_hi = pos;
        if (pos < min_hi) min_hi = pos;
    }
    memset(zero, 0, (size_t)hp * sizeof *zero);
    /* Qᵀ (divided by the scale) by gathers: a lane's 64 floats are a run of the row, and the
     * 32 runs come from rows dim floats apart — scalar copies of them stalled on the loads */
    const __m512i at0 = _mm512_load_si512((const __m512i *)at);
    const __m512i at1 = _mm512_load_si512((const __m512i *)(at + 16));
    const __mmask16 in0 = nq >= 16 ? 0xffff : (__mmask16)((1u << nq) - 1);
    const __mmask16 in1 = nq >= 32 ? 0xffff : nq <= 16 ? 0 : (__mmask16)((1u << (nq - 16)) - 1);
    const __m512 inv_scale = _mm512_set1_ps(1.0f / c->att_div);
    const float *qb = c->q + base;
    for (int j = 0; j < hs; j++) {
        const __m512 z = _mm512_setzero_ps();
        _mm512_store_ps(qt + (size_t)j * AB_QB,
                        _mm512_mul_ps(_mm512_mask_i32gather_ps(z, in0, at0, qb + j, 4), inv_scale));
        _mm512_store_ps(qt + (size_t)j * AB_QB + 16,
                        _mm512_mul_ps(_mm512_mask_i32gather_ps(z, in1, at1, qb + j, 4), inv_scale));
    }
    const __m512i lo0 = _mm512_load_si512((const __m512i *)lo);
    const __m512i lo1 = _mm512_load_si512((const __m512i *)(lo + 16));
    const __m512i hi0 = _mm512_load_si512((const __m512i *)hi);
    const __m512i hi1 = _mm512_load_si512((const __m512i *)(hi + 16));
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m0 = ninf, m1 = ninf, l0 = _mm512_setzero_ps(), l1 = _mm512_setzero_ps();
    memset(ot, 0, (size_t)hp * AB_QB * sizeof *ot);
    /* the step's K and V rows, and the next step's (on their way to the caches while this
     * step computes: a block's rows lie kv_dim floats apart, runs too short for the
     * prefetchers) */
    const float *rows_a[2][AB_KB], *rows_b[2][AB_KB];
    const float *(*cur)[AB_KB] = rows_a, *(*next)[AB_KB] = rows_b;
    const int t0 = t_lo / AB_KB * AB_KB;
    step_rows(c, table, kvh, t0, t_lo, t_hi, zero, cur, false);
    for (int t = t0; t <= t_hi; t += AB_KB) {
        /* the step's keys t .. t + nk - 1, nk a multiple of AB_KR; those no lane sees (before
         * the block's first, after its last) are zero rows, never read (a windowed layer's
         * blocks behind every window may be gone) */
        const int last = t_hi - t + 1 < AB_KB ? t_hi - t + 1 : AB_KB;
        const int nk = (last + AB_KR - 1) / AB_KR * AB_KR;
        const float *const *kp = cur[0], *const *vr = cur[1];
        if (t + AB_KB <= t_hi) step_rows(c, table, kvh, t + AB_KB, t_lo, t_hi, zero, next, true);
        pair_rows(vp, vr, nk, hs, hp);
        /* Sᵀ = K·Qᵀ (Q already divided by the scale), AB_KR keys a pass */
        for (int i = 0; i < nk; i += AB_KR) score_tile(st + (size_t)i * AB_QB, qt, hs, kp + i);
        if (cap > 0.0f)
            for (int x = 0; x < nk * AB_QB; x++) st[x] = cap * tanhf(st[x] / cap);
        /* mask (unless every lane sees the whole step) and the new running max */
        const int whole = t >= max_lo && t + nk - 1 <= min_hi;
        __m512 n0 = m0, n1 = m1;
        for (int i = 0; i < nk; i++) {
            float *s = st + (size_t)i * AB_QB;
            __m512 s0 = _mm512_load_ps(s), s1 = _mm512_load_ps(s + 16);
            if (!whole) {
                const __m512i p = _mm512_set1_epi32(t + i);
                const __mmask16 in0 =
                    _mm512_cmpge_epi32_mask(p, lo0) & _mm512_cmple_epi32_mask(p, hi0);
                const __mmask16 in1 =
                    _mm512_cmpge_epi32_mask(p, lo1) & _mm512_cmple_epi32_mask(p, hi1);
                s0 = _mm512_mask_mov_ps(ninf, in0, s0);
                s1 = _mm512_mask_mov_ps(ninf, in1, s1);
                _mm512_store_ps(s, s0);
                _mm512_store_ps(s + 16, s1);
            }
            n0 = _mm512_max_ps(n0, s0);
            n1 = _mm512_max_ps(n1, s1);
        }
        /* lanes that have seen no key yet keep -inf and shift by 0 (their P is masked) */
        const __m512 u0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(n0, ninf, _CMP_GT_OQ), n0);
        const __m512 u1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(n1, ninf, _CMP_GT_OQ), n1);
        const __m512 al[2] = {exp16(_mm512_sub_ps(m0, u0)), exp16(_mm512_sub_ps(m1, u1))};
        __m512 ps0 = _mm512_setzero_ps(), ps1 = _mm512_setzero_ps();
        for (int i = 0; i < nk; i += 2) {
            float *s = st + (size_t)i * AB_QB;
            __m512 a0 = exp16(_mm512_sub_ps(_mm512_load_ps(s), u0));
            __m512 a1 = exp16(_mm512_sub_ps(_mm512_load_ps(s + 16), u1));
            __m512 b0 = exp16(_mm512_sub_ps(_mm512_load_ps(s + AB_QB), u0));
            __m512 b1 = exp16(_mm512_sub_ps(_mm512_load_ps(s + AB_QB + 16), u1));
            if (!whole) {
                const __m512i p = _mm512_set1_epi32(t + i), q = _mm512_set1_epi32(t + i + 1);
                a0 = _mm512_maskz_mov_ps(
                    _mm512_cmpge_epi32_mask(p, lo0) & _mm512_cmple_epi32_mask(p, hi0), a0);
                a1 = _mm512_maskz_mov_ps(
                    _mm512_cmpge_epi32_mask(p, lo1) & _mm512_cmple_epi32_mask(p, hi1), a1);
                b0 = _mm512_maskz_mov_ps(
                    _mm512_cmpge_epi32_mask(q, lo0) & _mm512_cmple_epi32_mask(q, hi0), b0);
                b1 = _mm512_maskz_mov_ps(
                    _mm512_cmpge_epi32_mask(q, lo1) & _mm512_cmple_epi32_mask(q, hi1), b1);
            }
            ps0 = _mm512_add_ps(_mm512_add_ps(ps0, a0), b0);
            ps1 = _mm512_add_ps(_mm512_add_ps(ps1, a1), b1);
            uint32_t *pr = pp + (size_t)(i / 2) * AB_QB;
            _mm512_store_si512((__m512i *)pr, pair16(a0, b0));
            _mm512_store_si512((__m512i *)(pr + 16), pair16(a1, b1));
        }
        l0 = _mm512_fmadd_ps(l0, al[0], ps0);
        l1 = _mm512_fmadd_ps(l1, al[1], ps1);
        m0 = n0;
        m1 = n1;
        /* Oᵀ = Oᵀ·e^(m-m') + V·Pᵀ, AB_KR elements of the head a pass */
        for (int d = 0; d < hs; d += AB_KR)
            pair_tile(ot + (size_t)d * AB_QB, pp, nk / 2, vp + d, (size_t)hp, al);
        const float *(*swap)[AB_KB] = cur;
        cur = next;
        next = swap;
    }
    float inv[AB_QB] __attribute__((aligned(64)));
    _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), l0));
    _mm512_store_ps(inv + 16, _mm512_div_ps(_mm512_set1_ps(1.0f), l1));
    /* out = Oᵀ / l, a lane's column of Oᵀ gathered 16 elements at a time */
    const __m512i col =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(AB_QB));
    for (int l = 0; l < nq; l++) {
        float *out = c->att + base + at[l];
        const __m512 il = _mm512_set1_ps(inv[l]);
        int j = 0;
        for (; j + 16 <= hs; j += 16)
            _mm512_storeu_ps(
                out + j,
                _mm512_mul_ps(_mm512_i32gather_ps(col, ot + (size_t)j * AB_QB + l, 4), il));
        if (j < hs) {
            const __mmask16 k = (__mmask16)((1u << (hs - j)) - 1);
            _mm512_mask_storeu_ps(
                out + j, k,
                _mm512_mul_ps(_mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, col,
                                                       ot + (size_t)j * AB_QB + l, 4),
                              il));
        }
    }
}

#else /* not x86-64: gemm_bf16_supported() is false, cpu.attn_bf16 never set */

size_t cpu_attention_bf16_scratch(int head_size)
{
    (void)head_size;
    return 0;
}

int cpu_attention_bf16_lanes(void)
{
    return 1;
}

void cpu_attend_block_bf16(const cpu *c, const struct tile *tl, int kvh, int qi0, float *scratch)
{
    (void)c, (void)tl, (void)kvh, (void)qi0, (void)scratch;
}

#endif
