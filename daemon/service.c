/* SPDX-License-Identifier: MIT */
/*
 * The runner: sessions' requests → scheduler → one flattened engine batch per iteration →
 * token events, with KV swaps to the host/disk tiers over the loop's io_uring. See
 * service.h for the iteration; the comments here say why things are done the way they are.
 */
#include "daemon/service.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/declog.h"
#include "daemon/kvtier.h"
#include "daemon/metrics.h"
#include "kernels/engine.h"
#include "numa/rnuma.h"
#include "sched/sched.h"
#include "shm/wire.h"

/* ---- errors -------------------------------------------------------------------------- */

static _Thread_local char svc_err[512];
const char *svc_errmsg(void) { return svc_err; }
static int seterr(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int seterr(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(svc_err, sizeof svc_err, fmt, ap);
    va_end(ap);
    return err;
}

static void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logmsg(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ringlmd: %s\n", buf);
}

/* ---- the built-in policy ------------------------------------------------------------- */

/* Used when no --policy is given: one class, one tenant, token-budget scheduling with
 * automatic swap/recompute choice. Every uid maps to the default tenant. The queue is
 * bounded: past 4096 waiting requests new ones are rejected (queue_full) instead of
 * growing memory and latency without end. */
static const char builtin_policy[] =
    "# ringlmd built-in policy\n"
    "[scheduler]\n"
    "mode = token_budget\n"
    "token_budget = 256\n"
    "max_active_seqs = 64\n"
    "prefill_chunk = 128\n"
    "preemption = auto\n"
    "queue_max_requests = 4096\n";

/* llama2.c models stop when BOS is sampled (run.c); the stop token is not streamed. */
#define SVC_STOP_TOKEN 1
#define SVC_KVTIER_TAG (DLOOP_UD_SVC | (1ull << 62))
#define SVC_HASH_BUCKETS 4096
#define SVC_MAX_REQS_PER_SESSION 1024
#define SVC_STATS_INTERVAL_US 20000

/* ---- state --------------------------------------------------------------------------- */

typedef struct svc_sess svc_sess;

typedef struct svc_req {
    uint64_t id;              /* scheduler id (daemon-wide, never reused) */
    uint64_t client_id;       /* the client's id, unique in its session */
    svc_sess *sess;           /* NULL once the session is gone */
    struct svc_req *s_prev, *s_next;
    struct svc_req *h_next;
    int tenant, class_idx, series;
    char tenant_name[SCHED_NAME_MAX], class_name[SCHED_NAME_MAX];
    uint32_t n_prompt, max_new;
    uint32_t n_gen;           /* generated tokens, appended after the prompt in tokens[] */
    uint32_t n_pushed;        /* token events the client's ring accepted */
    int32_t *tokens;          /* prompt + generated: a recompute re-prefills these */
    eng_sampling samp;
    uint64_t rng;
    uint64_t arrival_us, deadline_us, first_token_us, last_token_us, cancel_us, finish_us;
    bool ended;               /* the scheduler is done with it (or never took it) */
    bool finish_pushed;
    bool blocked;             /* output blocked, reported to the scheduler */
    bool in_pending;
    uint64_t blocked_since_us;
    unsigned fin_reason, fin_cause;  /* RINGLM_WIRE_R_* */
    unsigned forced_reason, forced_cause; /* set before a daemon-side cancel */
} svc_req;

struct svc_sess {
    dsess *ds;
    uint32_t uid;
    int tenant;
    bool trusted;
    svc_req *reqs;
    int n_reqs;
};

struct svc {
    svc_config cfg;
    eng_model *model;
    eng *engine;
    const eng_model_config *mcfg;
    sched_policy *policy;
    sched *sched;
    declog *logs;
    metrics *mx;
    kvtier *tiers;
    dloop *loop;
    int numa_node;
    char policy_hash_hex[SCHED_HASH_HEX_LEN + 1];
    char policy_name[64];

    svc_req *hash[SVC_HASH_BUCKETS];
    uint64_t next_id;
    uint64_t live_reqs;
    /* requests with output to push or a finish to deliver (ids, looked up each time) */
    uint64_t *pending;
    size_t n_pending, cap_pending;

    /* batch scratch */
    int max_tokens, max_seqs, bt_stride;
    int32_t *b_tokens, *b_pos, *b_qs, *b_seqlen, *b_bt, *b_rows, *b_out;
    int64_t *b_slots;
    eng_sampling *b_samp;
    uint64_t *b_rng;
    svc_req **b_req;         /* per sampling row */
    sched_result *results;
    uint64_t *slot_sum[KVT_NTIERS]; /* --verify-swaps: checksum per tier slot */
    uint8_t *busy_dev, *busy_slot[KVT_NTIERS]; /* --verify-swaps: blocks in flight */
    uint64_t n_overlap_errors;
    bool trace_xfer;          /* RINGLMD_TRACE_XFER: one stderr line per transfer */
    bool mx_dirty;            /* metrics changed since the last forced publish */
    int max_series_seen;
    uint64_t series_q_last_us;

    /* drain */
    bool draining, drain_cancelled;
    uint64_t drain_start_us;

    /* stats */
    bool stats_dirty;
    uint64_t stats_last_us;
    uint64_t n_iterations, n_rejects, n_finished, n_swap_verify_errors, n_swap_verified;
    uint64_t n_engine_errors;
    uint64_t now_us;

    /* iteration log: a batch's line waits for the next iteration's start, which gives its
     * period (what one simulator step must cost) and the wakes its publish issued */
    struct svc_iter {
        bool pending, busy;
        uint64_t it, t_us, iter_us, exec_us, wakes_before;
        uint32_t transfers;
        sched_plan_work w;
    } itl;
};

/* ---- small helpers ------------------------------------------------------------------- */

static svc_req *req_find(svc *s, uint64_t id)
{
    for (svc_req *r = s->hash[id % SVC_HASH_BUCKETS]; r; r = r->h_next)
        if (r->id == id) return r;
    return NULL;
}

static void req_hash_del(svc *s, svc_req *r)
{
    svc_req **pp = &s->hash[r->id % SVC_HASH_BUCKETS];
    while (*pp && *pp != r) pp = &(*pp)->h_next;
    if (*pp) *pp = r->h_next;
}

static void sess_unlink(svc_req *r)
{
    svc_sess *ss = r->sess;
    if (!ss) return;
    if (r->s_prev) r->s_prev->s_next = r->s_next;
    else ss->reqs = r->s_next;
    if (r->s_next) r->s_next->s_prev = r->s_prev;
    r->s_prev = r->s_next = NULL;
    ss->n_reqs--;
    r->sess = NULL;
}

static void pending_add(svc *s, svc_req *r)
{
    if (r->in_pending) return;
    if (s->n_pending == s->cap_pending) {
        size_t nc = s->cap_pending ? s->cap_pending * 2 : 256;
        uint64_t *np = realloc(s->pending, nc * sizeof *np);
        if (!np) return; /* retried next time the request produces output */
        s->pending = np;
        s->cap_pending = nc;
    }
    s->pending[s->n_pending++] = r->id;
    r->in_pending = true;
}

/* One vocabulary (sched_end_code): the wire's codes are the scheduler's, number for number. */
#define SAME_CODE(x) _Static_assert((int)SCHED_END_##x == (int)RINGLM_WIRE_R_##x, "end code " #x)
SAME_CODE(NONE); SAME_CODE(LENGTH); SAME_CODE(STOP); SAME_CODE(CANCELLED); SAME_CODE(TIMEOUT);
SAME_CODE(REJECTED); SAME_CODE(ERROR); SAME_CODE(QUEUE_FULL); SAME_CODE(TENANT_QUOTA);
SAME_CODE(TOO_LONG); SAME_CODE(DEADLINE_INFEASIBLE); SAME_CODE(BAD_TOKEN); SAME_CODE(BAD_PARAMS);
SAME_CODE(DRAINING); SAME_CODE(OUTPUT_BACKPRESSURE); SAME_CODE(UNKNOWN_CLASS);
SAME_CODE(DUPLICATE_ID); SAME_CODE(INTERNAL); SAME_CODE(CLIENT_GONE);
_Static_assert((int)SCHED_END__MAX == (int)RINGLM_WIRE_R_MAX, "end codes");
#undef SAME_CODE
/* One tier numbering: the metrics' is the scheduler's pool; kvtier's counts from host. */
_Static_assert((int)METRICS_TIER_DEVICE == (int)SCHED_POOL_DEVICE &&
               (int)METRICS_TIER_HOST == (int)SCHED_POOL_HOST &&
               (int)METRICS_TIER_DISK == (int)SCHED_POOL_DISK, "metrics tiers are sched pools");
_Static_assert((int)KVT_HOST == (int)SCHED_POOL_HOST - 1 && (int)KVT_DISK == (int)SCHED_POOL_DISK - 1,
               "kvtier tiers are sched pools less the device");
/* Every class and tenant a policy can name fits the wire's name field, and back. */
_Static_assert(SCHED_NAME_MAX == RINGLM_WIRE_NAME_LEN, "policy names and wire names agree");

static const char *finish_name(unsigned reason)
{
    return reason && reason <= SCHED_END_ERROR ? sched_end_name(reason) : "error";
}

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ull; }
    return h;
}

