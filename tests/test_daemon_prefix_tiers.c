/* SPDX-License-Identifier: MIT */
/*
 * ringlmd end to end, the prefix cache across the host and disk tiers: demoted blocks reload
 * byte-exact, a slow disk tier is not worth keeping blocks in, reloads run beside the steps,
 * a failed reload ends only its request, and a slow tier found at admission is recomputed.
 * A real daemon process on a private socket, real client processes (fork + libringlm)
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

TestSuite(daemon_prefix_tiers, .timeout = 120);

/* ---- prefix cache across the host and disk tiers ---------------------------------------- */

/* Three distinct 64-token prompts, then the first again, one after another, through a
 * device pool of 8 blocks of 16 tokens (one request needs 5 while it runs, and keeps 4):
 * the second's growth and the third push the first's blocks off the device before it comes
 * back.  The tokens each stream produced go to a file. */
#define TX_N 4

/* One run of a tier test: a fresh ringlmd (model, a 64-token budget in chunks of 32, extra
 * flags) serves the client process fn(job) to its end (exit 0 within timeout_ms; *sock and
 * *job_out, the job's, are pointed at its socket and its output file); then its pools are back
 * to their baseline, no reloaded block differed from the one demoted and no copy raced a
 * transfer or a step (its stats). The client's output to *out (malloc'd); *verified (may be
 * NULL) the blocks it verified. Returns with the daemon stopped, its logs in d until
 * dmn_cleanup. */
static void run_tier_client(const char *model, int (*fn)(void *), void *job, const char **sock,
                            const char **job_out, int timeout_ms, const char *const *extra, dmn *d,
                            char **out, long long *verified)
{
    dmn_start_for(d, model, "[scheduler]\ntoken_budget = 64\nprefill_chunk = 32\n", extra, sock,
                  job_out);
    int st = reap(spawn(fn, job), timeout_ms);
    if (st != 0) dump_file(d->errlog, "ringlmd stderr");
    cr_assert_eq(st, 0, "tier client exit %d", st);
    assert_back_to_baseline(d, 5000);
    json_t *j = dmn_stats(d);
    cr_assert_not_null(j);
    cr_expect_eq(jint(j, "swap_verify_errors"), 0, "a reloaded block differs from the one demoted");
    cr_expect_eq(jint(j, "transfer_overlap_errors"), 0, "a copy raced a transfer or a step");
    if (verified) *verified = jint(j, "swap_verified");
    json_decref(j);
    *out = dmn_stop_output(d);
}

/* The tier workload (client_sequential) through a daemon with `extra` flags. */
static void run_tiers(const char *model, seq_job *g, const char *const *extra, dmn *d, char **out,
                      long long *verified)
{
    run_tier_client(model, client_sequential, g, &g->sock, &g->out, 120000, extra, d, out,
                    verified);
}

/* The model: the stories15M shape (synthetic weights, no shared data needed), big enough
 * that recomputing a 16-token block costs more than copying it from memory. */
#define TIER_MODEL "synthetic:stories110M:7"

/* Distinct prompt i of the tier workloads (64 tokens). */
static void tier_prompt(int32_t *p, int i)
{
    for (int k = 0; k < 64; k++) p[k] = 1 + (i * 7919 + k * 131 + k * k) % 30000;
}

static void tier_prompts(seq_job *g)
{
    memset(g, 0, sizeof *g);
    g->n = TX_N;
    g->max_new = 4;
    for (int i = 0; i < TX_N; i++) g->n_prompt[i] = 64;
    for (int i = 0; i < TX_N - 1; i++) tier_prompt(g->prompt[i], i);
    memcpy(g->prompt[TX_N - 1], g->prompt[0], sizeof g->prompt[0]);
}

/* With the device pool too small for the working set and a host tier, the blocks the device
 * lets go are demoted to the host, found there when their prompts come back and reloaded —
 * byte-exact (--verify-swaps checksums every block demoted and compares it when reloaded) —
 * and greedy output equals the output with the cache off.  The same through the disk tier. */
