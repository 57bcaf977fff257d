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
 * A host or disk block is free, one swapped sequence's (tierb[]), or a cached node's.
 * A sequence's first n_pnodes blocks are always cached nodes, in chain order; it writes only
 * positions >= computed, which lie in later blocks, so a shared block is never written.
 *
 * Life: at submit a request's prompt tokens are copied and its block keys computed (salted
 * with its cache domain); at admission (token_budget mode) the longest cached prefix is
 * found — capped so the last prompt token is always computed — over every pool: the blocks
 * on the device are held at once; a run of blocks on host or disk after them is reloaded
 * (a cache transfer into fresh device blocks) or recomputed, whichever the cost model
 * predicts cheaper (cache_reload events with both estimates, and the realised cost when the
 * copy completed), and computed starts after what was used.  At each commit the newly full
 * prompt blocks are inserted (a block someone else cached meanwhile is shared instead, and
 * the private copy freed; a colder copy of it is replaced); when the sequence's device blocks
 * go (finish, cancel, timeout, recompute preemption, the end of a swap-out) its holds are
 * released and the blocks stay cached.  Free-block demand evicts unheld cached blocks,
 * oldest leaf first (sc_dev_grow_to): demoted to the next colder pool when it has room and
 * reload < recompute × expected reuse (cache_demote), else dropped (cache_evict).
 *
 * Copies.  A demotion or a reload is a cache transfer of the plan (sched_transfer.cache).
 * A demotion's books move at once — the source block is free for whatever comes next in
 * this step — and the caller completes it in plan order before anything later in the plan
 * (a later copy, a swap, the batch) touches those blocks.  So a plan's demotions are
 * ordered as the pools were used: a host block made free by its own demotion to disk is
 * copied out before the device block demoted into it is copied in.  A reload runs beside
 * the steps, like a swap-in: the blocks it reads stay cached where they are, held by the
 * request and marked loading (no other request shares them before they arrived, no insert
 * moves them), it arrives in device blocks of the request's own, and the request waits in
 * SWAPPING_IN; when its last reload completed the blocks are moved to the device (their
 * old copies freed) and it runs (reload_done).
 */
#include "sched/internal.h"

static bool take_block(void *ctx, sched_pool p, uint32_t *b)
{
    sched *s = ctx;
    if (!s->pools[p].n_free) return false;
    *b = pool_take(&s->pools[p]);
    return true;
}

/* A block left its pool: its block is free now (a demotion's copy is planned, in order, by
 * flush_moves before anything can reuse it in a way the caller would run first). */
static void evicted(void *ctx, const sched_prefix_eviction *ev)
{
    sched *s = ctx;
    pool_give(&s->pools[ev->from], ev->from_block);
    s->px_left[ev->from]++;
    if (ev->reason == SCHED_PREFIX_EVICT_MOVED) return;             /* now hotter: still cached */
    if (ev->from == SCHED_POOL_DEVICE) sc_snap_dropped(s, ev->key); /* hits need it there */
    if (ev->demoted) {
        if (!sc_vec_grow((void **)&s->px_mv, &s->px_cap_mv, s->px_n_mv + 1, sizeof *s->px_mv)) {
            s->oom = true;
            return;
        }
        s->px_mv[s->px_n_mv++] =
            (struct px_move){ev->from_block, ev->to_block, (uint8_t)ev->from, (uint8_t)ev->to};
        s->px_demoted[ev->to]++;
        if (s->px_mv_reuse <= 0 || ev->expected_reuse < s->px_mv_reuse)
            s->px_mv_reuse = ev->expected_reuse;
        return;
    }
    s->px_evicted++;
    sc_order_dropped(s, ev->key); /* (demotions and moves returned above: still cached) */
    s->px_drop[ev->from]++;
    if (ev->reason == SCHED_PREFIX_EVICT_DEMAND) {
        s->px_drop_rl[ev->from] = ev->reload_cost_us;
        s->px_drop_rc[ev->from] = ev->recompute_cost_us;
        if (ev->expected_reuse > s->px_drop_reuse[ev->from])
            s->px_drop_reuse[ev->from] = ev->expected_reuse;
    }
}

static double block_bytes(const sched *s)
{
    return (double)s->conf.block_size * (double)s->conf.kv_bytes_per_token;
}

/* Reloading `bytes` from pool p now: what is queued on the link ahead, these bytes, the
 * latency (the tier's measured bandwidth once a transfer completed). */
static double reload_us(const sched *s, sched_pool p, double bytes)
{
    const tier_est *t = &s->tiers[p];
    return ((double)t->queued_in + bytes) / t->in_bps * 1e6 + t->lat_us;
}

