/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant.c — the weight types' table, the instruction set the kernels run on
 * (chosen once at run time, capped by tests and the environment), and the entry points that
 * dispatch to each family's kernels: dequantize, the fused dot, and q_matmul (fused dots for
 * a few rows, integer dots with 8-bit activations, or dequantized tiles and SGEMM). The
 * kernels are in quant_<family>.c, what they share in quant_internal.h; quant.h has the
 * block layouts.
 */
#include "kernels/cpu/blas.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_small.h"
#include "kernels/cpu/quant_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* ---- types -------------------------------------------------------------------------- */

/* The types of quant_unpack.c (qk_is_unpacked) in blocks of 32. */
static bool is_legacy(int type)
{
    return type == Q_Q4_0 || type == Q_Q4_1 || type == Q_Q5_0 || type == Q_Q5_1 || type == Q_IQ4_NL;
}

bool q_type_supported(int type)
{
    return type == Q_F32 || type == Q_F16 || type == Q_BF16 || type == Q_Q8_0 || type == Q_Q4_K ||
           type == Q_Q6_K || qk_is_unpacked(type);
}

int q_block_elems(int type)
{
    if (is_legacy(type)) return 32;
    switch (type) {
    case Q_Q8_0: return 32;
    case Q_Q2_K:
    case Q_Q3_K:
    case Q_Q5_K:
    case Q_IQ4_XS:
    case Q_Q4_K:
    case Q_Q6_K: return QK_K;
    default: return 1;
    }
}

size_t q_row_bytes(int type, int64_t k)
{
    switch (type) {
    case Q_F32: return (size_t)k * 4;
    case Q_F16:
    case Q_BF16: return (size_t)k * 2;
    case Q_Q8_0: return (size_t)k / 32 * sizeof(blk_q8_0);
    case Q_Q4_0:
    case Q_IQ4_NL: return (size_t)k / 32 * sizeof(blk_q4_0);
    case Q_Q4_1: return (size_t)k / 32 * sizeof(blk_q4_1);
    case Q_Q5_0: return (size_t)k / 32 * sizeof(blk_q5_0);
    case Q_Q5_1: return (size_t)k / 32 * sizeof(blk_q5_1);
    case Q_Q4_K: return (size_t)k / QK_K * sizeof(blk_q4_k);
    case Q_Q6_K: return (size_t)k / QK_K * sizeof(blk_q6_k);
    case Q_Q2_K: return (size_t)k / QK_K * sizeof(blk_q2_k);
    case Q_Q3_K: return (size_t)k / QK_K * sizeof(blk_q3_k);
    case Q_Q5_K: return (size_t)k / QK_K * sizeof(blk_q5_k);
    case Q_IQ4_XS: return (size_t)k / QK_K * sizeof(blk_iq4_xs);
    default: return 0;
    }
}

/* ---- dequantize --------------------------------------------------------------------- */

void q_dequant_row(int type, const void *row, float *out, int64_t k)
{
    switch (type) {
    case Q_F32: memcpy(out, row, (size_t)k * 4); break;
    case Q_F16: {
        const uint16_t *h = row;
        for (int64_t i = 0; i < k; i++) out[i] = qk_f16_to_f32(h[i]);
        break;
    }
    case Q_BF16: {
        const uint16_t *h = row;
        for (int64_t i = 0; i < k; i++) out[i] = qk_bf16_to_f32(h[i]);
        break;
    }
    case Q_Q8_0: qk_dequant_q8_0(row, out, k); break;
    case Q_Q4_K: qk_dequant_q4_k(row, out, k); break;
    case Q_Q6_K: qk_dequant_q6_k(row, out, k); break;
    default:
        if (qk_is_unpacked(type)) qk_dequant_unpacked(type, row, out, k);
        break;
    }
}

/* ---- fused dot ---------------------------------------------------------------------- */

static float dot_portable(int type, const void *row, const float *x, int64_t k)
{
    switch (type) {
    case Q_Q8_0: return qk_dot_q8_0_portable(row, x, k);
    case Q_Q4_K: return qk_dot_q4_k_portable(row, x, k);
    case Q_Q6_K: return qk_dot_q6_k_portable(row, x, k);
    default:
        return qk_is_unpacked(type) ? qk_dot_unpacked(type, row, x, k)
                                    : qk_dot_float_portable(type, row, x, k);
    }
}

