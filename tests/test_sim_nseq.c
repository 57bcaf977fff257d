/* ringlm — the simulator's n samples of one prompt and the logits pipeline's cost: a group
 * computes its prompt once and its others start from the first's row, as ringlmd runs them
 * (hand-computed steps); a first sample that ends first ends its others; the generators'
 * samples= parameter; log-probabilities and processors charged per sampling row.
 * SPDX-License-Identifier: MIT */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"
#include "sim/engine.h"
#include "sim/err.h"
#include "sim/gen.h"
#include "sim/service.h"
#include "sim/stats.h"
#include "sim/trace.h"
#include "tests/sim_test_util.h"

static sched_policy *policy(void)
{
    return policy_text(
        "[scheduler]\nmode = token_budget\ntoken_budget = 512\nprefill_chunk = 256\n");
}

/* tests/sim_test_util.h's toy service, with no prefill-pair term and a sampling pipeline
 * that costs nothing. */
static void nseq_service(sim_service *s)
{
    toy_service(s);
    s->per_prefill_pair_us = 0;
    s->logprobs_row_us = 0;
    s->processors_row_us = 0;
}

/* sample_of: 1 + the first sample's index (0: a request of its own) */
static void add(sim_trace *t, uint32_t prompt, uint32_t out, uint64_t sample_of, int64_t cancel,
                bool logprobs, bool processors)
{
    sim_req r;
    memset(&r, 0, sizeof r);
    r.deadline_us = r.real_first_token_us = r.real_finish_us = SIM_NO_TIME;
    r.cancel_us = cancel;
    r.prompt_tokens = prompt;
    r.output_tokens = r.max_tokens = out;
    r.src_id = t->n;
    r.sample_of = sample_of;
    r.logprobs = logprobs;
    r.processors = processors;
    cr_assert_eq(sim_trace_push(t, &r), 0);
}

static void run(const sim_trace *t, sched_policy *p, const sim_service *svc, sim_run *out)
{
    sim_options o;
    sim_options_defaults(&o);
    o.policy = p;
    o.policy_name = "test";
    o.svc = svc;
    cr_assert_eq(sim_run_trace(t, &o, out), 0, "sim_run_trace: %s", sim_err());
}

static void init(sim_trace *t)
{
    sim_trace_init(t, "nseq");
    cr_assert_geq(sim_trace_tenant(t, "default"), 0);
    cr_assert_geq(sim_trace_class(t, "default"), 0);
}

/* Four samples of a 256-token prompt: one prefill of 256; the three others draw their first
 * tokens from its row and continue on its cached blocks (one row each, their first token's),
 * then decode beside it. */