/* ---- request end: request log, metrics, free ---------------------------------------- */

static void req_log_and_free(svc *s, svc_req *r)
{
    if (declog_has_requests(s->logs)) {
        declog_request lr = {
            .req = r->id,
            .arrival_us = (int64_t)r->arrival_us,
            .tenant = r->tenant_name,
            .class_name = r->class_name,
            .prompt_tokens = r->n_prompt,
            .max_tokens = r->max_new,
            .output_tokens = r->n_gen,
            .deadline_us = r->deadline_us ? (int64_t)r->deadline_us : DECLOG_NULL,
            .cancel_us = r->cancel_us ? (int64_t)r->cancel_us : DECLOG_NULL,
            .first_token_us = r->first_token_us ? (int64_t)r->first_token_us : DECLOG_NULL,
            .finish_us = (int64_t)(r->finish_us ? r->finish_us : s->now_us),
            .finish_reason = finish_name(r->fin_reason),
            .reject_reason = r->fin_reason == RINGLM_WIRE_R_REJECTED
                                 ? ringlm_wire_reason_name(r->fin_cause) : NULL,
        };
        declog_request_line(s->logs, &lr);
    }
    uint64_t fin = r->finish_us ? r->finish_us : s->now_us;
    if (r->series >= 0) {
        if (r->first_token_us) {
            metrics_observe(s->mx, r->series, METRICS_H_TTFT, r->first_token_us - r->arrival_us);
            if (r->n_gen > 1 && r->last_token_us > r->first_token_us)
                metrics_observe(s->mx, r->series, METRICS_H_TPOT,
                                (r->last_token_us - r->first_token_us) / (r->n_gen - 1));
        }
        if (r->fin_reason != RINGLM_WIRE_R_REJECTED)
            metrics_observe(s->mx, r->series, METRICS_H_E2E, fin - r->arrival_us);
        metrics_add_tokens(s->mx, r->series, r->fin_reason == RINGLM_WIRE_R_REJECTED ? 0 : r->n_prompt,
                           r->n_gen);
        metrics_count_finish(s->mx, r->series, finish_name(r->fin_reason));
    }
    if (r->fin_reason != RINGLM_WIRE_R_REJECTED) s->n_finished++;
    sess_unlink(r);
    req_hash_del(s, r);
    s->live_reqs--;
    free(r->tokens);
    free(r);
    s->stats_dirty = true;
}

/* Marks r ended with a finish reason (first one wins) and queues its FINISH. */
static void req_end(svc *s, svc_req *r, unsigned reason, unsigned cause)
{
    if (r->ended) return;
    r->ended = true;
    r->fin_reason = r->forced_reason ? r->forced_reason : reason;
    r->fin_cause = r->forced_reason ? r->forced_cause : cause;
    r->finish_us = s->now_us;
    pending_add(s, r);
}

/* Pushes r's unpublished tokens, then its FINISH once ended. Returns true when r was freed.
 * A full event ring blocks r's output: the scheduler stops scheduling it (defer
 * output_backpressure) and its tokens wait here, in tokens[], until the client reads. */
static bool req_flush(svc *s, svc_req *r)
{
    if (!r->sess) {
        if (r->ended) { req_log_and_free(s, r); return true; }
        return false;
    }
    dsess *ds = r->sess->ds;
    int rc = 0;
    while (r->n_pushed < r->n_gen) {
        rc = dsess_push_token(ds, r->client_id, r->tokens[r->n_prompt + r->n_pushed], r->n_pushed);
        if (rc < 0) break;
        r->n_pushed++;
    }
    if (rc == 0 && r->ended && !r->finish_pushed) {
        rc = dsess_push_finish(ds, r->client_id, r->fin_reason, r->fin_cause, r->n_gen);
        if (rc == 0) r->finish_pushed = true;
    }
    if (rc == -EAGAIN) {
        if (!r->blocked) {
            r->blocked = true;
            r->blocked_since_us = s->now_us;
            if (!r->ended) sched_set_output_blocked(s->sched, r->id, true, s->now_us);
            DTRACE_PROBE2(ringlmd, output_blocked, r->id, r->n_gen - r->n_pushed);
        }
        return false;
    }
    if (rc == -EPIPE) {
        /* The session is ending; on_close cancels and frees everything of it. */
        return false;
    }
    if (r->blocked) {
        r->blocked = false;
        if (!r->ended) sched_set_output_blocked(s->sched, r->id, false, s->now_us);
    }
    if (r->ended && r->finish_pushed) { req_log_and_free(s, r); return true; }
    return false;
}

/* Flushes every pending request; keeps those still waiting for ring space. */
static void flush_pending(svc *s)
{
    size_t keep = 0;
    for (size_t i = 0; i < s->n_pending; i++) {
        svc_req *r = req_find(s, s->pending[i]);
        if (!r) continue;
        r->in_pending = false;
        if (req_flush(s, r)) continue;
        bool more = r->n_pushed < r->n_gen || (r->ended && !r->finish_pushed) ||
                    (r->ended && !r->sess);
        if (more) {
            s->pending[keep++] = r->id;
            r->in_pending = true;
        }
    }
    s->n_pending = keep;
}

/* A daemon-side cancel with a wire reason the client will see. */
static void req_cancel(svc *s, svc_req *r, sched_cancel_reason why, unsigned reason,
                       unsigned cause)
{
    if (r->ended) return;
    r->forced_reason = reason;
    r->forced_cause = cause;
    if (!r->cancel_us) r->cancel_us = s->now_us;
    sched_cancel(s->sched, r->id, s->now_us, why); /* -ENOENT: not live there; ends here too */
    req_end(s, r, reason, cause);
}

/* ---- scheduler events → logs, metrics, probes ------------------------------------------ */

/* The events explain decisions; they end nothing.  Requests end from sched_cancel's return
 * (req_cancel), the plan's `ended` (svc_plan_ended) and the commit results
 * (svc_commit_ended), so the daemon serves the same with or without an event sink. */
static void on_sched_event(void *ctx, const sched_event *ev)
{
    svc *s = ctx;
    const char *reason = sched_event_reason_name(ev);
    DTRACE_PROBE3(ringlmd, decision, (int)ev->kind, ev->req, reason);
    if (s->logs && declog_has_decisions(s->logs)) declog_decision(s->logs, ev);
    svc_req *r = req_find(s, ev->req);
    int series = r ? r->series : metrics_series(s->mx, ev->tenant, ev->class_name);
    switch (ev->kind) {
    case SCHED_EV_REJECT:
        metrics_count_reject(s->mx, series, reason);
        break;
    case SCHED_EV_DEFER:
        metrics_count_defer(s->mx, series, reason);
        break;
    case SCHED_EV_SCHEDULE:
        if (ev->outcome == SCHED_OUTCOME_START)
            metrics_observe(s->mx, series, METRICS_H_QUEUE_WAIT, ev->wait_us);
        break;
    case SCHED_EV_PREEMPT:
        metrics_count_preempt(s->mx, series,
                              ev->mode == SCHED_PREEMPT_SWAP ? METRICS_MODE_SWAP : METRICS_MODE_RECOMPUTE,
                              reason);
        break;
    case SCHED_EV_CANCEL:
        metrics_count_cancel(s->mx, series);
        break;
    case SCHED_EV_TIMEOUT:
        metrics_count_timeout(s->mx, series);
        break;
    default:
        break;
    }
    s->stats_dirty = true;
}

/* Requests the scheduler ended in this plan (timeouts, backpressure cancels). */
static void svc_plan_ended(svc *s, const sched_plan *p)
{
    for (uint32_t i = 0; i < p->n_ended; i++) {
        const sched_ended *e = &p->ended[i];
        svc_req *r = req_find(s, e->req);
        if (!r) continue;
        if (e->kind == SCHED_EV_TIMEOUT) {
            req_end(s, r, RINGLM_WIRE_R_TIMEOUT, sched_timeout_cause(e->timeout));
        } else {
            if (!r->cancel_us) r->cancel_us = s->now_us;
            req_end(s, r, RINGLM_WIRE_R_CANCELLED, sched_cancel_cause(e->cancel));
        }
    }
}

