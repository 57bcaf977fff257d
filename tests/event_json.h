/* SPDX-License-Identifier: MIT */
/*
 * tests/event_json.h — a scheduler event as its decision-log line, the way the daemon and the
 * simulator write it (sched_event_record, then the one writer fmt_decision_format), for
 * suites that read the scheduler's decisions as text.
 */
#ifndef RINGLM_TESTS_EVENT_JSON_H
#define RINGLM_TESTS_EVENT_JSON_H

#include "formats/decision.h"
#include "sched/sched.h"

/* The line (no newline) into buf[cap]: its length, or -EMSGSIZE when it does not fit. */
static inline int event_json(const sched_event *ev, char *buf, size_t cap)
{
    fmt_decision rec;
    sched_event_record(ev, &rec);
    return fmt_decision_format(&rec, buf, cap);
}

#endif
