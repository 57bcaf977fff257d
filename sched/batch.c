/* SPDX-License-Identifier: MIT */
/* batch.c — the batching modes: token budget (decodes, chunked prefill, admissions under a
 * budget), continuous (the FCFS baseline) and the static/dynamic request-level groups. */
#include "sched/internal.h"

static void add_entry(sched *s, uint32_t slot, uint32_t n, bool prefill)
{
    req *r = &s->reqs[slot];
    uint32_t k = known(r);
    sched_entry e = {
        .req = r->id,
        .start_pos = r->computed,
        .n_tokens = n,
        .samples = r->computed + n >= k,
        .prefill = prefill,
        .tenant = r->tenant,
        .class_idx = r->cls,
        .n_blocks = div_up((uint64_t)r->computed + n, s->conf.block_size),
        .blocks = r->dev,
        .ring = r->ring,
    };
    sc_snap_entry(s, r, &e); /* ring snapshots to restore before it or take after it */
    r->entry_step = s->step_no;
    r->entry_idx = s->entries.n;
    r->defer = SCHED_DEFER_NONE;
    VEC_PUSH(s, s->entries, e);
    s->plan.context_tokens += sc_context_charge(s, (uint64_t)r->computed + n);
    if (prefill) {
        s->plan.n_prefill++;
        s->plan.prefill_tokens += n;
        /* each row attends to those before it (sched_plan_work.prefill_pairs) */
        s->plan.prefill_pairs += sc_pairs_charge(s, r->computed, n);
        /* prompt work is charged when it is scheduled: fair share follows the compute given.
         * Re-prefill after a recompute preemption is not charged again: the tenant did not
         * choose to lose that work. */
        uint32_t end = r->computed + n;
        uint32_t fresh = end > r->charged_upto
                             ? end - (r->computed > r->charged_upto ? r->computed : r->charged_upto)
                             : 0;
        if (end > r->charged_upto) r->charged_upto = end;
        sc_charge(s, r->tenant, fresh, true);
    } else {
        s->plan.n_decode++;
        s->plan.decode_tokens += n;
    }
}

/* Give every running decoder its token (latency-sensitive classes first), growing block
 * tables and preempting when blocks run out.  Returns decode tokens planned; *ls_decoding
 * says whether a latency-sensitive sequence decodes; *tpot_min the tightest TPOT target. */
