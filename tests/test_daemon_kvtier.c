/* SPDX-License-Identifier: MIT */
/* KV tiers: swap out / clobber / swap in is byte-exact through io_uring, for the host (memfd)
 * and disk (O_DIRECT file) tiers; slot accounting; bad input is refused, never crashes. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <liburing.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/kvtier.h"
#include "ringlm.h"
#include "tests/helpers.h"

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

/* A disk tier file damaged between the write and the read: a block overwritten fails its
 * checksum (-EBADMSG), a block past the end of a cut file comes back short (-ENODATA), a hole
 * below a later write (zeros) fails its checksum — through transfers (swap-ins) and copies
 * (the prefix cache's reloads) alike; the failures are counted per kind, an intact block
 * still comes back exact. */
Test(daemon_kvtier, damaged_disk_blocks_are_refused)
{
    struct io_uring ring;
    cr_assert_eq(io_uring_queue_init(64, &ring, 0), 0);
    size_t len = (size_t)POOL_BLOCKS * BLOCK_BYTES;
    unsigned char *pool =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(pool, MAP_FAILED);
    fill(pool, len, 5);
    unsigned char *orig = malloc(len);
    memcpy(orig, pool, len);
    char path[64];
    snprintf(path, sizeof path, "/tmp/ringlm-kvtier-dmg-%d", (int)getpid());
    kvtier_config c = {.block_bytes = BLOCK_BYTES,
                       .pool_blocks = POOL_BLOCKS,
                       .pool_base = pool,
                       .disk_path = path,
                       .disk_blocks = 8,
                       .numa_node = -1,
                       .ring = &ring,
                       .ud_tag = TAG};
    kvtier *t;
    cr_assert_eq(kvtier_create(&c, &t), 0, "%s", kvtier_errmsg());
    int32_t blocks[4] = {1, 2, 3, 4}, slots[4] = {0, 1, 2, 3};
    done_rec d = {0};
    cr_assert_eq(
        kvtier_submit(t, SCHED_XFER_OUT, SCHED_POOL_DISK, blocks, slots, 4, 1, on_done, &d), 0);
    wait_done(&ring, t, &d, 1);
    cr_assert_eq(d.res, 0);
    uint64_t us;
    int32_t cblocks[2] = {5, 6}, cslots[2] = {6, 7};
    cr_assert_eq(kvtier_copy(t, SCHED_POOL_DEVICE, SCHED_POOL_DISK, cblocks, cslots, 2, &us), 0);

    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    char junk[64];
    memset(junk, 0x5a, sizeof junk);
    cr_assert_eq(pwrite(fd, junk, sizeof junk, (off_t)BLOCK_BYTES + 100), (ssize_t)sizeof junk);
    int32_t dst[1] = {20}, one[1] = {1};
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_IN, SCHED_POOL_DISK, dst, one, 1, 2, on_done, &d), 0);
    wait_done(&ring, t, &d, 2);
    cr_assert_eq(d.res, -EBADMSG, "an overwritten block: res %d", d.res);
    /* slot 0 intact: exact */
    int32_t zero[1] = {0};
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_IN, SCHED_POOL_DISK, dst, zero, 1, 3, on_done, &d), 0);
    wait_done(&ring, t, &d, 3);
    cr_assert_eq(d.res, 0);
    cr_assert(memcmp(pool + 20 * BLOCK_BYTES, orig + 1 * BLOCK_BYTES, BLOCK_BYTES) == 0);
    /* cut to 3 blocks: slot 3 is past the end; then slot 7 rewritten leaves slots 3.. as holes */
    cr_assert_eq(ftruncate(fd, 3 * BLOCK_BYTES), 0);
    int32_t three[1] = {3};
    cr_assert_eq(kvtier_submit(t, SCHED_XFER_IN, SCHED_POOL_DISK, dst, three, 1, 4, on_done, &d),
                 0);
    wait_done(&ring, t, &d, 4);
    cr_assert_eq(d.res, -ENODATA, "a block past the end: res %d", d.res);
    int32_t six[1] = {6};
    cr_assert_eq(kvtier_copy(t, SCHED_POOL_DISK, SCHED_POOL_DEVICE, six, dst, 1, &us), -ENODATA);
    int32_t b7[1] = {7}, s7[1] = {7};
    cr_assert_eq(kvtier_copy(t, SCHED_POOL_DEVICE, SCHED_POOL_DISK, b7, s7, 1, &us), 0);
    cr_assert_eq(kvtier_copy(t, SCHED_POOL_DISK, SCHED_POOL_DEVICE, six, dst, 1, &us), -EBADMSG,
                 "a hole read as zeros");
    cr_assert_eq(kvtier_read_failures(t, SCHED_POOL_DISK, KVTIER_READ_CHECKSUM), 2u);
    cr_assert_eq(kvtier_read_failures(t, SCHED_POOL_DISK, KVTIER_READ_SHORT), 2u);
    cr_assert_eq(kvtier_read_failures(t, SCHED_POOL_DISK, KVTIER_READ_IO), 0u);
    close(fd);
    kvtier_destroy(t);
    io_uring_queue_exit(&ring);
    unlink(path);
    free(orig);
    munmap(pool, len);
}

