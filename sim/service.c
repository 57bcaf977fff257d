/* ringlm — simulator service model. SPDX-License-Identifier: MIT */
#include "sim/service.h"
#include "formats/iteration_log.h"
#include "formats/logfile.h"
#include "sim/err.h"
#include "sim/stats.h"
#include "sim/trace.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Measured on the CPU backend with stories15M (32,000 tokens), 32 sequences, AMD EPYC
 * 2 vCPU, 2 engine threads (perf/logprobs_bench --clock cpu; docs/results/2026-12-06-nseq.md):
 * top-5 log-probabilities cost 78 µs of CPU a row over plain decode, run on both threads
 * (~39 µs of a step's wall time); bias + penalties were within the noise of that (their cost
 * is O(bias entries + distinct tokens), not O(vocabulary)): 0.5 µs stands for it. The
 * log-probability pass scales with the vocabulary. */
#define PIPE_LOGPROBS_ROW_US   39.0
#define PIPE_PROCESSORS_ROW_US 0.5

static void sim_service_pipeline_defaults(sim_service *s)
{
    s->logprobs_row_us = PIPE_LOGPROBS_ROW_US;
    s->processors_row_us = PIPE_PROCESSORS_ROW_US;
}

void sim_service_default(sim_service *s)
{
    memset(s, 0, sizeof *s);
    /* Llama-3-8B, bf16, one H200 (4.8 TB/s HBM, ~990 TFLOP/s dense bf16):
     *  step model: sched_step_model_default (sched/cost.c says how each term is derived);
     *  KV: 141 GB − 16 GB weights, 90% usable → ~112 GB / 128 KiB = ~856k tokens = 53,500
     *        blocks of 16; host tier 256 GB pinned = 2M tokens = 122,000 blocks;
     *  host link: PCIe 5.0 x16, ~50 GB/s each way in practice, 10 µs per transfer. */
    sched_step_model m;
    sched_step_model_default(&m); /* the one built-in model, shared with the daemon */
    s->base_us = m.base_us;
    s->per_prefill_token_us = m.prefill_token_us;
    s->per_decode_seq_us = m.decode_seq_us;
    s->per_context_token_us = m.context_token_us;
    s->per_prefill_pair_us = m.prefill_pair_us;
    s->r2 = s->median_rel_err = s->max_rel_err = s->file_median_rel_err = NAN;
    s->loop_median_rel_err = s->loop_engine_median_rel_err = NAN;
    s->builtin = true;
    snprintf(s->fit, sizeof s->fit, "builtin");
    s->kv_block_size = 16;
    s->kv_blocks_device = 53500;
    s->kv_blocks_host = 122000;
    s->kv_bytes_per_token = 131072;
    s->max_batch_tokens = 8192;
    sim_service_pipeline_defaults(s);
    s->host = (sim_link){50e9, 50e9, 10, true};
    s->disk = (sim_link){6e9, 7e9, 80, true};
    snprintf(s->backend, sizeof s->backend, "builtin");
    snprintf(s->model, sizeof s->model, "llama-3-8b-bf16-h200 (spec-derived)");
    snprintf(s->source, sizeof s->source, "built-in default");
}

const sim_link *sim_service_link(const sim_service *s, sched_pool tier)
{
    const sim_link *l = tier == SCHED_POOL_DISK ? &s->disk : &s->host;
    return l->present ? l : &s->host;
}

void sim_service_set_tiers(sim_service *s, long long host_blocks, long long disk_blocks,
                           double host_bw, double disk_bw)
{
    if (host_blocks >= 0) {
        s->kv_blocks_host = (uint32_t)host_blocks;
        if (host_blocks) s->host.present = true;
    }
    if (disk_blocks >= 0) s->kv_blocks_disk = (uint32_t)disk_blocks;
    if (host_bw > 0) {
        s->host.in_bytes_per_s = s->host.out_bytes_per_s = host_bw;
        s->host.present = true;
    }
    if (disk_bw > 0 || (disk_blocks > 0 && !s->disk.present)) {
        /* a disk link of its own: the given speed, or the host's as it stands */
        if (!s->disk.present)
            s->disk = (sim_link){s->host.out_bytes_per_s, s->host.in_bytes_per_s,
                                 s->host.latency_us, true};
        if (disk_bw > 0) s->disk.in_bytes_per_s = s->disk.out_bytes_per_s = disk_bw;
    }
}

double sim_service_transfer_us(const sim_service *s, sched_pool tier, bool out, uint64_t tokens)
{
    const sim_link *l = sim_service_link(s, tier);
    double bw = out ? l->out_bytes_per_s : l->in_bytes_per_s;
    double bytes = (double)tokens * s->kv_bytes_per_token;
    return l->latency_us + (bw > 0 ? bytes / bw * 1e6 : 0);
}