#if QK_X86
static float dot_avx2(int type, const void *row, const float *x, int64_t k)
{
    switch (type) {
    case Q_Q8_0: return qk_dot_q8_0_avx2(row, x, k);
    case Q_Q4_K: return qk_dot_q4_k_avx2(row, x, k);
    case Q_Q6_K: return qk_dot_q6_k_avx2(row, x, k);
    default:
        return qk_is_unpacked(type) ? qk_dot_unpacked(type, row, x, k)
                                    : qk_dot_float_avx2(type, row, x, k);
    }
}
#endif

/* The fused dot of the instruction set in use. */
static float dot_isa(bool simd, int type, const void *row, const float *x, int64_t k)
{
#if QK_X86
    if (simd) return dot_avx2(type, row, x, k);
#else
    (void)simd;
#endif
    return dot_portable(type, row, x, k);
}

/* ---- dispatch ----------------------------------------------------------------------- */

static pthread_once_t simd_once = PTHREAD_ONCE_INIT;
static int isa_best; /* Q_ISA_* of this CPU */
static _Atomic int isa_cap = Q_ISA_AVX512;

static void simd_probe(void)
{
#if QK_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        isa_best = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                           __builtin_cpu_supports("avx512vnni")
                       ? Q_ISA_AVX512
                       : Q_ISA_AVX2;
#endif
    const char *env = getenv("RINGLM_QUANT_PORTABLE");
    if (env && *env && strcmp(env, "0") != 0) isa_cap = Q_ISA_PORTABLE;
    env = getenv("RINGLM_QUANT_NO_AVX512");
    if (env && *env && strcmp(env, "0") != 0 && isa_cap > Q_ISA_AVX2) isa_cap = Q_ISA_AVX2;
}

int q_isa(void)
{
    pthread_once(&simd_once, simd_probe);
    return isa_best < isa_cap ? isa_best : isa_cap;
}

int q_isa_cap(int cap)
{
    pthread_once(&simd_once, simd_probe);
    return atomic_exchange(&isa_cap, cap);
}

const char *q_isa_name(int isa)
{
    return isa >= Q_ISA_AVX512 ? "avx512-vnni" : isa == Q_ISA_AVX2 ? "avx2-fma" : "portable";
}

bool q_force_portable(bool on)
{
    return q_isa_cap(on ? Q_ISA_PORTABLE : Q_ISA_AVX512) == Q_ISA_PORTABLE;
}

bool q_simd_active(void)
{
    return q_isa() > Q_ISA_PORTABLE;
}

float q_dot(int type, const void *row, const float *x, int64_t k)
{
    return dot_isa(q_simd_active(), type, row, x, k);
}

/* y[r][i] = beta y[r][i] + w_i . x_r for the n weight rows and the rows of x, portable. */
static void rows_portable(int type, const void *wv, int n, int64_t k, const xq8 *x, int rows,
                          float beta, float *y, int ld_y)
{
    if (qk_is_unpacked(type)) {
        qk_rows_unpacked_portable(type, wv, n, k, x, rows, beta, y, ld_y);
        return;
    }
    qk_xdot_fn *const dot = type == Q_Q8_0   ? qk_xdot_q8_0_portable
                            : type == Q_Q4_K ? qk_xdot_q4_k_portable
                                             : qk_xdot_q6_k_portable;
    const size_t rb = q_row_bytes(type, k), nx = (size_t)k / 32;
    for (int i = 0; i < n; i++)
        for (int r = 0; r < rows; r++) {
            const float sum = dot((const char *)wv + (size_t)i * rb, k, x->q + (size_t)r * k,
                                  x->d + (size_t)r * nx, x->s + (size_t)r * nx);
            float *yr = y + (size_t)r * ld_y + i;
            *yr = beta == 0.0f ? sum : beta * *yr + sum;
        }
}

/* ---- matmul ------------------------------------------------------------------------- */

/* A dequantized tile stays within ~256 KiB (the L2 of the cores it runs on). */
#define TILE_FLOATS (64 * 1024)

static pthread_key_t tile_key;
static pthread_once_t tile_once = PTHREAD_ONCE_INIT;

/* Two buffers per thread: TILE_BUF (dequantized tiles; the integer path's weight tiles) and
 * XQ_BUF (the activations q_matmul quantizes itself). */
enum { TILE_BUF, XQ_BUF };
typedef struct tile_buf {
    size_t floats[2];
    float *p[2];
} tile_buf;

static void tile_free(void *p)
{
    tile_buf *t = p;
    free(t->p[0]);
    free(t->p[1]);
    free(t);
}

