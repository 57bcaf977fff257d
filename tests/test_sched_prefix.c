/* SPDX-License-Identifier: MIT */
/*
 * The prefix cache's index (sched/prefix.h) on its own, driven by a small owner that plays
 * the scheduler's part: it keeps each pool's free blocks, and a block's "KV" is the token ids
 * written into it, copied on every demotion and reload — so a lookup that hands back a block
 * holding other tokens (a wrong reuse) is caught by comparing contents, not by trusting the
 * index.  The index's own invariant check and the owner's block conservation (free + cached
 * = total, per pool) run after every operation.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "sched/prefix.h"
#include "sched/sched_testing.h"

#define BS    4    /* tokens per block */
#define MAXB  2048 /* blocks per pool at most */
#define MAXEV 65536

typedef struct owner {
    sched_prefix *ix;
    uint32_t total[SCHED_POOL__COUNT];
    uint32_t free_ids[SCHED_POOL__COUNT][MAXB];
    uint32_t n_free[SCHED_POOL__COUNT];
    int32_t kv[SCHED_POOL__COUNT][MAXB][BS]; /* what each block holds */
    sched_prefix_eviction ev[MAXEV];
    uint32_t n_ev;
    uint64_t hit_blocks, wrong;
    /* what a KV-event subscriber believes each pool holds: the STORED/REMOVED it was told */
    sched_prefix_key told[SCHED_POOL__COUNT][MAXB];
    uint32_t n_told[SCHED_POOL__COUNT];
    uint32_t told_orphans; /* STORED whose parent the subscriber did not know */
} owner;

static owner O; /* large: static, one per test process (Criterion forks per test) */

static bool take_block(void *ctx, sched_pool p, uint32_t *b)
{
    owner *o = ctx;
    if (!o->n_free[p]) return false;
    *b = o->free_ids[p][--o->n_free[p]];
    return true;
}

static void give_block(owner *o, sched_pool p, uint32_t b)
{
    memset(o->kv[p][b], 0xff, sizeof o->kv[p][b]); /* poison: a stale reuse shows */
    o->free_ids[p][o->n_free[p]++] = b;
}

static void evicted(void *ctx, const sched_prefix_eviction *ev)
{
    owner *o = ctx;
    cr_assert_lt(o->n_ev, MAXEV);
    o->ev[o->n_ev++] = *ev;
    if (ev->demoted || ev->reason == SCHED_PREFIX_EVICT_MOVED)
        memcpy(o->kv[ev->to][ev->to_block], o->kv[ev->from][ev->from_block], sizeof o->kv[0][0]);
    give_block(o, ev->from, ev->from_block);
}

static int told_find(const owner *o, sched_pool p, sched_prefix_key k)
{
    for (uint32_t i = 0; i < o->n_told[p]; i++)
        if (sched_prefix_key_eq(o->told[p][i], k)) return (int)i;
    return -1;
}

static bool told_anywhere(const owner *o, sched_prefix_key k)
{
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        if (told_find(o, (sched_pool)p, k) >= 0) return true;
    return false;
}

/* The subscriber's side: apply each event to its per-pool sets. */
static void kv_event(void *ctx, const sched_kv_event *e)
{
    owner *o = ctx;
    sched_prefix_key k = {e->key_lo, e->key_hi};
    if (e->kind == SCHED_KV_CLEARED) {
        memset(o->n_told, 0, sizeof o->n_told);
        return;
    }
    int at = told_find(o, e->pool, k);
    if (e->kind == SCHED_KV_STORED) { /* a multiset: forced collisions give equal keys */
        cr_assert_eq(e->n_tokens, BS);
        if (e->has_parent && !told_anywhere(o, (sched_prefix_key){e->parent_lo, e->parent_hi}))
            o->told_orphans++;
        o->told[e->pool][o->n_told[e->pool]++] = k;
    } else {
        cr_assert_geq(at, 0, "REMOVED from %s a block it was never told", sched_pool_name(e->pool));
        o->told[e->pool][at] = o->told[e->pool][--o->n_told[e->pool]];
    }
}

/* The subscriber's sets equal the index's (pool, key) of every node. */
static void told_check(const owner *o)
{
    uint32_t n[SCHED_POOL__COUNT] = {0};
    for (uint32_t node = 0; node < 3 * MAXB; node++) {
        sched_prefix_node_info in;
        if (sched_prefix_node(o->ix, node, &in) < 0) continue;
        n[in.pool]++;
        cr_assert_geq(told_find(o, in.pool, in.key), 0,
                      "the index holds a block in %s that no event announced",
                      sched_pool_name(in.pool));
    }
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        cr_assert_eq(o->n_told[p], n[p], "%s: the events tell %u blocks, the index holds %u",
                     sched_pool_name((sched_pool)p), o->n_told[p], n[p]);
}

static sched_prefix_costs cheap_reload(void)
{
    return (sched_prefix_costs){
        .recompute_us_per_block = 100, .reload_us_per_block = {0, 10, 50}, .reuse_prior = 1};
}

static void o_init(uint32_t dev, uint32_t host, uint32_t disk, uint32_t n_tenants,
                   const uint32_t *caps, sched_prefix_costs costs)
{
    owner *o = &O;
    memset(o, 0, sizeof *o);
    uint32_t tot[3] = {dev, host, disk};
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        o->total[p] = tot[p];
        for (uint32_t b = tot[p]; b-- > 0;) give_block(o, (sched_pool)p, b);
    }
    sched_prefix_cfg c = {
        .block_size = BS,
        .pool_blocks = {dev, host, disk},
        .n_tenants = n_tenants,
        .max_cached_blocks = caps,
        .costs = costs,
        .ops = {.take_block = take_block, .evicted = evicted, .kv = kv_event, .ctx = o}};
    cr_assert_eq(sched_prefix_create(&c, &o->ix), 0, "%s", sched_last_error());
}

static void o_fini(void)
{
    sched_prefix_destroy(O.ix);
    O.ix = NULL;
}

/* Every invariant of the index, and every block of every pool either free or cached. */
static void o_check(void)
{
    char why[256];
    cr_assert_eq(sched_prefix_check(O.ix, why, sizeof why), 0, "index invariant: %s", why);
    sched_prefix_stats st;
    sched_prefix_get_stats(O.ix, &st);
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        cr_assert_eq(O.n_free[p] + st.cached[p], O.total[p], "pool %s: %u free + %u cached != %u",
                     sched_pool_name((sched_pool)p), O.n_free[p], st.cached[p], O.total[p]);
    cr_assert_eq(O.wrong, 0, "a lookup handed back a block holding other tokens");
    told_check(&O);
}

/* A device block, evicting one from the cache when none is free. */
static uint32_t o_alloc_device(void)
{
    uint32_t b;
    if (!take_block(&O, SCHED_POOL_DEVICE, &b)) {
        cr_assert_eq(sched_prefix_evict(O.ix, SCHED_POOL_DEVICE, 1), 1, "device pool exhausted");
        cr_assert(take_block(&O, SCHED_POOL_DEVICE, &b));
    }
    return b;
}

typedef struct seq {
    uint32_t nodes[256];
    uint32_t n_nodes;
    uint32_t matched;
    sched_prefix_match m;
} seq;

/* What the scheduler does for a prompt: find its longest cached prefix, hold it, bring any
 * host/disk blocks of it to the device, then compute and insert the rest of its full
 * blocks.  Checks that every matched block holds this prompt's tokens.  salt is the domain;
 * keys NULL → computed with XXH3 (else the caller's, e.g. all equal to force collisions). */
static void run_prompt(seq *s, uint64_t req, uint16_t tenant, uint64_t salt, const int32_t *tok,
                       uint32_t n_tok, const sched_prefix_key *keys)
{
    sched_prefix_key own[256];
    uint32_t nb = n_tok / BS;
    cr_assert_leq(nb, 256);
    if (!keys) {
        cr_assert_eq(sched_prefix_keys(salt, tok, n_tok, BS, own, 256), nb);
        keys = own;
    }
    memset(s, 0, sizeof *s);
    s->matched = sched_prefix_lookup(O.ix, salt, keys, tok, nb, req, s->nodes, &s->m);
    cr_assert_eq(sched_prefix_acquire(O.ix, s->nodes, s->matched, req), 0);
    for (uint32_t i = 0; i < s->matched; i++) {
        sched_prefix_node_info in;
        cr_assert_eq(sched_prefix_node(O.ix, s->nodes[i], &in), 0);
        if (memcmp(O.kv[in.pool][in.block], tok + i * BS, sizeof O.kv[0][0])) O.wrong++;
        if (in.pool != SCHED_POOL_DEVICE) { /* reload */
            uint32_t d = o_alloc_device();
            memcpy(O.kv[SCHED_POOL_DEVICE][d], O.kv[in.pool][in.block], sizeof O.kv[0][0]);
            cr_assert_eq(sched_prefix_move(O.ix, s->nodes[i], SCHED_POOL_DEVICE, d), 0, "%s",
                         sched_last_error());
        }
    }
    O.hit_blocks += s->matched;
    s->n_nodes = s->matched;
    for (uint32_t i = s->matched; i < nb; i++) {
        uint32_t d = o_alloc_device(), node;
        memcpy(O.kv[SCHED_POOL_DEVICE][d], tok + i * BS, sizeof O.kv[0][0]);
        int rc = sched_prefix_insert(O.ix, i ? s->nodes[i - 1] : SCHED_PREFIX_NONE, salt, keys[i],
                                     tok + i * BS, tenant, req, SCHED_POOL_DEVICE, d, &node);
        if (rc == -EEXIST)
            give_block(&O, SCHED_POOL_DEVICE, d); /* a copy is cached: share it */
        else
            cr_assert_eq(rc, 0, "insert: %s", sched_last_error());
        s->nodes[s->n_nodes++] = node;
    }
    o_check();
}

static void finish(seq *s)
{
    cr_assert_eq(sched_prefix_release(O.ix, s->nodes, s->n_nodes), 0, "%s", sched_last_error());
    s->n_nodes = 0;
    o_check();
}

static uint32_t lru(sched_pool p, uint32_t *out)
{
    return sched_prefix_lru(O.ix, p, out, MAXB);
}

static uint32_t count_ev(sched_prefix_evict_reason r, int demoted)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < O.n_ev; i++)
        n += O.ev[i].reason == r && (demoted < 0 || O.ev[i].demoted == demoted);
    return n;
}

/* ---- keys ------------------------------------------------------------------------------- */

