/* ringlm-sim — replay recorded or generated traffic through the very sched/ library the
 * daemon runs, charging time from a measured service model. SPDX-License-Identifier: MIT */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sched/sched.h"
#include "sim/engine.h"
#include "sim/err.h"
#include "sim/gen.h"
#include "sim/prefix_report.h"
#include "sim/report.h"
#include "sim/service.h"
#include "sim/trace.h"
#include "sim/tune.h"

#define MAX_POLICIES 16
#define MAX_PARAMS   32
#define MAX_ITLOGS   16

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: ringlm-sim (--trace FILE | --workload NAME [--param K=V ...]) [options]\n"
        "       ringlm-sim --version | --help\n"
        "\n"
        "input\n"
        "  --trace FILE            Azure CSV, Mooncake JSONL or native JSONL (detected from the "
        "content)\n"
        "  --format F              force azure | mooncake | native\n"
        "  --skip-bad              skip malformed lines (counted and listed) instead of stopping\n"
        "  --workload NAME         generate: poisson gamma long-prompt two-tenants disconnects "
        "burst overload\n"
        "                          shared-prefix\n"
        "  --param K=V             workload parameter (repeatable); --list-workloads shows them\n"
        "  --rate X                multiply the arrival rate by X (times divided by X)\n"
        "  --length-scale Y        multiply prompt and output lengths by Y\n"
        "  --window START:END      keep arrivals in [START, END) seconds of the trace (END may be "
        "empty)\n"
        "  --tenants RULE          assign tenants: a:3,b:1 | rr:a,b | random:a:3,b:1 | "
        "prompt>N:x,y\n"
        "  --classes RULE          assign classes, same rules\n"
        "  --seed N                seed for generators and random rules (default 1)\n"
        "  --retry MODE            none | immediate | backoff:MS  (clients retry refused or "
        "timed-out requests)\n"
        "  --retry-max N           attempts per request in all (default 4)\n"
        "model\n"
        "  --policy FILE           scheduler policy (repeatable: compare mode); default: sched "
        "defaults\n"
        "  --calibration FILE      service model from perf/calibrate; default: built-in "
        "(documented)\n"
        "  --service-fit F         auto | file | linear | attention: the file's step model, or a "
        "refit\n"
        "                          from its grid (attention adds prefill-attention cost); auto = "
        "best on the grid\n"
        "  --iteration-log FILE    fit the step model to a real ringlmd's iterations (ringlmd "
        "--iteration-log;\n"
        "                          repeatable, points pooled): replaces the grid model and the "
        "serving-loop\n"
        "                          terms; KV and transfer figures still come from --calibration "
        "(or the default)\n"
        "  --max-context N         prompt + max tokens limit (default 32768)\n"
        "  --step-scale X          what-if: every step takes X times the model's time "
        "(faster/slower hardware)\n"
        "  --step-overhead-us N    add N µs to every step: the serving loop's own cost per "
        "iteration\n"
        "  --check-invariants N    check the scheduler's invariants every N steps (stop on a "
        "violation)\n"
        "  --prefix-cache on|off   requests with block hashes (Mooncake hash_ids, a native log's, "
        "the shared-prefix\n"
        "                          workload) share cached prompt blocks in their policy's cache "
        "domains (default on)\n"
        "  --recorded-costs on|off a native log that recorded its scheduler's cost model "
        "(ringlmd's sched_cost) decides\n"
        "                          with it (step-time correction, tier bandwidths) as the recorded "
        "run did (default on)\n"
        "  --kv-blocks N           what-if: device KV blocks (default: the service model's)\n"
        "  --host-kv-blocks N      what-if: host KV tier blocks (0: no host tier)\n"
        "  --disk-kv-blocks N      what-if: disk KV tier blocks (0: none, the default)\n"
        "  --attention-window N    what-if: every layer attends to the last N positions, so a\n"
        "                          sequence holds only its window's KV blocks (0: none)\n"
        "  --window-pattern P      what-if: windowed and global layers, each run beside the "
        "all-global one:\n"
        "                          W:N (window W on N of every N+1 layers), gemma2 (4096:1), "
        "gemma3 (1024:5),\n"
        "                          gemma2:W, gemma3:W; KV as ringlmd keeps it (global blocks + "
        "a ring a sequence)\n"
        "  --window-rings K        with --window-pattern: K rings (default: ringlmd's, the "
        "blocks / ring blocks)\n"
        "  --host-kv-bw B          what-if: the host link's bytes/s, both ways (over a log's "
        "recorded bandwidths)\n"
        "  --disk-kv-bw B          what-if: the disk link's bytes/s, both ways (the names are "
        "ringlmd's)\n"
        "output\n"
        "  --json                  one JSON object on stdout (compare mode: {\"runs\": [...]})\n"
        "  --csv DIR               time series and per-request CSV\n"
        "  --plot DIR              gnuplot PNG/SVG: latency CDFs per tenant, queue depth, KV "
        "occupancy\n"
        "  --decision-log FILE     scheduler decisions as JSON lines (compare mode: FILE-POLICY)\n"
        "  --request-log FILE      the simulated run as a native request log (compare mode: "
        "FILE-POLICY)\n"
        "  --sample-ms N           time-series interval (default 1000)\n"
        "  --burst START:END       report the time until queue wait returns to its pre-burst "
        "baseline\n"
        "  --fidelity              native trace of a real run: per-request error of TTFT and E2E\n"
        "  --speed-trace           with --iteration-log of that same run: scale each step by the "
        "run's measured\n"
        "                          speed in its window (Σ observed / Σ modelled periods; "
        "diagnostic: separates\n"
        "                          the machine's drift from the simulator's decisions)\n"
        "  --speed-window-ms N     speed-trace window (default 2000)\n"
        "  --compare-log FILE      no simulation: per-request error of another real run's request "
        "log (FILE)\n"
        "                          against --trace's, in arrival order (the daemon's own "
        "repeatability)\n"
        "  --list-workloads        workloads and their parameters\n"
        "  --prefix-report         the (first) policy with the prefix cache off and on: hit rate "
        "by tier and kind,\n"
        "                          prefill tokens saved, TTFT with and without the cache\n"
        "  --capacity-sweep N,...  with --prefix-report: hit rate (in all and per tier), prefill "
        "and TTFT at these\n"
        "                          device KV block counts (--plot DIR: prefix-sweep.png)\n"
        "  --capacity-sweep-host N,...  and at each of these host tier sizes (0: none; default: "
        "--host-kv-blocks)\n"
        "  --capacity-sweep-disk N,...  and at each of these disk tier sizes (0: none; default: "
        "--disk-kv-blocks);\n"
        "                          every combination of the three lists is run\n"
        "policy search\n"
        "  --tune SPEC             search the knobs of the (first) --policy for the most goodput "
        "at SLO, every\n"
        "                          tenant at its fair-share floor: SPEC is KNOB=VALUES;... with "
        "VALUES a list\n"
        "                          (256,1024 or 1500ms,2s) or a doubling range LO..HI; KNOB a "
        "[scheduler] key,\n"
        "                          CLASS.key, TENANT.key or *.key (all classes / tenants); "
        "\"default\" = the main\n"
        "                          step and admission knobs. Coordinate search on the busiest "
        "eighth of the trace,\n"
        "                          halving on its busiest quarter, finalists on all of it; prints "
        "the Pareto front\n"
        "  --tune-loads X,Y,...    rate multipliers judged together (default 1)\n"
        "  --tune-out FILE         best policy, canonical form with its hash (default "
        "tuned.policy)\n"
        "  --tune-jobs N           threads (default: every CPU)\n"
        "  --tune-rounds N         coordinate-search passes at most (default 3)\n"
        "  --tune-no-pairs         no pairwise moves (two knobs one step together) after a pass "
        "moves nothing\n"
        "  --tune-finalists N      candidates run on the whole trace (default 6, besides the base "
        "policy)\n"
        "  --fair-floor X          every tenant gets at least X of its fair share of served tokens "
        "(default 0.9)\n"
        "  --slo-min X             and accepted requests meet their targets at least X of the time "
        "(default off)\n"
        "  --tune-scenarios        and the whole-trace candidates PASS the five DESIGN §7 "
        "scenarios and overload at x4\n");
}

