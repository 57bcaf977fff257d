/* SPDX-License-Identifier: MIT */
/*
 * daemon/loop.h — ringlmd's event loop and client sessions (DESIGN §2, §3).
 *
 * One thread, one io_uring.  The loop accepts clients on a SOCK_SEQPACKET socket, makes
 * each a session (two sealed memfd segments, see shm/wire.h), watches the session socket
 * (EOF) and a pidfd of the peer as liveness signals, keeps a futex wait armed on each
 * session's doorbell (IORING_OP_FUTEX_WAIT; an eventfd per session where the kernel lacks
 * it), and reads SIGTERM/SIGINT through a signalfd.  A service (the echo service, the
 * real runner) plugs in through dsvc_ops; every callback runs on the loop thread, except
 * on_connect, which the handshake thread may also run while the loop thread is in an
 * engine step (between dloop_engine_begin and dloop_engine_end), never concurrently with
 * any other loop code.
 *
 * One iteration:
 *   drain io_uring completions (accept, EOF, pidfd, doorbell, timers, service CQEs)
 *   drain every session's submit ring: copy, validate → on_request / on_cancel
 *   ops->iterate(now)               (the service pushes events with dsess_push_*)
 *   publish dirty event rings; one futex wake per session whose client sleeps
 *   if nothing happened for idle_spin_us: announce sleeping, re-check, sleep in io_uring
 *
 * Sessions end (on_close follows, in the same iteration, before their memory goes) when
 * the client goes away, writes something malformed into its segment, or dsess_end is
 * called, or at shutdown.  After on_close the dsess pointer is invalid.
 */
#ifndef RINGLM_DAEMON_LOOP_H
#define RINGLM_DAEMON_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "shm/wire.h"

struct io_uring;
struct io_uring_cqe;

typedef struct dloop dloop;
typedef struct dsess dsess;

typedef struct dloop_config {
    const char *socket_path;  /* required; a stale socket file (one that refuses connections)
                               is replaced; any other file there is refused, left as it is */
    int numa_node;            /* -1 = no pinning/placement, else node for segments */
    int max_sessions;         /* 0 = default 256 */
    int max_sessions_per_uid; /* 0 = default 64 */
    /* Connections whose hello has not arrived: they count toward their uid's sessions
	 * from accept (SO_PEERCRED is known then), and have their own budget per uid and in
	 * all, so sockets left half-open cannot lock other users out of the session limit. */
    int max_half_open;         /* 0 = default 64 */
    int max_half_open_per_uid; /* 0 = default 8 */
    /* Sessions a second per uid, a token bucket of connect_burst_per_uid: a session costs
	 * the loop its setup and teardown (~0.8 ms on the 2-vCPU dev VM, most of it unmapping
	 * its rings), so one uid connecting and disconnecting in a loop must not take the loop
	 * from everyone else. Root and the daemon's own uid are not bound. Handshakes over it
	 * are refused with -EAGAIN and the time to wait. */
    int connect_rate_per_uid;   /* 0 = default 20; < 0 = no bound */
    int connect_burst_per_uid;  /* 0 = default 64 (a uid's whole session limit at once) */
    unsigned submit_ring_bytes; /* power of two; 0 = default 1 MiB */
    unsigned event_ring_slots;  /* power of two; 0 = default 65536 (1 MiB) */
    unsigned idle_spin_us;      /* keep polling this long after the last work before
	                                   sleeping; 0 = default 50; use dloop_config_init */
    unsigned socket_mode;       /* chmod of the socket; 0 = 0666 */
    int socket_gid;             /* chown the socket to this group; -1 = leave it */
    int force_eventfd;          /* 1: use the eventfd doorbell even if futex works */
} dloop_config;

/* Fills defaults (numa_node -1, everything else 0 = default). */
void dloop_config_init(dloop_config *cfg);

/* user_data of SQEs a service submits on dloop_ring(): set bit 63; the loop hands the
 * CQE to ops->on_cqe untouched.  Bits 0..62 are the service's. */
#define DLOOP_UD_SVC (1ull << 63)

/* liburing 2.3 and its uapi copy predate IORING_OP_FUTEX_WAIT (kernel 6.7): the values
 * below are the kernel's (include/uapi/linux/io_uring.h, futex.h). */
