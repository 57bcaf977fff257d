/* SPDX-License-Identifier: MIT */
/*
 * tests/test_daemon_burst.c — prompts that arrive together through a real ringlmd (DESIGN.md
 * §5 budgets; the scheduler's own rule is tests/test_sched_rules.c's
 * a_burst_of_prompts_is_prefilled_together_up_to_the_budget): a burst whose prompts fit the
 * token budget is prefilled in one engine step, and the first token of each of them is
 * published in that step, before any of them gets a second; a burst beyond the budget is
 * spread over full steps — no step runs under the budget while a prompt of the burst waits.
 *
 * Asserted from what the daemon records, not from a clock: its iteration log (one line per
 * engine step: the prefill tokens and sequences, the decode rows) and its request log (each
 * request's first_token_us is the time stamp of the step that sampled it, so requests whose
 * first tokens share one came out of one step), and from the order in which a client reads
 * its events. Requests from several client processes reach the daemon together because it is
 * stopped (SIGSTOP) until every client has submitted: nothing depends on how fast the
 * clients or the daemon run.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/iteration_log.h"
#include "formats/request_log.h"
#include "libclient/ringlm.h"
#include "tests/daemon_helpers.h"
#include "tests/gateway_helpers.h"
#include "tests/helpers.h"

#define BURST_MAX  16 /* requests of one daemon burst */
#define REQS_MAX   64 /* requests of one gateway burst */
#define PROMPT_MAX 64

TestSuite(daemon_burst, .timeout = 120);

/* ---- a client of the burst ----------------------------------------------------------------- */

typedef struct burst_client {
    const char *sock;
    int n; /* requests, submitted as one batch */
    uint32_t prompt_len, max_new;
    uint32_t salt;    /* prompts differ between clients: nothing comes from the prefix cache */
    int ready_fd;     /* it writes 'c' once connected and 's' once submitted (-1: does not) */
    int go_fd;        /* it reads one byte here before submitting (-1: submits at once) */
    bool check_order; /* exit 3 when a second token comes before every first token */
    char out[160];    /* the events in the order it read them, for the failure message */
} burst_client;

static void prompt_of(int32_t *p, uint32_t n, uint32_t salt)
{
    p[0] = 1; /* BOS */
    for (uint32_t i = 1; i < n; i++) p[i] = (int32_t)(3 + (i * 7 + salt * 31) % 400);
}

/* Exit 0: every request generated max_new tokens (and, with check_order, no second token of
 * any of its requests was read before the first token of every one of them); 3: a second
 * token came first; 2: a call failed or a request ended otherwise. */
static int client_burst(void *arg)
{
    burst_client *b = arg;
    ringlm_client *c;
    if (ringlm_connect(b->sock, &c) < 0) return 2;
    char x = 'c';
    if (b->ready_fd >= 0 && write(b->ready_fd, &x, 1) != 1) return 2;
    if (b->go_fd >= 0 && read(b->go_fd, &x, 1) != 1) return 2;
    static int32_t prompt[BURST_MAX][PROMPT_MAX];
    ringlm_request rq[BURST_MAX];
    uint64_t ids[BURST_MAX];
    for (int i = 0; i < b->n; i++) {
        prompt_of(prompt[i], b->prompt_len, b->salt * BURST_MAX + (uint32_t)i);
        ringlm_request_init(&rq[i]);
        rq[i].prompt = prompt[i];
        rq[i].n_prompt = b->prompt_len;
        rq[i].max_new_tokens = b->max_new;
        rq[i].ignore_stop = true; /* exactly max_new tokens each */
    }
    if (ringlm_submit_batch(c, rq, (uint32_t)b->n, ids) < 0) return 2;
    x = 's';
    if (b->ready_fd >= 0 && write(b->ready_fd, &x, 1) != 1) return 2;
    FILE *f = fopen(b->out, "w");
    if (!f) return 2;
    int firsts = 0, ended = 0, rc = 0;
    bool second_early = false, bad = false;
    while (ended < b->n) {
        ringlm_event ev;
        if ((rc = ringlm_next_event(c, &ev, 60000)) <= 0) {
            fprintf(f, "next_event %d: %s\n", rc, ringlm_errdetail());
            break;
        }
        int i = 0;
        while (i < b->n && ids[i] != ev.req_id) i++;
        if (ev.kind == RINGLM_EV_TOKEN) {
            fprintf(f, "%d:%u ", i, ev.index);
            if (ev.index == 0)
                firsts++;
            else if (firsts < b->n && b->check_order)
                second_early = true;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            fprintf(f, "%d:end(%d,%u) ", i, ev.finish_reason, ev.n_tokens);
            bad |= ev.finish_reason != RINGLM_FINISH_LENGTH || ev.n_tokens != b->max_new;
            ended++;
        }
    }
    fprintf(f, "\n");
    fclose(f);
    ringlm_close(c);
    return second_early ? 3 : rc <= 0 || bad ? 2 : 0;
}

