/* ringlm — simulator discrete-event core: drives sched/ with a trace and a service model. SPDX-License-Identifier: MIT */
#ifndef RINGLM_SIM_ENGINE_H
#define RINGLM_SIM_ENGINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "sched/sched.h"
#include "sim/service.h"
#include "sim/stats.h"
#include "sim/trace.h"

enum sim_retry { SIM_RETRY_NONE = 0, SIM_RETRY_IMMEDIATE, SIM_RETRY_BACKOFF };

typedef struct sim_options {
    const sched_policy *policy;
    const char *policy_name; /* for reports (file name) */
    const sim_service *svc;
    uint32_t max_context;                  /* prompt + max new tokens limit given to sched */
    int retry;                             /* enum sim_retry */
    int64_t retry_backoff_us;              /* first backoff; doubles per attempt */
    uint32_t retry_max;                    /* attempts in all, including the first */
    int64_t sample_us;                     /* time-series interval */
    int64_t idle_poll_us;                  /* re-step interval while work waits but nothing runs */
    int64_t stall_stop_us;                 /* stop when live work made no progress this long */
    double step_scale;                     /* what-if: every step takes this times the model (1) */
    double step_overhead_us;               /* added to every step: the daemon loop's own cost per
                                            iteration (rings, events, logs), which the engine
                                            calibration does not see (0) */
    uint64_t check_every;                  /* run sched_check_invariants every N steps (0: never) */
    FILE *decision_log;                    /* JSON lines of sched events, or NULL */
    bool prefix_cache;                     /* requests with block hashes share cached prefixes, in
                                            the cache domains of the policy (on by default, as
                                            in ringlmd) */
    uint32_t kv_blocks_device;             /* what-if: device KV blocks instead of the service
                                            model's (0: the model's) */
    bool recorded_costs;                   /* a trace that recorded its scheduler's cost model
                                            (a daemon's request log: sched_cost) decides with
                                            it — a waiting request's own record while it is
                                            the next in the recorded admission order, else
                                            the last admitted one's — instead of the service
                                            model's, and its copies
                                            take the time its measured tier bandwidths say
                                            (on by default) */
    bool tier_bw_given[SCHED_POOL__COUNT]; /* a what-if link speed
                                            (--host-kv-bw, --disk-kv-bw): used even where a
                                            recorded bandwidth exists */
    uint64_t seed;
} sim_options;

void sim_options_defaults(sim_options *o);

/* Time-series columns (one row per sample_us), then one cumulative served-token column per
 * trace tenant. */
enum sim_ts_col {
    SIM_TS_T_S = 0,
    SIM_TS_WAITING,
    SIM_TS_RUNNING,
    SIM_TS_SWAPPED,
    SIM_TS_IN_TRANSIT,
    SIM_TS_KV_DEVICE,
    SIM_TS_KV_HOST,
    SIM_TS_KV_DISK,
    SIM_TS_KV_DEVICE_PCT,
    SIM_TS_STEPS,
    SIM_TS_TOKENS_PER_STEP,
    SIM_TS_FIXED_COLS
};

typedef struct sim_run {
    const sim_trace *trace;
    sim_options opt;
    sim_rec *recs; /* attempts; sched request id = index + 1 */
    size_t n_recs, cap_recs;
    uint32_t *final_rec; /* per trace request: its last attempt */
    int tenant_map[SIM_MAX_NAMES], class_map[SIM_MAX_NAMES]; /* trace → policy */
    /* totals */
    uint64_t steps, entries, prefill_tokens, decode_tokens, pad_tokens, slot_capacity;
    uint64_t transfers_out, transfers_in, bytes_out, bytes_in;
    uint64_t cache_copies_waited; /* prefix-cache copies the loop did before a step */
    double cache_copy_wait_us;    /* time steps started late, waiting for those copies */
    double busy_us, max_step_us, max_decode_step_us;
    int64_t sim_end_us;
    double wall_s;
    size_t still_live;         /* live at the end (stopped by stall_stop_us) */
    uint64_t invariant_checks; /* sched_check_invariants calls that passed */
    /* time series */
    double *ts;
    size_t ts_rows, ts_cap, ts_cols;
    uint64_t served_by_tenant[SIM_MAX_NAMES];
    /* identity */
    char policy_hash[SCHED_HASH_HEX_LEN + 1];
    char policy_name[256];
    char mode[32];
    sched_counts final_counts;
    char warnings[1024];
    sched_cost_state *costs; /* sim_rec.cost_idx */
    size_t n_costs, cap_costs;
} sim_run;

/* Replay t through a scheduler created from o->policy. out is filled (free with
 * sim_run_free) even on error. Returns 0, or -errno (detail in sim_err()). */
int sim_run_trace(const sim_trace *t, const sim_options *o, sim_run *out);
void sim_run_free(sim_run *r);

#endif
