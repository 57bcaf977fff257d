/* SPDX-License-Identifier: MIT */
/* Random drivers: any sequence of API calls keeps every invariant (blocks owned once, counters
 * equal sums, nothing in transit scheduled), in every mode; hostile policy text never crashes
 * the parser. */
#include <errno.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"

static uint64_t rs;
static uint32_t rnd(uint32_t n)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return n ? (uint32_t)(rs % n) : 0;
}

static void check(sched *s, const char *after, int iter)
{
    char why[256];
    int rc = sched_check_invariants(s, why, sizeof why);
    cr_assert_eq(rc, 0, "iteration %d, after %s: %s", iter, after, why);
}

static void drive(const char *mode, uint64_t seed)
{
    char pol[512];
    snprintf(
        pol, sizeof pol,
        "[scheduler]\nmode = %s\ntoken_budget = 300\nprefill_chunk = 64\nmax_active_seqs = 24\n"
        "decode_reserve_tokens = 16\nmin_residency = 3ms\nmax_preemptions = 3\nstatic_batch_size = "
        "4\n"
        "static_batch_timeout = 5ms\ndynamic_window = 2ms\nbackpressure_timeout = 40ms\n"
        "queue_max_requests = 200\n"
        "[class a]\npriority = 3\nlatency_sensitive = yes\nmax_queue_wait = 300ms\ntpot_target = "
        "9ms\n"
        "[class b]\naging_per_s = 4\n[tenant x]\nmax_kv_blocks = 90\n[tenant y]\nweight = 2\n"
        "token_rate_per_s = 30000\n[tenant z]\n",
        mode);
    sched_policy *p;
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(pol, &p, &err), 0, "%d %s", err.line, err.reason);
    sched_config c = {
        .kv_blocks_device = 160,
        .kv_blocks_host = 60,
        .kv_blocks_disk = 40,
        .block_size = 8,
        .kv_bytes_per_token = 4096,
        .max_context = 1024,
        .step.base_us = 500,
        .step.prefill_token_us = 5,
        .step.decode_seq_us = 8,
        .step.context_token_us = 0.01,
        .host = {2e9, 2e9, 5},
        .disk = {3e8, 3e8, 50},
    };
    sched *s;
    cr_assert_eq(sched_create(p, &c, NULL, NULL, seed, &s), 0);
    rs = seed;
    uint64_t now = 0, next_id = 1;
    uint64_t xfer[256];
    unsigned nx = 0;
    sched_result res[512];
    for (int it = 0; it < 6000; it++) {
        now += rnd(3000);
        unsigned op = rnd(10);
        if (op < 3) {
            sched_request q = {.id = rnd(8) ? next_id++ : 1 + rnd((uint32_t)next_id),
                               .tenant = (int32_t)rnd(3),
                               .class_idx = (int32_t)rnd(2),
                               .prompt_len = 1 + rnd(400),
                               .max_new_tokens = 1 + rnd(300),
                               .deadline_us = rnd(6) ? 0 : now + rnd(400000),
                               .arrival_us = now - rnd(1000)};
            sched_submit(s, &q, now, NULL);
            check(s, "submit", it);
        } else if (op == 3) {
            sched_cancel(s, 1 + rnd((uint32_t)next_id), now, (sched_cancel_reason)rnd(4));
            check(s, "cancel", it);
        } else if (op == 4) {
            sched_set_output_blocked(s, 1 + rnd((uint32_t)next_id), rnd(2), now);
            check(s, "set_output_blocked", it);
        } else if (op == 5 && nx) {
            unsigned k = rnd(nx);
            int rc = sched_transfer_done(s, xfer[k], now, rnd(2) ? 0 : 1 + rnd(1 << 20), rnd(500),
                                         rnd(8) ? 0 : -EIO);
            cr_assert_eq(rc, 0);
            xfer[k] = xfer[--nx];
            check(s, "transfer_done", it);
        } else {
            const sched_plan *pl = sched_step(s, now);
            cr_assert_not_null(pl);
            check(s, "step", it);
            cr_assert_leq(pl->prefill_tokens + pl->decode_tokens,
                          strcmp(mode, "token_budget") ? 100000 : 300);
            unsigned n = 0;
            for (uint32_t i = 0; i < pl->n_entries; i++) {
                const sched_entry *e = &pl->entries[i];
                sched_req_info in;
                cr_assert_eq(sched_get_request(s, e->req, &in), 0);
                cr_assert_eq(in.state, SCHED_REQ_RUNNING, "req %llu scheduled in state %d",
                             (unsigned long long)e->req, in.state);
                cr_assert_leq((uint64_t)e->start_pos + e->n_tokens, (uint64_t)e->n_blocks * 8);
                cr_assert_leq(e->n_blocks, in.blocks[SCHED_POOL_DEVICE]);
                for (uint32_t b = 0; b < e->n_blocks; b++) cr_assert_lt(e->blocks[b], 160u);
                if (rnd(20) == 0 || n >= 512) continue; /* an entry the engine dropped */
                res[n++] =
                    (sched_result){.req = e->req,
                                   .tokens = e->samples ? (rnd(30) ? 1 : 0) : 0,
                                   .finished = rnd(40) ? SCHED_FINISH_NONE : SCHED_FINISH_STOP};
            }
            for (uint32_t i = 0; i < pl->n_preemptions; i++) {
                sched_req_info in;
                int rc = sched_get_request(s, pl->preemptions[i].req, &in);
                cr_assert(rc == -ENOENT || in.state != SCHED_REQ_RUNNING,
                          "req %llu preempted and running again in the same step",
                          (unsigned long long)pl->preemptions[i].req);
                for (uint32_t k = 0; k < pl->n_entries; k++)
                    cr_assert_neq(pl->entries[k].req, pl->preemptions[i].req,
                                  "preempted yet scheduled");
            }
            /* every transfer carries its own block lists: no block appears twice in a plan */
            static uint8_t seen[3][1024];
            memset(seen, 0, sizeof seen);
            for (uint32_t i = 0; i < pl->n_transfers; i++) {
                const sched_transfer *t = &pl->transfers[i];
                int src_pool = t->dir == SCHED_XFER_OUT ? SCHED_POOL_DEVICE : (int)t->tier;
                int dst_pool = t->dir == SCHED_XFER_OUT ? (int)t->tier : SCHED_POOL_DEVICE;
                for (uint32_t b = 0; b < t->n_blocks; b++) {
                    cr_assert_lt(t->src[b], 1024u);
                    cr_assert_lt(t->dst[b], 1024u);
                    cr_assert_eq(seen[src_pool][t->src[b]]++, 0,
                                 "transfer %llu: %s block %u listed twice in a plan",
                                 (unsigned long long)t->id, sched_pool_name((sched_pool)src_pool),
                                 t->src[b]);
                    cr_assert_eq(seen[dst_pool][t->dst[b]]++, 0,
                                 "transfer %llu: %s block %u listed twice in a plan",
                                 (unsigned long long)t->id, sched_pool_name((sched_pool)dst_pool),
                                 t->dst[b]);
                }
            }
            for (uint32_t i = 0; i < pl->n_transfers && nx < 256; i++)
                xfer[nx++] = pl->transfers[i].id;
            cr_assert_leq(pl->n_transfers, 256 - nx + pl->n_transfers);
            now += 200 + rnd(5000);
            cr_assert_eq(sched_commit(s, res, n, now,
                                      rnd(4) ? (uint64_t)pl->predicted_step_us + rnd(100) : 0),
                         0);
            check(s, "commit", it);
        }
    }
    /* drain: complete transfers, cancel everything, the pools come back whole */
    while (nx) cr_assert_eq(sched_transfer_done(s, xfer[--nx], now, 0, 0, 0), 0);
    for (uint64_t id = 1; id < next_id; id++) sched_cancel(s, id, now, SCHED_CANCEL_SHUTDOWN);
    const sched_plan *pl = sched_step(s, now);
    for (uint32_t i = 0; i < pl->n_transfers; i++)
        sched_transfer_done(s, pl->transfers[i].id, now, 0, 0, 0);
    for (uint64_t id = 1; id < next_id; id++) sched_cancel(s, id, now, SCHED_CANCEL_SHUTDOWN);
    sched_step(s, now + 1);
    check(s, "drain", -1);
    sched_counts cn;
    sched_get_counts(s, &cn);
    cr_assert_eq(cn.kv_used[0] + cn.kv_used[1] + cn.kv_used[2], 0, "blocks leaked: %u/%u/%u",
                 cn.kv_used[0], cn.kv_used[1], cn.kv_used[2]);
    cr_assert_eq(cn.waiting + cn.running + cn.swapped + cn.in_transit, 0);
    sched_destroy(s);
    sched_policy_free(p);
}

