/* SPDX-License-Identifier: MIT */
/*
 * ringlmd end to end, the prefix cache across a sequence's life: a recompute-preempted
 * sequence resumes on its own cached blocks, a conversation's next turn finds its last answer
 * cached, answers ending on a block boundary cache what was computed. A real daemon process
 * on a private socket, real client processes (fork + libringlm) (tests/daemon_helpers.h);
 * every test stops every process it starts and checks that every KV block is accounted for.
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

TestSuite(daemon_prefix_turns, .timeout = 120);

/* ---- a recompute-preempted sequence resumes on its own cached blocks ---------------------- */

/* Two 16-token prompts (one block each, nothing shared), 100 new tokens each, through 14
 * device blocks of 16 where each needs 8 at the end: one is preempted by recompute.  Its full
 * blocks — its prompt's and its answer's so far — stay cached, and the other's growth evicts
 * only their tail; when it resumes it finds the rest.  That hit is all its own (self_tokens =
 * cached_tokens), covers answer blocks (more than its one prompt block), and /metrics counts
 * it under kind="self" with no cross-request hit; the tokens equal those with the cache off.
 * Without the reuse the resumed sequence would find nothing. */
Test(daemon_prefix_turns, prefix_cache_recompute_preempted_sequence_resumes_on_its_own_blocks)
{
    need_daemon_binary();
    /* the two must run side by side: both are submitted at once, and a model ~25x slower per
     * token than stories260K leaves the second ~100 ms of the first's CPU time to arrive in
     * (it must come before the first has ~36 tokens) however loaded the machine is */
    const char *model = "synthetic:stories15M:7";
    static px_conc_job g;
    memset(&g, 0, sizeof g);
    g.n = 2;
    g.max_new = 100;
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 16; k++) g.prompt[i][k] = 3 + (17 * k + 101 * i + 7) % 500;
        g.n_prompt[i] = 16;
    }
    const char *policy =
        "[scheduler]\nmode = token_budget\ntoken_budget = 64\nmax_active_seqs = 8\n"
        "prefill_chunk = 32\npreemption = recompute\nmin_residency = 0us\nmax_preemptions = 0\n";
    static const char *const off_args[] = {"--kv-blocks",       "14", "--kv-block-size", "16",
                                           "--no-prefix-cache", NULL};
    static const char *const on_args[] = {"--kv-blocks", "14", "--kv-block-size", "16", "--metrics",
                                          "127.0.0.1:0", NULL};
    dmn off, on;
    dmn_start_for(&off, model, policy, off_args, &g.sock, &g.out);
    dmn_run_client(&off, client_px_concurrent, &g, "client (cache off)");
    char *a = dmn_stop_output(&off);
    dmn_start_for(&on, model, policy, on_args, &g.sock, &g.out);
    dmn_run_client(&on, client_px_concurrent, &g, "client (cache on)");
    int port = dmn_metrics_port(&on);
    cr_assert_gt(port, 0, "no 'metrics on port' line in the daemon's stderr");
    int status = 0;
    char *body = th_http_get(port, "/metrics", &status, NULL, 0);
    cr_assert(body && status == 200, "GET /metrics failed (status %d)", status);
    double self = prom_value(body, "ringlm_prefix_cache_hits_total{tier=\"device\",kind=\"self\"}"),
           cross =
               prom_value(body, "ringlm_prefix_cache_hits_total{tier=\"device\",kind=\"cross\"}");
    free(body);
    char *b = dmn_stop_output(&on);
    cr_expect_str_eq(
        b, a, "tokens of a sequence resumed on its own cached blocks differ from the cache off");
    free(a);
    free(b);
    if (!count_lines2(on.declog, "\"ev\":\"preempt\"", "\"mode\":\"recompute\""))
        dump_file(on.declog, "decision log");
    cr_assert_gt(count_lines2(on.declog, "\"ev\":\"preempt\"", "\"mode\":\"recompute\""), 0,
                 "the small pool forced no recompute preemption");
    /* every hit is a resumed sequence's own blocks; the largest covers answer blocks */
    FILE *f = fopen(on.declog, "r");
    cr_assert_not_null(f);
    static char line[4096];
    int hits = 0;
    double best = 0, best_self = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"ev\":\"cache_hit\"")) continue;
        hits++;
        double c = json_num_of(line, "cached_tokens"), sf = json_num_of(line, "self_tokens");
        cr_expect_eq(sf, c, "a hit that is not the resumed sequence's own: %s", line);
        if (c > best) {
            best = c;
            best_self = sf;
        }
    }
    fclose(f);
    cr_log_info(
        "cache on: %d hits, the largest %.0f tokens (%.0f self); /metrics self %.0f cross %.0f",
        hits, best, best_self, self, cross);
    cr_assert_gt(hits, 0, "the preempted sequence resumed without its cached blocks");
    cr_expect_geq(best_self, 32,
                  "the resumed sequence reused %.0f tokens of its own: not past its prompt's block",
                  best_self);
    cr_expect_gt(self, 0, "/metrics counted no self hit");
    cr_expect_eq(cross, 0,
                 "/metrics counted a resumed sequence's own blocks as cross-request hits");
    dmn_cleanup(&off);
    dmn_cleanup(&on);
}

