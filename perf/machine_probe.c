/* SPDX-License-Identifier: MIT */
/*
 * machine_probe — what this machine can do, measured now, for the benchmarks that compare
 * against it (perf/llama_compare.sh prints it beside each run): the memory read bandwidth
 * (--threads threads reading a buffer far larger than the caches: the best of several
 * layouts of a reader like the engine's, and the simple figure of older results; below), the
 * float32 multiply-add peak (independent FMA chains in registers, AVX2 where the CPU has
 * it), and OpenBLAS SGEMM's rate on a square product (--threads threads) and on one
 * prefill projection (256 x 768 x 768, one thread, as the engine's workers call it), with
 * the core OpenBLAS runs for this CPU (corrected as ringlmd corrects it: RINGLM_BLAS_CORE=keep
 * measures OpenBLAS's own choice) and the CPU's features. Each figure is the median of
 * --repeats, with the lowest and highest. The buffer the bandwidth is read from lies on 2 MiB
 * pages (MADV_HUGEPAGE, where transparent huge pages allow), as ringlmd's weights do; with
 * --small-pages on 4 KiB pages, as a file mapped from the page cache.
 *
 * It also measures one core's vector units (mul_probe_run below: the rate of each instruction
 * the dot kernels are made of, alone and in pairs; 8-bit dots; FMAs and dots side by side,
 * per cycle; and, where the CPU has AVX-512 BF16, vdpbf16ps zmm beside vfmadd231ps zmm: the
 * BF16 dot peak that kernels/cpu/gemm_bf16.c's tiles are measured against); --mul measures
 * only those, --read only the read bandwidth.
 *
 * On a shared machine run it as the figures it is put against were run (two threads under
 * chrt -f 10 where those were): without it, at load 11 on two CPUs, every layout read 7-10
 * GB/s, its threads descheduled most of the time (1.7 s of CPU in 8.6 s).
 *
 *   machine_probe [--threads N] [--repeats R] [--mib M] [--json] [--mul | --read]
 *                 [--small-pages]
 */
#include "kernels/cpu/blas_core.h"
#include "perf/bench_util.h"

#include <cblas.h>
#include <getopt.h>
#include <sys/mman.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
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

/*
 * Two figures. The simple one (read_gb_s, the only one before): --threads threads each sum
 * their contiguous share of the buffer as one stream of 32-byte vectors (two 16-byte halves
 * in this baseline x86-64 build), kept as it was so that older results stay comparable. The
 * engine does not read that way: its tiles take AVX-512 loads from 4 rows, one in each
 * quarter of a matrix (4 concurrent sequential streams a thread, kernels/cpu/gemm_small.c,
 * quant_float.c), each thread its part of every matrix in turn; on the Zen 4 VM its batch-1
 * decode read stories110M F32 at 52 GB/s where the simple probe said 36-41.
 *
 * The best one (read_best): the same buffer read in every layout below, each a reader like
 * the engine — 64-byte loads (AVX-512 where the CPU has it, else two AVX2 halves) multiplied
 * into accumulators — that differ in what the hardware prefetcher and the memory system
 * see: streams per thread (1, 4 or 8 sequential streams read side by side, a line from each
 * in turn), software prefetch (none, or prefetcht0 RD_PF_BYTES ahead in every stream), and
 * each thread's share (contiguous: its 1/T of the buffer; interleaved: the threads take
 * RD_CHUNK bytes each in turn, as the engine's workers split every matrix). The layouts
 * alternate within each repeat, so a change of the machine's bandwidth over time hits them
 * alike; the layout with the highest median is reported with its median, lowest and highest.
 * That is an upper bound of what a reader like the engine gets here now, which is what a
 * decode's read rate is put against (perf/llama_compare.sh).
 *
 * What the layouts showed on the Zen 4 VM (2 threads under chrt -f 10, load 9-11,
 * docs/results/2026-12-08-read-probe-zen4-s16.md): one stream, or 4 interleaved, read
 * 58-65 GB/s, the simple reader 52-54; contiguous shares split into 4 or 8 streams 64-256 MiB
 * apart read 30-48 (one thread: 13-15 against 31 from one stream), far streams a power of two
 * apart that the engine's quarters (hundreds of KiB apart) never are; prefetch 256 B ahead
 * was as fast as none, 512-2048 B 5-20% slower. The buffer: 64 MiB read low (the threads'
 * start skew is much of a 1 ms pass), 128 MiB high (part of it from the 32 MiB L3), 256-2048
 * MiB the same within the spread; 1024 MiB (--mib) stays the default.
 */
#define RD_CHUNK    ((size_t)2 << 20) /* interleaved: bytes a thread reads per turn */
#define RD_PF_BYTES 256               /* software prefetch distance in each stream */
#define RD_LINE     64                /* bytes per load step of a stream */

typedef struct rd_layout {
    int streams;        /* sequential streams a thread reads side by side */
    int prefetch_bytes; /* prefetcht0 this far ahead in each stream; 0: none */
    int interleaved;    /* 0: each thread its contiguous share; 1: turns of RD_CHUNK */
} rd_layout;

