/* SPDX-License-Identifier: MIT */
/*
 * daemon/kvevents.c — KV-cache events in vLLM's wire format (kvevents.h): the loop's side
 * (a bounded single-producer ring, the overflow and the resync) and the publisher thread
 * (msgpack encoding, the ZMQ PUB socket, the replay ROUTER socket and its buffer).
 *
 * The ring.  head is written by the loop only (release, after the slot), tail by the
 * publisher only (release, after it is done with the slots): each side reads the other's
 * index with acquire and caches it, so the loop touches the shared line only when its cached
 * tail says the ring is full. Indices run free (64 bits never wrap) and are masked on
 * access; head - tail <= capacity always holds because the loop checks it before writing.
 * A batch is the run of slots up to an END slot (the loop's iteration) or a RESYNC slot
 * (whose snapshot is published as a batch of its own after the events before it).
 */
#include "daemon/kvevents.h"

#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/errdetail.h"

static _Thread_local errdetail kvev_err;
#define seterr(err, ...) errdetail_set(&kvev_err, (err), __VA_ARGS__)

const char *kvev_errmsg(void)
{
    return kvev_err.msg;
}

/* ---- slots ----------------------------------------------------------------------------- */

enum slot_kind { SK_STORED = 0, SK_REMOVED, SK_CLEARED, SK_END, SK_RESYNC };

typedef struct snapshot snapshot;

typedef struct slot {
    uint8_t kind, pool, has_parent;
    uint32_t n_tokens;
    uint64_t hash, parent;
    snapshot *snap; /* SK_RESYNC */
    int32_t tokens[];
} slot;

/* The index as sched_kv_announce told it: CLEARED, then every block, parents first. */
struct snapshot {
    uint32_t n, cap;
    unsigned char *slots; /* n slots of the ring's stride */
};

#define CACHE_LINE 64

struct kvev {
    /* the loop thread's */
    uint64_t head_local, tail_cached;
    bool lost, pending, oom;
    snapshot *collect; /* during a resync: sched_kv_announce's events go here */
    uint64_t dropped, resyncs;

    _Alignas(CACHE_LINE) _Atomic uint64_t head;
    _Alignas(CACHE_LINE) _Atomic uint64_t tail;
    _Alignas(CACHE_LINE) _Atomic bool stop;

    unsigned char *ring;
    uint32_t cap, stride, bs;

    /* the publisher thread's */
    void *zctx, *pub, *replay;
    pthread_t thread;
    bool started;
    char endpoint[256], replay_ep[256], topic[128];
    size_t topic_len;
    int rank;
    bool map; /* kvev_config.map_events */
    uint64_t seq;
    msgpack_sbuffer sb;
    struct replay_entry {
        uint64_t seq;
        char *data;
        size_t len;
    } * rb;
    uint32_t rb_cap, rb_n, rb_head; /* ring of the last rb_cap batches, rb_head oldest */
};

static slot *slot_at(unsigned char *base, uint32_t stride, uint64_t i, uint32_t mask)
{
    return (slot *)(base + (size_t)(i & mask) * stride);
}

static void fill(slot *s, const sched_kv_event *e, uint32_t bs)
{
    s->kind = e->kind == SCHED_KV_STORED    ? SK_STORED
              : e->kind == SCHED_KV_REMOVED ? SK_REMOVED
                                            : SK_CLEARED;
    s->pool = (uint8_t)e->pool;
    s->has_parent = e->has_parent;
    s->hash = e->key_lo;
    s->parent = e->parent_lo;
    s->snap = NULL;
    s->n_tokens = 0;
    if (s->kind == SK_STORED && e->tokens) {
        s->n_tokens = e->n_tokens < bs ? e->n_tokens : bs;
        memcpy(s->tokens, e->tokens, (size_t)s->n_tokens * sizeof(int32_t));
    }
}

/* ---- the loop thread -------------------------------------------------------------------- */

static slot *ring_reserve(kvev *k)
{
    uint64_t h = k->head_local;
    if (h - k->tail_cached >= k->cap) {
        k->tail_cached = atomic_load_explicit(&k->tail, memory_order_acquire);
        if (h - k->tail_cached >= k->cap) return NULL;
    }
    return slot_at(k->ring, k->stride, h, k->cap - 1);
}

static void ring_commit(kvev *k)
{
    k->head_local++;
    /* release: the publisher that sees the new head sees the slot */
    atomic_store_explicit(&k->head, k->head_local, memory_order_release);
}