/* ---- a conversation's next turn finds its last answer cached ------------------------------ */

typedef struct turn_job {
    const char *sock, *out;
    int32_t prompt[40];
} turn_job;

/* Turn 1: a 40-token prompt, 40 tokens of answer; turn 2: that prompt, the answer as the
 * client received it, and 8 new tokens.  Both turns' tokens to the file. */
static int client_turns(void *arg)
{
    turn_job *g = arg;
    ringlm_client *c = client_connect(g->sock);
    if (!c) return 2;
    FILE *f = fopen(g->out, "w");
    if (!f) return 3;
    int32_t conv[128];
    uint32_t n = 0;
    for (int i = 0; i < 40; i++) conv[n++] = g->prompt[i];
    for (int turn = 0; turn < 2; turn++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = conv;
        r.n_prompt = n;
        r.max_new_tokens = turn ? 16 : 40;
        r.ignore_stop = true;
        uint64_t id;
        uint32_t n0 = n;
        int rc = client_submit(c, &r, &id);
        if (!rc) rc = client_follow(c, id, f, conv, &n, 120, NULL);
        if (rc) return rc;
        if (turn == 0 && n != n0 + 40) return 6;
        for (int k = 0; k < 8; k++) conv[n++] = 3 + (37 * k + 11) % 400; /* the user's next words */
    }
    fclose(f);
    ringlm_close(c);
    return 0;
}

/* Turn 2 = turn 1's prompt + answer + new text: the answer's full blocks were cached when
 * turn 1 finished, so turn 2's cache hit covers them (40 + 40 tokens, 79 computed: 4 full
 * blocks of 16 = 64 tokens, where the prompt alone has 2), and the tokens equal those with
 * the cache off. */