static const rd_layout rd_layouts[] = {
    {1, 0, 0}, {4, 0, 0}, {8, 0, 0}, {1, RD_PF_BYTES, 0}, {4, RD_PF_BYTES, 0}, {8, RD_PF_BYTES, 0},
    {1, 0, 1}, {4, 0, 1}, {8, 0, 1}, {1, RD_PF_BYTES, 1}, {4, RD_PF_BYTES, 1}, {8, RD_PF_BYTES, 1},
};
#define RD_N_LAYOUTS ((int)(sizeof rd_layouts / sizeof rd_layouts[0]))

/* "4 streams, interleaved 2 MiB, prefetch 256 B" */
static void rd_layout_name(const rd_layout *l, char *out, size_t n)
{
    char pf[32] = "no prefetch";
    if (l->prefetch_bytes) snprintf(pf, sizeof pf, "prefetch %d B", l->prefetch_bytes);
    snprintf(out, n, "%d stream%s, %s, %s", l->streams, l->streams > 1 ? "s" : "",
             l->interleaved ? "interleaved 2 MiB" : "contiguous", pf);
}

typedef struct rd_arg {
    const char *buf;
    size_t bytes; /* of the whole buffer */
    int thread, threads;
    rd_layout layout;
    int simple; /* the simple reader (above) instead of the layout */
    pthread_barrier_t *start;
    double t0, t1; /* when this thread started and ended reading */
    float sum;
} rd_arg;

/* the simple reader: n vectors from p, one stream, 4 sums */
static float rd_simple(const v8f *p, size_t n)
{
    v8f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
    }
    v8f s = (s0 + s1) + (s2 + s3);
    float t = 0;
    for (int j = 0; j < 8; j++) t += s[j];
    return t;
}

#if defined(__x86_64__)
#include <immintrin.h>

/* One piece of `bytes` (a multiple of S * RD_LINE * U) read as S streams of bytes / S each,
 * U lines of each stream a step (S * U accumulators: at least 4, so that the multiply-adds'
 * latency never bounds the loads), with prefetcht0 pf bytes ahead when pf > 0. S, U and the
 * presence of pf are constants at every call, so the loops unroll into registers. */
#define RD_PIECE512(S, U)                                                                          \
    __attribute__((target("avx512f"))) static float rd_piece512_##S(const char *p, size_t bytes,   \
                                                                    int pf)                        \
    {                                                                                              \
        const size_t len = bytes / S;                                                              \
        const __m512 x = _mm512_set1_ps(1e-3f);                                                    \
        __m512 acc[S * U];                                                                         \
        for (int a = 0; a < S * U; a++) acc[a] = _mm512_setzero_ps();                              \
        for (size_t off = 0; off < len; off += (size_t)RD_LINE * U) {                              \
            if (pf)                                                                                \
                for (int s = 0; s < S; s++)                                                        \
                    for (int u = 0; u < U; u++)                                                    \
                        _mm_prefetch(p + (size_t)s * len + off + (size_t)u * RD_LINE + pf,         \
                                     _MM_HINT_T0);                                                 \
            for (int s = 0; s < S; s++)                                                            \
                for (int u = 0; u < U; u++)                                                        \
                    acc[s * U + u] =                                                               \
                        _mm512_fmadd_ps(_mm512_load_ps((const float *)(p + (size_t)s * len + off + \
                                                                       (size_t)u * RD_LINE)),      \
                                        x, acc[s * U + u]);                                        \
        }                                                                                          \
        __m512 t = acc[0];                                                                         \
        for (int a = 1; a < S * U; a++) t = _mm512_add_ps(t, acc[a]);                              \
        return _mm512_reduce_add_ps(t);                                                            \
    }
#define RD_PIECE256(S, U)                                                                          \
    __attribute__((target("avx2,fma"))) static float rd_piece256_##S(const char *p, size_t bytes,  \
                                                                     int pf)                       \
    {                                                                                              \
        const size_t len = bytes / S;                                                              \
        const __m256 x = _mm256_set1_ps(1e-3f);                                                    \
        __m256 acc[S * U];                                                                         \
        for (int a = 0; a < S * U; a++) acc[a] = _mm256_setzero_ps();                              \
        for (size_t off = 0; off < len; off += (size_t)RD_LINE * U) {                              \
            if (pf)                                                                                \
                for (int s = 0; s < S; s++)                                                        \
                    for (int u = 0; u < U; u++)                                                    \
                        _mm_prefetch(p + (size_t)s * len + off + (size_t)u * RD_LINE + pf,         \
                                     _MM_HINT_T0);                                                 \
            for (int s = 0; s < S; s++)                                                            \
                for (int u = 0; u < U; u++)                                                        \
                    for (int h = 0; h < 2; h++)                                                    \
                        acc[s * U + u] = _mm256_fmadd_ps(                                          \
                            _mm256_load_ps((const float *)(p + (size_t)s * len + off +             \
                                                           (size_t)u * RD_LINE + 32 * h)),         \
                            x, acc[s * U + u]);                                                    \
        }                                                                                          \
        __m256 t = acc[0];                                                                         \
        for (int a = 1; a < S * U; a++) t = _mm256_add_ps(t, acc[a]);                              \
        float v[8];                                                                                \
        _mm256_storeu_ps(v, t);                                                                    \
        return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));                  \
    }
