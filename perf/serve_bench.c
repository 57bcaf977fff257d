/* SPDX-License-Identifier: MIT */
/*
 * serve_bench — what ringlmd delivers against its own engine on the same batch shapes
 * (the shapes llama.cpp's llama-batched-bench measures): N sequences, each a P-token prompt
 * (default 32) and exactly G generated tokens (default 128, ignore_stop), greedy, measured
 * three ways side by side in each run:
 *
 *   engine    the engine alone in this process: one prefill batch of N×P rows, then G-1
 *             decode steps of N rows, logits and a sampled token for every sequence every
 *             step (the baseline: no scheduler, no rings, no clients);
 *   sessions  one ringlmd, N sessions from this one process (separates the daemon's
 *             overhead from the clients' CPU: this process sleeps once per iteration);
 *   procs     the same ringlmd, N client processes, each sleeping on its own ring (what a
 *             deployment sees: one futex wake per client per published batch).
 *
 * With the procs figures, the clients' own CPU time from submit to FINISH per token (what
 * waiting costs them: a client spinning for its next token shows here).
 *
 * tok/s = N × G / (first submit → last FINISH), the same count for all three. The machine
 * drifts (on this project's VM the engine alone's runs varied 16-32% and a memory probe
 * read 5.7-36 GB/s from one run to the next), so within each run the three modes take
 * turns in slices — engine, sessions, procs, then procs, sessions, engine (--slices per
 * mode, default 2) — and a slice runs as many generations back to back as fill
 * --min-slice-ms (default 1000; counted once per size from the engine alone, the same for
 * all three modes and every run): a drift within a run reaches all three alike, and noise
 * of a second's scale averages out within a slice.  A run's figure per mode is its slices
 * together (tokens / seconds).  Reported per N over --runs: each mode's median, lowest,
 * highest and spread; per run, the daemon's ratio to the engine of the same run (sessions
 * / engine, procs / engine) with its median and spread; and the machine's own variation
 * beside: the engine alone's spread, the probe's, the CPU that other processes used during
 * the windows, and how much each mode's slices differed within a run (procs varying more
 * than the engine in the same runs is flagged: that variation would be the daemon's).
 *
 * Then, with the daemon busy with --busy streams (default 32, from one process),
 * --connect-burst client processes (default 32) connect at once: how many connect, and the
 * connect latency p50 / p99 / max in ms and in iterations: the busy streams' period
 * between tokens over the burst, from the gate to the last connect (the iterations the
 * connects ran in: the streams' steps and the daemon's handshakes; each client's short
 * request waits until all have connected), the steady period before the gate beside, and
 * per connect the busy stream's tokens that arrived while it connected
 * (--burst-timeline: every token and client on stderr).  A connect is timed in the client
 * from its
 * ringlm_connect (socket, connect, hello) to the session being usable (the handshake
 * answered, both segments mapped and checked): each client process is started and waits
 * at a gate before its clock starts, so process start is not counted.
 *
 * The goals are checked and printed: the daemon at >= 0.85x the engine with N
 * sessions and >= 0.75x with N processes (medians of the per-run ratios) at every N, the
 * spread of each per-run ratio (farthest run from the median) within 15% of its median —
 * the spread judged is the daemon's relative to the engine on the same machine at the same
 * time; the tok/s spreads, which a drifting machine widens for the engine alone as much,
 * are reported beside with whether they are within 15% — and every burst client connected
 * with p99 under 2 iterations.  The load average is printed before and after: on a
 * machine shared with other work the figures are indicative only.  --runs 0 runs the
 * connect burst only.
 *
 * Each run also says what else happened in its windows (the CPU other processes used — the
 * machine's busy time from /proc/stat less ringlmd's, this bench's and its reaped clients'
 * —, steal, preemptions, the engine's helper sleeps, ringlmd's CPU in each), where the engine alone's time
 * went (its decode steps' median and longest, the steps over twice the median and their
 * excess, the time its caller waited on a helper's unfinished task, its page faults), and
 * what the machine gave just before (a short memory-read and arithmetic probe on as many
 * threads: on a VM the host moves both), and each window starts once ringlmd is idle
 * (--no-settle: at once). Nothing is dropped: the spread is over every run.
 *
 * ringlmd runs in this process's session, as a daemon started from a shell does: its nice
 * of -10 ranks it above the clients this bench starts. --daemon-session starts it in a
 * session of its own, as a service manager would, and the engine alone with the same
 * scheduling-group nice (see autogroup_set_self); there the clients, in an ordinary group,
 * wait behind the busy daemon's group (quiet machine: connect burst p99 7.3 iterations
 * against 0.17), so it is not the default (--same-session: the default, accepted).
 * --engine-only runs the engine alone, no daemon: its own spread, quickly.
 *
 *   serve_bench --model synthetic:stories15M:1 [--clients 1,4,8,16,32] [--runs 5]
 *               [--slices 2] [--min-slice-ms 1000] [--burst-timeline]
 *               [--threads 2] [--prompt 32] [--gen 128] [--connect-burst 32] [--busy 32]
 *               [--ringlmd PATH] [--daemon-arg ARG]... [--no-settle] [--daemon-session]
 *               [--engine-only] [--json]
 */
#include "kernels/engine.h"
#include "numa/rnuma.h"
#include "perf/bench_util.h"
#include "ringlm.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <dirent.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIZES       16
#define MAX_RUNS        64
#define MAX_DAEMON_ARGS 32
#define MAX_N           256
#define MAX_SLICES      8
#define MAX_REPS        16 /* generations back to back in one slice */

typedef struct opts {
    const char *model, *ringlmd;
    int sizes[MAX_SIZES], n_sizes;
    int runs, threads, prompt, gen, burst, busy;
    int slices, min_slice_ms; /* each mode's slices per run; a slice's least length */
    bool json, daemon_session, engine_only, burst_timeline;
    const char *daemon_args[MAX_DAEMON_ARGS];
    int n_daemon_args;
} opts;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void pause_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The same prompt for sequence s in all three modes. */
static int32_t prompt_token(int s, int i, int vocab)
{
    return (int32_t)(3 + ((long)s * 7919 + (long)i * 104729) % (vocab - 3));
}

/* ---- what else happened during a timed window ---------------------------------------- */

/* Per timed window, what could explain a slow run: the hypervisor's steal (of all vCPUs),
 * how often the process doing the engine's work (this one for the engine alone, ringlmd
 * for the daemon) was preempted, and for the engine alone how often its helper thread
 * slept between parallel regions (each sleep costs the next region a wake). */
typedef struct mark {
    unsigned long long steal, total, busy; /* /proc/stat ticks, all CPUs */
    long preempt;                          /* nonvoluntary context switches, all threads */
    long daemon_ns;                        /* ringlmd's threads' time on a CPU */
    double ours_s;                         /* this process's and its reaped children's CPU */
    double t;                              /* CLOCK_MONOTONIC s */
} mark;

typedef struct attrib {
    /* summed over a mode's slices in a run: ticks, CPU seconds, the windows' length */
    unsigned long long steal_ticks, total_ticks, busy_ticks;
    double ours_s, window_s;
    double steal_pct;
    double others_pct; /* the CPU that neither ringlmd nor this bench and its clients used,
                        * % of all CPUs over the windows: what else the machine ran */
    long preempt;
    double daemon_ms;                 /* ringlmd's CPU time in the window */
    long helper_sleeps, helper_waits; /* the engine alone only, as the rest */
    /* The decode steps' times: median and longest, the steps over twice the median and
     * what they took beyond it (where a slow run's time went: a few stalls or all steps a
     * little slower), and the time the engine's caller waited on a helper's unfinished
     * task (a helper descheduled mid-task: pool_stats). */
    double step_med_ms, step_max_ms, slow_excess_ms, straggler_ms;
    long slow_steps, straggler_waits;
    double probe_gbs, probe_gflops; /* the machine probe just before (machine_probe) */
    long faults;                    /* page faults of this process in the engine window */
} attrib;

/* All CPUs' ticks from /proc/stat: steal, the total, and the busy ones (neither idle nor
 * iowait). */
static void cpu_ticks(unsigned long long *steal, unsigned long long *total,
                      unsigned long long *busy)
{
    *steal = *total = *busy = 0;
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return;
    unsigned long long v[8] = {0};
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
               &v[5], &v[6], &v[7]) == 8) {
        for (int i = 0; i < 8; i++) *total += v[i];
        *steal = v[7];
        *busy = *total - v[3] - v[4];
    }
    fclose(f);
}

static long faults_self(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt + ru.ru_majflt;
}

static double rusage_s(int who)
{
    struct rusage ru;
    getrusage(who, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* Preemptions (nonvoluntary context switches) of every thread of pid so far, or with
 * cpu_ns the nanoseconds its threads have run (schedstat). Threads that already ended are
 * not counted: read while the threads of interest still run. */
static long task_sum(pid_t pid, bool cpu_ns)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d) return 0;
    long sum = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char sp[64], line[128];
        long tid = strtol(e->d_name, NULL, 10);
        snprintf(sp, sizeof sp, "/proc/%d/task/%ld/%s", (int)pid, tid,
                 cpu_ns ? "schedstat" : "status");
        FILE *f = fopen(sp, "r");
        if (!f) continue;
        long v;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, cpu_ns ? "%ld" : "nonvoluntary_ctxt_switches: %ld", &v) == 1) sum += v;
        fclose(f);
    }
    closedir(d);
    return sum;
}

/* Where a window's time can be read from afterwards: pid is the process doing the engine's
 * work (its preemptions), daemon ringlmd (its CPU; ours: this process and the children it
 * has reaped, i.e. the client processes of a window once run_procs has waited for them). */
static mark mark_now(pid_t pid, pid_t daemon)
{
    mark m;
    cpu_ticks(&m.steal, &m.total, &m.busy);
    m.preempt = task_sum(pid, false);
    m.daemon_ns = daemon > 0 ? task_sum(daemon, true) : 0;
    m.ours_s = rusage_s(RUSAGE_SELF) + rusage_s(RUSAGE_CHILDREN);
    m.t = now_s();
    return m;
}

