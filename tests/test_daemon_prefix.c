/* SPDX-License-Identifier: MIT */
/*
 * ringlmd end to end, the prefix cache on the device: greedy outputs equal those with the
 * cache off, domains isolate tenants, the request log and finish events carry cached
 * tokens, forced key collisions never reuse a wrong block, kill -9 and cancel mid-prefill of
 * sharing requests leak nothing, preemption of shared blocks keeps the tokens. A real daemon
 * process on a private socket, real client processes (fork + libringlm)
 * (tests/daemon_helpers.h); every test stops every process it starts and checks that every
 * KV block is accounted for.
 *
 * Env: RINGLM_BIN (programs, default build/bin), RINGLM_SHARED (default ../shared).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "ringlm.h"
#include "formats/stats.h"
#include "shm/ring.h"
#include "shm/wire.h"
#include "tests/daemon_helpers.h"
#include "tests/helpers.h"
#include "tools/prom.h"

TestSuite(daemon_prefix, .timeout = 120);

/* ---- prefix cache ---------------------------------------------------------------------- */

/* Prompts that share a long prefix: PX_N of them, 24 new tokens each. */
#define PX_N 4

static void run_prefix_client(const char *model, const char *const *extra, seq_job *g, dmn *d)
{
    dmn_start(d, model, NULL, extra);
    g->sock = d->sock;
    int st = reap(spawn(client_sequential, g), 60000);
    cr_assert_eq(st, 0, "prefix client exit %d", st);
    assert_back_to_baseline(d, 5000);
}

/* Greedy output with the prefix cache on equals output with it off; the later prompts were
 * served from the cache (decision log cache_hit; the stats' pools back to baseline; no block
 * leaked, reference counts checked by the scheduler's invariants in the stats file). */
Test(daemon_prefix, prefix_cache_greedy_output_equals_cache_off)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    static ref_case cases[12];
    int n = load_refs(cases, 12);
    if (n < 2) cr_skip_test("reference-greedy.json not found");
    /* a natural 56-token prefix (a reference prompt and its greedy continuation), then each
     * prompt's own ending taken from another reference case */
    int32_t pre[56];
    uint32_t np = 0;
    for (uint32_t k = 0; k < cases[0].n_prompt && np < 56; k++) pre[np++] = cases[0].prompt[k];
    for (uint32_t k = 0; np < 56; k++) pre[np++] = cases[0].gen[k % cases[0].n_gen];
    static seq_job g;
    memset(&g, 0, sizeof g);
    g.n = PX_N;
    g.max_new = 24;
    for (int i = 0; i < PX_N; i++) {
        memcpy(g.prompt[i], pre, sizeof pre);
        g.n_prompt[i] = 56;
        const ref_case *o = &cases[(i + 1) % n];
        for (uint32_t k = 0; k < o->n_prompt && g.n_prompt[i] < 70; k++)
            g.prompt[i][g.n_prompt[i]++] = o->prompt[k];
        g.prompt[i][g.n_prompt[i]++] = (int32_t)(i + 1); /* no two prompts equal */
    }
    dmn off, on;
    char out_off[160], out_on[160];
    static const char *const no_cache[] = {"--no-prefix-cache", "--metrics", "127.0.0.1:0", NULL};
    static const char *const with_metrics[] = {"--metrics", "127.0.0.1:0", NULL};
    snprintf(out_off, sizeof out_off, "/tmp/ringlm-px-off-%d.txt", (int)getpid());
    snprintf(out_on, sizeof out_on, "/tmp/ringlm-px-on-%d.txt", (int)getpid());
    g.out = out_off;
    run_prefix_client(model, no_cache, &g, &off);
    int off_port = dmn_metrics_port(&off);
    cr_assert_gt(off_port, 0, "no 'metrics on port' line in the daemon's stderr");
    int off_status = 0;
    char *off_body = th_http_get(off_port, "/metrics", &off_status, NULL, 0);
    cr_assert(off_body && off_status == 200);
    cr_expect(strstr(off_body,
                     "\nvllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"False\","),
              "--no-prefix-cache: %s",
              strstr(off_body, "vllm:cache_config_info{")
                  ? strstr(off_body, "vllm:cache_config_info{")
                  : "no vllm:cache_config_info");
    cr_expect_eq(prom_value(off_body, "ringlm_prefix_cache_blocks{tier=\"device\"}"), 0,
                 "--no-prefix-cache kept blocks");
    free(off_body);
    cr_assert_eq(dmn_stop(&off, SIGTERM, 10000), 0);
    g.out = out_on;
    run_prefix_client(model, with_metrics, &g, &on);
    /* the names fleet routers read: tokens looked up and tokens found cached */
    int port = dmn_metrics_port(&on);
    cr_assert_gt(port, 0, "no 'metrics on port' line in the daemon's stderr");
    double queried = 0, want_q = 0, hit = -1;
    for (int i = 0; i < PX_N; i++) want_q += g.n_prompt[i];
    for (uint64_t deadline = th_now_ms() + 5000;;) { /* published every few ms */
        int status = 0;
        char *body = th_http_get(port, "/metrics", &status, NULL, 0);
        if (body && status == 200) {
            queried = prom_value(body, "vllm:prefix_cache_queries_total");
            hit = prom_value(body, "vllm:prefix_cache_hits_total");
        }
        free(body);
        if (queried == want_q && hit == 48.0 * (PX_N - 1)) break;
        if (th_now_ms() > deadline) break;
        th_pause_ms(2);
    }
    cr_expect_eq(queried, want_q, "vllm:prefix_cache_queries_total %g, prompts held %g tokens",
                 queried, want_q);
    cr_expect_eq(hit, 48.0 * (PX_N - 1), "vllm:prefix_cache_hits_total %g", hit);
    /* every request has ended: vllm:kv_cache_usage_perc keeps vLLM's meaning (blocks that
     * sequences hold: none), the blocks kept — the shared 3 and each request's own full
     * blocks whose KV was computed (its last token is never fed back) — are reported apart,
     * and the cache's configuration is where vLLM's is */
    double cached = 3;
    for (int i = 0; i < PX_N; i++) cached += (g.n_prompt[i] + g.max_new - 1) / 16 - 3;
    char *body = NULL;
    for (uint64_t deadline = th_now_ms() + 5000;;) { /* a snapshot after the last release */
        int status = 0;
        free(body);
        body = th_http_get(port, "/metrics", &status, NULL, 0);
        cr_assert(body && status == 200);
        if (prom_value(body, "vllm:kv_cache_usage_perc") == 0 &&
            prom_value(body, "ringlm_prefix_cache_blocks{tier=\"device\"}") == cached)
            break;
        if (th_now_ms() > deadline) break;
        th_pause_ms(2);
    }
    cr_expect_eq(prom_value(body, "vllm:kv_cache_usage_perc"), 0,
                 "usage counts cached blocks no sequence holds");
    cr_expect_eq(prom_value(body, "ringlm_prefix_cache_blocks{tier=\"device\"}"), cached,
                 "cached device blocks (%g expected)", cached);
    char cfg_line[160];
    snprintf(cfg_line, sizeof cfg_line,
             "\nvllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"True\",num_gpu_"
             "blocks=\"%lld\",",
             (long long)prom_value(body, "ringlm_kv_blocks_total{tier=\"device\"}"));
    cr_expect(strstr(body, cfg_line), "no '%s' in %s", cfg_line + 1,
              strstr(body, "vllm:cache_config_info{") ? strstr(body, "vllm:cache_config_info{")
                                                      : "(none)");
    free(body);
    cr_assert_eq(dmn_stop(&on, SIGTERM, 10000), 0);
    char *a = slurp(out_off), *b = slurp(out_on);
    cr_assert(a && b);
    cr_expect_str_eq(b, a, "tokens with the cache on differ from the cache off");
    cr_expect_eq(count_lines(off.declog, "\"ev\":\"cache_hit\""), 0, "--no-prefix-cache still hit");
    int hits = count_lines(on.declog, "\"ev\":\"cache_hit\"");
    cr_expect_eq(hits, PX_N - 1, "every prompt after the first found the shared prefix (%d hits)",
                 hits);
    cr_expect_geq(count_lines(on.declog, "\"cached_tokens\":48"), PX_N - 1,
                  "48 tokens (3 blocks of 16) cached");
    /* the request log carries each prompt's block keys: the simulator replaying it shares the
     * same prefixes and finds the hits the daemon's metrics counted */
    cr_expect_eq(count_lines(on.reqlog, "\"hash_ids\":["), PX_N,
                 "request log lines without block keys");
    json_t *pc, *sj = sim_replay(on.reqlog, NULL, &pc);
    cr_expect_eq((double)json_integer_value(json_object_get(pc, "hit_tokens")), hit,
                 "replayed hits %lld, the daemon's %g",
                 (long long)json_integer_value(json_object_get(pc, "hit_tokens")), hit);
    json_decref(sj);
    free(a);
    free(b);
    unlink(out_off);
    unlink(out_on);
    dmn_cleanup(&off);
    dmn_cleanup(&on);
}

