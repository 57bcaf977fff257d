/* SPDX-License-Identifier: MIT */
/*
 * formats/decision.h — decision-log lines (DESIGN.md §5): one JSON object per scheduler
 * decision, {"t_us":…,"ev":"…","req":…,"tenant":"…","class":"…","reason":"…",…}.
 *
 * The scheduler writes its own events (sched_event_json, which keeps sched/ free of any
 * dependency); lines the daemon writes itself (a request refused before the scheduler saw
 * it) are written here, with the same keys. Every reader of a decision log uses
 * fmt_decision_parse.
 *
 * Writer: a NULL string is omitted; an integer FMT_NULL is omitted; a real NaN is omitted,
 * a negative real is null (an estimate or a duration that was not measured), others have
 * one decimal.
 */
#ifndef RINGLM_FORMATS_DECISION_H
#define RINGLM_FORMATS_DECISION_H

#include <stddef.h>
#include <stdint.h>

#include "formats/json.h"
#include "formats/request_log.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest detail text kept, plus the NUL (longer details are cut at a character boundary
 * when written). */
#define FMT_DETAIL_MAX 200

typedef struct fmt_decision {
    uint64_t t_us;
    const char *ev; /* "admit", "reject", ... (required) */
    uint64_t req;
    const char *tenant, *class_name, *reason, *detail, *mode, *pool, *policy;
    int64_t prompt_tokens, max_tokens, output_tokens, blocks, tokens, wait_us, ttft_us, xfer,
        bytes;                                                         /* FMT_NULL: absent */
    double swap_cost_us, recompute_cost_us, predicted_us, realised_us; /* NaN: absent; <0 null */
} fmt_decision;

typedef struct fmt_decision_text {
    char ev[FMT_REASON_MAX], tenant[FMT_NAME_MAX], class_name[FMT_NAME_MAX], reason[FMT_REASON_MAX],
        detail[3 * FMT_DETAIL_MAX], mode[FMT_REASON_MAX], pool[FMT_REASON_MAX],
        policy[FMT_NAME_MAX];
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