static const char *base_name(const char *p, char *buf, size_t n)
{
    const char *s = strrchr(p, '/');
    snprintf(buf, n, "%s", s ? s + 1 : p);
    char *dot = strrchr(buf, '.');
    if (dot && strcmp(dot, ".policy") == 0) *dot = 0;
    return buf;
}

#define SIM_MAX_WINDOW   (1u << 24)
#define SIM_MAX_WINDOWED 1024u

/* One decimal number of 1..max ending at a ':' or the string's end (*end there). */
static int parse_count(const char *s, uint32_t max, const char **end)
{
    if (*s < '0' || *s > '9') return -1;
    char *e;
    errno = 0;
    unsigned long v = strtoul(s, &e, 10);
    if (errno || !v || v > max || (*e && *e != ':')) return -1;
    *end = e;
    return (int)v;
}

/* --window-pattern: W:N (a window of W positions on N of every N + 1 layers), gemma2 (every
 * other layer windowed, 4096 positions), gemma3 (5 of every 6, 1024), or either with :W. */
static int parse_window_pattern(const char *s, sim_window_pattern *wp)
{
    static const struct {
        const char *name;
        uint32_t window, windowed;
    } named[] = {{"gemma2", 4096, 1}, {"gemma3", 1024, 5}};
    const char *e;
    int w, n;
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        size_t len = strlen(named[i].name);
        if (strncmp(s, named[i].name, len) != 0 || (s[len] && s[len] != ':')) continue;
        w = s[len] ? parse_count(s + len + 1, SIM_MAX_WINDOW, &e) : (int)named[i].window;
        if (w < 0 || (s[len] && *e)) return -1;
        *wp = (sim_window_pattern){(uint32_t)w, named[i].windowed, named[i].windowed + 1, 0};
        return 0;
    }
    if ((w = parse_count(s, SIM_MAX_WINDOW, &e)) < 0 || *e != ':' ||
        (n = parse_count(e + 1, SIM_MAX_WINDOWED, &e)) < 0 || *e)
        return -1;
    *wp = (sim_window_pattern){(uint32_t)w, (uint32_t)n, (uint32_t)n + 1, 0};
    return 0;
}

static int parse_range(const char *s, double *a, double *b)
{
    char *e;
    *a = strtod(s, &e);
    if (e == s || *e != ':') return -1;
    const char *t = e + 1;
    if (!*t) {
        *b = -1;
        return 0;
    }
    *b = strtod(t, &e);
    return *e || !isfinite(*a) || !isfinite(*b) ? -1 : 0;
}

/* --compare-log: two request logs of real runs of the same trace, request by request in
 * arrival order — how far the daemon is from itself, with fidelity mode's statistics. */
