/* SPDX-License-Identifier: MIT */
/*
 * sched_harness.h — a deterministic service model for the scheduler tests (header only, so it
 * is not linked into every test program).  Step time = a + b × tokens in the batch; swap
 * transfers complete after bytes / bandwidth; every request generates a fixed number of
 * tokens then stops.  The block-accounting invariant is checked after every step and every
 * commit; a violation fails the test with the scheduler's own description.
 */
#ifndef RINGLM_TESTS_SCHED_HARNESS_H
#define RINGLM_TESTS_SCHED_HARNESS_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"
#include "tests/event_json.h"

#define H_MAX_REQ 20000

typedef struct h_req {
    uint64_t arrival, first_token, finish, cancel_at;
    uint32_t prompt, out_len, generated;
    int tenant, cls;
    int submitted; /* 0 not yet, 1 admitted, -1 rejected */
    int ended;     /* finished / cancelled / timed out */
    int end_kind;  /* sched_event_kind */
    sched_reject_reason reject;
} h_req;

typedef struct h_xfer {
    uint64_t id, done_at, bytes, dur;
} h_xfer;

typedef struct harness {
    sched *s;
    sched_policy *p;
    uint64_t now;
    double a_us, b_us;      /* service model */
    double bw;              /* bytes/s for swaps (both ways) */
    h_req r[H_MAX_REQ + 1]; /* by id, 1-based */
    uint32_t n;             /* ids 1..n */
    uint32_t next_submit;   /* requests sorted by arrival: next to submit */
    h_xfer xf[4096];
    uint32_t n_xf;
    char *log;
    size_t log_len, log_cap;
    uint64_t ev_count[SCHED_EV__COUNT];
    uint64_t steps, busy_us;
    int check; /* check invariants every step */
} harness;

static __attribute__((unused)) void h_sink(void *ctx, const sched_event *ev)
{
    harness *h = ctx;
    char line[512];
    int w = event_json(ev, line, sizeof line);
    cr_assert(w >= 0, "event line truncated");
    size_t n = (size_t)w;
    if (h->log_len + n + 2 > h->log_cap) {
        h->log_cap = (h->log_cap + n + 2) * 2;
        h->log = realloc(h->log, h->log_cap);
        cr_assert(h->log);
    }
    memcpy(h->log + h->log_len, line, n);
    h->log_len += n;
    h->log[h->log_len++] = '\n';
    h->log[h->log_len] = 0;
    h->ev_count[ev->kind]++;
    if (ev->req && ev->req <= H_MAX_REQ) {
        h_req *q = &h->r[ev->req];
        if (ev->kind == SCHED_EV_FINISH || ev->kind == SCHED_EV_CANCEL ||
            ev->kind == SCHED_EV_TIMEOUT) {
            q->ended = 1;
            q->end_kind = ev->kind;
            q->finish = ev->t_us;
        }
    }
}

static __attribute__((unused)) sched_config h_default_config(void)
{
    sched_config c = {
        .kv_blocks_device = 4096,
        .kv_blocks_host = 8192,
        .kv_blocks_disk = 0,
        .block_size = 16,
        .kv_bytes_per_token = 1024,
        .max_context = 8192,
        .step.base_us = 1000,
        .step.prefill_token_us = 10,
        .step.decode_seq_us = 10,
        .step.context_token_us = 0,
        .host = {.out_bytes_per_s = 1e9, .in_bytes_per_s = 1e9, .latency_us = 10},
    };
    return c;
}

static __attribute__((unused)) void h_init(harness *h, const char *policy_text,
                                           const sched_config *cfg)
{
    memset(h, 0, sizeof(*h));
    sched_policy_error err;
    int rc = sched_policy_parse(policy_text, &h->p, &err);
    cr_assert_eq(rc, 0, "policy: line %d: %s", err.line, err.reason);
    sched_config c = cfg ? *cfg : h_default_config();
    h->a_us = c.step.base_us;
    h->b_us = c.step.prefill_token_us;
    h->bw = c.host.out_bytes_per_s;
    rc = sched_create(h->p, &c, h_sink, h, 42, &h->s);
    cr_assert_eq(rc, 0, "sched_create: %s", sched_last_error());
    h->check = 1;
}

static __attribute__((unused)) void h_fini(harness *h)
{
    sched_destroy(h->s);
    sched_policy_free(h->p);
    free(h->log);
}

/* A harness on the heap (it holds H_MAX_REQ requests: too big for a test's stack). */
static __attribute__((unused)) harness *h_new(const char *policy_text, const sched_config *cfg)
{
    harness *h = calloc(1, sizeof(*h));
    cr_assert(h);
    h_init(h, policy_text, cfg);
    return h;
}

static __attribute__((unused)) void h_free(harness *h)
{
    h_fini(h);
    free(h);
}

/* Add a request (ids in arrival order). */
static __attribute__((unused)) uint64_t h_add(harness *h, uint64_t arrival, int tenant, int cls,
                                              uint32_t prompt, uint32_t out)
{
    cr_assert(h->n < H_MAX_REQ);
    uint64_t id = ++h->n;
    h_req *q = &h->r[id];
    memset(q, 0, sizeof(*q));
    q->arrival = arrival;
    q->tenant = tenant;
    q->cls = cls;
    q->prompt = prompt;
    q->out_len = out;
    return id;
}

