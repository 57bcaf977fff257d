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
 * It also measures one core's multiply units (mul_probe_run below: 256-bit FMAs, 8-bit
 * multiplies, 8-bit dots, both side by side, per cycle); --mul measures only those.
 *
 *   machine_probe [--threads N] [--repeats R] [--mib M] [--json] [--mul]
 */
#include "kernels/cpu/blas_core.h"
#include "perf/bench_util.h"

#include <cblas.h>
#include <getopt.h>
#include <pthread.h>
#include <stddef.h>
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
/* one vfmadd per chain: the asm keeps GCC from folding the loop */
#define FMA_STEP(c) __asm__("vfmadd132ps %2, %1, %0" : "+x"(c) : "x"(a), "x"(m))

/* The ten chains are named variables, not an array: with an array GCC kept them on the stack
 * and every FMA waited for a store and a load (half the peak). */
__attribute__((target("avx2,fma"))) static float fma_loop_avx2(float seed)
{
    const v8f m = {0.999999f, 0.999999f, 0.999999f, 0.999999f,
                   0.999999f, 0.999999f, 0.999999f, 0.999999f};
    const v8f a = {1e-7f, 1e-7f, 1e-7f, 1e-7f, 1e-7f, 1e-7f, 1e-7f, 1e-7f};
    v8f c0 = (v8f){0} + seed, c1 = c0 + 1.0f, c2 = c0 + 2.0f, c3 = c0 + 3.0f, c4 = c0 + 4.0f,
        c5 = c0 + 5.0f, c6 = c0 + 6.0f, c7 = c0 + 7.0f, c8 = c0 + 8.0f, c9 = c0 + 9.0f;
    for (int i = 0; i < FMA_ITERS; i++) {
        FMA_STEP(c0);
        FMA_STEP(c1);
        FMA_STEP(c2);
        FMA_STEP(c3);
        FMA_STEP(c4);
        FMA_STEP(c5);
        FMA_STEP(c6);
        FMA_STEP(c7);
        FMA_STEP(c8);
        FMA_STEP(c9);
    }
    const v8f s = ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)) + (c8 + c9);
    float t = 0;
    for (int j = 0; j < 8; j++) t += s[j];
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

/* ---- the multiply units, one thread --------------------------------------------------- */

/*
 * What one core's multipliers give per cycle, for the kernels' choice between float and
 * integer dots: each loop runs independent chains in registers (asm, so GCC can neither fold
 * nor reorder them) of one 256-bit instruction, or of the three an 8-bit dot needs per 32
 * products (vpmaddubsw, vpmaddwd to 32 bits, vpaddd), or of two FMAs beside one such dot (do
 * the integer and float multipliers issue side by side?), timed on the thread's CPU clock
 * (load from other processes does not count). Cycles come from a chain of dependent scalar
 * adds (one a cycle on every x86-64 core), timed beside them.
 */
#define MUL_ITERS (4 * 1000 * 1000)

typedef struct mul_probe {
    double ghz;        /* dependent adds per ns */
    double fma;        /* vfmadd231ps ymm per cycle */
    double maddubs;    /* vpmaddubsw ymm per cycle */
    double madd;       /* vpmaddwd ymm per cycle */
    double dot8;       /* 8-bit dots of 32 products (maddubs + madd + paddd) per cycle */
    double mixed_fma;  /* in the mixed loop: FMAs per cycle ... */
    double mixed_dot8; /* ... and 8-bit dots per cycle */
} mul_probe;

static double thread_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#if defined(__x86_64__)
typedef long long v4i __attribute__((vector_size(32)));

/* seconds for MUL_ITERS x 10 dependent adds */
static double add_chain_s(void)
{
    unsigned long x = 1;
    double t0 = thread_s();
    for (int i = 0; i < MUL_ITERS; i++)
        __asm__("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
                "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
                : "+r"(x));
    double dt = thread_s() - t0;
    volatile unsigned long sink = x;
    (void)sink;
    return dt;
}

#define CH8(op)                                                                                    \
    __asm__(op : "+x"(c0) : "x"(k));                                                               \
    __asm__(op : "+x"(c1) : "x"(k));                                                               \
    __asm__(op : "+x"(c2) : "x"(k));                                                               \
    __asm__(op : "+x"(c3) : "x"(k));                                                               \
    __asm__(op : "+x"(c4) : "x"(k));                                                               \
    __asm__(op : "+x"(c5) : "x"(k));                                                               \
    __asm__(op : "+x"(c6) : "x"(k));                                                               \
    __asm__(op : "+x"(c7) : "x"(k));

