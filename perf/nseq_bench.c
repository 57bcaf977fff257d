/* SPDX-License-Identifier: MIT */
/*
 * nseq_bench — n samples of one prompt (ringlm_sampling.n) against n separate requests of
 * the same prompt, on one real ringlmd, side by side.
 *
 * Each round takes a fresh prompt (--prompt tokens; no two rounds share a prefix) and runs it
 * twice, in alternating order (ABBA over rounds, so the machine's drift falls on both):
 *   group     one request with n = --n (seed S: sample i draws as seed S + i)
 *   separate  --n single requests with seeds S .. S + n - 1, submitted together (one batch;
 *             the daemon's prefix cache may share their prompt blocks once the first ones
 *             computed them: that is what separate requests get today)
 * and measures the wall time from submit to the last FINISH, the tokens generated and the
 * prompt tokens the engine computed (the daemon's ringlm_iteration_tokens_total less the
 * decode rows, read from /metrics before and after). Prints one JSON line: the medians of
 * each side and their ratios (group / separate).
 *
 *   nseq_bench [--model SPEC] [--n N] [--prompt P] [--max-new M] [--rounds R]
 *              [--threads T] [--ringlmd PATH]
 */
#include "ringlm.h"

#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf/bench_util.h"

#define MAX_N 64

typedef struct side {
    double wall_s, tok, prefill;
} side;

/* The prompt tokens the engine computed so far: every row it ran (iteration tokens) less the
 * decode rows (one per generated token after a request's first). */
static double engine_rows(int port)
{
    char *m = bench_http_get(port, "/metrics");
    double rows = bench_metric(m, "ringlm_iteration_tokens_total");
    free(m);
    return rows;
}

/* Runs one side: the group (n samples in one request) or n separate requests. */
static side run_side(ringlm_client *c, int port, const int32_t *prompt, uint32_t P, uint32_t M,
                     uint32_t n, uint64_t seed, bool group)
{
    ringlm_request r[MAX_N];
    ringlm_sampling smp;
    ringlm_sampling_init(&smp);
    for (uint32_t i = 0; i < n; i++) {
        ringlm_request_init(&r[i]);
        r[i].prompt = prompt;
        r[i].n_prompt = P;
        r[i].max_new_tokens = M;
        r[i].temperature = 0.8f;
        r[i].top_p = 0.95f;
        r[i].ignore_stop = true; /* every answer M tokens: equal work on both sides */
        r[i].seed = seed + i;
    }
    double rows0 = engine_rows(port);
    uint64_t ids[MAX_N], t0 = bench_now_ns();
    int rc;
    if (group) {
        smp.n = n;
        rc = ringlm_submit_ext(c, &r[0], &smp, &ids[0]);
    } else {
        rc = ringlm_submit_batch(c, r, n, ids);
    }
    if (rc) bench_die("submit: %s", ringlm_errdetail());
    uint64_t first = ids[0];
    uint32_t left = n;
    double tok = 0;
    while (left) {
        ringlm_event ev;
        if (ringlm_next_event(c, &ev, 120000) <= 0) bench_die("events: %s", ringlm_errdetail());
        if (ev.req_id < first || ev.req_id >= first + n) continue;
        if (ev.kind == RINGLM_EV_TOKEN) tok++;
        if (ev.kind == RINGLM_EV_FINISH) {
            if (ev.finish_reason != RINGLM_FINISH_LENGTH)
                bench_die("request %llu ended %s", (unsigned long long)ev.req_id,
                          ringlm_reason_name(ev.finish_reason));
            left--;
        }
    }
    side s = {.wall_s = (double)(bench_now_ns() - t0) * 1e-9, .tok = tok};
    /* the metrics are written between iterations: wait until the last one is counted */
    double rows = 0;
    for (int k = 0; k < 200; k++) {
        rows = engine_rows(port) - rows0;
        if (rows >= tok) break;
        usleep(5000);
    }
    /* rows = prompt rows computed + one decode row per token after each request's first */
    s.prefill = rows - (tok - n);
    return s;
}

