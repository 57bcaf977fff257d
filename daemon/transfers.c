/* SPDX-License-Identifier: MIT */
/*
 * daemon/transfers.c — the plan's KV transfers (swap-out to / swap-in from the host and
 * disk tiers, the prefix cache's reloads from them) started on the loop's io_uring through
 * kvtier, their completions handed back to the scheduler — the requests they are for wait
 * for them while the others keep stepping; the prefix cache's demotions, done before anything
 * else of the plan; and --verify-swaps: a checksum per tier slot taken when a block is written
 * there (swap-out, demotion) and compared when it is read back (swap-in, reload, a demotion
 * to disk), and a check that no block is in two transfers (or computed on while it moves) at
 * once.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>

#include "daemon/service_internal.h"

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t block_sum(svc *s, int block)
{
    size_t bb = eng_kv_block_bytes(s->engine);
    void *p = eng_kv_block_ptr(s->engine, block);
    if (p) return fnv1a(p, bb);
    void *tmp = malloc(bb);
    uint64_t h = 0;
    if (tmp && eng_kv_read_block(s->engine, block, tmp) == 0) h = fnv1a(tmp, bb);
    free(tmp);
    return h;
}

typedef struct xfer_ctx {
    svc *s;
    uint64_t reload_req; /* a prefix-cache reload: the request it is for */
    int n;
    int32_t *dev; /* for swap verification */
    int32_t *slot;
    uint64_t ring_bytes, ring_us; /* its window ring's copy (done at the start), if any */
} xfer_ctx;

/* A swap's window ring (sched_transfer.ring): copied now, beside the blocks' job — out
 * before the scheduler gives the ring to another sequence (at the job's completion), in
 * before the sequence's next step (it waits for the job). With --verify-swaps the ring's
 * checksum is kept at its first slot, the ring scrubbed once it is out, and checked once it
 * is back, so a swap-in that did not bring it back is caught. 0 or -errno (logged). */
static int ring_copy(svc *s, const sched_transfer *t, uint64_t *us)
{
    void *ring = eng_kv_ring_ptr(s->engine, (int)t->ring);
    const size_t len = eng_kv_ring_bytes(s->engine);
    int n = (int)t->n_ring_slots;
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)n);
    int rc = -ENOMEM;
    if (slots && ring) {
        for (int i = 0; i < n; i++) slots[i] = (int32_t)t->ring_slots[i];
        rc = kvtier_copy_span(s->tiers, t->dir, t->tier, ring, len, slots, n, us);
    } else if (!ring) {
        rc = -EINVAL;
    }
    if (rc < 0)
        svc_log("KV transfer %llu: window ring %u %s %s tier failed: %s", (unsigned long long)t->id,
                t->ring, t->dir == SCHED_XFER_OUT ? "to the" : "from the", sched_pool_name(t->tier),
                rc == -EINVAL && !ring ? "no such ring" : kvtier_errmsg());
    uint64_t *sum = s->xf.slot_sum[t->tier] && slots ? &s->xf.slot_sum[t->tier][slots[0]] : NULL;
    if (rc == 0 && sum && t->dir == SCHED_XFER_OUT) {
        *sum = fnv1a(ring, len);
        memset(ring, 0xff, len); /* (NaN: a ring not brought back shows in the tokens too) */
    } else if (rc == 0 && sum) {
        uint64_t h = fnv1a(ring, len);
        s->xf.n_swap_verified++;
        if (h != *sum) {
            s->xf.n_swap_verify_errors++;
            svc_log("swap verify: window ring %u from %s slot %d differs (%016llx vs %016llx)",
                    t->ring, sched_pool_name(t->tier), slots[0], (unsigned long long)h,
                    (unsigned long long)*sum);
        }
    }
    free(slots);
    return rc;
}

/* A prefix-cache reload failed: its request cannot go on with the prefix it was admitted
 * with (the scheduler dropped the blocks), so it ends with an error; nothing else does. */
