/* SPDX-License-Identifier: MIT */
/*
 * prefix.c — the prefix cache's index (see prefix.h for the model and its invariants).
 *
 * Data structures:
 *   - nodes live in one array sized to every pool's blocks together (a cached block is one
 *     node, and a block is cached at most once), free nodes chained through `hnext`;
 *   - a chained hash table on the key finds the candidates for (parent, salt, tokens); the
 *     stored tokens (block_size per node, one array) settle it;
 *   - each node links its children (first_child / sibling list) and counts them per pool, so
 *     dropping a block can drop what hangs below it and eviction can tell a pool's leaves;
 *   - one intrusive LRU per pool and one per tenant, both of unheld blocks only, newest at
 *     the head: push, unlink and take-oldest are O(1);
 *   - (pool, block) → node maps, so the owner can ask whether a block is cached.
 * Nothing allocates after create except sched_prefix_check (tests).
 */
#include "sched/prefix.h"
#include "sched/sched_testing.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

void sched__set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define NONE SCHED_PREFIX_NONE

/* ---------------------------------------------------------------------------------------- */
/* Keys                                                                                     */
/* ---------------------------------------------------------------------------------------- */

sched_prefix_key sched_prefix_block_key(sched_prefix_key parent, uint64_t salt,
                                        const int32_t *tokens, uint32_t n)
{
    return sched_prefix_block_key_with(SCHED_PREFIX_KEY_XXH3, parent, salt, tokens, n);
}

uint32_t sched_prefix_keys(uint64_t salt, const int32_t *tokens, uint32_t n_tokens,
                           uint32_t block_size, sched_prefix_key *out, uint32_t max_out)
{
    return sched_prefix_keys_with(SCHED_PREFIX_KEY_XXH3, salt, tokens, n_tokens, block_size, out,
                                  max_out);
}

const char *sched_prefix_key_fn_name(sched_prefix_key_fn f)
{
    return f == SCHED_PREFIX_KEY_XXH3 ? "xxh3" : f == SCHED_PREFIX_KEY_CONSTANT ? "constant" : "?";
}

sched_prefix_key sched_prefix_block_key_with(sched_prefix_key_fn fn, sched_prefix_key parent,
                                             uint64_t salt, const int32_t *tokens, uint32_t n)
{
    /* every block collides: only the stored tokens, salt and parent can tell them apart
     * (find below) — {1, 1}, not the root's parent {0, 0} */
    if (fn == SCHED_PREFIX_KEY_CONSTANT) return (sched_prefix_key){1, 1};
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    uint64_t head[3] = {parent.lo, parent.hi, salt};
    XXH3_128bits_update(&st, head, sizeof head);
    XXH3_128bits_update(&st, tokens, (size_t)n * sizeof *tokens);
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    return (sched_prefix_key){h.low64, h.high64};
}

uint32_t sched_prefix_keys_with(sched_prefix_key_fn fn, uint64_t salt, const int32_t *tokens,
                                uint32_t n_tokens, uint32_t block_size, sched_prefix_key *out,
                                uint32_t max_out)
{
    if (!block_size || !tokens || !out) return 0;
    uint32_t n = n_tokens / block_size;
    if (n > max_out) n = max_out;
    sched_prefix_key k = {0, 0};
    for (uint32_t i = 0; i < n; i++)
        out[i] = k =
            sched_prefix_block_key_with(fn, k, salt, tokens + (size_t)i * block_size, block_size);
    return n;
}


/* ---------------------------------------------------------------------------------------- */
/* Types                                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct pnode {
    sched_prefix_key key;
    uint64_t salt, origin;
    uint32_t parent, first_child, next_sib, prev_sib;
    uint32_t hnext;        /* hash chain, or the free list */
    uint32_t prev, next;   /* pool LRU (prev = newer, next = older) */
    uint32_t tprev, tnext; /* tenant LRU */
    uint32_t refs, block, hits, gen;
    uint32_t kids[SCHED_POOL__COUNT];
    uint16_t tenant;
    uint8_t pool, used;
    uint8_t bad;     /* its bytes are wrong (a failed copy): never found again,
                                       dropped when its last holder lets go */
    uint8_t loading; /* a holder's reload reads its block (sched_prefix_set_loading) */
} pnode;

typedef struct dlist {
    uint32_t head, tail, n;
} dlist; /* head newest, tail oldest */

struct sched_prefix {
    uint32_t bs; /* block size */
    uint32_t pool_blocks[SCHED_POOL__COUNT];
    uint32_t n_tenants;
    uint32_t *max_cached; /* per tenant, 0 = unlimited */
    sched_prefix_costs costs;
    sched_prefix_ops ops;
    pnode *n;
    uint32_t cap, free_head;
    int32_t *tokens; /* cap × bs */
    uint32_t *bucket;
    uint32_t mask;
    uint32_t *blk2node[SCHED_POOL__COUNT];
    dlist lru[SCHED_POOL__COUNT];
    dlist *ten; /* per tenant */
    uint32_t cached[SCHED_POOL__COUNT];
    uint64_t evicted[SCHED_PREFIX_EVICT__COUNT];
    uint64_t demoted[SCHED_POOL__COUNT];
};

