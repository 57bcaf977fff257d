/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_guard.c — bounds on the gateway's HTTP connections, so that clients that open
 * many and send slowly (slowloris) cannot take the server from everyone else (see
 * gw_internal.h).
 *
 * libmicrohttpd's own timeout (--http-timeout-s) is an idle timeout: a client that sends
 * one byte of its head every few seconds is never idle, and thousands of them held every
 * connection slot while a legitimate /health waited in the listen backlog. So:
 *
 *   per address   at most --max-connections-per-addr open connections from one address
 *                 (libmicrohttpd refuses the next one at accept);
 *   head          a connection must deliver a complete request head within
 *                 --http-head-timeout-s of opening, or of the end of its previous answer
 *                 (a kept-alive connection waits for its next request no longer);
 *   body          and the whole body within --http-body-timeout-s of its head;
 *   at the limit  with --max-connections open, a newcomer takes the place of the oldest
 *                 connection still waiting for its head: slow clients are evicted, a
 *                 client that sends its request at once is served. When none waits for a
 *                 head (every connection is a request being served), the newcomer waits.
 *
 * A request being served (prepared, generated, streamed) has no deadline: its client reads
 * at its own pace and the watch thread cancels it when it hangs up.
 *
 * The guard thread sleeps until the earliest deadline of an open connection, and without a
 * timeout when none has one (an idle gateway wakes for nothing); a connection that gets an
 * earlier deadline wakes it.
 *
 * A cut is shutdown(): libmicrohttpd sees the end of the stream and closes the connection
 * itself on its thread; the connection's record goes at its CLOSED notification. The
 * records are under conn_mu, which nothing else nests inside (never taken with mu held,
 * never held while taking mu).
 */
#include "gateway/gw_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct gw_conn {
    int fd;
    enum gw_conn_phase phase;
    uint64_t since_ms; /* when the phase began */
    bool cut;
    gw_conn *prev, *next;
};

static uint64_t now_ms(void)
{
    return gw_now_us() / 1000u;
}

/* conn_mu held: when k's phase runs out (UINT64_MAX: never). */
static uint64_t deadline(const gw_server *s, const gw_conn *k)
{
    uint64_t lim = k->phase == GW_CONN_HEAD   ? (uint64_t)s->cfg.http_head_timeout_s * 1000u
                   : k->phase == GW_CONN_BODY ? (uint64_t)s->cfg.http_body_timeout_s * 1000u
                                              : 0;
    return k->cut || !lim ? UINT64_MAX : k->since_ms + lim + 1;
}

/* conn_mu held: k's deadline is new; wake the guard when it comes before its next wake. */
static void guard_see(gw_server *s, const gw_conn *k)
{
    if (deadline(s, k) < s->guard_until_ms) pthread_cond_signal(&s->guard_cv);
}

static void cut(gw_server *s, gw_conn *k)
{
    shutdown(k->fd, SHUT_RDWR);
    k->cut = true;
    s->n_conns_cut++;
}

void gw_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode toe)
{
    gw_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        gw_conn *k = ci ? calloc(1, sizeof *k) : NULL;
        if (!k) return; /* unguarded: the idle timeout still bounds it */
        k->fd = ci->connect_fd;
        k->phase = GW_CONN_HEAD;
        k->since_ms = now_ms();
        pthread_mutex_lock(&s->conn_mu);
        k->next = s->conns;
        if (s->conns) s->conns->prev = k;
        s->conns = k;
        s->n_conns++;
        guard_see(s, k);
        pthread_mutex_unlock(&s->conn_mu);
        *socket_context = k;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        gw_conn *k = *socket_context;
        if (!k) return;
        *socket_context = NULL;
        pthread_mutex_lock(&s->conn_mu);
        if (k->prev)
            k->prev->next = k->next;
        else
            s->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        s->n_conns--;
        if (k->cut) s->n_conns_cut--;
        pthread_mutex_unlock(&s->conn_mu);
        free(k);
    }
}

void gw_guard_phase(gw_server *s, struct MHD_Connection *c, enum gw_conn_phase phase)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    gw_conn *k = ci ? ci->socket_context : NULL;
    if (!k) return;
    pthread_mutex_lock(&s->conn_mu);
    if (k->phase != phase) {
        k->phase = phase;
        k->since_ms = now_ms();
        guard_see(s, k);
    }
    pthread_mutex_unlock(&s->conn_mu);
}

enum MHD_Result gw_guard_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)addr;
    (void)addrlen;
    gw_server *s = cls;
    enum MHD_Result ok = MHD_YES;
    pthread_mutex_lock(&s->conn_mu);
    if (s->n_conns - s->n_conns_cut >= s->cfg.max_connections) {
        gw_conn *oldest = NULL;
        for (gw_conn *k = s->conns; k; k = k->next)
            if (!k->cut && k->phase == GW_CONN_HEAD && (!oldest || k->since_ms < oldest->since_ms))
                oldest = k;
        if (oldest) {
            cut(s, oldest);
            s->conns_evicted++;
        } else {
            ok = MHD_NO;
            s->conns_refused++;
        }
    }
    pthread_mutex_unlock(&s->conn_mu);
    return ok;
}

static void *guard_main(void *arg)
{
    gw_server *s = arg;
    pthread_mutex_lock(&s->conn_mu);
    while (!s->guard_stop) {
        uint64_t now = now_ms(), next = UINT64_MAX;
        for (gw_conn *k = s->conns; k; k = k->next) {
            uint64_t d = deadline(s, k);
            if (d <= now) {
                cut(s, k);
                s->conns_timed_out[k->phase]++;
            } else if (d < next) {
                next = d;
            }
        }
        s->guard_until_ms = next;
        if (next == UINT64_MAX) {
            pthread_cond_wait(&s->guard_cv, &s->conn_mu);
        } else {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            uint64_t ns = (uint64_t)until.tv_nsec + (next - now) * 1000000u;
            until.tv_sec += (time_t)(ns / 1000000000u);
            until.tv_nsec = (long)(ns % 1000000000u);
            pthread_cond_timedwait(&s->guard_cv, &s->conn_mu, &until);
        }
    }
    pthread_mutex_unlock(&s->conn_mu);
    return NULL;
}

int gw_guard_start(gw_server *s)
{
    if (pthread_create(&s->guard_thread, NULL, guard_main, s)) return -EAGAIN;
    s->guard_started = true;
    return 0;
}

void gw_guard_stop(gw_server *s)
{
    if (!s->guard_started) return;
    pthread_mutex_lock(&s->conn_mu);
    s->guard_stop = true;
    pthread_cond_signal(&s->guard_cv);
    pthread_mutex_unlock(&s->conn_mu);
    pthread_join(s->guard_thread, NULL);
    s->guard_started = false;
}
