/* SPDX-License-Identifier: MIT */
/*
 * perf/tsan_engine — the CPU engine's worker threads under ThreadSanitizer (make tsan).
 *
 * Criterion can not start under TSAN (Snaipe/Criterion#274), so this is a plain program:
 * it runs the same short schedule of mixed batches (prefill chunks of several sequences,
 * a prefill longer than one 32-row attention tile, decode rows beside prefill rows, one
 * sequence decoding alone, and eng_execute_sample) on an engine with 1 worker and on one with N workers (default 2),
 * and fails unless every step's logits agree (1e-4 relative, as tests/test_engine_inv.c)
 * and the greedy tokens are identical. TSAN itself reports any race in the worker pool
 * (it exits non-zero with TSAN's exitcode when it found one).
 *
 *   tsan_engine [--model SPEC] [--threads N] [--steps N]
 *
 * Prints one line per check; exit 0 when all passed.
 */
#include "kernels/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_SEQS     3
#define MAX_TOK    160
#define BLOCK      16
#define MAX_BLOCKS ((MAX_TOK + BLOCK - 1) / BLOCK)
#define TOL        1e-4

typedef struct seq {
    int32_t tokens[MAX_TOK];
    int n_tokens; /* known tokens: prompt, then generated */
    int n_cached; /* positions already in the KV pool */
    int32_t table[MAX_BLOCKS];
} seq;

/* One run's record: logits of every logits row of every step, and the final tokens. */
typedef struct record {
    float *logits;
    size_t n_floats;
    int32_t tokens[N_SEQS][MAX_TOK];
    int n_tokens[N_SEQS];
} record;

static int fail(const char *what, int err)
{
    fprintf(stderr, "tsan_engine: %s: %d %s\n", what, err, eng_errmsg());
    return -1;
}

