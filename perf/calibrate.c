/* SPDX-License-Identifier: MIT */
/*
 * perf/calibrate — measures what the simulator's service model needs (sim/FORMATS.md):
 *
 *   1. the engine's step time over a grid of (prefill tokens, decode sequences, context),
 *      through kernels/engine.h exactly as the daemon drives it (one flattened batch per
 *      step: D decode rows at context C plus one prefill chunk of P rows);
 *   2. KV transfer bandwidth and per-transfer latency per tier and direction, through
 *      daemon/kvtier.h — the same io_uring read/write path the daemon's swap uses;
 *
 * then fits  step_us = base + a·prefill_tokens + b·decode_seqs + c·Σcontext  by non-negative
 * least squares (sched_lsq, the solver the simulator's fits use too), prints the fit quality, and writes the calibration JSON (-o FILE).
 *
 *   3. (optional, --daemon-log) what the serving loop adds: the engine alone, timed back to
 *      back, is not what a request sees — ringlmd also plans, samples, pushes each token to
 *      a ring, wakes the client and polls its sessions every iteration, with colder caches
 *      and a client process sharing the CPUs. `calibrate --write-probe FILE` writes a trace
 *      of requests that run one at a time at contexts 16..448; replay it against a real
 *      ringlmd (`ringlm replay FILE`, same model, threads and policy) with --request-log;
 *      `--daemon-log LOG` then turns each request's decode period ((finish - first token) /
 *      (tokens - 1)) into a "serving_loop" point the simulator fits its loop terms from.
 *
 *   calibrate --model SPEC [--threads N] [--backend cpu|cuda] [-o FILE] [--quick|--full]
 *             [--kv-blocks N --host-kv-blocks N --block-size N] [--disk PATH|--no-disk]
 *             [--daemon-log REQUEST_LOG]
 *   calibrate --write-probe FILE [--probe-max-context N]
 */
#include <errno.h>
#include <jansson.h>
#include <liburing.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/kvtier.h"
#include "formats/request_log.h"
#include "kernels/batch.h"
#include "kernels/engine.h"
#include "perf/bench_util.h"
#include "sched/sched.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- step-time grid ---------------------------------------------------------------- */

typedef struct point {
    int prefill, decode, context;
    double sum_context; /* Σ context over the batch's sequences (the fit's regressor) */
    double step_us;
} point;

/* Runs one grid point: D decode sequences at context C (one row each, at position C-1)
 * plus, when P > 0, one prefill chunk of P rows. With decoders present the chunk is the
 * first chunk of a new prompt (positions 0..P-1); alone (D = 0) it is the last chunk of a
 * prompt of max(C, P) tokens, so the row's context is the prefill's. That is how the
 * simulator reads a row (sim/service.c: Σcontext = context × max(decode_seqs, 1)). The KV
 * the attention reads is whatever the pool holds: timing does not depend on its values. */
