/* SPDX-License-Identifier: MIT */
/*
 * sched.h — the ringlm scheduler: a pure, deterministic policy core.
 *
 * The scheduler decides, every iteration, which sequences run, how many tokens each gets,
 * who is preempted (swap or recompute, by an explicit cost model), who is admitted, who is
 * rejected or timed out — and explains every decision as an event.  It does no I/O, reads
 * no clock and starts no threads: time is an argument (`now_us`, any monotonic microsecond
 * clock the caller chooses), so the daemon and the simulator link these same objects and
 * the same inputs give the same decisions and a byte-identical event stream.  Every
 * preemption is logged with both cost estimates and the choice, and later — when its swap
 * transfers complete or its re-prefill is back where it was — with the realised cost next
 * to the prediction (swap_out/swap_in/recompute events with reason "done", predicted_us and
 * realised_us), so the decision log can check the cost model.
 *
 * Lifecycle
 *   1. sched_policy_parse()    text of a policy file (the caller reads the file) → policy
 *   2. sched_create()          policy + pools + cost model + event sink → scheduler
 *   3. per iteration:
 *        sched_submit() / sched_cancel() / sched_set_output_blocked()   (any time)
 *        plan = sched_step(now)        releases, transfers to start, batch entries
 *        ... start plan transfers, execute plan entries on the engine ...
 *        sched_commit(results)         tokens produced, finished flags, measured step time
 *        sched_transfer_done()         whenever a transfer from some plan completes
 *   4. sched_destroy(), sched_policy_free()
 *
 * Thread safety: none.  A scheduler is driven by one thread; distinct schedulers are
 * independent.  Policies are immutable after parsing and may be shared read-only.
 *
 * Errors: functions return 0 or a negative errno; sched_last_error() gives a thread-local
 * sentence naming what was wrong ("line 7: tenant \"b\": weight must be > 0, got -1").
 *
 * Tokens and positions.  A sequence has `known` tokens (prompt + generated so far) and
 * `computed` tokens whose KV is in the device cache.  An entry of the plan asks the engine
 * to process tokens [start_pos, start_pos + n_tokens) of that sequence; a decode entry is
 * n_tokens = 1 (the last sampled token); a prefill chunk is more, and after a recompute
 * preemption the re-prefill covers prompt + generated tokens.  `samples` says whether the
 * engine must sample a next token from the last row of the entry.
 */
#ifndef RINGLM_SCHED_H
#define RINGLM_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/decision_record.h"
#include "common/end_codes.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------- */
/* Limits                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* class/tenant name incl. NUL: [A-Za-z0-9_.-]{1,15}.  Equal to the wire's name field
 * (RINGLM_WIRE_NAME_LEN, asserted where both are seen), so every class and tenant a policy
 * names is one a client can request: a longer name is refused when the policy is parsed. */
#define SCHED_NAME_MAX     16
#define SCHED_MAX_CLASSES  16
#define SCHED_MAX_TENANTS  64
#define SCHED_MAX_UIDS     1024 /* uid→tenant entries plus trusted uids */
#define SCHED_HASH_HEX_LEN 16   /* hex digits of the policy hash (plus NUL in buffers) */

/* ---------------------------------------------------------------------------------------- */
/* Enums with stable string names (used in events, metrics labels, logs)                    */
/* ---------------------------------------------------------------------------------------- */

typedef enum sched_mode {
    SCHED_MODE_STATIC = 0,   /* "static": group of N or timeout, pad, hold until slowest ends */
    SCHED_MODE_DYNAMIC,      /* "dynamic": collect for a time window, run the group to the end */
    SCHED_MODE_CONTINUOUS,   /* "continuous": rebuild every step, FCFS, whole-prompt prefill,
                                  recompute preemption of the newest — today's common baseline */
    SCHED_MODE_TOKEN_BUDGET, /* "token_budget": everything in this header */
} sched_mode;

typedef enum sched_preempt_mode {
    SCHED_PREEMPT_AUTO = 0,  /* "auto": cheaper of swap/recompute by the cost model */
    SCHED_PREEMPT_SWAP,      /* "swap": swap when a host/disk pool has room, else recompute */
    SCHED_PREEMPT_RECOMPUTE, /* "recompute" */
    SCHED_PREEMPT_NONE,      /* "none": events only — a preemption that could not meet the
                                  deadline either way (a timeout follows); not a policy value */
} sched_preempt_mode;

/* Why a request was refused at submit.  Every value has a stable name (sched_reject_name). */
typedef enum sched_reject_reason {
    SCHED_REJECT_NONE = 0,       /* "none" */
    SCHED_REJECT_INVALID,        /* "invalid": prompt_len 0, max_new_tokens 0, ... */
    SCHED_REJECT_DUPLICATE,      /* "duplicate_id": id already live in this scheduler */
    SCHED_REJECT_UNKNOWN_CLASS,  /* "unknown_class" */
    SCHED_REJECT_UNKNOWN_TENANT, /* "unknown_tenant" */
    SCHED_REJECT_TOO_LONG,       /* "too_long": prompt + max_new_tokens > max_context */
    SCHED_REJECT_NEVER_FITS,     /* "never_fits": needs more KV blocks than the device pool
                                       (or the tenant's max_kv_blocks) can ever hold */
    SCHED_REJECT_TENANT_QUOTA,   /* "tenant_quota": tenant's max_queued_tokens exceeded */
    SCHED_REJECT_QUEUE_FULL,     /* "queue_full": global queue max requests/tokens */
    SCHED_REJECT_DEADLINE,       /* "deadline_infeasible": the deadline (or the class's
                                       max_queue_wait) cannot be met given the queued work and
                                       the measured prefill rate */
    /* Refused by the daemon before the scheduler saw the request: */
    SCHED_REJECT_BAD_TOKEN,  /* "bad_token": a prompt token is outside the vocabulary */
    SCHED_REJECT_BAD_PARAMS, /* "bad_params": a parameter out of range */
    SCHED_REJECT_DRAINING,   /* "draining": the daemon is shutting down */
    SCHED_REJECT_INTERNAL,   /* "internal": the daemon could not take it (out of memory) */
    SCHED_REJECT__COUNT
} sched_reject_reason;

/* Why a request was cancelled (argument of sched_cancel). */
typedef enum sched_cancel_reason {
    SCHED_CANCEL_CLIENT = 0,     /* "client_cancel" */
    SCHED_CANCEL_DISCONNECT,     /* "disconnect": client died / session ended */
    SCHED_CANCEL_BACKPRESSURE,   /* "backpressure": output blocked longer than allowed */
    SCHED_CANCEL_SHUTDOWN,       /* "shutdown" */
    SCHED_CANCEL_KV_READ_FAILED, /* "kv_read_failed": reloading its cached prefix from the
                                       host or disk tier failed (the client sees error /
                                       internal) */
    SCHED_CANCEL_ENGINE_ERROR,   /* "engine_error": the engine failed the batch holding it,
                                       or its plan entry could not be executed (the client
                                       sees error / internal) */
    SCHED_CANCEL__COUNT
} sched_cancel_reason;

/* Why a runnable request did not get work this step (defer events). */
typedef enum sched_defer_reason {
    SCHED_DEFER_NONE = 0,
    SCHED_DEFER_BUDGET,       /* "budget": token budget of the step spent */
    SCHED_DEFER_BLOCKS,       /* "blocks": not enough free device KV blocks */
    SCHED_DEFER_QUOTA,        /* "quota": tenant's max_kv_blocks reached */
    SCHED_DEFER_RATE,         /* "rate": tenant's token rate exhausted */
    SCHED_DEFER_MAX_ACTIVE,   /* "max_active": max active sequences reached */
    SCHED_DEFER_BACKPRESSURE, /* "output_backpressure": client not reading its output */
    SCHED_DEFER_BATCH,        /* "batch": static/dynamic mode waiting for its group, or
                                    token_budget gathering a burst (burst_gather) */
    SCHED_DEFER__COUNT
} sched_defer_reason;

