/* SPDX-License-Identifier: MIT */
/*
 * ringlmd end to end: a real daemon process on a private socket, real client processes
 * (fork + libringlm). Every test stops every process it starts and checks that every KV
 * block is accounted for (used + free = total per tier, scheduler invariants) through the
 * daemon's --stats-file.
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
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ringlm.h"
#include "formats/stats.h"
#include "tests/helpers.h"
#include "tools/prom.h"

/* ---- harness ------------------------------------------------------------------------- */

typedef struct dmn {
    th_daemon th; /* tests/helpers.c starts and stops it */
    char dir[64];
    char sock[128], stats[128], declog[128], reqlog[128], errlog[128], policy[128];
    char out[160]; /* a client's output (dmn_start_for) */
    pid_t pid;
} dmn;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* A short pause between polls of a condition (never a synchronisation by itself). */
static void poll_pause(void)
{
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

static bool stories_path(char *out, size_t n)
{
    snprintf(out, n, "%s/models/stories260K.bin", th_shared_dir());
    return access(out, R_OK) == 0;
}

/* Scenarios that compare no tokens run on the synthetic stories260K shape when the real
 * checkpoint is absent. */
static void model_or_synthetic(char *out, size_t n)
{
    if (!stories_path(out, n)) snprintf(out, n, "synthetic:stories260K:1");
}

static void need_daemon_binary(void)
{
    char p[512];
    snprintf(p, sizeof p, "%s/ringlmd", th_bin_dir());
    if (access(p, X_OK) != 0) cr_skip_test("%s not built (set RINGLM_BIN)", p);
}

static void dump_file(const char *path, const char *what)
{
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[512];
    int n = 0;
    fprintf(stderr, "---- %s (%s) ----\n", what, path);
    while (fgets(line, sizeof line, f) && n++ < 60) fputs(line, stderr);
    fclose(f);
}

/* Starts ringlmd (tests/helpers.c) with its stats file and logs in its private directory;
 * returns once its socket answers and its stats file exists. */
#define DMN_START_MS      100000
/* An extra option for a test whose assertion needs its clients to act while the daemon still
 * works (submit more, be killed mid-prefill, see a first token when it comes): ringlmd then
 * runs at nice 19. By default it takes nice -10 (these tests run as root), 20 levels above
 * the clients under `nice -n 10 make test`, and on a loaded machine it finished the work
 * before a client woke — not what the test was about. At 19 a woken client preempts it. */
#define DMN_BELOW_CLIENTS "--nice", "19"
static void dmn_start(dmn *d, const char *model, const char *policy_text, const char *const *extra)
{
    memset(d, 0, sizeof *d);
    th_daemon_init(&d->th);
    snprintf(d->dir, sizeof d->dir, "%s", d->th.dir);
    snprintf(d->sock, sizeof d->sock, "%s", d->th.sock);
    snprintf(d->errlog, sizeof d->errlog, "%s", d->th.log);
    snprintf(d->stats, sizeof d->stats, "%s/stats.json", d->dir);
    snprintf(d->declog, sizeof d->declog, "%s/decisions.jsonl", d->dir);
    snprintf(d->reqlog, sizeof d->reqlog, "%s/requests.jsonl", d->dir);
    if (policy_text) {
        snprintf(d->policy, sizeof d->policy, "%s/policy.conf", d->dir);
        FILE *f = fopen(d->policy, "w");
        cr_assert_not_null(f);
        fputs(policy_text, f);
        fclose(f);
    }
    const char *argv[64];
    int a = 0;
    if (extra && extra[0] && !strcmp(extra[0], TH_TEST_BUILD)) argv[a++] = *extra++; /* first */
    argv[a++] = "--model";
    argv[a++] = model;
    argv[a++] = "--stats-file";
    argv[a++] = d->stats;
    argv[a++] = "--check-invariants";
    argv[a++] = "--decision-log";
    argv[a++] = d->declog;
    argv[a++] = "--request-log";
    argv[a++] = d->reqlog;
    if (policy_text) {
        argv[a++] = "--policy";
        argv[a++] = d->policy;
    }
    for (int i = 0; extra && extra[i] && a < 56; i++) argv[a++] = extra[i];
    argv[a] = NULL;
    /* The start is waited for as an event (its socket listening, or its exit); the bound
     * only stops a daemon that hangs. synthetic:stories110M (the tier tests) is synthesized
     * and warmed up before the daemon listens: 17.7 s at load 23, so 20 s failed them. */
    th_daemon_start(&d->th, argv, DMN_START_MS);
    d->pid = d->th.pid;
    uint64_t deadline = now_ms() + DMN_START_MS;
    while (access(d->stats, R_OK) != 0) {
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            d->pid = d->th.pid = 0;
            dump_file(d->errlog, "ringlmd stderr");
            cr_assert_fail("ringlmd exited at start (status %d)", st);
        }
        cr_assert(now_ms() < deadline, "ringlmd wrote no stats file within %d ms", DMN_START_MS);
        poll_pause();
    }
}

/* Sends sig and waits up to timeout_ms for exit; SIGKILL after. Returns the exit status
 * (or 128+signal). */
static int dmn_stop(dmn *d, int sig, int timeout_ms)
{
    d->th.pid = d->pid;
    int rc = th_daemon_stop(&d->th, sig, timeout_ms);
    d->pid = 0;
    if (rc == 999) dump_file(d->errlog, "ringlmd stderr");
    return rc;
}

static void dmn_cleanup(dmn *d)
{
    d->th.pid = d->pid;
    th_daemon_cleanup(&d->th);
    d->pid = 0;
}

static json_t *dmn_stats(dmn *d)
{
    for (int i = 0; i < 50; i++) {
        json_error_t e;
        json_t *j = json_load_file(d->stats, 0, &e);
        if (j) return j;
        poll_pause();
    }
    return NULL;
}

/* The daemon's /metrics port, from its "metrics on port N" line (0: none). */
static int metrics_port(const dmn *d)
{
    int port = 0;
    FILE *f = fopen(d->errlog, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "ringlmd: metrics on port %d", &port) == 1) break;
    if (f) fclose(f);
    return port;
}

static long long jint(json_t *o, const char *path)
{
    /* "a.b.c" */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = json_object_get(cur, tok);
    return cur && json_is_integer(cur) ? (long long)json_integer_value(cur) : -1;
}

/* Waits until every request is gone and no KV block is used in any tier; asserts the
 * accounting identity and the scheduler's invariants on the way. */
static void assert_back_to_baseline(dmn *d, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    char last[1024] = "";
    for (;;) {
        /* the stats file is read by formats/stats.h, its one reader: a file it cannot read
         * is a broken writer, not a retry (the file is renamed into place whole) */
        fmt_stats st;
        char why[200];
        int rc = fmt_stats_read(d->stats, &st, why, sizeof why);
        cr_assert_eq(rc, 0, "stats file %s: %s", d->stats, why);
        snprintf(last, sizeof last,
                 "live %llu, device %llu/%llu/%llu, host %llu/%llu/%llu, disk %llu/%llu/%llu, "
                 "transfers %llu, invariants %s",
                 (unsigned long long)st.live_requests, (unsigned long long)st.kv[0].used,
                 (unsigned long long)st.kv[0].free, (unsigned long long)st.kv[0].total,
                 (unsigned long long)st.kv[1].used, (unsigned long long)st.kv[1].free,
                 (unsigned long long)st.kv[1].total, (unsigned long long)st.kv[2].used,
                 (unsigned long long)st.kv[2].free, (unsigned long long)st.kv[2].total,
                 (unsigned long long)st.transfers_inflight, st.invariants);
        for (int p = 0; p < FMT_STATS_POOLS; p++)
            cr_assert_eq(st.kv[p].used + st.kv[p].free, st.kv[p].total,
                         "pool %s: used + free != total: %s", fmt_stats_pool_names[p], last);
        cr_assert_str_eq(st.invariants, "ok", "scheduler invariants: %s", last);
        cr_assert_eq(st.swap_verify_errors, 0, "swap-in not byte-exact: %s", last);
        cr_assert_eq(st.transfer_overlap_errors, 0, "a block was in two transfers at once: %s",
                     last);
        bool idle = st.live_requests == 0 && st.kv[0].used == 0 && st.kv[1].used == 0 &&
                    st.kv[2].used == 0 && st.transfers_inflight == 0;
        if (idle) return;
        if (now_ms() > deadline) {
            dump_file(d->errlog, "ringlmd stderr");
            cr_assert_fail("daemon did not return to baseline within %d ms: %s", timeout_ms, last);
        }
        poll_pause();
    }
}

/* Forks a client process running fn(arg); returns its pid. */
static pid_t spawn(int (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t p = fork();
    cr_assert_geq(p, 0);
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* nor its clients */
        _exit(fn(arg));
    }
    return p;
}

static int reap(pid_t p, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    int st;
    for (;;) {
        pid_t w = waitpid(p, &st, WNOHANG);
        if (w == p) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (now_ms() > deadline) {
            kill(p, SIGKILL);
            waitpid(p, &st, 0);
            return 999;
        }
        poll_pause();
    }
}

/* ---- reference greedy cases ---------------------------------------------------------- */

typedef struct ref_case {
    int32_t prompt[16];
    uint32_t n_prompt;
    int32_t gen[600];
    uint32_t n_gen;
    bool stops;
    uint32_t max_new;
} ref_case;

static int load_refs(ref_case *out, int max)
{
    char p[512];
    snprintf(p, sizeof p, "%s/models/reference-greedy.json", th_shared_dir());
    json_error_t e;
    json_t *j = json_load_file(p, 0, &e);
    if (!j) return 0;
    json_t *cases = json_object_get(j, "cases");
    int n = 0;
    for (size_t i = 0; i < json_array_size(cases) && n < max; i++) {
        json_t *c = json_array_get(cases, i);
        ref_case *r = &out[n];
        memset(r, 0, sizeof *r);
        json_t *pt = json_object_get(c, "prompt_tokens"),
               *gt = json_object_get(c, "generated_tokens");
        if (json_array_size(pt) > 16 || json_array_size(gt) > 600) continue;
        for (size_t k = 0; k < json_array_size(pt); k++)
            r->prompt[r->n_prompt++] = (int32_t)json_integer_value(json_array_get(pt, k));
        for (size_t k = 0; k < json_array_size(gt); k++)
            r->gen[r->n_gen++] = (int32_t)json_integer_value(json_array_get(gt, k));
        r->stops = json_is_true(json_object_get(c, "stopped_on_bos"));
        int steps = (int)json_integer_value(json_object_get(c, "effective_steps"));
        /* steps positions including the prompt: the last one samples token steps+1. */
        r->max_new = (uint32_t)(steps - (int)r->n_prompt + 1);
        n++;
    }
    json_decref(j);
    return n;
}

typedef struct gen_job {
    const char *sock;
    const ref_case *cases;
    int n_cases;
    const char *class_name;
    const char *tenant;
} gen_job;

/* Client process: submits every case at once (one mixed batch), checks each stream against
 * the reference token by token. Exit 0 when all match. */
static int client_greedy(void *arg)
{
    gen_job *g = arg;
    ringlm_client *c;
    int rc = ringlm_connect(g->sock, &c);
    if (rc < 0) {
        fprintf(stderr, "connect: %s %s\n", ringlm_strerror(rc), ringlm_errdetail());
        return 2;
    }
    uint64_t ids[32];
    static int32_t got[32][600];
    uint32_t n_got[32] = {0};
    for (int i = 0; i < g->n_cases; i++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = g->cases[i].prompt;
        r.n_prompt = g->cases[i].n_prompt;
        r.max_new_tokens = g->cases[i].max_new;
        r.class_name = g->class_name;
        r.tenant_tag = g->tenant;
        rc = ringlm_submit(c, &r, &ids[i]);
        if (rc < 0) {
            fprintf(stderr, "submit %d: %s %s\n", i, ringlm_strerror(rc), ringlm_errdetail());
            return 3;
        }
    }
    int left = g->n_cases, bad = 0;
    while (left > 0) {
        ringlm_event ev;
        rc = ringlm_next_event(c, &ev, 60000);
        if (rc <= 0) {
            fprintf(stderr, "next_event: %d %s %s\n", rc, ringlm_strerror(rc), ringlm_errdetail());
            return 4;
        }
        int i = 0;
        while (i < g->n_cases && ids[i] != ev.req_id) i++;
        if (i == g->n_cases) {
            fprintf(stderr, "event for unknown id %llu\n", (unsigned long long)ev.req_id);
            return 5;
        }
        if (ev.kind == RINGLM_EV_TOKEN) {
            if (ev.index != n_got[i]) {
                fprintf(stderr, "case %d: token index %u, expected %u\n", i, ev.index, n_got[i]);
                bad++;
            }
            if (n_got[i] < 600) got[i][n_got[i]++] = ev.token;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            left--;
            const ref_case *rc_ = &g->cases[i];
            int want_reason = rc_->stops ? RINGLM_FINISH_STOP : RINGLM_FINISH_LENGTH;
            if (ev.finish_reason != want_reason || ev.n_tokens != rc_->n_gen ||
                n_got[i] != rc_->n_gen) {
                fprintf(stderr,
                        "case %d: finish %s/%s n_tokens %u got %u, expected %s with %u tokens\n", i,
                        ringlm_reason_name(ev.finish_reason), ringlm_reason_name(ev.reject_reason),
                        ev.n_tokens, n_got[i], ringlm_reason_name(want_reason), rc_->n_gen);
                bad++;
            }
            for (uint32_t k = 0; k < n_got[i] && k < rc_->n_gen; k++) {
                if (got[i][k] != rc_->gen[k]) {
                    fprintf(stderr, "case %d: token %u is %d, reference %d\n", i, k, got[i][k],
                            rc_->gen[k]);
                    bad++;
                    break;
                }
            }
            if (ev.policy_hash == 0) {
                fprintf(stderr, "case %d: finish without policy hash\n", i);
                bad++;
            }
        }
    }
    ringlm_close(c);
    return bad ? 1 : 0;
}

