/* SPDX-License-Identifier: MIT */
/*
 * Greedy sampling's argmax (kernels/sample.h), every path (the AVX2 and AVX-512 ones are
 * skipped with a message on a CPU without them), against the scalar loop that defines it:
 *   - hand-made rows whose answer is known: ties go to the lowest index, also across
 *     vector blocks and in the scalar tail; a NaN at index 0 gives 0, NaNs elsewhere are
 *     never chosen; -0 and +0 are equal (the first wins); all -inf gives 0; +inf wins;
 *   - random rows of every length 0..300 and vocabulary sizes (32,000, 32,768 + 7, 151,936)
 *     with the maximum repeated at random places and NaNs sprinkled, at every alignment
 *     of the row's start: the same index as the scalar loop, every time.
 * eng_sample with temperature 0 returns the AUTO path's answer.
 */
#include "kernels/engine.h"
#include "kernels/logits.h"
#include "kernels/sample.h"
#include "kernel_rows.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const eng_argmax_path paths[] = {ENG_ARGMAX_AUTO, ENG_ARGMAX_PORTABLE, ENG_ARGMAX_AVX2,
                                        ENG_ARGMAX_AVX512};
static const char *const path_names[] = {"auto", "portable", "avx2", "avx512"};
#define N_PATHS 4