double sim_service_capacity_rps(const sim_service *s, double prompt, double output, double batch)
{
    if (batch < 1) batch = 1;
    /* per request: its prefill, plus its share of decode steps at the given batch size
     * (context averaged over the decode: prompt + output/2) */
    double prefill = s->per_prefill_token_us * prompt;
    double step =
        sim_service_step_us(s, 0, (uint64_t)batch, (uint64_t)(batch * (prompt + output / 2)), 0);
    double decode = output * step / batch;
    return 1e6 / (prefill + decode);
}

/* ---- calibration JSON ------------------------------------------------------------------- */

static int num(json_t *o, const char *key, bool required, double lo, double *out, const char *name)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) return sim_err_set("%s: missing \"%s\"", name, key);
        return 1;
    }
    if (!json_is_number(v)) return sim_err_set("%s: \"%s\" is not a number", name, key);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo)
        return sim_err_set("%s: \"%s\" is %g, must be >= %g", name, key, d, lo);
    *out = d;
    return 0;
}

static int u32(json_t *o, const char *key, bool required, uint32_t *out, const char *name)
{
    double d;
    int rc = num(o, key, required, 0, &d, name);
    if (rc) return rc < 0 ? rc : 0;
    if (d > 4e9 || d != floor(d))
        return sim_err_set("%s: \"%s\" must be an integer (is %g)", name, key, d);
    *out = (uint32_t)d;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Grid row → the model's regressors, as perf/calibrate builds its batches: D decode rows at
 * context C (one per sequence) plus a prefill chunk of P rows — the first chunk of a new prompt
 * (positions 0..P-1) when decoders are present, else the last chunk of a prompt of max(C, P)
 * tokens. The batch's summed context is C × max(D, 1); the attention term sums the prefill
 * rows' positions. */
static void regressors(double p, double d, double ctx, double a[5])
{
    a[0] = 1;
    a[1] = p;
    a[2] = d;
    a[3] = ctx * (d > 0 ? d : 1);
    if (p <= 0)
        a[4] = 0;
    else if (d > 0)
        a[4] = p * (p - 1) / 2;
    else {
        double c = ctx > p ? ctx : p;
        a[4] = p * c - p * (p + 1) / 2;
    }
}

typedef struct fitq {
    double r2, median, max;
} fitq;

static void quality(const double *pts, size_t n, const double x[5], fitq *q)
{
    double mean = 0, ss_tot = 0, ss_res = 0;
    double *rel = malloc((n ? n : 1) * sizeof *rel);
    for (size_t i = 0; i < n; i++) mean += pts[i * 4 + 3];
    mean /= (double)(n ? n : 1);
    q->max = 0;
    for (size_t i = 0; i < n; i++) {
        const double *r = &pts[i * 4];
        double a[5], pred = 0;
        regressors(r[0], r[1], r[2], a);
        for (int k = 0; k < 5; k++) pred += x[k] * a[k];
        ss_res += (r[3] - pred) * (r[3] - pred);
        ss_tot += (r[3] - mean) * (r[3] - mean);
        double e = fabs(pred - r[3]) / r[3];
        if (rel) rel[i] = e;
        if (e > q->max) q->max = e;
    }
    q->r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : (ss_res == 0 ? 1 : 0);
    q->median = NAN;
    if (rel && n) {
        qsort(rel, n, sizeof *rel, cmp_double);
        q->median = n % 2 ? rel[n / 2] : (rel[n / 2 - 1] + rel[n / 2]) / 2;
    }
    free(rel);
}

/* Least squares over the grid with k regressors, weighted by 1/step² so the fit minimises
 * relative error: steps span three orders of magnitude, and an unweighted fit would let the
 * slowest rows decide every coefficient. */
static int refit(const double *pts, size_t n, int k, double x[5])
{
    double *a = malloc((n ? n : 1) * 5 * sizeof *a), *y = malloc((n ? n : 1) * sizeof *y),
           *w = malloc((n ? n : 1) * sizeof *w);
    int rc = -1;
    if (a && y && w) {
        for (size_t i = 0; i < n; i++) {
            const double *r = &pts[i * 4];
            regressors(r[0], r[1], r[2], &a[i * 5]);
            y[i] = r[3];
            w[i] = 1.0 / (r[3] * r[3]);
        }
        rc = sched_lsq(a, y, w, n, 5, (1u << k) - 1, 0, x, NULL, NULL);
    }
    free(a);
    free(y);
    free(w);
    return rc;
}

static void set_model(sim_service *s, const double x[5], const fitq *q, const char *fit,
                      bool refitted)
{
    s->base_us = x[0];
    s->per_prefill_token_us = x[1];
    s->per_decode_seq_us = x[2];
    s->per_context_token_us = x[3];
    s->per_prefill_pair_us = x[4];
    s->r2 = q->r2;
    s->median_rel_err = q->median;
    s->max_rel_err = q->max;
    s->refit = refitted;
    snprintf(s->fit, sizeof s->fit, "%s", fit);
}

/* Read the grid, then pick the model: the file's (have_file), a linear refit, or a refit with
 * the attention term, as `fit` asks (auto: the lowest median relative error on the grid). */
static int fit_grid(sim_service *s, json_t *grid, bool have_file, int fit, const char *name)
{
    size_t n = grid ? json_array_size(grid) : 0;
    double *pts = calloc(n ? n * 4 : 1, sizeof *pts);
    if (!pts) return -ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *row = json_array_get(grid, i);
        char where[300];
        snprintf(where, sizeof where, "%s: grid[%zu]", name, i);
        if (!json_is_object(row)) {
            rc = sim_err_set("%s is not an object", where);
            goto out;
        }
        double *q = &pts[i * 4];
        if ((rc = num(row, "prefill_tokens", true, 0, &q[0], where)) ||
            (rc = num(row, "decode_seqs", true, 0, &q[1], where)) ||
            (rc = num(row, "context", true, 0, &q[2], where)) ||
            (rc = num(row, "step_us", true, 0, &q[3], where)))
            goto out;
        if (q[3] <= 0) {
            rc = sim_err_set("%s: \"step_us\" must be > 0", where);
            goto out;
        }
    }
    s->grid_points = (unsigned)n;
    double xf[5] = {s->base_us, s->per_prefill_token_us, s->per_decode_seq_us,
                    s->per_context_token_us, s->per_prefill_pair_us};
    fitq qf = {NAN, NAN, NAN}, ql = {NAN, INFINITY, NAN}, qa = {NAN, INFINITY, NAN};
    double xl[5], xa[5];
    bool lin = n >= 4 && refit(pts, n, 4, xl) == 0, att = n >= 5 && refit(pts, n, 5, xa) == 0;
    if (lin) quality(pts, n, xl, &ql);
    if (att) quality(pts, n, xa, &qa);
    if (have_file && n) quality(pts, n, xf, &qf);
    s->file_median_rel_err = qf.median;
    if (fit == SIM_FIT_LINEAR && !lin) {
        rc = sim_err_set("%s: cannot refit the linear model: need >= 4 grid rows varying prefill "
                         "tokens, decode sequences and context independently",
                         name);
        goto out;
    }
    if (fit == SIM_FIT_ATTENTION && !att) {
        rc = sim_err_set(
            "%s: cannot refit with the attention term: need >= 5 grid rows varying prefill tokens, "
            "decode sequences, context and prefill position independently",
            name);
        goto out;
    }
    if (fit == SIM_FIT_LINEAR)
        set_model(s, xl, &ql, "linear-refit", true);
    else if (fit == SIM_FIT_ATTENTION)
        set_model(s, xa, &qa, "attention-refit", true);
    else if (have_file &&
             (fit == SIM_FIT_FILE || (!(ql.median < qf.median) && !(qa.median < qf.median))))
        set_model(s, xf, &qf, "file", false);
    else if (fit == SIM_FIT_FILE && !lin) {
        rc = sim_err_set("%s: no \"step_model\" and the grid cannot be fitted (need >= 4 rows "
                         "varying each term)",
                         name);
        goto out;
    } else if (att && qa.median < ql.median && fit != SIM_FIT_FILE)
        set_model(s, xa, &qa, "attention-refit", true);
    else if (lin)
        set_model(s, xl, &ql, "linear-refit", true);
    else {
        rc = sim_err_set("%s: no \"step_model\" and the grid cannot be fitted (need >= 4 rows "
                         "varying each term)",
                         name);
        goto out;
    }
out:
    free(pts);
    return rc;
}