static attrib attrib_since(mark m0, pid_t pid, pid_t daemon)
{
    mark m1 = mark_now(pid, daemon);
    attrib a = {.preempt = m1.preempt - m0.preempt,
                .daemon_ms = (double)(m1.daemon_ns - m0.daemon_ns) * 1e-6,
                .helper_sleeps = -1,
                .helper_waits = -1,
                .steal_ticks = m1.steal - m0.steal,
                .total_ticks = m1.total - m0.total,
                .busy_ticks = m1.busy - m0.busy,
                .ours_s = m1.ours_s - m0.ours_s + (double)(m1.daemon_ns - m0.daemon_ns) * 1e-9,
                .window_s = m1.t - m0.t};
    return a;
}

/* b's window added to a's (a mode's slices in one run); the percentages recomputed. */
static void attrib_add(attrib *a, const attrib *b)
{
    a->steal_ticks += b->steal_ticks;
    a->total_ticks += b->total_ticks;
    a->busy_ticks += b->busy_ticks;
    a->ours_s += b->ours_s;
    a->window_s += b->window_s;
    a->preempt += b->preempt;
    a->daemon_ms += b->daemon_ms;
    a->steal_pct = a->total_ticks ? 100.0 * (double)a->steal_ticks / (double)a->total_ticks : 0;
    /* all CPUs' busy time minus ours, over all CPUs' time (total ticks: every CPU) */
    const double tick_s = 1.0 / (double)sysconf(_SC_CLK_TCK);
    const double others_s = (double)a->busy_ticks * tick_s - a->ours_s;
    a->others_pct = a->total_ticks
                        ? 100.0 * (others_s > 0 ? others_s : 0) / ((double)a->total_ticks * tick_s)
                        : 0;
}

/* Waits (up to 3 s) until ringlmd has run less than 0.5 ms in 20 ms: the end of the
 * previous window's sessions (up to 32 torn down: rings unmapped, segments freed) is that
 * window's cost, and must not land in the next one's — measured: the engine alone right
 * after 32 client processes had exited shared the CPUs with their teardown. */
static bool no_settle; /* --no-settle: to measure what settling changes */

static void settle(pid_t daemon)
{
    if (no_settle || daemon <= 0) return;
    long prev = task_sum(daemon, true);
    for (int i = 0; i < 150; i++) {
        pause_ms(20);
        long now = task_sum(daemon, true);
        if (now - prev < 500000) return;
        prev = now;
    }
}

/* ---- what the machine gave at that moment ----------------------------------------------- */

/* Right before each engine window, a short probe with the engine's shape (one thread per
 * engine thread, all at once): the memory read bandwidth they get together (the weights'
 * stream, what one sequence is bound by) and the arithmetic rate (what 32 sequences are
 * closer to bound by). On a VM both move with what the host does — other guests' memory
 * traffic, the vCPUs' placement on cores or on the two threads of one core, the clock —
 * so a run whose probe was fast or slow tells a machine that was, not a change in ringlm.
 * ~60 ms; its threads are joined before any client process is forked. */
#define PROBE_BYTES     (128u << 20)
#define PROBE_FMA_ITERS 4000000

typedef struct probe_arg {
    const uint64_t *buf;
    size_t n;   /* uint64 words to read */
    double sum; /* kept, so the work is not optimized away */
} probe_arg;

static void *probe_read(void *arg)
{
    probe_arg *a = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i + 4 <= a->n; i += 4) {
            s0 += a->buf[i];
            s1 += a->buf[i + 1];
            s2 += a->buf[i + 2];
            s3 += a->buf[i + 3];
        }
    a->sum = (double)(s0 ^ s1 ^ s2 ^ s3);
    return NULL;
}

static void *probe_fma(void *arg)
{
    probe_arg *a = arg;
    /* eight independent multiply-add chains: the core's float throughput, not its latency */
    volatile float seed = 1.0f;
    float x[8], m = 0.999999f, c = 1e-7f;
    for (int j = 0; j < 8; j++) x[j] = seed + (float)j;
    for (int i = 0; i < PROBE_FMA_ITERS; i++)
        for (int j = 0; j < 8; j++) x[j] = x[j] * m + c;
    float t = 0;
    for (int j = 0; j < 8; j++) t += x[j];
    a->sum = t;
    return NULL;
}

typedef struct probe {
    double read_gbs, fma_gflops;
} probe;

/* buf: PROBE_BYTES, touched once (so no page faults are timed). */
static probe machine_probe(const uint64_t *buf, int threads)
{
    probe r = {0, 0};
    if (threads < 1 || threads > 64) return r;
    pthread_t th[64];
    probe_arg pa[64];
    const size_t words = PROBE_BYTES / sizeof(uint64_t) / (size_t)threads;
    for (int kind = 0; kind < 2; kind++) {
        double t0 = now_s();
        int started = 0;
        for (int i = 0; i < threads; i++) {
            pa[i] = (probe_arg){buf + (size_t)i * words, words, 0};
            if (pthread_create(&th[i], NULL, kind ? probe_fma : probe_read, &pa[i]) == 0)
                started++;
            else
                break;
        }
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        double dt = now_s() - t0;
        if (started != threads || dt <= 0) return (probe){0, 0};
        if (kind == 0)
            r.read_gbs = 2.0 * (double)words * sizeof(uint64_t) * threads / dt * 1e-9;
        else
            r.fma_gflops = 2.0 * 8.0 * PROBE_FMA_ITERS * threads / dt * 1e-9;
    }
    return r;
}

/* ---- scheduling groups ------------------------------------------------------------------ */

/* With autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled: the default of many
 * distributions, and on for this project's VM) each session is one scheduling group, and
 * nice ranks a thread only within its group: against other sessions a process competes as
 * its group, of the group's own nice (0 unless set). ringlmd leading its own session gives
 * its group its nice; so that the engine alone competes as the daemon's engine does, its
 * window runs with this process's group at the daemon's group nice, set back right after
 * (before any client is forked; rnuma_autogroup_nice reads a group's nice, INT32_MIN: no
 * autogroup here). */
static void autogroup_set_self(int nice)
{
    if (nice == INT32_MIN) return;
    FILE *f = fopen("/proc/self/autogroup", "w");
    if (!f) return;
    fprintf(f, "%d", nice);
    if (fclose(f) != 0) { /* not permitted: the group stays as it is */
    }
}

/* ---- the engine alone ---------------------------------------------------------------- */

typedef struct engb {
    eng *e;
    int vocab, bs, bps;
    double *step_s; /* each decode step's seconds, since the last step_stats */
    int n_steps, cap_steps;
    int32_t *tokens, *pos, *qs, *sl, *table, *lrows, *out;
    int64_t *slots;
    eng_sampling *samp;
    uint64_t *rng;
} engb;

static void engb_free(engb *b)
{
    if (b->e) eng_destroy(b->e);
    free(b->tokens);
    free(b->pos);
    free(b->qs);
    free(b->sl);
    free(b->table);
    free(b->lrows);
    free(b->out);
    free(b->slots);
    free(b->samp);
    free(b->rng);
    free(b->step_s);
    memset(b, 0, sizeof *b);
}

static int engb_init(engb *b, const eng_model *m, const opts *o, int n)
{
    memset(b, 0, sizeof *b);
    b->vocab = eng_model_cfg(m)->vocab_size;
    b->bs = 16;
    b->bps = (o->prompt + o->gen + b->bs - 1) / b->bs;
    eng_options eo = {.n_threads = o->threads,
                      .numa_node = -1,
                      .kv_blocks = n * b->bps,
                      .kv_block_size = b->bs,
                      .max_batch_tokens = n * o->prompt,
                      .max_seqs = n};
    size_t rows = (size_t)n * (size_t)o->prompt;
    b->tokens = calloc(rows, sizeof(int32_t));
    b->pos = calloc(rows, sizeof(int32_t));
    b->slots = calloc(rows, sizeof(int64_t));
    b->qs = calloc((size_t)n + 1, sizeof(int32_t));
    b->sl = calloc((size_t)n, sizeof(int32_t));
    b->table = calloc((size_t)n * (size_t)b->bps, sizeof(int32_t));
    b->lrows = calloc((size_t)n, sizeof(int32_t));
    b->out = calloc((size_t)n, sizeof(int32_t));
    b->samp = calloc((size_t)n, sizeof(eng_sampling));
    b->rng = calloc((size_t)n, sizeof(uint64_t));
    b->cap_steps = o->gen * MAX_REPS * o->slices;
    b->step_s = calloc((size_t)b->cap_steps, sizeof(double));
    if (!b->step_s || !b->tokens || !b->pos || !b->slots || !b->qs || !b->sl || !b->table ||
        !b->lrows || !b->out || !b->samp || !b->rng)
        return -ENOMEM;
    for (int i = 0; i < n * b->bps; i++) b->table[i] = i;
    /* (The KV pool is faulted in by eng_create: rnuma_alloc. The scratch of N × P prefill
     * rows is faulted by the window's own prefill: ~9,400 faults at 32 sequences of
     * stories110M, reported per window as page faults.) */
    int r = eng_create(m, &eo, &b->e);
    if (r < 0) fprintf(stderr, "serve_bench: engine: %s\n", eng_errmsg());
    return r;
}

static int64_t slot_of(const engb *b, int s, int p)
{
    return (int64_t)b->table[s * b->bps + p / b->bs] * b->bs + p % b->bs;
}

/* Seconds for N sequences: prefill, then gen-1 decode steps (the first token comes from
 * the prefill's logits, as in the daemon). */
