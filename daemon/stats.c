/* SPDX-License-Identifier: MIT */
/*
 * daemon/stats.c — what the runner shows of itself: the --stats-file JSON snapshot
 * (formats/stats.h: rewritten through a temporary file and a rename, so a reader never sees
 * half of one) and, with --check-invariants, the prefix index beside it,
 * the metrics gauges (queues, KV pools, per-series queue depths, iteration timing, log
 * drops) and the --iteration-log lines.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/service_internal.h"
#include "formats/stats.h"

int stats_init(svc *s)
{
    s->st.max_series_seen = -1;
    s->st.series_waiting = calloc(SVC_MAX_SERIES, sizeof(uint32_t));
    s->st.series_running = calloc(SVC_MAX_SERIES, sizeof(uint32_t));
    return s->st.series_waiting && s->st.series_running ? 0 : -ENOMEM;
}

void stats_free(svc *s)
{
    free(s->st.series_waiting);
    free(s->st.series_running);
    s->st.series_waiting = s->st.series_running = NULL;
}

/* ---- the prefix index beside the stats file (--check-invariants) ---------------------- */

typedef struct index_dump {
    FILE *f;
    bool first[SCHED_POOL__COUNT];
    char *pool_text[SCHED_POOL__COUNT];
    size_t pool_len[SCHED_POOL__COUNT];
    FILE *pool_f[SCHED_POOL__COUNT];
} index_dump;

/* sched_kv_announce's events: every block a lookup can find, per pool. */
static void index_add(void *ctx, const sched_kv_event *e)
{
    index_dump *d = ctx;
    if (e->kind != SCHED_KV_STORED || e->pool >= SCHED_POOL__COUNT || !d->pool_f[e->pool]) return;
    /* the hash KV-cache events publish (kvevents.h): the key's low 64 bits, as a string (a
     * JSON reader keeps 53 bits of a number) */
    fprintf(d->pool_f[e->pool], "%s\"%llu\"", d->first[e->pool] ? "" : ",",
            (unsigned long long)e->key_lo);
    d->first[e->pool] = false;
}

/* PATH.prefix-index.json: {"iterations":N,"GPU":[hash,...],"CPU":[...],"DISK":[...]}, the
 * blocks the prefix index holds per tier under the names and hashes the KV-cache events use,
 * so a test can compare what a subscriber was told with the index itself. O(index) on the
 * loop thread: only with --check-invariants (tests, debugging). Written through a temporary
 * file and a rename, like the stats file. */
