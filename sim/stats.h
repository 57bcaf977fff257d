/* ringlm — simulator statistics: per-request records → per-tenant / per-class metrics. SPDX-License-Identifier: MIT */
#ifndef RINGLM_SIM_STATS_H
#define RINGLM_SIM_STATS_H

#include <stddef.h>
#include <stdint.h>

enum sim_outcome {
    SIM_OUT_PENDING = 0, /* still live when the simulation stopped */
    SIM_OUT_FINISHED,
    SIM_OUT_REJECTED,  /* refused at submit (reason: sched_reject_reason) */
    SIM_OUT_TIMEOUT,   /* ended by the scheduler (reason: sched_timeout_reason) */
    SIM_OUT_CANCELLED, /* client cancel / disconnect (reason: sched_cancel_reason) */
};

/* One submission attempt of a request (a retry is a new attempt of the same request). */
typedef struct sim_rec {
    uint32_t req;             /* index of the request in the trace */
    uint32_t attempt;         /* 1 = first submission */
    int64_t submit_us;        /* this attempt reached the scheduler */
    int64_t seen_us;          /* the step start at which the simulated loop saw it (>= submit_us) */
    int64_t first_sched_us;   /* first plan entry (queue wait ends), or -1 */
    int64_t first_token_us;   /* end of the step that produced the first token, or -1 */
    int64_t end_us;           /* finished / rejected / timed out / cancelled, or -1 */
    int64_t cancel_us;        /* when the client's cancel reached the scheduler, or -1 */
    int64_t release_us;       /* when its KV blocks were released (plan releases), or -1 */
    int64_t last_progress_us; /* last step that gave it work (or its submission) */
    int64_t last_token_us;
    int64_t max_starve_us;        /* longest span runnable without progress */
    int64_t max_itl_us;           /* longest gap between two output tokens */
    uint32_t generated;           /* output tokens */
    uint32_t tokens_after_cancel; /* output tokens from steps that started after its cancel */
    uint64_t prefill_done;        /* prefill tokens computed (recompute included) */
    uint32_t cached_tokens;       /* prompt tokens its first admission found in the prefix cache */
    uint32_t cost_idx;            /* the scheduler's cost model at first_sched_us: sim_run.costs
                                    [cost_idx - 1] (0: none), for the request log */
    uint16_t preempt_swap, preempt_recompute;
    uint8_t outcome; /* enum sim_outcome */
    uint8_t reason;  /* enum of the sched reason for the outcome */
    uint8_t live;    /* submitted and not ended yet */
    uint8_t retried; /* rejected or timed out, and the client tried again */
} sim_rec;

/* Latency distribution in milliseconds (percentiles interpolate linearly between ranks, as
 * numpy's default, so they match ../shared/traces/README.md's method). */
typedef struct sim_dist {
    size_t n;
    double mean, p50, p90, p99, max;
} sim_dist;

/* Fills d from v[0..n) (sorted in place). */
void sim_dist_of(double *v, size_t n, sim_dist *d);
/* Percentile q in [0,1] of sorted v. */
double sim_percentile(const double *sorted, size_t n, double q);

/* Jain's fairness index of x[0..n): (Σx)² / (n Σx²); 1 = equal. n == 0 → 1. */
double sim_jain(const double *x, size_t n);

/* Max-min (water-filling) fair share of `total` among n parties with weights and demands:
 * nobody gets more than it asked for, the rest is shared by weight. share[i] out. */
void sim_fair_share(double total, const double *weight, const double *demand, size_t n,
                    double *share);

#endif