static int run_point(eng *e, const eng_model_config *mc, int P, int D, int C, int reps,
                     double *out_us, double *sum_ctx)
{
    int bs = eng_kv_block_size(e);
    int S = D + (P > 0);
    int T = D + P;
    int ctx_pf = D > 0 ? P : (P > C ? P : C);
    int max_ctx = ctx_pf > C ? ctx_pf : C;
    int stride = (max_ctx + bs - 1) / bs;
    /* Every sequence reads the same made-up tokens (timing does not depend on them). */
    int32_t *toks = calloc((size_t)max_ctx, sizeof *toks),
            *blocks = calloc((size_t)stride, sizeof *blocks);
    float *logits = malloc(sizeof(float) * (size_t)S * (size_t)mc->vocab_size);
    double *samples = calloc((size_t)reps, sizeof *samples);
    eng_batch_builder bb;
    int rc = eng_bb_init(&bb, T, S, stride, bs);
    if (rc < 0) goto out_nobb;
    rc = -ENOMEM;
    if (!toks || !blocks || !logits || !samples) goto out;
    for (int p = 0; p < max_ctx; p++) toks[p] = 3 + (p * 7919) % (mc->vocab_size - 3);
    int next_block = 0;
    for (int s = 0; s < S; s++) {
        bool is_pf = P > 0 && s == S - 1;
        int ctx = is_pf ? ctx_pf : C;
        int rows = is_pf ? P : 1;
        int nb = (ctx + bs - 1) / bs;
        if (next_block + nb > eng_kv_blocks(e)) {
            rc = eng_seterr(-ENOSPC, "grid point P=%d D=%d C=%d needs more than %d KV blocks", P, D,
                            C, eng_kv_blocks(e));
            goto out;
        }
        for (int j = 0; j < nb; j++) blocks[j] = next_block + j;
        if ((rc = eng_bb_add(&bb, toks, (uint32_t)(ctx - rows), (uint32_t)rows, blocks,
                             (uint32_t)nb, true)) < 0)
            goto out;
        next_block += nb;
    }
    *sum_ctx = (double)(D > 0 ? C : ctx_pf) * (D > 0 ? D : 1);
    const eng_batch *b = eng_bb_batch(&bb);
    for (int w = 0; w < 2; w++) /* warm caches and worker threads */
        if ((rc = eng_execute(e, b, logits)) < 0) goto out;
    for (int i = 0; i < reps; i++) {
        uint64_t t0 = now_ns();
        if ((rc = eng_execute(e, b, logits)) < 0) goto out;
        samples[i] = (double)(now_ns() - t0) / 1e3;
    }
    /* The fastest run, not the median: on a shared machine the others measure the
     * neighbours; the service model wants the engine's own cost (on a quiet machine the
     * two agree within a few percent). */
    qsort(samples, (size_t)reps, sizeof *samples, bench_cmp_double);
    *out_us = samples[0];
    rc = 0;
out:
    eng_bb_free(&bb);
out_nobb:
    free(toks);
    free(blocks);
    free(logits);
    free(samples);
    return rc;
}

/* Least squares over the rows' regressors (columns 0..k-1 of X), by the scheduler's one solver
 * (sched_lsq); terms in nonneg come out >= 0 (non-negative least squares), a column that never
 * varies from 0 is left out (0). */
static int lsq(int n, int k, double X[][8], const double *y, const double *w, unsigned nonneg,
               double *beta)
{
    double *x = malloc((size_t)(n ? n : 1) * (size_t)k * sizeof *x);
    if (!x) return -1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) x[(size_t)i * (size_t)k + (size_t)j] = X[i][j];
    int rc = sched_lsq(x, y, w, (size_t)n, k, (1u << k) - 1, nonneg, beta, NULL, NULL);
    free(x);
    return rc;
}

/* ---- transfers -------------------------------------------------------------------- */

typedef struct xfer_ctx {
    int done;
    int res;
    uint64_t elapsed_us;
} xfer_ctx;

static void xfer_done(void *ctx, uint64_t cookie, int res, sched_xfer_dir dir, sched_pool tier,
                      size_t bytes, uint64_t elapsed_us)
{
    (void)cookie;
    (void)dir;
    (void)tier;
    (void)bytes;
    xfer_ctx *x = ctx;
    x->done = 1;
    x->res = res;
    x->elapsed_us = elapsed_us;
}

typedef struct xfer_fit {
    bool ok;
    double bw[2]; /* bytes/s per direction */
    double lat_us[2];
    double wall_bw[2]; /* bytes / wall time of the biggest job, for the log */
} xfer_fit;

/* Moves jobs of 1..maxn blocks out and back in, times each job by its own completion
 * (kvtier's submit → last CQE), fits time = latency + bytes/bw per direction. */
