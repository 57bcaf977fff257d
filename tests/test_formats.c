/* SPDX-License-Identifier: MIT */
/*
 * formats/: every file format's writer and reader agree (write → read → equal), the JSON
 * writer escapes what a client controls and repairs invalid UTF-8, and each reader refuses a
 * malformed line with the field named.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/decision.h"
#include "formats/iteration_log.h"
#include "formats/json.h"
#include "formats/request_log.h"
#include "formats/stats.h"
#include "formats/trace.h"

/* ---- the JSON writer ------------------------------------------------------------------- */

Test(formats_json, nesting_and_types)
{
    char buf[256];
    fmt_json j;
    fmt_json_init(&j, buf, sizeof buf);
    fmt_json_int(&j, "a", -5);
    fmt_json_int(&j, "n", FMT_NULL);
    fmt_json_uint(&j, "u", 18446744073709551615ull);
    fmt_json_double(&j, "d", 1.25, 1);
    fmt_json_double(&j, "nan", NAN, 1);
    fmt_json_bool(&j, "t", true);
    fmt_json_object(&j, "o");
    fmt_json_array(&j, "arr");
    fmt_json_int(&j, NULL, 1);
    fmt_json_str(&j, NULL, "x");
    fmt_json_close(&j);
    fmt_json_close(&j);
    fmt_json_str(&j, "s", NULL);
    int n = fmt_json_end(&j);
    cr_assert_gt(n, 0);
    cr_assert_str_eq(buf, "{\"a\":-5,\"n\":null,\"u\":18446744073709551615,\"d\":1.2,\"nan\":null,"
                          "\"t\":true,\"o\":{\"arr\":[1,\"x\"]},\"s\":null}");
    cr_assert_eq((size_t)n, strlen(buf));
}

Test(formats_json, too_small_is_emsgsize_and_nul_terminated)
{
    char buf[16];
    fmt_json j;
    fmt_json_init(&j, buf, sizeof buf);
    fmt_json_str(&j, "key", "a value that does not fit");
    cr_assert_eq(fmt_json_end(&j), -EMSGSIZE);
    cr_assert_lt(strlen(buf), sizeof buf);
}

/* A class name with a quote and a newline cannot forge a field or a second line; invalid
 * UTF-8 becomes U+FFFD, so jansson reads the line back. */
