/* ringlm — simulator trace readers, transformations, service model and statistics.
 * SPDX-License-Identifier: MIT */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim/err.h"
#include "sim/gen.h"
#include "sim/service.h"
#include "sim/stats.h"
#include "sim/trace.h"
#include "tests/helpers.h"

static int parse(sim_trace *t, const char *text, int fmt, bool skip)
{
    sim_trace_init(t, "t");
    return sim_trace_parse(t, "t.csv", text, strlen(text), fmt, skip);
}

/* ---- Azure CSV ------------------------------------------------------------------------------- */

Test(sim_trace, azure_crlf_no_trailing_newline_relative_times)
{
    const char *csv = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                      "2023-11-16 18:15:46.6805900,374,44\r\n"
                      "2023-11-16 18:15:47.0000000,10,2\r\n"
                      "2023-11-16 18:15:48.1234567,5,1"; /* no trailing newline */
    sim_trace t;
    int rc = parse(&t, csv, SIM_FMT_AUTO, false);
    cr_assert_eq(rc, 0, "parse: %s", sim_err());
    cr_assert_eq(t.format, SIM_FMT_AZURE);
    cr_assert_eq(t.n, 3, "rows %zu", t.n);
    cr_expect_eq(t.reqs[0].arrival_us, 0);
    /* 47.0000000 - 46.6805900 = 0.31941 s → 319410 µs (100 ns digits rounded to µs) */
    cr_expect_eq(t.reqs[1].arrival_us, 319410, "got %lld", (long long)t.reqs[1].arrival_us);
    /* 48.1234567 - 46.6805900 = 1.4428667 s → 1442867 µs */
    cr_expect_eq(t.reqs[2].arrival_us, 1442867, "got %lld", (long long)t.reqs[2].arrival_us);
    cr_expect_eq(t.reqs[0].prompt_tokens, 374);
    cr_expect_eq(t.reqs[0].output_tokens, 44);
    cr_expect_eq(t.reqs[2].output_tokens, 1, "last row without newline must keep its last digit");
    cr_expect_eq(t.reqs[2].src_line, 4);
    sim_trace_free(&t);
}

Test(sim_trace, azure_lf_and_day_rollover)
{
    const char *csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                      "2023-12-31 23:59:59.5,1,1\n"
                      "2024-01-01 00:00:00.25,2,3\n";
    sim_trace t;
    cr_assert_eq(parse(&t, csv, SIM_FMT_AZURE, false), 0, "%s", sim_err());
    cr_assert_eq(t.n, 2);
    cr_expect_eq(t.reqs[1].arrival_us, 750000, "got %lld", (long long)t.reqs[1].arrival_us);
    sim_trace_free(&t);
}

Test(sim_trace, azure_malformed_lines_name_file_and_line)
{
    const char *csv = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                      "2023-11-16 18:15:46.6805900,374,44\r\n"
                      "2023-11-16 18:15:47.0000000,0,2\r\n";
    sim_trace t;
    int rc = parse(&t, csv, SIM_FMT_AUTO, false);
    cr_assert_lt(rc, 0);
    cr_expect(strstr(sim_err(), "t.csv:3:") && strstr(sim_err(), "ContextTokens"), "detail: %s",
              sim_err());
    sim_trace_free(&t);

    const char *bad[] = {
        "2023-11-16 18:15:47,1\r\n",             /* 2 fields */
        "2023-11-16 18:15:47,1,2,3\r\n",         /* 4 fields */
        "2023-11-16T18:15:47.x,1,2\r\n",         /* bad fraction */
        "2023-13-16 18:15:47,1,2\r\n",           /* month 13 */
        "2023-11-16 18:15:47,abc,2\r\n",         /* not a number */
        "2023-11-16 18:15:47,5,-2\r\n",          /* negative */
        "2023-11-16 18:15:47,5,99999999999\r\n", /* too large */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char buf[256];
        snprintf(buf, sizeof buf,
                 "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46,1,1\r\n%s",
                 bad[i]);
        rc = parse(&t, buf, SIM_FMT_AZURE, false);
        cr_expect_lt(rc, 0, "line \"%s\" accepted", bad[i]);
        cr_expect(strstr(sim_err(), "t.csv:3:") != NULL, "line \"%s\": detail %s", bad[i],
                  sim_err());
        sim_trace_free(&t);
    }
}

