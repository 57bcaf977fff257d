/* SPDX-License-Identifier: MIT */
/* ringsnap.c — ring snapshots: prefix-cache hits for models whose windowed layers keep their
 * K/V in per-sequence rings (sched_config.window_rings, window_snapshots).
 *
 * A cached prefix holds the global layers' K/V in its blocks; the windowed layers' K/V of
 * the window before its end lived in the ring of the sequence that computed it, which went
 * on and wrote over it.  Recomputing only the windowed layers there is not exact (each
 * windowed layer below widens what must be recomputed by a window), so a hit needs a copy
 * of that ring as it stood at the prefix's end: a snapshot.
 *
 * Taking one: a sequence whose prompt crosses a block boundary before its last token takes
 * one at the last such boundary (snap_end[1]), the cached prefix a later request with the
 * same prompt, or one that goes on from it (the next turn of a conversation), finds; and
 * where the cached prefix its admission found ended, when no snapshot was there to use it
 * (snap_end[0]: a prefix two prompts share, as a system prompt — the third finds it).  For
 * each, the plan whose entry's rows reach it names a slot (sched_plan.ring_snapshots):
 * right after the batch the ring still holds the window before it (a ring spans window +
 * the rows of one batch, and every row's window is kept), and the caller copies it.  The
 * slot is PENDING until the commit that passed its end, READY after.  And a sequence that
 * finishes takes one at the last block boundary it computed (its answer's blocks are cached
 * too): the next plan copies it first of all, before anything can write the ring it gave
 * back (sched_ring_snapshot.before), so the slot is READY at once.  No snapshot is taken
 * where one for that block exists.
 *
 * Using one: a request that is not a sample's first start (those copy their first
 * sample's ring) finds its cached prefix cut back to the longest that ends at a READY
 * snapshot with all its blocks on the device (a hit that reloads from host or disk would
 * need the snapshot's bytes tiered too: not done).  Its first entry restores the snapshot
 * into its ring (sched_entry.ring_restore); until that entry is planned the slot is pinned.
 *
 * Going: a snapshot goes with its block's place on the device — the block dropped or
 * demoted (cache.c's eviction callback) — and, every slot taken, the least recently used
 * unpinned READY one is replaced by a new one.  Slots are a count the caller sizes (it
 * holds their bytes); the scheduler never reads them.
 */
#include "sched/internal.h"

int sc_snap_create(sched *s)
{
    if (!s->px || !s->conf.window_rings || !s->conf.window_snapshots) return 0;
    s->snaps = calloc(s->conf.window_snapshots, sizeof *s->snaps);
    if (!s->snaps) return -ENOMEM;
    s->n_snaps = s->conf.window_snapshots;
    return 0;
}

void sc_snap_submit(sched *s, req *r)
{
    uint32_t bs = s->conf.block_size;
    if (!s->n_snaps || !r->pcache || r->prompt_len < 2) return;
    uint32_t end = (r->prompt_len - 1) / bs * bs; /* a later identical prompt's longest hit */
    if (end && end / bs <= r->n_pkeys) r->snap_end[1] = end;
}

bool sc_snap_needed(const sched *s, const req *r)
{
    return s->conf.window_rings && (!r->sample || r->started);
}

static uint32_t find(const sched *s, sched_prefix_key key, uint8_t state)
{
    for (uint32_t i = 0; i < s->n_snaps; i++)
        if (s->snaps[i].state == state && !s->snaps[i].dead &&
            sched_prefix_key_eq(s->snaps[i].key, key))
            return i;
    return SCHED_BLOCK_NONE;
}

uint32_t sc_snap_trim(sched *s, req *r, uint32_t found)
{
    if (!s->n_snaps) return 0;
    uint32_t i = found;
    while (i > 0 && find(s, r->pkeys[i - 1], RS_READY) == SCHED_BLOCK_NONE) i--;
    /* cut back: where the prefix found ends is worth a snapshot of its own (before its
     * prompt's last boundary, which snap_end[1] takes) */
    uint32_t bs = s->conf.block_size;
    r->snap_end[0] = i < found && found * bs < r->snap_end[1] ? found * bs : 0;
    return i;
}

void sc_snap_hit(sched *s, req *r, uint32_t use)
{
    if (!use || !s->n_snaps) return;
    uint32_t k = find(s, r->pkeys[use - 1], RS_READY);
    if (k == SCHED_BLOCK_NONE) return; /* cannot happen: sc_snap_trim cut the prefix there */
    s->snaps[k].pins++;
    s->snaps[k].used = ++s->snap_clock;
    r->snap_restore = k;
    s->snap_hits++;
}

static void unpin(sched *s, uint32_t k)
{
    struct ring_snap *n = &s->snaps[k];
    if (!--n->pins && n->dead) {
        *n = (struct ring_snap){0};
        s->snap_dropped++;
    }
}

/* A slot for a new snapshot: a free one, else the least recently used READY one nobody
 * waits on (replaced). */
static uint32_t take_slot(sched *s)
{
    uint32_t best = SCHED_BLOCK_NONE;
    for (uint32_t i = 0; i < s->n_snaps; i++) {
        const struct ring_snap *n = &s->snaps[i];
        if (n->state == RS_FREE) return i;
        if (n->state == RS_READY && !n->pins &&
            (best == SCHED_BLOCK_NONE || n->used < s->snaps[best].used))
            best = i;
    }
    if (best != SCHED_BLOCK_NONE) {
        s->snaps[best] = (struct ring_snap){0};
        s->snap_dropped++;
    }
    return best;
}