static void tile_key_init(void)
{
    pthread_key_create(&tile_key, tile_free);
}

/* This thread's buffer `which` of at least n floats (kept for the thread's life). */
static float *thread_buf(int which, size_t n)
{
    pthread_once(&tile_once, tile_key_init);
    tile_buf *t = pthread_getspecific(tile_key);
    if (!t) {
        t = calloc(1, sizeof *t);
        if (!t || pthread_setspecific(tile_key, t)) {
            free(t);
            return NULL;
        }
    }
    if (t->floats[which] < n) {
        float *p = realloc(t->p[which], n * sizeof(float));
        if (!p) return NULL;
        t->p[which] = p;
        t->floats[which] = n;
    }
    return t->p[which];
}

static float *tile_get(size_t n)
{
    return thread_buf(TILE_BUF, n);
}

static void matmul_fused(int type, const void *w, int n, int k, const float *x, int rows,
                         float beta, float *y, int ld_y)
{
    const size_t rb = q_row_bytes(type, k);
    const bool simd = q_simd_active();
    for (int i = 0; i < n; i++) {
        const void *wr = (const char *)w + (size_t)i * rb;
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * k;
            float d = dot_isa(simd, type, wr, xr, k);
            float *yr = y + (size_t)r * ld_y + i;
            *yr = beta == 0.0f ? d : beta * *yr + d;
        }
    }
}

#if QK_X86
/* matmul_int with AVX-512 VNNI: up to VT1_ROWS rows dotted with the weights as they lie, a
 * larger batch with repacked tiles of VT_COLS weight rows, VT_ROWS activation rows at a
 * time. */
static bool matmul_vnni(int type, const void *w, int n, int k, const struct q_xq *a, float beta,
                        float *y, int ld_y)
{
    const size_t nb = (size_t)k / 32;
    const int rows = a->rows;
    size_t off = 0;
    const size_t o_wq = qk_carve(&off, nb * 512);
    const size_t o_wa = qk_carve(&off, nb * 64);
    const size_t o_wm = qk_carve(&off, nb * 64);
    /* the tile's rows as they lie, or the unpacked types' bytes (k a row) */
    const size_t o_wr =
        qk_carve(&off, VT_COLS * (qk_is_unpacked(type) ? (size_t)k + 256 : q_row_bytes(type, k)));
    /* Q8_0 up to VT1_ROWS rows as they lie (Q4_K and Q6_K: matmul_ktiles) */
    const bool vt1 = rows <= VT1_ROWS && type == Q_Q8_0;
    const size_t o_s = qk_carve(&off, vt1 ? (size_t)rows * nb * 4 : 0);
    char *buf = (char *)tile_get(off / 4 + 16 + 1);
    if (!buf) return false;
    buf += (64 - (uintptr_t)buf % 64) % 64;
    const size_t rb = q_row_bytes(type, k);
    const vt_x xt = a->xt;
    const vt_w wt = {
        .q = (uint8_t *)(buf + o_wq), .a = (float *)(buf + o_wa), .m = (float *)(buf + o_wm)};
    if (qk_vt_decode(type) && rows <= VT1_MAX_ROWS) {
        /* the 32-element types up to VT1_MAX_ROWS rows: as they lie, the packing cost more
         * than the products (quant_unpack.c); scratch rows x (k / 8 + k) + 64 bytes */
        qk_vt1_unpacked(type, (const char *)w, rb, n, (int64_t)nb, a, (int32_t *)(buf + o_wr), beta,
                        y, ld_y);
        return true;
    }
    if (vt1) { /* a few rows: the weights dotted as they lie, one row after the other (copying
                * the tiles first, as a batch does, cost 2.3x: the copy's reads then wait for
                * memory with nothing to overlap them) */
        qk_vt1_rows_q8_0((const char *)w, rb, n, (int64_t)nb, a, (int32_t *)(buf + o_s), beta, y,
                         ld_y);
        return true;
    }
    for (int i0 = 0; i0 < n; i0 += VT_COLS) {
        const int m = n - i0 < VT_COLS ? n - i0 : VT_COLS;
        /* the tile's rows copied first, one after the other: read in place, 16 rows at
         * once, they came from memory at a sixth of the speed (the prefetchers follow a
         * few streams, not 16 rows a block at a time) */
        char *wi = buf + o_wr;
        /* the unpacked types' rows are read one after the other as they lie */
        const bool unp = qk_is_unpacked(type);
        if (unp)
            qk_vt_pack_unpacked(type, (const char *)w + (size_t)i0 * rb, rb, m, (int64_t)nb, &wt,
                                (int8_t *)wi);
        else {
            memcpy(wi, (const char *)w + (size_t)i0 * rb, (size_t)m * rb);
            qk_vt_pack_q8_0(wi, rb, m, (int64_t)nb, &wt);
        }
        /* the signed grids in Q8_0's tiles, the other unpacked types in Q4_K's */
        const bool signed_grid = !unp || type == Q_IQ4_NL || type == Q_IQ4_XS;
        const __mmask16 mask = (__mmask16)((1u << m) - 1);
        for (int r0 = 0; r0 < rows; r0 += VT_ROWS) {
            const int g = rows - r0 < VT_ROWS ? rows - r0 : VT_ROWS;
            /* Q8_0 and the 32-element types in 4 chains, as their rows alone */
            const bool chains = type == Q_Q8_0 || qk_vt_decode(type);
            (signed_grid ? (chains ? qk_vt_rows_q8_0 : qk_vt_rows_signed)
                         : (chains ? qk_vt_rows_q4_k32 : qk_vt_rows_q4_k))(
                &wt, (int64_t)nb, &xt, r0, g, beta, y + i0, ld_y, mask);
        }
    }
    return true;
}

