/* SPDX-License-Identifier: MIT */
/*
 * Metrics exposition: served over HTTP on loopback (scraped with a tiny socket client, no
 * curl), parsed line by line against the Prometheus text format 0.0.4, histograms
 * consistent, label escaping right, the vLLM gauges present.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/metrics.h"
#include "tests/helpers.h"

/* GET path from 127.0.0.1:port (tests/helpers.c); returns the malloc()ed body, *status set,
 * and checks the exposition format's content type on a 200. */
static char *http_get(int port, const char *path, int *status)
{
    char ctype[128];
    char *body = th_http_get(port, path, status, ctype, sizeof ctype);
    cr_assert_not_null(body, "GET %s from :%d: no HTTP answer", path, port);
    cr_assert(strstr(ctype, "text/plain; version=0.0.4") || *status != 200,
              "content type of %s is \"%s\"", path, ctype);
    return body;
}

/* ---- a small exposition-format checker -------------------------------------------- */

typedef struct fam {
    char name[128];
    char type[16];
    int help;
} fam;

static bool name_ok(const char *s, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!(isalpha((unsigned char)c) || c == '_' || c == ':' ||
              (i > 0 && isdigit((unsigned char)c))))
            return false;
    }
    return true;
}

/* Parses `name{l="v",...} value` (labels unescaped into lab, "k=v;" joined); 0 or -1. */
static int parse_sample(const char *line, char *name, size_t ncap, char *lab, size_t lcap,
                        double *val)
{
    const char *p = line;
    size_t n = strcspn(p, "{ ");
    if (!name_ok(p, n) || n >= ncap) return -1;
    memcpy(name, p, n);
    name[n] = 0;
    p += n;
    size_t lp = 0;
    lab[0] = 0;
    if (*p == '{') {
        p++;
        while (*p != '}') {
            size_t k = strcspn(p, "=");
            if (!name_ok(p, k) || p[k] != '=' || p[k + 1] != '"') return -1;
            for (size_t i = 0; i < k && lp + 2 < lcap; i++) lab[lp++] = p[i];
            lab[lp++] = '=';
            p += k + 2;
            while (*p != '"') {
                if (!*p || *p == '\n') return -1;
                char c = *p++;
                if (c == '\\') {
                    c = *p++;
                    if (c == 'n')
                        c = '\n';
                    else if (c != '\\' && c != '"')
                        return -1;
                }
                if (lp + 2 < lcap) lab[lp++] = c;
            }
            p++;
            if (lp + 2 < lcap) lab[lp++] = ';';
            lab[lp] = 0;
            if (*p == ',')
                p++;
            else if (*p != '}')
                return -1;
        }
        p++;
    }
    if (*p != ' ') return -1;
    p++;
    char *end;
    if (strcmp(p, "+Inf") == 0)
        *val = 1e308;
    else {
        *val = strtod(p, &end);
        if (end == p || *end) return -1;
    }
    return 0;
}