Test(sched_stress, random_calls_token_budget)
{
    drive("token_budget", 1);
    drive("token_budget", 77);
}
Test(sched_stress, random_calls_continuous)
{
    drive("continuous", 2);
}
Test(sched_stress, random_calls_static)
{
    drive("static", 3);
}
Test(sched_stress, random_calls_dynamic)
{
    drive("dynamic", 4);
}

Test(sched_stress, hostile_policy_text_never_crashes)
{
    static const char *frags[] = {"[scheduler]\n",
                                  "[class a]\n",
                                  "[tenant t]\n",
                                  "[trust]\n",
                                  "mode = static\n",
                                  "weight = 1e308\n",
                                  "uids = 1 2 3\n",
                                  "priority = -5\n",
                                  "=\n",
                                  "[\n",
                                  "token_budget = 99999999999999\n",
                                  "max_queue_wait = 1.5s\n",
                                  "\t \r\n",
                                  "; c\n",
                                  "key = value = x\n",
                                  "latency_sensitive = yes\n",
                                  "[class a]\n",
                                  "default_tenant = t\n",
                                  "aging_per_s = inf\n",
                                  "uids = ,,,\n"};
    rs = 99;
    char text[2048];
    for (int it = 0; it < 3000; it++) {
        size_t len = 0;
        int n = 1 + (int)rnd(12);
        for (int k = 0; k < n; k++) {
            const char *f = frags[rnd(sizeof frags / sizeof frags[0])];
            size_t fl = strlen(f);
            if (len + fl + 2 >= sizeof text) break;
            memcpy(text + len, f, fl);
            len += fl;
            if (rnd(7) == 0) text[rnd((uint32_t)len)] = (char)(1 + rnd(255)); /* flip a byte */
        }
        text[len] = 0;
        sched_policy *p = NULL;
        sched_policy_error err;
        int rc = sched_policy_parse(text, &p, &err);
        if (rc == 0) {
            /* anything accepted round-trips through its canonical form */
            sched_policy *q = NULL;
            cr_assert_eq(sched_policy_parse(sched_policy_canonical(p), &q, &err), 0,
                         "canonical rejected: %d %s\n%s", err.line, err.reason,
                         sched_policy_canonical(p));
            cr_assert_eq(sched_policy_hash(p), sched_policy_hash(q));
            sched_policy_free(q);
            sched_policy_free(p);
        } else {
            cr_assert_eq(rc, -EINVAL);
            cr_assert_null(p);
            cr_assert_gt(strlen(err.reason), 0);
        }
    }
}