Test(sched_prefix, keys_chain_the_prefix_and_the_salt)
{
    int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, b[12];
    memcpy(b, a, sizeof a);
    b[1] = 99; /* first block differs, the rest equal */
    sched_prefix_key ka[4], kb[4], ks[4];
    cr_assert_eq(sched_prefix_keys(7, a, 11, BS, ka, 4), 2, "only full blocks get keys");
    cr_assert_eq(sched_prefix_keys(7, a, 12, BS, ka, 4), 3);
    cr_assert_eq(sched_prefix_keys(7, a, 12, BS, ka, 2), 2, "max_out bounds the count");
    sched_prefix_keys(7, a, 12, BS, ka, 4);
    sched_prefix_keys(7, b, 12, BS, kb, 4);
    sched_prefix_keys(8, a, 12, BS, ks, 4);
    sched_prefix_key k0 = sched_prefix_block_key((sched_prefix_key){0, 0}, 7, a, BS);
    cr_assert(sched_prefix_key_eq(k0, ka[0]));
    cr_assert(sched_prefix_key_eq(sched_prefix_block_key(ka[0], 7, a + BS, BS), ka[1]),
              "keys chain the parent");
    for (int i = 0; i < 3; i++) {
        cr_assert(!sched_prefix_key_eq(ka[i], kb[i]),
                  "block %d: an earlier block's tokens change every later key", i);
        cr_assert(!sched_prefix_key_eq(ka[i], ks[i]), "block %d: the salt changes the key", i);
    }
    cr_assert(!sched_prefix_key_eq(ka[1], ka[2]));
    cr_assert_str_eq(sched_prefix_evict_name(SCHED_PREFIX_EVICT_TENANT_CAP), "tenant_cap");
    cr_assert_str_eq(sched_prefix_evict_name(SCHED_PREFIX_EVICT__COUNT), "?");
}

/* ---- insert, lookup, longest prefix ------------------------------------------------------ */

Test(sched_prefix, longest_prefix_is_found_and_shared)
{
    o_init(64, 0, 0, 1, NULL, cheap_reload());
    int32_t a[16], b[16], c[16];
    for (int i = 0; i < 16; i++) a[i] = b[i] = c[i] = 100 + i;
    b[10] = -1; /* b shares blocks 0 and 1 with a */
    c[0] = -1;  /* c shares nothing */
    seq sa, sb, sc, sd;
    run_prompt(&sa, 1, 0, 5, a, 16, NULL);
    cr_assert_eq(sa.matched, 0);
    cr_assert_eq(sa.n_nodes, 4);
    run_prompt(&sb, 2, 0, 5, b, 16, NULL);
    cr_assert_eq(sb.matched, 2, "b shares a's first two blocks, got %u", sb.matched);
    cr_assert_eq(sb.m.per_pool[SCHED_POOL_DEVICE], 2);
    cr_assert_eq(sb.m.self_blocks, 0);
    cr_assert_eq(sb.nodes[0], sa.nodes[0]);
    cr_assert_eq(sb.nodes[1], sa.nodes[1]);
    cr_assert_neq(sb.nodes[2], sa.nodes[2]);
    run_prompt(&sc, 3, 0, 5, c, 16, NULL);
    cr_assert_eq(sc.matched, 0);
    run_prompt(&sd, 4, 0, 5, a, 14, NULL); /* a's first 3 full blocks and a partial one */
    cr_assert_eq(sd.matched, 3);
    sched_prefix_node_info in;
    cr_assert_eq(sched_prefix_node(O.ix, sa.nodes[0], &in), 0);
    cr_assert_eq(in.refs, 3, "a, b and d hold block 0");
    cr_assert_eq(in.hits, 2, "two other requesters reused it");
    cr_assert_eq(sched_prefix_node_of(O.ix, SCHED_POOL_DEVICE, in.block), sa.nodes[0]);
    sched_prefix_stats st;
    sched_prefix_get_stats(O.ix, &st);
    cr_assert_eq(st.cached[SCHED_POOL_DEVICE], 4 + 2 + 4, "a 4, b 2 own, c 4");
    cr_assert_eq(st.unheld[SCHED_POOL_DEVICE], 0);
    finish(&sa);
    finish(&sb);
    finish(&sc);
    finish(&sd);
    o_fini();
}

Test(sched_prefix, a_resumed_sequence_counts_its_own_blocks_apart)
{
    o_init(32, 0, 0, 1, NULL, cheap_reload());
    int32_t a[12];
    for (int i = 0; i < 12; i++) a[i] = i;
    seq s;
    run_prompt(&s, 9, 0, 1, a, 12, NULL);
    finish(&s); /* e.g. preempted by recompute */
    run_prompt(&s, 9, 0, 1, a, 12, NULL);
    cr_assert_eq(s.matched, 3);
    cr_assert_eq(s.m.self_blocks, 3, "its own blocks");
    sched_prefix_node_info in;
    sched_prefix_node(O.ix, s.nodes[0], &in);
    cr_assert_eq(in.hits, 0, "a sequence reusing its own blocks is no cross-request hit");
    finish(&s);
    o_fini();
}

Test(sched_prefix, a_block_computed_twice_is_cached_once)
{
    o_init(32, 0, 0, 1, NULL, cheap_reload());
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    sched_prefix_key k[2];
    sched_prefix_keys(3, a, 8, BS, k, 2);
    uint32_t n1, n2, dup;
    cr_assert_eq(
        sched_prefix_insert(O.ix, SCHED_PREFIX_NONE, 3, k[0], a, 0, 1, SCHED_POOL_DEVICE, 10, &n1),
        0);
    /* a second sequence computed the same block before it could see the first */
    cr_assert_eq(
        sched_prefix_insert(O.ix, SCHED_PREFIX_NONE, 3, k[0], a, 0, 2, SCHED_POOL_DEVICE, 11, &dup),
        -EEXIST);
    cr_assert_eq(dup, n1);
    sched_prefix_node_info in;
    sched_prefix_node(O.ix, n1, &in);
    cr_assert_eq(in.refs, 2);
    cr_assert_eq(sched_prefix_node_of(O.ix, SCHED_POOL_DEVICE, 11), SCHED_PREFIX_NONE,
                 "the copy stays private");
    cr_assert_eq(sched_prefix_insert(O.ix, n1, 3, k[1], a + 4, 0, 1, SCHED_POOL_DEVICE, 10, &n2),
                 -EBUSY, "a block cached once cannot be cached again");
    cr_assert_eq(sched_prefix_insert(O.ix, 12345, 3, k[1], a + 4, 0, 1, SCHED_POOL_DEVICE, 12, &n2),
                 -EINVAL);
    cr_assert_eq(sched_prefix_insert(O.ix, n1, 3, k[1], a + 4, 5, 1, SCHED_POOL_DEVICE, 12, &n2),
                 -EINVAL, "tenant 5 of 1");
    cr_assert_eq(sched_prefix_insert(O.ix, n1, 3, k[1], a + 4, 0, 1, SCHED_POOL_HOST, 0, &n2),
                 -EINVAL, "no host pool");
    o_fini();
}

/* ---- reference counts and the LRU --------------------------------------------------------- */

Test(sched_prefix, shared_blocks_stay_held_until_the_last_holder_ends)
{
    o_init(32, 0, 0, 1, NULL, cheap_reload());
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    seq s1, s2;
    run_prompt(&s1, 1, 0, 0, a, 8, NULL);
    run_prompt(&s2, 2, 0, 0, a, 8, NULL);
    cr_assert_eq(s2.matched, 2);
    uint32_t l[MAXB];
    finish(&s1);
    cr_assert_eq(lru(SCHED_POOL_DEVICE, l), 0, "still held by the second sequence");
    cr_assert_eq(sched_prefix_evict(O.ix, SCHED_POOL_DEVICE, 10), 0,
                 "held blocks are never evicted");
    finish(&s2);
    cr_assert_eq(lru(SCHED_POOL_DEVICE, l), 2);
    uint32_t bad = s2.nodes[0];
    cr_assert_eq(sched_prefix_release(O.ix, &bad, 1), -EINVAL,
                 "releasing an unheld block is refused");
    bad = 999;
    cr_assert_eq(sched_prefix_acquire(O.ix, &bad, 1, 1), -EINVAL);
    o_check();
    o_fini();
}

Test(sched_prefix, lru_orders_by_release_with_leaves_before_their_parents)
{
    o_init(64, 0, 0, 1, NULL, cheap_reload());
    int32_t a[12], b[12];
    for (int i = 0; i < 12; i++) {
        a[i] = i;
        b[i] = 50 + i;
    }
    seq sa, sb;
    run_prompt(&sa, 1, 0, 0, a, 12, NULL);
    run_prompt(&sb, 2, 0, 0, b, 12, NULL);
    finish(&sb); /* b released first: older */
    finish(&sa);
    uint32_t l[MAXB];
    cr_assert_eq(lru(SCHED_POOL_DEVICE, l), 6);
    uint32_t want[6] = {sb.nodes[2], sb.nodes[1], sb.nodes[0],
                        sa.nodes[2], sa.nodes[1], sa.nodes[0]};
    for (int i = 0; i < 6; i++)
        cr_assert_eq(l[i], want[i], "LRU position %d: node %u, want %u", i, l[i], want[i]);
    /* reuse of b's first block makes it (and only it) the newest */
    seq sc;
    run_prompt(&sc, 3, 0, 0, b, 4, NULL);
    cr_assert_eq(sc.matched, 1);
    cr_assert_eq(lru(SCHED_POOL_DEVICE, l), 5, "an acquired block leaves the LRU");
    finish(&sc);
    lru(SCHED_POOL_DEVICE, l);
    cr_assert_eq(l[5], sb.nodes[0], "released again: newest");
    cr_assert_eq(l[0], sb.nodes[2]);
    o_fini();
}

/* ---- eviction ---------------------------------------------------------------------------- */

Test(sched_prefix, eviction_takes_leaves_first_and_keeps_a_shared_root)
{
    o_init(64, 0, 0, 1, NULL, cheap_reload());
    /* a system prompt S (2 blocks) shared by three users with one block each */
    int32_t p[3][12];
    for (int u = 0; u < 3; u++)
        for (int i = 0; i < 12; i++) p[u][i] = i < 8 ? i : 1000 * (u + 1) + i;
    seq s[3];
    for (int u = 0; u < 3; u++) run_prompt(&s[u], (uint64_t)u + 1, 0, 0, p[u], 12, NULL);
    uint32_t root = s[0].nodes[0], mid = s[0].nodes[1];
    for (int u = 0; u < 3; u++) finish(&s[u]);
    /* S was released last: the three user blocks go first, then S's second block, then S */
    for (int k = 0; k < 3; k++) {
        O.n_ev = 0;
        cr_assert_eq(sched_prefix_evict(O.ix, SCHED_POOL_DEVICE, 1), 1);
        cr_assert_eq(O.n_ev, 1);
        cr_assert_eq(O.ev[0].node, s[k].nodes[2], "eviction %d took node %u, want user %d's leaf",
                     k, O.ev[0].node, k);
        cr_assert_eq(O.ev[0].reason, SCHED_PREFIX_EVICT_DEMAND);
        cr_assert(!O.ev[0].demoted);
        cr_assert_eq(O.ev[0].reload_cost_us, -1, "no colder pool");
        o_check();
    }
    O.n_ev = 0;
    cr_assert_eq(sched_prefix_evict(O.ix, SCHED_POOL_DEVICE, 5), 2,
                 "only S's two blocks were left");
    cr_assert_eq(O.n_ev, 2);
    cr_assert_eq(O.ev[0].node, mid);
    cr_assert_eq(O.ev[1].node, root);
    o_check();
    seq again;
    run_prompt(&again, 9, 0, 0, p[0], 12, NULL);
    cr_assert_eq(again.matched, 0, "nothing left to match");
    o_fini();
}

