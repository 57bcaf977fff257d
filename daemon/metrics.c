/* SPDX-License-Identifier: MIT */
/*
 * daemon/metrics.c — the counters owned by the loop thread (series, labels, gauges) and the
 * triple buffer that publishes them; metrics_render.c renders a published snapshot in the
 * Prometheus text format 0.0.4 and metrics_http.c serves it (metrics_internal.h).
 */
#include "daemon/metrics_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef RINGLM_VERSION
#define RINGLM_VERSION "unknown"
#endif

/* ---- errors ------------------------------------------------------------------------- */

_Thread_local errdetail metrics__err;

const char *metrics_errmsg(void)
{
    return metrics__err.msg;
}

/* ---- buckets ------------------------------------------------------------------------ */

/* Request latencies: 0.5 ms to 2 min. A tiny model's TPOT sits in the low buckets, an 8B
 * model's TTFT under load in the high ones; one set serves both. */
const uint64_t metrics__lat_bounds_us[N_LAT] = {
    500,    1000,    2500,    5000,    10000,    25000,    50000,    100000,   250000,
    500000, 1000000, 2500000, 5000000, 10000000, 20000000, 30000000, 60000000, 120000000,
};
/* Loop iterations: 10 µs to 1 s. */
const uint64_t metrics__iter_bounds_us[N_ITER] = {
    10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000,
};

/* vLLM's bounds (vLLM 0.11, vllm/v1/metrics/loggers.py, PrometheusStatLogger), in µs. */
static const uint64_t vllm_ttft_us[] = {
    1000,     5000,     10000,    20000,     40000,     60000,      80000,   100000,
    250000,   500000,   750000,   1000000,   2500000,   5000000,    7500000, 10000000,
    20000000, 40000000, 80000000, 160000000, 640000000, 2560000000,
};
static const uint64_t vllm_itl_us[] = {
    10000,  25000,   50000,   75000,   100000,  150000,   200000,   300000,   400000,   500000,
    750000, 1000000, 2500000, 5000000, 7500000, 10000000, 20000000, 40000000, 80000000,
};
static const uint64_t vllm_request_us[] = {
    300000,   500000,    800000,    1000000,   1500000,   2000000,    2500000,
    5000000,  10000000,  15000000,  20000000,  30000000,  40000000,   50000000,
    60000000, 120000000, 240000000, 480000000, 960000000, 1920000000, 7680000000,
};
static const uint64_t vllm_iteration_tokens[] = {1,   8,    16,   32,   64,   128,  256,
                                                 512, 1024, 2048, 4096, 8192, 16384};
static const uint64_t vllm_params_n[] = {1, 2, 5, 10, 20};

static void bounds_set(vllm_bounds *b, bool seconds, const uint64_t *v, unsigned n)
{
    b->seconds = seconds;
    b->n = n;
    memcpy(b->v, v, n * sizeof *v);
}

/* vLLM's build_1_2_5_buckets(max_model_len): 1, 2, 5, 10, 20, 50, ... while <= max. */
static void bounds_1_2_5(vllm_bounds *b, uint64_t max_value)
{
    static const uint64_t mantissa[3] = {1, 2, 5};
    b->seconds = false;
    b->n = 0;
    for (uint64_t p = 1; b->n < VH_MAX_BOUNDS; p *= 10)
        for (int i = 0; i < 3; i++) {
            if (mantissa[i] * p > max_value || b->n >= VH_MAX_BOUNDS) return;
            b->v[b->n++] = mantissa[i] * p;
        }
}

static void vllm_bounds_init(vllm_bounds *vb, uint32_t max_model_len)
{
#define N_OF(a) (unsigned)(sizeof(a) / sizeof(a)[0])
    bounds_set(&vb[VH_TTFT], true, vllm_ttft_us, N_OF(vllm_ttft_us));
    bounds_set(&vb[VH_ITL], true, vllm_itl_us, N_OF(vllm_itl_us));
    for (int h = VH_E2E; h <= VH_DECODE; h++)
        bounds_set(&vb[h], true, vllm_request_us, N_OF(vllm_request_us));
    for (int h = VH_PROMPT_TOKENS; h <= VH_MAX_GEN_TOKENS; h++) bounds_1_2_5(&vb[h], max_model_len);
    bounds_1_2_5(&vb[VH_PARAMS_MAX_TOK], max_model_len);
    bounds_set(&vb[VH_PARAMS_N], false, vllm_params_n, N_OF(vllm_params_n));
    bounds_set(&vb[VH_ITER_TOKENS], false, vllm_iteration_tokens, N_OF(vllm_iteration_tokens));
#undef N_OF
}