static double median_of(double *v, size_t n)
{
    if (!n) return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* "serving_loop": decode periods a real ringlmd recorded (perf/calibrate --daemon-log). The
 * engine model (already chosen) predicts each period's engine share; what remains is the
 * loop's: fitted as loop_step_us + loop_context_us * Σcontext by least squares weighted by
 * 1/period² (relative error, as the grid fit). Done after the engine fit, against the very
 * model the simulation runs, so the two add up to what the daemon was seen to take. */
static int fit_loop(sim_service *s, json_t *sl, const char *name)
{
    if (!sl || json_is_null(sl)) return 0;
    char where[300];
    snprintf(where, sizeof where, "%s: serving_loop", name);
    if (!json_is_object(sl)) return sim_err_set("%s is not an object", where);
    json_t *pts = json_object_get(sl, "points");
    if (!json_is_array(pts)) return sim_err_set("%s: \"points\" is missing or not an array", where);
    size_t n = json_array_size(pts);
    if (n == 0) return 0;
    double *v = calloc(n * 4, sizeof *v); /* per point: Σcontext, period, engine, residual */
    if (!v) return -ENOMEM;
    int rc = 0;
    double *ax = calloc(n * 2, sizeof *ax), *ar = calloc(n, sizeof *ar),
           *aw = calloc(n, sizeof *aw);
    if (!ax || !ar || !aw) {
        free(ax);
        free(ar);
        free(aw);
        free(v);
        return -ENOMEM;
    }
    double cmin = INFINITY, cmax = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        json_t *row = json_array_get(pts, i);
        char w[340];
        snprintf(w, sizeof w, "%s.points[%zu]", where, i);
        if (!json_is_object(row)) {
            rc = sim_err_set("%s is not an object", w);
            goto out;
        }
        double d = 1, c, p;
        if ((rc = num(row, "decode_seqs", false, 1, &d, w)) < 0 ||
            (rc = num(row, "context", true, 0, &c, w)) ||
            (rc = num(row, "period_us", true, 0, &p, w)))
            goto out;
        rc = 0;
        if (p <= 0) {
            rc = sim_err_set("%s: \"period_us\" must be > 0", w);
            goto out;
        }
        double cs = c * d, eng = sim_service_step_us(s, 0, (uint64_t)d, (uint64_t)cs, 0);
        v[i * 4] = cs;
        v[i * 4 + 1] = p;
        v[i * 4 + 2] = eng;
        ax[i * 2] = 1;
        ax[i * 2 + 1] = cs;
        ar[i] = p - eng;
        aw[i] = 1.0 / (p * p);
        if (cs < cmin) cmin = cs;
        if (cs > cmax) cmax = cs;
    }
    double x[5] = {0};
    /* one context only (or a singular system): a constant per step */
    if (!(cmax > cmin) || sched_lsq(ax, ar, aw, n, 2, 0x3, 0, x, NULL, NULL) < 0) {
        for (size_t i = 0; i < n; i++) v[i * 4 + 3] = v[i * 4 + 1] - v[i * 4 + 2];
        double *r = calloc(n, sizeof *r);
        if (!r) {
            rc = -ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < n; i++) r[i] = v[i * 4 + 3];
        x[0] = median_of(r, n);
        x[1] = 0;
        free(r);
    }
    s->loop_step_us = x[0];
    s->loop_context_us = x[1];
    s->loop_points = (unsigned)n;
    double *e0 = calloc(n, sizeof *e0), *e1 = calloc(n, sizeof *e1);
    if (!e0 || !e1) {
        free(e0);
        free(e1);
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        double p = v[i * 4 + 1], eng = v[i * 4 + 2];
        e0[i] = fabs(eng - p) / p;
        e1[i] = fabs(eng + x[0] + x[1] * v[i * 4] - p) / p;
    }
    s->loop_engine_median_rel_err = median_of(e0, n);
    s->loop_median_rel_err = median_of(e1, n);
    free(e0);
    free(e1);
out:
    free(ax);
    free(ar);
    free(aw);
    free(v);
    return rc;
}

