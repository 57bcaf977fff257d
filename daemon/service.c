/* SPDX-License-Identifier: MIT */
/*
 * The runner: sessions' requests → scheduler → one flattened engine batch per iteration →
 * token events, with KV swaps to the host/disk tiers over the loop's io_uring. See
 * service.h for the iteration and service_internal.h for the files it is cut into; this
 * file holds the set-up, the loop callbacks and the iteration itself. The comments say why
 * things are done the way they are.
 */
#include "daemon/service.h"
#include "common/errdetail.h"

#include <errno.h>
#include <liburing.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <time.h>

#include "daemon/service_internal.h"
#include "numa/rnuma.h"
#include "sched/sched_testing.h"

/* ---- errors -------------------------------------------------------------------------- */

ERRDETAIL_DEFINE(svc_err);
const char *svc_errmsg(void)
{
    return svc_err.msg;
}
#define seterr(err, ...) errdetail_set(&svc_err, (err), __VA_ARGS__)

/* ---- the built-in policy ------------------------------------------------------------- */

/* Used when no --policy is given: one class, one tenant per uid (uidtenants.c appends the
 * tenants), token-budget scheduling with automatic swap/recompute choice. The step knobs and
 * the tenants' queued-token quota are sim/policies/token-budget.policy's, the output of
 * `ringlm-sim --tune` on the Azure code trace at ×1..×4 with the built-in (H200) service model,
 * checked on the conversation trace (README "Tuned default policy"). The queue is bounded:
 * past 50,000 waiting prompt tokens of one uid (tenant_quota) or 4096 waiting requests
 * (queue_full) new ones are refused at the door instead of growing memory and latency
 * without end.
 *
 * The CPU backend takes 512 tokens a step (budget and chunk) instead of the 4096 and 2048
 * tuned for the H200: on a CPU a 2048-token chunk is a step of 1-2.4 s (stories110M on Zen 4)
 * during which every running stream waits, 512 one of 0.3-0.6 s; a long prompt pays one more
 * weight read a step (+2.4-3.9% on 2000 tokens), and a burst of short prompts is prefilled in
 * the waves a gateway's 16-record split gave it before, whoever sends it
 * (docs/results/2026-12-07-http-zen4-s12.md). */
#define BUILTIN_SCHEDULER(budget, chunk)                                                           \
    "# ringlmd built-in policy\n"                                                                  \
    "[scheduler]\n"                                                                                \
    "mode = token_budget\n"                                                                        \
    "token_budget = " budget "\n"                                                                  \
    "max_active_seqs = 256\n"                                                                      \
    "prefill_chunk = " chunk "\n"                                                                  \
    "decode_reserve_tokens = 64\n"                                                                 \
    "preemption = auto\n"                                                                          \
    "queue_max_requests = 4096\n"
static const char builtin_scheduler_gpu[] = BUILTIN_SCHEDULER("4096", "2048");
static const char builtin_scheduler_cpu[] = BUILTIN_SCHEDULER("512", "512");

/* ---- loop callbacks ------------------------------------------------------------------ */

static int on_connect(void *ctx, dsess *ds)
{
    return req_session_open(ctx, ds);
}

static void on_request(void *ctx, dsess *ds, const struct ringlm_wire_parsed *rec,
                       const char *tenant_tag)
{
    svc *s = ctx;
    s->now_us = dloop_now_us(s->loop);
    svc_sess *ss = dsess_user(ds);
    if (ss && ss->tenant >= 0 && ss->tenant < s->n_tenants) s->tenant_records[ss->tenant]++;
    adm_on_request(s, ds, rec, tenant_tag);
}

static void on_cancel(void *ctx, dsess *ds, uint64_t req_id)
{
    svc *s = ctx;
    s->now_us = dloop_now_us(s->loop);
    svc_sess *ss = dsess_user(ds);
    if (ss && ss->tenant >= 0 && ss->tenant < s->n_tenants) s->tenant_records[ss->tenant]++;
    req_session_cancel(s, ds, req_id);
}

static int drain_budget(void *ctx, dsess *ds)
{
    return req_drain_budget(ctx, ds);
}

static void on_close(void *ctx, dsess *ds, const char *reason)
{
    svc *s = ctx;
    (void)reason;
    s->now_us = dloop_now_us(s->loop);
    req_session_close(s, ds);
}

static void on_cqe(void *ctx, const struct io_uring_cqe *cqe)
{
    svc *s = ctx;
    s->now_us = dloop_now_us(s->loop);
    if (cn_on_cqe(s, cqe)) return;
    if (s->tiers) kvtier_handle_cqe(s->tiers, cqe);
}