/* Requests that finished in the last commit (its results carry how). */
static void svc_commit_ended(svc *s, const sched_result *res, int n)
{
    for (int i = 0; i < n; i++) {
        if (res[i].finished == SCHED_FINISH_NONE) continue;
        svc_req *r = req_find(s, res[i].req);
        if (r) req_end(s, r, res[i].finished == SCHED_FINISH_STOP ? RINGLM_WIRE_R_STOP
                                                                  : RINGLM_WIRE_R_LENGTH, 0);
    }
}

/* ---- KV transfers -------------------------------------------------------------------- */

static uint64_t block_sum(svc *s, int block)
{
    size_t bb = eng_kv_block_bytes(s->engine);
    void *p = eng_kv_block_ptr(s->engine, block);
    if (p) return fnv1a(p, bb);
    void *tmp = malloc(bb);
    uint64_t h = 0;
    if (tmp && eng_kv_read_block(s->engine, block, tmp) == 0) h = fnv1a(tmp, bb);
    free(tmp);
    return h;
}

typedef struct xfer_ctx {
    svc *s;
    int n;
    int32_t *dev;  /* for swap verification */
    int32_t *slot;
} xfer_ctx;

static void on_xfer_done(void *ctx, uint64_t cookie, int res, int dir, int tier, size_t bytes,
                         uint64_t elapsed_us)
{
    xfer_ctx *x = ctx;
    svc *s = x->s;
    if (s->busy_dev)
        for (int i = 0; i < x->n; i++) {
            if (x->dev[i] >= 0 && x->dev[i] < eng_kv_blocks(s->engine) && s->busy_dev[x->dev[i]])
                s->busy_dev[x->dev[i]]--;
            if (x->slot[i] >= 0 && x->slot[i] < kvtier_blocks(s->tiers, tier) &&
                s->busy_slot[tier][x->slot[i]])
                s->busy_slot[tier][x->slot[i]]--;
        }
    if (res == 0 && s->slot_sum[tier] && dir == KVT_IN) {
        /* Swap-in must bring back exactly the bytes that went out. */
        for (int i = 0; i < x->n; i++) {
            uint64_t h = block_sum(s, x->dev[i]);
            s->n_swap_verified++;
            if (h != s->slot_sum[tier][x->slot[i]]) {
                s->n_swap_verify_errors++;
                logmsg("swap verify: device block %d from %s slot %d differs (%016llx vs %016llx)",
                       x->dev[i], tier == KVT_HOST ? "host" : "disk", x->slot[i],
                       (unsigned long long)h, (unsigned long long)s->slot_sum[tier][x->slot[i]]);
            }
        }
    }
    if (res < 0)
        logmsg("KV transfer %llu (%s, %s tier) failed: %s", (unsigned long long)cookie,
               dir == KVT_OUT ? "out" : "in", tier == KVT_HOST ? "host" : "disk", strerror(-res));
    else
        metrics_observe_transfer(s->mx, tier == KVT_HOST ? METRICS_TIER_HOST : METRICS_TIER_DISK,
                                 dir == KVT_OUT ? METRICS_DIR_OUT : METRICS_DIR_IN, bytes,
                                 elapsed_us);
    DTRACE_PROBE4(ringlmd, transfer_done, cookie, dir, tier, res);
    if (s->trace_xfer) logmsg("xfer %llu done res %d", (unsigned long long)cookie, res);
    sched_transfer_done(s->sched, cookie, s->now_us, bytes, elapsed_us, res);
    free(x->dev);
    free(x->slot);
    free(x);
    s->stats_dirty = true;
}

static void start_transfer(svc *s, const sched_transfer *t)
{
    int tier = t->tier == SCHED_POOL_DISK ? KVT_DISK : KVT_HOST;
    int n = (int)t->n_blocks;
    xfer_ctx *x = calloc(1, sizeof *x);
    int32_t *dev = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int rc = -ENOMEM;
    if (!x || !dev || !slot || !s->tiers) {
        if (!s->tiers) rc = -ENOTSUP;
        goto fail;
    }
    const uint32_t *devs = t->dir == SCHED_XFER_OUT ? t->src : t->dst;
    const uint32_t *slots = t->dir == SCHED_XFER_OUT ? t->dst : t->src;
    for (int i = 0; i < n; i++) { dev[i] = (int32_t)devs[i]; slot[i] = (int32_t)slots[i]; }
    x->s = s; x->n = n; x->dev = dev; x->slot = slot;
    if (s->slot_sum[tier]) {
        int nslots = kvtier_blocks(s->tiers, tier), ndev = eng_kv_blocks(s->engine);
        for (int i = 0; i < n; i++) {
            if (slot[i] < 0 || slot[i] >= nslots || dev[i] < 0 || dev[i] >= ndev) continue;
            /* A block or slot in two transfers at once means the plan raced itself. */
            if (s->busy_dev[dev[i]] || s->busy_slot[tier][slot[i]]) {
                s->n_overlap_errors++;
                logmsg("verify: transfer %llu uses device block %d / %s slot %d already in flight",
                       (unsigned long long)t->id, dev[i], tier == KVT_HOST ? "host" : "disk", slot[i]);
            }
            s->busy_dev[dev[i]]++;
            s->busy_slot[tier][slot[i]]++;
            if (t->dir == SCHED_XFER_OUT) s->slot_sum[tier][slot[i]] = block_sum(s, dev[i]);
        }
    }
    DTRACE_PROBE4(ringlmd, transfer_start, t->id, (int)t->dir, tier, n);
    if (s->trace_xfer) {
        char b[1024]; int k = 0;
        for (int i = 0; i < n && k < 900; i++) k += snprintf(b + k, sizeof b - (size_t)k, " %d:%d", dev[i], slot[i]);
        logmsg("xfer %llu req %llu %s start dev:slot%s", (unsigned long long)t->id, (unsigned long long)t->req, t->dir == SCHED_XFER_OUT ? "out" : "in", b);
    }
    rc = kvtier_submit(s->tiers, t->dir == SCHED_XFER_OUT ? KVT_OUT : KVT_IN, tier, dev, slot, n,
                       t->id, on_xfer_done, x);
    if (rc == 0) return;
    logmsg("KV transfer %llu not started: %s", (unsigned long long)t->id, kvtier_errmsg());
fail:
    free(x); free(dev); free(slot);
    sched_transfer_done(s->sched, t->id, s->now_us, 0, 0, rc);
}

/* ---- the batch ----------------------------------------------------------------------- */

/* Builds and runs one flattened batch from the plan's entries; fills s->results.
 * Returns the number of results (entries executed) or -errno. */