/* seconds for MUL_ITERS x 8 of one instruction (kind 0 FMA, 1 maddubs, 2 madd) */
__attribute__((target("avx2,fma"))) static double one_op_s(int kind)
{
    /* FMA: c += 1e-3 x 1e-3 from 1.0 (normal floats throughout); else bytes / words of 1 */
    const long long kk = kind == 0 ? 0x3A83126F3A83126Fll : 0x0101010101010101ll,
                    ci = kind == 0 ? 0x3F8000003F800000ll : kk;
    const v4i k = {kk, kk, kk, kk};
    v4i c0 = {ci, ci, ci, ci}, c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    double t0 = thread_s();
    for (int i = 0; i < MUL_ITERS; i++) {
        if (kind == 0) {
            CH8("vfmadd231ps %1, %1, %0")
        } else if (kind == 1) {
            CH8("vpmaddubsw %1, %0, %0")
        } else {
            CH8("vpmaddwd %1, %0, %0")
        }
    }
    double dt = thread_s() - t0;
    volatile long long sink = c0[0] + c1[1] + c2[2] + c3[3] + c4[0] + c5[1] + c6[2] + c7[3];
    (void)sink;
    return dt;
}

#define DOT8(c, t)                                                                                 \
    __asm__("vpmaddubsw %2, %0, %1\n\tvpmaddwd %3, %1, %1\n\tvpaddd %1, %0, %0"                    \
            : "+x"(c), "=&x"(t)                                                                    \
            : "x"(w), "x"(ones))
#define FMA1(c) __asm__("vfmadd231ps %1, %1, %0" : "+x"(c) : "x"(f))

/* seconds for MUL_ITERS x (6 8-bit dots) (mixed 0), or x (4 FMAs + 2 dots) (mixed 1) */
__attribute__((target("avx2,fma"))) static double dot8_s(int mixed)
{
    const v4i w = {0x0101010101010101ll, 0x0101010101010101ll, 0x0101010101010101ll,
                   0x0101010101010101ll},
              ones = {0x0001000100010001ll, 0x0001000100010001ll, 0x0001000100010001ll,
                      0x0001000100010001ll};
    const v4i f = {0x3A83126F3A83126Fll, 0x3A83126F3A83126Fll, 0x3A83126F3A83126Fll,
                   0x3A83126F3A83126Fll}; /* 1e-3f: the FMAs add 1e-6 to 1.0 */
    v4i c0 = {0x3F8000003F800000ll, 0x3F8000003F800000ll, 0x3F8000003F800000ll,
              0x3F8000003F800000ll},
        c1 = c0, c2 = c0, c3 = c0, c4 = w, c5 = w, t0, t1, t2, t3, t4, t5;
    if (!mixed) c0 = c1 = c2 = c3 = w;
    double s0 = thread_s();
    for (int i = 0; i < MUL_ITERS; i++) {
        if (mixed) {
            FMA1(c0);
            FMA1(c1);
            DOT8(c4, t4);
            FMA1(c2);
            FMA1(c3);
            DOT8(c5, t5);
        } else {
            DOT8(c0, t0);
            DOT8(c1, t1);
            DOT8(c2, t2);
            DOT8(c3, t3);
            DOT8(c4, t4);
            DOT8(c5, t5);
        }
    }
    double dt = thread_s() - s0;
    volatile long long sink = c0[0] + c1[1] + c2[2] + c3[3] + c4[0] + c5[1];
    (void)sink;
    return dt;
}

static mul_probe mul_probe_run(void)
{
    mul_probe p = {0};
    const double n = (double)MUL_ITERS;
    const double add = add_chain_s();
    const double fma = one_op_s(0), mub = one_op_s(1), mad = one_op_s(2);
    const double dot = dot8_s(0), mix = dot8_s(1);
    const double add2 = add_chain_s();                  /* the clock, before and after */
    const double cyc_s = 10.0 * n / ((add + add2) / 2); /* cycles per second */
    p.ghz = cyc_s / 1e9;
    p.fma = 8 * n / (fma * cyc_s);
    p.maddubs = 8 * n / (mub * cyc_s);
    p.madd = 8 * n / (mad * cyc_s);
    p.dot8 = 6 * n / (dot * cyc_s);
    p.mixed_fma = 4 * n / (mix * cyc_s);
    p.mixed_dot8 = 2 * n / (mix * cyc_s);
    return p;
}
#else
static mul_probe mul_probe_run(void)
{
    return (mul_probe){0};
}
#endif

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

/* The multiply probe's figures (medians of n runs, with the lowest and highest): as one JSON
 * member "mul_probe" (json) or as lines of text. */