/* The demotion test's inputs from the cost model as it stands (measured prefill rate and
 * tier bandwidths). */
static void cache_costs(sched *s)
{
    sched_prefix_costs c = {.recompute_us_per_block = sc_prefill_us(s, s->conf.block_size),
                            .reuse_prior = 1};
    for (int p = SCHED_POOL_HOST; p < SCHED_POOL__COUNT; p++)
        c.reload_us_per_block[p] =
            s->pools[p].total ? reload_us(s, (sched_pool)p, block_bytes(s)) : -1;
    sched_prefix_set_costs(s->px, &c);
}

/* Plan one cache transfer: n blocks from (src pool, sb) to (dst pool, db). */
static uint64_t plan_copy(sched *s, uint8_t kind, sched_pool src, sched_pool dst,
                          const uint32_t *sb, const uint32_t *db, uint32_t n, uint64_t req_id,
                          uint32_t run_a, double pred, uint64_t now)
{
    (void)now;
    bool in = dst == SCHED_POOL_DEVICE;
    sched_pool tier = in ? src : dst;
    uint64_t bytes = (uint64_t)n * s->conf.block_size * s->conf.kv_bytes_per_token;
    uint32_t *keep = malloc((size_t)n * sizeof *keep);
    uint32_t off = s->xfer_blocks.n;
    if (!keep || !sc_vec_grow((void **)&s->xfer_blocks.a, &s->xfer_blocks.cap, off + 2 * n,
                              sizeof(uint32_t))) {
        free(keep);
        s->oom = true;
        return 0;
    }
    memcpy(keep, db, (size_t)n * sizeof *keep);
    xfer_rec x = {.id = s->next_xfer++,
                  .slot = NO_SLOT,
                  .dir = (uint8_t)(in ? SCHED_XFER_IN : SCHED_XFER_OUT),
                  .tier = (uint8_t)tier,
                  .bytes = bytes,
                  .pred_us = pred,
                  .cache = kind,
                  .dst_pool = (uint8_t)dst,
                  .n = n,
                  .dst = keep,
                  .req = req_id,
                  .src_pool = (uint8_t)src,
                  .run_a = run_a};
    VEC_PUSH(s, s->xfers, x);
    if (s->oom) {
        free(keep);
        return 0;
    }
    memcpy(s->xfer_blocks.a + off, sb, n * sizeof(uint32_t));
    memcpy(s->xfer_blocks.a + off + n, db, n * sizeof(uint32_t));
    s->xfer_blocks.n = off + 2 * n;
    sched_transfer t = {.id = x.id,
                        .req = req_id,
                        .dir = in ? SCHED_XFER_IN : SCHED_XFER_OUT,
                        .tier = tier,
                        .n_blocks = n,
                        .bytes = bytes,
                        .predicted_us = pred,
                        .cache = true,
                        .src_pool = in ? tier : src};
    t.src = (const uint32_t *)(uintptr_t)off; /* fixed up when the plan is sealed */
    t.dst = (const uint32_t *)(uintptr_t)(off + n);
    VEC_PUSH(s, s->transfers, t);
    if (in)
        s->tiers[tier].queued_in += bytes;
    else
        s->tiers[tier].queued_out += bytes;
    return x.id;
}

/* The demotions of one eviction call become cache transfers, consecutive moves between the
 * same two pools as one (order kept: see the header), each with its cache_demote event; the
 * drops become one cache_evict per pool. */
