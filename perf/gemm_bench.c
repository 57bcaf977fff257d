/* SPDX-License-Identifier: MIT */
/*
 * gemm_bench — the CPU backend's small-batch matmul (kernels/cpu/gemm_small.h) against
 * OpenBLAS on the projections of a model shape, one thread, the weight split into 4
 * chunks as the engine's two workers split it: ms per product for M batch rows, the
 * median of --repeats, with OpenBLAS SGEMM (SGEMV at M = 1, as the engine called it) timed
 * in the same repeat. The ratio column says where the small kernel stops winning: the
 * engine's switch to SGEMM (gemm_small_max_rows) is chosen from it.
 *
 *   gemm_bench [--shape stories110M|stories15M] [--repeats R] [--rows 1,2,4,...]
 *              [--path auto|avx512|avx2|portable]
 *              [--type F16|BF16|Q8_0|Q4_K|Q6_K|Q4_0|Q4_1]
 *              [--clock cpu] [--json] [--prefill [--cls]]
 *
 * --type F16 or BF16: the weights in that type instead, q_matmul (kernels/cpu/quant.h: float
 * tiles converted once, then gemm_small or SGEMM) against the fused dots it replaced for
 * small batches (q_dot for every weight row and activation row, the conversion redone per
 * activation row), in the same repeat. --clock cpu times the thread's CPU time instead of
 * wall time (figures from a machine busy with others).
 *
 * --prefill: the prefill products instead (rows 64,256,1024 unless --rows; the classifier
 * left out, prefill computes logits for one row): kernels/cpu/gemm_f32.h's own AVX2 tiles
 * against what the engine ran before them, in the same repeat — SGEMM on F32 weights,
 * q_matmul's converted float tiles and SGEMM on F16/BF16 — with each side's GFLOP/s and the
 * path the engine now takes for the shape (gemm_f32_prefer). --type Q8_0, Q4_K, Q6_K, Q4_0
 * or Q4_1 (with --prefill only): gemm_f32 on panels dequantized once per block of k, against
 * q_matmul (above Q_INT_MAX_ROWS without AVX-512 VNNI: float tiles dequantized and SGEMM; up
 * to it, the integer dots of the decode batches), and for Q4_K, Q6_K, Q4_0 and Q4_1 the
 * integer tiles of quant_prefill.h at every M (--rows 4,8,16,32 too: where they would beat
 * the dots). --prefill --type BF16: the AVX-512 BF16 tiles of gemm_bf16.h in that column
 * ("bf16 ms"), with gemm_f32's float panels (own) over them: the previous path over the new;
 * F32 and F16 with RINGLM_PREFILL_GEMM=bf16 (their weights rounded to bf16 too: opt-in).
 * --cls adds the classifier (N = 32000) to the --prefill shapes: a prefill computes it for one
 * row, but a batch of more than gemm_small's decode rows takes it through the same path.
 */
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/gemm_small.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_prefill.h"
#include "perf/bench_util.h"

#include <cblas.h>
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

#define CHUNKS 4

static const char *path_name(gemm_small_path p)
{
    return p == GEMM_SMALL_AVX512 ? "avx512" : p == GEMM_SMALL_AVX2 ? "avx2" : "portable";
}

typedef struct shape {
    const char *name;
    int n, k; /* weight rows, row length */
} shape;

static gemm_small_path path = GEMM_SMALL_AUTO;
static int wtype = Q_F32; /* --type */

static const char *type_name(void)
{
    return wtype == Q_F16    ? "F16"
           : wtype == Q_BF16 ? "BF16"
           : wtype == Q_Q8_0 ? "Q8_0"
           : wtype == Q_Q4_K ? "Q4_K"
           : wtype == Q_Q6_K ? "Q6_K"
           : wtype == Q_Q4_0 ? "Q4_0"
           : wtype == Q_Q4_1 ? "Q4_1"
                             : "F32";
}

/* Bytes of `elems` weights in the --type (whole rows: a multiple of the block). */
static size_t type_bytes(size_t elems)
{
    return wtype == Q_F32 ? elems * sizeof(float) : q_row_bytes(wtype, (int64_t)elems);
}
static int prefill; /* --prefill */

/* --type: q_matmul on the weights in their type, split as run_small splits them */
static void run_typed(int M, const shape *s, const float *x, const void *w, float *y)
{
    int chunk = (s->n + CHUNKS - 1) / CHUNKS;
    size_t rb = q_row_bytes(wtype, s->k);
    for (int n0 = 0; n0 < s->n; n0 += chunk) {
        int n = s->n - n0 < chunk ? s->n - n0 : chunk;
        q_matmul(wtype, (const char *)w + (size_t)n0 * rb, n, s->k, x, M, 0.0f, y + n0, s->n);
    }
}

