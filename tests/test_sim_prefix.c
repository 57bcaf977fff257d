/* ringlm — the simulator's prefix cache: block hashes from traces (Mooncake hash_ids, the
 * native request log's) and the shared-prefix workload drive the same sched/ cache the daemon
 * runs; the report's figures.  SPDX-License-Identifier: MIT */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "formats/request_log.h"
#include "sim/engine.h"
#include "sim/err.h"
#include "sim/gen.h"
#include "sim/prefix_report.h"
#include "sim/report.h"
#include "sim/service.h"
#include "sim/trace.h"
#include "tests/helpers.h"
#include "tests/sim_test_util.h"

static void run(const sim_trace *t, const sched_policy *p, const sim_service *svc, bool cache,
                sim_run *out)
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

/* ringlm-sim with args (they end in a redirection of its stderr, if any): its exit status. */
static int sim_status(const char *args)
{
    char *sim = th_program("ringlm-sim");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s", sim, args);
    free(sim);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Mooncake: hash_ids are 512-token blocks; the scheduler's blocks are 16 tokens.  The second
 * request repeats the first one's first 512-token block, so 32 of its blocks hit; the third
 * shares nothing (other hashes); with the cache off nothing hits and every token is computed. */
Test(sim_prefix, mooncake_hash_ids_map_onto_the_block_size_and_hit)
{
    const char *jl =
        "{\"timestamp\": 0, \"input_length\": 700, \"output_length\": 4, \"hash_ids\": [11, 12]}\n"
        "{\"timestamp\": 1000, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [11, "
        "13]}\n"
        "{\"timestamp\": 2000, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [21, "
        "22]}\n"
        "{\"timestamp\": 3000, \"input_length\": 100, \"output_length\": 4}\n";
    sim_trace t;
    sim_trace_init(&t, "m");
    cr_assert_eq(sim_trace_parse(&t, "m.jsonl", jl, strlen(jl), SIM_FMT_AUTO, false), 0, "%s",
                 sim_err());
    cr_assert_eq(t.format, SIM_FMT_MOONCAKE);
    cr_assert_eq(t.reqs[1].n_hash, 2);
    cr_assert_eq(t.reqs[1].hash_block_tokens, 512);
    cr_assert_eq(t.hashes[t.reqs[1].hash_off + 1], 13);
    cr_assert_eq(t.reqs[3].n_hash, 0, "no hash_ids: no hashes");
    sim_service svc;
    toy_service(&svc);
    sched_policy *p = policy_text("");
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
    const char *jl =
        "{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": [5]}\n"
        "{\"timestamp\": 1000, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": [5]}\n";
    sim_trace t;
    sim_trace_init(&t, "m");
    cr_assert_eq(sim_trace_parse(&t, "m.jsonl", jl, strlen(jl), SIM_FMT_AUTO, false), 0, "%s",
                 sim_err());
    cr_assert_eq(sim_trace_assign(&t, 0, "rr:a,b", 1), 0);
    sim_service svc;
    toy_service(&svc);
    sched_policy *apart = policy_text("[tenant a]\n[tenant b]\n"),
                 *together =
                     policy_text("[tenant a]\ncache_domain = x\n[tenant b]\ncache_domain = x\n");
    sim_run r1, r2;
    run(&t, apart, &svc, true, &r1);
    run(&t, together, &svc, true, &r2);
    cr_expect_eq(r1.final_counts.prefix_hit_tokens, 0, "tenants in their own domains shared");
    cr_expect_eq(r2.final_counts.prefix_hit_tokens, 496,
                 "one domain: 31 of the 32 blocks (the last token is computed)");
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
    fmt_request r = {.req = 7,
                     .arrival_us = 10,
                     .prompt_tokens = 40,
                     .max_tokens = 3,
                     .output_tokens = 3,
                     .deadline_us = FMT_NULL,
                     .cancel_us = FMT_NULL,
                     .first_token_us = FMT_NULL,
                     .finish_us = FMT_NULL,
                     .finish_reason = "length",
                     .hash_ids = ids,
                     .n_hash_ids = 3,
                     .hash_block_tokens = 16};
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
    const char *bad1 =
        "{\"req\":1,\"arrival_us\":0,\"prompt_tokens\":4,\"output_tokens\":1,\"hash_ids\":[1]}";
    cr_assert_lt(fmt_request_parse(bad1, strlen(bad1), &q, &text, why, sizeof why), 0);
    cr_assert(strstr(why, "hash_block_tokens"), "%s", why);
    const char *bad2 = "{\"req\":1,\"arrival_us\":0,\"prompt_tokens\":4,\"output_tokens\":1,\"hash_"
                       "block_tokens\":4,\"hash_ids\":[1,\"x\"]}";
    cr_assert_lt(fmt_request_parse(bad2, strlen(bad2), &q, &text, why, sizeof why), 0);
    cr_assert(strstr(why, "hash_ids"), "%s", why);
    const char *bad3 = "{\"req\":1,\"arrival_us\":0,\"prompt_tokens\":4,\"output_tokens\":20,"
                       "\"answer_hash_ids\":[1]}";
    cr_assert_lt(fmt_request_parse(bad3, strlen(bad3), &q, &text, why, sizeof why), 0);
    cr_assert(strstr(why, "hash_block_tokens"), "%s", why);
    /* the answer's keys: written after the prompt's, read back; alone (a prompt shorter than
     * a block) they carry the block size too */
    uint64_t ans[2] = {7, 8};
    fmt_request ra = r;
    ra.answer_hash_ids = ans;
    ra.n_answer_hash_ids = 2;
    n = fmt_request_format(&ra, line, sizeof line);
    cr_assert(strstr(line, "\"hash_ids\":[1,9007199254740991,42],\"answer_hash_ids\":[7,8]"), "%s",
              line);
    cr_assert_eq(fmt_request_parse(line, (size_t)n, &q, &text, why, sizeof why), 0, "%s", why);
    cr_assert_eq(q.n_hash_ids, 3);
    cr_assert_eq(q.n_answer_hash_ids, 2);
    cr_assert_eq(q.answer_hash_ids[1], 8);
    ra.hash_ids = NULL;
    ra.n_hash_ids = 0;
    n = fmt_request_format(&ra, line, sizeof line);
    cr_assert_eq(fmt_request_parse(line, (size_t)n, &q, &text, why, sizeof why), 0, "%s", why);
    cr_assert_eq(q.n_hash_ids, 0);
    cr_assert_eq(q.n_answer_hash_ids, 2);
    cr_assert_eq(q.hash_block_tokens, 16, "%s", line);
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
    cr_assert_eq(sim_trace_parse(&t, "n.jsonl", buf, (size_t)a, SIM_FMT_AUTO, false), 0, "%s",
                 sim_err());
    cr_assert_eq(t.format, SIM_FMT_NATIVE);
    sim_service svc;
    toy_service(&svc);
    sched_policy *p = policy_text("");
    sim_run on;
    run(&t, p, &svc, true, &on);
    cr_expect_eq(on.final_counts.prefix_hit_tokens, 16, "one 16-token block shared");
    sim_run_free(&on);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* A recorded conversation (ringlmd's request log): turn 1 is a 40-token prompt (2 full blocks
 * of 16, keys 11 12) and a 30-token answer, whose full blocks (answer_hash_ids 13 14: tokens
 * 32..63, the first holding the prompt's last 8) ringlmd cached when turn 1 ended; turn 2's
 * prompt is all of that and 10 more tokens (keys 11 12 13 14 15).  The replay caches the
 * answer's blocks as the daemon did: turn 2 finds 64 tokens (4 blocks; turn 1 computed 69 of
 * its 70) where the prompt's blocks alone give 32 — which is what a log without the answer's
 * keys (an older ringlmd's) still replays.  The simulator's own request log writes the
 * answer's keys back. */
Test(sim_prefix, a_recorded_answer_is_cached_for_the_next_turn)
{
    const char *with = "{\"req\":1,\"arrival_us\":0,\"tenant\":\"t\",\"class\":\"c\",\"prompt_"
                       "tokens\":40,\"max_tokens\":30,"
                       "\"output_tokens\":30,\"finish_reason\":\"length\",\"hash_block_tokens\":16,"
                       "\"hash_ids\":[11,12],"
                       "\"answer_hash_ids\":[13,14]}\n"
                       "{\"req\":2,\"arrival_us\":2000000,\"tenant\":\"t\",\"class\":\"c\","
                       "\"prompt_tokens\":80,\"max_tokens\":4,"
                       "\"output_tokens\":4,\"finish_reason\":\"length\",\"hash_block_tokens\":16,"
                       "\"hash_ids\":[11,12,13,14,15]}\n";
    const char *without = "{\"req\":1,\"arrival_us\":0,\"tenant\":\"t\",\"class\":\"c\",\"prompt_"
                          "tokens\":40,\"max_tokens\":30,"
                          "\"output_tokens\":30,\"finish_reason\":\"length\",\"hash_block_tokens\":"
                          "16,\"hash_ids\":[11,12]}\n"
                          "{\"req\":2,\"arrival_us\":2000000,\"tenant\":\"t\",\"class\":\"c\","
                          "\"prompt_tokens\":80,\"max_tokens\":4,"
                          "\"output_tokens\":4,\"finish_reason\":\"length\",\"hash_block_tokens\":"
                          "16,\"hash_ids\":[11,12,13,14,15]}\n";
    sim_service svc;
    toy_service(&svc);
    sched_policy *p = policy_text("[tenant t]\n[class c]\n");
    long long hits[2];
    for (int v = 0; v < 2; v++) {
        const char *jl = v ? without : with;
        sim_trace t;
        sim_trace_init(&t, "log");
        cr_assert_eq(sim_trace_parse(&t, "log.jsonl", jl, strlen(jl), SIM_FMT_AUTO, false), 0, "%s",
                     sim_err());
        cr_assert_eq(t.reqs[0].n_hash, 2);
        cr_assert_eq(t.reqs[0].n_ahash, v ? 0u : 2u);
        sim_run r;
        run(&t, p, &svc, true, &r);
        cr_assert_eq(r.recs[r.final_rec[0]].outcome, SIM_OUT_FINISHED);
        cr_assert_lt(r.recs[r.final_rec[0]].end_us, t.reqs[1].arrival_us,
                     "turn 1 still ran when turn 2 came");
        cr_expect_eq(r.recs[r.final_rec[0]].cached_tokens, 0);
        hits[v] = (long long)r.recs[r.final_rec[1]].cached_tokens;
        if (!v) { /* written back: the answer's keys as far as the replayed answer went */
            char path[] = "/tmp/ringlm-simpx-XXXXXX";
            int fd = mkstemp(path);
            cr_assert_geq(fd, 0);
            FILE *f = fdopen(fd, "w+");
            cr_assert_eq(sim_report_request_log(f, &r), 0, "%s", sim_err());
            rewind(f);
            char line[2048];
            int with_answer = 0;
            while (fgets(line, sizeof line, f))
                with_answer += strstr(line, "\"answer_hash_ids\":[13,14]") != NULL;
            fclose(f);
            unlink(path);
            cr_expect_eq(with_answer, 1, "the simulator's request log lost turn 1's answer keys");
        }
        sim_run_free(&r);
        sim_trace_free(&t);
    }
    cr_expect_eq(hits[0], 64,
                 "turn 2 found %lld cached tokens, not turn 1's prompt and answer (64)", hits[0]);
    cr_expect_eq(hits[1], 32, "without the answer's keys turn 2 found %lld, not the prompt's 32",
                 hits[1]);
    sched_policy_free(p);
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
    cr_assert_eq(sim_trace_push_hashed(&t, &r, a, 2, NULL, 0, 16), 0);
    cr_assert_eq(sim_trace_push_hashed(&t, &r, b, 2, NULL, 0, 16), 0);
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
    const char *par[] = {"n=60",           "rate=2",  "system_prompts=2",
                         "system_len=128", "turns=3", "one_off=0"};
    cr_assert_eq(sim_gen_workload(&t, "shared-prefix", par, 6, &svc, 7, &scn), 0, "%s", sim_err());
    cr_assert_geq(t.n, 150, "60 conversations of 3 turns, got %zu", t.n);
    size_t extended = 0;
    for (size_t i = 0; i < t.n; i++) {
        const sim_req *q = &t.reqs[i];
        cr_assert_eq(q->hash_block_tokens, 16);
        cr_assert_eq(q->n_hash, q->prompt_tokens / 16, "the prompt's full blocks");
        cr_assert_eq(q->n_ahash, (q->prompt_tokens + q->output_tokens) / 16 - q->prompt_tokens / 16,
                     "the answer's full blocks, continuing the chain");
        for (size_t j = 0; j < i; j++) { /* an earlier turn of the same conversation */
            const sim_req *o = &t.reqs[j];
            uint32_t full = o->prompt_tokens / 16;
            if (o->tenant != q->tenant || o->prompt_tokens >= q->prompt_tokens || full <= 8)
                continue;
            if (!memcmp(&t.hashes[o->hash_off], &t.hashes[q->hash_off], full * sizeof(uint64_t)) &&
                t.hashes[o->hash_off + 8] == t.hashes[q->hash_off + 8]) {
                extended++;
                break;
            }
        }
    }
    cr_expect_geq(extended, 100, "only %zu prompts extend an earlier one past the system prompt",
                  extended);
    sched_policy *p = policy_text("");
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

/* shared-prefix conversations as ringlmd serves them: a turn's answer gets the block keys that
 * continue its prompt's chain, the simulator caches the answer's blocks when the turn ends
 * (prefix_cache_generated) and the next turn, whose prompt is that prompt, that answer and a
 * new user message, finds all of it cached — not only the last prompt.  The same trace with
 * the answers' keys dropped (what the generator gave before) finds only the last prompt. */
Test(sim_prefix, shared_prefix_next_turns_find_the_last_answer_cached)
{
    sim_service svc;
    toy_service(&svc);
    svc.kv_blocks_device = 4000; /* nothing is evicted */
    sim_scenario scn;
    sim_trace t, bare;
    const char *par[] = {"n=30",    "rate=1",    "system_prompts=2", "system_len=128",
                         "turns=3", "one_off=0", "think=3-4"};
    cr_assert_eq(sim_gen_workload(&t, "shared-prefix", par, 7, &svc, 11, &scn), 0, "%s", sim_err());
    sim_trace_init(&bare, "bare");
    for (unsigned k = 0; k < t.n_tenants; k++)
        cr_assert_eq(sim_trace_tenant(&bare, t.tenants[k]), (int)k);
    for (unsigned k = 0; k < t.n_classes; k++)
        cr_assert_eq(sim_trace_class(&bare, t.classes[k]), (int)k);
    for (size_t i = 0; i < t.n; i++)
        cr_assert_eq(sim_trace_push_hashed(&bare, &t.reqs[i], &t.hashes[t.reqs[i].hash_off],
                                           t.reqs[i].n_hash, NULL, 0, t.reqs[i].hash_block_tokens),
                     0);
    /* prev[i]: the turn request i continues — the latest earlier request whose prompt and
     * answer keys all begin i's prompt keys, past the 8 blocks of a system prompt */
    size_t *prev = malloc(t.n * sizeof *prev), pairs = 0, with_answer = 0;
    cr_assert_not_null(prev);
    for (size_t i = 0; i < t.n; i++) {
        const sim_req *q = &t.reqs[i];
        prev[i] = SIZE_MAX;
        for (size_t j = 0; j < i; j++) {
            const sim_req *o = &t.reqs[j];
            uint32_t all = o->n_hash + o->n_ahash;
            if (all <= 8 || all > q->n_hash ||
                q->prompt_tokens < o->prompt_tokens + o->output_tokens)
                continue;
            if (!memcmp(&t.hashes[o->hash_off], &t.hashes[q->hash_off], all * sizeof(uint64_t)))
                prev[i] = j;
        }
        if (prev[i] == SIZE_MAX) continue;
        pairs++;
        const sim_req *o = &t.reqs[prev[i]];
        with_answer += (o->prompt_tokens + o->output_tokens - 1) / 16 >
                       o->n_hash; /* a computed answer block */
    }
    cr_assert_geq(
        pairs, 50,
        "30 conversations of 3 turns: only %zu next turns extend the last prompt and answer",
        pairs);
    cr_assert_geq(with_answer, 50, "only %zu next turns follow an answer that filled a block",
                  with_answer);
    sched_policy *p = policy_text("");
    size_t found[2] = {0, 0}; /* next turns that found the last answer's blocks cached */
    for (int v = 0; v < 2; v++) {
        sim_run r;
        run(v ? &bare : &t, p, &svc, true, &r);
        for (size_t i = 0; i < t.n; i++) {
            if (prev[i] == SIZE_MAX) continue;
            const sim_req *o = &t.reqs[prev[i]];
            const sim_rec *xo = &r.recs[r.final_rec[prev[i]]], *xi = &r.recs[r.final_rec[i]];
            cr_assert_eq(xo->outcome, SIM_OUT_FINISHED);
            cr_assert_lt(xo->end_us, t.reqs[i].arrival_us,
                         "request %zu still ran when its next turn came", prev[i]);
            /* the answer's last token is sampled, never computed: its block is not cached */
            uint32_t computed = (o->prompt_tokens + o->output_tokens - 1) / 16;
            uint64_t answered =
                (uint64_t)(computed < o->n_hash + o->n_ahash ? computed : o->n_hash + o->n_ahash) *
                16;
            if (!v)
                cr_expect_geq(xi->cached_tokens, answered,
                              "request %zu found %llu tokens cached, not its last prompt and "
                              "answer (%llu)",
                              i, (unsigned long long)xi->cached_tokens,
                              (unsigned long long)answered);
            found[v] += answered > (uint64_t)o->n_hash * 16 && xi->cached_tokens >= answered;
        }
        sim_run_free(&r);
    }
    cr_expect_eq(found[0], with_answer, "%zu of %zu next turns found the last answer cached",
                 found[0], with_answer);
    cr_expect_eq(found[1], 0,
                 "without the answers' keys %zu next turns still found the last answer", found[1]);
    free(prev);
    sim_trace_free(&bare);
    sim_trace_free(&t);
    sched_policy_free(p);
}

/* The CLI: --prefix-report --json carries both runs and the sweep; a bad sweep is refused. */
Test(sim_prefix, cli_prefix_report_with_a_capacity_sweep)
{
    json_t *j =
        sim_json("--workload shared-prefix --param n=80 --prefix-report --capacity-sweep 128,4096");
    double hit_on = json_real_value(
        json_object_get(json_object_get(json_object_get(j, "on"), "prefix_cache"), "hit_rate"));
    double hit_off = json_real_value(
        json_object_get(json_object_get(json_object_get(j, "off"), "prefix_cache"), "hit_rate"));
    cr_expect_gt(hit_on, 0.3);
    cr_expect_eq(hit_off, 0);
    json_t *sw = json_object_get(j, "capacity_sweep");
    cr_assert_eq(json_array_size(sw), 2);
    double small = json_real_value(
        json_object_get(json_object_get(json_array_get(sw, 0), "prefix_cache"), "hit_rate"));
    double big = json_real_value(
        json_object_get(json_object_get(json_array_get(sw, 1), "prefix_cache"), "hit_rate"));
    cr_expect_lt(small, big, "a smaller device pool hits less (%.3f vs %.3f)", small, big);
    json_decref(j);
    cr_expect_eq(
        sim_status("--workload shared-prefix --prefix-report --capacity-sweep 12,x 2>/dev/null"), 2,
        "a bad sweep list was accepted");
}

/* ---- tiers: a small device pool, a host tier and a disk tier ------------------------------ */

/* 16-token blocks of 16 KiB; prefill 40 µs a token, so recomputing a block costs 640 µs. */
static void tier_service(sim_service *s, double host_bw, double disk_bw)
{
    toy_service(s);
    s->per_prefill_token_us = 40;
    s->kv_bytes_per_token = 1024;
    s->kv_blocks_device = 64;
    s->kv_blocks_host = 48;
    s->kv_blocks_disk = 4000;
    s->host = (sim_link){host_bw, host_bw, 10, true};
    s->disk = (sim_link){disk_bw, disk_bw, 80, true};
}

/* System prompts of 16 blocks shared by 40 conversations: they do not all fit in 64 device
 * blocks, so cached blocks are demoted to host, and from host to disk. */
static void tier_trace(const sim_service *svc, sim_trace *t)
{
    sim_scenario scn;
    const char *par[] = {"n=40",           "rate=20",     "system_prompts=4",
                         "system_len=256", "turns=1-3",   "user=16-32",
                         "output=8-16",    "think=0.2-1", "one_off=0.1"};
    cr_assert_eq(sim_gen_workload(t, "shared-prefix", par, 9, svc, 11, &scn), 0, "%s", sim_err());
}

typedef struct tier_run {
    sim_run r;
    double reload_us[512]; /* per sched request id - 1: summed transfer time of its reloads */
    uint32_t n_reloaded;   /* requests with a reload */
} tier_run;

static void run_tiers(const sim_trace *t, const sched_policy *p, const sim_service *svc,
                      tier_run *out)
{
    memset(out, 0, sizeof *out);
    FILE *log = tmpfile();
    cr_assert_not_null(log);
    sim_options o;
    sim_options_defaults(&o);
    o.policy = p;
    o.policy_name = "test";
    o.svc = svc;
    o.check_every = 1;
    o.decision_log = log;
    cr_assert_eq(sim_run_trace(t, &o, &out->r), 0, "sim_run_trace: %s", sim_err());
    cr_assert_eq(out->r.still_live, 0);
    cr_assert_leq(out->r.n_recs, 512);
    /* each reload the scheduler planned, with its bytes and tier: its transfer time on that
     * link, without anything queued ahead of it */
    rewind(log);
    static char line[4096];
    while (fgets(line, sizeof line, log)) {
        if (!strstr(line, "\"ev\":\"cache_reload\"") || strstr(line, "\"reason\"") ||
            !strstr(line, "\"choice\":\"reload\""))
            continue;
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        cr_assert_not_null(j, "not JSON: %s", line);
        uint64_t req = (uint64_t)json_integer_value(json_object_get(j, "req"));
        double bytes = (double)json_integer_value(json_object_get(j, "bytes"));
        const char *pool = json_string_value(json_object_get(j, "pool"));
        cr_assert(req >= 1 && req <= out->r.n_recs && pool && bytes > 0, "%s", line);
        const sim_link *l =
            sim_service_link(svc, strcmp(pool, "disk") ? SCHED_POOL_HOST : SCHED_POOL_DISK);
        if (out->reload_us[req - 1] == 0) out->n_reloaded++;
        out->reload_us[req - 1] += l->latency_us + bytes / l->in_bytes_per_s * 1e6;
        json_decref(j);
    }
    fclose(log);
}

static double ttft_us(const sim_rec *x)
{
    return (double)(x->first_token_us - x->submit_us);
}

/* Reloads from host and disk are charged: a reloaded request's first token comes no earlier
 * than its reload's transfer time after its arrival; a slower host link makes reloaded
 * requests wait longer; a disk too slow to beat recomputing is never reloaded from; the same
 * seed gives the same run. */
Test(sim_prefix, tier_reloads_are_charged_to_the_requests_that_wait_for_them)
{
    sim_service fast, slow_host, slow_disk;
    tier_service(&fast, 1e8, 4e7);      /* a block: host 174 µs, disk 490 µs to reload */
    tier_service(&slow_host, 5e7, 4e7); /* host 338 µs: still cheaper than 640 µs */
    tier_service(&slow_disk, 1e8, 5e5); /* disk 33 ms a block: recomputing wins */
    sim_trace t;
    tier_trace(&fast, &t);
    sched_policy *p = policy_text("");
    static tier_run a, b, hs, ds;
    run_tiers(&t, p, &fast, &a);

    sim_prefix_figures f;
    sim_prefix_figures_of(&a.r, &f);
    cr_expect_gt(f.demoted_blocks[SCHED_POOL_HOST], 0, "nothing demoted to host");
    cr_expect_gt(f.demoted_blocks[SCHED_POOL_DISK], 0, "nothing demoted to disk");
    cr_expect_gt(f.hit_tokens_tier[SCHED_POOL_HOST], 0, "no hit on host");
    cr_expect_gt(f.hit_tokens_tier[SCHED_POOL_DISK], 0, "no hit on disk");
    cr_expect_gt(f.reloaded_blocks[SCHED_POOL_HOST], 0);
    cr_expect_gt(f.reloaded_blocks[SCHED_POOL_DISK], 0);
    cr_expect_gt(a.r.cache_copies_waited, 0);
    cr_expect_gt(f.copy_wait_ms, 0);
    cr_assert_geq(a.n_reloaded, 3, "only %u requests reloaded", a.n_reloaded);
    double mean_fast = 0;
    for (size_t i = 0; i < a.r.n_recs; i++) {
        const sim_rec *x = &a.r.recs[i];
        if (a.reload_us[i] == 0 || x->first_token_us < 0) continue;
        cr_expect_geq(ttft_us(x), a.reload_us[i],
                      "request %zu: TTFT %.0f µs, its reload alone takes %.0f µs", i + 1,
                      ttft_us(x), a.reload_us[i]);
        mean_fast += ttft_us(x) / a.n_reloaded;
    }

    /* the same seed: the same run, request by request */
    run_tiers(&t, p, &fast, &b);
    cr_assert_eq(b.r.n_recs, a.r.n_recs);
    for (size_t i = 0; i < a.r.n_recs; i++)
        cr_assert_eq(b.r.recs[i].first_token_us, a.r.recs[i].first_token_us,
                     "request %zu differs between runs", i + 1);
    cr_expect_eq(memcmp(&a.r.final_counts, &b.r.final_counts, sizeof a.r.final_counts), 0);
    cr_expect_eq(memcmp(a.reload_us, b.reload_us, sizeof a.reload_us), 0);

    /* a slower host link: the reloaded requests wait longer */
    run_tiers(&t, p, &slow_host, &hs);
    sim_prefix_figures fh;
    sim_prefix_figures_of(&hs.r, &fh);
    cr_expect_gt(fh.reloaded_blocks[SCHED_POOL_HOST], 0);
    double mean_slow = 0;
    for (size_t i = 0; i < hs.r.n_recs; i++)
        if (hs.reload_us[i] > 0 && hs.r.recs[i].first_token_us >= 0)
            mean_slow += ttft_us(&hs.r.recs[i]) / hs.n_reloaded;
    cr_expect_gt(fh.copy_wait_ms, f.copy_wait_ms,
                 "copies waited %.2f ms on the slow host, %.2f ms on the fast one", fh.copy_wait_ms,
                 f.copy_wait_ms);
    cr_expect_gt(
        mean_slow, mean_fast,
        "reloaded requests' mean TTFT %.0f µs with the slow host, %.0f µs with the fast one",
        mean_slow, mean_fast);

    /* a disk slower than recomputing: never reloaded from */
    run_tiers(&t, p, &slow_disk, &ds);
    sim_prefix_figures fd;
    sim_prefix_figures_of(&ds.r, &fd);
    cr_expect_eq(fd.reloaded_blocks[SCHED_POOL_DISK], 0, "%llu blocks reloaded from the slow disk",
                 (unsigned long long)fd.reloaded_blocks[SCHED_POOL_DISK]);
    cr_expect_eq(fd.hit_tokens_tier[SCHED_POOL_DISK], 0);
    cr_expect_gt(fd.reloaded_blocks[SCHED_POOL_HOST], 0, "the host tier still serves");

    sim_run_free(&a.r);
    sim_run_free(&b.r);
    sim_run_free(&hs.r);
    sim_run_free(&ds.r);
    sched_policy_free(p);
    sim_trace_free(&t);
}

/* The CLI's tier what-ifs (ringlmd's option names): a small device pool with host and disk
 * tiers reloads from host and from a fast disk; a disk slower than recomputing is reloaded
 * from less, its runs recomputed instead (or never reloaded); a bad value is refused. */
Test(sim_prefix, cli_tier_what_ifs)
{
    double rel[2][SCHED_POOL__COUNT], rec[2][SCHED_POOL__COUNT]; /* [slow, fast disk][pool] */
    const char *bw[2] = {"2e9",
                         "2e10"}; /* a 2 MiB block: 1 ms or 0.1 ms, against 0.46 ms to recompute */
    for (int k = 0; k < 2; k++) {
        char args[512];
        snprintf(args, sizeof args,
                 "--workload shared-prefix --param n=80 --prefix-report --kv-blocks 256 "
                 "--host-kv-blocks 256 --disk-kv-blocks 4096 --disk-kv-bw %s",
                 bw[k]);
        json_t *j = sim_json(args);
        json_t *pc = json_object_get(json_object_get(j, "on"), "prefix_cache");
        cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "on"), "device_blocks")),
                     256);
        for (int p = SCHED_POOL_HOST; p < SCHED_POOL__COUNT; p++) {
            const char *nm = sched_pool_name((sched_pool)p);
            rel[k][p] = (double)json_integer_value(
                json_object_get(json_object_get(pc, "reloaded_blocks"), nm));
            rec[k][p] = (double)json_integer_value(
                json_object_get(json_object_get(pc, "recomputed_blocks"), nm));
        }
        cr_expect_gt(json_real_value(json_object_get(pc, "copy_wait_ms")), 0);
        json_decref(j);
    }
    cr_expect_gt(rel[0][SCHED_POOL_HOST], 0, "nothing reloaded from host");
    cr_expect_gt(rel[1][SCHED_POOL_DISK], 0, "the fast disk was never reloaded from");
    cr_expect_lt(rel[0][SCHED_POOL_DISK], rel[1][SCHED_POOL_DISK],
                 "the slow disk was reloaded from %g blocks, the fast one %g",
                 rel[0][SCHED_POOL_DISK], rel[1][SCHED_POOL_DISK]);
    cr_expect(rel[0][SCHED_POOL_DISK] == 0 || rec[0][SCHED_POOL_DISK] > rec[1][SCHED_POOL_DISK],
              "the slow disk: %g blocks reloaded, %g recomputed instead (fast: %g)",
              rel[0][SCHED_POOL_DISK], rec[0][SCHED_POOL_DISK], rec[1][SCHED_POOL_DISK]);
    cr_expect_eq(
        sim_status("--workload shared-prefix --prefix-report --disk-kv-bw fast 2>/dev/null"), 2,
        "a bad bandwidth was accepted");
    cr_expect_eq(sim_status("--workload shared-prefix --prefix-report --kv-blocks 0 2>/dev/null"),
                 2, "a device pool of 0 blocks was accepted");
}