static void on_signal(void *ctx, int signo)
{
    svc *s = ctx;
    if (signo == SIGHUP) {
        svc_log("SIGHUP ignored (policy reload is not supported; restart to change the policy)");
        return;
    }
    if (s->draining) {
        if (signo == SIGINT) {
            svc_log("second SIGINT: stopping now");
            dloop_stop(s->loop);
        }
        return;
    }
    s->draining = true;
    s->drain_start_us = dloop_now_us(s->loop);
    dloop_drain(s->loop);
    svc_log("%s: draining (no new requests; in-flight work has %llu ms)", strsignal(signo),
            (unsigned long long)s->cfg.drain_grace_ms);
    s->stats_dirty = true;
}

static int iterate(void *ctx, uint64_t now_us)
{
    svc *s = ctx;
    s->now_us = now_us;
    s->n_iterations++;
    /* each tenant's share of the records the loop drains next */
    memset(s->tenant_records, 0, sizeof(uint32_t) * (size_t)s->n_tenants);
    DTRACE_PROBE2(ringlmd, iteration_start, s->n_iterations, now_us);
    bool itlog = s->logs && declog_has_iterations(s->logs);
    if (itlog) itlog_emit(s, now_us);
    uint64_t wakes_before = itlog && s->loop ? dloop_futex_wakes(s->loop) : 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    /* Drain: after the grace period, cancel whatever is still running. */
    if (s->draining && !s->drain_cancelled &&
        now_us - s->drain_start_us >= s->cfg.drain_grace_ms * 1000) {
        s->drain_cancelled = true;
        req_cancel_all(s, SCHED_CANCEL_SHUTDOWN, RINGLM_WIRE_R_CANCELLED, RINGLM_WIRE_R_DRAINING);
    }

    /* Constraints compiling while their completion read could not be armed (the ring was
     * full): armed now, or looked for again soon. */
    if (cn_tick(s)) dloop_wake_after_us(s->loop, 1000);
    /* Output first: a client that read its ring since the last iteration unblocks here. */
    req_flush_pending(s);
    /* The daemon-side backpressure timer (the policy's own runs in the scheduler too). */
    uint64_t next_wake = req_check_backpressure(s, now_us);

    const sched_plan *p = sched_step(s->sched, now_us);
    int nres = 0;
    uint64_t exec_us = 0;
    uint32_t batch_tokens = 0;
    if (p) {
        req_plan_ended(s, p);
        /* in plan order: a demotion completes before anything after it; swaps and prefix
         * reloads run on the ring beside the steps, their requests waiting (sched_transfer) */
        for (uint32_t i = 0; i < p->n_transfers; i++)
            if (p->transfers[i].cache && p->transfers[i].dir == SCHED_XFER_OUT)
                xfer_copy(s, &p->transfers[i]);
            else
                xfer_start(s, &p->transfers[i]);
        if (p->n_transfers && s->tiers) kvtier_flush(s->tiers);
        if (p->n_copies) kv_copy_plan(s, p); /* after the demotions, before the batch */
        if (p->n_entries) {
            nres = exec_plan(s, p, &exec_us);
            batch_tokens = p->decode_tokens + p->prefill_tokens;
        }
        uint64_t now2 = now_us + exec_us;
        s->now_us = now2; /* exec_plan advanced it by exec_us already; same value */
        if (nres > 0 || p->n_entries) {
            sched_commit(s->sched, s->ex.results, (size_t)(nres > 0 ? nres : 0), now2, exec_us);
            req_commit_ended(s, s->ex.results, nres);
            adm_submit_samples(s); /* after the commit cached their prompt's blocks */
        }
    }
    req_flush_pending(s);

    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t iter_us =
        (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000ll + (t1.tv_nsec - t0.tv_nsec) / 1000);
    /* this iteration's KV-cache events (and those of the sessions' submits and cancels
     * before it) make one batch */
    kvev_end_iteration(s->kv_events, s->sched);
    stats_update_gauges(s, p && p->n_entries ? iter_us : 0, batch_tokens);
    if (s->stats_dirty && (s->now_us - s->stats_last_us >= SVC_STATS_INTERVAL_US || s->draining)) {
        stats_write(s);
        s->stats_dirty = false;
        s->stats_last_us = s->now_us;
    }
    DTRACE_PROBE3(ringlmd, iteration_end, s->n_iterations, batch_tokens, iter_us);
    if (itlog && p && p->n_entries) itlog_hold(s, p, now_us, iter_us, exec_us, wakes_before);

    if (s->draining) {
        if (s->rq.live == 0) {
            svc_log("drained: every request answered; stopping");
            stats_write(s);
            dloop_stop(s->loop);
            return 0;
        }
        /* Clients that never read their final events must not hold the daemon: one more
         * second after the cancels, then the sessions end with "shutdown". */
        if (now_us - s->drain_start_us >= s->cfg.drain_grace_ms * 1000 + 1000000) {
            svc_log("drain: %llu requests could not deliver their final event; stopping",
                    (unsigned long long)s->rq.live);
            dloop_stop(s->loop);
            return 0;
        }
        dloop_wake_after_us(s->loop, 10000);
    }

    sched_counts c;
    memset(&c, 0, sizeof c);
    sched_get_counts(s->sched, &c);
    bool busy = p && (p->n_entries > 0 || p->n_releases > 0 || p->n_transfers > 0);
    /* Scrapers see the live state at most publish_interval old while busy; the first idle
     * iteration publishes the final state at once (the loop may sleep for long after). */
    if (busy || s->stats_dirty) s->mx_dirty = true;
    if (!busy && s->mx_dirty) {
        /* Before the FINISH events of this iteration go out: a client that read its FINISH
         * and then scrapes sees its request counted. A flood of requests answered at once
         * (rejected) makes every iteration an idle one with news; the recount skips its walk
         * when no request lives (stats.c), which was most of the loop's time in that flood. */
        stats_update_series_queues(s);
        metrics_publish(s->mx, s->now_us, 1);
        s->mx_dirty = false;
    }
    if (next_wake) dloop_wake_after_us(s->loop, next_wake);
    /* gathering a burst: step again when it ends (a submit before wakes the loop anyway) */
    if (p && p->hold_until_us > now_us) dloop_wake_after_us(s->loop, p->hold_until_us - now_us);
    if (s->stats_dirty) dloop_wake_after_us(s->loop, SVC_STATS_INTERVAL_US);
    /* KV events were dropped: the resync goes out once the publisher made room */
    if (kvev_resync_pending(s->kv_events)) dloop_wake_after_us(s->loop, 2000);
    /* Queued or parked work that got no entry this step waits on time (aging, timeouts,
     * transfers); a short timer keeps it moving without spinning a core. */
    if (!busy && (c.waiting || c.running || c.swapped || c.in_transit))
        dloop_wake_after_us(s->loop, 2000);
    itlog_busy(s, busy);
    return busy ? 1 : 0;
}

