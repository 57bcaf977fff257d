/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_route.h — which ringlmd a request goes to when the gateway serves several
 * (ringlm-gateway --socket A --socket B …: one daemon per NUMA node of a multi-socket host,
 * each with its own node-local KV pool and host tier).
 *
 * Policy.  The prompt's full blocks of block_tokens tokens are hashed as a chain (XXH3-64 of
 * the parent's hash and the block's token ids), the way the daemons key their prefix cache
 * but without a daemon's per-domain salt, which the gateway never sees: the gateway's hashes
 * name token prefixes, and it remembers, per hash, the daemon it last sent that prefix to.
 * A daemon's affinity to a request is the number of leading blocks whose hashes it was last
 * given. Its load, in requests (gw_route_load), is what it has queued and running — the
 * daemon's own count over all its clients, read from the session's segment
 * (ringlm_daemon_load), or the gateway's requests in flight or queued on its sessions when
 * that is more (the daemon counts a submit at its next iteration) — plus its device KV use
 * as requests: GW_ROUTE_KV_WEIGHT × the fraction of blocks sequences hold, rounded down (a
 * full pool weighs as much as GW_ROUTE_KV_WEIGHT queued requests: a request sent there waits
 * for blocks, or preempts).
 *   - the daemon with the longest affinity (ties: the less loaded) gets the request, unless
 *     its load exceeds the least loaded daemon's by more than GW_ROUTE_SLACK requests:
 *     a cached prefix is worth waiting behind a few requests, not behind a crowd;
 *   - otherwise, and for a prompt no daemon has seen, the least loaded daemon (ties: round
 *     robin), so unique prompts spread;
 *   - only daemons with a connected session are candidates: a daemon that is gone gets
 *     nothing new, and what was in flight there ends with an error (the session's loss).
 * The request's block hashes are then recorded for the daemon chosen. The table is a bounded
 * direct-mapped cache (collisions overwrite): affinity is a hint, never a correctness matter
 * — a wrong guess costs a prefill, since each daemon checks its own cache.
 *
 * Thread safety: none; the gateway calls it under its mutex.
 */
#ifndef RINGLM_GATEWAY_GW_ROUTE_H
#define RINGLM_GATEWAY_GW_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GW_MAX_DAEMONS     16
#define GW_ROUTE_SLACK     8 /* requests of extra load a prefix match may cost */
#define GW_ROUTE_SLOTS     (1u << 16)
#define GW_ROUTE_KV_WEIGHT 16 /* requests a full device KV pool weighs as */

/* What the gateway knows of a daemon's load when it picks. */
typedef struct gw_daemon_load {
    size_t sent;       /* the gateway's requests in flight or queued on its sessions */
    bool published;    /* the daemon publishes its load (the fields below) */
    uint32_t waiting;  /* requests queued in the daemon, all its clients */
    uint32_t running;  /* requests running (or swapped out) there */
    uint32_t kv_used;  /* device KV blocks sequences hold */
    uint32_t kv_total; /* device KV blocks */
} gw_daemon_load;

/* The load of the policy above, in requests. */
size_t gw_route_load(const gw_daemon_load *l);

typedef struct gw_route gw_route;

/* block_tokens 0: 16 (ringlmd's default --kv-block-size). NULL on -ENOMEM. */
gw_route *gw_route_new(uint32_t block_tokens);
void gw_route_free(gw_route *rt);

/* The daemon for prompt[0..n): among those with up[d], per the policy above; load[d] its
 * load (gw_route_load). -1 when none is up. *affinity_blocks (may be NULL) gets the chosen
 * daemon's matched blocks. */
int gw_route_pick(gw_route *rt, const int32_t *prompt, uint32_t n, const size_t *load,
                  const bool *up, int n_daemons, uint32_t *affinity_blocks);
/* Remembers prompt's blocks as sent to daemon d. */
void gw_route_record(gw_route *rt, const int32_t *prompt, uint32_t n, int d);

#endif
