/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_http.c — `ringlm replay --http URL`: the same trace, the same synthetic
 * prompts and the same report as the shared-memory path, through ringlm-gateway, so the two
 * are compared on one trace.
 *
 * Each request is one HTTP/1.0 connection (the answer ends with the connection: no chunked
 * framing to undo): POST /v1/completions with the prompt as token ids, max_tokens,
 * temperature, seed, stream with the usage chunk, the class and deadline in the "ringlm"
 * extension, and the Bearer key of the request's tenant (--api-keys). The times are the
 * client's: submit = the connection opened, first = the first SSE chunk, finish = its last
 * event; the token count is the usage chunk's completion_tokens. A trace cancel closes the
 * connection (the gateway cancels the request). A status other than 200 maps back to the
 * daemon's finish reason through the OpenAI error's code (429 queue_full → rejected
 * queue_full, 504 → timeout, ...), so the report's columns mean the same on both paths.
 */
#include "tools/replay.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "libclient/ringlm.h"
#include "tools/cli.h"
#include "formats/api_keys.h"

/* "http://HOST:PORT[/...]" → host, port; false when it is not that. */
static bool parse_url(const char *url, char *host, size_t host_cap, char *port, size_t port_cap)
{
    if (strncmp(url, "http://", 7)) return false;
    const char *h = url + 7, *end = h + strcspn(h, "/");
    const char *colon;
    if (*h == '[') { /* [v6]:port */
        const char *rb = memchr(h, ']', (size_t)(end - h));
        if (!rb || rb[1] != ':') return false;
        snprintf(host, host_cap, "%.*s", (int)(rb - h - 1), h + 1);
        colon = rb + 1;
    } else {
        colon = memchr(h, ':', (size_t)(end - h));
        if (!colon || colon == h) return false;
        snprintf(host, host_cap, "%.*s", (int)(colon - h), h);
    }
    snprintf(port, port_cap, "%.*s", (int)(end - colon - 1), colon + 1);
    return port[0] && strspn(port, "0123456789") == strlen(port);
}

static struct addrinfo *resolve(const char *url)
{
    char host[256], port[16];
    if (!parse_url(url, host, sizeof host, port, sizeof port))
        cli_die("--http '%s': expected http://HOST:PORT", url);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc) cli_die("--http %s: %s", url, gai_strerror(rc));
    return ai;
}

static int open_conn(const struct addrinfo *ai)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    return fd;
}

void replay_http_check(const replay_opts *ro, const trace *t)
{
    struct addrinfo *ai = resolve(ro->http_url);
    int fd = open_conn(ai);
    if (fd < 0) cli_die("--http %s: cannot connect: %s", ro->http_url, strerror(-fd));
    close(fd);
    freeaddrinfo(ai);
    if (!ro->api_keys) return;
    gw_keys keys = {0};
    char why[256];
    if (gw_keys_load(ro->api_keys, &keys, why, sizeof why) < 0) cli_die("--api-keys %s", why);
    for (int i = 0; i < t->tenants.n; i++) {
        bool found = false;
        for (size_t k = 0; k < keys.n && !found; k++)
            found = !strcmp(keys.v[k].tenant, t->tenants.v[i]);
        if (!found)
            cli_die("--api-keys %s has no key for the trace's tenant '%s'", ro->api_keys,
                    t->tenants.v[i]);
    }
    gw_keys_free(&keys);
}

/* One request on the wire. */
typedef struct hreq {
    int fd;
    uint32_t idx;
    int64_t submit_us, first_us, cancel_at_us;
    char *buf;
    size_t len, cap, scan; /* scan: the next SSE event starts here (after the header) */
    int status;            /* HTTP status, 0 until the header is whole */
    size_t body_at;
    bool sse, cancelled;
    uint32_t chunks, usage_tokens;
    bool have_usage;
    int finish_reason, reject_reason;
    char err_code[48];
} hreq;