/* Every reference case (run.c's greedy tokens) through the daemon with the prefix cache on,
 * twice, on 4-token blocks: the second time each case's prompt is found cached (the first
 * pass computed it; its blocks shared by the cases with the same prompt), prefill starts
 * after the cached blocks, and every token still equals the reference. */
Test(daemon_prefix, prefix_cache_every_reference_case_equals_run_c_with_its_prompt_cached)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    static ref_case cases[12];
    int n = load_refs(cases, 12);
    if (n == 0) cr_skip_test("reference-greedy.json not found");
    int long_prompts = 0; /* cases with a full block before the last prompt token */
    for (int i = 0; i < n; i++) long_prompts += (cases[i].n_prompt - 1) / 4 > 0;
    cr_assert_gt(long_prompts, 0, "no reference prompt spans a block of 4");
    static const char *const flags[] = {"--kv-block-size", "4", "--kv-blocks", "2048", NULL};
    dmn d;
    dmn_start(&d, model, NULL, flags);
    gen_job g = {.sock = d.sock, .cases = cases, .n_cases = n};
    cr_assert_eq(reap(spawn(client_greedy, &g), 60000), 0,
                 "first pass: tokens differ from the reference");
    int first = count_lines(d.declog, "\"ev\":\"cache_hit\"");
    cr_assert_eq(reap(spawn(client_greedy, &g), 60000), 0,
                 "second pass, prompts cached: tokens differ from the reference");
    assert_back_to_baseline(&d, 5000);
    cr_assert_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    int hits = count_lines(d.declog, "\"ev\":\"cache_hit\"") - first;
    cr_log_info("reference cases: %d with a cached block possible, %d hits on the second pass",
                long_prompts, hits);
    cr_expect_eq(hits, long_prompts,
                 "second pass: %d cache hits, %d prompts had a cached block to find", hits,
                 long_prompts);
    dmn_cleanup(&d);
}

/* Cache domains through the daemon: the same prompt sent as several tenants (tags from this
 * test's own uid, trusted in the policy), one after another.  Tenants in their own domains
 * never hit each other's blocks; tenants the policy puts in one domain do; a tenant's
 * max_cached_blocks bounds what it keeps. */
typedef struct dom_job {
    const char *sock;
    const char *tags[8];
    int n;
    int32_t prompt[52];
} dom_job;

static int client_domains(void *arg)
{
    dom_job *g = arg;
    ringlm_client *c = client_connect(g->sock);
    if (!c) return 2;
    for (int i = 0; i < g->n; i++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = g->prompt;
        r.n_prompt = 52;
        r.max_new_tokens = 4;
        r.tenant_tag = g->tags[i];
        uint64_t id;
        int rc = client_submit(c, &r, &id);
        if (!rc) rc = client_follow(c, id, NULL, NULL, NULL, 0, NULL);
        if (rc) return rc;
    }
    ringlm_close(c);
    return 0;
}

