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
#define TAG         (7ull << 56)

typedef struct done_rec {
    int calls, res;
    uint64_t cookie;
    size_t bytes;
} done_rec;

static void on_done(void *ctx, uint64_t cookie, int res, sched_xfer_dir dir, sched_pool tier,
                    size_t bytes, uint64_t el)
{
    (void)dir;
    (void)tier;
    (void)el;
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

static void roundtrip(sched_pool tier, bool fixed)
{
    struct io_uring ring;
    cr_assert_eq(io_uring_queue_init(64, &ring, 0), 0);
    size_t len = (size_t)POOL_BLOCKS * BLOCK_BYTES;
    unsigned char *pool =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(pool, MAP_FAILED);
    fill(pool, len, 1);
    unsigned char *orig = malloc(len);
    memcpy(orig, pool, len);
    char path[] = "/tmp/ringlm-kvtier-XXXXXX";
    int tfd = mkstemp(path);
    cr_assert_geq(tfd, 0);
    close(tfd);
    kvtier_config c = {.block_bytes = BLOCK_BYTES,
                       .pool_blocks = POOL_BLOCKS,
                       .pool_base = pool,
                       .host_blocks = 16,
                       .disk_path = tier == SCHED_POOL_DISK ? path : NULL,
                       .disk_blocks = 16,
                       .numa_node = -1,
                       .ring = &ring,
                       .ud_tag = TAG,
                       .register_buffers = fixed};
    kvtier *t;
    int rc = kvtier_create(&c, &t);
    cr_assert_eq(rc, 0, "kvtier_create: %s", kvtier_errmsg());
    cr_log_info("%s", kvtier_describe(t));

    /* Slots are the scheduler's to hand out; any in range will do, here not in order. */
    int32_t blocks[5] = {3, 17, 4, 31, 0}, slots[5] = {7, 0, 15, 2, 9};
    done_rec d = {0};
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_OUT, tier, blocks, slots, 5, 42, on_done, &d), 0, "%s",
                 kvtier_errmsg());
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
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_IN, tier, dst, slots, 5, 43, on_done, &d), 0);
    wait_done(&ring, t, &d, 2);
    cr_assert_eq(d.res, 0);
    for (int i = 0; i < 5; i++)
        cr_assert(memcmp(pool + (size_t)dst[i] * BLOCK_BYTES,
                         orig + (size_t)blocks[i] * BLOCK_BYTES, BLOCK_BYTES) == 0,
                  "swap-in of block %d into %d is not byte-exact", blocks[i], dst[i]);
    cr_assert_eq(kvtier_bytes_moved(t, SCHED_XFER_OUT, tier), (uint64_t)5 * BLOCK_BYTES);
    cr_assert_eq(kvtier_bytes_moved(t, SCHED_XFER_IN, tier), (uint64_t)5 * BLOCK_BYTES);
    cr_assert_eq(kvtier_jobs_done(t, SCHED_XFER_IN, tier), 1u);
    kvtier_destroy(t);
    io_uring_queue_exit(&ring);
    unlink(path);
    free(tmp);
    free(orig);
    munmap(pool, len);
}

Test(daemon_kvtier, host_roundtrip_fixed)
{
    roundtrip(SCHED_POOL_HOST, true);
}
Test(daemon_kvtier, host_roundtrip_plain)
{
    roundtrip(SCHED_POOL_HOST, false);
}
Test(daemon_kvtier, disk_roundtrip)
{
    roundtrip(SCHED_POOL_DISK, true);
}

Test(daemon_kvtier, bad_input_refused)
{
    struct io_uring ring;
    cr_assert_eq(io_uring_queue_init(8, &ring, 0), 0);
    static char pool[4 * 4096] __attribute__((aligned(4096)));
    kvtier_config c = {.block_bytes = 4096,
                       .pool_blocks = 4,
                       .pool_base = pool,
                       .host_blocks = 2,
                       .numa_node = -1,
                       .ring = &ring,
                       .ud_tag = TAG};
    kvtier *t;
    cr_assert_eq(kvtier_create(&c, &t), 0, "%s", kvtier_errmsg());
    int32_t s[1] = {1};
    int32_t b = 0;
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_OUT, SCHED_POOL_DISK, &b, s, 1, 0, on_done, NULL),
                 -EINVAL, "disk tier absent");
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_OUT, SCHED_POOL_DEVICE, &b, s, 1, 0, on_done, NULL),
                 -EINVAL, "the device pool is the engine's, never a tier");
    cr_assert_eq(kvtier_blocks(t, SCHED_POOL_DEVICE), 0);
    b = 9;
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_OUT, SCHED_POOL_HOST, &b, s, 1, 0, on_done, NULL),
                 -EINVAL);
    b = 0;
    int32_t bad = 5;
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_OUT, SCHED_POOL_HOST, &b, &bad, 1, 0, on_done, NULL),
                 -EINVAL);
    bad = -1;
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_OUT, SCHED_POOL_HOST, &b, &bad, 1, 0, on_done, NULL),
                 -EINVAL);
    cr_assert_eq(kvtier_inflight(t), 0, "a refused transfer must leave nothing in flight");
    kvtier_destroy(t);
    c.ud_tag = 5; /* overlaps the index bits */
    cr_assert_eq(kvtier_create(&c, &t), -EINVAL);
    io_uring_queue_exit(&ring);
}

