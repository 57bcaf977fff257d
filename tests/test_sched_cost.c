/* SPDX-License-Identifier: MIT */
/*
 * test_sched_cost.c — the one step model and the one least-squares solver.
 *
 *   - sched_lsq recovers a linear model exactly, leaves out a term that would come out
 *     negative (the non-negative optimum, not just "drop and refit"), a column that is all
 *     zero, and rows of weight 0;
 *   - the scheduler's predicted step time is the step model over the plan's own work
 *     (sched_plan_work_of), prefill attention included;
 *   - a windowed layer is charged min(context, window) (sched_config.step_window).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "sched/sched.h"

static double rel(double a, double b)
{
    return fabs(a - b) / (fabs(b) > 1e-12 ? fabs(b) : 1);
}

/* rows of the step model's regressors over a small grid of batches */
static size_t grid(double *x, size_t cap)
{
    size_t n = 0;
    for (int p = 0; p <= 512; p += 128)
        for (int d = 0; d <= 64; d += 16)
            for (int c = 1; c <= 4; c++) {
                if (n == cap) return n;
                sched_plan_work w = {.prefill_tokens = (uint64_t)p,
                                     .decode_seqs = (uint32_t)d,
                                     .context_tokens = (uint64_t)(c * 300 * (d + 1) + p),
                                     .prefill_pairs = p * (p - 1) / 2.0 + 37.0 * p * c};
                sched_plan_work_terms(&w, &x[n * SCHED_STEP_TERMS]);
                n++;
            }
    return n;
}

Test(sched_cost, lsq_recovers_the_model)
{
    static double x[200 * SCHED_STEP_TERMS], y[200];
    size_t n = grid(x, 200);
    sched_step_model m = {.base_us = 812.5,
                          .prefill_token_us = 21.25,
                          .decode_seq_us = 33,
                          .context_token_us = 0.031,
                          .prefill_pair_us = 0.0042};
    for (size_t i = 0; i < n; i++) {
        const double *r = &x[i * SCHED_STEP_TERMS];
        sched_plan_work w = {.prefill_tokens = (uint64_t)r[1],
                             .decode_seqs = (uint32_t)r[2],
                             .context_tokens = (uint64_t)r[3],
                             .prefill_pairs = r[4]};
        y[i] = sched_step_model_us(&m, &w);
        double dot = m.base_us * r[0] + m.prefill_token_us * r[1] + m.decode_seq_us * r[2] +
                     m.context_token_us * r[3] + m.prefill_pair_us * r[4];
        cr_assert_lt(rel(y[i], dot), 1e-12, "the model is the dot product of its terms");
    }
    double b[SCHED_STEP_TERMS];
    unsigned used = 0;
    cr_assert_eq(sched_lsq(x, y, NULL, n, SCHED_STEP_TERMS, 0x1f, 0x1f, b, &used, NULL), 0);
    cr_expect_eq(used, 0x1fu);
    double want[] = {m.base_us, m.prefill_token_us, m.decode_seq_us, m.context_token_us,
                     m.prefill_pair_us};
    for (int j = 0; j < SCHED_STEP_TERMS; j++)
        cr_expect_lt(rel(b[j], want[j]), 1e-7, "term %d: %g vs %g", j, b[j], want[j]);
    /* four terms only: the pairs term is 0 */
    cr_assert_eq(sched_lsq(x, y, NULL, n, SCHED_STEP_TERMS, 0x0f, 0, b, &used, NULL), 0);
    cr_expect_eq(b[4], 0);
    cr_expect_eq(used, 0x0fu);
}

