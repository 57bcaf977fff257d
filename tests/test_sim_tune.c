/* SPDX-License-Identifier: MIT */
/* ringlm-sim --tune (sim/tune.c): the search finds a known optimum, keeps the base policy when
 * nothing it tries beats it, never picks a candidate that starves a tenant or whose accepted
 * requests miss their targets more often than --slo-min allows, however much goodput it has,
 * climbs with pairwise moves a ridge coordinate search stops on, and gives the same answer for
 * a seed whatever the thread count. */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sched/sched.h"
#include "sim/err.h"
#include "sim/engine.h"
#include "sim/gen.h"
#include "sim/report.h"
#include "sim/service.h"
#include "sim/trace.h"
#include "sim/tune.h"
#include "sim/tune_internal.h" /* tune_derive_trace: the search's copies of a trace */
#include "tests/sim_test_util.h"

static void workload(sim_trace *t, const sim_service *svc, const char *const *params, size_t n,
                     const char *tenants)
{
    sim_scenario scn;
    cr_assert_eq(sim_gen_workload(t, "poisson", params, n, svc, 1, &scn), 0, "%s", sim_err());
    if (tenants) {
        sim_transform x;
        sim_transform_defaults(&x);
        x.tenant_rule = tenants;
        cr_assert_eq(sim_trace_transform(t, &x), 0, "%s", sim_err());
    }
}

static const char *value_of(const sim_tune_result *r, const sim_tune_cand *c, const char *knob)
{
    for (size_t k = 0; k < r->n_knobs; k++)
        if (!strcmp(r->knobs[k].name, knob)) return c->idx ? r->knobs[k].values[c->idx[k]] : NULL;
    return NULL;
}

/* One search as the tests set it up: a generated poisson workload (params, optional tenant
 * rule) under the built-in service model, a base policy, and the search's defaults on 2
 * threads over spec; a test changes c->o before tune_case_search when it needs to. */
typedef struct tune_case {
    sim_service svc;
    sim_trace t;
    sched_policy *base;
    sim_tune_opts o;
    sim_tune_result r;
} tune_case;

static void tune_case_init(tune_case *c, const char *base_text,
                           const char *spec) /* c->t left to the caller */
{
    memset(c, 0, sizeof *c);
    sim_service_default(&c->svc);
    c->base = policy_text(base_text);
    sim_tune_opts_defaults(&c->o);
    c->o.spec = spec;
    c->o.run.svc = &c->svc;
    c->o.jobs = 2;
}

static void tune_case_open(tune_case *c, const char *const *params, size_t n, const char *tenants,
                           const char *base_text, const char *spec)
{
    tune_case_init(c, base_text, spec);
    workload(&c->t, &c->svc, params, n, tenants);
}

static void tune_case_search(tune_case *c)
{
    cr_assert_eq(sim_tune(&c->t, c->base, &c->o, &c->r), 0, "%s", sim_err());
}

static void tune_case_close(tune_case *c)
{
    sim_tune_result_free(&c->r);
    sched_policy_free(c->base);
    sim_trace_free(&c->t);
    sim_service_free(&c->svc);
}

/* ---- a workload where one token budget is best ------------------------------------------- */

/* Decode-bound overload: 16-token prompts, 200-token outputs, twice what the machine serves.
 * Every step holds up to token_budget decoding sequences, so a step takes about
 * base + budget × per-sequence decode time.  A larger budget serves more per step — until the
 * step outgrows the class's 14 ms TPOT target and every request misses it.  The queue-wait
 * bound refuses the excess at the door, so what is accepted meets its TTFT.  The best budget
 * is therefore the largest one whose full step stays under the target. */
static const char budget_policy[] = "[scheduler]\nmode = token_budget\ntoken_budget = "
                                    "64\nmax_active_seqs = 2048\nprefill_chunk = 256\n"
                                    "default_class = standard\n[class standard]\nttft_target = "
                                    "2s\ntpot_target = 14ms\nmax_queue_wait = 1s\n";

