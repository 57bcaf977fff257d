/* SPDX-License-Identifier: MIT */
/*
 * attn_bench — the CPU backend's paged attention (kernels/cpu/attention.c) alone: one
 * layer's attention of one sequence's prefill of N positions (all N rows in one batch, as a
 * one-shot prompt; or with --chunk C its last C rows after N - C cached positions), on the
 * engine's worker pool, K/V random behind a scattered block table (perf/attn_case.h). Per
 * N, in the same repeats and taking turns: the prefill path (the rows in tiles of
 * TILE_ROWS, as the engine sends them) and, as the baseline, the per-row path decode rows
 * take (every row a tile of its own); each the median time of a call over --repeats with the
 * lowest and highest, the FLOP rate of the multiply-adds attention needs (q·k and p·v over
 * the visible positions), and the ratio of the medians.
 *
 *   attn_bench [--positions 256,1024,2048] [--chunk C] [--heads 12] [--kv-heads 12]
 *              [--head-size 64] [--block-size 16] [--window W] [--softcap S]
 *              [--threads 2] [--repeats 9] [--clock cpu] [--bf16] [--json]
 *
 * The defaults are stories110M's attention (12 heads of 64) with the daemon's blocks of 16.
 * --clock cpu times the process's CPU time (every worker's, spinning included) instead of
 * wall time: a figure that moves less when others share the cores. --bf16 times a third
 * side in the same repeats, where the CPU has AVX-512 BF16: the rows as prompt rows, in
 * tiles, through the engine's BF16 prompt path (kernels/cpu/attention_bf16.c), with the
 * ratio of the float tiles' median to its own.
 */
#include "perf/attn_case.h"
#include "perf/bench_util.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1 << 20) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

/* One side's repeats: median, lowest, highest (sorts t). */
typedef struct side {
    double med, lo, hi;
} side;

static side summarize(double *t, int n)
{
    side r = {.med = bench_median(t, n)};
    r.lo = t[0];
    r.hi = t[n - 1];
    return r;
}