Test(sim_trace, azure_skip_bad_counts_and_lists)
{
    const char *csv = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                      "2023-11-16 18:15:46.0,1,1\r\n"
                      "garbage\r\n"
                      "2023-11-16 18:15:47.0,2,2\r\n"
                      "2023-11-16 18:15:48.0,3,0";
    sim_trace t;
    cr_assert_eq(parse(&t, csv, SIM_FMT_AZURE, true), 0, "%s", sim_err());
    cr_expect_eq(t.n, 2);
    cr_expect_eq(t.n_bad_total, 2);
    cr_assert_eq(t.n_bad, 2);
    cr_expect_eq(t.bad[0].line, 3);
    cr_expect_eq(t.bad[1].line, 5);
    cr_expect(strstr(t.bad[1].reason, "GeneratedTokens") != NULL, "%s", t.bad[1].reason);
    sim_trace_free(&t);
}

Test(sim_trace, azure_header_required)
{
    sim_trace t;
    int rc =
        parse(&t, "TIMESTAMP,Context,Generated\r\n2023-11-16 18:15:46.0,1,1", SIM_FMT_AZURE, false);
    cr_expect_lt(rc, 0);
    cr_expect(strstr(sim_err(), "t.csv:1:") != NULL, "%s", sim_err());
    sim_trace_free(&t);
}

Test(sim_trace, azure_real_conv_trace)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/traces/AzureLLMInferenceTrace_conv.csv", th_shared_dir());
    FILE *f = fopen(path, "rb");
    if (!f) cr_skip_test("no %s (set RINGLM_SHARED to the shared data folder)", path);
    fclose(f);
    sim_trace t;
    sim_trace_init(&t, path);
    cr_assert_eq(sim_trace_load(&t, path, SIM_FMT_AUTO, false), 0, "%s", sim_err());
    sim_trace_summary s;
    sim_trace_summarise(&t, &s);
    /* numbers from ../shared/traces/README.md */
    cr_expect_eq(s.n, 19366);
    cr_expect_eq(s.prompt_total, 22361870ull);
    cr_expect_eq(s.output_total, 4088665ull);
    cr_expect_eq(s.prompt_max, 14050u);
    cr_expect(fabs(s.span_s - 3501.7) < 0.1, "span %f", s.span_s);
    sim_trace_free(&t);
}

/* ---- JSON lines ---------------------------------------------------------------------------- */

Test(sim_trace, mooncake_jsonl)
{
    const char *j =
        "{\"timestamp\": 0, \"input_length\": 6955, \"output_length\": 52, \"hash_ids\": [0,1,2]}\n"
        "{\"timestamp\": 27, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": []}\n"
        "\n"
        "{\"timestamp\": 3000, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [5]}";
    sim_trace t;
    cr_assert_eq(parse(&t, j, SIM_FMT_AUTO, false), 0, "%s", sim_err());
    cr_expect_eq(t.format, SIM_FMT_MOONCAKE);
    cr_assert_eq(t.n, 3);
    cr_expect_eq(t.reqs[1].arrival_us, 27000);
    cr_expect_eq(t.reqs[2].arrival_us, 3000000);
    cr_expect_eq(t.reqs[0].prompt_tokens, 6955);
    sim_trace_free(&t);

    const char *bad = "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1}\n"
                      "{\"timestamp\": 1, \"input_length\": 5}\n";
    cr_expect_lt(parse(&t, bad, SIM_FMT_MOONCAKE, false), 0);
    cr_expect(strstr(sim_err(), ":2:") && strstr(sim_err(), "output_length"), "%s", sim_err());
    sim_trace_free(&t);
    const char *notjson =
        "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1}\n{\"timestamp\": 1,]\n";
    cr_expect_lt(parse(&t, notjson, SIM_FMT_MOONCAKE, false), 0);
    cr_expect(strstr(sim_err(), ":2: not JSON") != NULL, "%s", sim_err());
    sim_trace_free(&t);
    /* A line cut short (its writer died mid-line) is skipped and counted, not an error. */
    const char *torn =
        "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1}\n{\"timestamp\": 1,\n";
    cr_expect_eq(parse(&t, torn, SIM_FMT_MOONCAKE, false), 0, "%s", sim_err());
    cr_expect_eq(t.n, 1);
    cr_expect_eq(t.n_torn, 1);
    sim_trace_free(&t);
}

