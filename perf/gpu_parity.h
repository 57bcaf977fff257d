/* SPDX-License-Identifier: MIT */
/*
 * perf/gpu_parity.h — the CUDA backend's parity and invariance checks (DESIGN.md §8), shared
 * by perf/gpu_bench (the H200 check), tests/test_cuda_backend.c and tests/test_cuda_gguf.c.
 * Header only, plain C, no test framework: each check fills a gp_result (pass, the measured
 * figure, a detail line).
 *
 * Sequences are driven through eng_execute / eng_execute_sample with the same metadata on
 * the CPU and CUDA engines. Tolerances: logits relative L2 (||a - b|| / ||b||) <= 1e-2 for
 * CUDA (bf16) against the CPU (fp32); GP_INV_TOL for invariances inside the CUDA backend,
 * where only the GEMM shapes (and so cuBLAS's reduction order) differ; byte equality for
 * swaps, block permutation and device-generated weights.
 */
#ifndef RINGLM_PERF_GPU_PARITY_H
#define RINGLM_PERF_GPU_PARITY_H

#include "kernels/batch.h"
#include "kernels/engine.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define GP_MAX_TOK    1024
#define GP_MAX_BLK    128
#define GP_MAX_SEQS   8
#define GP_PARITY_TOL 1e-2
#define GP_INV_TOL    5e-3

typedef struct gp_result {
    char name[48];
    int pass;     /* 1 pass, 0 fail, -1 skipped */
    double value; /* the figure the check is judged on */
    char detail[320];
} gp_result;

static inline void gp_set(gp_result *r, const char *name, int pass, double value, const char *fmt,
                          ...) __attribute__((format(printf, 5, 6)));
static inline void gp_set(gp_result *r, const char *name, int pass, double value, const char *fmt,
                          ...)
{
    snprintf(r->name, sizeof r->name, "%s", name);
    r->pass = pass;
    r->value = value;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof r->detail, fmt, ap);
    va_end(ap);
}

typedef struct gp_seq {
    int32_t tokens[GP_MAX_TOK];
    int n_tokens;
    int n_cached;
    int32_t table[GP_MAX_BLK];
} gp_seq;

static inline void gp_seq_init(gp_seq *s, const int32_t *prompt, int n, int first_block)
{
    memset(s, 0, sizeof *s);
    memcpy(s->tokens, prompt, (size_t)n * sizeof *prompt);
    s->n_tokens = n;
    for (int j = 0; j < GP_MAX_BLK; j++) s->table[j] = first_block + j;
}

/* An engine of `backend` over m with `blocks` KV blocks of bs tokens and the harness's batch
 * limits (GP_MAX_TOK rows, GP_MAX_SEQS sequences): eng_create's result, *e set on success
 * (NULL otherwise). */
/* The CUDA options every engine this harness creates gets (gpu_bench --cuda-dtype,
 * --no-cuda-graphs; the defaults otherwise). */
static struct {
    eng_cuda_dtype dtype;
    bool no_graphs;
} gp_cuda;

static inline int gp_engine_create(const eng_model *m, const char *backend, int blocks, int bs,
                                   eng **e)
{
    eng_options o = {.backend = backend,
                     .n_threads = 2,
                     .numa_node = -1,
                     .kv_blocks = blocks,
                     .kv_block_size = bs,
                     .max_batch_tokens = GP_MAX_TOK,
                     .max_seqs = GP_MAX_SEQS,
                     .cuda_dtype = gp_cuda.dtype,
                     .cuda_no_graphs = gp_cuda.no_graphs};
    *e = NULL;
    return eng_create(m, &o, e);
}

/* gp_engine_create, or NULL with the reason on stderr. */
static inline eng *gp_engine(const eng_model *m, const char *backend, int blocks, int bs)
{
    eng *e;
    int err = gp_engine_create(m, backend, blocks, bs, &e);
    if (err) {
        fprintf(stderr, "gpu_parity: eng_create(%s): %d %s\n", backend, err, eng_errmsg());
        return NULL;
    }
    return e;
}

/* One step: seqs[i] adds rows[i] rows (its next uncached tokens); the logits of each
 * sequence's last row go to logits[i * vocab]. With samp (and toks), samples on the engine
 * (eng_execute_sample) into toks[i]. Returns the engine's result. */
