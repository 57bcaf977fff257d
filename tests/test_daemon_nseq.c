/* SPDX-License-Identifier: MIT */
/*
 * tests/test_daemon_nseq.c — n samples of one prompt (ringlm_sampling.n, ringlm.h "n
 * samples") through a real ringlmd: the prompt is computed once (the other samples share
 * its KV blocks), each sample answers exactly as a single request with seed + i, each has
 * its own id, index stream and FINISH; a group whose KV could never fit is refused whole;
 * cancels and a client that dies leave every block accounted for (the scheduler's
 * invariants checked by the stats file); n out of range is refused at submit and by the
 * daemon; preemption with swaps of shared blocks keeps the answers (--verify-swaps); on a
 * model kept in window rings (gemma2) each sample runs on a copy of its leader's ring.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "libclient/ringlm.h"
#include "tests/daemon_helpers.h"
#include "tests/gguf_test_util.h"
#include "tests/helpers.h"
#include "tools/prom.h"

#define NS_MAX  16
#define TOK_MAX 200

typedef struct sample_out {
    int32_t tok[TOK_MAX];
    uint32_t n;
    ringlm_event fin;
    bool done;
} sample_out;

static void prompt_of(int32_t *p, uint32_t n, uint32_t salt)
{
    /* a prompt of ordinary tokens, different per salt */
    for (uint32_t i = 0; i < n; i++) p[i] = (int32_t)(3 + (i * 7 + salt * 13) % 400);
    p[0] = 1; /* BOS */
}

static void req_of(ringlm_request *r, const int32_t *p, uint32_t n_prompt, uint32_t max_new,
                   uint64_t seed)
{
    ringlm_request_init(r);
    r->prompt = p;
    r->n_prompt = n_prompt;
    r->max_new_tokens = max_new;
    r->temperature = 0.9f;
    r->top_p = 0.95f;
    r->seed = seed;
}

/* Reads events until every one of the n samples from id0 has its FINISH: each sample's
 * indices run 0, 1, ... with no gap. cancel_at (> 0): after that many tokens of sample
 * cancel_idx, cancels it. */
static void collect(ringlm_client *c, uint64_t id0, uint32_t n, sample_out *out, int cancel_idx,
                    uint32_t cancel_at)
{
    memset(out, 0, sizeof *out * n);
    uint32_t left = n;
    bool cancelled = false;
    while (left) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 60000);
        cr_assert_gt(rc, 0, "next_event %d: %s", rc, ringlm_errdetail());
        cr_assert(ev.req_id >= id0 && ev.req_id < id0 + n, "event of id %llu outside %llu+%u",
                  (unsigned long long)ev.req_id, (unsigned long long)id0, n);
        sample_out *o = &out[ev.req_id - id0];
        cr_assert(!o->done, "an event after sample %llu's FINISH", (unsigned long long)ev.req_id);
        if (ev.kind == RINGLM_EV_TOKEN) {
            cr_assert_eq(ev.index, o->n, "sample %llu: index %u after %u tokens",
                         (unsigned long long)(ev.req_id - id0), ev.index, o->n);
            if (o->n < TOK_MAX) o->tok[o->n] = ev.token;
            o->n++;
            if (cancel_at && !cancelled && (int)(ev.req_id - id0) == cancel_idx &&
                o->n == cancel_at) {
                cr_assert_eq(ringlm_cancel(c, ev.req_id), 0, "%s", ringlm_errdetail());
                cancelled = true;
            }
        } else if (ev.kind == RINGLM_EV_FINISH) {
            o->fin = ev;
            o->done = true;
            cr_expect_eq(ev.n_tokens, o->n, "sample %llu: FINISH says %u tokens, %u came",
                         (unsigned long long)(ev.req_id - id0), ev.n_tokens, o->n);
            left--;
        }
    }
}

static uint64_t submit_n(ringlm_client *c, const ringlm_request *r, uint32_t n)
{
    ringlm_sampling s;
    ringlm_sampling_init(&s);
    s.n = n;
    uint64_t id = 0;
    cr_assert_eq(ringlm_submit_ext(c, r, &s, &id), 0, "submit n %u: %s", n, ringlm_errdetail());
    return id;
}

/* Submits q alone (n = 1) and reads it to its FINISH. */
static void run_single(ringlm_client *c, const ringlm_request *q, sample_out *out)
{
    uint64_t id;
    cr_assert_eq(ringlm_submit(c, q, &id), 0, "%s", ringlm_errdetail());
    collect(c, id, 1, out, -1, 0);
}

/* Closes the client, waits for the daemon's pools to be back to baseline, stops it. */
static void close_and_stop(ringlm_client *c, dmn *d)
{
    ringlm_close(c);
    assert_back_to_baseline(d, 20000);
    cr_expect_eq(dmn_stop(d, SIGTERM, 20000), 0);
    dmn_cleanup(d);
}