Test(formats_json, escapes_and_repairs_client_text)
{
    const char *evil =
        "gold\",\"tenant\":\"root\"}\n{\"x\":\"\\\x01\xff\xc0\xaf\xed\xa0\x80ok\xe2\x82";
    char buf[512];
    fmt_json j;
    fmt_json_init(&j, buf, sizeof buf);
    fmt_json_str(&j, "class", evil);
    int n = fmt_json_end(&j);
    cr_assert_gt(n, 0);
    cr_assert_null(strchr(buf, '\n'), "a raw newline reached the line: %s", buf);
    json_error_t e;
    json_t *o = json_loads(buf, 0, &e);
    cr_assert_not_null(o, "not JSON (%s): %s", e.text, buf);
    cr_assert_eq(json_object_size(o), 1, "the class name forged a key: %s", buf);
    const char *s = json_string_value(json_object_get(o, "class"));
    cr_assert_not_null(s);
    cr_assert(strncmp(s, "gold\",\"tenant\":\"root\"}\n{\"x\":\"\\\x01", 31) == 0, "%s", s);
    /* \xff, \xc0, \xaf (overlong), \xed\xa0\x80 (a surrogate: 3 bytes, each replaced), and
     * the truncated \xe2\x82 at the end: 8 replacements, "ok" kept */
    size_t repl = 0;
    for (const char *p = s; (p = strstr(p, "\xEF\xBF\xBD")); p += 3) repl++;
    cr_assert_eq(repl, 8, "replacement characters: %zu in %s", repl, buf);
    cr_assert_not_null(strstr(s, "ok"));
    json_decref(o);
    /* valid multi-byte text is kept as it is */
    fmt_json_init(&j, buf, sizeof buf);
    fmt_json_str(&j, "k", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    cr_assert_gt(fmt_json_end(&j), 0);
    cr_assert_str_eq(buf, "{\"k\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}");
}

/* ---- request log --------------------------------------------------------------------- */

static void assert_request_eq(const fmt_request *a, const fmt_request *b)
{
    cr_assert_eq(a->req, b->req);
    cr_assert_eq(a->arrival_us, b->arrival_us);
    cr_assert_str_eq(a->tenant ? a->tenant : "", b->tenant ? b->tenant : "");
    cr_assert_str_eq(a->class_name ? a->class_name : "", b->class_name ? b->class_name : "");
    cr_assert_eq(a->prompt_tokens, b->prompt_tokens);
    cr_assert_eq(a->max_tokens, b->max_tokens);
    cr_assert_eq(a->output_tokens, b->output_tokens);
    cr_assert_eq(a->deadline_us, b->deadline_us);
    cr_assert_eq(a->cancel_us, b->cancel_us);
    cr_assert_eq(a->first_token_us, b->first_token_us);
    cr_assert_eq(a->finish_us, b->finish_us);
    cr_assert_str_eq(a->finish_reason, b->finish_reason);
    cr_assert_eq(!a->reject_reason, !b->reject_reason);
    if (a->reject_reason) cr_assert_str_eq(a->reject_reason, b->reject_reason);
}

Test(formats_request_log, round_trip)
{
    const fmt_request cases[] = {
        {.req = 7,
         .arrival_us = 1234,
         .tenant = "acme",
         .class_name = "interactive",
         .prompt_tokens = 12,
         .max_tokens = 64,
         .output_tokens = 64,
         .deadline_us = 99999,
         .cancel_us = FMT_NULL,
         .first_token_us = 2000,
         .finish_us = 9000,
         .finish_reason = "length",
         .reject_reason = NULL},
        {.req = 0,
         .arrival_us = 0,
         .tenant = "t\"\\x",
         .class_name = "c\n1",
         .prompt_tokens = 0,
         .max_tokens = 1,
         .output_tokens = 0,
         .deadline_us = FMT_NULL,
         .cancel_us = FMT_NULL,
         .first_token_us = FMT_NULL,
         .finish_us = 5,
         .finish_reason = "rejected",
         .reject_reason = "bad_params"},
        {.req = UINT64_C(1) << 40,
         .arrival_us = INT64_C(1) << 50,
         .tenant = "",
         .class_name = "",
         .prompt_tokens = 0x7fffffff,
         .max_tokens = 3,
         .output_tokens = 2,
         .deadline_us = 1,
         .cancel_us = 17,
         .first_token_us = FMT_NULL,
         .finish_us = FMT_NULL,
         .finish_reason = "cancelled",
         .reject_reason = NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char line[1024], why[200];
        int n = fmt_request_format(&cases[i], line, sizeof line);
        cr_assert_gt(n, 0);
        fmt_request back;
        fmt_request_text text;
        cr_assert_eq(fmt_request_parse(line, (size_t)n, &back, &text, why, sizeof why), 0,
                     "case %zu: %s: %s", i, why, line);
        assert_request_eq(&cases[i], &back);
    }
}

/* n samples and the logits pipeline: sample_of, logprobs, processors read back; absent
 * they are none; out of range refused with the field named. */
Test(formats_request_log, samples_and_pipeline)
{
    fmt_request a = {.req = 12,
                     .arrival_us = 5,
                     .prompt_tokens = 256,
                     .max_tokens = 8,
                     .output_tokens = 8,
                     .deadline_us = FMT_NULL,
                     .cancel_us = FMT_NULL,
                     .first_token_us = 9,
                     .finish_us = 20,
                     .finish_reason = "length",
                     .cached_tokens = 256,
                     .sample_of = 9,
                     .logprobs = true,
                     .top_logprobs = 0,
                     .processors = true};
    char line[1024], why[200];
    int n = fmt_request_format(&a, line, sizeof line);
    cr_assert_gt(n, 0);
    fmt_request b;
    fmt_request_text t;
    cr_assert_eq(fmt_request_parse(line, (size_t)n, &b, &t, why, sizeof why), 0, "%s: %s", why,
                 line);
    cr_expect_eq(b.sample_of, 9, "%s", line);
    cr_expect(b.logprobs && b.top_logprobs == 0, "%s", line);
    cr_expect(b.processors, "%s", line);
    a.sample_of = 0;
    a.logprobs = a.processors = false;
    n = fmt_request_format(&a, line, sizeof line);
    cr_expect(!strstr(line, "sample_of") && !strstr(line, "logprobs") &&
                  !strstr(line, "processors"),
              "%s", line);
    cr_assert_eq(fmt_request_parse(line, (size_t)n, &b, &t, why, sizeof why), 0);
    cr_expect(!b.sample_of && !b.logprobs && !b.processors);
    const char *bad = "{\"req\":1,\"arrival_us\":1,\"prompt_tokens\":2,\"output_tokens\":3,"
                      "\"logprobs\":21}";
    cr_expect_eq(fmt_request_parse(bad, strlen(bad), &b, &t, why, sizeof why), -EINVAL);
    cr_expect(strstr(why, "logprobs"), "%s", why);
}

Test(formats_request_log, reader_rules)
{
    char why[200];
    fmt_request r;
    fmt_request_text t;
#define PARSE(s) fmt_request_parse(s, strlen(s), &r, &t, why, sizeof why)
    /* req is required (fidelity mode matches requests by it) */
    cr_assert_eq(PARSE("{\"arrival_us\":1,\"prompt_tokens\":2,\"output_tokens\":3}"), -EINVAL);
    cr_assert(strstr(why, "\"req\""), "%s", why);
    /* output_tokens alone or max_tokens alone: the other takes its value */
    cr_assert_eq(PARSE("{\"req\":1,\"arrival_us\":1,\"prompt_tokens\":2,\"max_tokens\":9}"), 0,
                 "%s", why);
    cr_assert_eq(r.output_tokens, 9);
    cr_assert_eq(r.deadline_us, FMT_NULL);
    cr_assert_eq(PARSE("{\"req\":1,\"arrival_us\":1,\"prompt_tokens\":2}"), -EINVAL);
    cr_assert(strstr(why, "output_tokens"), "%s", why);
    /* a real is rounded, a negative count refused with the field named */
    cr_assert_eq(PARSE("{\"req\":1,\"arrival_us\":10.6,\"prompt_tokens\":2,\"output_tokens\":3}"),
                 0, "%s", why);
    cr_assert_eq(r.arrival_us, 11);
    cr_assert_eq(PARSE("{\"req\":1,\"arrival_us\":1,\"prompt_tokens\":-2,\"output_tokens\":3}"),
                 -EINVAL);
    cr_assert(strstr(why, "\"prompt_tokens\" is -2"), "%s", why);
    cr_assert_eq(PARSE("{\"req\":1,\"arrival_us\":1,\"prompt_tokens\":2,\"output_tokens\":3,"
                       "\"finish_reason\":7}"),
                 -EINVAL);
    cr_assert(strstr(why, "finish_reason"), "%s", why);
    cr_assert_eq(PARSE("[1,2]"), -EINVAL);
    cr_assert_eq(
        PARSE("{\"req\":1,\"req\":2,\"arrival_us\":1,\"prompt_tokens\":2,\"output_tokens\":3}"),
        -EINVAL);
#undef PARSE
}

/* cached_tokens: written when known, read back; absent or null reads as FMT_NULL (not
 * recorded) and is left out again; a negative count is refused with the field named */
Test(formats_request_log, cached_tokens)
{
    char line[1024], why[200];
    fmt_request r = {.req = 2,
                     .arrival_us = 5,
                     .prompt_tokens = 52,
                     .max_tokens = 4,
                     .output_tokens = 4,
                     .deadline_us = FMT_NULL,
                     .cancel_us = FMT_NULL,
                     .first_token_us = 9,
                     .finish_us = 12,
                     .finish_reason = "length",
                     .cached_tokens = 48};
    int n = fmt_request_format(&r, line, sizeof line);
    cr_assert_gt(n, 0);
    cr_assert(strstr(line, "\"cached_tokens\":48"), "%s", line);
    fmt_request back;
    fmt_request_text t;
    cr_assert_eq(fmt_request_parse(line, (size_t)n, &back, &t, why, sizeof why), 0, "%s", why);
    cr_assert_eq(back.cached_tokens, 48);
    r.cached_tokens = 0;
    n = fmt_request_format(&r, line, sizeof line);
    cr_assert_eq(fmt_request_parse(line, (size_t)n, &back, &t, why, sizeof why), 0, "%s", why);
    cr_assert_eq(back.cached_tokens, 0, "0 is a count, not a missing value");
    r.cached_tokens = FMT_NULL;
    n = fmt_request_format(&r, line, sizeof line);
    cr_assert_null(strstr(line, "cached_tokens"), "%s", line);
    cr_assert_eq(fmt_request_parse(line, (size_t)n, &back, &t, why, sizeof why), 0, "%s", why);
    cr_assert_eq(back.cached_tokens, FMT_NULL);
    const char *nul = "{\"req\":1,\"arrival_us\":1,\"prompt_tokens\":2,\"output_tokens\":3,"
                      "\"cached_tokens\":null}";
    cr_assert_eq(fmt_request_parse(nul, strlen(nul), &back, &t, why, sizeof why), 0, "%s", why);
    cr_assert_eq(back.cached_tokens, FMT_NULL);
    const char *neg = "{\"req\":1,\"arrival_us\":1,\"prompt_tokens\":2,\"output_tokens\":3,"
                      "\"cached_tokens\":-16}";
    cr_assert_eq(fmt_request_parse(neg, strlen(neg), &back, &t, why, sizeof why), -EINVAL);
    cr_assert(strstr(why, "\"cached_tokens\" is -16"), "%s", why);
}

/* ---- iteration log -------------------------------------------------------------------- */

Test(formats_iteration_log, round_trip)
{
    fmt_iteration a = {.it = 123,
                       .t_us = 4403822,
                       .period_us = 150,
                       .iter_us = 140,
                       .exec_us = 120,
                       .prefill_tokens = 256,
                       .prefill_seqs = 1,
                       .prefill_pairs = 32640,
                       .decode_seqs = 3,
                       .decode_context = 600,
                       .context_tokens = 856,
                       .transfers = 0,
                       .wakes = 2};
    fmt_iteration idle = a;
    idle.period_us = NAN;
    idle.transfers = 4;
    const fmt_iteration *cases[] = {&a, &idle};
    for (int i = 0; i < 2; i++) {
        char line[512], why[200];
        int n = fmt_iteration_format(cases[i], line, sizeof line);
        cr_assert_gt(n, 0);
        fmt_iteration b;
        cr_assert_eq(fmt_iteration_parse(line, (size_t)n, &b, why, sizeof why), 0, "%s: %s", why,
                     line);
        const fmt_iteration *a = cases[i];
        cr_assert(a->it == b.it && a->t_us == b.t_us && a->iter_us == b.iter_us &&
                      a->exec_us == b.exec_us && a->prefill_tokens == b.prefill_tokens &&
                      a->prefill_seqs == b.prefill_seqs && a->prefill_pairs == b.prefill_pairs &&
                      a->decode_seqs == b.decode_seqs && a->decode_context == b.decode_context &&
                      a->context_tokens == b.context_tokens && a->transfers == b.transfers &&
                      a->wakes == b.wakes,
                  "case %d differs after the round trip: %s", i, line);
        cr_assert(a->period_us == b.period_us || (isnan(a->period_us) && isnan(b.period_us)),
                  "case %d: period %g read back as %g", i, a->period_us, b.period_us);
    }
}

Test(formats_iteration_log, reader_rules)
{
    char why[200];
    fmt_iteration it;
#define PARSE(s) fmt_iteration_parse(s, strlen(s), &it, why, sizeof why)
    cr_assert_eq(
        PARSE("{\"prefill_tokens\":1,\"decode_seqs\":2,\"context_tokens\":3,\"prefill_pairs\":0}"),
        0, "%s", why);
    cr_assert(isnan(it.period_us));
    cr_assert_eq(it.transfers, 0);
    cr_assert(isnan(it.decode_context));
    cr_assert_eq(PARSE("{\"prefill_tokens\":1,\"decode_seqs\":2,\"context_tokens\":3}"), -EINVAL);
    cr_assert(strstr(why, "prefill_pairs"), "%s", why);
    cr_assert_eq(
        PARSE(
            "{\"prefill_tokens\":1,\"decode_seqs\":2.5,\"context_tokens\":3,\"prefill_pairs\":0}"),
        -EINVAL);
    cr_assert(strstr(why, "decode_seqs"), "%s", why);
    cr_assert_eq(PARSE("{\"prefill_tokens\":1,\"decode_seqs\":2,\"context_tokens\":3,\"prefill_"
                       "pairs\":0,\"wakes\":-1}"),
                 -EINVAL);
    cr_assert(strstr(why, "wakes"), "%s", why);
#undef PARSE
}

/* ---- decision lines ------------------------------------------------------------------- */

Test(formats_decision, round_trip_and_escaping)
{
    fmt_decision d;
    fmt_decision_init(&d);
    d.t_us = 55;
    d.ev = "reject";
    d.req = 9;
    d.tenant = "acme";
    d.class_name = "x\"y";
    d.reason = "bad_params";
    d.detail = "temperature \"101\"\nout of range";
    d.prompt_tokens = 4;
    d.max_tokens = 16;
    d.swap_cost_us = 12.5;
    d.realised_us = -1;
    char line[1024], why[200];
    int n = fmt_decision_format(&d, line, sizeof line);
    cr_assert_gt(n, 0);
    fmt_decision b;
    fmt_decision_text t;
    cr_assert_eq(fmt_decision_parse(line, (size_t)n, &b, &t, why, sizeof why), 0, "%s: %s", why,
                 line);
    cr_assert_eq(b.t_us, 55);
    cr_assert_str_eq(b.ev, "reject");
    cr_assert_eq(b.req, 9);
    cr_assert_str_eq(b.class_name, "x\"y");
    cr_assert_str_eq(b.detail, d.detail);
    cr_assert_eq(b.prompt_tokens, 4);
    cr_assert_eq(b.max_tokens, 16);
    cr_assert_eq(b.blocks, FMT_NULL);
    cr_assert_eq(b.swap_cost_us, 12.5);
    cr_assert_eq(b.realised_us, -1);
    cr_assert(isnan(b.predicted_us));
    cr_assert_null(b.mode);

    /* the keys only scheduler events carry (cache hits, demotions, reloads) read back too */
    fmt_decision_init(&d);
    d.t_us = 56;
    d.ev = "cache_demote";
    d.req = 3;
    d.pool = "device";
    d.to = "host";
    d.choice = "reload";
    d.cached_tokens = 32;
    d.self_tokens = 16;
    d.device_tokens = 1;
    d.host_tokens = 2;
    d.disk_tokens = 3;
    d.reload_cost_us = 7.5;
    d.expected_reuse = 2.5;
    n = fmt_decision_format(&d, line, sizeof line);
    cr_assert_gt(n, 0);
    cr_assert_eq(fmt_decision_parse(line, (size_t)n, &b, &t, why, sizeof why), 0, "%s: %s", why,
                 line);
    cr_assert_str_eq(b.to, "host");
    cr_assert_str_eq(b.choice, "reload");
    cr_assert_eq(b.cached_tokens, 32);
    cr_assert_eq(b.self_tokens, 16);
    cr_assert_eq(b.device_tokens + b.host_tokens + b.disk_tokens, 6);
    cr_assert_eq(b.reload_cost_us, 7.5);
    cr_assert_eq(b.expected_reuse, 2.5);
}

/* ---- stats file ------------------------------------------------------------------------ */

Test(formats_stats, file_round_trip)
{
    fmt_stats a = {.t_us = 1,
                   .iterations = 2,
                   .sessions = 3,
                   .live_requests = 4,
                   .waiting = 5,
                   .running = 6,
                   .swapped = 7,
                   .in_transit = 8,
                   .blocked = 9,
                   .kv = {{10, 11, 21}, {0, 5, 5}, {1, 2, 3}},
                   .transfers_inflight = 12,
                   .swap_verified = 14,
                   .swap_verify_errors = 15,
                   .transfer_overlap_errors = 16,
                   .engine_errors = 17,
                   .finished = 18,
                   .rejects = 19,
                   .draining = true,
                   .steps = 20};
    snprintf(a.invariants, sizeof a.invariants, "tenant \"x\" counts 3 blocks, holds 2");
    snprintf(a.policy, sizeof a.policy, "0123456789abcdef");
    char path[] = "/tmp/ringlm-test-stats-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    char why[200];
    cr_assert_eq(fmt_stats_write(path, &a, why, sizeof why), 0, "%s", why);
    fmt_stats b;
    cr_assert_eq(fmt_stats_read(path, &b, why, sizeof why), 0, "%s", why);
    unlink(path);
    cr_assert_eq(memcmp(&a, &b, sizeof a), 0, "the stats file did not read back as written");
    cr_assert_eq(fmt_stats_parse("{\"t_us\":1}", 10, &b, why, sizeof why), -EINVAL);
    cr_assert(strstr(why, "iterations"), "%s", why);
}

/* ---- trace readers ------------------------------------------------------------------------ */

/* Reads every record of a buffer; returns the count, bad lines counted in *bad. */
static int read_all(const char *buf, int format, fmt_request *out, int max, int *bad, char *why,
                    size_t wl)
{
    fmt_trace_reader rd;
    cr_assert_eq(fmt_trace_open(&rd, buf, strlen(buf), format, why, wl), 0, "%s", why);
    int n = 0, rc;
    fmt_request r;
    fmt_request_text t;
    *bad = 0;
    while ((rc = fmt_trace_next(&rd, &r, &t, why, wl)) != 0) {
        if (rc < 0) {
            (*bad)++;
            if (rd.fatal) break;
            continue;
        }
        if (n < max) out[n] = r;
        n++;
    }
    return n;
}

Test(formats_trace, azure_rounds_timestamps_and_counts_rows)
{
    const char *csv = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                      "2023-11-16 18:15:46.6805900,374,44\r\n"
                      "2023-11-16 18:15:46.6805904,10,0\r\n" /* refused: 0 generated */
                      "\r\n"
                      "2023-11-16 18:15:47.0000005,7,2\r\n";
    fmt_request r[4];
    int bad;
    char why[200];
    cr_assert_eq(fmt_trace_guess(csv, strlen(csv)), FMT_TRACE_AZURE);
    int n = read_all(csv, FMT_TRACE_AUTO, r, 4, &bad, why, sizeof why);
    cr_assert_eq(n, 2);
    cr_assert_eq(bad, 1);
    /* .6805900 s is 680590.0 µs; .0000005 s rounds up to 1 µs (truncation would give 0) */
    cr_assert_eq(r[0].arrival_us % 1000000, 680590);
    cr_assert_eq(r[1].arrival_us - r[0].arrival_us, 1000000 - 680590 + 1);
    cr_assert_eq(r[0].prompt_tokens, 374);
    cr_assert_eq(r[0].output_tokens, 44);
    cr_assert_eq(r[0].max_tokens, 44);
    cr_assert_eq(r[0].req, 0);
    cr_assert_eq(r[1].req, 1);
    /* no header: the whole file is refused */
    n = read_all("2023-11-16 18:15:46.6,1,1\n", FMT_TRACE_AZURE, r, 4, &bad, why, sizeof why);
    cr_assert_eq(n, 0);
    cr_assert(strstr(why, "header"), "%s", why);
}

Test(formats_trace, mooncake_and_native)
{
    const char *mc = "{\"timestamp\": 27.4, \"input_length\": 6955, \"output_length\": 52, "
                     "\"hash_ids\": [1,2]}\n"
                     "{\"timestamp\": 30, \"input_length\": 0, \"output_length\": 52}\n";
    fmt_request r[4];
    int bad;
    char why[200];
    cr_assert_eq(fmt_trace_guess(mc, strlen(mc)), FMT_TRACE_MOONCAKE);
    cr_assert_eq(read_all(mc, FMT_TRACE_AUTO, r, 4, &bad, why, sizeof why), 1);
    cr_assert_eq(bad, 1);
    cr_assert(strstr(why, "input_length"), "%s", why);
    cr_assert_eq(r[0].arrival_us, 27400);
    cr_assert_eq(r[0].prompt_tokens, 6955);
    cr_assert_eq(r[0].output_tokens, 52);

    /* a native trace is the request log: what fmt_request_format writes, the reader reads */
    fmt_request w = {.req = 3,
                     .arrival_us = 500,
                     .tenant = "a",
                     .class_name = "b",
                     .prompt_tokens = 5,
                     .max_tokens = 8,
                     .output_tokens = 8,
                     .deadline_us = FMT_NULL,
                     .cancel_us = 900,
                     .first_token_us = 600,
                     .finish_us = 950,
                     .finish_reason = "cancelled"};
    char buf[600];
    int n = fmt_request_format(&w, buf, sizeof buf - 1);
    cr_assert_gt(n, 0);
    buf[n] = '\n';
    buf[n + 1] = 0;
    fmt_trace_reader rd;
    cr_assert_eq(fmt_trace_open(&rd, buf, strlen(buf), FMT_TRACE_AUTO, why, sizeof why), 0);
    cr_assert_eq(rd.format, FMT_TRACE_NATIVE);
    fmt_request got;
    fmt_request_text t;
    cr_assert_eq(fmt_trace_next(&rd, &got, &t, why, sizeof why), 1, "%s", why);
    assert_request_eq(&w, &got);
    cr_assert_eq(fmt_trace_next(&rd, &got, &t, why, sizeof why), 0);
}

/* sched_cost: the writer's cost model at a request's admission goes out and comes back field
 * for field (a replay decides with it), a tier the writer lacked stays absent, a line without
 * it reads as NULL, and a record a scheduler would refuse is refused with the field named */
Test(formats_request_log, sched_cost)
{
    char line[2048], why[200];
    fmt_sched_cost c = {.at_us = 123456,
                        .correction = 0.0731,
                        .base_us = 3350,
                        .prefill_token_us = 29,
                        .decode_seq_us = 30,
                        .context_token_us = 0.027,
                        .prefill_pair_us = 1e-5,
                        .host = {2.75e8, 1.42e7, 20, true, false}};
    fmt_request r = {.req = 3,
                     .arrival_us = 100000,
                     .prompt_tokens = 40,
                     .max_tokens = 4,
                     .output_tokens = 4,
                     .deadline_us = FMT_NULL,
                     .cancel_us = FMT_NULL,
                     .first_token_us = FMT_NULL,
                     .finish_us = 9,
                     .finish_reason = "length",
                     .cached_tokens = FMT_NULL,
                     .sched_cost = &c};
    int n = fmt_request_format(&r, line, sizeof line);
    cr_assert_gt(n, 0);
    cr_assert_null(strstr(line, "\"disk\""), "a tier the writer lacked: %s", line);
    fmt_request back;
    fmt_request_text t;
    cr_assert_eq(fmt_request_parse(line, (size_t)n, &back, &t, why, sizeof why), 0, "%s: %s", why,
                 line);
    cr_assert_not_null(back.sched_cost, "%s", line);
    cr_assert_eq(memcmp(back.sched_cost, &c, sizeof c), 0, "not read back as written: %s", line);
    c.disk = (fmt_tier_cost){1e6, 1.9e7, 100, false, true};
    n = fmt_request_format(&r, line, sizeof line);
    cr_assert_eq(fmt_request_parse(line, (size_t)n, &back, &t, why, sizeof why), 0, "%s: %s", why,
                 line);
    cr_assert_eq(memcmp(back.sched_cost, &c, sizeof c), 0, "not read back as written: %s", line);
    r.sched_cost = NULL;
    n = fmt_request_format(&r, line, sizeof line);
    cr_assert_null(strstr(line, "sched_cost"), "%s", line);
    cr_assert_eq(fmt_request_parse(line, (size_t)n, &back, &t, why, sizeof why), 0, "%s", why);
    cr_assert_null(back.sched_cost);
#define BASE "{\"req\":1,\"arrival_us\":1,\"prompt_tokens\":2,\"output_tokens\":3,\"sched_cost\":"
#define STEP                                                                                       \
    "\"step\":{\"base_us\":1,\"prefill_token_us\":2,\"decode_seq_us\":0,\"context_token_us\":0,"   \
    "\"prefill_pair_us\":0}"
    const char *bad[][2] = {
        {BASE "7}", "not an object"},
        {BASE "{\"at_us\":5,\"correction\":1}}", "\"step\""},
        {BASE "{\"at_us\":5,\"correction\":0," STEP "}}", "\"correction\""},
        {BASE "{\"correction\":1," STEP "}}", "\"at_us\""},
        {BASE "{\"at_us\":5,\"correction\":1,\"step\":{\"base_us\":1,\"prefill_token_us\":0,"
              "\"decode_seq_us\":0,"
              "\"context_token_us\":0,\"prefill_pair_us\":0}}}",
         "\"prefill_token_us\""},
        {BASE "{\"at_us\":5,\"correction\":1," STEP
              ",\"host\":{\"out_bytes_per_s\":0,\"in_bytes_per_s\":1,"
              "\"latency_us\":0}}}",
         "host"},
        {BASE "{\"at_us\":5,\"correction\":1," STEP
              ",\"disk\":{\"out_bytes_per_s\":1,\"in_bytes_per_s\":1,"
              "\"latency_us\":0,\"in_measured\":1}}}",
         "in_measured"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(fmt_request_parse(bad[i][0], strlen(bad[i][0]), &back, &t, why, sizeof why),
                     -EINVAL, "accepted: %s", bad[i][0]);
        cr_assert(strstr(why, bad[i][1]), "%s: the reason does not name %s: %s", bad[i][0],
                  bad[i][1], why);
    }
#undef STEP
#undef BASE
}