static void tiers_reload(bool disk)
{
    need_daemon_binary();
    const char *model = TIER_MODEL;
    static seq_job g;
    tier_prompts(&g);
    char disk_path[128];
    snprintf(disk_path, sizeof disk_path, "/tmp/ringlmd-pxdisk-%d", (int)getpid());
    static const char *const off_flags[] = {"--kv-blocks",       "8", "--kv-block-size", "16",
                                            "--no-prefix-cache", NULL};
    const char *host_flags[] = {"--kv-blocks",      "8",  "--kv-block-size", "16",
                                "--host-kv-blocks", "64", "--verify-swaps",  NULL};
    const char *disk_flags[] = {"--kv-blocks",    "8",       "--kv-block-size",  "16",
                                "--disk-kv",      disk_path, "--disk-kv-blocks", "64",
                                "--verify-swaps", NULL};
    dmn off, on;
    char *a, *b;
    long long verified = 0;
    run_tiers(model, &g, off_flags, &off, &a, NULL);
    run_tiers(model, &g, disk ? disk_flags : host_flags, &on, &b, &verified);
    cr_expect_str_eq(b, a, "tokens with cached blocks reloaded from %s differ from the cache off",
                     disk ? "disk" : "host");
    const char *tier = disk ? "\"to\":\"disk\"" : "\"to\":\"host\"";
    int demotes = count_lines2(on.declog, "\"ev\":\"cache_demote\"", tier);
    /* the decisions (with both estimates), then their completion records */
    int reloads = count_lines2(on.declog, "\"choice\":\"reload\"", "\"reload_cost_us\":");
    int done = count_lines2(on.declog, "\"choice\":\"reload\"", "\"reason\":\"done\"");
    int hits = count_lines2(on.declog, "\"ev\":\"cache_hit\"",
                            disk ? "\"disk_tokens\":" : "\"host_tokens\":");
    cr_log_info("%s tier: %d demotion lines, %d reloads (%d completed), %d hits found there, %lld "
                "blocks verified",
                disk ? "disk" : "host", demotes, reloads, done, hits, verified);
    cr_expect_gt(verified, 0, "no reloaded block was checked against its demoted bytes");
    if (!demotes || !reloads) dump_file(on.declog, "decision log");
    cr_expect_gt(demotes, 0, "no block was demoted");
    cr_expect_gt(reloads, 0, "no block was reloaded");
    cr_expect_eq(done, reloads, "every reload has its realised-cost record");
    cr_expect_gt(hits, 0, "no hit counted tokens from the tier");
    char rl[4096]; /* find_line2's buffer is reused below */
    snprintf(rl, sizeof rl, "%s",
             find_line2(on.declog, "\"choice\":\"reload\"", "\"reload_cost_us\":"));
    cr_expect_lt(json_num_of(rl, "reload_cost_us"), json_num_of(rl, "recompute_cost_us"), "%s", rl);
    const char *rd = find_line2(on.declog, "\"choice\":\"reload\"", "\"reason\":\"done\"");
    cr_log_info("%s tier: a reload's estimate %.1f us (recompute %.1f us), its copy took %.1f us",
                disk ? "disk" : "host", json_num_of(rl, "reload_cost_us"),
                json_num_of(rl, "recompute_cost_us"), json_num_of(rd, "realised_us"));
    cr_expect_eq(count_lines(off.declog, "\"ev\":\"cache_"), 0,
                 "--no-prefix-cache logged cache events");
    free(a);
    free(b);
    dmn_cleanup(&off);
    dmn_cleanup(&on);
    unlink(disk_path);
}

Test(daemon_prefix_tiers, prefix_cache_host_tier_demotes_reloads_byte_exact)
{
    tiers_reload(false);
}
Test(daemon_prefix_tiers, prefix_cache_disk_tier_demotes_reloads_byte_exact)
{
    tiers_reload(true);
}

