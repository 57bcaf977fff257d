/* SPDX-License-Identifier: MIT */
/*
 * Prompt rows on the CPU backend (eng_batch.prompt_len): with F32 and F16 weights a prompt's
 * rows are multiplied in AVX-512 BF16 tiles where the CPU has them, and with any weights they
 * attend with P·V in BF16 (attention_bf16.c); generated rows in exact float32, whatever batch
 * they share. So: run.c's reference greedy tokens are unchanged; a
 * prompt row's logits stay within PROMPT_TOL of exact float32; a row's path depends on what
 * its token is, never on its batch or chunk (a sequence's logits to the bit alone and beside
 * prompts, its layer-0 K/V to the bit in one chunk or in chunks of 1 or 7, and after a
 * recompute of its prompt and generated tokens); eng_options.prompt_exact is exact float32
 * as before; the engine's report names both paths; the tiles' weights packed once at load
 * (the default) give the bits of packing them in each product (RINGLM_PACKED_WEIGHTS=0), for
 * prompt rows of F32 and F16 weights and the large batches of BF16 weights, and cost the
 * memory the engine reports, as do Q4_K and Q6_K weights packed once for the rows of decode;
 * the last layer run for the logits rows alone (and not past its K and V for a chunk without
 * logits) gives those rows' bits.
 */
#include "engine_test_util.h"
#include "gguf_test_util.h"
#include "run_c_reference.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/quant.h"

#include <errno.h>

/* Logits of prompt rows against exact float32, largest difference relative to the largest
 * logit: each product is within (2^-7 + 2^-16 + (K + 2) 2^-24) Σ|x w| of exact
 * (gemm_bf16.h), about 1% of Σ|x w|; through the layers these models measured 2e-3 to 1e-2. */
#define PROMPT_TOL 2e-2

static eng_model *load(const char *spec)
{
    eng_model *m = NULL;
    int err = eng_model_load(spec, &m);
    cr_assert_eq(err, 0, "%s: %s", spec, eng_errmsg());
    return m;
}

/* F32 weights (synthetic and, when present, the real stories260K) and F16 weights (a GGUF
 * export). */
static int models(eng_model **out, const char **names)
{
    int n = 0;
    names[n] = "synthetic stories260K (F32)";
    out[n++] = load("synthetic:stories260K:4");
    char path[1024];
    snprintf(path, sizeof path, "%s/prompt-F16.gguf", tmpdir);
    export_gguf("synthetic:quant-test:3", NULL, "F16", NULL, path);
    names[n] = "quant-test (F16)";
    out[n++] = load(path);
    if (ts_model_file(path, sizeof path, "stories260K.bin")) {
        names[n] = "stories260K.bin (F32)";
        out[n++] = load(path);
    }
    return n;
}

/* models() and a BF16 file of the quant-test shape written as NAME in tmpdir: their count. */
static int models_and_bf16(eng_model **out, const char **names, const char *name)
{
    int n = models(out, names);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    export_gguf("synthetic:quant-test:3", NULL, "BF16", NULL, path);
    names[n] = "quant-test (BF16)";
    out[n++] = load(path);
    return n;
}

static void prompt_of(int32_t *p, int n, int vocab, int salt)
{
    p[0] = 1;
    for (int i = 1; i < n; i++) p[i] = (int32_t)(3 + (i * 37 + salt * 101) % (vocab - 3));
}

/* Whether this machine takes prompt rows through the BF16 tiles (else both paths are exact
 * and the tests below hold trivially: they still run). */
static bool bf16_here(void)
{
    return gemm_bf16_supported();
}

/* Floats of one position's K (or V) in one layer. */
static size_t kv_dim_of(eng *e, const eng_model_config *c)
{
    return eng_kv_bytes_per_token(e) / ((size_t)c->n_layers * 2 * sizeof(float));
}