/* ---- the capacity sweep over device + host + disk ----------------------------------------- */

#define SW_MAX 4 /* sizes per pool in a sweep below */

typedef struct sweep_grid {
    uint32_t dev[SW_MAX], host[SW_MAX], disk[SW_MAX];
    int nd, nh, nk;
    double hit[SW_MAX][SW_MAX][SW_MAX]; /* [host][disk][device]: prompt hit rate */
    double on_device[SW_MAX][SW_MAX]
                    [SW_MAX]; /* share of the cross-request hits found on the device */
    uint64_t demoted[SW_MAX][SW_MAX][SW_MAX]; /* blocks demoted to host and disk */
} sweep_grid;

static int index_of(const uint32_t *v, int n, json_int_t x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x) return i;
    cr_assert_fail("size %lld is not one of the sweep's", (long long)x);
    return -1;
}

/* Runs src (--trace FILE or --workload ...) with the sweep g's sizes: every point, read back
 * by the sizes it reports. */
static void sweep_run(const char *src, sweep_grid *g)
{
    char args[1024];
    const uint32_t *lists[3] = {g->dev, g->host, g->disk};
    const int ns[3] = {g->nd, g->nh, g->nk};
    const char *opt[3] = {"", "-host", "-disk"};
    size_t n = (size_t)snprintf(args, sizeof args, "%s --prefix-report", src);
    for (int w = 0; w < 3; w++) {
        n += (size_t)snprintf(args + n, sizeof args - n, " --capacity-sweep%s ", opt[w]);
        for (int i = 0; i < ns[w]; i++)
            n += (size_t)snprintf(args + n, sizeof args - n, "%s%u", i ? "," : "", lists[w][i]);
    }
    cr_assert_lt(n, sizeof args);
    json_t *j = sim_json(args);
    json_t *sw = json_object_get(j, "capacity_sweep");
    cr_assert_eq(json_array_size(sw), (size_t)(g->nd * g->nh * g->nk),
                 "every combination of the three lists runs");
    size_t i;
    json_t *pt;
    json_array_foreach(sw, i, pt)
    {
        int d = index_of(g->dev, g->nd, json_integer_value(json_object_get(pt, "device_blocks")));
        int h = index_of(g->host, g->nh, json_integer_value(json_object_get(pt, "host_blocks")));
        int k = index_of(g->disk, g->nk, json_integer_value(json_object_get(pt, "disk_blocks")));
        json_t *pc = json_object_get(pt, "prefix_cache");
        g->hit[h][k][d] = json_real_value(json_object_get(pc, "prompt_hit_rate"));
        g->on_device[h][k][d] =
            json_real_value(json_object_get(json_object_get(pt, "cross_share_by_tier"), "device"));
        json_t *dem = json_object_get(pc, "demoted_blocks");
        g->demoted[h][k][d] = (uint64_t)(json_integer_value(json_object_get(dem, "host")) +
                                         json_integer_value(json_object_get(dem, "disk")));
    }
    json_decref(j);
}

