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
 * OpenBLAS never starts threads of its own to compete with ours. Attention is split
 * by (decode row, KV head) and (tile of up to 32 prefill rows of one sequence, KV head).
 * The attention and SwiGLU loops use 8-float GCC vectors, cloned for AVX2/AVX-512.
 *
 * KV pool, block-major: block b holds, for every layer l, K then V of block_size tokens:
 *   pool[b][l][0=K|1=V][offset][kv_dim]   (float32)
 * so one block is one contiguous copy for swapping.
 */
#include "kernels/cpu/gemm_small.h"
#include "kernels/cpu/quant.h"
#include "kernels/engine.h"
#include "numa/rnuma.h"

#include <cblas.h>
#include <errno.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- worker pool -------------------------------------------------------------------- */

typedef void (*task_fn)(void *ctx, int task, int worker);

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * How long a helper spins before it sleeps. The pool runs a few dozen parallel regions per
 * engine step; between them the caller works alone for microseconds (norms, RoPE), and
 * between steps for as long as its own caller takes. A helper that sleeps costs the next
 * region its wake latency (a futex wake, and on a VM the exit of a halted vCPU, whose core
 * the host may have given away meanwhile); one that spins costs the CPU time it spins.
 *
 * The policy measures both and picks the budget that minimised their sum over the recent
 * past — the ski-rental choice made with the actual gap distribution:
 *   - every wait records its gap (from the helper going idle to the caller starting the
 *     next region, stamped by the caller: exact whether the helper spun or slept, so what
 *     is measured does not depend on the budget chosen) in a histogram of power-of-two
 *     buckets, halved at every re-choice (a memory of ~GAP_EPOCH waits);
 *   - every sleep measures the wake latency (region start to the helper running), averaged;
 *   - every GAP_EPOCH waits the budget becomes the power of two B in [1 µs, 2 ms] with the
 *     least  Σ_{gaps g < B} g + Σ_{gaps g >= B} (B + wake latency).
 * So back-to-back steps keep the helpers spinning through every gap, and a helper of an
 * idle engine sleeps after a short spin. eng_phase_stats reports regions, waits, sleeps,
 * wake calls, the budget and the latency, so the policy's effect is measured in engine_bench.
 */
#define GAP_BUCKETS 24     /* bucket i: gaps in [2^i, 2^(i+1)) ns; the last, all longer */
#define GAP_EPOCH 32       /* waits between re-choices of the budget */
#define SPIN_MIN_LOG2 10   /* 1.0 µs */
#define SPIN_MAX_LOG2 21   /* 2.1 ms */
#define WAKE_NS_PRIOR 30000 /* wake latency assumed until one is measured */
/* Wake latencies count up to this: a longer one is a run queue's wait on an oversubscribed
 * machine, which a spinning helper would not have avoided (it waits for a CPU too). */
#define WAKE_NS_CAP 500000

typedef struct spin_policy {
    uint32_t gaps[GAP_BUCKETS];
    int waits;          /* since the last re-choice */
    uint64_t budget_ns;
    uint64_t wake_ns;   /* moving average of measured wake latencies */
} spin_policy;

static int log2_bucket(uint64_t ns)
{
    int b = ns ? 63 - __builtin_clzll(ns) : 0;
    return b < GAP_BUCKETS ? b : GAP_BUCKETS - 1;
}

static void spin_policy_init(spin_policy *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->budget_ns = 50000;
    sp->wake_ns = WAKE_NS_PRIOR;
}

static void spin_policy_choose(spin_policy *sp)
{
    double best = -1;
    for (int j = SPIN_MIN_LOG2; j <= SPIN_MAX_LOG2; j++) {
        const double budget = (double)(1ull << j);
        double cost = 0;
        for (int i = 0; i < GAP_BUCKETS; i++) {
            const double gap = 1.5 * (double)(1ull << i); /* the bucket's middle */
            cost += sp->gaps[i] * (i < j ? gap : budget + (double)sp->wake_ns);
        }
        if (best < 0 || cost < best) {
            best = cost;
            sp->budget_ns = 1ull << j;
        }
    }
    for (int i = 0; i < GAP_BUCKETS; i++)
        sp->gaps[i] /= 2;
    sp->waits = 0;
}

/* One wait of a helper: its gap, and its wake latency if it slept. */
static void spin_policy_record(spin_policy *sp, uint64_t gap_ns, bool slept, uint64_t wake_ns)
{
    sp->gaps[log2_bucket(gap_ns)]++;
    if (slept)
        sp->wake_ns += ((int64_t)(wake_ns < WAKE_NS_CAP ? wake_ns : WAKE_NS_CAP) -
                        (int64_t)sp->wake_ns) / 8;
    if (++sp->waits == GAP_EPOCH)
        spin_policy_choose(sp);
}

typedef struct pool {
    int n_workers; /* including the calling thread */
    int numa_node;
    pthread_t *threads;
    /* written by the caller to start a region, read by the helpers */
    _Alignas(64) _Atomic uint32_t generation; /* futex: bumped to start a parallel region */
    _Atomic uint64_t region_ns;               /* when the caller started the current region */
    int n_tasks;
    task_fn fn;
    void *ctx;
    _Atomic bool stop;
    _Alignas(64) _Atomic int next_task;
    _Alignas(64) _Atomic uint32_t busy;       /* futex: helper threads still inside the region */
    _Atomic uint32_t helpers_asleep;          /* helpers announced asleep on generation */
    _Atomic uint32_t caller_asleep;           /* the caller announced asleep on busy */
    /* measurements (relaxed: statistics) */
    _Alignas(64) _Atomic uint64_t regions, wake_calls, waits, sleeps;
    _Atomic uint64_t budget_ns, wake_ns;      /* the helpers' latest choice and measure */
} pool;