int main(int argc, char **argv)
{
    bench_prog = "nseq_bench";
    const char *model = "synthetic:stories15M:1", *ringlmd = "build/bin/ringlmd";
    uint32_t n = 8, P = 256, M = 64, rounds = 5, threads = 1;
    static const struct option lo[] = {{"model", 1, 0, 'm'},   {"n", 1, 0, 'n'},
                                       {"prompt", 1, 0, 'p'},  {"max-new", 1, 0, 'M'},
                                       {"rounds", 1, 0, 'r'},  {"threads", 1, 0, 't'},
                                       {"ringlmd", 1, 0, 'd'}, {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case 'm': model = optarg; break;
        case 'n': n = (uint32_t)atoi(optarg); break;
        case 'p': P = (uint32_t)atoi(optarg); break;
        case 'M': M = (uint32_t)atoi(optarg); break;
        case 'r': rounds = (uint32_t)atoi(optarg); break;
        case 't': threads = (uint32_t)atoi(optarg); break;
        case 'd': ringlmd = optarg; break;
        default:
            fprintf(stderr, "usage: nseq_bench [--model SPEC] [--n N] [--prompt P] [--max-new M] "
                            "[--rounds R] [--threads T] [--ringlmd PATH]\n");
            return 2;
        }
    }
    if (n < 2 || n > MAX_N || P < 2 || M < 1 || rounds < 1 || rounds > 64)
        bench_die("--n 2..%d, --prompt >= 2, --max-new >= 1, --rounds 1..64", MAX_N);
    const char *dir = bench_mkdtemp("nseq");
    char sock[200], log[200], thr[16], maxn[16];
    snprintf(sock, sizeof sock, "%s/s.sock", dir);
    snprintf(log, sizeof log, "%s/ringlmd.log", dir);
    snprintf(thr, sizeof thr, "%u", threads);
    snprintf(maxn, sizeof maxn, "%u", n);
    char *argv_d[] = {(char *)ringlmd,
                      "--model",
                      (char *)model,
                      "--socket",
                      sock,
                      "--threads",
                      thr,
                      "--metrics",
                      "127.0.0.1:0",
                      "--max-n",
                      maxn,
                      "--numa-node",
                      "off",
                      NULL};
    pid_t pid = bench_spawn(argv_d, log);
    int port = bench_port_from_log(log, "metrics on port ", pid);
    bench_wait_path(sock);
    ringlm_client *c = NULL;
    for (int k = 0; k < 3000 && ringlm_connect(sock, &c); k++) usleep(10000);
    if (!c) bench_die("connect %s: %s", sock, ringlm_errdetail());
    int vocab = ringlm_vocab_size(c);
    if (vocab < 16) bench_die("vocabulary %d", vocab);

    double g_wall[64], s_wall[64], g_tps[64], s_tps[64], g_pre[64], s_pre[64], wall_r[64];
    int32_t *prompt = malloc(sizeof(int32_t) * P);
    if (!prompt) bench_die("out of memory");
    for (uint32_t k = 0; k < rounds; k++) {
        for (uint32_t i = 0; i < P; i++)
            prompt[i] =
                (int32_t)(3 + (i * 131u + k * 7919u + (i * i) % 97u) % (uint32_t)(vocab - 3));
        prompt[0] = 1;
        side g, s;
        /* ABBA: the separate side first in odd rounds (its prompt is then new to the cache
         * too: the group's run computes a different one) */
        if (k % 2 == 0) {
            g = run_side(c, port, prompt, P, M, n, 1000 * k, true);
            prompt[1] ^= 1; /* the other side's prompt shares no block with this one */
            s = run_side(c, port, prompt, P, M, n, 1000 * k, false);
        } else {
            s = run_side(c, port, prompt, P, M, n, 1000 * k, false);
            prompt[1] ^= 1;
            g = run_side(c, port, prompt, P, M, n, 1000 * k, true);
        }
        g_wall[k] = g.wall_s;
        s_wall[k] = s.wall_s;
        g_tps[k] = g.tok / g.wall_s;
        s_tps[k] = s.tok / s.wall_s;
        g_pre[k] = g.prefill;
        s_pre[k] = s.prefill;
        wall_r[k] = s.wall_s / g.wall_s;
    }
    ringlm_close(c);
    json_t *out = json_pack(
        "{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:{s:f, s:f, s:f}, s:{s:f, s:f, s:f}, s:{s:f, s:f, "
        "s:f}}",
        "bench", "nseq", "model", model, "n", (int)n, "prompt", (int)P, "max_new", (int)M, "rounds",
        (int)rounds, "threads", (int)threads, "group", "wall_s_p50",
        bench_median(g_wall, (int)rounds), "tok_per_s_p50", bench_median(g_tps, (int)rounds),
        "prefill_tokens_p50", bench_median(g_pre, (int)rounds), "separate", "wall_s_p50",
        bench_median(s_wall, (int)rounds), "tok_per_s_p50", bench_median(s_tps, (int)rounds),
        "prefill_tokens_p50", bench_median(s_pre, (int)rounds), "ratio", "speedup_p50",
        bench_median(wall_r, (int)rounds), "tok_per_s",
        bench_median(s_tps, (int)rounds) > 0
            ? bench_median(g_tps, (int)rounds) / bench_median(s_tps, (int)rounds)
            : 0.0,
        "prefill_tokens",
        bench_median(s_pre, (int)rounds) > 0
            ? bench_median(g_pre, (int)rounds) / bench_median(s_pre, (int)rounds)
            : 0.0);
    bench_json_print(out);
    free(prompt);
    bench_cleanup();
    return 0;
}
