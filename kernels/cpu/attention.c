/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/attention.c — the CPU backend's paged attention: each row's query heads over
 * positions 0..pos of its sequence, K and V read block by block through the sequence's
 * block table. A decode row goes through attend_row; the prefill rows of one sequence, in
 * tiles of up to TILE_ROWS, through attend_block: blocked products with an online softmax.
 */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- paged attention ---------------------------------------------------------------- */

/*
 * One query head over positions 0..n_pos-1 of a sequence, K/V read block by block through
 * its block table: scores = q·k / sqrt(head_size), softmax (max subtracted), out = Σ a·v.
 * The dot products and the weighted sum use 8-float vectors (GCC vector extensions);
 * target_clones builds AVX-512 and AVX2 copies picked at load time, since the build itself
 * targets baseline x86-64.
 */

/* HADD: [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, a6+a7, b4+b5, b6+b7] (as _mm256_hadd_ps).
 * HADD_TREE8: lane m = the sum of all lanes of am. Macros, not functions: a vector passed
 * to or returned from a function outside the AVX clones would change the ABI. */
#define HADD(a, b)                                                                                 \
    (__builtin_shuffle((a), (b), (v8i){0, 2, 8, 10, 4, 6, 12, 14}) +                               \
     __builtin_shuffle((a), (b), (v8i){1, 3, 9, 11, 5, 7, 13, 15}))
#define HADD_TREE8(out, a0, a1, a2, a3, a4, a5, a6, a7)                                            \
    do {                                                                                           \
        v8f lo_ = HADD(HADD(a0, a1), HADD(a2, a3)); /* [0,1,2,3 | 0,1,2,3] halves */               \
        v8f hi_ = HADD(HADD(a4, a5), HADD(a6, a7));                                                \
        out = __builtin_shuffle(lo_, hi_, (v8i){0, 1, 2, 3, 8, 9, 10, 11}) +                       \
              __builtin_shuffle(lo_, hi_, (v8i){4, 5, 6, 7, 12, 13, 14, 15});                      \
    } while (0)

/* s[t] = exp(s[t] - max) for t < n; returns Σ s[t] (max >= every s[t]). */
static inline __attribute__((always_inline)) float exp_shifted_sum(float *s, int n, float max)
{
    v8f vsum = {0};
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        *(v8f *)(s + t) -= max;
        exp8(s + t);
        vsum += *(const v8f *)(s + t);
    }
    float sum =
        ((vsum[0] + vsum[1]) + (vsum[2] + vsum[3])) + ((vsum[4] + vsum[5]) + (vsum[6] + vsum[7]));
    for (; t < n; t++) {
        s[t] = expf(s[t] - max);
        sum += s[t];
    }
    return sum;
}

/*
 * out[0..hs) += Σ_{i<n} (p[i] * mul) · v_i, v_i = v + i * stride. Output lanes stay in
 * registers across positions; two positions at a time into separate accumulators, so the
 * FMAs are not one long dependency chain. Inlined into each attention clone.
 */
