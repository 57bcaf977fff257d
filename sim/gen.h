/* ringlm — simulator workload generators and the five scenarios. SPDX-License-Identifier: MIT */
#ifndef RINGLM_SIM_GEN_H
#define RINGLM_SIM_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "sim/service.h"
#include "sim/trace.h"

/* What a scenario is judged on (DESIGN.md §7); filled by sim_gen_workload, read by the
 * verdict in sim/report.c. Thresholds come from the workload's parameters. */
enum sim_scenario_kind {
    SIM_SCN_NONE = 0,
    SIM_SCN_LONG_PROMPT,
    SIM_SCN_TWO_TENANTS,
    SIM_SCN_DISCONNECTS,
    SIM_SCN_BURST,
    SIM_SCN_OVERLOAD,
    SIM_SCN_SHARED_PREFIX,
};

typedef struct sim_scenario {
    int kind;
    int64_t duration_us; /* arrivals happen in [0, duration) */
    /* long-prompt */
    int short_class; /* class index of the short chats */
    int64_t long_at_us;
    double ttft_limit_ms;  /* short chats' TTFT p99 must stay under this */
    double stall_limit_ms; /* and their longest inter-token gap under this */
    /* two-tenants */
    int quiet_tenant, loud_tenant;
    double share_min; /* quiet tenant keeps >= this fraction of its fair share */
    /* burst */
    int64_t burst_start_us, burst_end_us;
    double recover_limit_s;
    /* overload */
    double load;         /* offered load as a multiple of the estimated capacity */
    double slo_min;      /* accepted work meets its targets at least this often */
    double capacity_rps; /* the estimate the workload was sized with */
} sim_scenario;

/* Generate a named workload into t (initialised here). Names:
 *   poisson, gamma          open-loop arrivals; params rate=REQ/S (or load=X of capacity),
 *                           cv= (gamma), duration=S or n=COUNT, prompt=, output= (N, LO-HI,
 *                           exp:MEAN), lengths=TRACEFILE (joint empirical draw from a trace),
 *                           tenants=RULE, classes=RULE
 *   shared-prefix           system prompts shared by many users, multi-turn chats, one-off
 *                           prompts; requests carry block hashes (the prefix cache's workload)
 *   long-prompt, two-tenants, disconnects, burst, overload — DESIGN.md §7 scenarios; run
 *                           `ringlm-sim --list-workloads` for their parameters and defaults.
 * params are "key=value" strings; an unknown key is an error listing the known ones.
 * svc sizes the scenarios relative to the machine's capacity. Returns 0 or -errno. */
int sim_gen_workload(sim_trace *t, const char *name, const char *const *params, size_t n_params,
                     const sim_service *svc, uint64_t seed, sim_scenario *scn);

/* Printable help: the workloads, their parameters and defaults. */
const char *sim_gen_help(void);

#endif
