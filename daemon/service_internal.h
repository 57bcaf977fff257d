/* SPDX-License-Identifier: MIT */
/*
 * daemon/service_internal.h — the runner's state and the seams between its files. Private
 * to the runner (service.c and the files below); the rest of the daemon sees service.h.
 *
 *   service.c    create / run / destroy, the loop callbacks (dsvc_ops) and the iteration
 *   requests.c   request registry (id hash), per-session lists, the pending outbox and
 *                output backpressure; scheduler events → request ends
 *   admission.c  a new request's checks (wire, vocabulary, context, ids) → reject or submit
 *   execute.c    the plan → one flattened engine batch → sampled tokens; the warm-up
 *   transfers.c  KV swaps to the host/disk tiers and --verify-swaps
 *   stats.c      the stats file, the metrics gauges and the iteration log
 *
 * Ownership: each field of struct svc below is written by the file named in its section;
 * the others read it. Everything runs on the loop thread.
 */
#ifndef RINGLM_DAEMON_SERVICE_INTERNAL_H
#define RINGLM_DAEMON_SERVICE_INTERNAL_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/declog.h"
#include "daemon/kvevents.h"
#include "daemon/kvtier.h"
#include "daemon/loop.h"
#include "daemon/metrics.h"
#include "daemon/reqstate.h"
#include "daemon/service.h"
#include "kernels/batch.h"
#include "kernels/engine.h"
#include "kernels/logits.h"
#include "sched/sched.h"
#include "shm/wire.h"

/* A sequence ends when it samples one of the model's stop tokens (eng_model_stop_tokens:
 * BOS for llama2.c models, as run.c; EOS/EOT/EOM for GGUF files); it is not streamed. */
#define SVC_MAX_STOP_TOKENS          4
#define SVC_KVTIER_TAG               (DLOOP_UD_SVC | (1ull << 62))
#define SVC_HASH_BUCKETS             4096
#define SVC_MAX_REQS_PER_SESSION     1024
/* Records the loop takes from one session per iteration (the loop's own bound too). */
#define SVC_RECORDS_PER_SESSION_ITER 256
#define SVC_STATS_INTERVAL_US        20000
/* (tenant, class) series whose queue depths are recounted for the gauges */
#define SVC_MAX_SERIES               512
/* The built-in policy's per-uid tenants (uidtenants.c); one more index is "other-uids". */
#define SVC_UID_TENANTS              (SCHED_MAX_TENANTS - 1)

typedef struct svc_sess svc_sess;

/* A token's log-probabilities waiting for its event (logprobs.c): a request that asked
 * keeps them, in order, from the batch that computed them until its events are pushed. */
typedef struct svc_lp_item {
    bool prompt; /* a prompt token (EV_PROMPT), else a generated one (with its TOKEN) */
    int32_t token;
    uint32_t index; /* prompt position, or output index */
    struct ringlm_wire_logprobs lp;
} svc_lp_item;

typedef struct svc_lpq {
    svc_lp_item *items; /* a ring of cap items: n of them from head */
    uint32_t head, n, cap;
} svc_lpq;

/*
 * One request of the runner. Each field has one writer after the request is made:
 *   requests.c  the table and the session's list (id, client_id, sess, s_prev, s_next,
 *               h_next), delivery (n_pushed, o_next), the end (state through
 *               req_set_state, cancel_us, finish_us, fin_*, forced_*), what the scheduler
 *               reported (cached_tokens, has_sched_cost, sched_cost); it makes the request
 *               (series = -1) and frees it;
 *   admission.c what the request asked for, set once before the scheduler sees it (tenant,
 *               class_idx, series, the names, n_prompt, max_new, samp, lp (made, with
 *               the prompt noted), stop_ids, n_stop_ids, ignore_stop, arrival_us,
 *               deadline_us, cache_salt, the prompt in tokens[], the seed in rng, the
 *               log-probabilities asked: lp_top, plp_top, lp_processed, plp_next's start);
 *   execute.c   the generation: n_gen, tokens[] past the prompt, rng's stream, lp's counts
 *               of the generated tokens, first_token_us, last_token_us; the
 *               log-probabilities computed (plp_next, pushed into lpq, which requests.c
 *               pops as their events go out).
 * Every other file reads.
 */
