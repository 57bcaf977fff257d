/* SPDX-License-Identifier: MIT */
/*
 * prefix_bench — what the prefix cache buys on a real ringlmd, cache on against cache off in
 * one run (DESIGN §10).
 *
 * Workload "shared-prefix", closed loop: --concurrency conversations at a time, --conversations
 * in all.  A conversation is a system prompt (one of --system-prompts, --system-len tokens,
 * shared by every conversation that picks it) followed by 1..--turns turns; each turn's prompt
 * is the previous prompt + the answer the daemon gave + a new user message (8..24 tokens); a
 * fraction --one-off of conversations is one unique prompt instead.  The same seed gives the
 * same prompts to both daemons (greedy: the answers are equal too).  A second workload with
 * no shared prefixes at all (every prompt unique, the same lengths) measures what the cache
 * costs when it cannot help.
 *
 * Each phase starts its own ringlmd (cache on, or --no-prefix-cache) from the build's bin/,
 * runs the workload, reads the daemon's /metrics and decision log, stops it.  Phases
 * alternate off/on --rounds times; figures are medians over rounds.
 *
 *   ttft_p50_ms       {on, off}: median over requests of submit → first token (median of rounds)
 *   prefill_tokens    {on, off}: prompt tokens the engine computed = ringlm_iteration_tokens_total
 *                     − decode rows (Σ(generated − 1)); recompute included
 *   hit_rate          vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total (on)
 *   nosharing_throughput_ratio  generated tokens per second on / off on the no-sharing
 *                     workload (--nosharing-requests unique prompts a run, default 240: the
 *                     device pool fills and every admission evicts, the cache's steady state),
 *                     --nosharing-pairs on/off pairs (default 6) run after the shared-prefix
 *                     rounds in ABBA order (off on, on off, off on, ...) so that drift of the
 *                     machine falls on both: the median of the per-pair ratios, with their
 *                     spread (lowest, quartiles, highest) and the daemon's CPU time per
 *                     generated token on / off (utime + stime over the timed window: less
 *                     sensitive than wall time to what else runs on the machine)
 *   nosharing.side_by_side  the same workload with the on and off daemons running at the same
 *                     time (--nosharing-side-by-side pairs, default 4; 0: none), each with its
 *                     own client: the machine's drift and the other engineers' builds fall on
 *                     both alike, so the ratio holds on a loaded machine; the two compete for
 *                     the CPUs, so it is the daemons' relative efficiency (a daemon that needs
 *                     more CPU per token gets fewer tokens), not either's throughput alone.
 *                     The two start their timed windows together and stop both when the
 *                     first has served its workload; tokens are counted as they stream
 *   replay            the on phase's request log replayed in ringlm-sim (same pools, the
 *                     stories260K calibration when present): its hit rate against the daemon's
 *                     metrics, in percentage points
 *   tiers             the shared-prefix workload with --tier-system-prompts (16) system prompts,
 *                     so that its working set outgrows a device pool of --tier-kv-blocks (128,
 *                     room for the running conversations and a few prompts): "host" adds a host tier (on and off),
 *                     "disk" a small host tier and a disk tier, "disk_slow" the same with the
 *                     disk's bandwidth told low to the cost model (--disk-kv-bw 1e6: a block
 *                     20 ms to reload) — hit rate per tier, blocks demoted,
 *                     reloaded and recomputed instead (decision log: cache_reload with choice
 *                     recompute), blocks dropped instead of demoted, TTFT p50, and the replay
 *   goals             ttft_ratio >= 3, prefill_saved >= 0.70, nosharing ratio >= 0.97,
 *                     replay within 2 points: the shared-prefix run (replay_within_2pp) and,
 *                     when tier scenarios ran, the worst of theirs (replay_tiers_worst_pp,
 *                     replay_tiers_within_2pp); each scenario's replay also lists its rounds'
 *                     deltas
 *
 * usage: prefix_bench [--json] [--rounds N] [--conversations N] [--concurrency N]
 *                     [--turns N] [--system-prompts N] [--system-len N] [--one-off F]
 *                     [--max-tokens N] [--model PATH] [--bin DIR] [--seed N]
 *                     [--tiers host,disk,disk_slow|none] [--tier-kv-blocks N]
 *                     [--tier-system-prompts N] [--calibration FILE] [--keep]
 *                     [--nosharing-requests N] [--nosharing-pairs N] [--nosharing-only]
 *                     [--nosharing-kv-blocks N] [--nosharing-side-by-side N]
 *                     [--context N] [--no-replay] [--ringlmd-arg ARG]...
 *
 * --ringlmd-arg ARG (repeatable, at most 6) is passed to every phase's ringlmd after the
 * bench's own options (as --ringlmd-arg --kv-ring-snapshot-bytes --ringlmd-arg 45M).
 *
 * --context N ends a conversation before its prompt and answer pass N tokens (default and
 * most 480, for stories260K's 512; a model of a shorter context, as a gemma3-shaped
 * stories15M of 256, needs less).  --no-replay skips the ringlm-sim replays (the simulator
 * does not model window rings: with a gemma model its hit rate is not the daemon's).
 *
 * --nosharing-kv-blocks gives the no-sharing runs' daemons that device pool (0: ringlmd's
 * default): with the cache on, the pool's every block is written in turn; with it off, the
 * same few.  --nosharing-only runs only the no-sharing pairs (the quiet rerun of that goal:
 * `build/perf/prefix_bench --nosharing-only --json`).  --keep leaves the phases' daemon,
 * decision and request logs in the temporary directory (named on stderr) instead of
 * removing it; PREFIX_BENCH_TRACE=1 prints each phase's ringlmd pid (for `perf report
 * --pid`) and each replay's ringlm-sim command line.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perf/bench_util.h"
#include "ringlm.h"

#define VOCAB      512
#define MAX_CTX    480 /* stories260K's context is 512: leave room for the answer */
#define MAX_ROUNDS 16
#define MAX_PAIRS  32
#define N_POOLS    3 /* device, host, disk: the daemon's tier labels */

static const char *const pool_name[N_POOLS] = {"device", "host", "disk"};

/* ---- the daemon ---------------------------------------------------------------------------- */

/* How a phase's ringlmd is set up. */
typedef struct setup {
    bool cache;
    int kv_blocks;      /* 0: ringlmd's default (1024) */
    int host_kv_blocks; /* 0: no host tier */
    int disk_kv_blocks; /* 0: no disk tier */
    double disk_kv_bw;  /* the cost model's starting disk bandwidth (0: ringlmd's) */
} setup;