static double engb_run(engb *b, int n, const opts *o)
{
    double t0 = now_s();
    int T = 0;
    for (int s = 0; s < n; s++) {
        b->qs[s] = T;
        b->sl[s] = o->prompt;
        for (int i = 0; i < o->prompt; i++, T++) {
            b->tokens[T] = prompt_token(s, i, b->vocab);
            b->pos[T] = i;
            b->slots[T] = slot_of(b, s, i);
        }
        b->lrows[s] = T - 1;
        b->rng[s] = eng_rng_init((uint64_t)s);
    }
    b->qs[n] = T;
    eng_batch batch = {.n_tokens = T,
                       .tokens = b->tokens,
                       .positions = b->pos,
                       .slot_mapping = b->slots,
                       .n_seqs = n,
                       .query_start = b->qs,
                       .seq_len = b->sl,
                       .block_table = b->table,
                       .block_table_stride = b->bps,
                       .n_logits = n,
                       .logits_rows = b->lrows};
    if (eng_execute_sample(b->e, &batch, b->samp, b->rng, b->out, NULL) < 0) goto fail;
    for (int step = 1; step < o->gen; step++) {
        const double ts = now_s();
        int ctx = o->prompt + step - 1;
        for (int s = 0; s < n; s++) {
            b->qs[s] = s;
            b->sl[s] = ctx + 1;
            b->tokens[s] = b->out[s];
            b->pos[s] = ctx;
            b->slots[s] = slot_of(b, s, ctx);
            b->lrows[s] = s;
        }
        b->qs[n] = n;
        batch.n_tokens = n;
        if (eng_execute_sample(b->e, &batch, b->samp, b->rng, b->out, NULL) < 0) goto fail;
        if (b->n_steps < b->cap_steps) b->step_s[b->n_steps++] = now_s() - ts;
    }
    return now_s() - t0;
fail:
    fprintf(stderr, "serve_bench: engine execute: %s\n", eng_errmsg());
    return -1;
}

/* The step figures of *a from the decode steps of the engb_runs since the last call. */
static void step_stats(engb *b, attrib *a)
{
    const int k = b->n_steps;
    b->n_steps = 0;
    if (k < 1) return;
    double *t = b->step_s;
    const double med = bench_median(t, k); /* sorts t */
    a->step_med_ms = med * 1e3;
    a->step_max_ms = t[k - 1] * 1e3;
    for (int i = 0; i < k; i++)
        if (t[i] > 2 * med) {
            a->slow_steps++;
            a->slow_excess_ms += (t[i] - med) * 1e3;
        }
}

/* ---- the daemon ---------------------------------------------------------------------- */

typedef struct daemon_proc {
    pid_t pid;
    char dir[64], sock[128], log[128];
} daemon_proc;

static int connect_retry(const char *sock, ringlm_client **c)
{
    int r;
    for (int tries = 0; tries < 1000; tries++) {
        r = ringlm_connect(sock, c);
        if (r != -ENOENT && r != -ECONNREFUSED && r != -EUSERS) return r;
        pause_ms(2);
    }
    return r;
}

static int daemon_start(daemon_proc *d, const opts *o)
{
    snprintf(d->dir, sizeof d->dir, "/tmp/serve_bench-XXXXXX");
    if (!mkdtemp(d->dir)) return -errno;
    snprintf(d->sock, sizeof d->sock, "%s/s", d->dir);
    snprintf(d->log, sizeof d->log, "%s/ringlmd.log", d->dir);
    char threads[16];
    snprintf(threads, sizeof threads, "%d", o->threads);
    const char *argv[16 + MAX_DAEMON_ARGS];
    int a = 0;
    argv[a++] = o->ringlmd;
    argv[a++] = "--model";
    argv[a++] = o->model;
    argv[a++] = "--socket";
    argv[a++] = d->sock;
    argv[a++] = "--threads";
    argv[a++] = threads;
    /* Room for every session these runs open (one uid) and for the burst's handshakes. */
    argv[a++] = "--max-sessions-per-uid";
    argv[a++] = "256";
    for (int i = 0; i < o->n_daemon_args; i++) argv[a++] = o->daemon_args[i];
    argv[a] = NULL;
    fflush(NULL);
    d->pid = fork();
    if (d->pid < 0) return -errno;
    if (d->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        /* By default ringlmd stays in our session, where its nice of -10 ranks it above
         * every client this bench starts but not above other sessions. --daemon-session
         * starts it in a session of its own, as a service manager would; leading it,
         * ringlmd gives the session's scheduling group its nice (autogroup: see
         * autogroup_set_self). */
        if (o->daemon_session && setsid() < 0) _exit(126);
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            dup2(fd, 1);
            close(fd);
        }
        execv(o->ringlmd, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", o->ringlmd, strerror(errno));
        _exit(127);
    }
    /* Up once a session opens (model load and warm-up first: up to a minute). */
    ringlm_client *c = NULL;
    for (int tries = 0; tries < 30000; tries++) {
        int r = ringlm_connect(d->sock, &c);
        if (r == 0) {
            ringlm_close(c);
            return 0;
        }
        if (waitpid(d->pid, NULL, WNOHANG) == d->pid) break;
        pause_ms(2);
    }
    fprintf(stderr, "serve_bench: ringlmd did not come up (log: %s)\n", d->log);
    return -EIO;
}

static void daemon_stop(daemon_proc *d)
{
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        waitpid(d->pid, NULL, 0);
    }
    unlink(d->sock);
    unlink(d->log);
    rmdir(d->dir);
}

static void request_for(ringlm_request *r, int32_t *prompt, int s, int vocab, const opts *o,
                        uint32_t max_new)
{
    for (int i = 0; i < o->prompt; i++) prompt[i] = prompt_token(s, i, vocab);
    ringlm_request_init(r);
    r->prompt = prompt;
    r->n_prompt = (uint32_t)o->prompt;
    r->max_new_tokens = max_new;
    r->ignore_stop = true;
}

/* An event of session s: a token counted, or its FINISH (*bad: not exactly gen tokens). */
static void sessions_take(const ringlm_event *ev, uint32_t *got, bool *done, int *left, int *bad,
                          const opts *o)
{
    if (ev->kind == RINGLM_EV_TOKEN) {
        (*got)++;
        return;
    }
    *done = true;
    (*left)--;
    *bad += ev->finish_reason != RINGLM_FINISH_LENGTH || *got != (uint32_t)o->gen;
}

/* N sessions from this process, reps generations one after the other (each: all N
 * submitted, all N to their FINISH). Seconds, or < 0 when a request did not run to exactly
 * gen tokens. */
static double run_sessions(const daemon_proc *d, int n, int vocab, const opts *o, int reps)
{
    ringlm_client *c[MAX_N];
    int32_t prompt[1024];
    double secs = -1;
    int opened = 0, bad = 0;
    for (; opened < n; opened++)
        if (connect_retry(d->sock, &c[opened]) < 0) {
            fprintf(stderr, "serve_bench: connect: %s\n", ringlm_errdetail());
            goto out;
        }
    double t0 = now_s();
    for (int rep = 0; rep < reps; rep++) {
        uint32_t got[MAX_N] = {0};
        bool done[MAX_N] = {0};
        for (int s = 0; s < n; s++) {
            ringlm_request r;
            request_for(&r, prompt, s, vocab, o, (uint32_t)o->gen);
            if (ringlm_submit(c[s], &r, NULL) < 0) {
                fprintf(stderr, "serve_bench: submit: %s\n", ringlm_errdetail());
                goto out;
            }
        }
        int left = n;
        while (left > 0) {
            bool took = false;
            int first = -1;
            for (int s = 0; s < n; s++) {
                ringlm_event ev;
                int r = 0;
                while (!done[s] && (r = ringlm_next_event(c[s], &ev, 0)) == 1) {
                    took = true;
                    sessions_take(&ev, &got[s], &done[s], &left, &bad, o);
                }
                if (r < 0) {
                    fprintf(stderr, "serve_bench: %s\n", ringlm_errdetail());
                    goto out;
                }
                if (!done[s] && first < 0) first = s;
            }
            /* Nothing new: sleep on one unfinished session; the daemon publishes every
             * session's tokens of an iteration together, so one wake per iteration. */
            if (!took && first >= 0) {
                ringlm_event ev;
                int r = ringlm_next_event(c[first], &ev, 100);
                if (r < 0) {
                    fprintf(stderr, "serve_bench: %s\n", ringlm_errdetail());
                    goto out;
                }
                if (r == 1) sessions_take(&ev, &got[first], &done[first], &left, &bad, o);
            }
        }
    }
    secs = now_s() - t0;
    if (bad) {
        fprintf(stderr, "serve_bench: %d of %d requests did not generate exactly %d tokens\n", bad,
                n * reps, o->gen);
        secs = -1;
    }
out:
    for (int s = 0; s < opened; s++) ringlm_close(c[s]);
    return secs;
}

typedef struct proc_result {
    int ok;
    double t_end, cpu_s; /* cpu_s: this client's CPU time from its submit to its FINISH */
} proc_result;

/* One client process: connect, say ready, wait for the gate, then reps requests one after
 * the other, each read to its end; then wait for the release before closing and exiting.
 * A client's exit tears down the address space it inherited from this bench (the model's
 * weights and the probe buffer: a fork-and-exit of a 200 MB process cost 7.5 ms of CPU at
 * load 17, 21 ms at 600 MB — stories110M —, against 1.6 ms at 1 MB): 32 clients that
 * finish in the same iteration, exiting one by one as each reads its FINISH, spent that on
 * the CPUs the last ones still needed to read theirs, inside the window. */