static double metric(dmn *d, const char *series)
{
    int port = dmn_metrics_port(d);
    cr_assert_gt(port, 0, "no metrics port in the daemon's output");
    int status = 0;
    char *body = th_http_get(port, "/metrics", &status, NULL, 0);
    cr_assert_not_null(body);
    cr_assert_eq(status, 200);
    double v = prom_value(body, series);
    free(body);
    return v;
}

/* The request log's lines of requests whose id is in [id0, id0 + n) (daemon ids: the
 * samples of one request are consecutive there too): their summed prompt tokens less the
 * cached ones — the prompt tokens they computed. */
static long long computed_prompt_tokens(const char *reqlog, int *lines)
{
    FILE *f = fopen(reqlog, "r");
    cr_assert_not_null(f, "request log %s", reqlog);
    char line[8192];
    long long sum = 0;
    *lines = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        if (!o) continue;
        long long p = json_integer_value(json_object_get(o, "prompt_tokens"));
        json_t *ct = json_object_get(o, "cached_tokens");
        long long cached = ct ? json_integer_value(ct) : 0;
        sum += p - cached;
        (*lines)++;
        json_decref(o);
    }
    fclose(f);
    return sum;
}

/* Submits r with n samples and reads them all: each ends by length with m tokens, and each
 * after the first found the whole P-token prompt cached (its full blocks through the prefix
 * cache, its partial last block shared copy-on-write). */
static void group_of(ringlm_client *c, const ringlm_request *r, uint32_t n, uint32_t m, uint32_t P,
                     sample_out *group)
{
    uint64_t id0 = submit_n(c, r, n);
    collect(c, id0, n, group, -1, 0);
    for (uint32_t i = 0; i < n; i++) {
        cr_expect_eq(group[i].fin.finish_reason, RINGLM_FINISH_LENGTH, "sample %u: %s", i,
                     ringlm_reason_name(group[i].fin.finish_reason));
        cr_expect_eq(group[i].n, m, "sample %u", i);
        cr_expect_eq(group[i].fin.n_cached_tokens, i ? P : 0u,
                     "sample %u found %u prompt tokens cached", i, group[i].fin.n_cached_tokens);
    }
}

/* n = 8 samples of a P-token prompt compute P prompt tokens (not 8 × P, nor P + 7 × the
 * tokens past its last full block): the engine's rows say so (ringlm_iteration_tokens_total
 * less one row per generated token after each sample's first), the request log says so
 * (prompt less cached, summed), the FINISH events say each further sample found the whole
 * prompt cached (its full blocks through the prefix cache, its partial last block shared
 * copy-on-write), and vllm:prompt_tokens_total counts P. Each sample's tokens equal a single
 * request's with seed + i on a daemon that shares nothing (--no-prefix-cache). */
