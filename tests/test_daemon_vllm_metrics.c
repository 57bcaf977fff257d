/* SPDX-License-Identifier: MIT */
/*
 * vLLM's metric set, as fleet routers, dashboards and autoscaling rules built for vLLM read
 * it: a real ringlmd serves a small replay, and its /metrics must carry every vllm:* family
 * vLLM's PrometheusStatLogger defines, with vLLM's type, labels and bucket bounds (the list
 * below, taken from vLLM 0.11's vllm/v1/metrics/loggers.py), the served model name in the
 * label model_name, and values that agree with the daemon's own request log.
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers.h"

TestSuite(daemon_vllm_metrics, .timeout = 180);

/* ---- vLLM 0.11's families (vllm/v1/metrics/loggers.py, PrometheusStatLogger) ---------- */

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double request_latency_bounds[] = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                                5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const double iteration_bounds[] = {1,   8,    16,   32,   64,   128,  256,
                                          512, 1024, 2048, 4096, 8192, 16384};
static const double n_bounds[] = {1, 2, 5, 10, 20};
/* build_1_2_5_buckets(max_model_len): stories260K's context is 512 tokens */
static const double tokens_1_2_5_512[] = {1, 2, 5, 10, 20, 50, 100, 200, 500};

typedef struct vfam {
    const char *name; /* as vLLM names it; a counter's samples and TYPE carry _total */
    const char *type;
    const char *extra; /* a label after model_name and engine (NULL: none) */
    const double *bounds;
    int n_bounds;
} vfam;

#define B(a) a, (int)(sizeof(a) / sizeof(a)[0])
static const vfam families[] = {
    {"vllm:num_requests_running", "gauge", NULL, NULL, 0},
    {"vllm:num_requests_waiting", "gauge", NULL, NULL, 0},
    {"vllm:kv_cache_usage_perc", "gauge", NULL, NULL, 0},
    {"vllm:prefix_cache_queries", "counter", NULL, NULL, 0},
    {"vllm:prefix_cache_hits", "counter", NULL, NULL, 0},
    {"vllm:num_preemptions", "counter", NULL, NULL, 0},
    {"vllm:prompt_tokens", "counter", NULL, NULL, 0},
    {"vllm:generation_tokens", "counter", NULL, NULL, 0},
    {"vllm:request_success", "counter", "finished_reason", NULL, 0},
    {"vllm:request_prompt_tokens", "histogram", NULL, B(tokens_1_2_5_512)},
    {"vllm:request_generation_tokens", "histogram", NULL, B(tokens_1_2_5_512)},
    {"vllm:iteration_tokens_total", "histogram", NULL, B(iteration_bounds)},
    {"vllm:request_max_num_generation_tokens", "histogram", NULL, B(tokens_1_2_5_512)},
    {"vllm:request_params_n", "histogram", NULL, B(n_bounds)},
    {"vllm:request_params_max_tokens", "histogram", NULL, B(tokens_1_2_5_512)},
    {"vllm:time_to_first_token_seconds", "histogram", NULL, B(ttft_bounds)},
    {"vllm:time_per_output_token_seconds", "histogram", NULL, B(itl_bounds)},
    {"vllm:inter_token_latency_seconds", "histogram", NULL, B(itl_bounds)},
    {"vllm:e2e_request_latency_seconds", "histogram", NULL, B(request_latency_bounds)},
    {"vllm:request_queue_time_seconds", "histogram", NULL, B(request_latency_bounds)},
    {"vllm:request_inference_time_seconds", "histogram", NULL, B(request_latency_bounds)},
    {"vllm:request_prefill_time_seconds", "histogram", NULL, B(request_latency_bounds)},
    {"vllm:request_decode_time_seconds", "histogram", NULL, B(request_latency_bounds)},
};
#undef B
#define N_FAMILIES (int)(sizeof families / sizeof families[0])

/* ---- a sample line: name{k="v",...} value --------------------------------------------- */

#define MAX_LABELS 6
typedef struct sample {
    char name[128];
    int n;
    char key[MAX_LABELS][32], val[MAX_LABELS][160];
    double value;
} sample;

