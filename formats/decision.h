/* SPDX-License-Identifier: MIT */
/*
 * formats/decision.h — decision-log lines (DESIGN.md §5): one JSON object per scheduler
 * decision, {"t_us":…,"ev":"…","req":…,"tenant":"…","class":"…","reason":"…",…}.
 *
 * The one writer and the one reader of the decision log. A line is a decision_record
 * (common/decision_record.h): the scheduler fills one from each of its typed events
 * (sched_event_record) — the daemon's own rejects included, which it reports to the
 * scheduler as events (sched_note_reject) — and the daemon and the simulator write it here.
 * Every reader of a decision log uses fmt_decision_parse.
 *
 * Writer: a NULL string is omitted; an integer FMT_NULL is omitted; a real NaN is omitted,
 * a negative real is null (an estimate or a duration that was not measured), others have
 * one decimal. Strings are escaped and invalid UTF-8 repaired (formats/json.h).
 */
#ifndef RINGLM_FORMATS_DECISION_H
#define RINGLM_FORMATS_DECISION_H

#include <stddef.h>
#include <stdint.h>

#include "common/decision_record.h"
#include "formats/json.h"
#include "formats/request_log.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest detail text kept, plus the NUL (longer details are cut at a character boundary
 * when written). */
#define FMT_DETAIL_MAX 200

/* FMT_NULL is DECISION_ABSENT: an absent integer, in the record and in every format. */
_Static_assert(FMT_NULL == DECISION_ABSENT, "one absent integer");
typedef decision_record fmt_decision;

typedef struct fmt_decision_text {
    char ev[FMT_REASON_MAX], tenant[FMT_NAME_MAX], class_name[FMT_NAME_MAX], reason[FMT_REASON_MAX],
        detail[3 * FMT_DETAIL_MAX], mode[FMT_REASON_MAX], pool[FMT_REASON_MAX],
        policy[FMT_NAME_MAX], to[FMT_REASON_MAX], choice[FMT_REASON_MAX];
} fmt_decision_text;

/* A decision with every optional field absent (the strings NULL, integers FMT_NULL, reals
 * NaN); set t_us, ev and what applies. */
void fmt_decision_init(fmt_decision *d);

/* One JSON object (no newline) into buf[cap]: the length, or -EMSGSIZE. */
int fmt_decision_format(const fmt_decision *d, char *buf, size_t cap);

/* Parses one line (a scheduler event or a daemon line); absent fields as fmt_decision_init
 * sets them, a null real as -1. 0, or -EINVAL with why. Requires t_us, ev and req. */
int fmt_decision_parse(const char *line, size_t len, fmt_decision *out, fmt_decision_text *text,
                       char *why, size_t whylen);

#ifdef __cplusplus
}
#endif
#endif