static int link_parse(json_t *o, sim_link *l, const char *name)
{
    if (!o || json_is_null(o)) {
        l->present = false;
        return 0;
    }
    if (!json_is_object(o)) return sim_err_set("%s is not an object", name);
    int rc;
    if ((rc = num(o, "out_bytes_per_s", true, 1, &l->out_bytes_per_s, name)) ||
        (rc = num(o, "in_bytes_per_s", true, 1, &l->in_bytes_per_s, name)))
        return rc;
    l->latency_us = 0;
    if ((rc = num(o, "latency_us", false, 0, &l->latency_us, name)) < 0) return rc;
    l->present = true;
    return 0;
}

int sim_service_parse(sim_service *s, const char *name, const char *text, int fit)
{
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return sim_err_set("%s:%d: not JSON: %s", name, jerr.line, jerr.text);
    int rc = 0;
    sim_service_default(s);
    s->builtin = false;
    s->host.present = s->disk.present = false;
    snprintf(s->source, sizeof s->source, "%s", name);
    if (!json_is_object(root)) {
        rc = sim_err_set("%s: not a JSON object", name);
        goto out;
    }
    double version = 0;
    if ((rc = num(root, "version", true, 1, &version, name))) goto out;
    if (version != 1) {
        rc = sim_err_set("%s: \"version\" is %g, this reader knows 1", name, version);
        goto out;
    }
    json_t *b = json_object_get(root, "backend"), *m = json_object_get(root, "model");
    if (json_is_string(b)) snprintf(s->backend, sizeof s->backend, "%s", json_string_value(b));
    if (json_is_string(m)) snprintf(s->model, sizeof s->model, "%s", json_string_value(m));
    if ((rc = u32(root, "kv_block_size", true, &s->kv_block_size, name)) ||
        (rc = u32(root, "kv_blocks_device", true, &s->kv_blocks_device, name)) ||
        (rc = u32(root, "kv_blocks_host", false, &s->kv_blocks_host, name)) ||
        (rc = u32(root, "kv_blocks_disk", false, &s->kv_blocks_disk, name)) ||
        (rc = u32(root, "kv_bytes_per_token", true, &s->kv_bytes_per_token, name)) ||
        (rc = u32(root, "max_batch_tokens", false, &s->max_batch_tokens, name)) ||
        (rc = u32(root, "attention_window", false, &s->attention_window, name)))
        goto out;
    sim_service_pipeline_defaults(s);
    if ((rc = num(root, "logprobs_row_us", false, 0, &s->logprobs_row_us, name)) < 0 ||
        (rc = num(root, "processors_row_us", false, 0, &s->processors_row_us, name)) < 0)
        goto out;
    rc = 0;
    if (s->kv_block_size == 0) {
        rc = sim_err_set("%s: \"kv_block_size\" must be > 0", name);
        goto out;
    }
    json_t *grid = json_object_get(root, "grid");
    if (grid && !json_is_array(grid)) {
        rc = sim_err_set("%s: \"grid\" is not an array", name);
        goto out;
    }
    json_t *sm = json_object_get(root, "step_model");
    bool have_file = false;
    if (sm && !json_is_null(sm)) {
        if (!json_is_object(sm)) {
            rc = sim_err_set("%s: \"step_model\" is not an object", name);
            goto out;
        }
        char where[300];
        snprintf(where, sizeof where, "%s: step_model", name);
        /* the fitted intercept and slopes may be slightly negative from least squares */
        if ((rc = num(sm, "base_us", true, -1e9, &s->base_us, where)) ||
            (rc = num(sm, "per_prefill_token_us", true, -1e9, &s->per_prefill_token_us, where)) ||
            (rc = num(sm, "per_decode_seq_us", true, -1e9, &s->per_decode_seq_us, where)) ||
            (rc = num(sm, "per_context_token_us", true, -1e9, &s->per_context_token_us, where)))
            goto out;
        s->per_prefill_pair_us = 0;
        if ((rc = num(sm, "per_prefill_pair_us", false, -1e9, &s->per_prefill_pair_us, where)) < 0)
            goto out;
        rc = 0;
        have_file = true;
        snprintf(s->fit, sizeof s->fit, "file");
        s->r2 = s->median_rel_err = s->max_rel_err = NAN;
    } else if (!grid) {
        rc = sim_err_set("%s: neither \"step_model\" nor \"grid\"", name);
        goto out;
    }
    if (grid && (rc = fit_grid(s, grid, have_file, fit, name))) goto out;
    if (!grid && fit != SIM_FIT_AUTO && fit != SIM_FIT_FILE) {
        rc = sim_err_set("%s: no \"grid\" to refit from", name);
        goto out;
    }
    if ((rc = fit_loop(s, json_object_get(root, "serving_loop"), name))) goto out;
    json_t *tr = json_object_get(root, "transfer");
    if (tr && !json_is_object(tr)) {
        rc = sim_err_set("%s: \"transfer\" is not an object", name);
        goto out;
    }
    if (tr) {
        char where[300];
        snprintf(where, sizeof where, "%s: transfer.host", name);
        if ((rc = link_parse(json_object_get(tr, "host"), &s->host, where))) goto out;
        snprintf(where, sizeof where, "%s: transfer.disk", name);
        if ((rc = link_parse(json_object_get(tr, "disk"), &s->disk, where))) goto out;
    }
out:
    json_decref(root);
    return rc;
}

