/* SPDX-License-Identifier: MIT */
/* sched.c — the scheduler core: create/destroy, the step (releases, timeouts, the batch,
 * the sealed plan), commit, how requests end and release their blocks, queries, invariants. */
#include "sched/internal.h"

void sc_emit_defer(sched *s, req *r, sched_defer_reason why, uint64_t now)
{
    if (r->defer == why) return; /* on change only: no flood */
    r->defer = (uint8_t)why;
    if (!s->sink) return;
    sched_event e = ev_of(s, SCHED_EV_DEFER, r, now);
    e.defer = why;
    emit(s, &e);
}

static int bad_config(const char *field, const char *why)
{
    sched__set_error("sched_create: config %s %s", field, why);
    return -EINVAL;
}

int sched_create(const sched_policy *policy, const sched_config *cfg, sched_event_fn sink,
                 void *sink_ctx, uint64_t seed, sched **out)
{
    if (!out) return bad_config("out", "is NULL");
    *out = NULL;
    if (!policy) return bad_config("policy", "is NULL");
    if (!cfg) return bad_config("cfg", "is NULL");
    if (!cfg->kv_blocks_device) return bad_config("kv_blocks_device", "must be > 0");
    if (!cfg->block_size) return bad_config("block_size", "must be > 0");
    if (!cfg->kv_bytes_per_token) return bad_config("kv_bytes_per_token", "must be > 0");
    if (!cfg->max_context) return bad_config("max_context", "must be > 0");
    const char *why, *field = sc_step_model_fault(&cfg->step, &why);
    if (field) return bad_config(field, why);
    const sched_tier_cost *tc[2] = {&cfg->host, &cfg->disk};
    uint32_t tb[2] = {cfg->kv_blocks_host, cfg->kv_blocks_disk};
    for (int i = 0; i < 2; i++)
        if (tb[i] && (!(tc[i]->out_bytes_per_s > 0) || !(tc[i]->in_bytes_per_s > 0) ||
                      !(tc[i]->latency_us >= 0)))
            return bad_config(i ? "disk" : "host", "tier needs bandwidths > 0 and latency >= 0");
    if (cfg->window_rings && (cfg->kv_blocks_host || cfg->kv_blocks_disk) &&
        !cfg->window_ring_bytes)
        return bad_config("window_ring_bytes", "must be > 0 with window rings and a host or "
                                               "disk tier (a swap moves the ring)");

    if (cfg->window_rings && cfg->prefix_cache && cfg->window_snapshots &&
        !cfg->window_snapshot_blocks)
        return bad_config("window_snapshot_blocks", "must be > 0 with ring snapshots");

    sched *s = calloc(1, sizeof(*s));
    if (!s) goto oom;
    s->policy = sched__policy_clone(policy);
    if (!s->policy) goto oom;
    s->cfg = *sched_policy_get(s->policy);
    s->conf = *cfg;
    s->sink = sink;
    s->sink_ctx = sink_ctx;
    s->seed = seed;
    s->corr = 1.0;
    s->next_xfer = 1;
    s->win = cfg->step_window ? cfg->step_window : cfg->attention_window;
    s->win_of = cfg->step_window && cfg->step_layers ? cfg->step_layers : 1;
    s->win_layers = cfg->step_window && cfg->step_layers ? cfg->step_window_layers : 1;
    if (s->win_layers > s->win_of) s->win_layers = s->win_of;
    if (cfg->window_rings) {
        const uint64_t bb = (uint64_t)cfg->block_size * cfg->kv_bytes_per_token;
        s->ring_tier_slots = (uint32_t)((cfg->window_ring_bytes + bb - 1) / bb);
    }
    s->n_classes = sched_policy_n_classes(s->policy);
    s->n_tenants = sched_policy_n_tenants(s->policy);
    for (int i = 0; i < s->n_classes; i++) {
        s->cls[i] = sched_policy_class(s->policy, i);
        s->cs[i].headroom = HEADROOM_MAX;
        s->cs[i].swapped.which = POS_Q;
    }
    for (int i = 0; i < s->n_tenants; i++) {
        s->ten[i] = sched_policy_tenant(s->policy, i);
        s->ts[i].bucket = s->ten[i]->token_rate_per_s;
    }
    s->wait = calloc((size_t)s->n_classes * (size_t)s->n_tenants, sizeof(heap));
    if (!s->wait) goto oom;
    s->timers.which = POS_T;
    s->bp_timers.which = POS_BP;
    s->map_cap = 1024;
    s->map = malloc(s->map_cap * sizeof(uint32_t));
    if (!s->map) goto oom;
    memset(s->map, 0xff, s->map_cap * sizeof(uint32_t));
    if (sc_pool_init(&s->pools[SCHED_POOL_DEVICE], cfg->kv_blocks_device) ||
        sc_pool_init(&s->pools[SCHED_POOL_HOST], cfg->kv_blocks_host) ||
        sc_pool_init(&s->pools[SCHED_POOL_DISK], cfg->kv_blocks_disk) ||
        sc_pool_init(&s->rings, cfg->window_rings) || sc_cache_create(s) || sc_order_create(s) ||
        sc_snap_create(s))
        goto oom;
    s->tiers[SCHED_POOL_HOST] = (tier_est){cfg->host.out_bytes_per_s,
                                           cfg->host.in_bytes_per_s,
                                           cfg->host.latency_us,
                                           0,
                                           0,
                                           false,
                                           false};
    s->tiers[SCHED_POOL_DISK] = (tier_est){cfg->disk.out_bytes_per_s,
                                           cfg->disk.in_bytes_per_s,
                                           cfg->disk.latency_us,
                                           0,
                                           0,
                                           false,
                                           false};
    *out = s;
    return 0;
oom:
    sched_destroy(s);
    sched__set_error("sched_create: out of memory");
    return -ENOMEM;
}

