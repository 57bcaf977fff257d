/* ringlm — the simulator's prefix cache: block hashes from traces (Mooncake hash_ids, the
 * native request log's) and the shared-prefix workload drive the same sched/ cache the daemon
 * runs; the report's figures.  SPDX-License-Identifier: MIT */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "formats/request_log.h"
#include "sim/engine.h"
#include "sim/err.h"
#include "sim/gen.h"
#include "sim/prefix_report.h"
#include "sim/service.h"
#include "sim/trace.h"
#include "tests/helpers.h"

static void toy_service(sim_service *s)
{
    sim_service_default(s);
    s->builtin = false;
    s->base_us = 1000;
    s->per_prefill_token_us = 10;
    s->per_decode_seq_us = 100;
    s->per_context_token_us = 0;
    s->kv_block_size = 16;
    s->kv_blocks_device = 1000;
    s->kv_blocks_host = 0;
    s->host.present = false;
}

static sched_policy *policy(const char *text)
{
    sched_policy *p;
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(text, &p, &err), 0, "policy line %d: %s", err.line, err.reason);
    return p;
}

static void run(const sim_trace *t, const sched_policy *p, const sim_service *svc, bool cache, sim_run *out)
{
    sim_options o;
    sim_options_defaults(&o);
    o.policy = p;
    o.policy_name = "test";
    o.svc = svc;
    o.prefix_cache = cache;
    o.check_every = 1;
    cr_assert_eq(sim_run_trace(t, &o, out), 0, "sim_run_trace: %s", sim_err());
    cr_assert_eq(out->still_live, 0);
}

/* Mooncake: hash_ids are 512-token blocks; the scheduler's blocks are 16 tokens.  The second
 * request repeats the first one's first 512-token block, so 32 of its blocks hit; the third
 * shares nothing (other hashes); with the cache off nothing hits and every token is computed. */
Test(sim_prefix, mooncake_hash_ids_map_onto_the_block_size_and_hit)
{
    const char *jl = "{\"timestamp\": 0, \"input_length\": 700, \"output_length\": 4, \"hash_ids\": [11, 12]}\n"
                     "{\"timestamp\": 1000, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [11, 13]}\n"
                     "{\"timestamp\": 2000, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [21, 22]}\n"
                     "{\"timestamp\": 3000, \"input_length\": 100, \"output_length\": 4}\n";
    sim_trace t;
    sim_trace_init(&t, "m");
    cr_assert_eq(sim_trace_parse(&t, "m.jsonl", jl, strlen(jl), SIM_FMT_AUTO, false), 0, "%s", sim_err());
    cr_assert_eq(t.format, SIM_FMT_MOONCAKE);
    cr_assert_eq(t.reqs[1].n_hash, 2);
    cr_assert_eq(t.reqs[1].hash_block_tokens, 512);
    cr_assert_eq(t.hashes[t.reqs[1].hash_off + 1], 13);
    cr_assert_eq(t.reqs[3].n_hash, 0, "no hash_ids: no hashes");
    sim_service svc;
    toy_service(&svc);
    sched_policy *p = policy("");
    sim_run on, off;
    run(&t, p, &svc, true, &on);
    run(&t, p, &svc, false, &off);
    cr_expect_eq(on.final_counts.prefix_hit_tokens, 512, "hit %llu tokens",
                 (unsigned long long)on.final_counts.prefix_hit_tokens);
    cr_expect_eq(on.final_counts.prefix_self_tokens, 0);
    cr_expect_eq(off.final_counts.prefix_hit_tokens, 0);
    cr_expect_eq(off.prefill_tokens, 700 + 600 + 600 + 100);
    cr_expect_eq(on.prefill_tokens, off.prefill_tokens - 512, "the hit tokens are not computed");
    sim_prefix_figures f;
    sim_prefix_figures_of(&on, &f);
    cr_expect_eq(f.cross_tokens, 512);
    cr_expect_eq(f.hit_tokens_tier[SCHED_POOL_DEVICE], 512);
    /* the cache never hits requests without hashes: queried only those with them */
    cr_expect_eq(f.query_tokens, 700 + 600 + 600);
    sim_run_free(&on);
    sim_run_free(&off);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* The policy's cache domains hold in the simulator too: the same hashes from two tenants in
 * their own domains never hit; put in one domain, they do. */
Test(sim_prefix, cache_domains_of_the_policy_decide_sharing)
{
    const char *jl = "{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": [5]}\n"
                     "{\"timestamp\": 1000, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": [5]}\n";
    sim_trace t;
    sim_trace_init(&t, "m");
    cr_assert_eq(sim_trace_parse(&t, "m.jsonl", jl, strlen(jl), SIM_FMT_AUTO, false), 0, "%s", sim_err());
    cr_assert_eq(sim_trace_assign(&t, 0, "rr:a,b", 1), 0);
    sim_service svc;
    toy_service(&svc);
    sched_policy *apart = policy("[tenant a]\n[tenant b]\n"), *together = policy("[tenant a]\ncache_domain = x\n[tenant b]\ncache_domain = x\n");
    sim_run r1, r2;
    run(&t, apart, &svc, true, &r1);
    run(&t, together, &svc, true, &r2);
    cr_expect_eq(r1.final_counts.prefix_hit_tokens, 0, "tenants in their own domains shared");
    cr_expect_eq(r2.final_counts.prefix_hit_tokens, 496, "one domain: 31 of the 32 blocks (the last token is computed)");
    sim_run_free(&r1);
    sim_run_free(&r2);
    sched_policy_free(apart);
    sched_policy_free(together);
    sim_trace_free(&t);
}

