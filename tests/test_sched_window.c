/* SPDX-License-Identifier: MIT */
/*
 * test_sched_window.c — sequences of a model windowed on every layer
 * (sched_config.attention_window) hold only the KV blocks their window can still see: a
 * sequence far longer than the device pool runs to the end, its block table holds
 * SCHED_BLOCK_NONE only where no row of the next entry reads, a swap moves only the blocks
 * held, a recompute re-prefills from position 0 in the window's blocks, the prefix cache
 * keeps the prompt's chain, and the never-fits test counts the window. With window rings
 * (sched_config.window_rings, gemma's windowed layers) a sequence holding blocks holds a
 * ring: starts wait for one, and a preemption gives it back.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "sched/sched.h"
#include "tests/sched_drive_util.h"

#define BS 16

static const char *policy_text(const char *preemption)
{
    static char buf[512];
    snprintf(buf, sizeof buf,
             "[scheduler]\nmode = token_budget\ntoken_budget = 64\nprefill_chunk = 16\n"
             "preemption = %s\nmin_residency = 0\nmax_preemptions = 0\ndefault_class = lo\n"
             "[class lo]\npriority = 0\n[class hi]\npriority = 10\n",
             preemption);
    return buf;
}

static sched *make(const char *preemption, uint32_t window, uint32_t dev_blocks,
                   uint32_t host_blocks, bool prefix, sched_policy **pol)
{
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(policy_text(preemption), pol, &err), 0, "policy: %s",
                 err.reason);
    sched_config c = {
        .kv_blocks_device = dev_blocks,
        .kv_blocks_host = host_blocks,
        .block_size = BS,
        .kv_bytes_per_token = 1024,
        .max_context = 8192,
        .step = {.base_us = 1000, .prefill_token_us = 10, .decode_seq_us = 10},
        .host = {.out_bytes_per_s = 1e9, .in_bytes_per_s = 1e9, .latency_us = 10},
        .prefix_cache = prefix,
        .prefix_cache_generated = prefix,
        .attention_window = window,
    };
    sched *s = NULL;
    cr_assert_eq(sched_create(*pol, &c, NULL, NULL, 1, &s), 0, "%s", sched_last_error());
    return s;
}

static int submit_class(sched *s, uint64_t id, uint32_t prompt, uint32_t max_new,
                        const int32_t *toks, uint64_t now, const char *cls)
{
    sched_request q = {.id = id,
                       .tenant = -1,
                       .class_idx = -1,
                       .class_name = cls,
                       .prompt_len = prompt,
                       .max_new_tokens = max_new,
                       .tokens = toks,
                       .cache_salt = toks ? 7 : 0};
    sched_reject_reason why;
    return sched_submit(s, &q, now, &why);
}

static int submit(sched *s, uint64_t id, uint32_t prompt, uint32_t max_new, const int32_t *toks,
                  uint64_t now)
{
    return submit_class(s, id, prompt, max_new, toks, now, NULL);
}

/* Every entry reads only blocks it holds: an entry at start_pos reads from the block of
 * position start_pos + 1 - window on (as the CPU kernels do); any NONE lies before it. */
static void check_entries(const sched_plan *pl, uint32_t window, uint32_t dev_blocks)
{
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        const sched_entry *e = &pl->entries[i];
        uint32_t first = e->start_pos + 1 > window ? (e->start_pos + 1 - window) / BS : 0;
        for (uint32_t j = 0; j < e->n_blocks; j++) {
            if (j < first) continue;
            cr_assert(e->blocks[j] != SCHED_BLOCK_NONE && e->blocks[j] < dev_blocks,
                      "request %llu at %u: block-table entry %u (window from block %u) is %u",
                      (unsigned long long)e->req, e->start_pos, j, first, e->blocks[j]);
        }
    }
}

/* One iteration: step, complete transfers, run every entry (a token each), commit. */
static const sched_plan *iter(sched *s, uint64_t *now, uint32_t window, uint32_t dev_blocks)
{
    const sched_plan *pl = sched_step(s, *now);
    cr_assert_not_null(pl, "%s", sched_last_error());
    sd_check(s);
    check_entries(pl, window, dev_blocks);
    for (uint32_t i = 0; i < pl->n_transfers; i++) {
        cr_assert_eq(sched_transfer_done(s, pl->transfers[i].id, *now, 0, 0, 0), 0);
        sd_check(s);
    }
    static sched_result res[64];
    uint32_t n = 0;
    for (uint32_t i = 0; i < pl->n_entries && n < 64; i++)
        res[n++] = (sched_result){.req = pl->entries[i].req,
                                  .tokens = pl->entries[i].samples,
                                  .has_token = true,
                                  .token = 5};
    *now += 1000;
    cr_assert_eq(sched_commit(s, res, n, *now, 0), 0);
    sd_check(s);
    return pl;
}

static uint32_t div_up(uint32_t a, uint32_t b)
{
    return (a + b - 1) / b;
}