#define N(i) (ix->n[(i)])

static inline uint32_t bucket_of(const sched_prefix *ix, sched_prefix_key k)
{
    return (uint32_t)((k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull)) >> 17) & ix->mask;
}

static inline const int32_t *toks(const sched_prefix *ix, uint32_t i)
{
    return ix->tokens + (size_t)i * ix->bs;
}

/* ---- the two LRU lists (same shape, different link fields) ------------------------------ */

#define DLIST_OPS(name, PREV, NEXT)                                                                \
    static void name##_push(sched_prefix *ix, dlist *l, uint32_t i)                                \
    {                                                                                              \
        N(i).PREV = NONE;                                                                          \
        N(i).NEXT = l->head;                                                                       \
        if (l->head != NONE)                                                                       \
            N(l->head).PREV = i;                                                                   \
        else                                                                                       \
            l->tail = i;                                                                           \
        l->head = i;                                                                               \
        l->n++;                                                                                    \
    }                                                                                              \
    static void name##_unlink(sched_prefix *ix, dlist *l, uint32_t i)                              \
    {                                                                                              \
        if (N(i).PREV != NONE)                                                                     \
            N(N(i).PREV).NEXT = N(i).NEXT;                                                         \
        else                                                                                       \
            l->head = N(i).NEXT;                                                                   \
        if (N(i).NEXT != NONE)                                                                     \
            N(N(i).NEXT).PREV = N(i).PREV;                                                         \
        else                                                                                       \
            l->tail = N(i).PREV;                                                                   \
        N(i).PREV = N(i).NEXT = NONE;                                                              \
        l->n--;                                                                                    \
    }
DLIST_OPS(lru, prev, next)
DLIST_OPS(ten, tprev, tnext)

/* An unheld node enters / leaves both LRUs together. */
static void unheld_push(sched_prefix *ix, uint32_t i)
{
    lru_push(ix, &ix->lru[N(i).pool], i);
    ten_push(ix, &ix->ten[N(i).tenant], i);
}

static void unheld_unlink(sched_prefix *ix, uint32_t i)
{
    lru_unlink(ix, &ix->lru[N(i).pool], i);
    ten_unlink(ix, &ix->ten[N(i).tenant], i);
}

/* ---------------------------------------------------------------------------------------- */
/* Create / destroy                                                                         */
/* ---------------------------------------------------------------------------------------- */

int sched_prefix_create(const sched_prefix_cfg *cfg, sched_prefix **out)
{
    if (!cfg || !out) {
        sched__set_error("sched_prefix_create: NULL argument");
        return -EINVAL;
    }
    if (!cfg->block_size) {
        sched__set_error("sched_prefix_create: block_size must be > 0");
        return -EINVAL;
    }
    if (!cfg->n_tenants || cfg->n_tenants > UINT16_MAX) {
        sched__set_error("sched_prefix_create: n_tenants must be 1..65535, got %u", cfg->n_tenants);
        return -EINVAL;
    }
    if (!cfg->ops.take_block) {
        sched__set_error("sched_prefix_create: ops.take_block is NULL");
        return -EINVAL;
    }
    uint64_t cap = 0;
    for (int p = 0; p < SCHED_POOL__COUNT; p++) cap += cfg->pool_blocks[p];
    if (!cap || cap >= NONE / 2) {
        sched__set_error("sched_prefix_create: pools must hold 1..%u blocks in all, got %llu",
                         NONE / 2 - 1, (unsigned long long)cap);
        return -EINVAL;
    }
    sched_prefix *ix = calloc(1, sizeof *ix);
    if (!ix) goto oom;
    ix->bs = cfg->block_size;
    ix->n_tenants = cfg->n_tenants;
    ix->costs = cfg->costs;
    ix->ops = cfg->ops;
    ix->cap = (uint32_t)cap;
    memcpy(ix->pool_blocks, cfg->pool_blocks, sizeof ix->pool_blocks);
    uint32_t nb = 1;
    while (nb < ix->cap * 2) nb <<= 1;
    ix->mask = nb - 1;
    ix->n = calloc(ix->cap, sizeof *ix->n);
    ix->tokens = malloc((size_t)ix->cap * ix->bs * sizeof *ix->tokens);
    ix->bucket = malloc((size_t)nb * sizeof *ix->bucket);
    ix->ten = calloc(ix->n_tenants, sizeof *ix->ten);
    ix->max_cached = calloc(ix->n_tenants, sizeof *ix->max_cached);
    if (!ix->n || !ix->tokens || !ix->bucket || !ix->ten || !ix->max_cached) goto oom_free;
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        ix->blk2node[p] = malloc((size_t)(ix->pool_blocks[p] + 1) * sizeof(uint32_t));
        if (!ix->blk2node[p]) goto oom_free;
        for (uint32_t b = 0; b < ix->pool_blocks[p]; b++) ix->blk2node[p][b] = NONE;
        ix->lru[p] = (dlist){NONE, NONE, 0};
    }
    for (uint32_t t = 0; t < ix->n_tenants; t++) {
        ix->ten[t] = (dlist){NONE, NONE, 0};
        if (cfg->max_cached_blocks) ix->max_cached[t] = cfg->max_cached_blocks[t];
    }
    memset(ix->bucket, 0xff, (size_t)nb * sizeof *ix->bucket);
    for (uint32_t i = 0; i < ix->cap; i++) N(i).hnext = i + 1 < ix->cap ? i + 1 : NONE;
    ix->free_head = 0;
    *out = ix;
    return 0;
