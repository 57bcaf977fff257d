/* SPDX-License-Identifier: MIT */
/*
 * `ringlm replay --http URL` against `ringlm replay` on the shared-memory socket: one trace,
 * one real daemon, the real gateway in front of it. Both reports are JSON with the same
 * fields; every request completes on both paths; greedy generation of the same synthetic
 * prompts gives the same output tokens per tenant; the HTTP path's requests are tagged with
 * the tenant of their API key (the daemon's own counters say so).
 */
#include "tests/gateway_helpers.h"

#include "ringlm.h"

#include <criterion/criterion.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(gateway_replay, .fini = gwh_stop_all, .timeout = 240);

#define N_REQ 16

static char *write_trace(void)
{
    char *p = th_path(gwh_dir(), "trace.jsonl");
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < N_REQ; i++)
        fprintf(f,
                "{\"req\":%d,\"arrival_us\":%d,\"tenant\":\"%s\",\"class\":\"chat\",\"prompt_"
                "tokens\":%d,"
                "\"output_tokens\":%d}\n",
                i, i * 20000, i % 2 ? "bob" : "alice", 4 + i % 5, 6 + (i * 3) % 11);
    fclose(f);
    return p;
}

static json_t *replay(const char *const *args)
{
    char *ringlm = th_program("ringlm");
    const char *argv[24] = {ringlm};
    int n = 1;
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n] = NULL;
    char *out, *err;
    int rc = th_run((char *const *)argv, &out, &err, 120);
    cr_assert_eq(rc, 0, "ringlm replay exited %d:\n%s\n%s\ngateway log:\n%s", rc, out, err,
                 th_read_file(gwh_gateway.log));
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert_not_null(j, "the report is not JSON (%s):\n%s", je.text, out);
    free(out);
    free(err);
    free(ringlm);
    return j;
}

/* The same field names (recursively through objects), whatever the values. */
static void same_fields(json_t *a, json_t *b, const char *where)
{
    cr_assert_eq(json_object_size(a), json_object_size(b), "%s: %zu fields vs %zu", where,
                 json_object_size(a), json_object_size(b));
    const char *k;
    json_t *v;
    json_object_foreach(a, k, v)
    {
        json_t *w = json_object_get(b, k);
        cr_assert_not_null(w, "%s: '%s' only in the shm report", where, k);
        if (json_is_object(v) && json_is_object(w) && strcmp(k, "rejects_by_reason")) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.%s", where, k);
            same_fields(v, w, sub);
        }
    }
}

static json_int_t jint(json_t *o, const char *a, const char *b)
{
    json_t *x = json_object_get(o, a);
    if (b) x = json_object_get(x, b);
    cr_assert(json_is_integer(x), "%s%s%s is not an integer", a, b ? "." : "", b ? b : "");
    return json_integer_value(x);
}

Test(gateway_replay, one_trace_through_the_socket_and_through_the_gateway)
{
    gwh_need();
    char *keys = gwh_keys();
    const char *extra[] = {"--api-keys", keys, NULL};
    gwh_start_daemon(NULL);
    gwh_start_gateway(extra);
    gwh_wait_healthy(10000);
    char *trace = write_trace();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", gwh_port);

    const char *shm_args[] = {"--socket", gwh_daemon.sock, "replay", trace, "--json", "--clients",
                              "2",        "--vocab",       "512",    NULL};
    const char *http_args[] = {"replay", trace,    "--json", "--clients",  "2",  "--vocab",
                               "512",    "--http", url,      "--api-keys", keys, NULL};
    json_t *shm = replay(shm_args);
    json_t *http = replay(http_args);

    same_fields(shm, http, "report");
    cr_assert_str_eq(json_string_value(json_object_get(shm, "transport")), "shm");
    cr_assert_str_eq(json_string_value(json_object_get(http, "transport")), "http");
    json_t *ts = json_object_get(shm, "tenants"), *th = json_object_get(http, "tenants");
    const char *tenants[] = {"alice", "bob", "all"};
    for (int i = 0; i < 3; i++) {
        json_t *a = json_object_get(ts, tenants[i]), *b = json_object_get(th, tenants[i]);
        cr_assert(a && b, "tenant %s missing from a report", tenants[i]);
        json_int_t want = i < 2 ? N_REQ / 2 : N_REQ;
        cr_assert_eq(jint(a, "requests", NULL), want);
        cr_assert_eq(jint(b, "requests", NULL), want);
        cr_assert_eq(jint(a, "completed", NULL), want, "shm: %s did not complete every request",
                     tenants[i]);
        cr_assert_eq(jint(b, "completed", NULL), want, "http: %s did not complete every request",
                     tenants[i]);
        cr_assert_eq(jint(b, "ttft_ms", "n"), want, "http: a TTFT per completed request");
        /* greedy, the same prompts: the same tokens */
        cr_assert_eq(jint(a, "output_tokens", NULL), jint(b, "output_tokens", NULL),
                     "%s: %lld output tokens through the socket, %lld through the gateway",
                     tenants[i], (long long)jint(a, "output_tokens", NULL),
                     (long long)jint(b, "output_tokens", NULL));
        cr_assert_gt(jint(b, "output_tokens", NULL), 0);
    }
    /* Both replays' requests ran as their trace tenants: the socket path tags them (this uid
     * is trusted), the gateway tags them from each request's API key. */
    char *mx = gwh_daemon_metrics();
    for (int i = 0; i < 2; i++) {
        char s1[160], s2[160];
        snprintf(s1, sizeof s1,
                 "ringlm_requests_finished_total{tenant=\"%s\",class=\"chat\",reason=\"length\"}",
                 tenants[i]);
        snprintf(s2, sizeof s2,
                 "ringlm_requests_finished_total{tenant=\"%s\",class=\"chat\",reason=\"stop\"}",
                 tenants[i]);
        cr_assert_eq(gwh_metric(mx, s1) + gwh_metric(mx, s2), N_REQ, "%s:\n%s", tenants[i], mx);
    }
    free(mx);
    json_decref(shm);
    json_decref(http);
    free(trace);
    free(keys);
}