#define DLOOP_IORING_OP_FUTEX_WAIT 51
#define DLOOP_IORING_OP_FUTEX_WAKE 52
#define DLOOP_FUTEX2_SIZE_U32      0x02
#define DLOOP_FUTEX_BITSET_ANY     0xffffffffu

/* user_data values below this are the loop's own constants; above, a session's. */
#define DSESS_UD_MIN    4096u
/* user_data of cancel SQEs: their completions need nothing. */
#define DLOOP_UD_IGNORE 3u

typedef struct dsvc_ops {
    /* A client completed the handshake.  Use dsess_uid/pid to decide; return < 0 (e.g.
	 * -EPERM) to refuse it (the client gets that errno), 0 to accept. */
    int (*on_connect)(void *ctx, dsess *s);
    /* A structurally valid request (record copied into private memory; the pointers are
	 * valid for the duration of the call only).  Semantic checks (ringlm_wire_check_request,
	 * vocabulary) are the service's; it answers every request with a FINISH eventually.
	 * rec->smp is NULL for a plain REQUEST, else the sampling extensions of a REQUEST_EXT
	 * (ringlm_wire_check_sampling is the service's too).
	 * tenant_tag is NULL unless the client set one (honour it for trusted uids only). */
    void (*on_request)(void *ctx, dsess *s, const struct ringlm_wire_parsed *rec,
                       const char *tenant_tag);
    void (*on_cancel)(void *ctx, dsess *s, uint64_t req_id);
    /* The session ends ("client closed", "client process exited", "hostile: ...",
	 * "shutdown", or the reason given to dsess_end).  Drop everything of s here. */
    void (*on_close)(void *ctx, dsess *s, const char *reason);
    /* Once per iteration.  Return > 0 when more work is pending right now (the loop does
	 * not sleep), 0 when idle.  May be NULL. */
    int (*iterate)(void *ctx, uint64_t now_us);
    /* CQEs whose user_data has DLOOP_UD_SVC.  May be NULL. */
    void (*on_cqe)(void *ctx, const struct io_uring_cqe *cqe);
    /* How many records to take from s's submit ring now: < 0 pauses the session (its
	 * records wait in its ring and do not keep the loop awake; its client is told
	 * nothing), >= 0 at most that many this iteration (records left keep the loop
	 * awake).  NULL: up to 256 per session and iteration. */
    int (*drain_budget)(void *ctx, dsess *s);
    /* SIGTERM / SIGINT / SIGHUP arrived (through a signalfd).  NULL: SIGTERM/SIGINT stop
	 * the loop. */
    void (*on_signal)(void *ctx, int signo);
} dsvc_ops;

/* Creates the loop: binds and listens on cfg->socket_path, sets up io_uring, reads
 * SIGTERM/SIGINT/SIGHUP through a signalfd, probes futex support.  Call it from the
 * thread that will run dloop_run, in which the program blocked SIGTERM/SIGINT/SIGHUP
 * before (ringlmd does it first thing in main, before any thread exists, and forwards
 * them from threads a library created before main; see main_ringlmd.c).  Returns 0 or
 * -errno with dloop_errmsg(): -EINVAL when those signals are not blocked. */
int dloop_create(const dloop_config *cfg, const dsvc_ops *ops, void *ctx, dloop **out);
/* Raises the soft limit of open files to the hard limit (ringlmd does it first thing);
 * dloop_create calls it too, and then lowers the session limits that the descriptors left
 * could not hold, saying so on stderr. The soft limit now, or 0 when it cannot be read. */
unsigned long long dloop_raise_fd_limit(void);
/* Whether dloop_create could listen on path, without binding it (ringlmd asks before it
 * loads a model, so that a socket in use or a bad directory is reported at once): the
 * directory exists and is writable, and the path is free or a stale socket. 0, or -EEXIST
 * (another kind of file, or a socket that cannot be probed), -EADDRINUSE (a daemon listens
 * there), -ENAMETOOLONG, -ENOENT / -ENOTDIR / -EACCES (the directory), with dloop_errmsg(). */