oom_free:
    sched_prefix_destroy(ix);
oom:
    sched__set_error("sched_prefix_create: out of memory");
    return -ENOMEM;
}

void sched_prefix_destroy(sched_prefix *ix)
{
    if (!ix) return;
    for (int p = 0; p < SCHED_POOL__COUNT; p++) free(ix->blk2node[p]);
    free(ix->n);
    free(ix->tokens);
    free(ix->bucket);
    free(ix->ten);
    free(ix->max_cached);
    free(ix);
}

void sched_prefix_set_costs(sched_prefix *ix, const sched_prefix_costs *c)
{
    if (ix && c) ix->costs = *c;
}

/* ---------------------------------------------------------------------------------------- */
/* Finding                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* The node for block (parent, salt, key, tokens), or NONE.  The key only narrows the search:
 * equal tokens, salt and parent make the match. */
static uint32_t find(const sched_prefix *ix, uint32_t parent, uint64_t salt, sched_prefix_key key,
                     const int32_t *tokens)
{
    for (uint32_t i = ix->bucket[bucket_of(ix, key)]; i != NONE; i = N(i).hnext)
        if (sched_prefix_key_eq(N(i).key, key) && N(i).parent == parent && N(i).salt == salt &&
            !N(i).bad && !memcmp(toks(ix, i), tokens, (size_t)ix->bs * sizeof *tokens))
            return i;
    return NONE;
}

uint32_t sched_prefix_lookup(const sched_prefix *ix, uint64_t salt, const sched_prefix_key *keys,
                             const int32_t *tokens, uint32_t n_blocks, uint64_t requester,
                             uint32_t *nodes_out, sched_prefix_match *m)
{
    sched_prefix_match r = {0};
    if (ix && keys && tokens && nodes_out) {
        uint32_t parent = NONE;
        for (uint32_t b = 0; b < n_blocks; b++) {
            uint32_t i = find(ix, parent, salt, keys[b], tokens + (size_t)b * ix->bs);
            if (i == NONE) break;
            nodes_out[r.n_blocks++] = i;
            r.per_pool[N(i).pool]++;
            if (N(i).origin == requester) r.self_blocks++;
            parent = i;
        }
    }
    if (m) *m = r;
    return r.n_blocks;
}

static bool node_ok(const sched_prefix *ix, uint32_t i)
{
    return i < ix->cap && N(i).used;
}

/* ---------------------------------------------------------------------------------------- */
/* Leaving a pool                                                                           */
/* ---------------------------------------------------------------------------------------- */

/* ---- KV-cache events: what a lookup can find (sched.h) ---- */

/* Node i is now findable in its pool. */
static void kv_stored(const sched_prefix *ix, uint32_t i)
{
    const pnode *x = &N(i);
    if (!ix->ops.kv || x->bad) return;
    sched_kv_event e = {.kind = SCHED_KV_STORED,
                        .pool = (sched_pool)x->pool,
                        .key_lo = x->key.lo,
                        .key_hi = x->key.hi,
                        .tokens = toks(ix, i),
                        .n_tokens = ix->bs,
                        .tenant = x->tenant};
    if (x->parent != NONE) {
        e.has_parent = true;
        e.parent_lo = N(x->parent).key.lo;
        e.parent_hi = N(x->parent).key.hi;
    }
    ix->ops.kv(ix->ops.ctx, &e);
}

static void kv_removed(const sched_prefix *ix, sched_prefix_key key, sched_pool pool,
                       uint16_t tenant)
{
    if (!ix->ops.kv) return;
    sched_kv_event e = {.kind = SCHED_KV_REMOVED,
                        .pool = pool,
                        .key_lo = key.lo,
                        .key_hi = key.hi,
                        .tenant = tenant};
    ix->ops.kv(ix->ops.ctx, &e);
}

static void report(sched_prefix *ix, sched_prefix_eviction *ev)
{
    ix->evicted[ev->reason]++;
    if (ev->demoted) ix->demoted[ev->to]++;
    /* an invalidated node was told removed when its copy failed */
    if (!N(ev->node).bad) {
        kv_removed(ix, ev->key, ev->from, ev->tenant);
        if (ev->demoted || ev->reason == SCHED_PREFIX_EVICT_MOVED) kv_stored(ix, ev->node);
    }
    if (ix->ops.evicted) ix->ops.evicted(ix->ops.ctx, ev);
}