static void write_prefix_index(svc *s)
{
    static const char *const medium[SCHED_POOL__COUNT] = {"GPU", "CPU", "DISK"};
    char path[4096], tmp[4120];
    if ((size_t)snprintf(path, sizeof path, "%s.prefix-index.json", s->cfg.stats_file) >=
        sizeof path)
        return;
    snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    index_dump d = {0};
    bool ok = true;
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        d.first[p] = true;
        d.pool_f[p] = open_memstream(&d.pool_text[p], &d.pool_len[p]);
        ok &= d.pool_f[p] != NULL;
    }
    if (ok) {
        sched_set_kv_sink(s->sched, index_add, &d);
        sched_kv_announce(s->sched);
        sched_set_kv_sink(s->sched, s->kv_events ? kvev_sink : NULL, s->kv_events);
    }
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        if (d.pool_f[p]) ok &= fclose(d.pool_f[p]) == 0;
    int fd = ok ? mkostemp(tmp, O_CLOEXEC) : -1;
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f) {
        fchmod(fd, 0644);
        fprintf(f, "{\"iterations\":%llu", (unsigned long long)s->n_iterations);
        for (int p = 0; p < SCHED_POOL__COUNT; p++)
            fprintf(f, ",\"%s\":[%s]", medium[p], d.pool_text[p] ? d.pool_text[p] : "");
        fprintf(f, "}\n");
        if (fclose(f) == 0)
            rename(tmp, path);
        else
            unlink(tmp);
    } else if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    for (int p = 0; p < SCHED_POOL__COUNT; p++) free(d.pool_text[p]);
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
                     : why[0]                                               ? why
                                                                            : "violated";
    fmt_stats st = {
        .t_us = s->now_us,
        .iterations = s->n_iterations,
        .sessions = s->loop ? (uint64_t)dloop_session_count(s->loop) : 0,
        .live_requests = s->rq.live,
        .waiting = c.waiting,
        .running = c.running,
        .swapped = c.swapped,
        .in_transit = c.in_transit,
        .blocked = c.blocked,
        .transfers_inflight = s->tiers ? (uint64_t)kvtier_inflight(s->tiers) : 0,
        .swap_verified = s->xf.n_swap_verified,
        .swap_verify_errors = s->xf.n_swap_verify_errors,
        .transfer_overlap_errors = s->xf.n_overlap_errors,
        .engine_errors = s->ex.n_engine_errors,
        .finished = s->rq.n_finished,
        .rejects = s->adm.n_rejects,
        .draining = s->draining,
        .steps = c.steps,
    };
    _Static_assert(FMT_STATS_POOLS == SCHED_POOL__COUNT, "the stats file lists every pool");
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        st.kv[p] = (fmt_stats_pool){c.kv_used[p], c.kv_free[p], c.kv_total[p]};
    snprintf(st.invariants, sizeof st.invariants, "%s", invariants);
    snprintf(st.policy, sizeof st.policy, "%s", s->policy_hash_hex);
    char err[256];
    if (s->cfg.check_invariants) write_prefix_index(s);
    if (fmt_stats_write(s->cfg.stats_file, &st, err, sizeof err) < 0 && !s->st.write_failed) {
        s->st.write_failed = true; /* said once: it would repeat every 20 ms */
        svc_log("stats file: %s", err);
    }
}

/* Per (tenant, class) queue depth, recounted from the live requests a few times a second
 * (a walk over the live set; not worth keeping incrementally). */
void stats_update_series_queues(svc *s)
{
    uint32_t *waiting = s->st.series_waiting, *running = s->st.series_running;
    int max_series = -1;
    memset(waiting, 0, SVC_MAX_SERIES * sizeof *waiting);
    memset(running, 0, SVC_MAX_SERIES * sizeof *running);
    /* No request lives (a flood of rejected requests leaves none): nothing to walk. The
     * walk over the 4,096 buckets was most of the loop's time in such a flood, paid by
     * every idle iteration. */
    for (size_t b = 0; b < SVC_HASH_BUCKETS && s->rq.live; b++)
        for (svc_req *r = s->rq.hash[b]; r; r = r->h_next) {
            if (req_state_ended(r->state) || r->series < 0 || r->series >= SVC_MAX_SERIES) continue;
            sched_req_info ri;
            if (sched_get_request(s->sched, r->id, &ri) < 0) continue;
            if (ri.state == SCHED_REQ_WAITING)
                waiting[r->series]++;
            else
                running[r->series]++;
            if (r->series > max_series) max_series = r->series;
        }
    if (max_series > s->st.max_series_seen) s->st.max_series_seen = max_series;
    for (int i = 0; i <= s->st.max_series_seen && i < SVC_MAX_SERIES; i++)
        metrics_set_series_queue(s->mx, i, waiting[i], running[i]);
}

