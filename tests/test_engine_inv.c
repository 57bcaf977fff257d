/* SPDX-License-Identifier: MIT */
/*
 * Engine invariances (DESIGN.md §8) on the CPU backend, on the real stories260K model when
 * $RINGLM_SHARED has it and always on synthetic shapes (GQA included):
 *   alone = inside a mixed batch; physical block ids do not matter; chunked prefill =
 *   one-shot prefill = token-by-token decode; blocks copied out and back (elsewhere) are
 *   byte-exact and generation continues identically; recompute from tokens continues the
 *   same. Plus batch validation, sampling and engine creation errors.
 */
#define TS_MAX_SEQS 40 /* a batch of 33 decode rows (the experts' test) */
#include "engine_test_util.h"
#include "gguf_test_util.h"
#include "kernels/cpu/gemm_small.h"

#include <errno.h>

#define TOL 1e-4

static eng_model *load(const char *spec)
{
    eng_model *m = NULL;
    int err = eng_model_load(spec, &m);
    cr_assert_eq(err, 0, "%s: %s", spec, eng_errmsg());
    return m;
}

/* The models every invariance runs on: synthetic GQA with its own classifier, a synthetic
 * multi-head shape, and the real model when present. */
static int models(eng_model **out)
{
    int n = 0;
    out[n++] = load("synthetic:gqa-test:11");
    out[n++] = load("synthetic:stories260K:4");
    char path[1024];
    if (ts_model_file(path, sizeof path, "stories260K.bin")) out[n++] = load(path);
    return n;
}

static void prompt_of(int32_t *p, int n, int vocab, int salt)
{
    p[0] = 1;
    for (int i = 1; i < n; i++) p[i] = (int32_t)(3 + (i * 37 + salt * 101) % (vocab - 3));
}

/* ---- alone vs mixed batch ---------------------------------------------------------------- */

Test(engine_inv, alone_equals_inside_a_mixed_batch)
{
    eng_model *ms[3];
    int nm = models(ms);
    for (int mi = 0; mi < nm; mi++) {
        const eng_model_config *c = eng_model_cfg(ms[mi]);
        const int V = c->vocab_size, steps = 12, plen = 21;
        int32_t prompt[64];
        prompt_of(prompt, plen, V, 1);
        float *alone = malloc((size_t)steps * V * sizeof(float));
        eng *e = ts_engine(ms[mi], 64, 8, 2);
        tseq a;
        ts_seq_init(&a, prompt, plen, 0);
        ts_generate(e, c, &a, 0, steps, alone);
        eng_destroy(e);

        /* Mixed: A prefills in chunks of 8 while B decodes and C prefills a long prompt
         * in chunks of 13, then everything decodes together. */
        e = ts_engine(ms[mi], 64, 8, 2);
        tseq A, B, C;
        int32_t pb[64], pc[64];
        prompt_of(pb, 5, V, 2);
        prompt_of(pc, 40, V, 3);
        ts_seq_init(&A, prompt, plen, 20);
        ts_seq_init(&B, pb, 5, 0);
        ts_seq_init(&C, pc, 40, 40);
        float *lg = malloc((size_t)3 * V * sizeof(float));
        tseq *one[1] = {&B};
        int r5 = 5;
        cr_assert_eq(ts_step(e, c, one, &r5, 1, lg), 0, "%s", eng_errmsg());
        B.tokens[B.n_tokens++] = ts_argmax(lg, V);
        int gen = 0;
        while (gen < steps) {
            tseq *batch[3];
            int rows[3], n = 0, a_index = -1;
            if (A.n_cached < A.n_tokens) {
                int left = A.n_tokens - A.n_cached;
                rows[n] = left > 8 ? 8 : left;
                a_index = n;
                batch[n++] = &A;
            }
            if (B.n_tokens < 60) {
                rows[n] = 1;
                batch[n++] = &B;
            }
            if (C.n_cached < C.n_tokens) {
                int left = C.n_tokens - C.n_cached;
                rows[n] = left > 13 ? 13 : left;
                batch[n++] = &C;
            }
            /* keep the three in different orders across steps */
            if (n == 3 && gen % 2) {
                tseq *t = batch[0];
                batch[0] = batch[2];
                batch[2] = t;
                int r = rows[0];
                rows[0] = rows[2];
                rows[2] = r;
                if (a_index == 0) a_index = 2;
            }
            cr_assert_eq(ts_step(e, c, batch, rows, n, lg), 0, "%s", eng_errmsg());
            for (int i = 0; i < n; i++) {
                tseq *s = batch[i];
                if (s->n_cached < s->n_tokens)
                    continue; /* mid-prefill: its logits are not a sampling point */
                int32_t next = ts_argmax(lg + (size_t)i * V, V);
                if (s == &A) {
                    double d = ts_rel_diff(alone + (size_t)gen * V, lg + (size_t)i * V, V);
                    cr_assert_leq(d, TOL,
                                  "model %d step %d: mixed-batch logits differ by %.3g "
                                  "(relative)",
                                  mi, gen, d);
                    cr_assert_eq(next, a.tokens[plen + gen],
                                 "model %d step %d: token %d alone, "
                                 "%d mixed",
                                 mi, gen, a.tokens[plen + gen], next);
                    gen++;
                }
                s->tokens[s->n_tokens++] = next;
            }
            (void)a_index;
        }
        free(lg);
        free(alone);
        eng_destroy(e);
        eng_model_free(ms[mi]);
    }
}

/* The sequence of prompt[0] decoding alone and the same sequence decoding among n_seqs - 1
 * others (each prefilled alone first): the same logits to the bit at every step, and so the
 * same greedy tokens. */
