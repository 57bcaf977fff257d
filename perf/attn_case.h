/* SPDX-License-Identifier: MIT */
/*
 * perf/attn_case.h — one layer's paged attention of the CPU backend (kernels/cpu/
 * attention.c) on its own, for perf/attn_bench and tests/test_kernels_attention.c (header
 * only): a struct cpu holding just what cpu_attention reads, a KV pool of random K/V behind
 * scattered block tables, random queries, and a batch of sequences each adding rows after
 * positions already cached (a whole prompt, a chunk of one, a decode row).
 *
 * The rows of a sequence go to cpu_attention in tiles of tile_rows (the engine uses
 * TILE_ROWS): tiles of one row take the per-row path (attend_head), the plain kernel the
 * tiled one is checked against.
 */
#ifndef RINGLM_PERF_ATTN_CASE_H
#define RINGLM_PERF_ATTN_CASE_H

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/gemm_bf16.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define AC_MAX_SEQS 8

typedef struct attn_case {
    int head_size, n_heads, n_kv_heads, block_size;
    int window;      /* sliding window (0: none) */
    float softcap;   /* soft-capping of the scores (0: off) */
    float att_scale; /* q·k times it (0: 1 / sqrt(head_size)) */
    float q_amp;     /* queries uniform in [-q_amp, q_amp] (0: 1); K and V in [-1, 1] */
    int threads;
    int attn_bf16; /* the engine's prompt path on (cpu.attn_bf16, where the CPU has it): rows
                      below c.att_prompt_rows, which the caller sets, take attention_bf16.c */
    int n_seqs;
    int ctx[AC_MAX_SEQS];  /* positions of the sequence cached before the batch */
    int rows[AC_MAX_SEQS]; /* its rows in the batch: positions ctx .. ctx + rows - 1 */
    unsigned seed;
} attn_case;

typedef struct attn_run {
    attn_case ac;
    cpu c;
    eng_batch b;
    int32_t *positions, *query_start, *seq_len, *table;
    int n_rows, stride, pool_ok;
} attn_run;

