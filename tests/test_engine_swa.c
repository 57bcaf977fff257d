/* SPDX-License-Identifier: MIT */
/*
 * test_engine_swa.c — window rings: a model with windowed and global layers (gemma2: every
 * other layer global; gemma3: one in six) keeps its global layers' K/V in the pool's blocks
 * and its windowed layers' in a ring per sequence, reused in place (eng_options.kv_rings).
 * Two sequences far longer than their window, through chunked prefill and decode, mixed in
 * one batch, give the same logits to the bit as today's layout (every layer in the
 * blocks): the rings change where K/V live, not the arithmetic. The blocks narrow to the
 * global layers; a batch without a ring, two sequences on one ring, or more rows than a
 * ring spans are refused; so are rings on a model that is not mixed.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/batch.h"
#include "kernels/engine.h"
#include "tests/gguf_test_util.h"
#include "tests/helpers.h"

#define WINDOW    32
#define BS        16
#define RING_ROWS 64
#define MAX_POS   512
#define NSEQ      2

static eng_model *load(const char *path)
{
    eng_model *m = NULL;
    cr_assert_eq(eng_model_load(path, &m), 0, "%s: %s", path, eng_errmsg());
    return m;
}

static eng *engine(const eng_model *m, int blocks, int rings)
{
    eng_options o = {.backend = "cpu",
                     .n_threads = 2,
                     .numa_node = -1,
                     .kv_blocks = blocks,
                     .kv_block_size = BS,
                     .max_batch_tokens = 128,
                     .max_seqs = 4,
                     .kv_rings = rings,
                     .kv_ring_rows = RING_ROWS};
    eng *e = NULL;
    cr_assert_eq(eng_create(m, &o, &e), 0, "eng_create (rings %d): %s", rings, eng_errmsg());
    return e;
}

typedef struct seq {
    int32_t tokens[MAX_POS];
    int n_tokens, n_cached;
    int32_t table[MAX_POS / BS + 1];
} seq;

/* One step on engine e: sequence i adds rows[i] rows (a prefill chunk or a decode row), on
 * ring rings[i] when the engine has rings. Logits of each sequence's last row. */
static int step(eng *e, seq *s, const int *rows, const int *rings, int n, float *logits)
{
    eng_batch_builder bb;
    cr_assert_eq(eng_bb_init(&bb, 128, 4, MAX_POS / BS + 1, BS), 0, "%s", eng_errmsg());
    for (int i = 0; i < n; i++) {
        cr_assert_eq(eng_bb_add(&bb, s[i].tokens, (uint32_t)s[i].n_cached, (uint32_t)rows[i],
                                s[i].table, MAX_POS / BS + 1, true),
                     0, "%s", eng_errmsg());
        if (rings && rings[i] >= 0)
            cr_assert_eq(eng_bb_set_ring(&bb, rings[i]), 0, "%s", eng_errmsg());
    }
    int err = eng_execute(e, eng_bb_batch(&bb), logits);
    eng_bb_free(&bb);
    return err;
}