static void decode_alone_vs_batch(eng_model *m, int n_seqs, const char *what)
{
    enum { MAX_SEQS = 11, STEPS = 6, PLEN = 19 };
    const eng_model_config *c = eng_model_cfg(m);
    const int V = c->vocab_size;
    int32_t prompt[MAX_SEQS][64];
    for (int i = 0; i < n_seqs; i++) prompt_of(prompt[i], PLEN + i, V, 20 + i);
    float *alone = malloc((size_t)STEPS * V * sizeof(float));
    float *lg = malloc((size_t)n_seqs * V * sizeof(float));
    eng *e = ts_engine(m, 128, 4, 2);
    static tseq a, s[MAX_SEQS];
    ts_seq_init(&a, prompt[0], PLEN, 0);
    ts_generate(e, c, &a, 0, STEPS, alone);
    eng_destroy(e);

    /* each sequence prefilled alone (the same prefill batch as above for s[0]), then all of
     * them decode together */
    e = ts_engine(m, 128, 4, 2);
    tseq *batch[MAX_SEQS];
    int rows[MAX_SEQS];
    for (int i = 0; i < n_seqs; i++) {
        ts_seq_init(&s[i], prompt[i], PLEN + i, 10 * i); /* 9 blocks of 4 each */
        tseq *one[1] = {&s[i]};
        int r = PLEN + i;
        cr_assert_eq(ts_step(e, c, one, &r, 1, lg), 0, "%s", eng_errmsg());
        s[i].tokens[s[i].n_tokens++] = ts_argmax(lg, V);
        batch[i] = &s[i];
        rows[i] = 1;
    }
    for (int k = 1; k < STEPS; k++) {
        cr_assert_eq(ts_step(e, c, batch, rows, n_seqs, lg), 0, "%s", eng_errmsg());
        cr_assert(memcmp(lg, alone + (size_t)k * V, (size_t)V * sizeof(float)) == 0,
                  "%s step %d: logits alone and in a batch of %d decode rows differ "
                  "(relative %.3g)",
                  what, k, n_seqs, ts_rel_diff(alone + (size_t)k * V, lg, V));
        for (int i = 0; i < n_seqs; i++)
            s[i].tokens[s[i].n_tokens++] = ts_argmax(lg + (size_t)i * V, V);
        cr_assert_eq(s[0].tokens[s[0].n_tokens - 1], a.tokens[PLEN + k],
                     "%s step %d: greedy "
                     "token %d alone, %d in the batch",
                     what, k, a.tokens[PLEN + k], s[0].tokens[s[0].n_tokens - 1]);
    }
    free(alone);
    free(lg);
    eng_destroy(e);
}

/* Decode rows of a small batch go through one matmul kernel that sums every output in the
 * same order whatever the batch (kernels/cpu/gemm_small.h), and attention is per row: a
 * sequence decoding alone and the same sequence decoding among 10 others give the same
 * logits to the bit, not just within a tolerance. */
Test(engine_inv, decode_alone_is_bit_identical_inside_a_small_decode_batch)
{
    eng_model *ms[3];
    int nm = models(ms);
    cr_assert_geq(gemm_small_max_rows(GEMM_SMALL_AUTO), 11,
                  "a batch of 11 rows goes "
                  "through SGEMM on this machine: not a small batch");
    for (int mi = 0; mi < nm; mi++) {
        char what[32];
        snprintf(what, sizeof what, "model %d", mi);
        decode_alone_vs_batch(ms[mi], 11, what);
        eng_model_free(ms[mi]);
    }
}

/* The same for weights kept quantized (GGUF Q8_0, Q4_K_M: Q4_K with Q6_K for the output, V
 * and feed-forward-down projections, Q3_K, Q2_K, IQ4_XS): one row alone and a batch of 8 take
 * different kernels on AVX-512 VNNI (kernels/cpu/quant.c: the weights dotted as they lie, or
 * repacked tiles), which end in the same integer sums and the same float steps, and the 8-bit
 * activations are quantized per row; so alone and in a batch of 8 are bit-identical too, on
 * every path. F16
 * and BF16 weights take gemm_small's arithmetic alone and in the batch alike (converted to
 * float tiles, or in registers). */
Test(engine_inv, quantized_gguf_decode_alone_is_bit_identical_inside_a_batch_of_8,
     .init = mk_tmpdir, .fini = rm_tmpdir)
{
    static const char *const types[] = {"Q8_0", "Q4_K_M", "F16", "BF16", "Q3_K", "Q2_K", "IQ4_XS"};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char path[512];
        snprintf(path, sizeof path, "%s/quant-test-%s.gguf", tmpdir, types[t]);
        export_gguf("synthetic:quant-test:3", NULL, types[t], NULL, path);
        eng_model *m = load(path);
        decode_alone_vs_batch(m, 8, types[t]);
        eng_model_free(m);
    }
}

/* A mixture of experts (qwen3moe: 8 experts, 2 a row): each row adds its experts' outputs in
 * the order of their ids (kernels/cpu/cpu.c moe_ffn), alone and in a batch: alone and in a
 * batch of 8, the same logits to the bit, with float and with quantized weights. */
Test(engine_inv, experts_decode_alone_is_bit_identical_inside_a_batch_of_8, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 300)
{
    static const char *const types[] = {"F32", "Q8_0", "Q4_0"};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char path[512], what[64];
        snprintf(path, sizeof path, "%s/moe-%s.gguf", tmpdir, types[t]);
        export_gguf_window("synthetic:gqa-test:12", NULL, types[t], "qwen3moe", 32, 0, path);
        eng_model *m = load(path);
        cr_assert_eq(eng_model_hparams_of(m)->n_expert_used, 2);
        snprintf(what, sizeof what, "qwen3moe %s", types[t]);
        decode_alone_vs_batch(m, 8, what);
        eng_model_free(m);
    }
}

/* Each of n_seqs sequences decoding alone on one worker, then all of them decoding together
 * on `threads` workers (each prefilled alone first): every row's logits the same bits. */
static void experts_alone_vs_batch(eng_model *m, int n_seqs, int threads, const char *what)
{
    enum { MAX_SEQS = 33, STEPS = 3, PLEN = 9 };
    const eng_model_config *c = eng_model_cfg(m);
    const int V = c->vocab_size;
    cr_assert_leq(n_seqs, MAX_SEQS);
    static int32_t prompt[MAX_SEQS][16];
    static tseq s[MAX_SEQS];
    float *alone = malloc((size_t)n_seqs * STEPS * V * sizeof(float));
    float *lg = malloc((size_t)n_seqs * V * sizeof(float));
    eng *e = ts_engine(m, 2 * MAX_SEQS, 16, 1);
    for (int i = 0; i < n_seqs; i++) { /* one block each: PLEN + 4 + STEPS <= 16 tokens */
        prompt_of(prompt[i], PLEN + i % 5, V, 40 + i);
        ts_seq_init(&s[i], prompt[i], PLEN + i % 5, 2 * i);
        ts_generate(e, c, &s[i], 0, STEPS, alone + (size_t)i * STEPS * V);
    }
    eng_destroy(e);
    e = ts_engine(m, 2 * MAX_SEQS, 16, threads);
    tseq *batch[MAX_SEQS];
    int rows[MAX_SEQS];
    for (int i = 0; i < n_seqs; i++) {
        ts_seq_init(&s[i], prompt[i], PLEN + i % 5, 2 * i);
        tseq *one[1] = {&s[i]};
        int r = s[i].n_tokens;
        cr_assert_eq(ts_step(e, c, one, &r, 1, lg), 0, "%s", eng_errmsg());
        s[i].tokens[s[i].n_tokens++] = ts_argmax(lg, V);
        batch[i] = &s[i];
        rows[i] = 1;
    }
    for (int k = 1; k < STEPS; k++) {
        cr_assert_eq(ts_step(e, c, batch, rows, n_seqs, lg), 0, "%s", eng_errmsg());
        for (int i = 0; i < n_seqs; i++) {
            const float *want = alone + ((size_t)i * STEPS + (size_t)k) * V;
            cr_assert(memcmp(lg + (size_t)i * V, want, (size_t)V * sizeof(float)) == 0,
                      "%s step %d: sequence %d alone on 1 worker and among %d decode rows on %d "
                      "differ (relative %.3g)",
                      what, k, i, n_seqs, threads, ts_rel_diff(want, lg + (size_t)i * V, V));
            s[i].tokens[s[i].n_tokens++] = ts_argmax(lg + (size_t)i * V, V);
        }
    }
    free(alone);
    free(lg);
    eng_destroy(e);
}

