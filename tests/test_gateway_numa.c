/* SPDX-License-Identifier: MIT */
/*
 * One gateway over two daemons (ringlm-gateway --socket A --socket B: one ringlmd per NUMA
 * node of a multi-socket host, here both on this machine): a repeated prompt goes to the
 * daemon that was given its prefix (its prefix cache hits), unique prompts spread over both,
 * and when one daemon dies the request it was serving ends with a clear error while new
 * requests go to the other.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "ringlm.h"
#include "tests/gateway_helpers.h"

static th_daemon g_b; /* the second daemon (the first is gwh_daemon) */
static int g_b_metrics;

static void stop_all(void)
{
    gwh_stop_all();
    th_daemon_stop(&g_b, SIGTERM, 10000);
    th_daemon_cleanup(&g_b);
}

TestSuite(gateway_numa, .fini = stop_all, .timeout = 180);

/* The second daemon (stories260K, the test policy, metrics); extra: more options (or NULL). */
static void start_b(const char *const *extra)
{
    th_daemon_init(&g_b);
    char *model = th_shared_file("models/stories260K.bin");
    char *policy = gwh_policy();
    const char *args[32] = {"--model", model, "--policy", policy, "--metrics", "127.0.0.1:0"};
    int n = 6;
    for (int i = 0; extra && extra[i] && n < 31; i++) args[n++] = extra[i];
    args[n] = NULL;
    th_daemon_start(&g_b, args, GWH_DAEMON_START_MS);
    th_proc p = {.pid = g_b.pid};
    snprintf(p.log, sizeof p.log, "%s", g_b.log);
    g_b_metrics = th_proc_log_int(&p, "metrics on port ", GWH_DAEMON_START_MS);
    free(model);
    free(policy);
}

/* Two daemons (extra_a, extra_b: more options of each, or NULL) and a gateway over both with
 * one session each (and --daemon-metrics for both when metrics); returns once both sessions
 * are up. */
static void start_two_ext(const char *const *extra_a, const char *const *extra_b, bool metrics)
{
    gwh_need();
    gwh_need_curl();
    gwh_start_daemon(extra_a);
    start_b(extra_b);
    char *keys = gwh_keys();
    char ma[32], mb[32];
    snprintf(ma, sizeof ma, "127.0.0.1:%d", gwh_metrics_port);
    snprintf(mb, sizeof mb, "127.0.0.1:%d", g_b_metrics);
    const char *extra[] = {"--socket",
                           g_b.sock,
                           "--sessions",
                           "1",
                           "--api-keys",
                           keys,
                           metrics ? "--daemon-metrics" : NULL,
                           ma,
                           "--daemon-metrics",
                           mb,
                           NULL};
    gwh_start_gateway(extra);
    free(keys);
    gwh_wait_healthy(20000);
    /* both daemons' sessions up: /health is 200 with one */
    for (uint64_t dl = th_now_ms() + 20000;; th_pause_ms(20)) {
        char *m = gwh_gateway_metrics();
        double up = gwh_metric(m, "ringlm_gateway_sessions_connected");
        free(m);
        if (up == 2) break;
        cr_assert(th_now_ms() < dl, "the gateway has %g sessions up, not 2", up);
    }
}

static void start_two_with(const char *const *extra_a, const char *const *extra_b)
{
    start_two_ext(extra_a, extra_b, false);
}

static void start_two(void)
{
    start_two_with(NULL, NULL);
}

static double daemon_metric(int port, const char *series)
{
    int st = 0;
    char *b = th_http_get(port, "/metrics", &st, NULL, 0);
    cr_assert(b && st == 200);
    double v = gwh_metric(b, series);
    free(b);
    return v;
}

