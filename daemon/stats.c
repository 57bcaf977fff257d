/* SPDX-License-Identifier: MIT */
/*
 * daemon/stats.c — what the runner shows of itself: the --stats-file JSON snapshot
 * (rewritten through a temporary file and a rename, so a reader never sees half of one),
 * the metrics gauges (queues, KV pools, per-series queue depths, iteration timing, log
 * drops) and the --iteration-log lines.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/service_internal.h"

int stats_init(svc *s)
{
    s->max_series_seen = -1;
    s->series_waiting = calloc(SVC_MAX_SERIES, sizeof(uint32_t));
    s->series_running = calloc(SVC_MAX_SERIES, sizeof(uint32_t));
    return s->series_waiting && s->series_running ? 0 : -ENOMEM;
}

void stats_free(svc *s)
{
    free(s->series_waiting);
    free(s->series_running);
    s->series_waiting = s->series_running = NULL;
}

void stats_write(svc *s)
{
    if (!s->cfg.stats_file) return;
    sched_counts c;
    memset(&c, 0, sizeof c);
    sched_get_counts(s->sched, &c);
    /* The scheduler's full check walks every block and request (O(total state): at 256
     * running and 10,000 waiting it costs several steps); a production stats file is
     * rewritten every 20 ms and must not pay it on the loop thread. --check-invariants
     * (tests, debugging) turns it on. */
    char why[256] = "";
    const char *invariants = "unchecked";
    if (s->cfg.check_invariants)
        invariants = sched_check_invariants(s->sched, why, sizeof why) == 0 ? "ok"
                     : why[0] ? why : "violated";
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", s->cfg.stats_file);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "{\"t_us\":%llu,\"iterations\":%llu,\"sessions\":%d,\"live_requests\":%llu,"
               "\"waiting\":%u,\"running\":%u,\"swapped\":%u,\"in_transit\":%u,\"blocked\":%u,"
               "\"kv\":{",
            (unsigned long long)s->now_us, (unsigned long long)s->n_iterations,
            s->loop ? dloop_session_count(s->loop) : 0, (unsigned long long)s->live_reqs,
            c.waiting, c.running, c.swapped, c.in_transit, c.blocked);
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        fprintf(f, "%s\"%s\":{\"used\":%u,\"free\":%u,\"total\":%u}", p ? "," : "",
                sched_pool_name((sched_pool)p), c.kv_used[p], c.kv_free[p], c.kv_total[p]);
    fprintf(f, "},\"invariants\":\"");
    for (const char *q = invariants; *q; q++)
        if (*q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) fputc(*q, f);
    fprintf(f, "\",\"transfers_inflight\":%d,"
               "\"swap_verified\":%llu,\"swap_verify_errors\":%llu,\"transfer_overlap_errors\":%llu,"
               "\"engine_errors\":%llu,"
               "\"finished\":%llu,\"rejects\":%llu,\"draining\":%s,\"steps\":%llu,"
               "\"policy\":\"%s\"}\n",
            s->tiers ? kvtier_inflight(s->tiers) : 0,
            (unsigned long long)s->n_swap_verified, (unsigned long long)s->n_swap_verify_errors,
            (unsigned long long)s->n_overlap_errors,
            (unsigned long long)s->n_engine_errors, (unsigned long long)s->n_finished,
            (unsigned long long)s->n_rejects, s->draining ? "true" : "false",
            (unsigned long long)c.steps, s->policy_hash_hex);
    if (fclose(f) == 0) rename(tmp, s->cfg.stats_file);
    else unlink(tmp);
}

/* Per (tenant, class) queue depth, recounted from the live requests a few times a second
 * (a walk over the live set; not worth keeping incrementally). */