static int run_batch(svc *s, const sched_plan *p, uint64_t *exec_us)
{
    int T = 0, S = 0, L = 0, nres = 0;
    int bs = eng_kv_block_size(s->engine);
    for (uint32_t i = 0; i < p->n_entries; i++) {
        const sched_entry *e = &p->entries[i];
        svc_req *r = req_find(s, e->req);
        uint32_t known = r ? r->n_prompt + r->n_gen : 0;
        if (!r || r->ended || e->n_tokens == 0 || e->start_pos + e->n_tokens > known ||
            (int)e->n_blocks > s->bt_stride ||
            (uint64_t)e->n_blocks * (uint64_t)bs < e->start_pos + e->n_tokens ||
            T + (int)e->n_tokens > s->max_tokens || S >= s->max_seqs) {
            if (r && !r->ended) {
                /* A plan the service cannot execute would be planned again for ever. */
                logmsg("plan entry for request %llu is not executable (pos %u + %u, known %u, "
                       "%u blocks); failing it", (unsigned long long)e->req, e->start_pos,
                       e->n_tokens, known, e->n_blocks);
                req_cancel(s, r, SCHED_CANCEL_SHUTDOWN, RINGLM_WIRE_R_ERROR, RINGLM_WIRE_R_INTERNAL);
            }
            continue;
        }
        s->b_qs[S] = T;
        for (uint32_t k = 0; k < e->n_tokens; k++) {
            uint32_t pos = e->start_pos + k;
            s->b_tokens[T] = r->tokens[pos];
            s->b_pos[T] = (int32_t)pos;
            s->b_slots[T] = (int64_t)e->blocks[pos / (uint32_t)bs] * bs + pos % (uint32_t)bs;
            T++;
        }
        s->b_seqlen[S] = (int32_t)(e->start_pos + e->n_tokens);
        if (s->busy_dev)
            for (uint32_t j = 0; j < e->n_blocks; j++)
                if (e->blocks[j] < (uint32_t)eng_kv_blocks(s->engine) && s->busy_dev[e->blocks[j]]) {
                    s->n_overlap_errors++;
                    logmsg("verify: request %llu computes on device block %u while it is in flight",
                           (unsigned long long)e->req, e->blocks[j]);
                }
        for (int j = 0; j < s->bt_stride; j++)
            s->b_bt[(size_t)S * s->bt_stride + j] = j < (int)e->n_blocks ? (int32_t)e->blocks[j] : 0;
        if (e->samples) {
            s->b_rows[L] = T - 1;
            s->b_samp[L] = r->samp;
            s->b_rng[L] = r->rng;
            s->b_req[L] = r;
            L++;
        }
        S++;
        s->results[nres++] = (sched_result){.req = e->req, .tokens = 0, .finished = SCHED_FINISH_NONE};
    }
    if (S == 0) return nres;
    s->b_qs[S] = T;
    eng_batch b = {.n_tokens = T, .tokens = s->b_tokens, .positions = s->b_pos,
                   .slot_mapping = s->b_slots, .n_seqs = S, .query_start = s->b_qs,
                   .seq_len = s->b_seqlen, .block_table = s->b_bt,
                   .block_table_stride = s->bt_stride, .n_logits = L, .logits_rows = s->b_rows};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = eng_execute_sample(s->engine, &b, s->b_samp, s->b_rng, s->b_out, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *exec_us = (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000ll + (t1.tv_nsec - t0.tv_nsec) / 1000);
    /* Tokens exist once the batch ran: stamp them after it, not at the iteration start. */
    s->now_us += *exec_us;
    if (rc < 0) {
        s->n_engine_errors++;
        logmsg("engine: %s (batch of %d tokens, %d sequences); failing its requests",
               eng_errmsg(), T, S);
        for (int i = 0; i < nres; i++) {
            svc_req *r = req_find(s, s->results[i].req);
            if (r) req_cancel(s, r, SCHED_CANCEL_SHUTDOWN, RINGLM_WIRE_R_ERROR, RINGLM_WIRE_R_INTERNAL);
        }
        return 0;
    }
    /* Sampled tokens, in the order of the sampling rows. */
    int li = 0;
    for (int i = 0; i < nres && li < L; i++) {
        svc_req *r = s->b_req[li];
        if (r->id != s->results[i].req) continue;
        r->rng = s->b_rng[li];
        int32_t tok = s->b_out[li];
        li++;
        s->results[i].tokens = 1;
        if (tok == SVC_STOP_TOKEN) {
            s->results[i].finished = SCHED_FINISH_STOP;
        } else if (r->n_gen >= r->max_new) {
            /* Never past the buffer, whatever the plan said: the request is complete. */
            s->results[i].tokens = 0;
            s->results[i].finished = SCHED_FINISH_LENGTH;
        } else {
            r->tokens[r->n_prompt + r->n_gen++] = tok;
            if (!r->first_token_us) r->first_token_us = s->now_us;
            r->last_token_us = s->now_us;
            if (r->n_gen >= r->max_new || r->n_prompt + r->n_gen >= (uint32_t)s->mcfg->seq_len + 1)
                s->results[i].finished = SCHED_FINISH_LENGTH;
            pending_add(s, r);
        }
    }
    return nres;
}

/* One full prefill batch and one full decode batch before the first client: the engine's
 * scratch buffers, the BLAS library's own state and the code are cold at start, and the
 * first request would pay for them (measured: the first 256-token chunk 8-12 ms against
 * ~6 ms in steady state). The KV slots written belong to no request; a request writes its
 * own before it reads them. A failure here is the first request's failure, not start-up's. */
static void warm_up(svc *s)
{
    int bs = eng_kv_block_size(s->engine), nblocks = eng_kv_blocks(s->engine);
    int n = s->max_tokens;
    if (n > s->mcfg->seq_len) n = s->mcfg->seq_len;
    if (n > nblocks * bs) n = nblocks * bs;
    if (n < 1 || s->max_seqs < 1) return;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int pass = 0; pass < 2; pass++) {
        int S = pass == 0 ? 1 : (s->max_seqs < nblocks ? s->max_seqs : nblocks);
        int T = pass == 0 ? n : S;
        if (T > s->max_tokens) T = S = s->max_tokens;
        for (int t = 0; t < T; t++) {
            s->b_tokens[t] = 1;
            s->b_pos[t] = pass == 0 ? t : 0;
            s->b_slots[t] = pass == 0 ? t : (int64_t)t * bs;
        }
        for (int q = 0; q < S; q++) {
            s->b_qs[q] = pass == 0 ? 0 : q;
            s->b_seqlen[q] = pass == 0 ? T : 1;
            for (int j = 0; j < s->bt_stride; j++)
                s->b_bt[(size_t)q * s->bt_stride + j] = pass == 0 ? (j < nblocks ? j : 0) : (j == 0 ? q : 0);
            s->b_rows[q] = pass == 0 ? T - 1 : q;
            s->b_samp[q] = (eng_sampling){.temperature = 0};
            s->b_rng[q] = 1;
        }
        s->b_qs[S] = T;
        eng_batch b = {.n_tokens = T, .tokens = s->b_tokens, .positions = s->b_pos,
                       .slot_mapping = s->b_slots, .n_seqs = S, .query_start = s->b_qs,
                       .seq_len = s->b_seqlen, .block_table = s->b_bt,
                       .block_table_stride = s->bt_stride, .n_logits = S, .logits_rows = s->b_rows};
        if (eng_execute_sample(s->engine, &b, s->b_samp, s->b_rng, s->b_out, NULL) < 0) {
            logmsg("warm-up batch (%d tokens, %d sequences): %s", T, S, eng_errmsg());
            return;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!s->cfg.quiet)
        logmsg("warm-up: %d-token prefill and a decode batch in %.1f ms", n,
               (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
}

/* ---- stats file ---------------------------------------------------------------------- */

static void write_stats(svc *s)
{
    if (!s->cfg.stats_file) return;
    sched_counts c;
    memset(&c, 0, sizeof c);
    sched_get_counts(s->sched, &c);
    char why[256] = "";
    int inv = sched_check_invariants(s->sched, why, sizeof why);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", s->cfg.stats_file);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "{\"t_us\":%llu,\"iterations\":%llu,\"sessions\":%d,\"live_requests\":%llu,"
               "\"waiting\":%u,\"running\":%u,\"swapped\":%u,\"in_transit\":%u,\"blocked\":%u,"
               "\"kv\":{",
            (unsigned long long)s->now_us, (unsigned long long)s->n_iterations,
            s->loop ? dloop_session_count(s->loop) : 0, (unsigned long long)s->live_reqs,
            c.waiting, c.running, c.swapped, c.in_transit, c.blocked);
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        fprintf(f, "%s\"%s\":{\"used\":%u,\"free\":%u,\"total\":%u}", p ? "," : "",
                sched_pool_name((sched_pool)p), c.kv_used[p], c.kv_free[p], c.kv_total[p]);
    fprintf(f, "},\"invariants\":\"");
    for (const char *q = inv == 0 ? "ok" : (why[0] ? why : "violated"); *q; q++)
        if (*q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) fputc(*q, f);
    fprintf(f, "\",\"transfers_inflight\":%d,\"kvtier_accounting_errors\":%u,"
               "\"swap_verified\":%llu,\"swap_verify_errors\":%llu,\"transfer_overlap_errors\":%llu,"
               "\"engine_errors\":%llu,"
               "\"finished\":%llu,\"rejects\":%llu,\"draining\":%s,\"steps\":%llu,"
               "\"policy\":\"%s\"}\n",
            s->tiers ? kvtier_inflight(s->tiers) : 0,
            s->tiers ? kvtier_accounting_errors(s->tiers) : 0,
            (unsigned long long)s->n_swap_verified, (unsigned long long)s->n_swap_verify_errors,
            (unsigned long long)s->n_overlap_errors,
            (unsigned long long)s->n_engine_errors, (unsigned long long)s->n_finished,
            (unsigned long long)s->n_rejects, s->draining ? "true" : "false",
            (unsigned long long)c.steps, s->policy_hash_hex);
    if (fclose(f) == 0) rename(tmp, s->cfg.stats_file);
    else unlink(tmp);
}

/* Per (tenant, class) queue depth, recounted from the live requests a few times a second
 * (a walk over the live set; not worth keeping incrementally). */
#define SVC_MAX_SERIES 512
static void update_series_queues(svc *s)
{
    static uint32_t waiting[SVC_MAX_SERIES], running[SVC_MAX_SERIES];
    int max_series = -1;
    memset(waiting, 0, sizeof waiting);
    memset(running, 0, sizeof running);
    for (size_t b = 0; b < SVC_HASH_BUCKETS; b++)
        for (svc_req *r = s->hash[b]; r; r = r->h_next) {
            if (r->ended || r->series < 0 || r->series >= SVC_MAX_SERIES) continue;
            sched_req_info ri;
            if (sched_get_request(s->sched, r->id, &ri) < 0) continue;
            if (ri.state == SCHED_REQ_WAITING) waiting[r->series]++;
            else running[r->series]++;
            if (r->series > max_series) max_series = r->series;
        }
    if (max_series > s->max_series_seen) s->max_series_seen = max_series;
    for (int i = 0; i <= s->max_series_seen && i < SVC_MAX_SERIES; i++)
        metrics_set_series_queue(s->mx, i, waiting[i], running[i]);
}

static void update_gauges(svc *s, uint64_t iter_us, uint32_t batch_tokens)
{
    if (s->now_us - s->series_q_last_us >= 100000 || s->now_us < s->series_q_last_us) {
        update_series_queues(s);
        s->series_q_last_us = s->now_us;
    }
    sched_counts c;
    memset(&c, 0, sizeof c);
    sched_get_counts(s->sched, &c);
    metrics_set_queue(s->mx, c.waiting, c.running + c.swapped + c.in_transit);
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        metrics_set_kv(s->mx, (enum metrics_tier)p, c.kv_used[p], c.kv_total[p]);
    if (batch_tokens || iter_us) metrics_observe_iteration(s->mx, iter_us, batch_tokens);
    uint64_t dd = 0, dr = 0;
    declog_dropped(s->logs, &dd, &dr);
    metrics_set_log_dropped(s->mx, dd, dr);
    metrics_publish(s->mx, s->now_us, 0);
}

/* ---- iteration log -------------------------------------------------------------------- */

/* Writes the pending iteration's line. next_start_us: the start of the iteration after it
 * (0: none, e.g. at shutdown); its period is known only if the loop went straight on. */
static void iter_log_emit(svc *s, uint64_t next_start_us)
{
    struct svc_iter *it = &s->itl;
    if (!it->pending) return;
    it->pending = false;
    char period[32] = "null";
    if (it->busy && next_start_us >= it->t_us && next_start_us)
        snprintf(period, sizeof period, "%llu", (unsigned long long)(next_start_us - it->t_us));
    uint64_t wakes = s->loop ? dloop_futex_wakes(s->loop) - it->wakes_before : 0;
    char line[512];
    int n = snprintf(line, sizeof line,
                     "{\"it\":%llu,\"t_us\":%llu,\"period_us\":%s,\"iter_us\":%llu,\"exec_us\":%llu,"
                     "\"prefill_tokens\":%llu,\"prefill_seqs\":%u,\"prefill_pairs\":%.0f,"
                     "\"decode_seqs\":%u,\"decode_context\":%.0f,\"context_tokens\":%llu,"
                     "\"transfers\":%u,\"wakes\":%llu}",
                     (unsigned long long)it->it, (unsigned long long)it->t_us, period,
                     (unsigned long long)it->iter_us, (unsigned long long)it->exec_us,
                     (unsigned long long)it->w.prefill_tokens, it->w.prefill_seqs, it->w.prefill_pairs,
                     it->w.decode_seqs, it->w.decode_context, (unsigned long long)it->w.context_tokens,
                     it->transfers, (unsigned long long)wakes);
    if (n > 0 && (size_t)n < sizeof line) declog_iteration_line(s->logs, line, (size_t)n);
}

/* ---- loop callbacks ------------------------------------------------------------------ */

static int on_connect(void *ctx, dsess *ds)
{
    svc *s = ctx;
    uint32_t uid = (uint32_t)dsess_uid(ds);
    int tenant = sched_policy_tenant_for_uid(s->policy, uid);
    if (tenant < 0) {
        logmsg("refusing uid %u: not mapped to a tenant and the policy has no default tenant", uid);
        return -EPERM;
    }
    svc_sess *ss = calloc(1, sizeof *ss);
    if (!ss) return -ENOMEM;
    ss->ds = ds;
    ss->uid = uid;
    ss->tenant = tenant;
    ss->trusted = sched_policy_uid_trusted(s->policy, uid);
    dsess_set_user(ds, ss);
    s->stats_dirty = true;
    return 0;
}

/* Answers a request the scheduler never saw: rejected with a wire cause. */
static void reject_now(svc *s, svc_req *r, unsigned cause, const char *why)
{
    s->n_rejects++;
    if (r->series >= 0) metrics_count_reject(s->mx, r->series, ringlm_wire_reason_name(cause));
    if (s->logs && declog_has_decisions(s->logs)) {
        char line[512];
        char esc[200];
        size_t k = 0;
        for (const char *q = why; *q && k + 2 < sizeof esc; q++)
            if (*q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) esc[k++] = *q;
        esc[k] = 0;
        int n = snprintf(line, sizeof line,
                         "{\"t_us\":%llu,\"ev\":\"reject\",\"req\":%llu,\"tenant\":\"%s\","
                         "\"class\":\"%s\",\"reason\":\"%s\",\"detail\":\"%s\",\"prompt_tokens\":%u,"
                         "\"max_tokens\":%u}",
                         (unsigned long long)s->now_us, (unsigned long long)r->id, r->tenant_name,
                         r->class_name, ringlm_wire_reason_name(cause), esc, r->n_prompt, r->max_new);
        if (n > 0 && (size_t)n < sizeof line) declog_decision_line(s->logs, line, (size_t)n);
    }
    DTRACE_PROBE3(ringlmd, decision, (int)SCHED_EV_REJECT, r->id, ringlm_wire_reason_name(cause));
    req_end(s, r, RINGLM_WIRE_R_REJECTED, cause);
}

static void on_request(void *ctx, dsess *ds, const struct ringlm_wire_request *hdr,
                       const int32_t *prompt, uint32_t n_prompt, const char *class_name,
                       const char *tenant_tag)
{
    svc *s = ctx;
    s->now_us = dloop_now_us(s->loop);
    svc_sess *ss = dsess_user(ds);
    if (!ss) {
        /* Every request gets its FINISH, even one that slipped past a refused session. */
        dsess_push_finish(ds, hdr->req_id, RINGLM_WIRE_R_REJECTED, RINGLM_WIRE_R_INTERNAL, 0);
        return;
    }
    svc_req *r = calloc(1, sizeof *r);
    if (!r) {
        dsess_push_finish(ds, hdr->req_id, RINGLM_WIRE_R_REJECTED, RINGLM_WIRE_R_INTERNAL, 0);
        return;
    }
    r->id = ++s->next_id;
    r->client_id = hdr->req_id;
    r->series = -1;
    r->n_prompt = n_prompt;
    r->max_new = hdr->max_new_tokens;
    r->arrival_us = s->now_us;
    r->samp = (eng_sampling){.temperature = hdr->temperature, .top_k = (int)hdr->top_k,
                             .top_p = hdr->top_p, .seed = hdr->seed};
    r->rng = eng_rng_init(hdr->seed);
    /* Link first, so every path below ends through req_end → the same flush. */
    r->sess = ss;
    r->s_next = ss->reqs;
    if (ss->reqs) ss->reqs->s_prev = r;
    ss->reqs = r;
    ss->n_reqs++;
    r->h_next = s->hash[r->id % SVC_HASH_BUCKETS];
    s->hash[r->id % SVC_HASH_BUCKETS] = r;
    s->live_reqs++;
    s->stats_dirty = true;

    /* Tenant: the uid's, unless a trusted uid (a gateway) names one. */
    int tenant = ss->tenant;
    bool bad_tenant = false;
    if (tenant_tag && tenant_tag[0] && ss->trusted) {
        int t = sched_policy_tenant_index(s->policy, tenant_tag);
        if (t >= 0) tenant = t;
        else bad_tenant = true;
    }
    r->tenant = tenant;
    const sched_tenant_cfg *tc = sched_policy_tenant(s->policy, tenant);
    snprintf(r->tenant_name, sizeof r->tenant_name, "%s", tc ? tc->name : "?");
    int ci = sched_policy_class_index(s->policy, class_name && class_name[0] ? class_name : NULL);
    r->class_idx = ci;
    const sched_class_cfg *cc = ci >= 0 ? sched_policy_class(s->policy, ci) : NULL;
    snprintf(r->class_name, sizeof r->class_name, "%s", cc ? cc->name : (class_name ? class_name : ""));
    r->series = metrics_series(s->mx, r->tenant_name, r->class_name);

    char why[200];
    int vocab = s->mcfg->vocab_size;
    if (s->draining) { reject_now(s, r, RINGLM_WIRE_R_DRAINING, "daemon is draining"); return; }
    int cause = ringlm_wire_check_request(hdr, why, sizeof why);
    if (cause) { reject_now(s, r, (unsigned)cause, why); return; }
    if (bad_tenant) {
        snprintf(why, sizeof why, "tenant tag \"%s\" is not in the policy", tenant_tag);
        reject_now(s, r, RINGLM_WIRE_R_BAD_PARAMS, why);
        return;
    }
    if (!cc) {
        snprintf(why, sizeof why, "class \"%s\" is not in the policy", class_name ? class_name : "");
        reject_now(s, r, RINGLM_WIRE_R_UNKNOWN_CLASS, why);
        return;
    }
    if (!isfinite(hdr->temperature) || hdr->temperature > 100.0f) {
        snprintf(why, sizeof why, "temperature %g out of range [0, 100]", (double)hdr->temperature);
        reject_now(s, r, RINGLM_WIRE_R_BAD_PARAMS, why);
        return;
    }
    /* The sequence's last token never needs a KV slot, so seq_len + 1 tokens fit. */
    uint64_t max_ctx = (uint64_t)s->mcfg->seq_len + 1;
    if (n_prompt > (uint32_t)s->mcfg->seq_len || (uint64_t)n_prompt + hdr->max_new_tokens > max_ctx) {
        snprintf(why, sizeof why, "prompt %u + max_new_tokens %u exceeds the context of %u tokens",
                 n_prompt, hdr->max_new_tokens, s->mcfg->seq_len);
        reject_now(s, r, RINGLM_WIRE_R_TOO_LONG, why);
        return;
    }
    for (uint32_t i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= vocab) {
            snprintf(why, sizeof why, "prompt token %u is %d, vocabulary has %d tokens", i,
                     prompt[i], vocab);
            reject_now(s, r, RINGLM_WIRE_R_BAD_TOKEN, why);
            return;
        }
    }
    for (svc_req *o = ss->reqs; o; o = o->s_next) {
        if (o != r && o->client_id == hdr->req_id) {
            snprintf(why, sizeof why, "request id %llu is already in flight in this session",
                     (unsigned long long)hdr->req_id);
            reject_now(s, r, RINGLM_WIRE_R_DUPLICATE_ID, why);
            return;
        }
    }
    if (ss->n_reqs > SVC_MAX_REQS_PER_SESSION) {
        reject_now(s, r, RINGLM_WIRE_R_QUEUE_FULL, "too many requests in flight in this session");
        return;
    }
    r->tokens = malloc(sizeof(int32_t) * ((size_t)n_prompt + hdr->max_new_tokens));
    if (!r->tokens) { reject_now(s, r, RINGLM_WIRE_R_INTERNAL, "out of memory"); return; }
    memcpy(r->tokens, prompt, sizeof(int32_t) * n_prompt);
    if (hdr->deadline_us) r->deadline_us = s->now_us + hdr->deadline_us;

    sched_request sr = {.id = r->id, .tenant = tenant, .class_idx = ci, .prompt_len = n_prompt,
                        .max_new_tokens = hdr->max_new_tokens, .deadline_us = r->deadline_us,
                        .arrival_us = s->now_us};
    sched_reject_reason rr = SCHED_REJECT_NONE;
    int rc = sched_submit(s->sched, &sr, s->now_us, &rr);
    if (rc < 0) {
        s->n_rejects++;
        req_end(s, r, RINGLM_WIRE_R_REJECTED, (unsigned)sched_reject_cause(rr));
    }
}

static void on_cancel(void *ctx, dsess *ds, uint64_t req_id)
{
    svc *s = ctx;
    s->now_us = dloop_now_us(s->loop);
    svc_sess *ss = dsess_user(ds);
    if (!ss) return;
    for (svc_req *r = ss->reqs; r; r = r->s_next) {
        if (r->client_id == req_id && !r->ended) {
            r->cancel_us = s->now_us;
            req_cancel(s, r, SCHED_CANCEL_CLIENT, RINGLM_WIRE_R_CANCELLED, 0);
            return;
        }
    }
}

static void on_close(void *ctx, dsess *ds, const char *reason)
{
    svc *s = ctx;
    s->now_us = dloop_now_us(s->loop);
    svc_sess *ss = dsess_user(ds);
    if (!ss) return;
    (void)reason;
    /* Cancel in the scheduler now: the next sched_step (this iteration) releases the
     * blocks in every tier and no further compute is spent on these sequences. */
    while (ss->reqs) {
        svc_req *r = ss->reqs;
        if (!r->ended) {
            r->cancel_us = s->now_us;
            req_cancel(s, r, SCHED_CANCEL_DISCONNECT, RINGLM_WIRE_R_CANCELLED, RINGLM_WIRE_R_CLIENT_GONE);
        }
        sess_unlink(r);
        if (r->ended) req_log_and_free(s, r);
    }
    dsess_set_user(ds, NULL);
    free(ss);
    s->stats_dirty = true;
}

static void on_cqe(void *ctx, const struct io_uring_cqe *cqe)
{
    svc *s = ctx;
    s->now_us = dloop_now_us(s->loop);
    if (s->tiers) kvtier_handle_cqe(s->tiers, cqe);
}

static void on_signal(void *ctx, int signo)
{
    svc *s = ctx;
    if (signo == SIGHUP) {
        logmsg("SIGHUP ignored (policy reload is not supported; restart to change the policy)");
        return;
    }
    if (s->draining) {
        if (signo == SIGINT) { logmsg("second SIGINT: stopping now"); dloop_stop(s->loop); }
        return;
    }
    s->draining = true;
    s->drain_start_us = dloop_now_us(s->loop);
    dloop_drain(s->loop);
    logmsg("%s: draining (no new requests; in-flight work has %llu ms)", strsignal(signo),
           (unsigned long long)s->cfg.drain_grace_ms);
    s->stats_dirty = true;
}

static int iterate(void *ctx, uint64_t now_us)
{
    svc *s = ctx;
    s->now_us = now_us;
    s->n_iterations++;
    DTRACE_PROBE2(ringlmd, iteration_start, s->n_iterations, now_us);
    bool itlog = s->logs && declog_has_iterations(s->logs);
    if (itlog) iter_log_emit(s, now_us);
    uint64_t wakes_before = itlog && s->loop ? dloop_futex_wakes(s->loop) : 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    /* Drain: after the grace period, cancel whatever is still running. */
    if (s->draining && !s->drain_cancelled &&
        now_us - s->drain_start_us >= s->cfg.drain_grace_ms * 1000) {
        s->drain_cancelled = true;
        for (size_t b = 0; b < SVC_HASH_BUCKETS; b++)
            for (svc_req *r = s->hash[b]; r; r = r->h_next)
                if (!r->ended) req_cancel(s, r, SCHED_CANCEL_SHUTDOWN, RINGLM_WIRE_R_CANCELLED,
                                          RINGLM_WIRE_R_DRAINING);
    }

    /* Output first: a client that read its ring since the last iteration unblocks here. */
    flush_pending(s);
    /* The daemon-side backpressure timer (the policy's own runs in the scheduler too). */
    uint64_t bp_us = s->cfg.backpressure_timeout_ms * 1000;
    uint64_t next_wake = 0;
    for (size_t i = 0; i < s->n_pending; i++) {
        svc_req *r = req_find(s, s->pending[i]);
        if (!r || !r->blocked || r->ended) continue;
        uint64_t dl = r->blocked_since_us + bp_us;
        if (now_us >= dl)
            req_cancel(s, r, SCHED_CANCEL_BACKPRESSURE, RINGLM_WIRE_R_CANCELLED,
                       RINGLM_WIRE_R_OUTPUT_BACKPRESSURE);
        else if (!next_wake || dl - now_us < next_wake)
            next_wake = dl - now_us;
        /* The bounded buffer: past its size the tokens would have nowhere to go. */
        if (!r->ended && r->n_gen - r->n_pushed > s->cfg.backpressure_buffer_tokens)
            req_cancel(s, r, SCHED_CANCEL_BACKPRESSURE, RINGLM_WIRE_R_CANCELLED,
                       RINGLM_WIRE_R_OUTPUT_BACKPRESSURE);
    }

    const sched_plan *p = sched_step(s->sched, now_us);
    int nres = 0;
    uint64_t exec_us = 0;
    uint32_t batch_tokens = 0;
    if (p) {
        svc_plan_ended(s, p);
        for (uint32_t i = 0; i < p->n_transfers; i++) start_transfer(s, &p->transfers[i]);
        if (p->n_transfers && s->tiers) kvtier_flush(s->tiers);
        if (p->n_entries) {
            nres = run_batch(s, p, &exec_us);
            batch_tokens = p->decode_tokens + p->prefill_tokens;
        }
        uint64_t now2 = now_us + exec_us;
        s->now_us = now2;  /* run_batch advanced it by exec_us already; same value */
        if (nres > 0 || p->n_entries)
        {
            sched_commit(s->sched, s->results, (size_t)(nres > 0 ? nres : 0), now2, exec_us);
            svc_commit_ended(s, s->results, nres);
        }
    }
    flush_pending(s);

    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t iter_us = (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000ll + (t1.tv_nsec - t0.tv_nsec) / 1000);
    update_gauges(s, p && p->n_entries ? iter_us : 0, batch_tokens);
    if (s->stats_dirty && (s->now_us - s->stats_last_us >= SVC_STATS_INTERVAL_US || s->draining)) {
        write_stats(s);
        s->stats_dirty = false;
        s->stats_last_us = s->now_us;
    }
    DTRACE_PROBE3(ringlmd, iteration_end, s->n_iterations, batch_tokens, iter_us);
    if (itlog && p && p->n_entries) {
        struct svc_iter *it = &s->itl;
        *it = (struct svc_iter){.pending = true, .it = s->n_iterations, .t_us = now_us,
                                .iter_us = iter_us, .exec_us = exec_us,
                                .wakes_before = wakes_before, .transfers = p->n_transfers};
        sched_plan_work_of(p, &it->w);
    }

    if (s->draining) {
        if (s->live_reqs == 0) {
            logmsg("drained: every request answered; stopping");
            write_stats(s);
            dloop_stop(s->loop);
            return 0;
        }
        /* Clients that never read their final events must not hold the daemon: one more
         * second after the cancels, then the sessions end with "shutdown". */
        if (now_us - s->drain_start_us >= s->cfg.drain_grace_ms * 1000 + 1000000) {
            logmsg("drain: %llu requests could not deliver their final event; stopping",
                   (unsigned long long)s->live_reqs);
            dloop_stop(s->loop);
            return 0;
        }
        dloop_wake_after_us(s->loop, 10000);
    }

    sched_counts c;
    memset(&c, 0, sizeof c);
    sched_get_counts(s->sched, &c);
    bool busy = p && (p->n_entries > 0 || p->n_releases > 0 || p->n_transfers > 0);
    /* Scrapers see the live state at most publish_interval old while busy; the first idle
     * iteration publishes the final state at once (the loop may sleep for long after). */
    if (busy || s->stats_dirty) s->mx_dirty = true;
    if (!busy && s->mx_dirty) {
        update_series_queues(s);
        metrics_publish(s->mx, s->now_us, 1);
        s->mx_dirty = false;
    }
    if (next_wake) dloop_wake_after_us(s->loop, next_wake);
    if (s->stats_dirty) dloop_wake_after_us(s->loop, SVC_STATS_INTERVAL_US);
    /* Queued or parked work that got no entry this step waits on time (aging, timeouts,
     * transfers); a short timer keeps it moving without spinning a core. */
    if (!busy && (c.waiting || c.running || c.swapped || c.in_transit))
        dloop_wake_after_us(s->loop, 2000);
    s->itl.busy = busy;
    return busy ? 1 : 0;
}

/* ---- create / run / destroy ---------------------------------------------------------- */

void svc_config_init(svc_config *c)
{
    memset(c, 0, sizeof *c);
    c->backend = "cpu";
    c->numa = "auto";
}

static char *read_file(const char *path, int *err)
{
    FILE *f = fopen(path, "r");
    if (!f) { *err = -errno; return NULL; }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) { fclose(f); *err = -ENOMEM; return NULL; }
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        if (cap >= (1u << 22)) { free(buf); fclose(f); *err = -EFBIG; return NULL; }
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) { free(buf); buf = NULL; continue; }
        buf = nb;
    }
    buf[n] = 0;
    fclose(f);
    return buf;
}