/* matmul_int for the K types with AVX-512 VNNI (Q8_K activations; quant_kquants.c, and
 * quant_k23.c for Q2_K, Q3_K and IQ4_XS): up to KT1_ROWS rows dotted with the weights as they
 * lie, a larger batch with repacked tiles of VT_COLS weight rows, VT_ROWS activation rows at a
 * time, both with the same integer sums and float steps. */
static bool matmul_ktiles(int type, const void *w, int n, int k, const struct q_xq *a, float beta,
                          float *y, int ld_y)
{
    const int64_t nb = k / 32;
    const int rows = a->rows;
    const size_t rb = q_row_bytes(type, k);
    const bool k23 = qk_kt_k23(type); /* Q2_K, Q3_K, IQ4_XS: quant_k23.c */
    if (rows <= KT1_ROWS && k23) {    /* the rows laid out for it first, in this thread's buffer */
        char *xp = (char *)tile_get(qk_kt1_k23_scratch(rows, k) / 4 + 16 + 1);
        if (!xp) return false;
        xp += (64 - (uintptr_t)xp % 64) % 64;
        qk_kt1_k23(type, (const char *)w, rb, n, nb, a, (int8_t *)xp, beta, y, ld_y);
        return true;
    }
    if (rows <= KT1_ROWS) {
        char *s = (char *)tile_get(qk_kt1_bytes(nb) / 4 + 16 + 1);
        if (!s) return false;
        s += (64 - (uintptr_t)s % 64) % 64;
        for (int i0 = 0; i0 < n; i0 += VT_COLS) {
            const int m = n - i0 < VT_COLS ? n - i0 : VT_COLS;
            (type == Q_Q4_K   ? qk_kt1_q4_k
             : type == Q_Q5_K ? qk_kt1_q5_k
                              : qk_kt1_q6_k)((const char *)w + (size_t)i0 * rb, rb, m, nb, a, s,
                                             beta, y + i0, ld_y);
        }
        return true;
    }
    size_t off = 0;
    const size_t o_q = qk_carve(&off, (size_t)nb * 512);
    const size_t o_sc = qk_carve(&off, (size_t)nb * 128);
    const size_t o_d = qk_carve(&off, (size_t)nb / 8 * 64);
    const size_t o_dmin = qk_carve(&off, (size_t)nb / 8 * 64);
    const size_t o_mn = qk_carve(&off, (size_t)nb / 8 * (k23 ? 512 : 256));
    /* the tile's rows copied (quant_k23.c's: unpacked to bytes) */
    const size_t o_wr = qk_carve(&off, VT_COLS * (k23 ? (size_t)k : rb));
    char *buf = (char *)tile_get(off / 4 + 16 + 1);
    if (!buf) return false;
    buf += (64 - (uintptr_t)buf % 64) % 64;
    const kt_w wt = {.q = (uint8_t *)(buf + o_q),
                     .sc = (int32_t *)(buf + o_sc),
                     .d = (float *)(buf + o_d),
                     .dmin = (float *)(buf + o_dmin),
                     .mn = (int32_t *)(buf + o_mn)};
    for (int i0 = 0; i0 < n; i0 += VT_COLS) {
        const int m = n - i0 < VT_COLS ? n - i0 : VT_COLS;
        /* the tile's rows copied first (see matmul_vnni) */
        char *wi = buf + o_wr;
        if (k23) /* those rows read one after the other as they lie */
            qk_kt_pack_k23(type, (const char *)w + (size_t)i0 * rb, rb, m, nb, &wt, (int8_t *)wi);
        else {
            memcpy(wi, (const char *)w + (size_t)i0 * rb, (size_t)m * rb);
            (type == Q_Q4_K   ? qk_kt_pack_q4_k
             : type == Q_Q5_K ? qk_kt_pack_q5_k
                              : qk_kt_pack_q6_k)(wi, rb, m, nb, &wt);
        }
        const __mmask16 mask = (__mmask16)((1u << m) - 1);
        for (int r0 = 0; r0 < rows; r0 += VT_ROWS) {
            const int g = rows - r0 < VT_ROWS ? rows - r0 : VT_ROWS;
            if (k23)
                qk_kt_rows_k23(type, &wt, nb, a, r0, g, beta, y + i0, ld_y, mask);
            else
                (type == Q_Q6_K ? qk_kt_rows_q6_k : qk_kt_rows_q4_k)(&wt, nb, &a->kt, r0, g, beta,
                                                                     y + i0, ld_y, mask);
        }
    }
    return true;
}
#endif