Test(sim_tune, finds_the_budget_the_service_model_says_is_best)
{
    const char *params[] = {"load=2", "prompt=16", "output=200", "duration=30"};
    tune_case c;
    tune_case_open(&c, params, 4, NULL, budget_policy,
                   "token_budget=32..1024;prefill_chunk=128,256;decode_reserve_tokens=0,16,32;max_"
                   "active_seqs=1024,2048");
    tune_case_search(&c);
    const sim_service *svc = &c.svc;
    const sim_tune_result *r = &c.r;
    /* the known optimum: the largest budget of the list whose full decode step fits 14 ms */
    const char *expect = NULL;
    char buf[16];
    for (unsigned b = 32; b <= 1024; b *= 2)
        if (svc->base_us + b * svc->per_decode_seq_us + 16 * svc->per_prefill_token_us < 14000) {
            snprintf(buf, sizeof buf, "%u", b);
            expect = buf;
        }
    cr_assert_str_eq(expect, "256",
                     "the workload is built so that 256 is best (model %.0f + %.0f µs/seq)",
                     svc->base_us, svc->per_decode_seq_us);
    const sim_tune_cand *best = &r->cands[r->best];
    cr_assert_str_eq(value_of(r, best, "token_budget"), expect, "chose %s", best->values);
    cr_assert(best->rung[2].done && best->rung[2].feasible);
    /* it beats every other budget that was run on the whole trace, and the base (64) */
    for (size_t i = 0; i < r->n_cands; i++) {
        const sim_tune_cand *k = &r->cands[i];
        if (i == r->best || !k->rung[2].done) continue;
        const char *b = value_of(r, k, "token_budget");
        if (b && !strcmp(b, expect)) continue;
        cr_expect_gt(best->rung[2].goodput_rps, k->rung[2].goodput_rps, "%s (%.2f) vs best (%.2f)",
                     k->values, k->rung[2].goodput_rps, best->rung[2].goodput_rps);
    }
    cr_assert_gt(best->rung[2].goodput_rps, 1.5 * r->cands[r->base].rung[2].goodput_rps);
    /* the search reports what no candidate could pass, and nothing it ran passed it */
    for (size_t l = 0; l < r->n_loads; l++) {
        cr_assert(isfinite(r->bound_rps[l]));
        for (size_t i = 0; i < r->n_cands; i++)
            if (r->cands[i].rung[2].done)
                cr_expect_leq(r->cands[i].rung[2].load[l].goodput_rps, r->bound_rps[l] + 1e-9,
                              "%s: %.3f above the bound %.3f", r->cands[i].values,
                              r->cands[i].rung[2].load[l].goodput_rps, r->bound_rps[l]);
    }
    /* not a grid: coordinate search stops when a pass moves nothing */
    cr_expect_lt(r->evaluated[0], 6 * 2 * 3 * 2 / 2, "%zu candidates screened of a grid of 72",
                 r->evaluated[0]);
    tune_case_close(&c);
}

/* The base policy already has the best budget (256) and the spec offers only worse ones: the
 * answer is the base itself, never the best of the worse. */
Test(sim_tune, keeps_the_base_when_no_candidate_beats_it)
{
    const char *params[] = {"load=2", "prompt=16", "output=200", "duration=30"};
    char text[sizeof budget_policy + 8];
    const char *at = strstr(budget_policy, "token_budget = 64\n");
    cr_assert_not_null(at);
    snprintf(text, sizeof text, "%.*stoken_budget = 256\n%s", (int)(at - budget_policy),
             budget_policy, at + strlen("token_budget = 64\n"));
    tune_case c;
    tune_case_open(&c, params, 4, NULL, text, "token_budget=32,64,1024");
    tune_case_search(&c);
    const sim_tune_result *r = &c.r;
    cr_assert_eq(r->best, r->base, "chose %s (%.2f req/s) over the base (%.2f req/s)",
                 r->cands[r->best].values, r->cands[r->best].rung[2].goodput_rps,
                 r->cands[r->base].rung[2].goodput_rps);
    cr_assert_str_eq(r->cands[r->best].hash, sched_policy_hash_hex(c.base));
    /* and it did run the others on the whole trace: they lost there, not by default */
    size_t others = 0;
    for (size_t i = 0; i < r->n_cands; i++)
        if (i != r->base && r->cands[i].rung[2].done) {
            others++;
            cr_expect_lt(r->cands[i].rung[2].goodput_rps, r->cands[r->base].rung[2].goodput_rps,
                         "%s", r->cands[i].values);
        }
    cr_expect_gt(others, 0);
    tune_case_close(&c);
}