static int reason_by_name(const char *code)
{
    for (int r = 1; r < 64; r++) {
        const char *n = ringlm_reason_name(r);
        if (n && !strcmp(n, code)) return r;
    }
    return 0;
}

/* An OpenAI error object → the finish the shm path would have seen. */
static void take_error(hreq *h, json_t *err)
{
    const char *code = json_string_value(json_object_get(err, "code"));
    snprintf(h->err_code, sizeof h->err_code, "%s", code ? code : "");
    int st = h->status;
    if (!strcmp(h->err_code, "timeout") || st == 504) {
        h->finish_reason = RINGLM_FINISH_TIMEOUT;
    } else if (!strcmp(h->err_code, "cancelled")) {
        h->finish_reason = RINGLM_FINISH_CANCELLED;
    } else if (reason_by_name(h->err_code)) {
        h->finish_reason = RINGLM_FINISH_REJECTED;
        h->reject_reason = reason_by_name(h->err_code);
    } else {
        h->finish_reason = RINGLM_FINISH_ERROR;
    }
}

/* One "data: ..." event of the stream. */
static void take_event(hreq *h, const char *d, size_t n, int64_t now)
{
    if (n == 6 && !memcmp(d, "[DONE]", 6)) return;
    json_error_t je;
    json_t *o = json_loadb(d, n, 0, &je);
    if (!o) return;
    json_t *err = json_object_get(o, "error");
    if (err) {
        take_error(h, err);
    } else {
        json_t *c = json_array_get(json_object_get(o, "choices"), 0);
        if (c) {
            if (h->first_us < 0) h->first_us = now;
            h->chunks++;
            const char *f = json_string_value(json_object_get(c, "finish_reason"));
            if (f)
                h->finish_reason = !strcmp(f, "stop") ? RINGLM_FINISH_STOP : RINGLM_FINISH_LENGTH;
        }
        json_t *u = json_object_get(o, "usage");
        if (json_is_object(u)) {
            h->usage_tokens = (uint32_t)json_integer_value(json_object_get(u, "completion_tokens"));
            h->have_usage = true;
        }
    }
    json_decref(o);
}

/* New bytes: the header once, then whole SSE events. */
static void parse(hreq *h, int64_t now)
{
    if (!h->status) {
        char *e = memmem(h->buf, h->len, "\r\n\r\n", 4);
        if (!e) return;
        if (sscanf(h->buf, "HTTP/%*s %d", &h->status) != 1) h->status = -1;
        *e = 0;
        h->sse = strcasestr(h->buf, "content-type: text/event-stream") != NULL;
        *e = '\r';
        h->body_at = h->scan = (size_t)(e - h->buf) + 4;
    }
    if (!h->sse) return; /* a whole JSON body: read at EOF */
    for (;;) {
        char *start = h->buf + h->scan;
        char *end = memmem(start, h->len - h->scan, "\n\n", 2);
        if (!end) return;
        if (end - start >= 6 && !memcmp(start, "data: ", 6))
            take_event(h, start + 6, (size_t)(end - start - 6), now);
        h->scan = (size_t)(end - h->buf) + 2;
    }
}

