/* SPDX-License-Identifier: MIT */
/*
 * formats/iteration_log.h — the iteration log (sim/FORMATS.md "Iteration log"): one JSON
 * object per engine iteration that ran a batch. Written by ringlmd (--iteration-log), read by
 * ringlm-sim (--iteration-log) and the tests; this is its only writer and only reader.
 *
 * Reader rules: prefill_tokens, decode_seqs, context_tokens and prefill_pairs are required;
 * period_us missing is null; transfers missing is 0; every other known key is checked when
 * present (a number >= 0; the counts it, prefill_tokens, prefill_seqs, decode_seqs,
 * context_tokens, transfers and wakes integers). Unknown keys are ignored.
 */
#ifndef RINGLM_FORMATS_ITERATION_LOG_H
#define RINGLM_FORMATS_ITERATION_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "formats/json.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fmt_iteration {
    int64_t it; /* loop counter; FMT_NULL when absent */
    /* Times in µs. Written as whole numbers; read as numbers (a fraction is kept: logs of
     * other tools and the tests carry them). NaN: absent / null. */
    double t_us;      /* iteration start */
    double period_us; /* to the next iteration's start; NaN: went idle, or the last */
    double iter_us;
    double exec_us;
    int64_t prefill_tokens;
    int64_t prefill_seqs; /* FMT_NULL when absent */
    double prefill_pairs;
    int64_t decode_seqs;
    double decode_context; /* NaN when absent */
    int64_t context_tokens;
    int64_t transfers; /* 0 when absent */
    int64_t wakes;     /* FMT_NULL when absent */
} fmt_iteration;

/* One JSON object (no newline) into buf[cap]: the length, or -EMSGSIZE. The pairs and the
 * decode context are written as whole numbers. Pure. */
int fmt_iteration_format(const fmt_iteration *it, char *buf, size_t cap);

/* Parses one line. 0, or -EINVAL with why naming the field. */
int fmt_iteration_parse(const char *line, size_t len, fmt_iteration *out, char *why, size_t whylen);

#ifdef __cplusplus
}
#endif
#endif