Test(sched_prefix, demand_frees_blocks_for_new_work_when_the_pool_is_full)
{
    o_init(8, 0, 0, 1, NULL, cheap_reload());
    int32_t p[20][8];
    for (int r = 0; r < 20; r++)
        for (int i = 0; i < 8; i++) p[r][i] = r * 100 + i;
    for (int r = 0; r < 20; r++) { /* 20 prompts of 2 blocks through an 8-block pool */
        seq s;
        run_prompt(&s, (uint64_t)r + 1, 0, 0, p[r], 8, NULL);
        finish(&s);
    }
    sched_prefix_stats st;
    sched_prefix_get_stats(O.ix, &st);
    cr_assert_eq(st.cached[SCHED_POOL_DEVICE], 8);
    cr_assert_eq(st.evicted[SCHED_PREFIX_EVICT_DEMAND], 32);
    seq s;
    run_prompt(&s, 99, 0, 0, p[19], 8, NULL);
    cr_assert_eq(s.matched, 2, "the most recent prompt is still cached");
    finish(&s);
    run_prompt(&s, 98, 0, 0, p[0], 8, NULL);
    cr_assert_eq(s.matched, 0, "the oldest is gone");
    finish(&s);
    o_fini();
}

/* ---- tiers ------------------------------------------------------------------------------- */

Test(sched_prefix, evicted_device_blocks_are_demoted_found_on_host_and_reloaded_intact)
{
    o_init(8, 16, 0, 1, NULL, cheap_reload());
    int32_t a[8], b[32];
    for (int i = 0; i < 8; i++) a[i] = 7 + i;
    for (int i = 0; i < 32; i++) b[i] = 500 + i;
    seq s;
    run_prompt(&s, 1, 0, 0, a, 8, NULL);
    finish(&s);
    run_prompt(&s, 2, 0, 0, b, 32, NULL); /* needs the whole device pool: a's blocks go to host */
    finish(&s);
    cr_assert_eq(count_ev(SCHED_PREFIX_EVICT_DEMAND, 1), 2);
    for (uint32_t i = 0; i < O.n_ev; i++) {
        cr_assert_eq(O.ev[i].from, SCHED_POOL_DEVICE);
        cr_assert_eq(O.ev[i].to, SCHED_POOL_HOST);
        cr_assert_lt(O.ev[i].reload_cost_us, O.ev[i].recompute_cost_us * O.ev[i].expected_reuse);
    }
    sched_prefix_stats st;
    sched_prefix_get_stats(O.ix, &st);
    cr_assert_eq(st.cached[SCHED_POOL_HOST], 2);
    cr_assert_eq(st.demoted[SCHED_POOL_HOST], 2);
    run_prompt(&s, 3, 0, 0, a, 8, NULL); /* found on host, reloaded (contents checked) */
    cr_assert_eq(s.matched, 2);
    cr_assert_eq(s.m.per_pool[SCHED_POOL_HOST], 2);
    for (int i = 0; i < 2; i++) {
        sched_prefix_node_info in;
        sched_prefix_node(O.ix, s.nodes[i], &in);
        cr_assert_eq(in.pool, SCHED_POOL_DEVICE, "reloaded block %d lives on the device", i);
    }
    cr_assert_eq(count_ev(SCHED_PREFIX_EVICT_MOVED, -1), 2);
    finish(&s);
    o_fini();
}

Test(sched_prefix, blocks_are_dropped_when_reloading_would_cost_more_than_recomputing)
{
    sched_prefix_costs slow = {
        .recompute_us_per_block = 100, .reload_us_per_block = {0, 500, 5000}, .reuse_prior = 1};
    o_init(4, 16, 16, 1, NULL, slow);
    int32_t a[16], b[16];
    for (int i = 0; i < 16; i++) {
        a[i] = i;
        b[i] = 900 + i;
    }
    seq s;
    run_prompt(&s, 1, 0, 0, a, 16, NULL);
    finish(&s);
    run_prompt(&s, 2, 0, 0, b, 16, NULL);
    finish(&s);
    cr_assert_eq(count_ev(SCHED_PREFIX_EVICT_DEMAND, 0), 4, "dropped");
    cr_assert_eq(count_ev(SCHED_PREFIX_EVICT_DEMAND, 1), 0, "never demoted");
    cr_assert_eq(O.ev[0].reload_cost_us, 500);
    cr_assert_eq(O.ev[0].recompute_cost_us, 100);
    /* reuse raises the stakes: a block reused 9 times by others is worth a slow reload */
    sched_prefix_set_costs(O.ix, &slow);
    for (int r = 0; r < 9; r++) {
        run_prompt(&s, 10 + (uint64_t)r, 0, 0, b, 4, NULL);
        finish(&s);
    }
    O.n_ev = 0;
    run_prompt(&s, 30, 0, 0, a, 16, NULL);
    finish(&s);
    int demoted_root = 0;
    for (uint32_t i = 0; i < O.n_ev; i++)
        if (O.ev[i].demoted) {
            demoted_root++;
            cr_assert_eq(O.ev[i].expected_reuse, 10);
        }
    cr_assert_eq(demoted_root, 1, "only b's much-reused first block went to host");
    o_fini();
}

Test(sched_prefix, a_full_host_tier_passes_its_oldest_down_to_disk_first)
{
    o_init(4, 4, 8, 1, NULL, cheap_reload());
    int32_t p[4][16];
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 16; i++) p[r][i] = r * 1000 + i;
    seq s;
    for (int r = 0; r < 3; r++) {
        run_prompt(&s, (uint64_t)r + 1, 0, 0, p[r], 16, NULL);
        finish(&s);
    }
    sched_prefix_stats st;
    sched_prefix_get_stats(O.ix, &st);
    cr_assert_eq(st.cached[SCHED_POOL_DEVICE], 4);
    cr_assert_eq(st.cached[SCHED_POOL_HOST], 4);
    cr_assert_eq(st.cached[SCHED_POOL_DISK], 4);
    /* order of the reports = order of the copies: replayed in order, every demotion lands
     * in a host/disk block that an earlier report vacated (or that was never used) */
    static uint8_t busy[SCHED_POOL__COUNT][MAXB];
    for (uint32_t i = 0; i < O.n_ev; i++) {
        const sched_prefix_eviction *e = &O.ev[i];
        busy[e->from][e->from_block] = 0;
        if (!e->demoted) continue;
        cr_assert(!busy[e->to][e->to_block], "report %u fills %s block %u before it was vacated", i,
                  sched_pool_name(e->to), e->to_block);
        busy[e->to][e->to_block] = 1;
    }
    for (int r = 0; r < 3; r++) { /* all three prompts are still found, each in one tier */
        seq q;
        uint32_t n[64];
        sched_prefix_key k[4];
        sched_prefix_keys(0, p[r], 16, BS, k, 4);
        sched_prefix_match m;
        cr_assert_eq(sched_prefix_lookup(O.ix, 0, k, p[r], 4, 77, n, &m), 4);
        cr_assert_eq(m.per_pool[2 - r], 4, "prompt %d in %s", r,
                     sched_pool_name((sched_pool)(2 - r)));
        (void)q;
    }
    run_prompt(&s, 50, 0, 0, p[0], 16, NULL); /* from disk, contents intact after two moves */
    cr_assert_eq(s.matched, 4);
    cr_assert_eq(s.m.per_pool[SCHED_POOL_DISK], 4);
    finish(&s);
    o_fini();
}

/* ---- collisions and domains -------------------------------------------------------------- */

Test(sched_prefix, forced_collisions_never_reuse_a_wrong_block)
{
    o_init(256, 0, 0, 1, NULL, cheap_reload());
    sched_prefix_key same[8];
    for (int i = 0; i < 8; i++)
        same[i] = (sched_prefix_key){42, 42}; /* the hash forced to a constant */
    int32_t p[6][32];
    for (int r = 0; r < 6; r++)
        for (int i = 0; i < 32; i++) p[r][i] = (r % 3) * 7 + i / 4; /* r and r+3 equal */
    p[1][17] = -5;                                                  /* p1 = p4 except block 4 */
    /* p5 swaps blocks 0 and 1 of p2: equal tokens in block 1 under a different parent */
    for (int i = 0; i < 4; i++) {
        int t = p[5][i];
        p[5][i] = p[5][4 + i];
        p[5][4 + i] = t;
    }
    seq s[6];
    for (int r = 0; r < 6; r++) run_prompt(&s[r], (uint64_t)r + 1, 0, 0, p[r], 32, same);
    cr_assert_eq(s[0].matched, 0);
    cr_assert_eq(s[1].matched, 0, "p1 differs from p0 in block 0 although every key is equal");
    cr_assert_eq(s[3].matched, 8, "p3 = p0");
    cr_assert_eq(s[4].matched, 4, "p4 = p1 up to block 4");
    cr_assert_eq(s[5].matched, 0, "p5's first block is nobody's first block");
    for (int r = 0; r < 6; r++) finish(&s[r]);
    /* and after shuffling through eviction, every lookup still returns only its own tokens */
    for (int k = 0; k < 100; k++) {
        seq q;
        run_prompt(&q, 100 + (uint64_t)k, 0, 0, p[k % 6], 32 - 4 * (k % 5), same);
        finish(&q);
        if (k % 7 == 0) sched_prefix_evict(O.ix, SCHED_POOL_DEVICE, 3);
    }
    o_check();
    o_fini();
}

/* The key function a test may set (sched_testing.h): XXH3 is what sched_prefix_keys
 * computes; the constant one keys every block alike, so the daemon's test build can force
 * every collision (ringlmd-test --prefix-key=constant, daemon_prefix). */
Test(sched_prefix, the_constant_key_function_keys_every_block_alike)
{
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {9, 9, 9, 9, 8, 8, 8, 8};
    sched_prefix_key ka[2], kb[2], x[2], xa[2];
    cr_assert_eq(sched_prefix_keys_with(SCHED_PREFIX_KEY_CONSTANT, 7, a, 8, BS, ka, 2), 2);
    cr_assert_eq(sched_prefix_keys_with(SCHED_PREFIX_KEY_CONSTANT, 8, b, 8, BS, kb, 2), 2);
    for (int i = 0; i < 2; i++)
        cr_assert(sched_prefix_key_eq(ka[i], ka[0]) && sched_prefix_key_eq(kb[i], ka[0]),
                  "other tokens, salt or parent changed a constant key");
    cr_assert(sched_prefix_key_eq(
        sched_prefix_block_key_with(SCHED_PREFIX_KEY_CONSTANT, ka[0], 3, b, BS), ka[0]));
    sched_prefix_keys_with(SCHED_PREFIX_KEY_XXH3, 7, a, 8, BS, x, 2);
    sched_prefix_keys(7, a, 8, BS, xa, 2);
    cr_assert(sched_prefix_key_eq(x[0], xa[0]) && sched_prefix_key_eq(x[1], xa[1]),
              "XXH3 is sched_prefix_keys' function");
    cr_assert(!sched_prefix_key_eq(x[0], x[1]));
    cr_assert_str_eq(sched_prefix_key_fn_name(SCHED_PREFIX_KEY_XXH3), "xxh3");
    cr_assert_str_eq(sched_prefix_key_fn_name(SCHED_PREFIX_KEY_CONSTANT), "constant");
}