static uint32_t plan_decodes(sched *s, uint64_t now, uint32_t budget, bool *ls_decoding,
                             uint64_t *tpot_min)
{
    s->dec.n = 0;
    s->pass_no++;
    bool ls_first = s->cfg.mode == SCHED_MODE_TOKEN_BUDGET;
    /* When the budget cannot hold every decoder, who waits rotates step by step (the start
     * of the scan moves), so no running sequence is skipped forever. */
    uint32_t start = s->run.n ? (uint32_t)(s->step_no % s->run.n) : 0;
    for (int pass = 0; pass < (ls_first ? 2 : 1); pass++)
        for (uint32_t j = 0; j < s->run.n; j++) {
            uint32_t i = start + j < s->run.n ? start + j : start + j - s->run.n;
            uint32_t sl = s->run.a[i];
            req *r = &s->reqs[sl];
            if (r->blocked || r->held || !is_decoder(r)) continue;
            if (ls_first && s->cls[r->cls]->latency_sensitive != (pass == 0)) continue;
            VEC_PUSH(s, s->dec, sl);
        }
    uint32_t n = s->dec.n < budget ? s->dec.n : budget;
    uint64_t pending = s->pending_out_blocks;
    for (int t = 0; t < s->n_tenants; t++) s->ts[t].pend_step = s->ts[t].pending_out;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t sl = s->dec.a[k];
        req *r = &s->reqs[sl];
        if (r->skip_pass == s->pass_no || r->state != SCHED_REQ_RUNNING || !needs_block(s, r))
            continue;
        for (;;) {
            uint32_t tmax = s->ten[r->tenant]->max_kv_blocks;
            bool quota = tmax && s->ts[r->tenant].kv_blocks >= tmax;
            if (!quota && sc_dev_grow_to(s, r, r->n_dev + 1)) break;
            if (!quota && pending > 0) {
                /* a swap-out in flight will free blocks: wait for it rather than preempt more */
                pending--;
                r->skip_pass = s->pass_no;
                sc_emit_defer(s, r, SCHED_DEFER_BLOCKS, now);
                break;
            }
            if (quota && s->ts[r->tenant].pend_step > 0) {
                /* the same for a tenant at its quota: one of its own swap-outs will make room */
                s->ts[r->tenant].pend_step--;
                r->skip_pass = s->pass_no;
                sc_emit_defer(s, r, SCHED_DEFER_QUOTA, now);
                break;
            }
            uint32_t v = sc_pick_victim(s, sl, quota ? r->tenant : -1, now);
            if (v == NO_SLOT) {
                r->skip_pass = s->pass_no;
                sc_emit_defer(s, r, quota ? SCHED_DEFER_QUOTA : SCHED_DEFER_BLOCKS, now);
                break;
            }
            uint32_t held = dev_held(&s->reqs[v]);
            uint16_t vt = s->reqs[v].tenant;
            uint32_t freed = sc_preempt(s, v, quota, now);
            if (!freed && held) { /* swap: the others wait for its blocks */
                pending += held;
                s->ts[vt].pend_step += held;
            }
            if (v == sl) break;
            if (s->oom) break;
        }
    }
    uint32_t tokens = 0;
    *ls_decoding = false;
    *tpot_min = 0;
    for (uint32_t k = 0; k < s->dec.n; k++) {
        uint32_t sl = s->dec.a[k];
        req *r = &s->reqs[sl];
        if (r->state != SCHED_REQ_RUNNING || r->skip_pass == s->pass_no) continue;
        if (k >= n) {
            sc_emit_defer(s, r, SCHED_DEFER_BUDGET, now);
            continue;
        }
        add_entry(s, sl, 1, false);
        tokens++;
        const sched_class_cfg *c = s->cls[r->cls];
        if (c->latency_sensitive) *ls_decoding = true;
        if (c->tpot_target_us && (!*tpot_min || c->tpot_target_us < *tpot_min))
            *tpot_min = c->tpot_target_us;
    }
    return tokens;
}

/* Move a waiting request onto the device: allocate blocks for `blocks`, emit schedule (or
 * recompute). */
static void start_running(sched *s, uint32_t slot, uint32_t blocks, uint64_t now)
{
    req *r = &s->reqs[slot];
    sc_waiting_remove(s, slot);
    sc_cache_start(s, r, now); /* a cached prefix: held, and computed starts after it */
    sc_dev_grow_to(s, r, blocks);
    bool resume = r->started;
    if (r->recompute) {
        sched_event e = ev_of(s, SCHED_EV_RECOMPUTE, r, now);
        e.tokens = known(r);
        emit(s, &e);
        r->recompute = false;
        r->resumed_at = now;
    }
    if (!resume) {
        uint64_t mw = s->cls[r->cls]->max_queue_wait_us;
        double *hr = &s->cs[r->cls].headroom;
        if (mw && (double)(now - r->arrival_us) < 0.5 * (double)mw && *hr < HEADROOM_MAX)
            *hr = *hr + 0.002 < HEADROOM_MAX ? *hr + 0.002 : HEADROOM_MAX;
    }
    r->started = true;
    if (r->px_ld_n) {
        /* cached blocks reload from host or disk: it waits for them as a swap-in does, and
         * the others keep stepping meanwhile (cache.c: sc_cache_xfer_done runs it) */
        sc_set_state(s, r, SCHED_REQ_SWAPPING_IN);
        r->moving = true;
        s->n_in_transit++;
        s->n_swapping_in++;
        s->ts[r->tenant].moving_in++;
    } else {
        sc_run_add(s, slot);
    }
    if (!resume) sc_timer_update(s, slot); /* queue-wait no longer applies, deadline does */
    sched_event e = ev_of(s, SCHED_EV_SCHEDULE, r, now);
    e.outcome = resume ? SCHED_OUTCOME_RESUME : SCHED_OUTCOME_START;
    e.blocks = dev_held(r);
    e.wait_us = now - r->arrival_us;
    emit(s, &e);
}