static bool parse_line(const char *line, sample *s)
{
    memset(s, 0, sizeof *s);
    size_t n = strcspn(line, "{ \n");
    if (n == 0 || n >= sizeof s->name) return false;
    memcpy(s->name, line, n);
    const char *p = line + n;
    if (*p == '{') {
        p++;
        while (*p && *p != '}') {
            if (s->n >= MAX_LABELS) return false;
            size_t k = strcspn(p, "=");
            if (k >= sizeof s->key[0] || p[k] != '=' || p[k + 1] != '"') return false;
            memcpy(s->key[s->n], p, k);
            p += k + 2;
            size_t v = 0;
            while (*p && *p != '"') {
                if (*p == '\\' && p[1]) p++;
                if (v + 1 < sizeof s->val[0]) s->val[s->n][v++] = *p;
                p++;
            }
            if (*p != '"') return false;
            p++;
            s->n++;
            if (*p == ',') p++;
        }
        if (*p != '}') return false;
        p++;
    }
    if (*p != ' ') return false;
    char *end;
    s->value = strtod(p + 1, &end);
    return end != p + 1;
}

static const char *label(const sample *s, const char *key)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->key[i], key)) return s->val[i];
    return NULL;
}

/* Every sample of body whose name is exactly name (malloc()ed array, *n set). */
static sample *samples_of(const char *body, const char *name, int *n)
{
    int cap = 64;
    sample *out = malloc(cap * sizeof *out);
    *n = 0;
    for (const char *l = body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (*l == '#' || strncmp(l, name, strlen(name))) continue;
        sample s;
        if (!parse_line(l, &s) || strcmp(s.name, name)) continue;
        if (*n == cap) out = realloc(out, (cap *= 2) * sizeof *out);
        out[(*n)++] = s;
    }
    return out;
}

static double value_of(const char *body, const char *name, const char *key, const char *val)
{
    int n;
    sample *s = samples_of(body, name, &n);
    double v = NAN;
    for (int i = 0; i < n; i++)
        if (!key || (label(&s[i], key) && !strcmp(label(&s[i], key), val))) v = s[i].value;
    free(s);
    return v;
}

/* The labels of a vLLM sample: model_name, engine, then extra (if any), then le (if
 * bucket), in that order, and nothing else. */
static void check_labels(const sample *s, const char *model, const char *extra, bool bucket,
                         const char *body)
{
    int want = 2 + (extra != NULL) + bucket;
    cr_assert_eq(s->n, want, "%s has %d labels, vLLM's has %d", s->name, s->n, want);
    cr_assert_str_eq(s->key[0], "model_name", "%s: first label %s", s->name, s->key[0]);
    cr_assert_str_eq(s->val[0], model, "%s: model_name=\"%s\", served as \"%s\"", s->name,
                     s->val[0], model);
    cr_assert_str_eq(s->key[1], "engine", "%s: second label %s", s->name, s->key[1]);
    cr_assert_str_eq(s->val[1], "0", "%s: engine=\"%s\"", s->name, s->val[1]);
    if (extra) cr_assert_str_eq(s->key[2], extra, "%s: third label %s", s->name, s->key[2]);
    if (bucket)
        cr_assert_str_eq(s->key[want - 1], "le", "%s: last label %s", s->name, s->key[want - 1]);
    (void)body;
}

static bool has_line(const char *body, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = strstr(body, line); p; p = strstr(p + 1, line))
        if ((p == body || p[-1] == '\n') && (p[n] == '\n' || p[n] == 0)) return true;
    return false;
}

