/* SPDX-License-Identifier: MIT */
/*
 * sched/internal.h — the scheduler's private types and the functions its files share.  Not
 * installed, not included outside sched/.
 *
 * The scheduler is cut along its concerns (each file says what it owns):
 *   store.c    requests, their state machine, queues, heaps, the id map, KV block pools
 *   cost.c     the cost model: every prediction and every observe_* update
 *   fair.c     fair share: the one virtual-token charge, candidate order
 *   admit.c    submit (admission checks, rejects), cancel, output backpressure
 *   preempt.c  victims, swap or recompute, transfers and their completion
 *   batch.c    the batching modes: token budget, continuous, static/dynamic groups
 *   sched.c    create/destroy, step, commit, ends and releases, queries, invariants
 *   order.c    prefix_order = longest_prefix: the cache-aware order within a class, with aging
 *   cache.c    the prefix cache's part: lookup at admission, insert at commit, holds released
 *              with the blocks, eviction on demand (the index itself: prefix.c)
 *   window.c   sliding windows: the blocks a sequence's attention window has passed
 *              given back (sched_config.attention_window), the blocks a start needs
 *   event.c    names, error detail, the JSON writer;  policy.c  the policy file
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
#ifndef RINGLM_SCHED_INTERNAL_H
#define RINGLM_SCHED_INTERNAL_H

#include "sched/prefix.h"
#include "sched/sched.h"
#include "sched/sched_testing.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


void sched__set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
sched_policy *sched__policy_clone(const sched_policy *p);

#define NO_POS       (-1)
/* Admission headroom on max_queue_wait: starts at 85%, shrinks by 10% for every queue-wait
 * timeout (the estimate was too optimistic), grows back slowly while starts stay well inside
 * the limit — a feedback loop that keeps overload ending in rejects at admission. */
#define HEADROOM_MAX 0.85
#define HEADROOM_MIN 0.30
#define NO_SLOT      UINT32_MAX
#define INF_US       UINT64_MAX
#define REQ_NEW      (SCHED_REQ_ENDED + 1) /* internal: a slot just taken, before admission */