static void eight_samples_of(uint32_t P)
{
    char model[256];
    model_or_synthetic(model, sizeof model);
    enum { N = 8, M = 24 };
    const uint64_t seed = 4242;
    static int32_t prompt[300];
    cr_assert_leq(P, 300u);
    prompt_of(prompt, P, 1);
    ringlm_request r;
    req_of(&r, prompt, P, M, seed);

    static const char *const flags[] = {"--metrics", "127.0.0.1:0", NULL};
    dmn d;
    dmn_start(&d, model, NULL, flags);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "%s", ringlm_errdetail());
    cr_expect_eq(ringlm_max_samples(c), 16, "the default --max-n");
    double rows0 = metric(&d, "ringlm_iteration_tokens_total"); /* (the warm-up's, if any) */
    static sample_out group[N];
    group_of(c, &r, N, M, P, group);
    /* the samples differ (different seeds), or the test would prove little */
    int differ = 0;
    for (int i = 1; i < N; i++)
        differ += memcmp(group[i].tok, group[0].tok, sizeof(int32_t) * M) != 0;
    cr_expect_gt(differ, 0,
                 "eight samples at temperature 0.9 all gave the same answer: %d %d %d / %d %d %d",
                 group[0].tok[0], group[0].tok[1], group[0].tok[2], group[1].tok[0],
                 group[1].tok[1], group[1].tok[2]);
    ringlm_close(c);
    assert_back_to_baseline(&d, 20000);
    /* /metrics shows the snapshot the loop publishes on its next idle iteration, which may
     * come just after the last FINISH went out: scrape until it counts the prompt (a counter
     * only grows, so a value past P is the failure this checks) */
    double ptt = 0;
    for (uint64_t end = th_now_ms() + 10000;
         (ptt = metric(&d, "vllm:prompt_tokens_total")) < (double)P && th_now_ms() < end;)
        usleep(2000);
    cr_expect_eq(ptt, (double)P, "prefill tokens processed for %d samples of %u tokens: %g", N, P,
                 ptt);
    /* The engine's rows: sample 0's prompt, then one row per token after each sample's first
     * (a further sample's first token comes from sample 0's last prompt row; its own first
     * row is the one a decode step computes) — nothing else. */
    double rows = metric(&d, "ringlm_iteration_tokens_total") - rows0;
    cr_expect_eq(rows, (double)(P + N * (M - 1)),
                 "engine rows %g: the prompt computed %g times over (%u + %d × %d expected)", rows,
                 (rows - N * (M - 1)) / P, P, N, M - 1);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 20000), 0);
    int lines = 0;
    long long computed = computed_prompt_tokens(d.reqlog, &lines);
    cr_expect_eq(lines, N, "request log lines");
    cr_expect_eq(computed, P, "prompt tokens computed by the %d samples (prompt - cached)", N);
    /* a replay (ringlm-sim --trace) learns which lines are samples of which */
    cr_expect_eq(count_lines(d.reqlog, "\"sample_of\""), N - 1, "request log lines with sample_of");
    dmn_cleanup(&d);

    /* The same as single requests, each alone on a daemon that caches nothing. */
    static const char *const nocache[] = {"--no-prefix-cache", NULL};
    dmn one;
    dmn_start(&one, model, NULL, nocache);
    cr_assert_eq(ringlm_connect(one.sock, &c), 0, "%s", ringlm_errdetail());
    for (int i = 0; i < N; i++) {
        ringlm_request q;
        req_of(&q, prompt, P, M, seed + (uint64_t)i);
        sample_out single;
        run_single(c, &q, &single);
        cr_expect_eq(single.n, group[i].n, "sample %d: %u tokens, the single request %u", i,
                     group[i].n, single.n);
        cr_expect_arr_eq(single.tok, group[i].tok, sizeof(int32_t) * M,
                         "sample %d differs from the single request with seed + %d", i, i);
    }
    ringlm_close(c);
    cr_expect_eq(dmn_stop(&one, SIGTERM, 20000), 0);
    dmn_cleanup(&one);
}

/* A prompt of whole blocks (16 × 16): the prefix cache shares every prompt block. */
Test(daemon_nseq, eight_samples_compute_the_prompt_once_and_equal_single_requests, .timeout = 300)
{
    eight_samples_of(256);
}

/* A prompt with a partial last block (16 × 16 + 7): the 7 tokens past the last full block are
 * shared copy-on-write, not computed by each sample again. */
Test(daemon_nseq, a_partial_last_block_is_shared_copy_on_write, .timeout = 300)
{
    eight_samples_of(263);
}

/* A group whose samples could never hold their KV blocks together is refused whole (every
 * sample's FINISH rejected never_fits), though one sample alone fits; a group that fits on
 * the same daemon runs. */
Test(daemon_nseq, a_group_that_cannot_fit_is_refused_whole, .timeout = 120)
{
    char model[256];
    model_or_synthetic(model, sizeof model);
    /* 40 blocks of 16: one sample of 256 + 64 needs 20; eight need 20 + 7 × 4 = 48 */
    static const char *const flags[] = {"--kv-blocks", "40", NULL};
    static int32_t prompt[256];
    prompt_of(prompt, 256, 2);
    dmn d;
    dmn_start(&d, model, NULL, flags);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "%s", ringlm_errdetail());
    ringlm_request r;
    req_of(&r, prompt, 256, 64, 7);
    uint64_t id0 = submit_n(c, &r, 8);
    static sample_out out[8];
    collect(c, id0, 8, out, -1, 0);
    for (int i = 0; i < 8; i++) {
        cr_expect_eq(out[i].fin.finish_reason, RINGLM_FINISH_REJECTED, "sample %d: %s", i,
                     ringlm_reason_name(out[i].fin.finish_reason));
        cr_expect_eq(out[i].fin.reject_reason, RINGLM_R_NEVER_FITS, "sample %d: %s", i,
                     ringlm_reason_name(out[i].fin.reject_reason));
        cr_expect_eq(out[i].n, 0u);
    }
    /* four fit: 20 + 3 × 4 = 32 */
    id0 = submit_n(c, &r, 4);
    collect(c, id0, 4, out, -1, 0);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(out[i].fin.finish_reason, RINGLM_FINISH_LENGTH, "sample %d: %s", i,
                     ringlm_reason_name(out[i].fin.finish_reason));
    close_and_stop(c, &d);
}

/* The decision log's first event of kind ev (and reason, when given) for daemon request req:
 * its t_us, or -1 when there is none. */
