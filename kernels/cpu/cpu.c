/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/cpu.c — the CPU backend: the reference every other backend is tested
 * against. Plain C and OpenBLAS; one flattened batch of T rows per call.
 *
 *   x      = embedding[tokens]                                  [T, dim]
 *   for each layer:
 *     xb   = rmsnorm(x) * rms_att
 *     q,k,v = xb · Wq^T, xb · Wk^T, xb · Wv^T                    one GEMM each over all T
 *     rope(q, k) at each row's position; k, v → KV pool at slot_mapping[row]
 *     att  = paged attention: each row's query heads over positions 0..pos of its sequence,
 *            read through the sequence's block table
 *     x   += att · Wo^T
 *     xb   = rmsnorm(x) * rms_ffn
 *     x   += (silu(xb · W1^T) ⊙ (xb · W3^T)) · W2^T
 *   logits = (rmsnorm(x[logits_rows]) * rms_final) · Wcls^T       only the rows asked for
 *
 * Parallelism: a small pool of worker threads (the caller is worker 0). Each matmul is
 * split by output rows of the weight, and each piece is one single-threaded call: for
 * batches of up to 12-16 rows (by CPU) our gemm_small (kernels/cpu/gemm_small.h),
 * which reads each weight row once for the whole batch and sums every output in the same
 * order whatever the batch (so a decode row's result does not depend on its batch-mates),
 * above that OpenBLAS SGEMM (whose packing of the weight pays off only when compute-bound).
 * OpenBLAS never starts threads of its own to compete with ours. With F32 and F16 weights a
 * batch's prompt rows go first (order_prompt_rows) and through AVX-512 BF16 tiles at any
 * count (mm_rows, gemm_bf16.h), the generated rows after them as above: a row's path is
 * what its token is, never its batch. Attention is split
 * by (decode row, KV head) and (tile of up to 32 prefill rows of one sequence, KV head).
 * The attention and SwiGLU loops use 8-float GCC vectors, cloned for AVX2/AVX-512.
 *
 * Files: this one (the forward pass, matmul jobs, lifecycle, KV blocks), cpu.h (state and
 * helpers the files share), pool.c (worker threads), attention.c (paged attention),
 * gemm_small.c (small-batch F32 matmul), quant*.c (weight types, by family).
 *
 * KV pool, block-major: block b holds, for every layer l, K then V of block_size tokens:
 *   pool[b][l][0=K|1=V][offset][kv_dim]   (float32)
 * so one block is one contiguous copy for swapping. With window rings (eng_options.kv_rings,
 * gemma's mixed windows) l runs over the global layers only, and the windowed layers' K/V
 * sit in the same shape in ring blocks, rings[ring][block][w][0|1][offset][kv_dim], a
 * sequence's position p in its ring's block (p / block_size) mod ring_blocks: attention
 * reads them through a per-batch table of ring blocks (kv_table), so the kernels address
 * both kinds alike.
 */
#include "kernels/cpu/blas.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/gemm_small.h"
#include "kernels/cpu/quant_prefill.h"
#include "kernels/cpu/quant.h"
#include "numa/rnuma.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- SwiGLU ------------------------------------------------------------------------ */

/* g[i] = silu(g[i]) * u[i] (SwiGLU), silu(a) = a * sigmoid(a) as run.c, exp vectorised. */
CPU_CLONES
static void swiglu(float *g, const float *u, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f a = *(const v8f *)(g + i), e = -a;
        exp8((float *)&e);
        *(v8f *)(g + i) = a / (1.0f + e) * *(const v8f *)(u + i);
    }
    for (; i < n; i++) {
        float val = g[i];
        val *= 1.0f / (1.0f + expf(-val));
        g[i] = val * u[i];
    }
}

/* g[i] = gelu(g[i]) * u[i] (GeGLU), GELU in its tanh form as gemma and llama.cpp use it:
 * 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))). */
static void geglu(float *g, const float *u, int n)
{
    for (int i = 0; i < n; i++) {
        const float a = g[i];
        g[i] = 0.5f * a * (1.0f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a))) * u[i];
    }
}

/* ---- matmul jobs -------------------------------------------------------------------- */

/*
 * y[T][n] = beta * y + x[T][k] · w[n][k]^T, split into chunks of weight rows. With up != NULL
 * the job is the SwiGLU up-projection: y = silu(x · w^T) ⊙ (x · up^T), where y_up holds
 * the second product.
 */
typedef struct mm_job {
    eng_wmat w;
    int n, k;
    const float *x;
    float *y;
    int ld_y;
    float beta;
    eng_wmat up;
    float *y_up;
    int act; /* enum eng_ffn_act of the gated product */
    int chunk_rows;
    int n_chunks;
    const q_xq *xq;     /* x quantized once for quantized weights (matmul_jobs), or NULL */
    const uint16_t *xr; /* x rounded to bf16 once for gemm_bf16 (matmul_jobs), or NULL */
    int xr_rows;        /* ... its first rows that are (the prompt rows, or all) */
    /* the gated product's output rounded to bf16 by the task that makes it, for the product
     * that reads it next (its first xr_out_rows rows, gemm_bf16_round_ld(n) apart), or NULL */
    uint16_t *xr_out;
    int xr_out_rows;
} mm_job;

typedef struct mm_region {
    mm_job *jobs;
    int n_jobs;
    int rows;        /* T */
    int prompt_rows; /* the first of them that are prompt rows (prompt_split) */
    const cpu *c;
} mm_region;

/* Whether the first prompt_rows rows of a product with weights of type wtype go through the
 * BF16 tiles apart from the others: F32 and F16 weights on an engine that takes prompt rows
 * there (cpu.prompt_bf16). BF16 weights take those tiles above gemm_small's rows whatever
 * the rows are, and quantized ones their integer paths. In the last layer's tail (cpu.
 * tail_tiles: the logits rows alone, last_layer_tail) F32, F16 and BF16 weights take them at
 * any count too, as the whole batch did. */
static bool prompt_split(const cpu *c, int wtype)
{
    const bool float_type = wtype == ENG_W_F32 || wtype == ENG_W_F16;
    return (c->prompt_bf16 && float_type) || (c->tail_tiles && (float_type || wtype == ENG_W_BF16));
}

/* Layer l's dense projections in the order of cpu.packed. */
static void layer_mats(const eng_layer_weights *lw, eng_wmat out[CPU_PACKED_MATS])
{
    const eng_wmat m[CPU_PACKED_MATS] = {lw->wq, lw->wk, lw->wv, lw->wo, lw->w1, lw->w2, lw->w3};
    memcpy(out, m, sizeof m);
}

/* wm packed once into gemm_bf16's panels (a dense projection of the layer being run), or
 * NULL. */
static const void *packed_of(const cpu *c, eng_wmat wm)
{
    if (!c->packed || !wm.data) return NULL;
    if (wm.data == c->t->wcls.data) return c->packed_cls;
    eng_wmat m[CPU_PACKED_MATS];
    layer_mats(&c->t->layers[c->layer], m);
    for (int i = 0; i < CPU_PACKED_MATS; i++)
        if (m[i].data == wm.data) return c->packed[c->layer][i];
    return NULL;
}

/* Whether matmul_rows multiplies rows of x by weights of wtype in gemm_bf16's tiles. */
static bool takes_bf16_tiles(int wtype, int rows)
{
    return (wtype == ENG_W_BF16 || wtype == ENG_W_F32 || wtype == ENG_W_F16) &&
           rows > gemm_small_max_rows(GEMM_SMALL_AUTO) && gemm_bf16_prefer(wtype);
}

/* Rows n0.. of a weight matrix in any type: float32 through gemm_small or BLAS, the others
 * through the fused/tiled kernels of quant.c. */
static void matmul_rows(int rows, const float *x, const q_xq *xq, const uint16_t *xr, eng_wmat wm,
                        const void *wp, int n0, int n, int k, float beta, float *y, int ld_y)
{
    /* BF16 weights above gemm_small's batches, where the CPU has AVX-512 BF16: the activations
     * rounded to bf16 and dotted in vdpbf16ps tiles (gemm_bf16.h: not exact float32, within
     * 2^-8 of each product; RINGLM_PREFILL_GEMM=own or =blas keep float32), 1.7-1.8x the
     * float panels below (perf/gemm_bench --prefill --type BF16); F32 and F16 weights too,
     * rounded as well, where RINGLM_PREFILL_GEMM=bf16 asks for it (their prompt rows take
     * these tiles before they get here: mm_rows). xr: the rows rounded once for the whole
     * product (matmul_jobs), or NULL (rounded here). wp: the weights packed once at load
     * (cpu.packed), or NULL (packed here, block by block): the same bits. */
    if (takes_bf16_tiles(wm.type, rows)) {
        if (xr && wp && gemm_bf16_packed(rows, n, k, xr, wp, n0, beta, y, ld_y)) return;
        const size_t rb = eng_wrow_bytes(wm.type, k);
        const void *w = (const char *)wm.data + (size_t)n0 * rb;
        if (xr ? gemm_bf16_rounded(wm.type, rows, n, k, xr, w, rb, beta, y, ld_y)
               : gemm_bf16(wm.type, rows, n, k, x, k, w, rb, beta, y, ld_y))
            return;
    }
    /* Float weights above gemm_small's batches (prefill, large decode batches): our own AVX2
     * tiles (gemm_f32.h) where they beat SGEMM, which is every shape measured on AVX2
     * machines (perf/gemm_bench --prefill: F32 1.0-2.9x, F16/BF16 1.6-1.95x the float tiles
     * and SGEMM that ran before). */
    if ((wm.type == ENG_W_F32 || wm.type == ENG_W_F16 || wm.type == ENG_W_BF16) &&
        rows > gemm_small_max_rows(GEMM_SMALL_AUTO) && gemm_f32_prefer(wm.type, rows, n, k)) {
        const size_t rb = eng_wrow_bytes(wm.type, k);
        if (gemm_f32(wm.type, rows, n, k, x, k, (const char *)wm.data + (size_t)n0 * rb, rb, beta,
                     y, ld_y))
            return;
    }
    /* Quantized weights above the integer path's rows where it does not take every row count
     * (AVX2 without AVX-512 VNNI): Q4_K, Q6_K, Q4_0 and Q4_1 in integer tiles (quant_prefill.h);
     * the others dequantized into gemm_f32's panels once per block of k, not into float tiles
     * that SGEMM packs again (perf/gemm_bench --prefill --type). */
    /* Q4_K and Q6_K packed once at load (decode rows): the same bits as the weights as they
     * lie, 1.5-1.8x the speed of reading them (perf/quant_bench --packed) */
    if (wp && xq && q_matmul_packed(wm.type, wp, n0, n, k, xq, rows, beta, y, ld_y)) return;
    if (xq && q_prefill_runs(wm.type, rows) &&
        q_prefill_matmul(wm.type, (const char *)wm.data + (size_t)n0 * eng_wrow_bytes(wm.type, k),
                         n, k, xq, beta, y, ld_y))
        return;
    if (wm.type != ENG_W_F32 && wm.type != ENG_W_F16 && wm.type != ENG_W_BF16 &&
        rows > Q_INT_MAX_ROWS && !q_int_path(wm.type, rows) &&
        gemm_f32_prefer(wm.type, rows, n, k)) {
        const size_t rb = eng_wrow_bytes(wm.type, k);
        if (gemm_f32(wm.type, rows, n, k, x, k, (const char *)wm.data + (size_t)n0 * rb, rb, beta,
                     y, ld_y))
            return;
    }
    if (wm.type != ENG_W_F32) {
        q_matmul_xq(wm.type, (const char *)wm.data + (size_t)n0 * eng_wrow_bytes(wm.type, k), n, k,
                    xq, x, rows, beta, y, ld_y);
        return;
    }
    const float *w = (const float *)wm.data + (size_t)n0 * k;
    /* Float32 batches of up to gemm_small_max_rows rows go through gemm_small (each weight
     * row read once for all rows, nothing packed), larger ones through OpenBLAS SGEMM,
     * whose packing pays for itself once the product is compute-bound. */
    if (rows <= gemm_small_max_rows(GEMM_SMALL_AUTO))
        gemm_small(GEMM_SMALL_AUTO, rows, n, k, x, k, w, k, beta, y, ld_y);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, k, 1.0f, x, k, w, k, beta, y,
                    ld_y);
}

/* matmul_rows for rows whose first prompt_rows are prompt rows: with weights prompt_split
 * takes, those rows through gemm_bf16 at whatever count (its rows do not depend on each
 * other, so a prompt row gets the same bits in a chunk of 1 or of 1024) and the others as
 * any generated row; otherwise all of them together. xr: the rows rounded to bf16 (at least
 * the prompt rows, all of them where the others take the tiles too), or NULL. The rows'
 * quantized form (xq) is only made for quantized weights, which are never split. */
