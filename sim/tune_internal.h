/* ringlm — what the policy search's files share (sim/tune.c, tune_eval.c); not for users of
 * sim/tune.h.  SPDX-License-Identifier: MIT */
#ifndef RINGLM_SIM_TUNE_INTERNAL_H
#define RINGLM_SIM_TUNE_INTERNAL_H

#include "sim/tune.h"

#define MAX_KNOBS    24
#define MAX_VALUES   64
#define MAX_SECTIONS (SCHED_MAX_CLASSES + SCHED_MAX_TENANTS)

/* A knob as the search applies it: one key in one or more sections of the canonical text. */
typedef struct knob {
    char key[48];
    char *sections[MAX_SECTIONS]; /* "[scheduler]", "[class x]", "[tenant y]" */
    size_t n_sections;
    double num[MAX_VALUES]; /* numeric value (µs for durations), NAN when a word */
} knob;

/* One search in progress: the options, the result being filled, each rung's traces per load. */
typedef struct search {
    const sim_tune_opts *o;
    sim_tune_result *r;
    knob *kn;
    sim_trace traces[SIM_TUNE_RUNGS][SIM_TUNE_MAX_LOADS];
    int same_as[SIM_TUNE_RUNGS]; /* rung whose traces this rung reuses */
    int jobs;
    const char *base_text;
} search;

/* A copy of src's requests, windowed to [w0, w1) s of its axis (w1 < 0: to the end) and sped up
 * by rate: one rung's trace at one load.  Returns 0 or -ENOMEM / the transform's error. */
int tune_derive_trace(const sim_trace *src, double w0, double w1, double rate, uint64_t seed,
                      sim_trace *dst);
/* The window of `frac` of t's span holding the most offered tokens, as [*w0, *w1) seconds. */
void tune_busiest_window(const sim_trace *t, double frac, double *w0, double *w1);
/* < 0 when a ranks above b on rung k (feasible first, then goodput, TTFT p99, refusals, knobs
 * moved, canonical text: a total order, so ties never depend on thread timing). */
int tune_rank_cmp(const sim_tune_result *r, const sim_tune_cand *a, const sim_tune_cand *b, int k);
/* Run each listed candidate not yet done on rung k at every load, on S->jobs threads, and
 * score it.  Returns 0, -ENOMEM or the first run's error (sim_err() names the candidate). */
int tune_evaluate(search *S, const size_t *which, size_t n, int k);
/* The DESIGN §7 scenarios (and overload at ×4) for every whole-trace candidate not yet judged:
 * one that fails any becomes infeasible.  Returns 0 or -errno with sim_err(). */
int tune_judge_scenarios(search *S);

#endif
