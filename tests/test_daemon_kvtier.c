/* SPDX-License-Identifier: MIT */
/* KV tiers: swap out / clobber / swap in is byte-exact through io_uring, for the host (memfd)
 * and disk (O_DIRECT file) tiers; slot accounting; bad input is refused, never crashes. */
#include <criterion/criterion.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/kvtier.h"

#define BLOCK_BYTES 20480 /* stories260K: 16 tokens × 1280 bytes */
#define POOL_BLOCKS 32
#define TAG (7ull << 56)

typedef struct done_rec {
    int calls, res;
    uint64_t cookie;
    size_t bytes;
} done_rec;

static void on_done(void *ctx, uint64_t cookie, int res, int dir, int tier, size_t bytes,
                    uint64_t el)
{
    (void)dir; (void)tier; (void)el;
    done_rec *d = ctx;
    d->calls++;
    d->res = res;
    d->cookie = cookie;
    d->bytes = bytes;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 131u + seed * 7919u) >> 3);
}

/* Drives the ring until the job's callback ran or 5 s passed. */
static void wait_done(struct io_uring *ring, kvtier *t, done_rec *d, int want)
{
    kvtier_flush(t);
    struct __kernel_timespec ts = {.tv_sec = 5};
    while (d->calls < want) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe_timeout(ring, &cqe, &ts);
        cr_assert_eq(rc, 0, "waiting for transfer completion: %s (calls=%d inflight=%d)",
                     strerror(-rc), d->calls, kvtier_inflight(t));
        cr_assert(kvtier_handle_cqe(t, cqe), "foreign CQE ud=%llx",
                  (unsigned long long)cqe->user_data);
        io_uring_cqe_seen(ring, cqe);
    }
}

static void roundtrip(int tier, bool fixed)
{
    struct io_uring ring;
    cr_assert_eq(io_uring_queue_init(64, &ring, 0), 0);
    size_t len = (size_t)POOL_BLOCKS * BLOCK_BYTES;
    unsigned char *pool = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(pool, MAP_FAILED);
    fill(pool, len, 1);
    unsigned char *orig = malloc(len);
    memcpy(orig, pool, len);
    char path[] = "/tmp/ringlm-kvtier-XXXXXX";
    int tfd = mkstemp(path);
    cr_assert_geq(tfd, 0);
    close(tfd);
    kvtier_config c = {.block_bytes = BLOCK_BYTES, .pool_blocks = POOL_BLOCKS, .pool_base = pool,
                       .host_blocks = 16, .disk_path = tier == KVT_DISK ? path : NULL,
                       .disk_blocks = 16, .numa_node = -1, .ring = &ring, .ud_tag = TAG,
                       .register_buffers = fixed};
    kvtier *t;
    int rc = kvtier_create(&c, &t);
    cr_assert_eq(rc, 0, "kvtier_create: %s", kvtier_errmsg());
    cr_log_info("%s", kvtier_describe(t));

    int32_t blocks[5] = {3, 17, 4, 31, 0}, slots[5];
    cr_assert_eq(kvtier_alloc(t, tier, 5, slots), 0);
    cr_assert_eq(kvtier_free_blocks(t, tier), 16 - 5);
    done_rec d = {0};
    cr_assert_eq(kvtier_submit(t, KVT_OUT, tier, blocks, slots, 5, 42, on_done, &d), 0,
                 "%s", kvtier_errmsg());
    wait_done(&ring, t, &d, 1);
    cr_assert_eq(d.res, 0, "swap out failed: %s", strerror(-d.res));
    cr_assert_eq(d.cookie, 42u);
    cr_assert_eq(d.bytes, (size_t)5 * BLOCK_BYTES);
    /* The tier holds exactly the pool bytes. */
    unsigned char *tmp = malloc(BLOCK_BYTES);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(kvtier_read_slot(t, tier, slots[i], tmp), 0);
        cr_assert(memcmp(tmp, orig + (size_t)blocks[i] * BLOCK_BYTES, BLOCK_BYTES) == 0,
                  "tier slot %d differs from pool block %d", slots[i], blocks[i]);
    }
    /* Clobber the pool, bring the blocks back into other pool blocks. */
    memset(pool, 0xEE, len);
    int32_t dst[5] = {10, 11, 12, 13, 14};
    cr_assert_eq(kvtier_submit(t, KVT_IN, tier, dst, slots, 5, 43, on_done, &d), 0);
    wait_done(&ring, t, &d, 2);
    cr_assert_eq(d.res, 0);
    for (int i = 0; i < 5; i++)
        cr_assert(memcmp(pool + (size_t)dst[i] * BLOCK_BYTES, orig + (size_t)blocks[i] * BLOCK_BYTES,
                         BLOCK_BYTES) == 0,
                  "swap-in of block %d into %d is not byte-exact", blocks[i], dst[i]);
    cr_assert_gt(kvtier_bw(t, KVT_OUT, tier), 0);
    cr_assert_gt(kvtier_bw(t, KVT_IN, tier), 0);
    cr_assert_eq(kvtier_bytes_moved(t, KVT_IN, tier), (uint64_t)5 * BLOCK_BYTES);
    kvtier_free(t, tier, slots, 5);
    cr_assert_eq(kvtier_free_blocks(t, tier), 16, "used + free != total after free");
    cr_assert_eq(kvtier_accounting_errors(t), 0u);
    kvtier_destroy(t);
    io_uring_queue_exit(&ring);
    unlink(path);
    free(tmp);
    free(orig);
    munmap(pool, len);
}