/* Why a request timed out. */
typedef enum sched_timeout_reason {
    SCHED_TIMEOUT_QUEUE_WAIT = 0, /* "queue_wait": waited longer than its class allows */
    SCHED_TIMEOUT_DEADLINE,       /* "deadline": its absolute deadline passed */
    SCHED_TIMEOUT_PREEMPT,        /* "deadline_infeasible": preempted and neither swap nor
                                       recompute could bring it back before its deadline */
    SCHED_TIMEOUT__COUNT
} sched_timeout_reason;

typedef enum sched_finish_reason {
    SCHED_FINISH_NONE = 0, /* not finished */
    SCHED_FINISH_STOP,     /* "stop": stop token (reported by the caller) */
    SCHED_FINISH_LENGTH,   /* "length": max_new_tokens or max_context reached */
} sched_finish_reason;

typedef enum sched_pool {
    SCHED_POOL_DEVICE = 0, /* "device" */
    SCHED_POOL_HOST,       /* "host" */
    SCHED_POOL_DISK,       /* "disk" */
    SCHED_POOL__COUNT
} sched_pool;

/* Why a cached KV block left its pool (prefix cache, DESIGN §10; cache_evict events). */
typedef enum sched_prefix_evict_reason {
    SCHED_PREFIX_EVICT_DEMAND = 0, /* "demand": its pool needed free blocks */
    SCHED_PREFIX_EVICT_TENANT_CAP, /* "tenant_cap": its tenant held more than max_cached_blocks */
    SCHED_PREFIX_EVICT_ORPHAN,     /* "orphan": a block above it was dropped; no lookup can
                                       reach it any more */
    SCHED_PREFIX_EVICT_MOVED,      /* "moved": it now lives in a hotter pool (reload, or a
                                       recomputed copy inserted); the old copy is free */
    SCHED_PREFIX_EVICT_CLEAR,      /* "clear": the cache was emptied */
    SCHED_PREFIX_EVICT_FAILED,     /* "failed": the copy that put it there failed (its bytes
                                       are not the block's) */
    SCHED_PREFIX_EVICT__COUNT
} sched_prefix_evict_reason;

/* The order a class's waiting requests are taken in, once its class and tenant are chosen
 * (class key prefix_order; DESIGN §10). */
typedef enum sched_prefix_order {
    SCHED_PREFIX_ORDER_FCFS = 0, /* "fcfs": oldest arrival first */
    SCHED_PREFIX_ORDER_LONGEST,  /* "longest_prefix": the request with the longest cached
                                       prompt prefix first (oldest on a tie), except that a
                                       request waiting prefix_max_wait or longer goes first,
                                       oldest first: aging bounds every wait */
    SCHED_PREFIX_ORDER__COUNT
} sched_prefix_order;

/* Stable names ("token_budget", "queue_full", ...).  Out-of-range values give "?". */
const char *sched_mode_name(sched_mode m);
const char *sched_prefix_order_name(sched_prefix_order o);
const char *sched_preempt_mode_name(sched_preempt_mode m);
const char *sched_reject_name(sched_reject_reason r);
const char *sched_cancel_name(sched_cancel_reason r);
const char *sched_defer_name(sched_defer_reason r);
const char *sched_timeout_name(sched_timeout_reason r);
const char *sched_finish_name(sched_finish_reason r);
const char *sched_pool_name(sched_pool p);
const char *sched_prefix_evict_name(sched_prefix_evict_reason r);

/* How a request ended, as its client and the request logs (daemon and simulator alike) say
 * it: the one vocabulary of finish reasons (< 16) and causes (>= 16: why it was rejected,
 * cancelled or failed).  Values, names and meanings come from the one table,
 * common/end_codes.h, as the wire's codes do, so a code passes between the two unchanged. */
#define SCHED_END_ENUM(suffix, value, name, doc) SCHED_END_##suffix = (value),
typedef enum sched_end_code {
    END_CODES(SCHED_END_ENUM) SCHED_END__MAX = END_CODES_MAX,
} sched_end_code;
#undef SCHED_END_ENUM

/* Name of an end code ("length", "queue_full"); "unknown" for a code not listed. */
const char *sched_end_name(unsigned code);
/* The cause a client and the request log see for a scheduler reject / cancel / timeout
 * (0 = none beyond the finish reason). */
sched_end_code sched_reject_cause(sched_reject_reason r);
sched_end_code sched_cancel_cause(sched_cancel_reason r);
sched_end_code sched_timeout_cause(sched_timeout_reason r);

/* What a schedule event or a realised-cost record (swap_out, swap_in, recompute) says. */
typedef enum sched_outcome {
    SCHED_OUTCOME_NONE = 0,  /* no reason: a planned transfer or re-prefill */
    SCHED_OUTCOME_START,     /* "start": schedule, first time on the device */
    SCHED_OUTCOME_RESUME,    /* "resume": schedule, back after a preemption */
    SCHED_OUTCOME_DONE,      /* "done": the way back completed */
    SCHED_OUTCOME_FAILED,    /* "failed": a transfer failed */
    SCHED_OUTCOME_ABANDONED, /* "abandoned": ended or preempted again first */
    SCHED_OUTCOME_DAMAGED,   /* "damaged": a transfer failed because a block read back from a
                                tier was not the one written there, or the tier file ended
                                before it (status -EBADMSG, -ENODATA): not used, recomputed */
    SCHED_OUTCOME__COUNT
} sched_outcome;
const char *sched_outcome_name(sched_outcome o); /* NONE → NULL */

/* Thread-local description of the last error returned by any sched_* function. */
const char *sched_last_error(void);

/* ---------------------------------------------------------------------------------------- */
/* Policy                                                                                   */
/* ---------------------------------------------------------------------------------------- */
/*
 * Text format (see sched/example.policy, which explains every knob): INI-style sections
 *   [scheduler]          global knobs
 *   [class NAME]         one per class
 *   [tenant NAME]        one per tenant (uids = 1000 1001 maps those uids to it)
 *   [trust]              uids = 0 1000     — uids allowed to name a tenant per request
 * `key = value`; `#` or `;` starts a comment (at line start or after whitespace); durations
 * take a unit (`250us`, `20ms`, `2s`; a bare number is microseconds); booleans are
 * yes/no/true/false/on/off/1/0.  Unknown sections or keys, duplicate keys, duplicate names,
 * bad numbers and out-of-range values are errors with the line number and the reason.
 * With no [class] section a class "default" exists; with no [tenant] section a tenant
 * "default" exists and is the default tenant.
 *
 * Canonical form: every knob written explicitly with its value (defaults filled in), fixed
 * key order, classes and tenants sorted by name, uid lists sorted, durations in `us`.  Two
 * files that mean the same thing (comments, spacing, order, units, defaults spelt out or
 * not) have the same canonical text and therefore the same 64-bit hash (FNV-1a 64 of the
 * canonical text).
 */
typedef struct sched_policy sched_policy; /* opaque, immutable after parse */

typedef struct sched_policy_error {
    int line;         /* 1-based line of the first error, 0 = not line-bound */
    char reason[200]; /* e.g. "key \"weight\": expected a number > 0, got \"x\"" */
} sched_policy_error;

typedef struct sched_class_cfg {
    char name[SCHED_NAME_MAX];
    int32_t priority;           /* higher runs first; default 0 */
    double aging_per_s;         /* priority points gained per second of waiting; default 1 */
    uint64_t ttft_target_us;    /* goal for first token (0 = none); stats count met/missed */
    uint64_t tpot_target_us;    /* goal per output token (0 = none); while a sequence of
                                       this class decodes, prefill per step is capped so the
                                       predicted step time stays under it (one chunk minimum) */
    uint64_t max_queue_wait_us; /* waiting longer → timeout "queue_wait" (0 = unbounded);
                                       admission rejects ("deadline_infeasible") when the
                                       predicted wait exceeds 85% of it (less after
                                       queue-wait timeouts: sched_group_stats.admit_headroom)
                                       — the headroom absorbs the estimate's error, so overload
                                       ends in rejects at admission, not in timeouts later.
                                       The prediction: queued prompt tokens of classes at least
                                       as important / the prefill rate measured while work
                                       waited (over wall time, the caller's time between
                                       steps included; last ~0.5 s; the step model before
                                       there is history), and at least the age of the oldest
                                       waiting */
    bool latency_sensitive;     /* decodes first, uses the decode reserve */
    /* prefix cache (DESIGN §10): the order within the class — fcfs (default) or
     * longest_prefix, which prefers the waiting request whose prompt has the longest cached
     * prefix (it needs mode token_budget, where the cache runs).  prefix_max_wait bounds
     * how long a request can be passed over for that: one that has waited this long is
     * taken before any request that has not, in arrival order — at any queue length.
     * Default 1s, or half of max_queue_wait when that is shorter; it must be > 0 and below
     * max_queue_wait (else it would never apply: the request times out first). */
    sched_prefix_order prefix_order;
    uint64_t prefix_max_wait_us;
} sched_class_cfg;

