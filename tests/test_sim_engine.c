/* ringlm — simulator engine over the real sched/ library: hand-computed metrics, cancellation,
 * determinism, the five scenarios' verdicts, batching modes, fidelity, the CLI.
 * SPDX-License-Identifier: MIT */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sched/sched.h"
#include "sim/engine.h"
#include "sim/err.h"
#include "sim/gen.h"
#include "sim/report.h"
#include "sim/service.h"
#include "sim/trace.h"
#include "tests/helpers.h"
#include "tests/sim_test_util.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static sched_policy *policy_file(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "sim/policies/%s.policy", name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s (tests run from the repository root)", path);
    static char buf[16384];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return policy_text(buf);
}

static void add(sim_trace *t, int64_t at, uint32_t prompt, uint32_t out, int64_t cancel)
{
    sim_req r;
    memset(&r, 0, sizeof r);
    r.deadline_us = r.real_first_token_us = r.real_finish_us = SIM_NO_TIME;
    r.cancel_us = cancel;
    r.arrival_us = at;
    r.prompt_tokens = prompt;
    r.output_tokens = r.max_tokens = out;
    r.src_id = t->n;
    cr_assert_eq(sim_trace_push(t, &r), 0);
}

static void run(const sim_trace *t, sched_policy *p, const sim_service *svc, FILE *declog,
                sim_run *out)
{
    sim_options o;
    sim_options_defaults(&o);
    o.policy = p;
    o.policy_name = "test";
    o.svc = svc;
    o.decision_log = declog;
    int rc = sim_run_trace(t, &o, out);
    cr_assert_eq(rc, 0, "sim_run_trace: %s", sim_err());
}

/* ---- hand-computed ------------------------------------------------------------------------------ */