static int count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle)) n++;
    fclose(f);
    return n;
}

static int count_lines2(const char *path, const char *a, const char *b);

TestSuite(daemon_e2e, .timeout = 120);

Test(daemon_e2e, greedy_reference_all_cases_in_one_batch)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    static ref_case cases[12];
    int n = load_refs(cases, 12);
    if (n == 0) cr_skip_test("reference-greedy.json not found");
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

Test(daemon_e2e, ignore_stop_generates_exactly_max_new_tokens)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    static ref_case cases[12];
    int n = load_refs(cases, 12);
    if (n == 0) cr_skip_test("reference-greedy.json not found");
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
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    static ref_case all[12], cases[4];
    int n = load_refs(all, 12);
    if (n < 8) cr_skip_test("reference-greedy.json not found");
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

Test(daemon_e2e, preempt_swap_same_tokens)
{
    preempt_mode("swap");
}
Test(daemon_e2e, preempt_swap_disk_tier_same_tokens)
{
    preempt_mode_tier("swap", true);
}
Test(daemon_e2e, preempt_recompute_same_tokens)
{
    preempt_mode("recompute");
}
Test(daemon_e2e, preempt_auto_same_tokens)
{
    preempt_mode("auto");
}

/* ---- generic load client ------------------------------------------------------------- */

typedef struct load_job {
    const char *sock;
    const char *tenant; /* tenant tag (trusted uid) or NULL */
    const char *class_name;
    int n_requests;       /* total to submit (0 = until duration_ms) */
    int concurrency;      /* closed loop: requests in flight */
    uint64_t interval_us; /* open loop: one submit per interval (0 = closed loop) */
    uint64_t duration_ms; /* stop submitting after this long (0 = no limit) */
    uint64_t start_at_us; /* CLOCK_MONOTONIC µs to start at (0 = now) */
    uint32_t prompt_len, max_new;
    int32_t token_base;
    int vocab;
    const char *out_path;        /* one line per request */
    int ready_fd;                /* write one byte after the first token (or -1) */
    uint64_t deadline_us;        /* per request, relative (0 = none) */
    const int32_t *fixed_prompt; /* this prompt (prompt_len tokens) for every request */
    bool never_read;             /* submit, then stop reading (backpressure) */
    int wait_fd;                 /* never_read: read one byte here before reading events */
    int gate_after, gate_fd;     /* after this many submits (0: never), read one byte at gate_fd */
} load_job;

typedef struct req_rec {
    uint64_t id, submit_us, first_us, end_us;
    uint32_t n_tokens, next_index;
    int reason, cause;
    bool done, index_error;
} req_rec;

static int client_load(void *arg)
{
    load_job *L = arg;
    ringlm_client *c;
    int rc = ringlm_connect(L->sock, &c);
    if (rc < 0) {
        fprintf(stderr, "load connect: %s %s\n", ringlm_strerror(rc), ringlm_errdetail());
        return 2;
    }
    int cap = L->n_requests > 0 ? L->n_requests : 100000;
    req_rec *recs = calloc((size_t)cap, sizeof *recs);
    int32_t *prompt = malloc(sizeof(int32_t) * (L->prompt_len ? L->prompt_len : 1));
    int submitted = 0, finished = 0, inflight = 0;
    if (L->start_at_us)
        while (now_us() < L->start_at_us) poll_pause();
    uint64_t t0 = now_us(), next_submit = t0;
    bool ready_sent = false;
    for (;;) {
        uint64_t t = now_us();
        bool may_submit = submitted < cap && (!L->duration_ms || t - t0 < L->duration_ms * 1000);
        while (may_submit && (L->interval_us ? t >= next_submit : inflight < L->concurrency)) {
            for (uint32_t k = 0; k < L->prompt_len; k++)
                prompt[k] =
                    L->fixed_prompt
                        ? L->fixed_prompt[k]
                        : (int32_t)((L->token_base + 7 * submitted + 3 * (int)k) % (L->vocab - 3) +
                                    3);
            ringlm_request r;
            ringlm_request_init(&r);
            r.prompt = prompt;
            r.n_prompt = L->prompt_len;
            r.max_new_tokens = L->max_new;
            r.class_name = L->class_name;
            r.tenant_tag = L->tenant;
            r.deadline_us = L->deadline_us;
            req_rec *q = &recs[submitted];
            q->submit_us = now_us();
            rc = ringlm_submit(c, &r, &q->id);
            if (rc == -EAGAIN) break;
            if (rc < 0) {
                fprintf(stderr, "load submit: %s %s\n", ringlm_strerror(rc), ringlm_errdetail());
                goto out;
            }
            submitted++;
            inflight++;
            if (L->gate_after && submitted == L->gate_after) {
                char b;
                if (read(L->gate_fd, &b, 1) != 1) { /* parent gone */
                }
            }
            next_submit += L->interval_us;
            may_submit = submitted < cap && (!L->duration_ms || t - t0 < L->duration_ms * 1000);
        }
        if (!may_submit && inflight == 0) break;
        if (L->never_read) {
            if (!may_submit) {
                char b;
                if (read(L->wait_fd, &b, 1) != 1) { /* parent gone */
                }
                L->never_read = false;
            } else {
                continue;
            }
        }
        int to = L->interval_us ? 1 : 200;
        ringlm_event ev;
        rc = ringlm_next_event(c, &ev, to);
        if (rc < 0) {
            fprintf(stderr, "load next_event: %s %s\n", ringlm_strerror(rc), ringlm_errdetail());
            goto out;
        }
        if (rc == 0) continue;
        int i = submitted - 1;
        while (i >= 0 && recs[i].id != ev.req_id) i--;
        if (i < 0) continue;
        req_rec *q = &recs[i];
        if (ev.kind == RINGLM_EV_TOKEN) {
            if (!q->first_us) q->first_us = now_us();
            if (ev.index != q->next_index) q->index_error = true;
            q->next_index = ev.index + 1;
            q->n_tokens++;
            if (!ready_sent && L->ready_fd >= 0) {
                if (write(L->ready_fd, "r", 1) != 1) { /* parent gone */
                }
                ready_sent = true;
            }
        } else {
            q->end_us = now_us();
            q->reason = ev.finish_reason;
            q->cause = ev.reject_reason;
            q->done = true;
            if (ev.n_tokens != q->n_tokens) q->index_error = true;
            finished++;
            inflight--;
        }
    }
out:;
    FILE *f = L->out_path ? fopen(L->out_path, "w") : NULL;
    for (int i = 0; f && i < submitted; i++) {
        req_rec *q = &recs[i];
        fprintf(f, "%d %d %u %lld %lld %llu %d %d\n", q->reason, q->cause, q->n_tokens,
                q->first_us ? (long long)(q->first_us - q->submit_us) : -1LL,
                q->done ? (long long)(q->end_us - q->submit_us) : -1LL,
                (unsigned long long)(q->submit_us - t0), q->index_error, q->done);
    }
    if (f) fclose(f);
    ringlm_close(c);
    free(recs);
    free(prompt);
    return rc < 0 ? 6 : 0;
}

typedef struct result_line {
    int reason, cause;
    unsigned n_tokens;
    long long ttft_us, e2e_us;
    unsigned long long submit_us;
    int index_error, done;
} result_line;

static int read_results(const char *path, result_line *out, int max)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0;
    while (n < max && fscanf(f, "%d %d %u %lld %lld %llu %d %d", &out[n].reason, &out[n].cause,
                             &out[n].n_tokens, &out[n].ttft_us, &out[n].e2e_us, &out[n].submit_us,
                             &out[n].index_error, &out[n].done) == 8)
        n++;
    fclose(f);
    return n;
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

static long long median_ttft(const result_line *r, int n)
{
    long long v[4096];
    int k = 0;
    for (int i = 0; i < n && k < 4096; i++)
        if (r[i].ttft_us >= 0) v[k++] = r[i].ttft_us;
    if (!k) return -1;
    qsort(v, (size_t)k, sizeof v[0], cmp_ll);
    return v[k / 2];
}

/* ---- DESIGN §7 scenarios --------------------------------------------------------------- */

/* One very long prompt plus short chats: chunked prefill under a token budget lets short
 * requests reach their first token while the long prompt is still being prefilled. */
