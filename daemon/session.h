/* SPDX-License-Identifier: MIT */
/*
 * daemon/session.h — one client session on the daemon side, and the sessions of a loop.
 * Internal to daemon/: loop.c drives it; services see only the dsess_* functions of
 * daemon/loop.h.  struct dsess is private to the session module (session_priv.h, included
 * by session.c — the state machine — and session_shm.c — its memory and rings).
 *
 * A session's life (session.c owns every transition):
 *
 *   accept ──► HELLO ──(valid hello, limits, segments, pidfd, on_connect)──► ACTIVE
 *                │                                                          │
 *                └──(bad or late hello, refused)──► ending ◄──(EOF, pidfd, hostile
 *                                                     │        record, dsess_end, shutdown)
 *                                                     ▼
 *                                       ZOMBIE (on_close ran, status CLOSED, fds and
 *                                       segments released) ──(last io_uring op done)──► freed
 *
 * dsess_end only marks a session; dsess_end_pending does the teardown outside callbacks,
 * so a callback never sees its session disappear under it.  The struct is freed only when
 * none of its io_uring operations is in flight, because each completion carries its
 * pointer in user_data (the session pointer | the operation in the low 3 bits).
 */
#ifndef RINGLM_DAEMON_SESSION_H
#define RINGLM_DAEMON_SESSION_H

#include <stdint.h>
#include <sys/types.h>

#include "daemon/loop.h"
#include "shm/wire.h"

#define DSESS_RATE_UIDS 256

/* The sessions of one loop (embedded in it; written by session.c only). */
typedef struct dsess_list {
    dsess *all;       /* every session, zombies included */
    dsess *to_end;    /* marked by dsess_end, torn down by dsess_end_pending */
    int live;         /* HELLO + ACTIVE */
    int active;       /* ACTIVE: what the global session limit counts */
    int half_open;    /* HELLO: accepted, no hello yet (their own, smaller budget) */
    int deferred;     /* HELLO sessions in their grace (no half-open budget yet) */
    int rate_waiting; /* HELLO sessions held for their uid's connect rate */
    uint64_t next_id;
    /* stderr lines about ended and refused sessions, rate-limited (a client that
	 * reconnects in a loop must not turn the daemon's log into its own) */
    uint64_t log_window_us;
    unsigned log_lines, log_suppressed;
    uint64_t doorbell_idle_wakes; /* doorbell wakes without work, every session, ever */
    uint64_t doorbell_holds;      /* times a session's doorbell was held back for them */
    /* per-uid connect rate buckets (dloop_config.connect_rate_per_uid); a full bucket says
	 * nothing, so when every entry is taken the fullest is handed to a new uid */
    struct dsess_rate {
        uid_t uid;
        int used;
        double tokens;
        uint64_t at_us;
        unsigned long long refused;
    } rate[DSESS_RATE_UIDS];
} dsess_list;

/* ---- lifecycle (the loop's side) ------------------------------------------------------ */

/* A new connection: a HELLO session with its peer's credentials and a recv armed for the
 * hello (or marked ending when that fails). */
void dsess_accept(dloop *l, int fd);
/* The handshake thread (loop.c, under the loop's lock): reads and answers the hello of
 * every HELLO session whose hello is there, until yield(l) says the loop wants its lock
 * back; the others are watched again.  Returns how many it answered or ended. */
int dsess_hellos_ready(dloop *l, int (*yield)(dloop *));
/* The loop, after its completions: sessions accepted before their hello whose grace is
 * over are charged to the half-open budget (refused if still without a hello and over
 * it); asks to be woken for the next grace to end. */
void dsess_check_deferred(dloop *l);
/* A completion whose user_data (>= DSESS_UD_MIN, without DLOOP_UD_SVC) is a session's:
 * the handshake, EOF, the peer's exit, a doorbell. */
void dsess_on_cqe(uint64_t user_data, int res);
/* Tears down every session dsess_end marked: on_close, status CLOSED, ops cancelled, fds
 * and segments released; the struct is freed once its last operation completed. */
void dsess_end_pending(dloop *l);
/* Ends sessions whose hello did not come in time. */
void dsess_expire_hellos(dloop *l, uint64_t now_us);
/* Marks every live session ending for cause (shutdown). */
void dsess_end_all(dloop *l, dsess_end_cause cause);
/* After the ring is gone: on_close for sessions the service knows, then free everything. */
void dsess_free_all(dloop *l);

/* ---- iteration ------------------------------------------------------------------------ */

/* First / next session of the loop (zombies included); iterate with dsess_active. */
dsess *dsess_first(dloop *l);
dsess *dsess_next(dsess *s);
/* ACTIVE and not ending: its rings may be used. */
int dsess_active(const dsess *s);

/* Record handler: return 0 when the record was taken, -EAGAIN to leave it in the ring
 * for a later iteration (draining stops for this session). */
typedef int (*dsess_rec_fn)(void *arg, dsess *s, const struct ringlm_wire_parsed *rec);
/* Reads up to max_records records from the submit ring (copy once, parse the copy) and
 * hands each to fn.  Returns records taken (>= 0), or -EBADMSG with why: the client wrote
 * something impossible and the session must end. */
int dsess_drain_submit(dsess *s, unsigned max_records, dsess_rec_fn fn, void *arg, char *why,
                       size_t why_len);
/* Publishes written events; wakes the client if it sleeps: a FUTEX_WAKE queued on the
 * loop's ring (dloop_queue_futex_wake: the loop submits an iteration's wakes in one system
 * call), or the system call itself where the kernel lacks it.
 * Returns 1 when it published something, 2 when it also woke the client. */
int dsess_publish(dsess *s);
/* The loop's side of the sleep handshake (shm/ring.h): announce (flag, full fence) before
 * dsess_prepare_sleep looks again; clear once awake. */
void dsess_announce_sleep(dsess *s);
void dsess_clear_sleep(dsess *s);
/* Before the loop sleeps (daemon_sleeping announced): 1 when the session has work after
 * all (records, unless paused, or space it waited for) or its doorbell wait could not be
 * armed; 0 when its doorbell wait is armed and the loop may sleep. */
int dsess_prepare_sleep(dsess *s, int paused);
/* Doorbell wakes the session caused without work (charged to it by the rate limit). */
uint64_t dsess_doorbell_idle_wakes(const dsess *s);
/* A session's doorbell wakes without work are held to this many a second (a burst of as
 * many): a legitimate client rings only with records or when it frees event-ring space. */
#define DSESS_DB_IDLE_RATE 200

/* Status words the client reads, on every ACTIVE session. */
void dsess_write_state_all(dloop *l, uint32_t state);
void dsess_write_policy_hash_all(dloop *l, uint64_t hash);
/* The daemon's load (shm/wire.h, struct ringlm_wire_load; seq and iterations are set here),
 * into one session's segment / every ACTIVE one's. */
void dsess_write_load(dsess *s, const struct ringlm_wire_load *ld);
void dsess_write_load_all(dloop *l, const struct ringlm_wire_load *ld);

#endif