/* A test-only entry point (sched_testing.h): the key function is not part of sched_config. */
int sched_testing_set_prefix_key(sched *s, sched_prefix_key_fn fn)
{
    if ((unsigned)fn >= SCHED_PREFIX_KEY__COUNT)
        return bad_config("prefix_key", "is not a sched_prefix_key_fn");
    if (s->n_slots) {
        sched__set_error("sched_testing_set_prefix_key: prefix_key must be set before the "
                         "first request");
        return -EBUSY;
    }
    /* the longest_prefix order follows waiting requests by key alone (order.c): under a key
     * that names no block it counts any block inserted as every waiter's next one */
    for (int i = 0; i < s->n_classes; i++)
        if (s->conf.prefix_cache && fn != SCHED_PREFIX_KEY_XXH3 &&
            s->cls[i]->prefix_order == SCHED_PREFIX_ORDER_LONGEST)
            return bad_config("prefix_key",
                              "must be xxh3 with a class whose prefix_order is longest_prefix "
                              "(that order tracks waiting requests by key alone)");
    s->prefix_key = fn;
    return 0;
}

void sched_destroy(sched *s)
{
    if (!s) return;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        free(s->reqs[i].dev);
        free(s->reqs[i].tierb);
        sc_cache_free_req(&s->reqs[i]);
    }
    sched_prefix_destroy(s->px);
    sc_order_destroy(s);
    free(s->reqs);
    if (s->wait)
        for (int i = 0; i < s->n_classes * s->n_tenants; i++) free(s->wait[i].a);
    free(s->wait);
    for (int i = 0; i < s->n_classes; i++) free(s->cs[i].swapped.a);
    free(s->timers.a);
    free(s->bp_timers.a);
    free(s->free_slots.a);
    free(s->limbo.a);
    free(s->map);
    for (int i = 0; i < SCHED_POOL__COUNT; i++) free(s->pools[i].free_ids);
    free(s->rings.free_ids);
    free(s->snaps);
    free(s->snap_hash);
    free(s->snap_free.a);
    free(s->snap_pend.a);
    free(s->snap_want.a);
    free(s->run.a);
    free(s->cancel_pending.a);
    for (uint32_t i = 0; i < s->xfers.n; i++) free(s->xfers.a[i].dst); /* cache copies in flight */
    free(s->xfers.a);
    free(s->px_mv);
    free(s->entries.a);
    free(s->snap_takes.a);
    free(s->rel_plan.a);
    free(s->rel_acc.a);
    free(s->transfers.a);
    free(s->xfer_blocks.a);
    free(s->preempts.a);
    free(s->ended.a);
    free(s->dec.a);
    free(s->part.a);
    free(s->victims.a);
    free(s->cow.a);
    free(s->copies.a);
    free(s->resv_firsts.a);
    sched_policy_free(s->policy);
    free(s);
}

const sched_policy *sched_get_policy(const sched *s)
{
    return s ? s->policy : NULL;
}