/* Every vLLM family, with vLLM's type, labels and bounds. */
static void check_families(const char *body, const char *model)
{
    for (int f = 0; f < N_FAMILIES; f++) {
        const vfam *v = &families[f];
        bool counter = !strcmp(v->type, "counter"), hist = !strcmp(v->type, "histogram");
        char full[160], line[256];
        snprintf(full, sizeof full, "%s%s", v->name, counter ? "_total" : "");
        snprintf(line, sizeof line, "# TYPE %s %s", full, v->type);
        cr_assert(has_line(body, line), "no \"%s\" in /metrics", line);
        if (!hist) {
            int n;
            sample *s = samples_of(body, full, &n);
            cr_assert(n >= 1, "%s: no sample", full);
            for (int i = 0; i < n; i++) check_labels(&s[i], model, v->extra, false, body);
            free(s);
            continue;
        }
        char bname[180];
        snprintf(bname, sizeof bname, "%s_bucket", v->name);
        int n;
        sample *s = samples_of(body, bname, &n);
        cr_assert_eq(n, v->n_bounds + 1, "%s: %d buckets, vLLM has %d and +Inf", v->name, n,
                     v->n_bounds);
        double prev = -1;
        for (int i = 0; i < n; i++) {
            check_labels(&s[i], model, NULL, true, body);
            const char *le = label(&s[i], "le");
            if (i < v->n_bounds)
                cr_assert(fabs(strtod(le, NULL) - v->bounds[i]) < 1e-12 * v->bounds[i] + 1e-15,
                          "%s: bucket %d le=\"%s\", vLLM's bound is %g", v->name, i, le,
                          v->bounds[i]);
            else
                cr_assert_str_eq(le, "+Inf", "%s: last bucket le=\"%s\"", v->name, le);
            cr_assert(s[i].value >= prev, "%s: buckets not cumulative at le=%s", v->name, le);
            prev = s[i].value;
        }
        char sname[180];
        snprintf(sname, sizeof sname, "%s_count", v->name);
        double count = value_of(body, sname, NULL, NULL);
        cr_assert_eq(count, prev, "%s: _count %g, +Inf bucket %g", v->name, count, prev);
        snprintf(sname, sizeof sname, "%s_sum", v->name);
        cr_assert(!isnan(value_of(body, sname, NULL, NULL)), "%s: no _sum", v->name);
        free(s);
    }
    /* vLLM's LoRA gauge in its empty form: no adapters */
    cr_assert(has_line(body, "# TYPE vllm:lora_requests_info gauge"), "no vllm:lora_requests_info");
    int n;
    sample *s = samples_of(body, "vllm:lora_requests_info", &n);
    cr_assert_eq(n, 1, "vllm:lora_requests_info: %d samples", n);
    cr_assert(s[0].n == 3 && !strcmp(s[0].key[0], "max_lora") && !strcmp(s[0].val[0], "0") &&
                  !strcmp(s[0].key[1], "waiting_lora_adapters") && !s[0].val[1][0] &&
                  !strcmp(s[0].key[2], "running_lora_adapters") && !s[0].val[2][0],
              "vllm:lora_requests_info is not vLLM's empty form");
    cr_assert(s[0].value > 1.5e9, "vllm:lora_requests_info %g is not a wall time", s[0].value);
    free(s);
    /* vLLM's cache configuration: the Inference Extension's prefix scorers read block_size and
     * num_gpu_blocks from its labels (its model-server protocol) */
    cr_assert(has_line(body, "# TYPE vllm:cache_config_info gauge"), "no vllm:cache_config_info");
    s = samples_of(body, "vllm:cache_config_info", &n);
    cr_assert_eq(n, 1, "vllm:cache_config_info: %d samples", n);
    static const char *const want[][2] = {
        {"block_size", "16"}, {"num_gpu_blocks", "1024"}, {"enable_prefix_caching", "True"}};
    for (int i = 0; i < 3; i++) {
        const char *v = label(&s[0], want[i][0]);
        cr_assert(v && !strcmp(v, want[i][1]), "vllm:cache_config_info %s=\"%s\", not \"%s\"",
                  want[i][0], v ? v : "(none)", want[i][1]);
    }
    cr_assert_eq(s[0].value, 1);
    free(s);
}

/* ---- the replay ------------------------------------------------------------------------ */

static th_daemon g_d;
static void stop_daemon(void)
{
    th_daemon_stop(&g_d, SIGTERM, 15000);
    th_daemon_cleanup(&g_d);
}

static int metrics_port(void)
{
    int port = 0;
    for (uint64_t dl = th_now_ms() + 5000; !port; th_pause_ms(5)) {
        const char *out = th_daemon_output(&g_d), *at = strstr(out, "metrics on port ");
        if (at) port = atoi(at + strlen("metrics on port "));
        cr_assert(port > 0 || th_now_ms() < dl, "ringlmd named no metrics port:\n%s", out);
    }
    return port;
}