/* ---------------------------------------------------------------------------------------- */
/* Types                                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct req {
    uint64_t id;
    uint8_t state;    /* sched_req_state; ENDED = release pending */
    uint8_t live;     /* slot in use (also while in limbo: 0) */
    uint8_t defer;    /* last defer reason emitted */
    uint8_t end_kind; /* sched_event_kind that ended it (CANCEL/TIMEOUT/FINISH) */
    uint8_t tier;     /* pool of tier_blocks (HOST/DISK) */
    bool blocked;     /* output backpressure */
    bool started;     /* ever held device KV */
    bool recompute;   /* next admission is a re-prefill after recompute */
    bool held;        /* static mode: finished, slot held until the group ends */
    bool moving;      /* a transfer of its KV is in flight (even after it ended) */
    bool sample;      /* submitted as another's sample (sched_request.sample) */
    bool parked;      /* preempted while output-blocked: WAITING or SWAPPED but in no queue (not
                         counted waiting), so it is not taken up again before its client reads;
                         sched_set_output_blocked(false) queues it */
    uint16_t tenant, cls;
    uint32_t prompt_len, max_new, generated, computed;
    uint32_t preemptions;
    uint32_t charged_upto; /* prompt positions already charged to the tenant */
    uint64_t arrival_us, deadline_us, first_token_us, blocked_since, resumed_at;
    uint64_t xfer; /* transfer in flight */
    int32_t q_pos, t_pos, bp_pos, run_pos;
    uint64_t entry_step; /* step_no of the plan holding its entry */
    uint32_t entry_idx;
    uint64_t skip_pass;    /* deferred in this decode pass (s->pass_no) */
    uint64_t preempt_step; /* step_no of its last preemption */
    /* realised cost of the last preemption, so the cost model can be checked (DESIGN §5):
     * the estimates made then, the length it had, and what the way back actually took */
    double pre_sw_us, pre_rc_us; /* swap_cost_us / recompute_cost_us at preemption */
    uint32_t pre_len;            /* computed length when preempted: the re-prefill target */
    bool rc_active;              /* re-prefilling after a recompute: summing step times */
    bool rc_unknown;             /* one of those steps had no measured duration */
    uint64_t rc_us;              /* summed durations of the steps that re-prefilled it */
    uint64_t out_us;             /* measured swap-out duration (0 = unknown) */
    uint32_t *dev;
    uint32_t n_dev, cap_dev;
    uint32_t ring; /* its window ring while it holds device blocks (SCHED_BLOCK_NONE: none) */
    /* attention window (window.c): dev[] entries given back (SCHED_BLOCK_NONE; n_dev counts
     * them, the blocks held are n_dev - n_rel), dev[0..rel_scan) already looked at; over a
     * swap the table's length and its given-back count (the entries stay NONE in dev[]) */
    uint32_t n_rel, rel_scan;
    uint32_t swap_len, swap_rel;
    uint32_t *tierb;
    uint32_t n_tier, cap_tier;
    uint32_t n_tier_ring; /* swapped with a window ring: tierb[n_tier..n_tier + n_tier_ring)
                             hold the ring's bytes (sched_transfer.ring_slots) */
    /* prefix cache (cache.c): its prompt's tokens and block keys (pcache: it takes part),
     * the index nodes it holds — dev[0..n_pnodes) are those nodes' blocks — and the nodes a
     * lookup found for the admission being considered */
    bool pcache;
    bool pgen; /* every generated token's id is known: ptok/pkeys grow with them */
    uint64_t salt;
    int32_t *ptok;
    uint32_t cap_ptok;
    sched_prefix_key *pkeys;
    uint32_t n_pkeys, cap_pkeys;
    uint32_t *pnodes;
    uint32_t n_pnodes, n_found, cap_pnodes;
    uint32_t cached_tokens; /* prompt tokens its first admission found cached */
    /* a cached run on host or disk it chose to recompute at admission: until computed reaches
     * px_rc_target, the full durations of its steps are summed — the realised cost that
     * cache_reload's completion record sets next to the recompute estimate */
    bool px_rc_active, px_rc_unknown;
    uint8_t px_rc_pool;
    uint32_t px_rc_target, px_rc_blocks;
    double px_rc_pred;
    uint64_t px_rc_us;
    /* cached runs reloading from host or disk (cache.c): it waits in SWAPPING_IN, like a
     * swap-in, while px_ld_n copies are in flight; pnodes[px_ld_a..px_ld_b) are those blocks
     * (still in their colder pool, marked loading) and dev[] of the same indexes where they
     * arrive; px_ld_fail is the first of them whose copy failed (px_ld_b: none) */
    uint32_t px_ld_a, px_ld_b, px_ld_fail;
    uint32_t px_ld_n;
    /* prefix_order = longest_prefix (order.c), while waiting: its cached prefix in blocks,
     * its place in the order heap, its first entry in the waiter table */
    uint32_t plen, ow_head;
    int32_t p_pos;
    /* copy-on-write (cow.c): a device block it holds a reference to (NO_SLOT: none), whose
     * first cow_len % block_size positions hold its tokens cow_len / block_size × block_size
     * onwards */
    uint32_t cow_blk, cow_len;
    /* ring snapshots (ringsnap.c): the cached blocks its first entry restores the windowed
     * layers' K/V of — the window before block snap_at (0: none; those slots are pinned
     * until then) —, and the slots it is taking (PENDING, owner this slot) */
    uint32_t snap_at, n_snap_pend;
    /* n samples admitted together (group.c): a first sample's other samples (grp_n) and the
     * blocks each needs to start (grp_each); the device blocks reserved for it or, for a
     * first sample, for its others (resv) */
    uint32_t grp_n, grp_each, resv;
} req;

typedef struct hent {
    uint64_t k1, k2;
    uint32_t slot;
} hent;
typedef struct heap {
    hent *a;
    uint32_t n, cap;
    uint8_t which;
} heap;
enum { POS_Q = 0, POS_T = 1, POS_BP = 2, POS_P = 3 };