static int compare_logs(const sim_trace *a, const char *path_b, bool json)
{
    sim_trace b;
    sim_trace_init(&b, path_b);
    int rc = sim_trace_load(&b, path_b, SIM_FMT_NATIVE, false);
    if (rc < 0) {
        fprintf(stderr, "ringlm-sim: %s\n", sim_err());
        return 1;
    }
    if (!a->has_real || !b.has_real || a->n != b.n) {
        fprintf(
            stderr,
            "ringlm-sim: --compare-log: %s and %s must be request logs of real runs of the same "
            "requests (%zu vs %zu requests)\n",
            a->source, path_b, a->n, b.n);
        sim_trace_free(&b);
        return 1;
    }
    size_t cap = a->n ? a->n : 1, nt = 0, ne = 0;
    double *te = malloc(cap * sizeof *te), *ee = malloc(cap * sizeof *ee);
    if (!te || !ee) {
        free(te);
        free(ee);
        sim_trace_free(&b);
        return 1;
    }
    for (size_t i = 0; i < a->n; i++) {
        const sim_req *x = &a->reqs[i], *y = &b.reqs[i];
        bool done_x = x->real_reason == SIM_REAL_LENGTH || x->real_reason == SIM_REAL_STOP;
        bool done_y = y->real_reason == SIM_REAL_LENGTH || y->real_reason == SIM_REAL_STOP;
        if (!done_x || !done_y) continue;
        if (x->real_first_token_us != SIM_NO_TIME && y->real_first_token_us != SIM_NO_TIME &&
            x->real_first_token_us > x->arrival_us) {
            double ra = (double)(x->real_first_token_us - x->arrival_us),
                   rb = (double)(y->real_first_token_us - y->arrival_us);
            te[nt++] = fabs(rb - ra) / ra;
        }
        if (x->real_finish_us != SIM_NO_TIME && y->real_finish_us != SIM_NO_TIME &&
            x->real_finish_us > x->arrival_us) {
            double ra = (double)(x->real_finish_us - x->arrival_us),
                   rb = (double)(y->real_finish_us - y->arrival_us);
            ee[ne++] = fabs(rb - ra) / ra;
        }
    }
    sim_dist dt, de;
    sim_dist_of(te, nt, &dt);
    sim_dist_of(ee, ne, &de);
    if (json)
        printf("{\"a\": \"%s\", \"b\": \"%s\", \"ttft_rel_err\": {\"n\": %zu, \"p50\": %.4f, "
               "\"p99\": %.4f, \"max\": %.4f}, "
               "\"e2e_rel_err\": {\"n\": %zu, \"p50\": %.4f, \"p99\": %.4f, \"max\": %.4f}}\n",
               a->source, path_b, dt.n, dt.p50, dt.p99, dt.max, de.n, de.p50, de.p99, de.max);
    else
        printf("real run vs real run (%s against %s, per request in arrival order): TTFT median "
               "%.1f%% p99 %.1f%% "
               "(n %zu); E2E median %.1f%% p99 %.1f%% (n %zu)\n",
               path_b, a->source, dt.p50 * 100, dt.p99 * 100, dt.n, de.p50 * 100, de.p99 * 100,
               de.n);
    free(te);
    free(ee);
    sim_trace_free(&b);
    return 0;
}