void sc_release_now(sched *s, uint32_t slot, uint64_t now, bool into_plan)
{
    req *r = &s->reqs[slot];
    sched_release rel = {.req = r->id, .why = (sched_event_kind)r->end_kind};
    if (r->rc_active) sc_rc_end(s, r, SCHED_OUTCOME_ABANDONED, now);
    uint8_t tier = r->tier;
    rel.blocks[SCHED_POOL_DEVICE] = sc_dev_free_all(s, r);
    rel.blocks[tier] += sc_tier_free_all(s, r);
    bool any = rel.blocks[0] || rel.blocks[1] || rel.blocks[2];
    for (int p = 0; p < SCHED_POOL__COUNT && s->sink; p++) {
        /* one event per pool that held blocks; a request that held none still says so */
        if (!rel.blocks[p] && (any || p != SCHED_POOL_DEVICE)) continue;
        sched_event e = ev_of(s, SCHED_EV_RELEASE, r, now);
        e.blocks = rel.blocks[p];
        e.pool = (sched_pool)p;
        emit(s, &e);
    }
    if (into_plan)
        VEC_PUSH(s, s->rel_plan, rel);
    else
        VEC_PUSH(s, s->rel_acc, rel);
    sc_hremove(s, &s->timers, slot);
    sc_hremove(s, &s->bp_timers, slot);
    sc_map_del(s, r->id);
    s->ts[r->tenant].n_live--;
    r->live = 0;
    sc_set_state(s, r, SCHED_REQ_ENDED);
    VEC_PUSH(s, s->limbo, slot);
}

/* Take a request out of whatever it is in and mark it ENDED.  Returns true when its blocks
 * can be released now (false: a transfer is in flight; release on completion). */
bool sc_detach(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    switch (r->state) {
    case SCHED_REQ_WAITING:
        if (!r->parked) sc_waiting_remove(s, slot);
        break;
    case SCHED_REQ_RUNNING: sc_run_remove(s, slot); break;
    case SCHED_REQ_SWAPPED:
        sc_hremove(s, &s->cs[r->cls].swapped, slot);
        s->n_swapped--;
        break;
    case SCHED_REQ_SWAPPING_OUT:
    case SCHED_REQ_SWAPPING_IN: sc_set_state(s, r, SCHED_REQ_ENDED); return false;
    default: break;
    }
    if (r->parked) {
        r->parked = false;
        s->n_parked--;
    }
    sc_set_state(s, r, SCHED_REQ_ENDED);
    return true;
}

static void end_timeout(sched *s, uint32_t slot, sched_timeout_reason why, uint64_t now)
{
    req *r = &s->reqs[slot];
    r->end_kind = SCHED_EV_TIMEOUT;
    s->ts[r->tenant].st.timeouts[why]++;
    s->cs[r->cls].st.timeouts[why]++;
    if (why == SCHED_TIMEOUT_QUEUE_WAIT) {
        double *hr = &s->cs[r->cls].headroom;
        *hr = *hr * 0.9 > HEADROOM_MIN ? *hr * 0.9 : HEADROOM_MIN;
    }
    sched_event e = ev_of(s, SCHED_EV_TIMEOUT, r, now);
    e.timeout = why;
    e.wait_us = now - r->arrival_us;
    emit(s, &e);
    VEC_PUSH(s, s->ended, ((sched_ended){.req = r->id, .kind = SCHED_EV_TIMEOUT, .timeout = why}));
    if (sc_detach(s, slot)) sc_release_now(s, slot, now, true);
}

void sc_do_cancel(sched *s, uint32_t slot, sched_cancel_reason why, uint64_t now, bool in_step)
{
    req *r = &s->reqs[slot];
    r->end_kind = SCHED_EV_CANCEL;
    s->ts[r->tenant].st.cancels[why]++;
    s->cs[r->cls].st.cancels[why]++;
    sched_event e = ev_of(s, SCHED_EV_CANCEL, r, now);
    e.cancel = why;
    emit(s, &e);
    if (in_step)
        VEC_PUSH(s, s->ended,
                 ((sched_ended){.req = r->id, .kind = SCHED_EV_CANCEL, .cancel = why}));
    if (!sc_detach(s, slot)) return; /* in transit: released when the transfer completes */
    if (in_step)
        sc_release_now(s, slot, now, true);
    else
        VEC_PUSH(s, s->cancel_pending, slot);
}