Test(window, long_sequence_in_a_small_pool)
{
    /* 20 + 600 tokens = 39 blocks; the pool has 8: without the window it never fits */
    const uint32_t W = 64, DEV = 8, PROMPT = 20, GEN = 600;
    sched_policy *p0, *p;
    sched *s0 = make("recompute", 0, DEV, 0, false, &p0);
    cr_assert_eq(submit(s0, 1, PROMPT, GEN, NULL, 0), -E2BIG, "no window: never fits");
    sched_destroy(s0);
    sched_policy_free(p0);

    sched *s = make("recompute", W, DEV, 0, false, &p);
    cr_assert_eq(submit(s, 1, PROMPT, GEN, NULL, 0), 0, "%s", sched_last_error());
    uint64_t now = 1;
    uint32_t most = 0, released = 0;
    for (int step = 0; step < 5000; step++) {
        iter(s, &now, W, DEV);
        sched_req_info in;
        if (sched_get_request(s, 1, &in) == -ENOENT) break;
        uint32_t held = in.blocks[SCHED_POOL_DEVICE];
        if (held > most) most = held;
        released = in.released_blocks;
        /* the window's blocks and the one being filled, never more; the table covers
         * what was computed */
        cr_assert_leq(held, div_up(W, BS) + 1, "at %u computed: %u blocks held", in.computed, held);
        if (in.computed >= PROMPT)
            cr_assert_eq(held + in.released_blocks, div_up(in.computed, BS),
                         "at %u computed: %u held + %u given back", in.computed, held,
                         in.released_blocks);
    }
    sched_req_info in;
    cr_assert_eq(sched_get_request(s, 1, &in), -ENOENT, "it finished");
    cr_assert_eq(most, div_up(W, BS) + 1, "it held at most %u blocks", most);
    cr_assert_geq(released, div_up(PROMPT + GEN, BS) - div_up(W, BS) - 2);
    sched_counts c;
    sched_get_counts(s, &c);
    cr_assert_eq(c.kv_free[SCHED_POOL_DEVICE], DEV, "every block back in the pool");
    sched_destroy(s);
    sched_policy_free(p);
}

Test(window, long_prompt_prefills_chunk_by_chunk)
{
    /* a prompt of 300 tokens (19 blocks) in a pool of 8: admitted with its first chunk's
     * blocks, prefilled chunk by chunk as the window moves */
    const uint32_t W = 32, DEV = 8;
    sched_policy *p;
    sched *s = make("recompute", W, DEV, 0, false, &p);
    cr_assert_eq(submit(s, 1, 300, 4, NULL, 0), 0, "%s", sched_last_error());
    uint64_t now = 1;
    uint32_t out = 0;
    for (int step = 0; step < 200; step++) {
        const sched_plan *pl = iter(s, &now, W, DEV);
        for (uint32_t i = 0; i < pl->n_entries; i++) out += pl->entries[i].samples;
        sched_req_info in;
        if (sched_get_request(s, 1, &in) == -ENOENT) break;
        cr_assert_leq(in.blocks[SCHED_POOL_DEVICE], div_up(W + 16, BS) + 1);
    }
    cr_assert_eq(out, 4, "all four tokens came");
    sched_destroy(s);
    sched_policy_free(p);
}

/* Two long prompts admitted together, each with its first chunk's blocks, grew chunk by
 * chunk to their window, 4 blocks each: the whole pool of 8. Each then needed a block for its
 * next chunk before the window gave one back; a sequence part-way through a prefill takes
 * free blocks only, and only decoders waived their victims' protection, so nothing ran again.
 * With nothing computing and nothing moving, one of them is preempted and both finish. */
Test(window, prompts_growing_into_the_whole_pool_do_not_deadlock)
{
    const uint32_t W = 64, DEV = 8, PROMPT = 300, GEN = 4;
    sched_policy *p;
    sched *s = make("recompute", W, DEV, 0, false, &p);
    cr_assert_eq(submit(s, 1, PROMPT, GEN, NULL, 0), 0, "%s", sched_last_error());
    cr_assert_eq(submit(s, 2, PROMPT, GEN, NULL, 0), 0, "%s", sched_last_error());
    uint64_t now = 1;
    uint32_t out[3] = {0}, idle = 0;
    for (int step = 0; step < 2000 && idle < 50; step++) {
        const sched_plan *pl = iter(s, &now, W, DEV);
        idle = pl->n_entries ? 0 : idle + 1;
        for (uint32_t i = 0; i < pl->n_entries; i++)
            out[pl->entries[i].req] += pl->entries[i].samples;
        sched_req_info a, b;
        if (sched_get_request(s, 1, &a) == -ENOENT && sched_get_request(s, 2, &b) == -ENOENT) break;
    }
    sched_req_info in[3] = {0};
    sched_get_request(s, 1, &in[1]);
    sched_get_request(s, 2, &in[2]);
    for (int r = 1; r <= 2; r++)
        cr_assert_eq(out[r], GEN,
                     "request %d: %u of %u tokens; %u idle steps at the end; request 1 "
                     "computed %u holding %u blocks, request 2 computed %u holding %u (pool %u)",
                     r, out[r], GEN, idle, in[1].computed, in[1].blocks[SCHED_POOL_DEVICE],
                     in[2].computed, in[2].blocks[SCHED_POOL_DEVICE], DEV);
    sched_destroy(s);
    sched_policy_free(p);
}

/* Runs two long sequences through a pool that holds one window at a time plus a bit: the
 * second, of a higher class, comes when the first has given blocks back, and the first is
 * preempted for it. Returns the preemptions seen and checks each one's transfers. */