Test(sched_prefix, two_salts_never_hit_each_other)
{
    o_init(64, 0, 0, 2, NULL, cheap_reload());
    int32_t a[16];
    for (int i = 0; i < 16; i++) a[i] = 3 * i;
    seq s1, s2, s3;
    run_prompt(&s1, 1, 0, 1111, a, 16, NULL);
    run_prompt(&s2, 2, 1, 2222, a, 16, NULL);
    cr_assert_eq(s2.matched, 0, "same prompt, other domain: no hit");
    /* even when the keys collide, the salt keeps the domains apart */
    sched_prefix_key k1[4];
    sched_prefix_keys(1111, a, 16, BS, k1, 4);
    uint32_t n[4];
    cr_assert_eq(sched_prefix_lookup(O.ix, 3333, k1, a, 4, 3, n, NULL), 0,
                 "domain 1111's keys under salt 3333");
    run_prompt(&s3, 3, 0, 1111, a, 16, NULL);
    cr_assert_eq(s3.matched, 4, "same domain: a hit");
    finish(&s1);
    finish(&s2);
    finish(&s3);
    o_fini();
}

/* ---- per-tenant caps --------------------------------------------------------------------- */

Test(sched_prefix, a_tenant_over_its_cap_loses_its_own_oldest_leaves)
{
    uint32_t caps[2] = {3, 0};
    o_init(64, 0, 0, 2, caps, cheap_reload());
    int32_t a[24], b[24];
    for (int i = 0; i < 24; i++) {
        a[i] = i;
        b[i] = 700 + i;
    }
    seq sb, sa;
    run_prompt(&sb, 1, 1, 0, b, 24, NULL); /* tenant 1: 6 blocks, no cap */
    finish(&sb);
    run_prompt(&sa, 2, 0, 0, a, 24, NULL); /* tenant 0: 6 blocks, cap 3 */
    finish(&sa);
    cr_assert_eq(sched_prefix_tenant_unheld(O.ix, 0), 3);
    cr_assert_eq(sched_prefix_tenant_unheld(O.ix, 1), 6, "the other tenant's cache is untouched");
    cr_assert_eq(count_ev(SCHED_PREFIX_EVICT_TENANT_CAP, 0), 3);
    for (uint32_t i = 0; i < O.n_ev; i++) cr_assert_eq(O.ev[i].tenant, 0);
    seq q;
    run_prompt(&q, 3, 0, 0, a, 24, NULL);
    cr_assert_eq(q.matched, 3, "the cap kept the first three blocks (the shared end of a prefix)");
    cr_assert_eq(sched_prefix_tenant_unheld(O.ix, 0), 0, "held blocks count toward no cap");
    finish(&q);
    o_fini();
}

/* ---- everything at once ------------------------------------------------------------------ */

static uint64_t rng = 12345;
static uint32_t RND(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

Test(sched_prefix, random_traffic_keeps_every_invariant_and_every_block_intact)
{
    uint32_t caps[3] = {40, 0, 25};
    o_init(96, 64, 128, 3, caps, cheap_reload());
    /* 6 system prompts × user suffixes; tenant t uses salt t except tenants 1 and 2 share */
    seq live[4];
    int nlive = 0;
    for (int step = 0; step < 3000; step++) {
        if (nlive < 4 && RND(3)) {
            int32_t tok[64];
            uint32_t sys = RND(6), len = 8 + RND(56);
            for (uint32_t i = 0; i < len; i++)
                tok[i] = i < 24 ? (int32_t)(sys * 1000 + i) : (int32_t)(RND(4) + 10 * i);
            uint16_t ten = (uint16_t)RND(3);
            run_prompt(&live[nlive++], (uint64_t)step + 1, ten, ten == 2 ? 1 : ten, tok, len, NULL);
        } else if (nlive) {
            int k = (int)RND((uint32_t)nlive);
            finish(&live[k]);
            live[k] = live[--nlive];
        }
        if (RND(10) == 0) {
            sched_prefix_evict(O.ix, (sched_pool)RND(3), 1 + RND(8));
            o_check();
        }
        if (step == 1500) {
            sched_prefix_costs c = {.recompute_us_per_block = 10,
                                    .reload_us_per_block = {0, 50, 50},
                                    .reuse_prior = 0.5};
            sched_prefix_set_costs(O.ix, &c); /* from here on, mostly dropped */
        }
    }
    while (nlive) finish(&live[--nlive]);
    cr_assert_gt(O.hit_blocks, 1000, "the workload shares prefixes (hits %llu)",
                 (unsigned long long)O.hit_blocks);
    sched_prefix_stats st;
    sched_prefix_get_stats(O.ix, &st);
    cr_assert_gt(st.demoted[SCHED_POOL_HOST], 0);
    cr_assert_gt(st.demoted[SCHED_POOL_DISK], 0);
    cr_assert_gt(st.evicted[SCHED_PREFIX_EVICT_TENANT_CAP], 0);
    /* a subscriber that starts from nothing learns the whole index from an announce, each
     * parent before its children */
    memset(O.n_told, 0xff, sizeof O.n_told); /* garbage: CLEARED must come first */
    O.told_orphans = 0;
    uint32_t told = sched_prefix_announce(O.ix);
    cr_assert_eq(told, sched_prefix_findable(O.ix));
    cr_assert_gt(told, 0);
    cr_assert_eq(O.told_orphans, 0, "an announce told a child before its parent");
    o_check();
    uint32_t dropped = sched_prefix_clear(O.ix);
    sched_prefix_get_stats(O.ix, &st);
    cr_assert_eq(st.cached[0] + st.cached[1] + st.cached[2], 0,
                 "nothing held: clear empties the index");
    cr_assert_gt(dropped, 0);
    o_check();
    o_fini();
}

/* ================================================================================================
 * The scheduler with the cache on (sched_config.prefix_cache): real sched_step / sched_commit
 * runs, the scheduler's invariants (reference counts included) checked after every call.
 * ============================================================================================== */

#include "tests/event_json.h"
#include "sched/sched.h"
#include "tests/sched_drive_util.h"

#define MAXE 20000
typedef struct drv {
    sched *s;
    sched_policy *p;
    uint64_t now;
    sched_event ev[MAXE];
    uint32_t n_ev;
    uint32_t finished;
} drv;
static drv D;

static void d_sink(void *ctx, const sched_event *e)
{
    (void)ctx;
    if (D.n_ev < MAXE) {
        D.ev[D.n_ev] = *e;
        D.ev[D.n_ev].tenant = D.ev[D.n_ev].class_name = D.ev[D.n_ev].policy = NULL;
        D.n_ev++;
    }
    if (e->kind == SCHED_EV_FINISH) D.finished++;
    char line[512];
    cr_assert_geq(event_json(e, line, sizeof line), 0);
}

static void d_check(void)
{
    sd_check(D.s);
}

static sched_prefix_key_fn d_key_fn; /* the next d_init's key function (XXH3: 0) */

/* extra: more [scheduler] keys; tenants: the [tenant] sections (NULL: a and b, defaults). */
static void d_init_tenants(const char *extra, const char *tenants, uint32_t dev, uint32_t host,
                           bool cache)
{
    memset(&D, 0, sizeof D);
    char pol[1024];
    snprintf(pol, sizeof pol,
             "[scheduler]\ntoken_budget = 64\nprefill_chunk = 8\nmax_preemptions = 0\n%s\n"
             "%s[class default]\n",
             extra ? extra : "", tenants ? tenants : "[tenant a]\n[tenant b]\n");
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(pol, &D.p, &err), 0, "policy line %d: %s", err.line,
                 err.reason);
    sched_config c = {.kv_blocks_device = dev,
                      .kv_blocks_host = host,
                      .block_size = 4,
                      .kv_bytes_per_token = 64,
                      .max_context = 512,
                      .step.base_us = 100,
                      .step.prefill_token_us = 1,
                      .step.decode_seq_us = 1,
                      .host = {.out_bytes_per_s = 1e9, .in_bytes_per_s = 1e9, .latency_us = 1},
                      .prefix_cache = cache,
                      .prefix_cache_generated = cache};
    cr_assert_eq(sched_create(D.p, &c, d_sink, NULL, 1, &D.s), 0, "%s", sched_last_error());
    cr_assert_eq(sched_testing_set_prefix_key(D.s, d_key_fn), 0, "%s", sched_last_error());
}

static void d_init(const char *extra, uint32_t dev, uint32_t host, bool cache)
{
    d_init_tenants(extra, NULL, dev, host, cache);
}

static void d_fini(void)
{
    sched_destroy(D.s);
    sched_policy_free(D.p);
}

static int d_submit(uint64_t id, int tenant, const int32_t *tok, uint32_t n, uint32_t max_new,
                    uint64_t salt)
{
    sched_request q = {.id = id,
                       .tenant = tenant,
                       .class_idx = -1,
                       .prompt_len = n,
                       .max_new_tokens = max_new,
                       .arrival_us = D.now,
                       .tokens = tok,
                       .cache_salt = salt};
    int rc = sched_submit(D.s, &q, D.now, NULL);
    d_check();
    return rc;
}

/* One iteration: step, complete its transfers, execute every entry (a token per sampling
 * entry), commit.  Returns the plan (valid until the next step). */
static const sched_plan *d_iter(void)
{
    return sd_iter(D.s, &D.now, NULL);
}

/* Iterate until nothing is queued, running or moving — at least once, so releases pending
 * from a cancel are done. */
static void d_run_until_idle(int max_iters)
{
    sched_counts c;
    for (int i = 0; i < max_iters; i++) {
        d_iter();
        sched_get_counts(D.s, &c);
        if (!c.waiting && !c.running && !c.swapped && !c.in_transit) return;
    }
    cr_assert_fail("not idle after %d iterations (waiting %u running %u)", max_iters, c.waiting,
                   c.running);
}

static const sched_event *d_find(sched_event_kind k, uint64_t req)
{
    for (uint32_t i = 0; i < D.n_ev; i++)
        if (D.ev[i].kind == k && D.ev[i].req == req) return &D.ev[i];
    return NULL;
}

static const sched_entry *d_entry(const sched_plan *pl, uint64_t req)
{
    for (uint32_t i = 0; i < pl->n_entries; i++)
        if (pl->entries[i].req == req) return &pl->entries[i];
    return NULL;
}