Test(daemon_prefix_turns, prefix_cache_next_turn_hits_the_last_answer)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    static turn_job g;
    memset(&g, 0, sizeof g);
    for (int k = 0; k < 40; k++) g.prompt[k] = 3 + (19 * k + 5) % 400;
    /* Prompts in exact float32 on both: by default a prompt row takes the BF16 tiles, so with
     * the cache off turn 2 computes the answer's tokens as prompt rows, where the cache holds
     * them as turn 1 generated them (exact): within the prompt rows' bound, not the same bits. */
    static const char *const off_flags[] = {"--kv-block-size", "16", "--no-prefix-cache",
                                            "--prompt-exact", NULL};
    static const char *const on_flags[] = {"--kv-block-size", "16", "--prompt-exact", NULL};
    dmn off, on;
    dmn_start_for(&off, model, NULL, off_flags, &g.sock, &g.out);
    dmn_run_client(&off, client_turns, &g, "client (cache off)");
    char *a = dmn_stop_output(&off);
    dmn_start_for(&on, model, NULL, on_flags, &g.sock, &g.out);
    dmn_run_client(&on, client_turns, &g, "client (cache on)");
    char *b = dmn_stop_output(&on);
    cr_expect_str_eq(b, a, "tokens with the answer's blocks cached differ from the cache off");
    const char *hit = find_line2(on.declog, "\"ev\":\"cache_hit\"", "\"prompt_tokens\":88");
    cr_assert(hit[0], "turn 2 (88 prompt tokens) found nothing cached");
    cr_log_info("turn 2: %s", hit);
    cr_expect_eq(json_num_of(hit, "cached_tokens"), 64.0,
                 "turn 2's hit does not cover the answer's full blocks: %s", hit);
    /* the request log carries the answer's keys: ringlm-sim replaying it caches turn 1's
     * answer when turn 1 ends, as the daemon did, and finds turn 2's hit where it did (the
     * arrivals spread 10,000x: the built-in step model is slower than stories260K here, and
     * turn 2 came after turn 1 ended) */
    cr_expect_eq(count_lines2(on.reqlog, "\"prompt_tokens\":40,", "\"answer_hash_ids\":["), 1,
                 "turn 1's answer keys are not in the request log");
    json_t *pc, *sj = sim_replay(on.reqlog, "--rate 0.0001", &pc);
    cr_expect_eq(json_integer_value(json_object_get(pc, "recorded_hit_tokens")), 64);
    if (json_integer_value(json_object_get(pc, "hit_tokens")) != 64)
        dump_file(on.reqlog, "request log");
    cr_expect_eq(json_integer_value(json_object_get(pc, "hit_tokens")), 64,
                 "the replay of the recorded log found %lld cached tokens, the daemon 64",
                 (long long)json_integer_value(json_object_get(pc, "hit_tokens")));
    json_decref(sj);
    free(a);
    free(b);
    dmn_cleanup(&off);
    dmn_cleanup(&on);
}

/* Three turns of one conversation, each prompt the last prompt, its answer as the client
 * received it and 8 new tokens: turn 1 a reference prompt whose greedy answer ends with the
 * stop token, turn 2 and 3 with ignore_stop, turn 2's max_new_tokens chosen so that its
 * answer too ends on a block boundary.  Each turn's tokens and end to a line of the file. */
typedef struct edge_job {
    const char *sock, *out;
    int32_t first[16];
    uint32_t n_first, max_new1, bs;
} edge_job;

static int client_edge_turns(void *arg)
{
    edge_job *g = arg;
    ringlm_client *c = client_connect(g->sock);
    if (!c) return 2;
    FILE *f = fopen(g->out, "w");
    if (!f) return 3;
    static int32_t conv[512];
    uint32_t n = g->n_first;
    memcpy(conv, g->first, n * sizeof(int32_t));
    for (int turn = 0; turn < 3; turn++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = conv;
        r.n_prompt = n;
        r.max_new_tokens = turn == 0 ? g->max_new1 : turn == 1 ? g->bs - n % g->bs : 8;
        r.ignore_stop = turn > 0;
        uint64_t id;
        ringlm_event fin;
        int rc = client_submit(c, &r, &id);
        if (!rc) rc = client_follow(c, id, f, conv, &n, 500, &fin);
        if (rc) return rc;
        if (turn == 0 && fin.finish_reason != RINGLM_FINISH_STOP) {
            fprintf(stderr, "turn 1 did not stop\n");
            return 6;
        }
        for (int k = 0; k < 8; k++) conv[n++] = 3 + (37 * k + 11) % 400; /* the user's next words */
    }
    fclose(f);
    ringlm_close(c);
    return 0;
}

/* The request log line of the request with that many prompt tokens (JSON; json_decref). */
static json_t *reqlog_line(const char *reqlog, uint32_t prompt_tokens)
{
    char key[64];
    snprintf(key, sizeof key, "\"prompt_tokens\":%u,", prompt_tokens);
    const char *l = find_line2(reqlog, key, "\"req\":");
    cr_assert(l[0], "no request log line with %u prompt tokens", prompt_tokens);
    json_error_t e;
    json_t *j = json_loads(l, 0, &e);
    cr_assert_not_null(j, "request log line is not JSON: %s", l);
    return j;
}

