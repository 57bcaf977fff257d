/* SPDX-License-Identifier: MIT */
/*
 * daemon/loop.c — ringlmd's event loop: one thread, one io_uring, and the dispatch.
 *
 * user_data of our own SQEs is either a small constant (listener, signalfd, ignored
 * cancels) or a session's (session.c: its pointer with the operation in the low 3 bits);
 * services set bit 63 (DLOOP_UD_SVC).  Sessions — their handshake, operations in flight
 * and teardown — are session.c's; the loop accepts, dispatches completions and records,
 * runs the service's iteration, publishes, and sleeps.
 *
 * The handshake thread: while the loop's thread is inside an engine step (between
 * dloop_engine_begin and dloop_engine_end, which release and retake the loop's lock), a
 * second thread accepts new connections and answers their hellos, so that a client
 * connecting to a busy daemon has its session in the time of its handshake, not after the
 * step (a prefill of many prompts runs for hundreds of milliseconds).  It takes the lock
 * only with trylock: whenever the loop's thread holds it, the loop does this work itself
 * (its poll on the listener and the hello recv on its ring complete as before), so a
 * connection is never left to a thread that cannot serve it.
 */
#include "daemon/loop.h"
#include "common/errdetail.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <dirent.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon/session.h"
#include "numa/rnuma.h"

#include "shm/ring.h"

enum {
    UD_ACCEPT = 1,
    UD_SIGNAL = 2,
    UD_IGNORE = DLOOP_UD_IGNORE,
    UD_FUTEX_WAKE = 4, /* completes only when it failed (IOSQE_CQE_SKIP_SUCCESS) */
};

#define DEFAULT_MAX_SESSIONS      256
#define DEFAULT_MAX_PER_UID       64
#define DEFAULT_MAX_HALF_OPEN     64
#define DEFAULT_HALF_OPEN_PER_UID 8
#define DEFAULT_SUBMIT_BYTES      (1u << 20)
#define DEFAULT_EVENT_SLOTS       (1u << 16)
#define DEFAULT_IDLE_SPIN_US      50
#define DEFAULT_CONNECT_RATE      20
#define DEFAULT_CONNECT_BURST     64
#define HOUSEKEEPING_US           (200 * 1000)
#define RECORDS_PER_SESSION_ITER  256
#define EMFILE_LOG_EVERY_US       (10 * 1000 * 1000)
/* Descriptors kept beside the sessions' (logs, the metrics server and its clients, io_uring,
 * the engine, the KV tiers): at most this many, and at most a quarter of the limit. */
#define FD_RESERVE_MAX            192

struct dloop {
    dloop_config cfg;
    char socket_path[108];
    const dsvc_ops *ops;
    void *ctx;
    struct io_uring ring;
    int ring_ok;
    int listen_fd;
    /* Kept open to be given up when accept finds the process out of descriptors: the one
     * it frees takes the connection, which is refused with a reason instead of waiting in
     * the backlog for its hello timeout. */
    int spare_fd;
    uint64_t emfile_logged_us; /* the last "out of descriptors" line (one per 10 s) */
    unsigned emfile_unlogged;  /* refusals since */
    /* The socket file this process bound (socket_path set only then): dloop_destroy
     * unlinks the path only while it is still that file, never one found there before nor
     * one another process put there since. */
    dev_t socket_dev;
    ino_t socket_ino;
    int sig_fd;
    struct signalfd_siginfo siginfo;
    int use_futex;
    int stop;
    int draining;
    uint64_t policy_hash;
    struct ringlm_wire_load load; /* dloop_publish_load */
    uint64_t t0_ns;
    uint64_t now_us;
    uint64_t futex_wakes; /* clients woken by publish_sessions, ever */
    int ring_wake_ok;     /* client wakes go through io_uring (IORING_OP_FUTEX_WAKE) */
    int ring_wakes;       /* queued by this publish_sessions, not yet submitted */
    uint64_t wake_at_us;
    dsess_list sessions;

    /* the handshake thread (see the top) */
    pthread_mutex_t mu; /* held by the loop's thread except in engine steps */
    int hs_running;
    pthread_t hs_thread;
    int hs_epfd, hs_stop_fd, hs_wake_fd;
    int loop_wants_mu; /* the engine step ended: the handshake thread yields */
    int hs_missed;     /* it found the lock taken: wake it at the next step */
};

enum { HS_LISTENER, HS_STOP, HS_WAKE, HS_HELLO }; /* what woke the handshake thread */

ERRDETAIL_DEFINE(errmsg);
#define set_err(err, ...) errdetail_set(&errmsg, (err), __VA_ARGS__)

const char *dloop_errmsg(void)
{
    return errmsg.msg;
}

void dloop_config_init(dloop_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->numa_node = -1;
    cfg->socket_gid = -1;
}

