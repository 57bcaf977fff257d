/* SPDX-License-Identifier: MIT */
/*
 * shm/ in process: the SPSC rings (wrap-around, full/empty, hostile indices), the futex
 * doorbell protocol between two threads (no lost wakeup: waits have no timeout, so a lost
 * wakeup is a hang that the suite timeout reports), and the record parser.
 * Run it under TSAN too: make B=build-tx-tsan TSAN=1 build-tx-tsan/tests/test_shm_ring
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shm/ring.h"
#include "shm/wire.h"

/* ---- record ring, single thread ---------------------------------------------------- */
struct recring {
    uint8_t data[256] __attribute__((aligned(64)));
    uint64_t prod, cons;
    struct ring_rec_prod p;
    struct ring_rec_cons c;
};

static void recring_init(struct recring *r)
{
    memset(r, 0, sizeof(*r));
    r->p =
        (struct ring_rec_prod){.data = r->data, .cap = 256, .prod_p = &r->prod, .cons_p = &r->cons};
    r->c = (struct ring_rec_cons){
        .data = r->data, .cap = 256, .max_record = 256, .prod_p = &r->prod, .cons_p = &r->cons};
}

static int put_cancel(struct recring *r, uint64_t id)
{
    uint64_t pos;
    int e = ring_rec_reserve(&r->p, RINGLM_WIRE_CANCEL_BYTES, &pos);
    if (e) return e;
    struct ringlm_wire_rec_hdr h = {.len = RINGLM_WIRE_CANCEL_BYTES,
                                    .type = RINGLM_WIRE_REC_CANCEL};
    struct ringlm_wire_cancel c = {.req_id = id};
    ring_rec_write(&r->p, pos, 0, &h, sizeof(h));
    ring_rec_write(&r->p, pos, sizeof(h), &c, sizeof(c));
    ring_rec_commit(&r->p, RINGLM_WIRE_CANCEL_BYTES);
    return 0;
}

static int put_request(struct recring *r, uint64_t id, uint32_t n)
{
    uint8_t rec[256] __attribute__((aligned(8)));
    uint32_t len = (uint32_t)ringlm_wire_request_bytes(n);
    memset(rec, 0, sizeof(rec));
    struct ringlm_wire_rec_hdr h = {.len = len, .type = RINGLM_WIRE_REC_REQUEST};
    struct ringlm_wire_request q = {.req_id = id, .max_new_tokens = 1, .n_prompt = n, .top_p = 1};
    strcpy(q.class_name, "c");
    memcpy(rec, &h, sizeof(h));
    memcpy(rec + sizeof(h), &q, sizeof(q));
    for (uint32_t i = 0; i < n; i++) {
        int32_t t = (int32_t)(id * 31 + i);
        memcpy(rec + sizeof(h) + sizeof(q) + 4 * i, &t, 4);
    }
    uint64_t pos;
    int e = ring_rec_reserve(&r->p, len, &pos);
    if (e) return e;
    ring_rec_write(&r->p, pos, 0, rec, len);
    ring_rec_commit(&r->p, len);
    return 0;
}