/* Whether matmul_int reads nothing of rows x k quantized on isa but their Q8_K form (and
 * kt_x's q1): the K types' few-row kernels (matmul_ktiles' kt1). */
static bool reads_only_q8k(int type, int rows, int k, int isa)
{
#if QK_X86
    return isa >= Q_ISA_AVX512 && rows <= KT1_ROWS && k % QK_K == 0 &&
           (type == Q_Q4_K || type == Q_Q5_K || type == Q_Q6_K);
#else
    (void)type, (void)rows, (void)k, (void)isa;
    return false;
#endif
}

bool q_reads_only_q8k(int type, int rows, int k)
{
    return q_int_path(type, rows) && reads_only_q8k(type, rows, k, q_isa());
}

/* Q8_0, Q4_K and Q6_K weights times the activation rows a (quantized for this instruction
 * set), in tiles of weight rows and groups of activation rows, the weight tiles in this
 * thread's buffer. Returns false when there is no memory for them. */
static bool matmul_int(int type, const void *w, int n, int k, const struct q_xq *a, float beta,
                       float *y, int ld_y)
{
    /* rows with the Q8_K form alone go to the kernels that read only it, or to q_matmul */
    if (!a->xq.q && !reads_only_q8k(type, a->rows, k, a->isa)) return false;
#if QK_X86
    if (a->isa >= Q_ISA_AVX512 &&
        (type == Q_Q4_K || type == Q_Q5_K || type == Q_Q6_K || qk_kt_k23(type)) && a->xq.kq)
        return matmul_ktiles(type, w, n, k, a, beta, y, ld_y);
    if (a->isa >= Q_ISA_AVX512 && (!qk_is_unpacked(type) || qk_vt_decode(type)))
        return matmul_vnni(type, w, n, k, a, beta, y, ld_y);
#endif
    const size_t nb = (size_t)k / 32;
    const int isa = a->isa, rows = a->rows;
    const xq8 xq = a->xq;
    const size_t rb = q_row_bytes(type, k);
#if QK_X86
    qk_rows_fn *const kern = type == Q_Q8_0   ? qk_rows_q8_0_avx2
                             : type == Q_Q4_K ? qk_rows_q4_k_avx2
                                              : qk_rows_q6_k_avx2;
#endif
    for (int i0 = 0; i0 < n; i0 += Q8_TILE) {
        const int m = n - i0 < Q8_TILE ? n - i0 : Q8_TILE;
        for (int r0 = 0; r0 < rows; r0 += Q8_GROUP_ROWS) {
            const int g = rows - r0 < Q8_GROUP_ROWS ? rows - r0 : Q8_GROUP_ROWS;
            xq8 part = {.q = xq.q + (size_t)r0 * k,
                        .d = xq.d + (size_t)r0 * nb,
                        .s = xq.s + (size_t)r0 * nb,
                        .s16 = xq.s16 + (size_t)r0 * 2 * nb,
                        .qp = xq.qp ? xq.qp + (size_t)r0 * k : NULL};
            if (xq.kq && qk_q8k_type(type)) { /* the K types with Q8_K (quant_q8k.c) */
                part.kq = xq.kq + (size_t)r0 * k;
                part.kd = xq.kd + (size_t)r0 * (k / QK_K);
                part.ks = xq.ks + (size_t)r0 * (k / 16);
#if QK_X86
                if (isa > Q_ISA_PORTABLE)
                    qk_rows_q8k_avx2(type, (const char *)w + (size_t)i0 * rb, m, k, &part, g, beta,
                                     y + (size_t)r0 * ld_y + i0, ld_y);
                else
#endif
                    qk_rows_q8k_portable(type, (const char *)w + (size_t)i0 * rb, m, k, &part, g,
                                         beta, y + (size_t)r0 * ld_y + i0, ld_y);
                continue;
            }
#if QK_X86
            if (isa > Q_ISA_PORTABLE && qk_is_unpacked(type)) {
                qk_rows_unpacked_avx2(type, (const char *)w + (size_t)i0 * rb, m, k, &part, g, beta,
                                      y + (size_t)r0 * ld_y + i0, ld_y);
                continue;
            }
            if (isa > Q_ISA_PORTABLE) {
                kern((const char *)w + (size_t)i0 * rb, m, k, &part, g, beta,
                     y + (size_t)r0 * ld_y + i0, ld_y);
                continue;
            }
#else
            (void)isa;
#endif
            rows_portable(type, (const char *)w + (size_t)i0 * rb, m, k, &part, g, beta,
                          y + (size_t)r0 * ld_y + i0, ld_y);
        }
    }
    return true;
}

