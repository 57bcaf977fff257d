/* ringlm — the simulator's step model fitted to a real ringlmd's iterations (--iteration-log):
 * exact recovery with outliers, nulls and transfer lines, decode-only logs, negative slopes,
 * malformed lines, and a simulation that charges the fitted model. SPDX-License-Identifier: MIT */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sched/sched.h"
#include "sim/engine.h"
#include "sim/err.h"
#include "sim/service.h"
#include "sim/report.h"
#include "sim/trace.h"
#include "tests/helpers.h"
#include "tests/sim_test_util.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static char tmpdir[64];

static void mk_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ringlm-itfit-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void rm_tmpdir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    (void)!system(cmd);
}

TestSuite(sim_itfit, .init = mk_tmpdir, .fini = rm_tmpdir);

static const char *tmp_path(const char *name, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s", tmpdir, name);
    return buf;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
}

/* deterministic generator (the test must not depend on libc's rand) */
static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

typedef struct model {
    double base, a, b, c, d;
} model;

static double model_us(const model *m, double pt, double ds, double ct, double pp)
{
    return m->base + m->a * pt + m->b * ds + m->c * ct + m->d * pp;
}

/* One iteration line as ringlmd writes it; period < 0 writes null, period == -2 leaves the key out. */
static void put_line(FILE *f, unsigned it, double period, uint32_t pt, uint32_t start, uint32_t ds,
                     double dctx, unsigned transfers)
{
    double pp = pt ? (double)pt * start + (double)pt * (pt - 1) / 2 : 0;
    double ct = dctx + (pt ? start + pt : 0);
    fprintf(f, "{\"it\":%u,\"t_us\":%u,", it, it * 1000);
    if (period == -1)
        fprintf(f, "\"period_us\":null,");
    else if (period >= 0)
        fprintf(f, "\"period_us\":%.17g,", period);
    fprintf(f,
            "\"iter_us\":100,\"exec_us\":90,\"prefill_tokens\":%u,\"prefill_seqs\":%u,\"prefill_"
            "pairs\":%.17g,"
            "\"decode_seqs\":%u,\"decode_context\":%.17g,\"context_tokens\":%.0f,\"transfers\":%u,"
            "\"wakes\":%u,"
            "\"future_key\":[1,2]}\n",
            pt, pt ? 1 : 0, pp, ds, dctx, ct, transfers, ds);
}

static void expect_rel(double got, double want, double tol, const char *what)
{
    double e = want != 0 ? fabs(got - want) / fabs(want) : fabs(got);
    cr_expect(e <= tol, "%s: fitted %.12g, true %.12g (rel. error %.3g > %.3g)", what, got, want, e,
              tol);
}

/* Writes a log of a mixed workload under model m: `n` usable lines, `outliers` of them with a
 * period 5× the model's, plus idle (null / missing period) and transfer lines with nonsense
 * periods. Returns the usable line count. */
static size_t write_mixed_log(const char *path, const model *m, size_t n, size_t outliers,
                              size_t *idle, size_t *transfers)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    *idle = *transfers = 0;
    unsigned it = 0;
    for (size_t i = 0; i < n; i++) {
        static const uint32_t chunks[] = {0, 0, 0, 16, 64, 256};
        uint32_t pt = chunks[rnd(6)];
        uint32_t ds = pt ? rnd(9) : 1 + rnd(8);
        uint32_t start = pt ? rnd(300) : 0;
        double dctx = 0;
        for (uint32_t k = 0; k < ds; k++) dctx += 10 + rnd(500);
        double pp = pt ? (double)pt * start + (double)pt * (pt - 1) / 2 : 0;
        double ct = dctx + (pt ? start + pt : 0);
        double y = model_us(m, pt, ds, ct, pp);
        if (i < outliers) y = y * 50 + 2000; /* the process was stopped mid-iteration */
        put_line(f, it++, y, pt, start, ds, dctx, 0);
        if (i % 17 == 3) {
            put_line(f, it++, -1, pt, start, ds, dctx, 0);
            ++*idle;
        }
        if (i % 29 == 5) {
            put_line(f, it++, -2, pt, start, ds, dctx, 0);
            ++*idle;
        }
        if (i % 23 == 7) {
            put_line(f, it++, 20 * y, 0, 0, ds, dctx, 2);
            ++*transfers;
        }
        if (i % 31 == 1) fputs("\n", f); /* blank lines are fine */
    }
    cr_assert_eq(fclose(f), 0);
    return n;
}

/* ---- the fit -------------------------------------------------------------------------------- */

