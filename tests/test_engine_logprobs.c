/* SPDX-License-Identifier: MIT */
/*
 * Log-probabilities on the engine: eng_logprobs_row against a long-double log-softmax
 * (value, rank, the top n in order, ties, -inf), the processed distribution, and
 * eng_execute_sample_lp on stories260K against the log-softmax of llama2.c's logits
 * (reference-greedy.json), for prompt rows and sampled rows; a batch that asks for nothing
 * samples exactly as eng_execute_sample; a row whose constraint stage fails fails alone.
 */
#include "engine_test_util.h"
#include "run_c_reference.h"
#include "kernels/logits.h"

#include <errno.h>
#include <stdlib.h>
#include <jansson.h>

/* log-softmax of v at i, in long double */
static long double ref_lse(const float *v, int n)
{
    long double max = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > max) max = v[i];
    for (int i = 0; i < n; i++) sum += expl((long double)v[i] - max);
    return max + logl(sum);
}

/* The reference top n: descending value, ascending id; -inf never listed. */
static int ref_top(const float *v, int n, int top_n, int32_t *ids)
{
    int k = 0;
    bool *taken = calloc((size_t)n, 1);
    for (; k < top_n; k++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!taken[i] && v[i] > -INFINITY && (best < 0 || v[i] > v[best])) best = i;
        if (best < 0) break;
        taken[best] = true;
        ids[k] = best;
    }
    free(taken);
    return k;
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void check_row(const float *v, int n, int32_t target, int top_n, const char *what)
{
    eng_logprobs lp;
    cr_assert_eq(eng_logprobs_row(v, n, target, top_n, &lp), 0, "%s", eng_errmsg());
    long double lse = ref_lse(v, n);
    if (target >= 0) {
        cr_assert_eq(lp.token, target);
        cr_assert(fabsl((long double)lp.logprob - (v[target] - lse)) < 1e-5, "%s: %g against %Lg",
                  what, lp.logprob, v[target] - lse);
        uint32_t rank = 1;
        for (int i = 0; i < n; i++) rank += v[i] > v[target];
        cr_assert_eq(lp.rank, rank, "%s: rank %u against %u", what, lp.rank, rank);
    }
    int32_t ids[ENG_TOP_LOGPROBS_MAX];
    int k = ref_top(v, n, top_n, ids);
    cr_assert_eq(lp.n_top, k, "%s: %d top entries, want %d", what, lp.n_top, k);
    for (int j = 0; j < k; j++) {
        cr_assert_eq(lp.top_id[j], ids[j], "%s: top %d is %d, want %d", what, j, lp.top_id[j],
                     ids[j]);
        cr_assert(fabsl((long double)lp.top_logprob[j] - (v[ids[j]] - lse)) < 1e-5);
    }
}

Test(engine_logprobs, row_equals_a_long_double_log_softmax)
{
    uint64_t seed = 42;
    const int sizes[] = {1, 7, 37, 512, 32000, 32003};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int n = sizes[si];
        float *v = malloc((size_t)n * sizeof *v);
        for (int rep = 0; rep < 3; rep++) {
            for (int i = 0; i < n; i++)
                v[i] = ((float)(lcg(&seed) % 200000) / 10000.0f - 10.0f) * (rep + 1);
            if (rep == 1 && n > 10) { /* ties: the lower id comes first */
                for (int i = 0; i < n; i += 3) v[i] = 5.0f;
            }
            if (rep == 2 && n > 10) /* masked tokens are never listed */
                for (int i = 0; i < n; i += 2) v[i] = -INFINITY;
            char what[64];
            snprintf(what, sizeof what, "vocab %d, case %d", n, rep);
            int32_t target = (int32_t)(lcg(&seed) % (uint64_t)n);
            if (rep == 2 && n > 10) target = (target | 1) < n ? target | 1 : 1; /* not masked */
            check_row(v, n, target, 20, what);
            check_row(v, n, target, 0, what);
            check_row(v, n, -1, 5, what);
        }
        free(v);
    }
}