RD_PIECE512(1, 4)
RD_PIECE512(4, 1)
RD_PIECE512(8, 1)
RD_PIECE256(1, 4)
RD_PIECE256(4, 1)
RD_PIECE256(8, 1)

static int rd_avx512; /* set once in main */

static float rd_piece(const char *p, size_t bytes, int streams, int pf)
{
    if (rd_avx512) {
        switch (streams) {
        case 1: return rd_piece512_1(p, bytes, pf);
        case 4: return rd_piece512_4(p, bytes, pf);
        default: return rd_piece512_8(p, bytes, pf);
        }
    }
    switch (streams) {
    case 1: return rd_piece256_1(p, bytes, pf);
    case 4: return rd_piece256_4(p, bytes, pf);
    default: return rd_piece256_8(p, bytes, pf);
    }
}
#else
static int rd_avx512;

/* portable: the simple reader over each stream in turn (one stream at a time) */
static float rd_piece(const char *p, size_t bytes, int streams, int pf)
{
    (void)pf;
    float t = 0;
    for (int s = 0; s < streams; s++)
        t += rd_simple((const v8f *)(p + (size_t)s * (bytes / streams)),
                       bytes / streams / sizeof(v8f));
    return t;
}
#endif

static void *rd_main(void *argp)
{
    rd_arg *a = argp;
    pthread_barrier_wait(a->start);
    a->t0 = now_s();
    const size_t per = a->bytes / (size_t)a->threads;
    if (a->simple) {
        a->sum = rd_simple((const v8f *)(a->buf + (size_t)a->thread * per), per / sizeof(v8f));
        a->t1 = now_s();
        return NULL;
    }
    const rd_layout *l = &a->layout;
    float t = 0;
    if (!l->interleaved) {
        t = rd_piece(a->buf + (size_t)a->thread * per, per, l->streams, l->prefetch_bytes);
    } else {
        const size_t turn = RD_CHUNK * (size_t)a->threads;
        for (size_t off = (size_t)a->thread * RD_CHUNK; off + RD_CHUNK <= a->bytes; off += turn)
            t += rd_piece(a->buf + off, RD_CHUNK, l->streams, l->prefetch_bytes);
    }
    a->sum = t;
    a->t1 = now_s();
    return NULL;
}

/* GB/s reading the buffer with `threads` threads: the simple reader (layout NULL) or a
 * layout. bytes: a multiple of RD_CHUNK * threads (and so of every piece's step). The time is
 * from the first thread's start to the last one's end, each taken by the reading thread: the
 * caller's own clock readings around the barrier and the joins were late whenever the readers
 * had every CPU (two readers under chrt -f on two CPUs: the caller ran only once one ended,
 * and the probe reported thousands of GB/s). */
static double read_gbs(const char *buf, size_t bytes, int threads, const rd_layout *layout)
{
    pthread_t th[64];
    rd_arg args[64];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        args[t] = (rd_arg){.buf = buf,
                           .bytes = bytes,
                           .thread = t,
                           .threads = threads,
                           .layout = layout ? *layout : (rd_layout){1, 0, 0},
                           .simple = !layout,
                           .start = &start};
        pthread_create(&th[t], NULL, rd_main, &args[t]);
    }
    pthread_barrier_wait(&start);
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&start);
    double t0 = args[0].t0, t1 = args[0].t1;
    volatile float sink = 0;
    for (int t = 0; t < threads; t++) {
        t0 = args[t].t0 < t0 ? args[t].t0 : t0;
        t1 = args[t].t1 > t1 ? args[t].t1 : t1;
        sink += args[t].sum;
    }
    (void)sink;
    return (double)bytes / (t1 - t0) / 1e9;
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
    double t0, t1; /* when this thread started and ended */
    float out;
} fma_arg;

static void *fma_main(void *argp)
{
    fma_arg *a = argp;
    pthread_barrier_wait(a->start);
    a->t0 = now_s();
#if defined(__x86_64__)
    a->out = fma_loop_avx2(1.0f);
#endif
    a->t1 = now_s();
    return NULL;
}

/* GFLOP/s of `threads` threads each running FMA_CHAINS independent 8-lane FMA chains, timed
 * from the first thread's start to the last one's end (as read_gbs). */
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
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&start);
    double t0 = args[0].t0, t1 = args[0].t1;
    for (int t = 1; t < threads; t++) {
        t0 = args[t].t0 < t0 ? args[t].t0 : t0;
        t1 = args[t].t1 > t1 ? args[t].t1 : t1;
    }
    return 2.0 * 8 * FMA_CHAINS * (double)FMA_ITERS * threads / (t1 - t0) / 1e9;
}