static void proc_client(const daemon_proc *d, int s, int vocab, const opts *o, int reps,
                        int ready_fd, int gate_fd, int res_fd, int release_fd)
{
    proc_result pr = {0, 0, 0};
    ringlm_client *c;
    int32_t prompt[1024];
    if (connect_retry(d->sock, &c) < 0) {
        fprintf(stderr, "serve_bench: client connect: %s\n", ringlm_errdetail());
        if (write(ready_fd, "x", 1) < 0) { /* parent gone */
        }
        _exit(1);
    }
    if (write(ready_fd, "r", 1) != 1) _exit(1);
    char b;
    while (read(gate_fd, &b, 1) > 0) {}
    double cpu0 = rusage_s(RUSAGE_SELF);
    pr.ok = 1;
    for (int rep = 0; rep < reps && pr.ok; rep++) {
        ringlm_request r;
        request_for(&r, prompt, s, vocab, o, (uint32_t)o->gen);
        uint32_t got = 0;
        pr.ok = 0;
        if (ringlm_submit(c, &r, NULL) < 0) break;
        for (;;) {
            ringlm_event ev;
            if (ringlm_next_event(c, &ev, -1) != 1) break;
            if (ev.kind == RINGLM_EV_TOKEN) {
                got++;
                continue;
            }
            pr.ok = ev.finish_reason == RINGLM_FINISH_LENGTH && got == (uint32_t)o->gen;
            break;
        }
    }
    pr.t_end = now_s();
    pr.cpu_s = rusage_s(RUSAGE_SELF) - cpu0;
    if (write(res_fd, &pr, sizeof pr) != (ssize_t)sizeof pr) _exit(1);
    close(res_fd);
    while (read(release_fd, &b, 1) > 0) {}
    ringlm_close(c);
    _exit(0);
}

/* N client processes, reps generations each; *client_cpu_s: the CPU time they used from
 * their first submit to their last FINISH, all together (what waiting for tokens costs a
 * client: spinning shows here). */
static double run_procs(const daemon_proc *d, int n, int vocab, const opts *o, int reps,
                        double *client_cpu_s)
{
    int rp[2], gp[2], sp[2], lp[2];
    *client_cpu_s = 0;
    if (pipe(rp) || pipe(gp) || pipe(sp) || pipe(lp)) return -1;
    pid_t pids[MAX_N];
    fflush(NULL);
    for (int s = 0; s < n; s++) {
        pids[s] = fork();
        if (pids[s] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(rp[0]);
            close(gp[1]);
            close(sp[0]);
            close(lp[1]);
            proc_client(d, s, vocab, o, reps, rp[1], gp[0], sp[1], lp[0]);
        }
    }
    close(rp[1]);
    close(gp[0]);
    close(sp[1]);
    close(lp[0]);
    int ready = 0, bad = 0;
    char b;
    while (ready < n && read(rp[0], &b, 1) == 1) {
        ready++;
        bad += b != 'r';
    }
    double t0 = now_s(), t_end = t0;
    close(gp[1]); /* the gate: every client submits now */
    proc_result pr;
    int results = 0;
    while (read(sp[0], &pr, sizeof pr) == (ssize_t)sizeof pr) {
        results++;
        bad += !pr.ok;
        *client_cpu_s += pr.cpu_s;
        if (pr.t_end > t_end) t_end = pr.t_end;
    }
    close(rp[0]);
    close(sp[0]);
    close(lp[1]); /* the release: every client has reported */
    for (int s = 0; s < n; s++) waitpid(pids[s], NULL, 0);
    if (bad || results != n || ready != n) {
        fprintf(stderr,
                "serve_bench: %d client processes of %d did not generate exactly %d tokens\n",
                bad + (n - results), n, o->gen);
        return -1;
    }
    return t_end - t0;
}

/* ---- connects to a busy daemon --------------------------------------------------------- */

typedef struct burst_result {
    int connected, n;
    double p50_ms, p99_ms, max_ms;
    double period_ms;       /* the busy streams' token period from the gate to the last connect */
    double steady_ms;       /* the same before the gate */
    double p99_tokens_seen; /* stream 0's tokens that arrived during a connect, p99 */
} burst_result;

/* The busy process: `busy` streams from one process, resubmitted as they end, until its
 * stop pipe closes; it writes how many of stream 0's tokens it saw and when it saw each
 * (CLOCK_MONOTONIC seconds, comparable across processes): the iterations that passed. It
 * reads at ringlmd's priority (where permitted): starved behind the burst's clients it
 * would see tokens late, count fewer in the burst's window and make an iteration look
 * longer than it was; it takes a few microseconds a token. */
#define BUSY_MAX_TOKENS 65536

static void busy_streams(const daemon_proc *d, int n, int vocab, int max_new, const opts *o,
                         int ready_fd, int stop_fd, int res_fd)
{
    ringlm_client *c[MAX_N];
    int32_t prompt[1024];
    double *seen = malloc(sizeof(double) * BUSY_MAX_TOKENS);
    if (!seen) _exit(1);
    errno = 0;
    const int daemon_nice = getpriority(PRIO_PROCESS, (id_t)d->pid);
    if (errno == 0 && setpriority(PRIO_PROCESS, 0, daemon_nice) != 0) { /* not permitted: ours */
    }
    for (int s = 0; s < n; s++) {
        if (connect_retry(d->sock, &c[s]) < 0) _exit(1);
        ringlm_request r;
        request_for(&r, prompt, s, vocab, o, (uint32_t)max_new);
        if (ringlm_submit(c[s], &r, NULL) < 0) _exit(1);
    }
    int tokens0 = 0;
    bool told = false;
    fcntl(stop_fd, F_SETFL, O_NONBLOCK);
    for (;;) {
        char b;
        if (read(stop_fd, &b, 1) == 0) break;
        for (int s = 0; s < n; s++) {
            ringlm_event ev;
            int to = s == 0 ? 50 : 0;
            while (ringlm_next_event(c[s], &ev, to) == 1) {
                to = 0;
                if (ev.kind == RINGLM_EV_FINISH) {
                    ringlm_request r;
                    request_for(&r, prompt, s, vocab, o, (uint32_t)max_new);
                    if (ringlm_submit(c[s], &r, NULL) < 0) _exit(1);
                } else if (s == 0) {
                    if (tokens0 < BUSY_MAX_TOKENS) seen[tokens0++] = now_s();
                    if (tokens0 == 8 && !told) {
                        if (write(ready_fd, "r", 1) != 1) _exit(1);
                        told = true;
                    }
                }
            }
        }
    }
    for (int s = 0; s < n; s++) ringlm_close(c[s]);
    if (write(res_fd, &tokens0, sizeof tokens0) != (ssize_t)sizeof tokens0) _exit(1);
    for (size_t off = 0, len = sizeof(double) * (size_t)tokens0; off < len;) {
        ssize_t w = write(res_fd, (const char *)seen + off, len - off);
        if (w <= 0) _exit(1);
        off += (size_t)w;
    }
    _exit(0);
}

typedef struct conn_result {
    int rc, pid;
    double t_start, t_connected, t_answered; /* CLOCK_MONOTONIC s: connect, usable, answered */
    double cpu_ms;                           /* this client's CPU time in its connect */
} conn_result;

/* One burst client: connect at the gate and say so; once every client has connected (the
 * second gate), one short request answered — submitted only then, so that the burst's
 * iterations are the busy streams' and the handshakes', not the prefill of the first
 * connected clients' prompts, which made an iteration of the stories15M shape 5-10 times
 * its steady period and the connects look short in it; then wait for the release before
 * exiting — a process's exit tears down the address space it inherited
 * from this bench (the model's weights, the probe's buffer: 7.5 ms of CPU for 200 MB at
 * load 17, against 1.6 ms for 1 MB), which a client answered early must not spend while
 * the others are still connecting; nor the daemon the session's end (its segments unmapped),
 * as a burst of clients that stay connected would not. */
static void connector(const daemon_proc *d, int vocab, const opts *o, int ready_fd, int gate_fd,
                      int gate2_fd, int res_fd, int release_fd)
{
    if (write(ready_fd, "r", 1) != 1) _exit(1);
    char b;
    while (read(gate_fd, &b, 1) > 0) {}
    conn_result cr = {0};
    cr.pid = getpid();
    ringlm_client *c = NULL;
    const double cpu0 = rusage_s(RUSAGE_SELF);
    cr.t_start = now_s();
    cr.rc = ringlm_connect(d->sock, &c);
    cr.t_connected = now_s();
    cr.cpu_ms = (rusage_s(RUSAGE_SELF) - cpu0) * 1e3;
    if (write(ready_fd, "c", 1) != 1) _exit(1);
    close(ready_fd); /* one that dies before it connects cannot hold the others' gate */
    while (read(gate2_fd, &b, 1) > 0) {}
    if (cr.rc == 0) {
        /* a working session: one short request answered */
        int32_t prompt[1024];
        ringlm_request r;
        request_for(&r, prompt, 999, vocab, o, 2);
        ringlm_event ev;
        if (ringlm_submit(c, &r, NULL) < 0)
            cr.rc = -EIO;
        else
            while ((cr.rc = ringlm_next_event(c, &ev, 30000)) == 1 && ev.kind != RINGLM_EV_FINISH) {
            }
        cr.rc = cr.rc == 1 ? 0 : cr.rc == 0 ? -ETIMEDOUT : cr.rc;
        cr.t_answered = now_s();
    }
    if (write(res_fd, &cr, sizeof cr) != (ssize_t)sizeof cr) _exit(1);
    close(res_fd);
    while (read(release_fd, &b, 1) > 0) {}
    if (c) ringlm_close(c);
    _exit(0);
}

/* Stream 0's tokens seen in (a, b]: the iterations that passed (seen ascending). */
static int tokens_between(const double *seen, int n, double a, double b)
{
    int k = 0;
    for (int i = 0; i < n; i++) k += seen[i] > a && seen[i] <= b;
    return k;
}