/* cache_hit lines of the decision log, in order, as "tenant:cached_tokens" words */
static void cache_hits(const char *declog, char *out, size_t cap)
{
    FILE *f = fopen(declog, "r");
    cr_assert_not_null(f, "no decision log %s", declog);
    char line[4096];
    size_t used = 0;
    out[0] = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"ev\":\"cache_hit\"")) continue;
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        cr_assert_not_null(j, "decision log line is not JSON: %s", line);
        int n = snprintf(out + used, cap - used, "%s%s:%lld", used ? " " : "",
                         json_string_value(json_object_get(j, "tenant")),
                         (long long)json_integer_value(json_object_get(j, "cached_tokens")));
        if (n > 0 && (size_t)n < cap - used) used += (size_t)n;
        json_decref(j);
    }
    fclose(f);
}

Test(daemon_prefix, prefix_cache_domains_isolate_tenants_unless_the_policy_groups_them)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    char policy[1024];
    snprintf(
        policy, sizeof policy,
        "[scheduler]\nmode = token_budget\ndefault_tenant = a\n"
        "[tenant a]\n[tenant b]\n[tenant c]\ncache_domain = gw\n[tenant d]\ncache_domain = gw\n"
        "[tenant e]\nmax_cached_blocks = 1\n"
        "[trust]\nuids = %u\n",
        (unsigned)getuid());
    dmn d;
    dmn_start(&d, model, policy, NULL);
    static dom_job g;
    memset(&g, 0, sizeof g);
    g.sock = d.sock;
    for (int k = 0; k < 52; k++) g.prompt[k] = 3 + (7 * k) % 400;
    static const char *const order[] = {"a", "b", "c", "d", "b", "a", "e", "e"};
    g.n = 8;
    for (int i = 0; i < g.n; i++) g.tags[i] = order[i];
    int st = reap(spawn(client_domains, &g), 60000);
    cr_assert_eq(st, 0, "client exit %d", st);
    assert_back_to_baseline(&d, 5000);
    cr_assert_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    char hits[512];
    cache_hits(d.declog, hits, sizeof hits);
    /* a, b, c: first in their domains, no hit although the same 48 tokens were cached by
     * another tenant; d: c's blocks (domain gw); b and a again: their own earlier blocks;
     * e (cap 1 block): one block of its first prompt was kept */
    cr_expect_str_eq(hits, "d:48 b:48 a:48 e:16", "cache_hit events (tenant:tokens): %s", hits);
    cr_expect_geq(count_lines(d.declog, "\"reason\":\"tenant_cap\""), 1, "e's cap evicted nothing");
    dmn_cleanup(&d);
}

/* Lines of a JSON-lines file containing needle: their "req" and the integer under key (-1 when
 * the key is absent), in file order.  Returns how many. */
static int jl_req_values(const char *path, const char *needle, const char *key, uint64_t *req,
                         long long *val, int max)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no file %s", path);
    static char line[1 << 14];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        if (needle && !strstr(line, needle)) continue;
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        cr_assert_not_null(j, "%s: line is not JSON: %s", path, line);
        json_t *v = json_object_get(j, key);
        req[n] = (uint64_t)json_integer_value(json_object_get(j, "req"));
        val[n] = json_is_integer(v) ? (long long)json_integer_value(v) : -1;
        n++;
        json_decref(j);
    }
    fclose(f);
    return n;
}

/* The request log carries each request's cached prompt tokens: the same prompt sent twice, one
 * after the other — the first logs 0, the second the hit its cache_hit event reported (also on
 * its finish event); replaying that log in ringlm-sim reads the field back (the recorded hits
 * next to the replay's own) and the simulator's request log writes its own, equal. */
Test(daemon_prefix, request_log_records_the_cached_tokens_of_each_request)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    dmn d;
    dmn_start(&d, model, NULL, NULL);
    static dom_job g;
    memset(&g, 0, sizeof g);
    g.sock = d.sock;
    for (int k = 0; k < 52; k++) g.prompt[k] = 5 + (11 * k) % 300;
    g.n = 2; /* no tenant tags: both are this uid's tenant */
    int st = reap(spawn(client_domains, &g), 60000);
    cr_assert_eq(st, 0, "client exit %d", st);
    assert_back_to_baseline(&d, 5000);
    cr_assert_eq(dmn_stop(&d, SIGTERM, 10000), 0);

    uint64_t hreq[4], freq[4], lreq[4];
    long long hit[4], fin[4], logged[4];
    cr_assert_eq(jl_req_values(d.declog, "\"ev\":\"cache_hit\"", "cached_tokens", hreq, hit, 4), 1,
                 "one cache_hit: the second request");
    cr_assert_gt(hit[0], 0);
    int nf = jl_req_values(d.declog, "\"ev\":\"finish\"", "cached_tokens", freq, fin, 4);
    cr_assert_eq(nf, 2);
    int nl = jl_req_values(d.reqlog, NULL, "cached_tokens", lreq, logged, 4);
    cr_assert_eq(nl, 2, "request log lines: %d", nl);
    uint64_t first = lreq[0] < lreq[1] ? lreq[0] : lreq[1],
             second = lreq[0] < lreq[1] ? lreq[1] : lreq[0];
    cr_assert_eq(hreq[0], second, "the hit was the second request's");
    for (int i = 0; i < 2; i++) {
        if (lreq[i] == first)
            cr_expect_eq(logged[i], 0, "first request logs cached_tokens %lld", logged[i]);
        else
            cr_expect_eq(logged[i], hit[0], "second request logs %lld, its cache_hit said %lld",
                         logged[i], hit[0]);
        if (freq[i] == second)
            cr_expect_eq(fin[i], hit[0], "finish event of the second: %lld", fin[i]);
        else
            cr_expect_eq(fin[i], -1, "finish event of the first carries cached_tokens %lld",
                         fin[i]);
    }

    char simlog[256], args[300];
    snprintf(simlog, sizeof simlog, "%s/sim-requests.jsonl", d.dir);
    snprintf(args, sizeof args, "--request-log %s", simlog);
    json_t *pc, *sj = sim_replay(d.reqlog, args, &pc);
    cr_expect_eq(json_integer_value(json_object_get(pc, "recorded_hit_tokens")), hit[0],
                 "the replay read back %lld recorded cached tokens, the daemon logged %lld",
                 (long long)json_integer_value(json_object_get(pc, "recorded_hit_tokens")), hit[0]);
    cr_expect_eq(json_integer_value(json_object_get(pc, "hit_tokens")), hit[0],
                 "the replay found %lld",
                 (long long)json_integer_value(json_object_get(pc, "hit_tokens")));
    json_decref(sj);
    uint64_t sreq[4];
    long long sval[4];
    cr_assert_eq(jl_req_values(simlog, NULL, "cached_tokens", sreq, sval, 4), 2);
    long long lo = sval[0] < sval[1] ? sval[0] : sval[1],
              hi = sval[0] < sval[1] ? sval[1] : sval[0];
    cr_expect(lo == 0 && hi == hit[0], "the simulator's request log: cached_tokens %lld and %lld",
              sval[0], sval[1]);
    unlink(simlog);
    dmn_cleanup(&d);
}