static void flush_moves(sched *s, req *r, uint64_t now)
{
    uint32_t bs = s->conf.block_size;
    for (uint32_t i = 0; i < s->px_n_mv;) {
        uint32_t j = i;
        struct px_move *m = s->px_mv;
        while (j < s->px_n_mv && m[j].from == m[i].from && m[j].to == m[i].to) j++;
        uint32_t n = j - i;
        uint32_t *sb = malloc((size_t)n * 2 * sizeof *sb);
        if (!sb) {
            s->oom = true;
            break;
        }
        for (uint32_t k = 0; k < n; k++) {
            sb[k] = m[i + k].from_block;
            sb[n + k] = m[i + k].to_block;
        }
        sched_pool from = (sched_pool)m[i].from, to = (sched_pool)m[i].to;
        const tier_est *te = &s->tiers[to];
        double bytes = (double)n * block_bytes(s);
        double pred = ((double)te->queued_out + bytes) / te->out_bps * 1e6 + te->lat_us;
        uint64_t id = plan_copy(s, XK_DEMOTE, from, to, sb, sb + n, n, 0, 0, pred, now);
        free(sb);
        if (s->sink) {
            sched_event e = ev_of(s, SCHED_EV_CACHE_DEMOTE, r, now);
            e.blocks = n;
            e.pool = from;
            e.to_pool = to;
            e.xfer = id;
            e.bytes = (uint64_t)n * bs * s->conf.kv_bytes_per_token;
            e.mode = SCHED_PREEMPT_SWAP;
            e.swap_cost_us = reload_us(s, to, block_bytes(s));
            e.recompute_cost_us = sc_prefill_us(s, bs);
            e.expected_reuse = s->px_mv_reuse;
            e.predicted_us = pred;
            emit(s, &e);
        }
        i = j;
    }
    s->px_n_mv = 0;
    s->px_mv_reuse = 0;
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        if (s->px_drop[p] && s->sink) {
            sched_event e = ev_of(s, SCHED_EV_CACHE_EVICT, r, now);
            e.blocks = s->px_drop[p];
            e.pool = (sched_pool)p;
            e.evict = SCHED_PREFIX_EVICT_DEMAND;
            e.swap_cost_us = s->px_drop_rl[p];
            e.recompute_cost_us = s->px_drop_rc[p];
            e.expected_reuse = s->px_drop_reuse[p];
            emit(s, &e);
        }
        s->px_drop[p] = 0;
        s->px_drop_rl[p] = s->px_drop_rc[p] = s->px_drop_reuse[p] = 0;
    }
}

static void kv_forward(void *ctx, const sched_kv_event *e)
{
    sched *s = ctx;
    if (s->kv_sink) s->kv_sink(s->kv_ctx, e);
}

void sched_set_kv_sink(sched *s, sched_kv_event_fn fn, void *ctx)
{
    s->kv_sink = fn;
    s->kv_ctx = ctx;
}

uint32_t sched_kv_announce(sched *s)
{
    return s->px && s->kv_sink ? sched_prefix_announce(s->px) : 0;
}

uint32_t sched_kv_cached_blocks(const sched *s)
{
    return s->px ? sched_prefix_findable(s->px) : 0;
}

int sc_cache_create(sched *s)
{
    if (!s->conf.prefix_cache || s->cfg.mode != SCHED_MODE_TOKEN_BUDGET) return 0;
    uint32_t caps[SCHED_MAX_TENANTS];
    for (int t = 0; t < s->n_tenants; t++) caps[t] = s->ten[t]->max_cached_blocks;
    sched_prefix_cfg c = {
        .block_size = s->conf.block_size,
        .pool_blocks = {s->conf.kv_blocks_device, s->conf.kv_blocks_host, s->conf.kv_blocks_disk},
        .n_tenants = (uint32_t)s->n_tenants,
        .max_cached_blocks = caps,
        .costs = {.recompute_us_per_block = s->conf.step.prefill_token_us * s->conf.block_size,
                  .reuse_prior = 1},
        .ops = {.take_block = take_block, .evicted = evicted, .kv = kv_forward, .ctx = s},
    };
    return sched_prefix_create(&c, &s->px);
}

/* Free blocks of a host or disk pool, counting cached blocks no sequence holds (a swap-out
 * may evict them: sc_tier_make_room). */
uint32_t sc_tier_available(const sched *s, sched_pool p)
{
    uint32_t n = s->pools[p].n_free;
    if (s->px) {
        sched_prefix_stats st;
        sched_prefix_get_stats(s->px, &st);
        n += st.unheld[p];
    }
    return n;
}

/* Evict (demote further down or drop) unheld cached blocks of pool p until n are free. */
bool sc_tier_make_room(sched *s, sched_pool p, uint32_t n)
{
    if (s->pools[p].n_free >= n) return true;
    if (!s->px) return false;
    cache_costs(s);
    sched_prefix_evict(s->px, p, n - s->pools[p].n_free);
    flush_moves(s, NULL, s->last_now);
    return s->pools[p].n_free >= n;
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
    r->snap_at = r->n_snap_pend = 0;
    if (!s->px || !q->tokens) return 0;
    uint32_t bs = s->conf.block_size, nb = q->prompt_len / bs;
    if (!sc_vec_grow((void **)&r->ptok, &r->cap_ptok, q->prompt_len, sizeof(int32_t)) ||
        !sc_vec_grow((void **)&r->pkeys, &r->cap_pkeys, nb ? nb : 1, sizeof(sched_prefix_key)) ||
        !sc_vec_grow((void **)&r->pnodes, &r->cap_pnodes, nb ? nb : 1, sizeof(uint32_t)))
        return -ENOMEM;
    memcpy(r->ptok, q->tokens, (size_t)q->prompt_len * sizeof(int32_t));
    r->salt = q->cache_salt;
    r->n_pkeys =
        sched_prefix_keys_with(s->prefix_key, r->salt, r->ptok, q->prompt_len, bs, r->pkeys, nb);
    r->pcache = true;
    /* a windowed sequence holds its cached chain until it ends (window.c): its prompt's */
    r->pgen = !s->conf.attention_window;
    return 0;
}