static inline __attribute__((always_inline)) void
weighted_sum(float *out, const float *v, size_t stride, const float *p, float mul, int n, int hs)
{
    int j = 0;
    for (; j + 16 <= hs; j += 16) {
        v8f a0 = *(v8f *)(out + j), a1 = *(v8f *)(out + j + 8), b0 = {0}, b1 = {0};
        int i = 0;
        for (; i + 2 <= n; i += 2) {
            const float *v0 = v + (size_t)i * stride + j, *v1 = v0 + stride;
            const float p0 = p[i] * mul, p1 = p[i + 1] * mul;
            a0 += p0 * *(const v8f *)v0;
            a1 += p0 * *(const v8f *)(v0 + 8);
            b0 += p1 * *(const v8f *)v1;
            b1 += p1 * *(const v8f *)(v1 + 8);
        }
        if (i < n) {
            const float *v0 = v + (size_t)i * stride + j;
            a0 += (p[i] * mul) * *(const v8f *)v0;
            a1 += (p[i] * mul) * *(const v8f *)(v0 + 8);
        }
        *(v8f *)(out + j) = a0 + b0;
        *(v8f *)(out + j + 8) = a1 + b1;
    }
    for (; j + 8 <= hs; j += 8) {
        v8f a0 = *(v8f *)(out + j), b0 = {0};
        int i = 0;
        for (; i + 2 <= n; i += 2) {
            a0 += (p[i] * mul) * *(const v8f *)(v + (size_t)i * stride + j);
            b0 += (p[i + 1] * mul) * *(const v8f *)(v + (size_t)(i + 1) * stride + j);
        }
        if (i < n) a0 += (p[i] * mul) * *(const v8f *)(v + (size_t)i * stride + j);
        *(v8f *)(out + j) = a0 + b0;
    }
    for (; j < hs; j++)
        for (int i = 0; i < n; i++) out[j] += (p[i] * mul) * v[(size_t)i * stride + j];
}

/* s[t] = cap * tanh(s[t] / cap) for t < n (gemma2's attention soft-capping); returns the
 * largest. */
static float softcap(float *s, int n, float cap)
{
    float max = -INFINITY;
    for (int t = 0; t < n; t++) {
        s[t] = cap * tanhf(s[t] / cap);
        if (s[t] > max) max = s[t];
    }
    return max;
}

/*
 * One decode row: its query heads of the KV heads kh0..kh1-1 over positions 0..n_pos-1 of
 * its sequence, K/V read block by block through the block table: scores = q·k /
 * sqrt(head_size), softmax (max subtracted), out = Σ a·v, for each head.
 *
 * The heads go together through each block: K is read 8 positions at a time, each of the 8
 * rows of K from its first head to its last (8 sequential runs of (kh1 - kh0) · head_size
 * floats), not one head's 64 floats from every position and then the next head's: at 32
 * sequences a step reads as much K/V as weights, and head by head (256 bytes every 3 KiB)
 * the decode attention ran at a quarter of the read bandwidth. Every score, softmax and
 * weighted sum is computed as head by head — one 8-lane chain per score reduced by one
 * pairwise tree, the same sums in the same order — so the bits do not depend on how many
 * heads an item takes. scores: n_pos floats for each query head, then one each.
 */
