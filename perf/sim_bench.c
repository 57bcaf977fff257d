/* sim_bench — how fast ringlm-sim replays the full Azure conversation trace (19,366 requests,
 * ~58 min) through the token-budget policy on one core. Goal: >= 1000x real time,
 * i.e. under 3.5 s of wall time. Baseline measured in the same run: the same trace through
 * the FCFS continuous policy (the scheduler does less work there), so the ratio shows what
 * the policy itself costs. Prints medians over --runs; --json for scripts.
 * SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "perf/bench_util.h"
#include "sched/sched.h"
#include "sim/engine.h"
#include "sim/err.h"
#include "sim/service.h"
#include "sim/trace.h"

static sched_policy *load_policy(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "sim_bench: %s: %s (run from the repository root)\n", path,
                strerror(errno));
        return NULL;
    }
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    sched_policy *p = NULL;
    sched_policy_error e = {0};
    if (sched_policy_parse(buf, &p, &e) < 0) {
        fprintf(stderr, "sim_bench: %s:%d: %s\n", path, e.line, e.reason);
        return NULL;
    }
    return p;
}

typedef struct result {
    double sim_s, wall_med, wall_min, wall_max;
    unsigned long long steps;
    char hash[17];
} result;

static int bench(const sim_trace *t, const sim_service *svc, sched_policy *p, int runs, result *out)
{
    double walls[64];
    sim_options o;
    sim_options_defaults(&o);
    o.policy = p;
    o.svc = svc;
    for (int i = 0; i < runs; i++) {
        sim_run r;
        int rc = sim_run_trace(t, &o, &r);
        if (rc < 0) {
            fprintf(stderr, "sim_bench: %s\n", sim_err());
            sim_run_free(&r);
            return rc;
        }
        walls[i] = r.wall_s;
        out->sim_s = (double)r.sim_end_us / 1e6;
        out->steps = r.steps;
        snprintf(out->hash, sizeof out->hash, "%s", r.policy_hash);
        sim_run_free(&r);
    }
    out->wall_min = out->wall_max = walls[0];
    for (int i = 1; i < runs; i++) {
        out->wall_min = fmin(out->wall_min, walls[i]);
        out->wall_max = fmax(out->wall_max, walls[i]);
    }
    out->wall_med = bench_median(walls, runs);
    return 0;
}

int main(int argc, char **argv)
{
    bool json = false;
    int runs = 5;
    const char *trace_path = NULL, *pol = "sim/policies/token-budget.policy",
               *base_pol = "sim/policies/fcfs.policy";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc)
            trace_path = argv[++i];
        else if (!strcmp(argv[i], "--policy") && i + 1 < argc)
            pol = argv[++i];
        else {
            fprintf(stderr,
                    "usage: sim_bench [--json] [--runs N] [--trace FILE] [--policy FILE]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 64) runs = 5;
    char path[1024];
    if (!trace_path) {
        const char *sh = getenv("RINGLM_SHARED");
        snprintf(path, sizeof path, "%s/traces/AzureLLMInferenceTrace_conv.csv",
                 sh && *sh ? sh : "../shared");
        trace_path = path;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    sim_trace t;
    sim_trace_init(&t, trace_path);
    if (sim_trace_load(&t, trace_path, SIM_FMT_AUTO, false) < 0) {
        fprintf(stderr, "sim_bench: %s\n", sim_err());
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double load_s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    sim_service svc;
    sim_service_default(&svc);
    sched_policy *p = load_policy(pol), *bp = load_policy(base_pol);
    if (!p || !bp) return 1;
    result r = {0}, br = {0};
    if (bench(&t, &svc, p, runs, &r) < 0 || bench(&t, &svc, bp, runs, &br) < 0) return 1;
    double speed = r.sim_s / r.wall_med, bspeed = br.sim_s / br.wall_med;
    if (json) {
        printf("{\"trace\":\"%s\",\"requests\":%zu,\"policy\":\"%s\",\"policy_hash\":\"%s\","
               "\"runs\":%d,"
               "\"sim_s\":%.3f,\"wall_s\":%.4f,\"wall_s_min\":%.4f,\"wall_s_max\":%.4f,\"speedup\":"
               "%.1f,"
               "\"steps\":%llu,\"us_per_step\":%.3f,\"trace_load_s\":%.4f,"
               "\"baseline\":{\"policy\":\"%s\",\"sim_s\":%.3f,\"wall_s\":%.4f,\"speedup\":%.1f,"
               "\"steps\":%llu},"
               "\"wall_ratio_vs_baseline\":%.3f,\"goal_speedup\":1000,\"goal_met\":%s}\n",
               t.source, t.n, pol, r.hash, runs, r.sim_s, r.wall_med, r.wall_min, r.wall_max, speed,
               r.steps, r.wall_med * 1e6 / (double)r.steps, load_s, base_pol, br.sim_s, br.wall_med,
               bspeed, br.steps, r.wall_med / br.wall_med, speed >= 1000 ? "true" : "false");
    } else {
        printf("trace     %s: %zu requests, loaded in %.3f s\n", t.source, t.n, load_s);
        printf("policy    %s (%s)\n", pol, r.hash);
        printf("          %.1f s simulated, wall median %.3f s (min %.3f, max %.3f, %d runs)\n",
               r.sim_s, r.wall_med, r.wall_min, r.wall_max, runs);
        printf("          %.0fx real time, %llu steps, %.2f µs per step — goal >= 1000x: %s\n",
               speed, r.steps, r.wall_med * 1e6 / (double)r.steps,
               speed >= 1000 ? "met" : "NOT met");
        printf("baseline  %s: %.1f s simulated in %.3f s (%.0fx real time, %llu steps)\n", base_pol,
               br.sim_s, br.wall_med, bspeed, br.steps);
        printf("ratio     token-budget wall / baseline wall = %.2f\n", r.wall_med / br.wall_med);
    }
    sched_policy_free(p);
    sched_policy_free(bp);
    sim_trace_free(&t);
    return 0;
}
