/* SPDX-License-Identifier: MIT */
/*
 * window.c — sliding windows on every layer (sched_config.attention_window): a running
 * sequence gives back the device blocks its window has passed.
 *
 * A block holds every layer's K and V for block_size positions (DESIGN §4, block-major), so
 * it can be given back only when no layer reads it; with every layer windowed that is the
 * case once the next position p has the whole block behind its window: a row at p reads
 * positions > p - window, so block k is dead once (k + 1) * block_size <= p - window (one
 * position of slack: the rule needs no care about the off-by-one of the window's edge).
 * p is the sequence's `computed` — every entry of a plan starts there — and it only grows
 * while the sequence holds its blocks, so the dead blocks are a prefix of the table that
 * only grows: each commit looks at the entries between the last limit and the new one.
 *
 * Invariants (sc_window_check):
 *   - dev[i] == SCHED_BLOCK_NONE only for i < (computed - window) / block_size: a given-back
 *     entry is never inside the window of the next position, so the engine never reads it;
 *   - n_rel counts the NONE entries; the blocks held (and counted to the tenant, swapped,
 *     costed) are n_dev - n_rel;
 *   - the prefix cache's chain dev[0..n_pnodes) is never given back: the index needs a
 *     block held while a block below it is (refs(parent) >= refs(child)), so the chain stays
 *     held until the sequence lets it go whole (end, preemption); a windowed sequence caches
 *     its prompt's blocks only (cache.c), so that chain is at most its prompt.
 * Over a swap the NONE entries stay in dev[] (sc_dev_free_all writes no entry) and
 * swap_len / swap_rel keep the table's shape: the swap-in takes fresh blocks for the other
 * entries, in order, which is the order the swap-out copied them in (sc_plan_transfer).
 */
#include "sched/internal.h"

void sc_window_release(sched *s, req *r)
{
    uint32_t w = s->conf.attention_window, bs = s->conf.block_size;
    if (!w || r->held || r->computed <= w) return;
    uint32_t dead = (r->computed - w) / bs;
    if (dead > r->n_dev) dead = r->n_dev;
    uint32_t given = 0;
    for (uint32_t i = r->rel_scan; i < dead; i++) {
        if (i < r->n_pnodes || r->dev[i] == SCHED_BLOCK_NONE) continue; /* the cache's chain */
        sc_dev_give(s, r->dev[i]); /* (or with the samples that share it) */
        r->dev[i] = SCHED_BLOCK_NONE;
        given++;
    }
    if (dead > r->rel_scan) r->rel_scan = dead;
    r->n_rel += given;
    s->ts[r->tenant].kv_blocks -= given;
}

/* Its swap-out completed: remember the table's shape before its blocks are freed. */
void sc_window_swapped_out(req *r)
{
    r->swap_len = r->n_rel ? r->n_dev : 0;
    r->swap_rel = r->n_rel;
}

/* Device blocks for a swap-in: the table as it was at the swap-out, fresh blocks in the
 * entries that held one (n_tier of them), NONE where the window had given them back. */
bool sc_window_swap_in_grow(sched *s, req *r)
{
    uint32_t need = r->n_tier;
    if (!r->swap_rel) return sc_dev_grow_to(s, r, need);
    pool *dp = &s->pools[SCHED_POOL_DEVICE];
    if (dp->n_free < need) {
        if (!s->px || sc_dev_available(s) < need) return false;
        sc_cache_evict(s, r, need - dp->n_free);
        if (dp->n_free < need) return false;
    }
    for (uint32_t i = 0; i < r->swap_len; i++)
        if (r->dev[i] != SCHED_BLOCK_NONE) r->dev[i] = pool_take(dp);
    r->n_dev = r->swap_len;
    r->n_rel = r->swap_rel;
    r->rel_scan = 0;
    r->swap_len = r->swap_rel = 0;
    s->ts[r->tenant].kv_blocks += need;
    return true;
}

/* Blocks a start allocates (token-budget mode): all of its known tokens' without a window;
 * with one, only those of its cached prefix (hit) and its first chunk — the blocks of a
 * long re-prefill come chunk by chunk and go as the window passes them. */
uint32_t sc_window_start_blocks(const sched *s, uint32_t full, uint32_t hit, uint32_t first_chunk)
{
    if (!s->conf.attention_window) return full;
    uint64_t need = (uint64_t)hit + div_up(first_chunk, s->conf.block_size) + 1;
    return need < full ? (uint32_t)need : full;
}

/* The most device blocks a request of `full` blocks ever holds at once, for the never-fits
 * test: with a window (token-budget mode), the window and a prefill chunk, plus its prompt's
 * cached chain when it takes part in the prefix cache. */
uint32_t sc_window_never_fits_blocks(const sched *s, uint32_t prompt_len, bool cached,
                                     uint32_t full)
{
    uint32_t w = s->conf.attention_window, bs = s->conf.block_size;
    if (!w || s->cfg.mode != SCHED_MODE_TOKEN_BUDGET) return full;
    uint64_t most = (uint64_t)div_up((uint64_t)w + s->cfg.prefill_chunk, bs) + 1;
    if (cached) most += prompt_len / bs;
    return most < full ? (uint32_t)most : full;
}

int sc_window_check(const sched *s, const req *r, char *why, size_t len)
{
    uint32_t w = s->conf.attention_window, bs = s->conf.block_size, none = 0;
    uint32_t dead = w && r->computed > w ? (r->computed - w) / bs : 0;
    for (uint32_t i = 0; i < r->n_dev; i++) {
        if (r->dev[i] != SCHED_BLOCK_NONE) continue;
        none++;
        if (i >= dead) {
            if (why && len)
                snprintf(why, len,
                         "request %llu: block-table entry %u was given back, but the window of "
                         "position %u (%u tokens) still reads it",
                         (unsigned long long)r->id, i, r->computed, w);
            return -EUCLEAN;
        }
        if (i < r->n_pnodes) {
            if (why && len)
                snprintf(why, len,
                         "request %llu: block-table entry %u was given back but is in its cached "
                         "chain of %u",
                         (unsigned long long)r->id, i, r->n_pnodes);
            return -EUCLEAN;
        }
    }
    if (none != r->n_rel) {
        if (why && len)
            snprintf(why, len, "request %llu: %u block-table entries given back, counter says %u",
                     (unsigned long long)r->id, none, r->n_rel);
        return -EUCLEAN;
    }
    return 0;
}