typedef struct svc_req {
    uint64_t id;        /* scheduler id (daemon-wide, never reused) */
    uint64_t client_id; /* the client's id, unique in its session */
    svc_sess *sess;     /* NULL once the session is gone */
    struct svc_req *s_prev, *s_next;
    struct svc_req *h_next;
    int tenant, class_idx, series;
    char tenant_name[SCHED_NAME_MAX], class_name[SCHED_NAME_MAX];
    uint32_t n_prompt, max_new;
    uint32_t n_gen;        /* generated tokens, appended after the prompt in tokens[] */
    uint32_t n_pushed;     /* token events the client's ring accepted */
    int32_t *tokens;       /* prompt + generated: a recompute re-prefills these */
    eng_sampling samp;     /* samp.proc == lp */
    eng_logits_proc *lp;   /* bias and penalties (kernels/logits.h); NULL when neutral */
    struct svc_cons *cons; /* its constraint (constrain.c); NULL: none */
    char *detail;          /* why it ended, for a client that reads details (want_detail) */
    bool want_detail;      /* its record carried a constraint: its FINISH carries the detail */
    int32_t *stop_ids;     /* the request's own stop tokens (not subject to ignore_stop) */
    uint32_t n_stop_ids;
    uint64_t rng;
    bool ignore_stop; /* RINGLM_WIRE_REQ_F_IGNORE_STOP: only max_new ends it */
    /* log-probabilities it asked for: top n of each generated token (< 0: none), from the
     * processed distribution or the raw one; top n of each prompt token from the second
     * (< 0: none), plp_next the next prompt position whose log-probability is due */
    int8_t lp_top, plp_top;
    bool lp_processed;
    uint32_t plp_next;
    svc_lpq lpq; /* computed, not yet pushed */
    uint64_t arrival_us, deadline_us, first_token_us, last_token_us, cancel_us, finish_us;
    uint64_t scheduled_us;  /* its first start (vllm:request_queue_time_seconds), 0: never */
    uint8_t state;          /* req_state (reqstate.h): moved by req_set_state only */
    struct svc_req *o_next; /* the outbox, in the order output became ready */
    unsigned fin_reason, fin_cause;       /* RINGLM_WIRE_R_* */
    unsigned forced_reason, forced_cause; /* set before a daemon-side cancel */
    uint32_t cached_tokens; /* prompt tokens its first admission found in the prefix cache */
    uint64_t cache_salt;    /* its prefix cache domain (ut_cache_salt), for the request log */
    /* n > 1 samples of one prompt (admission.c makes them; execute.c forks them; ringlm.h
     * "n samples"): the first sample (the leader) has n_samples > 1 and computes the prompt;
     * the others are the requests of the next n_samples - 1 ids, made with it, in no
     * scheduler until the fork: the batch that samples the leader's first token draws each
     * one's first token from the same row (fork_first), then they are submitted sharing the
     * prompt's blocks through the prefix cache. forked: the leader's others have left it
     * (until then they end with it). sample_idx: a sample's index (seed + sample_idx). */
    uint32_t n_samples, sample_idx;
    bool forked, fork_first;
    bool sample_starting; /* a forked sample submitted, not started yet: its cache hit is its
                             cached prompt (requests.c) */
    /* window rings: its leader's ring as the prompt left it (taken at the fork), copied into
     * its own ring at its first entry (execute.c); NULL once copied, and for others */
    struct svc_ring_copy *ring_copy;
    /* Data, not a state: sched_cost holds a value (recorded at its first start, only when a
     * request log is written); the request log line writes null otherwise. */
    bool has_sched_cost;
    fmt_sched_cost sched_cost; /* the scheduler's cost model when it first started it, for
                                  * the request log: a replay decides with these costs */
} svc_req;

/* The runner's view of one client session (dsess_user of its dsess). */
struct svc_sess {
    dsess *ds;
    uint32_t uid;
    int tenant;
    bool trusted;
    svc_req *reqs;
    int n_reqs; /* every request not yet freed: live, and ended but undelivered */
    /* The outbox: requests with tokens or a FINISH to push, oldest first. While the event
     * ring is full (blocked) the session costs O(1) per iteration: one look at the ring's
     * free space; its submit ring is read only while it holds fewer than the session bound
     * of requests (the rest waits there, in the client's memory). */
    svc_req *out_head, *out_tail;
    svc_sess *out_prev, *out_next; /* svc.out_sessions: the sessions whose outbox is not empty */
    bool in_out_list;
    bool blocked;      /* the last push found the event ring full */
    bool bp_cancelled; /* blocked past the backpressure timeout: its requests cancelled */
    bool closing;      /* on_close is dropping it: nothing is queued for it any more */
    uint64_t blocked_since_us;
};