CPU_CLONES
static void attend_row(const cpu *c, const float *q, const int32_t *table, int kh0, int kh1,
                       int n_pos, float *scores, float *out)
{
    const int hs = c->head_size, bs = c->block_size, kv_dim = c->kv_dim, group = c->group;
    const int hs8 = hs & ~7, nq = (kh1 - kh0) * group;
    const size_t q0 = (size_t)kh0 * group * hs; /* the first query head's floats */
    const float scale = c->att_div;
    /* a windowed layer sees the last `window` positions only: [lo, n_pos) */
    const int lo = c->window && n_pos > c->window ? n_pos - c->window : 0;
    float *mx = scores + (size_t)nq * n_pos; /* each head's largest score, then 1 / its sum */
    for (int h = 0; h < nq; h++) mx[h] = -INFINITY;
    for (int t0 = lo / bs * bs; t0 < n_pos; t0 += bs) {
        const float *kb = kv_at(c, table[t0 / bs], c->layer, 0, 0);
        const int n = n_pos - t0 < bs ? n_pos - t0 : bs;
        int i = t0 < lo ? lo - t0 : 0;
        if (hs8 == hs) {
            /* 8 positions at a time; their 8 partial-sum vectors are reduced together by a
             * pairwise-add tree (as _mm256_hadd_ps), far cheaper than 8 separate reductions */
            for (; i + 8 <= n; i += 8)
                for (int h = 0; h < nq; h++) {
                    const float *qh = q + q0 + (size_t)h * hs;
                    const float *k = kb + (size_t)i * kv_dim + (size_t)(kh0 + h / group) * hs;
                    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0},
                        a7 = {0};
                    for (int j = 0; j < hs; j += 8) {
                        const v8f qv = *(const v8f *)(qh + j);
                        a0 += qv * *(const v8f *)(k + j);
                        a1 += qv * *(const v8f *)(k + kv_dim + j);
                        a2 += qv * *(const v8f *)(k + 2 * (size_t)kv_dim + j);
                        a3 += qv * *(const v8f *)(k + 3 * (size_t)kv_dim + j);
                        a4 += qv * *(const v8f *)(k + 4 * (size_t)kv_dim + j);
                        a5 += qv * *(const v8f *)(k + 5 * (size_t)kv_dim + j);
                        a6 += qv * *(const v8f *)(k + 6 * (size_t)kv_dim + j);
                        a7 += qv * *(const v8f *)(k + 7 * (size_t)kv_dim + j);
                    }
                    v8f sc;
                    HADD_TREE8(sc, a0, a1, a2, a3, a4, a5, a6, a7);
                    sc /= scale;
                    float *sh = scores + (size_t)h * n_pos + t0 + i;
                    for (int m = 0; m < 8; m++) {
                        sh[m] = sc[m];
                        if (sc[m] > mx[h]) mx[h] = sc[m];
                    }
                }
        }
        for (; i < n; i++)
            for (int h = 0; h < nq; h++) {
                const float *qh = q + q0 + (size_t)h * hs;
                const float *k = kb + (size_t)i * kv_dim + (size_t)(kh0 + h / group) * hs;
                v8f acc = {0};
                int j = 0;
                for (; j < hs8; j += 8) acc += *(const v8f *)(qh + j) * *(const v8f *)(k + j);
                float score = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                              ((acc[4] + acc[5]) + (acc[6] + acc[7]));
                for (; j < hs; j++) score += qh[j] * k[j];
                score /= scale;
                scores[(size_t)h * n_pos + t0 + i] = score;
                if (score > mx[h]) mx[h] = score;
            }
    }
    for (int h = 0; h < nq; h++) {
        float *sh = scores + (size_t)h * n_pos;
        if (c->hp.attn_softcap > 0.0f) mx[h] = softcap(sh + lo, n_pos - lo, c->hp.attn_softcap);
        mx[h] = 1.0f / exp_shifted_sum(sh + lo, n_pos - lo, mx[h]);
    }
    memset(out + q0, 0, (size_t)nq * hs * sizeof *out);
    for (int t0 = lo / bs * bs; t0 < n_pos; t0 += bs) {
        const float *vb = kv_at(c, table[t0 / bs], c->layer, 1, 0);
        const int n = n_pos - t0 < bs ? n_pos - t0 : bs;
        const int i = t0 < lo ? lo - t0 : 0;
        for (int h = 0; h < nq; h++)
            weighted_sum(out + q0 + (size_t)h * hs,
                         vb + (size_t)i * kv_dim + (size_t)(kh0 + h / group) * hs, (size_t)kv_dim,
                         scores + (size_t)h * n_pos + t0 + i, mx[h], n - i, hs);
    }
}

/*
 * Prefill rows: a block of QB query vectors of one KV head — a tile's rows times the group's
 * query heads, row-major (with GQA the heads sharing K/V ride along in the same block) — as
 * two register-tiled products with an online softmax between them (flash attention):
 *
 *   for each step of up to KB keys:  S = Q·Kᵀ / scale  (soft-capped, masked)
 *                                    m' = max(m, rowmax S);  P = exp(S - m')
 *                                    l = l·e^(m-m') + rowsum P;  O = O·e^(m-m') + P·V
 *   out = O / l
 *
 * Everything is kept transposed, one query vector per lane: Qᵀ [head_size][QB] packed once,
 * Sᵀ/Pᵀ [KB][QB], Oᵀ [head_size][QB]; so the running max, the sums and the rescaling are
 * lane-wise vector operations, and both products broadcast K or V elements straight from
 * the KV blocks (no transposed copy of K): Sᵀ takes 4 keys × 16 lanes in 8 accumulators per
 * pass over the head, Oᵀ 4 elements × 16 lanes per pass over the step's keys. The score
 * matrix is never written beyond one step. Keys run from the block's lowest visible
 * position to its highest; the first step takes the remainder so the last ends on the
 * diagonal, where the causal (and window) mask is applied per lane — steps every lane sees
 * whole skip it. Padding lanes (a block's queries past the tile) carry zero queries and see
 * every key; their output is dropped.
 */
