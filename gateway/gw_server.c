/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_server.c — ringlm-gateway's HTTP side (see gw_internal.h for the files and a
 * request's life): libmicrohttpd's callbacks — routing, methods, API keys, body limits —
 * the answers, and the server's start, drain and stop.
 */
#include "gateway/gw_internal.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

void gw_log(gw_server *s, const char *fmt, ...)
{
    if (s->cfg.quiet) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("ringlm-gateway: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* libmicrohttpd's own messages ("Server reached connection limit...") come once per refused
 * connection: under a flood, at most one line a second, with the count of those left out. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    gw_server *s = cls;
    static uint64_t last_us, dropped;
    uint64_t now = gw_now_us();
    if (last_us && now - last_us < 1000000u) { /* libmicrohttpd's thread only */
        dropped++;
        return;
    }
    last_us = now;
    if (s->cfg.quiet) return;
    fputs("ringlm-gateway: libmicrohttpd: ", stderr);
    if (dropped)
        fprintf(stderr, "(%llu messages in the last second left out) ",
                (unsigned long long)dropped);
    dropped = 0;
    vfprintf(stderr, fmt, ap);
    if (!strchr(fmt, '\n')) fputc('\n', stderr);
}

/* ---- HTTP answers ---------------------------------------------------------------------- */
enum MHD_Result gw_queue(gw_req *r, struct MHD_Connection *c, unsigned status,
                         struct MHD_Response *resp)
{
    if (r && r->defer_queue) {
        if (r->q_resp) MHD_destroy_response(r->q_resp); /* never two: the last one wins */
        r->q_resp = resp;
        r->q_status = status;
        return MHD_YES;
    }
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

enum MHD_Result gw_answer(gw_req *r, struct MHD_Connection *c, int status, const char *ctype,
                          char *body /* malloc'ed, taken */)
{
    if (!body) return MHD_NO;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (status == 429 || status == 503) MHD_add_response_header(resp, "Retry-After", "1");
    if (r && r->close_after) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    if (!c) { /* a preparation thread: the HTTP thread queues it (gw_prep.c) */
        if (!r) {
            MHD_destroy_response(resp);
            return MHD_NO;
        }
        if (r->prep_resp) MHD_destroy_response(r->prep_resp);
        r->prep_resp = resp;
        r->prep_status = status;
        return MHD_YES;
    }
    if (r) {
        r->status = status;
        r->state = RQ_ANSWERED;
    }
    return gw_queue(r, c, (unsigned)status, resp);
}

enum MHD_Result gw_answer_json(gw_req *r, struct MHD_Connection *c, int status, json_t *o)
{
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return gw_answer(r, c, status, "application/json", t);
}

enum MHD_Result gw_answer_err(gw_req *r, struct MHD_Connection *c, const gw_err *e)
{
    return gw_answer(r, c, e->status, "application/json", gw_err_json(e));
}

enum MHD_Result gw_answer_errf(gw_req *r, struct MHD_Connection *c, int status, const char *code,
                               const char *msg)
{
    gw_err e;
    gw_err_set(&e, status, code, NULL, "%s", msg);
    return gw_answer_err(r, c, &e);
}


/* ---- routing --------------------------------------------------------------------------- */
static enum ep route(const char *url)
{
    if (!strcmp(url, "/v1/completions")) return EP_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return EP_CHAT;
    if (!strcmp(url, "/v1/responses")) return EP_RESPONSES;
    if (!strcmp(url, "/v1/models")) return EP_MODELS;
    if (!strcmp(url, "/health")) return EP_HEALTH;
    if (!strcmp(url, "/tokenize")) return EP_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return EP_DETOKENIZE;
    if (!strcmp(url, "/metrics")) return EP_METRICS;
    return EP_OTHER;
}

static bool ep_is_post(enum ep e)
{
    return e == EP_COMPLETIONS || e == EP_CHAT || e == EP_RESPONSES || e == EP_TOKENIZE ||
           e == EP_DETOKENIZE;
}

/* The key of "Authorization: Bearer KEY"; -1 when keys are configured and it is missing or
 * unknown. */
static int authenticate(gw_server *s, struct MHD_Connection *c, const gw_key **key)
{
    *key = NULL;
    if (!s->cfg.keys) return 0;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return -1;
    h += 7;
    while (*h == ' ') h++;
    size_t n = strlen(h);
    while (n && h[n - 1] == ' ') n--;
    *key = gw_keys_find(s->cfg.keys, h, n);
    return *key ? 0 : -1;
}

/* RFC 9112 framing: a request whose body length is ambiguous (Content-Length beside
 * Transfer-Encoding, or two Content-Lengths) may be read differently by a proxy in front of
 * us, so the bytes after what we take for its end could be a second request smuggled past
 * the proxy: it gets 400 and the connection is closed after the answer (§6.3), nothing more
 * is read from it. An HTTP/1.1 request without exactly one Host gets 400 (§3.2). */
struct framing {
    unsigned host, content_length, transfer_encoding;
};

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key,
                                     const char *value)
{
    (void)kind;
    (void)value;
    struct framing *f = cls;
    if (!strcasecmp(key, MHD_HTTP_HEADER_HOST)) f->host++;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) f->content_length++;
    if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) f->transfer_encoding++;
    return MHD_YES;
}