/* A token was generated (commit): its id joins the sequence's known tokens, and when it
 * fills a block, that block's key is chained on — so the blocks of the answer are cached
 * (sc_cache_commit, once computed) like the prompt's.  An unknown id ends that for good. */
void sc_cache_token(sched *s, req *r, bool has, int32_t token)
{
    if (!r->pgen) return;
    if (!has) {
        r->pgen = false;
        return;
    }
    uint32_t pos = known(r) - 1, bs = s->conf.block_size; /* generated was just counted */
    if (!sc_vec_grow((void **)&r->ptok, &r->cap_ptok, pos + 1, sizeof(int32_t))) {
        r->pgen = false;
        return;
    }
    r->ptok[pos] = token;
    if ((pos + 1) % bs || (pos + 1) / bs != r->n_pkeys + 1) return;
    uint32_t i = r->n_pkeys;
    if (!sc_vec_grow((void **)&r->pkeys, &r->cap_pkeys, i + 1, sizeof(sched_prefix_key)) ||
        !sc_vec_grow((void **)&r->pnodes, &r->cap_pnodes, i + 1, sizeof(uint32_t))) {
        r->pgen = false;
        return;
    }
    r->pkeys[i] =
        sched_prefix_block_key_with(s->prefix_key, i ? r->pkeys[i - 1] : (sched_prefix_key){0, 0},
                                    r->salt, r->ptok + (size_t)i * bs, bs);
    r->n_pkeys = i + 1;
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

/* The longest cached prefix of a waiting request over every pool, remembered for
 * sc_cache_start.  Returns the blocks of it on the device (shared, not allocated: a run on
 * host or disk needs device blocks like a computed one); *unheld says how many of those are
 * evictable now (holding them makes them unavailable). */
uint32_t sc_cache_find(sched *s, uint32_t slot, uint32_t *unheld)
{
    req *r = &s->reqs[slot];
    *unheld = 0;
    r->n_found = 0;
    if (!r->pcache || r->n_pnodes) return 0;
    /* with window rings a hit needs the ring of the cached prefix's last window: a sample at
     * its first start has its first sample's (the caller copies it at the fork), any other
     * request a ring snapshot's (ringsnap.c) */
    bool snap = sc_snap_needed(s, r);
    if (snap && !s->n_snaps) return 0;
    uint32_t bs = s->conf.block_size;
    uint32_t max = (known(r) - 1) / bs; /* the last known token is computed: it samples */
    if (max > r->n_pkeys) max = r->n_pkeys;
    r->n_found =
        sched_prefix_lookup(s->px, r->salt, r->pkeys, r->ptok, max, r->id, r->pnodes, NULL);
    for (uint32_t i = 0; i < r->n_found; i++) {
        sched_prefix_node_info in;
        sched_prefix_node(s->px, r->pnodes[i], &in);
        /* a block another sequence is reloading is not there yet: the prefix found ends
         * before it (that sequence shares it once it arrived); a snapshot hit uses the
         * device's blocks only */
        if (in.loading || (snap && in.pool != SCHED_POOL_DEVICE)) {
            r->n_found = i;
            break;
        }
    }
    if (snap) r->n_found = sc_snap_trim(s, r, r->n_found);
    uint32_t dev = 0;
    for (uint32_t i = 0; i < r->n_found; i++) {
        sched_prefix_node_info in;
        sched_prefix_node(s->px, r->pnodes[i], &in);
        if (in.pool != SCHED_POOL_DEVICE) break; /* a chain is device*, host*, disk* */
        if (!in.refs) (*unheld)++;
        dev++;
    }
    return dev;
}

static sched_pool node_pool(const sched *s, uint32_t node)
{
    sched_prefix_node_info in;
    sched_prefix_node(s->px, node, &in);
    return in.pool;
}

static uint32_t hold_found(sched *s, req *r, uint32_t found, uint32_t *self_out,
                           uint32_t per[SCHED_POOL__COUNT], uint32_t self_per[SCHED_POOL__COUNT],
                           uint64_t now);

/* Admission: hold what sc_cache_find found on the device; for each following run on host or
 * disk, reload it or recompute it (and everything after), whichever the cost model predicts
 * cheaper; make the blocks used the start of the block table and start the prefill after. */
void sc_cache_start(sched *s, req *r, uint64_t now)
{
    if (!r->pcache) return;
    uint32_t found = r->n_found, bs = s->conf.block_size;
    r->n_found = 0;
    s->px_query += known(r);
    uint32_t use = 0, self = 0, per[SCHED_POOL__COUNT] = {0}, self_per[SCHED_POOL__COUNT] = {0};
    if (found) use = hold_found(s, r, found, &self, per, self_per, now);
    if (sc_snap_needed(s, r)) sc_snap_hit(s, r, use); /* its first entry restores the ring */
    /* a sample's shared partial block follows the cached full ones (cow.c) */
    uint32_t tail = sc_cow_start(s, r, use);
    if (!use && !tail) return;
    r->computed = use * bs + tail;
    s->px_hit += (uint64_t)use * bs + tail;
    s->px_self += (uint64_t)self * bs;
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        s->px_hit_pool[p] += (uint64_t)per[p] * bs;
        s->px_self_pool[p] += (uint64_t)self_per[p] * bs;
    }
    s->px_hit_pool[SCHED_POOL_DEVICE] += tail;
    if (!r->started) r->cached_tokens = use * bs + tail;
    sched_event e = ev_of(s, SCHED_EV_CACHE_HIT, r, now);
    e.blocks = use + (tail ? 1 : 0);
    e.pool = SCHED_POOL_DEVICE;
    e.cached_tokens = use * bs + tail;
    e.self_tokens = self * bs;
    e.prompt_tokens = known(r);
    for (int p = 0; p < SCHED_POOL__COUNT; p++) e.pool_tokens[p] = per[p] * bs;
    e.pool_tokens[SCHED_POOL_DEVICE] += tail;
    emit(s, &e);
}

