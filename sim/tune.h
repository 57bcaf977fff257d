/* ringlm — simulator policy search: which knob values maximise goodput at SLO on a trace.
 * SPDX-License-Identifier: MIT */
#ifndef RINGLM_SIM_TUNE_H
#define RINGLM_SIM_TUNE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sched/sched.h"
#include "sim/engine.h"
#include "sim/trace.h"

/*
 * The search.  A SPEC names knobs of a base policy and the values each may take:
 *
 *   KNOB=VALUES[;KNOB=VALUES...]
 *   KNOB    a [scheduler] key (token_budget, prefill_chunk, decode_reserve_tokens,
 *           max_active_seqs, preemption, ...), or SECTION.key where SECTION is a class or a
 *           tenant of the base policy (standard.max_queue_wait, default.max_queued_tokens),
 *           or *.key: the same value for every class (class keys) or every tenant (tenant keys)
 *   VALUES  a comma list (256,1024,auto,1500ms), or LO..HI: LO doubled up to HI (512..8192,
 *           250ms..4s; LO > 0, both with the same unit)
 *   "default" as the whole SPEC searches the knobs that matter most for goodput (see
 *   sim_tune_default_spec).
 *
 * The objective is goodput at SLO (requests meeting their class's TTFT and TPOT targets per
 * second, the classes' targets as the policy states them), summed over the load levels.  A
 * candidate is feasible when, at every load, every tenant gets at least fair_floor of its
 * max-min fair share of the served tokens and (when slo_min > 0) the requests it accepted
 * meet their targets at least slo_min of the time; a feasible candidate always ranks above an
 * infeasible one, whatever their goodput.  Ties go to the lower TTFT p99, then to fewer
 * refusals, then to fewer knobs moved from the base (a knob the trace never exercises keeps
 * the base's value), then to the canonical text (so the answer never depends on thread timing).
 *
 * The optimiser (not a grid): coordinate search — each knob in turn over all its values, the
 * others held, repeated until a pass changes nothing; then pairwise moves (every two knobs one
 * value up or down together: the ridges single moves cannot climb), and coordinate search again
 * from a pairwise move that ranks better — on a short window of the trace (the
 * busiest eighth of it), then successive halving: the best candidates of that screening are
 * run on a window twice as long (the busiest quarter), and the best `finalists` of those — plus
 * the base policy, for comparison — on the whole trace at every load (the next `finalists` in
 * line when none of them is feasible there).  The best on the whole trace is the answer — the
 * base policy itself when no candidate ranks above it there.  Candidates run on `jobs` threads;
 * every run is deterministic for the seed, and each result lands in its own slot, so the output
 * does not depend on the thread count.
 */

#define SIM_TUNE_MAX_LOADS 8
#define SIM_TUNE_RUNGS     3 /* screening window, longer window, whole trace */

typedef struct sim_tune_opts {
    const char *spec;                 /* see above */
    double loads[SIM_TUNE_MAX_LOADS]; /* arrival-rate multipliers (1 = as recorded) */
    size_t n_loads;
    double fair_floor;     /* 0.9: every tenant's served tokens / its fair share */
    double slo_min;        /* 0 = off: accepted requests meeting their targets */
    int jobs;              /* threads; 0 = every online CPU */
    int max_rounds;        /* coordinate-search passes at most (3) */
    bool pairs;            /* pairwise moves when a pass moves nothing (true) */
    size_t finalists;      /* candidates run on the whole trace (6), besides the base */
    bool scenarios;        /* finalists must also PASS the five DESIGN §7 scenarios (and
                                    the overload one at load 4) to be feasible */
    sim_options run;       /* service, max_context, retry, seed... (policy is set per run) */
    const char *base_name; /* for reports: the base policy's file name or "default" */
    FILE *progress;        /* one line per search phase, or NULL */
} sim_tune_opts;

void sim_tune_opts_defaults(sim_tune_opts *o);

/* What one candidate achieved at one load. */
typedef struct sim_tune_load {
    double offered_rps, goodput_rps, slo_attainment, accepted_slo;
    double ttft_p99_ms, tpot_p99_ms;
    size_t requests, refused, pending; /* refused: rejected at the door or timed out waiting */
    double min_fair;                   /* lowest normalised service over tenants */
    char min_fair_tenant[64];
} sim_tune_load;

/* A candidate's result on one rung, over all loads. */
typedef struct sim_tune_score {
    bool done, feasible;
    double goodput_rps;              /* Σ over loads: the objective */
    double violation;                /* Σ of constraint shortfalls (0 when feasible) */
    double ttft_p99_ms, tpot_p99_ms; /* worst over loads */
    size_t refused, requests;
    double min_fair;
    sim_tune_load load[SIM_TUNE_MAX_LOADS];
} sim_tune_score;