static uint32_t run_two(const char *mode, uint32_t *swap_blocks, uint32_t *table_len)
{
    const uint32_t W = 32, DEV = 5, GEN = 200;
    sched_policy *p;
    sched *s = make(mode, W, DEV, 64, false, &p);
    cr_assert_eq(submit(s, 1, 8, GEN, NULL, 0), 0, "%s", sched_last_error());
    uint64_t now = 1;
    uint32_t preempts = 0, out[3] = {0};
    *swap_blocks = *table_len = 0;
    for (int step = 0; step < 4000; step++) {
        if (step == 60)
            cr_assert_eq(submit_class(s, 2, 8, GEN, NULL, now, "hi"), 0, "%s", sched_last_error());
        const sched_plan *pl = sched_step(s, now);
        cr_assert_not_null(pl);
        sd_check(s);
        check_entries(pl, W, DEV);
        for (uint32_t i = 0; i < pl->n_preemptions; i++) {
            const sched_preemption *pe = &pl->preemptions[i];
            preempts++;
            cr_assert_leq(pe->blocks, div_up(W, BS) + 1, "a preempted window holds %u", pe->blocks);
        }
        for (uint32_t i = 0; i < pl->n_transfers; i++) {
            const sched_transfer *t = &pl->transfers[i];
            cr_assert_leq(t->n_blocks, div_up(W, BS) + 1, "a swap moves the window only");
            for (uint32_t j = 0; j < t->n_blocks; j++) {
                const uint32_t *dev = t->dir == SCHED_XFER_OUT ? t->src : t->dst;
                cr_assert(dev[j] < DEV, "transfer %llu: device block %u", (unsigned long long)t->id,
                          dev[j]);
            }
            if (t->dir == SCHED_XFER_OUT) {
                sched_req_info in;
                cr_assert_eq(sched_get_request(s, t->req, &in), 0);
                *swap_blocks = t->n_blocks;
                *table_len = t->n_blocks + in.released_blocks;
            }
        }
        for (uint32_t i = 0; i < pl->n_transfers; i++) {
            cr_assert_eq(sched_transfer_done(s, pl->transfers[i].id, now, 0, 0, 0), 0);
            sd_check(s);
        }
        sched_result res[8];
        uint32_t n = 0;
        for (uint32_t i = 0; i < pl->n_entries; i++) {
            res[n++] = (sched_result){.req = pl->entries[i].req, .tokens = pl->entries[i].samples};
            out[pl->entries[i].req] += pl->entries[i].samples;
        }
        now += 1000;
        cr_assert_eq(sched_commit(s, res, n, now, 0), 0);
        sd_check(s);
        sched_req_info in;
        if (step > 60 && sched_get_request(s, 1, &in) == -ENOENT &&
            sched_get_request(s, 2, &in) == -ENOENT)
            break;
    }
    cr_assert_eq(out[1], GEN, "request 1: %u tokens", out[1]);
    cr_assert_eq(out[2], GEN, "request 2: %u tokens", out[2]);
    sched_destroy(s);
    sched_policy_free(p);
    return preempts;
}

Test(window, swap_moves_only_the_blocks_held)
{
    uint32_t moved, table;
    uint32_t n = run_two("swap", &moved, &table);
    cr_assert_gt(n, 0, "the pool forced a preemption");
    cr_assert_gt(moved, 0, "a swap-out was planned");
    cr_assert_lt(moved, table, "the swap moved %u blocks of a table of %u", moved, table);
}

Test(window, recompute_refills_from_the_start)
{
    uint32_t moved, table;
    cr_assert_gt(run_two("recompute", &moved, &table), 0, "the pool forced a preemption");
    cr_assert_eq(moved, 0, "no swap");
}

Test(window, prefix_cache_keeps_the_prompt_chain)
{
    const uint32_t W = 32, DEV = 16;
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = 100 + i;
    sched_policy *p;
    sched *s = make("recompute", W, DEV, 0, true, &p);
    cr_assert_eq(submit(s, 1, 40, 200, toks, 0), 0, "%s", sched_last_error());
    uint64_t now = 1;
    for (int step = 0; step < 400; step++) {
        iter(s, &now, W, DEV);
        sched_req_info in;
        if (sched_get_request(s, 1, &in) == -ENOENT) break;
        /* the prompt's two full blocks stay held (cached chain), the rest is the window */
        if (in.computed > 100)
            cr_assert_leq(in.blocks[SCHED_POOL_DEVICE], 2 + div_up(W, BS) + 1, "%u held",
                          in.blocks[SCHED_POOL_DEVICE]);
    }
    sched_counts c;
    sched_get_counts(s, &c);
    cr_assert_eq(c.kv_cached[SCHED_POOL_DEVICE], 2, "the prompt's blocks stay cached: %u",
                 c.kv_cached[SCHED_POOL_DEVICE]);
    /* the same prompt again: its cached blocks are found */
    cr_assert_eq(submit(s, 2, 40, 4, toks, now), 0);
    iter(s, &now, W, DEV);
    sched_req_info in;
    cr_assert_eq(sched_get_request(s, 2, &in), 0);
    cr_assert_eq(in.cached_tokens, 32, "cached tokens %u", in.cached_tokens);
    for (int step = 0; step < 50 && sched_get_request(s, 2, &in) == 0; step++)
        iter(s, &now, W, DEV);
    sched_destroy(s);
    sched_policy_free(p);
}

/* ---- window rings (sched_config.window_rings): gemma's windowed layers ------------------ */

/* prefix: 0 no prefix cache, 1 on, 1 + n on with n ring snapshots */
static sched *make_rings_tier(const char *preemption, uint32_t rings, uint32_t dev_blocks,
                              uint32_t host_blocks, uint64_t ring_bytes, uint32_t prefix,
                              sched_policy **pol)
{
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(policy_text(preemption), pol, &err), 0, "policy: %s",
                 err.reason);
    sched_config c = {
        .kv_blocks_device = dev_blocks,
        .block_size = BS,
        .kv_bytes_per_token = 1024,
        .max_context = 8192,
        .step = {.base_us = 1000, .prefill_token_us = 10, .decode_seq_us = 10},
        .window_rings = rings,
        .kv_blocks_host = host_blocks,
        .host = {.out_bytes_per_s = 1e9, .in_bytes_per_s = 1e9, .latency_us = 10},
        .window_ring_bytes = ring_bytes,
        .prefix_cache = prefix > 0,
        .prefix_cache_generated = prefix > 0,
        .window_snapshots = prefix > 1 ? prefix - 1 : 0,
        .window_snapshot_blocks = 2, /* a window of 32 positions */
    };
    sched *s = NULL;
    cr_assert_eq(sched_create(*pol, &c, NULL, NULL, 1, &s), 0, "%s", sched_last_error());
    return s;
}