/* The experts of a layer run as one parallel region whose down products wait for their
 * expert's up products (kernels/cpu/cpu.c moe_ffn): whatever the batch (2 to 33 decode rows,
 * so from a few experts to all 8, one to many rows each) and the workers (1 to 3), a row's
 * logits are those it gets alone. A row alone on 2 workers takes one whole expert a task (its
 * 2 experts split evenly), on 3 the experts' chunks. gqa-test's experts are 172 wide (their
 * down products stay F16 in the quantized files), quant-test's 384 (every product
 * quantized). gqa-test's Q4_K_M is llama.cpp's mix of an 8-expert model: attn_output in
 * Q5_K, which with the other K types and IQ4_XS (quant-test's files) multiplies 33 rows, as
 * one, with the activations in Q8_K (kernels/cpu/quant.c q_int_path). */
Test(engine_inv, experts_decode_rows_alone_equal_any_batch_and_worker_count, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 300)
{
    static const struct {
        const char *spec, *type;
        int head_dim;
    } files[] = {{"synthetic:gqa-test:12", "F32", 32},    {"synthetic:gqa-test:12", "Q8_0", 32},
                 {"synthetic:gqa-test:12", "Q4_K_M", 32}, {"synthetic:gqa-test:12", "Q4_0", 32},
                 {"synthetic:quant-test:3", "Q8_0", 0},   {"synthetic:quant-test:3", "Q4_0", 0},
                 {"synthetic:quant-test:3", "Q5_K", 0},   {"synthetic:quant-test:3", "Q3_K", 0},
                 {"synthetic:quant-test:3", "Q2_K", 0},   {"synthetic:quant-test:3", "IQ4_XS", 0}};
    static const struct {
        int seqs, threads;
    } runs[] = {{33, 2}, {7, 3}, {2, 2}, {1, 2}, {1, 3}};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char path[512], what[96];
        snprintf(path, sizeof path, "%s/moe-%zu.gguf", tmpdir, f);
        export_gguf_window(files[f].spec, NULL, files[f].type, "qwen3moe", files[f].head_dim, 0,
                           path);
        eng_model *m = load(path);
        snprintf(what, sizeof what, "qwen3moe %s %s", files[f].spec, files[f].type);
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
            experts_alone_vs_batch(m, runs[r].seqs, runs[r].threads, what);
        eng_model_free(m);
    }
}

/* ---- physical block ids ----------------------------------------------------------------- */

Test(engine_inv, permuting_physical_blocks_changes_nothing)
{
    eng_model *ms[3];
    int nm = models(ms);
    for (int mi = 0; mi < nm; mi++) {
        const eng_model_config *c = eng_model_cfg(ms[mi]);
        const int V = c->vocab_size, steps = 10, plen = 30;
        int32_t prompt[64];
        prompt_of(prompt, plen, V, 5);
        float *l1 = malloc((size_t)steps * V * 4), *l2 = malloc((size_t)steps * V * 4);
        eng *e = ts_engine(ms[mi], 32, 4, 2);
        tseq s1, s2;
        ts_seq_init(&s1, prompt, plen, 0);
        ts_generate(e, c, &s1, 0, steps, l1);
        eng_destroy(e);
        e = ts_engine(ms[mi], 32, 4, 2);
        ts_seq_init(&s2, prompt, plen, 0);
        for (int j = 0; j < 32; j++) /* a scattered permutation of all 32 blocks */
            s2.table[j] = (j * 13 + 7) % 32;
        ts_generate(e, c, &s2, 0, steps, l2);
        eng_destroy(e);
        cr_assert(memcmp(s1.tokens, s2.tokens, sizeof(int32_t) * (plen + steps)) == 0,
                  "model %d: tokens differ", mi);
        cr_assert(memcmp(l1, l2, (size_t)steps * V * 4) == 0,
                  "model %d: logits not bit-identical under a block permutation (rel %.3g)", mi,
                  ts_rel_diff(l1, l2, steps * V));
        free(l1);
        free(l2);
        eng_model_free(ms[mi]);
    }
}

/* ---- chunked prefill -------------------------------------------------------------------- */

Test(engine_inv, chunked_prefill_equals_one_shot_equals_token_by_token)
{
    eng_model *ms[3];
    int nm = models(ms);
    const int chunks[] = {0, 1, 3, 7, 16, 33};
    for (int mi = 0; mi < nm; mi++) {
        const eng_model_config *c = eng_model_cfg(ms[mi]);
        const int V = c->vocab_size, steps = 8, plen = 45;
        int32_t prompt[64];
        prompt_of(prompt, plen, V, 9);
        float *ref = malloc((size_t)steps * V * 4), *got = malloc((size_t)steps * V * 4);
        tseq s0;
        for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
            eng *e = ts_engine(ms[mi], 16, 16, 2);
            tseq s;
            ts_seq_init(&s, prompt, plen, 0);
            ts_generate(e, c, &s, chunks[ci], steps, ci == 0 ? ref : got);
            eng_destroy(e);
            if (ci == 0) {
                s0 = s;
                continue;
            }
            double d = ts_rel_diff(ref, got, steps * V);
            cr_assert_leq(d, TOL, "model %d chunk %d: logits differ by %.3g from one-shot", mi,
                          chunks[ci], d);
            cr_assert(memcmp(s0.tokens, s.tokens, sizeof(int32_t) * (plen + steps)) == 0,
                      "model %d chunk %d: greedy tokens differ from one-shot", mi, chunks[ci]);
        }
        free(ref);
        free(got);
        eng_model_free(ms[mi]);
    }
}