/*
 * Ownership. struct svc is the runner's state, one sub-struct per runner file that writes
 * it; the others read it (stats.c reads everything, for the stats file and the gauges).
 * Two exceptions, each written through one inline function below: now_us (service.c sets
 * it at the iteration's start; execute.c advances it past the batch it ran, because tokens
 * exist only then: svc_clock_advance) and the "stats changed" flag that any file raises
 * (svc_stats_changed) and service.c's iteration clears when it writes the stats file.
 */
struct svc {
    /* service.c: set up once */
    svc_config cfg;
    eng_model *model;
    eng *engine;
    const eng_model_config *mcfg;
    int32_t stop_tokens[SVC_MAX_STOP_TOKENS];
    int n_stop_tokens;
    sched_policy *policy;
    sched *sched;
    declog *logs;
    metrics *mx;
    kvev *kv_events; /* --kv-events: the publisher (NULL: none) */
    kvtier *tiers;
    dloop *loop;
    int numa_node;
    char policy_hash_hex[SCHED_HASH_HEX_LEN + 1];
    char policy_name[64];
    char served_model_name[128]; /* vLLM's model_name (service.c: served_model_name) */
    bool trace_xfer;             /* RINGLMD_TRACE_XFER: one stderr line per transfer */
    bool per_uid;                /* the built-in policy: a tenant per uid (uidtenants.c) */
    int max_tokens, max_seqs;    /* the engine's batch bounds */
    int n_tenants;

    /* service.c: each iteration */
    uint64_t now_us; /* this iteration's clock (svc_clock_advance: execute.c) */
    uint64_t n_iterations;
    /* records (requests, cancels) taken from each tenant's sessions in this iteration */
    uint32_t *tenant_records;
    bool mx_dirty;    /* metrics changed since the last forced publish */
    bool stats_dirty; /* the stats file is out of date (svc_stats_changed) */
    uint64_t stats_last_us;
    bool draining, drain_cancelled; /* drain */
    uint64_t drain_start_us;

    /* requests.c */
    struct svc_requests {
        svc_req *hash[SVC_HASH_BUCKETS];
        uint64_t next_id;
        uint64_t live;          /* requests not freed */
        svc_sess *out_sessions; /* sessions with output to push */
        req_state_audit audit;  /* illegal request state moves (req_set_state) */
        uint64_t n_finished;    /* ended other than rejected */
        /* metrics label ids of the policy's classes ([SCHED_MAX_CLASSES]: a request of no
         * class, "other"), -1 until first used: names are interned once, not per request */
        int16_t class_mlabel[SCHED_MAX_CLASSES + 1];
    } rq;

    /* uidtenants.c: the built-in policy's tenant per uid (per_uid: no --policy) */
    struct svc_uid_tenants {
        struct svc_uid_tenant {
            int tenant; /* the scheduler's index of this slot */
            uint32_t uid;
            bool bound; /* belongs to uid (until another uid takes it over) */
            bool busy;  /* scratch: its old work is not released yet */
            uint32_t sessions;
            uint64_t last_us;           /* last session opened or closed */
            char label[SCHED_NAME_MAX]; /* "uid<N>": its name in the logs and metrics */
            int16_t mlabel;             /* label's metrics id, -1 until first used */
        } slot[SVC_UID_TENANTS];
        int16_t mlabel[SCHED_MAX_TENANTS]; /* a policy tenant's metrics label id, -1: not yet */
        int8_t slot_of[SCHED_MAX_TENANTS]; /* tenant index → slot, -1 */
        int overflow;                      /* "other-uids" */
        uint64_t overflow_sessions, overflow_logged_us;
    } ut;

    /* constrain.c: the vocabulary, the grammar cache, the compile and mask threads */
    struct cn_state *cn;

    /* admission.c */
    struct svc_admission {
        uint64_t n_rejects; /* answered rejected (by its checks or the scheduler) */
    } adm;