/* A disk tier whose bandwidth is low (--disk-kv-bw: 1 kB/s until measured): keeping a block
 * there to reload it later would cost more than computing it again, so the cost model drops
 * the blocks the device lets go instead of demoting them, and the decision log says why —
 * both sides of the test; the prompt that comes back is recomputed, with the same tokens. */
Test(daemon_prefix_tiers, prefix_cache_slow_disk_tier_is_not_worth_keeping_blocks_in)
{
    need_daemon_binary();
    const char *model = TIER_MODEL;
    static seq_job g;
    tier_prompts(&g);
    char disk_path[128];
    snprintf(disk_path, sizeof disk_path, "/tmp/ringlmd-pxslow-%d", (int)getpid());
    static const char *const off_flags[] = {"--kv-blocks",       "8", "--kv-block-size", "16",
                                            "--no-prefix-cache", NULL};
    const char *slow[] = {"--kv-blocks",  "8",       "--kv-block-size",  "16",
                          "--disk-kv",    disk_path, "--disk-kv-blocks", "64",
                          "--disk-kv-bw", "1000",    "--verify-swaps",   NULL};
    dmn off, on;
    char *a, *b;
    run_tiers(model, &g, off_flags, &off, &a, NULL);
    run_tiers(model, &g, slow, &on, &b, NULL);
    cr_expect_str_eq(b, a, "tokens differ from the cache off");
    cr_expect_eq(count_lines(on.declog, "\"ev\":\"cache_demote\""), 0,
                 "a block was kept on the slow disk");
    const char *ev = find_line2(on.declog, "\"ev\":\"cache_evict\"", "\"reason\":\"demand\"");
    cr_assert(ev[0], "the device gave up no cached block");
    double rl = json_num_of(ev, "reload_cost_us"), rc = json_num_of(ev, "recompute_cost_us"),
           reuse = json_num_of(ev, "expected_reuse");
    cr_log_info("slow disk: reload %.1f us vs recompute %.1f us x reuse %.1f: %s", rl, rc, reuse,
                ev);
    cr_expect_gt(rc, 0, "%s", ev);
    cr_expect_gt(reuse, 0, "%s", ev);
    cr_expect_gt(rl, rc * reuse, "dropped although reload was predicted cheaper: %s", ev);
    /* a block is 16 tokens: at 1 kB/s its reload alone takes its bytes in ms */
    cr_expect_eq(count_lines2(on.declog, "\"ev\":\"cache_reload\"", "\"choice\":\"reload\""), 0);
    /* the run replayed in ringlm-sim from its request log, with the same pools and no
     * bandwidth given: each line carries the daemon's cost model at that admission
     * (sched_cost), so the replay drops what the daemon dropped and finds what it found;
     * deciding with the simulator's own link instead, it keeps the blocks on disk and finds
     * the fourth prompt there (the replay prefix_bench judges the simulator by departed so) */
    cr_expect_eq(count_lines(on.reqlog, "\"sched_cost\":{\"at_us\":"), TX_N,
                 "request log lines without sched_cost");
    const char *pools = "--kv-blocks 8 --host-kv-blocks 0 --disk-kv-blocks 64";
    char args[200];
    json_t *pc, *sj = sim_replay(on.reqlog, pools, &pc);
    long long daemon_hit = json_integer_value(json_object_get(pc, "recorded_hit_tokens")),
              replay_hit = json_integer_value(json_object_get(pc, "hit_tokens"));
    json_decref(sj);
    snprintf(args, sizeof args, "%s --recorded-costs off", pools);
    sj = sim_replay(on.reqlog, args, &pc);
    long long own_hit = json_integer_value(json_object_get(pc, "hit_tokens"));
    json_decref(sj);
    cr_log_info("slow disk replayed: the daemon found %lld tokens cached, the replay %lld (with "
                "the simulator's own "
                "costs %lld)",
                daemon_hit, replay_hit, own_hit);
    cr_expect_eq(replay_hit, daemon_hit, "the replay found %lld tokens cached, the daemon %lld",
                 replay_hit, daemon_hit);
    cr_expect_gt(
        own_hit, daemon_hit,
        "with its own costs the simulator should keep blocks on disk (found %lld, the "
        "daemon %lld): the scenario no longer tells the recorded costs from the simulator's",
        own_hit, daemon_hit);
    free(a);
    free(b);
    dmn_cleanup(&off);
    dmn_cleanup(&on);
    unlink(disk_path);
}

