/* SPDX-License-Identifier: MIT */
/* formats/decision.c — decision-log lines: writer and reader (see decision.h). */
#include "formats/decision.h"

#include <errno.h>
#include <math.h>
#include <string.h>

void fmt_decision_init(fmt_decision *d)
{
    decision_record_init(d);
}

static void opt_str(fmt_json *j, const char *key, const char *s)
{
    if (s) fmt_json_str(j, key, s);
}

static void opt_int(fmt_json *j, const char *key, int64_t v)
{
    if (v != FMT_NULL) fmt_json_int(j, key, v);
}

static void opt_real(fmt_json *j, const char *key, double v)
{
    if (isnan(v)) return;
    if (v < 0)
        fmt_json_null(j, key);
    else
        fmt_json_double(j, key, v, 1);
}

/* The longest prefix of s within max bytes that does not cut a UTF-8 sequence. */
static size_t cut(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n <= max) return n;
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80) max--;
    return max;
}

int fmt_decision_format(const fmt_decision *d, char *buf, size_t cap)
{
    fmt_json j;
    fmt_json_init(&j, buf, cap);
    fmt_json_uint(&j, "t_us", d->t_us);
    fmt_json_str(&j, "ev", d->ev ? d->ev : "?");
    fmt_json_uint(&j, "req", d->req);
    opt_str(&j, "tenant", d->tenant);
    opt_str(&j, "class", d->class_name);
    opt_str(&j, "reason", d->reason);
    if (d->detail) fmt_json_strn(&j, "detail", d->detail, cut(d->detail, FMT_DETAIL_MAX - 1));
    opt_str(&j, "mode", d->mode);
    opt_str(&j, "pool", d->pool);
    opt_int(&j, "prompt_tokens", d->prompt_tokens);
    opt_int(&j, "max_tokens", d->max_tokens);
    opt_int(&j, "output_tokens", d->output_tokens);
    opt_int(&j, "blocks", d->blocks);
    opt_int(&j, "tokens", d->tokens);
    opt_int(&j, "wait_us", d->wait_us);
    opt_int(&j, "ttft_us", d->ttft_us);
    opt_int(&j, "xfer", d->xfer);
    opt_int(&j, "bytes", d->bytes);
    opt_int(&j, "cached_tokens", d->cached_tokens);
    opt_int(&j, "self_tokens", d->self_tokens);
    opt_int(&j, "device_tokens", d->device_tokens);
    opt_int(&j, "host_tokens", d->host_tokens);
    opt_int(&j, "disk_tokens", d->disk_tokens);
    opt_str(&j, "to", d->to);
    opt_str(&j, "choice", d->choice);
    opt_real(&j, "swap_cost_us", d->swap_cost_us);
    opt_real(&j, "reload_cost_us", d->reload_cost_us);
    opt_real(&j, "recompute_cost_us", d->recompute_cost_us);
    opt_real(&j, "expected_reuse", d->expected_reuse);
    opt_real(&j, "predicted_us", d->predicted_us);
    opt_real(&j, "realised_us", d->realised_us);
    opt_str(&j, "policy", d->policy);
    return fmt_json_end(&j);
}

static int get_real(json_t *o, const char *key, double *out, char *why, size_t wl)
{
    json_t *v = json_object_get(o, key);
    if (!v) return 0; /* absent: NaN stays */
    if (json_is_null(v)) {
        *out = -1;
        return 0;
    }
    return fmt_get_num(o, key, 0, 0, out, why, wl);
}

static int get_s(json_t *o, const char *key, char *dst, size_t cap, const char **out, char *why,
                 size_t wl)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (fmt_get_str(o, key, 0, dst, cap, why, wl)) return -1;
    *out = dst;
    return 0;
}

int fmt_decision_parse(const char *line, size_t len, fmt_decision *out, fmt_decision_text *text,
                       char *why, size_t whylen)
{
    fmt_decision_init(out);
    memset(text, 0, sizeof *text);
    json_t *o = fmt_load_object(line, len, why, whylen);
    if (!o) return -EINVAL;
    int64_t t = 0, req = 0;
    const int64_t M = INT64_MAX;
    int bad = fmt_get_int(o, "t_us", FMT_REQUIRED, 0, M, &t, why, whylen) ||
              fmt_get_str(o, "ev", FMT_REQUIRED, text->ev, sizeof text->ev, why, whylen) ||
              fmt_get_int(o, "req", FMT_REQUIRED, 0, M, &req, why, whylen) ||
              get_s(o, "tenant", text->tenant, sizeof text->tenant, &out->tenant, why, whylen) ||
              get_s(o, "class", text->class_name, sizeof text->class_name, &out->class_name, why,
                    whylen) ||
              get_s(o, "reason", text->reason, sizeof text->reason, &out->reason, why, whylen) ||
              get_s(o, "detail", text->detail, sizeof text->detail, &out->detail, why, whylen) ||
              get_s(o, "mode", text->mode, sizeof text->mode, &out->mode, why, whylen) ||
              get_s(o, "pool", text->pool, sizeof text->pool, &out->pool, why, whylen) ||
              get_s(o, "policy", text->policy, sizeof text->policy, &out->policy, why, whylen) ||
              get_s(o, "to", text->to, sizeof text->to, &out->to, why, whylen) ||
              get_s(o, "choice", text->choice, sizeof text->choice, &out->choice, why, whylen) ||
              fmt_get_int(o, "cached_tokens", 0, 0, M, &out->cached_tokens, why, whylen) ||
              fmt_get_int(o, "self_tokens", 0, 0, M, &out->self_tokens, why, whylen) ||
              fmt_get_int(o, "device_tokens", 0, 0, M, &out->device_tokens, why, whylen) ||
              fmt_get_int(o, "host_tokens", 0, 0, M, &out->host_tokens, why, whylen) ||
              fmt_get_int(o, "disk_tokens", 0, 0, M, &out->disk_tokens, why, whylen) ||
              get_real(o, "reload_cost_us", &out->reload_cost_us, why, whylen) ||
              get_real(o, "expected_reuse", &out->expected_reuse, why, whylen) ||
              fmt_get_int(o, "prompt_tokens", 0, 0, M, &out->prompt_tokens, why, whylen) ||
              fmt_get_int(o, "max_tokens", 0, 0, M, &out->max_tokens, why, whylen) ||
              fmt_get_int(o, "output_tokens", 0, 0, M, &out->output_tokens, why, whylen) ||
              fmt_get_int(o, "blocks", 0, 0, M, &out->blocks, why, whylen) ||
              fmt_get_int(o, "tokens", 0, 0, M, &out->tokens, why, whylen) ||
              fmt_get_int(o, "wait_us", 0, 0, M, &out->wait_us, why, whylen) ||
              fmt_get_int(o, "ttft_us", 0, 0, M, &out->ttft_us, why, whylen) ||
              fmt_get_int(o, "xfer", 0, 0, M, &out->xfer, why, whylen) ||
              fmt_get_int(o, "bytes", 0, 0, M, &out->bytes, why, whylen) ||
              get_real(o, "swap_cost_us", &out->swap_cost_us, why, whylen) ||
              get_real(o, "recompute_cost_us", &out->recompute_cost_us, why, whylen) ||
              get_real(o, "predicted_us", &out->predicted_us, why, whylen) ||
              get_real(o, "realised_us", &out->realised_us, why, whylen);
    json_decref(o);
    if (bad) return -EINVAL;
    out->t_us = (uint64_t)t;
    out->req = (uint64_t)req;
    out->ev = text->ev;
    return 0;
}