static void check_exposition(char *text)
{
    fam fams[128];
    int nf = 0;
    char *save = NULL;
    char name[128], lab[1024];
    double v;
    /* per histogram series: last cumulative bucket, +Inf value */
    double last_bucket = -1;
    char last_series[1024] = "";
    int samples = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') {
            char kind[8], fname[128], rest[64];
            cr_assert(sscanf(line, "# %7s %127s %63s", kind, fname, rest) >= 2, "bad comment: %s",
                      line);
            int f = -1;
            for (int i = 0; i < nf; i++)
                if (strcmp(fams[i].name, fname) == 0) f = i;
            if (f < 0) {
                cr_assert(nf < 128);
                f = nf++;
                memset(&fams[f], 0, sizeof fams[f]);
                strcpy(fams[f].name, fname);
            }
            if (strcmp(kind, "TYPE") == 0) {
                cr_assert(!fams[f].type[0], "second TYPE for %s", fname);
                cr_assert(strcmp(rest, "counter") == 0 || strcmp(rest, "gauge") == 0 ||
                              strcmp(rest, "histogram") == 0,
                          "bad type: %s", line);
                strcpy(fams[f].type, rest);
            } else {
                cr_assert_str_eq(kind, "HELP", "bad comment: %s", line);
                fams[f].help = 1;
            }
            continue;
        }
        cr_assert(parse_sample(line, name, sizeof name, lab, sizeof lab, &v) == 0,
                  "bad sample line: '%s'", line);
        samples++;
        /* which family? a histogram's samples carry _bucket/_sum/_count */
        int f = -1;
        for (int i = 0; i < nf; i++) {
            size_t l = strlen(fams[i].name);
            if (strcmp(fams[i].name, name) == 0)
                f = i;
            else if (strncmp(fams[i].name, name, l) == 0 &&
                     strcmp(fams[i].type, "histogram") == 0 &&
                     (!strcmp(name + l, "_bucket") || !strcmp(name + l, "_sum") ||
                      !strcmp(name + l, "_count")))
                f = i;
        }
        cr_assert(f >= 0 && fams[f].type[0] && fams[f].help, "sample without HELP/TYPE: %s", line);
        if (strcmp(fams[f].type, "counter") == 0) cr_assert(v >= 0, "negative counter: %s", line);
        size_t nl = strlen(name);
        if (nl > 7 && strcmp(name + nl - 7, "_bucket") == 0) {
            char *le = strstr(lab, "le=");
            cr_assert(le, "bucket without le: %s", line);
            char series[1024];
            snprintf(series, sizeof series, "%s|%.*s", name, (int)(le - lab), lab);
            if (strcmp(series, last_series) != 0) {
                strcpy(last_series, series);
                last_bucket = -1;
            }
            cr_assert(v >= last_bucket, "buckets not cumulative: %s", line);
            last_bucket = v;
        } else if (nl > 6 && strcmp(name + nl - 6, "_count") == 0 && last_bucket >= 0) {
            cr_assert(v == last_bucket, "_count %g != +Inf bucket %g: %s", v, last_bucket, line);
        }
    }
    cr_assert(samples > 20, "only %d samples", samples);
}

static const char *find_line(const char *text, const char *prefix)
{
    const char *p = text;
    size_t n = strlen(prefix);
    while (p && *p) {
        if (strncmp(p, prefix, n) == 0) return p;
        p = strchr(p, '\n');
        if (p) p++;
    }
    return NULL;
}