static void snapshot_add(kvev *k, snapshot *sn, const sched_kv_event *e)
{
    if (sn->n == sn->cap) {
        uint32_t cap = sn->cap ? sn->cap * 2 : 1024;
        unsigned char *p = realloc(sn->slots, (size_t)cap * k->stride);
        if (!p) {
            k->oom = true;
            return;
        }
        sn->slots = p;
        sn->cap = cap;
    }
    fill((slot *)(sn->slots + (size_t)sn->n++ * k->stride), e, k->bs);
}

void kvev_sink(void *ctx, const sched_kv_event *e)
{
    kvev *k = ctx;
    if (k->collect) {
        snapshot_add(k, k->collect, e);
        return;
    }
    if (k->lost) { /* the resync will tell the whole index: what follows the loss waits */
        k->dropped++;
        return;
    }
    slot *s = ring_reserve(k);
    if (!s) {
        k->lost = true;
        k->dropped++;
        return;
    }
    fill(s, e, k->bs);
    ring_commit(k);
    k->pending = true;
}

void kvev_end_iteration(kvev *k, sched *sch)
{
    if (!k) return;
    if (k->pending && !k->lost) {
        slot *s = ring_reserve(k);
        if (s) {
            s->kind = SK_END;
            ring_commit(k);
        } else {
            k->lost = true; /* its events go out, but with the resync's batch after them */
        }
    }
    k->pending = false;
    if (!k->lost || !ring_reserve(k)) return;
    /* A free slot: snapshot the index (O(index), once per overflow) and hand it over. */
    snapshot *sn = calloc(1, sizeof *sn);
    if (!sn) return; /* try again next iteration */
    k->oom = false;
    k->collect = sn;
    uint32_t told = sched_kv_announce(sch);
    k->collect = NULL;
    if (!told && sn->n == 0) { /* no prefix cache: nothing cached, but still a clear */
        sched_kv_event clr = {.kind = SCHED_KV_CLEARED};
        snapshot_add(k, sn, &clr);
    }
    if (k->oom) {
        free(sn->slots);
        free(sn);
        return;
    }
    slot *s = ring_reserve(k);
    s->kind = SK_RESYNC;
    s->snap = sn;
    ring_commit(k);
    k->lost = false;
    k->resyncs++;
}

bool kvev_resync_pending(const kvev *k)
{
    return k && k->lost;
}

uint64_t kvev_dropped(const kvev *k)
{
    return k ? k->dropped : 0;
}

uint64_t kvev_resyncs(const kvev *k)
{
    return k ? k->resyncs : 0;
}

/* ---- encoding (the publisher thread) ------------------------------------------------------ */

