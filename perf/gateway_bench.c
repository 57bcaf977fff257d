/* SPDX-License-Identifier: MIT */
/*
 * gateway_bench — what ringlm-gateway adds, measured side by side on one daemon: the same
 * requests through the gateway (HTTP + SSE from a raw socket client) and through a direct
 * shared-memory client (libringlm), interleaved request by request so both see the same
 * machine at the same moment.
 *
 *   ttft_p50_us      request sent → first token received (direct: submit → TOKEN event;
 *                    gateway: POST written → first SSE chunk read), and the delta
 *   tpot_p50_us      a stream's mean gap between tokens (first to last), median over the
 *                    requests, both ways, and the delta
 *   gateway_token_us the gateway's own time per token (its /metrics: decode, UTF-8, stop
 *                    strings, chunk), and gateway_admission_us per request (parse, tokenize,
 *                    submit)
 *   concurrent       --streams HTTP streams opened at once (one epoll client): how many
 *                    completed with [DONE], how many failed, wall time
 *   memory_per_stream_bytes  the gateway's peak RSS in the concurrent phase minus its RSS
 *                    before, over the most requests it held in flight at once (its
 *                    /metrics, sampled every 20 ms)
 *
 * It starts its own ringlmd (--model, default the real stories260K) and gateway from the
 * build's bin/ and stops both. Figures are medians over --requests requests of
 * --max-tokens tokens each (greedy).
 *
 * usage: gateway_bench [--json] [--requests N] [--max-tokens N] [--streams N]
 *                      [--model PATH] [--tokenizer PATH] [--bin DIR]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "perf/bench_util.h"
#include "ringlm.h"

static const int32_t prompt_ids[] = {1, 403, 407, 261, 378}; /* "Once upon a time" in tok512 */
#define N_PROMPT ((int)(sizeof prompt_ids / sizeof *prompt_ids))

static pid_t daemon_pid = -1, gateway_pid = -1;

/* ---- HTTP ------------------------------------------------------------------------------ */
static int port;

static int request_text(char *buf, size_t cap, int max_tokens)
{
    char body[256];
    int bl = snprintf(
        body, sizeof body,
        "{\"prompt\":[1,403,407,261,378],\"max_tokens\":%d,\"temperature\":0,\"stream\":true}",
        max_tokens);
    return snprintf(buf, cap,
                    "POST /v1/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                    "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
                    bl, body);
}

/* One streamed request through the gateway: token arrival times (ns, relative to the
 * send) into t[], returns the count, or -1 on an error event / bad status. */
static int gateway_one(int max_tokens, double *t)
{
    char req[512];
    int n = request_text(req, sizeof req, max_tokens);
    int fd = bench_tcp_connect("127.0.0.1", port);
    uint64_t t0 = bench_now_ns();
    if (write(fd, req, (size_t)n) != n) bench_die("write: %s", strerror(errno));
    char buf[1 << 16];
    size_t len = 0, scan = 0;
    int got = 0;
    bool done = false, ok = true;
    while (!done) {
        ssize_t r = read(fd, buf + len, sizeof buf - len - 1);
        if (r <= 0) break;
        uint64_t now = bench_now_ns();
        len += (size_t)r;
        buf[len] = 0;
        char *p;
        while ((p = strstr(buf + scan, "data: ")) && strstr(p, "\n\n")) {
            char *e = strstr(p, "\n\n");
            if (!strncmp(p, "data: [DONE]", 12))
                done = true;
            else if (strstr(p, "\"error\"") && strstr(p, "\"error\"") < e)
                ok = false;
            else if (strstr(p, "\"finish_reason\":null") && strstr(p, "\"finish_reason\":null") < e)
                t[got++] = (double)(now - t0);
            scan = (size_t)(e + 2 - buf);
        }
        if (len > sizeof buf / 2) {
            memmove(buf, buf + scan, len - scan);
            len -= scan;
            scan = 0;
            buf[len] = 0;
        }
    }
    close(fd);
    if (strncmp(buf, "HTTP/1.1 200", 12) && scan == 0) ok = false;
    return ok && done ? got : -1;
}