static long long first_event(const char *declog, const char *ev, long long req, const char *reason)
{
    FILE *f = fopen(declog, "r");
    cr_assert_not_null(f, "decision log %s", declog);
    char line[4096];
    long long t = -1;
    while (t < 0 && fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        if (!o) continue;
        const char *e = json_string_value(json_object_get(o, "ev"));
        const char *why = json_string_value(json_object_get(o, "reason"));
        if (e && !strcmp(e, ev) && json_integer_value(json_object_get(o, "req")) == req &&
            (!reason || (why && !strcmp(why, reason))))
            t = json_integer_value(json_object_get(o, "t_us"));
        json_decref(o);
    }
    fclose(f);
    return t;
}

/* The daemon id of the k-th request the decision log admitted (0-based), or -1. */
static long long admitted_id(const char *declog, int k)
{
    FILE *f = fopen(declog, "r");
    cr_assert_not_null(f, "decision log %s", declog);
    char line[4096];
    long long id = -1;
    while (id < 0 && fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        if (!o) continue;
        const char *e = json_string_value(json_object_get(o, "ev"));
        if (e && !strcmp(e, "admit") && k-- == 0)
            id = json_integer_value(json_object_get(o, "req"));
        json_decref(o);
    }
    fclose(f);
    return id;
}

/* All or nothing with a reservation: a pool of 32 blocks of 16, a request B of 300 + 100
 * tokens holding 19 to 25 of them; then 8 samples of a 100-token prompt, whose first sample
 * alone (7 blocks) would fit beside B but whose group needs 7 + 7 × 1 blocks to start: the
 * group waits, together, until B finishes, then every sample starts from blocks kept for it —
 * none waits for blocks once the group is admitted — and all answer in full. */
Test(daemon_nseq, a_group_waits_together_until_its_blocks_are_free_together, .timeout = 120)
{
    char model[256];
    model_or_synthetic(model, sizeof model);
    static const char *const flags[] = {"--kv-blocks", "32", NULL};
    static int32_t pb[300], pg[100];
    prompt_of(pb, 300, 21);
    prompt_of(pg, 100, 22);
    dmn d;
    dmn_start(&d, model, NULL, flags);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "%s", ringlm_errdetail());
    ringlm_request b;
    req_of(&b, pb, 300, 100, 1);
    b.ignore_stop = true;
    uint64_t idb;
    cr_assert_eq(ringlm_submit(c, &b, &idb), 0, "%s", ringlm_errdetail());
    /* B runs: its first token is out */
    ringlm_event ev;
    cr_assert_gt(ringlm_next_event(c, &ev, 60000), 0, "%s", ringlm_errdetail());
    cr_assert_eq(ev.kind, RINGLM_EV_TOKEN);
    cr_assert_eq(ev.req_id, idb);
    uint32_t b_tokens = 1;
    ringlm_request g;
    req_of(&g, pg, 100, 40, 9);
    g.ignore_stop = true;
    uint64_t id0 = submit_n(c, &g, 8);
    static sample_out out[8];
    memset(out, 0, sizeof out);
    uint32_t left = 9;
    while (left) {
        cr_assert_gt(ringlm_next_event(c, &ev, 60000), 0, "%s", ringlm_errdetail());
        if (ev.req_id == idb) {
            if (ev.kind == RINGLM_EV_TOKEN) b_tokens++;
            if (ev.kind == RINGLM_EV_FINISH) {
                cr_expect_eq(ev.finish_reason, RINGLM_FINISH_LENGTH, "B: %s",
                             ringlm_reason_name(ev.finish_reason));
                left--;
            }
            continue;
        }
        cr_assert(ev.req_id >= id0 && ev.req_id < id0 + 8);
        sample_out *o = &out[ev.req_id - id0];
        if (ev.kind == RINGLM_EV_TOKEN) o->n++;
        if (ev.kind == RINGLM_EV_FINISH) {
            o->fin = ev;
            left--;
        }
    }
    cr_expect_eq(b_tokens, 100u);
    for (int i = 0; i < 8; i++) {
        cr_expect_eq(out[i].fin.finish_reason, RINGLM_FINISH_LENGTH, "sample %d: %s", i,
                     ringlm_reason_name(out[i].fin.finish_reason));
        cr_expect_eq(out[i].n, 40u, "sample %d", i);
    }
    ringlm_close(c);
    assert_back_to_baseline(&d, 20000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 20000), 0);
    long long B = admitted_id(d.declog, 0), L = admitted_id(d.declog, 1);
    cr_assert_geq(B, 0, "B's admit");
    cr_assert_geq(L, 0, "the group's admit");
    long long b_end = first_event(d.declog, "release", B, NULL);
    long long l_start = first_event(d.declog, "schedule", L, NULL);
    cr_assert_geq(b_end, 0, "B's release");
    cr_assert_geq(l_start, 0, "the first sample's schedule");
    cr_expect_geq(l_start, b_end,
                  "the first sample started at %lld us, before B released its blocks at %lld us: "
                  "its group's blocks were not free together",
                  l_start, b_end);
    cr_expect_geq(first_event(d.declog, "defer", L, "blocks"), 0,
                  "the group never waited for blocks: the test did not test what it says");
    for (long long k = L + 1; k < L + 8; k++) {
        cr_expect_geq(first_event(d.declog, "schedule", k, NULL), 0, "sample %lld never started",
                      k - L);
        cr_expect_lt(first_event(d.declog, "defer", k, "blocks"), 0,
                     "sample %lld of an admitted group waited for blocks", k - L);
    }
    dmn_cleanup(&d);
}

