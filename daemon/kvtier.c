/* SPDX-License-Identifier: MIT */
/*
 * KV host/disk tiers: both are files, so a swap is an io_uring write from the pool block
 * into the tier file and a swap-in is a read back. See kvtier.h for the contract.
 */
#include "daemon/kvtier.h"
#include "common/errdetail.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "numa/rnuma.h"

#define KVT_MAX_OPS         4096
#define KVT_MAX_JOBS        1024
#define KVT_COPY_QD         64 /* kvtier_copy's ring */
#define KVT_DIRECT_ALIGN    4096
/* io_uring caps one registered buffer at 1 GiB. */
#define KVT_FIXED_CHUNK_MAX (1ull << 30)

ERRDETAIL_DEFINE(kvt_err);
const char *kvtier_errmsg(void)
{
    return kvt_err.msg;
}
#define seterr(err, ...) errdetail_set(&kvt_err, (err), __VA_ARGS__)

enum op_kind { OP_FREE = 0, OP_RW, OP_BOUNCE, OP_EVENTFD };

typedef struct kvt_op {
    int kind;
    int job;
    int fd;
    int to_file; /* 1: write (pool → file), 0: read (file → pool) */
    char *buf;
    size_t len;
    off_t off;
    int buf_index;  /* fixed buffer index, -1 when not registered */
    int pool_block; /* the first pool block (bounce ops: the one to copy in after a read) */
    int slot;       /* the first tier slot, and how many blocks: their checksums */
    int n_blocks;
    char *bounce; /* owned bounce buffer (device pools) */
    int next_free;
} kvt_op;

typedef struct kvt_job {
    bool in_use;
    bool silent; /* destroy in progress: no callback */
    sched_xfer_dir dir;
    sched_pool tier;
    int pending;
    int res;
    size_t bytes;
    uint64_t t_start_ns;
    uint64_t cookie;
    kvtier_done_fn done;
    void *ctx;
    int next_free;
    int next_async;       /* FIFO link for eventfd-completed jobs */
    int32_t *async_slots; /* an async swap-out's slots: checksummed when the copy completed */
    int n_async;
} kvt_job;

/* Every block written to a tier has its XXH3-64 recorded here (sum[slot]) when it is written,
 * and a block read back is used only when its bytes hash to the same: a tier file that was
 * truncated (holes read as zeros, or the read stops at its end) or overwritten, or host memory
 * that changed, fails the read (-EBADMSG, -ENODATA) instead of handing a sequence a KV block
 * it never computed. The sums live in the daemon's private memory, not beside the blocks in
 * the file that might be damaged with them. */
typedef struct kvt_pool {
    int blocks;
    int fd;
    void *map; /* host tier only */
    size_t map_len;
    uint64_t *sum; /* [blocks]: the checksum of what was last written to each slot */
} kvt_pool;