int sim_service_load(sim_service *s, const char *path, int fit)
{
    char *buf;
    int rc = sim_read_file(path, 64 << 20, &buf, NULL);
    if (rc < 0) return rc;
    rc = sim_service_parse(s, path, buf, fit);
    free(buf);
    return rc;
}

/* ---- iteration logs (ringlmd --iteration-log) ----------------------------------------------- */

#define IT_K     5    /* base, prefill_tokens, decode_seqs, context_tokens, prefill_pairs */
#define IT_GROSS 10.0 /* a period this many times the model's (and 1 ms over) is a gross error */

typedef struct itpt {
    double x[IT_K], y; /* regressors (x[0] = 1) and the observed period */
    double decode_ctx; /* NAN when the line did not carry it */
    double t_us;       /* iteration start (NAN when absent) */
    unsigned file;     /* which --iteration-log it came from */
} itpt;

typedef struct itset {
    itpt *p;
    size_t n, cap;
} itset;

static const char *const it_term_names[IT_K] = {"base", "prefill_tokens", "decode_seqs",
                                                "context_tokens", "prefill_pairs"};

const char *sim_service_term_name(int i)
{
    return i >= 0 && i < IT_K ? it_term_names[i] : "?";
}

/* Parse one non-blank line with the iteration log's reader (formats/iteration_log.h); adds a
 * point to set when it is usable for the fit. */
