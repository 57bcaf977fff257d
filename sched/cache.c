/* SPDX-License-Identifier: MIT */
/*
 * cache.c — the scheduler's side of the prefix cache (DESIGN §10; the index: prefix.c).
 *
 * Who owns a device block:
 *   free        in the device pool's free stack;
 *   private     one sequence's dev[] (its tail, or blocks not cached);
 *   cached      a node of the index; held by the sequences whose dev[0..n_pnodes) list it
 *               (the node's refs), or by none (then in the index's LRU: evictable, counted
 *               free in sched_counts).
 * A sequence's first n_pnodes blocks are always cached nodes, in chain order; it writes only
 * positions >= computed, which lie in later blocks, so a shared block is never written.
 *
 * Life: at submit a request's prompt tokens are copied and its block keys computed (salted
 * with its cache domain); at admission (token_budget mode) the longest cached prefix is
 * found — capped so the last prompt token is always computed — the blocks are held, and
 * computed starts after them; at each commit the newly full prompt blocks are inserted (a
 * block someone else cached meanwhile is shared instead, and the private copy freed); when
 * the sequence's device blocks go (finish, cancel, timeout, recompute preemption, the end of
 * a swap-out) its holds are released and the blocks stay cached.  Free-block demand evicts
 * unheld cached blocks, oldest leaf first (sc_dev_grow_to).
 *
 * Today the index covers the device pool only: evicted blocks are dropped, not demoted,
 * because a demotion needs a copy the caller must finish before the block is reused.
 */
#include "sched/internal.h"

static bool take_block(void *ctx, sched_pool p, uint32_t *b)
{
    sched *s = ctx;
    if (!s->pools[p].n_free) return false;
    *b = pool_take(&s->pools[p]);
    return true;
}

static void evicted(void *ctx, const sched_prefix_eviction *ev)
{
    sched *s = ctx;
    pool_give(&s->pools[ev->from], ev->from_block);
    s->px_evicted++;
    if (!ev->demoted && ev->reason != SCHED_PREFIX_EVICT_MOVED) sc_order_dropped(s, ev->key);
}

int sc_cache_create(sched *s)
{
    if (!s->conf.prefix_cache || s->cfg.mode != SCHED_MODE_TOKEN_BUDGET) return 0;
    uint32_t caps[SCHED_MAX_TENANTS];
    for (int t = 0; t < s->n_tenants; t++) caps[t] = s->ten[t]->max_cached_blocks;
    sched_prefix_cfg c = {
        .block_size = s->conf.block_size,
        .pool_blocks = {s->conf.kv_blocks_device, 0, 0},
        .n_tenants = (uint32_t)s->n_tenants,
        .max_cached_blocks = caps,
        .costs = {.recompute_us_per_block = s->conf.step.prefill_token_us * s->conf.block_size, .reuse_prior = 1},
        .ops = {.take_block = take_block, .evicted = evicted, .ctx = s},
    };
    return sched_prefix_create(&c, &s->px);
}

void sc_cache_free_req(req *r)
{
    free(r->ptok);
    free(r->pkeys);
    free(r->pnodes);
}

int sc_cache_submit(sched *s, req *r, const sched_request *q)
{
    r->pcache = false;
    r->n_pkeys = r->n_pnodes = r->n_found = 0;
    if (!s->px || !q->tokens) return 0;
    uint32_t bs = s->conf.block_size, nb = q->prompt_len / bs;
    if (!sc_vec_grow((void **)&r->ptok, &r->cap_ptok, q->prompt_len, sizeof(int32_t)) ||
        !sc_vec_grow((void **)&r->pkeys, &r->cap_pkeys, nb ? nb : 1, sizeof(sched_prefix_key)) ||
        !sc_vec_grow((void **)&r->pnodes, &r->cap_pnodes, nb ? nb : 1, sizeof(uint32_t)))
        return -ENOMEM;
    memcpy(r->ptok, q->tokens, (size_t)q->prompt_len * sizeof(int32_t));
    r->salt = q->cache_salt;
    r->n_pkeys = sched_prefix_keys(r->salt, r->ptok, q->prompt_len, bs, r->pkeys, nb);
    r->pcache = true;
    return 0;
}

uint32_t sc_dev_available(const sched *s)
{
    uint32_t n = s->pools[SCHED_POOL_DEVICE].n_free;
    if (s->px) {
        sched_prefix_stats st;
        sched_prefix_get_stats(s->px, &st);
        n += st.unheld[SCHED_POOL_DEVICE];
    }
    return n;
}

/* The longest cached prefix of a waiting request, remembered for sc_cache_start; *unheld
 * says how many of those blocks are evictable now (holding them makes them unavailable). */
uint32_t sc_cache_find(sched *s, uint32_t slot, uint32_t *unheld)
{
    req *r = &s->reqs[slot];
    *unheld = 0;
    r->n_found = 0;
    if (!r->pcache || r->n_pnodes) return 0;
    uint32_t bs = s->conf.block_size;
    uint32_t max = (known(r) - 1) / bs;   /* the last known token is computed: it samples */
    if (max > r->n_pkeys) max = r->n_pkeys;
    r->n_found = sched_prefix_lookup(s->px, r->salt, r->pkeys, r->ptok, max, r->id, r->pnodes, NULL);
    for (uint32_t i = 0; i < r->n_found; i++) {
        sched_prefix_node_info in;
        sched_prefix_node(s->px, r->pnodes[i], &in);
        if (!in.refs) (*unheld)++;
    }
    return r->n_found;
}

/* Admission: hold what sc_cache_find found, make those blocks the start of the block table
 * and start the prefill after them. */