static inline int gp_step_ex(eng *e, gp_seq **seqs, const int *rows, int n_seqs, float *logits,
                             const eng_sampling *samp, uint64_t *rng, int32_t *toks)
{
    eng_batch_builder bb;
    int err = eng_bb_init(&bb, GP_MAX_TOK, GP_MAX_SEQS, GP_MAX_BLK, eng_kv_block_size(e));
    if (err) return err;
    for (int i = 0; i < n_seqs; i++) {
        gp_seq *s = seqs[i];
        if (s->n_cached + rows[i] > s->n_tokens) {
            eng_bb_free(&bb);
            return eng_seterr(-EINVAL, "gp_step: sequence %d: %d rows, %d uncached", i, rows[i],
                              s->n_tokens - s->n_cached);
        }
        err = eng_bb_add(&bb, s->tokens, (uint32_t)s->n_cached, (uint32_t)rows[i], s->table,
                         GP_MAX_BLK, true);
        if (err) {
            eng_bb_free(&bb);
            return err;
        }
    }
    const eng_batch *b = eng_bb_batch(&bb);
    err = samp ? eng_execute_sample(e, b, samp, rng, toks, logits) : eng_execute(e, b, logits);
    eng_bb_free(&bb);
    if (err == 0)
        for (int i = 0; i < n_seqs; i++) seqs[i]->n_cached += rows[i];
    return err;
}

static inline int gp_step(eng *e, gp_seq **seqs, const int *rows, int n_seqs, float *logits)
{
    return gp_step_ex(e, seqs, rows, n_seqs, logits, NULL, NULL, NULL);
}

static inline int32_t gp_argmax(const float *v, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* ||a - b|| / ||b|| over n values (b the reference). */
static inline double gp_rel_l2(const float *a, const float *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline void gp_rand_tokens(int32_t *t, int n, int vocab, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < n; i++) {
        x = eng_splitmix64(x);
        t[i] = (int32_t)(3 + x % (uint64_t)(vocab - 3)); /* no BOS/EOS-like ids */
    }
}

/* ---- reference greedy (stories260K) ---------------------------------------------------- */

/* Every case of reference-greedy.json on the engine: prefill the prompt in one batch, then
 * greedy decode sampled on the engine (eng_execute_sample, temperature 0); the tokens must
 * equal generated_tokens, the engine's argmax must equal the host argmax of the logits it
 * returned, and the logits oracle (positions 0..7) must agree within GP_PARITY_TOL. */
static inline void gp_check_reference(eng *e, const eng_model *m, const char *json_path,
                                      gp_result *tok_res, gp_result *logit_res)
{
    const int vocab = eng_model_cfg(m)->vocab_size;
    json_error_t jerr;
    json_t *root = json_load_file(json_path, 0, &jerr);
    if (!root) {
        gp_set(tok_res, "greedy_reference", -1, 0, "cannot read %s: %s", json_path, jerr.text);
        gp_set(logit_res, "logits_oracle", -1, 0, "cannot read %s", json_path);
        return;
    }
    float *logits = malloc((size_t)vocab * sizeof(float));
    gp_seq *s = malloc(sizeof *s);
    json_t *cases = json_object_get(root, "cases");
    int n_cases = (int)json_array_size(cases), ok_cases = 0, host_dev_mismatch = 0;
    char first_bad[200] = "";
    for (int ci = 0; ci < n_cases && logits && s; ci++) {
        json_t *c = json_array_get(cases, (size_t)ci);
        json_t *pt = json_object_get(c, "prompt_tokens"),
               *gt = json_object_get(c, "generated_tokens");
        int np = (int)json_array_size(pt), ng = (int)json_array_size(gt);
        int stopped = json_is_true(json_object_get(c, "stopped_on_bos"));
        int32_t prompt[GP_MAX_TOK];
        for (int i = 0; i < np && i < GP_MAX_TOK; i++)
            prompt[i] = (int32_t)json_integer_value(json_array_get(pt, (size_t)i));
        gp_seq_init(s, prompt, np, 0);
        int rows = np, good = 1;
        for (int step = 0; step <= ng && good; step++) {
            if (step == ng && !stopped) break;
            eng_sampling sp = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 0};
            uint64_t rng = eng_rng_init(1);
            int32_t tok = -1;
            gp_seq *one[1] = {s};
            int err = gp_step_ex(e, one, &rows, 1, logits, &sp, &rng, &tok);
            if (err) {
                snprintf(first_bad, sizeof first_bad, "case %d step %d: execute: %s", ci, step,
                         eng_errmsg());
                good = 0;
                break;
            }
            if (tok != gp_argmax(logits, vocab)) host_dev_mismatch++;
            int32_t want = step < ng ? (int32_t)json_integer_value(json_array_get(gt, (size_t)step))
                                     : 1; /* stopped on BOS */
            if (tok != want) {
                good = 0;
                if (!first_bad[0]) {
                    float a = logits[want], b = logits[tok];
                    snprintf(first_bad, sizeof first_bad,
                             "case %d (\"%s\") step %d: got %d want "
                             "%d (logit gap %.4g)",
                             ci, json_string_value(json_object_get(c, "prompt")), step, tok, want,
                             (double)(b - a));
                }
                break;
            }
            if (s->n_tokens >= GP_MAX_TOK) break;
            s->tokens[s->n_tokens++] = tok;
            rows = 1;
        }
        ok_cases += good;
    }
    gp_set(tok_res, "greedy_reference", ok_cases == n_cases && n_cases > 0 && !host_dev_mismatch,
           ok_cases, "%d/%d cases exact; device argmax != host argmax %d times%s%s", ok_cases,
           n_cases, host_dev_mismatch, first_bad[0] ? "; first divergence: " : "", first_bad);

    /* logits oracle: token by token */
    json_t *lo = json_object_get(json_object_get(root, "logits_oracle"), "positions");
    double worst = 0;
    int n_pos = (int)json_array_size(lo), worst_pos = -1;
    int32_t toks[64];
    for (int p = 0; p < n_pos && p < 64; p++)
        toks[p] = (int32_t)json_integer_value(
            json_object_get(json_array_get(lo, (size_t)p), "input_token"));
    float *want = malloc((size_t)vocab * sizeof(float));
    if (s && logits && want && n_pos > 0) {
        gp_seq_init(s, toks, n_pos < 64 ? n_pos : 64, 0);
        for (int p = 0; p < n_pos && p < 64; p++) {
            int one_row = 1;
            gp_seq *one[1] = {s};
            if (gp_step(e, one, &one_row, 1, logits)) {
                worst = INFINITY;
                break;
            }
            json_t *arr = json_object_get(json_array_get(lo, (size_t)p), "logits");
            for (int i = 0; i < vocab; i++)
                want[i] = (float)json_real_value(json_array_get(arr, (size_t)i));
            double d = gp_rel_l2(logits, want, vocab);
            if (d > worst) {
                worst = d;
                worst_pos = p;
            }
        }
    }
    gp_set(logit_res, "logits_oracle", n_pos > 0 && worst <= GP_PARITY_TOL, worst,
           "max relative L2 vs run.c logits over %d positions: %.3g (at pos %d; tol %.0e)", n_pos,
           worst, worst_pos, GP_PARITY_TOL);
    free(want);
    free(logits);
    free(s);
    json_decref(root);
}