Test(sim_itfit, exact_recovery_drops_outliers_ignores_nulls_and_transfers)
{
    model m = {40, 2.5, 12, 0.03, 0.002};
    char path[128];
    size_t idle, transfers;
    size_t n =
        write_mixed_log(tmp_path("it.jsonl", path, sizeof path), &m, 400, 5, &idle, &transfers);
    sim_service s;
    sim_service_default(&s);
    s.loop_step_us = 50; /* a calibration's serving-loop terms: replaced */
    s.loop_context_us = 0.1;
    s.loop_points = 7;
    const char *paths[] = {path};
    int rc = sim_service_fit_iterations(&s, paths, 1);
    cr_assert_eq(rc, 0, "fit: %s", sim_err());
    expect_rel(s.base_us, m.base, 1e-7, "base_us");
    expect_rel(s.per_prefill_token_us, m.a, 1e-7, "per_prefill_token_us");
    expect_rel(s.per_decode_seq_us, m.b, 1e-7, "per_decode_seq_us");
    expect_rel(s.per_context_token_us, m.c, 1e-7, "per_context_token_us");
    expect_rel(s.per_prefill_pair_us, m.d, 1e-7, "per_prefill_pair_us");
    cr_expect_str_eq(s.fit, "iterations-fit");
    cr_expect_eq(s.it_terms, 0x1f, "terms 0x%x", s.it_terms);
    cr_expect_eq(s.it_idle, idle, "lines without a period: %zu, written %zu", s.it_idle, idle);
    cr_expect_eq(s.it_transfers, transfers, "transfer lines: %zu, written %zu", s.it_transfers,
                 transfers);
    cr_expect_eq(s.it_lines, n + idle + transfers, "lines %zu", s.it_lines);
    /* the five gross errors and only them */
    cr_expect_eq(s.it_dropped, 5, "dropped %zu", s.it_dropped);
    cr_expect_eq(s.it_points + s.it_dropped, n, "points %zu + dropped %zu != %zu", s.it_points,
                 s.it_dropped, n);
    cr_expect(s.median_rel_err < 1e-9 && s.it_p90_rel_err < 1e-9 && s.max_rel_err < 1e-8,
              "median %g p90 %g max %g", s.median_rel_err, s.it_p90_rel_err, s.max_rel_err);
    cr_expect(s.r2 > 1 - 1e-12, "R² %.15f", s.r2);
    cr_expect_eq(s.loop_step_us, 0);
    cr_expect_eq(s.loop_context_us, 0);
    cr_expect_eq(s.loop_points, 0);
    cr_expect_eq(s.grid_points, 0);
    /* KV figures stay the default's */
    cr_expect_eq(s.kv_blocks_device, 53500);
    cr_expect(strstr(s.it_source, "it.jsonl") != NULL, "%s", s.it_source);
    /* the built-in model it replaced is nowhere near these periods, and that is reported */
    cr_expect(s.it_prior_median_rel_err > 1, "prior %g", s.it_prior_median_rel_err);
}

Test(sim_itfit, several_logs_are_pooled)
{
    model m = {25, 1.5, 8, 0.02, 0.001};
    char p1[128], p2[128];
    size_t idle1, tr1, idle2, tr2;
    size_t n1 = write_mixed_log(tmp_path("a.jsonl", p1, sizeof p1), &m, 60, 0, &idle1, &tr1);
    size_t n2 = write_mixed_log(tmp_path("b.jsonl", p2, sizeof p2), &m, 80, 0, &idle2, &tr2);
    sim_service s;
    sim_service_default(&s);
    const char *paths[] = {p1, p2};
    cr_assert_eq(sim_service_fit_iterations(&s, paths, 2), 0, "%s", sim_err());
    cr_expect_eq(s.it_points, n1 + n2, "points %zu", s.it_points);
    cr_expect_eq(s.it_dropped, 0);
    cr_expect_eq(s.it_files, 2);
    cr_expect(strstr(s.it_source, "a.jsonl") && strstr(s.it_source, "b.jsonl"), "%s", s.it_source);
    expect_rel(s.per_prefill_pair_us, m.d, 1e-7, "per_prefill_pair_us");
    expect_rel(s.base_us, m.base, 1e-7, "base_us");
}

/* Noise that is ±20% around the model: weighting by the observed period would favour the fast
 * half and fit the model low (the mean of each pair under 1/y² weights is 0.92 of the model);
 * weights from the previous fit's prediction recover the model itself. */
Test(sim_itfit, symmetric_noise_does_not_pull_the_model_low)
{
    model m = {40, 2.5, 12, 0.03, 0.002};
    char path[128];
    tmp_path("noise.jsonl", path, sizeof path);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (unsigned i = 0; i < 100; i++) {
        static const uint32_t chunks[] = {0, 0, 32, 128};
        uint32_t pt = chunks[i % 4], ds = pt ? i % 5 : 1 + i % 7, start = pt ? (i * 11) % 200 : 0;
        double dctx = 0;
        for (uint32_t k = 0; k < ds; k++) dctx += 20 + (i * 31 + k * 7) % 400;
        double pp = pt ? (double)pt * start + (double)pt * (pt - 1) / 2 : 0,
               ct = dctx + (pt ? start + pt : 0);
        double y = model_us(&m, pt, ds, ct, pp);
        put_line(f, 2 * i, 0.8 * y, pt, start, ds, dctx, 0);
        put_line(f, 2 * i + 1, 1.2 * y, pt, start, ds, dctx, 0);
    }
    fclose(f);
    sim_service s;
    sim_service_default(&s);
    const char *paths[] = {path};
    cr_assert_eq(sim_service_fit_iterations(&s, paths, 1), 0, "%s", sim_err());
    cr_expect_eq(s.it_dropped, 0, "dropped %zu", s.it_dropped);
    expect_rel(s.base_us, m.base, 1e-7, "base_us");
    expect_rel(s.per_prefill_token_us, m.a, 1e-7, "per_prefill_token_us");
    expect_rel(s.per_decode_seq_us, m.b, 1e-7, "per_decode_seq_us");
    expect_rel(s.per_context_token_us, m.c, 1e-7, "per_context_token_us");
    expect_rel(s.per_prefill_pair_us, m.d, 1e-7, "per_prefill_pair_us");
    /* relative to the observed period: 0.2/0.8 and 0.2/1.2, half the points each */
    expect_rel(s.median_rel_err, (0.25 + 0.2 / 1.2) / 2, 1e-7, "median relative error");
}