/* ---- prefix reloads run beside the steps ------------------------------------------------ */

/* One session: a long stream S starts decoding, then the tier workload's six prompts go one
 * after another while S keeps running (its tokens and each prompt's go to separate lines
 * of a file). */
#define RL_N 6 /* four distinct prompts, then the first two again */

typedef struct rl_job {
    const char *sock, *out;
    int32_t stream[16];
    int32_t prompt[RL_N][64];
} rl_job;

/* 16 + 112 tokens: 8 blocks of 16 at the end, far beyond the six prompts' ~40 steps; beside
 * a running prompt's 5 blocks they fit the 14-block pool (the stream is never preempted),
 * while from the third prompt on the cached prompts no longer all do: the first ones go to
 * disk before they come back. */
#define RL_STREAM_NEW 112
#define RL_PROMPT_NEW 4

static int client_reload_beside(void *arg)
{
    rl_job *g = arg;
    ringlm_client *c = client_connect(g->sock);
    if (!c) return 2;
    static char sbuf[8192], rbuf[RL_N][1024];
    size_t slen = 0;
    ringlm_request q;
    ringlm_request_init(&q);
    q.prompt = g->stream;
    q.n_prompt = 16;
    q.max_new_tokens = RL_STREAM_NEW;
    q.ignore_stop = true;
    uint64_t sid, rid = 0;
    if (ringlm_submit(c, &q, &sid) < 0) {
        fprintf(stderr, "submit: %s\n", ringlm_errdetail());
        return 4;
    }
    bool s_done = false, s_started = false;
    int next = 0, cur = -1;
    for (;;) {
        if (s_started && cur < 0 && next < RL_N) { /* the next prompt, once the previous ended */
            ringlm_request r;
            ringlm_request_init(&r);
            r.prompt = g->prompt[next];
            r.n_prompt = 64;
            r.max_new_tokens = RL_PROMPT_NEW;
            if (ringlm_submit(c, &r, &rid) < 0) {
                fprintf(stderr, "submit: %s\n", ringlm_errdetail());
                return 4;
            }
            cur = next++;
        }
        if (s_done && cur < 0 && next == RL_N) break;
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 60000);
        if (rc <= 0) {
            fprintf(stderr, "next_event: %s\n", ringlm_errdetail());
            return 5;
        }
        if (ev.req_id == sid) {
            if (ev.kind == RINGLM_EV_TOKEN && slen < sizeof sbuf - 16) {
                slen += (size_t)snprintf(sbuf + slen, sizeof sbuf - slen, "%d ", ev.token);
                s_started = true;
            }
            if (ev.kind == RINGLM_EV_FINISH) {
                snprintf(sbuf + slen, sizeof sbuf - slen, "| %s %u",
                         ringlm_reason_name(ev.finish_reason), ev.n_tokens);
                s_done = s_started = true;
            }
        } else if (cur >= 0 && ev.req_id == rid) {
            size_t l = strlen(rbuf[cur]);
            if (ev.kind == RINGLM_EV_TOKEN && l < sizeof rbuf[cur] - 16)
                snprintf(rbuf[cur] + l, sizeof rbuf[cur] - l, "%d ", ev.token);
            if (ev.kind == RINGLM_EV_FINISH) {
                snprintf(rbuf[cur] + l, sizeof rbuf[cur] - l, "| %s %s %u",
                         ringlm_reason_name(ev.finish_reason), ringlm_reason_name(ev.reject_reason),
                         ev.n_tokens);
                cur = -1;
            }
        }
    }
    FILE *f = fopen(g->out, "w");
    if (!f) return 3;
    fprintf(f, "stream: %s\n", sbuf);
    for (int i = 0; i < RL_N; i++) fprintf(f, "prompt %d: %s\n", i, rbuf[i]);
    fclose(f);
    ringlm_close(c);
    return 0;
}

