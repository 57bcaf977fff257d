/* SPDX-License-Identifier: MIT */
/*
 * sched.c — the scheduler core: queues, KV block pools, admission, the per-step plan,
 * preemption with its cost model, commit and transfer completions, accounting.
 *
 * Data structures (why step stays cheap with 100,000 waiting):
 *   - requests live in a slab indexed by slot; an open-addressing map finds a slot by id;
 *   - waiting requests sit in one binary heap per (class, tenant), keyed by original arrival,
 *     so a preempted sequence re-enters at its old place and aging never restarts;
 *   - swapped-out sequences sit in one heap per class (they go back ahead of new admissions);
 *   - queue-wait/deadline expiries and backpressure expiries are heaps keyed by time;
 *   - running sequences are a dense array (every one of them is visited anyway: each decodes).
 * A step therefore costs O(running + picks × classes × tenants + log waiting).
 */
#include "sched/sched.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sched__set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
sched_policy *sched__policy_clone(const sched_policy *p);

#define NO_POS   (-1)
/* Admission headroom on max_queue_wait: starts at 85%, shrinks by 10% for every queue-wait
 * timeout (the estimate was too optimistic), grows back slowly while starts stay well inside
 * the limit — a feedback loop that keeps overload ending in rejects at admission. */
#define HEADROOM_MAX 0.85
#define HEADROOM_MIN 0.30
#define NO_SLOT  UINT32_MAX
#define INF_US   UINT64_MAX

/* ---------------------------------------------------------------------------------------- */
/* Types                                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct req {
    uint64_t id;
    uint8_t  state;             /* sched_req_state; ENDED = release pending */
    uint8_t  live;              /* slot in use (also while in limbo: 0) */
    uint8_t  defer;             /* last defer reason emitted */
    uint8_t  end_kind;          /* sched_event_kind that ended it (CANCEL/TIMEOUT/FINISH) */
    uint8_t  tier;              /* pool of tier_blocks (HOST/DISK) */
    bool     blocked;           /* output backpressure */
    bool     started;           /* ever held device KV */
    bool     recompute;         /* next admission is a re-prefill after recompute */
    bool     held;              /* static mode: finished, slot held until the group ends */
    bool     moving;            /* a transfer of its KV is in flight (even after it ended) */
    uint16_t tenant, cls;
    uint32_t prompt_len, max_new, generated, computed;
    uint32_t preemptions;
    uint32_t charged_upto;      /* prompt positions already charged to the tenant */
    uint64_t arrival_us, deadline_us, first_token_us, blocked_since, resumed_at;
    uint64_t xfer;              /* transfer in flight */
    int32_t  q_pos, t_pos, bp_pos, run_pos;
    uint64_t entry_step;        /* step_no of the plan holding its entry */
    uint32_t entry_idx;
    uint64_t skip_pass;         /* deferred in this decode pass (s->pass_no) */
    uint64_t preempt_step;      /* step_no of its last preemption */
    /* realised cost of the last preemption, so the cost model can be checked (DESIGN §5):
     * the estimates made then, the length it had, and what the way back actually took */
    double   pre_sw_us, pre_rc_us;  /* swap_cost_us / recompute_cost_us at preemption */
    uint32_t pre_len;           /* computed length when preempted: the re-prefill target */
    bool     rc_active;         /* re-prefilling after a recompute: summing step times */
    bool     rc_unknown;        /* one of those steps had no measured duration */
    uint64_t rc_us;             /* summed durations of the steps that re-prefilled it */
    uint64_t out_us;            /* measured swap-out duration (0 = unknown) */
    uint32_t *dev;   uint32_t n_dev, cap_dev;
    uint32_t *tierb; uint32_t n_tier, cap_tier;
} req;

typedef struct hent { uint64_t k1, k2; uint32_t slot; } hent;
typedef struct heap { hent *a; uint32_t n, cap; uint8_t which; } heap;
enum { POS_Q = 0, POS_T = 1, POS_BP = 2 };

typedef struct pool {
    uint32_t  total;
    uint32_t *free_ids;          /* stack */
    uint32_t  n_free;
} pool;

typedef struct tenant_state {
    double   vt;                 /* virtual tokens / weight */
    double   bucket;             /* token-rate bucket */
    uint32_t n_live;             /* requests not ended */
    uint32_t kv_blocks;          /* device blocks held */
    uint32_t pending_out;        /* of those, blocks a swap-out in flight will free */
    uint32_t pend_step;          /* pending_out not yet waited on in this decode pass */
    uint32_t moving_in;          /* sequences of the tenant being swapped in */
    sched_group_stats st;
} tenant_state;

typedef struct class_state {
    double   headroom;           /* admit while predicted wait <= headroom × max_queue_wait */
    uint32_t n_waiting;
    uint64_t queued_tokens;
    heap     swapped;
    sched_group_stats st;
} class_state;

typedef struct tier_est {
    double   out_bps, in_bps, lat_us;
    uint64_t queued_out, queued_in;
    bool     out_measured, in_measured;
} tier_est;

typedef struct xfer_rec { uint64_t id; uint32_t slot; uint8_t dir, tier; uint64_t bytes; double pred_us; } xfer_rec;

#define VEC(T) struct { T *a; uint32_t n, cap; }
#define VEC_PUSH(s, v, x) do { \
        if (vec_grow((void **)&(v).a, &(v).cap, (v).n + 1, sizeof(*(v).a))) (v).a[(v).n++] = (x); \
        else (s)->oom = true; \
    } while (0)

struct sched {
    sched_policy    *policy;
    sched_policy_cfg cfg;
    sched_config     conf;
    sched_event_fn   sink;
    void            *sink_ctx;
    uint64_t         seed;
    int              n_classes, n_tenants;
    const sched_class_cfg  *cls[SCHED_MAX_CLASSES];
    const sched_tenant_cfg *ten[SCHED_MAX_TENANTS];
    tenant_state     ts[SCHED_MAX_TENANTS];
    class_state      cs[SCHED_MAX_CLASSES];
    heap            *wait;               /* [class * n_tenants + tenant] */
    heap             timers, bp_timers;

    req             *reqs; uint32_t n_slots, cap_slots;
    VEC(uint32_t)    free_slots, limbo;
    uint32_t        *map; uint32_t map_cap, map_n;   /* id → slot */

    pool             pools[SCHED_POOL__COUNT];
    VEC(uint32_t)    run;                 /* RUNNING slots */
    VEC(uint32_t)    cancel_pending;      /* ENDED, release at next step */
    VEC(xfer_rec)    xfers;               /* in flight */
    uint32_t         n_waiting, n_swapped, n_in_transit, n_swapping_in, n_blocked;
    uint64_t         queued_tokens;
    uint64_t         pending_out_blocks;  /* device blocks that swap-outs will free */

    /* cost model */
    double           corr;
    tier_est         tiers[SCHED_POOL__COUNT];
    double           last_pred_us;
    uint64_t         xfer_measured;
    /* measured prefill rate under backlog (exponentially decayed sums, ~2 s memory) */
    double           rate_tok, rate_us;
    bool             plan_backlogged;
    double           xfer_pred_sum, xfer_real_sum;

    /* plan */
    uint64_t         step_no, last_now;
    bool             oom;
    sched_plan       plan;
    VEC(sched_entry) entries;
    VEC(sched_release) rel_plan, rel_acc;
    VEC(sched_transfer) transfers;
    VEC(uint32_t)    xfer_blocks;
    VEC(sched_preemption) preempts;
    VEC(sched_ended) ended;
    VEC(uint32_t)    dec, part, victims;
    uint32_t         victim_next;
    bool             victims_built;
    uint64_t         next_xfer;
    bool             group_active;        /* static/dynamic: a group holds the slots */
    uint64_t         pass_no;             /* decode passes (a step may run two) */
    bool             forced;              /* last-resort pass: caps and residency waived */
};

/* ---------------------------------------------------------------------------------------- */
/* Small utilities                                                                          */
/* ---------------------------------------------------------------------------------------- */

static bool vec_grow(void **a, uint32_t *cap, uint32_t need, size_t elt)
{
    if (need <= *cap) return true;
    uint32_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *p = realloc(*a, (size_t)nc * elt);
    if (!p) return false;
    *a = p;
    *cap = nc;
    return true;
}

static inline uint32_t div_up(uint64_t a, uint32_t b) { return (uint32_t)((a + b - 1) / b); }
static inline uint32_t known(const req *r) { return r->prompt_len + r->generated; }

/* ---- heaps ------------------------------------------------------------------------------- */

static inline int32_t *hpos(sched *s, uint32_t slot, uint8_t which)
{
    req *r = &s->reqs[slot];
    return which == POS_Q ? &r->q_pos : which == POS_T ? &r->t_pos : &r->bp_pos;
}
static inline bool hless(const hent *a, const hent *b)
{
    return a->k1 < b->k1 || (a->k1 == b->k1 && a->k2 < b->k2);
}
static void hset(sched *s, heap *h, uint32_t i, hent e)
{
    h->a[i] = e;
    *hpos(s, e.slot, h->which) = (int32_t)i;
}
static void hup(sched *s, heap *h, uint32_t i)
{
    hent e = h->a[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!hless(&e, &h->a[p])) break;
        hset(s, h, i, h->a[p]);
        i = p;
    }
    hset(s, h, i, e);
}
static void hdown(sched *s, heap *h, uint32_t i)
{
    hent e = h->a[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && hless(&h->a[c + 1], &h->a[c])) c++;
        if (!hless(&h->a[c], &e)) break;
        hset(s, h, i, h->a[c]);
        i = c;
    }
    hset(s, h, i, e);
}
static int hpush(sched *s, heap *h, uint64_t k1, uint64_t k2, uint32_t slot)
{
    if (!vec_grow((void **)&h->a, &h->cap, h->n + 1, sizeof(hent))) { s->oom = true; return -ENOMEM; }
    h->a[h->n] = (hent){k1, k2, slot};
    hup(s, h, h->n++);
    return 0;
}
static void hremove(sched *s, heap *h, uint32_t slot)
{
    int32_t *pp = hpos(s, slot, h->which);
    int32_t i = *pp;
    if (i < 0 || (uint32_t)i >= h->n || h->a[i].slot != slot) return;
    *pp = NO_POS;
    h->n--;
    if ((uint32_t)i == h->n) return;
    hent last = h->a[h->n];
    h->a[i] = last;
    *hpos(s, last.slot, h->which) = i;
    if (i > 0 && hless(&last, &h->a[(i - 1) / 2])) hup(s, h, (uint32_t)i);
    else hdown(s, h, (uint32_t)i);
}
static inline const hent *htop(const heap *h) { return h->n ? &h->a[0] : NULL; }

/* ---- id map (linear probing, backward-shift delete) -------------------------------------- */

static inline uint32_t map_hash(const sched *s, uint64_t id)
{
    return (uint32_t)((id * 0x9E3779B97F4A7C15ull) >> 32) & (s->map_cap - 1);
}
static uint32_t map_get(const sched *s, uint64_t id)
{
    for (uint32_t i = map_hash(s, id);; i = (i + 1) & (s->map_cap - 1)) {
        uint32_t sl = s->map[i];
        if (sl == NO_SLOT) return NO_SLOT;
        if (s->reqs[sl].id == id) return sl;
    }
}
static int map_put(sched *s, uint64_t id, uint32_t slot)
{
    if ((s->map_n + 1) * 2 > s->map_cap) {
        uint32_t nc = s->map_cap * 2;
        uint32_t *nm = malloc((size_t)nc * sizeof(uint32_t));
        if (!nm) return -ENOMEM;
        memset(nm, 0xff, (size_t)nc * sizeof(uint32_t));
        uint32_t *old = s->map, oc = s->map_cap;
        s->map = nm;
        s->map_cap = nc;
        for (uint32_t i = 0; i < oc; i++)
            if (old[i] != NO_SLOT) {
                uint32_t j = map_hash(s, s->reqs[old[i]].id);
                while (nm[j] != NO_SLOT) j = (j + 1) & (nc - 1);
                nm[j] = old[i];
            }
        free(old);
    }
    uint32_t i = map_hash(s, id);
    while (s->map[i] != NO_SLOT) i = (i + 1) & (s->map_cap - 1);
    s->map[i] = slot;
    s->map_n++;
    return 0;
}
static void map_del(sched *s, uint64_t id)
{
    uint32_t m = s->map_cap - 1, i = map_hash(s, id);
    while (s->map[i] != NO_SLOT && s->reqs[s->map[i]].id != id) i = (i + 1) & m;
    if (s->map[i] == NO_SLOT) return;
    s->map[i] = NO_SLOT;
    s->map_n--;
    for (uint32_t j = (i + 1) & m; s->map[j] != NO_SLOT; j = (j + 1) & m) {
        uint32_t home = map_hash(s, s->reqs[s->map[j]].id);
        /* move j back to i if its home is not in (i, j] cyclically */
        bool between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            s->map[i] = s->map[j];
            s->map[j] = NO_SLOT;
            i = j;
        }
    }
}

