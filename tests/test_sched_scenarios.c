/* SPDX-License-Identifier: MIT */
/* The five scenarios of DESIGN.md §7 against the deterministic service model of
 * sched_harness.h (step time = 1000 µs + 10 µs per token in the batch). */
#include "sched_harness.h"

static uint64_t ttft(const h_req *q)
{
    return q->first_token - q->arrival;
}

/* ---- 1. one very long prompt plus short chats ---------------------------------------------- */

static uint64_t worst_chat_ttft(const char *policy, uint64_t *long_done)
{
    sched_config c = h_default_config();
    c.max_context = 65536;
    c.kv_blocks_device = 8192;
    harness *h = h_new(policy, &c);
    h_add(h, 0, 0, 0, 30000, 10); /* 300 ms of prefill on its own */
    for (int i = 0; i < 40; i++) h_add(h, 1000 + (uint64_t)i * 10000, 0, 0, 50, 20);
    h_run(h, 30000000);
    uint64_t worst = 0;
    for (uint32_t i = 2; i <= h->n; i++) {
        cr_assert_eq(h->r[i].end_kind, SCHED_EV_FINISH);
        if (ttft(&h->r[i]) > worst) worst = ttft(&h->r[i]);
    }
    *long_done = h->r[1].first_token;
    cr_assert_eq(h->r[1].end_kind, SCHED_EV_FINISH);
    h_free(h);
    return worst;
}

Test(sched_scenarios, long_prompt_does_not_delay_short_chats)
{
    /* same class, same tenant: only the token budget and chunking protect the chats */
    uint64_t long_ttft;
    uint64_t worst =
        worst_chat_ttft("[scheduler]\ntoken_budget = 512\nprefill_chunk = 256\n", &long_ttft);
    /* one iteration's share: a chat arriving mid-step waits for that step, then runs in the
     * next, each at most a + b × budget = 6.12 ms */
    cr_assert_leq(worst, 2 * 6120, "worst chat TTFT %llu us beside a 30k-token prompt",
                  (unsigned long long)worst);
    cr_assert_lt(long_ttft, 1000000, "the long prompt itself must still progress (%llu us)",
                 (unsigned long long)long_ttft);
    /* the baseline (continuous, whole prompts) makes chats wait for the whole prefill */
    uint64_t base =
        worst_chat_ttft("[scheduler]\nmode = continuous\ntoken_budget = 512\n", &long_ttft);
    cr_assert_gt(base, 200000, "control: continuous batching should stall chats (%llu us)",
                 (unsigned long long)base);
}

/* ---- 2. two tenants with unequal arrival rates ------------------------------------------- */

static double quiet_share(const char *policy)
{
    harness *h = h_new(policy, NULL);
    int q = sched_policy_tenant_index(h->p, "quiet"), l = sched_policy_tenant_index(h->p, "loud");
    /* capacity ≈ 83k tokens/s ≈ 380 requests/s of 220 tokens; quiet offers ~0.3 of it
     * (below its 50% fair share), loud 10× that (3× capacity: backlogged) */
    uint64_t offered = 0;
    uint64_t tq = 0, tl = 0;
    while (tq < 3000000 || tl < 3000000) {
        if (tq <= tl) {
            h_add(h, tq, q, 0, 200, 20);
            if (tq < 2900000) offered += 220;
            tq += 8772;
        } else {
            h_add(h, tl, l, 0, 200, 20);
            tl += 877;
        }
    }
    h_run(h, 3000000);
    sched_group_stats st;
    sched_get_tenant_stats(h->s, q, &st);
    uint64_t served = st.served_prompt_tokens + st.served_output_tokens;
    sched_counts c;
    sched_get_counts(h->s, &c);
    cr_assert_gt(c.waiting, 500, "loud tenant must be backlogged (%u waiting)", c.waiting);
    h_free(h);
    return (double)served / (double)offered;
}

Test(sched_scenarios, quiet_tenant_keeps_its_fair_share)
{
    double share = quiet_share("[scheduler]\ntoken_budget = 512\nprefill_chunk = 256\n"
                               "[tenant quiet]\n[tenant loud]\n");
    cr_assert_geq(share, 0.9, "quiet tenant got %.2f of what it asked (below its fair share)",
                  share);
    double fcfs = quiet_share(
        "[scheduler]\nmode = continuous\ntoken_budget = 512\n[tenant quiet]\n[tenant loud]\n");
    cr_assert_lt(fcfs, 0.6, "control: FCFS lets the loud tenant crowd the quiet one out (%.2f)",
                 fcfs);
}

/* ---- 3. clients disconnect during decode ------------------------------------------------- */

