/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/gemm_f32.c — y = beta * y + x · w^T for prefill, weights F32/F16/BF16, AVX2 +
 * FMA + F16C (see gemm_f32.h for the contract).
 *
 * Blocking (BLIS's order): for each block of MB activation rows (one pass over the weights),
 * for each block of NC weight rows and KC elements of k, the weight block is converted and
 * packed into panels of NR = 16 rows, k-major (panel[k][16]: the 16 weights that multiply
 * x[.][k]); then for each block of MC activation rows, for each panel,
 * the 6 x 16 tile runs over the block's k: per k, two vectors of weights, six broadcast
 * activations, twelve multiply-adds. A panel (16 KiB) stays in L1 while the MC rows pass;
 * the packed block (NC x KC floats, 128 KiB) and the activation block (MC x KC, 72 KiB) stay
 * in L2. The activations are read where they lie (six rows at a time, each broadcast), not
 * packed. Packing transposes 8 x 8 blocks in registers, converting F16 with F16C and BF16 by
 * a shift on the way.
 */
#include "kernels/cpu/gemm_f32.h"

#include "kernels/cpu/gemm_pack.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_internal.h" /* blk_q8_0: Q8_0 rows are packed where they lie */

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WT_F32  0
#define WT_F16  1
#define WT_BF16 30
#define WT_Q8_0 8 /* packed from its blocks directly, not through q_dequant_row */

gemm_f32_mode gemm_f32_mode_get(void)
{
    static int mode = -1; /* every thread computes the same value: relaxed atomics */
    int m = __atomic_load_n(&mode, __ATOMIC_RELAXED);
    if (m < 0) {
        const char *e = getenv("RINGLM_PREFILL_GEMM");
        m = e && strcmp(e, "blas") == 0   ? GEMM_F32_BLAS
            : e && strcmp(e, "own") == 0  ? GEMM_F32_OWN
            : e && strcmp(e, "bf16") == 0 ? GEMM_F32_BF16
                                          : GEMM_F32_AUTO;
        __atomic_store_n(&mode, m, __ATOMIC_RELAXED);
    }
    return (gemm_f32_mode)m;
}

#define KC 256 /* k per packed block */
/* Activation rows per pass over the weights: their blocks of KC (288 KiB) stay in L2 while
 * every panel of the weights passes; the panels are packed again for each pass (1/MB of the
 * products' work). Without it a prefill of 1024 rows read its activations from L3 for every
 * block of NC weight rows (perf/gemm_bench --prefill, stories110M, 1024 rows, Zen 4 at load
 * 4-5: 0.88-0.93x SGEMM before, 0.98-1.09x after). Which rows share a tile does not change a
 * row's sums: the same bits. */
#define MB 288
/* Quantized weight types whose blocks tile K and KC (every block is 32 or 256 elements). */
static bool quantized_ok(int wtype, int K)
{
    if (wtype == WT_F32 || wtype == WT_F16 || wtype == WT_BF16 || !q_type_supported(wtype))
        return false;
    const int be = q_block_elems(wtype);
    return be > 1 && KC % be == 0 && K % be == 0;
}

/* ---- the per-thread packing buffer (gemm_pack.h) -------------------------------------- */

static pthread_key_t buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;

static void buf_key_init(void)
{
    if (pthread_key_create(&buf_key, free)) buf_key = 0;
}

void *gemm_pack_buf(void)
{
    pthread_once(&buf_once, buf_key_init);
    void *p = pthread_getspecific(buf_key);
    if (!p) {
        if (posix_memalign(&p, 64, GEMM_PACK_BUF_BYTES)) return NULL;
        if (pthread_setspecific(buf_key, p)) {
            free(p);
            return NULL;
        }
    }
    return p;
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

#define MR 6
#define NR 16
#define MC 72 /* a multiple of MR */
#define NC 128

static bool cpu_has_avx512f(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

/* AMD family 0x19 with AVX-512: Zen 4, whose 512-bit FMA takes both 256-bit pipes (one per
 * cycle, as two AVX2 FMAs: perf/machine_probe --mul), so AVX2 tiles reach its float peak. */
static bool cpu_splits_512bit_fma(void)
{
    unsigned a, b, c, d;
    if (!cpu_has_avx512f() || !__builtin_cpu_is("amd") || !__get_cpuid(1, &a, &b, &c, &d))
        return false;
    const unsigned family = ((a >> 8) & 0xF) + ((a >> 8 & 0xF) == 0xF ? (a >> 20) & 0xFF : 0);
    return family == 0x19;
}

bool gemm_f32_supported(void)
{
    static int ok = -1; /* every thread computes the same value: relaxed atomics */
    int v = __atomic_load_n(&ok, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
            __builtin_cpu_supports("f16c");
        __atomic_store_n(&ok, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* ---- packing ---------------------------------------------------------------------------- */

static inline AVX2 float half_to_f32(int wtype, const void *row, int k)
{
    switch (wtype) {
    case WT_F16: {
        uint16_t h = ((const uint16_t *)row)[k];
        return _cvtsh_ss(h);
    }
    case WT_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)row)[k] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case WT_Q8_0: { /* d x q, as qk_dequant_q8_0 */
        const blk_q8_0 *b = (const blk_q8_0 *)row + k / 32;
        return _cvtsh_ss(b->d) * (float)b->qs[k % 32];
    }
    default: return ((const float *)row)[k];
    }
}

/* 8 elements k.. of a row as floats */
static inline __attribute__((always_inline)) AVX2 __m256 load8(int wtype, const void *row, int k)
{
    if (wtype == WT_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
    if (wtype == WT_BF16) {
        __m256i v =
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    if (wtype == WT_Q8_0) { /* k a multiple of 8: within one block; d x q as qk_dequant_q8_0 */
        const blk_q8_0 *b = (const blk_q8_0 *)row + k / 32;
        const __m128i q8 = _mm_loadl_epi64((const __m128i *)(b->qs + k % 32));
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)),
                             _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)));
    }
    return _mm256_loadu_ps((const float *)row + k);
}

/* out[kk * NR + j] = w_j[k0 + kk] for rows j < 8 of rows[] (all present), kk < 8 */
static inline __attribute__((always_inline)) AVX2 void pack8x8(int wtype, const void *const *rows,
                                                               int k, float *out)
{
    gemm_tr8x8(load8(wtype, rows[0], k), load8(wtype, rows[1], k), load8(wtype, rows[2], k),
               load8(wtype, rows[3], k), load8(wtype, rows[4], k), load8(wtype, rows[5], k),
               load8(wtype, rows[6], k), load8(wtype, rows[7], k), out, NR);
}

/* One panel: out[kk * NR + j] = w_j[k0 + kk] for j < nr, 0 for nr <= j < NR, kk < kc. */
static inline __attribute__((always_inline)) AVX2 void
pack_panel_t(int wtype, const char *w, size_t rb, int nr, int k0, int kc, float *out)
{
    const void *rows[NR];
    for (int j = 0; j < nr; j++) rows[j] = w + (size_t)j * rb;
    const int kc8 = kc & ~7;
    for (int g = 0; g < NR; g += 8) {
        if (g + 8 <= nr) {
            for (int kk = 0; kk < kc8; kk += 8)
                pack8x8(wtype, rows + g, k0 + kk, out + kk * NR + g);
            for (int kk = kc8; kk < kc; kk++)
                for (int j = 0; j < 8; j++)
                    out[kk * NR + g + j] = half_to_f32(wtype, rows[g + j], k0 + kk);
        } else {
            for (int kk = 0; kk < kc; kk++)
                for (int j = 0; j < 8; j++)
                    out[kk * NR + g + j] =
                        g + j < nr ? half_to_f32(wtype, rows[g + j], k0 + kk) : 0.0f;
        }
    }
}

/* Quantized weights: the panel's rows dequantized (whole blocks: k0 and kc are multiples of
 * the block), then packed as F32 rows kc floats long; Q8_0 straight from its blocks (d x q
 * converted 8 at a time as the rows are transposed: the same floats, without the round trip
 * through scratch, which cost 7-13% of a 768-wide product at 256 rows). */
static AVX2 void pack_panel(int wtype, const char *w, size_t rb, int nr, int k0, int kc, float *out,
                            float *scratch)
{
    switch (wtype) {
    case WT_F16: pack_panel_t(WT_F16, w, rb, nr, k0, kc, out); break;
    case WT_BF16: pack_panel_t(WT_BF16, w, rb, nr, k0, kc, out); break;
    case WT_F32: pack_panel_t(WT_F32, w, rb, nr, k0, kc, out); break;
    case WT_Q8_0: pack_panel_t(WT_Q8_0, w, rb, nr, k0, kc, out); break;
    default: {
        const int be = q_block_elems(wtype);
        const size_t at = (size_t)(k0 / be) * q_row_bytes(wtype, be);
        for (int j = 0; j < nr; j++)
            q_dequant_row(wtype, w + (size_t)j * rb + at, scratch + (size_t)j * kc, kc);
        pack_panel_t(WT_F32, (const char *)scratch, (size_t)kc * sizeof(float), nr, 0, kc, out);
        break;
    }
    }
}


/* ---- the 6 x 16 tile -------------------------------------------------------------------- */

/* y[i][0..nr) (+)= Σ_kk a[i][kk] · b[kk][0..nr) for i < mr (a compile-time constant at each
 * call site). The twelve accumulators are named variables, not an array, so that GCC keeps
 * them in registers (with an array it spilled them to the stack on every k: half the speed). */
#define ROW_FMA(i)                                                                                 \
    if (mr > i) {                                                                                  \
        const __m256 av = _mm256_broadcast_ss(a + (size_t)(i)*ld_a + kk);                          \
        c##i##0 = _mm256_fmadd_ps(av, b0, c##i##0);                                                \
        c##i##1 = _mm256_fmadd_ps(av, b1, c##i##1);                                                \
    }
#define ROW_STORE(i)                                                                               \
    if (mr > i) {                                                                                  \
        float *yi = y + (size_t)(i)*ld_y;                                                          \
        if (nr == NR) {                                                                            \
            if (acc) {                                                                             \
                c##i##0 = _mm256_add_ps(c##i##0, _mm256_loadu_ps(yi));                             \
                c##i##1 = _mm256_add_ps(c##i##1, _mm256_loadu_ps(yi + 8));                         \
            }                                                                                      \
            _mm256_storeu_ps(yi, c##i##0);                                                         \
            _mm256_storeu_ps(yi + 8, c##i##1);                                                     \
        } else {                                                                                   \
            float t[NR];                                                                           \
            _mm256_storeu_ps(t, c##i##0);                                                          \
            _mm256_storeu_ps(t + 8, c##i##1);                                                      \
            for (int j = 0; j < nr; j++) yi[j] = acc ? yi[j] + t[j] : t[j];                        \
        }                                                                                          \
    }

static inline __attribute__((always_inline)) AVX2 void
tile(int mr, int kc, const float *a, int ld_a, const float *b, float *y, int ld_y, int nr, bool acc)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
           c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int kk = 0; kk < kc; kk++) {
        const __m256 b0 = _mm256_load_ps(b + kk * NR), b1 = _mm256_load_ps(b + kk * NR + 8);
        ROW_FMA(0)
        ROW_FMA(1)
        ROW_FMA(2)
        ROW_FMA(3)
        ROW_FMA(4)
        ROW_FMA(5)
    }
    ROW_STORE(0)
    ROW_STORE(1)
    ROW_STORE(2)
    ROW_STORE(3)
    ROW_STORE(4)
    ROW_STORE(5)
}

static AVX2 void tile_mr(int mr, int kc, const float *a, int ld_a, const float *b, float *y,
                         int ld_y, int nr, bool acc)
{
    switch (mr) {
    case 6: tile(6, kc, a, ld_a, b, y, ld_y, nr, acc); break;
    case 5: tile(5, kc, a, ld_a, b, y, ld_y, nr, acc); break;
    case 4: tile(4, kc, a, ld_a, b, y, ld_y, nr, acc); break;
    case 3: tile(3, kc, a, ld_a, b, y, ld_y, nr, acc); break;
    case 2: tile(2, kc, a, ld_a, b, y, ld_y, nr, acc); break;
    default: tile(1, kc, a, ld_a, b, y, ld_y, nr, acc); break;
    }
}

static void blocked(int wtype, int M, int N, int K, const float *x, int ld_x, const void *w,
                    size_t w_row_bytes, float beta, float *y, int ld_y, float *buf);

bool gemm_f32(int wtype, int M, int N, int K, const float *x, int ld_x, const void *w,
              size_t w_row_bytes, float beta, float *y, int ld_y)
{
    if (!gemm_f32_supported() ||
        (wtype != WT_F32 && wtype != WT_F16 && wtype != WT_BF16 && !quantized_ok(wtype, K)))
        return false;
    if (M <= 0 || N <= 0) return true;
    _Static_assert((size_t)(NC + NR) * KC * sizeof(float) <= GEMM_PACK_BUF_BYTES, "buffer");
    float *buf = gemm_pack_buf();
    if (!buf) return false;
    for (int mb0 = 0; mb0 < M; mb0 += MB)
        blocked(wtype, M - mb0 < MB ? M - mb0 : MB, N, K, x + (size_t)mb0 * ld_x, ld_x, w,
                w_row_bytes, beta, y + (size_t)mb0 * ld_y, ld_y, buf);
    return true;
}

/* gemm_f32 on one block of at most MB rows, buf: gemm_pack_buf() */
static AVX2 void blocked(int wtype, int M, int N, int K, const float *x, int ld_x, const void *w,
                         size_t w_row_bytes, float beta, float *y, int ld_y, float *buf)
{
    for (int jc = 0; jc < N; jc += NC) {
        const int nc = N - jc < NC ? N - jc : NC;
        for (int pc = 0; pc < K; pc += KC) {
            const int kc = K - pc < KC ? K - pc : KC;
            const bool acc = pc > 0 || beta != 0.0f;
            for (int jr = 0; jr < nc; jr += NR)
                pack_panel(wtype, (const char *)w + (size_t)(jc + jr) * w_row_bytes, w_row_bytes,
                           nc - jr < NR ? nc - jr : NR, pc, kc, buf + (size_t)jr * kc,
                           buf + (size_t)NC * KC);
            for (int ic = 0; ic < M; ic += MC) {
                const int mc = M - ic < MC ? M - ic : MC;
                for (int jr = 0; jr < nc; jr += NR) {
                    const int nr = nc - jr < NR ? nc - jr : NR;
                    const float *b = buf + (size_t)jr * kc;
                    for (int ir = 0; ir < mc; ir += MR)
                        tile_mr(mc - ir < MR ? mc - ir : MR, kc, x + (size_t)(ic + ir) * ld_x + pc,
                                ld_x, b, y + (size_t)(ic + ir) * ld_y + jc + jr, ld_y, nr, acc);
                }
            }
        }
    }
}

#else /* not x86-64: SGEMM takes every prefill product */

static bool cpu_has_avx512f(void)
{
    return false;
}

static bool cpu_splits_512bit_fma(void)
{
    return false;
}

bool gemm_f32_supported(void)
{
    return false;
}

bool gemm_f32(int wtype, int M, int N, int K, const float *x, int ld_x, const void *w,
              size_t w_row_bytes, float beta, float *y, int ld_y)
{
    (void)wtype, (void)M, (void)N, (void)K, (void)x, (void)ld_x, (void)w, (void)w_row_bytes;
    (void)beta, (void)y, (void)ld_y;
    return false;
}

#endif

bool gemm_f32_prefer(int wtype, int M, int N, int K)
{
    if (!gemm_f32_supported()) return false;
    switch (gemm_f32_mode_get()) {
    case GEMM_F32_BLAS: return false;
    case GEMM_F32_OWN: return true;
    default: break;
    }
    if (wtype == WT_F16 || wtype == WT_BF16) return true;
    /* Quantized weights above the integer path's rows (quant.h): dequantized into these
     * panels rather than into float tiles that SGEMM packs again (perf/gemm_bench --prefill
     * --type Q8_0|Q4_K|Q6_K); with AVX-512, SGEMM's wider kernels as for F32, but on Zen 4
     * (below): the types that take neither the integer path nor its tiles there, Q2_K and
     * Q3_K, prefill 1.09-1.16x faster in these panels than through SGEMM (engine_bench
     * --prefill 256, one thread, CPU time, against RINGLM_PREFILL_GEMM=blas). */
    if (wtype != WT_F32)
        return quantized_ok(wtype, K) && (!cpu_has_avx512f() || cpu_splits_512bit_fma());
    /* F32: on AVX2 machines these tiles match or beat OpenBLAS's AVX2 SGEMM at every prefill
     * shape measured (perf/gemm_bench --prefill on the 2-vCPU EPYC: 1.0-1.2x on 768 x 2048
     * products, 2.6-2.9x on the 192-row chunks of 768 x 768 ones, M = 13..1024). Where the CPU
     * has AVX-512, OpenBLAS runs its SkylakeX/Cooperlake kernels (blas_core.h), twice as wide:
     * on a core with two 512-bit FMA pipes (Intel's) twice the peak of these tiles, so SGEMM
     * takes F32 there. Zen 4 splits each 512-bit FMA over its two 256-bit pipes: the same
     * peak, and these tiles match or beat SGEMM on the projections (perf/gemm_bench --prefill
     * --cls, stories110M, 64-1024 rows: 0.98-1.21x, 1.06-1.13x at 256), but not on a
     * classifier-sized matrix (N = 32000, 98 MB of F32, read once per MB rows) at 1024 rows:
     * 0.93x. */
    (void)K;
    if (!cpu_has_avx512f()) return true;
    return cpu_splits_512bit_fma() && !(M > MB && N >= 8192);
}
