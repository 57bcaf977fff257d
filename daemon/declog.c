/* SPDX-License-Identifier: MIT */
/*
 * daemon/declog.c — decision and request logs, written by a thread of their own.
 *
 * Each log is a byte ring of whole lines: the loop (single producer) copies a line in and
 * publishes the new producer index with a release store; the writer (single consumer)
 * writes [cons, prod) with at most two write(2) calls and publishes cons. Indices are
 * free-running u64, so prod - cons is always the fill (wrap-around of the u64 itself is
 * centuries away at any realistic log rate). A line is published only whole, so a reader
 * of the file never sees half a line, even when the daemon is killed.
 */
#include "daemon/declog.h"
#include "common/errdetail.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#if __has_include("sched/sched.h")
#include "formats/logfile.h"
#include "sched/sched.h"
#define DECLOG_HAVE_SCHED 1
#endif
#include "shm/ring.h"

/* ---- errors ------------------------------------------------------------------------- */

ERRDETAIL_DEFINE(declog_err);

const char *declog_errmsg(void)
{
    return declog_err.msg;
}

#define seterr(err, ...) errdetail_set(&declog_err, (err), __VA_ARGS__)

/* ---- rings -------------------------------------------------------------------------- */

#define CACHELINE    64
#define DECLOG_NLOGS 3

typedef struct logring {
    const char *name; /* "decision" | "request" | "iteration" */
    int fd;           /* -1: log not configured */
    bool own_fd;
    char *buf;
    uint64_t mask;
    /* producer's line */
    alignas(CACHELINE) _Atomic uint64_t prod;
    uint64_t cons_cache;
    _Atomic uint64_t lines, dropped; /* single writer (the loop): relaxed load + store */
    /* consumer's line */
    alignas(CACHELINE) _Atomic uint64_t cons;
    uint64_t dropped_reported;
    bool write_failed;
} logring;

struct declog {
    logring log[DECLOG_NLOGS]; /* 0 decision, 1 request, 2 iteration */
    pthread_t writer;
    bool writer_started;
    alignas(CACHELINE) _Atomic uint32_t wake_seq; /* futex word */
    uint32_t writer_sleeping; /* the writer's half of the sleep/wake handshake (shm/ring.h) */
    _Atomic int stop;
};

static void wake_writer(declog *d)
{
    atomic_fetch_add_explicit(&d->wake_seq, 1, memory_order_release);
    futex_wake((const uint32_t *)&d->wake_seq, 1, FUTEX_SCOPE_PROCESS);
}

/* The producer's wake, after it published lines: the waker's half of the handshake. One
 * syscall per writer sleep, however many lines arrive before the writer actually runs
 * (taking the flag makes the next caller see it awake). */
static void wake_if_sleeping(declog *d)
{
    if (ring_handshake_peer_waits(&d->writer_sleeping) &&
        __atomic_exchange_n(&d->writer_sleeping, 0, __ATOMIC_ACQ_REL))
        wake_writer(d);
}