/* The cached-token count reaches the client: every FINISH carries n_cached_tokens, the prompt
 * tokens its request's first admission found in the prefix cache — what the request log and
 * the decision log's finish event say for that request.  One tenant sends a 44-token prompt
 * twice (8-token blocks: 5 full blocks, 40 tokens, can be found), then once more with a
 * max_new_tokens no context holds (rejected at admission), then `ringlm generate --stats`
 * sends it once more; with --no-prefix-cache every count is 0. */
#define FC_PROMPT 44
#define FC_BLOCK  8
typedef struct fc_job {
    const char *sock, *out;
    int32_t prompt[FC_PROMPT];
} fc_job;

static int client_finish_cached(void *arg)
{
    fc_job *g = arg;
    ringlm_client *c = client_connect(g->sock);
    if (!c) return 2;
    FILE *f = fopen(g->out, "w");
    if (!f) return 3;
    static const uint32_t max_new[] = {4, 4, 1u << 20};
    for (int i = 0; i < 3; i++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = g->prompt;
        r.n_prompt = FC_PROMPT;
        r.max_new_tokens = max_new[i];
        uint64_t id;
        ringlm_event fin;
        int rc = client_submit(c, &r, &id);
        if (!rc) rc = client_follow(c, id, NULL, NULL, NULL, 0, &fin);
        if (rc) return rc;
        fprintf(f, "%s %u\n", ringlm_reason_name(fin.finish_reason), fin.n_cached_tokens);
    }
    fclose(f);
    ringlm_close(c);
    return 0;
}

/* `ringlm generate --stats` of the job's prompt: the cached count its summary line prints. */
static long long cli_generate_cached(const char *sock, const fc_job *g)
{
    char ids[FC_PROMPT * 6] = "";
    for (int k = 0; k < FC_PROMPT; k++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", k ? "," : "", g->prompt[k]);
    char *ringlm = th_path(th_bin_dir(), "ringlm");
    char *argv[] = {ringlm, "--socket",     (char *)sock, "generate", "--prompt-ids",
                    ids,    "--max-tokens", "4",          "--stats",  NULL};
    char *out, *err;
    cr_assert_eq(th_run(argv, &out, &err, 60), 0, "ringlm generate: %s", err);
    const char *p = strstr(err, " prompt tokens (");
    long long cached = -1;
    cr_assert(p && sscanf(p, " prompt tokens (%lld cached)", &cached) == 1,
              "no cached count in generate --stats: %s", err);
    free(out);
    free(err);
    free(ringlm);
    return cached;
}

static void finish_cached_tokens(bool cache_on)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    const char *on[] = {"--kv-block-size", "8", NULL};
    const char *off[] = {"--kv-block-size", "8", "--no-prefix-cache", NULL};
    dmn d;
    static fc_job g;
    memset(&g, 0, sizeof g);
    for (int k = 0; k < FC_PROMPT; k++) g.prompt[k] = 3 + (13 * k) % 250;
    dmn_start_for(&d, model, NULL, cache_on ? on : off, &g.sock, &g.out);
    dmn_run_client(&d, client_finish_cached, &g, "finish-cached client");
    long long cli = cli_generate_cached(d.sock, &g);
    assert_back_to_baseline(&d, 5000);
    char *got = dmn_stop_output(&d);

    const long long full = FC_PROMPT / FC_BLOCK * FC_BLOCK; /* 40 */
    char want[128];
    snprintf(want, sizeof want, "length 0\nlength %lld\nrejected 0\n", cache_on ? full : 0);
    cr_expect_str_eq(got, want, "FINISH events (reason n_cached_tokens), cache %s:\n%s",
                     cache_on ? "on" : "off", got);
    cr_expect_eq(cli, cache_on ? full : 0, "ringlm generate --stats: %lld cached", cli);

    /* the same counts, request by request, in the request log and the decision log */
    uint64_t lreq[8], freq[8];
    long long logged[8], fin[8];
    int nl = jl_req_values(d.reqlog, NULL, "cached_tokens", lreq, logged, 8);
    cr_assert_eq(nl, 4, "request log lines: %d", nl);
    int nf = jl_req_values(d.declog, "\"ev\":\"finish\"", "cached_tokens", freq, fin, 8);
    cr_assert_eq(nf, 3, "finish events (the 3 admitted requests): %d", nf);
    const long long client_saw[4] = {0, cache_on ? full : 0, 0, cli};
    for (int i = 0; i < 4; i++) {
        int rank = 0; /* requests were sent one after another: ids ascend in that order */
        for (int j = 0; j < 4; j++) rank += lreq[j] < lreq[i];
        cr_expect_eq(logged[i], client_saw[rank],
                     "request %d: the request log says %lld, its FINISH %lld", rank, logged[i],
                     client_saw[rank]);
        for (int j = 0; j < nf; j++)
            if (freq[j] == lreq[i])
                cr_expect_eq(fin[j] < 0 ? 0 : fin[j], client_saw[rank],
                             "request %d: the decision log says %lld", rank, fin[j]);
    }
    free(got);
    dmn_cleanup(&d);
}

Test(daemon_prefix, finish_events_carry_the_cached_tokens)
{
    finish_cached_tokens(true);
}
Test(daemon_prefix, finish_events_carry_no_cached_tokens_with_the_cache_off)
{
    finish_cached_tokens(false);
}

/* ---- prefix cache: forced key collisions ---------------------------------------------- */