typedef struct pool {
    uint32_t total;
    uint32_t *free_ids; /* stack */
    uint32_t n_free;
} pool;

typedef struct tenant_state {
    double vt;            /* virtual tokens / weight */
    double bucket;        /* token-rate bucket */
    uint32_t n_live;      /* requests not ended */
    uint32_t kv_blocks;   /* device blocks held */
    uint32_t pending_out; /* of those, blocks a swap-out in flight will free */
    uint32_t pend_step;   /* pending_out not yet waited on in this decode pass */
    uint32_t moving_in;   /* sequences of the tenant being swapped in */
    sched_group_stats st;
} tenant_state;

typedef struct class_state {
    double headroom; /* admit while predicted wait <= headroom × max_queue_wait */
    uint32_t n_waiting;
    uint64_t queued_tokens;
    heap swapped;
    sched_group_stats st;
} class_state;

typedef struct tier_est {
    double out_bps, in_bps, lat_us;
    uint64_t queued_out, queued_in;
    bool out_measured, in_measured;
} tier_est;

/* A transfer in flight.  cache: 0 a swap of request `slot`; XK_DEMOTE / XK_RELOAD a prefix
 * cache copy (cache.c): its destination pool and blocks (malloc'd) to invalidate should it
 * fail, the request a reload is for. */
enum { XK_SWAP = 0, XK_DEMOTE, XK_RELOAD };
typedef struct xfer_rec {
    uint64_t id;
    uint32_t slot;
    uint8_t dir, tier;
    uint64_t bytes;
    double pred_us;
    uint8_t cache, src_pool, dst_pool;
    uint32_t n;
    uint32_t *dst;
    uint64_t req;
    uint32_t run_a; /* XK_RELOAD: the request's pnodes[run_a..run_a + n) */
} xfer_rec;

/* A device block shared copy-on-write (cow.c): `refs` samples hold a reference to it; `owner`
 * says the usual books (a sequence's table) still hold it too.  It returns to the pool when
 * neither does. */
struct cow_ent {
    uint32_t block, refs;
    bool owner;
};

#define VEC(T)                                                                                     \
    struct {                                                                                       \
        T *a;                                                                                      \
        uint32_t n, cap;                                                                           \
    }
#define VEC_PUSH(s, v, x)                                                                          \
    do {                                                                                           \
        if ((v).n < (v).cap || sc_vec_grow((void **)&(v).a, &(v).cap, (v).n + 1, sizeof(*(v).a)))  \
            (v).a[(v).n++] = (x);                                                                  \
        else                                                                                       \
            (s)->oom = true;                                                                       \
    } while (0)

struct sched {
    sched_policy *policy;
    sched_policy_cfg cfg;
    sched_config conf;
    sched_event_fn sink;
    sched_kv_event_fn kv_sink; /* sched_set_kv_sink: the prefix cache's KV-cache events */
    void *kv_ctx;
    void *sink_ctx;
    uint64_t seed;
    int n_classes, n_tenants;
    const sched_class_cfg *cls[SCHED_MAX_CLASSES];
    const sched_tenant_cfg *ten[SCHED_MAX_TENANTS];
    tenant_state ts[SCHED_MAX_TENANTS];
    class_state cs[SCHED_MAX_CLASSES];
    heap *wait; /* [class * n_tenants + tenant] */
    heap timers, bp_timers;

    req *reqs;
    uint32_t n_slots, cap_slots;
    VEC(uint32_t) free_slots, limbo;
    uint32_t *map;
    uint32_t map_cap, map_n; /* id → slot */

