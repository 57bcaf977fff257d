/* SPDX-License-Identifier: MIT */
/*
 * Decision and request logs: every queued line reaches the file whole, drops are counted
 * (never a blocked producer), request lines round-trip through the native trace format,
 * and lines are valid JSON (jansson).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/declog.h"

static char *tmpfile_path(const char *tag)
{
    char *p;
    cr_assert(asprintf(&p, "/tmp/ringlm-test-%s-%d-XXXXXX", tag, getpid()) > 0);
    int fd = mkstemp(p);
    cr_assert(fd >= 0);
    close(fd);
    return p;
}

/* Reads a file's lines; returns the count, *lines malloc()ed array of strdup()ed lines. */
static int read_lines(const char *path, char ***lines)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "open %s", path);
    char *l = NULL;
    size_t cap = 0;
    int n = 0, ncap = 0;
    *lines = NULL;
    ssize_t len;
    while ((len = getline(&l, &cap, f)) >= 0) {
        cr_assert(len > 0 && l[len - 1] == '\n', "line %d of %s is not whole: '%s'", n + 1, path,
                  l);
        l[len - 1] = 0;
        if (n == ncap)
            *lines = realloc(*lines, sizeof(char *) * (size_t)(ncap = ncap ? ncap * 2 : 64));
        (*lines)[n++] = strdup(l);
    }
    free(l);
    fclose(f);
    return n;
}

static void free_lines(char **lines, int n)
{
    for (int i = 0; i < n; i++) free(lines[i]);
    free(lines);
}

Test(daemon_declog, request_lines_round_trip)
{
    char *path = tmpfile_path("req");
    declog_config cfg = {.request_path = path, .truncate = true};
    declog *d;
    cr_assert_eq(declog_create(&cfg, &d), 0, "%s", declog_errmsg());
    cr_assert(declog_has_requests(d) && !declog_has_decisions(d));
    declog_request in[3] = {
        {.req = 1,
         .arrival_us = 10,
         .tenant = "alice",
         .class_name = "chat",
         .prompt_tokens = 12,
         .max_tokens = 64,
         .output_tokens = 64,
         .deadline_us = DECLOG_NULL,
         .cancel_us = DECLOG_NULL,
         .first_token_us = 900,
         .finish_us = 5000,
         .finish_reason = "length",
         .reject_reason = NULL},
        {.req = 2,
         .arrival_us = 20,
         .tenant = "b\"o\\b\n\x01",
         .class_name = "batch",
         .prompt_tokens = 4000,
         .max_tokens = 10,
         .output_tokens = 0,
         .deadline_us = 30,
         .cancel_us = DECLOG_NULL,
         .first_token_us = DECLOG_NULL,
         .finish_us = 21,
         .finish_reason = "rejected",
         .reject_reason = "prompt_too_long"},
        {.req = 3,
         .arrival_us = 30,
         .tenant = "ünï",
         .class_name = "chat",
         .prompt_tokens = 5,
         .max_tokens = 100,
         .output_tokens = 7,
         .deadline_us = DECLOG_NULL,
         .cancel_us = 400,
         .first_token_us = 100,
         .finish_us = 401,
         .finish_reason = "cancelled",
         .reject_reason = NULL},
    };
    for (int i = 0; i < 3; i++) cr_assert_eq(declog_request_line(d, &in[i]), 0);
    cr_assert_eq(declog_flush(d, 5000), 0, "%s", declog_errmsg());
    char **lines;
    int n = read_lines(path, &lines);
    cr_assert_eq(n, 3, "%d lines", n);
    for (int i = 0; i < 3; i++) {
        json_error_t e;
        json_t *o = json_loads(lines[i], 0, &e);
        cr_assert(o && json_is_object(o), "line %d not JSON: %s: %s", i, e.text, lines[i]);
        /* every FORMATS.md key is present */
        const char *keys[] = {"req",           "arrival_us",     "tenant",        "class",
                              "prompt_tokens", "max_tokens",     "output_tokens", "deadline_us",
                              "cancel_us",     "first_token_us", "finish_us",     "finish_reason",
                              "reject_reason"};
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
            cr_assert(json_object_get(o, keys[k]), "line %d lacks %s: %s", i, keys[k], lines[i]);
        json_decref(o);
        declog_request r;
        fmt_request_text text;
        char why[200];
        int rc = fmt_request_parse(lines[i], strlen(lines[i]), &r, &text, why, sizeof why);
        cr_assert_eq(rc, 0, "parse: %s", why);
        cr_assert_eq(r.req, in[i].req);
        cr_assert_eq(r.arrival_us, in[i].arrival_us);
        cr_assert_str_eq(r.tenant, in[i].tenant);
        cr_assert_str_eq(r.class_name, in[i].class_name);
        cr_assert_eq(r.prompt_tokens, in[i].prompt_tokens);
        cr_assert_eq(r.max_tokens, in[i].max_tokens);
        cr_assert_eq(r.output_tokens, in[i].output_tokens);
        cr_assert_eq(r.deadline_us, in[i].deadline_us);
        cr_assert_eq(r.cancel_us, in[i].cancel_us);
        cr_assert_eq(r.first_token_us, in[i].first_token_us);
        cr_assert_eq(r.finish_us, in[i].finish_us);
        cr_assert_str_eq(r.finish_reason, in[i].finish_reason);
        if (in[i].reject_reason)
            cr_assert_str_eq(r.reject_reason, in[i].reject_reason);
        else
            cr_assert_null(r.reject_reason);
        /* format(parse(line)) == line */
        char again[1024];
        cr_assert_eq(fmt_request_format(&r, again, sizeof again), (int)strlen(lines[i]));
        cr_assert_str_eq(again, lines[i]);
    }
    free_lines(lines, n);
    declog_destroy(d);
    unlink(path);
    free(path);
}

