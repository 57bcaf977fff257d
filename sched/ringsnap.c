/* SPDX-License-Identifier: MIT */
/* ringsnap.c — ring snapshots: prefix-cache hits for models whose windowed layers keep their
 * K/V in per-sequence rings (sched_config.window_rings, window_snapshots).
 *
 * A cached prefix holds the global layers' K/V in its blocks; the windowed layers' K/V of
 * the window before its end lived in the ring of the sequence that computed it, which went
 * on and wrote over it.  Recomputing only the windowed layers there is not exact (each
 * windowed layer below widens what must be recomputed by a window), so a hit needs a copy
 * of the ring blocks of that window as they stood: ring snapshots.
 *
 * A snapshot slot holds one ring block: the windowed layers' K/V of one cached block,
 * keyed by that block's prefix key (the chain's, so the same key is the same positions of
 * the same tokens).  Taking: each block a sequence's entry completes — prompt or answer,
 * whatever its cached key — is copied right after the batch that computed it (a ring spans
 * a window and the rows of one batch: the block is still there), into a slot the plan names
 * (sched_plan.ring_snapshots); the slot is PENDING until the commit, READY after.  No copy
 * is taken of a key a slot holds or is taking.  So the first request behind a system
 * prompt leaves the system prompt's blocks, and the second, whose cached prefix ends where
 * the two differ, finds them.
 *
 * Using them: a request that is not a sample's first start (those copy their first
 * sample's ring) finds its cached prefix cut back to the longest whose last
 * window_snapshot_blocks blocks (fewer at the start) all have a READY slot, all its blocks
 * on the device (a hit that reloads from host or disk is not served: the slots stay, but
 * the chain must be on the device).  Its first entry restores those slots into its ring
 * before the batch (the plan's records with `restore`); until then they are pinned.
 *
 * Going: a slot goes with its block's place on the device — the block dropped or demoted
 * (cache.c's eviction callback) —, and, every slot taken, one is replaced by a new take:
 * segmented LRU — the least recently used slot no hit has used yet (probation) goes first;
 * when there is none, the least recently used one a hit has used (protected).  A hit
 * protects the slots it restores; at most half the slots are protected (the least
 * recently used protected one goes back to probation), so snapshots a workload reuses
 * outlive those it never does, and new ones still find room.  Slots are a count the
 * caller sizes from its byte budget (it holds their bytes); the scheduler never reads them.
 */
#include "sched/internal.h"

#define NONE SCHED_BLOCK_NONE

/* ---- key → slot (open addressing, linear probing, backward-shift deletion) ------------ */

static uint32_t home(const sched *s, sched_prefix_key key)
{
    return (uint32_t)((key.lo ^ (key.hi >> 17)) * 0x9e3779b97f4a7c15ull >> 32) & (s->snap_hcap - 1);
}

static uint32_t find(const sched *s, sched_prefix_key key)
{
    if (!s->n_snaps) return NONE;
    for (uint32_t h = home(s, key);; h = (h + 1) & (s->snap_hcap - 1)) {
        uint32_t k = s->snap_hash[h];
        if (k == NONE) return NONE;
        if (sched_prefix_key_eq(s->snaps[k].key, key)) return k;
    }
}

static void hash_put(sched *s, uint32_t k)
{
    uint32_t h = home(s, s->snaps[k].key);
    while (s->snap_hash[h] != NONE) h = (h + 1) & (s->snap_hcap - 1);
    s->snap_hash[h] = k;
}

static void hash_del(sched *s, uint32_t k)
{
    const uint32_t m = s->snap_hcap - 1;
    uint32_t h = home(s, s->snaps[k].key);
    while (s->snap_hash[h] != k) h = (h + 1) & m;
    s->snap_hash[h] = NONE;
    for (uint32_t j = (h + 1) & m; s->snap_hash[j] != NONE; j = (j + 1) & m) {
        uint32_t e = s->snap_hash[j], want = home(s, s->snaps[e].key);
        /* e stays unless its home lies cyclically in (h, j] */
        if (((j - want) & m) >= ((j - h) & m)) {
            s->snap_hash[h] = e;
            s->snap_hash[j] = NONE;
            h = j;
        }
    }
}

static void slot_free(sched *s, uint32_t k)
{
    struct ring_snap *n = &s->snaps[k];
    if (n->state == RS_FREE) return;
    hash_del(s, k);
    if (n->prot) s->snap_prot--;
    *n = (struct ring_snap){.owner = NONE};
    VEC_PUSH(s, s->snap_free, k);
}

/* ---- life cycle ------------------------------------------------------------------------ */

int sc_snap_create(sched *s)
{
    if (!s->px || !s->conf.window_rings || !s->conf.window_snapshots) return 0;
    uint32_t n = s->conf.window_snapshots, cap = 4;
    while (cap < 2 * n) cap <<= 1;
    s->snaps = calloc(n, sizeof *s->snaps);
    s->snap_hash = malloc(cap * sizeof *s->snap_hash);
    if (!s->snaps || !s->snap_hash) return -ENOMEM;
    memset(s->snap_hash, 0xff, cap * sizeof *s->snap_hash);
    s->snap_hcap = cap;
    s->n_snaps = n;
    for (uint32_t k = n; k-- > 0;) {
        s->snaps[k].owner = NONE;
        VEC_PUSH(s, s->snap_free, k);
    }
    return s->snap_free.n == n ? 0 : -ENOMEM;
}

