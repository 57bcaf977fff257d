/* SPDX-License-Identifier: MIT */
/*
 * daemon/session_priv.h — struct dsess, private to the session module: session.c (the
 * state machine, the handshake, the io_uring operations in flight, the teardown) and
 * session_shm.c (the session's two segments, its rings and status words, and the event
 * pushes of daemon/loop.h).  Nothing else includes it.
 */
#ifndef RINGLM_DAEMON_SESSION_PRIV_H
#define RINGLM_DAEMON_SESSION_PRIV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/session.h"
#include "shm/ring.h"
#include "shm/wire.h"

enum dsess_phase {
    DSESS_HELLO = 1, /* accepted, waiting for the client's hello */
    DSESS_ACTIVE,    /* segments mapped, service knows it */
    DSESS_ZOMBIE,    /* ended; waiting for its io_uring operations to complete */
};

/* Operations kept in flight per session (bits of dsess.armed, and the user_data tag:
 * session pointer | tag). */
enum { DSESS_OP_RECV = 1, DSESS_OP_PIDFD = 2, DSESS_OP_DOORBELL = 3 };
#define DSESS_UD_TAG_MASK 7ull

struct dsess {
    dloop *loop;
    uint64_t id;
    int phase;
    int sock, pidfd, efd; /* efd: eventfd doorbell or -1 */
    uid_t uid;
    gid_t gid;
    pid_t pid;
    void *user;
    int svc_knows; /* on_connect accepted: on_close is owed */

    /* segments */
    int cfd, dfd;
    struct ringlm_wire_cseg *cseg; /* client-written: never trusted */
    size_t cseg_bytes;
    struct ringlm_wire_dseg *dseg;
    size_t dseg_bytes;
    struct ring_rec_cons sub;
    struct ring_ev_prod ev;
    uint8_t *recbuf; /* private copy of one record (8-byte aligned) */
    size_t recbuf_len;
    int want_space; /* we set dseg->want_space */

    /* io_uring bookkeeping */
    unsigned armed; /* bit (1 << DSESS_OP_x) while that op is in flight */
    int inflight;   /* SQEs with this session's user_data not completed */
    uint64_t hello_deadline_us;
    int check_deferred; /* accepted without its hello: the half-open budget
	                                     is charged at check_at_us (dsess_check_deferred) */
    uint64_t check_at_us;
    int rate_wait; /* hello read, over its uid's connect rate: set up at
	                                     rate_at_us (dsess_check_deferred) */
    uint64_t rate_at_us;
    uint64_t eventfd_buf;
    /* Doorbell wakes that brought no work (no record, no space the loop waited for), a
     * token bucket per session (session.c, doorbell_charge): past it the session's
     * doorbell wait is re-armed only when the bucket has refilled, so a client ringing in a
     * loop costs the loop at most DSESS_DB_IDLE_RATE wakes a second. */
    int db_woken;           /* the doorbell wait completed; judged at the next sleep */
    uint64_t db_cons;       /* submit consumer index when it completed */
    double db_tokens;       /* idle wakes left */
    uint64_t db_tokens_us;  /* when db_tokens was last refilled */
    uint64_t db_hold_us;    /* doorbell not re-armed before this (0: no hold) */
    uint64_t db_idle_wakes; /* charged to the session, ever */
    uint64_t db_holds;      /* times it was held back */
    char rxbuf[sizeof(struct ringlm_wire_hello) + 64];

    /* ending */
    int ending;
    dsess_end_cause end_cause;
    char end_reason[104];

    struct dsess *next, *prev; /* the loop's list of all sessions (zombies included) */
    struct dsess *end_next;    /* the loop's list of sessions to end this iteration */
};

/* ---- session_shm.c, for session.c ------------------------------------------------------ */

/* Creates and maps both segments (sealed memfds) and sets up the rings. node >= 0 binds
 * them to that node (rnuma_bind); pages are faulted in as they are first used.  0 or -errno
 * with why. */
int dsess_segments_create(dsess *s, unsigned submit_bytes, unsigned event_slots, int node,
                          uint64_t policy_hash, char *why, size_t why_len);
void dsess_segments_destroy(dsess *s);
/* Does the submit ring hold unread bytes (or an impossible index, which also needs us)? */
int dsess_submit_pending(dsess *s);
/* With want_space set: has the client freed space since? */
int dsess_space_returned(dsess *s);
/* Status words the client reads. */
void dsess_write_state(dsess *s, uint32_t state);
void dsess_write_policy_hash(dsess *s, uint64_t hash);
/* Marks the session CLOSED with a reason and wakes the client. */
void dsess_write_closed(dsess *s, int err, const char *reason);

#endif