static sched_prefix_eviction ev_of(const sched_prefix *ix, uint32_t i,
                                   sched_prefix_evict_reason why)
{
    return (sched_prefix_eviction){.node = i,
                                   .key = N(i).key,
                                   .tenant = N(i).tenant,
                                   .reason = why,
                                   .from = (sched_pool)N(i).pool,
                                   .from_block = N(i).block};
}

/* Put node i at (pool, block), keeping the per-pool counts and maps. */
static void place(sched_prefix *ix, uint32_t i, sched_pool pool, uint32_t block)
{
    pnode *x = &N(i);
    if (x->parent != NONE) {
        N(x->parent).kids[x->pool]--;
        N(x->parent).kids[pool]++;
    }
    ix->blk2node[x->pool][x->block] = NONE;
    ix->cached[x->pool]--;
    x->pool = (uint8_t)pool;
    x->block = block;
    ix->blk2node[pool][block] = i;
    ix->cached[pool]++;
}

/* Remove a childless, unheld node from everything and report it. */
static void drop_node(sched_prefix *ix, uint32_t i, sched_prefix_eviction *ev)
{
    pnode *x = &N(i);
    if (!x->refs) unheld_unlink(ix, i);
    uint32_t *pp = &ix->bucket[bucket_of(ix, x->key)];
    while (*pp != i) pp = &N(*pp).hnext;
    *pp = x->hnext;
    if (x->parent != NONE) {
        pnode *p = &N(x->parent);
        p->kids[x->pool]--;
        if (x->prev_sib != NONE)
            N(x->prev_sib).next_sib = x->next_sib;
        else
            p->first_child = x->next_sib;
        if (x->next_sib != NONE) N(x->next_sib).prev_sib = x->prev_sib;
    }
    ix->blk2node[x->pool][x->block] = NONE;
    ix->cached[x->pool]--;
    report(ix, ev);
    x->used = 0;
    x->gen++;
    x->hnext = ix->free_head;
    ix->free_head = i;
}

/* Drop node v and everything below it (which no lookup could reach without v), leaves first:
 * every one is unheld, since a holder holds the whole chain above what it holds. */
static void drop_subtree(sched_prefix *ix, uint32_t v, const sched_prefix_eviction *v_ev)
{
    uint32_t cur = v;
    for (;;) {
        while (N(cur).first_child != NONE) cur = N(cur).first_child;
        uint32_t up = N(cur).parent;
        if (cur == v) {
            sched_prefix_eviction ev = *v_ev;
            drop_node(ix, cur, &ev);
            return;
        }
        sched_prefix_eviction ev = ev_of(ix, cur, SCHED_PREFIX_EVICT_ORPHAN);
        drop_node(ix, cur, &ev);
        cur = up;
    }
}

/* The oldest unheld block of `pool` that has no child in the same pool.  Releases going leaf
 * to root make that the LRU's tail; should a child ever sit there anyway, walk down to one. */
static uint32_t pick_victim(const sched_prefix *ix, sched_pool pool)
{
    uint32_t v = ix->lru[pool].tail;
    while (v != NONE && N(v).kids[pool]) {
        uint32_t c = N(v).first_child;
        while (c != NONE && N(c).pool != pool) c = N(c).next_sib;
        v = c;
    }
    return v;
}

static int colder_pool(const sched_prefix *ix, sched_pool pool)
{
    for (int p = (int)pool + 1; p < SCHED_POOL__COUNT; p++)
        if (ix->pool_blocks[p]) return p;
    return -1;
}

/* Evict one block of `pool` (demand): demote it when a colder pool exists, has room (a free
 * block, or an unheld block it can evict in turn) and reload beats recompute × expected
 * reuse; otherwise drop it with what hangs below it.  false when the LRU is empty. */
static bool evict_one(sched_prefix *ix, sched_pool pool)
{
    uint32_t v = pick_victim(ix, pool);
    if (v == NONE) return false;
    sched_prefix_eviction ev = ev_of(ix, v, SCHED_PREFIX_EVICT_DEMAND);
    ev.recompute_cost_us = ix->costs.recompute_us_per_block;
    ev.expected_reuse = ix->costs.reuse_prior + N(v).hits;
    ev.reload_cost_us = -1;
    int to = colder_pool(ix, pool);
    if (to >= 0) {
        ev.reload_cost_us = ix->costs.reload_us_per_block[to];
        if (ev.reload_cost_us < ev.recompute_cost_us * ev.expected_reuse) {
            uint32_t gen = N(v).gen, b;
            bool ok = ix->ops.take_block(ix->ops.ctx, (sched_pool)to, &b);
            if (!ok && ix->lru[to].n && evict_one(ix, (sched_pool)to))
                ok = ix->ops.take_block(ix->ops.ctx, (sched_pool)to, &b);
            /* making room below can only drop v if v hung under a colder block: then v is
             * gone (reported as an orphan) and its block is free all the same */
            if (!N(v).used || N(v).gen != gen) return true;
            if (!ok) ev.reload_cost_us = -1; /* no room below: dropped for that */
            if (ok) {
                lru_unlink(ix, &ix->lru[pool], v);
                place(ix, v, (sched_pool)to, b);
                lru_push(ix, &ix->lru[to], v);
                ev.demoted = true;
                ev.to = (sched_pool)to;
                ev.to_block = b;
                report(ix, &ev);
                return true;
            }
        }
    }
    drop_subtree(ix, v, &ev);
    return true;
}

