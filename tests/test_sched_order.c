/* SPDX-License-Identifier: MIT */
/* prefix_order = longest_prefix (sched/order.c, DESIGN §10): the waiting request with the
 * longest cached prefix goes first within its class and tenant, aging bounds every wait, the
 * decisions are deterministic, and the policy keys refuse bad values with a clear error.
 * Real sched_step / sched_commit runs; the scheduler's invariants — which include every
 * waiting request's cached-prefix length against a fresh lookup of the index — are checked
 * after every call. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/event_json.h"
#include "sched/sched.h"
#include "sched/sched_testing.h"
#include "tests/sched_drive_util.h"

#define MAXE 40000

typedef struct drv {
    sched *s;
    sched_policy *p;
    uint64_t now;
    uint64_t started[MAXE]; /* request ids in the order they were first scheduled */
    uint64_t wait_us[MAXE]; /* by id: its wait when first scheduled */
    uint32_t n_started;
    char *log;
    size_t log_len, log_cap; /* every event as a JSON line */
} drv;
static drv D;

static void sink(void *ctx, const sched_event *e)
{
    (void)ctx;
    if (e->kind == SCHED_EV_SCHEDULE && e->outcome == SCHED_OUTCOME_START && D.n_started < MAXE) {
        D.started[D.n_started++] = e->req;
        if (e->req < MAXE) D.wait_us[e->req] = e->wait_us;
    }
    char line[512];
    int w = event_json(e, line, sizeof line);
    cr_assert_geq(w, 0);
    size_t n = (size_t)w;
    if (D.log_len + n + 2 > D.log_cap) {
        D.log_cap = (D.log_cap + n + 2) * 2;
        D.log = realloc(D.log, D.log_cap);
        cr_assert_not_null(D.log);
    }
    memcpy(D.log + D.log_len, line, n);
    D.log_len += n;
    D.log[D.log_len++] = '\n';
    D.log[D.log_len] = 0;
}

static void check(void)
{
    sd_check(D.s);
}

/* One class "c" with the given order keys; tenants a and b; 4-token blocks; one sequence at a
 * time unless max_active says otherwise, so the order requests start in is the order picked. */
static void init_tiers(const char *class_keys, uint32_t max_active, uint32_t dev_blocks,
                       uint32_t host_blocks)
{
    free(D.log);
    memset(&D, 0, sizeof D);
    char pol[1024];
    snprintf(pol, sizeof pol,
             "[scheduler]\ntoken_budget = 64\nprefill_chunk = 64\nmax_active_seqs = "
             "%u\nmax_preemptions = 0\n"
             "[class c]\n%s\n[tenant a]\n[tenant b]\n",
             max_active, class_keys);
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(pol, &D.p, &err), 0, "policy line %d: %s", err.line,
                 err.reason);
    sched_config c = {.kv_blocks_device = dev_blocks,
                      .block_size = 4,
                      .kv_bytes_per_token = 64,
                      .max_context = 512,
                      .step.base_us = 100,
                      .step.prefill_token_us = 1,
                      .step.decode_seq_us = 1,
                      .prefix_cache = true,
                      .kv_blocks_host = host_blocks,
                      .host = {.out_bytes_per_s = 1e9, .in_bytes_per_s = 1e9, .latency_us = 1}};
    cr_assert_eq(sched_create(D.p, &c, sink, NULL, 1, &D.s), 0, "%s", sched_last_error());
}

static void init(const char *class_keys, uint32_t max_active, uint32_t dev_blocks)
{
    init_tiers(class_keys, max_active, dev_blocks, 0);
}

static void fini(void)
{
    sched_destroy(D.s);
    sched_policy_free(D.p);
    free(D.log);
    memset(&D, 0, sizeof D);
}

static void submit(uint64_t id, int tenant, const int32_t *tok, uint32_t n, uint32_t max_new)
{
    sched_request q = {.id = id,
                       .tenant = tenant,
                       .class_idx = -1,
                       .prompt_len = n,
                       .max_new_tokens = max_new,
                       .arrival_us = D.now,
                       .tokens = tok,
                       .cache_salt = 7};
    cr_assert_eq(sched_submit(D.s, &q, D.now, NULL), 0, "submit %llu: %s", (unsigned long long)id,
                 sched_last_error());
    check();
}