/* NULL when the head frames the request unambiguously; else why not (400, close). */
static const char *bad_framing(struct MHD_Connection *c, const char *version)
{
    struct framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
    if (f.transfer_encoding && f.content_length)
        return "a request must not carry both Content-Length and Transfer-Encoding";
    if (f.content_length > 1) return "a request must carry at most one Content-Length";
    if (f.host > 1) return "a request must carry one Host header, not several";
    if (!f.host && version && strcmp(version, MHD_HTTP_VERSION_1_0))
        return "an HTTP/1.1 request must carry a Host header";
    return NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    gw_server *s = cls;
    gw_req *r = *con_cls;
    if (!r) {
        enum ep ep = route(url);
        r = gw_req_new(s, ep, c);
        if (!r) return MHD_NO;
        *con_cls = r;
        gw_guard_phase(s, c, GW_CONN_BODY);
        const char *framing = bad_framing(c, version);
        if (framing) {
            r->close_after = true;
            return gw_answer_errf(r, c, 400, "bad_request", framing);
        }
        if (ep == EP_OTHER) return gw_answer_errf(r, c, 404, "not_found", "no such endpoint");
        bool post = !strcmp(method, "POST");
        if (ep_is_post(ep) != post || (!post && strcmp(method, "GET") && strcmp(method, "HEAD")))
            return gw_answer_errf(r, c, 405, "method_not_allowed",
                                  ep_is_post(ep) ? "use POST" : "use GET");
        if (ep != EP_HEALTH && ep != EP_METRICS && authenticate(s, c, &r->key) < 0) {
            gw_err e;
            gw_err_set(&e, 401, "invalid_api_key", NULL,
                       "missing or unknown API key (send 'Authorization: Bearer KEY')");
            return gw_answer_err(r, c, &e);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (post && cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) {
            char m[128];
            snprintf(m, sizeof m, "the body is larger than %zu bytes", s->cfg.max_body_bytes);
            return gw_answer_errf(r, c, 413, "body_too_large", m);
        }
        return MHD_YES;
    }
    if (!r->body_done && *upload_size) {
        if (!r->too_big && r->body.len + *upload_size > s->cfg.max_body_bytes) {
            r->too_big = true;
            gw_buf_free(&r->body);
        }
        if (!r->too_big && gw_buf_add(&r->body, upload, *upload_size)) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (!r->body_done) {
        r->body_done = true;
        gw_guard_phase(s, c, GW_CONN_SERVED);
        if (r->too_big) {
            char m[128];
            snprintf(m, sizeof m, "the body is larger than %zu bytes", s->cfg.max_body_bytes);
            return gw_answer_errf(r, c, 413, "body_too_large", m);
        }
        switch (r->ep) {
        case EP_COMPLETIONS:
        case EP_CHAT:
        case EP_RESPONSES:
        case EP_TOKENIZE:
        case EP_DETOKENIZE: return gw_prep_queue(s, r, c);
        case EP_MODELS: return gw_ep_models(s, r, c);
        case EP_HEALTH: return gw_ep_health(s, r, c);
        case EP_METRICS: return gw_ep_metrics(s, r, c);
        default: return gw_answer_errf(r, c, 404, "not_found", "no such endpoint");
        }
    }
    if (*upload_size) {
        *upload_size = 0; /* answered early (401, 413): the rest of the body is dropped */
        return MHD_YES;
    }
    /* resumed: its first event, or its preparation ended */
    enum MHD_Result ret = MHD_YES;
    pthread_mutex_lock(&s->mu);
    r->defer_queue = true;
    if (r->state == RQ_WAIT)
        ret = gw_resumed(s, r, c);
    else if (r->state == RQ_PREP || r->state == RQ_READY)
        ret = gw_prep_resumed(s, r, c);
    r->defer_queue = false;
    struct MHD_Response *resp = r->q_resp;
    unsigned status = r->q_status;
    r->q_resp = NULL;
    pthread_mutex_unlock(&s->mu);
    /* r is not touched past here: only this thread frees it (on_completed), but another
     * thread may change it under mu. */
    if (resp) {
        enum MHD_Result q = MHD_queue_response(c, status, resp);
        MHD_destroy_response(resp);
        if (ret == MHD_YES) ret = q;
    }
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    gw_server *s = cls;
    gw_req *r = *con_cls;
    gw_guard_phase(s, c, GW_CONN_HEAD); /* kept alive: the next head has its deadline */
    if (!r) return;
    *con_cls = NULL;
    pthread_mutex_lock(&s->mu);
    s->req_count[r->ep][gw_stat_slot(r->status ? r->status : 500)]++;
    gw_unwatch(s, r);
    if (r->state == RQ_STREAM) s->n_streams--;
    r->http_done = true;
    r->conn = NULL;
    r->suspended = false;
    if (r->in_prep) {
        r->gone = true; /* its preparation thread frees it (gw_prep.c) */
    } else if (!gw_all_done(r) && (r->submitted || r->queued)) {
        r->gone = true;
        if (r->submitted)
            gw_cancel_locked(s, r);
        else
            gw_daemon_end(s, r); /* never reached the daemon: frees r */
    } else {
        gw_req_free(s, r);
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- life ------------------------------------------------------------------------------ */
int gw_server_start(const gw_cfg *cfg, gw_server **out)
{
    gw_server *s = calloc(1, sizeof *s);
    if (!s) return -ENOMEM;
    s->cfg = *cfg;
    s->epfd = -1;
    s->stop_efd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->conn_mu, NULL);
    pthread_cond_init(&s->guard_cv, NULL);
    pthread_cond_init(&s->prep_cv, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->rng = gw_now_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;
    snprintf(s->id_prefix, sizeof s->id_prefix, "%06llx",
             (unsigned long long)(gw_xorshift(&s->rng) & 0xffffff));
    s->tool_marker = -1;
    const char *marker = gw_tool_parser_marker(cfg->tool_parser);
    if (marker && cfg->tok) {
        /* one control token (SentencePiece may put its dummy prefix's space before it) */
        int32_t ids[4];
        int n = ringlm_tokenize(cfg->tok, marker, 0, ids, 4);
        for (int i = 0; i < n && n <= 2; i++) {
            const char *text = NULL;
            if (ringlm_token_text(cfg->tok, -1, ids[i], &text) == 0 && !text[0])
                s->tool_marker = ids[i];
        }
    }
    s->model = cfg->served_model ? cfg->served_model : "ringlm";
    json_t *mj = json_string(s->model);
    s->model_json = mj ? json_dumps(mj, JSON_ENCODE_ANY) : NULL;
    json_decref(mj);
    int per_daemon = cfg->sessions ? (int)cfg->sessions : 1;
    s->n_daemons = cfg->n_sockets ? (int)cfg->n_sockets : 1;
    s->n_sess = per_daemon * s->n_daemons;
    s->sess = calloc((size_t)s->n_sess, sizeof *s->sess);
    int rc = -ENOMEM;
    if (!s->model_json || !s->sess) goto fail;
    if (s->n_daemons > 1 && !(s->route = gw_route_new(cfg->affinity_block_tokens))) goto fail;
    for (int i = 0; i < s->n_sess; i++) {
        s->sess[i].s = s;
        s->sess[i].idx = i;
        s->sess[i].daemon = i / per_daemon;
        s->sess[i].socket_path =
            cfg->n_sockets ? cfg->sockets[s->sess[i].daemon] : cfg->socket_path;
    }

    /* API keys that the daemon's policy would not honour refuse the start (a daemon that is
     * not up yet is checked at each session's connect instead). */
    ringlm_client *probe;
    if (cfg->keys && ringlm_connect(s->sess[0].socket_path, &probe) == 0) {
        char why[768];
        int bad = gw_check_daemon(cfg, probe, why, sizeof why);
        ringlm_close(probe);
        if (bad) {
            fprintf(stderr, "ringlm-gateway: %s\n", why);
            rc = -EPERM;
            goto fail;
        }
    }

    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    s->stop_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->epfd < 0 || s->stop_efd < 0) {
        rc = -errno;
        goto fail;
    }
    struct epoll_event sev = {.events = EPOLLIN, .data.u64 = 0};
    epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->stop_efd, &sev);

    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    const char *addr = cfg->listen_addr ? cfg->listen_addr : "127.0.0.1";
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, addr, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons(cfg->port);
    } else if (inet_pton(AF_INET6, addr, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(cfg->port);
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "ringlm-gateway: --listen address '%s' is not an IPv4 or IPv6 literal\n",
                addr);
        rc = -EINVAL;
        goto fail;
    }
    /* gw_guard_accept keeps --max-connections; libmicrohttpd's own limit leaves room for
     * the connections it cut and libmicrohttpd has not closed yet. */
    s->mhd = MHD_start_daemon(
        flags, cfg->port, gw_guard_accept, s, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
        s, /* first: libmicrohttpd logs the options after it with its own logger */
        MHD_OPTION_SOCK_ADDR, &ss, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, gw_guard_notify, s, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)cfg->http_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)cfg->max_connections + GW_CUT_SLACK, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)cfg->max_connections_per_addr, MHD_OPTION_END);
    if (!s->mhd) {
        fprintf(stderr, "ringlm-gateway: cannot listen on %s:%u (in use? no permission?)\n", addr,
                (unsigned)cfg->port);
        rc = -EADDRINUSE;
        goto fail;
    }
    if ((rc = gw_guard_start(s)) < 0 || (rc = gw_prep_start(s)) < 0) goto fail;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    if (cfg->n_daemon_metrics) {
        for (unsigned i = 0; i < cfg->n_daemon_metrics && i < GW_MAX_DAEMONS; i++) {
            if (gw_relay_resolve(cfg->daemon_metrics[i], &s->relay_ai[i]) < 0) {
                fprintf(stderr,
                        "ringlm-gateway: --daemon-metrics '%s': expected ADDR:PORT or PORT\n",
                        cfg->daemon_metrics[i]);
                rc = -EINVAL;
                goto fail;
            }
            s->n_relay = (int)i + 1;
        }
        if (pthread_create(&s->relay_thread, NULL, gw_relay_main, s)) {
            rc = -EAGAIN;
            goto fail;
        }
        s->relay_started = true;
    }
    for (int i = 0; i < s->n_sess; i++) {
        if (pthread_create(&s->sess[i].thread, NULL, gw_events_main, &s->sess[i])) {
            rc = -EAGAIN;
            goto fail;
        }
        s->sess[i].started = true;
    }
    if (pthread_create(&s->watch_thread, NULL, gw_watch_main, s)) {
        rc = -EAGAIN;
        goto fail;
    }
    s->watch_started = true;
    *out = s;
    return 0;