static sched *make_rings(const char *preemption, uint32_t rings, uint32_t dev_blocks,
                         sched_policy **pol)
{
    return make_rings_tier(preemption, rings, dev_blocks, 0, 0, 0, pol);
}

/* What run_rings saw of the swaps: a swap moves its device blocks and its ring, whose bytes
 * take ring_slots tier slots (make_rings_tier's ring_bytes). */
typedef struct ring_swaps {
    uint64_t ring_bytes;
    uint32_t ring_slots;
    uint32_t outs, ins;
    uint32_t last_ring[8]; /* [request]: the ring of its last entry */
} ring_swaps;

static void check_ring_swap(const sched_transfer *t, uint32_t rings, ring_swaps *sw)
{
    const uint64_t block_bytes = (uint64_t)BS * 1024;
    cr_assert_eq(t->n_ring_slots, sw->ring_slots, "transfer %llu: %u ring slots, want %u",
                 (unsigned long long)t->id, t->n_ring_slots, sw->ring_slots);
    cr_assert_lt(t->ring, rings, "transfer %llu: ring %u", (unsigned long long)t->id, t->ring);
    cr_assert_eq(t->bytes, t->n_blocks * block_bytes + sw->ring_bytes,
                 "transfer %llu: %llu bytes for %u blocks and a ring", (unsigned long long)t->id,
                 (unsigned long long)t->bytes, t->n_blocks);
    for (uint32_t j = 0; j < t->n_ring_slots; j++) {
        const uint32_t *tier = t->dir == SCHED_XFER_OUT ? t->dst : t->src;
        for (uint32_t b = 0; b < t->n_blocks; b++)
            cr_assert_neq(t->ring_slots[j], tier[b], "ring slot %u is block slot %u too", j, b);
    }
    if (t->dir == SCHED_XFER_OUT) {
        cr_assert_eq(t->ring, sw->last_ring[t->req], "request %llu swaps out ring %u, ran on %u",
                     (unsigned long long)t->req, t->ring, sw->last_ring[t->req]);
        sw->outs++;
    } else {
        sw->ins++;
        sw->last_ring[t->req] = t->ring; /* its next entries name that one */
    }
}

/* Runs the scheduler until every request ended; each plan's entries name distinct rings
 * below `rings`; returns the most sequences with entries in one plan and the preemptions;
 * completes every transfer (checked against sw when given). */
static void run_rings_swaps(sched *s, uint32_t rings, uint32_t n_req, uint32_t *most,
                            uint32_t *preempts, ring_swaps *sw)
{
    uint64_t now = 1;
    *most = *preempts = 0;
    for (int step = 0; step < 5000; step++) {
        const sched_plan *pl = sched_step(s, now);
        cr_assert_not_null(pl, "%s", sched_last_error());
        sd_check(s);
        *preempts += pl->n_preemptions;
        for (uint32_t i = 0; i < pl->n_transfers; i++) {
            if (sw) check_ring_swap(&pl->transfers[i], rings, sw);
            cr_assert_eq(sched_transfer_done(s, pl->transfers[i].id, now, 0, 0, 0), 0);
            sd_check(s);
        }
        uint32_t used = 0;
        for (uint32_t i = 0; i < pl->n_entries; i++) {
            const sched_entry *e = &pl->entries[i];
            cr_assert_lt(e->ring, rings, "request %llu at %u: ring %u of %u",
                         (unsigned long long)e->req, e->start_pos, e->ring, rings);
            cr_assert_not(used & (1u << e->ring), "ring %u in two entries of one plan", e->ring);
            used |= 1u << e->ring;
            if (sw && e->req < 8) {
                if (sw->last_ring[e->req] != UINT32_MAX && e->start_pos)
                    cr_assert_eq(
                        e->ring, sw->last_ring[e->req], "request %llu at %u: ring %u, it ran on %u",
                        (unsigned long long)e->req, e->start_pos, e->ring, sw->last_ring[e->req]);
                sw->last_ring[e->req] = e->ring;
            }
        }
        if (pl->n_entries > *most) *most = pl->n_entries;
        sched_result res[16];
        uint32_t n = 0;
        for (uint32_t i = 0; i < pl->n_entries && n < 16; i++)
            res[n++] = (sched_result){.req = pl->entries[i].req, .tokens = pl->entries[i].samples};
        now += 1000;
        cr_assert_eq(sched_commit(s, res, n, now, 0), 0);
        sd_check(s);
        uint32_t gone = 0;
        for (uint64_t id = 1; id <= n_req; id++) {
            sched_req_info in;
            gone += sched_get_request(s, id, &in) == -ENOENT;
        }
        if (gone == n_req) return;
    }
    cr_assert_fail("the requests did not all end");
}

static void run_rings(sched *s, uint32_t rings, uint32_t n_req, uint32_t *most, uint32_t *preempts)
{
    run_rings_swaps(s, rings, n_req, most, preempts, NULL);
}

/* Three sequences and two rings: the third starts when a ring comes back, never beside
 * both; every entry carries its own ring, and the invariant check holds the rings held to
 * the sequences holding blocks. */
Test(window, rings_bound_the_sequences_holding_blocks)
{
    sched_policy *p;
    sched *s = make_rings("recompute", 2, 64, &p);
    for (uint64_t id = 1; id <= 3; id++)
        cr_assert_eq(submit(s, id, 20, 40, NULL, 0), 0, "%s", sched_last_error());
    uint32_t most, preempts;
    run_rings(s, 2, 3, &most, &preempts);
    cr_assert_eq(most, 2, "two rings: two sequences at a time, seen %u", most);
    cr_assert_eq(preempts, 0);
    sched_destroy(s);
    sched_policy_free(p);
}