/* ---- what the daemon recorded ------------------------------------------------------------ */

#define STEPS_MAX 4096

/* The iteration log's lines (engine steps) in order: how many. */
static int read_steps(const char *path, fmt_iteration *out, int max)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no iteration log %s", path);
    char line[1024], why[160];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        size_t len = strcspn(line, "\n");
        cr_assert_eq(fmt_iteration_parse(line, len, &out[n], why, sizeof why), 0,
                     "iteration log line %d: %s", n + 1, why);
        n++;
    }
    fclose(f);
    return n;
}

/* The request log's first_token_us of each request into out: how many requests. */
static int read_first_tokens(const char *path, int64_t *out, int max)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no request log %s", path);
    static char line[1 << 16];
    static fmt_request_text text;
    char why[160];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        fmt_request r;
        cr_assert_eq(fmt_request_parse(line, strcspn(line, "\n"), &r, &text, why, sizeof why), 0,
                     "request log line %d: %s", n + 1, why);
        cr_assert_neq(r.first_token_us, FMT_NULL, "request %llu has no first token",
                      (unsigned long long)r.req);
        out[n++] = r.first_token_us;
    }
    fclose(f);
    return n;
}

static void dump_steps(const fmt_iteration *st, int n)
{
    for (int i = 0; i < n && i < 40; i++)
        fprintf(stderr, "  step %lld: prefill %lld tokens of %lld sequences, %lld decode rows\n",
                (long long)st[i].it, (long long)st[i].prefill_tokens, (long long)st[i].prefill_seqs,
                (long long)st[i].decode_seqs);
}

/* ---- the burst ------------------------------------------------------------------------------ */

typedef struct burst {
    int clients;    /* client processes */
    int per_client; /* requests each submits as one batch */
    uint32_t prompt_len, max_new;
    bool check_order; /* each client checks that its first tokens come before any second */
    const char *policy;
    const char *const *flags; /* further ringlmd options (NULL-terminated; may be NULL) */
} burst;

typedef struct burst_result {
    fmt_iteration steps[STEPS_MAX];
    int n_steps;
    int64_t first_token_us[REQS_MAX];
    int n_reqs;
} burst_result;

/* Runs the burst through a fresh ringlmd: every client connects, the daemon is stopped, every
 * client submits, the daemon resumes and finds every request at once. Asserts every client's
 * outcome; the daemon's logs go to *res (after it exited: they are complete). */