Test(sched_prefix_cache, a_request_sharing_a_cached_prefix_starts_its_prefill_after_it)
{
    d_init(NULL, 64, 0, true);
    int32_t a[20], b[20];
    for (int i = 0; i < 20; i++) a[i] = b[i] = 100 + i;
    b[17] = 5; /* b = a's first 4 blocks (16 tokens) + its own last block */
    cr_assert_eq(d_submit(1, 0, a, 20, 2, 7), 0);
    d_run_until_idle(50);
    cr_assert_null(d_find(SCHED_EV_CACHE_HIT, 1), "nothing was cached before a");
    sched_group_stats t0;
    sched_get_tenant_stats(D.s, 0, &t0);
    cr_assert_eq(t0.served_prompt_tokens, 20);
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.kv_cached[SCHED_POOL_DEVICE], 5, "a's 5 full blocks stay cached, got %u",
                 c.kv_cached[SCHED_POOL_DEVICE]);
    cr_assert_eq(c.kv_used[SCHED_POOL_DEVICE], 0, "cached blocks no sequence holds count as free");
    cr_assert_eq(c.kv_free[SCHED_POOL_DEVICE], 64);

    cr_assert_eq(d_submit(2, 0, b, 20, 2, 7), 0);
    const sched_plan *pl = d_iter();
    const sched_entry *e = d_entry(pl, 2);
    cr_assert_not_null(e);
    cr_assert_eq(e->start_pos, 16, "prefill starts at the first uncovered token, got %u",
                 e->start_pos);
    cr_assert_eq(e->n_tokens, 4);
    const sched_event *h = d_find(SCHED_EV_CACHE_HIT, 2);
    cr_assert_not_null(h);
    cr_assert_eq(h->cached_tokens, 16);
    cr_assert_eq(h->self_tokens, 0);
    cr_assert_eq(h->blocks, 4);
    d_run_until_idle(50);
    sched_group_stats t1;
    sched_get_tenant_stats(D.s, 0, &t1);
    cr_assert_eq(t1.served_prompt_tokens - t0.served_prompt_tokens, 4,
                 "only the uncovered tokens are computed");
    cr_assert_eq(d_find(SCHED_EV_FINISH, 2)->cached_tokens, 16,
                 "FINISH carries the cached-token count");
    /* fair share: b was charged its 4 computed prompt tokens and 2 outputs, a its 20 and 2 */
    cr_assert_lt(t1.virtual_tokens - t0.virtual_tokens, 7.0, "charged %.1f",
                 t1.virtual_tokens - t0.virtual_tokens);
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.prefix_hit_tokens, 16);
    cr_assert_eq(c.prefix_query_tokens, 40);

    /* the whole prompt cached: the last token is still computed (it samples) */
    cr_assert_eq(d_submit(3, 0, a, 20, 1, 7), 0);
    pl = d_iter();
    e = d_entry(pl, 3);
    cr_assert_eq(e->start_pos, 16);
    cr_assert_eq(e->n_tokens, 4);
    cr_assert_eq(d_submit(4, 0, a, 16, 1, 7), 0); /* exactly 4 blocks: 3 shared, the 4th computed */
    pl = d_iter();
    e = d_entry(pl, 4);
    cr_assert_eq(e->start_pos, 12);
    d_run_until_idle(50);
    d_fini();
}

Test(sched_prefix_cache, other_domains_and_uncached_requests_never_hit)
{
    d_init(NULL, 64, 0, true);
    int32_t a[16];
    for (int i = 0; i < 16; i++) a[i] = i;
    d_submit(1, 0, a, 16, 1, 1);
    d_run_until_idle(50);
    d_submit(2, 1, a, 16, 1, 2);    /* the same prompt in another domain */
    d_submit(3, 0, NULL, 16, 1, 1); /* no tokens given: not cached */
    const sched_plan *pl = d_iter();
    cr_assert_eq(d_entry(pl, 2)->start_pos, 0);
    cr_assert_eq(d_entry(pl, 3)->start_pos, 0);
    cr_assert_null(d_find(SCHED_EV_CACHE_HIT, 2));
    cr_assert_null(d_find(SCHED_EV_CACHE_HIT, 3));
    d_run_until_idle(50);
    d_fini();
}

/* A scheduler keying every block alike (sched_testing_set_prefix_key constant): a request shares
 * exactly the blocks whose tokens equal a cached prompt's, as with XXH3 keys; an unknown key
 * function is refused. */
Test(sched_prefix_cache, the_constant_key_shares_only_equal_blocks)
{
    d_key_fn = SCHED_PREFIX_KEY_CONSTANT;
    d_init(NULL, 64, 0, true);
    d_key_fn = SCHED_PREFIX_KEY_XXH3;
    int32_t a[16], b[16];
    for (int i = 0; i < 16; i++) a[i] = b[i] = 100 + i;
    b[5] = 7; /* b = a's block 0, then its own */
    d_submit(1, 0, a, 16, 1, 1);
    d_run_until_idle(50);
    d_submit(2, 0, b, 16, 1, 1);
    d_run_until_idle(50);
    d_submit(3, 0, a, 16, 1, 1);
    d_run_until_idle(50);
    const sched_event *h2 = d_find(SCHED_EV_CACHE_HIT, 2), *h3 = d_find(SCHED_EV_CACHE_HIT, 3);
    cr_assert_not_null(h2);
    cr_assert_eq(h2->cached_tokens, 4, "b shares a's first block only, got %u tokens",
                 h2->cached_tokens);
    cr_assert_not_null(h3);
    cr_assert_eq(h3->cached_tokens, 12, "a again: its 3 blocks before the last token, got %u",
                 h3->cached_tokens);
    d_fini();

    sched_policy *p;
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse("[scheduler]\n", &p, &err), 0);
    sched_config c = {.kv_blocks_device = 8,
                      .block_size = 4,
                      .kv_bytes_per_token = 64,
                      .max_context = 64,
                      .step.prefill_token_us = 1,
                      .prefix_cache = true};
    sched *s = NULL;
    cr_assert_eq(sched_create(p, &c, NULL, NULL, 1, &s), 0, "%s", sched_last_error());
    cr_assert_eq(sched_testing_set_prefix_key(s, SCHED_PREFIX_KEY__COUNT), -EINVAL);
    cr_assert(strstr(sched_last_error(), "prefix_key"), "%s", sched_last_error());
    sched_destroy(s);
    sched_policy_free(p);
}

/* The policy's per-tenant max_cached_blocks: a tenant's finished prompts keep at most that
 * many unheld blocks (its oldest leaves go, with a tenant_cap event); another tenant's cache
 * is untouched and what is kept still hits. */
Test(sched_prefix_cache, max_cached_blocks_caps_a_tenants_unheld_blocks)
{
    d_init_tenants(NULL, "[tenant a]\nmax_cached_blocks = 2\n[tenant b]\n", 64, 0, true);
    int32_t a[20], b[20];
    for (int i = 0; i < 20; i++) {
        a[i] = i;
        b[i] = 300 + i;
    }
    d_submit(1, 1, b, 20, 1, 11); /* tenant b: 5 full blocks, no cap */
    d_run_until_idle(50);
    d_submit(2, 0, a, 20, 1, 22); /* tenant a: 5 full blocks, cap 2 */
    d_run_until_idle(50);
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.kv_cached[SCHED_POOL_DEVICE], 7, "b's 5 blocks and a's 2, got %u",
                 c.kv_cached[SCHED_POOL_DEVICE]);
    cr_assert_eq(c.prefix_evicted_blocks, 3);
    cr_assert_eq(c.kv_free[SCHED_POOL_DEVICE], 64, "every block is free or evictable");
    const sched_event *ev = d_find(SCHED_EV_CACHE_EVICT, 2);
    cr_assert_not_null(ev, "the cap's eviction is logged");
    cr_assert_eq(ev->evict, SCHED_PREFIX_EVICT_TENANT_CAP);
    cr_assert_eq(ev->blocks, 3);
    d_submit(3, 0, a, 20, 1, 22);
    const sched_plan *pl = d_iter();
    cr_assert_eq(d_entry(pl, 3)->start_pos, 8, "a's first two blocks were kept and hit");
    d_submit(4, 1, b, 20, 1, 11);
    pl = d_iter();
    cr_assert_eq(d_entry(pl, 4)->start_pos, 16, "b's blocks were all kept");
    d_run_until_idle(50);
    d_fini();
}

Test(sched_prefix_cache, off_by_default_the_scheduler_frees_blocks_as_before)
{
    d_init(NULL, 64, 0, false);
    int32_t a[16];
    for (int i = 0; i < 16; i++) a[i] = i;
    d_submit(1, 0, a, 16, 1, 1);
    d_run_until_idle(50);
    d_submit(2, 0, a, 16, 1, 1);
    const sched_plan *pl = d_iter();
    cr_assert_eq(d_entry(pl, 2)->start_pos, 0);
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.kv_cached[SCHED_POOL_DEVICE], 0);
    cr_assert_eq(c.prefix_query_tokens, 0);
    d_run_until_idle(50);
    d_fini();
}

Test(sched_prefix_cache, running_sequences_share_blocks_and_a_holder_ending_frees_nothing_shared)
{
    d_init(NULL, 64, 0, true);
    int32_t sys[12], p[3][20];
    for (int i = 0; i < 12; i++) sys[i] = 900 + i;
    for (int u = 0; u < 3; u++)
        for (int i = 0; i < 20; i++) p[u][i] = i < 12 ? sys[i] : 1000 * u + i;
    d_submit(1, 0, p[0], 20, 1, 3); /* caches the system prompt */
    d_run_until_idle(50);
    d_submit(2, 0, p[1], 20, 30, 3);
    d_submit(3, 1, p[2], 20, 3, 3); /* another tenant, same domain: shares too */
    const sched_plan *pl = d_iter();
    const sched_entry *e2 = d_entry(pl, 2), *e3 = d_entry(pl, 3);
    cr_assert_eq(e2->start_pos, 12);
    cr_assert_eq(e3->start_pos, 12);
    for (int b = 0; b < 3; b++) cr_assert_eq(e2->blocks[b], e3->blocks[b], "block %d is shared", b);
    cr_assert_neq(e2->blocks[3], e3->blocks[3], "each writes its own tail");
    for (int i = 0; i < 6; i++) d_iter(); /* 3 finishes while 2 decodes on the shared blocks */
    cr_assert_not_null(d_find(SCHED_EV_FINISH, 3));
    sched_req_info ri;
    cr_assert_eq(sched_get_request(D.s, 2, &ri), 0);
    cr_assert_eq(ri.state, SCHED_REQ_RUNNING);
    sched_cancel(D.s, 2, D.now, SCHED_CANCEL_CLIENT); /* cancelled mid-decode */
    d_run_until_idle(50);
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.kv_used[SCHED_POOL_DEVICE], 0, "no block leaked");
    cr_assert_eq(c.kv_cached[SCHED_POOL_DEVICE], 3 + 2 + 2 + 2,
                 "the system prompt once, each user's 2 own blocks");
    d_fini();
}

Test(sched_prefix_cache, a_prefill_cancelled_midway_keeps_only_its_computed_blocks)
{
    d_init(NULL, 64, 0, true);
    int32_t a[40];
    for (int i = 0; i < 40; i++) a[i] = 3 * i + 1;
    d_submit(1, 0, a, 40, 4, 0);
    d_iter(); /* prefill_chunk 8: two blocks computed */
    d_iter(); /* four */
    sched_cancel(D.s, 1, D.now, SCHED_CANCEL_DISCONNECT);
    d_run_until_idle(10);
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.kv_used[SCHED_POOL_DEVICE], 0);
    cr_assert_eq(c.kv_cached[SCHED_POOL_DEVICE], 4, "the 16 computed tokens' blocks stay, got %u",
                 c.kv_cached[SCHED_POOL_DEVICE]);
    d_submit(2, 0, a, 40, 1, 0);
    const sched_plan *pl = d_iter();
    cr_assert_eq(d_entry(pl, 2)->start_pos, 16, "the retry resumes where the cancelled one got");
    d_run_until_idle(50);
    d_fini();
}

