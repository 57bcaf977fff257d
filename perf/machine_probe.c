/* SPDX-License-Identifier: MIT */
/*
 * machine_probe — what this machine can do, measured now, for the benchmarks that compare
 * against it (perf/llama_compare.sh prints it beside each run): the memory read bandwidth
 * (--threads threads each summing its share of a buffer far larger than the caches), the
 * float32 multiply-add peak (independent FMA chains in registers, AVX2 where the CPU has
 * it), and OpenBLAS SGEMM's rate on a square product (--threads threads) and on one
 * prefill projection (256 x 768 x 768, one thread, as the engine's workers call it), with
 * the core OpenBLAS runs for this CPU (corrected as ringlmd corrects it: RINGLM_BLAS_CORE=keep
 * measures OpenBLAS's own choice) and the CPU's features. Each figure is the median of
 * --repeats, with the lowest and highest.
 *
 *   machine_probe [--threads N] [--repeats R] [--mib M] [--json]
 */
#include "kernels/cpu/blas_core.h"
#include "perf/bench_util.h"

#include <cblas.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

char *openblas_get_corename(void);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef float v8f __attribute__((vector_size(32)));

/* ---- read bandwidth ---------------------------------------------------------------- */

typedef struct rd_arg {
    const v8f *p;
    size_t n; /* vectors */
    pthread_barrier_t *start;
    float sum;
} rd_arg;

static void *rd_main(void *argp)
{
    rd_arg *a = argp;
    pthread_barrier_wait(a->start);
    v8f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    size_t i = 0;
    for (; i + 4 <= a->n; i += 4) {
        s0 += a->p[i];
        s1 += a->p[i + 1];
        s2 += a->p[i + 2];
        s3 += a->p[i + 3];
    }
    v8f s = (s0 + s1) + (s2 + s3);
    float t = 0;
    for (int j = 0; j < 8; j++) t += s[j];
    a->sum = t;
    return NULL;
}

/* GB/s reading `bytes` of buf with `threads` threads (each its contiguous share). */
static double read_gbs(const v8f *buf, size_t bytes, int threads)
{
    pthread_t th[64];
    rd_arg args[64];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    size_t nv = bytes / sizeof(v8f), per = nv / (size_t)threads;
    for (int t = 0; t < threads; t++) {
        args[t] = (rd_arg){.p = buf + (size_t)t * per, .n = per, .start = &start};
        pthread_create(&th[t], NULL, rd_main, &args[t]);
    }
    pthread_barrier_wait(&start);
    double t0 = now_s();
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    double dt = now_s() - t0;
    pthread_barrier_destroy(&start);
    volatile float sink = 0;
    for (int t = 0; t < threads; t++) sink += args[t].sum;
    (void)sink;
    return (double)per * threads * sizeof(v8f) / dt / 1e9;
}

/* ---- float32 multiply-add peak --------------------------------------------------- */

#define FMA_CHAINS 10
#define FMA_ITERS  (20 * 1000 * 1000)

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static float fma_loop_avx2(float seed)
{
    v8f acc[FMA_CHAINS];
    const v8f m = {0.999999f, 0.999999f, 0.999999f, 0.999999f,
                   0.999999f, 0.999999f, 0.999999f, 0.999999f};
    const v8f a = {1e-7f, 1e-7f, 1e-7f, 1e-7f, 1e-7f, 1e-7f, 1e-7f, 1e-7f};
    for (int c = 0; c < FMA_CHAINS; c++) acc[c] = (v8f){0} + seed + (float)c;
    for (int i = 0; i < FMA_ITERS; i++) {
#pragma GCC unroll 10
        for (int c = 0; c < FMA_CHAINS; c++) {
            /* one vfmadd per chain: the asm keeps GCC from folding the loop */
            __asm__("vfmadd132ps %2, %1, %0" : "+x"(acc[c]) : "x"(a), "x"(m));
        }
    }
    float t = 0;
    for (int c = 0; c < FMA_CHAINS; c++)
        for (int j = 0; j < 8; j++) t += acc[c][j];
    return t;
}
#endif

typedef struct fma_arg {
    pthread_barrier_t *start;
    float out;
} fma_arg;

static void *fma_main(void *argp)
{
    fma_arg *a = argp;
    pthread_barrier_wait(a->start);
#if defined(__x86_64__)
    a->out = fma_loop_avx2(1.0f);
#endif
    return NULL;
}

/* GFLOP/s of `threads` threads each running FMA_CHAINS independent 8-lane FMA chains. */
static double fma_gflops(int threads)
{
    pthread_t th[64];
    fma_arg args[64];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        args[t] = (fma_arg){.start = &start};
        pthread_create(&th[t], NULL, fma_main, &args[t]);
    }
    pthread_barrier_wait(&start);
    double t0 = now_s();
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    double dt = now_s() - t0;
    pthread_barrier_destroy(&start);
    return 2.0 * 8 * FMA_CHAINS * (double)FMA_ITERS * threads / dt / 1e9;
}

/* ---- SGEMM ------------------------------------------------------------------------- */

static double sgemm_gflops(int M, int N, int K, int threads, float *a, float *b, float *c)
{
    openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
    int iters = (int)(4e9 / (2.0 * M * N * K)) + 1;
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
    return 2.0 * M * N * K * iters / (now_s() - t0) / 1e9;
}

typedef struct stat3 {
    double median, lowest, highest;
} stat3;