/* sc_cache_start's part for the blocks sc_cache_find found: hold the device ones, reload or
 * recompute the runs on host or disk.  Returns the blocks used (the start of the table). */
static uint32_t hold_found(sched *s, req *r, uint32_t found, uint32_t *self_out,
                           uint32_t per[SCHED_POOL__COUNT], uint32_t self_per[SCHED_POOL__COUNT],
                           uint64_t now)
{
    uint32_t bs = s->conf.block_size;
    uint32_t nd = 0;
    while (nd < found && node_pool(s, r->pnodes[nd]) == SCHED_POOL_DEVICE) nd++;
    /* the runs after the device ones: reload or recompute, decided in order */
    uint32_t use = nd;
    struct px_run {
        uint32_t a, b;
        sched_pool p;
        double rl, rc;
    } run[SCHED_POOL__COUNT];
    uint32_t n_run = 0;
    while (use < found && n_run < SCHED_POOL__COUNT) {
        sched_pool p = node_pool(s, r->pnodes[use]);
        uint32_t b = use;
        while (b < found && node_pool(s, r->pnodes[b]) == p) b++;
        double rl = reload_us(s, p, (double)(b - use) * block_bytes(s));
        double rc = sc_prefill_us(s, (uint64_t)b * bs) - sc_prefill_us(s, (uint64_t)use * bs);
        /* a reload runs beside the steps; a recompute is in them: every running sequence
         * waits through it too (as preemption counts it) */
        if (s->run.n) rc += rc;
        bool reload = rl < rc;
        sched_event e = ev_of(s, SCHED_EV_CACHE_RELOAD, r, now);
        e.blocks = b - use;
        e.pool = p;
        e.tokens = (b - use) * bs;
        e.mode = reload ? SCHED_PREEMPT_SWAP : SCHED_PREEMPT_RECOMPUTE;
        e.swap_cost_us = rl;
        e.recompute_cost_us = rc;
        if (!reload) {
            s->px_recomputed[p] += b - use;
            emit(s, &e);            /* it and everything after it are computed again */
            r->px_rc_active = true; /* its realised cost: the steps until computed passes b */
            r->px_rc_unknown = false;
            r->px_rc_us = 0;
            r->px_rc_pool = (uint8_t)p;
            r->px_rc_target = b * bs;
            r->px_rc_blocks = b - use;
            r->px_rc_pred = rc;
            break;
        }
        run[n_run++] = (struct px_run){use, b, p, rl, rc};
        use = b;
    }
    if (!sc_vec_grow((void **)&r->dev, &r->cap_dev, use, sizeof(uint32_t))) {
        s->oom = true;
        return 0;
    }
    sched_prefix_acquire(s->px, r->pnodes, use, r->id);
    uint32_t self = 0;
    for (uint32_t i = 0; i < use; i++) {
        sched_prefix_node_info in;
        sched_prefix_node(s->px, r->pnodes[i], &in);
        if (i < nd) r->dev[i] = in.block;
        per[in.pool]++;
        if (in.origin == r->id) {
            self++;
            self_per[in.pool]++;
        }
    }
    r->n_dev = nd;
    s->ts[r->tenant].kv_blocks += nd;
    if (use > nd) {
        /* fresh device blocks for the reloads (admission counted them as needed) */
        uint32_t *old = malloc((size_t)(use - nd) * sizeof *old);
        if (!old || !sc_dev_grow_to(s, r, use)) {
            free(old);
            sched_prefix_release(s->px, r->pnodes + nd, use - nd); /* a suffix: refs stay ordered */
            for (int p = SCHED_POOL_HOST; p < SCHED_POOL__COUNT; p++) {
                per[p] = 0;
                self -= self_per[p];
                self_per[p] = 0;
            }
            use = nd;
            n_run = 0;
        } else {
            /* the blocks stay where they are, held and marked loading, until their copies
             * are in (sc_cache_xfer_done moves them); the request waits for them */
            for (uint32_t i = nd; i < use; i++) {
                sched_prefix_node_info in;
                sched_prefix_node(s->px, r->pnodes[i], &in);
                old[i - nd] = in.block;
                sched_prefix_set_loading(s->px, r->pnodes[i], true);
            }
            r->px_ld_a = nd;
            r->px_ld_b = r->px_ld_fail = use;
            r->px_ld_n = n_run;
            for (uint32_t k = 0; k < n_run; k++) {
                uint32_t a = run[k].a, b = run[k].b;
                sched_event e = ev_of(s, SCHED_EV_CACHE_RELOAD, r, now);
                e.blocks = b - a;
                e.pool = run[k].p;
                e.tokens = (b - a) * bs;
                e.mode = SCHED_PREEMPT_SWAP;
                e.swap_cost_us = run[k].rl;
                e.recompute_cost_us = run[k].rc;
                e.bytes = (uint64_t)(b - a) * bs * s->conf.kv_bytes_per_token;
                e.xfer = plan_copy(s, XK_RELOAD, run[k].p, SCHED_POOL_DEVICE, old + (a - nd),
                                   r->dev + a, b - a, r->id, a, run[k].rl, now);
                s->px_reloaded[run[k].p] += b - a;
                emit(s, &e);
            }
            free(old);
        }
    }
    r->n_pnodes = use;
    *self_out = self;
    return use;
}