/* Each sample is cancelled on its own id: the cancelled one ends cancelled, the others run
 * to their length; sample 0 (whose prompt the others shared) cancelled after the fork ends
 * only itself. Every block is back after. */
Test(daemon_nseq, a_cancel_ends_one_sample, .timeout = 120)
{
    char model[256];
    model_or_synthetic(model, sizeof model);
    dmn d;
    dmn_start(&d, model, NULL, (const char *const[]){DMN_BELOW_CLIENTS, NULL});
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "%s", ringlm_errdetail());
    static int32_t prompt[40];
    prompt_of(prompt, 40, 3);
    ringlm_request r;
    req_of(&r, prompt, 40, 150, 11);
    r.ignore_stop = true;
    for (int victim = 0; victim < 4; victim += 2) {
        uint64_t id0 = submit_n(c, &r, 4);
        static sample_out out[4];
        collect(c, id0, 4, out, victim, 3);
        for (int i = 0; i < 4; i++) {
            if (i == victim) {
                cr_expect_eq(out[i].fin.finish_reason, RINGLM_FINISH_CANCELLED, "victim %d: %s", i,
                             ringlm_reason_name(out[i].fin.finish_reason));
                cr_expect_lt(out[i].n, 150u);
            } else {
                cr_expect_eq(out[i].fin.finish_reason, RINGLM_FINISH_LENGTH, "sample %d: %s", i,
                             ringlm_reason_name(out[i].fin.finish_reason));
                cr_expect_eq(out[i].n, 150u);
            }
        }
    }
    close_and_stop(c, &d);
}

typedef struct die_job {
    const char *sock;
    int ready_fd;
} die_job;

/* Submits 8 samples of a long answer, reads a few tokens, says so and dies. */
static int client_dies(void *arg)
{
    die_job *j = arg;
    ringlm_client *c;
    if (ringlm_connect(j->sock, &c)) return 10;
    static int32_t prompt[100];
    prompt_of(prompt, 100, 4);
    ringlm_request r;
    req_of(&r, prompt, 100, 400, 5);
    r.ignore_stop = true;
    ringlm_sampling s;
    ringlm_sampling_init(&s);
    s.n = 8;
    uint64_t id;
    if (ringlm_submit_ext(c, &r, &s, &id)) return 11;
    int got = 0;
    while (got < 16) {
        ringlm_event ev;
        if (ringlm_next_event(c, &ev, 60000) <= 0) return 12;
        if (ev.kind == RINGLM_EV_TOKEN) got++;
    }
    char b = 1;
    if (write(j->ready_fd, &b, 1) != 1) return 13;
    _exit(0); /* mid-way: no close, no cancel */
}

/* A client that dies while its 8 samples decode: every sample is cancelled and every KV
 * block (shared ones included) comes back, the scheduler's invariants holding throughout. */
Test(daemon_nseq, a_client_that_dies_mid_way_frees_every_block, .timeout = 120)
{
    char model[256];
    model_or_synthetic(model, sizeof model);
    dmn d;
    dmn_start(&d, model, NULL, (const char *const[]){DMN_BELOW_CLIENTS, NULL});
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    die_job j = {.sock = d.sock, .ready_fd = pfd[1]};
    pid_t p = spawn(client_dies, &j);
    close(pfd[1]);
    char b = 0;
    cr_assert_eq(read(pfd[0], &b, 1), 1, "the client never saw its tokens");
    close(pfd[0]);
    cr_expect_eq(reap(p, 30000), 0);
    assert_back_to_baseline(&d, 30000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 20000), 0);
    int lines = 0;
    (void)computed_prompt_tokens(d.reqlog, &lines);
    cr_expect_eq(lines, 8, "a request log line per sample");
    cr_expect_eq(count_lines(d.reqlog, "\"cancelled\""), 8, "every sample cancelled");
    dmn_cleanup(&d);
}