typedef struct sched_tenant_cfg {
    char name[SCHED_NAME_MAX];
    double weight;              /* fair-share weight (> 0); default 1 */
    uint64_t max_queued_tokens; /* prompt tokens waiting, 0 = unlimited */
    uint32_t max_kv_blocks;     /* device KV blocks held at once, 0 = unlimited */
    double token_rate_per_s;    /* prefill+output tokens per second, 0 = unlimited
                                       (token bucket with one second of burst) */
    /* prefix cache (DESIGN §10): the cache domain — tenants naming the same domain share
     * cached prompt blocks (e.g. a gateway's users sharing a system prompt); default the
     * tenant's own name, so no two tenants share unless the policy says so */
    char cache_domain[SCHED_NAME_MAX];
    /* each client uid of the tenant a cache domain of its own within it (default no): uids
     * that share a tenant (default_tenant's unmapped uids, or [tenant] uids = ...) share its
     * cached prompts otherwise, so one can tell from a fast first token what another sent */
    bool cache_per_uid;
    uint32_t max_cached_blocks; /* cached blocks no sequence holds that this tenant
                                       inserted, kept at most (oldest dropped); 0 = unlimited */
} sched_tenant_cfg;

typedef struct sched_policy_cfg {
    sched_mode mode;                  /* default token_budget */
    uint32_t token_budget;            /* tokens per step (decode + prefill); 512 */
    uint32_t max_active_seqs;         /* sequences holding device KV; 256 */
    uint32_t prefill_chunk;           /* max prefill tokens per sequence per step; 256 */
    uint32_t decode_reserve_tokens;   /* budget held back from prefill while
                                                 latency-sensitive sequences decode; 0 */
    double kv_charge_per_block_s;     /* virtual tokens charged per block-second; 1 */
    sched_preempt_mode preemption;    /* default auto */
    uint64_t min_residency_us;        /* not preempted again sooner after resume */
    uint32_t max_preemptions;         /* per request; 0 = unlimited; default 4 */
    uint32_t queue_max_requests;      /* global waiting requests, 0 = unlimited */
    uint64_t queue_max_tokens;        /* global waiting prompt tokens, 0 = unlimited */
    uint32_t static_batch_size;       /* static mode: group size N; 8 */
    uint64_t static_batch_timeout_us; /* static mode: start a short group after */
    uint64_t dynamic_window_us;       /* dynamic mode: collection window */
    uint64_t backpressure_timeout_us; /* output blocked this long → cancel; 0 = never */
    /* token_budget: with nothing running, the first step of new prompts waits while more
     * keep arriving less than burst_gather apart, at most burst_gather_max after the first
     * (sched_plan.hold_until_us); 0 = start at once (default) */
    uint64_t burst_gather_us;
    uint64_t burst_gather_max_us; /* default 4 × burst_gather */
    int32_t default_class;        /* index, requests naming no class */
    int32_t default_tenant;       /* index, or -1: unmapped uids are refused */
} sched_policy_cfg;

/* Parse policy text (NUL-terminated).  On success *out is a new policy (free with
 * sched_policy_free).  Errors: -EINVAL (err->line/err->reason say where and why; err may be
 * NULL), -ENOMEM. */
int sched_policy_parse(const char *text, sched_policy **out, sched_policy_error *err);
void sched_policy_free(sched_policy *p);

const sched_policy_cfg *sched_policy_get(const sched_policy *p);
int sched_policy_n_classes(const sched_policy *p);
const sched_class_cfg *sched_policy_class(const sched_policy *p, int idx); /* NULL if bad */
int sched_policy_n_tenants(const sched_policy *p);
const sched_tenant_cfg *sched_policy_tenant(const sched_policy *p, int idx); /* NULL if bad */
/* Index by name; -ENOENT when absent (name NULL → the default class / default tenant,
 * -ENOENT if there is no default tenant). */
int sched_policy_class_index(const sched_policy *p, const char *name);
int sched_policy_tenant_index(const sched_policy *p, const char *name);

/* The tenant a connecting uid belongs to: its mapped tenant, else the default tenant;
 * -ENOENT when unmapped and the policy has no default tenant (the daemon refuses it). */
int sched_policy_tenant_for_uid(const sched_policy *p, uint32_t uid);
/* A trusted uid (a gateway) may name the tenant per request. */
bool sched_policy_uid_trusted(const sched_policy *p, uint32_t uid);
/* The trusted uids ([trust] uids), sorted: their number, *uids pointing at them (owned by
 * the policy). */
uint32_t sched_policy_trusted_uids(const sched_policy *p, const uint32_t **uids);
/* The prefix-cache salt of a tenant's cache domain (sched_request.cache_salt): a non-zero
 * hash of the domain name, so tenants in one domain get one salt, the salt of a domain does
 * not change when other tenants are added, and a replay of a logged run finds the same keys.
 * 0 for a bad index. */
uint64_t sched_policy_cache_salt(const sched_policy *p, int tenant);
/* The salt of a request of client uid in tenant: the domain's, or, when the tenant has
 * cache_per_uid, one of that uid's own within the domain. 0 for a bad index. */
uint64_t sched_policy_cache_salt_uid(const sched_policy *p, int tenant, uint32_t uid);

/* Canonical text (owned by the policy, valid while it lives), its hash and the hash as 16
 * lowercase hex digits (owned by the policy). */
const char *sched_policy_canonical(const sched_policy *p);
uint64_t sched_policy_hash(const sched_policy *p);
const char *sched_policy_hash_hex(const sched_policy *p);

/* ---------------------------------------------------------------------------------------- */
/* Events                                                                                   */
/* ---------------------------------------------------------------------------------------- */