int main(int argc, char **argv)
{
    int positions[16] = {256, 1024, 2048}, n_positions = 3;
    int chunk = 0, repeats = 9, json = 0;
    attn_case ac = {.head_size = 64,
                    .n_heads = 12,
                    .n_kv_heads = 12,
                    .block_size = 16,
                    .threads = 2,
                    .n_seqs = 1,
                    .seed = 7};
    static const struct option opts[] = {{"positions", required_argument, 0, 'n'},
                                         {"chunk", required_argument, 0, 'C'},
                                         {"heads", required_argument, 0, 'H'},
                                         {"kv-heads", required_argument, 0, 'K'},
                                         {"head-size", required_argument, 0, 'd'},
                                         {"block-size", required_argument, 0, 'b'},
                                         {"window", required_argument, 0, 'w'},
                                         {"softcap", required_argument, 0, 's'},
                                         {"threads", required_argument, 0, 't'},
                                         {"repeats", required_argument, 0, 'r'},
                                         {"clock", required_argument, 0, 'c'},
                                         {"json", no_argument, 0, 'j'},
                                         {"bf16", no_argument, 0, 'B'},
                                         {0, 0, 0, 0}};
    int ch;
    bench_prog = "attn_bench";
    while ((ch = getopt_long(argc, argv, "n:C:H:K:d:b:w:s:t:r:c:jB", opts, NULL)) != -1) {
        switch (ch) {
        case 'n':
            n_positions = parse_list(optarg, positions, 16);
            if (n_positions < 1) bench_die("--positions: a list of counts, e.g. 256,1024");
            break;
        case 'C': chunk = atoi(optarg); break;
        case 'H': ac.n_heads = atoi(optarg); break;
        case 'K': ac.n_kv_heads = atoi(optarg); break;
        case 'd': ac.head_size = atoi(optarg); break;
        case 'b': ac.block_size = atoi(optarg); break;
        case 'w': ac.window = atoi(optarg); break;
        case 's': ac.softcap = (float)atof(optarg); break;
        case 't': ac.threads = atoi(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        case 'c':
            if (strcmp(optarg, "cpu") && strcmp(optarg, "wall")) bench_die("--clock cpu|wall");
            bench_clock = strcmp(optarg, "cpu") == 0 ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC;
            break;
        case 'j': json = 1; break;
        case 'B': ac.attn_bf16 = 1; break;
        default:
            fprintf(stderr, "usage: attn_bench [--positions 256,1024,2048] [--chunk C] "
                            "[--heads H] [--kv-heads K] [--head-size D] [--block-size B] "
                            "[--window W] [--softcap S] [--threads T] [--repeats R] "
                            "[--clock cpu|wall] [--bf16] [--json]\n");
            return 2;
        }
    }
    if (ac.n_heads < 1 || ac.n_kv_heads < 1 || ac.n_heads % ac.n_kv_heads || ac.head_size < 1 ||
        ac.block_size < 1 || ac.threads < 1 || repeats < 1 || repeats > 99 || chunk < 0 ||
        ac.window < 0)
        bench_die("bad arguments: heads a multiple of kv-heads, sizes and counts positive, "
                  "repeats 1-99");

    json_t *out = json_object(), *rows_j = json_array();
    json_object_set_new(out, "heads", json_integer(ac.n_heads));
    json_object_set_new(out, "kv_heads", json_integer(ac.n_kv_heads));
    json_object_set_new(out, "head_size", json_integer(ac.head_size));
    json_object_set_new(out, "block_size", json_integer(ac.block_size));
    json_object_set_new(out, "threads", json_integer(ac.threads));
    json_object_set_new(out, "window", json_integer(ac.window));
    json_object_set_new(out, "softcap", json_real(ac.softcap));
    json_object_set_new(out, "clock", json_string(bench_clock == CLOCK_MONOTONIC ? "wall" : "cpu"));
    if (!json)
        printf("attention alone: %d heads (%d KV) of %d, blocks of %d, %d thread(s)%s%s, %s "
               "clock; ms a call, median of %d [lowest, highest]\n"
               "positions  rows   prefill (tiles)                       per-row (baseline)"
               "                    per-row/tiles\n",
               ac.n_heads, ac.n_kv_heads, ac.head_size, ac.block_size, ac.threads,
               ac.window ? ", windowed" : "", ac.softcap > 0 ? ", soft-capped" : "",
               bench_clock == CLOCK_MONOTONIC ? "wall" : "process CPU", repeats);
    for (int pi = 0; pi < n_positions; pi++) {
        const int n = positions[pi], rows = chunk > 0 && chunk < n ? chunk : n;
        ac.ctx[0] = n - rows;
        ac.rows[0] = rows;
        attn_run r;
        if (attn_run_init(&r, &ac)) bench_die("%d positions: out of memory", n);
        const int bf16 = r.c.attn_bf16;
        double tt[99], tp[99], tb[99];
        for (int i = -1; i < repeats; i++) { /* i = -1 warms both: pages touched, workers up */
            attn_run_tiles(&r, TILE_ROWS);
            r.c.att_prompt_rows = 0;
            double t0 = now_s();
            cpu_attention(&r.c);
            double t1 = now_s();
            attn_run_tiles(&r, 1);
            cpu_attention(&r.c);
            double t2 = now_s(), t3 = t2;
            if (bf16) {
                attn_run_tiles(&r, TILE_ROWS);
                r.c.att_prompt_rows = r.n_rows;
                t2 = now_s();
                cpu_attention(&r.c);
                t3 = now_s();
            }
            if (i >= 0) {
                tt[i] = t1 - t0;
                tp[i] = t2 - t1;
                tb[i] = t3 - t2;
            }
        }
        const double gflop = attn_run_flops(&r) * 1e-9;
        side a = summarize(tt, repeats), p = summarize(tp, repeats), q = summarize(tb, repeats);
        if (json) {
            json_t *o = json_object();
            json_object_set_new(o, "positions", json_integer(n));
            json_object_set_new(o, "rows", json_integer(rows));
            json_object_set_new(o, "gflop", json_real(gflop));
            json_object_set_new(o, "tiles_ms", json_real(a.med * 1e3));
            json_object_set_new(o, "tiles_ms_lo", json_real(a.lo * 1e3));
            json_object_set_new(o, "tiles_ms_hi", json_real(a.hi * 1e3));
            json_object_set_new(o, "per_row_ms", json_real(p.med * 1e3));
            json_object_set_new(o, "per_row_ms_lo", json_real(p.lo * 1e3));
            json_object_set_new(o, "per_row_ms_hi", json_real(p.hi * 1e3));
            json_object_set_new(o, "tiles_gflops", json_real(gflop / a.med));
            json_object_set_new(o, "per_row_gflops", json_real(gflop / p.med));
            if (bf16) {
                json_object_set_new(o, "bf16_ms", json_real(q.med * 1e3));
                json_object_set_new(o, "bf16_ms_lo", json_real(q.lo * 1e3));
                json_object_set_new(o, "bf16_ms_hi", json_real(q.hi * 1e3));
                json_object_set_new(o, "bf16_gflops", json_real(gflop / q.med));
            }
            json_array_append_new(rows_j, o);
        } else {
            printf("%9d %5d  %9.3f [%.3f, %.3f] %6.2f GFLOP/s  %9.3f [%.3f, %.3f] %6.2f GFLOP/s"
                   "  %.2fx\n",
                   n, rows, a.med * 1e3, a.lo * 1e3, a.hi * 1e3, gflop / a.med, p.med * 1e3,
                   p.lo * 1e3, p.hi * 1e3, gflop / p.med, p.med / a.med);
            if (bf16)
                printf("%9s %5s  prompt rows in BF16: %.3f [%.3f, %.3f] %6.2f GFLOP/s, "
                       "tiles/BF16 %.2fx\n",
                       "", "", q.med * 1e3, q.lo * 1e3, q.hi * 1e3, gflop / q.med, a.med / q.med);
            fflush(stdout);
        }
        attn_run_free(&r);
    }
    json_object_set_new(out, "runs", rows_j);
    if (json)
        bench_json_print(out);
    else
        json_decref(out);
    return 0;
}