/* --type: the fused dots, one per weight row and activation row */
static void run_dots(int M, const shape *s, const float *x, const void *w, float *y)
{
    size_t rb = q_row_bytes(wtype, s->k);
    for (int i = 0; i < s->n; i++)
        for (int r = 0; r < M; r++)
            y[(size_t)r * s->n + i] =
                q_dot(wtype, (const char *)w + (size_t)i * rb, x + (size_t)r * s->k, s->k);
}

/* --prefill: gemm_f32 on the weights in their type, split as the engine splits them */
static void run_own(int M, const shape *s, const float *x, const void *w, float *y)
{
    int chunk = (s->n + CHUNKS - 1) / CHUNKS;
    size_t rb = q_row_bytes(wtype, s->k);
    for (int n0 = 0; n0 < s->n; n0 += chunk) {
        int n = s->n - n0 < chunk ? s->n - n0 : chunk;
        if (!gemm_f32(wtype, M, n, s->k, x, s->k, (const char *)w + (size_t)n0 * rb, rb, 0.0f,
                      y + n0, s->n)) {
            fprintf(stderr, "gemm_bench: gemm_f32 does not run on this machine\n");
            exit(1);
        }
    }
}

/* --prefill --type Q4_K: the integer tiles (quant_prefill.h), the rows quantized once per
 * product as the engine quantizes them once per matmul; false where they do not run */
static void *xq_mem;
static size_t xq_cap;
static bool run_int(int M, const shape *s, const float *x, const void *w, float *y)
{
    const size_t need = q_xq_bytes(M, s->k);
    if (xq_cap < need) {
        free(xq_mem);
        xq_mem = malloc(need);
        xq_cap = xq_mem ? need : 0;
    }
    const q_xq *a = xq_mem ? q_xq_prepare(xq_mem, xq_cap, x, M, s->k) : NULL;
    if (!a) return false;
    int chunk = (s->n + CHUNKS - 1) / CHUNKS;
    size_t rb = q_row_bytes(wtype, s->k);
    for (int n0 = 0; n0 < s->n; n0 += chunk) {
        int n = s->n - n0 < chunk ? s->n - n0 : chunk;
        if (!q_prefill_matmul(wtype, (const char *)w + (size_t)n0 * rb, n, s->k, a, 0.0f, y + n0,
                              s->n))
            return false;
    }
    return true;
}

/* --prefill --type BF16: the AVX-512 BF16 tiles (gemm_bf16.h), split as the engine splits
 * them; false where they do not run */
static bool run_bf16(int M, const shape *s, const float *x, const void *w, float *y)
{
    int chunk = (s->n + CHUNKS - 1) / CHUNKS;
    size_t rb = q_row_bytes(wtype, s->k);
    for (int n0 = 0; n0 < s->n; n0 += chunk) {
        int n = s->n - n0 < chunk ? s->n - n0 : chunk;
        if (!gemm_bf16(wtype, M, n, s->k, x, s->k, (const char *)w + (size_t)n0 * rb, rb, 0.0f,
                       y + n0, s->n))
            return false;
    }
    return true;
}

static void run_small(int M, const shape *s, const float *x, const float *w, float *y)
{
    int chunk = (s->n + CHUNKS - 1) / CHUNKS;
    for (int n0 = 0; n0 < s->n; n0 += chunk) {
        int n = s->n - n0 < chunk ? s->n - n0 : chunk;
        gemm_small(path, M, n, s->k, x, s->k, w + (size_t)n0 * s->k, s->k, 0.0f, y + n0, s->n);
    }
}

static void run_blas(int M, const shape *s, const float *x, const float *w, float *y)
{
    int chunk = (s->n + CHUNKS - 1) / CHUNKS;
    for (int n0 = 0; n0 < s->n; n0 += chunk) {
        int n = s->n - n0 < chunk ? s->n - n0 : chunk;
        if (M == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, n, s->k, 1.0f, w + (size_t)n0 * s->k, s->k, x,
                        1, 0.0f, y + n0, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, n, s->k, 1.0f, x, s->k,
                        w + (size_t)n0 * s->k, s->k, 0.0f, y + n0, s->n);
    }
}