typedef struct worker_arg {
    pool *p;
    int index;
} worker_arg;

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

/*
 * The sleep/wake handshake, named once (both waits of the pool use it). A waiter that has
 * spun long enough announces itself in *asleep, re-reads the word and sleeps only if it is
 * unchanged; a waker changes the word (a sequentially consistent read-modify-write), then
 * makes the wake system call only if someone announced. All four operations are seq_cst,
 * so of (announce, re-read) and (change, read the announcements) the pair that comes second
 * in their single total order sees the other's first: either the waiter sees the change
 * and does not sleep, or the waker sees the announcement and wakes it (FUTEX_WAIT returns
 * at once if the word changed between the re-read and the sleep). A waker whose peers are
 * spinning makes no system call.
 */
static bool sleep_unless_changed(_Atomic uint32_t *word, uint32_t seen, _Atomic uint32_t *asleep)
{
    bool slept = false;
    atomic_fetch_add_explicit(asleep, 1, memory_order_seq_cst);
    if (atomic_load_explicit(word, memory_order_seq_cst) == seen) {
        futex_wait(word, seen);
        slept = true;
    }
    atomic_fetch_sub_explicit(asleep, 1, memory_order_relaxed);
    return slept;
}

/* The waker's half, after its seq_cst change of *word: true when it made the wake call. */
static bool wake_if_asleep(_Atomic uint32_t *word, _Atomic uint32_t *asleep)
{
    if (atomic_load_explicit(asleep, memory_order_seq_cst) == 0)
        return false;
    futex_wake(word);
    return true;
}

/* The spin-wait hint: PAUSE on x86, YIELD on arm64, nothing elsewhere. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* Spin iterations between two reads of the clock while waiting. */
#define SPINS_PER_CLOCK 64
/* Past this much spinning a helper also yields at each read of the clock: on an idle CPU
 * sched_yield returns at once (the vCPU stays busy, which is the point of spinning), on an
 * oversubscribed one it lets a runnable thread — often this engine's caller — have the CPU
 * the spin would burn. */
#define SPIN_POLITE_NS 4000

static void run_tasks(pool *p, int worker)
{
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (t >= p->n_tasks)
            return;
        p->fn(p->ctx, t, worker);
    }
}

static void *worker_main(void *arg)
{
    worker_arg *wa = arg;
    pool *p = wa->p;
    int index = wa->index;
    free(wa);
    if (p->numa_node >= 0)
        rnuma_pin_self_cpu(p->numa_node, index);
    spin_policy sp;
    spin_policy_init(&sp);
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        const uint64_t idle_since = now_ns();
        bool slept = false;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen) {
            if (++spins % SPINS_PER_CLOCK) {
                cpu_relax();
                continue;
            }
            const uint64_t spun = now_ns() - idle_since;
            if (spun >= sp.budget_ns)
                slept |= sleep_unless_changed(&p->generation, seen, &p->helpers_asleep);
            else if (spun >= SPIN_POLITE_NS)
                sched_yield();
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        /* region_ns was stored before the generation's release: it is this region's */
        const uint64_t start = atomic_load_explicit(&p->region_ns, memory_order_relaxed);
        spin_policy_record(&sp, start > idle_since ? start - idle_since : 0, slept,
                           slept ? now_ns() - start : 0);
        atomic_fetch_add_explicit(&p->waits, 1, memory_order_relaxed);
        if (slept)
            atomic_fetch_add_explicit(&p->sleeps, 1, memory_order_relaxed);
        atomic_store_explicit(&p->budget_ns, sp.budget_ns, memory_order_relaxed);
        atomic_store_explicit(&p->wake_ns, sp.wake_ns, memory_order_relaxed);
        run_tasks(p, index);
        if (atomic_fetch_sub_explicit(&p->busy, 1, memory_order_seq_cst) == 1 &&
            wake_if_asleep(&p->busy, &p->caller_asleep))
            atomic_fetch_add_explicit(&p->wake_calls, 1, memory_order_relaxed);
    }
}

/* Runs fn(ctx, t, worker) for t in [0, n_tasks) on all workers; returns when all are done. */
static void pool_run(pool *p, int n_tasks, task_fn fn, void *ctx)
{
    if (p->n_workers == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&p->busy, (uint32_t)(p->n_workers - 1), memory_order_relaxed);
    atomic_store_explicit(&p->region_ns, now_ns(), memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_seq_cst); /* releases the above */
    atomic_fetch_add_explicit(&p->regions, 1, memory_order_relaxed);
    if (wake_if_asleep(&p->generation, &p->helpers_asleep))
        atomic_fetch_add_explicit(&p->wake_calls, 1, memory_order_relaxed);
    run_tasks(p, 0);
    /* The helpers finish their last task within microseconds unless descheduled: spin for
     * twice what waking a sleeper measured (the ski-rental bound), then sleep. */
    const uint64_t budget = 2 * atomic_load_explicit(&p->wake_ns, memory_order_relaxed);
    const uint64_t t0 = now_ns();
    uint32_t b;
    int spins = 0;
    while ((b = atomic_load_explicit(&p->busy, memory_order_acquire)) != 0) {
        if (++spins % SPINS_PER_CLOCK || now_ns() - t0 < budget)
            cpu_relax();
        else
            sleep_unless_changed(&p->busy, b, &p->caller_asleep);
    }
}

