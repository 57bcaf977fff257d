/* SPDX-License-Identifier: MIT */
/*
 * Output-blocked sequences and the KV pool: a client that stops reading blocks its sequences
 * (sched_set_output_blocked); under KV pressure they give their device blocks to work that can
 * use them — swapped out or dropped for recompute by the cost model, their tenant charged —
 * wait parked (never taken up again while still blocked), and come back with every token when
 * their client reads.
 */
#include "tests/sched_harness.h"

static int count_ev(const harness *h, const char *a, const char *b)
{
    int n = 0;
    for (const char *p = h->log; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char line[600];
        if (len >= sizeof line) len = sizeof line - 1;
        memcpy(line, p, len);
        line[len] = 0;
        if (strstr(line, a) && (!b || strstr(line, b))) n++;
        p = e ? e + 1 : NULL;
    }
    return n;
}

static bool in_plan(const sched_plan *pl, uint64_t id)
{
    for (uint32_t i = 0; i < pl->n_entries; i++)
        if (pl->entries[i].req == id) return true;
    for (uint32_t i = 0; i < pl->n_transfers; i++)
        if (pl->transfers[i].req == id && pl->transfers[i].dir == SCHED_XFER_IN) return true;
    return false;
}

#define N_READERS_BLOCKED 6

/*
 * Tenant a's six sequences (64-token prompts, 1,000 tokens to generate) fill a 96-block pool;
 * then their client stops reading. Tenant b's request (a 320-token prompt: 20 blocks) comes:
 * it must get its first token within a few steps — not after the 10 s backpressure timeout —
 * while a's sequences are preempted with reason output_backpressure, never scheduled while
 * blocked, charged to a, and after a's client reads again every one of them finishes with all
 * its tokens (none cancelled).
 */
static void blocked_give_way(bool host_tier)
{
    sched_config c = h_default_config();
    c.kv_blocks_device = 96;
    c.kv_blocks_host = host_tier ? 1024 : 0;
    harness *h = h_new("[scheduler]\ntoken_budget = 512\nprefill_chunk = 256\n"
                       "backpressure_timeout = 10s\npreemption = auto\n"
                       "[tenant a]\n[tenant b]\n",
                       &c);
    int a = sched_policy_tenant_index(h->p, "a"), b = sched_policy_tenant_index(h->p, "b");
    for (int i = 0; i < N_READERS_BLOCKED; i++) h_add(h, 0, a, 0, 64, 1000);
    /* run until a's sequences hold (nearly) the whole pool */
    sched_counts cn;
    for (;;) {
        h_iterate(h);
        sched_get_counts(h->s, &cn);
        if (cn.kv_used[SCHED_POOL_DEVICE] >= 84) break;
        cr_assert_lt(h->now, 60000000ull, "a's sequences never filled the pool: %u used",
                     cn.kv_used[SCHED_POOL_DEVICE]);
    }
    for (uint64_t id = 1; id <= N_READERS_BLOCKED; id++)
        cr_assert_eq(sched_set_output_blocked(h->s, id, true, h->now), 0);
    sched_group_stats before;
    sched_get_tenant_stats(h->s, a, &before);
    uint64_t arrival = h->now;
    uint64_t victim = h_add(h, arrival, b, 0, 320, 20);
    uint64_t blocked_until = arrival + 2000000; /* a's client reads after 2 s */
    while (h->now < blocked_until) {
        const sched_plan *pl = h_iterate(h);
        for (uint64_t id = 1; id <= N_READERS_BLOCKED; id++)
            cr_assert(!in_plan(pl, id), "request %llu was taken up while its output is blocked",
                      (unsigned long long)id);
    }
    h_req *v = &h->r[victim];
    cr_assert(v->first_token, "b's request had no first token in 2 s beside blocked sequences");
    uint64_t ttft = v->first_token - arrival;
    cr_log_info("%s: b's first token %llu us after arrival; %d preemptions for backpressure",
                host_tier ? "swap" : "recompute", (unsigned long long)ttft,
                count_ev(h, "\"preempt\"", "\"output_backpressure\""));
    /* a 320-token prefill and a few 1 ms steps: nothing like the 10 s timeout */
    cr_assert_lt(ttft, 100000, "b's first token took %llu us", (unsigned long long)ttft);
    cr_assert_geq(count_ev(h, "\"preempt\"", "\"reason\":\"output_backpressure\""), 1, "%s",
                  h->log);
    if (host_tier) cr_assert_geq(count_ev(h, "\"preempt\"", "\"mode\":\"swap\""), 1);
    sched_group_stats after;
    sched_get_tenant_stats(h->s, a, &after);
    cr_assert_gt(after.virtual_tokens, before.virtual_tokens + 64,
                 "tenant a was not charged for its preempted blocked sequences (%.0f -> %.0f)",
                 before.virtual_tokens, after.virtual_tokens);
    /* a's client reads: every blocked sequence comes back and finishes with all its tokens */
    for (uint64_t id = 1; id <= N_READERS_BLOCKED; id++)
        cr_assert_eq(sched_set_output_blocked(h->s, id, false, h->now), 0);
    h_run(h, h->now + 120000000ull);
    for (uint64_t id = 1; id <= N_READERS_BLOCKED; id++) {
        cr_assert(h->r[id].ended, "request %llu never ended", (unsigned long long)id);
        cr_assert_eq(h->r[id].end_kind, SCHED_EV_FINISH, "request %llu ended by %d",
                     (unsigned long long)id, h->r[id].end_kind);
        cr_assert_eq(h->r[id].generated, 1000, "request %llu generated %u", (unsigned long long)id,
                     h->r[id].generated);
    }
    cr_assert_eq(count_ev(h, "\"cancel\"", NULL), 0, "a blocked sequence was cancelled");
    h_free(h);
}

