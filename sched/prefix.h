/* SPDX-License-Identifier: MIT */
/*
 * prefix.h — the prefix cache's index (DESIGN.md §10): which KV blocks hold which token
 * prefixes, in which pool (device, host, disk), how many running sequences share each, and
 * which to give up first when a pool runs short.
 *
 * Pure like the rest of sched/: no I/O, no clock, no threads, no allocation after create.
 * The index owns no pool; it asks its owner (the scheduler) for a free block of a colder
 * pool when it demotes, and tells the owner each block that leaves the cache or moves, in
 * the order the copies must happen (sched_prefix_ops).
 *
 * Keys.  Only full blocks are cached.  A block's key is XXH3-128 over (the parent block's
 * key, the cache domain's salt, the block's token ids), so one key names a whole prefix.
 * The key only finds candidates: a lookup accepts a cached block only when its stored
 * token ids, its salt and its parent node are equal too, so a hash collision can cost a
 * miss but never reuse a wrong block, and two salts never hit each other.
 *
 * Life of a block (a "node"):
 *   insert      a sequence computed a full block: node held once by it (refs 1)
 *   acquire     another sequence's prefix matched it: refs + 1 (leaves the LRU at 1)
 *   release     a holder ended (finished, cancelled, preempted by recompute): refs − 1;
 *               at 0 the block joins its pool's LRU, charged to the tenant that inserted it
 *   evict       free-block demand in a pool takes the LRU's oldest leaf: demoted to the next
 *               colder pool (device → host → disk) when that pool has room and
 *               reload_cost < recompute_cost × expected_reuse, else dropped (with anything
 *               cached below it, which no lookup could reach any more)
 *   loading     a holder reloads the block into a hotter pool (its copy reads the block
 *               where it is): nobody may move it meanwhile — an insert of the same block
 *               from another sequence leaves it (-EAGAIN) — and the holder moves it when
 *               the copy completed
 *   move        a reload (or a recompute of a colder copy) put the block in a hotter pool
 *
 * Invariants (sched_prefix_check verifies each):
 *   - a holder holds a whole chain, root first: refs(parent) >= refs(child);
 *   - a node is in its pool's LRU exactly when refs == 0; a loading node is held;
 *   - a parent is in the same pool as its child or a hotter one;
 *   - releases go leaf to root, so in every LRU a block is older than its unheld parent in
 *     the same pool: the LRU's oldest block is a leaf of that pool, and eviction is
 *     leaf-first in O(1) (a repair walk handles the case anyway, should it ever arise);
 *   - per pool, cached = held + unheld; per tenant, the unheld blocks it inserted.
 *
 * Errors: 0 or a negative errno; sched_last_error() names what was wrong.
 * Thread safety: none (one index per scheduler, driven by its thread).
 */
#ifndef RINGLM_SCHED_PREFIX_H
#define RINGLM_SCHED_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sched/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SCHED_PREFIX_NONE UINT32_MAX /* no node (the parent of a prompt's first block) */

/* ---- keys -------------------------------------------------------------------------------- */

typedef struct sched_prefix_key {
    uint64_t lo, hi;
} sched_prefix_key;