static int pool_start(pool *p, int n_workers, int numa_node)
{
    memset(p, 0, sizeof *p);
    p->n_workers = n_workers;
    p->numa_node = numa_node;
    p->budget_ns = 50000;
    p->wake_ns = WAKE_NS_PRIOR;
    if (n_workers == 1)
        return 0;
    p->threads = calloc((size_t)n_workers, sizeof *p->threads);
    if (!p->threads)
        return -ENOMEM;
    for (int i = 1; i < n_workers; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        int err = wa ? 0 : ENOMEM;
        if (wa) {
            *wa = (worker_arg){p, i};
            err = pthread_create(&p->threads[i], NULL, worker_main, wa);
            if (err)
                free(wa);
        }
        if (err) {
            p->n_workers = i; /* stop the ones already running */
            atomic_store(&p->stop, true);
            atomic_fetch_add(&p->generation, 1);
            futex_wake(&p->generation);
            for (int j = 1; j < i; j++)
                pthread_join(p->threads[j], NULL);
            free(p->threads);
            p->threads = NULL;
            return -err;
        }
    }
    return 0;
}

static void pool_stop(pool *p)
{
    if (!p->threads)
        return;
    atomic_store_explicit(&p->stop, true, memory_order_release);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_seq_cst);
    futex_wake(&p->generation);
    for (int i = 1; i < p->n_workers; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    p->threads = NULL;
}

/* ---- backend state ------------------------------------------------------------------ */

/* Prefill rows of one sequence are attended in tiles: each K/V block is read (and K
 * transposed) once per tile rather than once per row. */
#define TILE_ROWS 32

typedef struct cpu {
    eng_model_config c;
    const eng_model_tensors *t; /* typed per-layer weights (F32 or a GGUF file's types) */
    eng_model_hparams hp;       /* RMSNorm epsilon, RoPE base/dimension/pairing */
    int head_size, kv_dim, group; /* group = query heads per KV head */
    int block_size, n_blocks, max_rows;
    size_t block_floats;          /* one block: L * 2 * block_size * kv_dim */
    float *kv_pool;
    size_t kv_pool_bytes;
    int numa_node;
    float *rope_cos, *rope_sin; /* [seq_len][head_size/2], computed exactly as run.c */
    /* activations for up to max_rows rows */
    float *x, *xb, *q, *k, *v, *att, *h1, *h3, *xf;
    struct tile { int seq, row0, row1; } *tiles; /* attention work: runs of one sequence's rows */
    int n_tiles;
    float *scores;      /* [n_workers][TILE_ROWS * group * seq_len] attention scratch */
    size_t scores_per_worker;
    float *k_t;         /* [n_workers][head_size][block_size rounded up to 8]: K transposed */
    int block_pad;
    size_t scratch_bytes;
    pool workers;
    eng_phase_stats stats;
    /* the batch being executed (read by the tasks) */
    const eng_batch *b;
    int layer;
} cpu;

/* ---- vector helpers ------------------------------------------------------------------ */

/* GCC vector types: the build targets baseline x86-64, and the hot loops are compiled
 * again for AVX2 and AVX-512 with target_clones (picked at load time). Vectors never cross
 * a function boundary outside those clones (that would change the ABI): helpers take
 * pointers and are always inlined. */
typedef float v8f __attribute__((vector_size(32), aligned(4))); /* unaligned loads allowed */
typedef int v8i __attribute__((vector_size(32)));

/* ThreadSanitizer builds get the baseline copy only: GCC instruments the ifunc resolver
 * target_clones generates, and it runs while the loader relocates, before the TSAN runtime
 * is up, so every program linking this file died before main (GCC 12). */
#ifdef __SANITIZE_THREAD__
#define CPU_CLONES
#else
#define CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

/*
 * x[0..8) = exp(x[0..8)), the Cephes single-precision exp: range reduction by ln 2, a
 * degree-5 polynomial, the power of two built in the exponent bits. Within ~1e-7 relative
 * of expf; arguments are clamped to [-87.3, 88.3] (no denormals, no overflow).
 */
static inline __attribute__((always_inline)) void exp8(float *xp)
{
    const v8f lo = {-87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f};
    const v8f hi = {88.3f, 88.3f, 88.3f, 88.3f, 88.3f, 88.3f, 88.3f, 88.3f};
    const v8f one = {1, 1, 1, 1, 1, 1, 1, 1};
    v8f x = *(const v8f *)xp;
    v8i below = x < lo, above = x > hi;
    x = (v8f)(((v8i)x & ~below) | ((v8i)lo & below));
    x = (v8f)(((v8i)x & ~above) | ((v8i)hi & above));
    v8f fx = x * 1.44269504088896341f + 0.5f;
    v8f fl = __builtin_convertvector(__builtin_convertvector(fx, v8i), v8f);
    fl -= (v8f)((v8i)(fl > fx) & (v8i)one); /* truncation → floor */
    x -= fl * 0.693359375f;
    x -= fl * -2.12194440e-4f;
    v8f y = x * 1.9875691500e-4f + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * (x * x) + x + 1.0f;
    *(v8f *)xp = y * (v8f)((__builtin_convertvector(fl, v8i) + 127) << 23);
}

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
    int chunk_rows;
    int n_chunks;
} mm_job;

typedef struct mm_region {
    mm_job *jobs;
    int n_jobs;
    int rows; /* T */
} mm_region;

/* Rows n0.. of a weight matrix in any type: float32 through gemm_small or BLAS, the others
 * through the fused/tiled kernels of quant.c. */