static void reload_failed(svc *s, uint64_t req, uint64_t xfer, int res)
{
    svc_req *r = req_find(s, req);
    if (!r || req_state_ended(r->state)) return;
    svc_log("request %llu: reloading its cached prefix (transfer %llu) failed: %s; it ends with an "
            "error",
            (unsigned long long)req, (unsigned long long)xfer, strerror(-res));
    req_cancel(s, r, SCHED_CANCEL_KV_READ_FAILED, RINGLM_WIRE_R_ERROR, RINGLM_WIRE_R_INTERNAL);
}

static void on_xfer_done(void *ctx, uint64_t cookie, int res, sched_xfer_dir dir, sched_pool tier,
                         size_t bytes, uint64_t elapsed_us)
{
    xfer_ctx *x = ctx;
    svc *s = x->s;
    if (res == 0) { /* its window ring's bytes and time are the transfer's too */
        bytes += x->ring_bytes;
        elapsed_us += x->ring_us;
    }
    if (s->xf.busy_dev)
        for (int i = 0; i < x->n; i++) {
            if (x->dev[i] >= 0 && x->dev[i] < eng_kv_blocks(s->engine) &&
                s->xf.busy_dev[x->dev[i]]) {
                s->xf.busy_dev[x->dev[i]]--;
                if (dir == SCHED_XFER_IN && s->xf.busy_dev_in[x->dev[i]])
                    s->xf.busy_dev_in[x->dev[i]]--;
            }
            if (x->slot[i] >= 0 && x->slot[i] < kvtier_blocks(s->tiers, tier) &&
                s->xf.busy_slot[tier][x->slot[i]])
                s->xf.busy_slot[tier][x->slot[i]]--;
        }
    if (res == 0 && s->xf.slot_sum[tier] && dir == SCHED_XFER_IN) {
        /* Swap-in must bring back exactly the bytes that went out. */
        for (int i = 0; i < x->n; i++) {
            uint64_t h = block_sum(s, x->dev[i]);
            s->xf.n_swap_verified++;
            if (h != s->xf.slot_sum[tier][x->slot[i]]) {
                s->xf.n_swap_verify_errors++;
                svc_log("swap verify: device block %d from %s slot %d differs (%016llx vs %016llx)",
                        x->dev[i], sched_pool_name(tier), x->slot[i], (unsigned long long)h,
                        (unsigned long long)s->xf.slot_sum[tier][x->slot[i]]);
            }
        }
    }
    if (res < 0)
        svc_log("KV transfer %llu (%s, %s tier) failed: %s", (unsigned long long)cookie,
                dir == SCHED_XFER_OUT ? "out" : "in", sched_pool_name(tier), strerror(-res));
    if (res < 0 && dir == SCHED_XFER_IN)
        metrics_observe_tier_read_failure(s->mx, tier, kvtier_read_failure_of(res));
    else if (res == 0)
        metrics_observe_transfer(s->mx, tier, dir, bytes, elapsed_us);
    DTRACE_PROBE4(ringlmd, transfer_done, cookie, dir, tier, res);
    if (s->trace_xfer) svc_log("xfer %llu done res %d", (unsigned long long)cookie, res);
    sched_transfer_done(s->sched, cookie, s->now_us, bytes, elapsed_us, res);
    if (res < 0 && x->reload_req) reload_failed(s, x->reload_req, cookie, res);
    if (res == 0) {
        /* The dashboard shows the scheduler's estimate, the one it plans with. */
        sched_tier_cost tc;
        bool m_out = false, m_in = false;
        if (sched_get_tier_cost(s->sched, tier, &tc, &m_out, &m_in) == 0 &&
            (dir == SCHED_XFER_OUT ? m_out : m_in))
            metrics_set_transfer_bw(s->mx, tier, dir,
                                    dir == SCHED_XFER_OUT ? tc.out_bytes_per_s : tc.in_bytes_per_s);
    }
    free(x->dev);
    free(x->slot);
    free(x);
    svc_stats_changed(s);
}