/* ---- a ridge: two knobs that pay off only together ---------------------------------------- */

/* One sequence at a time (max_active_seqs 1), 2048-token prompts, a 75 ms TTFT target.  A
 * sequence prefills min(prefill_chunk, token_budget) tokens a step, so from 256/256 a larger
 * budget alone or a larger chunk alone changes nothing (eight steps, ~86 ms: every request
 * misses), and only both together prefill in one step (~63 ms: most meet it).  Coordinate
 * search stops at the base; the pairwise moves find the optimum. */
static const char ridge_policy[] =
    "[scheduler]\nmode = token_budget\ntoken_budget = 256\nprefill_chunk = 256\nmax_active_seqs = "
    "1\n"
    "default_class = standard\n[class standard]\nttft_target = 75ms\ntpot_target = 0us\n";

static void ridge_search(bool pairs, tune_case *c)
{
    const char *params[] = {"rate=1", "prompt=2048", "output=4", "duration=60"};
    tune_case_open(c, params, 4, NULL, ridge_policy,
                   "token_budget=256,2048;prefill_chunk=256,2048");
    c->o.pairs = pairs;
    tune_case_search(c);
}

Test(sim_tune, pairwise_moves_climb_a_ridge_single_moves_cannot)
{
    tune_case c;
    ridge_search(false, &c);
    const sim_tune_result *r = &c.r;
    cr_assert_str_eq(r->cands[r->best].hash, r->cands[r->base].hash,
                     "without pairwise moves the search cannot leave the base, chose %s",
                     r->cands[r->best].values);
    cr_assert_eq(r->cands[r->base].rung[2].goodput_rps, 0, "the base misses every TTFT target");
    cr_assert_eq(r->pair_evaluated, 0);
    tune_case_close(&c);

    ridge_search(true, &c);
    const sim_tune_cand *best = &r->cands[r->best];
    cr_assert_str_eq(value_of(r, best, "token_budget"), "2048", "chose %s", best->values);
    cr_assert_str_eq(value_of(r, best, "prefill_chunk"), "2048", "chose %s", best->values);
    cr_assert_gt(best->rung[2].goodput_rps, 0.8, "%.2f req/s at SLO", best->rung[2].goodput_rps);
    cr_assert_eq(r->pair_moves, 1, "one pairwise move, %zu taken", r->pair_moves);
    cr_assert_geq(r->pair_evaluated, 1);
    tune_case_close(&c);
}

/* ---- fairness is a constraint, not a weight ---------------------------------------------- */

/* Tenant b sends the long prompts (> 2048 tokens), a the short ones, at 1.5× capacity.  A quota
 * of one queued token refuses every request of b: a then gets the whole machine and more
 * requests meet their targets per second — and b gets nothing. */
static const char fair_policy[] = "[scheduler]\nmode = token_budget\ntoken_budget = "
                                  "2048\nmax_active_seqs = 512\nprefill_chunk = 1024\n"
                                  "default_class = standard\ndefault_tenant = a\n[class "
                                  "standard]\nttft_target = 2s\ntpot_target = 150ms\n"
                                  "[tenant a]\n[tenant b]\n";

static void fair_search(double floor, tune_case *c)
{
    const char *params[] = {"load=1.5", "prompt=64-4096", "output=32-128", "duration=30"};
    tune_case_open(c, params, 4, "prompt>2048:b,a", fair_policy,
                   "b.max_queued_tokens=0,1;a.max_queued_tokens=0,20000,50000");
    c->o.fair_floor = floor;
    tune_case_search(c);
}