Test(sim_trace, native_jsonl_sorted_labels_and_outcomes)
{
    const char *j =
        "{\"req\":2,\"arrival_us\":5000,\"tenant\":\"b\",\"class\":\"batch\",\"prompt_tokens\":10,"
        "\"max_tokens\":8,\"output_tokens\":8,\"deadline_us\":null,\"cancel_us\":null,\"first_"
        "token_us\":9000,\"finish_us\":20000,\"finish_reason\":\"length\",\"reject_reason\":null}"
        "\r\n"
        "{\"req\":1,\"arrival_us\":1000,\"tenant\":\"a\",\"class\":\"interactive\",\"prompt_"
        "tokens\":4,\"max_tokens\":50,\"output_tokens\":3,\"cancel_us\":7000,\"first_token_us\":"
        "2000,\"finish_us\":7000,\"finish_reason\":\"cancelled\"}\r\n"
        "{\"req\":3,\"arrival_us\":6000,\"tenant\":\"a\",\"class\":\"interactive\",\"prompt_"
        "tokens\":4,\"max_tokens\":5,\"output_tokens\":2,\"finish_us\":9000,\"finish_reason\":"
        "\"stop\",\"extra\":1}";
    sim_trace t;
    cr_assert_eq(parse(&t, j, SIM_FMT_AUTO, false), 0, "%s", sim_err());
    cr_expect_eq(t.format, SIM_FMT_NATIVE);
    cr_expect(t.labelled && t.has_real);
    cr_assert_eq(t.n, 3);
    cr_expect_eq(t.reqs[0].src_id, 1, "sorted by arrival");
    cr_expect_eq(t.reqs[0].cancel_us, 7000);
    cr_expect_eq(t.reqs[0].output_tokens, 50, "a cancelled request replays its max_tokens");
    cr_expect_eq(t.reqs[1].output_tokens, 8);
    cr_expect_eq(t.reqs[2].output_tokens, 2, "a stopped request replays its real length");
    cr_expect_eq(t.reqs[2].max_tokens, 5);
    cr_expect_str_eq(t.tenants[t.reqs[1].tenant], "b");
    cr_expect_str_eq(t.classes[t.reqs[0].klass], "interactive");
    cr_expect_eq(t.reqs[1].real_first_token_us, 9000);
    cr_expect_eq(t.reqs[1].real_reason, SIM_REAL_LENGTH);
    sim_trace_free(&t);

    const char *dup = "{\"req\":1,\"arrival_us\":1,\"prompt_tokens\":4,\"output_tokens\":1}\n"
                      "{\"req\":1,\"arrival_us\":2,\"prompt_tokens\":4,\"output_tokens\":1}\n";
    cr_expect_lt(parse(&t, dup, SIM_FMT_NATIVE, false), 0);
    cr_expect(strstr(sim_err(), "appears twice") != NULL, "%s", sim_err());
    sim_trace_free(&t);
    const char *neg = "{\"req\":1,\"arrival_us\":-5,\"prompt_tokens\":4,\"output_tokens\":1}\n";
    cr_expect_lt(parse(&t, neg, SIM_FMT_NATIVE, false), 0);
    cr_expect(strstr(sim_err(), ":1:") && strstr(sim_err(), "arrival_us"), "%s", sim_err());
    sim_trace_free(&t);
    const char *reason = "{\"req\":1,\"arrival_us\":5,\"prompt_tokens\":4,\"output_tokens\":1,"
                         "\"finish_reason\":\"exploded\"}\n";
    cr_expect_lt(parse(&t, reason, SIM_FMT_NATIVE, false), 0);
    cr_expect(strstr(sim_err(), "finish_reason") != NULL, "%s", sim_err());
    sim_trace_free(&t);
}

Test(sim_trace, unknown_format_is_explained)
{
    sim_trace t;
    cr_expect_lt(parse(&t, "hello,world\n", SIM_FMT_AUTO, false), 0);
    cr_expect(strstr(sim_err(), "unknown trace format") != NULL, "%s", sim_err());
    sim_trace_free(&t);
}

/* ---- transformations ------------------------------------------------------------------------- */