/* The completion record of a cached run recomputed at admission: the estimate then, the
 * summed full durations of the steps that computed it (null when one was unmeasured). */
static void rc_run_end(sched *s, req *r, sched_outcome how)
{
    r->px_rc_active = false;
    sched_event e = ev_of(s, SCHED_EV_CACHE_RELOAD, r, s->last_now);
    e.outcome = how;
    e.mode = SCHED_PREEMPT_RECOMPUTE;
    e.blocks = r->px_rc_blocks;
    e.pool = (sched_pool)r->px_rc_pool;
    e.tokens = r->px_rc_blocks * s->conf.block_size;
    e.predicted_us = r->px_rc_pred;
    e.realised_us = r->px_rc_unknown ? -1 : (double)r->px_rc_us;
    emit(s, &e);
}

/* Commit: cache the blocks this step filled (prompt, and generated tokens' with known ids). */
void sc_cache_commit(sched *s, req *r)
{
    uint32_t bs = s->conf.block_size;
    if (r->px_rc_active) {
        if (s->commit_step_us)
            r->px_rc_us += s->commit_step_us;
        else
            r->px_rc_unknown = true;
        if (r->computed >= r->px_rc_target) rc_run_end(s, r, SCHED_OUTCOME_DONE);
    }
    while (r->n_pnodes < r->n_pkeys && r->n_pnodes < r->n_dev &&
           (uint64_t)(r->n_pnodes + 1) * bs <= r->computed &&
           r->dev[r->n_pnodes] != SCHED_BLOCK_NONE) { /* (given back: window.c) */
        uint32_t i = r->n_pnodes, node;
        if (sc_cow_shared(s, r->dev[i])) break; /* cached once the samples took their copies */
        int rc = sched_prefix_insert(s->px, i ? r->pnodes[i - 1] : SCHED_PREFIX_NONE, r->salt,
                                     r->pkeys[i], r->ptok + (size_t)i * bs, r->tenant, r->id,
                                     SCHED_POOL_DEVICE, r->dev[i], &node);
        if (rc == -EEXIST) { /* computed twice: share the cached copy, free ours */
            sched_prefix_node_info in;
            sched_prefix_node(s->px, node, &in);
            pool_give(&s->pools[SCHED_POOL_DEVICE], r->dev[i]);
            r->dev[i] = in.block;
        } else if (rc) {
            break; /* cannot happen with consistent books; the blocks stay private */
        } else {
            sc_order_inserted(s, r->pkeys[i]); /* waiting requests' cached prefixes grow */
        }
        r->pnodes[r->n_pnodes++] = node;
    }
    sc_snap_commit(s, r);
}