static char *scrape(int port)
{
    int status = 0;
    char *body = th_http_get(port, "/metrics", &status, NULL, 0);
    cr_assert(body && status == 200, "GET /metrics: status %d", status);
    return body;
}

static const char *model_path(void)
{
    static char model[512];
    snprintf(model, sizeof model, "%s/models/stories260K.bin", th_shared_dir());
    if (access(model, R_OK)) cr_skip_test("stories260K not under %s", th_shared_dir());
    return model;
}

#define N_REQ 12

Test(daemon_vllm_metrics, every_vllm_series_with_vllm_shape_agrees_with_the_request_log,
     .fini = stop_daemon)
{
    const char *model = model_path();
    th_daemon_init(&g_d);
    char reqlog[160], trace[160];
    snprintf(reqlog, sizeof reqlog, "%s/req.jsonl", g_d.dir);
    snprintf(trace, sizeof trace, "%s/trace.csv", g_d.dir);
    /* a small Azure-format slice: prompts of 20..130 tokens, answers of 4..37, 30 ms apart */
    FILE *f = fopen(trace, "w");
    cr_assert(f);
    fprintf(f, "TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for (int i = 0; i < N_REQ; i++)
        fprintf(f, "2023-11-16 18:17:%02d.%03d0000,%d,%d\n", 3 + i * 30 / 1000, (i * 30) % 1000,
                20 + (i * 37) % 111, 4 + (i * 11) % 34);
    fclose(f);
    const char *args[] = {"--model",
                          model,
                          "--metrics",
                          "127.0.0.1:0",
                          "--request-log",
                          reqlog,
                          "--served-model-name",
                          "acme/stories-1",
                          NULL};
    th_daemon_start(&g_d, args, 20000);
    int port = metrics_port();
    /* before any request: every family is there already, at zero */
    char *body = scrape(port);
    check_families(body, "acme/stories-1");
    free(body);

    char *ringlm = th_path(th_bin_dir(), "ringlm");
    char *argv[] = {ringlm, "--socket", g_d.sock,  "replay", trace, "--clients",
                    "3",    "--json",   "--vocab", "500",    NULL};
    char *out, *err;
    int rc = th_run(argv, &out, &err, 120);
    cr_assert_eq(rc, 0, "replay exit %d: %s\n%s", rc, err, out);
    free(out);
    free(err);
    free(ringlm);

    /* the request log has every request once it ended; the metrics publish within 100 ms */
    json_t *lines[N_REQ];
    int n_lines = 0;
    for (uint64_t dl = th_now_ms() + 10000;; th_pause_ms(20)) {
        body = scrape(port);
        double done = 0;
        const char *reasons[] = {"stop", "length", "abort"};
        for (int r = 0; r < 3; r++)
            done += value_of(body, "vllm:request_success_total", "finished_reason", reasons[r]);
        char *log = th_read_file(reqlog);
        int nl = 0;
        for (char *p = log; *p; p++) nl += *p == '\n';
        if (done == N_REQ && nl == N_REQ) {
            char *save = NULL;
            for (char *l = strtok_r(log, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
                json_error_t e;
                lines[n_lines] = json_loads(l, 0, &e);
                cr_assert(lines[n_lines], "request log line is not JSON: %s", l);
                n_lines++;
            }
            free(log);
            break;
        }
        free(log);
        cr_assert(th_now_ms() < dl,
                  "after the replay: %g requests in vllm:request_success_total, "
                  "%d request log lines, %d sent",
                  done, nl, N_REQ);
        free(body);
    }
    check_families(body, "acme/stories-1");

    /* the values, from the request log */
    double prompt = 0, prompt_started = 0, gen = 0, ttft_n = 0, ttft_sum = 0, e2e_sum = 0;
    double by_reason[3] = {0};
    for (int i = 0; i < n_lines; i++) {
        json_t *j = lines[i];
        const char *fr = json_string_value(json_object_get(j, "finish_reason"));
        cr_assert(fr, "no finish_reason");
        by_reason[!strcmp(fr, "stop") ? 0 : !strcmp(fr, "length") ? 1 : 2]++;
        double p = (double)json_integer_value(json_object_get(j, "prompt_tokens"));
        double arrival = (double)json_integer_value(json_object_get(j, "arrival_us"));
        prompt += p;
        gen += (double)json_integer_value(json_object_get(j, "output_tokens"));
        json_t *ft = json_object_get(j, "first_token_us");
        if (json_is_integer(ft)) {
            prompt_started += p;
            ttft_n++;
            ttft_sum += ((double)json_integer_value(ft) - arrival) / 1e6;
        }
        e2e_sum += ((double)json_integer_value(json_object_get(j, "finish_us")) - arrival) / 1e6;
        json_decref(j);
    }
    cr_expect_eq(value_of(body, "vllm:request_success_total", "finished_reason", "stop"),
                 by_reason[0], "stop");
    cr_expect_eq(value_of(body, "vllm:request_success_total", "finished_reason", "length"),
                 by_reason[1], "length");
    cr_expect_eq(value_of(body, "vllm:request_success_total", "finished_reason", "abort"),
                 by_reason[2], "abort");
    cr_expect_eq(value_of(body, "vllm:request_prompt_tokens_sum", NULL, NULL), prompt);
    cr_expect_eq(value_of(body, "vllm:request_prompt_tokens_count", NULL, NULL), N_REQ);
    cr_expect_eq(value_of(body, "vllm:request_generation_tokens_sum", NULL, NULL), gen);
    cr_expect_eq(value_of(body, "vllm:prompt_tokens_total", NULL, NULL), prompt_started,
                 "vllm:prompt_tokens_total: the prompts of the requests that got a first token");
    cr_expect_eq(value_of(body, "vllm:generation_tokens_total", NULL, NULL), gen);
    cr_expect_eq(value_of(body, "vllm:time_to_first_token_seconds_count", NULL, NULL), ttft_n);
    cr_expect(fabs(value_of(body, "vllm:time_to_first_token_seconds_sum", NULL, NULL) - ttft_sum) <
                  1e-5,
              "TTFT sum %g, request log %g",
              value_of(body, "vllm:time_to_first_token_seconds_sum", NULL, NULL), ttft_sum);
    cr_expect_eq(value_of(body, "vllm:e2e_request_latency_seconds_count", NULL, NULL), N_REQ);
    cr_expect(fabs(value_of(body, "vllm:e2e_request_latency_seconds_sum", NULL, NULL) - e2e_sum) <
                  1e-5,
              "e2e sum %g, request log %g",
              value_of(body, "vllm:e2e_request_latency_seconds_sum", NULL, NULL), e2e_sum);
    /* one inter-token interval per token after each request's first */
    cr_expect_eq(value_of(body, "vllm:inter_token_latency_seconds_count", NULL, NULL),
                 gen - ttft_n);
    cr_expect_eq(value_of(body, "vllm:time_per_output_token_seconds_count", NULL, NULL),
                 gen - ttft_n);
    cr_expect_eq(value_of(body, "vllm:request_queue_time_seconds_count", NULL, NULL), ttft_n);
    cr_expect_eq(value_of(body, "vllm:request_decode_time_seconds_count", NULL, NULL), ttft_n);
    cr_expect(value_of(body, "vllm:iteration_tokens_total_sum", NULL, NULL) >=
                  prompt + gen - ttft_n,
              "the engine ran fewer tokens than the prompts and answers hold");
    cr_expect_eq(value_of(body, "vllm:num_requests_running", NULL, NULL), 0);
    cr_expect_eq(value_of(body, "vllm:num_requests_waiting", NULL, NULL), 0);
    free(body);
}

/* Without --served-model-name, model_name is the model file's base name (a llama2.c file has
 * no general.name). */
Test(daemon_vllm_metrics, model_name_defaults_to_the_file_base_name, .fini = stop_daemon)
{
    const char *model = model_path();
    th_daemon_init(&g_d);
    const char *args[] = {"--model", model, "--metrics", "127.0.0.1:0", NULL};
    th_daemon_start(&g_d, args, 20000);
    char *body = scrape(metrics_port());
    check_families(body, "stories260K");
    free(body);
}
