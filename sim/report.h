/* ringlm — simulator reports: metrics, verdicts, table, JSON, CSV. SPDX-License-Identifier: MIT */
#ifndef RINGLM_SIM_REPORT_H
#define RINGLM_SIM_REPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#include "sched/sched.h"
#include "sim/engine.h"
#include "sim/gen.h"

/* Metrics of one tenant, one class, or everything. Latencies in ms, from the request's first
 * arrival (a retried request is measured as its client saw it). */
typedef struct sim_group {
    char name[64];
    size_t requests, attempts, finished, rejected, timeouts, cancels, pending;
    uint64_t rejects[SCHED_REJECT__COUNT];      /* every refused attempt, by reason */
    uint64_t timeouts_by[SCHED_TIMEOUT__COUNT]; /* every timed-out attempt, by reason */
    uint64_t preempt_swap, preempt_recompute;
    sim_dist wait, ttft, tpot, e2e, itl_max;
    double longest_starvation_ms;
    uint64_t served_prefill, served_output; /* tokens computed (recompute included) */
    uint64_t offered_tokens;                /* prompt + output of its requests */
    double token_share;                     /* of all served tokens */
    size_t slo_met, slo_counted;
    double slo_attainment;             /* met / (requests not cancelled by the client) */
    double goodput_rps, goodput_tok_s; /* requests meeting their targets */
    double weight, fair_share_tokens, normalised_service;
    uint64_t tokens_after_cancel;
    double release_delay_max_ms; /* cancel → blocks released */
} sim_group;

typedef struct sim_summary {
    sim_group *tenants;
    size_t n_tenants;
    sim_group *classes;
    size_t n_classes;
    sim_group all;
    double jain; /* over tenants' normalised service */
    double sim_s, wall_s, speedup, span_s;
    double tokens_per_s, output_tokens_per_s, requests_per_s;
    double pad_share, occupancy, busy_share, max_step_ms;
    size_t attempts;
    double retry_amplification;
    /* burst recovery (when a burst window is known) */
    bool has_burst;
    double burst_start_s, burst_end_s, baseline_wait_ms, recovery_s; /* recovery NAN: never */
    char recovery_text[300];
    /* scenario verdict */
    int verdict; /* -1 none, 0 fail, 1 pass */
    char verdict_name[32];
    char verdict_text[600];
    /* fidelity (native traces with recorded outcomes) */
    bool has_fidelity;
    sim_dist ttft_rel_err, e2e_rel_err; /* fractions, not % */
    sim_dist ttft_ratio, e2e_ratio;     /* simulated / recorded: the error's sign */
} sim_summary;

/* Compute the summary of a run. scn may be NULL; burst_start/end_us < 0 → no burst unless
 * the scenario has one. */
int sim_summarise(const sim_run *r, const sim_scenario *scn, int64_t burst_start_us,
                  int64_t burst_end_us, sim_summary *s);
void sim_summary_free(sim_summary *s);

/* One JSON object for a run (see README: trace, policy_hash, sim_s, wall_s, tenants, ...). */
json_t *sim_report_json(const sim_run *r, const sim_summary *s, const sim_service *svc);
/* The terminal table of one run. */
void sim_report_table(FILE *f, const sim_run *r, const sim_summary *s, const sim_service *svc);
/* Side by side: several runs of one trace. */
void sim_report_compare(FILE *f, const sim_run *const *runs, const sim_summary *const *sums,
                        size_t n);
/* CSV files into dir: timeseries[-TAG].csv and requests[-TAG].csv. */
int sim_report_csv(const char *dir, const char *tag, const sim_run *r);
/* The run as a native request log (sim/FORMATS.md): one line per request, in finish order,
 * so a simulated run can be replayed (and compared with --fidelity) like a real one. */
int sim_report_request_log(FILE *f, const sim_run *r);
/* Plots (gnuplot): latency CDFs per tenant, queue depth and KV occupancy over time, PNG and
 * SVG into dir (created if absent; its parent must exist). Returns 0, SIM_PLOT_NO_GNUPLOT
 * when gnuplot is missing (data and script written, a note printed), -errno (the detail
 * names the path) when dir or a file in it cannot be written. */
#define SIM_PLOT_NO_GNUPLOT 1
int sim_report_plot(const char *dir, const char *tag, const sim_run *r, FILE *note);
/* Compare mode: TTFT and E2E CDFs of all requests and queue depth over time, one curve per
 * policy (compare-*.png/svg). Same returns as sim_report_plot. */
int sim_report_plot_compare(const char *dir, const sim_run *const *runs, size_t n, FILE *note);
/* Run gnuplot on the script gp (its output to dir/gnuplot-TAG.log), for plots made elsewhere
 * (sim/tune.c). Same returns as sim_report_plot. */
int sim_report_gnuplot(const char *dir, const char *gp, const char *tag, FILE *note);

#endif
