/* SPDX-License-Identifier: MIT */
/*
 * daemon/metrics.c — counters owned by the loop thread, published through a triple
 * buffer, rendered by libmicrohttpd's thread in the Prometheus text format 0.0.4.
 */
#include "daemon/metrics.h"
#include "common/errdetail.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef RINGLM_VERSION
#define RINGLM_VERSION "unknown"
#endif

/* ---- errors ------------------------------------------------------------------------- */

ERRDETAIL_DEFINE(metrics_err);

const char *metrics_errmsg(void) { return metrics_err.msg; }

#define seterr(err, ...) errdetail_set(&metrics_err, (err), __VA_ARGS__)

/* ---- buckets ------------------------------------------------------------------------ */

/* Request latencies: 0.5 ms to 2 min. A tiny model's TPOT sits in the low buckets, an 8B
 * model's TTFT under load in the high ones; one set serves both. */
static const uint64_t lat_bounds_us[] = {
    500,     1000,    2500,    5000,     10000,    25000,    50000,    100000,   250000,
    500000,  1000000, 2500000, 5000000,  10000000, 20000000, 30000000, 60000000, 120000000,
};
#define N_LAT (sizeof lat_bounds_us / sizeof lat_bounds_us[0])
/* Loop iterations: 10 µs to 1 s. */
static const uint64_t iter_bounds_us[] = {
    10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000,
};
#define N_ITER (sizeof iter_bounds_us / sizeof iter_bounds_us[0])

typedef struct hist_lat {
    uint64_t bucket[N_LAT + 1]; /* non-cumulative; the last is +Inf */
    uint64_t count, sum_us;
} hist_lat;
typedef struct hist_iter {
    uint64_t bucket[N_ITER + 1];
    uint64_t count, sum_us;
} hist_iter;