static unsigned bucket_of(const uint64_t *bounds, unsigned n, uint64_t v)
{
    /* Prometheus buckets are "less or equal": v lands in the first bound >= v. */
    unsigned lo = 0, hi = n;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (v <= bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static void vobserve(metrics *m, enum vllm_hist h, uint64_t v)
{
    const vllm_bounds *b = &m->vbounds[h];
    hist_v *x = &m->live.vllm.h[h];
    x->bucket[bucket_of(b->v, b->n, v)]++;
    x->count++;
    x->sum += v;
}

/* ---- lifecycle ---------------------------------------------------------------------- */

static void copy_label(char *dst, size_t cap, const char *src)
{
    if (!src) src = "";
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    /* Do not cut a UTF-8 sequence in half: step back over continuation bytes. */
    while (n > 0 && n < strlen(src) && ((unsigned char)src[n] & 0xC0) == 0x80) n--;
    memcpy(dst, src, n);
    dst[n] = 0;
}

int metrics_create(const metrics_config *cfg, metrics **out)
{
    static const metrics_config defaults = {0};
    if (!cfg) cfg = &defaults;
    *out = NULL;
    int rc = -ENOMEM;
    metrics *m = calloc(1, sizeof *m);
    if (!m) return seterr(-ENOMEM, "metrics: out of memory");
    for (int i = 0; i < 3; i++)
        if (!(m->buf[i] = calloc(1, sizeof(snap)))) goto fail;
    m->listen_fd = -1;
    memset(m->series_of, 0xff, sizeof m->series_of);
    m->publish_interval_us = cfg->publish_interval_us ? cfg->publish_interval_us : 100000;
    info_labels *in = &m->live.info;
    copy_label(in->version, sizeof in->version, cfg->version ? cfg->version : RINGLM_VERSION);
    copy_label(in->policy_hash, sizeof in->policy_hash, cfg->policy_hash);
    copy_label(in->policy_name, sizeof in->policy_name, cfg->policy_name);
    copy_label(in->model_hash, sizeof in->model_hash, cfg->model_hash);
    copy_label(in->model_name, sizeof in->model_name, cfg->model_name);
    copy_label(in->model_path, sizeof in->model_path, cfg->model_path);
    vllm_bounds_init(m->vbounds, cfg->max_model_len);
    copy_label(in->backend, sizeof in->backend, cfg->backend);
    in->kv_block_size = cfg->kv_block_size;
    in->prefix_cache = cfg->prefix_cache;
    pthread_mutex_init(&m->read_mu, NULL);
    pthread_mutex_init(&m->guard_mu, NULL);
    pthread_cond_init(&m->guard_cv, NULL);
    m->back = 0;
    m->front = 1;
    atomic_store(&m->middle, 2u);
    metrics_publish(m, 0, 1);
    if (cfg->listen && *cfg->listen) {
        rc = metrics__http_start(m, cfg->listen);
        if (rc < 0) goto fail_mu;
    }
    *out = m;
    return 0;
fail_mu:
    pthread_mutex_destroy(&m->read_mu);
fail:
    for (int i = 0; i < 3; i++) free(m->buf[i]);
    free(m);
    return rc == -ENOMEM ? seterr(-ENOMEM, "metrics: out of memory") : rc;
}

int metrics_port(const metrics *m)
{
    return m ? m->port : 0;
}

void metrics_destroy(metrics *m)
{
    if (!m) return;
    metrics__http_stop(m);
    pthread_mutex_destroy(&m->read_mu);
    pthread_mutex_destroy(&m->guard_mu);
    pthread_cond_destroy(&m->guard_cv);
    for (int i = 0; i < 3; i++) free(m->buf[i]);
    free(m);
}

void metrics_set_info(metrics *m, const char *policy_hash, const char *model_hash)
{
    info_labels *in = &m->live.info;
    if (policy_hash) copy_label(in->policy_hash, sizeof in->policy_hash, policy_hash);
    if (model_hash) copy_label(in->model_hash, sizeof in->model_hash, model_hash);
}

/* ---- labels ------------------------------------------------------------------------- */

static int intern(char (*names)[METRICS_LABEL_MAX], int *n, int max, const char *name, int overflow)
{
    if (!name) name = "";
    for (int i = 0; i < *n; i++)
        if (strncmp(names[i], name, METRICS_LABEL_MAX - 1) == 0) return i;
    if (*n >= max) return overflow;
    copy_label(names[*n], METRICS_LABEL_MAX, name);
    return (*n)++;
}

static int intern_overflow(char (*names)[METRICS_LABEL_MAX], int *n, int max, const char *name)
{
    /* The last slot is kept for "other", so a flood of names still lands somewhere. */
    int i = intern(names, n, max - 1, name, -1);
    if (i >= 0) return i;
    for (int j = 0; j < *n; j++)
        if (strcmp(names[j], "other") == 0) return j;
    copy_label(names[*n], METRICS_LABEL_MAX, "other");
    return (*n)++;
}

int metrics_tenant_label(metrics *m, const char *tenant)
{
    snap *s = &m->live;
    return intern_overflow(s->tenants, &s->n_tenants, METRICS_MAX_TENANTS, tenant);
}

int metrics_class_label(metrics *m, const char *class_name)
{
    snap *s = &m->live;
    return intern_overflow(s->classes, &s->n_classes, METRICS_MAX_CLASSES, class_name);
}

int metrics_series(metrics *m, int t, int c)
{
    snap *s = &m->live;
    if (t < 0 || t >= s->n_tenants) t = metrics_tenant_label(m, "other");
    if (c < 0 || c >= s->n_classes) c = metrics_class_label(m, "other");
    int id = m->series_of[t][c];
    if (id >= 0) return id;
    id = s->n_series++;
    memset(&s->series[id], 0, sizeof s->series[id]);
    s->series[id].tenant = (uint16_t)t;
    s->series[id].cls = (uint16_t)c;
    m->series_of[t][c] = (int16_t)id;
    return id;
}

static series_stats *ser(metrics *m, int series)
{
    /* A bad id is the caller's bug; count it under a real series rather than scribble. */
    if (series < 0 || series >= m->live.n_series) series = metrics_series(m, -1, -1);
    return &m->live.series[series];
}

/* ---- per-request events ------------------------------------------------------------- */

void metrics_observe(metrics *m, int series, enum metrics_hist h, uint64_t us)
{
    if ((unsigned)h >= METRICS_N_HIST) return;
    hist_lat *x = &ser(m, series)->h[h];
    x->bucket[bucket_of(metrics__lat_bounds_us, N_LAT, us)]++;
    x->count++;
    x->sum_us += us;
}

void metrics_add_tokens(metrics *m, int series, uint64_t prompt_tokens, uint64_t generated_tokens)
{
    series_stats *s = ser(m, series);
    s->prompt_tokens += prompt_tokens;
    s->generated_tokens += generated_tokens;
}

void metrics_count_finish(metrics *m, int series, sched_end_code finish)
{
    /* NONE is no finish reason: it lands in the invalid slot with everything past ERROR. */
    unsigned f = finish == SCHED_END_NONE ? N_FINISH : (unsigned)finish;
    ser(m, series)->finish[reason_slot(f, N_FINISH)]++;
}

void metrics_count_reject(metrics *m, int series, sched_reject_reason reason)
{
    ser(m, series)->reject[reason_slot((unsigned)reason, N_REJECT)]++;
}

void metrics_count_preempt(metrics *m, int series, enum metrics_mode mode,
                           sched_defer_reason reason)
{
    if ((unsigned)mode >= METRICS_N_MODES) return;
    ser(m, series)->preempt[mode][reason_slot((unsigned)reason, N_DEFER)]++;
    m->live.vllm.preemptions++;
}

void metrics_count_cancel(metrics *m, int series)
{
    ser(m, series)->cancels++;
}
void metrics_count_timeout(metrics *m, int series)
{
    ser(m, series)->timeouts++;
}

void metrics_count_defer(metrics *m, int series, sched_defer_reason reason)
{
    ser(m, series)->defer[reason_slot((unsigned)reason, N_DEFER)]++;
}

void metrics_set_series_queue(metrics *m, int series, uint32_t waiting, uint32_t running)
{
    series_stats *s = ser(m, series);
    s->waiting = waiting;
    s->running = running;
}

/* ---- vLLM's request series ---------------------------------------------------------- */

void metrics_observe_first_token(metrics *m, uint32_t prompt_tokens, uint64_t ttft_us)
{
    vobserve(m, VH_TTFT, ttft_us);
    m->live.vllm.prompt_tokens += prompt_tokens;
    m->live.vllm.generation_tokens++;
}

void metrics_observe_next_token(metrics *m, uint64_t itl_us)
{
    vobserve(m, VH_ITL, itl_us);
    m->live.vllm.generation_tokens++;
}

void metrics_observe_request_end(metrics *m, const metrics_request_end *e)
{
    vllm_stats *v = &m->live.vllm;
    v->success[e->finish == SCHED_END_LENGTH ? VF_LENGTH
               : e->finish == SCHED_END_STOP ? VF_STOP
                                             : VF_ABORT]++;
    vobserve(m, VH_E2E, e->finish_us > e->arrival_us ? e->finish_us - e->arrival_us : 0);
    vobserve(m, VH_PROMPT_TOKENS, e->prompt_tokens);
    vobserve(m, VH_GEN_TOKENS, e->generation_tokens);
    /* one sequence per wire request (the gateway fans n out): n = 1, and the most tokens
     * any of its sequences may generate is its own max_tokens */
    vobserve(m, VH_MAX_GEN_TOKENS, e->max_tokens);
    vobserve(m, VH_PARAMS_N, 1);
    if (e->max_tokens) vobserve(m, VH_PARAMS_MAX_TOK, e->max_tokens);
    if (e->scheduled_us) {
        vobserve(m, VH_QUEUE,
                 e->scheduled_us > e->arrival_us ? e->scheduled_us - e->arrival_us : 0);
        if (e->first_token_us) {
            uint64_t last = e->last_token_us ? e->last_token_us : e->first_token_us;
            vobserve(m, VH_PREFILL,
                     e->first_token_us > e->scheduled_us ? e->first_token_us - e->scheduled_us : 0);
            vobserve(m, VH_INFERENCE, last > e->scheduled_us ? last - e->scheduled_us : 0);
        }
    }
    if (e->first_token_us) {
        uint64_t last = e->last_token_us ? e->last_token_us : e->first_token_us;
        vobserve(m, VH_DECODE, last - e->first_token_us);
    }
}

/* ---- engine / pool state ------------------------------------------------------------ */

void metrics_set_queue(metrics *m, uint32_t waiting, uint32_t running)
{
    m->live.waiting = waiting;
    m->live.running = running;
}

void metrics_set_kv(metrics *m, sched_pool tier, uint64_t used, uint64_t total)
{
    if ((unsigned)tier >= SCHED_POOL__COUNT) return;
    m->live.kv_used[tier] = used;
    m->live.kv_total[tier] = total;
}

void metrics_set_prefix(metrics *m, const metrics_prefix *p)
{
    m->live.prefix = *p;
}

void metrics_observe_iteration(metrics *m, uint64_t us, uint32_t batch_tokens)
{
    hist_iter *x = &m->live.iter;
    x->bucket[bucket_of(metrics__iter_bounds_us, N_ITER, us)]++;
    x->count++;
    x->sum_us += us;
    m->live.iter_tokens += batch_tokens;
    if (batch_tokens) vobserve(m, VH_ITER_TOKENS, batch_tokens);
}

void metrics_observe_transfer(metrics *m, sched_pool tier, sched_xfer_dir dir, uint64_t bytes,
                              uint64_t us)
{
    if ((unsigned)tier >= SCHED_POOL__COUNT || (unsigned)dir >= N_DIRS) return;
    snap *s = &m->live;
    (void)us;
    s->xfer_bytes[tier][dir] += bytes;
    s->xfers[tier][dir]++;
}

void metrics_observe_tier_read_failure(metrics *m, sched_pool tier, kvtier_read_failure why)
{
    if ((unsigned)tier >= SCHED_POOL__COUNT || (unsigned)why >= KVTIER_READ__COUNT) return;
    m->live.tier_read_failures[tier][why]++;
}

void metrics_set_transfer_bw(metrics *m, sched_pool tier, sched_xfer_dir dir, double bytes_per_s)
{
    if ((unsigned)tier >= SCHED_POOL__COUNT || (unsigned)dir >= N_DIRS) return;
    m->live.bw_bytes_per_s[tier][dir] = bytes_per_s;
}

void metrics_set_kv_events(metrics *m, uint64_t dropped, uint64_t resyncs)
{
    m->live.kv_events_on = true;
    m->live.kv_events_dropped = dropped;
    m->live.kv_events_resyncs = resyncs;
}

void metrics_set_log_dropped(metrics *m, uint64_t decision_lines, uint64_t request_lines)
{
    m->live.log_dropped[0] = decision_lines;
    m->live.log_dropped[1] = request_lines;
}

/* ---- publishing --------------------------------------------------------------------- */

void metrics_publish(metrics *m, uint64_t now_us, int force)
{
    if (!force && m->published_once && now_us - m->last_publish_us < m->publish_interval_us) return;
    m->last_publish_us = now_us;
    m->published_once = true;
    snap *dst = m->buf[m->back];
    m->live.generation++;
    /* vLLM sets its LoRA gauge to the time of each stats record; a snapshot is ours */
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    m->live.published_wall_s = (double)wall.tv_sec + (double)wall.tv_nsec / 1e9;
    memcpy(dst, &m->live, SNAP_HEAD_BYTES + (size_t)m->live.n_series * sizeof(series_stats));
    /* Release: the reader that sees FRESH sees the copy. */
    unsigned prev = atomic_exchange_explicit(&m->middle, m->back | FRESH, memory_order_acq_rel);
    m->back = prev & 3u;
}