/* Two sequences of 88 positions (6 blocks each) in 8 blocks: one is preempted (recompute),
 * gives its ring back with its blocks, and takes one again when it starts over. */
Test(window, recompute_gives_the_ring_back)
{
    sched_policy *p;
    sched *s = make_rings("recompute", 2, 8, &p);
    cr_assert_eq(submit(s, 1, 8, 80, NULL, 0), 0, "%s", sched_last_error());
    cr_assert_eq(submit(s, 2, 8, 80, NULL, 0), 0, "%s", sched_last_error());
    uint32_t most, preempts;
    run_rings(s, 2, 2, &most, &preempts);
    cr_assert_gt(preempts, 0, "8 blocks for two sequences of 6: a preemption");
    sched_counts c;
    sched_get_counts(s, &c);
    cr_assert_eq(c.kv_free[SCHED_POOL_DEVICE], 8, "every block back");
    sched_destroy(s);
    sched_policy_free(p);
}

/* Three sequences of 88 positions (6 blocks each) on two rings in 8 blocks, a host tier and
 * a swap policy: a preempted sequence swaps out its blocks and its ring (a ring of 2.5
 * blocks' bytes: 3 host slots, and those bytes in the transfer and its cost), and comes back
 * on whichever ring is free — the swap-in names it, and its entries go on with it. Every
 * host slot is back at the end. */
Test(window, swap_moves_the_ring_with_its_blocks)
{
    sched_policy *p;
    const uint64_t ring_bytes = BS * 1024 * 5 / 2;
    sched *s = make_rings_tier("swap", 2, 8, 64, ring_bytes, 0, &p);
    for (uint64_t id = 1; id <= 3; id++)
        cr_assert_eq(submit(s, id, 8, 80, NULL, 0), 0, "%s", sched_last_error());
    ring_swaps sw = {.ring_bytes = ring_bytes, .ring_slots = 3};
    memset(sw.last_ring, 0xff, sizeof sw.last_ring);
    uint32_t most, preempts;
    run_rings_swaps(s, 2, 3, &most, &preempts, &sw);
    cr_assert_gt(preempts, 0, "8 blocks for sequences of 6: a preemption");
    cr_assert_gt(sw.outs, 0, "swapped out");
    cr_assert_eq(sw.ins, sw.outs, "each swapped in");
    sched_counts c;
    sched_get_counts(s, &c);
    cr_assert_eq(c.kv_free[SCHED_POOL_DEVICE], 8, "every block back");
    cr_assert_eq(c.kv_free[SCHED_POOL_HOST], 64, "every host slot back");
    sched_destroy(s);
    sched_policy_free(p);
}

/* A host tier with rings needs the ring's bytes: a swap could not move it otherwise. */
Test(window, rings_with_a_tier_need_the_ring_bytes)
{
    sched_policy *p;
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(policy_text("swap"), &p, &err), 0, "policy: %s", err.reason);
    sched_config c = {.kv_blocks_device = 8,
                      .kv_blocks_host = 8,
                      .block_size = BS,
                      .kv_bytes_per_token = 1024,
                      .max_context = 8192,
                      .step = {.base_us = 1000, .prefill_token_us = 10},
                      .host = {.out_bytes_per_s = 1e9, .in_bytes_per_s = 1e9},
                      .window_rings = 2};
    sched *s = NULL;
    cr_assert_eq(sched_create(p, &c, NULL, NULL, 1, &s), -EINVAL);
    cr_assert(strstr(sched_last_error(), "window_ring_bytes"), "%s", sched_last_error());
    sched_policy_free(p);
}

/* With window rings the prefix cache serves a sample's first start only: a request with a
 * cached prompt starts from position 0 (the cached prefix's ring is nowhere), and a sample
 * of it shares its prompt's blocks (the caller copies its first sample's ring). */
Test(window, rings_cache_serves_a_sample_only)
{
    sched_policy *p;
    sched *s = make_rings_tier("recompute", 4, 64, 0, 0, 1, &p);
    int32_t toks[48];
    for (int i = 0; i < 48; i++) toks[i] = 3 + i;
    uint64_t now = 1;
    sched_req_info in;
    cr_assert_eq(submit(s, 1, 40, 4, toks, now), 0, "%s", sched_last_error());
    for (int i = 0; i < 100 && sched_get_request(s, 1, &in) == 0; i++) iter(s, &now, 0, 64);
    cr_assert_eq(sched_get_request(s, 1, &in), -ENOENT, "request 1 ended");
    /* the same prompt again: its blocks are cached, but not its ring */
    cr_assert_eq(submit(s, 2, 40, 30, toks, now), 0, "%s", sched_last_error());
    for (int i = 0; i < 100 && (sched_get_request(s, 2, &in) == 0 && !in.generated); i++)
        iter(s, &now, 0, 64);
    cr_assert_eq(in.generated, 1, "request 2 sampled its first token");
    cr_assert_eq(in.cached_tokens, 0, "request 2 found %u tokens cached: no ring for them",
                 in.cached_tokens);
    /* a sample of request 2: its prompt and first token (5, as iter gives) */
    int32_t st[41];
    memcpy(st, toks, sizeof(int32_t) * 40);
    st[40] = 5;
    sched_request q = {.id = 3,
                       .tenant = -1,
                       .class_idx = -1,
                       .prompt_len = 41,
                       .max_new_tokens = 3,
                       .tokens = st,
                       .cache_salt = 7,
                       .sample = true,
                       .sample_of = 2};
    sched_reject_reason why;
    cr_assert_eq(sched_submit(s, &q, now, &why), 0, "%s", sched_last_error());
    iter(s, &now, 0, 64);
    cr_assert_eq(sched_get_request(s, 3, &in), 0);
    cr_assert_eq(in.cached_tokens, 40, "the sample shares its first sample's prompt: %u",
                 in.cached_tokens);
    sched_destroy(s);
    sched_policy_free(p);
}