static void send_request(hreq *h, const treq *q, const trace *t, const replay_opts *ro,
                         const int32_t *ids, uint64_t seed, const gw_keys *keys)
{
    json_t *prompt = json_array();
    for (uint32_t j = 0; j < q->prompt_tokens; j++)
        json_array_append_new(prompt, json_integer(ids[j]));
    json_t *body = json_pack("{s:o, s:i, s:f, s:I, s:b, s:{s:b}}", "prompt", prompt, "max_tokens",
                             (int)q->max_tokens, "temperature", (double)ro->temperature, "seed",
                             (json_int_t)(seed & 0x7fffffffffffffffull), "stream", 1,
                             "stream_options", "include_usage", 1);
    if (!body) cli_die("out of memory");
    if (q->cls >= 0 || q->deadline_us > 0) {
        json_t *ext = json_object();
        if (q->cls >= 0) json_object_set_new(ext, "class", json_string(t->classes.v[q->cls]));
        if (q->deadline_us > 0)
            json_object_set_new(ext, "deadline_ms",
                                json_integer((json_int_t)((q->deadline_us + 999) / 1000)));
        json_object_set_new(body, "ringlm", ext);
    }
    char *b = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!b) cli_die("out of memory");
    const char *key = NULL;
    for (size_t k = 0; keys && q->tenant >= 0 && k < keys->n && !key; k++)
        if (!strcmp(keys->v[k].tenant, t->tenants.v[q->tenant])) key = keys->v[k].key;
    char *req;
    int n = asprintf(
        &req,
        "POST /v1/completions HTTP/1.0\r\nHost: ringlm\r\nContent-Type: application/json\r\n"
        "%s%s%sContent-Length: %zu\r\n\r\n%s",
        key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "", strlen(b), b);
    free(b);
    if (n < 0) cli_die("out of memory");
    /* Small next to the socket buffer: a blocking send completes at once. */
    size_t off = 0;
    while (off < (size_t)n) {
        ssize_t w = send(h->fd, req + off, (size_t)n - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; /* the answer (or EOF) tells */
        off += (size_t)w;
    }
    free(req);
    fcntl(h->fd, F_SETFL, fcntl(h->fd, F_GETFL) | O_NONBLOCK);
}

/* The request's answer is complete (EOF) or given up: its result. */
static rrec finish(hreq *h, int64_t now, int fail_status)
{
    rrec e = {.idx = h->idx,
              .submit_us = h->submit_us,
              .first_us = h->first_us,
              .finish_us = now,
              .n_tokens = h->have_usage ? h->usage_tokens : h->chunks};
    if (h->cancelled) {
        e.finish_reason = RINGLM_FINISH_CANCELLED;
    } else if (fail_status) {
        e.status = fail_status;
    } else if (h->status == 200 && h->sse) {
        e.finish_reason = h->finish_reason;
        e.reject_reason = h->reject_reason;
        if (!e.finish_reason) e.status = -EPIPE; /* the stream ended without its end */
    } else if (h->status > 0) {
        json_error_t je;
        json_t *o = json_loadb(h->buf + h->body_at, h->len - h->body_at, 0, &je);
        json_t *err = json_object_get(o, "error");
        if (err) take_error(h, err);
        json_decref(o);
        e.finish_reason = h->finish_reason;
        e.reject_reason = h->reject_reason;
        e.n_tokens = 0;
        if (!e.finish_reason) e.status = -EPROTO;
    } else {
        e.status = -EPIPE;
    }
    return e;
}

