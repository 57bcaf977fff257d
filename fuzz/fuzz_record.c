/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the daemon's read path for client-written memory, end to end.
 * fuzz-sources: shm/ring.c shm/wire.c
 *
 * Input layout: [u64 consumer index][u64 producer index][ring bytes...].  The ring bytes
 * become a submit ring whose capacity is the largest power of two that fits (>= 8); the
 * indices are what a hostile client could publish.  Every record the consumer accepts is
 * parsed (copy-once, as in daemon/session.c) and semantically checked.  Inputs shorter
 * than 24 bytes are parsed directly as one record.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shm/ring.h"
#include "shm/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void parse_one(const void *rec, size_t len)
{
    struct ringlm_wire_parsed p;
    char why[200];
    if (ringlm_wire_parse(rec, len, &p, why, sizeof(why)) == 0 &&
        p.type == RINGLM_WIRE_REC_REQUEST) {
        ringlm_wire_check_request(p.req, why, sizeof(why));
        /* Touch what the parser vouched for: the names and every prompt token. */
        volatile int64_t sum = (int64_t)strlen(p.class_name) + (int64_t)strlen(p.tenant_tag);
        for (uint32_t i = 0; i < p.req->n_prompt; i++) sum += p.prompt[i];
        (void)sum;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint64_t recbuf[8192]; /* 64 KiB, 8-byte aligned private copy */
    if (size < 24) {
        memcpy(recbuf, data, size);
        parse_one(recbuf, size);
        return 0;
    }
    uint64_t cons, prod;
    memcpy(&cons, data, 8);
    memcpy(&prod, data + 8, 8);
    size_t avail = size - 16, cap = 8;
    while (cap * 2 <= avail && cap * 2 <= sizeof(recbuf)) cap *= 2;
    /* The ring lives in its own heap block so that ASan sees any access past it. */
    uint8_t *ring = malloc(cap);
    if (!ring) return 0;
    memcpy(ring, data + 16, cap);
    uint64_t cons_pub = 0;
    struct ring_rec_cons c = {.data = ring,
                              .cap = cap,
                              .cons = cons,
                              .max_record = (uint32_t)cap,
                              .prod_p = &prod,
                              .cons_p = &cons_pub};
    char why[200];
    if (ring_rec_poll(&c, why, sizeof(why)) >= 0) {
        int64_t len;
        while ((len = ring_rec_next(&c, recbuf, sizeof(recbuf), why, sizeof(why))) > 0)
            parse_one(recbuf, (size_t)len);
        ring_rec_release(&c);
    }
    free(ring);
    return 0;
}
