/* ringlm — simulator: the prefix cache's report (DESIGN §10). SPDX-License-Identifier: MIT */
#ifndef RINGLM_SIM_PREFIX_REPORT_H
#define RINGLM_SIM_PREFIX_REPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#include "sim/engine.h"
#include "sim/trace.h"

/* What the cache did in one run: tokens looked up and found (cross-request and a resumed
 * sequence's own), per tier (host and disk hits were reloaded), blocks demoted into each
 * tier, runs found on host or disk and recomputed instead, blocks evicted, prefill tokens
 * computed, and how long steps waited for the cache's copies. */
typedef struct sim_prefix_figures {
    uint64_t query_tokens, hit_tokens, self_tokens, cross_tokens, evicted_blocks;
    uint64_t hit_tokens_tier[SCHED_POOL__COUNT];
    uint64_t cross_tokens_tier[SCHED_POOL__COUNT]; /* of hit_tokens_tier, other requests' blocks */
    /* What requests found when first admitted (a resumed sequence's own blocks, and a second
     * admission's hits, left out): prompt_tokens of the requests with block hashes, those
     * found cached (sim_rec.cached_tokens, each attempt's first admission), their ratio. */
    uint64_t prompt_tokens, prompt_hit_tokens;
    double prompt_hit_rate;
    uint64_t demoted_blocks[SCHED_POOL__COUNT], reloaded_blocks[SCHED_POOL__COUNT];
    uint64_t recomputed_blocks[SCHED_POOL__COUNT];
    double copy_wait_ms;
    uint64_t prefill_tokens;     /* computed (recompute included) */
    double hit_rate;             /* hit / query tokens */
    int64_t recorded_hit_tokens; /* the trace's own cached_tokens summed (a real run's request
                                     log: what the daemon found), -1 when it records none */
} sim_prefix_figures;

void sim_prefix_figures_of(const sim_run *r, sim_prefix_figures *f);
json_t *sim_prefix_json(const sim_prefix_figures *f);

/* The capacity sweep: every combination of these device, host and disk pool sizes (an empty
 * list: the run's own size of that pool). */
typedef struct sim_prefix_sweep {
    const uint32_t *device, *host, *disk;
    size_t n_device, n_host, n_disk;
} sim_prefix_sweep;

/*
 * --prefix-report: runs the trace with o's policy with the cache off, on, and on at each
 * point of the capacity sweep (sweep may be NULL: none), and prints hit rate by tier and
 * kind, prefill tokens computed and saved, TTFT with and without the cache, and the sweep as a
 * table — hit rate in all and per tier, against device + host + disk blocks — or one JSON
 * object (its "capacity_sweep" array: host size outermost, then disk, then device).
 * plot_dir: also the sweep as a gnuplot PNG/SVG, one curve per (host, disk) pair.  Returns 0
 * or -errno (sim_err()).
 */
int sim_prefix_report(FILE *f, bool json, const sim_trace *t, const sim_options *o,
                      const sim_prefix_sweep *sweep, const char *plot_dir);

#endif