/* The native request log carries hash_ids and hash_block_tokens: written, read back, and a
 * trace made of them shares as recorded. */
Test(sim_prefix, the_native_log_round_trips_block_hashes)
{
    uint64_t ids[3] = {1, 9007199254740991ull, 42};
    fmt_request r = {.req = 7, .arrival_us = 10, .prompt_tokens = 40, .max_tokens = 3, .output_tokens = 3,
                     .deadline_us = FMT_NULL, .cancel_us = FMT_NULL, .first_token_us = FMT_NULL, .finish_us = FMT_NULL,
                     .finish_reason = "length", .hash_ids = ids, .n_hash_ids = 3, .hash_block_tokens = 16};
    char line[1024];
    int n = fmt_request_format(&r, line, sizeof line);
    cr_assert_gt(n, 0);
    cr_assert(strstr(line, "\"hash_ids\":[1,9007199254740991,42]"), "%s", line);
    static fmt_request_text text;
    fmt_request q;
    char why[160];
    cr_assert_eq(fmt_request_parse(line, (size_t)n, &q, &text, why, sizeof why), 0, "%s", why);
    cr_assert_eq(q.n_hash_ids, 3);
    cr_assert_eq(q.hash_block_tokens, 16);
    cr_assert_eq(q.hash_ids[1], 9007199254740991ull);
    /* hashes without their block size, or not integers, are refused with the field named */
    const char *bad1 = "{\"req\":1,\"arrival_us\":0,\"prompt_tokens\":4,\"output_tokens\":1,\"hash_ids\":[1]}";
    cr_assert_lt(fmt_request_parse(bad1, strlen(bad1), &q, &text, why, sizeof why), 0);
    cr_assert(strstr(why, "hash_block_tokens"), "%s", why);
    const char *bad2 = "{\"req\":1,\"arrival_us\":0,\"prompt_tokens\":4,\"output_tokens\":1,\"hash_block_tokens\":4,\"hash_ids\":[1,\"x\"]}";
    cr_assert_lt(fmt_request_parse(bad2, strlen(bad2), &q, &text, why, sizeof why), 0);
    cr_assert(strstr(why, "hash_ids"), "%s", why);
    /* a trace of two such lines with the same first hash shares that block */
    char buf[4096];
    int a = fmt_request_format(&r, buf, sizeof buf);
    buf[a++] = '\n';
    fmt_request r2 = r;
    uint64_t ids2[3] = {1, 5, 6};
    r2.req = 8;
    r2.arrival_us = 5000;
    r2.hash_ids = ids2;
    a += fmt_request_format(&r2, buf + a, sizeof buf - (size_t)a);
    sim_trace t;
    sim_trace_init(&t, "n");
    cr_assert_eq(sim_trace_parse(&t, "n.jsonl", buf, (size_t)a, SIM_FMT_AUTO, false), 0, "%s", sim_err());
    cr_assert_eq(t.format, SIM_FMT_NATIVE);
    sim_service svc;
    toy_service(&svc);
    sched_policy *p = policy("");
    sim_run on;
    run(&t, p, &svc, true, &on);
    cr_expect_eq(on.final_counts.prefix_hit_tokens, 16, "one 16-token block shared");
    sim_run_free(&on);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* Tokens standing for hashes: equal hashes give equal tokens at the same offsets; the rest
 * is unique to the request. */
Test(sim_prefix, tokens_follow_the_hashes)
{
    sim_trace t;
    sim_trace_init(&t, "x");
    sim_req r;
    memset(&r, 0, sizeof r);
    r.prompt_tokens = 40;
    r.output_tokens = r.max_tokens = 1;
    uint64_t a[2] = {3, 4}, b[2] = {3, 5};
    cr_assert_eq(sim_trace_push_hashed(&t, &r, a, 2, 16), 0);
    cr_assert_eq(sim_trace_push_hashed(&t, &r, b, 2, 16), 0);
    int32_t x[40], y[40];
    sim_req_tokens(&t, &t.reqs[0], 0, x);
    sim_req_tokens(&t, &t.reqs[1], 1, y);
    cr_expect_eq(memcmp(x, y, 16 * sizeof *x), 0, "the shared hash's tokens differ");
    int same = 0;
    for (int k = 16; k < 40; k++) same += x[k] == y[k];
    cr_expect_lt(same, 3, "%d of the other tokens are equal", same);
    sim_trace_free(&t);
}

/* shared-prefix: a later turn's hashes begin with the earlier turn's full blocks; with the
 * cache on most prompt tokens hit and fewer prefill tokens are computed; with every prompt a
 * one-off, nothing hits. */
Test(sim_prefix, the_shared_prefix_workload_reuses_system_prompts_and_conversations)
{
    sim_service svc;
    toy_service(&svc);
    svc.kv_blocks_device = 20000;
    sim_scenario scn;
    sim_trace t;
    const char *par[] = {"n=60", "rate=2", "system_prompts=2", "system_len=128", "turns=3", "one_off=0"};
    cr_assert_eq(sim_gen_workload(&t, "shared-prefix", par, 6, &svc, 7, &scn), 0, "%s", sim_err());
    cr_assert_geq(t.n, 150, "60 conversations of 3 turns, got %zu", t.n);
    size_t extended = 0;
    for (size_t i = 0; i < t.n; i++) {
        const sim_req *q = &t.reqs[i];
        cr_assert_eq(q->hash_block_tokens, 16);
        cr_assert_eq(q->n_hash, (q->prompt_tokens + 15) / 16);
        for (size_t j = 0; j < i; j++) {   /* an earlier turn of the same conversation */
            const sim_req *o = &t.reqs[j];
            uint32_t full = o->prompt_tokens / 16;
            if (o->tenant != q->tenant || o->prompt_tokens >= q->prompt_tokens || full <= 8) continue;
            if (!memcmp(&t.hashes[o->hash_off], &t.hashes[q->hash_off], full * sizeof(uint64_t)) &&
                t.hashes[o->hash_off + 8] == t.hashes[q->hash_off + 8])
                { extended++; break; }
        }
    }
    cr_expect_geq(extended, 100, "only %zu prompts extend an earlier one past the system prompt", extended);
    sched_policy *p = policy("");
    sim_run on, off;
    run(&t, p, &svc, true, &on);
    run(&t, p, &svc, false, &off);
    sim_prefix_figures f;
    sim_prefix_figures_of(&on, &f);
    cr_expect_gt(f.hit_rate, 0.6, "hit rate %.3f", f.hit_rate);
    cr_expect_lt(on.prefill_tokens, off.prefill_tokens * 2 / 5, "prefill %llu with, %llu without",
                 (unsigned long long)on.prefill_tokens, (unsigned long long)off.prefill_tokens);
    sim_run_free(&on);
    sim_run_free(&off);
    sim_trace_free(&t);

    const char *solo[] = {"n=40", "rate=2", "one_off=1"};
    cr_assert_eq(sim_gen_workload(&t, "shared-prefix", solo, 3, &svc, 7, &scn), 0, "%s", sim_err());
    run(&t, p, &svc, true, &on);
    cr_expect_eq(on.final_counts.prefix_hit_tokens, 0, "one-off prompts shared");
    sim_run_free(&on);
    sim_trace_free(&t);
    sched_policy_free(p);
}

/* The CLI: --prefix-report --json carries both runs and the sweep; a bad sweep is refused. */
Test(sim_prefix, cli_prefix_report_with_a_capacity_sweep)
{
    char *sim = th_program("ringlm-sim");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --workload shared-prefix --param n=80 --prefix-report --capacity-sweep 128,4096 --json", sim);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    static char out[65536];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    cr_assert_eq(pclose(f), 0, "exit status; output:\n%s", out);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    cr_assert_not_null(j, "not JSON (%s):\n%s", e.text, out);
    double hit_on = json_real_value(json_object_get(json_object_get(json_object_get(j, "on"), "prefix_cache"), "hit_rate"));
    double hit_off = json_real_value(json_object_get(json_object_get(json_object_get(j, "off"), "prefix_cache"), "hit_rate"));
    cr_expect_gt(hit_on, 0.3);
    cr_expect_eq(hit_off, 0);
    json_t *sw = json_object_get(j, "capacity_sweep");
    cr_assert_eq(json_array_size(sw), 2);
    double small = json_real_value(json_object_get(json_object_get(json_array_get(sw, 0), "prefix_cache"), "hit_rate"));
    double big = json_real_value(json_object_get(json_object_get(json_array_get(sw, 1), "prefix_cache"), "hit_rate"));
    cr_expect_lt(small, big, "a smaller device pool hits less (%.3f vs %.3f)", small, big);
    json_decref(j);
    snprintf(cmd, sizeof cmd, "%s --workload shared-prefix --prefix-report --capacity-sweep 12,x 2>/dev/null", sim);
    cr_expect_neq(system(cmd), 0, "a bad sweep list was accepted");
    free(sim);
}