/* A cached block is used only after its stored token ids compare equal, so a hash
 * collision can never reuse a wrong block.  ringlmd-test --prefix-key=constant gives every block
 * one key, so every block collides with every other, and 1-token blocks put collisions at
 * every position: three greedy reference sequences (A, B, C) share their first token (BOS)
 * and no block after it.  Their first CK_PROMPT tokens are the prompts (one length, one cache
 * domain): A, then B, each its own client process, one after the other; then C and A again
 * in one batch.  Every output equals its reference; the only hits are blocks whose tokens are
 * truly equal (B and C: the BOS block, 1 token; A again: its own 15) in the decision log and
 * the metrics; the pools come back to baseline with the scheduler's invariants (reference
 * counts) checked; the request log keeps content keys (XXH3), so a replay shares what the
 * run shared instead of one key for everything. */
#define CK_PROMPT 16
#define CK_NEW    24

/* Distinct greedy sequences of the reference file cut into a CK_PROMPT-token prompt and its
 * CK_NEW-token continuation (a prefix of a greedy sequence continues as that sequence);
 * returns how many (at most 3) went to out. */
static int collide_refs(const ref_case *all, int n, ref_case *out)
{
    int m = 0;
    for (int i = 0; i < n && m < 3; i++) {
        int32_t seq[CK_PROMPT + CK_NEW];
        uint32_t len = 0;
        for (uint32_t k = 0; k < all[i].n_prompt && len < CK_PROMPT + CK_NEW; k++)
            seq[len++] = all[i].prompt[k];
        for (uint32_t k = 0; k < all[i].n_gen && len < CK_PROMPT + CK_NEW; k++)
            seq[len++] = all[i].gen[k];
        if (len < CK_PROMPT + CK_NEW || all[i].n_prompt > CK_PROMPT) continue;
        bool seen = false;
        for (int j = 0; j < m; j++) seen |= !memcmp(out[j].prompt, seq, CK_PROMPT * sizeof *seq);
        if (seen) continue;
        ref_case *c = &out[m++];
        memset(c, 0, sizeof *c);
        memcpy(c->prompt, seq, CK_PROMPT * sizeof *seq);
        c->n_prompt = CK_PROMPT;
        memcpy(c->gen, seq + CK_PROMPT, CK_NEW * sizeof *seq);
        c->n_gen = c->max_new = CK_NEW;
    }
    return m;
}

Test(daemon_prefix, prefix_cache_forced_key_collisions_never_reuse_a_wrong_block)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    static ref_case all[12], ck[3];
    int n = load_refs(all, 12);
    if (n == 0) cr_skip_test("reference-greedy.json not found");
    cr_assert_eq(collide_refs(all, n, ck), 3,
                 "the reference file has fewer than 3 distinct greedy sequences");
    for (int i = 1; i < 3; i++)
        cr_assert(ck[i].prompt[0] == ck[0].prompt[0] && ck[i].prompt[1] != ck[0].prompt[1] &&
                      ck[i].prompt[1] != ck[3 - i].prompt[1],
                  "the sequences must share token 0 and no more");
    static const char *const flags[] = {
        TH_TEST_BUILD, "--prefix-key", "constant",    "--kv-block-size",
        "1",           "--metrics",    "127.0.0.1:0", NULL};
    dmn d;
    dmn_start(&d, model, NULL, flags);
    cr_expect_eq(count_lines(d.errlog, "warning: --prefix-key=constant"), 1,
                 "no start-up warning for the constant key");

    gen_job a = {.sock = d.sock, .cases = &ck[0], .n_cases = 1};
    cr_expect_eq(reap(spawn(client_greedy, &a), 60000), 0,
                 "A alone: tokens differ from the reference");
    gen_job b = {.sock = d.sock, .cases = &ck[1], .n_cases = 1};
    cr_expect_eq(reap(spawn(client_greedy, &b), 60000), 0,
                 "B after A: tokens differ from the reference (a block of A's, same key, reused?)");
    static ref_case both[2];
    both[0] = ck[2];
    both[1] = ck[0];
    gen_job ca = {.sock = d.sock, .cases = both, .n_cases = 2};
    cr_expect_eq(reap(spawn(client_greedy, &ca), 60000), 0,
                 "C and A in one batch: tokens differ from the reference");
    assert_back_to_baseline(&d, 5000);

    /* the names fleet routers read: 4 prompts looked up, hits 1 + 1 + 15 tokens */
    int port = dmn_metrics_port(&d);
    cr_assert_gt(port, 0, "no 'metrics on port' line in the daemon's stderr");
    double queried = -1, hit = -1;
    for (uint64_t deadline = th_now_ms() + 5000;;) { /* published every few ms */
        int status = 0;
        char *body = th_http_get(port, "/metrics", &status, NULL, 0);
        if (body && status == 200) {
            queried = prom_value(body, "vllm:prefix_cache_queries_total");
            hit = prom_value(body, "vllm:prefix_cache_hits_total");
        }
        free(body);
        if ((queried == 4 * CK_PROMPT && hit == CK_PROMPT + 1) || th_now_ms() > deadline) break;
        th_pause_ms(2);
    }
    cr_assert_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    cr_expect_eq(queried, 4 * CK_PROMPT, "vllm:prefix_cache_queries_total %g", queried);
    cr_expect_eq(hit, CK_PROMPT + 1,
                 "vllm:prefix_cache_hits_total %g: only equal blocks may hit (1 + 1 + %d)", hit,
                 CK_PROMPT - 1);

    /* cache_hit events in order: B's BOS block, then C's BOS block and A's own prompt in either
     * order; a block of another prompt found under the shared key would show as more */
    uint64_t req[8];
    long long tok[8];
    int nh = jl_req_values(d.declog, "\"ev\":\"cache_hit\"", "cached_tokens", req, tok, 8);
    cr_expect_eq(nh, 3, "%d cache_hit events (B, C, A again)", nh);
    if (nh == 3) {
        long long lo = tok[1] < tok[2] ? tok[1] : tok[2], hi = tok[1] < tok[2] ? tok[2] : tok[1];
        cr_expect(tok[0] == 1 && lo == 1 && hi == CK_PROMPT - 1,
                  "cache_hit tokens %lld, %lld, %lld: expected 1 (B), then 1 (C) and %d (A) in "
                  "either order",
                  tok[0], tok[1], tok[2], CK_PROMPT - 1);
    }

    /* the request log: content keys, equal where the tokens are (block 0), apart where not */
    FILE *f = fopen(d.reqlog, "r");
    cr_assert_not_null(f, "no request log %s", d.reqlog);
    static char line[1 << 14];
    long long first[4], second[4];
    int nl = 0;
    while (nl < 4 && fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        cr_assert_not_null(j, "request log line is not JSON: %s", line);
        json_t *h = json_object_get(j, "hash_ids");
        cr_assert_eq(json_array_size(h), CK_PROMPT,
                     "a %d-token prompt in 1-token blocks: %zu hash_ids", CK_PROMPT,
                     json_array_size(h));
        first[nl] = (long long)json_integer_value(json_array_get(h, 0));
        second[nl] = (long long)json_integer_value(json_array_get(h, 1));
        nl++;
        json_decref(j);
    }
    fclose(f);
    cr_assert_eq(nl, 4, "request log lines: %d", nl);
    int distinct = 0;
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(first[i], first[0], "the BOS block's key differs between requests");
        bool again = false;
        for (int k = 0; k < i; k++) again |= second[k] == second[i];
        distinct += !again;
    }
    cr_expect_eq(distinct, 3,
                 "the request log keys block 1 of A, B, C as %d distinct blocks, not 3", distinct);
    /* ringlm-sim replaying the log on the run's 1-token blocks finds the hits the daemon found */
    char cal[256], args[300];
    snprintf(cal, sizeof cal, "%s/calibration.json", d.dir);
    f = fopen(cal, "w");
    cr_assert_not_null(f);
    fputs("{\"version\": 1, \"kv_block_size\": 1, \"kv_blocks_device\": 1024, "
          "\"kv_bytes_per_token\": 1024, \"step_model\": "
          "{\"base_us\": 1000, \"per_prefill_token_us\": 20, \"per_decode_seq_us\": 50, "
          "\"per_context_token_us\": 0}}\n",
          f);
    fclose(f);
    snprintf(args, sizeof args, "--calibration %s", cal);
    json_t *pc, *sj = sim_replay(d.reqlog, args, &pc);
    cr_expect_eq((double)json_integer_value(json_object_get(pc, "hit_tokens")), hit,
                 "replayed hits %lld, the daemon's %g",
                 (long long)json_integer_value(json_object_get(pc, "hit_tokens")), hit);
    json_decref(sj);
    unlink(cal);
    dmn_cleanup(&d);
}