#define Q_INT_CHUNK_ROWS 256

bool q_int_path(int type, int rows)
{
    if (qk_is_unpacked(type))
        return rows <= Q_INT_MAX_ROWS || (qk_q8k_type(type) && q_isa() >= Q_ISA_AVX512);
    return (type == Q_Q8_0 || type == Q_Q4_K || type == Q_Q6_K) &&
           (rows <= Q_INT_MAX_ROWS || q_isa() >= Q_ISA_AVX512);
}

int q_int_act_elems(int type, int rows)
{
    if (!qk_q8k_type(type)) return 32;
    /* with AVX-512 VNNI Q4_K and Q6_K take Q8_K at every row count (its tiles), the other K
     * types up to Q_INT_MAX_ROWS (its kernels in their own arithmetic, or AVX2's) */
    if (q_isa() >= Q_ISA_AVX512) return QK_K;
    return rows > Q_INT_MAX_ROWS ? 32 : QK_K;
}

bool q_matmul_tiles(int type, const void *w, int n, int k, const q_xq *a, float beta, float *y,
                    int ld_y)
{
#if QK_X86
    if (a && a->k == k && a->isa >= Q_ISA_AVX512 && a->isa == q_isa() && a->rows > 1 &&
        qk_vt_unpacked(type) && k % q_block_elems(type) == 0)
        return matmul_vnni(type, w, n, k, a, beta, y, ld_y);
#else
    (void)type, (void)w, (void)n, (void)k, (void)a, (void)beta, (void)y, (void)ld_y;
#endif
    return false;
}

void q_matmul_xq(int type, const void *w, int n, int k, const q_xq *a, const float *x, int rows,
                 float beta, float *y, int ld_y)
{
    if (a && a->rows == rows && a->k == k && a->isa == q_isa() && q_int_path(type, rows) &&
        matmul_int(type, w, n, k, a, beta, y, ld_y))
        return;
    q_matmul(type, w, n, k, x, rows, beta, y, ld_y);
}

_Static_assert(Q_PACKED_MAX_ROWS == KT1_ROWS, "the packed products are qk_kt1_*'s rows");

size_t q_packed_bytes(int type, int n, int k)
{
    return q_isa() >= Q_ISA_AVX512 ? qk_p1_bytes(type, n, k) : 0;
}

bool q_pack(int type, const void *w, int n, int k, void *out)
{
    return q_packed_bytes(type, n, k) && (uintptr_t)out % 64 == 0 && qk_p1_pack(type, w, n, k, out);
}