/* What a user sizing the tiers from the sweep relies on, on one workload:
 *   - more host or disk blocks never lower the hit rate.  Not exactly: a demotion's copy holds
 *     the step, and whether a block is demoted or dropped depends on the link's queue, so a
 *     bigger tier shifts which blocks survive; seen up to 0.9 points lower (a disk tier added
 *     behind a large host tier), so 1 point is allowed;
 *   - the tiers pay where the device is small: at the smallest device pool the biggest host
 *     and disk find at least `gain` more of the prompt tokens than the device alone;
 *   - as the device shrinks, the hits move to the slower tiers: the share of cross-request
 *     hits found on the device never grows, for every host and disk size with a tier. */
static void sweep_expect_monotone(const sweep_grid *g, double gain)
{
    for (int d = 0; d < g->nd; d++)
        for (int h = 0; h < g->nh; h++)
            for (int k = 0; k < g->nk; k++) {
                if (h + 1 < g->nh)
                    cr_expect_geq(
                        g->hit[h + 1][k][d], g->hit[h][k][d] - 0.01,
                        "device %u disk %u: host %u -> %u blocks lowered the hit rate %.4f -> %.4f",
                        g->dev[d], g->disk[k], g->host[h], g->host[h + 1], g->hit[h][k][d],
                        g->hit[h + 1][k][d]);
                if (k + 1 < g->nk)
                    cr_expect_geq(
                        g->hit[h][k + 1][d], g->hit[h][k][d] - 0.01,
                        "device %u host %u: disk %u -> %u blocks lowered the hit rate %.4f -> %.4f",
                        g->dev[d], g->host[h], g->disk[k], g->disk[k + 1], g->hit[h][k][d],
                        g->hit[h][k + 1][d]);
                if (d + 1 < g->nd && (g->host[h] || g->disk[k]))
                    cr_expect_leq(g->on_device[h][k][d], g->on_device[h][k][d + 1],
                                  "host %u disk %u: device %u -> %u blocks, hits found on the "
                                  "device %.3f -> %.3f",
                                  g->host[h], g->disk[k], g->dev[d + 1], g->dev[d],
                                  g->on_device[h][k][d + 1], g->on_device[h][k][d]);
            }
    int H = g->nh - 1, K = g->nk - 1;
    cr_expect_geq(g->hit[H][K][0], g->hit[0][0][0] + gain,
                  "device %u: host %u + disk %u find %.3f, the device alone %.3f", g->dev[0],
                  g->host[H], g->disk[K], g->hit[H][K][0], g->hit[0][0][0]);
    cr_expect_lt(g->on_device[H][K][0], 0.75,
                 "device %u with tiers: %.3f of the hits still on the device", g->dev[0],
                 g->on_device[H][K][0]);
    cr_expect_gt(g->demoted[H][K][0], 0, "nothing was demoted");
    for (int d = 0; d < g->nd; d++)
        cr_expect_eq(g->demoted[0][0][d], 0, "device %u without tiers demoted blocks", g->dev[d]);
}