static void five(sim_trace *t)
{
    const char *csv =
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 00:00:00,100,10\n2023-11-16 00:00:01,200,20\n2023-11-16 00:00:02,300,30\n"
        "2023-11-16 00:00:03,400,40\n2023-11-16 00:00:04,500,50\n";
    cr_assert_eq(parse(t, csv, SIM_FMT_AZURE, false), 0, "%s", sim_err());
}

Test(sim_trace, window_rate_and_length_scale)
{
    sim_trace t;
    five(&t);
    sim_transform x;
    sim_transform_defaults(&x);
    x.window_start_s = 1;
    x.window_end_s = 4;
    x.rate = 2;
    x.length_scale = 0.5;
    cr_assert_eq(sim_trace_transform(&t, &x), 0, "%s", sim_err());
    cr_assert_eq(t.n, 3);
    cr_expect_eq(t.reqs[0].arrival_us, 0);
    cr_expect_eq(t.reqs[1].arrival_us, 500000);
    cr_expect_eq(t.reqs[2].arrival_us, 1000000);
    cr_expect_eq(t.reqs[0].prompt_tokens, 100);
    cr_expect_eq(t.reqs[2].output_tokens, 20);
    sim_trace_free(&t);

    five(&t);
    sim_transform_defaults(&x);
    x.rate = 0;
    cr_expect_lt(sim_trace_transform(&t, &x), 0);
    cr_expect(strstr(sim_err(), "--rate") != NULL, "%s", sim_err());
    sim_trace_free(&t);
}

Test(sim_trace, assignment_rules)
{
    sim_trace t;
    five(&t);
    cr_assert_eq(sim_trace_assign(&t, 0, "a:3,b:1", 1), 0, "%s", sim_err());
    int na = 0;
    for (size_t i = 0; i < 4; i++) na += !strcmp(t.tenants[t.reqs[i].tenant], "a");
    cr_expect_eq(na, 3, "3 of every 4 go to a");
    cr_assert_eq(sim_trace_assign(&t, 1, "rr:x,y", 1), 0, "%s", sim_err());
    cr_expect_str_eq(t.classes[t.reqs[0].klass], "x");
    cr_expect_str_eq(t.classes[t.reqs[1].klass], "y");
    cr_expect_str_eq(t.classes[t.reqs[2].klass], "x");
    cr_assert_eq(sim_trace_assign(&t, 1, "prompt>250:long,short", 1), 0, "%s", sim_err());
    cr_expect_str_eq(t.classes[t.reqs[1].klass], "short");
    cr_expect_str_eq(t.classes[t.reqs[2].klass], "long");
    cr_assert_eq(sim_trace_assign(&t, 0, "random:p:1,q:1", 7), 0, "%s", sim_err());
    cr_expect_lt(sim_trace_assign(&t, 0, "a:0", 1), 0);
    cr_expect(strstr(sim_err(), "weight") != NULL, "%s", sim_err());
    cr_expect_lt(sim_trace_assign(&t, 0, "rr:a:2", 1), 0);
    cr_expect_lt(sim_trace_assign(&t, 0, "", 1), 0);
    sim_trace_free(&t);
}

/* ---- generators ------------------------------------------------------------------------------ */

Test(sim_gen, poisson_rate_and_determinism)
{
    sim_service svc;
    sim_service_default(&svc);
    const char *p[] = {"rate=50", "duration=200"};
    sim_trace a, b;
    sim_scenario s;
    cr_assert_eq(sim_gen_workload(&a, "poisson", p, 2, &svc, 42, &s), 0, "%s", sim_err());
    cr_assert_eq(sim_gen_workload(&b, "poisson", p, 2, &svc, 42, &s), 0, "%s", sim_err());
    cr_assert_eq(a.n, b.n);
    cr_expect_eq(memcmp(a.reqs, b.reqs, a.n * sizeof *a.reqs), 0, "same seed, same workload");
    double rate = (double)a.n / 200.0;
    cr_expect(fabs(rate - 50) < 2.5, "rate %f", rate);
    sim_trace_free(&a);
    sim_trace_free(&b);
    const char *g[] = {"rate=50", "duration=400", "cv=4"};
    cr_assert_eq(sim_gen_workload(&a, "gamma", g, 3, &svc, 3, &s), 0, "%s", sim_err());
    double m = 0, v = 0;
    size_t n = a.n - 1;
    for (size_t i = 1; i < a.n; i++) m += (double)(a.reqs[i].arrival_us - a.reqs[i - 1].arrival_us);
    m /= (double)n;
    for (size_t i = 1; i < a.n; i++) {
        double d = (double)(a.reqs[i].arrival_us - a.reqs[i - 1].arrival_us) - m;
        v += d * d;
    }
    double cv = sqrt(v / (double)n) / m;
    cr_expect(cv > 3 && cv < 5, "gamma cv %f (asked 4)", cv);
    sim_trace_free(&a);
    const char *bad[] = {"nonsense=1"};
    cr_expect_lt(sim_gen_workload(&a, "poisson", bad, 1, &svc, 1, &s), 0);
    cr_expect(strstr(sim_err(), "unknown parameter") != NULL, "%s", sim_err());
    cr_expect_lt(sim_gen_workload(&a, "nope", NULL, 0, &svc, 1, &s), 0);
}