/* Layer 0's K and V of positions 0 .. n - 1 of s, into out (2 * n * kv_dim floats). */
static void layer0_kv(eng *e, const eng_model_config *c, const tseq *s, int n, float *out)
{
    const int bs = eng_kv_block_size(e);
    const size_t kv_dim = kv_dim_of(e, c);
    for (int p = 0; p < n; p++) {
        const float *blk = eng_kv_block_ptr(e, s->table[p / bs]);
        memcpy(out + (size_t)p * 2 * kv_dim, blk + (size_t)(p % bs) * kv_dim,
               kv_dim * sizeof(float));
        memcpy(out + ((size_t)p * 2 + 1) * kv_dim, blk + ((size_t)bs + (size_t)(p % bs)) * kv_dim,
               kv_dim * sizeof(float));
    }
}

/* run.c's 12 greedy runs with their prompts marked as the daemon marks them: the very tokens
 * run.c recorded. */
Test(engine_prompt, reference_greedy_tokens_are_unchanged_with_prompt_rows_in_bf16)
{
    json_t *root = load_reference();
    if (!root) cr_skip_test("no reference data: set RINGLM_SHARED");
    char mpath[1024];
    cr_assert_not_null(ts_model_file(mpath, sizeof mpath, "stories260K.bin"));
    eng_model *m = load(mpath);
    eng *e = ts_engine(m, 40, 16, 1);
    check_run_c_greedy_cases_on(e, m, root, true);
    eng_destroy(e);
    eng_model_free(m);
    json_decref(root);
}

/* Every row of a 40-token prompt with its logits, on an exact engine and a default one: within
 * PROMPT_TOL, and not the same bits where the BF16 paths ran (they did run). Unmarked rows and
 * prompt_exact give exact float32 to the bit. */
static void check_prompt_logits(eng_model *m, const char *name)
{
    const int plen = 40;
    const eng_model_config *c = eng_model_cfg(m);
    const int V = c->vocab_size;
    int32_t prompt[64], blocks[16];
    prompt_of(prompt, plen, V, 5);
    for (int j = 0; j < 16; j++) blocks[j] = j;
    float *lg[3];
    for (int run = 0; run < 3; run++) { /* 0 exact engine, 1 default, 2 default unmarked */
        lg[run] = malloc((size_t)plen * V * sizeof(float));
        eng *e = ts_engine_mode(m, 16, 8, 2, run == 0);
        eng_batch_builder bb;
        cr_assert_eq(eng_bb_init(&bb, plen, 1, 16, 8), 0, "%s", eng_errmsg());
        cr_assert_eq(eng_bb_add_logits(&bb, prompt, 0, plen, blocks, 16, plen), 0);
        if (run < 2) cr_assert_eq(eng_bb_set_prompt(&bb, plen), 0);
        cr_assert_eq(eng_execute(e, eng_bb_batch(&bb), lg[run]), 0, "%s", eng_errmsg());
        eng_bb_free(&bb);
        eng_destroy(e);
    }
    double worst = 0;
    for (int r = 0; r < plen; r++) {
        const double d = ts_rel_diff(lg[0] + (size_t)r * V, lg[1] + (size_t)r * V, V);
        worst = d > worst ? d : worst;
    }
    cr_log_info("%s: prompt-row logits within %.3g of exact (relative)", name, worst);
    cr_assert_leq(worst, PROMPT_TOL, "%s: prompt-row logits %.3g from exact, bound %g", name, worst,
                  PROMPT_TOL);
    if (bf16_here()) cr_assert_gt(worst, 0.0, "%s: prompt rows took the exact path", name);
    cr_assert(memcmp(lg[0], lg[2], (size_t)plen * V * sizeof(float)) == 0,
              "%s: unmarked rows on a default engine differ from prompt_exact", name);
    for (int run = 0; run < 3; run++) free(lg[run]);
}

/* The float models, and a Q8_0 file, whose prompt rows differ from exact in their attention
 * only (attention_bf16.c: P·V in BF16). */
