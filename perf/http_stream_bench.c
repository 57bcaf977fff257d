/* SPDX-License-Identifier: MIT */
/*
 * http_stream_bench — one streaming client for any OpenAI-compatible server (ringlm-gateway,
 * llama.cpp's llama-server), so that both are measured by the same code: --streams
 * completions sent at the same moment (a burst), each its own prompt of --prompt-len token
 * ids and exactly --max-tokens generated tokens (greedy, "ignore_eos", which both servers
 * take), streamed as server-sent events, --runs times, one burst after the other.
 *
 *   http_stream_bench --port P [--host 127.0.0.1] [--streams 1,8,32] [--prompt-len 32]
 *                     [--text-bytes N] [--max-tokens 128] [--vocab 32000] [--runs 3]
 *                     [--gateway-metrics] [--label NAME] [--trace FILE] [--json]
 *
 * Per stream count: TTFT (request written → first event read) p50 and p90 over every stream
 * of every run, the median over runs of the aggregate rate (streams × max-tokens / the
 * burst's wall time, first request written to last stream ended) with the lowest and highest
 * run, each stream's own rate after its first token ((events - 1) / first event to last
 * event: the decode rate a client sees, to set beside engine_bench's decode at as many
 * sequences) as the median over every stream of every run with the lowest and highest, and
 * how many streams ended with fewer events than tokens asked (0 when both servers stream one
 * event per token as they do). --json: one object per stream count.
 *
 * --text-bytes N: each prompt is N bytes of text (seeded prose, distinct per stream and run)
 * instead of token ids, so the server tokenizes it. --gateway-metrics (ringlm-gateway only):
 * the gateway's own time per request from a whole body to its submit to ringlmd (parse,
 * chat template, tokenize, the wait for a preparation thread, submit), the mean over every
 * request of the stream count's bursts, from ringlm_gateway_admission_seconds in its
 * /metrics read before and after them.
 *
 * --trace FILE: one line per stream, "STREAMS RUN INDEX SENT FIRST END", the times in ms from
 * the burst's start (FIRST -1: no event), to line up with ringlmd's logs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "perf/bench_util.h"

typedef struct stream {
    int fd;
    size_t sent, req_len;
    char req[8192];
    uint64_t t_sent, t_first, t_last, t_end; /* t_last: the read that brought the last event */
    int events;
    bool done, headers;
    char tail[16]; /* the last bytes read, so a marker split across reads is still seen */
    size_t tail_len;
} stream;

static const char *host = "127.0.0.1";
static FILE *trace; /* --trace FILE: one line per stream */
static int port, prompt_len = 32, max_tokens = 128, vocab = 32000, text_bytes;