static int connect_burst(const daemon_proc *d, int vocab, int seq_len, const opts *o,
                         burst_result *br)
{
    memset(br, 0, sizeof *br);
    br->n = o->burst;
    int bready[2], bstop[2], bres[2];
    if (pipe(bready) || pipe(bstop) || pipe(bres)) return -1;
    fflush(NULL);
    pid_t busy = fork();
    if (busy == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(bready[0]);
        close(bstop[1]);
        close(bres[0]);
        busy_streams(d, o->busy, vocab, seq_len - o->prompt, o, bready[1], bstop[0], bres[1]);
    }
    close(bready[1]);
    close(bstop[0]);
    close(bres[1]);
    char b;
    if (read(bready[0], &b, 1) != 1) {
        fprintf(stderr, "serve_bench: the busy streams did not start\n");
        close(bstop[1]);
        waitpid(busy, NULL, 0);
        return -1;
    }
    int rp[2], gp[2], g2[2], sp[2], lp[2];
    if (pipe(rp) || pipe(gp) || pipe(g2) || pipe(sp) || pipe(lp)) return -1;
    pid_t pids[MAX_N];
    for (int i = 0; i < o->burst; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(rp[0]);
            close(gp[1]);
            close(g2[1]);
            close(sp[0]);
            close(lp[1]);
            connector(d, vocab, o, rp[1], gp[0], g2[0], sp[1], lp[0]);
        }
    }
    close(rp[1]);
    close(gp[0]);
    close(g2[0]);
    close(sp[1]);
    close(lp[0]);
    int ready = 0, connected = 0;
    while (ready < o->burst && read(rp[0], &b, 1) == 1) ready++;
    const double t_gate = now_s();
    close(gp[1]);
    while (connected < o->burst && read(rp[0], &b, 1) == 1) connected++;
    close(g2[1]); /* every client connected (or failed): the short requests now */
    static conn_result crs[MAX_N];
    int n_cr = 0;
    conn_result cr;
    while (n_cr < MAX_N && read(sp[0], &cr, sizeof cr) == (ssize_t)sizeof cr) {
        if (cr.rc == 0)
            br->connected++;
        else
            fprintf(stderr, "serve_bench: a burst client failed: %s\n", ringlm_strerror(cr.rc));
        crs[n_cr++] = cr;
    }
    close(rp[0]);
    close(sp[0]);
    close(lp[1]); /* the release: every client has its answer */
    for (int i = 0; i < o->burst; i++) waitpid(pids[i], NULL, 0);
    close(bstop[1]);
    int n_seen = 0;
    double *seen = malloc(sizeof(double) * BUSY_MAX_TOKENS);
    if (!seen || read(bres[0], &n_seen, sizeof n_seen) != (ssize_t)sizeof n_seen || n_seen < 0 ||
        n_seen > BUSY_MAX_TOKENS)
        n_seen = 0;
    for (size_t off = 0, len = sizeof(double) * (size_t)n_seen; off < len;) {
        ssize_t r = read(bres[0], (char *)seen + off, len - off);
        if (r <= 0) {
            n_seen = 0;
            break;
        }
        off += (size_t)r;
    }
    close(bres[0]);
    waitpid(busy, NULL, 0);
    if (o->burst_timeline) {
        /* relative to the gate, ms: stream 0's tokens from 0.3 s before, then per client
         * its pid, its connect's start, its session usable, its answer, its connect's CPU */
        for (int i = 0; i < n_seen; i++)
            if (seen[i] > t_gate - 0.3)
                fprintf(stderr, "burst token %8.2f\n", (seen[i] - t_gate) * 1e3);
        for (int i = 0; i < n_cr; i++)
            fprintf(stderr, "burst client %d %8.2f %8.2f %8.2f cpu %.2f ms\n", crs[i].pid,
                    (crs[i].t_start - t_gate) * 1e3, (crs[i].t_connected - t_gate) * 1e3,
                    (crs[i].t_answered - t_gate) * 1e3, crs[i].cpu_ms);
    }
    /* The iterations: the busy streams' period between tokens over the burst's window (gate
     * to the last connect), the period the goal is judged in — an iteration then holds the
     * daemon's handshakes besides the streams' step (the clients' requests wait for the
     * second gate); and beside it the steady period before the gate. Per connect,
     * the tokens of stream 0 that arrived while it connected: the iterations it saw pass. */
    static double lat[MAX_N], iters[MAX_N];
    double t_last = t_gate;
    for (int i = 0; i < n_cr; i++) {
        lat[i] = (crs[i].t_connected - crs[i].t_start) * 1e3;
        iters[i] = tokens_between(seen, n_seen, crs[i].t_start, crs[i].t_connected);
        if (crs[i].t_connected > t_last) t_last = crs[i].t_connected;
    }
    /* the window's iterations: from stream 0's last token before the gate to its first
     * after the last connect (a window with one token in it is still measured) */
    int i0 = -1, i1 = -1;
    for (int i = 0; i < n_seen; i++) {
        if (seen[i] <= t_gate) i0 = i;
        if (seen[i] >= t_last && i1 < 0) i1 = i;
    }
    br->period_ms = i0 >= 0 && i1 > i0 ? (seen[i1] - seen[i0]) * 1e3 / (i1 - i0) : 0;
    int pre = 0, first = -1;
    for (int i = 8; i < n_seen && seen[i] <= t_gate; i++) {
        if (first < 0) first = i;
        pre++;
    }
    br->steady_ms = pre > 1 ? (seen[first + pre - 1] - seen[first]) * 1e3 / (pre - 1) : 0;
    free(seen);
    if (n_cr) {
        br->p50_ms = bench_median(lat, n_cr); /* sorts lat */
        int q = (int)(0.99 * (n_cr - 1) + 0.999);
        br->p99_ms = lat[q < n_cr ? q : n_cr - 1];
        br->max_ms = lat[n_cr - 1];
        bench_median(iters, n_cr); /* sorts iters */
        br->p99_tokens_seen = iters[q < n_cr ? q : n_cr - 1];
    }
    return 0;
}

/* ---- one run of one size: each mode's slices ------------------------------------------- */

enum { M_ENGINE, M_SESSIONS, M_PROCS, N_MODES };
static const char *const mode_name[N_MODES] = {"engine", "sessions", "procs"};

/* One size's run: each mode's tok/s over its slices together (tokens / seconds), each
 * slice's own, what the windows saw, the procs' clients' CPU per token. */
typedef struct runfig {
    double tok[N_MODES];
    double slice_tok[N_MODES][MAX_SLICES];
    int n_slices[N_MODES];
    double secs[N_MODES];
    double client_cpu_s;
    attrib at[N_MODES];
} runfig;

/* What a slice needs beyond the options. */
typedef struct bench_ctx {
    const eng_model *m;
    const opts *o;
    daemon_proc *d;
    int vocab, daemon_nice, engine_group;
    double *steps; /* decode step seconds of a run's engine slices (step_stats) */
    int n_steps_cap;
    uint64_t *probe_buf;
} bench_ctx;

/* The engine alone, reps generations of n sequences at the daemon's priority (ringlmd
 * lowers its nice to -10 where permitted: the engine alone gets what the engine in the
 * daemon gets; back to ours before any client is forked: clients run at their own
 * priority). The engine's worker threads exist only while it runs: the client processes
 * are forked from a single-threaded process. Seconds (< 0: failed); its window's figures
 * are added to *ae, its steps to bc->steps from *n_steps. */
static double engine_slice(const bench_ctx *bc, int n, int reps, attrib *ae, int *n_steps)
{
    const opts *o = bc->o;
    engb b;
    double secs = -1;
    const int own = getpriority(PRIO_PROCESS, 0);
    if (setpriority(PRIO_PROCESS, 0, bc->daemon_nice) != 0) { /* not permitted: ours */
    }
    const int own_group = rnuma_autogroup_nice(getpid());
    if (bc->engine_group != INT32_MIN) autogroup_set_self(bc->engine_group);
    if (engb_init(&b, bc->m, o, n) == 0) {
        eng_phase_stats ps;
        eng_phase_stats_get(b.e, NULL, true);
        settle(bc->d->pid);
        const probe pr = machine_probe(bc->probe_buf, o->threads);
        const mark m0 = mark_now(getpid(), bc->d->pid);
        const long f0 = faults_self();
        secs = 0;
        for (int rep = 0; rep < reps && secs >= 0; rep++) {
            const double t = engb_run(&b, n, o);
            secs = t < 0 ? -1 : secs + t;
        }
        const long f1 = faults_self();
        attrib a = attrib_since(m0, getpid(), bc->d->pid); /* before engb_free joins the helpers */
        attrib_add(ae, &a);
        if (eng_phase_stats_get(b.e, &ps, false) == 0) {
            ae->helper_sleeps += (long)ps.helper_sleeps;
            ae->helper_waits += (long)ps.helper_waits;
            ae->straggler_waits += (long)ps.straggler_waits;
            ae->straggler_ms += (double)ps.straggler_ns * 1e-6;
        }
        for (int i = 0; i < b.n_steps && *n_steps < bc->n_steps_cap; i++)
            bc->steps[(*n_steps)++] = b.step_s[i];
        ae->faults += f1 - f0;
        /* the probes of a run's slices averaged (attrib_add leaves them) */
        ae->probe_gbs += pr.read_gbs;
        ae->probe_gflops += pr.fma_gflops;
    }
    engb_free(&b);
    if (bc->engine_group != INT32_MIN) autogroup_set_self(own_group);
    if (setpriority(PRIO_PROCESS, 0, own) != 0) { /* raising nice is always allowed */
    }
    return secs;
}

/* One run of size n: each mode's slices, in the order engine, sessions, procs, then procs,
 * sessions, engine, and so on (slice j mirrored when j is odd), so that a machine that
 * drifts during the run drifts under all three alike. 0, or < 0 when a slice failed. */