Test(daemon_e2e, scenario_long_prompt_short_chats)
{
    need_daemon_binary();
    const char *policy = "[scheduler]\nmode = token_budget\ntoken_budget = 48\nprefill_chunk = "
                         "32\nmax_active_seqs = 16\n"
                         "decode_reserve_tokens = 16\n"
                         "[class chat]\nlatency_sensitive = yes\npriority = 10\n"
                         "[class batch]\npriority = 0\n";
    /* TTFTs are the clients' own: at nice -10 the daemon's prefill kept the chat client from
     * reading its first token (the first short chat's 486 ms vs the long prompt's 301 ms, at
     * load 20) */
    const char *extra[] = {"--threads", "1", DMN_BELOW_CLIENTS, NULL};
    dmn d;
    dmn_start(&d, "synthetic:stories15M:7", policy, extra);
    char out_long[160], out_short[160];
    snprintf(out_long, sizeof out_long, "%s/long.txt", d.dir);
    snprintf(out_short, sizeof out_short, "%s/short.txt", d.dir);
    uint64_t start = now_us() + 50000;
    load_job lj = {.sock = d.sock,
                   .class_name = "batch",
                   .n_requests = 1,
                   .concurrency = 1,
                   .prompt_len = 250,
                   .max_new = 4,
                   .token_base = 11,
                   .vocab = 32000,
                   .out_path = out_long,
                   .ready_fd = -1,
                   .start_at_us = start};
    load_job sj = {.sock = d.sock,
                   .class_name = "chat",
                   .n_requests = 6,
                   .concurrency = 2,
                   .prompt_len = 8,
                   .max_new = 4,
                   .token_base = 5,
                   .vocab = 32000,
                   .out_path = out_short,
                   .ready_fd = -1,
                   .start_at_us = start + 5000};
    pid_t pl = spawn(client_load, &lj), ps = spawn(client_load, &sj);
    cr_expect_eq(reap(pl, 60000), 0);
    cr_expect_eq(reap(ps, 60000), 0);
    result_line L[1], S[8];
    cr_assert_eq(read_results(out_long, L, 1), 1);
    int ns = read_results(out_short, S, 8);
    cr_assert_eq(ns, 6);
    long long first_short = S[0].ttft_us + 5000; /* relative to the long prompt's submit */
    long long med = median_ttft(S, ns);
    cr_log_info("long prompt TTFT %lld us; short chats: first TTFT %lld us, median %lld us",
                L[0].ttft_us, S[0].ttft_us, med);
    cr_expect_eq(L[0].reason, RINGLM_FINISH_LENGTH);
    for (int i = 0; i < ns; i++)
        cr_expect_eq(S[i].reason, RINGLM_FINISH_LENGTH, "short %d: %d/%d", i, S[i].reason,
                     S[i].cause);
    cr_expect_lt(first_short, L[0].ttft_us,
                 "the first short chat (TTFT %lld us after the long submit) waited for the long "
                 "prompt's prefill (TTFT %lld us)",
                 first_short, L[0].ttft_us);
    cr_expect_lt(med, L[0].ttft_us / 2, "short chats' median TTFT %lld us vs long prompt %lld us",
                 med, L[0].ttft_us);
    assert_back_to_baseline(&d, 5000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}

/* The FCFS baseline (continuous mode) cannot slice a prompt: one longer than its token budget
 * runs alone, whole. The daemon's engine batch must hold it — sized by the budget alone, such a
 * prefill was failed as "not executable" (seen replaying Azure prompts of ~490 tokens under
 * sim/policies/fcfs.policy). */
Test(daemon_e2e, continuous_mode_runs_a_prompt_longer_than_its_budget)
{
    need_daemon_binary();
    const char *policy = "[scheduler]\nmode = continuous\ntoken_budget = 48\nmax_active_seqs = 8\n";
    const char *extra[] = {"--threads", "1", NULL};
    dmn d;
    dmn_start(&d, "synthetic:stories15M:7", policy, extra);
    char out_long[160], out_short[160];
    snprintf(out_long, sizeof out_long, "%s/long.txt", d.dir);
    snprintf(out_short, sizeof out_short, "%s/short.txt", d.dir);
    uint64_t start = now_us() + 50000;
    load_job sj = {.sock = d.sock,
                   .n_requests = 3,
                   .concurrency = 3,
                   .prompt_len = 8,
                   .max_new = 24,
                   .token_base = 5,
                   .vocab = 32000,
                   .out_path = out_short,
                   .ready_fd = -1,
                   .start_at_us = start};
    load_job lj = {.sock = d.sock,
                   .n_requests = 1,
                   .concurrency = 1,
                   .prompt_len = 250,
                   .max_new = 4,
                   .token_base = 11,
                   .vocab = 32000,
                   .out_path = out_long,
                   .ready_fd = -1,
                   .start_at_us = start + 5000};
    pid_t ps = spawn(client_load, &sj), pl = spawn(client_load, &lj);
    cr_expect_eq(reap(pl, 60000), 0);
    cr_expect_eq(reap(ps, 60000), 0);
    result_line L[1], S[4];
    cr_assert_eq(read_results(out_long, L, 1), 1);
    cr_assert_eq(read_results(out_short, S, 4), 3);
    cr_expect_eq(L[0].reason, RINGLM_FINISH_LENGTH, "the 250-token prompt ended %d/%d", L[0].reason,
                 L[0].cause);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(S[i].reason, RINGLM_FINISH_LENGTH, "short %d: %d/%d", i, S[i].reason,
                     S[i].cause);
    assert_back_to_baseline(&d, 5000);
    int ex = dmn_stop(&d, SIGTERM, 10000);
    cr_expect_eq(ex, 0);
    cr_expect_eq(count_lines(d.errlog, "not executable"), 0, "the daemon failed a plan entry");
    dmn_cleanup(&d);
}

/* Two tenants, one 10× louder: both backlogged, equal weights; the quiet one must keep at
 * least 90% of its fair (half) share of the generated tokens. Tenant tags come from this
 * test's own uid, trusted in the policy. */
Test(daemon_e2e, scenario_fair_share_quiet_vs_loud)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    char policy[1024];
    snprintf(policy, sizeof policy,
             "[scheduler]\nmode = token_budget\ntoken_budget = 64\nprefill_chunk = 32\n"
             "max_active_seqs = 4\ndefault_tenant = other\n"
             "[tenant quiet]\nweight = 1\n[tenant loud]\nweight = 1\n[tenant other]\nweight = 1\n"
             "[trust]\nuids = %u\n",
             (unsigned)getuid());
    /* The share is only the scheduler's when both tenants stay backlogged: at nice -10 the
     * daemon finished the quiet client's 8 before that client got the CPU to submit more
     * (share 44.6% at load 18). */
    static const char *const below_clients[] = {DMN_BELOW_CLIENTS, NULL};
    dmn d;
    dmn_start(&d, model, policy, below_clients);
    char oq[160], ol[160];
    snprintf(oq, sizeof oq, "%s/quiet.txt", d.dir);
    snprintf(ol, sizeof ol, "%s/loud.txt", d.dir);
    uint64_t start = now_us() + 50000;
    /* The quiet client keeps 8 in flight, so it is backlogged too (its share is then half,
     * not its demand); the loud one keeps 80. */
    load_job q = {.sock = d.sock,
                  .tenant = "quiet",
                  .concurrency = 8,
                  .duration_ms = 2000,
                  .prompt_len = 16,
                  .max_new = 48,
                  .token_base = 1,
                  .vocab = 512,
                  .out_path = oq,
                  .ready_fd = -1,
                  .start_at_us = start};
    load_job l = q;
    l.tenant = "loud";
    l.concurrency = 80;
    l.out_path = ol;
    l.token_base = 2;
    pid_t pq = spawn(client_load, &q), pl = spawn(client_load, &l);
    cr_expect_eq(reap(pq, 60000), 0);
    cr_expect_eq(reap(pl, 60000), 0);
    static result_line R[8192];
    int nq = read_results(oq, R, 8192);
    long long tq = 0, tl = 0;
    int rq = 0, rl = 0;
    /* Only the window where both are backlogged: requests that ended before the clients
     * stopped submitting (afterwards the loud one drains its 80 alone). */
    const long long window_us = 2000000;
#define IN_WINDOW(x)                                                                               \
    ((x).done && (x).e2e_us >= 0 && (long long)(x).submit_us + (x).e2e_us <= window_us &&          \
     ((x).reason == RINGLM_FINISH_LENGTH || (x).reason == RINGLM_FINISH_STOP))
    for (int i = 0; i < nq; i++)
        if (IN_WINDOW(R[i])) {
            tq += R[i].n_tokens;
            rq++;
        }
    int nl = read_results(ol, R, 8192);
    for (int i = 0; i < nl; i++)
        if (IN_WINDOW(R[i])) {
            tl += R[i].n_tokens;
            rl++;
        }
#undef IN_WINDOW
    double share = tq + tl ? (double)tq / (double)(tq + tl) : 0;
    cr_log_info("quiet: %d requests %lld tokens; loud: %d requests %lld tokens; quiet share %.3f",
                rq, tq, rl, tl, share);
    cr_expect_gt(tq + tl, 0);
    cr_expect_geq(share, 0.45,
                  "quiet tenant got %.1f%% of the tokens, below 90%% of its 50%% share "
                  "(quiet %lld, loud %lld)",
                  share * 100, tq, tl);
    assert_back_to_baseline(&d, 5000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}

/* Clients killed mid-decode: every block comes back at once and no compute is spent on
 * their sequences after the cancel. */
Test(daemon_e2e, scenario_kill9_mid_decode_returns_blocks)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    /* DMN_BELOW_CLIENTS: at nice -10 all 12 streams had finished before the kill, at load 26
     * ("only 0 requests were live at the kill") */
    const char *extra[] = {"--host-kv-blocks", "64", DMN_BELOW_CLIENTS, NULL};
    dmn d;
    dmn_start(&d, model, NULL, extra);
    pid_t kids[3];
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    /* "Once upon a time": greedy stories260K runs 341 tokens before its stop token. */
    static const int32_t once[5] = {1, 403, 407, 261, 378};
    load_job j = {.sock = d.sock,
                  .n_requests = 4,
                  .concurrency = 4,
                  .prompt_len = 5,
                  .fixed_prompt = once,
                  .max_new = 300,
                  .vocab = 512,
                  .ready_fd = pfd[1]};
    for (int i = 0; i < 3; i++) kids[i] = spawn(client_load, &j);
    close(pfd[1]);
    for (int i = 0; i < 3; i++) {
        char b;
        cr_assert_eq(read(pfd[0], &b, 1), 1, "client %d never got a token", i);
    }
    json_t *st = dmn_stats(&d);
    long long used_before = jint(st, "kv.device.used");
    json_decref(st);
    uint64_t t_kill = now_ms();
    for (int i = 0; i < 3; i++) kill(kids[i], SIGKILL);
    for (int i = 0; i < 3; i++) reap(kids[i], 5000);
    close(pfd[0]);
    assert_back_to_baseline(&d, 2000);
    uint64_t took = now_ms() - t_kill;
    cr_log_info("kill -9: %lld device blocks in use before, back to 0 in %llu ms", used_before,
                (unsigned long long)took);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    /* In the decision log no request gets work after its disconnect cancel. */
    FILE *f = fopen(d.declog, "r");
    cr_assert_not_null(f);
    char line[4096];
    static unsigned char cancelled[4096];
    static long long cancel_t[4096];
    int n_cancel = 0, n_finish = 0, after = 0, n_release = 0, late_release = 0;
    while (fgets(line, sizeof line, f)) {
        const char *rq = strstr(line, "\"req\":");
        if (!rq) continue;
        long id = strtol(rq + 6, NULL, 10);
        if (id < 0 || id >= 4096) continue;
        const char *tq = strstr(line, "\"t_us\":");
        long long t = tq ? strtoll(tq + 7, NULL, 10) : -1;
        if (strstr(line, "\"ev\":\"cancel\"") && strstr(line, "disconnect")) {
            cancelled[id] = 1;
            cancel_t[id] = t;
            n_cancel++;
        } else if (strstr(line, "\"ev\":\"finish\"")) {
            n_finish++; /* ended on its own (a stop token) before the kill */
        } else if (cancelled[id] && strstr(line, "\"ev\":\"release\"")) {
            /* The loop reads its clock once per iteration: the same t_us is the same
             * iteration as the cancel. */
            n_release++;
            if (t != cancel_t[id]) late_release++;
        } else if (cancelled[id] &&
                   (strstr(line, "\"ev\":\"schedule\"") || strstr(line, "\"ev\":\"swap_in\"")))
            after++;
    }
    fclose(f);
    cr_expect_eq(n_cancel + n_finish, 12,
                 "12 requests: %d disconnect cancels + %d finished before "
                 "the kill",
                 n_cancel, n_finish);
    cr_expect_geq(n_cancel, 3, "only %d requests were live at the kill", n_cancel);
    cr_expect_eq(after, 0, "%d decisions gave work to cancelled requests", after);
    cr_expect_geq(n_release, 1, "no release event for %d cancelled requests", n_cancel);
    cr_expect_eq(late_release, 0, "%d releases came in a later iteration than their cancel",
                 late_release);
    dmn_cleanup(&d);
}

/* A burst above the service rate: queue wait comes back to its baseline afterwards. */
Test(daemon_e2e, scenario_burst_queue_wait_returns_to_baseline)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    const char *policy = "[scheduler]\nmode = token_budget\ntoken_budget = 64\nprefill_chunk = 32\n"
                         "max_active_seqs = 8\n";
    dmn d;
    dmn_start(&d, model, policy, NULL);
    char ob[160], oburst[160], oa[160];
    snprintf(ob, sizeof ob, "%s/before.txt", d.dir);
    snprintf(oburst, sizeof oburst, "%s/burst.txt", d.dir);
    snprintf(oa, sizeof oa, "%s/after.txt", d.dir);
    load_job probe = {.sock = d.sock,
                      .n_requests = 8,
                      .concurrency = 1,
                      .prompt_len = 8,
                      .max_new = 8,
                      .token_base = 1,
                      .vocab = 512,
                      .out_path = ob,
                      .ready_fd = -1};
    cr_expect_eq(reap(spawn(client_load, &probe), 30000), 0);
    load_job burst = {.sock = d.sock,
                      .n_requests = 40,
                      .concurrency = 40,
                      .prompt_len = 64,
                      .max_new = 64,
                      .token_base = 2,
                      .vocab = 512,
                      .out_path = oburst,
                      .ready_fd = -1};
    pid_t b1 = spawn(client_load, &burst), b2 = spawn(client_load, &burst);
    cr_expect_eq(reap(b1, 60000), 0);
    cr_expect_eq(reap(b2, 60000), 0);
    assert_back_to_baseline(&d, 5000);
    probe.out_path = oa;
    cr_expect_eq(reap(spawn(client_load, &probe), 30000), 0);
    static result_line R[128];
    int n = read_results(ob, R, 128);
    long long before = median_ttft(R, n);
    n = read_results(oburst, R, 128);
    long long during = median_ttft(R, n);
    n = read_results(oa, R, 128);
    long long after_ = median_ttft(R, n);
    cr_log_info("TTFT median: before %lld us, burst %lld us, after %lld us", before, during,
                after_);
    cr_expect_leq(after_, before * 3 + 20000,
                  "queue wait did not return to baseline: before %lld us, "
                  "after %lld us",
                  before, after_);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}

/* Sustained 2× overload: rejects happen at admission with a reason, nothing times out,
 * accepted requests meet the class's first-token target. */
