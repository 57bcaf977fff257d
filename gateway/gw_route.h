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
 * given; its load is the gateway's requests in flight or queued on its sessions (the
 * gateway is the daemons' client: that is their queue as far as the gateway adds to it).
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

#define GW_MAX_DAEMONS 16
#define GW_ROUTE_SLACK 8 /* requests of extra load a prefix match may cost */
#define GW_ROUTE_SLOTS (1u << 16)

typedef struct gw_route gw_route;

/* block_tokens 0: 16 (ringlmd's default --kv-block-size). NULL on -ENOMEM. */
gw_route *gw_route_new(uint32_t block_tokens);
void gw_route_free(gw_route *rt);

/* The daemon for prompt[0..n): among those with up[d], per the policy above; load[d] its
 * requests in flight. -1 when none is up. *affinity_blocks (may be NULL) gets the chosen
 * daemon's matched blocks. */
int gw_route_pick(gw_route *rt, const int32_t *prompt, uint32_t n, const size_t *load,
                  const bool *up, int n_daemons, uint32_t *affinity_blocks);
/* Remembers prompt's blocks as sent to daemon d. */
void gw_route_record(gw_route *rt, const int32_t *prompt, uint32_t n, int d);

#endif