/* ---- the multiply units, one thread --------------------------------------------------- */

/*
 * What one core's vector units give per cycle, for the kernels' choice of instructions
 * (kernels/cpu/quant_*.c) and between float and integer dots, timed on the thread's CPU
 * clock (load from other processes takes time away only between the probe's own slices):
 *
 * - the throughput of each instruction the dot kernels are made of (vpmaddubsw, vpmaddwd,
 *   vfmadd231ps, vcvtdq2ps, vpaddw, vpshufb, in xmm and ymm), alone and in pairs (a pair
 *   that runs at the rate of one of them alone shares its pipe): each writes one of 12
 *   registers from 2 others that never change (the FMA accumulates: 12 chains, more than its
 *   latency times its rate), so only the issue rate bounds it;
 * - 8-bit dots of 32 products (vpmaddubsw, vpmaddwd to 32 bits, vpaddd: 6 chains), and two
 *   FMAs beside each such dot (do the integer and float multipliers issue side by side?);
 * - with AVX-512 BF16, vdpbf16ps zmm (32 bf16 products summed into 16 floats) and
 *   vfmadd231ps zmm, 12 accumulating chains each, as the instruction probes.
 *
 * A cycle is one step of a chain of dependent scalar adds (one a cycle on every x86-64 core),
 * timed before and after. All in asm, so GCC can neither fold nor reorder it.
 */
#define UOP_ITERS 2000000L          /* iterations of an instruction probe: 24 instructions each */
#define MUL_ITERS (4 * 1000 * 1000) /* iterations of a dot probe */

static double thread_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 24 instructions per iteration: twice over registers 0-11 of the width W (x or y), each
 * made from registers 12 and 13 (FMA: accumulated). A pair alternates its two kinds (even
 * registers the first). */
#define R12(F, W)                                                                                  \
    F(W, 0)                                                                                        \
    F(W, 1) F(W, 2) F(W, 3) F(W, 4) F(W, 5) F(W, 6) F(W, 7) F(W, 8) F(W, 9) F(W, 10) F(W, 11)
#define P12(A, B, W)                                                                               \
    A(W, 0)                                                                                        \
    B(W, 1) A(W, 2) B(W, 3) A(W, 4) B(W, 5) A(W, 6) B(W, 7) A(W, 8) B(W, 9) A(W, 10) B(W, 11)
#define MADDUBS(W, i) "vpmaddubsw %%" #W "mm13, %%" #W "mm12, %%" #W "mm" #i "\n\t"
#define MADDWD(W, i)  "vpmaddwd %%" #W "mm13, %%" #W "mm12, %%" #W "mm" #i "\n\t"
#define FMA(W, i)     "vfmadd231ps %%" #W "mm13, %%" #W "mm12, %%" #W "mm" #i "\n\t"
#define CVT(W, i)     "vcvtdq2ps %%" #W "mm13, %%" #W "mm" #i "\n\t"
#define ADDW(W, i)    "vpaddw %%" #W "mm13, %%" #W "mm12, %%" #W "mm" #i "\n\t"
#define SHUFB(W, i)   "vpshufb %%" #W "mm13, %%" #W "mm12, %%" #W "mm" #i "\n\t"

/* Each instruction probe: its function, its name in the report. */
#define UOPS(X)                                                                                    \
    X(maddubs_x, "vpmaddubsw xmm", R12(MADDUBS, x))                                                \
    X(maddubs_y, "vpmaddubsw ymm", R12(MADDUBS, y))                                                \
    X(maddwd_x, "vpmaddwd xmm", R12(MADDWD, x))                                                    \
    X(maddwd_y, "vpmaddwd ymm", R12(MADDWD, y))                                                    \
    X(fma_x, "vfmadd231ps xmm", R12(FMA, x))                                                       \
    X(fma_y, "vfmadd231ps ymm", R12(FMA, y))                                                       \
    X(cvt_y, "vcvtdq2ps ymm", R12(CVT, y))                                                         \
    X(addw_y, "vpaddw ymm", R12(ADDW, y))                                                          \
    X(shufb_x, "vpshufb xmm", R12(SHUFB, x))                                                       \
    X(shufb_y, "vpshufb ymm", R12(SHUFB, y))                                                       \
    X(maddubs_maddwd_y, "vpmaddubsw + vpmaddwd ymm", P12(MADDUBS, MADDWD, y))                      \
    X(maddubs_fma_y, "vpmaddubsw + vfmadd231ps ymm", P12(MADDUBS, FMA, y))                         \
    X(maddwd_fma_y, "vpmaddwd + vfmadd231ps ymm", P12(MADDWD, FMA, y))                             \
    X(maddubs_addw_y, "vpmaddubsw + vpaddw ymm", P12(MADDUBS, ADDW, y))                            \
    X(maddubs_shufb_y, "vpmaddubsw + vpshufb ymm", P12(MADDUBS, SHUFB, y))                         \
    X(fma_cvt_y, "vfmadd231ps + vcvtdq2ps ymm", P12(FMA, CVT, y))