/* A phase's daemon, per thread: the side-by-side pairs run two phases at once. */
static __thread pid_t daemon_pid = -1;
/* --ringlmd-arg: passed to every phase's ringlmd */
#define MAX_RINGLMD_ARGS 6
static const char *ringlmd_args[MAX_RINGLMD_ARGS];
static int n_ringlmd_args;
static __thread int metrics_port;
static __thread char declog[256], reqlog[256], sock[256];
static pthread_mutex_t children_mu =
    PTHREAD_MUTEX_INITIALIZER; /* bench_children, the phase count */

static void start_daemon(const char *bin, const char *model, const setup *st)
{
    static int phases;
    char ringlmd[600], log[256], kvb[16], hkvb[16], dkvb[16], dbw[32], disk[256];
    snprintf(ringlmd, sizeof ringlmd, "%s/ringlmd", bin);
    pthread_mutex_lock(&children_mu);
    int phase = ++phases; /* each phase its own files: never an old one's port, log or socket */
    pthread_mutex_unlock(&children_mu);
    snprintf(sock, sizeof sock, "%s/s-%d.sock", bench_dir, phase);
    snprintf(log, sizeof log, "%s/ringlmd-%d.log", bench_dir, phase);
    snprintf(declog, sizeof declog, "%s/decisions-%d.jsonl", bench_dir, phase);
    snprintf(reqlog, sizeof reqlog, "%s/requests-%d.jsonl", bench_dir, phase);
    snprintf(disk, sizeof disk, "%s/disk-%d.kv", bench_dir, phase);
    unlink(sock);
    char *argv[32];
    int n = 0;
    argv[n++] = ringlmd;
    argv[n++] = "--socket";
    argv[n++] = sock;
    argv[n++] = "--numa-node";
    argv[n++] = "off";
    argv[n++] = "--model";
    argv[n++] = (char *)model;
    argv[n++] = "--metrics";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--decision-log";
    argv[n++] = declog;
    argv[n++] = "--request-log";
    argv[n++] = reqlog;
    if (!st->cache) argv[n++] = "--no-prefix-cache";
    if (st->kv_blocks) {
        snprintf(kvb, sizeof kvb, "%d", st->kv_blocks);
        argv[n++] = "--kv-blocks";
        argv[n++] = kvb;
    }
    if (st->host_kv_blocks) {
        snprintf(hkvb, sizeof hkvb, "%d", st->host_kv_blocks);
        argv[n++] = "--host-kv-blocks";
        argv[n++] = hkvb;
    }
    if (st->disk_kv_blocks) {
        snprintf(dkvb, sizeof dkvb, "%d", st->disk_kv_blocks);
        argv[n++] = "--disk-kv";
        argv[n++] = disk;
        argv[n++] = "--disk-kv-blocks";
        argv[n++] = dkvb;
        if (st->disk_kv_bw > 0) {
            snprintf(dbw, sizeof dbw, "%.0f", st->disk_kv_bw);
            argv[n++] = "--disk-kv-bw";
            argv[n++] = dbw;
        }
    }
    for (int i = 0; i < n_ringlmd_args; i++) argv[n++] = (char *)ringlmd_args[i];
    argv[n] = NULL;
    pthread_mutex_lock(&children_mu);
    daemon_pid = bench_spawn(argv, log);
    pthread_mutex_unlock(&children_mu);
    if (getenv("PREFIX_BENCH_TRACE"))
        fprintf(stderr, "prefix_bench: phase %d: ringlmd pid %d, cache %s\n", phase,
                (int)daemon_pid, st->cache ? "on" : "off");
    metrics_port = bench_port_from_log(log, "ringlmd: metrics on port ", daemon_pid);
    bench_wait_path(sock);
}

/* ---- the workload ---------------------------------------------------------------------- */

static __thread uint64_t rng_state;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int32_t tok(void)
{
    return (int32_t)(3 + rnd() % (VOCAB - 3));
}

typedef struct conv {
    int32_t p[MAX_CTX + 64];
    uint32_t n; /* prompt so far */
    int turns, turn;
    uint64_t req, t0;
    bool got_first, active;
    uint64_t seed;
} conv;

typedef struct cfg {
    int conversations, concurrency, turns, system_prompts, system_len, max_new;
    double one_off;
    uint64_t seed;
} cfg;

/* One phase's figures.  Every field is a double so that medians over rounds are taken field
 * by field (result_median). */
typedef struct result {
    double ttft_p50_ms, tokens_per_s, prefill_tokens, hit_rate, prompt_tokens, requests, generated;
    double cpu_us_per_token;       /* the daemon's CPU time (all threads) over the timed
					       window / generated tokens */
    double hit_rate_tier[N_POOLS]; /* hits found in that tier / tokens queried */
    double demoted[N_POOLS], reloaded[N_POOLS], recomputed[N_POOLS], dropped[N_POOLS];
    double replay_hit_rate; /* ringlm-sim on the phase's request log (-1: not run) */
} result;

/* Sets up conversation i: its system prompt (or a unique one), its turn count. */
static void conv_init(const cfg *c, conv *v, int i, bool sharing)
{
    memset(v, 0, sizeof *v);
    rng_state = c->seed * 1000003u + (uint64_t)i;
    bool single = !sharing || (double)(rnd() % 10000) / 10000.0 < c->one_off;
    v->turns = single ? 1 : 1 + (int)(rnd() % (uint64_t)c->turns);
    uint64_t sys = rnd() % (uint64_t)c->system_prompts;
    if (single) {
        for (int k = 0; k < c->system_len; k++) v->p[v->n++] = tok();
    } else {
        uint64_t save = rng_state;
        rng_state = 0xabcdef12345ull + sys * 7919u;
        for (int k = 0; k < c->system_len; k++) v->p[v->n++] = tok();
        rng_state = save;
    }
    v->seed = rng_state;
    v->active = true;
}

static uint32_t max_ctx = MAX_CTX; /* --context */

/* Appends the next user message; false when the context is full (the conversation ends). */
static bool conv_next_turn(conv *v)
{
    rng_state = v->seed;
    uint32_t nu = 8 + (uint32_t)(rnd() % 17);
    if (v->n + nu + 40 > max_ctx) return false;
    for (uint32_t k = 0; k < nu; k++) v->p[v->n++] = tok();
    v->seed = rng_state;
    return true;
}

static void submit(ringlm_client *cl, const cfg *c, conv *v)
{
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = v->p;
    r.n_prompt = v->n;
    r.max_new_tokens = (uint32_t)c->max_new;
    int rc;
    while ((rc = ringlm_submit(cl, &r, &v->req)) == -EAGAIN) usleep(100);
    if (rc < 0) bench_die("submit: %s %s", ringlm_strerror(rc), ringlm_errdetail());
    v->t0 = bench_now_us();
    v->got_first = false;
}