static int run_size(const bench_ctx *bc, int n, int reps, runfig *rf)
{
    const opts *o = bc->o;
    const double toks = (double)n * o->gen * reps;
    int n_steps = 0;
    memset(rf, 0, sizeof *rf);
    for (int md = 0; md < N_MODES; md++) rf->at[md].helper_sleeps = rf->at[md].helper_waits = -1;
    rf->at[M_ENGINE].helper_sleeps = rf->at[M_ENGINE].helper_waits = 0;
    const int n_modes = o->engine_only ? 1 : N_MODES;
    for (int j = 0; j < o->slices; j++) {
        for (int i = 0; i < n_modes; i++) {
            const int md = o->engine_only ? M_ENGINE : j % 2 ? N_MODES - 1 - i : i;
            double secs = -1;
            if (md == M_ENGINE) {
                secs = engine_slice(bc, n, reps, &rf->at[md], &n_steps);
            } else {
                settle(bc->d->pid);
                const mark m = mark_now(bc->d->pid, bc->d->pid);
                double ccpu = 0;
                secs = md == M_SESSIONS ? run_sessions(bc->d, n, bc->vocab, o, reps)
                                        : run_procs(bc->d, n, bc->vocab, o, reps, &ccpu);
                const attrib a = attrib_since(m, bc->d->pid, bc->d->pid);
                attrib_add(&rf->at[md], &a);
                rf->client_cpu_s += ccpu;
            }
            if (secs <= 0) return -1;
            rf->slice_tok[md][rf->n_slices[md]++] = toks / secs;
            rf->secs[md] += secs;
        }
    }
    for (int md = 0; md < n_modes; md++) rf->tok[md] = toks * rf->n_slices[md] / rf->secs[md];
    attrib *ae = &rf->at[M_ENGINE];
    ae->probe_gbs /= o->slices;
    ae->probe_gflops /= o->slices;
    engb tmp = {.step_s = bc->steps, .n_steps = n_steps};
    step_stats(&tmp, ae);
    return 0;
}

/* ---- reporting ----------------------------------------------------------------------- */

typedef struct stat3 {
    double med, lo, hi;
} stat3;

static stat3 stats_of(const double *v, int n)
{
    double t[MAX_RUNS];
    memcpy(t, v, sizeof(double) * (size_t)n);
    stat3 s = {bench_median(t, n), t[0], t[n - 1]};
    return s;
}

/* The farthest run from the median, as a fraction of the median. */
static double spread_of(stat3 s)
{
    if (s.med <= 0) return 0;
    double a = (s.med - s.lo) / s.med, b = (s.hi - s.med) / s.med;
    return a > b ? a : b;
}

/* Everything reported for one size over the runs. */
typedef struct size_sum {
    stat3 tok[N_MODES]; /* tok/s per mode over the runs */
    double spread[N_MODES];
    stat3 ratio[N_MODES]; /* per run: the mode / the engine in the same run */
    double ratio_spread[N_MODES];
    double slice_spread[N_MODES]; /* median over runs of (fastest - slowest slice) / mean */
    stat3 probe_gbs, probe_gflops, others_pct[N_MODES], cpu_us_tok;
    bool ok, abs_spread_ok, procs_vary_more;
} size_sum;

#define GOAL_SES       0.85
#define GOAL_PROC      0.75
#define GOAL_SPREAD    0.15
#define GOAL_P99_ITERS 2.0

static size_sum summarize(const runfig *rf, int runs, const opts *o, int n)
{
    size_sum z;
    memset(&z, 0, sizeof z);
    double v[MAX_RUNS];
    const int n_modes = o->engine_only ? 1 : N_MODES;
    for (int md = 0; md < n_modes; md++) {
        for (int r = 0; r < runs; r++) v[r] = rf[r].tok[md];
        z.tok[md] = stats_of(v, runs);
        z.spread[md] = spread_of(z.tok[md]);
        for (int r = 0; r < runs; r++) v[r] = rf[r].tok[md] / rf[r].tok[M_ENGINE];
        z.ratio[md] = stats_of(v, runs);
        z.ratio_spread[md] = spread_of(z.ratio[md]);
        for (int r = 0; r < runs; r++) {
            double lo = 1e300, hi = 0, sum = 0;
            for (int j = 0; j < rf[r].n_slices[md]; j++) {
                const double x = rf[r].slice_tok[md][j];
                lo = x < lo ? x : lo;
                hi = x > hi ? x : hi;
                sum += x;
            }
            v[r] = sum > 0 ? (hi - lo) / (sum / rf[r].n_slices[md]) : 0;
        }
        z.slice_spread[md] = stats_of(v, runs).med;
        for (int r = 0; r < runs; r++) v[r] = rf[r].at[md].others_pct;
        z.others_pct[md] = stats_of(v, runs);
    }
    for (int r = 0; r < runs; r++) v[r] = rf[r].at[M_ENGINE].probe_gbs;
    z.probe_gbs = stats_of(v, runs);
    for (int r = 0; r < runs; r++) v[r] = rf[r].at[M_ENGINE].probe_gflops;
    z.probe_gflops = stats_of(v, runs);
    if (o->engine_only) return z;
    for (int r = 0; r < runs; r++)
        v[r] = rf[r].client_cpu_s * 1e6 / ((double)n * o->gen * rf[r].n_slices[M_PROCS]);
    z.cpu_us_tok = stats_of(v, runs);
    /* The goals: the daemon's median ratio to the engine of the same runs, and the spread of
     * that ratio — the daemon's own variation; the tok/s spreads (engine alone included:
     * the machine's) are reported beside and judged apart (abs_spread_ok). */
    z.ok = z.ratio[M_SESSIONS].med >= GOAL_SES && z.ratio[M_PROCS].med >= GOAL_PROC &&
           z.ratio_spread[M_SESSIONS] <= GOAL_SPREAD && z.ratio_spread[M_PROCS] <= GOAL_SPREAD;
    z.abs_spread_ok = z.spread[M_ENGINE] <= GOAL_SPREAD && z.spread[M_SESSIONS] <= GOAL_SPREAD &&
                      z.spread[M_PROCS] <= GOAL_SPREAD;
    /* procs' slices within a run vary more than the engine's in the same runs: the daemon
     * with N processes adds variation of its own (or its clients do) */
    z.procs_vary_more = o->slices > 1 && z.slice_spread[M_PROCS] > 0.05 &&
                        z.slice_spread[M_PROCS] > 2 * z.slice_spread[M_ENGINE];
    return z;
}

static void json_stat(const char *key, stat3 s, bool comma)
{
    printf("%s\"%s\":{\"median\":%.4g,\"min\":%.4g,\"max\":%.4g,\"spread\":%.3f}", comma ? "," : "",
           key, s.med, s.lo, s.hi, spread_of(s));
}

static void json_size(const runfig *rf, const size_sum *z, int n, int reps, const opts *o,
                      bool first)
{
    const int n_modes = o->engine_only ? 1 : N_MODES;
    printf("%s{\"n\":%d,\"gens_per_slice\":%d,\"slices_per_mode\":%d", first ? "" : ",", n, reps,
           o->slices);
    for (int md = 0; md < n_modes; md++) json_stat(mode_name[md], z->tok[md], true);
    if (!o->engine_only) {
        printf(",\"sessions_vs_engine\":%.3f,\"procs_vs_engine\":%.3f",
               z->tok[M_SESSIONS].med / z->tok[M_ENGINE].med,
               z->tok[M_PROCS].med / z->tok[M_ENGINE].med);
        json_stat("run_ratio_sessions", z->ratio[M_SESSIONS], true);
        json_stat("run_ratio_procs", z->ratio[M_PROCS], true);
        json_stat("procs_client_cpu_us_per_token", z->cpu_us_tok, true);
        double sp = z->spread[M_ENGINE];
        for (int md = 1; md < N_MODES; md++) sp = z->spread[md] > sp ? z->spread[md] : sp;
        printf(",\"max_spread\":%.3f,\"spread_judged\":\"run_ratio\",\"abs_spread_within_goal\":%s,"
               "\"procs_slices_vary_more_than_engine\":%s,\"goals_met\":%s",
               sp, z->abs_spread_ok ? "true" : "false", z->procs_vary_more ? "true" : "false",
               z->ok ? "true" : "false");
    }
    printf(",\"machine\":{\"engine_spread\":%.3f", z->spread[M_ENGINE]);
    json_stat("probe_read_gbs", z->probe_gbs, true);
    json_stat("probe_gflops", z->probe_gflops, true);
    printf("},\"slice_spread\":{");
    for (int md = 0; md < n_modes; md++)
        printf("%s\"%s\":%.3f", md ? "," : "", mode_name[md], z->slice_spread[md]);
    printf("},\"runs\":[");
    for (int r = 0; r < o->runs; r++) {
        const runfig *f = &rf[r];
        const attrib *e = &f->at[M_ENGINE];
        printf("%s{", r ? "," : "");
        for (int md = 0; md < n_modes; md++)
            printf("%s\"%s\":%.1f", md ? "," : "", mode_name[md], f->tok[md]);
        printf(",\"slices\":{");
        for (int md = 0; md < n_modes; md++) {
            printf("%s\"%s\":[", md ? "," : "", mode_name[md]);
            for (int j = 0; j < f->n_slices[md]; j++)
                printf("%s%.1f", j ? "," : "", f->slice_tok[md][j]);
            printf("]");
        }
        printf("}");
        if (!o->engine_only)
            printf(",\"ratio_sessions\":%.3f,\"ratio_procs\":%.3f",
                   f->tok[M_SESSIONS] / f->tok[M_ENGINE], f->tok[M_PROCS] / f->tok[M_ENGINE]);
        printf(",\"others_cpu_pct\":[");
        for (int md = 0; md < n_modes; md++) printf("%s%.1f", md ? "," : "", f->at[md].others_pct);
        printf("],\"steal_pct\":[");
        for (int md = 0; md < n_modes; md++) printf("%s%.2f", md ? "," : "", f->at[md].steal_pct);
        printf("],\"preemptions\":[");
        for (int md = 0; md < n_modes; md++) printf("%s%ld", md ? "," : "", f->at[md].preempt);
        printf("],\"ringlmd_cpu_ms\":[");
        for (int md = 0; md < n_modes; md++) printf("%s%.1f", md ? "," : "", f->at[md].daemon_ms);
        printf(
            "],\"engine_helper_sleeps\":%ld,\"engine_helper_waits\":%ld,"
            "\"engine_step_median_ms\":%.3f,\"engine_step_max_ms\":%.3f,\"engine_slow_steps\":%ld,"
            "\"engine_slow_steps_excess_ms\":%.2f,\"engine_straggler_waits\":%ld,"
            "\"engine_straggler_ms\":%.2f,\"engine_page_faults\":%ld,\"probe_read_gbs\":%.3f,"
            "\"probe_gflops\":%.3f}",
            e->helper_sleeps, e->helper_waits, e->step_med_ms, e->step_max_ms, e->slow_steps,
            e->slow_excess_ms, e->straggler_waits, e->straggler_ms, e->faults, e->probe_gbs,
            e->probe_gflops);
    }
    printf("]}");
}

