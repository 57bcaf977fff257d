/* SPDX-License-Identifier: MIT */
/*
 * gateway_slowloris — does ringlm-gateway keep answering /health while it is attacked?
 * A real ringlmd and gateway (started from the build's bin/ and stopped at the end), and
 * on loopback only:
 *
 *   slowloris  --connections connections from 127.0.0.2..127.0.0.(1+--addrs), each sending
 *              one byte of a request head every --trickle-s seconds (spread evenly), so none
 *              is ever idle; one the gateway closes is opened again at once, so the count
 *              stays at --connections for the whole run;
 *   big prompt a completion whose prompt is --prompt-kb KB of text, posted once the
 *              slowloris is up (and again each time it is answered), so that one is being
 *              parsed and tokenized throughout;
 *   probes     GET /health from 127.0.0.1 on a fresh connection every --probe-ms, each
 *              timed from connect to the whole answer (2 s without one: a failure).
 *
 * It prints the settings, /health's p50/p99/max before the attack and during it, the
 * failures, how many big prompts were in flight, and the gateway's connection counters;
 * exit 0 when p99 during the attack is under --p99-ms (default 50) and nothing failed.
 * Every loop is bounded by --seconds.
 *
 * usage: gateway_slowloris [--connections N] [--addrs N] [--trickle-s S] [--prompt-kb N]
 *                          [--seconds S] [--probe-ms N] [--p99-ms N] [--bin DIR]
 *                          [--model PATH] [--tokenizer PATH] [-- GATEWAY OPTIONS...]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "perf/bench_util.h"

static int port;
static atomic_bool stop_all;

/* ---- sockets --------------------------------------------------------------------------- */
static int connect_from(const char *src, bool nonblock)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) return -errno;
    struct sockaddr_in me = {.sin_family = AF_INET}, sa = {.sin_family = AF_INET};
    sa.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    inet_pton(AF_INET, src, &me.sin_addr);
    if (bind(fd, (struct sockaddr *)&me, sizeof me) < 0 ||
        (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS)) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

/* ---- the slowloris --------------------------------------------------------------------- */
typedef struct slow {
    int n, addrs;
    double trickle_s;
    int *fd;
    uint64_t *next_us;
    size_t *sent;
    atomic_ulong reopened, bytes;
    atomic_int open_now;
} slow;

static const char slow_head[] = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "
                                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

static void slow_open(slow *w, int i)
{
    char src[32];
    snprintf(src, sizeof src, "127.0.0.%d", 2 + i % w->addrs);
    w->fd[i] = connect_from(src, true);
    w->sent[i] = 0;
    /* the first byte at a random point of the period: the bytes spread evenly */
    w->next_us[i] = bench_now_us() + (uint64_t)(rand() % (int)(w->trickle_s * 1e6));
}