/* ---- a damaged tier under a running ringlmd ------------------------------------------------ */

#define REF_CASES 4

typedef struct ref_case {
    int32_t prompt[16], gen[600];
    uint32_t n_prompt, n_gen, max_new;
    bool stops;
} ref_case;

/* The four 256-step greedy cases of the shared reference (~17 blocks of 16 tokens each at the
 * end): false when the reference is absent. */
static bool load_refs(ref_case *out)
{
    char *p = th_shared_file("models/reference-greedy.json");
    json_error_t e;
    json_t *j = json_load_file(p, 0, &e);
    free(p);
    if (!j) return false;
    json_t *cases = json_object_get(j, "cases");
    int n = 0, kept = 0;
    for (size_t i = 0; i < json_array_size(cases) && kept < REF_CASES; i++) {
        json_t *c = json_array_get(cases, i), *pt = json_object_get(c, "prompt_tokens"),
               *gt = json_object_get(c, "generated_tokens");
        if (json_array_size(pt) > 16 || json_array_size(gt) > 600) continue;
        if (n++ < 4) continue; /* (the first four are short) */
        ref_case *r = &out[kept++];
        memset(r, 0, sizeof *r);
        for (size_t k = 0; k < json_array_size(pt); k++)
            r->prompt[r->n_prompt++] = (int32_t)json_integer_value(json_array_get(pt, k));
        for (size_t k = 0; k < json_array_size(gt); k++)
            r->gen[r->n_gen++] = (int32_t)json_integer_value(json_array_get(gt, k));
        r->stops = json_is_true(json_object_get(c, "stopped_on_bos"));
        int steps = (int)json_integer_value(json_object_get(c, "effective_steps"));
        r->max_new = (uint32_t)(steps - (int)r->n_prompt + 1);
    }
    json_decref(j);
    return kept == REF_CASES;
}

/* A swapping daemon's files in its private directory. The policy (written here) makes every
 * preemption a swap, never refused for residency or count: with 17–24 device blocks of 16
 * tokens the four reference sequences (~17 blocks each at the end) swap all the time. */
typedef struct swap_files {
    char policy[160], declog[160], disk[160], out[160];
} swap_files;

/* The reference cases (the test skips without them), d's directory with f in it; returns
 * the model's path (free it). */
static char *swap_setup(ref_case *cases, th_daemon *d, swap_files *f)
{
    if (!load_refs(cases)) cr_skip_test("reference-greedy.json has not the 256-step cases");
    th_daemon_init(d);
    snprintf(f->policy, sizeof f->policy, "%s/policy.conf", d->dir);
    snprintf(f->declog, sizeof f->declog, "%s/decisions.jsonl", d->dir);
    snprintf(f->disk, sizeof f->disk, "%s/kv.disk", d->dir);
    snprintf(f->out, sizeof f->out, "%s/answers.txt", d->dir);
    FILE *pf = fopen(f->policy, "w");
    cr_assert_not_null(pf);
    fputs("[scheduler]\nmode = token_budget\ntoken_budget = 64\nmax_active_seqs = 8\n"
          "prefill_chunk = 32\npreemption = swap\nmin_residency = 0us\nmax_preemptions = 0\n",
          pf);
    fclose(pf);
    return th_shared_file("models/stories260K.bin");
}

/* A client process: rounds of the four cases at once until stop_fd is readable (or
 * max_rounds), one line per answer to out: "ok", "error" (the request ended with an error)
 * or "wrong ..." (any other difference from the greedy reference). Exits 4 when no event
 * comes for wait_ms. */