/* --prefill: gemm_f32 against the engine's previous path, in the same repeat */
static int run_prefill(const char *shape_name, const shape *shapes, int n_shapes, const int *rows,
                       int n_rows, int repeats, int json, const float *x, const float *w,
                       const char *wq, size_t w_elems, float *y)
{
    const char *ta = type_name();
    /* the BF16 tiles: for BF16 weights, and for F32 and F16 with RINGLM_PREFILL_GEMM=bf16 */
    const bool bf16 = gemm_bf16_supported() && (wtype == Q_BF16 || gemm_bf16_prefer(wtype));
    const void *wbase = wq ? (const void *)wq : (const void *)w;
    if (json)
        printf("{\"shape\":\"%s\",\"type\":\"%s\",\"threads\":1,\"repeats\":%d,\"chunks\":%d,"
               "\"prefill\":true,\"results\":[",
               shape_name, ta, repeats, CHUNKS);
    else
        printf("gemm_bench --prefill %s %s, 1 thread, %d chunks per product, medians of %d\n"
               "%-5s %5s %9s %9s %8s %8s %8s %9s %8s  %s\n",
               shape_name, ta, CHUNKS, repeats, "proj", "M", "own ms", "old ms", "old/own",
               "own GF/s", "old GF/s", bf16 ? "bf16 ms" : "int ms", bf16 ? "own/bf16" : "old/int",
               "engine takes");
    int first = 1;
    for (int si = 0; si < n_shapes; si++) {
        const shape *s = &shapes[si];
        const size_t wsz = (size_t)s->n * s->k;
        const size_t n_copies = w_elems / wsz;
        for (int ri = 0; ri < n_rows; ri++) {
            const int M = rows[ri];
            const double flop = 2.0 * M * s->n * s->k;
            /* about 0.1 s per timing at 30 GFLOP/s, at least two products */
            int iters = (int)(3e9 / flop) + 2;
            double ts[64], tb[64], ti[64];
            int R = repeats < 64 ? repeats : 64;
            /* the tiles at every M where they run above the dots' rows (the engine takes
             * them only there) */
            const bool int_runs = (wq && q_prefill_runs(wtype, Q_INT_MAX_ROWS + 1)) || bf16;
            for (int r = 0; r < R; r++) {
                double t0 = now_s();
                ti[r] = 0.0;
                for (int i = 0; i < iters && int_runs; i++)
                    if (!(bf16 ? run_bf16 : run_int)(
                            M, s, x, (const char *)wbase + type_bytes((size_t)i % n_copies * wsz),
                            y)) {
                        fprintf(stderr, "gemm_bench: the tiles declined\n");
                        exit(1);
                    }
                if (int_runs) ti[r] = (now_s() - t0) / iters;
                t0 = now_s();
                for (int i = 0; i < iters; i++)
                    run_own(M, s, x, (const char *)wbase + type_bytes((size_t)i % n_copies * wsz),
                            y);
                ts[r] = (now_s() - t0) / iters;
                t0 = now_s();
                for (int i = 0; i < iters; i++)
                    if (wq)
                        run_typed(M, s, x, wq + type_bytes((size_t)i % n_copies * wsz), y);
                    else
                        run_blas(M, s, x, w + (size_t)i % n_copies * wsz, y);
                tb[r] = (now_s() - t0) / iters;
            }
            const double mo = bench_median(ts, R), mb = bench_median(tb, R),
                         mi = bench_median(ti, R);
            const char *takes =
                bf16 && M > gemm_small_max_rows(GEMM_SMALL_AUTO) && gemm_bf16_prefer(wtype) ? "bf16"
                : wq && q_prefill_runs(wtype, M)                                            ? "int"
                : wq && q_int_path(wtype, M)                                                ? "dots"
                : gemm_f32_prefer(wtype, M, s->n, s->k)                                     ? "own"
                                                                                            : "old";
            if (json)
                printf("%s{\"proj\":\"%s\",\"n\":%d,\"k\":%d,\"m\":%d,\"own_ms\":%.4f,"
                       "\"old_ms\":%.4f,\"int_ms\":%.4f,\"engine_takes\":\"%s\"}",
                       first ? "" : ",", s->name, s->n, s->k, M, mo * 1e3, mb * 1e3, mi * 1e3,
                       takes);
            else
                printf("%-5s %5d %9.3f %9.3f %8.2f %8.1f %8.1f %9.3f %8.2f  %s\n", s->name, M,
                       mo * 1e3, mb * 1e3, mb / mo, flop / mo * 1e-9, flop / mb * 1e-9, mi * 1e3,
                       !int_runs ? 0.0
                       : bf16    ? mo / mi
                                 : mb / mi,
                       takes);
            first = 0;
        }
    }
    if (json) printf("]}\n");
    return 0;
}