static stat3 stats(double *v, int n)
{
    stat3 s = {bench_median(v, n), v[0], v[0]};
    for (int i = 1; i < n; i++) {
        s.lowest = v[i] < s.lowest ? v[i] : s.lowest;
        s.highest = v[i] > s.highest ? v[i] : s.highest;
    }
    return s;
}

int main(int argc, char **argv)
{
    blas_core_fix(argv); /* OpenBLAS's kernels as ringlmd runs them (kernels/cpu/blas_core.h) */
    int threads = 2, repeats = 5, json = 0, mib = 1024;
    static const struct option opts[] = {{"threads", required_argument, 0, 't'},
                                         {"repeats", required_argument, 0, 'r'},
                                         {"mib", required_argument, 0, 'm'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "t:r:m:j", opts, NULL)) != -1) {
        switch (ch) {
        case 't': threads = atoi(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        case 'm': mib = atoi(optarg); break;
        case 'j': json = 1; break;
        default:
            fprintf(stderr,
                    "usage: machine_probe [--threads N] [--repeats R] [--mib M] [--json]\n");
            return 2;
        }
    }
    if (threads < 1 || threads > 64 || repeats < 1 || repeats > 64 || mib < 64) {
        fprintf(stderr, "machine_probe: --threads 1..64, --repeats 1..64, --mib >= 64\n");
        return 2;
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    char features[256] = "";
    const struct {
        const char *name;
        int has;
    } feat[] = {{"avx2", __builtin_cpu_supports("avx2")},
                {"fma", __builtin_cpu_supports("fma")},
                {"f16c", __builtin_cpu_supports("f16c")},
                {"avx512f", __builtin_cpu_supports("avx512f")},
                {"avx512vnni", __builtin_cpu_supports("avx512vnni")},
                {"avx512bf16", __builtin_cpu_supports("avx512bf16")},
                {"amx-tile", __builtin_cpu_supports("amx-tile")}};
    for (size_t i = 0; i < sizeof feat / sizeof feat[0]; i++)
        if (feat[i].has) {
            strcat(features, *features ? "," : "");
            strcat(features, feat[i].name);
        }
#else
    const int avx2 = 0;
    const char *features = "";
#endif
    size_t bytes = (size_t)mib << 20;
    v8f *buf = aligned_alloc(64, bytes);
    const int M = 1024, pm = 256, pk = 768;
    float *a = malloc((size_t)M * M * sizeof(float)), *b = malloc((size_t)M * M * sizeof(float)),
          *c = malloc((size_t)M * M * sizeof(float));
    if (!buf || !a || !b || !c) {
        fprintf(stderr, "machine_probe: out of memory\n");
        return 1;
    }
    memset(buf, 0, bytes);
    for (size_t i = 0; i < (size_t)M * M; i++) {
        a[i] = (float)(i % 97) * 1e-3f;
        b[i] = (float)(i % 89) * 1e-3f;
    }
    double rd[64], fm[64], sg[64], sp[64];
    for (int r = 0; r < repeats; r++) {
        rd[r] = read_gbs(buf, bytes, threads);
        fm[r] = avx2 ? fma_gflops(threads) : 0.0;
        sg[r] = sgemm_gflops(M, M, M, threads, a, b, c);
        sp[r] = sgemm_gflops(pm, pk, pk, 1, a, b, c);
    }
    stat3 srd = stats(rd, repeats), sfm = stats(fm, repeats), ssg = stats(sg, repeats),
          ssp = stats(sp, repeats);
    const char *core = openblas_get_corename();
    if (json) {
        printf("{\"threads\":%d,\"repeats\":%d,\"cpu_features\":\"%s\",\"openblas_core\":\"%s\","
               "\"read_gb_s\":{\"median\":%.2f,\"lowest\":%.2f,\"highest\":%.2f},"
               "\"fma_f32_gflop_s\":{\"median\":%.1f,\"lowest\":%.1f,\"highest\":%.1f},"
               "\"sgemm_1024_gflop_s\":{\"median\":%.1f,\"lowest\":%.1f,\"highest\":%.1f},"
               "\"sgemm_256x768x768_1thread_gflop_s\":{\"median\":%.1f,\"lowest\":%.1f,"
               "\"highest\":%.1f}}\n",
               threads, repeats, features, core ? core : "?", srd.median, srd.lowest, srd.highest,
               sfm.median, sfm.lowest, sfm.highest, ssg.median, ssg.lowest, ssg.highest, ssp.median,
               ssp.lowest, ssp.highest);
    } else {
        printf("machine_probe, %d threads, medians of %d [lowest, highest]\n", threads, repeats);
        printf("  cpu features:                  %s\n", features);
        printf("  OpenBLAS core:                 %s\n", core ? core : "?");
        printf("  read bandwidth (%d MiB):     %8.2f GB/s     [%.2f, %.2f]\n", mib, srd.median,
               srd.lowest, srd.highest);
        printf("  f32 FMA peak (AVX2):           %8.1f GFLOP/s [%.1f, %.1f]\n", sfm.median,
               sfm.lowest, sfm.highest);
        printf("  SGEMM 1024^3:                  %8.1f GFLOP/s [%.1f, %.1f]\n", ssg.median,
               ssg.lowest, ssg.highest);
        printf("  SGEMM 256x768x768, 1 thread:   %8.1f GFLOP/s [%.1f, %.1f]\n", ssp.median,
               ssp.lowest, ssp.highest);
    }
    free(buf);
    free(a);
    free(b);
    free(c);
    return 0;
}
