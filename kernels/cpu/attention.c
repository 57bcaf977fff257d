/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/attention.c — the CPU backend's paged attention: each row's query heads over
 * positions 0..pos of its sequence, K and V read block by block through the sequence's
 * block table. A decode row goes through attend_head; up to TILE_ROWS prefill rows of one
 * sequence through attend_tile, which reads (and transposes) each K block once per tile.
 */
#include "kernels/cpu/cpu.h"

#include <math.h>
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

CPU_CLONES
static void attend_head(const cpu *c, const float *q, const int32_t *table, int kvh, int n_pos,
                        float *scores, float *out)
{
    const int hs = c->head_size, bs = c->block_size, kv_dim = c->kv_dim;
    const int hs8 = hs & ~7;
    const float scale = c->att_div;
    /* a windowed layer sees the last `window` positions only: [lo, n_pos) */
    const int lo = c->window && n_pos > c->window ? n_pos - c->window : 0;
    float max = -INFINITY;
    for (int t0 = lo / bs * bs; t0 < n_pos; t0 += bs) {
        const float *k = kv_at(c, table[t0 / bs], c->layer, 0, 0) + (size_t)kvh * hs;
        int n = n_pos - t0 < bs ? n_pos - t0 : bs;
        int i = t0 < lo ? lo - t0 : 0;
        k += (size_t)i * kv_dim;
        if (hs8 == hs) {
            /* 8 positions at a time; their 8 partial-sum vectors are reduced together by a
             * pairwise-add tree (as _mm256_hadd_ps), far cheaper than 8 separate reductions */
            for (; i + 8 <= n; i += 8, k += 8 * (size_t)kv_dim) {
                v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
                for (int j = 0; j < hs; j += 8) {
                    const v8f qv = *(const v8f *)(q + j);
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
                for (int m = 0; m < 8; m++) {
                    scores[t0 + i + m] = sc[m];
                    if (sc[m] > max) max = sc[m];
                }
            }
        }
        for (; i < n; i++, k += kv_dim) {
            v8f acc = {0};
            int j = 0;
            for (; j < hs8; j += 8) acc += *(const v8f *)(q + j) * *(const v8f *)(k + j);
            float score =
                ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            for (; j < hs; j++) score += q[j] * k[j];
            score /= scale;
            scores[t0 + i] = score;
            if (score > max) max = score;
        }
    }
    if (c->hp.attn_softcap > 0.0f) max = softcap(scores + lo, n_pos - lo, c->hp.attn_softcap);
    const float inv = 1.0f / exp_shifted_sum(scores + lo, n_pos - lo, max);
    memset(out, 0, (size_t)hs * sizeof *out);
    for (int t0 = lo / bs * bs; t0 < n_pos; t0 += bs) {
        const float *v = kv_at(c, table[t0 / bs], c->layer, 1, 0) + (size_t)kvh * hs;
        int n = n_pos - t0 < bs ? n_pos - t0 : bs;
        int i = t0 < lo ? lo - t0 : 0;
        weighted_sum(out, v + (size_t)i * kv_dim, (size_t)kv_dim, scores + t0 + i, inv, n - i, hs);
    }
}

/*
 * A tile of rows [row0, row1) of one sequence (consecutive positions) and one KV head: the
 * same math as attend_head, arranged for reuse. Per K block the head's K is transposed to
 * k_t[head_size][block] so a row's scores for the whole block are vector FMAs across
 * positions (no horizontal sums); the scores of all the tile's (row, head) pairs are kept
 * until the softmax; then each V row is read once for all of them.
 */
CPU_CLONES
static void attend_tile(const cpu *c, const eng_batch *b, const struct tile *tl, int kvh,
                        float *scores, float *k_t)
{
    const int hs = c->head_size, bs = c->block_size, bp = (bs + 7) & ~7, kv_dim = c->kv_dim;
    const int group = c->group, seq_len = c->c.seq_len, dim = c->q_dim;
    const int n_rows = tl->row1 - tl->row0, pos0 = b->positions[tl->row0];
    const int n_pos = b->positions[tl->row1 - 1] + 1;
    const int32_t *table = b->block_table + (size_t)tl->seq * (size_t)b->block_table_stride;
    const float scale = c->att_div;
    /* windowed layer: row ri sees [lo(ri), its position]; blocks before the first row's
     * window are not read, and scores below a row's window are zero after the softmax */
    const int w = c->window;
#define ROW_LO(ri) (w && pos0 + (ri) + 1 > w ? pos0 + (ri) + 1 - w : 0)
    const int t_first = ROW_LO(0) / bs * bs;
    for (int t0 = t_first; t0 < n_pos; t0 += bs) {
        const float *k = kv_at(c, table[t0 / bs], c->layer, 0, 0) + (size_t)kvh * hs;
        const int n = n_pos - t0 < bs ? n_pos - t0 : bs;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < hs; j++) k_t[(size_t)j * bp + i] = k[(size_t)i * kv_dim + j];
        for (int j = 0; j < hs; j++)
            for (int i = n; i < bp; i++) k_t[(size_t)j * bp + i] = 0.0f;
        for (int ri = 0; ri < n_rows; ri++) {
            if (t0 > pos0 + ri || t0 + bs <= ROW_LO(ri)) /* causal, or before the window */
                continue;
            for (int g = 0; g < group; g++) {
                const float *q =
                    c->q + (size_t)(tl->row0 + ri) * dim + (size_t)(kvh * group + g) * hs;
                float *srow = scores + ((size_t)ri * group + g) * seq_len + t0;
                for (int i0 = 0; i0 < bp; i0 += 8) {
                    /* four accumulators: four independent FMA chains over j */
                    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
                    const float *kt = k_t + i0;
                    int j = 0;
                    for (; j + 4 <= hs; j += 4, kt += 4 * (size_t)bp) {
                        a0 += q[j] * *(const v8f *)kt;
                        a1 += q[j + 1] * *(const v8f *)(kt + bp);
                        a2 += q[j + 2] * *(const v8f *)(kt + 2 * (size_t)bp);
                        a3 += q[j + 3] * *(const v8f *)(kt + 3 * (size_t)bp);
                    }
                    for (; j < hs; j++, kt += bp) a0 += q[j] * *(const v8f *)kt;
                    v8f acc = ((a0 + a1) + (a2 + a3)) / scale;
                    int m = n - i0 < 8 ? n - i0 : 8;
                    for (int i = 0; i < m; i++) srow[i0 + i] = acc[i];
                }
            }
        }
    }
    for (int ri = 0; ri < n_rows; ri++) {
        const int np = pos0 + ri + 1, lo = ROW_LO(ri);
        for (int g = 0; g < group; g++) {
            float *srow = scores + ((size_t)ri * group + g) * seq_len;
            float max = -INFINITY;
            if (c->hp.attn_softcap > 0.0f)
                max = softcap(srow + lo, np - lo, c->hp.attn_softcap);
            else
                for (int t = lo; t < np; t++)
                    if (srow[t] > max) max = srow[t];
            const float inv = 1.0f / exp_shifted_sum(srow + lo, np - lo, max);
            for (int t = lo; t < np; t++) srow[t] *= inv;
            for (int t = t_first; t < lo; t++) srow[t] = 0.0f;
            memset(c->att + (size_t)(tl->row0 + ri) * dim + (size_t)(kvh * group + g) * hs, 0,
                   (size_t)hs * sizeof(float));
        }
    }
    for (int t0 = t_first; t0 < n_pos; t0 += bs) {
        const float *v = kv_at(c, table[t0 / bs], c->layer, 1, 0) + (size_t)kvh * hs;
        const int n = n_pos - t0 < bs ? n_pos - t0 : bs;
        for (int ri = 0; ri < n_rows; ri++) {
            const int m = pos0 + ri + 1 - t0 < n ? pos0 + ri + 1 - t0 : n;
            for (int g = 0; g < group; g++) {
                const float *p = scores + ((size_t)ri * group + g) * seq_len + t0;
                float *out =
                    c->att + (size_t)(tl->row0 + ri) * dim + (size_t)(kvh * group + g) * hs;
                if (m > 0) weighted_sum(out, v, (size_t)kv_dim, p, 1.0f, m, hs);
            }
        }
    }
#undef ROW_LO
}

