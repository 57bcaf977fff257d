/* SPDX-License-Identifier: MIT */
/*
 * daemon/kvtier.h — the KV host tier (and optional disk tier) and the block transfers
 * between the engine's KV pool and those tiers (DESIGN.md §2, §5).
 *
 * Host tier: a memfd-backed file, mapped, placed on the daemon's NUMA node and mlock()ed
 * (EPERM/ENOMEM from mlock are tolerated with a logged warning: the tier still works, it can
 * just be paged out). Disk tier: a regular file opened O_DIRECT (without O_DIRECT, logged,
 * when the filesystem or the block geometry refuses it).
 *
 * Both tiers are files, so one code path moves blocks: io_uring reads and writes between the
 * pool block (registered as a fixed buffer when the kernel and RLIMIT_MEMLOCK allow) and
 * offset slot × block_bytes of the tier's file, submitted on the daemon loop's ring. For a
 * pool without host addresses (CUDA), the host tier uses eng_kv_transfer_async into the
 * memfd mapping with an eventfd read on the ring; the disk tier bounces through a host
 * buffer with the engine's synchronous block copies.
 *
 * Completions arrive as CQEs on the caller's ring; the caller hands every CQE whose
 * user_data carries the configured tag to kvtier_handle_cqe. A transfer of n blocks is one
 * job; its callback runs once, when the last block completed, with its bytes and elapsed time
 * (the caller hands them to the scheduler, whose estimate of each tier's bandwidth is the only
 * one: sched_get_tier_cost).
 *
 * kvtier only moves blocks: which slot of a tier holds which sequence's block is the
 * scheduler's (its host and disk pools hand out the slots a transfer names).
 *
 * Damaged tiers: every block written to a tier (swap-out, demotion) has its XXH3-64 kept in
 * the daemon's memory, and a block read back into the pool (swap-in, reload) is checked
 * against it before the transfer reports success. A block whose bytes changed (the disk
 * file overwritten, or truncated so that a hole reads as zeros; host memory written by
 * someone else) fails its transfer with -EBADMSG, a read that meets the end of the file
 * (truncated under the daemon) with -ENODATA: the caller never computes on a block it did
 * not write. kvtier_read_failures counts them per tier and kind.
 *
 * Threading: one thread (the loop thread) at a time. Errors: 0 or -errno; kvtier_errmsg().
 */
#ifndef RINGLM_DAEMON_KVTIER_H
#define RINGLM_DAEMON_KVTIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/engine.h"
#include "sched/sched.h"

struct io_uring;
struct io_uring_cqe;

/* Tiers are the scheduler's pools (sched_pool: SCHED_POOL_HOST, SCHED_POOL_DISK; the device
 * pool is the engine's and is never a kvtier tier) and directions its transfer directions
 * (SCHED_XFER_OUT: pool → tier, SCHED_XFER_IN: tier → pool): one numbering, no mapping. */

/* user_data layout: the caller's tag in the bits of ud_tag_mask, the op index below. */
#define KVTIER_UD_INDEX_MASK 0xffffffffull

typedef struct kvtier_config {
    size_t block_bytes;    /* bytes per KV block (eng_kv_block_bytes) */
    int pool_blocks;       /* blocks in the engine's pool */
    void *pool_base;       /* host address of block 0 (blocks contiguous); NULL: device pool */
    eng *engine;           /* needed when pool_base is NULL */
    int host_blocks;       /* host tier slots (0: no host tier) */
    const char *disk_path; /* NULL: no disk tier; created, or an empty file, or one an
                              earlier ringlmd made (its trailer): any other is refused */
    int disk_blocks;
    int numa_node;         /* -1: anywhere */
    struct io_uring *ring; /* the loop's ring: SQEs go there, CQEs come back by tag */
    uint64_t ud_tag;       /* OR'ed into every user_data (must not touch the low 32 bits) */
    bool register_buffers; /* try io_uring fixed buffers for the pool */
    void (*log)(void *ctx, const char *msg); /* warnings and choices (NULL: stderr) */
    void *log_ctx;
    /* Fault injection for tests (ringlmd-test --fail-kv-reads host|disk): reads from a
     * tier whose bit (1u << sched_pool) is set into the pool complete with -EIO (the bytes
     * are moved, the transfer reports the failure) — the error paths of swap-ins and prefix
     * reloads, run through the real daemon. 0 in production. */
    unsigned fail_reads;
} kvtier_config;

typedef struct kvtier kvtier;

/* Called once per job. res: 0 or -errno (first failure; -EBADMSG, -ENODATA: see above). elapsed_us: submit → last CQE. */
typedef void (*kvtier_done_fn)(void *ctx, uint64_t cookie, int res, sched_xfer_dir dir,
                               sched_pool tier, size_t bytes, uint64_t elapsed_us);

/* Creates the tiers. Errors: -EINVAL (config; detail names the field), -ENOMEM, -errno of
 * memfd_create/open/ftruncate/mmap (detail names the path). */