static void matmul_rows(int rows, const float *x, eng_wmat wm, int n0, int n, int k, float beta,
                        float *y, int ld_y)
{
    if (wm.type != ENG_W_F32) {
        q_matmul(wm.type, (const char *)wm.data + (size_t)n0 * eng_wrow_bytes(wm.type, k), n, k,
                 x, rows, beta, y, ld_y);
        return;
    }
    const float *w = (const float *)wm.data + (size_t)n0 * k;
    /* Float32 batches of up to gemm_small_max_rows rows go through gemm_small (each weight
     * row read once for all rows, nothing packed), larger ones through OpenBLAS SGEMM,
     * whose packing pays for itself once the product is compute-bound. */
    static _Atomic int small_max = -1; /* this machine's, resolved once (benign race) */
    if (small_max < 0)
        small_max = gemm_small_max_rows(GEMM_SMALL_AUTO);
    if (rows <= small_max)
        gemm_small(GEMM_SMALL_AUTO, rows, n, k, x, k, w, k, beta, y, ld_y);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, k, 1.0f, x, k, w, k, beta,
                    y, ld_y);
}

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
    matmul_rows(r->rows, j->x, j->w, n0, n, j->k, j->beta, j->y + n0, j->ld_y);
    if (j->up.data) {
        matmul_rows(r->rows, j->x, j->up, n0, n, j->k, 0.0f, j->y_up + n0, j->ld_y);
        for (int t = 0; t < r->rows; t++)
            swiglu(j->y + (size_t)t * j->ld_y + n0, j->y_up + (size_t)t * j->ld_y + n0, n);
    }
}

/* Runs the jobs as one parallel region. Chunks: a few per worker so a descheduled worker
 * (the cores are shared) does not hold everyone up, but each big enough for BLAS. */
static void matmul_jobs(cpu *c, mm_job *jobs, int n_jobs, int rows)
{
    int nw = c->workers.n_workers;
    int total = 0;
    for (int i = 0; i < n_jobs; i++) {
        int want = nw == 1 ? 1 : nw * 2;
        int chunk = (jobs[i].n + want - 1) / want;
        chunk = (chunk + 7) & ~7; /* multiples of 8 keep equal shares (288 = 4 x 72) */
        if (chunk < 32)
            chunk = 32;
        jobs[i].chunk_rows = chunk;
        jobs[i].n_chunks = (jobs[i].n + chunk - 1) / chunk;
        total += jobs[i].n_chunks;
    }
    mm_region r = {jobs, n_jobs, rows};
    pool_run(&c->workers, total, mm_task, &r);
}

/* ---- elementwise pieces (as run.c) -------------------------------------------------- */

static void rmsnorm(float *o, const float *x, const float *weight, int size, float eps)
{
    float ss = 0.0f;
    for (int j = 0; j < size; j++)
        ss += x[j] * x[j];
    ss /= size;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < size; j++)
        o[j] = weight[j] * (ss * x[j]);
}

/* Rotates adjacent pairs (2j, 2j+1) of each head of vec by pos * 10000^(-h/head_size).
 * GGUF models: the base and the rotated dimensions come from the file, and qwen2 rotates
 * the pairs (j, j + rope_dim/2) ("NEOX" order) instead. */
static void rope(const cpu *c, float *vec, int len, int pos)
{
    const int half = c->head_size / 2;
    const float *cs = c->rope_cos + (size_t)pos * half, *sn = c->rope_sin + (size_t)pos * half;
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
    for (int i = 0; i < len; i += 2) {
        int j = (i % c->head_size) / 2;
        float v0 = vec[i], v1 = vec[i + 1];
        vec[i] = v0 * cs[j] - v1 * sn[j];
        vec[i + 1] = v0 * sn[j] + v1 * cs[j];
    }
}

/* ---- paged attention ---------------------------------------------------------------- */

static inline float *kv_at(const cpu *c, int block, int layer, int which, int offset)
{
    return c->kv_pool + (size_t)block * c->block_floats +
           (((size_t)layer * 2 + (size_t)which) * (size_t)c->block_size + (size_t)offset) *
               (size_t)c->kv_dim;
}

/*
 * One query head over positions 0..n_pos-1 of a sequence, K/V read block by block through
 * its block table: scores = q·k / sqrt(head_size), softmax (max subtracted), out = Σ a·v.
 * The dot products and the weighted sum use 8-float vectors (GCC vector extensions);
 * target_clones builds AVX-512 and AVX2 copies picked at load time, since the build itself
 * targets baseline x86-64.
 */

/* HADD: [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, a6+a7, b4+b5, b6+b7] (as _mm256_hadd_ps).
 * HADD_TREE8: lane m = the sum of all lanes of am. Macros, not functions: a vector passed
 * to or returned from a function outside the AVX clones would change the ABI. */
#define HADD(a, b)                                                                             \
    (__builtin_shuffle((a), (b), (v8i){0, 2, 8, 10, 4, 6, 12, 14}) +                           \
     __builtin_shuffle((a), (b), (v8i){1, 3, 9, 11, 5, 7, 13, 15}))
#define HADD_TREE8(out, a0, a1, a2, a3, a4, a5, a6, a7)                                        \
    do {                                                                                       \
        v8f lo_ = HADD(HADD(a0, a1), HADD(a2, a3)); /* [0,1,2,3 | 0,1,2,3] halves */           \
        v8f hi_ = HADD(HADD(a4, a5), HADD(a6, a7));                                            \
        out = __builtin_shuffle(lo_, hi_, (v8i){0, 1, 2, 3, 8, 9, 10, 11}) +                   \
              __builtin_shuffle(lo_, hi_, (v8i){4, 5, 6, 7, 12, 13, 14, 15});                  \
    } while (0)

/* s[t] = exp(s[t] - max) for t < n; returns Σ s[t] (max >= every s[t]). */
static inline __attribute__((always_inline)) float exp_shifted_sum(float *s, int n, float max)
{
    v8f vsum = {0};
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        *(v8f *)(s + t) -= max;
        exp8(s + t);
        vsum += *(const v8f *)(s + t);
    }
    float sum = ((vsum[0] + vsum[1]) + (vsum[2] + vsum[3])) +
                ((vsum[4] + vsum[5]) + (vsum[6] + vsum[7]));
    for (; t < n; t++) {
        s[t] = expf(s[t] - max);
        sum += s[t];
    }
    return sum;
}