void replay_http_child_main(int k, const trace *t, const replay_opts *ro, uint64_t t0, int fd)
{
    struct addrinfo *ai = resolve(ro->http_url);
    gw_keys keys = {0};
    char why[256];
    if (ro->api_keys && gw_keys_load(ro->api_keys, &keys, why, sizeof why) < 0)
        cli_die("--api-keys %s", why);
    uint32_t max_prompt = 1;
    for (size_t i = (size_t)k; i < t->n; i += (size_t)ro->clients)
        if (t->r[i].prompt_tokens > max_prompt) max_prompt = t->r[i].prompt_tokens;
    int32_t *ids = cli_realloc(NULL, sizeof(int32_t) * max_prompt);
    size_t fl_cap = 64, fl_n = 0;
    hreq *fl = cli_calloc(fl_cap, sizeof *fl);
    struct pollfd *pf = cli_calloc(fl_cap, sizeof *pf);
    size_t next = (size_t)k;
    int64_t last_arrival = t->n ? t->r[t->n - 1].arrival_us : 0;
    int64_t give_up_us = last_arrival + (int64_t)(ro->drain_timeout_s * 1e6);
    for (;;) {
        int64_t now = (int64_t)(cli_now_us() - t0);
        /* submit what is due (open loop) */
        while (next < t->n && t->r[next].arrival_us <= now) {
            const treq *q = &t->r[next];
            uint64_t seed = replay_prompt(ro, next, q->prompt_tokens, ids);
            int64_t sub = (int64_t)(cli_now_us() - t0);
            int c = open_conn(ai);
            if (c < 0) {
                rrec e = {.idx = (uint32_t)next,
                          .status = c,
                          .submit_us = sub,
                          .first_us = -1,
                          .finish_us = sub};
                replay_put_rec(fd, &e);
            } else {
                if (fl_n == fl_cap) {
                    fl = cli_realloc(fl, (fl_cap *= 2) * sizeof *fl);
                    pf = cli_realloc(pf, fl_cap * sizeof *pf);
                }
                hreq *h = &fl[fl_n++];
                *h =
                    (hreq){.fd = c,
                           .idx = (uint32_t)next,
                           .submit_us = sub,
                           .first_us = -1,
                           .cancel_at_us = q->cancel_after_us >= 0 ? sub + q->cancel_after_us : -1};
                send_request(h, q, t, ro, ids, seed, &keys);
            }
            next += (size_t)ro->clients;
        }
        if (next >= t->n && fl_n == 0) break;
        now = (int64_t)(cli_now_us() - t0);
        if (now > give_up_us) break;
        /* cancels due: hang up (the gateway cancels the request in ringlmd) */
        int64_t wake = next < t->n ? t->r[next].arrival_us : now + 50000;
        for (size_t i = 0; i < fl_n; i++) {
            hreq *h = &fl[i];
            if (h->cancel_at_us < 0 || h->cancelled) continue;
            if (h->cancel_at_us <= now && !h->finish_reason) {
                h->cancelled = true;
                shutdown(h->fd, SHUT_RDWR);
            } else if (h->cancel_at_us < wake) {
                wake = h->cancel_at_us;
            }
        }
        for (size_t i = 0; i < fl_n; i++) pf[i] = (struct pollfd){.fd = fl[i].fd, .events = POLLIN};
        int timeout_ms = wake <= now ? 0 : (int)((wake - now + 999) / 1000);
        if (timeout_ms > 50) timeout_ms = 50;
        int np = poll(pf, (nfds_t)fl_n, timeout_ms);
        if (np < 0 && errno != EINTR) cli_die("poll: %s", strerror(errno));
        int64_t tev = (int64_t)(cli_now_us() - t0);
        for (size_t i = 0; i < fl_n; i++) {
            if (!pf[i].revents) continue;
            hreq *h = &fl[i];
            bool eof = false;
            for (;;) {
                if (h->cap - h->len < 4096)
                    h->buf = cli_realloc(h->buf, h->cap = h->cap ? h->cap * 2 : 8192);
                ssize_t r = recv(h->fd, h->buf + h->len, h->cap - h->len - 1, 0);
                if (r > 0) {
                    h->len += (size_t)r;
                    h->buf[h->len] = 0;
                    continue;
                }
                if (r < 0 && errno == EINTR) continue;
                eof = r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
                break;
            }
            if (h->len) parse(h, tev);
            if (eof || h->cancelled) {
                rrec e = finish(h, tev, 0);
                replay_put_rec(fd, &e);
                close(h->fd);
                free(h->buf);
                fl[i] = fl[--fl_n];
                pf[i] = pf[fl_n];
                i--;
            }
        }
    }
    /* whatever is left never finished within --drain-timeout */
    int64_t end = (int64_t)(cli_now_us() - t0);
    for (size_t i = 0; i < fl_n; i++) {
        rrec e = finish(&fl[i], end, -ETIMEDOUT);
        e.finish_reason = 0;
        replay_put_rec(fd, &e);
        close(fl[i].fd);
        free(fl[i].buf);
    }
    for (; next < t->n; next += (size_t)ro->clients) {
        rrec e = {.idx = (uint32_t)next, .status = -ETIMEDOUT, .first_us = -1};
        replay_put_rec(fd, &e);
    }
    gw_keys_free(&keys);
    freeaddrinfo(ai);
    free(ids);
    free(fl);
    free(pf);
    close(fd);
    _exit(0);
}
