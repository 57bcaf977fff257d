/* SPDX-License-Identifier: MIT */
/*
 * tests/engine_test_util.h — a tiny sequence manager for engine tests (header only, so it
 * is not linked into every test program): sequences with their tokens, a block table into
 * the engine's pool, and batches built from any mix of prefill chunks and decode rows.
 */
#ifndef RINGLM_TESTS_ENGINE_TEST_UTIL_H
#define RINGLM_TESTS_ENGINE_TEST_UTIL_H

#include "kernels/batch.h"
#include "kernels/engine.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/helpers.h"

#ifndef TS_MAX_TOKENS
#define TS_MAX_TOKENS 1024
#endif
#ifndef TS_MAX_BLOCKS
#define TS_MAX_BLOCKS 128
#endif
#ifndef TS_MAX_SEQS
#define TS_MAX_SEQS 16
#endif

typedef struct tseq {
    int32_t tokens[TS_MAX_TOKENS]; /* prompt, then generated */
    int n_tokens;
    int n_cached;                 /* positions whose K/V are in the pool */
    int32_t table[TS_MAX_BLOCKS]; /* logical block → physical block */
    /* its prompt length as the daemon gives it (eng_batch.prompt_len): 0 after ts_seq_init,
     * every row generated (exact float32 on the CPU backend) */
    int n_prompt;
} tseq;

/* Path under $RINGLM_SHARED/models, or NULL (and the test skips) when absent. */
static inline const char *ts_model_file(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/models/%s", th_shared_dir(), name);
    FILE *f = fopen(buf, "rb");
    if (!f) return NULL;
    fclose(f);
    return buf;
}

/* A CPU engine; prompt_exact: prompt rows in exact float32 too (eng_options). */
static inline eng *ts_engine_mode(const eng_model *m, int blocks, int block_size, int threads,
                                  bool prompt_exact)
{
    eng_options o = {.backend = "cpu",
                     .n_threads = threads,
                     .numa_node = -1,
                     .kv_blocks = blocks,
                     .kv_block_size = block_size,
                     .max_batch_tokens = 1024,
                     .max_seqs = TS_MAX_SEQS,
                     .prompt_exact = prompt_exact};
    eng *e = NULL;
    int err = eng_create(m, &o, &e);
    cr_assert_eq(err, 0, "eng_create: %d %s", err, eng_errmsg());
    return e;
}

static inline eng *ts_engine(const eng_model *m, int blocks, int block_size, int threads)
{
    return ts_engine_mode(m, blocks, block_size, threads, false);
}

/* Table with blocks first, first+1, ... */
static inline void ts_seq_init(tseq *s, const int32_t *prompt, int n, int first_block)
{
    memset(s, 0, sizeof *s);
    memcpy(s->tokens, prompt, (size_t)n * sizeof *prompt);
    s->n_tokens = n;
    for (int j = 0; j < TS_MAX_BLOCKS; j++) s->table[j] = first_block + j;
}

/*
 * One engine step: sequence seqs[i] adds rows[i] rows (its next uncached tokens); logits of
 * each sequence's last row go to logits[i * vocab]. Returns the eng_execute result.
 */
static inline int ts_step(eng *e, const eng_model_config *c, tseq **seqs, const int *rows,
                          int n_seqs, float *logits)
{
    eng_batch_builder bb;
    cr_assert_eq(eng_bb_init(&bb, 1024, TS_MAX_SEQS, TS_MAX_BLOCKS, eng_kv_block_size(e)), 0, "%s",
                 eng_errmsg());
    cr_assert_leq(n_seqs, TS_MAX_SEQS);
    for (int i = 0; i < n_seqs; i++) {
        tseq *s = seqs[i];
        cr_assert_leq(s->n_cached + rows[i], s->n_tokens,
                      "sequence %d: %d rows but only %d "
                      "uncached tokens",
                      i, rows[i], s->n_tokens - s->n_cached);
        int err = eng_bb_add(&bb, s->tokens, (uint32_t)s->n_cached, (uint32_t)rows[i], s->table,
                             TS_MAX_BLOCKS, true);
        cr_assert_eq(err, 0, "sequence %d: %s", i, eng_errmsg());
        cr_assert_eq(eng_bb_set_prompt(&bb, (uint32_t)s->n_prompt), 0, "%s", eng_errmsg());
    }
    (void)c;
    int err = eng_execute(e, eng_bb_batch(&bb), logits);
    eng_bb_free(&bb);
    if (err == 0)
        for (int i = 0; i < n_seqs; i++) seqs[i]->n_cached += rows[i];
    return err;
}

static inline int32_t ts_argmax(const float *v, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* Largest |a-b| relative to the largest |a| (at least 1). */
static inline double ts_rel_diff(const float *a, const float *b, int n)
{
    double md = 0, ma = 1;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md) md = d;
        if (fabs(a[i]) > ma) ma = fabs(a[i]);
    }
    return md / ma;
}

/*
 * Greedy generation of one sequence alone: the uncached part is prefilled in chunks of
 * `chunk` rows (0 = all at once), then `steps` tokens are decoded. The logits after each
 * sampled position go to step_logits[k * vocab] when not NULL.
 */
static inline void ts_generate(eng *e, const eng_model_config *c, tseq *s, int chunk, int steps,
                               float *step_logits)
{
    float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
    tseq *one[1] = {s};
    while (s->n_cached < s->n_tokens) {
        int rows = s->n_tokens - s->n_cached;
        if (chunk > 0 && rows > chunk) rows = chunk;
        int err = ts_step(e, c, one, &rows, 1, logits);
        cr_assert_eq(err, 0, "prefill: %s", eng_errmsg());
    }
    for (int k = 0; k < steps; k++) {
        if (k > 0) {
            int rows = 1;
            int err = ts_step(e, c, one, &rows, 1, logits);
            cr_assert_eq(err, 0, "decode: %s", eng_errmsg());
        }
        if (step_logits)
            memcpy(step_logits + (size_t)k * c->vocab_size, logits,
                   (size_t)c->vocab_size * sizeof *logits);
        s->tokens[s->n_tokens++] = ts_argmax(logits, c->vocab_size);
    }
    free(logits);
}

#endif