Test(sim_prefix, capacity_sweep_over_the_tiers_on_the_shared_prefix_workload)
{
    /* every prompt fits the smallest device pool (none is refused) */
    sweep_grid g = {.dev = {96, 128, 256, 512},
                    .nd = 4,
                    .host = {0, 256, 1024},
                    .nh = 3,
                    .disk = {0, 4096},
                    .nk = 2};
    sweep_run("--workload shared-prefix --param n=120 --seed 1", &g);
    sweep_expect_monotone(&g, 0.15);
}

/* A Mooncake trace (hash_ids, 512-token blocks): conversations that extend their last prompt
 * by a block, over four shared system blocks and some one-off ones. */
Test(sim_prefix, capacity_sweep_over_the_tiers_on_a_trace_with_block_hashes)
{
    char path[] = "/tmp/ringlm-test-sweep-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    uint64_t conv[64][8], x = 12345, next = 1000, t = 0;
    int n_conv = 0, len[64];
#define LCG() ((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33)
    for (int i = 0; i < 200; i++) {
        t += 50 + LCG() % 400;
        uint64_t r = LCG() % 10;
        uint64_t *ids;
        int n;
        if (n_conv && r < 5) { /* a conversation's next turn: one more block */
            int c = (int)(LCG() % (uint64_t)n_conv);
            if (len[c] < 8) conv[c][len[c]++] = next++;
            ids = conv[c];
            n = len[c];
        } else { /* a new one: a system block (a one-off one in 10), its first block */
            int c = n_conv < 64 ? n_conv++ : (int)(LCG() % 64);
            conv[c][0] = r < 9 ? 1 + LCG() % 4 : 100 + LCG() % 1000;
            conv[c][1] = next++;
            len[c] = 2;
            ids = conv[c];
            n = 2;
        }
        if (n > 6) n = 6;
        fprintf(
            f,
            "{\"timestamp\": %llu, \"input_length\": %d, \"output_length\": %llu, \"hash_ids\": [",
            (unsigned long long)t, n * 512 - 100, (unsigned long long)(20 + LCG() % 100));
        for (int k = 0; k < n; k++) fprintf(f, "%s%llu", k ? ", " : "", (unsigned long long)ids[k]);
        fprintf(f, "]}\n");
    }
#undef LCG
    cr_assert_eq(fclose(f), 0);
    sweep_grid g = {.dev = {256, 512, 1024, 2048},
                    .nd = 4,
                    .host = {0, 512, 8192},
                    .nh = 3,
                    .disk = {0, 16384},
                    .nk = 2};
    char src[128];
    snprintf(src, sizeof src, "--trace %s", path);
    sweep_run(src, &g);
    unlink(path);
    sweep_expect_monotone(&g, 0.15);
}