/* Probe: n prompts as one batch, each generating greedily until its stop token (at most
 * max_new); writes the index of the first whose prompt + answer is a whole number of blocks
 * of bs tokens and ended on the stop token, or -1, to out, then each one's "n_gen reason". */
typedef struct probe_job {
    const char *sock, *out;
    int32_t prompt[64][8];
    uint32_t n_prompt, n, max_new, bs;
} probe_job;

static int client_probe_stops(void *arg)
{
    probe_job *g = arg;
    ringlm_client *c = client_connect(g->sock);
    if (!c) return 2;
    static ringlm_request r[64];
    uint64_t ids[64];
    uint32_t got[64] = {0};
    int reason[64] = {0};
    for (uint32_t i = 0; i < g->n; i++) {
        ringlm_request_init(&r[i]);
        r[i].prompt = g->prompt[i];
        r[i].n_prompt = g->n_prompt;
        r[i].max_new_tokens = g->max_new;
    }
    if (ringlm_submit_batch(c, r, g->n, ids) < 0) {
        fprintf(stderr, "submit: %s\n", ringlm_errdetail());
        return 4;
    }
    for (uint32_t done = 0; done < g->n;) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 60000);
        if (rc <= 0) {
            fprintf(stderr, "next_event: %s\n", ringlm_errdetail());
            return 5;
        }
        if (ev.kind != RINGLM_EV_FINISH) continue;
        for (uint32_t i = 0; i < g->n; i++)
            if (ids[i] == ev.req_id) {
                got[i] = ev.n_tokens;
                reason[i] = ev.finish_reason;
            }
        done++;
    }
    int pick = -1;
    for (uint32_t i = 0; i < g->n && pick < 0; i++)
        if (reason[i] == RINGLM_FINISH_STOP && (g->n_prompt + got[i]) % g->bs == 0) pick = (int)i;
    FILE *f = fopen(g->out, "w");
    if (!f) return 3;
    fprintf(f, "%d\n", pick);
    for (uint32_t i = 0; i < g->n; i++) fprintf(f, "%u %d\n", got[i], reason[i]);
    fclose(f);
    ringlm_close(c);
    return 0;
}

/* Answers that end exactly on a block boundary.  Turn 1's answer ends with the stop token
 * right after a full block: the last token the client got was fed back to sample the stop,
 * so that block's KV exists and is cached; turn 2's ends by length on a boundary: its last
 * token was never fed back, so its block is not.  The request log lists exactly the blocks
 * the cache kept (turn 3 finds turn 2's whole prompt cached, no more), ringlm-sim replaying
 * the log caches what the daemon did (equal hit tokens), and every turn's tokens equal those
 * with the cache off.  Turn 1's prompt is found by a probe, with the cache off: a reference
 * prompt ("The little dog") plus one word, the first whose greedy story stops after a whole
 * number of 16-token blocks (greedy decoding makes the choice the same every run). */
