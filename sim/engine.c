/* ringlm — simulator discrete-event core. SPDX-License-Identifier: MIT
 *
 * One loop, the daemon's iteration (DESIGN.md §2) with the engine replaced by the service
 * model: deliver what happened up to `now` (transfer completions, client cancels, arrivals
 * and retries) → sched_step(now) → charge the planned batch's step time → sched_commit at
 * now + step. When nothing runs, time jumps straight to the next event, so idle gaps cost
 * nothing. The scheduler is the real sched/ library; nothing here decides policy. */
#include "formats/decision.h"
#include "sim/engine.h"
#include "sim/err.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void sim_options_defaults(sim_options *o)
{
    memset(o, 0, sizeof *o);
    o->max_context = 32768;
    o->retry = SIM_RETRY_NONE;
    o->retry_backoff_us = 100000;
    o->retry_max = 4;
    o->sample_us = 1000000;
    o->idle_poll_us = 1000;
    o->stall_stop_us = 600LL * 1000000;
    o->step_scale = 1;
    o->seed = 1;
    o->prefix_cache = true;
    o->recorded_costs = true;
}

/* ---- a small binary min-heap of timed events ------------------------------------------ */

typedef struct tev {
    int64_t t;
    uint64_t seq, a, b, c;
} tev;
typedef struct theap {
    tev *v;
    size_t n, cap;
    uint64_t seq;
} theap;

static bool tev_less(const tev *x, const tev *y)
{
    return x->t != y->t ? x->t < y->t : x->seq < y->seq;
}

static int theap_push(theap *h, int64_t t, uint64_t a, uint64_t b, uint64_t c)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 256;
        tev *v = realloc(h->v, cap * sizeof *v);
        if (!v) return -ENOMEM;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    h->v[i] = (tev){t, h->seq++, a, b, c};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tev_less(&h->v[i], &h->v[p])) break;
        tev tmp = h->v[i];
        h->v[i] = h->v[p];
        h->v[p] = tmp;
        i = p;
    }
    return 0;
}

static tev theap_pop(theap *h)
{
    tev top = h->v[0];
    h->v[0] = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && tev_less(&h->v[l], &h->v[m])) m = l;
        if (r < h->n && tev_less(&h->v[r], &h->v[m])) m = r;
        if (m == i) break;
        tev tmp = h->v[i];
        h->v[i] = h->v[m];
        h->v[m] = tmp;
        i = m;
    }
    return top;
}

static int64_t theap_next(const theap *h)
{
    return h->n ? h->v[0].t : INT64_MAX;
}

/* ---- state -------------------------------------------------------------------------------- */

typedef struct eng {
    sim_run *run;
    const sim_trace *t;
    const sim_options *o;
    sched *s;
    size_t next_arrival;
    uint32_t *cancel_order; /* trace indices with a cancel time, by cancel time */
    size_t n_cancels, next_cancel;
    theap retries;                           /* t, trace index, attempt number */
    theap xfers;                             /* t, transfer id, bytes, duration */
    int64_t link_free[SCHED_POOL__COUNT][2]; /* [sched_pool][sched_xfer_dir] */
    size_t live;
    sched_result *results;
    size_t results_cap;
    int64_t next_sample;
    uint64_t int_steps, int_tokens;
    int64_t last_progress_any;
    int32_t *tok; /* prompt tokens standing for a request's block hashes */
    size_t tok_cap;
    uint32_t *costs; /* trace indices with a recorded cost model, by its time */
    size_t n_costs, next_cost;
    const sched_cost_state *cost; /* the record in force (NULL: none) */
    /* n > 1 samples (sim_req.sample_of), as ringlmd runs them: a first sample's others
     * (fol_head[first], chained by fol_next; UINT32_MAX ends) arrive with it but wait for
     * its first token, then continue from its last prompt row (its first token's row) on the
     * prompt's cached blocks; forks: the first samples whose first token the step made,
     * their others submitted after the commit */
    uint32_t *fol_head, *fol_next;
    uint8_t *is_follower;
    struct fork_ev {
        uint32_t first;
        uint8_t ended, outcome, reason; /* ended: before its first token, as outcome */
        int64_t t;
    } * forks;
    size_t n_forks, cap_forks;
    char line[2048];
} eng;

/* The decision log: the scheduler's event as a record, written by the one writer. */
static void sink(void *ctx, const sched_event *ev)
{
    eng *e = ctx;
    fmt_decision rec;
    sched_event_record(ev, &rec);
    int n = fmt_decision_format(&rec, e->line, sizeof e->line - 1);
    if (n < 0) return; /* longer than any line the scheduler makes */
    e->line[n] = '\n';
    fwrite(e->line, 1, (size_t)n + 1, e->o->decision_log);
}

static void warn(sim_run *r, const char *msg)
{
    size_t l = strlen(r->warnings);
    if (l + strlen(msg) + 2 < sizeof r->warnings)
        snprintf(r->warnings + l, sizeof r->warnings - l, "%s%s", l ? "\n" : "", msg);
}

static int new_rec(eng *e, uint32_t req, uint32_t attempt, int64_t now, uint32_t *idx)
{
    sim_run *r = e->run;
    if (r->n_recs == r->cap_recs) {
        size_t cap = r->cap_recs ? r->cap_recs * 2 : 1024;
        sim_rec *p = realloc(r->recs, cap * sizeof *p);
        if (!p) return -ENOMEM;
        r->recs = p;
        r->cap_recs = cap;
    }
    sim_rec *x = &r->recs[r->n_recs];
    memset(x, 0, sizeof *x);
    x->req = req;
    x->attempt = attempt;
    x->submit_us = now;
    x->first_sched_us = x->first_token_us = x->end_us = x->cancel_us = x->release_us = -1;
    x->last_progress_us = now;
    x->last_token_us = -1;
    *idx = (uint32_t)r->n_recs++;
    r->final_rec[req] = *idx;
    return 0;
}

/* The request ended without finishing; a client may try again. */
static int maybe_retry(eng *e, sim_rec *x, int64_t now)
{
    const sim_options *o = e->o;
    if (o->retry == SIM_RETRY_NONE || x->attempt >= o->retry_max) return 0;
    const sim_req *q = &e->t->reqs[x->req];
    if (q->cancel_us != SIM_NO_TIME && q->cancel_us <= now) return 0;
    /* "immediate" still costs a client round trip; 1 ms keeps a retry from landing in the
     * very iteration that refused it. Backoff doubles per attempt, without jitter, so runs
     * stay reproducible. */
    int64_t delay =
        o->retry == SIM_RETRY_IMMEDIATE ? 1000 : o->retry_backoff_us << (x->attempt - 1);
    return theap_push(&e->retries, now + delay, x->req, x->attempt + 1, 0);
}