typedef enum sched_event_kind {
    SCHED_EV_ADMIT = 0,    /* accepted into the queue: prompt_tokens, max_tokens */
    SCHED_EV_REJECT,       /* refused at submit: reason, prompt_tokens, max_tokens */
    SCHED_EV_DEFER,        /* runnable but not served: reason (emitted when the reason changes,
                             not every step) */
    SCHED_EV_SCHEDULE,     /* got device KV and work: blocks, wait_us; reason "start"|"resume" */
    SCHED_EV_PREEMPT,      /* mode, blocks, swap_cost_us, recompute_cost_us, reason
                             ("blocks"|"quota"); mode "none" when neither way could meet its
                             deadline and a timeout event follows instead */
    SCHED_EV_SWAP_OUT,     /* transfer planned: xfer, blocks, bytes, pool (destination).
                             Again with reason "done"|"failed" when it completes (realised
                             cost, see below): mode "swap", predicted_us = the transfer's
                             predicted_us, realised_us = its measured duration */
    SCHED_EV_SWAP_IN,      /* transfer planned: xfer, blocks, bytes, pool (source).
                             Again with reason "done"|"failed" when it completes: mode "swap",
                             predicted_us = swap_cost_us estimated at the preemption (the round
                             trip), realised_us = measured swap-out + swap-in durations */
    SCHED_EV_RECOMPUTE,    /* re-prefill starts: tokens (context to recompute).
                             Again with reason "done" when the re-prefill has computed the
                             length it had when preempted (tokens = that length), or
                             "abandoned" when it ends or is preempted again first: mode
                             "recompute", predicted_us = recompute_cost_us estimated at the
                             preemption, realised_us = summed FULL durations of the steps the
                             re-prefill took part in (sched_commit's step_duration_us; the
                             sequence waited for the whole step, so no share-by-tokens) */
    SCHED_EV_CANCEL,       /* reason (sched_cancel_name) */
    SCHED_EV_TIMEOUT,      /* reason (sched_timeout_name), wait_us */
    SCHED_EV_FINISH,       /* reason ("stop"|"length"), output_tokens, prompt_tokens,
                             wait_us = time to first token (JSON key "ttft_us"), policy
                             (hash hex) */
    SCHED_EV_RELEASE,      /* blocks, pool; one event per pool that held blocks */
    SCHED_EV_CACHE_HIT,    /* prefix cache (sched_config.prefix_cache): at admission the
                             request's longest cached prefix was shared — blocks, pool (where
                             they were: device), cached_tokens, self_tokens (of those, blocks
                             it had computed itself before a recompute preemption),
                             prompt_tokens (tokens looked up: its known length) */
    SCHED_EV_CACHE_EVICT,  /* cached blocks no sequence held were given up so this request
                             could grow: blocks, pool, evict (reason); for reason "demand"
                             the demotion test that dropped them instead of keeping them in a
                             colder pool: swap_cost_us = reload cost per block (-1: no colder
                             pool, or it had no room), recompute_cost_us per block,
                             expected_reuse (the largest of the dropped blocks') */
    SCHED_EV_CACHE_DEMOTE, /* cached blocks no sequence held moved to a colder pool (device →
                             host → disk) because reload_cost < recompute_cost × expected
                             reuse: blocks, pool (from), to_pool, xfer, bytes, swap_cost_us
                             (reload per block), recompute_cost_us (per block),
                             expected_reuse (the smallest of the demoted blocks').  Again with
                             reason "done"|"failed" when the copy completed: predicted_us
                             (the transfer's estimate), realised_us (measured) */
    SCHED_EV_CACHE_RELOAD, /* at admission, a run of the request's cached prefix on host or
                             disk: mode "swap" (reloaded over a transfer) or "recompute"
                             (prefilled again), chosen by the cost model: blocks, pool
                             (where they are), tokens, swap_cost_us (reload estimate: queued
                             bytes and these over the tier's bandwidth, plus latency),
                             recompute_cost_us (prefill of those tokens); xfer and bytes when
                             reloaded.  Again with reason "done"|"failed" when the reload
                             completed: predicted_us = swap_cost_us, realised_us (measured);
                             for a recompute, "done" when the prefill has computed the run
                             (or "abandoned" if the request lost its blocks first):
                             predicted_us = recompute_cost_us, realised_us = the summed full
                             durations of the steps in between (sched_commit's) */
    SCHED_EV__COUNT
} sched_event_kind;

const char *sched_event_name(sched_event_kind k); /* "admit", "reject", ... */

/* One decision.  Strings point into the scheduler/policy and are valid during the callback
 * only; copy what you keep.  Fields not listed for a kind above are zero/NULL.  The reason is
 * typed, one field per kind (sched_event_reason_name gives the stable name of the one that
 * applies); names exist only in the writers. */
typedef struct sched_event {
    uint64_t t_us;
    sched_event_kind kind;
    uint64_t req;
    const char *tenant;
    const char *class_name;
    int tenant_idx, class_idx;    /* the policy's indices of tenant and class_name; -1 when
                                     the event names none (a reject before either resolved) */
    sched_reject_reason reject;   /* REJECT */
    const char *detail;           /* REJECT: the caller's words (sched_note_reject), else NULL */
    sched_defer_reason defer;     /* DEFER; PREEMPT: what it made room for (BLOCKS|QUOTA) */
    sched_cancel_reason cancel;   /* CANCEL */
    sched_timeout_reason timeout; /* TIMEOUT */
    sched_finish_reason finish;   /* FINISH: STOP or LENGTH */
    sched_outcome outcome;        /* SCHEDULE: START|RESUME; SWAP_OUT/SWAP_IN/RECOMPUTE:
                                           DONE|FAILED|ABANDONED on the realised-cost record,
                                           NONE when planned */
    sched_preempt_mode mode;      /* PREEMPT: SWAP|RECOMPUTE|NONE; realised-cost records:
                                           SWAP or RECOMPUTE */
    sched_pool pool;              /* RELEASE, SWAP_OUT, SWAP_IN */
    const char *policy;           /* finish: policy hash hex */
    uint32_t blocks;
    uint32_t tokens; /* recompute: context tokens */
    uint32_t prompt_tokens;
    uint32_t max_tokens;
    uint32_t output_tokens;
    uint64_t wait_us;
    uint64_t xfer; /* transfer id */
    uint64_t bytes;
    double swap_cost_us; /* preempt: estimates (swap -1 when no pool has room) */
    double recompute_cost_us;
    /* realised cost (swap_out/swap_in/recompute with a reason): every preemption's decision
     * is logged with both estimates, and these later records say what the way back really
     * cost, so the cost model can be checked.  realised_us -1 (JSON null) when a duration
     * was not measured (0 passed to sched_commit / sched_transfer_done). */
    double predicted_us;
    double realised_us;
    /* prefix cache: CACHE_HIT (see above); FINISH: cached_tokens = prompt tokens its first
     * admission found cached (JSON key only when > 0) */
    sched_prefix_evict_reason evict; /* CACHE_EVICT */
    uint32_t cached_tokens;
    uint32_t self_tokens;
    /* CACHE_HIT: of cached_tokens, those found in each pool (host and disk ones reloaded);
     * CACHE_DEMOTE: the destination pool; CACHE_EVICT / CACHE_DEMOTE: the demotion test's
     * expected reuse of a block */
    uint32_t pool_tokens[SCHED_POOL__COUNT];
    sched_pool to_pool;
    double expected_reuse;
} sched_event;

typedef void (*sched_event_fn)(void *ctx, const sched_event *ev);

/* The stable name of ev's reason (the typed field its kind uses: "queue_full", "budget",
 * "start", "done", ...), or NULL when the event has none (admit, release, a planned
 * transfer or re-prefill). */
const char *sched_event_reason_name(const sched_event *ev);

/* The decision-log line of ev as plain data (DESIGN.md §5): the keys its kind carries, its
 * names from the tables above.  The scheduler writes no JSON; formats/decision.c
 * (fmt_decision_format) is the one writer of the log, for the daemon and the simulator.
 * Pure; the record's strings are ev's or static. */
void sched_event_record(const sched_event *ev, decision_record *out);

/* ---------------------------------------------------------------------------------------- */
/* Scheduler                                                                                */
/* ---------------------------------------------------------------------------------------- */

typedef struct sched sched; /* opaque */

typedef struct sched_tier_cost {
    double out_bytes_per_s; /* device → tier (initial estimate; refined by completions) */
    double in_bytes_per_s;  /* tier → device */
    double latency_us;      /* per transfer */
} sched_tier_cost;

/* ---- the step model ---------------------------------------------------------------------- */
/*
 * How long one iteration takes, as one linear model over the batch's work (sched_plan_work,
 * sim/FORMATS.md): the scheduler predicts with it, the simulator charges its steps with it,
 * perf/calibrate and the simulator fit it (sched_lsq), the daemon starts from it.
 *   step_us = base_us + prefill_token_us * prefill_tokens + decode_seq_us * decode_seqs
 *           + context_token_us * context_tokens + prefill_pair_us * prefill_pairs
 * The last term is prefill attention (each prompt row attends to every row before it); the
 * linear model of FORMATS.md leaves it out (0).
 */
#define SCHED_STEP_TERMS 5 /* base, prefill_tokens, decode_seqs, context_tokens, prefill_pairs */

typedef struct sched_step_model {
    double base_us;
    double prefill_token_us;
    double decode_seq_us;
    double context_token_us;
    double prefill_pair_us;
} sched_step_model;

/* The documented built-in (sim/FORMATS.md): a Llama-3-8B shape in bf16 on one H200, derived
 * from spec numbers (DESIGN.md §4 anchors), not measured.  What the simulator uses without a
 * calibration file and what the daemon starts from before it has measured a step. */
void sched_step_model_default(sched_step_model *m);

/* ---------------------------------------------------------------------------------------- */
/* Least squares: the one solver of the step model (and of every small linear cost model)    */
/* ---------------------------------------------------------------------------------------- */

#define SCHED_LSQ_MAX_TERMS 8