static int connect_nb(void)
{
    int fd = bench_tcp_connect(host, port);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

static void build_request(stream *s, int idx, int run)
{
    char body[7168];
    int n;
    if (text_bytes) {
        char *text =
            bench_prose((size_t)text_bytes, (unsigned)idx * 7919u + (unsigned)run * 104729u + 1u);
        n = snprintf(body, sizeof body, "{\"prompt\":\"%s\"", text);
        free(text);
    } else {
        n = snprintf(body, sizeof body, "{\"prompt\":[");
    }
    for (int i = 0; !text_bytes && i < prompt_len && n < (int)sizeof body - 200; i++)
        n += snprintf(
            body + n, sizeof body - (size_t)n, "%s%d", i ? "," : "",
            /* distinct prompts: no server serves one from another's cache */
            1 + (int)(((unsigned)idx * 7919u + (unsigned)run * 104729u + (unsigned)i * 131u) %
                      (unsigned)(vocab - 1)));
    n += snprintf(body + n, sizeof body - (size_t)n,
                  "%s,\"max_tokens\":%d,\"temperature\":0,\"stream\":true,\"ignore_eos\":true}",
                  text_bytes ? "" : "]", max_tokens);
    s->req_len = (size_t)snprintf(s->req, sizeof s->req,
                                  "POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                                  "Content-Type: application/json\r\nContent-Length: %d\r\n"
                                  "Connection: close\r\n\r\n%s",
                                  host, port, n, body);
}

/* Counts "data: " events in the bytes read, and sees "data: [DONE]". A position is looked at
 * once 12 bytes from it are in (so a marker split across reads is seen whole); the last 11
 * bytes wait in the tail for the next read. */
static void scan(stream *s, const char *buf, size_t n, uint64_t now)
{
    char w[16 + 65536];
    memcpy(w, s->tail, s->tail_len);
    memcpy(w + s->tail_len, buf, n);
    const size_t len = s->tail_len + n;
    size_t i = 0;
    for (; i + 12 <= len; i++) {
        if (memcmp(w + i, "data: ", 6) != 0) continue;
        if (memcmp(w + i + 6, "[DONE]", 6) == 0) {
            s->done = true;
            continue;
        }
        if (!s->t_first) s->t_first = now;
        s->t_last = now;
        s->events++;
    }
    s->tail_len = len - i;
    memmove(s->tail, w + i, s->tail_len);
}

typedef struct result {
    double ttft_p50_ms, ttft_p90_ms, agg_med, agg_lo, agg_hi, stream_med, stream_lo, stream_hi;
    int short_streams;
} result;

static result burst(int n, int runs)
{
    /* each stream count's bursts have runs of their own: a stream of the 8-stream burst
     * must not find the prompt of the same stream of the 1-stream burst in a server's cache */
    static int bursts_before;
    double *ttft = malloc(sizeof(double) * (size_t)n * (size_t)runs);
    double *rate = malloc(sizeof(double) * (size_t)n * (size_t)runs);
    double agg[64] = {0};
    int n_ttft = 0, n_rate = 0, short_streams = 0;
    stream *ss = calloc((size_t)n, sizeof *ss);
    if (!ttft || !rate || !ss) bench_die("out of memory");
    for (int r = 0; r < runs && r < 64; r++) {
        int ep = epoll_create1(EPOLL_CLOEXEC);
        memset(ss, 0, sizeof *ss * (size_t)n);
        for (int i = 0; i < n; i++) {
            build_request(&ss[i], i, bursts_before + r);
            ss[i].fd = connect_nb();
            struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)i};
            epoll_ctl(ep, EPOLL_CTL_ADD, ss[i].fd, &ev);
        }
        const uint64_t t0 = bench_now_ns();
        int open = n;
        char buf[65536];
        while (open > 0) {
            struct epoll_event evs[64];
            int k = epoll_wait(ep, evs, 64, 60000);
            if (k == 0) bench_die("no progress for 60 s (%d streams open)", open);
            if (k < 0) {
                if (errno == EINTR) continue;
                bench_die("epoll_wait: %s", strerror(errno));
            }
            for (int e = 0; e < k; e++) {
                stream *s = &ss[evs[e].data.u32];
                if (s->done || s->fd < 0) continue;
                if (s->sent < s->req_len && (evs[e].events & EPOLLOUT)) {
                    ssize_t w = write(s->fd, s->req + s->sent, s->req_len - s->sent);
                    if (w > 0) {
                        if (!s->sent) s->t_sent = bench_now_ns();
                        s->sent += (size_t)w;
                    }
                    if (s->sent == s->req_len) {
                        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = evs[e].data.u32};
                        epoll_ctl(ep, EPOLL_CTL_MOD, s->fd, &ev);
                    }
                }
                if (evs[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                    for (;;) {
                        ssize_t m = read(s->fd, buf, sizeof buf);
                        if (m > 0) {
                            scan(s, buf, (size_t)m, bench_now_ns());
                            continue;
                        }
                        if (m == 0 || (errno != EAGAIN && errno != EINTR)) s->done = true;
                        break;
                    }
                    if (s->done) {
                        s->t_end = bench_now_ns();
                        close(s->fd);
                        s->fd = -1;
                        open--;
                    }
                }
            }
        }
        uint64_t t_last = t0;
        for (int i = 0; i < n; i++) {
            if (ss[i].t_end > t_last) t_last = ss[i].t_end;
            if (ss[i].t_first) ttft[n_ttft++] = (double)(ss[i].t_first - ss[i].t_sent) / 1e6;
            if (ss[i].events > 1 && ss[i].t_last > ss[i].t_first)
                rate[n_rate++] =
                    (double)(ss[i].events - 1) / ((double)(ss[i].t_last - ss[i].t_first) / 1e9);
            if (ss[i].events < max_tokens) short_streams++;
            if (trace)
                fprintf(trace, "%d %d %d %.3f %.3f %.3f\n", n, r, i,
                        (double)(ss[i].t_sent - t0) / 1e6,
                        ss[i].t_first ? (double)(ss[i].t_first - t0) / 1e6 : -1.0,
                        (double)(ss[i].t_end - t0) / 1e6);
        }
        agg[r] = (double)n * max_tokens / ((double)(t_last - t0) / 1e9);
        close(ep);
    }
    const int R = runs < 64 ? runs : 64;
    bursts_before += runs;
    result res = {.ttft_p50_ms = n_ttft ? bench_percentile(ttft, n_ttft, 0.5) : -1,
                  .ttft_p90_ms = n_ttft ? bench_percentile(ttft, n_ttft, 0.9) : -1,
                  .agg_med = bench_median(agg, R),
                  .short_streams = short_streams};
    res.stream_med = n_rate ? bench_median(rate, n_rate) : -1;
    res.stream_lo = res.stream_hi = n_rate ? rate[0] : -1;
    for (int i = 1; i < n_rate; i++) {
        res.stream_lo = rate[i] < res.stream_lo ? rate[i] : res.stream_lo;
        res.stream_hi = rate[i] > res.stream_hi ? rate[i] : res.stream_hi;
    }
    res.agg_lo = res.agg_hi = agg[0];
    for (int r = 1; r < R; r++) {
        res.agg_lo = agg[r] < res.agg_lo ? agg[r] : res.agg_lo;
        res.agg_hi = agg[r] > res.agg_hi ? agg[r] : res.agg_hi;
    }
    free(ttft);
    free(rate);
    free(ss);
    return res;
}

