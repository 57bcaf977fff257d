/* SPDX-License-Identifier: MIT */
/*
 * formats/stats.h — the daemon's stats file (ringlmd --stats-file): one JSON object,
 * rewritten atomically (written to FILE.XXXXXX, renamed) a few times a second. Written by
 * ringlmd, read by the tests and by operators' scripts; this is its writer and its reader.
 *
 *   {"t_us":…,"iterations":…,"sessions":…,"live_requests":…,"waiting":…,"running":…,
 *    "swapped":…,"in_transit":…,"blocked":…,
 *    "kv":{"device":{"used":…,"free":…,"total":…},"host":{…},"disk":{…}},
 *    "invariants":"ok" | "<what is violated>" | "unchecked","transfers_inflight":…,
 *    "swap_verified":…,"swap_verify_errors":…,
 *    "transfer_overlap_errors":…,"engine_errors":…,"finished":…,"rejects":…,
 *    "draining":true|false,"steps":…,"policy":"<policy hash hex>"}
 */
#ifndef RINGLM_FORMATS_STATS_H
#define RINGLM_FORMATS_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/json.h"

#ifdef __cplusplus
extern "C" {
#endif

/* KV pools the file lists, in this order: device, host, disk. */
#define FMT_STATS_POOLS 3
extern const char *const fmt_stats_pool_names[FMT_STATS_POOLS];

typedef struct fmt_stats_pool {
    uint64_t used, free, total;
} fmt_stats_pool;

typedef struct fmt_stats {
    uint64_t t_us, iterations, sessions, live_requests;
    uint64_t waiting, running, swapped, in_transit, blocked;
    fmt_stats_pool kv[FMT_STATS_POOLS];
    char invariants[256]; /* "ok" or the scheduler's description */
    uint64_t transfers_inflight, swap_verified, swap_verify_errors, transfer_overlap_errors,
        engine_errors, finished, rejects;
    bool draining;
    uint64_t steps;
    char policy[80]; /* policy hash, hex */
} fmt_stats;

/* One JSON object and a newline into buf[cap]: the length, or -EMSGSIZE. */
int fmt_stats_format(const fmt_stats *s, char *buf, size_t cap);

/* Writes the file atomically: a new path.XXXXXX of its own, then rename. 0 or -errno (with why). */
int fmt_stats_write(const char *path, const fmt_stats *s, char *why, size_t whylen);

/* Parses the text of a stats file (every key required). 0, or -EINVAL with why. */
int fmt_stats_parse(const char *text, size_t len, fmt_stats *out, char *why, size_t whylen);
/* Reads and parses a stats file. 0, -errno or -EINVAL with why. */
int fmt_stats_read(const char *path, fmt_stats *out, char *why, size_t whylen);

#ifdef __cplusplus
}
#endif
#endif
