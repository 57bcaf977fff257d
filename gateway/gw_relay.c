/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_relay.c — --daemon-metrics ADDR:PORT (once per daemon): the daemons' vllm:*
 * families on the gateway's own /metrics, several daemons' as one server's (gw_agg.h).
 *
 * Fleet routers scrape a model server's metrics where they send its requests (vLLM serves
 * both on one port): the Inference Extension's EPP reads vllm:num_requests_waiting,
 * vllm:num_requests_running and vllm:kv_cache_usage_perc there. ringlmd serves them on its
 * own port, so the relay thread scrapes that every RELAY_PERIOD_MS (ringlmd publishes a
 * snapshot every 100 ms) and keeps the vllm:* lines; /metrics appends the last copy without
 * waiting for the daemon. Every socket operation has a timeout: a daemon that stops
 * answering leaves its gauges out (its counters keep their last values, gw_agg.h) and, when
 * none answers, every line (ringlm_gateway_daemon_metrics_up 0); it never stalls the
 * gateway.
 */
#include "gateway/gw_internal.h"
#include "gateway/gw_agg.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define RELAY_PERIOD_MS  100
#define RELAY_TIMEOUT_MS 1000
#define RELAY_MAX_BYTES  (4u << 20)

int gw_relay_resolve(const char *spec, struct addrinfo **out)
{
    char host[256] = "127.0.0.1";
    const char *port = spec;
    const char *colon = strrchr(spec, ':');
    if (colon) {
        const char *h = spec;
        size_t n = (size_t)(colon - spec);
        if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
            h++;
            n -= 2;
        }
        if (n >= sizeof host) return -EINVAL;
        if (n) {
            memcpy(host, h, n);
            host[n] = 0;
        }
        port = colon + 1;
    }
    if (!*port || strspn(port, "0123456789") != strlen(port)) return -EINVAL;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    return getaddrinfo(host, port, &hints, out) ? -EINVAL : 0;
}

/* GET /metrics with every step bounded by RELAY_TIMEOUT_MS; the body, or NULL. */
static char *fetch(const struct addrinfo *ai)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return NULL;
    struct timeval tv = {.tv_sec = RELAY_TIMEOUT_MS / 1000,
                         .tv_usec = (RELAY_TIMEOUT_MS % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* bounds connect() too */
    gw_buf b = {0};
    static const char req[] = "GET /metrics HTTP/1.0\r\nHost: ringlmd\r\n\r\n";
    uint64_t deadline = gw_now_us() + RELAY_TIMEOUT_MS * 1000ull;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 ||
        send(fd, req, sizeof req - 1, MSG_NOSIGNAL) < 0)
        goto fail;
    char chunk[16384];
    for (;;) {
        ssize_t n = recv(fd, chunk, sizeof chunk, 0);
        if (n == 0) break;
        if (n < 0 || b.len + (size_t)n > RELAY_MAX_BYTES || gw_now_us() > deadline ||
            gw_buf_add(&b, chunk, (size_t)n))
            goto fail;
    }
    close(fd);
    if (b.len < 12 || strncmp(b.p, "HTTP/1.", 7) || strncmp(b.p + 8, " 200", 4)) goto fail_closed;
    char *body = strstr(b.p, "\r\n\r\n");
    if (!body) goto fail_closed;
    char *out = strdup(body + 4);
    gw_buf_free(&b);
    return out;
fail:
    close(fd);
fail_closed:
    gw_buf_free(&b);
    return NULL;
}

/* The vllm:* samples and their HELP/TYPE lines. */
static char *vllm_lines(const char *text)
{
    gw_buf o = {0};
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        if ((n > 5 && !strncmp(p, "vllm:", 5)) ||
            (n > 12 && (!strncmp(p, "# HELP vllm:", 12) || !strncmp(p, "# TYPE vllm:", 12)))) {
            gw_buf_add(&o, p, n);
            gw_buf_adds(&o, "\n");
        }
        p += n + (nl ? 1 : 0);
    }
    return o.p ? o.p : strdup("");
}

void *gw_relay_main(void *arg)
{
    gw_server *s = arg;
    char *last[GW_MAX_DAEMONS] = {0}; /* each daemon's last good lines (this thread's) */
    bool ok[GW_MAX_DAEMONS] = {0};
    for (;;) {
        int n_up = 0;
        for (int i = 0; i < s->n_relay; i++) {
            char *text = fetch(s->relay_ai[i]);
            char *lines = text ? vllm_lines(text) : NULL;
            free(text);
            ok[i] = lines != NULL;
            n_up += ok[i];
            if (lines) {
                free(last[i]);
                last[i] = lines;
            }
        }
        char *agg = gw_agg_vllm((const char *const *)last, ok, s->n_relay, gw_model(s));
        pthread_mutex_lock(&s->mu);
        if (agg) {
            free(s->relay_text);
            s->relay_text = agg;
        }
        s->relay_up = n_up;
        memcpy(s->relay_ok, ok, sizeof ok);
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += RELAY_PERIOD_MS * 1000000l;
        dl.tv_sec += dl.tv_nsec / 1000000000l;
        dl.tv_nsec %= 1000000000l;
        if (!s->stopping) pthread_cond_timedwait(&s->cv, &s->mu, &dl);
        bool stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
    }
    for (int i = 0; i < s->n_relay; i++) free(last[i]);
    return NULL;
}