Test(sched_prefix_cache, free_block_demand_evicts_cached_blocks_instead_of_waiting)
{
    d_init(NULL, 24, 0, true);
    int32_t p[30][16];
    for (int r = 0; r < 30; r++)
        for (int i = 0; i < 16; i++) p[r][i] = r * 100 + i;
    for (int r = 0; r < 30; r++) { /* 30 × 5 blocks (prompt + output) through a 24-block pool */
        d_submit((uint64_t)r + 1, r % 2, p[r], 16, 4, 0);
        d_run_until_idle(50);
    }
    cr_assert_eq(D.finished, 30);
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_gt(c.prefix_evicted_blocks, 0);
    cr_assert_leq(c.kv_cached[SCHED_POOL_DEVICE], 24);
    int evicts = 0;
    for (uint32_t i = 0; i < D.n_ev; i++)
        if (D.ev[i].kind == SCHED_EV_CACHE_EVICT) {
            evicts++;
            cr_assert_eq(D.ev[i].evict, SCHED_PREFIX_EVICT_DEMAND);
            char line[256];
            event_json(&D.ev[i], line, sizeof line);
            cr_assert(strstr(line, "\"ev\":\"cache_evict\"") &&
                          strstr(line, "\"reason\":\"demand\""),
                      "%s", line);
        }
    cr_assert_gt(evicts, 0);
    for (uint32_t i = 0; i < D.n_ev; i++)
        cr_assert(!(D.ev[i].kind == SCHED_EV_DEFER && D.ev[i].defer == SCHED_DEFER_BLOCKS),
                  "a request waited for blocks while cached blocks could be evicted");
    /* the most recent prompt is still there */
    d_submit(100, 1, p[29], 16, 1, 0);
    const sched_plan *pl = d_iter();
    cr_assert_eq(d_entry(pl, 100)->start_pos, 12);
    d_run_until_idle(50);
    d_fini();
}

Test(sched_prefix_cache, a_recompute_preempted_sequence_reuses_its_own_blocks_counted_as_self)
{
    d_init("preemption = recompute", 14, 0, true);
    int32_t a[16], b[16];
    for (int i = 0; i < 16; i++) {
        a[i] = i;
        b[i] = 50 + i;
    }
    d_submit(1, 0, a, 16, 24, 0);
    d_submit(2, 1, b, 16, 24, 0);
    d_run_until_idle(400);
    cr_assert_eq(D.finished, 2);
    sched_counts c;
    sched_get_counts(D.s, &c);
    int preempts = 0, self_hits = 0;
    for (uint32_t i = 0; i < D.n_ev; i++) {
        preempts += D.ev[i].kind == SCHED_EV_PREEMPT;
        if (D.ev[i].kind == SCHED_EV_CACHE_HIT && D.ev[i].self_tokens) self_hits++;
    }
    cr_assert_gt(preempts, 0, "the pool is too small for both: someone is preempted");
    cr_assert_gt(self_hits, 0, "the resumed sequence found its own prompt blocks");
    cr_assert_gt(c.prefix_self_tokens, 0);
    cr_assert_eq(c.prefix_self_tokens, c.prefix_hit_tokens,
                 "no cross-request sharing here: every hit is a self hit");
    d_fini();
}

Test(sched_prefix_cache, random_traffic_with_swaps_and_cancels_keeps_every_block_accounted)
{
    d_init("preemption = auto", 40, 40, true);
    uint64_t id = 0;
    int32_t tok[64][48];
    for (int step = 0; step < 600; step++) {
        if (RND(3) == 0 && id < 64) {
            uint32_t len = 8 + RND(40), sys = RND(3);
            int32_t *t = tok[id];
            for (uint32_t i = 0; i < len; i++)
                t[i] = i < 12 ? (int32_t)(sys * 1000 + i) : (int32_t)(RND(3) + 10 * i);
            id++;
            d_submit(id, (int)RND(2), t, len, 1 + RND(20), RND(2));
        }
        if (RND(17) == 0 && id)
            sched_cancel(D.s, 1 + RND((uint32_t)id), D.now, SCHED_CANCEL_CLIENT);
        d_iter();
    }
    d_run_until_idle(2000);
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.kv_used[SCHED_POOL_DEVICE], 0, "no device block leaked");
    cr_assert_eq(c.kv_used[SCHED_POOL_HOST], 0, "no host block leaked");
    cr_assert_gt(c.prefix_hit_tokens, 0, "the traffic shares prefixes");
    int swaps = 0, recomputes = 0;
    for (uint32_t i = 0; i < D.n_ev; i++)
        if (D.ev[i].kind == SCHED_EV_PREEMPT) {
            swaps += D.ev[i].mode == SCHED_PREEMPT_SWAP;
            recomputes += D.ev[i].mode == SCHED_PREEMPT_RECOMPUTE;
        }
    cr_assert_gt(swaps, 0,
                 "sequences holding shared blocks were swapped out (swaps %d, recomputes %d)",
                 swaps, recomputes);
    d_fini();
}

/* ================================================================================================
 * Host and disk tiers: demotion on demand, reload or recompute at admission, the copies as
 * cache transfers of the plan, failed copies.
 * ============================================================================================== */

/* The driver with a host and a disk pool and their costs (bytes/s both ways, latency). */
static void d_init_tiers(uint32_t dev, uint32_t host, uint32_t disk, double host_bps,
                         double disk_bps)
{
    memset(&D, 0, sizeof D);
    const char *pol = "[scheduler]\ntoken_budget = 64\nprefill_chunk = 8\nmax_preemptions = "
                      "0\n[tenant a]\n[tenant b]\n"
                      "[class default]\n";
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(pol, &D.p, &err), 0, "policy line %d: %s", err.line,
                 err.reason);
    sched_config c = {
        .kv_blocks_device = dev,
        .kv_blocks_host = host,
        .kv_blocks_disk = disk,
        .block_size = 4,
        .kv_bytes_per_token = 64,
        .max_context = 512,
        .step.base_us = 100,
        .step.prefill_token_us = 1,
        .step.decode_seq_us = 1,
        .host = {.out_bytes_per_s = host_bps, .in_bytes_per_s = host_bps, .latency_us = 1},
        .disk = {.out_bytes_per_s = disk_bps, .in_bytes_per_s = disk_bps, .latency_us = 1},
        .prefix_cache = true};
    cr_assert_eq(sched_create(D.p, &c, d_sink, NULL, 1, &D.s), 0, "%s", sched_last_error());
}

/* Like d_iter, but the plan's cache copies complete with `status` after dur_us (their bytes
 * measured), the others at once. */
static const sched_plan *d_iter_copies(uint64_t dur_us, int status)
{
    return sd_iter(D.s, &D.now, &(sd_copies){.dur_us = dur_us, .status = status});
}

static int d_count(sched_event_kind k)
{
    int n = 0;
    for (uint32_t i = 0; i < D.n_ev; i++) n += D.ev[i].kind == k;
    return n;
}

/* Six 16-token prompts (4 blocks each, 5 while they run) through a 12-block device pool:
 * the first three's blocks must leave the device. */
#define NTP 6
static int32_t TP[NTP][16];
static void d_fill_device(uint64_t first_id)
{
    for (int r = 0; r < NTP; r++) {
        for (int i = 0; i < 16; i++) TP[r][i] = 1000 * (r + 1) + i;
        cr_assert_eq(d_submit(first_id + (uint64_t)r, 0, TP[r], 16, 1, 9), 0);
        d_run_until_idle(50);
    }
}

/* Request id of `tenant` sends TP[r] again: its cached prefix (3 blocks, 12 tokens) is found
 * on the device and its prefill starts after it.  Returns its cache_hit event. */
static const sched_event *d_resend_finds_it_on_the_device(uint64_t id, int tenant, int r)
{
    cr_assert_eq(d_submit(id, tenant, TP[r], 16, 1, 9), 0);
    const sched_plan *pl = d_iter();
    cr_assert_eq(d_entry(pl, id)->start_pos, 12,
                 "request %llu's prefill does not start after its cached prefix",
                 (unsigned long long)id);
    const sched_event *h = d_find(SCHED_EV_CACHE_HIT, id);
    cr_assert_not_null(h, "request %llu found nothing cached", (unsigned long long)id);
    cr_assert_eq(h->pool_tokens[SCHED_POOL_DEVICE], 12,
                 "request %llu found %u tokens on the device", (unsigned long long)id,
                 h->pool_tokens[SCHED_POOL_DEVICE]);
    return h;
}

Test(sched_prefix_tiers, evicted_blocks_are_demoted_to_host_and_reloaded_at_admission)
{
    d_init_tiers(12, 32, 0, 1e9, 1e9);
    d_fill_device(1);
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_gt(c.prefix_demoted_blocks[SCHED_POOL_HOST], 0,
                 "a fast host tier keeps what the device lets go");
    cr_assert_eq(c.prefix_evicted_blocks, 0, "nothing dropped: the host had room");
    cr_assert_eq(c.prefix_blocks[SCHED_POOL_HOST], c.prefix_demoted_blocks[SCHED_POOL_HOST]);
    cr_assert_eq(c.kv_cached[SCHED_POOL_HOST], c.prefix_blocks[SCHED_POOL_HOST],
                 "unheld, counted free");
    cr_assert_eq(c.kv_used[SCHED_POOL_HOST], 0);
    /* the demotion: logged with the test's two sides, and a cache copy in the plan */
    const sched_event *dm = NULL;
    for (uint32_t i = 0; i < D.n_ev && !dm; i++)
        if (D.ev[i].kind == SCHED_EV_CACHE_DEMOTE && !D.ev[i].outcome) dm = &D.ev[i];
    cr_assert_not_null(dm);
    cr_assert_eq(dm->pool, SCHED_POOL_DEVICE);
    cr_assert_eq(dm->to_pool, SCHED_POOL_HOST);
    cr_assert_gt(dm->recompute_cost_us * dm->expected_reuse, dm->swap_cost_us,
                 "demoted because reload < recompute × reuse");
    char line[512];
    event_json(dm, line, sizeof line);
    cr_assert(strstr(line, "\"ev\":\"cache_demote\"") && strstr(line, "\"to\":\"host\"") &&
                  strstr(line, "\"reload_cost_us\":") && strstr(line, "\"recompute_cost_us\":") &&
                  strstr(line, "\"expected_reuse\":"),
              "%s", line);
    cr_assert_gt(d_count(SCHED_EV_CACHE_DEMOTE), 1, "and its completion record");

    /* the first prompt again: its blocks are on the host; reloading 3 blocks beats
     * prefilling 12 tokens */
    cr_assert_eq(d_submit(10, 1, TP[0], 16, 1, 9), 0);
    const sched_plan *pl = sched_step(D.s, D.now);
    d_check();
    cr_assert_null(d_entry(pl, 10), "it waits for its blocks, as a swap-in does");
    const sched_transfer *rl = NULL;
    for (uint32_t i = 0; i < pl->n_transfers; i++)
        if (pl->transfers[i].cache && pl->transfers[i].dir == SCHED_XFER_IN) rl = &pl->transfers[i];
    cr_assert_not_null(rl, "a reload copy in the plan");
    cr_assert_eq(rl->tier, SCHED_POOL_HOST);
    cr_assert_eq(rl->n_blocks, 3);
    cr_assert_eq(rl->req, 10);
    uint64_t rl_id = rl->id, rl_bytes = rl->bytes;
    uint32_t rl_dst[3];
    memcpy(rl_dst, rl->dst, sizeof rl_dst);
    sched_req_info ri;
    cr_assert_eq(sched_get_request(D.s, 10, &ri), 0);
    cr_assert_eq(ri.state, SCHED_REQ_SWAPPING_IN);
    cr_assert_eq(ri.computed, 12);
    const sched_event *r = d_find(SCHED_EV_CACHE_RELOAD, 10);
    cr_assert_not_null(r);
    cr_assert_eq(r->mode, SCHED_PREEMPT_SWAP);
    cr_assert_lt(r->swap_cost_us, r->recompute_cost_us);
    event_json(r, line, sizeof line);
    cr_assert(strstr(line, "\"choice\":\"reload\"") && strstr(line, "\"pool\":\"host\""), "%s",
              line);
    const sched_event *h = d_find(SCHED_EV_CACHE_HIT, 10);
    cr_assert_eq(h->pool_tokens[SCHED_POOL_HOST], 12);
    cr_assert_eq(h->cached_tokens, 12);
    event_json(h, line, sizeof line);
    cr_assert(strstr(line, "\"host_tokens\":12"), "%s", line);
    double pred = r->swap_cost_us;
    D.now += 1000;
    cr_assert_eq(sched_commit(D.s, NULL, 0, D.now, 0), 0);
    d_check();
    /* complete it: the realised cost next to the prediction */
    cr_assert_eq(sched_transfer_done(D.s, rl_id, D.now, rl_bytes, 7, 0), 0);
    d_check();
    uint32_t n_done = 0;
    for (uint32_t i = 0; i < D.n_ev; i++)
        if (D.ev[i].kind == SCHED_EV_CACHE_RELOAD && D.ev[i].outcome == SCHED_OUTCOME_DONE &&
            D.ev[i].req == 10) {
            n_done++;
            cr_assert_eq(D.ev[i].realised_us, 7.0);
            cr_assert_eq(D.ev[i].predicted_us, pred);
        }
    cr_assert_eq(n_done, 1);
    /* now its prefill starts, after the reloaded blocks, in the blocks they arrived in */
    pl = sched_step(D.s, D.now);
    d_check();
    const sched_entry *e = d_entry(pl, 10);
    cr_assert_not_null(e);
    cr_assert_eq(e->start_pos, 12, "prefill starts after the reloaded blocks, got %u",
                 e->start_pos);
    for (uint32_t k = 0; k < 3; k++)
        cr_assert_eq(rl_dst[k], e->blocks[k], "reloaded into the entry's first blocks");
    sched_result res = {.req = 10, .tokens = 1};
    D.now += 1000;
    cr_assert_eq(sched_commit(D.s, &res, 1, D.now, 0), 0);
    d_check();
    d_run_until_idle(50);
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.prefix_reloaded_blocks[SCHED_POOL_HOST], 3);
    cr_assert_eq(c.prefix_hit_pool_tokens[SCHED_POOL_HOST], 12);
    cr_assert_eq(c.kv_used[SCHED_POOL_DEVICE] + c.kv_used[SCHED_POOL_HOST], 0, "no block leaked");
    d_fini();
}