/* A decode-only run has no prefill columns: those terms are left out (0), not NaN. */
Test(sim_itfit, decode_only_log_gives_a_finite_model)
{
    model m = {30, 0, 10, 0.05, 0};
    char path[128];
    tmp_path("dec.jsonl", path, sizeof path);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (unsigned i = 0; i < 50; i++) {
        uint32_t ds = 1 + i % 7;
        double dctx = 0;
        for (uint32_t k = 0; k < ds; k++) dctx += 20 + (i * 37 + k * 11) % 400;
        put_line(f, i, model_us(&m, 0, ds, dctx, 0), 0, 0, ds, dctx, 0);
    }
    fclose(f);
    sim_service s;
    sim_service_default(&s);
    const char *paths[] = {path};
    cr_assert_eq(sim_service_fit_iterations(&s, paths, 1), 0, "%s", sim_err());
    double v[] = {s.base_us,
                  s.per_prefill_token_us,
                  s.per_decode_seq_us,
                  s.per_context_token_us,
                  s.per_prefill_pair_us,
                  s.r2,
                  s.median_rel_err,
                  s.it_p90_rel_err};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        cr_expect(isfinite(v[i]), "value %zu is %g", i, v[i]);
    cr_expect_eq(s.per_prefill_token_us, 0);
    cr_expect_eq(s.per_prefill_pair_us, 0);
    cr_expect_eq(s.it_terms, 0x1 | 0x4 | 0x8, "terms 0x%x", s.it_terms);
    expect_rel(s.base_us, 30, 1e-8, "base_us");
    expect_rel(s.per_decode_seq_us, 10, 1e-8, "per_decode_seq_us");
    expect_rel(s.per_context_token_us, 0.05, 1e-8, "per_context_token_us");

    /* one sequence throughout: decode_seqs is the constant column again → base + context */
    f = fopen(path, "w");
    for (unsigned i = 0; i < 30; i++)
        put_line(f, i, model_us(&m, 0, 1, 50 + i, 0), 0, 0, 1, 50 + i, 0);
    fclose(f);
    cr_assert_eq(sim_service_fit_iterations(&s, paths, 1), 0, "%s", sim_err());
    cr_expect(isfinite(s.base_us) && isfinite(s.per_decode_seq_us) &&
              isfinite(s.per_context_token_us));
    /* base and decode are one column here: whichever carries it, one step of one sequence
     * costs the same */
    expect_rel(sim_service_step_us(&s, 0, 1, 60, 0), model_us(&m, 0, 1, 60, 0), 1e-8,
               "one-sequence step");
    expect_rel(s.per_context_token_us, 0.05, 1e-8, "per_context_token_us");

    /* a single point: a constant */
    write_file(path, "{\"period_us\":77,\"prefill_tokens\":0,\"prefill_pairs\":0,\"decode_seqs\":1,"
                     "\"context_tokens\":9,\"transfers\":0}\n");
    cr_assert_eq(sim_service_fit_iterations(&s, paths, 1), 0, "%s", sim_err());
    cr_expect_float_eq(sim_service_step_us(&s, 0, 1, 9, 0), 77, 1e-9, "%g",
                       sim_service_step_us(&s, 0, 1, 9, 0));
    cr_expect_eq(__builtin_popcount(s.it_terms), 1, "terms 0x%x", s.it_terms);
}

/* A slope that comes out negative is left out rather than charged: steps never shrink as a
 * batch grows. */
Test(sim_itfit, negative_terms_are_left_out)
{
    char path[128];
    tmp_path("neg.jsonl", path, sizeof path);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (unsigned i = 0; i < 40; i++) {
        uint32_t ds = 1 + i % 5;
        double dctx = 100.0 * ds + (i * 7) % 50;
        /* cost falls with context (as cache effects can make it look) */
        put_line(f, i, 200 + 20 * ds - 0.05 * dctx, 0, 0, ds, dctx, 0);
    }
    fclose(f);
    sim_service s;
    sim_service_default(&s);
    const char *paths[] = {path};
    cr_assert_eq(sim_service_fit_iterations(&s, paths, 1), 0, "%s", sim_err());
    cr_expect(s.base_us >= 0 && s.per_prefill_token_us >= 0 && s.per_decode_seq_us >= 0 &&
                  s.per_context_token_us >= 0 && s.per_prefill_pair_us >= 0,
              "%g %g %g %g %g", s.base_us, s.per_prefill_token_us, s.per_decode_seq_us,
              s.per_context_token_us, s.per_prefill_pair_us);
    cr_expect_eq(s.per_context_token_us, 0);
    cr_expect(!(s.it_terms & 0x8), "context term kept: 0x%x", s.it_terms);
    cr_expect(s.median_rel_err < 0.05, "median %g", s.median_rel_err);
}

/* ---- errors --------------------------------------------------------------------------------- */

static void expect_error(const char *name, const char *text, const char *want1, const char *want2)
{
    char path[128];
    tmp_path(name, path, sizeof path);
    write_file(path, text);
    sim_service s;
    sim_service_default(&s);
    const char *paths[] = {path};
    int rc = sim_service_fit_iterations(&s, paths, 1);
    cr_expect_eq(rc, -EINVAL, "%s: rc %d (%s)", name, rc, sim_err());
    char where[160];
    snprintf(where, sizeof where, "%s:%s", path, want1);
    cr_expect(strstr(sim_err(), where) != NULL, "%s: error \"%s\" does not name %s", name,
              sim_err(), where);
    if (want2)
        cr_expect(strstr(sim_err(), want2) != NULL, "%s: error \"%s\" does not name %s", name,
                  sim_err(), want2);
}

#define GOOD                                                                                       \
    "{\"period_us\":100,\"prefill_tokens\":0,\"prefill_pairs\":0,\"decode_seqs\":1,\"context_"     \
    "tokens\":9,\"transfers\":0}\n"

