/* SPDX-License-Identifier: MIT */
/*
 * n samples of one prompt in the scheduler (sched_request.sample / sample_of, sched/cow.c):
 * the prompt's partial last block is shared copy-on-write.  A small driver plays the engine
 * with KV contents: each device, host and disk block holds the token id written at each of
 * its positions; transfers and the plan's copies move those contents; every entry first
 * reads its whole context through its block table (each position must hold the sequence's
 * own token there) and then writes its rows.  A sample that wrote into a block another
 * sequence still reads, or that read a block nobody filled for it, fails that comparison —
 * the books are not trusted, the contents are checked.  The scheduler's invariants are
 * checked after every call (sched_drive_util.h's check).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"
#include "tests/sched_drive_util.h"

#define BS     4
#define MAXB   512
#define MAXID  256
#define MAXPOS 128

typedef struct seq {
    bool live;
    uint32_t prompt_len, generated; /* as submitted (a sample counts its first token) */
    uint32_t src_prompt;            /* the group's prompt length: positions before it are the
                                       prompt's tokens */
    uint32_t group, max_new;
    uint32_t copies_in;            /* plan copies it got */
    uint32_t first_start, first_n; /* its first entry */
    uint64_t first_at, end_at;     /* when: its first entry's step, its end's commit */
    bool started;
} seq;

typedef struct drv {
    sched *s;
    sched_policy *p;
    uint64_t now;
    int32_t kv[SCHED_POOL__COUNT][MAXB][BS];
    int32_t prompt[8][MAXPOS];
    seq q[MAXID];
    uint32_t n_copies, n_adopted_checks;
    uint32_t forks_pending[MAXID];
    uint32_t n_forks;
    uint32_t samples_per_group[8];
    uint64_t first_of[8];
    uint64_t next_id;
} drv;
static drv D;

/* A generated token: its request and position, so two samples never write the same id. */
static int32_t gen_tok(uint64_t id, uint32_t pos)
{
    return (int32_t)(1000 + id * 131 + pos);
}

static int32_t tok_at(uint64_t id, uint32_t pos)
{
    const seq *q = &D.q[id];
    return pos < q->src_prompt ? D.prompt[q->group][pos] : gen_tok(id, pos);
}

static void init(uint32_t dev, uint32_t host, uint32_t max_active)
{
    memset(&D, 0, sizeof D);
    char pol[512];
    snprintf(pol, sizeof pol,
             "[scheduler]\ntoken_budget = 64\nprefill_chunk = 64\nmax_active_seqs = %u\n"
             "max_preemptions = 100\n",
             max_active);
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(pol, &D.p, &err), 0, "policy line %d: %s", err.line,
                 err.reason);
    sched_config c = {.kv_blocks_device = dev,
                      .kv_blocks_host = host,
                      .block_size = BS,
                      .kv_bytes_per_token = 64,
                      .max_context = MAXPOS,
                      .step.base_us = 100,
                      .step.prefill_token_us = 1,
                      .step.decode_seq_us = 1,
                      .host = {.out_bytes_per_s = 1e9, .in_bytes_per_s = 1e9, .latency_us = 1},
                      .prefix_cache = true,
                      .prefix_cache_generated = true};
    cr_assert_eq(sched_create(D.p, &c, NULL, NULL, 1, &D.s), 0, "%s", sched_last_error());
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        for (int b = 0; b < MAXB; b++)
            for (int k = 0; k < BS; k++) D.kv[p][b][k] = -1; /* nobody wrote it */
    D.next_id = 1;
}

static void fini(void)
{
    sched_destroy(D.s);
    sched_policy_free(D.p);
}

/* A first sample: group g's prompt of n tokens, n_samples in its group (forked at its first
 * token), each answering max_new tokens. Returns its id. */