/* ---- CPU vs CUDA on the same mixed batches ---------------------------------------------- */

/* Three sequences (prompts of 37, 5 and 300 tokens — at most seq_len - 25 —: partial blocks,
 * a short one, and one long enough for split-K decode) prefilled in one mixed batch, then 24 decode steps fed
 * with the CPU's greedy tokens; the worst per-row relative L2 and the greedy agreement. */
static inline void gp_check_cpu_parity_tol(eng *cpu, eng *gpu, const eng_model *m, double tol,
                                           gp_result *r)
{
    const int vocab = eng_model_cfg(m)->vocab_size, seq = eng_model_cfg(m)->seq_len;
    /* the long prompt is cut to leave the 25 steps room in a short context (quant-test: 256) */
    const int plen[3] = {37, 5, 300 < seq - 25 ? 300 : seq - 25};
    gp_seq *a = calloc(3, sizeof *a), *b = calloc(3, sizeof *b);
    float *la = malloc(3 * (size_t)vocab * sizeof(float)),
          *lb = malloc(3 * (size_t)vocab * sizeof(float));
    double worst = 0;
    int agree = 0, total = 0, err = 0;
    if (!a || !b || !la || !lb) {
        gp_set(r, "cpu_parity", 0, 0, "out of memory");
        goto out;
    }
    for (int i = 0; i < 3; i++) {
        int32_t p[300];
        gp_rand_tokens(p, plen[i], vocab, 100 + i);
        gp_seq_init(&a[i], p, plen[i], i * 40);
        gp_seq_init(&b[i], p, plen[i], i * 40 + 7); /* other physical blocks on purpose */
    }
    gp_seq *sa[3] = {&a[0], &a[1], &a[2]}, *sb[3] = {&b[0], &b[1], &b[2]};
    int rows[3] = {plen[0], plen[1], plen[2]};
    for (int step = 0; step < 25 && !err; step++) {
        if ((err = gp_step(cpu, sa, rows, 3, la)) || (err = gp_step(gpu, sb, rows, 3, lb))) break;
        for (int i = 0; i < 3; i++) {
            double d = gp_rel_l2(lb + (size_t)i * vocab, la + (size_t)i * vocab, vocab);
            if (d > worst) worst = d;
            int32_t ta = gp_argmax(la + (size_t)i * vocab, vocab);
            agree += ta == gp_argmax(lb + (size_t)i * vocab, vocab);
            total++;
            a[i].tokens[a[i].n_tokens++] = ta;
            b[i].tokens[b[i].n_tokens++] = ta;
            rows[i] = 1;
        }
    }
    if (err)
        gp_set(r, "cpu_parity", 0, 0, "execute: %s", eng_errmsg());
    else
        gp_set(r, "cpu_parity", worst <= tol, worst,
               "max relative L2 CUDA vs CPU %.3g over %d rows (tol %.0e); greedy agree %d/%d",
               worst, total, tol, agree, total);
out:
    free(a);
    free(b);
    free(la);
    free(lb);
}