static void *slow_main(void *arg)
{
    slow *w = arg;
    struct pollfd *p = calloc((size_t)w->n, sizeof *p);
    for (int i = 0; i < w->n; i++) slow_open(w, i);
    while (!atomic_load(&stop_all)) {
        int open_now = 0;
        for (int i = 0; i < w->n; i++) {
            p[i].fd = w->fd[i];
            p[i].events = POLLIN;
            p[i].revents = 0;
            open_now += w->fd[i] >= 0;
        }
        atomic_store(&w->open_now, open_now);
        poll(p, (nfds_t)w->n, 50);
        uint64_t now = bench_now_us();
        for (int i = 0; i < w->n; i++) {
            bool closed = w->fd[i] < 0;
            if (!closed && (p[i].revents & (POLLIN | POLLHUP | POLLERR))) {
                char b[512];
                ssize_t r = recv(w->fd[i], b, sizeof b, MSG_DONTWAIT);
                closed = r == 0 || (r < 0 && errno != EAGAIN);
            }
            if (!closed && now >= w->next_us[i]) {
                char ch = slow_head[w->sent[i] % (sizeof slow_head - 1)];
                ssize_t r = send(w->fd[i], &ch, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (r == 1) {
                    w->sent[i]++;
                    atomic_fetch_add(&w->bytes, 1);
                } else if (errno != EAGAIN && errno != ENOTCONN) {
                    closed = true;
                }
                w->next_us[i] = now + (uint64_t)(w->trickle_s * 1e6);
            }
            if (closed) { /* the gateway cut it: the attacker opens another at once */
                if (w->fd[i] >= 0) close(w->fd[i]);
                slow_open(w, i);
                atomic_fetch_add(&w->reopened, 1);
            }
        }
    }
    for (int i = 0; i < w->n; i++)
        if (w->fd[i] >= 0) close(w->fd[i]);
    free(p);
    return NULL;
}

/* ---- the big prompt -------------------------------------------------------------------- */
typedef struct big {
    int kb;
    atomic_int posted, answered;
    atomic_int last_status;
} big;

static void *big_main(void *arg)
{
    big *g = arg;
    static const char line[] = "Once upon a time there was a little girl who liked to play. ";
    size_t n = (size_t)g->kb * 1024 / (sizeof line - 1) + 1, cap = n * (sizeof line - 1) + 64;
    char *body = malloc(cap);
    char *q = body + sprintf(body, "{\"prompt\":\"");
    for (size_t i = 0; i < n; i++) q += sprintf(q, "%s", line);
    q += sprintf(q, "\",\"max_tokens\":4}");
    char head[256];
    int hn =
        snprintf(head, sizeof head,
                 "POST /v1/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                 (size_t)(q - body));
    while (!atomic_load(&stop_all)) {
        int fd = connect_from("127.0.0.1", false);
        if (fd < 0) break;
        bool ok = send(fd, head, (size_t)hn, MSG_NOSIGNAL) == hn;
        for (size_t off = 0; ok && off < (size_t)(q - body);) {
            ssize_t r = send(fd, body + off, (size_t)(q - body) - off, MSG_NOSIGNAL);
            if (r <= 0) ok = false;
            off += r > 0 ? (size_t)r : 0;
        }
        atomic_fetch_add(&g->posted, 1);
        char ans[64] = "";
        struct pollfd p = {.fd = fd, .events = POLLIN};
        while (ok && !atomic_load(&stop_all))
            if (poll(&p, 1, 100) == 1) {
                ssize_t r = recv(fd, ans, sizeof ans - 1, 0);
                if (r > 0) {
                    ans[r] = 0;
                    int st = 0;
                    sscanf(ans, "HTTP/1.%*d %d", &st);
                    atomic_store(&g->last_status, st);
                    atomic_fetch_add(&g->answered, 1);
                }
                break;
            }
        close(fd);
    }
    free(body);
    return NULL;
}

/* ---- probes ---------------------------------------------------------------------------- */
/* One /health: ms from connect to the whole answer; -1 when none came within 2 s or it was
 * not 200. */
static double probe(void)
{
    uint64_t t0 = bench_now_us(), end = t0 + 2000000;
    int fd = connect_from("127.0.0.1", true);
    if (fd < 0) return -1;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    double ms = -1;
    if (poll(&p, 1, 2000) == 1) {
        static const char req[] = "GET /health HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n";
        if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)sizeof req - 1) {
            char b[1024];
            size_t len = 0;
            p.events = POLLIN;
            for (;;) {
                uint64_t now = bench_now_us();
                if (now >= end || poll(&p, 1, (int)((end - now) / 1000) + 1) != 1) break;
                ssize_t r = recv(fd, b + len, sizeof b - 1 - len, 0);
                if (r <= 0) {
                    b[len] = 0;
                    if (len > 12 && !strncmp(b + 8, " 200", 4))
                        ms = (double)(bench_now_us() - t0) / 1e3;
                    break;
                }
                len += (size_t)r;
                if (len >= sizeof b - 1) break;
            }
        }
    }
    close(fd);
    return ms;
}

typedef struct probes {
    double *ms;
    int n, failed;
} probes;

static void run_probes(probes *pr, int cap, double seconds, int period_ms)
{
    uint64_t end = bench_now_us() + (uint64_t)(seconds * 1e6);
    pr->n = pr->failed = 0;
    while (bench_now_us() < end && pr->n + pr->failed < cap) {
        uint64_t t0 = bench_now_us();
        double ms = probe();
        if (ms < 0)
            pr->failed++;
        else
            pr->ms[pr->n++] = ms;
        uint64_t spent = bench_now_us() - t0;
        if (spent < (uint64_t)period_ms * 1000) usleep((useconds_t)(period_ms * 1000 - spent));
    }
}