    /* execute.c: the batch under construction and the per-sampling-row state */
    struct svc_execute {
        int bt_stride;
        eng_batch_builder bb;
        int32_t *b_out;
        eng_sampling *b_samp;
        uint64_t *b_rng;
        svc_req **b_req; /* per logits row */
        /* per logits row: a prompt row's position (-1: the sampled row), what it wants,
         * what came back, and its result (index into results) */
        int32_t *b_prompt_pos;
        int32_t *b_res;
        eng_logprob_want *b_want;
        eng_logprobs *b_lp;
        sched_result *results;
        uint64_t n_engine_errors;
        /* leaders forked by this batch: the first id of their other samples, and how many
         * (submitted to the scheduler after the commit: adm_submit_samples) */
        uint64_t *fork_id;
        uint32_t *fork_n;
        uint32_t *fork_ring; /* (window rings: the leader's ring) */
        uint32_t n_forks;
        bool rings; /* the engine keeps window rings: each entry names its ring */
        /* ring snapshots (sched_config.window_snapshots): n_snaps slots of one ring block
         * each — the positions before snap_end[slot] —; a hit restores snap_blocks of them
         * (the window) */
        unsigned char *snaps;
        uint32_t *snap_end;
        uint32_t n_snaps, snap_blocks, ring_blocks;
        size_t ring_block_bytes;
        int ring_rows; /* window rings: the most rows one sequence brings to a batch */
    } ex;

    /* transfers.c: --verify-swaps */
    struct svc_transfers {
        uint64_t *slot_sum[SCHED_POOL__COUNT]; /* checksum per tier slot, by sched_pool */
        uint8_t *busy_dev, *busy_slot[SCHED_POOL__COUNT]; /* blocks in flight */
        uint8_t *busy_dev_in; /* of busy_dev, those a swap-in is writing (a swap-out only
                                 reads its device blocks: a shared cached block may be read
                                 by two swap-outs and computed on meanwhile) */
        uint64_t n_overlap_errors, n_swap_verify_errors, n_swap_verified;
    } xf;

    /* stats.c: the stats file's and gauges' own state and the iteration log */
    struct svc_stats {
        bool write_failed; /* the stats file could not be written (said once) */
        int max_series_seen;
        uint64_t series_q_last_us;
        uint32_t *series_waiting, *series_running; /* [SVC_MAX_SERIES] recount scratch */
        /* iteration log: a batch's line waits for the next iteration's start, which gives
         * its period (what one simulator step must cost) and the wakes its publish issued */
        struct svc_iter {
            bool pending, busy;
            uint64_t it, t_us, iter_us, exec_us, wakes_before;
            uint32_t transfers;
            sched_plan_work w;
        } itl;
    } st;
};

/* ---- the two shared writes (see Ownership above) --------------------------------------- */
static inline void svc_clock_advance(svc *s, uint64_t us)
{
    s->now_us += us;
}
static inline void svc_stats_changed(svc *s)
{
    s->stats_dirty = true;
}

/* ---- logging (every runner file) ------------------------------------------------------- */
__attribute__((format(printf, 1, 2))) static inline void svc_log(const char *fmt, ...)
{
    char buf[2048]; /* one write per line; the engine's paths line runs to about 700 bytes */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ringlmd: %s\n", buf);
}

/* ---- requests.c ----------------------------------------------------------------------- */
void req_init(svc *s);
/* The metrics series of (tenant, class) policy indices (-1: none → "other"), without
 * comparing a string once both labels have been seen. */
int req_series(svc *s, int tenant, int class_idx);
svc_req *req_find(svc *s, uint64_t id);
/* The one place a request's state changes: checked against reqstate.c's table. */
void req_set_state(svc *s, svc_req *r, req_state to);
/* A new request of session ss, linked into the registry and the session's list (so every
 * path ends it through req_end and the same flush). NULL when out of memory. */
svc_req *req_new(svc *s, svc_sess *ss, uint64_t client_id);
/* A request of ss still in the registry (ended or not) with this client id, other than
 * except: the client may not reuse an id before its FINISH went out. NULL when none. */
svc_req *req_find_client(svc_sess *ss, uint64_t client_id, const svc_req *except);
/* Marks r ended with a finish reason (first one wins) and queues its FINISH. */
void req_end(svc *s, svc_req *r, unsigned reason, unsigned cause);
/* A daemon-side cancel with a wire reason the client will see. */
void req_cancel(svc *s, svc_req *r, sched_cancel_reason why, unsigned reason, unsigned cause);
/* Cancels every live request (drain past its grace period). */
void req_cancel_all(svc *s, sched_cancel_reason why, unsigned reason, unsigned cause);
/* r has output (tokens or its finish) to push: queue it in its session's outbox (and
 * cancel it when its unread tokens pass the backpressure buffer). */