/* kill -9 mid-prefill of requests that share cached blocks: the killed clients' requests were
 * admitted holding the shared prefix and had not produced a token; after the kills no block
 * is leaked (pools back to baseline, reference counts checked by the scheduler's invariants in
 * the stats file), and a request holding the same shared blocks meanwhile still produces
 * exactly the tokens it produces alone (no shared block was freed or overwritten under it). */
typedef struct px_kill_job {
    const char *sock, *out;
    int ready_fd;
    int32_t prompt[400];
    uint32_t n_prompt, max_new;
} px_kill_job;

static int client_px_kill(void *arg)
{
    px_kill_job *g = arg;
    ringlm_client *c = client_connect(g->sock);
    if (!c) return 2;
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = g->prompt;
    r.n_prompt = g->n_prompt;
    r.max_new_tokens = g->max_new;
    uint64_t id;
    int rc = client_submit(c, &r, &id);
    if (rc) return rc;
    if (g->ready_fd >= 0 && write(g->ready_fd, "s", 1) != 1) return 6;
    FILE *f = g->out ? fopen(g->out, "w") : NULL;
    if ((rc = client_follow(c, id, f, NULL, NULL, 0, NULL))) return rc;
    if (f) fclose(f);
    ringlm_close(c);
    return 0;
}

/* The start of a mid-prefill test: a daemon on the stories15M shape under `policy`, ranked
 * below the clients (a test that kills or cancels preempts it: at nice -10 all 3 victims had
 * finished before the kill at load 20); *base caches a 64-token prefix; *surv, that prefix
 * and its own tokens up to surv_prompt, runs once alone into <dir>/surv-ref.txt (ref) and is
 * set to run again into <dir>/surv-again.txt (again). */
static void px_start_shared(dmn *d, const char *policy, px_kill_job *base, px_kill_job *surv,
                            uint32_t surv_prompt, char (*ref)[160], char (*again)[160])
{
    static const char *const below_clients[] = {DMN_BELOW_CLIENTS, NULL};
    dmn_start(d, "synthetic:stories15M:7", policy, below_clients);
    memset(base, 0, sizeof *base);
    base->sock = d->sock;
    base->ready_fd = -1;
    for (int k = 0; k < 64; k++) base->prompt[k] = 3 + (11 * k) % 500;
    base->n_prompt = 64;
    base->max_new = 2;
    cr_assert_eq(reap(spawn(client_px_kill, base), 60000), 0, "base prompt");
    *surv = *base;
    for (uint32_t k = 64; k < surv_prompt; k++) surv->prompt[k] = 3 + (5 * k) % 500;
    surv->n_prompt = surv_prompt;
    surv->max_new = 16;
    snprintf(*ref, sizeof *ref, "%s/surv-ref.txt", d->dir);
    snprintf(*again, sizeof *again, "%s/surv-again.txt", d->dir);
    surv->out = *ref;
    cr_assert_eq(reap(spawn(client_px_kill, surv), 60000), 0, "survivor alone");
    surv->out = *again;
}

/* Waits (20 s at most) for the decision log's n-th cache_hit line: `who` was admitted
 * holding the shared blocks. */
static void px_wait_hits(const dmn *d, int n, const char *who)
{
    for (uint64_t deadline = th_now_ms() + 20000;;) {
        if (count_lines(d->declog, "\"ev\":\"cache_hit\"") >= n) break;
        cr_assert(th_now_ms() < deadline, "%s never admitted with a cache hit", who);
        th_pause_ms(2);
    }
}