/* What the cache's events in the decision log say: blocks of runs found on host or disk that
 * the cost model chose to recompute (cache_reload, choice recompute — the planning record,
 * not its "done" record) and blocks dropped under demand instead of demoted (cache_evict,
 * reason demand), per pool. */
static void read_declog(const char *path, result *r)
{
    FILE *f = fopen(path, "r");
    if (!f) bench_die("%s: %s", path, strerror(errno));
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        bool reload = strstr(line, "\"ev\":\"cache_reload\"") &&
                      strstr(line, "\"choice\":\"recompute\"") && !strstr(line, "\"reason\"");
        bool evict =
            strstr(line, "\"ev\":\"cache_evict\"") && strstr(line, "\"reason\":\"demand\"");
        if (!reload && !evict) continue;
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        if (!j) bench_die("%s: a line is not JSON (%s): %s", path, e.text, line);
        const char *pool = json_string_value(json_object_get(j, "pool"));
        double blocks = (double)json_integer_value(json_object_get(j, "blocks"));
        for (int p = 0; pool && p < N_POOLS; p++)
            if (!strcmp(pool, pool_name[p])) {
                if (reload)
                    r->recomputed[p] += blocks;
                else
                    r->dropped[p] += blocks;
            }
        json_decref(j);
    }
    fclose(f);
}

/* CPU time (user + system, every thread) process pid has used, in microseconds. */
static double proc_cpu_us(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) bench_die("%s: %s", path, strerror(errno));
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* fields after the command name (which may hold spaces): state is field 3, utime 14,
	 * stime 15 */
    char *p = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        bench_die("%s: cannot read utime and stime", path);
    return (double)(ut + st) * 1e6 / (double)sysconf(_SC_CLK_TCK);
}

/* The phase's request log replayed in ringlm-sim with the same pools: the replay's hit rate.
 * The log's lines carry the daemon's cost model at each admission (sched_cost: its step-time
 * correction, the tier bandwidths its copies measured), which the replay decides and copies
 * with, so no bandwidth is given here. */
static double replay(const char *bin, const char *calibration, const setup *st, const char *log)
{
    char cmd[2048], calib[700] = "";
    if (calibration && *calibration)
        snprintf(calib, sizeof calib, " --calibration %s", calibration);
    int n = snprintf(cmd, sizeof cmd,
                     "%s/ringlm-sim --trace %s --json%s --kv-blocks %d --host-kv-blocks %d", bin,
                     log, calib, st->kv_blocks ? st->kv_blocks : 1024, st->host_kv_blocks);
    if (st->disk_kv_blocks)
        snprintf(cmd + n, sizeof cmd - (size_t)n, " --disk-kv-blocks %d", st->disk_kv_blocks);
    if (getenv("PREFIX_BENCH_TRACE")) fprintf(stderr, "prefix_bench: %s\n", cmd);
    FILE *p = popen(cmd, "r");
    if (!p) bench_die("%s: %s", cmd, strerror(errno));
    json_error_t e;
    json_t *j = json_loadf(p, JSON_DISABLE_EOF_CHECK, &e);
    int rc = pclose(p);
    if (!j || rc != 0)
        bench_die("%s: exit status %d%s%s", cmd, rc,
                  j ? "" : "; output not JSON: ", j ? "" : e.text);
    json_t *pc = json_object_get(j, "prefix_cache");
    if (!pc) bench_die("%s: no prefix_cache in its output", cmd);
    double h = json_real_value(json_object_get(pc, "hit_rate"));
    json_decref(j);
    return h;
}

/* Two phases run side by side: they start their timed windows together and both end it
 * when the first has served its workload, so each one's tokens and CPU time are counted over
 * the same seconds. */
typedef struct side_sync {
    pthread_barrier_t start;
    int over; /* set (atomically) by the first to finish */
} side_sync;

typedef struct phase_opts {
    const char *bin, *model, *calibration;
    bool replay;
    side_sync *sync; /* NULL: a phase alone */
} phase_opts;