static const char *const medium_name[SCHED_POOL__COUNT] = {"GPU", "CPU", "DISK"};

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* The head of an event: ["Tag", … (n_fields more) or {"type": "Tag", … (n_fields more). */
static void pack_head(msgpack_packer *pk, bool map, const char *tag, uint32_t n_fields)
{
    if (map) {
        msgpack_pack_map(pk, n_fields + 1);
        pack_str(pk, "type");
    } else {
        msgpack_pack_array(pk, n_fields + 1);
    }
    pack_str(pk, tag);
}

/* A field's name, in the map form. */
static void pack_key(msgpack_packer *pk, bool map, const char *name)
{
    if (map) pack_str(pk, name);
}

/* How many slots from s[0] on make one BlockStored, as vLLM batches them (the blocks one
 * request filled in one step: block_hashes in order, parent_block_hash the first one's
 * parent, token_ids all of theirs): STORED slots in the same pool, full, each the child of
 * the one before. 1 for any other event. */
static uint32_t stored_run(unsigned char *base, uint32_t stride, uint64_t from, uint32_t n,
                           uint32_t mask, uint32_t bs)
{
    const slot *s = slot_at(base, stride, from, mask);
    if (s->kind != SK_STORED || s->n_tokens != bs) return 1;
    uint32_t r = 1;
    while (r < n) {
        const slot *t = slot_at(base, stride, from + r, mask);
        if (t->kind != SK_STORED || t->pool != s->pool || t->n_tokens != bs || !t->has_parent ||
            t->parent != slot_at(base, stride, from + r - 1, mask)->hash)
            break;
        r++;
    }
    return r;
}

/* The event of slots [from, from + run): one BlockStored of run blocks, or any other event
 * (run 1). */
static void pack_event(msgpack_packer *pk, bool map, unsigned char *base, uint32_t stride,
                       uint64_t from, uint32_t run, uint32_t mask, uint32_t bs)
{
    const slot *s = slot_at(base, stride, from, mask);
    const char *medium = s->pool < SCHED_POOL__COUNT ? medium_name[s->pool] : "GPU";
    switch (s->kind) {
    case SK_STORED: {
        /* the map form has lora_name too (vLLM's fields with no default are always sent) */
        pack_head(pk, map, "BlockStored", map ? 7 : 6);
        pack_key(pk, map, "block_hashes");
        msgpack_pack_array(pk, run);
        for (uint32_t b = 0; b < run; b++)
            msgpack_pack_uint64(pk, slot_at(base, stride, from + b, mask)->hash);
        pack_key(pk, map, "parent_block_hash");
        if (s->has_parent)
            msgpack_pack_uint64(pk, s->parent);
        else
            msgpack_pack_nil(pk);
        uint32_t n_tok = 0;
        for (uint32_t b = 0; b < run; b++) n_tok += slot_at(base, stride, from + b, mask)->n_tokens;
        pack_key(pk, map, "token_ids");
        msgpack_pack_array(pk, n_tok);
        for (uint32_t b = 0; b < run; b++) {
            const slot *t = slot_at(base, stride, from + b, mask);
            for (uint32_t i = 0; i < t->n_tokens; i++) msgpack_pack_int32(pk, t->tokens[i]);
        }
        pack_key(pk, map, "block_size");
        msgpack_pack_uint32(pk, bs);
        pack_key(pk, map, "lora_id");
        msgpack_pack_nil(pk);
        pack_key(pk, map, "medium");
        pack_str(pk, medium);
        if (map) {
            pack_str(pk, "lora_name");
            msgpack_pack_nil(pk);
        }
        break;
    }
    case SK_REMOVED:
        pack_head(pk, map, "BlockRemoved", 2);
        pack_key(pk, map, "block_hashes");
        msgpack_pack_array(pk, 1);
        msgpack_pack_uint64(pk, s->hash);
        pack_key(pk, map, "medium");
        pack_str(pk, medium);
        break;
    default: pack_head(pk, map, "AllBlocksCleared", 0); break;
    }
}

static void be64(unsigned char out[8], uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8) out[i] = (unsigned char)v;
}

static void keep_for_replay(kvev *k, uint64_t seq, const char *data, size_t len)
{
    if (!k->rb_cap) return;
    char *copy = malloc(len ? len : 1);
    if (!copy) return; /* a replay will lack it: as if it had aged out */
    memcpy(copy, data, len);
    uint32_t at;
    if (k->rb_n < k->rb_cap) {
        at = (k->rb_head + k->rb_n++) % k->rb_cap;
    } else {
        at = k->rb_head;
        free(k->rb[at].data);
        k->rb_head = (k->rb_head + 1) % k->rb_cap;
    }
    k->rb[at] = (struct replay_entry){seq, copy, len};
}

/* Encodes slots [from, from+n) of base (n events) as one batch and sends it. */
static void publish(kvev *k, unsigned char *base, uint32_t stride, uint64_t from, uint32_t n,
                    uint32_t mask)
{
    msgpack_sbuffer_clear(&k->sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &k->sb, msgpack_sbuffer_write);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, (double)now.tv_sec + (double)now.tv_nsec / 1e9);
    uint32_t n_events = 0;
    for (uint32_t i = 0; i < n; n_events++)
        i += stored_run(base, stride, from + i, n - i, mask, k->bs);
    msgpack_pack_array(&pk, n_events);
    for (uint32_t i = 0; i < n;) {
        uint32_t run = stored_run(base, stride, from + i, n - i, mask, k->bs);
        pack_event(&pk, k->map, base, stride, from + i, run, mask, k->bs);
        i += run;
    }
    msgpack_pack_int(&pk, k->rank);
    unsigned char seq[8];
    be64(seq, k->seq);
    /* PUB never blocks: past its high-water mark ZMQ drops for the slow subscriber */
    zmq_send(k->pub, k->topic, k->topic_len, ZMQ_SNDMORE);
    zmq_send(k->pub, seq, 8, ZMQ_SNDMORE);
    zmq_send(k->pub, k->sb.data, k->sb.size, 0);
    keep_for_replay(k, k->seq, k->sb.data, k->sb.size);
    k->seq++;
}

/* ---- replay ------------------------------------------------------------------------------ */