Test(daemon_e2e, scenario_sustained_overload_rejects_at_admission)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    const char *policy = "[scheduler]\nmode = token_budget\ntoken_budget = 64\nprefill_chunk = 32\n"
                         "max_active_seqs = 8\nqueue_max_requests = 8\n"
                         "[class default]\nttft_target = 1s\nmax_queue_wait = 1s\n";
    dmn d;
    /* ringlmd at the clients' own nice: the first token is timed where a user reads it, in
     * the client, and by default the daemon takes nice -10, 20 levels above this client
     * under `nice -n 10 make test`; always busy in overload, it left the client ~1% of the
     * CPU they shared (CFS weights 9548 and 110): at load 14 under SANITIZE=1 the client
     * read first tokens up to 756 ms after ringlmd had sent them (6 of 74 late, none late
     * in ringlmd's own request log).  At equal nice neither side outranks the other. */
    char nice_arg[16];
    errno = 0;
    int own_nice = getpriority(PRIO_PROCESS, 0);
    cr_assert_eq(errno, 0, "getpriority: %s", strerror(errno));
    snprintf(nice_arg, sizeof nice_arg, "%d", own_nice);
    const char *const same_nice[] = {"--nice", nice_arg, NULL};
    dmn_start(&d, model, policy, same_nice);
    /* Service rate: a closed-loop saturation run. */
    char oc[160], oo[160];
    snprintf(oc, sizeof oc, "%s/cal.txt", d.dir);
    snprintf(oo, sizeof oo, "%s/over.txt", d.dir);
    load_job cal = {.sock = d.sock,
                    .n_requests = 32,
                    .concurrency = 16,
                    .prompt_len = 32,
                    .max_new = 32,
                    .token_base = 1,
                    .vocab = 512,
                    .out_path = oc,
                    .ready_fd = -1};
    uint64_t t0 = now_us();
    cr_assert_eq(reap(spawn(client_load, &cal), 60000), 0);
    double rate = 32.0 / ((double)(now_us() - t0) / 1e6);
    assert_back_to_baseline(&d, 5000);
    load_job over = cal;
    over.n_requests = 0;
    over.interval_us = (uint64_t)(1e6 / (2 * rate));
    if (over.interval_us < 200) over.interval_us = 200;
    over.duration_ms = 2000;
    over.out_path = oo;
    cr_assert_eq(reap(spawn(client_load, &over), 60000), 0);
    static result_line R[20000];
    int n = read_results(oo, R, 20000);
    int ok = 0, rej = 0, timeouts = 0, other = 0, late = 0, no_reason = 0;
    for (int i = 0; i < n; i++) {
        if (R[i].reason == RINGLM_FINISH_LENGTH || R[i].reason == RINGLM_FINISH_STOP) {
            ok++;
            if (R[i].ttft_us > 1000000) late++;
        } else if (R[i].reason == RINGLM_FINISH_REJECTED) {
            rej++;
            if (R[i].cause == 0) no_reason++;
            if (R[i].n_tokens) other++;
        } else if (R[i].reason == RINGLM_FINISH_TIMEOUT) {
            timeouts++;
        } else {
            other++;
            if (other < 5)
                cr_log_info("request %d ended %s/%s after %u tokens (done %d)", i,
                            ringlm_reason_name(R[i].reason), ringlm_reason_name(R[i].cause),
                            R[i].n_tokens, R[i].done);
        }
    }
    cr_log_info("overload at %.0f req/s (service %.0f req/s): %d requests, %d served, %d rejected, "
                "%d timeouts, %d late",
                2 * rate, rate, n, ok, rej, timeouts, late);
    cr_expect_gt(ok, 0);
    cr_expect_eq(timeouts, 0, "%d requests timed out instead of being rejected at admission",
                 timeouts);
    cr_expect_eq(no_reason, 0, "%d rejects without a reason", no_reason);
    cr_expect_eq(other, 0, "%d requests ended otherwise", other);
    cr_expect_leq(late, ok / 20, "%d of %d accepted requests missed the 1 s first-token target",
                  late, ok);
    assert_back_to_baseline(&d, 5000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}

/* ---- robustness ---------------------------------------------------------------------- */

typedef struct bad_job {
    const char *sock;
} bad_job;

/* Client process: requests that must be refused with a reason, then one good request. */
static int client_bad_inputs(void *arg)
{
    bad_job *b = arg;
    ringlm_client *c;
    int rc = ringlm_connect(b->sock, &c);
    if (rc < 0) return 2;
    static int32_t longp[600];
    for (int i = 0; i < 600; i++) longp[i] = 5 + i % 400;
    int32_t badtok[3] = {1, 9999, 7}, negtok[2] = {1, -4}, good[5] = {1, 403, 407, 261, 378};
    struct {
        const int32_t *p;
        uint32_t n;
        uint32_t max_new;
        float temp;
        const char *cls;
        int want;
    } cases[] = {
        {badtok, 3, 8, 0, NULL, RINGLM_R_BAD_TOKEN},
        {negtok, 2, 8, 0, NULL, RINGLM_R_BAD_TOKEN},
        {longp, 600, 8, 0, NULL, RINGLM_R_TOO_LONG},
        {good, 5, 100000u, 0, NULL, RINGLM_R_TOO_LONG},
        {good, 5, 8, 1e9f, NULL, RINGLM_R_BAD_PARAMS},
        {good, 5, 8, 0, "nosuchclass", RINGLM_R_UNKNOWN_CLASS},
    };
    int n = (int)(sizeof cases / sizeof cases[0]), bad = 0;
    uint64_t ids[8];
    for (int i = 0; i < n; i++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = cases[i].p;
        r.n_prompt = cases[i].n;
        r.max_new_tokens = cases[i].max_new;
        r.temperature = cases[i].temp;
        r.class_name = cases[i].cls;
        rc = ringlm_submit(c, &r, &ids[i]);
        if (rc < 0) {
            fprintf(stderr, "bad case %d: submit refused locally: %s\n", i, ringlm_errdetail());
            ids[i] = 0;
        }
    }
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = good;
    r.n_prompt = 5;
    r.max_new_tokens = 16;
    r.tenant_tag = "mallory"; /* untrusted uid: ignored, not an error */
    uint64_t good_id;
    if (ringlm_submit(c, &r, &good_id) < 0) return 3;
    int left = n + 1, good_tokens = 0;
    for (int i = 0; i < n; i++)
        if (!ids[i]) left--;
    while (left > 0) {
        ringlm_event ev;
        rc = ringlm_next_event(c, &ev, 20000);
        if (rc <= 0) {
            fprintf(stderr, "bad inputs: next_event %d %s\n", rc, ringlm_errdetail());
            return 4;
        }
        if (ev.req_id == good_id) {
            if (ev.kind == RINGLM_EV_TOKEN)
                good_tokens++;
            else {
                left--;
                if (ev.finish_reason != RINGLM_FINISH_LENGTH &&
                    ev.finish_reason != RINGLM_FINISH_STOP) {
                    fprintf(stderr, "good request ended %s/%s\n",
                            ringlm_reason_name(ev.finish_reason),
                            ringlm_reason_name(ev.reject_reason));
                    bad++;
                }
            }
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (ids[i] != ev.req_id) continue;
            if (ev.kind != RINGLM_EV_FINISH || ev.finish_reason != RINGLM_FINISH_REJECTED ||
                ev.reject_reason != cases[i].want || ev.n_tokens != 0) {
                fprintf(stderr,
                        "bad case %d: got %s/%s (kind %d, %u tokens), expected rejected/%s\n", i,
                        ringlm_reason_name(ev.finish_reason), ringlm_reason_name(ev.reject_reason),
                        ev.kind, ev.n_tokens, ringlm_reason_name(cases[i].want));
                bad++;
            }
            left--;
        }
    }
    if (good_tokens == 0) bad++;
    ringlm_close(c);
    return bad ? 1 : 0;
}

Test(daemon_e2e, bad_requests_rejected_with_reasons)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    /* This uid is tenant alice; nobody is trusted, so a tenant tag changes nothing. */
    char policy[256];
    snprintf(policy, sizeof policy,
             "[scheduler]\ndefault_tenant = other\n[tenant alice]\nuids = %u\n"
             "[tenant other]\n[tenant mallory]\n",
             (unsigned)getuid());
    dmn d;
    dmn_start(&d, model, policy, NULL);
    bad_job b = {d.sock};
    cr_expect_eq(reap(spawn(client_bad_inputs, &b), 30000), 0, "see the client's stderr above");
    assert_back_to_baseline(&d, 5000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    /* every bad case reaches the daemon and is rejected there */
    cr_expect_geq(count_lines(d.declog, "\"ev\":\"reject\""), 6,
                  "rejects missing from the decision log");
    cr_expect_geq(count_lines(d.reqlog, "\"finish_reason\":\"rejected\""), 6,
                  "rejects missing from the request log");
    cr_expect_eq(count_lines(d.reqlog, "\"tenant\":\"mallory\""), 0,
                 "an untrusted uid's tenant tag was honoured");
    cr_expect_eq(count_lines(d.reqlog, "\"tenant\":\"alice\""), 7,
                 "requests not attributed to the uid's tenant");
    dmn_cleanup(&d);
}

/* A hostile client scribbles over its own segment (random indices, bad lengths, garbage
 * records) while a good client streams; the daemon ends the hostile sessions, stays up,
 * and the good stream is exactly the reference. */
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/un.h>
#include "shm/ring.h"
#include "shm/wire.h"

static int raw_session(const char *path, struct ringlm_wire_cseg **cseg, size_t *len, int *sock)
{
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) < 0) return -1;
    struct ringlm_wire_hello h = {.magic = RINGLM_WIRE_MAGIC, .abi = RINGLM_WIRE_ABI};
    if (send(s, &h, sizeof h, MSG_NOSIGNAL) != sizeof h) return -1;
    struct ringlm_wire_welcome w;
    union {
        char buf[CMSG_SPACE(sizeof(int) * 3)];
        struct cmsghdr a;
    } ctl;
    struct iovec iov = {&w, sizeof w};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    if (recvmsg(s, &m, 0) != (ssize_t)sizeof w || w.status != 0) return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    void *p = mmap(NULL, w.cseg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return -1;
    *cseg = p;
    *len = w.cseg_bytes;
    *sock = s;
    return 0;
}

static int client_hostile(void *arg)
{
    const char *path = arg;
    srand((unsigned)getpid());
    for (int round = 0; round < 6; round++) {
        struct ringlm_wire_cseg *cs;
        size_t len;
        int sock;
        if (raw_session(path, &cs, &len, &sock) < 0) continue;
        unsigned char *data = (unsigned char *)cs + cs->hdr.data_off;
        size_t dbytes = cs->hdr.data_bytes < len - cs->hdr.data_off ? cs->hdr.data_bytes
                                                                    : len - cs->hdr.data_off;
        switch (round % 3) {
        case 0: /* an index far beyond the ring */
            __atomic_store_n(&cs->submit_prod, (uint64_t)rand() << 32 | 77, __ATOMIC_RELEASE);
            break;
        case 1: { /* a record whose length is not a multiple of 8 and bigger than written */
            struct ringlm_wire_rec_hdr h = {.len = 13, .type = RINGLM_WIRE_REC_REQUEST};
            memcpy(data, &h, sizeof h);
            __atomic_store_n(&cs->submit_prod, 16, __ATOMIC_RELEASE);
            break;
        }
        default: /* garbage records */
            for (size_t i = 0; i < 4096 && i < dbytes; i++) data[i] = (unsigned char)rand();
            __atomic_store_n(&cs->submit_prod, 4096, __ATOMIC_RELEASE);
            __atomic_store_n(&cs->ev_cons, (uint64_t)rand(), __ATOMIC_RELEASE);
            break;
        }
        __atomic_add_fetch(&cs->doorbell, 1, __ATOMIC_SEQ_CST);
        futex_wake(&cs->doorbell, 1, FUTEX_SCOPE_SHARED);
        /* The daemon ends the session: the socket reaches EOF. */
        char b;
        struct timeval tv = {5, 0};
        setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ssize_t r = recv(sock, &b, 1, 0);
        munmap(cs, len);
        close(sock);
        if (r != 0) {
            fprintf(stderr, "hostile round %d: session not ended (recv %zd)\n", round, r);
            return 1;
        }
    }
    return 0;
}

Test(daemon_e2e, hostile_client_does_not_disturb_others)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    static ref_case cases[12];
    int n = load_refs(cases, 12);
    if (n == 0) cr_skip_test("reference-greedy.json not found");
    dmn d;
    dmn_start(&d, model, NULL, NULL);
    gen_job g = {.sock = d.sock, .cases = cases, .n_cases = n};
    pid_t good = spawn(client_greedy, &g);
    pid_t evil = spawn(client_hostile, d.sock);
    cr_expect_eq(reap(evil, 60000), 0, "hostile sessions were not ended by the daemon");
    cr_expect_eq(reap(good, 60000), 0, "the good client's stream was disturbed");
    /* Still serving. */
    pid_t again = spawn(client_greedy, &g);
    cr_expect_eq(reap(again, 60000), 0);
    assert_back_to_baseline(&d, 5000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}

/* SIGTERM drains: in-flight requests finish or are cancelled (reason draining) within the
 * grace period, new work is refused, clients see a clear end, the daemon exits 0. */
typedef struct drain_job {
    const char *sock;
    int ready_fd;
    const char *out;
} drain_job;

static int client_drain(void *arg)
{
    drain_job *dj = arg;
    ringlm_client *c;
    if (ringlm_connect(dj->sock, &c) < 0) return 2;
    int32_t p[4] = {1, 403, 407, 261};
    enum { N = 32 };
    uint64_t ids[N];
    for (int i = 0; i < N; i++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = p;
        r.n_prompt = 4;
        r.max_new_tokens = 500;
        r.temperature = 0.8f;
        r.seed = (uint64_t)i + 1;
        if (ringlm_submit(c, &r, &ids[i]) < 0) return 3;
    }
    int finished = 0, cancelled = 0, completed = 0, other = 0;
    bool ready = false;
    int end_rc = 0;
    uint64_t t_last_finish = 0;
    for (;;) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 15000);
        if (rc == 0) {
            end_rc = -ETIMEDOUT;
            break;
        }
        if (rc < 0) {
            end_rc = rc;
            break;
        }
        if (ev.kind == RINGLM_EV_TOKEN && !ready) {
            if (write(dj->ready_fd, "r", 1) != 1) { /* parent gone */
            }
            ready = true;
        }
        if (ev.kind == RINGLM_EV_FINISH) {
            finished++;
            t_last_finish = now_ms();
            /* Cancelled by the drain, or (read from the ring only after the drain began)
             * refused by it: both say "draining". */
            if ((ev.finish_reason == RINGLM_FINISH_CANCELLED ||
                 ev.finish_reason == RINGLM_FINISH_REJECTED) &&
                ev.reject_reason == RINGLM_R_DRAINING)
                cancelled++;
            else if (ev.finish_reason == RINGLM_FINISH_LENGTH ||
                     ev.finish_reason == RINGLM_FINISH_STOP)
                completed++;
            else
                other++;
        }
    }
    uint64_t end_after = now_ms() - t_last_finish;
    /* A submit after the end is refused, never hangs. */
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = p;
    r.n_prompt = 4;
    int sub = ringlm_submit(c, &r, NULL);
    FILE *f = fopen(dj->out, "w");
    if (f) {
        fprintf(f, "%d %d %d %d %d %d %llu\n", finished, completed, cancelled, other, end_rc, sub,
                (unsigned long long)end_after);
        fclose(f);
    }
    ringlm_close(c);
    return 0;
}

