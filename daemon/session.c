/* SPDX-License-Identifier: MIT */
/*
 * daemon/session.c — a client session on the daemon side: its state machine (see
 * session.h), the handshake, the io_uring operations it keeps in flight and its teardown.
 * Its memory (segments, rings, status words, event pushes) is session_shm.c's; struct
 * dsess is private to the two (session_priv.h).
 */
#include "daemon/session_priv.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shm/ring.h"

#define HELLO_TIMEOUT_US   (5 * 1000 * 1000)
/* A connection whose hello is not there when it is accepted is charged to the half-open
 * budget only if it still has none this long after: a client sends its hello right after
 * connect, but on a loaded machine it may not run between the two for hundreds of ms (64
 * clients of one uid connecting at once to a daemon at nice -10 on 2 vCPUs: up to 0.3 s
 * seen), and a burst of one user's clients must not be refused for that (dsess_accept). */
#define HALF_OPEN_GRACE_US (1000 * 1000)

/* ---- io_uring operations in flight --------------------------------------------------- */

static uint64_t sess_ud(dsess *s, int op)
{
    return (uint64_t)(uintptr_t)s | (uint64_t)op;
}

static int arm_op_db(dsess *s, int op, uint32_t doorbell_seen)
{
    dloop *l = s->loop;
    if (s->armed & (1u << op)) return 0;
    struct io_uring_sqe *sqe = dloop_sqe(l);
    if (!sqe) return -EBUSY;
    switch (op) {
    case DSESS_OP_RECV: io_uring_prep_recv(sqe, s->sock, s->rxbuf, sizeof(s->rxbuf), 0); break;
    case DSESS_OP_PIDFD: io_uring_prep_poll_add(sqe, s->pidfd, POLLIN); break;
    case DSESS_OP_DOORBELL:
        if (s->efd >= 0) {
            io_uring_prep_read(sqe, s->efd, &s->eventfd_buf, sizeof(s->eventfd_buf), 0);
        } else {
            /* IORING_OP_FUTEX_WAIT by hand: fd = futex2 flags (shared, u32),
			 * addr = word, addr2 = expected value, addr3 = wake mask.  The value
			 * was read before the rings were checked (dsess_prepare_sleep). */
            uint32_t seen = doorbell_seen;
            io_uring_prep_rw(DLOOP_IORING_OP_FUTEX_WAIT, sqe, DLOOP_FUTEX2_SIZE_U32, NULL, 0, 0);
            sqe->addr = (uint64_t)(uintptr_t)&s->cseg->doorbell;
            sqe->addr2 = seen;
            sqe->addr3 = DLOOP_FUTEX_BITSET_ANY;
        }
        break;
    }
    io_uring_sqe_set_data64(sqe, sess_ud(s, op));
    s->armed |= 1u << op;
    s->inflight++;
    return 0;
}

static int arm_op(dsess *s, int op)
{
    return arm_op_db(s, op, 0);
}

static void cancel_op(dsess *s, int op)
{
    if (!(s->armed & (1u << op))) return;
    struct io_uring_sqe *sqe = dloop_sqe(s->loop);
    if (!sqe) return; /* io_uring_queue_exit cancels it at the latest */
    io_uring_prep_cancel64(sqe, sess_ud(s, op), 0);
    io_uring_sqe_set_data64(sqe, DLOOP_UD_IGNORE);
}

/* ---- lifecycle: accept, handshake, completions, end ---------------------------------- */
static void sess_link(dsess_list *ls, dsess *s)
{
    s->next = ls->all;
    s->prev = NULL;
    if (ls->all) ls->all->prev = s;
    ls->all = s;
}

/* Every phase change goes through here, so the counts the limits read stay exact. */
/* The five counters of dsess_list are sums over the sessions of what count() says of each,
 * kept by one function: every change of a session's phase, check_deferred or rate_wait goes
 * through set_state, which takes the session out of the sums and puts it back. */
static void count(dsess_list *ls, const dsess *s, int sign)
{
    int hello = s->phase == DSESS_HELLO, active = s->phase == DSESS_ACTIVE;
    ls->live += sign * (hello || active);
    ls->active += sign * active;
    ls->half_open += sign * hello;
    ls->deferred += sign * (s->check_deferred != 0);
    ls->rate_waiting += sign * (s->rate_wait != 0);
}

static void set_state(dsess *s, int phase, int check_deferred, int rate_wait)
{
    dsess_list *ls = dloop_sessions(s->loop);
    count(ls, s, -1);
    s->phase = phase;
    s->check_deferred = check_deferred;
    s->rate_wait = rate_wait;
    count(ls, s, +1);
}

