/* SPDX-License-Identifier: MIT */
/*
 * daemon/loop.c — ringlmd's event loop: one thread, one io_uring.
 *
 * user_data of our own SQEs is either a small constant (listener, signalfd, ignored
 * cancels) or a session pointer with the operation in its low 3 bits; services set
 * bit 63 (DLOOP_UD_SVC).  A session's memory is freed only when none of its operations
 * is in flight any more, because each completion carries its pointer.
 */
#include "daemon/loop.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon/session.h"
#include "numa/rnuma.h"

/* liburing 2.3 and its uapi copy predate IORING_OP_FUTEX_WAIT (kernel 6.7): the values
 * below are the kernel's (include/uapi/linux/io_uring.h, futex.h). */
#define DLOOP_IORING_OP_FUTEX_WAIT 51
#define DLOOP_FUTEX2_SIZE_U32      0x02
#define DLOOP_FUTEX_BITSET_ANY     0xffffffffu

enum {
	UD_ACCEPT = 1,
	UD_SIGNAL = 2,
	UD_IGNORE = 3,
};
#define UD_TAG_MASK 7ull

#define DEFAULT_MAX_SESSIONS      256
#define DEFAULT_MAX_PER_UID       64
#define DEFAULT_SUBMIT_BYTES      (1u << 20)
#define DEFAULT_EVENT_SLOTS       (1u << 16)
#define DEFAULT_IDLE_SPIN_US      50
#define HELLO_TIMEOUT_US          (5 * 1000 * 1000)
#define HOUSEKEEPING_US           (200 * 1000)
#define RECORDS_PER_SESSION_ITER  256

struct dloop {
	dloop_config cfg;
	char socket_path[108];
	const dsvc_ops *ops;
	void *ctx;
	struct io_uring ring;
	int ring_ok;
	int listen_fd;
	int sig_fd;
	struct signalfd_siginfo siginfo;
	int use_futex;
	int stop;
	int draining;
	uint64_t policy_hash;
	uint64_t t0_ns;
	uint64_t now_us;
	uint64_t futex_wakes;	/* clients woken by publish_sessions, ever */
	uint64_t wake_at_us;
	uint64_t next_session_id;
	int nsessions;                   /* HELLO + ACTIVE */
	dsess *sessions;                 /* all, zombies included */
	dsess *to_end;
	int in_callback_depth;
};

static __thread char errmsg[256];

/* Threads that exist before dloop_create (library constructors: OpenBLAS, CUDA) do not
 * block SIGTERM/SIGINT/SIGHUP, so the kernel may deliver them there.  This handler sends
 * the signal on to the loop thread, where it is blocked and therefore reaches the
 * signalfd. */
static pthread_t sig_target;

static void forward_signal(int signo)
{
	int saved = errno;
	pthread_kill(sig_target, signo);
	errno = saved;
}

__attribute__((format(printf, 2, 3)))
static int set_err(int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errmsg, sizeof(errmsg), fmt, ap);
	va_end(ap);
	return err;
}

const char *dloop_errmsg(void)
{
	return errmsg;
}

void dloop_config_init(dloop_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->numa_node = -1;
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
static struct io_uring_sqe *get_sqe(dloop *l)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
	if (!sqe) {
		io_uring_submit(&l->ring);
		sqe = io_uring_get_sqe(&l->ring);
	}
	return sqe; /* NULL only if the kernel refuses to take SQEs: callers end the session */
}

static uint64_t sess_ud(dsess *s, int op)
{
	return (uint64_t)(uintptr_t)s | (uint64_t)op;
}