void stats_update_series_queues(svc *s)
{
    uint32_t *waiting = s->series_waiting, *running = s->series_running;
    int max_series = -1;
    memset(waiting, 0, SVC_MAX_SERIES * sizeof *waiting);
    memset(running, 0, SVC_MAX_SERIES * sizeof *running);
    for (size_t b = 0; b < SVC_HASH_BUCKETS; b++)
        for (svc_req *r = s->hash[b]; r; r = r->h_next) {
            if (r->ended || r->series < 0 || r->series >= SVC_MAX_SERIES) continue;
            sched_req_info ri;
            if (sched_get_request(s->sched, r->id, &ri) < 0) continue;
            if (ri.state == SCHED_REQ_WAITING) waiting[r->series]++;
            else running[r->series]++;
            if (r->series > max_series) max_series = r->series;
        }
    if (max_series > s->max_series_seen) s->max_series_seen = max_series;
    for (int i = 0; i <= s->max_series_seen && i < SVC_MAX_SERIES; i++)
        metrics_set_series_queue(s->mx, i, waiting[i], running[i]);
}

void stats_update_gauges(svc *s, uint64_t iter_us, uint32_t batch_tokens)
{
    if (s->now_us - s->series_q_last_us >= 100000 || s->now_us < s->series_q_last_us) {
        stats_update_series_queues(s);
        s->series_q_last_us = s->now_us;
    }
    sched_counts c;
    memset(&c, 0, sizeof c);
    sched_get_counts(s->sched, &c);
    metrics_set_queue(s->mx, c.waiting, c.running + c.swapped + c.in_transit);
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        metrics_set_kv(s->mx, (enum metrics_tier)p, c.kv_used[p], c.kv_total[p]);
    metrics_set_prefix(s->mx, c.prefix_query_tokens, c.prefix_hit_tokens, c.kv_cached[SCHED_POOL_DEVICE]);
    if (batch_tokens || iter_us) metrics_observe_iteration(s->mx, iter_us, batch_tokens);
    uint64_t dd = 0, dr = 0;
    declog_dropped(s->logs, &dd, &dr);
    metrics_set_log_dropped(s->mx, dd, dr);
    metrics_publish(s->mx, s->now_us, 0);
}

/* ---- iteration log -------------------------------------------------------------------- */

void itlog_emit(svc *s, uint64_t next_start_us)
{
    struct svc_iter *it = &s->itl;
    if (!it->pending) return;
    it->pending = false;
    char period[32] = "null";
    if (it->busy && next_start_us >= it->t_us && next_start_us)
        snprintf(period, sizeof period, "%llu", (unsigned long long)(next_start_us - it->t_us));
    uint64_t wakes = s->loop ? dloop_futex_wakes(s->loop) - it->wakes_before : 0;
    char line[512];
    int n = snprintf(line, sizeof line,
                     "{\"it\":%llu,\"t_us\":%llu,\"period_us\":%s,\"iter_us\":%llu,\"exec_us\":%llu,"
                     "\"prefill_tokens\":%llu,\"prefill_seqs\":%u,\"prefill_pairs\":%.0f,"
                     "\"decode_seqs\":%u,\"decode_context\":%.0f,\"context_tokens\":%llu,"
                     "\"transfers\":%u,\"wakes\":%llu}",
                     (unsigned long long)it->it, (unsigned long long)it->t_us, period,
                     (unsigned long long)it->iter_us, (unsigned long long)it->exec_us,
                     (unsigned long long)it->w.prefill_tokens, it->w.prefill_seqs, it->w.prefill_pairs,
                     it->w.decode_seqs, it->w.decode_context, (unsigned long long)it->w.context_tokens,
                     it->transfers, (unsigned long long)wakes);
    if (n > 0 && (size_t)n < sizeof line) declog_iteration_line(s->logs, line, (size_t)n);
}

void itlog_hold(svc *s, const sched_plan *p, uint64_t t_us, uint64_t iter_us, uint64_t exec_us,
                uint64_t wakes_before)
{
    struct svc_iter *it = &s->itl;
    *it = (struct svc_iter){.pending = true, .it = s->n_iterations, .t_us = t_us,
                            .iter_us = iter_us, .exec_us = exec_us,
                            .wakes_before = wakes_before, .transfers = p->n_transfers};
    sched_plan_work_of(p, &it->w);
}
