/* SPDX-License-Identifier: MIT */
/*
 * perf/tsan_obs — daemon/metrics and daemon/declog under ThreadSanitizer (make tsan).
 *
 * Criterion can not start under TSAN (Snaipe/Criterion#274), so this is a plain program.
 *
 * metrics: the main thread plays the loop (updates the live counters, publishes a
 *   snapshot every iteration or on the interval) while two threads scrape at the same
 *   time: one over HTTP through libmicrohttpd's own thread, one calling metrics_render()
 *   directly. Every scrape must be a consistent snapshot (the loop adds k prompt tokens
 *   and 2k generated tokens in the same iteration, so generated == 2 × prompt in every
 *   snapshot) and never older than the one before it; the last one must show the totals.
 * declog: the main thread queues decision and request lines into small rings while the
 *   writer thread drains them (periodic wakes, quarter-full wakes, drops when full);
 *   after declog_flush every queued line is in the file, whole, in order.
 *
 * Prints one line per check; exit 0 when all passed. TSAN reports races by itself.
 */
#include "daemon/declog.h"
#include "daemon/metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- metrics ------------------------------------------------------------------------ */

typedef struct scraper {
    metrics *m;
    int port; /* > 0: over HTTP; 0: metrics_render() */
    _Atomic int *stop;
    _Atomic int scrapes; /* read by the main thread while this one runs */
    _Atomic int failed;  /* set after err is written; the main thread reads err after join */
    uint64_t last_prompt;
    char err[256];
} scraper;

/* The value of `NAME{tenant="t0",class="chat"} V` in text, or -1 when absent. */
static int64_t series_value(const char *text, const char *name)
{
    char key[128];
    snprintf(key, sizeof key, "\n%s{tenant=\"t0\",class=\"chat\"} ", name);
    const char *p = strstr(text, key);
    if (!p) return -1;
    return strtoll(p + strlen(key), NULL, 10);
}

/* GET /metrics over HTTP/1.0; returns a malloc()ed body or NULL (why in err). */
static char *http_get(int port, char *err, size_t errcap)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errcap, "socket: %s", strerror(errno));
        return NULL;
    }
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        snprintf(err, errcap, "connect 127.0.0.1:%d: %s", port, strerror(errno));
        close(fd);
        return NULL;
    }
    static const char req[] = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
        snprintf(err, errcap, "write: %s", strerror(errno));
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            snprintf(err, errcap, "out of memory");
            close(fd);
            return NULL;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            snprintf(err, errcap, "read: %s", strerror(errno));
            free(buf);
            close(fd);
            return NULL;
        }
        if (n == 0) break;
        len += (size_t)n;
        if (len == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    close(fd);
    buf[len] = 0;
    if (strncmp(buf, "HTTP/1.", 7) != 0 || strncmp(buf + 8, " 200", 4) != 0) {
        snprintf(err, errcap, "bad reply: %.60s", buf);
        free(buf);
        return NULL;
    }
    return buf;
}

/* Checks one scrape; 0 or -1 with s->err set. */
static int check_scrape(scraper *s, const char *text)
{
    int64_t p = series_value(text, "ringlm_prompt_tokens_total");
    int64_t g = series_value(text, "ringlm_generation_tokens_total");
    if (p < 0 && g < 0) return 0; /* nothing published for the series yet */
    if (p < 0 || g != 2 * p) {
        snprintf(s->err, sizeof s->err,
                 "torn snapshot: prompt_tokens %" PRId64 ", generation_tokens %" PRId64
                 " (expected twice)",
                 p, g);
        return -1;
    }
    if ((uint64_t)p < s->last_prompt) {
        snprintf(s->err, sizeof s->err,
                 "snapshot went back: prompt_tokens %" PRId64 " after %" PRIu64, p, s->last_prompt);
        return -1;
    }
    s->last_prompt = (uint64_t)p;
    return 0;
}