/* Reads the n samples from id0 to their FINISH, keeping the prompt log-probabilities
 * (RINGLM_EV_PROMPT_TOKEN: the logprob of prompt token index) in plp[index] and which ids
 * they came with. */
static void collect_plp(ringlm_client *c, uint64_t id0, uint32_t n, sample_out *out, float *plp,
                        uint32_t *n_plp, uint32_t *plp_other)
{
    memset(out, 0, sizeof *out * n);
    *n_plp = *plp_other = 0;
    for (uint32_t left = n; left;) {
        ringlm_event ev;
        cr_assert_gt(ringlm_next_event(c, &ev, 60000), 0, "%s", ringlm_errdetail());
        cr_assert(ev.req_id >= id0 && ev.req_id < id0 + n);
        sample_out *o = &out[ev.req_id - id0];
        if (ev.kind == RINGLM_EV_PROMPT_TOKEN) {
            ringlm_logprobs lp;
            cr_assert_eq(ringlm_event_logprobs(c, &lp), 1, "a prompt token without its logprob");
            if (ev.req_id != id0) (*plp_other)++;
            cr_assert_lt(ev.index, 64u);
            plp[ev.index] = lp.logprob;
            (*n_plp)++;
            cr_expect_eq(o->n, 0u, "a prompt token after a generated one");
        } else if (ev.kind == RINGLM_EV_TOKEN) {
            if (o->n < TOK_MAX) o->tok[o->n] = ev.token;
            o->n++;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            o->fin = ev;
            left--;
        }
    }
}

/* n samples with prompt log-probabilities: computed once, by the first sample, and given
 * once (its id's RINGLM_EV_PROMPT_TOKEN events, the same values as a single request's);
 * every sample answers as a single request with seed + i. */
Test(daemon_nseq, prompt_logprobs_are_computed_once_for_all_samples, .timeout = 120)
{
    char model[256];
    model_or_synthetic(model, sizeof model);
    enum { N = 3, P = 40, M = 6 };
    static int32_t prompt[P];
    prompt_of(prompt, P, 31);
    dmn d;
    dmn_start(&d, model, NULL, NULL);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "%s", ringlm_errdetail());
    ringlm_request r;
    req_of(&r, prompt, P, M, 600);
    r.ignore_stop = true;
    ringlm_sampling s;
    ringlm_sampling_init(&s);
    s.flags = RINGLM_SAMPLING_PROMPT_LOGPROBS;
    s.prompt_logprobs = 2;
    s.n = N;
    uint64_t id0 = 0;
    cr_assert_eq(ringlm_submit_ext(c, &r, &s, &id0), 0, "%s", ringlm_errdetail());
    static sample_out group[N], one[1];
    float plp[64], plp1[64];
    uint32_t n_plp, other;
    collect_plp(c, id0, N, group, plp, &n_plp, &other);
    cr_expect_eq(n_plp, (uint32_t)P - 1, "prompt log-probabilities given %u times for %d tokens",
                 n_plp, P - 1);
    cr_expect_eq(other, 0u, "%u prompt log-probabilities came with a further sample's id", other);
    /* a single request's, the same values */
    s.n = 1;
    uint64_t id1 = 0;
    cr_assert_eq(ringlm_submit_ext(c, &r, &s, &id1), 0, "%s", ringlm_errdetail());
    uint32_t n1, other1;
    collect_plp(c, id1, 1, one, plp1, &n1, &other1);
    cr_assert_eq(n1, (uint32_t)P - 1);
    for (uint32_t i = 1; i < P; i++)
        cr_expect_float_eq(plp[i], plp1[i], 1e-5, "prompt token %u: %g, a single request's %g", i,
                           plp[i], plp1[i]);
    /* each sample as a single request with seed + i */
    for (int i = 0; i < N; i++) {
        cr_expect_eq(group[i].fin.finish_reason, RINGLM_FINISH_LENGTH, "sample %d", i);
        ringlm_request q;
        req_of(&q, prompt, P, M, 600 + (uint64_t)i);
        q.ignore_stop = true;
        sample_out single;
        run_single(c, &q, &single);
        cr_expect_eq(single.n, group[i].n);
        cr_expect_arr_eq(single.tok, group[i].tok, sizeof(int32_t) * M,
                         "sample %d differs from the single request with seed + %d", i, i);
    }
    close_and_stop(c, &d);
}

/* n past the daemon's maximum is -EINVAL at submit, naming n; n 0 and 1 are one sample; a
 * smaller --max-n is what the library learns and enforces; n > 1 with max_new_tokens 0 is
 * -EINVAL (n with a constraint: tests/test_daemon_nseq_constrain.c). */
