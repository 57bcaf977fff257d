/* SPDX-License-Identifier: MIT */
/*
 * ringlmd end to end, its outputs: greedy streams equal the reference token for token, in
 * one mixed batch, at a fixed length (ignore_stop), and through every kind of preemption
 * (swap to host or disk, recompute, auto). A real daemon process on a private socket, real
 * client processes (fork + libringlm) (tests/daemon_helpers.h); every test stops every
 * process it starts and checks that every KV block is accounted for.
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

TestSuite(daemon_outputs, .timeout = 120);

Test(daemon_outputs, greedy_reference_all_cases_in_one_batch)
{
    char model[512];
    static ref_case cases[12];
    int n = need_stories_refs(model, sizeof model, cases, 12, 1);
    dmn d;
    dmn_start(&d, model, NULL, NULL);
    gen_job g = {.sock = d.sock, .cases = cases, .n_cases = n};
    int st = reap(spawn(client_greedy, &g), 60000);
    cr_expect_eq(st, 0, "greedy client exit %d (see its stderr above)", st);
    assert_back_to_baseline(&d, 5000);
    int ex = dmn_stop(&d, SIGTERM, 10000);
    cr_expect_eq(ex, 0, "ringlmd exit status %d after SIGTERM", ex);
    cr_expect_geq(count_lines(d.reqlog, "\"finish_reason\":\"length\""), 1,
                  "request log has no finished lines");
    if (st != 0 || ex != 0) dump_file(d.errlog, "ringlmd stderr");
    dmn_cleanup(&d);
}

/* Client process for the fixed-length flag: one reference case that stops on the stop
 * token, submitted plainly (it must stop early, as the reference) and with ignore_stop and
 * max_new_tokens past that point (it must run to exactly max_new_tokens: the reference
 * tokens, then the stop token itself, then more). Exit 0 when both hold. */
typedef struct fixed_job {
    const char *sock;
    const ref_case *c;
    uint32_t max_new;
} fixed_job;

static int client_fixed_length(void *arg)
{
    fixed_job *g = arg;
    ringlm_client *c;
    int rc = ringlm_connect(g->sock, &c);
    if (rc < 0) {
        fprintf(stderr, "connect: %s %s\n", ringlm_strerror(rc), ringlm_errdetail());
        return 2;
    }
    uint64_t ids[2];
    for (int i = 0; i < 2; i++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = g->c->prompt;
        r.n_prompt = g->c->n_prompt;
        r.max_new_tokens = g->max_new;
        r.ignore_stop = i == 1;
        if ((rc = ringlm_submit(c, &r, &ids[i])) < 0) {
            fprintf(stderr, "submit %d: %s %s\n", i, ringlm_strerror(rc), ringlm_errdetail());
            return 3;
        }
    }
    static int32_t got[2][600];
    uint32_t n_got[2] = {0}, n_fin[2] = {0};
    int reason[2] = {0}, left = 2, bad = 0;
    while (left > 0) {
        ringlm_event ev;
        rc = ringlm_next_event(c, &ev, 60000);
        if (rc <= 0) {
            fprintf(stderr, "next_event: %d %s %s\n", rc, ringlm_strerror(rc), ringlm_errdetail());
            return 4;
        }
        int i = ev.req_id == ids[0] ? 0 : ev.req_id == ids[1] ? 1 : -1;
        if (i < 0) {
            fprintf(stderr, "event for unknown id\n");
            return 5;
        }
        if (ev.kind == RINGLM_EV_TOKEN && n_got[i] < 600)
            got[i][n_got[i]++] = ev.token;
        else if (ev.kind == RINGLM_EV_FINISH) {
            reason[i] = ev.finish_reason;
            n_fin[i] = ev.n_tokens;
            left--;
        }
    }
    ringlm_close(c);
    const ref_case *rf = g->c;
    if (reason[0] != RINGLM_FINISH_STOP || n_got[0] != rf->n_gen) {
        fprintf(stderr, "plain: finish %s after %u tokens, reference stops after %u\n",
                ringlm_reason_name(reason[0]), n_got[0], rf->n_gen);
        bad++;
    }
    if (reason[1] != RINGLM_FINISH_LENGTH || n_got[1] != g->max_new || n_fin[1] != g->max_new) {
        fprintf(stderr,
                "ignore_stop: finish %s with %u tokens (%u streamed), expected length "
                "with exactly %u\n",
                ringlm_reason_name(reason[1]), n_fin[1], n_got[1], g->max_new);
        bad++;
    }
    for (uint32_t k = 0; k < rf->n_gen && k < n_got[1]; k++)
        if (got[1][k] != rf->gen[k]) {
            fprintf(stderr, "ignore_stop: token %u is %d, reference %d\n", k, got[1][k],
                    rf->gen[k]);
            bad++;
            break;
        }
    if (n_got[1] > rf->n_gen && got[1][rf->n_gen] != 1) {
        fprintf(stderr,
                "ignore_stop: token %u is %d, not the stop token the reference stopped on\n",
                rf->n_gen, got[1][rf->n_gen]);
        bad++;
    }
    return bad ? 1 : 0;
}