static void finish(sched *s, uint32_t slot, sched_finish_reason why, uint64_t now)
{
    req *r = &s->reqs[slot];
    tenant_state *t = &s->ts[r->tenant];
    class_state *c = &s->cs[r->cls];
    const sched_class_cfg *cc = s->cls[r->cls];
    r->end_kind = SCHED_EV_FINISH;
    t->st.finished++;
    c->st.finished++;
    if (cc->tpot_target_us && r->generated > 1) {
        double tpot = (double)(now - r->first_token_us) / (double)(r->generated - 1);
        if (tpot <= (double)cc->tpot_target_us)
            c->st.tpot_met++;
        else
            c->st.tpot_missed++;
    }
    sched_event e = ev_of(s, SCHED_EV_FINISH, r, now);
    e.finish = why;
    e.prompt_tokens = r->prompt_len;
    e.output_tokens = r->generated;
    e.wait_us = r->first_token_us ? r->first_token_us - r->arrival_us : 0;
    e.policy = sched_policy_hash_hex(s->policy);
    e.cached_tokens = r->cached_tokens;
    emit(s, &e);
    if (s->cfg.mode == SCHED_MODE_STATIC) {
        /* static batching holds the slot (and its padding) until the slowest member ends */
        r->held = true;
        return;
    }
    sc_detach(s, slot);
    sc_release_now(s, slot, now, false);
}

/* burst_gather: whether this step waits for more of a burst rather than start it. A burst
 * that finds nothing running — no decode waits on this step — reaches the scheduler as the
 * clients' submits come in; started at its first prompt, the rest of it waits for that
 * step's end (on a CPU: the whole prefill of the first prompts). So the first step waits
 * while prompts keep coming less than burst_gather apart, never longer than
 * burst_gather_max after the first; a lone prompt pays burst_gather once. Sets
 * plan.hold_until_us. */
static bool gather_holds(sched *s, uint64_t now)
{
    const sched_policy_cfg *p = &s->cfg;
    if (!p->burst_gather_us || !s->gathering || !s->n_waiting) return false;
    if (s->run.n || s->n_swapped || s->n_in_transit) return false;
    uint64_t until = s->gather_last_us + p->burst_gather_us;
    uint64_t cap = s->gather_first_us + p->burst_gather_max_us;
    if (cap < until) until = cap;
    if (now >= until) return false;
    s->plan.hold_until_us = until;
    cand c; /* said once per request: the head waits for its burst */
    if (sc_pick_candidate(s, now, 0, 0, &c))
        sc_emit_defer(s, &s->reqs[c.slot], SCHED_DEFER_BATCH, now);
    return true;
}