/* The reload-or-recompute choice follows the measured bandwidth: once a reload measured the
 * host slow, a prefix found there is prefilled again, and the log says why. */
Test(sched_prefix_tiers, a_slow_tier_makes_admission_recompute_and_logs_both_estimates)
{
    d_init_tiers(12, 32, 0, 1e9, 1e9);
    d_fill_device(1);
    /* prompt 2 (on the host now) reloads, and the copy is measured slow: 768 bytes in 1 s */
    cr_assert_eq(d_submit(10, 0, TP[1], 16, 1, 9), 0);
    d_iter_copies(1000000, 0);
    cr_assert_eq(d_find(SCHED_EV_CACHE_RELOAD, 10)->mode, SCHED_PREEMPT_SWAP);
    d_run_until_idle(50);
    sched_tier_cost tc;
    bool m_in = false;
    cr_assert_eq(sched_get_tier_cost(D.s, SCHED_POOL_HOST, &tc, NULL, &m_in), 0);
    cr_assert(m_in);
    cr_assert_lt(tc.in_bytes_per_s, 1000.0);
    /* prompt 1 is on the host too: reload now costs ~1 s against 12 µs of prefill */
    cr_assert_eq(d_submit(11, 0, TP[0], 16, 1, 9), 0);
    const sched_plan *pl = d_iter();
    const sched_event *r = d_find(SCHED_EV_CACHE_RELOAD, 11);
    cr_assert_not_null(r);
    cr_assert_eq(r->mode, SCHED_PREEMPT_RECOMPUTE);
    cr_assert_gt(r->swap_cost_us, r->recompute_cost_us);
    cr_assert_eq(r->pool, SCHED_POOL_HOST);
    char line[512];
    event_json(r, line, sizeof line);
    cr_assert(strstr(line, "\"choice\":\"recompute\"") && strstr(line, "\"reload_cost_us\":") &&
                  strstr(line, "\"recompute_cost_us\":"),
              "%s", line);
    cr_assert_eq(d_entry(pl, 11)->start_pos, 0, "recomputed from the start");
    for (uint32_t i = 0; i < pl->n_transfers; i++)
        cr_assert(!pl->transfers[i].cache || pl->transfers[i].dir == SCHED_XFER_OUT);
    double pred = r->recompute_cost_us;
    d_run_until_idle(50);
    /* and when the prefill has computed the run: the realised cost next to the estimate */
    const sched_event *done = NULL;
    for (uint32_t i = 0; i < D.n_ev; i++)
        if (D.ev[i].kind == SCHED_EV_CACHE_RELOAD && D.ev[i].req == 11 && D.ev[i].outcome)
            done = &D.ev[i];
    cr_assert_not_null(done, "no completion record for the recomputed run");
    cr_assert_eq(done->outcome, SCHED_OUTCOME_DONE);
    cr_assert_eq(done->mode, SCHED_PREEMPT_RECOMPUTE);
    cr_assert_eq(done->predicted_us, pred);
    cr_assert_eq(done->realised_us, -1.0, "the driver's steps carry no duration: unmeasured");
    event_json(done, line, sizeof line);
    cr_assert(strstr(line, "\"reason\":\"done\"") && strstr(line, "\"choice\":\"recompute\"") &&
                  strstr(line, "\"realised_us\":null"),
              "%s", line);
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.prefix_recomputed_blocks[SCHED_POOL_HOST], 3);
    /* the recomputed blocks replaced their host copies: the prompt is on the device again */
    d_resend_finds_it_on_the_device(12, 0, 0);
    d_run_until_idle(50);
    d_fini();
}

/* A host that is full demotes its own oldest blocks to disk first, and the plan orders the
 * copies so: the host → disk copy before the device → host copy into the block it freed. */
Test(sched_prefix_tiers, a_full_host_demotes_to_disk_and_the_copies_are_ordered)
{
    d_init_tiers(12, 4, 32, 1e9, 1e9);
    for (int r = 0; r < NTP; r++)
        for (int i = 0; i < 16; i++) TP[r][i] = 1000 * (r + 1) + i;
    bool ordered_seen = false;
    for (int r = 0; r < NTP; r++) {
        cr_assert_eq(d_submit(1 + (uint64_t)r, 0, TP[r], 16, 1, 9), 0);
        for (int it = 0; it < 50; it++) {
            const sched_plan *pl = sched_step(D.s, D.now);
            d_check();
            /* a host block a device → host copy writes was read by an earlier host → disk copy
             * of this plan, never by a later one */
            for (uint32_t i = 0; i < pl->n_transfers; i++) {
                const sched_transfer *t = &pl->transfers[i];
                if (!t->cache || t->tier != SCHED_POOL_HOST || t->dir != SCHED_XFER_OUT) continue;
                for (uint32_t j = i + 1; j < pl->n_transfers; j++) {
                    const sched_transfer *u = &pl->transfers[j];
                    if (u->cache && u->src_pool == SCHED_POOL_HOST)
                        for (uint32_t a = 0; a < t->n_blocks; a++)
                            for (uint32_t b = 0; b < u->n_blocks; b++)
                                cr_assert_neq(t->dst[a], u->src[b],
                                              "host block %u read after it was overwritten",
                                              t->dst[a]);
                }
                for (uint32_t j = 0; j < i; j++) {
                    const sched_transfer *u = &pl->transfers[j];
                    if (u->cache && u->src_pool == SCHED_POOL_HOST) ordered_seen = true;
                }
            }
            for (uint32_t i = 0; i < pl->n_transfers; i++)
                sched_transfer_done(D.s, pl->transfers[i].id, D.now, 0, 0, 0);
            sched_result res[64];
            uint32_t n = 0;
            for (uint32_t i = 0; i < pl->n_entries; i++)
                res[n++] =
                    (sched_result){.req = pl->entries[i].req, .tokens = pl->entries[i].samples};
            D.now += 1000;
            sched_commit(D.s, res, n, D.now, 0);
            d_check();
            sched_counts c;
            sched_get_counts(D.s, &c);
            if (!c.waiting && !c.running) break;
        }
    }
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_gt(c.prefix_demoted_blocks[SCHED_POOL_DISK], 0,
                 "the full host passed blocks on to disk");
    cr_assert(ordered_seen, "a host → disk copy came before a device → host copy in one plan");
    /* the oldest prompt is on disk now: found there and reloaded */
    cr_assert_eq(d_submit(10, 0, TP[0], 16, 1, 9), 0);
    const sched_plan *pl = d_iter(); /* (its reloads complete in it) */
    const sched_event *h = d_find(SCHED_EV_CACHE_HIT, 10);
    cr_assert_not_null(h);
    cr_assert_gt(h->pool_tokens[SCHED_POOL_DISK], 0);
    cr_assert_null(d_entry(pl, 10), "no prefill before its blocks are in");
    pl = d_iter();
    cr_assert_eq(d_entry(pl, 10)->start_pos, 12);
    d_run_until_idle(50);
    d_fini();
}