static void mm_rows(const cpu *c, int rows, int prompt_rows, const float *x, const q_xq *xq,
                    const uint16_t *xr, eng_wmat wm, int n0, int n, int k, float beta, float *y,
                    int ld_y)
{
    const void *wp = packed_of(c, wm);
    if (prompt_rows > 0 && prompt_split(c, wm.type)) {
        const size_t rb = eng_wrow_bytes(wm.type, k);
        const void *w = (const char *)wm.data + (size_t)n0 * rb;
        if ((xr && wp && gemm_bf16_packed(prompt_rows, n, k, xr, wp, n0, beta, y, ld_y)) ||
            (xr ? gemm_bf16_rounded(wm.type, prompt_rows, n, k, xr, w, rb, beta, y, ld_y)
                : gemm_bf16(wm.type, prompt_rows, n, k, x, k, w, rb, beta, y, ld_y))) {
            const int gen = rows - prompt_rows;
            if (gen > 0)
                matmul_rows(gen, x + (size_t)prompt_rows * k, NULL,
                            xr && takes_bf16_tiles(wm.type, gen)
                                ? xr + (size_t)prompt_rows * gemm_bf16_round_ld(k)
                                : NULL,
                            wm, wp, n0, n, k, beta, y + (size_t)prompt_rows * ld_y, ld_y);
            return;
        }
    }
    matmul_rows(rows, x, xq, xr, wm, wp, n0, n, k, beta, y, ld_y);
}

static void mm_job_rows(const mm_region *r, const mm_job *j, int n0, int n);

static void mm_task(void *ctx, int task, int worker)
{
    (void)worker;
    mm_region *r = ctx;
    mm_job *j = r->jobs;
    while (task >= j->n_chunks) {
        task -= j->n_chunks;
        j++;
    }
    int n0 = task * j->chunk_rows;
    int n = j->n - n0 < j->chunk_rows ? j->n - n0 : j->chunk_rows;
    mm_job_rows(r, j, n0, n);
}

/* Rows [n0, n0 + n) of job j. */
static void mm_job_rows(const mm_region *r, const mm_job *j, int n0, int n)
{
    mm_rows(r->c, r->rows, r->prompt_rows, j->x, j->xq, j->xr, j->w, n0, n, j->k, j->beta,
            j->y + n0, j->ld_y);
    if (j->up.data) {
        mm_rows(r->c, r->rows, r->prompt_rows, j->x, j->xq, j->xr, j->up, n0, n, j->k, 0.0f,
                j->y_up + n0, j->ld_y);
        const int ld_r = gemm_bf16_round_ld(j->n);
        for (int t = 0; t < r->rows; t++) {
            float *g = j->y + (size_t)t * j->ld_y;
            (j->act == ENG_ACT_GELU ? geglu : swiglu)(g + n0, j->y_up + (size_t)t * j->ld_y + n0,
                                                      n);
            /* its columns rounded while they are in this core's cache (xr_made) */
            if (t < j->xr_out_rows)
                gemm_bf16_round_cols(1, j->n, n0, n0 + n, g, j->ld_y, j->xr_out + (size_t)t * ld_r);
        }
    }
}

/* Chunks [t0, t1) of the region's jobs (pool_run_split): the contiguous chunks of each job
 * among them as one piece of its rows. */
static void mm_range(void *ctx, int t0, int t1, int worker)
{
    (void)worker;
    mm_region *r = ctx;
    mm_job *j = r->jobs;
    while (t0 >= j->n_chunks) {
        t0 -= j->n_chunks;
        t1 -= j->n_chunks;
        j++;
    }
    while (t1 > 0) {
        const int c1 = t1 < j->n_chunks ? t1 : j->n_chunks;
        const int n0 = t0 * j->chunk_rows;
        const int n1 = c1 * j->chunk_rows < j->n ? c1 * j->chunk_rows : j->n;
        mm_job_rows(r, j, n0, n1 - n0);
        t0 = 0;
        t1 -= j->n_chunks;
        j++;
    }
}

typedef void (*rows_fn)(cpu *c, int r0, int r1, const void *arg);

typedef struct rows_region {
    cpu *c;
    rows_fn fn;
    const void *arg;
    int rows, parts;
} rows_region;

static void rows_task(void *ctx, int task, int worker)
{
    (void)worker;
    const rows_region *r = ctx;
    r->fn(r->c, (int)((int64_t)task * r->rows / r->parts),
          (int)((int64_t)(task + 1) * r->rows / r->parts), r->arg);
}

/* fn(c, r0, r1, arg) over rows [0, rows) in `parts` tasks of the pool. */
static void run_rows(cpu *c, int rows, int parts, rows_fn fn, const void *arg)
{
    rows_region r = {c, fn, arg, rows, parts};
    pool_run(&c->workers, parts, rows_task, &r);
}

typedef struct round_arg {
    const float *x;
    int k;
    uint16_t *xr;
} round_arg;

static void round_part(cpu *c, int m0, int m1, const void *arg)
{
    (void)c;
    const round_arg *a = arg;
    gemm_bf16_round(m1 - m0, a->k, a->x + (size_t)m0 * a->k, a->k,
                    a->xr + (size_t)m0 * gemm_bf16_round_ld(a->k));
}

/* x (rows of k floats) rounded to bf16 into slot, split by rows among the workers; NULL
 * without memory (each chunk then rounds for itself). */
static const uint16_t *round_rows_once(cpu *c, int slot, const float *x, int rows, int k)
{
    const size_t need = (size_t)rows * (size_t)gemm_bf16_round_ld(k) * sizeof(uint16_t);
    if (c->xr_cap[slot] < need) { /* on a cache line, as falloc's */
        void *p = aligned_alloc(64, (need + 63) & ~(size_t)63);
        if (!p) return NULL;
        free(c->xr_mem[slot]);
        c->xr_mem[slot] = p;
        c->xr_cap[slot] = need;
    }
    const int nw = c->workers.n_workers;
    const round_arg a = {x, k, c->xr_mem[slot]};
    run_rows(c, rows, rows >= 64 ? 2 * nw : 1, round_part, &a);
    return c->xr_mem[slot];
}

typedef struct quant_arg {
    q_xq *a;
    const float *x;
} quant_arg;

static void quant_part(cpu *c, int r0, int r1, const void *arg)
{
    (void)c;
    const quant_arg *q = arg;
    q_xq_fill(q->a, q->x, r0, r1);
}

/* x (rows of k floats) quantized for the integer paths into slot's memory, split by rows
 * among the workers (on the caller alone it was 5-8% of a one-thread Q8_0 prefill, perf
 * record); with their Q8_K form only where q8k; NULL where q_xq_prepare would be. */
static const q_xq *quantize_rows_once(cpu *c, int slot, const float *x, int rows, int k, bool q8k,
                                      bool q8k_only)
{
    q_xq *a = q8k_only ? q_xq_plan_q8k_only(c->xq_mem[slot], c->xq_cap[slot], rows, k)
                       : q_xq_plan(c->xq_mem[slot], c->xq_cap[slot], rows, k, q8k);
    if (!a) return NULL;
    const int nw = c->workers.n_workers;
    const quant_arg q = {a, x};
    run_rows(c, rows, rows >= 64 ? 2 * nw : 1, quant_part, &q);
    return a;
}

/* Weight rows a chunk of a matrix of n rows takes, for a product with rows activation rows:
 * a few chunks per worker so a descheduled worker (the cores are shared) does not hold
 * everyone up, but each big enough for BLAS; one a worker for a batch of one row (where the
 * engine has one worker, or a mixture's experts; on more workers a lone row's products are
 * split regions in grains: mm_grain_rows), whose products are so short (stories110M Q4_0:
 * 330 KB of Wo, 15 us on two threads) that each fixed chunk's start — its claim crossing
 * between the vCPUs, its weight stream starting cold — cost more than an uneven end
 * (results/2026-12-07-batch1-overheads-zen4-s13.md), while at 4 and 16 rows F16 lost 5-6%
 * with one chunk a worker. */
static int mm_chunk_rows(int n, int n_workers, int rows)
{
    const int want = n_workers == 1 || rows == 1 ? n_workers : n_workers * 2;
    int chunk = (n + want - 1) / want;
    chunk = (chunk + 7) & ~7; /* multiples of 8 keep equal shares (288 = 4 x 72) */
    return chunk < 32 ? 32 : chunk;
}

/*
 * A lone row's products run as split regions (pool_run_split): each worker owns a contiguous
 * share of a product's rows and reads it as one stream, claiming half of what is left at a
 * time, and a worker that ends first takes the back half of what the other has not claimed
 * yet, down to one grain. Grains of MM_GRAIN_BYTES of weights (rows in multiples of 32: the
 * packed panels' and every one-row kernel's groups): small enough that the two workers end
 * within a few microseconds of each other, whichever one the host slowed down or
 * descheduled. Fixed halves (one chunk a worker, as before) left the faster worker idle at
 * every product's end; two or more fixed chunks a worker cost more than that at their starts
 * (results/2026-12-07-batch1-overheads-zen4-s13.md), which the owner's claims of half its
 * share avoid: a share takes a few calls, not one a grain. Which worker computes a row does
 * not change its bits.
 */
#define MM_GRAIN_BYTES (16 * 1024)

/* Weight rows of one grain of job j in a split region (see above). */
static int mm_grain_rows(const mm_job *j)
{
    const size_t row_bytes =
        eng_wrow_bytes(j->w.type, j->k) + (j->up.data ? eng_wrow_bytes(j->up.type, j->k) : 0);
    int g = (int)((MM_GRAIN_BYTES + row_bytes - 1) / row_bytes);
    g = (g + 31) & ~31;
    return g < j->n ? g : j->n;
}

/* Whether a product of rows activation rows with w (and up, when it has data) reads them
 * quantized to 8 bits (matmul_rows takes the integer or the integer-tile path with xq). */
static bool mm_reads_xq(eng_wmat w, eng_wmat up, int rows)
{
    return q_int_path(w.type, rows) || q_prefill_runs(w.type, rows) ||
           (up.data && (q_int_path(up.type, rows) || q_prefill_runs(up.type, rows)));
}

/* How many of rows (the first prompt_rows prompt rows) a product with w (and up, when it has
 * data) reads rounded to bf16 for gemm_bf16's tiles: all of them where those take every row,
 * the prompt rows where they take prompt rows only (mm_rows), else none. */
static int xr_rows_of(const cpu *c, eng_wmat w, eng_wmat up, int rows, int prompt_rows)
{
    if (takes_bf16_tiles(w.type, rows) || (up.data && takes_bf16_tiles(up.type, rows))) return rows;
    if (prompt_rows > 0 && (prompt_split(c, w.type) || (up.data && prompt_split(c, up.type))))
        return prompt_rows;
    return 0;
}

/*
 * Rows rounded to bf16 by the pass that makes them. matmul_jobs rounds the rows a region's
 * products read in a region of its own, each part by whichever worker claims it: a pass over
 * every row, from the other core's cache for about half of them, and one more wait for the
 * slower worker, three times a layer. The norms before the attention and the FFN, and the
 * SwiGLU of the gated product, round the rows (or columns) they make as they make them
 * (cpu.xr_pre), into a buffer of the one kind, and matmul_jobs takes them instead: the same
 * rounding of the same floats (gemm_bf16_round_cols), so the same bits.
 */

/* Buffer which of cpu.xr_pre_mem for rows of k elements rounded (gemm_bf16_round_ld apart),
 * grown as needed; NULL without memory (the products then round for themselves). */
static uint16_t *xr_pre_buf(cpu *c, int which, int rows, int k)
{
    const size_t need = (size_t)rows * (size_t)gemm_bf16_round_ld(k) * sizeof(uint16_t);
    if (c->xr_pre_cap[which] < need) {
        void *p = aligned_alloc(64, (need + 63) & ~(size_t)63);
        if (!p) return NULL;
        free(c->xr_pre_mem[which]);
        c->xr_pre_mem[which] = p;
        c->xr_pre_cap[which] = need;
    }
    return c->xr_pre_mem[which];
}

/* The first rows of x (k floats each) are at xr rounded, for the next region's products. */
static void xr_made(cpu *c, const float *x, int k, int rows, const uint16_t *xr)
{
    c->xr_pre.x = x;
    c->xr_pre.k = k;
    c->xr_pre.rows = rows;
    c->xr_pre.xr = xr;
}

/* Runs the jobs as one parallel region, each in chunks of mm_chunk_rows. The first
 * prompt_rows rows are prompt rows (mm_rows). */
