/* goodput_bound — the most goodput at SLO any policy could reach on a trace under a service
 * model (sim_tune_goodput_bound, sim/tune.h): where a goal of perf/policy_compare.sh lies above
 * it, no policy meets that goal, and the table says so.  Prints one JSON object.
 * Usage: goodput_bound --trace FILE [--rate X] [--calibration FILE] [--policy FILE]
 *                      [--window-s S (60)]
 * The classes' TTFT targets come from --policy (default sim/policies/token-budget.policy);
 * the service model is ringlm-sim's for the same --calibration (its default refit).
 * SPDX-License-Identifier: MIT */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"
#include "sim/err.h"
#include "sim/service.h"
#include "sim/trace.h"
#include "sim/tune.h"

static int die(const char *what)
{
    fprintf(stderr, "goodput_bound: %s: %s\n", what, sim_err());
    return 1;
}

int main(int argc, char **argv)
{
    const char *trace = NULL, *cal = NULL, *policy = "sim/policies/token-budget.policy";
    double rate = 1, window = 60;
    static const struct option lo[] = {{"trace", 1, 0, 't'},       {"rate", 1, 0, 'r'},
                                       {"calibration", 1, 0, 'c'}, {"policy", 1, 0, 'p'},
                                       {"window-s", 1, 0, 'w'},    {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        char *end = NULL;
        switch (c) {
        case 't': trace = optarg; break;
        case 'c': cal = optarg; break;
        case 'p': policy = optarg; break;
        case 'r':
            rate = strtod(optarg, &end);
            if (!end || *end || !(rate > 0)) goto usage;
            break;
        case 'w':
            window = strtod(optarg, &end);
            if (!end || *end || !(window > 0)) goto usage;
            break;
        default: goto usage;
        }
    }
    if (!trace || optind != argc) goto usage;

    char *text = NULL;
    size_t len = 0;
    if (sim_read_file(policy, 1 << 20, &text, &len) < 0) return die(policy);
    sched_policy *p = NULL;
    sched_policy_error pe = {0};
    if (sched_policy_parse(text, &p, &pe) < 0) {
        fprintf(stderr, "goodput_bound: %s:%d: %s\n", policy, pe.line, pe.reason);
        free(text);
        return 1;
    }
    free(text);
    sim_service svc;
    if (cal) {
        if (sim_service_load(&svc, cal, SIM_FIT_AUTO) < 0) return die(cal);
    } else {
        sim_service_default(&svc);
    }
    sim_trace t;
    sim_trace_init(&t, trace);
    if (sim_trace_load(&t, trace, SIM_FMT_AUTO, false) < 0) return die(trace);
    sim_transform x;
    sim_transform_defaults(&x);
    x.rate = rate;
    if (sim_trace_transform(&t, &x) < 0) return die("--rate");
    sim_tune_bound b;
    if (sim_tune_goodput_bound(&t, &svc, p, window, &b) < 0) return die(trace);
    printf("{\"trace\": \"%s\", \"rate\": %g, \"requests\": %zu, \"span_s\": %.6f, "
           "\"offered_rps\": %.6f, "
           "\"min_misses\": %zu, \"goodput_bound_rps\": %.6f, \"window_s\": %g}\n",
           trace, rate, b.requests, b.span_s, b.span_s > 0 ? (double)b.requests / b.span_s : 0,
           b.min_misses, b.goodput_rps, b.window_s);
    sim_trace_free(&t);
    sim_service_free(&svc);
    sched_policy_free(p);
    return 0;
usage:
    fprintf(stderr, "usage: goodput_bound --trace FILE [--rate X] [--calibration FILE] [--policy "
                    "FILE] [--window-s S]\n");
    return 2;
}