static unsigned bucket_of(const uint64_t *bounds, unsigned n, uint64_t v)
{
    /* Prometheus buckets are "less or equal": v lands in the first bound >= v. */
    unsigned lo = 0, hi = n;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (v <= bounds[mid]) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* ---- the counters (one copy live, three snapshots) ---------------------------------- */

#define MAX_SERIES (METRICS_MAX_TENANTS * METRICS_MAX_CLASSES)
/* Transfer directions: sched_xfer_dir indexes the per-direction arrays and dir_name. */
#define N_DIRS 2
_Static_assert(SCHED_XFER_OUT == 0 && SCHED_XFER_IN == N_DIRS - 1, "sched_xfer_dir indexes [N_DIRS]");

typedef struct series_stats {
    uint16_t tenant, cls;
    hist_lat h[METRICS_N_HIST];
    uint64_t prompt_tokens, generated_tokens;
    uint64_t finish[METRICS_MAX_REASONS];
    uint64_t reject[METRICS_MAX_REASONS];
    uint64_t defer[METRICS_MAX_REASONS];
    uint64_t preempt[METRICS_N_MODES][METRICS_MAX_REASONS];
    uint64_t cancels, timeouts;
    uint32_t waiting, running;
} series_stats;

typedef struct info_labels {
    char version[METRICS_LABEL_MAX], policy_hash[80], policy_name[METRICS_LABEL_MAX];
    char model_hash[80], model_name[METRICS_LABEL_MAX], backend[16];
} info_labels;

/* Everything a scrape shows. The series array is last so that publishing copies only the
 * series in use (head + n_series entries). */
typedef struct snap {
    uint64_t generation;
    info_labels info;
    int n_tenants, n_classes, n_reasons, n_series;
    char tenants[METRICS_MAX_TENANTS][METRICS_LABEL_MAX];
    char classes[METRICS_MAX_CLASSES][METRICS_LABEL_MAX];
    char reasons[METRICS_MAX_REASONS][METRICS_LABEL_MAX];
    uint32_t waiting, running;
    uint64_t kv_used[SCHED_POOL__COUNT], kv_total[SCHED_POOL__COUNT];
    uint64_t prefix_queries, prefix_hits, prefix_cached;
    hist_iter iter;
    uint64_t iter_tokens;
    double bw_bytes_per_s[SCHED_POOL__COUNT][N_DIRS];
    uint64_t xfer_bytes[SCHED_POOL__COUNT][N_DIRS], xfers[SCHED_POOL__COUNT][N_DIRS];
    uint64_t log_dropped[2];
    series_stats series[MAX_SERIES];
} snap;

#define SNAP_HEAD_BYTES offsetof(snap, series)
#define FRESH 4u

/* /metrics connections: at most this many at once, this many from one address, each idle at
 * most HTTP_IDLE_S and alive at most HTTP_LIFETIME_MS (a scrape takes milliseconds; a
 * client that trickles its headers a byte at a time is cut), and never with a body. */
#define HTTP_MAX_CONNS   64
#define HTTP_PER_ADDR    16
#define HTTP_IDLE_S      3
#define HTTP_LIFETIME_MS 3000

struct metrics {
    snap live;                     /* loop thread only */
    int16_t series_of[METRICS_MAX_TENANTS][METRICS_MAX_CLASSES]; /* -1: none yet */
    uint64_t publish_interval_us, last_publish_us;
    bool published_once;

    snap *buf[3];                  /* triple buffer */
    unsigned back;                 /* loop thread's spare */
    _Atomic unsigned middle;       /* index | FRESH when newer than front */
    unsigned front;                /* reader side, under read_mu */
    pthread_mutex_t read_mu;       /* readers only: the loop never takes it */
    size_t render_cap;             /* exposition size to expect (under read_mu) */

    struct MHD_Daemon *httpd;
    int listen_fd, port;

    /* Bounds on /metrics connections (see http_notify): libmicrohttpd's timeout is an idle
     * timeout that every trickled byte resets, so each connection also has a lifetime, cut
     * by a watchdog thread. The table is written by the HTTP thread (connect, close) and
     * read by the watchdog, under guard_mu; a slot's fd is cleared at libmicrohttpd's
     * CLOSED notification, which comes before it closes the socket, so the watchdog never
     * shuts down a descriptor that was reused. */
    pthread_mutex_t guard_mu;
    pthread_cond_t guard_cv;
    pthread_t guard_thread;
    bool guard_started, guard_stop;
    struct { int fd; uint64_t t0_ms; } conns[HTTP_MAX_CONNS];
};

/* ---- lifecycle ---------------------------------------------------------------------- */

static void copy_label(char *dst, size_t cap, const char *src)
{
    if (!src) src = "";
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    /* Do not cut a UTF-8 sequence in half: step back over continuation bytes. */
    while (n > 0 && n < strlen(src) && ((unsigned char)src[n] & 0xC0) == 0x80) n--;
    memcpy(dst, src, n);
    dst[n] = 0;
}

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
        if (hl >= sizeof host) return seterr(-EINVAL, "metrics listen '%s': address too long", spec);
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
        return seterr(-EINVAL, "metrics listen '%s': '%s' is not a numeric IPv4/IPv6 address",
                      spec, host);
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
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        for (int i = 0; ci && i < HTTP_MAX_CONNS; i++) {
            if (m->conns[i].fd < 0) {
                m->conns[i].fd = ci->connect_fd;
                m->conns[i].t0_ms = mono_ms();
                *socket_context = (void *)(intptr_t)(i + 1);
                break;
            }
        }
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        intptr_t slot = (intptr_t)*socket_context - 1;
        if (slot >= 0 && slot < HTTP_MAX_CONNS) m->conns[slot].fd = -1;
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&m->guard_mu);
}

/* Cuts connections past their lifetime: shutdown() makes libmicrohttpd see the end of the
 * stream and close the connection itself. */
static void *http_guard(void *arg)
{
    metrics *m = arg;
    pthread_mutex_lock(&m->guard_mu);
    while (!m->guard_stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 200 * 1000000L;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&m->guard_cv, &m->guard_mu, &until);
        uint64_t now = mono_ms();
        for (int i = 0; i < HTTP_MAX_CONNS; i++) {
            if (m->conns[i].fd >= 0 && m->conns[i].t0_ms && now - m->conns[i].t0_ms > HTTP_LIFETIME_MS) {
                shutdown(m->conns[i].fd, SHUT_RDWR);
                m->conns[i].t0_ms = 0; /* once */
            }
        }
    }
    pthread_mutex_unlock(&m->guard_mu);
    return NULL;
}

static int start_http(metrics *m, const char *spec)
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
    for (int i = 0; i < HTTP_MAX_CONNS; i++) m->conns[i].fd = -1;
    m->httpd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL,
                                handle, m, MHD_OPTION_LISTEN_SOCKET, fd,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_S,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_MAX_CONNS,
                                MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)HTTP_PER_ADDR,
                                MHD_OPTION_NOTIFY_CONNECTION, http_notify, m, MHD_OPTION_END);
    if (m->httpd && pthread_create(&m->guard_thread, NULL, http_guard, m) == 0) m->guard_started = true;
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

