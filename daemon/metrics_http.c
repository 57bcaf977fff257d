/* SPDX-License-Identifier: MIT */
/*
 * daemon/metrics_http.c — the /metrics HTTP server: libmicrohttpd on its own thread, GET and
 * HEAD only, each connection bounded in number, per address, idle time and lifetime (a
 * watchdog thread cuts the ones that trickle). Scrapes render the newest published snapshot
 * (metrics_render).
 */
#include "daemon/metrics_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_size, void **req_cls);

/* "ADDR:PORT" | ":PORT" | "PORT" | "[v6]:PORT" → sockaddr. */
static int parse_listen(const char *spec, struct sockaddr_storage *ss, socklen_t *slen)
{
    char host[128] = "127.0.0.1";
    const char *port_s;
    const char *colon = strrchr(spec, ':');
    if (spec[0] == '[') {
        const char *rb = strchr(spec, ']');
        if (!rb || rb[1] != ':' || (size_t)(rb - spec - 1) >= sizeof host)
            return seterr(-EINVAL, "metrics listen '%s': expected [IPv6]:PORT", spec);
        memcpy(host, spec + 1, (size_t)(rb - spec - 1));
        host[rb - spec - 1] = 0;
        port_s = rb + 2;
    } else if (colon) {
        size_t hl = (size_t)(colon - spec);
        if (hl >= sizeof host)
            return seterr(-EINVAL, "metrics listen '%s': address too long", spec);
        if (hl > 0) {
            memcpy(host, spec, hl);
            host[hl] = 0;
        }
        port_s = colon + 1;
    } else {
        port_s = spec;
    }
    char *end;
    errno = 0;
    long port = strtol(port_s, &end, 10);
    if (!*port_s || *end || errno || port < 0 || port > 65535)
        return seterr(-EINVAL, "metrics listen '%s': port '%s' is not 0..65535", spec, port_s);
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (strcmp(host, "localhost") == 0) strcpy(host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *slen = sizeof *a4;
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *slen = sizeof *a6;
    } else {
        return seterr(-EINVAL, "metrics listen '%s': '%s' is not a numeric IPv4/IPv6 address", spec,
                      host);
    }
    return 0;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void http_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode toe)
{
    metrics *m = cls;
    pthread_mutex_lock(&m->guard_mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        for (int i = 0; ci && i < HTTP_TABLE; i++) {
            struct http_conn *k = &m->conns[i];
            if (k->fd < 0) {
                *k = (struct http_conn){.fd = ci->connect_fd, .t0_ms = mono_ms()};
                if (ai && ai->client_addr)
                    memcpy(&k->peer, ai->client_addr,
                           ai->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                  : sizeof(struct sockaddr_in));
                *socket_context = (void *)(intptr_t)(i + 1);
                break;
            }
        }
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        intptr_t slot = (intptr_t)*socket_context - 1;
        if (slot >= 0 && slot < HTTP_TABLE) m->conns[slot].fd = -1;
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&m->guard_mu);
}

static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    if (a->ss_family != b->sa_family) return false;
    if (b->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (b->sa_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                       &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
    return false;
}

/* shutdown() makes libmicrohttpd see the end of the stream and close the connection
 * itself; the slot is freed at its CLOSED notification (guard_mu held). */
static void cut(struct http_conn *k)
{
    shutdown(k->fd, SHUT_RDWR);
    k->cut = true;
}

/* libmicrohttpd asks before it takes a connection (its thread): makes room for it by
 * cutting the oldest connection of its address, or of all, past a bound (see HTTP_*). */
static enum MHD_Result http_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    metrics *m = cls;
    (void)addrlen;
    pthread_mutex_lock(&m->guard_mu);
    int live = 0, from_addr = 0, oldest = -1, oldest_addr = -1, free_slots = 0;
    for (int i = 0; i < HTTP_TABLE; i++) {
        struct http_conn *k = &m->conns[i];
        if (k->fd < 0) {
            free_slots++;
            continue;
        }
        if (k->cut) continue;
        live++;
        if (oldest < 0 || k->t0_ms < m->conns[oldest].t0_ms) oldest = i;
        if (addr && same_addr(&k->peer, addr)) {
            from_addr++;
            if (oldest_addr < 0 || k->t0_ms < m->conns[oldest_addr].t0_ms) oldest_addr = i;
        }
    }
    if (from_addr >= HTTP_PER_ADDR && oldest_addr >= 0) {
        cut(&m->conns[oldest_addr]);
        live--;
    }
    if (live >= HTTP_MAX_CONNS && oldest >= 0 && !m->conns[oldest].cut) cut(&m->conns[oldest]);
    pthread_mutex_unlock(&m->guard_mu);
    /* every slot holds a connection being closed: a moment, then there is room again */
    return free_slots > 0 ? MHD_YES : MHD_NO;
}