static void *scrape_main(void *arg)
{
    scraper *s = arg;
    while (!atomic_load(s->stop)) {
        char *text = NULL;
        size_t len = 0;
        if (s->port > 0) {
            text = http_get(s->port, s->err, sizeof s->err);
            if (!text) {
                atomic_store(&s->failed, 1);
                return NULL;
            }
        } else {
            int rc = metrics_render(s->m, &text, &len);
            if (rc < 0) {
                snprintf(s->err, sizeof s->err, "metrics_render: %d %s", rc, metrics_errmsg());
                atomic_store(&s->failed, 1);
                return NULL;
            }
        }
        int bad = check_scrape(s, text);
        free(text);
        if (bad) {
            atomic_store(&s->failed, 1);
            return NULL;
        }
        atomic_fetch_add(&s->scrapes, 1);
    }
    return NULL;
}

static int check_metrics(int iters)
{
    metrics_config cfg = {.listen = "127.0.0.1:0",
                          .version = "tsan",
                          .policy_hash = "p0",
                          .model_hash = "m0",
                          .model_name = "tsan-model",
                          .backend = "cpu",
                          .publish_interval_us = 200};
    metrics *m = NULL;
    int rc = metrics_create(&cfg, &m);
    if (rc < 0) {
        fprintf(stderr, "tsan_obs: metrics_create: %d %s\n", rc, metrics_errmsg());
        return -1;
    }
    int port = metrics_port(m);
    if (port <= 0) {
        fprintf(stderr, "tsan_obs: metrics_port: %d\n", port);
        metrics_destroy(m);
        return -1;
    }
    _Atomic int stop = 0;
    scraper sc[2] = {{.m = m, .port = port, .stop = &stop}, {.m = m, .port = 0, .stop = &stop}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&th[i], NULL, scrape_main, &sc[i])) {
            fprintf(stderr, "tsan_obs: pthread_create failed\n");
            return -1;
        }
    static const char *tenants[] = {"t0", "t1", "t\"2\\", "t3"};
    static const sched_end_code reasons[] = {SCHED_END_LENGTH, SCHED_END_STOP, SCHED_END_CANCELLED,
                                             SCHED_END_TIMEOUT};
    uint64_t prompt = 0;
    for (int i = 0; i < iters; i++) {
        int s0 = metrics_series(m, metrics_tenant_label(m, "t0"), metrics_class_label(m, "chat"));
        int sx = metrics_series(m, metrics_tenant_label(m, tenants[i % 4]),
                                metrics_class_label(m, i % 3 ? "chat" : "batch"));
        uint64_t k = 1 + (uint64_t)(i % 7);
        metrics_add_tokens(m, s0, k, 2 * k);
        prompt += k;
        metrics_observe(m, sx, (enum metrics_hist)(i % METRICS_N_HIST), (uint64_t)(i * 37 % 90000));
        metrics_count_finish(m, sx, reasons[i % 4]);
        if (i % 5 == 0)
            metrics_count_preempt(m, sx, (enum metrics_mode)(i % 2), SCHED_DEFER_BLOCKS);
        if (i % 7 == 0) metrics_count_reject(m, sx, SCHED_REJECT_TOO_LONG);
        if (i % 11 == 0) metrics_count_defer(m, sx, SCHED_DEFER_BUDGET);
        metrics_set_series_queue(m, sx, (uint32_t)(i % 9), (uint32_t)(i % 4));
        metrics_set_queue(m, (uint32_t)(i % 13), (uint32_t)(i % 5));
        metrics_set_kv(m, SCHED_POOL_DEVICE, (uint64_t)(i % 100), 100);
        metrics_set_kv(m, SCHED_POOL_HOST, (uint64_t)(i % 50), 50);
        metrics_observe_iteration(m, (uint64_t)(50 + i % 300), (uint32_t)(i % 64));
        metrics_observe_transfer(m, SCHED_POOL_HOST, i % 2 ? SCHED_XFER_IN : SCHED_XFER_OUT, 4096,
                                 3);
        metrics_set_log_dropped(m, (uint64_t)i / 100, 0);
        if (i % 500 == 0) metrics_set_info(m, i % 1000 ? "p1" : "p0", NULL);
        /* Mostly on the interval (the daemon's way), sometimes forced. */
        metrics_publish(m, now_us(), i % 16 == 0);
    }
    metrics_publish(m, now_us(), 1);
    /* Let each scraper see the final snapshot at least once more, then stop them. */
    int before[2] = {atomic_load(&sc[0].scrapes), atomic_load(&sc[1].scrapes)};
    uint64_t deadline = now_us() + 20u * 1000000u;
    while ((atomic_load(&sc[0].scrapes) <= before[0] + 1 ||
            atomic_load(&sc[1].scrapes) <= before[1] + 1) &&
           !atomic_load(&sc[0].failed) && !atomic_load(&sc[1].failed) && now_us() < deadline) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    int bad = 0;
    for (int i = 0; i < 2; i++) {
        const char *who = i ? "metrics_render thread" : "HTTP scraper";
        if (atomic_load(&sc[i].failed)) {
            fprintf(stderr, "tsan_obs: metrics: %s: %s\n", who, sc[i].err);
            bad = 1;
        } else if (sc[i].last_prompt != prompt) {
            fprintf(stderr,
                    "tsan_obs: metrics: %s: last scrape shows prompt_tokens %" PRIu64
                    ", expected %" PRIu64 " (%d scrapes)\n",
                    who, sc[i].last_prompt, prompt, sc[i].scrapes);
            bad = 1;
        }
    }
    if (!bad)
        printf("tsan_obs: metrics: %d loop iterations, %d HTTP scrapes and %d direct renders "
               "concurrently, every snapshot consistent, final totals seen\n",
               iters, atomic_load(&sc[0].scrapes), atomic_load(&sc[1].scrapes));
    metrics_destroy(m);
    return bad ? -1 : 0;
}