/* ---- events ------------------------------------------------------------------------------ */

static inline sched_event ev_of(const sched *s, sched_event_kind k, const req *r, uint64_t now)
{
    sched_event e;
    memset(&e, 0, sizeof(e));
    e.t_us = now;
    e.kind = k;
    if (r) {
        e.req = r->id;
        e.tenant = s->ten[r->tenant]->name;
        e.class_name = s->cls[r->cls]->name;
    }
    return e;
}
static inline void emit(const sched *s, const sched_event *e)
{
    if (s->sink) s->sink(s->sink_ctx, e);
}
static void emit_defer(sched *s, req *r, sched_defer_reason why, uint64_t now)
{
    if (r->defer == why) return;   /* on change only: no flood */
    r->defer = (uint8_t)why;
    if (!s->sink) return;
    sched_event e = ev_of(s, SCHED_EV_DEFER, r, now);
    e.defer = why;
    emit(s, &e);
}

/* The recompute realised-cost event: predicted = recompute_cost_us at preemption, realised =
 * the summed full durations of the steps its re-prefill took part in (null when a step had
 * no measured duration).  reason "done" when the re-prefill reached the length it had, or
 * "abandoned" when it ended or was preempted again first (realised so far). */
static void rc_end(sched *s, req *r, sched_outcome how, uint64_t now)
{
    r->rc_active = false;
    sched_event e = ev_of(s, SCHED_EV_RECOMPUTE, r, now);
    e.outcome = how;
    e.mode = SCHED_PREEMPT_RECOMPUTE;
    e.tokens = r->pre_len;
    e.predicted_us = r->pre_rc_us;
    e.realised_us = r->rc_unknown ? -1 : (double)r->rc_us;
    emit(s, &e);
}

/* Its KV is gone (recompute preemption, or a failed swap): time the re-prefill from now. */
static void rc_start(sched *s, req *r, uint64_t now)
{
    r->rc_us = 0;
    r->rc_unknown = false;
    r->rc_active = true;
    if (!r->pre_len) rc_end(s, r, SCHED_OUTCOME_DONE, now);   /* nothing computed, nothing to redo */
}

/* ---- pools ------------------------------------------------------------------------------- */

static int pool_init(pool *p, uint32_t n)
{
    p->total = n;
    p->n_free = n;
    p->free_ids = malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
    if (!p->free_ids) return -ENOMEM;
    /* stack: lowest ids handed out first, so plans read naturally */
    for (uint32_t i = 0; i < n; i++) p->free_ids[i] = n - 1 - i;
    return 0;
}
static inline uint32_t pool_take(pool *p) { return p->free_ids[--p->n_free]; }
static inline void pool_give(pool *p, uint32_t id) { p->free_ids[p->n_free++] = id; }

static bool dev_grow_to(sched *s, req *r, uint32_t nblocks)
{
    if (nblocks <= r->n_dev) return true;
    uint32_t need = nblocks - r->n_dev;
    if (s->pools[SCHED_POOL_DEVICE].n_free < need) return false;
    if (!vec_grow((void **)&r->dev, &r->cap_dev, nblocks, sizeof(uint32_t))) { s->oom = true; return false; }
    while (r->n_dev < nblocks) r->dev[r->n_dev++] = pool_take(&s->pools[SCHED_POOL_DEVICE]);
    s->ts[r->tenant].kv_blocks += need;
    return true;
}
static uint32_t dev_free_all(sched *s, req *r)
{
    uint32_t n = r->n_dev;
    for (uint32_t i = n; i-- > 0;) pool_give(&s->pools[SCHED_POOL_DEVICE], r->dev[i]);
    s->ts[r->tenant].kv_blocks -= n;
    r->n_dev = 0;
    return n;
}
static uint32_t tier_free_all(sched *s, req *r)
{
    uint32_t n = r->n_tier;
    for (uint32_t i = n; i-- > 0;) pool_give(&s->pools[r->tier], r->tierb[i]);
    r->n_tier = 0;
    return n;
}

/* ---- cost model -------------------------------------------------------------------------- */

static double predict_step_us(const sched *s, uint64_t prefill, uint64_t decode, uint64_t ctx)
{
    const sched_config *c = &s->conf;
    double us = c->step_base_us + c->prefill_us_per_token * (double)prefill +
                c->decode_us_per_seq * (double)decode + c->context_us_per_token * (double)ctx;
    return us * s->corr;
}
/* Prefill time for a context of n tokens, from the step model: the marginal per-token cost
 * plus the attention over the growing context, chunk by chunk. */
static double prefill_us(const sched *s, uint64_t n)
{
    const sched_config *c = &s->conf;
    double chunk = s->cfg.mode == SCHED_MODE_TOKEN_BUDGET ? s->cfg.prefill_chunk : (double)n;
    if (chunk < 1) chunk = 1;
    double steps = ceil((double)n / chunk);
    /* chunk j (1-based) ends at context j × chunk, the last one at n: the step model charges
     * each step for the context of the sequences in it */
    double ctx = steps > 0 ? chunk * (steps - 1) * steps / 2 + (double)n : 0;
    double us = c->prefill_us_per_token * (double)n + c->context_us_per_token * ctx;
    return us * s->corr;
}

/* ---------------------------------------------------------------------------------------- */
/* Create / destroy                                                                         */
/* ---------------------------------------------------------------------------------------- */

static int bad_config(const char *field, const char *why)
{
    sched__set_error("sched_create: config %s %s", field, why);
    return -EINVAL;
}

int sched_create(const sched_policy *policy, const sched_config *cfg, sched_event_fn sink,
                 void *sink_ctx, uint64_t seed, sched **out)
{
    if (!out) return bad_config("out", "is NULL");
    *out = NULL;
    if (!policy) return bad_config("policy", "is NULL");
    if (!cfg) return bad_config("cfg", "is NULL");
    if (!cfg->kv_blocks_device) return bad_config("kv_blocks_device", "must be > 0");
    if (!cfg->block_size) return bad_config("block_size", "must be > 0");
    if (!cfg->kv_bytes_per_token) return bad_config("kv_bytes_per_token", "must be > 0");
    if (!cfg->max_context) return bad_config("max_context", "must be > 0");
    if (!(cfg->prefill_us_per_token > 0) || !isfinite(cfg->prefill_us_per_token))
        return bad_config("prefill_us_per_token", "must be a number > 0");
    double nums[] = {cfg->step_base_us, cfg->decode_us_per_seq, cfg->context_us_per_token};
    for (int i = 0; i < 3; i++)
        if (!(nums[i] >= 0) || !isfinite(nums[i]))
            return bad_config("step model coefficient", "must be a finite number >= 0");
    const sched_tier_cost *tc[2] = {&cfg->host, &cfg->disk};
    uint32_t tb[2] = {cfg->kv_blocks_host, cfg->kv_blocks_disk};
    for (int i = 0; i < 2; i++)
        if (tb[i] && (!(tc[i]->out_bytes_per_s > 0) || !(tc[i]->in_bytes_per_s > 0) ||
                      !(tc[i]->latency_us >= 0)))
            return bad_config(i ? "disk" : "host", "tier needs bandwidths > 0 and latency >= 0");

    sched *s = calloc(1, sizeof(*s));
    if (!s) goto oom;
    s->policy = sched__policy_clone(policy);
    if (!s->policy) goto oom;
    s->cfg = *sched_policy_get(s->policy);
    s->conf = *cfg;
    s->sink = sink;
    s->sink_ctx = sink_ctx;
    s->seed = seed;
    s->corr = 1.0;
    s->next_xfer = 1;
    s->n_classes = sched_policy_n_classes(s->policy);
    s->n_tenants = sched_policy_n_tenants(s->policy);
    for (int i = 0; i < s->n_classes; i++) {
        s->cls[i] = sched_policy_class(s->policy, i);
        s->cs[i].headroom = HEADROOM_MAX;
        s->cs[i].swapped.which = POS_Q;
    }
    for (int i = 0; i < s->n_tenants; i++) {
        s->ten[i] = sched_policy_tenant(s->policy, i);
        s->ts[i].bucket = s->ten[i]->token_rate_per_s;
    }
    s->wait = calloc((size_t)s->n_classes * (size_t)s->n_tenants, sizeof(heap));
    if (!s->wait) goto oom;
    s->timers.which = POS_T;
    s->bp_timers.which = POS_BP;
    s->map_cap = 1024;
    s->map = malloc(s->map_cap * sizeof(uint32_t));
    if (!s->map) goto oom;
    memset(s->map, 0xff, s->map_cap * sizeof(uint32_t));
    if (pool_init(&s->pools[SCHED_POOL_DEVICE], cfg->kv_blocks_device) ||
        pool_init(&s->pools[SCHED_POOL_HOST], cfg->kv_blocks_host) ||
        pool_init(&s->pools[SCHED_POOL_DISK], cfg->kv_blocks_disk))
        goto oom;
    s->tiers[SCHED_POOL_HOST] = (tier_est){cfg->host.out_bytes_per_s, cfg->host.in_bytes_per_s,
                                           cfg->host.latency_us, 0, 0, false, false};
    s->tiers[SCHED_POOL_DISK] = (tier_est){cfg->disk.out_bytes_per_s, cfg->disk.in_bytes_per_s,
                                           cfg->disk.latency_us, 0, 0, false, false};
    *out = s;
    return 0;
oom:
    sched_destroy(s);
    sched__set_error("sched_create: out of memory");
    return -ENOMEM;
}

void sched_destroy(sched *s)
{
    if (!s) return;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        free(s->reqs[i].dev);
        free(s->reqs[i].tierb);
    }
    free(s->reqs);
    if (s->wait)
        for (int i = 0; i < s->n_classes * s->n_tenants; i++) free(s->wait[i].a);
    free(s->wait);
    for (int i = 0; i < s->n_classes; i++) free(s->cs[i].swapped.a);
    free(s->timers.a);
    free(s->bp_timers.a);
    free(s->free_slots.a);
    free(s->limbo.a);
    free(s->map);
    for (int i = 0; i < SCHED_POOL__COUNT; i++) free(s->pools[i].free_ids);
    free(s->run.a);
    free(s->cancel_pending.a);
    free(s->xfers.a);
    free(s->entries.a);
    free(s->rel_plan.a);
    free(s->rel_acc.a);
    free(s->transfers.a);
    free(s->xfer_blocks.a);
    free(s->preempts.a);
    free(s->ended.a);
    free(s->dec.a);
    free(s->part.a);
    free(s->victims.a);
    sched_policy_free(s->policy);
    free(s);
}

const sched_policy *sched_get_policy(const sched *s) { return s ? s->policy : NULL; }

/* ---------------------------------------------------------------------------------------- */
/* Queue membership                                                                         */
/* ---------------------------------------------------------------------------------------- */

static inline heap *wait_heap(sched *s, const req *r)
{
    return &s->wait[(size_t)r->cls * (size_t)s->n_tenants + r->tenant];
}