/*
 * out[0..hs) += Σ_{i<n} (p[i] * mul) · v_i, v_i = v + i * stride. Output lanes stay in
 * registers across positions; two positions at a time into separate accumulators, so the
 * FMAs are not one long dependency chain. Inlined into each attention clone.
 */
static inline __attribute__((always_inline)) void weighted_sum(float *out, const float *v,
                                                               size_t stride, const float *p,
                                                               float mul, int n, int hs)
{
    int j = 0;
    for (; j + 16 <= hs; j += 16) {
        v8f a0 = *(v8f *)(out + j), a1 = *(v8f *)(out + j + 8), b0 = {0}, b1 = {0};
        int i = 0;
        for (; i + 2 <= n; i += 2) {
            const float *v0 = v + (size_t)i * stride + j, *v1 = v0 + stride;
            const float p0 = p[i] * mul, p1 = p[i + 1] * mul;
            a0 += p0 * *(const v8f *)v0;
            a1 += p0 * *(const v8f *)(v0 + 8);
            b0 += p1 * *(const v8f *)v1;
            b1 += p1 * *(const v8f *)(v1 + 8);
        }
        if (i < n) {
            const float *v0 = v + (size_t)i * stride + j;
            a0 += (p[i] * mul) * *(const v8f *)v0;
            a1 += (p[i] * mul) * *(const v8f *)(v0 + 8);
        }
        *(v8f *)(out + j) = a0 + b0;
        *(v8f *)(out + j + 8) = a1 + b1;
    }
    for (; j + 8 <= hs; j += 8) {
        v8f a0 = *(v8f *)(out + j), b0 = {0};
        int i = 0;
        for (; i + 2 <= n; i += 2) {
            a0 += (p[i] * mul) * *(const v8f *)(v + (size_t)i * stride + j);
            b0 += (p[i + 1] * mul) * *(const v8f *)(v + (size_t)(i + 1) * stride + j);
        }
        if (i < n)
            a0 += (p[i] * mul) * *(const v8f *)(v + (size_t)i * stride + j);
        *(v8f *)(out + j) = a0 + b0;
    }
    for (; j < hs; j++)
        for (int i = 0; i < n; i++)
            out[j] += (p[i] * mul) * v[(size_t)i * stride + j];
}

CPU_CLONES
static void attend_head(const cpu *c, const float *q, const int32_t *table, int kvh, int n_pos,
                        float *scores, float *out)
{
    const int hs = c->head_size, bs = c->block_size, kv_dim = c->kv_dim;
    const int hs8 = hs & ~7;
    const float scale = sqrtf((float)hs);
    float max = -INFINITY;
    for (int t0 = 0; t0 < n_pos; t0 += bs) {
        const float *k = kv_at(c, table[t0 / bs], c->layer, 0, 0) + (size_t)kvh * hs;
        int n = n_pos - t0 < bs ? n_pos - t0 : bs;
        int i = 0;
        if (hs8 == hs) {
            /* 8 positions at a time; their 8 partial-sum vectors are reduced together by a
             * pairwise-add tree (as _mm256_hadd_ps), far cheaper than 8 separate reductions */
            for (; i + 8 <= n; i += 8, k += 8 * (size_t)kv_dim) {
                v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
                for (int j = 0; j < hs; j += 8) {
                    const v8f qv = *(const v8f *)(q + j);
                    a0 += qv * *(const v8f *)(k + j);
                    a1 += qv * *(const v8f *)(k + kv_dim + j);
                    a2 += qv * *(const v8f *)(k + 2 * (size_t)kv_dim + j);
                    a3 += qv * *(const v8f *)(k + 3 * (size_t)kv_dim + j);
                    a4 += qv * *(const v8f *)(k + 4 * (size_t)kv_dim + j);
                    a5 += qv * *(const v8f *)(k + 5 * (size_t)kv_dim + j);
                    a6 += qv * *(const v8f *)(k + 6 * (size_t)kv_dim + j);
                    a7 += qv * *(const v8f *)(k + 7 * (size_t)kv_dim + j);
                }
                v8f sc;
                HADD_TREE8(sc, a0, a1, a2, a3, a4, a5, a6, a7);
                sc /= scale;
                for (int m = 0; m < 8; m++) {
                    scores[t0 + i + m] = sc[m];
                    if (sc[m] > max)
                        max = sc[m];
                }
            }
        }
        for (; i < n; i++, k += kv_dim) {
            v8f acc = {0};
            int j = 0;
            for (; j < hs8; j += 8)
                acc += *(const v8f *)(q + j) * *(const v8f *)(k + j);
            float score = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                          ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            for (; j < hs; j++)
                score += q[j] * k[j];
            score /= scale;
            scores[t0 + i] = score;
            if (score > max)
                max = score;
        }
    }
    const float inv = 1.0f / exp_shifted_sum(scores, n_pos, max);
    memset(out, 0, (size_t)hs * sizeof *out);
    for (int t0 = 0; t0 < n_pos; t0 += bs) {
        const float *v = kv_at(c, table[t0 / bs], c->layer, 1, 0) + (size_t)kvh * hs;
        int n = n_pos - t0 < bs ? n_pos - t0 : bs;
        weighted_sum(out, v, (size_t)kv_dim, scores + t0, inv, n, hs);
    }
}

/*
 * A tile of rows [row0, row1) of one sequence (consecutive positions) and one KV head: the
 * same math as attend_head, arranged for reuse. Per K block the head's K is transposed to
 * k_t[head_size][block] so a row's scores for the whole block are vector FMAs across
 * positions (no horizontal sums); the scores of all the tile's (row, head) pairs are kept
 * until the softmax; then each V row is read once for all of them.
 */