#define QB 16 /* query vectors of a block: two 8-float vectors of lanes */
#define KB 64 /* keys per step of the online softmax */

/* lane-wise max / select on v8f through integer masks (no vector ?: in C) */
#define VSEL(mask, a, b) ((v8f)(((v8i)(a) & (mask)) | ((v8i)(b) & ~(mask))))

/*
 * The one tile walk of both products: `rows` rows of QB lanes (rows ≤ 4; row r is t[2r] and
 * t[2r + 1]), each a weighted sum over n lane rows of `lanes` (QB floats apart):
 *
 *   row r = start_r + Σ_{j<n} w(r, j) · lanes[j]
 *
 * in 2·rows accumulators, one broadcast weight per row and step. Sᵀ = K·Qᵀ (alpha NULL):
 * rows keys over the head, w(r, j) = src[r][j] (src: the keys), lanes Qᵀ, start 0. Oᵀ =
 * V·Pᵀ: rows elements d.. of the head over the step's keys, w(r, j) = src[j][d + r] (src:
 * the values), lanes Pᵀ, start the row as it was times alpha (e^(m-m') of lanes 0-7, 8-15).
 * Always inlined with constant rows and alpha, so each call compiles to a plain loop.
 */
static inline __attribute__((always_inline)) void lane_tile(v8f *t, int rows, const float *lanes,
                                                            int n, const float *const *src, int d,
                                                            const v8f *alpha)
{
    v8f acc[8];
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++) {
        acc[2 * r] = alpha ? t[2 * r] * alpha[0] : (v8f){0};
        acc[2 * r + 1] = alpha ? t[2 * r + 1] * alpha[1] : (v8f){0};
    }
    for (int j = 0; j < n; j++, lanes += QB) {
        const v8f x = *(const v8f *)lanes, y = *(const v8f *)(lanes + 8);
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++) {
            const float w = alpha ? src[j][d + r] : src[r][j];
            acc[2 * r] += w * x;
            acc[2 * r + 1] += w * y;
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < 2 * rows; r++) t[r] = acc[r];
}