static void run_burst(const burst *bu, burst_result *res)
{
    need_daemon_binary();
    cr_assert_leq(bu->clients * bu->per_client, BURST_MAX);
    char model[512];
    model_or_synthetic(model, sizeof model);
    static char itlog[200];
    static dmn d;
    const char *argv[24];
    int a = 0;
    snprintf(itlog, sizeof itlog, "/tmp/ringlmd-burst-it-%d.jsonl", (int)getpid());
    unlink(itlog);
    argv[a++] = "--iteration-log";
    argv[a++] = itlog;
    for (int i = 0; bu->flags && bu->flags[i] && a < 22; i++) argv[a++] = bu->flags[i];
    argv[a] = NULL;
    dmn_start(&d, model, bu->policy, argv);

    static burst_client cl[BURST_MAX];
    pid_t pid[BURST_MAX];
    int ready[2], go[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(go), 0);
    for (int k = 0; k < bu->clients; k++) {
        cl[k] = (burst_client){.sock = d.sock,
                               .n = bu->per_client,
                               .prompt_len = bu->prompt_len,
                               .max_new = bu->max_new,
                               .salt = (uint32_t)k,
                               .ready_fd = ready[1],
                               .go_fd = go[0],
                               .check_order = bu->check_order};
        snprintf(cl[k].out, sizeof cl[k].out, "%s/client%d.txt", d.dir, k);
        pid[k] = spawn(client_burst, &cl[k]);
    }
    /* every client connected (the handshake needs the daemon running), then the daemon
     * stops, then every client submits */
    char x;
    for (int k = 0; k < bu->clients; k++)
        cr_assert(th_readable(ready[0], 30000) && read(ready[0], &x, 1) == 1 && x == 'c',
                  "a client did not connect");
    th_suspend(d.pid, 10000);
    for (int k = 0; k < bu->clients; k++) cr_assert_eq(write(go[1], "g", 1), 1);
    for (int k = 0; k < bu->clients; k++) {
        bool got = th_readable(ready[0], 30000) && read(ready[0], &x, 1) == 1 && x == 's';
        if (!got) th_resume(d.pid);
        cr_assert(got, "a client did not submit");
    }
    th_resume(d.pid);
    for (int k = 0; k < bu->clients; k++) {
        int st = reap(pid[k], 60000);
        if (st != 0) {
            char *o = th_read_file(cl[k].out);
            dump_file(d.errlog, "ringlmd output");
            cr_assert_fail("client %d: exit %d (3: a second token before every first one); "
                           "request:index in the order it read them: %s",
                           k, st, o);
        }
    }
    close(ready[0]);
    close(ready[1]);
    close(go[0]);
    close(go[1]);
    assert_back_to_baseline(&d, 10000);
    cr_assert_eq(dmn_stop(&d, SIGTERM, 10000), 0, "ringlmd did not exit 0 on SIGTERM");
    res->n_steps = read_steps(itlog, res->steps, STEPS_MAX);
    res->n_reqs = read_first_tokens(d.reqlog, res->first_token_us, BURST_MAX);
    cr_assert_eq(res->n_reqs, bu->clients * bu->per_client, "%d request-log lines", res->n_reqs);
    dmn_cleanup(&d);
    unlink(itlog);
}

/* The policies: a budget the burst fits, and one it does not. */
#define POLICY_FITS "[scheduler]\nmode = token_budget\ntoken_budget = 256\nprefill_chunk = 256\n"
#define POLICY_OVER "[scheduler]\nmode = token_budget\ntoken_budget = 64\nprefill_chunk = 64\n"

/* A burst of n prompts of prompt_len tokens within the budget (`what` names them): one step
 * prefills every prompt and samples every first token (one first_token_us for all). */
static void assert_prefilled_in_one_step(const char *what, int n, int prompt_len,
                                         const burst_result *r)
{
    const fmt_iteration *st = r->steps;
    int prefill_steps = 0;
    for (int i = 0; i < r->n_steps; i++) prefill_steps += st[i].prefill_tokens > 0;
    if (prefill_steps != 1 || st[0].prefill_seqs != n) dump_steps(st, r->n_steps);
    cr_assert_eq(prefill_steps, 1, "the burst of %d %s was prefilled over %d steps", n, what,
                 prefill_steps);
    cr_assert_eq(st[0].prefill_seqs, n, "the first step prefilled %lld of %d %s",
                 (long long)st[0].prefill_seqs, n, what);
    cr_assert_eq(st[0].prefill_tokens, (int64_t)n * prompt_len);
    for (int i = 1; i < n; i++)
        cr_assert_eq(r->first_token_us[i], r->first_token_us[0],
                     "request %d's first token came at %lld us, request 0's at %lld: not one step",
                     i, (long long)r->first_token_us[i], (long long)r->first_token_us[0]);
}

/* The clients' burst within the budget (POLICY_FITS): one step prefills all of it and
 * samples every first token, and the steps after it only decode — all of them, one token
 * each, to the end; each client reads all its first tokens before any second one. */
static void burst_within_the_budget(int clients, int per_client)
{
    static burst_result r;
    burst bu = {.clients = clients,
                .per_client = per_client,
                .prompt_len = 24,
                .max_new = 6,
                .check_order = true,
                .policy = POLICY_FITS};
    run_burst(&bu, &r);
    const int n = clients * per_client;
    assert_prefilled_in_one_step("prompts", n, (int)bu.prompt_len, &r);
    cr_assert_eq(r.steps[0].decode_seqs, 0);
    cr_assert_eq(r.n_steps, (int)bu.max_new, "%d steps for %u tokens each", r.n_steps, bu.max_new);
    for (int i = 1; i < r.n_steps; i++)
        cr_assert_eq(r.steps[i].decode_seqs, n, "step %d decoded %lld of %d", i,
                     (long long)r.steps[i].decode_seqs, n);
}