Test(sim_itfit, malformed_lines_name_file_line_and_field)
{
    expect_error("str.jsonl",
                 GOOD GOOD "{\"period_us\":100,\"prefill_tokens\":0,\"prefill_pairs\":0,\"decode_"
                           "seqs\":\"2\",\"context_tokens\":9}\n",
                 "3:", "\"decode_seqs\" is not a number");
    /* A line cut short (torn: its writer died mid-line) is skipped; one that is not JSON in
     * another way is an error. */
    expect_error("garbled.jsonl", GOOD "{\"period_us\":100,\"prefill_tokens\":0,}\n",
                 "2:", "not JSON");
    expect_error(
        "missing.jsonl",
        GOOD "{\"period_us\":100,\"prefill_tokens\":0,\"decode_seqs\":1,\"context_tokens\":9}\n",
        "2:", "\"prefill_pairs\"");
    expect_error("frac.jsonl",
                 "{\"period_us\":100,\"prefill_tokens\":2.5,\"prefill_pairs\":0,\"decode_seqs\":1,"
                 "\"context_tokens\":9}\n",
                 "1:", "\"prefill_tokens\"");
    expect_error("negative.jsonl",
                 GOOD GOOD GOOD "{\"period_us\":-4,\"prefill_tokens\":0,\"prefill_pairs\":0,"
                                "\"decode_seqs\":1,\"context_tokens\":9}\n",
                 "4:", "\"period_us\"");
    expect_error("array.jsonl", GOOD "[1,2,3]\n", "2:", "not a JSON object");
    expect_error("bool.jsonl",
                 "{\"period_us\":true,\"prefill_tokens\":0,\"prefill_pairs\":0,\"decode_seqs\":1,"
                 "\"context_tokens\":9}\n",
                 "1:", "\"period_us\" is not a number");
    expect_error("transfers.jsonl",
                 GOOD "{\"period_us\":1,\"prefill_tokens\":0,\"prefill_pairs\":0,\"decode_seqs\":1,"
                      "\"context_tokens\":9,\"transfers\":\"x\"}\n",
                 "2:", "\"transfers\"");
    expect_error("huge.jsonl",
                 "{\"period_us\":1e999,\"prefill_tokens\":0,\"prefill_pairs\":0,\"decode_seqs\":1,"
                 "\"context_tokens\":9}\n",
                 "1:", NULL);

    /* only nulls and transfers: nothing to fit, said so */
    char path[128];
    tmp_path("none.jsonl", path, sizeof path);
    write_file(path, "{\"period_us\":null,\"prefill_tokens\":0,\"prefill_pairs\":0,\"decode_seqs\":"
                     "1,\"context_tokens\":9,\"transfers\":0}\n"
                     "{\"period_us\":40,\"prefill_tokens\":0,\"prefill_pairs\":0,\"decode_seqs\":1,"
                     "\"context_tokens\":9,\"transfers\":1}\n");
    sim_service s;
    sim_service_default(&s);
    const char *paths[] = {path};
    cr_expect_eq(sim_service_fit_iterations(&s, paths, 1), -EINVAL);
    cr_expect(strstr(sim_err(), "no usable iterations") && strstr(sim_err(), "none.jsonl"), "%s",
              sim_err());

    /* a missing file */
    const char *missing[] = {"/nonexistent/it.jsonl"};
    cr_expect_eq(sim_service_fit_iterations(&s, missing, 1), -ENOENT);
    cr_expect(strstr(sim_err(), "/nonexistent/it.jsonl") != NULL, "%s", sim_err());

    /* the error names the second file of two */
    char good[128];
    write_file(tmp_path("good.jsonl", good, sizeof good), GOOD GOOD);
    tmp_path("bad2.jsonl", path, sizeof path);
    write_file(path, GOOD "{oops}\n");
    const char *two[] = {good, path};
    cr_expect_eq(sim_service_fit_iterations(&s, two, 2), -EINVAL);
    char where[160];
    snprintf(where, sizeof where, "%s:2:", path);
    cr_expect(strstr(sim_err(), where) != NULL, "%s", sim_err());
}

/* Random bytes, binary junk and half lines never crash the reader. */
Test(sim_itfit, garbage_never_crashes)
{
    char path[128];
    tmp_path("junk.jsonl", path, sizeof path);
    for (int round = 0; round < 50; round++) {
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        const char *good = GOOD;
        size_t len = strlen(good), cut = rnd((uint32_t)len);
        fwrite(good, 1, len, f);
        for (int i = 0; i < 40; i++) fputc(round % 2 ? (int)rnd(256) : good[rnd((uint32_t)len)], f);
        fwrite(good, 1, cut, f);
        fclose(f);
        sim_service s;
        sim_service_default(&s);
        const char *paths[] = {path};
        int rc = sim_service_fit_iterations(&s, paths, 1);
        cr_expect(rc == 0 || (rc == -EINVAL && strstr(sim_err(), path)), "round %d: rc %d %s",
                  round, rc, sim_err());
    }
}

/* ---- the simulation charges the fitted model ------------------------------------------------ */

/* The model the sim tests below run: steps never land on an integer, so ceil() is stable
 * against the fit's last bits. */
static const model sim_m = {100, 2, 30, 0.45, 0.01};

static void write_sim_model_log(const char *path)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (unsigned i = 0; i < 120; i++) {
        uint32_t pt = (i % 3) ? 0 : 8 + (i * 13) % 200, ds = (i % 3) ? 1 + i % 6 : i % 4,
                 start = pt ? (i * 7) % 100 : 0;
        double dctx = 0;
        for (uint32_t k = 0; k < ds; k++) dctx += 30 + (i * 17 + k * 29) % 300;
        double pp = pt ? (double)pt * start + (double)pt * (pt - 1) / 2 : 0,
               ct = dctx + (pt ? start + pt : 0);
        put_line(f, i, model_us(&sim_m, pt, ds, ct, pp), pt, start, ds, dctx, 0);
    }
    fclose(f);
}