CPU_CLONES
static void attend_block(const cpu *c, const struct tile *tl, int kvh, int qi0, float *scratch)
{
    const eng_batch *b = c->b;
    const int hs = c->head_size, bs = c->block_size, group = c->group, dim = c->q_dim;
    const int nq_tile = (tl->row1 - tl->row0) * group;
    const int nq = nq_tile - qi0 < QB ? nq_tile - qi0 : QB;
    const int32_t *table = kv_table(c, tl->seq);
    const float scale = c->att_div, cap = c->hp.attn_softcap;
    /* on a cache line: the vector loads of a lane row never straddle two */
    float *qt = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *ot = qt + (size_t)hs * QB, *st = ot + (size_t)hs * QB;
    /* lane l sees keys lo[l] .. hi[l] */
    int lo[QB] __attribute__((aligned(32))), hi[QB] __attribute__((aligned(32)));
    int t_lo = INT32_MAX, t_hi = -1, max_lo = 0, min_hi = INT32_MAX;
    for (int l = 0; l < QB; l++) {
        if (l >= nq) {
            for (int j = 0; j < hs; j++) qt[(size_t)j * QB + l] = 0.0f;
            lo[l] = 0;
            hi[l] = INT32_MAX;
            continue;
        }
        const int qi = qi0 + l, row = tl->row0 + qi / group, h = kvh * group + qi % group;
        const int pos = b->positions[row];
        const float *q = c->q + (size_t)row * dim + (size_t)h * hs;
        for (int j = 0; j < hs; j++) qt[(size_t)j * QB + l] = q[j] / scale;
        lo[l] = c->window && pos + 1 > c->window ? pos + 1 - c->window : 0;
        hi[l] = pos;
        if (lo[l] < t_lo) t_lo = lo[l];
        if (lo[l] > max_lo) max_lo = lo[l];
        if (pos > t_hi) t_hi = pos;
        if (pos < min_hi) min_hi = pos;
    }
    const v8i lo0 = *(const v8i *)lo, lo1 = *(const v8i *)(lo + 8);
    const v8i hi0 = *(const v8i *)hi, hi1 = *(const v8i *)(hi + 8);
    const v8f ninf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                      -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    v8f m0 = ninf, m1 = ninf, l0 = {0}, l1 = {0};
    memset(ot, 0, (size_t)hs * QB * sizeof *ot);
    const float *kp[KB], *vp[KB];
    const int span = t_hi + 1 - t_lo;
    for (int t = t_lo; t <= t_hi;) {
        const int nk = t == t_lo && span % KB ? span % KB : KB;
        for (int i = 0, bi = t / bs, off = t % bs; i < nk; i++) {
            kp[i] = kv_at(c, table[bi], c->layer, 0, off) + (size_t)kvh * hs;
            vp[i] = kv_at(c, table[bi], c->layer, 1, off) + (size_t)kvh * hs;
            if (++off == bs) off = 0, bi++;
        }
        /* Sᵀ = K·Qᵀ (Q already divided by the scale), 4 keys at a time */
        int i = 0;
        for (; i + 4 <= nk; i += 4)
            lane_tile((v8f *)(st + (size_t)i * QB), 4, qt, hs, kp + i, 0, NULL);
        for (; i < nk; i++) lane_tile((v8f *)(st + (size_t)i * QB), 1, qt, hs, kp + i, 0, NULL);
        if (cap > 0.0f)
            for (int x = 0; x < nk * QB; x++) st[x] = cap * tanhf(st[x] / cap);
        /* mask (unless every lane sees the whole step) and the new running max */
        const int whole = t >= max_lo && t + nk - 1 <= min_hi;
        v8f n0 = m0, n1 = m1;
        for (i = 0; i < nk; i++) {
            v8f *s = (v8f *)(st + (size_t)i * QB);
            if (!whole) {
                const v8i p = (v8i){0} + (t + i);
                const v8i in0 = (p >= lo0) & (p <= hi0), in1 = (p >= lo1) & (p <= hi1);
                s[0] = VSEL(in0, s[0], ninf);
                s[1] = VSEL(in1, s[1], ninf);
            }
            n0 = VSEL(s[0] > n0, s[0], n0);
            n1 = VSEL(s[1] > n1, s[1], n1);
        }
        /* lanes that have seen no key yet keep -inf; they shift by 0 (their P is masked) */
        const v8f u0 = (v8f)((v8i)n0 & (n0 > ninf)), u1 = (v8f)((v8i)n1 & (n1 > ninf));
        v8f al0 = m0 - u0, al1 = m1 - u1; /* -inf before a lane's first key: e^ → 0 */
        exp8((float *)&al0);
        exp8((float *)&al1);
        v8f ps0 = {0}, ps1 = {0};
        for (i = 0; i < nk; i++) {
            v8f *s = (v8f *)(st + (size_t)i * QB);
            s[0] -= u0;
            s[1] -= u1;
            exp8((float *)s);
            exp8((float *)(s + 1));
            if (!whole) {
                const v8i p = (v8i){0} + (t + i);
                s[0] = (v8f)((v8i)s[0] & (p >= lo0) & (p <= hi0));
                s[1] = (v8f)((v8i)s[1] & (p >= lo1) & (p <= hi1));
            }
            ps0 += s[0];
            ps1 += s[1];
        }
        l0 = l0 * al0 + ps0;
        l1 = l1 * al1 + ps1;
        m0 = n0;
        m1 = n1;
        /* Oᵀ = Oᵀ·e^(m-m') + V·Pᵀ, 4 elements of the head at a time */
        const v8f al[2] = {al0, al1};
        int d = 0;
        for (; d + 4 <= hs; d += 4) lane_tile((v8f *)(ot + (size_t)d * QB), 4, st, nk, vp, d, al);
        for (; d < hs; d++) lane_tile((v8f *)(ot + (size_t)d * QB), 1, st, nk, vp, d, al);
        t += nk;
    }
    float inv[QB];
    *(v8f *)inv = 1.0f / l0;
    *(v8f *)(inv + 8) = 1.0f / l1;
    for (int l = 0; l < nq; l++) {
        const int qi = qi0 + l, row = tl->row0 + qi / group, h = kvh * group + qi % group;
        float *out = c->att + (size_t)row * dim + (size_t)h * hs;
        for (int j = 0; j < hs; j++) out[j] = ot[(size_t)j * QB + l] * inv[l];
    }
}
#undef VSEL