/* The sweep as a table (a row per point, pools first) and a plot (one curve per host and disk
 * pair); bad host or disk lists, or a sweep without --prefix-report, are refused. */
Test(sim_prefix, capacity_sweep_table_and_plot)
{
    char dir[] = "/tmp/ringlm-test-plot-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char *sim = th_program("ringlm-sim");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s --workload shared-prefix --param n=40 --prefix-report --capacity-sweep 128,512 "
             "--capacity-sweep-host 0,256 --capacity-sweep-disk 0,1024 --plot %s/p 2>/dev/null",
             sim, dir);
    free(sim);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    char line[512];
    int rows = 0, table = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "capacity sweep")) table = 1;
        unsigned dv, h, k;
        if (table && sscanf(line, "%u %u %u", &dv, &h, &k) == 3) {
            cr_expect((dv == 128 || dv == 512) && (h == 0 || h == 256) && (k == 0 || k == 1024),
                      "row: %s", line);
            rows++;
        }
    }
    cr_assert_eq(pclose(f), 0, "%s", cmd);
    cr_expect_eq(rows, 8, "a row per point: %d", rows);
    char path[256];
    snprintf(path, sizeof path, "%s/p/prefix-sweep.dat", dir);
    FILE *d = fopen(path, "r");
    cr_assert_not_null(d, "%s not written", path);
    int groups = 0, points = 0;
    while (fgets(line, sizeof line, d)) {
        if (!strncmp(line, "# host", 6))
            groups++;
        else if (line[0] >= '0' && line[0] <= '9')
            points++;
    }
    fclose(d);
    cr_expect_eq(groups, 4, "a curve per host and disk pair");
    cr_expect_eq(points, 8);
    snprintf(path, sizeof path, "%s/p/prefix-sweep.gp", dir);
    cr_expect(th_exists(path), "%s not written", path);
    snprintf(path, sizeof path, "%s/p/prefix-sweep.png", dir);
    bool png = th_exists(path);
    if (!png) cr_log_info("no %s: gnuplot missing (the data and script are checked)", path);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
    cr_expect_eq(
        sim_status(
            "--workload shared-prefix --prefix-report --capacity-sweep-host 0,x 2>/dev/null"),
        2, "a bad host list was accepted");
    cr_expect_eq(
        sim_status("--workload shared-prefix --prefix-report --capacity-sweep-disk -1 2>/dev/null"),
        2, "a negative disk size was accepted");
    cr_expect_neq(sim_status("--workload shared-prefix --capacity-sweep-host 64 2>/dev/null"), 0,
                  "a sweep without --prefix-report was accepted");
}