Test(sim_engine, tiny_trace_equals_hand_computation)
{
    sim_service svc;
    toy_service(&svc);
    sim_trace t;
    sim_trace_init(&t, "tiny");
    cr_assert_geq(sim_trace_tenant(&t, "default"), 0);
    cr_assert_geq(sim_trace_class(&t, "default"), 0);
    add(&t, 0, 100, 3, SIM_NO_TIME);  /* A */
    add(&t, 500, 50, 2, SIM_NO_TIME); /* B arrives while A's prefill step runs */
    sched_policy *p =
        policy_text("[scheduler]\nmode = token_budget\ntoken_budget = 512\nprefill_chunk = 256\n");
    sim_run r;
    run(&t, p, &svc, NULL, &r);
    /* step 1 @0:     A prefill 100           1000 + 10*100        = 2000 → A token 1 @2000
     * step 2 @2000:  A decode, B prefill 50  1000 + 10*50 + 100*1 = 1600 → A t2, B t1 @3600
     * step 3 @3600:  A decode, B decode      1000 + 100*2         = 1200 → A t3, B t2 @4800, both done */
    const sim_rec *a = &r.recs[r.final_rec[0]], *b = &r.recs[r.final_rec[1]];
    cr_expect_eq(r.steps, 3, "steps %llu", (unsigned long long)r.steps);
    cr_expect_eq(a->first_token_us, 2000, "A first token %lld", (long long)a->first_token_us);
    cr_expect_eq(a->end_us, 4800, "A end %lld", (long long)a->end_us);
    cr_expect_eq(b->first_sched_us, 2000, "B first scheduled %lld", (long long)b->first_sched_us);
    cr_expect_eq(b->first_token_us, 3600, "B first token %lld", (long long)b->first_token_us);
    cr_expect_eq(b->end_us, 4800, "B end %lld", (long long)b->end_us);
    sim_summary s;
    cr_assert_eq(sim_summarise(&r, NULL, -1, -1, &s), 0);
    cr_expect_eq(s.all.finished, 2);
    /* queue wait: A 0, B 1.5 ms; TTFT: A 2.0, B 3.1; E2E: A 4.8, B 4.3; TPOT: A 1.4, B 1.2 */
    cr_expect_float_eq(s.all.wait.max, 1.5, 1e-9, "wait max %f", s.all.wait.max);
    cr_expect_float_eq(s.all.wait.p50, 0.75, 1e-9, "wait p50 %f", s.all.wait.p50);
    cr_expect_float_eq(s.all.ttft.p50, 2.55, 1e-9, "ttft p50 %f", s.all.ttft.p50);
    cr_expect_float_eq(s.all.ttft.max, 3.1, 1e-9);
    cr_expect_float_eq(s.all.e2e.p50, 4.55, 1e-9, "e2e p50 %f", s.all.e2e.p50);
    cr_expect_float_eq(s.all.tpot.p50, 1.3, 1e-9, "tpot p50 %f", s.all.tpot.p50);
    cr_expect_float_eq(s.all.tpot.max, 1.4, 1e-9);
    cr_expect_float_eq(s.all.longest_starvation_ms, 1.5, 1e-9, "B waited 1.5 ms without progress");
    cr_expect_eq(s.all.served_prefill, 150);
    cr_expect_eq(s.all.served_output, 5);
    cr_expect_float_eq(s.sim_s, 0.0048, 1e-12);
    cr_expect_float_eq(s.tokens_per_s, 155 / 0.0048, 1e-6);
    cr_expect_float_eq(s.jain, 1, 1e-12);
    cr_expect_float_eq(s.all.slo_attainment, 1, 1e-12);
    sim_summary_free(&s);
    sim_run_free(&r);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* The serving loop's measured share (calibrate --daemon-log) is charged on every step: a
 * constant plus a term in the decode rows' context (none on a prefill-only step). */
Test(sim_engine, serving_loop_terms_are_charged_per_step)
{
    sim_service svc;
    toy_service(&svc);
    svc.loop_step_us = 50;
    svc.loop_context_us = 1;
    sim_trace t;
    sim_trace_init(&t, "loop");
    cr_assert_geq(sim_trace_tenant(&t, "default"), 0);
    cr_assert_geq(sim_trace_class(&t, "default"), 0);
    add(&t, 0, 100, 3, SIM_NO_TIME);
    sched_policy *p =
        policy_text("[scheduler]\nmode = token_budget\ntoken_budget = 512\nprefill_chunk = 256\n");
    sim_run r;
    run(&t, p, &svc, NULL, &r);
    /* step 1 @0:    prefill 100       1000 + 10*100 + 50             = 2050 → token 1 @2050
     * step 2 @2050: decode at ctx 101 1000 + 100 + 50 + 101          = 1251 → token 2 @3301
     * step 3 @3301: decode at ctx 102 1000 + 100 + 50 + 102          = 1252 → token 3 @4553 */
    const sim_rec *a = &r.recs[r.final_rec[0]];
    cr_expect_eq(r.steps, 3, "steps %llu", (unsigned long long)r.steps);
    cr_expect_eq(a->first_token_us, 2050, "first token %lld", (long long)a->first_token_us);
    cr_expect_eq(a->end_us, 4553, "end %lld", (long long)a->end_us);
    sim_run_free(&r);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* ---- cancellation ---------------------------------------------------------------------------- */

Test(sim_engine, cancel_releases_blocks_at_its_time)
{
    sim_service svc;
    toy_service(&svc);
    sim_trace t;
    sim_trace_init(&t, "cancel");
    sim_trace_tenant(&t, "default");
    sim_trace_class(&t, "default");
    add(&t, 0, 100, 1000, 50000);
    add(&t, 0, 100, 20, SIM_NO_TIME);
    sched_policy *p = policy_text("[scheduler]\nmode = token_budget\n");
    char *logbuf = NULL;
    size_t loglen = 0;
    FILE *log = open_memstream(&logbuf, &loglen);
    sim_run r;
    run(&t, p, &svc, log, &r);
    fclose(log);
    const sim_rec *x = &r.recs[r.final_rec[0]];
    cr_assert_eq(x->outcome, SIM_OUT_CANCELLED, "outcome %d", x->outcome);
    /* the cancel reaches the scheduler at the first iteration boundary at or after 50 ms, and
     * the blocks are released in that same iteration */
    cr_expect_geq(x->cancel_us, 50000);
    cr_expect_eq(x->release_us, x->cancel_us, "released at %lld, cancel at %lld",
                 (long long)x->release_us, (long long)x->cancel_us);
    cr_expect_lt(x->cancel_us - 50000, 2000, "cancel delivered %lld µs late (more than one step)",
                 (long long)(x->cancel_us - 50000));
    cr_expect_eq(x->tokens_after_cancel, 0);
    cr_expect_eq(r.final_counts.kv_used[SCHED_POOL_DEVICE], 0, "device blocks still used %u",
                 r.final_counts.kv_used[0]);
    /* the decision log says the same, at the same time */
    char want_cancel[128], want_release[128];
    snprintf(want_cancel, sizeof want_cancel, "{\"t_us\":%lld,\"ev\":\"cancel\",\"req\":1",
             (long long)x->cancel_us);
    snprintf(want_release, sizeof want_release, "{\"t_us\":%lld,\"ev\":\"release\",\"req\":1",
             (long long)x->cancel_us);
    cr_expect(strstr(logbuf, want_cancel) != NULL, "no %s in the decision log", want_cancel);
    cr_expect(strstr(logbuf, want_release) != NULL, "no %s in the decision log", want_release);
    /* and no step after the cancel scheduled it */
    free(logbuf);
    sim_run_free(&r);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* ---- determinism ----------------------------------------------------------------------------- */

static char *run_to_strings(const char *workload, const char *pol, char **declog)
{
    sim_service svc;
    sim_service_default(&svc);
    sim_trace t;
    sim_scenario scn;
    cr_assert_eq(sim_gen_workload(&t, workload, NULL, 0, &svc, 7, &scn), 0, "%s", sim_err());
    sched_policy *p = policy_file(pol);
    size_t len = 0;
    FILE *log = open_memstream(declog, &len);
    sim_run r;
    run(&t, p, &svc, log, &r);
    fclose(log);
    sim_summary s;
    cr_assert_eq(sim_summarise(&r, &scn, -1, -1, &s), 0);
    json_t *j = sim_report_json(&r, &s, &svc);
    json_object_del(j, "wall_s"); /* the only fields that depend on the machine */
    json_object_del(j, "speedup");
    char *out = json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(j);
    sim_summary_free(&s);
    sim_run_free(&r);
    sched_policy_free(p);
    sim_trace_free(&t);
    return out;
}

Test(sim_engine, same_inputs_byte_identical_outputs)
{
    char *log1, *log2;
    char *j1 = run_to_strings("burst", "token-budget", &log1);
    char *j2 = run_to_strings("burst", "token-budget", &log2);
    cr_expect_gt(strlen(log1), 1000, "decision log too small: %zu bytes", strlen(log1));
    cr_expect_str_eq(log1, log2, "decision logs differ");
    cr_expect_str_eq(j1, j2, "JSON reports differ");
    cr_expect(strstr(j1, "\"policy_hash\"") && strstr(j1, "\"tenants\"") &&
              strstr(j1, "\"sim_s\""));
    free(log1);
    free(log2);
    free(j1);
    free(j2);
}

/* ---- the five scenarios ------------------------------------------------------------------------ */

typedef struct scen_out {
    int verdict;
    char text[600];
    sim_summary s;
    sim_run r;
    sim_trace t;
    sched_policy *p;
} scen_out;

static void scenario(const char *workload, const char *pol, const char *const *params, size_t np,
                     scen_out *o)
{
    sim_service svc;
    sim_service_default(&svc);
    sim_scenario scn;
    cr_assert_eq(sim_gen_workload(&o->t, workload, params, np, &svc, 1, &scn), 0, "%s", sim_err());
    o->p = policy_file(pol);
    run(&o->t, o->p, &svc, NULL, &o->r);
    cr_assert_eq(sim_summarise(&o->r, &scn, -1, -1, &o->s), 0);
    o->verdict = o->s.verdict;
    snprintf(o->text, sizeof o->text, "%s", o->s.verdict_text);
}

static void scen_free(scen_out *o)
{
    sim_summary_free(&o->s);
    sim_run_free(&o->r);
    sched_policy_free(o->p);
    sim_trace_free(&o->t);
}

Test(sim_scenarios, token_budget_passes_all_five)
{
    const char *names[] = {"long-prompt", "two-tenants", "disconnects", "burst", "overload"};
    for (size_t i = 0; i < 5; i++) {
        scen_out o;
        scenario(names[i], "token-budget", NULL, 0, &o);
        cr_expect_eq(o.verdict, 1, "%s with token-budget: %s", names[i], o.text);
        scen_free(&o);
    }
}

Test(sim_scenarios, fcfs_huge_prefill_blocks_every_decoder)
{
    scen_out o, tb;
    scenario("long-prompt", "fcfs", NULL, 0, &o);
    scenario("long-prompt", "token-budget", NULL, 0, &tb);
    cr_expect_eq(o.verdict, 0, "fcfs should fail long-prompt: %s", o.text);
    /* the 16k-token prefill runs as one step: every running decoder waits for all of it */
    cr_expect_gt(o.s.max_step_ms, 400, "longest fcfs step %.1f ms", o.s.max_step_ms);
    cr_expect_gt(o.s.all.itl_max.max, 400, "longest inter-token gap under fcfs %.1f ms",
                 o.s.all.itl_max.max);
    /* token-budget slices it: no gap is longer than one step of token_budget tokens (the
     * model's time for a full budget of its costlier token kind, plus context reads) */
    sim_service svc;
    sim_service_default(&svc);
    double budget = sched_policy_get(tb.p)->token_budget;
    double full_step_ms =
        (svc.base_us + budget * fmax(svc.per_prefill_token_us, svc.per_decode_seq_us)) / 1000 *
        1.05;
    cr_expect_lt(tb.s.all.itl_max.max, full_step_ms,
                 "token-budget longest inter-token gap %.1f ms, one full step %.1f ms",
                 tb.s.all.itl_max.max, full_step_ms);
    cr_expect_lt(tb.s.all.itl_max.max, o.s.all.itl_max.max / 4,
                 "token-budget gap %.1f ms vs fcfs %.1f ms", tb.s.all.itl_max.max,
                 o.s.all.itl_max.max);
    scen_free(&o);
    scen_free(&tb);
}

Test(sim_scenarios, fcfs_overload_queue_grows_without_bound)
{
    scen_out o;
    scenario("overload", "fcfs", NULL, 0, &o);
    cr_expect_eq(o.verdict, 0, "fcfs should fail overload: %s", o.text);
    cr_expect_eq(o.s.all.rejected, 0, "fcfs has no admission control");
    scen_free(&o);
}

Test(sim_scenarios, strict_priority_without_aging_starves_low_class)
{
    const char *params[] = {"load=1.3", "duration=60", "classes=interactive:3,batch:1"};
    scen_out sp, tb;
    scenario("poisson", "strict-priority", params, 3, &sp);
    scenario("poisson", "token-budget", params, 3, &tb);
    const sim_group *b_sp = NULL, *b_tb = NULL;
    for (size_t i = 0; i < sp.s.n_classes; i++)
        if (!strcmp(sp.s.classes[i].name, "batch")) b_sp = &sp.s.classes[i];
    for (size_t i = 0; i < tb.s.n_classes; i++)
        if (!strcmp(tb.s.classes[i].name, "batch")) b_tb = &tb.s.classes[i];
    cr_assert(b_sp && b_tb);
    /* without aging the batch class waits for the interactive backlog to clear */
    cr_expect_gt(b_sp->longest_starvation_ms, 20000, "strict priority: batch starved only %.0f ms",
                 b_sp->longest_starvation_ms);
    cr_expect_lt(b_tb->longest_starvation_ms, 10000, "token-budget (aging): batch starved %.0f ms",
                 b_tb->longest_starvation_ms);
    cr_expect_gt(b_sp->wait.p50, 3 * b_tb->wait.p50,
                 "batch median wait: strict %.0f ms vs aging %.0f ms", b_sp->wait.p50,
                 b_tb->wait.p50);
    scen_free(&sp);
    scen_free(&tb);
}

Test(sim_scenarios, static_batching_wastes_slots_on_padding_and_tails)
{
    const char *params[] = {"load=0.5", "duration=30", "prompt=32-2048", "output=8-512"};
    scen_out st, tb;
    scenario("poisson", "static", params, 4, &st);
    scenario("poisson", "token-budget", params, 4, &tb);
    /* padding: every prompt of a group is computed at the longest prompt's length */
    cr_expect_gt(st.s.pad_share, 0.2, "static padding share %.3f", st.s.pad_share);
    cr_expect_eq(tb.s.pad_share, 0, "token-budget pads nothing");
    /* tails: the group holds its slots until the slowest member ends, so fewer sequences
     * produce tokens per step than the group holds */
    cr_expect_lt(st.s.occupancy, 0.9, "static slot occupancy %.2f", st.s.occupancy);
    cr_expect_gt(st.s.all.e2e.p50, 3 * tb.s.all.e2e.p50,
                 "E2E p50 static %.0f ms vs token-budget %.0f ms", st.s.all.e2e.p50,
                 tb.s.all.e2e.p50);
    scen_free(&st);
    scen_free(&tb);
}

Test(sim_scenarios, four_batching_modes_on_one_trace)
{
    const char *pols[] = {"static", "dynamic", "fcfs", "token-budget"};
    const char *modes[] = {"static", "dynamic", "continuous", "token_budget"};
    const char *params[] = {"load=0.5", "duration=20"};
    for (int i = 0; i < 4; i++) {
        scen_out o;
        scenario("poisson", pols[i], params, 2, &o);
        cr_expect_str_eq(o.r.mode, modes[i]);
        cr_expect_eq(o.s.all.finished + o.s.all.rejected + o.s.all.timeouts, o.s.all.requests,
                     "%s: every request ends", pols[i]);
        scen_free(&o);
    }
}

Test(sim_scenarios, retries_amplify_load_after_a_burst)
{
    sim_service svc;
    sim_service_default(&svc);
    sim_trace t;
    sim_scenario scn;
    const char *params[] = {"burst_load=4"};
    cr_assert_eq(sim_gen_workload(&t, "burst", params, 1, &svc, 1, &scn), 0, "%s", sim_err());
    /* requests in a class that refuses what cannot start within 700 ms */
    cr_assert_eq(sim_trace_assign(&t, 1, "rr:interactive", 1), 0);
    sched_policy *p = policy_file("token-budget");
    sim_options o;
    sim_options_defaults(&o);
    o.policy = p;
    o.svc = &svc;
    sim_run a, b;
    cr_assert_eq(sim_run_trace(&t, &o, &a), 0, "%s", sim_err());
    o.retry = SIM_RETRY_IMMEDIATE;
    cr_assert_eq(sim_run_trace(&t, &o, &b), 0, "%s", sim_err());
    sim_summary sa, sb;
    sim_summarise(&a, &scn, -1, -1, &sa);
    sim_summarise(&b, &scn, -1, -1, &sb);
    cr_expect_gt(sa.all.rejected + sa.all.timeouts, 0, "the burst must overflow: %s",
                 sa.verdict_text);
    cr_expect_gt(sb.retry_amplification, 1.05, "amplification %.3f", sb.retry_amplification);
    cr_expect_gt(sb.all.attempts, sa.all.attempts);
    sim_summary_free(&sa);
    sim_summary_free(&sb);
    sim_run_free(&a);
    sim_run_free(&b);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* ---- preemption under a small KV pool: swap over a modelled link, or recompute ------------ */

Test(sim_engine, small_kv_pool_preempts_by_mode_and_completes_transfers)
{
    const char *cal =
        "{\"version\":1,\"kv_block_size\":16,\"kv_blocks_device\":600,\"kv_blocks_host\":4000,"
        "\"kv_bytes_per_token\":131072,\"step_model\":{\"base_us\":3350,\"per_prefill_token_us\":"
        "29,"
        "\"per_decode_seq_us\":30,\"per_context_token_us\":0.027},\"transfer\":{\"host\":"
        "{\"out_bytes_per_s\":5e10,\"in_bytes_per_s\":5e10,\"latency_us\":10}}}";
    sim_service svc;
    cr_assert_eq(sim_service_parse(&svc, "small.json", cal, SIM_FIT_AUTO), 0, "%s", sim_err());
    sim_trace t;
    sim_scenario scn;
    const char *params[] = {"load=1.0", "duration=30", "output=200-800"};
    cr_assert_eq(sim_gen_workload(&t, "poisson", params, 3, &svc, 1, &scn), 0, "%s", sim_err());
    const char *pols[] = {"token-budget", "fcfs"};
    for (int i = 0; i < 2; i++) {
        sched_policy *p = policy_file(pols[i]);
        sim_run r;
        sim_options o;
        sim_options_defaults(&o);
        o.policy = p;
        o.svc = &svc;
        o.check_every = 1; /* the scheduler's own invariants after every step */
        cr_assert_eq(sim_run_trace(&t, &o, &r), 0, "%s: %s", pols[i], sim_err());
        cr_expect_eq(r.invariant_checks, r.steps);
        sim_summary s;
        sim_summarise(&r, NULL, -1, -1, &s);
        cr_expect_gt(s.all.preempt_swap + s.all.preempt_recompute, 0,
                     "%s: no preemption with 600 blocks", pols[i]);
        cr_expect_eq(r.transfers_out, r.transfers_in, "%s: %llu swap-outs, %llu swap-ins", pols[i],
                     (unsigned long long)r.transfers_out, (unsigned long long)r.transfers_in);
        cr_expect_eq(s.all.preempt_swap, r.transfers_out, "%s: one swap-out per swap preemption",
                     pols[i]);
        cr_expect_eq(s.all.finished, t.n, "%s: %zu of %zu finished", pols[i], s.all.finished, t.n);
        cr_expect_eq(
            r.final_counts.kv_used[SCHED_POOL_DEVICE] + r.final_counts.kv_used[SCHED_POOL_HOST], 0);
        if (i == 1)
            cr_expect_eq(s.all.preempt_swap, 0, "continuous (fcfs) preempts by recompute only");
        sim_summary_free(&s);
        sim_run_free(&r);
        sched_policy_free(p);
    }
    sim_trace_free(&t);
}

/* ---- fidelity: a simulated run replayed as if it were a real one ------------------------------ */

Test(sim_engine, fidelity_of_own_request_log_is_exact)
{
    sim_service svc;
    sim_service_default(&svc);
    sim_trace t;
    sim_scenario scn;
    const char *params[] = {"load=0.8", "duration=20"};
    cr_assert_eq(sim_gen_workload(&t, "poisson", params, 2, &svc, 3, &scn), 0);
    sched_policy *p = policy_file("token-budget");
    sim_run r;
    run(&t, p, &svc, NULL, &r);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(sim_report_request_log(f, &r), 0);
    fclose(f);
    sim_trace nt;
    sim_trace_init(&nt, "log");
    cr_assert_eq(sim_trace_parse(&nt, "log.jsonl", buf, len, SIM_FMT_AUTO, false), 0, "%s",
                 sim_err());
    cr_expect_eq(nt.format, SIM_FMT_NATIVE);
    cr_expect_eq(nt.n, t.n);
    sim_run r2;
    run(&nt, p, &svc, NULL, &r2);
    sim_summary s;
    sim_summarise(&r2, NULL, -1, -1, &s);
    cr_assert(s.has_fidelity);
    cr_expect_eq(s.e2e_rel_err.n, t.n);
    cr_expect_lt(s.e2e_rel_err.p99, 1e-9, "E2E p99 rel. error %g", s.e2e_rel_err.p99);
    cr_expect_lt(s.ttft_rel_err.p99, 1e-9, "TTFT p99 rel. error %g", s.ttft_rel_err.p99);
    sim_summary_free(&s);
    sim_run_free(&r);
    sim_run_free(&r2);
    sim_trace_free(&nt);
    sim_trace_free(&t);
    sched_policy_free(p);
    free(buf);
}

/* A reject only the daemon could decide (a bad token, a bad parameter — even one with no
 * prompt at all) is in its request log; the simulator cannot decide it, so it replays it as
 * recorded: the same reject event in its decision log and the same count in its report. */
Test(sim_engine, daemon_rejects_in_a_native_trace_are_replayed_and_reported)
{
    static const char log[] =
        "{\"req\":1,\"arrival_us\":0,\"tenant\":\"default\",\"class\":\"default\","
        "\"prompt_tokens\":8,\"max_tokens\":4,\"output_tokens\":4,\"finish_us\":9000,"
        "\"finish_reason\":\"length\",\"reject_reason\":null}\n"
        "{\"req\":2,\"arrival_us\":10,\"tenant\":\"default\",\"class\":\"default\","
        "\"prompt_tokens\":8,\"max_tokens\":4,\"output_tokens\":0,\"finish_us\":10,"
        "\"finish_reason\":\"rejected\",\"reject_reason\":\"bad_token\"}\n"
        "{\"req\":3,\"arrival_us\":20,\"tenant\":\"default\",\"class\":\"default\","
        "\"prompt_tokens\":0,\"max_tokens\":4,\"output_tokens\":0,\"finish_us\":20,"
        "\"finish_reason\":\"rejected\",\"reject_reason\":\"bad_params\"}\n";
    sim_trace t;
    sim_trace_init(&t, "daemon");
    cr_assert_eq(sim_trace_parse(&t, "daemon.jsonl", log, sizeof log - 1, SIM_FMT_NATIVE, false), 0,
                 "%s", sim_err());
    cr_assert_eq(t.n, 3, "%zu requests replayed (%zu lines skipped)", t.n, t.n_bad_total);
    sim_service svc;
    toy_service(&svc);
    sched_policy *p = policy_text("[scheduler]\nmode = token_budget\ntoken_budget = 512\n");
    char *dl = NULL;
    size_t dl_len = 0;
    FILE *f = open_memstream(&dl, &dl_len);
    sim_run r;
    run(&t, p, &svc, f, &r);
    fclose(f);
    sim_summary s;
    cr_assert_eq(sim_summarise(&r, NULL, -1, -1, &s), 0);
    cr_expect_eq(s.all.finished, 1);
    cr_expect_eq(s.all.rejected, 2);
    cr_expect_eq(s.all.rejects[SCHED_REJECT_BAD_TOKEN], 1);
    cr_expect_eq(s.all.rejects[SCHED_REJECT_BAD_PARAMS], 1);
    cr_expect(strstr(dl, "\"ev\":\"reject\",\"req\":2,\"tenant\":\"default\",\"class\":"
                         "\"default\",\"reason\":\"bad_token\""),
              "%s", dl);
    cr_expect(strstr(dl, "\"reason\":\"bad_params\""), "%s", dl);
    sim_summary_free(&s);
    sim_run_free(&r);
    sched_policy_free(p);
    sim_trace_free(&t);
    free(dl);
}

/* ---- the program ----------------------------------------------------------------------------- */

Test(sim_cli, json_csv_plot_and_compare)
{
    char prog[512];
    snprintf(prog, sizeof prog, "%s/ringlm-sim", th_bin_dir());
    if (access(prog, X_OK) != 0) cr_skip_test("%s not built (set RINGLM_BIN)", prog);
    char dir[] = "/tmp/ringlm-sim-test-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char cmd[2048], *out;
    snprintf(
        cmd, sizeof cmd,
        "%s --workload two-tenants --param duration=10 --policy sim/policies/token-budget.policy "
        "--json --csv %s/csv --plot %s/plot --decision-log %s/dec.jsonl 2>%s/stderr",
        prog, dir, dir, dir, dir);
    int rc = run_shell(cmd, &out);
    cr_assert_eq(rc, 0, "%s\n%s", cmd, out);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert_not_null(j, "not JSON (%s): %.500s", je.text, out);
    cr_expect(json_is_object(json_object_get(json_object_get(j, "tenants"), "quiet")),
              "tenants.quiet");
    cr_expect(json_is_string(json_object_get(j, "policy_hash")));
    cr_expect(json_is_number(json_object_get(j, "sim_s")) &&
              json_is_number(json_object_get(j, "wall_s")));
    json_decref(j);
    free(out);
    char path[1024];
    struct stat st;
    snprintf(path, sizeof path, "%s/csv/timeseries.csv", dir);
    cr_expect_eq(stat(path, &st), 0, "%s missing", path);
    snprintf(path, sizeof path, "%s/csv/requests.csv", dir);
    cr_expect_eq(stat(path, &st), 0, "%s missing", path);
    snprintf(path, sizeof path, "%s/dec.jsonl", dir);
    cr_expect(stat(path, &st) == 0 && st.st_size > 0, "%s missing or empty", path);
    if (access("/usr/bin/gnuplot", X_OK) == 0) {
        const char *imgs[] = {"ttft-cdf-run.png", "e2e-cdf-run.svg", "queue-run.png", "kv-run.svg"};
        for (int i = 0; i < 4; i++) {
            snprintf(path, sizeof path, "%s/plot/%s", dir, imgs[i]);
            cr_expect(stat(path, &st) == 0 && st.st_size > 0, "%s missing or empty", path);
        }
    }
    snprintf(
        cmd, sizeof cmd,
        "%s --workload long-prompt --param duration=10 --policy sim/policies/token-budget.policy "
        "--policy sim/policies/fcfs.policy --plot %s/cmp 2>&1",
        prog, dir);
    rc = run_shell(cmd, &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "token-budget") && strstr(out, "fcfs") && strstr(out, "verdict"), "%s",
              out);
    free(out);
    if (access("/usr/bin/gnuplot", X_OK) == 0) {
        const char *imgs[] = {"compare-ttft-cdf.png", "compare-e2e-cdf.svg", "compare-queue.png",
                              "ttft-cdf-fcfs.png"};
        for (int i = 0; i < 4; i++) {
            snprintf(path, sizeof path, "%s/cmp/%s", dir, imgs[i]);
            cr_expect(stat(path, &st) == 0 && st.st_size > 0, "%s missing or empty", path);
        }
    }
    snprintf(cmd, sizeof cmd, "%s --trace /nonexistent.csv 2>&1", prog);
    rc = run_shell(cmd, &out);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "/nonexistent.csv") != NULL, "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    (void)!system(cmd);
}