void sc_cache_start(sched *s, req *r, uint64_t now)
{
    if (!r->pcache) return;
    uint32_t m = r->n_found, bs = s->conf.block_size;
    r->n_found = 0;
    s->px_query += known(r);
    if (!m) return;
    if (!sc_vec_grow((void **)&r->dev, &r->cap_dev, m, sizeof(uint32_t))) { s->oom = true; return; }
    sched_prefix_acquire(s->px, r->pnodes, m, r->id);
    uint32_t self = 0;
    for (uint32_t i = 0; i < m; i++) {
        sched_prefix_node_info in;
        sched_prefix_node(s->px, r->pnodes[i], &in);
        r->dev[i] = in.block;
        self += in.origin == r->id;
    }
    r->n_dev = r->n_pnodes = m;
    r->computed = m * bs;
    s->ts[r->tenant].kv_blocks += m;
    s->px_hit += (uint64_t)m * bs;
    s->px_self += (uint64_t)self * bs;
    if (!r->started) r->cached_tokens = m * bs;
    sched_event e = ev_of(s, SCHED_EV_CACHE_HIT, r, now);
    e.blocks = m;
    e.pool = SCHED_POOL_DEVICE;
    e.cached_tokens = m * bs;
    e.self_tokens = self * bs;
    e.prompt_tokens = known(r);
    emit(s, &e);
}

/* Commit: cache the prompt blocks this step filled. */
void sc_cache_commit(sched *s, req *r)
{
    uint32_t bs = s->conf.block_size;
    while (r->n_pnodes < r->n_pkeys && r->n_pnodes < r->n_dev && (uint64_t)(r->n_pnodes + 1) * bs <= r->computed) {
        uint32_t i = r->n_pnodes, node;
        int rc = sched_prefix_insert(s->px, i ? r->pnodes[i - 1] : SCHED_PREFIX_NONE, r->salt, r->pkeys[i],
                                     r->ptok + (size_t)i * bs, r->tenant, r->id, SCHED_POOL_DEVICE, r->dev[i], &node);
        if (rc == -EEXIST) {   /* computed twice: share the cached copy, free ours */
            sched_prefix_node_info in;
            sched_prefix_node(s->px, node, &in);
            pool_give(&s->pools[SCHED_POOL_DEVICE], r->dev[i]);
            r->dev[i] = in.block;
        } else if (rc) {
            break;   /* cannot happen with consistent books; the blocks stay private */
        } else {
            sc_order_inserted(s, r->pkeys[i]);   /* waiting requests' cached prefixes grow */
        }
        r->pnodes[r->n_pnodes++] = node;
    }
}

/* The sequence gives up its device blocks: release its holds.  Returns how many leading
 * blocks of dev[] now belong to the cache (the caller frees only the rest). */
uint32_t sc_cache_release(sched *s, req *r)
{
    uint32_t k = r->n_pnodes;
    if (!k) return 0;
    uint64_t before = s->px_evicted;
    sched_prefix_release(s->px, r->pnodes, k);
    r->n_pnodes = 0;
    if (s->px_evicted != before && s->sink) {   /* its tenant went over max_cached_blocks */
        sched_event e = ev_of(s, SCHED_EV_CACHE_EVICT, r, s->last_now);
        e.blocks = (uint32_t)(s->px_evicted - before);
        e.pool = SCHED_POOL_DEVICE;
        e.evict = SCHED_PREFIX_EVICT_TENANT_CAP;
        emit(s, &e);
    }
    return k;
}

/* Free-block demand: evict up to n unheld cached blocks for r, with one event. */
uint32_t sc_cache_evict(sched *s, req *r, uint32_t n)
{
    uint64_t before = s->px_evicted;
    sched_prefix_evict(s->px, SCHED_POOL_DEVICE, n);
    uint32_t freed = (uint32_t)(s->px_evicted - before);
    if (freed && s->sink) {
        sched_event e = ev_of(s, SCHED_EV_CACHE_EVICT, r, s->last_now);
        e.blocks = freed;
        e.pool = SCHED_POOL_DEVICE;
        e.evict = SCHED_PREFIX_EVICT_DEMAND;
        emit(s, &e);
    }
    return freed;
}

/* Device blocks with the cache on: holders[b] counts b's holders (sequences) plus its
 * appearances in the free stack.  A cached block is held exactly refs times and never free;
 * any other block is free or one sequence's.  Then the index's own invariants. */
int sc_cache_check(const sched *s, const uint32_t *holders, char *why, size_t len)
{
    for (uint32_t i = 0; i < s->n_slots; i++) {
        const req *r = &s->reqs[i];
        if (!r->live && !r->n_pnodes) continue;
        for (uint32_t k = 0; k < r->n_pnodes; k++)
            if (k >= r->n_dev || sched_prefix_node_of(s->px, SCHED_POOL_DEVICE, r->dev[k]) != r->pnodes[k]) {
                if (why && len) snprintf(why, len, "request %llu: block %u of its table is not the cached node it holds",
                                         (unsigned long long)r->id, k);
                return -EUCLEAN;
            }
    }
    for (uint32_t b = 0; b < s->pools[SCHED_POOL_DEVICE].total; b++) {
        uint32_t node = sched_prefix_node_of(s->px, SCHED_POOL_DEVICE, b);
        uint32_t want = 1;
        if (node != SCHED_PREFIX_NONE) {
            sched_prefix_node_info in;
            sched_prefix_node(s->px, node, &in);
            want = in.refs;
        }
        if (holders[b] != want) {
            if (why && len)
                snprintf(why, len, "pool device: block %u is %s %u times, %s %u", b,
                         node != SCHED_PREFIX_NONE ? "cached and held/free" : "owned/free", holders[b],
                         node != SCHED_PREFIX_NONE ? "its reference count says" : "want", want);
            return -EUCLEAN;
        }
    }
    return sched_prefix_check(s->px, why, len);
}