/* Runs request id (prompt toks[0..len), max_new tokens) to its end; returns its first
 * entry, the ring snapshots its plans took (take[0..*n_take), at most 8) and restored
 * (rest[0..*n_rest), at most 4). */
static sched_entry run_one(sched *s, uint64_t *now, uint64_t id, const int32_t *toks, uint32_t len,
                           uint32_t max_new, sched_ring_snapshot *take, uint32_t *n_take,
                           sched_ring_snapshot *rest, uint32_t *n_rest)
{
    sched_req_info in;
    sched_entry first = {.req = 0};
    *n_take = *n_rest = 0;
    cr_assert_eq(submit(s, id, len, max_new, toks, *now), 0, "%s", sched_last_error());
    for (int i = 0; i < 200 && sched_get_request(s, id, &in) == 0; i++) {
        const sched_plan *pl = iter(s, now, 0, 64);
        const sched_entry *mine = NULL;
        for (uint32_t k = 0; k < pl->n_entries; k++)
            if (pl->entries[k].req == id) mine = &pl->entries[k];
        if (mine && !first.req) first = *mine;
        for (uint32_t k = 0; k < pl->n_ring_snapshots; k++) {
            const sched_ring_snapshot *r = &pl->ring_snapshots[k];
            cr_assert_eq(r->req, id, "only request %llu runs", (unsigned long long)id);
            cr_assert(mine && r->ring == mine->ring, "a snapshot of its entry's ring");
            if (r->restore) {
                cr_assert_eq(mine->start_pos, first.start_pos, "only its first entry restores");
                cr_assert(r->end <= mine->start_pos && r->end + 2 * BS > mine->start_pos,
                          "a restore of the window before %u: a block ending at %u",
                          mine->start_pos, r->end);
                cr_assert_lt(*n_rest, 4);
                rest[(*n_rest)++] = *r;
                continue;
            }
            cr_assert(r->end > mine->start_pos && r->end <= mine->start_pos + mine->n_tokens &&
                          r->end % BS == 0,
                      "a block its entry completes: %u", r->end);
            cr_assert_lt(*n_take, 8);
            take[(*n_take)++] = *r;
        }
    }
    cr_assert_eq(sched_get_request(s, id, &in), -ENOENT, "request %llu ended",
                 (unsigned long long)id);
    return first;
}

/* Three prompts of len tokens that share their first `shared` (3, 4, ...) and differ after
 * (prompt k: 100 (k + 1) + i at position i). */
static void three_prompts(int32_t p[3][56], int len, int shared)
{
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < len; i++) p[k][i] = i < shared ? 3 + i : 100 * (k + 1) + i;
}

/* A scheduler on 4 rings with `slots` ring snapshots (window 2 blocks), and three_prompts. */
static sched *snap_case(uint32_t slots, int32_t pr[3][56], int len, int shared, sched_policy **p)
{
    three_prompts(pr, len, shared);
    return make_rings_tier("recompute", 4, 64, 0, 0, 1 + slots, p);
}

/* With ring snapshots (sched_config.window_snapshots) each block a prompt of 40 completes
 * is copied once the entry that completed it ran: the blocks ending at 16 and 32. The same
 * prompt again finds 32 tokens cached and its first entry restores both (the window of 2
 * blocks before 32); nothing new to take. */
Test(window, rings_cache_hits_through_ring_snapshots)
{
    sched_policy *p;
    sched *s = make_rings_tier("recompute", 4, 64, 0, 0, 1 + 8, &p);
    int32_t toks[48];
    for (int i = 0; i < 48; i++) toks[i] = 3 + i;
    uint64_t now = 1;
    sched_ring_snapshot take[8], rest[4];
    uint32_t nt, nr;
    sched_entry first = run_one(s, &now, 1, toks, 40, 4, take, &nt, rest, &nr);
    cr_assert_eq(nr, 0, "nothing cached to restore");
    cr_assert_eq(nt, 2, "request 1 took its two full blocks: %u", nt);
    cr_assert(take[0].end == 16 && take[1].end == 32, "at 16 and 32: %u, %u", take[0].end,
              take[1].end);

    first = run_one(s, &now, 2, toks, 40, 4, take + 2, &nt, rest, &nr);
    cr_assert_eq(first.start_pos, 32, "request 2 starts after its 32 cached tokens: %u",
                 first.start_pos);
    cr_assert_eq(nr, 2, "and restores the window before 32 first: %u", nr);
    cr_assert(rest[0].slot == take[0].slot && rest[0].end == 16 && rest[1].slot == take[1].slot &&
                  rest[1].end == 32,
              "request 1's two blocks");
    cr_assert_eq(nt, 0, "one snapshot a block");
    sched_counts c;
    sched_get_counts(s, &c);
    cr_assert_eq(c.ring_snapshots, 2);
    cr_assert_eq(c.ring_snapshots_taken, 2);
    cr_assert_eq(c.ring_snapshot_hits, 1);
    cr_assert_eq(c.prefix_hit_tokens, 32, "a hit in the cache's figures: %llu",
                 (unsigned long long)c.prefix_hit_tokens);
    sched_destroy(s);
    sched_policy_free(p);
}