uint32_t sched_prefix_evict(sched_prefix *ix, sched_pool pool, uint32_t n)
{
    if (!ix || (unsigned)pool >= SCHED_POOL__COUNT) return 0;
    uint32_t freed = 0;
    while (freed < n && ix->lru[pool].n) {
        uint32_t before = ix->cached[pool];
        if (!evict_one(ix, pool)) break;
        freed += before - ix->cached[pool];
    }
    return freed;
}

/* Drop tenant t's oldest unheld blocks (leaves first) until it is within its cap. */
static void enforce_cap(sched_prefix *ix, uint16_t t)
{
    uint32_t cap = ix->max_cached[t];
    while (cap && ix->ten[t].n > cap) {
        uint32_t v = ix->ten[t].tail;
        while (N(v).first_child != NONE) v = N(v).first_child;
        sched_prefix_eviction ev = ev_of(ix, v, SCHED_PREFIX_EVICT_TENANT_CAP);
        drop_node(ix, v, &ev);
    }
}

uint32_t sched_prefix_findable(const sched_prefix *ix)
{
    if (!ix) return 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < ix->cap; i++) n += N(i).used && !N(i).bad;
    return n;
}

uint32_t sched_prefix_announce(const sched_prefix *ix)
{
    if (!ix || !ix->ops.kv) return 0;
    sched_kv_event clr = {.kind = SCHED_KV_CLEARED};
    ix->ops.kv(ix->ops.ctx, &clr);
    /* each tree depth first from its root, without recursion (prompts run to thousands of
     * blocks): down to the first child, else on to the next sibling of the nearest ancestor
     * that has one.  A bad node's subtree is unreachable by lookups: skipped whole. */
    uint32_t n = 0;
    for (uint32_t root = 0; root < ix->cap; root++) {
        if (!N(root).used || N(root).parent != NONE || N(root).bad) continue;
        uint32_t cur = root;
        kv_stored(ix, cur);
        n++;
        for (;;) {
            uint32_t next = N(cur).first_child;
            while (next != NONE && N(next).bad) next = N(next).next_sib;
            if (next == NONE) {
                for (;;) {
                    if (cur == root) break;
                    next = N(cur).next_sib;
                    while (next != NONE && N(next).bad) next = N(next).next_sib;
                    if (next != NONE) break;
                    cur = N(cur).parent;
                }
                if (next == NONE) break;
            }
            cur = next;
            kv_stored(ix, cur);
            n++;
        }
    }
    return n;
}