static void matmul_jobs(cpu *c, mm_job *jobs, int n_jobs, int rows, int prompt_rows)
{
    int nw = c->workers.n_workers;
    int total = 0;
    const bool split = rows == 1 && nw > 1; /* a lone row's products: mm_grain_rows */
    for (int i = 0; i < n_jobs; i++) {
        jobs[i].chunk_rows = split ? mm_grain_rows(&jobs[i]) : mm_chunk_rows(jobs[i].n, nw, rows);
        /* weights packed once are read in panels of 32 rows: chunks start on one */
        if (packed_of(c, jobs[i].w) && (takes_bf16_tiles(jobs[i].w.type, rows) ||
                                        (prompt_rows > 0 && prompt_split(c, jobs[i].w.type))))
            jobs[i].chunk_rows = (jobs[i].chunk_rows + 31) & ~31;
        /* the K types packed for decode rows lie 16 rows to a tile: chunks start on one */
        if (packed_of(c, jobs[i].w) && rows <= Q_PACKED_MAX_ROWS)
            jobs[i].chunk_rows = (jobs[i].chunk_rows + Q_PACKED_ROWS - 1) & -Q_PACKED_ROWS;
        jobs[i].n_chunks = (jobs[i].n + jobs[i].chunk_rows - 1) / jobs[i].chunk_rows;
        total += jobs[i].n_chunks;
    }
    /* Quantized weights read the rows quantized to 8 bits: quantized here, once for every
     * chunk of every job that reads them, not by each chunk again. */
    int slot = 0;
    for (int i = 0; i < n_jobs; i++) {
        mm_job *j = &jobs[i];
        j->xq = NULL;
        if (!mm_reads_xq(j->w, j->up, rows)) continue;
        for (int p = 0; p < i && !j->xq; p++)
            if (jobs[p].x == j->x && jobs[p].k == j->k) j->xq = jobs[p].xq;
        if (j->xq || slot == CPU_XQ_SLOTS) continue;
        const size_t need = q_xq_bytes(rows, j->k);
        if (c->xq_cap[slot] < need) {
            void *p = realloc(c->xq_mem[slot], need);
            if (!p) continue; /* each chunk quantizes for itself */
            c->xq_mem[slot] = p;
            c->xq_cap[slot] = need;
        }
        /* the Q8_K form only where a job of the region reading these rows has weights that
         * read it (a tenth of a Q8_0 prefill's time went to it, perf record) */
        /* and the Q8_K form alone where every such job reads nothing else (a lone row with
         * Q4_K and Q6_K weights: the 32-element form was two thirds of the quantizing, which
         * the caller does alone between regions, 2.5% of a Q4_K_M token, perf record) */
        bool q8k = false, q8k_only = true;
        for (int p = i; p < n_jobs; p++)
            if (jobs[p].x == j->x && jobs[p].k == j->k) {
                q8k |= q_reads_q8k(jobs[p].w.type) ||
                       (jobs[p].up.data && q_reads_q8k(jobs[p].up.type));
                q8k_only &= q_reads_only_q8k(jobs[p].w.type, rows, j->k) &&
                            (!jobs[p].up.data || q_reads_only_q8k(jobs[p].up.type, rows, j->k));
            }
        j->xq = quantize_rows_once(c, slot++, j->x, rows, j->k, q8k, q8k_only);
    }
    /* Weights in gemm_bf16's tiles read the rows rounded to bf16: rounded here, once for every
     * chunk of every job that reads them. (Each chunk rounded all rows again for every 128
     * weight rows of its own: on two threads 24 times for Q, K and V, 32 for the gate and up
     * products, 8 for the others; 7% of a prefill's time, perf record.) */
    /* (Prompt rows of F32 / F16 weights take them too: those rows rounded, or all where the
     * others do as well.) */
    /* (Rows their pass rounded already, cpu.xr_pre, are taken as they are.) */
    slot = 0;
    for (int i = 0; i < n_jobs; i++) {
        mm_job *j = &jobs[i];
        j->xr = NULL;
        j->xr_rows = xr_rows_of(c, j->w, j->up, rows, prompt_rows);
        if (!j->xr_rows) continue;
        if (c->xr_pre.x == j->x && c->xr_pre.k == j->k && c->xr_pre.rows >= j->xr_rows)
            j->xr = c->xr_pre.xr;
        for (int p = 0; p < i && !j->xr; p++)
            if (jobs[p].x == j->x && jobs[p].k == j->k && jobs[p].xr_rows >= j->xr_rows)
                j->xr = jobs[p].xr;
        if (j->xr || slot == CPU_XQ_SLOTS) continue;
        j->xr = round_rows_once(c, slot++, j->x, j->xr_rows, j->k);
    }
    c->xr_pre.x = NULL; /* the pass after this region writes those rows again */
    mm_region r = {jobs, n_jobs, rows, prompt_rows, c};
    if (split)
        pool_run_split(&c->workers, total, mm_range, &r);
    else
        pool_run(&c->workers, total, mm_task, &r);
}

/* ---- elementwise pieces (as run.c) -------------------------------------------------- */

static void rmsnorm(float *o, const float *x, const float *weight, int size, float eps)
{
    float ss = 0.0f;
    for (int j = 0; j < size; j++) ss += x[j] * x[j];
    ss /= size;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < size; j++) o[j] = weight[j] * (ss * x[j]);
}

/* Rotates adjacent pairs (2j, 2j+1) of each head of vec by pos * 10000^(-h/head_size).
 * GGUF models: the base and the rotated dimensions come from the file, and qwen2 rotates
 * the pairs (j, j + rope_dim/2) ("NEOX" order) instead. */
static void rope(const cpu *c, float *vec, int len, int pos)
{
    const int half = c->head_size / 2;
    const float *cos_t = c->window ? c->rope_cos_swa : c->rope_cos;
    const float *sin_t = c->window ? c->rope_sin_swa : c->rope_sin;
    const float *cs = cos_t + (size_t)pos * half, *sn = sin_t + (size_t)pos * half;
    if (c->hp.rope_neox || c->hp.rope_dim != c->head_size) {
        const int rh = c->hp.rope_dim / 2;
        for (int h0 = 0; h0 < len; h0 += c->head_size) {
            float *v = vec + h0;
            for (int j = 0; j < rh; j++) {
                int a = c->hp.rope_neox ? j : 2 * j, b = c->hp.rope_neox ? j + rh : 2 * j + 1;
                float v0 = v[a], v1 = v[b];
                v[a] = v0 * cs[j] - v1 * sn[j];
                v[b] = v0 * sn[j] + v1 * cs[j];
            }
        }
        return;
    }
    /* head by head: the pair's angle without a division per pair (i % head_size was most of
     * the time RoPE took, 1.5% of a one-thread BF16 prefill, perf record) */
    for (int h0 = 0; h0 < len; h0 += c->head_size) {
        float *v = vec + h0;
        for (int j = 0; j < half; j++) {
            const float v0 = v[2 * j], v1 = v[2 * j + 1];
            v[2 * j] = v0 * cs[j] - v1 * sn[j];
            v[2 * j + 1] = v0 * sn[j] + v1 * cs[j];
        }
    }
}

/* o[r] = rmsnorm(x[r]) * weight for rows r < n, rows ld apart: rmsnorm's arithmetic, row by
 * row the same bits, with the sums of squares of eight rows at a time side by side. One row's
 * sum is a chain of dependent additions (in order: its bits), which left the core idle for
 * most of each addition's latency: 2% of a one-thread BF16 prefill (perf record). Eight
 * independent chains fill it. Not in a clone: a target with FMA would fuse x * x + ss. */