Test(daemon_e2e, sigterm_drains_then_exits_zero)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    const char *extra[] = {"--drain-grace-ms", "300", NULL};
    dmn d;
    dmn_start(&d, model, NULL, extra);
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    char out[160];
    snprintf(out, sizeof out, "%s/drain.txt", d.dir);
    drain_job dj = {d.sock, pfd[1], out};
    pid_t c = spawn(client_drain, &dj);
    close(pfd[1]);
    char b;
    cr_assert_eq(read(pfd[0], &b, 1), 1, "client never got a token");
    close(pfd[0]);
    uint64_t t0 = now_ms();
    kill(d.pid, SIGTERM);
    /* The signal lands asynchronously: wait until the daemon says it is draining. */
    uint64_t dl = now_ms() + 3000;
    for (;;) {
        json_t *st = dmn_stats(&d);
        bool draining = st && json_is_true(json_object_get(st, "draining"));
        json_decref(st);
        if (draining || now_ms() > dl) break;
        poll_pause();
    }
    /* While draining, a new client is refused at once (or finds the daemon gone). */
    ringlm_client *late;
    int rc = ringlm_connect(d.sock, &late);
    if (rc == 0) {
        int32_t p[2] = {1, 403};
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = p;
        r.n_prompt = 2;
        uint64_t id;
        int s = ringlm_submit(late, &r, &id);
        if (s == 0) {
            ringlm_event ev;
            int e = ringlm_next_event(late, &ev, 5000);
            cr_expect(e < 0 ||
                          (ev.kind == RINGLM_EV_FINISH && ev.reject_reason == RINGLM_R_DRAINING),
                      "a request during the drain was not refused (rc %d, reason %d/%d)", e,
                      ev.finish_reason, ev.reject_reason);
        } else {
            cr_expect(s == -ESHUTDOWN || s == -EPIPE || s == -ECONNRESET,
                      "submit while draining: %d", s);
        }
        ringlm_close(late);
    } else {
        /* Refused by the draining daemon (ESHUTDOWN), or it finished its drain and exited while
         * this connect was under way: before it (ENOENT, ECONNREFUSED), after accepting it and
         * before the hello was sent (its exit closes the accepted socket: the hello's send gets
         * EPIPE; seen at load 15, this process having lost the CPU between the two calls) or
         * before answering (ECONNRESET). */
        cr_expect(rc == -ESHUTDOWN || rc == -ECONNREFUSED || rc == -ENOENT || rc == -ECONNRESET ||
                      rc == -EPIPE,
                  "connect while draining: %d %s (%s)", rc, ringlm_strerror(rc),
                  ringlm_errdetail());
    }
    int ex = dmn_stop(&d, 0, 5000); /* signal 0: just wait for the exit */
    uint64_t took = now_ms() - t0;
    cr_expect_eq(ex, 0, "ringlmd exit status %d after SIGTERM", ex);
    cr_expect_leq(took, 3000, "drain took %llu ms with a 300 ms grace", (unsigned long long)took);
    cr_expect_eq(reap(c, 20000), 0);
    int fin = 0, comp = 0, canc = 0, oth = 0, end_rc = 0, sub = 0;
    unsigned long long end_after = 0;
    FILE *f = fopen(out, "r");
    cr_assert_not_null(f);
    cr_assert_eq(
        fscanf(f, "%d %d %d %d %d %d %llu", &fin, &comp, &canc, &oth, &end_rc, &sub, &end_after),
        7);
    fclose(f);
    cr_log_info("drain: %d finished (%d completed, %d cancelled: draining), client saw %s %llu ms "
                "after its last event; daemon gone %llu ms after SIGTERM",
                fin, comp, canc, ringlm_strerror(end_rc), end_after, (unsigned long long)took);
    cr_expect_eq(fin, 32, "every request must get its FINISH before the session ends");
    cr_expect_eq(oth, 0);
    cr_expect(end_rc == -EPIPE || end_rc == -ECONNRESET, "the client saw %s, not a clear end",
              ringlm_strerror(end_rc));
    cr_expect_lt(sub, 0, "submit after the daemon left returned %d", sub);
    dmn_cleanup(&d);
}

/* The backpressure tests' stuck client: its three requests are cancelled for backpressure
 * in the decision log (within 10 s). */
static void await_backpressure_cancels(dmn *d)
{
    uint64_t deadline = now_ms() + 10000;
    int bp = 0;
    while ((bp = count_lines(d->declog, "\"reason\":\"backpressure\"")) < 3 && now_ms() < deadline)
        poll_pause();
    cr_expect_eq(bp, 3, "expected 3 backpressure cancels in the decision log, got %d", bp);
}

/* Lets the stuck client read (go_fd), then checks what it got: all three requests
 * cancelled output_backpressure with their tokens whole and in order; the daemon back to
 * its baseline and stopped. */
static void release_stuck_client_expect_cancelled(dmn *d, pid_t ps, int go_fd, const char *out)
{
    if (write(go_fd, "go", 1) != 1) cr_assert_fail("stuck client gone");
    close(go_fd);
    cr_expect_eq(reap(ps, 30000), 0);
    static result_line R[8];
    int k = read_results(out, R, 8);
    cr_assert_eq(k, 3);
    for (int i = 0; i < k; i++) {
        cr_expect_eq(R[i].reason, RINGLM_FINISH_CANCELLED, "stuck request %d ended %d/%d", i,
                     R[i].reason, R[i].cause);
        cr_expect_eq(R[i].cause, RINGLM_R_OUTPUT_BACKPRESSURE, "stuck request %d cause %d", i,
                     R[i].cause);
        cr_expect_eq(R[i].index_error, 0, "stuck request %d: tokens lost or out of order (got %u)",
                     i, R[i].n_tokens);
        cr_expect_gt(R[i].n_tokens, 0);
    }
    assert_back_to_baseline(d, 5000);
    cr_expect_eq(dmn_stop(d, SIGTERM, 10000), 0);
    dmn_cleanup(d);
}

/* A client that stops reading: its requests are deferred (output_backpressure) then
 * cancelled after the timeout, nothing it was sent is lost, and others are not blocked. */
Test(daemon_e2e, backpressure_defers_then_cancels_without_blocking_others)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    static ref_case cases[12];
    int n = load_refs(cases, 12);
    if (n < 4) cr_skip_test("reference-greedy.json not found");
    const char *extra[] = {"--event-ring-slots", "64", "--backpressure-timeout-ms", "300", NULL};
    dmn d;
    dmn_start(&d, model, NULL, extra);
    int wfd[2];
    cr_assert_eq(pipe(wfd), 0);
    char out[160];
    snprintf(out, sizeof out, "%s/stuck.txt", d.dir);
    load_job stuck = {.sock = d.sock,
                      .n_requests = 3,
                      .concurrency = 3,
                      .prompt_len = 8,
                      .max_new = 400,
                      .token_base = 9,
                      .vocab = 512,
                      .out_path = out,
                      .ready_fd = -1,
                      .never_read = true,
                      .wait_fd = wfd[0]};
    pid_t ps = spawn(client_load, &stuck);
    close(wfd[0]);
    gen_job g = {.sock = d.sock, .cases = cases, .n_cases = 4};
    uint64_t t0 = now_ms();
    cr_expect_eq(reap(spawn(client_greedy, &g), 60000), 0, "the reading client was disturbed");
    cr_log_info("reading client done in %llu ms", (unsigned long long)(now_ms() - t0));
    /* Wait for the three backpressure cancels in the decision log. */
    await_backpressure_cancels(&d);
    int defers = count_lines(d.declog, "output_backpressure");
    cr_expect_geq(defers, 1, "no defer with reason output_backpressure");
    release_stuck_client_expect_cancelled(&d, ps, wfd[1], out);
}

/* The same, with the order fixed that the test above leaves to chance: the client submits
 * one request, stops reading, and submits two more only once the daemon has deferred the
 * first (its session blocked). All three are answered alike — cancelled
 * output_backpressure with their tokens in order — not the two later ones left unread in
 * the submit ring to run to their length once the client reads again. */
Test(daemon_e2e, backpressure_answers_requests_submitted_after_the_client_stopped_reading)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    const char *extra[] = {"--event-ring-slots", "64", "--backpressure-timeout-ms", "300", NULL};
    dmn d;
    dmn_start(&d, model, NULL, extra);
    int wfd[2], gfd[2];
    cr_assert_eq(pipe(wfd), 0);
    cr_assert_eq(pipe(gfd), 0);
    char out[160];
    snprintf(out, sizeof out, "%s/stuck.txt", d.dir);
    load_job stuck = {.sock = d.sock,
                      .n_requests = 3,
                      .concurrency = 3,
                      .prompt_len = 8,
                      .max_new = 400,
                      .token_base = 9,
                      .vocab = 512,
                      .out_path = out,
                      .ready_fd = -1,
                      .never_read = true,
                      .wait_fd = wfd[0],
                      .gate_after = 1,
                      .gate_fd = gfd[0]};
    pid_t ps = spawn(client_load, &stuck);
    close(wfd[0]);
    close(gfd[0]);
    uint64_t deadline = now_ms() + 10000;
    while (count_lines(d.declog, "output_backpressure") < 1 && now_ms() < deadline) poll_pause();
    cr_assert_geq(count_lines(d.declog, "output_backpressure"), 1,
                  "the first request was never deferred");
    if (write(gfd[1], "g", 1) != 1) cr_assert_fail("stuck client gone");
    close(gfd[1]);
    await_backpressure_cancels(&d);
    release_stuck_client_expect_cancelled(&d, ps, wfd[1], out);
}

/* ---- connects to a busy daemon -------------------------------------------------------- */

typedef struct burst_rec {
    int rc;    /* 0: connected and a request answered; else the failing -errno */
    int stage; /* 1 connect, 2 submit, 3 event */
    double connect_ms;
} burst_rec;

typedef struct burst_job {
    const char *sock;
    int ready_fd, gate_fd, out_fd;
} burst_job;

/* Says ready, waits at the gate (its EOF releases every client at once), connects (timed)
 * and has one short request answered on the new session. */