Test(sim_gen, arrivals_and_lengths_fitted_from_a_trace)
{
    char path[1024], a[1100], l[1100];
    snprintf(path, sizeof path, "%s/traces/AzureLLMInferenceTrace_conv.csv", th_shared_dir());
    if (access(path, R_OK) != 0)
        cr_skip_test("no %s (set RINGLM_SHARED to the shared data folder)", path);
    snprintf(a, sizeof a, "arrivals_from=%s", path);
    snprintf(l, sizeof l, "lengths=%s", path);
    const char *p[] = {a, l, "duration=2000"};
    sim_service svc;
    sim_service_default(&svc);
    sim_trace t;
    sim_scenario s;
    cr_assert_eq(sim_gen_workload(&t, "gamma", p, 3, &svc, 5, &s), 0, "%s", sim_err());
    sim_trace_summary sum;
    sim_trace_summarise(&t, &sum);
    /* the trace: 5.53 req/s, gap CV 1.09, prompt mean 1154.7, output mean 211.1 */
    cr_expect(fabs(sum.rate_per_s - 5.53) < 0.3, "rate %f", sum.rate_per_s);
    cr_expect(fabs(sum.prompt_mean - 1154.7) < 60, "prompt mean %f", sum.prompt_mean);
    cr_expect(fabs(sum.output_mean - 211.1) < 15, "output mean %f", sum.output_mean);
    double m = 0, v = 0;
    for (size_t i = 1; i < t.n; i++) m += (double)(t.reqs[i].arrival_us - t.reqs[i - 1].arrival_us);
    m /= (double)(t.n - 1);
    for (size_t i = 1; i < t.n; i++) {
        double d = (double)(t.reqs[i].arrival_us - t.reqs[i - 1].arrival_us) - m;
        v += d * d;
    }
    double cv = sqrt(v / (double)(t.n - 1)) / m;
    cr_expect(fabs(cv - 1.09) < 0.1, "gap cv %f", cv);
    sim_trace_free(&t);
}

Test(sim_gen, scenarios_generate)
{
    sim_service svc;
    sim_service_default(&svc);
    const char *names[] = {"long-prompt", "two-tenants", "disconnects", "burst", "overload"};
    for (size_t i = 0; i < 5; i++) {
        sim_trace t;
        sim_scenario s;
        cr_assert_eq(sim_gen_workload(&t, names[i], NULL, 0, &svc, 1, &s), 0, "%s: %s", names[i],
                     sim_err());
        cr_expect_gt(t.n, 10, "%s: %zu requests", names[i], t.n);
        cr_expect_eq(s.kind, (int)i + 1);
        for (size_t k = 1; k < t.n; k++)
            cr_assert_geq(t.reqs[k].arrival_us, t.reqs[k - 1].arrival_us);
        sim_trace_free(&t);
    }
}

/* ---- service model ---------------------------------------------------------------------------- */