void sc_snap_entry(sched *s, req *r, sched_entry *e)
{
    e->ring_restore = SCHED_BLOCK_NONE;
    if (!s->n_snaps) return;
    if (r->snap_restore != SCHED_BLOCK_NONE) {
        /* its first entry starts where the snapshot ends (sc_cache_start set computed) */
        e->ring_restore = r->snap_restore;
        unpin(s, r->snap_restore);
        r->snap_restore = SCHED_BLOCK_NONE;
    }
    for (int j = 0; j < 2; j++) {
        uint32_t end = r->snap_end[j];
        if (!end || e->start_pos >= end || e->start_pos + e->n_tokens < end) continue;
        if (r->snap_take[j] == SCHED_BLOCK_NONE) {
            sched_prefix_key key = r->pkeys[end / s->conf.block_size - 1];
            if (find(s, key, RS_READY) != SCHED_BLOCK_NONE ||
                find(s, key, RS_PENDING) != SCHED_BLOCK_NONE) {
                r->snap_end[j] = 0; /* someone has it (or is taking it) */
                continue;
            }
            uint32_t k = take_slot(s);
            if (k == SCHED_BLOCK_NONE) continue; /* every slot pinned or being taken */
            s->snaps[k] = (struct ring_snap){.key = key, .state = RS_PENDING};
            r->snap_take[j] = k;
        }
        sched_ring_snapshot t = {
            .req = r->id, .ring = r->ring, .slot = r->snap_take[j], .end = end};
        VEC_PUSH(s, s->snap_takes, t);
    }
}

void sc_snap_commit(sched *s, req *r)
{
    for (int j = 0; j < 2; j++) {
        if (r->snap_take[j] == SCHED_BLOCK_NONE || r->computed < r->snap_end[j]) continue;
        struct ring_snap *n = &s->snaps[r->snap_take[j]];
        n->state = RS_READY;
        n->used = ++s->snap_clock;
        s->snap_taken++;
        r->snap_take[j] = SCHED_BLOCK_NONE;
        r->snap_end[j] = 0;
    }
}

void sc_snap_release(sched *s, req *r)
{
    if (!s->n_snaps) return;
    if (r->snap_restore != SCHED_BLOCK_NONE) {
        unpin(s, r->snap_restore);
        r->snap_restore = SCHED_BLOCK_NONE;
    }
    for (int j = 0; j < 2; j++)
        if (r->snap_take[j] != SCHED_BLOCK_NONE) { /* not taken: its end was not computed */
            s->snaps[r->snap_take[j]] = (struct ring_snap){0};
            r->snap_take[j] = SCHED_BLOCK_NONE;
        }
}

void sc_snap_finish(sched *s, req *r)
{
    if (!s->n_snaps || r->ring == SCHED_BLOCK_NONE || !r->pcache) return;
    uint32_t bs = s->conf.block_size, nb = r->computed / bs;
    /* its answer's blocks are cached (prefix_cache_generated): a hit can end there */
    if (!nb || nb > r->n_pnodes || nb > r->n_pkeys) return;
    sched_prefix_key key = r->pkeys[nb - 1];
    if (find(s, key, RS_READY) != SCHED_BLOCK_NONE || find(s, key, RS_PENDING) != SCHED_BLOCK_NONE)
        return;
    uint32_t k = take_slot(s);
    if (k == SCHED_BLOCK_NONE) return;
    /* ready now: the copy comes first in the next plan, before any restore from it */
    s->snaps[k] = (struct ring_snap){.key = key, .state = RS_READY, .used = ++s->snap_clock};
    s->snap_taken++;
    sched_ring_snapshot t = {
        .req = r->id, .ring = r->ring, .slot = k, .end = nb * bs, .before = true};
    VEC_PUSH(s, s->snap_acc, t);
}

void sc_snap_seal(sched *s)
{
    for (uint32_t i = 0; i < s->snap_acc.n; i++) VEC_PUSH(s, s->snap_takes, s->snap_acc.a[i]);
    s->snap_acc.n = 0;
}

void sc_snap_dropped(sched *s, sched_prefix_key key)
{
    uint32_t k = s->n_snaps ? find(s, key, RS_READY) : SCHED_BLOCK_NONE;
    if (k == SCHED_BLOCK_NONE) return;
    if (s->snaps[k].pins) {
        s->snaps[k].dead = true;
        return;
    }
    s->snaps[k] = (struct ring_snap){0};
    s->snap_dropped++;
}

uint32_t sc_snap_held(const sched *s)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n_snaps; i++) n += s->snaps[i].state != RS_FREE;
    return n;
}

/* Each pin is one admitted request's restore to come, each PENDING slot one request's take. */
int sc_snap_check(const sched *s, char *why, size_t len)
{
    for (uint32_t k = 0; k < s->n_snaps; k++) {
        uint32_t pins = 0, takers = 0;
        for (uint32_t i = 0; i < s->n_slots; i++) {
            const req *r = &s->reqs[i];
            if (!r->live) continue;
            pins += r->snap_restore == k;
            takers += (r->snap_take[0] == k) + (r->snap_take[1] == k);
        }
        const struct ring_snap *n = &s->snaps[k];
        if (pins != n->pins || takers != (n->state == RS_PENDING) ||
            (n->state != RS_READY && n->pins)) {
            if (why && len)
                snprintf(why, len,
                         "ring snapshot %u: state %u, %u pins, %u requests restore it, "
                         "%u take it",
                         k, n->state, n->pins, pins, takers);
            return -EUCLEAN;
        }
    }
    return 0;
}