static void rmsnorm_rows(float *o, const float *x, size_t ld, int n, const float *weight, int size,
                         float eps)
{
    int r = 0;
    for (; r + 8 <= n; r += 8, x += 8 * ld, o += 8 * ld) {
        /* eight scalars, not an array: GCC vectorized an array of sums in memory, each
         * addition then waiting for the store of the one before */
        const float *x0 = x, *x1 = x0 + ld, *x2 = x1 + ld, *x3 = x2 + ld, *x4 = x3 + ld,
                    *x5 = x4 + ld, *x6 = x5 + ld, *x7 = x6 + ld;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f, s6 = 0.0f,
              s7 = 0.0f;
        for (int j = 0; j < size; j++) {
            s0 += x0[j] * x0[j], s1 += x1[j] * x1[j], s2 += x2[j] * x2[j];
            s3 += x3[j] * x3[j], s4 += x4[j] * x4[j], s5 += x5[j] * x5[j];
            s6 += x6[j] * x6[j], s7 += x7[j] * x7[j];
        }
        const float ss[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
        for (int q = 0; q < 8; q++) {
            float s = ss[q] / size;
            s += eps;
            s = 1.0f / sqrtf(s);
            const float *restrict xq = x + (size_t)q * ld;
            float *restrict oq = o + (size_t)q * ld;
            for (int j = 0; j < size; j++) oq[j] = weight[j] * (s * xq[j]);
        }
    }
    for (; r < n; r++, x += ld, o += ld) rmsnorm(o, x, weight, size, eps);
}

/* x[r] += rmsnorm(xb[r]) * weight for each row: gemma's norm of a block's output before
 * the residual add. */
static void post_norm_add(cpu *c, const float *weight, int T)
{
    const int dim = c->c.dim;
    for (int r = 0; r < T; r++) {
        float *o = c->xb + (size_t)r * dim, *x = c->x + (size_t)r * dim;
        rmsnorm(o, o, weight, dim, c->hp.norm_eps);
        for (int i = 0; i < dim; i++) x[i] += o[i];
    }
}

/* ---- mixture of experts -------------------------------------------------------------- */

/*
 * The experts of a layer run as one parallel region, whatever the batch: each chosen
 * expert's rows are gathered (a row alone is read where it lies), and the region's tasks
 * are first every expert's gate and up products in chunks of weight rows (mm_chunk_rows,
 * so both workers share each expert's weights, read once for all its rows), then every
 * expert's down products in chunks. A down task waits for its expert's last up chunk
 * (moe_up_task marks it ready, with its rows quantized for the down product), not for the
 * whole region: tasks are claimed in index order, so by then every up chunk is running or
 * done and the wait is the tail of one chunk.
 *
 * A row alone, whose experts all weigh the same (one row each), takes whole experts where
 * they split evenly among the workers: a task is one expert's gate, up and down, so a worker
 * streams its expert's weights without waiting for another's up chunk, and 2 tasks replace 8
 * at 2 chosen experts on 2 workers (qwen3moe stories110M Q4_K_M, two threads: the experts'
 * time a step 5% lower, results/2026-12-07-moe-decode-zen4-s14.md).
 */
typedef struct moe_work {
    cpu *c;
    const eng_layer_weights *lw;
    int n_active;  /* experts with rows in this batch */
    int *eid;      /* [n_expert] their ids, ascending */
    int *first;    /* [n_expert + 1] gathered rows of the i-th: first[i] .. first[i+1] */
    int *prompt;   /* [n_expert] how many of them (the first) are prompt rows (mm_rows) */
    bool gathered; /* the rows gathered in moe_x, or a row alone read where it lies (xb) */
    bool whole;    /* a task is one whole expert: its gate and up, then its down */
    int up_rows, up_chunks, down_rows, down_chunks; /* a chunk's weight rows, chunks an expert */
    size_t gate_rb, up_rb, down_rb;
    const q_xq **xq_up, **xq_down; /* [n_expert]: the rows quantized, or NULL */
    void **xq_down_mem;            /* [n_expert]: where the up task quantizes the down rows */
    size_t *xq_down_bytes;
    _Atomic uint32_t *up_left; /* [n_expert]: up chunks of the i-th not yet done */
    _Atomic uint32_t *ready;   /* [n_expert]: its down product's rows made */
    void *xq_mem;              /* the quantized rows of every expert, grown as needed */
    size_t xq_cap;
} moe_work;

static void moe_work_destroy(moe_work *w)
{
    if (!w) return;
    free(w->eid), free(w->first), free(w->prompt), free(w->xq_up), free(w->xq_down),
        free(w->xq_down_mem);
    free(w->xq_down_bytes), free(w->up_left), free(w->ready), free(w->xq_mem), free(w);
}

static moe_work *moe_work_create(int n_expert)
{
    const size_t ne = (size_t)n_expert;
    moe_work *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->eid = malloc(ne * sizeof *w->eid);
    w->first = malloc((ne + 1) * sizeof *w->first);
    w->prompt = malloc(ne * sizeof *w->prompt);
    w->xq_up = malloc(ne * sizeof *w->xq_up);
    w->xq_down = malloc(ne * sizeof *w->xq_down);
    w->xq_down_mem = malloc(ne * sizeof *w->xq_down_mem);
    w->xq_down_bytes = malloc(ne * sizeof *w->xq_down_bytes);
    w->up_left = malloc(ne * sizeof *w->up_left);
    w->ready = malloc(ne * sizeof *w->ready);
    if (!w->eid || !w->first || !w->prompt || !w->xq_up || !w->xq_down || !w->xq_down_mem ||
        !w->xq_down_bytes || !w->up_left || !w->ready) {
        moe_work_destroy(w);
        return NULL;
    }
    return w;
}

/* rows x k floats quantized into mem for the integer paths, with their Q8_K form only where
 * q8k (weights that read it: without it the other types' products are the same bits, and a
 * Q8_0 prefill spent a tenth of its time on it); NULL where q_xq_prepare would be. */
static const q_xq *moe_quantize(void *mem, size_t bytes, const float *x, int rows, int k, bool q8k)
{
    q_xq *a = q_xq_plan(mem, bytes, rows, k, q8k);
    if (a) q_xq_fill(a, x, 0, rows);
    return a;
}

/* Chunk ch of the i-th active expert's gate and up products, SwiGLU'd into moe_h1; the
 * chunk that ends the expert's last quantizes its rows for the down product and marks it
 * ready (the other chunks' stores came before their acq_rel decrements). */
static void moe_up_task(moe_work *w, int i, int ch)
{
    cpu *c = w->c;
    const eng_layer_weights *lw = w->lw;
    const int dim = c->c.dim, ff = c->hp.expert_ff, e = w->eid[i];
    const int r0 = w->first[i], rows = w->first[i + 1] - r0;
    const int n0 = ch * w->up_rows, n = ff - n0 < w->up_rows ? ff - n0 : w->up_rows;
    const float *x = w->gathered ? c->moe_x + (size_t)r0 * dim : c->xb;
    float *h1 = c->moe_h1 + (size_t)r0 * ff, *h3 = c->moe_h3 + (size_t)r0 * ff;
    const eng_wmat gate = {(const char *)lw->gate_exps.data + (size_t)e * ff * w->gate_rb,
                           lw->gate_exps.type};
    const eng_wmat up = {(const char *)lw->up_exps.data + (size_t)e * ff * w->up_rb,
                         lw->up_exps.type};
    mm_rows(c, rows, w->prompt[i], x, w->xq_up[i], NULL, gate, n0, n, dim, 0.0f, h1 + n0, ff);
    mm_rows(c, rows, w->prompt[i], x, w->xq_up[i], NULL, up, n0, n, dim, 0.0f, h3 + n0, ff);
    for (int t = 0; t < rows; t++) swiglu(h1 + (size_t)t * ff + n0, h3 + (size_t)t * ff + n0, n);
    if (atomic_fetch_sub_explicit(&w->up_left[i], 1, memory_order_acq_rel) != 1) return;
    w->xq_down[i] = w->xq_down_mem[i] ? moe_quantize(w->xq_down_mem[i], w->xq_down_bytes[i], h1,
                                                     rows, ff, q_reads_q8k(lw->down_exps.type))
                                      : NULL;
    pool_flag_set(&c->workers, &w->ready[i]);
}

/* Chunk ch of the i-th active expert's down product into moe_out, once its rows are made. */
static void moe_down_task(moe_work *w, int i, int ch)
{
    cpu *c = w->c;
    const eng_layer_weights *lw = w->lw;
    const int dim = c->c.dim, ff = c->hp.expert_ff, e = w->eid[i];
    const int r0 = w->first[i], rows = w->first[i + 1] - r0;
    const int n0 = ch * w->down_rows, n = dim - n0 < w->down_rows ? dim - n0 : w->down_rows;
    const eng_wmat down = {(const char *)lw->down_exps.data + (size_t)e * dim * w->down_rb,
                           lw->down_exps.type};
    pool_flag_wait(&c->workers, &w->ready[i]);
    mm_rows(c, rows, w->prompt[i], c->moe_h1 + (size_t)r0 * ff, w->xq_down[i], NULL, down, n0, n,
            ff, 0.0f, c->moe_out + (size_t)r0 * dim + n0, dim);
}

static void moe_task(void *ctx, int task, int worker)
{
    (void)worker;
    moe_work *w = ctx;
    if (w->whole) { /* one chunk each: its up marks it ready before its down reads it */
        moe_up_task(w, task, 0);
        moe_down_task(w, task, 0);
        return;
    }
    const int n_up = w->n_active * w->up_chunks;
    if (task < n_up)
        moe_up_task(w, task / w->up_chunks, task % w->up_chunks);
    else
        moe_down_task(w, (task - n_up) / w->down_chunks, (task - n_up) % w->down_chunks);
}

/* Sets the quantized rows of every active expert (xq_up, and where xq_down_mem the up task
 * quantizes into), in one buffer grown as needed; with no memory for it, none (each chunk
 * then quantizes for itself, to the same bits). */
static void moe_prepare_xq(moe_work *w, int T)
{
    cpu *c = w->c;
    const eng_layer_weights *lw = w->lw;
    const int dim = c->c.dim, ff = c->hp.expert_ff;
    const eng_wmat none = {0};
    size_t need = 0;
    for (int i = 0; i < w->n_active; i++) {
        const int rows = w->first[i + 1] - w->first[i];
        if (mm_reads_xq(lw->gate_exps, lw->up_exps, rows) && (T > 1 || i == 0))
            need += q_xq_bytes(rows, dim) + 64;
        if (mm_reads_xq(lw->down_exps, none, rows)) need += q_xq_bytes(rows, ff) + 64;
    }
    if (need > w->xq_cap) {
        void *p = realloc(w->xq_mem, need);
        if (p) {
            w->xq_mem = p;
            w->xq_cap = need;
        }
    }
    const bool have = need <= w->xq_cap;
    char *mem = w->xq_mem;
    for (int i = 0; i < w->n_active; i++) {
        const int r0 = w->first[i], rows = w->first[i + 1] - r0;
        w->xq_up[i] = w->xq_down[i] = NULL;
        w->xq_down_mem[i] = NULL;
        if (have && mm_reads_xq(lw->gate_exps, lw->up_exps, rows)) {
            if (T == 1 && i > 0) /* a row alone: one quantized row for every expert */
                w->xq_up[i] = w->xq_up[0];
            else {
                const size_t bytes = q_xq_bytes(rows, dim) + 64;
                w->xq_up[i] =
                    moe_quantize(mem, bytes, T > 1 ? c->moe_x + (size_t)r0 * dim : c->xb, rows, dim,
                                 q_reads_q8k(lw->gate_exps.type) || q_reads_q8k(lw->up_exps.type));
                mem += bytes;
            }
        }
        if (have && mm_reads_xq(lw->down_exps, none, rows)) {
            w->xq_down_mem[i] = mem;
            w->xq_down_bytes[i] = q_xq_bytes(rows, ff) + 64;
            mem += w->xq_down_bytes[i];
        }
    }
}

/*
 * x += Σ_k w_k · down_k(silu(gate_k(xb)) ⊙ up_k(xb)) for each row, over the n_expert_used
 * experts its router picks, as llama.cpp's qwen3moe: softmax of the router logits, the
 * top-k probabilities (ties to the lower expert), renormalised to sum 1. Rows are grouped by
 * expert, so only the chosen experts' weights are read, each once for all its rows, in the
 * order of the batch: the prompt rows (the first prompt_rows) first. Each row adds its
 * experts' outputs in the order of their ids, alone as in a batch (a row's products do not
 * depend on the rows beside it), so the sums are the same bits. The router stays in exact
 * float32 for every row: a choice between experts is not to be flipped by rounding.
 */
static void moe_ffn(cpu *c, const eng_layer_weights *lw, int T, int prompt_rows)
{
    const int dim = c->c.dim, ne = c->hp.n_expert, nk = c->hp.n_expert_used;
    mm_job route = {.w = lw->router, .n = ne, .k = dim, .x = c->xb, .y = c->moe_logits, .ld_y = ne};
    matmul_jobs(c, &route, 1, T, 0);
    for (int r = 0; r < T; r++) {
        float *p = c->moe_logits + (size_t)r * ne, max = -INFINITY, sum = 0.0f;
        for (int e = 0; e < ne; e++)
            if (p[e] > max) max = p[e];
        for (int e = 0; e < ne; e++) sum += p[e] = expf(p[e] - max);
        for (int e = 0; e < ne; e++) p[e] /= sum;
        int *chosen = c->moe_e + (size_t)r * nk;
        float *wk = c->moe_w + (size_t)r * nk, wsum = 0.0f;
        for (int k = 0; k < nk; k++) {
            int best = -1;
            for (int e = 0; e < ne; e++) {
                bool taken = false;
                for (int j = 0; j < k; j++) taken |= chosen[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            chosen[k] = best;
            wk[k] = p[best];
            wsum += p[best];
        }
        for (int k = 0; k < nk; k++) wk[k] /= wsum;
    }
    /* the (row, slot)s of each expert, experts by id and rows in order (a counting sort) */
    moe_work *w = c->moe;
    int *at = c->moe_count; /* [n_expert]: rows of expert e, then where its next one goes */
    memset(at, 0, (size_t)ne * sizeof *at);
    for (int s = 0; s < T * nk; s++) at[c->moe_e[s]]++;
    w->n_active = 0;
    int n = 0;
    for (int e = 0; e < ne; e++) {
        if (!at[e]) continue;
        w->eid[w->n_active] = e;
        w->first[w->n_active++] = n;
        const int rows = at[e];
        at[e] = n;
        n += rows;
    }
    w->first[w->n_active] = n;
    for (int s = 0; s < T * nk; s++) c->moe_rows[at[c->moe_e[s]]++] = s;
    for (int i = 0; i < w->n_active; i++) { /* rows in order: its prompt rows come first */
        int g = w->first[i];
        while (g < w->first[i + 1] && c->moe_rows[g] / nk < prompt_rows) g++;
        w->prompt[i] = g - w->first[i];
    }
    if (T > 1)
        for (int i = 0; i < n; i++)
            memcpy(c->moe_x + (size_t)i * dim, c->xb + (size_t)(c->moe_rows[i] / nk) * dim,
                   (size_t)dim * sizeof(float));
    w->c = c;
    w->lw = lw;
    w->gathered = T > 1;
    w->gate_rb = eng_wrow_bytes(lw->gate_exps.type, dim);
    w->up_rb = eng_wrow_bytes(lw->up_exps.type, dim);
    w->down_rb = eng_wrow_bytes(lw->down_exps.type, c->hp.expert_ff);
    const int nw = c->workers.n_workers;
    w->whole = T == 1 && w->n_active % nw == 0;
    w->up_rows = w->whole ? c->hp.expert_ff : mm_chunk_rows(c->hp.expert_ff, nw, T);
    w->up_chunks = (c->hp.expert_ff + w->up_rows - 1) / w->up_rows;
    w->down_rows = w->whole ? dim : mm_chunk_rows(dim, nw, T);
    w->down_chunks = (dim + w->down_rows - 1) / w->down_rows;
    for (int i = 0; i < w->n_active; i++) {
        atomic_store_explicit(&w->up_left[i], (uint32_t)w->up_chunks, memory_order_relaxed);
        atomic_store_explicit(&w->ready[i], 0, memory_order_relaxed);
    }
    moe_prepare_xq(w, T);
    pool_run(&c->workers, w->whole ? w->n_active : w->n_active * (w->up_chunks + w->down_chunks),
             moe_task, w);
    for (int i = 0; i < n; i++) {
        const int s = c->moe_rows[i];
        const float wgt = c->moe_w[s], *o = c->moe_out + (size_t)i * dim;
        float *x = c->x + (size_t)(s / nk) * dim;
        for (int j = 0; j < dim; j++) x[j] += wgt * o[j];
    }
}

/* ---- the rows' own work -------------------------------------------------------------- */

/*
 * What each row needs of its own row only — its norms, its Q/K/V biases, head norms, RoPE and
 * KV writes — runs split by rows among the workers where a batch has rows enough (prefill):
 * run on the caller alone, while the helpers waited, it was 4% of a one-thread prefill, and
 * twice that share at two threads. Each row's arithmetic is the same whichever worker does
 * it, so its bits are too.
 */
#define ROWS_PARALLEL_MIN 32 /* rows from which a batch's row work is split */

/* fn(c, r0, r1, arg) over rows [0, rows) in parts (two a worker: a descheduled worker's share
 * is taken over), or on the caller for fewer than ROWS_PARALLEL_MIN rows. */
static void for_rows(cpu *c, int rows, rows_fn fn, const void *arg)
{
    const int nw = c->workers.n_workers;
    if (nw == 1 || rows < ROWS_PARALLEL_MIN) {
        fn(c, 0, rows, arg);
        return;
    }
    run_rows(c, rows, 2 * nw, fn, arg);
}

typedef struct norm_arg {
    const float *weight;
    uint16_t *xr; /* the first xr_rows rows of xb rounded to bf16 here, or NULL */
    int xr_rows;
} norm_arg;

/* xb[r] = rmsnorm(x[r]) * weight, and rounded to bf16 for r < xr_rows. */
static void norm_part(cpu *c, int r0, int r1, const void *arg)
{
    const norm_arg *a = arg;
    const int dim = c->c.dim, ld_r = gemm_bf16_round_ld(dim);
    rmsnorm_rows(c->xb + (size_t)r0 * dim, c->x + (size_t)r0 * dim, (size_t)dim, r1 - r0, a->weight,
                 dim, c->hp.norm_eps);
    const int m1 = r1 < a->xr_rows ? r1 : a->xr_rows;
    if (m1 > r0)
        gemm_bf16_round(m1 - r0, dim, c->xb + (size_t)r0 * dim, dim, a->xr + (size_t)r0 * ld_r);
}

/* xb = rmsnorm(x) * weight for T rows, and the first xr_rows of them rounded to bf16 for the
 * next region's products (xr_made; 0: none). */
static void norm_rows(cpu *c, int T, const float *weight, int xr_rows)
{
    norm_arg a = {weight, xr_rows > 0 ? xr_pre_buf(c, 0, xr_rows, c->c.dim) : NULL, 0};
    if (a.xr) a.xr_rows = xr_rows;
    for_rows(c, T, norm_part, &a);
    if (a.xr) xr_made(c, c->xb, c->c.dim, xr_rows, a.xr);
}

/* A row's Q, K and V made: qwen2's biases, qwen3's head norms, RoPE at the row's position,
 * and K, V written to the row's KV slot (c->layer's). */
static void qkv_rows(cpu *c, int r0, int r1, const void *arg)
{
    const eng_layer_weights *lw = arg;
    const eng_batch *b = c->b;
    const int q_dim = c->q_dim, kv_dim = c->kv_dim, hs = c->head_size, bs = c->block_size;
    const int l = c->layer;
    for (int r = r0; r < r1; r++) {
        float *q = c->q + (size_t)r * q_dim, *k = c->k + (size_t)r * kv_dim;
        float *v = c->v + (size_t)r * kv_dim;
        if (lw->bq) { /* qwen2's Q/K/V biases */
            for (int i = 0; i < q_dim; i++) q[i] += lw->bq[i];
            for (int i = 0; i < kv_dim; i++) {
                k[i] += lw->bk[i];
                v[i] += lw->bv[i];
            }
        }
        if (lw->q_norm) { /* qwen3: each Q and K head RMS-normalised before RoPE */
            for (int i = 0; i < q_dim; i += hs)
                rmsnorm(q + i, q + i, lw->q_norm, hs, c->hp.norm_eps);
            for (int i = 0; i < kv_dim; i += hs)
                rmsnorm(k + i, k + i, lw->k_norm, hs, c->hp.norm_eps);
        }
        const int pos = b->positions[r];
        rope(c, q, q_dim, pos);
        rope(c, k, kv_dim, pos);
        const int64_t slot = c->layer_ring[l] ? c->ring_slots[r] : b->slot_mapping[r];
        const int block = (int)(slot / bs), off = (int)(slot % bs);
        memcpy(kv_at(c, block, l, 0, off), k, (size_t)kv_dim * sizeof(float));
        memcpy(kv_at(c, block, l, 1, off), v, (size_t)kv_dim * sizeof(float));
    }
}

/* ---- prompt rows first -------------------------------------------------------------- */

/*
 * The batch to execute with its prompt rows first, *prompt_rows of them (eng_batch
 * prompt_len), so that every product takes two ranges of rows, [0, P) and [P, T) (mm_rows).
 * That is the batch itself where they already come first (prefill chunks, decode rows, a
 * recomputed sequence alone), else c->ord.b: the same rows, every sequence's prompt rows and
 * then every sequence's generated rows, each part of a sequence a sequence of its own (its
 * rows' positions, slots, block table and ring; seq_len the part's last position + 1), so
 * the KV writes, ring slots and attention tiles read it as any batch; the logits rows point
 * to where their rows went. Every row-wise step gives a row the same bits wherever it sits.
 * -ENOMEM where the copy's block table cannot grow.
 */
static int order_prompt_rows(cpu *c, const eng_batch *b, const eng_batch **out, int *prompt_rows)
{
    *out = b;
    *prompt_rows = 0;
    if (!c->prompt_bf16 || !b->prompt_len) return 0;
    const int S = b->n_seqs;
    const int32_t *qs = b->query_start;
    int P = 0;
    bool first = true; /* the prompt rows are rows 0 .. P - 1 */
    for (int s = 0; s < S; s++)
        for (int r = qs[s]; r < qs[s + 1]; r++)
            if (b->positions[r] < b->prompt_len[s]) first &= r == P++;
    *prompt_rows = P;
    if (first) return 0;
    const size_t stride = (size_t)b->block_table_stride, need = 2 * (size_t)S * stride;
    if (c->ord.table_cap < need) {
        int32_t *t = realloc(c->ord.block_table, need * sizeof *t);
        if (!t)
            return eng_seterr(-ENOMEM, "CPU batch order: out of memory for %d block tables of %zu",
                              2 * S, stride);
        c->ord.block_table = t;
        c->ord.table_cap = need;
    }
    int n = 0, parts = 0;
    for (int pass = 0; pass < 2; pass++) /* 0: prompt rows, 1: generated rows */
        for (int s = 0; s < S; s++) {
            const int start = n;
            for (int r = qs[s]; r < qs[s + 1]; r++) {
                if ((b->positions[r] < b->prompt_len[s]) != (pass == 0)) continue;
                c->ord.where[r] = n;
                c->ord.tokens[n] = b->tokens[r];
                c->ord.positions[n] = b->positions[r];
                c->ord.slots[n++] = b->slot_mapping[r];
            }
            if (n == start) continue;
            c->ord.query_start[parts] = start;
            c->ord.seq_len[parts] = c->ord.positions[n - 1] + 1;
            c->ord.ring[parts] = b->ring ? b->ring[s] : -1;
            memcpy(c->ord.block_table + (size_t)parts * stride, b->block_table + (size_t)s * stride,
                   stride * sizeof(int32_t));
            parts++;
        }
    c->ord.query_start[parts] = n;
    for (int i = 0; i < b->n_logits; i++) c->ord.logits_rows[i] = c->ord.where[b->logits_rows[i]];
    c->ord.b = (eng_batch){.n_tokens = n,
                           .tokens = c->ord.tokens,
                           .positions = c->ord.positions,
                           .slot_mapping = c->ord.slots,
                           .n_seqs = parts,
                           .query_start = c->ord.query_start,
                           .seq_len = c->ord.seq_len,
                           .block_table = c->ord.block_table,
                           .block_table_stride = b->block_table_stride,
                           .n_logits = b->n_logits,
                           .logits_rows = c->ord.logits_rows,
                           .ring = b->ring ? c->ord.ring : NULL};
    *out = &c->ord.b;
    return 0;
}

/* ---- the last layer's tail ---------------------------------------------------------- */

/*
 * After the last layer only the logits rows are read (the final norm and the classifier),
 * and every row's K and V are written by then: the last layer's attention, Wo and FFN of the
 * other rows made nothing anyone reads. A prompt of 256 rows with the last row's logits spent
 * most of a layer, a twelfth of stories110M's time, on them; llama.cpp drops those rows too
 * (inp_out_ids). So the last layer's tail runs for the logits rows alone: the attention
 * tiles that hold one, then Wo, the norm and the FFN for those rows moved to the first rows.
 * A prompt chunk that wants no logits stops at the last layer's K and V.
 *
 * The logits keep their bits: a tile's attention does not depend on the other tiles, and the
 * tail's products take gemm_bf16's tiles for its rows (cpu.tail_tiles), which is what the
 * whole batch's took for every row, and whose rows do not depend on each other. So the tail
 * is taken only where every product of the layer after the attention ran every row in those
 * tiles (tail_all_tiles), logits rows come in ascending order (moved down in place), and the
 * layer has no mixture of experts or norms after its blocks; otherwise the whole layer runs.
 */

/* Whether a product of rows of which the first prompt_rows are prompt rows takes gemm_bf16's
 * tiles for every row with weights of wtype, as mm_rows chooses. */
static bool tiles_every_row(const cpu *c, int wtype, int rows, int prompt_rows)
{
    if (prompt_rows > 0 && prompt_split(c, wtype))
        return prompt_rows == rows || takes_bf16_tiles(wtype, rows - prompt_rows);
    return takes_bf16_tiles(wtype, rows);
}

/* Whether the last layer (lw) of batch b, T rows of which the first P are prompt rows, may
 * run its tail for the logits rows alone (see above). */
static bool last_layer_tail(const cpu *c, const eng_batch *b, const eng_layer_weights *lw, int T,
                            int P)
{
    if (lw->router.data || lw->post_att || lw->post_ffn || !lw->w3.data) return false;
    const eng_wmat m[4] = {lw->wo, lw->w1, lw->w2, lw->w3};
    for (int i = 0; i < 4; i++)
        if (!tiles_every_row(c, m[i].type, T, P)) return false;
    for (int i = 1; i < b->n_logits; i++)
        if (b->logits_rows[i] <= b->logits_rows[i - 1]) return false;
    return true;
}

/* Keeps the attention tiles that hold a logits row (logits rows ascending). */
static void keep_logits_tiles(cpu *c, const eng_batch *b)
{
    int n = 0, i = 0;
    for (int t = 0; t < c->n_tiles; t++) {
        while (i < b->n_logits && b->logits_rows[i] < c->tiles[t].row0) i++;
        if (i < b->n_logits && b->logits_rows[i] < c->tiles[t].row1) c->tiles[n++] = c->tiles[t];
    }
    c->n_tiles = n;
}

/* Rows logits_rows[i] of a (ld floats each) moved to row i: ascending, so each row is read
 * before anything is written over it. */
static void move_logits_rows(const eng_batch *b, float *a, int ld)
{
    for (int i = 0; i < b->n_logits; i++)
        if (b->logits_rows[i] != i)
            memcpy(a + (size_t)i * ld, a + (size_t)b->logits_rows[i] * ld,
                   (size_t)ld * sizeof(float));
}

/* ---- forward ------------------------------------------------------------------------ */

static int cpu_execute(void *priv, const eng_batch *batch, float *logits)
{
    cpu *c = priv;
    const eng_batch *b;
    int P; /* the first P rows of b are prompt rows (order_prompt_rows) */
    const int err = order_prompt_rows(c, batch, &b, &P);
    if (err) return err;
    const eng_model_config *cfg = &c->c;
    const eng_model_tensors *w = c->t;
    const int T = b->n_tokens, dim = cfg->dim, kv_dim = c->kv_dim, hidden = cfg->hidden_dim;
    const int q_dim = c->q_dim;
    const int bs = c->block_size;
    uint64_t t_start = pool_now_ns(), t0, proj = 0, attn = 0;
    c->b = b;

    c->n_tiles = 0;
    for (int s = 0; s < b->n_seqs; s++)
        for (int r = b->query_start[s]; r < b->query_start[s + 1]; r += TILE_ROWS) {
            int end = r + TILE_ROWS < b->query_start[s + 1] ? r + TILE_ROWS : b->query_start[s + 1];
            c->tiles[c->n_tiles++] = (struct tile){s, r, end};
        }
    if (c->n_rings) /* each sequence's ring as a block table, each row's slot in it */
        for (int s = 0; s < b->n_seqs; s++) {
            const int ring0 = b->ring[s] * c->ring_blocks;
            int32_t *rt = c->ring_tables + (size_t)s * (size_t)c->ring_stride;
            for (int j = 0; j < (b->seq_len[s] + bs - 1) / bs; j++)
                rt[j] = ring0 + j % c->ring_blocks;
            for (int r = b->query_start[s]; r < b->query_start[s + 1]; r++)
                c->ring_slots[r] = (int64_t)rt[b->positions[r] / bs] * bs + b->positions[r] % bs;
        }
    const size_t emb_row = eng_wrow_bytes(w->token_embedding.type, dim);
    for (int r = 0; r < T; r++)
        q_dequant_row(w->token_embedding.type,
                      (const char *)w->token_embedding.data + (size_t)b->tokens[r] * emb_row,
                      c->x + (size_t)r * dim, dim);
    if (c->hp.embed_scale > 0.0f) /* gemma: the embedding times sqrt(dim) */
        for (size_t i = 0; i < (size_t)T * (size_t)dim; i++) c->x[i] *= c->hp.embed_scale;

    for (int l = 0; l < cfg->n_layers; l++) {
        c->layer = l;
        c->window = eng_layer_windowed(&c->hp, l) ? c->hp.swa_window : 0;
        const eng_layer_weights *lw = &w->layers[l];
        const eng_wmat none = {0};
        norm_rows(c, T, lw->rms_att, xr_rows_of(c, lw->wq, none, T, P));

        t0 = pool_now_ns();
        mm_job qkv[3] = {
            {.w = lw->wq, .n = q_dim, .k = dim, .x = c->xb, .y = c->q, .ld_y = q_dim},
            {.w = lw->wk, .n = kv_dim, .k = dim, .x = c->xb, .y = c->k, .ld_y = kv_dim},
            {.w = lw->wv, .n = kv_dim, .k = dim, .x = c->xb, .y = c->v, .ld_y = kv_dim},
        };
        matmul_jobs(c, qkv, 3, T, P);
        proj += pool_now_ns() - t0;

        t0 = pool_now_ns();
        for_rows(c, T, qkv_rows, lw);
        /* the last layer: only the logits rows from here on (see last_layer_tail) */
        int R = T, RP = P; /* the rows the rest of the layer runs for, its prompt rows */
        const bool tail = l == cfg->n_layers - 1 && last_layer_tail(c, b, lw, T, P);
        if (l == cfg->n_layers - 1 && !b->n_logits) { /* K and V are all that is read */
            attn += pool_now_ns() - t0;
            break;
        }
        if (tail) keep_logits_tiles(c, b);
        c->att_prompt_rows = P;
        cpu_attention(c);
        if (tail) {
            move_logits_rows(b, c->att, q_dim);
            move_logits_rows(b, c->x, dim);
            R = RP = b->n_logits;
            c->tail_tiles = true;
        }
        attn += pool_now_ns() - t0;

        t0 = pool_now_ns();
        /* x += att · Wo^T, or with gemma's norm after attention x += rmsnorm(att · Wo^T) (xb
         * is free: Q, K and V are made) */
        mm_job o = {.w = lw->wo,
                    .n = dim,
                    .k = q_dim,
                    .x = c->att,
                    .y = lw->post_att ? c->xb : c->x,
                    .ld_y = dim,
                    .beta = lw->post_att ? 0.0f : 1.0f};
        matmul_jobs(c, &o, 1, R, RP);
        proj += pool_now_ns() - t0;
        if (lw->post_att) post_norm_add(c, lw->post_att, T);

        norm_rows(c, R, lw->rms_ffn, lw->router.data ? 0 : xr_rows_of(c, lw->w1, lw->w3, R, RP));

        t0 = pool_now_ns();
        if (lw->router.data) { /* a mixture of experts in place of the FFN */
            moe_ffn(c, lw, T, P);
            const uint64_t experts = pool_now_ns() - t0;
            proj += experts;
            c->stats.experts_ns += experts;
            continue;
        }
        mm_job up = {.w = lw->w1,
                     .n = hidden,
                     .k = dim,
                     .x = c->xb,
                     .y = c->h1,
                     .ld_y = hidden,
                     .up = lw->w3,
                     .y_up = c->h3,
                     .act = c->hp.ffn_act};
        const int down_xr = xr_rows_of(c, lw->w2, none, R, RP);
        up.xr_out = down_xr ? xr_pre_buf(c, 1, down_xr, hidden) : NULL;
        up.xr_out_rows = up.xr_out ? down_xr : 0;
        matmul_jobs(c, &up, 1, R, RP);
        if (up.xr_out) xr_made(c, c->h1, hidden, down_xr, up.xr_out);
        mm_job down = {.w = lw->w2,
                       .n = dim,
                       .k = hidden,
                       .x = c->h1,
                       .y = lw->post_ffn ? c->xb : c->x,
                       .ld_y = dim,
                       .beta = lw->post_ffn ? 0.0f : 1.0f}; /* x += ffn */
        matmul_jobs(c, &down, 1, R, RP);
        proj += pool_now_ns() - t0;
        if (lw->post_ffn) post_norm_add(c, lw->post_ffn, T);
    }

    if (b->n_logits) {
        /* (after the last layer's tail the logits rows are the first rows) */
        for (int i = 0; i < b->n_logits; i++)
            rmsnorm(c->xf + (size_t)i * dim,
                    c->x + (size_t)(c->tail_tiles ? i : b->logits_rows[i]) * dim, w->rms_final, dim,
                    c->hp.norm_eps);
        c->tail_tiles = false;
        t0 = pool_now_ns();
        mm_job cls = {.w = w->wcls,
                      .n = cfg->vocab_size,
                      .k = dim,
                      .x = c->xf,
                      .y = logits,
                      .ld_y = cfg->vocab_size};
        matmul_jobs(c, &cls, 1, b->n_logits, 0);
        proj += pool_now_ns() - t0;
        const float cap = c->hp.final_softcap;
        if (cap > 0.0f) /* gemma2: logits soft-capped */
            for (size_t i = 0; i < (size_t)b->n_logits * (size_t)cfg->vocab_size; i++)
                logits[i] = cap * tanhf(logits[i] / cap);
    }
    c->b = NULL;
    uint64_t total = pool_now_ns() - t_start;
    c->stats.steps++;
    c->stats.rows += (uint64_t)T;
    c->stats.proj_ns += proj;
    c->stats.attn_ns += attn;
    c->stats.other_ns += total - proj - attn;
    return 0;
}

/* ---- lifecycle ---------------------------------------------------------------------- */

static void cpu_destroy(void *priv)
{
    cpu *c = priv;
    if (!c) return;
    pool_stop(&c->workers);
    if (c->kv_pool) rnuma_free(c->kv_pool, c->kv_pool_bytes);
    if (c->ring_pool) rnuma_free(c->ring_pool, c->ring_pool_bytes);
    if (c->packed_mem) rnuma_free(c->packed_mem, c->packed_bytes);
    free(c->packed);
    free(c->layer_ring);
    free(c->layer_idx);
    free(c->ring_tables);
    free(c->ring_slots);
    if (c->rope_cos_swa != c->rope_cos) free(c->rope_cos_swa);
    if (c->rope_sin_swa != c->rope_sin) free(c->rope_sin_swa);
    float *bufs[] = {c->rope_cos, c->rope_sin, c->x,  c->xb, c->q,  c->k,
                     c->v,        c->att,      c->h1, c->h3, c->xf, c->scores};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(c->tiles);
    float *moe[] = {c->moe_logits, c->moe_x, c->moe_h1, c->moe_h3, c->moe_out, c->moe_w};
    for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) free(moe[i]);
    free(c->moe_e);
    free(c->moe_rows);
    free(c->moe_count);
    moe_work_destroy(c->moe);
    int32_t *ord[] = {c->ord.tokens, c->ord.positions,   c->ord.query_start, c->ord.seq_len,
                      c->ord.ring,   c->ord.logits_rows, c->ord.block_table};
    for (size_t i = 0; i < sizeof ord / sizeof ord[0]; i++) free(ord[i]);
    free(c->ord.slots);
    free(c->ord.where);
    for (int i = 0; i < CPU_XQ_SLOTS; i++) {
        free(c->xq_mem[i]);
        free(c->xr_mem[i]);
    }
    free(c->xr_pre_mem[0]);
    free(c->xr_pre_mem[1]);
    free(c);
}

/* The very expressions of run.c, so the rotation angles are bit-identical (for GGUF the
 * base and dimension from the file, Llama 3.1's or Phi-3's per-frequency divisors, a linear
 * scaling's position multiplier, and Phi-3's attention factor where the file has them). */
static void rope_table(cpu *c, float theta, float scale, float *cos_t, float *sin_t)
{
    const size_t half = (size_t)c->head_size / 2;
    const float *ff = c->t->rope_freq_factors, mscale = c->hp.rope_attn_factor;
    for (int pos = 0; pos < c->c.seq_len; pos++) {
        for (int i = 0; i < c->hp.rope_dim; i += 2) {
            float freq = 1.0f / powf(theta, i / (float)c->hp.rope_dim);
            if (ff) freq /= ff[i / 2];
            float val = scale > 0.0f ? (pos * scale) * freq : pos * freq;
            cos_t[(size_t)pos * half + (size_t)i / 2] = cosf(val);
            sin_t[(size_t)pos * half + (size_t)i / 2] = sinf(val);
            if (mscale > 0.0f && mscale != 1.0f) {
                cos_t[(size_t)pos * half + (size_t)i / 2] *= mscale;
                sin_t[(size_t)pos * half + (size_t)i / 2] *= mscale;
            }
        }
    }
}

/* ---- weights packed once ---------------------------------------------------------------- */

/* Whether products with weights of wtype take gemm_bf16's tiles for some batch: BF16 weights
 * above gemm_small's rows, F32 and F16 ones for prompt rows (or every row, =bf16). */
static bool packs(const cpu *c, int wtype)
{
    return gemm_bf16_supported() && ((wtype == ENG_W_BF16 && gemm_bf16_prefer(wtype)) ||
                                     ((wtype == ENG_W_F32 || wtype == ENG_W_F16) &&
                                      (c->prompt_bf16 || gemm_bf16_prefer(wtype))));
}

/* Rows and elements of a row of layer matrix i (layer_mats' order). */
static void mat_shape(const cpu *c, int i, int *n, int *k)
{
    const int dim = c->c.dim, hidden = c->c.hidden_dim;
    const int ns[CPU_PACKED_MATS] = {c->q_dim, c->kv_dim, c->kv_dim, dim, hidden, dim, hidden};
    const int ks[CPU_PACKED_MATS] = {dim, dim, dim, c->q_dim, dim, hidden, dim};
    *n = ns[i];
    *k = ks[i];
}

/* The bytes matrix w (n rows of k) takes packed once, and in which form (*bf16: gemm_bf16's
 * panels, else the K types' rows side by side for decode rows); 0: none. */
static size_t pack_bytes(const cpu *c, eng_wmat w, int n, int k, bool *bf16)
{
    *bf16 = w.data && packs(c, w.type);
    if (*bf16) return gemm_bf16_packed_bytes(n, k);
    return w.data ? (q_packed_bytes(w.type, n, k) + 127) & ~(size_t)127 : 0;
}

/* Task l * CPU_PACKED_MATS + i packs layer l's matrix i; the last one the classifier. */
static void pack_task(void *ctx, int task, int worker)
{
    (void)worker;
    cpu *c = ctx;
    const int l = task / CPU_PACKED_MATS, i = task % CPU_PACKED_MATS;
    const bool cls = l == c->c.n_layers;
    const void **slot = cls ? &c->packed_cls : &c->packed[l][i];
    if (!*slot) return;
    eng_wmat m[CPU_PACKED_MATS];
    int n = c->c.vocab_size, k = c->c.dim;
    if (cls)
        m[0] = c->t->wcls;
    else {
        layer_mats(&c->t->layers[l], m);
        mat_shape(c, i, &n, &k);
    }
    const eng_wmat w = m[cls ? 0 : i];
    bool bf16;
    pack_bytes(c, w, n, k, &bf16);
    if (!(bf16 ? gemm_bf16_pack(w.type, n, k, w.data, eng_wrow_bytes(w.type, k), (void *)*slot)
               : q_pack(w.type, w.data, n, k, (void *)*slot)))
        *slot = NULL; /* not reached: pack_bytes said it runs */
}

/*
 * Each layer's dense projections that take gemm_bf16's tiles, packed once into its panels
 * (cpu.packed) by the workers: the products then only read them. Packed per product they
 * were 7% of a one-thread BF16 prefill of 256 rows (perf record), and a prompt chunk of one
 * row of F32 or F16 weights packed whole matrices for it (a tenth of the speed of the
 * packed panels, /tmp harness). The cost: the packed copy, as many bytes as BF16 or F16
 * weights, half as many as F32 ones, kept beside the weights as they lie (decode rows read
 * those): so by default (ENG_PACK_AUTO) only where it takes at most half of the memory
 * available at load, a model sized to its host is never pushed out of memory by it.
 * ENG_PACK_OFF or RINGLM_PACKED_WEIGHTS=0 leaves the packing to each product: the same bits
 * without the memory; ENG_PACK_ON or RINGLM_PACKED_WEIGHTS=1 packs whatever it takes.
 */
static uint64_t meminfo_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[128];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* A cgroup v2 limit's room (memory.max less memory.current of this process's cgroup), or
 * UINT64_MAX where none is set or none can be read. */
static uint64_t cgroup_room(void)
{
    char line[512], path[640];
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return UINT64_MAX;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strncmp(line, "0::", 3) == 0;
    fclose(f);
    if (!found) return UINT64_MAX;
    line[strcspn(line, "\n")] = 0;
    unsigned long long max = 0, cur = 0;
    snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", line + 3);
    f = fopen(path, "r");
    if (!f) return UINT64_MAX;
    const int got = fscanf(f, "%llu", &max);
    fclose(f);
    if (got != 1) return UINT64_MAX; /* "max": no limit */
    snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.current", line + 3);
    f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%llu", &cur) != 1) cur = 0;
        fclose(f);
    }
    return max > cur ? (uint64_t)(max - cur) : 0;
}