/* A first sample forked (its first token came) or ended before: its others follow after
 * the step (fork_pending). 0 or -ENOMEM. */
static int fork_note(eng *e, uint32_t first, bool ended, int outcome, int reason, int64_t t)
{
    if (e->n_forks == e->cap_forks) {
        size_t cap = e->cap_forks ? e->cap_forks * 2 : 64;
        struct fork_ev *p = realloc(e->forks, cap * sizeof *p);
        if (!p) return -ENOMEM;
        e->forks = p;
        e->cap_forks = cap;
    }
    e->forks[e->n_forks++] = (struct fork_ev){first, ended, (uint8_t)outcome, (uint8_t)reason, t};
    return 0;
}

static void end_rec(eng *e, sim_rec *x, int outcome, int reason, int64_t now)
{
    if (!x->live) return;
    x->live = 0;
    e->live--;
    x->outcome = (uint8_t)outcome;
    x->reason = (uint8_t)reason;
    x->end_us = now;
    /* a first sample that ends before its first token ends its others (out of memory: they
     * stay unsubmitted, reported as never served) */
    if (e->fol_head && e->fol_head[x->req] != UINT32_MAX && x->first_token_us < 0)
        (void)fork_note(e, x->req, true, outcome, reason, now);
    if (now - x->last_progress_us > x->max_starve_us) x->max_starve_us = now - x->last_progress_us;
}

/* Room for n prompt tokens in e->tok. */
static int tok_room(eng *e, uint32_t n)
{
    if (n <= e->tok_cap) return 0;
    int32_t *p = realloc(e->tok, (size_t)n * sizeof *p);
    if (!p) return sim_err_setc(-ENOMEM, "out of memory for a %u-token prompt", n);
    e->tok = p;
    e->tok_cap = n;
    return 0;
}

static void end_rec(eng *e, sim_rec *x, int outcome, int reason, int64_t now);

/* The others of first sample `first` (trace index), forked when its first token came at
 * `now`: each starts with that token (its own, drawn from the same row), and is submitted
 * as ringlmd submits it — a sample of an admitted group (no queue checks), its prompt the
 * prompt and that token, the prompt's blocks shared through the cache. One whose client
 * left before it is cancelled; one whose answer is that token ends. */
static int fork_samples(eng *e, uint32_t first, int64_t now)
{
    const sim_req *f = &e->t->reqs[first];
    for (uint32_t req = e->fol_head[first]; req != UINT32_MAX; req = e->fol_next[req]) {
        const sim_req *q = &e->t->reqs[req];
        uint32_t idx;
        int rc = new_rec(e, req, 1, q->arrival_us, &idx);
        if (rc) return rc;
        sim_rec *x = &e->run->recs[idx];
        x->seen_us = now;
        x->live = 1;
        e->live++;
        x->first_token_us = x->last_token_us = now;
        x->generated = 1;
        if (q->cancel_us != SIM_NO_TIME && q->cancel_us <= now) {
            x->cancel_us = now;
            end_rec(e, x, SIM_OUT_CANCELLED, SCHED_CANCEL_DISCONNECT, now);
            continue;
        }
        if (q->output_tokens <= 1 || q->max_tokens <= 1) {
            end_rec(e, x, SIM_OUT_FINISHED,
                    q->max_tokens <= 1 ? SCHED_FINISH_LENGTH : SCHED_FINISH_STOP, now);
            continue;
        }
        sched_request sr = {
            .id = (uint64_t)idx + 1,
            .tenant = e->run->tenant_map[q->tenant],
            .tenant_name = e->t->tenants[q->tenant],
            .class_idx = e->run->class_map[q->klass],
            .class_name = e->t->classes[q->klass],
            .prompt_len = q->prompt_tokens + 1,
            .max_new_tokens = q->max_tokens - 1,
            .deadline_us = q->deadline_us == SIM_NO_TIME
                               ? 0
                               : (uint64_t)(q->deadline_us > 0 ? q->deadline_us : 1),
            .arrival_us = (uint64_t)q->arrival_us,
            .sample = true,
            /* its first sample's partial last prompt block: shared copy-on-write */
            .sample_of = (uint64_t)e->run->final_rec[first] + 1,
        };
        if (e->o->prefix_cache && sr.tenant >= 0) {
            /* the first sample's prompt tokens (its stand-ins: the same uniq), then the token */
            if ((rc = tok_room(e, q->prompt_tokens + 1))) return rc;
            sim_req_tokens(e->t, f, first, e->tok);
            e->tok[q->prompt_tokens] = sim_req_token(e->t, f, first, f->prompt_tokens);
            sr.tokens = e->tok;
            sr.cache_salt = sched_policy_cache_salt(e->o->policy, sr.tenant);
        }
        sched_reject_reason why = SCHED_REJECT_NONE;
        if (sched_submit(e->s, &sr, (uint64_t)now, &why) < 0)
            end_rec(e, x, SIM_OUT_REJECTED, why, now);
    }
    return 0;
}

/* The forks and ends the last steps noted (end_rec, the results), in order. */
static int samples_end_with(eng *e, uint32_t first, int outcome, int reason, int64_t now);
static int fork_pending(eng *e)
{
    for (size_t i = 0; i < e->n_forks; i++) {
        struct fork_ev f = e->forks[i];
        int rc = f.ended ? samples_end_with(e, f.first, f.outcome, f.reason, f.t)
                         : fork_samples(e, f.first, f.t);
        if (rc < 0) return rc;
    }
    e->n_forks = 0;
    return 0;
}

/* A first sample ended before its first token: its others end as it did (ringlmd ends
 * them with it), counted at the same time. */
static int samples_end_with(eng *e, uint32_t first, int outcome, int reason, int64_t now)
{
    for (uint32_t req = e->fol_head[first]; req != UINT32_MAX; req = e->fol_next[req]) {
        if (e->run->final_rec[req] != UINT32_MAX) continue; /* already ended */
        uint32_t idx;
        int rc = new_rec(e, req, 1, e->t->reqs[req].arrival_us, &idx);
        if (rc) return rc;
        sim_rec *x = &e->run->recs[idx];
        x->seen_us = now;
        x->live = 1;
        e->live++;
        end_rec(e, x, outcome, reason, now);
    }
    return 0;
}