/* Requests a daemon finished, by its vllm:request_success_total. */
static double served(int port)
{
    static const char *const reasons[] = {"length", "stop", "abort"};
    double n = 0;
    for (int i = 0; i < 3; i++) {
        char series[160];
        snprintf(series, sizeof series,
                 "vllm:request_success_total{model_name=\"stories260K\",engine=\"0\","
                 "finished_reason=\"%s\"}",
                 reasons[i]);
        n += daemon_metric(port, series);
    }
    return n;
}

static double picks(int d)
{
    char *m = gwh_gateway_metrics(), series[80];
    snprintf(series, sizeof series, "ringlm_gateway_daemon_requests_total{daemon=\"%d\"}", d);
    double v = gwh_metric(m, series);
    free(m);
    return v;
}

static void complete(const char *prompt, int max_tokens)
{
    char body[1024];
    snprintf(body, sizeof body, "{\"model\":\"stories\",\"prompt\":\"%s\",\"max_tokens\":%d}",
             prompt, max_tokens);
    gwh_resp r = gwh_curl("/v1/completions", "sk-alice-0001", body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    gwh_resp_free(&r);
}

/* Each daemon's finished requests equal what the gateway sent it (the metrics publish within
 * 100 ms of the end). */
static void wait_served(double a, double b)
{
    for (uint64_t dl = th_now_ms() + 5000;; th_pause_ms(20)) {
        double sa = served(gwh_metrics_port), sb = served(g_b_metrics);
        if (sa == a && sb == b) return;
        cr_assert(th_now_ms() < dl, "daemons served %g and %g, the gateway sent %g and %g", sa, sb,
                  a, b);
    }
}

#define LONG_PROMPT                                                                                \
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "      \
    "park with her friends. One day, she saw a big red ball under a tree and she wanted it."

Test(gateway_numa, repeated_prompts_go_where_their_prefix_is_and_unique_ones_spread)
{
    start_two();
    for (int i = 0; i < 6; i++) complete(LONG_PROMPT, 4);
    double a = picks(0), b = picks(1);
    cr_assert((a == 6 && b == 0) || (a == 0 && b == 6),
              "the same prompt went to both daemons: %g and %g", a, b);
    wait_served(a, b);
    /* the one that holds the prefix hit it five times: its hit rate is one daemon's */
    int holder = a ? gwh_metrics_port : g_b_metrics;
    double q = daemon_metric(holder, "vllm:prefix_cache_queries_total{model_name=\"stories260K\","
                                     "engine=\"0\"}"),
           h = daemon_metric(
               holder, "vllm:prefix_cache_hits_total{model_name=\"stories260K\",engine=\"0\"}");
    cr_assert(q > 0 && h / q > 0.6, "prefix hits %g of %g queried tokens on the holder", h, q);
    char *m = gwh_gateway_metrics();
    cr_assert_eq(gwh_metric(m, "ringlm_gateway_affinity_requests_total"), 5, "%s", m);
    free(m);

    /* unique prompts: no daemon has their prefix, so the least loaded (in turn) gets each */
    for (int i = 0; i < 8; i++) {
        char p[160];
        snprintf(p, sizeof p,
                 "Tom had %d red apples and a dog named Max number %d who liked to run", i + 2,
                 i * 7);
        complete(p, 4);
    }
    double a2 = picks(0) - a, b2 = picks(1) - b;
    cr_assert(a2 >= 3 && b2 >= 3, "8 unique prompts split %g / %g", a2, b2);
    wait_served(a + a2, b + b2);
}

/* Empties tenant held's token bucket on a daemon (gwh_policy: 0.001 tokens/s): a request of
 * held that arrives afterwards waits in its queue for over an hour. */
static void empty_held_bucket(const char *sock)
{
    ringlm_client *c;
    int rc = ringlm_connect(sock, &c);
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
    cr_assert(rc > 0, "the bucket-emptying request got no FINISH");
    ringlm_close(c);
}

Test(gateway_numa, a_dead_daemon_ends_its_streams_with_an_error_and_the_other_takes_new_work)
{
    start_two();
    empty_held_bucket(gwh_daemon.sock);
    empty_held_bucket(g_b.sock);
    /* a stream that waits in its daemon's queue (held's bucket is empty) */
    int fd = gwh_connect();
    gwh_send_post(fd, "/v1/completions", "sk-held-00001",
                  "{\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,"
                  "\"stream\":true}");
    int victim = -1;
    for (uint64_t dl = th_now_ms() + 10000; victim < 0; th_pause_ms(10)) {
        char *m = gwh_gateway_metrics();
        if (gwh_metric(m, "ringlm_gateway_session_requests_in_flight{session=\"0\"}") == 1)
            victim = 0;
        else if (gwh_metric(m, "ringlm_gateway_session_requests_in_flight{session=\"1\"}") == 1)
            victim = 1;
        free(m);
        cr_assert(victim >= 0 || th_now_ms() < dl, "the held stream never reached a daemon");
    }
    th_daemon *dead = victim == 0 ? &gwh_daemon : &g_b;
    kill(dead->pid, SIGKILL);
    bool eof = false;
    char *got = th_read_until(fd, NULL, 15000, &eof);
    close(fd);
    cr_assert(eof, "the stream did not end after its daemon died: %s", got);
    cr_assert(strstr(got, "daemon_unavailable") && strstr(got, "went away"),
              "the stream of the dead daemon did not end with a clear error: %s", got);
    free(got);
    th_daemon_stop(dead, SIGKILL, 5000);

    /* new requests all go to the survivor */
    double before = picks(1 - victim);
    for (int i = 0; i < 4; i++) {
        char p[120];
        snprintf(p, sizeof p, "The cat number %d sat on the mat", i);
        complete(p, 4);
    }
    cr_assert_eq(picks(1 - victim) - before, 4, "new requests did not all go to the survivor");
    int st = 0;
    char *h = th_http_get(gwh_port, "/health", &st, NULL, 0);
    cr_assert_eq(st, 200, "/health with one daemon left: %d %s", st, h);
    free(h);
}

static ringlm_client *connect_to(const char *sock)
{
    ringlm_client *c;
    int rc = ringlm_connect(sock, &c);
    cr_assert_eq(rc, 0, "connect: %s (%s)", ringlm_strerror(rc), ringlm_errdetail());
    return c;
}

static void submit_held(ringlm_client *c, int n)
{
    int32_t prompt[4] = {1, 403, 407, 261};
    for (int i = 0; i < n; i++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = prompt;
        r.n_prompt = 4;
        r.max_new_tokens = 4;
        r.tenant_tag = "held";
        r.class_name = "chat";
        cr_assert_eq(ringlm_submit(c, &r, NULL), 0, "%s", ringlm_errdetail());
    }
}

#define VLLM(name) name "{model_name=\"stories260K\",engine=\"0\"}"

/* The daemons publish their load in every session's segment (ringlm_daemon_load): what other
 * clients queued there and how much of its KV pool is held. The gateway weighs both: daemon
 * 0 runs one request of a client that stopped reading (it holds its blocks), daemon 1 has two
 * queued requests of another client; by queue alone daemon 0 is the less loaded, by KV use it
 * is not — new unique prompts all go to daemon 1. */
Test(gateway_numa, the_daemons_published_queue_and_kv_use_steer_new_work)
{
    const char *dx[] = {"--kv-blocks",
                        "40",
                        "--event-ring-slots",
                        "64",
                        "--backpressure-buffer-tokens",
                        "1",
                        "--backpressure-timeout-ms",
                        "120000",
                        NULL};
    start_two_with(dx, dx);

    /* daemon 0: a 200-token prompt that generates until its 64-slot event ring is full, its
     * client reading nothing: it stays, holding its blocks */
    ringlm_client *stall = connect_to(gwh_daemon.sock);
    int32_t prompt[200];
    for (int i = 0; i < 200; i++) prompt[i] = 1 + (i * 37) % 480;
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = prompt;
    r.n_prompt = 200;
    r.max_new_tokens = 300;
    r.class_name = "chat";
    cr_assert_eq(ringlm_submit(stall, &r, NULL), 0, "%s", ringlm_errdetail());
    /* daemon 1: two requests of held wait in its queue (its bucket is empty) */
    empty_held_bucket(g_b.sock);
    ringlm_client *queued = connect_to(g_b.sock);
    submit_held(queued, 2);

    /* the gateway's view of each daemon equals the daemon's own metrics, once they settle
     * (the stalled request generates until its event ring is full: the same KV use in three
     * polls in a row) */
    double kv0 = 0, l0 = 0, l1 = 0, dkv = 0, dq = 0, last_kv = -1;
    int same_kv = 0;
    for (uint64_t dl = th_now_ms() + 20000;; th_pause_ms(50)) {
        char *m = gwh_gateway_metrics();
        kv0 = gwh_metric(m, "ringlm_gateway_daemon_kv_usage_perc{daemon=\"0\"}");
        l0 = gwh_metric(m, "ringlm_gateway_daemon_load{daemon=\"0\"}");
        l1 = gwh_metric(m, "ringlm_gateway_daemon_load{daemon=\"1\"}");
        free(m);
        dkv = daemon_metric(gwh_metrics_port, VLLM("vllm:kv_cache_usage_perc"));
        dq = daemon_metric(gwh_metrics_port, VLLM("vllm:num_requests_running")) +
             daemon_metric(gwh_metrics_port, VLLM("vllm:num_requests_waiting"));
        double w1 = daemon_metric(g_b_metrics, VLLM("vllm:num_requests_waiting"));
        same_kv = dkv == last_kv ? same_kv + 1 : 0;
        last_kv = dkv;
        if (kv0 > 0.3 && fabs(kv0 - dkv) < 1e-6 && l0 == dq + floor(16 * kv0) && w1 == 2 &&
            l1 == 2 && same_kv >= 2)
            break;
        cr_assert(th_now_ms() < dl,
                  "gateway: daemon 0 kv %g load %g, daemon 1 load %g; daemons: kv %g, queued "
                  "%g / waiting %g",
                  kv0, l0, l1, dkv, dq, w1);
    }
    cr_assert_gt(l0, l1, "the full pool does not outweigh two queued requests");

    /* what a client library reads is the same */
    ringlm_client *probe = connect_to(gwh_daemon.sock);
    ringlm_load ld;
    cr_assert_eq(ringlm_daemon_load(probe, &ld), 0, "%s", ringlm_errdetail());
    cr_assert_eq(ld.kv_total_blocks, 40);
    cr_assert_eq(ld.kv_used_blocks, (uint32_t)lround(kv0 * 40), "%u blocks used, metrics %g",
                 ld.kv_used_blocks, kv0);
    cr_assert_eq((double)(ld.running + ld.waiting), dq);
    cr_assert_str_eq(ringlm_served_model(probe), "stories260K");
    ringlm_close(probe);

    double before0 = picks(0), before1 = picks(1);
    for (int i = 0; i < 4; i++) {
        char p[120];
        snprintf(p, sizeof p, "A bird number %d flew over the big green hill", i);
        complete(p, 4);
    }
    cr_assert_eq(picks(1) - before1, 4, "unique prompts went to the daemon whose pool is full");
    cr_assert_eq(picks(0) - before0, 0);
    ringlm_close(stall);
    ringlm_close(queued);
}

/* Without --served-model-name the gateway serves the model by the daemons' name: /v1/models,
 * the model a request must name, and the answers' "model". */
Test(gateway_numa, the_gateway_takes_the_daemons_served_model_name)
{
    gwh_served_model = NULL;
    const char *dx[] = {"--served-model-name", "acme/stories-1", NULL};
    start_two_with(dx, dx);
    gwh_resp r = gwh_curl("/v1/models", "sk-alice-0001", NULL);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    cr_assert_str_eq(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")),
        "acme/stories-1", "%s", r.body);
    json_decref(j);
    gwh_resp_free(&r);
    r = gwh_curl("/v1/completions", "sk-alice-0001",
                 "{\"model\":\"stories\",\"prompt\":\"Once\",\"max_tokens\":2}");
    cr_assert_eq(r.status, 404, "%s", r.body);
    cr_assert(strstr(r.body, "model_not_found") && strstr(r.body, "acme/stories-1"), "%s", r.body);
    gwh_resp_free(&r);
    r = gwh_curl("/v1/completions", "sk-alice-0001",
                 "{\"model\":\"acme/stories-1\",\"prompt\":\"Once\",\"max_tokens\":2}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    j = json_loads(r.body, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "model")), "acme/stories-1");
    json_decref(j);
    gwh_resp_free(&r);
}

/* Two daemons that serve different models cannot be one gateway's: the one that says another
 * name than the first gets no session, and the gateway says why. */
Test(gateway_numa, a_daemon_serving_another_model_gets_no_session)
{
    gwh_need();
    gwh_need_curl();
    gwh_served_model = NULL;
    const char *xa[] = {"--served-model-name", "acme/one", NULL};
    const char *xb[] = {"--served-model-name", "acme/two", NULL};
    gwh_start_daemon(xa);
    start_b(xb);
    char *keys = gwh_keys();
    const char *extra[] = {"--socket", g_b.sock, "--sessions", "1", "--api-keys", keys, NULL};
    gwh_start_gateway(extra);
    free(keys);
    gwh_wait_healthy(20000);
    for (uint64_t dl = th_now_ms() + 20000;; th_pause_ms(20)) {
        char *log = th_read_file(gwh_gateway.log);
        bool said = strstr(log, "one gateway fronts one model") != NULL;
        free(log);
        if (said) break;
        cr_assert(th_now_ms() < dl, "the gateway never refused the other model's daemon");
    }
    char *m = gwh_gateway_metrics();
    cr_assert_eq(gwh_metric(m, "ringlm_gateway_sessions_connected"), 1, "%s", m);
    free(m);
    gwh_resp r = gwh_curl("/v1/models", "sk-alice-0001", NULL);
    cr_assert(strstr(r.body, "acme/one") || strstr(r.body, "acme/two"), "%s", r.body);
    gwh_resp_free(&r);
}

/* A sample of the gateway's /metrics (-1 when absent). */
static double gw_value(const char *m, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = strstr(m, series); p; p = strstr(p + 1, series))
        if ((p == m || p[-1] == '\n') && p[n] == ' ') return strtod(p + n + 1, NULL);
    return -1;
}

static int occurrences(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

#define GW(name, labels) name "{model_name=\"stories\",engine=\"0\"" labels "}"
#define DM(name, labels) name "{model_name=\"stories260K\",engine=\"0\"" labels "}"

/* A fleet router scrapes the gateway as one vLLM server: with --daemon-metrics for each
 * daemon, its vllm:* series are both daemons' as one server's — counters and histograms
 * summed, request gauges summed, KV use over all blocks, one cache configuration and one
 * LoRA line, labelled with the gateway's model name; when a daemon dies its counters stay
 * and its gauges go. */
Test(gateway_numa, the_gateways_metrics_are_both_daemons_as_one_server)
{
    const char *xa[] = {"--kv-blocks",
                        "40",
                        "--event-ring-slots",
                        "64",
                        "--backpressure-buffer-tokens",
                        "1",
                        "--backpressure-timeout-ms",
                        "120000",
                        NULL};
    const char *xb[] = {"--kv-blocks", "60", NULL};
    start_two_ext(xa, xb, true);
    for (int i = 0; i < 8; i++) {
        char p[160];
        snprintf(p, sizeof p, "Sam had %d blue kites and a cat named Tim number %d", i + 3, i * 5);
        complete(p, 4);
    }
    wait_served(picks(0), picks(1));
    cr_assert(picks(0) > 0 && picks(1) > 0, "the prompts did not spread");
    /* daemon 0: a stalled reader's request holds 17 of its 40 blocks; daemon 1: one request
     * of held waits in its queue */
    ringlm_client *stall = connect_to(gwh_daemon.sock);
    int32_t prompt[200];
    for (int i = 0; i < 200; i++) prompt[i] = 1 + (i * 37) % 480;
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = prompt;
    r.n_prompt = 200;
    r.max_new_tokens = 300;
    r.class_name = "chat";
    cr_assert_eq(ringlm_submit(stall, &r, NULL), 0, "%s", ringlm_errdetail());
    empty_held_bucket(g_b.sock);
    ringlm_client *queued = connect_to(g_b.sock);
    submit_held(queued, 1);

    static const char *const summed[][2] = {
        {GW("vllm:request_success_total", ",finished_reason=\"length\""),
         DM("vllm:request_success_total", ",finished_reason=\"length\"")},
        {GW("vllm:prompt_tokens_total", ""), DM("vllm:prompt_tokens_total", "")},
        {GW("vllm:generation_tokens_total", ""), DM("vllm:generation_tokens_total", "")},
        {GW("vllm:e2e_request_latency_seconds_count", ""),
         DM("vllm:e2e_request_latency_seconds_count", "")},
        {GW("vllm:e2e_request_latency_seconds_bucket", ",le=\"+Inf\""),
         DM("vllm:e2e_request_latency_seconds_bucket", ",le=\"+Inf\"")},
        {GW("vllm:request_prompt_tokens_bucket", ",le=\"50.0\""),
         DM("vllm:request_prompt_tokens_bucket", ",le=\"50.0\"")},
        {GW("vllm:num_requests_waiting", ""), DM("vllm:num_requests_waiting", "")},
        {GW("vllm:num_requests_running", ""), DM("vllm:num_requests_running", "")},
    };
    int ns = (int)(sizeof summed / sizeof summed[0]);
    char *m = NULL;
    char why[1024];
    for (uint64_t dl = th_now_ms() + 20000;; th_pause_ms(50)) {
        free(m);
        m = gwh_gateway_metrics();
        bool same = gw_value(m, "ringlm_gateway_daemon_metrics_up") == 2;
        why[0] = 0;
        for (int i = 0; i < ns; i++) {
            double a = daemon_metric(gwh_metrics_port, summed[i][1]),
                   b = daemon_metric(g_b_metrics, summed[i][1]), g = gw_value(m, summed[i][0]);
            if (g != a + b) {
                same = false;
                snprintf(why, sizeof why, "%s: gateway %g, daemons %g + %g", summed[i][0], g, a, b);
            }
        }
        double kv = gw_value(m, GW("vllm:kv_cache_usage_perc", ""));
        if (fabs(kv - 0.17) > 1e-9) {
            same = false;
            snprintf(why, sizeof why, "kv_cache_usage_perc %g, not 17 of 100 blocks", kv);
        }
        if (same) break;
        cr_assert(th_now_ms() < dl, "%s\n%s", why, m);
    }
    cr_assert_eq(gw_value(m, GW("vllm:num_requests_waiting", "")), 1);
    cr_assert_eq(gw_value(m, GW("vllm:num_requests_running", "")), 1);
    cr_assert_eq(occurrences(m, "\nvllm:lora_requests_info{"), 1, "%s", m);
    cr_assert_eq(occurrences(m, "\nvllm:cache_config_info{"), 1, "%s", m);
    cr_assert(strstr(m, "num_gpu_blocks=\"100\""), "%s", m);
    cr_assert_eq(occurrences(m, "# TYPE vllm:request_success_total counter\n"), 1);
    cr_assert_null(strstr(m, "model_name=\"stories260K\""), "a daemon's own name: %s", m);
    double length_before = gw_value(m, summed[0][0]);

    /* daemon 1 dies: its counters stay, its queue is gone from the gauges */
    kill(g_b.pid, SIGKILL);
    th_daemon_stop(&g_b, SIGKILL, 5000);
    for (uint64_t dl = th_now_ms() + 10000;; th_pause_ms(50)) {
        free(m);
        m = gwh_gateway_metrics();
        if (gw_value(m, "ringlm_gateway_daemon_metrics_up") == 1 &&
            gw_value(m, "ringlm_gateway_daemon_metrics_target_up{target=\"1\"}") == 0 &&
            gw_value(m, GW("vllm:num_requests_waiting", "")) == 0)
            break;
        cr_assert(th_now_ms() < dl, "the dead daemon's gauges are still summed:\n%s", m);
    }
    cr_assert_eq(gw_value(m, summed[0][0]), length_before, "a counter went back: %s", m);
    cr_assert(fabs(gw_value(m, GW("vllm:kv_cache_usage_perc", "")) - 0.425) < 1e-9, "%s", m);
    free(m);
    ringlm_close(stall);
    ringlm_close(queued);
}

/* A stream its daemon was generating when the daemon died: the client has had the 200 and
 * some text, and the stream ends with an error event ("ringlmd went away") and [DONE], not a
 * cut connection nor a "stop"; then the other daemon takes new work. The daemons run a
 * synthetic model of stories110M's shape (about 50 ms a token here: the stream is still
 * generating when the test kills its daemon). */
Test(gateway_numa, a_stream_whose_daemon_dies_mid_answer_ends_with_an_error_event)
{
    const char *xm[] = {"--model", "synthetic:stories110M:7", NULL};
    start_two_with(xm, xm);
    int fd = gwh_connect();
    gwh_send_post(fd, "/v1/completions", "sk-alice-0001",
                  "{\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"max_tokens\":400,"
                  "\"ignore_eos\":true,\"stream\":true}");
    bool eof = false;
    /* the second chunk: tokens are flowing */
    char *head = th_read_until(fd, "\"text\":\"", 60000, &eof);
    char *more = th_read_until(fd, "\"text\":\"", 60000, &eof);
    cr_assert(strstr(head, " 200 ") && strstr(more, "\"text\":\"") && !eof,
              "the stream did not start: %s%s", head, more);
    int victim = -1;
    char *m = gwh_gateway_metrics();
    if (gwh_metric(m, "ringlm_gateway_session_requests_in_flight{session=\"0\"}") == 1) victim = 0;
    if (gwh_metric(m, "ringlm_gateway_session_requests_in_flight{session=\"1\"}") == 1) victim = 1;
    free(m);
    cr_assert(victim >= 0, "no daemon is generating the stream");
    th_daemon *dead = victim == 0 ? &gwh_daemon : &g_b;
    kill(dead->pid, SIGKILL);
    char *rest = th_read_until(fd, NULL, 15000, &eof);
    close(fd);
    cr_assert(eof, "the stream did not end after its daemon died: %s", rest);
    const char *err = strstr(rest, "data: {\"error\"");
    cr_assert(err && strstr(err, "daemon_unavailable") && strstr(err, "went away"),
              "the stream of the dead daemon did not end with an error event: %s", rest);
    cr_assert(strstr(err, "data: [DONE]"), "no [DONE] after the error event: %s", rest);
    cr_assert_null(strstr(rest, "\"finish_reason\":\"length\""), "%s", rest);
    free(head);
    free(more);
    free(rest);
    th_daemon_stop(dead, SIGKILL, 5000);

    /* new work goes to the survivor */
    double before = picks(1 - victim);
    char body[160];
    snprintf(body, sizeof body,
             "{\"model\":\"stories\",\"prompt\":\"The dog ran\",\"max_tokens\":2}");
    gwh_resp r = gwh_curl("/v1/completions", "sk-alice-0001", body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    gwh_resp_free(&r);
    cr_assert_eq(picks(1 - victim) - before, 1);
}