Test(sched_scenarios, disconnect_reclaims_compute_and_cache_at_once)
{
    harness *h = h_new("[tenant a]\n[tenant b]\n", NULL);
    for (int i = 0; i < 40; i++) h_add(h, 0, i % 2, 0, 300, 400);
    while (h->now < 250000) h_iterate(h);
    uint32_t held[41] = {0}, sum = 0;
    for (uint64_t id = 1; id <= 40; id += 2) {
        sched_req_info in;
        cr_assert_eq(sched_get_request(h->s, id, &in), 0);
        cr_assert_eq(in.state, SCHED_REQ_RUNNING);
        cr_assert_gt(in.generated, 0, "must be decoding");
        held[id] = in.blocks[SCHED_POOL_DEVICE];
        sum += held[id];
        cr_assert_eq(sched_cancel(h->s, id, h->now, SCHED_CANCEL_DISCONNECT), 0);
    }
    sched_counts before, after;
    sched_get_counts(h->s, &before);
    const sched_plan *pl = h_iterate(h);
    sched_get_counts(h->s, &after);
    cr_assert_eq(pl->n_releases, 20);
    for (uint32_t i = 0; i < pl->n_releases; i++) {
        const sched_release *r = &pl->releases[i];
        cr_assert_eq(r->blocks[SCHED_POOL_DEVICE], held[r->req],
                     "req %llu released %u of %u blocks", (unsigned long long)r->req,
                     r->blocks[SCHED_POOL_DEVICE], held[r->req]);
        cr_assert_eq(r->why, SCHED_EV_CANCEL);
    }
    for (uint32_t i = 0; i < pl->n_entries; i++)
        cr_assert_eq(pl->entries[i].req % 2, 0, "cancelled %llu still computed",
                     (unsigned long long)pl->entries[i].req);
    cr_assert_eq(pl->n_decode, 20, "the survivors keep decoding (%u decode, %u prefill)",
                 pl->n_decode, pl->n_prefill);
    /* before the step: still held; after it: only the survivors' growth remains */
    cr_assert_leq(after.kv_used[0] + sum, before.kv_used[0] + 20);
    h_free(h);
}

/* ---- 4. arrival rate briefly exceeds service rate ----------------------------------------- */

Test(sched_scenarios, queue_returns_to_baseline_after_burst)
{
    harness *h = h_new("[scheduler]\ntoken_budget = 512\nprefill_chunk = 256\n", NULL);
    /* base 150 req/s (~40% of capacity); a 0.5 s burst at 1200 req/s (~3×) at t = 2 s */
    uint64_t t = 0;
    while (t < 8000000) {
        h_add(h, t, 0, 0, 200, 20);
        t += (t >= 2000000 && t < 2500000) ? 833 : 6667;
    }
    h_run(h, 20000000);
    uint64_t base_sum = 0, base_n = 0, burst_max = 0, after_sum = 0, after_n = 0;
    for (uint32_t i = 1; i <= h->n; i++) {
        const h_req *q = &h->r[i];
        cr_assert_eq(q->end_kind, SCHED_EV_FINISH, "request %u did not finish", i);
        if (q->arrival >= 500000 && q->arrival < 2000000) {
            base_sum += ttft(q);
            base_n++;
        }
        if (q->arrival >= 2000000 && q->arrival < 3000000 && ttft(q) > burst_max)
            burst_max = ttft(q);
        if (q->arrival >= 5000000) {
            after_sum += ttft(q);
            after_n++;
        }
    }
    double base = (double)base_sum / (double)base_n, after = (double)after_sum / (double)after_n;
    cr_assert_gt((double)burst_max, 3 * base,
                 "the burst should build a queue (max %llu, base %.0f)",
                 (unsigned long long)burst_max, base);
    cr_assert_leq(after, base * 1.25 + 1000,
                  "after the burst mean TTFT %.0f us vs baseline %.0f us", after, base);
    h_free(h);
}

/* ---- 5. sustained excess token work ------------------------------------------------------ */