static int measure_tier(kvtier *kt, struct io_uring *ring, sched_pool tier, size_t block_bytes,
                        int maxn, int reps, xfer_fit *fit)
{
    int sizes[8], ns = 0;
    for (int n = 1; n <= maxn && ns < 8; n *= 4) sizes[ns++] = n;
    int32_t *blocks = calloc((size_t)maxn, sizeof *blocks),
            *slots = calloc((size_t)maxn, sizeof *slots);
    double X[64][8], Y[2][64];
    int nrow = 0;
    int rc = 0;
    if (maxn > kvtier_blocks(kt, tier)) {
        rc = -ENOSPC;
        goto out;
    }
    for (int i = 0; i < maxn; i++) blocks[i] = slots[i] = i;
    for (int si = 0; si < ns; si++) {
        int n = sizes[si];
        double t[2][16];
        for (int r = 0; r < reps + 1; r++) {
            for (int dir = 0; dir < 2; dir++) {
                xfer_ctx x = {0};
                rc = kvtier_submit(kt, dir ? SCHED_XFER_IN : SCHED_XFER_OUT, tier, blocks, slots, n,
                                   1, xfer_done, &x);
                if (rc < 0) goto out;
                kvtier_flush(kt);
                while (!x.done) {
                    struct io_uring_cqe *cqe;
                    rc = io_uring_wait_cqe(ring, &cqe);
                    if (rc < 0) goto out;
                    kvtier_handle_cqe(kt, cqe);
                    io_uring_cqe_seen(ring, cqe);
                }
                if (x.res < 0) {
                    rc = x.res;
                    goto out;
                }
                if (r > 0) t[dir][r - 1] = (double)x.elapsed_us; /* the first is a warm-up */
            }
        }
        for (int dir = 0; dir < 2; dir++) Y[dir][nrow] = bench_median(t[dir], reps);
        X[nrow][0] = 1;
        X[nrow][1] = (double)n * (double)block_bytes;
        nrow++;
        if (n == sizes[ns - 1])
            for (int dir = 0; dir < 2; dir++)
                fit->wall_bw[dir] = (double)n * (double)block_bytes / (Y[dir][nrow - 1] / 1e6);
    }
    for (int dir = 0; dir < 2; dir++) {
        double beta[8];
        if (lsq(nrow, 2, X, Y[dir], NULL, 0, beta) < 0 || beta[1] <= 0) {
            /* degenerate (timer resolution): bandwidth from the biggest job alone */
            fit->bw[dir] = fit->wall_bw[dir];
            fit->lat_us[dir] = 0;
        } else {
            fit->bw[dir] = 1e6 / beta[1];
            fit->lat_us[dir] = beta[0] > 0 ? beta[0] : 0;
        }
    }
    fit->ok = true;
out:
    free(blocks);
    free(slots);
    return rc;
}

/* ---- the serving loop, from a real daemon's request log ----------------------------- */

/* The probe: requests far enough apart (250 ms; each takes < 40 ms here) that each runs
 * alone, so every decode step of it is a one-sequence step at a known context. */
static int write_probe(const char *path, int max_ctx)
{
    static const int prompts[] = {16, 64, 128, 192, 256, 320, 384, 448};
    const int out_tokens = 48, reps = 3;
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "calibrate: %s: %s\n", path, strerror(errno));
        return -errno;
    }
    int n = 0;
    for (int r = 0; r < reps; r++)
        for (size_t i = 0; i < sizeof prompts / sizeof *prompts; i++) {
            int p = prompts[i];
            if (p + out_tokens > max_ctx) continue;
            n++;
            fprintf(
                f,
                "{\"req\":%d,\"arrival_us\":%d,\"tenant\":\"default\",\"class\":\"standard\","
                "\"prompt_tokens\":%d,\"max_tokens\":%d,\"output_tokens\":%d,\"deadline_us\":null,"
                "\"cancel_us\":null,\"first_token_us\":null,\"finish_us\":null,"
                "\"finish_reason\":null,\"reject_reason\":null}\n",
                n, n * 250000, p, out_tokens, out_tokens);
        }
    if (fclose(f) != 0) {
        fprintf(stderr, "calibrate: %s: %s\n", path, strerror(errno));
        return -EIO;
    }
    if (!n) {
        fprintf(stderr, "calibrate: --probe-max-context %d leaves no probe request\n", max_ctx);
        return -EINVAL;
    }
    printf("wrote %s: %d requests, one at a time, 250 ms apart\n", path, n);
    return 0;
}

typedef struct loop_point {
    double context, period_us, arrival, finish;
    int line;
} loop_point;

/* Reads a ringlmd --request-log: one decode-period point per request that finished by length
 * with >= 8 tokens and overlapped no other request (a shared step is not a one-sequence
 * step). Unfinished, rejected or cancelled requests carry nulls there: skipped, counted. */
