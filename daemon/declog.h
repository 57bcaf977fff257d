/* SPDX-License-Identifier: MIT */
/*
 * daemon/declog.h — the decision log (DESIGN.md §5, JSON lines in the scheduler's schema),
 * the request log (sim/FORMATS.md native JSONL) and the iteration log (sim/FORMATS.md), all
 * written off the hot path.
 *
 * The loop thread formats a line (fmt_decision_format of a scheduler event's record for decisions, this
 * formats/ writers for requests and iterations) and copies it into a bounded byte ring —
 * one per log, single producer (the loop), single consumer (the writer thread). The writer
 * thread drains the rings with write(2) in large chunks and wakes on its own (every few
 * ms, or at once when a ring is a quarter full) — the loop never makes a syscall to hand
 * over a line, never waits for the disk, and never blocks: when a ring is full the line is
 * dropped and counted. The writer reports drops on stderr ("declog: N decision lines
 * dropped ...") as they happen and at close; declog_dropped() gives the counts (the
 * daemon exports them as metrics).
 *
 * Thread-safety: declog_decision*, declog_request and declog_dropped from one thread (the
 * loop); declog_flush/declog_destroy from that same thread.
 *
 * Errors: 0 or a negative errno; declog_errmsg() has a thread-local detail string.
 */
#ifndef RINGLM_DAEMON_DECLOG_H
#define RINGLM_DAEMON_DECLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/decision.h"
#include "formats/iteration_log.h"
#include "formats/request_log.h"

#ifdef __cplusplus
extern "C" {
#endif

struct sched_event; /* sched/sched.h */

/* Longest line accepted (longer ones are dropped and counted). */
#define DECLOG_LINE_MAX 4096

typedef struct declog_config {
    const char *decision_path;  /* NULL: no decision log. "-" = stdout. Appended to. */
    const char *request_path;   /* NULL: no request log. "-" = stdout. Appended to. */
    const char *iteration_path; /* NULL: no iteration log (sim/FORMATS.md). Appended to. */
    size_t ring_bytes;          /* per log (0: 4 MiB), rounded up to a power of two */
    bool truncate;              /* true: truncate the files at open instead of appending */
} declog_config;

typedef struct declog declog;

/*
 * Opens the files (O_CREAT|O_APPEND, 0644) and starts the writer thread.
 * Errors: -errno of open() with the path in the detail, -ENOMEM, -EINVAL.
 */
int declog_create(const declog_config *cfg, declog **out);
/* Drains what is queued (the writer writes everything), stops the writer, closes. NULL ok. */
void declog_destroy(declog *d);
const char *declog_errmsg(void);

/* Is this log configured? (cheap; lets the caller skip formatting) */
bool declog_has_decisions(const declog *d);
bool declog_has_requests(const declog *d);
bool declog_has_iterations(const declog *d);

/* ---- iteration log (sim/FORMATS.md "Iteration log") ---------------------------------- */

/* Queues one preformatted JSON object (without newline). Same returns as
 * declog_decision_line; a no-op returning 0 when the log is not configured. */
int declog_iteration_line(declog *d, const char *json, size_t len);
/* Formats it with fmt_iteration_format and queues the line (a no-op returning 0 when the
 * log is not configured). Same returns as declog_decision_line. */
int declog_iteration(declog *d, const fmt_iteration *it);

/* ---- decision log ------------------------------------------------------------------- */

/* Writes a scheduler event (the daemon's own rejects are scheduler events too:
 * sched_note_reject) with the one writer, sched_event_record → fmt_decision_format, and
 * queues the line. 0, -ENOBUFS (ring full: dropped and counted), -EMSGSIZE (too long:
 * dropped, counted). */
int declog_decision(declog *d, const struct sched_event *ev);
/* Queues one preformatted JSON object (without newline; one is added). Same returns. */
int declog_decision_line(declog *d, const char *json, size_t len);
/* Formats one record with fmt_decision_format (every string escaped) and queues it. Same
 * returns. */
int declog_decision_record(declog *d, const fmt_decision *rec);

/* ---- request log (sim/FORMATS.md "Native request trace") ---------------------------- */

/* The record is formats/request_log.h's (its one writer and reader); these names stay so
 * the daemon reads as it did. Optional integer fields use DECLOG_NULL (FMT_NULL). */
#define DECLOG_NULL FMT_NULL
typedef fmt_request declog_request;

/* Formats r with fmt_request_format and queues the line. Same returns as declog_decision. */
int declog_request_line(declog *d, const declog_request *r);

/* ---- accounting --------------------------------------------------------------------- */

/* Lines dropped so far (ring full or too long), per log. */
void declog_dropped(const declog *d, uint64_t *decision_lines, uint64_t *request_lines);
/* Lines queued so far, per log. */
void declog_queued(const declog *d, uint64_t *decision_lines, uint64_t *request_lines);
/*
 * Waits until the writer has written (write(2) returned) everything queued before this
 * call, up to timeout_ms. For tests and shutdown — never call it from the loop's hot path.
 * 0 or -ETIMEDOUT.
 */
int declog_flush(declog *d, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif
