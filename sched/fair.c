/* SPDX-License-Identifier: MIT */
/* fair.c — fair share: the one place a tenant's virtual-token counter is charged, the
 * lift of a tenant returning from idle, and the order admission candidates are taken in. */
#include "sched/internal.h"

/* sc_charge, the one virtual-token charge, is in internal.h (inlined on the hot paths). */

/* Class by effective priority (priority + aging × oldest wait), then — a swapped sequence of
 * that class before any new one — the tenant with the smallest virtual counter, then the
 * oldest request of that (class, tenant), or with prefix_order = longest_prefix the one with
 * the longest cached prefix unless the oldest has waited prefix_max_wait (order.c). */
bool sc_pick_candidate(sched *s, uint64_t now, uint64_t tenant_excl, uint32_t class_excl, cand *out)
{
    int best = -1;
    double best_prio = 0;
    for (int c = 0; c < s->n_classes; c++) {
        if (class_excl & (1u << c)) continue;
        class_state *cs = &s->cs[c];
        if (!cs->n_waiting && !cs->swapped.n) continue;
        uint64_t oldest = cs->swapped.n ? cs->swapped.a[0].k1 : INF_US;
        if (cs->n_waiting) {
            heap *row = &s->wait[(size_t)c * (size_t)s->n_tenants];
            for (int t = 0; t < s->n_tenants; t++)
                if (row[t].n && !(tenant_excl & (1ull << t)) && row[t].a[0].k1 < oldest)
                    oldest = row[t].a[0].k1;
        }
        if (oldest == INF_US) continue;
        double p = eff_priority(s, c, oldest, now);
        if (best < 0 || p > best_prio) {
            best = c;
            best_prio = p;
        }
    }
    if (best < 0) return false;
    class_state *cs = &s->cs[best];
    if (cs->swapped.n) {
        uint32_t sl = cs->swapped.a[0].slot;
        *out = (cand){best, s->reqs[sl].tenant, sl, true};
        return true;
    }
    heap *row = &s->wait[(size_t)best * (size_t)s->n_tenants];
    int bt = -1;
    for (int t = 0; t < s->n_tenants; t++) {
        if (!row[t].n || (tenant_excl & (1ull << t))) continue;
        if (bt < 0 || s->ts[t].vt < s->ts[bt].vt) bt = t;
    }
    if (bt < 0) return false;
    *out = (cand){best, bt, sc_order_pick(s, best, bt, now), false};
    return true;
}

/* Continuous mode: global FCFS over every queue. */
bool sc_pick_fcfs(sched *s, cand *out)
{
    const hent *best = NULL;
    for (int i = 0; i < s->n_classes * s->n_tenants; i++) {
        const hent *h = htop(&s->wait[i]);
        if (h && (!best || hless(h, best))) best = h;
    }
    if (!best) return false;
    const req *r = &s->reqs[best->slot];
    *out = (cand){r->cls, r->tenant, best->slot, false};
    return true;
}

/* A tenant returning from idle is lifted to the minimum of the active counters, so idling
 * earns no credit to burst past everyone later. */
void sc_fair_rejoin(sched *s, int tenant)
{
    double mn = INFINITY;
    for (int i = 0; i < s->n_tenants; i++)
        if (s->ts[i].n_live && s->ts[i].vt < mn) mn = s->ts[i].vt;
    if (mn != INFINITY && s->ts[tenant].vt < mn) s->ts[tenant].vt = mn;
}

/* A tenant index handed to a new owner.  Its counter restarts level with the lowest of the
 * others': the new owner inherits neither the old owner's debt (it would wait behind everyone)
 * nor its credit; a later submit lifts it further to the active minimum (sc_fair_rejoin). */
int sched_tenant_recycle(sched *s, int tenant)
{
    if (!s || tenant < 0 || tenant >= s->n_tenants) {
        sched__set_error("sched_tenant_recycle: no tenant %d", tenant);
        return -ENOENT;
    }
    tenant_state *t = &s->ts[tenant];
    if (t->n_live || t->kv_blocks || t->moving_in || t->pending_out) {
        sched__set_error("sched_tenant_recycle: tenant %s still has %u requests and %u blocks",
                         s->ten[tenant]->name, t->n_live, t->kv_blocks);
        return -EBUSY;
    }
    double mn = INFINITY;
    for (int i = 0; i < s->n_tenants; i++)
        if (i != tenant && s->ts[i].vt < mn) mn = s->ts[i].vt;
    t->vt = mn == INFINITY ? 0 : mn;
    t->bucket = s->ten[tenant]->token_rate_per_s;
    memset(&t->st, 0, sizeof t->st);
    return 0;
}