static uint32_t watermark(const sched *s)
{
    /* keep a sliver free so sequences just admitted can grow without preempting at once */
    return s->cfg.mode == SCHED_MODE_TOKEN_BUDGET && s->run.n
               ? s->pools[SCHED_POOL_DEVICE].total / 100
               : 0;
}

void sc_step_token_budget(sched *s, uint64_t now)
{
    const sched_policy_cfg *p = &s->cfg;
    bool ls;
    uint64_t tpot;
    uint32_t dtok = plan_decodes(s, now, p->token_budget, &ls, &tpot);
    if (!s->entries.n && !s->preempts.n && !s->xfers.n && s->dec.n) {
        /* every decoder needs a block, none is free, nothing is moving and every possible
         * victim is protected by its cap or residency: waive the protection once rather
         * than stall the whole service */
        s->forced = true;
        s->victims_built = false;
        dtok = plan_decodes(s, now, p->token_budget, &ls, &tpot);
        s->forced = false;
        s->victims_built = false;
    }
    uint32_t hold = ls ? p->decode_reserve_tokens : 0;
    uint32_t used = dtok > hold ? dtok : hold;
    uint32_t pbudget = p->token_budget > used ? p->token_budget - used : 0;
    if (tpot && pbudget) {
        /* keep the predicted step under the tightest TPOT target of who decodes now, but
         * never below one chunk, or admissions would starve behind a slow model */
        double base = sc_predict_step_us(s, 0, dtok, s->plan.context_tokens, 0);
        double per = s->conf.step.prefill_token_us * s->corr;
        double room = ((double)tpot - base) / per;
        uint32_t cap = room > (double)p->prefill_chunk ? (uint32_t)room : p->prefill_chunk;
        if (cap < pbudget) pbudget = cap;
    }

    /* running sequences part-way through a prefill first: they already hold their blocks */
    s->part.n = 0;
    for (uint32_t i = 0; i < s->run.n; i++) {
        uint32_t sl = s->run.a[i];
        req *r = &s->reqs[sl];
        if (r->blocked || r->held || is_decoder(r)) continue;
        if (r->entry_step == s->step_no) continue;
        VEC_PUSH(s, s->part, sl);
    }
    /* insertion sort by (effective priority desc, arrival asc): a short list */
    for (uint32_t i = 1; i < s->part.n; i++) {
        uint32_t x = s->part.a[i];
        const req *rx = &s->reqs[x];
        double px = eff_priority(s, rx->cls, rx->arrival_us, now);
        uint32_t j = i;
        while (j > 0) {
            const req *ry = &s->reqs[s->part.a[j - 1]];
            double py = eff_priority(s, ry->cls, ry->arrival_us, now);
            if (py > px || (py == px && (ry->arrival_us < rx->arrival_us ||
                                         (ry->arrival_us == rx->arrival_us && ry->id < rx->id))))
                break;
            s->part.a[j] = s->part.a[j - 1];
            j--;
        }
        s->part.a[j] = x;
    }
    uint32_t short_of_blocks = NO_SLOT; /* the first of them without its chunk's blocks */
    for (uint32_t i = 0; i < s->part.n; i++) {
        uint32_t sl = s->part.a[i];
        req *r = &s->reqs[sl];
        if (!pbudget) {
            sc_emit_defer(s, r, SCHED_DEFER_BUDGET, now);
            continue;
        }
        uint32_t n = known(r) - r->computed;
        if (n > p->prefill_chunk) n = p->prefill_chunk;
        if (n > pbudget) n = pbudget;
        uint32_t nb = div_up((uint64_t)r->computed + n, s->conf.block_size);
        if (!sc_dev_grow_to(s, r, nb) &&
            !(sc_reclaim_blocked(s, nb - r->n_dev, now) && sc_dev_grow_to(s, r, nb))) {
            sc_emit_defer(s, r, SCHED_DEFER_BLOCKS, now);
            if (short_of_blocks == NO_SLOT) short_of_blocks = sl;
            continue;
        }
        add_entry(s, sl, n, true);
        pbudget -= n;
    }
    if (short_of_blocks != NO_SLOT && !s->entries.n && !s->preempts.n && !s->xfers.n) {
        /* Nothing computes, nothing moves, and a prefill waits for blocks others hold. A
         * part-way prefill takes free blocks only and the waiver above is for decoders, so
         * none would ever come back: prompts admitted with their first chunk's blocks (an
         * attention window) grew into the pool together and waited for each other for ever.
         * Preempt the victim order's first, its caps waived, so that the others go on. */
        s->forced = true;
        s->victims_built = false;
        uint32_t v = sc_pick_victim(s, short_of_blocks, -1, now);
        if (v != NO_SLOT) sc_preempt(s, v, false, now);
        s->forced = false;
        s->victims_built = false;
    }

    /* admissions: swap-ins and new (or recompute-preempted) sequences */
    uint64_t texcl = 0;
    uint32_t cexcl = 0;
    for (;;) {
        /* An output-blocked sequence keeps its KV blocks (and its tenant pays for them) but
         * not an active slot: a client that stops reading must not hold every slot until
         * its backpressure timeout, starving every other tenant's admissions. */
        uint32_t active = s->run.n - s->n_blocked + s->n_swapping_in;
        cand c;
        if (!sc_pick_candidate(s, now, texcl, cexcl, &c)) break;
        req *r = &s->reqs[c.slot];
        if (active >= p->max_active_seqs) {
            sc_emit_defer(s, r, SCHED_DEFER_MAX_ACTIVE, now);
            break;
        }
        /* free, or cached and evictable — less what is reserved for other groups' samples */
        uint32_t others = sc_group_reserved_for_others(s, r);
        uint32_t fr = sc_dev_available(s);
        fr = fr > others ? fr - others : 0;
        uint32_t tmax = s->ten[c.tenant]->max_kv_blocks;
        if (r->preempt_step == s->step_no) { /* preempted in this very step: not back at once */
            if (c.swapped)
                cexcl |= 1u << c.cls;
            else
                texcl |= 1ull << c.tenant;
            continue;
        }
        /* a tenant with a KV quota keeps one block of growth per running sequence, or its
         * sequences would be admitted only to preempt each other at the next boundary */
        uint64_t grow = tmax ? s->ts[c.tenant].st.running + s->ts[c.tenant].moving_in : 0;
        if (c.swapped) {
            uint32_t need = r->n_tier;
            if (tmax && s->ts[c.tenant].kv_blocks + need + grow > tmax) {
                sc_emit_defer(s, r, SCHED_DEFER_QUOTA, now);
                cexcl |= 1u << c.cls; /* its class waits behind it */
                continue;
            }
            if (fr < need && sc_reclaim_blocked(s, need + others, now)) {
                fr = sc_dev_available(s);
                fr = fr > others ? fr - others : 0;
            }
            if (fr < need || !sc_ring_available(s)) { /* (its ring went with its blocks) */
                sc_emit_defer(s, r, SCHED_DEFER_BLOCKS, now);
                break;
            }
            sc_hremove(s, &s->cs[c.cls].swapped, c.slot);
            s->n_swapped--;
            sc_window_swap_in_grow(s, r); /* (checked available above) */
            sc_set_state(s, r, SCHED_REQ_SWAPPING_IN);
            r->defer = SCHED_DEFER_NONE;
            s->n_swapping_in++;
            s->ts[c.tenant].moving_in++;
            sc_plan_transfer(s, c.slot, SCHED_XFER_IN, now);
            continue;
        }
        if (!pbudget) {
            sc_emit_defer(s, r, SCHED_DEFER_BUDGET, now);
            break;
        }
        if (s->ten[c.tenant]->token_rate_per_s > 0 && s->ts[c.tenant].bucket <= 0) {
            sc_emit_defer(s, r, SCHED_DEFER_RATE, now);
            texcl |= 1ull << c.tenant;
            continue;
        }
        /* with an attention window only the first chunk's blocks (window.c) */
        uint32_t full = div_up(known(r), s->conf.block_size);
        uint32_t first = p->prefill_chunk < pbudget ? p->prefill_chunk : pbudget;
        uint32_t need = sc_window_start_blocks(s, full, 0, first);
        /* n samples: the others' starting blocks too, or the group waits (group.c) */
        uint32_t extra = sc_group_extra(s, r);
        if (tmax && s->ts[c.tenant].kv_blocks + need + extra + grow > tmax) {
            sc_emit_defer(s, r, SCHED_DEFER_QUOTA, now);
            texcl |= 1ull << c.tenant;
            continue;
        }
        uint32_t unheld, hit = sc_cache_find(s, c.slot, &unheld); /* shared, not allocated */
        need = sc_window_start_blocks(s, full, hit, first);
        /* a sample's reserved blocks were kept for it: no watermark on top */
        uint32_t want = need - hit + extra + (r->resv ? 0 : watermark(s));
        if ((fr < unheld || fr - unheld < want) &&
            sc_reclaim_blocked(s, want + unheld + others, now)) {
            fr = sc_dev_available(s);
            fr = fr > others ? fr - others : 0;
        }
        if (fr < unheld || fr - unheld < want || !sc_ring_available(s)) {
            sc_emit_defer(s, r, SCHED_DEFER_BLOCKS, now);
            break;
        }
        start_running(s, c.slot, need, now);
        sc_group_start(s, r, extra);
        if (r->state != SCHED_REQ_RUNNING) { /* reloading: its prefill starts when they are in */
            if (s->oom) break;
            continue;
        }
        uint32_t n = known(r) - r->computed;
        if (n > p->prefill_chunk) n = p->prefill_chunk;
        if (n > pbudget) n = pbudget;
        add_entry(s, c.slot, n, true);
        pbudget -= n;
        if (s->oom) break;
    }
}