Test(sched_cost, lsq_non_negative_and_degenerate_columns)
{
    /* y = 10 + 2 a - 0.5 b + noise-free; b correlates with a, so the unconstrained fit is
     * exact with a negative slope, and the constrained one must leave b out */
    enum { N = 40 };
    double x[N * 3], y[N], w[N];
    for (int i = 0; i < N; i++) {
        double a = i, bb = (i % 7) * 3.0;
        x[i * 3] = 1;
        x[i * 3 + 1] = a;
        x[i * 3 + 2] = bb;
        y[i] = 10 + 2 * a - 0.5 * bb;
        w[i] = 1;
    }
    double b[3], sse_free, sse_nn, b2[3];
    unsigned used;
    cr_assert_eq(sched_lsq(x, y, w, N, 3, 0x7, 0, b, &used, &sse_free), 0);
    cr_expect_lt(fabs(b[2] + 0.5), 1e-9);
    cr_expect_lt(sse_free, 1e-12);
    cr_assert_eq(sched_lsq(x, y, w, N, 3, 0x7, 0x6, b, &used, &sse_nn), 0);
    cr_expect_eq(b[2], 0, "the negative term is left out, got %g", b[2]);
    cr_expect_eq(used, 0x3u);
    /* and what is left is the optimum without it */
    cr_assert_eq(sched_lsq(x, y, w, N, 3, 0x3, 0, b2, NULL, NULL), 0);
    cr_expect_lt(rel(b[1], b2[1]), 1e-12);
    cr_expect_lt(rel(b[0], b2[0]), 1e-12);
    /* an all-zero column is left out, not a failure */
    for (int i = 0; i < N; i++) x[i * 3 + 2] = 0;
    cr_assert_eq(sched_lsq(x, y, w, N, 3, 0x7, 0, b, &used, NULL), 0);
    cr_expect_eq(used, 0x3u);
    /* weight 0 leaves a row out: whatever it holds changes nothing */
    w[5] = 0;
    cr_assert_eq(sched_lsq(x, y, w, N, 3, 0x3, 0, b, NULL, NULL), 0);
    y[5] = 1e9;
    cr_assert_eq(sched_lsq(x, y, w, N, 3, 0x3, 0, b2, NULL, NULL), 0);
    cr_expect_eq(b2[0], b[0]);
    cr_expect_eq(b2[1], b[1]);
    /* nothing to fit */
    cr_expect_eq(sched_lsq(x, y, w, 0, 3, 0x7, 0, b, NULL, NULL), -1);
    cr_expect_eq(sched_lsq(x, y, w, N, 9, 0x7, 0, b, NULL, NULL), -1);
}

/* The plan's prediction is the configured model over the plan's own work (first step: no
 * measured correction yet), prefill attention included. */
Test(sched_cost, plan_prediction_is_the_step_model)
{
    sched_policy *p;
    sched_policy_error err;
    cr_assert_eq(
        sched_policy_parse("[scheduler]\ntoken_budget = 96\nprefill_chunk = 40\n", &p, &err), 0);
    sched_config cfg = {.kv_blocks_device = 256,
                        .block_size = 16,
                        .kv_bytes_per_token = 64,
                        .max_context = 4096,
                        .step = {.base_us = 500,
                                 .prefill_token_us = 3,
                                 .decode_seq_us = 7,
                                 .context_token_us = 0.25,
                                 .prefill_pair_us = 0.01}};
    sched *s;
    cr_assert_eq(sched_create(p, &cfg, NULL, NULL, 1, &s), 0, "%s", sched_last_error());
    for (uint64_t id = 1; id <= 3; id++) {
        sched_request q = {.id = id,
                           .tenant = -1,
                           .class_idx = -1,
                           .prompt_len = 30 + 20 * (uint32_t)id,
                           .max_new_tokens = 8};
        cr_assert_eq(sched_submit(s, &q, 0, NULL), 0);
    }
    uint64_t now = 0;
    for (int step = 0; step < 4; step++) {
        const sched_plan *pl = sched_step(s, now);
        cr_assert(pl && pl->n_entries > 0);
        sched_plan_work w;
        sched_plan_work_of(pl, &w);
        if (step == 0) {
            cr_expect_gt(w.prefill_pairs, 0);
            cr_expect_lt(rel(pl->predicted_step_us, sched_step_model_us(&cfg.step, &w)), 1e-12,
                         "predicted %g, model %g", pl->predicted_step_us,
                         sched_step_model_us(&cfg.step, &w));
        }
        sched_result res[8];
        for (uint32_t i = 0; i < pl->n_entries; i++)
            res[i] = (sched_result){.req = pl->entries[i].req, .tokens = pl->entries[i].samples};
        now += 1000;
        cr_assert_eq(sched_commit(s, res, pl->n_entries, now, 0), 0);
    }
    sched_destroy(s);
    sched_policy_free(p);
}