static void waiting_add(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    uint32_t k = known(r);
    r->state = SCHED_REQ_WAITING;
    hpush(s, wait_heap(s, r), r->arrival_us, r->id, slot);
    s->n_waiting++;
    s->queued_tokens += k;
    s->cs[r->cls].n_waiting++;
    s->cs[r->cls].queued_tokens += k;
    s->cs[r->cls].st.queued_requests++;
    s->cs[r->cls].st.queued_tokens += k;
    s->ts[r->tenant].st.queued_requests++;
    s->ts[r->tenant].st.queued_tokens += k;
}
static void waiting_remove(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    uint32_t k = known(r);
    hremove(s, wait_heap(s, r), slot);
    s->n_waiting--;
    s->queued_tokens -= k;
    s->cs[r->cls].n_waiting--;
    s->cs[r->cls].queued_tokens -= k;
    s->cs[r->cls].st.queued_requests--;
    s->cs[r->cls].st.queued_tokens -= k;
    s->ts[r->tenant].st.queued_requests--;
    s->ts[r->tenant].st.queued_tokens -= k;
}
static void run_add(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    r->state = SCHED_REQ_RUNNING;
    r->run_pos = (int32_t)s->run.n;
    VEC_PUSH(s, s->run, slot);
    s->ts[r->tenant].st.running++;
    s->cs[r->cls].st.running++;
    if (r->blocked) s->n_blocked++;
}
static void run_remove(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    int32_t i = r->run_pos;
    if (i < 0) return;
    uint32_t last = s->run.a[--s->run.n];
    if ((uint32_t)i < s->run.n) {
        s->run.a[i] = last;
        s->reqs[last].run_pos = i;
    }
    r->run_pos = NO_POS;
    s->ts[r->tenant].st.running--;
    s->cs[r->cls].st.running--;
    if (r->blocked) s->n_blocked--;
}

/* Timer: queue wait (until first scheduled) and deadline. */
static void timer_update(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    hremove(s, &s->timers, slot);
    uint64_t exp = r->deadline_us ? r->deadline_us : INF_US;
    uint64_t mw = s->cls[r->cls]->max_queue_wait_us;
    if (!r->started && mw && r->arrival_us + mw < exp) exp = r->arrival_us + mw;
    if (exp != INF_US) hpush(s, &s->timers, exp, r->id, slot);
}

/* ---------------------------------------------------------------------------------------- */
/* Ending and releasing                                                                     */
/* ---------------------------------------------------------------------------------------- */

static void release_now(sched *s, uint32_t slot, uint64_t now, bool into_plan)
{
    req *r = &s->reqs[slot];
    sched_release rel = {.req = r->id, .why = (sched_event_kind)r->end_kind};
    if (r->rc_active) rc_end(s, r, SCHED_OUTCOME_ABANDONED, now);
    uint8_t tier = r->tier;
    rel.blocks[SCHED_POOL_DEVICE] = dev_free_all(s, r);
    rel.blocks[tier] += tier_free_all(s, r);
    bool any = rel.blocks[0] || rel.blocks[1] || rel.blocks[2];
    for (int p = 0; p < SCHED_POOL__COUNT && s->sink; p++) {
        /* one event per pool that held blocks; a request that held none still says so */
        if (!rel.blocks[p] && (any || p != SCHED_POOL_DEVICE)) continue;
        sched_event e = ev_of(s, SCHED_EV_RELEASE, r, now);
        e.blocks = rel.blocks[p];
        e.pool = (sched_pool)p;
        emit(s, &e);
    }
    if (into_plan) VEC_PUSH(s, s->rel_plan, rel);
    else VEC_PUSH(s, s->rel_acc, rel);
    hremove(s, &s->timers, slot);
    hremove(s, &s->bp_timers, slot);
    map_del(s, r->id);
    s->ts[r->tenant].n_live--;
    r->live = 0;
    r->state = SCHED_REQ_ENDED;
    VEC_PUSH(s, s->limbo, slot);
}

/* Take a request out of whatever it is in and mark it ENDED.  Returns true when its blocks
 * can be released now (false: a transfer is in flight; release on completion). */
static bool detach(sched *s, uint32_t slot)
{
    req *r = &s->reqs[slot];
    switch (r->state) {
    case SCHED_REQ_WAITING: waiting_remove(s, slot); break;
    case SCHED_REQ_RUNNING: run_remove(s, slot); break;
    case SCHED_REQ_SWAPPED:
        hremove(s, &s->cs[r->cls].swapped, slot);
        s->n_swapped--;
        break;
    case SCHED_REQ_SWAPPING_OUT:
    case SCHED_REQ_SWAPPING_IN:
        r->state = SCHED_REQ_ENDED;
        return false;
    default: break;
    }
    r->state = SCHED_REQ_ENDED;
    return true;
}

static void end_timeout(sched *s, uint32_t slot, sched_timeout_reason why, uint64_t now)
{
    req *r = &s->reqs[slot];
    r->end_kind = SCHED_EV_TIMEOUT;
    s->ts[r->tenant].st.timeouts[why]++;
    s->cs[r->cls].st.timeouts[why]++;
    if (why == SCHED_TIMEOUT_QUEUE_WAIT) {
        double *hr = &s->cs[r->cls].headroom;
        *hr = *hr * 0.9 > HEADROOM_MIN ? *hr * 0.9 : HEADROOM_MIN;
    }
    sched_event e = ev_of(s, SCHED_EV_TIMEOUT, r, now);
    e.timeout = why;
    e.wait_us = now - r->arrival_us;
    emit(s, &e);
    VEC_PUSH(s, s->ended, ((sched_ended){.req = r->id, .kind = SCHED_EV_TIMEOUT, .timeout = why}));
    if (detach(s, slot)) release_now(s, slot, now, true);
}

static void do_cancel(sched *s, uint32_t slot, sched_cancel_reason why, uint64_t now, bool in_step)
{
    req *r = &s->reqs[slot];
    r->end_kind = SCHED_EV_CANCEL;
    s->ts[r->tenant].st.cancels[why]++;
    s->cs[r->cls].st.cancels[why]++;
    sched_event e = ev_of(s, SCHED_EV_CANCEL, r, now);
    e.cancel = why;
    emit(s, &e);
    if (in_step) VEC_PUSH(s, s->ended, ((sched_ended){.req = r->id, .kind = SCHED_EV_CANCEL, .cancel = why}));
    if (!detach(s, slot)) return;   /* in transit: released when the transfer completes */
    if (in_step) release_now(s, slot, now, true);
    else VEC_PUSH(s, s->cancel_pending, slot);
}

static void finish(sched *s, uint32_t slot, sched_finish_reason why, uint64_t now)
{
    req *r = &s->reqs[slot];
    tenant_state *t = &s->ts[r->tenant];
    class_state *c = &s->cs[r->cls];
    const sched_class_cfg *cc = s->cls[r->cls];
    r->end_kind = SCHED_EV_FINISH;
    t->st.finished++;
    c->st.finished++;
    if (cc->tpot_target_us && r->generated > 1) {
        double tpot = (double)(now - r->first_token_us) / (double)(r->generated - 1);
        if (tpot <= (double)cc->tpot_target_us) c->st.tpot_met++; else c->st.tpot_missed++;
    }
    sched_event e = ev_of(s, SCHED_EV_FINISH, r, now);
    e.finish = why;
    e.prompt_tokens = r->prompt_len;
    e.output_tokens = r->generated;
    e.wait_us = r->first_token_us ? r->first_token_us - r->arrival_us : 0;
    e.policy = sched_policy_hash_hex(s->policy);
    emit(s, &e);
    if (s->cfg.mode == SCHED_MODE_STATIC) {
        /* static batching holds the slot (and its padding) until the slowest member ends */
        r->held = true;
        return;
    }
    detach(s, slot);
    release_now(s, slot, now, false);
}

/* ---------------------------------------------------------------------------------------- */
/* Submit / cancel / backpressure                                                           */
/* ---------------------------------------------------------------------------------------- */

static int reject(sched *s, const sched_request *q, int tenant, int cls, sched_reject_reason why,
                  int rc, uint64_t now, sched_reject_reason *out)
{
    if (out) *out = why;
    if (tenant >= 0) s->ts[tenant].st.rejects[why]++;
    if (cls >= 0) s->cs[cls].st.rejects[why]++;
    sched_event e;
    memset(&e, 0, sizeof(e));
    e.t_us = now;
    e.kind = SCHED_EV_REJECT;
    e.req = q ? q->id : 0;
    e.tenant = tenant >= 0 ? s->ten[tenant]->name : (q ? q->tenant_name : NULL);
    e.class_name = cls >= 0 ? s->cls[cls]->name : (q ? q->class_name : NULL);
    e.reject = why;
    e.prompt_tokens = q ? q->prompt_len : 0;
    e.max_tokens = q ? q->max_new_tokens : 0;
    emit(s, &e);
    sched__set_error("request %llu rejected: %s", (unsigned long long)(q ? q->id : 0),
                     sched_reject_name(why));
    return rc;
}

/* Predicted wait before the first token for a request of class cls with `prompt` tokens:
 * the queued prompt work of classes at least as important, at the measured prefill rate of a
 * step that also carries today's decoders. */
static double predict_wait_us(const sched *s, int cls, uint32_t prompt, uint64_t now)
{
    uint64_t ahead = prompt;
    uint64_t head_age = 0;
    for (int c = 0; c < s->n_classes; c++) {
        if (s->cls[c]->priority < s->cls[cls]->priority) continue;
        ahead += s->cs[c].queued_tokens;
        if (!s->cs[c].n_waiting) continue;
        const heap *row = &s->wait[(size_t)c * (size_t)s->n_tenants];
        for (int t = 0; t < s->n_tenants; t++) {
            if (!row[t].n) continue;
            const req *h = &s->reqs[row[t].a[0].slot];
            if (!h->started && now > h->arrival_us && now - h->arrival_us > head_age) head_age = now - h->arrival_us;
        }
    }
    if (s->rate_us >= 200000) {
        /* measured: prompt tokens actually prefilled per µs while work was waiting.  This
         * sees what the model cannot — max_active_seqs binding, KV blocks short, decodes
         * crowding the budget — so it is preferred once there is enough history.  When
         * admissions come in clumps (KV freed by bursts of finishing sequences) the rate
         * lags; the age of the oldest request still waiting is then the better witness of
         * how long the queue takes to drain, so the larger of the two is used. */
        double rate = s->rate_tok / s->rate_us;
        if (rate < 1e-6) rate = 1e-6;
        double w = (double)ahead / rate;
        return w > (double)head_age ? w : (double)head_age;
    }
    uint64_t dec = s->run.n;
    uint64_t budget = s->cfg.token_budget;
    uint64_t per_step = budget > dec ? budget - dec : 1;
    double step = predict_step_us(s, per_step, dec, s->plan.context_tokens);
    return ceil((double)ahead / (double)per_step) * step;
}

