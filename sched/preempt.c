/* SPDX-License-Identifier: MIT */
/* preempt.c — preemption: victim order, swap or recompute by the cost model, the transfers
 * it plans and their completion (sched_transfer_done), the realised-cost records. */
#include "sched/internal.h"

/* The recompute realised-cost event: predicted = recompute_cost_us at preemption, realised =
 * the summed full durations of the steps its re-prefill took part in (null when a step had
 * no measured duration).  reason "done" when the re-prefill reached the length it had, or
 * "abandoned" when it ended or was preempted again first (realised so far). */
void sc_rc_end(sched *s, req *r, sched_outcome how, uint64_t now)
{
    r->rc_active = false;
    sched_event e = ev_of(s, SCHED_EV_RECOMPUTE, r, now);
    e.outcome = how;
    e.mode = SCHED_PREEMPT_RECOMPUTE;
    e.tokens = r->pre_len;
    e.predicted_us = r->pre_rc_us;
    e.realised_us = r->rc_unknown ? -1 : (double)r->rc_us;
    emit(s, &e);
}

/* Its KV is gone (recompute preemption, or a failed swap): time the re-prefill from now. */
static void rc_start(sched *s, req *r, uint64_t now)
{
    r->rc_us = 0;
    r->rc_unknown = false;
    r->rc_active = true;
    if (!r->pre_len)
        sc_rc_end(s, r, SCHED_OUTCOME_DONE, now); /* nothing computed, nothing to redo */
}

/* Victim order: lowest class first, then least work lost (fewest computed tokens), then the
 * newest.  Continuous mode (the baseline) simply takes the newest arrival. */
static int victim_cmp(const void *a, const void *b, void *ctx)
{
    const sched *s = ctx;
    const req *x = &s->reqs[*(const uint32_t *)a], *y = &s->reqs[*(const uint32_t *)b];
    if (x->blocked != y->blocked) return x->blocked ? -1 : 1; /* a client that does not read */
    if (s->cfg.mode != SCHED_MODE_CONTINUOUS) {
        int32_t px = s->cls[x->cls]->priority, py = s->cls[y->cls]->priority;
        if (px != py) return px < py ? -1 : 1;
        if (x->computed != y->computed) return x->computed < y->computed ? -1 : 1;
    }
    if (x->arrival_us != y->arrival_us) return x->arrival_us > y->arrival_us ? -1 : 1;
    return x->id > y->id ? -1 : (x->id < y->id);
}

static bool victim_eligible(const sched *s, const req *r, uint64_t now)
{
    if (r->state != SCHED_REQ_RUNNING || r->held) return false;
    /* output-blocked: it cannot use its blocks until its client reads, however little it
     * has run or often it was preempted */
    if (r->blocked) return true;
    if (s->cfg.mode == SCHED_MODE_CONTINUOUS || s->forced) return true;
    if (s->cfg.max_preemptions && r->preemptions >= s->cfg.max_preemptions) return false;
    if (r->resumed_at && now - r->resumed_at < s->cfg.min_residency_us) return false;
    return true;
}

static void build_victims(sched *s, uint64_t now)
{
    s->victims.n = 0;
    s->victim_next = 0;
    for (uint32_t i = 0; i < s->run.n; i++)
        if (victim_eligible(s, &s->reqs[s->run.a[i]], now)) VEC_PUSH(s, s->victims, s->run.a[i]);
    if (s->victims.n > 1) qsort_r(s->victims.a, s->victims.n, sizeof(uint32_t), victim_cmp, s);
    s->victims_built = true;
}

/* Next victim for `needer` (restricted to tenant `only_tenant` when >= 0).  Returns the
 * needer itself when every remaining candidate ranks above it and it is eligible, NO_SLOT when
 * nothing may be preempted. */
uint32_t sc_pick_victim(sched *s, uint32_t needer, int only_tenant, uint64_t now)
{
    if (!s->victims_built) build_victims(s, now);
    const req *n = &s->reqs[needer];
    for (uint32_t i = s->victim_next; i < s->victims.n; i++) {
        uint32_t v = s->victims.a[i];
        const req *r = &s->reqs[v];
        if (r->state != SCHED_REQ_RUNNING || !victim_eligible(s, r, now)) {
            if (i == s->victim_next) s->victim_next++;
            continue;
        }
        if (only_tenant >= 0 && r->tenant != only_tenant) continue;
        if (v == needer) return v;
        if (s->cfg.mode != SCHED_MODE_CONTINUOUS && !r->blocked &&
            s->cls[r->cls]->priority > s->cls[n->cls]->priority)
            break; /* everything left ranks above the needer */
        return v;
    }
    return victim_eligible(s, n, now) ? needer : NO_SLOT;
}