/* One client, eight prompts submitted together (ringlm_submit_batch): one step prefills
 * them, and the client reads all eight first tokens before any second one. */
Test(daemon_burst, one_clients_burst_within_the_budget_is_prefilled_in_one_step)
{
    burst_within_the_budget(1, 8);
}

/* Eight client processes, a prompt each, arriving together: one step prefills the eight and
 * samples each first token (one first_token_us for all), so each first token is published
 * before any of them is decoded further. */
Test(daemon_burst, eight_clients_burst_within_the_budget_is_prefilled_in_one_step)
{
    burst_within_the_budget(8, 1);
}

/* A burst beyond the budget (8 × 40 = 320 prompt tokens, 64 a step): every step until the
 * last prompt's prefill ends uses the whole budget — decode rows of the prompts already done
 * plus prefill chunks of the waiting ones — and the first tokens come within the fewest
 * steps that budget allows. */
Test(daemon_burst, a_burst_over_the_budget_is_spread_over_full_steps)
{
    static burst_result r;
    burst bu = {
        .clients = 4, .per_client = 2, .prompt_len = 40, .max_new = 12, .policy = POLICY_OVER};
    run_burst(&bu, &r);
    const fmt_iteration *st = r.steps;
    const int budget = 64, n = 8;
    int last = -1;
    int64_t prefilled = 0;
    for (int i = 0; i < r.n_steps; i++)
        if (st[i].prefill_tokens > 0) last = i;
    cr_assert_geq(last, 0, "no step prefilled");
    for (int i = 0; i <= last; i++) {
        prefilled += st[i].prefill_tokens;
        if (i < last && st[i].prefill_tokens + st[i].decode_seqs != budget) {
            dump_steps(st, r.n_steps);
            cr_assert_fail("step %d used %lld of the %d-token budget while prompts waited", i,
                           (long long)(st[i].prefill_tokens + st[i].decode_seqs), budget);
        }
    }
    cr_assert_eq(prefilled, (int64_t)n * bu.prompt_len, "%lld prompt tokens prefilled",
                 (long long)prefilled);
    /* 320 prompt tokens; a prompt done decodes one row a step from the next step on, so the
     * budget holds them in 6 steps: 64 + 63 + 61 + 60 + 58 prefill tokens, the sixth the
     * rest */
    cr_assert_leq(last + 1, 6, "the burst's prefill took %d steps", last + 1);
    /* and each prompt's first token comes in the step that ends its prefill, so the steps'
     * first-token stamps are few: at most one per prefill step */
    int distinct = 0;
    for (int i = 0; i < r.n_reqs; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= r.first_token_us[j] == r.first_token_us[i];
        distinct += !seen;
    }
    cr_assert_leq(distinct, last + 1, "%d distinct first-token steps for %d prefill steps",
                  distinct, last + 1);
}

/* ---- through the gateway ------------------------------------------------------------------ */

TestSuite(gateway_burst, .fini = gwh_stop_all, .timeout = 180);

/* n streamed completions sent to the gateway while ringlmd is stopped, each a distinct
 * prompt of prompt_len token ids, max_tokens 4 with ignore_eos; once the gateway has
 * submitted all of them (its requests_in_flight), ringlmd resumes and finds them at once.
 * Every stream must complete; ringlmd's logs then go to *res. */