/* One request of prompt 100 and 3 output tokens, alone:
 *   step 1 @0:   prefill 100 rows at 0..99: context 100, pairs 4950
 *                100 + 2*100 + 0.45*100 + 0.01*4950          = 394.5  → 395: token 1 @395
 *   step 2 @395: decode at position 100: context 101, 1 sequence
 *                100 + 30 + 0.45*101                          = 175.45 → 176: token 2 @571
 *   step 3 @571: context 102: 100 + 30 + 45.9                 = 175.9  → 176: token 3 @747 */
#define HAND_FIRST 395
#define HAND_END   747

/* A trace with the default tenant and class, for requests pushed by hand. */
static void default_trace(sim_trace *t, const char *name)
{
    sim_trace_init(t, name);
    cr_assert_geq(sim_trace_tenant(t, "default"), 0);
    cr_assert_geq(sim_trace_class(t, "default"), 0);
}

/* Runs t under a token-budget policy (budget 512, chunks of 256) with service s. Returns the
 * policy, which the run refers to: free it after the run. */
static sched_policy *run_token_budget(const sim_trace *t, sim_service *s, sim_run *run)
{
    sched_policy *p = NULL;
    sched_policy_error pe = {0};
    cr_assert_eq(
        sched_policy_parse(
            "[scheduler]\nmode = token_budget\ntoken_budget = 512\nprefill_chunk = 256\n", &p, &pe),
        0, "%s", pe.reason);
    sim_options o;
    sim_options_defaults(&o);
    o.policy = p;
    o.policy_name = "test";
    o.svc = s;
    cr_assert_eq(sim_run_trace(t, &o, run), 0, "%s", sim_err());
    return p;
}

Test(sim_itfit, simulation_charges_the_fitted_model)
{
    char path[128];
    write_sim_model_log(tmp_path("sim.jsonl", path, sizeof path));
    sim_service s;
    sim_service_default(&s);
    s.loop_step_us = 1000; /* would show if the loop terms survived */
    const char *paths[] = {path};
    cr_assert_eq(sim_service_fit_iterations(&s, paths, 1), 0, "%s", sim_err());
    cr_assert_eq(s.it_terms, 0x1f, "terms 0x%x", s.it_terms);
    sim_trace t;
    default_trace(&t, "one");
    sim_req r;
    memset(&r, 0, sizeof r);
    r.deadline_us = r.real_first_token_us = r.real_finish_us = r.cancel_us = SIM_NO_TIME;
    r.prompt_tokens = 100;
    r.output_tokens = r.max_tokens = 3;
    cr_assert_eq(sim_trace_push(&t, &r), 0);
    sim_run run;
    sched_policy *p = run_token_budget(&t, &s, &run);
    const sim_rec *a = &run.recs[run.final_rec[0]];
    cr_expect_eq(run.steps, 3, "steps %llu", (unsigned long long)run.steps);
    cr_expect_eq(a->first_token_us, HAND_FIRST, "first token %lld", (long long)a->first_token_us);
    cr_expect_eq(a->end_us, HAND_END, "end %lld", (long long)a->end_us);
    sim_run_free(&run);
    sched_policy_free(p);
    sim_trace_free(&t);
}

Test(sim_itfit, program_fits_reports_and_replays_with_the_log)
{
    char prog[512];
    snprintf(prog, sizeof prog, "%s/ringlm-sim", th_bin_dir());
    if (access(prog, X_OK) != 0) cr_skip_test("%s not built (set RINGLM_BIN)", prog);
    char itlog[128], trace[128], reqlog[128], cmd[2048], *out;
    write_sim_model_log(tmp_path("sim.jsonl", itlog, sizeof itlog));
    write_file(
        tmp_path("trace.jsonl", trace, sizeof trace),
        "{\"req\":1,\"arrival_us\":0,\"tenant\":\"default\",\"class\":\"default\",\"prompt_"
        "tokens\":100,"
        "\"max_tokens\":3,\"output_tokens\":3,\"finish_us\":0,\"finish_reason\":\"length\"}\n");
    tmp_path("out.jsonl", reqlog, sizeof reqlog);
    snprintf(cmd, sizeof cmd, "%s --trace %s --iteration-log %s --json --request-log %s 2>&1", prog,
             trace, itlog, reqlog);
    int rc = run_shell(cmd, &out);
    cr_assert_eq(rc, 0, "%s\n%s", cmd, out);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert_not_null(j, "not JSON (%s): %.500s", je.text, out);
    json_t *sv = json_object_get(j, "service"), *it = json_object_get(sv, "iterations");
    cr_expect_str_eq(json_string_value(json_object_get(sv, "fit")), "iterations-fit");
    cr_assert(json_is_object(it), "service.iterations missing: %.2000s", out);
    cr_expect_str_eq(json_string_value(json_object_get(it, "model")), "iterations-fit");
    cr_expect(strstr(json_string_value(json_object_get(it, "source")), "sim.jsonl") != NULL);
    cr_expect_eq(json_integer_value(json_object_get(it, "points")), 120);
    cr_expect_eq(json_integer_value(json_object_get(it, "dropped")), 0);
    cr_expect(json_number_value(json_object_get(it, "r2")) > 0.999999);
    cr_expect(json_is_number(json_object_get(it, "median_rel_err")) &&
              json_is_number(json_object_get(it, "p90_rel_err")));
    cr_expect(fabs(json_number_value(json_object_get(sv, "per_prefill_pair_us")) - 0.01) < 1e-9);
    json_decref(j);
    free(out);
    /* the replay: the request log carries the hand-computed times */
    FILE *f = fopen(reqlog, "r");
    cr_assert_not_null(f, "%s", reqlog);
    char line[2048];
    cr_assert_not_null(fgets(line, sizeof line, f));
    fclose(f);
    json_t *rq = json_loads(line, 0, &je);
    cr_assert_not_null(rq, "%s", line);
    cr_expect_eq(json_integer_value(json_object_get(rq, "first_token_us")), HAND_FIRST, "%s", line);
    cr_expect_eq(json_integer_value(json_object_get(rq, "finish_us")), HAND_END, "%s", line);
    json_decref(rq);
    /* the table says what was fitted */
    snprintf(cmd, sizeof cmd, "%s --trace %s --iteration-log %s --iteration-log %s 2>&1", prog,
             trace, itlog, itlog);
    rc = run_shell(cmd, &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "model iterations-fit from") && strstr(out, "240 points used") &&
                  strstr(out, "p90"),
              "%s", out);
    free(out);
    /* a malformed log stops the program with file:line */
    char bad[128];
    write_file(tmp_path("bad.jsonl", bad, sizeof bad), GOOD "{\"period_us\":\"fast\"}\n");
    snprintf(cmd, sizeof cmd, "%s --trace %s --iteration-log %s 2>&1", prog, trace, bad);
    rc = run_shell(cmd, &out);
    cr_expect_neq(rc, 0, "%s", out);
    char where[160];
    snprintf(where, sizeof where, "%s:2:", bad);
    cr_expect(strstr(out, where) != NULL, "%s", out);
    free(out);
}