static uint64_t submit_group(uint32_t g, uint32_t n, uint32_t n_samples, uint32_t max_new)
{
    for (uint32_t i = 0; i < n; i++) D.prompt[g][i] = (int32_t)(10 + g * 200 + i);
    uint64_t id = D.next_id++;
    D.q[id] = (seq){.live = true, .prompt_len = n, .src_prompt = n, .group = g, .max_new = max_new};
    D.samples_per_group[g] = n_samples;
    D.first_of[g] = id;
    sched_request r = {.id = id,
                       .tenant = 0,
                       .class_idx = 0,
                       .prompt_len = n,
                       .max_new_tokens = max_new,
                       .arrival_us = D.now,
                       .tokens = D.prompt[g],
                       .cache_salt = 5,
                       .n_samples = n_samples};
    cr_assert_eq(sched_submit(D.s, &r, D.now, NULL), 0, "%s", sched_last_error());
    sd_check(D.s);
    return id;
}

/* The others of first sample f (its first token just came), as ringlmd submits them: each
 * with the prompt and its own first token. */
static void fork_group(uint64_t f)
{
    const seq *fq = &D.q[f];
    uint32_t n = fq->src_prompt;
    for (uint32_t i = 1; i < D.samples_per_group[fq->group]; i++) {
        uint64_t id = D.next_id++;
        D.q[id] = (seq){.live = true,
                        .prompt_len = n + 1,
                        .src_prompt = n,
                        .group = fq->group,
                        .max_new = fq->max_new - 1};
        int32_t tok[MAXPOS];
        memcpy(tok, D.prompt[fq->group], sizeof(int32_t) * n);
        tok[n] = gen_tok(id, n);
        sched_request r = {.id = id,
                           .tenant = 0,
                           .class_idx = 0,
                           .prompt_len = n + 1,
                           .max_new_tokens = fq->max_new - 1,
                           .arrival_us = D.now,
                           .tokens = tok,
                           .cache_salt = 5,
                           .sample = true,
                           .sample_of = f};
        cr_assert_eq(sched_submit(D.s, &r, D.now, NULL), 0, "%s", sched_last_error());
        sd_check(D.s);
    }
}

static void move_blocks(sched_pool from, sched_pool to, const uint32_t *src, const uint32_t *dst,
                        uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        memcpy(D.kv[to][dst[i]], D.kv[from][src[i]], sizeof D.kv[0][0]);
}

/* One iteration: step; transfers (done at once, in plan order); copies; the batch read
 * then written; commit, then the forks of first samples whose first token came. Returns the
 * plan. */
static const sched_plan *iter(void)
{
    const sched_plan *pl = sched_step(D.s, D.now);
    cr_assert_not_null(pl, "%s", sched_last_error());
    sd_check(D.s);
    for (uint32_t i = 0; i < pl->n_transfers; i++) {
        const sched_transfer *t = &pl->transfers[i];
        if (t->dir == SCHED_XFER_OUT)
            move_blocks(t->cache ? t->src_pool : SCHED_POOL_DEVICE, t->tier, t->src, t->dst,
                        t->n_blocks);
        else
            move_blocks(t->tier, SCHED_POOL_DEVICE, t->src, t->dst, t->n_blocks);
        cr_assert_eq(sched_transfer_done(D.s, t->id, D.now, 0, 0, 0), 0);
        sd_check(D.s);
    }
    for (uint32_t i = 0; i < pl->n_copies; i++) {
        const sched_copy *c = &pl->copies[i];
        cr_assert_neq(c->src, c->dst);
        memcpy(D.kv[0][c->dst], D.kv[0][c->src], sizeof D.kv[0][0]);
        cr_assert_lt(c->req, (uint64_t)MAXID);
        D.q[c->req].copies_in++;
        D.n_copies++;
    }
    /* read: every entry's context, through its table */
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        const sched_entry *e = &pl->entries[i];
        seq *q = &D.q[e->req];
        if (!q->started) {
            q->started = true;
            q->first_start = e->start_pos;
            q->first_n = e->n_tokens;
            q->first_at = D.now;
        }
        for (uint32_t pos = 0; pos < e->start_pos; pos++) {
            uint32_t b = pos / BS;
            cr_assert_lt(b, e->n_blocks);
            int32_t got = D.kv[0][e->blocks[b]][pos % BS];
            cr_assert_eq(got, tok_at(e->req, pos),
                         "request %llu reads position %u in block %u: %d, its token is %d",
                         (unsigned long long)e->req, pos, e->blocks[b], got, tok_at(e->req, pos));
        }
    }
    /* write: the rows it computes */
    static sched_result res[256];
    uint32_t n = 0;
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        const sched_entry *e = &pl->entries[i];
        for (uint32_t pos = e->start_pos; pos < e->start_pos + e->n_tokens; pos++)
            D.kv[0][e->blocks[pos / BS]][pos % BS] = tok_at(e->req, pos);
        seq *q = &D.q[e->req];
        res[n] = (sched_result){.req = e->req, .tokens = e->samples};
        if (e->samples) {
            res[n].has_token = true;
            res[n].token = tok_at(e->req, q->prompt_len + q->generated);
        }
        n++;
    }
    D.now += 1000;
    cr_assert_eq(sched_commit(D.s, res, n, D.now, 0), 0);
    sd_check(D.s);
    for (uint32_t i = 0; i < n; i++) {
        seq *q = &D.q[res[i].req];
        if (!res[i].tokens) continue;
        q->generated++;
        bool first = q->generated == 1 && q->prompt_len == q->src_prompt;
        if (res[i].finished != SCHED_FINISH_NONE) {
            q->live = false;
            q->end_at = D.now;
        }
        if (first && D.samples_per_group[q->group] > 1 && D.first_of[q->group] == res[i].req)
            fork_group(res[i].req);
    }
    return pl;
}