/* Whether to pack a copy of bytes: the option, the environment over it, and for
 * ENG_PACK_AUTO the memory available at load; why not into c->pack_why. */
static bool pack_chosen(cpu *c, const eng_options *opt, size_t bytes)
{
    /* what is left as it is when nothing is packed */
    const char *what = !c->packed_k_bytes ? "the BF16 tiles' weights packed by each product"
                       : c->packed_k_bytes == bytes
                           ? "the Q4_K and Q6_K weights of decode rows read as they lie"
                           : "the BF16 tiles' weights packed by each product, the Q4_K and "
                             "Q6_K ones of decode rows read as they lie";
    const char *env = getenv("RINGLM_PACKED_WEIGHTS");
    int mode = opt->packed_weights;
    if (env && strcmp(env, "0") == 0) mode = ENG_PACK_OFF;
    if (env && strcmp(env, "1") == 0) mode = ENG_PACK_ON;
    const double mib = (double)bytes / (1 << 20);
    if (mode == ENG_PACK_OFF) {
        snprintf(c->pack_why, sizeof c->pack_why, "%s (packing once at load off: %.0f MiB saved)",
                 what, mib);
        return false;
    }
    if (mode == ENG_PACK_ON) return true;
    uint64_t avail = opt->pack_avail_bytes;
    if (!avail) {
        avail = meminfo_available();
        const uint64_t room = cgroup_room();
        if (room < avail) avail = room;
    }
    if ((uint64_t)bytes <= avail / 2) return true;
    snprintf(c->pack_why, sizeof c->pack_why,
             "%s: packed once they would take %.0f MiB, more than half of the %.0f MiB "
             "available at load",
             what, mib, (double)avail / (1 << 20));
    return false;
}