const sched_plan *sched_step(sched *s, uint64_t now)
{
    if (!s) {
        sched__set_error("sched_step: scheduler is NULL");
        return NULL;
    }
    if (now < s->last_now) now = s->last_now;
    uint64_t dt = s->step_no ? now - s->last_now : 0;
    s->last_now = now;
    s->step_no++;
    s->oom = false;

    /* slots released before this step may be reused from now on (plan pointers of the
     * previous step are dead) */
    for (uint32_t i = 0; i < s->limbo.n; i++) VEC_PUSH(s, s->free_slots, s->limbo.a[i]);
    s->limbo.n = 0;
    /* releases since the last step become this plan's; new ones append */
    {
        VEC(sched_release) t;
        memcpy(&t, &s->rel_plan, sizeof(t));
        memcpy(&s->rel_plan, &s->rel_acc, sizeof(t));
        memcpy(&s->rel_acc, &t, sizeof(t));
        s->rel_acc.n = 0;
    }
    s->entries.n = s->transfers.n = s->xfer_blocks.n = s->preempts.n = s->ended.n = 0;
    s->copies.n = s->snap_takes.n = s->snap_want.n = 0;
    s->victims_built = false;
    memset(&s->plan, 0, sizeof(s->plan));
    s->plan.now_us = now;
    s->plan.step_no = s->step_no;

    /* KV residency is charged to the tenant holding it, and the token rate refills */
    if (dt) {
        double secs = (double)dt / 1e6;
        for (int t = 0; t < s->n_tenants; t++) {
            tenant_state *ts = &s->ts[t];
            if (ts->kv_blocks)
                sc_charge(s, t, (double)ts->kv_blocks * secs * s->cfg.kv_charge_per_block_s, false);
            double rate = s->ten[t]->token_rate_per_s;
            if (rate > 0) {
                ts->bucket += rate * secs;
                if (ts->bucket > rate) ts->bucket = rate;
            }
        }
    }

    /* first samples past their first token: what their others did not claim goes back */
    if (s->resv_firsts.n) sc_group_settle(s);
    /* 1. release cancelled sequences */
    for (uint32_t i = 0; i < s->cancel_pending.n; i++)
        sc_release_now(s, s->cancel_pending.a[i], now, true);
    s->cancel_pending.n = 0;
    /* 2. timeouts: queue wait, deadlines, backpressure */
    while (s->timers.n && s->timers.a[0].k1 <= now) {
        uint32_t sl = s->timers.a[0].slot;
        req *r = &s->reqs[sl];
        sc_hremove(s, &s->timers, sl);
        if (r->state == SCHED_REQ_ENDED || r->held) continue;
        bool dl = r->deadline_us && r->deadline_us <= now;
        end_timeout(s, sl, dl ? SCHED_TIMEOUT_DEADLINE : SCHED_TIMEOUT_QUEUE_WAIT, now);
    }
    while (s->bp_timers.n && s->bp_timers.a[0].k1 <= now) {
        uint32_t sl = s->bp_timers.a[0].slot;
        sc_hremove(s, &s->bp_timers, sl);
        if (s->reqs[sl].state == SCHED_REQ_ENDED) continue;
        sc_do_cancel(s, sl, SCHED_CANCEL_BACKPRESSURE, now, true);
    }

    /* 3. the batch (or, gathering a burst, none yet) */
    if (!gather_holds(s, now)) switch (s->cfg.mode) {
        case SCHED_MODE_TOKEN_BUDGET: sc_step_token_budget(s, now); break;
        case SCHED_MODE_CONTINUOUS: sc_step_continuous(s, now); break;
        default: sc_step_group(s, now); break;
        }
    if (s->entries.n) s->gathering = false;

    /* seal the plan */
    for (uint32_t i = 0; i < s->transfers.n; i++) {
        sched_transfer *t = &s->transfers.a[i];
        t->src = s->xfer_blocks.a + (uintptr_t)t->src;
        t->dst = s->xfer_blocks.a + (uintptr_t)t->dst;
        if (t->n_ring_slots) t->ring_slots = s->xfer_blocks.a + (uintptr_t)t->ring_slots;
    }
    sched_plan *pl = &s->plan;
    pl->releases = s->rel_plan.a;
    pl->n_releases = s->rel_plan.n;
    pl->entries = s->entries.a;
    pl->n_entries = s->entries.n;
    sc_snap_seal(s);
    pl->ring_snapshots = s->snap_takes.a;
    pl->n_ring_snapshots = s->snap_takes.n;
    pl->transfers = s->transfers.a;
    pl->n_transfers = s->transfers.n;
    pl->preemptions = s->preempts.a;
    pl->n_preemptions = s->preempts.n;
    pl->ended = s->ended.a;
    pl->n_ended = s->ended.n;
    pl->copies = s->copies.a;
    pl->n_copies = s->copies.n;
    pl->predicted_step_us =
        pl->n_entries ? sc_predict_step_us(s, pl->prefill_tokens + pl->pad_tokens, pl->n_decode,
                                           pl->context_tokens, pl->prefill_pairs)
                      : 0;
    s->last_pred_us = pl->predicted_step_us;
    /* the rate measured over this step is a capacity figure only if work was left waiting;
     * the time since the last commit joins it only when this plan runs a batch (a plan of
     * nothing is the loop waiting — for a transfer, a rate limit, a group — not draining) */
    s->plan_backlogged = s->n_waiting > 0;
    if (!s->plan_backlogged || !pl->n_entries) s->rate_mark_us = 0;
    if (s->oom) {
        sched__set_error("sched_step: out of memory");
        return NULL;
    }
    return pl;
}

int sched_commit(sched *s, sched_result *res, size_t n, uint64_t now, uint64_t step_us)
{
    if (!s || (n && !res)) {
        sched__set_error("sched_commit: NULL argument");
        return -EINVAL;
    }
    if (now < s->last_now) now = s->last_now;
    s->commit_step_us = step_us; /* (cache.c: a recomputed cached run's realised cost) */
    uint64_t prefilled = 0;
    for (size_t i = 0; i < n; i++) {
        sched_finish_reason given = res[i].finished;
        res[i].finished = SCHED_FINISH_NONE; /* written back below when it ends here */
        uint32_t sl = map_get(s, res[i].req);
        if (sl == NO_SLOT) continue;
        req *r = &s->reqs[sl];
        if (r->entry_step != s->step_no || r->state != SCHED_REQ_RUNNING || r->held) continue;
        r->entry_step = 0;
        const sched_entry *e = &s->entries.a[r->entry_idx];
        if (r->rc_active) { /* the whole step's duration: it waited for all of it */
            if (step_us)
                r->rc_us += step_us;
            else
                r->rc_unknown = true;
        }
        if (e->samples && res[i].tokens == 0) continue; /* no token: no progress, replan */
        tenant_state *t = &s->ts[r->tenant];
        class_state *c = &s->cs[r->cls];
        r->computed += e->n_tokens;
        if (r->pcache) sc_cache_commit(s, r);
        sc_window_release(s, r); /* the blocks its window has passed (window.c) */
        if (r->rc_active && r->computed >= r->pre_len) sc_rc_end(s, r, SCHED_OUTCOME_DONE, now);
        if (e->prefill) {
            t->st.served_prompt_tokens += e->n_tokens;
            c->st.served_prompt_tokens += e->n_tokens;
            prefilled += e->n_tokens;
        }
        if (!e->samples) continue;
        r->generated++;
        if (r->pcache)
            sc_cache_token(s, r, s->conf.prefix_cache_generated && res[i].has_token, res[i].token);
        t->st.served_output_tokens++;
        c->st.served_output_tokens++;
        sc_charge(s, r->tenant, 1, true);
        if (!r->first_token_us) {
            r->first_token_us = now;
            uint64_t tt = s->cls[r->cls]->ttft_target_us;
            if (tt) {
                if (now - r->arrival_us <= tt)
                    c->st.ttft_met++;
                else
                    c->st.ttft_missed++;
            }
        }
        sched_finish_reason f = given == SCHED_FINISH_STOP ? SCHED_FINISH_STOP : SCHED_FINISH_NONE;
        if (!f && (given == SCHED_FINISH_LENGTH || r->generated >= r->max_new ||
                   known(r) >= s->conf.max_context))
            f = SCHED_FINISH_LENGTH;
        if (f) finish(s, sl, f, now);
        res[i].finished = f;
    }
    sc_observe_step(s, now, prefilled, step_us);
    return s->oom ? -ENOMEM : 0;
}