/* ---- create / run / destroy ---------------------------------------------------------- */

void svc_config_init(svc_config *c)
{
    memset(c, 0, sizeof *c);
    c->backend = "cpu";
    c->numa = "auto";
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static char *read_file(const char *path, int *err)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        *err = -errno;
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            *err = -ENOMEM;
            return NULL;
        }
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        if (cap >= (1u << 22)) {
            free(buf);
            fclose(f);
            *err = -EFBIG;
            return NULL;
        }
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) {
            free(buf);
            buf = NULL;
            continue;
        }
        buf = nb;
    }
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* The name clients and fleet routers know the model by (vLLM's served_model_name, the
 * metrics' label model_name): --served-model-name, else the GGUF's general.name, else the
 * model file's base name without its extension ("stories15M" for models/stories15M.bin). */
static void served_model_name(svc *s, const svc_config *cfg)
{
    const char *name = cfg->served_model_name ? cfg->served_model_name : eng_model_name(s->model);
    if (name) {
        snprintf(s->served_model_name, sizeof s->served_model_name, "%s", name);
        return;
    }
    const char *base = strrchr(cfg->model, '/');
    base = base ? base + 1 : cfg->model;
    const char *dot = strrchr(base, '.');
    int n = dot && dot > base ? (int)(dot - base) : (int)strlen(base);
    snprintf(s->served_model_name, sizeof s->served_model_name, "%.*s", n, base);
}

int svc_create(const svc_config *cfg, svc **out)
{
    *out = NULL;
    int rc;
    if (!cfg->model && !cfg->identity_only)
        return seterr(-EINVAL, "--model is required (a path or synthetic:PRESET:SEED)");
    svc *s = calloc(1, sizeof *s);
    if (!s) return seterr(-ENOMEM, "out of memory");
    s->cfg = *cfg;
    s->trace_xfer = getenv("RINGLMD_TRACE_XFER") != NULL;
    if (stats_init(s) < 0) {
        rc = seterr(-ENOMEM, "out of memory");
        goto fail;
    }
    if (!s->cfg.backpressure_timeout_ms) s->cfg.backpressure_timeout_ms = 5000;
    if (!s->cfg.backpressure_buffer_tokens) s->cfg.backpressure_buffer_tokens = 4096;
    if (!s->cfg.max_n) s->cfg.max_n = 16;
    if (s->cfg.max_n > RINGLM_WIRE_MAX_N) s->cfg.max_n = RINGLM_WIRE_MAX_N;
    if (!s->cfg.max_records_per_tenant_iter) s->cfg.max_records_per_tenant_iter = 16;
    if (!s->cfg.drain_grace_ms) s->cfg.drain_grace_ms = 10000;
    if (!s->cfg.kv_blocks) s->cfg.kv_blocks = 1024;
    if (!s->cfg.kv_block_size) s->cfg.kv_block_size = 16;
    if (!s->cfg.backend) s->cfg.backend = "cpu";

    /* Policy first: a bad policy is the most common operator error, report it before the
     * model load takes time. */
    char *text = NULL;
    if (cfg->policy_path) {
        int e = 0;
        text = read_file(cfg->policy_path, &e);
        if (!text) {
            rc = seterr(e, "policy %s: %s", cfg->policy_path, strerror(-e));
            goto fail;
        }
        const char *b = strrchr(cfg->policy_path, '/');
        snprintf(s->policy_name, sizeof s->policy_name, "%s", b ? b + 1 : cfg->policy_path);
    } else {
        snprintf(s->policy_name, sizeof s->policy_name, "built-in");
    }
    static char builtin_policy[8192];
    const char *builtin_scheduler =
        strcmp(s->cfg.backend, "cpu") ? builtin_scheduler_gpu : builtin_scheduler_cpu;
    if (!text && !ut_builtin_text(builtin_policy, sizeof builtin_policy, builtin_scheduler)) {
        rc = seterr(-ENOSPC, "built-in policy: text does not fit");
        goto fail;
    }
    s->per_uid = !text;
    sched_policy_error perr = {0};
    rc = sched_policy_parse(text ? text : builtin_policy, &s->policy, &perr);
    free(text);
    if (rc < 0) {
        rc =
            seterr(rc, "policy %s: line %d: %s", cfg->policy_path ? cfg->policy_path : "(built-in)",
                   perr.line, perr.reason[0] ? perr.reason : sched_last_error());
        goto fail;
    }
    snprintf(s->policy_hash_hex, sizeof s->policy_hash_hex, "%s", sched_policy_hash_hex(s->policy));
    ut_init(s);
    req_init(s);

    if (!cfg->model) { /* identity_only: a policy checked on its own */
        *out = s;
        return 0;
    }
    /* A real model takes seconds to minutes to load and warm up: say what is going on. */
    bool progress = !cfg->quiet && !cfg->identity_only;
    uint64_t t_load = mono_ms();
    if (progress) svc_log("loading model %s ...", cfg->model);
    rc = eng_model_load(cfg->model, &s->model);
    if (rc < 0) {
        rc = seterr(rc, "model %s: %s", cfg->model, eng_errmsg());
        goto fail;
    }
    if (progress)
        svc_log("model loaded in %llu ms%s", (unsigned long long)(mono_ms() - t_load),
                !eng_model_gguf_path(s->model)       ? ""
                : eng_model_weights_copied(s->model) ? " (weights read into memory on 2 MiB pages)"
                                                     : " (weights mapped from the file)");
    s->mcfg = eng_model_cfg(s->model);
    s->n_stop_tokens = eng_model_stop_tokens(s->model, s->stop_tokens, SVC_MAX_STOP_TOKENS);
    if (s->n_stop_tokens > SVC_MAX_STOP_TOKENS) s->n_stop_tokens = SVC_MAX_STOP_TOKENS;

    if (cfg->identity_only) {
        *out = s;
        return 0;
    }

    s->numa_node = rnuma_resolve(cfg->numa ? cfg->numa : "auto");
    if (s->numa_node < -1) {
        rc = seterr(s->numa_node, "--numa-node: %s", rnuma_errmsg());
        goto fail;
    }

    const sched_policy_cfg *pc = sched_policy_get(s->policy);
    s->max_tokens = (int)pc->token_budget;
    if (cfg->max_batch_tokens > s->max_tokens) s->max_tokens = cfg->max_batch_tokens;
    if (cfg->max_batch_tokens && cfg->max_batch_tokens < (int)pc->token_budget)
        svc_log("--max-batch-tokens %d is below the policy's token_budget %u; using %u",
                cfg->max_batch_tokens, pc->token_budget, pc->token_budget);
    if (pc->mode == SCHED_MODE_STATIC) s->max_tokens += (int)pc->static_batch_size * 2;
    /* Continuous mode (the FCFS baseline) cannot slice a prompt: one longer than the budget
     * runs whole, beside the step's decodes, so the engine batch must hold the longest
     * prompt the model takes on top of the budget. */
    if (pc->mode == SCHED_MODE_CONTINUOUS &&
        s->max_tokens < (int)pc->token_budget + s->mcfg->seq_len)
        s->max_tokens = (int)pc->token_budget + s->mcfg->seq_len;
    s->max_seqs = cfg->max_seqs ? cfg->max_seqs : (int)pc->max_active_seqs;
    if (s->max_seqs < (int)pc->max_active_seqs) s->max_seqs = (int)pc->max_active_seqs;
    if (s->max_seqs > s->max_tokens) s->max_seqs = s->max_tokens;

    /* A model with windowed and global layers on the CPU backend: its windowed layers' K/V
     * in a ring per running sequence, its blocks the global layers' only (eng_options
     * .kv_rings). A swap moves a sequence's ring beside its blocks (transfers.c), only
     * its last window whatever its length. A ring holds the last window of one sequence
     * and nothing else: n > 1 samples share the prompt's global blocks through the prefix
     * cache, each on a ring of its own copied from the leader's at the fork (execute.c);
     * other requests hit where a ring snapshot of the window before a cached prompt's end
     * was kept (sched_config.window_snapshots, execute.c). */
    const bool cpu_backend = !s->cfg.backend || !strcmp(s->cfg.backend, "cpu");
    int kv_rings = 0;
    /* the most rows one sequence brings to a batch: a prefill chunk in token-budget mode
     * (the scheduler cuts every chunk there; with rings no swap-in re-prefills whole), a
     * whole prompt in the others */
    const int ring_rows = pc->mode == SCHED_MODE_TOKEN_BUDGET && pc->prefill_chunk &&
                                  (int)pc->prefill_chunk < s->max_tokens
                              ? (int)pc->prefill_chunk
                              : s->max_tokens;
    if (cpu_backend && eng_model_mixed_window(s->model) && cfg->kv_rings >= 0 &&
        !cfg->test.keep_window_blocks) {
        /* by default the rings take the bytes the windowed layers had in the blocks: as many
         * rings as --kv-blocks holds ring lengths (at least one, at most max_active_seqs),
         * so --kv-blocks N costs what it did without rings */
        const int ring_blocks =
            eng_kv_ring_blocks_for(eng_model_hparams_of(s->model)->swa_window, ring_rows,
                                   s->cfg.kv_block_size, s->mcfg->seq_len);
        kv_rings = s->cfg.kv_blocks / ring_blocks;
        if (kv_rings > (int)pc->max_active_seqs) kv_rings = (int)pc->max_active_seqs;
        if (kv_rings < 1) kv_rings = 1;
        if (cfg->kv_rings) kv_rings = cfg->kv_rings;
    }
    eng_options eo = {.backend = s->cfg.backend,
                      .n_threads = cfg->threads > 0 ? cfg->threads : 1,
                      .numa_node = s->numa_node,
                      .kv_blocks = s->cfg.kv_blocks,
                      .kv_block_size = s->cfg.kv_block_size,
                      .max_batch_tokens = s->max_tokens,
                      .max_seqs = s->max_seqs,
                      .cuda_device = s->cfg.cuda_device,
                      .cuda_dtype = (eng_cuda_dtype)s->cfg.cuda_dtype,
                      .cuda_no_graphs = s->cfg.cuda_no_graphs,
                      .prompt_exact = s->cfg.prompt_exact,
                      .packed_weights = s->cfg.packed_weights,
                      .kv_rings = kv_rings,
                      .kv_ring_rows = ring_rows};
    rc = eng_create(s->model, &eo, &s->engine);
    if (rc < 0) {
        rc = seterr(rc, "engine (%s): %s", s->cfg.backend, eng_errmsg());
        goto fail;
    }

    rc = exec_init(s);
    if (rc < 0) {
        rc = seterr(rc, "batch buffers: %s", eng_errmsg());
        goto fail;
    }
    /* ring snapshots: the rings' own bytes unless --kv-ring-snapshot-bytes says (prefix
     * cache on: token-budget mode, where the scheduler runs it) */
    const int64_t snap_bytes =
        !kv_rings || s->cfg.no_prefix_cache || pc->mode != SCHED_MODE_TOKEN_BUDGET
            ? -1
            : cfg->kv_snap_bytes;
    s->ex.ring_rows = kv_rings ? ring_rows : 0;
    rc = exec_snap_init(s, snap_bytes);
    if (rc < 0) {
        rc = rc == -ERANGE
                 ? seterr(rc,
                          "--kv-ring-snapshot-bytes %lld: less than one ring block "
                          "(%zu bytes)",
                          (long long)snap_bytes, s->ex.ring_block_bytes)
                 : seterr(rc, "ring snapshots of %lld bytes: out of memory", (long long)snap_bytes);
        goto fail;
    }

    char cwhy[256] = "";
    rc = cn_create(s, cwhy, sizeof cwhy);
    if (rc < 0) {
        rc = seterr(rc, "%s", cwhy);
        goto fail;
    }

    if (progress) svc_log("warming up the engine ..."); /* exec_warm_up says when done */
    exec_warm_up(s);

    if (s->cfg.host_kv_blocks < 0) s->cfg.host_kv_blocks = 0;
    sched_config sc = {
        .kv_blocks_device = (uint32_t)eng_kv_blocks(s->engine),
        .kv_blocks_host = (uint32_t)s->cfg.host_kv_blocks,
        .kv_blocks_disk = s->cfg.disk_kv_path ? (uint32_t)cfg->disk_kv_blocks : 0,
        .block_size = (uint32_t)eng_kv_block_size(s->engine),
        .kv_bytes_per_token = eng_kv_bytes_per_token(s->engine),
        .max_context = (uint32_t)s->mcfg->seq_len + 1,
        /* .step below: the simulator's built-in model; measured step times correct it from
         * the first iteration (sched_commit). */
        .host = {.out_bytes_per_s = 4e9, .in_bytes_per_s = 4e9, .latency_us = 20},
        .disk = {.out_bytes_per_s = cfg->disk_kv_bw > 0 ? cfg->disk_kv_bw : 1e9,
                 .in_bytes_per_s = cfg->disk_kv_bw > 0 ? cfg->disk_kv_bw : 1e9,
                 .latency_us = 100},
        .prefix_cache = !s->cfg.no_prefix_cache,
        .prefix_cache_generated = true, /* exec_plan gives each sampled token's id */
        /* every layer windowed (and honoured by the backend): blocks behind the window go
         * back to the pool as sequences grow */
        .attention_window = cfg->test.keep_window_blocks ? 0 : (uint32_t)eng_kv_window(s->engine),
        /* gemma's windowed layers in rings: a sequence holding blocks holds one */
        .window_rings = (uint32_t)eng_kv_rings(s->engine),
        .window_ring_bytes = eng_kv_ring_bytes(s->engine),
        .window_snapshots = s->ex.n_snaps,
        .window_snapshot_blocks = s->ex.snap_blocks,
    };
    { /* the step model charges a windowed layer min(context, window), rings or not */
        const eng_model_hparams *hp = eng_model_hparams_of(s->model);
        uint32_t windowed = 0;
        for (int l = 0; l < s->mcfg->n_layers; l++) windowed += eng_layer_windowed(hp, l);
        if (windowed && hp->swa_window > 0) {
            sc.step_window = (uint32_t)hp->swa_window;
            sc.step_window_layers = windowed;
            sc.step_layers = (uint32_t)s->mcfg->n_layers;
        }
    }
    if (kv_rings && progress) {
        const eng_model_hparams *hp = eng_model_hparams_of(s->model);
        int global = 0;
        for (int l = 0; l < s->mcfg->n_layers; l++) global += !eng_layer_windowed(hp, l);
        svc_log("windowed layers (%d of %d, window %d) keep their K/V in %d rings of %d blocks "
                "(%zu bytes a ring), global layers in %d blocks of %zu bytes; a swap moves a "
                "ring with its blocks; n > 1 samples copy the leader's ring; prefix cache "
                "hits of other requests: %u ring snapshots of one ring block (%zu bytes, "
                "--kv-ring-snapshot-bytes), a hit restores %u",
                s->mcfg->n_layers - global, s->mcfg->n_layers, hp->swa_window, kv_rings,
                eng_kv_ring_blocks(s->engine), eng_kv_ring_bytes(s->engine),
                eng_kv_blocks(s->engine), eng_kv_block_bytes(s->engine), s->ex.n_snaps,
                (size_t)s->ex.n_snaps * s->ex.ring_block_bytes, s->ex.snap_blocks);
    }
    if (sc.attention_window && progress)
        svc_log("every layer attends to the last %u positions: sequences give back the KV "
                "blocks behind their window",
                sc.attention_window);
    sched_step_model_default(&sc.step);
    rc = sched_create(s->policy, &sc, req_on_sched_event, s, 1, &s->sched);
    if (rc < 0) {
        rc = seterr(rc, "scheduler: %s", sched_last_error());
        goto fail;
    }
    /* a test knob (ringlmd-test --prefix-key constant; cfg->test is zero in ringlmd) */
    if (cfg->test.constant_prefix_key &&
        (rc = sched_testing_set_prefix_key(s->sched, SCHED_PREFIX_KEY_CONSTANT)) < 0) {
        rc = seterr(rc, "scheduler: %s", sched_last_error());
        goto fail;
    }
    if (cfg->kv_events) {
        kvev_config kc = {.endpoint = cfg->kv_events,
                          .replay_endpoint = cfg->kv_events_replay,
                          .block_size = (uint32_t)eng_kv_block_size(s->engine),
                          .queue_events = cfg->kv_events_queue,
                          .map_events = cfg->kv_events_map};
        rc = kvev_create(&kc, &s->kv_events);
        if (rc < 0) {
            rc = seterr(rc, "%s", kvev_errmsg());
            goto fail;
        }
        sched_set_kv_sink(s->sched, kvev_sink, s->kv_events);
    }
    s->n_tenants = sched_policy_n_tenants(s->policy);
    s->tenant_records = calloc((size_t)s->n_tenants + 1, sizeof(uint32_t));
    if (!s->tenant_records) {
        rc = seterr(-ENOMEM, "out of memory");
        goto fail;
    }

    declog_config dc = {.decision_path = cfg->decision_log,
                        .request_path = cfg->request_log,
                        .iteration_path = cfg->iteration_log};
    rc = declog_create(&dc, &s->logs);
    if (rc < 0) {
        rc = seterr(rc, "logs: %s", declog_errmsg());
        goto fail;
    }

    served_model_name(s, cfg);
    metrics_config mc = {.listen = cfg->metrics_listen,
                         .version = RINGLM_VERSION,
                         .policy_hash = s->policy_hash_hex,
                         .policy_name = s->policy_name,
                         .model_hash = eng_model_hash(s->model),
                         .model_name = s->served_model_name,
                         .model_path = cfg->model,
                         .max_model_len = (uint32_t)s->mcfg->seq_len,
                         .backend = eng_backend_name(s->engine),
                         .kv_block_size = (uint32_t)eng_kv_block_size(s->engine),
                         .prefix_cache = !s->cfg.no_prefix_cache};
    rc = metrics_create(&mc, &s->mx);
    if (rc < 0) {
        rc = seterr(rc, "metrics %s: %s", cfg->metrics_listen ? cfg->metrics_listen : "",
                    metrics_errmsg());
        goto fail;
    }
    *out = s;
    return 0;
fail:
    svc_destroy(s);
    return rc;
}

const char *svc_policy_text(const svc *s)
{
    return sched_policy_canonical(s->policy);
}
const char *svc_policy_hash_hex(const svc *s)
{
    return s->policy_hash_hex;
}
uint64_t svc_policy_hash(const svc *s)
{
    return sched_policy_hash(s->policy);
}
const char *svc_model_hash(const svc *s)
{
    return s->model ? eng_model_hash(s->model) : "none";
}
const sched_policy *svc_policy(const svc *s)
{
    return s->policy;
}

static void tier_log(void *ctx, const char *msg)
{
    (void)ctx;
    svc_log("kv tiers: %s", msg);
}

int svc_run(svc *s, const dloop_config *lc)
{
    static const dsvc_ops ops = {
        .on_connect = on_connect,
        .on_request = on_request,
        .on_cancel = on_cancel,
        .on_close = on_close,
        .iterate = iterate,
        .on_cqe = on_cqe,
        .on_signal = on_signal,
        .drain_budget = drain_budget,
    };
    if (!s->engine) return seterr(-EINVAL, "service created with identity_only cannot run");
    dloop_config c = *lc;
    if (c.numa_node < 0) c.numa_node = s->numa_node;
    int rc = dloop_create(&c, &ops, s, &s->loop);
    if (rc < 0) return seterr(rc, "event loop on %s: %s", lc->socket_path, dloop_errmsg());
    dloop_set_policy_hash(s->loop, sched_policy_hash(s->policy));

    /* The loop thread is the only one that touches the engine's batch metadata, the
     * scheduler and the sessions: keep it on the node that holds their memory. */
    if (s->numa_node >= 0 && rnuma_pin_self(s->numa_node) < 0)
        svc_log("pinning the loop thread to node %d failed: %s", s->numa_node, rnuma_errmsg());
    char nd[160];
    rnuma_describe(s->numa_node, nd, sizeof nd);

    if (s->cfg.host_kv_blocks > 0 || s->cfg.disk_kv_path) {
        size_t pool_len = 0;
        void *base = eng_kv_pool_base(s->engine, &pool_len);
        kvtier_config kc = {.block_bytes = eng_kv_block_bytes(s->engine),
                            .pool_blocks = eng_kv_blocks(s->engine),
                            .pool_base = base,
                            .engine = s->engine,
                            .host_blocks = s->cfg.host_kv_blocks,
                            .disk_path = s->cfg.disk_kv_path,
                            .disk_blocks = s->cfg.disk_kv_path ? s->cfg.disk_kv_blocks : 0,
                            .numa_node = s->numa_node,
                            .ring = dloop_ring(s->loop),
                            .ud_tag = SVC_KVTIER_TAG,
                            .register_buffers = true,
                            .log = tier_log};
        /* a test knob (ringlmd-test --fail-kv-reads; zero in ringlmd) */
        kc.fail_reads = s->cfg.test.fail_kv_reads;
        if (kc.fail_reads)
            svc_log("--fail-kv-reads:%s%s: reads from those KV tiers fail (fault injection)",
                    kc.fail_reads & (1u << SCHED_POOL_HOST) ? " host" : "",
                    kc.fail_reads & (1u << SCHED_POOL_DISK) ? " disk" : "");
        rc = kvtier_create(&kc, &s->tiers);
        if (rc < 0) {
            rc = seterr(rc, "KV tiers: %s", kvtier_errmsg());
            goto out;
        }
        if (s->cfg.verify_swaps && xfer_verify_init(s) < 0) {
            rc = seterr(-ENOMEM, "--verify-swaps: out of memory");
            goto out;
        }
    }
    rc = cn_start(s);
    if (rc < 0) {
        rc = seterr(rc, "constraint threads: %s", strerror(-rc));
        goto out;
    }
    /* whatever --quiet says: an operator must not mistake this daemon for a serving one */
    if (s->cfg.test.constant_prefix_key && !s->cfg.no_prefix_cache)
        svc_log("warning: --prefix-key=%s: every cached KV block has the same key, so each "
                "lookup compares the tokens of every cached block (a diagnostic for tests: "
                "outputs and hits stay the same, lookups get slower)",
                sched_prefix_key_fn_name(SCHED_PREFIX_KEY_CONSTANT));
    if (!s->cfg.quiet) {
        svc_log("model %s (%s), dim %d, %d layers, vocab %d, context %d", s->cfg.model,
                eng_model_hash(s->model), s->mcfg->dim, s->mcfg->n_layers, s->mcfg->vocab_size,
                s->mcfg->seq_len);
        char stops[64] = "";
        for (int k = 0; k < s->n_stop_tokens; k++)
            snprintf(stops + strlen(stops), sizeof stops - strlen(stops), "%s%d", k ? " " : "",
                     s->stop_tokens[k]);
        svc_log("weights %s, stop tokens %s",
                eng_wtype_name(eng_model_hparams_of(s->model)->weight_type), stops);
        svc_log("engine %s, %d threads, KV %d blocks × %d tokens (%zu bytes/block)",
                eng_backend_name(s->engine), s->cfg.threads > 0 ? s->cfg.threads : 1,
                eng_kv_blocks(s->engine), eng_kv_block_size(s->engine),
                eng_kv_block_bytes(s->engine));
        char paths[1024];
        eng_describe_paths(s->engine, paths, sizeof paths);
        if (*paths) svc_log("%s", paths);
        if (s->tiers) svc_log("%s", kvtier_describe(s->tiers));
        if (cn_kinds(s))
            svc_log("constraints: json_schema, json_object, regex, choice, grammar (tokenizer %s)",
                    s->cfg.tokenizer ? s->cfg.tokenizer : s->cfg.model);
        else
            svc_log("constraints: off (no tokenizer: start with --tokenizer to enforce them)");
        svc_log("policy %s (%s); %s", s->policy_name, s->policy_hash_hex, nd);
        if (s->cfg.metrics_listen) svc_log("metrics on port %d", metrics_port(s->mx));
        if (s->kv_events)
            svc_log("kv events on %s%s%s", kvev_endpoint(s->kv_events),
                    kvev_replay_endpoint(s->kv_events) ? ", replay on " : "",
                    kvev_replay_endpoint(s->kv_events) ? kvev_replay_endpoint(s->kv_events) : "");
        svc_log("listening on %s (doorbell %s)", lc->socket_path, dloop_doorbell_mode(s->loop));
    }
    s->stats_dirty = true;
    stats_write(s);
    rc = dloop_run(s->loop);
    if (rc < 0) seterr(rc, "event loop: %s", dloop_errmsg());
    /* Sessions are gone (on_close ran for each); finish the bookkeeping. */
    s->now_us = dloop_now_us(s->loop);
    cn_figures_t cf;
    cn_figures(s, &cf);
    if (cf.kinds && !s->cfg.quiet && (cf.compiled || cf.errors))
        svc_log("constraints: %llu compiled, %llu compile errors, %llu cache hits; %llu masks "
                "in %.1f ms on the mask thread, the loop waited %.1f ms for them; %llu rows "
                "failed",
                (unsigned long long)cf.compiled, (unsigned long long)cf.errors,
                (unsigned long long)cf.hits, (unsigned long long)cf.mask_rows,
                (double)cf.mask_us / 1e3, (double)cf.wait_us / 1e3,
                (unsigned long long)cf.row_failures);
    itlog_emit(s, 0);
    req_flush_pending(s);
    stats_write(s);
    metrics_publish(s->mx, s->now_us, 1);
out:
    cn_stop(s);
    if (s->tiers) {
        kvtier_destroy(s->tiers);
        s->tiers = NULL;
    }
    dloop_destroy(s->loop);
    s->loop = NULL;
    return rc;
}

void svc_destroy(svc *s)
{
    if (!s) return;
    req_free_all(s);
    cn_free(s);
    if (s->logs) declog_destroy(s->logs);
    if (s->mx) metrics_destroy(s->mx);
    if (s->sched) sched_set_kv_sink(s->sched, NULL, NULL);
    kvev_destroy(s->kv_events);
    if (s->sched) sched_destroy(s->sched);
    if (s->engine) eng_destroy(s->engine);
    if (s->model) eng_model_free(s->model);
    if (s->policy) sched_policy_free(s->policy);
    xfer_free(s);
    exec_free(s);
    stats_free(s);
    free(s->tenant_records);
    free(s);
}