Test(engine_logprobs, bad_arguments_are_refused)
{
    float v[4] = {0, 1, 2, 3};
    eng_logprobs lp;
    cr_assert_eq(eng_logprobs_row(v, 4, 4, 1, &lp), -EINVAL);
    cr_assert_eq(eng_logprobs_row(v, 4, 0, 21, &lp), -EINVAL);
    cr_assert_eq(eng_logprobs_row(v, 0, 0, 1, &lp), -EINVAL);
    cr_assert_str_neq(eng_errmsg(), "");
}

/* Processed: log-softmax of logits / T over the tokens top-k and top-p keep, the rest -inf. */
static int desc_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

Test(engine_logprobs, processed_distribution_is_what_the_sampler_draws_from)
{
    enum { N = 300 };
    float v[N], out[N];
    uint64_t seed = 7;
    for (int i = 0; i < N; i++) v[i] = (float)(lcg(&seed) % 1000) / 100.0f;
    eng_sampling s = {.temperature = 0.5f, .top_k = 10, .top_p = 1.0f};
    eng_logits_processed(v, N, &s, out);
    int finite = 0;
    for (int i = 0; i < N; i++) {
        if (out[i] > -INFINITY) {
            finite++;
            cr_assert_float_eq(out[i], v[i] / 0.5f, 1e-5);
        }
    }
    cr_assert_eq(finite, 10);
    eng_logprobs lp;
    cr_assert_eq(eng_logprobs_row(out, N, -1, 20, &lp), 0);
    cr_assert_eq(lp.n_top, 10, "top-k 10 leaves 10 tokens, listed %d", lp.n_top);
    double mass = 0;
    for (int j = 0; j < lp.n_top; j++) mass += exp(lp.top_logprob[j]);
    cr_assert(fabs(mass - 1.0) < 1e-5, "the kept tokens hold all the mass: %g", mass);
    /* top-p: the shortest prefix whose mass exceeds p */
    s = (eng_sampling){.temperature = 1.0f, .top_p = 0.5f};
    eng_logits_processed(v, N, &s, out);
    /* the expected prefix from the whole row (it may be longer than the 20 a row lists) */
    double pr[N], zmax = v[0], z = 0;
    for (int i = 1; i < N; i++) zmax = v[i] > zmax ? v[i] : zmax;
    for (int i = 0; i < N; i++) z += pr[i] = exp(v[i] - zmax);
    for (int i = 0; i < N; i++) pr[i] /= z;
    qsort(pr, N, sizeof pr[0], desc_double);
    double acc = 0;
    int keep = 0;
    while (acc <= 0.5 && keep < N) acc += pr[keep++];
    finite = 0;
    for (int i = 0; i < N; i++) finite += out[i] > -INFINITY;
    cr_assert_eq(finite, keep, "top-p 0.5 keeps %d tokens, want %d", finite, keep);
    /* greedy: the raw logits */
    s = (eng_sampling){.temperature = 0};
    eng_logits_processed(v, N, &s, out);
    cr_assert_arr_eq(out, v, sizeof v);
}

/* The 8 positions of the logits oracle as one sequence: rows 0..6 are prompt rows whose
 * target is the next input token, row 7 samples (greedy). Every log-probability equals the
 * log-softmax of run.c's logits within 1e-4. */