Test(shm_ring, records_wrap_around_in_order)
{
    struct recring r;
    recring_init(&r);
    uint8_t buf[256] __attribute__((aligned(8)));
    char why[160];
    uint64_t next_put = 1, next_get = 1;
    /* Mixed sizes so records straddle the end of the ring at every offset. */
    for (int round = 0; round < 20000; round++) {
        for (;;) {
            uint32_t n = (uint32_t)(next_put % 7);
            int e = (next_put % 3) ? put_request(&r, next_put, n) : put_cancel(&r, next_put);
            if (e == -EAGAIN) break;
            cr_assert_eq(e, 0);
            next_put++;
        }
        cr_assert_gt(ring_rec_poll(&r.c, why, sizeof(why)), 0);
        int64_t len;
        while ((len = ring_rec_next(&r.c, buf, sizeof(buf), why, sizeof(why))) > 0) {
            struct ringlm_wire_parsed p;
            cr_assert_eq(ringlm_wire_parse(buf, (size_t)len, &p, why, sizeof(why)), 0, "%s", why);
            if (next_get % 3) {
                cr_assert_eq(p.type, RINGLM_WIRE_REC_REQUEST);
                cr_assert_eq(p.req->req_id, next_get, "got %llu, expected %llu (cons %llu)",
                             (unsigned long long)p.req->req_id, (unsigned long long)next_get,
                             (unsigned long long)r.c.cons);
                cr_assert_eq(p.req->n_prompt, next_get % 7);
                for (uint32_t i = 0; i < p.req->n_prompt; i++)
                    cr_assert_eq(p.prompt[i], (int32_t)(next_get * 31 + i));
            } else {
                cr_assert_eq(p.type, RINGLM_WIRE_REC_CANCEL);
                cr_assert_eq(p.cancel_id, next_get);
            }
            next_get++;
            /* Release only sometimes: the producer must see the ring full. */
            if (next_get % 4 == 0) ring_rec_release(&r.c);
        }
        cr_assert_eq(len, 0, "%s", why);
        ring_rec_release(&r.c);
    }
    cr_assert_eq(next_put, next_get);
    cr_assert_gt(r.prod, 256 * 1000, "the ring wrapped %llu bytes", (unsigned long long)r.prod);
}

Test(shm_ring, record_ring_full_and_too_big)
{
    struct recring r;
    recring_init(&r);
    uint64_t pos;
    cr_assert_eq(ring_rec_reserve(&r.p, 264, &pos), -E2BIG);
    cr_assert_eq(ring_rec_reserve(&r.p, 256, &pos), 0);
    ring_rec_commit(&r.p, 256);
    cr_assert_eq(ring_rec_reserve(&r.p, 8, &pos), -EAGAIN);
    /* A consumer index that runs ahead of the producer is impossible. */
    r.cons = 1000;
    cr_assert_eq(ring_rec_reserve(&r.p, 8, &pos), -EBADMSG);
}

Test(shm_ring, record_consumer_rejects_hostile_indices_and_lengths)
{
    struct recring r;
    recring_init(&r);
    uint8_t buf[256] __attribute__((aligned(8)));
    char why[160];

    r.prod = 257; /* more than the capacity published */
    cr_assert_eq(ring_rec_poll(&r.c, why, sizeof(why)), -EBADMSG);
    cr_assert(strstr(why, "exceeds capacity"), "%s", why);
    r.prod = (uint64_t)-8; /* behind the consumer */
    cr_assert_eq(ring_rec_poll(&r.c, why, sizeof(why)), -EBADMSG);

    r.prod = 4; /* less than a header */
    cr_assert_eq(ring_rec_poll(&r.c, why, sizeof(why)), 4);
    cr_assert_eq(ring_rec_next(&r.c, buf, sizeof(buf), why, sizeof(why)), -EBADMSG);
    cr_assert(strstr(why, "less than a record header"), "%s", why);

    struct ringlm_wire_rec_hdr h = {.len = 12, .type = RINGLM_WIRE_REC_CANCEL};
    memcpy(r.data, &h, sizeof(h));
    r.prod = 64;
    ring_rec_poll(&r.c, why, sizeof(why));
    cr_assert_eq(ring_rec_next(&r.c, buf, sizeof(buf), why, sizeof(why)), -EBADMSG);
    cr_assert(strstr(why, "multiple of 8"), "%s", why);

    h.len = 128; /* more than published */
    memcpy(r.data, &h, sizeof(h));
    ring_rec_poll(&r.c, why, sizeof(why));
    cr_assert_eq(ring_rec_next(&r.c, buf, sizeof(buf), why, sizeof(why)), -EBADMSG);
    cr_assert(strstr(why, "exceeds the 64 bytes published"), "%s", why);

    h.len = 0;
    memcpy(r.data, &h, sizeof(h));
    ring_rec_poll(&r.c, why, sizeof(why));
    cr_assert_eq(ring_rec_next(&r.c, buf, sizeof(buf), why, sizeof(why)), -EBADMSG);
}