static int greedy_rounds(const char *sock, const ref_case *cases, const char *out, int stop_fd,
                         int max_rounds, int wait_ms)
{
    FILE *f = fopen(out, "w");
    ringlm_client *c;
    if (!f || ringlm_connect(sock, &c) < 0) return 2;
    static int32_t got[REF_CASES][600];
    for (int round = 0; round < max_rounds && !th_readable(stop_fd, 0); round++) {
        uint64_t ids[REF_CASES];
        uint32_t n_got[REF_CASES] = {0};
        for (int i = 0; i < REF_CASES; i++) {
            ringlm_request r;
            ringlm_request_init(&r);
            r.prompt = cases[i].prompt;
            r.n_prompt = cases[i].n_prompt;
            r.max_new_tokens = cases[i].max_new;
            if (ringlm_submit(c, &r, &ids[i]) < 0) return 3;
        }
        for (int left = REF_CASES; left > 0;) {
            ringlm_event ev;
            if (ringlm_next_event(c, &ev, wait_ms) <= 0) {
                fprintf(f, "no event for %d ms: round %d, %d answers missing\n", wait_ms, round,
                        left);
                fclose(f);
                return 4;
            }
            int i = 0;
            while (i < REF_CASES && ids[i] != ev.req_id) i++;
            if (i == REF_CASES) return 5;
            if (ev.kind == RINGLM_EV_TOKEN && n_got[i] < 600) got[i][n_got[i]++] = ev.token;
            if (ev.kind != RINGLM_EV_FINISH) continue;
            left--;
            const ref_case *rc = &cases[i];
            int want = rc->stops ? RINGLM_FINISH_STOP : RINGLM_FINISH_LENGTH;
            uint32_t k = 0;
            while (k < n_got[i] && k < rc->n_gen && got[i][k] == rc->gen[k]) k++;
            if (ev.finish_reason == RINGLM_FINISH_ERROR)
                fprintf(f, "error\n");
            else if (ev.finish_reason == want && n_got[i] == rc->n_gen && k == rc->n_gen)
                fprintf(f, "ok\n");
            else
                fprintf(f, "wrong: round %d case %d finish %s, %u tokens, first difference at %u\n",
                        round, i, ringlm_reason_name(ev.finish_reason), n_got[i], k);
            fflush(f);
        }
    }
    ringlm_close(c);
    fclose(f);
    return 0;
}

/* ringlm_kv_tier_read_failures_total of tier, summed over reasons (-1: no /metrics). */
static long long read_failures(int port, const char *tier, long long *checksum,
                               long long *short_read)
{
    int status = 0;
    char *body = th_http_get(port, "/metrics", &status, NULL, 0);
    if (!body) return -1;
    long long sum = 0;
    char key[96];
    snprintf(key, sizeof key, "ringlm_kv_tier_read_failures_total{tier=\"%s\",reason=\"", tier);
    for (char *p = strstr(body, key); p; p = strstr(p + 1, key)) {
        char reason[32];
        long long v;
        if (sscanf(p + strlen(key), "%31[a-z_]\"} %lld", reason, &v) != 2) continue;
        sum += v;
        if (!strcmp(reason, "checksum")) *checksum = v;
        if (!strcmp(reason, "short_read")) *short_read = v;
    }
    free(body);
    return sum;
}

/* Lines of path holding needle, and needle2 too when not NULL. */
static int count_lines2(const char *path, const char *needle, const char *needle2)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) && (!needle2 || strstr(line, needle2));
    fclose(f);
    return n;
}

static int count_lines(const char *path, const char *needle)
{
    return count_lines2(path, needle, NULL);
}