typedef struct sim_tune_cand {
    int *idx;     /* value index per knob; NULL for the base policy */
    char *values; /* "token_budget=2048 prefill_chunk=512 ..." */
    sched_policy *policy;
    char hash[SCHED_HASH_HEX_LEN + 1];
    bool is_base;
    bool pareto; /* on the whole-trace Pareto front */
    sim_tune_score rung[SIM_TUNE_RUNGS];
    bool scenarios_judged;     /* opts.scenarios: run on the scenarios (whole-trace ones) */
    int scenarios_passed;      /* of SIM_TUNE_SCENARIOS */
    char scenario_failed[720]; /* the first failing scenario and its verdict */
} sim_tune_cand;

#define SIM_TUNE_SCENARIOS 6 /* the five of DESIGN §7, and overload at load 4 */

typedef struct sim_tune_knob {
    char name[96];
    char **values; /* as written (after range expansion) */
    size_t n_values;
} sim_tune_knob;

typedef struct sim_tune_result {
    sim_tune_knob *knobs;
    size_t n_knobs;
    sim_tune_cand *cands;
    size_t n_cands;
    size_t best; /* index into cands */
    size_t base; /* the base policy's entry */
    int *start;  /* value index per knob where the search began */
    bool scenarios;
    size_t evaluated[SIM_TUNE_RUNGS];   /* candidates run on each rung */
    size_t runs;                        /* simulations in all */
    int rounds;                         /* coordinate-search passes done */
    size_t pair_evaluated, pair_moves;  /* pairwise candidates screened, moves taken */
    double window_s[SIM_TUNE_RUNGS][2]; /* each rung's window on the trace (s), [0,-1]: all */
    double loads[SIM_TUNE_MAX_LOADS];
    size_t n_loads;
    double bound_rps[SIM_TUNE_MAX_LOADS]; /* sim_tune_goodput_bound on the whole trace per load
                                                (NAN when the service model gives none) */
    double fair_floor, slo_min;
    int jobs;
    double wall_s;
    char spec[1024];
    char trace[256], service[256], base_name[128];
} sim_tune_result;

/* The spec "default" stands for: the step knobs, plus a queue-wait bound for every class with
 * a TTFT target that t's requests use and a queued-token quota shared by every tenant — the
 * admission knobs that decide what overload costs.  Written into buf. */
int sim_tune_default_spec(const sched_policy *base, const sim_trace *t, char *buf, size_t len);

/* Search.  t is the trace as the user shaped it (window, tenants, classes; the loads multiply
 * its rate); base the policy whose other settings every candidate keeps.  Returns 0 with *out
 * filled (free with sim_tune_result_free), or -errno with sim_err(): -EINVAL for a bad spec (it
 * names the knob, the value and the parser's reason), -ENOMEM, or a run's error. */
int sim_tune(const sim_trace *t, const sched_policy *base, const sim_tune_opts *o,
             sim_tune_result *out);
void sim_tune_result_free(sim_tune_result *r);

/* An upper bound on goodput at SLO that no policy reaches on t under svc (sim/tune_bound.c):
 * a request meets its class's TTFT target (p's classes) only if its whole prompt is prefilled
 * within it, and a prompt of L tokens costs at least svc's per-token and attention-pair terms
 * of step time; over windows of arrivals up to window_s long, the prompts that meet their
 * target must fit between the window's first arrival and its last deadline.  min_misses is the
 * largest sum of the windows' shortfalls over disjoint windows, goodput_rps (requests −
 * min_misses) / the arrival span (the table's offered rate's span).  TPOT, fairness and the
 * rest of the step only lower what is reachable.  Returns 0, or -EINVAL (a service model whose
 * prefill terms are not a lower bound) / -ENOMEM with sim_err(). */
typedef struct sim_tune_bound {
    size_t requests, min_misses;
    double span_s, goodput_rps, window_s;
} sim_tune_bound;
int sim_tune_goodput_bound(const sim_trace *t, const sim_service *svc, const sched_policy *p,
                           double window_s, sim_tune_bound *out);

/* Reports: the Pareto front of the whole-trace candidates (goodput, TTFT p99, TPOT p99,
 * refusals) as a table, as JSON, and as a gnuplot scatter (goodput against TTFT p99) into dir
 * (returns SIM_PLOT_NO_GNUPLOT without gnuplot: data and script are still written). */
void sim_tune_table(FILE *f, const sim_tune_result *r);
json_t *sim_tune_json(const sim_tune_result *r);
int sim_tune_plot(const char *dir, const sim_tune_result *r, FILE *note);
/* The best policy in canonical form, after comment lines saying what it was tuned on and its
 * hash, into path.  Returns 0 or -errno with sim_err(). */
int sim_tune_write_policy(const char *path, const sim_tune_result *r);

/* ringlm-sim --tune: search, print the table (or JSON with json), plot into plot_dir when
 * given, write the best policy to out_path.  Returns the process exit status (0 or 1; errors
 * are printed to stderr). */
int sim_tune_cli(const sim_trace *t, const sched_policy *base, const sim_tune_opts *o, bool json,
                 const char *plot_dir, const char *out_path);

#endif
