/* SPDX-License-Identifier: MIT */
/* admit.c — the way in and the way out a client asks for: sched_submit's admission checks
 * and rejects, sched_cancel, output backpressure. */
#include "sched/internal.h"

static int reject_said(sched *s, const sched_request *q, int tenant, int cls,
                       sched_reject_reason why, const char *detail, int rc, uint64_t now,
                       sched_reject_reason *out)
{
    if (out) *out = why;
    if (tenant >= 0) s->ts[tenant].st.rejects[why]++;
    if (cls >= 0) s->cs[cls].st.rejects[why]++;
    sched_event e;
    memset(&e, 0, sizeof(e));
    e.t_us = now;
    e.kind = SCHED_EV_REJECT;
    e.req = q ? q->id : 0;
    e.tenant = tenant >= 0 ? s->ten[tenant]->name : (q ? q->tenant_name : NULL);
    e.class_name = cls >= 0 ? s->cls[cls]->name : (q ? q->class_name : NULL);
    e.tenant_idx = tenant >= 0 ? tenant : -1;
    e.class_idx = cls >= 0 ? cls : -1;
    e.reject = why;
    e.detail = detail;
    e.prompt_tokens = q ? q->prompt_len : 0;
    e.max_tokens = q ? q->max_new_tokens : 0;
    emit(s, &e);
    sched__set_error("request %llu rejected: %s", (unsigned long long)(q ? q->id : 0),
                     sched_reject_name(why));
    return rc;
}

static int reject(sched *s, const sched_request *q, int tenant, int cls, sched_reject_reason why,
                  int rc, uint64_t now, sched_reject_reason *out)
{
    return reject_said(s, q, tenant, cls, why, NULL, rc, now, out);
}

int sched_note_reject(sched *s, const sched_request *q, sched_reject_reason why, const char *detail,
                      uint64_t now)
{
    if (!s || !q || why <= SCHED_REJECT_NONE || why >= SCHED_REJECT__COUNT) {
        sched__set_error("sched_note_reject: %s", !s   ? "scheduler is NULL"
                                                  : !q ? "request is NULL"
                                                       : "not a reject reason");
        return -EINVAL;
    }
    int cls = q->class_idx >= 0 ? (q->class_idx < s->n_classes ? q->class_idx : -1)
                                : sched_policy_class_index(s->policy, q->class_name);
    int ten = q->tenant >= 0 ? (q->tenant < s->n_tenants ? q->tenant : -1)
                             : sched_policy_tenant_index(s->policy, q->tenant_name);
    reject_said(s, q, ten < 0 ? -1 : ten, cls < 0 ? -1 : cls, why, detail, 0, now, NULL);
    return 0;
}