/* Skewed noise, as on a real log: one decode step in five pays a client wake (+60%). A
 * simulated latency is a sum of steps, so the fit must get the sum of each kind of batch right
 * (a fit of relative error put the decode steps ~7% above their sum on real logs). */
Test(sim_itfit, sums_of_each_batch_kind_are_unbiased_under_skewed_noise)
{
    char path[128];
    tmp_path("skew.jsonl", path, sizeof path);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    const model m = {20, 9, 35, 0.15, 0.1};
    double sum_obs[2] = {0, 0};
    struct {
        uint32_t pt, start, ds;
        double dctx;
    } b[600];
    double obs[600];
    for (unsigned i = 0; i < 600; i++) {
        bool prefill = i % 10 == 0;
        b[i].pt = prefill ? 32 + rnd(224) : 0;
        b[i].start = prefill ? rnd(200) : 0;
        b[i].ds = prefill ? rnd(2) : 1 + (i % 7 == 0);
        b[i].dctx = b[i].ds ? (double)(b[i].ds * (50 + rnd(400))) : 0;
        double pp =
            b[i].pt ? (double)b[i].pt * b[i].start + (double)b[i].pt * (b[i].pt - 1) / 2 : 0;
        double ct = b[i].dctx + (b[i].pt ? b[i].start + b[i].pt : 0);
        double y = model_us(&m, b[i].pt, b[i].ds, ct, pp);
        if (i % 5 == 1) y *= 1.6; /* the wake */
        obs[i] = y;
        sum_obs[prefill] += y;
        put_line(f, i, y, b[i].pt, b[i].start, b[i].ds, b[i].dctx, 0);
    }
    fclose(f);
    sim_service s;
    sim_service_default(&s);
    const char *paths[] = {path};
    cr_assert_eq(sim_service_fit_iterations(&s, paths, 1), 0, "%s", sim_err());
    double sum_pred[2] = {0, 0};
    for (unsigned i = 0; i < 600; i++) {
        double pp =
            b[i].pt ? (double)b[i].pt * b[i].start + (double)b[i].pt * (b[i].pt - 1) / 2 : 0;
        double ct = b[i].dctx + (b[i].pt ? b[i].start + b[i].pt : 0);
        sum_pred[i % 10 == 0] += sim_service_step_us(&s, b[i].pt, b[i].ds, (uint64_t)ct, pp);
    }
    (void)obs;
    /* ordinary noise is kept: within 2% */
    cr_expect(fabs(sum_pred[0] / sum_obs[0] - 1) < 0.02,
              "decode steps: Σ model %.0f vs Σ observed %.0f (dropped %zu)", sum_pred[0],
              sum_obs[0], s.it_dropped);
    cr_expect(fabs(sum_pred[1] / sum_obs[1] - 1) < 0.02,
              "prefill steps: Σ model %.0f vs Σ observed %.0f", sum_pred[1], sum_obs[1]);
}

/* --speed-trace: a run whose second half went 1.5× slower is replayed with that factor in
 * the windows where it happened, and 1 where a window has too few iterations. */