Test(engine_prompt, prompt_row_logits_within_bound_of_exact, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    eng_model *ms[3];
    const char *names[3];
    const int nm = models(ms, names);
    for (int mi = 0; mi < nm; mi++) {
        check_prompt_logits(ms[mi], names[mi]);
        eng_model_free(ms[mi]);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/prompt-Q8_0.gguf", tmpdir);
    export_gguf("synthetic:stories260K:4", NULL, "Q8_0", NULL, path);
    eng_model *q = load(path);
    check_prompt_logits(q, "synthetic stories260K (Q8_0)");
    eng_model_free(q);
}

/* A sequence decoding alone, then decoding while other sequences prefill prompts beside it
 * (chunks of 5 and 13 rows before and after its row, reordered each step) and one decodes:
 * its logits to the bit at every step (its generated rows stay exact, the others' prompt rows
 * take the BF16 tiles in the same products). */
Test(engine_prompt, a_sequence_alone_and_beside_prompts_is_bit_identical, .init = mk_tmpdir,
     .fini = rm_tmpdir)
{
    eng_model *ms[3];
    const char *names[3];
    const int nm = models(ms, names);
    for (int mi = 0; mi < nm; mi++) {
        const eng_model_config *c = eng_model_cfg(ms[mi]);
        const int V = c->vocab_size, steps = 10, plen = 21;
        int32_t pa[64], pb[64], pc[64];
        prompt_of(pa, plen, V, 1);
        prompt_of(pb, 5, V, 2);
        prompt_of(pc, 60, V, 3);
        float *alone = malloc((size_t)steps * V * sizeof(float));
        eng *e = ts_engine(ms[mi], 64, 8, 2);
        static tseq a, A, B, C;
        ts_seq_init(&a, pa, plen, 0);
        a.n_prompt = plen;
        ts_generate(e, c, &a, 0, steps, alone);
        eng_destroy(e);

        e = ts_engine(ms[mi], 64, 8, 2);
        ts_seq_init(&A, pa, plen, 0);
        ts_seq_init(&B, pb, 5, 20);
        ts_seq_init(&C, pc, 60, 40);
        A.n_prompt = plen;
        B.n_prompt = 5;
        C.n_prompt = 60;
        float *lg = malloc((size_t)3 * V * sizeof(float));
        tseq *one[1] = {&A};
        int r = plen;
        cr_assert_eq(ts_step(e, c, one, &r, 1, lg), 0, "%s", eng_errmsg());
        A.tokens[A.n_tokens++] = ts_argmax(lg, V);
        for (int k = 1; k < steps; k++) {
            tseq *batch[3];
            int rows[3], n = 0, ai;
            if (B.n_cached < B.n_tokens || k % 2) { /* B: its prompt, then decoding */
                rows[n] = B.n_cached < B.n_tokens ? B.n_tokens - B.n_cached : 1;
                batch[n++] = &B;
            }
            ai = n;
            rows[n] = 1;
            batch[n++] = &A;
            if (C.n_cached < C.n_tokens) {
                rows[n] = C.n_tokens - C.n_cached < 13 ? C.n_tokens - C.n_cached : 13;
                batch[n++] = &C;
            }
            if (k % 3 == 0 && n == 3) { /* C's prompt rows before A's row */
                tseq *t = batch[0];
                int rt = rows[0];
                batch[0] = batch[2], rows[0] = rows[2];
                batch[2] = t, rows[2] = rt;
            }
            for (int i = 0; i < n; i++)
                if (batch[i] == &A) ai = i;
            cr_assert_eq(ts_step(e, c, batch, rows, n, lg), 0, "%s", eng_errmsg());
            cr_assert(
                memcmp(lg + (size_t)ai * V, alone + (size_t)k * V, (size_t)V * sizeof(float)) == 0,
                "%s step %d: logits alone and beside prompts differ (relative %.3g)", names[mi], k,
                ts_rel_diff(alone + (size_t)k * V, lg + (size_t)ai * V, V));
            for (int i = 0; i < n; i++)
                if (batch[i]->n_cached == batch[i]->n_tokens)
                    batch[i]->tokens[batch[i]->n_tokens++] = ts_argmax(lg + (size_t)i * V, V);
        }
        cr_assert(memcmp(A.tokens, a.tokens, sizeof(int32_t) * (size_t)(plen + steps)) == 0,
                  "%s: greedy tokens alone and beside prompts differ", names[mi]);
        free(lg);
        free(alone);
        eng_destroy(e);
        eng_model_free(ms[mi]);
    }
}

/* A prompt of 150 tokens in one chunk (above gemm_small's rows), in chunks of 7 and of 1
 * (below): layer 0's K and V of every position to the bit (a prompt row takes the BF16 tiles
 * at any count), and the same greedy tokens. Then the sequence recomputed after a preemption
 * (prompt and generated tokens in one batch, on other blocks): layer 0's K and V of every
 * position, prompt and generated, to the bit, and the same tokens after. */
Test(engine_prompt, chunk_size_and_recompute_do_not_change_a_rows_bits, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 120)
{
    eng_model *ms[3];
    const char *names[3];
    const int nm = models(ms, names);
    for (int mi = 0; mi < nm; mi++) {
        const eng_model_config *c = eng_model_cfg(ms[mi]);
        const int V = c->vocab_size, plen = 150, steps = 12, chunks[] = {0, 7, 1};
        int32_t prompt[160];
        prompt_of(prompt, plen, V, 7);
        const size_t kvf = 2 * eng_model_cfg(ms[mi])->dim * (size_t)(plen + steps);
        float *kv0 = malloc(kvf * sizeof(float)), *kv = malloc(kvf * sizeof(float));
        static tseq s0, s;
        for (int ci = 0; ci < 3; ci++) {
            eng *e = ts_engine(ms[mi], 64, 8, 2);
            tseq *t = ci == 0 ? &s0 : &s;
            ts_seq_init(t, prompt, plen, 0);
            t->n_prompt = plen;
            ts_generate(e, c, t, chunks[ci], steps, NULL);
            layer0_kv(e, c, t, plen + steps - 1, ci == 0 ? kv0 : kv);
            if (ci > 0) {
                cr_assert(
                    memcmp(kv0, kv,
                           (size_t)2 * (plen + steps - 1) * kv_dim_of(e, c) * sizeof(float)) == 0,
                    "%s: layer-0 K/V in chunks of %d differ from one chunk", names[mi], chunks[ci]);
                cr_assert(memcmp(s0.tokens, s.tokens, sizeof(int32_t) * (plen + steps)) == 0,
                          "%s: tokens in chunks of %d differ", names[mi], chunks[ci]);
            }
            eng_destroy(e);
        }
        /* recompute: the prompt and 11 generated tokens again in one batch, on blocks 30.. */
        eng *e = ts_engine(ms[mi], 64, 8, 2);
        ts_seq_init(&s, s0.tokens, plen + steps - 1, 30);
        s.n_prompt = plen;
        float *lg = malloc((size_t)V * sizeof(float));
        tseq *one[1] = {&s};
        int rows = plen + steps - 1;
        cr_assert_eq(ts_step(e, c, one, &rows, 1, lg), 0, "%s", eng_errmsg());
        layer0_kv(e, c, &s, plen + steps - 1, kv);
        const size_t kv_dim = kv_dim_of(e, c);
        for (int p = 0; p < plen + steps - 1; p++)
            cr_assert(memcmp(kv0 + (size_t)p * 2 * kv_dim, kv + (size_t)p * 2 * kv_dim,
                             2 * kv_dim * sizeof(float)) == 0,
                      "%s: layer-0 K/V of position %d (%s) differ after the recompute", names[mi],
                      p, p < plen ? "prompt" : "generated");
        cr_assert_eq(ts_argmax(lg, V), s0.tokens[plen + steps - 1],
                     "%s: the token after the recompute differs", names[mi]);
        free(lg);
        free(kv0);
        free(kv);
        eng_destroy(e);
        eng_model_free(ms[mi]);
    }
}

/* Logits of every row of a plen-row prompt (marked as a prompt, blocks 0..31 of 8) run on e,
 * which it destroys. */
static float *run_prompt(eng *e, const eng_model *m, int plen, int salt)
{
    const int V = eng_model_cfg(m)->vocab_size;
    int32_t prompt[256], blocks[32];
    prompt_of(prompt, plen, V, salt);
    for (int j = 0; j < 32; j++) blocks[j] = j;
    float *lg = malloc((size_t)plen * V * sizeof(float));
    cr_assert(lg);
    eng_batch_builder bb;
    cr_assert_eq(eng_bb_init(&bb, plen, 1, 32, 8), 0, "%s", eng_errmsg());
    cr_assert_eq(eng_bb_add_logits(&bb, prompt, 0, plen, blocks, 32, plen), 0);
    cr_assert_eq(eng_bb_set_prompt(&bb, plen), 0);
    cr_assert_eq(eng_execute(e, eng_bb_batch(&bb), lg), 0, "%s", eng_errmsg());
    eng_bb_free(&bb);
    eng_destroy(e);
    return lg;
}

/* run_prompt on a fresh two-thread engine with RINGLM_PACKED_WEIGHTS as given (NULL: unset);
 * the engine's memory into *bytes. */
static float *prompt_logits(const eng_model *m, int plen, const char *packed, size_t *bytes)
{
    if (packed)
        setenv("RINGLM_PACKED_WEIGHTS", packed, 1);
    else
        unsetenv("RINGLM_PACKED_WEIGHTS");
    eng *e = ts_engine(m, 32, 8, 2);
    unsetenv("RINGLM_PACKED_WEIGHTS");
    *bytes = eng_memory_bytes(e);
    return run_prompt(e, m, plen, 3);
}

/* Prompts of 1, 5, 33 and 200 rows (BF16 weights take the tiles above 128 rows only): the
 * same logits to the bit with the weights packed once at load and packed by each product,
 * and the packed copy counted in the engine's memory where the tiles run. */
Test(engine_prompt, weights_packed_at_load_give_the_bits_of_packing_per_product, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 120)
{
    eng_model *ms[4];
    const char *names[4];
    const int nm = models_and_bf16(ms, names, "prompt-BF16.gguf");
    static const int plens[] = {1, 5, 33, 200};
    for (int mi = 0; mi < nm; mi++) {
        const int V = eng_model_cfg(ms[mi])->vocab_size;
        for (size_t pi = 0; pi < sizeof plens / sizeof plens[0]; pi++) {
            size_t b_off, b_on;
            float *off = prompt_logits(ms[mi], plens[pi], "0", &b_off);
            float *on = prompt_logits(ms[mi], plens[pi], NULL, &b_on);
            cr_assert(memcmp(off, on, (size_t)plens[pi] * V * sizeof(float)) == 0,
                      "%s, %d prompt rows: packed at load differs from packed per product",
                      names[mi], plens[pi]);
            if (bf16_here())
                cr_assert_gt(b_on, b_off, "%s: the packed weights are not in the engine's memory",
                             names[mi]);
            else
                cr_assert_eq(b_on, b_off, "%s: weights packed without the tiles", names[mi]);
            free(off);
            free(on);
        }
        eng_model_free(ms[mi]);
    }
}

/* The last row's logits of a plen-row prompt (blocks 0..31 of 8) on a fresh two-thread
 * engine, in one batch or in two chunks (the first plen / 2 rows, then the rest), the chunk
 * before the last with every row's logits (all_first) or none; the last chunk asks for the
 * last row's logits alone, or (twice) for that row twice: logits rows out of ascending order,
 * which run the whole last layer (cpu.c, last_layer_tail), and a classifier of two rows,
 * which takes the path of one (gemm_small's rows and the one-row dots do not depend on
 * their batch-mates). */
static void last_row_logits(const eng_model *m, int plen, bool chunked, bool all_first, bool twice,
                            float *out)
{
    const int V = eng_model_cfg(m)->vocab_size;
    int32_t prompt[256], blocks[32];
    prompt_of(prompt, plen, V, 5);
    for (int j = 0; j < 32; j++) blocks[j] = j;
    float *lg = malloc((size_t)plen * V * sizeof(float));
    cr_assert(lg);
    eng *e = ts_engine(m, 32, 8, 2);
    eng_batch_builder bb;
    cr_assert_eq(eng_bb_init(&bb, plen, 1, 32, 8), 0, "%s", eng_errmsg());
    const int first = chunked ? plen / 2 : 0, n = plen - first;
    if (first) {
        cr_assert_eq(eng_bb_add_logits(&bb, prompt, 0, first, blocks, 32, all_first ? first : 0),
                     0);
        cr_assert_eq(eng_bb_set_prompt(&bb, plen), 0);
        cr_assert_eq(eng_execute(e, eng_bb_batch(&bb), lg), 0, "%s", eng_errmsg());
        eng_bb_reset(&bb);
    }
    cr_assert_eq(eng_bb_add_logits(&bb, prompt, first, n, blocks, 32, 1), 0);
    cr_assert_eq(eng_bb_set_prompt(&bb, plen), 0);
    eng_batch b = *eng_bb_batch(&bb);
    const int32_t last2[2] = {n - 1, n - 1};
    if (twice) {
        b.n_logits = 2;
        b.logits_rows = last2;
    }
    cr_assert_eq(eng_execute(e, &b, lg), 0, "%s", eng_errmsg());
    if (twice) cr_assert(memcmp(lg, lg + V, (size_t)V * sizeof(float)) == 0, "one row, two logits");
    memcpy(out, lg, (size_t)V * sizeof(float));
    eng_bb_free(&bb);
    eng_destroy(e);
    free(lg);
}

/* After the last layer only the logits rows are read, so its attention, Wo and FFN run for
 * them alone where the tiles take every row (F32 / F16 prompt rows, BF16 above 128 rows), and
 * a chunk without logits stops at the last layer's K and V: the last row's logits are the
 * same bits with the whole last layer as with its tail, and after a first chunk with every
 * row's logits or none (the second chunk's attention reads the first's last-layer K and V). */
Test(engine_prompt, the_last_layer_for_the_logits_rows_alone_keeps_their_bits, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 120)
{
    eng_model *ms[4];
    const char *names[4];
    const int nm = models_and_bf16(ms, names, "tail-BF16.gguf");
    static const int plens[] = {2, 33, 200};
    for (int mi = 0; mi < nm; mi++) {
        const int V = eng_model_cfg(ms[mi])->vocab_size;
        float *whole = malloc((size_t)V * sizeof(float)), *tail = malloc((size_t)V * sizeof(float));
        cr_assert(whole && tail);
        for (size_t pi = 0; pi < sizeof plens / sizeof plens[0]; pi++) {
            const int plen = plens[pi];
            last_row_logits(ms[mi], plen, false, false, true, whole);
            last_row_logits(ms[mi], plen, false, false, false, tail);
            cr_assert(memcmp(whole, tail, (size_t)V * sizeof(float)) == 0,
                      "%s, %d prompt rows: the last row's logits from the last layer's tail differ "
                      "from the whole layer's (largest difference %g of the largest logit)",
                      names[mi], plen, ts_rel_diff(tail, whole, V));
            last_row_logits(ms[mi], plen, true, true, false, whole);
            last_row_logits(ms[mi], plen, true, false, false, tail);
            cr_assert(memcmp(whole, tail, (size_t)V * sizeof(float)) == 0,
                      "%s, %d prompt rows in two chunks: the last row's logits after a first "
                      "chunk without logits differ (largest difference %g of the largest logit)",
                      names[mi], plen, ts_rel_diff(tail, whole, V));
        }
        free(whole);
        free(tail);
        eng_model_free(ms[mi]);
    }
}

/* An engine over m with packed_weights = mode and pack_avail_bytes = avail; its memory into
 * *bytes, its report into buf, and a plen-row prompt's logits (returned). */
static float *packed_mode_logits(const eng_model *m, int mode, uint64_t avail, int plen,
                                 size_t *bytes, char *buf, size_t cap)
{
    eng_options o = {.backend = "cpu",
                     .n_threads = 2,
                     .numa_node = -1,
                     .kv_blocks = 32,
                     .kv_block_size = 8,
                     .max_batch_tokens = 1024,
                     .max_seqs = TS_MAX_SEQS,
                     .packed_weights = mode,
                     .pack_avail_bytes = avail};
    unsetenv("RINGLM_PACKED_WEIGHTS");
    eng *e = NULL;
    cr_assert_eq(eng_create(m, &o, &e), 0, "eng_create: %s", eng_errmsg());
    *bytes = eng_memory_bytes(e);
    eng_describe_paths(e, buf, cap);
    return run_prompt(e, m, plen, 5);
}

/* By default the packed copy is made only where it takes at most half of the memory
 * available at load: with 1 MiB available an engine packs nothing (its memory that of
 * packing off, its report saying why), with a TiB it packs; "on" packs whatever is
 * available, "off" never; the logits are the same bits every way. */
Test(engine_prompt, weights_are_packed_at_load_only_where_memory_allows, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 120)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/pack-F16.gguf", tmpdir); /* prompt rows take the tiles */
    export_gguf("synthetic:quant-test:3", NULL, "F16", NULL, path);
    eng_model *m = load(path);
    const int V = eng_model_cfg(m)->vocab_size, plen = 5;
    static const struct {
        int mode;
        uint64_t avail;
        bool packs;
        const char *says;
    } runs[] = {
        {ENG_PACK_OFF, 0, false, "packing once at load off"},
        {ENG_PACK_AUTO, 1u << 20, false, "more than half of the 1 MiB available at load"},
        {ENG_PACK_AUTO, 1ull << 40, true, "packed once at load"},
        {ENG_PACK_ON, 1u << 20, true, "packed once at load"},
    };
    size_t b_off = 0;
    float *first = NULL;
    char buf[1024];
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        size_t bytes;
        float *lg =
            packed_mode_logits(m, runs[r].mode, runs[r].avail, plen, &bytes, buf, sizeof buf);
        if (!r) {
            b_off = bytes;
            first = lg;
        } else {
            cr_assert(memcmp(first, lg, (size_t)plen * V * sizeof(float)) == 0,
                      "run %zu: the logits differ from packing per product", r);
            free(lg);
        }
        if (!bf16_here()) {
            cr_assert_eq(bytes, b_off, "run %zu: weights packed without the tiles", r);
            continue;
        }
        if (runs[r].packs)
            cr_assert_gt(bytes, b_off, "run %zu: nothing packed: %s", r, buf);
        else
            cr_assert_eq(bytes, b_off, "run %zu: packed: %s", r, buf);
        cr_assert(strstr(buf, runs[r].says), "run %zu: the report does not say \"%s\": %s", r,
                  runs[r].says, buf);
    }
    free(first);
    eng_model_free(m);
}