static int client_burst(void *arg)
{
    burst_job *b = arg;
    if (write(b->ready_fd, "r", 1) != 1) return 1;
    char ch;
    while (read(b->gate_fd, &ch, 1) > 0) {}
    burst_rec rec = {0, 1, 0};
    ringlm_client *c = NULL;
    uint64_t t0 = now_us();
    rec.rc = ringlm_connect(b->sock, &c);
    rec.connect_ms = (double)(now_us() - t0) / 1000.0;
    if (rec.rc == 0) {
        int32_t p[2] = {1, 403};
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = p;
        r.n_prompt = 2;
        r.max_new_tokens = 2;
        rec.stage = 2;
        rec.rc = ringlm_submit(c, &r, NULL);
        ringlm_event ev = {0};
        if (rec.rc == 0) {
            rec.stage = 3;
            while ((rec.rc = ringlm_next_event(c, &ev, 30000)) == 1 &&
                   ev.kind != RINGLM_EV_FINISH) {}
            rec.rc = rec.rc == 1 ? 0 : rec.rc == 0 ? -ETIMEDOUT : rec.rc;
        }
        ringlm_close(c);
    }
    if (rec.rc)
        fprintf(stderr, "burst client: stage %d: %s %s\n", rec.stage, ringlm_strerror(rec.rc),
                ringlm_errdetail());
    return write(b->out_fd, &rec, sizeof rec) == (ssize_t)sizeof rec ? 0 : 1;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* 64 client processes connect at once while the daemon runs 16 streams: every one gets its
 * session and an answer (a handshake waits for no engine step, and the half-open budget is
 * not spent by clients whose hello is on its way). The connect latency is reported, not
 * asserted (speed is perf/serve_bench's). */
Test(daemon_e2e, connect_burst_of_64_to_a_busy_daemon_all_succeed)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    /* 64 burst sessions and the streams' one, all of this uid; all 64 may be half-open at
     * once (their hellos late on a loaded machine): past the per-uid grace bound (default 8,
     * 0f3c78a) a late hello's connection is refused, by design — 58 of 64 connected at load 18 */
    const char *extra[] = {"--max-sessions-per-uid", "80", "--max-half-open-per-uid", "64", NULL};
    dmn d;
    dmn_start(&d, model, NULL, extra);
    int rfd[2];
    cr_assert_eq(pipe(rfd), 0);
    load_job busy = {.sock = d.sock,
                     .n_requests = 0,
                     .concurrency = 16,
                     .prompt_len = 8,
                     .max_new = 400,
                     .token_base = 5,
                     .vocab = 512,
                     .duration_ms = 120000,
                     .ready_fd = rfd[1]};
    pid_t pb = spawn(client_load, &busy);
    close(rfd[1]);
    char ch;
    cr_assert_eq(read(rfd[0], &ch, 1), 1, "the streams never produced a token");
    close(rfd[0]);

    enum { N = 64 };
    int ready[2], gate[2], out[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(gate), 0);
    cr_assert_eq(pipe(out), 0);
    burst_job bj = {.sock = d.sock, .ready_fd = ready[1], .gate_fd = gate[0], .out_fd = out[1]};
    pid_t pids[N];
    for (int i = 0; i < N; i++) {
        /* the children must not hold the gate open themselves */
        fflush(NULL);
        pids[i] = fork();
        cr_assert_geq(pids[i], 0);
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(gate[1]);
            close(ready[0]);
            close(out[0]);
            _exit(client_burst(&bj));
        }
    }
    close(ready[1]);
    close(gate[0]);
    close(out[1]);
    int n_ready = 0;
    while (n_ready < N && read(ready[0], &ch, 1) == 1) n_ready++;
    cr_assert_eq(n_ready, N);
    close(gate[1]); /* all at once */
    burst_rec rec;
    double lat[N];
    int n = 0, ok = 0;
    while (n < N && read(out[0], &rec, sizeof rec) == (ssize_t)sizeof rec) {
        lat[n++] = rec.connect_ms;
        ok += rec.rc == 0;
    }
    close(ready[0]);
    close(out[0]);
    for (int i = 0; i < N; i++) cr_expect_eq(reap(pids[i], 30000), 0, "burst client %d", i);
    kill(pb, SIGKILL);
    reap(pb, 10000);
    cr_expect_eq(n, N, "%d burst clients reported", n);
    cr_expect_eq(ok, N, "%d of %d burst clients connected and were answered", ok, N);
    if (n > 0) {
        qsort(lat, (size_t)n, sizeof lat[0], cmp_dbl);
        int k99 = (int)(0.99 * (n - 1) + 0.999);
        cr_log_info(
            "64 connects to a daemon busy with 16 streams: %d connected; connect p50 %.2f ms, "
            "p99 %.2f ms, max %.2f ms",
            ok, lat[n / 2], lat[k99 < n ? k99 : n - 1], lat[n - 1]);
    }
    assert_back_to_baseline(&d, 10000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}

/* Clients connecting while the engine runs one long step (a prefill of 16 prompts of 240
 * tokens on the stories15M shape: seconds on this VM) get their sessions within it — the
 * loop's handshake thread answers them — instead of after it: without it the first connect
 * of the step returns only after the step's tokens are published.  The sessions opened
 * during the step work. */
Test(daemon_e2e, connects_during_a_long_engine_step_are_answered_within_it, .timeout = 240)
{
    need_daemon_binary();
    /* nice 0, not the default -10: seconds of a step at -10 on both vCPUs would starve the
     * clients of a test running beside this one */
    const char *extra[] = {"--max-sessions-per-uid", "80", "--nice", "0", NULL};
    dmn d;
    dmn_start(&d, "synthetic:stories15M:1", NULL, extra);
    enum { A = 16, PROMPT = 240, B = 24 };
    ringlm_client *a;
    cr_assert_eq(ringlm_connect(d.sock, &a), 0, "%s", ringlm_errdetail());
    static int32_t prompt[A][PROMPT];
    for (int i = 0; i < A; i++) {
        for (int k = 0; k < PROMPT; k++) prompt[i][k] = 3 + (i * 7919 + k * 104729) % 4000;
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = prompt[i];
        r.n_prompt = PROMPT;
        r.max_new_tokens = 1;
        cr_assert_eq(ringlm_submit(a, &r, NULL), 0, "%s", ringlm_errdetail());
    }
    ringlm_client *b[B];
    int opened = 0, first_event_seen = 0;
    ringlm_event ev;
    while (opened < B) {
        int r = ringlm_connect(d.sock, &b[opened]);
        cr_assert_eq(r, 0, "connect %d during the step: %s", opened, ringlm_errdetail());
        opened++;
        r = ringlm_next_event(a, &ev, 0);
        cr_assert_geq(r, 0, "%s", ringlm_errdetail());
        if (r == 1) {
            first_event_seen = 1;
            break;
        }
    }
    cr_log_info("%d connects answered before the long step's first token (%s)",
                opened - first_event_seen, first_event_seen ? "then it came" : "all of them");
    /* Without the handshake thread the first connect made while the step runs returns only
     * after it, so at most the one connect made before the loop took up the submits is
     * answered first.  The bound is 3, not more: a loaded host slows each connect as much
     * as the step (5 of them in a full make test at load 15, 24 when quiet). */
    cr_expect_geq(opened - first_event_seen, 3,
                  "only %d of the connects made during the step were answered before it ended",
                  opened - first_event_seen);
    /* the step's requests all finish; a session opened during it is served */
    int finished = first_event_seen && ev.kind == RINGLM_EV_FINISH;
    while (finished < A) {
        int r = ringlm_next_event(a, &ev, 60000);
        cr_assert_eq(r, 1, "the long step's requests did not finish: %s", ringlm_errdetail());
        finished += ev.kind == RINGLM_EV_FINISH;
    }
    int32_t p2[2] = {1, 403};
    ringlm_request r2;
    ringlm_request_init(&r2);
    r2.prompt = p2;
    r2.n_prompt = 2;
    r2.max_new_tokens = 2;
    cr_assert_eq(ringlm_submit(b[0], &r2, NULL), 0, "%s", ringlm_errdetail());
    int rc;
    while ((rc = ringlm_next_event(b[0], &ev, 30000)) == 1 && ev.kind != RINGLM_EV_FINISH) {}
    cr_expect_eq(rc, 1, "a session opened during the step got no answer: %s", ringlm_errdetail());
    for (int i = 0; i < opened; i++) ringlm_close(b[i]);
    ringlm_close(a);
    assert_back_to_baseline(&d, 10000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}

/* ---- metrics ------------------------------------------------------------------------- */

Test(daemon_e2e, metrics_endpoint_tracks_pools_and_requests)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    static ref_case cases[12];
    int n = load_refs(cases, 12);
    if (n < 4) cr_skip_test("reference-greedy.json not found");
    const char *extra[] = {"--metrics", "127.0.0.1:0", "--host-kv-blocks", "32", NULL};
    dmn d;
    dmn_start(&d, model, NULL, extra);
    int port = metrics_port(&d);
    cr_assert_gt(port, 0, "no 'metrics on port' line in the daemon's stderr");
    gen_job g = {.sock = d.sock, .cases = cases, .n_cases = 4};
    cr_expect_eq(reap(spawn(client_greedy, &g), 60000), 0);
    assert_back_to_baseline(&d, 5000);
    char *body = NULL;
    uint64_t deadline = now_ms() + 5000;
    double fin = -1, used = -1, total = -1, freeb = -1, running = -1, usage = -1;
    for (;;) {
        int status = 0;
        free(body);
        body = th_http_get(port, "/metrics", &status, NULL, 0);
        cr_assert(body && status == 200, "GET /metrics failed (status %d)", status);
        /* the built-in policy: this uid's own tenant */
        char fin_key[128];
        snprintf(
            fin_key, sizeof fin_key,
            "ringlm_requests_finished_total{tenant=\"uid%u\",class=\"default\",reason=\"length\"}",
            (unsigned)geteuid());
        fin = prom_value(body, fin_key);
        used = prom_value(body, "ringlm_kv_blocks_used{tier=\"device\"}");
        freeb = prom_value(body, "ringlm_kv_blocks_free{tier=\"device\"}");
        total = prom_value(body, "ringlm_kv_blocks_total{tier=\"device\"}");
        running = prom_value(body, "vllm:num_requests_running");
        usage = prom_value(body, "vllm:kv_cache_usage_perc");
        if (fin >= 3 && used == 0 && running == 0) break;
        if (now_ms() > deadline) break;
        poll_pause();
    }
    cr_log_info("metrics: finished(length) %.0f, device used %.0f free %.0f total %.0f, running "
                "%.0f, usage %.3f",
                fin, used, freeb, total, running, usage);
    cr_expect_geq(fin, 3, "finished requests not counted");
    cr_expect_eq(used, 0);
    cr_expect_eq(used + freeb, total, "device: used + free != total in /metrics");
    cr_expect_eq(total, 1024);
    cr_expect_eq(running, 0);
    cr_expect_eq(usage, 0);
    cr_expect_not_null(strstr(body, "ringlm_info{"), "no info gauge");
    cr_expect_not_null(strstr(body, "ringlm_time_to_first_token_seconds_bucket"),
                       "no TTFT histogram");
    cr_expect_not_null(strstr(body, "ringlm_kv_blocks_total{tier=\"host\"} 32"),
                       "no host tier series");
    free(body);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}

/* --check-config prints the canonical policy and its hash (non-zero exit with the line for a
 * bad one); --version names the model and policy hashes; the running daemon serves that
 * very hash to its clients. */
Test(daemon_e2e, check_config_version_and_policy_identity)
{
    need_daemon_binary();
    char dir[] = "/tmp/ringlmd-cc-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char good[128], bad[128], cmd[1024], line[512];
    snprintf(good, sizeof good, "%s/good.policy", dir);
    snprintf(bad, sizeof bad, "%s/bad.policy", dir);
    FILE *f = fopen(good, "w");
    fputs("# comment\n[scheduler]\ntoken_budget = 128   # spelt differently below\nprefill_chunk = "
          "64\n",
          f);
    fclose(f);
    f = fopen(bad, "w");
    fputs("[scheduler]\ntoken_budget = 128\nno_such_knob = 1\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "%s/ringlmd --model synthetic:stories260K:1 --policy %s --check-config 2>&1",
             th_bin_dir(), good);
    FILE *p = popen(cmd, "r");
    char hash[64] = "";
    while (fgets(line, sizeof line, p)) sscanf(line, "# policy hash %63s", hash);
    cr_expect_eq(pclose(p), 0, "--check-config of a good policy failed");
    cr_assert_eq(strlen(hash), 16, "no '# policy hash' line (got \"%s\")", hash);
    snprintf(cmd, sizeof cmd,
             "%s/ringlmd --model synthetic:stories260K:1 --policy %s --check-config 2>&1",
             th_bin_dir(), bad);
    p = popen(cmd, "r");
    bool named = false;
    while (fgets(line, sizeof line, p))
        if (strstr(line, "line 3") && strstr(line, "no_such_knob")) named = true;
    cr_expect_neq(pclose(p), 0, "--check-config accepted an unknown key");
    cr_expect(named, "the error does not name line 3 and the key");
    snprintf(cmd, sizeof cmd,
             "%s/ringlmd --model synthetic:stories260K:1 --policy %s --version 2>&1", th_bin_dir(),
             good);
    p = popen(cmd, "r");
    bool has_hash = false, has_model = false;
    while (fgets(line, sizeof line, p)) {
        if (strstr(line, "policy") && strstr(line, hash)) has_hash = true;
        if (strstr(line, "model synthetic:stories260K:1 ")) has_model = true;
    }
    cr_expect_eq(pclose(p), 0);
    cr_expect(has_hash && has_model, "--version lacks the model or the policy hash");
    /* The daemon serves the same hash. */
    f = fopen(good, "r");
    char text[512];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    dmn d;
    dmn_start(&d, "synthetic:stories260K:1", text, NULL);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0);
    char served[32];
    snprintf(served, sizeof served, "%016llx", (unsigned long long)ringlm_policy_hash(c));
    ringlm_close(c);
    cr_expect_str_eq(served, hash, "session policy hash %s, --check-config said %s", served, hash);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) { /* best effort */
    }
}

/* Deadlines: under load, a request whose deadline cannot be met ends with a reason
 * (rejected as infeasible at admission, or timed out) — it never runs on past it. */
