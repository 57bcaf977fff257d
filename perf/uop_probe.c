/* SPDX-License-Identifier: MIT */
/*
 * uop_probe — the throughput of the vector instructions the integer dot kernels are made of
 * (kernels/cpu/quant_*.c), measured on this core, so that a kernel's choice of instructions
 * rests on numbers: vpmaddubsw, vpmaddwd, vfmadd231ps, vcvtdq2ps, vpaddw, vpshufb, in xmm and
 * ymm, alone and in pairs (whether two kinds share a pipe: a pair that runs at the rate of one
 * of them alone does). Each instruction writes one of 12 registers from 2 others that never
 * change (the FMA accumulates: 12 chains, more than its latency times its rate), so only
 * the issue rate bounds it.
 *
 * Rates are instructions per cycle; a cycle is measured as the time of one step of a chain
 * of dependent scalar adds (1 cycle each on every x86 core since the Pentium 4), right
 * before and after, on the thread's CPU-time clock (so other users of the machine take
 * time away only between the probes' own slices). Each figure is the median of --repeats.
 *
 *   uop_probe [--repeats R]
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define ITERS 2000000L /* loop iterations of a probe: 24 instructions each */

/* Seconds per cycle: 24 dependent adds per iteration. */
static double cycle_s(void)
{
    long n = ITERS, acc = 1;
    const double t0 = cpu_s();
    for (long i = 0; i < n; i++) __asm__ volatile(".rept 24\n\taddq $1, %0\n\t.endr" : "+r"(acc));
    const double t = cpu_s() - t0;
    return t / ((double)n * 24.0);
}

/* 24 instructions per iteration: twice over registers 0-11 of the width W (x or y), each
 * made from registers 12 and 13 (FMA: accumulated). A probe of two kinds alternates them. */
#define R12(F, W)                                                                                  \
    F(W, 0)                                                                                        \
    F(W, 1) F(W, 2) F(W, 3) F(W, 4) F(W, 5) F(W, 6) F(W, 7) F(W, 8) F(W, 9) F(W, 10) F(W, 11)
#define MADDUBS(W, i) "vpmaddubsw %%" #W "mm13, %%" #W "mm12, %%" #W "mm" #i "\n\t"
#define MADDWD(W, i)  "vpmaddwd %%" #W "mm13, %%" #W "mm12, %%" #W "mm" #i "\n\t"
#define FMA(W, i)     "vfmadd231ps %%" #W "mm13, %%" #W "mm12, %%" #W "mm" #i "\n\t"
#define CVT(W, i)     "vcvtdq2ps %%" #W "mm13, %%" #W "mm" #i "\n\t"
#define ADDW(W, i)    "vpaddw %%" #W "mm13, %%" #W "mm12, %%" #W "mm" #i "\n\t"
#define SHUFB(W, i)   "vpshufb %%" #W "mm13, %%" #W "mm12, %%" #W "mm" #i "\n\t"
/* pairs: even registers the first kind, odd the second */
#define P12(A, B, W)                                                                               \
    A(W, 0)                                                                                        \
    B(W, 1) A(W, 2) B(W, 3) A(W, 4) B(W, 5) A(W, 6) B(W, 7) A(W, 8) B(W, 9) A(W, 10) B(W, 11)

#define CLOBBERS                                                                                   \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",       \
        "xmm11", "xmm12", "xmm13"
#define ZERO "vpxor %%xmm12, %%xmm12, %%xmm12\n\tvpxor %%xmm13, %%xmm13, %%xmm13\n\t"

#define PROBE(name, BODY)                                                                          \
    __attribute__((target("avx2,fma"))) static double name(void)                                   \
    {                                                                                              \
        const double t0 = cpu_s();                                                                 \
        for (long i = 0; i < ITERS; i++) __asm__ volatile(ZERO BODY BODY ::: CLOBBERS);            \
        return (cpu_s() - t0) / ((double)ITERS * 24.0);                                            \
    }