void xfer_start(svc *s, const sched_transfer *t)
{
    sched_pool tier = t->tier;
    int n = (int)t->n_blocks;
    xfer_ctx *x = calloc(1, sizeof *x);
    int32_t *dev = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int rc = -ENOMEM;
    if (!x || !dev || !slot || !s->tiers) {
        if (!s->tiers) rc = -ENOTSUP;
        goto fail;
    }
    const uint32_t *devs = t->dir == SCHED_XFER_OUT ? t->src : t->dst;
    const uint32_t *slots = t->dir == SCHED_XFER_OUT ? t->dst : t->src;
    for (int i = 0; i < n; i++) {
        dev[i] = (int32_t)devs[i];
        slot[i] = (int32_t)slots[i];
    }
    x->s = s;
    x->n = n;
    x->dev = dev;
    x->slot = slot;
    x->reload_req = t->cache ? t->req : 0;
    if (t->n_ring_slots) {
        if ((rc = ring_copy(s, t, &x->ring_us)) < 0) goto fail;
        x->ring_bytes = eng_kv_ring_bytes(s->engine);
    }
    if (s->xf.slot_sum[tier]) {
        int nslots = kvtier_blocks(s->tiers, tier), ndev = eng_kv_blocks(s->engine);
        for (int i = 0; i < n; i++) {
            if (slot[i] < 0 || slot[i] >= nslots || dev[i] < 0 || dev[i] >= ndev) continue;
            /* A slot in two transfers at once, or a device block written by one while in
             * another, means the plan raced itself; two swap-outs may read one device block
             * (a cached prefix block shared by both sequences). */
            bool in = t->dir == SCHED_XFER_IN;
            if ((in ? s->xf.busy_dev[dev[i]] : s->xf.busy_dev_in[dev[i]]) ||
                s->xf.busy_slot[tier][slot[i]]) {
                s->xf.n_overlap_errors++;
                svc_log("verify: transfer %llu uses device block %d / %s slot %d already in flight",
                        (unsigned long long)t->id, dev[i], sched_pool_name(tier), slot[i]);
            }
            s->xf.busy_dev[dev[i]]++;
            if (in) s->xf.busy_dev_in[dev[i]]++;
            s->xf.busy_slot[tier][slot[i]]++;
            if (t->dir == SCHED_XFER_OUT) s->xf.slot_sum[tier][slot[i]] = block_sum(s, dev[i]);
        }
    }
    DTRACE_PROBE4(ringlmd, transfer_start, t->id, (int)t->dir, tier, n);
    if (s->trace_xfer) {
        char b[1024];
        int k = 0;
        for (int i = 0; i < n && k < 900; i++)
            k += snprintf(b + k, sizeof b - (size_t)k, " %d:%d", dev[i], slot[i]);
        svc_log("xfer %llu req %llu %s start dev:slot%s", (unsigned long long)t->id,
                (unsigned long long)t->req, t->dir == SCHED_XFER_OUT ? "out" : "in", b);
    }
    rc = kvtier_submit(s->tiers, t->dir, tier, dev, slot, n, t->id, on_xfer_done, x);
    if (rc == 0) return;
    if (rc == -EBUSY && t->cache) {
        /* every job slot in flight: a reload is done now instead (the scheduler takes its
         * completion at any time; its blocks are the request's alone) */
        if (s->xf.slot_sum[tier]) /* (undo the marks above: xfer_copy checks and marks its own) */
            for (int i = 0; i < n; i++) {
                if (slot[i] < 0 || slot[i] >= kvtier_blocks(s->tiers, tier) || dev[i] < 0 ||
                    dev[i] >= eng_kv_blocks(s->engine))
                    continue;
                s->xf.busy_dev[dev[i]]--;
                s->xf.busy_dev_in[dev[i]]--;
                s->xf.busy_slot[tier][slot[i]]--;
            }
        free(x);
        free(dev);
        free(slot);
        xfer_copy(s, t);
        return;
    }
    svc_log("KV transfer %llu not started: %s", (unsigned long long)t->id, kvtier_errmsg());
fail:
    free(x);
    free(dev);
    free(slot);
    sched_transfer_done(s->sched, t->id, s->now_us, 0, 0, rc);
    if (t->cache && t->req) reload_failed(s, t->req, t->id, rc);
}

