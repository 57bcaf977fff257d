/* SPDX-License-Identifier: MIT */
/*
 * daemon/kvevents.h — the prefix cache's KV-cache events in vLLM's wire format (DESIGN.md
 * §15), for the fleet routers that route by where prefixes are cached (llm-d's KV-cache
 * indexer, NVIDIA Dynamo's KV router).
 *
 * Wire (vLLM's ZmqEventPublisher and kv_events.py, msgspec array_like tagged structs):
 *   - a ZMQ PUB socket sends one three-frame message per batch: topic, the batch's sequence
 *     number (8 bytes, big-endian, 0, 1, 2, …), and the msgpack payload
 *     [ts, [event, …], data_parallel_rank] with events
 *       ["BlockStored", [hash, …], parent_hash | nil, [token ids], block_size, nil, medium]
 *       ["BlockRemoved", [hash], medium]
 *       ["AllBlocksCleared"]
 *     or, with map_events, each event as current vLLM encodes it (named fields: {"type":
 *     "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
 *     "lora_id", "medium", "lora_name"}, {"type": "BlockRemoved", "block_hashes", "medium"},
 *     {"type": "AllBlocksCleared"});
 *     (lora_id nil: no adapters); medium names the tier: "GPU" (the device pool), "CPU"
 *     (host) or "DISK" — vLLM's names for its own tiers, whatever the backend. As vLLM
 *     batches them, one BlockStored carries a chain of blocks stored together in one tier
 *     (a prompt's blocks computed in one step: hashes in order, the parent of the first,
 *     every block's tokens); one BlockRemoved per block, as vLLM evicts;
 *   - an optional ROUTER socket replays: a request [identity, "", start_seq (8 bytes BE)] is
 *     answered with every batch still buffered from start_seq on, each as
 *     [identity, "", seq, payload], then [identity, "", -1 (8 bytes), ""].
 *
 * Block hashes.  The hash of a block is the low 64 bits of the key the prefix cache keys it
 * by: XXH3-128 of (parent key, the cache domain's salt, the block's token ids).  The salt is
 * chosen by the daemon per cache domain (per tenant unless the policy groups tenants) and
 * never leaves it, so a hash names one domain's block: equal prompts of two tenants give
 * two different hashes, and nothing published lets a router or a subscriber tell that two
 * tenants sent the same tokens.  A router can follow the chains (parent hashes), match
 * BlockRemoved to BlockStored and read token_ids, from which it can compute its own hashes
 * (as Dynamo's router does); it cannot compute ringlm's hash of a prompt from token ids
 * (that needs the salt), so prefix affinity from its own hashes ignores the domain: it may
 * send a tenant's request to the host caching another tenant's equal prefix, which then
 * computes it (the daemon never shares a block across domains).
 *
 * Threads.  The loop thread hands events to a publisher thread through a bounded
 * single-producer ring (kvev_sink, kvev_end_iteration) and never waits: when the ring is
 * full the event is dropped and counted, every event after it is dropped too, and once the
 * ring has a free slot again the loop snapshots the whole index (sched_kv_announce) into a
 * buffer the publisher sends as one batch starting with AllBlocksCleared — subscribers
 * resynchronise on it. Encoding, sending and replay happen on the publisher thread.
 *
 * Errors: 0 or a negative errno; kvev_errmsg() has a thread-local detail string.
 */
#ifndef RINGLM_DAEMON_KVEVENTS_H
#define RINGLM_DAEMON_KVEVENTS_H

#include <stdbool.h>
#include <stdint.h>

#include "sched/sched.h"

typedef struct kvev_config {
    /* PUB endpoint, as vLLM treats it: bound when it holds "*" or "::" or is ipc:// or
     * inproc://, else connected. "tcp://127.0.0.1:*" binds an ephemeral port
     * (kvev_endpoint). */
    const char *endpoint;
    const char *replay_endpoint; /* ROUTER, bound; NULL: no replay */
    const char *topic;           /* NULL: "" (vLLM's default) */
    uint32_t block_size;         /* tokens per block (> 0, at most 4096) */
    uint32_t queue_events;       /* ring capacity in events (0: 65536; rounded up to 2^k) */
    uint32_t replay_batches;     /* batches kept for replay (0: 10000, vLLM's default) */
    int data_parallel_rank;      /* the third field of each batch */
    /* false: each event an array ["BlockStored", hashes, …] (vLLM up to its switch to named
     * fields, 0.11 among them: msgspec array_like); true: a map {"type": "BlockStored",
     * "block_hashes": …, "lora_name": nil} as current vLLM sends them (the batch stays an
     * array either way). Subscribers that decode by field name take either. */
    bool map_events;
} kvev_config;

typedef struct kvev kvev;

/* Opens the sockets and starts the publisher thread. -EINVAL (a bad endpoint: the detail
 * names it), -EADDRINUSE, -ENOMEM. */
int kvev_create(const kvev_config *cfg, kvev **out);
/* Publishes what is queued (bounded wait), stops the thread, closes the sockets. NULL ok. */
void kvev_destroy(kvev *k);
const char *kvev_errmsg(void);
/* The endpoints as bound (an ephemeral port resolved), for the start-up log. */
const char *kvev_endpoint(const kvev *k);
const char *kvev_replay_endpoint(const kvev *k);

/* ---- the loop thread ---------------------------------------------------------------- */

/* sched_kv_event_fn: queue one event (ctx is the kvev). Never blocks. */
void kvev_sink(void *ctx, const sched_kv_event *e);
/* Closes the iteration's batch; after an overflow, resynchronises subscribers from sch's
 * index as soon as the ring has room (see above). */
void kvev_end_iteration(kvev *k, sched *sch);
/* Whether events were lost and the resync is still to be sent: the loop should come back
 * soon (kvev_end_iteration sends it) even when it has nothing else to do. */
bool kvev_resync_pending(const kvev *k);
/* Events dropped because the ring was full (or after such a drop, before the resync). */
uint64_t kvev_dropped(const kvev *k);
/* Resynchronisations sent (one AllBlocksCleared each). */
uint64_t kvev_resyncs(const kvev *k);

#endif