/* The host tier's memfd, opened through /proc for writing (as root may): -1 when not found. */
static int open_host_tier(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    int fd = -1;
    for (struct dirent *e; d && fd < 0 && (e = readdir(d));) {
        char p[384], target[256];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        ssize_t n = readlink(p, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        if (strstr(target, "memfd:ringlmd-kv-host")) fd = open(p, O_RDWR | O_CLOEXEC);
    }
    if (d) closedir(d);
    return fd;
}

/*
 * Swaps through a KV pool too small for the four reference sequences at once, while this
 * process damages the tier under the daemon — the disk tier file cut to nothing (a read of a
 * slot past its end comes back short; a hole left below a later write reads as zeros) and
 * overwritten with garbage; the host tier's memory overwritten through its memfd. Every answer
 * must still be the greedy reference tokens (a block that fails its checksum is not used: the
 * sequence recomputes) or end with an error — and the damage is counted on /metrics and in
 * the decision log ("damaged" swap-ins).
 */
static void damaged_tier(sched_pool tier)
{
    static ref_case cases[REF_CASES];
    th_daemon d;
    swap_files f;
    char *model = swap_setup(cases, &d, &f);
    const char *args[] = {"--model",
                          model,
                          "--policy",
                          f.policy,
                          "--kv-blocks",
                          "24",
                          "--kv-block-size",
                          "16",
                          "--decision-log",
                          f.declog,
                          "--no-prefix-cache",
                          "--metrics",
                          "127.0.0.1:0",
                          tier == SCHED_POOL_DISK ? "--disk-kv" : "--host-kv-blocks",
                          tier == SCHED_POOL_DISK ? f.disk : "64",
                          tier == SCHED_POOL_DISK ? "--disk-kv-blocks" : NULL,
                          "64",
                          NULL};
    th_daemon_start(&d, args, 100000);
    int port = 0;
    for (uint64_t until = th_now_ms() + 10000; !port && th_now_ms() < until; th_pause_ms(5)) {
        const char *o = th_daemon_output(&d), *m = strstr(o, "metrics on port ");
        if (m) port = atoi(m + strlen("metrics on port "));
    }
    cr_assert_gt(port, 0, "no metrics port: %s", th_daemon_output(&d));
    int fd = tier == SCHED_POOL_DISK ? open(f.disk, O_RDWR | O_CLOEXEC) : open_host_tier(d.pid);
    if (fd < 0 && tier == SCHED_POOL_HOST)
        cr_skip_test("cannot open the host tier's memfd through /proc (needs root): %s",
                     strerror(errno));
    cr_assert_geq(fd, 0, "%s: %s", f.disk, strerror(errno));
    if (tier == SCHED_POOL_HOST) /* cutting the host tier would SIGBUS the daemon: sealed */
        cr_assert(ftruncate(fd, 0) < 0 && errno == EPERM, "the host tier's size is not sealed");

    int stop[2];
    cr_assert_eq(pipe(stop), 0);
    pid_t client = fork();
    cr_assert_geq(client, 0);
    if (client == 0) {
        close(stop[1]);
        _exit(greedy_rounds(d.sock, cases, f.out, stop[0], 40, 60000));
    }
    close(stop[0]);
    /* damage until the daemon counted some, the client ran its rounds, or 60 s */
    size_t len = (size_t)64 * 20480;
    char *garbage = malloc(len);
    for (size_t i = 0; i < len; i++) garbage[i] = (char)(i * 2654435761u >> 13);
    long long failures = 0, checksum = 0, short_read = 0;
    int st = -1, round = 0;
    for (uint64_t until = th_now_ms() + 60000; th_now_ms() < until; round++) {
        if (tier == SCHED_POOL_DISK && round % 2 == 0)
            cr_assert_eq(ftruncate(fd, 0), 0, "%s", strerror(errno));
        else
            cr_assert_eq(pwrite(fd, garbage, len, 0), (ssize_t)len, "%s", strerror(errno));
        th_pause_ms(2); /* (pacing: the daemon swaps meanwhile) */
        if (round % 20 == 0)
            failures = read_failures(port, sched_pool_name(tier), &checksum, &short_read);
        if (failures >= 5 && (tier != SCHED_POOL_DISK || short_read > 0)) break;
        if (waitpid(client, &st, WNOHANG) == client) break;
    }
    close(stop[1]);
    if (st < 0) st = th_reap(client, 120000);
    close(fd);
    free(garbage);
    failures = read_failures(port, sched_pool_name(tier), &checksum, &short_read);
    cr_assert_eq(th_daemon_stop(&d, SIGTERM, 10000), 0, "%s", th_daemon_output(&d));
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client status 0x%x: %s", st,
              th_daemon_output(&d));
    int ok = count_lines(f.out, "ok"), errors = count_lines(f.out, "error"),
        wrong = count_lines(f.out, "wrong");
    int damaged = count_lines(f.declog, "\"reason\":\"damaged\"");
    cr_log_info("%s tier: %d answers right, %d errors, %d wrong; %lld reads not used (%lld "
                "checksum, %lld short), %d damaged swap-ins logged",
                sched_pool_name(tier), ok, errors, wrong, failures, checksum, short_read, damaged);
    if (wrong) {
        char *o = th_read_file(f.out);
        cr_log_error("%s", o);
        free(o);
    }
    cr_expect_eq(wrong, 0, "%d answers differ from the greedy reference", wrong);
    cr_expect_gt(ok, 0, "no answer came back right");
    cr_expect_gt(failures, 0, "the damage was never detected");
    cr_expect_gt(damaged, 0, "the decision log has no damaged swap-in");
    th_daemon_cleanup(&d);
    free(model);
}