/* A model whose windowed layers read the last `window` positions only: the plan's context
 * and prefill pairs charge such a layer min(context, window) — a sequence within the window
 * is charged its whole context, one past it (global + windowed × window / context) of it —
 * and the prediction is the step model over those. */
Test(sched_cost, windowed_layers_are_charged_their_window)
{
    sched_policy *p;
    sched_policy_error err;
    cr_assert_eq(
        sched_policy_parse("[scheduler]\ntoken_budget = 512\nprefill_chunk = 512\n", &p, &err), 0);
    sched_config cfg = {.kv_blocks_device = 256,
                        .block_size = 16,
                        .kv_bytes_per_token = 64,
                        .max_context = 4096,
                        .step = {.base_us = 500,
                                 .prefill_token_us = 3,
                                 .decode_seq_us = 7,
                                 .context_token_us = 0.25,
                                 .prefill_pair_us = 0.01}};
    const uint32_t lens[2] = {40, 300}; /* within a window of 64, and past it */
    double ctx[2][2], pairs[2][2];
    for (int windowed = 0; windowed < 2; windowed++) {
        /* 5 of 6 layers read 64 positions (gemma3's pattern) */
        cfg.step_window = windowed ? 64 : 0;
        cfg.step_window_layers = 5;
        cfg.step_layers = 6;
        for (int k = 0; k < 2; k++) {
            sched *s;
            cr_assert_eq(sched_create(p, &cfg, NULL, NULL, 1, &s), 0, "%s", sched_last_error());
            sched_request q = {
                .id = 1, .tenant = -1, .class_idx = -1, .prompt_len = lens[k], .max_new_tokens = 4};
            cr_assert_eq(sched_submit(s, &q, 0, NULL), 0);
            const sched_plan *pl = sched_step(s, 0);
            cr_assert(pl && pl->n_entries == 1 && pl->entries[0].n_tokens == lens[k]);
            sched_plan_work w;
            sched_plan_work_of(pl, &w);
            ctx[windowed][k] = (double)w.context_tokens;
            pairs[windowed][k] = w.prefill_pairs;
            cr_expect_lt(rel(pl->predicted_step_us, sched_step_model_us(&cfg.step, &w)), 1e-12);
            sched_destroy(s);
        }
    }
    for (int k = 0; k < 2; k++) {
        const double n = lens[k];
        cr_expect_eq(ctx[0][k], n, "every layer global: the whole context");
        cr_expect_eq(pairs[0][k], n * (n - 1) / 2);
    }
    cr_expect_eq(ctx[1][0], 40, "within the window: the whole context");
    cr_expect_eq(pairs[1][0], 40.0 * 39 / 2);
    cr_expect_eq(ctx[1][1], 103, "(global 300 + 5 windowed × 64) / 6, rounded");
    /* rows 0..63 read p positions before them on every layer, rows 64..299 read 64 on the
     * windowed layers */
    const double win_pairs = 64.0 * 63 / 2 + 64.0 * (300 - 64);
    cr_expect_lt(rel(pairs[1][1], (300.0 * 299 / 2 + 5 * win_pairs) / 6), 1e-12, "%g", pairs[1][1]);
    sched_policy_free(p);
}

Test(sched_cost, builtin_model_is_documented)
{
    sched_step_model m;
    sched_step_model_default(&m);
    cr_expect_eq(m.base_us, 3350);
    cr_expect_eq(m.prefill_token_us, 29);
    cr_expect_eq(m.decode_seq_us, 30);
    cr_expect_eq(m.context_token_us, 0.027);
    cr_expect_eq(m.prefill_pair_us, 0);
}
