/* SPDX-License-Identifier: MIT */
/* store.c — requests and where they are: the state machine (one function, one table of legal
 * transitions), the per-(class, tenant) queues and the timers (binary heaps), the id map,
 * the KV block pools. */
#include "sched/internal.h"

bool sc_vec_grow(void **a, uint32_t *cap, uint32_t need, size_t elt)
{
    if (need <= *cap) return true;
    uint32_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *p = realloc(*a, (size_t)nc * elt);
    if (!p) return false;
    *a = p;
    *cap = nc;
    return true;
}

static inline int32_t *hpos(sched *s, uint32_t slot, uint8_t which)
{
    req *r = &s->reqs[slot];
    return which == POS_Q    ? &r->q_pos
           : which == POS_T  ? &r->t_pos
           : which == POS_BP ? &r->bp_pos
                             : &r->p_pos;
}

static void hset(sched *s, heap *h, uint32_t i, hent e)
{
    h->a[i] = e;
    *hpos(s, e.slot, h->which) = (int32_t)i;
}

static void hup(sched *s, heap *h, uint32_t i)
{
    hent e = h->a[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!hless(&e, &h->a[p])) break;
        hset(s, h, i, h->a[p]);
        i = p;
    }
    hset(s, h, i, e);
}

static void hdown(sched *s, heap *h, uint32_t i)
{
    hent e = h->a[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && hless(&h->a[c + 1], &h->a[c])) c++;
        if (!hless(&h->a[c], &e)) break;
        hset(s, h, i, h->a[c]);
        i = c;
    }
    hset(s, h, i, e);
}

int sc_hpush(sched *s, heap *h, uint64_t k1, uint64_t k2, uint32_t slot)
{
    if (!sc_vec_grow((void **)&h->a, &h->cap, h->n + 1, sizeof(hent))) {
        s->oom = true;
        return -ENOMEM;
    }
    h->a[h->n] = (hent){k1, k2, slot};
    hup(s, h, h->n++);
    return 0;
}

void sc_hremove(sched *s, heap *h, uint32_t slot)
{
    int32_t *pp = hpos(s, slot, h->which);
    int32_t i = *pp;
    if (i < 0 || (uint32_t)i >= h->n || h->a[i].slot != slot) return;
    *pp = NO_POS;
    h->n--;
    if ((uint32_t)i == h->n) return;
    hent last = h->a[h->n];
    h->a[i] = last;
    *hpos(s, last.slot, h->which) = i;
    if (i > 0 && hless(&last, &h->a[(i - 1) / 2]))
        hup(s, h, (uint32_t)i);
    else
        hdown(s, h, (uint32_t)i);
}

int sc_map_put(sched *s, uint64_t id, uint32_t slot)
{
    if ((s->map_n + 1) * 2 > s->map_cap) {
        uint32_t nc = s->map_cap * 2;
        uint32_t *nm = malloc((size_t)nc * sizeof(uint32_t));
        if (!nm) return -ENOMEM;
        memset(nm, 0xff, (size_t)nc * sizeof(uint32_t));
        uint32_t *old = s->map, oc = s->map_cap;
        s->map = nm;
        s->map_cap = nc;
        for (uint32_t i = 0; i < oc; i++)
            if (old[i] != NO_SLOT) {
                uint32_t j = map_hash(s, s->reqs[old[i]].id);
                while (nm[j] != NO_SLOT) j = (j + 1) & (nc - 1);
                nm[j] = old[i];
            }
        free(old);
    }
    uint32_t i = map_hash(s, id);
    while (s->map[i] != NO_SLOT) i = (i + 1) & (s->map_cap - 1);
    s->map[i] = slot;
    s->map_n++;
    return 0;
}

void sc_map_del(sched *s, uint64_t id)
{
    uint32_t m = s->map_cap - 1, i = map_hash(s, id);
    while (s->map[i] != NO_SLOT && s->reqs[s->map[i]].id != id) i = (i + 1) & m;
    if (s->map[i] == NO_SLOT) return;
    s->map[i] = NO_SLOT;
    s->map_n--;
    for (uint32_t j = (i + 1) & m; s->map[j] != NO_SLOT; j = (j + 1) & m) {
        uint32_t home = map_hash(s, s->reqs[s->map[j]].id);
        /* move j back to i if its home is not in (i, j] cyclically */
        bool between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            s->map[i] = s->map[j];
            s->map[j] = NO_SLOT;
            i = j;
        }
    }
}

int sc_pool_init(pool *p, uint32_t n)
{
    p->total = n;
    p->n_free = n;
    p->free_ids = malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
    if (!p->free_ids) return -ENOMEM;
    /* stack: lowest ids handed out first, so plans read naturally */
    for (uint32_t i = 0; i < n; i++) p->free_ids[i] = n - 1 - i;
    return 0;
}

uint32_t sc_dev_free_all(sched *s, req *r)
{
    uint32_t n = r->n_dev, held = dev_held(r);
    uint32_t cached = s->px ? sc_cache_release(s, r) : 0; /* those stay, in the cache */
    for (uint32_t i = n; i-- > cached;) /* (or with their sharers; a window's: already given) */
        if (r->dev[i] != SCHED_BLOCK_NONE) sc_dev_give(s, r->dev[i]);
    sc_cow_drop(s, r); /* a sample that ends before it started */
    sc_group_release(s, r);
    s->ts[r->tenant].kv_blocks -= held;
    r->n_dev = r->n_rel = r->rel_scan = 0;
    if (r->ring != SCHED_BLOCK_NONE) { /* its window ring goes with its blocks */
        pool_give(&s->rings, r->ring);
        r->ring = SCHED_BLOCK_NONE;
    }
    return held;
}