Test(sim_service, refit_from_grid_and_quality)
{
    /* exact model: 100 + 2 p + 10 d + 0.01 * ctx * max(d,1) */
    char buf[4096];
    size_t o = (size_t)snprintf(buf, sizeof buf,
                                "{\"version\":1,\"kv_block_size\":16,\"kv_blocks_device\":100,"
                                "\"kv_bytes_per_token\":1024,\"grid\":[");
    int first = 1;
    for (int p = 0; p <= 256; p += 128)
        for (int d = 0; d <= 8; d += 4)
            for (int c = 64; c <= 256; c *= 4) {
                if (!p && !d) continue;
                double y = 100 + 2.0 * p + 10.0 * d + 0.01 * c * (d ? d : 1);
                o += (size_t)snprintf(
                    buf + o, sizeof buf - o,
                    "%s{\"prefill_tokens\":%d,\"decode_seqs\":%d,\"context\":%d,\"step_us\":%.4f}",
                    first ? "" : ",", p, d, c, y);
                first = 0;
            }
    snprintf(buf + o, sizeof buf - o,
             "],\"transfer\":{\"host\":{\"out_bytes_per_s\":1e9,\"in_bytes_per_s\":2e9,\"latency_"
             "us\":5}}}");
    sim_service s;
    cr_assert_eq(sim_service_parse(&s, "cal.json", buf, SIM_FIT_AUTO), 0, "%s", sim_err());
    cr_expect(s.refit);
    cr_expect(fabs(s.base_us - 100) < 1e-6 && fabs(s.per_prefill_token_us - 2) < 1e-9 &&
                  fabs(s.per_decode_seq_us - 10) < 1e-7 &&
                  fabs(s.per_context_token_us - 0.01) < 1e-9,
              "fit %f %f %f %f", s.base_us, s.per_prefill_token_us, s.per_decode_seq_us,
              s.per_context_token_us);
    cr_expect(s.r2 > 0.999999, "r2 %f", s.r2);
    cr_expect(s.median_rel_err < 1e-9);
    /* 1 MB out at 1 GB/s + 5 µs */
    cr_expect(fabs(sim_service_transfer_us(&s, SCHED_POOL_HOST, true, 1024) - 1053.576) < 0.01,
              "%f", sim_service_transfer_us(&s, SCHED_POOL_HOST, true, 1024));

    cr_expect_lt(sim_service_parse(&s, "cal.json", "{\"version\":1}", SIM_FIT_AUTO), 0);
    cr_expect(strstr(sim_err(), "kv_block_size") != NULL, "%s", sim_err());
    cr_expect_lt(
        sim_service_parse(&s, "cal.json", "{\"version\":2,\"kv_block_size\":16}", SIM_FIT_AUTO), 0);
    cr_expect_lt(
        sim_service_parse(
            &s, "cal.json",
            "{\"version\":1,\"kv_block_size\":16,\"kv_blocks_device\":1,\"kv_bytes_per_token\":1,"
            "\"grid\":[{\"prefill_tokens\":1,\"decode_seqs\":1,\"context\":1,\"step_us\":\"x\"}]}",
            SIM_FIT_AUTO),
        0);
    cr_expect(strstr(sim_err(), "grid[0]") && strstr(sim_err(), "step_us"), "%s", sim_err());
}

Test(sim_service, auto_fit_picks_attention_term_when_prefill_is_quadratic)
{
    /* a grid whose prefill cost grows with position: 50 + 2 p + 10 d + 0.01 ctx + 0.05 pairs */
    char buf[8192];
    size_t o = (size_t)snprintf(
        buf, sizeof buf,
        "{\"version\":1,\"kv_block_size\":16,\"kv_blocks_device\":100,"
        "\"kv_bytes_per_token\":1024,\"step_model\":{\"base_us\":0,\"per_prefill_token_us\":30,"
        "\"per_decode_seq_us\":10,\"per_context_token_us\":0.01},\"grid\":[");
    int first = 1;
    for (int p = 0; p <= 256; p += 64)
        for (int d = 0; d <= 8; d += 4)
            for (int c = 64; c <= 448; c += 192) {
                if (!p && !d) continue;
                double pairs = p == 0  ? 0
                               : d > 0 ? p * (p - 1) / 2.0
                                       : p * (double)(c > p ? c : p) - p * (p + 1) / 2.0;
                double y = 50 + 2.0 * p + 10.0 * d + 0.01 * c * (d ? d : 1) + 0.05 * pairs;
                o += (size_t)snprintf(
                    buf + o, sizeof buf - o,
                    "%s{\"prefill_tokens\":%d,\"decode_seqs\":%d,\"context\":%d,\"step_us\":%.6f}",
                    first ? "" : ",", p, d, c, y);
                first = 0;
            }
    snprintf(buf + o, sizeof buf - o, "]}");
    sim_service s;
    cr_assert_eq(sim_service_parse(&s, "cal.json", buf, SIM_FIT_AUTO), 0, "%s", sim_err());
    cr_expect_str_eq(s.fit, "attention-refit");
    cr_expect(fabs(s.per_prefill_pair_us - 0.05) < 1e-6 && fabs(s.per_prefill_token_us - 2) < 1e-4,
              "pairs %g prefill %g", s.per_prefill_pair_us, s.per_prefill_token_us);
    cr_expect_lt(s.median_rel_err, 1e-6);
    cr_expect_gt(s.file_median_rel_err, 0.1, "the file's linear model is worse: %g",
                 s.file_median_rel_err);
    cr_assert_eq(sim_service_parse(&s, "cal.json", buf, SIM_FIT_FILE), 0, "%s", sim_err());
    cr_expect_str_eq(s.fit, "file");
    cr_expect_float_eq(s.per_prefill_token_us, 30, 1e-12);
    cr_expect_eq(s.per_prefill_pair_us, 0);
}