bool q_matmul_packed(int type, const void *wp, int n0, int n, int k, const q_xq *a, int rows,
                     float beta, float *y, int ld_y)
{
#if QK_X86
    /* where q_matmul_xq takes matmul_ktiles' rows as they lie (qk_kt1_*) */
    if (wp && a && a->rows == rows && rows >= 1 && rows <= KT1_ROWS && a->k == k &&
        a->isa >= Q_ISA_AVX512 && a->isa == q_isa() && a->xq.kq && qk_p1_type(type) &&
        k % QK_K == 0 && n0 % Q_PACKED_ROWS == 0 && n > 0) {
        qk_p1_rows(type, wp, n0, n, k, &a->xq, rows, beta, y, ld_y);
        return true;
    }
#else
    (void)type, (void)wp, (void)n0, (void)n, (void)k, (void)a, (void)rows, (void)beta, (void)y,
        (void)ld_y;
#endif
    return false;
}

bool q_bf16_dot_path(int rows)
{
#if QK_X86
    return q_isa() >= Q_ISA_AVX512 && rows <= gemm_small_max_rows(GEMM_SMALL_AUTO) &&
           gemm_bf16_prefer(Q_BF16);
#else
    (void)rows;
    return false;
#endif
}

#if QK_X86
/* BF16 weights at the rows gemm_small would take, where the backend rounds BF16 prefill's
 * activations to bf16 (gemm_bf16_prefer): the activations rounded once per call, in passes of
 * rows that stay within 256 KiB, dotted by vdpbf16ps. False, having written nothing, where it
 * does not run. */
static bool matmul_bf16_dp(const void *w, int n, int k, const float *x, int rows, float beta,
                           float *y, int ld_y)
{
    if (!q_bf16_dot_path(rows)) return false;
    const int ld_xb = (k + 31) & ~31;
    int mc = (int)((256 * 1024) / ((size_t)ld_xb * 2)) & ~3;
    mc = mc < 4 ? 4 : mc > rows ? rows : mc;
    uint16_t *xb = (uint16_t *)thread_buf(XQ_BUF, ((size_t)mc * ld_xb + 1) / 2);
    if (!xb) return false;
    for (int m0 = 0; m0 < rows; m0 += mc) {
        const int m = rows - m0 < mc ? rows - m0 : mc;
        qk_round_bf16_avx512(x + (size_t)m0 * k, m, k, xb, ld_xb);
        qk_rows_bf16_dp_avx512(w, n, k, xb, ld_xb, m, beta, y + (size_t)m0 * ld_y, ld_y);
    }
    return true;
}
#endif