static int direct_one(ringlm_client *c, int max_tokens, double *t)
{
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = prompt_ids;
    r.n_prompt = N_PROMPT;
    r.max_new_tokens = (uint32_t)max_tokens;
    r.class_name = "";
    uint64_t id, t0 = bench_now_ns();
    if (ringlm_submit(c, &r, &id) < 0) bench_die("submit: %s", ringlm_errdetail());
    int got = 0;
    for (;;) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 10000);
        if (rc <= 0) bench_die("next_event: %d %s", rc, ringlm_errdetail());
        if (ev.req_id != id) continue;
        if (ev.kind == RINGLM_EV_TOKEN)
            t[got++] = (double)(bench_now_ns() - t0);
        else
            return ev.finish_reason <= RINGLM_FINISH_STOP ? got : -1;
    }
}

/* ---- many streams at once -------------------------------------------------------------- */
typedef struct stream_conn {
    int fd;
    size_t len;
    char buf[512]; /* the tail of what was read: enough to find [DONE] / an error */
    bool done, failed;
} stream_conn;

static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

static void concurrent(int n, int max_tokens, int *ok, int *failed, double *wall_s,
                       double *mem_per_stream, int *peak_open)
{
    stream_conn *s = calloc((size_t)n, sizeof *s);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    char req[512];
    int rl = request_text(req, sizeof req, max_tokens);
    long rss0 = rss_kb(gateway_pid), rss_peak = rss0;
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < n; i++) {
        s[i].fd = bench_tcp_connect("127.0.0.1", port);
        if (write(s[i].fd, req, (size_t)rl) != rl) bench_die("write: %s", strerror(errno));
        fcntl(s[i].fd, F_SETFL, O_NONBLOCK);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, s[i].fd, &ev);
    }
    int open_n = n;
    *peak_open = 0;
    uint64_t last_rss = 0;
    while (open_n > 0) {
        struct epoll_event evs[256];
        int k = epoll_wait(ep, evs, 256, 30000);
        if (k <= 0) break;
        uint64_t now = bench_now_ns();
        if (now - last_rss > 20000000ull) {
            long r = rss_kb(gateway_pid);
            if (r > rss_peak) rss_peak = r;
            char *m = bench_http_get(port, "/metrics");
            int in_flight = (int)bench_metric(m, "ringlm_gateway_requests_in_flight");
            free(m);
            if (in_flight > *peak_open) *peak_open = in_flight;
            last_rss = now;
        }
        for (int j = 0; j < k; j++) {
            stream_conn *c = &s[evs[j].data.u32];
            char tmp[8192];
            ssize_t r;
            while ((r = read(c->fd, tmp, sizeof tmp)) > 0) {
                /* keep the last bytes only */
                size_t keep = sizeof c->buf - 1;
                if ((size_t)r >= keep) {
                    memcpy(c->buf, tmp + r - keep, keep);
                    c->len = keep;
                } else {
                    if (c->len + (size_t)r > keep) {
                        size_t drop = c->len + (size_t)r - keep;
                        memmove(c->buf, c->buf + drop, c->len - drop);
                        c->len -= drop;
                    }
                    memcpy(c->buf + c->len, tmp, (size_t)r);
                    c->len += (size_t)r;
                }
                c->buf[c->len] = 0;
                if (strstr(c->buf, "\"error\"")) c->failed = true;
            }
            if (r == 0 || (r < 0 && errno != EAGAIN)) {
                c->done = strstr(c->buf, "data: [DONE]") != NULL;
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                c->fd = -1;
                open_n--;
            }
        }
    }
    *wall_s = (double)(bench_now_ns() - t0) / 1e9;
    *ok = *failed = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].done && !s[i].failed)
            (*ok)++;
        else
            (*failed)++;
        if (s[i].fd >= 0) close(s[i].fd);
    }
    *mem_per_stream = *peak_open ? (double)(rss_peak - rss0) * 1024.0 / *peak_open : 0;
    close(ep);
    free(s);
}