static void rl_prompts(rl_job *g)
{
    memset(g, 0, sizeof *g);
    for (int i = 0; i < RL_N; i++) tier_prompt(g->prompt[i], i < 4 ? i : i - 4);
    for (int k = 0; k < 16; k++) g->stream[k] = 7 + (k * 977) % 30000;
}

/* The reload-beside model: the stories15M shape, a seventh of stories110M's work per token.
 * Its 16-token block recomputes in ~250-400 us on a quiet machine, about what the default
 * 1 GB/s disk estimate gives its reload (321 us), so these tests start the disk tier's
 * estimate at 100 GB/s (--disk-kv-bw: until a transfer measures it): the cost model keeps
 * and reloads blocks, which is what they are about.  What the cost model chooses on a real
 * disk is the tier tests' (stories110M, TIER_MODEL). */
#define RL_MODEL   "synthetic:stories15M:7"
/* (and the daemon below the client, DMN_BELOW_CLIENTS: with steps this short, a client slow
 * to submit its next prompt would let the stream run out before the last reload) */
#define RL_DISK_BW "100000000000"

/* The reload-beside job through a daemon with `extra` flags. */
static void run_reload_beside(rl_job *g, const char *const *extra, dmn *d, char **out)
{
    run_tier_client(RL_MODEL, client_reload_beside, g, &g->sock, &g->out, 180000, extra, d, out,
                    NULL);
}

/* The iteration-log line of the step at t_us: its decode rows and prefill tokens (-1: none). */
static bool iteration_at(const char *itlog, double t_us, long long *decode, long long *prefill)
{
    FILE *f = fopen(itlog, "r");
    if (!f) return false;
    char line[2048];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        if (json_num_of(line, "t_us") != t_us) continue;
        *decode = (long long)json_num_of(line, "decode_seqs");
        *prefill = (long long)json_num_of(line, "prefill_tokens");
        found = true;
    }
    fclose(f);
    return found;
}

/* A prefix reloading from the disk tier does not hold the others up: its request waits for
 * its copies as a swap-in does, and the step that starts them runs the decoding stream
 * without it (the iteration log's line of that step: a decode row, no prefill), the copy
 * completing later (cache_reload's "done" record after that step) — with the tokens of
 * every request equal to those with the cache off, the reloaded blocks byte-exact
 * (--verify-swaps), no block leaked (the scheduler's invariants, reference counts included). */
