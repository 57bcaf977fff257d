/* SPDX-License-Identifier: MIT */
/*
 * order.c — the cache-aware order within a class (class key prefix_order = longest_prefix,
 * DESIGN §10): once fair share has chosen the class and the tenant, take the waiting request
 * whose prompt has the longest cached prefix, unless the tenant's oldest request of that class
 * has waited the class's prefix_max_wait — then the oldest goes first.  Aging so bounds every
 * wait at any queue length; there is no length past which the order quietly becomes FCFS.
 *
 * Keeping the step cheap with 10,000 waiting: nothing is looked up per step.  Each waiting
 * request of such a class carries its cached prefix length (`plen`, in blocks) and sits in a
 * second heap per (class, tenant) keyed by (longest plen, oldest arrival).  The length is
 * looked up once, when the request starts waiting, and then kept exact by the index's own
 * changes:
 *   - every block key of a waiting request is registered in a waiter table (key → the
 *     waiting requests whose prompt has that key, at which block);
 *   - a block inserted into the index (sc_cache_commit) lengthens the waiters for whom it
 *     was the next block (plen == its depth);
 *   - a block leaving the index (the evicted callback: dropped, not demoted or moved) cuts
 *     the waiters that counted it (plen > its depth) back to its depth.
 * The order uses keys only: a hash collision could misorder two requests, never share a wrong
 * block — sc_cache_find still compares tokens at admission.  Costs: O(prompt blocks) when a
 * request starts or stops waiting (its keys were computed then anyway), O(waiters of a key)
 * when the index gains or loses that key, O(1) to pick.
 */
#include "sched/internal.h"

#define OW_NONE UINT32_MAX

struct ow_ent {
    sched_prefix_key key;
    uint32_t slot;       /* OW_NONE: free (next chains the free list) */
    uint32_t depth;      /* the block of the request's prompt this key names */
    uint32_t next, prev; /* bucket chain */
    uint32_t rnext;      /* the request's next entry */
};

static bool longest(const sched *s, const req *r)
{
    return s->cls[r->cls]->prefix_order == SCHED_PREFIX_ORDER_LONGEST;
}

int sc_order_create(sched *s)
{
    if (!s->px) return 0;
    bool any = false;
    for (int c = 0; c < s->n_classes; c++)
        any |= s->cls[c]->prefix_order == SCHED_PREFIX_ORDER_LONGEST;
    if (!any) return 0;
    size_t nh = (size_t)s->n_classes * (size_t)s->n_tenants;
    s->pwait = calloc(nh, sizeof(heap));
    s->ow_bucket = malloc(1024 * sizeof(uint32_t));
    if (!s->pwait || !s->ow_bucket) return -ENOMEM;
    for (size_t i = 0; i < nh; i++) s->pwait[i].which = POS_P;
    memset(s->ow_bucket, 0xff, 1024 * sizeof(uint32_t));
    s->ow_nbucket = 1024;
    s->ow_free = OW_NONE;
    return 0;
}

void sc_order_destroy(sched *s)
{
    if (s->pwait)
        for (int i = 0; i < s->n_classes * s->n_tenants; i++) free(s->pwait[i].a);
    free(s->pwait);
    free(s->ow);
    free(s->ow_bucket);
    free(s->ow_nodes);
}

static inline uint32_t bucket_of(const sched *s, sched_prefix_key k)
{
    return (uint32_t)(k.lo ^ (k.hi >> 7)) & (s->ow_nbucket - 1);
}

static void link_ent(sched *s, uint32_t i)
{
    struct ow_ent *e = &s->ow[i];
    uint32_t b = bucket_of(s, e->key);
    e->prev = OW_NONE;
    e->next = s->ow_bucket[b];
    if (e->next != OW_NONE) s->ow[e->next].prev = i;
    s->ow_bucket[b] = i;
}