static int it_line(sim_service *s, itset *set, const char *buf, size_t len, const char *name,
                   size_t line)
{
    fmt_iteration it;
    char why[200];
    if (fmt_iteration_parse(buf, len, &it, why, sizeof why) < 0) {
        if (!fmt_json_line_torn(buf, len)) return sim_err_set("%s:%zu: %s", name, line, why);
        s->it_torn++; /* its writer died mid-line: not an error of the file */
        return 0;
    }
    s->it_lines++;
    /* null period: the loop went idle after this iteration (or it was the last), so its
     * period is not a step's cost; a zero period cannot be weighted by 1/period² */
    if (isnan(it.period_us) || it.period_us <= 0) {
        s->it_idle++;
        return 0;
    }
    /* a KV transfer started in the iteration: its cost is the transfer model's, not the step's */
    if (it.transfers > 0) {
        s->it_transfers++;
        return 0;
    }
    if (set->n == set->cap) {
        size_t cap = set->cap ? set->cap * 2 : 1024;
        itpt *np = realloc(set->p, cap * sizeof *np);
        if (!np) return sim_err_setc(-ENOMEM, "%s: out of memory", name);
        set->p = np;
        set->cap = cap;
    }
    set->p[set->n++] = (itpt){.x = {1, (double)it.prefill_tokens, (double)it.decode_seqs,
                                    (double)it.context_tokens, it.prefill_pairs},
                              .y = it.period_us,
                              .decode_ctx = it.decode_context,
                              .t_us = it.t_us,
                              .file = s->it_files};
    return 0;
}

static int it_read(sim_service *s, itset *set, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, line = 0;
    ssize_t got;
    int rc = 0;
    errno = 0;
    while ((got = getline(&buf, &cap, f)) >= 0) {
        line++;
        size_t len = (size_t)got;
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) len--;
        size_t i = 0;
        while (i < len && (buf[i] == ' ' || buf[i] == '\t')) i++;
        if (i == len) continue; /* blank line */
        if ((rc = it_line(s, set, buf, len, path, line)) < 0) goto out;
        errno = 0;
    }
    if (ferror(f))
        rc = sim_err_setc(errno ? -errno : -EIO, "%s: read error after line %zu", path, line);
out:
    free(buf);
    fclose(f);
    return rc;
}

/* The best model with non-negative slopes (the base is free) over the kept points, by the
 * scheduler's one solver: every subset of the five terms is fitted and the lowest residual
 * wins, fewer terms on a tie — the non-negative least-squares optimum, which leaves out by
 * itself a term whose column is zero or collinear, or that has fewer points than terms.
 * Unweighted: a simulated latency is a sum of steps, so what must be right is the sum of the
 * periods, batch type by batch type; the normal equations of an unweighted fit make the
 * residuals sum to zero along every term (Σ x_j·r = 0: prefill rows, decode sequences,
 * context, pairs). Weights of 1/period² (the relative error) did not: on real logs, whose
 * short periods are skewed by client wakes and preemption, they fitted the decode steps ~7%
 * above their sum and the simulated end-to-end latency came out 7% long. The base may come
 * out negative: the model is a plane over the batches the log holds (one-row decode steps
 * take a cheaper path than the plane's slope), and its intercept need not be a cost of its
 * own. Slopes must not. Returns 0 or -1 when no subset can be fitted (no points). */
static int it_fit(const itset *set, const bool *keep, double beta[IT_K], unsigned *terms)
{
    double *x = malloc((set->n ? set->n : 1) * IT_K * sizeof *x),
           *y = malloc((set->n ? set->n : 1) * sizeof *y),
           *w = malloc((set->n ? set->n : 1) * sizeof *w);
    int rc = -1;
    if (x && y && w) {
        for (size_t i = 0; i < set->n; i++) {
            memcpy(&x[i * IT_K], set->p[i].x, sizeof set->p[i].x);
            y[i] = set->p[i].y;
            w[i] = keep[i] ? 1 : 0;
        }
        rc = sched_lsq(x, y, w, set->n, IT_K, (1u << IT_K) - 1, ((1u << IT_K) - 1) & ~1u, beta,
                       terms, NULL);
    }
    free(x);
    free(y);
    free(w);
    return rc;
}

static double it_pred(const double beta[IT_K], const itpt *p)
{
    double v = 0;
    for (int j = 0; j < IT_K; j++) v += beta[j] * p->x[j];
    return v;
}