Test(gateway_replay, http_replay_without_a_gateway_is_one_clear_error)
{
    gwh_need();
    char *trace = write_trace();
    char *ringlm = th_program("ringlm");
    char *argv[] = {ringlm, "replay", trace, "--http", "http://127.0.0.1:1", NULL};
    char *out, *err;
    int rc = th_run(argv, &out, &err, 30);
    cr_assert_neq(rc, 0);
    cr_assert(strstr(err, "--http http://127.0.0.1:1: cannot connect"), "%s", err);
    free(out);
    free(err);
    free(ringlm);
    free(trace);
}

/* The lines of a Prometheus text that name metric (a fresh string). */
static char *metric_lines(const char *text, const char *metric)
{
    size_t cap = 1, n = 0;
    char *out = calloc(1, 1);
    for (const char *l = text; out && l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) + 1 : strlen(l);
        if (!strncmp(l, metric, strlen(metric))) {
            char *o = realloc(out, cap + len);
            if (!o) break;
            out = o;
            memcpy(out + n, l, len);
            n += len;
            cap += len;
            out[n] = 0;
        }
        l += len;
    }
    return out;
}

/* Empties tenant held's token bucket (gwh_policy: 0.001 tokens/s): one request of one token
 * through the socket, tagged held (this uid is trusted to tag), served to its end. */
static void empty_held_bucket(void)
{
    ringlm_client *c;
    int rc = ringlm_connect(gwh_daemon.sock, &c);
    cr_assert_eq(rc, 0, "connect: %s (%s)", ringlm_strerror(rc), ringlm_errdetail());
    int32_t prompt[4] = {1, 403, 407, 261};
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = prompt;
    r.n_prompt = 4;
    r.max_new_tokens = 1;
    r.tenant_tag = "held";
    r.class_name = "chat";
    cr_assert_eq(ringlm_submit(c, &r, NULL), 0, "%s", ringlm_errdetail());
    ringlm_event ev;
    do rc = ringlm_next_event(c, &ev, 30000);
    while (rc > 0 && ev.kind != RINGLM_EV_FINISH);
    cr_assert(rc > 0, "the bucket-emptying request got no FINISH (%d %s)", rc, ringlm_strerror(rc));
    cr_assert_eq(ev.finish_reason, RINGLM_FINISH_LENGTH, "the bucket-emptying request ended %d/%d",
                 ev.finish_reason, ev.reject_reason);
    ringlm_close(c);
}

/* A trace cancel: the socket path cancels through libringlm, the HTTP path hangs up (the
 * gateway cancels); both report it as cancelled and ringlmd ended it so; the other request
 * completes. The cancelled request must still be in flight when its cancel comes, whatever the
 * load, and a generating one was not always: at load 25 the HTTP replay, due to cancel at 5 ms,
 * next ran 25 ms after submitting, by when ringlmd had generated the whole story (244 tokens,
 * 'stop') and the replay read it at once. So it waits in the queue: its tenant, held, has an
 * empty token bucket (empty_held_bucket) that takes over an hour to refill, and nothing but the
 * cancel can end it. */