static void serve_replay(kvev *k)
{
    unsigned char id[256], delim[8], start[16];
    int n_id = zmq_recv(k->replay, id, sizeof id, ZMQ_DONTWAIT);
    if (n_id < 0) return;
    int frames = 1, more = 0;
    size_t ml = sizeof more;
    int n_delim = -1, n_start = -1;
    zmq_getsockopt(k->replay, ZMQ_RCVMORE, &more, &ml);
    while (more) { /* read every frame of the request, whatever its shape */
        unsigned char junk[64];
        int r = zmq_recv(k->replay,
                         frames == 1   ? delim
                         : frames == 2 ? start
                                       : junk,
                         frames == 1   ? sizeof delim
                         : frames == 2 ? sizeof start
                                       : sizeof junk,
                         0);
        if (frames == 1) n_delim = r;
        if (frames == 2) n_start = r;
        frames++;
        ml = sizeof more;
        if (zmq_getsockopt(k->replay, ZMQ_RCVMORE, &more, &ml) < 0) break;
    }
    if (frames != 3 || n_delim != 0 || n_start != 8 || n_id > (int)sizeof id) return;
    uint64_t from = 0;
    for (int i = 0; i < 8; i++) from = from << 8 | start[i];
    for (uint32_t i = 0; i < k->rb_n; i++) {
        const struct replay_entry *e = &k->rb[(k->rb_head + i) % k->rb_cap];
        if (e->seq < from) continue;
        unsigned char seq[8];
        be64(seq, e->seq);
        zmq_send(k->replay, id, (size_t)n_id, ZMQ_SNDMORE);
        zmq_send(k->replay, "", 0, ZMQ_SNDMORE);
        zmq_send(k->replay, seq, 8, ZMQ_SNDMORE);
        zmq_send(k->replay, e->data, e->len, 0);
    }
    unsigned char end[8];
    memset(end, 0xff, sizeof end); /* -1: the end of the replay */
    zmq_send(k->replay, id, (size_t)n_id, ZMQ_SNDMORE);
    zmq_send(k->replay, "", 0, ZMQ_SNDMORE);
    zmq_send(k->replay, end, 8, ZMQ_SNDMORE);
    zmq_send(k->replay, "", 0, 0);
}

/* ---- the publisher thread ----------------------------------------------------------------- */

/* Publishes every complete batch queued; with `all`, the incomplete tail too. */
static void drain(kvev *k, bool all)
{
    uint32_t mask = k->cap - 1;
    uint64_t t = atomic_load_explicit(&k->tail, memory_order_relaxed);
    uint64_t h = atomic_load_explicit(&k->head, memory_order_acquire);
    uint64_t from = t;
    for (uint64_t i = t; i < h; i++) {
        slot *s = slot_at(k->ring, k->stride, i, mask);
        if (s->kind != SK_END && s->kind != SK_RESYNC) continue;
        if (i > from) publish(k, k->ring, k->stride, from, (uint32_t)(i - from), mask);
        if (s->kind == SK_RESYNC) {
            snapshot *sn = s->snap;
            /* a power of two above n: slot_at masks, and the snapshot's slots are in order */
            uint32_t m = 1;
            while (m < sn->n) m <<= 1;
            publish(k, sn->slots, k->stride, 0, sn->n, m - 1);
            free(sn->slots);
            free(sn);
        }
        from = i + 1;
        /* release: the loop may reuse these slots once it sees the new tail */
        atomic_store_explicit(&k->tail, from, memory_order_release);
    }
    /* a full ring without a terminator: the loop cannot add one (it drops and waits for a
     * free slot to resync), so what is there goes out as a batch of its own */
    if ((all || h - from >= k->cap) && h > from) {
        publish(k, k->ring, k->stride, from, (uint32_t)(h - from), mask);
        atomic_store_explicit(&k->tail, h, memory_order_release);
    }
}