Test(daemon_nseq, n_out_of_range_is_refused, .timeout = 120)
{
    char model[256];
    model_or_synthetic(model, sizeof model);
    static const char *const flags[] = {"--max-n", "4", NULL};
    dmn d;
    dmn_start(&d, model, NULL, flags);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "%s", ringlm_errdetail());
    cr_expect_eq(ringlm_max_samples(c), 4);
    static int32_t prompt[8];
    prompt_of(prompt, 8, 5);
    ringlm_request r;
    req_of(&r, prompt, 8, 4, 1);
    ringlm_sampling s;
    ringlm_sampling_init(&s);
    uint64_t id = 0;
    s.n = 5;
    cr_expect_eq(ringlm_submit_ext(c, &r, &s, &id), -EINVAL);
    cr_expect(!strncmp(ringlm_errdetail(), "n 5", 3), "detail: %s", ringlm_errdetail());
    s.n = RINGLM_WIRE_MAX_N + 1;
    const char *field = NULL;
    cr_expect_eq(ringlm_request_check_ext(&r, &s, 0, &field), -EINVAL);
    cr_expect_str_eq(field ? field : "(null)", "n");
    s.n = 2;
    r.max_new_tokens = 0;
    s.flags = 0;
    cr_expect_eq(ringlm_request_check_ext(&r, &s, 0, &field), -EINVAL, "%s", ringlm_errdetail());
    r.max_new_tokens = 4;
    /* 0 and 1 are one sample: one FINISH; the next id follows at once */
    for (uint32_t n = 0; n < 2; n++) {
        ringlm_sampling_init(&s);
        s.n = n;
        cr_assert_eq(ringlm_submit_ext(c, &r, &s, &id), 0, "%s", ringlm_errdetail());
        sample_out o;
        collect(c, id, 1, &o, -1, 0);
        cr_expect_eq(o.fin.finish_reason, RINGLM_FINISH_LENGTH);
    }
    /* 4 samples: ids id .. id + 3, and the next request's id is id + 4 */
    uint64_t id4 = submit_n(c, &r, 4);
    cr_expect_eq(id4, id + 1);
    static sample_out out[4];
    collect(c, id4, 4, out, -1, 0);
    uint64_t after = 0;
    cr_assert_eq(ringlm_submit(c, &r, &after), 0);
    cr_expect_eq(after, id4 + 4);
    collect(c, after, 1, out, -1, 0);
    close_and_stop(c, &d);
}

/* Three groups of four samples on one daemon; their tokens into out (by group, sample). */
static void run_groups(const char *model, const char *const *flags, sample_out out[3][4],
                       int *preemptions)
{
    dmn d;
    dmn_start(&d, model, NULL, flags);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "%s", ringlm_errdetail());
    static int32_t prompt[3][100];
    uint64_t ids[3];
    for (int g = 0; g < 3; g++) {
        ringlm_request r;
        prompt_of(prompt[g], 100, 10 + (uint32_t)g);
        req_of(&r, prompt[g], 100, 180, 3 + 100 * (uint64_t)g);
        r.ignore_stop = true;
        ids[g] = submit_n(c, &r, 4);
    }
    /* the groups' events interleave: read them all, in whatever order they come */
    memset(out, 0, sizeof(sample_out) * 12);
    uint32_t left = 12;
    while (left) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 60000);
        cr_assert_gt(rc, 0, "next_event %d: %s", rc, ringlm_errdetail());
        int g = ev.req_id >= ids[2] ? 2 : ev.req_id >= ids[1] ? 1 : 0;
        uint64_t i = ev.req_id - ids[g];
        cr_assert_lt(i, 4u);
        sample_out *o = &out[g][i];
        if (ev.kind == RINGLM_EV_TOKEN) {
            cr_assert_eq(ev.index, o->n);
            if (o->n < TOK_MAX) o->tok[o->n] = ev.token;
            o->n++;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            o->fin = ev;
            left--;
        }
    }
    ringlm_close(c);
    assert_back_to_baseline(&d, 30000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 20000), 0);
    *preemptions = count_lines(d.declog, "\"preempt\"");
    dmn_cleanup(&d);
}

/* Groups that overflow a small device pool: samples are preempted and swapped to the host
 * tier (their shared prompt blocks with them) and come back; every block is checksummed at
 * swap-out and compared at swap-in (--verify-swaps), the scheduler's invariants hold, and
 * every sample answers as on a daemon with room for all. */
