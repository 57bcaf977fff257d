/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_route.c — the daemon a request goes to: prefix affinity and load (gw_route.h).
 */
#include "gateway/gw_route.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Blocks of a prompt looked at: a longer prompt's affinity is decided by its first ones. */
#define MAX_BLOCKS 256

struct gw_route {
    uint32_t block_tokens;
    uint64_t rr; /* round robin among equally loaded daemons */
    struct slot {
        uint64_t hash; /* 0: empty (a hash of 0 is stored as 1) */
        int16_t daemon;
    } slot[GW_ROUTE_SLOTS];
};

gw_route *gw_route_new(uint32_t block_tokens)
{
    gw_route *rt = calloc(1, sizeof *rt);
    if (rt) rt->block_tokens = block_tokens ? block_tokens : 16;
    return rt;
}

void gw_route_free(gw_route *rt)
{
    free(rt);
}

/* The chain of block hashes of prompt: up to MAX_BLOCKS into h; returns how many. */
static uint32_t chain(const gw_route *rt, const int32_t *prompt, uint32_t n, uint64_t *h)
{
    uint32_t nb = n / rt->block_tokens;
    if (nb > MAX_BLOCKS) nb = MAX_BLOCKS;
    uint64_t parent = 0;
    for (uint32_t i = 0; i < nb; i++) {
        parent = XXH3_64bits_withSeed(prompt + (size_t)i * rt->block_tokens,
                                      rt->block_tokens * sizeof(int32_t), parent);
        h[i] = parent ? parent : 1;
    }
    return nb;
}

size_t gw_route_load(const gw_daemon_load *l)
{
    size_t n = l->sent;
    if (!l->published) return n;
    size_t queued = (size_t)l->waiting + l->running;
    if (queued > n) n = queued;
    if (l->kv_total) n += (size_t)l->kv_used * GW_ROUTE_KV_WEIGHT / l->kv_total; /* rounded down */
    return n;
}

int gw_route_pick(gw_route *rt, const int32_t *prompt, uint32_t n, const size_t *load,
                  const bool *up, int n_daemons, uint32_t *affinity_blocks)
{
    uint64_t h[MAX_BLOCKS];
    uint32_t nb = chain(rt, prompt, n, h);
    uint32_t matched[GW_MAX_DAEMONS] = {0};
    /* the blocks are a chain: a daemon's affinity is its run of leading blocks */
    bool still[GW_MAX_DAEMONS];
    for (int d = 0; d < n_daemons; d++) still[d] = true;
    for (uint32_t i = 0; i < nb; i++) {
        const struct slot *s = &rt->slot[h[i] & (GW_ROUTE_SLOTS - 1)];
        bool any = false;
        for (int d = 0; d < n_daemons; d++) {
            if (still[d] && s->hash == h[i] && s->daemon == d)
                matched[d]++;
            else
                still[d] = false;
            any |= still[d];
        }
        if (!any) break;
    }
    int best = -1, least = -1;
    int n_least = 0;
    for (int d = 0; d < n_daemons; d++) {
        if (!up[d]) continue;
        if (best < 0 || matched[d] > matched[best] ||
            (matched[d] == matched[best] && load[d] < load[best]))
            best = d;
        if (least < 0 || load[d] < load[least]) {
            least = d;
            n_least = 1;
        } else if (load[d] == load[least]) {
            n_least++;
        }
    }
    if (least < 0) return -1;
    int pick;
    if (matched[best] > 0 && load[best] <= load[least] + GW_ROUTE_SLACK) {
        pick = best;
    } else {
        /* the least loaded, the equally loaded ones taken in turn */
        uint64_t k = rt->rr++ % (uint64_t)n_least;
        pick = least;
        for (int d = 0; d < n_daemons; d++)
            if (up[d] && load[d] == load[least] && k-- == 0) {
                pick = d;
                break;
            }
    }
    if (affinity_blocks) *affinity_blocks = matched[pick];
    return pick;
}

void gw_route_record(gw_route *rt, const int32_t *prompt, uint32_t n, int d)
{
    uint64_t h[MAX_BLOCKS];
    uint32_t nb = chain(rt, prompt, n, h);
    for (uint32_t i = 0; i < nb; i++) {
        struct slot *s = &rt->slot[h[i] & (GW_ROUTE_SLOTS - 1)];
        s->hash = h[i];
        s->daemon = (int16_t)d;
    }
}