CPU_CLONES
static void attend_tile(const cpu *c, const eng_batch *b, const struct tile *tl, int kvh,
                        float *scores, float *k_t)
{
    const int hs = c->head_size, bs = c->block_size, bp = c->block_pad, kv_dim = c->kv_dim;
    const int group = c->group, seq_len = c->c.seq_len, dim = c->c.dim;
    const int n_rows = tl->row1 - tl->row0, pos0 = b->positions[tl->row0];
    const int n_pos = b->positions[tl->row1 - 1] + 1;
    const int32_t *table = b->block_table + (size_t)tl->seq * (size_t)b->block_table_stride;
    const float scale = sqrtf((float)hs);
    for (int t0 = 0; t0 < n_pos; t0 += bs) {
        const float *k = kv_at(c, table[t0 / bs], c->layer, 0, 0) + (size_t)kvh * hs;
        const int n = n_pos - t0 < bs ? n_pos - t0 : bs;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < hs; j++)
                k_t[(size_t)j * bp + i] = k[(size_t)i * kv_dim + j];
        for (int j = 0; j < hs; j++)
            for (int i = n; i < bp; i++)
                k_t[(size_t)j * bp + i] = 0.0f;
        for (int ri = 0; ri < n_rows; ri++) {
            if (t0 > pos0 + ri) /* causal: the block starts after this row */
                continue;
            for (int g = 0; g < group; g++) {
                const float *q = c->q + (size_t)(tl->row0 + ri) * dim + (size_t)(kvh * group + g) * hs;
                float *srow = scores + ((size_t)ri * group + g) * seq_len + t0;
                for (int i0 = 0; i0 < bp; i0 += 8) {
                    /* four accumulators: four independent FMA chains over j */
                    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
                    const float *kt = k_t + i0;
                    int j = 0;
                    for (; j + 4 <= hs; j += 4, kt += 4 * (size_t)bp) {
                        a0 += q[j] * *(const v8f *)kt;
                        a1 += q[j + 1] * *(const v8f *)(kt + bp);
                        a2 += q[j + 2] * *(const v8f *)(kt + 2 * (size_t)bp);
                        a3 += q[j + 3] * *(const v8f *)(kt + 3 * (size_t)bp);
                    }
                    for (; j < hs; j++, kt += bp)
                        a0 += q[j] * *(const v8f *)kt;
                    v8f acc = ((a0 + a1) + (a2 + a3)) / scale;
                    int m = n - i0 < 8 ? n - i0 : 8;
                    for (int i = 0; i < m; i++)
                        srow[i0 + i] = acc[i];
                }
            }
        }
    }
    for (int ri = 0; ri < n_rows; ri++) {
        const int np = pos0 + ri + 1;
        for (int g = 0; g < group; g++) {
            float *srow = scores + ((size_t)ri * group + g) * seq_len;
            float max = -INFINITY;
            for (int t = 0; t < np; t++)
                if (srow[t] > max)
                    max = srow[t];
            const float inv = 1.0f / exp_shifted_sum(srow, np, max);
            for (int t = 0; t < np; t++)
                srow[t] *= inv;
            memset(c->att + (size_t)(tl->row0 + ri) * dim + (size_t)(kvh * group + g) * hs, 0,
                   (size_t)hs * sizeof(float));
        }
    }
    for (int t0 = 0; t0 < n_pos; t0 += bs) {
        const float *v = kv_at(c, table[t0 / bs], c->layer, 1, 0) + (size_t)kvh * hs;
        const int n = n_pos - t0 < bs ? n_pos - t0 : bs;
        for (int ri = 0; ri < n_rows; ri++) {
            const int m = pos0 + ri + 1 - t0 < n ? pos0 + ri + 1 - t0 : n;
            for (int g = 0; g < group; g++) {
                const float *p = scores + ((size_t)ri * group + g) * seq_len + t0;
                float *out = c->att + (size_t)(tl->row0 + ri) * dim + (size_t)(kvh * group + g) * hs;
                if (m > 0)
                    weighted_sum(out, v, (size_t)kv_dim, p, 1.0f, m, hs);
            }
        }
    }
}

/* One task = one tile and one KV head. A single row (decode) goes straight through
 * attend_head; several rows of one sequence (prefill) through attend_tile. */
static void attention_task(void *ctx, int task, int worker)
{
    cpu *c = ctx;
    const eng_batch *b = c->b;
    const struct tile *tl = &c->tiles[task / c->c.n_kv_heads];
    const int kvh = task % c->c.n_kv_heads, hs = c->head_size;
    float *scores = c->scores + (size_t)worker * c->scores_per_worker;
    if (tl->row1 - tl->row0 > 1) {
        attend_tile(c, b, tl, kvh, scores,
                    c->k_t + (size_t)worker * (size_t)hs * (size_t)c->block_pad);
        return;
    }
    const int row = tl->row0, pos = b->positions[row];
    const int32_t *table = b->block_table + (size_t)tl->seq * (size_t)b->block_table_stride;
    for (int h = kvh * c->group; h < (kvh + 1) * c->group; h++)
        attend_head(c, c->q + (size_t)row * c->c.dim + (size_t)h * hs, table, kvh, pos + 1,
                    scores, c->att + (size_t)row * c->c.dim + (size_t)h * hs);
}

/* ---- forward ------------------------------------------------------------------------ */