/* Q4_K and Q6_K weights (a Q4_K_M file) are packed once at load for the products of up to
 * Q_PACKED_MAX_ROWS rows, 16 rows side by side, through the same policy: rows 1 to 5 (5: as
 * they lie) give the bits of the weights as they lie with packing off, on, by default with a
 * TiB available and refused with 1 MiB; the copy is in the engine's memory where it is made
 * (none without AVX-512 VNNI), and the report says what was packed, or why not. */
Test(engine_prompt, k_weights_packed_for_decode_rows_give_the_bits_as_they_lie, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 120)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/pack-Q4_K_M.gguf", tmpdir);
    export_gguf("synthetic:quant-test:3", NULL, "Q4_K_M", NULL, path);
    eng_model *m = load(path);
    const int V = eng_model_cfg(m)->vocab_size;
    const bool packs_here = q_packed_bytes(Q_Q4_K, 16, 256) > 0;
    static const struct {
        int mode;
        uint64_t avail;
        bool packs;
        const char *says;
    } runs[] = {
        {ENG_PACK_OFF, 0, false, "read as they lie (packing once at load off"},
        {ENG_PACK_ON, 1u << 20, true, "Q4_K and Q6_K weights of up to 4 rows packed once at load"},
        {ENG_PACK_AUTO, 1ull << 40, true, "with the classifier"},
        {ENG_PACK_AUTO, 1u << 20, false, "more than half of the 1 MiB available at load"},
    };
    char buf[1024];
    for (int plen = 1; plen <= Q_PACKED_MAX_ROWS + 1; plen++) {
        size_t b_off = 0;
        float *first = NULL;
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            size_t bytes;
            float *lg =
                packed_mode_logits(m, runs[r].mode, runs[r].avail, plen, &bytes, buf, sizeof buf);
            if (!r) {
                b_off = bytes;
                first = lg;
            } else {
                cr_assert(memcmp(first, lg, (size_t)plen * V * sizeof(float)) == 0,
                          "%d rows, run %zu: the logits differ from the weights as they lie", plen,
                          r);
                free(lg);
            }
            if (!packs_here) {
                cr_assert_eq(bytes, b_off, "run %zu: packed without AVX-512 VNNI: %s", r, buf);
                continue;
            }
            if (runs[r].packs)
                cr_assert_gt(bytes, b_off, "run %zu: nothing packed: %s", r, buf);
            else
                cr_assert_eq(bytes, b_off, "run %zu: packed: %s", r, buf);
            cr_assert(strstr(buf, runs[r].says), "run %zu: the report does not say \"%s\": %s", r,
                      runs[r].says, buf);
        }
        free(first);
    }
    if (!packs_here) cr_log_info("no AVX-512 VNNI here: nothing packed, the bits compared only");
    eng_model_free(m);
}