int metrics_create(const metrics_config *cfg, metrics **out)
{
    static const metrics_config defaults = {0};
    if (!cfg) cfg = &defaults;
    *out = NULL;
    int rc = -ENOMEM;
    metrics *m = calloc(1, sizeof *m);
    if (!m) return seterr(-ENOMEM, "metrics: out of memory");
    for (int i = 0; i < 3; i++)
        if (!(m->buf[i] = calloc(1, sizeof(snap)))) goto fail;
    m->listen_fd = -1;
    memset(m->series_of, 0xff, sizeof m->series_of);
    m->publish_interval_us = cfg->publish_interval_us ? cfg->publish_interval_us : 100000;
    info_labels *in = &m->live.info;
    copy_label(in->version, sizeof in->version, cfg->version ? cfg->version : RINGLM_VERSION);
    copy_label(in->policy_hash, sizeof in->policy_hash, cfg->policy_hash);
    copy_label(in->policy_name, sizeof in->policy_name, cfg->policy_name);
    copy_label(in->model_hash, sizeof in->model_hash, cfg->model_hash);
    copy_label(in->model_name, sizeof in->model_name, cfg->model_name);
    copy_label(in->backend, sizeof in->backend, cfg->backend);
    /* Reason 0 is the overflow bucket, so an id is always valid. */
    strcpy(m->live.reasons[0], "other");
    m->live.n_reasons = 1;
    pthread_mutex_init(&m->read_mu, NULL);
    pthread_mutex_init(&m->guard_mu, NULL);
    pthread_cond_init(&m->guard_cv, NULL);
    m->back = 0;
    m->front = 1;
    atomic_store(&m->middle, 2u);
    metrics_publish(m, 0, 1);
    if (cfg->listen && *cfg->listen) {
        rc = start_http(m, cfg->listen);
        if (rc < 0) goto fail_mu;
    }
    *out = m;
    return 0;
fail_mu:
    pthread_mutex_destroy(&m->read_mu);
fail:
    for (int i = 0; i < 3; i++) free(m->buf[i]);
    free(m);
    return rc == -ENOMEM ? seterr(-ENOMEM, "metrics: out of memory") : rc;
}

int metrics_port(const metrics *m) { return m ? m->port : 0; }

void metrics_destroy(metrics *m)
{
    if (!m) return;
    if (m->guard_started) {
        pthread_mutex_lock(&m->guard_mu);
        m->guard_stop = true;
        pthread_cond_signal(&m->guard_cv);
        pthread_mutex_unlock(&m->guard_mu);
        pthread_join(m->guard_thread, NULL);
    }
    if (m->httpd) MHD_stop_daemon(m->httpd);
    if (m->listen_fd >= 0) close(m->listen_fd);
    pthread_mutex_destroy(&m->read_mu);
    pthread_mutex_destroy(&m->guard_mu);
    pthread_cond_destroy(&m->guard_cv);
    for (int i = 0; i < 3; i++) free(m->buf[i]);
    free(m);
}

void metrics_set_info(metrics *m, const char *policy_hash, const char *model_hash)
{
    info_labels *in = &m->live.info;
    if (policy_hash) copy_label(in->policy_hash, sizeof in->policy_hash, policy_hash);
    if (model_hash) copy_label(in->model_hash, sizeof in->model_hash, model_hash);
}

/* ---- labels ------------------------------------------------------------------------- */

static int intern(char (*names)[METRICS_LABEL_MAX], int *n, int max, const char *name,
                  int overflow)
{
    if (!name) name = "";
    for (int i = 0; i < *n; i++)
        if (strncmp(names[i], name, METRICS_LABEL_MAX - 1) == 0) return i;
    if (*n >= max) return overflow;
    copy_label(names[*n], METRICS_LABEL_MAX, name);
    return (*n)++;
}

static int intern_overflow(char (*names)[METRICS_LABEL_MAX], int *n, int max, const char *name)
{
    /* The last slot is kept for "other", so a flood of names still lands somewhere. */
    int i = intern(names, n, max - 1, name, -1);
    if (i >= 0) return i;
    for (int j = 0; j < *n; j++)
        if (strcmp(names[j], "other") == 0) return j;
    copy_label(names[*n], METRICS_LABEL_MAX, "other");
    return (*n)++;
}