/* A request that reached the client side at `at` is handed to the scheduler at `now` (the
 * iteration boundary where the daemon would drain its ring): arrival_us = at, now_us = now. */
static int submit(eng *e, uint32_t req, uint32_t attempt, int64_t at, int64_t now)
{
    const sim_req *q = &e->t->reqs[req];
    uint32_t idx;
    int rc = new_rec(e, req, attempt, at, &idx);
    if (rc) return rc;
    sched_request sr = {
        .id = (uint64_t)idx + 1,
        .tenant = e->run->tenant_map[q->tenant],
        .tenant_name = e->t->tenants[q->tenant],
        .class_idx = e->run->class_map[q->klass],
        .class_name = e->t->classes[q->klass],
        .prompt_len = q->prompt_tokens,
        .max_new_tokens = q->max_tokens,
        .deadline_us =
            q->deadline_us == SIM_NO_TIME ? 0 : (uint64_t)(q->deadline_us > 0 ? q->deadline_us : 1),
        .arrival_us = (uint64_t)at,
    };
    /* a first sample of n fills the cache its others read, hashes recorded or not */
    bool first_of_n = e->fol_head && e->fol_head[req] != UINT32_MAX;
    /* ... and is admitted when the blocks of all n are there together */
    sr.n_samples = 1;
    if (first_of_n)
        for (uint32_t k = e->fol_head[req]; k != UINT32_MAX; k = e->fol_next[k]) sr.n_samples++;
    if (e->o->prefix_cache && (q->n_hash || q->n_ahash || first_of_n) && sr.tenant >= 0) {
        if ((rc = tok_room(e, q->prompt_tokens))) return rc;
        sim_req_tokens(e->t, q, req, e->tok);
        sr.tokens = e->tok;
        sr.cache_salt = sched_policy_cache_salt(e->o->policy, sr.tenant);
    }
    sched_reject_reason why = SCHED_REJECT_NONE;
    sim_rec *x = &e->run->recs[idx];
    x->seen_us = now;
    x->live = 1;
    e->live++;
    if (q->daemon_reject) {
        /* refused by the daemon before its scheduler: the same reject, in the same stream */
        why = (sched_reject_reason)q->daemon_reject;
        sched_note_reject(e->s, &sr, why, "recorded by ringlmd", (uint64_t)now);
        end_rec(e, x, SIM_OUT_REJECTED, why, now);
        return 0;
    }
    rc = sched_submit(e->s, &sr, (uint64_t)now, &why);
    if (rc == 0) return 0;
    end_rec(e, x, SIM_OUT_REJECTED, why, now);
    /* Only transient refusals are worth retrying: a prompt that never fits stays too long. */
    if (rc == -EAGAIN || rc == -ETIME) return maybe_retry(e, x, now);
    return 0;
}

static void cancel_req(eng *e, uint32_t req, int64_t now)
{
    /* a retry waiting to be sent is dropped: the client is gone */
    for (size_t i = 0; i < e->retries.n; i++)
        if (e->retries.v[i].a == req) e->retries.v[i].c = 1;
    uint32_t idx = e->run->final_rec[req];
    if (idx == UINT32_MAX) return;
    sim_rec *x = &e->run->recs[idx];
    if (!x->live) return;
    if (sched_cancel(e->s, (uint64_t)idx + 1, (uint64_t)now, SCHED_CANCEL_DISCONNECT) == 0) {
        x->cancel_us = now;
        end_rec(e, x, SIM_OUT_CANCELLED, SCHED_CANCEL_DISCONNECT, now);
    }
}

static int64_t next_event(const eng *e)
{
    int64_t n = INT64_MAX;
    if (e->next_arrival < e->t->n) n = e->t->reqs[e->next_arrival].arrival_us;
    if (e->next_cancel < e->n_cancels) {
        int64_t c = e->t->reqs[e->cancel_order[e->next_cancel]].cancel_us;
        if (c < n) n = c;
    }
    int64_t r = theap_next(&e->retries), x = theap_next(&e->xfers);
    if (r < n) n = r;
    if (x < n) n = x;
    return n;
}

/* Everything that happened up to now, in a fixed order at equal times: transfer completions,
 * then cancels, then arrivals and retries (a cancel at t frees blocks before t's arrivals ask). */
static int deliver(eng *e, int64_t now)
{
    int rc;
    while (theap_next(&e->xfers) <= now) {
        tev x = theap_pop(&e->xfers);
        rc = sched_transfer_done(e->s, x.a, (uint64_t)x.t, x.b, x.c, 0);
        if (rc < 0 && rc != -ENOENT)
            return sim_err_setc(rc, "sched_transfer_done: %s", sched_last_error());
    }
    while (e->next_cancel < e->n_cancels &&
           e->t->reqs[e->cancel_order[e->next_cancel]].cancel_us <= now)
        cancel_req(e, e->cancel_order[e->next_cancel++], now);
    for (;;) {
        int64_t ta = e->next_arrival < e->t->n ? e->t->reqs[e->next_arrival].arrival_us : INT64_MAX;
        int64_t tr = theap_next(&e->retries);
        if (ta > now && tr > now) break;
        if (ta <= tr) {
            uint32_t req = (uint32_t)e->next_arrival++;
            const sim_req *q = &e->t->reqs[req];
            if (e->is_follower && e->is_follower[req]) continue; /* waits for its first sample */
            if ((rc = submit(e, req, 1, ta, now)) < 0) return rc;
            /* a client that gave up at (or before) its own arrival: its cancel was delivered
             * before it existed, so deliver it now — counted, not dropped */
            if (q->cancel_us != SIM_NO_TIME && q->cancel_us <= ta) cancel_req(e, req, now);
        } else {
            tev x = theap_pop(&e->retries);
            if (x.c) continue; /* dropped by a cancel */
            sim_rec *prev = &e->run->recs[e->run->final_rec[x.a]];
            prev->retried = 1;
            if ((rc = submit(e, (uint32_t)x.a, (uint32_t)x.b, x.t, now)) < 0) return rc;
        }
    }
    return 0;
}

