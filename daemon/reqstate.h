/* SPDX-License-Identifier: MIT */
/*
 * daemon/reqstate.h — a request's life in the runner: one state, one table of legal
 * transitions, one function that moves a request and checks the move (as sched/store.c's
 * sc_set_state does for the scheduler's own states).
 *
 *   admitting   → queued                    the checks passed: sched_submit took it
 *               → compiling                 the checks passed; its constraint compiles
 *               → ended | ended_out         rejected (by the checks or by the scheduler)
 *   compiling   → queued                    compiled: sched_submit took it
 *               → ended | ended_out         the constraint does not compile, the scheduler
 *                                           rejected it, or it was cancelled meanwhile
 *   queued      → running                   the scheduler started it (its first schedule)
 *               → ended | ended_out         cancelled, timed out before it started
 *   running     → running_out               a token waits in its session's outbox
 *               → ended | ended_out         finished, cancelled, timed out
 *   running_out → running                   its tokens went into the event ring
 *               → running_blocked           the event ring is full (the scheduler is told)
 *               → ended_out                 ended with tokens still to push
 *               → ended                     cancelled as its session closes
 *   running_blocked → running               the client read: its tokens went out
 *               → ended_out                 ended (backpressure timeout, cancel, finish)
 *               → ended                     cancelled as its session closes
 *   ended_out   → finished                  its FINISH went into the event ring
 *               → ended                     its session closes before it could go out
 *   ended, finished                         terminal: the request is freed
 *
 * "ended" means the scheduler is done with it (or never took it) and its finish reason is
 * fixed; "_out" that it is linked in its session's outbox (o_next), "blocked" that the
 * scheduler was told its output is blocked (sched_set_output_blocked). A request that ended
 * is never reported blocked: the scheduler has released it.
 *
 * An illegal move is counted and logged (the first, then each power of two), never
 * refused and never fatal: the caller's bookkeeping has already moved, and a client's
 * behaviour must not be able to stop the daemon. The count is in req_state_audit.
 */
#ifndef RINGLM_DAEMON_REQSTATE_H
#define RINGLM_DAEMON_REQSTATE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum req_state {
    REQ_ADMITTING = 0,   /* req_new: the admission checks run; not in the scheduler */
    REQ_COMPILING,       /* checks passed; its constraint compiles (not in the scheduler) */
    REQ_QUEUED,          /* submitted; the scheduler has not started it */
    REQ_RUNNING,         /* started; nothing waits to go out */
    REQ_RUNNING_OUT,     /* started; tokens wait in its session's outbox */
    REQ_RUNNING_BLOCKED, /* started; tokens wait and the event ring is full */
    REQ_ENDED_OUT,       /* ended; its FINISH (after any tokens) waits in the outbox */
    REQ_ENDED,           /* ended, nothing more goes out (its session is closing) */
    REQ_FINISHED,        /* its FINISH is in the event ring */
    REQ_STATE__COUNT
} req_state;

/* Illegal moves seen, and the first one. */
typedef struct req_state_audit {
    uint64_t illegal;
    uint64_t first_req;
    uint8_t first_from, first_to;
} req_state_audit;

/* Moves *state to `to`. Returns true when the table allows it; otherwise counts it in a,
 * says so on stderr (the first and each power of two) and moves anyway. */
bool req_state_move(req_state_audit *a, uint64_t req, uint8_t *state, req_state to);

/* "admitting", "queued", … ("?" for a value out of range). */
const char *req_state_name(unsigned st);

static inline bool req_state_ended(unsigned st)
{
    return st >= REQ_ENDED_OUT;
}
static inline bool req_state_started(unsigned st)
{
    return st >= REQ_RUNNING && st <= REQ_RUNNING_BLOCKED;
}
/* Linked in its session's outbox. */
static inline bool req_state_in_outbox(unsigned st)
{
    return st == REQ_RUNNING_OUT || st == REQ_RUNNING_BLOCKED || st == REQ_ENDED_OUT;
}

#endif