uint32_t sc_tier_free_all(sched *s, req *r)
{
    uint32_t n = r->n_tier + r->n_tier_ring; /* its blocks' slots, then its ring's */
    for (uint32_t i = n; i-- > 0;) pool_give(&s->pools[r->tier], r->tierb[i]);
    r->n_tier = r->n_tier_ring = 0;
    return n;
}

/* Every change of a request's state goes through here and is checked against the one table
 * of legal transitions (DESIGN: a request's life):
 *
 *   new          → waiting                       admitted (sched_submit)
 *   waiting      → running | ended               started / timed out, cancelled
 *                → swapping_in                   started with cached blocks to reload from
 *                                                host or disk: it waits for the copies
 *   running      → waiting                       recompute preemption (KV dropped)
 *                → swapping_out                  swap preemption
 *                → ended                         finished, cancelled, timed out
 *   swapping_out → swapped | waiting | ended     copied / copy failed (recompute) / ended
 *   swapped      → swapping_in | ended
 *   swapping_in  → running | waiting | ended     resumed / copy failed (recompute) / ended
 *   ended        → ended                         released (idempotent)
 *
 * An illegal change is counted, not refused (the caller's bookkeeping already moved): the first
 * one is kept, and sched_check_invariants reports it. */
static const uint8_t legal[REQ_NEW + 1] = {
#define B(x) (1u << SCHED_REQ_##x)
    [SCHED_REQ_WAITING] = B(RUNNING) | B(SWAPPING_IN) | B(ENDED),
    [SCHED_REQ_RUNNING] = B(WAITING) | B(SWAPPING_OUT) | B(ENDED),
    [SCHED_REQ_SWAPPING_OUT] = B(SWAPPED) | B(WAITING) | B(ENDED),
    [SCHED_REQ_SWAPPED] = B(SWAPPING_IN) | B(ENDED),
    [SCHED_REQ_SWAPPING_IN] = B(RUNNING) | B(WAITING) | B(ENDED),
    [SCHED_REQ_ENDED] = B(ENDED),
    [REQ_NEW] = B(WAITING),
#undef B
};

void sc_set_state(sched *s, req *r, sched_req_state to)
{
    if (r->state > REQ_NEW || !(legal[r->state] & (1u << to))) {
        if (!s->bad_transitions++) {
            s->bad_from = r->state;
            s->bad_to = (uint8_t)to;
            s->bad_req = r->id;
        }
    }
    r->state = (uint8_t)to;
}

void sc_waiting_add(sched *s, uint32_t slot)
{
    sc_set_state(s, &s->reqs[slot], SCHED_REQ_WAITING);
    sc_waiting_enqueue(s, slot);
}

void sc_waiting_enqueue(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    uint32_t k = known(r);
    sc_hpush(s, wait_heap(s, r), r->arrival_us, r->id, slot);
    sc_order_add(s, slot);
    s->n_waiting++;
    s->queued_tokens += k;
    s->cs[r->cls].n_waiting++;
    s->cs[r->cls].queued_tokens += k;
    s->cs[r->cls].st.queued_requests++;
    s->cs[r->cls].st.queued_tokens += k;
    s->ts[r->tenant].st.queued_requests++;
    s->ts[r->tenant].st.queued_tokens += k;
}

void sc_waiting_remove(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    uint32_t k = known(r);
    sc_hremove(s, wait_heap(s, r), slot);
    sc_order_remove(s, slot);
    s->n_waiting--;
    s->queued_tokens -= k;
    s->cs[r->cls].n_waiting--;
    s->cs[r->cls].queued_tokens -= k;
    s->cs[r->cls].st.queued_requests--;
    s->cs[r->cls].st.queued_tokens -= k;
    s->ts[r->tenant].st.queued_requests--;
    s->ts[r->tenant].st.queued_tokens -= k;
}

void sc_run_add(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    sc_set_state(s, r, SCHED_REQ_RUNNING);
    r->run_pos = (int32_t)s->run.n;
    VEC_PUSH(s, s->run, slot);
    s->ts[r->tenant].st.running++;
    s->cs[r->cls].st.running++;
    if (r->blocked) s->n_blocked++;
}

void sc_run_remove(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    int32_t i = r->run_pos;
    if (i < 0) return;
    uint32_t last = s->run.a[--s->run.n];
    if ((uint32_t)i < s->run.n) {
        s->run.a[i] = last;
        s->reqs[last].run_pos = i;
    }
    r->run_pos = NO_POS;
    s->ts[r->tenant].st.running--;
    s->cs[r->cls].st.running--;
    if (r->blocked) s->n_blocked--;
}

/* Timer: queue wait (until first scheduled) and deadline. */
void sc_timer_update(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    sc_hremove(s, &s->timers, slot);
    uint64_t exp = r->deadline_us ? r->deadline_us : INF_US;
    uint64_t mw = s->cls[r->cls]->max_queue_wait_us;
    if (!r->started && mw && r->arrival_us + mw < exp) exp = r->arrival_us + mw;
    if (exp != INF_US) sc_hpush(s, &s->timers, exp, r->id, slot);
}