static int cpu_execute(void *priv, const eng_batch *b, float *logits)
{
    cpu *c = priv;
    const eng_model_config *cfg = &c->c;
    const eng_model_tensors *w = c->t;
    const int T = b->n_tokens, dim = cfg->dim, kv_dim = c->kv_dim, hidden = cfg->hidden_dim;
    const int bs = c->block_size;
    uint64_t t_start = now_ns(), t0, proj = 0, attn = 0;
    c->b = b;

    c->n_tiles = 0;
    for (int s = 0; s < b->n_seqs; s++)
        for (int r = b->query_start[s]; r < b->query_start[s + 1]; r += TILE_ROWS) {
            int end = r + TILE_ROWS < b->query_start[s + 1] ? r + TILE_ROWS : b->query_start[s + 1];
            c->tiles[c->n_tiles++] = (struct tile){s, r, end};
        }
    const size_t emb_row = eng_wrow_bytes(w->token_embedding.type, dim);
    for (int r = 0; r < T; r++)
        q_dequant_row(w->token_embedding.type,
                      (const char *)w->token_embedding.data + (size_t)b->tokens[r] * emb_row,
                      c->x + (size_t)r * dim, dim);

    for (int l = 0; l < cfg->n_layers; l++) {
        c->layer = l;
        const eng_layer_weights *lw = &w->layers[l];
        for (int r = 0; r < T; r++)
            rmsnorm(c->xb + (size_t)r * dim, c->x + (size_t)r * dim, lw->rms_att, dim,
                    c->hp.norm_eps);

        t0 = now_ns();
        mm_job qkv[3] = {
            {.w = lw->wq, .n = dim, .k = dim, .x = c->xb, .y = c->q, .ld_y = dim},
            {.w = lw->wk, .n = kv_dim, .k = dim, .x = c->xb, .y = c->k, .ld_y = kv_dim},
            {.w = lw->wv, .n = kv_dim, .k = dim, .x = c->xb, .y = c->v, .ld_y = kv_dim},
        };
        matmul_jobs(c, qkv, 3, T);
        if (lw->bq) /* qwen2's Q/K/V biases */
            for (int r = 0; r < T; r++) {
                for (int i = 0; i < dim; i++)
                    c->q[(size_t)r * dim + i] += lw->bq[i];
                for (int i = 0; i < kv_dim; i++) {
                    c->k[(size_t)r * kv_dim + i] += lw->bk[i];
                    c->v[(size_t)r * kv_dim + i] += lw->bv[i];
                }
            }
        proj += now_ns() - t0;

        t0 = now_ns();
        for (int r = 0; r < T; r++) {
            int pos = b->positions[r];
            float *k = c->k + (size_t)r * kv_dim;
            rope(c, c->q + (size_t)r * dim, dim, pos);
            rope(c, k, kv_dim, pos);
            int64_t slot = b->slot_mapping[r];
            int block = (int)(slot / bs), off = (int)(slot % bs);
            memcpy(kv_at(c, block, l, 0, off), k, (size_t)kv_dim * sizeof(float));
            memcpy(kv_at(c, block, l, 1, off), c->v + (size_t)r * kv_dim,
                   (size_t)kv_dim * sizeof(float));
        }
        pool_run(&c->workers, c->n_tiles * cfg->n_kv_heads, attention_task, c);
        attn += now_ns() - t0;

        t0 = now_ns();
        mm_job o = {.w = lw->wo, .n = dim, .k = dim, .x = c->att, .y = c->x, .ld_y = dim,
                    .beta = 1.0f}; /* x += att · Wo^T */
        matmul_jobs(c, &o, 1, T);
        proj += now_ns() - t0;

        for (int r = 0; r < T; r++)
            rmsnorm(c->xb + (size_t)r * dim, c->x + (size_t)r * dim, lw->rms_ffn, dim,
                    c->hp.norm_eps);

        t0 = now_ns();
        mm_job up = {.w = lw->w1, .n = hidden, .k = dim, .x = c->xb, .y = c->h1, .ld_y = hidden,
                     .up = lw->w3, .y_up = c->h3};
        matmul_jobs(c, &up, 1, T);
        mm_job down = {.w = lw->w2, .n = dim, .k = hidden, .x = c->h1, .y = c->x, .ld_y = dim,
                       .beta = 1.0f}; /* x += ffn */
        matmul_jobs(c, &down, 1, T);
        proj += now_ns() - t0;
    }

    if (b->n_logits) {
        for (int i = 0; i < b->n_logits; i++)
            rmsnorm(c->xf + (size_t)i * dim, c->x + (size_t)b->logits_rows[i] * dim,
                    w->rms_final, dim, c->hp.norm_eps);
        t0 = now_ns();
        mm_job cls = {.w = w->wcls, .n = cfg->vocab_size, .k = dim, .x = c->xf, .y = logits,
                      .ld_y = cfg->vocab_size};
        matmul_jobs(c, &cls, 1, b->n_logits);
        proj += now_ns() - t0;
    }
    c->b = NULL;
    uint64_t total = now_ns() - t_start;
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
    if (!c)
        return;
    pool_stop(&c->workers);
    if (c->kv_pool)
        rnuma_free(c->kv_pool, c->kv_pool_bytes);
    float *bufs[] = {c->rope_cos, c->rope_sin, c->x, c->xb, c->q, c->k, c->v,
                     c->att, c->h1, c->h3, c->xf, c->scores, c->k_t};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(c->tiles);
    free(c);
}

static float *falloc(cpu *c, size_t n)
{
    c->scratch_bytes += n * sizeof(float);
    return malloc((n ? n : 1) * sizeof(float));
}