PROBE(p_maddubs_x, R12(MADDUBS, x))
PROBE(p_maddubs_y, R12(MADDUBS, y))
PROBE(p_maddwd_x, R12(MADDWD, x))
PROBE(p_maddwd_y, R12(MADDWD, y))
PROBE(p_fma_x, R12(FMA, x))
PROBE(p_fma_y, R12(FMA, y))
PROBE(p_cvt_y, R12(CVT, y))
PROBE(p_addw_y, R12(ADDW, y))
PROBE(p_shufb_x, R12(SHUFB, x))
PROBE(p_shufb_y, R12(SHUFB, y))
PROBE(p_maddubs_maddwd_y, P12(MADDUBS, MADDWD, y))
PROBE(p_maddubs_fma_y, P12(MADDUBS, FMA, y))
PROBE(p_maddwd_fma_y, P12(MADDWD, FMA, y))
PROBE(p_maddubs_addw_y, P12(MADDUBS, ADDW, y))
PROBE(p_maddubs_shufb_y, P12(MADDUBS, SHUFB, y))
PROBE(p_fma_cvt_y, P12(FMA, CVT, y))

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int repeats = 5;
    static const struct option opts[] = {{"repeats", required_argument, 0, 'r'}, {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "r:", opts, NULL)) != -1) {
        if (ch != 'r' || (repeats = atoi(optarg)) < 1 || repeats > 99) {
            fprintf(stderr, "usage: uop_probe [--repeats R (1-99)]\n");
            return 2;
        }
    }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        printf("uop_probe: this CPU has no AVX2 + FMA; nothing to measure\n");
        return 0;
    }
    static const struct {
        const char *name;
        double (*fn)(void);
    } probes[] = {{"vpmaddubsw xmm", p_maddubs_x},
                  {"vpmaddubsw ymm", p_maddubs_y},
                  {"vpmaddwd xmm", p_maddwd_x},
                  {"vpmaddwd ymm", p_maddwd_y},
                  {"vfmadd231ps xmm", p_fma_x},
                  {"vfmadd231ps ymm", p_fma_y},
                  {"vcvtdq2ps ymm", p_cvt_y},
                  {"vpaddw ymm", p_addw_y},
                  {"vpshufb xmm", p_shufb_x},
                  {"vpshufb ymm", p_shufb_y},
                  {"vpmaddubsw + vpmaddwd ymm", p_maddubs_maddwd_y},
                  {"vpmaddubsw + vfmadd231ps ymm", p_maddubs_fma_y},
                  {"vpmaddwd + vfmadd231ps ymm", p_maddwd_fma_y},
                  {"vpmaddubsw + vpaddw ymm", p_maddubs_addw_y},
                  {"vpmaddubsw + vpshufb ymm", p_maddubs_shufb_y},
                  {"vfmadd231ps + vcvtdq2ps ymm", p_fma_cvt_y}};
    const int np = (int)(sizeof probes / sizeof probes[0]);
    double *per = calloc((size_t)np * (size_t)repeats, sizeof(double));
    double *cyc = calloc((size_t)repeats * 2, sizeof(double));
    if (!per || !cyc) return 1;
    for (int r = 0; r < repeats; r++) {
        cyc[2 * r] = cycle_s();
        for (int p = 0; p < np; p++) per[(size_t)p * repeats + r] = probes[p].fn();
        cyc[2 * r + 1] = cycle_s();
    }
    qsort(cyc, (size_t)repeats * 2, sizeof(double), cmp_double);
    const double c = cyc[repeats]; /* the median cycle (upper middle) */
    printf("uop_probe: one cycle %.3f ns (%.2f GHz, dependent adds), %d repeats, medians\n",
           c * 1e9, 1e-9 / c, repeats);
    printf("%-32s %12s %12s\n", "instruction(s)", "per cycle", "cycles each");
    for (int p = 0; p < np; p++) {
        double *v = per + (size_t)p * repeats;
        qsort(v, (size_t)repeats, sizeof(double), cmp_double);
        const double t = v[repeats / 2];
        printf("%-32s %12.2f %12.2f\n", probes[p].name, c / t, t / c);
    }
    free(per);
    free(cyc);
    return 0;
}

#else

int main(void)
{
    printf("uop_probe: x86-64 only; nothing to measure\n");
    return 0;
}

#endif
