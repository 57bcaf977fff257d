/* SPDX-License-Identifier: MIT */
/* event.c — stable names of every scheduler enum, the error detail string, and the JSON-line
 * record of DESIGN.md §5 that the one writer (formats/decision.c) turns into a line. */
#include "sched/sched.h"
#include "common/errdetail.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- names --------------------------------------------------------------------------- */

#define NAME_OF(table, v)                                                                          \
    (((unsigned)(v) < sizeof(table) / sizeof((table)[0])) ? (table)[(unsigned)(v)] : "?")

static const char *const mode_names[] = {"static", "dynamic", "continuous", "token_budget"};
static const char *const preempt_names[] = {"auto", "swap", "recompute", "none"};
static const char *const reject_names[] = {
    "none",      "invalid",    "duplicate_id", "unknown_class", "unknown_tenant",
    "too_long",  "never_fits", "tenant_quota", "queue_full",    "deadline_infeasible",
    "bad_token", "bad_params", "draining",     "internal"};
static const char *const cancel_names[] = {"client_cancel", "disconnect",     "backpressure",
                                           "shutdown",      "kv_read_failed", "engine_error"};
static const char *const defer_names[] = {
    "none", "budget", "blocks", "quota", "rate", "max_active", "output_backpressure", "batch"};
static const char *const timeout_names[] = {"queue_wait", "deadline", "deadline_infeasible"};
static const char *const finish_names[] = {"none", "stop", "length"};
static const char *const pool_names[] = {"device", "host", "disk"};
static const char *const outcome_names[] = {NULL,     "start",     "resume", "done",
                                            "failed", "abandoned", "damaged"};
static const char *const event_names[] = {
    "admit",     "reject",      "defer",        "schedule",    "preempt", "swap_out",
    "swap_in",   "recompute",   "cancel",       "timeout",     "finish",  "release",
    "cache_hit", "cache_evict", "cache_demote", "cache_reload"};
static const char *const evict_names[] = {"demand", "tenant_cap", "orphan",
                                          "moved",  "clear",      "failed"};
static const char *const prefix_order_names[] = {"fcfs", "longest_prefix"};

_Static_assert(sizeof(reject_names) / sizeof(reject_names[0]) == SCHED_REJECT__COUNT, "names");
_Static_assert(sizeof(cancel_names) / sizeof(cancel_names[0]) == SCHED_CANCEL__COUNT, "names");
_Static_assert(sizeof(defer_names) / sizeof(defer_names[0]) == SCHED_DEFER__COUNT, "names");
_Static_assert(sizeof(timeout_names) / sizeof(timeout_names[0]) == SCHED_TIMEOUT__COUNT, "names");
_Static_assert(sizeof(pool_names) / sizeof(pool_names[0]) == SCHED_POOL__COUNT, "names");
_Static_assert(sizeof(event_names) / sizeof(event_names[0]) == SCHED_EV__COUNT, "names");
_Static_assert(sizeof(evict_names) / sizeof(evict_names[0]) == SCHED_PREFIX_EVICT__COUNT, "names");
_Static_assert(sizeof(prefix_order_names) / sizeof(prefix_order_names[0]) ==
                   SCHED_PREFIX_ORDER__COUNT,
               "names");
_Static_assert(sizeof(outcome_names) / sizeof(outcome_names[0]) == SCHED_OUTCOME__COUNT, "names");
_Static_assert(sizeof(preempt_names) / sizeof(preempt_names[0]) == SCHED_PREEMPT_NONE + 1, "names");

const char *sched_mode_name(sched_mode m)
{
    return NAME_OF(mode_names, m);
}
const char *sched_preempt_mode_name(sched_preempt_mode m)
{
    return NAME_OF(preempt_names, m);
}
const char *sched_prefix_order_name(sched_prefix_order o)
{
    return NAME_OF(prefix_order_names, o);
}
const char *sched_reject_name(sched_reject_reason r)
{
    return NAME_OF(reject_names, r);
}
const char *sched_cancel_name(sched_cancel_reason r)
{
    return NAME_OF(cancel_names, r);
}
const char *sched_defer_name(sched_defer_reason r)
{
    return NAME_OF(defer_names, r);
}
const char *sched_timeout_name(sched_timeout_reason r)
{
    return NAME_OF(timeout_names, r);
}
const char *sched_finish_name(sched_finish_reason r)
{
    return NAME_OF(finish_names, r);
}
const char *sched_pool_name(sched_pool p)
{
    return NAME_OF(pool_names, p);
}
const char *sched_event_name(sched_event_kind k)
{
    return NAME_OF(event_names, k);
}
const char *sched_prefix_evict_name(sched_prefix_evict_reason r)
{
    return NAME_OF(evict_names, r);
}
const char *sched_outcome_name(sched_outcome o)
{
    return (unsigned)o < SCHED_OUTCOME__COUNT ? outcome_names[o] : "?";
}

