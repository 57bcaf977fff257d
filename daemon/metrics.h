/* SPDX-License-Identifier: MIT */
/*
 * daemon/metrics.h — Prometheus text exposition on /metrics (DESIGN.md §9).
 *
 * Two sides, two threads:
 *   - the loop thread owns the live counters and updates them with plain stores through the
 *     metrics_* calls below (no atomics, no locks: one writer), then calls metrics_publish()
 *     once per iteration. Publishing copies the live counters into a spare snapshot and
 *     swaps it in with one atomic exchange (a triple buffer), at most every
 *     publish_interval_us; between those it is a clock compare, so the loop's cost per
 *     iteration is a few nanoseconds plus, a few times per second, one memcpy of the
 *     counters (tens of KiB);
 *   - the HTTP thread (libmicrohttpd, its own thread) takes the newest snapshot with one
 *     atomic exchange and renders it. It never touches the live counters, so a slow scraper
 *     can never stall the loop.
 *
 * Series: per (tenant, class) — queue wait, TTFT, TPOT, end-to-end histograms (seconds),
 * prompt/generated tokens, requests finished by reason, preemptions by mode and reason,
 * rejects by reason, cancels, timeouts, queue depth (waiting/running); per KV tier
 * (device, host, disk) — blocks used/free; per tier and direction — transfer bandwidth and
 * bytes; loop iteration time histogram; an info gauge (version, policy hash, model hash);
 * and vLLM's own metric set, so that what fleet routers, dashboards and autoscaling rules
 * built for vLLM read means the same here: the names, types, labels (model_name = the served
 * model name, engine = "0") and bucket bounds of vLLM 0.11's PrometheusStatLogger
 * (vllm/v1/metrics/loggers.py) — the request gauges (vllm:num_requests_waiting/_running),
 * vllm:kv_cache_usage_perc (device tier, 0..1: blocks sequences hold; cached blocks none
 * holds count free, as in vLLM), the prefix cache's counters, the token and preemption
 * counters, vllm:request_success_total{finished_reason}, the latency histograms (TTFT,
 * inter-token latency and its older name time_per_output_token, e2e, queue, prefill, decode,
 * inference), the per-request token histograms, vllm:iteration_tokens_total,
 * vllm:cache_config_info and vllm:lora_requests_info (no adapters: its empty form). Those
 * are engine-wide, as vLLM's are; the ringlm_* series keep what vLLM has no name for
 * (tenants, classes, tiers, rejects by cause). The vLLM calls below take numbers and enums
 * only: the loop never compares a string to record one.
 *
 * Thread-safety: every function except metrics_port(), metrics_render() and
 * metrics_destroy() must be called from one thread (the loop thread). metrics_render()
 * may be called from any thread (it reads the newest published snapshot).
 *
 * Errors: 0 or a negative errno; metrics_errmsg() has a thread-local detail string.
 */