static inline bool sched_prefix_key_eq(sched_prefix_key a, sched_prefix_key b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

/* The key of one block: XXH3-128 of (parent key, salt, tokens[0..n)).  The first block of a
 * prompt has parent {0, 0}. */
sched_prefix_key sched_prefix_block_key(sched_prefix_key parent, uint64_t salt,
                                        const int32_t *tokens, uint32_t n);

/* Keys of the full blocks of tokens[0..n_tokens): min(n_tokens / block_size, max_out) keys
 * into out, chained from {0, 0}.  Returns how many were written. */
uint32_t sched_prefix_keys(uint64_t salt, const int32_t *tokens, uint32_t n_tokens,
                           uint32_t block_size, sched_prefix_key *out, uint32_t max_out);

/* ---- configuration ----------------------------------------------------------------------- */

/* Why a block left its pool: sched_prefix_evict_reason (sched.h, with its names). */

/* The demotion test's inputs, in microseconds per block.  expected reuse of a block =
 * reuse_prior + the number of times another sequence acquired it. */
typedef struct sched_prefix_costs {
    double recompute_us_per_block;                 /* prefill of block_size tokens */
    double reload_us_per_block[SCHED_POOL__COUNT]; /* [HOST], [DISK]: tier → device, incl. its
                                                       share of latency and queued transfers */
    double reuse_prior;
} sched_prefix_costs;

/* One block leaving a pool.  On `demoted` the owner copies from_block (pool from) into
 * to_block (pool to) before it reuses from_block; either way from_block is the owner's to
 * free.  Reports come in the order the copies must be done: making room in a colder pool
 * (its own demotion further down) is reported before the demotion that needed the room. */
typedef struct sched_prefix_eviction {
    uint32_t node;
    sched_prefix_key key;
    uint16_t tenant;
    sched_prefix_evict_reason reason;
    sched_pool from;
    uint32_t from_block;
    bool demoted;
    sched_pool to; /* valid when demoted (or reason MOVED) */
    uint32_t to_block;
    /* the demotion test for demand evictions (zero otherwise): reload_cost_us -1 when no
     * colder pool exists */
    double reload_cost_us, recompute_cost_us, expected_reuse;
} sched_prefix_eviction;

typedef struct sched_prefix_ops {
    /* Take a free (uncached, unowned) block of pool p into *block; false when none is free. */
    bool (*take_block)(void *ctx, sched_pool p, uint32_t *block);
    /* A block left the cache or moved (see sched_prefix_eviction). */
    void (*evicted)(void *ctx, const sched_prefix_eviction *ev);
    /* The KV-cache events (sched.h): what a lookup can find, changed; may be NULL. */
    void (*kv)(void *ctx, const sched_kv_event *e);
    void *ctx;
} sched_prefix_ops;

typedef struct sched_prefix_cfg {
    uint32_t block_size;                     /* tokens per block, > 0 */
    uint32_t pool_blocks[SCHED_POOL__COUNT]; /* block ids of each pool are below this */
    uint32_t n_tenants;                      /* tenant indexes are below this, > 0 */
    const uint32_t *max_cached_blocks;       /* per tenant, 0 = unlimited; NULL = none */
    sched_prefix_costs costs;
    sched_prefix_ops ops; /* evicted may be NULL */
} sched_prefix_cfg;

typedef struct sched_prefix sched_prefix; /* opaque */

/* -EINVAL (a field named in sched_last_error), -ENOMEM. */
int sched_prefix_create(const sched_prefix_cfg *cfg, sched_prefix **out);
void sched_prefix_destroy(sched_prefix *ix);
void sched_prefix_set_costs(sched_prefix *ix, const sched_prefix_costs *c);

/* ---- use --------------------------------------------------------------------------------- */

typedef struct sched_prefix_match {
    uint32_t n_blocks;                    /* blocks matched, a prefix of the request's */
    uint32_t per_pool[SCHED_POOL__COUNT]; /* of those, where they are */
    uint32_t self_blocks;                 /* of those, inserted by this same requester (a
                                              resumed sequence reusing its own blocks) */
} sched_prefix_match;

/* Longest cached prefix of a request: keys[0..n_blocks) (sched_prefix_keys with this salt)
 * and the tokens they cover (n_blocks × block_size).  The node of matched block i goes to
 * nodes_out[i].  Changes nothing (acquire what you use).  Returns m->n_blocks. */
uint32_t sched_prefix_lookup(const sched_prefix *ix, uint64_t salt, const sched_prefix_key *keys,
                             const int32_t *tokens, uint32_t n_blocks, uint64_t requester,
                             uint32_t *nodes_out, sched_prefix_match *m);

/* Take one reference on each of nodes[0..n) (a chain, root first), so none is evicted while
 * the caller uses it.  A node acquired by a requester other than its inserter counts a hit
 * toward its expected reuse.  -EINVAL for a bad node (nothing acquired). */
int sched_prefix_acquire(sched_prefix *ix, const uint32_t *nodes, uint32_t n, uint64_t requester);

/* Drop one reference on each of nodes[0..n) (the chain the caller holds, root first; they
 * are released leaf first).  Blocks left unheld join their pool's LRU; a tenant now over its
 * max_cached_blocks has its oldest unheld blocks dropped (reason tenant_cap).  -EINVAL for a
 * bad or unheld node (nothing released). */
int sched_prefix_release(sched_prefix *ix, const uint32_t *nodes, uint32_t n);

/* A sequence computed a full block, in (pool, block), under parent (SCHED_PREFIX_NONE for a
 * prompt's first block; else a node the caller holds).  Returns
 *   0        *node_out holds it now, held once by the caller: a new node, or a colder copy
 *            of the same block moved here (the old copy reported with reason moved);
 *   -EEXIST  the same block is already cached in this pool or a hotter one: *node_out is that
 *            node, acquired for the caller; (pool, block) stays the caller's, uncached;
 *   -EINVAL  bad argument (parent not held, block out of range, tenant out of range);
 *   -EAGAIN  a colder copy of the same block is being reloaded (sched_prefix_set_loading):
 *            nothing changed, (pool, block) stays the caller's, uncached;
 *   -EBUSY   (pool, block) is already a cached block. */
int sched_prefix_insert(sched_prefix *ix, uint32_t parent, uint64_t salt, sched_prefix_key key,
                        const int32_t *tokens, uint16_t tenant, uint64_t requester, sched_pool pool,
                        uint32_t block, uint32_t *node_out);

/* A held node's contents now live in (pool, block), a hotter pool (a reload finished): the
 * old copy is reported with reason moved.  -EINVAL unless held and hotter; -EBUSY when the
 * target block is cached. */
int sched_prefix_move(sched_prefix *ix, uint32_t node, sched_pool pool, uint32_t block);

/* A held node's block is (loading) or no longer is being read by its holder's reload into a
 * hotter pool: while loading, no insert moves it (and the holder does not release it before
 * the copy completed).  -EINVAL for a bad node, or one not held when loading is set. */
int sched_prefix_set_loading(sched_prefix *ix, uint32_t node, bool loading);

/* The copy that put node's bytes where the index says failed: no lookup finds it again; an
 * unheld node is dropped now with what hangs below it, a held one when its last holder
 * releases it (reason failed).  -EINVAL for a bad node. */
int sched_prefix_invalidate(sched_prefix *ix, uint32_t node);

/* Free up to n blocks of `pool` from its LRU, oldest leaf first, demoting or dropping each
 * (see the header comment).  Returns the blocks of `pool` freed, each reported through
 * ops.evicted. */
uint32_t sched_prefix_evict(sched_prefix *ix, sched_pool pool, uint32_t n);

/* Emits, through ops.kv, a CLEARED then a STORED for every block a lookup can find, each
 * parent before its children.  Returns the STORED count. */
uint32_t sched_prefix_announce(const sched_prefix *ix);
/* Blocks a lookup can find (cached and not invalidated), all pools. */
uint32_t sched_prefix_findable(const sched_prefix *ix);

/* Drop every unheld block (reason clear).  Returns how many. */
uint32_t sched_prefix_clear(sched_prefix *ix);

/* ---- queries ----------------------------------------------------------------------------- */

typedef struct sched_prefix_node_info {
    sched_pool pool;
    uint32_t block;
    uint32_t refs;
    uint32_t parent; /* SCHED_PREFIX_NONE for a first block */
    uint32_t hits;   /* acquisitions by other requesters */
    uint16_t tenant;
    uint64_t origin; /* the requester that inserted it */
    sched_prefix_key key;
    bool loading; /* sched_prefix_set_loading */
} sched_prefix_node_info;

int sched_prefix_node(const sched_prefix *ix, uint32_t node,
                      sched_prefix_node_info *out); /* -ENOENT */

/* The node caching (pool, block), or SCHED_PREFIX_NONE. */
uint32_t sched_prefix_node_of(const sched_prefix *ix, sched_pool pool, uint32_t block);

typedef struct sched_prefix_stats {
    uint32_t cached[SCHED_POOL__COUNT];          /* blocks in the index */
    uint32_t unheld[SCHED_POOL__COUNT];          /* of those, in the LRU (evictable) */
    uint64_t evicted[SCHED_PREFIX_EVICT__COUNT]; /* blocks that left a pool, by reason */
    uint64_t demoted[SCHED_POOL__COUNT];         /* demotions into each pool */
} sched_prefix_stats;

void sched_prefix_get_stats(const sched_prefix *ix, sched_prefix_stats *out);
uint32_t sched_prefix_tenant_unheld(const sched_prefix *ix, uint16_t tenant);

/* The LRU of a pool, oldest first: up to max node ids into out; returns the LRU's length. */
uint32_t sched_prefix_lru(const sched_prefix *ix, sched_pool pool, uint32_t *out, uint32_t max);

/* Every invariant above; 0 or -EUCLEAN with the first violation in why.  O(index): tests. */
int sched_prefix_check(const sched_prefix *ix, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif /* RINGLM_SCHED_PREFIX_H */