static bool grow_buckets(sched *s)
{
    uint32_t nb = s->ow_nbucket * 2;
    uint32_t *b = malloc((size_t)nb * sizeof(uint32_t));
    if (!b) return false;
    memset(b, 0xff, (size_t)nb * sizeof(uint32_t));
    free(s->ow_bucket);
    s->ow_bucket = b;
    s->ow_nbucket = nb;
    for (uint32_t i = 0; i < s->n_ow; i++)
        if (s->ow[i].slot != OW_NONE) link_ent(s, i);
    return true;
}

static uint32_t take_ent(sched *s)
{
    if (s->ow_free != OW_NONE) {
        uint32_t i = s->ow_free;
        s->ow_free = s->ow[i].next;
        return i;
    }
    if (!sc_vec_grow((void **)&s->ow, &s->cap_ow, s->n_ow + 1, sizeof(struct ow_ent)))
        return OW_NONE;
    return s->n_ow++;
}

static inline heap *pwait_heap(sched *s, const req *r)
{
    return &s->pwait[(size_t)r->cls * (size_t)s->n_tenants + r->tenant];
}

static void repush(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    heap *h = pwait_heap(s, r);
    sc_hremove(s, h, slot);
    sc_hpush(s, h, (uint64_t)(UINT32_MAX - r->plen), r->arrival_us, slot);
}

/* r starts waiting: look its cached prefix up once, register its keys, queue it. */
void sc_order_add(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    r->plen = 0;
    r->ow_head = OW_NONE;
    if (!s->pwait || !longest(s, r)) return;
    if (r->pcache) {
        /* the blocks sc_cache_find could share: never the one holding the last known token */
        uint32_t max = (known(r) - 1) / s->conf.block_size;
        if (max > r->n_pkeys) max = r->n_pkeys;
        if (max && sc_vec_grow((void **)&s->ow_nodes, &s->cap_ow_nodes, max, sizeof(uint32_t)))
            r->plen = sched_prefix_lookup(s->px, r->salt, r->pkeys, r->ptok, max, r->id,
                                          s->ow_nodes, NULL);
        for (uint32_t d = max; d-- > 0;) {
            if (s->n_live_ow + 1 > s->ow_nbucket && !grow_buckets(s)) {
                s->oom = true;
                break;
            }
            uint32_t i = take_ent(s);
            if (i == OW_NONE) {
                s->oom = true;
                break;
            }
            s->ow[i] =
                (struct ow_ent){.key = r->pkeys[d], .slot = slot, .depth = d, .rnext = r->ow_head};
            link_ent(s, i);
            r->ow_head = i;
            s->n_live_ow++;
        }
    }
    sc_hpush(s, pwait_heap(s, r), (uint64_t)(UINT32_MAX - r->plen), r->arrival_us, slot);
}

/* r stops waiting (started, ended): out of the heap and the waiter table. */
void sc_order_remove(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    if (!s->pwait || !longest(s, r)) return;
    sc_hremove(s, pwait_heap(s, r), slot);
    for (uint32_t i = r->ow_head, nx; i != OW_NONE; i = nx) {
        struct ow_ent *e = &s->ow[i];
        nx = e->rnext;
        if (e->prev != OW_NONE)
            s->ow[e->prev].next = e->next;
        else
            s->ow_bucket[bucket_of(s, e->key)] = e->next;
        if (e->next != OW_NONE) s->ow[e->next].prev = e->prev;
        e->slot = OW_NONE;
        e->next = s->ow_free;
        s->ow_free = i;
        s->n_live_ow--;
    }
    r->ow_head = OW_NONE;
    r->plen = 0;
}

/* The index gained the block named by key (a sequence computed it). */
void sc_order_inserted(sched *s, sched_prefix_key key)
{
    if (!s->pwait) return;
    for (uint32_t i = s->ow_bucket[bucket_of(s, key)]; i != OW_NONE; i = s->ow[i].next) {
        const struct ow_ent *e = &s->ow[i];
        if (!sched_prefix_key_eq(e->key, key)) continue;
        req *r = &s->reqs[e->slot];
        if (r->plen != e->depth) continue; /* a block above it is missing, or counted */
        r->plen = e->depth + 1;
        repush(s, e->slot);
    }
}