int sim_service_fit_iterations(sim_service *s, const char *const *paths, size_t n)
{
    itset set = {0};
    bool *keep = NULL;
    double *rel = NULL;
    int rc = 0;
    if (!n) return sim_err_set("no iteration log given");
    s->it_lines = s->it_points = s->it_dropped = s->it_idle = s->it_transfers = s->it_torn = 0;
    s->it_source[0] = 0;
    s->it_files = 0;
    for (size_t f = 0; f < n; f++) {
        if ((rc = it_read(s, &set, paths[f])) < 0) goto out;
        size_t used = strlen(s->it_source);
        snprintf(s->it_source + used, sizeof s->it_source - used, "%s%s", f ? ", " : "", paths[f]);
        s->it_files++;
    }
    if (set.n == 0) {
        rc = sim_err_set(
            "%s: no usable iterations (%zu lines: %zu without a period, %zu with KV transfers)",
            s->it_source, s->it_lines, s->it_idle, s->it_transfers);
        goto out;
    }
    keep = malloc(set.n * sizeof *keep);
    rel = malloc(set.n * sizeof *rel);
    if (!keep || !rel) {
        rc = sim_err_setc(-ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < set.n; i++) keep[i] = true;
    double beta[IT_K];
    unsigned terms = 0;
    if (it_fit(&set, keep, beta, &terms) < 0) {
        rc = sim_err_set("%s: the step model cannot be fitted", s->it_source);
        goto out;
    }
    /* Gross errors only: a period more than IT_GROSS× what the model says and over 1 ms
     * longer (a stopped or swapped-out process, a stalled disk write in the loop) is left out
     * and the model refit; then the rule is applied once more against the refit, which takes
     * back points that only looked gross beside a fit the outliers had pulled. Ordinary
     * noise stays in: the time was spent, and a simulated latency is a sum of steps (an
     * earlier rule, 4× the median relative residual, also dropped whole kinds of batch — every
     * prefill iteration of a log where they were one in ten — which then had no cost at all). */
    size_t dropped = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t changed = 0;
        dropped = 0;
        for (size_t i = 0; i < set.n; i++) {
            double pr = it_pred(beta, &set.p[i]), y = set.p[i].y;
            bool k = !(y > IT_GROSS * (pr > 1 ? pr : 1) && y - pr > 1000);
            changed += k != keep[i];
            keep[i] = k;
            dropped += !k;
        }
        if (!changed) break;
        if (it_fit(&set, keep, beta, &terms) < 0) {
            rc = sim_err_set("%s: the step model cannot be fitted after dropping %zu outliers",
                             s->it_source, dropped);
            goto out;
        }
    }
    /* quality on the kept points, and what the model being replaced makes of them */
    size_t m = 0;
    double mean = 0, ss_tot = 0, ss_res = 0, maxe = 0;
    bool prior_ok = true;
    for (size_t i = 0; i < set.n; i++)
        if (keep[i]) {
            mean += set.p[i].y;
            m++;
            prior_ok &= !isnan(set.p[i].decode_ctx);
        }
    mean /= (double)m;
    size_t j = 0;
    for (size_t i = 0; i < set.n; i++) {
        if (!keep[i]) continue;
        const itpt *p = &set.p[i];
        double pr = it_pred(beta, p), e = fabs(pr - p->y) / p->y;
        ss_res += (p->y - pr) * (p->y - pr);
        ss_tot += (p->y - mean) * (p->y - mean);
        if (e > maxe) maxe = e;
        rel[j++] = e;
    }
    qsort(rel, m, sizeof *rel, cmp_double);
    double med_kept = sim_percentile(rel, m, 0.5), p90 = sim_percentile(rel, m, 0.9);
    double prior = NAN;
    if (prior_ok) {
        j = 0;
        for (size_t i = 0; i < set.n; i++) {
            if (!keep[i]) continue;
            const itpt *p = &set.p[i];
            double pr = sim_service_step_us(s, (uint64_t)p->x[1], (uint64_t)p->x[2],
                                            (uint64_t)p->x[3], p->x[4]) +
                        s->loop_step_us + s->loop_context_us * p->decode_ctx;
            rel[j++] = fabs(pr - p->y) / p->y;
        }
        prior = median_of(rel, m);
    }
    s->base_us = beta[0];
    s->per_prefill_token_us = beta[1];
    s->per_decode_seq_us = beta[2];
    s->per_context_token_us = beta[3];
    s->per_prefill_pair_us = beta[4];
    s->r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : (ss_res == 0 ? 1 : 0);
    s->median_rel_err = med_kept;
    s->max_rel_err = maxe;
    s->it_p90_rel_err = p90;
    s->it_prior_median_rel_err = prior;
    s->it_points = m;
    s->it_dropped = dropped;
    s->it_terms = terms;
    /* the speed trace: how much slower or faster than the model the machine ran, window by
     * window, over the first log's kept iterations (a ratio of sums, so a window's long
     * steps weigh as much as the time they took) */
    free(s->speed);
    s->speed = NULL;
    s->n_speed = 0;
    if (s->speed_window_us > 0) {
        double tmax = -1;
        for (size_t i = 0; i < set.n; i++)
            if (keep[i] && set.p[i].file == 0 && isfinite(set.p[i].t_us) && set.p[i].t_us > tmax)
                tmax = set.p[i].t_us;
        if (tmax < 0) {
            rc = sim_err_set("%s: --speed-trace needs t_us on the iteration lines", s->it_source);
            goto out;
        }
        size_t nw = (size_t)(tmax / (double)s->speed_window_us) + 1;
        double *sy = calloc(nw, sizeof *sy), *sp = calloc(nw, sizeof *sp);
        unsigned *cnt = calloc(nw, sizeof *cnt);
        s->speed = calloc(nw, sizeof *s->speed);
        if (!sy || !sp || !cnt || !s->speed) {
            free(sy);
            free(sp);
            free(cnt);
            free(s->speed);
            s->speed = NULL;
            rc = sim_err_setc(-ENOMEM, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < set.n; i++) {
            const itpt *p = &set.p[i];
            if (!keep[i] || p->file != 0 || !isfinite(p->t_us)) continue;
            size_t w = (size_t)(p->t_us / (double)s->speed_window_us);
            sy[w] += p->y;
            sp[w] += it_pred(beta, p);
            cnt[w]++;
        }
        s->speed_min = INFINITY;
        s->speed_max = 0;
        s->speed_windows_measured = 0;
        for (size_t w = 0; w < nw; w++) {
            /* too few iterations say more about their own noise than about the machine */
            bool ok = cnt[w] >= SIM_SPEED_MIN_POINTS && sp[w] > 0;
            s->speed[w] = ok ? sy[w] / sp[w] : 1.0;
            if (!ok) continue;
            s->speed_windows_measured++;
            if (s->speed[w] < s->speed_min) s->speed_min = s->speed[w];
            if (s->speed[w] > s->speed_max) s->speed_max = s->speed[w];
        }
        s->n_speed = nw;
        free(sy);
        free(sp);
        free(cnt);
    }
    /* the first log's iterations, observed and modelled, for the noise floor (every point,
     * the dropped ones too: their time was spent) */
    free(s->it_obs);
    s->it_obs = NULL;
    s->n_it_obs = 0;
    {
        size_t n0 = 0;
        for (size_t i = 0; i < set.n; i++) n0 += set.p[i].file == 0 && isfinite(set.p[i].t_us);
        if (n0 && (s->it_obs = malloc(n0 * 3 * sizeof *s->it_obs))) {
            for (size_t i = 0; i < set.n; i++) {
                const itpt *p = &set.p[i];
                if (p->file != 0 || !isfinite(p->t_us)) continue;
                double *o = &s->it_obs[3 * s->n_it_obs++];
                o[0] = p->t_us;
                o[1] = p->y;
                o[2] = it_pred(beta, p);
            }
        }
    }
    s->refit = true;
    s->grid_points = 0;
    s->file_median_rel_err = NAN;
    snprintf(s->fit, sizeof s->fit, "iterations-fit");
    /* the real periods already hold everything the serving loop adds to a step */
    s->loop_step_us = s->loop_context_us = 0;
    s->loop_points = 0;
    s->loop_median_rel_err = s->loop_engine_median_rel_err = NAN;
    rc = 0;
out:
    free(set.p);
    free(keep);
    free(rel);
    return rc;
}

void sim_service_free(sim_service *s)
{
    if (!s) return;
    free(s->speed);
    s->speed = NULL;
    s->n_speed = 0;
    free(s->it_obs);
    s->it_obs = NULL;
    s->n_it_obs = 0;
}

int sim_service_noise_floor(const sim_service *s, const sim_req *reqs, size_t n, double *errs,
                            size_t *n_out)
{
    *n_out = 0;
    if (!s->it_obs || !s->n_it_obs) return -ENOENT;
    /* the log is in iteration order; a request spans the iterations that started in
     * [arrival, finish): the first token and every later one came from those */
    const double *o = s->it_obs; /* (t_us, observed, modelled) triples */
    size_t m = s->n_it_obs;
    for (size_t i = 1; i < m; i++)
        if (o[3 * i] < o[3 * (i - 1)]) return -EINVAL;
    for (size_t k = 0; k < n; k++) {
        const sim_req *q = &reqs[k];
        if (q->real_finish_us == SIM_NO_TIME || q->real_finish_us <= q->arrival_us) continue;
        if (q->real_reason != SIM_REAL_LENGTH && q->real_reason != SIM_REAL_STOP) continue;
        double a = (double)q->arrival_us, f = (double)q->real_finish_us;
        size_t lo = 0, hi = m;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (o[3 * mid] < a)
                lo = mid + 1;
            else
                hi = mid;
        }
        double obs = 0, mod = 0;
        for (size_t i = lo; i < m && o[3 * i] < f; i++) {
            obs += o[3 * i + 1];
            mod += o[3 * i + 2];
        }
        if (obs > 0) errs[(*n_out)++] = fabs(mod - obs) / obs;
    }
    qsort(errs, *n_out, sizeof *errs, cmp_double);
    return 0;
}
