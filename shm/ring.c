/* SPDX-License-Identifier: MIT */
/*
 * shm/ring.c — the out-of-line parts of the SPSC rings: index validation against a
 * possibly hostile peer, wrap-aware copies, and the shared futex calls.
 */
#include "shm/ring.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((format(printf, 3, 4))) static int bad(char *why, size_t why_len, const char *fmt,
                                                     ...)
{
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return -EBADMSG;
}

/* Reads of shared memory go through memcpy into private memory: the compiler cannot
 * re-read the source later because everything after uses the destination. */
void ring_copy_out(void *dst, const uint8_t *data, uint64_t cap, uint64_t pos, size_t n)
{
    uint64_t at = pos & (cap - 1);
    uint64_t first = cap - at;
    if (first >= n) {
        memcpy(dst, data + at, n);
    } else {
        memcpy(dst, data + at, first);
        memcpy((uint8_t *)dst + first, data, n - first);
    }
}

void ring_copy_in(uint8_t *data, uint64_t cap, uint64_t pos, const void *src, size_t n)
{
    uint64_t at = pos & (cap - 1);
    uint64_t first = cap - at;
    if (first >= n) {
        memcpy(data + at, src, n);
    } else {
        memcpy(data + at, src, first);
        memcpy(data, (const uint8_t *)src + first, n - first);
    }
}

int ring_rec_reserve(struct ring_rec_prod *p, uint32_t len, uint64_t *pos)
{
    if (len > p->cap) return -E2BIG;
    if (p->cap - (p->prod - p->cached_cons) < len) {
        uint64_t c = ring_load_acquire(p->cons_p);
        /* The consumer can only have moved forward, and never past what we wrote. */
        if (c - p->cached_cons > p->prod - p->cached_cons) return -EBADMSG;
        p->cached_cons = c;
        if (p->cap - (p->prod - c) < len) return -EAGAIN;
    }
    *pos = p->prod;
    return 0;
}

int64_t ring_rec_poll(struct ring_rec_cons *c, char *why, size_t why_len)
{
    uint64_t prod = ring_load_acquire(c->prod_p);
    uint64_t dist = prod - c->cons;
    if (dist > c->cap)
        return bad(why, why_len,
                   "submit index distance %llu (prod %llu, cons %llu) exceeds capacity %llu",
                   (unsigned long long)dist, (unsigned long long)prod, (unsigned long long)c->cons,
                   (unsigned long long)c->cap);
    c->prod_seen = prod;
    if (dist == 0) {
        /* Empty: touch the lines the next record will land on (a request record
		 * spans two).  The producer writes them before its index, so when the poll
		 * that sees the new index misses, these misses are already in flight next
		 * to it instead of starting after it: one cross-core transfer on the
		 * round trip instead of two in a row.  A prefetch is only a hint: it reads
		 * nothing into private memory and the copy below still decides. */
        uint64_t at = c->cons & (c->cap - 1);
        __builtin_prefetch(c->data + at);
        __builtin_prefetch(c->data + ((at + 64) & (c->cap - 1)));
    }
    return (int64_t)dist;
}

int64_t ring_rec_next(struct ring_rec_cons *c, void *buf, size_t buf_len, char *why, size_t why_len)
{
    uint64_t avail = c->prod_seen - c->cons;
    struct ringlm_wire_rec_hdr h;

    if (avail == 0) return 0;
    if (avail < sizeof(h))
        return bad(why, why_len, "%llu bytes published, less than a record header",
                   (unsigned long long)avail);
    ring_copy_out(&h, c->data, c->cap, c->cons, sizeof(h));
    uint32_t len = h.len; /* the copy: the shared header may change under us */
    if (len < sizeof(h) || len % 8)
        return bad(why, why_len,
                   "submit record length %u at index %llu is not a positive multiple of 8", len,
                   (unsigned long long)c->cons);
    if (len > c->max_record || len > buf_len)
        return bad(why, why_len, "submit record length %u exceeds the limit %u", len,
                   c->max_record);
    if (len > avail)
        return bad(why, why_len, "submit record length %u exceeds the %llu bytes published", len,
                   (unsigned long long)avail);
    ring_copy_out(buf, c->data, c->cap, c->cons, len);
    c->cons += len;
    return len;
}

int64_t ring_ev_space(struct ring_ev_prod *p, uint64_t want, char *why, size_t why_len)
{
    uint64_t cap = p->mask + 1;
    uint64_t free_slots = cap - (p->prod - p->cached_cons);
    if (free_slots >= want) return (int64_t)free_slots;
    uint64_t c = ring_load_acquire(p->cons_p);
    if (c - p->cached_cons > p->prod - p->cached_cons)
        return bad(why, why_len, "event consumer index %llu outside [%llu, %llu]",
                   (unsigned long long)c, (unsigned long long)p->cached_cons,
                   (unsigned long long)p->prod);
    p->cached_cons = c;
    return (int64_t)(cap - (p->prod - c));
}

int64_t ring_ev_avail(struct ring_ev_cons *c, uint64_t want, char *why, size_t why_len)
{
    uint64_t avail = c->cached_prod - c->cons;
    if (avail >= want) return (int64_t)avail;
    uint64_t prod = ring_load_acquire(c->prod_p);
    if (prod - c->cons > c->mask + 1)
        return bad(why, why_len, "event index distance %llu exceeds capacity %llu",
                   (unsigned long long)(prod - c->cons), (unsigned long long)(c->mask + 1));
    c->cached_prod = prod;
    return (int64_t)(prod - c->cons);
}

uint64_t ring_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