/* Producer side (the loop). Never blocks; a full ring drops the line and counts it. */
static int ring_put(declog *d, logring *r, const char *line, size_t len)
{
    if (r->fd < 0) return 0;
    uint64_t cap = r->mask + 1;
    uint64_t need = len + 1; /* the newline */
    if (len > DECLOG_LINE_MAX || need > cap) {
        atomic_store_explicit(&r->dropped,
                              atomic_load_explicit(&r->dropped, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        return -EMSGSIZE;
    }
    uint64_t prod = atomic_load_explicit(&r->prod, memory_order_relaxed);
    if (prod - r->cons_cache + need > cap) {
        r->cons_cache = atomic_load_explicit(&r->cons, memory_order_acquire);
        if (prod - r->cons_cache + need > cap) {
            atomic_store_explicit(&r->dropped,
                                  atomic_load_explicit(&r->dropped, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
            wake_if_sleeping(d);
            return -ENOBUFS;
        }
    }
    uint64_t off = prod & r->mask;
    uint64_t first = cap - off < len ? cap - off : len;
    memcpy(r->buf + off, line, first);
    memcpy(r->buf, line + first, len - first);
    r->buf[(prod + len) & r->mask] = '\n';
    atomic_store_explicit(&r->prod, prod + need, memory_order_release);
    atomic_store_explicit(&r->lines, atomic_load_explicit(&r->lines, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    /* Hand-over costs no syscall unless the writer sleeps and a quarter of the ring waits:
     * otherwise its periodic wake picks the lines up. cons_cache is refreshed only when the
     * ring looks full, so what waits is looked up before waking: with the stale value, every
     * line after the first quarter woke the writer for that one line (a futex wake and a
     * context switch per line: a client's flood of rejected requests cost the loop and the
     * writer a wake per request). */
    if (prod + need - r->cons_cache > cap / 4) {
        r->cons_cache = atomic_load_explicit(&r->cons, memory_order_acquire);
        if (prod + need - r->cons_cache > cap / 4) wake_if_sleeping(d);
    }
    return 0;
}

/* A line that could not be formatted (too long) is dropped and counted like a full ring's. */
static int count_drop(logring *r, int err)
{
    atomic_store_explicit(&r->dropped, atomic_load_explicit(&r->dropped, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    return err;
}

/* Consumer side (the writer thread). Returns bytes consumed. A wrapped range goes out in
 * one writev, so a line is never split across two write calls (two logs may share a fd,
 * e.g. both "-"). */
static uint64_t ring_drain(logring *r)
{
    if (r->fd < 0) return 0;
    uint64_t cons = atomic_load_explicit(&r->cons, memory_order_relaxed);
    uint64_t prod = atomic_load_explicit(&r->prod, memory_order_acquire);
    uint64_t total = prod - cons;
    uint64_t cap = r->mask + 1;
    while (cons != prod) {
        uint64_t off = cons & r->mask;
        uint64_t n = prod - cons;
        struct iovec iov[2] = {{.iov_base = r->buf + off, .iov_len = n}};
        int niov = 1;
        if (n > cap - off) {
            iov[0].iov_len = cap - off;
            iov[1] = (struct iovec){.iov_base = r->buf, .iov_len = n - (cap - off)};
            niov = 2;
        }
        ssize_t w = r->write_failed ? (ssize_t)n : writev(r->fd, iov, niov);
        if (w < 0) {
            if (errno == EINTR) continue;
            /* A full disk must not take the daemon down: report once, keep discarding
             * (the lines are lost and said to be). */
            fprintf(stderr, "declog: writing the %s log failed: %s; further lines are discarded\n",
                    r->name, strerror(errno));
            r->write_failed = true;
            continue;
        }
        cons += (uint64_t)w;
        atomic_store_explicit(&r->cons, cons, memory_order_release);
    }
    return total;
}

static void report_drops(logring *r, bool final)
{
    if (r->fd < 0) return;
    uint64_t dropped = atomic_load_explicit(&r->dropped, memory_order_relaxed);
    if (dropped == r->dropped_reported) return;
    fprintf(stderr,
            "declog: %llu %s log lines dropped%s (%llu in all): the writer fell behind "
            "or a line was over %d bytes\n",
            (unsigned long long)(dropped - r->dropped_reported), r->name,
            final ? " before close" : "", (unsigned long long)dropped, DECLOG_LINE_MAX);
    r->dropped_reported = dropped;
}

static void *writer_main(void *arg)
{
    declog *d = arg;
    struct timespec last_report;
    clock_gettime(CLOCK_MONOTONIC, &last_report);
    for (;;) {
        uint32_t seq = atomic_load_explicit(&d->wake_seq, memory_order_acquire);
        uint64_t did = 0;
        for (int i = 0; i < DECLOG_NLOGS; i++) did += ring_drain(&d->log[i]);
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec != last_report.tv_sec) { /* drops reported at most once a second */
            for (int i = 0; i < DECLOG_NLOGS; i++) report_drops(&d->log[i], false);
            last_report = now;
        }
        if (did) continue;
        if (atomic_load_explicit(&d->stop, memory_order_acquire)) {
            /* One last drain: lines queued before stop was set are written. */
            for (int i = 0; i < DECLOG_NLOGS; i++) ring_drain(&d->log[i]);
            break;
        }
        ring_handshake_announce(&d->writer_sleeping);
        bool pending = false;
        for (int i = 0; i < DECLOG_NLOGS; i++)
            if (d->log[i].fd >= 0 &&
                atomic_load_explicit(&d->log[i].prod, memory_order_seq_cst) !=
                    atomic_load_explicit(&d->log[i].cons, memory_order_relaxed))
                pending = true;
        if (!pending && !atomic_load(&d->stop)) {
            /* 10 ms: lines reach the file quickly enough to tail, and an idle daemon wakes
             * this thread only 100 times a second. */
            futex_wait((const uint32_t *)&d->wake_seq, seq, 10 * 1000 * 1000, FUTEX_SCOPE_PROCESS);
        }
        ring_store32(&d->writer_sleeping, 0);
    }
    for (int i = 0; i < DECLOG_NLOGS; i++) report_drops(&d->log[i], true);
    return NULL;
}

/* ---- lifecycle ---------------------------------------------------------------------- */

static int open_log(logring *r, const char *name, const char *path, size_t ring_bytes, bool trunc)
{
    r->name = name;
    r->fd = -1;
    if (!path) return 0;
    if (strcmp(path, "-") == 0) {
        r->fd = STDOUT_FILENO;
        r->own_fd = false;
    } else {
        /* A fragment a crash left at the end gets its newline first (formats/logfile.h). */
        size_t torn = 0;
        r->fd = fmt_log_open(path, trunc, &torn);
        if (r->fd < 0) return seterr(r->fd, "%s log '%s': %s", name, path, strerror(-r->fd));
        r->own_fd = true;
        if (torn)
            fprintf(stderr,
                    "ringlmd: %s log '%s' ended in a torn line of %zu bytes (a crash "
                    "mid-write): ended with a newline, so it stays a line of its own that "
                    "readers skip\n",
                    name, path, torn);
    }
    size_t cap = 4096;
    while (cap < ring_bytes) cap <<= 1;
    r->buf = malloc(cap);
    if (!r->buf) {
        if (r->own_fd) close(r->fd);
        r->fd = -1;
        return seterr(-ENOMEM, "%s log: no memory for a %zu-byte ring", name, cap);
    }
    r->mask = cap - 1;
    return 0;
}

static void close_log(logring *r)
{
    if (r->fd >= 0 && r->own_fd) close(r->fd);
    r->fd = -1;
    free(r->buf);
    r->buf = NULL;
}

int declog_create(const declog_config *cfg, declog **out)
{
    *out = NULL;
    if (!cfg) return seterr(-EINVAL, "declog: no config");
    declog *d = calloc(1, sizeof *d);
    if (!d) return seterr(-ENOMEM, "declog: out of memory");
    size_t ring = cfg->ring_bytes ? cfg->ring_bytes : (size_t)4 << 20;
    if (ring < 2 * (DECLOG_LINE_MAX + 1)) ring = 2 * (DECLOG_LINE_MAX + 1);
    int rc = open_log(&d->log[0], "decision", cfg->decision_path, ring, cfg->truncate);
    if (rc < 0) goto fail;
    rc = open_log(&d->log[1], "request", cfg->request_path, ring, cfg->truncate);
    if (rc < 0) goto fail_dec;
    rc = open_log(&d->log[2], "iteration", cfg->iteration_path, ring, cfg->truncate);
    if (rc < 0) goto fail_req;
    if (d->log[0].fd >= 0 || d->log[1].fd >= 0 || d->log[2].fd >= 0) {
        /* Signals stay with the loop's signalfd: the writer blocks them all. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        rc = -pthread_create(&d->writer, NULL, writer_main, d);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc < 0) {
            seterr(rc, "declog: pthread_create: %s", strerror(-rc));
            goto fail_it;
        }
        pthread_setname_np(d->writer, "ringlmd-log");
        d->writer_started = true;
    }
    *out = d;
    return 0;
fail_it:
    close_log(&d->log[2]);
fail_req:
    close_log(&d->log[1]);
fail_dec:
    close_log(&d->log[0]);
fail:
    free(d);
    return rc;
}

void declog_destroy(declog *d)
{
    if (!d) return;
    if (d->writer_started) {
        atomic_store_explicit(&d->stop, 1, memory_order_release);
        wake_writer(d);
        pthread_join(d->writer, NULL);
    }
    for (int i = 0; i < DECLOG_NLOGS; i++) close_log(&d->log[i]);
    free(d);
}

bool declog_has_decisions(const declog *d)
{
    return d && d->log[0].fd >= 0;
}
bool declog_has_requests(const declog *d)
{
    return d && d->log[1].fd >= 0;
}
bool declog_has_iterations(const declog *d)
{
    return d && d->log[2].fd >= 0;
}

int declog_iteration_line(declog *d, const char *json, size_t len)
{
    if (!d || d->log[2].fd < 0) return 0;
    return ring_put(d, &d->log[2], json, len);
}

int declog_iteration(declog *d, const fmt_iteration *it)
{
    if (!d || d->log[2].fd < 0) return 0;
    char line[DECLOG_LINE_MAX + 1];
    int n = fmt_iteration_format(it, line, sizeof line);
    if (n < 0) return count_drop(&d->log[2], n);
    return ring_put(d, &d->log[2], line, (size_t)n);
}

/* ---- decision log ------------------------------------------------------------------- */

int declog_decision_line(declog *d, const char *json, size_t len)
{
    if (!d) return 0;
    return ring_put(d, &d->log[0], json, len);
}

int declog_decision(declog *d, const struct sched_event *ev)
{
    if (!d || d->log[0].fd < 0) return 0;
#ifdef DECLOG_HAVE_SCHED
    fmt_decision rec;
    sched_event_record(ev, &rec);
    return declog_decision_record(d, &rec);
#else
    (void)ev;
    return seterr(-ENOTSUP, "declog: built without sched/sched.h");
#endif
}

int declog_decision_record(declog *d, const fmt_decision *rec)
{
    if (!d || d->log[0].fd < 0) return 0;
    char line[DECLOG_LINE_MAX + 1];
    int n = fmt_decision_format(rec, line, sizeof line);
    if (n < 0) return count_drop(&d->log[0], n);
    return ring_put(d, &d->log[0], line, (size_t)n);
}

/* ---- request log -------------------------------------------------------------------- */

int declog_request_line(declog *d, const declog_request *r)
{
    if (!d || d->log[1].fd < 0) return 0;
    char line[DECLOG_LINE_MAX + 1];
    int n = fmt_request_format(r, line, sizeof line);
    if (n < 0) return count_drop(&d->log[1], n);
    return ring_put(d, &d->log[1], line, (size_t)n);
}

/* ---- accounting --------------------------------------------------------------------- */

void declog_dropped(const declog *d, uint64_t *decision_lines, uint64_t *request_lines)
{
    if (decision_lines)
        *decision_lines = d ? atomic_load_explicit(&d->log[0].dropped, memory_order_relaxed) : 0;
    if (request_lines)
        *request_lines = d ? atomic_load_explicit(&d->log[1].dropped, memory_order_relaxed) : 0;
}

void declog_queued(const declog *d, uint64_t *decision_lines, uint64_t *request_lines)
{
    if (decision_lines)
        *decision_lines = d ? atomic_load_explicit(&d->log[0].lines, memory_order_relaxed) : 0;
    if (request_lines)
        *request_lines = d ? atomic_load_explicit(&d->log[1].lines, memory_order_relaxed) : 0;
}

int declog_flush(declog *d, int timeout_ms)
{
    if (!d || !d->writer_started) return 0;
    uint64_t target[DECLOG_NLOGS];
    for (int i = 0; i < DECLOG_NLOGS; i++)
        target[i] = atomic_load_explicit(&d->log[i].prod, memory_order_relaxed);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        bool done = true;
        for (int i = 0; i < DECLOG_NLOGS; i++)
            if (d->log[i].fd >= 0 &&
                atomic_load_explicit(&d->log[i].cons, memory_order_acquire) < target[i])
                done = false;
        if (done) return 0;
        wake_writer(d);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long ms = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (ms >= timeout_ms)
            return seterr(-ETIMEDOUT, "declog: writer did not drain within %d ms", timeout_ms);
        struct timespec ts = {0, 200 * 1000};
        nanosleep(&ts, NULL);
    }
}