Test(sim_nseq, four_samples_compute_the_prompt_once)
{
    sim_service svc;
    nseq_service(&svc);
    sim_trace t;
    init(&t);
    add(&t, 256, 3, 0, SIM_NO_TIME, false, false);
    for (int i = 0; i < 3; i++) add(&t, 256, 3, 1, SIM_NO_TIME, false, false);
    sched_policy *p = policy();
    sim_run r;
    run(&t, p, &svc, &r);
    /* step 1 @0:    prefill 256                       1000 + 2560       = 3560: every first token
     * step 2 @3560: 1 decode, 3 one-row chunks        1000 + 30 + 100   = 1130: second tokens @4690
     * step 3 @4690: 4 decodes                         1000 + 400        = 1400: done @6090 */
    cr_expect_eq(r.steps, 3, "steps %llu", (unsigned long long)r.steps);
    cr_expect_eq(r.prefill_tokens, 256 + 3, "prefill rows %llu",
                 (unsigned long long)r.prefill_tokens);
    for (int i = 0; i < 4; i++) {
        const sim_rec *x = &r.recs[r.final_rec[i]];
        cr_expect_eq(x->outcome, SIM_OUT_FINISHED, "sample %d", i);
        cr_expect_eq(x->generated, 3, "sample %d: %u tokens", i, x->generated);
        cr_expect_eq(x->first_token_us, 3560, "sample %d first token %lld", i,
                     (long long)x->first_token_us);
        cr_expect_eq(x->end_us, 6090, "sample %d end %lld", i, (long long)x->end_us);
        if (i) cr_expect_eq(x->cached_tokens, 256, "sample %d cached %u", i, x->cached_tokens);
    }
    sim_run_free(&r);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* A prompt with a partial last block (250 = 15 × 16 + 10): the others share its 10 tokens
 * copy-on-write, as ringlmd runs them — one row each (their first token's), not 11. */
Test(sim_nseq, a_partial_last_block_is_shared_copy_on_write)
{
    sim_service svc;
    nseq_service(&svc);
    sim_trace t;
    init(&t);
    add(&t, 250, 3, 0, SIM_NO_TIME, false, false);
    for (int i = 0; i < 3; i++) add(&t, 250, 3, 1, SIM_NO_TIME, false, false);
    sched_policy *p = policy();
    sim_run r;
    run(&t, p, &svc, &r);
    cr_expect_eq(r.prefill_tokens, 250 + 3, "prefill rows %llu",
                 (unsigned long long)r.prefill_tokens);
    for (int i = 0; i < 4; i++) {
        const sim_rec *x = &r.recs[r.final_rec[i]];
        cr_expect_eq(x->outcome, SIM_OUT_FINISHED, "sample %d", i);
        cr_expect_eq(x->generated, 3, "sample %d: %u tokens", i, x->generated);
        /* step 2 @3500: 1 decode, 3 one-row chunks: 1000 + 30 + 100 */
        cr_expect_eq(x->first_token_us, 3500, "sample %d first token %lld", i,
                     (long long)x->first_token_us);
        if (i) cr_expect_eq(x->cached_tokens, 250, "sample %d cached %u", i, x->cached_tokens);
    }
    sim_run_free(&r);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* The first sample cancelled before its first token: the others end with it, never run. */
Test(sim_nseq, the_others_end_with_a_first_sample_that_ends_first)
{
    sim_service svc;
    nseq_service(&svc);
    sim_trace t;
    init(&t);
    /* 600 prompt tokens: three prefill chunks; the cancel comes after the first */
    add(&t, 600, 3, 0, 100, false, false);
    for (int i = 0; i < 3; i++) add(&t, 600, 3, 1, SIM_NO_TIME, false, false);
    sched_policy *p = policy();
    sim_run r;
    run(&t, p, &svc, &r);
    for (int i = 0; i < 4; i++) {
        cr_assert_neq(r.final_rec[i], UINT32_MAX, "sample %d never accounted", i);
        const sim_rec *x = &r.recs[r.final_rec[i]];
        cr_expect_eq(x->outcome, SIM_OUT_CANCELLED, "sample %d outcome %d", i, x->outcome);
        cr_expect_eq(x->generated, 0, "sample %d", i);
    }
    sim_run_free(&r);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* Log-probabilities and processors are charged per sampling row (a first sample's row once
 * per sample drawn from it). */
Test(sim_nseq, the_pipeline_is_charged_per_sampling_row)
{
    sim_service svc;
    nseq_service(&svc);
    svc.logprobs_row_us = 7;
    svc.processors_row_us = 3;
    sim_trace t;
    init(&t);
    add(&t, 96, 2, 0, SIM_NO_TIME, true, true);
    add(&t, 96, 2, 1, SIM_NO_TIME, true, true);
    sched_policy *p = policy();
    sim_run r;
    run(&t, p, &svc, &r);
    /* step 1 @0:    prefill 96, 2 rows sampled    1000 + 960 + 2*10       = 1980
     * step 2 @1980: 1 decode + 1 one-row chunk    1000 + 10 + 100 + 2*10  = 1130: done @3110 */
    const sim_rec *a = &r.recs[r.final_rec[0]], *b = &r.recs[r.final_rec[1]];
    cr_expect_eq(a->first_token_us, 1980, "first token %lld", (long long)a->first_token_us);
    cr_expect_eq(a->end_us, 3110, "end %lld", (long long)a->end_us);
    cr_expect_eq(b->end_us, 3110, "end %lld", (long long)b->end_us);
    sim_run_free(&r);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* The poisson workload's samples=N makes groups: N requests a prompt, all but the first
 * naming it. */
Test(sim_nseq, the_generator_makes_groups)
{
    sim_service svc;
    nseq_service(&svc);
    sim_trace t;
    sim_scenario scn;
    const char *params[] = {"n=5", "samples=3", "rate=10", "prompt=64", "output=4"};
    cr_assert_eq(sim_gen_workload(&t, "poisson", params, 5, &svc, 1, &scn), 0, "%s", sim_err());
    cr_assert_eq(t.n, 15);
    for (size_t i = 0; i < t.n; i++) {
        uint64_t first = t.reqs[i - i % 3].src_id + 1;
        cr_expect_eq(t.reqs[i].sample_of, i % 3 ? first : 0, "request %zu", i);
    }
    sched_policy *p = policy();
    sim_run r;
    run(&t, p, &svc, &r);
    /* each group computes its prompt once: 5 × 64 prompt rows, and a first-token row for
     * each of the 10 others */
    cr_expect_eq(r.prefill_tokens, 5 * 64 + 10, "prefill rows %llu",
                 (unsigned long long)r.prefill_tokens);
    sim_run_free(&r);
    sched_policy_free(p);
    sim_trace_free(&t);
}