Test(daemon_prefix_tiers, prefix_cache_reload_runs_beside_a_decoding_stream)
{
    need_daemon_binary();
    static rl_job g;
    rl_prompts(&g);
    char disk_path[128], itlog[160];
    snprintf(disk_path, sizeof disk_path, "/tmp/ringlmd-pxrlb-%d", (int)getpid());
    snprintf(itlog, sizeof itlog, "/tmp/ringlmd-pxrlb-it-%d.jsonl", (int)getpid());
    static const char *const off_flags[] = {
        "--kv-blocks", "14", "--kv-block-size", "16", "--no-prefix-cache", DMN_BELOW_CLIENTS, NULL};
    const char *on_flags[] = {"--kv-blocks",
                              "14",
                              "--kv-block-size",
                              "16",
                              "--disk-kv",
                              disk_path,
                              "--disk-kv-blocks",
                              "64",
                              "--disk-kv-bw",
                              RL_DISK_BW,
                              "--verify-swaps",
                              DMN_BELOW_CLIENTS,
                              "--iteration-log",
                              itlog,
                              NULL};
    dmn off, on;
    char *a, *b;
    run_reload_beside(&g, off_flags, &off, &a);
    run_reload_beside(&g, on_flags, &on, &b);
    cr_expect_str_eq(b, a, "tokens with prefixes reloaded from disk differ from the cache off");
    /* every reload: the step that started it decoded the stream and computed no prefill, and
     * its completion came after that step */
    FILE *f = fopen(on.declog, "r");
    cr_assert_not_null(f);
    char line[4096];
    int reloads = 0, beside = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"ev\":\"cache_reload\"") || !strstr(line, "\"choice\":\"reload\"") ||
            strstr(line, "\"reason\":"))
            continue;
        reloads++;
        double t0 = json_num_of(line, "t_us"), xfer = json_num_of(line, "xfer");
        char key[64];
        snprintf(key, sizeof key, "\"xfer\":%.0f,", xfer);
        char done[4096];
        snprintf(done, sizeof done, "%s", find_line2(on.declog, key, "\"reason\":\"done\""));
        cr_assert(done[0], "reload %.0f has no completion record", xfer);
        long long dec = -1, pre = -1;
        cr_assert(iteration_at(itlog, t0, &dec, &pre), "no iteration-log line for the step at %.0f",
                  t0);
        cr_log_info("reload %.0f planned at %.0f us, done at %.0f us (%.1f us); its step: %lld "
                    "decode rows, %lld "
                    "prefill tokens",
                    xfer, t0, json_num_of(done, "t_us"), json_num_of(done, "realised_us"), dec,
                    pre);
        cr_expect_gt(json_num_of(done, "t_us"), t0,
                     "reload %.0f completed within the step that started it", xfer);
        cr_expect_eq(pre, 0,
                     "the step that started reload %.0f computed prefill: the request did not wait",
                     xfer);
        beside += dec >= 1;
    }
    fclose(f);
    if (!reloads) dump_file(on.declog, "decision log");
    cr_assert_gt(reloads, 0, "no prefix was reloaded from disk");
    cr_expect_eq(beside, reloads,
                 "the stream did not decode in every step that started a reload (%d of %d)", beside,
                 reloads);
    free(a);
    free(b);
    dmn_cleanup(&off);
    dmn_cleanup(&on);
    unlink(disk_path);
    unlink(itlog);
}

/* A reload whose copy fails (every read from the disk tier completes with EIO: the daemon's
 * fault injection, ringlmd-test --fail-kv-reads) ends its request alone, with an error (finish
 * "error", cause "internal") and a daemon log line naming it; the stream beside it and the
 * other prompts produce the same tokens as with the cache off, and no block is leaked. */
Test(daemon_prefix_tiers, prefix_cache_failed_reload_ends_only_its_request)
{
    need_daemon_binary();
    static rl_job g;
    rl_prompts(&g);
    char disk_path[128];
    snprintf(disk_path, sizeof disk_path, "/tmp/ringlmd-pxrlf-%d", (int)getpid());
    static const char *const off_flags[] = {
        "--kv-blocks", "14", "--kv-block-size", "16", "--no-prefix-cache", DMN_BELOW_CLIENTS, NULL};
    const char *on_flags[] = {TH_TEST_BUILD,
                              "--fail-kv-reads",
                              "disk",
                              "--kv-blocks",
                              "14",
                              "--kv-block-size",
                              "16",
                              "--disk-kv",
                              disk_path,
                              "--disk-kv-blocks",
                              "64",
                              "--disk-kv-bw",
                              RL_DISK_BW,
                              "--verify-swaps",
                              DMN_BELOW_CLIENTS,
                              NULL};
    dmn off, on;
    char *a, *b;
    run_reload_beside(&g, off_flags, &off, &a);
    run_reload_beside(&g, on_flags, &on, &b);
    int failed = count_lines2(on.declog, "\"ev\":\"cache_reload\"", "\"reason\":\"failed\"");
    cr_log_info("%d reloads failed", failed);
    cr_assert_gt(failed, 0, "no reload failed after the disk tier file was cut");
    /* line by line: the stream and every prompt not reloaded as with the cache off; a prompt
     * whose reload failed ended with an error */
    char *sa = NULL, *sb = NULL;
    int errors = 0;
    for (char *la = strtok_r(a, "\n", &sa), *lb = strtok_r(b, "\n", &sb); la && lb;
         la = strtok_r(NULL, "\n", &sa), lb = strtok_r(NULL, "\n", &sb)) {
        if (strstr(lb, "| error internal")) {
            errors++;
            cr_expect(strncmp(lb, "prompt ", 7) == 0, "%s", lb);
            continue;
        }
        cr_expect_str_eq(lb, la, "a request its failed reload was not for changed");
    }
    cr_expect_eq(errors, failed, "%d requests ended with an error, %d reloads failed", errors,
                 failed);
    /* the decision log says why each ended: its own reason, not a shutdown */
    cr_expect_eq(count_lines2(on.declog, "\"ev\":\"cancel\"", "\"reason\":\"kv_read_failed\""),
                 failed, "cancel events with reason kv_read_failed");
    cr_expect_eq(count_lines2(on.declog, "\"ev\":\"cancel\"", "\"reason\":\"shutdown\""), 0,
                 "a failed reload was logged as a shutdown");
    cr_expect_eq(count_lines(on.errlog, "reloading its cached prefix"), failed,
                 "no daemon log line per failed reload");
    free(a);
    free(b);
    dmn_cleanup(&off);
    dmn_cleanup(&on);
    unlink(disk_path);
}