void stats_update_gauges(svc *s, uint64_t iter_us, uint32_t batch_tokens)
{
    if (s->now_us - s->st.series_q_last_us >= 100000 || s->now_us < s->st.series_q_last_us) {
        stats_update_series_queues(s);
        s->st.series_q_last_us = s->now_us;
    }
    sched_counts c;
    memset(&c, 0, sizeof c);
    sched_get_counts(s->sched, &c);
    metrics_set_queue(s->mx, c.waiting, c.running + c.swapped + c.in_transit);
    /* the same figures for clients, in their segments (a gateway over several daemons
     * weighs them per request) */
    if (s->loop)
        dloop_publish_load(s->loop, c.waiting, c.running + c.swapped + c.in_transit,
                           c.kv_used[SCHED_POOL_DEVICE], c.kv_total[SCHED_POOL_DEVICE],
                           s->n_iterations);
    for (sched_pool p = SCHED_POOL_DEVICE; p < SCHED_POOL__COUNT; p++)
        metrics_set_kv(s->mx, p, c.kv_used[p], c.kv_total[p]);
    metrics_prefix mp = {.query_tokens = c.prefix_query_tokens,
                         .hit_tokens = c.prefix_hit_tokens,
                         .ring_snapshots = c.ring_snapshots,
                         .ring_snapshot_bytes = (uint64_t)c.ring_snapshots * s->ex.ring_block_bytes,
                         .ring_taken = c.ring_snapshots_taken,
                         .ring_hits = c.ring_snapshot_hits,
                         .ring_dropped = c.ring_snapshots_dropped};
    for (int t = 0; t < SCHED_POOL__COUNT; t++) {
        mp.unheld[t] = c.kv_cached[t];
        mp.hit_self[t] = c.prefix_self_pool_tokens[t];
        mp.hit_cross[t] = c.prefix_hit_pool_tokens[t] - c.prefix_self_pool_tokens[t];
        mp.demoted[t] = c.prefix_demoted_blocks[t];
        mp.reloaded[t] = c.prefix_reloaded_blocks[t];
    }
    metrics_set_prefix(s->mx, &mp);
    if (batch_tokens || iter_us) metrics_observe_iteration(s->mx, iter_us, batch_tokens);
    uint64_t dd = 0, dr = 0;
    declog_dropped(s->logs, &dd, &dr);
    metrics_set_log_dropped(s->mx, dd, dr);
    if (s->kv_events)
        metrics_set_kv_events(s->mx, kvev_dropped(s->kv_events), kvev_resyncs(s->kv_events));
    metrics_publish(s->mx, s->now_us, 0);
}

/* ---- iteration log -------------------------------------------------------------------- */

void itlog_emit(svc *s, uint64_t next_start_us)
{
    struct svc_iter *it = &s->st.itl;
    if (!it->pending) return;
    it->pending = false;
    fmt_iteration line = {
        .it = (int64_t)it->it,
        .t_us = (int64_t)it->t_us,
        .period_us = FMT_NULL,
        .iter_us = (int64_t)it->iter_us,
        .exec_us = (int64_t)it->exec_us,
        .prefill_tokens = (int64_t)it->w.prefill_tokens,
        .prefill_seqs = it->w.prefill_seqs,
        .prefill_pairs = it->w.prefill_pairs,
        .decode_seqs = it->w.decode_seqs,
        .decode_context = it->w.decode_context,
        .context_tokens = (int64_t)it->w.context_tokens,
        .transfers = it->transfers,
        .wakes = s->loop ? (int64_t)(dloop_futex_wakes(s->loop) - it->wakes_before) : 0,
    };
    if (it->busy && next_start_us >= it->t_us && next_start_us)
        line.period_us = (int64_t)(next_start_us - it->t_us);
    declog_iteration(s->logs, &line);
}

void itlog_busy(svc *s, bool busy)
{
    s->st.itl.busy = busy;
}

void itlog_hold(svc *s, const sched_plan *p, uint64_t t_us, uint64_t iter_us, uint64_t exec_us,
                uint64_t wakes_before)
{
    struct svc_iter *it = &s->st.itl;
    *it = (struct svc_iter){.pending = true,
                            .it = s->n_iterations,
                            .t_us = t_us,
                            .iter_us = iter_us,
                            .exec_us = exec_us,
                            .wakes_before = wakes_before,
                            .transfers = p->n_transfers};
    sched_plan_work_of(p, &it->w);
}