    pool pools[SCHED_POOL__COUNT];
    pool rings; /* window rings (conf.window_rings): a sequence holding device blocks holds
                   one (req.ring) */
    uint32_t ring_tier_slots; /* tier slots a swapped ring takes (conf.window_ring_bytes) */
    /* ring snapshots (ringsnap.c, conf.window_snapshots): slot i is free, being taken or
     * holds one ring block, the windowed layers' K/V of the cached block keyed key; pins:
     * admitted requests whose first entry will restore it; used: a stamp for LRU; prot:
     * a hit used it (protected segment, snap_prot of them); owner, block: while PENDING, the
     * request slot taking it and which of its blocks. snap_hash maps keys to the slots in
     * use (snap_hcap entries, NONE empty), snap_free lists the free ones, snap_pend the
     * PENDING ones. */
    struct ring_snap {
        sched_prefix_key key;
        uint64_t used;
        uint32_t pins, owner, block;
        uint8_t state; /* RS_FREE, RS_PENDING (being taken), RS_READY */
        bool dead;     /* its block left the device while pinned: freed at the last unpin */
        bool prot;
    } * snaps;
    uint32_t n_snaps, snap_prot, snap_hcap, *snap_hash;
    VEC(uint32_t) snap_free;
    VEC(uint32_t) snap_pend;
    uint64_t snap_clock, snap_taken, snap_hits, snap_dropped;
    VEC(uint32_t) run;            /* RUNNING slots */
    VEC(uint32_t) cancel_pending; /* ENDED, release at next step */
    VEC(xfer_rec) xfers;          /* in flight */
    uint32_t n_waiting, n_swapped, n_in_transit, n_swapping_in, n_blocked, n_parked;
    uint64_t queued_tokens;
    uint64_t pending_out_blocks; /* device blocks that swap-outs will free */

    /* cost model */
    double corr;
    tier_est tiers[SCHED_POOL__COUNT];
    double last_pred_us;
    /* the step model's window (sched_config.step_window; 0: none): win_layers of
     * win_of layers read the last win positions */
    uint32_t win, win_layers, win_of;
    uint64_t xfer_measured;
    /* measured prefill rate under backlog (exponentially decayed sums, ~0.5 s memory) over
     * wall time: rate_mark_us is the last commit's time when work waited through it and the
     * next plan ran a batch (0: none), where the next backlogged step's interval starts */
    double rate_tok, rate_us;
    bool plan_backlogged;
    uint64_t rate_mark_us;
    double xfer_pred_sum, xfer_real_sum;

    /* burst_gather: a burst that found nothing running — its first and latest submits (the
     * submit's now); gathering until a step plans entries */
    bool gathering;
    uint64_t gather_first_us, gather_last_us;

    /* plan */
    uint64_t step_no, last_now;
    bool oom;
    sched_plan plan;
    VEC(sched_entry) entries;
    VEC(sched_ring_snapshot) snap_takes; /* the plan's ring_snapshots */
    /* the blocks the plan's entries complete (ringsnap.c): slots taken at sc_snap_seal */
    VEC(struct snap_want {
        uint32_t slot;
        uint32_t block;
    })
    snap_want;
    VEC(sched_release) rel_plan, rel_acc;
    VEC(sched_transfer) transfers;
    VEC(uint32_t) xfer_blocks;
    VEC(sched_preemption) preempts;
    VEC(sched_ended) ended;
    VEC(uint32_t) dec, part, victims;
    uint32_t victim_next;
    bool victims_built;
    uint64_t next_xfer;
    bool group_active; /* static/dynamic: a group holds the slots */
    uint64_t pass_no;  /* decode passes (a step may run two) */
    bool forced;       /* last-resort pass: caps and residency waived */
    /* illegal state transitions seen (set_state), and the first one */
    uint64_t bad_transitions, bad_req;
    uint8_t bad_from, bad_to;
    /* how cached blocks are keyed: XXH3 unless a test set otherwise (sched_testing.h) */
    sched_prefix_key_fn prefix_key;
    /* prefix cache (NULL when off) and its counters */
    sched_prefix *px;
    uint64_t px_query, px_hit, px_self, px_evicted;
    uint64_t commit_step_us; /* the step sched_commit is committing (0: unknown) */
    uint64_t px_hit_pool[SCHED_POOL__COUNT], px_self_pool[SCHED_POOL__COUNT];
    uint64_t px_demoted[SCHED_POOL__COUNT], px_reloaded[SCHED_POOL__COUNT];
    uint64_t px_recomputed[SCHED_POOL__COUNT];
    uint32_t px_left[SCHED_POOL__COUNT]; /* blocks that left each pool (any way) */
    /* one eviction call's demotions (copies to plan, in order) and drops (its events) */
    struct px_move {
        uint32_t from_block, to_block;
        uint8_t from, to;
    } * px_mv;
    uint32_t px_n_mv, px_cap_mv;
    uint32_t px_drop[SCHED_POOL__COUNT];
    double px_drop_rl[SCHED_POOL__COUNT], px_drop_rc[SCHED_POOL__COUNT],
        px_drop_reuse[SCHED_POOL__COUNT];
    double px_mv_reuse;
    /* prefix_order = longest_prefix (order.c; NULL/0 unless a class uses it and the cache is
     * on): order heaps [class * n_tenants + tenant], the waiter table, lookup scratch */
    heap *pwait;
    struct ow_ent *ow;
    uint32_t n_ow, cap_ow, ow_free, n_live_ow;
    uint32_t *ow_bucket;
    uint32_t ow_nbucket;
    uint32_t *ow_nodes;
    uint32_t cap_ow_nodes;
    /* copy-on-write (cow.c): device blocks with references beside the usual books, and this
     * plan's copies */
    VEC(struct cow_ent) cow;
    VEC(sched_copy) copies;
    /* n samples admitted together (group.c): blocks reserved in all, and the first samples
     * holding a reservation for their others */
    uint32_t resv_total;
    VEC(uint32_t) resv_firsts;
};