static int cpu_create(eng *e, const eng_model *m, const eng_options *opt, void **privp)
{
    (void)e;
    *privp = NULL;
    if (eng_model_is_lazy(m))
        return eng_seterr(-ENOTSUP, "the CPU backend needs host weights: a synthetic:lazy: "
                                    "model has none (drop \"lazy:\")");
    cpu *c = calloc(1, sizeof *c);
    if (!c)
        return eng_seterr(-ENOMEM, "out of memory");
    c->c = *eng_model_cfg(m);
    c->t = eng_model_tensors_of(m);
    const eng_model_config *cfg = &c->c;
    c->head_size = cfg->dim / cfg->n_heads;
    c->hp = *eng_model_hparams_of(m);
    c->kv_dim = cfg->dim / cfg->n_heads * cfg->n_kv_heads;
    c->group = cfg->n_heads / cfg->n_kv_heads;
    c->block_size = opt->kv_block_size;
    c->n_blocks = opt->kv_blocks;
    c->max_rows = opt->max_batch_tokens;
    c->numa_node = opt->numa_node;
    c->block_floats = (size_t)cfg->n_layers * 2 * (size_t)c->block_size * (size_t)c->kv_dim;
    c->kv_pool_bytes = c->block_floats * sizeof(float) * (size_t)c->n_blocks;
    int n_workers = opt->n_threads > 0 ? opt->n_threads : 1;
    int err = -ENOMEM;

    c->kv_pool = rnuma_alloc(c->kv_pool_bytes, opt->numa_node);
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
    c->q = falloc(c, T * cfg->dim);
    c->k = falloc(c, T * c->kv_dim);
    c->v = falloc(c, T * c->kv_dim);
    c->att = falloc(c, T * cfg->dim);
    c->h1 = falloc(c, T * cfg->hidden_dim);
    c->h3 = falloc(c, T * cfg->hidden_dim);
    c->xf = falloc(c, T * cfg->dim);
    c->scores_per_worker = (size_t)TILE_ROWS * c->group * cfg->seq_len;
    c->scores = falloc(c, (size_t)n_workers * c->scores_per_worker);
    c->block_pad = (c->block_size + 7) & ~7;
    c->k_t = falloc(c, (size_t)n_workers * c->head_size * c->block_pad);
    c->tiles = malloc(T * sizeof *c->tiles);
    if (!c->rope_cos || !c->rope_sin || !c->x || !c->xb || !c->q || !c->k || !c->v || !c->att ||
        !c->h1 || !c->h3 || !c->xf || !c->scores || !c->k_t || !c->tiles) {
        err = eng_seterr(-ENOMEM, "CPU scratch for %d rows: out of memory", c->max_rows);
        goto fail;
    }
    /* The very expressions of run.c, so the rotation angles are bit-identical (for GGUF the
     * base and dimension from the file, and Llama 3.1's per-frequency divisors). */
    const float theta = c->hp.rope_theta;
    const float *ff = c->t->rope_freq_factors;
    for (int pos = 0; pos < cfg->seq_len; pos++) {
        for (int i = 0; i < c->hp.rope_dim; i += 2) {
            float freq = 1.0f / powf(theta, i / (float)c->hp.rope_dim);
            if (ff)
                freq /= ff[i / 2];
            float val = pos * freq;
            c->rope_cos[(size_t)pos * half + (size_t)i / 2] = cosf(val);
            c->rope_sin[(size_t)pos * half + (size_t)i / 2] = sinf(val);
        }
    }
    /* Our workers split every matmul; OpenBLAS must not add threads of its own. */
    openblas_set_num_threads(1);
    if ((err = pool_start(&c->workers, n_workers, opt->numa_node))) {
        err = eng_seterr(err, "cannot start %d worker threads", n_workers);
        goto fail;
    }
    *privp = c;
    return 0;
fail:
    cpu_destroy(c);
    return err;
}

/* ---- KV blocks ---------------------------------------------------------------------- */

static size_t cpu_kv_block_bytes(void *priv) { return ((cpu *)priv)->block_floats * sizeof(float); }

static size_t cpu_memory_bytes(void *priv)
{
    cpu *c = priv;
    return c->kv_pool_bytes + c->scratch_bytes;
}

static void *cpu_kv_block_ptr(void *priv, int block)
{
    cpu *c = priv;
    return c->kv_pool + (size_t)block * c->block_floats;
}

static void *cpu_kv_pool_base(void *priv, size_t *len)
{
    cpu *c = priv;
    if (len)
        *len = c->kv_pool_bytes;
    return c->kv_pool;
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
            memcpy(cpu_kv_block_ptr(c, dst[i]), cpu_kv_block_ptr(c, src[i]),
                   cpu_kv_block_bytes(c));
    return 0;
}

int eng_cpu_phase_stats(void *priv, eng_phase_stats *out, bool reset)
{
    cpu *c = priv;
    pool *p = &c->workers;
    if (out) {
        *out = c->stats;
        out->regions = atomic_load_explicit(&p->regions, memory_order_relaxed);
        out->wake_calls = atomic_load_explicit(&p->wake_calls, memory_order_relaxed);
        out->helper_waits = atomic_load_explicit(&p->waits, memory_order_relaxed);
        out->helper_sleeps = atomic_load_explicit(&p->sleeps, memory_order_relaxed);
        out->spin_budget_ns = atomic_load_explicit(&p->budget_ns, memory_order_relaxed);
        out->wake_latency_ns = atomic_load_explicit(&p->wake_ns, memory_order_relaxed);
    }
    if (reset) {
        memset(&c->stats, 0, sizeof c->stats);
        atomic_store_explicit(&p->regions, 0, memory_order_relaxed);
        atomic_store_explicit(&p->wake_calls, 0, memory_order_relaxed);
        atomic_store_explicit(&p->waits, 0, memory_order_relaxed);
        atomic_store_explicit(&p->sleeps, 0, memory_order_relaxed);
    }
    return 0;
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
};

const eng_backend_ops *eng_cpu_backend(void) { return &cpu_ops; }