Test(sim_itfit, speed_trace_measures_the_drift_per_window)
{
    char path[128];
    tmp_path("speed.jsonl", path, sizeof path);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    const model m = {20, 9, 35, 0.15, 0.1};
    /* put_line stamps t_us = it × 1000: 200 iterations per 200 ms window */
    for (unsigned i = 0; i < 800; i++) {
        uint32_t pt = i % 8 == 0 ? 64 + rnd(128) : 0, ds = 1 + (i % 3 == 0);
        double dctx = ds * (double)(40 + rnd(300));
        double pp = pt ? (double)pt * (pt - 1) / 2 : 0, ct = dctx + pt;
        double y = model_us(&m, pt, ds, ct, pp) * (i >= 400 ? 1.5 : 1.0);
        put_line(f, i, y, pt, 0, ds, dctx, 0);
    }
    put_line(f, 1000, 77, 0, 0, 1, 100, 0); /* a lone iteration in a window of its own */
    fclose(f);
    sim_service s;
    sim_service_default(&s);
    s.speed_window_us = 200000;
    const char *paths[] = {path};
    cr_assert_eq(sim_service_fit_iterations(&s, paths, 1), 0, "%s", sim_err());
    cr_assert_eq(s.n_speed, 6, "%zu windows", s.n_speed);
    cr_expect_eq(s.speed_windows_measured, 4);
    /* the model sits between the two speeds; the factors keep their ratio */
    double slow = s.speed[2], fast = s.speed[0];
    cr_expect(fabs(slow / fast - 1.5) < 0.03, "factors %g %g %g %g", s.speed[0], s.speed[1],
              s.speed[2], s.speed[3]);
    cr_expect(fabs(s.speed[1] / fast - 1) < 0.03 && fabs(s.speed[3] / slow - 1) < 0.03);
    cr_expect_eq(s.speed[5], 1.0, "a window with one iteration is not a measurement: %g",
                 s.speed[5]);
    cr_expect_eq(sim_service_speed_at(&s, 450000), s.speed[2]);
    cr_expect_eq(sim_service_speed_at(&s, 99000000), 1.0);
    sim_service_free(&s);
    cr_expect_null(s.speed);
}

/* --compare-log: two real runs' request logs, request by request in arrival order. Run B
 * here is run A with every TTFT 10% and every end-to-end latency 20% longer, one request
 * 50% longer: the medians and the p99 must say so. */
Test(sim_itfit, compare_log_measures_one_real_run_against_another)
{
    char a[128], b[128], cmd[600];
    tmp_path("run-a.jsonl", a, sizeof a);
    tmp_path("run-b.jsonl", b, sizeof b);
    FILE *fa = fopen(a, "w"), *fb = fopen(b, "w");
    cr_assert(fa && fb);
    for (int i = 0; i < 20; i++) {
        long arr = 1000 + 5000L * i, ttft = 2000, e2e = 10000;
        /* B's clients submitted a little later (its own clock); ids differ */
        long arr_b = arr + 37, ttft_b = ttft * 11 / 10,
             e2e_b = i == 7 ? e2e * 3 / 2 : e2e * 12 / 10;
        fprintf(fa,
                "{\"req\":%d,\"arrival_us\":%ld,\"tenant\":\"t\",\"class\":\"c\",\"prompt_tokens\":"
                "10,\"max_tokens\":5,"
                "\"output_tokens\":5,\"first_token_us\":%ld,\"finish_us\":%ld,\"finish_reason\":"
                "\"length\"}\n",
                i + 1, arr, arr + ttft, arr + e2e);
        fprintf(fb,
                "{\"req\":%d,\"arrival_us\":%ld,\"tenant\":\"t\",\"class\":\"c\",\"prompt_tokens\":"
                "10,\"max_tokens\":5,"
                "\"output_tokens\":5,\"first_token_us\":%ld,\"finish_us\":%ld,\"finish_reason\":"
                "\"length\"}\n",
                100 - i, arr_b, arr_b + ttft_b, arr_b + e2e_b);
    }
    fclose(fa);
    fclose(fb);
    char *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/ringlm-sim --trace %s --compare-log %s --json 2>&1", th_bin_dir(),
             a, b);
    int st = run_shell(cmd, &out);
    cr_assert_eq(st, 0, "%s", out);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    cr_assert_not_null(j, "not JSON: %s", out);
    json_t *t = json_object_get(j, "ttft_rel_err"), *x = json_object_get(j, "e2e_rel_err");
    cr_expect_eq(json_integer_value(json_object_get(t, "n")), 20);
    cr_expect_float_eq(json_real_value(json_object_get(t, "p50")), 0.10, 1e-3, "%s", out);
    cr_expect_float_eq(json_real_value(json_object_get(x, "p50")), 0.20, 1e-3, "%s", out);
    cr_expect_float_eq(json_real_value(json_object_get(x, "max")), 0.50, 1e-3, "%s", out);
    json_decref(j);
    free(out);
    /* different request counts: an error, not a comparison of unrelated requests */
    fb = fopen(b, "a");
    fprintf(fb, "{\"req\":1000,\"arrival_us\":999999,\"prompt_tokens\":10,\"output_tokens\":5,"
                "\"first_token_us\":1000999,"
                "\"finish_us\":1001999,\"finish_reason\":\"length\"}\n");
    fclose(fb);
    st = run_shell(cmd, &out);
    cr_expect_neq(st, 0, "%s", out);
    cr_expect(strstr(out, "same requests"), "%s", out);
    free(out);
}

/* Fidelity compares like with like: the daemon stamps arrival_us when its loop drains a
 * request, between iterations, and its latencies start there. Request B below arrives at
 * 200 µs, in the middle of the simulated step 1 (0..395); the simulated loop sees it at 395.
 *   step 2 @395: decode A (context 101) + prefill B (100 rows, pairs 4950)
 *                100 + 2*100 + 30 + 0.45*201 + 0.01*4950 = 469.95 → 470: B's token 1 @865
 *   step 3 @865: decode A (102) and B (101): 100 + 60 + 0.45*203 = 251.35 → 252: A ends @1117
 *   step 4 @1117: decode B (102): 175.9 → 176: B ends @1293
 * A daemon that had seen B at 200 between its iterations would have recorded TTFT 470 and
 * E2E 898 from there: the simulation matches that run exactly (errors 0), where measuring
 * from 200 would say TTFT 665 (+41%). */
