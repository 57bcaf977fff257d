/* SPDX-License-Identifier: MIT */
/*
 * daemon/metrics_render.c — a published metrics snapshot → the Prometheus text exposition
 * format 0.0.4 (and the vllm:* names dashboards built for vLLM read). Runs on any thread:
 * it reads the triple buffer's front copy under read_mu, never the loop's live counters.
 */
#include "daemon/metrics_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- rendering ---------------------------------------------------------------------- */

/* Label values: backslash, double quote and newline are escaped (exposition format). The
 * renderer holds the stream's lock for the whole scrape (flockfile), so the unlocked stdio
 * calls below are safe and a scrape costs a few ms less. */
static void put_label(FILE *f, const char *name, const char *v, bool comma)
{
    if (comma) putc_unlocked(',', f);
    fputs_unlocked(name, f);
    fputs_unlocked("=\"", f);
    if (!strpbrk(v, "\\\"\n")) {
        fputs_unlocked(v, f);
    } else {
        for (const char *p = v; *p; p++) {
            if (*p == '\\')
                fputs_unlocked("\\\\", f);
            else if (*p == '"')
                fputs_unlocked("\\\"", f);
            else if (*p == '\n')
                fputs_unlocked("\\n", f);
            else
                putc_unlocked(*p, f);
        }
    }
    putc_unlocked('"', f);
}