/* Pick the tier a swap-out would use: host first (fastest), disk when the host is full.
 * false: no tier has room. */
static bool swap_tier(const sched *s, uint32_t blocks, sched_pool *tier)
{
    /* (cached blocks no sequence holds give way: sc_tier_make_room) */
    if (s->pools[SCHED_POOL_HOST].total && sc_tier_available(s, SCHED_POOL_HOST) >= blocks)
        *tier = SCHED_POOL_HOST;
    else if (s->pools[SCHED_POOL_DISK].total && sc_tier_available(s, SCHED_POOL_DISK) >= blocks)
        *tier = SCHED_POOL_DISK;
    else
        return false;
    return true;
}

void sc_plan_transfer(sched *s, uint32_t slot, sched_xfer_dir dir, uint64_t now)
{
    req *r = &s->reqs[slot];
    uint32_t n = r->n_tier, k = r->n_tier_ring; /* its blocks' slots; its window ring's */
    uint64_t bytes = (uint64_t)n * s->conf.block_size * s->conf.kv_bytes_per_token +
                     (k ? s->conf.window_ring_bytes : 0);
    const tier_est *te = &s->tiers[r->tier];
    double pred = dir == SCHED_XFER_OUT
                      ? ((double)te->queued_out + (double)bytes) / te->out_bps * 1e6
                      : ((double)te->queued_in + (double)bytes) / te->in_bps * 1e6;
    pred += te->lat_us;
    xfer_rec x = {.id = s->next_xfer++,
                  .slot = slot,
                  .dir = (uint8_t)dir,
                  .tier = r->tier,
                  .bytes = bytes,
                  .pred_us = pred};
    r->xfer = x.id;
    r->moving = true;
    VEC_PUSH(s, s->xfers, x);
    uint32_t off = s->xfer_blocks.n;
    if (!sc_vec_grow((void **)&s->xfer_blocks.a, &s->xfer_blocks.cap, off + 2 * n + k,
                     sizeof(uint32_t))) {
        s->oom = true;
        return;
    }
    /* the device blocks it holds, in table order (entries its window gave back are not
     * copied either way: window.c) */
    uint32_t *dev = s->xfer_blocks.a + off + (dir == SCHED_XFER_OUT ? 0 : n);
    uint32_t *tier = s->xfer_blocks.a + off + (dir == SCHED_XFER_OUT ? n : 0);
    memcpy(tier, r->tierb, n * sizeof(uint32_t));
    for (uint32_t i = 0, j = 0; i < r->n_dev && j < n; i++)
        if (r->dev[i] != SCHED_BLOCK_NONE) dev[j++] = r->dev[i];
    memcpy(s->xfer_blocks.a + off + 2 * n, r->tierb + n, k * sizeof(uint32_t)); /* the ring's */
    s->xfer_blocks.n = off + 2 * n + k; /* the next transfer of this plan goes after these */
    sched_transfer t = {.id = x.id,
                        .req = r->id,
                        .dir = dir,
                        .tier = (sched_pool)r->tier,
                        .n_blocks = n,
                        .bytes = bytes,
                        .predicted_us = pred,
                        .src_pool =
                            dir == SCHED_XFER_OUT ? SCHED_POOL_DEVICE : (sched_pool)r->tier};
    /* pointers fixed up when the plan is sealed (xfer_blocks may still move) */
    t.src = (const uint32_t *)(uintptr_t)off;
    t.dst = (const uint32_t *)(uintptr_t)(off + n);
    if (k) { /* its window ring: the one it holds (out), or took for the swap-in (in) */
        t.ring = r->ring;
        t.n_ring_slots = k;
        t.ring_slots = (const uint32_t *)(uintptr_t)(off + 2 * n);
    }
    VEC_PUSH(s, s->transfers, t);
    if (dir == SCHED_XFER_OUT)
        s->tiers[r->tier].queued_out += bytes;
    else
        s->tiers[r->tier].queued_in += bytes;
    s->n_in_transit++;
    sched_event e = ev_of(s, dir == SCHED_XFER_OUT ? SCHED_EV_SWAP_OUT : SCHED_EV_SWAP_IN, r, now);
    e.xfer = x.id;
    e.blocks = n;
    e.bytes = bytes;
    e.pool = (sched_pool)r->tier;
    emit(s, &e);
}