Test(sim_tune, never_chooses_a_candidate_that_starves_a_tenant)
{
    tune_case c;
    fair_search(0.9, &c);
    const sim_tune_result *r = &c.r;
    const sim_tune_cand *best = &r->cands[r->best];
    cr_assert_str_eq(value_of(r, best, "b.max_queued_tokens"), "0", "chose %s", best->values);
    cr_assert(best->rung[2].feasible);
    cr_assert_geq(best->rung[2].min_fair, 0.9);
    /* the starving candidate was run and had more goodput: the constraint is what lost it */
    bool seen = false;
    for (size_t i = 0; i < r->n_cands; i++) {
        const sim_tune_cand *k = &r->cands[i];
        const char *b = value_of(r, k, "b.max_queued_tokens");
        if (!b || strcmp(b, "1") || !k->rung[0].done) continue;
        seen = true;
        cr_expect_gt(k->rung[0].goodput_rps, best->rung[0].goodput_rps, "%s", k->values);
        cr_expect(!k->rung[0].feasible);
        cr_expect_lt(k->rung[0].min_fair, 0.1, "tenant b starved: %.3f of its fair share",
                     k->rung[0].min_fair);
    }
    cr_assert(seen, "the search never tried the starving quota");
    tune_case_close(&c);

    /* control: without the floor the same search takes the starving candidate */
    fair_search(0, &c);
    cr_expect_str_eq(value_of(r, &r->cands[r->best], "b.max_queued_tokens"), "1", "chose %s",
                     r->cands[r->best].values);
    tune_case_close(&c);
}

/* ---- the accepted-SLO floor is a constraint too ------------------------------------------ */

/* At load 1.0 with 64–4096-token prompts and no queue-wait bound nothing is refused and the
 * queue's bursts make some accepted requests miss their 2 s TTFT; a 250 ms bound refuses some
 * that would have met it (less goodput) and every request it accepts meets its targets.
 * Without a floor the search keeps the unbounded queue; with --slo-min 0.99 it must not,
 * however much more goodput that has. */
static void slo_search(double slo_min, tune_case *c)
{
    const char *params[] = {"load=1.0", "prompt=64-4096", "output=32-128", "duration=30"};
    tune_case_open(
        c, params, 4, NULL,
        "[scheduler]\nmode = token_budget\ntoken_budget = 2048\nmax_active_seqs = "
        "512\nprefill_chunk = 1024\n"
        "default_class = standard\n[class standard]\nttft_target = 2s\ntpot_target = 150ms\n",
        "standard.max_queue_wait=0,100ms,250ms");
    c->o.slo_min = slo_min;
    c->o.finalists = 4; /* every value reaches the whole trace */
    tune_case_search(c);
}

static const sim_tune_cand *unbounded(const sim_tune_result *r)
{
    for (size_t i = 0; i < r->n_cands; i++) {
        const char *v = value_of(r, &r->cands[i], "standard.max_queue_wait");
        if (v && !strcmp(v, "0") && r->cands[i].rung[2].done) return &r->cands[i];
    }
    return NULL;
}

Test(sim_tune, never_chooses_a_candidate_under_the_accepted_slo_floor)
{
    tune_case c;
    const sim_tune_result *r = &c.r;
    slo_search(0, &c);
    const sim_tune_cand *free_best = &r->cands[r->best];
    const sim_tune_load *m = &free_best->rung[2].load[0];
    cr_assert_eq(m->refused, 0, "without a floor the best refuses nothing: %s", free_best->values);
    cr_assert_lt(m->accepted_slo, 0.99, "and some accepted requests miss (%.4f meet)",
                 m->accepted_slo);
    double free_goodput = free_best->rung[2].goodput_rps;
    tune_case_close(&c);

    slo_search(0.99, &c);
    const sim_tune_cand *best = &r->cands[r->best];
    cr_assert(best->rung[2].feasible, "chose %s", best->values);
    cr_assert_geq(best->rung[2].load[0].accepted_slo, 0.99, "chose %s", best->values);
    cr_assert_gt(best->rung[2].load[0].refused, 0, "the floor is met by refusing at the door: %s",
                 best->values);
    /* the unbounded queue was run on the whole trace, had more goodput, and lost on the floor */
    const sim_tune_cand *u = unbounded(r);
    cr_assert_not_null(u, "the unbounded queue never reached the whole trace");
    cr_expect_float_eq(u->rung[2].goodput_rps, free_goodput, 1e-9);
    cr_expect_gt(u->rung[2].goodput_rps, best->rung[2].goodput_rps, "%.3f vs %.3f",
                 u->rung[2].goodput_rps, best->rung[2].goodput_rps);
    cr_expect(!u->rung[2].feasible);
    tune_case_close(&c);
}