/* Query heads' scores a worker's scratch holds for one decode row: every head's up to a
 * quarter of a MiB, at least one KV head's. */
#define ATT_ROW_SCRATCH_FLOATS (64 * 1024)

/* KV heads a decode item takes: all of a row's where there are rows enough to share among
 * the workers (4 items a worker), else fewer, so that a few rows still spread. A row alone
 * (one sequence generating) is split into one item a worker: in smaller items each worker
 * read K/V in shorter runs (2 heads = 512 bytes a position, kv_dim floats apart) and claimed
 * more tasks, and the row's attention took 0.31 against 0.27 ms a token (stories110M Q4_0,
 * 2 threads, results/2026-12-07-batch1-overheads-zen4-s13.md). */
static int att_row_heads(const cpu *c)
{
    const int nw = c->workers.n_workers, n_kv = c->c.n_kv_heads;
    const int want = c->n_tiles == 1 ? nw : 4 * nw;
    const int ranges = c->n_tiles >= want ? 1 : (want + c->n_tiles - 1) / c->n_tiles;
    return ranges >= n_kv ? 1 : (n_kv + ranges - 1) / ranges;
}

/* One item = one tile and one KV head. A single row (decode) goes through attend_row, the
 * item of every att_row_heads-th KV head with the heads up to the next one (the items
 * between do nothing); several rows of one sequence (prefill) through attend_block, QB query
 * vectors at a time. */
static void attention_item(cpu *c, int item, int worker)
{
    const eng_batch *b = c->b;
    const struct tile *tl = &c->tiles[item / c->c.n_kv_heads];
    const int kvh = item % c->c.n_kv_heads;
    float *scratch = c->scores + (size_t)worker * c->scores_per_worker;
    if (c->attn_bf16) {
        /* the tile's prompt rows (its first rows: a sequence's positions ascend) in BF16, at
         * any count, so that a prompt row's bits do not depend on its chunk; the rest as
         * below, as a tile of their own */
        int rp = tl->row0;
        while (rp < tl->row1 && (rp < c->att_prompt_rows ||
                                 (b->prompt_len && b->positions[rp] < b->prompt_len[tl->seq])))
            rp++;
        if (rp > tl->row0) {
            const struct tile pt = {tl->seq, tl->row0, rp};
            const int nq = (rp - tl->row0) * c->group, lanes = cpu_attention_bf16_lanes();
            for (int qi0 = 0; qi0 < nq; qi0 += lanes)
                cpu_attend_block_bf16(c, &pt, kvh, qi0, scratch);
        }
        if (rp == tl->row1) return;
        if (rp > tl->row0) {
            const struct tile gt = {tl->seq, rp, tl->row1};
            if (tl->row1 - rp > 1) {
                const int nq = (tl->row1 - rp) * c->group;
                for (int qi0 = 0; qi0 < nq; qi0 += QB) attend_block(c, &gt, kvh, qi0, scratch);
            } else {
                attend_row(c, c->q + (size_t)rp * c->q_dim, kv_table(c, tl->seq), kvh, kvh + 1,
                           b->positions[rp] + 1, scratch, c->att + (size_t)rp * c->q_dim);
            }
            return;
        }
    }
    if (tl->row1 - tl->row0 > 1) {
        const int nq = (tl->row1 - tl->row0) * c->group;
        for (int qi0 = 0; qi0 < nq; qi0 += QB) attend_block(c, tl, kvh, qi0, scratch);
        return;
    }
    const int per_item = att_row_heads(c);
    if (kvh % per_item) return;
    const int row = tl->row0, n_pos = b->positions[row] + 1;
    const int end = kvh + per_item < c->c.n_kv_heads ? kvh + per_item : c->c.n_kv_heads;
    /* as many KV heads at a time as the scratch holds the scores of (at least one) */
    int fit = (int)(c->scores_per_worker / ((size_t)c->group * ((size_t)n_pos + 1)));
    fit = fit < 1 ? 1 : fit;
    const int32_t *table = kv_table(c, tl->seq);
    for (int kh = kvh; kh < end; kh += fit)
        attend_row(c, c->q + (size_t)row * c->q_dim, table, kh, end - kh < fit ? end : kh + fit,
                   n_pos, scratch, c->att + (size_t)row * c->q_dim);
}