static int sample(eng *e, int64_t now)
{
    sim_run *r = e->run;
    while (now >= e->next_sample) {
        if (r->ts_rows == r->ts_cap) {
            size_t cap = r->ts_cap ? r->ts_cap * 2 : 256;
            double *p = realloc(r->ts, cap * r->ts_cols * sizeof *p);
            if (!p) return -ENOMEM;
            r->ts = p;
            r->ts_cap = cap;
        }
        sched_counts c;
        sched_get_counts(e->s, &c);
        double *row = &r->ts[r->ts_rows++ * r->ts_cols];
        row[SIM_TS_T_S] = (double)e->next_sample / 1e6;
        row[SIM_TS_WAITING] = c.waiting;
        row[SIM_TS_RUNNING] = c.running;
        row[SIM_TS_SWAPPED] = c.swapped;
        row[SIM_TS_IN_TRANSIT] = c.in_transit;
        row[SIM_TS_KV_DEVICE] = c.kv_used[SCHED_POOL_DEVICE];
        row[SIM_TS_KV_HOST] = c.kv_used[SCHED_POOL_HOST];
        row[SIM_TS_KV_DISK] = c.kv_used[SCHED_POOL_DISK];
        row[SIM_TS_KV_DEVICE_PCT] = c.kv_total[0] ? 100.0 * c.kv_used[0] / c.kv_total[0] : 0;
        row[SIM_TS_STEPS] = (double)e->int_steps;
        row[SIM_TS_TOKENS_PER_STEP] =
            e->int_steps ? (double)e->int_tokens / (double)e->int_steps : 0;
        for (unsigned i = 0; i < e->t->n_tenants; i++)
            row[SIM_TS_FIXED_COLS + i] = (double)r->served_by_tenant[i];
        e->int_steps = e->int_tokens = 0;
        e->next_sample += e->o->sample_us;
    }
    return 0;
}