/* ---- deterministic for a seed ------------------------------------------------------------ */

static char *tune_json(int jobs)
{
    const char *params[] = {"load=1.5", "prompt=64-2048", "output=32-256", "n=2500"};
    tune_case c; /* 2500 requests: the windows are used */
    tune_case_open(&c, params, 4, "random:a:3,b:1", fair_policy,
                   "token_budget=512..4096;prefill_chunk=256,1024;standard.max_queue_wait=0,1s;*."
                   "max_queued_tokens=0,30000");
    c.o.loads[1] = 2;
    c.o.n_loads = 2;
    c.o.finalists = 3;
    c.o.run.seed = 7;
    c.o.jobs = jobs;
    tune_case_search(&c);
    cr_assert(c.r.window_s[0][1] > 0, "the screening rung runs a window of the trace");
    cr_assert_gt(c.r.evaluated[0], c.r.evaluated[2]);
    cr_assert(c.o.pairs && c.r.pair_evaluated > 0,
              "the pairwise moves are part of what must be deterministic");
    json_t *j = sim_tune_json(&c.r);
    char *s = json_dumps(j, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(j);
    tune_case_close(&c);
    return s;
}

Test(sim_tune, same_answer_for_a_seed_whatever_the_thread_count)
{
    char *a = tune_json(1), *b = tune_json(3);
    cr_assert_not_null(a);
    cr_assert_not_null(b);
    cr_assert_str_eq(a, b, "two searches of one seed differ");
    free(a);
    free(b);
}

/* ---- the command line ------------------------------------------------------------------- */

static const char *bin_dir(void)
{
    const char *b = getenv("RINGLM_BIN");
    return b ? b : "build/bin";
}

Test(sim_tune, cli_writes_the_best_policy_in_canonical_form_and_refuses_a_bad_spec)
{
    char prog[512];
    snprintf(prog, sizeof prog, "%s/ringlm-sim", bin_dir());
    if (access(prog, X_OK) != 0) cr_skip_test("%s not built (set RINGLM_BIN)", prog);
    char dir[] = "/tmp/ringlm-tune-test-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char cmd[2048], path[1024];
    snprintf(path, sizeof path, "%s/best.policy", dir);
    snprintf(cmd, sizeof cmd,
             "%s --workload poisson --param load=2 --param prompt=16 --param output=200 --param "
             "duration=10 "
             "--tune 'token_budget=64..512' --tune-out %s --plot %s/plot > %s/out.txt 2>&1",
             prog, path, dir, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s not written", path);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    sched_policy *p = policy_text(text);
    char want[64];
    snprintf(want, sizeof want, "# policy hash %s\n", sched_policy_hash_hex(p));
    cr_expect(strstr(text, want) != NULL, "the file names its hash: %s", text);
    cr_expect(strstr(text, sched_policy_canonical(p)) != NULL, "the policy is in canonical form");
    sched_policy_free(p);
    snprintf(path, sizeof path, "%s/plot/tune.dat", dir);
    cr_expect_eq(access(path, R_OK), 0, "%s", path);
    snprintf(
        cmd, sizeof cmd,
        "%s --workload poisson --param duration=5 --tune 'token_budget=abc' --tune-out %s/x.policy "
        "> %s/err.txt 2>&1",
        prog, dir, dir);
    cr_expect_neq(system(cmd), 0, "a bad value is refused");
    snprintf(path, sizeof path, "%s/err.txt", dir);
    f = fopen(path, "r");
    cr_assert_not_null(f);
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    cr_expect(strstr(text, "token_budget=abc") != NULL,
              "the error names the knob and the value: %s", text);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    (void)!system(cmd);
}

/* ---- the goodput bound (sim_tune_goodput_bound) ------------------------------------------ */

static void push_req(sim_trace *t, int cls, double at_s, uint32_t prompt, uint32_t out)
{
    sim_req r;
    memset(&r, 0, sizeof r);
    r.arrival_us = (int64_t)(at_s * 1e6);
    r.deadline_us = r.cancel_us = SIM_NO_TIME;
    r.real_first_token_us = r.real_finish_us = SIM_NO_TIME;
    r.real_cached_tokens = -1;
    r.prompt_tokens = prompt;
    r.output_tokens = r.max_tokens = out;
    r.klass = (uint16_t)cls;
    r.src_id = t->n;
    cr_assert_eq(sim_trace_push(t, &r), 0);
}

/* A machine that prefills 1,000 tokens a second (no attention term) and a 2 s TTFT target:
 * three 1,000-token prompts arriving together cannot all be prefilled within 2 s (one misses
 * whatever the policy), a 3,000-token prompt never can, a lone prompt later always can, and a
 * class without a TTFT target never misses it. */
Test(sim_tune, goodput_bound_counts_the_misses_no_policy_avoids)
{
    sim_service svc;
    sim_service_default(&svc);
    svc.per_prefill_token_us = 1000;
    svc.per_prefill_pair_us = 0;
    sched_policy *p =
        policy_text("[scheduler]\nmode = token_budget\ndefault_class = standard\n"
                    "[class standard]\nttft_target = 2s\n[class batch]\nttft_target = 0us\n");
    sim_trace t;
    sim_trace_init(&t, "bound");
    int std = sim_trace_class(&t, "standard"), batch = sim_trace_class(&t, "batch");
    for (int i = 0; i < 3; i++) push_req(&t, std, 0, 1000, 4);
    push_req(&t, std, 10, 3000, 4);
    push_req(&t, std, 20, 1500, 4);
    for (int i = 0; i < 5; i++) push_req(&t, batch, 20, 1000, 4); /* no target: cannot miss it */
    sim_tune_bound b;
    cr_assert_eq(sim_tune_goodput_bound(&t, &svc, p, 60, &b), 0, "%s", sim_err());
    cr_assert_eq(b.requests, 10);
    cr_assert_eq(b.min_misses, 2, "one of the three together and the 3,000-token prompt: %zu",
                 b.min_misses);
    cr_assert_float_eq(b.span_s, 20, 1e-9);
    cr_assert_float_eq(b.goodput_rps, 8.0 / 20, 1e-9);
    /* windows shorter than the burst still see it; a longer target lets all three meet it */
    cr_assert_eq(sim_tune_goodput_bound(&t, &svc, p, 0.5, &b), 0);
    cr_assert_eq(b.min_misses, 2);
    sched_policy_free(p);
    p = policy_text("[scheduler]\nmode = token_budget\ndefault_class = standard\n[class "
                    "standard]\nttft_target = 3s\n"
                    "[class batch]\nttft_target = 0us\n");
    cr_assert_eq(sim_tune_goodput_bound(&t, &svc, p, 60, &b), 0);
    cr_assert_eq(b.min_misses, 0, "with 3 s all three fit and so does the 3,000-token prompt: %zu",
                 b.min_misses);
    /* a model whose prefill costs nothing bounds nothing: refused, not a bound of every request */
    svc.per_prefill_token_us = 0;
    cr_assert_eq(sim_tune_goodput_bound(&t, &svc, p, 60, &b), -EINVAL);
    sched_policy_free(p);
    sim_trace_free(&t);
    sim_service_free(&svc);
}

/* The bound is one: on an overloaded, bursty workload no policy the simulator runs beats it —
 * not the tuned token budget, not FCFS — and it is not vacuous (it counts misses). */
Test(sim_tune, goodput_bound_is_above_what_policies_reach)
{
    sim_service svc;
    sim_service_default(&svc);
    const char *params[] = {"load=3", "prompt=500-6000", "output=20", "duration=20", "cv=3"};
    sim_trace t;
    workload(&t, &svc, params, 4, NULL);
    static const char *const texts[] = {
        "[scheduler]\nmode = token_budget\ntoken_budget = 4096\nprefill_chunk = "
        "2048\ndefault_class = standard\n"
        "[class standard]\nttft_target = 2s\ntpot_target = 150ms\nmax_queue_wait = 2s\n",
        "[scheduler]\nmode = token_budget\ntoken_budget = 512\nprefill_chunk = 512\ndefault_class "
        "= standard\n"
        "[class standard]\nttft_target = 2s\ntpot_target = 150ms\n",
        "[scheduler]\nmode = continuous\ndefault_class = standard\n[class standard]\nttft_target = "
        "2s\ntpot_target = 150ms\n",
    };
    sim_tune_bound b;
    sched_policy *p0 = policy_text(texts[0]);
    cr_assert_eq(sim_tune_goodput_bound(&t, &svc, p0, 60, &b), 0, "%s", sim_err());
    cr_assert_gt(b.min_misses, 0, "load 3 of 3,000-token prompts: some must miss");
    cr_assert_lt(b.goodput_rps, (double)t.n / b.span_s);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        sched_policy *p = policy_text(texts[i]);
        sim_options o;
        sim_options_defaults(&o);
        o.policy = p;
        o.policy_name = "bound";
        o.svc = &svc;
        sim_run run;
        memset(&run, 0, sizeof run);
        cr_assert_eq(sim_run_trace(&t, &o, &run), 0, "%s", sim_err());
        sim_summary s;
        memset(&s, 0, sizeof s);
        cr_assert_eq(sim_summarise(&run, NULL, -1, -1, &s), 0);
        cr_expect_gt(s.all.goodput_rps, 0, "policy %zu serves something", i);
        /* the simulator divides by its whole run (to the last finish), the bound by the arrivals' span */
        double met = s.all.goodput_rps * s.sim_s;
        cr_expect_leq(met, (double)(b.requests - b.min_misses) + 1e-6,
                      "policy %zu met %.0f of %zu, bound %zu", i, met, b.requests,
                      b.requests - b.min_misses);
        sim_summary_free(&s);
        sim_run_free(&run);
        sched_policy_free(p);
    }
    sched_policy_free(p0);
    sim_trace_free(&t);
    sim_service_free(&svc);
}

/* A recorded request log carries its prompts' block hashes (ringlmd --request-log), and the
 * search's copies of the trace (a window, a load) must carry them too: the prefix cache reads
 * them.  The shared-prefix workload has them; the search runs on it, and a candidate's copy
 * of the whole trace serves as many prefix hits as the trace itself. */
Test(sim_tune, searches_a_trace_with_block_hashes)
{
    tune_case c;
    tune_case_init(&c, budget_policy, "token_budget=64,256");
    sim_scenario scn;
    const sim_trace *t = &c.t;
    const char *par[] = {"n=60",           "rate=4",  "system_prompts=2",
                         "system_len=128", "turns=3", "one_off=0"};
    cr_assert_eq(sim_gen_workload(&c.t, "shared-prefix", par, 6, &c.svc, 7, &scn), 0, "%s",
                 sim_err());
    cr_assert_gt(t->n_hashes, 0);
    sim_trace copy;
    cr_assert_eq(tune_derive_trace(t, 0, -1, 2, 1, &copy), 0, "%s", sim_err());
    cr_assert_eq(copy.n, t->n);
    for (size_t i = 0; i < copy.n; i++) {
        cr_assert_eq(copy.reqs[i].n_hash, t->reqs[i].n_hash);
        for (uint32_t b = 0; b < copy.reqs[i].n_hash; b++)
            cr_assert_eq(copy.hashes[copy.reqs[i].hash_off + b], t->hashes[t->reqs[i].hash_off + b],
                         "request %zu block %u", i, b);
    }
    sim_trace_free(&copy);
    c.o.loads[0] = 1;
    c.o.loads[1] = 2;
    c.o.n_loads = 2;
    tune_case_search(&c);
    cr_assert(c.r.cands[c.r.best].rung[2].done);
    cr_assert_gt(c.r.cands[c.r.best].rung[2].goodput_rps, 0);
    tune_case_close(&c);
}