Test(daemon_prefix, prefix_cache_kill9_mid_prefill_of_sharing_requests_leaks_nothing)
{
    need_daemon_binary();
    /* The stories15M shape with tiny prefill chunks: a 176-token suffix takes 88 iterations
     * of several ms each to prefill, so the victims are still prefilling when the test sees
     * their cache hits (the decision log is written behind the loop: up to its writer's
     * 10 ms wait).  On stories260K the whole prefill fits in that lag and a victim could
     * finish before it was killed. */
    dmn d;
    static px_kill_job base, surv, victim[3];
    char ref[160], again[160];
    px_start_shared(&d, "[scheduler]\nmode = token_budget\ntoken_budget = 32\nprefill_chunk = 2\n",
                    &base, &surv, 160, &ref, &again);
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    pid_t kids[3];
    for (int i = 0; i < 3; i++) {
        victim[i] = base;
        for (int k = 64; k < 240; k++) victim[i].prompt[k] = 3 + (13 * k + 7 * i) % 500;
        victim[i].n_prompt = 240; /* within the shape's 256-token context */
        victim[i].max_new = 8;
        victim[i].ready_fd = pfd[1];
        kids[i] = spawn(client_px_kill, &victim[i]);
    }
    close(pfd[1]);
    for (int i = 0; i < 3; i++) {
        char b;
        cr_assert_eq(read(pfd[0], &b, 1), 1, "victim %d never submitted", i);
    }
    close(pfd[0]);
    pid_t sp = spawn(client_px_kill, &surv);
    /* the victims are admitted (each found the shared 64 tokens: cache_hit) — then killed */
    px_wait_hits(&d, 2 + 3, "the victims were"); /* the survivor twice, 3 victims */
    for (int i = 0; i < 3; i++) kill(kids[i], SIGKILL);
    for (int i = 0; i < 3; i++) reap(kids[i], 5000);
    cr_assert_eq(reap(sp, 60000), 0, "survivor");
    assert_back_to_baseline(&d, 5000);
    cr_assert_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    char *a = slurp(ref), *b = slurp(again);
    cr_assert(a && b);
    cr_expect_str_eq(
        b, a, "the request sharing the blocks produced other tokens while others were killed");
    free(a);
    free(b);
    /* a victim was cancelled (disconnect) mid-prefill, or had finished before the kill (the
     * decision log is written behind the loop): at least one died holding shared blocks */
    int cancels = count_lines(d.declog, "\"ev\":\"cancel\"");
    int finishes = count_lines(d.declog, "\"ev\":\"finish\"");
    cr_log_info("kill -9 mid-prefill: %d of 3 victims cancelled, %d finished first", cancels,
                finishes - 3);
    cr_expect_geq(cancels, 1, "no victim was still prefilling when killed");
    cr_expect_eq(cancels + finishes, 6,
                 "base, the survivor twice and 3 victims: %d cancels, %d finishes", cancels,
                 finishes);
    dmn_cleanup(&d);
}

/* A client's cancel, mid-prefill, of a request holding shared blocks: the victim submits, is
 * admitted with the cached 64-token prefix (its cache_hit in the decision log), and the
 * test then has it call ringlm_cancel while its own 176 tokens are still being prefilled
 * one per step; it ends CANCELLED without a token, no block is leaked (pools back to
 * baseline, reference counts checked by the scheduler's invariants), and a request holding
 * the same shared blocks meanwhile produces exactly the tokens it produces alone. */
typedef struct px_cancel_job {
    const char *sock, *out;
    int ready_fd, go_fd;
    int32_t prompt[240];
} px_cancel_job;

static int client_px_cancel(void *arg)
{
    px_cancel_job *g = arg;
    ringlm_client *c = client_connect(g->sock);
    if (!c) return 2;
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = g->prompt;
    r.n_prompt = 240;
    r.max_new_tokens = 8;
    uint64_t id;
    int rc = client_submit(c, &r, &id);
    if (rc) return rc;
    char b;
    if (write(g->ready_fd, "s", 1) != 1 || read(g->go_fd, &b, 1) != 1) return 6;
    if (ringlm_cancel(c, id) < 0) {
        fprintf(stderr, "cancel: %s\n", ringlm_errdetail());
        return 7;
    }
    uint32_t tokens = 0;
    ringlm_event fin;
    if ((rc = client_follow(c, id, NULL, NULL, &tokens, UINT32_MAX, &fin))) return rc;
    FILE *f = fopen(g->out, "w");
    if (!f) return 3;
    fprintf(f, "%s %u\n", ringlm_reason_name(fin.finish_reason), tokens);
    fclose(f);
    ringlm_close(c);
    return 0;
}

Test(daemon_prefix, prefix_cache_cancel_mid_prefill_of_a_sharing_request_leaks_nothing)
{
    need_daemon_binary();
    /* the stories15M shape, one prompt token per step: the victim's own 176 tokens take 176
     * steps of several ms to prefill, long after the test saw it admitted */
    dmn d;
    static px_kill_job base, surv;
    char ref[160], again[160], vout[160];
    px_start_shared(&d, "[scheduler]\nmode = token_budget\ntoken_budget = 32\nprefill_chunk = 1\n",
                    &base, &surv, 80, &ref, &again);
    snprintf(vout, sizeof vout, "%s/victim.txt", d.dir);
    static px_cancel_job victim;
    memset(&victim, 0, sizeof victim);
    victim.sock = d.sock;
    victim.out = vout;
    memcpy(victim.prompt, base.prompt, 64 * sizeof(int32_t));
    for (int k = 64; k < 240; k++) victim.prompt[k] = 3 + (13 * k + 7) % 500;
    int ready[2], go[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(go), 0);
    victim.ready_fd = ready[1];
    victim.go_fd = go[0];
    pid_t vk = spawn(client_px_cancel, &victim);
    close(ready[1]);
    close(go[0]);
    char b;
    cr_assert_eq(read(ready[0], &b, 1), 1, "the victim never submitted");
    close(ready[0]);
    /* admitted holding the shared blocks: base, survivor alone, victim */
    px_wait_hits(&d, 2, "the victim was");
    pid_t sp = spawn(client_px_kill, &surv);
    px_wait_hits(&d, 3, "the survivor was"); /* and the survivor holds them too */
    cr_assert_eq(write(go[1], "c", 1), 1);
    close(go[1]);
    cr_assert_eq(reap(vk, 60000), 0, "victim");
    cr_assert_eq(reap(sp, 60000), 0, "survivor");
    assert_back_to_baseline(&d, 5000);
    cr_assert_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    char *a = slurp(ref), *s2 = slurp(again), *v = slurp(vout);
    cr_assert(a && s2 && v);
    cr_expect_str_eq(v, "cancelled 0\n", "the victim was not cancelled before its first token: %s",
                     v);
    cr_expect_str_eq(
        s2, a, "the request sharing the blocks produced other tokens while one was cancelled");
    cr_expect_eq(count_lines2(d.declog, "\"ev\":\"cancel\"", "\"reason\":\"client_cancel\""), 1,
                 "the victim's cancel event");
    free(a);
    free(s2);
    free(v);
    dmn_cleanup(&d);
}