static void pack_weights(cpu *c, const eng_options *opt)
{
    const int L = c->c.n_layers;
    for (int pass = 0; pass < 2; pass++) { /* 0: the bytes, 1: where each matrix goes */
        size_t off = 0; /* each a multiple of 128 bytes: every matrix on a cache line */
        c->packed_k_bytes = 0;
        c->packed_k_mats = 0;
        for (int l = 0; l < L; l++) {
            eng_wmat m[CPU_PACKED_MATS];
            layer_mats(&c->t->layers[l], m);
            for (int i = 0; i < CPU_PACKED_MATS; i++) {
                int n, k;
                mat_shape(c, i, &n, &k);
                bool bf16;
                const size_t b = pack_bytes(c, m[i], n, k, &bf16);
                if (!b) continue;
                if (pass) c->packed[l][i] = (const char *)c->packed_mem + off;
                off += b;
                c->packed_k_bytes += bf16 ? 0 : b;
                c->packed_k_mats += !bf16;
            }
        }
        /* the classifier (the largest matrix of a small model) where decode rows read it
         * packed; never the BF16 panels (prompt rows take no logits but their last) */
        bool bf16;
        const size_t b_cls = pack_bytes(c, c->t->wcls, c->c.vocab_size, c->c.dim, &bf16);
        if (b_cls && !bf16) {
            if (pass) c->packed_cls = (const char *)c->packed_mem + off;
            off += b_cls;
            c->packed_k_bytes += b_cls;
            c->packed_k_mats++;
        }
        if (pass || !off) continue;
        if (!pack_chosen(c, opt, off)) {
            c->packed_k_bytes = 0;
            c->packed_k_mats = 0;
            return;
        }
        c->packed = calloc((size_t)L, sizeof *c->packed);
        /* on 2 MiB pages, as the weights: a prompt chunk of a few rows streams the panels
         * (1 and 4 rows of F32 weights 1.06-1.47x faster than on 4 KiB pages, 256 rows
         * alike: results/2026-12-07-bf16-prefill-zen4-s14.md) */
        c->packed_mem = c->packed ? rnuma_alloc_huge(off, c->numa_node) : NULL;
        if (!c->packed_mem) {
            free(c->packed);
            c->packed = NULL;
            c->packed_k_bytes = 0;
            c->packed_k_mats = 0;
            return;
        }
        c->packed_bytes = off;
    }
    if (!c->packed) return;
    pool_run(&c->workers, L * CPU_PACKED_MATS + 1, pack_task, c);
}