/* Sliding windows (gemma2, gemma3, a Mistral-style llama file) of 8 positions over blocks of
 * 16: a tile of prefill rows, a chunk and a decode row each see the same window; and a
 * mixture of experts (qwen3moe) groups a batch's rows by expert: so chunked prefill, one-shot
 * prefill and token-by-token decode agree here too. */
Test(engine_inv, windows_and_experts_agree_chunked_one_shot_and_token_by_token, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 300)
{
    static const struct {
        const char *arch;
        int head_dim;
    } files[] = {{"gemma2", 64}, {"gemma3", 32}, {"llama", 0}, {"qwen3moe", 32}};
    const int chunks[] = {0, 1, 7, 33};
    for (size_t fi = 0; fi < sizeof files / sizeof files[0]; fi++) {
        char path[512];
        snprintf(path, sizeof path, "%s/w%zu.gguf", tmpdir, fi);
        export_gguf_window("synthetic:gqa-test:12", NULL, "F32", files[fi].arch, files[fi].head_dim,
                           8, path);
        eng_model *m = load(path);
        const eng_model_hparams *hp = eng_model_hparams_of(m);
        cr_assert_eq(hp->n_expert ? hp->n_expert_used : hp->swa_window, hp->n_expert ? 2 : 8, "%s",
                     files[fi].arch);
        const eng_model_config *c = eng_model_cfg(m);
        const int V = c->vocab_size, steps = 8, plen = 45;
        int32_t prompt[64];
        prompt_of(prompt, plen, V, 5);
        float *ref = malloc((size_t)steps * V * 4), *got = malloc((size_t)steps * V * 4);
        tseq s0;
        for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
            eng *e = ts_engine(m, 16, 16, 2);
            tseq s;
            ts_seq_init(&s, prompt, plen, 0);
            ts_generate(e, c, &s, chunks[ci], steps, ci == 0 ? ref : got);
            eng_destroy(e);
            if (ci == 0) {
                s0 = s;
                continue;
            }
            double d = ts_rel_diff(ref, got, steps * V);
            cr_assert_leq(d, TOL, "%s chunk %d: logits differ by %.3g from one-shot",
                          files[fi].arch, chunks[ci], d);
            cr_assert(memcmp(s0.tokens, s.tokens, sizeof(int32_t) * (plen + steps)) == 0,
                      "%s chunk %d: greedy tokens differ from one-shot", files[fi].arch,
                      chunks[ci]);
        }
        free(ref);
        free(got);
        eng_model_free(m);
    }
}

/* A model windowed on every layer (a Mistral-style llama file) runs with -1 in the block
 * table wherever a block lies wholly before the first row's window (given back by the
 * scheduler): the same logits as with the blocks there, since they are not read. A -1 the
 * window reads, or any -1 on a model with global layers (gemma2), is refused. */
Test(engine_inv, block_table_holes_only_behind_every_layers_window, .init = mk_tmpdir,
     .fini = rm_tmpdir)
{
    static const struct {
        const char *arch;
        int head_dim, window; /* eng_kv_window */
    } files[] = {{"llama", 0, 8}, {"gemma2", 64, 0}};
    for (size_t fi = 0; fi < sizeof files / sizeof files[0]; fi++) {
        char path[512];
        snprintf(path, sizeof path, "%s/h%zu.gguf", tmpdir, fi);
        export_gguf_window("synthetic:gqa-test:12", NULL, "F32", files[fi].arch, files[fi].head_dim,
                           8, path);
        eng_model *m = load(path);
        const eng_model_config *c = eng_model_cfg(m);
        const int V = c->vocab_size;
        eng *e = ts_engine(m, 24, 16, 2);
        cr_assert_eq(eng_kv_window(e), files[fi].window, "%s", files[fi].arch);
        int32_t prompt[64];
        prompt_of(prompt, 50, V, 3);
        tseq s;
        ts_seq_init(&s, prompt, 50, 0);
        ts_generate(e, c, &s, 0, 1, NULL); /* 50 positions cached; the next row is at 50 */
        /* the row at 50 reads positions 43..50: blocks 2 and 3 of 16; 0 and 1 are unread */
        tseq holes = s, bad = s;
        holes.table[0] = holes.table[1] = -1;
        bad.table[2] = -1;
        float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
        int one = 1;
        tseq *p = &bad;
        cr_assert_eq(ts_step(e, c, &p, &one, 1, a), -EINVAL, "%s: a -1 the window reads",
                     files[fi].arch);
        p = &holes;
        int err = ts_step(e, c, &p, &one, 1, b);
        cr_assert_eq(err, files[fi].window ? 0 : -EINVAL, "%s: -1 behind the window: %s",
                     files[fi].arch, err ? eng_errmsg() : "accepted");
        p = &s;
        cr_assert_eq(ts_step(e, c, &p, &one, 1, a), 0, "%s", eng_errmsg());
        if (files[fi].window)
            cr_assert(memcmp(a, b, (size_t)V * sizeof *a) == 0,
                      "the logits with the holes differ from those with every block");
        free(a);
        free(b);
        eng_destroy(e);
        eng_model_free(m);
    }
}

/* ---- blocks out and back in ------------------------------------------------------------- */

