/* SPDX-License-Identifier: MIT */
/* formats/iteration_log.c — the iteration log's writer and reader (see iteration_log.h). */
#include "formats/iteration_log.h"

#include <errno.h>
#include <math.h>
#include <string.h>

int fmt_iteration_format(const fmt_iteration *it, char *buf, size_t cap)
{
    fmt_json j;
    fmt_json_init(&j, buf, cap);
    fmt_json_int(&j, "it", it->it);
    fmt_json_double(&j, "t_us", it->t_us, 0);
    fmt_json_double(&j, "period_us", it->period_us, 0);
    fmt_json_double(&j, "iter_us", it->iter_us, 0);
    fmt_json_double(&j, "exec_us", it->exec_us, 0);
    fmt_json_int(&j, "prefill_tokens", it->prefill_tokens);
    fmt_json_int(&j, "prefill_seqs", it->prefill_seqs);
    fmt_json_double(&j, "prefill_pairs", it->prefill_pairs, 0);
    fmt_json_int(&j, "decode_seqs", it->decode_seqs);
    fmt_json_double(&j, "decode_context", it->decode_context, 0);
    fmt_json_int(&j, "context_tokens", it->context_tokens);
    fmt_json_int(&j, "transfers", it->transfers);
    fmt_json_int(&j, "wakes", it->wakes);
    return fmt_json_end(&j);
}

/* An integer-typed field: a number >= 0 with no fraction. */
static int get_count(json_t *o, const char *key, unsigned flags, int64_t *out, char *why, size_t wl)
{
    double d = 0;
    if (fmt_get_num(o, key, flags | FMT_NULLABLE, 0, &d, why, wl)) return -1;
    if (isnan(d)) {
        *out = FMT_NULL;
        return 0;
    }
    if (d != floor(d) || d > 9e18) {
        snprintf(why, wl, "\"%s\" is %g, must be an integer", key, d);
        return -1;
    }
    *out = (int64_t)d;
    return 0;
}

int fmt_iteration_parse(const char *line, size_t len, fmt_iteration *out, char *why, size_t whylen)
{
    memset(out, 0, sizeof *out);
    json_t *o = fmt_load_object(line, len, why, whylen);
    if (!o) return -EINVAL;
    /* the fields the fit uses first, then the others: checked when present so that a broken
     * writer shows up here rather than as a silently wrong model */
    int bad =
        get_count(o, "prefill_tokens", FMT_REQUIRED, &out->prefill_tokens, why, whylen) ||
        get_count(o, "decode_seqs", FMT_REQUIRED, &out->decode_seqs, why, whylen) ||
        get_count(o, "context_tokens", FMT_REQUIRED, &out->context_tokens, why, whylen) ||
        fmt_get_num(o, "prefill_pairs", FMT_REQUIRED, 0, &out->prefill_pairs, why, whylen) ||
        get_count(o, "it", 0, &out->it, why, whylen) ||
        fmt_get_num(o, "t_us", FMT_NULLABLE, 0, &out->t_us, why, whylen) ||
        fmt_get_num(o, "period_us", FMT_NULLABLE, 0, &out->period_us, why, whylen) ||
        fmt_get_num(o, "iter_us", FMT_NULLABLE, 0, &out->iter_us, why, whylen) ||
        fmt_get_num(o, "exec_us", FMT_NULLABLE, 0, &out->exec_us, why, whylen) ||
        get_count(o, "prefill_seqs", 0, &out->prefill_seqs, why, whylen) ||
        fmt_get_num(o, "decode_context", FMT_NULLABLE, 0, &out->decode_context, why, whylen) ||
        get_count(o, "transfers", 0, &out->transfers, why, whylen) ||
        get_count(o, "wakes", 0, &out->wakes, why, whylen);
    json_decref(o);
    if (bad) return -EINVAL;
    if (out->transfers == FMT_NULL) out->transfers = 0;
    return 0;
}