/* step, execute every entry (a token per sampling entry), commit; 1 ms per iteration */
static void iter(void)
{
    sd_iter(D.s, &D.now, NULL);
}

static void run_until_idle(int max_iters)
{
    sched_counts c;
    for (int i = 0; i < max_iters; i++) {
        iter();
        sched_get_counts(D.s, &c);
        if (!c.waiting && !c.running) return;
    }
    cr_assert_fail("not idle after %d iterations (waiting %u running %u)", max_iters, c.waiting,
                   c.running);
}

static uint32_t start_pos(uint64_t id)
{
    for (uint32_t i = 0; i < D.n_started; i++)
        if (D.started[i] == id) return i;
    return UINT32_MAX;
}

/* A warm cache (P's 24 tokens = 6 blocks), a blocker holding the only slot, then three requests
 * queued oldest first: X shares nothing, Y P's first 2 blocks, Z P's first 5. */
static void three_queued(void)
{
    static int32_t p[24], x[24], y[24], z[24], b[8];
    for (int i = 0; i < 24; i++) p[i] = y[i] = z[i] = 100 + i, x[i] = 1000 + i;
    y[8] = 1;
    z[20] = 2;
    for (int i = 0; i < 8; i++) b[i] = 5000 + i;
    submit(1, 0, p, 24, 1);
    run_until_idle(50);
    submit(2, 0, b, 8, 6); /* the blocker: decodes for a few steps */
    iter();
    submit(3, 0, x, 24, 1);
    D.now += 10;
    submit(4, 0, y, 24, 1);
    D.now += 10;
    submit(5, 0, z, 24, 1);
    run_until_idle(100);
}

Test(sched_order, longest_prefix_takes_the_request_with_the_longest_cached_prefix_first)
{
    init("prefix_order = longest_prefix\nprefix_max_wait = 10s", 1, 256);
    three_queued();
    cr_assert_eq(D.n_started, 5);
    /* P, the blocker, then Z (5 blocks cached), Y (2), X (none) — the reverse of arrival */
    uint64_t want[] = {1, 2, 5, 4, 3};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(D.started[i], want[i], "start #%d: request %llu, want %llu", i,
                     (unsigned long long)D.started[i], (unsigned long long)want[i]);
    cr_assert(strstr(D.log, "\"ev\":\"cache_hit\",\"req\":5"), "Z found its prefix");
    fini();
}

Test(sched_order, fcfs_order_takes_them_by_arrival)
{
    init("prefix_order = fcfs", 1, 256);
    three_queued();
    uint64_t want[] = {1, 2, 3, 4, 5};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(D.started[i], want[i], "start #%d: request %llu", i,
                     (unsigned long long)D.started[i]);
    fini();
}

/* A request with no cached prefix, then a stream of cache-hitting requests arriving faster than
 * they are served (two per step, one served per step): without aging it would wait for the
 * whole stream.  With prefix_max_wait = 20 ms it starts at the first step after 20 ms. */