static int cmp_src(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static int cmp_cancel(const void *a, const void *b, void *ctx)
{
    const sim_trace *t = ctx;
    const sim_req *x = &t->reqs[*(const uint32_t *)a], *y = &t->reqs[*(const uint32_t *)b];
    if (x->cancel_us != y->cancel_us) return x->cancel_us < y->cancel_us ? -1 : 1;
    return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

static bool plan_runs(const sched_plan *p, uint64_t req)
{
    for (uint32_t i = 0; i < p->n_entries; i++)
        if (p->entries[i].req == req) return true;
    return false;
}

/* Handle the non-batch parts of a plan: releases, ended requests, preemptions, transfers.
 * *ready = when the batch can start: now, or later when the loop first waits for cache copies. */
static int plan_bookkeeping(eng *e, const sched_plan *p, int64_t now, int64_t *ready)
{
    sim_run *r = e->run;
    for (uint32_t i = 0; i < p->n_releases; i++) {
        uint64_t id = p->releases[i].req;
        if (id == 0 || id > r->n_recs) continue;
        sim_rec *x = &r->recs[id - 1];
        if (x->release_us < 0) x->release_us = now;
    }
    for (uint32_t i = 0; i < p->n_ended; i++) {
        uint64_t id = p->ended[i].req;
        if (id == 0 || id > r->n_recs) continue;
        sim_rec *x = &r->recs[id - 1];
        if (p->ended[i].kind == SCHED_EV_TIMEOUT) {
            end_rec(e, x, SIM_OUT_TIMEOUT, (int)p->ended[i].timeout, now);
            int rc = maybe_retry(e, x, now);
            if (rc) return rc;
        } else {
            end_rec(e, x, SIM_OUT_CANCELLED, (int)p->ended[i].cancel, now);
        }
    }
    for (uint32_t i = 0; i < p->n_preemptions; i++) {
        uint64_t id = p->preemptions[i].req;
        if (id == 0 || id > r->n_recs) continue;
        if (p->preemptions[i].mode == SCHED_PREEMPT_SWAP)
            r->recs[id - 1].preempt_swap++;
        else
            r->recs[id - 1].preempt_recompute++;
    }
    /* Transfers in plan order; `loop` is where the daemon's loop is in it.  A swap runs in the
     * background: its sequence waits for the completion, others keep stepping.  A cache copy
     * the loop does before the batch (daemon/service.c: every demotion, and a reload whose
     * sequence is in this batch) holds the loop until it is done, so the step starts after
     * it; a reload whose sequence is not in the batch waits in the background like a swap-in. */
    int64_t loop = now;
    for (uint32_t i = 0; i < p->n_transfers; i++) {
        const sched_transfer *x = &p->transfers[i];
        sched_pool tier = x->tier;
        int dir = x->dir == SCHED_XFER_IN;
        bool sync = x->cache && (!dir || plan_runs(p, x->req));
        /* one link per tier and direction: transfers queue behind each other, which is how
         * swapping becomes the second bottleneck */
        int64_t start = loop > e->link_free[tier][dir] ? loop : e->link_free[tier][dir];
        const sim_link *l = sim_service_link(e->o->svc, tier);
        double bw = dir ? l->in_bytes_per_s : l->out_bytes_per_s, lat = l->latency_us;
        /* the recorded run's bandwidth for this tier and direction, once it had measured one:
         * its copies' bytes over their realised time (latency included), the link as that
         * run had it — under its machine's load, which the service model does not see */
        if (e->cost && !e->o->tier_bw_given[tier] &&
            (dir ? e->cost->in_measured[tier] : e->cost->out_measured[tier])) {
            bw = dir ? e->cost->tier[tier].in_bytes_per_s : e->cost->tier[tier].out_bytes_per_s;
            lat = 0;
        }
        int64_t dur = (int64_t)ceil(lat + (bw > 0 ? (double)x->bytes / bw * 1e6 : 0));
        if (dur < 1) dur = 1;
        e->link_free[tier][dir] = start + dur;
        if (dir) {
            r->transfers_in++;
            r->bytes_in += x->bytes;
        } else {
            r->transfers_out++;
            r->bytes_out += x->bytes;
        }
        if (sync) {
            /* done before anything after it, as the daemon reports it: right after the copy */
            loop = start + dur;
            r->cache_copies_waited++;
            int rc = sched_transfer_done(e->s, x->id, (uint64_t)loop, x->bytes, (uint64_t)dur, 0);
            if (rc < 0) return sim_err_setc(rc, "sched_transfer_done: %s", sched_last_error());
            continue;
        }
        int rc = theap_push(&e->xfers, start + dur, x->id, x->bytes, (uint64_t)dur);
        if (rc) return rc;
    }
    r->cache_copy_wait_us += (double)(loop - now);
    *ready = loop;
    return 0;
}

static int cmp_cost(const void *a, const void *b, void *ctx)
{
    const sim_trace *t = ctx;
    const sim_req *x = &t->reqs[*(const uint32_t *)a], *y = &t->reqs[*(const uint32_t *)b];
    if (x->cost_at_us != y->cost_at_us) return x->cost_at_us < y->cost_at_us ? -1 : 1;
    return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

/* Trace request i has been scheduled (or has ended) in this run. */
static bool started(const eng *e, uint32_t i)
{
    if (i >= e->next_arrival || e->run->final_rec[i] == UINT32_MAX) return false;
    const sim_rec *x = &e->run->recs[e->run->final_rec[i]];
    return x->first_sched_us >= 0 || x->end_us >= 0;
}

/* The recorded run's cost model for this step, so it decides — demote or drop, reload or
 * recompute — with the costs that run measured (its step-time correction under the machine's
 * load, the bandwidths its copies had), which no service model predicts.  A request's record
 * is the state the recorded scheduler admitted it with: while the next request in the
 * recorded admission order waits here, its record (its admission, and the evictions made for
 * it, decide with it); else the last admitted one's.  What the simulated steps and copies
 * teach the scheduler in between is overwritten at the next step. */
static int apply_recorded_cost(eng *e)
{
    if (!e->n_costs) return 0;
    while (e->next_cost < e->n_costs && started(e, e->costs[e->next_cost])) e->next_cost++;
    size_t k = e->next_cost < e->n_costs && e->costs[e->next_cost] < e->next_arrival ? e->next_cost
               : e->next_cost ? e->next_cost - 1
                              : 0;
    const sim_req *q = &e->t->reqs[e->costs[k]];
    e->cost = &e->t->costs[q->cost_idx - 1];
    int rc = sched_set_cost_state(e->s, e->cost);
    if (rc < 0)
        return sim_err_setc(rc, "the recorded cost model of request %llu (line %u): %s",
                            (unsigned long long)q->src_id, q->src_line, sched_last_error());
    return 0;
}

int sim_window_layout_of(const sim_window_pattern *wp, const sched_policy_cfg *pc, uint32_t blocks,
                         uint32_t block_size, uint32_t bytes_per_token, uint32_t max_context,
                         sim_window_layout *out)
{
    memset(out, 0, sizeof *out);
    if (!wp->window || !wp->windowed || wp->windowed >= wp->period)
        return sim_err_setc(-EINVAL,
                            "window pattern: %u of every %u layers windowed: a pattern needs "
                            "windowed and global layers (every layer windowed: "
                            "--attention-window)",
                            wp->windowed, wp->period);
    if (!block_size || !bytes_per_token || !blocks)
        return sim_err_setc(-EINVAL, "window pattern: the service model has no KV blocks");
    /* the most rows one sequence brings to a batch, as ringlmd sizes its rings
     * (daemon/service.c): the prefill chunk in token-budget mode, else the batch */
    uint64_t max_tokens = pc->token_budget;
    if (pc->mode == SCHED_MODE_STATIC) max_tokens += 2ull * pc->static_batch_size;
    if (pc->mode == SCHED_MODE_CONTINUOUS && max_tokens < pc->token_budget + (uint64_t)max_context)
        max_tokens = pc->token_budget + (uint64_t)max_context;
    const uint64_t rows =
        pc->mode == SCHED_MODE_TOKEN_BUDGET && pc->prefill_chunk && pc->prefill_chunk < max_tokens
            ? pc->prefill_chunk
            : max_tokens;
    /* eng_kv_ring_blocks_for */
    uint64_t rb = (wp->window + rows + block_size - 1) / block_size + 1;
    const uint64_t whole = ((uint64_t)max_context + block_size - 1) / block_size;
    if (whole && rb > whole) rb = whole;
    /* K/V bytes a position: the global layers' share, the windowed layers' the rest */
    const uint64_t global_bpt =
        ((uint64_t)bytes_per_token * (wp->period - wp->windowed) + wp->period / 2) / wp->period;
    const uint64_t window_bpt = bytes_per_token - global_bpt;
    if (!global_bpt || !window_bpt)
        return sim_err_setc(-EINVAL, "window pattern: %u bytes a position do not split %u:%u",
                            bytes_per_token, wp->windowed, wp->period - wp->windowed);
    uint64_t rings = wp->rings;
    if (!rings) { /* ringlmd's default: the rings take the windowed layers' share */
        rings = blocks / rb;
        if (rings > pc->max_active_seqs) rings = pc->max_active_seqs;
        if (rings < 1) rings = 1;
    }
    const uint64_t ring_bytes = rb * block_size * window_bpt;
    const uint64_t memory = (uint64_t)blocks * block_size * bytes_per_token;
    const uint64_t global_blocks =
        memory > rings * ring_bytes ? (memory - rings * ring_bytes) / (block_size * global_bpt) : 0;
    if (!global_blocks || rings > UINT32_MAX || global_blocks > UINT32_MAX)
        return sim_err_setc(-EINVAL,
                            "window pattern: %llu rings of %llu blocks take the memory of the "
                            "%u device blocks (no block left for the global layers)",
                            (unsigned long long)rings, (unsigned long long)rb, blocks);
    *out = (sim_window_layout){.blocks = (uint32_t)global_blocks,
                               .bytes_per_token = (uint32_t)global_bpt,
                               .rings = (uint32_t)rings,
                               .ring_blocks = (uint32_t)rb,
                               .ring_rows = (uint32_t)rows,
                               .ring_bytes = ring_bytes};
    return 0;
}

int sim_run_trace(const sim_trace *t, const sim_options *o, sim_run *run)
{
    memset(run, 0, sizeof *run);
    run->trace = t;
    run->opt = *o;
    eng e;
    memset(&e, 0, sizeof e);
    e.run = run;
    e.t = t;
    e.o = &run->opt;
    int rc = 0;
    struct timespec w0, w1;
    clock_gettime(CLOCK_MONOTONIC, &w0);

    const sim_service *svc = o->svc;
    snprintf(run->policy_name, sizeof run->policy_name, "%s",
             o->policy_name ? o->policy_name : "policy");
    snprintf(run->policy_hash, sizeof run->policy_hash, "%s", sched_policy_hash_hex(o->policy));
    const sched_policy_cfg *pc = sched_policy_get(o->policy);
    snprintf(run->mode, sizeof run->mode, "%s", sched_mode_name(pc->mode));
    run->ts_cols = SIM_TS_FIXED_COLS + t->n_tenants;

    /* Names in the trace → the policy's tenants and classes; a name the policy lacks goes to
     * its default (and the report says so) rather than being refused wholesale. */
    for (unsigned i = 0; i < t->n_tenants; i++) {
        int k = sched_policy_tenant_index(o->policy, t->tenants[i]);
        if (k < 0) {
            k = sched_policy_tenant_index(o->policy, NULL);
            bool used = false;
            for (size_t j = 0; j < t->n && !used; j++) used = t->reqs[j].tenant == i;
            /* "default" is the reader's placeholder for unlabelled traces: mapping it to the
             * policy's default is the expected case, not worth a warning */
            if (used && (strcmp(t->tenants[i], "default") != 0 || k < 0)) {
                char m[200];
                snprintf(m, sizeof m, "tenant \"%s\" is not in the policy: %s", t->tenants[i],
                         k >= 0 ? "its requests go to the default tenant"
                                : "its requests are refused");
                warn(run, m);
            }
        }
        run->tenant_map[i] = k;
    }
    for (unsigned i = 0; i < t->n_classes; i++) {
        int k = sched_policy_class_index(o->policy, t->classes[i]);
        /* A recorded (native) trace names classes as clients did: replay them as they were,
         * so a class the policy lacks is refused as the daemon refused it. */
        if (k < 0 && t->labelled)
            k = -1;
        else if (k < 0) {
            k = sched_policy_class_index(o->policy, NULL);
            bool used = false;
            for (size_t j = 0; j < t->n && !used; j++) used = t->reqs[j].klass == i;
            if (used && strcmp(t->classes[i], "default") != 0) {
                char m[200];
                snprintf(m, sizeof m,
                         "class \"%s\" is not in the policy: its requests use the default class",
                         t->classes[i]);
                warn(run, m);
            }
        }
        run->class_map[i] = k;
    }

    sched_step_model model;
    sim_service_step_model(svc, &model);
    /* Only requests with block hashes can share (line ~184): a trace without any (Azure's)
     * gets no prefix index, whose set-up for a large pool cost ~10% of a whole replay. */
    /* A trace that recorded its answers' block hashes (a log of a ringlmd that caches the
     * blocks answers fill) is replayed that way: each sampled token is the answer's stand-in
     * (sim_req_token), and the scheduler caches the blocks it fills as the daemon did. */
    bool any_hash = false, any_answer = false;
    for (size_t j = 0; j < t->n; j++) {
        any_hash |= t->reqs[j].n_hash + t->reqs[j].n_ahash > 0;
        any_answer |= t->reqs[j].n_ahash > 0;
    }
    /* n > 1: each first sample's others (by src_id; one whose first sample the trace lacks —
     * cut off by a window — runs as a request of its own) */
    for (size_t j = 0; j < t->n && !e.fol_head; j++)
        if (t->reqs[j].sample_of) {
            e.fol_head = malloc(t->n * sizeof *e.fol_head);
            e.fol_next = malloc(t->n * sizeof *e.fol_next);
            e.is_follower = calloc(t->n, 1);
            uint64_t(*by_src)[2] = malloc(t->n * sizeof *by_src);
            if (!e.fol_head || !e.fol_next || !e.is_follower || !by_src) {
                free(by_src);
                rc = -ENOMEM;
                goto out;
            }
            for (size_t k = 0; k < t->n; k++) {
                e.fol_head[k] = e.fol_next[k] = UINT32_MAX;
                by_src[k][0] = t->reqs[k].src_id;
                by_src[k][1] = k;
            }
            qsort(by_src, t->n, sizeof *by_src, cmp_src);
            for (size_t k = t->n; k-- > 0;) { /* pushed from the back: chains in trace order */
                if (!t->reqs[k].sample_of) continue;
                uint64_t of = t->reqs[k].sample_of - 1; /* the first sample's src_id */
                size_t lo = 0, hi = t->n;
                while (lo < hi) {
                    size_t mid = (lo + hi) / 2;
                    if (by_src[mid][0] < of)
                        lo = mid + 1;
                    else
                        hi = mid;
                }
                if (lo == t->n || by_src[lo][0] != of || by_src[lo][1] == k) continue;
                uint32_t first = (uint32_t)by_src[lo][1];
                if (t->reqs[first].sample_of) continue; /* a chain: not a first sample */
                e.is_follower[k] = 1;
                e.fol_next[k] = e.fol_head[first];
                e.fol_head[first] = (uint32_t)k;
            }
            free(by_src);
        }
    const uint32_t device_blocks =
        o->kv_blocks_device ? o->kv_blocks_device : svc->kv_blocks_device;
    if (o->window_pattern.window) {
        if (svc->attention_window) {
            rc = sim_err_setc(-EINVAL, "a window pattern and a window on every layer "
                                       "(--attention-window) exclude each other");
            goto out;
        }
        if ((rc = sim_window_layout_of(&o->window_pattern, pc, device_blocks, svc->kv_block_size,
                                       svc->kv_bytes_per_token, o->max_context, &run->window)) < 0)
            goto out;
    }
    const sim_window_layout *wl = &run->window;
    sched_config cfg = {
        .kv_blocks_device = wl->rings ? wl->blocks : device_blocks,
        .prefix_cache = o->prefix_cache && (any_hash || e.fol_head),
        .prefix_cache_generated = o->prefix_cache && any_answer,
        .kv_blocks_host = svc->host.present ? svc->kv_blocks_host : 0,
        .kv_blocks_disk = svc->kv_blocks_disk,
        .block_size = svc->kv_block_size,
        .kv_bytes_per_token = wl->rings ? wl->bytes_per_token : svc->kv_bytes_per_token,
        .attention_window = svc->attention_window,
        .window_rings = wl->rings,
        .window_ring_bytes = wl->ring_bytes,
        /* ringlmd's default: ring snapshots of one ring block each in the rings' bytes,
         * with the prefix cache; a hit restores the window's blocks */
        .window_snapshots =
            o->prefix_cache && (any_hash || e.fol_head) ? wl->rings * wl->ring_blocks : 0,
        .window_snapshot_blocks =
            (o->window_pattern.window + svc->kv_block_size - 1) / svc->kv_block_size,
        /* a windowed layer's attention reads min(context, window) (as ringlmd's model) */
        .step_window = o->window_pattern.window,
        .step_window_layers = o->window_pattern.windowed,
        .step_layers = o->window_pattern.period,
        .max_context = o->max_context,
        /* the model the steps are charged with (a fitted intercept may be negative; the
         * scheduler's prediction takes it as 0, and needs a prefill cost > 0) */
        .step = {.base_us = model.base_us > 0 ? model.base_us : 0,
                 .prefill_token_us = model.prefill_token_us > 0 ? model.prefill_token_us : 1e-3,
                 .decode_seq_us = model.decode_seq_us > 0 ? model.decode_seq_us : 0,
                 .context_token_us = model.context_token_us > 0 ? model.context_token_us : 0,
                 .prefill_pair_us = model.prefill_pair_us > 0 ? model.prefill_pair_us : 0},
        .host = {svc->host.out_bytes_per_s, svc->host.in_bytes_per_s, svc->host.latency_us},
        .disk = {sim_service_link(svc, SCHED_POOL_DISK)->out_bytes_per_s,
                 sim_service_link(svc, SCHED_POOL_DISK)->in_bytes_per_s,
                 sim_service_link(svc, SCHED_POOL_DISK)->latency_us},
    };
    run->final_rec = malloc((t->n ? t->n : 1) * sizeof *run->final_rec);
    e.cancel_order = malloc((t->n ? t->n : 1) * sizeof *e.cancel_order);
    if (!run->final_rec || !e.cancel_order) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < t->n; i++) {
        run->final_rec[i] = UINT32_MAX;
        if (t->reqs[i].cancel_us != SIM_NO_TIME) e.cancel_order[e.n_cancels++] = (uint32_t)i;
    }
    qsort_r(e.cancel_order, e.n_cancels, sizeof *e.cancel_order, cmp_cancel, (void *)t);

    if (cfg.kv_blocks_disk && !svc->disk.present && !svc->host.present)
        cfg.kv_blocks_disk = 0; /* no link to it */
    if (wl->rings) { /* the host and disk tiers keep their bytes, in the smaller blocks */
        const double per = (double)svc->kv_bytes_per_token / wl->bytes_per_token;
        cfg.kv_blocks_host = (uint32_t)fmin(cfg.kv_blocks_host * per, UINT32_MAX);
        cfg.kv_blocks_disk = (uint32_t)fmin(cfg.kv_blocks_disk * per, UINT32_MAX);
    }
    run->kv_blocks_device = cfg.kv_blocks_device;
    rc = sched_create(o->policy, &cfg, o->decision_log ? sink : NULL, &e, o->seed, &e.s);
    if (rc < 0) {
        rc = sim_err_setc(rc, "sched_create: %s", sched_last_error());
        goto out;
    }
    if (o->recorded_costs && t->n_costs) {
        e.costs = malloc(t->n * sizeof *e.costs);
        if (!e.costs) {
            rc = -ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < t->n; i++)
            if (t->reqs[i].cost_idx) e.costs[e.n_costs++] = (uint32_t)i;
        qsort_r(e.costs, e.n_costs, sizeof *e.costs, cmp_cost, (void *)t);
    }
    run->slot_capacity =
        pc->mode == SCHED_MODE_STATIC ? pc->static_batch_size : pc->max_active_seqs;

    int64_t now = t->n ? t->reqs[0].arrival_us : 0;
    if (now < 0) now = 0;
    e.next_sample = 0;
    e.last_progress_any = now;
    for (;;) {
        if ((rc = deliver(&e, now)) < 0) goto out;
        if ((rc = fork_pending(&e)) < 0) goto out;
        if ((rc = sample(&e, now)) < 0) goto out;
        if ((rc = apply_recorded_cost(&e)) < 0) goto out;
        const sched_plan *p = sched_step(e.s, (uint64_t)now);
        if (!p) {
            rc = sim_err_setc(-ENOMEM, "sched_step: %s", sched_last_error());
            goto out;
        }
        int64_t ready = now;
        if ((rc = plan_bookkeeping(&e, p, now, &ready)) < 0) goto out;
        if (p->n_entries == 0 && ready > now) {
            now = ready; /* the loop was busy copying */
            continue;
        }
        if (p->n_entries == 0) {
            int64_t next = next_event(&e);
            if (e.live > 0 || e.xfers.n) {
                /* Work waits but nothing ran (static group filling, blocks in transit, a rate
                 * limit): look again shortly, as the daemon's loop would. */
                if (now + o->idle_poll_us < next) next = now + o->idle_poll_us;
                /* a burst being gathered: its first step is due then */
                if (p->hold_until_us > (uint64_t)now && (int64_t)p->hold_until_us < next)
                    next = (int64_t)p->hold_until_us;
                if (now - e.last_progress_any > o->stall_stop_us && next_event(&e) == INT64_MAX) {
                    char m[200];
                    snprintf(m, sizeof m,
                             "stopped: %zu requests made no progress for %.0f s of simulated time",
                             e.live, (double)o->stall_stop_us / 1e6);
                    warn(run, m);
                    run->still_live = e.live;
                    break;
                }
            }
            if (next == INT64_MAX) break;
            now = next;
            continue;
        }
        /* the batch */
        sched_plan_work w;
        sched_plan_work_of(p, &w);
        /* engine + the serving loop's measured share (its context term follows the decode
         * rows it was measured on) + the what-if knobs */
        /* the logits pipeline's rows (log-probabilities, bias and penalties), each request's
         * sampling row, and a first sample's others drawn from its first row */
        double pipe_us = 0;
        for (uint32_t i = 0; i < p->n_entries; i++) {
            const sched_entry *en = &p->entries[i];
            if (!en->samples || en->req == 0 || en->req > run->n_recs) continue;
            const sim_rec *x = &run->recs[en->req - 1];
            const sim_req *q = &t->reqs[x->req];
            uint32_t rows = 1;
            if (e.fol_head && x->generated == 0)
                for (uint32_t k = e.fol_head[x->req]; k != UINT32_MAX; k = e.fol_next[k]) rows++;
            pipe_us += rows * ((q->logprobs ? svc->logprobs_row_us : 0) +
                               (q->processors ? svc->processors_row_us : 0));
        }
        double step = (sched_step_model_us(&model, &w) + svc->loop_step_us +
                       svc->loop_context_us * w.decode_context + pipe_us) *
                          o->step_scale * sim_service_speed_at(svc, ready) +
                      o->step_overhead_us;
        int64_t dur = (int64_t)ceil(step);
        if (dur < 1) dur = 1;
        int64_t end = ready + dur; /* after the cache copies the loop did first */
        if (p->n_entries > e.results_cap) {
            size_t cap = p->n_entries * 2;
            sched_result *nr = realloc(e.results, cap * sizeof *nr);
            if (!nr) {
                rc = -ENOMEM;
                goto out;
            }
            e.results = nr;
            e.results_cap = cap;
        }
        size_t nres = 0;
        for (uint32_t i = 0; i < p->n_entries; i++) {
            const sched_entry *en = &p->entries[i];
            if (en->req == 0 || en->req > run->n_recs) continue;
            sim_rec *x = &run->recs[en->req - 1];
            const sim_req *q = &t->reqs[x->req];
            if (x->first_sched_us < 0) {
                x->first_sched_us = now;
                sched_req_info ri; /* its cached prefix, for the request log */
                if (o->prefix_cache && sched_get_request(e.s, en->req, &ri) == 0)
                    x->cached_tokens = ri.cached_tokens;
                /* and the cost model it was admitted with, as ringlmd logs it (sched_cost) */
                if (run->n_costs == run->cap_costs) {
                    size_t cap = run->cap_costs ? run->cap_costs * 2 : 256;
                    sched_cost_state *c = realloc(run->costs, cap * sizeof *c);
                    if (!c) {
                        rc = -ENOMEM;
                        goto out;
                    }
                    run->costs = c;
                    run->cap_costs = cap;
                }
                sched_get_cost_state(e.s, &run->costs[run->n_costs++]);
                x->cost_idx = (uint32_t)run->n_costs;
            }
            if (now - x->last_progress_us > x->max_starve_us)
                x->max_starve_us = now - x->last_progress_us;
            x->last_progress_us = end;
            bool cancelled_before = q->cancel_us != SIM_NO_TIME && q->cancel_us <= now;
            if (en->prefill) {
                x->prefill_done += en->n_tokens;
                run->served_by_tenant[q->tenant] += en->n_tokens;
            }
            sched_result *res = &e.results[nres++];
            res->req = en->req;
            res->tokens = 0;
            res->finished = SCHED_FINISH_NONE;
            res->has_token = false;
            /* A recorded request that ended on its stop token delivered output_tokens and
             * then sampled the stop, feeding its last token back (that KV computed, its
             * block cacheable, as ringlmd caches it): the replay samples it too, as no output. */
            bool stop_sample = en->samples && q->real_reason == SIM_REAL_STOP &&
                               x->generated >= q->output_tokens && q->output_tokens < q->max_tokens;
            if (stop_sample) {
                res->tokens = 1;
                if (cfg.prefix_cache_generated) {
                    res->has_token = true;
                    res->token = sim_req_token(t, q, x->req, q->prompt_tokens + x->generated);
                }
                res->finished = SCHED_FINISH_STOP;
                end_rec(&e, x, SIM_OUT_FINISHED, res->finished, end);
            } else if (en->samples) {
                res->tokens = 1;
                x->generated++;
                if (cfg.prefix_cache_generated) { /* the answer's token at its position */
                    res->has_token = true;
                    res->token = sim_req_token(t, q, x->req, q->prompt_tokens + x->generated - 1);
                }
                run->served_by_tenant[q->tenant]++;
                if (cancelled_before) x->tokens_after_cancel++;
                if (x->first_token_us < 0) {
                    x->first_token_us = end;
                    /* a first sample of n: its others draw their first tokens from this row */
                    if (e.fol_head && e.fol_head[x->req] != UINT32_MAX &&
                        (rc = fork_note(&e, x->req, false, 0, 0, end)) < 0)
                        goto out;
                } else if (end - x->last_token_us > x->max_itl_us)
                    x->max_itl_us = end - x->last_token_us;
                x->last_token_us = end;
                if (x->generated >= q->output_tokens &&
                    (q->real_reason != SIM_REAL_STOP || x->generated >= q->max_tokens)) {
                    res->finished =
                        x->generated >= q->max_tokens ? SCHED_FINISH_LENGTH : SCHED_FINISH_STOP;
                    end_rec(&e, x, SIM_OUT_FINISHED, res->finished, end);
                }
            }
        }
        run->steps++;
        run->entries += p->n_entries;
        run->prefill_tokens += p->prefill_tokens;
        run->decode_tokens += p->decode_tokens;
        run->pad_tokens += p->pad_tokens;
        run->busy_us += (double)dur;
        if (step > run->max_step_us) run->max_step_us = step;
        if (p->n_decode && step > run->max_decode_step_us) run->max_decode_step_us = step;
        e.int_steps++;
        e.int_tokens += (uint64_t)p->prefill_tokens + p->decode_tokens;
        e.last_progress_any = end;
        rc = sched_commit(e.s, e.results, nres, (uint64_t)end, (uint64_t)dur);
        if (rc < 0) {
            rc = sim_err_setc(rc, "sched_commit: %s", sched_last_error());
            goto out;
        }
        /* after the commit cached the first samples' prompts (ringlmd submits them there) */
        if ((rc = fork_pending(&e)) < 0) goto out;
        if (o->check_every && run->steps % o->check_every == 0) {
            /* a long replay is a good fuzzer for the scheduler's own bookkeeping */
            char why[256] = "";
            if (sched_check_invariants(e.s, why, sizeof why) < 0) {
                rc = sim_err_setc(-EUCLEAN,
                                  "scheduler invariant broken after step %llu at t=%lld us: %s",
                                  (unsigned long long)run->steps, (long long)end, why);
                goto out;
            }
            run->invariant_checks++;
        }
        now = end;
    }
    run->sim_end_us = now;
    sample(&e, now);
    sched_get_counts(e.s, &run->final_counts);
    rc = 0;
out:
    clock_gettime(CLOCK_MONOTONIC, &w1);
    run->wall_s = (double)(w1.tv_sec - w0.tv_sec) + (double)(w1.tv_nsec - w0.tv_nsec) / 1e9;
    if (e.s) sched_destroy(e.s);
    free(e.cancel_order);
    free(e.costs);
    free(e.retries.v);
    free(e.xfers.v);
    free(e.results);
    free(e.tok);
    free(e.fol_head);
    free(e.fol_next);
    free(e.is_follower);
    free(e.forks);
    return rc;
}

void sim_run_free(sim_run *r)
{
    free(r->costs);
    free(r->recs);
    free(r->final_rec);
    free(r->ts);
    memset(r, 0, sizeof *r);
}