Test(engine_inv, blocks_copied_out_and_back_elsewhere_continue_identically)
{
    eng_model *ms[3];
    int nm = models(ms);
    for (int mi = 0; mi < nm; mi++) {
        const eng_model_config *c = eng_model_cfg(ms[mi]);
        const int V = c->vocab_size, plen = 37, steps = 10;
        int32_t prompt[64];
        prompt_of(prompt, plen, V, 7);
        eng *e = ts_engine(ms[mi], 24, 8, 2);
        const size_t bb = eng_kv_block_bytes(e);
        cr_assert_eq(bb, eng_kv_bytes_per_token(e) * 8);
        cr_assert_eq(bb, (size_t)c->n_layers * 2 * 8 * (c->dim / c->n_heads * c->n_kv_heads) * 4);

        tseq ref, s;
        ts_seq_init(&ref, prompt, plen, 0);
        ts_generate(e, c, &ref, 0, 4, NULL); /* ref: prefill + 4 tokens in blocks 0..5 */
        s = ref;
        /* swap out: the sequence's blocks to host buffers, through the pool pointer too */
        int nblk = (s.n_cached + 7) / 8;
        unsigned char *host = malloc(bb * (size_t)nblk);
        for (int j = 0; j < nblk; j++) {
            cr_assert_eq(eng_kv_read_block(e, s.table[j], host + bb * j), 0);
            cr_assert(memcmp(host + bb * j, eng_kv_block_ptr(e, s.table[j]), bb) == 0);
        }
        /* swap in elsewhere: blocks 12.. in reverse order */
        for (int j = 0; j < nblk; j++) {
            int32_t dst = 12 + (nblk - 1 - j);
            cr_assert_eq(eng_kv_write_block(e, dst, host + bb * j), 0);
            s.table[j] = dst;
        }
        for (int j = nblk; j < 8; j++) /* its future blocks are its own too */
            s.table[j] = 12 + j;
        for (int j = 0; j < nblk; j++)
            cr_assert(memcmp(eng_kv_block_ptr(e, s.table[j]), host + bb * j, bb) == 0,
                      "block %d not byte-exact after the round trip", j);
        /* both continue: the original in blocks 0.., the copy in blocks 12.. */
        float *l1 = malloc((size_t)steps * V * 4), *l2 = malloc((size_t)steps * V * 4);
        tseq s_orig = ref;
        ts_generate(e, c, &s_orig, 0, steps, l1);
        ts_generate(e, c, &s, 0, steps, l2);
        cr_assert(memcmp(s_orig.tokens, s.tokens, sizeof(int32_t) * (size_t)s.n_tokens) == 0,
                  "model %d: continuation after swap differs", mi);
        cr_assert(memcmp(l1, l2, (size_t)steps * V * 4) == 0,
                  "model %d: logits after swap not bit-identical", mi);

        /* in-pool copies too */
        int32_t src[2] = {0, 1}, dst[2] = {20, 21};
        cr_assert_eq(eng_kv_copy_blocks(e, src, dst, 2), 0);
        cr_assert(memcmp(eng_kv_block_ptr(e, 20), eng_kv_block_ptr(e, 0), bb) == 0);
        cr_assert_eq(eng_kv_read_block(e, 24, host), -EINVAL, "block outside the pool");
        cr_assert_eq(eng_kv_write_block(e, -1, host), -EINVAL);
        size_t len = 0;
        cr_assert_eq(eng_kv_pool_base(e, &len), eng_kv_block_ptr(e, 0));
        cr_assert_eq(len, bb * 24);
        cr_assert_eq(eng_kv_transfer_async(e, ENG_KV_OUT, src, NULL, 0, -1), -ENOTSUP);
        free(host);
        free(l1);
        free(l2);
        eng_destroy(e);
        eng_model_free(ms[mi]);
    }
}

/* The CPU backend's KV pool is advised onto transparent huge pages (a decode row reads a few
 * KiB from each of many pages of every block; on 4 KiB pages a long context's attention
 * walked the page tables): where the kernel's THP setting allows them, the pool's mapping
 * holds 2 MiB pages. */
Test(engine_inv, the_kv_pool_lies_on_huge_pages_where_the_kernel_allows_them)
{
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        if (!fgets(mode, sizeof mode, f)) mode[0] = 0;
        fclose(f);
        mode[strcspn(mode, "\n")] = 0;
    }
    if (!mode[0] || strstr(mode, "[never]"))
        cr_skip_test("transparent huge pages off here (%s)", mode[0] ? mode : "no setting");
    eng_model *m = load("synthetic:gqa-test:6");
    eng *probe = ts_engine(m, 1, 16, 1);
    const size_t bb = eng_kv_block_bytes(probe);
    eng_destroy(probe);
    const int blocks = (int)((16u << 20) / bb) + 1; /* 16 MiB: whole 2 MiB pages inside */
    eng *e = ts_engine(m, blocks, 16, 1);
    size_t len = 0;
    const uintptr_t base = (uintptr_t)eng_kv_pool_base(e, &len);
    f = fopen("/proc/self/smaps", "r");
    cr_assert(f, "cannot read /proc/self/smaps");
    char line[512];
    bool in_pool = false;
    long huge_kb = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in_pool = lo <= base && base < hi;
            continue;
        }
        if (in_pool && sscanf(line, "AnonHugePages: %ld kB", &huge_kb) == 1) break;
    }
    fclose(f);
    cr_assert_gt(huge_kb, 0,
                 "the KV pool (%zu bytes at %#lx) holds %ld kB of huge pages (THP setting: %s)",
                 len, (unsigned long)base, huge_kb, mode);
    eng_destroy(e);
    eng_model_free(m);
}

/* ---- recompute -------------------------------------------------------------------------- */

Test(engine_inv, recompute_from_tokens_continues_the_same)
{
    eng_model *ms[3];
    int nm = models(ms);
    for (int mi = 0; mi < nm; mi++) {
        const eng_model_config *c = eng_model_cfg(ms[mi]);
        const int V = c->vocab_size, plen = 17;
        int32_t prompt[64];
        prompt_of(prompt, plen, V, 3);
        eng *e = ts_engine(ms[mi], 32, 16, 2);
        tseq s;
        ts_seq_init(&s, prompt, plen, 0);
        ts_generate(e, c, &s, 0, 20, NULL); /* the full run: 20 tokens */
        /* preempted after 8 generated tokens: recompute prompt + 8 in fresh blocks */
        tseq r;
        ts_seq_init(&r, s.tokens, plen + 8, 10);
        ts_generate(e, c, &r, 0, 12, NULL);
        cr_assert(memcmp(s.tokens, r.tokens, sizeof(int32_t) * (plen + 20)) == 0,
                  "model %d: recomputed sequence continues differently", mi);
        eng_destroy(e);
        eng_model_free(ms[mi]);
    }
}

/* ---- batch validation ------------------------------------------------------------------- */