static uint64_t slot_hash(svc *s, sched_pool tier, int slot)
{
    size_t bb = eng_kv_block_bytes(s->engine);
    void *tmp = malloc(bb);
    uint64_t h = 0;
    if (tmp && kvtier_read_slot(s->tiers, tier, slot, tmp) == 0) h = fnv1a(tmp, bb);
    free(tmp);
    return h;
}

void xfer_copy(svc *s, const sched_transfer *t)
{
    bool in = t->dir == SCHED_XFER_IN;
    sched_pool from = in ? t->tier : t->src_pool, to = in ? SCHED_POOL_DEVICE : t->tier;
    int n = (int)t->n_blocks;
    int32_t *src = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int32_t *dst = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    uint64_t us = 0;
    int rc = -ENOMEM;
    if (src && dst && s->tiers) {
        for (int i = 0; i < n; i++) {
            src[i] = (int32_t)t->src[i];
            dst[i] = (int32_t)t->dst[i];
        }
        if (s->xf.busy_dev) {
            /* a block a swap in flight uses must not be one a cache copy touches */
            for (int i = 0; i < n; i++) {
                int dev = in ? dst[i] : from == SCHED_POOL_DEVICE ? src[i] : -1;
                bool clash = dev >= 0 && dev < eng_kv_blocks(s->engine) &&
                             (in ? s->xf.busy_dev[dev] : s->xf.busy_dev_in[dev]);
                if (from != SCHED_POOL_DEVICE && s->xf.busy_slot[from] &&
                    s->xf.busy_slot[from][src[i]])
                    clash = true;
                if (to != SCHED_POOL_DEVICE && s->xf.busy_slot[to] && s->xf.busy_slot[to][dst[i]])
                    clash = true;
                if (clash) {
                    s->xf.n_overlap_errors++;
                    svc_log("verify: cache copy %llu uses %s block %d / %s block %d while a swap "
                            "moves it",
                            (unsigned long long)t->id, sched_pool_name(from), src[i],
                            sched_pool_name(to), dst[i]);
                }
            }
        }
        rc = kvtier_copy(s->tiers, from, to, src, dst, n, &us);
        if (rc < 0)
            svc_log("KV cache copy %llu (%s → %s, %d blocks) failed: %s", (unsigned long long)t->id,
                    sched_pool_name(from), sched_pool_name(to), n, kvtier_errmsg());
    } else if (!s->tiers) {
        rc = -ENOTSUP;
    }
    if (rc == 0 && s->xf.slot_sum[to == SCHED_POOL_DEVICE ? from : to]) {
        /* the bytes that arrive are the bytes that left: a demotion from the device records
         * them, a demotion to disk and a reload compare what they read with that */
        for (int i = 0; i < n; i++) {
            uint64_t want = 0, got;
            if (from == SCHED_POOL_DEVICE) {
                s->xf.slot_sum[to][dst[i]] = block_sum(s, src[i]);
                continue;
            }
            want = s->xf.slot_sum[from][src[i]];
            got = to == SCHED_POOL_DEVICE ? block_sum(s, dst[i]) : slot_hash(s, to, dst[i]);
            if (to != SCHED_POOL_DEVICE) s->xf.slot_sum[to][dst[i]] = got;
            s->xf.n_swap_verified++;
            if (got != want) {
                s->xf.n_swap_verify_errors++;
                svc_log("swap verify: cache copy %llu: %s block %d from %s slot %d differs "
                        "(%016llx vs %016llx)",
                        (unsigned long long)t->id, sched_pool_name(to), dst[i],
                        sched_pool_name(from), src[i], (unsigned long long)got,
                        (unsigned long long)want);
            }
        }
    }
    if (rc == 0) metrics_observe_transfer(s->mx, t->tier, t->dir, (size_t)t->bytes, us);
    if (rc < 0 && in) metrics_observe_tier_read_failure(s->mx, from, kvtier_read_failure_of(rc));
    DTRACE_PROBE4(ringlmd, transfer_done, t->id, t->dir, t->tier, rc);
    if (s->trace_xfer)
        svc_log("cache copy %llu %s → %s, %d blocks: %d", (unsigned long long)t->id,
                sched_pool_name(from), sched_pool_name(to), n, rc);
    sched_transfer_done(s->sched, t->id, s->now_us, rc == 0 ? t->bytes : 0, us, rc);
    if (rc < 0 && in && t->req) reload_failed(s, t->req, t->id, rc);
    free(src);
    free(dst);
    svc_stats_changed(s);
}