/* Weighted linear least squares over n rows of k <= SCHED_LSQ_MAX_TERMS regressors
 * (x[i * k + j]), targets y[i] and weights w[i] (NULL: all 1; a weight 0 leaves a row out).
 * Only the terms in fit_mask are fitted (the others come out 0), and a term whose regressor is
 * 0 on every weighted row is left out.  Terms in nonneg_mask must come out >= 0: every subset
 * of the fitted terms is solved and the lowest weighted residual among those with no negative
 * constrained term wins, fewer terms on a tie (relative 1e-12) — the exact non-negative least
 * squares optimum, affordable for k this small.  Columns are scaled to a unit diagonal and a
 * pivot below 1e-11 (a term that is a combination of the others) fails that subset.
 * Returns 0 with beta[0..k), *used (may be NULL) the terms fitted and *wsse (may be NULL) the
 * weighted residual sum of squares; -1 when nothing could be fitted. */
int sched_lsq(const double *x, const double *y, const double *w, size_t n, int k, unsigned fit_mask,
              unsigned nonneg_mask, double *beta, unsigned *used, double *wsse);

typedef struct sched_config {
    uint32_t kv_blocks_device;   /* > 0 */
    uint32_t kv_blocks_host;     /* 0 = no host tier */
    uint32_t kv_blocks_disk;     /* 0 = no disk tier */
    uint32_t block_size;         /* tokens per block, > 0 */
    uint64_t kv_bytes_per_token; /* all layers K+V, > 0 */
    uint32_t max_context;        /* prompt + max_new_tokens limit, > 0 */
    /* Initial step model (perf/calibrate's step_model, sim/FORMATS.md).  A measured step time
     * (sched_commit) corrects it continuously (EWMA of measured / predicted), so the model
     * tracks reality.  prefill_token_us must be > 0, the other terms finite and >= 0. */
    sched_step_model step;
    sched_tier_cost host; /* used when kv_blocks_host > 0 */
    sched_tier_cost disk; /* used when kv_blocks_disk > 0 */
    /* Prefix cache (DESIGN §10, sched/prefix.h), token_budget mode: a request submitted with
     * its tokens keeps its full blocks cached after it ends (finished, cancelled, timed out,
     * recompute-preempted) — its prompt's, and those its generated tokens filled when
     * sched_commit was given their ids (sched_result.token); a later request with the same prefix in the same
     * cache domain (cache_salt) shares them on the device and starts its prefill at the
     * first token not covered (never past the last prompt token: that one is always
     * computed, to sample from).  Cached blocks no sequence holds are evicted (oldest leaf
     * first) whenever free blocks are short; they count as free in sched_counts.  With a
     * host or disk pool an evicted block is demoted to the next colder pool (events
     * cache_demote, a cache transfer in the plan) when that pool has room and the cost
     * model says a reload beats recomputing it (reload < recompute × expected reuse), else
     * dropped (cache_evict); a prefix found on host or disk at admission is reloaded or
     * recomputed, run by run, whichever the cost model predicts cheaper (cache_reload; the
     * recompute side counts the stall on the running sequences, a reload runs beside the
     * steps): a reloading request waits in SWAPPING_IN for its copies, as a swap-in does,
     * and its prefill starts when they are in.  A block being reloaded is shared with no
     * other request before it arrived. */
    bool prefix_cache;
    /* The caller gives each sampled token's id in sched_commit (sched_result.has_token and
     * token): the blocks generated tokens fill are cached too.  false: prompt blocks only
     * (the results' token fields are not read). */
    bool prefix_cache_generated;
    /* Every layer of the model attends to the last attention_window positions only (a
     * sliding window on every layer, as Mistral 7B v0.1's; 0: no window).  A running
     * sequence then gives back, at each sched_commit, the device blocks wholly behind the
     * window of its next position p (block k once (k + 1) * block_size <= p -
     * attention_window): its block table keeps SCHED_BLOCK_NONE in those entries, which the
     * engine never reads, so a sequence holds about ceil(window / block_size) + 1 blocks
     * however long it grows (a prefill chunk of n tokens: those of window + n).  Swaps move
     * the blocks held, so a windowed sequence's swap costs and moves that much; a
     * recompute re-prefills from position 0 (an upper layer's K/V depend on positions
     * layers x window back) holding only the window's blocks as it goes.  With the prefix
     * cache, a windowed sequence caches its prompt's blocks (it holds that chain until it
     * ends: a cached block stays held while a block below it is) and not its generated
     * ones.  Token-budget mode allocates a start's first chunk only; continuous and
     * static/dynamic modes allocate as without a window and give blocks back the same. */
    uint32_t attention_window;
    /* A model with windowed and global layers run with window rings (gemma2, gemma3; the
     * engine's eng_kv_rings; 0: none): the device blocks hold the global layers' K/V, and a
     * sequence holding device blocks holds one ring too, the windowed layers' K/V of its last
     * window, from its first block to its last (sched_entry.ring).  A start waits (defer
     * "blocks") while every ring is held.  A swap moves the ring with the blocks: out to
     * the host or disk tier beside them and back into whichever ring is free at the
     * swap-in (sched_transfer.ring).  With the prefix cache, a sample's first start
     * (sched_request.sample) finds its prompt's cached blocks: the n samples of one prompt
     * share its global blocks, and the caller gives each sample, at its first entry, a copy
     * of its first sample's ring as it was when the prompt was computed.  Any other request
     * finds a cached prefix only where ring snapshots (window_snapshots) cover the window
     * before its end. */
    uint32_t window_rings;
    /* Ring snapshots (with window_rings and the prefix cache; 0: none): this many slots,
     * each one ring block — the windowed layers' K/V of one cached block, kept with it
     * (the caller sizes the count from its byte budget and holds the bytes).  Each block a
     * sequence's entry completes (prompt or answer) is copied into a slot after its batch
     * (sched_plan's ring_snapshots) unless a slot holds its key; a later request's cached
     * prefix is cut back to the longest whose last window_snapshot_blocks blocks all have
     * one, on the device, and its first entry's plan restores them into its ring before the
     * batch (the records with `restore`).  So the second request behind a shared system
     * prompt hits it, as does the same prompt again and a conversation's next turn (past
     * the answer).  A snapshot goes when its block leaves the device (dropped or demoted),
     * or, every slot used, by segmented LRU: the least recently used one no hit has used
     * goes first, else the least recently used one a hit has (at most half are those);
     * never one an admitted request waits on. */
    uint32_t window_snapshots;
    /* The blocks before a cached prefix's end whose snapshots a hit restores: those a
     * windowed layer can still read, ceil(window / block_size) (> 0 with window_snapshots). */
    uint32_t window_snapshot_blocks;
    /* Bytes of one window ring (> 0 when window_rings and a host or disk tier): a swap
     * moves them in ceil(window_ring_bytes / (block_size × kv_bytes_per_token)) tier slots
     * beside the blocks, and the cost model charges them. */
    uint64_t window_ring_bytes;
    /* The step model's attention terms on a model with windowed layers (sched_plan's
     * context_tokens and the prefill pairs): step_window_layers of every step_layers layers
     * read the last step_window positions only, so a sequence at context c is charged
     * (global layers × c + windowed layers × min(c, step_window)) / step_layers, and a
     * prefill row at position p its min(p, step_window) pairs on the windowed layers.
     * 0: attention_window on every layer where that is set, else the whole context. */
    uint32_t step_window;
    uint32_t step_window_layers, step_layers; /* step_layers 0: every layer windowed */
} sched_config;

/* A block-table entry a windowed sequence gave back (sched_config.attention_window). */
#define SCHED_BLOCK_NONE UINT32_MAX

/* ---- KV-cache events: the prefix cache's contents, as data --------------------------------
 *
 * Every change to which blocks the prefix cache holds where, told to a sink the caller sets
 * (sched_set_kv_sink) the moment the index changes, from inside the sched_* call that made
 * it: a block stored in a pool (a sequence filled it, or it was demoted or reloaded there),
 * a block removed from a pool (dropped, demoted or reloaded away, or its copy failed).  A
 * subscriber that applies them in order holds the index's set of (pool, key) — the blocks
 * a lookup can find.  The sink is called on the scheduler's thread and must not call back
 * into the scheduler; the tokens pointer is valid during the call only. */