Test(engine_inv, batch_check_rejects_bad_batches)
{
    eng_model *m = load("synthetic:gqa-test:1");
    eng_options o = {.n_threads = 1,
                     .numa_node = -1,
                     .kv_blocks = 8,
                     .kv_block_size = 4,
                     .max_batch_tokens = 16,
                     .max_seqs = 2};
    eng *e;
    cr_assert_eq(eng_create(m, &o, &e), 0, "%s", eng_errmsg());
    int32_t tokens[3] = {1, 5, 9}, pos[3] = {0, 1, 2}, qs[2] = {0, 3}, len = 3, table[2] = {6, 2};
    int32_t lrows[1] = {2};
    int64_t slots[3] = {24, 25, 26};
    float *logits = malloc(512 * 4);
#define BATCH                                                                                      \
    (eng_batch){.n_tokens = 3,                                                                     \
                .tokens = tokens,                                                                  \
                .positions = pos,                                                                  \
                .slot_mapping = slots,                                                             \
                .n_seqs = 1,                                                                       \
                .query_start = qs,                                                                 \
                .seq_len = &len,                                                                   \
                .block_table = table,                                                              \
                .block_table_stride = 2,                                                           \
                .n_logits = 1,                                                                     \
                .logits_rows = lrows}
    eng_batch b = BATCH;
    cr_assert_eq(eng_batch_check(e, &b), 0, "the good batch: %s", eng_errmsg());
    cr_assert_eq(eng_execute(e, &b, logits), 0);
#define REJECT(stmt, needle)                                                                       \
    do {                                                                                           \
        eng_batch bb = BATCH;                                                                      \
        int32_t t2[3] = {1, 5, 9}, p2[3] = {0, 1, 2}, q2[3] = {0, 3, 3}, l2 = 3, tb2[2] = {6, 2};  \
        int32_t lr2[1] = {2};                                                                      \
        int64_t s2[3] = {24, 25, 26};                                                              \
        bb.tokens = t2;                                                                            \
        bb.positions = p2;                                                                         \
        bb.query_start = q2;                                                                       \
        bb.seq_len = &l2;                                                                          \
        bb.block_table = tb2;                                                                      \
        bb.logits_rows = lr2;                                                                      \
        bb.slot_mapping = s2;                                                                      \
        stmt;                                                                                      \
        int err = eng_batch_check(e, &bb);                                                         \
        cr_assert_eq(err, -EINVAL, "%s: accepted (%d)", #stmt, err);                               \
        cr_assert(strstr(eng_errmsg(), needle), "%s: message \"%s\" lacks \"%s\"", #stmt,          \
                  eng_errmsg(), needle);                                                           \
        cr_assert_eq(eng_execute(e, &bb, logits), -EINVAL);                                        \
    } while (0)
    REJECT(t2[1] = 512, "vocabulary has 512");
    REJECT(t2[0] = -1, "token 0 is -1");
    REJECT(tb2[0] = 8, "block_table[0][0]=8");
    REJECT(tb2[0] = -3, "block_table[0][0]=-3");
    REJECT(l2 = 9, "block_table_stride=2");
    REJECT(l2 = 600, "seq_len[0]=600");
    REJECT(p2[2] = 5, "positions[2]=5");
    REJECT(s2[1] = 3, "slot_mapping[1]=3");
    REJECT(s2[1] = 1000, "slot_mapping[1]=1000");
    REJECT(bb.n_tokens = 17, "n_tokens=17");
    REJECT(bb.n_tokens = 0, "n_tokens=0");
    REJECT(bb.n_seqs = 3, "n_seqs=3");
    REJECT(q2[1] = 2, "query_start");
    REJECT(lr2[0] = 3, "logits_rows[0]=3");
    REJECT(bb.n_logits = 4, "n_logits=4");
    REJECT(bb.tokens = NULL, "required");
    REJECT((bb.n_seqs = 2, q2[1] = 3, q2[2] = 3), "query_start[1]=3");
    cr_assert_eq(eng_execute(e, &b, NULL), -EINVAL, "logits wanted, no buffer");
    /* two sequences whose tables share block 6, both computing position 1 in it: one slot
     * written twice. The same batch with the second sequence in block 7 is fine. */
    {
        int32_t t3[3] = {1, 5, 9}, p3[3] = {0, 1, 1}, q3[3] = {0, 2, 3}, l3[2] = {2, 2};
        int32_t tb3[4] = {6, 2, 7, 3}, lr3[2] = {1, 2};
        int64_t s3[3] = {24, 25, 29};
        eng_batch b3 = {.n_tokens = 3,
                        .tokens = t3,
                        .positions = p3,
                        .slot_mapping = s3,
                        .n_seqs = 2,
                        .query_start = q3,
                        .seq_len = l3,
                        .block_table = tb3,
                        .block_table_stride = 2,
                        .n_logits = 2,
                        .logits_rows = lr3};
        cr_assert_eq(eng_batch_check(e, &b3), 0, "distinct blocks: %s", eng_errmsg());
        tb3[2] = 6;
        s3[2] = 25;
        cr_assert_eq(eng_batch_check(e, &b3), -EINVAL, "one slot written by two rows was accepted");
        cr_assert(strstr(eng_errmsg(), "slot_mapping[1] and [2] are both slot 25"), "%s",
                  eng_errmsg());
        cr_assert_eq(eng_execute(e, &b3, logits), -EINVAL);
    }
    free(logits);
    eng_destroy(e);
    eng_model_free(m);
}

/* ---- sampling --------------------------------------------------------------------------- */

Test(engine_inv, sampling_is_reproducible_and_respects_its_settings)
{
    float logits[100];
    for (int i = 0; i < 100; i++)
        logits[i] = (float)((i * 37) % 100) / 10.0f; /* max 9.9 at i where i*37%100 == 99 */
    int best = 0;
    for (int i = 1; i < 100; i++)
        if (logits[i] > logits[best]) best = i;
    eng_sampling greedy = {0};
    uint64_t rng = eng_rng_init(1);
    cr_assert_eq(eng_sample(logits, 100, &greedy, &rng), best);
    float ties[4] = {1, 3, 3, 2};
    cr_assert_eq(eng_sample(ties, 4, &greedy, &rng), 1, "first index wins ties");

    eng_sampling warm = {.temperature = 1.0f, .seed = 7};
    int32_t a[200], b[200];
    uint64_t r1 = eng_rng_init(7), r2 = eng_rng_init(7), r3 = eng_rng_init(8);
    int same_other_seed = 0, distinct = 0;
    bool seen[100] = {0};
    for (int i = 0; i < 200; i++) {
        a[i] = eng_sample(logits, 100, &warm, &r1);
        b[i] = eng_sample(logits, 100, &warm, &r2);
        same_other_seed += eng_sample(logits, 100, &warm, &r3) == a[i];
        cr_assert(a[i] >= 0 && a[i] < 100);
        if (!seen[a[i]]) {
            seen[a[i]] = true;
            distinct++;
        }
    }
    cr_assert(memcmp(a, b, sizeof a) == 0, "same seed, same tokens");
    cr_assert_lt(same_other_seed, 150, "another seed gives another stream");
    cr_assert_gt(distinct, 3, "temperature 1 explores");

    eng_sampling k1 = {.temperature = 5.0f, .top_k = 1};
    eng_sampling p_small = {.temperature = 5.0f, .top_p = 1e-6f};
    eng_sampling k3 = {.temperature = 100.0f, .top_k = 3};
    eng_sampling p_half = {.temperature = 1.0f, .top_p = 0.5f};
    int top3[3] = {best, -1, -1};
    for (int i = 0, n = 1; i < 100; i++) /* the next two largest */
        if (logits[i] >= 9.7f && i != best) top3[n++] = i;
    for (int i = 0; i < 300; i++) {
        cr_assert_eq(eng_sample(logits, 100, &k1, &r1), best, "top-k 1 is greedy");
        cr_assert_eq(eng_sample(logits, 100, &p_small, &r1), best, "tiny top-p is greedy");
        int32_t t = eng_sample(logits, 100, &k3, &r1);
        cr_assert(t == top3[0] || t == top3[1] || t == top3[2], "top-k 3 chose %d", t);
        int32_t u = eng_sample(logits, 100, &p_half, &r1);
        cr_assert_geq(logits[u], 9.0f, "top-p 0.5 chose token %d with logit %.1f", u, logits[u]);
    }
}

/* ---- engine creation -------------------------------------------------------------------- */

Test(engine_inv, create_errors_are_clear)
{
    eng_model *m = load("synthetic:gqa-test:1");
    eng_options o = {.n_threads = 2,
                     .numa_node = -1,
                     .kv_blocks = 4,
                     .kv_block_size = 16,
                     .max_batch_tokens = 16,
                     .max_seqs = 2};
    eng *e;
    eng_options bad = o;
    bad.kv_blocks = 0;
    cr_assert_eq(eng_create(m, &bad, &e), -EINVAL);
    cr_assert(strstr(eng_errmsg(), "kv_blocks"));
    bad = o;
    bad.backend = "tpu";
    cr_assert_eq(eng_create(m, &bad, &e), -EINVAL);
    cr_assert(strstr(eng_errmsg(), "tpu"));
    /* the CUDA options are checked whatever the backend: a typo is not silently ignored */
    bad = o;
    bad.cuda_device = -1;
    cr_assert_eq(eng_create(m, &bad, &e), -EINVAL);
    cr_assert(strstr(eng_errmsg(), "cuda_device"), "%s", eng_errmsg());
    bad = o;
    bad.cuda_dtype = ENG_CUDA_DTYPE__COUNT;
    cr_assert_eq(eng_create(m, &bad, &e), -EINVAL);
    cr_assert(strstr(eng_errmsg(), "cuda_dtype"), "%s", eng_errmsg());
    cr_assert_eq(eng_cuda_dtype_parse("fp32"), ENG_CUDA_DTYPE_FP32);
    cr_assert_eq(eng_cuda_dtype_parse("bf16"), ENG_CUDA_DTYPE_BF16);
    cr_assert_eq(eng_cuda_dtype_parse("fp16"), -1);
    bad = o;
    bad.backend = "cuda";
    setenv("RINGLM_CUDA_LIB", "/nonexistent/libringlm_cuda.so", 1);
    int err = eng_create(m, &bad, &e);
    if (err != -ENODEV) /* a real plugin beside the binary may exist on a GPU host */
        cr_assert_eq(err, 0, "cuda: %d %s", err, eng_errmsg());
    else
        cr_assert(strstr(eng_errmsg(), "cuda"), "%s", eng_errmsg());
    if (err == 0) eng_destroy(e);
    cr_assert_eq(eng_create(m, &o, &e), 0, "%s", eng_errmsg());
    cr_assert_str_eq(eng_backend_name(e), "cpu");
    cr_assert_eq(eng_kv_blocks(e), 4);
    cr_assert_eq(eng_kv_block_size(e), 16);
    cr_assert_geq(eng_memory_bytes(e), eng_kv_block_bytes(e) * 4);
    eng_phase_stats ps;
    cr_assert_eq(eng_phase_stats_get(e, &ps, true), 0);
    eng_destroy(e);
    eng_model_free(m);
}

/* eng_execute_sample = eng_execute + eng_sample per logits row, with or without a logits
 * buffer from the caller (the daemon passes none). */
Test(engine_inv, execute_sample_matches_execute_then_sample)
{
    eng_model *m = load("synthetic:gqa-test:2");
    const eng_model_config *c = eng_model_cfg(m);
    const int V = c->vocab_size;
    eng *e1 = ts_engine(m, 16, 16, 2), *e2 = ts_engine(m, 16, 16, 2);
    int32_t tokens[6] = {1, 7, 9, 1, 44, 45}, pos[6] = {0, 1, 2, 0, 1, 2};
    int32_t qs[3] = {0, 3, 6}, lens[2] = {3, 3}, table[4] = {0, 1, 2, 3}, rows[2] = {2, 5};
    int64_t slots[6] = {0, 1, 2, 32, 33, 34};
    eng_batch b = {.n_tokens = 6,
                   .tokens = tokens,
                   .positions = pos,
                   .slot_mapping = slots,
                   .n_seqs = 2,
                   .query_start = qs,
                   .seq_len = lens,
                   .block_table = table,
                   .block_table_stride = 2,
                   .n_logits = 2,
                   .logits_rows = rows};
    float *lg = malloc((size_t)2 * V * sizeof(float));
    cr_assert_eq(eng_execute(e1, &b, lg), 0, "%s", eng_errmsg());
    eng_sampling samp[2] = {{.temperature = 0}, {.temperature = 0.9f, .top_k = 20, .seed = 5}};
    uint64_t rng_a[2] = {eng_rng_init(1), eng_rng_init(5)}, rng_b[2] = {rng_a[0], rng_a[1]};
    int32_t want[2], got[2];
    for (int i = 0; i < 2; i++) want[i] = eng_sample(lg + (size_t)i * V, V, &samp[i], &rng_a[i]);
    cr_assert_eq(eng_execute_sample(e2, &b, samp, rng_b, got, NULL), 0, "%s", eng_errmsg());
    cr_assert_eq(got[0], want[0], "greedy row: %d vs %d", got[0], want[0]);
    cr_assert_eq(got[1], want[1], "sampled row: %d vs %d", got[1], want[1]);
    cr_assert_eq(rng_a[1], rng_b[1], "the rng advanced the same way");
    cr_assert_eq(got[0], ts_argmax(lg, V));
    free(lg);
    eng_destroy(e1);
    eng_destroy(e2);
    eng_model_free(m);
}

/* The worker count splits the work differently, never the result. */
Test(engine_inv, thread_count_does_not_change_results)
{
    eng_model *m = load("synthetic:gqa-test:6");
    const eng_model_config *c = eng_model_cfg(m);
    const int V = c->vocab_size, steps = 6, plen = 40;
    int32_t prompt[64];
    prompt_of(prompt, plen, V, 4);
    float *ref = malloc((size_t)steps * V * 4), *got = malloc((size_t)steps * V * 4);
    tseq s1;
    for (int threads = 1; threads <= 4; threads++) {
        eng *e = ts_engine(m, 16, 16, threads);
        tseq s;
        ts_seq_init(&s, prompt, plen, 0);
        ts_generate(e, c, &s, 0, steps, threads == 1 ? ref : got);
        eng_destroy(e);
        if (threads == 1) {
            s1 = s;
            continue;
        }
        double d = ts_rel_diff(ref, got, steps * V);
        cr_assert_leq(d, TOL, "%d threads: logits differ by %.3g from 1 thread", threads, d);
        /* each row's sums run in one order whatever the worker count: the same bits (the
         * prompt's rows are split among the workers for their norms, RoPE and KV writes) */
        cr_assert(memcmp(ref, got, (size_t)steps * V * sizeof(float)) == 0,
                  "%d threads: logits are not the 1-thread bits", threads);
        cr_assert(memcmp(s1.tokens, s.tokens, sizeof(int32_t) * (plen + steps)) == 0,
                  "%d threads: tokens differ", threads);
    }
    free(ref);
    free(got);
    eng_model_free(m);
}

/* A lone row's products are split regions (kernels/cpu/pool.h pool_run_split): each worker
 * reads its share of a product's rows in pieces, and a worker that ends first takes the back
 * of another's, so which rows a worker computes, and in how many pieces, changes from step to
 * step with the workers' speeds. Every weight type's one-row kernel must give a row the same
 * bits whatever piece it is in: on 2 and 3 workers, a sequence decoding alone gets the
 * 1-worker logits to the bit, step after step. */
Test(engine_inv, a_lone_rows_split_products_give_the_one_worker_bits_for_every_type,
     .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    static const char *const types[] = {"Q8_0", "Q4_K_M", "F16", "BF16", "Q3_K", "Q2_K", "IQ4_XS"};
    enum { PLEN = 12, STEPS = 24 };
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char path[512];
        snprintf(path, sizeof path, "%s/quant-test-%s.gguf", tmpdir, types[t]);
        export_gguf("synthetic:quant-test:3", NULL, types[t], NULL, path);
        eng_model *m = load(path);
        const eng_model_config *c = eng_model_cfg(m);
        const int V = c->vocab_size;
        int32_t prompt[PLEN];
        prompt_of(prompt, PLEN, V, 5);
        float *ref = malloc((size_t)STEPS * V * sizeof(float));
        float *got = malloc((size_t)STEPS * V * sizeof(float));
        cr_assert(ref && got);
        for (int threads = 1; threads <= 3; threads++) {
            eng *e = ts_engine(m, 16, 16, threads);
            tseq s;
            ts_seq_init(&s, prompt, PLEN, 0);
            ts_generate(e, c, &s, 0, STEPS, threads == 1 ? ref : got);
            eng_destroy(e);
            if (threads == 1) continue;
            for (int k = 0; k < STEPS; k++)
                cr_assert(memcmp(ref + (size_t)k * V, got + (size_t)k * V,
                                 (size_t)V * sizeof(float)) == 0,
                          "%s, %d workers, step %d: logits are not the 1-worker bits "
                          "(relative %.3g)",
                          types[t], threads, k,
                          ts_rel_diff(ref + (size_t)k * V, got + (size_t)k * V, V));
        }
        free(ref);
        free(got);
        eng_model_free(m);
    }
}