Test(sim_itfit, fidelity_measures_from_when_the_loop_saw_the_request)
{
    char path[128];
    write_sim_model_log(tmp_path("fid.jsonl", path, sizeof path));
    sim_service s;
    sim_service_default(&s);
    const char *paths[] = {path};
    cr_assert_eq(sim_service_fit_iterations(&s, paths, 1), 0, "%s", sim_err());
    sim_trace t;
    default_trace(&t, "two");
    sim_req r;
    memset(&r, 0, sizeof r);
    r.deadline_us = r.cancel_us = SIM_NO_TIME;
    r.prompt_tokens = 100;
    r.output_tokens = r.max_tokens = 3;
    r.real_reason = SIM_REAL_LENGTH;
    r.arrival_us = 0;
    r.real_first_token_us = 395;
    r.real_finish_us = 1117;
    cr_assert_eq(sim_trace_push(&t, &r), 0);
    r.arrival_us = 200;
    r.real_first_token_us = 200 + 470;
    r.real_finish_us = 200 + 898;
    cr_assert_eq(sim_trace_push(&t, &r), 0);
    t.has_real = true;
    sim_run run;
    sched_policy *p = run_token_budget(&t, &s, &run);
    const sim_rec *a = &run.recs[run.final_rec[0]], *b = &run.recs[run.final_rec[1]];
    cr_expect_eq(b->seen_us, 395, "B seen at %lld", (long long)b->seen_us);
    cr_expect_eq(b->first_token_us, 865, "B first token %lld", (long long)b->first_token_us);
    cr_expect_eq(a->end_us, 1117, "A end %lld", (long long)a->end_us);
    cr_expect_eq(b->end_us, 1293, "B end %lld", (long long)b->end_us);
    sim_summary sum;
    cr_assert_eq(sim_summarise(&run, NULL, -1, -1, &sum), 0);
    cr_assert(sum.has_fidelity);
    cr_expect_eq(sum.ttft_rel_err.n, 2);
    cr_expect_float_eq(sum.ttft_rel_err.max, 0, 1e-12, "TTFT error %g", sum.ttft_rel_err.max);
    cr_expect_float_eq(sum.e2e_rel_err.max, 0, 1e-12, "E2E error %g", sum.e2e_rel_err.max);
    sim_summary_free(&sum);
    sim_run_free(&run);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* The noise floor: each request's real iterations, summed as observed and as modelled. Four
 * iterations inside request 2's span took twice as long (noise, kept by the fit): the floor
 * of each request is |Σ model − Σ observed| / Σ observed over exactly its own iterations
 * (those that started in [arrival, finish)); a request without an outcome is not counted. */
Test(sim_itfit, noise_floor_sums_each_requests_own_iterations)
{
    char path[128];
    tmp_path("floor.jsonl", path, sizeof path);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    const model m = {20, 9, 35, 0.15, 0.1};
    double obs[200], ft[200][4];
    /* put_line stamps t_us = it × 1000: request 1 spans iterations 0..99, request 2 100..199 */
    for (unsigned i = 0; i < 200; i++) {
        uint32_t pt = i % 10 == 0 ? 64 : 0, ds = 1 + i % 2;
        double dctx = ds * (double)(50 + i % 37);
        double pp = pt ? (double)pt * (pt - 1) / 2 : 0, ct = dctx + pt;
        obs[i] =
            model_us(&m, pt, ds, ct, pp) * (i == 120 || i == 140 || i == 160 || i == 180 ? 2 : 1);
        ft[i][0] = pt;
        ft[i][1] = ds;
        ft[i][2] = ct;
        ft[i][3] = pp;
        put_line(f, i, obs[i], pt, 0, ds, dctx, 0);
    }
    fclose(f);
    sim_service s;
    sim_service_default(&s);
    const char *paths[] = {path};
    cr_assert_eq(sim_service_fit_iterations(&s, paths, 1), 0, "%s", sim_err());
    cr_assert_eq(s.it_dropped, 0, "a 2× iteration is noise, not a gross error: %zu dropped",
                 s.it_dropped);
    double want[2];
    for (int k = 0; k < 2; k++) {
        double so = 0, sm = 0;
        for (unsigned i = 100u * (unsigned)k; i < 100u * (unsigned)(k + 1); i++) {
            so += obs[i];
            sm += sim_service_step_us(&s, (uint64_t)ft[i][0], (uint64_t)ft[i][1],
                                      (uint64_t)ft[i][2], ft[i][3]);
        }
        want[k] = fabs(sm - so) / so;
    }
    cr_assert(want[0] > 1e-6 && want[1] > 1e-6, "the noise must show: %g %g", want[0], want[1]);
    if (want[0] > want[1]) {
        double x = want[0];
        want[0] = want[1];
        want[1] = x;
    }
    sim_req r[3];
    memset(r, 0, sizeof r);
    for (int k = 0; k < 3; k++) {
        r[k].real_reason = SIM_REAL_LENGTH;
        r[k].real_first_token_us = SIM_NO_TIME;
    }
    r[0].arrival_us = 0;
    r[0].real_finish_us = 100000;
    r[1].arrival_us = 100000;
    r[1].real_finish_us = 200000;
    r[2].arrival_us = 50;
    r[2].real_finish_us = SIM_NO_TIME; /* no outcome: not counted */
    double errs[3];
    size_t n = 0;
    cr_assert_eq(sim_service_noise_floor(&s, r, 3, errs, &n), 0);
    cr_assert_eq(n, 2);
    /* errs come sorted */
    cr_expect_float_eq(errs[0], want[0], 1e-9, "request 1: %g, want %g", errs[0], want[0]);
    cr_expect_float_eq(errs[1], want[1], 1e-9, "request 2: %g, want %g", errs[1], want[1]);
    sim_service_free(&s);
}