int metrics_series(metrics *m, const char *tenant, const char *class_name)
{
    snap *s = &m->live;
    int t = intern_overflow(s->tenants, &s->n_tenants, METRICS_MAX_TENANTS, tenant);
    int c = intern_overflow(s->classes, &s->n_classes, METRICS_MAX_CLASSES, class_name);
    int id = m->series_of[t][c];
    if (id >= 0) return id;
    id = s->n_series++;
    memset(&s->series[id], 0, sizeof s->series[id]);
    s->series[id].tenant = (uint16_t)t;
    s->series[id].cls = (uint16_t)c;
    m->series_of[t][c] = (int16_t)id;
    return id;
}

static int reason_id(metrics *m, const char *reason)
{
    return intern(m->live.reasons, &m->live.n_reasons, METRICS_MAX_REASONS, reason, 0);
}

static series_stats *ser(metrics *m, int series)
{
    /* A bad id is the caller's bug; count it under a real series rather than scribble. */
    if (series < 0 || series >= m->live.n_series) series = metrics_series(m, "other", "other");
    return &m->live.series[series];
}

/* ---- per-request events ------------------------------------------------------------- */

void metrics_observe(metrics *m, int series, enum metrics_hist h, uint64_t us)
{
    if ((unsigned)h >= METRICS_N_HIST) return;
    hist_lat *x = &ser(m, series)->h[h];
    x->bucket[bucket_of(lat_bounds_us, N_LAT, us)]++;
    x->count++;
    x->sum_us += us;
}

void metrics_add_tokens(metrics *m, int series, uint64_t prompt_tokens, uint64_t generated_tokens)
{
    series_stats *s = ser(m, series);
    s->prompt_tokens += prompt_tokens;
    s->generated_tokens += generated_tokens;
}

void metrics_count_finish(metrics *m, int series, const char *finish_reason)
{
    ser(m, series)->finish[reason_id(m, finish_reason)]++;
}

void metrics_count_reject(metrics *m, int series, const char *reason)
{
    ser(m, series)->reject[reason_id(m, reason)]++;
}

void metrics_count_preempt(metrics *m, int series, enum metrics_mode mode, const char *reason)
{
    if ((unsigned)mode >= METRICS_N_MODES) return;
    ser(m, series)->preempt[mode][reason_id(m, reason)]++;
}

void metrics_count_cancel(metrics *m, int series) { ser(m, series)->cancels++; }
void metrics_count_timeout(metrics *m, int series) { ser(m, series)->timeouts++; }

void metrics_count_defer(metrics *m, int series, const char *reason)
{
    ser(m, series)->defer[reason_id(m, reason)]++;
}

void metrics_set_series_queue(metrics *m, int series, uint32_t waiting, uint32_t running)
{
    series_stats *s = ser(m, series);
    s->waiting = waiting;
    s->running = running;
}

/* ---- engine / pool state ------------------------------------------------------------ */

void metrics_set_queue(metrics *m, uint32_t waiting, uint32_t running)
{
    m->live.waiting = waiting;
    m->live.running = running;
}

void metrics_set_kv(metrics *m, sched_pool tier, uint64_t used, uint64_t total)
{
    if ((unsigned)tier >= SCHED_POOL__COUNT) return;
    m->live.kv_used[tier] = used;
    m->live.kv_total[tier] = total;
}

void metrics_set_prefix(metrics *m, uint64_t query_tokens, uint64_t hit_tokens, uint64_t cached_blocks)
{
    m->live.prefix_queries = query_tokens;
    m->live.prefix_hits = hit_tokens;
    m->live.prefix_cached = cached_blocks;
}

void metrics_observe_iteration(metrics *m, uint64_t us, uint32_t batch_tokens)
{
    hist_iter *x = &m->live.iter;
    x->bucket[bucket_of(iter_bounds_us, N_ITER, us)]++;
    x->count++;
    x->sum_us += us;
    m->live.iter_tokens += batch_tokens;
}

void metrics_observe_transfer(metrics *m, sched_pool tier, sched_xfer_dir dir,
                              uint64_t bytes, uint64_t us)
{
    if ((unsigned)tier >= SCHED_POOL__COUNT || (unsigned)dir >= N_DIRS) return;
    snap *s = &m->live;
    (void)us;
    s->xfer_bytes[tier][dir] += bytes;
    s->xfers[tier][dir]++;
}

void metrics_set_transfer_bw(metrics *m, sched_pool tier, sched_xfer_dir dir,
                             double bytes_per_s)
{
    if ((unsigned)tier >= SCHED_POOL__COUNT || (unsigned)dir >= N_DIRS) return;
    m->live.bw_bytes_per_s[tier][dir] = bytes_per_s;
}