/* The engine's report (ringlmd's start log, engine_bench) names the path of prompt rows and
 * of generated rows; with prompt_exact it names no prompt path. */
Test(engine_prompt, the_report_names_each_rows_path)
{
    eng_model *m = load("synthetic:stories260K:4");
    char buf[1024];
    eng *e = ts_engine(m, 16, 8, 1);
    eng_describe_paths(e, buf, sizeof buf);
    eng_destroy(e);
    if (bf16_here())
        cr_assert(strstr(buf, "prompt rows in AVX-512 BF16 tiles") &&
                      strstr(buf, "generated rows: gemm_small"),
                  "report: %s", buf);
    else
        cr_assert_null(strstr(buf, "prompt rows"), "report: %s", buf);
    e = ts_engine_mode(m, 16, 8, 1, true);
    eng_describe_paths(e, buf, sizeof buf);
    eng_destroy(e);
    cr_assert_null(strstr(buf, "prompt rows"), "exact report: %s", buf);
    eng_model_free(m);
}

/* A prompt length below 0 is refused, naming the sequence; the builder's refuses a sequence
 * not yet added. */
Test(engine_prompt, a_negative_prompt_length_is_refused)
{
    eng_model *m = load("synthetic:stories260K:4");
    eng *e = ts_engine(m, 16, 8, 1);
    eng_batch_builder bb;
    cr_assert_eq(eng_bb_init(&bb, 8, 2, 4, 8), 0, "%s", eng_errmsg());
    cr_assert_eq(eng_bb_set_prompt(&bb, 3), -EINVAL, "a prompt for no sequence");
    int32_t tokens[4] = {1, 5, 6, 7}, blocks[1] = {0};
    cr_assert_eq(eng_bb_add(&bb, tokens, 0, 4, blocks, 1, true), 0, "%s", eng_errmsg());
    eng_batch b = *eng_bb_batch(&bb);
    int32_t bad = -1;
    b.prompt_len = &bad;
    float *lg = malloc((size_t)eng_model_cfg(m)->vocab_size * sizeof(float));
    cr_assert_eq(eng_execute(e, &b, lg), -EINVAL);
    cr_assert(strstr(eng_errmsg(), "prompt_len[0]=-1"), "detail: %s", eng_errmsg());
    free(lg);
    eng_bb_free(&bb);
    eng_destroy(e);
    eng_model_free(m);
}