/* ---- main ------------------------------------------------------------------------------ */
int main(int argc, char **argv)
{
    bench_prog = "gateway_bench";
    int json = 0, requests = 40, max_tokens = 64, streams = 1000;
    const char *model = NULL, *tok = NULL, *bin = NULL;
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'},
        {"requests", required_argument, 0, 'r'},
        {"max-tokens", required_argument, 0, 'n'},
        {"streams", required_argument, 0, 's'},
        {"model", required_argument, 0, 'm'},
        {"tokenizer", required_argument, 0, 't'},
        {"bin", required_argument, 0, 'b'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'j': json = 1; break;
        case 'r': requests = atoi(optarg); break;
        case 'n': max_tokens = atoi(optarg); break;
        case 's': streams = atoi(optarg); break;
        case 'm': model = optarg; break;
        case 't': tok = optarg; break;
        case 'b': bin = optarg; break;
        case 'h':
            printf("usage: gateway_bench [--json] [--requests N] [--max-tokens N] [--streams N]\n"
                   "                     [--model PATH] [--tokenizer PATH] [--bin DIR]\n");
            return 0;
        default: return 2;
        }
    }
    if (requests < 1 || max_tokens < 2 || max_tokens > 500 || streams < 0)
        bench_die("bad arguments");
    bench_default_files(argv[0], &model, &tok, &bin);
    bench_raise_nofile();
    signal(SIGPIPE, SIG_IGN);
    const char *dir = bench_mkdtemp("gwbench");
    char sock[256], dlog[256], glog[256], ringlmd[600], gw[600], policy[256];
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(dlog, sizeof dlog, "%s/ringlmd.log", dir);
    snprintf(glog, sizeof glog, "%s/gateway.log", dir);
    snprintf(policy, sizeof policy, "%s/bench.policy", dir);
    snprintf(ringlmd, sizeof ringlmd, "%s/ringlmd", bin);
    snprintf(gw, sizeof gw, "%s/ringlm-gateway", bin);
    /* Room for every concurrent stream in the queue; the daemon runs 256 at once. */
    FILE *pf = fopen(policy, "w");
    fprintf(pf,
            "[scheduler]\nmode = token_budget\nmax_active_seqs = 256\nqueue_max_requests = 100000\n"
            "[tenant default]\nmax_queued_tokens = 0\n");
    fclose(pf);
    char *dargv[] = {ringlmd,   "--socket",    sock,          "--numa-node", "off",
                     "--model", (char *)model, "--policy",    policy,        "--kv-blocks",
                     "8192",    "--metrics",   "127.0.0.1:0", "--quiet",     NULL};
    daemon_pid = bench_spawn(dargv, dlog);
    bench_wait_path(sock);
    char *gargv[] = {gw,          "--listen", "127.0.0.1:0", "--socket", sock, "--tokenizer",
                     (char *)tok, "--quiet",  NULL};
    gateway_pid = bench_spawn(gargv, glog);
    port = bench_port_from_log(glog, "listening on http://127.0.0.1:", gateway_pid);
    for (int i = 0;; i++) {
        char *h = bench_http_get(port, "/health");
        bool up = strstr(h, " 200 ") != NULL;
        free(h);
        if (up) break;
        if (i > 500) bench_die("the gateway never became healthy");
        usleep(10000);
    }
    ringlm_client *c;
    if (ringlm_connect(sock, &c) < 0) bench_die("connect: %s", ringlm_errdetail());

    /* Warm-up both paths, then interleave. */
    double *t = malloc(sizeof(double) * (size_t)(max_tokens + 8));
    for (int i = 0; i < 3; i++) {
        direct_one(c, max_tokens, t);
        gateway_one(max_tokens, t);
    }
    char *m0 = bench_http_get(port, "/metrics");
    double tok_sum0 = bench_metric(m0, "ringlm_gateway_token_seconds_sum"),
           tok_n0 = bench_metric(m0, "ringlm_gateway_token_seconds_count");
    double adm_sum0 = bench_metric(m0, "ringlm_gateway_admission_seconds_sum"),
           adm_n0 = bench_metric(m0, "ringlm_gateway_admission_seconds_count");
    free(m0);
    double *ttft[2], *tpot[2];
    int n_tpot[2] = {0, 0}, errors[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        ttft[k] = malloc(sizeof(double) * (size_t)requests);
        tpot[k] = malloc(sizeof(double) * (size_t)requests * (size_t)max_tokens);
    }
    for (int i = 0; i < requests; i++) {
        for (int k = 0; k < 2; k++) {
            int way = (i + k) % 2; /* alternate which path goes first */
            int got = way == 0 ? direct_one(c, max_tokens, t) : gateway_one(max_tokens, t);
            if (got <= 0) {
                errors[way]++;
                continue;
            }
            ttft[way][i - errors[way]] = t[0] / 1e3;
            /* The stream's pace: tokens can arrive in bursts (a client woken once for
			 * several), so a gap's median says little; the mean gap per request does. */
            if (got > 1) tpot[way][n_tpot[way]++] = (t[got - 1] - t[0]) / 1e3 / (got - 1);
        }
    }
    char *m1 = bench_http_get(port, "/metrics");
    double tok_us = (bench_metric(m1, "ringlm_gateway_token_seconds_sum") - tok_sum0) * 1e6 /
                    (bench_metric(m1, "ringlm_gateway_token_seconds_count") - tok_n0);
    double adm_us = (bench_metric(m1, "ringlm_gateway_admission_seconds_sum") - adm_sum0) * 1e6 /
                    (bench_metric(m1, "ringlm_gateway_admission_seconds_count") - adm_n0);
    free(m1);
    double ttft_d = bench_median(ttft[0], requests - errors[0]),
           ttft_g = bench_median(ttft[1], requests - errors[1]);
    double tpot_d = bench_median(tpot[0], n_tpot[0]), tpot_g = bench_median(tpot[1], n_tpot[1]);

    int ok = 0, failed = 0, peak_open = 0;
    double wall = 0, mem = 0;
    if (streams > 0) concurrent(streams, 16, &ok, &failed, &wall, &mem, &peak_open);
    ringlm_close(c);
    bench_stop(&gateway_pid);
    bench_stop(&daemon_pid);
    bench_cleanup();

    if (json) {
        bench_json_print(
            json_pack("{s:i,s:i,s:{s:i,s:i},s:{s:f,s:f,s:f},s:{s:f,s:f,s:f},s:f,s:f,s:{s:i,s:i,s:i,"
                      "s:f,s:i},s:f}",
                      "requests", requests, "max_tokens", max_tokens, "errors", "direct", errors[0],
                      "gateway", errors[1], "ttft_p50_us", "direct", ttft_d, "gateway", ttft_g,
                      "delta", ttft_g - ttft_d, "tpot_p50_us", "direct", tpot_d, "gateway", tpot_g,
                      "delta", tpot_g - tpot_d, "gateway_token_us", tok_us, "gateway_admission_us",
                      adm_us, "concurrent", "streams", streams, "ok", ok, "failed", failed,
                      "wall_s", wall, "peak_open", peak_open, "memory_per_stream_bytes", mem));
    } else {
        printf("gateway_bench: %d requests x %d tokens each way (interleaved), greedy, model %s\n",
               requests, max_tokens, model);
        printf("  TTFT p50      direct %8.1f us   gateway %8.1f us   delta %+8.1f us\n", ttft_d,
               ttft_g, ttft_g - ttft_d);
        printf("  per-token p50 direct %8.2f us   gateway %8.2f us   delta %+8.2f us\n", tpot_d,
               tpot_g, tpot_g - tpot_d);
        printf("  in the gateway: %.3f us per token, %.1f us per request admission\n", tok_us,
               adm_us);
        printf("  %d concurrent streams: %d completed, %d failed in %.2f s; %.0f bytes of gateway "
               "RSS per open stream (%d open at the peak)\n",
               streams, ok, failed, wall, mem, peak_open);
        printf("  errors: direct %d, gateway %d\n", errors[0], errors[1]);
    }
    return failed || errors[0] || errors[1] ? 1 : 0;
}