/* A session waits for its grace or its connect rate only while in HELLO. */
static void set_phase(dsess *s, int phase)
{
    int hello = phase == DSESS_HELLO;
    set_state(s, phase, hello && s->check_deferred, hello && s->rate_wait);
}

/* At most LOG_BURST lines a second about ended or refused sessions; the rest are counted
 * and the count is printed when the next second opens. */
#define LOG_BURST     10
#define LOG_WINDOW_US 1000000u

static int log_allowed(dsess_list *ls, uint64_t now_us)
{
    if (now_us - ls->log_window_us >= LOG_WINDOW_US) {
        if (ls->log_suppressed)
            fprintf(stderr, "ringlmd: %u more session ends or refusals not shown (rate limit)\n",
                    ls->log_suppressed);
        ls->log_window_us = now_us;
        ls->log_lines = ls->log_suppressed = 0;
    }
    if (ls->log_lines < LOG_BURST) {
        ls->log_lines++;
        return 1;
    }
    ls->log_suppressed++;
    return 0;
}

static void sess_free(dsess *s)
{
    dsess_list *ls = dloop_sessions(s->loop);
    if (s->prev)
        s->prev->next = s->next;
    else
        ls->all = s->next;
    if (s->next) s->next->prev = s->prev;
    dsess_segments_destroy(s);
    if (s->sock >= 0) close(s->sock);
    if (s->pidfd >= 0) close(s->pidfd);
    if (s->efd >= 0) close(s->efd);
    free(s);
}

static void end_as(dsess *s, dsess_end_cause cause, const char *reason)
{
    if (s->ending) return;
    s->ending = 1;
    s->end_cause = cause;
    snprintf(s->end_reason, sizeof(s->end_reason), "%s", reason);
    dsess_list *ls = dloop_sessions(s->loop);
    s->end_next = ls->to_end;
    ls->to_end = s;
}

void dsess_end(dsess *s, const char *reason)
{
    end_as(s, DSESS_END_FAULT, reason);
}

void dsess_end_for(dsess *s, dsess_end_cause cause)
{
    static const char *const words[] = {
        [DSESS_END_FAULT] = "session fault",
        [DSESS_END_CLIENT_CLOSED] = "client closed the connection",
        [DSESS_END_CLIENT_EXITED] = "client process exited",
        [DSESS_END_SHUTDOWN] = "shutdown",
    };
    if ((unsigned)cause >= sizeof words / sizeof words[0]) cause = DSESS_END_FAULT;
    end_as(s, cause, words[cause]);
}

/* Runs outside callbacks: on_close, status CLOSED, cancel in-flight ops, release the
 * memory and fds now (the kernel keeps what in-flight ops still reference). */
void dsess_end_pending(dloop *l)
{
    dsess_list *ls = dloop_sessions(l);
    void *ctx;
    const dsvc_ops *ops = dloop_service(l, &ctx);
    while (ls->to_end) {
        dsess *s = ls->to_end;
        ls->to_end = s->end_next;
        if (s->phase == DSESS_ZOMBIE) continue;
        if (s->end_cause == DSESS_END_FAULT && log_allowed(ls, dloop_now_us(l)))
            fprintf(stderr, "ringlmd: session %llu (uid %u pid %d) ended: %s\n",
                    (unsigned long long)s->id, (unsigned)s->uid, (int)s->pid, s->end_reason);
        if (s->svc_knows && ops->on_close) ops->on_close(ctx, s, s->end_reason);
        s->svc_knows = 0;
        int err = s->end_cause == DSESS_END_SHUTDOWN ? -ESHUTDOWN : -ECONNRESET;
        dsess_write_closed(s, err, s->end_reason);
        set_phase(s, DSESS_ZOMBIE);
        cancel_op(s, DSESS_OP_RECV);
        cancel_op(s, DSESS_OP_PIDFD);
        cancel_op(s, DSESS_OP_DOORBELL);
        /* shutdown() makes the client see EOF now, even while a cancelled recv still
		 * holds a file reference. */
        if (s->sock >= 0) {
            /* Unread data at close would make the client's read of our last
			 * message fail with ECONNRESET. */
            char junk[256];
            while (recv(s->sock, junk, sizeof(junk), MSG_DONTWAIT) > 0)
                ;
            shutdown(s->sock, SHUT_RDWR);
        }
        dsess_segments_destroy(s);
        if (s->pidfd >= 0) {
            close(s->pidfd);
            s->pidfd = -1;
        }
        if (s->efd >= 0) {
            close(s->efd);
            s->efd = -1;
        }
        if (s->inflight == 0) sess_free(s);
    }
}