int sched_submit(sched *s, const sched_request *q, uint64_t now, sched_reject_reason *why)
{
    if (why) *why = SCHED_REJECT_NONE;
    if (!s) { sched__set_error("sched_submit: scheduler is NULL"); return -EINVAL; }
    if (!q) return reject(s, NULL, -1, -1, SCHED_REJECT_INVALID, -EINVAL, now, why);
    if (q->prompt_len == 0 || q->max_new_tokens == 0)
        return reject(s, q, -1, -1, SCHED_REJECT_INVALID, -EINVAL, now, why);
    if (map_get(s, q->id) != NO_SLOT)
        return reject(s, q, -1, -1, SCHED_REJECT_DUPLICATE, -EEXIST, now, why);
    int cls = q->class_idx >= 0 ? (q->class_idx < s->n_classes ? q->class_idx : -ENOENT)
                                : sched_policy_class_index(s->policy, q->class_name);
    if (cls < 0) return reject(s, q, -1, -1, SCHED_REJECT_UNKNOWN_CLASS, -EINVAL, now, why);
    int ten = q->tenant >= 0 ? (q->tenant < s->n_tenants ? q->tenant : -ENOENT)
                             : sched_policy_tenant_index(s->policy, q->tenant_name);
    if (ten < 0) return reject(s, q, -1, cls, SCHED_REJECT_UNKNOWN_TENANT, -EINVAL, now, why);
    uint64_t total = (uint64_t)q->prompt_len + q->max_new_tokens;
    if (total > s->conf.max_context)
        return reject(s, q, ten, cls, SCHED_REJECT_TOO_LONG, -E2BIG, now, why);
    uint32_t blocks = div_up(total, s->conf.block_size);
    uint32_t tmax = s->ten[ten]->max_kv_blocks;
    if (blocks > s->conf.kv_blocks_device || (tmax && blocks > tmax))
        return reject(s, q, ten, cls, SCHED_REJECT_NEVER_FITS, -E2BIG, now, why);
    const sched_tenant_cfg *tc = s->ten[ten];
    if (tc->max_queued_tokens && s->ts[ten].st.queued_tokens + q->prompt_len > tc->max_queued_tokens)
        return reject(s, q, ten, cls, SCHED_REJECT_TENANT_QUOTA, -EAGAIN, now, why);
    if ((s->cfg.queue_max_requests && s->n_waiting + 1 > s->cfg.queue_max_requests) ||
        (s->cfg.queue_max_tokens && s->queued_tokens + q->prompt_len > s->cfg.queue_max_tokens))
        return reject(s, q, ten, cls, SCHED_REJECT_QUEUE_FULL, -EAGAIN, now, why);
    uint64_t arrival = q->arrival_us && q->arrival_us <= now ? q->arrival_us : now;
    uint64_t mw = s->cls[cls]->max_queue_wait_us;
    if (q->deadline_us || mw) {
        double wait = predict_wait_us(s, cls, q->prompt_len, now);
        double waited = (double)(now - arrival);
        if (mw && waited + wait > s->cs[cls].headroom * (double)mw)
            return reject(s, q, ten, cls, SCHED_REJECT_DEADLINE, -ETIME, now, why);
        if (q->deadline_us) {
            double dec_step = predict_step_us(s, 0, s->run.n + 1, 0);
            if ((double)now + wait + (double)(q->max_new_tokens - 1) * dec_step > (double)q->deadline_us)
                return reject(s, q, ten, cls, SCHED_REJECT_DEADLINE, -ETIME, now, why);
        }
    }

    /* take a slot */
    uint32_t slot;
    if (s->free_slots.n) slot = s->free_slots.a[--s->free_slots.n];
    else {
        if (!vec_grow((void **)&s->reqs, &s->cap_slots, s->n_slots + 1, sizeof(req))) goto oom;
        slot = s->n_slots++;
        memset(&s->reqs[slot], 0, sizeof(req));
    }
    req *r = &s->reqs[slot];
    uint32_t *dev = r->dev, cd = r->cap_dev, *tb = r->tierb, ct = r->cap_tier;
    memset(r, 0, sizeof(*r));
    r->dev = dev; r->cap_dev = cd; r->tierb = tb; r->cap_tier = ct;
    r->id = q->id;
    r->live = 1;
    r->tenant = (uint16_t)ten;
    r->cls = (uint16_t)cls;
    r->prompt_len = q->prompt_len;
    r->max_new = q->max_new_tokens;
    r->arrival_us = arrival;
    r->deadline_us = q->deadline_us;
    r->q_pos = r->t_pos = r->bp_pos = r->run_pos = NO_POS;
    if (map_put(s, q->id, slot)) { VEC_PUSH(s, s->free_slots, slot); r->live = 0; goto oom; }

    /* a tenant returning from idle is lifted to the minimum of the active counters, so idling
     * earns no credit to burst past everyone later */
    tenant_state *t = &s->ts[ten];
    if (t->n_live == 0) {
        double mn = INFINITY;
        for (int i = 0; i < s->n_tenants; i++)
            if (s->ts[i].n_live && s->ts[i].vt < mn) mn = s->ts[i].vt;
        if (mn != INFINITY && t->vt < mn) t->vt = mn;
    }
    t->n_live++;
    t->st.admitted++;
    s->cs[cls].st.admitted++;
    waiting_add(s, slot);
    timer_update(s, slot);
    sched_event e = ev_of(s, SCHED_EV_ADMIT, r, now);
    e.prompt_tokens = r->prompt_len;
    e.max_tokens = r->max_new;
    emit(s, &e);
    return s->oom ? -ENOMEM : 0;
oom:
    sched__set_error("sched_submit: out of memory");
    return -ENOMEM;
}

int sched_cancel(sched *s, uint64_t id, uint64_t now, sched_cancel_reason why)
{
    if (!s) return -EINVAL;
    uint32_t slot = map_get(s, id);
    if (slot == NO_SLOT || s->reqs[slot].state == SCHED_REQ_ENDED || s->reqs[slot].held) {
        sched__set_error("sched_cancel: request %llu is not live", (unsigned long long)id);
        return -ENOENT;
    }
    if ((unsigned)why >= SCHED_CANCEL__COUNT) why = SCHED_CANCEL_CLIENT;
    do_cancel(s, slot, why, now, false);
    return 0;
}