Test(gateway_replay, a_trace_cancel_is_cancelled_on_both_paths)
{
    gwh_need();
    char *keys = gwh_keys();
    const char *extra[] = {"--api-keys", keys, NULL};
    gwh_start_daemon(NULL);
    gwh_start_gateway(extra);
    gwh_wait_healthy(10000);
    empty_held_bucket();
    char *trace = th_path(gwh_dir(), "cancel.jsonl");
    FILE *f = fopen(trace, "w");
    cr_assert_not_null(f);
    fprintf(
        f,
        "{\"req\":0,\"arrival_us\":0,\"tenant\":\"held\",\"class\":\"chat\",\"prompt_tokens\":4,"
        "\"output_tokens\":500,\"cancel_us\":5000}\n"
        "{\"req\":1,\"arrival_us\":1000,\"tenant\":\"bob\",\"class\":\"chat\",\"prompt_tokens\":4,"
        "\"output_tokens\":8}\n");
    fclose(f);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", gwh_port);
    const char *shm_args[] = {"--socket", gwh_daemon.sock, "replay", trace,
                              "--json",   "--vocab",       "512",    NULL};
    const char *http_args[] = {"replay", trace, "--json",     "--vocab", "512",
                               "--http", url,   "--api-keys", keys,      NULL};
    json_t *reports[2] = {replay(shm_args), replay(http_args)};
    for (int i = 0; i < 2; i++) {
        json_t *ts = json_object_get(reports[i], "tenants");
        json_int_t cancelled = jint(json_object_get(ts, "held"), "cancelled", NULL);
        json_int_t completed = jint(json_object_get(ts, "bob"), "completed", NULL);
        if (cancelled != 1 || completed != 1) {
            /* Everything that tells where the cancel went: the report (completed? an error?
             * when?), how the daemon ended each request (its finish counters), both logs. */
            char *rep = json_dumps(reports[i], JSON_INDENT(1) | JSON_SORT_KEYS);
            char *all = gwh_daemon_metrics();
            char *mx = all ? metric_lines(all, "ringlm_requests_finished_total") : NULL;
            char *glog = th_read_file(gwh_gateway.log), *dlog = th_read_file(gwh_daemon.log);
            cr_assert_fail("%s: held's request %s cancelled (%lld), bob's %s completed (%lld)\n"
                           "report:\n%s\ndaemon metrics:\n%s\ngateway log:\n%s\nringlmd log:\n%s",
                           i ? "http" : "shm", cancelled == 1 ? "was" : "was NOT",
                           (long long)cancelled, completed == 1 ? "was" : "was NOT",
                           (long long)completed, rep ? rep : "?", mx ? mx : "?", glog ? glog : "?",
                           dlog ? dlog : "?");
        }
        json_decref(reports[i]);
    }
    /* ringlmd lost no cancel: every request of held's that reached it ended cancelled (the
     * HTTP replay's hang-up reaches it as the gateway's cancel a moment after the replay
     * reports its own; under load the hang-up can come before the gateway submitted, and then
     * ringlmd never sees that request). Held's bucket is empty, so a request whose cancel was
     * lost would wait forever: none may be left waiting or running, and none may end another
     * way than the bucket-emptying request's one 'length'. */
    const char *series =
        "ringlm_requests_finished_total{tenant=\"held\",class=\"chat\",reason=\"cancelled\"}";
    const char *lengths =
        "ringlm_requests_finished_total{tenant=\"held\",class=\"chat\",reason=\"length\"}";
    const char *waiting = "ringlm_requests_waiting{tenant=\"held\",class=\"chat\"}";
    const char *running = "ringlm_requests_running{tenant=\"held\",class=\"chat\"}";
    double n = 0, left = 0;
    char *mx = NULL;
    for (uint64_t dl = th_now_ms() + 10000;;) {
        free(mx);
        mx = gwh_daemon_metrics();
        n = mx ? gwh_metric(mx, series) : 0;
        left = mx ? gwh_metric(mx, waiting) + gwh_metric(mx, running) : 1;
        if ((n >= 2 && left == 0) || th_now_ms() > dl) break; /* 1: look until the deadline */
        th_pause_ms(20);
    }
    char *fin = metric_lines(mx ? mx : "", "ringlm_requests");
    cr_expect(n >= 1 && n <= 2 && left == 0 && gwh_metric(mx ? mx : "", lengths) == 1,
              "ringlmd ended %.0f of held's requests cancelled, %.0f still held:\n%s", n, left,
              fin ? fin : "?");
    cr_log_info("ringlmd ended %.0f of held's trace requests cancelled (2: the gateway had "
                "submitted the HTTP one before the hang-up)",
                n);
    free(fin);
    free(mx);
    free(trace);
    free(keys);
}