static int send_welcome(dsess *s, int status, const char *detail, int with_fds)
{
    struct ringlm_wire_welcome w;
    memset(&w, 0, sizeof(w));
    w.magic = RINGLM_WIRE_MAGIC;
    w.abi = RINGLM_WIRE_ABI;
    w.status = status;
    w.doorbell_mode = s->efd >= 0 ? RINGLM_WIRE_DB_EVENTFD : RINGLM_WIRE_DB_FUTEX;
    w.session_id = s->id;
    w.cseg_bytes = s->cseg_bytes;
    w.dseg_bytes = s->dseg_bytes;
    w.policy_hash = dloop_policy_hash(s->loop);
    snprintf(w.detail, sizeof(w.detail), "%s", detail ? detail : "");

    int fds[3] = {s->cfd, s->dfd, s->efd};
    int nfds = s->efd >= 0 ? 3 : 2;
    union {
        char buf[CMSG_SPACE(sizeof(int) * 3)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = &w, .iov_len = sizeof(w)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (with_fds) {
        memset(&ctl, 0, sizeof(ctl));
        msg.msg_control = ctl.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    /* A fresh SEQPACKET socket has room for one message: this never blocks; if it
	 * would, the client is misbehaving and loses its session. */
    ssize_t n = sendmsg(s->sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    return n == (ssize_t)sizeof(w) ? 0 : -errno;
}

void dsess_set_facts(dsess *s, bool tenant_tags, const char *const *classes, int n_classes,
                     uint32_t vocab, uint32_t max_n, const char *model)
{
    struct ringlm_wire_dseg *d = s->dseg;
    uint32_t n = 0;
    for (int i = 0; i < n_classes && n < RINGLM_WIRE_CLASSES_MAX; i++)
        if (classes[i] && strlen(classes[i]) < RINGLM_WIRE_NAME_LEN)
            snprintf(d->classes[n++], RINGLM_WIRE_NAME_LEN, "%s", classes[i]);
    d->n_classes = n;
    /* the client maps the segment only after the welcome: no ordering to publish */
    d->vocab_size = vocab;
    d->max_n = vocab && max_n > 1 ? max_n : 1;
    d->caps = RINGLM_WIRE_CAP_FACTS | (tenant_tags ? RINGLM_WIRE_CAP_TENANT_TAGS : 0) |
              (vocab ? RINGLM_WIRE_CAP_SAMPLING | RINGLM_WIRE_CAP_LOGPROBS : 0) |
              (vocab && max_n > 1 ? RINGLM_WIRE_CAP_SAMPLES : 0) | (d->caps & RINGLM_WIRE_CAP_LOAD);
    if (model && model[0]) {
        snprintf(d->served_model, sizeof d->served_model, "%s", model);
        d->caps |= RINGLM_WIRE_CAP_MODEL;
    }
}

void dsess_set_constraint_kinds(dsess *s, uint32_t kinds)
{
    struct ringlm_wire_dseg *d = s->dseg;
    d->constraint_kinds = kinds;
    if (kinds)
        d->caps |= RINGLM_WIRE_CAP_CONSTRAINT;
    else
        d->caps &= ~RINGLM_WIRE_CAP_CONSTRAINT;
    /* each of n samples attaches the grammar with a matcher of its own (admission) */
    if (kinds && (d->caps & RINGLM_WIRE_CAP_SAMPLES))
        d->caps |= RINGLM_WIRE_CAP_SAMPLES_CONSTRAINED;
    else
        d->caps &= ~RINGLM_WIRE_CAP_SAMPLES_CONSTRAINED;
}

static void refuse(dsess *s, int err, const char *detail)
{
    send_welcome(s, err, detail, 0);
    char r[200];
    snprintf(r, sizeof(r), "refused: %s", detail);
    dsess_end(s, r);
}

/* Sessions of uid not yet ended (HELLO + ACTIVE), and of those the half-open ones charged to
 * the budget (not those in their grace: see dsess_accept). */
static int count_uid(dloop *l, uid_t uid, int *half_open)
{
    int n = 0, h = 0;
    for (dsess *s = dloop_sessions(l)->all; s; s = s->next)
        if (s->phase != DSESS_ZOMBIE && !s->ending && s->uid == uid) {
            n++;
            h += s->phase == DSESS_HELLO && !s->check_deferred;
        }
    if (half_open) *half_open = h;
    return n;
}

/* Sessions of uid in their half-open grace.  The grace has a per-uid bound as the budget
 * has: with only the global one, one uid's sockets held every grace slot, and every other
 * user's connect was then charged at once against a budget that uid had filled too. */
static int count_in_grace(dloop *l, uid_t uid)
{
    int n = 0;
    for (dsess *s = dloop_sessions(l)->all; s; s = s->next)
        n += s->check_deferred && s->uid == uid && s->phase != DSESS_ZOMBIE && !s->ending;
    return n;
}

static void on_hello(dsess *s, const char *buf, int len);
static void hello_setup(dsess *s);
static int half_open_refused(dsess *s);

/* Accounting starts here: SO_PEERCRED is known at accept, so a uid's connections count
 * toward its limit before any hello.  A connection without its hello is half-open and
 * draws on a small budget of its own (per uid and in all), not on the session limit:
 * sockets that never say hello cannot lock other users out.  The client sends its hello
 * right after connect, so it is usually here already and is answered at once, in this
 * iteration, instead of after the next engine step. */
void dsess_accept(dloop *l, int fd)
{
    dsess_list *ls = dloop_sessions(l);
    dsess *s = calloc(1, sizeof(*s));
    if (!s) {
        close(fd);
        return;
    }
    s->loop = l;
    s->id = ++ls->next_id;
    s->sock = fd;
    s->pidfd = s->efd = s->cfd = s->dfd = -1;
    s->hello_deadline_us = dloop_now_us(l) + HELLO_TIMEOUT_US;
    sess_link(ls, s);
    set_phase(s, DSESS_HELLO);

    struct ucred cred;
    socklen_t cl = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
        dsess_end(s, "SO_PEERCRED failed");
        return;
    }
    s->uid = cred.uid;
    s->gid = cred.gid;
    s->pid = cred.pid;

    ssize_t n = recv(fd, s->rxbuf, sizeof(s->rxbuf), MSG_DONTWAIT);
    if (n > 0) {
        on_hello(s, s->rxbuf, (int)n);
        return;
    }
    if (n == 0) {
        dsess_end_for(s, DSESS_END_CLIENT_CLOSED);
        return;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
        dsess_end(s, "recv failed in handshake");
        return;
    }
    /* No hello yet.  The loop, and more so the handshake thread, can accept in the
	 * microseconds between a client's connect and its hello: charge the half-open budget
	 * after a grace (dsess_check_deferred), during which the connection counts for no
	 * budget — as one waiting in the listen backlog would not.  At most max_sessions are in
	 * their grace at once (the handshake thread leaves the rest in the backlog), and of one
	 * uid at most its max_sessions_per_uid: a burst of one user's clients as large as its
	 * session limit all get the grace (with 8 a uid, as the half-open budget, 13 of a burst
	 * of 64 on a loaded machine were refused before their hello was out), while one uid's
	 * half-open flood holds only its share of the grace slots.  Past either, the budget is
	 * charged at once. */
    if (ls->deferred < dloop_cfg(l)->max_sessions &&
        count_in_grace(l, s->uid) < dloop_cfg(l)->max_sessions_per_uid) {
        s->check_at_us = dloop_clock_us(l) + HALF_OPEN_GRACE_US;
        set_state(s, s->phase, 1, s->rate_wait);
    } else if (half_open_refused(s)) {
        return;
    }
    if (arm_op(s, DSESS_OP_RECV) < 0) {
        dsess_end(s, "io_uring submission queue unavailable");
        return;
    }
    /* The handshake thread answers the hello too if it arrives during an engine step
	 * (the recv above is submitted after the step); whichever reads it answers it, the
	 * recv left armed then watches the socket of the ACTIVE session as usual. */
    dloop_watch_hello(l, fd);
}

/* Over the half-open budget (per uid or in all): refused, 1. */
static int half_open_refused(dsess *s)
{
    dloop *l = s->loop;
    const dloop_config *cfg = dloop_cfg(l);
    char d[120];
    int half;
    count_uid(l, s->uid, &half);
    if (half > cfg->max_half_open_per_uid) {
        snprintf(d, sizeof(d), "limit of %d connections without a handshake for uid %u reached",
                 cfg->max_half_open_per_uid, (unsigned)s->uid);
        refuse(s, -EUSERS, d);
        return 1;
    }
    if (dloop_sessions(l)->half_open - dloop_sessions(l)->deferred > cfg->max_half_open) {
        snprintf(d, sizeof(d), "limit of %d connections without a handshake reached",
                 cfg->max_half_open);
        refuse(s, -EUSERS, d);
        return 1;
    }
    return 0;
}

/* Reads and answers s's hello if it is there (our own buffer: the loop's recv on this
 * socket, once submitted, writes rxbuf).  1 answered (or ended), 0 not there yet. */
static int try_hello(dsess *s)
{
    char buf[sizeof(s->rxbuf)];
    ssize_t n = recv(s->sock, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
        on_hello(s, buf, (int)n);
        return 1;
    }
    if (n == 0) {
        dsess_end_for(s, DSESS_END_CLIENT_CLOSED);
        return 1;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
        dsess_end(s, "recv failed in handshake");
        return 1;
    }
    return 0;
}

static void clear_deferred(dsess *s)
{
    if (s->check_deferred) set_state(s, s->phase, 0, s->rate_wait);
}

int dsess_hellos_ready(dloop *l, int (*yield)(dloop *))
{
    int n = 0;
    for (dsess *s = dloop_sessions(l)->all; s && !yield(l); s = s->next) {
        if (s->phase != DSESS_HELLO || s->ending || s->rate_wait) continue;
        if (try_hello(s))
            n++;
        else
            dloop_watch_hello(l, s->sock); /* the loop's recv took it, or not yet */
    }
    return n;
}

void dsess_check_deferred(dloop *l)
{
    if (!dloop_sessions(l)->deferred && !dloop_sessions(l)->rate_waiting) return;
    uint64_t now = dloop_now_us(l), next = 0;
    for (dsess *s = dloop_sessions(l)->all; s; s = s->next) {
        if (s->rate_wait && s->phase == DSESS_HELLO && !s->ending) {
            if (s->rate_at_us > now) {
                if (!next || s->rate_at_us < next) next = s->rate_at_us;
            } else {
                set_state(s, s->phase, s->check_deferred, 0);
                hello_setup(s);
            }
            continue;
        }
        if (!s->check_deferred) continue;
        if (s->phase == DSESS_HELLO && !s->ending && s->check_at_us > now) {
            if (!next || s->check_at_us < next) next = s->check_at_us;
            continue;
        }
        clear_deferred(s);
        if (s->phase == DSESS_HELLO && !s->ending && !try_hello(s)) half_open_refused(s);
    }
    if (next) dloop_wake_after_us(l, next - now);
}

/* Sessions of uid held for the connect rate. */
static int count_rate_waiting(dloop *l, uid_t uid)
{
    int n = 0;
    for (dsess *s = dloop_sessions(l)->all; s; s = s->next)
        n += s->rate_wait && s->uid == uid && s->phase == DSESS_HELLO && !s->ending;
    return n;
}

/* The uid's connect rate (dloop_config.connect_rate_per_uid): a token bucket per uid,
 * refilled on the real clock (the handshake thread answers during engine steps, when the
 * loop's time stands).  0: set up now.  > 0: the µs to hold the session first — its token
 * is taken ahead (the bucket goes below zero, so the next waits longer): a client over the
 * rate waits in its connect instead of being refused and trying again at once (a refused
 * connect loop of three processes cost the loop 65% of a CPU in refusals, where it had
 * cost 12-20% in sessions with no bound).  < 0: refused, the detail in d: more than
 * max_half_open_per_uid of the uid's sessions held already, or a wait over a second. */
#define RATE_MAX_WAIT_US 1000000.0

static int64_t connect_rate_wait(dsess *s, char *d, size_t dlen)
{
    dloop *l = s->loop;
    const dloop_config *cfg = dloop_cfg(l);
    if (cfg->connect_rate_per_uid < 0 || s->uid == 0 || s->uid == geteuid()) return 0;
    dsess_list *ls = dloop_sessions(l);
    uint64_t now = dloop_clock_us(l);
    double rate = cfg->connect_rate_per_uid, burst = cfg->connect_burst_per_uid;
    struct dsess_rate *b = NULL, *spare = NULL;
    double spare_tokens = -1e300;
    for (int i = 0; i < DSESS_RATE_UIDS; i++) {
        struct dsess_rate *r = &ls->rate[i];
        if (r->used && r->uid == s->uid) {
            b = r;
            break;
        }
        double t = r->used ? r->tokens + (double)(now - r->at_us) * rate / 1e6 : burst + 1;
        if (t > spare_tokens) {
            spare = r;
            spare_tokens = t;
        }
    }
    if (!b) {
        b = spare; /* unused, or the fullest bucket: its uid loses at most its wait */
        *b = (struct dsess_rate){.uid = s->uid, .used = 1, .tokens = burst, .at_us = now};
    }
    b->tokens += (double)(now - b->at_us) * rate / 1e6;
    if (b->tokens > burst) b->tokens = burst;
    b->at_us = now;
    if (b->tokens >= 1) {
        b->tokens -= 1;
        return 0;
    }
    double wait_us = (1 - b->tokens) / rate * 1e6;
    int held = count_rate_waiting(l, s->uid);
    if (held < cfg->max_half_open_per_uid && wait_us <= RATE_MAX_WAIT_US) {
        b->tokens -= 1;
        return (int64_t)wait_us + 1;
    }
    b->refused++;
    snprintf(d, dlen,
             "connect rate of %d a second (burst %d) for uid %u reached, %d waiting, %llu "
             "refused; retry in %.0f ms",
             cfg->connect_rate_per_uid, cfg->connect_burst_per_uid, (unsigned)s->uid, held,
             b->refused, wait_us / 1e3 + 0.5);
    return -1;
}

/* The handshake: the client's hello must be exactly ours (magic, ABI, size, no flags);
 * then the loop's limits, the segments, the peer's pidfd and the service's on_connect. */
static void on_hello(dsess *s, const char *buf, int len)
{
    dloop *l = s->loop;
    const dloop_config *cfg = dloop_cfg(l);
    char d[160];
    struct ringlm_wire_hello h;

    if (s->rate_wait) {
        dsess_end(s, "hostile: a second handshake message");
        return;
    }
    if (len < (int)sizeof(uint32_t) * 2) {
        refuse(s, -EPROTO, "handshake message too short");
        return;
    }
    memset(&h, 0, sizeof(h));
    memcpy(&h, buf, len < (int)sizeof(h) ? (size_t)len : sizeof(h));
    if (h.magic != RINGLM_WIRE_MAGIC) {
        snprintf(d, sizeof(d), "handshake magic 0x%08x is not ringlm's", h.magic);
        refuse(s, -EPROTO, d);
        return;
    }
    if (h.abi != RINGLM_WIRE_ABI) {
        snprintf(d, sizeof(d), "client speaks ABI %u, daemon ABI %u", h.abi, RINGLM_WIRE_ABI);
        refuse(s, -EPROTO, d);
        return;
    }
    if (len != (int)sizeof(h) || h.flags || h.reserved) {
        snprintf(d, sizeof(d), "handshake of %d bytes with flags 0x%x", len, h.flags);
        refuse(s, -EPROTO, d);
        return;
    }
    /* Limits are checked once the hello is read: closing a socket with unread data
	 * would turn our answer into ECONNRESET on the client's side. */
    if (dloop_is_draining(l)) {
        refuse(s, -ESHUTDOWN, "the daemon is draining");
        return;
    }
    if (dloop_sessions(l)->active >= cfg->max_sessions) {
        char d[96];
        snprintf(d, sizeof(d), "session limit %d reached", cfg->max_sessions);
        refuse(s, -EUSERS, d);
        return;
    }
    if (count_uid(l, s->uid, NULL) > cfg->max_sessions_per_uid) {
        char d[96];
        snprintf(d, sizeof(d), "limit of %d sessions for uid %u reached", cfg->max_sessions_per_uid,
                 (unsigned)s->uid);
        refuse(s, -EUSERS, d);
        return;
    }
    int64_t wait = connect_rate_wait(s, d, sizeof(d));
    if (wait < 0) {
        refuse(s, -EAGAIN, d);
        return;
    }
    if (wait > 0) {
        /* held in HELLO (charged to the half-open budget, the hello timeout still runs) */
        s->rate_at_us = dloop_clock_us(l) + (uint64_t)wait;
        set_state(s, s->phase, s->check_deferred, 1);
        dloop_wake_after_us(l, (uint64_t)wait);
        return;
    }
    hello_setup(s);
}

/* The handshake's second half, once the session may be set up: its doorbell, segments and
 * pidfd, the service's on_connect, the answer. */
static void hello_setup(dsess *s)
{
    dloop *l = s->loop;
    const dloop_config *cfg = dloop_cfg(l);
    void *ctx;
    const dsvc_ops *ops = dloop_service(l, &ctx);
    char d[160];
    if (dloop_is_draining(l)) {
        refuse(s, -ESHUTDOWN, "the daemon is draining");
        return;
    }
    if (!dloop_uses_futex(l)) {
        s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (s->efd < 0) {
            refuse(s, -errno, "eventfd failed");
            return;
        }
    }
    int r = dsess_segments_create(s, cfg->submit_ring_bytes, cfg->event_ring_slots, cfg->numa_node,
                                  dloop_policy_hash(l), d, sizeof(d));
    if (r < 0) {
        refuse(s, r, d);
        return;
    }
    s->pidfd = (int)syscall(SYS_pidfd_open, s->pid, 0);
    if (s->pidfd < 0) {
        refuse(s, -ESRCH, "client process already gone");
        return;
    }
    if (ops->on_connect) {
        r = ops->on_connect(ctx, s);
        if (r < 0) {
            snprintf(d, sizeof(d), "the service refused uid %u (%s)", (unsigned)s->uid,
                     strerror(-r));
            refuse(s, r, d);
            return;
        }
    }
    s->svc_knows = 1;
    if (dloop_is_draining(l)) dsess_write_state(s, RINGLM_WIRE_ST_DRAINING);
    dsess_write_load(s, dloop_load(l));
    if (send_welcome(s, 0, NULL, 1) < 0) {
        dsess_end(s, "could not send the handshake answer");
        return;
    }
    set_phase(s, DSESS_ACTIVE);
    /* The doorbell wait is armed when the loop goes to sleep (loop_sleep). */
    if (arm_op(s, DSESS_OP_RECV) < 0 || arm_op(s, DSESS_OP_PIDFD) < 0)
        dsess_end(s, "io_uring submission queue unavailable");
}

void dsess_on_cqe(uint64_t user_data, int res)
{
    dsess *s = (dsess *)(uintptr_t)(user_data & ~DSESS_UD_TAG_MASK);
    int op = (int)(user_data & DSESS_UD_TAG_MASK);
    s->armed &= ~(1u << op);
    s->inflight--;
    if (s->phase == DSESS_ZOMBIE) {
        if (s->inflight == 0) sess_free(s);
        return;
    }
    if (s->ending) return; /* dsess_end_pending runs next; nothing to re-arm */
    switch (op) {
    case DSESS_OP_RECV:
        if (s->phase == DSESS_HELLO) {
            if (res > 0)
                on_hello(s, s->rxbuf, res);
            else if (res == 0)
                dsess_end_for(s, DSESS_END_CLIENT_CLOSED);
            else
                dsess_end(s, "recv failed in handshake");
        } else if (res == 0) {
            dsess_end_for(s, DSESS_END_CLIENT_CLOSED);
        } else if (res > 0) {
            dsess_end(s, "hostile: unexpected message on the session socket");
        } else if (res != -EINTR && res != -EAGAIN) {
            dsess_end(s, "session socket error");
        } else {
            arm_op(s, DSESS_OP_RECV);
        }
        break;
    case DSESS_OP_PIDFD: dsess_end_for(s, DSESS_END_CLIENT_EXITED); break;
    case DSESS_OP_DOORBELL:
        /* Woken, value changed (-EAGAIN) or eventfd read: the rings are drained this
		 * iteration; the wait is re-armed before the loop sleeps again, when the session
		 * has not rung for nothing too often (doorbell_charge). */
        if (res != -ECANCELED) {
            s->db_woken = 1;
            s->db_cons = s->sub.cons;
        }
        if (res < 0 && res != -EAGAIN && res != -EINTR && res != -ECANCELED && s->efd < 0 &&
            res != -ETIME) {
            /* The futex wait itself failed (e.g. -EFAULT): fall back to polling
			 * this session while awake; log once. */
            fprintf(stderr, "ringlmd: session %llu: futex wait failed: %s\n",
                    (unsigned long long)s->id, strerror(-res));
        }
        break;
    }
}

void dsess_expire_hellos(dloop *l, uint64_t now_us)
{
    for (dsess *s = dloop_sessions(l)->all; s; s = s->next)
        if (s->phase == DSESS_HELLO && !s->ending && now_us > s->hello_deadline_us)
            dsess_end(s, "handshake timeout");
}

void dsess_end_all(dloop *l, dsess_end_cause cause)
{
    for (dsess *s = dloop_sessions(l)->all; s; s = s->next)
        if (s->phase != DSESS_ZOMBIE) dsess_end_for(s, cause);
}

void dsess_free_all(dloop *l)
{
    dsess_list *ls = dloop_sessions(l);
    void *ctx;
    const dsvc_ops *ops = dloop_service(l, &ctx);
    while (ls->all) {
        dsess *s = ls->all;
        if (s->phase != DSESS_ZOMBIE && s->svc_knows && ops->on_close)
            ops->on_close(ctx, s, "shutdown");
        sess_free(s);
    }
}

/* ---- iteration ----------------------------------------------------------------------- */

dsess *dsess_first(dloop *l)
{
    return dloop_sessions(l)->all;
}
dsess *dsess_next(dsess *s)
{
    return s->next;
}
int dsess_active(const dsess *s)
{
    return s->phase == DSESS_ACTIVE && !s->ending;
}

/* A doorbell wake that found nothing to do costs the loop a wake-up, a drain and a spin
 * (~60 µs): a client ringing in a loop without writing anything kept the loop thread at
 * ~100% of a core. Each such wake takes a token of the session's bucket (DSESS_DB_IDLE_RATE
 * a second, as many at once); with none left, the doorbell wait is not re-armed until one
 * is back, and the loop sleeps on (a timer wakes it then). A wake that brought records or
 * returned ring space is work, never charged; records a held session writes meanwhile
 * are taken at the loop's next wake, at most 1/DSESS_DB_IDLE_RATE s later. Returns the µs
 * the doorbell must wait, 0 when it may be armed. */
static uint64_t doorbell_charge(dsess *s, int paused)
{
    dsess_list *ls = dloop_sessions(s->loop);
    uint64_t now = dloop_now_us(s->loop);
    if (!s->db_tokens_us) {
        s->db_tokens = DSESS_DB_IDLE_RATE;
        s->db_tokens_us = now;
    }
    s->db_tokens += (double)(now - s->db_tokens_us) * DSESS_DB_IDLE_RATE / 1e6;
    if (s->db_tokens > DSESS_DB_IDLE_RATE) s->db_tokens = DSESS_DB_IDLE_RATE;
    s->db_tokens_us = now;
    if (s->db_woken) {
        s->db_woken = 0;
        int worked =
            s->sub.cons != s->db_cons || s->want_space || (paused && dsess_submit_pending(s));
        if (!worked) {
            s->db_tokens -= 1;
            s->db_idle_wakes++;
            ls->doorbell_idle_wakes++;
        }
    }
    if (s->db_hold_us > now) return s->db_hold_us - now;
    s->db_hold_us = 0;
    if (s->db_tokens >= 1) return 0;
    uint64_t wait = (uint64_t)((1 - s->db_tokens) * 1e6 / DSESS_DB_IDLE_RATE) + 1;
    s->db_hold_us = now + wait;
    if (s->db_holds++ == 0 && log_allowed(ls, now))
        fprintf(stderr,
                "ringlmd: session %llu (uid %u pid %d) rings its doorbell without work more "
                "than %d times a second: its wakes are held to that rate (charged to it)\n",
                (unsigned long long)s->id, (unsigned)s->uid, (int)s->pid, DSESS_DB_IDLE_RATE);
    ls->doorbell_holds++;
    return wait;
}

uint64_t dsess_doorbell_idle_wakes(const dsess *s)
{
    return s->db_idle_wakes;
}

int dsess_prepare_sleep(dsess *s, int paused)
{
    /* Doorbell value first, rings second: a client that rings after this read makes the
	 * armed wait return at once (value differs); one that rang before it published
	 * before, so the ring check below sees its data. */
    uint32_t seen = __atomic_load_n(&s->cseg->doorbell, __ATOMIC_ACQUIRE);
    if ((!paused && dsess_submit_pending(s)) || (s->want_space && dsess_space_returned(s)))
        return 1;
    uint64_t hold = doorbell_charge(s, paused);
    if (hold) {
        dloop_wake_after_us(s->loop, hold);
        return 0;
    }
    return arm_op_db(s, DSESS_OP_DOORBELL, seen) < 0;
}

void dsess_write_state_all(dloop *l, uint32_t state)
{
    for (dsess *s = dloop_sessions(l)->all; s; s = s->next)
        if (s->phase == DSESS_ACTIVE) dsess_write_state(s, state);
}

void dsess_write_policy_hash_all(dloop *l, uint64_t hash)
{
    for (dsess *s = dloop_sessions(l)->all; s; s = s->next)
        if (s->phase == DSESS_ACTIVE) dsess_write_policy_hash(s, hash);
}

void dsess_write_load_all(dloop *l, const struct ringlm_wire_load *ld)
{
    for (dsess *s = dloop_sessions(l)->all; s; s = s->next)
        if (s->phase == DSESS_ACTIVE) dsess_write_load(s, ld);
}