static inline void gp_check_cpu_parity(eng *cpu, eng *gpu, const eng_model *m, gp_result *r)
{
    gp_check_cpu_parity_tol(cpu, gpu, m, GP_PARITY_TOL, r);
}

/* The logits tolerance of CUDA against the CPU for a GGUF file whose projections are of
 * type `wtype`: GP_PARITY_TOL where both compute with the file's values (F32, F16, BF16);
 * 3x that for Q8_0, Q4_K and Q6_K, where the CPU dots 8-bit-quantized activations with the
 * quantized weights (kernels/cpu/quant.h) and CUDA bf16 activations with bf16 weights. */
static inline double gp_gguf_tol(int wtype)
{
    return wtype == ENG_W_F32 || wtype == ENG_W_F16 || wtype == ENG_W_BF16 ? GP_PARITY_TOL
                                                                           : 3 * GP_PARITY_TOL;
}

/* ---- greedy generation, each backend on its own (GGUF files) ------------------------------ */

/* A 23-token prompt prefilled in one batch, then `steps` greedy tokens sampled on each
 * engine (eng_execute_sample, temperature 0), each backend fed its own picks. Passes when
 * the two token sequences are equal; the detail names the first step where they part and
 * the CPU's logit margin between the two picks there (a near tie is bf16 rounding, a wide
 * margin a bug). */
static inline void gp_check_greedy_match(eng *cpu, eng *gpu, const eng_model *m, int steps,
                                         gp_result *r)
{
    const int vocab = eng_model_cfg(m)->vocab_size;
    gp_seq *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    float *la = malloc((size_t)vocab * sizeof(float)), *lb = malloc((size_t)vocab * sizeof(float));
    int err = 0, same = 0, first_diff = -1;
    double margin = 0;
    if (steps > GP_MAX_TOK - 24) steps = GP_MAX_TOK - 24;
    if (!a || !b || !la || !lb) {
        gp_set(r, "greedy_match", 0, 0, "out of memory");
        goto out;
    }
    int32_t prompt[23];
    gp_rand_tokens(prompt, 23, vocab, 77);
    gp_seq_init(a, prompt, 23, 0);
    gp_seq_init(b, prompt, 23, 3); /* other physical blocks on purpose */
    int ra = 23, rb = 23;
    for (int step = 0; step < steps; step++) {
        eng_sampling sp = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 0};
        uint64_t rng_a = eng_rng_init(1), rng_b = eng_rng_init(1);
        int32_t ta = -1, tb = -1;
        gp_seq *sa[1] = {a}, *sb[1] = {b};
        if ((err = gp_step_ex(cpu, sa, &ra, 1, la, &sp, &rng_a, &ta)) ||
            (err = gp_step_ex(gpu, sb, &rb, 1, lb, &sp, &rng_b, &tb)))
            break;
        if (ta == tb && first_diff < 0)
            same++;
        else if (first_diff < 0) {
            first_diff = step;
            margin = (double)la[ta] - la[tb];
        }
        a->tokens[a->n_tokens++] = ta;
        b->tokens[b->n_tokens++] = tb;
        ra = rb = 1;
    }
    if (err)
        gp_set(r, "greedy_match", 0, 0, "execute: %s", eng_errmsg());
    else if (first_diff < 0)
        gp_set(r, "greedy_match", 1, same, "%d/%d greedy tokens equal to the CPU backend's", same,
               steps);
    else
        gp_set(r, "greedy_match", 0, same,
               "tokens equal up to step %d of %d; there the CPU "
               "picks %d, CUDA %d, CPU logit margin %.4g",
               first_diff, steps, a->tokens[23 + first_diff], b->tokens[23 + first_diff], margin);
