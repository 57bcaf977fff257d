/* ringlm — simulator service model. SPDX-License-Identifier: MIT */
#include "sim/service.h"
#include "sim/err.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sim_service_default(sim_service *s)
{
    memset(s, 0, sizeof *s);
    /* Llama-3-8B, bf16, one H200 (4.8 TB/s HBM, ~990 TFLOP/s dense bf16):
     *  base: every step streams the 16.06 GB of weights once → 3.35 ms at full bandwidth;
     *  prefill token: 2 × 8.03 GFLOP = 16 GFLOP → 16.2 µs at peak; at a realistic 55% MFU 29 µs;
     *  decode sequence: the same FLOPs, but batched decode is still bandwidth-bound, so add
     *        the per-sequence sampling/activation overhead seen in vLLM traces: 30 µs;
     *  context token: KV read per token per step = 32 layers × 8 KV heads × 128 × 2 (K,V)
     *        × 2 bytes = 128 KiB → 0.027 µs at 4.8 TB/s.
     *  KV: 141 GB − 16 GB weights, 90% usable → ~112 GB / 128 KiB = ~856k tokens = 53,500
     *        blocks of 16; host tier 256 GB pinned = 2M tokens = 122,000 blocks;
     *  host link: PCIe 5.0 x16, ~50 GB/s each way in practice, 10 µs per transfer. */
    s->base_us = 3350;
    s->per_prefill_token_us = 29;
    s->per_decode_seq_us = 30;
    s->per_context_token_us = 0.027;
    s->r2 = s->median_rel_err = s->max_rel_err = NAN;
    s->builtin = true;
    s->kv_block_size = 16;
    s->kv_blocks_device = 53500;
    s->kv_blocks_host = 122000;
    s->kv_bytes_per_token = 131072;
    s->max_batch_tokens = 8192;
    s->host = (sim_link){ 50e9, 50e9, 10, true };
    s->disk = (sim_link){ 6e9, 7e9, 80, true };
    snprintf(s->backend, sizeof s->backend, "builtin");
    snprintf(s->model, sizeof s->model, "llama-3-8b-bf16-h200 (spec-derived)");
    snprintf(s->source, sizeof s->source, "built-in default");
}

double sim_service_transfer_us(const sim_service *s, int tier, bool out, uint64_t tokens)
{
    const sim_link *l = tier ? &s->disk : &s->host;
    if (!l->present) l = &s->host;
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
    double step = sim_service_step_us(s, 0, (uint64_t)batch, (uint64_t)(batch * (prompt + output / 2)));
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
    if (!isfinite(d) || d < lo) return sim_err_set("%s: \"%s\" is %g, must be >= %g", name, key, d, lo);
    *out = d;
    return 0;
}

static int u32(json_t *o, const char *key, bool required, uint32_t *out, const char *name)
{
    double d;
    int rc = num(o, key, required, 0, &d, name);
    if (rc) return rc < 0 ? rc : 0;
    if (d > 4e9 || d != floor(d)) return sim_err_set("%s: \"%s\" must be an integer (is %g)", name, key, d);
    *out = (uint32_t)d;
    return 0;
}

/* Solve the 4×4 normal equations (A^T A) x = A^T y by Gaussian elimination with pivoting. */
static int solve4(double m[4][5], double x[4])
{
    for (int c = 0; c < 4; c++) {
        int piv = c;
        for (int r = c + 1; r < 4; r++) if (fabs(m[r][c]) > fabs(m[piv][c])) piv = r;
        if (fabs(m[piv][c]) < 1e-300) return -1;
        if (piv != c) for (int k = 0; k < 5; k++) { double t = m[c][k]; m[c][k] = m[piv][k]; m[piv][k] = t; }
        for (int r = 0; r < 4; r++) {
            if (r == c) continue;
            double f = m[r][c] / m[c][c];
            for (int k = c; k < 5; k++) m[r][k] -= f * m[c][k];
        }
    }
    for (int c = 0; c < 4; c++) x[c] = m[c][4] / m[c][c];
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Grid row → the model's regressors. A row's `context` is per sequence, so the batch's summed
 * context is context × (decode sequences, or 1 for a prefill-only row). */
static void regressors(double p, double d, double ctx, double a[4])
{
    a[0] = 1;
    a[1] = p;
    a[2] = d;
    a[3] = ctx * (d > 0 ? d : 1);
}

static int fit_grid(sim_service *s, json_t *grid, bool refit, const char *name)
{
    size_t n = json_array_size(grid);
    double *pts = calloc(n ? n * 5 : 1, sizeof *pts);
    double *rel = calloc(n ? n : 1, sizeof *rel);
    if (!pts || !rel) { free(pts); free(rel); return -ENOMEM; }
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *row = json_array_get(grid, i);
        char where[300];
        snprintf(where, sizeof where, "%s: grid[%zu]", name, i);
        if (!json_is_object(row)) { rc = sim_err_set("%s is not an object", where); goto out; }
        double *q = &pts[i * 5];
        if ((rc = num(row, "prefill_tokens", true, 0, &q[0], where)) ||
            (rc = num(row, "decode_seqs", true, 0, &q[1], where)) ||
            (rc = num(row, "context", true, 0, &q[2], where)) ||
            (rc = num(row, "step_us", true, 0, &q[3], where)))
            goto out;
        if (q[3] <= 0) { rc = sim_err_set("%s: \"step_us\" must be > 0", where); goto out; }
    }
    s->grid_points = (unsigned)n;
    if (refit) {
        if (n < 4) { rc = sim_err_set("%s: no \"step_model\" and only %zu grid rows (need >= 4 to fit)", name, n); goto out; }
        double m[4][5] = {{0}};
        for (size_t i = 0; i < n; i++) {
            double a[4], *q = &pts[i * 5];
            regressors(q[0], q[1], q[2], a);
            for (int r = 0; r < 4; r++) {
                for (int c = 0; c < 4; c++) m[r][c] += a[r] * a[c];
                m[r][4] += a[r] * q[3];
            }
        }
        double x[4];
        /* A grid that never varies one regressor leaves the system singular: say which. */
        if (solve4(m, x) < 0) { rc = sim_err_set("%s: the grid does not vary prefill tokens, decode sequences and context independently; cannot fit", name); goto out; }
        s->base_us = x[0];
        s->per_prefill_token_us = x[1];
        s->per_decode_seq_us = x[2];
        s->per_context_token_us = x[3];
        s->refit = true;
    }
    if (n) {
        double mean = 0, ss_tot = 0, ss_res = 0;
        for (size_t i = 0; i < n; i++) mean += pts[i * 5 + 3];
        mean /= (double)n;
        s->max_rel_err = 0;
        for (size_t i = 0; i < n; i++) {
            double *q = &pts[i * 5], a[4];
            regressors(q[0], q[1], q[2], a);
            double pred = s->base_us * a[0] + s->per_prefill_token_us * a[1] +
                          s->per_decode_seq_us * a[2] + s->per_context_token_us * a[3];
            ss_res += (q[3] - pred) * (q[3] - pred);
            ss_tot += (q[3] - mean) * (q[3] - mean);
            rel[i] = fabs(pred - q[3]) / q[3];
            if (rel[i] > s->max_rel_err) s->max_rel_err = rel[i];
        }
        s->r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : (ss_res == 0 ? 1 : 0);
        qsort(rel, n, sizeof *rel, cmp_double);
        s->median_rel_err = n % 2 ? rel[n / 2] : (rel[n / 2 - 1] + rel[n / 2]) / 2;
    }
out:
    free(pts);
    free(rel);
    return rc;
}