#define UOP_ENUM(id, name, body) UOP_##id,
enum { UOPS(UOP_ENUM) N_UOPS };
#define UOP_NAME(id, name, body) name,
static const char *const uop_names[N_UOPS] = {UOPS(UOP_NAME)};

/* One run's figures: v[MP_UOP + i] is instruction probe i's rate. */
enum {
    MP_GHZ,
    MP_DOT8,
    MP_MIXED_FMA,
    MP_MIXED_DOT8,
    MP_BF16_Z, /* vdpbf16ps zmm per cycle (0 without AVX-512 BF16) */
    MP_FMA_Z,  /* vfmadd231ps zmm per cycle (0 without AVX-512 BF16) */
    MP_UOP,
    MP_N = MP_UOP + N_UOPS
};
typedef struct mul_probe {
    double v[MP_N]; /* clock (GHz); the rest per cycle */
} mul_probe;

#if defined(__x86_64__)
typedef long long v4i __attribute__((vector_size(32)));

/* seconds per cycle: 24 dependent adds per iteration */
static double cycle_s(void)
{
    long acc = 1;
    const double t0 = thread_s();
    for (long i = 0; i < UOP_ITERS; i++)
        __asm__ volatile(".rept 24\n\taddq $1, %0\n\t.endr" : "+r"(acc));
    return (thread_s() - t0) / ((double)UOP_ITERS * 24.0);
}

#define UOP_CLOBBERS                                                                               \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",       \
        "xmm11", "xmm12", "xmm13"
#define UOP_ZERO "vpxor %%xmm12, %%xmm12, %%xmm12\n\tvpxor %%xmm13, %%xmm13, %%xmm13\n\t"

/* seconds per instruction of a probe */
#define UOP_FN(id, name, body)                                                                     \
    __attribute__((target("avx2,fma"))) static double uop_##id(void)                               \
    {                                                                                              \
        const double t0 = thread_s();                                                              \
        for (long i = 0; i < UOP_ITERS; i++)                                                       \
            __asm__ volatile(UOP_ZERO body body ::: UOP_CLOBBERS);                                 \
        return (thread_s() - t0) / ((double)UOP_ITERS * 24.0);                                     \
    }
UOPS(UOP_FN)
#define UOP_PTR(id, name, body) uop_##id,
static double (*const uop_fns[N_UOPS])(void) = {UOPS(UOP_PTR)};

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
    /* unsigned: the lanes hold whatever the chains summed, and a signed sum may overflow */
    volatile unsigned long long sink = (unsigned long long)c0[0] + (unsigned long long)c1[1] +
                                       (unsigned long long)c2[2] + (unsigned long long)c3[3] +
                                       (unsigned long long)c4[0] + (unsigned long long)c5[1];
    (void)sink;
    return dt;
}

#define DPBF16(W, i) "vdpbf16ps %%" #W "mm13, %%" #W "mm12, %%" #W "mm" #i "\n\t"

/* seconds per vdpbf16ps zmm (fma 0) or vfmadd231ps zmm (fma 1), 12 chains as UOP_FN's */
__attribute__((target("avx512f,avx512bf16"))) static double zmm_s(int fma)
{
    const double t0 = thread_s();
    for (long i = 0; i < UOP_ITERS; i++) {
        if (fma)
            __asm__ volatile(UOP_ZERO R12(FMA, z) R12(FMA, z)::: UOP_CLOBBERS);
        else
            __asm__ volatile(UOP_ZERO R12(DPBF16, z) R12(DPBF16, z)::: UOP_CLOBBERS);
    }
    return (thread_s() - t0) / ((double)UOP_ITERS * 24.0);
}