Test(daemon_metrics, http_scrape_parses_and_has_vllm_gauges)
{
    metrics_config cfg = {.listen = "127.0.0.1:0",
                          .policy_hash = "abc123",
                          .model_hash = "m0",
                          .model_name = "stories260K",
                          .backend = "cpu"};
    metrics *m;
    int rc = metrics_create(&cfg, &m);
    cr_assert_eq(rc, 0, "metrics_create: %d %s", rc, metrics_errmsg());
    int port = metrics_port(m);
    cr_assert(port > 0 && port < 65536, "port %d", port);

    int a = metrics_series(m, metrics_tenant_label(m, "alice"), metrics_class_label(m, "chat"));
    int b = metrics_series(m, metrics_tenant_label(m, "we\"ird\\ten\nant"),
                           metrics_class_label(m, "batch"));
    cr_assert_eq(
        metrics_series(m, metrics_tenant_label(m, "alice"), metrics_class_label(m, "chat")), a);
    cr_assert_neq(a, b);
    for (int i = 0; i < 100; i++) {
        metrics_observe(m, a, METRICS_H_TTFT, (uint64_t)i * 1000);
        metrics_observe(m, b, METRICS_H_E2E, (uint64_t)i * 100000);
    }
    metrics_add_tokens(m, a, 500, 1200);
    metrics_count_reject(m, b, SCHED_REJECT_QUEUE_FULL);
    metrics_count_preempt(m, a, METRICS_MODE_SWAP, SCHED_DEFER_BLOCKS);
    metrics_count_preempt(m, a, METRICS_MODE_RECOMPUTE, SCHED_DEFER_BLOCKS);
    metrics_count_cancel(m, a);
    metrics_count_timeout(m, b);
    metrics_count_finish(m, a, SCHED_END_LENGTH);
    metrics_set_queue(m, 7, 3);
    metrics_set_kv(m, SCHED_POOL_DEVICE, 25, 100);
    metrics_set_kv(m, SCHED_POOL_HOST, 10, 400);
    metrics_observe_iteration(m, 1234, 64);
    metrics_observe_transfer(m, SCHED_POOL_HOST, SCHED_XFER_OUT, 1 << 20, 100);
    metrics_set_transfer_bw(m, SCHED_POOL_HOST, SCHED_XFER_OUT, 1.048576e10);
    metrics_publish(m, 1, 1);

    int status;
    char *body = http_get(port, "/metrics", &status);
    cr_assert_eq(status, 200, "status %d body %s", status, body);
    cr_assert(
        find_line(body, "vllm:num_requests_waiting{model_name=\"stories260K\",engine=\"0\"} 7"),
        "%s", body);
    cr_assert(
        find_line(body, "vllm:num_requests_running{model_name=\"stories260K\",engine=\"0\"} 3"),
        "%s", body);
    cr_assert(
        find_line(body, "vllm:kv_cache_usage_perc{model_name=\"stories260K\",engine=\"0\"} 0.25"),
        "%s", body);
    cr_assert(find_line(body, "ringlm_info{version=\""), "%s", body);
    cr_assert(strstr(body, "policy_hash=\"abc123\""));
    cr_assert(find_line(body, "ringlm_kv_blocks_free{tier=\"host\"} 390"), "%s", body);
    cr_assert(find_line(body, "ringlm_rejects_total{tenant=\"we\\\"ird\\\\ten\\nant\",class="
                              "\"batch\",reason=\"queue_full\"} 1"),
              "escaped reject line missing:\n%s", body);
    cr_assert(find_line(body, "ringlm_preemptions_total{tenant=\"alice\",class=\"chat\",mode="
                              "\"swap\",reason=\"blocks\"} 1"));
    cr_assert(find_line(
        body, "ringlm_time_to_first_token_seconds_count{tenant=\"alice\",class=\"chat\"} 100"));
    cr_assert(find_line(body, "ringlm_time_to_first_token_seconds_bucket{tenant=\"alice\",class="
                              "\"chat\",le=\"+Inf\"} 100"));
    /* 0..99 ms: 11 values ≤ 10 ms (0,1,…,10) */
    cr_assert(find_line(body, "ringlm_time_to_first_token_seconds_bucket{tenant=\"alice\",class="
                              "\"chat\",le=\"0.01\"} 11"),
              "%s", body);
    cr_assert(
        find_line(
            body,
            "ringlm_transfer_bandwidth_bytes_per_second{tier=\"host\",dir=\"out\"} 1.04858e+10"),
        "%s", body);
    check_exposition(body);
    free(body);

    /* Not /metrics: 404; the server is still fine afterwards. */
    body = http_get(port, "/nope", &status);
    cr_assert_eq(status, 404);
    free(body);

    /* A newer publish is what the next scrape sees. */
    metrics_set_queue(m, 0, 0);
    metrics_publish(m, 2, 1);
    body = http_get(port, "/metrics", &status);
    cr_assert(
        find_line(body, "vllm:num_requests_waiting{model_name=\"stories260K\",engine=\"0\"} 0"),
        "%s", body);
    free(body);
    metrics_destroy(m);
}