int main(int argc, char **argv)
{
    const char *trace_path = NULL, *workload = NULL, *calib = NULL, *csv_dir = NULL,
               *plot_dir = NULL;
    const char *declog = NULL, *reqlog = NULL;
    const char *policies[MAX_POLICIES];
    const char *params[MAX_PARAMS];
    const char *itlogs[MAX_ITLOGS];
    int n_itlog = 0;
    int n_pol = 0, n_par = 0, fmt = SIM_FMT_AUTO, fit = SIM_FIT_AUTO;
    bool json = false, skip_bad = false, want_fidelity = false, speed_trace = false;
    double speed_ms = 2000;
    const char *compare_log = NULL;
    const char *tune_spec = NULL, *tune_out = "tuned.policy";
    sim_tune_opts topt;
    sim_tune_opts_defaults(&topt);
    double burst0 = -1, burst1 = -1;
    bool prefix_report = false;
    long long kv_host = -1, kv_disk = -1; /* what-ifs: -1 = the service model's */
    long long attention_window = -1;
    uint32_t window_rings = 0;
    double host_bw = 0, disk_bw = 0;
    uint32_t sweep[3][64]; /* the capacity sweep's device, host and disk sizes */
    size_t n_sweep[3] = {0, 0, 0};
    sim_transform xf;
    sim_transform_defaults(&xf);
    sim_options opt;
    sim_options_defaults(&opt);
    enum {
        O_FORMAT = 256,
        O_SKIP,
        O_PARAM,
        O_RATE,
        O_LSCALE,
        O_WINDOW,
        O_TENANTS,
        O_CLASSES,
        O_SEED,
        O_RETRY,
        O_RETRY_MAX,
        O_CALIB,
        O_MAXCTX,
        O_CSV,
        O_PLOT,
        O_DECLOG,
        O_SAMPLE,
        O_BURST,
        O_FIDELITY,
        O_LIST,
        O_REQLOG,
        O_FIT,
        O_SCALE,
        O_OVERHEAD,
        O_CHECK,
        O_ITLOG,
        O_SPEED,
        O_SPEEDW,
        O_COMPARE,
        O_TUNE,
        O_TUNE_LOADS,
        O_TUNE_OUT,
        O_TUNE_JOBS,
        O_TUNE_ROUNDS,
        O_TUNE_NO_PAIRS,
        O_TUNE_FINAL,
        O_FAIR_FLOOR,
        O_SLO_MIN,
        O_TUNE_SCN,
        O_PXCACHE,
        O_RECCOST,
        O_PXREPORT,
        O_SWEEP,
        O_SWEEP_HOST,
        O_SWEEP_DISK,
        O_KVB,
        O_HKVB,
        O_DKVB,
        O_AWIN,
        O_WPAT,
        O_WRINGS,
        O_HBW,
        O_DBW
    };
    static const struct option lo[] = {{"trace", 1, 0, 't'},
                                       {"workload", 1, 0, 'w'},
                                       {"policy", 1, 0, 'p'},
                                       {"json", 0, 0, 'j'},
                                       {"help", 0, 0, 'h'},
                                       {"version", 0, 0, 'V'},
                                       {"format", 1, 0, O_FORMAT},
                                       {"skip-bad", 0, 0, O_SKIP},
                                       {"param", 1, 0, O_PARAM},
                                       {"rate", 1, 0, O_RATE},
                                       {"length-scale", 1, 0, O_LSCALE},
                                       {"window", 1, 0, O_WINDOW},
                                       {"tenants", 1, 0, O_TENANTS},
                                       {"classes", 1, 0, O_CLASSES},
                                       {"seed", 1, 0, O_SEED},
                                       {"retry", 1, 0, O_RETRY},
                                       {"retry-max", 1, 0, O_RETRY_MAX},
                                       {"calibration", 1, 0, O_CALIB},
                                       {"max-context", 1, 0, O_MAXCTX},
                                       {"csv", 1, 0, O_CSV},
                                       {"plot", 1, 0, O_PLOT},
                                       {"decision-log", 1, 0, O_DECLOG},
                                       {"sample-ms", 1, 0, O_SAMPLE},
                                       {"burst", 1, 0, O_BURST},
                                       {"fidelity", 0, 0, O_FIDELITY},
                                       {"list-workloads", 0, 0, O_LIST},
                                       {"request-log", 1, 0, O_REQLOG},
                                       {"service-fit", 1, 0, O_FIT},
                                       {"step-scale", 1, 0, O_SCALE},
                                       {"step-overhead-us", 1, 0, O_OVERHEAD},
                                       {"check-invariants", 1, 0, O_CHECK},
                                       {"iteration-log", 1, 0, O_ITLOG},
                                       {"speed-trace", 0, 0, O_SPEED},
                                       {"speed-window-ms", 1, 0, O_SPEEDW},
                                       {"compare-log", 1, 0, O_COMPARE},
                                       {"tune", 1, 0, O_TUNE},
                                       {"tune-loads", 1, 0, O_TUNE_LOADS},
                                       {"tune-out", 1, 0, O_TUNE_OUT},
                                       {"tune-jobs", 1, 0, O_TUNE_JOBS},
                                       {"tune-rounds", 1, 0, O_TUNE_ROUNDS},
                                       {"tune-no-pairs", 0, 0, O_TUNE_NO_PAIRS},
                                       {"tune-finalists", 1, 0, O_TUNE_FINAL},
                                       {"fair-floor", 1, 0, O_FAIR_FLOOR},
                                       {"slo-min", 1, 0, O_SLO_MIN},
                                       {"tune-scenarios", 0, 0, O_TUNE_SCN},
                                       {"prefix-cache", 1, 0, O_PXCACHE},
                                       {"recorded-costs", 1, 0, O_RECCOST},
                                       {"prefix-report", 0, 0, O_PXREPORT},
                                       {"capacity-sweep", 1, 0, O_SWEEP},
                                       {"capacity-sweep-host", 1, 0, O_SWEEP_HOST},
                                       {"capacity-sweep-disk", 1, 0, O_SWEEP_DISK},
                                       {"kv-blocks", 1, 0, O_KVB},
                                       {"host-kv-blocks", 1, 0, O_HKVB},
                                       {"disk-kv-blocks", 1, 0, O_DKVB},
                                       {"attention-window", 1, 0, O_AWIN},
                                       {"window-pattern", 1, 0, O_WPAT},
                                       {"window-rings", 1, 0, O_WRINGS},
                                       {"host-kv-bw", 1, 0, O_HBW},
                                       {"disk-kv-bw", 1, 0, O_DBW},
                                       {0, 0, 0, 0}};
    int c, li = -1;
    char *e;
    while ((li = -1, c = getopt_long(argc, argv, "t:w:p:jh", lo, &li)) != -1) {
        switch (c) {
        case 't': trace_path = optarg; break;
        case 'w': workload = optarg; break;
        case 'p':
            if (n_pol == MAX_POLICIES) {
                fprintf(stderr, "ringlm-sim: at most %d policies\n", MAX_POLICIES);
                return 2;
            }
            policies[n_pol++] = optarg;
            break;
        case 'j': json = true; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("ringlm-sim %s\n", RINGLM_VERSION); return 0;
        case O_FORMAT:
            if (!strcmp(optarg, "azure"))
                fmt = SIM_FMT_AZURE;
            else if (!strcmp(optarg, "mooncake"))
                fmt = SIM_FMT_MOONCAKE;
            else if (!strcmp(optarg, "native"))
                fmt = SIM_FMT_NATIVE;
            else {
                fprintf(stderr, "ringlm-sim: --format %s: expected azure, mooncake or native\n",
                        optarg);
                return 2;
            }
            break;
        case O_SKIP: skip_bad = true; break;
        case O_PARAM:
            if (n_par == MAX_PARAMS) {
                fprintf(stderr, "ringlm-sim: too many --param\n");
                return 2;
            }
            params[n_par++] = optarg;
            break;
        case O_RATE:
            xf.rate = strtod(optarg, &e);
            if (*e) goto bad_num;
            break;
        case O_LSCALE:
            xf.length_scale = strtod(optarg, &e);
            if (*e) goto bad_num;
            break;
        case O_WINDOW:
            if (parse_range(optarg, &xf.window_start_s, &xf.window_end_s) < 0) {
                fprintf(stderr, "ringlm-sim: --window %s: expected START:END seconds\n", optarg);
                return 2;
            }
            break;
        case O_TENANTS: xf.tenant_rule = optarg; break;
        case O_CLASSES: xf.class_rule = optarg; break;
        case O_SEED:
            xf.seed = opt.seed = strtoull(optarg, &e, 0);
            if (*e) goto bad_num;
            break;
        case O_RETRY:
            if (!strcmp(optarg, "none"))
                opt.retry = SIM_RETRY_NONE;
            else if (!strcmp(optarg, "immediate"))
                opt.retry = SIM_RETRY_IMMEDIATE;
            else if (!strncmp(optarg, "backoff:", 8)) {
                double msv = strtod(optarg + 8, &e);
                if (*e || !(msv > 0)) goto bad_num;
                opt.retry = SIM_RETRY_BACKOFF;
                opt.retry_backoff_us = (int64_t)llround(msv * 1000);
            } else {
                fprintf(stderr, "ringlm-sim: --retry %s: expected none, immediate or backoff:MS\n",
                        optarg);
                return 2;
            }
            break;
        case O_RETRY_MAX:
            opt.retry_max = (uint32_t)strtoul(optarg, &e, 10);
            if (*e || !opt.retry_max) goto bad_num;
            break;
        case O_CALIB: calib = optarg; break;
        case O_ITLOG:
            if (n_itlog == MAX_ITLOGS) {
                fprintf(stderr, "ringlm-sim: at most %d --iteration-log\n", MAX_ITLOGS);
                return 2;
            }
            itlogs[n_itlog++] = optarg;
            break;
        case O_MAXCTX:
            opt.max_context = (uint32_t)strtoul(optarg, &e, 10);
            if (*e || !opt.max_context) goto bad_num;
            break;
        case O_CSV: csv_dir = optarg; break;
        case O_PLOT: plot_dir = optarg; break;
        case O_DECLOG: declog = optarg; break;
        case O_REQLOG: reqlog = optarg; break;
        case O_OVERHEAD:
            opt.step_overhead_us = strtod(optarg, &e);
            if (*e || !(opt.step_overhead_us >= 0) || !isfinite(opt.step_overhead_us)) goto bad_num;
            break;
        case O_CHECK:
            opt.check_every = strtoull(optarg, &e, 10);
            if (*e) goto bad_num;
            break;
        case O_SCALE:
            opt.step_scale = strtod(optarg, &e);
            if (*e || !(opt.step_scale > 0) || !isfinite(opt.step_scale)) goto bad_num;
            break;
        case O_FIT:
            if (!strcmp(optarg, "auto"))
                fit = SIM_FIT_AUTO;
            else if (!strcmp(optarg, "file"))
                fit = SIM_FIT_FILE;
            else if (!strcmp(optarg, "linear"))
                fit = SIM_FIT_LINEAR;
            else if (!strcmp(optarg, "attention"))
                fit = SIM_FIT_ATTENTION;
            else {
                fprintf(stderr,
                        "ringlm-sim: --service-fit %s: expected auto, file, linear or attention\n",
                        optarg);
                return 2;
            }
            break;
        case O_SAMPLE: {
            double v = strtod(optarg, &e);
            if (*e || !(v >= 1)) goto bad_num;
            opt.sample_us = (int64_t)llround(v * 1000);
            break;
        }
        case O_BURST:
            if (parse_range(optarg, &burst0, &burst1) < 0 || burst1 <= burst0) {
                fprintf(stderr, "ringlm-sim: --burst %s: expected START:END seconds\n", optarg);
                return 2;
            }
            break;
        case O_FIDELITY: want_fidelity = true; break;
        case O_SPEED: speed_trace = true; break;
        case O_SPEEDW:
            speed_ms = strtod(optarg, &e);
            if (*e || !(speed_ms >= 1) || !(speed_ms <= 3.6e6)) goto bad_num;
            break;
        case O_COMPARE: compare_log = optarg; break;
        case O_TUNE: tune_spec = optarg; break;
        case O_TUNE_LOADS: {
            topt.n_loads = 0;
            for (const char *p = optarg; *p; p = *e ? e + 1 : e) {
                if (topt.n_loads == SIM_TUNE_MAX_LOADS) goto bad_num;
                double v = strtod(p, &e);
                if (e == p || (*e && *e != ',') || !(v > 0) || !isfinite(v)) goto bad_num;
                topt.loads[topt.n_loads++] = v;
            }
            if (!topt.n_loads) goto bad_num;
            break;
        }
        case O_TUNE_OUT: tune_out = optarg; break;
        case O_TUNE_SCN: topt.scenarios = true; break;
        case O_TUNE_JOBS:
            topt.jobs = (int)strtol(optarg, &e, 10);
            if (*e || topt.jobs < 1) goto bad_num;
            break;
        case O_TUNE_ROUNDS:
            topt.max_rounds = (int)strtol(optarg, &e, 10);
            if (*e || topt.max_rounds < 1) goto bad_num;
            break;
        case O_TUNE_NO_PAIRS: topt.pairs = false; break;
        case O_TUNE_FINAL:
            topt.finalists = strtoul(optarg, &e, 10);
            if (*e || !topt.finalists) goto bad_num;
            break;
        case O_FAIR_FLOOR:
            topt.fair_floor = strtod(optarg, &e);
            if (*e || !(topt.fair_floor >= 0) || topt.fair_floor > 1) goto bad_num;
            break;
        case O_SLO_MIN:
            topt.slo_min = strtod(optarg, &e);
            if (*e || !(topt.slo_min >= 0) || topt.slo_min > 1) goto bad_num;
            break;
        case O_LIST: fputs(sim_gen_help(), stdout); return 0;
        case O_PXCACHE:
            if (!strcmp(optarg, "on"))
                opt.prefix_cache = true;
            else if (!strcmp(optarg, "off"))
                opt.prefix_cache = false;
            else {
                fprintf(stderr, "ringlm-sim: --prefix-cache %s: expected on or off\n", optarg);
                return 2;
            }
            break;
        case O_RECCOST:
            if (!strcmp(optarg, "on"))
                opt.recorded_costs = true;
            else if (!strcmp(optarg, "off"))
                opt.recorded_costs = false;
            else {
                fprintf(stderr, "ringlm-sim: --recorded-costs %s: expected on or off\n", optarg);
                return 2;
            }
            break;
        case O_PXREPORT: prefix_report = true; break;
        case O_KVB:
        case O_HKVB:
        case O_DKVB: {
            unsigned long v = strtoul(optarg, &e, 10);
            if (e == optarg || *e || v > (1ul << 28) || (c == O_KVB && !v)) goto bad_num;
            if (c == O_KVB)
                opt.kv_blocks_device = (uint32_t)v;
            else if (c == O_HKVB)
                kv_host = (long long)v;
            else
                kv_disk = (long long)v;
            break;
        }
        case O_AWIN: {
            unsigned long v = strtoul(optarg, &e, 10);
            if (e == optarg || *e || v > (1ul << 24)) goto bad_num;
            attention_window = (long long)v;
            break;
        }
        case O_WPAT:
            if (parse_window_pattern(optarg, &opt.window_pattern) < 0) {
                fprintf(stderr,
                        "ringlm-sim: --window-pattern %s: expected W:N (window W positions on N "
                        "of every N+1 layers, W 1..%u, N 1..%u), gemma2, gemma3, gemma2:W or "
                        "gemma3:W\n",
                        optarg, SIM_MAX_WINDOW, SIM_MAX_WINDOWED);
                return 2;
            }
            break;
        case O_WRINGS: {
            unsigned long v = strtoul(optarg, &e, 10);
            if (e == optarg || *e || !v || v > (1ul << 20)) goto bad_num;
            window_rings = (uint32_t)v;
            break;
        }
        case O_HBW:
        case O_DBW: {
            double v = strtod(optarg, &e);
            if (e == optarg || *e || !(v >= 1) || !(v <= 1e15)) goto bad_num;
            if (c == O_HBW)
                host_bw = v;
            else
                disk_bw = v;
            opt.tier_bw_given[c == O_HBW ? SCHED_POOL_HOST : SCHED_POOL_DISK] = true;
            break;
        }
        case O_SWEEP:
        case O_SWEEP_HOST:
        case O_SWEEP_DISK: {
            /* device sizes > 0; host and disk sizes >= 0 (0: no such tier), up to 2^28 as the
             * --*kv-blocks what-ifs */
            int w = c == O_SWEEP ? 0 : c == O_SWEEP_HOST ? 1 : 2;
            n_sweep[w] = 0;
            for (const char *p = optarg; *p; p = *e ? e + 1 : e) {
                if (*p < '0' || *p > '9') goto bad_num;
                unsigned long v = strtoul(p, &e, 10);
                if (e == p || (*e && *e != ',') || (!w && !v) || v > (1ul << 28) ||
                    n_sweep[w] == 64)
                    goto bad_num;
                sweep[w][n_sweep[w]++] = (uint32_t)v;
            }
            if (!n_sweep[w]) goto bad_num;
            break;
        }
        default: usage(stderr); return 2;
        }
        continue;
    bad_num:
        fprintf(stderr, "ringlm-sim: --%s %s: not a valid value\n", li >= 0 ? lo[li].name : "?",
                optarg);
        return 2;
    }
    if (optind < argc || (!trace_path == !workload)) {
        fprintf(stderr, "ringlm-sim: give exactly one of --trace FILE or --workload NAME\n");
        usage(stderr);
        return 2;
    }
    /* The plot directory before the run, which can take minutes: a typo there must not cost
     * them, nor end in an exit 0 with nothing written. */
    if (plot_dir) {
        struct stat st;
        if (mkdir(plot_dir, 0777) < 0 && errno != EEXIST) {
            fprintf(stderr, "ringlm-sim: --plot '%s': %s\n", plot_dir, strerror(errno));
            return 2;
        }
        if (stat(plot_dir, &st) < 0 || !S_ISDIR(st.st_mode) || access(plot_dir, W_OK | X_OK) < 0) {
            fprintf(stderr, "ringlm-sim: --plot '%s': %s\n", plot_dir,
                    errno ? strerror(errno) : "not a directory");
            return 2;
        }
    }

    int rc = 0, status = 1;
    sim_service svc;
    sim_trace trace;
    sim_scenario scn;
    memset(&scn, 0, sizeof scn);
    memset(&trace, 0, sizeof trace);
    sched_policy *pol[MAX_POLICIES] = {0};
    char pol_names[MAX_POLICIES][128];
    sim_run runs[MAX_POLICIES];
    sim_summary sums[MAX_POLICIES];
    int n_runs = 0;
    memset(runs, 0, sizeof runs);
    memset(sums, 0, sizeof sums);

    if (calib) {
        if ((rc = sim_service_load(&svc, calib, fit)) < 0) {
            fprintf(stderr, "ringlm-sim: %s\n", sim_err());
            return 1;
        }
    } else {
        sim_service_default(&svc);
    }
    if (speed_trace && !n_itlog) {
        fprintf(stderr, "ringlm-sim: --speed-trace needs --iteration-log (the recorded run's)\n");
        return 2;
    }
    if (speed_trace) svc.speed_window_us = (int64_t)llround(speed_ms * 1000);
    if (n_itlog && (rc = sim_service_fit_iterations(&svc, itlogs, (size_t)n_itlog)) < 0) {
        fprintf(stderr, "ringlm-sim: %s\n", sim_err());
        return 1;
    }
    /* the tier what-ifs (after any refit: they are the machine's KV figures, not the step's) */
    sim_service_set_tiers(&svc, kv_host, kv_disk, host_bw, disk_bw);
    if (attention_window >= 0) svc.attention_window = (uint32_t)attention_window;
    opt.svc = &svc;

    if (trace_path) {
        sim_trace_init(&trace, trace_path);
        if ((rc = sim_trace_load(&trace, trace_path, fmt, skip_bad)) < 0) {
            fprintf(stderr, "ringlm-sim: %s\n", sim_err());
            goto out;
        }
        if (trace.n_torn)
            fprintf(stderr,
                    "ringlm-sim: skipped %zu torn line(s) of %s (the start of a line cut short: "
                    "its writer died mid-write)\n",
                    trace.n_torn, trace_path);
        if (trace.n_bad_total) {
            fprintf(stderr, "ringlm-sim: skipped %zu bad lines of %s:\n", trace.n_bad_total,
                    trace_path);
            for (size_t i = 0; i < trace.n_bad && i < 20; i++)
                fprintf(stderr, "  %s:%u: %s\n", trace.source, trace.bad[i].line,
                        trace.bad[i].reason);
            if (trace.n_bad_total > 20)
                fprintf(stderr, "  ... (%zu more)\n", trace.n_bad_total - 20);
        }
    } else {
        if ((rc = sim_gen_workload(&trace, workload, params, (size_t)n_par, &svc, xf.seed, &scn)) <
            0) {
            fprintf(stderr, "ringlm-sim: %s\n", sim_err());
            goto out;
        }
    }
    if ((rc = sim_trace_transform(&trace, &xf)) < 0) {
        fprintf(stderr, "ringlm-sim: %s\n", sim_err());
        goto out;
    }
    if (compare_log) {
        status = compare_logs(&trace, compare_log, json);
        goto out;
    }
    if (want_fidelity && !trace.has_real) {
        fprintf(stderr, "ringlm-sim: --fidelity needs a native request log of a real run (with "
                        "first_token_us and finish_us)\n");
        goto out;
    }
    if (trace.n == 0) {
        fprintf(stderr, "ringlm-sim: the trace has no requests (after --window)\n");
        goto out;
    }

    if (n_pol == 0) policies[n_pol++] = NULL;
    for (int i = 0; i < n_pol; i++) {
        char *text = NULL;
        if (policies[i] && (rc = sim_read_file(policies[i], 64 << 20, &text, NULL)) < 0) {
            fprintf(stderr, "ringlm-sim: %s\n", sim_err());
            goto out;
        }
        sched_policy_error perr = {0};
        rc = sched_policy_parse(text ? text : "", &pol[i], &perr);
        free(text);
        if (rc < 0) {
            fprintf(stderr, "ringlm-sim: %s:%d: %s\n",
                    policies[i] ? policies[i] : "(default policy)", perr.line, perr.reason);
            goto out;
        }
        if (policies[i])
            base_name(policies[i], pol_names[i], sizeof pol_names[i]);
        else
            snprintf(pol_names[i], sizeof pol_names[i], "default");
    }

    /* --window-pattern: the policy's run with every layer global, then with the pattern */
    const int n_var = opt.window_pattern.window ? 2 : 1;
    char run_names[MAX_POLICIES][128];
    if (window_rings && !opt.window_pattern.window) {
        fprintf(stderr, "ringlm-sim: --window-rings needs --window-pattern\n");
        goto out;
    }
    opt.window_pattern.rings = window_rings;
    if (n_var > 1 && (n_pol > 1 || prefix_report || tune_spec || want_fidelity)) {
        fprintf(stderr, "ringlm-sim: --window-pattern compares one --policy with and without "
                        "the pattern (not with --prefix-report, --tune or --fidelity)\n");
        goto out;
    }
    if (n_var > 1 && attention_window > 0) {
        fprintf(stderr, "ringlm-sim: --window-pattern and --attention-window exclude each other "
                        "(the latter windows every layer)\n");
        goto out;
    }
    for (int i = 0; i < n_pol * n_var; i++) {
        const sim_window_pattern *wp = &opt.window_pattern;
        if (n_var == 1)
            snprintf(run_names[i], sizeof run_names[i], "%s", pol_names[i]);
        else if (i == 0)
            snprintf(run_names[i], sizeof run_names[i], "all-global");
        else
            snprintf(run_names[i], sizeof run_names[i], "window %u:%u/%u", wp->window, wp->windowed,
                     wp->period);
    }

    if (prefix_report) {
        sim_options o = opt;
        o.policy = pol[0];
        o.policy_name = pol_names[0];
        sim_prefix_sweep sw = {sweep[0], sweep[1], sweep[2], n_sweep[0], n_sweep[1], n_sweep[2]};
        if ((rc = sim_prefix_report(stdout, json, &trace, &o, &sw, plot_dir)) < 0) {
            fprintf(stderr, "ringlm-sim: %s\n", sim_err());
            goto out;
        }
        status = 0;
        goto out;
    }
    if (n_sweep[0] || n_sweep[1] || n_sweep[2]) {
        fprintf(stderr, "ringlm-sim: --capacity-sweep, --capacity-sweep-host and "
                        "--capacity-sweep-disk need --prefix-report\n");
        goto out;
    }

    if (tune_spec) {
        topt.spec = tune_spec;
        topt.run = opt;
        topt.base_name = pol_names[0];
        topt.progress = stderr;
        status = sim_tune_cli(&trace, pol[0], &topt, json, plot_dir, tune_out);
        goto out;
    }

    const int n_all = n_pol * n_var;
    for (int i = 0; i < n_all; i++) {
        sim_options o = opt;
        o.policy = pol[i / n_var];
        o.policy_name = run_names[i];
        if (n_var > 1 && i % n_var == 0) o.window_pattern.window = 0; /* the all-global run */
        FILE *dl = NULL;
        if (declog) {
            char path[1024];
            if (n_all > 1)
                snprintf(path, sizeof path, "%s-%s", declog, run_names[i]);
            else
                snprintf(path, sizeof path, "%s", declog);
            if (!(dl = fopen(path, "w"))) {
                fprintf(stderr, "ringlm-sim: %s: %s\n", path, strerror(errno));
                goto out;
            }
            o.decision_log = dl;
        }
        rc = sim_run_trace(&trace, &o, &runs[i]);
        n_runs = i + 1;
        if (dl && fclose(dl) != 0) {
            fprintf(stderr, "ringlm-sim: decision log: write error\n");
            goto out;
        }
        if (rc < 0) {
            fprintf(stderr, "ringlm-sim: %s: %s\n", run_names[i], sim_err());
            goto out;
        }
        int64_t b0 = burst0 >= 0 ? (int64_t)llround(burst0 * 1e6) : -1,
                b1 = burst1 >= 0 ? (int64_t)llround(burst1 * 1e6) : -1;
        if ((rc = sim_summarise(&runs[i], workload ? &scn : NULL, b0, b1, &sums[i])) < 0) {
            fprintf(stderr, "ringlm-sim: out of memory\n");
            goto out;
        }
        const char *tag = n_all > 1 ? run_names[i] : "";
        if (reqlog) {
            char path[1024];
            if (n_all > 1)
                snprintf(path, sizeof path, "%s-%s", reqlog, run_names[i]);
            else
                snprintf(path, sizeof path, "%s", reqlog);
            FILE *rf = fopen(path, "w");
            if (!rf) {
                fprintf(stderr, "ringlm-sim: %s: %s\n", path, strerror(errno));
                goto out;
            }
            rc = sim_report_request_log(rf, &runs[i]);
            if (fclose(rf) != 0 || rc < 0) {
                fprintf(stderr, "ringlm-sim: %s: write error\n", path);
                goto out;
            }
        }
        if (csv_dir && (rc = sim_report_csv(csv_dir, tag, &runs[i])) < 0) {
            fprintf(stderr, "ringlm-sim: %s\n", sim_err());
            goto out;
        }
        if (plot_dir && (rc = sim_report_plot(plot_dir, n_all > 1 ? run_names[i] : "run", &runs[i],
                                              stderr)) < 0) {
            fprintf(stderr, "ringlm-sim: %s\n", sim_err());
            goto out;
        }
    }

    if (plot_dir && n_runs > 1) {
        const sim_run *rp[MAX_POLICIES];
        for (int i = 0; i < n_runs; i++) rp[i] = &runs[i];
        if ((rc = sim_report_plot_compare(plot_dir, rp, (size_t)n_runs, NULL)) < 0) {
            fprintf(stderr, "ringlm-sim: %s\n", sim_err());
            goto out;
        }
    }
    /* fidelity with the run's own iterations: what no simulation with this model can beat */
    sim_dist floor = {0};
    bool have_floor = false;
    if (want_fidelity && n_itlog) {
        double *fe = malloc((trace.n ? trace.n : 1) * sizeof *fe);
        size_t nf = 0;
        if (fe && sim_service_noise_floor(&svc, trace.reqs, trace.n, fe, &nf) == 0 && nf) {
            sim_dist_of(fe, nf, &floor);
            have_floor = true;
        }
        free(fe);
    }
    /* with --window-pattern: the ring count at which a sequence of the trace's mean length
     * runs out of global blocks and of rings together, in the same memory */
    double mean_len = 0;
    uint32_t balanced = 0;
    if (n_var > 1 && trace.n) {
        const sim_window_layout *wl = &runs[1].window;
        for (size_t k = 0; k < trace.n; k++)
            mean_len += (double)trace.reqs[k].prompt_tokens + trace.reqs[k].output_tokens;
        mean_len /= (double)trace.n;
        const double bs = svc.kv_block_size, bpt = svc.kv_bytes_per_token,
                     per_seq = (ceil(mean_len / bs) * wl->bytes_per_token +
                                wl->ring_blocks * (bpt - wl->bytes_per_token)) /
                               bpt; /* blocks of every layer */
        const uint32_t cap = sched_policy_get(pol[0])->max_active_seqs;
        balanced =
            (uint32_t)fmin(fmax((double)(uint32_t)(runs[0].kv_blocks_device / per_seq), 1), cap);
    }
    if (json) {
        json_t *root;
        if (n_runs == 1) {
            root = sim_report_json(&runs[0], &sums[0], &svc);
            if (have_floor)
                json_object_set_new(root, "noise_floor",
                                    json_pack("{s:s,s:I,s:f,s:f,s:f}", "iteration_log", itlogs[0],
                                              "n", (json_int_t)floor.n, "e2e_p50", floor.p50,
                                              "e2e_p99", floor.p99, "e2e_max", floor.max));
        } else {
            json_t *arr = json_array();
            for (int i = 0; i < n_runs; i++)
                json_array_append_new(arr, sim_report_json(&runs[i], &sums[i], &svc));
            root = json_pack("{s:o}", "runs", arr);
            if (n_var > 1)
                json_object_set_new(root, "window_balanced_rings", json_integer(balanced));
        }
        char *s = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        if (s) {
            fputs(s, stdout);
            fputc('\n', stdout);
            free(s);
        }
        json_decref(root);
    } else if (n_runs == 1) {
        sim_report_table(stdout, &runs[0], &sums[0], &svc);
        if (have_floor)
            printf("noise floor (if %s is this run's log): the fitted model summed over each "
                   "request's real "
                   "iterations misses their measured sum by median %.1f%% p99 %.1f%% max %.1f%% (n "
                   "%zu): the error left "
                   "with the real schedule given (per-iteration noise the model cannot know)\n",
                   itlogs[0], floor.p50 * 100, floor.p99 * 100, floor.max * 100, floor.n);
    } else {
        const sim_run *rp[MAX_POLICIES];
        const sim_summary *sp[MAX_POLICIES];
        for (int i = 0; i < n_runs; i++) {
            rp[i] = &runs[i];
            sp[i] = &sums[i];
        }
        printf("trace %s: %zu requests over %.1f s; service %s", trace.source, trace.n,
               sums[0].span_s, svc.source);
        if (svc.it_points) printf(", step model fitted to the iterations of %s", svc.it_source);
        printf("\n\n");
        sim_report_compare(stdout, rp, sp, (size_t)n_runs);
        if (n_var > 1) {
            const sim_window_layout *wl = &runs[1].window;
            const sim_window_pattern *wp = &opt.window_pattern;
            const double blk = (double)svc.kv_block_size;
            printf("\n%s: %u of every %u layers attend to the last %u positions. In the memory "
                   "of %u blocks of every layer\n(%.0f bytes each): %u blocks of the global "
                   "layers (%.0f bytes each) and %u rings of %u blocks\n(the window and %u rows; "
                   "%llu bytes a ring), a ring per running sequence. For the trace's mean "
                   "sequence\n(%.0f positions) the rings and the global blocks run out together "
                   "at about %u rings (--window-rings).\n",
                   run_names[1], wp->windowed, wp->period, wp->window, runs[0].kv_blocks_device,
                   blk * svc.kv_bytes_per_token, wl->blocks, blk * wl->bytes_per_token, wl->rings,
                   wl->ring_blocks, wl->ring_rows, (unsigned long long)wl->ring_bytes, mean_len,
                   balanced);
        }
    }
    status = 0;
out:
    for (int i = 0; i < n_runs; i++) {
        sim_summary_free(&sums[i]);
        sim_run_free(&runs[i]);
    }
    for (int i = 0; i < n_pol; i++) sched_policy_free(pol[i]);
    sim_trace_free(&trace);
    sim_service_free(&svc);
    return status;
}