/* The sequence gives up its device blocks: release its holds.  Returns how many leading
 * blocks of dev[] now belong to the cache (the caller frees only the rest). */
uint32_t sc_cache_release(sched *s, req *r)
{
    if (r->px_rc_active) rc_run_end(s, r, SCHED_OUTCOME_ABANDONED); /* ended or preempted first */
    sc_snap_release(s, r);
    uint32_t k = r->n_pnodes;
    if (!k) return 0;
    uint64_t before = s->px_evicted;
    sched_prefix_release(s->px, r->pnodes, k);
    r->n_pnodes = 0;
    if (s->px_evicted != before && s->sink) { /* its tenant went over max_cached_blocks */
        sched_event e = ev_of(s, SCHED_EV_CACHE_EVICT, r, s->last_now);
        e.blocks = (uint32_t)(s->px_evicted - before);
        e.pool = SCHED_POOL_DEVICE;
        e.evict = SCHED_PREFIX_EVICT_TENANT_CAP;
        emit(s, &e);
    }
    for (int p = 0; p < SCHED_POOL__COUNT; p++) s->px_drop[p] = 0; /* (said here, not as demand) */
    return k;
}

/* Free-block demand: evict up to n unheld cached blocks for r (demoted or dropped), with
 * their events and copies.  Returns the device blocks freed. */
uint32_t sc_cache_evict(sched *s, req *r, uint32_t n)
{
    uint32_t before = s->px_left[SCHED_POOL_DEVICE];
    cache_costs(s);
    sched_prefix_evict(s->px, SCHED_POOL_DEVICE, n);
    flush_moves(s, r, s->last_now);
    return s->px_left[SCHED_POOL_DEVICE] - before;
}

/* One of a request's reloads completed.  When the last is in, the blocks that arrived become
 * the cached copies (moved to the device, in chain order: a parent is never colder than its
 * child) and the request runs — its prefill starts after them.  From the first block whose
 * copy failed on, its holds are let go (failed blocks are dropped, with what hangs below)
 * and the prompt is computed again from there, in the device blocks it already has. */
static void reload_done(sched *s, uint32_t sl, const xfer_rec *x, int status, uint64_t now)
{
    req *r = &s->reqs[sl];
    if (!r->px_ld_n) return; /* not a reload it waits for (cannot happen) */
    if (status < 0) {
        for (uint32_t i = x->run_a; i < x->run_a + x->n && i < r->px_ld_b; i++)
            sched_prefix_invalidate(s->px, r->pnodes[i]); /* held: dropped when let go */
        if (x->run_a < r->px_ld_fail) r->px_ld_fail = x->run_a;
    }
    if (--r->px_ld_n) return;
    uint32_t f = r->px_ld_fail, bs = s->conf.block_size;
    for (uint32_t i = r->px_ld_a; i < r->px_ld_b; i++) {
        sched_prefix_set_loading(s->px, r->pnodes[i], false);
        if (i < f)
            sched_prefix_move(s->px, r->pnodes[i], SCHED_POOL_DEVICE,
                              r->dev[i]); /* old copy: free */
    }
    if (f < r->px_ld_b) {
        sched_prefix_release(s->px, r->pnodes + f,
                             r->n_pnodes - f); /* a suffix: refs stay ordered */
        r->n_pnodes = f;
        r->computed = f * bs;
        for (int p = 0; p < SCHED_POOL__COUNT; p++) {
            if (s->px_drop[p] && s->sink) {
                sched_event e = ev_of(s, SCHED_EV_CACHE_EVICT, r, now);
                e.blocks = s->px_drop[p];
                e.pool = (sched_pool)p;
                e.evict = SCHED_PREFIX_EVICT_FAILED;
                emit(s, &e);
            }
            s->px_drop[p] = 0;
        }
    }
    r->px_ld_a = r->px_ld_b = r->px_ld_fail = 0;
    r->moving = false;
    s->n_in_transit--;
    s->n_swapping_in--;
    s->ts[r->tenant].moving_in--;
    if (r->state == SCHED_REQ_ENDED) { /* cancelled or timed out while its blocks came */
        sc_release_now(s, sl, now, false);
        return;
    }
    sc_run_add(s, sl);
}