/* Scratch of n floats on a cache line: malloc's large blocks start 16 bytes into a page, so
 * every 64-byte load and store of a row there spanned two lines, and where workers split a
 * product's columns the line at each boundary was written by both. */
static float *falloc(cpu *c, size_t n)
{
    c->scratch_bytes += n * sizeof(float);
    const size_t bytes = ((n ? n : 1) * sizeof(float) + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes);
}

static int cpu_create(eng *e, const eng_model *m, const eng_options *opt, void **privp)
{
    (void)e;
    *privp = NULL;
    if (eng_model_is_lazy(m))
        return eng_seterr(-ENOTSUP, "the CPU backend needs host weights: a synthetic:lazy: "
                                    "model has none (drop \"lazy:\")");
    /* AMX's tile data asked for here, at start, where the CPU and the OS have tiles: the
     * report says what came of it (no kernel of this build uses them yet) */
    (void)cpufeat_get();
    cpu *c = calloc(1, sizeof *c);
    if (!c) return eng_seterr(-ENOMEM, "out of memory");
    c->c = *eng_model_cfg(m);
    c->t = eng_model_tensors_of(m);
    const eng_model_config *cfg = &c->c;
    c->hp = *eng_model_hparams_of(m);
    c->head_size = eng_head_dim(cfg, &c->hp);
    c->q_dim = c->head_size * cfg->n_heads;
    c->kv_dim = c->head_size * cfg->n_kv_heads;
    c->group = cfg->n_heads / cfg->n_kv_heads;
    c->block_size = opt->kv_block_size;
    c->n_blocks = opt->kv_blocks;
    c->max_rows = opt->max_batch_tokens;
    c->numa_node = opt->numa_node;
    int n_workers = opt->n_threads > 0 ? opt->n_threads : 1;
    int err = -ENOMEM;
    /* where each layer's K/V live: every layer in the blocks, or with rings the global
     * layers in the blocks and the windowed ones in the rings */
    c->n_rings = opt->kv_rings;
    c->layer_ring = calloc((size_t)cfg->n_layers, 1);
    c->layer_idx = calloc((size_t)cfg->n_layers, sizeof *c->layer_idx);
    if (!c->layer_ring || !c->layer_idx) {
        err = eng_seterr(-ENOMEM, "out of memory");
        goto fail;
    }
    int n_global = 0, n_windowed = 0;
    for (int l = 0; l < cfg->n_layers; l++) {
        c->layer_ring[l] = c->n_rings && eng_layer_windowed(&c->hp, l);
        c->layer_idx[l] = c->layer_ring[l] ? n_windowed++ : n_global++;
    }
    c->block_floats = (size_t)n_global * 2 * (size_t)c->block_size * (size_t)c->kv_dim;
    c->kv_pool_bytes = c->block_floats * sizeof(float) * (size_t)c->n_blocks;
    if (c->n_rings) {
        const int rows = opt->kv_ring_rows ? opt->kv_ring_rows : opt->max_batch_tokens;
        c->ring_blocks =
            eng_kv_ring_blocks_for(c->hp.swa_window, rows, c->block_size, cfg->seq_len);
        c->ring_block_floats = (size_t)n_windowed * 2 * (size_t)c->block_size * (size_t)c->kv_dim;
        c->ring_pool_bytes =
            c->ring_block_floats * sizeof(float) * (size_t)c->ring_blocks * (size_t)c->n_rings;
        c->ring_stride = (cfg->seq_len + c->block_size - 1) / c->block_size + 1;
        /* a sequence's prompt and generated rows may be two sequences (order_prompt_rows) */
        c->ring_tables =
            malloc(2 * (size_t)opt->max_seqs * (size_t)c->ring_stride * sizeof(int32_t));
        c->ring_slots = malloc((size_t)c->max_rows * sizeof(int64_t));
        c->ring_pool = rnuma_alloc_huge(c->ring_pool_bytes, opt->numa_node);
        if (!c->ring_tables || !c->ring_slots || !c->ring_pool) {
            err = eng_seterr(-ENOMEM, "%d window rings of %d blocks x %zu bytes: cannot allocate",
                             c->n_rings, c->ring_blocks, c->ring_block_floats * sizeof(float));
            goto fail;
        }
    }

    /* K/V on 2 MiB pages: a decode row reads each layer's K and V of every block of its
     * sequence, a few KiB from each of ~16 pages a block, blocks a pool apart; on 4 KiB pages
     * a long context's attention walked the page tables (stories110M Q4_0, 930 positions,
     * two threads: attention 3.55 -> 3.03 ms a token, results/2026-12-07-batch1-overheads-
     * zen4-s13.md) */
    c->kv_pool = rnuma_alloc_huge(c->kv_pool_bytes, opt->numa_node);
    if (!c->kv_pool) {
        err = eng_seterr(-ENOMEM, "KV pool of %d blocks x %zu bytes: cannot allocate (%s)",
                         c->n_blocks, c->block_floats * sizeof(float), rnuma_errmsg());
        goto fail;
    }
    const size_t T = (size_t)c->max_rows, half = (size_t)c->head_size / 2;
    c->rope_cos = falloc(c, (size_t)cfg->seq_len * half);
    c->rope_sin = falloc(c, (size_t)cfg->seq_len * half);
    c->x = falloc(c, T * cfg->dim);
    c->xb = falloc(c, T * cfg->dim);
    c->q = falloc(c, T * c->q_dim);
    c->k = falloc(c, T * c->kv_dim);
    c->v = falloc(c, T * c->kv_dim);
    c->att = falloc(c, T * c->q_dim);
    c->h1 = falloc(c, T * cfg->hidden_dim);
    c->h3 = falloc(c, T * cfg->hidden_dim);
    c->xf = falloc(c, T * cfg->dim);
    c->scores_per_worker = cpu_attention_scratch(c);
    c->scores = falloc(c, (size_t)n_workers * c->scores_per_worker);
    c->tiles = malloc(T * sizeof *c->tiles);
    if (c->hp.n_expert) {
        const size_t ne = (size_t)c->hp.n_expert, nk = (size_t)c->hp.n_expert_used;
        const size_t ff = (size_t)c->hp.expert_ff;
        c->moe_logits = falloc(c, T * ne);
        c->moe_x = falloc(c, T * nk * cfg->dim);
        c->moe_h1 = falloc(c, T * nk * ff);
        c->moe_h3 = falloc(c, T * nk * ff);
        c->moe_out = falloc(c, T * nk * cfg->dim);
        c->moe_w = falloc(c, T * nk);
        c->moe_e = malloc(T * nk * sizeof *c->moe_e);
        c->moe_rows = malloc(T * nk * sizeof *c->moe_rows);
        c->moe_count = malloc(ne * sizeof *c->moe_count);
        c->moe = moe_work_create(c->hp.n_expert);
        if (!c->moe_logits || !c->moe_x || !c->moe_h1 || !c->moe_h3 || !c->moe_out || !c->moe_w ||
            !c->moe_e || !c->moe_rows || !c->moe_count || !c->moe) {
            err = eng_seterr(-ENOMEM, "CPU expert scratch for %d rows: out of memory", c->max_rows);
            goto fail;
        }
    }
    if (!c->rope_cos || !c->rope_sin || !c->x || !c->xb || !c->q || !c->k || !c->v || !c->att ||
        !c->h1 || !c->h3 || !c->xf || !c->scores || !c->tiles) {
        err = eng_seterr(-ENOMEM, "CPU scratch for %d rows: out of memory", c->max_rows);
        goto fail;
    }
    rope_table(c, c->hp.rope_theta, c->hp.rope_scale, c->rope_cos, c->rope_sin);
    /* windowed layers with a RoPE base or scaling of their own (gemma3) get their table */
    const float theta_swa = c->hp.rope_theta_swa > 0.0f ? c->hp.rope_theta_swa : c->hp.rope_theta;
    const float scale_swa = c->hp.rope_scale_swa > 0.0f ? c->hp.rope_scale_swa : c->hp.rope_scale;
    c->rope_cos_swa = c->rope_cos;
    c->rope_sin_swa = c->rope_sin;
    if (c->hp.swa_window && (theta_swa != c->hp.rope_theta || scale_swa != c->hp.rope_scale)) {
        c->rope_cos_swa = falloc(c, (size_t)cfg->seq_len * half);
        c->rope_sin_swa = falloc(c, (size_t)cfg->seq_len * half);
        if (!c->rope_cos_swa || !c->rope_sin_swa) {
            err = eng_seterr(-ENOMEM, "CPU RoPE tables: out of memory");
            goto fail;
        }
        rope_table(c, theta_swa, scale_swa, c->rope_cos_swa, c->rope_sin_swa);
    }
    c->att_div = c->hp.attn_scale > 0.0f ? 1.0f / c->hp.attn_scale : sqrtf((float)c->head_size);
    /* prompt rows of F32 / F16 weights in BF16 tiles: where the CPU has them, unless the
     * engine or RINGLM_PREFILL_GEMM=own / =blas asks for exact float32 */
    const gemm_f32_mode mode = gemm_f32_mode_get();
    c->prompt_bf16 = !opt->prompt_exact && gemm_bf16_supported() &&
                     (mode == GEMM_F32_AUTO || mode == GEMM_F32_BF16) &&
                     (c->hp.weight_type == ENG_W_F32 || c->hp.weight_type == ENG_W_F16);
    /* prompt rows' attention with P·V in BF16 (attention_bf16.c), any weight type, under the
     * same switches; heads up to 512 elements (its narrow blocks keep a row in registers) */
    c->attn_bf16 = !opt->prompt_exact && gemm_bf16_supported() &&
                   (mode == GEMM_F32_AUTO || mode == GEMM_F32_BF16) && c->head_size <= 512;
    if (c->prompt_bf16) {
        const size_t parts = 2 * (size_t)opt->max_seqs;
        c->ord.tokens = malloc(T * sizeof(int32_t));
        c->ord.positions = malloc(T * sizeof(int32_t));
        c->ord.logits_rows = malloc(T * sizeof(int32_t));
        c->ord.slots = malloc(T * sizeof(int64_t));
        c->ord.where = malloc(T * sizeof(int));
        c->ord.query_start = malloc((parts + 1) * sizeof(int32_t));
        c->ord.seq_len = malloc(parts * sizeof(int32_t));
        c->ord.ring = malloc(parts * sizeof(int32_t));
        if (!c->ord.tokens || !c->ord.positions || !c->ord.logits_rows || !c->ord.slots ||
            !c->ord.where || !c->ord.query_start || !c->ord.seq_len || !c->ord.ring) {
            err = eng_seterr(-ENOMEM, "CPU batch order for %d rows: out of memory", c->max_rows);
            goto fail;
        }
    }
    /* Our workers split every matmul; OpenBLAS must not add threads of its own. */
    openblas_set_num_threads(1);
    if ((err = pool_start(&c->workers, n_workers, opt->numa_node))) {
        err = eng_seterr(err, "cannot start %d worker threads", n_workers);
        goto fail;
    }
    pack_weights(c, opt);
    *privp = c;
    return 0;
fail:
    cpu_destroy(c);
    return err;
}