/* A prefix prompts share (a system prompt of 32 tokens, then different messages): the
 * first leaves its blocks ending at 16, 32 and 48; the second finds the shared 32 tokens
 * cached and the window before them in request 1's snapshots — the second request already
 * hits — and takes only its own block ending at 48; the third hits the same way. */
Test(window, rings_snapshot_where_prompts_share_a_prefix)
{
    sched_policy *p;
    static int32_t pr[3][56];
    sched *s = snap_case(16, pr, 56, 32, &p);
    uint64_t now = 1;
    sched_ring_snapshot take[8], take2[8], rest[4];
    uint32_t nt, nt2, nr;
    run_one(s, &now, 1, pr[0], 56, 4, take, &nt, rest, &nr);
    cr_assert(nt == 3 && take[2].end == 48, "request 1: its three blocks, the last at 48");
    sched_entry first = run_one(s, &now, 2, pr[1], 56, 4, take2, &nt2, rest, &nr);
    cr_assert_eq(first.start_pos, 32, "request 2 finds the shared 32 tokens: %u", first.start_pos);
    cr_assert(nr == 2 && rest[0].slot == take[0].slot && rest[1].slot == take[1].slot,
              "through request 1's snapshots");
    cr_assert(nt2 == 1 && take2[0].end == 48, "and takes its own block at 48");
    first = run_one(s, &now, 3, pr[2], 56, 4, take2, &nt2, rest, &nr);
    cr_assert_eq(first.start_pos, 32, "request 3 too: %u", first.start_pos);
    sched_destroy(s);
    sched_policy_free(p);
}

/* A conversation's next turn: request 1 (a prompt of 40, 30 tokens answered) computes 69
 * positions, and its answer's blocks (ending at 48 and 64) are taken as its decode steps
 * complete them; request 2 — the prompt, the answer, a new message — finds 64 tokens
 * cached, past the prompt, and restores the blocks ending at 48 and 64. */
Test(window, rings_snapshot_where_a_sequence_finished)
{
    sched_policy *p;
    sched *s = make_rings_tier("recompute", 4, 64, 0, 0, 1 + 8, &p);
    int32_t toks[80];
    for (int i = 0; i < 80; i++) toks[i] = i < 40 ? 3 + i : i < 70 ? 5 : 400 + i;
    uint64_t now = 1;
    sched_ring_snapshot take[8], take2[8], rest[4];
    uint32_t nt, nt2, nr;
    run_one(s, &now, 1, toks, 40, 30, take, &nt, rest, &nr);
    cr_assert_eq(nt, 4, "its four full blocks, two of them its answer's: %u", nt);
    cr_assert(take[2].end == 48 && take[3].end == 64, "%u, %u", take[2].end, take[3].end);
    sched_entry first = run_one(s, &now, 2, toks, 74, 4, take2, &nt2, rest, &nr);
    cr_assert_eq(first.start_pos, 64, "the next turn finds the answer's blocks too: %u",
                 first.start_pos);
    cr_assert(nr == 2 && rest[0].slot == take[2].slot && rest[1].slot == take[3].slot,
              "through the blocks ending at 48 and 64");
    sched_destroy(s);
    sched_policy_free(p);
}

/* Every slot taken, a new block replaces by segmented LRU: in 4 slots, prompt A's two
 * blocks (a hit used them: protected) outlive prompt B's (never hit), taken later, when
 * prompt C needs two slots — least recently used alone would have replaced A's. */
Test(window, rings_snapshots_a_hit_used_outlive_those_never_hit)
{
    sched_policy *p;
    static int32_t pr[3][56];
    sched *s = snap_case(4, pr, 40, 0, &p);
    const int32_t *A = pr[0], *B = pr[1], *C = pr[2];
    uint64_t now = 1;
    sched_ring_snapshot take[8], rest[4];
    uint32_t nt, nr;
    run_one(s, &now, 1, A, 40, 2, take, &nt, rest, &nr);
    cr_assert_eq(run_one(s, &now, 2, A, 40, 2, take, &nt, rest, &nr).start_pos, 32, "A hits");
    run_one(s, &now, 3, B, 40, 2, take, &nt, rest, &nr);
    cr_assert_eq(nt, 2, "B's blocks in the two free slots");
    run_one(s, &now, 4, C, 40, 2, take, &nt, rest, &nr);
    cr_assert_eq(nt, 2, "C's replace two");
    sched_counts c;
    sched_get_counts(s, &c);
    cr_assert_eq(c.ring_snapshots_dropped, 2);
    cr_assert_eq(run_one(s, &now, 5, A, 40, 2, take, &nt, rest, &nr).start_pos, 32,
                 "A's snapshots stayed");
    cr_assert_eq(run_one(s, &now, 6, B, 40, 2, take, &nt, rest, &nr).start_pos, 0,
                 "B's went: computed again");
    sched_destroy(s);
    sched_policy_free(p);
}

/* A hash of tokens [0, end) of request id's known tokens (the random test's books). */
#define RND_REQS 1024
#define RND_TOKS 256
static int32_t rnd_tok[RND_REQS][RND_TOKS];
static uint32_t rnd_len[RND_REQS];

static uint64_t rnd_hash(uint64_t id, uint32_t end)
{
    cr_assert(id < RND_REQS && end <= rnd_len[id], "request %llu: %u of %u tokens known",
              (unsigned long long)id, end, id < RND_REQS ? rnd_len[id] : 0);
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < end; i++) h = (h ^ (uint32_t)rnd_tok[id][i]) * 1099511628211ull;
    return h;
}

/* Random calls on window rings with ring snapshots and a host tier: prompts from three
 * shared prefixes and random tails, cancels, swaps, sequences finishing early. The
 * invariants hold after every call, and the plans' snapshots keep the caller's books
 * straight, as ringlmd keeps them: a slot a plan fills holds a block its entry on that
 * ring completes, and every restore reads a slot that holds the block of the same tokens
 * at the same positions, one of the window before its entry's start. */