#ifndef RINGLM_DAEMON_METRICS_H
#define RINGLM_DAEMON_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/kvtier.h"
#include "sched/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Limits: a tenant or class label keeps its first MAX-1 distinct values; later ones are
 * folded into the value "other" (counted, never dropped), so a misbehaving label source can
 * not make the exposition grow without bound.  Reasons are not strings here: each counter
 * by reason is an array indexed by the scheduler's enum (sched_end_code, sched_reject_reason,
 * sched_defer_reason), and the names of the label reason="…" exist only where the exposition
 * is written (metrics_render.c).  A value outside its enum (a caller's bug) is counted under
 * reason="invalid", never under a real reason. */
#define METRICS_MAX_TENANTS 32
#define METRICS_MAX_CLASSES 8
#define METRICS_LABEL_MAX   48 /* bytes per label value, longer ones are truncated */

/* KV tiers are the scheduler's pools (sched_pool; label tier="device|host|disk", named by
 * sched_pool_name) and transfer directions its sched_xfer_dir (label dir="out|in": out =
 * device → tier, in = tier → device). */
/* Latency histograms per (tenant, class). */
enum metrics_hist {
    METRICS_H_QUEUE_WAIT = 0, /* arrival → first scheduled (ringlm_queue_wait_seconds) */
    METRICS_H_TTFT,           /* arrival → first token (ringlm_time_to_first_token_seconds) */
    METRICS_H_TPOT, /* per output token after the first (ringlm_time_per_output_token_seconds) */
    METRICS_H_E2E,  /* arrival → finish (ringlm_e2e_request_latency_seconds) */
    METRICS_N_HIST
};
/* Preemption modes (label mode="swap|recompute"). */
enum metrics_mode { METRICS_MODE_SWAP = 0, METRICS_MODE_RECOMPUTE, METRICS_N_MODES };

typedef struct metrics_config {
    /* "ADDR:PORT", "PORT" or ":PORT" (loopback 127.0.0.1 when ADDR is omitted; "[::1]:P"
     * for IPv6). PORT 0 = an ephemeral port, see metrics_port(). NULL = no HTTP server
     * (the counters still work and metrics_render() still renders). */
    const char *listen;
    const char *version;          /* build version (NULL: RINGLM_VERSION or "unknown") */
    const char *policy_hash;      /* NULL: "" */
    const char *policy_name;      /* NULL: "" (e.g. the policy file's basename) */
    const char *model_hash;       /* NULL: "" */
    const char *model_name;       /* the served model name: vLLM's label model_name (NULL: "") */
    const char *model_path;       /* the model file, ringlm_info's label model (NULL: "") */
    uint32_t max_model_len;       /* context length: the bounds of vLLM's token histograms */
    const char *backend;          /* NULL: "" */
    uint32_t kv_block_size;       /* tokens per KV block (vllm:cache_config_info) */
    bool prefix_cache;            /* prefix caching on (vllm:cache_config_info) */
    uint64_t publish_interval_us; /* 0: 100 ms */
} metrics_config;

typedef struct metrics metrics;

/* ---- lifecycle ---------------------------------------------------------------------- */

/*
 * Creates the counters and, when cfg->listen is set, starts the HTTP server thread.
 * Errors: -EINVAL (bad listen address: the detail names it), -EADDRINUSE / -EACCES (bind),
 * -ENOMEM.
 */
int metrics_create(const metrics_config *cfg, metrics **out);
/* Whether metrics_create could listen on spec ([ADDR:]PORT), without keeping it: ringlmd
 * asks before it loads a model, so a port in use is reported at once. 0, or the errors of
 * metrics_create's bind (-EINVAL, -EADDRINUSE, -EACCES) with metrics_errmsg(). */
int metrics_check_listen(const char *spec);
/* The TCP port the server is bound to (the real one when 0 was asked), or 0 without one. */
int metrics_port(const metrics *m);
/* Stops the server thread (waits for a scrape in progress) and frees everything. NULL ok. */
void metrics_destroy(metrics *m);
const char *metrics_errmsg(void);

/* Replaces the info labels (e.g. after a policy reload). NULL keeps the current value. */
void metrics_set_info(metrics *m, const char *policy_hash, const char *model_hash);

/* ---- labels ------------------------------------------------------------------------- */

/*
 * Label values are interned once, when a tenant or class is first seen (the runner keeps
 * the id per tenant slot and per class), never per request: these compare strings.
 * Returns the label id (>= 0); NULL or "" becomes "". Never fails: past
 * METRICS_MAX_TENANTS / _CLASSES the value "other" is used.
 */
int metrics_tenant_label(metrics *m, const char *tenant);
int metrics_class_label(metrics *m, const char *class_name);

/* The series id (>= 0) of (tenant label, class label), created on first use: a table
 * lookup, no strings. An id out of range counts under ("other", "other"). */
int metrics_series(metrics *m, int tenant_label, int class_label);

/* ---- per-request events (series = metrics_series()) --------------------------------- */

void metrics_observe(metrics *m, int series, enum metrics_hist h, uint64_t us);
void metrics_add_tokens(metrics *m, int series, uint64_t prompt_tokens, uint64_t generated_tokens);
/* A request ended with finish reason `finish` (SCHED_END_LENGTH … SCHED_END_ERROR, as in
 * FORMATS.md finish_reason) → ringlm_requests_finished_total{reason}. The cancel, timeout
 * and reject counters are separate calls (the daemon feeds them from decision events). */
void metrics_count_finish(metrics *m, int series, sched_end_code finish);
/* A reject (the scheduler's, or the daemon's own before the scheduler saw the request). */
void metrics_count_reject(metrics *m, int series, sched_reject_reason reason);
/* A preemption in `mode`, made for `reason` (the event's defer: blocks or quota); it counts
 * in vllm:num_preemptions_total too. */
void metrics_count_preempt(metrics *m, int series, enum metrics_mode mode,
                           sched_defer_reason reason);
void metrics_count_cancel(metrics *m, int series);
void metrics_count_timeout(metrics *m, int series);
/* Deferrals (sched "defer" events) by reason: budget, blocks, quota, output_backpressure… */
void metrics_count_defer(metrics *m, int series, sched_defer_reason reason);
/* Queue depth of one series (waiting = queued, not yet running; running = has KV). */
void metrics_set_series_queue(metrics *m, int series, uint32_t waiting, uint32_t running);

/* ---- vLLM's request series (engine-wide: numbers only, no label is looked up) ------- */

/* A request's first token: vllm:time_to_first_token_seconds and, as vLLM counts a prompt
 * when its prefill completes, vllm:prompt_tokens_total. */
void metrics_observe_first_token(metrics *m, uint32_t prompt_tokens, uint64_t ttft_us);
/* Each later token, with the time since the one before it:
 * vllm:inter_token_latency_seconds (and time_per_output_token_seconds, its older name);
 * every token, the first included, counts in vllm:generation_tokens_total. */
void metrics_observe_next_token(metrics *m, uint64_t itl_us);
/* A request that was admitted has ended (a rejected one is not a vLLM request: it is never
 * given to this call). Times are the daemon's clock in µs, 0 = never reached: queue time
 * needs scheduled_us, prefill and inference time need first_token_us too, decode time
 * needs first_token_us; e2e, the token histograms and request_success always count.
 * finish maps to vLLM's finished_reason: length → "length", stop → "stop", anything else
 * (cancelled, timeout, error) → "abort". */
typedef struct metrics_request_end {
    sched_end_code finish;
    uint32_t prompt_tokens, generation_tokens, max_tokens;
    uint64_t arrival_us, scheduled_us, first_token_us, last_token_us, finish_us;
} metrics_request_end;
void metrics_observe_request_end(metrics *m, const metrics_request_end *e);

/* ---- engine / pool state ------------------------------------------------------------ */

/* Totals across tenants (also the vllm:num_requests_* gauges). */
void metrics_set_queue(metrics *m, uint32_t waiting, uint32_t running);
/* KV blocks of a tier; total 0 = tier not configured (its series are omitted). */
void metrics_set_kv(metrics *m, sched_pool tier, uint64_t used, uint64_t total);
/* Prefix cache totals (sched_counts): prompt tokens looked up and found cached at admission,
 * and device blocks cached that no sequence holds. */
/* The prefix cache (sched_counts): prompt tokens looked up and found cached; per tier the
 * cached blocks no sequence holds, the hit tokens found there across requests and a resumed
 * sequence's own (self), the blocks demoted into it and reloaded from it. */
typedef struct metrics_prefix {
    uint64_t query_tokens, hit_tokens;
    uint64_t unheld[SCHED_POOL__COUNT];
    uint64_t hit_cross[SCHED_POOL__COUNT], hit_self[SCHED_POOL__COUNT];
    uint64_t demoted[SCHED_POOL__COUNT], reloaded[SCHED_POOL__COUNT];
    /* ring snapshots (window rings): held and their bytes; taken, used by a hit, dropped */
    uint64_t ring_snapshots, ring_snapshot_bytes;
    uint64_t ring_taken, ring_hits, ring_dropped;
} metrics_prefix;
void metrics_set_prefix(metrics *m, const metrics_prefix *p);
/* One loop iteration: its duration and the tokens it executed (0 for an idle wake; a
 * non-zero count is one observation of vllm:iteration_tokens_total). */
void metrics_observe_iteration(metrics *m, uint64_t us, uint32_t batch_tokens);
/* One finished transfer between the device pool and a tier (exact counters). */
void metrics_observe_transfer(metrics *m, sched_pool tier, sched_xfer_dir dir, uint64_t bytes,
                              uint64_t us);
/* A read back from a tier whose blocks were not used (kvtier: checksum, short read, I/O
 * error): the sequence recomputes them, or its request ends with an error. */
void metrics_observe_tier_read_failure(metrics *m, sched_pool tier, kvtier_read_failure why);
/* The bandwidth gauge of a tier and direction: the estimate the scheduler plans with
 * (sched_get_tier_cost), set by the daemon once a transfer there was measured. */
void metrics_set_transfer_bw(metrics *m, sched_pool tier, sched_xfer_dir dir, double bytes_per_s);
/* KV-cache events (kvevents.h) dropped because the publisher's ring was full, and the
 * resynchronisations (AllBlocksCleared and the whole index) sent after such drops. */
void metrics_set_kv_events(metrics *m, uint64_t dropped, uint64_t resyncs);
/* Decision/request log lines dropped because the writer fell behind (from declog). */
void metrics_set_log_dropped(metrics *m, uint64_t decision_lines, uint64_t request_lines);

/* ---- publishing and rendering ------------------------------------------------------- */

/*
 * Makes the live counters visible to scrapers when publish_interval_us has passed since
 * the last publish (now_us from the loop's clock), or always when force is non-zero.
 * Cheap; call once per iteration.
 */
void metrics_publish(metrics *m, uint64_t now_us, int force);

/*
 * Renders the newest published snapshot in the Prometheus text format (version 0.0.4)
 * into a malloc()ed NUL-terminated buffer (*out, length *len); free() it. Any thread.
 * Errors: -ENOMEM.
 */
int metrics_render(metrics *m, char **out, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
