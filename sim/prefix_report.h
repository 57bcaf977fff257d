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
    uint64_t demoted_blocks[SCHED_POOL__COUNT], reloaded_blocks[SCHED_POOL__COUNT];
    uint64_t recomputed_blocks[SCHED_POOL__COUNT];
    double   copy_wait_ms;
    uint64_t prefill_tokens;      /* computed (recompute included) */
    double   hit_rate;            /* hit / query tokens */
    int64_t  recorded_hit_tokens; /* the trace's own cached_tokens summed (a real run's request
                                     log: what the daemon found), -1 when it records none */
} sim_prefix_figures;

void    sim_prefix_figures_of(const sim_run *r, sim_prefix_figures *f);
json_t *sim_prefix_json(const sim_prefix_figures *f);

/*
 * --prefix-report: runs the trace with o's policy with the cache off, on, and on with each
 * device pool size of sweep[0..n_sweep) (the capacity sweep), and prints hit rate by tier and
 * kind, prefill tokens computed and saved, TTFT with and without the cache, and the sweep as a
 * table (or one JSON object).  plot_dir: also the sweep as a gnuplot PNG/SVG.  Returns 0 or
 * -errno (sim_err()).
 */
int sim_prefix_report(FILE *f, bool json, const sim_trace *t, const sim_options *o,
                      const uint32_t *sweep, size_t n_sweep, const char *plot_dir);

#endif