Test(daemon_outputs, ignore_stop_generates_exactly_max_new_tokens)
{
    char model[512];
    static ref_case cases[12];
    int n = need_stories_refs(model, sizeof model, cases, 12, 1);
    const ref_case *stopping = NULL;
    for (int i = 0; i < n && !stopping; i++)
        if (cases[i].stops && cases[i].n_prompt + cases[i].n_gen + 40 < 512) stopping = &cases[i];
    cr_assert(stopping, "no reference case stops on the stop token early enough");
    dmn d;
    dmn_start(&d, model, NULL, NULL);
    fixed_job g = {.sock = d.sock, .c = stopping, .max_new = stopping->n_gen + 40};
    int st = reap(spawn(client_fixed_length, &g), 60000);
    cr_expect_eq(st, 0, "fixed-length client exit %d (see its stderr above)", st);
    int ex = dmn_stop(&d, SIGTERM, 10000);
    cr_expect_eq(ex, 0, "ringlmd exit status %d after SIGTERM", ex);
    if (st != 0 || ex != 0) dump_file(d.errlog, "ringlmd stderr");
    dmn_cleanup(&d);
}

/* Forced preemption: a KV pool too small for the four sequences at once. Every mode must
 * reproduce the unpreempted greedy tokens; swap-ins are verified byte-exact by the daemon
 * (--verify-swaps checksums each block at swap-out and compares at swap-in). */
static void preempt_mode_tier(const char *mode, bool disk);
static void preempt_mode(const char *mode)
{
    preempt_mode_tier(mode, false);
}
static void preempt_mode_tier(const char *mode, bool disk)
{
    char model[512];
    static ref_case all[12], cases[4];
    need_stories_refs(model, sizeof model, all, 12, 8);
    /* The four 256-step cases: ~17 blocks of 16 tokens each at the end. */
    for (int i = 0; i < 4; i++) cases[i] = all[4 + i];
    char policy[512];
    snprintf(policy, sizeof policy,
             "[scheduler]\nmode = token_budget\ntoken_budget = 64\nmax_active_seqs = 8\n"
             "prefill_chunk = 32\npreemption = %s\nmin_residency = 0us\nmax_preemptions = 0\n",
             mode);
    char disk_path[128];
    snprintf(disk_path, sizeof disk_path, "/tmp/ringlmd-kvdisk-%d", (int)getpid());
    const char *extra_host[] = {"--kv-blocks",      "24", "--kv-block-size", "16",
                                "--host-kv-blocks", "64", "--verify-swaps",  NULL};
    const char *extra_disk[] = {"--kv-blocks",    "24",      "--kv-block-size",  "16",
                                "--disk-kv",      disk_path, "--disk-kv-blocks", "64",
                                "--verify-swaps", NULL};
    dmn d;
    dmn_start(&d, model, policy, disk ? extra_disk : extra_host);
    gen_job g = {.sock = d.sock, .cases = cases, .n_cases = 4};
    int st = reap(spawn(client_greedy, &g), 60000);
    cr_expect_eq(st, 0, "mode %s: greedy tokens differ from the unpreempted reference", mode);
    assert_back_to_baseline(&d, 5000);
    json_t *j = dmn_stats(&d);
    long long verified = jint(j, "swap_verified");
    json_decref(j);
    int ex = dmn_stop(&d, SIGTERM, 10000);
    cr_expect_eq(ex, 0);
    int preempts = count_lines(d.declog, "\"ev\":\"preempt\"");
    int swaps = count_lines(d.declog, "\"mode\":\"swap\"");
    int recomputes = count_lines(d.declog, "\"mode\":\"recompute\"");
    cr_log_info("mode %s: %d preemptions (%d swap, %d recompute), %lld blocks verified", mode,
                preempts, swaps, recomputes, verified);
    cr_expect_gt(preempts, 0, "mode %s: the small pool forced no preemption", mode);
    if (!strcmp(mode, "swap")) {
        cr_expect_gt(swaps, 0, "swap mode without a swap preemption");
        cr_expect_gt(verified, 0, "swap mode: no swap-in was verified");
    }
    if (!strcmp(mode, "recompute")) cr_expect_eq(swaps, 0, "recompute mode swapped");
    if (st != 0) dump_file(d.errlog, "ringlmd stderr");
    dmn_cleanup(&d);
    unlink(disk_path);
}

Test(daemon_outputs, preempt_swap_same_tokens)
{
    preempt_mode("swap");
}
Test(daemon_outputs, preempt_swap_disk_tier_same_tokens)
{
    preempt_mode_tier("swap", true);
}
Test(daemon_outputs, preempt_recompute_same_tokens)
{
    preempt_mode("recompute");
}
Test(daemon_outputs, preempt_auto_same_tokens)
{
    preempt_mode("auto");
}