static result run_phase(const phase_opts *po, const cfg *c, const setup *st, bool sharing)
{
    start_daemon(po->bin, po->model, st);
    ringlm_client *cl;
    int rc = ringlm_connect(sock, &cl);
    if (rc < 0) bench_die("connect: %s %s", ringlm_strerror(rc), ringlm_errdetail());
    conv *cv = calloc((size_t)c->concurrency, sizeof *cv);
    size_t cap_t = (size_t)c->conversations * (size_t)(c->turns + 1), nt = 0;
    double *ttft = malloc(cap_t * sizeof *ttft);
    if (!cv || !ttft) bench_die("out of memory");
    int started = 0, done = 0;
    if (po->sync) pthread_barrier_wait(&po->sync->start);
    double cpu0 = proc_cpu_us(daemon_pid);
    uint64_t generated = 0, decode_rows = 0, prompt_tokens = 0, t_start = bench_now_us(),
             tokens = 0;
    bool cut = false; /* side by side: the other phase finished first */
    for (int s = 0; s < c->concurrency && started < c->conversations; s++) {
        conv_init(c, &cv[s], started++, sharing);
        conv_next_turn(&cv[s]);
        prompt_tokens += cv[s].n;
        submit(cl, c, &cv[s]);
    }
    while (done < c->conversations) {
        if (po->sync && __atomic_load_n(&po->sync->over, __ATOMIC_ACQUIRE)) {
            cut = true;
            break;
        }
        ringlm_event ev;
        rc = ringlm_next_event(cl, &ev, 60000);
        if (rc <= 0)
            bench_die("next_event: %s %s", rc ? ringlm_strerror(rc) : "timeout",
                      ringlm_errdetail());
        int s = 0;
        while (s < c->concurrency && !(cv[s].active && cv[s].req == ev.req_id)) s++;
        if (s == c->concurrency) continue;
        conv *v = &cv[s];
        if (ev.kind == RINGLM_EV_TOKEN) {
            tokens++;
            if (!v->got_first) {
                v->got_first = true;
                if (nt < cap_t) ttft[nt++] = (double)(bench_now_us() - v->t0) / 1000.0;
            }
            if (v->n < MAX_CTX + 60)
                v->p[v->n++] = ev.token; /* the answer joins the conversation */
            continue;
        }
        if (ev.kind != RINGLM_EV_FINISH) continue;
        if (ev.finish_reason != RINGLM_FINISH_LENGTH && ev.finish_reason != RINGLM_FINISH_STOP)
            bench_die("request ended %s", ringlm_reason_name(ev.finish_reason));
        generated += ev.n_tokens;
        decode_rows += ev.n_tokens ? ev.n_tokens - 1 : 0;
        if (++v->turn < v->turns && conv_next_turn(v)) {
            prompt_tokens += v->n;
            submit(cl, c, v);
            continue;
        }
        v->active = false;
        done++;
        if (started < c->conversations) {
            conv_init(c, v, started++, sharing);
            conv_next_turn(v);
            prompt_tokens += v->n;
            submit(cl, c, v);
        }
    }
    double wall = (double)(bench_now_us() - t_start) / 1e6;
    double cpu = proc_cpu_us(daemon_pid) - cpu0;
    ringlm_close(cl);
    result r;
    memset(&r, 0, sizeof r);
    if (po->sync) {
        /* side by side: the tokens each served over the common window, and its CPU time */
        __atomic_store_n(&po->sync->over, 1, __ATOMIC_RELEASE);
        pthread_mutex_lock(&children_mu);
        int status = bench_stop(&daemon_pid); /* requests still running when cut: cancelled */
        pthread_mutex_unlock(&children_mu);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            bench_die("ringlmd ended with status %#x", status);
        r.tokens_per_s = (double)tokens / wall;
        r.cpu_us_per_token = tokens ? cpu / (double)tokens : 0;
        r.generated = (double)tokens;
        r.requests = cut ? -1 : (double)nt;
        free(cv);
        free(ttft);
        return r;
    }
    /* the counters are published every few ms: read until every admission is counted (cache
	 * on: queries reach the prompt tokens) and two reads agree */
    double prev = -1;
    for (int i = 0; i < 500; i++) {
        char *m = bench_http_get(metrics_port, "/metrics");
        double it = bench_metric(m, "ringlm_iteration_tokens_total"),
               q = bench_metric(m, "vllm:prefix_cache_queries_total");
        r.hit_rate = q > 0 ? bench_metric(m, "vllm:prefix_cache_hits_total") / q : 0;
        for (int p = 0; p < N_POOLS; p++) {
            char name[128];
            double hits = 0;
            for (int k = 0; k < 2; k++) {
                snprintf(name, sizeof name,
                         "ringlm_prefix_cache_hits_total{tier=\"%s\",kind=\"%s\"}", pool_name[p],
                         k ? "self" : "cross");
                const char *at = strstr(m, name);
                if (at) hits += strtod(at + strlen(name), NULL);
            }
            r.hit_rate_tier[p] = q > 0 ? hits / q : 0;
            snprintf(name, sizeof name, "ringlm_prefix_cache_demoted_blocks_total{tier=\"%s\"}",
                     pool_name[p]);
            const char *at = strstr(m, name);
            r.demoted[p] = at ? strtod(at + strlen(name), NULL) : 0;
            snprintf(name, sizeof name, "ringlm_prefix_cache_reloaded_blocks_total{tier=\"%s\"}",
                     pool_name[p]);
            at = strstr(m, name);
            r.reloaded[p] = at ? strtod(at + strlen(name), NULL) : 0;
        }
        free(m);
        r.prefill_tokens = it - (double)decode_rows;
        if (it > 0 && it == prev && (!st->cache || q >= (double)prompt_tokens)) break;
        prev = it;
        usleep(10000);
    }
    pthread_mutex_lock(&children_mu);
    int status = bench_stop(&daemon_pid);
    pthread_mutex_unlock(&children_mu);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        bench_die("ringlmd ended with status %#x", status);
    read_declog(declog, &r);
    r.replay_hit_rate =
        po->replay && st->cache && sharing ? replay(po->bin, po->calibration, st, reqlog) : -1;
    r.ttft_p50_ms = bench_median(ttft, (int)nt);
    r.tokens_per_s = (double)generated / wall;
    r.cpu_us_per_token = generated ? cpu / (double)generated : 0;
    r.requests = (double)nt;
    r.generated = (double)generated;
    r.prompt_tokens = (double)prompt_tokens;
    free(cv);
    free(ttft);
    return r;
}

/* Two phases at the same time, each with its own daemon and client (a thread each): both
 * see the same machine over the same seconds, so what else runs on it falls on both. */
typedef struct side_arg {
    const phase_opts *po;
    const cfg *c;
    const setup *st;
    result r;
} side_arg;

static void *side_main(void *p)
{
    side_arg *a = p;
    a->r = run_phase(a->po, a->c, a->st, false);
    return NULL;
}

static void side_by_side(const phase_opts *po, const cfg *c, const setup *on, const setup *off,
                         result *r_on, result *r_off)
{
    side_sync sync = {.over = 0};
    pthread_barrier_init(&sync.start, NULL, 2);
    phase_opts sp = *po;
    sp.sync = &sync;
    sp.replay = false;
    side_arg a = {.po = &sp, .c = c, .st = on};
    pthread_t t;
    if (pthread_create(&t, NULL, side_main, &a) != 0) bench_die("pthread_create failed");
    *r_off = run_phase(&sp, c, off, false);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&sync.start);
    *r_on = a.r;
}

/* Field by field median of rs[0..n). */
static result result_median(const result *rs, int n)
{
    result m;
    double v[MAX_ROUNDS];
    for (size_t off = 0; off < sizeof m; off += sizeof(double)) {
        for (int i = 0; i < n; i++) memcpy(&v[i], (const char *)&rs[i] + off, sizeof(double));
        double x = bench_median(v, n);
        memcpy((char *)&m + off, &x, sizeof x);
    }
    return m;
}

/* ---- output ---------------------------------------------------------------------------------- */

static json_t *per_pool(const double *v, int from)
{
    json_t *o = json_object();
    for (int p = from; p < N_POOLS; p++) json_object_set_new(o, pool_name[p], json_real(v[p]));
    return o;
}

/* The replay's hit rate and the daemon's (medians over rounds) and delta_pp, the median over
 * rounds of each round's difference (sim − daemon, percentage points: the same run's). */
static json_t *replay_json(double sim, double daemon, double delta_pp)
{
    return json_pack("{s:f,s:f,s:f}", "sim_hit_rate", sim, "daemon_hit_rate", daemon, "delta_pp",
                     delta_pp);
}

/* A tier scenario: the cache's figures on, TTFT on (and off when measured); its replay's
 * delta per round, in run order, beside the median. */