static int arm_accept(dloop *l)
{
	struct io_uring_sqe *sqe = get_sqe(l);
	if (!sqe)
		return -EBUSY;
	io_uring_prep_accept(sqe, l->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data64(sqe, UD_ACCEPT);
	return 0;
}

static int arm_signal(dloop *l)
{
	struct io_uring_sqe *sqe = get_sqe(l);
	if (!sqe)
		return -EBUSY;
	io_uring_prep_read(sqe, l->sig_fd, &l->siginfo, sizeof(l->siginfo), 0);
	io_uring_sqe_set_data64(sqe, UD_SIGNAL);
	return 0;
}

static int arm_op_db(dsess *s, int op, uint32_t doorbell_seen)
{
	dloop *l = s->loop;
	if (s->armed & (1u << op))
		return 0;
	struct io_uring_sqe *sqe = get_sqe(l);
	if (!sqe)
		return -EBUSY;
	switch (op) {
	case DSESS_OP_RECV:
		io_uring_prep_recv(sqe, s->sock, s->rxbuf, sizeof(s->rxbuf), 0);
		break;
	case DSESS_OP_PIDFD:
		io_uring_prep_poll_add(sqe, s->pidfd, POLLIN);
		break;
	case DSESS_OP_DOORBELL:
		if (s->efd >= 0) {
			io_uring_prep_read(sqe, s->efd, &s->eventfd_buf, sizeof(s->eventfd_buf), 0);
		} else {
			/* IORING_OP_FUTEX_WAIT by hand: fd = futex2 flags (shared, u32),
			 * addr = word, addr2 = expected value, addr3 = wake mask.  The value
			 * was read before the rings were checked (see loop_sleep). */
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
	if (!(s->armed & (1u << op)))
		return;
	struct io_uring_sqe *sqe = get_sqe(s->loop);
	if (!sqe)
		return; /* io_uring_queue_exit cancels it at the latest */
	io_uring_prep_cancel64(sqe, sess_ud(s, op), 0);
	io_uring_sqe_set_data64(sqe, UD_IGNORE);
}

/* ---- sessions ------------------------------------------------------------------------- */
static void sess_link(dloop *l, dsess *s)
{
	s->next = l->sessions;
	s->prev = NULL;
	if (l->sessions)
		l->sessions->prev = s;
	l->sessions = s;
}

static void sess_free(dloop *l, dsess *s)
{
	if (s->prev)
		s->prev->next = s->next;
	else
		l->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	dsess_segments_destroy(s);
	if (s->sock >= 0)
		close(s->sock);
	if (s->pidfd >= 0)
		close(s->pidfd);
	if (s->efd >= 0)
		close(s->efd);
	free(s);
}

void dsess_end(dsess *s, const char *reason)
{
	if (s->ending)
		return;
	s->ending = 1;
	snprintf(s->end_reason, sizeof(s->end_reason), "%s", reason);
	s->end_next = s->loop->to_end;
	s->loop->to_end = s;
}

static int quiet_reason(const char *r)
{
	return !strcmp(r, "client closed the connection") || !strcmp(r, "client process exited") ||
	       !strcmp(r, "shutdown");
}

/* Runs outside callbacks: on_close, status CLOSED, cancel in-flight ops, release the
 * memory and fds now (the kernel keeps what in-flight ops still reference). */
static void end_pending(dloop *l)
{
	while (l->to_end) {
		dsess *s = l->to_end;
		l->to_end = s->end_next;
		if (s->phase == DSESS_ZOMBIE)
			continue;
		if (!quiet_reason(s->end_reason))
			fprintf(stderr, "ringlmd: session %llu (uid %u pid %d) ended: %s\n",
				(unsigned long long)s->id, (unsigned)s->uid, (int)s->pid, s->end_reason);
		if (s->svc_knows && l->ops->on_close)
			l->ops->on_close(l->ctx, s, s->end_reason);
		s->svc_knows = 0;
		int err = strcmp(s->end_reason, "shutdown") ? -ECONNRESET : -ESHUTDOWN;
		dsess_write_closed(s, err, s->end_reason);
		s->phase = DSESS_ZOMBIE;
		l->nsessions--;
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
		if (s->inflight == 0)
			sess_free(l, s);
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
	w.policy_hash = s->loop->policy_hash;
	snprintf(w.detail, sizeof(w.detail), "%s", detail ? detail : "");

	int fds[3] = { s->cfd, s->dfd, s->efd };
	int nfds = s->efd >= 0 ? 3 : 2;
	union {
		char buf[CMSG_SPACE(sizeof(int) * 3)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = &w, .iov_len = sizeof(w) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
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

static void refuse(dsess *s, int err, const char *detail)
{
	send_welcome(s, err, detail, 0);
	char r[200];
	snprintf(r, sizeof(r), "refused: %s", detail);
	dsess_end(s, r);
}

static int count_uid(dloop *l, uid_t uid)
{
	int n = 0;
	for (dsess *s = l->sessions; s; s = s->next)
		if (s->phase != DSESS_ZOMBIE && s->uid == uid)
			n++;
	return n;
}

static void on_accept(dloop *l, int fd)
{
	dsess *s = calloc(1, sizeof(*s));
	if (!s) {
		close(fd);
		return;
	}
	s->loop = l;
	s->id = ++l->next_session_id;
	s->phase = DSESS_HELLO;
	s->sock = fd;
	s->pidfd = s->efd = s->cfd = s->dfd = -1;
	s->hello_deadline_us = l->now_us + HELLO_TIMEOUT_US;
	sess_link(l, s);
	l->nsessions++;

	struct ucred cred;
	socklen_t cl = sizeof(cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
		dsess_end(s, "SO_PEERCRED failed");
		return;
	}
	s->uid = cred.uid;
	s->gid = cred.gid;
	s->pid = cred.pid;
	if (arm_op(s, DSESS_OP_RECV) < 0)
		dsess_end(s, "io_uring submission queue unavailable");
}

static void on_hello(dloop *l, dsess *s, int len)
{
	char d[160];
	struct ringlm_wire_hello h;

	if (len < (int)sizeof(uint32_t) * 2) {
		refuse(s, -EPROTO, "handshake message too short");
		return;
	}
	memset(&h, 0, sizeof(h));
	memcpy(&h, s->rxbuf, len < (int)sizeof(h) ? (size_t)len : sizeof(h));
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
	if (l->draining) {
		refuse(s, -ESHUTDOWN, "the daemon is draining");
		return;
	}
	if (l->nsessions > l->cfg.max_sessions) {
		char d[96];
		snprintf(d, sizeof(d), "session limit %d reached", l->cfg.max_sessions);
		refuse(s, -EUSERS, d);
		return;
	}
	if (count_uid(l, s->uid) > l->cfg.max_sessions_per_uid) {
		char d[96];
		snprintf(d, sizeof(d), "limit of %d sessions for uid %u reached",
			 l->cfg.max_sessions_per_uid, (unsigned)s->uid);
		refuse(s, -EUSERS, d);
		return;
	}
	if (l->cfg.force_eventfd || !l->use_futex) {
		s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (s->efd < 0) {
			refuse(s, -errno, "eventfd failed");
			return;
		}
	}
	int r = dsess_segments_create(s, l->cfg.submit_ring_bytes, l->cfg.event_ring_slots,
				      l->cfg.numa_node, l->policy_hash, d, sizeof(d));
	if (r < 0) {
		refuse(s, r, d);
		return;
	}
	s->pidfd = (int)syscall(SYS_pidfd_open, s->pid, 0);
	if (s->pidfd < 0) {
		refuse(s, -ESRCH, "client process already gone");
		return;
	}
	if (l->ops->on_connect) {
		r = l->ops->on_connect(l->ctx, s);
		if (r < 0) {
			snprintf(d, sizeof(d), "the service refused uid %u (%s)", (unsigned)s->uid,
				 strerror(-r));
			refuse(s, r, d);
			return;
		}
	}
	s->svc_knows = 1;
	if (l->draining)
		dsess_write_state(s, RINGLM_WIRE_ST_DRAINING);
	if (send_welcome(s, 0, NULL, 1) < 0) {
		dsess_end(s, "could not send the handshake answer");
		return;
	}
	s->phase = DSESS_ACTIVE;
	/* The doorbell wait is armed when the loop goes to sleep (loop_sleep). */
	if (arm_op(s, DSESS_OP_RECV) < 0 || arm_op(s, DSESS_OP_PIDFD) < 0)
		dsess_end(s, "io_uring submission queue unavailable");
}

static void on_sess_cqe(dloop *l, dsess *s, int op, int res)
{
	s->armed &= ~(1u << op);
	s->inflight--;
	if (s->phase == DSESS_ZOMBIE) {
		if (s->inflight == 0)
			sess_free(l, s);
		return;
	}
	if (s->ending)
		return; /* end_pending runs next; nothing to re-arm */
	switch (op) {
	case DSESS_OP_RECV:
		if (s->phase == DSESS_HELLO) {
			if (res > 0)
				on_hello(l, s, res);
			else
				dsess_end(s, res == 0 ? "client closed the connection" : "recv failed in handshake");
		} else if (res == 0) {
			dsess_end(s, "client closed the connection");
		} else if (res > 0) {
			dsess_end(s, "hostile: unexpected message on the session socket");
		} else if (res != -EINTR && res != -EAGAIN) {
			dsess_end(s, "session socket error");
		} else {
			arm_op(s, DSESS_OP_RECV);
		}
		break;
	case DSESS_OP_PIDFD:
		dsess_end(s, "client process exited");
		break;
	case DSESS_OP_DOORBELL:
		/* Woken, value changed (-EAGAIN) or eventfd read: the rings are drained this
		 * iteration; the wait is re-armed before the loop sleeps again. */
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

static void dispatch_cqe(dloop *l, struct io_uring_cqe *cqe)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	int res = cqe->res;

	if (ud & DLOOP_UD_SVC) {
		if (l->ops->on_cqe)
			l->ops->on_cqe(l->ctx, cqe);
		return;
	}
	switch (ud) {
	case UD_ACCEPT:
		if (res >= 0)
			on_accept(l, res);
		else if (res != -EINTR && res != -ECONNABORTED && res != -EAGAIN)
			fprintf(stderr, "ringlmd: accept: %s\n", strerror(-res));
		if (!l->stop)
			arm_accept(l);
		return;
	case UD_SIGNAL:
		if (res == (int)sizeof(l->siginfo)) {
			int signo = (int)l->siginfo.ssi_signo;
			if (l->ops->on_signal)
				l->ops->on_signal(l->ctx, signo);
			else if (signo != SIGHUP)
				l->stop = 1;
		}
		if (!l->stop)
			arm_signal(l);
		return;
	case UD_IGNORE:
		return;
	}
	if (ud < 4096)
		return;
	on_sess_cqe(l, (dsess *)(uintptr_t)(ud & ~UD_TAG_MASK), (int)(ud & UD_TAG_MASK), res);
}

static int drain_cqes(dloop *l)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	io_uring_for_each_cqe(&l->ring, head, cqe) {
		dispatch_cqe(l, cqe);
		n++;
	}
	if (n)
		io_uring_cq_advance(&l->ring, n);
	return (int)n;
}

/* ---- records -------------------------------------------------------------------------- */
static int on_record(void *arg, dsess *s, const struct ringlm_wire_parsed *rec)
{
	dloop *l = arg;
	if (rec->type == RINGLM_WIRE_REC_CANCEL) {
		if (l->ops->on_cancel)
			l->ops->on_cancel(l->ctx, s, rec->cancel_id);
		return 0;
	}
	if (l->draining) {
		int r = dsess_push_finish(s, rec->req->req_id, RINGLM_WIRE_R_REJECTED,
					  RINGLM_WIRE_R_DRAINING, 0);
		return r == -EAGAIN ? -EAGAIN : 0;
	}
	if (l->ops->on_request)
		l->ops->on_request(l->ctx, s, rec->req, rec->prompt, rec->req->n_prompt,
				   rec->class_name,
				   (rec->req->flags & RINGLM_WIRE_REQ_F_TENANT) ? rec->tenant_tag : NULL);
	return 0;
}

static int drain_sessions(dloop *l)
{
	int work = 0;
	char why[200];
	for (dsess *s = l->sessions; s; s = s->next) {
		if (s->phase != DSESS_ACTIVE || s->ending)
			continue;
		int n = dsess_drain_submit(s, RECORDS_PER_SESSION_ITER, on_record, l, why, sizeof(why));
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

static int publish_sessions(dloop *l)
{
	int work = 0;
	for (dsess *s = l->sessions; s; s = s->next)
		if (s->phase == DSESS_ACTIVE && !s->ending) {
			int r = dsess_publish(s);
			work |= r != 0;
			l->futex_wakes += r == 2;
		}
	return work;
}

static void housekeeping(dloop *l)
{
	for (dsess *s = l->sessions; s; s = s->next)
		if (s->phase == DSESS_HELLO && !s->ending && l->now_us > s->hello_deadline_us)
			dsess_end(s, "handshake timeout");
}

/* ---- sleeping ------------------------------------------------------------------------- */
static void set_sleeping(dloop *l, int on)
{
	for (dsess *s = l->sessions; s; s = s->next)
		if (s->phase == DSESS_ACTIVE && !s->ending)
			dsess_set_daemon_sleeping(s, on);
}

/* Announce sleep, fence, look again (Dekker), arm doorbells, then wait in io_uring.
 * A client that published before seeing our flag is caught by the second look; one that
 * published after sees the flag and rings. */
static void loop_sleep(dloop *l)
{
	set_sleeping(l, 1);
	ring_full_fence();
	int pending = 0;
	for (dsess *s = l->sessions; s; s = s->next) {
		if (s->phase != DSESS_ACTIVE || s->ending)
			continue;
		/* Doorbell value first, rings second: a client that rings after this read
		 * makes the armed wait return at once (value differs); one that rang before
		 * it published before, so the ring check below sees its data. */
		uint32_t seen = __atomic_load_n(&s->cseg->doorbell, __ATOMIC_ACQUIRE);
		if (dsess_submit_pending(s) || (s->want_space && dsess_space_returned(s))) {
			pending = 1;
			break;
		}
		if (arm_op_db(s, DSESS_OP_DOORBELL, seen) < 0) {
			pending = 1;
			break;
		}
	}
	if (!pending && !l->to_end && !l->stop) {
		uint64_t wait_us = HOUSEKEEPING_US;
		if (l->wake_at_us) {
			wait_us = l->wake_at_us > l->now_us ? l->wake_at_us - l->now_us : 0;
			if (wait_us > HOUSEKEEPING_US)
				wait_us = HOUSEKEEPING_US;
		}
		struct __kernel_timespec ts = { .tv_sec = (long long)(wait_us / 1000000),
						.tv_nsec = (long long)(wait_us % 1000000) * 1000 };
		struct io_uring_cqe *cqe;
		if (wait_us > 0)
			io_uring_submit_and_wait_timeout(&l->ring, &cqe, 1, &ts, NULL);
	}
	set_sleeping(l, 0);
}

int dloop_run(dloop *l)
{
	uint64_t last_work_ns = mono_ns();
	uint64_t last_house_us = 0;

	while (!l->stop) {
		uint64_t now_ns = mono_ns();
		l->now_us = (now_ns - l->t0_ns) / 1000;
		int work = 0;

		if (io_uring_sq_ready(&l->ring))
			io_uring_submit(&l->ring);
		l->wake_at_us = 0; /* callbacks of this iteration ask again if they need it */
		work |= drain_cqes(l) > 0;
		end_pending(l);
		work |= drain_sessions(l);
		end_pending(l);
		if (l->ops->iterate)
			work |= l->ops->iterate(l->ctx, l->now_us) > 0;
		end_pending(l);
		work |= publish_sessions(l);
		if (l->now_us - last_house_us > HOUSEKEEPING_US) {
			last_house_us = l->now_us;
			housekeeping(l);
			end_pending(l);
		}
		if (work) {
			last_work_ns = now_ns;
			continue;
		}
		if (l->wake_at_us && l->wake_at_us <= l->now_us)
			continue;
		if (now_ns - last_work_ns < (uint64_t)l->cfg.idle_spin_us * 1000) {
			ring_cpu_relax();
			continue;
		}
		loop_sleep(l);
		last_work_ns = mono_ns();
		/* After a wake, spin again for idle_spin_us before the next sleep. */
	}

	/* Shutdown: every session learns why; their CQEs are reaped by dloop_destroy. */
	for (dsess *s = l->sessions; s; s = s->next)
		if (s->phase != DSESS_ZOMBIE)
			dsess_end(s, "shutdown");
	end_pending(l);
	io_uring_submit(&l->ring);
	return 0;
}

void dloop_stop(dloop *l)
{
	l->stop = 1;
}

void dloop_drain(dloop *l)
{
	l->draining = 1;
	for (dsess *s = l->sessions; s; s = s->next)
		if (s->phase == DSESS_ACTIVE)
			dsess_write_state(s, RINGLM_WIRE_ST_DRAINING);
}

/* ---- create / destroy ----------------------------------------------------------------- */
static int probe_futex(dloop *l)
{
	struct io_uring_probe *p = io_uring_get_probe_ring(&l->ring);
	int ok = p && p->last_op >= DLOOP_IORING_OP_FUTEX_WAIT &&
		 io_uring_opcode_supported(p, DLOOP_IORING_OP_FUTEX_WAIT);
	if (p)
		io_uring_free_probe(p);
	return ok;
}

static int make_listener(dloop *l)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(l->cfg.socket_path) >= sizeof(sa.sun_path))
		return set_err(-ENAMETOOLONG, "socket path '%s' longer than %zu bytes",
			       l->cfg.socket_path, sizeof(sa.sun_path) - 1);
	strcpy(sa.sun_path, l->cfg.socket_path);
	snprintf(l->socket_path, sizeof(l->socket_path), "%s", l->cfg.socket_path);
	l->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (l->listen_fd < 0)
		return set_err(-errno, "socket: %s", strerror(errno));
	/* Replace a stale socket file, but never another kind of file. */
	struct stat st;
	if (lstat(sa.sun_path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return set_err(-EEXIST, "'%s' exists and is not a socket", sa.sun_path);
		int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		int live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		if (probe >= 0)
			close(probe);
		if (live)
			return set_err(-EADDRINUSE, "another daemon listens on '%s'", sa.sun_path);
		unlink(sa.sun_path);
	}
	if (bind(l->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return set_err(-errno, "bind '%s': %s", sa.sun_path, strerror(errno));
	chmod(sa.sun_path, l->cfg.socket_mode ? l->cfg.socket_mode : 0666);
	if (listen(l->listen_fd, 128) < 0)
		return set_err(-errno, "listen: %s", strerror(errno));
	return 0;
}

int dloop_create(const dloop_config *cfg, const dsvc_ops *ops, void *ctx, dloop **out)
{
	int r;
	*out = NULL;
	if (!cfg || !cfg->socket_path || !*cfg->socket_path || !ops)
		return set_err(-EINVAL, "dloop_create: socket path and ops are required");
	dloop *l = calloc(1, sizeof(*l));
	if (!l)
		return set_err(-ENOMEM, "out of memory");
	l->cfg = *cfg;
	l->ops = ops;
	l->ctx = ctx;
	l->listen_fd = l->sig_fd = -1;
	if (!l->cfg.max_sessions)
		l->cfg.max_sessions = DEFAULT_MAX_SESSIONS;
	if (!l->cfg.max_sessions_per_uid)
		l->cfg.max_sessions_per_uid = DEFAULT_MAX_PER_UID;
	if (!l->cfg.submit_ring_bytes)
		l->cfg.submit_ring_bytes = DEFAULT_SUBMIT_BYTES;
	if (!l->cfg.event_ring_slots)
		l->cfg.event_ring_slots = DEFAULT_EVENT_SLOTS;
	if (!l->cfg.idle_spin_us)
		l->cfg.idle_spin_us = DEFAULT_IDLE_SPIN_US;
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
	if (l->cfg.max_sessions < 0 || l->cfg.max_sessions_per_uid < 0) {
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

	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	sig_target = pthread_self();
	struct sigaction sa = { .sa_handler = forward_signal, .sa_flags = SA_RESTART };
	sigfillset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	l->sig_fd = signalfd(-1, &set, SFD_CLOEXEC);
	if (l->sig_fd < 0) {
		r = set_err(-errno, "signalfd: %s", strerror(errno));
		goto fail;
	}
	signal(SIGPIPE, SIG_IGN);
	if ((r = make_listener(l)) < 0)
		goto fail;
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
	if (!l)
		return;
	/* io_uring_queue_exit cancels and waits for everything in flight, after which the
	 * session structs are no longer referenced. */
	if (l->ring_ok)
		io_uring_queue_exit(&l->ring);
	while (l->sessions) {
		dsess *s = l->sessions;
		if (s->phase != DSESS_ZOMBIE && s->svc_knows && l->ops->on_close)
			l->ops->on_close(l->ctx, s, "shutdown");
		sess_free(l, s);
	}
	if (l->listen_fd >= 0) {
		close(l->listen_fd);
		if (l->socket_path[0])
			unlink(l->socket_path);
	}
	if (l->sig_fd >= 0)
		close(l->sig_fd);
	free(l);
}

struct io_uring *dloop_ring(dloop *l) { return &l->ring; }
uint64_t dloop_now_us(dloop *l) { return l->now_us; }
uint64_t dloop_futex_wakes(dloop *l) { return l->futex_wakes; }
const char *dloop_doorbell_mode(dloop *l)
{
	return (l->use_futex && !l->cfg.force_eventfd) ? "futex" : "eventfd";
}
int dloop_session_count(dloop *l) { return l->nsessions; }
uint64_t dloop_policy_hash(dloop *l) { return l->policy_hash; }

void dloop_wake_after_us(dloop *l, uint64_t us)
{
	uint64_t at = l->now_us + us;
	if (!l->wake_at_us || at < l->wake_at_us)
		l->wake_at_us = at;
}

void dloop_set_policy_hash(dloop *l, uint64_t hash)
{
	l->policy_hash = hash;
	for (dsess *s = l->sessions; s; s = s->next)
		if (s->phase == DSESS_ACTIVE)
			dsess_write_policy_hash(s, hash);
}