void req_output_ready(svc *s, svc_req *r);
/* Pushes the outboxes into the sessions' event rings; keeps what still waits for space. */
void req_flush_pending(svc *s);
/* The daemon-side backpressure timer over blocked sessions. Returns the µs until the next
 * deadline (0: none). */
uint64_t req_check_backpressure(svc *s, uint64_t now_us);
/* Records the loop may take from ds now: < 0 paused (its events are not read), else at most
 * that many (its tenant's share of this iteration). */
int req_drain_budget(svc *s, dsess *ds);
/* Session lifecycle: open (0 or -errno to refuse it), a client cancel, close. */
int req_session_open(svc *s, dsess *ds);
void req_session_cancel(svc *s, dsess *ds, uint64_t client_id);
void req_session_close(svc *s, dsess *ds);
void req_free_all(svc *s);
/* The scheduler's event sink: logs, metrics, probes (it ends nothing). */
void req_on_sched_event(void *ctx, const sched_event *ev);
/* Ends the requests the scheduler ended in this plan (timeouts, backpressure cancels). */
void req_plan_ended(svc *s, const sched_plan *p);
/* Ends the requests that finished in the last commit (its results carry how). */
void req_commit_ended(svc *s, const sched_result *res, int n);

/* ---- uidtenants.c --------------------------------------------------------------------- */
/* The built-in policy: scheduler_section, then the per-uid tenants. false: cap too small. */
bool ut_builtin_text(char *buf, size_t cap, const char *scheduler_section);
/* After the policy is parsed (s->per_uid set): finds the slots' tenant indices. */
void ut_init(svc *s);
/* The tenant of a new session of uid (its slot, a slot taken over, or "other-uids"). */
int ut_acquire(svc *s, uint32_t uid);
/* A session of that tenant closed. */
void ut_release(svc *s, int tenant);
/* A tenant's name in the logs and metrics ("uid1000" for a bound slot). */
const char *ut_label(const svc *s, int tenant);
/* That name's metrics label id, interned on the tenant's (or the slot's uid's) first use. */
int ut_metrics_label(svc *s, int tenant);
/* The prefix cache's domain: the uid under the built-in policy, else the tenant. */
uint64_t ut_cache_salt(const svc *s, int tenant, uint32_t uid);

/* ---- admission.c ---------------------------------------------------------------------- */
void adm_on_request(svc *s, dsess *ds, const struct ringlm_wire_parsed *rec,
                    const char *tenant_tag);
/* The samples the last batch forked (s->ex.fork_*) go to the scheduler, after its commit
 * put their leader's prompt blocks into the prefix cache. */
void adm_submit_samples(svc *s);

/* The rest of admission for a request whose checks passed (constrain.c calls it once its
 * grammar is compiled): sched_submit, or the scheduler's reject. */
void adm_submit(svc *s, svc_req *r);
/* Rejects a request the scheduler never saw, with a detail (decision log, and the client's
 * FINISH when it reads details). */
void adm_reject(svc *s, svc_req *r, sched_reject_reason why_code, const char *why);

/* ---- constrain.c ---------------------------------------------------------------------- */
struct io_uring_cqe;
/* After the model: the constraint vocabulary from the tokenizer (--tokenizer, or a GGUF
 * model's own; none: constraints are not enforced). 0, or -errno with why. */
int cn_create(svc *s, char *why, size_t len);
/* With the loop (svc_run): the compile and mask threads, the compile eventfd armed. 0 or
 * -errno. cn_stop joins them (before the loop goes). */
int cn_start(svc *s);
void cn_stop(svc *s);
void cn_free(svc *s);
/* The kinds enforced (bit k: RINGLM_WIRE_CONSTRAINT_* k), for the handshake. */
uint32_t cn_kinds(const svc *s);
/* r's constraint from its record: 0 (none, or its grammar is ready: r->samp.proc carries the
 * stage), 1 (its grammar compiles: r waits, adm_submit or adm_reject follow), or < 0 with a
 * reject reason *rr and why. */
int cn_attach(svc *s, svc_req *r, const struct ringlm_wire_parsed *rec, sched_reject_reason *rr,
              char *why, size_t len);