Test(shm_ring, event_ring_full_empty_and_hostile_consumer)
{
    struct ringlm_wire_event slots[8];
    uint64_t prod = 0, cons = 0;
    struct ring_ev_prod p = {.slots = slots, .mask = 7, .prod_p = &prod, .cons_p = &cons};
    struct ring_ev_cons c = {.slots = slots, .mask = 7, .prod_p = &prod, .cons_p = &cons};
    char why[160];
    uint64_t next = 0;
    for (int round = 0; round < 1000; round++) {
        while (ring_ev_space(&p, 1, why, sizeof(why)) > 0) {
            struct ringlm_wire_event e = {.req_id = next++, .meta = RINGLM_WIRE_EV_META(1, 0)};
            ring_ev_put(&p, &e);
        }
        int64_t before = ring_ev_avail(&c, 1, why, sizeof(why));
        cr_assert_eq(before, (int64_t)(prod - c.cons), "unpublished events visible: %lld",
                     (long long)before);
        ring_ev_publish(&p);
        int64_t n = ring_ev_avail(&c, 8, why, sizeof(why)); /* want 8: reload past the cache */
        cr_assert_eq(n, 8);
        for (int64_t k = 0; k < n; k++)
            cr_assert_eq(ring_ev_peek(&c, (uint64_t)k).req_id, c.cons + (uint64_t)k);
        ring_ev_consume(&c, (uint64_t)(round % 2 ? n : n - 1));
    }
    cons = prod + 5; /* a consumer that claims more than was produced */
    p.cached_cons = prod - 8;
    cr_assert_eq(ring_ev_space(&p, 1, why, sizeof(why)), -EBADMSG);
    cr_assert(strstr(why, "outside"), "%s", why);
    cons = c.cons;
    prod = c.cons + 9; /* a producer beyond the capacity */
    c.cached_prod = c.cons;
    cr_assert_eq(ring_ev_avail(&c, 1, why, sizeof(why)), -EBADMSG);
}

/* ---- two threads, sleeping both ways, 10^6 events --------------------------------- */
/* The same protocol as the real sessions (the handshake of shm/ring.h): producer
 * publishes, then checks the consumer's sleeping flag (ring_handshake_peer_waits) and wakes
 * with FUTEX_WAKE on the published index word; consumer announces (ring_handshake_announce),
 * re-checks, FUTEX_WAITs on that word with the value seen. Symmetric for space: the
 * producer sleeps on the consumer index word when full. */
struct duo {
    struct ringlm_wire_event slots[64];
    uint64_t prod __attribute__((aligned(128)));
    uint32_t prod_sleeping __attribute__((aligned(128)));
    uint64_t cons __attribute__((aligned(128)));
    uint32_t cons_sleeping __attribute__((aligned(128)));
    uint64_t n;
    uint64_t producer_sleeps, consumer_sleeps;
    int spin_limit;
};

static void *producer(void *arg)
{
    struct duo *d = arg;
    struct ring_ev_prod p = {.slots = d->slots, .mask = 63, .prod_p = &d->prod, .cons_p = &d->cons};
    char why[128];
    for (uint64_t i = 0; i < d->n;) {
        int64_t space = ring_ev_space(&p, 1, why, sizeof(why));
        if (space <= 0) {
            for (int s = 0; s < d->spin_limit && ring_ev_space(&p, 1, why, sizeof(why)) <= 0; s++)
                ring_cpu_relax();
            if (ring_ev_space(&p, 1, why, sizeof(why)) > 0) continue;
            ring_handshake_announce(&d->prod_sleeping);
            uint64_t c = ring_load_acquire(&d->cons);
            if (c == p.cached_cons) {
                d->producer_sleeps++;
                futex_wait((const uint32_t *)&d->cons, (uint32_t)c, -1, FUTEX_SCOPE_SHARED);
            }
            ring_store32(&d->prod_sleeping, 0);
            continue;
        }
        /* A burst of random length, then publish. */
        uint64_t burst = 1 + (i * 2654435761u >> 7) % (uint64_t)space;
        for (uint64_t k = 0; k < burst && i < d->n; k++, i++) {
            struct ringlm_wire_event e = {
                .req_id = i, .value = (int32_t)(i ^ 0x5a5a5a5a), .meta = RINGLM_WIRE_EV_META(1, i)};
            ring_ev_put(&p, &e);
        }
        ring_ev_publish(&p);
        if (ring_handshake_peer_waits(&d->cons_sleeping))
            futex_wake((const uint32_t *)&d->prod, 1, FUTEX_SCOPE_SHARED);
    }
    return NULL;
}