Test(daemon_prefix_turns, prefix_cache_answers_ending_on_a_block_boundary_cache_what_was_computed)
{
    char model[512];
    static ref_case cases[12];
    int nc = need_stories_refs(model, sizeof model, cases, 12, 0);
    const ref_case *rc = NULL;
    for (int i = 0; i < nc && !rc; i++)
        if (cases[i].stops && cases[i].n_prompt > 1 && cases[i].n_prompt < 8) rc = &cases[i];
    if (!rc) cr_skip_test("no reference case with a prompt stops on the stop token");
    static probe_job pj;
    memset(&pj, 0, sizeof pj);
    pj.n_prompt = rc->n_prompt + 1;
    pj.max_new = 400;
    pj.bs = 16;
    for (uint32_t k = 0; k < rc->n_gen && pj.n < 64; k++) { /* + each word of its story, once */
        bool seen = false;
        for (uint32_t i = 0; i < pj.n; i++) seen |= pj.prompt[i][rc->n_prompt] == rc->gen[k];
        if (seen) continue;
        memcpy(pj.prompt[pj.n], rc->prompt, rc->n_prompt * sizeof(int32_t));
        pj.prompt[pj.n++][rc->n_prompt] = rc->gen[k];
    }
    static const char *const probe_flags[] = {"--no-prefix-cache", NULL};
    dmn probe;
    dmn_start_for(&probe, model, NULL, probe_flags, &pj.sock, &pj.out);
    dmn_run_client(&probe, client_probe_stops, &pj, "probe");
    char *po = dmn_stop_output(&probe);
    int pick = atoi(po);
    cr_assert_geq(pick, 0, "none of %u greedy stories stopped after a whole number of blocks",
                  pj.n);
    const char *pl = po;
    for (int i = 0; i <= pick; i++) pl = strchr(pl, '\n') + 1;
    uint32_t len1 = pj.n_prompt + (uint32_t)strtoul(pl, NULL, 10);
    free(po);
    dmn_cleanup(&probe);
    static edge_job g;
    memset(&g, 0, sizeof g);
    g.bs = pj.bs;
    memcpy(g.first, pj.prompt[pick], pj.n_prompt * sizeof(int32_t));
    g.n_first = pj.n_prompt;
    g.max_new1 = pj.max_new;
    char bs[16];
    snprintf(bs, sizeof bs, "%u", g.bs);
    const char *off_flags[] = {"--kv-block-size", bs, "--no-prefix-cache", NULL};
    const char *on_flags[] = {"--kv-block-size", bs, NULL};
    dmn off, on;
    dmn_start_for(&off, model, NULL, off_flags, &g.sock, &g.out);
    dmn_run_client(&off, client_edge_turns, &g, "client (cache off)");
    char *a = dmn_stop_output(&off);
    dmn_start_for(&on, model, NULL, on_flags, &g.sock, &g.out);
    dmn_run_client(&on, client_edge_turns, &g, "client (cache on)");
    char *b = dmn_stop_output(&on);
    cr_expect_str_eq(b, a,
                     "tokens with answers cached on block boundaries differ from the cache off");
    uint32_t p2 = len1 + 8, len2 = p2 + (g.bs - p2 % g.bs), p3 = len2 + 8;
    cr_log_info("block size %u: turn 1 %u tokens (stop), turn 2 %u (length), turn 3 prompt %u",
                g.bs, len1, len2, p3);
    /* turn 1: all its blocks were computed (the stop token came after the last) */
    json_t *t1 = reqlog_line(on.reqlog, g.n_first), *t2 = reqlog_line(on.reqlog, p2),
           *t3 = reqlog_line(on.reqlog, p3);
    cr_expect_eq(json_array_size(json_object_get(t1, "answer_hash_ids")),
                 len1 / g.bs - g.n_first / g.bs, "turn 1's answer keys");
    cr_expect_eq(jint(t2, "cached_tokens"), len1,
                 "turn 2 did not find turn 1's answer cached to its last block");
    /* turn 2: its last block's last token was never fed back: neither cached nor listed */
    cr_expect_eq(json_array_size(json_object_get(t2, "hash_ids")) +
                     json_array_size(json_object_get(t2, "answer_hash_ids")),
                 len2 / g.bs - 1,
                 "turn 2's keys name a block whose last token's KV was never computed");
    cr_expect_eq(jint(t3, "cached_tokens"), len2 - g.bs, "turn 3's hit");
    long long daemon_hits = jint(t2, "cached_tokens") + jint(t3, "cached_tokens");
    json_decref(t1);
    json_decref(t2);
    json_decref(t3);
    json_t *pc, *sj = sim_replay(on.reqlog, "--rate 0.0001", &pc);
    cr_expect_eq(json_integer_value(json_object_get(pc, "recorded_hit_tokens")), daemon_hits);
    if (json_integer_value(json_object_get(pc, "hit_tokens")) != daemon_hits)
        dump_file(on.reqlog, "request log");
    cr_expect_eq(json_integer_value(json_object_get(pc, "hit_tokens")), daemon_hits,
                 "the replay of the recorded log found %lld cached tokens, the daemon %lld",
                 (long long)json_integer_value(json_object_get(pc, "hit_tokens")), daemon_hits);
    json_decref(sj);
    free(a);
    free(b);
    dmn_cleanup(&off);
    dmn_cleanup(&on);
}