/* Recompute preemption: drop the KV now, go back to the queue at the original place. */
static void to_recompute(sched *s, uint32_t slot, uint64_t now)
{
    req *r = &s->reqs[slot];
    sc_dev_free_all(s, r);
    r->computed = 0;
    r->recompute = true;
    sc_waiting_add(s, slot);
    rc_start(s, r, now);
    sc_park(s, slot);
}

/* ---- output-blocked sequences ---------------------------------------------------------
 *
 * A client that stops reading its events blocks its sequences (sched_set_output_blocked):
 * they are not scheduled, but before they held their device blocks until the backpressure
 * timeout — hundreds of them held nearly the whole pool while everyone else waited. Now
 * blocked sequences are the first victims whenever blocks run short (for a decode, a prefill
 * chunk or an admission), whatever their class, residency or preemption count: swapped out
 * or dropped for recompute by the same cost model, their tenant charged for the way back.
 * While still blocked they wait parked, out of every queue, so they are not taken up again
 * just to block once more; the client's first read queues them (sc_unpark), and the swap-in
 * or re-prefill brings them back — the tokens they generated are the daemon's, and none is
 * lost. */

void sc_park(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    if (!r->blocked || r->parked) return;
    if (r->state == SCHED_REQ_WAITING)
        sc_waiting_remove(s, slot);
    else if (r->state == SCHED_REQ_SWAPPED)
        sc_hremove(s, &s->cs[r->cls].swapped, slot);
    else
        return;
    r->parked = true;
    s->n_parked++;
}

void sc_unpark(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    if (!r->parked) return;
    r->parked = false;
    s->n_parked--;
    if (r->state == SCHED_REQ_WAITING)
        sc_waiting_enqueue(s, slot);
    else if (r->state == SCHED_REQ_SWAPPED)
        sc_hpush(s, &s->cs[r->cls].swapped, r->arrival_us, r->id, slot);
}

uint32_t sc_reclaim_blocked(sched *s, uint32_t want, uint64_t now)
{
    uint32_t n = 0;
    while (s->n_blocked && !s->oom && sc_dev_available(s) + s->pending_out_blocks < want) {
        uint32_t v = NO_SLOT;
        for (uint32_t i = 0; i < s->run.n; i++) {
            uint32_t sl = s->run.a[i];
            const req *r = &s->reqs[sl], *b = v != NO_SLOT ? &s->reqs[v] : NULL;
            if (!r->blocked || r->held || !dev_held(r) || r->entry_step == s->step_no) continue;
            if (!b || r->blocked_since < b->blocked_since ||
                (r->blocked_since == b->blocked_since && dev_held(r) > dev_held(b)))
                v = sl;
        }
        if (v == NO_SLOT) break;
        sc_preempt(s, v, false, now);
        n++;
    }
    return n;
}

/* Preempt `slot` (a RUNNING sequence).  Returns the blocks freed immediately (recompute) or 0
 * (swap: freed when the transfer completes; timeout: released now and counted). */