static void run_until_idle(int max_iters)
{
    sched_counts c;
    for (int i = 0; i < max_iters; i++) {
        iter();
        sched_get_counts(D.s, &c);
        if (!c.waiting && !c.running && !c.swapped && !c.in_transit) return;
    }
    cr_assert_fail("not idle after %d iterations", max_iters);
}

static void assert_all_free(void)
{
    sched_counts c;
    sched_get_counts(D.s, &c);
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        cr_assert_eq(c.kv_used[p], 0u, "%s: %u blocks still used", sched_pool_name((sched_pool)p),
                     c.kv_used[p]);
}

/* Four samples of a 10-token prompt (2 full blocks + 2 tokens): each further sample starts
 * at the prompt's end with a copy of the first sample's third block — one row, not three —
 * and says the whole prompt was cached. */
Test(sched_samples, the_partial_block_is_copied_at_the_first_write)
{
    init(64, 0, 16);
    uint64_t f = submit_group(0, 10, 4, 6);
    run_until_idle(50);
    for (uint64_t id = f + 1; id < f + 4; id++) {
        cr_expect_eq(D.q[id].first_start, 10u, "sample %llu starts at %u", (unsigned long long)id,
                     D.q[id].first_start);
        cr_expect_eq(D.q[id].first_n, 1u, "sample %llu's first entry: %u rows",
                     (unsigned long long)id, D.q[id].first_n);
        cr_expect_eq(D.q[id].copies_in, 1u, "sample %llu: %u copies", (unsigned long long)id,
                     D.q[id].copies_in);
    }
    cr_expect_eq(D.n_copies, 3u);
    assert_all_free();
    fini();
}

/* The first sample ends (cancelled) right after the fork, before the others start: its block
 * stays for them; the first two copy it, the last takes it over (no copy). */
Test(sched_samples, the_block_outlives_its_first_sample_and_the_last_sharer_takes_it)
{
    init(64, 0, 16);
    uint64_t f = submit_group(0, 10, 4, 6);
    while (D.next_id == f + 1) iter(); /* until the fork */
    cr_assert_eq(sched_cancel(D.s, f, D.now, SCHED_CANCEL_CLIENT), 0);
    D.q[f].live = false;
    sd_check(D.s);
    run_until_idle(50);
    uint32_t copies = 0;
    for (uint64_t id = f + 1; id < f + 4; id++) {
        cr_expect_eq(D.q[id].first_start, 10u, "sample %llu starts at %u", (unsigned long long)id,
                     D.q[id].first_start);
        copies += D.q[id].copies_in;
    }
    cr_expect_eq(copies, 2u, "copies %u: the last sharer writes into the block itself", copies);
    assert_all_free();
    fini();
}

/* One sequence at a time: the samples wait while the first one decodes to its end (and
 * is released); they start one after another from the block their references kept. */