void xfer_check_compute(svc *s, const sched_entry *e)
{
    if (!s->xf.busy_dev) return;
    /* the entry writes the blocks of positions [start_pos, start_pos + n_tokens) and only
     * reads the ones before: reading a block a swap-out reads too is fine */
    uint32_t bs = (uint32_t)eng_kv_block_size(s->engine),
             first_written = bs ? e->start_pos / bs : 0;
    for (uint32_t j = 0; j < e->n_blocks; j++)
        if (e->blocks[j] < (uint32_t)eng_kv_blocks(s->engine) &&
            (s->xf.busy_dev_in[e->blocks[j]] ||
             (j >= first_written && s->xf.busy_dev[e->blocks[j]]))) {
            s->xf.n_overlap_errors++;
            svc_log("verify: request %llu computes on device block %u while it is in flight",
                    (unsigned long long)e->req, e->blocks[j]);
        }
}

int xfer_verify_init(svc *s)
{
    s->xf.busy_dev = calloc((size_t)eng_kv_blocks(s->engine), 1);
    s->xf.busy_dev_in = calloc((size_t)eng_kv_blocks(s->engine), 1);
    if (!s->xf.busy_dev || !s->xf.busy_dev_in) return -ENOMEM;
    for (sched_pool t = SCHED_POOL_HOST; t < SCHED_POOL__COUNT; t++)
        if (kvtier_blocks(s->tiers, t) > 0) {
            s->xf.slot_sum[t] = calloc((size_t)kvtier_blocks(s->tiers, t), sizeof(uint64_t));
            s->xf.busy_slot[t] = calloc((size_t)kvtier_blocks(s->tiers, t), 1);
            if (!s->xf.slot_sum[t] || !s->xf.busy_slot[t]) return -ENOMEM;
        }
    return 0;
}

void xfer_free(svc *s)
{
    for (int t = 0; t < SCHED_POOL__COUNT; t++) {
        free(s->xf.slot_sum[t]);
        free(s->xf.busy_slot[t]);
        s->xf.slot_sum[t] = NULL;
        s->xf.busy_slot[t] = NULL;
    }
    free(s->xf.busy_dev);
    s->xf.busy_dev = NULL;
    free(s->xf.busy_dev_in);
    s->xf.busy_dev_in = NULL;
}

void kv_copy_plan(svc *s, const sched_plan *p)
{
    int32_t src[64], dst[64];
    for (uint32_t a = 0; a < p->n_copies; a += 64) {
        int n = p->n_copies - a < 64 ? (int)(p->n_copies - a) : 64;
        for (int i = 0; i < n; i++) {
            src[i] = (int32_t)p->copies[a + (uint32_t)i].src;
            dst[i] = (int32_t)p->copies[a + (uint32_t)i].dst;
        }
        int rc = eng_kv_copy_blocks(s->engine, src, dst, n);
        if (rc == 0) continue;
        svc_log("KV block copy (%d blocks, %d -> %d first) failed: %s", n, src[0], dst[0],
                eng_errmsg());
        for (int i = 0; i < n; i++) {
            svc_req *r = req_find(s, p->copies[a + (uint32_t)i].req);
            if (r)
                req_cancel(s, r, SCHED_CANCEL_ENGINE_ERROR, RINGLM_WIRE_R_ERROR,
                           RINGLM_WIRE_R_INTERNAL);
        }
    }
}