struct kvtier {
    kvtier_config cfg;
    kvt_pool tier[SCHED_POOL__COUNT]; /* indexed by sched_pool; [SCHED_POOL_DEVICE] stays empty */
    bool direct;                      /* disk opened with O_DIRECT */
    bool fixed;                       /* pool registered as fixed buffers */
    size_t fixed_chunk;
    bool mlocked;
    int efd; /* CUDA async completions */
    bool efd_armed;
    uint64_t efd_val;
    int async_head, async_tail;
    kvt_op ops[KVT_MAX_OPS];
    int op_free;
    kvt_job jobs[KVT_MAX_JOBS];
    int job_free;
    int jobs_inflight;
    int ops_inflight;
    uint64_t bytes_moved[2][SCHED_POOL__COUNT]; /* [sched_xfer_dir][sched_pool] */
    uint64_t jobs_done[2][SCHED_POOL__COUNT];
    uint64_t ops_submitted;
    uint64_t read_failures[SCHED_POOL__COUNT][KVTIER_READ__COUNT];
    char describe[256];
    struct io_uring sring; /* kvtier_copy's own ring */
    bool sring_ok;
    void *bounce; /* kvtier_copy's block buffer for device pools */
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void logf_(kvtier *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(kvtier *t, const char *fmt, ...)
{
    char buf[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (t->cfg.log)
        t->cfg.log(t->cfg.log_ctx, buf);
    else
        fprintf(stderr, "ringlmd: kvtier: %s\n", buf);
}

/* ---- tiers --------------------------------------------------------------------------- */

/* Which slot holds what is the scheduler's (its host and disk pools): a tier here is only
 * the file the blocks are moved to and from. */
static int pool_init(kvt_pool *p, int blocks)
{
    p->blocks = blocks;
    p->fd = -1;
    if (blocks > 0 && !(p->sum = calloc((size_t)blocks, sizeof *p->sum)))
        return seterr(-ENOMEM, "kvtier: checksums of %d slots: out of memory", blocks);
    return 0;
}

static void pool_fini(kvt_pool *p)
{
    if (p->map) munmap(p->map, p->map_len);
    if (p->fd >= 0) close(p->fd);
    free(p->sum);
    memset(p, 0, sizeof *p);
    p->fd = -1;
}

/* ---- checksums ----------------------------------------------------------------------- */

/* The checksums of n consecutive blocks at src, now in slots slot.. of tier. */
static void sums_record(kvtier *t, sched_pool tier, int slot, const char *src, int n)
{
    size_t bb = t->cfg.block_bytes;
    for (int i = 0; i < n; i++) t->tier[tier].sum[slot + i] = XXH3_64bits(src + (size_t)i * bb, bb);
}

/* 0 when the n consecutive blocks at src, read from slots slot.. of tier, are the bytes that
 * were written there; -EBADMSG (logged) when one is not. */
static int sums_check(kvtier *t, sched_pool tier, int slot, const char *src, int n)
{
    size_t bb = t->cfg.block_bytes;
    for (int i = 0; i < n; i++) {
        uint64_t h = XXH3_64bits(src + (size_t)i * bb, bb), want = t->tier[tier].sum[slot + i];
        if (h != want) {
            logf_(t,
                  "%s tier slot %d: the block read back fails its checksum (%016llx, written "
                  "%016llx); it is not used",
                  sched_pool_name(tier), slot + i, (unsigned long long)h, (unsigned long long)want);
            return -EBADMSG;
        }
    }
    return 0;
}

kvtier_read_failure kvtier_read_failure_of(int res)
{
    return res == -EBADMSG   ? KVTIER_READ_CHECKSUM
           : res == -ENODATA ? KVTIER_READ_SHORT
                             : KVTIER_READ_IO;
}

const char *kvtier_read_failure_name(kvtier_read_failure f)
{
    static const char *const names[] = {"checksum", "short_read", "io_error"};
    _Static_assert(sizeof names / sizeof names[0] == KVTIER_READ__COUNT, "names");
    return (unsigned)f < KVTIER_READ__COUNT ? names[f] : "?";
}

uint64_t kvtier_read_failures(const kvtier *t, sched_pool tier, kvtier_read_failure f)
{
    return (unsigned)tier < SCHED_POOL__COUNT && (unsigned)f < KVTIER_READ__COUNT
               ? t->read_failures[tier][f]
               : 0;
}

int kvtier_blocks(const kvtier *t, sched_pool tier)
{
    if (!t || (unsigned)tier >= SCHED_POOL__COUNT) return 0;
    return t->tier[tier].blocks;
}


/* ---- setup --------------------------------------------------------------------------- */

static int setup_host(kvtier *t)
{
    kvt_pool *p = &t->tier[SCHED_POOL_HOST];
    size_t len = (size_t)p->blocks * t->cfg.block_bytes;
    p->fd = memfd_create("ringlmd-kv-host", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (p->fd < 0) return seterr(-errno, "memfd_create for the host KV tier: %s", strerror(errno));
    if (ftruncate(p->fd, (off_t)len) < 0)
        return seterr(-errno, "host KV tier: ftruncate to %zu bytes: %s", len, strerror(errno));
    /* Its size is sealed: a process that reaches the memfd (through /proc, as root) and cut it
     * would make the daemon's next access to the mapping a SIGBUS. What it writes is caught
     * by the checksums. */
    if (fcntl(p->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
        logf_(t, "host tier: sealing its size failed: %s", strerror(errno));
    p->map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
    if (p->map == MAP_FAILED) {
        p->map = NULL;
        return seterr(-errno, "host KV tier: mmap of %zu bytes: %s", len, strerror(errno));
    }
    p->map_len = len;
    if (t->cfg.numa_node >= 0 && rnuma_place(p->map, len, t->cfg.numa_node) < 0)
        logf_(t, "host tier: NUMA placement on node %d failed: %s", t->cfg.numa_node,
              rnuma_errmsg());
    /* mlock keeps the swapped KV resident: a swap-in that page-faults from swap would cost
     * more than the recompute it was chosen over. Without the privilege it still works. */
    if (mlock(p->map, len) == 0) {
        t->mlocked = true;
    } else {
        int e = errno;
        logf_(t,
              "host tier: mlock of %zu bytes failed (%s); the tier works but may be paged "
              "out — raise LimitMEMLOCK",
              len, strerror(e));
        /* Fault it in anyway so the first swap does not pay for it. */
        memset(p->map, 0, len);
    }
    return 0;
}

static bool aligned_for_direct(const kvtier *t)
{
    if (t->cfg.block_bytes % KVT_DIRECT_ALIGN) return false;
    if (t->cfg.pool_base && ((uintptr_t)t->cfg.pool_base % KVT_DIRECT_ALIGN)) return false;
    return true;
}

/* The disk tier file is ringlmd's: it is created here, or it is an empty file, or it ends
 * in this trailer (written past the last block) that says an earlier ringlmd made it. Any
 * other file at the path is someone else's and is left as it is: a typo in --disk-kv must
 * not truncate and overwrite a file the operator cares about. */
#define KVT_TRAILER_BYTES KVT_DIRECT_ALIGN
static const char kvt_trailer_magic[] = "ringlmd disk KV tier file: scratch space, no data to "
                                        "keep; ringlmd rewrites it at every start\n";

/* Whether an existing file is the disk tier's own: an empty regular file, or one that ends
 * in the trailer. */
static bool disk_file_is_ours(int fd)
{
    struct stat st;
    char tail[sizeof kvt_trailer_magic];
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return false;
    if (st.st_size == 0) return true;
    return st.st_size >= KVT_TRAILER_BYTES &&
           pread(fd, tail, sizeof tail - 1, st.st_size - KVT_TRAILER_BYTES) ==
               (ssize_t)(sizeof tail - 1) &&
           memcmp(tail, kvt_trailer_magic, sizeof tail - 1) == 0;
}

static int not_ours(const char *path)
{
    return seterr(-EEXIST,
                  "disk KV tier %s: exists and is not a ringlmd disk tier file (not empty, no "
                  "ringlmd trailer): left as it is; remove it or choose another path",
                  path);
}

static int open_disk_file(const char *path, int *out)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
        *out = fd;
        return 0;
    }
    if (errno != EEXIST) return seterr(-errno, "disk KV tier %s: %s", path, strerror(errno));
    fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return seterr(-errno, "disk KV tier %s: exists and cannot be opened (%s)", path,
                      strerror(errno));
    if (!disk_file_is_ours(fd)) {
        close(fd);
        return not_ours(path);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *out = fd;
    return 0;
}

int kvtier_check_disk_path(const char *path)
{
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
        bool ours = disk_file_is_ours(fd);
        close(fd);
        return ours ? 0 : not_ours(path);
    }
    if (errno != ENOENT)
        return seterr(-errno, "disk KV tier %s: exists and cannot be opened (%s)", path,
                      strerror(errno));
    /* Absent: its directory must let us create it. */
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return seterr(-errno, "disk KV tier %s: %s", path, strerror(errno));
    close(fd);
    unlink(path); /* the empty file this call created, and nothing else */
    return 0;
}

static int setup_disk(kvtier *t)
{
    kvt_pool *p = &t->tier[SCHED_POOL_DISK];
    size_t len = (size_t)p->blocks * t->cfg.block_bytes;
    const char *path = t->cfg.disk_path;
    int fd = -1;
    int rc = open_disk_file(path, &fd);
    if (rc < 0) return rc;
    p->fd = fd;
    if (ftruncate(fd, (off_t)(len + KVT_TRAILER_BYTES)) < 0)
        return seterr(-errno, "disk KV tier %s: ftruncate to %zu bytes: %s", path,
                      len + KVT_TRAILER_BYTES, strerror(errno));
    if (pwrite(fd, kvt_trailer_magic, sizeof kvt_trailer_magic - 1, (off_t)len) !=
        (ssize_t)(sizeof kvt_trailer_magic - 1))
        return seterr(errno ? -errno : -EIO, "disk KV tier %s: writing its trailer: %s", path,
                      strerror(errno ? errno : EIO));
    if (!aligned_for_direct(t)) {
        logf_(t,
              "disk tier %s: block of %zu bytes (or pool address) not %d-aligned; using "
              "buffered I/O",
              path, t->cfg.block_bytes, KVT_DIRECT_ALIGN);
    } else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_DIRECT) == 0) {
        t->direct = true;
    } else {
        logf_(t, "disk tier %s: the filesystem refuses O_DIRECT (%s); using buffered I/O", path,
              strerror(errno));
    }
    return 0;
}

static void setup_fixed(kvtier *t)
{
    size_t len = (size_t)t->cfg.pool_blocks * t->cfg.block_bytes;
    size_t chunk = (KVT_FIXED_CHUNK_MAX / t->cfg.block_bytes) * t->cfg.block_bytes;
    if (chunk == 0) return;
    size_t n = (len + chunk - 1) / chunk;
    struct iovec *iov = calloc(n, sizeof *iov);
    if (!iov) return;
    for (size_t i = 0; i < n; i++) {
        iov[i].iov_base = (char *)t->cfg.pool_base + i * chunk;
        iov[i].iov_len = (i + 1 < n) ? chunk : len - i * chunk;
    }
    int rc = io_uring_register_buffers(t->cfg.ring, iov, (unsigned)n);
    free(iov);
    if (rc == 0) {
        t->fixed = true;
        t->fixed_chunk = chunk;
    } else {
        logf_(t,
              "registering the KV pool (%zu bytes) as io_uring fixed buffers failed (%s); "
              "using plain reads/writes",
              len, strerror(-rc));
    }
}

int kvtier_create(const kvtier_config *cfg, kvtier **out)
{
    *out = NULL;
    if (!cfg->ring) return seterr(-EINVAL, "kvtier: ring is NULL");
    if (cfg->block_bytes == 0) return seterr(-EINVAL, "kvtier: block_bytes is 0");
    if (cfg->pool_blocks <= 0) return seterr(-EINVAL, "kvtier: pool_blocks=%d", cfg->pool_blocks);
    if (!cfg->pool_base && !cfg->engine)
        return seterr(-EINVAL, "kvtier: neither a host pool base nor an engine");
    if (cfg->host_blocks < 0) return seterr(-EINVAL, "kvtier: host_blocks=%d", cfg->host_blocks);
    if (cfg->disk_path && cfg->disk_blocks <= 0)
        return seterr(-EINVAL, "kvtier: disk tier %s with disk_blocks=%d", cfg->disk_path,
                      cfg->disk_blocks);
    if (cfg->ud_tag & KVTIER_UD_INDEX_MASK)
        return seterr(-EINVAL, "kvtier: ud_tag overlaps the low 32 bits");

    kvtier *t = calloc(1, sizeof *t);
    if (!t) return seterr(-ENOMEM, "kvtier: out of memory");
    t->cfg = *cfg;
    t->efd = -1;
    t->async_head = t->async_tail = -1;
    for (int i = 0; i < KVT_MAX_OPS; i++) t->ops[i].next_free = i + 1 < KVT_MAX_OPS ? i + 1 : -1;
    t->op_free = 0;
    for (int i = 0; i < KVT_MAX_JOBS; i++) t->jobs[i].next_free = i + 1 < KVT_MAX_JOBS ? i + 1 : -1;
    t->job_free = 0;
    int rc;
    for (int k = 0; k < SCHED_POOL__COUNT; k++) t->tier[k].fd = -1;
    if ((rc = pool_init(&t->tier[SCHED_POOL_HOST], cfg->host_blocks)) < 0 ||
        (rc = pool_init(&t->tier[SCHED_POOL_DISK], cfg->disk_path ? cfg->disk_blocks : 0)) < 0)
        goto fail;
    if (cfg->host_blocks > 0 && (rc = setup_host(t)) < 0) goto fail;
    if (cfg->disk_path && (rc = setup_disk(t)) < 0) goto fail;
    if (cfg->pool_base && cfg->register_buffers) setup_fixed(t);
    /* kvtier_copy's ring, set up now so the first copy's measured time is the copy's */
    if ((rc = io_uring_queue_init(KVT_COPY_QD, &t->sring, 0)) < 0) {
        rc = seterr(rc, "kvtier: io_uring for copies: %s", strerror(-rc));
        goto fail;
    }
    t->sring_ok = true;
    if (!cfg->pool_base) {
        t->efd = eventfd(0, EFD_CLOEXEC);
        if (t->efd < 0) {
            rc = seterr(-errno, "kvtier: eventfd: %s", strerror(errno));
            goto fail;
        }
    }
    snprintf(t->describe, sizeof t->describe,
             "kv tiers: host %d blocks (%s), disk %d blocks%s%s, pool %s, %zu bytes/block",
             t->tier[SCHED_POOL_HOST].blocks, t->mlocked ? "mlocked" : "not locked",
             t->tier[SCHED_POOL_DISK].blocks,
             cfg->disk_path ? (t->direct ? " O_DIRECT" : " buffered") : "",
             cfg->disk_path ? "" : "",
             cfg->pool_base ? (t->fixed ? "host, fixed buffers" : "host, plain buffers")
                            : "device, async copies",
             cfg->block_bytes);
    *out = t;
    return 0;
fail:
    if (t->fixed) io_uring_unregister_buffers(t->cfg.ring);
    for (int k = 0; k < SCHED_POOL__COUNT; k++) pool_fini(&t->tier[k]);
    free(t);
    return rc;
}

/* ---- ops and jobs -------------------------------------------------------------------- */

static int op_get(kvtier *t)
{
    int i = t->op_free;
    if (i < 0) return -1;
    t->op_free = t->ops[i].next_free;
    memset(&t->ops[i], 0, sizeof t->ops[i]);
    t->ops_inflight++;
    return i;
}

static void op_put(kvtier *t, int i)
{
    free(t->ops[i].bounce);
    t->ops[i].bounce = NULL;
    t->ops[i].kind = OP_FREE;
    t->ops[i].next_free = t->op_free;
    t->op_free = i;
    t->ops_inflight--;
}

static struct io_uring_sqe *get_sqe(kvtier *t)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(t->cfg.ring);
    if (!sqe) {
        io_uring_submit(t->cfg.ring);
        sqe = io_uring_get_sqe(t->cfg.ring);
    }
    return sqe;
}

static int queue_rw(kvtier *t, int oi)
{
    kvt_op *op = &t->ops[oi];
    struct io_uring_sqe *sqe = get_sqe(t);
    if (!sqe) return -EBUSY;
    if (op->buf_index >= 0) {
        if (op->to_file)
            io_uring_prep_write_fixed(sqe, op->fd, op->buf, (unsigned)op->len, (uint64_t)op->off,
                                      op->buf_index);
        else
            io_uring_prep_read_fixed(sqe, op->fd, op->buf, (unsigned)op->len, (uint64_t)op->off,
                                     op->buf_index);
    } else if (op->to_file) {
        io_uring_prep_write(sqe, op->fd, op->buf, (unsigned)op->len, (uint64_t)op->off);
    } else {
        io_uring_prep_read(sqe, op->fd, op->buf, (unsigned)op->len, (uint64_t)op->off);
    }
    io_uring_sqe_set_data64(sqe, t->cfg.ud_tag | (uint64_t)oi);
    return 0;
}

static void arm_efd(kvtier *t)
{
    if (t->efd_armed) return;
    int oi = op_get(t);
    if (oi < 0) return;
    struct io_uring_sqe *sqe = get_sqe(t);
    if (!sqe) {
        op_put(t, oi);
        return;
    }
    t->ops[oi].kind = OP_EVENTFD;
    t->ops[oi].job = -1;
    io_uring_prep_read(sqe, t->efd, &t->efd_val, sizeof t->efd_val, 0);
    io_uring_sqe_set_data64(sqe, t->cfg.ud_tag | (uint64_t)oi);
    t->efd_armed = true;
}

static void job_finish(kvtier *t, int ji)
{
    kvt_job *j = &t->jobs[ji];
    uint64_t el_us = (now_ns() - j->t_start_ns) / 1000;
    if (j->res == 0 && j->dir == SCHED_XFER_IN && (t->cfg.fail_reads & (1u << j->tier)))
        j->res = -EIO; /* injected */
    if (j->async_slots) {
        if (j->res == 0) /* an async swap-out: the bytes that arrived in the host tier */
            for (int i = 0; i < j->n_async; i++)
                sums_record(t, j->tier, j->async_slots[i],
                            (char *)t->tier[j->tier].map +
                                (size_t)j->async_slots[i] * t->cfg.block_bytes,
                            1);
        free(j->async_slots);
        j->async_slots = NULL;
    }
    if (j->res < 0 && j->dir == SCHED_XFER_IN)
        t->read_failures[j->tier][kvtier_read_failure_of(j->res)]++;
    if (j->res == 0) {
        t->bytes_moved[j->dir][j->tier] += j->bytes;
        t->jobs_done[j->dir][j->tier]++;
    }
    kvtier_done_fn done = j->done;
    void *ctx = j->ctx;
    uint64_t cookie = j->cookie;
    int res = j->res;
    sched_xfer_dir dir = j->dir;
    sched_pool tier = j->tier;
    size_t bytes = j->bytes;
    bool silent = j->silent;
    j->in_use = false;
    j->next_free = t->job_free;
    t->job_free = ji;
    t->jobs_inflight--;
    if (done && !silent) done(ctx, cookie, res, dir, tier, bytes, el_us);
}

static void job_op_done(kvtier *t, int ji, int res)
{
    kvt_job *j = &t->jobs[ji];
    if (res < 0 && j->res == 0) j->res = res;
    if (--j->pending == 0) job_finish(t, ji);
}

/* Blocks i, i+1, ... that are consecutive both in the pool and in the tier move as one
 * read/write (the scheduler often hands out neighbouring slots; a disk tier in particular
 * is much faster with fewer, larger O_DIRECT requests). A run stays inside one registered
 * buffer and below 1 GiB. */
static int run_len(const kvtier *t, const int32_t *pb, const int32_t *sl, int i, int n)
{
    if (!t->cfg.pool_base) return 1; /* device pools bounce block by block */
    size_t bb = t->cfg.block_bytes;
    size_t max_blocks = (KVT_FIXED_CHUNK_MAX / bb) ? (KVT_FIXED_CHUNK_MAX / bb) : 1;
    int k = 1;
    while (i + k < n && (size_t)k < max_blocks && pb[i + k] == pb[i] + k &&
           sl[i + k] == sl[i] + k) {
        if (t->fixed) {
            size_t first = (size_t)pb[i] * bb / t->fixed_chunk;
            size_t last = ((size_t)(pb[i] + k + 1) * bb - 1) / t->fixed_chunk;
            if (first != last) break;
        }
        k++;
    }
    return k;
}

int kvtier_submit(kvtier *t, sched_xfer_dir dir, sched_pool tier, const int32_t *pool_blocks,
                  const int32_t *slots, int n, uint64_t cookie, kvtier_done_fn done, void *ctx)
{
    if (dir != SCHED_XFER_OUT && dir != SCHED_XFER_IN)
        return seterr(-EINVAL, "transfer direction %d", (int)dir);
    if ((unsigned)tier >= SCHED_POOL__COUNT || t->tier[tier].blocks == 0)
        return seterr(-EINVAL, "transfer to tier %s, which is not configured",
                      sched_pool_name(tier));
    if (n <= 0) return seterr(-EINVAL, "transfer of %d blocks", n);
    kvt_pool *p = &t->tier[tier];
    for (int i = 0; i < n; i++) {
        if (pool_blocks[i] < 0 || pool_blocks[i] >= t->cfg.pool_blocks)
            return seterr(-EINVAL, "pool block %d out of range [0,%d)", pool_blocks[i],
                          t->cfg.pool_blocks);
        if (slots[i] < 0 || slots[i] >= p->blocks)
            return seterr(-EINVAL, "%s tier slot %d out of range [0,%d)", sched_pool_name(tier),
                          slots[i], p->blocks);
    }
    bool async = !t->cfg.pool_base && tier == SCHED_POOL_HOST;
    int need_ops = 0;
    if (async)
        need_ops = 1;
    else
        for (int i = 0; i < n; i += run_len(t, pool_blocks, slots, i, n)) need_ops++;
    /* Count free ops first so a job is never half-submitted. */
    int avail = 0;
    for (int i = t->op_free; i >= 0 && avail < need_ops + 1; i = t->ops[i].next_free) avail++;
    if (avail < need_ops + 1 || t->job_free < 0)
        return seterr(-EBUSY, "kvtier: too many transfers in flight (%d jobs)", t->jobs_inflight);

    int ji = t->job_free;
    kvt_job *j = &t->jobs[ji];
    t->job_free = j->next_free;
    memset(j, 0, sizeof *j);
    j->in_use = true;
    j->dir = dir;
    j->tier = tier;
    j->cookie = cookie;
    j->done = done;
    j->ctx = ctx;
    j->bytes = (size_t)n * t->cfg.block_bytes;
    j->t_start_ns = now_ns();
    j->next_async = -1;
    t->jobs_inflight++;
    size_t bb = t->cfg.block_bytes;

    if (async) {
        void **host = malloc(sizeof(void *) * (size_t)n);
        if (!host) {
            j->res = -ENOMEM;
            j->pending = 1;
            job_op_done(t, ji, -ENOMEM);
            return 0;
        }
        for (int i = 0; i < n; i++) host[i] = (char *)p->map + (size_t)slots[i] * bb;
        int rc = 0;
        if (dir == SCHED_XFER_IN) /* the host copy is checked before it goes to the device */
            for (int i = 0; i < n && rc == 0; i++) rc = sums_check(t, tier, slots[i], host[i], 1);
        else if (!(j->async_slots = malloc(sizeof(int32_t) * (size_t)n)))
            rc = -ENOMEM;
        if (rc < 0) {
            free(host);
            j->pending = 1;
            job_op_done(t, ji, rc);
            return 0;
        }
        if (j->async_slots) {
            memcpy(j->async_slots, slots, sizeof(int32_t) * (size_t)n);
            j->n_async = n;
        }
        rc = eng_kv_transfer_async(t->cfg.engine, dir == SCHED_XFER_OUT ? ENG_KV_OUT : ENG_KV_IN,
                                   pool_blocks, host, n, t->efd);
        free(host);
        if (rc == 0) {
            j->pending = 1;
            if (t->async_tail >= 0)
                t->jobs[t->async_tail].next_async = ji;
            else
                t->async_head = ji;
            t->async_tail = ji;
            arm_efd(t);
            return 0;
        }
        free(j->async_slots);
        j->async_slots = NULL;
        if (rc != -ENOTSUP) {
            j->in_use = false;
            j->next_free = t->job_free;
            t->job_free = ji;
            t->jobs_inflight--;
            return seterr(rc, "engine async KV transfer: %s", eng_errmsg());
        }
        /* No async path: fall through to bounce buffers and file I/O. */
    }

    j->pending = need_ops;
    for (int i = 0, k; i < n; i += k) {
        k = run_len(t, pool_blocks, slots, i, n);
        int oi = op_get(t);
        t->ops_submitted++;
        kvt_op *op = &t->ops[oi];
        op->kind = OP_RW;
        op->job = ji;
        op->fd = p->fd;
        op->to_file = dir == SCHED_XFER_OUT;
        op->off = (off_t)((size_t)slots[i] * bb);
        op->len = (size_t)k * bb;
        op->buf_index = -1;
        op->pool_block = pool_blocks[i];
        op->slot = slots[i];
        op->n_blocks = k;
        if (t->cfg.pool_base) {
            op->buf = (char *)t->cfg.pool_base + (size_t)pool_blocks[i] * bb;
            if (dir == SCHED_XFER_OUT) sums_record(t, tier, slots[i], op->buf, k);
            if (t->fixed) {
                size_t o = (size_t)pool_blocks[i] * bb;
                op->buf_index = (int)(o / t->fixed_chunk);
            }
        } else {
            op->kind = OP_BOUNCE;
            if (posix_memalign((void **)&op->bounce, KVT_DIRECT_ALIGN, bb) != 0) {
                op_put(t, oi);
                job_op_done(t, ji, -ENOMEM);
                continue;
            }
            op->buf = op->bounce;
            if (dir == SCHED_XFER_OUT) {
                int rc = eng_kv_read_block(t->cfg.engine, pool_blocks[i], op->bounce);
                if (rc < 0) {
                    op_put(t, oi);
                    job_op_done(t, ji, rc);
                    continue;
                }
                sums_record(t, tier, slots[i], op->bounce, 1);
            }
        }
        if (queue_rw(t, oi) < 0) {
            op_put(t, oi);
            job_op_done(t, ji, -EBUSY);
        }
    }
    return 0;
}

int kvtier_flush(kvtier *t)
{
    int rc = io_uring_submit(t->cfg.ring);
    return rc < 0 ? rc : 0;
}

bool kvtier_handle_cqe(kvtier *t, const struct io_uring_cqe *cqe)
{
    uint64_t ud = io_uring_cqe_get_data64(cqe);
    uint64_t oi64 = ud & KVTIER_UD_INDEX_MASK;
    if ((ud & ~KVTIER_UD_INDEX_MASK) != t->cfg.ud_tag || oi64 >= KVT_MAX_OPS) return false;
    int oi = (int)oi64;
    kvt_op *op = &t->ops[oi];
    if (op->kind == OP_FREE) return true; /* stale: nothing to do */
    int res = cqe->res;
    if (op->kind == OP_EVENTFD) {
        t->efd_armed = false;
        op_put(t, oi);
        if (res == (int)sizeof(uint64_t)) {
            /* The copy stream completes in order: each count finishes the oldest job. */
            for (uint64_t k = 0; k < t->efd_val && t->async_head >= 0; k++) {
                int ji = t->async_head;
                t->async_head = t->jobs[ji].next_async;
                if (t->async_head < 0) t->async_tail = -1;
                job_op_done(t, ji, 0);
            }
        }
        if (t->async_head >= 0) arm_efd(t);
        return true;
    }
    if (res > 0 && (size_t)res < op->len) {
        /* Short transfer (possible on buffered files): continue where it stopped. A fixed
         * buffer continuation stays inside the same registered buffer. */
        op->buf += res;
        op->off += res;
        op->len -= (size_t)res;
        if (queue_rw(t, oi) == 0) return true;
        res = -EIO;
    } else if (res == 0) {
        /* end of file before the block was read: the tier file shrank */
        res = op->to_file ? -EIO : -ENODATA;
    }
    int ji = op->job;
    if (res >= 0 && !op->to_file) {
        /* the op's own buffer pointer moved on with any short read: from its first block */
        sched_pool tier = t->jobs[ji].tier;
        size_t bb = t->cfg.block_bytes;
        if (op->kind == OP_BOUNCE) {
            res = sums_check(t, tier, op->slot, op->bounce, 1);
            if (res == 0) res = eng_kv_write_block(t->cfg.engine, op->pool_block, op->bounce);
        } else {
            res = sums_check(t, tier, op->slot,
                             (char *)t->cfg.pool_base + (size_t)op->pool_block * bb, op->n_blocks);
        }
    }
    op_put(t, oi);
    job_op_done(t, ji, res < 0 ? res : 0);
    return true;
}

int kvtier_inflight(const kvtier *t)
{
    return t->jobs_inflight;
}

/* ---- synchronous copies (the prefix cache's demotions and reloads) ------------------ */

typedef struct copy_op {
    int fd;
    bool write;
    char *buf;
    size_t len;
    off_t off;
} copy_op;

/* Runs ops[0..n) on the private ring and waits for all; a short read/write is finished with
 * plain pread/pwrite. 0 or the first -errno. */
static int run_copy_ops(kvtier *t, copy_op *ops, int n)
{
    int rc = 0;
    for (int base = 0; base < n; base += KVT_COPY_QD) {
        int k = n - base < KVT_COPY_QD ? n - base : KVT_COPY_QD;
        for (int i = 0; i < k; i++) {
            copy_op *o = &ops[base + i];
            struct io_uring_sqe *sqe = io_uring_get_sqe(&t->sring);
            if (!sqe) return -EBUSY; /* cannot happen: the ring holds KVT_COPY_QD */
            if (o->write)
                io_uring_prep_write(sqe, o->fd, o->buf, (unsigned)o->len, (uint64_t)o->off);
            else
                io_uring_prep_read(sqe, o->fd, o->buf, (unsigned)o->len, (uint64_t)o->off);
            io_uring_sqe_set_data64(sqe, (uint64_t)(base + i));
        }
        t->ops_submitted += (uint64_t)k;
        int sub = io_uring_submit_and_wait(&t->sring, (unsigned)k);
        if (sub < 0) return sub;
        for (int got = 0; got < k; got++) {
            struct io_uring_cqe *cqe;
            int w = io_uring_wait_cqe(&t->sring, &cqe);
            if (w < 0) return w;
            copy_op *o = &ops[io_uring_cqe_get_data64(cqe)];
            int res = cqe->res;
            io_uring_cqe_seen(&t->sring, cqe);
            if (res < 0) {
                if (!rc) rc = res;
                continue;
            }
            /* short: the rest synchronously (buffered files may stop early) */
            size_t done = (size_t)res;
            while (done < o->len) {
                ssize_t r = o->write
                                ? pwrite(o->fd, o->buf + done, o->len - done, o->off + (off_t)done)
                                : pread(o->fd, o->buf + done, o->len - done, o->off + (off_t)done);
                if (r <= 0) {
                    if (!rc) rc = r < 0 ? -errno : o->write ? -EIO : -ENODATA;
                    break;
                }
                done += (size_t)r;
            }
        }
    }
    return rc;
}

int kvtier_copy(kvtier *t, sched_pool from, sched_pool to, const int32_t *src, const int32_t *dst,
                int n, uint64_t *elapsed_us)
{
    *elapsed_us = 0;
    bool out = from == SCHED_POOL_DEVICE, in = to == SCHED_POOL_DEVICE;
    bool down = from == SCHED_POOL_HOST && to == SCHED_POOL_DISK;
    if (n <= 0 || (out && in) || (!out && !in && !down) || (unsigned)from >= SCHED_POOL__COUNT ||
        (unsigned)to >= SCHED_POOL__COUNT)
        return seterr(-EINVAL, "copy of %d blocks from %s to %s", n, sched_pool_name(from),
                      sched_pool_name(to));
    int lim_from = from == SCHED_POOL_DEVICE ? t->cfg.pool_blocks : t->tier[from].blocks;
    int lim_to = to == SCHED_POOL_DEVICE ? t->cfg.pool_blocks : t->tier[to].blocks;
    for (int i = 0; i < n; i++)
        if (src[i] < 0 || src[i] >= lim_from || dst[i] < 0 || dst[i] >= lim_to)
            return seterr(
                -EINVAL, "copy of %s block %d to %s block %d: out of range [0,%d) / [0,%d)",
                sched_pool_name(from), src[i], sched_pool_name(to), dst[i], lim_from, lim_to);
    size_t bb = t->cfg.block_bytes;
    bool via_bounce = !t->cfg.pool_base && !down; /* a device pool: block by block */
    if (via_bounce && !t->bounce && posix_memalign(&t->bounce, KVT_DIRECT_ALIGN, bb) != 0) {
        t->bounce = NULL;
        return seterr(-ENOMEM, "kvtier: copy buffer");
    }
    copy_op *ops = malloc(sizeof *ops * (size_t)n);
    if (!ops) return seterr(-ENOMEM, "kvtier: out of memory");
    uint64_t t0 = now_ns();
    int rc = 0, nops = 0;
    sched_pool tier = in ? from : to;
    int fd = t->tier[tier].fd;
    for (int i = 0, k; i < n && rc == 0; i += k) {
        /* runs consecutive on both sides move as one read/write */
        k = 1;
        if (!via_bounce)
            while (i + k < n && src[i + k] == src[i] + k && dst[i + k] == dst[i] + k &&
                   (size_t)(k + 1) * bb <= KVT_FIXED_CHUNK_MAX)
                k++;
        int tslot = in ? src[i] : dst[i], pblock = in ? dst[i] : src[i];
        copy_op o = {
            .fd = fd, .write = !in, .len = (size_t)k * bb, .off = (off_t)((size_t)tslot * bb)};
        if (down)
            o.buf = (char *)t->tier[SCHED_POOL_HOST].map + (size_t)src[i] * bb;
        else if (!via_bounce)
            o.buf = (char *)t->cfg.pool_base + (size_t)pblock * bb;
        else {
            o.buf = t->bounce;
            if (out && (rc = eng_kv_read_block(t->cfg.engine, pblock, t->bounce)) < 0) break;
            if (out) sums_record(t, to, tslot, t->bounce, 1);
            rc = run_copy_ops(t, &o, 1);
            if (rc == 0 && in) rc = sums_check(t, from, tslot, t->bounce, 1);
            if (rc == 0 && in) rc = eng_kv_write_block(t->cfg.engine, pblock, t->bounce);
            continue;
        }
        ops[nops++] = o;
    }
    if (rc == 0 && nops) rc = run_copy_ops(t, ops, nops);
    /* checksums: a demotion to disk carries the host block's (checked when it is read back);
     * a block from the pool gets its own; a block read into the pool must match */
    for (int i = 0; i < n && rc == 0 && !via_bounce; i++) {
        if (down)
            t->tier[to].sum[dst[i]] = t->tier[from].sum[src[i]];
        else if (out)
            sums_record(t, to, dst[i], (char *)t->cfg.pool_base + (size_t)src[i] * bb, 1);
        else
            rc = sums_check(t, from, src[i], (char *)t->cfg.pool_base + (size_t)dst[i] * bb, 1);
    }
    if (rc == 0 && in && (t->cfg.fail_reads & (1u << from))) rc = -EIO; /* injected */
    if (rc < 0 && in) t->read_failures[from][kvtier_read_failure_of(rc)]++;
    free(ops);
    *elapsed_us = (now_ns() - t0) / 1000;
    if (rc < 0)
        return seterr(rc, "copy of %d blocks from %s to %s: %s", n, sched_pool_name(from),
                      sched_pool_name(to), strerror(-rc));
    t->bytes_moved[in ? SCHED_XFER_IN : SCHED_XFER_OUT][tier] += (uint64_t)n * bb;
    t->jobs_done[in ? SCHED_XFER_IN : SCHED_XFER_OUT][tier]++;
    return 0;
}

int kvtier_copy_span(kvtier *t, sched_xfer_dir dir, sched_pool tier, void *buf, size_t len,
                     const int32_t *slots, int n, uint64_t *elapsed_us)
{
    *elapsed_us = 0;
    const size_t bb = t->cfg.block_bytes;
    const bool in = dir == SCHED_XFER_IN;
    if ((tier != SCHED_POOL_HOST && tier != SCHED_POOL_DISK) || !t->tier[tier].blocks || n <= 0 ||
        len <= (size_t)(n - 1) * bb || len > (size_t)n * bb)
        return seterr(-EINVAL, "copy of %zu bytes %s %d %s slots", len, in ? "from" : "to", n,
                      sched_pool_name(tier));
    for (int i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= t->tier[tier].blocks)
            return seterr(-EINVAL, "copy of %zu bytes: %s slot %d out of range [0,%d)", len,
                          sched_pool_name(tier), slots[i], t->tier[tier].blocks);
    /* through an aligned buffer of whole slots: O_DIRECT wants one, and the last slot's
     * tail is written as zeros (its checksum covers the whole slot) */
    char *bounce = NULL;
    copy_op *ops = malloc(sizeof *ops * (size_t)n);
    if (!ops || posix_memalign((void **)&bounce, KVT_DIRECT_ALIGN, (size_t)n * bb) != 0) {
        free(ops);
        return seterr(-ENOMEM, "kvtier: a buffer of %d slots", n);
    }
    uint64_t t0 = now_ns();
    if (!in) {
        memcpy(bounce, buf, len);
        memset(bounce + len, 0, (size_t)n * bb - len);
    }
    for (int i = 0; i < n; i++) {
        ops[i] = (copy_op){.fd = t->tier[tier].fd,
                           .write = !in,
                           .buf = bounce + (size_t)i * bb,
                           .len = bb,
                           .off = (off_t)((size_t)slots[i] * bb)};
        if (!in) sums_record(t, tier, slots[i], ops[i].buf, 1);
    }
    int rc = run_copy_ops(t, ops, n);
    for (int i = 0; i < n && rc == 0 && in; i++) rc = sums_check(t, tier, slots[i], ops[i].buf, 1);
    if (rc == 0 && in && (t->cfg.fail_reads & (1u << tier))) rc = -EIO; /* injected */
    if (rc == 0 && in) memcpy(buf, bounce, len);
    if (rc < 0 && in) t->read_failures[tier][kvtier_read_failure_of(rc)]++;
    free(ops);
    free(bounce);
    *elapsed_us = (now_ns() - t0) / 1000;
    if (rc < 0)
        return seterr(rc, "copy of %zu bytes %s %d %s slots: %s", len, in ? "from" : "to", n,
                      sched_pool_name(tier), strerror(-rc));
    t->bytes_moved[dir][tier] += len;
    return 0;
}

uint64_t kvtier_bytes_moved(const kvtier *t, sched_xfer_dir dir, sched_pool tier)
{
    return (unsigned)dir < 2 && (unsigned)tier < SCHED_POOL__COUNT ? t->bytes_moved[dir][tier] : 0;
}
uint64_t kvtier_jobs_done(const kvtier *t, sched_xfer_dir dir, sched_pool tier)
{
    return (unsigned)dir < 2 && (unsigned)tier < SCHED_POOL__COUNT ? t->jobs_done[dir][tier] : 0;
}
const char *kvtier_describe(const kvtier *t)
{
    return t->describe;
}
uint64_t kvtier_ops_submitted(const kvtier *t)
{
    return t->ops_submitted;
}

int kvtier_read_slot(kvtier *t, sched_pool tier, int slot, void *dst)
{
    if ((unsigned)tier >= SCHED_POOL__COUNT || slot < 0 || slot >= t->tier[tier].blocks)
        return seterr(-EINVAL, "read of tier %d slot %d", (int)tier, slot);
    kvt_pool *p = &t->tier[tier];
    size_t bb = t->cfg.block_bytes;
    if (p->map) {
        memcpy(dst, (char *)p->map + (size_t)slot * bb, bb);
        return 0;
    }
    /* O_DIRECT needs an aligned buffer: read through one. */
    void *tmp = NULL;
    if (posix_memalign(&tmp, KVT_DIRECT_ALIGN, bb) != 0) return -ENOMEM;
    ssize_t r = pread(p->fd, tmp, bb, (off_t)((size_t)slot * bb));
    int rc = r == (ssize_t)bb ? 0 : (r < 0 ? -errno : -EIO);
    if (rc == 0) memcpy(dst, tmp, bb);
    free(tmp);
    return rc;
}

void kvtier_destroy(kvtier *t)
{
    if (!t) return;
    for (int i = 0; i < KVT_MAX_JOBS; i++)
        if (t->jobs[i].in_use) t->jobs[i].silent = true;
    /* Wait out our in-flight SQEs: the kernel may still write into the pool or tier memory. */
    if (t->ops_inflight > 0) {
        if (t->efd >= 0 && t->efd_armed) {
            uint64_t one = 1;
            if (write(t->efd, &one, sizeof one) < 0) { /* best effort: unblocks the read */
            }
        }
        io_uring_submit(t->cfg.ring);
        struct __kernel_timespec ts = {.tv_sec = 2};
        while (t->ops_inflight > 0) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe_timeout(t->cfg.ring, &cqe, &ts) < 0) break;
            kvtier_handle_cqe(t, cqe);
            io_uring_cqe_seen(t->cfg.ring, cqe);
        }
    }
    for (int i = 0; i < KVT_MAX_JOBS; i++) free(t->jobs[i].async_slots);
    if (t->fixed) io_uring_unregister_buffers(t->cfg.ring);
    if (t->sring_ok) io_uring_queue_exit(&t->sring);
    free(t->bounce);
    for (int k = 0; k < SCHED_POOL__COUNT; k++) pool_fini(&t->tier[k]);
    if (t->efd >= 0) close(t->efd);
    free(t);
}