static int read_daemon_log(const char *path, loop_point **out, int *n_out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "calibrate: %s: %s\n", path, strerror(errno));
        return -errno;
    }
    loop_point *v = NULL;
    int n = 0, cap = 0, line = 0, skipped = 0, rc = 0;
    char *buf = NULL;
    size_t bcap = 0;
    while (getline(&buf, &bcap, f) > 0) {
        line++;
        if (buf[0] == '\n') continue;
        fmt_request q;
        fmt_request_text text;
        char why[200];
        size_t len = strlen(buf);
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) len--;
        if (fmt_request_parse(buf, len, &q, &text, why, sizeof why) < 0) {
            fprintf(stderr, "calibrate: %s:%d: %s\n", path, line, why);
            rc = -EINVAL;
            break;
        }
        double arr = (double)q.arrival_us, pr = (double)q.prompt_tokens,
               ot = (double)q.output_tokens;
        double ft = (double)q.first_token_us, fin = (double)q.finish_us;
        bool ok = q.finish_reason && !strcmp(q.finish_reason, "length") && ot >= 8 &&
                  q.first_token_us != FMT_NULL && q.finish_us != FMT_NULL && fin > ft && ft >= arr;
        if (!ok) {
            skipped++;
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            loop_point *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) {
                rc = -ENOMEM;
                break;
            }
            v = nv;
        }
        v[n++] = (loop_point){.context = pr + ot / 2,
                              .period_us = (fin - ft) / (ot - 1),
                              .arrival = arr,
                              .finish = fin,
                              .line = line};
    }
    free(buf);
    fclose(f);
    if (rc < 0) {
        free(v);
        return rc;
    }
    /* keep only requests that ran alone */
    int k = 0, shared = 0;
    for (int i = 0; i < n; i++) {
        bool alone = true;
        for (int j = 0; j < n && alone; j++)
            if (j != i && v[j].arrival < v[i].finish && v[i].arrival < v[j].finish) alone = false;
        if (alone)
            v[k++] = v[i];
        else
            shared++;
    }
    fprintf(stderr,
            "calibrate: %s: %d decode periods of requests that ran alone (%d overlapped another, "
            "%d not usable)\n",
            path, k, shared, skipped);
    if (!k) {
        fprintf(stderr,
                "calibrate: %s: no usable request (replay `calibrate --write-probe` against "
                "ringlmd --request-log)\n",
                path);
        free(v);
        return -EINVAL;
    }
    *out = v;
    *n_out = k;
    return 0;
}