/* Pool tasks per worker at most: a decode item (one row, one KV head) takes a microsecond or
 * two, about what claiming it costs when the claim word and the done count cross between
 * the vCPUs (0.1-0.7 us a transfer here); so items go in runs of consecutive ones, enough
 * runs per worker that one descheduled worker's share is taken over by the others. */
#define ATT_TASKS_PER_WORKER 8

/* Tasks are claimed in order, so they take the runs from the last: a sequence's later
 * tiles see more positions and cost more, and the region ends when its last task does —
 * the cheap runs come last, where they even out the workers. */
static void attention_task(void *ctx, int task, int worker)
{
    cpu *c = ctx;
    const int k = c->att_tasks - 1 - task;
    const int i0 = (int)((int64_t)k * c->att_items / c->att_tasks);
    const int i1 = (int)((int64_t)(k + 1) * c->att_items / c->att_tasks);
    for (int i = i1 - 1; i >= i0; i--) attention_item(c, i, worker);
}

size_t cpu_attention_scratch(const cpu *c)
{
    /* attend_row's scores over the context and one float more, for one KV head's query heads
     * and as many more KV heads as ATT_ROW_SCRATCH_FLOATS holds; or attend_block's Qᵀ, Oᵀ and
     * Sᵀ from the first cache line of the worker's part (16 floats more) */
    const size_t kv_head = (size_t)c->group * ((size_t)c->c.seq_len + 1);
    size_t heads = ATT_ROW_SCRATCH_FLOATS / kv_head;
    heads = heads < 1 ? 1 : heads > (size_t)c->c.n_kv_heads ? (size_t)c->c.n_kv_heads : heads;
    size_t block = (2 * (size_t)c->head_size + KB) * QB + 16, row = heads * kv_head;
    const size_t bf16 = cpu_attention_bf16_scratch(c->head_size);
    block = bf16 > block ? bf16 : block;
    return block > row ? block : row;
}

void cpu_attention(cpu *c)
{
    const int max_tasks = c->workers.n_workers * ATT_TASKS_PER_WORKER;
    c->att_items = c->n_tiles * c->c.n_kv_heads;
    c->att_tasks = c->att_items < max_tasks ? c->att_items : max_tasks;
    if (c->n_tiles == 1 && c->tiles[0].row1 - c->tiles[0].row0 == 1) {
        /* a row alone: a task for each item that works (the others would be empty claims) */
        const int per_item = att_row_heads(c);
        c->att_tasks = (c->c.n_kv_heads + per_item - 1) / per_item;
    }
    pool_run(&c->workers, c->att_tasks, attention_task, c);
}