uint32_t sched_prefix_clear(sched_prefix *ix)
{
    if (!ix) return 0;
    uint32_t n = 0;
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        while (ix->lru[p].n) {
            uint32_t before = ix->cached[0] + ix->cached[1] + ix->cached[2];
            uint32_t v = ix->lru[p].tail;
            sched_prefix_eviction ev = ev_of(ix, v, SCHED_PREFIX_EVICT_CLEAR);
            drop_subtree(ix, v, &ev);
            n += before - (ix->cached[0] + ix->cached[1] + ix->cached[2]);
        }
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* Holding                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static void hold(sched_prefix *ix, uint32_t i, uint64_t requester)
{
    if (!N(i).refs++) unheld_unlink(ix, i);
    if (N(i).origin != requester) N(i).hits++;
}

int sched_prefix_acquire(sched_prefix *ix, const uint32_t *nodes, uint32_t n, uint64_t requester)
{
    if (!ix || (n && !nodes)) {
        sched__set_error("sched_prefix_acquire: NULL argument");
        return -EINVAL;
    }
    for (uint32_t k = 0; k < n; k++)
        if (!node_ok(ix, nodes[k])) {
            sched__set_error("sched_prefix_acquire: node %u (entry %u) is not cached", nodes[k], k);
            return -EINVAL;
        }
    for (uint32_t k = 0; k < n; k++) hold(ix, nodes[k], requester);
    return 0;
}

int sched_prefix_release(sched_prefix *ix, const uint32_t *nodes, uint32_t n)
{
    if (!ix || (n && !nodes)) {
        sched__set_error("sched_prefix_release: NULL argument");
        return -EINVAL;
    }
    for (uint32_t k = 0; k < n; k++)
        if (!node_ok(ix, nodes[k]) || !N(nodes[k]).refs) {
            sched__set_error("sched_prefix_release: node %u (entry %u) is not held", nodes[k], k);
            return -EINVAL;
        }
    /* leaf first: each block enters the LRUs older than the parent that follows it */
    for (uint32_t k = n; k-- > 0;) {
        uint32_t i = nodes[k];
        if (!N(i).used || !N(i).refs) continue; /* listed twice */
        if (--N(i).refs) continue;
        if (N(i).bad) { /* nothing below it is held either: refs(parent) >= refs(child) */
            sched_prefix_eviction ev = ev_of(ix, i, SCHED_PREFIX_EVICT_FAILED);
            unheld_push(ix, i); /* drop_node unlinks an unheld node */
            drop_subtree(ix, i, &ev);
            continue;
        }
        unheld_push(ix, i);
        /* only unheld blocks are dropped, and the rest of this chain is still held */
        enforce_cap(ix, N(i).tenant);
    }
    return 0;
}

int sched_prefix_insert(sched_prefix *ix, uint32_t parent, uint64_t salt, sched_prefix_key key,
                        const int32_t *tokens, uint16_t tenant, uint64_t requester, sched_pool pool,
                        uint32_t block, uint32_t *node_out)
{
    if (!ix || !tokens || !node_out) {
        sched__set_error("sched_prefix_insert: NULL argument");
        return -EINVAL;
    }
    if ((unsigned)pool >= SCHED_POOL__COUNT || block >= ix->pool_blocks[pool]) {
        sched__set_error("sched_prefix_insert: block %u is not in pool %s", block,
                         sched_pool_name(pool));
        return -EINVAL;
    }
    if (tenant >= ix->n_tenants) {
        sched__set_error("sched_prefix_insert: tenant %u of %u", tenant, ix->n_tenants);
        return -EINVAL;
    }
    if (parent != NONE && (!node_ok(ix, parent) || !N(parent).refs)) {
        sched__set_error("sched_prefix_insert: parent %u is not held by the caller", parent);
        return -EINVAL;
    }
    uint32_t i = find(ix, parent, salt, key, tokens);
    if (i != NONE && N(i).loading && N(i).pool > pool) {
        sched__set_error("sched_prefix_insert: a colder copy of the block is being reloaded");
        return -EAGAIN;
    }
    if (i != NONE && N(i).pool <= pool) { /* already here or hotter: share that one */
        hold(ix, i, requester);
        *node_out = i;
        return -EEXIST;
    }
    if (ix->blk2node[pool][block] != NONE) {
        sched__set_error("sched_prefix_insert: %s block %u is already cached",
                         sched_pool_name(pool), block);
        return -EBUSY;
    }
    if (i != NONE) { /* a colder copy: this one replaces it */
        hold(ix, i, requester);
        sched_prefix_eviction ev = ev_of(ix, i, SCHED_PREFIX_EVICT_MOVED);
        place(ix, i, pool, block);
        ev.to = pool;
        ev.to_block = block;
        report(ix, &ev);
        *node_out = i;
        return 0;
    }
    i = ix->free_head; /* never NONE: each node owns a distinct (pool, block) */
    ix->free_head = N(i).hnext;
    pnode *x = &N(i);
    uint32_t gen = x->gen;
    *x = (pnode){.key = key,
                 .salt = salt,
                 .origin = requester,
                 .parent = parent,
                 .first_child = NONE,
                 .next_sib = NONE,
                 .prev_sib = NONE,
                 .prev = NONE,
                 .next = NONE,
                 .tprev = NONE,
                 .tnext = NONE,
                 .refs = 1,
                 .block = block,
                 .gen = gen,
                 .tenant = tenant,
                 .pool = (uint8_t)pool,
                 .used = 1};
    memcpy(ix->tokens + (size_t)i * ix->bs, tokens, (size_t)ix->bs * sizeof *tokens);
    uint32_t b = bucket_of(ix, key);
    x->hnext = ix->bucket[b];
    ix->bucket[b] = i;
    if (parent != NONE) {
        pnode *p = &N(parent);
        x->next_sib = p->first_child;
        if (p->first_child != NONE) N(p->first_child).prev_sib = i;
        p->first_child = i;
        p->kids[pool]++;
    }
    ix->blk2node[pool][block] = i;
    ix->cached[pool]++;
    kv_stored(ix, i);
    *node_out = i;
    return 0;
}

int sched_prefix_move(sched_prefix *ix, uint32_t node, sched_pool pool, uint32_t block)
{
    if (!ix || !node_ok(ix, node) || !N(node).refs) {
        sched__set_error("sched_prefix_move: node %u is not held", node);
        return -EINVAL;
    }
    if ((unsigned)pool >= SCHED_POOL__COUNT || block >= ix->pool_blocks[pool] ||
        pool >= N(node).pool) {
        sched__set_error("sched_prefix_move: %s block %u is not in a pool hotter than %s",
                         sched_pool_name(pool), block, sched_pool_name((sched_pool)N(node).pool));
        return -EINVAL;
    }
    if (ix->blk2node[pool][block] != NONE) {
        sched__set_error("sched_prefix_move: %s block %u is already cached", sched_pool_name(pool),
                         block);
        return -EBUSY;
    }
    sched_prefix_eviction ev = ev_of(ix, node, SCHED_PREFIX_EVICT_MOVED);
    place(ix, node, pool, block);
    ev.to = pool;
    ev.to_block = block;
    report(ix, &ev);
    return 0;
}

int sched_prefix_set_loading(sched_prefix *ix, uint32_t node, bool loading)
{
    if (!ix || !node_ok(ix, node) || (loading && !N(node).refs)) {
        sched__set_error("sched_prefix_set_loading: node %u is not held", node);
        return -EINVAL;
    }
    N(node).loading = loading;
    return 0;
}

int sched_prefix_invalidate(sched_prefix *ix, uint32_t node)
{
    if (!ix || !node_ok(ix, node)) {
        sched__set_error("sched_prefix_invalidate: node %u is not cached", node);
        return -EINVAL;
    }
    if (N(node).refs) {
        if (!N(node).bad) kv_removed(ix, N(node).key, (sched_pool)N(node).pool, N(node).tenant);
        N(node).bad = 1;
        return 0;
    }
    sched_prefix_eviction ev = ev_of(ix, node, SCHED_PREFIX_EVICT_FAILED);
    drop_subtree(ix, node, &ev);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Queries                                                                                  */
/* ---------------------------------------------------------------------------------------- */

int sched_prefix_node(const sched_prefix *ix, uint32_t node, sched_prefix_node_info *out)
{
    if (!ix || !node_ok(ix, node) || !out) return -ENOENT;
    const pnode *x = &N(node);
    *out = (sched_prefix_node_info){(sched_pool)x->pool, x->block,  x->refs, x->parent, x->hits,
                                    x->tenant,           x->origin, x->key,  x->loading};
    return 0;
}

uint32_t sched_prefix_node_of(const sched_prefix *ix, sched_pool pool, uint32_t block)
{
    if (!ix || (unsigned)pool >= SCHED_POOL__COUNT || block >= ix->pool_blocks[pool]) return NONE;
    return ix->blk2node[pool][block];
}

void sched_prefix_get_stats(const sched_prefix *ix, sched_prefix_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!ix) return;
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        out->cached[p] = ix->cached[p];
        out->unheld[p] = ix->lru[p].n;
        out->demoted[p] = ix->demoted[p];
    }
    memcpy(out->evicted, ix->evicted, sizeof out->evicted);
}