static void print_probes(const char *what, probes *pr)
{
    printf("%-34s probes %5d  failed %3d  p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms\n", what, pr->n,
           pr->failed, bench_percentile(pr->ms, pr->n, 0.5), bench_percentile(pr->ms, pr->n, 0.99),
           bench_percentile(pr->ms, pr->n, 1.0));
}

/* The value of the sample line that begins with s (a name, its labels and a space). */
static double series(const char *text, const char *s)
{
    size_t l = strlen(s);
    for (const char *p = strstr(text, s); p; p = strstr(p + 1, s))
        if (p > text && p[-1] == '\n') return strtod(p + l, NULL);
    return 0;
}

int main(int argc, char **argv)
{
    bench_prog = "gateway_slowloris";
    int connections = 4000, addrs = 40, prompt_kb = 256, probe_ms = 20;
    double trickle_s = 10, seconds = 30, p99_max = 50;
    const char *model = NULL, *tok = NULL, *bin = NULL;
    static const struct option opts[] = {
        {"connections", required_argument, 0, 'c'},
        {"addrs", required_argument, 0, 'a'},
        {"trickle-s", required_argument, 0, 't'},
        {"prompt-kb", required_argument, 0, 'k'},
        {"seconds", required_argument, 0, 's'},
        {"probe-ms", required_argument, 0, 'p'},
        {"p99-ms", required_argument, 0, 'P'},
        {"bin", required_argument, 0, 'b'},
        {"model", required_argument, 0, 'm'},
        {"tokenizer", required_argument, 0, 'T'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'c': connections = atoi(optarg); break;
        case 'a': addrs = atoi(optarg); break;
        case 't': trickle_s = atof(optarg); break;
        case 'k': prompt_kb = atoi(optarg); break;
        case 's': seconds = atof(optarg); break;
        case 'p': probe_ms = atoi(optarg); break;
        case 'P': p99_max = atof(optarg); break;
        case 'b': bin = optarg; break;
        case 'm': model = optarg; break;
        case 'T': tok = optarg; break;
        case 'h':
            printf("usage: gateway_slowloris [--connections N] [--addrs N] [--trickle-s S]\n"
                   "         [--prompt-kb N] [--seconds S] [--probe-ms N] [--p99-ms N]\n"
                   "         [--bin DIR] [--model PATH] [--tokenizer PATH] [-- GATEWAY OPTS]\n");
            return 0;
        default: return 2;
        }
    }
    if (connections < 0 || connections > 60000 || addrs < 1 || addrs > 250 || trickle_s <= 0 ||
        prompt_kb < 0 || prompt_kb > 1000 || seconds <= 0 || seconds > 600 || probe_ms < 1)
        bench_die("bad arguments");
    bench_default_files(argv[0], &model, &tok, &bin);
    const rlim_t nofile = bench_raise_nofile();
    if (nofile < (rlim_t)connections + 64)
        bench_die("RLIMIT_NOFILE %llu is too low for %d connections", (unsigned long long)nofile,
                  connections);
    signal(SIGPIPE, SIG_IGN);

    const char *dir = bench_mkdtemp("slowloris");
    char sock[256], dlog[256], glog[256], ringlmd[600], gw[600];
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(dlog, sizeof dlog, "%s/ringlmd.log", dir);
    snprintf(glog, sizeof glog, "%s/gateway.log", dir);
    snprintf(ringlmd, sizeof ringlmd, "%s/ringlmd", bin);
    snprintf(gw, sizeof gw, "%s/ringlm-gateway", bin);
    char *dargv[] = {ringlmd,   "--socket",    sock,      "--numa-node", "off",
                     "--model", (char *)model, "--quiet", NULL};
    bench_spawn(dargv, dlog);
    bench_wait_path(sock);
    char *gargv[64] = {gw, "--listen", "127.0.0.1:0", "--socket", sock, "--tokenizer", (char *)tok};
    int gn = 7;
    for (int i = optind; i < argc && gn < 63; i++) gargv[gn++] = argv[i];
    gargv[gn] = NULL;
    pid_t gpid = bench_spawn(gargv, glog);
    port = bench_port_from_log(glog, "listening on http://127.0.0.1:", gpid);
    for (int i = 0;; i++) {
        char *h = bench_http_get(port, "/health");
        bool up = strstr(h, " 200 ") != NULL;
        free(h);
        if (up) break;
        if (i > 500) bench_die("the gateway never became healthy");
        usleep(10000);
    }

    printf("gateway_slowloris: %d connections from %d addresses, 1 byte per %.1f s each; a "
           "%d KB prompt in flight; /health every %d ms for %.0f s\n",
           connections, addrs, trickle_s, prompt_kb, probe_ms, seconds);
    printf("gateway options:");
    for (int i = optind; i < argc; i++) printf(" %s", argv[i]);
    printf("%s\n", optind < argc ? "" : " (defaults)");

    int cap = (int)(seconds * 1000 / probe_ms) + 16;
    probes base = {.ms = calloc((size_t)cap, sizeof(double))},
           att = {.ms = calloc((size_t)cap, sizeof(double))};
    run_probes(&base, cap, seconds < 5 ? seconds : 5, probe_ms);

    slow w = {.n = connections, .addrs = addrs, .trickle_s = trickle_s};
    w.fd = calloc((size_t)connections + 1, sizeof *w.fd);
    w.next_us = calloc((size_t)connections + 1, sizeof *w.next_us);
    w.sent = calloc((size_t)connections + 1, sizeof *w.sent);
    big g = {.kb = prompt_kb};
    pthread_t st, bt;
    if (connections && pthread_create(&st, NULL, slow_main, &w)) bench_die("pthread_create");
    /* the attack is up when every connection is open */
    for (int i = 0; connections && i < 600 && atomic_load(&w.open_now) < connections; i++)
        usleep(50000);
    if (prompt_kb && pthread_create(&bt, NULL, big_main, &g)) bench_die("pthread_create");
    usleep(200000); /* the prompt's body is in */
    run_probes(&att, cap, seconds, probe_ms);
    char *m = bench_http_get(port, "/metrics");
    int open_at_end = atomic_load(&w.open_now);
    atomic_store(&stop_all, true);
    if (connections) pthread_join(st, NULL);
    if (prompt_kb) pthread_join(bt, NULL);

    print_probes("/health before the attack", &base);
    print_probes("/health during the attack", &att);
    printf("slowloris: %d connections open at the end, %lu bytes trickled, %lu reopened after the "
           "gateway closed them\n",
           open_at_end, (unsigned long)atomic_load(&w.bytes),
           (unsigned long)atomic_load(&w.reopened));
    printf("big prompt: %d posted, %d answered (last status %d) during the attack\n",
           atomic_load(&g.posted), atomic_load(&g.answered), atomic_load(&g.last_status));
    printf("gateway: connections_open %.0f, cut head_timeout %.0f, body_timeout %.0f, evicted "
           "%.0f, refused %.0f; prep_running %.0f, prep_queued %.0f\n",
           series(m, "ringlm_gateway_connections_open "),
           series(m, "ringlm_gateway_connections_cut_total{reason=\"head_timeout\"} "),
           series(m, "ringlm_gateway_connections_cut_total{reason=\"body_timeout\"} "),
           series(m, "ringlm_gateway_connections_cut_total{reason=\"evicted\"} "),
           series(m, "ringlm_gateway_connections_refused_total "),
           series(m, "ringlm_gateway_prep_running "), series(m, "ringlm_gateway_prep_queued "));
    free(m);
    double p99 = bench_percentile(att.ms, att.n, 0.99);
    bool pass = att.n > 0 && att.failed == 0 && p99 < p99_max;
    printf("%s: /health p99 %.2f ms during the attack (bound %.0f ms), %d failed\n",
           pass ? "PASS" : "FAIL", p99, p99_max, att.failed);
    fflush(stdout);
    bench_cleanup();
    return pass ? 0 : 1;
}