Test(sched_scenarios, overload_rejects_at_admission_and_accepted_work_meets_targets)
{
    harness *h = h_new("[scheduler]\ntoken_budget = 512\nprefill_chunk = 256\n"
                       "[class chat]\nttft_target = 1s\nmax_queue_wait = 800ms\n",
                       NULL);
    /* capacity ≈ 380 req/s of 220 tokens; offer 2× for 6 s */
    uint64_t t = 0;
    while (t < 6000000) {
        h_add(h, t, 0, 0, 200, 20);
        t += 1316;
    }
    h_run(h, 30000000);
    uint32_t rejected = 0, finished = 0, timeouts = 0, reasons_ok = 0;
    uint64_t worst = 0;
    uint64_t *tt = calloc(h->n, sizeof(uint64_t));
    for (uint32_t i = 1; i <= h->n; i++) {
        const h_req *q = &h->r[i];
        if (q->submitted < 0) {
            rejected++;
            reasons_ok +=
                q->reject == SCHED_REJECT_DEADLINE || q->reject == SCHED_REJECT_QUEUE_FULL;
        } else if (q->end_kind == SCHED_EV_FINISH) {
            tt[finished++] = ttft(q);
            if (ttft(q) > worst) worst = ttft(q);
        } else if (q->end_kind == SCHED_EV_TIMEOUT)
            timeouts++;
    }
    double share = (double)rejected / (double)h->n;
    cr_assert_eq(timeouts, 0, "rejects must happen at admission, not as timeouts later");
    cr_assert_eq(rejected + finished, h->n, "nothing waits forever");
    cr_assert_eq(reasons_ok, rejected, "every reject carries a reason");
    cr_assert(share > 0.35 && share < 0.65, "rejected share %.2f should track the 50%% excess",
              share);
    uint64_t p99 = h_pct(tt, finished, 99);
    cr_assert_leq(p99, 1000000, "accepted work misses its TTFT target: p99 %llu us, worst %llu",
                  (unsigned long long)p99, (unsigned long long)worst);
    sched_group_stats st;
    sched_get_class_stats(h->s, 0, &st);
    cr_assert_geq(st.ttft_met, (uint64_t)(0.99 * finished));
    free(tt);
    h_free(h);
}

/* ---- same scenario twice: byte-identical streams ----------------------------------------- */

Test(sched_scenarios, scenario_replay_is_byte_identical)
{
    char *logs[2];
    size_t lens[2];
    for (int k = 0; k < 2; k++) {
        harness *h = h_new("[scheduler]\ntoken_budget = 512\nprefill_chunk = 256\n"
                           "[class chat]\nttft_target = 1s\nmax_queue_wait = 800ms\n",
                           NULL);
        uint64_t t = 0;
        while (t < 2000000) {
            h_add(h, t, 0, 0, 200, 20);
            t += 1316;
        }
        h_run(h, 30000000);
        logs[k] = h->log;
        lens[k] = h->log_len;
        h->log = NULL;
        h_free(h);
    }
    cr_assert_eq(lens[0], lens[1]);
    cr_assert(memcmp(logs[0], logs[1], lens[0]) == 0);
    free(logs[0]);
    free(logs[1]);
}

/* ---- 5b. sustained excess under KV pressure: preemption makes service bursty ------------- */

Test(sched_scenarios, overload_under_kv_pressure_still_refuses_at_the_door)
{
    sched_config c = h_default_config();
    c.kv_blocks_device = 400; /* ~25 sequences' worth: growth forces preemption */
    harness *h = h_new("[scheduler]\ntoken_budget = 512\nprefill_chunk = 256\n"
                       "[class chat]\nttft_target = 1s\nmax_queue_wait = 800ms\n",
                       &c);
    uint64_t t = 0;
    uint32_t x = 7;
    while (t < 8000000) {
        x = x * 1103515245u + 12345u;
        h_add(h, t, 0, 0, 100 + (x >> 16) % 200, 50 + (x >> 8) % 150);
        t += 2000;
    }
    h_run(h, 60000000);
    uint32_t rejected = 0, finished = 0, timeouts = 0;
    for (uint32_t i = 1; i <= h->n; i++) {
        const h_req *q = &h->r[i];
        if (q->submitted < 0)
            rejected++;
        else if (q->end_kind == SCHED_EV_FINISH)
            finished++;
        else if (q->end_kind == SCHED_EV_TIMEOUT)
            timeouts++;
    }
    sched_group_stats st;
    sched_get_class_stats(h->s, 0, &st);
    cr_assert_geq(h->ev_count[SCHED_EV_PREEMPT], 10, "the scenario must exercise preemption");
    cr_assert_eq(rejected + finished + timeouts, h->n, "nothing waits forever");
    cr_assert_gt(rejected, h->n / 4, "overload must be refused at admission (%u of %u)", rejected,
                 h->n);
    cr_assert_leq(timeouts * 50, finished,
                  "timeouts %u should be rare next to %u finished (headroom %.2f)", timeouts,
                  finished, st.admit_headroom);
    if (timeouts) cr_assert_lt(st.admit_headroom, 0.85, "timeouts must tighten admission");
    h_free(h);
}