/* A failed copy: its blocks' bytes are not the prompt's, so they are never found again. */
Test(sched_prefix_tiers, failed_copies_invalidate_the_blocks_they_were_for)
{
    d_init_tiers(12, 32, 0, 1e9, 1e9);
    for (int r = 0; r < NTP; r++)
        for (int i = 0; i < 16; i++) TP[r][i] = 1000 * (r + 1) + i;
    for (int r = 0; r < NTP; r++) { /* every demotion fails */
        cr_assert_eq(d_submit(1 + (uint64_t)r, 0, TP[r], 16, 1, 9), 0);
        for (int it = 0; it < 50; it++) {
            d_iter_copies(5, -EIO);
            sched_counts c;
            sched_get_counts(D.s, &c);
            if (!c.waiting && !c.running) break;
        }
    }
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_gt(c.prefix_demoted_blocks[SCHED_POOL_HOST], 0);
    cr_assert_eq(c.prefix_blocks[SCHED_POOL_HOST], 0, "every failed demotion's block was dropped");
    cr_assert_eq(c.kv_free[SCHED_POOL_HOST], 32);
    int failed = 0;
    for (uint32_t i = 0; i < D.n_ev; i++)
        failed += D.ev[i].kind == SCHED_EV_CACHE_DEMOTE && D.ev[i].outcome == SCHED_OUTCOME_FAILED;
    cr_assert_gt(failed, 0);
    cr_assert_eq(d_submit(10, 0, TP[0], 16, 1, 9), 0);
    const sched_plan *pl = d_iter();
    cr_assert_eq(d_entry(pl, 10)->start_pos, 0, "no hit on a failed copy");
    d_run_until_idle(50);

    /* a failed reload: the blocks it was for are dropped (their bytes never arrived) and the
     * request computes its prompt from the first of them; only what it computed is cached */
    d_fini();
    d_init_tiers(12, 32, 0, 1e9, 1e9);
    d_fill_device(1);
    cr_assert_eq(d_submit(10, 0, TP[0], 16, 1, 9), 0);
    d_iter_copies(5, -EIO);
    const sched_event *fe = NULL;
    for (uint32_t i = 0; i < D.n_ev; i++)
        if (D.ev[i].kind == SCHED_EV_CACHE_EVICT && D.ev[i].evict == SCHED_PREFIX_EVICT_FAILED &&
            D.ev[i].req == 10)
            fe = &D.ev[i];
    cr_assert_not_null(fe, "no cache_evict (failed) for the blocks of the failed reload");
    cr_assert_geq(fe->blocks, 3, "the 3 blocks it was for (and what hangs below them): %u",
                  fe->blocks);
    cr_assert_eq(fe->pool, SCHED_POOL_HOST);
    sched_req_info ri;
    cr_assert_eq(sched_get_request(D.s, 10, &ri), 0);
    cr_assert_eq(ri.state, SCHED_REQ_RUNNING);
    cr_assert_eq(ri.computed, 0, "computed again from the failed blocks on");
    pl = d_iter();
    cr_assert_eq(d_entry(pl, 10)->start_pos, 0);
    d_run_until_idle(50);
    /* the blocks request 10 computed again */
    const sched_event *h = d_resend_finds_it_on_the_device(11, 0, 0);
    cr_assert_eq(h->pool_tokens[SCHED_POOL_HOST], 0, "no hit on a failed reload's blocks");
    d_run_until_idle(50);
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.kv_used[SCHED_POOL_DEVICE] + c.kv_used[SCHED_POOL_HOST], 0, "no block leaked");
    d_fini();
}

/* One iteration: every transfer of its plan completes at once except `hold` (0: none), which
 * stays in flight; with ids, the sampled tokens carry ids (sched_result.token): request r's
 * n-th generated token is 7000 + 10 * r + n.  Invariants after every call. */
static const sched_plan *d_iter_with(uint64_t hold, bool ids)
{
    const sched_plan *pl = sched_step(D.s, D.now);
    cr_assert(pl, "%s", sched_last_error());
    d_check();
    for (uint32_t i = 0; i < pl->n_transfers; i++)
        if (pl->transfers[i].id != hold) {
            cr_assert_eq(sched_transfer_done(D.s, pl->transfers[i].id, D.now, 0, 0, 0), 0);
            d_check();
        }
    sched_result res[256];
    uint32_t n = 0;
    for (uint32_t i = 0; i < pl->n_entries && n < 256; i++) {
        const sched_entry *e = &pl->entries[i];
        res[n] = (sched_result){.req = e->req, .tokens = e->samples};
        sched_req_info ri;
        if (ids && e->samples) {
            cr_assert_eq(sched_get_request(D.s, e->req, &ri), 0);
            res[n].has_token = true;
            res[n].token = (int32_t)(7000 + 10 * e->req + ri.generated);
        }
        n++;
    }
    D.now += 1000;
    cr_assert_eq(sched_commit(D.s, res, n, D.now, 0), 0);
    d_check();
    return pl;
}
static const sched_plan *d_iter_hold(uint64_t hold)
{
    return d_iter_with(hold, false);
}
static const sched_plan *d_iter_ids(void)
{
    return d_iter_with(0, true);
}

/* A reload runs beside the steps: while a request's blocks come back from the host, a
 * running stream keeps decoding and the reloading request is in no batch; another request
 * with the same prompt meanwhile does not share the blocks before they arrived (it computes
 * them, and shares them once they are in); a request cancelled while its blocks come back is
 * released when they are in.  Every invariant (reference counts included) after each call. */
Test(sched_prefix_tiers,
     a_reload_runs_beside_the_steps_and_nobody_uses_its_blocks_before_they_arrive)
{
    d_init_tiers(16, 32, 0, 1e9, 1e9);
    d_fill_device(1);
    int32_t other[4] = {50001, 50002, 50003, 50004};
    cr_assert_eq(d_submit(20, 1, other, 4, 10, 7), 0);
    d_iter();
    d_iter();
    cr_assert_eq(d_submit(10, 1, TP[0], 16, 1, 9), 0);
    const sched_plan *pl = sched_step(D.s, D.now);
    d_check();
    uint64_t rl = 0;
    for (uint32_t i = 0; i < pl->n_transfers; i++)
        if (pl->transfers[i].cache && pl->transfers[i].dir == SCHED_XFER_IN &&
            pl->transfers[i].req == 10)
            rl = pl->transfers[i].id;
    cr_assert_neq(rl, 0, "request 10's prefix reloads from the host");
    cr_assert_null(d_entry(pl, 10));
    cr_assert_not_null(d_entry(pl, 20),
                       "the running stream decodes in the step that starts the reload");
    sched_result res = {.req = 20, .tokens = 1};
    D.now += 1000;
    cr_assert_eq(sched_commit(D.s, &res, 1, D.now, 0), 0);
    d_check();
    /* the same prompt again while the copy is in flight: no hit on the loading blocks */
    cr_assert_eq(d_submit(11, 1, TP[0], 16, 1, 9), 0);
    int decoded = 0;
    for (int it = 0; it < 4; it++) {
        pl = d_iter_hold(rl);
        cr_assert_null(d_entry(pl, 10), "step %d: it ran before its blocks were in", it);
        decoded += d_entry(pl, 20) != NULL;
        if (it == 0)
            cr_assert_eq(d_entry(pl, 11)->start_pos, 0, "request 11 used blocks still loading");
    }
    cr_assert_eq(decoded, 4, "the running stream decoded in every step of the reload");
    cr_assert_null(d_find(SCHED_EV_CACHE_HIT, 11), "no hit on blocks being loaded");
    sched_req_info ri;
    cr_assert_eq(sched_get_request(D.s, 10, &ri), 0);
    cr_assert_eq(ri.state, SCHED_REQ_SWAPPING_IN);
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.in_transit, 1);
    cr_assert_eq(sched_transfer_done(D.s, rl, D.now, 0, 0, 0), 0);
    d_check();
    cr_assert_eq(sched_get_request(D.s, 10, &ri), 0);
    cr_assert_eq(ri.state, SCHED_REQ_RUNNING);
    pl = d_iter();
    cr_assert_eq(d_entry(pl, 10)->start_pos, 12, "its prefill starts after the reloaded blocks");
    d_run_until_idle(100);
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.kv_used[SCHED_POOL_DEVICE] + c.kv_used[SCHED_POOL_HOST], 0, "no block leaked");
    /* cancelled while its blocks come back (prompt 1 is on the host too): released when in */
    cr_assert_eq(d_submit(30, 1, TP[1], 16, 1, 9), 0);
    pl = sched_step(D.s, D.now);
    d_check();
    rl = 0;
    for (uint32_t i = 0; i < pl->n_transfers; i++)
        if (pl->transfers[i].cache && pl->transfers[i].dir == SCHED_XFER_IN &&
            pl->transfers[i].req == 30)
            rl = pl->transfers[i].id;
    cr_assert_neq(rl, 0, "request 30's prefix reloads from the host");
    for (uint32_t i = 0; i < pl->n_transfers; i++)
        if (pl->transfers[i].id != rl)
            cr_assert_eq(sched_transfer_done(D.s, pl->transfers[i].id, D.now, 0, 0, 0), 0);
    D.now += 1000;
    cr_assert_eq(sched_commit(D.s, NULL, 0, D.now, 0), 0);
    cr_assert_eq(sched_cancel(D.s, 30, D.now, SCHED_CANCEL_CLIENT), 0);
    d_iter_hold(rl);
    cr_assert_eq(sched_get_request(D.s, 30, &ri), 0, "released before its copy completed");
    cr_assert_eq(sched_transfer_done(D.s, rl, D.now, 0, 0, 0), 0);
    d_check();
    cr_assert_eq(sched_get_request(D.s, 30, &ri), -ENOENT);
    d_run_until_idle(10);
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.kv_used[SCHED_POOL_DEVICE] + c.kv_used[SCHED_POOL_HOST], 0, "no block leaked");
    cr_assert_eq(c.prefix_reloaded_blocks[SCHED_POOL_HOST], 6);
    /* what came back is cached on the device now */
    d_resend_finds_it_on_the_device(31, 1, 1);
    d_run_until_idle(10);
    d_fini();
}

/* A conversation's next turn extends the last prompt and its answer: the blocks the answer
 * filled are cached when the ids of its tokens are known, so the next turn's hit covers
 * them; without the ids only the prompt's blocks are. */
Test(sched_prefix_cache, the_answers_full_blocks_are_cached_for_the_next_turn)
{
    d_init(NULL, 64, 0, true);
    int32_t turn1[10], turn2[30];
    for (int i = 0; i < 10; i++) turn1[i] = 100 + i;
    cr_assert_eq(d_submit(1, 0, turn1, 10, 12, 5),
                 0); /* 10 + 12 = 22 tokens: 21 computed, 5 full blocks */
    for (int it = 0; it < 40; it++) {
        d_iter_ids();
        sched_counts c;
        sched_get_counts(D.s, &c);
        if (!c.waiting && !c.running) break;
    }
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.prefix_blocks[SCHED_POOL_DEVICE], 5,
                 "the prompt's 2 blocks and the answer's 3: %u cached",
                 c.prefix_blocks[SCHED_POOL_DEVICE]);
    /* turn 2 = turn 1's prompt + its answer (the ids d_iter_ids gave it) + new text */
    uint32_t n = 0;
    for (int i = 0; i < 10; i++) turn2[n++] = turn1[i];
    for (int g = 0; g < 12; g++) turn2[n++] = 7000 + 10 + g;
    while (n < 30) {
        turn2[n] = 500 + (int32_t)n;
        n++;
    }
    cr_assert_eq(d_submit(2, 0, turn2, 30, 1, 5), 0);
    const sched_plan *pl = d_iter_ids();
    const sched_event *h = d_find(SCHED_EV_CACHE_HIT, 2);
    cr_assert_not_null(h, "no hit for the next turn");
    cr_assert_eq(h->cached_tokens, 20, "the prompt's 2 blocks and the 3 the answer filled: %u",
                 h->cached_tokens);
    cr_assert_eq(d_entry(pl, 2)->start_pos, 20);
    d_run_until_idle(50);
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.kv_used[SCHED_POOL_DEVICE], 0, "no block leaked");
    d_fini();

    /* without the ids (a caller that gives none): only the prompt's blocks are cached */
    d_init(NULL, 64, 0, true);
    cr_assert_eq(d_submit(1, 0, turn1, 10, 12, 5), 0);
    d_run_until_idle(40);
    sched_get_counts(D.s, &c);
    cr_assert_eq(c.prefix_blocks[SCHED_POOL_DEVICE], 2,
                 "no ids: only the prompt's 2 full blocks, got %u",
                 c.prefix_blocks[SCHED_POOL_DEVICE]);
    d_fini();
}