out:
    free(a);
    free(b);
    free(la);
    free(lb);
}

/* ---- invariances inside one backend ----------------------------------------------------- */

/* Runs sequence `prompt` (n tokens) through engine e: prefill in chunks of `chunk` rows (0:
 * one shot), then `decode` greedy steps; keeps every step's logits (after the prefill and
 * after each decode) in out[(decode + 1) * vocab]. Other sequences, when n_others > 0, ride
 * along in the same batches (decoding after a prefill of their own). first_block: where the
 * sequence's blocks start; perm: optional block permutation applied to its table. */
static inline int gp_run_seq(eng *e, int vocab, const int32_t *prompt, int n, int chunk, int decode,
                             int n_others, int first_block, const int32_t *perm, float *out)
{
    gp_seq *s = calloc((size_t)n_others + 1, sizeof *s);
    float *lg = malloc(((size_t)n_others + 1) * (size_t)vocab * sizeof(float));
    int err = 0;
    if (!s || !lg) {
        err = -ENOMEM;
        goto out;
    }
    gp_seq_init(&s[0], prompt, n, first_block);
    if (perm)
        for (int j = 0; j < GP_MAX_BLK; j++) s[0].table[j] = perm[j];
    for (int o = 1; o <= n_others; o++) {
        int32_t p[64];
        gp_rand_tokens(p, 20 + 9 * o, vocab, 500 + (uint64_t)o);
        gp_seq_init(&s[o], p, 20 + 9 * o, 60 + 10 * o);
    }
    gp_seq *all[GP_MAX_SEQS];
    int rows[GP_MAX_SEQS];
    for (int i = 0; i <= n_others; i++) all[i] = &s[i];
    int produced = 0;
    while (produced <= decode) {
        int ns = 0;
        for (int i = 0; i <= n_others; i++) {
            int left = s[i].n_tokens - s[i].n_cached;
            int r = left;
            if (i == 0 && chunk > 0 && r > chunk) r = chunk;
            if (i > 0 && r == 0) {
                /* the others keep decoding their own greedy continuation */
                continue;
            }
            all[ns] = &s[i];
            rows[ns++] = r;
        }
        if ((err = gp_step(e, all, rows, ns, lg))) goto out;
        for (int k = 0; k < ns; k++) {
            gp_seq *q = all[k];
            if (q->n_cached < q->n_tokens) continue; /* mid-prefill: no token yet */
            int32_t t = gp_argmax(lg + (size_t)k * vocab, vocab);
            if (q == &s[0]) {
                memcpy(out + (size_t)produced * vocab, lg + (size_t)k * vocab,
                       (size_t)vocab * sizeof(float));
                produced++;
            }
            if (q->n_tokens < GP_MAX_TOK) q->tokens[q->n_tokens++] = t;
        }
    }
out:
    free(s);
    free(lg);
    return err;
}

/* Alone vs in a mixed batch; block permutation; chunked prefill vs one shot vs token by
 * token. res[0..3]. */