Test(daemon_kvtier, disk_tier_cut_and_overwritten_under_the_daemon, .timeout = 240)
{
    damaged_tier(SCHED_POOL_DISK);
}

Test(daemon_kvtier, host_tier_overwritten_under_the_daemon, .timeout = 240)
{
    damaged_tier(SCHED_POOL_HOST);
}

/* The last `lines` lines of a file into buf (at most cap - 1 bytes of them), for failure
 * messages. Returns buf. */
static const char *file_tail(const char *path, int lines, char *buf, size_t cap)
{
    char *t = th_read_file(path);
    buf[0] = 0;
    if (!t) return buf;
    size_t n = strlen(t), i = n;
    for (int k = 0; i > 0 && k <= lines; i--)
        if (t[i - 1] == '\n') k++;
    if (n - i >= cap) i = n - (cap - 1);
    snprintf(buf, cap, "%s", t + i);
    free(t);
    return buf;
}

/*
 * Every read from the disk tier fails (ringlmd-test --fail-kv-reads disk) while the policy
 * swaps the four reference sequences through 17 device blocks (one sequence's most): every
 * swap-in fails, and its sequence computes its context again. A sequence is swapped out when
 * it needs its next block, so that re-prefill needs a block more than its swap-in brought
 * back; re-prefilled in the swap-in's blocks, two or three such sequences came to hold the
 * whole pool between them, each waiting for a block another held, and their client never
 * got another event (the disk_tier_cut test above hung so once in ~1,500 runs; this test in
 * 5 of 6 runs, mostly by round 10). Every request must be answered, with the greedy
 * reference tokens, every round.
 */
Test(daemon_kvtier, every_disk_swap_in_failing_still_answers_every_request, .timeout = 240)
{
    static ref_case cases[REF_CASES];
    th_daemon d;
    swap_files f;
    char *model = swap_setup(cases, &d, &f);
    const char *args[] = {TH_TEST_BUILD,
                          "--model",
                          model,
                          "--policy",
                          f.policy,
                          "--kv-blocks",
                          "17",
                          "--kv-block-size",
                          "16",
                          "--decision-log",
                          f.declog,
                          "--no-prefix-cache",
                          "--disk-kv",
                          f.disk,
                          "--disk-kv-blocks",
                          "64",
                          "--fail-kv-reads",
                          "disk",
                          NULL};
    th_daemon_start(&d, args, 100000);
    enum { ROUNDS = 80 };
    int never[2];
    cr_assert_eq(pipe(never), 0);
    pid_t client = fork();
    cr_assert_geq(client, 0);
    if (client == 0) {
        close(never[1]);
        /* 20 s without an event is no slow step: nothing runs any more */
        _exit(greedy_rounds(d.sock, cases, f.out, never[0], ROUNDS, 20000));
    }
    close(never[0]);
    int st = th_reap(client, 200000);
    close(never[1]);
    int ok = count_lines(f.out, "ok"), wrong = count_lines(f.out, "wrong"),
        errors = count_lines(f.out, "error");
    int swap_ins_failed = count_lines2(f.declog, "\"ev\":\"swap_in\"", "\"reason\":\"failed\"");
    static char out_tail[1024], log_tail[6000];
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "client status 0x%x after %d answers (%d swap-ins failed); its last lines:\n%s\n"
              "the decision log ends:\n%s",
              st, ok + wrong + errors, swap_ins_failed,
              file_tail(f.out, 2, out_tail, sizeof out_tail),
              file_tail(f.declog, 12, log_tail, sizeof log_tail));
    cr_assert_eq(th_daemon_stop(&d, SIGTERM, 10000), 0, "%s", th_daemon_output(&d));
    cr_log_info("%d answers right, %d errors, %d wrong; %d swap-ins failed", ok, errors, wrong,
                swap_ins_failed);
    cr_expect_eq(wrong, 0, "%d answers differ from the greedy reference:\n%s", wrong,
                 file_tail(f.out, 10, log_tail, sizeof log_tail));
    cr_expect_eq(ok, ROUNDS * REF_CASES, "%d of %d answers right (%d errors)", ok,
                 ROUNDS * REF_CASES, errors);
    cr_expect_gt(swap_ins_failed, 0, "no swap-in failed: the test tests nothing");
    th_daemon_cleanup(&d);
    free(model);
}