uint32_t sc_preempt(sched *s, uint32_t slot, bool quota, uint64_t now)
{
    req *r = &s->reqs[slot];
    uint32_t blocks = dev_held(r); /* a windowed sequence's window: all it swaps */
    /* with window rings its ring goes too: only the last window of its windowed layers,
     * whatever its length, in tier slots of a block's bytes */
    uint32_t ring_slots = r->ring != SCHED_BLOCK_NONE ? s->ring_tier_slots : 0;
    uint64_t bytes = (uint64_t)blocks * s->conf.block_size * s->conf.kv_bytes_per_token +
                     (ring_slots ? s->conf.window_ring_bytes : 0);
    sched_pool tier = SCHED_POOL_HOST;
    bool can_swap = s->cfg.mode != SCHED_MODE_CONTINUOUS &&
                    s->cfg.preemption != SCHED_PREEMPT_RECOMPUTE &&
                    swap_tier(s, blocks + ring_slots, &tier);
    double sw = can_swap ? sc_swap_cost_us(s, tier, bytes) : -1;
    double rc = sc_prefill_us(s, r->computed);
    if (s->run.n > 1)
        rc += sc_prefill_us(s, r->computed); /* stall: each other sequence waits
                                                             through the re-prefill's steps */
    bool swap = can_swap && (s->cfg.preemption == SCHED_PREEMPT_SWAP || sw < rc);
    if (swap && !sc_tier_make_room(s, tier, blocks + ring_slots))
        swap = false; /* counted available: cannot fail */
    double best = swap ? sw : rc;
    if (r->rc_active)
        sc_rc_end(s, r, SCHED_OUTCOME_ABANDONED, now); /* before this preemption's events */
    r->pre_sw_us = sw;
    r->pre_rc_us = rc;
    r->pre_len = r->computed;
    r->out_us = 0;
    sc_run_remove(s, slot);
    r->skip_pass = s->pass_no;
    r->preempt_step = s->step_no;
    r->preemptions++;
    r->defer = SCHED_DEFER_NONE;
    sched_event e = ev_of(s, SCHED_EV_PREEMPT, r, now);
    e.defer = r->blocked ? SCHED_DEFER_BACKPRESSURE
              : quota    ? SCHED_DEFER_QUOTA
                         : SCHED_DEFER_BLOCKS;
    e.mode = swap ? SCHED_PREEMPT_SWAP : SCHED_PREEMPT_RECOMPUTE;
    e.blocks = blocks;
    e.swap_cost_us = sw;
    e.recompute_cost_us = rc;
    VEC_PUSH(s, s->preempts,
             ((sched_preemption){r->id, swap ? SCHED_PREEMPT_SWAP : SCHED_PREEMPT_RECOMPUTE, blocks,
                                 sw, rc}));
    if (r->deadline_us && (double)now + best > (double)r->deadline_us) {
        /* neither way brings it back in time: say so now instead of wasting the work */
        e.mode = SCHED_PREEMPT_NONE;
        emit(s, &e);
        s->preempts.n--;
        r->end_kind = SCHED_EV_TIMEOUT;
        s->ts[r->tenant].st.timeouts[SCHED_TIMEOUT_PREEMPT]++;
        s->cs[r->cls].st.timeouts[SCHED_TIMEOUT_PREEMPT]++;
        sched_event t = ev_of(s, SCHED_EV_TIMEOUT, r, now);
        t.timeout = SCHED_TIMEOUT_PREEMPT;
        t.wait_us = now - r->arrival_us;
        emit(s, &t);
        VEC_PUSH(s, s->ended,
                 ((sched_ended){
                     .req = r->id, .kind = SCHED_EV_TIMEOUT, .timeout = SCHED_TIMEOUT_PREEMPT}));
        sc_set_state(s, r, SCHED_REQ_ENDED);
        sc_release_now(s, slot, now, true);
        return blocks;
    }
    emit(s, &e);
    if (r->blocked) {
        /* its client's not reading costs the way back: a re-prefill (otherwise not charged,
         * sequences do not choose to lose their work) or the swap, in re-prefill tokens */
        double frac = rc > 0 && best < rc ? best / rc : 1;
        sc_charge(s, r->tenant, (double)r->computed * frac, false);
    }
    if (swap) {
        s->ts[r->tenant].st.preemptions_swap++;
        s->cs[r->cls].st.preemptions_swap++;
        r->tier = (uint8_t)tier;
        if (!sc_vec_grow((void **)&r->tierb, &r->cap_tier, blocks + ring_slots, sizeof(uint32_t))) {
            s->oom = true;
            return 0;
        }
        for (uint32_t i = 0; i < blocks + ring_slots; i++) r->tierb[i] = pool_take(&s->pools[tier]);
        r->n_tier = blocks;
        r->n_tier_ring = ring_slots;
        sc_set_state(s, r, SCHED_REQ_SWAPPING_OUT);
        s->pending_out_blocks += blocks;
        s->ts[r->tenant].pending_out += blocks;
        sc_plan_transfer(s, slot, SCHED_XFER_OUT, now);
        return 0;
    }
    s->ts[r->tenant].st.preemptions_recompute++;
    s->cs[r->cls].st.preemptions_recompute++;
    to_recompute(s, slot, now);
    return blocks;
}

