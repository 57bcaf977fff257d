/* SPDX-License-Identifier: MIT */
/* burst_gather (sched/sched.c): a burst of prompts that finds nothing running reaches the
 * scheduler one submit at a time, as its clients' requests come in. Started at its first
 * prompt, the rest of the burst waits for that whole step; with burst_gather the first step
 * waits while prompts keep coming less than burst_gather apart (at most burst_gather_max after
 * the first), so the burst is prefilled together — and a step that has running sequences to
 * decode never waits. Real sched_step / sched_commit through the harness's service (a step
 * costs a + b × tokens); the scheduler's invariants are checked after every call. */
#include <criterion/criterion.h>
#include <errno.h>

#include "tests/sched_harness.h"

#define T0 1000000ull

static harness *burst_harness(const char *gather)
{
    char pol[256];
    snprintf(pol, sizeof pol, "[scheduler]\ntoken_budget = 4096\nprefill_chunk = 2048\n%s",
             gather ? gather : "");
    sched_config c = h_default_config();
    c.step.base_us = 15000; /* a CPU's step: 15 ms + 2.3 ms a token */
    c.step.prefill_token_us = 2300;
    return h_new(pol, &c);
}

/* Steps until a plan has entries; returns it (its prefill entries are the first step's). */
static const sched_plan *first_batch(harness *h)
{
    for (int i = 0; i < 1000; i++) {
        const sched_plan *pl = h_iterate(h);
        if (pl->n_entries) return pl;
    }
    cr_assert_fail("no step planned anything in 1000 iterations");
    return NULL;
}

/* 8 prompts of 32 tokens arriving 300 us apart (what the gateway's submits of a burst of 8
 * streams look like): the first step holds n of them, at time *at (its start). */
static uint32_t burst_of_8(const char *gather, uint64_t *at)
{
    harness *h = burst_harness(gather);
    h->now = T0;
    for (int i = 0; i < 8; i++) h_add(h, T0 + 300u * (uint64_t)i, 0, 0, 32, 16);
    const sched_plan *pl = first_batch(h);
    uint32_t n = pl->n_prefill;
    *at = pl->now_us;
    cr_assert_eq(pl->n_prefill, pl->n_entries, "only prefills in the first step");
    h_run(h, T0 + 60000000);
    for (uint32_t i = 1; i <= 8; i++) cr_assert(h->r[i].ended, "request %u ends", i);
    if (gather)
        cr_assert(strstr(h->log, "\"batch\""), "the gathered head is a defer with reason batch");
    h_free(h);
    return n;
}

Test(sched_burst, a_burst_arriving_over_a_few_ms_is_prefilled_in_one_step)
{
    uint64_t at_off, at_on;
    uint32_t off = burst_of_8(NULL, &at_off);
    uint32_t on = burst_of_8("burst_gather = 2ms\n", &at_on);
    /* without: the first prompt starts alone at its arrival, the others wait for its step */
    cr_assert_eq(off, 1, "without burst_gather the first step holds the first prompt (%u)", off);
    cr_assert_eq(at_off, T0, "and starts at its arrival");
    /* with: all 8, 2 ms after the last one came (2.1 ms after the first) */
    cr_assert_eq(on, 8, "with burst_gather = 2ms the first step holds the burst (%u)", on);
    cr_assert_eq(at_on, T0 + 2100 + 2000, "it starts 2 ms after the last arrival (%llu)",
                 (unsigned long long)(at_on - T0));
}

Test(sched_burst, a_lone_prompt_waits_burst_gather_once)
{
    harness *h = burst_harness("burst_gather = 2ms\n");
    h->now = T0;
    h_add(h, T0, 0, 0, 32, 4);
    const sched_plan *pl = first_batch(h);
    cr_assert_eq(pl->now_us, T0 + 2000, "its step starts burst_gather after it came (%llu us)",
                 (unsigned long long)(pl->now_us - T0));
    /* its decode steps never wait: something is running */
    uint64_t prev_end = h->now;
    while (!h->r[1].ended) {
        pl = h_iterate(h);
        cr_assert(pl->n_entries, "a decode step is never held");
        cr_assert_eq(pl->now_us, prev_end, "the next step starts when the last one ended");
        prev_end = h->now;
    }
    h_free(h);
}

