/* SPDX-License-Identifier: MIT */
/*
 * sched_bench — cost of one sched_step() in steady state: R running sequences decoding, W
 * waiting across 8 tenants and 3 classes, sequences finishing and new requests arriving
 * every step so admissions (heap picks) happen as they would in service.
 *
 *   build/perf/sched_bench            table of p50/p99 per size, ratios to the smallest
 *   build/perf/sched_bench --json     adds {"step_us":{"p50":…,"p99":…}} for 256/10,000
 *   --steps N                         measured steps per size (default 2000)
 *   --prefix-only                     only the prefix-index case below, and the step with the
 *                                     cache on in FCFS order and in longest_prefix order
 *                                     (prefix_order, sched/order.c) side by side
 *
 * The prefix-index case (sched/prefix.h, DESIGN §10): a device pool of 100,000 blocks of 16
 * tokens, full of cached prompts (400 system prompts of 8 blocks, each prompt 32 blocks)
 * that no sequence holds.  Timed per operation: a cached prompt's lookup + acquire +
 * release; a miss; a new prompt that shares a system prompt (lookup, acquire, evict 24
 * blocks, insert 24, release); and XXH3 keys for a 512-token prompt.
 *
 * Only sched_step is timed (commit is reported separately); the event sink counts events,
 * so building them is part of the cost.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched/prefix.h"
#include "sched/sched.h"

#define PX_BLOCKS 100000u
#define PX_BS     16u
#define PX_PROMPT 32u /* blocks per prompt */
#define PX_SYS    8u  /* of which shared system-prompt blocks */
#define PX_NSYS   400u