/* Once per iteration: arms the compile eventfd's read if it is not (its SQE could not be
 * had); true while compiles are pending and it is still not armed. */
bool cn_tick(svc *s);
/* The compile eventfd's CQE: true when it was (finished compiles are handled). */
bool cn_on_cqe(svc *s, const struct io_uring_cqe *cqe);
/* A step's masks: reset, add each constrained sequence that samples, start (the mask thread
 * computes them while the engine runs), join (after the engine returned; the stage joins at
 * its first use too). */
void cn_batch_reset(svc *s);
void cn_batch_add(svc *s, svc_req *r);
void cn_batch_start(svc *s);
void cn_batch_join(svc *s);
/* Advances r's matcher by its sampled token: 0, or < 0 with why. */
int cn_accept(svc *s, svc_req *r, int32_t tok, char *why, size_t len);
/* Why r's constraint stage failed this step. */
const char *cn_row_failure(svc *s, svc_req *r);
void cn_count_row_failure(svc *s);
/* Frees r's constraint (its matcher back to its grammar's pool). */
void cn_release(svc *s, svc_req *r);
typedef struct cn_figures_t {
    uint32_t kinds, entries, compiling;
    uint64_t bytes, hits, compiled, errors, row_failures, mask_rows, mask_us, wait_us;
} cn_figures_t;
void cn_figures(const svc *s, cn_figures_t *out);

/* ---- execute.c ------------------------------------------------------------------------ */
/* Sizes max_tokens/max_seqs-bound buffers (after eng_create). 0 or -ENOMEM. */
/* logprobs.c: the queue of log-probabilities a request waits to push */
int lpq_push(svc_lpq *q, bool prompt, int32_t token, uint32_t index, const eng_logprobs *lp,
             bool processed);
const svc_lp_item *lpq_peek(const svc_lpq *q);
void lpq_pop(svc_lpq *q);
void lpq_free(svc_lpq *q);

int exec_init(svc *s);
void exec_free(svc *s);
void exec_warm_up(svc *s);
/* Drops a sample's reference to its leader's ring copy (window rings; NULL: none). */
void exec_ring_copy_put(struct svc_ring_copy *c);
/* The ring block sizes, and ring snapshot slots of one ring block each in `bytes` (window
 * rings and the prefix cache; 0: the rings' own bytes; < 0: none). 0, -ERANGE (less than
 * one ring block) or -ENOMEM. */
int exec_snap_init(svc *s, int64_t bytes);
/* Builds and runs one flattened batch from the plan's entries; fills s->results.
 * Returns the number of results (entries executed) or -errno. */
int exec_plan(svc *s, const sched_plan *p, uint64_t *exec_us);

/* ---- transfers.c ---------------------------------------------------------------------- */
/* --verify-swaps state, after the tiers exist. 0 or -ENOMEM. */
int xfer_verify_init(svc *s);
void xfer_free(svc *s);
void xfer_start(svc *s, const sched_transfer *t);
/* A prefix-cache copy of the plan (t->cache): done now, before the rest of the plan. */
void xfer_copy(svc *s, const sched_transfer *t);
/* The plan's device block copies (copy-on-write of a shared partial block), after its
 * demotions and before its batch; a request whose copy failed is failed (its entry skipped). */
void kv_copy_plan(svc *s, const sched_plan *p);
/* --verify-swaps: the entry computes on no device block a transfer still moves. */
void xfer_check_compute(svc *s, const sched_entry *e);

/* ---- stats.c -------------------------------------------------------------------------- */
int stats_init(svc *s);
void stats_free(svc *s);
void stats_write(svc *s);
void stats_update_series_queues(svc *s);
void stats_update_gauges(svc *s, uint64_t iter_us, uint32_t batch_tokens);
/* Writes the pending iteration's line. next_start_us: the start of the iteration after it
 * (0: none, e.g. at shutdown); its period is known only if the loop went straight on. */
void itlog_emit(svc *s, uint64_t next_start_us);
/* Keeps this iteration's batch line until the next iteration's start gives its period. */
/* Whether this iteration did work (the pending line's "busy" for its period). */
void itlog_busy(svc *s, bool busy);
void itlog_hold(svc *s, const sched_plan *p, uint64_t t_us, uint64_t iter_us, uint64_t exec_us,
                uint64_t wakes_before);

#endif