Test(window, rings_snapshots_under_random_calls)
{
    sched_policy *p;
    sched *s = make_rings_tier("auto", 6, 48, 64, 3 * BS * 1024, 1 + 24, &p);
    uint64_t rs = 0x9e3779b97f4a7c15ull, now = 1, next_id = 1, xfer[128];
    uint32_t nx = 0, slot_end[24] = {0}, restores = 0;
    uint64_t slot_hash[24] = {0};
    static int32_t toks[160];
    static sched_result res[64];
    for (int it = 0; it < 3000; it++) {
        rs ^= rs << 13;
        rs ^= rs >> 7;
        rs ^= rs << 17;
        uint32_t op = (uint32_t)(rs % 10), r = (uint32_t)(rs >> 20);
        now += 1 + r % 2000;
        if (op < 2 && next_id < RND_REQS) {
            uint32_t base = r % 3, len = 20 + r % 120, shared = 16 + 16 * (base + 1);
            for (uint32_t k = 0; k < len; k++)
                toks[k] = k < shared ? (int32_t)(3 + base * 100 + k)
                                     : (int32_t)(3 + (r >> (k % 9)) % 400);
            memcpy(rnd_tok[next_id], toks, len * sizeof(int32_t));
            rnd_len[next_id] = len;
            sched_request q = {.id = next_id++,
                               .tenant = -1,
                               .class_idx = -1,
                               .prompt_len = len,
                               .max_new_tokens = 1 + r % 40,
                               .tokens = toks,
                               .cache_salt = 7};
            sched_reject_reason why;
            sched_submit(s, &q, now, &why);
        } else if (op == 2 && next_id > 1) {
            sched_cancel(s, 1 + r % next_id, now, SCHED_CANCEL_CLIENT);
        } else if (op == 3 && nx) {
            uint32_t k = r % nx;
            cr_assert_eq(sched_transfer_done(s, xfer[k], now, 0, 0, 0), 0);
            xfer[k] = xfer[--nx];
        } else {
            const sched_plan *pl = sched_step(s, now);
            cr_assert_not_null(pl, "%s", sched_last_error());
            for (uint32_t k = 0; k < pl->n_ring_snapshots; k++) { /* before the batch */
                const sched_ring_snapshot *t = &pl->ring_snapshots[k];
                cr_assert_lt(t->slot, 24u);
                if (!t->restore) continue;
                const sched_entry *e = NULL;
                for (uint32_t i = 0; i < pl->n_entries; i++)
                    if (pl->entries[i].req == t->req) e = &pl->entries[i];
                cr_assert(e && e->ring == t->ring && t->end <= e->start_pos &&
                              t->end + 2 * BS > e->start_pos,
                          "request %llu restores a block ending at %u, starts at %u",
                          (unsigned long long)t->req, t->end, e ? e->start_pos : 0);
                cr_assert_eq(slot_end[t->slot], t->end, "request %llu restores slot %u: %u, %u",
                             (unsigned long long)t->req, t->slot, slot_end[t->slot], t->end);
                cr_assert_eq(slot_hash[t->slot], rnd_hash(t->req, t->end),
                             "request %llu restores slot %u: another prefix's block",
                             (unsigned long long)t->req, t->slot);
                restores++;
            }
            uint32_t n = 0;
            for (uint32_t i = 0; i < pl->n_entries; i++) {
                const sched_entry *e = &pl->entries[i];
                bool finish = (rs >> (i % 50)) % 23 == 0;
                res[n++] =
                    (sched_result){.req = e->req,
                                   .tokens = e->samples,
                                   .has_token = true,
                                   .token = (int32_t)(5 + i % 3),
                                   .finished = finish ? SCHED_FINISH_STOP : SCHED_FINISH_NONE};
            }
            for (uint32_t k = 0; k < pl->n_ring_snapshots; k++) { /* after the batch */
                const sched_ring_snapshot *t = &pl->ring_snapshots[k];
                if (t->restore) continue;
                const sched_entry *e = NULL;
                for (uint32_t i = 0; i < pl->n_entries; i++)
                    if (pl->entries[i].req == t->req) e = &pl->entries[i];
                cr_assert(e && e->ring == t->ring && t->end > e->start_pos &&
                              t->end <= e->start_pos + e->n_tokens && t->end % BS == 0,
                          "snapshot at %u of request %llu: not a block its entry completes", t->end,
                          (unsigned long long)t->req);
                slot_end[t->slot] = t->end;
                slot_hash[t->slot] = rnd_hash(t->req, t->end);
            }
            for (uint32_t i = 0; i < n; i++) /* the sampled tokens join the books */
                if (res[i].tokens && res[i].req < RND_REQS && rnd_len[res[i].req] < RND_TOKS)
                    rnd_tok[res[i].req][rnd_len[res[i].req]++] = res[i].token;
            for (uint32_t i = 0; i < pl->n_transfers && nx < 128; i++)
                xfer[nx++] = pl->transfers[i].id;
            now += 500;
            cr_assert_eq(sched_commit(s, res, n, now, 0), 0);
        }
        sd_check(s);
    }
    sched_counts c;
    sched_get_counts(s, &c);
    cr_log_info("%u restores; snapshots taken %llu, hits %llu, dropped %llu", restores,
                (unsigned long long)c.ring_snapshots_taken,
                (unsigned long long)c.ring_snapshot_hits,
                (unsigned long long)c.ring_snapshots_dropped);
    cr_assert_gt(restores, 0, "some request hit through a snapshot");
    sched_destroy(s);
    sched_policy_free(p);
}