static inline void gp_check_invariance(eng *e, const eng_model *m, gp_result *res)
{
    const int vocab = eng_model_cfg(m)->vocab_size, n = 45, dec = 12;
    const size_t sz = (size_t)(dec + 1) * vocab;
    float *base = malloc(sz * sizeof(float)), *other = malloc(sz * sizeof(float));
    int32_t prompt[45], perm[GP_MAX_BLK];
    gp_rand_tokens(prompt, n, vocab, 42);
    if (!base || !other) {
        gp_set(&res[0], "inv_mixed_batch", 0, 0, "out of memory");
        goto out;
    }
    int err = gp_run_seq(e, vocab, prompt, n, 0, dec, 0, 0, NULL, base);
    if (err) {
        gp_set(&res[0], "inv_mixed_batch", 0, 0, "execute: %s", eng_errmsg());
        goto out;
    }
    /* mixed: three other sequences prefill and decode in the same batches */
    err = gp_run_seq(e, vocab, prompt, n, 0, dec, 3, 0, NULL, other);
    double d = err ? INFINITY : gp_rel_l2(other, base, (int)sz);
    gp_set(&res[0], "inv_mixed_batch", !err && d <= GP_INV_TOL, d,
           "alone vs with 3 others: relative L2 %.3g over %d steps (tol %.0e)%s", d, dec + 1,
           GP_INV_TOL, err ? eng_errmsg() : "");
    /* permuted physical blocks (reversed, spread over the pool) */
    for (int j = 0; j < GP_MAX_BLK; j++) perm[j] = (int32_t)(40 - j > 10 ? 40 - j : 100 + j);
    err = gp_run_seq(e, vocab, prompt, n, 0, dec, 0, 0, perm, other);
    d = err ? INFINITY : gp_rel_l2(other, base, (int)sz);
    gp_set(&res[1], "inv_block_permutation", !err && d == 0.0, d,
           "permuted block table: relative L2 %.3g (want exactly 0: same shapes)", d);
    /* chunked prefill (7 rows at a time) */
    err = gp_run_seq(e, vocab, prompt, n, 7, dec, 0, 0, NULL, other);
    d = err ? INFINITY : gp_rel_l2(other, base, (int)sz);
    gp_set(&res[2], "inv_chunked_prefill", !err && d <= GP_INV_TOL, d,
           "prefill in chunks of 7 vs one shot: relative L2 %.3g (tol %.0e)", d, GP_INV_TOL);
    /* token by token */
    err = gp_run_seq(e, vocab, prompt, n, 1, dec, 0, 0, NULL, other);
    d = err ? INFINITY : gp_rel_l2(other, base, (int)sz);
    gp_set(&res[3], "inv_token_by_token", !err && d <= GP_INV_TOL, d,
           "prefill token by token vs one shot: relative L2 %.3g (tol %.0e)", d, GP_INV_TOL);
out:
    free(base);
    free(other);
}

/* Waits until the eventfd counts `want` completions (deadline 10 s). */
static inline int gp_wait_efd(int efd, uint64_t want)
{
    uint64_t got = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (got < want) {
        struct pollfd p = {.fd = efd, .events = POLLIN};
        int rc = poll(&p, 1, 1000);
        if (rc > 0) {
            uint64_t v;
            if (read(efd, &v, sizeof v) == (ssize_t)sizeof v) got += v;
        }
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (t1.tv_sec - t0.tv_sec > 10) return -ETIMEDOUT;
    }
    return 0;
}

/* Swap out then in, byte-exact: after a prefill of 40 tokens (3 blocks at 16), the blocks
 * go out with eng_kv_transfer_async to host memory of kind `kind` (0 malloc: bounce buffer;
 * 1 memfd mapping: registered by the backend), come back into other blocks, and must read
 * back identical; decoding on from the moved blocks gives the very same logits as from the
 * original ones. */