static int is_pow2(unsigned v)
{
    return v && !(v & (v - 1));
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- SQEs ----------------------------------------------------------------------------- */
struct io_uring_sqe *dloop_sqe(dloop *l)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
    if (!sqe) {
        io_uring_submit(&l->ring);
        sqe = io_uring_get_sqe(&l->ring);
    }
    return sqe; /* NULL only if the kernel refuses to take SQEs: callers end the session */
}

/* A multishot poll on the (non-blocking) listener, and every pending connection accepted
 * in the same drain, not one per iteration (an iteration holds an engine step: 32 clients
 * connecting to a busy daemon waited up to 32 steps for their turn).  A poll, not an
 * io_uring accept: that would take the connection in the loop thread's task work during
 * an engine step, out of the handshake thread's reach, to be answered after the step. */
static int arm_accept(dloop *l)
{
    struct io_uring_sqe *sqe = dloop_sqe(l);
    if (!sqe) return -EBUSY;
    io_uring_prep_poll_multishot(sqe, l->listen_fd, POLLIN);
    io_uring_sqe_set_data64(sqe, UD_ACCEPT);
    return 0;
}

/* The client's hello is normally queued already (it sends it right after connect), and a
 * closed peer still delivers this answer before EOF. */
static void refuse_raw(int fd, int err, const char *detail)
{
    struct ringlm_wire_welcome w;
    memset(&w, 0, sizeof(w));
    w.magic = RINGLM_WIRE_MAGIC;
    w.abi = RINGLM_WIRE_ABI;
    w.status = err;
    snprintf(w.detail, sizeof(w.detail), "%s", detail);
    if (send(fd, &w, sizeof(w), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) { /* it left: nothing to tell */
    }
}

/* Out of descriptors (EMFILE/ENFILE): the spare one takes the connection to refuse it,
 * and the log says so once per 10 s, with the count since, not once per try. 1 when a
 * connection was refused (look for more), 0 when none could be taken. */
static int refuse_out_of_fds(dloop *l, int err)
{
    int refused = 0;
    if (l->spare_fd >= 0) {
        close(l->spare_fd);
        l->spare_fd = -1;
        int fd = accept4(l->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            struct rlimit rl = {0};
            getrlimit(RLIMIT_NOFILE, &rl);
            char d[160];
            snprintf(d, sizeof d,
                     "the daemon is out of file descriptors (open files limit %llu); try "
                     "again later",
                     (unsigned long long)rl.rlim_cur);
            refuse_raw(fd, -err, d);
            close(fd);
            refused = 1;
        }
        l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    uint64_t now = dloop_clock_us(l);
    l->emfile_unlogged++;
    if (!l->emfile_logged_us || now - l->emfile_logged_us >= EMFILE_LOG_EVERY_US) {
        fprintf(stderr,
                "ringlmd: accept: %s: %u connection(s) refused since the last report (raise "
                "LimitNOFILE= / ulimit -n, or lower --max-sessions)\n",
                strerror(err), l->emfile_unlogged);
        l->emfile_logged_us = now ? now : 1;
        l->emfile_unlogged = 0;
    }
    return refused;
}

/* Accepts one pending connection: 1, or 0 when none is pending (or accept failed: the next
 * poll completion or the housekeeping tick tries again). */
static int accept_one(dloop *l)
{
    for (;;) {
        int fd = accept4(l->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            dsess_accept(l, fd);
            return 1;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) return refuse_out_of_fds(l, errno);
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            fprintf(stderr, "ringlmd: accept: %s\n", strerror(errno));
        return 0;
    }
}

static void accept_pending(dloop *l)
{
    while (accept_one(l))
        ;
}

static int arm_signal(dloop *l)
{
    struct io_uring_sqe *sqe = dloop_sqe(l);
    if (!sqe) return -EBUSY;
    io_uring_prep_read(sqe, l->sig_fd, &l->siginfo, sizeof(l->siginfo), 0);
    io_uring_sqe_set_data64(sqe, UD_SIGNAL);
    return 0;
}

static void dispatch_cqe(dloop *l, struct io_uring_cqe *cqe)
{
    uint64_t ud = io_uring_cqe_get_data64(cqe);
    int res = cqe->res;

    if (ud & DLOOP_UD_SVC) {
        if (l->ops->on_cqe) l->ops->on_cqe(l->ctx, cqe);
        return;
    }
    switch (ud) {
    case UD_ACCEPT:
        if (res >= 0)
            accept_pending(l);
        else if (res != -EINTR && res != -ECANCELED)
            fprintf(stderr, "ringlmd: poll on the listener: %s\n", strerror(-res));
        if (!(cqe->flags & IORING_CQE_F_MORE) && !l->stop)
            arm_accept(l); /* the kernel ended the multishot (an error, overflow) */
        return;
    case UD_SIGNAL:
        if (res == (int)sizeof(l->siginfo)) {
            int signo = (int)l->siginfo.ssi_signo;
            if (l->ops->on_signal)
                l->ops->on_signal(l->ctx, signo);
            else if (signo != SIGHUP)
                l->stop = 1;
        }
        if (!l->stop) arm_signal(l);
        return;
    case UD_IGNORE: return;
    case UD_FUTEX_WAKE:
        /* Never expected; if the kernel refuses them, wake with the system call. The
		 * client it was for wakes on its own within its liveness slice (20 ms). */
        if (res < 0 && l->ring_wake_ok) {
            fprintf(stderr,
                    "ringlmd: io_uring futex wake failed (%s); waking clients with "
                    "futex(2) from now on\n",
                    strerror(-res));
            l->ring_wake_ok = 0;
        }
        return;
    }
    if (ud < DSESS_UD_MIN) return;
    dsess_on_cqe(ud, res);
}

static int drain_cqes(dloop *l)
{
    struct io_uring_cqe *cqe;
    unsigned head, n = 0;
    io_uring_for_each_cqe(&l->ring, head, cqe)
    {
        dispatch_cqe(l, cqe);
        n++;
    }
    if (n) io_uring_cq_advance(&l->ring, n);
    return (int)n;
}

/* ---- records -------------------------------------------------------------------------- */
static int on_record(void *arg, dsess *s, const struct ringlm_wire_parsed *rec)
{
    dloop *l = arg;
    if (rec->type == RINGLM_WIRE_REC_CANCEL) {
        if (l->ops->on_cancel) l->ops->on_cancel(l->ctx, s, rec->cancel_id);
        return 0;
    }
    if (l->draining) {
        int r = dsess_push_finish(s, rec->req->req_id, RINGLM_WIRE_R_REJECTED,
                                  RINGLM_WIRE_R_DRAINING, 0, 0);
        return r == -EAGAIN ? -EAGAIN : 0;
    }
    if (l->ops->on_request)
        l->ops->on_request(l->ctx, s, rec,
                           (rec->req->flags & RINGLM_WIRE_REQ_F_TENANT) ? rec->tenant_tag : NULL);
    return 0;
}

static int drain_sessions(dloop *l)
{
    int work = 0;
    char why[200];
    for (dsess *s = dsess_first(l); s; s = dsess_next(s)) {
        if (!dsess_active(s)) continue;
        int budget =
            l->ops->drain_budget ? l->ops->drain_budget(l->ctx, s) : RECORDS_PER_SESSION_ITER;
        if (budget <= 0) continue; /* paused, or its share of this iteration is used up */
        if (budget > RECORDS_PER_SESSION_ITER) budget = RECORDS_PER_SESSION_ITER;
        int n = dsess_drain_submit(s, (unsigned)budget, on_record, l, why, sizeof(why));
        if (n < 0) {
            char r[240];
            snprintf(r, sizeof(r), "hostile: %s", why);
            dsess_end(s, r);
            work = 1;
        } else if (n > 0) {
            work = 1;
        }
    }
    return work;
}

/* Every session's events of this iteration go out together, and the clients asleep on
 * them are woken at most once each, with one system call for all of them (the wakes are
 * queued on the ring and submitted here) rather than one per client. */
static int publish_sessions(dloop *l)
{
    int work = 0;
    l->ring_wakes = 0;
    for (dsess *s = dsess_first(l); s; s = dsess_next(s))
        if (dsess_active(s)) {
            int r = dsess_publish(s);
            work |= r != 0;
            l->futex_wakes += r == 2;
        }
    if (l->ring_wakes) io_uring_submit(&l->ring);
    return work;
}

int dloop_queue_futex_wake(dloop *l, const uint32_t *word)
{
    if (!l->ring_wake_ok) return -ENOTSUP;
    struct io_uring_sqe *sqe = dloop_sqe(l);
    if (!sqe) return -EBUSY;
    io_uring_prep_rw(DLOOP_IORING_OP_FUTEX_WAKE, sqe, DLOOP_FUTEX2_SIZE_U32, NULL, 0, 0);
    sqe->addr = (uint64_t)(uintptr_t)word;
    sqe->addr2 = 1; /* wake one: the client's one waiting thread */
    sqe->addr3 = DLOOP_FUTEX_BITSET_ANY;
    sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
    io_uring_sqe_set_data64(sqe, UD_FUTEX_WAKE);
    l->ring_wakes++;
    return 0;
}

/* ---- sleeping ------------------------------------------------------------------------- */
/* The sleep handshake with every client (shm/ring.h): announce, look again, arm the
 * doorbells, then wait in io_uring.  A client that published before seeing our flag is
 * caught by the second look; one that published after sees the flag and rings. */
static void loop_sleep(dloop *l)
{
    for (dsess *s = dsess_first(l); s; s = dsess_next(s))
        if (dsess_active(s)) dsess_announce_sleep(s);
    int pending = 0;
    for (dsess *s = dsess_first(l); s; s = dsess_next(s)) {
        int paused = l->ops->drain_budget && l->ops->drain_budget(l->ctx, s) < 0;
        if (dsess_active(s) && dsess_prepare_sleep(s, paused)) {
            pending = 1;
            break;
        }
    }
    if (!pending && !l->sessions.to_end && !l->stop) {
        uint64_t wait_us = HOUSEKEEPING_US;
        if (l->wake_at_us) {
            wait_us = l->wake_at_us > l->now_us ? l->wake_at_us - l->now_us : 0;
            if (wait_us > HOUSEKEEPING_US) wait_us = HOUSEKEEPING_US;
        }
        struct __kernel_timespec ts = {.tv_sec = (long long)(wait_us / 1000000),
                                       .tv_nsec = (long long)(wait_us % 1000000) * 1000};
        struct io_uring_cqe *cqe;
        if (wait_us > 0) io_uring_submit_and_wait_timeout(&l->ring, &cqe, 1, &ts, NULL);
    }
    for (dsess *s = dsess_first(l); s; s = dsess_next(s))
        if (dsess_active(s)) dsess_clear_sleep(s);
}

/* ---- the handshake thread -------------------------------------------------------------- */
static int hs_yield(dloop *l)
{
    return __atomic_load_n(&l->loop_wants_mu, __ATOMIC_SEQ_CST);
}

/* Takes the loop's lock only while the loop's thread is in an engine step and has not asked
 * for it back; 1 if taken. */
static int hs_lock(dloop *l)
{
    return !hs_yield(l) && pthread_mutex_trylock(&l->mu) == 0;
}

/* Accepts what is pending and answers the hellos that are there.  Lock taken: the loop's
 * thread runs, and would answer them only at its next drain, after its next step if it is
 * about to start one: we ask to be woken when it does (dloop_engine_begin), then look
 * again in case it just did. */
static void hs_round(dloop *l)
{
    if (!hs_lock(l)) {
        __atomic_store_n(&l->hs_missed, 1, __ATOMIC_SEQ_CST);
        if (!hs_lock(l)) return;
    }
    /* At most max_sessions sessions are in their half-open grace (dsess_accept); more
	 * wait in the listen backlog, as without the thread. */
    while (!hs_yield(l) && l->sessions.deferred < l->cfg.max_sessions && accept_one(l))
        ;
    dsess_hellos_ready(l, hs_yield);
    pthread_mutex_unlock(&l->mu);
}

static void *hs_main(void *arg)
{
    dloop *l = arg;
    struct epoll_event ev[16];
    for (;;) {
        int n = epoll_wait(l->hs_epfd, ev, 16, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr,
                    "ringlmd: handshake thread: epoll_wait: %s; the loop answers "
                    "every handshake from now on\n",
                    strerror(errno));
            return NULL;
        }
        for (int i = 0; i < n; i++) {
            if (ev[i].data.u64 == HS_STOP) return NULL;
            if (ev[i].data.u64 == HS_WAKE) {
                uint64_t v;
                if (read(l->hs_wake_fd, &v, sizeof(v)) < 0) { /* EAGAIN: already read */
                }
            }
        }
        hs_round(l);
    }
}

/* Edge-triggered: one wake per arriving connection, not one per epoll_wait while the loop
 * holds the lock and the connection waits for it. */
static int hs_start(dloop *l)
{
    l->hs_epfd = epoll_create1(EPOLL_CLOEXEC);
    l->hs_stop_fd = eventfd(0, EFD_CLOEXEC);
    l->hs_wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (l->hs_epfd < 0 || l->hs_stop_fd < 0 || l->hs_wake_fd < 0) return -errno;
    struct epoll_event e = {.events = EPOLLIN | EPOLLET, .data.u64 = HS_LISTENER};
    if (epoll_ctl(l->hs_epfd, EPOLL_CTL_ADD, l->listen_fd, &e) < 0) return -errno;
    e = (struct epoll_event){.events = EPOLLIN, .data.u64 = HS_STOP};
    if (epoll_ctl(l->hs_epfd, EPOLL_CTL_ADD, l->hs_stop_fd, &e) < 0) return -errno;
    e = (struct epoll_event){.events = EPOLLIN, .data.u64 = HS_WAKE};
    if (epoll_ctl(l->hs_epfd, EPOLL_CTL_ADD, l->hs_wake_fd, &e) < 0) return -errno;
    /* It inherits this thread's blocked SIGTERM/SIGINT/SIGHUP (the signalfd's) and nice. */
    int r = pthread_create(&l->hs_thread, NULL, hs_main, l);
    if (r) return -r;
    l->hs_running = 1;
    return 0;
}

static void hs_stop(dloop *l)
{
    if (l->hs_running) {
        uint64_t one = 1;
        if (write(l->hs_stop_fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
            fprintf(stderr, "ringlmd: stopping the handshake thread: %s\n", strerror(errno));
        pthread_join(l->hs_thread, NULL);
        l->hs_running = 0;
    }
    if (l->hs_epfd >= 0) close(l->hs_epfd);
    if (l->hs_stop_fd >= 0) close(l->hs_stop_fd);
    if (l->hs_wake_fd >= 0) close(l->hs_wake_fd);
    l->hs_epfd = l->hs_stop_fd = l->hs_wake_fd = -1;
}

void dloop_engine_begin(dloop *l)
{
    if (l && l->hs_running) {
        __atomic_store_n(&l->loop_wants_mu, 0, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&l->mu);
        if (__atomic_exchange_n(&l->hs_missed, 0, __ATOMIC_SEQ_CST)) {
            uint64_t one = 1;
            if (write(l->hs_wake_fd, &one, sizeof(one)) < 0) { /* counter full: awake anyway */
            }
        }
    }
}

void dloop_engine_end(dloop *l)
{
    if (l && l->hs_running) {
        __atomic_store_n(&l->loop_wants_mu, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&l->mu);
    }
}

uint64_t dloop_clock_us(dloop *l)
{
    return (mono_ns() - l->t0_ns) / 1000;
}

void dloop_watch_hello(dloop *l, int fd)
{
    if (!l->hs_running) return;
    struct epoll_event e = {.events = EPOLLIN | EPOLLONESHOT, .data.u64 = HS_HELLO};
    /* Failing leaves the hello to the loop's recv, as without the thread. */
    if (epoll_ctl(l->hs_epfd, EPOLL_CTL_ADD, fd, &e) < 0 && errno == EEXIST)
        (void)epoll_ctl(l->hs_epfd, EPOLL_CTL_MOD, fd, &e);
}

int dloop_run(dloop *l)
{
    uint64_t last_work_ns = mono_ns();
    uint64_t last_house_us = 0;

    pthread_mutex_lock(&l->mu);
    l->loop_wants_mu = 1;
    int r = hs_start(l);
    if (r < 0) {
        fprintf(stderr,
                "ringlmd: no handshake thread (%s): clients connecting during an "
                "engine step are answered after it\n",
                strerror(-r));
        hs_stop(l);
    }

    while (!l->stop) {
        uint64_t now_ns = mono_ns();
        l->now_us = (now_ns - l->t0_ns) / 1000;
        int work = 0;

        if (io_uring_sq_ready(&l->ring)) io_uring_submit(&l->ring);
        l->wake_at_us = 0; /* callbacks of this iteration ask again if they need it */
        work |= drain_cqes(l) > 0;
        dsess_check_deferred(l);
        dsess_end_pending(l);
        work |= drain_sessions(l);
        dsess_end_pending(l);
        if (l->ops->iterate) work |= l->ops->iterate(l->ctx, l->now_us) > 0;
        dsess_end_pending(l);
        work |= publish_sessions(l);
        if (l->now_us - last_house_us > HOUSEKEEPING_US) {
            last_house_us = l->now_us;
            dsess_expire_hellos(l, l->now_us);
            /* a connection left by a failed accept (EMFILE) gets no new poll
			 * completion until the next one arrives */
            accept_pending(l);
            dsess_end_pending(l);
        }
        if (work) {
            last_work_ns = now_ns;
            continue;
        }
        if (l->wake_at_us && l->wake_at_us <= l->now_us) continue;
        if (now_ns - last_work_ns < (uint64_t)l->cfg.idle_spin_us * 1000) {
            ring_cpu_relax();
            continue;
        }
        loop_sleep(l);
        last_work_ns = mono_ns();
        /* After a wake, spin again for idle_spin_us before the next sleep. */
    }

    /* The handshake thread only ever trylocks: it ends while we hold the lock. */
    hs_stop(l);
    /* Shutdown: every session learns why; their CQEs are reaped by dloop_destroy. */
    dsess_end_all(l, DSESS_END_SHUTDOWN);
    dsess_end_pending(l);
    io_uring_submit(&l->ring);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

void dloop_stop(dloop *l)
{
    l->stop = 1;
}

void dloop_drain(dloop *l)
{
    l->draining = 1;
    dsess_write_state_all(l, RINGLM_WIRE_ST_DRAINING);
}

/* ---- create / destroy ----------------------------------------------------------------- */
static int probe_futex(dloop *l)
{
    struct io_uring_probe *p = io_uring_get_probe_ring(&l->ring);
    int ok = p && p->last_op >= DLOOP_IORING_OP_FUTEX_WAIT &&
             io_uring_opcode_supported(p, DLOOP_IORING_OP_FUTEX_WAIT);
    if (p) io_uring_free_probe(p);
    return ok;
}

/* Whether a listener may be bound at sa's path: nothing there, or a stale socket (replaced
 * when remove is set). Never another kind of file, and never a socket that might be live:
 * only a refused connection says that nobody listens there (a socket we may not connect
 * to, or whose backlog is full, belongs to someone). The directory must exist and let us
 * create the socket. 0 or -errno with the detail. */
static int claim_socket_path(const struct sockaddr_un *sa, bool remove)
{
    const char *path = sa->sun_path;
    char dir[sizeof sa->sun_path];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = 0;
    else
        *slash = 0;
    struct stat st;
    if (stat(dir, &st) < 0)
        return set_err(-errno, "socket directory '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return set_err(-ENOTDIR, "socket directory '%s' is not a directory", dir);
    if (access(dir, W_OK | X_OK) < 0)
        return set_err(-errno, "socket directory '%s': cannot create the socket there (%s)", dir,
                       strerror(errno));
    if (lstat(path, &st) < 0) {
        if (errno == ENOENT) return 0;
        return set_err(-errno, "socket '%s': %s", path, strerror(errno));
    }
    if (!S_ISSOCK(st.st_mode))
        return set_err(-EEXIST, "'%s' exists and is not a socket (left as it is)", path);
    int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (probe < 0) return set_err(-errno, "socket: %s", strerror(errno));
    int c = connect(probe, (const struct sockaddr *)sa, sizeof(*sa));
    int e = c == 0 ? 0 : errno;
    close(probe);
    if (c == 0 || e == EAGAIN || e == EINPROGRESS)
        return set_err(-EADDRINUSE, "another daemon listens on '%s' (left as it is)", path);
    if (e != ECONNREFUSED)
        return set_err(-EEXIST, "'%s' exists and cannot be probed (connect: %s): not replacing it",
                       path, strerror(e));
    if (remove && unlink(path) < 0 && errno != ENOENT)
        return set_err(-errno, "stale socket '%s': unlink: %s", path, strerror(errno));
    return 0;
}

int dloop_check_socket(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (!path || !*path) return set_err(-EINVAL, "no socket path");
    if (strlen(path) >= sizeof(sa.sun_path))
        return set_err(-ENAMETOOLONG, "socket path '%s' longer than %zu bytes", path,
                       sizeof(sa.sun_path) - 1);
    strcpy(sa.sun_path, path);
    return claim_socket_path(&sa, false);
}

static int make_listener(dloop *l)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(l->cfg.socket_path) >= sizeof(sa.sun_path))
        return set_err(-ENAMETOOLONG, "socket path '%s' longer than %zu bytes", l->cfg.socket_path,
                       sizeof(sa.sun_path) - 1);
    strcpy(sa.sun_path, l->cfg.socket_path);
    l->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (l->listen_fd < 0) return set_err(-errno, "socket: %s", strerror(errno));
    int r = claim_socket_path(&sa, true);
    if (r < 0) return r;
    struct stat st;
    if (bind(l->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        return set_err(-errno, "bind '%s': %s", sa.sun_path, strerror(errno));
    /* Ours from here: the error paths below and dloop_destroy may remove it. */
    if (lstat(sa.sun_path, &st) == 0) {
        l->socket_dev = st.st_dev;
        l->socket_ino = st.st_ino;
        snprintf(l->socket_path, sizeof(l->socket_path), "%s", sa.sun_path);
    }
    /* Who may connect is the socket file's owner, group and mode (and the directory's):
	 * set before listen, so no connection is ever accepted under looser permissions. */
    if (l->cfg.socket_gid >= 0 && chown(sa.sun_path, (uid_t)-1, (gid_t)l->cfg.socket_gid) < 0)
        return set_err(-errno, "chown '%s' to group %d: %s", sa.sun_path, l->cfg.socket_gid,
                       strerror(errno));
    if (chmod(sa.sun_path, l->cfg.socket_mode ? l->cfg.socket_mode : 0666) < 0)
        return set_err(-errno, "chmod '%s': %s", sa.sun_path, strerror(errno));
    if (listen(l->listen_fd, 128) < 0) return set_err(-errno, "listen: %s", strerror(errno));
    return 0;
}

/* ---- descriptors --------------------------------------------------------------------- */
static unsigned long long fd_limit_at_start; /* soft limit before dloop_raise_fd_limit */

unsigned long long dloop_raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
    if (!fd_limit_at_start) fd_limit_at_start = rl.rlim_cur;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit up = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl.rlim_cur = rl.rlim_max;
    }
    return rl.rlim_cur;
}

static long fds_open_now(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return 16;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* The session limits the open files limit can hold: each session holds its socket, pidfd
 * and two segments (and an eventfd doorbell where futexes are not used), and while a
 * session is set up another connection can be in its hello grace (one descriptor); the
 * half-open connections one each. Limits over that are lowered, and the start-up line says
 * what the daemon can hold. */
static void fit_fd_limit(dloop *l)
{
    unsigned long long limit = dloop_raise_fd_limit();
    if (!limit) return;
    if (limit == RLIM_INFINITY || limit > (1ull << 30)) limit = 1ull << 30;
    long long room = (long long)limit - fds_open_now() - 1; /* - 1: the spare descriptor */
    long long reserve = room / 4 < FD_RESERVE_MAX ? room / 4 : FD_RESERVE_MAX;
    long long avail = room - reserve;
    int per = (dloop_uses_futex(l) ? 4 : 5) + 1;
    int sessions = l->cfg.max_sessions, half = l->cfg.max_half_open;
    int fit = (long long)sessions * per + half <= avail;
    if (!fit) {
        if (half > avail / 8) half = avail / 8 > 1 ? (int)(avail / 8) : 1;
        long long s = (avail - half) / per;
        sessions = s > 1 ? (int)s : 1;
        l->cfg.max_sessions = sessions;
        l->cfg.max_half_open = half;
        if (l->cfg.max_sessions_per_uid > sessions) l->cfg.max_sessions_per_uid = sessions;
        if (l->cfg.max_half_open_per_uid > half) l->cfg.max_half_open_per_uid = half;
    }
    char was[64] = "";
    if (fd_limit_at_start && fd_limit_at_start != limit)
        snprintf(was, sizeof was, " (raised from %llu)", fd_limit_at_start);
    fprintf(stderr,
            "ringlmd: open files limit %llu%s: room for %d sessions (%d descriptors each) and "
            "%d half-open connections%s\n",
            limit, was, sessions, per, half,
            fit ? "" : ", lowered to fit: raise LimitNOFILE= / ulimit -n for more");
}

int dloop_create(const dloop_config *cfg, const dsvc_ops *ops, void *ctx, dloop **out)
{
    int r;
    *out = NULL;
    if (!cfg || !cfg->socket_path || !*cfg->socket_path || !ops)
        return set_err(-EINVAL, "dloop_create: socket path and ops are required");
    dloop *l = calloc(1, sizeof(*l));
    if (!l) return set_err(-ENOMEM, "out of memory");
    l->cfg = *cfg;
    l->ops = ops;
    l->ctx = ctx;
    l->listen_fd = l->sig_fd = l->spare_fd = -1;
    l->hs_epfd = l->hs_stop_fd = l->hs_wake_fd = -1;
    pthread_mutex_init(&l->mu, NULL);
    if (!l->cfg.max_sessions) l->cfg.max_sessions = DEFAULT_MAX_SESSIONS;
    if (!l->cfg.max_sessions_per_uid) l->cfg.max_sessions_per_uid = DEFAULT_MAX_PER_UID;
    if (!l->cfg.max_half_open) l->cfg.max_half_open = DEFAULT_MAX_HALF_OPEN;
    if (!l->cfg.max_half_open_per_uid) l->cfg.max_half_open_per_uid = DEFAULT_HALF_OPEN_PER_UID;
    if (!l->cfg.connect_rate_per_uid) l->cfg.connect_rate_per_uid = DEFAULT_CONNECT_RATE;
    if (!l->cfg.connect_burst_per_uid) l->cfg.connect_burst_per_uid = DEFAULT_CONNECT_BURST;
    if (!l->cfg.submit_ring_bytes) l->cfg.submit_ring_bytes = DEFAULT_SUBMIT_BYTES;
    if (!l->cfg.event_ring_slots) l->cfg.event_ring_slots = DEFAULT_EVENT_SLOTS;
    if (!l->cfg.idle_spin_us) l->cfg.idle_spin_us = DEFAULT_IDLE_SPIN_US;
    if (!is_pow2(l->cfg.submit_ring_bytes) || l->cfg.submit_ring_bytes < RINGLM_WIRE_SUBMIT_MIN ||
        l->cfg.submit_ring_bytes > RINGLM_WIRE_SUBMIT_MAX) {
        r = set_err(-EINVAL, "submit ring of %u bytes: must be a power of two in [%u, %u]",
                    l->cfg.submit_ring_bytes, RINGLM_WIRE_SUBMIT_MIN, RINGLM_WIRE_SUBMIT_MAX);
        goto fail;
    }
    if (!is_pow2(l->cfg.event_ring_slots) || l->cfg.event_ring_slots < RINGLM_WIRE_EVSLOTS_MIN ||
        l->cfg.event_ring_slots > RINGLM_WIRE_EVSLOTS_MAX) {
        r = set_err(-EINVAL, "event ring of %u slots: must be a power of two in [%u, %u]",
                    l->cfg.event_ring_slots, RINGLM_WIRE_EVSLOTS_MIN, RINGLM_WIRE_EVSLOTS_MAX);
        goto fail;
    }
    if (l->cfg.max_sessions < 0 || l->cfg.max_sessions_per_uid < 0 || l->cfg.max_half_open < 0 ||
        l->cfg.max_half_open_per_uid < 0 || l->cfg.connect_burst_per_uid < 0) {
        r = set_err(-EINVAL, "negative session limits");
        goto fail;
    }
    l->t0_ns = mono_ns();

    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    r = io_uring_queue_init_params(1024, &l->ring, &p);
    if (r < 0) {
        r = set_err(r, "io_uring_queue_init: %s", strerror(-r));
        goto fail;
    }
    l->ring_ok = 1;
    l->use_futex = probe_futex(l);
    /* FUTEX_WAKE came with FUTEX_WAIT (6.7); CQE_SKIP_SUCCESS long before (5.17). */
    l->ring_wake_ok = l->use_futex && (p.features & IORING_FEAT_CQE_SKIP);
    fit_fd_limit(l);
    l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

    /* The signals reach the loop through a signalfd only while blocked in this thread:
	 * the program blocks them once, before it starts any thread (main_ringlmd.c). */
    sigset_t set, blocked;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, NULL, &blocked);
    if (!sigismember(&blocked, SIGTERM) || !sigismember(&blocked, SIGINT) ||
        !sigismember(&blocked, SIGHUP)) {
        r = set_err(-EINVAL, "SIGTERM, SIGINT and SIGHUP must be blocked in the loop's "
                             "thread before dloop_create (they arrive through a signalfd)");
        goto fail;
    }
    l->sig_fd = signalfd(-1, &set, SFD_CLOEXEC);
    if (l->sig_fd < 0) {
        r = set_err(-errno, "signalfd: %s", strerror(errno));
        goto fail;
    }
    if ((r = make_listener(l)) < 0) goto fail;
    if ((r = arm_accept(l)) < 0 || (r = arm_signal(l)) < 0) {
        r = set_err(r, "io_uring: no submission queue entries");
        goto fail;
    }
    io_uring_submit(&l->ring);
    *out = l;
    return 0;
fail:
    dloop_destroy(l);
    return r;
}

void dloop_destroy(dloop *l)
{
    if (!l) return;
    /* io_uring_queue_exit cancels and waits for everything in flight, after which the
	 * session structs are no longer referenced. */
    if (l->ring_ok) io_uring_queue_exit(&l->ring);
    dsess_free_all(l);
    if (l->listen_fd >= 0) {
        close(l->listen_fd);
        struct stat st;
        if (l->socket_path[0] && lstat(l->socket_path, &st) == 0 && S_ISSOCK(st.st_mode) &&
            st.st_dev == l->socket_dev && st.st_ino == l->socket_ino)
            unlink(l->socket_path);
    }
    if (l->sig_fd >= 0) close(l->sig_fd);
    if (l->spare_fd >= 0) close(l->spare_fd);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

struct io_uring *dloop_ring(dloop *l)
{
    return &l->ring;
}
uint64_t dloop_now_us(dloop *l)
{
    return l->now_us;
}
uint64_t dloop_futex_wakes(dloop *l)
{
    return l->futex_wakes;
}
const char *dloop_doorbell_mode(dloop *l)
{
    return dloop_uses_futex(l) ? "futex" : "eventfd";
}
int dloop_session_count(dloop *l)
{
    return l->sessions.live;
}
uint64_t dloop_policy_hash(dloop *l)
{
    return l->policy_hash;
}

void dloop_wake_after_us(dloop *l, uint64_t us)
{
    uint64_t at = l->now_us + us;
    if (!l->wake_at_us || at < l->wake_at_us) l->wake_at_us = at;
}

void dloop_set_policy_hash(dloop *l, uint64_t hash)
{
    l->policy_hash = hash;
    dsess_write_policy_hash_all(l, hash);
}

void dloop_publish_load(dloop *l, uint32_t waiting, uint32_t running, uint32_t kv_used,
                        uint32_t kv_total, uint64_t iterations)
{
    struct ringlm_wire_load *ld = &l->load;
    if (ld->waiting == waiting && ld->running == running && ld->kv_used == kv_used &&
        ld->kv_total == kv_total && ld->iterations)
        return;
    *ld = (struct ringlm_wire_load){.waiting = waiting,
                                    .running = running,
                                    .kv_used = kv_used,
                                    .kv_total = kv_total,
                                    .iterations = iterations ? iterations : 1};
    dsess_write_load_all(l, ld);
}

const struct ringlm_wire_load *dloop_load(dloop *l)
{
    return &l->load;
}

/* ---- what session.c needs of the loop -------------------------------------------------- */
dsess_list *dloop_sessions(dloop *l)
{
    return &l->sessions;
}
const dloop_config *dloop_cfg(dloop *l)
{
    return &l->cfg;
}
int dloop_is_draining(dloop *l)
{
    return l->draining;
}
int dloop_uses_futex(dloop *l)
{
    return l->use_futex && !l->cfg.force_eventfd;
}
const dsvc_ops *dloop_service(dloop *l, void **ctx)
{
    *ctx = l->ctx;
    return l->ops;
}