static json_t *tier_json(const setup *st, int prompts, const result *on, const result *off,
                         double delta_pp, const double *round_pp, int rounds)
{
    json_t *o =
        json_pack("{s:i,s:i,s:i,s:i}", "system_prompts", prompts, "kv_blocks", st->kv_blocks,
                  "host_kv_blocks", st->host_kv_blocks, "disk_kv_blocks", st->disk_kv_blocks);
    if (st->disk_kv_bw > 0) json_object_set_new(o, "disk_kv_bw", json_real(st->disk_kv_bw));
    json_t *t = json_pack("{s:f}", "on", on->ttft_p50_ms);
    if (off) json_object_set_new(t, "off", json_real(off->ttft_p50_ms));
    json_object_set_new(o, "ttft_p50_ms", t);
    json_object_set_new(o, "hit_rate", json_real(on->hit_rate));
    json_object_set_new(o, "hit_rate_by_tier", per_pool(on->hit_rate_tier, 0));
    json_object_set_new(o, "demoted_blocks", per_pool(on->demoted, 1));
    json_object_set_new(o, "reloaded_blocks", per_pool(on->reloaded, 1));
    json_object_set_new(o, "recomputed_blocks", per_pool(on->recomputed, 1));
    json_object_set_new(o, "dropped_blocks", per_pool(on->dropped, 0));
    if (on->replay_hit_rate >= 0) {
        json_t *rp = replay_json(on->replay_hit_rate, on->hit_rate, delta_pp), *a = json_array();
        for (int i = 0; i < rounds; i++) json_array_append_new(a, json_real(round_pp[i]));
        json_object_set_new(rp, "delta_pp_rounds", a);
        json_object_set_new(o, "replay", rp);
    }
    return o;
}

static void tier_text(const char *name, const setup *st, const result *on, const result *off,
                      double delta_pp)
{
    printf("  tiers %-9s device %d + host %d + disk %d blocks%s: TTFT p50 on %.2f ms", name,
           st->kv_blocks, st->host_kv_blocks, st->disk_kv_blocks,
           st->disk_kv_bw > 0 ? " (disk bw told low)" : "", on->ttft_p50_ms);
    if (off) printf(" off %.2f ms", off->ttft_p50_ms);
    printf(
        "\n      hit rate %.1f%% (device %.1f%%, host %.1f%%, disk %.1f%%); demoted host %.0f disk "
        "%.0f; reloaded host "
        "%.0f disk %.0f; recomputed instead host %.0f disk %.0f; dropped device %.0f host %.0f\n",
        100 * on->hit_rate, 100 * on->hit_rate_tier[0], 100 * on->hit_rate_tier[1],
        100 * on->hit_rate_tier[2], on->demoted[1], on->demoted[2], on->reloaded[1],
        on->reloaded[2], on->recomputed[1], on->recomputed[2], on->dropped[0], on->dropped[1]);
    if (on->replay_hit_rate >= 0)
        printf("      replayed in ringlm-sim: hit rate %.1f%% (%+.2f points)\n",
               100 * on->replay_hit_rate, delta_pp);
}