int kvtier_create(const kvtier_config *cfg, kvtier **out);
/* Frees everything. Jobs still in flight are waited for on the ring (their callbacks do not
 * run); the ring must still exist. */
void kvtier_destroy(kvtier *t);
/* Whether kvtier_create could use path as its disk tier file, without changing it: absent
 * (and creatable), empty, or a tier file an earlier ringlmd made. 0, or -EEXIST (someone
 * else's file) or the error of opening or creating it, with kvtier_errmsg(). */
int kvtier_check_disk_path(const char *path);

/* Slots per tier (0 when the tier is absent, and for SCHED_POOL_DEVICE). */
int kvtier_blocks(const kvtier *t, sched_pool tier);

/*
 * Starts moving n blocks: dir SCHED_XFER_OUT copies pool_blocks[i] → slots[i] of tier,
 * SCHED_XFER_IN the other way. Returns 0 when submitted (done() follows from kvtier_handle_cqe), or -errno
 * (nothing submitted, done() not called): -EINVAL (block/slot range), -EBUSY (too many jobs
 * in flight), -ENOTSUP.
 */
int kvtier_submit(kvtier *t, sched_xfer_dir dir, sched_pool tier, const int32_t *pool_blocks,
                  const int32_t *slots, int n, uint64_t cookie, kvtier_done_fn done, void *ctx);
/*
 * Copies n blocks now and returns when they are where they go (the prefix cache's
 * demotions and reloads, which the scheduler's books already show done: nothing may touch
 * those blocks before the copy is): from the pool to a tier (from SCHED_POOL_DEVICE), a tier
 * to the pool (to SCHED_POOL_DEVICE), or the host tier to the disk tier. src[i] of `from`
 * goes to dst[i] of `to`. Reads and writes go through io_uring (a ring of kvtier's own, so
 * the loop's ring and its other completions are left alone), consecutive blocks as one.
 * *elapsed_us: how long it took. 0, -EINVAL (range, pools), or the first I/O error.
 */
int kvtier_copy(kvtier *t, sched_pool from, sched_pool to, const int32_t *src, const int32_t *dst,
                int n, uint64_t *elapsed_us);
/*
 * Copies len bytes of host memory at buf (a window ring: eng_kv_ring_ptr) to n slots of tier
 * (SCHED_XFER_OUT) or back from them (SCHED_XFER_IN), now: slot slots[i] holds bytes
 * [i × block_bytes, (i + 1) × block_bytes) of the span, the last one partly (len must be
 * more than (n - 1) and at most n block_bytes). Checksummed like blocks: a read back whose
 * bytes changed fails with -EBADMSG and leaves buf as it was. *elapsed_us: how long it took.
 * 0, -EINVAL (range, tier, len), -ENOMEM, or the first I/O error.
 */
int kvtier_copy_span(kvtier *t, sched_xfer_dir dir, sched_pool tier, void *buf, size_t len,
                     const int32_t *slots, int n, uint64_t *elapsed_us);
/* Submits queued SQEs to the kernel (the loop also does, at its next wait). */
int kvtier_flush(kvtier *t);
/* Handles a CQE carrying the tag; returns true if it belonged to kvtier. */
bool kvtier_handle_cqe(kvtier *t, const struct io_uring_cqe *cqe);
/* Jobs submitted and not yet completed. */
int kvtier_inflight(const kvtier *t);

/* Totals (completed jobs) per direction and tier. */
uint64_t kvtier_bytes_moved(const kvtier *t, sched_xfer_dir dir, sched_pool tier);
uint64_t kvtier_jobs_done(const kvtier *t, sched_xfer_dir dir, sched_pool tier);
/* Reads/writes submitted so far (consecutive blocks share one). */
uint64_t kvtier_ops_submitted(const kvtier *t);

/* Why a read back from a tier was not used, from the transfer's res (kvtier_read_failure_of):
 * KVTIER_READ_CHECKSUM (-EBADMSG) the bytes differ from those written, KVTIER_READ_SHORT
 * (-ENODATA) the file ended before the block, KVTIER_READ_IO any other error. Names
 * ("checksum", "short_read", "io_error") for metrics and logs. */
typedef enum kvtier_read_failure {
    KVTIER_READ_CHECKSUM,
    KVTIER_READ_SHORT,
    KVTIER_READ_IO,
    KVTIER_READ__COUNT
} kvtier_read_failure;
kvtier_read_failure kvtier_read_failure_of(int res);
const char *kvtier_read_failure_name(kvtier_read_failure f);
/* Reads from tier that failed (transfers and copies into the pool), by kind. */
uint64_t kvtier_read_failures(const kvtier *t, sched_pool tier, kvtier_read_failure f);

/* Synchronous read of a slot's bytes (checks, tests): 0 or -errno. */
int kvtier_read_slot(kvtier *t, sched_pool tier, int slot, void *dst);
/* One line describing what was set up (fixed buffers, O_DIRECT, mlock). */
const char *kvtier_describe(const kvtier *t);

const char *kvtier_errmsg(void);

#endif