/* One run of every probe (zeros without AVX2 + FMA). */
static mul_probe mul_probe_run(int avx2)
{
    mul_probe p = {{0}};
    if (!avx2) return p;
    const double c0 = cycle_s();
    double t[N_UOPS];
    for (int i = 0; i < N_UOPS; i++) t[i] = uop_fns[i]();
    const double dot = dot8_s(0), mix = dot8_s(1);
    const int bf16 = __builtin_cpu_supports("avx512bf16");
    const double tz_bf16 = bf16 ? zmm_s(0) : 0.0, tz_fma = bf16 ? zmm_s(1) : 0.0;
    const double c = (c0 + cycle_s()) / 2;  /* the clock, before and after */
    const double n = (double)MUL_ITERS * c; /* MUL_ITERS cycles, in seconds */
    p.v[MP_GHZ] = 1e-9 / c;
    for (int i = 0; i < N_UOPS; i++) p.v[MP_UOP + i] = c / t[i];
    p.v[MP_DOT8] = 6 * n / dot;
    p.v[MP_MIXED_FMA] = 4 * n / mix;
    p.v[MP_MIXED_DOT8] = 2 * n / mix;
    p.v[MP_BF16_Z] = bf16 ? c / tz_bf16 : 0.0;
    p.v[MP_FMA_Z] = bf16 ? c / tz_fma : 0.0;
    return p;
}
#else
static mul_probe mul_probe_run(int avx2)
{
    (void)avx2;
    return (mul_probe){{0}};
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
        int at;
    } f[] = {
        {"ghz", "clock (dependent adds per ns)", MP_GHZ},
        {"fma_per_cycle", "vfmadd231ps ymm per cycle", MP_UOP + UOP_fma_y},
        {"maddubs_per_cycle", "vpmaddubsw ymm per cycle", MP_UOP + UOP_maddubs_y},
        {"madd_per_cycle", "vpmaddwd ymm per cycle", MP_UOP + UOP_maddwd_y},
        {"dot8_per_cycle", "8-bit dots of 32 (maddubs+madd+add)/cycle", MP_DOT8},
        {"mixed_fma_per_cycle", "mixed 2 FMA : 1 dot: FMAs per cycle", MP_MIXED_FMA},
        {"mixed_dot8_per_cycle", "mixed 2 FMA : 1 dot: dots per cycle", MP_MIXED_DOT8},
        {"bf16_dot_per_cycle", "vdpbf16ps zmm per cycle (AVX-512 BF16)", MP_BF16_Z},
        {"fma_zmm_per_cycle", "vfmadd231ps zmm per cycle (where BF16 is)", MP_FMA_Z},
    };
    const int nf = (int)(sizeof f / sizeof f[0]);
    stat3 st[MP_N];
    for (int i = 0; i < MP_N; i++) {
        double v[64];
        for (int r = 0; r < n; r++) v[r] = runs[r].v[i];
        st[i] = stats(v, n);
    }
    /* products per cycle: an FMA 8 float multiply-adds, a dot 32 byte products */
    const double fma_p = 8 * st[MP_UOP + UOP_fma_y].median, dot_p = 32 * st[MP_DOT8].median,
                 mix_p = 8 * st[MP_MIXED_FMA].median + 32 * st[MP_MIXED_DOT8].median;
    /* one core's BF16 dot peak: 32 products (64 flops) per vdpbf16ps zmm, at the clock */
    const double bf16_p = 32 * st[MP_BF16_Z].median, bf16_gf = 2 * bf16_p * st[MP_GHZ].median;
    if (json) {
        printf("\"mul_probe\":{");
        for (int i = 0; i < nf; i++)
            printf("\"%s\":{\"median\":%.3f,\"lowest\":%.3f,\"highest\":%.3f},", f[i].key,
                   st[f[i].at].median, st[f[i].at].lowest, st[f[i].at].highest);
        printf("\"products_per_cycle\":{\"fma_f32\":%.2f,\"dot8\":%.2f,\"mixed\":%.2f,"
               "\"bf16\":%.2f},\"bf16_peak_gflop_s_1core\":%.1f,",
               fma_p, dot_p, mix_p, bf16_p, bf16_gf);
        printf("\"instructions_per_cycle\":{");
        for (int i = 0; i < N_UOPS; i++) {
            const stat3 *s = &st[MP_UOP + i];
            printf("%s\"%s\":{\"median\":%.3f,\"lowest\":%.3f,\"highest\":%.3f}", i ? "," : "",
                   uop_names[i], s->median, s->lowest, s->highest);
        }
        printf("}}");
        return;
    }
    printf("  multiply units, 1 thread, its CPU time (medians [lowest, highest]):\n");
    for (int i = 0; i < nf; i++)
        printf("    %-44s %7.3f [%.3f, %.3f]\n", f[i].what, st[f[i].at].median, st[f[i].at].lowest,
               st[f[i].at].highest);
    printf("    products per cycle: f32 FMA %.1f, 8-bit dot %.1f, mixed %.1f, bf16 dot %.1f\n",
           fma_p, dot_p, mix_p, bf16_p);
    printf("    BF16 dot peak, 1 core: %.1f GFLOP/s (vdpbf16ps zmm x 64 flops x clock)\n", bf16_gf);
    printf("  instructions, 12 independent results each (a pair alternates its two):\n");
    printf("    %-32s %9s %16s %12s\n", "instruction(s)", "per cycle", "[lowest, highest]",
           "cycles each");
    for (int i = 0; i < N_UOPS; i++) {
        const stat3 *s = &st[MP_UOP + i];
        printf("    %-32s %9.2f   [%5.2f, %5.2f] %12.2f\n", uop_names[i], s->median, s->lowest,
               s->highest, s->median > 0 ? 1.0 / s->median : 0.0);
    }
}

/* Bytes of [p, p + bytes) that lie on huge pages: the AnonHugePages of the mapping that holds
 * p (/proc/self/smaps), at most bytes; -1 where it cannot be read. A buffer that did not get
 * its 2 MiB pages (memory too fragmented, transparent huge pages off) reads slower than the
 * weights that did, and the probe says so. */
static long long rd_huge_bytes(const void *p, size_t bytes)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int inside = 0;
    long long kib = -1;
    const unsigned long at = (unsigned long)(uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = at >= lo && at < hi;
            continue;
        }
        if (inside && sscanf(line, "AnonHugePages: %lld kB", &kib) == 1) break;
    }
    fclose(f);
    if (kib < 0) return -1;
    return kib * 1024 > (long long)bytes ? (long long)bytes : kib * 1024;
}