static inline void gp_check_swap(eng *e, const eng_model *m, int kind, gp_result *r)
{
    const int vocab = eng_model_cfg(m)->vocab_size, bs = eng_kv_block_size(e);
    const size_t bb = eng_kv_block_bytes(e);
    const char *name = kind ? "swap_roundtrip_memfd" : "swap_roundtrip_malloc";
    int32_t prompt[40];
    gp_rand_tokens(prompt, 40, vocab, 77);
    const int nb = (40 + bs - 1) / bs;
    int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    uint8_t *host = NULL, *orig = NULL, *back = NULL;
    int memfd = -1;
    float *l1 = malloc((size_t)vocab * 4 * sizeof(float)), *l2 = l1 ? l1 + 2 * vocab : NULL;
    gp_seq *s = calloc(2, sizeof *s);
    int err = 0;
    size_t total = (size_t)nb * bb;
    if (efd < 0 || !l1 || !s) {
        gp_set(r, name, 0, 0, "eventfd/malloc failed");
        goto out;
    }
    if (kind) {
        memfd = memfd_create("gpu_parity_kv", MFD_CLOEXEC);
        if (memfd < 0 || ftruncate(memfd, (off_t)total) != 0) {
            gp_set(r, name, 0, 0, "memfd_create failed");
            goto out;
        }
        host = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
        if (host == MAP_FAILED) {
            host = NULL;
            gp_set(r, name, 0, 0, "mmap failed");
            goto out;
        }
    } else {
        host = malloc(total);
    }
    orig = malloc(total);
    back = malloc(total);
    if (!host || !orig || !back) {
        gp_set(r, name, 0, 0, "out of memory");
        goto out;
    }
    memset(host, 0xA5, total);
    gp_seq_init(&s[0], prompt, 40, 2);
    int rows = 40;
    gp_seq *one[1] = {&s[0]};
    if ((err = gp_step(e, one, &rows, 1, l1))) goto fail_exec;
    int32_t blocks[8], moved[8];
    void *ptrs[8];
    for (int j = 0; j < nb; j++) {
        blocks[j] = s[0].table[j];
        moved[j] = 90 + 3 * j; /* not contiguous: one copy per block */
        ptrs[j] = host + (size_t)j * bb;
        if ((err = eng_kv_read_block(e, blocks[j], orig + (size_t)j * bb))) goto fail_exec;
    }
    if ((err = eng_kv_transfer_async(e, ENG_KV_OUT, blocks, ptrs, nb, efd)) ||
        (err = gp_wait_efd(efd, 1)))
        goto fail_exec;
    if (memcmp(host, orig, total) != 0) {
        gp_set(r, name, 0, 1, "swap-out bytes differ from eng_kv_read_block");
        goto out;
    }
    if ((err = eng_kv_transfer_async(e, ENG_KV_IN, moved, ptrs, nb, efd)) ||
        (err = gp_wait_efd(efd, 1)))
        goto fail_exec;
    for (int j = 0; j < nb; j++)
        if ((err = eng_kv_read_block(e, moved[j], back + (size_t)j * bb))) goto fail_exec;
    if (memcmp(back, orig, total) != 0) {
        gp_set(r, name, 0, 1, "swap-in bytes differ from the swapped-out block");
        goto out;
    }
    /* decode one step from each copy (same shapes): identical logits */
    s[1] = s[0];
    for (int j = 0; j < nb; j++) s[1].table[j] = moved[j];
    int32_t next = gp_argmax(l1, vocab);
    s[0].tokens[s[0].n_tokens++] = next;
    s[1].tokens[s[1].n_tokens++] = next;
    s[1].table[nb] = 120; /* the next block, if the step crosses into one */
    s[0].table[nb] = 121;
    rows = 1;
    gp_seq *o0[1] = {&s[0]}, *o1[1] = {&s[1]};
    if ((err = gp_step(e, o0, &rows, 1, l1)) || (err = gp_step(e, o1, &rows, 1, l2)))
        goto fail_exec;
    double d = gp_rel_l2(l2, l1, vocab);
    gp_set(r, name, d == 0.0, d,
           "%d blocks of %zu bytes out and in byte-exact; decode from "
           "moved blocks: relative L2 %.3g (want 0)",
           nb, bb, d);
    goto out;
fail_exec:
    if (err == -ENOTSUP)
        gp_set(r, name, -1, 0, "%s", eng_errmsg()); /* a backend without async transfers */
    else
        gp_set(r, name, 0, 0, "error %d: %s", err, eng_errmsg());
out:
    /* A memfd mapping stays mapped: the backend registered it with the driver for the
     * engine's lifetime (as the daemon's host tier is), and an address range reused by a
     * later mapping must not look registered. It is small (a few blocks). */
    if (!kind) free(host);
    if (memfd >= 0) close(memfd);
    if (efd >= 0) close(efd);
    free(orig);
    free(back);
    free(l1);
    free(s);
}

/* Recompute: a sequence that generated 10 tokens greedily, re-prefilled from scratch (its
 * prompt + generated tokens in one shot, in fresh blocks), continues with the same greedy
 * tokens as the original for 10 more steps. */
static inline void gp_check_recompute(eng *e, const eng_model *m, gp_result *r)
{
    const int vocab = eng_model_cfg(m)->vocab_size;
    int32_t prompt[30];
    gp_rand_tokens(prompt, 30, vocab, 9);
    gp_seq *s = calloc(2, sizeof *s);
    float *lg = malloc((size_t)vocab * sizeof(float));
    int err = 0, same = 0;
    if (!s || !lg) {
        gp_set(r, "recompute_greedy", 0, 0, "out of memory");
        goto out;
    }
    gp_seq_init(&s[0], prompt, 30, 0);
    int rows = 30;
    gp_seq *a[1] = {&s[0]}, *b[1] = {&s[1]};
    for (int i = 0; i < 20; i++) {
        if ((err = gp_step(e, a, &rows, 1, lg))) goto fail;
        s[0].tokens[s[0].n_tokens++] = gp_argmax(lg, vocab);
        rows = 1;
        if (i == 9) s[1] = s[0]; /* snapshot of the tokens after 10 generated */
    }
    {
        int32_t snap[GP_MAX_TOK]; /* gp_seq_init clears the sequence before copying */
        int n = s[1].n_tokens;
        memcpy(snap, s[1].tokens, (size_t)n * sizeof *snap);
        gp_seq_init(&s[1], snap, n, 50);
    }
    rows = s[1].n_tokens;
    for (int i = 10; i < 20; i++) {
        if ((err = gp_step(e, b, &rows, 1, lg))) goto fail;
        int32_t t = gp_argmax(lg, vocab);
        same += t == s[0].tokens[30 + i];
        s[1].tokens[s[1].n_tokens++] = s[0].tokens[30 + i]; /* follow the original */
        rows = 1;
    }
    gp_set(r, "recompute_greedy", same == 10, same,
           "recomputed sequence agrees on %d/10 greedy "
           "tokens",
           same);
    goto out;
fail:
    gp_set(r, "recompute_greedy", 0, 0, "execute: %s", eng_errmsg());
out:
    free(s);
    free(lg);
}