void q_matmul(int type, const void *w, int n, int k, const float *x, int rows, float beta, float *y,
              int ld_y)
{
    if (q_int_path(type, rows)) {
        /* in chunks of rows, so the quantized activations stay within a few MiB */
        int r0 = 0;
        for (; r0 < rows; r0 += Q_INT_CHUNK_ROWS) {
            const int g = rows - r0 < Q_INT_CHUNK_ROWS ? rows - r0 : Q_INT_CHUNK_ROWS;
            const size_t bytes = q_xq_bytes(g, k);
            void *mem = thread_buf(XQ_BUF, bytes / sizeof(float) + 1);
            const q_xq *a = mem ? q_xq_prepare(mem, bytes, x + (size_t)r0 * k, g, k) : NULL;
            if (!a || !matmul_int(type, w, n, k, a, beta, y + (size_t)r0 * ld_y, ld_y)) break;
        }
        if (r0 >= rows) return;
        x += (size_t)r0 * k; /* no memory for the rest: the float paths need less */
        y += (size_t)r0 * ld_y;
        rows -= r0;
    }
    /* F16 and BF16 weights never take the fused dots, which converted a row again for every
     * activation row and waited on one multiply-add chain (F16 decoded 2-4 sequences slower
     * than 1): gemm_small's tiles, 4 weight rows in flight, each weight converted once per
     * step. And a row then gets the same sums alone as in a batch up to gemm_small_max_rows. */
    const bool float_type = type == Q_F16 || type == Q_BF16 || type == Q_F32;
    if (rows <= FUSED_MAX_ROWS && !float_type) {
        matmul_fused(type, w, n, k, x, rows, beta, y, ld_y);
        return;
    }
#if QK_X86
    if (type == Q_BF16 && matmul_bf16_dp(w, n, k, x, rows, beta, y, ld_y)) return;
    /* F16 or BF16 where gemm_small runs its AVX-512 tiles, every batch gemm_small takes: the
     * same tiles with the weights converted in registers (qk_rows_half_avx512), the same bits
     * as the converted tiles below, each weight read from memory once. */
    if ((type == Q_F16 || type == Q_BF16) && q_isa() >= Q_ISA_AVX512 &&
        gemm_small_auto_path() == GEMM_SMALL_AVX512 &&
        rows <= gemm_small_max_rows(GEMM_SMALL_AUTO)) {
        qk_rows_half_avx512(type, w, n, k, x, rows, beta, y, ld_y);
        return;
    }
    /* Up to 4 rows of F16 or BF16 where gemm_small runs its AVX2 tiles: the same tiles with
     * the weights converted in registers (no tile stored and read back: 1.15-1.2x at one row),
     * the same bits as the tiles below. */
    if ((type == Q_F16 || type == Q_BF16) && rows <= FUSED_MAX_ROWS && q_simd_active() &&
        gemm_small_auto_path() == GEMM_SMALL_AVX2) {
        qk_rows_half_avx2(type, w, n, k, x, rows, beta, y, ld_y);
        return;
    }
#endif
    int tile = TILE_FLOATS / k;
    tile = tile < 8 ? 8 : tile > 64 ? 64 : tile;
    float *buf = tile_get((size_t)tile * (size_t)k);
    if (!buf) { /* no memory for a tile: the fused path needs none */
        matmul_fused(type, w, n, k, x, rows, beta, y, ld_y);
        return;
    }
    /* A batch small enough for gemm_small multiplies each tile there, as float32 weights
     * are (cpu.c): OpenBLAS SGEMM packs its operands on every call, which for a tile of
     * 8-64 weight rows against a decode batch costs more than the product (F16 decoded 8
     * sequences at 0.33-0.5x its own 1-sequence rate, 0.16-0.33x llama.cpp, with SGEMM). */
    const bool small = rows <= gemm_small_max_rows(GEMM_SMALL_AUTO);
    const bool f16c = q_simd_active();
    (void)f16c;
    const size_t rb = q_row_bytes(type, k);
    for (int i0 = 0; i0 < n; i0 += tile) {
        int m = n - i0 < tile ? n - i0 : tile;
        for (int i = 0; i < m; i++) {
            const void *wr = (const char *)w + (size_t)(i0 + i) * rb;
#if QK_X86
            if (type == Q_F16 && f16c) {
                qk_dequant_f16_avx2(wr, buf + (size_t)i * k, k);
                continue;
            }
            if (type == Q_BF16 && f16c) {
                qk_dequant_bf16_avx2(wr, buf + (size_t)i * k, k);
                continue;
            }
#endif
            q_dequant_row(type, wr, buf + (size_t)i * k, k);
        }
        if (small)
            gemm_small(GEMM_SMALL_AUTO, rows, m, k, x, k, buf, k, beta, y + i0, ld_y);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, m, k, 1.0f, x, k, buf, k,
                        beta, y + i0, ld_y);
    }
}

/* ---- quantizers (ringlm-mkmodel) ---------------------------------------------------- */

/* The types quant_search.c quantizes (under an importance matrix it takes the legacy ones
 * too). */
static bool is_searched(int type)
{
    return type == Q_Q2_K || type == Q_Q3_K || type == Q_Q4_K || type == Q_Q5_K || type == Q_Q6_K ||
           type == Q_IQ4_NL || type == Q_IQ4_XS;
}

size_t q_quantize_row(int type, const float *x, void *out, int64_t k)
{
    switch (type) {
    case Q_F32: memcpy(out, x, (size_t)k * 4); break;
    case Q_F16:
        for (int64_t i = 0; i < k; i++) ((uint16_t *)out)[i] = qk_f32_to_f16(x[i]);
        break;
    case Q_BF16:
        for (int64_t i = 0; i < k; i++) ((uint16_t *)out)[i] = q_f32_to_bf16(x[i]);
        break;
    case Q_Q8_0: qk_quantize_q8_0(x, out, k); break;
    default:
        if (is_searched(type))
            qk_quantize_searched(type, x, NULL, out, k);
        else if (is_legacy(type))
            qk_quantize_legacy(type, x, out, k);
        else
            return 0;
        break;
    }
    return q_row_bytes(type, k);
}

size_t q_quantize_row_weighted(int type, const float *x, void *out, int64_t k, const float *qw)
{
    if (!qw || !q_takes_imatrix(type)) return q_quantize_row(type, x, out, k);
    if (!is_searched(type) && !is_legacy(type)) return 0;
    qk_quantize_searched(type, x, qw, out, k);
    return q_row_bytes(type, k);
}

bool q_takes_imatrix(int type)
{
    return type != Q_F32 && type != Q_F16 && type != Q_BF16 && type != Q_Q8_0;
}