static int32_t argmax(const float *v, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/*
 * One step: sequence i adds rows[i] rows (0 = not in this batch). Logits of each
 * participating sequence's last row are appended to rec; when a sequence has consumed all
 * its known tokens, the greedy token (or the sampled one when sample) is appended to it.
 */
static int step(eng *e, int vocab, seq *s, const int *rows, int sample, record *rec,
                size_t *rec_used)
{
    int32_t tokens[N_SEQS * MAX_TOK], pos[N_SEQS * MAX_TOK], qs[N_SEQS + 1], lens[N_SEQS];
    int32_t lrows[N_SEQS], table[N_SEQS * MAX_BLOCKS], who[N_SEQS];
    int64_t slots[N_SEQS * MAX_TOK];
    int T = 0, S = 0;
    for (int i = 0; i < N_SEQS; i++) {
        if (!rows[i]) continue;
        if (s[i].n_cached + rows[i] > s[i].n_tokens) {
            fprintf(stderr,
                    "tsan_engine: schedule bug: seq %d has %d uncached tokens, step "
                    "asks %d\n",
                    i, s[i].n_tokens - s[i].n_cached, rows[i]);
            return -1;
        }
        qs[S] = T;
        for (int r = 0; r < rows[i]; r++, T++) {
            int p = s[i].n_cached + r;
            tokens[T] = s[i].tokens[p];
            pos[T] = p;
            slots[T] = (int64_t)s[i].table[p / BLOCK] * BLOCK + p % BLOCK;
        }
        lens[S] = s[i].n_cached + rows[i];
        lrows[S] = T - 1;
        memcpy(table + (size_t)S * MAX_BLOCKS, s[i].table, sizeof s[i].table);
        who[S++] = i;
    }
    qs[S] = T;
    eng_batch b = {.n_tokens = T,
                   .tokens = tokens,
                   .positions = pos,
                   .slot_mapping = slots,
                   .n_seqs = S,
                   .query_start = qs,
                   .seq_len = lens,
                   .block_table = table,
                   .block_table_stride = MAX_BLOCKS,
                   .n_logits = S,
                   .logits_rows = lrows};
    float *lg = rec->logits + *rec_used;
    if (*rec_used + (size_t)S * vocab > rec->n_floats) {
        fprintf(stderr, "tsan_engine: record too small\n");
        return -1;
    }
    int32_t next[N_SEQS];
    int err;
    if (sample) {
        eng_sampling sp[N_SEQS];
        uint64_t rng[N_SEQS];
        for (int k = 0; k < S; k++) {
            sp[k] = (eng_sampling){.temperature = k ? 0.8f : 0.0f, .top_k = 20, .seed = 7 + k};
            rng[k] = eng_rng_init(sp[k].seed);
        }
        err = eng_execute_sample(e, &b, sp, rng, next, lg);
        if (err) return fail("eng_execute_sample", err);
    } else {
        err = eng_execute(e, &b, lg);
        if (err) return fail("eng_execute", err);
        for (int k = 0; k < S; k++) next[k] = argmax(lg + (size_t)k * vocab, vocab);
    }
    *rec_used += (size_t)S * vocab;
    for (int k = 0; k < S; k++) {
        seq *q = &s[who[k]];
        q->n_cached += rows[who[k]];
        if (q->n_cached == q->n_tokens && q->n_tokens < MAX_TOK) q->tokens[q->n_tokens++] = next[k];
    }
    return 0;
}

static int run(const eng_model *m, int threads, int decode_steps, record *rec)
{
    const eng_model_config *c = eng_model_cfg(m);
    eng_options o = {.backend = "cpu",
                     .n_threads = threads,
                     .numa_node = -1,
                     .kv_blocks = N_SEQS * MAX_BLOCKS,
                     .kv_block_size = BLOCK,
                     .max_batch_tokens = N_SEQS * MAX_TOK,
                     .max_seqs = N_SEQS};
    eng *e = NULL;
    int err = eng_create(m, &o, &e);
    if (err) return fail("eng_create", err);
    /* Prompts: A 20 tokens, B 17 (prefilled in two chunks), C 45 (more than one tile). */
    static const int plen[N_SEQS] = {20, 17, 45};
    seq s[N_SEQS];
    memset(s, 0, sizeof s);
    for (int i = 0; i < N_SEQS; i++) {
        for (int p = 0; p < plen[i]; p++)
            s[i].tokens[p] = (int32_t)(1 + (p * 37 + i * 101) % (c->vocab_size - 1));
        s[i].n_tokens = plen[i];
        for (int j = 0; j < MAX_BLOCKS; j++)
            s[i].table[j] = i * MAX_BLOCKS + (MAX_BLOCKS - 1 - j); /* scattered, reversed */
    }
    size_t used = 0;
    int r1[N_SEQS] = {20, 5, 0};  /* two prefills */
    int r2[N_SEQS] = {1, 12, 45}; /* decode + rest of B's prefill + C's long prefill */
    if (step(e, c->vocab_size, s, r1, 0, rec, &used) ||
        step(e, c->vocab_size, s, r2, 0, rec, &used))
        goto out_err;
    for (int k = 0; k < decode_steps; k++) { /* decode all three; every other one sampled */
        int r[N_SEQS] = {1, 1, 1};
        if (step(e, c->vocab_size, s, r, k % 2, rec, &used)) goto out_err;
    }
    for (int k = 0; k < decode_steps; k++) { /* A alone: a lone row's split regions */
        int r[N_SEQS] = {1, 0, 0};
        if (step(e, c->vocab_size, s, r, k % 2, rec, &used)) goto out_err;
    }
    for (int i = 0; i < N_SEQS; i++) {
        memcpy(rec->tokens[i], s[i].tokens, sizeof s[i].tokens);
        rec->n_tokens[i] = s[i].n_tokens;
    }
    rec->n_floats = used;
    eng_destroy(e);
    return 0;
out_err:
    eng_destroy(e);
    return -1;
}

int main(int argc, char **argv)
{
    const char *spec = "synthetic:gqa-test:3";
    int threads = 2, steps = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            spec = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: tsan_engine [--model SPEC] [--threads N] [--steps N]\n");
            return 2;
        }
    }
    if (threads < 2 || steps < 1 || steps > (MAX_TOK - 50) / 2) {
        fprintf(stderr, "tsan_engine: --threads must be >= 2, --steps in [1, %d]\n",
                (MAX_TOK - 50) / 2);
        return 2;
    }
    eng_model *m = NULL;
    int err = eng_model_load(spec, &m);
    if (err) {
        fail(spec, err);
        return 1;
    }
    int vocab = eng_model_cfg(m)->vocab_size;
    size_t cap = (size_t)(2 + 2 * steps) * N_SEQS * vocab;
    record ref = {.logits = malloc(cap * sizeof(float)), .n_floats = cap};
    record got = {.logits = malloc(cap * sizeof(float)), .n_floats = cap};
    int rc = 1;
    if (!ref.logits || !got.logits) {
        fprintf(stderr, "tsan_engine: out of memory\n");
        goto out;
    }
    if (run(m, 1, steps, &ref) || run(m, threads, steps, &got)) goto out;
    if (ref.n_floats != got.n_floats) {
        fprintf(stderr, "tsan_engine: %zu logits with 1 worker, %zu with %d\n", ref.n_floats,
                got.n_floats, threads);
        goto out;
    }
    double md = 0, ma = 1;
    size_t worst = 0;
    for (size_t i = 0; i < ref.n_floats; i++) {
        double d = fabs((double)ref.logits[i] - got.logits[i]);
        if (d > md) {
            md = d;
            worst = i;
        }
        if (fabs(ref.logits[i]) > ma) ma = fabs(ref.logits[i]);
    }
    if (md / ma > TOL) {
        fprintf(stderr,
                "tsan_engine: %d workers: logit %zu is %.6g, 1 worker %.6g (rel %.3g > %g)\n",
                threads, worst, got.logits[worst], ref.logits[worst], md / ma, TOL);
        goto out;
    }
    for (int i = 0; i < N_SEQS; i++)
        if (ref.n_tokens[i] != got.n_tokens[i] ||
            memcmp(ref.tokens[i], got.tokens[i], sizeof(int32_t) * ref.n_tokens[i])) {
            fprintf(stderr,
                    "tsan_engine: %d workers: sequence %d's tokens differ from 1 worker's\n",
                    threads, i);
            goto out;
        }
    printf("tsan_engine: %s, %d workers vs 1: %d mixed batches, %zu logits agree (max rel %.2g), "
           "tokens identical\n",
           spec, threads, 2 + 2 * steps, ref.n_floats, md / ma);
    rc = 0;
out:
    free(ref.logits);
    free(got.logits);
    eng_model_free(m);
    return rc;
}