/* ---- the reload-or-recompute choice at admission ------------------------------------------ */

/* The last decision-log line holding both needles (static buffer; "" when none). */
static const char *find_last2(const char *path, const char *a, const char *b)
{
    static char line[4096], keep[4096];
    keep[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return keep;
    while (fgets(line, sizeof line, f))
        if (strstr(line, a) && strstr(line, b)) memcpy(keep, line, sizeof keep);
    fclose(f);
    return keep;
}

/* out with its first line repeated: times copies of it, then the rest (free it). */
static char *repeat_first_line(const char *out, int times)
{
    const char *nl = strchr(out, '\n');
    cr_assert_not_null(nl, "no line in %s", out);
    size_t first = (size_t)(nl + 1 - out), rest = strlen(nl + 1);
    char *r = malloc(first * (size_t)times + rest + 1), *w = r;
    cr_assert_not_null(r);
    for (int i = 0; i < times; i++, w += first) memcpy(w, out, first);
    memcpy(w, nl + 1, rest + 1);
    return r;
}

/* A prompt used 64 times is worth keeping on a disk tier even when reading a block back costs
 * 8 times computing it (reload < recompute × expected reuse 64), but when it comes back,
 * computing it again is the cheaper way (reload > recompute): the admission finds it on disk,
 * chooses recompute and the decision log shows both estimates; the tokens equal those with the
 * cache off.  The disk's bandwidth (--disk-kv-bw: the cost model's until a reload measures it)
 * is set from a first run's own estimates — the block's bytes and its recompute cost on this
 * machine now — so the reload costs 8x the recompute, the geometric middle of the window
 * (1, 64) where the two decisions differ: the choice holds while the load changes the
 * recompute cost up to 8x either way between the two runs (with eight uses the window was
 * (1, 8) and a 2.8x change could flip it). */
Test(daemon_prefix_tiers, prefix_cache_slow_tier_found_at_admission_is_recomputed)
{
    need_daemon_binary();
    const char *model = "synthetic:stories15M:7";
    static seq_job g;
    memset(&g, 0, sizeof g);
    g.n = 5;
    g.max_new = 4;
    for (int i = 0; i < g.n; i++) g.n_prompt[i] = 64;
    for (int k = 0; k < 64; k++) g.prompt[0][k] = 1 + (k * 131 + k * k) % 30000;
    g.repeat[0] = 64;    /* P 64 times: its blocks' expected reuse 64 */
    g.max_new_of[0] = 1; /* each of those one step (the uses count, not their answers) */
    for (int i = 1; i < 4; i++)
        for (int k = 0; k < 64; k++)
            g.prompt[i][k] = 1 + (i * 104729 + k * 17 + k * k * 3) % 30000; /* Q1..Q3 */
    memcpy(g.prompt[4], g.prompt[0], sizeof g.prompt[0]);                   /* and P again */
    char disk_path[128], bw[64];
    snprintf(disk_path, sizeof disk_path, "/tmp/ringlmd-pxrc-%d", (int)getpid());
    static const char *const off_flags[] = {"--kv-blocks",       "12", "--kv-block-size", "16",
                                            "--no-prefix-cache", NULL};
    const char *cal_flags[] = {"--kv-blocks", "12",      "--kv-block-size",  "16",
                               "--disk-kv",   disk_path, "--disk-kv-blocks", "64",
                               NULL};
    dmn off, cal, slow;
    char *a, *c, *b;
    /* the tokens with the cache off: each prompt once, P's line then stands for its 64 uses
     * (with nothing cached each use computes the same; the 64 took half this test's time
     * under SANITIZE=1) */
    static seq_job once;
    once = g;
    once.repeat[0] = 0;
    char *a1;
    run_tiers(model, &once, off_flags, &off, &a1, NULL);
    a = repeat_first_line(a1, g.repeat[0]);
    free(a1);
    run_tiers(model, &g, cal_flags, &cal, &c, NULL);
    const char *dm = find_line2(cal.declog, "\"ev\":\"cache_demote\"", "\"recompute_cost_us\":");
    cr_assert(dm[0], "the first run demoted nothing to disk");
    double bytes = json_num_of(dm, "bytes") / json_num_of(dm, "blocks"),
           rc = json_num_of(dm, "recompute_cost_us");
    /* the admission's estimate: the last recompute estimate the first run logged */
    const char *last = find_last2(cal.declog, "\"recompute_cost_us\":", "\"blocks\":");
    if (last[0] && json_num_of(last, "recompute_cost_us") > 0)
        rc = json_num_of(last, "recompute_cost_us") /
             (strstr(last, "cache_reload") ? json_num_of(last, "blocks") : 1);
    cr_assert_gt(bytes, 0);
    cr_assert_gt(rc, 0);
    double reload_target = 8 * rc - 100; /* the disk's latency is 100 us of it */
    if (reload_target < rc) reload_target = rc;
    snprintf(bw, sizeof bw, "%.0f", bytes / (reload_target * 1e-6));
    cr_log_info("a block: %.0f bytes, recompute %.1f us: --disk-kv-bw %s", bytes, rc, bw);
    const char *slow_flags[] = {"--kv-blocks",  "12",      "--kv-block-size",  "16",
                                "--disk-kv",    disk_path, "--disk-kv-blocks", "64",
                                "--disk-kv-bw", bw,        "--verify-swaps",   NULL};
    unlink(disk_path);
    run_tiers(model, &g, slow_flags, &slow, &b, NULL);
    cr_expect_str_eq(b, a, "tokens differ from the cache off");
    cr_expect_gt(count_lines2(slow.declog, "\"ev\":\"cache_demote\"", "\"to\":\"disk\""), 0,
                 "the prompt used 64 times was not kept on disk");
    const char *rl = find_line2(slow.declog, "\"ev\":\"cache_reload\"", "\"choice\":\"recompute\"");
    if (!rl[0]) dump_file(slow.declog, "decision log");
    cr_assert(rl[0], "no cached run found on disk was recomputed");
    cr_log_info("slow disk at admission: %s", rl);
    cr_expect(strstr(rl, "\"pool\":\"disk\""), "%s", rl);
    cr_expect_gt(json_num_of(rl, "reload_cost_us"), json_num_of(rl, "recompute_cost_us"), "%s", rl);
    cr_expect_gt(json_num_of(rl, "recompute_cost_us"), 0, "%s", rl);
    cr_expect_eq(count_lines2(slow.declog, "\"ev\":\"cache_reload\"", "\"choice\":\"reload\""), 0,
                 "a run on the slow disk was reloaded");
    free(a);
    free(b);
    free(c);
    dmn_cleanup(&off);
    dmn_cleanup(&cal);
    dmn_cleanup(&slow);
    unlink(disk_path);
}