/* xorshift32 in [-1, 1) */
static inline float ac_rand(unsigned *s)
{
    unsigned x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *s = x;
    return (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

static inline void attn_run_free(attn_run *r)
{
    if (r->pool_ok) pool_stop(&r->c.workers);
    free(r->c.kv_pool);
    free(r->c.q);
    free(r->c.att);
    free(r->c.scores);
    free(r->c.tiles);
    free(r->positions);
    free(r->query_start);
    free(r->seq_len);
    free(r->table);
    memset(r, 0, sizeof *r);
}

/* Tiles of at most tile_rows rows of one sequence each, as cpu_execute makes them. */
static inline void attn_run_tiles(attn_run *r, int tile_rows)
{
    cpu *c = &r->c;
    c->n_tiles = 0;
    for (int s = 0; s < r->b.n_seqs; s++)
        for (int q = r->query_start[s]; q < r->query_start[s + 1]; q += tile_rows) {
            int end = q + tile_rows < r->query_start[s + 1] ? q + tile_rows : r->query_start[s + 1];
            c->tiles[c->n_tiles++] = (struct tile){s, q, end};
        }
}

/* Builds the case (tiles of TILE_ROWS). 0, or -1 when out of memory or the pool does not
 * start (r is freed). */
static inline int attn_run_init(attn_run *r, const attn_case *ac)
{
    memset(r, 0, sizeof *r);
    r->ac = *ac;
    cpu *c = &r->c;
    const int hs = ac->head_size, bs = ac->block_size;
    int max_pos = 1, n_blocks = 0;
    for (int s = 0; s < ac->n_seqs; s++) {
        const int n = ac->ctx[s] + ac->rows[s];
        if (n > max_pos) max_pos = n;
        n_blocks += (n + bs - 1) / bs;
        r->n_rows += ac->rows[s];
    }
    r->stride = (max_pos + bs - 1) / bs;
    c->c.n_heads = ac->n_heads;
    c->c.n_kv_heads = ac->n_kv_heads;
    c->c.n_layers = 1;
    c->c.seq_len = max_pos;
    c->hp.attn_softcap = ac->softcap;
    c->head_size = hs;
    c->q_dim = hs * ac->n_heads;
    c->kv_dim = hs * ac->n_kv_heads;
    c->group = ac->n_heads / ac->n_kv_heads;
    c->block_size = bs;
    c->n_blocks = n_blocks;
    c->max_rows = r->n_rows;
    c->block_floats = 2 * (size_t)bs * (size_t)c->kv_dim;
    c->att_div = ac->att_scale > 0.0f ? 1.0f / ac->att_scale : sqrtf((float)hs);
    c->window = ac->window;
    c->layer = 0;
    c->attn_bf16 = ac->attn_bf16 && gemm_bf16_supported();
    const int threads = ac->threads > 0 ? ac->threads : 1;
    c->scores_per_worker = cpu_attention_scratch(c);
    c->kv_pool = malloc((size_t)n_blocks * c->block_floats * sizeof(float));
    c->q = malloc((size_t)r->n_rows * c->q_dim * sizeof(float));
    c->att = calloc((size_t)r->n_rows * c->q_dim, sizeof(float));
    c->scores = malloc((size_t)threads * c->scores_per_worker * sizeof(float));
    c->tiles = malloc((size_t)r->n_rows * sizeof *c->tiles);
    r->positions = malloc((size_t)r->n_rows * sizeof *r->positions);
    r->query_start = malloc((size_t)(ac->n_seqs + 1) * sizeof *r->query_start);
    r->seq_len = malloc((size_t)ac->n_seqs * sizeof *r->seq_len);
    r->table = malloc((size_t)ac->n_seqs * r->stride * sizeof *r->table);
    if (!c->kv_pool || !c->q || !c->att || !c->scores || !c->tiles || !r->positions ||
        !r->query_start || !r->seq_len || !r->table) {
        attn_run_free(r);
        return -1;
    }
    unsigned seed = ac->seed ? ac->seed : 1;
    const float q_amp = ac->q_amp > 0.0f ? ac->q_amp : 1.0f;
    for (size_t i = 0; i < (size_t)n_blocks * c->block_floats; i++) c->kv_pool[i] = ac_rand(&seed);
    for (size_t i = 0; i < (size_t)r->n_rows * c->q_dim; i++) c->q[i] = q_amp * ac_rand(&seed);
    /* physical blocks scattered: logical block j of sequence s gets a stride-coprime slot */
    int next = 0, row = 0;
    for (int s = 0; s < ac->n_seqs; s++) {
        const int n = ac->ctx[s] + ac->rows[s], nb = (n + bs - 1) / bs;
        for (int j = 0; j < r->stride; j++) r->table[s * r->stride + j] = 0;
        for (int j = 0; j < nb; j++) r->table[s * r->stride + j] = next + (j * 7 + 3) % nb;
        /* (j*7+3) % nb is a permutation when nb is not a multiple of 7 */
        if (nb % 7 == 0)
            for (int j = 0; j < nb; j++) r->table[s * r->stride + j] = next + nb - 1 - j;
        next += nb;
        r->query_start[s] = row;
        r->seq_len[s] = n;
        for (int i = 0; i < ac->rows[s]; i++) r->positions[row++] = ac->ctx[s] + i;
    }
    r->query_start[ac->n_seqs] = row;
    r->b = (eng_batch){.n_tokens = r->n_rows,
                       .positions = r->positions,
                       .n_seqs = ac->n_seqs,
                       .query_start = r->query_start,
                       .seq_len = r->seq_len,
                       .block_table = r->table,
                       .block_table_stride = r->stride};
    c->b = &r->b;
    attn_run_tiles(r, TILE_ROWS);
    if (pool_start(&c->workers, threads, -1)) {
        attn_run_free(r);
        return -1;
    }
    r->pool_ok = 1;
    return 0;
}

/* Where the output of row (of the batch) for query head h starts. */
static inline const float *attn_run_out(const attn_run *r, int row, int h)
{
    return r->c.att + (size_t)row * r->c.q_dim + (size_t)h * r->c.head_size;
}

/* Multiply-adds of the case that attention needs (q·k and p·v over the visible positions
 * of every row and query head), times 2: its FLOPs. */
static inline double attn_run_flops(const attn_run *r)
{
    double pairs = 0;
    for (int i = 0; i < r->n_rows; i++) {
        const int p = r->positions[i];
        pairs += r->ac.window && p + 1 > r->ac.window ? r->ac.window : p + 1;
    }
    return pairs * r->ac.n_heads * r->ac.head_size * 4.0;
}

#endif