/* Preemption of sequences holding shared blocks, by swap and by recompute: prompts that share
 * a 48-token cached prefix run at once on a device pool too small for them all, so some are
 * preempted while others hold the same blocks.  The greedy tokens equal those of the same run
 * with the cache off, the pools come back to baseline with the reference counts checked (the
 * scheduler's invariants in the stats file), swapped blocks come back byte-exact
 * (--verify-swaps). */

/* Requests the decision log shows started ("schedule", reason "start") before its
 * (finishes + 1)-th "finish" line. */
static int starts_before_finish(const char *declog, int finishes)
{
    FILE *f = fopen(declog, "r");
    cr_assert_not_null(f, "no decision log %s", declog);
    char line[4096];
    int starts = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "\"ev\":\"finish\"") && finishes-- == 0) break;
        starts += strstr(line, "\"ev\":\"schedule\"") && strstr(line, "\"reason\":\"start\"");
    }
    fclose(f);
    return starts;
}

static void px_preempt(const char *mode)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    static px_conc_job g;
    memset(&g, 0, sizeof g);
    for (int i = 0; i < 4; i++) {
        for (int k = 0; k < 48; k++) g.prompt[i][k] = 3 + (17 * k) % 500; /* the shared 3 blocks */
        for (int k = 48; k < 60; k++) g.prompt[i][k] = 3 + (29 * k + 41 * i) % 500;
        g.n_prompt[i] = 60;
    }
    char policy[512];
    snprintf(policy, sizeof policy,
             "[scheduler]\nmode = token_budget\ntoken_budget = 64\nmax_active_seqs = 8\n"
             "prefill_chunk = 32\npreemption = %s\nmin_residency = 0us\nmax_preemptions = 0\n",
             mode);
    /* 4 × (60 + 200) tokens = 68 blocks of 16 at the end (59 with the 3 shared): 32 device
     * blocks cannot hold them */
    const char *on_args[] = {"--kv-blocks",      "32", "--kv-block-size", "16",
                             "--host-kv-blocks", "64", "--verify-swaps",  NULL};
    const char *off_args[] = {"--kv-blocks",
                              "32",
                              "--kv-block-size",
                              "16",
                              "--host-kv-blocks",
                              "64",
                              "--verify-swaps",
                              "--no-prefix-cache",
                              NULL};
    dmn on, off;
    dmn_start_for(&off, model, policy, off_args, &g.sock, &g.out);
    dmn_run_client(&off, client_px_concurrent, &g, "client (cache off)");
    char *a = dmn_stop_output(&off);
    dmn_start_for(&on, model, policy, on_args, &g.sock, &g.out);
    /* the shared prefix is cached first, so all four start holding its blocks */
    static px_kill_job warm;
    memset(&warm, 0, sizeof warm);
    warm.sock = on.sock;
    warm.ready_fd = -1;
    memcpy(warm.prompt, g.prompt[0], 48 * sizeof(int32_t));
    warm.n_prompt = 48;
    warm.max_new = 1;
    cr_assert_eq(reap(spawn(client_px_kill, &warm), 60000), 0, "warm-up");
    dmn_run_client(&on, client_px_concurrent, &g, "client (cache on)");
    json_t *j = dmn_stats(&on);
    long long verified = jint(j, "swap_verified");
    json_decref(j);
    char *b = dmn_stop_output(&on);
    cr_expect_str_eq(b, a, "mode %s: tokens with shared blocks preempted differ from the cache off",
                     mode);
    free(a);
    free(b);
    int hits = count_lines(on.declog, "\"ev\":\"cache_hit\"");
    int preempts = count_lines(on.declog, "\"ev\":\"preempt\"");
    int swaps = count_lines(on.declog, "\"mode\":\"swap\"");
    cr_log_info(
        "mode %s, cache on: %d cache hits, %d preemptions, %d swap lines, %lld blocks verified",
        mode, hits, preempts, swaps, verified);
    cr_expect_geq(hits, 4, "the four prompts did not share the cached prefix (%d hits)", hits);
    /* submitted as one batch, the four run together: all started before the first ended
     * (after the warm-up's start and finish), and their growth overran the pool */
    cr_expect_eq(starts_before_finish(on.declog, 1), 5,
                 "mode %s: a request ended before the last started", mode);
    cr_expect_eq(starts_before_finish(off.declog, 0), 4,
                 "mode %s, cache off: a request ended before the last started", mode);
    cr_expect_gt(preempts, 0, "mode %s: the small pool forced no preemption", mode);
    char by[32];
    snprintf(by, sizeof by, "\"mode\":\"%s\"", mode);
    cr_expect_eq(count_lines2(on.declog, "\"ev\":\"preempt\"", by), preempts,
                 "a preemption not by %s", mode);
    if (!strcmp(mode, "swap")) cr_expect_gt(verified, 0, "swap mode: no swap-in was verified");
    if (!strcmp(mode, "recompute")) cr_expect_eq(swaps, 0, "recompute mode swapped");
    dmn_cleanup(&on);
    dmn_cleanup(&off);
}

Test(daemon_prefix, prefix_cache_preempt_swap_of_shared_blocks_same_tokens)
{
    px_preempt("swap");
}
Test(daemon_prefix, prefix_cache_preempt_recompute_of_shared_blocks_same_tokens)
{
    px_preempt("recompute");
}