typedef enum sched_kv_event_kind {
    SCHED_KV_STORED = 0, /* key now cached in pool: tokens[0..n_tokens), under parent */
    SCHED_KV_REMOVED,    /* key left pool */
    SCHED_KV_CLEARED,    /* forget every block (sched_kv_announce starts with it) */
} sched_kv_event_kind;

typedef struct sched_kv_event {
    sched_kv_event_kind kind;
    sched_pool pool;
    uint64_t key_lo, key_hi;       /* the block's key (sched_prefix_key: domain-salted) */
    bool has_parent;               /* STORED: false for a prompt's first block */
    uint64_t parent_lo, parent_hi; /* STORED: the parent block's key */
    const int32_t *tokens;         /* STORED: the block's token ids */
    uint32_t n_tokens;             /* STORED: block_size */
    uint16_t tenant;               /* the tenant index that inserted it */
} sched_kv_event;

typedef void (*sched_kv_event_fn)(void *ctx, const sched_kv_event *e);

/* Create a scheduler.  The policy is copied (the caller may free its own).  sink may be NULL
 * (no events).  seed drives the only randomness (none today beyond id tie-breaks; kept so a
 * future randomized policy stays reproducible).  Errors: -EINVAL (a config field named in
 * sched_last_error), -ENOMEM. */
int sched_create(const sched_policy *policy, const sched_config *cfg, sched_event_fn sink,
                 void *sink_ctx, uint64_t seed, sched **out);
void sched_destroy(sched *s);

/* The KV-cache event sink (NULL: none); no effect without the prefix cache. */
void sched_set_kv_sink(sched *s, sched_kv_event_fn fn, void *ctx);
/* Tells the sink the whole index afresh: one CLEARED, then one STORED per block a lookup can
 * find, every parent before its children (a subscriber that lost events resynchronises on
 * it).  O(index).  Returns the STORED count. */
uint32_t sched_kv_announce(sched *s);
/* Blocks a lookup can find, all pools (how many STORED sched_kv_announce would tell). */
uint32_t sched_kv_cached_blocks(const sched *s);

typedef struct sched_request {
    uint64_t id;             /* unique among live requests */
    int32_t tenant;          /* tenant index, or -1: look up tenant_name */
    const char *tenant_name; /* used when tenant < 0; NULL → default tenant */
    int32_t class_idx;       /* class index, or -1: look up class_name */
    const char *class_name;  /* used when class_idx < 0; NULL → default class */
    uint32_t prompt_len;     /* > 0 */
    uint32_t max_new_tokens; /* > 0 */
    uint64_t deadline_us;    /* absolute, 0 = none */
    uint64_t arrival_us;     /* when it reached the caller (≤ now_us); 0 → now_us */
    /* prefix cache: the prompt's token ids (prompt_len of them; copied) and its cache domain.
     * NULL tokens: this request neither uses nor fills the cache.  The salt must come from
     * who the caller knows the client to be (the daemon: the tenant from SO_PEERCRED),
     * never from the client: two salts never share a block. */
    const int32_t *tokens;
    uint64_t cache_salt;
    /* A further sample of a request already admitted (n > 1 samples of one prompt,
     * admitted all or nothing with the first): the queue, tenant-quota and deadline checks,
     * made when the group came, are not made again, so no sample is refused once the first
     * was taken.  Its tokens are the prompt and, usually, its first token drawn from the
     * first sample's last prompt row (prompt_len counts that token): its prompt blocks come
     * from the prefix cache, where the first sample put them. */
    bool sample;
    /* With sample: the id of its group's first sample (0: none).  The prefix cache shares
     * full blocks only; the prompt's last partial block (its tokens past the last full block)
     * is shared copy-on-write: from this submit the sample holds a reference to the first
     * sample's block, which therefore stays on the device whatever that one does next (ends,
     * is preempted, swapped), and its first write into it — its first step — copies it
     * (plan copies; or takes it over when it is the block's last holder), so those tokens
     * are not computed again and count as cached.  It takes effect only when the first sample
     * holds that block computed at the submit and its tokens match; otherwise the sample
     * computes them, as without it. */
    uint64_t sample_of;
    /* The first sample of n_samples (0 and 1: a request alone; token_budget mode).  The group
     * is admitted all or nothing: the first sample starts only when its blocks and each
     * other sample's blocks for its start (its first token's row: the copy of the partial
     * block, or a new block) are available together — else the group waits together —
     * and those are then reserved for the others (no other admission or swap-in takes
     * them) until they are submitted (sample_of this one) and start, so no sample of an
     * admitted group waits for blocks another admission took.  What the others did not
     * claim by the step after the first token is released. */
    uint32_t n_samples;
} sched_request;

/* Submit.  Returns 0 when admitted to the queue (event "admit"), else a negative errno and
 * *reason (may be NULL) says why (event "reject" with the same reason):
 *   -EINVAL invalid / unknown_class / unknown_tenant,  -EEXIST duplicate_id,
 *   -E2BIG too_long / never_fits,  -EAGAIN tenant_quota / queue_full (transient),
 *   -ETIME deadline_infeasible. */
int sched_submit(sched *s, const sched_request *req, uint64_t now_us, sched_reject_reason *reason);

/*
 * A request the caller refused before submitting it (the daemon's own checks: a bad token,
 * a parameter out of range, draining, out of memory, a tenant or class not in the policy):
 * the scheduler takes nothing, but counts the reject in its tenant's and class's stats and
 * emits it as a REJECT event with `why` and `detail` (the caller's words, may be NULL), so
 * every reject reaches the one event stream (decision log, metrics, the simulator's report).
 * q names the request as for sched_submit (tenant and class by index or by name; names not
 * in the policy are reported as given).  0, or -EINVAL (no scheduler or request, why NONE
 * or out of range).
 */
int sched_note_reject(sched *s, const sched_request *q, sched_reject_reason why, const char *detail,
                      uint64_t now);

/* Cancel a live request: event "cancel" now; its KV blocks (every pool) are released at the
 * start of the next sched_step (listed in plan->releases, events "release"), or when its
 * in-flight transfer completes.  -ENOENT when the id is not live. */
int sched_cancel(sched *s, uint64_t id, uint64_t now_us, sched_cancel_reason reason);

/* Backpressure: while blocked the sequence is not scheduled (defer "output_backpressure");
 * blocked longer than the policy's backpressure_timeout → cancelled with reason
 * "backpressure".  -ENOENT when the id is not live. */
int sched_set_output_blocked(sched *s, uint64_t id, bool blocked, uint64_t now_us);

/* ---- the plan ---------------------------------------------------------------------------- */

typedef struct sched_entry {
    uint64_t req;
    uint32_t start_pos; /* first position processed */
    uint32_t n_tokens;  /* 1 for decode, a chunk for prefill / re-prefill */
    bool samples;       /* sample a token from the last row of this entry */
    bool prefill;       /* n_tokens > 1 or first token of a prompt */
    uint16_t tenant;    /* index */
    uint16_t class_idx;
    uint32_t n_blocks;      /* device block table covering start_pos + n_tokens */
    const uint32_t *blocks; /* physical device block ids, valid until the next step;
                               SCHED_BLOCK_NONE where a windowed sequence gave a block back
                               (only before the window of start_pos) */
    uint32_t ring;          /* its window ring (sched_config.window_rings), or
                               SCHED_BLOCK_NONE without rings */
} sched_entry;

/* A ring snapshot (sched_config.window_snapshots) to copy: ring block (end / block_size -
 * 1) mod ring blocks — the block of positions [end - block_size, end) — between ring `ring`
 * and snapshot slot `slot`.  restore: into the ring, before any entry of the plan runs (the
 * first entry of req starts at its cached prefix's end, at or after `end`); else into the
 * slot, once the batch ran (`end` inside the rows of req's entry). */
typedef struct sched_ring_snapshot {
    uint64_t req;
    uint32_t ring, slot, end;
    bool restore;
} sched_ring_snapshot;

typedef struct sched_release {
    uint64_t req;
    uint32_t blocks[SCHED_POOL__COUNT]; /* blocks freed per pool by this release */
    sched_event_kind why;               /* SCHED_EV_FINISH, _CANCEL or _TIMEOUT */
} sched_release;

typedef enum sched_xfer_dir { SCHED_XFER_OUT = 0, SCHED_XFER_IN = 1 } sched_xfer_dir;