Test(daemon_metrics, publish_is_rate_limited_and_labels_bounded)
{
    metrics_config cfg = {.publish_interval_us = 1000};
    metrics *m;
    cr_assert_eq(metrics_create(&cfg, &m), 0);
    cr_assert_eq(metrics_port(m), 0);
    metrics_set_queue(m, 5, 0);
    metrics_publish(m, 10000, 0);
    metrics_set_queue(m, 6, 0);
    metrics_publish(m, 10500, 0); /* within the interval: not published */
    char *t;
    size_t n;
    cr_assert_eq(metrics_render(m, &t, &n), 0);
    cr_assert(find_line(t, "ringlm_queue_depth 5"), "%s", t);
    free(t);
    metrics_publish(m, 11000, 0);
    cr_assert_eq(metrics_render(m, &t, &n), 0);
    cr_assert(find_line(t, "ringlm_queue_depth 6"), "%s", t);
    free(t);
    /* 100 tenants: folded into "other" past the limit, never out of bounds. */
    char name[32];
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "t%d", i);
        int s = metrics_series(m, metrics_tenant_label(m, name), metrics_class_label(m, "c"));
        metrics_count_reject(m, s, i % 2 ? SCHED_REJECT_TENANT_QUOTA : SCHED_REJECT_QUEUE_FULL);
    }
    metrics_publish(m, 20000, 1);
    cr_assert_eq(metrics_render(m, &t, &n), 0);
    cr_assert(strstr(t, "tenant=\"other\""));
    check_exposition(t);
    free(t);
    metrics_destroy(m);
}

/* Every tenant × class slot in use: the exposition outgrows the first buffer guess (the
 * render retries with more room) and stays well-formed; the second scrape is the same. */
Test(daemon_metrics, full_label_space_renders_whole)
{
    metrics *m;
    cr_assert_eq(metrics_create(NULL, &m), 0);
    char t[16], c[16];
    for (int i = 0; i < METRICS_MAX_TENANTS; i++)
        for (int j = 0; j < METRICS_MAX_CLASSES; j++) {
            snprintf(t, sizeof t, "tenant%02d", i);
            snprintf(c, sizeof c, "class%d", j);
            int s = metrics_series(m, metrics_tenant_label(m, t), metrics_class_label(m, c));
            metrics_observe(m, s, METRICS_H_E2E, (uint64_t)(i * 1000 + j));
            metrics_count_reject(m, s, SCHED_REJECT_QUEUE_FULL);
        }
    metrics_publish(m, 1, 1);
    char *a, *b;
    size_t na, nb;
    cr_assert_eq(metrics_render(m, &a, &na), 0);
    cr_assert_eq(metrics_render(m, &b, &nb), 0);
    cr_assert(na > 1000000, "only %zu bytes for %d series", na,
              METRICS_MAX_TENANTS * METRICS_MAX_CLASSES);
    cr_assert_eq(na, nb);
    cr_assert_eq(strlen(a), na);
    cr_assert(memcmp(a, b, na) == 0);
    cr_assert(strstr(
        a, "ringlm_rejects_total{tenant=\"tenant30\",class=\"class6\",reason=\"queue_full\"} 1\n"));
    /* the last slot of each label is "other": tenant31 and class7 fold into it */
    cr_assert(strstr(
        a, "ringlm_rejects_total{tenant=\"other\",class=\"other\",reason=\"queue_full\"} 1\n"));
    cr_assert(strstr(a, "vllm:kv_cache_usage_perc{"), "the tail of the exposition is missing");
    check_exposition(a);
    free(a);
    free(b);
    metrics_destroy(m);
}

Test(daemon_metrics, bad_listen_addresses_are_explained)
{
    metrics *m;
    metrics_config cfg = {.listen = "127.0.0.1:99999"};
    cr_assert_eq(metrics_create(&cfg, &m), -EINVAL);
    cr_assert(strstr(metrics_errmsg(), "99999"), "%s", metrics_errmsg());
    cfg.listen = "nohost:80";
    cr_assert_eq(metrics_create(&cfg, &m), -EINVAL);
    cr_assert(strstr(metrics_errmsg(), "nohost"), "%s", metrics_errmsg());
    /* A port in use: -EADDRINUSE. */
    cfg.listen = ":0";
    metrics *a;
    cr_assert_eq(metrics_create(&cfg, &a), 0);
    char spec[32];
    snprintf(spec, sizeof spec, "127.0.0.1:%d", metrics_port(a));
    cfg.listen = spec;
    int rc = metrics_create(&cfg, &m);
    cr_assert_eq(rc, -EADDRINUSE, "rc %d %s", rc, metrics_errmsg());
    metrics_destroy(a);
}

