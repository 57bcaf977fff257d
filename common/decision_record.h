/* SPDX-License-Identifier: MIT */
/*
 * common/decision_record.h — one decision-log line as plain data (DESIGN.md §5): the record
 * the scheduler fills from one of its typed events (sched_event_record), the daemon and the
 * simulator hand to the one writer (formats/decision.c: fmt_decision_format, whose
 * fmt_decision is this record), and every reader gets back (fmt_decision_parse).
 *
 * It lives below every folder because both ends need it and neither may include the other:
 * sched/ produces events and knows the names of its enums but writes no JSON; formats/
 * writes and reads JSON but knows nothing of the scheduler.
 *
 * Absent fields: a NULL string, an integer DECISION_ABSENT, a real NaN (a negative real is
 * written null: an estimate or a duration that was not measured).
 *
 * Header only and libc only.
 */
#ifndef RINGLM_COMMON_DECISION_RECORD_H
#define RINGLM_COMMON_DECISION_RECORD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define DECISION_ABSENT INT64_MIN

typedef struct decision_record {
    uint64_t t_us;
    const char *ev; /* "admit", "reject", ... (required) */
    uint64_t req;
    const char *tenant, *class_name, *reason, *detail, *mode, *pool, *policy;
    const char *to;     /* cache_demote: the destination pool */
    const char *choice; /* cache_reload: "reload" or "recompute" */
    int64_t prompt_tokens, max_tokens, output_tokens, blocks, tokens, wait_us, ttft_us, xfer, bytes,
        cached_tokens, self_tokens;
    int64_t device_tokens, host_tokens, disk_tokens; /* cache_hit: the hit's tokens per pool */
    double swap_cost_us, recompute_cost_us, reload_cost_us, expected_reuse, predicted_us,
        realised_us;
} decision_record;

/* Every optional field absent; set t_us, ev and what applies. */
static inline void decision_record_init(decision_record *d)
{
    memset(d, 0, sizeof *d);
    d->prompt_tokens = d->max_tokens = d->output_tokens = d->blocks = d->tokens = d->wait_us =
        d->ttft_us = d->xfer = d->bytes = d->cached_tokens = d->self_tokens = d->device_tokens =
            d->host_tokens = d->disk_tokens = DECISION_ABSENT;
    d->swap_cost_us = d->recompute_cost_us = d->reload_cost_us = d->expected_reuse =
        d->predicted_us = d->realised_us = NAN;
}

#endif