int main(int argc, char **argv)
{
    const char *shape_name = "stories110M", *rows_arg = "1,2,4,8,12,16,20,24,32,48,64";
    int repeats = 5, json = 0, with_cls = 0;
    static const struct option opts[] = {
        {"shape", required_argument, 0, 's'}, {"repeats", required_argument, 0, 'r'},
        {"rows", required_argument, 0, 'm'},  {"json", no_argument, 0, 'j'},
        {"path", required_argument, 0, 'P'},  {"type", required_argument, 0, 'T'},
        {"clock", required_argument, 0, 'c'}, {"prefill", no_argument, 0, 'p'},
        {"cls", no_argument, 0, 'C'},         {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "s:r:m:jP:T:c:pC", opts, NULL)) != -1) {
        switch (ch) {
        case 's': shape_name = optarg; break;
        case 'r': repeats = atoi(optarg); break;
        case 'm': rows_arg = optarg; break;
        case 'j': json = 1; break;
        case 'C': with_cls = 1; break;
        case 'P':
            path = strcmp(optarg, "avx512") == 0     ? GEMM_SMALL_AVX512
                   : strcmp(optarg, "avx2") == 0     ? GEMM_SMALL_AVX2
                   : strcmp(optarg, "portable") == 0 ? GEMM_SMALL_PORTABLE
                                                     : GEMM_SMALL_AUTO;
            break;
        case 'T':
            wtype = strcmp(optarg, "F16") == 0    ? Q_F16
                    : strcmp(optarg, "BF16") == 0 ? Q_BF16
                    : strcmp(optarg, "Q8_0") == 0 ? Q_Q8_0
                    : strcmp(optarg, "Q4_K") == 0 ? Q_Q4_K
                    : strcmp(optarg, "Q6_K") == 0 ? Q_Q6_K
                    : strcmp(optarg, "Q4_0") == 0 ? Q_Q4_0
                    : strcmp(optarg, "Q4_1") == 0 ? Q_Q4_1
                                                  : -1;
            if (wtype < 0) {
                fprintf(stderr, "gemm_bench: --type F16, BF16, Q8_0, Q4_K, Q6_K, Q4_0 or Q4_1\n");
                return 2;
            }
            break;
        case 'p':
            prefill = 1;
            if (strcmp(rows_arg, "1,2,4,8,12,16,20,24,32,48,64") == 0) rows_arg = "64,256,1024";
            break;
        case 'c':
            bench_clock = strcmp(optarg, "cpu") == 0 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
            break;
        default:
            fprintf(stderr, "usage: gemm_bench [--shape stories110M|stories15M] [--repeats R] "
                            "[--rows 1,2,4,...] [--path auto|avx512|avx2|portable] "
                            "[--type F16|BF16|Q8_0|Q4_K|Q6_K|Q4_0|Q4_1] [--clock cpu] [--json] "
                            "[--prefill [--cls]]\n");
            return 2;
        }
    }
    int dim, hidden;
    if (strcmp(shape_name, "stories110M") == 0)
        dim = 768, hidden = 2048;
    else if (strcmp(shape_name, "stories15M") == 0)
        dim = 288, hidden = 768;
    else {
        fprintf(stderr, "gemm_bench: unknown shape %s (stories110M, stories15M)\n", shape_name);
        return 2;
    }
    if (repeats < 1) {
        fprintf(stderr, "gemm_bench: --repeats must be >= 1\n");
        return 2;
    }
    int rows[64], n_rows = 0, max_m = 1;
    for (char *p = (char *)rows_arg; *p && n_rows < 64;) {
        int m = (int)strtol(p, &p, 10);
        if (m < 1 || m > 1024) {
            fprintf(stderr, "gemm_bench: --rows: 1..1024 each\n");
            return 2;
        }
        rows[n_rows++] = m;
        max_m = m > max_m ? m : max_m;
        if (*p == ',') p++;
    }
    /* one layer's projections, the classifier apart (a different regime: N = 32000) */
    const shape shapes[] = {
        {"wq", dim, dim}, {"w1", hidden, dim}, {"w2", dim, hidden}, {"wcls", 32000, dim}};
    const int n_shapes = 4;
    openblas_set_num_threads(1);
    size_t max_w = 0, max_k = 0, max_n = 0;
    for (int i = 0; i < n_shapes; i++) {
        size_t wsz = (size_t)shapes[i].n * shapes[i].k;
        max_w = wsz > max_w ? wsz : max_w;
        max_k = (size_t)shapes[i].k > max_k ? (size_t)shapes[i].k : max_k;
        max_n = (size_t)shapes[i].n > max_n ? (size_t)shapes[i].n : max_n;
    }
    /* Copies of the weight, 128 MB in all, cycled, so each product reads it from memory as
     * the engine does (a model's weights do not fit in cache), not from the last call's. */
    const size_t copies = (128u << 20) / (max_w * sizeof(float)) + 2;
    float *w = malloc(max_w * copies * sizeof(float));
    float *x = malloc(max_k * (size_t)max_m * sizeof(float));
    float *y = malloc(max_n * (size_t)max_m * sizeof(float));
    if (!w || !x || !y) {
        fprintf(stderr, "gemm_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < max_w * copies; i++)
        w[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < max_k * (size_t)max_m; i++)
        x[i] = (float)((i * 40503u) % 1000) * 1e-3f - 0.5f;
    /* --type: the copies in that type (2 bytes an element), each copy's rows as a matrix */
    char *wq = NULL;
    if (wtype != Q_F32) {
        wq = malloc(max_w * copies * 2);
        if (!wq) {
            fprintf(stderr, "gemm_bench: out of memory\n");
            return 1;
        }
        q_quantize_row(wtype, w, wq, (int64_t)(max_w * copies));
    }
    const char *ta = type_name();
    if (wtype != Q_F16 && wtype != Q_BF16 && wtype != Q_F32 && !prefill) {
        fprintf(stderr, "gemm_bench: --type %s only with --prefill\n", ta);
        return 2;
    }

    if (prefill)
        return run_prefill(shape_name, shapes, with_cls ? 4 : 3, rows, n_rows, repeats, json, x, w,
                           wq, max_w * copies, y);
    if (json)
        printf("{\"shape\":\"%s\",\"type\":\"%s\",\"threads\":1,\"repeats\":%d,\"chunks\":%d,"
               "\"path\":\"%s\",\"results\":[",
               shape_name, ta, repeats, CHUNKS,
               path_name(path == GEMM_SMALL_AUTO ? gemm_small_auto_path() : path));
    else
        printf("gemm_bench %s %s, 1 thread, %d chunks per product, medians of %d (small path: "
               "%s)\n%-5s %4s %10s %10s %8s\n",
               shape_name, ta, CHUNKS, repeats,
               path_name(path == GEMM_SMALL_AUTO ? gemm_small_auto_path() : path), "proj", "M",
               wtype == Q_F32 ? "small ms" : "matmul ms", wtype == Q_F32 ? "blas ms" : "dots ms",
               wtype == Q_F32 ? "blas/small" : "dots/matmul");
    int first = 1;
    for (int si = 0; si < n_shapes; si++) {
        const shape *s = &shapes[si];
        const size_t wsz = (size_t)s->n * s->k;
        for (int ri = 0; ri < n_rows; ri++) {
            const int M = rows[ri];
            /* about 200 MB of weight reads per timing, at least two products */
            int iters = (int)(200e6 / (wsz * 4.0)) + 2;
            double ts[64], tb[64];
            int R = repeats < 64 ? repeats : 64;
            for (int r = 0; r < R; r++) {
                double t0 = now_s();
                for (int i = 0; i < iters; i++)
                    if (wq)
                        run_typed(M, s, x, wq + (size_t)i % (max_w * copies / wsz) * wsz * 2, y);
                    else
                        run_small(M, s, x, w + (size_t)i % (max_w * copies / wsz) * wsz, y);
                ts[r] = (now_s() - t0) / iters;
                t0 = now_s();
                for (int i = 0; i < iters; i++)
                    if (wq)
                        run_dots(M, s, x, wq + (size_t)i % (max_w * copies / wsz) * wsz * 2, y);
                    else
                        run_blas(M, s, x, w + (size_t)i % (max_w * copies / wsz) * wsz, y);
                tb[r] = (now_s() - t0) / iters;
            }
            double ms = bench_median(ts, R) * 1e3, mb = bench_median(tb, R) * 1e3;
            if (json)
                printf("%s{\"proj\":\"%s\",\"n\":%d,\"k\":%d,\"m\":%d,\"small_ms\":%.4f,"
                       "\"blas_ms\":%.4f}",
                       first ? "" : ",", s->name, s->n, s->k, M, ms, mb);
            else
                printf("%-5s %4d %10.4f %10.4f %8.2f\n", s->name, M, ms, mb, mb / ms);
            first = 0;
        }
    }
    if (json) printf("]}\n");
    free(w);
    free(wq);
    free(x);
    free(y);
    return 0;
}