int sched_submit(sched *s, const sched_request *q, uint64_t now, sched_reject_reason *why)
{
    if (why) *why = SCHED_REJECT_NONE;
    if (!s) {
        sched__set_error("sched_submit: scheduler is NULL");
        return -EINVAL;
    }
    if (!q) return reject(s, NULL, -1, -1, SCHED_REJECT_INVALID, -EINVAL, now, why);
    if (q->prompt_len == 0 || q->max_new_tokens == 0)
        return reject(s, q, -1, -1, SCHED_REJECT_INVALID, -EINVAL, now, why);
    if (map_get(s, q->id) != NO_SLOT)
        return reject(s, q, -1, -1, SCHED_REJECT_DUPLICATE, -EEXIST, now, why);
    int cls = q->class_idx >= 0 ? (q->class_idx < s->n_classes ? q->class_idx : -ENOENT)
                                : sched_policy_class_index(s->policy, q->class_name);
    if (cls < 0) return reject(s, q, -1, -1, SCHED_REJECT_UNKNOWN_CLASS, -EINVAL, now, why);
    int ten = q->tenant >= 0 ? (q->tenant < s->n_tenants ? q->tenant : -ENOENT)
                             : sched_policy_tenant_index(s->policy, q->tenant_name);
    if (ten < 0) return reject(s, q, -1, cls, SCHED_REJECT_UNKNOWN_TENANT, -EINVAL, now, why);
    uint64_t total = (uint64_t)q->prompt_len + q->max_new_tokens;
    if (total > s->conf.max_context)
        return reject(s, q, ten, cls, SCHED_REJECT_TOO_LONG, -E2BIG, now, why);
    uint32_t blocks = sc_window_never_fits_blocks(s, q->prompt_len, s->px && q->tokens,
                                                  div_up(total, s->conf.block_size));
    uint32_t tmax = s->ten[ten]->max_kv_blocks;
    if (blocks > s->conf.kv_blocks_device || (tmax && blocks > tmax))
        return reject(s, q, ten, cls, SCHED_REJECT_NEVER_FITS, -E2BIG, now, why);
    const sched_tenant_cfg *tc = s->ten[ten];
    uint64_t arrival = q->arrival_us && q->arrival_us <= now ? q->arrival_us : now;
    if (q->sample) goto admitted; /* its group passed the checks below when it came */
    if (tc->max_queued_tokens &&
        s->ts[ten].st.queued_tokens + q->prompt_len > tc->max_queued_tokens)
        return reject(s, q, ten, cls, SCHED_REJECT_TENANT_QUOTA, -EAGAIN, now, why);
    if ((s->cfg.queue_max_requests && s->n_waiting + 1 > s->cfg.queue_max_requests) ||
        (s->cfg.queue_max_tokens && s->queued_tokens + q->prompt_len > s->cfg.queue_max_tokens))
        return reject(s, q, ten, cls, SCHED_REJECT_QUEUE_FULL, -EAGAIN, now, why);
    uint64_t mw = s->cls[cls]->max_queue_wait_us;
    if (q->deadline_us || mw) {
        double wait = sc_predict_wait_us(s, cls, ten, q->prompt_len, now);
        double waited = (double)(now - arrival);
        if (mw && waited + wait > s->cs[cls].headroom * (double)mw)
            return reject(s, q, ten, cls, SCHED_REJECT_DEADLINE, -ETIME, now, why);
        if (q->deadline_us) {
            double dec_step = sc_predict_step_us(s, 0, s->run.n + 1, 0, 0);
            if ((double)now + wait + (double)(q->max_new_tokens - 1) * dec_step >
                (double)q->deadline_us)
                return reject(s, q, ten, cls, SCHED_REJECT_DEADLINE, -ETIME, now, why);
        }
    }

    /* take a slot */
admitted:;
    uint32_t slot;
    if (s->free_slots.n)
        slot = s->free_slots.a[--s->free_slots.n];
    else {
        if (!sc_vec_grow((void **)&s->reqs, &s->cap_slots, s->n_slots + 1, sizeof(req))) goto oom;
        slot = s->n_slots++;
        memset(&s->reqs[slot], 0, sizeof(req));
    }
    req *r = &s->reqs[slot];
    req old = *r; /* the slot's buffers are reused */
    memset(r, 0, sizeof(*r));
    r->dev = old.dev;
    r->cap_dev = old.cap_dev;
    r->tierb = old.tierb;
    r->cap_tier = old.cap_tier;
    r->ptok = old.ptok;
    r->cap_ptok = old.cap_ptok;
    r->pkeys = old.pkeys;
    r->cap_pkeys = old.cap_pkeys;
    r->pnodes = old.pnodes;
    r->cap_pnodes = old.cap_pnodes;
    r->id = q->id;
    r->live = 1;
    r->tenant = (uint16_t)ten;
    r->cls = (uint16_t)cls;
    r->prompt_len = q->prompt_len;
    r->max_new = q->max_new_tokens;
    r->arrival_us = arrival;
    r->deadline_us = q->deadline_us;
    r->q_pos = r->t_pos = r->bp_pos = r->run_pos = r->p_pos = NO_POS;
    r->state = REQ_NEW; /* born; waiting_add below is its first transition */
    r->cow_blk = NO_SLOT;
    r->ring = SCHED_BLOCK_NONE;
    r->sample = q->sample;
    if (sc_cache_submit(s, r, q)) {
        VEC_PUSH(s, s->free_slots, slot);
        r->live = 0;
        goto oom;
    }
    if (sc_map_put(s, q->id, slot)) {
        VEC_PUSH(s, s->free_slots, slot);
        r->live = 0;
        goto oom;
    }

    sc_cow_submit(s, r, q);   /* a sample: the first sample's partial prompt block, shared */
    sc_group_submit(s, r, q); /* n samples: admitted together */

    tenant_state *t = &s->ts[ten];
    if (t->n_live == 0) sc_fair_rejoin(s, ten);
    t->n_live++;
    t->st.admitted++;
    s->cs[cls].st.admitted++;
    sc_waiting_add(s, slot);
    sc_timer_update(s, slot);
    /* burst_gather: a burst starts when a prompt finds nothing running (sched.c) */
    if (!s->gathering && !s->run.n && !s->n_swapped && !s->n_in_transit) {
        s->gathering = true;
        s->gather_first_us = now;
    }
    s->gather_last_us = now;
    sched_event e = ev_of(s, SCHED_EV_ADMIT, r, now);
    e.prompt_tokens = r->prompt_len;
    e.max_tokens = r->max_new;
    emit(s, &e);
    return s->oom ? -ENOMEM : 0;
oom:
    sched__set_error("sched_submit: out of memory");
    return -ENOMEM;
}

int sched_cancel(sched *s, uint64_t id, uint64_t now, sched_cancel_reason why)
{
    if (!s) return -EINVAL;
    uint32_t slot = map_get(s, id);
    if (slot == NO_SLOT || s->reqs[slot].state == SCHED_REQ_ENDED || s->reqs[slot].held) {
        sched__set_error("sched_cancel: request %llu is not live", (unsigned long long)id);
        return -ENOENT;
    }
    if ((unsigned)why >= SCHED_CANCEL__COUNT) why = SCHED_CANCEL_CLIENT;
    sc_do_cancel(s, slot, why, now, false);
    return 0;
}

int sched_set_output_blocked(sched *s, uint64_t id, bool blocked, uint64_t now)
{
    if (!s) return -EINVAL;
    uint32_t slot = map_get(s, id);
    if (slot == NO_SLOT || s->reqs[slot].state == SCHED_REQ_ENDED) {
        sched__set_error("sched_set_output_blocked: request %llu is not live",
                         (unsigned long long)id);
        return -ENOENT;
    }
    req *r = &s->reqs[slot];
    if (r->blocked == blocked) return 0;
    r->blocked = blocked;
    if (r->run_pos >= 0) s->n_blocked += blocked ? 1 : (uint32_t)-1;
    if (blocked) {
        r->blocked_since = now;
        if (s->cfg.backpressure_timeout_us)
            sc_hpush(s, &s->bp_timers, now + s->cfg.backpressure_timeout_us, id, slot);
        sc_emit_defer(s, r, SCHED_DEFER_BACKPRESSURE, now);
        sc_park(s, slot); /* queued after a preemption: not taken up before its client reads */
    } else {
        sc_hremove(s, &s->bp_timers, slot);
        r->defer = SCHED_DEFER_NONE;
        sc_unpark(s, slot);
    }
    return 0;
}