Test(daemon_kvtier, host_roundtrip_fixed) { roundtrip(KVT_HOST, true); }
Test(daemon_kvtier, host_roundtrip_plain) { roundtrip(KVT_HOST, false); }
Test(daemon_kvtier, disk_roundtrip) { roundtrip(KVT_DISK, true); }

Test(daemon_kvtier, bad_input_refused)
{
    struct io_uring ring;
    cr_assert_eq(io_uring_queue_init(8, &ring, 0), 0);
    static char pool[4 * 4096] __attribute__((aligned(4096)));
    kvtier_config c = {.block_bytes = 4096, .pool_blocks = 4, .pool_base = pool, .host_blocks = 2,
                       .numa_node = -1, .ring = &ring, .ud_tag = TAG};
    kvtier *t;
    cr_assert_eq(kvtier_create(&c, &t), 0, "%s", kvtier_errmsg());
    int32_t s[3];
    cr_assert_eq(kvtier_alloc(t, KVT_HOST, 3, s), -ENOSPC);
    cr_assert_eq(kvtier_free_blocks(t, KVT_HOST), 2, "failed alloc must not leak slots");
    cr_assert_eq(kvtier_alloc(t, KVT_DISK, 1, s), -EINVAL, "disk tier absent");
    cr_assert_eq(kvtier_alloc(t, KVT_HOST, 1, s), 0);
    int32_t b = 9;
    cr_assert_eq(kvtier_submit(t, KVT_OUT, KVT_HOST, &b, s, 1, 0, on_done, NULL), -EINVAL);
    b = 0;
    int32_t bad = 5;
    cr_assert_eq(kvtier_submit(t, KVT_OUT, KVT_HOST, &b, &bad, 1, 0, on_done, NULL), -EINVAL);
    kvtier_free(t, KVT_HOST, s, 1);
    kvtier_free(t, KVT_HOST, s, 1); /* double free: counted, ignored */
    cr_assert_eq(kvtier_accounting_errors(t), 1u);
    cr_assert_eq(kvtier_free_blocks(t, KVT_HOST), 2);
    kvtier_destroy(t);
    c.ud_tag = 5; /* overlaps the index bits */
    cr_assert_eq(kvtier_create(&c, &t), -EINVAL);
    io_uring_queue_exit(&ring);
}