bool sc_snap_needed(const sched *s, const req *r)
{
    return s->conf.window_rings && (!r->sample || r->started);
}

/* whether block b's slot is READY (a hit can restore it) */
static bool ready(const sched *s, const req *r, uint32_t b)
{
    uint32_t k = find(s, r->pkeys[b]);
    return k != NONE && s->snaps[k].state == RS_READY && !s->snaps[k].dead;
}

uint32_t sc_snap_trim(sched *s, req *r, uint32_t found)
{
    if (!s->n_snaps) return 0;
    const uint32_t w = s->conf.window_snapshot_blocks;
    uint32_t best = 0, run = 0; /* READY slots ending at block i - 1 */
    for (uint32_t i = 1; i <= found; i++) {
        run = ready(s, r, i - 1) ? run + 1 : 0;
        if (run >= (i < w ? i : w)) best = i;
    }
    return best;
}

void sc_snap_hit(sched *s, req *r, uint32_t use)
{
    if (!use || !s->n_snaps) return;
    const uint32_t w = s->conf.window_snapshot_blocks, from = use > w ? use - w : 0;
    for (uint32_t b = from; b < use; b++) {
        uint32_t k = find(s, r->pkeys[b]);
        if (k == NONE || s->snaps[k].state != RS_READY) return; /* sc_snap_trim cut it there */
    }
    for (uint32_t b = from; b < use; b++) {
        struct ring_snap *n = &s->snaps[find(s, r->pkeys[b])];
        n->pins++;
        n->used = ++s->snap_clock;
        if (!n->prot) {
            n->prot = true;
            s->snap_prot++;
        }
    }
    /* at most half the slots protected: the least recently used goes back to probation */
    while (s->snap_prot > s->n_snaps / 2) {
        uint32_t lru = NONE;
        for (uint32_t k = 0; k < s->n_snaps; k++)
            if (s->snaps[k].prot && (lru == NONE || s->snaps[k].used < s->snaps[lru].used)) lru = k;
        s->snaps[lru].prot = false;
        s->snap_prot--;
    }
    r->snap_at = use;
    s->snap_hits++;
}

static void unpin(sched *s, uint32_t k)
{
    struct ring_snap *n = &s->snaps[k];
    if (!--n->pins && n->dead) {
        slot_free(s, k);
        s->snap_dropped++;
    }
}

/* r's pins, or its restores into the plan */
static void restores(sched *s, req *r, bool plan)
{
    const uint32_t w = s->conf.window_snapshot_blocks, use = r->snap_at;
    const uint32_t bs = s->conf.block_size;
    r->snap_at = 0;
    for (uint32_t b = use > w ? use - w : 0; b < use; b++) {
        uint32_t k = find(s, r->pkeys[b]);
        if (k == NONE) continue; /* cannot happen: pinned */
        if (plan) {
            sched_ring_snapshot t = {
                .req = r->id, .ring = r->ring, .slot = k, .end = (b + 1) * bs, .restore = true};
            VEC_PUSH(s, s->snap_takes, t);
        }
        unpin(s, k);
    }
}

/* A slot for a new snapshot: a free one, else the least recently used READY one nobody
 * waits on, on probation first (replaced); NONE when every slot is pinned or being taken. */
static uint32_t take_slot(sched *s)
{
    if (s->snap_free.n) return s->snap_free.a[--s->snap_free.n];
    uint32_t best[2] = {NONE, NONE};
    for (uint32_t i = 0; i < s->n_snaps; i++) {
        const struct ring_snap *n = &s->snaps[i];
        uint32_t *b = &best[n->prot];
        if (n->state == RS_READY && !n->pins && (*b == NONE || n->used < s->snaps[*b].used)) *b = i;
    }
    uint32_t k = best[0] != NONE ? best[0] : best[1];
    if (k == NONE) return NONE;
    slot_free(s, k);
    s->snap_dropped++;
    return s->snap_free.a[--s->snap_free.n]; /* k */
}

void sc_snap_entry(sched *s, req *r, sched_entry *e)
{
    if (!s->n_snaps) return;
    if (r->snap_at) restores(s, r, true); /* before the batch: its first entry starts there */
    if (!r->pcache || r->ring == NONE) return;
    const uint32_t bs = s->conf.block_size, end = e->start_pos + e->n_tokens;
    /* the blocks this entry completes whose keys are known (prompt, or answer tokens given):
     * their slots are taken once the plan is built (sc_snap_seal), so that no take replaces
     * a slot an admission of this plan has counted on */
    for (uint32_t b = e->start_pos / bs; (b + 1) * bs <= end && b < r->n_pkeys; b++) {
        struct snap_want w = {.slot = (uint32_t)(r - s->reqs), .block = b};
        VEC_PUSH(s, s->snap_want, w);
    }
}