void sched_get_counts(const sched *s, sched_counts *o)
{
    if (!o) return;
    memset(o, 0, sizeof(*o));
    if (!s) return;
    o->waiting = s->n_waiting;
    o->running = s->run.n;
    o->swapped = s->n_swapped;
    o->in_transit = s->n_in_transit;
    o->blocked = s->n_blocked;
    o->queued_tokens = s->queued_tokens;
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        o->kv_total[p] = s->pools[p].total;
        o->kv_free[p] = s->pools[p].n_free;
        o->kv_used[p] = s->pools[p].total - s->pools[p].n_free;
    }
    o->steps = s->step_no;
    o->cost_correction = s->corr;
    o->transfers_measured = s->xfer_measured;
    o->transfer_predicted_us_sum = s->xfer_pred_sum;
    o->transfer_measured_us_sum = s->xfer_real_sum;
    if (s->px) {
        sched_prefix_stats st;
        sched_prefix_get_stats(s->px, &st);
        for (int p = 0; p < SCHED_POOL__COUNT; p++) { /* unheld cached blocks count as free */
            o->kv_cached[p] = st.unheld[p];
            o->kv_free[p] += st.unheld[p];
            o->kv_used[p] -= st.unheld[p];
        }
        o->prefix_query_tokens = s->px_query;
        o->prefix_hit_tokens = s->px_hit;
        o->prefix_self_tokens = s->px_self;
        o->prefix_evicted_blocks = s->px_evicted;
        o->ring_snapshots = sc_snap_held(s);
        o->ring_snapshots_taken = s->snap_taken;
        o->ring_snapshot_hits = s->snap_hits;
        o->ring_snapshots_dropped = s->snap_dropped;
        for (int p = 0; p < SCHED_POOL__COUNT; p++) {
            o->prefix_blocks[p] = st.cached[p];
            o->prefix_hit_pool_tokens[p] = s->px_hit_pool[p];
            o->prefix_self_pool_tokens[p] = s->px_self_pool[p];
            o->prefix_demoted_blocks[p] = s->px_demoted[p];
            o->prefix_reloaded_blocks[p] = s->px_reloaded[p];
            o->prefix_recomputed_blocks[p] = s->px_recomputed[p];
        }
    }
}

int sched_get_tenant_stats(const sched *s, int t, sched_group_stats *o)
{
    if (!s || !o || t < 0 || t >= s->n_tenants) return -ENOENT;
    *o = s->ts[t].st;
    o->kv_blocks = s->ts[t].kv_blocks;
    o->virtual_tokens = s->ts[t].vt;
    return 0;
}

int sched_get_class_stats(const sched *s, int c, sched_group_stats *o)
{
    if (!s || !o || c < 0 || c >= s->n_classes) return -ENOENT;
    *o = s->cs[c].st;
    o->admit_headroom = s->cs[c].headroom;
    uint32_t kv = 0;
    for (uint32_t i = 0; i < s->run.n; i++)
        if (s->reqs[s->run.a[i]].cls == c) kv += dev_held(&s->reqs[s->run.a[i]]);
    o->kv_blocks = kv;
    return 0;
}