/* A cache copy completed (sched_transfer_done): the tier's bandwidth learns from it, the
 * completion record says what it cost next to the prediction, and a failed copy's blocks
 * are invalidated — the daemon completes a copy before anything reuses its blocks, so they
 * still hold the nodes it copied. */
int sc_cache_xfer_done(sched *s, xfer_rec *x, uint64_t now, uint64_t bytes, uint64_t dur_us,
                       int status)
{
    tier_est *te = &s->tiers[x->tier];
    if (x->dir == SCHED_XFER_OUT)
        te->queued_out -= x->bytes;
    else
        te->queued_in -= x->bytes;
    sc_observe_transfer(s, x, bytes, dur_us, status);
    if (status < 0 && s->px)
        for (uint32_t i = 0; i < x->n; i++) {
            uint32_t node = sched_prefix_node_of(s->px, (sched_pool)x->dst_pool, x->dst[i]);
            if (node != SCHED_PREFIX_NONE) sched_prefix_invalidate(s->px, node);
        }
    uint32_t sl = x->req ? map_get(s, x->req) : NO_SLOT;
    sched_event e = ev_of(s, x->cache == XK_RELOAD ? SCHED_EV_CACHE_RELOAD : SCHED_EV_CACHE_DEMOTE,
                          sl != NO_SLOT ? &s->reqs[sl] : NULL, now);
    e.req = x->req;
    e.outcome = sc_xfer_outcome(status);
    e.mode = SCHED_PREEMPT_SWAP;
    e.xfer = x->id;
    e.blocks = x->n;
    e.bytes = x->bytes;
    e.pool = (sched_pool)x->src_pool;
    e.to_pool = (sched_pool)x->dst_pool;
    e.tokens = x->n * s->conf.block_size;
    e.predicted_us = x->pred_us;
    e.realised_us = dur_us ? (double)dur_us : -1;
    emit(s, &e);
    if (x->cache == XK_RELOAD && sl != NO_SLOT) reload_done(s, sl, x, status, now);
    free(x->dst);
    x->dst = NULL;
    return 0;
}

/* Device blocks with the cache on: holders[b] counts b's holders (sequences) plus its
 * appearances in the free stack.  A cached block is held exactly refs times and never free;
 * any other block is free or one sequence's.  Then the index's own invariants. */
int sc_cache_check(const sched *s, const uint32_t *holders, char *why, size_t len)
{
    for (uint32_t i = 0; i < s->n_slots; i++) {
        const req *r = &s->reqs[i];
        if (!r->live && !r->n_pnodes) continue;
        for (uint32_t k = 0; k < r->n_pnodes; k++) {
            if (r->px_ld_n && k >= r->px_ld_a &&
                k < r->px_ld_b) { /* reloading: still where it was */
                sched_prefix_node_info in;
                if (sched_prefix_node(s->px, r->pnodes[k], &in) || !in.loading ||
                    in.pool == SCHED_POOL_DEVICE || k >= r->n_dev ||
                    sched_prefix_node_of(s->px, SCHED_POOL_DEVICE, r->dev[k]) !=
                        SCHED_PREFIX_NONE) {
                    if (why && len)
                        snprintf(why, len,
                                 "request %llu: block %u it reloads is not a loading node of a "
                                 "colder pool with a private device block to arrive in",
                                 (unsigned long long)r->id, k);
                    return -EUCLEAN;
                }
                continue;
            }
            if (k >= r->n_dev ||
                sched_prefix_node_of(s->px, SCHED_POOL_DEVICE, r->dev[k]) != r->pnodes[k]) {
                if (why && len)
                    snprintf(why, len,
                             "request %llu: block %u of its table is not the cached node it holds",
                             (unsigned long long)r->id, k);
                return -EUCLEAN;
            }
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
                         node != SCHED_PREFIX_NONE ? "cached and held/free" : "owned/free",
                         holders[b],
                         node != SCHED_PREFIX_NONE ? "its reference count says" : "want", want);
            return -EUCLEAN;
        }
    }
    return sched_prefix_check(s->px, why, len);
}