Test(daemon_e2e, deadlines_end_with_a_reason)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    const char *policy = "[scheduler]\nmode = token_budget\ntoken_budget = 32\nprefill_chunk = 32\n"
                         "max_active_seqs = 4\n";
    dmn d;
    dmn_start(&d, model, policy, NULL);
    char ob[160], od[160];
    snprintf(ob, sizeof ob, "%s/busy.txt", d.dir);
    snprintf(od, sizeof od, "%s/deadline.txt", d.dir);
    /* The deadline requests are sent once the busy ones stream: started at a fixed time
     * instead, a busy client late to start on a loaded machine left them an idle daemon,
     * where all 8 met the 20 ms deadline ("no deadline was enforced", at load 8) */
    int rfd[2];
    cr_assert_eq(pipe(rfd), 0);
    load_job busy = {.sock = d.sock,
                     .n_requests = 24,
                     .concurrency = 24,
                     .prompt_len = 64,
                     .max_new = 200,
                     .token_base = 1,
                     .vocab = 512,
                     .out_path = ob,
                     .ready_fd = rfd[1]};
    pid_t pb = spawn(client_load, &busy);
    close(rfd[1]);
    char b;
    cr_assert_eq(read(rfd[0], &b, 1), 1, "the busy client never got a token");
    close(rfd[0]);
    load_job dl = {.sock = d.sock,
                   .n_requests = 8,
                   .concurrency = 8,
                   .prompt_len = 64,
                   .max_new = 200,
                   .token_base = 2,
                   .vocab = 512,
                   .out_path = od,
                   .ready_fd = -1,
                   .deadline_us = 20000};
    pid_t pd = spawn(client_load, &dl);
    cr_expect_eq(reap(pd, 60000), 0);
    cr_expect_eq(reap(pb, 60000), 0);
    static result_line R[16];
    int n = read_results(od, R, 16);
    cr_assert_eq(n, 8);
    int rejected = 0, timed_out = 0, met = 0;
    for (int i = 0; i < n; i++) {
        if (R[i].reason == RINGLM_FINISH_REJECTED) {
            rejected++;
            cr_expect_eq(R[i].cause, RINGLM_R_DEADLINE_INFEASIBLE, "request %d rejected for %s", i,
                         ringlm_reason_name(R[i].cause));
        } else if (R[i].reason == RINGLM_FINISH_TIMEOUT) {
            timed_out++;
        } else {
            met++;
            cr_expect_leq(R[i].e2e_us, 20000 + 50000,
                          "request %d ran %lld us past a 20 ms deadline "
                          "(%s)",
                          i, R[i].e2e_us, ringlm_reason_name(R[i].reason));
        }
    }
    cr_log_info("deadline 20 ms under load: %d rejected at admission, %d timed out, %d met",
                rejected, timed_out, met);
    cr_expect_gt(rejected + timed_out, 0, "no deadline was enforced");
    assert_back_to_baseline(&d, 5000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}

/* ---- prefix cache ---------------------------------------------------------------------- */

/* Prompts sent one after another on one session (each waits for the previous one's FINISH,
 * so later ones find what earlier ones cached); the tokens each stream produced, then its
 * finish reason and token count, go to a file, one line a prompt. */
#define SEQ_MAX 12
typedef struct seq_job {
    const char *sock, *out;
    int n; /* prompts */
    uint32_t max_new;
    int32_t prompt[SEQ_MAX][80];
    uint32_t n_prompt[SEQ_MAX];
    int repeat[SEQ_MAX];          /* times prompt i is sent, one after another (0: once) */
    uint32_t max_new_of[SEQ_MAX]; /* new tokens prompt i asks for (0: max_new) */
} seq_job;

static int client_sequential(void *arg)
{
    seq_job *g = arg;
    ringlm_client *c;
    if (ringlm_connect(g->sock, &c) < 0) {
        fprintf(stderr, "connect: %s\n", ringlm_errdetail());
        return 2;
    }
    FILE *f = fopen(g->out, "w");
    if (!f) return 3;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < (g->repeat[i] ? g->repeat[i] : 1); k++) {
            ringlm_request r;
            ringlm_request_init(&r);
            r.prompt = g->prompt[i];
            r.n_prompt = g->n_prompt[i];
            r.max_new_tokens = g->max_new_of[i] ? g->max_new_of[i] : g->max_new;
            uint64_t id;
            if (ringlm_submit(c, &r, &id) < 0) {
                fprintf(stderr, "submit: %s\n", ringlm_errdetail());
                return 4;
            }
            for (;;) {
                ringlm_event ev;
                int rc = ringlm_next_event(c, &ev, 60000);
                if (rc <= 0) {
                    fprintf(stderr, "next_event: %s\n", ringlm_errdetail());
                    return 5;
                }
                if (ev.kind == RINGLM_EV_TOKEN) fprintf(f, "%d ", ev.token);
                if (ev.kind == RINGLM_EV_FINISH) {
                    fprintf(f, "| %s %u\n", ringlm_reason_name(ev.finish_reason), ev.n_tokens);
                    break;
                }
            }
        }
    fclose(f);
    ringlm_close(c);
    return 0;
}

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

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return strdup(buf);
}

/* One side of a cache-on/off comparison: a fresh ringlmd (model, policy, flags) whose client
 * writes its output to <its dir>/out.txt — *sock and *out (the client job's) are pointed at
 * its socket and that file. */
static void dmn_start_for(dmn *d, const char *model, const char *policy, const char *const *flags,
                          const char **sock, const char **out)
{
    dmn_start(d, model, policy, flags);
    snprintf(d->out, sizeof d->out, "%s/out.txt", d->dir);
    *sock = d->sock;
    *out = d->out;
}

/* Runs the client process fn(job) to its end (exit 0), then waits for the pools' baseline. */
static void dmn_run_client(dmn *d, int (*fn)(void *), void *job, const char *what)
{
    int st = reap(spawn(fn, job), 60000);
    cr_assert_eq(st, 0, "%s: exit %d", what, st);
    assert_back_to_baseline(d, 5000);
}

/* Stops the daemon (SIGTERM, exit 0) and returns its client's output (free it). */
static char *dmn_stop_output(dmn *d)
{
    cr_assert_eq(dmn_stop(d, SIGTERM, 10000), 0);
    char *o = slurp(d->out);
    cr_assert_not_null(o, "no client output in %s", d->out);
    return o;
}

/* ringlm-sim replaying a daemon's request log (--trace LOG --json, then args): its JSON report
 * (json_decref it), which must have prefix_cache figures (*pc). */
static json_t *sim_replay(const char *reqlog, const char *args, json_t **pc)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/ringlm-sim --trace %s --json %s", th_bin_dir(), reqlog,
             args ? args : "");
    FILE *sp = popen(cmd, "r");
    cr_assert_not_null(sp);
    static char simout[1 << 16];
    size_t sn = fread(simout, 1, sizeof simout - 1, sp);
    simout[sn] = 0;
    cr_assert_eq(pclose(sp), 0, "%s failed:\n%s", cmd, simout);
    json_error_t je;
    json_t *sj = json_loads(simout, 0, &je);
    cr_assert_not_null(sj, "ringlm-sim output is not JSON: %s", je.text);
    *pc = json_object_get(sj, "prefix_cache");
    cr_assert_not_null(*pc, "no prefix_cache figures in the replay");
    return sj;
}

/* Greedy output with the prefix cache on equals output with it off; the later prompts were
 * served from the cache (decision log cache_hit; the stats' pools back to baseline; no block
 * leaked, reference counts checked by the scheduler's invariants in the stats file). */
Test(daemon_e2e, prefix_cache_greedy_output_equals_cache_off)
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
    int off_port = metrics_port(&off);
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
    int port = metrics_port(&on);
    cr_assert_gt(port, 0, "no 'metrics on port' line in the daemon's stderr");
    double queried = 0, want_q = 0, hit = -1;
    for (int i = 0; i < PX_N; i++) want_q += g.n_prompt[i];
    for (uint64_t deadline = now_ms() + 5000;;) { /* published every few ms */
        int status = 0;
        char *body = th_http_get(port, "/metrics", &status, NULL, 0);
        if (body && status == 200) {
            queried = prom_value(body, "vllm:prefix_cache_queries_total");
            hit = prom_value(body, "vllm:prefix_cache_hits_total");
        }
        free(body);
        if (queried == want_q && hit == 48.0 * (PX_N - 1)) break;
        if (now_ms() > deadline) break;
        poll_pause();
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
    for (uint64_t deadline = now_ms() + 5000;;) { /* a snapshot after the last release */
        int status = 0;
        free(body);
        body = th_http_get(port, "/metrics", &status, NULL, 0);
        cr_assert(body && status == 200);
        if (prom_value(body, "vllm:kv_cache_usage_perc") == 0 &&
            prom_value(body, "ringlm_prefix_cache_blocks{tier=\"device\"}") == cached)
            break;
        if (now_ms() > deadline) break;
        poll_pause();
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
Test(daemon_e2e, prefix_cache_every_reference_case_equals_run_c_with_its_prompt_cached)
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
    ringlm_client *c;
    if (ringlm_connect(g->sock, &c) < 0) {
        fprintf(stderr, "connect: %s\n", ringlm_errdetail());
        return 2;
    }
    for (int i = 0; i < g->n; i++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = g->prompt;
        r.n_prompt = 52;
        r.max_new_tokens = 4;
        r.tenant_tag = g->tags[i];
        uint64_t id;
        if (ringlm_submit(c, &r, &id) < 0) {
            fprintf(stderr, "submit: %s\n", ringlm_errdetail());
            return 4;
        }
        for (;;) {
            ringlm_event ev;
            int rc = ringlm_next_event(c, &ev, 60000);
            if (rc <= 0) {
                fprintf(stderr, "next_event: %s\n", ringlm_errdetail());
                return 5;
            }
            if (ev.kind == RINGLM_EV_FINISH) break;
        }
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

Test(daemon_e2e, prefix_cache_domains_isolate_tenants_unless_the_policy_groups_them)
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
Test(daemon_e2e, request_log_records_the_cached_tokens_of_each_request)
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
    ringlm_client *c;
    if (ringlm_connect(g->sock, &c) < 0) {
        fprintf(stderr, "connect: %s\n", ringlm_errdetail());
        return 2;
    }
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
        if (ringlm_submit(c, &r, &id) < 0) {
            fprintf(stderr, "submit: %s\n", ringlm_errdetail());
            return 4;
        }
        for (;;) {
            ringlm_event ev;
            int rc = ringlm_next_event(c, &ev, 60000);
            if (rc <= 0) {
                fprintf(stderr, "next_event: %s\n", ringlm_errdetail());
                return 5;
            }
            if (ev.kind == RINGLM_EV_FINISH && ev.req_id == id) {
                fprintf(f, "%s %u\n", ringlm_reason_name(ev.finish_reason), ev.n_cached_tokens);
                break;
            }
        }
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

Test(daemon_e2e, finish_events_carry_the_cached_tokens)
{
    finish_cached_tokens(true);
}
Test(daemon_e2e, finish_events_carry_no_cached_tokens_with_the_cache_off)
{
    finish_cached_tokens(false);
}

/* ---- prefix cache: forced key collisions ---------------------------------------------- */

/* Issue 12: a cached block is used only after its stored token ids compare equal, so a hash
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

Test(daemon_e2e, prefix_cache_forced_key_collisions_never_reuse_a_wrong_block)
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
    int port = metrics_port(&d);
    cr_assert_gt(port, 0, "no 'metrics on port' line in the daemon's stderr");
    double queried = -1, hit = -1;
    for (uint64_t deadline = now_ms() + 5000;;) { /* published every few ms */
        int status = 0;
        char *body = th_http_get(port, "/metrics", &status, NULL, 0);
        if (body && status == 200) {
            queried = prom_value(body, "vllm:prefix_cache_queries_total");
            hit = prom_value(body, "vllm:prefix_cache_hits_total");
        }
        free(body);
        if ((queried == 4 * CK_PROMPT && hit == CK_PROMPT + 1) || now_ms() > deadline) break;
        poll_pause();
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
    ringlm_client *c;
    if (ringlm_connect(g->sock, &c) < 0) {
        fprintf(stderr, "connect: %s\n", ringlm_errdetail());
        return 2;
    }
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = g->prompt;
    r.n_prompt = g->n_prompt;
    r.max_new_tokens = g->max_new;
    uint64_t id;
    if (ringlm_submit(c, &r, &id) < 0) {
        fprintf(stderr, "submit: %s\n", ringlm_errdetail());
        return 4;
    }
    if (g->ready_fd >= 0 && write(g->ready_fd, "s", 1) != 1) return 6;
    FILE *f = g->out ? fopen(g->out, "w") : NULL;
    for (;;) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 60000);
        if (rc <= 0) {
            fprintf(stderr, "next_event: %s\n", ringlm_errdetail());
            return 5;
        }
        if (ev.kind == RINGLM_EV_TOKEN && f) fprintf(f, "%d ", ev.token);
        if (ev.kind == RINGLM_EV_FINISH) {
            if (f) {
                fprintf(f, "| %s %u\n", ringlm_reason_name(ev.finish_reason), ev.n_tokens);
                fclose(f);
            }
            break;
        }
    }
    ringlm_close(c);
    return 0;
}