static int link_parse(json_t *o, sim_link *l, const char *name)
{
    if (!o || json_is_null(o)) { l->present = false; return 0; }
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

int sim_service_parse(sim_service *s, const char *name, const char *text)
{
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return sim_err_set("%s:%d: not JSON: %s", name, jerr.line, jerr.text);
    int rc = 0;
    sim_service_default(s);
    s->builtin = false;
    s->host.present = s->disk.present = false;
    snprintf(s->source, sizeof s->source, "%s", name);
    if (!json_is_object(root)) { rc = sim_err_set("%s: not a JSON object", name); goto out; }
    double version = 0;
    if ((rc = num(root, "version", true, 1, &version, name))) goto out;
    if (version != 1) { rc = sim_err_set("%s: \"version\" is %g, this reader knows 1", name, version); goto out; }
    json_t *b = json_object_get(root, "backend"), *m = json_object_get(root, "model");
    if (json_is_string(b)) snprintf(s->backend, sizeof s->backend, "%s", json_string_value(b));
    if (json_is_string(m)) snprintf(s->model, sizeof s->model, "%s", json_string_value(m));
    if ((rc = u32(root, "kv_block_size", true, &s->kv_block_size, name)) ||
        (rc = u32(root, "kv_blocks_device", true, &s->kv_blocks_device, name)) ||
        (rc = u32(root, "kv_blocks_host", false, &s->kv_blocks_host, name)) ||
        (rc = u32(root, "kv_bytes_per_token", true, &s->kv_bytes_per_token, name)) ||
        (rc = u32(root, "max_batch_tokens", false, &s->max_batch_tokens, name)))
        goto out;
    if (s->kv_block_size == 0) { rc = sim_err_set("%s: \"kv_block_size\" must be > 0", name); goto out; }
    json_t *grid = json_object_get(root, "grid");
    if (grid && !json_is_array(grid)) { rc = sim_err_set("%s: \"grid\" is not an array", name); goto out; }
    json_t *sm = json_object_get(root, "step_model");
    if (sm && !json_is_null(sm)) {
        if (!json_is_object(sm)) { rc = sim_err_set("%s: \"step_model\" is not an object", name); goto out; }
        char where[300];
        snprintf(where, sizeof where, "%s: step_model", name);
        /* the fitted intercept and slopes may be slightly negative from least squares */
        if ((rc = num(sm, "base_us", true, -1e9, &s->base_us, where)) ||
            (rc = num(sm, "per_prefill_token_us", true, -1e9, &s->per_prefill_token_us, where)) ||
            (rc = num(sm, "per_decode_seq_us", true, -1e9, &s->per_decode_seq_us, where)) ||
            (rc = num(sm, "per_context_token_us", true, -1e9, &s->per_context_token_us, where)))
            goto out;
        s->r2 = s->median_rel_err = s->max_rel_err = NAN;
        if (grid && (rc = fit_grid(s, grid, false, name))) goto out;
    } else {
        if (!grid) { rc = sim_err_set("%s: neither \"step_model\" nor \"grid\"", name); goto out; }
        if ((rc = fit_grid(s, grid, true, name))) goto out;
    }
    json_t *tr = json_object_get(root, "transfer");
    if (tr && !json_is_object(tr)) { rc = sim_err_set("%s: \"transfer\" is not an object", name); goto out; }
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

int sim_service_load(sim_service *s, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (len < 0 || len > (64 << 20)) { fclose(f); return sim_err_set("%s: unreadable or larger than 64 MiB", path); }
    char *buf = malloc((size_t)len + 1);
    if (!buf) { fclose(f); return -ENOMEM; }
    size_t got = fread(buf, 1, (size_t)len, f);
    fclose(f);
    buf[got] = 0;
    int rc = sim_service_parse(s, path, buf);
    free(buf);
    return rc;
}