static void *consumer(void *arg)
{
    struct duo *d = arg;
    struct ring_ev_cons c = {.slots = d->slots, .mask = 63, .prod_p = &d->prod, .cons_p = &d->cons};
    char why[128];
    uint64_t expect = 0;
    while (expect < d->n) {
        int64_t n = ring_ev_avail(&c, 1, why, sizeof(why));
        if (n < 0) return (void *)"bad index";
        if (n == 0) {
            for (int s = 0; s < d->spin_limit && ring_ev_avail(&c, 1, why, sizeof(why)) == 0; s++)
                ring_cpu_relax();
            if (ring_ev_avail(&c, 1, why, sizeof(why)) > 0) continue;
            ring_handshake_announce(&d->cons_sleeping);
            uint64_t p = ring_load_acquire(&d->prod);
            if (p == c.cons) {
                d->consumer_sleeps++;
                futex_wait((const uint32_t *)&d->prod, (uint32_t)p, -1, FUTEX_SCOPE_SHARED);
            }
            ring_store32(&d->cons_sleeping, 0);
            continue;
        }
        for (int64_t k = 0; k < n; k++, expect++) {
            struct ringlm_wire_event e = ring_ev_peek(&c, (uint64_t)k);
            if (e.req_id != expect || e.value != (int32_t)(expect ^ 0x5a5a5a5a))
                return (void *)"event out of order, lost or duplicated";
        }
        ring_ev_consume(&c, (uint64_t)n);
        if (ring_handshake_peer_waits(&d->prod_sleeping))
            futex_wake((const uint32_t *)&d->cons, 1, FUTEX_SCOPE_SHARED);
    }
    return NULL;
}

static void run_duo(uint64_t n, int spin_limit)
{
    struct duo *d = calloc(1, sizeof(*d));
    d->n = n;
    d->spin_limit = spin_limit;
    pthread_t tp, tc;
    pthread_create(&tc, NULL, consumer, d);
    pthread_create(&tp, NULL, producer, d);
    void *err;
    pthread_join(tp, NULL);
    pthread_join(tc, &err);
    cr_assert_null(err, "%s (prod %llu cons %llu)", (char *)err, (unsigned long long)d->prod,
                   (unsigned long long)d->cons);
    cr_assert_eq(d->cons, n);
    cr_log_info("%llu events: producer slept %llu times, consumer %llu times",
                (unsigned long long)n, (unsigned long long)d->producer_sleeps,
                (unsigned long long)d->consumer_sleeps);
    free(d);
}

/* No spinning: every empty/full moment goes to sleep — the stress case for lost wakeups
 * (a lost one hangs; the suite timeout turns that into a failure). */
Test(shm_ring, million_events_two_threads_sleeping, .timeout = 60)
{
    run_duo(1000000, 0);
}

Test(shm_ring, million_events_two_threads_spinning, .timeout = 60)
{
    run_duo(1000000, 1000);
}

/* ---- the record parser -------------------------------------------------------------- */
static size_t make_request(uint8_t *buf, uint32_t n)
{
    uint32_t len = (uint32_t)ringlm_wire_request_bytes(n);
    memset(buf, 0, len);
    struct ringlm_wire_rec_hdr h = {.len = len, .type = RINGLM_WIRE_REC_REQUEST};
    struct ringlm_wire_request q = {
        .req_id = 5, .max_new_tokens = 4, .n_prompt = n, .top_p = 0.9f, .temperature = 0.7f};
    strcpy(q.class_name, "chat");
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), &q, sizeof(q));
    return len;
}

#define REQ_AT(buf) ((struct ringlm_wire_request *)((buf) + sizeof(struct ringlm_wire_rec_hdr)))