static void *publisher_main(void *arg)
{
    kvev *k = arg;
    while (!atomic_load_explicit(&k->stop, memory_order_acquire)) {
        drain(k, false);
        if (k->replay) {
            zmq_pollitem_t it = {.socket = k->replay, .events = ZMQ_POLLIN};
            /* 2 ms: how late an event may go out; the loop never signals (it never waits) */
            if (zmq_poll(&it, 1, 2) > 0) serve_replay(k);
        } else {
            struct timespec ts = {0, 2 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    drain(k, true);
    return NULL;
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static bool binds(const char *ep)
{
    return strchr(ep, '*') || strstr(ep, "::") || !strncmp(ep, "ipc://", 6) ||
           !strncmp(ep, "inproc://", 9);
}

int kvev_create(const kvev_config *cfg, kvev **out)
{
    *out = NULL;
    if (!cfg || !cfg->endpoint || !*cfg->endpoint)
        return seterr(-EINVAL, "--kv-events: no endpoint");
    if (!cfg->block_size || cfg->block_size > 4096)
        return seterr(-EINVAL, "--kv-events: block size %u", cfg->block_size);
    kvev *k = calloc(1, sizeof *k);
    if (!k) return seterr(-ENOMEM, "kv events: out of memory");
    int rc = -ENOMEM;
    k->bs = cfg->block_size;
    k->stride = (uint32_t)((sizeof(slot) + k->bs * sizeof(int32_t) + 7) & ~(size_t)7);
    uint32_t want = cfg->queue_events ? cfg->queue_events : 65536;
    for (k->cap = 2; k->cap < want && k->cap < (1u << 24); k->cap <<= 1) {}
    k->rank = cfg->data_parallel_rank;
    k->map = cfg->map_events;
    snprintf(k->topic, sizeof k->topic, "%s", cfg->topic ? cfg->topic : "");
    k->topic_len = strlen(k->topic);
    k->rb_cap = cfg->replay_batches ? cfg->replay_batches : 10000;
    msgpack_sbuffer_init(&k->sb);
    if (!(k->ring = calloc(k->cap, k->stride)) || !(k->rb = calloc(k->rb_cap, sizeof *k->rb)))
        goto fail;
    if (!(k->zctx = zmq_ctx_new()) || !(k->pub = zmq_socket(k->zctx, ZMQ_PUB))) goto fail;
    int hwm = 100000, linger = 1000;
    zmq_setsockopt(k->pub, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(k->pub, ZMQ_LINGER, &linger, sizeof linger);
    int zr =
        binds(cfg->endpoint) ? zmq_bind(k->pub, cfg->endpoint) : zmq_connect(k->pub, cfg->endpoint);
    if (zr < 0) {
        int e = zmq_errno();
        rc = seterr(e == EADDRINUSE ? -EADDRINUSE : -EINVAL, "--kv-events %s: %s", cfg->endpoint,
                    zmq_strerror(e));
        goto fail;
    }
    size_t l = sizeof k->endpoint;
    if (zmq_getsockopt(k->pub, ZMQ_LAST_ENDPOINT, k->endpoint, &l) < 0 || !k->endpoint[0])
        snprintf(k->endpoint, sizeof k->endpoint, "%s", cfg->endpoint);
    if (cfg->replay_endpoint && *cfg->replay_endpoint) {
        if (!(k->replay = zmq_socket(k->zctx, ZMQ_ROUTER))) goto fail;
        zmq_setsockopt(k->replay, ZMQ_LINGER, &linger, sizeof linger);
        if (zmq_bind(k->replay, cfg->replay_endpoint) < 0) {
            int e = zmq_errno();
            rc = seterr(e == EADDRINUSE ? -EADDRINUSE : -EINVAL, "--kv-events-replay %s: %s",
                        cfg->replay_endpoint, zmq_strerror(e));
            goto fail;
        }
        l = sizeof k->replay_ep;
        if (zmq_getsockopt(k->replay, ZMQ_LAST_ENDPOINT, k->replay_ep, &l) < 0)
            snprintf(k->replay_ep, sizeof k->replay_ep, "%s", cfg->replay_endpoint);
    }
    if ((rc = pthread_create(&k->thread, NULL, publisher_main, k)) != 0) {
        rc = seterr(-rc, "kv events: thread: %s", strerror(rc));
        goto fail;
    }
    k->started = true;
    *out = k;
    return 0;
fail:
    if (rc == -ENOMEM) seterr(-ENOMEM, "kv events: out of memory");
    kvev_destroy(k);
    return rc;
}

const char *kvev_endpoint(const kvev *k)
{
    return k ? k->endpoint : "";
}

const char *kvev_replay_endpoint(const kvev *k)
{
    return k && k->replay ? k->replay_ep : NULL;
}

void kvev_destroy(kvev *k)
{
    if (!k) return;
    if (k->started) {
        atomic_store_explicit(&k->stop, true, memory_order_release);
        pthread_join(k->thread, NULL);
    }
    if (k->pub) zmq_close(k->pub);
    if (k->replay) zmq_close(k->replay);
    if (k->zctx) zmq_ctx_term(k->zctx);
    /* snapshots a stopped publisher never took */
    uint64_t t = atomic_load(&k->tail), h = atomic_load(&k->head);
    for (uint64_t i = t; k->ring && i < h; i++) {
        slot *s = slot_at(k->ring, k->stride, i, k->cap - 1);
        if (s->kind == SK_RESYNC && s->snap) {
            free(s->snap->slots);
            free(s->snap);
        }
    }
    for (uint32_t i = 0; k->rb && i < k->rb_n; i++) free(k->rb[(k->rb_head + i) % k->rb_cap].data);
    free(k->rb);
    free(k->ring);
    msgpack_sbuffer_destroy(&k->sb);
    free(k);
}