/* ---- the read figures: measured, reported -------------------------------------------- */

typedef struct read_result {
    stat3 simple;               /* the simple reader */
    stat3 layout[RD_N_LAYOUTS]; /* each layout */
    int best;                   /* the layout with the highest median */
} read_result;

/* repeats of the simple reader and every layout, in turns (each repeat starts one further
 * along, so no reader always comes first or last) */
static read_result read_measure(const char *buf, size_t bytes, int threads, int repeats)
{
    static double v[RD_N_LAYOUTS + 1][64];
    for (int r = 0; r < repeats; r++)
        for (int i = 0; i <= RD_N_LAYOUTS; i++) {
            const int which = (i + r) % (RD_N_LAYOUTS + 1); /* 0: simple, else layout which-1 */
            v[which][r] = read_gbs(buf, bytes, threads, which ? &rd_layouts[which - 1] : NULL);
        }
    read_result out = {.simple = stats(v[0], repeats), .best = 0};
    for (int l = 0; l < RD_N_LAYOUTS; l++) {
        out.layout[l] = stats(v[l + 1], repeats);
        if (out.layout[l].median > out.layout[out.best].median) out.best = l;
    }
    return out;
}

static const char *rd_isa(void)
{
#if defined(__x86_64__)
    return rd_avx512 ? "avx512" : "avx2";
#else
    return "portable";
#endif
}

/* The read figures: JSON members (no braces around, no comma after) or lines of text. */
static void read_report(const read_result *r, int json, int mib, int small_pages, double huge_share)
{
    char name[96];
    const rd_layout *bl = &rd_layouts[r->best];
    const stat3 *b = &r->layout[r->best];
    rd_layout_name(bl, name, sizeof name);
    if (json) {
        printf("\"read_pages\":\"%s\",\"read_mib\":%d,\"read_huge_page_share\":%.2f,"
               "\"read_gb_s\":{\"median\":%.2f,\"lowest\":%.2f,\"highest\":%.2f},"
               "\"read_best\":{\"layout\":\"%s\",\"streams\":%d,\"prefetch_bytes\":%d,"
               "\"share\":\"%s\",\"isa\":\"%s\","
               "\"gb_s\":{\"median\":%.2f,\"lowest\":%.2f,\"highest\":%.2f}},"
               "\"read_layouts\":[",
               small_pages ? "4KiB" : "2MiB", mib, huge_share, r->simple.median, r->simple.lowest,
               r->simple.highest, name, bl->streams, bl->prefetch_bytes,
               bl->interleaved ? "interleaved" : "contiguous", rd_isa(), b->median, b->lowest,
               b->highest);
        for (int l = 0; l < RD_N_LAYOUTS; l++) {
            const rd_layout *x = &rd_layouts[l];
            rd_layout_name(x, name, sizeof name);
            printf("%s{\"layout\":\"%s\",\"streams\":%d,\"prefetch_bytes\":%d,\"share\":\"%s\","
                   "\"gb_s\":{\"median\":%.2f,\"lowest\":%.2f,\"highest\":%.2f}}",
                   l ? "," : "", name, x->streams, x->prefetch_bytes,
                   x->interleaved ? "interleaved" : "contiguous", r->layout[l].median,
                   r->layout[l].lowest, r->layout[l].highest);
        }
        printf("]");
        return;
    }
    printf("  read bandwidth (%d MiB, %s pages asked, %.0f%% on 2 MiB pages), the best of %d "
           "layouts (%s loads):\n",
           mib, small_pages ? "4 KiB" : "2 MiB", huge_share * 100, RD_N_LAYOUTS, rd_isa());
    printf("    %-46s %8.2f GB/s     [%.2f, %.2f]\n", name, b->median, b->lowest, b->highest);
    printf("  read bandwidth, simple (1 stream a thread, contiguous, 32-byte sums):\n");
    printf("    %-46s %8.2f GB/s     [%.2f, %.2f]\n", "", r->simple.median, r->simple.lowest,
           r->simple.highest);
    printf("  every layout:\n");
    for (int l = 0; l < RD_N_LAYOUTS; l++) {
        rd_layout_name(&rd_layouts[l], name, sizeof name);
        printf("    %-46s %8.2f GB/s     [%.2f, %.2f]\n", name, r->layout[l].median,
               r->layout[l].lowest, r->layout[l].highest);
    }
}