Test(engine_logprobs, prompt_and_sampled_rows_match_llama2c_logits)
{
    json_t *root = load_reference();
    if (!root) cr_skip_test("no reference data: set RINGLM_SHARED");
    char mpath[1024];
    cr_assert_not_null(ts_model_file(mpath, sizeof mpath, "stories260K.bin"));
    eng_model *m;
    cr_assert_eq(eng_model_load(mpath, &m), 0, "%s", eng_errmsg());
    const int V = eng_model_cfg(m)->vocab_size;
    eng *e = ts_engine(m, 8, 4, 2);
    json_t *positions = json_object_get(json_object_get(root, "logits_oracle"), "positions");
    cr_assert_eq(json_array_size(positions), 8);
    int32_t toks[8], blocks[2] = {3, 6};
    float *ref = malloc(sizeof(float) * 8 * (size_t)V);
    for (int p = 0; p < 8; p++) {
        json_t *pp = json_array_get(positions, (size_t)p);
        toks[p] = (int32_t)json_integer_value(json_object_get(pp, "input_token"));
        json_t *l = json_object_get(pp, "logits");
        for (int i = 0; i < V; i++)
            ref[(size_t)p * V + i] = (float)json_number_value(json_array_get(l, (size_t)i));
    }
    eng_batch_builder bb;
    cr_assert_eq(eng_bb_init(&bb, 16, 4, 2, 4), 0);
    cr_assert_eq(eng_bb_add_logits(&bb, toks, 0, 8, blocks, 2, 8), 0, "%s", eng_errmsg());
    const eng_batch *b = eng_bb_batch(&bb);
    cr_assert_eq(b->n_logits, 8);
    eng_sampling s[8] = {{0}};
    uint64_t rng[8] = {1, 1, 1, 1, 1, 1, 1, 77};
    eng_logprob_want want[8];
    for (int r = 0; r < 8; r++)
        want[r] =
            (eng_logprob_want){.top_n = 5, .no_sample = r < 7, .target = r < 7 ? toks[r + 1] : -1};
    int32_t out_tok[8];
    eng_logprobs lp[8];
    cr_assert_eq(eng_execute_sample_lp(e, b, s, rng, out_tok, want, lp), 0, "%s", eng_errmsg());
    for (int r = 0; r < 8; r++) {
        const float *row = ref + (size_t)r * V;
        int32_t t = r < 7 ? toks[r + 1] : ts_argmax(row, V);
        cr_assert_eq(out_tok[r], r < 7 ? -1 : t, "row %d sampled %d", r, out_tok[r]);
        cr_assert_eq(lp[r].token, t);
        double want_lp = (double)(row[t] - ref_lse(row, V));
        cr_assert(fabs(lp[r].logprob - want_lp) < 1e-4, "row %d: log p(%d) %.6f, run.c's %.6f", r,
                  t, lp[r].logprob, want_lp);
        int32_t ids[5];
        cr_assert_eq(ref_top(row, V, 5, ids), 5);
        cr_assert_eq(lp[r].n_top, 5);
        for (int j = 0; j < 5; j++) cr_assert_eq(lp[r].top_id[j], ids[j], "row %d top %d", r, j);
    }
    cr_assert_eq(rng[7], 77, "greedy draws nothing");
    eng_bb_free(&bb);
    free(ref);
    eng_destroy(e);
    eng_model_free(m);
    json_decref(root);
}