/* ---- liveness: every request ends, in every mode, under KV pressure ----------------------- */

#include "sched_harness.h"

static void liveness(const char *mode, uint32_t host_blocks, uint64_t seed, bool tight)
{
    char pol[512];
    snprintf(pol, sizeof pol,
             "[scheduler]\nmode = %s\ntoken_budget = %d\nprefill_chunk = %d\nmax_active_seqs = %d\n"
             "min_residency = 5ms\nmax_preemptions = 2\nstatic_batch_size = "
             "4\nstatic_batch_timeout = 5ms\n"
             "dynamic_window = 3ms\n[class a]\npriority = 5\nlatency_sensitive = yes\n[class b]\n"
             "[tenant x]\nmax_kv_blocks = %d\n[tenant y]\nweight = 3\n",
             mode, tight ? 64 : 256, tight ? 32 : 64, tight ? 64 : 32, tight ? 60 : 150);
    sched_config c = h_default_config();
    c.kv_blocks_device = tight ? 90 : 200;
    c.kv_blocks_host = host_blocks;
    harness *h = h_new(pol, &c);
    rs = seed;
    for (int i = 0; i < 300; i++) {
        uint64_t id = h_add(h, (uint64_t)i * 3000 + rnd(3000), (int)rnd(2), (int)rnd(2),
                            1 + rnd(tight ? 500 : 600), 1 + rnd(tight ? 300 : 400));
        if (rnd(10) == 0) h->r[id].cancel_at = h->r[id].arrival + rnd(200000);
    }
    h_run(h, 120000000ull);
    for (uint32_t i = 1; i <= h->n; i++)
        cr_assert(h->r[i].ended,
                  "[%s seed %llu] request %u never ended (now %llu us, generated %u of %u)", mode,
                  (unsigned long long)seed, i, (unsigned long long)h->now, h->r[i].generated,
                  h->r[i].out_len);
    h_iterate(h); /* a static group releases its held slots at the next step */
    sched_counts cn;
    sched_get_counts(h->s, &cn);
    cr_assert_eq(cn.running + cn.waiting + cn.swapped + cn.in_transit, 0,
                 "[%s] %u running %u waiting %u swapped", mode, cn.running, cn.waiting, cn.swapped);
    cr_assert_eq(cn.kv_used[0] + cn.kv_used[1], 0);
    h_free(h);
}

Test(sched_stress, every_request_ends_in_every_mode)
{
    static const char *modes[] = {"token_budget", "continuous", "static", "dynamic"};
    for (int m = 0; m < 4; m++)
        for (uint64_t seed = 1; seed <= 3; seed++) {
            liveness(modes[m], 0, seed, false);
            liveness(modes[m], 300, seed + 10, false);
            liveness(modes[m], 300, seed + 20, true);
        }
}