/* One run's line on stderr as it ends (text mode): what to look at while it runs. */
static void print_run(const runfig *f, int run, int n, const opts *o)
{
    const attrib *e = &f->at[M_ENGINE];
    fprintf(stderr, "run %d, %2d sequences: engine %.1f", run + 1, n, f->tok[M_ENGINE]);
    if (!o->engine_only)
        fprintf(stderr, ", sessions %.1f (%.3fx), procs %.1f (%.3fx)", f->tok[M_SESSIONS],
                f->tok[M_SESSIONS] / f->tok[M_ENGINE], f->tok[M_PROCS],
                f->tok[M_PROCS] / f->tok[M_ENGINE]);
    fprintf(stderr, " tok/s; slices");
    for (int md = 0; md < (o->engine_only ? 1 : N_MODES); md++) {
        fprintf(stderr, " %s", mode_name[md]);
        for (int j = 0; j < f->n_slices[md]; j++)
            fprintf(stderr, "%s%.0f", j ? "/" : " ", f->slice_tok[md][j]);
    }
    fprintf(stderr,
            "; others' CPU %.1f/%.1f/%.1f%%; ringlmd preempted %ld/%ld; engine: steps median %.2f "
            "max %.2f ms, %ld over 2x median took %.1f ms more, caller waited on a helper %.1f ms, "
            "%ld page faults, probe %.2f GB/s %.2f GFLOP/s\n",
            e->others_pct, f->at[M_SESSIONS].others_pct, f->at[M_PROCS].others_pct,
            f->at[M_SESSIONS].preempt, f->at[M_PROCS].preempt, e->step_med_ms, e->step_max_ms,
            e->slow_steps, e->slow_excess_ms, e->straggler_ms, e->faults, e->probe_gbs,
            e->probe_gflops);
}

static void loadavg(char *out, size_t n)
{
    snprintf(out, n, "?");
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f) return;
    double a, b, c;
    if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3) snprintf(out, n, "%.2f %.2f %.2f", a, b, c);
    fclose(f);
}

static int parse_sizes(const char *arg, int *sizes)
{
    int n = 0;
    for (const char *p = arg; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > MAX_N || n == MAX_SIZES || (*end && *end != ',')) return -1;
        sizes[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: serve_bench --model M [--clients 1,4,8,16,32] [--runs 5] [--threads 2]\n"
            "                   [--slices 2] [--min-slice-ms 1000] [--burst-timeline]\n"
            "                   [--prompt 32] [--gen 128] [--connect-burst 32] [--busy 32]\n"
            "                   [--ringlmd PATH] [--daemon-arg ARG]... [--no-settle] "
            "[--daemon-session]\n"
            "                   [--engine-only] [--json]\n");
}