const char *sched_event_reason_name(const sched_event *ev)
{
    switch (ev->kind) {
    case SCHED_EV_REJECT: return sched_reject_name(ev->reject);
    case SCHED_EV_DEFER:
    case SCHED_EV_PREEMPT: return sched_defer_name(ev->defer);
    case SCHED_EV_CANCEL: return sched_cancel_name(ev->cancel);
    case SCHED_EV_TIMEOUT: return sched_timeout_name(ev->timeout);
    case SCHED_EV_FINISH: return sched_finish_name(ev->finish);
    case SCHED_EV_CACHE_EVICT: return sched_prefix_evict_name(ev->evict);
    case SCHED_EV_SCHEDULE:
    case SCHED_EV_SWAP_OUT:
    case SCHED_EV_SWAP_IN:
    case SCHED_EV_RECOMPUTE:
    case SCHED_EV_CACHE_DEMOTE:
    case SCHED_EV_CACHE_RELOAD: return sched_outcome_name(ev->outcome);
    default: return NULL;
    }
}

/* ---- request ends: the client's and the request logs' vocabulary ------------------------ */

const char *sched_end_name(unsigned code)
{
    return end_code_name(code);
}

static const uint8_t reject_cause[SCHED_REJECT__COUNT] = {
    [SCHED_REJECT_NONE] = SCHED_END_NONE,
    [SCHED_REJECT_INVALID] = SCHED_END_BAD_PARAMS,
    [SCHED_REJECT_DUPLICATE] = SCHED_END_DUPLICATE_ID,
    [SCHED_REJECT_UNKNOWN_CLASS] = SCHED_END_UNKNOWN_CLASS,
    [SCHED_REJECT_UNKNOWN_TENANT] = SCHED_END_BAD_PARAMS,
    [SCHED_REJECT_TOO_LONG] = SCHED_END_TOO_LONG,
    [SCHED_REJECT_NEVER_FITS] = SCHED_END_NEVER_FITS,
    [SCHED_REJECT_TENANT_QUOTA] = SCHED_END_TENANT_QUOTA,
    [SCHED_REJECT_QUEUE_FULL] = SCHED_END_QUEUE_FULL,
    [SCHED_REJECT_DEADLINE] = SCHED_END_DEADLINE_INFEASIBLE,
    [SCHED_REJECT_BAD_TOKEN] = SCHED_END_BAD_TOKEN,
    [SCHED_REJECT_BAD_PARAMS] = SCHED_END_BAD_PARAMS,
    [SCHED_REJECT_DRAINING] = SCHED_END_DRAINING,
    [SCHED_REJECT_INTERNAL] = SCHED_END_INTERNAL,
};
static const uint8_t cancel_cause[SCHED_CANCEL__COUNT] = {
    [SCHED_CANCEL_CLIENT] = SCHED_END_NONE,
    [SCHED_CANCEL_DISCONNECT] = SCHED_END_CLIENT_GONE,
    [SCHED_CANCEL_BACKPRESSURE] = SCHED_END_OUTPUT_BACKPRESSURE,
    [SCHED_CANCEL_SHUTDOWN] = SCHED_END_DRAINING,
    [SCHED_CANCEL_KV_READ_FAILED] = SCHED_END_INTERNAL,
    [SCHED_CANCEL_ENGINE_ERROR] = SCHED_END_INTERNAL,
};
static const uint8_t timeout_cause[SCHED_TIMEOUT__COUNT] = {
    [SCHED_TIMEOUT_QUEUE_WAIT] = SCHED_END_NONE,
    [SCHED_TIMEOUT_DEADLINE] = SCHED_END_NONE,
    [SCHED_TIMEOUT_PREEMPT] = SCHED_END_DEADLINE_INFEASIBLE,
};

sched_end_code sched_reject_cause(sched_reject_reason r)
{
    return (unsigned)r < SCHED_REJECT__COUNT ? (sched_end_code)reject_cause[r]
                                             : SCHED_END_BAD_PARAMS;
}
sched_end_code sched_cancel_cause(sched_cancel_reason r)
{
    return (unsigned)r < SCHED_CANCEL__COUNT ? (sched_end_code)cancel_cause[r] : SCHED_END_NONE;
}
sched_end_code sched_timeout_cause(sched_timeout_reason r)
{
    return (unsigned)r < SCHED_TIMEOUT__COUNT ? (sched_end_code)timeout_cause[r] : SCHED_END_NONE;
}

/* ---- error detail ------------------------------------------------------------------------ */

/* Thread-local so two schedulers on two threads never read each other's message; it is the
 * only state outside a scheduler or a policy. */
ERRDETAIL_DEFINE(last_error);

const char *sched_last_error(void)
{
    return last_error.msg;
}

void sched__set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    errdetail_vset(&last_error, 0, fmt, ap);
    va_end(ap);
}

/* ---- decision-log records ----------------------------------------------------------------- */

/* Fills the keys DESIGN.md §5 gives an event of this kind; the one JSON writer
 * (formats/decision.c) writes the line. */