static int32_t argmax(const float *v, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* Two sequences (prompts of 45 and 70) prefilled in chunks of 33 and decoded greedily to
 * `last` positions, side by side in every batch, on the full layout and on rings 3 and 1:
 * the logits of every step equal to the bit. */
static void rings_equal_full_layout(const char *path, int last)
{
    eng_model *m = load(path);
    cr_assert(eng_model_mixed_window(m), "%s: windowed and global layers", path);
    const eng_model_config *c = eng_model_cfg(m);
    const int V = c->vocab_size, nb = MAX_POS / BS + 1;
    eng *full = engine(m, NSEQ * nb, 0), *ring = engine(m, NSEQ * nb, 4);
    cr_assert_eq(eng_kv_rings(ring), 4);
    cr_assert_eq(eng_kv_ring_blocks(ring), (WINDOW + RING_ROWS + BS - 1) / BS + 1);
    /* the blocks keep the global layers only; the rings hold the windowed ones */
    int global = 0;
    for (int l = 0; l < c->n_layers; l++) global += !eng_layer_windowed(eng_model_hparams_of(m), l);
    cr_assert_eq(eng_kv_block_bytes(ring) * (size_t)c->n_layers,
                 eng_kv_block_bytes(full) * (size_t)global, "blocks of %d global layers of %d",
                 global, c->n_layers);
    cr_assert_eq(eng_kv_ring_bytes(ring) * (size_t)c->n_layers,
                 (size_t)eng_kv_ring_blocks(ring) * eng_kv_block_bytes(full) *
                     (size_t)(c->n_layers - global),
                 "a ring: its blocks of the windowed layers");

    static seq a[NSEQ], b[NSEQ];
    const int plen[NSEQ] = {45, 70}, rings[NSEQ] = {3, 1};
    memset(a, 0, sizeof a);
    for (int i = 0; i < NSEQ; i++) {
        for (int k = 0; k < plen[i]; k++) a[i].tokens[k] = 3 + (37 * k + 101 * i) % (V - 3);
        a[i].n_tokens = plen[i];
        for (int j = 0; j < nb; j++) a[i].table[j] = i * nb + j;
    }
    memcpy(b, a, sizeof a);
    float *la = malloc((size_t)NSEQ * V * sizeof(float));
    float *lb = malloc((size_t)NSEQ * V * sizeof(float));
    int steps = 0;
    for (;;) {
        /* the sequences with rows left: a prefill chunk of up to 33, or a decode row */
        seq ba[NSEQ], bb[NSEQ];
        int idx[NSEQ], rows[NSEQ], rg[NSEQ], n = 0;
        for (int i = 0; i < NSEQ; i++) {
            int left = a[i].n_tokens - a[i].n_cached;
            if (!left) continue;
            idx[n] = i;
            rows[n] = left > 33 ? 33 : left;
            rg[n] = rings[i];
            ba[n] = a[i];
            bb[n] = b[i];
            n++;
        }
        if (!n) break;
        cr_assert_eq(step(full, ba, rows, NULL, n, la), 0, "full layout: %s", eng_errmsg());
        cr_assert_eq(step(ring, bb, rows, rg, n, lb), 0, "rings: %s", eng_errmsg());
        for (int k = 0; k < n; k++) {
            seq *x = &a[idx[k]], *y = &b[idx[k]];
            cr_assert(memcmp(la + (size_t)k * V, lb + (size_t)k * V, (size_t)V * sizeof(float)) ==
                          0,
                      "%s: sequence %d at position %d: the rings' logits differ from the full "
                      "layout's",
                      path, idx[k], x->n_cached + rows[k] - 1);
            x->n_cached += rows[k];
            y->n_cached += rows[k];
            if (x->n_cached == x->n_tokens && x->n_tokens < last) {
                int32_t t = argmax(la + (size_t)k * V, V);
                x->tokens[x->n_tokens++] = t;
                y->tokens[y->n_tokens++] = t;
            }
        }
        steps++;
    }
    cr_log_info("%s: %d steps to %d positions, window %d, rings of %d blocks of %d", path, steps,
                last, WINDOW, eng_kv_ring_blocks(ring), BS);
    free(la);
    free(lb);
    eng_destroy(full);
    eng_destroy(ring);
    eng_model_free(m);
}

/* The synthetic preset exported as an F32 GGUF of arch (gemma2, gemma3; NULL: llama, every
 * layer windowed) in heads of head_dim (0: the preset's), window WINDOW, as tmpdir/name. */
static void window_gguf(char *path, size_t n, const char *name, const char *preset,
                        const char *arch, int head_dim)
{
    snprintf(path, n, "%s/%s", tmpdir, name);
    export_gguf_window(preset, NULL, "F32", arch, head_dim, WINDOW, path);
}

Test(engine_swa, gemma2_rings_equal_the_full_layout, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 300)
{
    char path[512];
    /* 4 layers, every other one global; 300 positions, about 9 windows */
    window_gguf(path, sizeof path, "g2.gguf", "synthetic:gqa-test:12", "gemma2", 64);
    rings_equal_full_layout(path, 300);
}

Test(engine_swa, gemma3_rings_equal_the_full_layout, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 300)
{
    char path[512];
    /* 16 layers, 5 and 11 global (one in six), its own RoPE base on the windowed layers; the
     * preset's context is 256 */
    window_gguf(path, sizeof path, "g3.gguf", "synthetic:quant-gqa:5", "gemma3", 32);
    rings_equal_full_layout(path, 250);
}

Test(engine_swa, bad_rings_are_refused, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    char path[512];
    window_gguf(path, sizeof path, "g2.gguf", "synthetic:gqa-test:12", "gemma2", 64);
    eng_model *m = load(path);
    eng *e = engine(m, 8, 2);
    static seq s[2];
    memset(s, 0, sizeof s);
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 100; k++) s[i].tokens[k] = 5 + k;
        s[i].n_tokens = 100;
        for (int j = 0; j < 8; j++) s[i].table[j] = (4 * i + j) % 8;
    }
    float *logits = malloc(2 * 512 * sizeof(float));
    int one[2] = {4, 4}, none[2] = {-1, -1}, same[2] = {1, 1}, bad[2] = {0, 2};
    cr_assert_eq(step(e, s, one, none, 1, logits), -EINVAL, "a sequence without a ring");
    cr_assert(strstr(eng_errmsg(), "ring"), "%s", eng_errmsg());
    cr_assert_eq(step(e, s, one, bad, 2, logits), -EINVAL, "ring 2 of 2");
    cr_assert(strstr(eng_errmsg(), "rings 0..1"), "%s", eng_errmsg());
    cr_assert_eq(step(e, s, one, same, 2, logits), -EINVAL, "two sequences on ring 1");
    cr_assert(strstr(eng_errmsg(), "another sequence"), "%s", eng_errmsg());
    int many[1] = {RING_ROWS + 1}, r0[1] = {0};
    cr_assert_eq(step(e, s, many, r0, 1, logits), -EINVAL, "more rows than a ring spans");
    cr_assert(strstr(eng_errmsg(), "spans"), "%s", eng_errmsg());
    cr_assert_eq(step(e, s, one, r0, 1, logits), 0, "%s", eng_errmsg());
    cr_assert_eq(eng_kv_copy_ring(e, 0, 1), 0, "%s", eng_errmsg());
    cr_assert(memcmp(eng_kv_ring_ptr(e, 0), eng_kv_ring_ptr(e, 1), eng_kv_ring_bytes(e)) == 0);
    cr_assert_eq(eng_kv_copy_ring(e, 0, 2), -EINVAL);
    cr_assert_null(eng_kv_ring_ptr(e, 2));
    free(logits);
    eng_destroy(e);
    eng_model_free(m);

    /* every layer windowed (a Mistral-style llama file) or none: no rings */
    window_gguf(path, sizeof path, "l.gguf", "synthetic:gqa-test:12", NULL, 0);
    m = load(path);
    cr_assert_not(eng_model_mixed_window(m));
    eng_options o = {.backend = "cpu",
                     .n_threads = 1,
                     .numa_node = -1,
                     .kv_blocks = 8,
                     .kv_block_size = BS,
                     .max_batch_tokens = 64,
                     .max_seqs = 2,
                     .kv_rings = 2};
    e = NULL;
    cr_assert_eq(eng_create(m, &o, &e), -EINVAL);
    cr_assert(strstr(eng_errmsg(), "every layer windowed"), "%s", eng_errmsg());
    eng_model_free(m);
}