/* The request log's reader (formats/request_log.c) names the field it refuses. */
Test(daemon_declog, parse_rejects_bad_fields_by_name)
{
    declog_request r;
    fmt_request_text text;
    char why[200];
    const char *bad[][2] = {
        {"{\"req\":1,\"arrival_us\":1,\"prompt_tokens\":-3,\"output_tokens\":1}", "prompt_tokens"},
        {"{\"req\":1,\"arrival_us\":\"x\",\"prompt_tokens\":3,\"output_tokens\":1}", "arrival_us"},
        {"{\"req\":1,\"prompt_tokens\":3,\"output_tokens\":1}", "arrival_us"},
        {"{\"arrival_us\":1,\"prompt_tokens\":3,\"output_tokens\":1}", "req"},
        {"{\"req\":1,\"arrival_us\":1,\"prompt_tokens\":3}", "output_tokens"},
        {"{\"req\":1,\"arrival_us\":1,\"prompt_tokens\":3,\"output_tokens\":1,\"tenant\":5}",
         "tenant"},
        {"[1,2]", "object"},
        {"{\"arrival_us\":1,", "JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = fmt_request_parse(bad[i][0], strlen(bad[i][0]), &r, &text, why, sizeof why);
        cr_assert_eq(rc, -EINVAL, "case %zu accepted", i);
        cr_assert(strstr(why, bad[i][1]), "case %zu: detail '%s' lacks '%s'", i, why, bad[i][1]);
    }
    /* unknown keys ignored, optional ones null */
    const char *ok =
        "{\"req\":4,\"arrival_us\":5,\"prompt_tokens\":3,\"output_tokens\":2,\"zzz\":[1]}";
    cr_assert_eq(fmt_request_parse(ok, strlen(ok), &r, &text, why, sizeof why), 0, "%s", why);
    cr_assert_eq(r.cancel_us, DECLOG_NULL);
    cr_assert_eq(r.max_tokens, 2);
    cr_assert_str_eq(r.tenant, "");
}

Test(daemon_declog, decision_lines_whole_and_drops_counted)
{
    char *path = tmpfile_path("dec");
    /* The smallest ring: a burst overruns the writer now and then; the producer must never
     * wait, and every line is either in the file (whole) or counted as dropped. */
    declog_config cfg = {.decision_path = path, .ring_bytes = 1, .truncate = true};
    declog *d;
    cr_assert_eq(declog_create(&cfg, &d), 0, "%s", declog_errmsg());
    const int N = 20000;
    int ok = 0, dropped = 0;
    char line[256];
    for (int i = 0; i < N; i++) {
        int n = snprintf(line, sizeof line,
                         "{\"t_us\":%d,\"ev\":\"admit\",\"req\":%d,\"tenant\":\"t%d\",\"class\":"
                         "\"chat\",\"reason\":\"\"}",
                         i, i, i % 3);
        int rc = declog_decision_line(d, line, (size_t)n);
        if (rc == 0)
            ok++;
        else {
            cr_assert_eq(rc, -ENOBUFS, "rc %d", rc);
            dropped++;
        }
    }
    /* too long: dropped, counted */
    char *huge = malloc(DECLOG_LINE_MAX + 10);
    memset(huge, 'x', DECLOG_LINE_MAX + 9);
    cr_assert_eq(declog_decision_line(d, huge, DECLOG_LINE_MAX + 9), -EMSGSIZE);
    free(huge);
    uint64_t dq, rq, dd, rd;
    declog_queued(d, &dq, &rq);
    declog_dropped(d, &dd, &rd);
    cr_assert_eq(dq, (uint64_t)ok);
    cr_assert_eq(dd, (uint64_t)dropped + 1);
    cr_assert_eq(rq + rd, 0);
    cr_assert_eq(declog_flush(d, 5000), 0);
    declog_destroy(d);
    char **lines;
    int n = read_lines(path, &lines);
    cr_assert_eq(n, ok, "file has %d lines, %d were queued (%d dropped)", n, ok, dropped);
    int last = -1;
    for (int i = 0; i < n; i++) {
        json_error_t e;
        json_t *o = json_loads(lines[i], 0, &e);
        cr_assert(o, "line %d not JSON: %s", i, lines[i]);
        int t = (int)json_integer_value(json_object_get(o, "t_us"));
        cr_assert(t > last, "lines out of order at %d", i);
        last = t;
        cr_assert(json_is_string(json_object_get(o, "ev")));
        json_decref(o);
    }
    free_lines(lines, n);
    unlink(path);
    free(path);
}

Test(daemon_declog, open_errors_name_the_path)
{
    declog_config cfg = {.decision_path = "/nonexistent-dir/x.jsonl"};
    declog *d;
    cr_assert_eq(declog_create(&cfg, &d), -ENOENT);
    cr_assert(strstr(declog_errmsg(), "/nonexistent-dir/x.jsonl"), "%s", declog_errmsg());
    /* nothing configured: valid, no thread, calls are no-ops */
    declog_config none = {0};
    cr_assert_eq(declog_create(&none, &d), 0);
    cr_assert_eq(declog_decision_line(d, "{}", 2), 0);
    cr_assert_eq(declog_flush(d, 10), 0);
    declog_destroy(d);
}

#include "sched/sched.h"

/* Decision lines go through the scheduler's own formatter: valid JSON, schema keys. */
Test(daemon_declog, sched_events_are_schema_json)
{
    char *path = tmpfile_path("sev");
    declog_config cfg = {.decision_path = path, .truncate = true};
    declog *d;
    cr_assert_eq(declog_create(&cfg, &d), 0, "%s", declog_errmsg());
    sched_event evs[] = {
        {.t_us = 1,
         .kind = SCHED_EV_ADMIT,
         .req = 7,
         .tenant = "alice",
         .class_name = "chat",
         .prompt_tokens = 12,
         .max_tokens = 30},
        {.t_us = 2,
         .kind = SCHED_EV_PREEMPT,
         .req = 7,
         .tenant = "alice",
         .class_name = "chat",
         .defer = SCHED_DEFER_BLOCKS,
         .mode = SCHED_PREEMPT_SWAP,
         .blocks = 3,
         .swap_cost_us = 12.5,
         .recompute_cost_us = 99.0},
        {.t_us = 3,
         .kind = SCHED_EV_RELEASE,
         .req = 7,
         .tenant = "alice",
         .class_name = "chat",
         .pool = SCHED_POOL_HOST,
         .blocks = 3},
        {.t_us = 4,
         .kind = SCHED_EV_REJECT,
         .req = 7,
         .tenant = "bad\xff\xfeutf8",
         .class_name = "chat",
         .reject = SCHED_REJECT_BAD_TOKEN,
         .detail = "prompt token 1 is \"9999\"\n"},
        {.t_us = 4,
         .kind = SCHED_EV_FINISH,
         .req = 7,
         .tenant = "al\"ice",
         .class_name = "chat",
         .finish = SCHED_FINISH_LENGTH,
         .output_tokens = 30,
         .policy = "00ff"},
    };
    const int n_ev = (int)(sizeof evs / sizeof *evs);
    for (int i = 0; i < n_ev; i++)
        cr_assert_eq(declog_decision(d, &evs[i]), 0, "%s", declog_errmsg());
    cr_assert_eq(declog_flush(d, 5000), 0);
    declog_destroy(d);
    char **lines;
    int n = read_lines(path, &lines);
    cr_assert_eq(n, n_ev);
    for (int i = 0; i < n; i++) {
        json_error_t e;
        json_t *o = json_loads(lines[i], 0, &e);
        cr_assert(o && json_is_object(o), "line %d not JSON (%s): %s", i, e.text, lines[i]);
        cr_assert(json_is_integer(json_object_get(o, "t_us")), "%s", lines[i]);
        cr_assert_str_eq(json_string_value(json_object_get(o, "ev")),
                         sched_event_name(evs[i].kind));
        cr_assert_eq(json_integer_value(json_object_get(o, "req")), 7);
        if (evs[i].kind == SCHED_EV_REJECT) { /* repaired: U+FFFD for each bad byte */
            cr_assert_str_eq(json_string_value(json_object_get(o, "tenant")),
                             "bad\xef\xbf\xbd\xef\xbf\xbdutf8", "%s", lines[i]);
            cr_assert_str_eq(json_string_value(json_object_get(o, "reason")), "bad_token");
            cr_assert_str_eq(json_string_value(json_object_get(o, "detail")), evs[i].detail);
        } else
            cr_assert_str_eq(json_string_value(json_object_get(o, "tenant")), evs[i].tenant);
        cr_assert(json_is_string(json_object_get(o, "class")));
        if (evs[i].kind == SCHED_EV_PREEMPT) {
            cr_assert_str_eq(json_string_value(json_object_get(o, "mode")), "swap", "%s", lines[i]);
            cr_assert(json_is_number(json_object_get(o, "swap_cost_us")), "%s", lines[i]);
            cr_assert(json_is_number(json_object_get(o, "recompute_cost_us")), "%s", lines[i]);
            cr_assert_eq(json_integer_value(json_object_get(o, "blocks")), 3, "%s", lines[i]);
        }
        if (evs[i].kind == SCHED_EV_RELEASE)
            cr_assert_str_eq(json_string_value(json_object_get(o, "pool")), "host", "%s", lines[i]);
        json_decref(o);
    }
    free_lines(lines, n);
    unlink(path);
    free(path);
}