/* The real CPU engine's pool: fill KV by running a prompt, swap its blocks out to the host
 * tier, clobber them, swap them back into different blocks: byte-exact, and the engine's
 * next-token logits from the moved blocks equal the original ones. */
Test(daemon_kvtier, real_engine_pool_roundtrip)
{
    eng_model *m;
    int rc = eng_model_load("synthetic:stories260K:3", &m);
    cr_assert_eq(rc, 0, "model: %s", eng_errmsg());
    eng_options o = {.backend = "cpu",
                     .n_threads = 1,
                     .numa_node = -1,
                     .kv_blocks = 16,
                     .kv_block_size = 16,
                     .max_batch_tokens = 64,
                     .max_seqs = 4};
    eng *e;
    cr_assert_eq(eng_create(m, &o, &e), 0, "engine: %s", eng_errmsg());
    size_t len = 0;
    void *base = eng_kv_pool_base(e, &len);
    if (!base) cr_skip_test("backend has no host pool");
    size_t bb = eng_kv_block_bytes(e);
    int vocab = eng_model_cfg(m)->vocab_size;
    /* 40 tokens in blocks 2, 5, 7. */
    int32_t tok[41], pos[41], qs[2] = {0, 40}, sl[1] = {40}, bt[3] = {2, 5, 7}, rows[1] = {39};
    int64_t slots[41];
    for (int i = 0; i < 40; i++) {
        tok[i] = 3 + (i * 37) % (vocab - 3);
        pos[i] = i;
        slots[i] = (int64_t)bt[i / 16] * 16 + i % 16;
    }
    eng_batch b = {.n_tokens = 40,
                   .tokens = tok,
                   .positions = pos,
                   .slot_mapping = slots,
                   .n_seqs = 1,
                   .query_start = qs,
                   .seq_len = sl,
                   .block_table = bt,
                   .block_table_stride = 3,
                   .n_logits = 1,
                   .logits_rows = rows};
    float *l0 = malloc(sizeof(float) * (size_t)vocab), *l1 = malloc(sizeof(float) * (size_t)vocab);
    cr_assert_eq(eng_execute(e, &b, l0), 0, "%s", eng_errmsg());
    unsigned char *orig = malloc(3 * bb);
    for (int i = 0; i < 3; i++) memcpy(orig + (size_t)i * bb, eng_kv_block_ptr(e, bt[i]), bb);

    struct io_uring ring;
    cr_assert_eq(io_uring_queue_init(64, &ring, 0), 0);
    kvtier_config c = {.block_bytes = bb,
                       .pool_blocks = 16,
                       .pool_base = base,
                       .engine = e,
                       .host_blocks = 8,
                       .numa_node = -1,
                       .ring = &ring,
                       .ud_tag = TAG,
                       .register_buffers = true};
    kvtier *t;
    cr_assert_eq(kvtier_create(&c, &t), 0, "%s", kvtier_errmsg());
    int32_t s3[3] = {0, 1, 2};
    done_rec d = {0};
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_OUT, SCHED_POOL_HOST, bt, s3, 3, 1, on_done, &d), 0);
    wait_done(&ring, t, &d, 1);
    cr_assert_eq(d.res, 0);
    for (int i = 0; i < 3; i++) memset(eng_kv_block_ptr(e, bt[i]), 0x5a, bb);
    int32_t nb[3] = {9, 1, 12};
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_IN, SCHED_POOL_HOST, nb, s3, 3, 2, on_done, &d), 0);
    wait_done(&ring, t, &d, 2);
    cr_assert_eq(d.res, 0);
    for (int i = 0; i < 3; i++)
        cr_assert(memcmp(eng_kv_block_ptr(e, nb[i]), orig + (size_t)i * bb, bb) == 0,
                  "block %d → host → block %d is not byte-exact", bt[i], nb[i]);
    /* Decode the next token from the moved blocks: the same logits as from the originals. */
    int32_t t1[1] = {tok[39]}, p1[1] = {39}, q1[2] = {0, 1}, s1[1] = {40}, r1[1] = {0};
    int64_t sm1[1] = {(int64_t)nb[2] * 16 + 39 % 16};
    eng_batch b1 = {.n_tokens = 1,
                    .tokens = t1,
                    .positions = p1,
                    .slot_mapping = sm1,
                    .n_seqs = 1,
                    .query_start = q1,
                    .seq_len = s1,
                    .block_table = nb,
                    .block_table_stride = 3,
                    .n_logits = 1,
                    .logits_rows = r1};
    cr_assert_eq(eng_execute(e, &b1, l1), 0, "%s", eng_errmsg());
    for (int v = 0; v < vocab; v++)
        cr_assert_float_eq(l0[v], l1[v], 1e-4, "logit %d: %g before the swap, %g after", v, l0[v],
                           l1[v]);
    kvtier_destroy(t);
    io_uring_queue_exit(&ring);
    eng_destroy(e);
    eng_model_free(m);
    free(l0);
    free(l1);
    free(orig);
}