static pthread_t signal_thread;
static void forward_signal(int signo)
{
    int saved = errno;
    pthread_kill(signal_thread, signo);
    errno = saved;
}

int svc_create(const svc_config *cfg, svc **out)
{
    *out = NULL;
    int rc;
    if (!cfg->model) return seterr(-EINVAL, "--model is required (a path or synthetic:PRESET:SEED)");
    /* The loop reads SIGTERM/SIGINT/SIGHUP through a signalfd; every thread started from
     * here on (engine workers, metrics, log writer) inherits the block, so the default
     * action can never kill the daemon on a worker thread before the drain runs. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    /* Threads started before main (OpenBLAS starts its pool in a constructor) still accept
     * these signals: a handler there forwards them to this thread, where the loop's
     * signalfd picks them up, instead of the default action killing the process. */
    signal_thread = pthread_self();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    svc *s = calloc(1, sizeof *s);
    if (!s) return seterr(-ENOMEM, "out of memory");
    s->cfg = *cfg;
    s->trace_xfer = getenv("RINGLMD_TRACE_XFER") != NULL;
    s->max_series_seen = -1;
    if (!s->cfg.backpressure_timeout_ms) s->cfg.backpressure_timeout_ms = 5000;
    if (!s->cfg.backpressure_buffer_tokens) s->cfg.backpressure_buffer_tokens = 4096;
    if (!s->cfg.drain_grace_ms) s->cfg.drain_grace_ms = 10000;
    if (!s->cfg.kv_blocks) s->cfg.kv_blocks = 1024;
    if (!s->cfg.kv_block_size) s->cfg.kv_block_size = 16;
    if (!s->cfg.backend) s->cfg.backend = "cpu";

    /* Policy first: a bad policy is the most common operator error, report it before the
     * model load takes time. */
    char *text = NULL;
    if (cfg->policy_path) {
        int e = 0;
        text = read_file(cfg->policy_path, &e);
        if (!text) { rc = seterr(e, "policy %s: %s", cfg->policy_path, strerror(-e)); goto fail; }
        const char *b = strrchr(cfg->policy_path, '/');
        snprintf(s->policy_name, sizeof s->policy_name, "%s", b ? b + 1 : cfg->policy_path);
    } else {
        snprintf(s->policy_name, sizeof s->policy_name, "built-in");
    }
    sched_policy_error perr = {0};
    rc = sched_policy_parse(text ? text : builtin_policy, &s->policy, &perr);
    free(text);
    if (rc < 0) {
        rc = seterr(rc, "policy %s: line %d: %s", cfg->policy_path ? cfg->policy_path : "(built-in)",
                    perr.line, perr.reason[0] ? perr.reason : sched_last_error());
        goto fail;
    }
    snprintf(s->policy_hash_hex, sizeof s->policy_hash_hex, "%s", sched_policy_hash_hex(s->policy));

    rc = eng_model_load(cfg->model, &s->model);
    if (rc < 0) { rc = seterr(rc, "model %s: %s", cfg->model, eng_errmsg()); goto fail; }
    s->mcfg = eng_model_cfg(s->model);

    if (cfg->identity_only) {
        *out = s;
        return 0;
    }

    s->numa_node = rnuma_resolve(cfg->numa ? cfg->numa : "auto");
    if (s->numa_node < -1) { rc = seterr(s->numa_node, "--numa-node: %s", rnuma_errmsg()); goto fail; }

    const sched_policy_cfg *pc = sched_policy_get(s->policy);
    s->max_tokens = (int)pc->token_budget;
    if (cfg->max_batch_tokens > s->max_tokens) s->max_tokens = cfg->max_batch_tokens;
    if (cfg->max_batch_tokens && cfg->max_batch_tokens < (int)pc->token_budget)
        logmsg("--max-batch-tokens %d is below the policy's token_budget %u; using %u",
               cfg->max_batch_tokens, pc->token_budget, pc->token_budget);
    if (pc->mode == SCHED_MODE_STATIC) s->max_tokens += (int)pc->static_batch_size * 2;
    s->max_seqs = cfg->max_seqs ? cfg->max_seqs : (int)pc->max_active_seqs;
    if (s->max_seqs < (int)pc->max_active_seqs) s->max_seqs = (int)pc->max_active_seqs;
    if (s->max_seqs > s->max_tokens) s->max_seqs = s->max_tokens;

    eng_options eo = {.backend = s->cfg.backend, .n_threads = cfg->threads > 0 ? cfg->threads : 1,
                      .numa_node = s->numa_node, .kv_blocks = s->cfg.kv_blocks,
                      .kv_block_size = s->cfg.kv_block_size, .max_batch_tokens = s->max_tokens,
                      .max_seqs = s->max_seqs};
    rc = eng_create(s->model, &eo, &s->engine);
    if (rc < 0) { rc = seterr(rc, "engine (%s): %s", s->cfg.backend, eng_errmsg()); goto fail; }

    int bs = eng_kv_block_size(s->engine);
    s->bt_stride = (s->mcfg->seq_len + 1 + bs - 1) / bs;
    size_t T = (size_t)s->max_tokens, S = (size_t)s->max_seqs;
    s->b_tokens = calloc(T, sizeof(int32_t));
    s->b_pos = calloc(T, sizeof(int32_t));
    s->b_slots = calloc(T, sizeof(int64_t));
    s->b_qs = calloc(S + 1, sizeof(int32_t));
    s->b_seqlen = calloc(S, sizeof(int32_t));
    s->b_bt = calloc(S * (size_t)s->bt_stride, sizeof(int32_t));
    s->b_rows = calloc(S, sizeof(int32_t));
    s->b_out = calloc(S, sizeof(int32_t));
    s->b_samp = calloc(S, sizeof(eng_sampling));
    s->b_rng = calloc(S, sizeof(uint64_t));
    s->b_req = calloc(S, sizeof(svc_req *));
    s->results = calloc(S, sizeof(sched_result));
    if (!s->b_tokens || !s->b_pos || !s->b_slots || !s->b_qs || !s->b_seqlen || !s->b_bt ||
        !s->b_rows || !s->b_out || !s->b_samp || !s->b_rng || !s->b_req || !s->results) {
        rc = seterr(-ENOMEM, "batch buffers: out of memory");
        goto fail;
    }

    warm_up(s);

    if (s->cfg.host_kv_blocks < 0) s->cfg.host_kv_blocks = 0;
    sched_config sc = {
        .kv_blocks_device = (uint32_t)eng_kv_blocks(s->engine),
        .kv_blocks_host = (uint32_t)s->cfg.host_kv_blocks,
        .kv_blocks_disk = cfg->disk_kv_path ? (uint32_t)cfg->disk_kv_blocks : 0,
        .block_size = (uint32_t)bs,
        .kv_bytes_per_token = eng_kv_bytes_per_token(s->engine),
        .max_context = (uint32_t)s->mcfg->seq_len + 1,
        /* Rough start values; measured step times correct them from the first iteration. */
        .step_base_us = 100,
        .prefill_us_per_token = 2.0 + 0.00005 * (double)s->mcfg->dim * s->mcfg->n_layers,
        .decode_us_per_seq = 5,
        .context_us_per_token = 0.01,
        .host = {.out_bytes_per_s = 4e9, .in_bytes_per_s = 4e9, .latency_us = 20},
        .disk = {.out_bytes_per_s = 1e9, .in_bytes_per_s = 1e9, .latency_us = 100},
    };
    rc = sched_create(s->policy, &sc, on_sched_event, s, 1, &s->sched);
    if (rc < 0) { rc = seterr(rc, "scheduler: %s", sched_last_error()); goto fail; }

    declog_config dc = {.decision_path = cfg->decision_log, .request_path = cfg->request_log,
                        .iteration_path = cfg->iteration_log};
    rc = declog_create(&dc, &s->logs);
    if (rc < 0) { rc = seterr(rc, "logs: %s", declog_errmsg()); goto fail; }

    metrics_config mc = {.listen = cfg->metrics_listen, .version = RINGLM_VERSION,
                         .policy_hash = s->policy_hash_hex, .policy_name = s->policy_name,
                         .model_hash = eng_model_hash(s->model), .model_name = cfg->model,
                         .backend = eng_backend_name(s->engine)};
    rc = metrics_create(&mc, &s->mx);
    if (rc < 0) { rc = seterr(rc, "metrics %s: %s", cfg->metrics_listen ? cfg->metrics_listen : "",
                              metrics_errmsg()); goto fail; }
    *out = s;
    return 0;
fail:
    svc_destroy(s);
    return rc;
}

