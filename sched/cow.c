/* SPDX-License-Identifier: MIT */
/* cow.c — copy-on-write of the prompt's last partial block among n samples of one prompt.
 *
 * The prefix cache shares whole blocks; the samples of one prompt (sched_request.sample)
 * would each compute the prompt's tokens past its last full block again.  Instead, a sample
 * submitted with sample_of takes a reference to its first sample's block holding them (the
 * first sample computed them; nothing ever writes those positions again: every later write
 * of any sharer is at or past the prompt's end).  The reference keeps the block off the free
 * list whatever the first sample does meanwhile: when it ends, is recompute-preempted or
 * swapped out, its table gives the block up through sc_dev_give, which leaves it to the
 * references.  At admission (sc_cow_start) the sample's first write into the block is its
 * very first step (its first token's row), so the copy is made then: a fresh block for it
 * and a plan copy src → dst, or, when it is the block's last holder, the block itself.
 *
 * Books: s->cow lists the shared blocks (a handful: one per group being forked), each with
 * its references and whether a sequence's table still holds it (owner).  A block in s->cow
 * is never free and never a cached node (sc_cache_commit waits until the sharing is over
 * before it caches it), so the prefix cache's eviction never hands it out.
 */
#include "sched/internal.h"

static struct cow_ent *find(const sched *s, uint32_t block)
{
    for (uint32_t i = 0; i < s->cow.n; i++)
        if (s->cow.a[i].block == block) return &s->cow.a[i];
    return NULL;
}

static void forget(sched *s, struct cow_ent *e)
{
    *e = s->cow.a[--s->cow.n];
}

bool sc_cow_shared(const sched *s, uint32_t block)
{
    return s->cow.n && find(s, block) != NULL;
}

void sc_dev_give(sched *s, uint32_t block)
{
    struct cow_ent *e = s->cow.n ? find(s, block) : NULL;
    if (e) {
        e->owner = false; /* the references keep it */
        return;
    }
    pool_give(&s->pools[SCHED_POOL_DEVICE], block);
}

void sc_cow_drop(sched *s, req *r)
{
    if (r->cow_blk == NO_SLOT) return;
    struct cow_ent *e = find(s, r->cow_blk);
    r->cow_blk = NO_SLOT;
    if (!e) return; /* cannot happen with consistent books */
    if (--e->refs) return;
    uint32_t b = e->block;
    bool owned = e->owner;
    forget(s, e);
    if (!owned) pool_give(&s->pools[SCHED_POOL_DEVICE], b);
}

void sc_cow_submit(sched *s, req *r, const sched_request *q)
{
    r->cow_blk = NO_SLOT;
    r->cow_len = 0;
    if (!q->sample || !q->sample_of || !r->pcache) return;
    uint32_t sl = map_get(s, q->sample_of);
    if (sl == NO_SLOT) return;
    const req *f = &s->reqs[sl];
    uint32_t bs = s->conf.block_size;
    /* the shared tokens: the first sample's prompt, but never this one's last known token
     * (it is computed, to sample from) */
    uint32_t len = f->prompt_len < q->prompt_len ? f->prompt_len : q->prompt_len - 1;
    uint32_t full = len / bs;
    if (len % bs == 0) return; /* no partial block: the cache shares them all */
    /* it has them computed, in its own device table, as this sample's tokens */
    if (f->state != SCHED_REQ_RUNNING || !f->pcache || f->salt != r->salt || f->computed < len ||
        f->n_dev <= full || f->dev[full] == SCHED_BLOCK_NONE || f->px_ld_n)
        return; /* (NONE: its window gave the block back, window.c) */
    if (memcmp(f->ptok + (size_t)full * bs, q->tokens + (size_t)full * bs,
               (size_t)(len - full * bs) * sizeof(int32_t)))
        return;
    uint32_t b = f->dev[full];
    struct cow_ent *e = find(s, b);
    if (!e) {
        struct cow_ent n = {.block = b, .refs = 0, .owner = true};
        VEC_PUSH(s, s->cow, n);
        if (s->oom) return;
        e = &s->cow.a[s->cow.n - 1];
    }
    e->refs++;
    r->cow_blk = b;
    r->cow_len = len;
}

uint32_t sc_cow_start(sched *s, req *r, uint32_t use)
{
    if (r->cow_blk == NO_SLOT) return 0;
    uint32_t bs = s->conf.block_size, full = r->cow_len / bs;
    /* the full blocks before it must be the cache's, all on the device (a shorter prefix
     * found: those tokens are computed anyway, the partial ones with them) */
    if (use != full || r->n_dev != full || r->px_ld_n || known(r) <= r->cow_len) {
        sc_cow_drop(s, r);
        return 0;
    }
    struct cow_ent *e = find(s, r->cow_blk);
    if (!e) {
        r->cow_blk = NO_SLOT;
        return 0;
    }
    if (e->refs == 1 && !e->owner) {
        /* the last holder: it writes into the block itself */
        if (!sc_vec_grow((void **)&r->dev, &r->cap_dev, full + 1, sizeof(uint32_t))) {
            s->oom = true;
            sc_cow_drop(s, r);
            return 0;
        }
        r->dev[r->n_dev++] = e->block;
        s->ts[r->tenant].kv_blocks++;
        forget(s, e);
        r->cow_blk = NO_SLOT;
        return r->cow_len - full * bs;
    }
    uint32_t src = e->block;
    if (!sc_dev_grow_to(s, r, full + 1)) {
        sc_cow_drop(s, r);
        return 0;
    }
    sched_copy c = {.req = r->id, .src = src, .dst = r->dev[full]};
    VEC_PUSH(s, s->copies, c);
    sc_cow_drop(s, r); /* others (or the first sample) still hold src: it stays */
    return r->cow_len - full * bs;
}

int sc_cow_check(const sched *s, uint32_t *holders, char *why, size_t len)
{
    for (uint32_t i = 0; i < s->cow.n; i++) {
        const struct cow_ent *e = &s->cow.a[i];
        uint32_t refs = 0;
        for (uint32_t k = 0; k < s->n_slots; k++) {
            const req *r = &s->reqs[k];
            if (r->live && r->cow_blk == e->block) refs++;
        }
        if (e->block >= s->pools[SCHED_POOL_DEVICE].total || !e->refs || refs != e->refs) {
            if (why && len)
                snprintf(why, len, "shared block %u: %u references counted, %u requests hold it",
                         e->block, e->refs, refs);
            return -EUCLEAN;
        }
        if (s->px &&
            sched_prefix_node_of(s->px, SCHED_POOL_DEVICE, e->block) != SCHED_PREFIX_NONE) {
            if (why && len) snprintf(why, len, "shared block %u is a cached node", e->block);
            return -EUCLEAN;
        }
        if (!e->owner)
            holders[e->block]++; /* the references are its one holder */
        else if (!holders[e->block]) {
            if (why && len)
                snprintf(why, len, "shared block %u: no sequence holds it, the books say one does",
                         e->block);
            return -EUCLEAN;
        }
    }
    for (uint32_t k = 0; k < s->n_slots; k++) {
        const req *r = &s->reqs[k];
        if (r->live && r->cow_blk != NO_SLOT && r->state != SCHED_REQ_WAITING &&
            r->state != SCHED_REQ_ENDED) { /* (ended: it drops it at its release) */
            if (why && len)
                snprintf(why, len, "request %llu holds a shared block while not waiting",
                         (unsigned long long)r->id);
            return -EUCLEAN;
        }
    }
    return 0;
}