int dloop_check_socket(const char *path);
/* Runs until dloop_stop(); ends every session (on_close "shutdown") before returning.
 * Returns 0 or -errno on a fatal io_uring error. */
int dloop_run(dloop *l);
/* Makes dloop_run return after the current iteration (safe from callbacks). */
void dloop_stop(dloop *l);
/* Stops accepting new requests: sessions' status shows DRAINING (clients' submit gets
 * -ESHUTDOWN) and new connections are refused with -ESHUTDOWN. */
void dloop_drain(dloop *l);
/* Closes the socket (unlinks its file if this loop bound it and it is still there, never a
 * file found at the path or put there since) and frees everything. NULL is a no-op. */
void dloop_destroy(dloop *l);

struct io_uring *dloop_ring(dloop *l);
/* CLOCK_MONOTONIC µs since the loop was created (read once per iteration). */
uint64_t dloop_now_us(dloop *l);
/* Futex wakes issued to sleeping clients when their events were published, since start. */
uint64_t dloop_futex_wakes(dloop *l);
/* Wake the loop up no later than now + us even if nothing happens (timers of the
 * service); the earliest request in an iteration wins. */
void dloop_wake_after_us(dloop *l, uint64_t us);
/* The policy hash written into every session's status and every FINISH_EXT. */
void dloop_set_policy_hash(dloop *l, uint64_t hash);
uint64_t dloop_policy_hash(dloop *l);
/* The daemon's load for its clients (every session's segment: struct ringlm_wire_load):
 * rewritten where it changed since the last call; call it once per iteration. */
void dloop_publish_load(dloop *l, uint32_t waiting, uint32_t running, uint32_t kv_used,
                        uint32_t kv_total, uint64_t iterations);
/* The load last published (a new session starts with it). */
const struct ringlm_wire_load *dloop_load(dloop *l);
/* "futex" or "eventfd". */
const char *dloop_doorbell_mode(dloop *l);
/* Number of live sessions. */
int dloop_session_count(dloop *l);
/* Around a long computation on the loop thread that touches no loop, session or service
 * state on_connect uses (the engine step): the handshake thread accepts clients and
 * answers their hellos meanwhile (calling on_connect), so a client connecting to a busy
 * daemon is not answered only after the step.  NULL or outside dloop_run: no-op. */
void dloop_engine_begin(dloop *l);
void dloop_engine_end(dloop *l);
const char *dloop_errmsg(void);

/* ---- sessions ------------------------------------------------------------------------ */

/* Appends one event to the session's event ring (visible to the client when the loop
 * publishes at the end of the iteration).  Returns 0, -EAGAIN when the ring is full (the
 * client is not reading; the loop will be woken when it frees space), -EPIPE when the
 * session is ending. */
int dsess_push_event(dsess *s, const struct ringlm_wire_event *ev);
/* TOKEN event.  Same returns. */
int dsess_push_token(dsess *s, uint64_t req_id, int32_t token, uint32_t index);
/* A TOKEN (prompt false) or a PROMPT event with its log-probabilities (LOGPROB and its TOP
 * slots), all or none: RINGLM_WIRE_LP_SLOTS(lp->n_top) slots.  Same returns. */
int dsess_push_logprobs(dsess *s, uint64_t req_id, bool prompt, int32_t token, uint32_t index,
                        const struct ringlm_wire_logprobs *lp);
/* FINISH + FINISH_EXT (policy hash, cached_tokens) pair; both or neither.  reason
 * RINGLM_WIRE_R_*, cause a RINGLM_WIRE_R_* cause or 0, cached_tokens the prompt tokens the
 * request's first admission found in the prefix cache (0 when it was never admitted or the
 * cache is off; saturated at RINGLM_WIRE_INDEX_MAX).  Same returns (-EAGAIN needs 2 free
 * slots). */
int dsess_push_finish(dsess *s, uint64_t req_id, unsigned reason, unsigned cause, uint32_t n_tokens,
                      uint32_t cached_tokens);
/* dsess_push_finish, then the DETAIL slots of detail (NULL or "": none; cut at
 * RINGLM_WIRE_DETAIL_MAX bytes), all in one group. Only for a request whose client reads
 * details (its record carried a constraint: shm/wire.h). Same returns. */