/* One item = one tile and one KV head. A single row (decode) goes straight through
 * attend_head; several rows of one sequence (prefill) through attend_tile. */
static void attention_item(cpu *c, int item, int worker)
{
    const eng_batch *b = c->b;
    const struct tile *tl = &c->tiles[item / c->c.n_kv_heads];
    const int kvh = item % c->c.n_kv_heads, hs = c->head_size;
    float *scores = c->scores + (size_t)worker * c->scores_per_worker;
    if (tl->row1 - tl->row0 > 1) {
        attend_tile(c, b, tl, kvh, scores, scores + (size_t)TILE_ROWS * c->group * c->c.seq_len);
        return;
    }
    const int row = tl->row0, pos = b->positions[row];
    const int32_t *table = b->block_table + (size_t)tl->seq * (size_t)b->block_table_stride;
    for (int h = kvh * c->group; h < (kvh + 1) * c->group; h++)
        attend_head(c, c->q + (size_t)row * c->q_dim + (size_t)h * hs, table, kvh, pos + 1, scores,
                    c->att + (size_t)row * c->q_dim + (size_t)h * hs);
}


/* Pool tasks per worker at most: a decode item (one row, one KV head) takes a microsecond or
 * two, about what claiming it costs when the claim word and the done count cross between
 * the vCPUs (0.1-0.7 us a transfer here); so items go in runs of consecutive ones, enough
 * runs per worker that one descheduled worker's share is taken over by the others. */
#define ATT_TASKS_PER_WORKER 8

static void attention_task(void *ctx, int task, int worker)
{
    cpu *c = ctx;
    const int i0 = (int)((int64_t)task * c->att_items / c->att_tasks);
    const int i1 = (int)((int64_t)(task + 1) * c->att_items / c->att_tasks);
    for (int i = i0; i < i1; i++) attention_item(c, i, worker);
}

size_t cpu_attention_scratch(const cpu *c)
{
    /* a tile's scores, then K of one block transposed: [head_size][block_size rounded up] */
    return (size_t)TILE_ROWS * c->group * c->c.seq_len +
           (size_t)c->head_size * (size_t)((c->block_size + 7) & ~7);
}

void cpu_attention(cpu *c)
{
    const int max_tasks = c->workers.n_workers * ATT_TASKS_PER_WORKER;
    c->att_items = c->n_tiles * c->c.n_kv_heads;
    c->att_tasks = c->att_items < max_tasks ? c->att_items : max_tasks;
    pool_run(&c->workers, c->att_tasks, attention_task, c);
}