fail:
    gw_server_stop(s);
    return rc;
}

uint16_t gw_server_port(const gw_server *s)
{
    return s->port;
}

static void deadline_in(struct timespec *dl, unsigned ms)
{
    clock_gettime(CLOCK_REALTIME, dl);
    dl->tv_sec += ms / 1000;
    dl->tv_nsec += (long)(ms % 1000) * 1000000l;
    dl->tv_sec += dl->tv_nsec / 1000000000l;
    dl->tv_nsec %= 1000000000l;
}

void gw_server_drain(gw_server *s, unsigned grace_ms)
{
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    pthread_mutex_unlock(&s->mu);
    MHD_socket lfd = MHD_quiesce_daemon(s->mhd);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    struct timespec dl;
    deadline_in(&dl, grace_ms);
    pthread_mutex_lock(&s->mu);
    gw_log(s, "draining: %zu requests in flight, %u ms to finish", s->n_gen_live, grace_ms);
    while (s->n_gen_live && pthread_cond_timedwait(&s->cv, &s->mu, &dl) != ETIMEDOUT)
        ;
    if (s->n_gen_live) {
        gw_log(s, "drain: cancelling %zu requests after the grace period", s->n_gen_live);
        gw_cancel_all_locked(s);
        deadline_in(&dl, 3000);
        while (s->n_gen_live && pthread_cond_timedwait(&s->cv, &s->mu, &dl) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&s->mu);
}

int gw_server_stop(gw_server *s)
{
    if (!s) return 0;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    gw_sessions_wake_all_locked(s);
    /* libmicrohttpd must not be stopped with suspended connections. */
    for (int b = 0; b < GW_HBUCKETS; b++)
        for (gw_req *r = s->by_serial[b]; r; r = r->serial_next) {
            r->gone = true;
            gw_wake(r);
        }
    pthread_mutex_unlock(&s->mu);
    gw_guard_stop(s);
    if (s->mhd) MHD_stop_daemon(s->mhd);
    for (int i = 0; s->sess && i < s->n_sess; i++)
        if (s->sess[i].started) pthread_join(s->sess[i].thread, NULL);
    if (!gw_prep_stop(s)) {
        gw_log(s, "stop: a tokenizer thread is still busy; exiting without freeing what it uses");
        return -EBUSY;
    }
    if (s->relay_started) pthread_join(s->relay_thread, NULL);
    for (int i = 0; i < s->n_relay; i++)
        if (s->relay_ai[i]) freeaddrinfo(s->relay_ai[i]);
    free(s->relay_text);
    if (s->watch_started) {
        uint64_t one = 1;
        ssize_t w = write(s->stop_efd, &one, sizeof one);
        (void)w;
        pthread_join(s->watch_thread, NULL);
    }
    pthread_mutex_lock(&s->mu);
    gw_free_all_locked(s);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; s->sess && i < s->n_sess; i++)
        if (s->sess[i].client) ringlm_close(s->sess[i].client);
    free(s->sess);
    gw_route_free(s->route);
    if (s->epfd >= 0) close(s->epfd);
    if (s->stop_efd >= 0) close(s->stop_efd);
    free(s->model_json);
    free(s->model_learned);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->prep_cv);
    pthread_mutex_destroy(&s->conn_mu);
    pthread_cond_destroy(&s->guard_cv);
    free(s);
    return 0;
}