int sched_set_output_blocked(sched *s, uint64_t id, bool blocked, uint64_t now)
{
    if (!s) return -EINVAL;
    uint32_t slot = map_get(s, id);
    if (slot == NO_SLOT || s->reqs[slot].state == SCHED_REQ_ENDED) {
        sched__set_error("sched_set_output_blocked: request %llu is not live", (unsigned long long)id);
        return -ENOENT;
    }
    req *r = &s->reqs[slot];
    if (r->blocked == blocked) return 0;
    r->blocked = blocked;
    if (r->run_pos >= 0) s->n_blocked += blocked ? 1 : (uint32_t)-1;
    if (blocked) {
        r->blocked_since = now;
        if (s->cfg.backpressure_timeout_us)
            hpush(s, &s->bp_timers, now + s->cfg.backpressure_timeout_us, id, slot);
        emit_defer(s, r, SCHED_DEFER_BACKPRESSURE, now);
    } else {
        hremove(s, &s->bp_timers, slot);
        r->defer = SCHED_DEFER_NONE;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Plan building blocks                                                                     */
/* ---------------------------------------------------------------------------------------- */

static void add_entry(sched *s, uint32_t slot, uint32_t n, bool prefill)
{
    req *r = &s->reqs[slot];
    uint32_t k = known(r);
    sched_entry e = {
        .req = r->id,
        .start_pos = r->computed,
        .n_tokens = n,
        .samples = r->computed + n >= k,
        .prefill = prefill,
        .tenant = r->tenant,
        .class_idx = r->cls,
        .n_blocks = div_up((uint64_t)r->computed + n, s->conf.block_size),
        .blocks = r->dev,
    };
    r->entry_step = s->step_no;
    r->entry_idx = s->entries.n;
    r->defer = SCHED_DEFER_NONE;
    VEC_PUSH(s, s->entries, e);
    s->plan.context_tokens += (uint64_t)r->computed + n;
    if (prefill) {
        s->plan.n_prefill++;
        s->plan.prefill_tokens += n;
        /* prompt work is charged when it is scheduled: fair share follows the compute given.
         * Re-prefill after a recompute preemption is not charged again: the tenant did not
         * choose to lose that work. */
        uint32_t end = r->computed + n;
        uint32_t fresh = end > r->charged_upto ? end - (r->computed > r->charged_upto ? r->computed : r->charged_upto) : 0;
        if (end > r->charged_upto) r->charged_upto = end;
        double w = s->ten[r->tenant]->weight;
        s->ts[r->tenant].vt += (double)fresh / w;
        if (s->ten[r->tenant]->token_rate_per_s > 0) s->ts[r->tenant].bucket -= fresh;
    } else {
        s->plan.n_decode++;
        s->plan.decode_tokens += n;
    }
}

static inline bool is_decoder(const req *r)
{
    return r->generated > 0 && r->computed + 1 == known(r);
}
static inline bool needs_block(const sched *s, const req *r)
{
    return div_up((uint64_t)r->computed + 1, s->conf.block_size) > r->n_dev;
}
static inline double eff_priority(const sched *s, int cls, uint64_t arrival, uint64_t now)
{
    const sched_class_cfg *c = s->cls[cls];
    double wait_s = now > arrival ? (double)(now - arrival) / 1e6 : 0;
    return (double)c->priority + c->aging_per_s * wait_s;
}

/* Victim order: lowest class first, then least work lost (fewest computed tokens), then the
 * newest.  Continuous mode (the baseline) simply takes the newest arrival. */
static int victim_cmp(const void *a, const void *b, void *ctx)
{
    const sched *s = ctx;
    const req *x = &s->reqs[*(const uint32_t *)a], *y = &s->reqs[*(const uint32_t *)b];
    if (s->cfg.mode != SCHED_MODE_CONTINUOUS) {
        int32_t px = s->cls[x->cls]->priority, py = s->cls[y->cls]->priority;
        if (px != py) return px < py ? -1 : 1;
        if (x->computed != y->computed) return x->computed < y->computed ? -1 : 1;
    }
    if (x->arrival_us != y->arrival_us) return x->arrival_us > y->arrival_us ? -1 : 1;
    return x->id > y->id ? -1 : (x->id < y->id);
}

static bool victim_eligible(const sched *s, const req *r, uint64_t now)
{
    if (r->state != SCHED_REQ_RUNNING || r->held) return false;
    if (s->cfg.mode == SCHED_MODE_CONTINUOUS || s->forced) return true;
    if (s->cfg.max_preemptions && r->preemptions >= s->cfg.max_preemptions) return false;
    if (r->resumed_at && now - r->resumed_at < s->cfg.min_residency_us) return false;
    return true;
}

static void build_victims(sched *s, uint64_t now)
{
    s->victims.n = 0;
    s->victim_next = 0;
    for (uint32_t i = 0; i < s->run.n; i++)
        if (victim_eligible(s, &s->reqs[s->run.a[i]], now)) VEC_PUSH(s, s->victims, s->run.a[i]);
    if (s->victims.n > 1) qsort_r(s->victims.a, s->victims.n, sizeof(uint32_t), victim_cmp, s);
    s->victims_built = true;
}

/* Next victim for `needer` (restricted to tenant `only_tenant` when >= 0).  Returns the
 * needer itself when every remaining candidate ranks above it and it is eligible, NO_SLOT when
 * nothing may be preempted. */
static uint32_t pick_victim(sched *s, uint32_t needer, int only_tenant, uint64_t now)
{
    if (!s->victims_built) build_victims(s, now);
    const req *n = &s->reqs[needer];
    for (uint32_t i = s->victim_next; i < s->victims.n; i++) {
        uint32_t v = s->victims.a[i];
        const req *r = &s->reqs[v];
        if (r->state != SCHED_REQ_RUNNING || !victim_eligible(s, r, now)) {
            if (i == s->victim_next) s->victim_next++;
            continue;
        }
        if (only_tenant >= 0 && r->tenant != only_tenant) continue;
        if (v == needer) return v;
        if (s->cfg.mode != SCHED_MODE_CONTINUOUS &&
            s->cls[r->cls]->priority > s->cls[n->cls]->priority)
            break;   /* everything left ranks above the needer */
        return v;
    }
    return victim_eligible(s, n, now) ? needer : NO_SLOT;
}

/* Pick the tier a swap-out would use: host first (fastest), disk when the host is full. */
static int swap_tier(const sched *s, uint32_t blocks)
{
    if (s->pools[SCHED_POOL_HOST].total && s->pools[SCHED_POOL_HOST].n_free >= blocks) return SCHED_POOL_HOST;
    if (s->pools[SCHED_POOL_DISK].total && s->pools[SCHED_POOL_DISK].n_free >= blocks) return SCHED_POOL_DISK;
    return -1;
}

static double swap_cost_us(const sched *s, int tier, uint64_t bytes)
{
    const tier_est *t = &s->tiers[tier];
    /* transfers already queued on the link delay this one: swapping can become the second
     * bottleneck, and then recompute wins even for long contexts */
    return ((double)t->queued_out + (double)bytes) / t->out_bps * 1e6 +
           ((double)t->queued_in + (double)bytes) / t->in_bps * 1e6 + 2.0 * t->lat_us;
}

static void plan_transfer(sched *s, uint32_t slot, sched_xfer_dir dir, uint64_t now)
{
    req *r = &s->reqs[slot];
    uint32_t n = r->n_tier;
    uint64_t bytes = (uint64_t)n * s->conf.block_size * s->conf.kv_bytes_per_token;
    const tier_est *te = &s->tiers[r->tier];
    double pred = dir == SCHED_XFER_OUT ? ((double)te->queued_out + (double)bytes) / te->out_bps * 1e6
                                        : ((double)te->queued_in + (double)bytes) / te->in_bps * 1e6;
    pred += te->lat_us;
    xfer_rec x = {s->next_xfer++, slot, (uint8_t)dir, r->tier, bytes, pred};
    r->xfer = x.id;
    r->moving = true;
    VEC_PUSH(s, s->xfers, x);
    uint32_t off = s->xfer_blocks.n;
    if (!vec_grow((void **)&s->xfer_blocks.a, &s->xfer_blocks.cap, off + 2 * n, sizeof(uint32_t))) {
        s->oom = true;
        return;
    }
    const uint32_t *src = dir == SCHED_XFER_OUT ? r->dev : r->tierb;
    const uint32_t *dst = dir == SCHED_XFER_OUT ? r->tierb : r->dev;
    memcpy(s->xfer_blocks.a + off, src, n * sizeof(uint32_t));
    memcpy(s->xfer_blocks.a + off + n, dst, n * sizeof(uint32_t));
    s->xfer_blocks.n = off + 2 * n;   /* the next transfer of this plan goes after these */
    sched_transfer t = {x.id, r->id, dir, (sched_pool)r->tier, n, NULL, NULL, bytes, pred};
    /* pointers fixed up when the plan is sealed (xfer_blocks may still move) */
    t.src = (const uint32_t *)(uintptr_t)off;
    t.dst = (const uint32_t *)(uintptr_t)(off + n);
    VEC_PUSH(s, s->transfers, t);
    if (dir == SCHED_XFER_OUT) s->tiers[r->tier].queued_out += bytes;
    else s->tiers[r->tier].queued_in += bytes;
    s->n_in_transit++;
    sched_event e = ev_of(s, dir == SCHED_XFER_OUT ? SCHED_EV_SWAP_OUT : SCHED_EV_SWAP_IN, r, now);
    e.xfer = x.id;
    e.blocks = n;
    e.bytes = bytes;
    e.pool = (sched_pool)r->tier;
    emit(s, &e);
}

/* Recompute preemption: drop the KV now, go back to the queue at the original place. */
static void to_recompute(sched *s, uint32_t slot, uint64_t now)
{
    req *r = &s->reqs[slot];
    dev_free_all(s, r);
    r->computed = 0;
    r->recompute = true;
    waiting_add(s, slot);
    rc_start(s, r, now);
}

/* Preempt `slot` (a RUNNING sequence).  Returns the blocks freed immediately (recompute) or 0
 * (swap: freed when the transfer completes; timeout: released now and counted). */
static uint32_t preempt(sched *s, uint32_t slot, bool quota, uint64_t now)
{
    req *r = &s->reqs[slot];
    uint32_t blocks = r->n_dev;
    uint64_t bytes = (uint64_t)blocks * s->conf.block_size * s->conf.kv_bytes_per_token;
    int tier = s->cfg.mode == SCHED_MODE_CONTINUOUS || s->cfg.preemption == SCHED_PREEMPT_RECOMPUTE
                   ? -1 : swap_tier(s, blocks);
    double sw = tier >= 0 ? swap_cost_us(s, tier, bytes) : -1;
    double rc = prefill_us(s, r->computed);
    if (s->run.n > 1) rc += prefill_us(s, r->computed);   /* stall: each other sequence waits
                                                             through the re-prefill's steps */
    bool swap = tier >= 0 && (s->cfg.preemption == SCHED_PREEMPT_SWAP || sw < rc);
    double best = swap ? sw : rc;
    if (r->rc_active) rc_end(s, r, SCHED_OUTCOME_ABANDONED, now);   /* before this preemption's events */
    r->pre_sw_us = sw;
    r->pre_rc_us = rc;
    r->pre_len = r->computed;
    r->out_us = 0;
    run_remove(s, slot);
    r->skip_pass = s->pass_no;
    r->preempt_step = s->step_no;
    r->preemptions++;
    r->defer = SCHED_DEFER_NONE;
    sched_event e = ev_of(s, SCHED_EV_PREEMPT, r, now);
    e.defer = quota ? SCHED_DEFER_QUOTA : SCHED_DEFER_BLOCKS;
    e.mode = swap ? SCHED_PREEMPT_SWAP : SCHED_PREEMPT_RECOMPUTE;
    e.blocks = blocks;
    e.swap_cost_us = sw;
    e.recompute_cost_us = rc;
    VEC_PUSH(s, s->preempts, ((sched_preemption){r->id, swap ? SCHED_PREEMPT_SWAP : SCHED_PREEMPT_RECOMPUTE,
                                                  blocks, sw, rc}));
    if (r->deadline_us && (double)now + best > (double)r->deadline_us) {
        /* neither way brings it back in time: say so now instead of wasting the work */
        e.mode = SCHED_PREEMPT_NONE;
        emit(s, &e);
        s->preempts.n--;
        r->end_kind = SCHED_EV_TIMEOUT;
        s->ts[r->tenant].st.timeouts[SCHED_TIMEOUT_PREEMPT]++;
        s->cs[r->cls].st.timeouts[SCHED_TIMEOUT_PREEMPT]++;
        sched_event t = ev_of(s, SCHED_EV_TIMEOUT, r, now);
        t.timeout = SCHED_TIMEOUT_PREEMPT;
        t.wait_us = now - r->arrival_us;
        emit(s, &t);
        VEC_PUSH(s, s->ended, ((sched_ended){.req = r->id, .kind = SCHED_EV_TIMEOUT,
                                             .timeout = SCHED_TIMEOUT_PREEMPT}));
        r->state = SCHED_REQ_ENDED;
        release_now(s, slot, now, true);
        return blocks;
    }
    emit(s, &e);
    if (swap) {
        s->ts[r->tenant].st.preemptions_swap++;
        s->cs[r->cls].st.preemptions_swap++;
        r->tier = (uint8_t)tier;
        if (!vec_grow((void **)&r->tierb, &r->cap_tier, blocks, sizeof(uint32_t))) { s->oom = true; return 0; }
        for (uint32_t i = 0; i < blocks; i++) r->tierb[i] = pool_take(&s->pools[tier]);
        r->n_tier = blocks;
        r->state = SCHED_REQ_SWAPPING_OUT;
        s->pending_out_blocks += blocks;
        s->ts[r->tenant].pending_out += blocks;
        plan_transfer(s, slot, SCHED_XFER_OUT, now);
        return 0;
    }
    s->ts[r->tenant].st.preemptions_recompute++;
    s->cs[r->cls].st.preemptions_recompute++;
    to_recompute(s, slot, now);
    return blocks;
}

/* ---- decode phase (token_budget and continuous) --------------------------------------- */

/* Give every running decoder its token (latency-sensitive classes first), growing block
 * tables and preempting when blocks run out.  Returns decode tokens planned; *ls_decoding
 * says whether a latency-sensitive sequence decodes; *tpot_min the tightest TPOT target. */
static uint32_t plan_decodes(sched *s, uint64_t now, uint32_t budget, bool *ls_decoding,
                             uint64_t *tpot_min)
{
    s->dec.n = 0;
    s->pass_no++;
    bool ls_first = s->cfg.mode == SCHED_MODE_TOKEN_BUDGET;
    /* When the budget cannot hold every decoder, who waits rotates step by step (the start
     * of the scan moves), so no running sequence is skipped forever. */
    uint32_t start = s->run.n ? (uint32_t)(s->step_no % s->run.n) : 0;
    for (int pass = 0; pass < (ls_first ? 2 : 1); pass++)
        for (uint32_t j = 0; j < s->run.n; j++) {
            uint32_t i = start + j < s->run.n ? start + j : start + j - s->run.n;
            uint32_t sl = s->run.a[i];
            req *r = &s->reqs[sl];
            if (r->blocked || r->held || !is_decoder(r)) continue;
            if (ls_first && s->cls[r->cls]->latency_sensitive != (pass == 0)) continue;
            VEC_PUSH(s, s->dec, sl);
        }
    uint32_t n = s->dec.n < budget ? s->dec.n : budget;
    uint64_t pending = s->pending_out_blocks;
    for (int t = 0; t < s->n_tenants; t++) s->ts[t].pend_step = s->ts[t].pending_out;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t sl = s->dec.a[k];
        req *r = &s->reqs[sl];
        if (r->skip_pass == s->pass_no || r->state != SCHED_REQ_RUNNING || !needs_block(s, r)) continue;
        for (;;) {
            uint32_t tmax = s->ten[r->tenant]->max_kv_blocks;
            bool quota = tmax && s->ts[r->tenant].kv_blocks >= tmax;
            if (!quota && dev_grow_to(s, r, r->n_dev + 1)) break;
            if (!quota && pending > 0) {
                /* a swap-out in flight will free blocks: wait for it rather than preempt more */
                pending--;
                r->skip_pass = s->pass_no;
                emit_defer(s, r, SCHED_DEFER_BLOCKS, now);
                break;
            }
            if (quota && s->ts[r->tenant].pend_step > 0) {
                /* the same for a tenant at its quota: one of its own swap-outs will make room */
                s->ts[r->tenant].pend_step--;
                r->skip_pass = s->pass_no;
                emit_defer(s, r, SCHED_DEFER_QUOTA, now);
                break;
            }
            uint32_t v = pick_victim(s, sl, quota ? r->tenant : -1, now);
            if (v == NO_SLOT) {
                r->skip_pass = s->pass_no;
                emit_defer(s, r, quota ? SCHED_DEFER_QUOTA : SCHED_DEFER_BLOCKS, now);
                break;
            }
            uint32_t held = s->reqs[v].n_dev;
            uint16_t vt = s->reqs[v].tenant;
            uint32_t freed = preempt(s, v, quota, now);
            if (!freed && held) {   /* swap: the others wait for its blocks */
                pending += held;
                s->ts[vt].pend_step += held;
            }
            if (v == sl) break;
            if (s->oom) break;
        }
    }
    uint32_t tokens = 0;
    *ls_decoding = false;
    *tpot_min = 0;
    for (uint32_t k = 0; k < s->dec.n; k++) {
        uint32_t sl = s->dec.a[k];
        req *r = &s->reqs[sl];
        if (r->state != SCHED_REQ_RUNNING || r->skip_pass == s->pass_no) continue;
        if (k >= n) { emit_defer(s, r, SCHED_DEFER_BUDGET, now); continue; }
        add_entry(s, sl, 1, false);
        tokens++;
        const sched_class_cfg *c = s->cls[r->cls];
        if (c->latency_sensitive) *ls_decoding = true;
        if (c->tpot_target_us && (!*tpot_min || c->tpot_target_us < *tpot_min)) *tpot_min = c->tpot_target_us;
    }
    return tokens;
}

/* ---- admission candidates ------------------------------------------------------------- */

typedef struct cand { int cls, tenant; uint32_t slot; bool swapped; } cand;

/* Class by effective priority (priority + aging × oldest wait), then — a swapped sequence of
 * that class before any new one — the tenant with the smallest virtual counter, then the
 * oldest request of that (class, tenant). */
static bool pick_candidate(sched *s, uint64_t now, uint64_t tenant_excl, uint32_t class_excl, cand *out)
{
    int best = -1;
    double best_prio = 0;
    for (int c = 0; c < s->n_classes; c++) {
        if (class_excl & (1u << c)) continue;
        class_state *cs = &s->cs[c];
        if (!cs->n_waiting && !cs->swapped.n) continue;
        uint64_t oldest = cs->swapped.n ? cs->swapped.a[0].k1 : INF_US;
        if (cs->n_waiting) {
            heap *row = &s->wait[(size_t)c * (size_t)s->n_tenants];
            for (int t = 0; t < s->n_tenants; t++)
                if (row[t].n && !(tenant_excl & (1ull << t)) && row[t].a[0].k1 < oldest) oldest = row[t].a[0].k1;
        }
        if (oldest == INF_US) continue;
        double p = eff_priority(s, c, oldest, now);
        if (best < 0 || p > best_prio) { best = c; best_prio = p; }
    }
    if (best < 0) return false;
    class_state *cs = &s->cs[best];
    if (cs->swapped.n) {
        uint32_t sl = cs->swapped.a[0].slot;
        *out = (cand){best, s->reqs[sl].tenant, sl, true};
        return true;
    }
    heap *row = &s->wait[(size_t)best * (size_t)s->n_tenants];
    int bt = -1;
    for (int t = 0; t < s->n_tenants; t++) {
        if (!row[t].n || (tenant_excl & (1ull << t))) continue;
        if (bt < 0 || s->ts[t].vt < s->ts[bt].vt) bt = t;
    }
    if (bt < 0) return false;
    *out = (cand){best, bt, row[bt].a[0].slot, false};
    return true;
}

/* Continuous mode: global FCFS over every queue. */
static bool pick_fcfs(sched *s, cand *out)
{
    const hent *best = NULL;
    for (int i = 0; i < s->n_classes * s->n_tenants; i++) {
        const hent *h = htop(&s->wait[i]);
        if (h && (!best || hless(h, best))) best = h;
    }
    if (!best) return false;
    const req *r = &s->reqs[best->slot];
    *out = (cand){r->cls, r->tenant, best->slot, false};
    return true;
}

/* Move a waiting request onto the device: allocate blocks for `blocks`, emit schedule (or
 * recompute). */
static void start_running(sched *s, uint32_t slot, uint32_t blocks, uint64_t now)
{
    req *r = &s->reqs[slot];
    waiting_remove(s, slot);
    dev_grow_to(s, r, blocks);
    bool resume = r->started;
    if (r->recompute) {
        sched_event e = ev_of(s, SCHED_EV_RECOMPUTE, r, now);
        e.tokens = known(r);
        emit(s, &e);
        r->recompute = false;
        r->resumed_at = now;
    }
    if (!resume) {
        uint64_t mw = s->cls[r->cls]->max_queue_wait_us;
        double *hr = &s->cs[r->cls].headroom;
        if (mw && (double)(now - r->arrival_us) < 0.5 * (double)mw && *hr < HEADROOM_MAX)
            *hr = *hr + 0.002 < HEADROOM_MAX ? *hr + 0.002 : HEADROOM_MAX;
    }
    r->started = true;
    run_add(s, slot);
    if (!resume) timer_update(s, slot);   /* queue-wait no longer applies, deadline does */
    sched_event e = ev_of(s, SCHED_EV_SCHEDULE, r, now);
    e.outcome = resume ? SCHED_OUTCOME_RESUME : SCHED_OUTCOME_START;
    e.blocks = r->n_dev;
    e.wait_us = now - r->arrival_us;
    emit(s, &e);
}

static uint32_t watermark(const sched *s)
{
    /* keep a sliver free so sequences just admitted can grow without preempting at once */
    return s->cfg.mode == SCHED_MODE_TOKEN_BUDGET && s->run.n ? s->pools[SCHED_POOL_DEVICE].total / 100 : 0;
}

/* ---- token budget mode ------------------------------------------------------------------- */

static void step_token_budget(sched *s, uint64_t now)
{
    const sched_policy_cfg *p = &s->cfg;
    bool ls;
    uint64_t tpot;
    uint32_t dtok = plan_decodes(s, now, p->token_budget, &ls, &tpot);
    if (!s->entries.n && !s->preempts.n && !s->xfers.n && s->dec.n) {
        /* every decoder needs a block, none is free, nothing is moving and every possible
         * victim is protected by its cap or residency: waive the protection once rather
         * than stall the whole service */
        s->forced = true;
        s->victims_built = false;
        dtok = plan_decodes(s, now, p->token_budget, &ls, &tpot);
        s->forced = false;
        s->victims_built = false;
    }
    uint32_t hold = ls ? p->decode_reserve_tokens : 0;
    uint32_t used = dtok > hold ? dtok : hold;
    uint32_t pbudget = p->token_budget > used ? p->token_budget - used : 0;
    if (tpot && pbudget) {
        /* keep the predicted step under the tightest TPOT target of who decodes now, but
         * never below one chunk, or admissions would starve behind a slow model */
        double base = predict_step_us(s, 0, dtok, s->plan.context_tokens);
        double per = s->conf.prefill_us_per_token * s->corr;
        double room = ((double)tpot - base) / per;
        uint32_t cap = room > (double)p->prefill_chunk ? (uint32_t)room : p->prefill_chunk;
        if (cap < pbudget) pbudget = cap;
    }

    /* running sequences part-way through a prefill first: they already hold their blocks */
    s->part.n = 0;
    for (uint32_t i = 0; i < s->run.n; i++) {
        uint32_t sl = s->run.a[i];
        req *r = &s->reqs[sl];
        if (r->blocked || r->held || is_decoder(r)) continue;
        if (r->entry_step == s->step_no) continue;
        VEC_PUSH(s, s->part, sl);
    }
    /* insertion sort by (effective priority desc, arrival asc): a short list */
    for (uint32_t i = 1; i < s->part.n; i++) {
        uint32_t x = s->part.a[i];
        const req *rx = &s->reqs[x];
        double px = eff_priority(s, rx->cls, rx->arrival_us, now);
        uint32_t j = i;
        while (j > 0) {
            const req *ry = &s->reqs[s->part.a[j - 1]];
            double py = eff_priority(s, ry->cls, ry->arrival_us, now);
            if (py > px || (py == px && (ry->arrival_us < rx->arrival_us ||
                                         (ry->arrival_us == rx->arrival_us && ry->id < rx->id))))
                break;
            s->part.a[j] = s->part.a[j - 1];
            j--;
        }
        s->part.a[j] = x;
    }
    for (uint32_t i = 0; i < s->part.n; i++) {
        uint32_t sl = s->part.a[i];
        req *r = &s->reqs[sl];
        if (!pbudget) { emit_defer(s, r, SCHED_DEFER_BUDGET, now); continue; }
        uint32_t n = known(r) - r->computed;
        if (n > p->prefill_chunk) n = p->prefill_chunk;
        if (n > pbudget) n = pbudget;
        if (!dev_grow_to(s, r, div_up((uint64_t)r->computed + n, s->conf.block_size))) {
            emit_defer(s, r, SCHED_DEFER_BLOCKS, now);
            continue;
        }
        add_entry(s, sl, n, true);
        pbudget -= n;
    }

    /* admissions: swap-ins and new (or recompute-preempted) sequences */
    uint64_t texcl = 0;
    uint32_t cexcl = 0;
    for (;;) {
        uint32_t active = s->run.n + s->n_swapping_in;
        cand c;
        if (!pick_candidate(s, now, texcl, cexcl, &c)) break;
        req *r = &s->reqs[c.slot];
        if (active >= p->max_active_seqs) { emit_defer(s, r, SCHED_DEFER_MAX_ACTIVE, now); break; }
        uint32_t fr = s->pools[SCHED_POOL_DEVICE].n_free;
        uint32_t tmax = s->ten[c.tenant]->max_kv_blocks;
        if (r->preempt_step == s->step_no) {   /* preempted in this very step: not back at once */
            if (c.swapped) cexcl |= 1u << c.cls;
            else texcl |= 1ull << c.tenant;
            continue;
        }
        /* a tenant with a KV quota keeps one block of growth per running sequence, or its
         * sequences would be admitted only to preempt each other at the next boundary */
        uint64_t grow = tmax ? s->ts[c.tenant].st.running + s->ts[c.tenant].moving_in : 0;
        if (c.swapped) {
            uint32_t need = r->n_tier;
            if (tmax && s->ts[c.tenant].kv_blocks + need + grow > tmax) {
                emit_defer(s, r, SCHED_DEFER_QUOTA, now);
                cexcl |= 1u << c.cls;   /* its class waits behind it */
                continue;
            }
            if (fr < need) { emit_defer(s, r, SCHED_DEFER_BLOCKS, now); break; }
            hremove(s, &s->cs[c.cls].swapped, c.slot);
            s->n_swapped--;
            dev_grow_to(s, r, need);
            r->state = SCHED_REQ_SWAPPING_IN;
            r->defer = SCHED_DEFER_NONE;
            s->n_swapping_in++;
            s->ts[c.tenant].moving_in++;
            plan_transfer(s, c.slot, SCHED_XFER_IN, now);
            continue;
        }
        if (!pbudget) { emit_defer(s, r, SCHED_DEFER_BUDGET, now); break; }
        if (s->ten[c.tenant]->token_rate_per_s > 0 && s->ts[c.tenant].bucket <= 0) {
            emit_defer(s, r, SCHED_DEFER_RATE, now);
            texcl |= 1ull << c.tenant;
            continue;
        }
        uint32_t need = div_up(known(r), s->conf.block_size);
        if (tmax && s->ts[c.tenant].kv_blocks + need + grow > tmax) {
            emit_defer(s, r, SCHED_DEFER_QUOTA, now);
            texcl |= 1ull << c.tenant;
            continue;
        }
        if (fr < need + watermark(s)) { emit_defer(s, r, SCHED_DEFER_BLOCKS, now); break; }
        start_running(s, c.slot, need, now);
        uint32_t n = known(r);
        if (n > p->prefill_chunk) n = p->prefill_chunk;
        if (n > pbudget) n = pbudget;
        add_entry(s, c.slot, n, true);
        pbudget -= n;
        if (s->oom) break;
    }
}

/* ---- continuous mode (baseline) ---------------------------------------------------------- */

static void step_continuous(sched *s, uint64_t now)
{
    const sched_policy_cfg *p = &s->cfg;
    bool ls;
    uint64_t tpot;
    uint32_t dtok = plan_decodes(s, now, UINT32_MAX, &ls, &tpot);
    uint32_t pbudget = p->token_budget > dtok ? p->token_budget - dtok : 0;
    /* sequences re-prefilling after a failed swap-in: whole remainder */
    for (uint32_t i = 0; i < s->run.n; i++) {
        uint32_t sl = s->run.a[i];
        req *r = &s->reqs[sl];
        if (r->blocked || is_decoder(r) || r->entry_step == s->step_no) continue;
        uint32_t n = known(r) - r->computed;
        if (!dev_grow_to(s, r, div_up(known(r), s->conf.block_size))) continue;
        add_entry(s, sl, n, true);
        pbudget = pbudget > n ? pbudget - n : 0;
    }
    bool any_prefill = s->plan.n_prefill > 0;
    for (;;) {
        cand c;
        if (!pick_fcfs(s, &c)) break;
        req *r = &s->reqs[c.slot];
        if (r->preempt_step == s->step_no) break;   /* FCFS head was just preempted: next step */
        if (s->run.n >= p->max_active_seqs) { emit_defer(s, r, SCHED_DEFER_MAX_ACTIVE, now); break; }
        uint32_t n = known(r);
        /* whole prompts; one longer than the budget runs alone (the baseline cannot slice) */
        if (n > pbudget && (any_prefill || dtok >= p->token_budget)) {
            emit_defer(s, r, SCHED_DEFER_BUDGET, now);
            break;
        }
        uint32_t need = div_up(n, s->conf.block_size);
        if (s->pools[SCHED_POOL_DEVICE].n_free < need) { emit_defer(s, r, SCHED_DEFER_BLOCKS, now); break; }
        start_running(s, c.slot, need, now);
        add_entry(s, c.slot, n, true);
        pbudget = pbudget > n ? pbudget - n : 0;
        any_prefill = true;
        if (s->oom) break;
    }
}

/* ---- static and dynamic modes (request-level groups) ------------------------------------- */

static void step_group(sched *s, uint64_t now)
{
    const sched_policy_cfg *p = &s->cfg;
    bool is_static = p->mode == SCHED_MODE_STATIC;
    if (s->group_active) {
        /* the group ends when every member has finished (static holds finished members) */
        bool all_done = true;
        for (uint32_t i = 0; i < s->run.n; i++)
            if (!s->reqs[s->run.a[i]].held) { all_done = false; break; }
        if (all_done) {
            while (s->run.n) {
                uint32_t sl = s->run.a[s->run.n - 1];
                detach(s, sl);
                release_now(s, sl, now, true);
            }
            s->group_active = false;
        }
    }
    if (!s->group_active && s->n_waiting) {
        uint32_t size = is_static ? p->static_batch_size : p->max_active_seqs;
        if (size > p->max_active_seqs) size = p->max_active_seqs;
        uint64_t oldest = INF_US;
        for (int i = 0; i < s->n_classes * s->n_tenants; i++)
            if (s->wait[i].n && s->wait[i].a[0].k1 < oldest) oldest = s->wait[i].a[0].k1;
        uint64_t window = is_static ? p->static_batch_timeout_us : p->dynamic_window_us;
        bool go = s->n_waiting >= size || (oldest != INF_US && now - oldest >= window);
        if (go) {
            uint64_t texcl = 0;
            uint32_t taken = 0, max_prompt = 0, sum_prompt = 0;
            while (taken < size) {
                cand c;
                if (!pick_candidate(s, now, texcl, 0, &c)) break;
                req *r = &s->reqs[c.slot];
                /* a group reserves prompt + max_new up front: it never preempts */
                uint32_t need = div_up((uint64_t)known(r) + (r->max_new - r->generated), s->conf.block_size);
                uint32_t tmax = s->ten[c.tenant]->max_kv_blocks;
                if (tmax && s->ts[c.tenant].kv_blocks + need > tmax) {
                    emit_defer(s, r, SCHED_DEFER_QUOTA, now);
                    texcl |= 1ull << c.tenant;
                    continue;
                }
                if (s->pools[SCHED_POOL_DEVICE].n_free < need) { emit_defer(s, r, SCHED_DEFER_BLOCKS, now); break; }
                start_running(s, c.slot, need, now);
                uint32_t n = known(r);
                add_entry(s, c.slot, n, true);
                if (n > max_prompt) max_prompt = n;
                sum_prompt += n;
                taken++;
            }
            if (taken) {
                s->group_active = true;
                if (is_static) s->plan.pad_tokens += taken * max_prompt - sum_prompt;
            }
        } else {
            /* say once that the head waits for its group */
            cand c;
            if (pick_candidate(s, now, 0, 0, &c)) emit_defer(s, &s->reqs[c.slot], SCHED_DEFER_BATCH, now);
        }
        return;
    }
    if (!s->group_active) return;
    for (uint32_t i = 0; i < s->run.n; i++) {
        uint32_t sl = s->run.a[i];
        req *r = &s->reqs[sl];
        if (r->held) { if (is_static) s->plan.pad_tokens++; continue; }
        if (r->blocked) continue;
        uint32_t n = known(r) - r->computed;
        if (n == 0) continue;
        add_entry(s, sl, n, n > 1 || r->generated == 0);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Step                                                                                     */
/* ---------------------------------------------------------------------------------------- */

void sched_plan_work_of(const sched_plan *p, sched_plan_work *w)
{
    memset(w, 0, sizeof *w);
    if (!p) return;
    w->prefill_tokens = (uint64_t)p->prefill_tokens + p->pad_tokens;
    w->decode_seqs = p->n_decode;
    w->context_tokens = p->context_tokens;
    for (uint32_t i = 0; i < p->n_entries; i++) {
        const sched_entry *e = &p->entries[i];
        double n = e->n_tokens;
        if (!e->prefill) {
            w->decode_context += (double)e->start_pos + n;
            continue;
        }
        w->prefill_seqs++;
        w->prefill_pairs += n * e->start_pos + n * (n - 1) / 2; /* each row attends to those before it */
    }
}

const sched_plan *sched_step(sched *s, uint64_t now)
{
    if (!s) { sched__set_error("sched_step: scheduler is NULL"); return NULL; }
    if (now < s->last_now) now = s->last_now;
    uint64_t dt = s->step_no ? now - s->last_now : 0;
    s->last_now = now;
    s->step_no++;
    s->oom = false;

    /* slots released before this step may be reused from now on (plan pointers of the
     * previous step are dead) */
    for (uint32_t i = 0; i < s->limbo.n; i++) VEC_PUSH(s, s->free_slots, s->limbo.a[i]);
    s->limbo.n = 0;
    /* releases since the last step become this plan's; new ones append */
    { VEC(sched_release) t; memcpy(&t, &s->rel_plan, sizeof(t));
      memcpy(&s->rel_plan, &s->rel_acc, sizeof(t)); memcpy(&s->rel_acc, &t, sizeof(t)); s->rel_acc.n = 0; }
    s->entries.n = s->transfers.n = s->xfer_blocks.n = s->preempts.n = s->ended.n = 0;
    s->victims_built = false;
    memset(&s->plan, 0, sizeof(s->plan));
    s->plan.now_us = now;
    s->plan.step_no = s->step_no;

    /* KV residency is charged to the tenant holding it, and the token rate refills */
    if (dt) {
        double secs = (double)dt / 1e6;
        for (int t = 0; t < s->n_tenants; t++) {
            tenant_state *ts = &s->ts[t];
            if (ts->kv_blocks)
                ts->vt += (double)ts->kv_blocks * secs * s->cfg.kv_charge_per_block_s / s->ten[t]->weight;
            double rate = s->ten[t]->token_rate_per_s;
            if (rate > 0) {
                ts->bucket += rate * secs;
                if (ts->bucket > rate) ts->bucket = rate;
            }
        }
    }

    /* 1. release cancelled sequences */
    for (uint32_t i = 0; i < s->cancel_pending.n; i++) release_now(s, s->cancel_pending.a[i], now, true);
    s->cancel_pending.n = 0;
    /* 2. timeouts: queue wait, deadlines, backpressure */
    while (s->timers.n && s->timers.a[0].k1 <= now) {
        uint32_t sl = s->timers.a[0].slot;
        req *r = &s->reqs[sl];
        hremove(s, &s->timers, sl);
        if (r->state == SCHED_REQ_ENDED || r->held) continue;
        bool dl = r->deadline_us && r->deadline_us <= now;
        end_timeout(s, sl, dl ? SCHED_TIMEOUT_DEADLINE : SCHED_TIMEOUT_QUEUE_WAIT, now);
    }
    while (s->bp_timers.n && s->bp_timers.a[0].k1 <= now) {
        uint32_t sl = s->bp_timers.a[0].slot;
        hremove(s, &s->bp_timers, sl);
        if (s->reqs[sl].state == SCHED_REQ_ENDED) continue;
        do_cancel(s, sl, SCHED_CANCEL_BACKPRESSURE, now, true);
    }

    /* 3. the batch */
    switch (s->cfg.mode) {
    case SCHED_MODE_TOKEN_BUDGET: step_token_budget(s, now); break;
    case SCHED_MODE_CONTINUOUS: step_continuous(s, now); break;
    default: step_group(s, now); break;
    }

    /* seal the plan */
    for (uint32_t i = 0; i < s->transfers.n; i++) {
        sched_transfer *t = &s->transfers.a[i];
        t->src = s->xfer_blocks.a + (uintptr_t)t->src;
        t->dst = s->xfer_blocks.a + (uintptr_t)t->dst;
    }
    sched_plan *pl = &s->plan;
    pl->releases = s->rel_plan.a;      pl->n_releases = s->rel_plan.n;
    pl->entries = s->entries.a;        pl->n_entries = s->entries.n;
    pl->transfers = s->transfers.a;    pl->n_transfers = s->transfers.n;
    pl->preemptions = s->preempts.a;   pl->n_preemptions = s->preempts.n;
    pl->ended = s->ended.a;            pl->n_ended = s->ended.n;
    pl->predicted_step_us = pl->n_entries
        ? predict_step_us(s, pl->prefill_tokens + pl->pad_tokens, pl->n_decode, pl->context_tokens) : 0;
    s->last_pred_us = pl->predicted_step_us;
    /* the rate measured over this step is a capacity figure only if work was left waiting */
    s->plan_backlogged = s->n_waiting > 0;
    if (s->oom) { sched__set_error("sched_step: out of memory"); return NULL; }
    return pl;
}

/* ---------------------------------------------------------------------------------------- */
/* Commit and transfer completions                                                          */
/* ---------------------------------------------------------------------------------------- */

int sched_commit(sched *s, sched_result *res, size_t n, uint64_t now, uint64_t step_us)
{
    if (!s || (n && !res)) { sched__set_error("sched_commit: NULL argument"); return -EINVAL; }
    if (now < s->last_now) now = s->last_now;
    uint64_t prefilled = 0;
    for (size_t i = 0; i < n; i++) {
        sched_finish_reason given = res[i].finished;
        res[i].finished = SCHED_FINISH_NONE;   /* written back below when it ends here */
        uint32_t sl = map_get(s, res[i].req);
        if (sl == NO_SLOT) continue;
        req *r = &s->reqs[sl];
        if (r->entry_step != s->step_no || r->state != SCHED_REQ_RUNNING || r->held) continue;
        r->entry_step = 0;
        const sched_entry *e = &s->entries.a[r->entry_idx];
        if (r->rc_active) {   /* the whole step's duration: it waited for all of it */
            if (step_us) r->rc_us += step_us;
            else r->rc_unknown = true;
        }
        if (e->samples && res[i].tokens == 0) continue;   /* no token: no progress, replan */
        tenant_state *t = &s->ts[r->tenant];
        class_state *c = &s->cs[r->cls];
        r->computed += e->n_tokens;
        if (r->rc_active && r->computed >= r->pre_len) rc_end(s, r, SCHED_OUTCOME_DONE, now);
        if (e->prefill) {
            t->st.served_prompt_tokens += e->n_tokens;
            c->st.served_prompt_tokens += e->n_tokens;
            prefilled += e->n_tokens;
        }
        if (!e->samples) continue;
        r->generated++;
        t->st.served_output_tokens++;
        c->st.served_output_tokens++;
        t->vt += 1.0 / s->ten[r->tenant]->weight;
        if (s->ten[r->tenant]->token_rate_per_s > 0) t->bucket -= 1;
        if (!r->first_token_us) {
            r->first_token_us = now;
            uint64_t tt = s->cls[r->cls]->ttft_target_us;
            if (tt) { if (now - r->arrival_us <= tt) c->st.ttft_met++; else c->st.ttft_missed++; }
        }
        sched_finish_reason f = given == SCHED_FINISH_STOP ? SCHED_FINISH_STOP : SCHED_FINISH_NONE;
        if (!f && (given == SCHED_FINISH_LENGTH || r->generated >= r->max_new ||
                   known(r) >= s->conf.max_context))
            f = SCHED_FINISH_LENGTH;
        if (f) finish(s, sl, f, now);
        res[i].finished = f;
    }
    if (s->plan_backlogged && now > s->plan.now_us) {
        double dt = (double)(now - s->plan.now_us);
        double decay = exp(-dt / 5e5);
        s->rate_tok = s->rate_tok * decay + (double)prefilled;
        s->rate_us = s->rate_us * decay + dt;
        s->plan_backlogged = false;
    }
    if (step_us && s->last_pred_us > 0) {
        double ratio = (double)step_us / s->last_pred_us * s->corr;
        if (ratio < 0.01) ratio = 0.01;
        if (ratio > 100) ratio = 100;
        s->corr = 0.8 * s->corr + 0.2 * ratio;
        s->last_pred_us = 0;
    }
    return s->oom ? -ENOMEM : 0;
}

int sched_transfer_done(sched *s, uint64_t id, uint64_t now, uint64_t bytes, uint64_t dur_us,
                        int status)
{
    if (!s) return -EINVAL;
    uint32_t i;
    for (i = 0; i < s->xfers.n; i++)
        if (s->xfers.a[i].id == id) break;
    if (i == s->xfers.n) {
        sched__set_error("sched_transfer_done: transfer %llu unknown or already done", (unsigned long long)id);
        return -ENOENT;
    }
    xfer_rec x = s->xfers.a[i];
    memmove(s->xfers.a + i, s->xfers.a + i + 1, (s->xfers.n - i - 1) * sizeof(xfer_rec));
    s->xfers.n--;
    s->n_in_transit--;
    tier_est *te = &s->tiers[x.tier];
    if (x.dir == SCHED_XFER_OUT) te->queued_out -= x.bytes; else te->queued_in -= x.bytes;
    if (status == 0 && dur_us) {
        s->xfer_measured++;
        s->xfer_pred_sum += x.pred_us;
        s->xfer_real_sum += (double)dur_us;
    }
    if (status == 0 && bytes && dur_us) {
        /* measured bandwidth for this tier and direction: the first measurement replaces the
         * configured guess, later ones are averaged (EWMA); latency stays configured */
        double bps = (double)bytes / ((double)dur_us / 1e6);
        bool out = x.dir == SCHED_XFER_OUT;
        double *est = out ? &te->out_bps : &te->in_bps;
        bool *seen = out ? &te->out_measured : &te->in_measured;
        *est = *seen ? 0.7 * *est + 0.3 * bps : bps;
        *seen = true;
    }
    req *r = &s->reqs[x.slot];
    r->moving = false;
    {
        /* realised cost: swap_out — this transfer, predicted vs measured; swap_in — the round
         * trip, swap_cost_us at preemption vs measured out + in (null when either unknown) */
        bool out = x.dir == SCHED_XFER_OUT;
        sched_event e = ev_of(s, out ? SCHED_EV_SWAP_OUT : SCHED_EV_SWAP_IN, r, now);
        e.outcome = status < 0 ? SCHED_OUTCOME_FAILED : SCHED_OUTCOME_DONE;
        e.mode = SCHED_PREEMPT_SWAP;
        e.xfer = x.id;
        e.blocks = r->n_tier;
        e.bytes = x.bytes;
        e.pool = (sched_pool)x.tier;
        if (out) {
            r->out_us = status == 0 ? dur_us : 0;
            e.predicted_us = x.pred_us;
            e.realised_us = dur_us ? (double)dur_us : -1;
        }
        else {
            e.predicted_us = r->pre_sw_us;
            e.realised_us = r->out_us && dur_us ? (double)(r->out_us + dur_us) : -1;
        }
        emit(s, &e);
    }
    if (x.dir == SCHED_XFER_IN) {
        s->n_swapping_in--;
        s->ts[r->tenant].moving_in--;
    }
    else {
        s->pending_out_blocks -= r->n_dev;
        s->ts[r->tenant].pending_out -= r->n_dev;
    }
    if (r->state == SCHED_REQ_ENDED) {   /* cancelled or timed out while moving */
        release_now(s, x.slot, now, false);
        return 0;
    }
    if (x.dir == SCHED_XFER_OUT) {
        dev_free_all(s, r);
        if (status < 0) {   /* the copy failed: the host copy is useless, recompute */
            tier_free_all(s, r);
            r->computed = 0;
            r->recompute = true;
            waiting_add(s, x.slot);
            rc_start(s, r, now);
            return 0;
        }
        r->state = SCHED_REQ_SWAPPED;
        s->n_swapped++;
        hpush(s, &s->cs[r->cls].swapped, r->arrival_us, r->id, x.slot);
        return 0;
    }
    tier_free_all(s, r);
    if (status < 0) {   /* device copy is garbage: re-prefill in place */
        r->computed = 0;
        rc_start(s, r, now);
    }
    r->resumed_at = now;
    run_add(s, x.slot);
    sched_event e = ev_of(s, SCHED_EV_SCHEDULE, r, now);
    e.outcome = SCHED_OUTCOME_RESUME;
    e.blocks = r->n_dev;
    e.wait_us = now - r->arrival_us;
    emit(s, &e);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Queries                                                                                  */
/* ---------------------------------------------------------------------------------------- */

void sched_get_counts(const sched *s, sched_counts *o)
{
    if (!o) return;
    memset(o, 0, sizeof(*o));
    if (!s) return;
    o->waiting = s->n_waiting;
    o->running = s->run.n;
    o->swapped = s->n_swapped;
    o->in_transit = s->n_in_transit;
    o->blocked = s->n_blocked;
    o->queued_tokens = s->queued_tokens;
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        o->kv_total[p] = s->pools[p].total;
        o->kv_free[p] = s->pools[p].n_free;
        o->kv_used[p] = s->pools[p].total - s->pools[p].n_free;
    }
    o->steps = s->step_no;
    o->cost_correction = s->corr;
    o->transfers_measured = s->xfer_measured;
    o->transfer_predicted_us_sum = s->xfer_pred_sum;
    o->transfer_measured_us_sum = s->xfer_real_sum;
}

int sched_get_tenant_stats(const sched *s, int t, sched_group_stats *o)
{
    if (!s || !o || t < 0 || t >= s->n_tenants) return -ENOENT;
    *o = s->ts[t].st;
    o->kv_blocks = s->ts[t].kv_blocks;
    o->virtual_tokens = s->ts[t].vt;
    return 0;
}

int sched_get_class_stats(const sched *s, int c, sched_group_stats *o)
{
    if (!s || !o || c < 0 || c >= s->n_classes) return -ENOENT;
    *o = s->cs[c].st;
    o->admit_headroom = s->cs[c].headroom;
    uint32_t kv = 0;
    for (uint32_t i = 0; i < s->run.n; i++)
        if (s->reqs[s->run.a[i]].cls == c) kv += s->reqs[s->run.a[i]].n_dev;
    o->kv_blocks = kv;
    return 0;
}

int sched_get_request(const sched *s, uint64_t id, sched_req_info *o)
{
    if (!s || !o) return -EINVAL;
    uint32_t sl = map_get(s, id);
    if (sl == NO_SLOT) return -ENOENT;
    const req *r = &s->reqs[sl];
    memset(o, 0, sizeof(*o));
    o->state = (sched_req_state)r->state;
    o->tenant = r->tenant;
    o->class_idx = r->cls;
    o->prompt_len = r->prompt_len;
    o->generated = r->generated;
    o->computed = r->computed;
    o->blocks[SCHED_POOL_DEVICE] = r->n_dev;
    if (r->n_tier) o->blocks[r->tier] = r->n_tier;
    o->preemptions = r->preemptions;
    o->arrival_us = r->arrival_us;
    o->first_token_us = r->first_token_us;
    o->output_blocked = r->blocked;
    return 0;
}

int sched_check_invariants(const sched *s, char *why, size_t len)
{
#define BAD(...) do { if (why && len) snprintf(why, len, __VA_ARGS__); rc = -EUCLEAN; goto out; } while (0)
    int rc = 0;
    uint8_t *seen[SCHED_POOL__COUNT] = {0};
    if (!s) return -EINVAL;
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        seen[p] = calloc(s->pools[p].total + 1, 1);
        if (!seen[p]) { rc = -ENOMEM; goto out; }
        if (s->pools[p].n_free > s->pools[p].total)
            BAD("pool %s: %u free of %u", sched_pool_name((sched_pool)p), s->pools[p].n_free, s->pools[p].total);
        for (uint32_t i = 0; i < s->pools[p].n_free; i++) {
            uint32_t b = s->pools[p].free_ids[i];
            if (b >= s->pools[p].total || seen[p][b]++)
                BAD("pool %s: block %u free twice or out of range", sched_pool_name((sched_pool)p), b);
        }
    }
    uint32_t kv[SCHED_MAX_TENANTS] = {0}, live[SCHED_MAX_TENANTS] = {0};
    uint64_t qt[SCHED_MAX_TENANTS] = {0}, qtot = 0;
    uint32_t nwait = 0, nrun = 0, nswap = 0, ntransit = 0;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        const req *r = &s->reqs[i];
        if (!r->live && !(r->state == SCHED_REQ_ENDED && r->n_dev + r->n_tier > 0)) continue;
        if (!r->live) BAD("request %llu released but still holds %u+%u blocks",
                          (unsigned long long)r->id, r->n_dev, r->n_tier);
        live[r->tenant]++;
        for (uint32_t b = 0; b < r->n_dev; b++) {
            uint32_t id = r->dev[b];
            if (id >= s->pools[0].total || seen[0][id]++)
                BAD("device block %u of request %llu is free or shared", id, (unsigned long long)r->id);
        }
        for (uint32_t b = 0; b < r->n_tier; b++) {
            uint32_t id = r->tierb[b];
            if (id >= s->pools[r->tier].total || seen[r->tier][id]++)
                BAD("%s block %u of request %llu is free or shared", sched_pool_name((sched_pool)r->tier),
                    id, (unsigned long long)r->id);
        }
        kv[r->tenant] += r->n_dev;
        switch (r->state) {
        case SCHED_REQ_WAITING:
            nwait++; qt[r->tenant] += known(r); qtot += known(r);
            if (r->n_dev) BAD("waiting request %llu holds %u device blocks", (unsigned long long)r->id, r->n_dev);
            break;
        case SCHED_REQ_RUNNING:
            nrun++;
            if (r->run_pos < 0 || (uint32_t)r->run_pos >= s->run.n || s->run.a[r->run_pos] != i)
                BAD("running request %llu not in the run list", (unsigned long long)r->id);
            break;
        case SCHED_REQ_SWAPPED: nswap++; break;
        default: break;
        }
        if (r->moving) ntransit++;
        else if (r->state == SCHED_REQ_SWAPPING_IN || r->state == SCHED_REQ_SWAPPING_OUT)
            BAD("request %llu is moving by state but has no transfer in flight", (unsigned long long)r->id);
        if (map_get(s, r->id) != i) BAD("request %llu not found by id", (unsigned long long)r->id);
    }
    for (int p = 0; p < SCHED_POOL__COUNT; p++)
        for (uint32_t b = 0; b < s->pools[p].total; b++)
            if (seen[p][b] != 1)
                BAD("pool %s: block %u is %s", sched_pool_name((sched_pool)p), b,
                    seen[p][b] ? "owned twice" : "neither free nor owned (leaked)");
    for (int t = 0; t < s->n_tenants; t++) {
        if (kv[t] != s->ts[t].kv_blocks)
            BAD("tenant %s: counter says %u device blocks, sequences hold %u", s->ten[t]->name, s->ts[t].kv_blocks, kv[t]);
        if (qt[t] != s->ts[t].st.queued_tokens)
            BAD("tenant %s: counter says %llu queued tokens, queue holds %llu", s->ten[t]->name,
                (unsigned long long)s->ts[t].st.queued_tokens, (unsigned long long)qt[t]);
        if (live[t] != s->ts[t].n_live)
            BAD("tenant %s: %u live by counter, %u by scan", s->ten[t]->name, s->ts[t].n_live, live[t]);
    }
    if (qtot != s->queued_tokens) BAD("queued tokens %llu by counter, %llu by scan",
                                      (unsigned long long)s->queued_tokens, (unsigned long long)qtot);
    if (nwait != s->n_waiting || nrun != s->run.n || nswap != s->n_swapped || ntransit != s->n_in_transit)
        BAD("counts waiting %u/%u running %u/%u swapped %u/%u transit %u/%u (counter/scan)",
            s->n_waiting, nwait, s->run.n, nrun, s->n_swapped, nswap, s->n_in_transit, ntransit);
out:
    for (int p = 0; p < SCHED_POOL__COUNT; p++) free(seen[p]);
    return rc;
#undef BAD
}