static void gateway_burst_run(int n, int prompt_len, int sessions, burst_result *res)
{
    gwh_need();
    static char itlog[200], reqlog[200];
    snprintf(itlog, sizeof itlog, "%s/iterations.jsonl", gwh_dir());
    snprintf(reqlog, sizeof reqlog, "%s/requests.jsonl", gwh_dir());
    const char *dextra[] = {"--iteration-log", itlog, "--request-log", reqlog, NULL};
    gwh_start_daemon(dextra);
    char ns[16];
    snprintf(ns, sizeof ns, "%d", sessions);
    const char *gextra[] = {"--sessions", ns, NULL};
    gwh_start_gateway(gextra);
    gwh_wait_healthy(20000);
    uint64_t dl = th_now_ms() + 20000;
    for (;;) { /* /health is 200 once one session is up; the others follow */
        char *m = gwh_gateway_metrics();
        double up = gwh_metric(m, "ringlm_gateway_sessions_connected");
        free(m);
        if (up == sessions) break;
        cr_assert(th_now_ms() < dl, "%g of %d sessions up after 20 s", up, sessions);
        th_pause_ms(10);
    }
    th_suspend(gwh_daemon.pid, 10000);
    int fds[REQS_MAX];
    cr_assert_leq(n, REQS_MAX);
    for (int i = 0; i < n; i++) {
        char body[1024];
        int len = snprintf(body, sizeof body, "{\"prompt\":[1");
        for (int k = 1; k < prompt_len; k++)
            len +=
                snprintf(body + len, sizeof body - (size_t)len, ",%d", 3 + (k * 7 + i * 31) % 400);
        snprintf(body + len, sizeof body - (size_t)len,
                 "],\"max_tokens\":4,\"temperature\":0,\"stream\":true,\"ignore_eos\":true}");
        fds[i] = gwh_connect();
        gwh_send_post(fds[i], "/v1/completions", NULL, body);
    }
    dl = th_now_ms() + 30000;
    for (;;) {
        char *m = gwh_gateway_metrics();
        double in_flight = gwh_metric(m, "ringlm_gateway_requests_in_flight");
        if (in_flight == n) {
            free(m);
            break;
        }
        if (th_now_ms() > dl) {
            th_resume(gwh_daemon.pid);
            cr_assert_fail("%g of %d requests submitted after 30 s:\n%s", in_flight, n, m);
        }
        free(m);
        th_pause_ms(5);
    }
    th_resume(gwh_daemon.pid);
    for (int i = 0; i < n; i++) {
        bool eof;
        char *got = th_read_until(fds[i], "data: [DONE]", 60000, &eof);
        int chunks = 0;
        for (const char *p = got; (p = strstr(p, "\"finish_reason\":")); p++) chunks++;
        cr_assert(!strncmp(got, "HTTP/1.1 200", 12) && strstr(got, "data: [DONE]") &&
                      !strstr(got, "\"error\"") && chunks >= 1,
                  "stream %d did not complete (%d chunks):\n%s", i, chunks, got);
        free(got);
        close(fds[i]);
    }
    cr_assert_eq(th_daemon_stop(&gwh_daemon, SIGTERM, 15000), 0, "ringlmd did not exit 0");
    res->n_steps = read_steps(itlog, res->steps, STEPS_MAX);
    res->n_reqs = read_first_tokens(reqlog, res->first_token_us, REQS_MAX);
    cr_assert_eq(res->n_reqs, n, "%d request-log lines for %d streams", res->n_reqs, n);
}

/* The gateway's burst of n streams over `sessions` sessions, within ringlmd's budget (the
 * test policy: 128 tokens a step): one step prefills every prompt and samples every first
 * token. */
static void gateway_burst_within_the_budget(int n, int prompt_len, int sessions)
{
    static burst_result r;
    gateway_burst_run(n, prompt_len, sessions, &r);
    assert_prefilled_in_one_step("streams", n, prompt_len, &r);
}

Test(gateway_burst, eight_streams_at_once_are_prefilled_in_one_step)
{
    gateway_burst_within_the_budget(8, 12, 1);
}

/* 32 streams over the gateway's default 4 sessions: ringlmd reads every session's ring before
 * it plans the step. */
Test(gateway_burst, thirty_two_streams_over_four_sessions_are_prefilled_in_one_step)
{
    gateway_burst_within_the_budget(32, 4, 4);
}

/* ---- a burst that arrives over time (burst_gather) ----------------------------------------- */

/* One prompt, then — once ringlmd has read it (its published load counts it) — seven more:
 * the daemon was idle, so without burst_gather it started the first prompt's step alone the
 * moment it read it and the seven waited for that step (two prefill steps). With the policy's
 * burst_gather (3 s here, so that this process's own pace on a loaded machine cannot matter)
 * the first step waits for them and prefills the eight together. */