Test(sim_service, serving_loop_fitted_against_the_engine_model)
{
    /* exact engine grid 100 + 2 p + 10 d + 0.01 Σctx; the daemon's decode periods are that
     * plus 20 + 0.05 ctx per step: the loop terms come out as 20 and 0.05 */
    char buf[8192];
    size_t o = (size_t)snprintf(buf, sizeof buf,
                                "{\"version\":1,\"kv_block_size\":16,\"kv_blocks_device\":100,"
                                "\"kv_bytes_per_token\":1024,\"grid\":[");
    int first = 1;
    for (int p = 0; p <= 256; p += 128)
        for (int d = 0; d <= 8; d += 4)
            for (int c = 64; c <= 256; c *= 4) {
                if (!p && !d) continue;
                double y = 100 + 2.0 * p + 10.0 * d + 0.01 * c * (d ? d : 1);
                o += (size_t)snprintf(
                    buf + o, sizeof buf - o,
                    "%s{\"prefill_tokens\":%d,\"decode_seqs\":%d,\"context\":%d,\"step_us\":%.4f}",
                    first ? "" : ",", p, d, c, y);
                first = 0;
            }
    o += (size_t)snprintf(buf + o, sizeof buf - o,
                          "],\"serving_loop\":{\"source\":\"log\",\"points\":[");
    for (int c = 40; c <= 440; c += 100)
        o += (size_t)snprintf(buf + o, sizeof buf - o,
                              "%s{\"decode_seqs\":1,\"context\":%d,\"period_us\":%.4f}",
                              c == 40 ? "" : ",", c, 100 + 10 + 0.01 * c + 20 + 0.05 * c);
    snprintf(buf + o, sizeof buf - o, "]}}");
    sim_service s;
    cr_assert_eq(sim_service_parse(&s, "cal.json", buf, SIM_FIT_LINEAR), 0, "%s", sim_err());
    cr_expect_eq(s.loop_points, 5);
    cr_expect(fabs(s.loop_step_us - 20) < 1e-3 && fabs(s.loop_context_us - 0.05) < 1e-6,
              "loop %g + %g ctx", s.loop_step_us, s.loop_context_us);
    cr_expect_lt(s.loop_median_rel_err, 1e-6);
    cr_expect_gt(s.loop_engine_median_rel_err, 0.1, "engine alone misses the loop: %g",
                 s.loop_engine_median_rel_err);

    /* one context only: a constant per step */
    const char *one =
        "{\"version\":1,\"kv_block_size\":16,\"kv_blocks_device\":1,\"kv_bytes_per_token\":1,"
        "\"step_model\":{\"base_us\":10,\"per_prefill_token_us\":1,\"per_decode_seq_us\":5,\"per_"
        "context_token_us\":0},"
        "\"serving_loop\":{\"points\":[{\"context\":64,\"period_us\":40},{\"context\":64,\"period_"
        "us\":50},{\"context\":64,\"period_us\":45}]}}";
    cr_assert_eq(sim_service_parse(&s, "cal.json", one, SIM_FIT_AUTO), 0, "%s", sim_err());
    cr_expect_float_eq(s.loop_step_us, 30, 1e-9, "median residual %g", s.loop_step_us);
    cr_expect_eq(s.loop_context_us, 0);

    /* a bad point is named */
    const char *bad =
        "{\"version\":1,\"kv_block_size\":16,\"kv_blocks_device\":1,\"kv_bytes_per_token\":1,"
        "\"step_model\":{\"base_us\":10,\"per_prefill_token_us\":1,\"per_decode_seq_us\":5,\"per_"
        "context_token_us\":0},"
        "\"serving_loop\":{\"points\":[{\"context\":64,\"period_us\":40},{\"context\":64}]}}";
    cr_expect_lt(sim_service_parse(&s, "cal.json", bad, SIM_FIT_AUTO), 0);
    cr_expect(strstr(sim_err(), "serving_loop.points[1]") && strstr(sim_err(), "period_us"), "%s",
              sim_err());
    const char *bad2 =
        "{\"version\":1,\"kv_block_size\":16,\"kv_blocks_device\":1,\"kv_bytes_per_token\":1,"
        "\"step_model\":{\"base_us\":10,\"per_prefill_token_us\":1,\"per_decode_seq_us\":5,\"per_"
        "context_token_us\":0},"
        "\"serving_loop\":{\"points\":7}}";
    cr_expect_lt(sim_service_parse(&s, "cal.json", bad2, SIM_FIT_AUTO), 0);
    cr_expect(strstr(sim_err(), "points") != NULL, "%s", sim_err());
}