int sched_get_request(const sched *s, uint64_t id, sched_req_info *o)
{
    if (!s || !o) return -EINVAL;
    uint32_t sl = map_get(s, id);
    if (sl == NO_SLOT) return -ENOENT;
    const req *r = &s->reqs[sl];
    memset(o, 0, sizeof(*o));
    o->state = (sched_req_state)r->state;
    o->tenant = r->tenant;
    o->class_idx = r->cls;
    o->prompt_len = r->prompt_len;
    o->generated = r->generated;
    o->computed = r->computed;
    o->blocks[SCHED_POOL_DEVICE] = dev_held(r);
    o->released_blocks = r->n_rel;
    if (r->n_tier) o->blocks[r->tier] = r->n_tier + r->n_tier_ring;
    o->preemptions = r->preemptions;
    o->arrival_us = r->arrival_us;
    o->first_token_us = r->first_token_us;
    o->output_blocked = r->blocked;
    o->cached_tokens = r->cached_tokens;
    return 0;
}

int sched_check_invariants(const sched *s, char *why, size_t len)
{
#define BAD(...)                                                                                   \
    do {                                                                                           \
        if (why && len) snprintf(why, len, __VA_ARGS__);                                           \
        rc = -EUCLEAN;                                                                             \
        goto out;                                                                                  \
    } while (0)
    int rc = 0;
    uint32_t *seen[SCHED_POOL__COUNT] = {0}; /* holders (shared cached blocks: many) */
    if (!s) return -EINVAL;
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        seen[p] = calloc(s->pools[p].total + 1, sizeof(uint32_t));
        if (!seen[p]) {
            rc = -ENOMEM;
            goto out;
        }
        if (s->pools[p].n_free > s->pools[p].total)
            BAD("pool %s: %u free of %u", sched_pool_name((sched_pool)p), s->pools[p].n_free,
                s->pools[p].total);
        for (uint32_t i = 0; i < s->pools[p].n_free; i++) {
            uint32_t b = s->pools[p].free_ids[i];
            if (b >= s->pools[p].total || seen[p][b]++)
                BAD("pool %s: block %u free twice or out of range", sched_pool_name((sched_pool)p),
                    b);
        }
    }
    if (s->bad_transitions)
        BAD("%llu illegal state transitions, the first of request %llu: %u -> %u",
            (unsigned long long)s->bad_transitions, (unsigned long long)s->bad_req, s->bad_from,
            s->bad_to);
    /* window rings: each free once, or held by one sequence that holds device blocks */
    uint32_t rings_held = 0;
    uint8_t *ring_seen = calloc(s->rings.total + 1, 1);
    if (!ring_seen) {
        rc = -ENOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < s->rings.n_free; i++)
        if (s->rings.free_ids[i] >= s->rings.total || ring_seen[s->rings.free_ids[i]]++) {
            free(ring_seen);
            BAD("window ring %u free twice or out of range", s->rings.free_ids[i]);
        }
    for (uint32_t i = 0; i < s->n_slots; i++) {
        const req *r = &s->reqs[i];
        if (r->ring == SCHED_BLOCK_NONE || (!r->live && !r->n_dev)) continue;
        rings_held++;
        if (r->ring >= s->rings.total || ring_seen[r->ring]++ || !r->n_dev) {
            free(ring_seen);
            BAD("request %llu holds window ring %u: %s", (unsigned long long)r->id, r->ring,
                r->n_dev ? "free, shared or out of range" : "but no device block");
        }
    }
    free(ring_seen);
    if (s->conf.window_rings && rings_held + s->rings.n_free != s->rings.total)
        BAD("window rings: %u held + %u free of %u", rings_held, s->rings.n_free, s->rings.total);
    uint32_t kv[SCHED_MAX_TENANTS] = {0}, live[SCHED_MAX_TENANTS] = {0};
    uint64_t qt[SCHED_MAX_TENANTS] = {0}, qtot = 0;
    uint32_t nwait = 0, nrun = 0, nswap = 0, ntransit = 0, nparked = 0;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        const req *r = &s->reqs[i];
        if (!r->live && !(r->state == SCHED_REQ_ENDED && r->n_dev + r->n_tier > 0)) continue;
        if (!r->live)
            BAD("request %llu released but still holds %u+%u blocks", (unsigned long long)r->id,
                r->n_dev, r->n_tier);
        live[r->tenant]++;
        for (uint32_t b = 0; b < r->n_dev; b++) {
            uint32_t id = r->dev[b];
            if (id == SCHED_BLOCK_NONE) continue; /* given back behind its window */
            if (id >= s->pools[0].total || (seen[0][id]++ && !s->px)) /* cache: checked below */
                BAD("device block %u of request %llu is free or shared", id,
                    (unsigned long long)r->id);
        }
        for (uint32_t b = 0; b < r->n_tier + r->n_tier_ring; b++) { /* blocks, then ring */
            uint32_t id = r->tierb[b];
            if (id >= s->pools[r->tier].total || seen[r->tier][id]++)
                BAD("%s block %u of request %llu is free or shared",
                    sched_pool_name((sched_pool)r->tier), id, (unsigned long long)r->id);
        }
        if ((rc = sc_window_check(s, r, why, len))) goto out;
        kv[r->tenant] += dev_held(r);
        if (r->parked) {
            nparked++;
            if (!r->blocked || (r->state != SCHED_REQ_WAITING && r->state != SCHED_REQ_SWAPPED))
                BAD("parked request %llu is %s", (unsigned long long)r->id,
                    r->blocked ? "neither waiting nor swapped" : "not blocked");
        }
        switch (r->state) {
        case SCHED_REQ_WAITING:
            if (r->parked) {
                if (r->n_dev)
                    BAD("parked request %llu holds %u device blocks", (unsigned long long)r->id,
                        r->n_dev);
                break;
            }
            nwait++;
            qt[r->tenant] += known(r);
            qtot += known(r);
            if (r->n_dev)
                BAD("waiting request %llu holds %u device blocks", (unsigned long long)r->id,
                    r->n_dev);
            break;
        case SCHED_REQ_RUNNING:
            nrun++;
            if (r->run_pos < 0 || (uint32_t)r->run_pos >= s->run.n || s->run.a[r->run_pos] != i)
                BAD("running request %llu not in the run list", (unsigned long long)r->id);
            break;
        case SCHED_REQ_SWAPPED: nswap++; break;
        default: break;
        }
        if (r->moving)
            ntransit++;
        else if (r->state == SCHED_REQ_SWAPPING_IN || r->state == SCHED_REQ_SWAPPING_OUT)
            BAD("request %llu is moving by state but has no transfer in flight",
                (unsigned long long)r->id);
        if (map_get(s, r->id) != i) BAD("request %llu not found by id", (unsigned long long)r->id);
    }
    if ((rc = sc_cow_check(s, seen[SCHED_POOL_DEVICE], why, len))) goto out;
    if ((rc = sc_group_check(s, why, len))) goto out;
    if (s->px && (rc = sc_cache_check(s, seen[SCHED_POOL_DEVICE], why, len))) goto out;
    if ((rc = sc_order_check(s, why, len))) goto out;
    if ((rc = sc_snap_check(s, why, len))) goto out;
    for (int p = s->px ? SCHED_POOL_DEVICE + 1 : 0; p < SCHED_POOL__COUNT; p++)
        for (uint32_t b = 0; b < s->pools[p].total; b++) {
            /* a host or disk block may be a cached node's instead */
            uint32_t n = seen[p][b] + (s->px && sched_prefix_node_of(s->px, (sched_pool)p, b) !=
                                                    SCHED_PREFIX_NONE);
            if (n != 1)
                BAD("pool %s: block %u is %s", sched_pool_name((sched_pool)p), b,
                    n ? "owned twice" : "neither free nor owned (leaked)");
        }
    for (int t = 0; t < s->n_tenants; t++) {
        if (kv[t] != s->ts[t].kv_blocks)
            BAD("tenant %s: counter says %u device blocks, sequences hold %u", s->ten[t]->name,
                s->ts[t].kv_blocks, kv[t]);
        if (qt[t] != s->ts[t].st.queued_tokens)
            BAD("tenant %s: counter says %llu queued tokens, queue holds %llu", s->ten[t]->name,
                (unsigned long long)s->ts[t].st.queued_tokens, (unsigned long long)qt[t]);
        if (live[t] != s->ts[t].n_live)
            BAD("tenant %s: %u live by counter, %u by scan", s->ten[t]->name, s->ts[t].n_live,
                live[t]);
    }
    if (qtot != s->queued_tokens)
        BAD("queued tokens %llu by counter, %llu by scan", (unsigned long long)s->queued_tokens,
            (unsigned long long)qtot);
    if (nparked != s->n_parked)
        BAD("parked requests %u by counter, %u by scan", s->n_parked, nparked);
    if (nwait != s->n_waiting || nrun != s->run.n || nswap != s->n_swapped ||
        ntransit != s->n_in_transit)
        BAD("counts waiting %u/%u running %u/%u swapped %u/%u transit %u/%u (counter/scan)",
            s->n_waiting, nwait, s->run.n, nrun, s->n_swapped, nswap, s->n_in_transit, ntransit);
out:
    for (int p = 0; p < SCHED_POOL__COUNT; p++) free(seen[p]);
    return rc;
#undef BAD
}