/* Cuts connections past their lifetime. */
static void *http_guard(void *arg)
{
    metrics *m = arg;
    pthread_mutex_lock(&m->guard_mu);
    while (!m->guard_stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 200 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&m->guard_cv, &m->guard_mu, &until);
        uint64_t now = mono_ms();
        for (int i = 0; i < HTTP_TABLE; i++) {
            struct http_conn *k = &m->conns[i];
            if (k->fd >= 0 && !k->cut && now - k->t0_ms > HTTP_LIFETIME_MS) cut(k);
        }
    }
    pthread_mutex_unlock(&m->guard_mu);
    return NULL;
}

int metrics_check_listen(const char *spec)
{
    struct sockaddr_storage ss;
    socklen_t slen = 0;
    int rc = parse_listen(spec, &ss, &slen);
    if (rc < 0) return rc;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return seterr(-errno, "metrics: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    rc = 0;
    if (bind(fd, (struct sockaddr *)&ss, slen) < 0 || listen(fd, 1) < 0)
        rc = seterr(-errno, "metrics: %s: %s", spec, strerror(errno));
    close(fd);
    return rc;
}

int metrics__http_start(metrics *m, const char *spec)
{
    struct sockaddr_storage ss;
    socklen_t slen = 0;
    int rc = parse_listen(spec, &ss, &slen);
    if (rc < 0) return rc;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return seterr(-errno, "metrics: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, slen) < 0) {
        rc = seterr(-errno, "metrics: bind %s: %s", spec, strerror(errno));
        goto fail_fd;
    }
    if (listen(fd, 64) < 0) {
        rc = seterr(-errno, "metrics: listen %s: %s", spec, strerror(errno));
        goto fail_fd;
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    getsockname(fd, (struct sockaddr *)&bound, &blen);
    m->port = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                               : ((struct sockaddr_in6 *)&bound)->sin6_port);
    /* The daemon takes SIGTERM through a signalfd, which only works when every thread
     * blocks it: start the server thread with all signals blocked. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    for (int i = 0; i < HTTP_TABLE; i++) m->conns[i].fd = -1;
    /* http_accept keeps the bounds; libmicrohttpd's own limit is the table's size */
    m->httpd =
        MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, http_accept, m, handle,
                         m, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)HTTP_IDLE_S, MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_TABLE,
                         MHD_OPTION_NOTIFY_CONNECTION, http_notify, m, MHD_OPTION_END);
    if (m->httpd && pthread_create(&m->guard_thread, NULL, http_guard, m) == 0)
        m->guard_started = true;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!m->httpd) {
        rc = seterr(-EIO, "metrics: libmicrohttpd failed to start on %s", spec);
        goto fail_fd;
    }
    /* libmicrohttpd owns the listening socket now and closes it in MHD_stop_daemon; a
     * second close here could close a descriptor another thread just opened. */
    m->listen_fd = -1;
    return 0;
fail_fd:
    close(fd);
    return rc;
}

void metrics__http_stop(metrics *m)
{
    if (m->guard_started) {
        pthread_mutex_lock(&m->guard_mu);
        m->guard_stop = true;
        pthread_cond_signal(&m->guard_cv);
        pthread_mutex_unlock(&m->guard_mu);
        pthread_join(m->guard_thread, NULL);
        m->guard_started = false;
    }
    if (m->httpd) MHD_stop_daemon(m->httpd);
    m->httpd = NULL;
    if (m->listen_fd >= 0) close(m->listen_fd);
    m->listen_fd = -1;
}

/* ---- HTTP --------------------------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *text,
                             const char *ctype)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_size, void **req_cls)
{
    (void)version;
    (void)upload_data;
    metrics *m = cls;
    /* Only GET and HEAD, never a body: anything else is answered at once, from the headers,
     * and the connection closes without reading the body (it used to be swallowed, without
     * limit). */
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET\n", "text/plain");
    if (*upload_size) return MHD_NO; /* a GET with a body: close */
    if (!*req_cls) {                 /* first call: headers only; answer on the second */
        *req_cls = (void *)1;
        return MHD_YES;
    }
    if (strcmp(url, "/metrics") != 0)
        return reply(c, strcmp(url, "/") == 0 ? MHD_HTTP_OK : MHD_HTTP_NOT_FOUND,
                     "ringlmd: metrics at /metrics\n", "text/plain");
    char *body;
    size_t len;
    if (metrics_render(m, &body, &len) < 0)
        return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n", "text/plain");
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}