Test(daemon_nseq, preemption_and_swaps_keep_shared_blocks_right, .timeout = 300)
{
    char model[256];
    model_or_synthetic(model, sizeof model);
    static sample_out roomy[3][4], tight[3][4];
    int pre_roomy = 0, pre_tight = 0;
    run_groups(model, NULL, roomy, &pre_roomy);
    /* 12 sequences of up to 280 tokens (18 blocks, 6 of them the shared prompt's): 54 blocks
     * a group, 162 in all, on 64 */
    static const char *const flags[] = {"--kv-blocks",    "64", "--host-kv-blocks", "256",
                                        "--verify-swaps", NULL};
    run_groups(model, flags, tight, &pre_tight);
    cr_expect_eq(pre_roomy, 0);
    cr_expect_gt(pre_tight, 0, "no preemption: the test did not test what it says");
    for (int g = 0; g < 3; g++)
        for (int i = 0; i < 4; i++) {
            cr_expect_eq(tight[g][i].fin.finish_reason, RINGLM_FINISH_LENGTH,
                         "group %d sample %d: %s", g, i,
                         ringlm_reason_name(tight[g][i].fin.finish_reason));
            cr_expect_eq(tight[g][i].n, 180u);
            cr_expect_arr_eq(tight[g][i].tok, roomy[g][i].tok, sizeof(int32_t) * 180,
                             "group %d sample %d differs after preemption", g, i);
        }
    cr_log_info("preemptions %d", pre_tight);
}

/* ---- window rings ----------------------------------------------------------------------
 *
 * A model with windowed and global layers kept in window rings (gemma2, ringlmd --kv-rings):
 * the samples share the prompt's global blocks (cached, the partial last block copy-on-write)
 * and each runs on a ring of its own, copied from its leader's at the fork. A prompt longer
 * than a ring (it wrapped) makes the copy carry positions the sample's first windows read.
 * n = 4 samples (seeded at temperature 0.9, or greedy) against four single requests with
 * seed + i on the same daemon: equal token for token; each further sample found the whole
 * prompt cached, and each single request its full blocks before its last token, through the
 * ring snapshot the leader's prompt left there (sched_config.window_snapshots). */
static void four_samples_on_rings(uint32_t P, float temperature)
{
    need_daemon_binary();
    char model[512];
    snprintf(model, sizeof model, "%s/g2.gguf", tmpdir);
    /* synthetic stories260K (5 layers: 1 and 3 global, context 512), window 32 */
    export_gguf_window("synthetic:stories260K:7", NULL, "F32", "gemma2", 0, 32, model);
    enum { N = 4, M = 48 }; /* M past the window: the copied positions leave it */
    const uint64_t seed = 777;
    static int32_t prompt[256];
    prompt_of(prompt, P, 3);
    /* prefill chunks of 16: rings of (32 + 16) / 16 + 1 = 4 blocks, 64 positions */
    static const char *const policy =
        "[scheduler]\nmode = token_budget\ntoken_budget = 64\nmax_active_seqs = 8\n"
        "prefill_chunk = 16\n";
    static const char *const flags[] = {"--kv-blocks", "64", "--kv-block-size", "16", NULL};
    dmn d;
    dmn_start(&d, model, policy, flags);
    const char *log = th_daemon_output(&d.th);
    cr_assert(strstr(log, "windowed layers (3 of 5, window 32)") &&
                  strstr(log, "rings of 4 blocks"),
              "rings of 64 positions: %s", log);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "%s", ringlm_errdetail());
    ringlm_request r;
    req_of(&r, prompt, P, M, seed);
    r.temperature = temperature;
    r.ignore_stop = true;
    static sample_out group[N];
    group_of(c, &r, N, M, P, group); /* the further samples share the global blocks */
    int differ = 0;
    for (int i = 1; i < N; i++) differ += memcmp(group[i].tok, group[0].tok, sizeof(int32_t) * M);
    cr_expect(temperature == 0 ? !differ : differ, "the samples %s",
              temperature == 0 ? "differ at temperature 0" : "all gave the same answer");
    for (int i = 0; i < N; i++) {
        ringlm_request q = r;
        q.seed = seed + (uint64_t)i;
        sample_out one;
        run_single(c, &q, &one);
        cr_expect_eq(one.fin.n_cached_tokens, (P - 1) / 16 * 16,
                     "single request %d found %u tokens cached", i, one.fin.n_cached_tokens);
        cr_assert_arr_eq(one.tok, group[i].tok, sizeof(int32_t) * M,
                         "sample %d on rings differs from the single request with seed + %d", i, i);
    }
    close_and_stop(c, &d);
}

/* 100 tokens: past a ring's 64 positions, and a partial last block (4 of 16). */
Test(daemon_nseq, seeded_samples_on_window_rings_equal_single_requests, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 300)
{
    four_samples_on_rings(100, 0.9f);
}

/* 96 tokens: whole blocks only (the cache shares every prompt block), greedy. */
Test(daemon_nseq, greedy_samples_on_window_rings_equal_single_requests, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 300)
{
    four_samples_on_rings(96, 0);
}