/* ---- the real daemon's /metrics through the same checker ---------------------------- */

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

/* The daemon of the real-daemon test (tests/helpers.c starts and stops it). */
static th_daemon g_daemon;
static void stop_it(void)
{
    th_daemon_stop(&g_daemon, SIGTERM, 15000);
    th_daemon_cleanup(&g_daemon);
}

Test(daemon_metrics, real_daemon_exposition_parses, .fini = stop_it, .timeout = 120)
{
    const char *shared =
        getenv("RINGLM_SHARED") && *getenv("RINGLM_SHARED") ? getenv("RINGLM_SHARED") : "../shared";
    const char *bin =
        getenv("RINGLM_BIN") && *getenv("RINGLM_BIN") ? getenv("RINGLM_BIN") : "build/bin";
    char model[512], tok[512], ringlm[512];
    snprintf(model, sizeof model, "%s/models/stories260K.bin", shared);
    snprintf(tok, sizeof tok, "%s/models/tok512.bin", shared);
    snprintf(ringlm, sizeof ringlm, "%s/ringlm", bin);
    if (access(model, R_OK) || access(tok, R_OK))
        cr_skip_test("stories260K/tok512 not under %s", shared);
    if (access(ringlm, X_OK)) cr_skip_test("ringlm not built in %s", bin);
    /* An ephemeral port, read back from the daemon's "metrics on port N" line: a port chosen
     * here could be taken by another test. */
    const char *dargs[] = {"--model", model, "--metrics", "127.0.0.1:0", NULL};
    th_daemon_start(&g_daemon, dargs, 20000);
    const char *sock = g_daemon.sock;
    int port = 0;
    for (uint64_t dl = th_now_ms() + 5000; !port; th_pause_ms(5)) {
        const char *out = th_daemon_output(&g_daemon), *at = strstr(out, "metrics on port ");
        if (at) port = atoi(at + strlen("metrics on port "));
        cr_assert(port > 0 || th_now_ms() < dl, "ringlmd named no metrics port:\n%s", out);
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    /* a few requests, so that histograms and counters have series */
    const char *prompts[] = {"Once upon a time", "The little dog", "Lily wanted to"};
    for (int i = 0; i < 3; i++) {
        pid_t c;
        char *cargv[] = {
            ringlm,        "--socket", (char *)sock,   "generate", "--prompt", (char *)prompts[i],
            "--tokenizer", tok,        "--max-tokens", "20",       NULL};
        cr_assert_eq(posix_spawn(&c, ringlm, &fa, NULL, cargv, environ), 0);
        int st;
        waitpid(c, &st, 0);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "ringlm generate failed (status %d)", st);
    }
    posix_spawn_file_actions_destroy(&fa);
    /* the loop publishes at most every 100 ms: poll until the three requests show */
    char *body = NULL;
    int status = 0;
    uint64_t dl = th_now_ms() + 5000;
    for (;;) {
        body = http_get(port, "/metrics", &status);
        cr_assert_eq(status, 200);
        const char *l = find_line(body, "ringlm_e2e_request_latency_seconds_count{");
        const char *v = l ? strstr(l, "} ") : NULL;
        if (v && atoi(v + 2) == 3) break;
        cr_assert(th_now_ms() < dl, "the 3 requests never showed in /metrics:\n%s", body);
        free(body);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    cr_assert(find_line(body, "vllm:num_requests_waiting{"), "%s", body);
    cr_assert(find_line(body, "vllm:num_requests_running{"), "%s", body);
    cr_assert(find_line(body, "vllm:kv_cache_usage_perc{"), "%s", body);
    cr_assert(find_line(body, "ringlm_kv_blocks_free{tier=\"device\"}"), "%s", body);
    cr_assert(find_line(body, "ringlm_info{"), "%s", body);
    check_exposition(body);
    free(body);
}

/* Every reason is counted under its own label: rejects, finishes, defers and preemptions are
 * indexed by the scheduler's enums, and a value outside an enum (a caller's bug) lands under
 * reason="invalid", never under a real reason (the labels used to be interned strings, and
 * past the table's end a count went to slot 0, a real reason). */
Test(daemon_metrics, each_reason_is_counted_under_its_own_label)
{
    metrics *m;
    cr_assert_eq(metrics_create(NULL, &m), 0);
    int s = metrics_series(m, metrics_tenant_label(m, "alice"), metrics_class_label(m, "chat"));
    /* reason r counted r + 1 times, so a count names the reason it belongs to */
    for (int r = 1; r < SCHED_REJECT__COUNT; r++)
        for (int k = 0; k <= r; k++) metrics_count_reject(m, s, (sched_reject_reason)r);
    for (int r = SCHED_END_LENGTH; r <= SCHED_END_ERROR; r++)
        for (int k = 0; k <= r; k++) metrics_count_finish(m, s, (sched_end_code)r);
    for (int r = 1; r < SCHED_DEFER__COUNT; r++)
        for (int k = 0; k <= r; k++) {
            metrics_count_defer(m, s, (sched_defer_reason)r);
            metrics_count_preempt(m, s, METRICS_MODE_SWAP, (sched_defer_reason)r);
        }
    /* values outside the enums */
    metrics_count_reject(m, s, (sched_reject_reason)(SCHED_REJECT__COUNT + 5));
    metrics_count_finish(m, s, SCHED_END_QUEUE_FULL); /* a cause, not a finish reason */
    metrics_count_defer(m, s, (sched_defer_reason)-1);
    metrics_publish(m, 1, 1);
    char *t;
    size_t n;
    cr_assert_eq(metrics_render(m, &t, &n), 0);
    char line[256];
    for (int r = 1; r < SCHED_REJECT__COUNT; r++) {
        snprintf(line, sizeof line,
                 "ringlm_rejects_total{tenant=\"alice\",class=\"chat\",reason=\"%s\"} %d",
                 sched_reject_name((sched_reject_reason)r), r + 1);
        cr_expect(find_line(t, line), "missing: %s\n%s", line, t);
    }
    for (int r = SCHED_END_LENGTH; r <= SCHED_END_ERROR; r++) {
        snprintf(line, sizeof line,
                 "ringlm_requests_finished_total{tenant=\"alice\",class=\"chat\",reason=\"%s\"} %d",
                 sched_end_name((unsigned)r), r + 1);
        cr_expect(find_line(t, line), "missing: %s\n%s", line, t);
    }
    for (int r = 1; r < SCHED_DEFER__COUNT; r++) {
        snprintf(line, sizeof line,
                 "ringlm_defers_total{tenant=\"alice\",class=\"chat\",reason=\"%s\"} %d",
                 sched_defer_name((sched_defer_reason)r), r + 1);
        cr_expect(find_line(t, line), "missing: %s\n%s", line, t);
        snprintf(line, sizeof line,
                 "ringlm_preemptions_total{tenant=\"alice\",class=\"chat\",mode=\"swap\","
                 "reason=\"%s\"} %d",
                 sched_defer_name((sched_defer_reason)r), r + 1);
        cr_expect(find_line(t, line), "missing: %s\n%s", line, t);
    }
    cr_expect(
        find_line(t, "ringlm_rejects_total{tenant=\"alice\",class=\"chat\",reason=\"invalid\"} 1"),
        "%s", t);
    cr_expect(find_line(t, "ringlm_requests_finished_total{tenant=\"alice\",class=\"chat\","
                           "reason=\"invalid\"} 1"),
              "%s", t);
    cr_expect(
        find_line(t, "ringlm_defers_total{tenant=\"alice\",class=\"chat\",reason=\"invalid\"} 1"),
        "%s", t);
    check_exposition(t);
    free(t);
    metrics_destroy(m);
}