static void mul_report(const mul_probe *runs, int n, int json)
{
    static const struct {
        const char *key, *what;
        size_t off;
    } f[] = {
        {"ghz", "clock (dependent adds per ns)", offsetof(mul_probe, ghz)},
        {"fma_per_cycle", "vfmadd231ps ymm per cycle", offsetof(mul_probe, fma)},
        {"maddubs_per_cycle", "vpmaddubsw ymm per cycle", offsetof(mul_probe, maddubs)},
        {"madd_per_cycle", "vpmaddwd ymm per cycle", offsetof(mul_probe, madd)},
        {"dot8_per_cycle", "8-bit dots of 32 (maddubs+madd+add)/cycle", offsetof(mul_probe, dot8)},
        {"mixed_fma_per_cycle", "mixed 2 FMA : 1 dot: FMAs per cycle",
         offsetof(mul_probe, mixed_fma)},
        {"mixed_dot8_per_cycle", "mixed 2 FMA : 1 dot: dots per cycle",
         offsetof(mul_probe, mixed_dot8)},
    };
    const int nf = (int)(sizeof f / sizeof f[0]);
    stat3 st[sizeof f / sizeof f[0]];
    for (int i = 0; i < nf; i++) {
        double v[64];
        for (int r = 0; r < n; r++)
            memcpy(&v[r], (const char *)&runs[r] + f[i].off, sizeof(double));
        st[i] = stats(v, n);
    }
    /* products per cycle: an FMA 8 float multiply-adds, a dot 32 byte products */
    const double fma_p = 8 * st[1].median, dot_p = 32 * st[4].median,
                 mix_p = 8 * st[5].median + 32 * st[6].median;
    if (json) {
        printf("\"mul_probe\":{");
        for (int i = 0; i < nf; i++)
            printf("\"%s\":{\"median\":%.3f,\"lowest\":%.3f,\"highest\":%.3f},", f[i].key,
                   st[i].median, st[i].lowest, st[i].highest);
        printf("\"products_per_cycle\":{\"fma_f32\":%.2f,\"dot8\":%.2f,\"mixed\":%.2f}}", fma_p,
               dot_p, mix_p);
        return;
    }
    printf("  multiply units, 1 thread, its CPU time (medians [lowest, highest]):\n");
    for (int i = 0; i < nf; i++)
        printf("    %-44s %7.3f [%.3f, %.3f]\n", f[i].what, st[i].median, st[i].lowest,
               st[i].highest);
    printf("    products per cycle: f32 FMA %.1f, 8-bit dot %.1f, mixed %.1f\n", fma_p, dot_p,
           mix_p);
}

int main(int argc, char **argv)
{
    blas_core_fix(argv); /* OpenBLAS's kernels as ringlmd runs them (kernels/cpu/blas_core.h) */
    int threads = 2, repeats = 5, json = 0, mib = 1024, mul_only = 0;
    static const struct option opts[] = {
        {"threads", required_argument, 0, 't'}, {"repeats", required_argument, 0, 'r'},
        {"mib", required_argument, 0, 'm'},     {"json", no_argument, 0, 'j'},
        {"mul", no_argument, 0, 'u'},           {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "t:r:m:ju", opts, NULL)) != -1) {
        switch (ch) {
        case 't': threads = atoi(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        case 'm': mib = atoi(optarg); break;
        case 'j': json = 1; break;
        case 'u': mul_only = 1; break;
        default:
            fprintf(stderr, "usage: machine_probe [--threads N] [--repeats R] [--mib M] [--json] "
                            "[--mul]\n");
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
    mul_probe mp[64];
    if (mul_only) {
        for (int r = 0; r < repeats; r++) mp[r] = mul_probe_run();
        if (json) {
            printf("{\"repeats\":%d,\"cpu_features\":\"%s\",", repeats, features);
            mul_report(mp, repeats, 1);
            printf("}\n");
        } else {
            printf("machine_probe --mul, medians of %d\n  cpu features: %s\n", repeats, features);
            mul_report(mp, repeats, 0);
        }
        return 0;
    }
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
        mp[r] = mul_probe_run();
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
               "\"highest\":%.1f},",
               threads, repeats, features, core ? core : "?", srd.median, srd.lowest, srd.highest,
               sfm.median, sfm.lowest, sfm.highest, ssg.median, ssg.lowest, ssg.highest, ssp.median,
               ssp.lowest, ssp.highest);
        mul_report(mp, repeats, 1);
        printf("}\n");
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
        mul_report(mp, repeats, 0);
    }
    free(buf);
    free(a);
    free(b);
    free(c);
    return 0;
}