/* Workers pinned to a NUMA node's CPUs compute the same thing. */
Test(engine_inv, pinned_workers_give_the_same_logits)
{
    eng_model *m = load("synthetic:gqa-test:8");
    const eng_model_config *c = eng_model_cfg(m);
    const int V = c->vocab_size;
    int32_t prompt[24];
    prompt_of(prompt, 24, V, 8);
    float *a = malloc((size_t)4 * V * 4), *b = malloc((size_t)4 * V * 4);
    eng *e = ts_engine(m, 8, 16, 2);
    tseq s;
    ts_seq_init(&s, prompt, 24, 0);
    ts_generate(e, c, &s, 0, 4, a);
    eng_destroy(e);
    eng_options o = {.n_threads = 2,
                     .numa_node = 0,
                     .kv_blocks = 8,
                     .kv_block_size = 16,
                     .max_batch_tokens = 64,
                     .max_seqs = 2};
    cr_assert_eq(eng_create(m, &o, &e), 0, "numa_node 0: %s", eng_errmsg());
    ts_seq_init(&s, prompt, 24, 0);
    ts_generate(e, c, &s, 0, 4, b);
    eng_destroy(e);
    cr_assert_leq(ts_rel_diff(a, b, 4 * V), TOL);
    free(a);
    free(b);
    eng_model_free(m);
}