typedef struct sched_transfer {
    uint64_t id; /* report with sched_transfer_done */
    uint64_t req;
    sched_xfer_dir dir; /* OUT: device → tier; IN: tier → device */
    sched_pool tier;    /* SCHED_POOL_HOST or SCHED_POOL_DISK */
    uint32_t n_blocks;
    const uint32_t *src; /* OUT: device ids, IN: tier ids   (valid until next step) */
    const uint32_t *dst; /* OUT: tier ids,   IN: device ids */
    uint64_t bytes;      /* n_blocks * block_size * kv_bytes_per_token (+ a window ring's) */
    double predicted_us; /* the cost model's duration, incl. what is queued ahead */
    /* A prefix-cache copy: a demotion to a colder pool (OUT, req 0) or a reload to the
     * device (IN, req = the request it is for).  A demotion: the scheduler's books already
     * show the blocks where the copy puts them and their sources free, so the caller
     * completes it, in the plan's order, before it starts any later transfer of the plan or
     * executes its entries (a later copy or entry may reuse a block it read).  A reload is
     * like a swap-in: its request waits for it (in no entry until every reload of it
     * completed; the cached blocks it reads stay where they are, held, until then) and the
     * caller may complete it at any time later.  src_pool is where an OUT copy reads: the
     * device, or the host for a host → disk demotion (tier = disk). */
    bool cache;
    sched_pool src_pool;
    /* A swap of a sequence holding a window ring (sched_config.window_rings): the ring moves
     * too, window_ring_bytes between device ring `ring` (OUT: the one it held; IN: the one
     * it resumes on) and the tier slots ring_slots[0..n_ring_slots) — the ring's bytes in
     * order, a block's bytes a slot, the last slot partly used; `bytes` counts them.
     * n_ring_slots 0: no ring (ring and ring_slots are not set). */
    uint32_t ring;
    uint32_t n_ring_slots;
    const uint32_t *ring_slots; /* (valid until next step) */
} sched_transfer;

typedef struct sched_preemption {
    uint64_t req;
    sched_preempt_mode mode; /* SWAP (see transfers) or RECOMPUTE (blocks freed now) */
    uint32_t blocks;         /* device blocks it held */
    double swap_cost_us;     /* -1 when no tier had room */
    double recompute_cost_us;
} sched_preemption;

typedef struct sched_ended {
    uint64_t req;
    sched_event_kind kind;        /* SCHED_EV_TIMEOUT or SCHED_EV_CANCEL (backpressure) */
    sched_timeout_reason timeout; /* kind TIMEOUT: why */
    sched_cancel_reason cancel;   /* kind CANCEL: why (BACKPRESSURE) */
} sched_ended;

/* A block copy in the device pool (copy-on-write of a shared partial block, sched_request
 * sample_of): src's KV to dst, whole block, before the entries of the plan execute. */
typedef struct sched_copy {
    uint64_t req; /* the request that gets dst */
    uint32_t src, dst;
} sched_copy;

typedef struct sched_plan {
    uint64_t now_us;
    uint64_t step_no; /* 1, 2, ... */
    /* (a) releases since the previous step (finished, cancelled, timed out) */
    const sched_release *releases;
    uint32_t n_releases;
    /* (b) the batch: decode entries first, then prefill chunks */
    const sched_entry *entries;
    uint32_t n_entries;
    uint32_t n_decode, n_prefill; /* entries of each kind */
    uint32_t decode_tokens, prefill_tokens;
    uint32_t pad_tokens; /* static mode: padding the group computes anyway */
    /* sum over entries of their context, start_pos + n_tokens, as the step model charges it
     * (a windowed layer reads min(context, window): sched_config.step_window) */
    uint64_t context_tokens;
    double prefill_pairs;     /* prefill attention pairs, charged the same way */
    double predicted_step_us; /* the cost model's estimate for this batch */
    /* (c) transfers to start now */
    const sched_transfer *transfers;
    uint32_t n_transfers;
    /* (d) preemptions decided this step */
    const sched_preemption *preemptions;
    uint32_t n_preemptions;
    /* (e) requests ended by the scheduler this step (timeouts, backpressure cancels) */
    const sched_ended *ended;
    uint32_t n_ended;
    /* (f) device block copies, in order: done after the plan's cache demotions (a copy's
     * dst may be a block a demotion read) and before its entries execute (the entry of
     * copy.req reads dst); src is held until the copy is planned, so no entry of this plan
     * writes it before */
    const sched_copy *copies;
    uint32_t n_copies;
    /* (g) burst_gather: no entries because the first step of a burst waits for the rest of
     * it; step again at this time, or as soon as another request is submitted (0: not
     * holding) */
    uint64_t hold_until_us;
    /* (h) ring snapshots: the `restore` ones before any entry runs, the others (takes)
     * after the batch */
    const sched_ring_snapshot *ring_snapshots;
    uint32_t n_ring_snapshots;
} sched_plan;

/* What a batch costs to compute, as the step-time model sees it (sim/FORMATS.md): the same
 * numbers for the daemon's iteration log and the simulator's step, from one definition. */
typedef struct sched_plan_work {
    uint64_t prefill_tokens; /* prefill rows incl. static padding */
    uint32_t prefill_seqs;   /* prefill chunks */
    uint32_t decode_seqs;
    uint64_t context_tokens; /* the plan's: its entries' contexts, windows charged */
    double prefill_pairs;    /* the plan's: sum over chunks of n*start_pos + n(n-1)/2, prefill
                              * attention (a windowed layer's rows read a window at most) */
    double decode_context;   /* sum over decode rows of start_pos + n_tokens */
} sched_plan_work;

void sched_plan_work_of(const sched_plan *p, sched_plan_work *w);

/* The step model's regressors of w, in the order of the model's terms (1 for the base). */
void sched_plan_work_terms(const sched_plan_work *w, double x[SCHED_STEP_TERMS]);
/* The step model's time for w, in µs. */
double sched_step_model_us(const sched_step_model *m, const sched_plan_work *w);

/* Decide one iteration at now_us (must not go backwards: an earlier value is treated as the
 * previous one).  The returned plan and every array in it stay valid until the next
 * sched_step or sched_destroy.  Never fails for a valid scheduler; returns NULL only if s is
 * NULL or memory ran out (sched_last_error). */
const sched_plan *sched_step(sched *s, uint64_t now_us);

/* ---- results ----------------------------------------------------------------------------- */

typedef struct sched_result {
    uint64_t req;                 /* an entry of the last plan */
    uint32_t tokens;              /* tokens produced (0 or 1) by a sampling entry */
    sched_finish_reason finished; /* STOP when a stop token came; LENGTH is also inferred */
    /* The produced token's id (has_token).  With the prefix cache the full blocks its
     * generated tokens fill are cached too, keyed like prompt blocks (a multi-turn
     * conversation's next prompt extends the last prompt and its answer): that needs every
     * generated token's id.  A request with one result without it caches only the blocks
     * before its first unknown token. */
    bool has_token;
    int32_t token;
} sched_result;

/* Commit the outcome of the last plan: one result per executed entry, any order; an entry
 * without a result was not executed and will be planned again.  Finished sequences release
 * their blocks now (events "finish", "release"; listed again in the next plan's releases).
 * On return every result's `finished` says how its request ended in this commit: STOP,
 * LENGTH (given, or inferred from max_new_tokens / max_context) or NONE (still live, or an
 * id this commit ignored) — with sched_cancel's return and the plan's `ended`, the caller
 * learns of every end without an event sink.
 * step_duration_us (0 = unknown) corrects the cost model.  Results for ids not in the last
 * plan (e.g. cancelled meanwhile) are ignored.  Errors: -EINVAL (s NULL or results NULL with
 * n > 0). */
int sched_commit(sched *s, sched_result *results, size_t n, uint64_t now_us,
                 uint64_t step_duration_us);

/* A transfer from some plan completed.  status 0 = done; < 0 = failed: a failed swap-out
 * turns into a recompute preemption, a failed swap-in into a recompute of the context
 * (-EBADMSG / -ENODATA: its blocks came back damaged; logged with outcome "damaged").
 * bytes/duration_us (0 = unknown) refine that tier's bandwidth estimate for that direction.
 * -ENOENT when the transfer id is unknown or already completed. */