int main(int argc, char **argv)
{
    blas_core_fix(argv); /* OpenBLAS's kernels as ringlmd runs them (kernels/cpu/blas_core.h) */
    int threads = 2, repeats = 5, json = 0, mib = 1024, mul_only = 0, read_only = 0,
        small_pages = 0;
    static const struct option opts[] = {
        {"threads", required_argument, 0, 't'}, {"repeats", required_argument, 0, 'r'},
        {"mib", required_argument, 0, 'm'},     {"json", no_argument, 0, 'j'},
        {"mul", no_argument, 0, 'u'},           {"read", no_argument, 0, 'R'},
        {"small-pages", no_argument, 0, 's'},   {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "t:r:m:juRs", opts, NULL)) != -1) {
        switch (ch) {
        case 't': threads = atoi(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        case 'm': mib = atoi(optarg); break;
        case 'j': json = 1; break;
        case 'u': mul_only = 1; break;
        case 'R': read_only = 1; break;
        case 's': small_pages = 1; break;
        default:
            fprintf(stderr, "usage: machine_probe [--threads N] [--repeats R] [--mib M] [--json] "
                            "[--mul | --read] [--small-pages]\n");
            return 2;
        }
    }
    if (threads < 1 || threads > 64 || repeats < 1 || repeats > 64 || mib < 64 ||
        (mul_only && read_only)) {
        fprintf(stderr, "machine_probe: --threads 1..64, --repeats 1..64, --mib >= 64, "
                        "--mul or --read\n");
        return 2;
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    rd_avx512 = __builtin_cpu_supports("avx512f");
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
        for (int r = 0; r < repeats; r++) mp[r] = mul_probe_run(avx2);
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
    /* a whole number of interleaved turns (every layout reads the same bytes) */
    const size_t turn = RD_CHUNK * (size_t)threads;
    const size_t bytes = ((size_t)mib << 20) / turn * turn;
    /* 2 MiB-aligned, advised onto huge pages unless --small-pages (ringlmd reads its weights
     * on huge pages: gguf_open_weights) */
    char *buf = aligned_alloc((size_t)2 << 20, bytes);
    if (buf && !small_pages) (void)madvise(buf, bytes, MADV_HUGEPAGE);
    if (!buf) {
        fprintf(stderr, "machine_probe: out of memory\n");
        return 1;
    }
    memset(buf, 0, bytes);
    const long long huge = rd_huge_bytes(buf, bytes);
    const double huge_share = huge < 0 ? -1.0 : (double)huge / (double)bytes;
    if (read_only) {
        const read_result rr = read_measure(buf, bytes, threads, repeats);
        if (json) {
            printf("{\"threads\":%d,\"repeats\":%d,\"cpu_features\":\"%s\",", threads, repeats,
                   features);
            read_report(&rr, 1, mib, small_pages, huge_share);
            printf("}\n");
        } else {
            printf("machine_probe --read, %d threads, medians of %d [lowest, highest]\n", threads,
                   repeats);
            printf("  cpu features:                  %s\n", features);
            read_report(&rr, 0, mib, small_pages, huge_share);
        }
        free(buf);
        return 0;
    }
    const int M = 1024, pm = 256, pk = 768;
    float *a = malloc((size_t)M * M * sizeof(float)), *b = malloc((size_t)M * M * sizeof(float)),
          *c = malloc((size_t)M * M * sizeof(float));
    if (!a || !b || !c) {
        fprintf(stderr, "machine_probe: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)M * M; i++) {
        a[i] = (float)(i % 97) * 1e-3f;
        b[i] = (float)(i % 89) * 1e-3f;
    }
    const read_result rr = read_measure(buf, bytes, threads, repeats);
    double fm[64], sg[64], sp[64];
    for (int r = 0; r < repeats; r++) {
        fm[r] = avx2 ? fma_gflops(threads) : 0.0;
        sg[r] = sgemm_gflops(M, M, M, threads, a, b, c);
        sp[r] = sgemm_gflops(pm, pk, pk, 1, a, b, c);
        mp[r] = mul_probe_run(avx2);
    }
    stat3 sfm = stats(fm, repeats), ssg = stats(sg, repeats), ssp = stats(sp, repeats);
    const char *core = openblas_get_corename();
    if (json) {
        printf("{\"threads\":%d,\"repeats\":%d,\"cpu_features\":\"%s\",\"openblas_core\":\"%s\",",
               threads, repeats, features, core ? core : "?");
        read_report(&rr, 1, mib, small_pages, huge_share);
        printf(",\"fma_f32_gflop_s\":{\"median\":%.1f,\"lowest\":%.1f,\"highest\":%.1f},"
               "\"sgemm_1024_gflop_s\":{\"median\":%.1f,\"lowest\":%.1f,\"highest\":%.1f},"
               "\"sgemm_256x768x768_1thread_gflop_s\":{\"median\":%.1f,\"lowest\":%.1f,"
               "\"highest\":%.1f},",
               sfm.median, sfm.lowest, sfm.highest, ssg.median, ssg.lowest, ssg.highest, ssp.median,
               ssp.lowest, ssp.highest);
        mul_report(mp, repeats, 1);
        printf("}\n");
    } else {
        printf("machine_probe, %d threads, medians of %d [lowest, highest]\n", threads, repeats);
        printf("  cpu features:                  %s\n", features);
        printf("  OpenBLAS core:                 %s\n", core ? core : "?");
        read_report(&rr, 0, mib, small_pages, huge_share);
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