void sc_snap_seal(sched *s)
{
    const uint32_t bs = s->conf.block_size;
    for (uint32_t i = 0; i < s->snap_want.n; i++) {
        req *r = &s->reqs[s->snap_want.a[i].slot];
        const uint32_t b = s->snap_want.a[i].block;
        if (!r->live || r->ring == NONE || b >= r->n_pkeys) continue;
        if (find(s, r->pkeys[b]) != NONE) continue; /* someone has it (or is taking it) */
        uint32_t k = take_slot(s);
        if (k == NONE) break; /* every slot pinned or being taken */
        s->snaps[k] = (struct ring_snap){
            .key = r->pkeys[b], .state = RS_PENDING, .owner = s->snap_want.a[i].slot, .block = b};
        hash_put(s, k);
        VEC_PUSH(s, s->snap_pend, k);
        r->n_snap_pend++;
        sched_ring_snapshot t = {.req = r->id, .ring = r->ring, .slot = k, .end = (b + 1) * bs};
        VEC_PUSH(s, s->snap_takes, t);
    }
    s->snap_want.n = 0;
}

/* r's PENDING slots: READY once computed passed their block (commit), or freed (release) */
static void settle(sched *s, req *r, bool release)
{
    const uint32_t me = (uint32_t)(r - s->reqs), bs = s->conf.block_size;
    for (uint32_t i = 0; i < s->snap_pend.n && r->n_snap_pend;) {
        uint32_t k = s->snap_pend.a[i];
        struct ring_snap *n = &s->snaps[k];
        if (n->owner != me || (!release && r->computed < (n->block + 1) * bs)) {
            i++;
            continue;
        }
        s->snap_pend.a[i] = s->snap_pend.a[--s->snap_pend.n];
        r->n_snap_pend--;
        if (release) { /* not taken: its block was not computed */
            slot_free(s, k);
            continue;
        }
        n->state = RS_READY;
        n->owner = NONE;
        n->used = ++s->snap_clock;
        s->snap_taken++;
    }
}

void sc_snap_commit(sched *s, req *r)
{
    if (r->n_snap_pend) settle(s, r, false);
}

void sc_snap_release(sched *s, req *r)
{
    if (!s->n_snaps) return;
    if (r->snap_at) restores(s, r, false);
    if (r->n_snap_pend) settle(s, r, true);
}

void sc_snap_dropped(sched *s, sched_prefix_key key)
{
    uint32_t k = find(s, key);
    if (k == NONE || s->snaps[k].state != RS_READY) return;
    if (s->snaps[k].pins) {
        s->snaps[k].dead = true;
        return;
    }
    slot_free(s, k);
    s->snap_dropped++;
}

uint32_t sc_snap_held(const sched *s)
{
    return s->n_snaps - s->snap_free.n;
}

/* Each pin is one admitted request's restore to come, each PENDING slot one running
 * request's take; the key map holds exactly the slots in use, the free list the others. */
int sc_snap_check(const sched *s, char *why, size_t len)
{
    const uint32_t w = s->conf.window_snapshot_blocks;
    uint32_t prot = 0, mapped = 0;
    for (uint32_t h = 0; h < s->snap_hcap; h++) mapped += s->snap_hash[h] != NONE;
    for (uint32_t k = 0; k < s->n_snaps; k++) {
        const struct ring_snap *n = &s->snaps[k];
        uint32_t pins = 0;
        for (uint32_t i = 0; i < s->n_slots && n->state == RS_READY; i++) {
            const req *r = &s->reqs[i];
            if (!r->live || !r->snap_at) continue;
            for (uint32_t b = r->snap_at > w ? r->snap_at - w : 0; b < r->snap_at; b++)
                pins += sched_prefix_key_eq(r->pkeys[b], n->key);
        }
        bool taker = n->state == RS_PENDING && n->owner < s->n_slots && s->reqs[n->owner].live &&
                     s->reqs[n->owner].n_snap_pend;
        prot += n->prot;
        if (pins != n->pins || (n->state == RS_PENDING) != taker ||
            (n->state != RS_READY && (n->pins || n->prot)) ||
            (n->state != RS_FREE && find(s, n->key) != k)) {
            if (why && len)
                snprintf(why, len,
                         "ring snapshot %u: state %u, %u pins, %u requests restore it, "
                         "taker %d, in the key map at %u",
                         k, n->state, n->pins, pins, taker,
                         n->state != RS_FREE ? find(s, n->key) : NONE);
            return -EUCLEAN;
        }
    }
    if (prot != s->snap_prot || mapped + s->snap_free.n != s->n_snaps || prot > s->n_snaps / 2) {
        if (why && len)
            snprintf(why, len,
                     "ring snapshots: %u protected (counted %u), %u mapped, %u free of %u", prot,
                     s->snap_prot, mapped, s->snap_free.n, s->n_snaps);
        return -EUCLEAN;
    }
    return 0;
}