static void head(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* `tenant="…",class="…"` of every series, rendered once per scrape (a histogram repeats it
 * on 21 lines). */
typedef struct tc_cache {
    char *text[MAX_SERIES];
} tc_cache;

static void tc_cache_build(tc_cache *c, const snap *s)
{
    for (int i = 0; i < s->n_series; i++) {
        char *buf = NULL;
        size_t n = 0;
        FILE *f = open_memstream(&buf, &n);
        c->text[i] = NULL;
        if (!f) continue;
        put_label(f, "tenant", s->tenants[s->series[i].tenant], false);
        put_label(f, "class", s->classes[s->series[i].cls], true);
        fclose(f);
        c->text[i] = buf;
    }
}

static void tc_cache_free(tc_cache *c, const snap *s)
{
    for (int i = 0; i < s->n_series; i++) free(c->text[i]);
}

static __thread const tc_cache *cur_tc; /* the cache of the scrape in progress */

static void tc_labels(FILE *f, const snap *s, const series_stats *x)
{
    int i = (int)(x - s->series);
    if (cur_tc && cur_tc->text[i]) {
        fputs_unlocked(cur_tc->text[i], f);
        return;
    }
    put_label(f, "tenant", s->tenants[x->tenant], false);
    put_label(f, "class", s->classes[x->cls], true);
}

static void put_seconds(FILE *f, uint64_t us)
{
    fprintf(f, "%.6f", (double)us / 1e6);
}

/* `,le="0.0005"} ` … `,le="+Inf"} `, formatted once. */
static char lat_le[N_LAT + 1][32];
static pthread_once_t lat_le_once = PTHREAD_ONCE_INIT;
static void lat_le_init(void)
{
    for (unsigned b = 0; b < N_LAT; b++)
        snprintf(lat_le[b], sizeof lat_le[b], ",le=\"%g\"} ",
                 (double)metrics__lat_bounds_us[b] / 1e6);
    snprintf(lat_le[N_LAT], sizeof lat_le[N_LAT], ",le=\"+Inf\"} ");
}

static void render_lat_hist(FILE *f, const snap *s, int h, const char *name, const char *help)
{
    head(f, name, "histogram", help);
    for (int i = 0; i < s->n_series; i++) {
        const series_stats *x = &s->series[i];
        const hist_lat *hh = &x->h[h];
        uint64_t cum = 0;
        for (unsigned b = 0; b <= N_LAT; b++) {
            cum += hh->bucket[b];
            fputs_unlocked(name, f);
            fputs_unlocked("_bucket{", f);
            tc_labels(f, s, x);
            fputs_unlocked(lat_le[b], f);
            fprintf(f, "%llu\n", (unsigned long long)cum);
        }
        fprintf(f, "%s_sum{", name);
        tc_labels(f, s, x);
        fputs("} ", f);
        put_seconds(f, hh->sum_us);
        fprintf(f, "\n%s_count{", name);
        tc_labels(f, s, x);
        fprintf(f, "} %llu\n", (unsigned long long)hh->count);
    }
}

static void render_tc_counter(FILE *f, const snap *s, const char *name, const char *type,
                              const char *help, size_t off)
{
    head(f, name, type, help);
    for (int i = 0; i < s->n_series; i++) {
        const series_stats *x = &s->series[i];
        uint64_t v;
        if (off == offsetof(series_stats, waiting) || off == offsetof(series_stats, running))
            v = *(const uint32_t *)((const char *)x + off);
        else
            v = *(const uint64_t *)((const char *)x + off);
        fprintf(f, "%s{", name);
        tc_labels(f, s, x);
        fprintf(f, "} %llu\n", (unsigned long long)v);
    }
}

/* The label reason="…" of slot r of a counter indexed by an enum: the enum's own name, and
 * "invalid" for the slot past its last value (metrics_internal.h). These are the only names
 * of reasons in the metrics module. */
typedef const char *(*reason_name_fn)(unsigned r, unsigned n);
static const char *finish_label(unsigned r, unsigned n)
{
    return r < n && r != SCHED_END_NONE ? sched_end_name(r) : "invalid";
}
static const char *reject_label(unsigned r, unsigned n)
{
    return r < n ? sched_reject_name((sched_reject_reason)r) : "invalid";
}
static const char *defer_label(unsigned r, unsigned n)
{
    return r < n ? sched_defer_name((sched_defer_reason)r) : "invalid";
}

static void reason_line(FILE *f, const snap *s, const series_stats *x, const char *name,
                        const char *mode, const char *reason, uint64_t v)
{
    fprintf(f, "%s{", name);
    tc_labels(f, s, x);
    if (mode) put_label(f, "mode", mode, true);
    put_label(f, "reason", reason, true);
    fprintf(f, "} %llu\n", (unsigned long long)v);
}

/* arr has n + 1 slots (the last one "invalid"); counters appear when they first count. */
static void render_reason_counter(FILE *f, const snap *s, const char *name, const char *help,
                                  size_t off, unsigned n, reason_name_fn label)
{
    head(f, name, "counter", help);
    for (int i = 0; i < s->n_series; i++) {
        const series_stats *x = &s->series[i];
        const uint64_t *arr = (const uint64_t *)((const char *)x + off);
        for (unsigned r = 0; r <= n; r++)
            if (arr[r]) reason_line(f, s, x, name, NULL, label(r, n), arr[r]);
    }
}

static const char *const dir_name[N_DIRS] = {"out", "in"};
static const char *const mode_name[METRICS_N_MODES] = {"swap", "recompute"};

static void render_vllm(FILE *f, const metrics *m, const snap *s);

static void render(FILE *f, const metrics *m, const snap *s)
{
    head(f, "ringlm_info", "gauge",
         "Build and service identity (version, policy hash, model hash).");
    fputs("ringlm_info{", f);
    put_label(f, "version", s->info.version, false);
    put_label(f, "policy", s->info.policy_name, true);
    put_label(f, "policy_hash", s->info.policy_hash, true);
    put_label(f, "model", s->info.model_path, true);
    put_label(f, "model_hash", s->info.model_hash, true);
    put_label(f, "backend", s->info.backend, true);
    fputs("} 1\n", f);

    render_lat_hist(f, s, METRICS_H_QUEUE_WAIT, "ringlm_queue_wait_seconds",
                    "Time from arrival to first scheduling, per tenant and class.");
    render_lat_hist(f, s, METRICS_H_TTFT, "ringlm_time_to_first_token_seconds",
                    "Time from arrival to the first generated token, per tenant and class.");
    render_lat_hist(f, s, METRICS_H_TPOT, "ringlm_time_per_output_token_seconds",
                    "Mean time per generated token after the first, per request.");
    render_lat_hist(f, s, METRICS_H_E2E, "ringlm_e2e_request_latency_seconds",
                    "Time from arrival to the end of the request, per tenant and class.");
    render_tc_counter(f, s, "ringlm_prompt_tokens_total", "counter",
                      "Prompt tokens of finished requests.", offsetof(series_stats, prompt_tokens));
    render_tc_counter(f, s, "ringlm_generation_tokens_total", "counter", "Generated tokens.",
                      offsetof(series_stats, generated_tokens));
    render_reason_counter(
        f, s, "ringlm_requests_finished_total",
        "Requests ended, by finish reason (length, stop, cancelled, timeout, rejected, error).",
        offsetof(series_stats, finish), N_FINISH, finish_label);
    render_reason_counter(f, s, "ringlm_rejects_total",
                          "Requests rejected at admission, by reason.",
                          offsetof(series_stats, reject), N_REJECT, reject_label);
    render_reason_counter(f, s, "ringlm_defers_total", "Scheduling deferrals, by reason.",
                          offsetof(series_stats, defer), N_DEFER, defer_label);
    head(f, "ringlm_preemptions_total", "counter",
         "Preemptions by mode (swap, recompute) and reason.");
    for (int i = 0; i < s->n_series; i++) {
        const series_stats *x = &s->series[i];
        for (int md = 0; md < METRICS_N_MODES; md++)
            for (unsigned r = 0; r <= N_DEFER; r++)
                if (x->preempt[md][r])
                    reason_line(f, s, x, "ringlm_preemptions_total", mode_name[md],
                                defer_label(r, N_DEFER), x->preempt[md][r]);
    }
    render_tc_counter(f, s, "ringlm_cancels_total", "counter",
                      "Requests cancelled (by the client or its death).",
                      offsetof(series_stats, cancels));
    render_tc_counter(f, s, "ringlm_timeouts_total", "counter",
                      "Requests timed out by their class deadline.",
                      offsetof(series_stats, timeouts));
    render_tc_counter(f, s, "ringlm_requests_waiting", "gauge", "Requests queued, not yet running.",
                      offsetof(series_stats, waiting));
    render_tc_counter(f, s, "ringlm_requests_running", "gauge",
                      "Requests running (holding KV blocks).", offsetof(series_stats, running));

    head(f, "ringlm_queue_depth", "gauge", "Requests queued across all tenants.");
    fprintf(f, "ringlm_queue_depth %u\n", s->waiting);
    head(f, "ringlm_kv_blocks_used", "gauge", "KV cache blocks in use, per tier.");
    for (sched_pool t = SCHED_POOL_DEVICE; t < SCHED_POOL__COUNT; t++)
        if (s->kv_total[t])
            fprintf(f, "ringlm_kv_blocks_used{tier=\"%s\"} %llu\n", sched_pool_name(t),
                    (unsigned long long)s->kv_used[t]);
    head(f, "ringlm_kv_blocks_free", "gauge", "KV cache blocks free, per tier.");
    for (sched_pool t = SCHED_POOL_DEVICE; t < SCHED_POOL__COUNT; t++)
        if (s->kv_total[t])
            fprintf(f, "ringlm_kv_blocks_free{tier=\"%s\"} %llu\n", sched_pool_name(t),
                    (unsigned long long)(s->kv_total[t] > s->kv_used[t]
                                             ? s->kv_total[t] - s->kv_used[t]
                                             : 0));
    head(f, "ringlm_kv_blocks_total", "gauge", "KV cache blocks configured, per tier.");
    for (sched_pool t = SCHED_POOL_DEVICE; t < SCHED_POOL__COUNT; t++)
        if (s->kv_total[t])
            fprintf(f, "ringlm_kv_blocks_total{tier=\"%s\"} %llu\n", sched_pool_name(t),
                    (unsigned long long)s->kv_total[t]);

    head(f, "ringlm_iteration_seconds", "histogram",
         "Duration of one loop iteration (plan, execute, sample, stream).");
    uint64_t cum = 0;
    for (unsigned b = 0; b <= N_ITER; b++) {
        cum += s->iter.bucket[b];
        if (b < N_ITER)
            fprintf(f, "ringlm_iteration_seconds_bucket{le=\"%g\"} %llu\n",
                    (double)metrics__iter_bounds_us[b] / 1e6, (unsigned long long)cum);
        else
            fprintf(f, "ringlm_iteration_seconds_bucket{le=\"+Inf\"} %llu\n",
                    (unsigned long long)cum);
    }
    fputs("ringlm_iteration_seconds_sum ", f);
    put_seconds(f, s->iter.sum_us);
    fprintf(f, "\nringlm_iteration_seconds_count %llu\n", (unsigned long long)s->iter.count);
    head(f, "ringlm_iteration_tokens_total", "counter",
         "Tokens executed by the engine (prefill and decode rows).");
    fprintf(f, "ringlm_iteration_tokens_total %llu\n", (unsigned long long)s->iter_tokens);

    head(f, "ringlm_transfer_bandwidth_bytes_per_second", "gauge",
         "KV transfer bandwidth the scheduler plans with, measured (moving average over "
         "transfers), per tier and direction.");
    for (sched_pool t = SCHED_POOL_HOST; t < SCHED_POOL__COUNT; t++)
        for (int d = 0; d < N_DIRS; d++)
            if (s->kv_total[t] || s->xfers[t][d])
                fprintf(f,
                        "ringlm_transfer_bandwidth_bytes_per_second{tier=\"%s\",dir=\"%s\"} %.6g\n",
                        sched_pool_name(t), dir_name[d], s->bw_bytes_per_s[t][d]);
    head(f, "ringlm_transfer_bytes_total", "counter", "KV bytes moved, per tier and direction.");
    for (sched_pool t = SCHED_POOL_HOST; t < SCHED_POOL__COUNT; t++)
        for (int d = 0; d < N_DIRS; d++)
            if (s->kv_total[t] || s->xfers[t][d])
                fprintf(f, "ringlm_transfer_bytes_total{tier=\"%s\",dir=\"%s\"} %llu\n",
                        sched_pool_name(t), dir_name[d], (unsigned long long)s->xfer_bytes[t][d]);
    head(f, "ringlm_transfers_total", "counter", "KV transfers completed, per tier and direction.");
    for (sched_pool t = SCHED_POOL_HOST; t < SCHED_POOL__COUNT; t++)
        for (int d = 0; d < N_DIRS; d++)
            if (s->kv_total[t] || s->xfers[t][d])
                fprintf(f, "ringlm_transfers_total{tier=\"%s\",dir=\"%s\"} %llu\n",
                        sched_pool_name(t), dir_name[d], (unsigned long long)s->xfers[t][d]);
    head(f, "ringlm_kv_tier_read_failures_total", "counter",
         "Reads back from a KV tier whose blocks were not used, per tier and reason (checksum: the "
         "bytes changed; short_read: the tier file ended early; io_error): the sequence "
         "recomputed them, or its request alone ended with an error.");
    for (sched_pool t = SCHED_POOL_HOST; t < SCHED_POOL__COUNT; t++)
        for (int r = 0; r < KVTIER_READ__COUNT; r++)
            if (s->kv_total[t] || s->tier_read_failures[t][r])
                fprintf(f, "ringlm_kv_tier_read_failures_total{tier=\"%s\",reason=\"%s\"} %llu\n",
                        sched_pool_name(t), kvtier_read_failure_name((kvtier_read_failure)r),
                        (unsigned long long)s->tier_read_failures[t][r]);
    if (s->kv_events_on) {
        head(f, "ringlm_kv_events_dropped_total", "counter",
             "KV-cache events dropped because the publisher fell behind (the loop never waits "
             "for it); subscribers are resynchronised after each run of drops.");
        fprintf(f, "ringlm_kv_events_dropped_total %llu\n",
                (unsigned long long)s->kv_events_dropped);
        head(f, "ringlm_kv_events_resyncs_total", "counter",
             "Resynchronisations of the KV-cache event subscribers: AllBlocksCleared, then every "
             "cached block.");
        fprintf(f, "ringlm_kv_events_resyncs_total %llu\n",
                (unsigned long long)s->kv_events_resyncs);
    }
    head(f, "ringlm_log_dropped_lines_total", "counter",
         "Decision/request log lines dropped because the log writer fell behind.");
    fprintf(f, "ringlm_log_dropped_lines_total{log=\"decision\"} %llu\n",
            (unsigned long long)s->log_dropped[0]);
    fprintf(f, "ringlm_log_dropped_lines_total{log=\"request\"} %llu\n",
            (unsigned long long)s->log_dropped[1]);

    render_vllm(f, m, s);
    head(f, "ringlm_prefix_cache_blocks", "gauge",
         "KV blocks cached that no sequence holds (counted free), per tier.");
    for (int t = 0; t < SCHED_POOL__COUNT; t++)
        fprintf(f, "ringlm_prefix_cache_blocks{tier=\"%s\"} %llu\n", sched_pool_name((sched_pool)t),
                (unsigned long long)s->prefix.unheld[t]);
    head(f, "ringlm_prefix_cache_hits_total", "counter",
         "Prompt tokens found cached at admission, per tier they were found in (host and disk ones "
         "reloaded) and kind (cross: another request's blocks; self: a resumed sequence's own).");
    for (int t = 0; t < SCHED_POOL__COUNT; t++)
        for (int k = 0; k < 2; k++)
            fprintf(f, "ringlm_prefix_cache_hits_total{tier=\"%s\",kind=\"%s\"} %llu\n",
                    sched_pool_name((sched_pool)t), k ? "self" : "cross",
                    (unsigned long long)(k ? s->prefix.hit_self[t] : s->prefix.hit_cross[t]));
    head(f, "ringlm_prefix_cache_demoted_blocks_total", "counter",
         "Cached blocks demoted into a tier (device → host → disk).");
    for (int t = SCHED_POOL_HOST; t < SCHED_POOL__COUNT; t++)
        fprintf(f, "ringlm_prefix_cache_demoted_blocks_total{tier=\"%s\"} %llu\n",
                sched_pool_name((sched_pool)t), (unsigned long long)s->prefix.demoted[t]);
    head(f, "ringlm_prefix_cache_reloaded_blocks_total", "counter",
         "Cached blocks reloaded from a tier to the device.");
    for (int t = SCHED_POOL_HOST; t < SCHED_POOL__COUNT; t++)
        fprintf(f, "ringlm_prefix_cache_reloaded_blocks_total{tier=\"%s\"} %llu\n",
                sched_pool_name((sched_pool)t), (unsigned long long)s->prefix.reloaded[t]);
    head(f, "ringlm_prefix_cache_ring_snapshots", "gauge",
         "Window-ring snapshots kept for prefix-cache hits (models with window rings).");
    fprintf(f, "ringlm_prefix_cache_ring_snapshots %llu\n",
            (unsigned long long)s->prefix.ring_snapshots);
    head(f, "ringlm_prefix_cache_ring_snapshot_bytes", "gauge",
         "Bytes of the window-ring snapshots kept.");
    fprintf(f, "ringlm_prefix_cache_ring_snapshot_bytes %llu\n",
            (unsigned long long)s->prefix.ring_snapshot_bytes);
    head(f, "ringlm_prefix_cache_ring_snapshots_total", "counter",
         "Window-ring snapshots taken, used by a prefix-cache hit, and dropped.");
    const uint64_t rs[3] = {s->prefix.ring_taken, s->prefix.ring_hits, s->prefix.ring_dropped};
    const char *rn[3] = {"taken", "hit", "dropped"};
    for (int k = 0; k < 3; k++)
        fprintf(f, "ringlm_prefix_cache_ring_snapshots_total{event=\"%s\"} %llu\n", rn[k],
                (unsigned long long)rs[k]);
}

/* ---- vLLM's metric set -------------------------------------------------------------- */

/* Every vllm:* family below is vLLM 0.11's PrometheusStatLogger (vllm/v1/metrics/loggers.py):
 * its name, type, HELP text, labels in its order (model_name, engine; then finished_reason or
 * le) and bounds. prometheus_client writes a counter's HELP and TYPE under the name with
 * _total, as here. ringlm runs one engine per daemon: engine="0". */

/* A bound as prometheus_client writes `le` (floatToGoString): Python's repr of the float,
 * "1.0" for one, "0.025", and past six integer digits Go's exponent form ("1e+06"). */
static void le_text(char *out, size_t cap, const vllm_bounds *b, unsigned i)
{
    uint64_t v = b->v[i];
    if (b->seconds && v % 1000000) {
        snprintf(out, cap, "%g", (double)v / 1e6);
        return;
    }
    uint64_t whole = b->seconds ? v / 1000000 : v;
    char d[24];
    int n = snprintf(d, sizeof d, "%llu", (unsigned long long)whole);
    if (n <= 6) {
        snprintf(out, cap, "%s.0", d);
        return;
    }
    int last = n - 1; /* the mantissa's digits after the first, trailing zeros dropped */
    while (last > 0 && d[last] == '0') last--;
    if (last == 0)
        snprintf(out, cap, "%ce+0%d", d[0], n - 1);
    else
        snprintf(out, cap, "%c.%.*se+0%d", d[0], last, d + 1, n - 1);
}

static void vlabels(FILE *f, const snap *s)
{
    put_label(f, "model_name", s->info.model_name, false);
    fputs_unlocked(",engine=\"0\"", f);
}

static void vgauge(FILE *f, const snap *s, const char *name, const char *help, double v)
{
    head(f, name, "gauge", help);
    fputs_unlocked(name, f);
    putc_unlocked('{', f);
    vlabels(f, s);
    fprintf(f, "} %.17g\n", v);
}

static void vcounter(FILE *f, const snap *s, const char *name, const char *help, uint64_t v)
{
    head(f, name, "counter", help);
    fputs_unlocked(name, f);
    putc_unlocked('{', f);
    vlabels(f, s);
    fprintf(f, "} %llu\n", (unsigned long long)v);
}

static void vhist(FILE *f, const metrics *m, const snap *s, enum vllm_hist h, const char *name,
                  const char *help)
{
    const vllm_bounds *b = &m->vbounds[h];
    const hist_v *x = &s->vllm.h[h];
    head(f, name, "histogram", help);
    uint64_t cum = 0;
    for (unsigned i = 0; i <= b->n; i++) {
        char le[32];
        if (i < b->n)
            le_text(le, sizeof le, b, i);
        else
            snprintf(le, sizeof le, "+Inf");
        cum += x->bucket[i];
        fprintf(f, "%s_bucket{", name);
        vlabels(f, s);
        fprintf(f, ",le=\"%s\"} %llu\n", le, (unsigned long long)cum);
    }
    fprintf(f, "%s_sum{", name);
    vlabels(f, s);
    if (b->seconds)
        fprintf(f, "} %.6f\n", (double)x->sum / 1e6);
    else
        fprintf(f, "} %llu\n", (unsigned long long)x->sum);
    fprintf(f, "%s_count{", name);
    vlabels(f, s);
    fprintf(f, "} %llu\n", (unsigned long long)x->count);
}

static const char *const vllm_finish_name[VF__COUNT] = {"stop", "length", "abort"};

static void render_vllm(FILE *f, const metrics *m, const snap *s)
{
    const vllm_stats *v = &s->vllm;
    vgauge(f, s, "vllm:num_requests_running", "Number of requests in model execution batches.",
           s->running);
    vgauge(f, s, "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
           s->waiting);
    vgauge(f, s, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
           s->kv_total[0] ? (double)s->kv_used[0] / (double)s->kv_total[0] : 0.0);
    vcounter(f, s, "vllm:prefix_cache_queries_total",
             "Prefix cache queries, in terms of number of queried tokens.", s->prefix.query_tokens);
    vcounter(f, s, "vllm:prefix_cache_hits_total",
             "Prefix cache hits, in terms of number of cached tokens.", s->prefix.hit_tokens);
    vcounter(f, s, "vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
             v->preemptions);
    vcounter(f, s, "vllm:prompt_tokens_total", "Number of prefill tokens processed.",
             v->prompt_tokens);
    vcounter(f, s, "vllm:generation_tokens_total", "Number of generation tokens processed.",
             v->generation_tokens);
    head(f, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
    for (int r = 0; r < VF__COUNT; r++) {
        fputs_unlocked("vllm:request_success_total{", f);
        vlabels(f, s);
        fprintf(f, ",finished_reason=\"%s\"} %llu\n", vllm_finish_name[r],
                (unsigned long long)v->success[r]);
    }
    vhist(f, m, s, VH_PROMPT_TOKENS, "vllm:request_prompt_tokens",
          "Number of prefill tokens processed.");
    vhist(f, m, s, VH_GEN_TOKENS, "vllm:request_generation_tokens",
          "Number of generation tokens processed.");
    vhist(f, m, s, VH_ITER_TOKENS, "vllm:iteration_tokens_total",
          "Histogram of number of tokens per engine_step.");
    vhist(f, m, s, VH_MAX_GEN_TOKENS, "vllm:request_max_num_generation_tokens",
          "Histogram of maximum number of requested generation tokens.");
    vhist(f, m, s, VH_PARAMS_N, "vllm:request_params_n", "Histogram of the n request parameter.");
    vhist(f, m, s, VH_PARAMS_MAX_TOK, "vllm:request_params_max_tokens",
          "Histogram of the max_tokens request parameter.");
    vhist(f, m, s, VH_TTFT, "vllm:time_to_first_token_seconds",
          "Histogram of time to first token in seconds.");
    vhist(f, m, s, VH_ITL, "vllm:time_per_output_token_seconds",
          "Histogram of time per output token in seconds.DEPRECATED: Use "
          "vllm:inter_token_latency_seconds instead.");
    vhist(f, m, s, VH_ITL, "vllm:inter_token_latency_seconds",
          "Histogram of inter-token latency in seconds.");
    vhist(f, m, s, VH_E2E, "vllm:e2e_request_latency_seconds",
          "Histogram of e2e request latency in seconds.");
    vhist(f, m, s, VH_QUEUE, "vllm:request_queue_time_seconds",
          "Histogram of time spent in WAITING phase for request.");
    vhist(f, m, s, VH_INFERENCE, "vllm:request_inference_time_seconds",
          "Histogram of time spent in RUNNING phase for request.");
    vhist(f, m, s, VH_PREFILL, "vllm:request_prefill_time_seconds",
          "Histogram of time spent in PREFILL phase for request.");
    vhist(f, m, s, VH_DECODE, "vllm:request_decode_time_seconds",
          "Histogram of time spent in DECODE phase for request.");
    /* vLLM's LoRA gauge, which the Inference Extension's endpoint picker reads to route by
     * adapter: no adapters here, so max_lora 0 and both adapter lists empty; its value is,
     * as vLLM's (set_to_current_time at each stats record), the wall time of the snapshot. */
    head(f, "vllm:lora_requests_info", "gauge", "Running stats on lora requests.");
    fprintf(f,
            "vllm:lora_requests_info{max_lora=\"0\",waiting_lora_adapters=\"\","
            "running_lora_adapters=\"\"} %.6f\n",
            s->published_wall_s);
    /* vLLM's cache configuration gauge (value 1, the configuration in its labels; Python's
     * True/False as vLLM renders them), with the disk tier ringlm adds */
    head(f, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    fprintf(f,
            "vllm:cache_config_info{block_size=\"%u\",enable_prefix_caching=\"%s\",num_gpu_blocks="
            "\"%llu\",num_cpu_blocks=\"%llu\",num_disk_blocks=\"%llu\",engine=\"0\"} 1\n",
            s->info.kv_block_size, s->info.prefix_cache ? "True" : "False",
            (unsigned long long)s->kv_total[SCHED_POOL_DEVICE],
            (unsigned long long)s->kv_total[SCHED_POOL_HOST],
            (unsigned long long)s->kv_total[SCHED_POOL_DISK]);
}

int metrics_render(metrics *m, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    pthread_mutex_lock(&m->read_mu);
    if (atomic_load_explicit(&m->middle, memory_order_acquire) & FRESH)
        m->front = atomic_exchange_explicit(&m->middle, m->front, memory_order_acq_rel) & 3u;
    const snap *s = m->buf[m->front];
    pthread_once(&lat_le_once, lat_le_init);
    tc_cache cache;
    tc_cache_build(&cache, s);
    /* Into one buffer sized from the last scrape (fmemopen): a growing open_memstream
     * spent most of a scrape in realloc, memset and page faults. Too small → retry with
     * twice the room (only when the series grew). */
    size_t cap = m->render_cap ? m->render_cap : 64 * 1024;
    char *buf = NULL;
    long n = 0;
    int rc = 0;
    for (;;) {
        buf = malloc(cap + 1);
        FILE *f = buf ? fmemopen(buf, cap + 1, "w") : NULL;
        if (!f) {
            rc = seterr(-ENOMEM, "metrics: no memory for a %zu-byte exposition", cap);
            break;
        }
        cur_tc = &cache;
        flockfile(f);
        render(f, m, s);
        funlockfile(f);
        cur_tc = NULL;
        fflush(f);
        n = ftell(f);
        bool full = ferror(f) || n < 0 || (size_t)n >= cap;
        fclose(f);
        if (!full) break;
        free(buf);
        buf = NULL;
        if (cap > ((size_t)64 << 20)) {
            rc = seterr(-ENOMEM, "metrics: exposition larger than 64 MiB");
            break;
        }
        cap *= 2;
    }
    if (rc == 0) m->render_cap = (size_t)n + (size_t)n / 4 + 4096;
    tc_cache_free(&cache, s);
    pthread_mutex_unlock(&m->read_mu);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[n] = 0;
    *out = buf;
    *len = (size_t)n;
    return 0;
}