Test(sched_order, aging_bounds_the_wait_of_a_request_with_no_cached_prefix)
{
    const uint64_t bound = 20000;
    init("prefix_order = longest_prefix\nprefix_max_wait = 20ms", 1, 1024);
    static int32_t p[24], n_tok[24], h[200][24];
    for (int i = 0; i < 24; i++) p[i] = 100 + i, n_tok[i] = 3000 + i;
    submit(1, 0, p, 24, 1);
    run_until_idle(50);
    submit(2, 0, n_tok, 24, 1); /* shares nothing */
    uint64_t id = 10;
    for (int k = 0; k < 90; k++) {
        for (int j = 0; j < 2; j++, id++) {
            memcpy(h[id - 10], p, sizeof p);
            h[id - 10][23] = (int32_t)(7000 + id); /* 5 blocks cached, its own last token */
            submit(id, 0, h[id - 10], 24, 1);
        }
        iter();
    }
    uint32_t pos = start_pos(2);
    cr_assert_neq(pos, UINT32_MAX, "the request with no cached prefix never started");
    uint64_t waited = D.wait_us[2];
    /* it was passed over while it was young (the order is in force) ... */
    cr_assert_geq(waited, bound,
                  "started after %llu us, before its bound: passed over for nothing?",
                  (unsigned long long)waited);
    /* ... and started within one step of its bound, at any queue length */
    cr_assert_leq(waited, bound + 1000, "waited %llu us, bound %llu us", (unsigned long long)waited,
                  (unsigned long long)bound);
    sched_counts c;
    sched_get_counts(D.s, &c);
    cr_assert_gt(c.waiting, 50, "the stream kept a queue of cache-hitting requests (%u)",
                 c.waiting);
    cr_assert_lt(pos, D.n_started - 1, "it started while hitting requests still waited");
    fini();
}

/* Mixed random traffic in two tenants, a device pool small enough that cached blocks are
 * evicted while waiting requests count them, cancels: every invariant holds after every call
 * (each waiting request's counted prefix equals a fresh lookup), and two runs of the same
 * inputs give the same decisions, byte for byte. */
static uint64_t rng;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static char *random_run_tiers(const char *keys, uint32_t host_blocks)
{
    init_tiers(keys, 4, 96, host_blocks);
    rng = 0x1234567;
    static int32_t tok[64];
    uint64_t id = 1;
    for (int k = 0; k < 400; k++) {
        for (uint32_t j = rnd(3); j-- > 0; id++) {
            uint32_t sys = rnd(4), n = 9 + rnd(40);
            for (uint32_t i = 0; i < n; i++)
                tok[i] = i < 16 ? (int32_t)(sys * 100 + i) : (int32_t)(rnd(3) * 1000 + i);
            sched_request q = {.id = id,
                               .tenant = (int32_t)rnd(2),
                               .class_idx = -1,
                               .prompt_len = n,
                               .max_new_tokens = 1 + rnd(6),
                               .arrival_us = D.now,
                               .tokens = tok,
                               .cache_salt = 1 + rnd(2)};
            sched_submit(D.s, &q, D.now, NULL);
            check();
        }
        if (id > 5 && !rnd(10)) {
            sched_cancel(D.s, id - 1 - rnd(5), D.now, SCHED_CANCEL_CLIENT);
            check();
        }
        iter();
    }
    run_until_idle(2000);
    char *log = strdup(D.log);
    fini();
    return log;
}

static char *random_run(const char *keys)
{
    return random_run_tiers(keys, 0);
}

/* the order requests first started in, from a decision log */
static char *start_order(const char *log)
{
    size_t cap = 1 << 16, n = 0;
    char *out = calloc(1, cap);
    for (const char *l = strstr(log, "\"ev\":\"schedule\""); l;
         l = strstr(l + 1, "\"ev\":\"schedule\"")) {
        unsigned long long id;
        const char *e = strchr(l, '\n');
        const char *st = strstr(l, "\"reason\":\"start\"");
        if (!st || (e && st > e) || sscanf(l, "\"ev\":\"schedule\",\"req\":%llu", &id) != 1)
            continue;
        n += (size_t)snprintf(out + n, cap - n, "%llu ", id);
        cr_assert_lt(n, cap);
    }
    return out;
}

Test(sched_order, random_traffic_keeps_the_counted_prefixes_exact_and_runs_are_deterministic)
{
    char *a = random_run("prefix_order = longest_prefix\nprefix_max_wait = 30ms");
    char *b = random_run("prefix_order = longest_prefix\nprefix_max_wait = 30ms");
    cr_assert_str_eq(a, b, "the same inputs gave different decisions");
    cr_assert(strstr(a, "\"ev\":\"cache_hit\""), "no request found a cached prefix");
    cr_assert(strstr(a, "\"ev\":\"cache_evict\""), "no cached block was evicted");
    char *f = random_run("prefix_order = fcfs");
    char *oa = start_order(a), *of = start_order(f);
    cr_assert_gt(strlen(oa), 100);
    cr_assert_str_neq(oa, of, "longest_prefix started requests in exactly fcfs's order");
    free(oa);
    free(of);
    free(a);
    free(b);
    free(f);
}