/* The definition (sample.h), written out here again. */
static int32_t reference(const float *v, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

static void skip_note(void)
{
    static bool told;
    if (told) return;
    told = true;
    for (int p = 0; p < N_PATHS; p++)
        if (!eng_argmax_supported(paths[p]))
            cr_log_info("argmax path %s: not supported on this CPU, skipped", path_names[p]);
}

/* Every supported path on v[0..n-1] gives want. */
static void expect_all(const float *v, int n, int32_t want, const char *what)
{
    skip_note();
    for (int p = 0; p < N_PATHS; p++) {
        if (!eng_argmax_supported(paths[p])) continue;
        const int32_t got = eng_argmax(paths[p], v, n);
        cr_assert_eq(got, want, "%s, n=%d: path %s gave %d, expected %d", what, n, path_names[p],
                     got, want);
    }
}

Test(kernels_sample, known_rows)
{
    enum { N = 1000 };
    static float v[N];
    for (int i = 0; i < N; i++) v[i] = -1.0f - (float)(i % 7);
    expect_all(v, 0, 0, "empty row");
    expect_all(v, 1, 0, "one element");
    /* ties: the lowest index, whether the copies share a vector block or not */
    v[700] = 5.0f;
    v[701] = 5.0f;
    v[999] = 5.0f;
    expect_all(v, N, 700, "ties in one block");
    v[9] = 5.0f;
    expect_all(v, N, 9, "ties in different blocks");
    /* the maximum only in the scalar tail (n not a multiple of any vector width) */
    for (int i = 0; i < N; i++) v[i] = 0.5f;
    v[996] = 2.0f;
    v[998] = 2.0f;
    expect_all(v, 999, 996, "maximum in the tail");
    expect_all(v, 996, 0, "all equal: index 0");
    /* NaN: at index 0 the loop never moves; elsewhere never chosen */
    v[0] = NAN;
    expect_all(v, N, 0, "NaN at index 0");
    v[0] = 0.5f;
    v[3] = NAN;
    v[500] = NAN;
    v[997] = NAN;
    expect_all(v, N, 996, "NaNs past index 0");
    /* a NaN after the unique maximum in the same vector lane must not displace it */
    for (int i = 0; i < N; i++) v[i] = 0.5f;
    v[64] = 3.0f;
    v[128] = NAN;
    v[192] = 1.0f;
    expect_all(v, N, 64, "NaN after the maximum in its lane");
    /* -0 and +0 compare equal: the first of them */
    for (int i = 0; i < N; i++) v[i] = -1.0f;
    v[40] = -0.0f;
    v[41] = 0.0f;
    expect_all(v, N, 40, "-0 before +0");
    v[40] = 0.0f;
    v[41] = -0.0f;
    expect_all(v, N, 40, "+0 before -0");
    /* infinities */
    for (int i = 0; i < N; i++) v[i] = -INFINITY;
    expect_all(v, N, 0, "all -inf");
    v[333] = INFINITY;
    v[334] = INFINITY;
    expect_all(v, N, 333, "+inf");
}

Test(kernels_sample, random_rows_equal_the_scalar_loop)
{
    static const int vocab[] = {32000, 32768 + 7, 151936};
    const int max_n = 151936 + 16;
    float *buf = malloc((size_t)max_n * sizeof(float));
    cr_assert(buf);
    int cases = 0;
    for (int n = 0; n <= 300 + 3; n++) {
        const int len = n <= 300 ? n : vocab[n - 301];
        for (int trial = 0; trial < (len > 300 ? 40 : 6); trial++) {
            float *v = buf + rnd() % 16; /* every alignment of the row's start */
            /* few distinct values, so the maximum repeats often */
            const int levels = 1 + (int)(rnd() % 50);
            for (int i = 0; i < len; i++)
                v[i] = (float)((int)(rnd() % (uint32_t)levels) - levels / 2) * 0.25f;
            const int mode = (int)(rnd() % 5);
            if (mode == 1 && len > 0) /* a NaN or a few, sometimes at 0 */
                for (int k = 0; k < 3; k++) v[rnd() % (uint32_t)len] = NAN;
            if (mode == 2 && len > 0) /* one new maximum and a copy of it */
                v[rnd() % (uint32_t)len] = v[rnd() % (uint32_t)len] = 1000.0f;
            if (mode == 3 && len > 0) /* signed zeros at the top */
                for (int i = 0; i < len; i++) v[i] = v[i] > 0 ? (rnd() & 1 ? 0.0f : -0.0f) : v[i];
            if (mode == 4 && len > 0) { /* a unique maximum among many NaNs */
                for (int i = 0; i < len; i++)
                    if (rnd() % 8 == 0) v[i] = NAN;
                v[rnd() % (uint32_t)len] = 2000.0f;
            }
            char what[64];
            snprintf(what, sizeof what, "random row (mode %d, trial %d)", mode, trial);
            expect_all(v, len, reference(v, len), what);
            cases++;
        }
    }
    cr_log_info("%d random rows", cases);
    free(buf);
}

Test(kernels_sample, greedy_eng_sample_is_the_argmax)
{
    enum { V = 32000 };
    static float v[V];
    for (int trial = 0; trial < 20; trial++) {
        for (int i = 0; i < V; i++) v[i] = (float)(rnd() % 1000) * 0.01f;
        v[rnd() % V] = 10.0f;
        v[rnd() % V] = 10.0f;
        eng_sampling greedy = {0};
        uint64_t rng = eng_rng_init(1);
        cr_assert_eq(eng_sample(v, V, &greedy, &rng), reference(v, V));
    }
}

/* ---- the logits pipeline (kernels/logits.h) --------------------------------------------- */

/* Bias, repetition, presence and frequency as ringlm.h defines them, over a whole row. */
static void pipeline_reference(float *l, int vocab, const eng_logit_bias *b, int nb, float rep,
                               float pres, float freq, const int32_t *prompt, int np,
                               const int32_t *out, int no)
{
    for (int i = 0; i < nb; i++) l[b[i].token] += b[i].bias;
    uint32_t *count = calloc((size_t)vocab, sizeof *count);
    uint8_t *seen = calloc((size_t)vocab, 1);
    for (int i = 0; i < np; i++) seen[prompt[i]] = 1;
    for (int i = 0; i < no; i++) {
        seen[out[i]] = 1;
        count[out[i]]++;
    }
    for (int t = 0; t < vocab; t++) {
        if (!seen[t]) continue;
        if (rep != 1.0f) l[t] = l[t] > 0.0f ? l[t] / rep : l[t] * rep;
        if (count[t]) {
            l[t] -= (float)count[t] * freq;
            l[t] -= pres;
        }
    }
    free(count);
    free(seen);
}

static void capture_mask(void *ctx, float *logits, int vocab, int32_t picked)
{
    (void)vocab;
    (void)picked;
    memcpy(ctx, logits, sizeof(float) * 2048);
}

static int no_mask(void *ctx, float *logits, int vocab)
{
    (void)ctx;
    (void)logits;
    (void)vocab;
    return 0;
}

/* The processed row equals the reference computation bit for bit (seen by the constraint
 * stage, which runs right after the penalties), with a token table grown well past its first
 * size; the row is restored exactly after sampling; greedy picks the processed argmax. */
Test(kernels_sample, the_pipeline_processes_exactly_and_restores_the_row)
{
    enum { V = 2048 };
    static float row[V], raw[V], want[V], seen_by_mask[V];
    for (int i = 0; i < V; i++) row[i] = raw[i] = (float)((int)(rnd() % 2001) - 1000) / 97.0f;
    eng_logit_bias bias[5] = {{3, -100.0f}, {77, 2.5f}, {1500, 7.0f}, {2047, -0.5f}, {9, 100.0f}};
    int32_t prompt[300], out[400];
    for (int i = 0; i < 300; i++) prompt[i] = (int32_t)(rnd() % V);
    for (int i = 0; i < 400; i++) out[i] = (int32_t)(rnd() % 700); /* repeats: counts > 1 */
    eng_logits_params p = {.bias = bias,
                           .n_bias = 5,
                           .repetition_penalty = 1.3f,
                           .presence_penalty = 0.4f,
                           .frequency_penalty = 0.25f};
    eng_logits_proc *lp = eng_lp_create(&p);
    cr_assert_not_null(lp);
    cr_assert_eq(eng_lp_note_prompt(lp, prompt, 300), 0);
    for (int i = 0; i < 400; i++) cr_assert_eq(eng_lp_note_output(lp, out[i]), 0);
    cr_assert_gt(eng_lp_distinct(lp), 64, "the table grew: %u", eng_lp_distinct(lp));
    memcpy(want, raw, sizeof want);
    pipeline_reference(want, V, bias, 5, 1.3f, 0.4f, 0.25f, prompt, 300, out, 400);
    const eng_constraint_ops ops = {.mask = no_mask, .undo = capture_mask};
    eng_lp_set_constraint(lp, &ops, seen_by_mask);
    eng_sampling s = {.temperature = 0, .top_p = 1, .proc = lp};
    uint64_t rng = eng_rng_init(1);
    int32_t pick = eng_sample(row, V, &s, &rng);
    cr_assert_eq(memcmp(seen_by_mask, want, sizeof want), 0, "the processed row differs");
    cr_assert_eq(memcmp(row, raw, sizeof raw), 0, "the row was not restored");
    cr_assert_eq(pick, reference(want, V));
    cr_assert_eq(pick, 9, "+100 wins");
    eng_lp_free(lp);
}

/* min_p 1 keeps only the most likely token, whatever the temperature and the draw. */
Test(kernels_sample, min_p_one_keeps_only_the_most_likely_token)
{
    enum { V = 1000 };
    static float row[V];
    for (int i = 0; i < V; i++) row[i] = (float)(rnd() % 1000) / 300.0f;
    row[421] = 10.0f;
    eng_logits_params p = {.repetition_penalty = 1.0f, .min_p = 1.0f};
    eng_logits_proc *lp = eng_lp_create(&p);
    eng_sampling s = {.temperature = 2.0f, .top_p = 1, .proc = lp};
    eng_sampling plain = {.temperature = 2.0f, .top_p = 1};
    uint64_t r1 = eng_rng_init(5), r2 = eng_rng_init(5);
    int other = 0;
    for (int i = 0; i < 200; i++) {
        cr_assert_eq(eng_sample(row, V, &s, &r1), 421);
        other += eng_sample(row, V, &plain, &r2) != 421;
    }
    cr_assert_gt(other, 0, "without min_p the draw does leave the top token");
    eng_lp_free(lp);
}