Test(shm_wire, parser_accepts_valid_and_names_each_fault)
{
    uint8_t buf[512] __attribute__((aligned(8)));
    struct ringlm_wire_parsed p;
    char why[200];
    size_t len = make_request(buf, 3);
    cr_assert_eq(ringlm_wire_parse(buf, len, &p, why, sizeof(why)), 0, "%s", why);
    cr_assert_str_eq(p.class_name, "chat");
    cr_assert_str_eq(p.tenant_tag, "");
    cr_assert_eq(p.req->n_prompt, 3);
    cr_assert_eq(ringlm_wire_check_request(p.req, why, sizeof(why)), 0, "%s", why);

    /* Each fault, alone, on a fresh copy: parse fails and the detail names it. */
    static const char *const expect[] = {
        "prompt tokens need",
        "header says",
        "flags 0x",
        "type 77",
        "request id 0",
        "class_name",
        "tenant_tag set without",
        "nonzero padding",
        "request flags",
        "tenant_tag not NUL",
    };
    for (int k = 0; k < (int)(sizeof(expect) / sizeof(expect[0])); k++) {
        len = make_request(buf, 3); /* 88 + 8 + 12 = 108 -> 112: 4 bytes of padding */
        struct ringlm_wire_rec_hdr *h = (struct ringlm_wire_rec_hdr *)buf;
        struct ringlm_wire_request *q = REQ_AT(buf);
        size_t plen = len;
        switch (k) {
        case 0: q->n_prompt = 9; break;
        case 1: plen = len - 8; break;
        case 2: h->flags = 1; break;
        case 3: h->type = 77; break;
        case 4: q->req_id = 0; break;
        case 5: memset(q->class_name, 'x', sizeof(q->class_name)); break;
        case 6: strcpy(q->tenant_tag, "t"); break;
        case 7: buf[len - 1] = 1; break;
        case 8: q->flags = 0x80; break;
        case 9:
            q->flags = RINGLM_WIRE_REQ_F_TENANT;
            strcpy(q->tenant_tag, "t");
            q->tenant_tag[5] = 'z';
            break;
        }
        why[0] = 0;
        cr_assert_eq(ringlm_wire_parse(buf, plen, &p, why, sizeof(why)), -EBADMSG, "case %d parsed",
                     k);
        cr_assert(strstr(why, expect[k]), "case %d: detail '%s' lacks '%s'", k, why, expect[k]);
    }
    /* Tenant tag with its flag is fine. */
    len = make_request(buf, 1);
    REQ_AT(buf)->flags = RINGLM_WIRE_REQ_F_TENANT;
    strcpy(REQ_AT(buf)->tenant_tag, "gateway");
    cr_assert_eq(ringlm_wire_parse(buf, len, &p, why, sizeof(why)), 0, "%s", why);
    cr_assert_str_eq(p.tenant_tag, "gateway");
    /* Cancel records. */
    uint8_t cbuf[16] __attribute__((aligned(8))) = {0};
    struct ringlm_wire_rec_hdr ch = {.len = 16, .type = RINGLM_WIRE_REC_CANCEL};
    memcpy(cbuf, &ch, sizeof(ch));
    cr_assert_eq(ringlm_wire_parse(cbuf, 16, &p, why, sizeof(why)), -EBADMSG);
    cr_assert(strstr(why, "id 0"), "%s", why);
    uint64_t id = 42;
    memcpy(cbuf + 8, &id, 8);
    cr_assert_eq(ringlm_wire_parse(cbuf, 16, &p, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(p.cancel_id, 42);
    cr_assert_eq(ringlm_wire_parse(cbuf, 4, &p, why, sizeof(why)), -EBADMSG);
}

Test(shm_wire, semantic_checks_and_reason_names)
{
    struct ringlm_wire_request q = {.req_id = 1, .max_new_tokens = 1, .n_prompt = 1, .top_p = 1};
    char why[160];
    cr_assert_eq(ringlm_wire_check_request(&q, why, sizeof(why)), 0);
    q.temperature = -0.5f;
    cr_assert_eq(ringlm_wire_check_request(&q, why, sizeof(why)), RINGLM_WIRE_R_BAD_PARAMS);
    cr_assert(strstr(why, "temperature"), "%s", why);
    q.temperature = 0;
    q.top_p = 0;
    cr_assert_eq(ringlm_wire_check_request(&q, why, sizeof(why)), RINGLM_WIRE_R_BAD_PARAMS);
    q.top_p = __builtin_nanf("");
    cr_assert_eq(ringlm_wire_check_request(&q, why, sizeof(why)), RINGLM_WIRE_R_BAD_PARAMS);
    q.top_p = 1;
    q.max_new_tokens = 0;
    cr_assert_eq(ringlm_wire_check_request(&q, why, sizeof(why)), RINGLM_WIRE_R_BAD_PARAMS);
    q.max_new_tokens = 1;
    q.n_prompt = 0;
    cr_assert_eq(ringlm_wire_check_request(&q, why, sizeof(why)), RINGLM_WIRE_R_BAD_PARAMS);
    cr_assert_str_eq(ringlm_wire_reason_name(RINGLM_WIRE_R_OUTPUT_BACKPRESSURE),
                     "output_backpressure");
    cr_assert_str_eq(ringlm_wire_reason_name(RINGLM_WIRE_R_LENGTH), "length");
    cr_assert_str_eq(ringlm_wire_reason_name(7), "unknown");
    cr_assert_str_eq(ringlm_wire_reason_name(100000), "unknown");
}

/* Log-probabilities travel as a LOGPROB slot and (n + 1) / 2 LOGPROB_TOP slots: every count
 * from 0 to 20 comes back bit for bit, and a damaged group is refused, never misread. */
Test(shm_wire, logprob_slots_round_trip_and_refuse_damage)
{
    for (unsigned n = 0; n <= RINGLM_WIRE_TOP_LOGPROBS_MAX; n++) {
        struct ringlm_wire_logprobs in = {.logprob = -1.25f - (float)n,
                                          .rank = 3 + n,
                                          .flags = n & 1 ? RINGLM_WIRE_LP_F_PROCESSED : 0,
                                          .n_top = n};
        for (unsigned j = 0; j < n; j++) {
            in.top_token[j] = (int32_t)(1000 * j + 7);
            in.top_logprob[j] = -0.5f * (float)j;
        }
        struct ringlm_wire_event slots[RINGLM_WIRE_LP_SLOTS(RINGLM_WIRE_TOP_LOGPROBS_MAX)];
        unsigned k = ringlm_wire_lp_encode(&in, slots);
        cr_assert_eq(k + 1, RINGLM_WIRE_LP_SLOTS(n), "n %u: %u slots", n, k);
        struct ringlm_wire_logprobs out;
        char why[128];
        int used = ringlm_wire_lp_decode(&slots[0], &slots[1], k - 1, &out, why, sizeof why);
        cr_assert_eq(used, (int)k - 1, "n %u: %s", n, why);
        cr_assert_eq(out.logprob, in.logprob);
        cr_assert_eq(out.rank, in.rank);
        cr_assert_eq(out.flags, in.flags);
        cr_assert_eq(out.n_top, n);
        cr_assert_arr_eq(out.top_token, in.top_token, n * sizeof(int32_t));
        cr_assert_arr_eq(out.top_logprob, in.top_logprob, n * sizeof(float));
        if (n >= 2) {
            /* fewer TOP slots than it says */
            cr_assert_eq(ringlm_wire_lp_decode(&slots[0], &slots[1], k - 2, &out, why, sizeof why),
                         -EBADMSG);
            /* a slot of another kind in the group */
            struct ringlm_wire_event bad = slots[1];
            slots[1].meta = RINGLM_WIRE_EV_META(RINGLM_WIRE_EV_TOKEN, 0);
            cr_assert_eq(ringlm_wire_lp_decode(&slots[0], &slots[1], k - 1, &out, why, sizeof why),
                         -EBADMSG);
            slots[1] = bad;
        }
    }
    struct ringlm_wire_event head = {.value = 21,
                                     .meta = RINGLM_WIRE_EV_META(RINGLM_WIRE_EV_LOGPROB, 0)};
    char why[128];
    struct ringlm_wire_logprobs out;
    cr_assert_eq(ringlm_wire_lp_decode(&head, NULL, 0, &out, why, sizeof why), -EBADMSG);
    cr_assert(strstr(why, "21"), "%s", why);
}