int main(int argc, char **argv)
{
    bench_prog = "prefix_bench";
    cfg c = {.conversations = 48,
             .concurrency = 4,
             .turns = 4,
             .system_prompts = 4,
             .system_len = 320,
             .max_new = 24,
             .one_off = 0.1,
             .seed = 1};
    int rounds = 3, tier_kv_blocks = 128, tier_prompts = 16, ns_requests = 240, ns_pairs = 6,
        ns_kv_blocks = 0, ns_side = 4;
    bool json = false, do_host = true, do_disk = true, do_slow = true, keep = false,
         ns_only = false;
    char model[512] = "", bin[512] = "build/bin",
         calibration[512] = "perf/calibrations/stories260K-epyc-2vcpu.json";
    const char *shared = getenv("RINGLM_SHARED");
    snprintf(model, sizeof model, "%s/models/stories260K.bin", shared ? shared : "../shared");
    static const struct option lo[] = {{"json", 0, 0, 'j'},
                                       {"rounds", 1, 0, 'r'},
                                       {"conversations", 1, 0, 'n'},
                                       {"concurrency", 1, 0, 'c'},
                                       {"turns", 1, 0, 't'},
                                       {"system-prompts", 1, 0, 'k'},
                                       {"system-len", 1, 0, 'l'},
                                       {"one-off", 1, 0, 'o'},
                                       {"model", 1, 0, 'm'},
                                       {"bin", 1, 0, 'b'},
                                       {"seed", 1, 0, 's'},
                                       {"max-tokens", 1, 0, 'x'},
                                       {"tiers", 1, 0, 'T'},
                                       {"tier-kv-blocks", 1, 0, 'K'},
                                       {"calibration", 1, 0, 'C'},
                                       {"tier-system-prompts", 1, 0, 'P'},
                                       {"keep", 0, 0, 'E'},
                                       {"nosharing-requests", 1, 0, 'N'},
                                       {"nosharing-pairs", 1, 0, 'Q'},
                                       {"nosharing-only", 0, 0, 'O'},
                                       {"nosharing-kv-blocks", 1, 0, 'B'},
                                       {"nosharing-side-by-side", 1, 0, 'S'},
                                       {"context", 1, 0, 'X'},
                                       {"no-replay", 0, 0, 'R'},
                                       {"ringlmd-arg", 1, 0, 'A'},
                                       {0, 0, 0, 0}};
    bool no_replay = false;
    int o;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case 'j': json = true; break;
        case 'r': rounds = atoi(optarg); break;
        case 'n': c.conversations = atoi(optarg); break;
        case 'c': c.concurrency = atoi(optarg); break;
        case 't': c.turns = atoi(optarg); break;
        case 'k': c.system_prompts = atoi(optarg); break;
        case 'l': c.system_len = atoi(optarg); break;
        case 'o': c.one_off = atof(optarg); break;
        case 'm': snprintf(model, sizeof model, "%s", optarg); break;
        case 'b': snprintf(bin, sizeof bin, "%s", optarg); break;
        case 's': c.seed = strtoull(optarg, NULL, 0); break;
        case 'x': c.max_new = atoi(optarg); break;
        case 'T': {
            char list[256];
            snprintf(list, sizeof list, "%s", optarg);
            do_host = do_disk = do_slow = false;
            for (char *sv, *w = strtok_r(list, ",", &sv); w; w = strtok_r(NULL, ",", &sv)) {
                if (!strcmp(w, "host"))
                    do_host = true;
                else if (!strcmp(w, "disk"))
                    do_disk = true;
                else if (!strcmp(w, "disk_slow"))
                    do_slow = true;
                else if (strcmp(w, "none"))
                    bench_die(
                        "--tiers %s: expected host, disk, disk_slow (comma-separated) or none",
                        optarg);
            }
            break;
        }
        case 'K': tier_kv_blocks = atoi(optarg); break;
        case 'P': tier_prompts = atoi(optarg); break;
        case 'E': keep = true; break;
        case 'N': ns_requests = atoi(optarg); break;
        case 'Q': ns_pairs = atoi(optarg); break;
        case 'O': ns_only = true; break;
        case 'B': ns_kv_blocks = atoi(optarg); break;
        case 'S': ns_side = atoi(optarg); break;
        case 'X': max_ctx = (uint32_t)atoi(optarg); break;
        case 'R': no_replay = true; break;
        case 'A':
            if (n_ringlmd_args == MAX_RINGLMD_ARGS)
                bench_die("--ringlmd-arg: at most %d", MAX_RINGLMD_ARGS);
            ringlmd_args[n_ringlmd_args++] = optarg;
            break;
        case 'C': snprintf(calibration, sizeof calibration, "%s", optarg); break;
        default:
            fprintf(
                stderr,
                "usage: prefix_bench [--json] [--rounds N] [--conversations N] [--concurrency N] "
                "[--turns N] [--system-prompts N] [--system-len N] [--one-off F] [--max-tokens N] "
                "[--model PATH] [--bin DIR] [--seed N] [--tiers host,disk,disk_slow|none] "
                "[--tier-kv-blocks N] "
                "[--tier-system-prompts N] [--calibration FILE] [--keep] [--nosharing-requests N] "
                "[--nosharing-pairs N] [--nosharing-only] [--nosharing-kv-blocks N] "
                "[--nosharing-side-by-side N] [--context N] [--no-replay] "
                "[--ringlmd-arg ARG]...\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > MAX_ROUNDS || c.conversations < 1 || c.concurrency < 1 ||
        c.turns < 1 || c.system_prompts < 1 || c.system_len < 1 ||
        (uint32_t)c.system_len + 100 > max_ctx || max_ctx > MAX_CTX || c.max_new < 1 ||
        c.max_new > 40 || c.one_off < 0 || c.one_off > 1 || tier_kv_blocks < 64 ||
        tier_prompts < 1 || ns_requests < 1 || ns_pairs < 1 || ns_pairs > MAX_PAIRS ||
        ns_kv_blocks < 0 || ns_side < 0 || ns_side > MAX_PAIRS)
        bench_die("bad arguments (rounds 1..%d, context up to %d, system-len 1..context - 100, "
                  "max-tokens 1..40, tier-kv-blocks >= 64, nosharing-pairs 1..%d, "
                  "nosharing-side-by-side 0..%d)",
                  MAX_ROUNDS, MAX_CTX, MAX_PAIRS, MAX_PAIRS);
    if (access(model, R_OK) != 0)
        bench_die("model %s not readable (give --model or RINGLM_SHARED)", model);
    if (access(calibration, R_OK) != 0) calibration[0] = 0; /* the replay uses the built-in model */
    bench_mkdtemp("prefix-bench");
    cfg tc = c;
    tc.system_prompts = tier_prompts;
    signal(SIGPIPE, SIG_IGN);
    phase_opts po = {bin, model, calibration, !no_replay, NULL};

    /* the tier scenarios: a device pool that holds the running conversations and little more */
    const setup s_off = {false, 0, 0, 0, 0}, s_on = {true, 0, 0, 0, 0};
    const setup t_host_on = {true, tier_kv_blocks, 4096, 0, 0},
                t_host_off = {false, tier_kv_blocks, 4096, 0, 0};
    const setup t_disk = {true, tier_kv_blocks, 64, 4096, 0},
                t_slow = {true, tier_kv_blocks, 64, 4096, 1e6};
    static result on[MAX_ROUNDS], off[MAX_ROUNDS], ns_on[MAX_PAIRS], ns_off[MAX_PAIRS];
    static result th_on[MAX_ROUNDS], th_off[MAX_ROUNDS], td[MAX_ROUNDS], ts[MAX_ROUNDS];
    if (ns_only) rounds = 0;
    for (int i = 0; i < rounds; i++) {
        /* alternate which goes first, so drift of the machine falls on both */
        bool off_first = i % 2 == 0;
        if (off_first) off[i] = run_phase(&po, &c, &s_off, true);
        on[i] = run_phase(&po, &c, &s_on, true);
        if (!off_first) off[i] = run_phase(&po, &c, &s_off, true);
        if (do_host) {
            if (off_first) th_off[i] = run_phase(&po, &tc, &t_host_off, true);
            th_on[i] = run_phase(&po, &tc, &t_host_on, true);
            if (!off_first) th_off[i] = run_phase(&po, &tc, &t_host_off, true);
        }
        if (do_disk) td[i] = run_phase(&po, &tc, &t_disk, true);
        if (do_slow) ts[i] = run_phase(&po, &tc, &t_slow, true);
        if (!json)
            fprintf(stderr,
                    "round %d: ttft p50 on %.2f off %.2f ms; prefill on %.0f off %.0f; hit %.3f "
                    "(replay %.3f)\n",
                    i + 1, on[i].ttft_p50_ms, off[i].ttft_p50_ms, on[i].prefill_tokens,
                    off[i].prefill_tokens, on[i].hit_rate, on[i].replay_hit_rate);
    }
    /* the no-sharing pairs, ABBA: off on | on off | off on ... — each pair's ratio from two
	 * runs side by side, a drift of the machine falling on both sides equally often */
    cfg nc = c;
    nc.conversations = ns_requests;
    const setup ns_s_off = {false, ns_kv_blocks, 0, 0, 0}, ns_s_on = {true, ns_kv_blocks, 0, 0, 0};
    double ns_ratio[MAX_PAIRS], ns_cpu[MAX_PAIRS], ns_tps_on[MAX_PAIRS], ns_tps_off[MAX_PAIRS];
    for (int i = 0; i < ns_pairs; i++) {
        bool off_first = i % 2 == 0;
        if (off_first) ns_off[i] = run_phase(&po, &nc, &ns_s_off, false);
        ns_on[i] = run_phase(&po, &nc, &ns_s_on, false);
        if (!off_first) ns_off[i] = run_phase(&po, &nc, &ns_s_off, false);
        ns_ratio[i] =
            ns_off[i].tokens_per_s > 0 ? ns_on[i].tokens_per_s / ns_off[i].tokens_per_s : 0;
        ns_cpu[i] = ns_off[i].cpu_us_per_token > 0
                        ? ns_on[i].cpu_us_per_token / ns_off[i].cpu_us_per_token
                        : 0;
        ns_tps_on[i] = ns_on[i].tokens_per_s;
        ns_tps_off[i] = ns_off[i].tokens_per_s;
        if (!json)
            fprintf(stderr,
                    "no-sharing pair %d (%s): tok/s on %.0f off %.0f ratio %.3f; cpu us/token on "
                    "%.0f off %.0f "
                    "ratio %.3f\n",
                    i + 1, off_first ? "off, on" : "on, off", ns_on[i].tokens_per_s,
                    ns_off[i].tokens_per_s, ns_ratio[i], ns_on[i].cpu_us_per_token,
                    ns_off[i].cpu_us_per_token, ns_cpu[i]);
    }
    /* order: the pairs that ran off first against those that ran on first (a run's position in
	 * its pair should not matter; when it does, the median over both kinds still balances) */
    double by_order[2][MAX_PAIRS];
    int n_order[2] = {0, 0};
    for (int i = 0; i < ns_pairs; i++) by_order[i % 2][n_order[i % 2]++] = ns_ratio[i];
    double off_first_med = bench_median(by_order[0], n_order[0]),
           on_first_med = bench_median(by_order[1], n_order[1]);
    double sb_ratio[MAX_PAIRS], sb_cpu[MAX_PAIRS];
    for (int i = 0; i < ns_side; i++) {
        result a, b;
        side_by_side(&po, &nc, &ns_s_on, &ns_s_off, &a, &b);
        sb_ratio[i] = b.tokens_per_s > 0 ? a.tokens_per_s / b.tokens_per_s : 0;
        sb_cpu[i] = b.cpu_us_per_token > 0 ? a.cpu_us_per_token / b.cpu_us_per_token : 0;
        if (!json)
            fprintf(stderr,
                    "no-sharing side by side %d: tok/s on %.0f off %.0f ratio %.3f; cpu us/token "
                    "on %.0f off %.0f "
                    "ratio %.3f\n",
                    i + 1, a.tokens_per_s, b.tokens_per_s, sb_ratio[i], a.cpu_us_per_token,
                    b.cpu_us_per_token, sb_cpu[i]);
    }
    double sbr = bench_median(sb_ratio, ns_side), sbc = bench_median(sb_cpu, ns_side);
    double nsr = bench_median(ns_ratio, ns_pairs); /* sorts: the spread from here on */
    double ns_lo = ns_ratio[0], ns_hi = ns_ratio[ns_pairs - 1];
    double ns_q1 = bench_percentile(ns_ratio, ns_pairs, 0.25),
           ns_q3 = bench_percentile(ns_ratio, ns_pairs, 0.75);
    double ns_cpu_ratio = bench_median(ns_cpu, ns_pairs);
    double ns_cpu_lo = ns_cpu[0], ns_cpu_hi = ns_cpu[ns_pairs - 1];
    double tps_on = bench_median(ns_tps_on, ns_pairs), tps_off = bench_median(ns_tps_off, ns_pairs);
    result mns_on = result_median(ns_on, ns_pairs), mns_off = result_median(ns_off, ns_pairs);
    bool g3 = nsr >= 0.97;
    json_t *nsj = json_pack(
        "{s:i,s:i,s:f,s:[f,f,f,f,f],s:{s:f,s:f},s:{s:f,s:f},s:f,s:[f,f]}", "pairs", ns_pairs,
        "requests_per_run", ns_requests, "throughput_ratio", nsr, "ratio_min_q1_median_q3_max",
        ns_lo, ns_q1, nsr, ns_q3, ns_hi, "tokens_per_s", "on", tps_on, "off", tps_off,
        "cpu_us_per_token", "on", mns_on.cpu_us_per_token, "off", mns_off.cpu_us_per_token,
        "cpu_per_token_ratio", ns_cpu_ratio, "cpu_ratio_min_max", ns_cpu_lo, ns_cpu_hi);
    json_t *ratios = json_array();
    for (int i = 0; i < ns_pairs; i++) /* in run order */
        json_array_append_new(ratios, json_real(ns_off[i].tokens_per_s > 0
                                                    ? ns_on[i].tokens_per_s / ns_off[i].tokens_per_s
                                                    : 0));
    json_object_set_new(nsj, "pair_ratios", ratios);
    json_object_set_new(nsj, "median_ratio_by_order",
                        json_pack("{s:f,s:f}", "off_first", off_first_med, "on_first",
                                  n_order[1] ? on_first_med : 0.0));
    if (ns_kv_blocks) json_object_set_new(nsj, "kv_blocks", json_integer(ns_kv_blocks));
    if (ns_side)
        json_object_set_new(nsj, "side_by_side",
                            json_pack("{s:i,s:f,s:[f,f],s:f,s:[f,f]}", "pairs", ns_side,
                                      "throughput_ratio", sbr, "ratio_min_max", sb_ratio[0],
                                      sb_ratio[ns_side - 1], "cpu_per_token_ratio", sbc,
                                      "cpu_ratio_min_max", sb_cpu[0], sb_cpu[ns_side - 1]));
    if (ns_only) {
        if (json) {
            json_t *root =
                json_pack("{s:s,s:s,s:i,s:f}", "bench", "prefix_bench", "model", model,
                          "concurrency", c.concurrency, "nosharing_throughput_ratio", nsr);
            json_object_set_new(root, "nosharing", nsj);
            json_object_set_new(root, "goals", json_pack("{s:b}", "nosharing_ratio_ge_0.97", g3));
            bench_json_print(root);
        } else {
            json_decref(nsj);
            printf("prefix_bench no sharing (%s, %d pairs of %d requests, %d at a time)\n", model,
                   ns_pairs, ns_requests, c.concurrency);
            printf("  throughput on/off %.3f (pairs: lowest %.3f, quartiles %.3f..%.3f, highest "
                   "%.3f)   goal >= 0.97: %s\n",
                   nsr, ns_lo, ns_q1, ns_q3, ns_hi, g3 ? "met" : "NOT met");
            printf("  tok/s on %.0f off %.0f; daemon CPU per token on %.0f us off %.0f us, on/off "
                   "%.3f (%.3f..%.3f)\n",
                   tps_on, tps_off, mns_on.cpu_us_per_token, mns_off.cpu_us_per_token, ns_cpu_ratio,
                   ns_cpu_lo, ns_cpu_hi);
            printf("  median ratio of the pairs run off first %.3f, on first %.3f\n", off_first_med,
                   n_order[1] ? on_first_med : 0.0);
            if (ns_side)
                printf("  side by side (%d pairs, on and off at once): throughput on/off %.3f "
                       "(%.3f..%.3f); CPU per "
                       "token on/off %.3f (%.3f..%.3f)\n",
                       ns_side, sbr, sb_ratio[0], sb_ratio[ns_side - 1], sbc, sb_cpu[0],
                       sb_cpu[ns_side - 1]);
        }
        goto done;
    }
    result mon = result_median(on, rounds), moff = result_median(off, rounds);
    result mth_on = result_median(th_on, rounds), mth_off = result_median(th_off, rounds),
           mtd = result_median(td, rounds);
    result mts = result_median(ts, rounds);
    double ttft_ratio = mon.ttft_p50_ms > 0 ? moff.ttft_p50_ms / mon.ttft_p50_ms : 0;
    double saved = moff.prefill_tokens > 0 ? 1 - mon.prefill_tokens / moff.prefill_tokens : 0;
    /* the replay's hit rate against the daemon's, per round (the same run), median of those;
	 * judged for the headline run (the shared-prefix workload on the default pool) and for the
	 * tier scenarios, whose decisions — demote or drop, reload or recompute — follow the
	 * daemon's measured costs, which the request log carries to the replay (sched_cost) */
    double d[4][MAX_ROUNDS], worst = 0;
    bool any_tier = do_host || do_disk || do_slow;
    const result *scen[4] = {on, do_host ? th_on : NULL, do_disk ? td : NULL, do_slow ? ts : NULL};
    double delta[4] = {0, 0, 0, 0};
    for (int s = 0; s < 4; s++) {
        if (!scen[s]) continue;
        for (int i = 0; i < rounds; i++)
            d[s][i] = 100 * (scen[s][i].replay_hit_rate - scen[s][i].hit_rate);
        double sorted[MAX_ROUNDS];
        memcpy(sorted, d[s], (size_t)rounds * sizeof *sorted);
        delta[s] = bench_median(sorted, rounds); /* (sorts its copy: d keeps the run order) */
        if (s && (delta[s] < 0 ? -delta[s] > worst : delta[s] > worst))
            worst = delta[s] < 0 ? -delta[s] : delta[s];
    }
    bool g1 = ttft_ratio >= 3, g2 = saved >= 0.70, g4 = delta[0] >= -2 && delta[0] <= 2,
         g5 = worst <= 2;
    if (json) {
        json_t *root = json_pack("{s:s,s:s,s:i,s:i,s:i,s:f}", "bench", "prefix_bench", "model",
                                 model, "rounds", rounds, "conversations", c.conversations,
                                 "concurrency", c.concurrency, "requests", mon.requests);
        json_object_set_new(root, "ttft_p50_ms",
                            json_pack("{s:f,s:f}", "on", mon.ttft_p50_ms, "off", moff.ttft_p50_ms));
        json_object_set_new(root, "ttft_ratio", json_real(ttft_ratio));
        json_object_set_new(
            root, "prefill_tokens",
            json_pack("{s:f,s:f}", "on", mon.prefill_tokens, "off", moff.prefill_tokens));
        json_object_set_new(root, "prefill_saved", json_real(saved));
        json_object_set_new(root, "hit_rate", json_real(mon.hit_rate));
        json_object_set_new(root, "nosharing_throughput_ratio", json_real(nsr));
        json_object_set_new(root, "nosharing", nsj);
        json_t *rp = replay_json(mon.replay_hit_rate, mon.hit_rate, delta[0]);
        json_object_set_new(rp, "calibration",
                            json_string(calibration[0] ? calibration : "built-in"));
        json_object_set_new(root, "replay", rp);
        json_t *tiers = json_object();
        if (do_host)
            json_object_set_new(
                tiers, "host",
                tier_json(&t_host_on, tier_prompts, &mth_on, &mth_off, delta[1], d[1], rounds));
        if (do_disk)
            json_object_set_new(
                tiers, "disk",
                tier_json(&t_disk, tier_prompts, &mtd, NULL, delta[2], d[2], rounds));
        if (do_slow)
            json_object_set_new(
                tiers, "disk_slow",
                tier_json(&t_slow, tier_prompts, &mts, NULL, delta[3], d[3], rounds));
        json_object_set_new(root, "tiers", tiers);
        json_object_set_new(root, "replay_tiers_worst_pp", json_real(worst));
        json_t *goals =
            json_pack("{s:b,s:b,s:b,s:b}", "ttft_ratio_ge_3", g1, "prefill_saved_ge_0.70", g2,
                      "nosharing_ratio_ge_0.97", g3, "replay_within_2pp", g4);
        if (any_tier) json_object_set_new(goals, "replay_tiers_within_2pp", json_boolean(g5));
        json_object_set_new(root, "goals", goals);
        bench_json_print(root);
    } else {
        json_decref(nsj);
        printf("prefix_bench (%s, %d rounds, %d conversations, %d at a time, %.0f requests/phase; "
               "medians)\n",
               model, rounds, c.conversations, c.concurrency, mon.requests);
        printf("  TTFT p50        on %8.2f ms   off %8.2f ms   %.2fx lower   goal >= 3x: %s\n",
               mon.ttft_p50_ms, moff.ttft_p50_ms, ttft_ratio, g1 ? "met" : "NOT met");
        printf("  prefill tokens  on %8.0f      off %8.0f      %.1f%% fewer   goal >= 70%%: %s\n",
               mon.prefill_tokens, moff.prefill_tokens, 100 * saved, g2 ? "met" : "NOT met");
        if (no_replay)
            printf("  hit rate        %.1f%% of prompt tokens (not replayed: --no-replay)\n",
                   100 * mon.hit_rate);
        else
            printf("  hit rate        %.1f%% of prompt tokens; replayed in ringlm-sim (%s) %.1f%%, "
                   "%+.2f points\n",
                   100 * mon.hit_rate, calibration[0] ? calibration : "built-in model",
                   100 * mon.replay_hit_rate, delta[0]);
        printf("  no sharing      throughput on/off %.3f (%d pairs of %d requests: lowest %.3f, "
               "quartiles %.3f..%.3f, "
               "highest %.3f)   goal >= 0.97: %s\n",
               nsr, ns_pairs, ns_requests, ns_lo, ns_q1, ns_q3, ns_hi, g3 ? "met" : "NOT met");
        printf("                  daemon CPU per token on %.0f us off %.0f us, on/off %.3f "
               "(%.3f..%.3f)\n",
               mns_on.cpu_us_per_token, mns_off.cpu_us_per_token, ns_cpu_ratio, ns_cpu_lo,
               ns_cpu_hi);
        if (ns_side)
            printf("                  side by side (%d pairs): throughput on/off %.3f "
                   "(%.3f..%.3f); CPU per token "
                   "on/off %.3f (%.3f..%.3f)\n",
                   ns_side, sbr, sb_ratio[0], sb_ratio[ns_side - 1], sbc, sb_cpu[0],
                   sb_cpu[ns_side - 1]);
        if (do_host) tier_text("host", &t_host_on, &mth_on, &mth_off, delta[1]);
        if (do_disk) tier_text("disk", &t_disk, &mtd, NULL, delta[2]);
        if (do_slow) tier_text("disk_slow", &t_slow, &mts, NULL, delta[3]);
        if (!no_replay)
            printf("  replay          %+.2f points from the daemon's metrics   goal within 2: %s\n",
                   delta[0], g4 ? "met" : "NOT met");
        if (any_tier)
            printf("                  tier scenarios: worst %.2f points   goal within 2: %s\n",
                   worst, g5 ? "met" : "NOT met");
    }
done:
    if (keep) {
        fprintf(stderr, "prefix_bench: the phases' logs are in %s\n", bench_dir);
        bench_dir[0] = 0; /* kept */
    }
    bench_cleanup();
    return 0;
}