void metrics_set_log_dropped(metrics *m, uint64_t decision_lines, uint64_t request_lines)
{
    m->live.log_dropped[0] = decision_lines;
    m->live.log_dropped[1] = request_lines;
}

/* ---- publishing --------------------------------------------------------------------- */

void metrics_publish(metrics *m, uint64_t now_us, int force)
{
    if (!force && m->published_once && now_us - m->last_publish_us < m->publish_interval_us)
        return;
    m->last_publish_us = now_us;
    m->published_once = true;
    snap *dst = m->buf[m->back];
    m->live.generation++;
    memcpy(dst, &m->live,
           SNAP_HEAD_BYTES + (size_t)m->live.n_series * sizeof(series_stats));
    /* Release: the reader that sees FRESH sees the copy. */
    unsigned prev = atomic_exchange_explicit(&m->middle, m->back | FRESH, memory_order_acq_rel);
    m->back = prev & 3u;
}

/* ---- rendering ---------------------------------------------------------------------- */

/* Label values: backslash, double quote and newline are escaped (exposition format). The
 * renderer holds the stream's lock for the whole scrape (flockfile), so the unlocked stdio
 * calls below are safe and a scrape costs a few ms less. */
static void put_label(FILE *f, const char *name, const char *v, bool comma)
{
    if (comma) putc_unlocked(',', f);
    fputs_unlocked(name, f);
    fputs_unlocked("=\"", f);
    if (!strpbrk(v, "\\\"\n")) {
        fputs_unlocked(v, f);
    } else {
        for (const char *p = v; *p; p++) {
            if (*p == '\\') fputs_unlocked("\\\\", f);
            else if (*p == '"') fputs_unlocked("\\\"", f);
            else if (*p == '\n') fputs_unlocked("\\n", f);
            else putc_unlocked(*p, f);
        }
    }
    putc_unlocked('"', f);
}

