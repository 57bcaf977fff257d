/* SPDX-License-Identifier: MIT */
/* group.c — the n samples of one prompt admitted all or nothing (sched_request.n_samples).
 *
 * The scheduler sees a group's first sample alone until its first token: the others are
 * submitted then (sample_of), each continuing from the prompt's last row.  So that they do
 * not then wait for blocks one by one while their siblings run, the first sample is admitted
 * only when its blocks and the others' starting blocks (grp_each each: what a sample's own
 * admission needs beyond the cached full blocks) are available together, and those are
 * reserved (resv) from its start: admissions and swap-ins of other requests see the device's
 * available blocks less every reservation but their own.  Each sample submitted takes its
 * share of the first sample's reservation and uses it at its start; at the next step the
 * first sample gives back what was not claimed (a sample cancelled before the fork, one whose
 * answer was its first token).  A sequence that ends or gives up its blocks gives back its
 * reservation (a first sample preempted before its first token reserves again when it is
 * admitted again).  Running sequences' own growth is not held back by reservations: a decode
 * that needs a block takes it (or preempts) as before.
 */
#include "sched/internal.h"

void sc_group_submit(sched *s, req *r, const sched_request *q)
{
    uint32_t bs = s->conf.block_size;
    r->grp_n = r->grp_each = r->resv = 0;
    if (!q->sample && q->n_samples > 1 && s->cfg.mode == SCHED_MODE_TOKEN_BUDGET) {
        r->grp_n = q->n_samples - 1;
        /* a sample starts with the prompt and its first token: the blocks past the prompt's
         * full ones, which the cache shares */
        r->grp_each = div_up((uint64_t)q->prompt_len + 1, bs) - q->prompt_len / bs;
        return;
    }
    if (!q->sample || !q->sample_of) return;
    uint32_t sl = map_get(s, q->sample_of);
    if (sl == NO_SLOT) return;
    req *f = &s->reqs[sl];
    uint32_t take = f->resv < f->grp_each ? f->resv : f->grp_each;
    f->resv -= take;
    r->resv = take; /* resv_total unchanged: moved from its first sample to it */
}

uint32_t sc_group_extra(const sched *s, const req *r)
{
    (void)s;
    return r->grp_n && !r->generated && !r->resv ? r->grp_n * r->grp_each : 0;
}

void sc_group_start(sched *s, req *r, uint32_t extra)
{
    if (r->resv) { /* a sample: its reserved blocks are the ones it just took */
        s->resv_total -= r->resv;
        r->resv = 0;
    }
    if (!extra) return;
    r->resv = extra;
    s->resv_total += extra;
    VEC_PUSH(s, s->resv_firsts, (uint32_t)(r - s->reqs));
}

void sc_group_release(sched *s, req *r)
{
    s->resv_total -= r->resv;
    r->resv = 0;
}

void sc_group_settle(sched *s)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->resv_firsts.n; i++) {
        req *r = &s->reqs[s->resv_firsts.a[i]];
        if (r->live && r->resv && !r->generated) {
            s->resv_firsts.a[k++] = s->resv_firsts.a[i]; /* still before its fork */
            continue;
        }
        if (r->live) sc_group_release(s, r);
    }
    s->resv_firsts.n = k;
}

int sc_group_check(const sched *s, char *why, size_t len)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        const req *r = &s->reqs[i];
        if (!r->live) {
            if (r->resv) {
                if (why && len)
                    snprintf(why, len, "released request %llu holds a reservation of %u blocks",
                             (unsigned long long)r->id, r->resv);
                return -EUCLEAN;
            }
            continue;
        }
        sum += r->resv;
    }
    if (sum != s->resv_total) {
        if (why && len)
            snprintf(why, len, "reserved blocks %u by counter, %llu by scan", s->resv_total,
                     (unsigned long long)sum);
        return -EUCLEAN;
    }
    return 0;
}