/* The index lost the block named by key (and, reported one by one, every block below it). */
void sc_order_dropped(sched *s, sched_prefix_key key)
{
    if (!s->pwait) return;
    for (uint32_t i = s->ow_bucket[bucket_of(s, key)]; i != OW_NONE; i = s->ow[i].next) {
        const struct ow_ent *e = &s->ow[i];
        if (!sched_prefix_key_eq(e->key, key)) continue;
        req *r = &s->reqs[e->slot];
        if (r->plen <= e->depth) continue;
        r->plen = e->depth;
        repush(s, e->slot);
    }
}

/* The request to take from (class cls, tenant t), whose arrival heap is not empty. */
uint32_t sc_order_pick(sched *s, int cls, int t, uint64_t now)
{
    size_t idx = (size_t)cls * (size_t)s->n_tenants + (size_t)t;
    const hent *oldest = &s->wait[idx].a[0];
    if (!s->pwait || s->cls[cls]->prefix_order != SCHED_PREFIX_ORDER_LONGEST || !s->pwait[idx].n)
        return oldest->slot;
    /* aging: a request that has waited the class's bound goes first, oldest first */
    if (now >= oldest->k1 && now - oldest->k1 >= s->cls[cls]->prefix_max_wait_us)
        return oldest->slot;
    return s->pwait[idx].a[0].slot;
}

/* Invariants (tests): every waiting request of a longest_prefix class is in its order heap
 * with the length a fresh lookup finds, and registered under each of its keys. */
int sc_order_check(const sched *s, char *why, size_t len)
{
    if (!s->pwait) return 0;
    uint32_t live = 0;
    for (uint32_t i = 0; i < s->n_ow; i++) live += s->ow[i].slot != OW_NONE;
    if (live != s->n_live_ow) {
        if (why && len)
            snprintf(why, len, "prefix order: %u waiter entries, %u counted", live, s->n_live_ow);
        return -EUCLEAN;
    }
    for (uint32_t sl = 0; sl < s->n_slots; sl++) {
        const req *r = &s->reqs[sl];
        if (!r->live || r->state != SCHED_REQ_WAITING || !longest(s, r)) continue;
        const heap *h = &s->pwait[(size_t)r->cls * (size_t)s->n_tenants + r->tenant];
        if (r->p_pos < 0 || (uint32_t)r->p_pos >= h->n || h->a[r->p_pos].slot != sl ||
            h->a[r->p_pos].k1 != (uint64_t)(UINT32_MAX - r->plen)) {
            if (why && len)
                snprintf(why, len,
                         "prefix order: request %llu is not in its order heap as it should be",
                         (unsigned long long)r->id);
            return -EUCLEAN;
        }
        uint32_t want = 0, max = 0;
        if (r->pcache) {
            max = (known(r) - 1) / s->conf.block_size;
            if (max > r->n_pkeys) max = r->n_pkeys;
            uint32_t *nodes = max ? malloc((size_t)max * sizeof(uint32_t)) : NULL;
            if (nodes)
                want =
                    sched_prefix_lookup(s->px, r->salt, r->pkeys, r->ptok, max, r->id, nodes, NULL);
            free(nodes);
        }
        uint32_t n = 0;
        for (uint32_t i = r->ow_head; i != OW_NONE; i = s->ow[i].rnext) n++;
        if (r->plen != want || n != max) {
            if (why && len)
                snprintf(why, len,
                         "prefix order: request %llu counts %u cached blocks, the index has %u; %u "
                         "of its %u keys registered",
                         (unsigned long long)r->id, r->plen, want, n, max);
            return -EUCLEAN;
        }
    }
    return 0;
}