Test(daemon_e2e, prefix_cache_kill9_mid_prefill_of_sharing_requests_leaks_nothing)
{
    need_daemon_binary();
    /* The stories15M shape with tiny prefill chunks: a 176-token suffix takes 88 iterations
     * of several ms each to prefill, so the victims are still prefilling when the test sees
     * their cache hits (the decision log is written behind the loop: up to its writer's
     * 10 ms wait).  On stories260K the whole prefill fits in that lag and a victim could
     * finish before it was killed. */
    const char *model = "synthetic:stories15M:7";
    const char *policy = "[scheduler]\nmode = token_budget\ntoken_budget = 32\nprefill_chunk = 2\n";
    /* and the test (it kills) preempts the daemon: at nice -10 all 3 victims had finished
     * before the kill at load 20 */
    static const char *const below_clients[] = {DMN_BELOW_CLIENTS, NULL};
    dmn d;
    dmn_start(&d, model, policy, below_clients);
    static px_kill_job base, surv, victim[3];
    memset(&base, 0, sizeof base);
    base.sock = d.sock;
    base.ready_fd = -1;
    for (int k = 0; k < 64; k++) base.prompt[k] = 3 + (11 * k) % 500;
    base.n_prompt = 64;
    base.max_new = 2;
    cr_assert_eq(reap(spawn(client_px_kill, &base), 60000), 0,
                 "base prompt"); /* 64 tokens cached */
    surv = base;
    for (int k = 64; k < 160; k++) surv.prompt[k] = 3 + (5 * k) % 500;
    surv.n_prompt = 160;
    surv.max_new = 16;
    char ref[160], again[160];
    snprintf(ref, sizeof ref, "%s/surv-ref.txt", d.dir);
    snprintf(again, sizeof again, "%s/surv-again.txt", d.dir);
    surv.out = ref;
    cr_assert_eq(reap(spawn(client_px_kill, &surv), 60000), 0, "survivor alone");
    surv.out = again;
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
    for (uint64_t deadline = now_ms() + 20000;;) {
        if (count_lines(d.declog, "\"ev\":\"cache_hit\"") >= 2 + 3)
            break; /* the survivor twice, 3 victims */
        cr_assert(now_ms() < deadline, "the victims were never admitted with a cache hit");
        poll_pause();
    }
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
    ringlm_client *c;
    if (ringlm_connect(g->sock, &c) < 0) {
        fprintf(stderr, "connect: %s\n", ringlm_errdetail());
        return 2;
    }
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = g->prompt;
    r.n_prompt = 240;
    r.max_new_tokens = 8;
    uint64_t id;
    if (ringlm_submit(c, &r, &id) < 0) {
        fprintf(stderr, "submit: %s\n", ringlm_errdetail());
        return 4;
    }
    char b;
    if (write(g->ready_fd, "s", 1) != 1 || read(g->go_fd, &b, 1) != 1) return 6;
    if (ringlm_cancel(c, id) < 0) {
        fprintf(stderr, "cancel: %s\n", ringlm_errdetail());
        return 7;
    }
    int tokens = 0;
    for (;;) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 60000);
        if (rc <= 0) {
            fprintf(stderr, "next_event: %s\n", ringlm_errdetail());
            return 5;
        }
        tokens += ev.kind == RINGLM_EV_TOKEN;
        if (ev.kind == RINGLM_EV_FINISH) {
            FILE *f = fopen(g->out, "w");
            if (!f) return 3;
            fprintf(f, "%s %d\n", ringlm_reason_name(ev.finish_reason), tokens);
            fclose(f);
            break;
        }
    }
    ringlm_close(c);
    return 0;
}

Test(daemon_e2e, prefix_cache_cancel_mid_prefill_of_a_sharing_request_leaks_nothing)
{
    need_daemon_binary();
    /* the stories15M shape, one prompt token per step: the victim's own 176 tokens take 176
     * steps of several ms to prefill, long after the test saw it admitted */
    const char *model = "synthetic:stories15M:7";
    const char *policy = "[scheduler]\nmode = token_budget\ntoken_budget = 32\nprefill_chunk = 1\n";
    static const char *const below_clients[] = {DMN_BELOW_CLIENTS, NULL};
    dmn d;
    dmn_start(&d, model, policy, below_clients);
    static px_kill_job base, surv;
    memset(&base, 0, sizeof base);
    base.sock = d.sock;
    base.ready_fd = -1;
    for (int k = 0; k < 64; k++) base.prompt[k] = 3 + (11 * k) % 500;
    base.n_prompt = 64;
    base.max_new = 2;
    cr_assert_eq(reap(spawn(client_px_kill, &base), 60000), 0,
                 "base prompt"); /* 64 tokens cached */
    surv = base;
    for (int k = 64; k < 80; k++) surv.prompt[k] = 3 + (5 * k) % 500;
    surv.n_prompt = 80;
    surv.max_new = 16;
    char ref[160], again[160], vout[160];
    snprintf(ref, sizeof ref, "%s/surv-ref.txt", d.dir);
    snprintf(again, sizeof again, "%s/surv-again.txt", d.dir);
    snprintf(vout, sizeof vout, "%s/victim.txt", d.dir);
    surv.out = ref;
    cr_assert_eq(reap(spawn(client_px_kill, &surv), 60000), 0, "survivor alone");
    surv.out = again;
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
    for (uint64_t deadline = now_ms() + 20000;;) {
        if (count_lines(d.declog, "\"ev\":\"cache_hit\"") >= 2) break;
        cr_assert(now_ms() < deadline, "the victim was never admitted with a cache hit");
        poll_pause();
    }
    pid_t sp = spawn(client_px_kill, &surv);
    for (uint64_t deadline = now_ms() + 20000;;) { /* and the survivor holds them too */
        if (count_lines(d.declog, "\"ev\":\"cache_hit\"") >= 3) break;
        cr_assert(now_ms() < deadline, "the survivor was never admitted with a cache hit");
        poll_pause();
    }
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
typedef struct px_conc_job {
    const char *sock, *out;
    int32_t prompt[4][80];
    uint32_t n_prompt[4];
    int n;            /* requests (0: 4) */
    uint32_t max_new; /* new tokens each (0: 200) */
} px_conc_job;

static int client_px_concurrent(void *arg)
{
    px_conc_job *g = arg;
    int n = g->n ? g->n : 4;
    ringlm_client *c;
    if (ringlm_connect(g->sock, &c) < 0) {
        fprintf(stderr, "connect: %s\n", ringlm_errdetail());
        return 2;
    }
    uint64_t ids[4];
    static char out[4][4096];
    size_t len[4] = {0};
    ringlm_request r[4];
    for (int i = 0; i < n; i++) {
        ringlm_request_init(&r[i]);
        r[i].prompt = g->prompt[i];
        r[i].n_prompt = g->n_prompt[i];
        r[i].max_new_tokens = g->max_new ? g->max_new : 200;
        r[i].ignore_stop = true;
    }
    /* one batch: the daemon finds them together, so none runs alone however long this
     * process is descheduled between building the requests */
    if (ringlm_submit_batch(c, r, (uint32_t)n, ids) < 0) {
        fprintf(stderr, "submit: %s\n", ringlm_errdetail());
        return 4;
    }
    for (int done = 0; done < n;) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 60000);
        if (rc <= 0) {
            fprintf(stderr, "next_event: %s\n", ringlm_errdetail());
            return 5;
        }
        int i = 0;
        while (i < n && ids[i] != ev.req_id) i++;
        if (i == n) continue;
        if (ev.kind == RINGLM_EV_TOKEN && len[i] < sizeof out[i] - 16)
            len[i] += (size_t)snprintf(out[i] + len[i], sizeof out[i] - len[i], "%d ", ev.token);
        if (ev.kind == RINGLM_EV_FINISH) {
            snprintf(out[i] + len[i], sizeof out[i] - len[i], "| %s %u",
                     ringlm_reason_name(ev.finish_reason), ev.n_tokens);
            done++;
        }
    }
    FILE *f = fopen(g->out, "w");
    if (!f) return 3;
    for (int i = 0; i < n; i++) fprintf(f, "%s\n", out[i]);
    fclose(f);
    ringlm_close(c);
    return 0;
}

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

Test(daemon_e2e, prefix_cache_preempt_swap_of_shared_blocks_same_tokens)
{
    px_preempt("swap");
}
Test(daemon_e2e, prefix_cache_preempt_recompute_of_shared_blocks_same_tokens)
{
    px_preempt("recompute");
}

/* ---- prefix cache across the host and disk tiers ---------------------------------------- */

/* Three distinct 64-token prompts, then the first again, one after another, through a
 * device pool of 8 blocks of 16 tokens (one request needs 5 while it runs, and keeps 4):
 * the second's growth and the third push the first's blocks off the device before it comes
 * back.  The tokens each stream produced go to a file. */
#define TX_N 4

/* Lines of a log holding both needles. */
static int count_lines2(const char *path, const char *a, const char *b)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, a) && strstr(line, b);
    fclose(f);
    return n;
}

/* The first decision-log line holding both needles (static buffer; "" when none). */
static const char *find_line2(const char *path, const char *a, const char *b)
{
    static char line[4096];
    FILE *f = fopen(path, "r");
    if (!f) return "";
    while (fgets(line, sizeof line, f))
        if (strstr(line, a) && strstr(line, b)) {
            fclose(f);
            return line;
        }
    fclose(f);
    return "";
}

static double json_num_of(const char *line, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    return p ? strtod(p + strlen(k), NULL) : -1;
}

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

Test(daemon_e2e, prefix_cache_host_tier_demotes_reloads_byte_exact)
{
    tiers_reload(false);
}
Test(daemon_e2e, prefix_cache_disk_tier_demotes_reloads_byte_exact)
{
    tiers_reload(true);
}

/* A disk tier whose bandwidth is low (--disk-kv-bw: 1 kB/s until measured): keeping a block
 * there to reload it later would cost more than computing it again, so the cost model drops
 * the blocks the device lets go instead of demoting them, and the decision log says why —
 * both sides of the test; the prompt that comes back is recomputed, with the same tokens. */
Test(daemon_e2e, prefix_cache_slow_disk_tier_is_not_worth_keeping_blocks_in)
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
     * the fourth prompt there (the replay the issue's goal is measured by departed so) */
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
    ringlm_client *c;
    if (ringlm_connect(g->sock, &c) < 0) {
        fprintf(stderr, "connect: %s\n", ringlm_errdetail());
        return 2;
    }
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
Test(daemon_e2e, prefix_cache_reload_runs_beside_a_decoding_stream)
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
Test(daemon_e2e, prefix_cache_failed_reload_ends_only_its_request)
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

/* ---- a recompute-preempted sequence resumes on its own cached blocks ---------------------- */


/* Two 16-token prompts (one block each, nothing shared), 100 new tokens each, through 14
 * device blocks of 16 where each needs 8 at the end: one is preempted by recompute.  Its full
 * blocks — its prompt's and its answer's so far — stay cached, and the other's growth evicts
 * only their tail; when it resumes it finds the rest.  That hit is all its own (self_tokens =
 * cached_tokens), covers answer blocks (more than its one prompt block), and /metrics counts
 * it under kind="self" with no cross-request hit; the tokens equal those with the cache off.
 * Without the reuse the resumed sequence would find nothing. */
Test(daemon_e2e, prefix_cache_recompute_preempted_sequence_resumes_on_its_own_blocks)
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
    int port = metrics_port(&on);
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
    ringlm_client *c;
    if (ringlm_connect(g->sock, &c) < 0) {
        fprintf(stderr, "connect: %s\n", ringlm_errdetail());
        return 2;
    }
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
        if (ringlm_submit(c, &r, &id) < 0) {
            fprintf(stderr, "submit: %s\n", ringlm_errdetail());
            return 4;
        }
        uint32_t n0 = n;
        for (;;) {
            ringlm_event ev;
            int rc = ringlm_next_event(c, &ev, 60000);
            if (rc <= 0) {
                fprintf(stderr, "next_event: %s\n", ringlm_errdetail());
                return 5;
            }
            if (ev.kind == RINGLM_EV_TOKEN) {
                fprintf(f, "%d ", ev.token);
                if (n < 120) conv[n++] = ev.token;
            }
            if (ev.kind == RINGLM_EV_FINISH) {
                fprintf(f, "| %s %u\n", ringlm_reason_name(ev.finish_reason), ev.n_tokens);
                break;
            }
        }
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
Test(daemon_e2e, prefix_cache_next_turn_hits_the_last_answer)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    static turn_job g;
    memset(&g, 0, sizeof g);
    for (int k = 0; k < 40; k++) g.prompt[k] = 3 + (19 * k + 5) % 400;
    static const char *const off_flags[] = {"--kv-block-size", "16", "--no-prefix-cache", NULL};
    static const char *const on_flags[] = {"--kv-block-size", "16", NULL};
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
    ringlm_client *c;
    if (ringlm_connect(g->sock, &c) < 0) {
        fprintf(stderr, "connect: %s\n", ringlm_errdetail());
        return 2;
    }
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
        if (ringlm_submit(c, &r, &id) < 0) {
            fprintf(stderr, "submit: %s\n", ringlm_errdetail());
            return 4;
        }
        for (;;) {
            ringlm_event ev;
            int rc = ringlm_next_event(c, &ev, 60000);
            if (rc <= 0) {
                fprintf(stderr, "next_event: %s\n", ringlm_errdetail());
                return 5;
            }
            if (ev.kind == RINGLM_EV_TOKEN) {
                fprintf(f, "%d ", ev.token);
                if (n < 500) conv[n++] = ev.token;
            }
            if (ev.kind == RINGLM_EV_FINISH) {
                fprintf(f, "| %s %u\n", ringlm_reason_name(ev.finish_reason), ev.n_tokens);
                if (turn == 0 && ev.finish_reason != RINGLM_FINISH_STOP) {
                    fprintf(stderr, "turn 1 did not stop\n");
                    return 6;
                }
                break;
            }
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
    ringlm_client *c;
    if (ringlm_connect(g->sock, &c) < 0) {
        fprintf(stderr, "connect: %s\n", ringlm_errdetail());
        return 2;
    }
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
Test(daemon_e2e, prefix_cache_answers_ending_on_a_block_boundary_cache_what_was_computed)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    static ref_case cases[12];
    int nc = load_refs(cases, 12);
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
Test(daemon_e2e, prefix_cache_slow_tier_found_at_admission_is_recomputed)
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