static uint64_t events;
static void sink(void *ctx, const sched_event *ev)
{
    (void)ctx;
    (void)ev;
    events++;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* CPU time of this thread: on a shared machine the wall clock's tail is the OS descheduling
 * the benchmark, not the scheduler's work; both are reported. */
static double cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct result {
    uint32_t running, waiting;
    double p50, p99, commit_p50, cpu_p50, cpu_p99;
    uint32_t real_running, real_waiting, cached;
} result;

static uint32_t *target_out; /* by id */
static uint64_t next_id;

/* With the prefix cache on, prompts carry tokens: one of 400 system prompts (64 tokens),
 * then the request's own. */
static int prefix_on;
static int order_longest; /* every class: prefix_order = longest_prefix */
static int32_t prompt_tok[512];

static int submit_one(sched *s, uint64_t now)
{
    uint64_t id = ++next_id;
    sched_request r = {.id = id,
                       .tenant = (int32_t)rnd(8),
                       .class_idx = (int32_t)rnd(3),
                       .prompt_len = 50 + rnd(350),
                       .max_new_tokens = 400,
                       .arrival_us = now};
    if (prefix_on) {
        uint32_t sys = rnd(400);
        for (uint32_t i = 0; i < r.prompt_len; i++)
            prompt_tok[i] = i < 64 ? (int32_t)(sys * 977 + i) : (int32_t)(id * 131 + i);
        r.tokens = prompt_tok;
        r.cache_salt = (uint64_t)r.tenant;
    }
    target_out[id % (1u << 22)] = 20 + rnd(380);
    return sched_submit(s, &r, now, NULL);
}

static int run_size(uint32_t running, uint32_t waiting, int steps, result *out)
{
    out->cached = 0;
    char pol[1024];
    const char *ord = order_longest ? "prefix_order = longest_prefix\n" : "";
    snprintf(pol, sizeof pol,
             "[scheduler]\ntoken_budget = %u\nmax_active_seqs = %u\nprefill_chunk = 256\n"
             "decode_reserve_tokens = 64\nmax_preemptions = 4\n"
             "[class chat]\npriority = 10\nlatency_sensitive = yes\n%s[class api]\npriority = "
             "5\n%s[class batch]\n%s"
             "[tenant t0]\n[tenant t1]\nweight = 2\n[tenant t2]\n[tenant t3]\nweight = "
             "0.5\n[tenant t4]\n"
             "[tenant t5]\n[tenant t6]\nweight = 3\n[tenant t7]\n",
             running * 3, running, ord, ord, ord);
    sched_policy *p;
    sched_policy_error err;
    if (sched_policy_parse(pol, &p, &err)) {
        fprintf(stderr, "policy line %d: %s\n", err.line, err.reason);
        return 1;
    }
    sched_config c = {
        .kv_blocks_device = running * 48 + 1024 + (prefix_on ? PX_BLOCKS : 0),
        .prefix_cache = prefix_on,
        .kv_blocks_host = running * 16,
        .block_size = 16,
        .kv_bytes_per_token = 131072,
        .max_context = 8192,
        .step.base_us = 5000,
        .step.prefill_token_us = 20,
        .step.decode_seq_us = 30,
        .step.context_token_us = 0.01,
        .host = {.out_bytes_per_s = 2e10, .in_bytes_per_s = 2e10, .latency_us = 10},
    };
    sched *s;
    if (sched_create(p, &c, sink, NULL, 1, &s)) {
        fprintf(stderr, "create: %s\n", sched_last_error());
        return 1;
    }
    uint64_t now = 0;
    if (prefix_on) {
        /* fill the cache: short requests (one output token) until 100,000 blocks are cached */
        sched_counts cc;
        sched_result one[1024];
        for (int iter = 0; iter < 200000; iter++) {
            sched_get_counts(s, &cc);
            if (cc.kv_cached[SCHED_POOL_DEVICE] >= PX_BLOCKS) break;
            while (cc.waiting < 64) {
                sched_request r = {.id = ++next_id,
                                   .tenant = (int32_t)rnd(8),
                                   .class_idx = 2,
                                   .prompt_len = 256,
                                   .max_new_tokens = 1,
                                   .arrival_us = now,
                                   .tokens = prompt_tok,
                                   .cache_salt = 99};
                for (uint32_t i = 0; i < 256; i++) prompt_tok[i] = (int32_t)(next_id * 7 + i * 3);
                sched_submit(s, &r, now, NULL);
                cc.waiting++;
            }
            const sched_plan *pl = sched_step(s, now);
            uint32_t n = 0;
            for (uint32_t i = 0; i < pl->n_entries && n < 1024; i++)
                one[n++] =
                    (sched_result){.req = pl->entries[i].req, .tokens = pl->entries[i].samples};
            now += 20000;
            sched_commit(s, one, n, now, 0);
        }
        sched_get_counts(s, &cc);
        out->cached = cc.kv_cached[SCHED_POOL_DEVICE];
    }
    for (uint32_t i = 0; i < running + waiting; i++) submit_one(s, now);

    sched_result *res = malloc(sizeof(sched_result) * (running + 1024));
    double *st = malloc(sizeof(double) * (size_t)steps),
           *ct = malloc(sizeof(double) * (size_t)steps);
    double *cpu = malloc(sizeof(double) * (size_t)steps);
    uint32_t *gen = calloc(1u << 22, sizeof(uint32_t));
    int warm = 0, measured = 0;
    sched_counts cn;
    for (int iter = 0; measured < steps && iter < steps * 50; iter++) {
        double c0 = cpu_ns();
        double t0 = now_ns();
        const sched_plan *pl = sched_step(s, now);
        double t1 = now_ns();
        double c1 = cpu_ns();
        if (!pl) {
            fprintf(stderr, "step: %s\n", sched_last_error());
            return 1;
        }
        for (uint32_t i = 0; i < pl->n_transfers; i++)
            sched_transfer_done(s, pl->transfers[i].id, now, 0, 0, 0);
        uint32_t nres = 0, finished = 0;
        for (uint32_t i = 0; i < pl->n_entries && nres < running + 1024; i++) {
            const sched_entry *e = &pl->entries[i];
            res[nres] = (sched_result){.req = e->req, .tokens = e->samples};
            if (e->samples) {
                uint32_t *g = &gen[e->req % (1u << 22)];
                if (++*g >= target_out[e->req % (1u << 22)]) {
                    res[nres].finished = SCHED_FINISH_STOP;
                    finished++;
                    *g = 0;
                }
            }
            nres++;
        }
        now += 20000;
        double t2 = now_ns();
        sched_commit(s, res, nres, now, 0);
        double t3 = now_ns();
        /* keep the waiting queue at its size: one arrival per departure */
        for (uint32_t i = 0; i < finished; i++) submit_one(s, now);
        sched_get_counts(s, &cn);
        if (!warm) {
            if (cn.running + cn.in_transit >= running * 95 / 100) warm = 1;
            continue;
        }
        st[measured] = (t1 - t0) / 1e3;
        ct[measured] = (t3 - t2) / 1e3;
        cpu[measured] = (c1 - c0) / 1e3;
        measured++;
    }
    if (!measured) {
        fprintf(stderr, "never reached steady state (running %u)\n", cn.running);
        return 1;
    }
    qsort(st, (size_t)measured, sizeof(double), cmp_d);
    qsort(ct, (size_t)measured, sizeof(double), cmp_d);
    qsort(cpu, (size_t)measured, sizeof(double), cmp_d);
    *out = (result){running,
                    waiting,
                    st[measured / 2],
                    st[(size_t)(measured * 0.99)],
                    ct[measured / 2],
                    cpu[measured / 2],
                    cpu[(size_t)(measured * 0.99)],
                    cn.running,
                    cn.waiting,
                    out->cached};
    free(res);
    free(st);
    free(ct);
    free(cpu);
    free(gen);
    sched_destroy(s);
    sched_policy_free(p);
    return 0;
}


/* ---- the prefix index ------------------------------------------------------------------- */


typedef struct px_owner {
    uint32_t *free_ids;
    uint32_t n_free;
} px_owner;
static bool px_take(void *ctx, sched_pool p, uint32_t *b)
{
    px_owner *o = ctx;
    if (p != SCHED_POOL_DEVICE || !o->n_free) return false;
    *b = o->free_ids[--o->n_free];
    return true;
}
static void px_evicted(void *ctx, const sched_prefix_eviction *ev)
{
    px_owner *o = ctx;
    o->free_ids[o->n_free++] = ev->from_block;
}

/* prompt u: system prompt u % PX_NSYS, then user tokens of u */
static void px_prompt(uint32_t u, int32_t *tok)
{
    for (uint32_t i = 0; i < PX_PROMPT * PX_BS; i++)
        tok[i] =
            i < PX_SYS * PX_BS ? (int32_t)((u % PX_NSYS) * 7919 + i) : (int32_t)(u * 131 + i * 7);
}

/* Run prompt u through the index like the scheduler would: lookup, acquire, evict and insert
 * what is missing, release.  Returns blocks matched. */
static uint32_t px_run(sched_prefix *ix, px_owner *o, uint32_t u, const int32_t *tok,
                       const sched_prefix_key *k)
{
    uint32_t nodes[PX_PROMPT];
    uint32_t m = sched_prefix_lookup(ix, 1, k, tok, PX_PROMPT, u, nodes, NULL);
    sched_prefix_acquire(ix, nodes, m, u);
    for (uint32_t i = m; i < PX_PROMPT; i++) {
        uint32_t b = 0;
        if (!px_take(o, SCHED_POOL_DEVICE, &b) &&
            (!sched_prefix_evict(ix, SCHED_POOL_DEVICE, 1) || !px_take(o, SCHED_POOL_DEVICE, &b))) {
            fprintf(stderr, "prefix: device pool exhausted\n");
            exit(1);
        }
        if (sched_prefix_insert(ix, i ? nodes[i - 1] : SCHED_PREFIX_NONE, 1, k[i], tok + i * PX_BS,
                                0, u, SCHED_POOL_DEVICE, b, &nodes[i]) == -EEXIST)
            o->free_ids[o->n_free++] = b;
    }
    sched_prefix_release(ix, nodes, PX_PROMPT);
    return m;
}

typedef struct px_result {
    double lookup_p50, lookup_p99, miss_p50, churn_p50, churn_p99, keys_p50;
    uint32_t cached;
} px_result;

static int run_prefix(int reps, px_result *out)
{
    px_owner o = {malloc(PX_BLOCKS * sizeof(uint32_t)), 0};
    for (uint32_t b = PX_BLOCKS; b-- > 0;) o.free_ids[o.n_free++] = b;
    sched_prefix_cfg cfg = {.block_size = PX_BS,
                            .pool_blocks = {PX_BLOCKS, 0, 0},
                            .n_tenants = 1,
                            .costs = {.recompute_us_per_block = 320, .reuse_prior = 1},
                            .ops = {.take_block = px_take, .evicted = px_evicted, .ctx = &o}};
    sched_prefix *ix;
    if (sched_prefix_create(&cfg, &ix)) {
        fprintf(stderr, "prefix: %s\n", sched_last_error());
        return 1;
    }
    int32_t tok[PX_PROMPT * PX_BS];
    sched_prefix_key k[PX_PROMPT];
    /* fill: every block of the pool cached, unheld */
    uint32_t u = 0;
    sched_prefix_stats st;
    do {
        px_prompt(u, tok);
        sched_prefix_keys(1, tok, PX_PROMPT * PX_BS, PX_BS, k, PX_PROMPT);
        px_run(ix, &o, u++, tok, k);
        sched_prefix_get_stats(ix, &st);
    } while (st.evicted[SCHED_PREFIX_EVICT_DEMAND] == 0);
    uint32_t newest = u; /* prompts [u - ~4000, u) are cached */
    double *lt = malloc(sizeof(double) * (size_t)reps), *mt = malloc(sizeof(double) * (size_t)reps);
    double *ct = malloc(sizeof(double) * (size_t)reps), *kt = malloc(sizeof(double) * (size_t)reps);
    uint32_t nodes[PX_PROMPT];
    for (int r = 0; r < reps; r++) {
        /* a cached prompt: lookup + acquire + release (the hit path) */
        uint32_t v = newest - 1 - rnd(2000);
        px_prompt(v, tok);
        sched_prefix_keys(1, tok, PX_PROMPT * PX_BS, PX_BS, k, PX_PROMPT);
        double t0 = now_ns();
        uint32_t m = sched_prefix_lookup(ix, 1, k, tok, PX_PROMPT, 0, nodes, NULL);
        sched_prefix_acquire(ix, nodes, m, 0);
        sched_prefix_release(ix, nodes, m);
        double t1 = now_ns();
        if (m != PX_PROMPT) {
            fprintf(stderr, "prefix: prompt %u matched %u blocks\n", v, m);
            return 1;
        }
        lt[r] = (t1 - t0) / 1e3;
        /* a miss (first block unknown) */
        tok[0] = -1 - r;
        sched_prefix_keys(1, tok, PX_PROMPT * PX_BS, PX_BS, k, PX_PROMPT);
        t0 = now_ns();
        m = sched_prefix_lookup(ix, 1, k, tok, PX_PROMPT, 0, nodes, NULL);
        t1 = now_ns();
        mt[r] = (t1 - t0) / 1e3;
        /* a new prompt sharing a system prompt: 24 blocks evicted and inserted */
        px_prompt(u, tok);
        t0 = now_ns();
        sched_prefix_keys(1, tok, PX_PROMPT * PX_BS, PX_BS, k, PX_PROMPT);
        double t2 = now_ns();
        m = px_run(ix, &o, u++, tok, k);
        double t3 = now_ns();
        kt[r] = (t2 - t0) / 1e3;
        ct[r] = (t3 - t2) / 1e3;
        newest = u;
    }
    char why[256];
    if (sched_prefix_check(ix, why, sizeof why)) {
        fprintf(stderr, "prefix: %s\n", why);
        return 1;
    }
    sched_prefix_get_stats(ix, &st);
    qsort(lt, (size_t)reps, sizeof(double), cmp_d);
    qsort(mt, (size_t)reps, sizeof(double), cmp_d);
    qsort(ct, (size_t)reps, sizeof(double), cmp_d);
    qsort(kt, (size_t)reps, sizeof(double), cmp_d);
    *out = (px_result){lt[reps / 2],
                       lt[(size_t)(reps * 0.99)],
                       mt[reps / 2],
                       ct[reps / 2],
                       ct[(size_t)(reps * 0.99)],
                       kt[reps / 2],
                       st.cached[SCHED_POOL_DEVICE]};
    free(lt);
    free(mt);
    free(ct);
    free(kt);
    free(o.free_ids);
    sched_prefix_destroy(ix);
    return 0;
}

int main(int argc, char **argv)
{
    int json = 0, steps = 2000, prefix_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prefix-only"))
            prefix_only = 1;
        else {
            fprintf(stderr, "usage: %s [--json] [--steps N] [--prefix-only]\n", argv[0]);
            return 2;
        }
    }
    if (steps < 10) steps = 10;
    target_out = calloc(1u << 22, sizeof(uint32_t));
    px_result px;
    if (run_prefix(steps, &px)) return 1;
    /* sched_step at 256 running / 10,000 waiting with the cache on and 100,000 cached blocks */
    result rp;
    rng = 0x9E3779B97F4A7C15ull + 100;
    next_id = 0;
    prefix_on = 1;
    if (run_size(256, 10000, steps, &rp)) return 1;
    result rl = rp; /* the same with longest_prefix order (--prefix-only) */
    if (prefix_only) {
        rng = 0x9E3779B97F4A7C15ull + 100;
        next_id = 0;
        order_longest = 1;
        if (run_size(256, 10000, steps, &rl)) return 1;
        order_longest = 0;
    }
    prefix_on = 0;
    if (prefix_only) {
        result roff; /* the same size with the cache off, side by side */
        rng = 0x9E3779B97F4A7C15ull + 100;
        next_id = 0;
        if (run_size(256, 10000, steps, &roff)) return 1;
        if (json)
            printf(
                "{\"bench\":\"sched_prefix\",\"index_blocks\":%u,\"prefix_lookup_us\":{\"p50\":%."
                "3f,\"p99\":%.3f},"
                "\"prefix_miss_us\":{\"p50\":%.3f},\"prefix_churn_us\":{\"p50\":%.3f,\"p99\":%.3f},"
                "\"prefix_keys_us\":{\"p50\":%.3f},\"step_us\":{\"p50\":%.3f,\"p99\":%.3f},"
                "\"step_running\":%u,\"step_waiting\":%u,\"step_cached_blocks\":%u,\"step_off_us\":"
                "{\"p50\":%.3f},"
                "\"step_on_off_ratio\":%.3f,\"step_longest_prefix_us\":{\"p50\":%.3f,\"p99\":%.3f},"
                "\"step_longest_prefix_running\":%u,\"step_longest_prefix_waiting\":%u,"
                "\"step_longest_over_fcfs\":%.3f}\n",
                px.cached, px.lookup_p50, px.lookup_p99, px.miss_p50, px.churn_p50, px.churn_p99,
                px.keys_p50, rp.p50, rp.p99, rp.real_running, rp.real_waiting, rp.cached, roff.p50,
                rp.p50 / roff.p50, rl.p50, rl.p99, rl.real_running, rl.real_waiting,
                rl.p50 / rp.p50);
        else
            printf("prefix index, %u cached blocks of %u tokens, %d reps, 512-token prompts (32 "
                   "blocks):\n"
                   "  hit  (lookup+acquire+release, 32 blocks)  p50 %.2f us  p99 %.2f us\n"
                   "  miss (lookup)                             p50 %.2f us\n"
                   "  new prompt (8 shared, 24 evicted+inserted) p50 %.2f us  p99 %.2f us\n"
                   "  XXH3-128 keys of 512 tokens               p50 %.2f us\n"
                   "sched_step, cache on, %u cached blocks at the start, steady %u running / %u "
                   "waiting:\n"
                   "  p50 %.2f us  p99 %.2f us  (goal: p50 <= 20 us at 256/10,000 with a "
                   "100,000-block index)\n"
                   "  cache off, same size: p50 %.2f us  (on/off %.2f)\n"
                   "  cache on, prefix_order = longest_prefix, steady %u running / %u waiting: p50 "
                   "%.2f us  p99 %.2f us"
                   "  (longest/fcfs %.2f)\n",
                   px.cached, PX_BS, steps, px.lookup_p50, px.lookup_p99, px.miss_p50, px.churn_p50,
                   px.churn_p99, px.keys_p50, rp.cached, rp.real_running, rp.real_waiting, rp.p50,
                   rp.p99, roff.p50, rp.p50 / roff.p50, rl.real_running, rl.real_waiting, rl.p50,
                   rl.p99, rl.p50 / rp.p50);
        return 0;
    }
    static const uint32_t sizes[][2] = {
        {256, 1000},    {256, 10000},  {256, 100000},  {1024, 10000},
        {1024, 100000}, {4096, 10000}, {4096, 100000},
    };
    const int n = sizeof(sizes) / sizeof(sizes[0]);
    result r[16];
    for (int i = 0; i < n; i++) {
        rng = 0x9E3779B97F4A7C15ull + (uint64_t)i;
        next_id = 0;
        int st = sizes[i][0] >= 4096 ? steps / 4 : steps;
        if (run_size(sizes[i][0], sizes[i][1], st, &r[i])) return 1;
    }
    const result *base = &r[0], *key = &r[1];
    if (!json) {
        printf("sched_step cost, steady state (8 tenants, 3 classes; %d steps per size, "
               "4096-running sizes %d)\n",
               steps, steps / 4);
        printf("%8s %8s | %9s %9s | %9s %9s | %8s %8s | %10s | %s\n", "running", "waiting",
               "p50_us", "p99_us", "cpu_p50", "cpu_p99", "p50/base", "cpu99/b", "commit_p50",
               "steady state (running/waiting)");
        for (int i = 0; i < n; i++)
            printf("%8u %8u | %9.2f %9.2f | %9.2f %9.2f | %8.2f %8.2f | %10.2f | %u/%u\n",
                   r[i].running, r[i].waiting, r[i].p50, r[i].p99, r[i].cpu_p50, r[i].cpu_p99,
                   r[i].p50 / base->p50, r[i].cpu_p99 / base->cpu_p99, r[i].commit_p50,
                   r[i].real_running, r[i].real_waiting);
        printf(
            "baseline = %u running / %u waiting; goal: p50 <= 20 us at 256/10000 (measured %.2f)\n",
            base->running, base->waiting, key->p50);
        printf("waiting ×100 at 256 running (1,000 → 100,000): p50 ×%.2f\n", r[2].p50 / r[0].p50);
        printf("prefix index (%u blocks): hit lookup p50 %.2f us, miss p50 %.2f us, new prompt p50 "
               "%.2f us\n",
               px.cached, px.lookup_p50, px.miss_p50, px.churn_p50);
        printf("cache on, 256/10000, %u cached blocks at the start: step p50 %.2f us p99 %.2f us "
               "(goal p50 <= 20)\n",
               rp.cached, rp.p50, rp.p99);
        return 0;
    }
    printf("{\"bench\":\"sched_step\",\"running\":%u,\"waiting\":%u,\"step_us\":{\"p50\":%.3f,"
           "\"p99\":%.3f},"
           "\"step_cpu_us\":{\"p50\":%.3f,\"p99\":%.3f},\"commit_us\":{\"p50\":%.3f},\"sizes\":[",
           key->running, key->waiting, key->p50, key->p99, key->cpu_p50, key->cpu_p99,
           key->commit_p50);
    for (int i = 0; i < n; i++)
        printf(
            "%s{\"running\":%u,\"waiting\":%u,\"p50_us\":%.3f,\"p99_us\":%.3f,\"cpu_p99_us\":%.3f,"
            "\"p50_ratio\":%.3f}",
            i ? "," : "", r[i].running, r[i].waiting, r[i].p50, r[i].p99, r[i].cpu_p99,
            r[i].p50 / base->p50);
    printf("],\"baseline\":{\"running\":%u,\"waiting\":%u},\"prefix\":{\"index_blocks\":%u,"
           "\"lookup_us\":{\"p50\":%.3f,\"p99\":%.3f},\"miss_us\":{\"p50\":%.3f},\"churn_us\":{"
           "\"p50\":%.3f},"
           "\"step_us\":{\"p50\":%.3f,\"p99\":%.3f},\"step_cached_blocks\":%u}}\n",
           base->running, base->waiting, px.cached, px.lookup_p50, px.lookup_p99, px.miss_p50,
           px.churn_p50, rp.p50, rp.p99, rp.cached);
    return 0;
}