/* ---- the policy keys --------------------------------------------------------------------- */

static void refused(const char *text, int line, const char *needle)
{
    sched_policy *p = NULL;
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(text, &p, &err), -EINVAL, "accepted:\n%s", text);
    cr_assert_null(p);
    cr_assert_eq(err.line, line, "line %d (%s), want %d", err.line, err.reason, line);
    cr_assert(strstr(err.reason, needle), "reason \"%s\" does not say \"%s\"", err.reason, needle);
}

static sched_policy *parsed(const char *text)
{
    sched_policy *p = NULL;
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(text, &p, &err), 0, "line %d: %s", err.line, err.reason);
    return p;
}

Test(sched_order_policy, bad_values_are_refused_with_the_line_and_the_reason)
{
    refused("[class c]\nprefix_order = shortest\n", 2,
            "expected fcfs|longest_prefix, got \"shortest\"");
    refused("[class c]\nprefix_order = longest_prefix\nprefix_max_wait = 0\n", 3, "must be > 0");
    refused("[class c]\nprefix_order = longest_prefix\nprefix_max_wait = soon\n", 3,
            "expected a duration");
    refused("[class c]\nmax_queue_wait = 2s\nprefix_order = longest_prefix\nprefix_max_wait = 2s\n",
            4, "must be below max_queue_wait");
    refused("[scheduler]\nmode = continuous\n[class c]\nprefix_order = longest_prefix\n", 4,
            "needs mode = token_budget");
    refused("[class c]\nprefix_order = fcfs\nprefix_order = fcfs\n", 3, "given twice");
    refused("[scheduler]\nprefix_order = longest_prefix\n", 2,
            "unknown key \"prefix_order\" in [scheduler]");
}

/* The constant block key (a test-only key function, sched_testing.h) names no block: the order,
 * which follows waiting requests by key alone, would count any block inserted as every
 * waiter's next one (its invariant check failed in 4 of these tests under it) — the scheduler
 * refuses the pair, takes the constant key with fcfs classes, and takes it only before the
 * first request. */
Test(sched_order_policy, the_constant_key_is_refused_beside_a_longest_prefix_class)
{
    sched_policy *p;
    sched_policy_error err;
    cr_assert_eq(
        sched_policy_parse("[scheduler]\n[class c]\nprefix_order = longest_prefix\n", &p, &err), 0,
        "line %d: %s", err.line, err.reason);
    sched_config c = {.kv_blocks_device = 16,
                      .block_size = 4,
                      .kv_bytes_per_token = 64,
                      .max_context = 512,
                      .step.prefill_token_us = 1,
                      .prefix_cache = true};
    sched *s = NULL;
    cr_assert_eq(sched_create(p, &c, NULL, NULL, 1, &s), 0, "%s", sched_last_error());
    cr_assert_eq(sched_testing_set_prefix_key(s, SCHED_PREFIX_KEY_CONSTANT), -EINVAL);
    cr_assert(strstr(sched_last_error(), "prefix_key") &&
                  strstr(sched_last_error(), "longest_prefix"),
              "%s", sched_last_error());
    cr_assert_eq(sched_testing_set_prefix_key(s, SCHED_PREFIX_KEY_XXH3), 0, "%s",
                 sched_last_error());
    cr_assert_eq(sched_testing_set_prefix_key(s, SCHED_PREFIX_KEY__COUNT), -EINVAL);
    sched_destroy(s);
    sched_policy_free(p);
    cr_assert_eq(sched_policy_parse("[scheduler]\n[class c]\nprefix_order = fcfs\n", &p, &err), 0);
    cr_assert_eq(sched_create(p, &c, NULL, NULL, 1, &s), 0, "%s", sched_last_error());
    cr_assert_eq(sched_testing_set_prefix_key(s, SCHED_PREFIX_KEY_CONSTANT), 0, "%s",
                 sched_last_error());
    sched_request q = {.id = 1, .prompt_len = 4, .max_new_tokens = 4};
    int32_t toks[4] = {1, 2, 3, 4};
    q.tokens = toks;
    sched_reject_reason why;
    cr_assert_eq(sched_submit(s, &q, 0, &why), 0, "%s", sched_last_error());
    cr_assert_eq(sched_testing_set_prefix_key(s, SCHED_PREFIX_KEY_XXH3), -EBUSY,
                 "the key function changed under a cached request");
    sched_destroy(s);
    sched_policy_free(p);
}