/* want with every row at top_n -1 is eng_execute_sample: the same tokens and rng streams. */
Test(engine_logprobs, asking_for_nothing_samples_as_before)
{
    char mpath[1024];
    if (!ts_model_file(mpath, sizeof mpath, "stories260K.bin")) cr_skip_test("no stories260K");
    eng_model *m;
    cr_assert_eq(eng_model_load(mpath, &m), 0, "%s", eng_errmsg());
    eng *e = ts_engine(m, 16, 4, 1);
    int32_t toks[4][6] = {{1, 5, 9, 13, 20, 30}, {1, 40, 41, 42, 43, 44}, {1, 2}, {1, 300}};
    int32_t blocks[4][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
    int32_t rows[4] = {6, 6, 2, 2};
    eng_batch_builder bb;
    cr_assert_eq(eng_bb_init(&bb, 32, 4, 2, 4), 0);
    for (int q = 0; q < 4; q++)
        cr_assert_eq(eng_bb_add(&bb, toks[q], 0, (uint32_t)rows[q], blocks[q], 2, true), 0);
    const eng_batch *b = eng_bb_batch(&bb);
    eng_sampling s[4] = {{.temperature = 0.8f, .top_p = 0.9f, .seed = 1},
                         {.temperature = 1.0f, .top_k = 40},
                         {.temperature = 0},
                         {.temperature = 1.3f}};
    uint64_t rng_a[4], rng_b[4];
    for (int q = 0; q < 4; q++) rng_a[q] = rng_b[q] = eng_rng_init(100 + q);
    int32_t out_a[4], out_b[4];
    cr_assert_eq(eng_execute_sample(e, b, s, rng_a, out_a, NULL), 0, "%s", eng_errmsg());
    eng_logprob_want want[4];
    for (int q = 0; q < 4; q++)
        want[q] = (eng_logprob_want){.top_n = q == 1 ? 3 : -1, .target = -1};
    eng_logprobs lp[4];
    /* the KV slots are rewritten with the same values: the second run sees the same state */
    cr_assert_eq(eng_execute_sample_lp(e, b, s, rng_b, out_b, want, lp), 0, "%s", eng_errmsg());
    cr_assert_arr_eq(out_a, out_b, sizeof out_a, "a logprobs row changes no sampled token");
    cr_assert_arr_eq(rng_a, rng_b, sizeof rng_a, "nor any rng stream");
    cr_assert_eq(lp[1].token, out_b[1]);
    cr_assert_eq(lp[1].n_top, 3);
    eng_bb_free(&bb);
    eng_destroy(e);
    eng_model_free(m);
}

/* A constraint stage that fails on one row (kernels/logits.h: mask < 0) gives that row -1 and
 * fails nothing else: the call returns 0, the other rows sample exactly as without it, through
 * eng_execute_sample and eng_execute_sample_lp (whose failed row gets no log-probabilities). */
static int failing_mask(void *ctx, float *logits, int vocab)
{
    (void)logits;
    (void)vocab;
    (*(int *)ctx)++;
    return -1;
}

Test(engine_logprobs, a_failed_constraint_fails_its_row_alone)
{
    char mpath[1024];
    if (!ts_model_file(mpath, sizeof mpath, "stories260K.bin")) cr_skip_test("no stories260K");
    eng_model *m;
    cr_assert_eq(eng_model_load(mpath, &m), 0, "%s", eng_errmsg());
    eng *e = ts_engine(m, 16, 4, 1);
    int32_t toks[3][4] = {{1, 5, 9, 13}, {1, 40, 41, 42}, {1, 300, 301, 302}};
    int32_t blocks[3][1] = {{0}, {1}, {2}};
    eng_batch_builder bb;
    cr_assert_eq(eng_bb_init(&bb, 16, 3, 1, 4), 0);
    for (int q = 0; q < 3; q++) cr_assert_eq(eng_bb_add(&bb, toks[q], 0, 4, blocks[q], 1, true), 0);
    const eng_batch *b = eng_bb_batch(&bb);
    int calls = 0;
    const eng_constraint_ops ops = {.mask = failing_mask};
    eng_logits_params p = {.repetition_penalty = 1.0f};
    eng_logits_proc *lp = eng_lp_create(&p);
    cr_assert_not_null(lp);
    eng_lp_set_constraint(lp, &ops, &calls);
    for (int with_lp = 0; with_lp < 2; with_lp++) {
        eng_sampling plain[3] = {{.temperature = 0.9f}, {.temperature = 0}, {.temperature = 1.1f}};
        eng_sampling s[3] = {plain[0], plain[1], plain[2]};
        s[1].proc = lp;
        uint64_t rng_a[3], rng_b[3];
        for (int q = 0; q < 3; q++) rng_a[q] = rng_b[q] = eng_rng_init(7 + q);
        int32_t out_a[3], out_b[3];
        cr_assert_eq(eng_execute_sample(e, b, plain, rng_a, out_a, NULL), 0, "%s", eng_errmsg());
        eng_logprob_want want[3];
        eng_logprobs got[3];
        for (int q = 0; q < 3; q++) want[q] = (eng_logprob_want){.top_n = 2, .target = -1};
        int rc = with_lp ? eng_execute_sample_lp(e, b, s, rng_b, out_b, want, got)
                         : eng_execute_sample(e, b, s, rng_b, out_b, NULL);
        cr_assert_eq(rc, 0, "the batch failed: %s", eng_errmsg());
        cr_expect_eq(out_b[1], -1, "the failed row");
        cr_expect_eq(out_b[0], out_a[0], "row 0 sampled as without the failing row");
        cr_expect_eq(out_b[2], out_a[2], "row 2 sampled as without the failing row");
        if (with_lp) {
            cr_expect_eq(got[0].token, out_b[0]);
            cr_expect_eq(got[2].token, out_b[2]);
        }
    }
    cr_expect_eq(calls, 2, "the stage ran once per call");
    eng_lp_free(lp);
    eng_bb_free(&bb);
    eng_destroy(e);
    eng_model_free(m);
}