int main(int argc, char **argv)
{
    opts o = {.runs = 5,
              .threads = 2,
              .prompt = 32,
              .gen = 128,
              .burst = 32,
              .busy = 32,
              .slices = 2,
              .min_slice_ms = 1000,
              .daemon_session = false};
    o.n_sizes = parse_sizes("1,4,8,16,32", o.sizes);
    static char default_ringlmd[PATH_MAX + 32];
    enum {
        O_MODEL = 1,
        O_CLIENTS,
        O_RUNS,
        O_THREADS,
        O_PROMPT,
        O_GEN,
        O_BURST,
        O_BUSY,
        O_RINGLMD,
        O_DARG,
        O_JSON,
        O_NO_SETTLE,
        O_DSESSION,
        O_SAME_SESSION,
        O_ENGINE_ONLY,
        O_SLICES,
        O_MIN_SLICE,
        O_BURST_TIMELINE
    };
    static const struct option lo[] = {{"model", required_argument, 0, O_MODEL},
                                       {"clients", required_argument, 0, O_CLIENTS},
                                       {"runs", required_argument, 0, O_RUNS},
                                       {"threads", required_argument, 0, O_THREADS},
                                       {"prompt", required_argument, 0, O_PROMPT},
                                       {"gen", required_argument, 0, O_GEN},
                                       {"connect-burst", required_argument, 0, O_BURST},
                                       {"busy", required_argument, 0, O_BUSY},
                                       {"ringlmd", required_argument, 0, O_RINGLMD},
                                       {"daemon-arg", required_argument, 0, O_DARG},
                                       {"json", no_argument, 0, O_JSON},
                                       {"no-settle", no_argument, 0, O_NO_SETTLE},
                                       {"daemon-session", no_argument, 0, O_DSESSION},
                                       {"engine-only", no_argument, 0, O_ENGINE_ONLY},
                                       {"same-session", no_argument, 0, O_SAME_SESSION},
                                       {"slices", required_argument, 0, O_SLICES},
                                       {"min-slice-ms", required_argument, 0, O_MIN_SLICE},
                                       {"burst-timeline", no_argument, 0, O_BURST_TIMELINE},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case O_MODEL: o.model = optarg; break;
        case O_CLIENTS:
            if ((o.n_sizes = parse_sizes(optarg, o.sizes)) <= 0) {
                usage();
                return 2;
            }
            break;
        case O_RUNS: o.runs = atoi(optarg); break;
        case O_THREADS: o.threads = atoi(optarg); break;
        case O_PROMPT: o.prompt = atoi(optarg); break;
        case O_GEN: o.gen = atoi(optarg); break;
        case O_BURST: o.burst = atoi(optarg); break;
        case O_BUSY: o.busy = atoi(optarg); break;
        case O_RINGLMD: o.ringlmd = optarg; break;
        case O_DARG:
            if (o.n_daemon_args == MAX_DAEMON_ARGS) {
                usage();
                return 2;
            }
            o.daemon_args[o.n_daemon_args++] = optarg;
            break;
        case O_JSON: o.json = true; break;
        case O_NO_SETTLE: no_settle = true; break;
        case O_DSESSION: o.daemon_session = true; break;
        case O_SAME_SESSION: o.daemon_session = false; break;
        case O_ENGINE_ONLY:
            o.engine_only = true;
            o.burst = 0;
            break;
        case O_SLICES: o.slices = atoi(optarg); break;
        case O_MIN_SLICE: o.min_slice_ms = atoi(optarg); break;
        case O_BURST_TIMELINE: o.burst_timeline = true; break;
        default: usage(); return ch == 'h' ? 0 : 2;
        }
    }
    if (!o.model || o.runs < 0 || o.runs > MAX_RUNS || o.threads < 1 || o.prompt < 1 ||
        o.prompt > 1024 || o.gen < 1 || o.burst < 0 || o.burst > MAX_N || o.busy < 1 ||
        o.busy > MAX_N || o.slices < 1 || o.slices > MAX_SLICES || o.min_slice_ms < 0) {
        usage();
        return 2;
    }
    if (!o.ringlmd) {
        /* build/perf/serve_bench → build/bin/ringlmd */
        char self[PATH_MAX];
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        self[k > 0 ? k : 0] = 0;
        char *slash = strrchr(self, '/');
        if (slash) *slash = 0;
        snprintf(default_ringlmd, sizeof default_ringlmd, "%s/../bin/ringlmd", self);
        o.ringlmd = default_ringlmd;
    }
    signal(SIGPIPE, SIG_IGN);

    eng_model *m;
    if (eng_model_load(o.model, &m) < 0) {
        fprintf(stderr, "serve_bench: %s: %s\n", o.model, eng_errmsg());
        return 1;
    }
    const eng_model_config *mc = eng_model_cfg(m);
    int vocab = mc->vocab_size, seq_len = mc->seq_len;
    if (o.prompt + o.gen > seq_len) {
        fprintf(stderr, "serve_bench: prompt %d + gen %d exceed the context of %d\n", o.prompt,
                o.gen, seq_len);
        return 2;
    }
    char load0[64], load1[64];
    loadavg(load0, sizeof load0);
    daemon_proc d = {0};
    /* --engine-only: the engine at the nice ringlmd would take (-10 where permitted) */
    int daemon_nice = -10;
    if (!o.engine_only) {
        if (daemon_start(&d, &o) < 0) {
            daemon_stop(&d);
            return 1;
        }
        errno = 0;
        daemon_nice = getpriority(PRIO_PROCESS, (id_t)d.pid);
        if (errno) daemon_nice = 0;
        if (!o.json) fprintf(stderr, "ringlmd runs at nice %d\n", daemon_nice);
    }
    /* The engine alone's scheduling group: the daemon's, when it has one of its own. */
    int engine_group = INT32_MIN;
    if (o.daemon_session && rnuma_autogroup_nice(getpid()) != INT32_MIN)
        engine_group = o.engine_only ? daemon_nice : rnuma_autogroup_nice(d.pid);
    if (!o.json && engine_group != INT32_MIN)
        fprintf(stderr,
                "%s in a session of its own, its scheduling group at nice %d; the engine "
                "alone runs with ours at that nice\n",
                o.engine_only ? "(engine only)" : "ringlmd", engine_group);

    static runfig rf[MAX_SIZES][MAX_RUNS];
    int reps[MAX_SIZES];
    uint64_t *probe_buf = malloc(PROBE_BYTES);
    double *steps = calloc((size_t)o.gen * MAX_REPS * (size_t)o.slices, sizeof(double));
    if (!probe_buf || !steps) {
        daemon_stop(&d);
        return 1;
    }
    for (size_t i = 0; i < PROBE_BYTES / sizeof(uint64_t); i++)
        probe_buf[i] = i * 0x9e3779b97f4a7c15ull;
    const bench_ctx bc = {.m = m,
                          .o = &o,
                          .d = &d,
                          .vocab = vocab,
                          .daemon_nice = daemon_nice,
                          .engine_group = engine_group,
                          .steps = steps,
                          .n_steps_cap = o.gen * MAX_REPS * o.slices,
                          .probe_buf = probe_buf};
    int rc = 0;
    /* Warm-up, not counted: the first engine created in a process pays for cold BLAS state
     * and page faults on the weights (measured: 1 sequence at 91 tok/s cold, 4 at 2100).
     * Then one generation of each size with the engine alone says how many generations a
     * slice runs back to back (--min-slice-ms: noise of a second's scale averages out within
     * a slice; the same count for all three modes and every run). */
    if (o.runs > 0) {
        int n = o.sizes[o.n_sizes - 1];
        engb b;
        if (engb_init(&b, m, &o, n) < 0 || engb_run(&b, n, &o) < 0) rc = 1;
        engb_free(&b);
        if (!rc && !o.engine_only && run_sessions(&d, n, vocab, &o, 1) < 0) rc = 1;
        for (int k = 0; k < o.n_sizes && !rc; k++) {
            attrib scratch = {0};
            int n_steps = 0;
            double t = engine_slice(&bc, o.sizes[k], 1, &scratch, &n_steps);
            if (t <= 0) {
                rc = 1;
                break;
            }
            int r = (int)(o.min_slice_ms * 1e-3 / t + 0.999);
            reps[k] = r < 1 ? 1 : r > MAX_REPS ? MAX_REPS : r;
        }
    }
    for (int run = 0; run < o.runs && !rc; run++)
        for (int k = 0; k < o.n_sizes && !rc; k++) {
            if (run_size(&bc, o.sizes[k], reps[k], &rf[k][run]) < 0) {
                rc = 1;
                break;
            }
            if (!o.json) print_run(&rf[k][run], run, o.sizes[k], &o);
        }
    burst_result br = {0};
    if (!rc && o.burst > 0 && connect_burst(&d, vocab, seq_len, &o, &br) < 0) rc = 1;
    daemon_stop(&d);
    eng_model_free(m);
    free(probe_buf);
    free(steps);
    if (rc) return rc;
    loadavg(load1, sizeof load1);
    double burst_iters = br.period_ms > 0 ? br.p99_ms / br.period_ms : 0;
    bool burst_ok =
        o.burst == 0 || (br.connected == br.n && br.period_ms > 0 && burst_iters < GOAL_P99_ITERS);
    bool all_ok = burst_ok;

    if (o.json) {
        printf("{\"bench\":\"serve_bench\",%s\"model\":\"%s\",\"threads\":%d,\"runs\":%d,"
               "\"slices_per_mode\":%d,\"min_slice_ms\":%d,\"prompt\":%d,\"gen\":%d,\"daemon_"
               "nice\":%d,"
               "\"loadavg_before\":\"%s\",\"loadavg_after\":\"%s\",\"unit\":\"tok/s\",\"sizes\":[",
               o.engine_only ? "\"engine_only\":true," : "", o.model, o.threads, o.runs, o.slices,
               o.min_slice_ms, o.prompt, o.gen, daemon_nice, load0, load1);
        for (int k = 0; k < o.n_sizes && o.runs > 0; k++) {
            size_sum z = summarize(rf[k], o.runs, &o, o.sizes[k]);
            all_ok &= o.engine_only || z.ok;
            json_size(rf[k], &z, o.sizes[k], reps[k], &o, k == 0);
        }
        printf("]");
        if (o.burst > 0)
            printf(",\"connect_burst\":{\"clients\":%d,\"busy_streams\":%d,\"connected\":%d,"
                   "\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f,\"iteration_ms\":%.3f,"
                   "\"iteration_basis\":\"gate_to_last_connect\",\"steady_iteration_ms\":%.3f,"
                   "\"p50_iterations\":%.2f,\"p99_iterations\":%.2f,\"p99_steady_iterations\":%.2f,"
                   "\"p99_tokens_seen_during_connect\":%.0f,\"goal_met\":%s}",
                   br.n, o.busy, br.connected, br.p50_ms, br.p99_ms, br.max_ms, br.period_ms,
                   br.steady_ms, br.period_ms > 0 ? br.p50_ms / br.period_ms : 0, burst_iters,
                   br.steady_ms > 0 ? br.p99_ms / br.steady_ms : 0, br.p99_tokens_seen,
                   burst_ok ? "true" : "false");
        if (!o.engine_only) printf(",\"all_goals_met\":%s", all_ok ? "true" : "false");
        printf("}\n");
        return 0;
    }
    printf(
        "serve_bench %s, %d threads, %d-token prompts, %d generated (ignore_stop), %d runs of %d "
        "slices per mode (engine, sessions, procs, then mirrored), ringlmd at nice %d; load "
        "average %s before, %s after\n",
        o.model, o.threads, o.prompt, o.gen, o.runs, o.slices, daemon_nice, load0, load1);
    if (o.runs > 0) {
        printf("tok/s median [lowest, highest] of the runs (a run's figure: its slices together), "
               "the spread (the run farthest from the median) beside\n");
        printf("%4s %5s  %-28s %-28s %-28s %10s\n", "N", "gens", "engine", "ringlmd, N sessions",
               "ringlmd, N procs", "client us/tok");
    }
    for (int k = 0; k < o.n_sizes && o.runs > 0; k++) {
        size_sum z = summarize(rf[k], o.runs, &o, o.sizes[k]);
        char a[N_MODES][64];
        for (int md = 0; md < N_MODES; md++)
            snprintf(a[md], sizeof a[md], "%.1f [%.1f, %.1f] %.1f%%", z.tok[md].med, z.tok[md].lo,
                     z.tok[md].hi, z.spread[md] * 100);
        printf("%4d %5d  %-28s %-28s %-28s %10.1f\n", o.sizes[k], reps[k], a[0],
               o.engine_only ? "" : a[1], o.engine_only ? "" : a[2], z.cpu_us_tok.med);
    }
    if (o.runs > 0 && !o.engine_only) {
        printf("the daemon / the engine of the same run, median [lowest, highest], spread (goals: "
               "sessions >= %.2fx, procs >= %.2fx, each ratio's spread <= %.0f%%: the daemon's own "
               "variation, judged; the tok/s spreads above are the machine's too, reported)\n",
               GOAL_SES, GOAL_PROC, GOAL_SPREAD * 100);
        printf("%4s  %-30s %-30s %-14s %s\n", "N", "sessions / engine", "procs / engine",
               "tok/s spreads", "goals");
    }
    for (int k = 0; k < o.n_sizes && o.runs > 0 && !o.engine_only; k++) {
        size_sum z = summarize(rf[k], o.runs, &o, o.sizes[k]);
        all_ok &= z.ok;
        char a[2][64];
        for (int i = 0; i < 2; i++) {
            stat3 r = z.ratio[M_SESSIONS + i];
            snprintf(a[i], sizeof a[i], "%.3f [%.3f, %.3f] %.1f%%", r.med, r.lo, r.hi,
                     z.ratio_spread[M_SESSIONS + i] * 100);
        }
        printf("%4d  %-30s %-30s %-14s %s\n", o.sizes[k], a[0], a[1],
               z.abs_spread_ok ? "within 15%" : "NOT within", z.ok ? "met" : "NOT met");
    }
    if (o.runs > 0)
        printf("the machine: the engine alone's spread over the runs, the probe before its slices, "
               "the CPU the others used (%% of all CPUs, median over runs: engine/sessions/procs "
               "windows), each mode's slices within a run ((fastest - slowest) / mean, median "
               "over runs)\n");
    for (int k = 0; k < o.n_sizes && o.runs > 0; k++) {
        size_sum z = summarize(rf[k], o.runs, &o, o.sizes[k]);
        printf(
            "%4d  engine spread %.1f%%; probe read %.2f GB/s [%.2f, %.2f] %.1f%%, %.2f GFLOP/s "
            "[%.2f, %.2f] %.1f%%; others' CPU %.1f/%.1f/%.1f%%; slices vary %.1f/%.1f/%.1f%%%s\n",
            o.sizes[k], z.spread[M_ENGINE] * 100, z.probe_gbs.med, z.probe_gbs.lo, z.probe_gbs.hi,
            spread_of(z.probe_gbs) * 100, z.probe_gflops.med, z.probe_gflops.lo, z.probe_gflops.hi,
            spread_of(z.probe_gflops) * 100, z.others_pct[0].med, z.others_pct[1].med,
            z.others_pct[2].med, z.slice_spread[0] * 100, z.slice_spread[1] * 100,
            z.slice_spread[2] * 100,
            z.procs_vary_more ? " — procs' slices vary more than the engine's in the same runs"
                              : "");
    }
    if (o.burst > 0)
        printf(
            "%d connects at once to a daemon busy with %d streams: %d connected; connect "
            "(ringlm_connect "
            "to a usable session) p50 %.2f ms = %.2f iterations, p99 %.2f ms = %.2f iterations "
            "(of %.2f ms, the busy streams' token period from the gate to the last connect; "
            "%.2f ms before the gate: p99 = %.2f of those), max %.2f ms; p99 of stream 0's tokens "
            "that arrived during a connect %.0f; goal (all connected, p99 < %.0f iterations) %s\n",
            br.n, o.busy, br.connected, br.p50_ms, br.period_ms > 0 ? br.p50_ms / br.period_ms : 0,
            br.p99_ms, burst_iters, br.period_ms, br.steady_ms,
            br.steady_ms > 0 ? br.p99_ms / br.steady_ms : 0, br.max_ms, br.p99_tokens_seen,
            GOAL_P99_ITERS, burst_ok ? "met" : "NOT met");
    if (!o.engine_only) printf("goals: %s\n", all_ok ? "all met" : "NOT all met");
    return 0;
}