Test(sched_samples, samples_that_wait_keep_the_block)
{
    init(64, 0, 1);
    uint64_t f = submit_group(0, 13, 3, 5);
    run_until_idle(100);
    for (uint64_t id = f + 1; id < f + 3; id++)
        cr_expect_eq(D.q[id].first_start, 13u, "sample %llu starts at %u", (unsigned long long)id,
                     D.q[id].first_start);
    assert_all_free();
    fini();
}

/* A sample cancelled while it waits gives its reference back: nothing leaks. */
Test(sched_samples, a_sample_cancelled_while_waiting_gives_its_reference_back)
{
    init(64, 0, 1);
    uint64_t f = submit_group(0, 10, 3, 8);
    while (D.next_id == f + 1) iter();
    cr_assert_eq(sched_cancel(D.s, f + 1, D.now, SCHED_CANCEL_CLIENT), 0);
    D.q[f + 1].live = false;
    sd_check(D.s);
    run_until_idle(100);
    cr_expect(!D.q[f + 1].started);
    cr_expect_eq(D.q[f + 2].first_start, 10u);
    assert_all_free();
    fini();
}

/* Six groups of four on a device pool far too small: sequences are preempted — swapped to
 * the host (host_blocks > 0) or recomputed (none) — while samples hold shared blocks and
 * after; every context read is the sequence's own tokens, the invariants hold at every call,
 * every block is back at the end. */
static void pressure(uint32_t host)
{
    init(40, host, 16);
    for (uint32_t g = 0; g < 6; g++) submit_group(g, 5 + 7 * g, 4, 14);
    run_until_idle(3000);
    cr_expect_gt(D.n_copies, 0u, "no copy-on-write happened: the test tests nothing");
    for (uint64_t id = 1; id < D.next_id; id++)
        cr_expect_eq(D.q[id].generated, D.q[id].max_new, "request %llu: %u of %u tokens",
                     (unsigned long long)id, D.q[id].generated, D.q[id].max_new);
    sched_group_stats st;
    cr_assert_eq(sched_get_tenant_stats(D.s, 0, &st), 0);
    cr_expect_gt(st.preemptions_swap + st.preemptions_recompute, 0u, "no preemption");
    if (host) cr_expect_gt(st.preemptions_swap, 0u, "no swap with a host tier");
    cr_log_info("copies %u, preemptions swap %llu recompute %llu", D.n_copies,
                (unsigned long long)st.preemptions_swap,
                (unsigned long long)st.preemptions_recompute);
    assert_all_free();
    fini();
}

Test(sched_samples, swaps_keep_the_shared_blocks_right)
{
    pressure(200);
}

Test(sched_samples, recomputes_keep_the_shared_blocks_right)
{
    pressure(0);
}

/* All or nothing: a blocker of 52 + 16 tokens holds 14 to 17 of 18 blocks; a group of four
 * samples of a 10-token prompt needs 3 blocks for its first sample and 1 for each other's
 * start (its copy of the partial block): the first sample alone would fit, the group does
 * not — it waits until the blocker ends, then the others all start in the step after the
 * first token, from the blocks kept for them. */
Test(sched_samples, a_group_starts_when_its_blocks_are_free_together)
{
    init(18, 0, 16);
    uint64_t b = submit_group(1, 52, 1, 16);
    while (!D.q[b].generated) iter();
    uint64_t f = submit_group(0, 10, 4, 6);
    run_until_idle(200);
    cr_assert_gt(D.q[b].end_at, 0u);
    cr_expect_geq(D.q[f].first_at, D.q[b].end_at,
                  "the first sample started at %llu, before the blocker ended at %llu",
                  (unsigned long long)D.q[f].first_at, (unsigned long long)D.q[b].end_at);
    for (uint64_t id = f + 1; id < f + 4; id++) {
        cr_expect_eq(D.q[id].first_at, D.q[f + 1].first_at,
                     "sample %llu started at %llu, sample %llu at %llu", (unsigned long long)id,
                     (unsigned long long)D.q[id].first_at, (unsigned long long)(f + 1),
                     (unsigned long long)D.q[f + 1].first_at);
        cr_expect_eq(D.q[id].first_start, 10u);
    }
    assert_all_free();
    fini();
}