int sched_transfer_done(sched *s, uint64_t id, uint64_t now, uint64_t bytes, uint64_t dur_us,
                        int status)
{
    if (!s) return -EINVAL;
    uint32_t i;
    for (i = 0; i < s->xfers.n; i++)
        if (s->xfers.a[i].id == id) break;
    if (i == s->xfers.n) {
        sched__set_error("sched_transfer_done: transfer %llu unknown or already done",
                         (unsigned long long)id);
        return -ENOENT;
    }
    xfer_rec x = s->xfers.a[i];
    memmove(s->xfers.a + i, s->xfers.a + i + 1, (s->xfers.n - i - 1) * sizeof(xfer_rec));
    s->xfers.n--;
    if (x.cache)
        return sc_cache_xfer_done(s, &x, now, bytes, dur_us, status); /* a prefix-cache copy */
    s->n_in_transit--;
    tier_est *te = &s->tiers[x.tier];
    if (x.dir == SCHED_XFER_OUT)
        te->queued_out -= x.bytes;
    else
        te->queued_in -= x.bytes;
    sc_observe_transfer(s, &x, bytes, dur_us, status);
    req *r = &s->reqs[x.slot];
    r->moving = false;
    {
        /* realised cost: swap_out — this transfer, predicted vs measured; swap_in — the round
         * trip, swap_cost_us at preemption vs measured out + in (null when either unknown) */
        bool out = x.dir == SCHED_XFER_OUT;
        sched_event e = ev_of(s, out ? SCHED_EV_SWAP_OUT : SCHED_EV_SWAP_IN, r, now);
        e.outcome = sc_xfer_outcome(status);
        e.mode = SCHED_PREEMPT_SWAP;
        e.xfer = x.id;
        e.blocks = r->n_tier;
        e.bytes = x.bytes;
        e.pool = (sched_pool)x.tier;
        if (out) {
            r->out_us = status == 0 ? dur_us : 0;
            e.predicted_us = x.pred_us;
            e.realised_us = dur_us ? (double)dur_us : -1;
        } else {
            e.predicted_us = r->pre_sw_us;
            e.realised_us = r->out_us && dur_us ? (double)(r->out_us + dur_us) : -1;
        }
        emit(s, &e);
    }
    if (x.dir == SCHED_XFER_IN) {
        s->n_swapping_in--;
        s->ts[r->tenant].moving_in--;
    } else {
        s->pending_out_blocks -= dev_held(r);
        s->ts[r->tenant].pending_out -= dev_held(r);
    }
    if (r->state == SCHED_REQ_ENDED) { /* cancelled or timed out while moving */
        sc_release_now(s, x.slot, now, false);
        return 0;
    }
    if (x.dir == SCHED_XFER_OUT) {
        if (status >= 0) sc_window_swapped_out(r); /* the table's shape, for the way back */
        sc_dev_free_all(s, r);
        if (status < 0) { /* the copy failed: the host copy is useless, recompute */
            sc_tier_free_all(s, r);
            r->computed = 0;
            r->recompute = true;
            sc_waiting_add(s, x.slot);
            rc_start(s, r, now);
            sc_park(s, x.slot);
            return 0;
        }
        sc_set_state(s, r, SCHED_REQ_SWAPPED);
        s->n_swapped++;
        sc_hpush(s, &s->cs[r->cls].swapped, r->arrival_us, r->id, x.slot);
        sc_park(s, x.slot); /* still not read: it waits out of the queue */
        return 0;
    }
    sc_tier_free_all(s, r);
    if (status < 0) {
        /* The device copy is garbage: back to the queue for a re-prefill, its device blocks
         * given back, as after a failed swap-out. Not in place, in the blocks the swap-in
         * took: a decoder is swapped out when it needs its next block, so its re-prefill
         * needs one block more than came back, and a sequence part-way through a prefill
         * takes free blocks only (it preempts no one) — two of them holding the pool between
         * them waited for each other for ever. Admission reserves every block it needs. */
        sc_dev_free_all(s, r);
        r->computed = 0;
        r->recompute = true;
        sc_waiting_add(s, x.slot);
        rc_start(s, r, now);
        sc_park(s, x.slot);
        return 0;
    }
    r->resumed_at = now;
    sc_run_add(s, x.slot);
    sched_event e = ev_of(s, SCHED_EV_SCHEDULE, r, now);
    e.outcome = SCHED_OUTCOME_RESUME;
    e.blocks = dev_held(r);
    e.wait_us = now - r->arrival_us;
    emit(s, &e);
    return 0;
}