/* The gateway's ringlm_gateway_admission_seconds: out[0] its sum (s), out[1] its count. */
static void admission(double out[2])
{
    char *m = bench_http_get(port, "/metrics");
    if (!m || !strstr(m, "ringlm_gateway_admission_seconds_count"))
        bench_die("--gateway-metrics: no ringlm_gateway_admission_seconds at :%d/metrics", port);
    out[0] = bench_metric(m, "ringlm_gateway_admission_seconds_sum");
    out[1] = bench_metric(m, "ringlm_gateway_admission_seconds_count");
    free(m);
}

int main(int argc, char **argv)
{
    bench_prog = "http_stream_bench";
    const char *streams_arg = "1,8,32", *label = "server";
    int runs = 3, json = 0, gateway_metrics = 0;
    static const struct option opts[] = {{"port", required_argument, 0, 'p'},
                                         {"host", required_argument, 0, 'H'},
                                         {"streams", required_argument, 0, 's'},
                                         {"prompt-len", required_argument, 0, 'l'},
                                         {"text-bytes", required_argument, 0, 'T'},
                                         {"gateway-metrics", no_argument, 0, 'g'},
                                         {"max-tokens", required_argument, 0, 'n'},
                                         {"vocab", required_argument, 0, 'v'},
                                         {"runs", required_argument, 0, 'r'},
                                         {"label", required_argument, 0, 'L'},
                                         {"trace", required_argument, 0, 't'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'p': port = atoi(optarg); break;
        case 'H': host = optarg; break;
        case 's': streams_arg = optarg; break;
        case 'l': prompt_len = atoi(optarg); break;
        case 'T': text_bytes = atoi(optarg); break;
        case 'g': gateway_metrics = 1; break;
        case 'n': max_tokens = atoi(optarg); break;
        case 'v': vocab = atoi(optarg); break;
        case 'r': runs = atoi(optarg); break;
        case 'L': label = optarg; break;
        case 't':
            trace = fopen(optarg, "w");
            if (!trace) bench_die("--trace %s: %s", optarg, strerror(errno));
            break;
        case 'j': json = 1; break;
        default:
            fprintf(stderr,
                    "usage: http_stream_bench --port P [--host H] [--streams 1,8,32] "
                    "[--prompt-len 32] [--text-bytes N] [--max-tokens 128] [--vocab 32000] "
                    "[--runs 3] [--gateway-metrics] [--label NAME] [--trace FILE] [--json]\n");
            return 2;
        }
    }
    if (port <= 0 || prompt_len < 1 || prompt_len > 400 || max_tokens < 1 || vocab < 2 ||
        runs < 1 || runs > 64 || text_bytes < 0 || text_bytes > 6144)
        bench_die("--port is required; --prompt-len 1..400, --text-bytes 0..6144, "
                  "--max-tokens >= 1, --runs 1..64");
    if (!json)
        printf("http_stream_bench %s (%s:%d): %d-%s prompts, %d tokens each, %d runs\n"
               "%7s %13s %13s %30s %27s %6s%s\n",
               label, host, port, text_bytes ? text_bytes : prompt_len,
               text_bytes ? "byte text" : "token", max_tokens, runs, "streams", "TTFT p50 ms",
               "TTFT p90 ms", "aggregate tok/s med [lo, hi]", "stream tok/s med [lo, hi]", "short",
               gateway_metrics ? "  gateway ms/request" : "");
    for (char *p = (char *)streams_arg; *p;) {
        int n = (int)strtol(p, &p, 10);
        if (n < 1 || n > 1024) bench_die("--streams: 1..1024 each");
        double adm0[2] = {0, 0}, adm_ms = -1;
        if (gateway_metrics) admission(adm0);
        result r = burst(n, runs);
        if (gateway_metrics) {
            double adm1[2];
            admission(adm1);
            if (adm1[1] > adm0[1]) adm_ms = (adm1[0] - adm0[0]) * 1e3 / (adm1[1] - adm0[1]);
        }
        if (json)
            printf("{\"label\":\"%s\",\"streams\":%d,\"prompt_len\":%d,\"text_bytes\":%d,"
                   "\"max_tokens\":%d,\"runs\":%d,\"ttft_p50_ms\":%.2f,\"ttft_p90_ms\":%.2f,"
                   "\"agg_tok_s\":{\"median\":%.1f,\"lowest\":%.1f,\"highest\":%.1f},"
                   "\"stream_tok_s\":{\"median\":%.2f,\"lowest\":%.2f,\"highest\":%.2f},"
                   "\"short_streams\":%d,\"gateway_admission_ms\":%.3f}\n",
                   label, n, prompt_len, text_bytes, max_tokens, runs, r.ttft_p50_ms, r.ttft_p90_ms,
                   r.agg_med, r.agg_lo, r.agg_hi, r.stream_med, r.stream_lo, r.stream_hi,
                   r.short_streams, adm_ms);
        else if (gateway_metrics)
            printf("%7d %13.1f %13.1f %12.1f [%7.1f, %7.1f] %9.1f [%6.1f, %6.1f] %6d %19.3f\n", n,
                   r.ttft_p50_ms, r.ttft_p90_ms, r.agg_med, r.agg_lo, r.agg_hi, r.stream_med,
                   r.stream_lo, r.stream_hi, r.short_streams, adm_ms);
        else
            printf("%7d %13.1f %13.1f %12.1f [%7.1f, %7.1f] %9.1f [%6.1f, %6.1f] %6d\n", n,
                   r.ttft_p50_ms, r.ttft_p90_ms, r.agg_med, r.agg_lo, r.agg_hi, r.stream_med,
                   r.stream_lo, r.stream_hi, r.short_streams);
        fflush(stdout);
        if (*p == ',') p++;
    }
    if (trace) fclose(trace);
    return 0;
}
