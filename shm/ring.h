/* SPDX-License-Identifier: MIT */
/*
 * shm/ring.h — single-producer single-consumer rings over shared memory, and the futex
 * doorbell.  libc only.
 *
 * Two kinds of ring, both with power-of-two capacity and free-running u64 indices that
 * are masked only when a position is needed:
 *   - a byte ring of length-prefixed records (the submit ring, client → daemon);
 *   - a ring of fixed 16-byte event slots (the event ring, daemon → client).
 * Each side keeps its own index privately and publishes it with a release store; it
 * caches the peer's index and reloads it (acquire) only when the cached value says the
 * ring is empty/full, so a busy ring costs no cache-line transfer per item.
 *
 * Why wrap-around is safe: indices are never compared by position.  The consumer checks
 * 0 <= prod - cons <= capacity in unsigned arithmetic; u64 indices would need centuries
 * at any rate to wrap, and if the peer is hostile a distance outside that window is
 * reported as an error (-EBADMSG), never used.  Every byte read from the ring goes
 * through ring_copy_out into private memory first.
 */
#ifndef RINGLM_SHM_RING_H
#define RINGLM_SHM_RING_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "common/futex.h"
#include "shm/wire.h"

/* ---- memory ordering ------------------------------------------------------------------ */
static inline uint64_t ring_load_acquire(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline uint64_t ring_load_relaxed(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline void ring_store_release(uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline uint32_t ring_load32(const uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void ring_store32(uint32_t *p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
/* Full fence between "store my index/flag" and "load the peer's flag/index" (Dekker):
 * without it the store can sit in the store buffer while the load passes it, and both
 * sides go to sleep.  Same pattern as liburing's sq_ring_needs_enter. */
static inline void ring_full_fence(void)
{
#if defined(__x86_64__)
    /* A locked add to the stack is a full barrier on x86 and cheaper than mfence (the
	 * kernel's smp_mb() does the same); it also keeps ThreadSanitizer builds quiet,
	 * which reject atomic_thread_fence. */
    __asm__ volatile("lock; addl $0,-8(%%rsp)" ::: "memory", "cc");
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}
static inline void ring_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* Copies n bytes at ring position pos (an index; masked here) out of / into a byte ring
 * of capacity cap (power of two), in two pieces when the range wraps. n <= cap. */
void ring_copy_out(void *dst, const uint8_t *data, uint64_t cap, uint64_t pos, size_t n);
void ring_copy_in(uint8_t *data, uint64_t cap, uint64_t pos, const void *src, size_t n);

/* ---- record ring: producer ------------------------------------------------------------ */
struct ring_rec_prod {
    uint8_t *data;
    uint64_t cap;  /* power of two */
    uint64_t prod; /* private; published into *prod_p by ring_rec_commit */
    uint64_t cached_cons;
    uint64_t *prod_p;       /* shared: producer index */
    const uint64_t *cons_p; /* shared: consumer index (peer) */
};
/* Room for len bytes?  Returns 0 and the index to write at in *pos, -EAGAIN when the ring
 * is full now, -E2BIG when len > cap, -EBADMSG when the peer's index is impossible. */
int ring_rec_reserve(struct ring_rec_prod *p, uint32_t len, uint64_t *pos);
/* Writes part of the reserved record at pos + off. */
static inline void ring_rec_write(struct ring_rec_prod *p, uint64_t pos, uint64_t off,
                                  const void *src, size_t n)
{
    ring_copy_in(p->data, p->cap, pos + off, src, n);
}
/* Publishes the record reserved at pos (release store). */
static inline void ring_rec_commit(struct ring_rec_prod *p, uint32_t len)
{
    p->prod += len;
    ring_store_release(p->prod_p, p->prod);
}

/* ---- record ring: consumer (the untrusted side is the producer) ----------------------- */
struct ring_rec_cons {
    const uint8_t *data;
    uint64_t cap;
    uint64_t cons;          /* private; published by ring_rec_release */
    uint64_t prod_seen;     /* producer index loaded once by ring_rec_poll */
    uint32_t max_record;    /* longest record accepted (<= cap) */
    const uint64_t *prod_p; /* shared, untrusted */
    uint64_t *cons_p;       /* shared: ours */
};
/* Loads the producer index once (acquire).  Returns the bytes available, or -EBADMSG
 * (why filled) when the distance is impossible. */
int64_t ring_rec_poll(struct ring_rec_cons *c, char *why, size_t why_len);
/* Copies the next record (within what ring_rec_poll saw) into buf (buf_len >=
 * max_record, 8-byte aligned) and advances the private index.  Returns its length (> 0),
 * 0 when none is left, -EBADMSG with why for a bad length.  The record is NOT parsed;
 * ringlm_wire_parse does that on the copy. */
int64_t ring_rec_next(struct ring_rec_cons *c, void *buf, size_t buf_len, char *why,
                      size_t why_len);
/* Publishes the consumer index (release). */
static inline void ring_rec_release(struct ring_rec_cons *c)
{
    ring_store_release(c->cons_p, c->cons);
}

/* ---- event ring: producer ------------------------------------------------------------- */
struct ring_ev_prod {
    struct ringlm_wire_event *slots;
    uint64_t mask; /* slots - 1 */
    uint64_t prod; /* private: written, not yet published */
    uint64_t published;
    uint64_t cached_cons;
    uint64_t *prod_p;       /* shared: ours */
    const uint64_t *cons_p; /* shared: peer's (untrusted when the peer is a client) */
};
/* Free slots (reloads the consumer index when the cached one shows < want free).
 * Returns >= 0, or -EBADMSG when the consumer index lies outside [cached_cons, prod]. */
int64_t ring_ev_space(struct ring_ev_prod *p, uint64_t want, char *why, size_t why_len);
/* Writes one slot; caller checked the space. */
static inline void ring_ev_put(struct ring_ev_prod *p, const struct ringlm_wire_event *ev)
{
    p->slots[p->prod & p->mask] = *ev;
    p->prod++;
}
/* Publishes everything written (release).  Returns 1 when something new was published. */
static inline int ring_ev_publish(struct ring_ev_prod *p)
{
    if (p->prod == p->published) return 0;
    ring_store_release(p->prod_p, p->prod);
    p->published = p->prod;
    return 1;
}

/* ---- event ring: consumer ------------------------------------------------------------- */
struct ring_ev_cons {
    const struct ringlm_wire_event *slots;
    uint64_t mask;
    uint64_t cons;
    uint64_t cached_prod;
    const uint64_t *prod_p;
    uint64_t *cons_p;
};
/* Events available (reloads the producer index when the cache shows < want).
 * Returns >= 0 or -EBADMSG when prod - cons > capacity. */
int64_t ring_ev_avail(struct ring_ev_cons *c, uint64_t want, char *why, size_t why_len);
/* Copies the event at cons + k (k < avail) without consuming it. */
static inline struct ringlm_wire_event ring_ev_peek(const struct ring_ev_cons *c, uint64_t k)
{
    return c->slots[(c->cons + k) & c->mask];
}
/* Consumes n events and publishes the consumer index (release). */
static inline void ring_ev_consume(struct ring_ev_cons *c, uint64_t n)
{
    c->cons += n;
    ring_store_release(c->cons_p, c->cons);
}

/* ---- the sleep/wake handshake ----------------------------------------------------------
 * Two sides share a flag word in a segment: one side is about to sleep (or to wait for
 * space) and says so in the flag; the other publishes work (or frees space) and must then
 * wake it.  Each side stores, then loads what the other stored (Dekker).  Without a full
 * fence between the two, the store can sit in the store buffer while the load passes it:
 * the sleeper misses the work, the waker misses the flag, and both wait for ever.
 *
 *   sleeper: ring_handshake_announce(flag)  — store 1, full fence —
 *            then look again at the condition; wait only if there is still nothing, and
 *            clear the flag (ring_store32(flag, 0)) once awake.
 *   waker:   publish (a release store of the index), then
 *            ring_handshake_peer_waits(flag) — full fence, load the flag — and wake the
 *            peer when it says so.
 *
 * Either the sleeper's second look sees the work, or the waker sees the flag (or both).
 * The flag may be written by an untrusted peer: any value costs at most a wake. */
static inline void ring_handshake_announce(uint32_t *flag)
{
    ring_store32(flag, 1);
    ring_full_fence();
}
static inline int ring_handshake_peer_waits(const uint32_t *flag)
{
    ring_full_fence();
    return ring_load32(flag) != 0;
}

/* The doorbells themselves are futexes on the published index words, shared between the
 * two processes: futex_wait / futex_wake (common/futex.h) with FUTEX_SCOPE_SHARED. */

/* CLOCK_MONOTONIC in ns / µs. */
uint64_t ring_now_ns(void);

#endif