/* ---- small helpers used everywhere ---------------------------------------------------- */

static inline uint32_t div_up(uint64_t a, uint32_t b)
{
    return (uint32_t)((a + b - 1) / b);
}

static inline uint32_t known(const req *r)
{
    return r->prompt_len + r->generated;
}

/* Device blocks r holds: its block table less the entries its window gave back. */
static inline uint32_t dev_held(const req *r)
{
    return r->n_dev - r->n_rel;
}

static inline bool hless(const hent *a, const hent *b)
{
    return a->k1 < b->k1 || (a->k1 == b->k1 && a->k2 < b->k2);
}

static inline const hent *htop(const heap *h)
{
    return h->n ? &h->a[0] : NULL;
}

static inline uint32_t map_hash(const sched *s, uint64_t id)
{
    return (uint32_t)((id * 0x9E3779B97F4A7C15ull) >> 32) & (s->map_cap - 1);
}

static inline uint32_t map_get(const sched *s, uint64_t id)
{
    for (uint32_t i = map_hash(s, id);; i = (i + 1) & (s->map_cap - 1)) {
        uint32_t sl = s->map[i];
        if (sl == NO_SLOT) return NO_SLOT;
        if (s->reqs[sl].id == id) return sl;
    }
}

static inline sched_event ev_of(const sched *s, sched_event_kind k, const req *r, uint64_t now)
{
    sched_event e;
    memset(&e, 0, sizeof(e));
    e.t_us = now;
    e.kind = k;
    e.tenant_idx = e.class_idx = -1;
    if (r) {
        e.req = r->id;
        e.tenant_idx = r->tenant;
        e.class_idx = r->cls;
        e.tenant = s->ten[r->tenant]->name;
        e.class_name = s->cls[r->cls]->name;
    }
    return e;
}

static inline void emit(const sched *s, const sched_event *e)
{
    if (s->sink) s->sink(s->sink_ctx, e);
}

static inline uint32_t pool_take(pool *p)
{
    return p->free_ids[--p->n_free];
}

static inline void pool_give(pool *p, uint32_t id)
{
    p->free_ids[p->n_free++] = id;
}