/* ---- declog ------------------------------------------------------------------------- */

/* Reads path; checks every line is "{"seq":N,...}" with N increasing; returns the count. */
static long check_log(const char *path, const char *key, char *err, size_t errcap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errcap, "%s: %s", path, strerror(errno));
        return -1;
    }
    char line[8192];
    long n = 0;
    long long last = -1;
    char pat[32];
    snprintf(pat, sizeof pat, "{\"%s\":", key);
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n' || strncmp(line, pat, strlen(pat)) != 0 ||
            line[len - 2] != '}') {
            snprintf(err, errcap, "%s line %ld is not a whole line: %.60s", path, n + 1, line);
            fclose(f);
            return -1;
        }
        long long v = strtoll(line + strlen(pat), NULL, 10);
        if (v <= last) {
            snprintf(err, errcap, "%s line %ld: %s %lld after %lld (out of order)", path, n + 1,
                     key, v, last);
            fclose(f);
            return -1;
        }
        last = v;
        n++;
    }
    fclose(f);
    return n;
}

static int check_declog(int lines)
{
    char dir[] = "/tmp/tsan_obs.XXXXXX";
    if (!mkdtemp(dir)) {
        perror("tsan_obs: mkdtemp");
        return -1;
    }
    char dpath[64], rpath[64];
    snprintf(dpath, sizeof dpath, "%s/decisions.jsonl", dir);
    snprintf(rpath, sizeof rpath, "%s/requests.jsonl", dir);
    /* Small rings (16 KiB) so that the quarter-full wake and the full-ring drop both run. */
    declog_config cfg = {
        .decision_path = dpath, .request_path = rpath, .ring_bytes = 16384, .truncate = true};
    declog *d = NULL;
    int rc = declog_create(&cfg, &d);
    if (rc < 0) {
        fprintf(stderr, "tsan_obs: declog_create: %d %s\n", rc, declog_errmsg());
        return -1;
    }
    char line[512];
    long ok_dec = 0, ok_req = 0, drop_dec = 0, drop_req = 0;
    for (int i = 0; i < lines; i++) {
        int n = snprintf(
            line, sizeof line, "{\"seq\":%d,\"event\":\"tsan\",\"pad\":\"%.*s\"}", i, i % 200,
            "................................................................"
            "................................................................"
            "........................................................................");
        rc = declog_decision_line(d, line, (size_t)n);
        if (rc == 0)
            ok_dec++;
        else if (rc == -ENOBUFS)
            drop_dec++;
        else {
            fprintf(stderr, "tsan_obs: declog_decision_line: %d\n", rc);
            declog_destroy(d);
            return -1;
        }
        declog_request r = {.req = (uint64_t)i,
                            .arrival_us = i,
                            .tenant = "t0",
                            .class_name = "chat",
                            .prompt_tokens = 10,
                            .max_tokens = 20,
                            .output_tokens = 20,
                            .deadline_us = DECLOG_NULL,
                            .cancel_us = DECLOG_NULL,
                            .first_token_us = i + 5,
                            .finish_us = i + 50,
                            .finish_reason = "length"};
        rc = declog_request_line(d, &r);
        if (rc == 0)
            ok_req++;
        else if (rc == -ENOBUFS)
            drop_req++;
        else {
            fprintf(stderr, "tsan_obs: declog_request_line: %d\n", rc);
            declog_destroy(d);
            return -1;
        }
        if (i % 1000 == 999) { /* let the writer catch up now and then, as the loop would */
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    rc = declog_flush(d, 20000);
    uint64_t q_dec, q_req, dr_dec, dr_req;
    declog_queued(d, &q_dec, &q_req);
    declog_dropped(d, &dr_dec, &dr_req);
    declog_destroy(d);
    int bad = 0;
    if (rc < 0) {
        fprintf(stderr, "tsan_obs: declog_flush: %d %s\n", rc, declog_errmsg());
        bad = 1;
    }
    if (q_dec != (uint64_t)ok_dec || q_req != (uint64_t)ok_req || dr_dec != (uint64_t)drop_dec ||
        dr_req != (uint64_t)drop_req) {
        fprintf(stderr,
                "tsan_obs: declog counts: queued %" PRIu64 "/%" PRIu64 " (expected %ld/%ld), "
                "dropped %" PRIu64 "/%" PRIu64 " (expected %ld/%ld)\n",
                q_dec, q_req, ok_dec, ok_req, dr_dec, dr_req, drop_dec, drop_req);
        bad = 1;
    }
    char err[256] = "";
    long n_dec = check_log(dpath, "seq", err, sizeof err);
    long n_req = n_dec < 0 ? -1 : check_log(rpath, "req", err, sizeof err);
    if (n_dec < 0 || n_req < 0) {
        fprintf(stderr, "tsan_obs: declog: %s\n", err);
        bad = 1;
    } else if (n_dec != ok_dec || n_req != ok_req) {
        fprintf(stderr,
                "tsan_obs: declog: files hold %ld decision and %ld request lines, "
                "%ld and %ld were queued\n",
                n_dec, n_req, ok_dec, ok_req);
        bad = 1;
    }
    unlink(dpath);
    unlink(rpath);
    rmdir(dir);
    if (!bad)
        printf("tsan_obs: declog: %d lines per log from the loop thread, writer thread wrote all "
               "%ld + %ld queued ones whole and in order (%ld + %ld dropped when full)\n",
               lines, ok_dec, ok_req, drop_dec, drop_req);
    return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
    int iters = 20000, lines = 20000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lines") && i + 1 < argc)
            lines = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: tsan_obs [--iters N] [--lines N]\n");
            return 2;
        }
    }
    if (iters < 1 || lines < 1) {
        fprintf(stderr, "tsan_obs: --iters and --lines must be >= 1\n");
        return 2;
    }
    int bad = 0;
    bad |= check_metrics(iters) != 0;
    bad |= check_declog(lines) != 0;
    return bad;
}