/* Any block size works the same (1 and 3 exercise the scalar tails of the vector paths). */
Test(engine_inv, block_size_does_not_change_results)
{
    eng_model *ms[3];
    int nm = models(ms);
    const int sizes[] = {16, 1, 3, 8, 32};
    for (int mi = 0; mi < nm; mi++) {
        const eng_model_config *c = eng_model_cfg(ms[mi]);
        const int V = c->vocab_size, steps = 5, plen = 35;
        int32_t prompt[64];
        prompt_of(prompt, plen, V, 2);
        float *ref = malloc((size_t)steps * V * 4), *got = malloc((size_t)steps * V * 4);
        tseq s0;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            int bs = sizes[si];
            eng *e = ts_engine(ms[mi], (plen + steps + bs - 1) / bs + 1, bs, 2);
            tseq s;
            ts_seq_init(&s, prompt, plen, 0);
            ts_generate(e, c, &s, si % 2 ? 7 : 0, steps, si == 0 ? ref : got);
            eng_destroy(e);
            if (si == 0) {
                s0 = s;
                continue;
            }
            double d = ts_rel_diff(ref, got, steps * V);
            cr_assert_leq(d, TOL, "model %d block size %d: logits differ by %.3g", mi, bs, d);
            cr_assert(memcmp(s0.tokens, s.tokens, sizeof(int32_t) * (plen + steps)) == 0,
                      "model %d block size %d: tokens differ", mi, bs);
        }
        free(ref);
        free(got);
        eng_model_free(ms[mi]);
    }
}