Test(sched_blocked, blocked_sequences_are_recomputed_for_a_newcomer)
{
    blocked_give_way(false);
}

Test(sched_blocked, blocked_sequences_are_swapped_out_for_a_newcomer)
{
    blocked_give_way(true);
}

/* Blocked sequences of a high class still give way to a low class's decodes, and a sequence
 * that reads its output is never preempted for a blocked one's sake: the running reader keeps
 * every step while the pool is short. */
Test(sched_blocked, a_reader_decodes_every_step_beside_blocked_sequences)
{
    sched_config c = h_default_config();
    c.kv_blocks_device = 64;
    c.kv_blocks_host = 0;
    harness *h = h_new("[scheduler]\ntoken_budget = 512\nprefill_chunk = 256\n"
                       "backpressure_timeout = 10s\n"
                       "[class hi]\npriority = 10\n[class lo]\npriority = 0\n",
                       &c);
    int hi = sched_policy_class_index(h->p, "hi"), lo = sched_policy_class_index(h->p, "lo");
    uint64_t reader = h_add(h, 0, 0, lo, 16, 600);
    for (int i = 0; i < 4; i++) h_add(h, 0, 0, hi, 16, 600);
    uint64_t blocked_at = 0;
    int steps_with_reader = 0, steps = 0;
    while (!h->r[reader].ended && h->now < 60000000ull) {
        sched_counts cn;
        sched_get_counts(h->s, &cn);
        if (!blocked_at && cn.kv_free[SCHED_POOL_DEVICE] < 16) {
            blocked_at = h->now;
            for (uint64_t id = 2; id <= 5; id++) sched_set_output_blocked(h->s, id, true, h->now);
        }
        const sched_plan *pl = h_iterate(h);
        if (!blocked_at) continue;
        steps++;
        steps_with_reader += in_plan(pl, reader);
    }
    cr_assert(blocked_at, "the pool never ran short");
    cr_assert(h->r[reader].ended && h->r[reader].end_kind == SCHED_EV_FINISH,
              "the reader did not finish beside blocked sequences");
    cr_log_info("reader scheduled in %d of %d steps after the others blocked", steps_with_reader,
                steps);
    cr_assert_geq(steps_with_reader + 1, steps, "the reader lost %d steps to blocked sequences",
                  steps - steps_with_reader);
    cr_assert_eq(count_ev(h, "\"preempt\"", "\"req\":1,"), 0, "the reader was preempted");
    h_free(h);
}