const char *svc_policy_text(const svc *s) { return sched_policy_canonical(s->policy); }
const char *svc_policy_hash_hex(const svc *s) { return s->policy_hash_hex; }
uint64_t svc_policy_hash(const svc *s) { return sched_policy_hash(s->policy); }
const char *svc_model_hash(const svc *s) { return eng_model_hash(s->model); }

static void tier_log(void *ctx, const char *msg) { (void)ctx; logmsg("kv tiers: %s", msg); }

int svc_run(svc *s, const dloop_config *lc)
{
    static const dsvc_ops ops = {
        .on_connect = on_connect, .on_request = on_request, .on_cancel = on_cancel,
        .on_close = on_close, .iterate = iterate, .on_cqe = on_cqe, .on_signal = on_signal,
    };
    if (!s->engine) return seterr(-EINVAL, "service created with identity_only cannot run");
    dloop_config c = *lc;
    if (c.numa_node < 0) c.numa_node = s->numa_node;
    int rc = dloop_create(&c, &ops, s, &s->loop);
    if (rc < 0) return seterr(rc, "event loop on %s: %s", lc->socket_path, dloop_errmsg());
    dloop_set_policy_hash(s->loop, sched_policy_hash(s->policy));

    /* The loop thread is the only one that touches the engine's batch metadata, the
     * scheduler and the sessions: keep it on the node that holds their memory. */
    if (s->numa_node >= 0 && rnuma_pin_self(s->numa_node) < 0)
        logmsg("pinning the loop thread to node %d failed: %s", s->numa_node, rnuma_errmsg());
    char nd[160];
    rnuma_describe(s->numa_node, nd, sizeof nd);

    if (s->cfg.host_kv_blocks > 0 || s->cfg.disk_kv_path) {
        size_t pool_len = 0;
        void *base = eng_kv_pool_base(s->engine, &pool_len);
        kvtier_config kc = {.block_bytes = eng_kv_block_bytes(s->engine),
                            .pool_blocks = eng_kv_blocks(s->engine), .pool_base = base,
                            .engine = s->engine, .host_blocks = s->cfg.host_kv_blocks,
                            .disk_path = s->cfg.disk_kv_path,
                            .disk_blocks = s->cfg.disk_kv_path ? s->cfg.disk_kv_blocks : 0,
                            .numa_node = s->numa_node, .ring = dloop_ring(s->loop),
                            .ud_tag = SVC_KVTIER_TAG, .register_buffers = true,
                            .log = tier_log};
        rc = kvtier_create(&kc, &s->tiers);
        if (rc < 0) {
            rc = seterr(rc, "KV tiers: %s", kvtier_errmsg());
            goto out;
        }
        if (s->cfg.verify_swaps) {
            s->busy_dev = calloc((size_t)eng_kv_blocks(s->engine), 1);
            for (int t = 0; t < KVT_NTIERS; t++)
                if (kvtier_blocks(s->tiers, t) > 0) {
                    s->slot_sum[t] = calloc((size_t)kvtier_blocks(s->tiers, t), sizeof(uint64_t));
                    s->busy_slot[t] = calloc((size_t)kvtier_blocks(s->tiers, t), 1);
                }
        }
    }
    if (!s->cfg.quiet) {
        logmsg("model %s (%s), dim %d, %d layers, vocab %d, context %d", s->cfg.model,
               eng_model_hash(s->model), s->mcfg->dim, s->mcfg->n_layers, s->mcfg->vocab_size,
               s->mcfg->seq_len);
        logmsg("engine %s, %d threads, KV %d blocks × %d tokens (%zu bytes/block)",
               eng_backend_name(s->engine), s->cfg.threads > 0 ? s->cfg.threads : 1,
               eng_kv_blocks(s->engine), eng_kv_block_size(s->engine), eng_kv_block_bytes(s->engine));
        if (s->tiers) logmsg("%s", kvtier_describe(s->tiers));
        if (s->cfg.tokenizer) logmsg("tokenizer %s (clients tokenize; named here for the logs)",
                                     s->cfg.tokenizer);
        logmsg("policy %s (%s); %s", s->policy_name, s->policy_hash_hex, nd);
        if (s->cfg.metrics_listen) logmsg("metrics on port %d", metrics_port(s->mx));
        logmsg("listening on %s (doorbell %s)", lc->socket_path, dloop_doorbell_mode(s->loop));
    }
    s->stats_dirty = true;
    write_stats(s);
    rc = dloop_run(s->loop);
    if (rc < 0) seterr(rc, "event loop: %s", dloop_errmsg());
    /* Sessions are gone (on_close ran for each); finish the bookkeeping. */
    s->now_us = dloop_now_us(s->loop);
    iter_log_emit(s, 0);
    flush_pending(s);
    write_stats(s);
    metrics_publish(s->mx, s->now_us, 1);
out:
    if (s->tiers) { kvtier_destroy(s->tiers); s->tiers = NULL; }
    dloop_destroy(s->loop);
    s->loop = NULL;
    return rc;
}

void svc_destroy(svc *s)
{
    if (!s) return;
    for (size_t b = 0; b < SVC_HASH_BUCKETS; b++) {
        svc_req *r = s->hash[b];
        while (r) {
            svc_req *n = r->h_next;
            free(r->tokens);
            free(r);
            r = n;
        }
    }
    if (s->logs) declog_destroy(s->logs);
    if (s->mx) metrics_destroy(s->mx);
    if (s->sched) sched_destroy(s->sched);
    if (s->engine) eng_destroy(s->engine);
    if (s->model) eng_model_free(s->model);
    if (s->policy) sched_policy_free(s->policy);
    for (int t = 0; t < KVT_NTIERS; t++) { free(s->slot_sum[t]); free(s->busy_slot[t]); }
    free(s->busy_dev);
    free(s->pending);
    free(s->b_tokens); free(s->b_pos); free(s->b_slots); free(s->b_qs); free(s->b_seqlen);
    free(s->b_bt); free(s->b_rows); free(s->b_out); free(s->b_samp); free(s->b_rng);
    free(s->b_req); free(s->results);
    free(s);
}