Test(sched_burst, a_steady_trickle_starts_by_burst_gather_max)
{
    /* a prompt every 1.5 ms: each comes before the 2 ms gap ends, so only the bound (8 ms,
     * 4 × burst_gather by default) starts the step */
    harness *h = burst_harness("burst_gather = 2ms\n");
    h->now = T0;
    for (int i = 0; i < 40; i++) h_add(h, T0 + 1500u * (uint64_t)i, 0, 0, 32, 4);
    const sched_plan *pl = first_batch(h);
    cr_assert_eq(pl->now_us, T0 + 8000, "the step starts burst_gather_max after the first (%llu)",
                 (unsigned long long)(pl->now_us - T0));
    cr_assert_eq(pl->n_prefill, 6, "with the 6 prompts that came by then (%u)", pl->n_prefill);
    /* later arrivals find sequences running: they join the next step without waiting */
    pl = h_iterate(h);
    cr_assert(pl->n_prefill > 0, "the prompts that came during the first step start in the next");
    h_free(h);
}

Test(sched_burst, a_prompt_arriving_while_others_decode_is_not_held)
{
    harness *h = burst_harness("burst_gather = 50ms\n");
    h->now = T0;
    h_add(h, T0, 0, 0, 32, 200);
    const sched_plan *pl = first_batch(h);
    cr_assert_eq(pl->now_us, T0 + 50000, "the first prompt waited for its burst");
    /* one decode step later a prompt arrives: the step after its submit takes it */
    h_iterate(h);
    h_add(h, h->now, 0, 0, 32, 4);
    pl = h_iterate(h);
    cr_assert_eq(pl->n_prefill, 1, "the new prompt is prefilled at once beside the decode (%u)",
                 pl->n_prefill);
    cr_assert_eq(pl->n_decode, 1, "and the running one decodes");
    h_free(h);
}

static int parse_err(const char *text, sched_policy_error *err)
{
    sched_policy *p = NULL;
    int rc = sched_policy_parse(text, &p, err);
    sched_policy_free(p);
    return rc;
}

Test(sched_burst, policy_keys_are_checked_and_in_the_canonical_text_only_when_set)
{
    sched_policy_error err;
    cr_assert_eq(parse_err("[scheduler]\nmode = static\nburst_gather = 2ms\n", &err), -EINVAL);
    cr_assert(strstr(err.reason, "token_budget"), "%s", err.reason);
    cr_assert_eq(err.line, 3);
    cr_assert_eq(parse_err("[scheduler]\nburst_gather_max = 9ms\n", &err), -EINVAL);
    cr_assert(strstr(err.reason, "without burst_gather"), "%s", err.reason);
    cr_assert_eq(parse_err("[scheduler]\nburst_gather = 2ms\nburst_gather_max = 1ms\n", &err),
                 -EINVAL);
    cr_assert(strstr(err.reason, "below burst_gather"), "%s", err.reason);
    cr_assert_eq(err.line, 3);

    sched_policy *p;
    cr_assert_eq(sched_policy_parse("[scheduler]\nburst_gather = 2ms\n", &p, &err), 0);
    cr_assert_eq(sched_policy_get(p)->burst_gather_max_us, 8000, "default max: 4 x");
    cr_assert(
        strstr(sched_policy_canonical(p), "burst_gather = 2000us\nburst_gather_max = 8000us\n"),
        "%s", sched_policy_canonical(p));
    sched_policy_free(p);
    cr_assert_eq(sched_policy_parse("[scheduler]\n", &p, &err), 0);
    cr_assert_null(strstr(sched_policy_canonical(p), "burst_gather"),
                   "a policy without the keys keeps the canonical text (and hash) it had");
    sched_policy_free(p);
}