/* ---- a replay decides with the recorded run's costs ------------------------------------- */

/* A recorded run (ringlmd's request log) on a 64-block device pool with a 48-block host tier:
 * request 1 caches a 64-token prompt (4 blocks), request 2's 63-block prompt and answer need
 * the whole pool, so request 1's blocks are evicted — demoted to host when the cost model
 * says a reload beats recomputing them, else dropped — and request 3 starts with request 1's
 * prompt.  Each line carries the cost model the recorded scheduler had at its admission
 * (sched_cost) with the host link's measured bandwidth host_bps (16 KiB blocks). */
static void recorded_tier_trace(sim_trace *t, double host_bps, int64_t cached_3)
{
    static char buf[8192];
    char cost[600];
    snprintf(
        cost, sizeof cost,
        "\"sched_cost\":{\"at_us\":%%lld,\"correction\":1,\"step\":{\"base_us\":1000,\"prefill_"
        "token_us\":40,"
        "\"decode_seq_us\":100,\"context_token_us\":0,\"prefill_pair_us\":0},\"host\":{\"out_bytes_"
        "per_s\":%.17g,"
        "\"in_bytes_per_s\":%.17g,\"latency_us\":10,\"out_measured\":true,\"in_measured\":true}}",
        host_bps, host_bps);
    char c1[700], c2[700], c3[700];
    snprintf(c1, sizeof c1, cost, 0LL);
    snprintf(c2, sizeof c2, cost, 200000LL);
    snprintf(c3, sizeof c3, cost, 600000LL);
    int n =
        snprintf(buf, sizeof buf,
                 "{\"req\":1,\"arrival_us\":0,\"prompt_tokens\":64,\"output_tokens\":4,\"finish_"
                 "reason\":\"length\","
                 "\"cached_tokens\":0,\"hash_block_tokens\":16,\"hash_ids\":[11,12,13,14],%s}\n",
                 c1);
    n += snprintf(buf + n, sizeof buf - (size_t)n,
                  "{\"req\":2,\"arrival_us\":200000,\"prompt_tokens\":1008,\"output_tokens\":4,"
                  "\"finish_reason\":\"length\","
                  "\"cached_tokens\":0,\"hash_block_tokens\":16,\"hash_ids\":[");
    for (int i = 0; i < 63; i++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%d", i ? "," : "", 101 + i);
    n += snprintf(buf + n, sizeof buf - (size_t)n, "],%s}\n", c2);
    n += snprintf(
        buf + n, sizeof buf - (size_t)n,
        "{\"req\":3,\"arrival_us\":600000,\"prompt_tokens\":80,\"output_tokens\":4,\"finish_"
        "reason\":\"length\","
        "\"cached_tokens\":%lld,\"hash_block_tokens\":16,\"hash_ids\":[11,12,13,14,15],%s}\n",
        (long long)cached_3, c3);
    cr_assert_lt((size_t)n, sizeof buf);
    sim_trace_init(t, "recorded");
    cr_assert_eq(sim_trace_parse(t, "recorded.jsonl", buf, (size_t)n, SIM_FMT_NATIVE, false), 0,
                 "%s", sim_err());
    cr_assert_eq(t->n_costs, 3, "the cost records were not read");
}

/* The replay's request 3: its cached tokens, and how long after its arrival its first token came.
 * With the recorded costs, the replay's own request log gives each request the cost model it
 * was admitted with — the recorded one, host_bps its host link — so a replay of the replay
 * decides the same way. */
static void replay_recorded(const sim_trace *t, const sim_service *svc, bool recorded,
                            int64_t *cached, int64_t *ttft_us, double host_bps)
{
    sched_policy *p = policy_text("");
    sim_options o;
    sim_options_defaults(&o);
    o.policy = p;
    o.policy_name = "test";
    o.svc = svc;
    o.check_every = 1;
    o.recorded_costs = recorded;
    sim_run r;
    cr_assert_eq(sim_run_trace(t, &o, &r), 0, "sim_run_trace: %s", sim_err());
    cr_assert_eq(r.still_live, 0);
    const sim_rec *x = &r.recs[r.final_rec[2]];
    *cached = x->cached_tokens;
    *ttft_us = x->first_token_us - t->reqs[2].arrival_us;
    cr_assert_eq(r.final_counts.prefix_hit_tokens, (uint64_t)*cached,
                 "only request 3 can find anything cached");
    if (recorded) {
        FILE *f = tmpfile();
        cr_assert_not_null(f);
        cr_assert_eq(sim_report_request_log(f, &r), 0, "%s", sim_err());
        rewind(f);
        static char line[8192];
        int n = 0;
        while (fgets(line, sizeof line, f)) {
            static fmt_request_text text;
            fmt_request q;
            char why[160];
            cr_assert_eq(fmt_request_parse(line, strlen(line) - 1, &q, &text, why, sizeof why), 0,
                         "%s: %s", why, line);
            cr_assert_not_null(q.sched_cost, "no sched_cost: %s", line);
            cr_expect_eq(q.sched_cost->host.in_bytes_per_s, host_bps, "%s", line);
            cr_expect(q.sched_cost->host.in_measured, "%s", line);
            cr_expect_eq(q.sched_cost->prefill_token_us, 40, "%s", line);
            n++;
        }
        fclose(f);
        cr_assert_eq(n, 3);
    }
    sim_run_free(&r);
    sched_policy_free(p);
}

/* The recorded run measured its host link at 1 kB/s (a reload of a block: 16 s against a
 * 640 µs recompute), so it dropped request 1's blocks and request 3 found nothing, while the
 * simulator's own link (100 MB/s) would demote and reload them: the replay finds what the
 * recorded run found (0 tokens), and only with the recorded costs.  The other way round — a
 * recorded 1 GB/s link where the simulator's own is 1 kB/s — the replay demotes and reloads
 * request 1's 64 tokens as the recorded run did, and the copy takes the recorded link's time,
 * not the 16 s per block the simulator's link would. */
Test(sim_prefix, a_replay_decides_and_copies_with_the_recorded_costs)
{
    sim_service fast, slow;
    tier_service(&fast, 1e8, 1e8);
    tier_service(&slow, 1e3, 1e3);
    fast.kv_blocks_disk = slow.kv_blocks_disk = 0;
    sim_trace t;
    int64_t cached, ttft;

    recorded_tier_trace(&t, 1e3, 0);
    replay_recorded(&t, &fast, true, &cached, &ttft, 1e3);
    cr_expect_eq(cached, 0,
                 "the recorded run dropped request 1's blocks; the replay found %lld tokens cached",
                 (long long)cached);
    replay_recorded(&t, &fast, false, &cached, &ttft, 0);
    cr_expect_eq(
        cached, 64,
        "with its own costs the simulator reloads request 1's 4 blocks (found %lld tokens)",
        (long long)cached);
    sim_trace_free(&t);

    recorded_tier_trace(&t, 1e9, 64);
    replay_recorded(&t, &slow, true, &cached, &ttft, 1e9);
    cr_expect_eq(
        cached, 64,
        "the recorded run reloaded request 1's 4 blocks; the replay found %lld tokens cached",
        (long long)cached);
    cr_expect_lt(
        ttft, 100000,
        "request 3's first token %lld µs after its arrival: its reload took the simulator's "
        "link time, not the recorded run's",
        (long long)ttft);
    replay_recorded(&t, &slow, false, &cached, &ttft, 0);
    cr_expect_eq(
        cached, 0,
        "with its own 1 kB/s link the simulator drops request 1's blocks (found %lld tokens)",
        (long long)cached);
    sim_trace_free(&t);
}