/* ---- KV blocks ---------------------------------------------------------------------- */

static size_t cpu_kv_block_bytes(void *priv)
{
    return ((cpu *)priv)->block_floats * sizeof(float);
}

static size_t cpu_memory_bytes(void *priv)
{
    cpu *c = priv;
    return c->kv_pool_bytes + c->ring_pool_bytes + c->scratch_bytes + c->packed_bytes;
}

static void *cpu_kv_block_ptr(void *priv, int block)
{
    cpu *c = priv;
    return c->kv_pool + (size_t)block * c->block_floats;
}

static void *cpu_kv_pool_base(void *priv, size_t *len)
{
    cpu *c = priv;
    if (len) *len = c->kv_pool_bytes;
    return c->kv_pool;
}

static void *cpu_kv_ring_ptr(void *priv, int ring)
{
    cpu *c = priv;
    return c->ring_pool + (size_t)ring * (size_t)c->ring_blocks * c->ring_block_floats;
}

static size_t cpu_kv_ring_bytes(void *priv)
{
    cpu *c = priv;
    return (size_t)c->ring_blocks * c->ring_block_floats * sizeof(float);
}

static int cpu_kv_read_block(void *priv, int block, void *dst)
{
    cpu *c = priv;
    memcpy(dst, cpu_kv_block_ptr(c, block), cpu_kv_block_bytes(c));
    return 0;
}

static int cpu_kv_write_block(void *priv, int block, const void *src)
{
    cpu *c = priv;
    memcpy(cpu_kv_block_ptr(c, block), src, cpu_kv_block_bytes(c));
    return 0;
}

static int cpu_kv_copy_blocks(void *priv, const int32_t *src, const int32_t *dst, int n)
{
    cpu *c = priv;
    for (int i = 0; i < n; i++)
        if (src[i] != dst[i])
            memcpy(cpu_kv_block_ptr(c, dst[i]), cpu_kv_block_ptr(c, src[i]), cpu_kv_block_bytes(c));
    return 0;
}

int eng_cpu_phase_stats(void *priv, eng_phase_stats *out, bool reset)
{
    cpu *c = priv;
    pool_stats ps;
    pool_stats_get(&c->workers, &ps, reset);
    if (out) {
        *out = c->stats;
        out->regions = ps.regions;
        out->wake_calls = ps.wake_calls;
        out->helper_waits = ps.helper_waits;
        out->helper_sleeps = ps.helper_sleeps;
        out->spin_budget_ns = ps.spin_budget_ns;
        out->wake_latency_ns = ps.wake_latency_ns;
        out->straggler_waits = ps.straggler_waits;
        out->straggler_ns = ps.straggler_ns;
        out->region_ns = ps.region_ns;
        out->caller_task_ns = ps.caller_task_ns;
        out->helper_task_ns = ps.helper_task_ns;
    }
    if (reset) memset(&c->stats, 0, sizeof c->stats);
    return 0;
}

/* The kernels each batch size takes for this model's projection weights (quant.h and
 * gemm_small.h say why), and the core OpenBLAS runs. */
static void cpu_describe(void *priv, char *buf, size_t cap)
{
    cpu *c = priv;
    const int wt = c->hp.weight_type, small = gemm_small_max_rows(GEMM_SMALL_AUTO);
    const char *gs = gemm_small_auto_path() == GEMM_SMALL_AVX512 ? "avx512"
                     : gemm_small_auto_path() == GEMM_SMALL_AVX2 ? "avx2"
                                                                 : "portable";
    char blas[192];
    blas_core_describe(blas, sizeof blas);
    /* what runs float products above gemm_small's batches (prefill): the answer for a
     * typical prefill shape, as matmul_rows asks per product */
    const bool own = (wt == ENG_W_F32 || wt == ENG_W_F16 || wt == ENG_W_BF16) &&
                     gemm_f32_prefer(wt, 256, c->c.dim, c->c.dim);
    const bool tiles16 =
        (wt == ENG_W_F32 || wt == ENG_W_F16 || wt == ENG_W_BF16) && gemm_bf16_prefer(wt);
    const char *above = tiles16 && wt != ENG_W_BF16
                            ? "AVX-512 BF16 tiles (gemm_bf16: weights and activations rounded to "
                              "bf16, RINGLM_PREFILL_GEMM=bf16) above"
                        : tiles16
                            ? "AVX-512 BF16 tiles (gemm_bf16: activations rounded to bf16) above"
                        : own ? "own AVX2 tiles (gemm_f32) above"
                              : "OpenBLAS SGEMM above";
    /* the classifier (N = vocabulary) of a batch of 1024 rows, where gemm_f32_prefer keeps
     * SGEMM for matrices that size */
    const bool cls_blas = own && !tiles16 && !gemm_f32_prefer(wt, 1024, c->c.vocab_size, c->c.dim);
    /* F32 / F16 weights: a prompt row's path (order_prompt_rows), then a generated row's */
    const char *prompt = c->prompt_bf16 ? "prompt rows in AVX-512 BF16 tiles at any count "
                                          "(gemm_bf16: weights and activations rounded to bf16; "
                                          "the router and classifier float32), generated rows: "
                                        : "";
    if (wt == ENG_W_F32)
        snprintf(buf, cap, "F32 projections: %sgemm_small (%s) up to %d rows, %s%s; %s", prompt, gs,
                 small, above,
                 cls_blas ? " (OpenBLAS SGEMM for the classifier of large batches)" : "", blas);
    else if (wt == ENG_W_BF16 && q_bf16_dot_path(1))
        snprintf(buf, cap,
                 "BF16 projections: activations rounded to bf16, vdpbf16ps on the weights as "
                 "they lie up to %d rows, %s; %s",
                 small, above, blas);
    else if (wt == ENG_W_F16 || wt == ENG_W_BF16) {
        const char *conv = !q_simd_active() ? "portable" : wt == ENG_W_F16 ? "F16C" : "AVX2";
        const bool fused = q_simd_active() && gemm_small_auto_path() == GEMM_SMALL_AVX2;
        const bool fused512 =
            q_isa() >= Q_ISA_AVX512 && gemm_small_auto_path() == GEMM_SMALL_AVX512;
        char few[96] = "";
        if (fused512) conv = wt == ENG_W_F16 ? "AVX-512 F16C" : "AVX-512";
        if (fused || fused512)
            snprintf(few, sizeof few, "converted in registers (%s) up to %d rows, ", conv,
                     fused512 ? small : Q_FUSED_MAX_ROWS);
        snprintf(buf, cap,
                 "%s projections: %s%sfloat tiles (%s) and gemm_small (%s) up to %d rows, %s%s; %s",
                 wt == ENG_W_F16 ? "F16" : "BF16", wt == ENG_W_F16 ? prompt : "", few, conv, gs,
                 small, above, own && !tiles16 ? " (converted while packed)" : "", blas);
    } else if (q_isa() >= Q_ISA_AVX512 && q_int_path(wt, 256))
        snprintf(buf, cap, "%s projections: integer dots (%s) at every batch size; %s",
                 eng_wtype_name(wt), q_isa_name(q_isa()), blas);
    else if (q_isa() >= Q_ISA_AVX512)
        snprintf(buf, cap, "%s projections: integer dots (%s) up to %d rows, %s above; %s",
                 eng_wtype_name(wt), q_isa_name(q_isa()), Q_INT_MAX_ROWS,
                 q_prefill_runs(wt, 256) ? "its tiles (q_matmul_tiles)"
                 : gemm_f32_prefer(wt, 256, c->c.dim, c->c.dim)
                     ? "dequantized into own AVX2 panels (gemm_f32)"
                     : "dequantized tiles and OpenBLAS SGEMM",
                 blas);
    else {
        /* above the integer dots' rows, as matmul_rows chooses for a prefill of 256 rows */
        const char *above = q_prefill_runs(wt, 256) ? "integer tiles (quant_prefill) above"
                            : gemm_f32_prefer(wt, 256, c->c.dim, c->c.dim)
                                ? "dequantized into own AVX2 panels (gemm_f32) above"
                                : "dequantized tiles and OpenBLAS SGEMM above";
        snprintf(buf, cap, "%s projections: integer dots (%s) up to %d rows, %s; %s",
                 eng_wtype_name(wt), q_isa_name(q_isa()), Q_INT_MAX_ROWS, above, blas);
    }
    const size_t len = strlen(buf);
    if (c->packed_bytes > c->packed_k_bytes && len < cap)
        snprintf(buf + len, cap - len, "; the BF16 tiles' weights packed once at load (%.0f MiB)",
                 (double)(c->packed_bytes - c->packed_k_bytes) / (1 << 20));
    const size_t len2 = strlen(buf);
    if (c->packed_k_bytes && len2 < cap)
        snprintf(buf + len2, cap - len2,
                 "; the Q4_K and Q6_K weights of up to %d rows packed once at load, 16 rows side "
                 "by side (%d matrices%s, %.0f MiB)",
                 Q_PACKED_MAX_ROWS, c->packed_k_mats, c->packed_cls ? " with the classifier" : "",
                 (double)c->packed_k_bytes / (1 << 20));
    if (!c->packed_bytes && c->pack_why[0] && len < cap)
        snprintf(buf + len, cap - len, "; %s", c->pack_why);
    const size_t att = strlen(buf);
    if (c->attn_bf16 && att < cap)
        snprintf(buf + att, cap - att,
                 "; prompt rows' attention: P·V in AVX-512 BF16 (scores float32)");
    /* AMX and AVX512-FP16: whether this process could use them, and what runs in their
     * place (cpu_features.h: this build has no kernel for either) */
    char amx_instead[128], features[512];
    snprintf(amx_instead, sizeof amx_instead, "%s, integer dots in %s",
             gemm_bf16_supported() ? "BF16 tiles in AVX-512 BF16" : "float products in float32",
             q_isa() >= Q_ISA_AVX512 ? "AVX-512 VNNI"
             : q_isa() == Q_ISA_AVX2 ? "AVX2"
                                     : "portable C");
    cpufeat_describe(cpufeat_get(), amx_instead,
                     q_simd_active() ? "F16 weights converted by F16C"
                                     : "F16 weights converted in portable C",
                     features, sizeof features);
    const size_t feat = strlen(buf);
    if (feat < cap) snprintf(buf + feat, cap - feat, "; %s", features);
}

typedef struct task_fwd {
    void (*fn)(void *ctx, int task);
    void *ctx;
} task_fwd;

static void task_fwd_run(void *ctx, int task, int worker)
{
    (void)worker;
    const task_fwd *f = ctx;
    f->fn(f->ctx, task);
}

static void cpu_run_tasks(void *priv, int n_tasks, void (*fn)(void *ctx, int task), void *ctx)
{
    cpu *c = priv;
    task_fwd f = {fn, ctx};
    pool_run(&c->workers, n_tasks, task_fwd_run, &f);
}

static const eng_backend_ops cpu_ops = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .execute = cpu_execute,
    .kv_block_bytes = cpu_kv_block_bytes,
    .memory_bytes = cpu_memory_bytes,
    .kv_block_ptr = cpu_kv_block_ptr,
    .kv_pool_base = cpu_kv_pool_base,
    .kv_read_block = cpu_kv_read_block,
    .kv_write_block = cpu_kv_write_block,
    .kv_copy_blocks = cpu_kv_copy_blocks,
    .run_tasks = cpu_run_tasks,
    .describe = cpu_describe,
    .kv_ring_ptr = cpu_kv_ring_ptr,
    .kv_ring_bytes = cpu_kv_ring_bytes,
};

const eng_backend_ops *eng_cpu_backend(void)
{
    return &cpu_ops;
}