void sched_event_record(const sched_event *ev, decision_record *d)
{
    decision_record_init(d);
    if (!ev) return;
    d->t_us = ev->t_us;
    d->ev = sched_event_name(ev->kind);
    d->req = ev->req;
    d->tenant = ev->tenant;
    d->class_name = ev->class_name;
    const char *reason = sched_event_reason_name(ev);
    d->reason = reason;
    switch (ev->kind) {
    case SCHED_EV_REJECT: d->detail = ev->detail; /* fall through */
    case SCHED_EV_ADMIT:
        d->prompt_tokens = ev->prompt_tokens;
        d->max_tokens = ev->max_tokens;
        break;
    case SCHED_EV_DEFER: break;
    case SCHED_EV_SCHEDULE:
        d->blocks = ev->blocks;
        d->wait_us = (int64_t)ev->wait_us;
        break;
    case SCHED_EV_PREEMPT:
        d->mode = sched_preempt_mode_name(ev->mode);
        d->blocks = ev->blocks;
        d->swap_cost_us = ev->swap_cost_us;
        d->recompute_cost_us = ev->recompute_cost_us;
        break;
    case SCHED_EV_SWAP_OUT:
    case SCHED_EV_SWAP_IN:
        d->xfer = (int64_t)ev->xfer;
        d->blocks = ev->blocks;
        d->bytes = (int64_t)ev->bytes;
        d->pool = sched_pool_name(ev->pool);
        goto realised;
    case SCHED_EV_RECOMPUTE:
        d->tokens = ev->tokens;
    realised:
        /* a reason marks the completion record: the realised cost next to the estimate */
        if (reason) {
            d->mode = sched_preempt_mode_name(ev->mode);
            d->predicted_us = ev->predicted_us;
            d->realised_us = ev->realised_us;
        }
        break;
    case SCHED_EV_CANCEL: break;
    case SCHED_EV_TIMEOUT: d->wait_us = (int64_t)ev->wait_us; break;
    case SCHED_EV_FINISH:
        d->prompt_tokens = ev->prompt_tokens;
        d->output_tokens = ev->output_tokens;
        d->ttft_us = (int64_t)ev->wait_us;
        d->policy = ev->policy;
        if (ev->cached_tokens) d->cached_tokens = ev->cached_tokens;
        break;
    case SCHED_EV_CACHE_HIT:
        d->blocks = ev->blocks;
        d->pool = sched_pool_name(ev->pool);
        d->cached_tokens = ev->cached_tokens;
        d->self_tokens = ev->self_tokens;
        d->prompt_tokens = ev->prompt_tokens;
        /* tokens per tier, when any came from a colder one */
        if (ev->pool_tokens[SCHED_POOL_HOST] || ev->pool_tokens[SCHED_POOL_DISK]) {
            d->device_tokens = ev->pool_tokens[SCHED_POOL_DEVICE];
            d->host_tokens = ev->pool_tokens[SCHED_POOL_HOST];
            d->disk_tokens = ev->pool_tokens[SCHED_POOL_DISK];
        }
        break;
    case SCHED_EV_CACHE_EVICT:
        d->blocks = ev->blocks;
        d->pool = sched_pool_name(ev->pool);
        if (ev->evict == SCHED_PREFIX_EVICT_DEMAND && ev->recompute_cost_us > 0) {
            /* why not kept in a colder pool: the demotion test's two sides */
            d->reload_cost_us = ev->swap_cost_us;
            d->recompute_cost_us = ev->recompute_cost_us;
            d->expected_reuse = ev->expected_reuse;
        }
        break;
    case SCHED_EV_CACHE_DEMOTE:
    case SCHED_EV_CACHE_RELOAD:
        d->blocks = ev->blocks;
        d->pool = sched_pool_name(ev->pool);
        if (ev->kind == SCHED_EV_CACHE_DEMOTE)
            d->to = sched_pool_name(ev->to_pool);
        else
            d->tokens = ev->tokens;
        if (ev->kind == SCHED_EV_CACHE_RELOAD)
            d->choice = ev->mode == SCHED_PREEMPT_SWAP ? "reload" : "recompute";
        if (ev->kind == SCHED_EV_CACHE_DEMOTE || ev->mode == SCHED_PREEMPT_SWAP) {
            d->xfer = (int64_t)ev->xfer;
            d->bytes = (int64_t)ev->bytes;
        }
        if (reason) { /* the completion record: realised next to predicted */
            d->predicted_us = ev->predicted_us;
            d->realised_us = ev->realised_us;
        } else {
            d->reload_cost_us = ev->swap_cost_us;
            d->recompute_cost_us = ev->recompute_cost_us;
            if (ev->kind == SCHED_EV_CACHE_DEMOTE) d->expected_reuse = ev->expected_reuse;
        }
        break;
    case SCHED_EV_RELEASE:
        d->blocks = ev->blocks;
        d->pool = sched_pool_name(ev->pool);
        break;
    default: break;
    }
}