/* A block size O_DIRECT cannot take (not 4096-aligned): the disk tier falls back to
 * buffered I/O, says so, and still moves bytes exactly. */
Test(daemon_kvtier, disk_tier_falls_back_without_o_direct)
{
    struct io_uring ring;
    cr_assert_eq(io_uring_queue_init(8, &ring, 0), 0);
    enum { BB = 4000 };
    static char pool[4 * BB] __attribute__((aligned(4096)));
    for (size_t i = 0; i < sizeof pool; i++) pool[i] = (char)(i * 7);
    char path[64];
    snprintf(path, sizeof path, "/tmp/ringlm-kvtier-%d", (int)getpid());
    kvtier_config c = {.block_bytes = BB,
                       .pool_blocks = 4,
                       .pool_base = pool,
                       .disk_path = path,
                       .disk_blocks = 4,
                       .numa_node = -1,
                       .ring = &ring,
                       .ud_tag = TAG};
    kvtier *t;
    cr_assert_eq(kvtier_create(&c, &t), 0, "%s", kvtier_errmsg());
    cr_log_info("%s", kvtier_describe(t));
    cr_assert(strstr(kvtier_describe(t), "buffered") != NULL, "expected the buffered fallback: %s",
              kvtier_describe(t));
    int32_t b[2] = {1, 3}, s2[2] = {0, 1};
    done_rec d = {0};
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_OUT, SCHED_POOL_DISK, b, s2, 2, 5, on_done, &d), 0);
    wait_done(&ring, t, &d, 1);
    cr_assert_eq(d.res, 0);
    memset(pool, 0, sizeof pool);
    int32_t nb[2] = {0, 2};
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_IN, SCHED_POOL_DISK, nb, s2, 2, 6, on_done, &d), 0);
    wait_done(&ring, t, &d, 2);
    cr_assert_eq(d.res, 0);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < BB; k++)
            cr_assert_eq(pool[(size_t)nb[i] * BB + k], (char)(((size_t)b[i] * BB + k) * 7),
                         "block %d byte %d", b[i], k);
    kvtier_destroy(t);
    io_uring_queue_exit(&ring);
    unlink(path);
}

/* Neighbouring blocks to neighbouring slots move as one request per run, still exactly. */
Test(daemon_kvtier, contiguous_runs_coalesce)
{
    struct io_uring ring;
    cr_assert_eq(io_uring_queue_init(8, &ring, 0), 0);
    size_t len = (size_t)POOL_BLOCKS * BLOCK_BYTES;
    unsigned char *pool =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    fill(pool, len, 9);
    unsigned char *orig = malloc(len);
    memcpy(orig, pool, len);
    char path[64];
    snprintf(path, sizeof path, "/tmp/ringlm-kvtier-runs-%d", (int)getpid());
    for (sched_pool tier = SCHED_POOL_HOST; tier < SCHED_POOL__COUNT; tier++) {
        kvtier_config c = {.block_bytes = BLOCK_BYTES,
                           .pool_blocks = POOL_BLOCKS,
                           .pool_base = pool,
                           .host_blocks = 16,
                           .disk_path = tier == SCHED_POOL_DISK ? path : NULL,
                           .disk_blocks = 16,
                           .numa_node = -1,
                           .ring = &ring,
                           .ud_tag = TAG,
                           .register_buffers = true};
        kvtier *t;
        cr_assert_eq(kvtier_create(&c, &t), 0, "%s", kvtier_errmsg());
        /* runs: [4,5,6] [10] [20,21] → slots 0..5 */
        int32_t blocks[6] = {4, 5, 6, 10, 20, 21}, slots[6] = {0, 1, 2, 3, 4, 5};
        done_rec d = {0};
        cr_assert_eq(kvtier_submit(t, SCHED_XFER_OUT, tier, blocks, slots, 6, 1, on_done, &d), 0);
        wait_done(&ring, t, &d, 1);
        cr_assert_eq(d.res, 0);
        cr_expect_eq(kvtier_ops_submitted(t), 3u, "3 runs should be 3 writes, got %llu",
                     (unsigned long long)kvtier_ops_submitted(t));
        memset(pool, 0, len);
        cr_assert_eq(kvtier_submit(t, SCHED_XFER_IN, tier, blocks, slots, 6, 2, on_done, &d), 0);
        wait_done(&ring, t, &d, 2);
        cr_assert_eq(d.res, 0);
        for (int i = 0; i < 6; i++)
            cr_assert(memcmp(pool + (size_t)blocks[i] * BLOCK_BYTES,
                             orig + (size_t)blocks[i] * BLOCK_BYTES, BLOCK_BYTES) == 0,
                      "tier %d block %d not byte-exact", tier, blocks[i]);
        kvtier_destroy(t);
        memcpy(pool, orig, len);
    }
    io_uring_queue_exit(&ring);
    unlink(path);
    free(orig);
    munmap(pool, len);
}