int dsess_push_finish_detail(dsess *s, uint64_t req_id, unsigned reason, unsigned cause,
                             uint32_t n_tokens, uint32_t cached_tokens, const char *detail);
/* Free event slots right now. */
unsigned dsess_event_space(dsess *s);

uid_t dsess_uid(dsess *s);
gid_t dsess_gid(dsess *s);
pid_t dsess_pid(dsess *s);
uint64_t dsess_id(dsess *s);
void dsess_set_user(dsess *s, void *user);
void *dsess_user(dsess *s);
/* The handshake's facts (on_connect, before the welcome): whether the session's tenant tags
 * are honoured, and the policy's request class names (names longer than a wire name are
 * left out: no request can name them). Written once into the daemon segment. */
/* vocab > 0: the session takes REQUEST_EXT records (RINGLM_WIRE_CAP_SAMPLING) of a model of
 * that vocabulary; 0: it does not. max_n > 1: it runs up to max_n samples per request
 * (RINGLM_WIRE_CAP_SAMPLES). model: the served model name (NULL or "": not said; longer than
 * RINGLM_WIRE_MODEL_LEN - 1 bytes: cut). */
void dsess_set_facts(dsess *s, bool tenant_tags, const char *const *classes, int n_classes,
                     uint32_t vocab, uint32_t max_n, const char *model);
/* The constraint kinds the service enforces (bit k: kind k; 0: none): with any,
 * RINGLM_WIRE_CAP_CONSTRAINT, and RINGLM_WIRE_CAP_SAMPLES_CONSTRAINED where the session
 * runs n > 1 samples too. Call it after dsess_set_facts, in on_connect. */
void dsess_set_constraint_kinds(dsess *s, uint32_t kinds);
dloop *dsess_loop(dsess *s);
/* Why a session ends. Only a fault is logged (rate-limited) with its words; the others
 * are a session's ordinary end. A client reads -ESHUTDOWN for SHUTDOWN, else -ECONNRESET. */
typedef enum dsess_end_cause {
    DSESS_END_FAULT,         /* something went wrong: the reason says what */
    DSESS_END_CLIENT_CLOSED, /* "client closed the connection" */
    DSESS_END_CLIENT_EXITED, /* "client process exited" */
    DSESS_END_SHUTDOWN,      /* "shutdown": the daemon is stopping */
} dsess_end_cause;
/* Ends the session (after the current callback; on_close follows in this iteration) for a
 * fault, said in reason (written to the session's segment for the client to read). */
void dsess_end(dsess *s, const char *reason);
/* Ends it for an ordinary cause (not DSESS_END_FAULT), in that cause's own words. */
void dsess_end_for(dsess *s, dsess_end_cause cause);

/* ---- what the session module (session.c) needs of the loop --------------------------- */
/* Not for services: a session's bookkeeping (dsess_list, daemon/session.h) and the ring. */
struct io_uring_sqe;
typedef struct dsess_list dsess_list;
dsess_list *dloop_sessions(dloop *l);
/* An SQE of the loop's ring (submits to make room); NULL only if the kernel takes none. */
struct io_uring_sqe *dloop_sqe(dloop *l);
const dloop_config *dloop_cfg(dloop *l);
int dloop_is_draining(dloop *l);
/* 1: doorbells are futex waits on the ring; 0: an eventfd per session. */
int dloop_uses_futex(dloop *l);
/* Queues a FUTEX_WAKE of one waiter on word (a shared futex), submitted with the rest of
 * the iteration's wakes; -ENOTSUP / -EBUSY: wake it with the system call instead. */
int dloop_queue_futex_wake(dloop *l, const uint32_t *word);
const dsvc_ops *dloop_service(dloop *l, void **ctx);
/* Lets the handshake thread read the hello of a HELLO session on socket fd when it
 * arrives during an engine step (no-op without the thread). */
void dloop_watch_hello(dloop *l, int fd);
/* CLOCK_MONOTONIC µs on dloop_now_us's scale, read now (the handshake thread runs in
 * the middle of an iteration). */
uint64_t dloop_clock_us(dloop *l);

#endif