/* ---- main ------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: calibrate --model SPEC [options]\n"
        "  --model SPEC        llama2.c file or synthetic:PRESET:SEED\n"
        "  --threads N         engine worker threads (default 1)\n"
        "  --backend B         cpu (default) or cuda\n"
        "  -o FILE             write the calibration JSON there (default: stdout only the "
        "summary)\n"
        "  --quick | --full    grid size (default quick: < 30 s on stories260K)\n"
        "  --reps N            timed runs per grid point, the fastest kept (default 5)\n"
        "  --block-size N      KV block size (default 16)\n"
        "  --kv-blocks N       device KV blocks to record (the daemon's --kv-blocks; default "
        "1024)\n"
        "  --host-kv-blocks N  host tier blocks to record and measure (default 2 x kv-blocks)\n"
        "  --disk PATH         disk tier file to measure (default /var/tmp/ringlm-calibrate.kv)\n"
        "  --no-disk           skip the disk tier\n"
        "  --no-transfer       skip transfer measurements\n"
        "  --daemon-log LOG    ringlmd --request-log of the probe (see --write-probe): the\n"
        "                      serving loop's decode periods, written as \"serving_loop\"\n"
        "  --write-probe FILE  write the probe trace (native JSONL) and exit; replay it with\n"
        "                      `ringlm replay FILE` against ringlmd --request-log LOG\n"
        "  --probe-max-context N  longest probe prompt + output (default 512)\n");
}

int main(int argc, char **argv)
{
    const char *model_spec = NULL, *backend = "cpu", *out_path = NULL;
    const char *disk_path = "/var/tmp/ringlm-calibrate.kv", *daemon_log = NULL, *probe_path = NULL;
    int probe_max_ctx = 512;
    int threads = 1, reps = 5, block_size = 16, kv_blocks_rec = 1024, host_blocks_rec = -1;
    bool full = false, do_xfer = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV()                                                                                    \
    do {                                                                                           \
        if (!v) {                                                                                  \
            fprintf(stderr, "calibrate: %s needs a value\n", a);                                   \
            return 2;                                                                              \
        }                                                                                          \
        i++;                                                                                       \
    } while (0)
        if (!strcmp(a, "--model")) {
            NEEDV();
            model_spec = v;
        } else if (!strcmp(a, "--threads")) {
            NEEDV();
            threads = atoi(v);
        } else if (!strcmp(a, "--backend")) {
            NEEDV();
            backend = v;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            NEEDV();
            out_path = v;
        } else if (!strcmp(a, "--quick"))
            full = false;
        else if (!strcmp(a, "--full"))
            full = true;
        else if (!strcmp(a, "--reps")) {
            NEEDV();
            reps = atoi(v);
        } else if (!strcmp(a, "--block-size")) {
            NEEDV();
            block_size = atoi(v);
        } else if (!strcmp(a, "--kv-blocks")) {
            NEEDV();
            kv_blocks_rec = atoi(v);
        } else if (!strcmp(a, "--host-kv-blocks")) {
            NEEDV();
            host_blocks_rec = atoi(v);
        } else if (!strcmp(a, "--disk")) {
            NEEDV();
            disk_path = v;
        } else if (!strcmp(a, "--no-disk"))
            disk_path = NULL;
        else if (!strcmp(a, "--no-transfer"))
            do_xfer = false;
        else if (!strcmp(a, "--daemon-log")) {
            NEEDV();
            daemon_log = v;
        } else if (!strcmp(a, "--write-probe")) {
            NEEDV();
            probe_path = v;
        } else if (!strcmp(a, "--probe-max-context")) {
            NEEDV();
            probe_max_ctx = atoi(v);
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "calibrate: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
#undef NEEDV
    }
    if (probe_path) return write_probe(probe_path, probe_max_ctx) < 0 ? 1 : 0;
    if (!model_spec) {
        usage(stderr);
        return 2;
    }
    if (threads < 1 || reps < 1 || reps > 15 || block_size < 1 || kv_blocks_rec < 1) {
        fprintf(stderr,
                "calibrate: --threads, --block-size, --kv-blocks must be >= 1, --reps in 1..15\n");
        return 2;
    }
    if (host_blocks_rec < 0) host_blocks_rec = 2 * kv_blocks_rec;
    loop_point *lps = NULL;
    int nlp = 0;
    if (daemon_log && read_daemon_log(daemon_log, &lps, &nlp) < 0) return 1;

    eng_model *m;
    int rc = eng_model_load(model_spec, &m);
    if (rc < 0) {
        fprintf(stderr, "calibrate: model %s: %s\n", model_spec, eng_errmsg());
        free(lps);
        return 1;
    }
    const eng_model_config *mc = eng_model_cfg(m);

    /* The grid. Quick: enough spread in each regressor for the fit; full: denser. */
    static const int pf_q[] = {0, 16, 64, 256}, dc_q[] = {0, 1, 4, 16, 64}, cx_q[] = {32, 128, 448};
    static const int pf_f[] = {0, 8, 32, 64, 128, 256, 512},
                     dc_f[] = {0, 1, 2, 4, 8, 16, 32, 64, 128},
                     cx_f[] = {16, 64, 128, 256, 448, 1024, 2048};
    const int *pf = full ? pf_f : pf_q, *dc = full ? dc_f : dc_q, *cx = full ? cx_f : cx_q;
    int npf = full ? 7 : 4, ndc = full ? 9 : 5, ncx = full ? 7 : 3;
    int max_ctx_model = mc->seq_len;
    /* pool: enough for the biggest point */
    int max_P = 0, max_D = 0, max_C = 0;
    for (int i = 0; i < npf; i++)
        if (pf[i] <= max_ctx_model && pf[i] > max_P) max_P = pf[i];
    for (int i = 0; i < ndc; i++)
        if (dc[i] > max_D) max_D = dc[i];
    for (int i = 0; i < ncx; i++)
        if (cx[i] <= max_ctx_model && cx[i] > max_C) max_C = cx[i];
    int per_seq = ((max_P > max_C ? max_P : max_C) + block_size - 1) / block_size;
    int pool = per_seq * (max_D + 1) + 4;
    int xfer_max = 64;
    if (pool < xfer_max) pool = xfer_max;
    eng_options eo = {.backend = backend,
                      .n_threads = threads,
                      .numa_node = -1,
                      .kv_blocks = pool,
                      .kv_block_size = block_size,
                      .max_batch_tokens = max_P + max_D + 1,
                      .max_seqs = max_D + 1};
    eng *e;
    rc = eng_create(m, &eo, &e);
    if (rc < 0) {
        fprintf(stderr, "calibrate: engine (%s): %s\n", backend, eng_errmsg());
        eng_model_free(m);
        free(lps);
        return 1;
    }
    fprintf(stderr,
            "calibrate: %s on %s, %d thread(s), KV %zu bytes/token, block %d, pool %d blocks\n",
            model_spec, eng_backend_name(e), threads, eng_kv_bytes_per_token(e), block_size, pool);

    point *pts = calloc((size_t)(npf * ndc * ncx), sizeof *pts);
    int np = 0;
    uint64_t t_grid = now_ns();
    for (int ic = 0; ic < ncx; ic++)
        for (int ip = 0; ip < npf; ip++)
            for (int id = 0; id < ndc; id++) {
                int P = pf[ip], D = dc[id], C = cx[ic];
                if (P == 0 && D == 0) continue;
                if (C > max_ctx_model || P > max_ctx_model) continue;
                point *p = &pts[np];
                p->prefill = P;
                p->decode = D;
                p->context = (D == 0 && P > C) ? P : C;
                rc = run_point(e, mc, P, D, C, reps, &p->step_us, &p->sum_context);
                if (rc < 0) {
                    fprintf(stderr, "calibrate: P=%d D=%d C=%d: %s\n", P, D, C, eng_errmsg());
                    goto fail;
                }
                np++;
            }
    double grid_s = (double)(now_ns() - t_grid) / 1e9;

    /* fit */
    double(*X)[8] = calloc((size_t)np, sizeof *X);
    double *Y = calloc((size_t)np, sizeof *Y);
    for (int i = 0; i < np; i++) {
        X[i][0] = 1;
        X[i][1] = pts[i].prefill;
        X[i][2] = pts[i].decode;
        X[i][3] = pts[i].sum_context;
        Y[i] = pts[i].step_us;
    }
    /* Weighted by 1/y²: least squares on relative error, so the small steps that dominate
     * a decode-heavy workload are fitted as well as the big prefill steps. */
    double *W = calloc((size_t)np, sizeof *W);
    for (int i = 0; i < np; i++) W[i] = 1.0 / (Y[i] * Y[i]);
    double beta[8] = {0};
    /* A negative coefficient is noise fitted as physics (a step never gets cheaper with
     * more work): non-negative least squares leaves such a term out. */
    bool fit_ok = lsq(np, 4, X, Y, W, 0xf, beta) == 0;
    free(W);
    double ss_res = 0, ss_tot = 0, mean = 0, *rel = calloc((size_t)np, sizeof *rel);
    for (int i = 0; i < np; i++) mean += Y[i] / np;
    for (int i = 0; i < np; i++) {
        double pred = beta[0] + beta[1] * X[i][1] + beta[2] * X[i][2] + beta[3] * X[i][3];
        ss_res += (Y[i] - pred) * (Y[i] - pred);
        ss_tot += (Y[i] - mean) * (Y[i] - mean);
        rel[i] = fabs(pred - Y[i]) / Y[i];
    }
    double r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : 1;
    double med_rel = bench_median(rel, np);
    double max_rel = 0;
    for (int i = 0; i < np; i++)
        if (rel[i] > max_rel) max_rel = rel[i];

    /* transfers */
    xfer_fit fits[SCHED_POOL__COUNT] = {{0}}; /* by sched_pool; [SCHED_POOL_DEVICE] unused */
    if (do_xfer) {
        struct io_uring ring;
        if ((rc = io_uring_queue_init(256, &ring, 0)) < 0) {
            fprintf(stderr, "calibrate: io_uring_queue_init: %s (transfers not measured)\n",
                    strerror(-rc));
        } else {
            size_t plen = 0;
            kvtier_config kc = {.block_bytes = eng_kv_block_bytes(e),
                                .pool_blocks = eng_kv_blocks(e),
                                .pool_base = eng_kv_pool_base(e, &plen),
                                .engine = e,
                                .host_blocks = xfer_max,
                                .disk_path = disk_path,
                                .disk_blocks = disk_path ? xfer_max : 0,
                                .numa_node = -1,
                                .ring = &ring,
                                .ud_tag = 1ull << 62,
                                .register_buffers = true};
            kvtier *kt;
            rc = kvtier_create(&kc, &kt);
            if (rc < 0 && disk_path) {
                fprintf(stderr, "calibrate: disk tier %s: %s — measuring the host tier only\n",
                        disk_path, kvtier_errmsg());
                kc.disk_path = NULL;
                kc.disk_blocks = 0;
                disk_path = NULL;
                rc = kvtier_create(&kc, &kt);
            }
            if (rc < 0) {
                fprintf(stderr, "calibrate: kvtier: %s (transfers not measured)\n",
                        kvtier_errmsg());
            } else {
                fprintf(stderr, "calibrate: tiers: %s\n", kvtier_describe(kt));
                for (sched_pool tier = SCHED_POOL_HOST; tier < SCHED_POOL__COUNT; tier++) {
                    if (!kvtier_blocks(kt, tier)) continue;
                    rc = measure_tier(kt, &ring, tier, eng_kv_block_bytes(e), xfer_max, 5,
                                      &fits[tier]);
                    if (rc < 0)
                        fprintf(stderr, "calibrate: %s tier transfers failed: %s %s\n",
                                sched_pool_name(tier), strerror(-rc), kvtier_errmsg());
                }
                kvtier_destroy(kt);
                if (disk_path) unlink(disk_path);
            }
            io_uring_queue_exit(&ring);
        }
    }

    /* report */
    printf("calibrate: %d grid points in %.1f s\n", np, grid_s);
    printf("%8s %8s %8s %12s %12s %7s\n", "prefill", "decode", "context", "step_us", "model_us",
           "err");
    for (int i = 0; i < np; i++) {
        double pred = beta[0] + beta[1] * X[i][1] + beta[2] * X[i][2] + beta[3] * X[i][3];
        printf("%8d %8d %8d %12.1f %12.1f %6.1f%%\n", pts[i].prefill, pts[i].decode, pts[i].context,
               pts[i].step_us, pred, 100 * (pred - Y[i]) / Y[i]);
    }
    printf(
        "step model: step_us = %.2f + %.4f*prefill_tokens + %.3f*decode_seqs + %.6f*sum_context\n",
        beta[0], beta[1], beta[2], beta[3]);
    printf("fit: r2 %.4f, median relative error %.1f%%, max %.1f%%%s\n", r2, 100 * med_rel,
           100 * max_rel, fit_ok ? "" : " (FIT FAILED)");
    if (nlp) {
        /* what the daemon took per decode step vs what the engine model says for it */
        double *ratio = calloc((size_t)nlp, sizeof *ratio);
        for (int i = 0; ratio && i < nlp; i++)
            ratio[i] = lps[i].period_us / (beta[0] + beta[2] + beta[3] * lps[i].context);
        printf("serving loop: %d decode periods from %s, daemon / engine model median %.2f\n", nlp,
               daemon_log, ratio ? bench_median(ratio, nlp) : NAN);
        free(ratio);
    }
    for (sched_pool tier = SCHED_POOL_HOST; tier < SCHED_POOL__COUNT; tier++)
        if (fits[tier].ok)
            printf("transfer %s: out %.2f GB/s (latency %.1f us), in %.2f GB/s (latency %.1f us)\n",
                   sched_pool_name(tier), fits[tier].bw[0] / 1e9, fits[tier].lat_us[0],
                   fits[tier].bw[1] / 1e9, fits[tier].lat_us[1]);

    if (out_path) {
        json_t *root = json_object();
        const char *base = strrchr(model_spec, '/');
        json_object_set_new(root, "version", json_integer(1));
        json_object_set_new(root, "backend", json_string(eng_backend_name(e)));
        json_object_set_new(root, "model", json_string(base ? base + 1 : model_spec));
        json_object_set_new(root, "model_hash", json_string(eng_model_hash(m)));
        json_object_set_new(root, "threads", json_integer(threads));
        json_object_set_new(root, "kv_block_size", json_integer(block_size));
        json_object_set_new(root, "kv_blocks_device", json_integer(kv_blocks_rec));
        json_object_set_new(root, "kv_blocks_host", json_integer(host_blocks_rec));
        json_object_set_new(root, "kv_bytes_per_token",
                            json_integer((json_int_t)eng_kv_bytes_per_token(e)));
        json_object_set_new(root, "max_batch_tokens", json_integer(max_P + max_D));
        json_t *grid = json_array();
        for (int i = 0; i < np; i++) {
            json_t *g = json_object();
            json_object_set_new(g, "prefill_tokens", json_integer(pts[i].prefill));
            json_object_set_new(g, "decode_seqs", json_integer(pts[i].decode));
            json_object_set_new(g, "context", json_integer(pts[i].context));
            json_object_set_new(g, "step_us", json_real(round(pts[i].step_us * 10) / 10));
            json_array_append_new(grid, g);
        }
        json_object_set_new(root, "grid", grid);
        if (fit_ok) {
            json_t *sm = json_object();
            json_object_set_new(sm, "base_us", json_real(beta[0]));
            json_object_set_new(sm, "per_prefill_token_us", json_real(beta[1]));
            json_object_set_new(sm, "per_decode_seq_us", json_real(beta[2]));
            json_object_set_new(sm, "per_context_token_us", json_real(beta[3]));
            json_object_set_new(sm, "r2", json_real(round(r2 * 10000) / 10000));
            json_object_set_new(sm, "median_rel_err", json_real(round(med_rel * 10000) / 10000));
            json_object_set_new(root, "step_model", sm);
        }
        json_t *tr = json_object();
        for (sched_pool tier = SCHED_POOL_HOST; tier < SCHED_POOL__COUNT; tier++) {
            if (!fits[tier].ok) continue;
            json_t *t = json_object();
            json_object_set_new(t, "out_bytes_per_s", json_real(fits[tier].bw[0]));
            json_object_set_new(t, "in_bytes_per_s", json_real(fits[tier].bw[1]));
            json_object_set_new(
                t, "latency_us",
                json_real(round((fits[tier].lat_us[0] + fits[tier].lat_us[1]) / 2 * 10) / 10));
            json_object_set_new(tr, sched_pool_name(tier), t);
        }
        json_object_set_new(root, "transfer", tr);
        if (nlp) {
            json_t *sl = json_object(), *a = json_array();
            json_object_set_new(sl, "source", json_string(daemon_log));
            for (int i = 0; i < nlp; i++)
                json_array_append_new(a, json_pack("{s:i,s:f,s:f}", "decode_seqs", 1, "context",
                                                   lps[i].context, "period_us",
                                                   round(lps[i].period_us * 10) / 10));
            json_object_set_new(sl, "points", a);
            json_object_set_new(root, "serving_loop", sl);
        }
        if (json_dump_file(root, out_path,
                           JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) < 0) {
            fprintf(stderr, "calibrate: cannot write %s: %s\n", out_path, strerror(errno));
            json_decref(root);
            rc = -EIO;
            goto fail;
        }
        json_decref(root);
        printf("wrote %s\n", out_path);
    }
    free(X);
    free(Y);
    free(rel);
    free(pts);
    free(lps);
    eng_destroy(e);
    eng_model_free(m);
    return 0;
fail:
    free(pts);
    free(lps);
    eng_destroy(e);
    eng_model_free(m);
    return 1;
}