static __attribute__((unused)) void h_check(harness *h, const char *where)
{
    if (!h->check) return;
    char why[256];
    int rc = sched_check_invariants(h->s, why, sizeof why);
    cr_assert_eq(rc, 0, "invariant broken after %s at t=%llu: %s", where,
                 (unsigned long long)h->now, why);
    sched_counts c;
    sched_get_counts(h->s, &c);
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        cr_assert_eq(c.kv_used[p] + c.kv_free[p], c.kv_total[p], "pool %d: used %u + free %u != %u",
                     p, c.kv_used[p], c.kv_free[p], c.kv_total[p]);
}

static __attribute__((unused)) void h_submit_due(harness *h)
{
    while (h->next_submit < h->n && h->r[h->next_submit + 1].arrival <= h->now) {
        uint64_t id = ++h->next_submit;
        h_req *q = &h->r[id];
        sched_request sr = {.id = id,
                            .tenant = q->tenant,
                            .class_idx = q->cls,
                            .prompt_len = q->prompt,
                            .max_new_tokens = q->out_len + 16,
                            .arrival_us = q->arrival};
        if (sr.max_new_tokens < q->out_len) sr.max_new_tokens = q->out_len;
        int rc = sched_submit(h->s, &sr, h->now, &q->reject);
        q->submitted = rc == 0 ? 1 : -1;
        if (rc) q->ended = 1;
    }
}

static const sched_plan *h_last_plan;

/* One iteration of the service: submit arrivals, step, run the batch, commit. */
static __attribute__((unused)) const sched_plan *h_iterate(harness *h)
{
    h_submit_due(h);
    for (uint32_t i = 1; i <= h->next_submit; i++) {
        h_req *q = &h->r[i];
        if (q->cancel_at && q->cancel_at <= h->now && !q->ended && q->submitted == 1)
            sched_cancel(h->s, i, h->now, SCHED_CANCEL_DISCONNECT);
    }
    /* completed transfers */
    for (uint32_t i = 0; i < h->n_xf;) {
        if (h->xf[i].done_at <= h->now) {
            int rc =
                sched_transfer_done(h->s, h->xf[i].id, h->now, h->xf[i].bytes, h->xf[i].dur, 0);
            cr_assert_eq(rc, 0, "transfer_done %llu: %s", (unsigned long long)h->xf[i].id,
                         sched_last_error());
            h->xf[i] = h->xf[--h->n_xf];
            h_check(h, "transfer_done");
        } else
            i++;
    }
    const sched_plan *pl = sched_step(h->s, h->now);
    cr_assert(pl, "sched_step: %s", sched_last_error());
    h_last_plan = pl;
    h->steps++;
    h_check(h, "step");
    for (uint32_t i = 0; i < pl->n_transfers; i++) {
        const sched_transfer *t = &pl->transfers[i];
        cr_assert(h->n_xf < 4096);
        uint64_t dur = (uint64_t)((double)t->bytes / h->bw * 1e6) + 10;
        h->xf[h->n_xf++] = (h_xfer){t->id, h->now + dur, t->bytes, dur};
    }
    uint32_t tokens = pl->prefill_tokens + pl->decode_tokens + pl->pad_tokens;
    if (!pl->n_entries) {
        /* idle: jump to the next arrival or transfer */
        uint64_t next = h->now + 1000;
        if (h->next_submit < h->n && h->r[h->next_submit + 1].arrival < next &&
            h->r[h->next_submit + 1].arrival > h->now)
            next = h->r[h->next_submit + 1].arrival;
        for (uint32_t i = 0; i < h->n_xf; i++)
            if (h->xf[i].done_at < next && h->xf[i].done_at > h->now) next = h->xf[i].done_at;
        if (pl->hold_until_us > h->now && pl->hold_until_us < next) next = pl->hold_until_us;
        h->now = next;
        return pl;
    }
    uint64_t dur = (uint64_t)(h->a_us + h->b_us * tokens);
    h->now += dur;
    h->busy_us += dur;
    static sched_result res[65536];
    cr_assert(pl->n_entries <= 65536);
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        const sched_entry *e = &pl->entries[i];
        h_req *q = &h->r[e->req];
        res[i] = (sched_result){.req = e->req, .tokens = e->samples ? 1 : 0};
        cr_assert(e->n_blocks * 16 >= e->start_pos + e->n_tokens || 1);
        if (e->samples) {
            q->generated++;
            if (!q->first_token) q->first_token = h->now;
            if (q->generated >= q->out_len) res[i].finished = SCHED_FINISH_STOP;
        }
    }
    int rc = sched_commit(h->s, res, pl->n_entries, h->now, dur);
    cr_assert_eq(rc, 0, "commit: %s", sched_last_error());
    h_check(h, "commit");
    return pl;
}

/* Run until every request has ended or the time limit passes. */
static __attribute__((unused)) void h_run(harness *h, uint64_t until)
{
    while (h->now < until) {
        int all = h->next_submit == h->n;
        for (uint32_t i = 1; all && i <= h->n; i++)
            if (!h->r[i].ended) all = 0;
        if (all) break;
        h_iterate(h);
    }
}

static __attribute__((unused)) int h_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static __attribute__((unused)) uint64_t h_pct(uint64_t *v, size_t n, double pct)
{
    if (!n) return 0;
    qsort(v, n, sizeof(uint64_t), h_cmp_u64);
    size_t i = (size_t)(pct / 100.0 * (double)(n - 1) + 0.5);
    return v[i];
}

#endif