static void burst_over_time(const char *policy, burst_result *res)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    static char itlog[200];
    static dmn d;
    snprintf(itlog, sizeof itlog, "/tmp/ringlmd-burst-it-%d.jsonl", (int)getpid());
    unlink(itlog);
    const char *argv[] = {"--iteration-log", itlog, NULL};
    dmn_start(&d, model, policy, argv);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    static int32_t prompt[8][PROMPT_MAX];
    ringlm_request rq[8];
    uint64_t ids[8];
    for (int i = 0; i < 8; i++) {
        prompt_of(prompt[i], 24, 100 + (uint32_t)i);
        ringlm_request_init(&rq[i]);
        rq[i].prompt = prompt[i];
        rq[i].n_prompt = 24;
        rq[i].max_new_tokens = 4;
        rq[i].ignore_stop = true;
    }
    cr_assert_eq(ringlm_submit(c, &rq[0], &ids[0]), 0);
    /* ringlmd has read it once its published load counts it — or, where its step started at
     * once, once its first event is here */
    uint64_t dl = th_now_ms() + 30000;
    int ended = 0;
    for (;;) {
        ringlm_load ld;
        cr_assert_eq(ringlm_daemon_load(c, &ld), 0);
        if (ld.waiting + ld.running >= 1) break;
        ringlm_event ev;
        int got = ringlm_next_event(c, &ev, 1);
        cr_assert_geq(got, 0, "next_event: %s", ringlm_errdetail());
        if (got == 1) {
            ended += ev.kind == RINGLM_EV_FINISH;
            break;
        }
        cr_assert(th_now_ms() < dl, "ringlmd did not take the first request in 30 s");
    }
    cr_assert_eq(ringlm_submit_batch(c, &rq[1], 7, &ids[1]), 0);
    while (ended < 8) {
        ringlm_event ev;
        cr_assert_eq(ringlm_next_event(c, &ev, 60000), 1, "next_event: %s", ringlm_errdetail());
        if (ev.kind == RINGLM_EV_FINISH) {
            cr_assert_eq(ev.finish_reason, RINGLM_FINISH_LENGTH);
            ended++;
        }
    }
    ringlm_close(c);
    cr_assert_eq(dmn_stop(&d, SIGTERM, 10000), 0, "ringlmd did not exit 0 on SIGTERM");
    res->n_steps = read_steps(itlog, res->steps, STEPS_MAX);
    res->n_reqs = read_first_tokens(d.reqlog, res->first_token_us, BURST_MAX);
    cr_assert_eq(res->n_reqs, 8, "%d request-log lines", res->n_reqs);
    dmn_cleanup(&d);
    unlink(itlog);
}

Test(daemon_burst, prompts_arriving_during_burst_gather_join_the_first_step)
{
    static burst_result r;
    burst_over_time(POLICY_FITS "burst_gather = 3s\n", &r);
    assert_prefilled_in_one_step("prompts", 8, 24, &r);
}

/* ringlmd's built-in policy on the CPU backend takes 512 tokens a step: a CPU spends about a
 * millisecond a prompt token on a 110M model, so the GPU's 4096-token steps held every
 * running stream for seconds. A burst of 16 × 48 = 768 prompt tokens is prefilled in two
 * steps, the first a full 512, neither above it (with the GPU's knobs: one step of 768). */
Test(daemon_burst, the_builtin_policy_takes_512_tokens_a_step_on_the_cpu)
{
    static burst_result r;
    burst bu = {.clients = 4, .per_client = 4, .prompt_len = 48, .max_new = 4, .policy = NULL};
    run_burst(&bu, &r);
    const fmt_iteration *st = r.steps;
    int prefill_steps = 0;
    int64_t prefilled = 0;
    for (int i = 0; i < r.n_steps; i++) {
        if (st[i].prefill_tokens + st[i].decode_seqs > 512) {
            dump_steps(st, r.n_steps);
            cr_assert_fail("step %d took %lld prompt tokens and %lld decode rows: over 512", i,
                           (long long)st[i].prefill_tokens, (long long)st[i].decode_seqs);
        }
        prefill_steps += st[i].prefill_tokens > 0;
        prefilled += st[i].prefill_tokens;
    }
    cr_assert_eq(prefilled, 16 * 48, "%lld prompt tokens prefilled", (long long)prefilled);
    if (st[0].prefill_tokens != 512 || prefill_steps != 2) dump_steps(st, r.n_steps);
    cr_assert_eq(st[0].prefill_tokens, 512, "the first step prefilled %lld of the burst's 768",
                 (long long)st[0].prefill_tokens);
    cr_assert_eq(prefill_steps, 2, "the burst's prefill took %d steps", prefill_steps);
}
