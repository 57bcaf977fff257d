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

/* What-if: a model of windowed and global layers (ringlm-sim --window-pattern): `windowed`
 * of every `period` layers attend to the last `window` positions, the others to all. Run as
 * ringlmd runs gemma2/gemma3 files with window rings (sched_config.window_rings): the
 * global layers' K/V in the blocks, the windowed layers' in a ring per running sequence.
 * window 0: none. */
typedef struct sim_window_pattern {
    uint32_t window, windowed, period;
    uint32_t rings; /* rings (0: ringlmd's default, as many as the blocks hold ring lengths) */
} sim_window_pattern;

/* The device KV pools of a window pattern, in the memory of `blocks` blocks of every layer:
 * rings of ring_blocks blocks of the windowed layers, and the global layers' blocks in the
 * rest. */
typedef struct sim_window_layout {
    uint32_t blocks;          /* the global layers' blocks */
    uint32_t bytes_per_token; /* the global layers' K/V bytes a position */
    uint32_t rings, ring_blocks, ring_rows;
    uint64_t ring_bytes;
} sim_window_layout;

/* The layout ringlmd gives pattern wp under policy pc: a ring of ceil((window + rows) /
 * block_size) + 1 blocks (rows: the prefill chunk in token-budget mode, else the batch),
 * at most a whole context's (max_context); `rings` of them (0: blocks / ring_blocks, 1 to
 * max_active_seqs); the global layers' blocks in the bytes of the `blocks` blocks of every
 * layer (bytes_per_token a position) that the rings leave. Returns 0, or -EINVAL (reason in
 * sim_err()) for a pattern without a global or a windowed layer or rings that leave no
 * block. */
int sim_window_layout_of(const sim_window_pattern *wp, const sched_policy_cfg *pc, uint32_t blocks,
                         uint32_t block_size, uint32_t bytes_per_token, uint32_t max_context,
                         sim_window_layout *out);

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
    sim_window_pattern window_pattern;     /* what-if (window 0: every layer global) */
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
    uint32_t kv_blocks_device; /* the device blocks the scheduler had */
    sim_window_layout window;  /* with opt.window_pattern.window */
    char warnings[1024];
    sched_cost_state *costs; /* sim_rec.cost_idx */
    size_t n_costs, cap_costs;
} sim_run;

/* Replay t through a scheduler created from o->policy. out is filled (free with
 * sim_run_free) even on error. Returns 0, or -errno (detail in sim_err()). */
int sim_run_trace(const sim_trace *t, const sim_options *o, sim_run *out);
void sim_run_free(sim_run *r);

#endif