static void head(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* `tenant="…",class="…"` of every series, rendered once per scrape (a histogram repeats it
 * on 21 lines). */
typedef struct tc_cache {
    char *text[MAX_SERIES];
} tc_cache;

static void tc_cache_build(tc_cache *c, const snap *s)
{
    for (int i = 0; i < s->n_series; i++) {
        char *buf = NULL;
        size_t n = 0;
        FILE *f = open_memstream(&buf, &n);
        c->text[i] = NULL;
        if (!f) continue;
        put_label(f, "tenant", s->tenants[s->series[i].tenant], false);
        put_label(f, "class", s->classes[s->series[i].cls], true);
        fclose(f);
        c->text[i] = buf;
    }
}

static void tc_cache_free(tc_cache *c, const snap *s)
{
    for (int i = 0; i < s->n_series; i++) free(c->text[i]);
}

static __thread const tc_cache *cur_tc; /* the cache of the scrape in progress */

static void tc_labels(FILE *f, const snap *s, const series_stats *x)
{
    int i = (int)(x - s->series);
    if (cur_tc && cur_tc->text[i]) {
        fputs_unlocked(cur_tc->text[i], f);
        return;
    }
    put_label(f, "tenant", s->tenants[x->tenant], false);
    put_label(f, "class", s->classes[x->cls], true);
}

static void put_seconds(FILE *f, uint64_t us)
{
    fprintf(f, "%.6f", (double)us / 1e6);
}

/* `,le="0.0005"} ` … `,le="+Inf"} `, formatted once. */
static char lat_le[N_LAT + 1][32];
static pthread_once_t lat_le_once = PTHREAD_ONCE_INIT;
static void lat_le_init(void)
{
    for (unsigned b = 0; b < N_LAT; b++)
        snprintf(lat_le[b], sizeof lat_le[b], ",le=\"%g\"} ", (double)lat_bounds_us[b] / 1e6);
    snprintf(lat_le[N_LAT], sizeof lat_le[N_LAT], ",le=\"+Inf\"} ");
}

static void render_lat_hist(FILE *f, const snap *s, int h, const char *name, const char *help)
{
    head(f, name, "histogram", help);
    for (int i = 0; i < s->n_series; i++) {
        const series_stats *x = &s->series[i];
        const hist_lat *hh = &x->h[h];
        uint64_t cum = 0;
        for (unsigned b = 0; b <= N_LAT; b++) {
            cum += hh->bucket[b];
            fputs_unlocked(name, f);
            fputs_unlocked("_bucket{", f);
            tc_labels(f, s, x);
            fputs_unlocked(lat_le[b], f);
            fprintf(f, "%llu\n", (unsigned long long)cum);
        }
        fprintf(f, "%s_sum{", name);
        tc_labels(f, s, x);
        fputs("} ", f);
        put_seconds(f, hh->sum_us);
        fprintf(f, "\n%s_count{", name);
        tc_labels(f, s, x);
        fprintf(f, "} %llu\n", (unsigned long long)hh->count);
    }
}

static void render_tc_counter(FILE *f, const snap *s, const char *name, const char *type,
                              const char *help, size_t off)
{
    head(f, name, type, help);
    for (int i = 0; i < s->n_series; i++) {
        const series_stats *x = &s->series[i];
        uint64_t v;
        if (off == offsetof(series_stats, waiting) || off == offsetof(series_stats, running))
            v = *(const uint32_t *)((const char *)x + off);
        else v = *(const uint64_t *)((const char *)x + off);
        fprintf(f, "%s{", name);
        tc_labels(f, s, x);
        fprintf(f, "} %llu\n", (unsigned long long)v);
    }
}

static void render_reason_counter(FILE *f, const snap *s, const char *name, const char *help,
                                  size_t off)
{
    head(f, name, "counter", help);
    for (int i = 0; i < s->n_series; i++) {
        const series_stats *x = &s->series[i];
        const uint64_t *arr = (const uint64_t *)((const char *)x + off);
        for (int r = 0; r < s->n_reasons; r++) {
            if (!arr[r]) continue; /* counters appear when they first count */
            fprintf(f, "%s{", name);
            tc_labels(f, s, x);
            put_label(f, "reason", s->reasons[r], true);
            fprintf(f, "} %llu\n", (unsigned long long)arr[r]);
        }
    }
}

static const char *const dir_name[N_DIRS] = {"out", "in"};
static const char *const mode_name[METRICS_N_MODES] = {"swap", "recompute"};

static void render(FILE *f, const snap *s)
{
    head(f, "ringlm_info", "gauge", "Build and service identity (version, policy hash, model hash).");
    fputs("ringlm_info{", f);
    put_label(f, "version", s->info.version, false);
    put_label(f, "policy", s->info.policy_name, true);
    put_label(f, "policy_hash", s->info.policy_hash, true);
    put_label(f, "model", s->info.model_name, true);
    put_label(f, "model_hash", s->info.model_hash, true);
    put_label(f, "backend", s->info.backend, true);
    fputs("} 1\n", f);

    render_lat_hist(f, s, METRICS_H_QUEUE_WAIT, "ringlm_queue_wait_seconds",
                    "Time from arrival to first scheduling, per tenant and class.");
    render_lat_hist(f, s, METRICS_H_TTFT, "ringlm_time_to_first_token_seconds",
                    "Time from arrival to the first generated token, per tenant and class.");
    render_lat_hist(f, s, METRICS_H_TPOT, "ringlm_time_per_output_token_seconds",
                    "Mean time per generated token after the first, per request.");
    render_lat_hist(f, s, METRICS_H_E2E, "ringlm_e2e_request_latency_seconds",
                    "Time from arrival to the end of the request, per tenant and class.");
    render_tc_counter(f, s, "ringlm_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
                      offsetof(series_stats, prompt_tokens));
    render_tc_counter(f, s, "ringlm_generation_tokens_total", "counter", "Generated tokens.",
                      offsetof(series_stats, generated_tokens));
    render_reason_counter(f, s, "ringlm_requests_finished_total",
                          "Requests ended, by finish reason (length, stop, cancelled, timeout, rejected, error).",
                          offsetof(series_stats, finish));
    render_reason_counter(f, s, "ringlm_rejects_total", "Requests rejected at admission, by reason.",
                          offsetof(series_stats, reject));
    render_reason_counter(f, s, "ringlm_defers_total", "Scheduling deferrals, by reason.",
                          offsetof(series_stats, defer));
    head(f, "ringlm_preemptions_total", "counter", "Preemptions by mode (swap, recompute) and reason.");
    for (int i = 0; i < s->n_series; i++) {
        const series_stats *x = &s->series[i];
        for (int md = 0; md < METRICS_N_MODES; md++)
            for (int r = 0; r < s->n_reasons; r++) {
                if (!x->preempt[md][r]) continue;
                fputs("ringlm_preemptions_total{", f);
                tc_labels(f, s, x);
                put_label(f, "mode", mode_name[md], true);
                put_label(f, "reason", s->reasons[r], true);
                fprintf(f, "} %llu\n", (unsigned long long)x->preempt[md][r]);
            }
    }
    render_tc_counter(f, s, "ringlm_cancels_total", "counter", "Requests cancelled (by the client or its death).",
                      offsetof(series_stats, cancels));
    render_tc_counter(f, s, "ringlm_timeouts_total", "counter", "Requests timed out by their class deadline.",
                      offsetof(series_stats, timeouts));
    render_tc_counter(f, s, "ringlm_requests_waiting", "gauge", "Requests queued, not yet running.",
                      offsetof(series_stats, waiting));
    render_tc_counter(f, s, "ringlm_requests_running", "gauge", "Requests running (holding KV blocks).",
                      offsetof(series_stats, running));

    head(f, "ringlm_queue_depth", "gauge", "Requests queued across all tenants.");
    fprintf(f, "ringlm_queue_depth %u\n", s->waiting);
    head(f, "ringlm_kv_blocks_used", "gauge", "KV cache blocks in use, per tier.");
    for (sched_pool t = SCHED_POOL_DEVICE; t < SCHED_POOL__COUNT; t++)
        if (s->kv_total[t])
            fprintf(f, "ringlm_kv_blocks_used{tier=\"%s\"} %llu\n", sched_pool_name(t),
                    (unsigned long long)s->kv_used[t]);
    head(f, "ringlm_kv_blocks_free", "gauge", "KV cache blocks free, per tier.");
    for (sched_pool t = SCHED_POOL_DEVICE; t < SCHED_POOL__COUNT; t++)
        if (s->kv_total[t])
            fprintf(f, "ringlm_kv_blocks_free{tier=\"%s\"} %llu\n", sched_pool_name(t),
                    (unsigned long long)(s->kv_total[t] > s->kv_used[t] ? s->kv_total[t] - s->kv_used[t] : 0));
    head(f, "ringlm_kv_blocks_total", "gauge", "KV cache blocks configured, per tier.");
    for (sched_pool t = SCHED_POOL_DEVICE; t < SCHED_POOL__COUNT; t++)
        if (s->kv_total[t])
            fprintf(f, "ringlm_kv_blocks_total{tier=\"%s\"} %llu\n", sched_pool_name(t),
                    (unsigned long long)s->kv_total[t]);

    head(f, "ringlm_iteration_seconds", "histogram", "Duration of one loop iteration (plan, execute, sample, stream).");
    uint64_t cum = 0;
    for (unsigned b = 0; b <= N_ITER; b++) {
        cum += s->iter.bucket[b];
        if (b < N_ITER) fprintf(f, "ringlm_iteration_seconds_bucket{le=\"%g\"} %llu\n",
                                (double)iter_bounds_us[b] / 1e6, (unsigned long long)cum);
        else fprintf(f, "ringlm_iteration_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    fputs("ringlm_iteration_seconds_sum ", f);
    put_seconds(f, s->iter.sum_us);
    fprintf(f, "\nringlm_iteration_seconds_count %llu\n", (unsigned long long)s->iter.count);
    head(f, "ringlm_iteration_tokens_total", "counter", "Tokens executed by the engine (prefill and decode rows).");
    fprintf(f, "ringlm_iteration_tokens_total %llu\n", (unsigned long long)s->iter_tokens);

    head(f, "ringlm_transfer_bandwidth_bytes_per_second", "gauge",
         "KV transfer bandwidth the scheduler plans with, measured (moving average over transfers), per tier and direction.");
    for (sched_pool t = SCHED_POOL_HOST; t < SCHED_POOL__COUNT; t++)
        for (int d = 0; d < N_DIRS; d++)
            if (s->kv_total[t] || s->xfers[t][d])
                fprintf(f, "ringlm_transfer_bandwidth_bytes_per_second{tier=\"%s\",dir=\"%s\"} %.6g\n",
                        sched_pool_name(t), dir_name[d], s->bw_bytes_per_s[t][d]);
    head(f, "ringlm_transfer_bytes_total", "counter", "KV bytes moved, per tier and direction.");
    for (sched_pool t = SCHED_POOL_HOST; t < SCHED_POOL__COUNT; t++)
        for (int d = 0; d < N_DIRS; d++)
            if (s->kv_total[t] || s->xfers[t][d])
                fprintf(f, "ringlm_transfer_bytes_total{tier=\"%s\",dir=\"%s\"} %llu\n", sched_pool_name(t),
                        dir_name[d], (unsigned long long)s->xfer_bytes[t][d]);
    head(f, "ringlm_transfers_total", "counter", "KV transfers completed, per tier and direction.");
    for (sched_pool t = SCHED_POOL_HOST; t < SCHED_POOL__COUNT; t++)
        for (int d = 0; d < N_DIRS; d++)
            if (s->kv_total[t] || s->xfers[t][d])
                fprintf(f, "ringlm_transfers_total{tier=\"%s\",dir=\"%s\"} %llu\n", sched_pool_name(t),
                        dir_name[d], (unsigned long long)s->xfers[t][d]);
    head(f, "ringlm_log_dropped_lines_total", "counter",
         "Decision/request log lines dropped because the log writer fell behind.");
    fprintf(f, "ringlm_log_dropped_lines_total{log=\"decision\"} %llu\n", (unsigned long long)s->log_dropped[0]);
    fprintf(f, "ringlm_log_dropped_lines_total{log=\"request\"} %llu\n", (unsigned long long)s->log_dropped[1]);

    /* The names Kubernetes inference gateways scrape from vLLM, same meaning. */
    head(f, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
    fputs("vllm:num_requests_waiting{", f);
    put_label(f, "model_name", s->info.model_name, false);
    fprintf(f, "} %u\n", s->waiting);
    head(f, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.");
    fputs("vllm:num_requests_running{", f);
    put_label(f, "model_name", s->info.model_name, false);
    fprintf(f, "} %u\n", s->running);
    head(f, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
    fputs("vllm:kv_cache_usage_perc{", f);
    put_label(f, "model_name", s->info.model_name, false);
    double usage = s->kv_total[0] ? (double)s->kv_used[0] / (double)s->kv_total[0] : 0.0;
    fprintf(f, "} %.6g\n", usage);
    head(f, "vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.");
    fputs("vllm:prefix_cache_queries_total{", f);
    put_label(f, "model_name", s->info.model_name, false);
    fprintf(f, "} %llu\n", (unsigned long long)s->prefix_queries);
    head(f, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.");
    fputs("vllm:prefix_cache_hits_total{", f);
    put_label(f, "model_name", s->info.model_name, false);
    fprintf(f, "} %llu\n", (unsigned long long)s->prefix_hits);
    head(f, "ringlm_prefix_cache_blocks", "gauge", "Device KV blocks cached that no sequence holds (counted free).");
    fprintf(f, "ringlm_prefix_cache_blocks{tier=\"device\"} %llu\n", (unsigned long long)s->prefix_cached);
}

int metrics_render(metrics *m, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    pthread_mutex_lock(&m->read_mu);
    if (atomic_load_explicit(&m->middle, memory_order_acquire) & FRESH)
        m->front = atomic_exchange_explicit(&m->middle, m->front, memory_order_acq_rel) & 3u;
    const snap *s = m->buf[m->front];
    pthread_once(&lat_le_once, lat_le_init);
    tc_cache cache;
    tc_cache_build(&cache, s);
    /* Into one buffer sized from the last scrape (fmemopen): a growing open_memstream
     * spent most of a scrape in realloc, memset and page faults. Too small → retry with
     * twice the room (only when the series grew). */
    size_t cap = m->render_cap ? m->render_cap : 64 * 1024;
    char *buf = NULL;
    long n = 0;
    int rc = 0;
    for (;;) {
        buf = malloc(cap + 1);
        FILE *f = buf ? fmemopen(buf, cap + 1, "w") : NULL;
        if (!f) {
            rc = seterr(-ENOMEM, "metrics: no memory for a %zu-byte exposition", cap);
            break;
        }
        cur_tc = &cache;
        flockfile(f);
        render(f, s);
        funlockfile(f);
        cur_tc = NULL;
        fflush(f);
        n = ftell(f);
        bool full = ferror(f) || n < 0 || (size_t)n >= cap;
        fclose(f);
        if (!full) break;
        free(buf);
        buf = NULL;
        if (cap > ((size_t)64 << 20)) {
            rc = seterr(-ENOMEM, "metrics: exposition larger than 64 MiB");
            break;
        }
        cap *= 2;
    }
    if (rc == 0) m->render_cap = (size_t)n + (size_t)n / 4 + 4096;
    tc_cache_free(&cache, s);
    pthread_mutex_unlock(&m->read_mu);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[n] = 0;
    *out = buf;
    *len = (size_t)n;
    return 0;
}

/* ---- HTTP --------------------------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *text,
                             const char *ctype)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text,
                                                             MHD_RESPMEM_PERSISTENT);
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
    if (!*req_cls) { /* first call: headers only; answer on the second */
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
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}