static inline heap *wait_heap(sched *s, const req *r)
{
    return &s->wait[(size_t)r->cls * (size_t)s->n_tenants + r->tenant];
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

typedef struct cand {
    int cls, tenant;
    uint32_t slot;
    bool swapped;
} cand;

bool sc_vec_grow(void **a, uint32_t *cap, uint32_t need, size_t elt);

/* Fair share (fair.c), here to be inlined on the commit and plan paths: the one place a
 * tenant's fair-share counter grows — `tokens` of service (prefill tokens when scheduled,
 * output tokens when produced, block-seconds of KV residency × the policy's charge) in
 * virtual tokens / weight; `rate` also draws the tokens from its token-rate bucket. */
static inline void sc_charge(sched *s, int tenant, double tokens, bool rate)
{
    tenant_state *t = &s->ts[tenant];
    t->vt += tokens / s->ten[tenant]->weight;
    if (rate && s->ten[tenant]->token_rate_per_s > 0) t->bucket -= tokens;
}

uint32_t sc_dev_available(const sched *s);
uint32_t sc_cache_evict(sched *s, req *r, uint32_t n);

/* Grow r's device block table to nblocks (store.c's pools; inlined: every decode asks). */
static inline bool sc_dev_grow_to(sched *s, req *r, uint32_t nblocks)
{
    if (nblocks <= r->n_dev) return true;
    uint32_t need = nblocks - r->n_dev;
    /* with window rings, a sequence's first blocks come with a ring (sc_dev_free_all gives
     * it back) */
    const bool ring = s->conf.window_rings && r->ring == SCHED_BLOCK_NONE;
    if (ring && !s->rings.n_free) return false;
    if (s->pools[SCHED_POOL_DEVICE].n_free < need) {
        /* cached blocks no sequence holds make room, oldest leaf first */
        if (!s->px || sc_dev_available(s) < need) return false;
        sc_cache_evict(s, r, need - s->pools[SCHED_POOL_DEVICE].n_free);
        if (s->pools[SCHED_POOL_DEVICE].n_free < need) return false;
    }
    if (!sc_vec_grow((void **)&r->dev, &r->cap_dev, nblocks, sizeof(uint32_t))) {
        s->oom = true;
        return false;
    }
    while (r->n_dev < nblocks) r->dev[r->n_dev++] = pool_take(&s->pools[SCHED_POOL_DEVICE]);
    if (ring) r->ring = pool_take(&s->rings);
    s->ts[r->tenant].kv_blocks += need;
    return true;
}

/* Whether a start can have a window ring (always without rings). */
static inline bool sc_ring_available(const sched *s)
{
    return !s->conf.window_rings || s->rings.n_free > 0;
}

/* ---- store.c ---- */
int sc_hpush(sched *s, heap *h, uint64_t k1, uint64_t k2, uint32_t slot);
void sc_hremove(sched *s, heap *h, uint32_t slot);
int sc_map_put(sched *s, uint64_t id, uint32_t slot);
void sc_map_del(sched *s, uint64_t id);
int sc_pool_init(pool *p, uint32_t n);
uint32_t sc_dev_free_all(sched *s, req *r);
uint32_t sc_tier_free_all(sched *s, req *r);
void sc_set_state(sched *s, req *r, sched_req_state to);
void sc_waiting_add(sched *s, uint32_t slot);
void sc_waiting_enqueue(sched *s, uint32_t slot); /* sc_waiting_add without the state change */
void sc_waiting_remove(sched *s, uint32_t slot);
void sc_run_add(sched *s, uint32_t slot);
void sc_run_remove(sched *s, uint32_t slot);
void sc_timer_update(sched *s, uint32_t slot);

/* ---- cost.c ---- */
double sc_predict_step_us(const sched *s, uint64_t prefill, uint64_t decode, uint64_t ctx,
                          double pairs);
double sc_prefill_us(const sched *s, uint64_t n);
/* What the step model charges a sequence at context ctx, and a prefill chunk of n rows from
 * position start for its attention pairs: a windowed layer reads min(context, window). */
uint64_t sc_context_charge(const sched *s, uint64_t ctx);
double sc_pairs_charge(const sched *s, double start, double n);
/* NULL when m is a step model the scheduler can predict with, else the field at fault, with
 * *why what it must be (sched_create and sched_set_cost_state report both). */
const char *sc_step_model_fault(const sched_step_model *m, const char **why);
void sc_observe_step(sched *s, uint64_t now, uint64_t prefilled, uint64_t step_us);
void sc_observe_transfer(sched *s, const xfer_rec *x, uint64_t bytes, uint64_t dur_us, int status);
double sc_predict_wait_us(const sched *s, int cls, int tenant, uint32_t prompt, uint64_t now);
double sc_swap_cost_us(const sched *s, sched_pool tier, uint64_t bytes);

/* ---- fair.c ---- */
bool sc_pick_candidate(sched *s, uint64_t now, uint64_t tenant_excl, uint32_t class_excl,
                       cand *out);
bool sc_pick_fcfs(sched *s, cand *out);
void sc_fair_rejoin(sched *s, int tenant);

/* ---- preempt.c ---- */
void sc_rc_end(sched *s, req *r, sched_outcome how, uint64_t now);
/* A completed transfer's outcome from its status: done, damaged (-EBADMSG, -ENODATA: a block
 * read back was not the one written) or failed. */
static inline sched_outcome sc_xfer_outcome(int status)
{
    if (status >= 0) return SCHED_OUTCOME_DONE;
    return status == -EBADMSG || status == -ENODATA ? SCHED_OUTCOME_DAMAGED : SCHED_OUTCOME_FAILED;
}
uint32_t sc_pick_victim(sched *s, uint32_t needer, int only_tenant, uint64_t now);
void sc_plan_transfer(sched *s, uint32_t slot, sched_xfer_dir dir, uint64_t now);
uint32_t sc_preempt(sched *s, uint32_t slot, bool quota, uint64_t now);
/* A WAITING or SWAPPED request whose output is blocked leaves its queue (parked) until it is
 * unblocked (sc_unpark); no-ops otherwise. */
void sc_park(sched *s, uint32_t slot);
void sc_unpark(sched *s, uint32_t slot);
/* Output-blocked sequences give up their device blocks to work that needs `want` blocks
 * (preempted, longest blocked first) until the blocks available plus those swap-outs in flight
 * will free cover it. Returns how many it preempted. */
uint32_t sc_reclaim_blocked(sched *s, uint32_t want, uint64_t now);

/* ---- batch.c ---- */
void sc_step_token_budget(sched *s, uint64_t now);
void sc_step_continuous(sched *s, uint64_t now);
void sc_step_group(sched *s, uint64_t now);

/* ---- cache.c ---- */
int sc_cache_create(sched *s);
int sc_cache_submit(sched *s, req *r, const sched_request *q);
uint32_t sc_dev_available(const sched *s);
uint32_t sc_cache_find(sched *s, uint32_t slot, uint32_t *unheld);
void sc_cache_start(sched *s, req *r, uint64_t now);
void sc_cache_commit(sched *s, req *r);
void sc_cache_token(sched *s, req *r, bool has, int32_t token);
uint32_t sc_cache_release(sched *s, req *r);
uint32_t sc_cache_evict(sched *s, req *r, uint32_t n);
int sc_cache_check(const sched *s, const uint32_t *holders, char *why, size_t len);
void sc_cache_free_req(req *r);
uint32_t sc_tier_available(const sched *s, sched_pool p);
bool sc_tier_make_room(sched *s, sched_pool p, uint32_t n);
int sc_cache_xfer_done(sched *s, xfer_rec *x, uint64_t now, uint64_t bytes, uint64_t dur_us,
                       int status);

/* ---- window.c ---- */
void sc_window_release(sched *s, req *r);
void sc_window_swapped_out(req *r);
bool sc_window_swap_in_grow(sched *s, req *r);
uint32_t sc_window_start_blocks(const sched *s, uint32_t full, uint32_t hit, uint32_t first_chunk);
uint32_t sc_window_never_fits_blocks(const sched *s, uint32_t prompt_len, bool cached,
                                     uint32_t full);
int sc_window_check(const sched *s, const req *r, char *why, size_t len);

/* ---- cow.c ---- */
/* A device block leaves a sequence's table: to the pool, unless samples still share it. */
void sc_dev_give(sched *s, uint32_t block);
/* sched_submit of a sample with sample_of: take a reference to the first sample's partial
 * prompt block when it has it computed and the tokens match. */
void sc_cow_submit(sched *s, req *r, const sched_request *q);
/* Admission of r with `use` leading blocks from the cache: its shared block becomes its own
 * (a copy in the plan, or taken over).  Returns the tokens past use × block_size it gives r
 * (0: none; the reference is dropped and r computes them). */
uint32_t sc_cow_start(sched *s, req *r, uint32_t use);

/* ---- ring snapshots (ringsnap.c) ---- */
enum { RS_FREE = 0, RS_PENDING, RS_READY };
int sc_snap_create(sched *s);
/* Whether r's cached prefix must end where ring snapshots cover the window before it
 * (window rings, not a sample's first start), and the longest prefix of found device
 * blocks that does (0: none). */
bool sc_snap_needed(const sched *s, const req *r);
uint32_t sc_snap_trim(sched *s, req *r, uint32_t found);
/* sc_cache_start used `use` blocks: pin the snapshots of the window before it for r's
 * first entry (a hit: they are protected). */
void sc_snap_hit(sched *s, req *r, uint32_t use);
/* add_entry: its restores (before the batch) and the blocks it completes (after it). */
void sc_snap_entry(sched *s, req *r, sched_entry *e);
/* commit: r's snapshots are taken once computed passed their block */
void sc_snap_commit(sched *s, req *r);
/* r gives up its device blocks: its pins and the snapshots not yet taken go */
void sc_snap_release(sched *s, req *r);
/* the plan is built: slots for the blocks its entries complete (its ring_snapshots) */
void sc_snap_seal(sched *s);
/* the cached block keyed key left the device: its snapshot goes */
void sc_snap_dropped(sched *s, sched_prefix_key key);
uint32_t sc_snap_held(const sched *s);
int sc_snap_check(const sched *s, char *why, size_t len);
/* r drops its reference, if any. */
void sc_cow_drop(sched *s, req *r);
/* True while samples share block b (the prefix cache does not take it meanwhile). */
bool sc_cow_shared(const sched *s, uint32_t block);
/* Every shared block's references against the requests that hold them; blocks only the
 * references hold are counted in holders (the device pool's check follows). */
int sc_cow_check(const sched *s, uint32_t *holders, char *why, size_t len);

/* ---- group.c ---- */
/* sched_submit: a first sample's group (n_samples), or a sample's share of the reservation
 * its first sample holds. */
void sc_group_submit(sched *s, req *r, const sched_request *q);
/* Blocks r's admission needs beyond its own: its group's others' (an unstarted first
 * sample), else 0. */
uint32_t sc_group_extra(const sched *s, const req *r);
/* Blocks reserved for others than r (an admission of r cannot use them). */
static inline uint32_t sc_group_reserved_for_others(const sched *s, const req *r)
{
    return s->resv_total - r->resv;
}
/* r starts: a first sample reserves its others' blocks; a sample uses what it had. */
void sc_group_start(sched *s, req *r, uint32_t extra);
/* r gives back what is reserved for it or its group (it ends or gives up its blocks). */
void sc_group_release(sched *s, req *r);
/* Step start: first samples whose first token came give back what their others did not claim. */
void sc_group_settle(sched *s);
int sc_group_check(const sched *s, char *why, size_t len);

/* ---- order.c ---- */
int sc_order_create(sched *s);
void sc_order_destroy(sched *s);
void sc_order_add(sched *s, uint32_t slot);
void sc_order_remove(sched *s, uint32_t slot);
void sc_order_inserted(sched *s, sched_prefix_key key);
void sc_order_dropped(sched *s, sched_prefix_key key);
uint32_t sc_order_pick(sched *s, int cls, int tenant, uint64_t now);
int sc_order_check(const sched *s, char *why, size_t len);

/* ---- sched.c ---- */
void sc_emit_defer(sched *s, req *r, sched_defer_reason why, uint64_t now);
void sc_release_now(sched *s, uint32_t slot, uint64_t now, bool into_plan);
bool sc_detach(sched *s, uint32_t slot);
void sc_do_cancel(sched *s, uint32_t slot, sched_cancel_reason why, uint64_t now, bool in_step);

#endif /* RINGLM_SCHED_INTERNAL_H */