int sched_transfer_done(sched *s, uint64_t transfer_id, uint64_t now_us, uint64_t bytes,
                        uint64_t duration_us, int status);

/* ---- queries ----------------------------------------------------------------------------- */

typedef struct sched_counts {
    uint32_t waiting;       /* queued, not holding device KV (incl. recompute-preempted) */
    uint32_t running;       /* holding device KV and schedulable */
    uint32_t swapped;       /* KV parked on host/disk */
    uint32_t in_transit;    /* KV moving (swap out or in) */
    uint32_t blocked;       /* running but output-blocked */
    uint64_t queued_tokens; /* prompt tokens waiting */
    uint32_t kv_total[SCHED_POOL__COUNT];
    uint32_t kv_used[SCHED_POOL__COUNT]; /* used + free == total, always; used = held by
                                              sequences (or in transit) */
    uint32_t kv_free[SCHED_POOL__COUNT];
    uint64_t steps;
    double cost_correction; /* measured / modelled step time (EWMA), 1 = model exact */
    /* realised vs predicted, so the cost model can be checked (transfers with a measured
     * duration only) */
    uint64_t transfers_measured;
    double transfer_predicted_us_sum, transfer_measured_us_sum;
    /* prefix cache: cached blocks no sequence holds (counted in kv_free: evictable at once),
     * and since creation the prompt tokens looked up at admission, found cached (all; of
     * those, a resumed sequence's own) and the cached blocks evicted */
    uint32_t kv_cached[SCHED_POOL__COUNT];
    uint64_t prefix_query_tokens, prefix_hit_tokens, prefix_self_tokens, prefix_evicted_blocks;
    /* per pool: cached blocks in all (held or not), hit tokens found there (self or cross),
     * blocks demoted into it, blocks reloaded from it, runs found there recomputed instead */
    uint32_t prefix_blocks[SCHED_POOL__COUNT];
    uint64_t prefix_hit_pool_tokens[SCHED_POOL__COUNT], prefix_self_pool_tokens[SCHED_POOL__COUNT];
    uint64_t prefix_demoted_blocks[SCHED_POOL__COUNT], prefix_reloaded_blocks[SCHED_POOL__COUNT];
    uint64_t prefix_recomputed_blocks[SCHED_POOL__COUNT];
    /* ring snapshots (sched_config.window_snapshots): slots holding one ring block (taken
     * or being taken), and since creation blocks taken, hits that restored some, blocks
     * dropped (their cached block left the device, or replaced) */
    uint32_t ring_snapshots;
    uint64_t ring_snapshots_taken, ring_snapshot_hits, ring_snapshots_dropped;
} sched_counts;

void sched_get_counts(const sched *s, sched_counts *out);

/* The transfer cost the scheduler plans with for a tier (SCHED_POOL_HOST or _DISK): each
 * direction's bandwidth is the configured guess until a transfer in that direction
 * completed, then the measured one (EWMA) — the daemon's only bandwidth estimate (its
 * metrics show this one).  *measured_out / *measured_in (may be NULL): measured yet.
 * 0, or -EINVAL for the device pool or an unknown pool. */
int sched_get_tier_cost(const sched *s, sched_pool pool, sched_tier_cost *out, bool *measured_out,
                        bool *measured_in);

/* Where the cost model stands: the step model it predicts from, the measured correction of
 * it, and each tier's transfer estimate.  Every cost decision weighs these (demote or drop,
 * reload or recompute, swap or recompute, the predicted wait).  A replay of a daemon's run
 * (ringlm-sim --trace of its request log) sets what the daemon recorded at each admission,
 * so it decides with the costs the daemon measured instead of its own model's. */
typedef struct sched_cost_state {
    sched_step_model step;
    double correction;                       /* measured / modelled step time (EWMA) */
    sched_tier_cost tier[SCHED_POOL__COUNT]; /* [HOST], [DISK] (all 0: no such tier);
                                                   [DEVICE] unused, 0 */
    bool out_measured[SCHED_POOL__COUNT], in_measured[SCHED_POOL__COUNT];
    /* a copy in that direction completed: the
                                                   bandwidth is measured, not the guess */
} sched_cost_state;

void sched_get_cost_state(const sched *s, sched_cost_state *out);

/* Replaces the cost model's state; what it learns later refines the values set (a bandwidth
 * set as measured averages a later measurement in, a guess is replaced by it).  A tier given as all
 * 0, or one this scheduler lacks, is left as it is.  -EINVAL (the field named in
 * sched_last_error) for a step model sched_create would refuse, a correction not finite and
 * > 0, or a tier's bandwidths not > 0 or its latency < 0; nothing is changed then. */
int sched_set_cost_state(sched *s, const sched_cost_state *in);

/* Per tenant and per class accounting (same struct; virtual_tokens only for tenants). */
typedef struct sched_group_stats {
    uint64_t queued_requests, queued_tokens; /* now */
    uint32_t running, kv_blocks;             /* now (kv_blocks: device) */
    uint64_t admitted, finished;
    uint64_t served_prompt_tokens; /* prefill tokens computed (incl. recompute) */
    uint64_t served_output_tokens;
    double virtual_tokens; /* tenant fair-share counter */
    uint64_t preemptions_swap, preemptions_recompute;
    uint64_t rejects[SCHED_REJECT__COUNT];
    uint64_t timeouts[SCHED_TIMEOUT__COUNT];
    uint64_t cancels[SCHED_CANCEL__COUNT];
    uint64_t ttft_met, ttft_missed; /* vs the class target (classes only) */
    uint64_t tpot_met, tpot_missed;
    double admit_headroom; /* classes: admission admits while the predicted wait is at
                                   most this share of max_queue_wait (0.30..0.85; shrinks on
                                   queue-wait timeouts, recovers while starts are quick) */
} sched_group_stats;

int sched_get_tenant_stats(const sched *s, int tenant, sched_group_stats *out); /* -ENOENT */

/* Hands a tenant index to a new owner (the daemon's per-uid tenants of its built-in policy
 * are a fixed set of indices bound to uids as they come): its fair-share counter restarts
 * level with the lowest of the other tenants' — the new owner neither inherits the old
 * owner's debt nor gets credit to burst past everyone — its token bucket is full and its
 * stats restart at zero.  0; -ENOENT no such tenant; -EBUSY while the tenant has a request
 * that is not released yet or holds blocks (the old owner's work is not done). */
int sched_tenant_recycle(sched *s, int tenant);
int sched_get_class_stats(const sched *s, int class_idx, sched_group_stats *out);

typedef enum sched_req_state {
    SCHED_REQ_WAITING = 0,
    SCHED_REQ_RUNNING,
    SCHED_REQ_SWAPPING_OUT,
    SCHED_REQ_SWAPPED,
    SCHED_REQ_SWAPPING_IN,
    SCHED_REQ_ENDED, /* ended, release pending */
} sched_req_state;

typedef struct sched_req_info {
    sched_req_state state;
    int32_t tenant, class_idx;
    uint32_t prompt_len, generated, computed; /* known = prompt_len + generated */
    uint32_t blocks[SCHED_POOL__COUNT];
    uint32_t preemptions;
    uint64_t arrival_us, first_token_us; /* 0 = no token yet */
    bool output_blocked;
    uint32_t cached_tokens; /* prompt tokens its first admission found cached */
    /* entries of its device block table given back behind the attention window
     * (SCHED_BLOCK_NONE; not counted in blocks[]) */
    uint32_t released_blocks;
} sched_req_info;

int sched_get_request(const sched *s, uint64_t id, sched_req_info *out); /* -ENOENT */

/* The policy the scheduler runs (its own copy). */
const sched_policy *sched_get_policy(const sched *s);

/* Check every internal invariant: per pool used + free == total, every block owned by
 * exactly one live sequence or free, per-tenant block and queue counters equal the sums of
 * their sequences, nothing in transit counted free, a block-table entry given back only
 * behind its sequence's attention window.  0 when all hold, else -EUCLEAN and
 * `why` (may be NULL) describes the first violation.  O(total state): for tests. */
int sched_check_invariants(const sched *s, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif /* RINGLM_SCHED_H */