/* ---- hostile input: never a crash, always an explained error or a clean parse ------------- */

Test(sim_trace, garbage_never_crashes)
{
    unsigned long long x = 88172645463325252ull;
    char buf[4096];
    static const char *seeds[] = {
        "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,374,44\r\n",
        "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n",
        "{\"req\":1,\"arrival_us\":5,\"prompt_tokens\":4,\"output_tokens\":1}\n",
    };
    for (int round = 0; round < 3000; round++) {
        const char *seed = seeds[round % 3];
        size_t n = strlen(seed);
        memcpy(buf, seed, n);
        /* flip, insert and truncate bytes of a valid line */
        int edits = 1 + round % 7;
        for (int k = 0; k < edits; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            size_t at = (size_t)(x % (n ? n : 1));
            buf[at] = (char)(x >> 24);
        }
        if (round % 5 == 0) n = (size_t)((x >> 32) % (n + 1));
        sim_trace t;
        sim_trace_init(&t, "g");
        int rc = sim_trace_parse(&t, "g", buf, n, round % 4 == 3 ? SIM_FMT_AZURE : SIM_FMT_AUTO,
                                 round % 2);
        if (rc < 0) cr_expect(strlen(sim_err()) > 0, "an error without a reason");
        for (size_t i = 0; i < t.n; i++)
            cr_expect(t.reqs[i].prompt_tokens > 0 && t.reqs[i].output_tokens > 0);
        sim_trace_free(&t);
        sim_service svc;
        buf[n < sizeof buf ? n : sizeof buf - 1] = 0;
        (void)sim_service_parse(&svc, "g", buf, SIM_FIT_AUTO);
    }
}

/* ---- statistics ------------------------------------------------------------------------------- */

Test(sim_stats, percentiles_jain_fair_share)
{
    double v[] = {4, 1, 3, 2, 5};
    sim_dist d;
    sim_dist_of(v, 5, &d);
    cr_expect_float_eq(d.p50, 3, 1e-12);
    cr_expect_float_eq(d.p90, 4.6, 1e-12); /* numpy: 4 + 0.6 */
    cr_expect_float_eq(d.max, 5, 1e-12);
    cr_expect_float_eq(d.mean, 3, 1e-12);
    double eq[] = {2, 2, 2};
    cr_expect_float_eq(sim_jain(eq, 3), 1, 1e-12);
    double un[] = {1, 0};
    cr_expect_float_eq(sim_jain(un, 2), 0.5, 1e-12);
    double w[] = {1, 1, 2}, dem[] = {10, 100, 100}, sh[3];
    sim_fair_share(110, w, dem, 3, sh);
    /* a wants 10 < its 27.5 → gets 10; the 100 left splits 1:2 */
    cr_expect_float_eq(sh[0], 10, 1e-9);
    cr_expect_float_eq(sh[1], 100.0 / 3, 1e-9);
    cr_expect_float_eq(sh[2], 200.0 / 3, 1e-9);
}