Test(sched_order_policy, defaults_canonical_form_and_round_trip)
{
    sched_policy *p =
        parsed("[class a]\nprefix_order = longest_prefix\n[class b]\nmax_queue_wait = 600ms\n"
               "prefix_order = longest_prefix\n[class c]\n");
    const sched_class_cfg *a = sched_policy_class(p, 0), *b = sched_policy_class(p, 1),
                          *c = sched_policy_class(p, 2);
    cr_assert_eq(a->prefix_order, SCHED_PREFIX_ORDER_LONGEST);
    cr_assert_eq(a->prefix_max_wait_us, 1000000, "default bound 1 s, got %llu",
                 (unsigned long long)a->prefix_max_wait_us);
    cr_assert_eq(b->prefix_max_wait_us, 300000, "half of a shorter max_queue_wait, got %llu",
                 (unsigned long long)b->prefix_max_wait_us);
    cr_assert_eq(c->prefix_order, SCHED_PREFIX_ORDER_FCFS, "fcfs by default");
    const char *canon = sched_policy_canonical(p);
    cr_assert(strstr(canon, "[class a]\n") &&
                  strstr(canon, "prefix_order = longest_prefix\nprefix_max_wait = 1000000us\n"),
              "%s", canon);
    cr_assert(strstr(canon, "prefix_order = fcfs\n"), "%s", canon);
    sched_policy *q = parsed(canon);
    cr_assert_str_eq(sched_policy_canonical(q), canon);
    cr_assert_eq(sched_policy_hash(q), sched_policy_hash(p));
    sched_policy *r = parsed("[class c]\nprefix_order = longest_prefix\nprefix_max_wait = 250ms\n");
    cr_assert_eq(sched_policy_class(r, 0)->prefix_max_wait_us, 250000);
    sched_policy *f = parsed("[class c]\nprefix_order = fcfs\n");
    cr_assert_neq(sched_policy_hash(r), sched_policy_hash(f),
                  "the order is part of the policy's identity");
    sched_policy_free(f);
    sched_policy_free(p);
    sched_policy_free(q);
    sched_policy_free(r);
}

/* The same with a host tier: evicted device blocks are demoted (still cached: the counted
 * prefixes keep them), reloaded or dropped from the host (the counted prefixes shrink). */
Test(sched_order, counted_prefixes_stay_exact_across_demotion_reload_and_drops_from_the_host)
{
    char *a = random_run_tiers("prefix_order = longest_prefix\nprefix_max_wait = 30ms", 24);
    char *b = random_run_tiers("prefix_order = longest_prefix\nprefix_max_wait = 30ms", 24);
    cr_assert_str_eq(a, b, "the same inputs gave different decisions");
    cr_assert(strstr(a, "\"ev\":\"cache_demote\""), "no block was demoted to the host");
    int host_drops = 0, reloads = 0;
    for (const char *l = a; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
#define HAS(lit) memmem(l, n, lit, sizeof(lit) - 1)
        if (HAS("\"ev\":\"cache_evict\"") && HAS("\"pool\":\"host\"")) host_drops++;
        if (HAS("\"ev\":\"cache_reload\"")) reloads++;
#undef HAS
    }
    cr_log_info("host tier: %d cache_evict events from the host, %d cache_reload", host_drops,
                reloads);
    cr_assert_gt(host_drops, 0, "nothing was dropped from the host");
    free(a);
    free(b);
}