/* Device sampling vs eng_sample on the very logits the engine returned: temperature / top-k
 * / top-p settings, equal rng streams. */
static inline void gp_check_sampling(eng *e, const eng_model *m, gp_result *r)
{
    const int vocab = eng_model_cfg(m)->vocab_size;
    static const eng_sampling modes[] = {{0.0f, 0, 1.0f, 1, NULL},  {0.8f, 0, 1.0f, 2, NULL},
                                         {1.0f, 40, 1.0f, 3, NULL}, {0.9f, 0, 0.9f, 4, NULL},
                                         {0.7f, 20, 0.8f, 5, NULL}, {1.3f, 0, 0.5f, 6, NULL}};
    const int n_modes = (int)(sizeof modes / sizeof modes[0]);
    gp_seq *s = calloc(GP_MAX_SEQS, sizeof *s);
    float *lg = malloc((size_t)n_modes * vocab * sizeof(float));
    int agree = 0, total = 0, rng_ok = 1, err = 0;
    if (!s || !lg) {
        gp_set(r, "device_sampling", 0, 0, "out of memory");
        goto out;
    }
    gp_seq *all[GP_MAX_SEQS];
    int rows[GP_MAX_SEQS];
    uint64_t rng[GP_MAX_SEQS], host_rng[GP_MAX_SEQS];
    for (int i = 0; i < n_modes; i++) {
        int32_t p[16];
        gp_rand_tokens(p, 16, vocab, 900 + (uint64_t)i);
        gp_seq_init(&s[i], p, 16, 20 * i);
        all[i] = &s[i];
        rows[i] = 16;
        rng[i] = host_rng[i] = eng_rng_init(modes[i].seed);
    }
    for (int step = 0; step < 16; step++) {
        int32_t toks[GP_MAX_SEQS];
        if ((err = gp_step_ex(e, all, rows, n_modes, lg, modes, rng, toks))) goto fail;
        for (int i = 0; i < n_modes; i++) {
            int32_t want = eng_sample(lg + (size_t)i * vocab, vocab, &modes[i], &host_rng[i]);
            agree += want == toks[i];
            total++;
            rng_ok &= host_rng[i] == rng[i];
            s[i].tokens[s[i].n_tokens++] = want;
            rows[i] = 1;
        }
    }
    /* sums run in a different order on the device: allow a rare boundary flip */
    gp_set(r, "device_sampling", rng_ok && agree >= total - 2, agree,
           "device sample == eng_sample on the same logits %d/%d; rng streams %s", agree, total,
           rng_ok ? "equal" : "DIFFER");
    goto out;
fail:
    gp_set(r, "device_sampling", 0, 0, "execute: %s", eng_errmsg());
out:
    free(s);
    free(lg);
}

/* The same batch on two engines must give bit-identical logits (e.g. device-generated
 * weights vs weights converted from the host copy of the same synthetic model). */
static inline void gp_check_identical(eng *x, eng *y, const eng_model *m, const char *name,
                                      gp_result *r)
{
    const int vocab = eng_model_cfg(m)->vocab_size;
    int32_t prompt[50];
    gp_rand_tokens(prompt, 50, vocab, 3);
    float *a = malloc(6 * (size_t)vocab * sizeof(float)),
          *b = malloc(6 * (size_t)vocab * sizeof(float));
    int err = (!a || !b) ? -ENOMEM : 0;
    if (!err) err = gp_run_seq(x, vocab, prompt, 50, 0, 5, 0, 0, NULL, a);
    if (!err) err = gp_run_seq(y, vocab, prompt, 50, 0, 5, 0, 0, NULL, b);
    double d = err ? INFINITY : gp_rel_l2(a, b, 6 * vocab);
    gp_set(r, name, !err && d == 0.0, d, "relative L2 %.3g over 6 steps (want exactly 0)%s%s", d,
           err ? ": " : "", err ? eng_errmsg() : "");
    free(a);
    free(b);
}

#endif