void sc_step_continuous(sched *s, uint64_t now)
{
    const sched_policy_cfg *p = &s->cfg;
    bool ls;
    uint64_t tpot;
    uint32_t dtok = plan_decodes(s, now, UINT32_MAX, &ls, &tpot);
    uint32_t pbudget = p->token_budget > dtok ? p->token_budget - dtok : 0;
    /* sequences re-prefilling after a failed swap-in: whole remainder */
    for (uint32_t i = 0; i < s->run.n; i++) {
        uint32_t sl = s->run.a[i];
        req *r = &s->reqs[sl];
        if (r->blocked || is_decoder(r) || r->entry_step == s->step_no) continue;
        uint32_t n = known(r) - r->computed;
        if (!sc_dev_grow_to(s, r, div_up(known(r), s->conf.block_size))) continue;
        add_entry(s, sl, n, true);
        pbudget = pbudget > n ? pbudget - n : 0;
    }
    bool any_prefill = s->plan.n_prefill > 0;
    for (;;) {
        cand c;
        if (!sc_pick_fcfs(s, &c)) break;
        req *r = &s->reqs[c.slot];
        if (r->preempt_step == s->step_no) break; /* FCFS head was just preempted: next step */
        if (s->run.n - s->n_blocked >= p->max_active_seqs) {
            sc_emit_defer(s, r, SCHED_DEFER_MAX_ACTIVE, now);
            break;
        }
        uint32_t n = known(r);
        /* whole prompts; one longer than the budget runs alone (the baseline cannot slice) */
        if (n > pbudget && (any_prefill || dtok >= p->token_budget)) {
            sc_emit_defer(s, r, SCHED_DEFER_BUDGET, now);
            break;
        }
        uint32_t need = div_up(n, s->conf.block_size);
        if (s->pools[SCHED_POOL_DEVICE].n_free < need) sc_reclaim_blocked(s, need, now);
        if (s->pools[SCHED_POOL_DEVICE].n_free < need || !sc_ring_available(s)) {
            sc_emit_defer(s, r, SCHED_DEFER_BLOCKS, now);
            break;
        }
        start_running(s, c.slot, need, now);
        add_entry(s, c.slot, n, true);
        pbudget = pbudget > n ? pbudget - n : 0;
        any_prefill = true;
        if (s->oom) break;
    }
}