uint32_t sched_prefix_tenant_unheld(const sched_prefix *ix, uint16_t tenant)
{
    return ix && tenant < ix->n_tenants ? ix->ten[tenant].n : 0;
}

uint32_t sched_prefix_lru(const sched_prefix *ix, sched_pool pool, uint32_t *out, uint32_t max)
{
    if (!ix || (unsigned)pool >= SCHED_POOL__COUNT) return 0;
    uint32_t k = 0;
    for (uint32_t i = ix->lru[pool].tail; i != NONE && k < max; i = N(i).prev) out[k++] = i;
    return ix->lru[pool].n;
}

/* ---------------------------------------------------------------------------------------- */
/* Invariants                                                                               */
/* ---------------------------------------------------------------------------------------- */

#define BAD(...)                                                                                   \
    do {                                                                                           \
        if (why && why_len) snprintf(why, why_len, __VA_ARGS__);                                   \
        rc = -EUCLEAN;                                                                             \
        goto out;                                                                                  \
    } while (0)

int sched_prefix_check(const sched_prefix *ix, char *why, size_t why_len)
{
    if (why && why_len) why[0] = 0;
    if (!ix) {
        if (why && why_len) snprintf(why, why_len, "NULL index");
        return -EUCLEAN;
    }
    int rc = 0;
    uint64_t *pos = calloc(ix->cap, sizeof *pos);   /* 1 + age rank in its pool's LRU */
    uint32_t *tpos = calloc(ix->cap, sizeof *tpos); /* in its tenant's LRU */
    uint32_t *kids = calloc((size_t)ix->cap * SCHED_POOL__COUNT, sizeof *kids);
    if (!pos || !tpos || !kids) BAD("check: out of memory");

    /* the lists: well linked, counted, each node in the list of its pool / tenant */
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        uint32_t k = 0, prev = NONE;
        for (uint32_t i = ix->lru[p].tail; i != NONE; prev = i, i = N(i).prev) {
            if (i >= ix->cap || !N(i).used || pos[i] || k > ix->cap)
                BAD("pool %s LRU: bad or repeated node %u", sched_pool_name((sched_pool)p), i);
            if (N(i).pool != p)
                BAD("node %u in LRU of %s but lives in %s", i, sched_pool_name((sched_pool)p),
                    sched_pool_name((sched_pool)N(i).pool));
            if (N(i).next != prev)
                BAD("pool %s LRU: broken back link at node %u", sched_pool_name((sched_pool)p), i);
            pos[i] = ++k;
        }
        if (k != ix->lru[p].n)
            BAD("pool %s LRU holds %u nodes, counted %u", sched_pool_name((sched_pool)p), k,
                ix->lru[p].n);
        if (ix->lru[p].head != prev)
            BAD("pool %s LRU: head is not the newest node", sched_pool_name((sched_pool)p));
    }
    for (uint32_t t = 0; t < ix->n_tenants; t++) {
        uint32_t k = 0, prev = NONE;
        for (uint32_t i = ix->ten[t].tail; i != NONE; prev = i, i = N(i).tprev) {
            if (i >= ix->cap || !N(i).used || tpos[i] || k > ix->cap)
                BAD("tenant %u LRU: bad or repeated node %u", t, i);
            if (N(i).tenant != t)
                BAD("node %u of tenant %u is in tenant %u's LRU", i, N(i).tenant, t);
            if (N(i).tnext != prev) BAD("tenant %u LRU: broken back link at node %u", t, i);
            tpos[i] = ++k;
        }
        if (k != ix->ten[t].n) BAD("tenant %u LRU holds %u nodes, counted %u", t, k, ix->ten[t].n);
        if (ix->ten[t].head != prev) BAD("tenant %u LRU: head is not the newest node", t);
        if (ix->max_cached[t] && k > ix->max_cached[t])
            BAD("tenant %u: %u unheld blocks over its cap %u", t, k, ix->max_cached[t]);
    }

    uint32_t cached[SCHED_POOL__COUNT] = {0}, used = 0;
    for (uint32_t i = 0; i < ix->cap; i++) {
        const pnode *x = &N(i);
        if (!x->used) continue;
        used++;
        if (x->pool >= SCHED_POOL__COUNT || x->block >= ix->pool_blocks[x->pool])
            BAD("node %u: block %u of pool %u out of range", i, x->block, x->pool);
        if (ix->blk2node[x->pool][x->block] != i)
            BAD("node %u: %s block %u maps to node %u", i, sched_pool_name((sched_pool)x->pool),
                x->block, ix->blk2node[x->pool][x->block]);
        cached[x->pool]++;
        if (x->loading && !x->refs) BAD("node %u is being reloaded but no one holds it", i);
        if (!x->refs != !!pos[i])
            BAD("node %u: refs %u but %s the LRU", i, x->refs, pos[i] ? "in" : "not in");
        if (!x->refs != !!tpos[i])
            BAD("node %u: refs %u but %s its tenant's LRU", i, x->refs, tpos[i] ? "in" : "not in");
        if (x->parent != NONE) {
            if (!node_ok(ix, x->parent)) BAD("node %u: parent %u is not cached", i, x->parent);
            const pnode *p = &N(x->parent);
            if (p->refs < x->refs)
                BAD("node %u held %u times but its parent %u only %u", i, x->refs, x->parent,
                    p->refs);
            kids[(size_t)x->parent * SCHED_POOL__COUNT + x->pool]++;
            uint32_t c = p->first_child;
            while (c != NONE && c != i) c = N(c).next_sib;
            if (c != i) BAD("node %u is missing from its parent %u's children", i, x->parent);
            /* leaf-first order: an unheld block is older than its unheld parent in one pool */
            if (pos[i] && pos[x->parent] && p->pool == x->pool && pos[i] > pos[x->parent])
                BAD("pool %s LRU: node %u is newer than its parent %u (leaf-first order broken)",
                    sched_pool_name((sched_pool)x->pool), i, x->parent);
        }
        uint32_t c = ix->bucket[bucket_of(ix, x->key)];
        while (c != NONE && c != i) c = N(c).hnext;
        if (c != i) BAD("node %u is not in its hash chain", i);
    }
    for (uint32_t i = 0; i < ix->cap; i++)
        if (N(i).used)
            for (int p = 0; p < SCHED_POOL__COUNT; p++)
                if (N(i).kids[p] != kids[(size_t)i * SCHED_POOL__COUNT + p])
                    BAD("node %u: counts %u children in %s, has %u", i, N(i).kids[p],
                        sched_pool_name((sched_pool)p), kids[(size_t)i * SCHED_POOL__COUNT + p]);
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        if (cached[p] != ix->cached[p])
            BAD("pool %s: %u cached nodes, counted %u", sched_pool_name((sched_pool)p), cached[p],
                ix->cached[p]);
        uint32_t mapped = 0;
        for (uint32_t b = 0; b < ix->pool_blocks[p]; b++) mapped += ix->blk2node[p][b] != NONE;
        if (mapped != cached[p])
            BAD("pool %s: %u blocks map to nodes, %u nodes", sched_pool_name((sched_pool)p), mapped,
                cached[p]);
    }
    uint32_t free_n = 0;
    for (uint32_t i = ix->free_head; i != NONE && free_n <= ix->cap; i = N(i).hnext) {
        if (N(i).used) BAD("node %u is on the free list but in use", i);
        free_n++;
    }
    if (free_n + used != ix->cap) BAD("%u free + %u used nodes != %u", free_n, used, ix->cap);
out:
    free(pos);
    free(tpos);
    free(kids);
    return rc;
}