void sc_step_group(sched *s, uint64_t now)
{
    const sched_policy_cfg *p = &s->cfg;
    bool is_static = p->mode == SCHED_MODE_STATIC;
    if (s->group_active) {
        /* the group ends when every member has finished (static holds finished members) */
        bool all_done = true;
        for (uint32_t i = 0; i < s->run.n; i++)
            if (!s->reqs[s->run.a[i]].held) {
                all_done = false;
                break;
            }
        if (all_done) {
            while (s->run.n) {
                uint32_t sl = s->run.a[s->run.n - 1];
                sc_detach(s, sl);
                sc_release_now(s, sl, now, true);
            }
            s->group_active = false;
        }
    }
    if (!s->group_active && s->n_waiting) {
        uint32_t size = is_static ? p->static_batch_size : p->max_active_seqs;
        if (size > p->max_active_seqs) size = p->max_active_seqs;
        uint64_t oldest = INF_US;
        for (int i = 0; i < s->n_classes * s->n_tenants; i++)
            if (s->wait[i].n && s->wait[i].a[0].k1 < oldest) oldest = s->wait[i].a[0].k1;
        uint64_t window = is_static ? p->static_batch_timeout_us : p->dynamic_window_us;
        bool go = s->n_waiting >= size || (oldest != INF_US && now - oldest >= window);
        if (go) {
            uint64_t texcl = 0;
            uint32_t taken = 0, max_prompt = 0, sum_prompt = 0;
            while (taken < size) {
                cand c;
                if (!sc_pick_candidate(s, now, texcl, 0, &c)) break;
                req *r = &s->reqs[c.slot];
                /* a group reserves prompt + max_new up front: it never preempts */
                uint32_t need =
                    div_up((uint64_t)known(r) + (r->max_new - r->generated), s->conf.block_size);
                uint32_t tmax = s->ten[c.tenant]->max_kv_blocks;
                if (tmax && s->ts[c.tenant].kv_blocks + need > tmax) {
                    sc_emit_defer(s, r, SCHED_DEFER_QUOTA, now);
                    texcl |= 1ull << c.tenant;
                    continue;
                }
                if (s->pools[SCHED_POOL_DEVICE].n_free < need || !sc_ring_available(s)) {
                    sc_emit_defer(s, r, SCHED_DEFER_BLOCKS, now);
                    break;
                }
                start_running(s, c.slot, need, now);
                uint32_t n = known(r);
                add_entry(s, c.slot, n, true);
                if (n > max_prompt) max_prompt = n;
                sum_prompt += n;
                taken++;
            }
            if (taken) {
                s->group_active = true;
                if (is_static) s->plan.pad_tokens += taken * max_prompt - sum_prompt;
            }
        } else {
            /* say once that the head waits for its group */
            cand c;
            if (sc_pick_candidate(s, now, 0, 0, &c))
                sc_emit_defer(s, &s->reqs[c.slot], SCHED_DEFER_BATCH, now);
        }
        return;
    }
    if (!s->group_active) return;
    for (uint32_t i = 0; i < s->run.n; i++) {
        uint32_t sl = s->run.a[i];
        req *r = &s->reqs[sl];
        if (r->held) {
            if (is_static) s->plan.pad_tokens++;
            continue;
        }
        if (r->blocked) continue;
        uint32_t n = known(r) - r->computed;
        if (n == 0) continue;
        add_entry(s, sl, n, n > 1 || r->generated == 0);
    }
}
