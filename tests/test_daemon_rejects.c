/* SPDX-License-Identifier: MIT */
/*
 * tests/test_daemon_rejects.c — how a real ringlmd refuses a request, as its client sees it:
 * each cause under its own code and name, so a client can tell a request that is too long for
 * the model from one the daemon's KV pool can never hold; and the one parameter check, which
 * refuses a bad request at ringlm_submit and again in the daemon for a client that writes
 * the ring itself.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/end_codes.h"
#include "common/futex.h"
#include "libclient/ringlm.h"
#include "sched/sched.h"
#include "shm/wire.h"
#include "tests/daemon_helpers.h"
#include "tests/helpers.h"

/* The model every test here serves: stories260K's shape (context 512, vocabulary 512). */
#define MODEL "synthetic:stories260K:1"

static void start(th_daemon *d, const char *const *extra)
{
    const char *args[24] = {"--model", MODEL};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 23; i++) args[n++] = extra[i];
    args[n] = NULL;
    th_daemon_init(d);
    th_daemon_start(d, args, 20000);
}

/* Submits prompt[n] with max_new tokens and waits for its FINISH. */
static ringlm_event submit_and_finish(ringlm_client *c, const int32_t *prompt, uint32_t n,
                                      uint32_t max_new)
{
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = prompt;
    r.n_prompt = n;
    r.max_new_tokens = max_new;
    uint64_t id;
    cr_assert_eq(ringlm_submit(c, &r, &id), 0, "submit: %s", ringlm_errdetail());
    for (;;) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 20000);
        cr_assert_gt(rc, 0, "next_event %d: %s", rc, ringlm_errdetail());
        if (ev.req_id == id && ev.kind == RINGLM_EV_FINISH) return ev;
    }
}

Test(daemon_rejects, too_long_and_never_fits_are_two_causes)
{
    th_daemon d;
    /* 4 blocks of 16 tokens: 64 tokens of KV, far below the model's 512-token context. */
    start(&d, (const char *const[]){"--kv-blocks", "4", "--kv-block-size", "16", NULL});
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    const int32_t prompt[5] = {1, 403, 407, 261, 378};

    /* Beyond the model's context: the request itself is too long. */
    ringlm_event ev = submit_and_finish(c, prompt, 5, 600);
    cr_expect_eq(ev.finish_reason, RINGLM_FINISH_REJECTED);
    cr_expect_eq(ev.reject_reason, RINGLM_R_TOO_LONG, "got %s",
                 ringlm_reason_name(ev.reject_reason));

    /* Within the context, beyond what this daemon's pool can ever hold. */
    ev = submit_and_finish(c, prompt, 5, 100);
    cr_expect_eq(ev.finish_reason, RINGLM_FINISH_REJECTED);
    cr_expect_eq(ev.reject_reason, RINGLM_R_NEVER_FITS, "got %s",
                 ringlm_reason_name(ev.reject_reason));
    cr_expect_str_eq(ringlm_reason_name(ev.reject_reason), "never_fits");

    /* And a request that fits is served. */
    ev = submit_and_finish(c, prompt, 5, 8);
    cr_expect_eq(ev.finish_reason, RINGLM_FINISH_LENGTH, "got %s/%s",
                 ringlm_reason_name(ev.finish_reason), ringlm_reason_name(ev.reject_reason));
    ringlm_close(c);
    cr_expect_eq(th_daemon_stop(&d, SIGTERM, 10000), 0, "%s", th_daemon_output(&d));
    th_daemon_cleanup(&d);
}

/* The wire, the scheduler and the public API name every code of the one table alike. */
Test(daemon_rejects, every_end_code_has_one_name)
{
#define SAME_NAME(suffix, value, name, doc)                                                        \
    cr_expect_str_eq(ringlm_wire_reason_name(RINGLM_WIRE_R_##suffix), name);                       \
    cr_expect_str_eq(sched_end_name(SCHED_END_##suffix), name);                                    \
    cr_expect_str_eq(ringlm_reason_name(value), name);
    END_CODES(SAME_NAME)
#undef SAME_NAME
    cr_expect_str_eq(ringlm_reason_name(RINGLM_R_NEVER_FITS), "never_fits");
    cr_expect_str_eq(ringlm_reason_name(END_CODES_MAX), "unknown");
    cr_expect_str_eq(ringlm_reason_name(-1), "unknown");
}

/* ---- the one parameter check ------------------------------------------------------------ */

/* One request per bound of the one check, just outside it, and the field the detail names. */
typedef struct bad_case {
    const char *field;
    uint32_t max_new;
    float temperature, top_p;
    uint64_t deadline_us;
} bad_case;

static const bad_case bad_cases[] = {
    {"max_new_tokens", 0, 0, 1, 0},
    {"max_new_tokens", RINGLM_WIRE_INDEX_MAX + 1, 0, 1, 0},
    {"temperature", 8, -0.5f, 1, 0},
    {"temperature", 8, 100.5f, 1, 0},
    {"temperature", 8, __builtin_nanf(""), 1, 0},
    {"top_p", 8, 0, 0.0f, 0},
    {"top_p", 8, 0, 1.01f, 0},
    {"deadline_us", 8, 0, 1, RINGLM_WIRE_DEADLINE_MAX_US + 1},
};
#define N_BAD (sizeof bad_cases / sizeof bad_cases[0])

static void fill_bad(ringlm_request *r, const bad_case *b, const int32_t *prompt)
{
    ringlm_request_init(r);
    r->prompt = prompt;
    r->n_prompt = 3;
    r->max_new_tokens = b->max_new;
    r->temperature = b->temperature;
    r->top_p = b->top_p;
    r->deadline_us = b->deadline_us;
}

/* ringlm_submit refuses each one at once (-EINVAL, the detail naming the field), as
 * ringlm_request_check does without a connection; the ranges' edges themselves are served. */
Test(daemon_rejects, a_bad_parameter_is_refused_at_submit)
{
    const int32_t prompt[3] = {1, 403, 407};
    th_daemon d;
    start(&d, NULL);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    for (size_t i = 0; i < N_BAD; i++) {
        ringlm_request r;
        fill_bad(&r, &bad_cases[i], prompt);
        const char *field = NULL;
        cr_expect_eq(ringlm_request_check(&r, &field), -EINVAL, "case %zu", i);
        cr_expect_str_eq(field ? field : "(null)", bad_cases[i].field, "case %zu", i);
        uint64_t id = 0;
        cr_expect_eq(ringlm_submit(c, &r, &id), -EINVAL, "case %zu (%s) was sent", i,
                     bad_cases[i].field);
        cr_expect(!strncmp(ringlm_errdetail(), bad_cases[i].field, strlen(bad_cases[i].field)),
                  "case %zu: detail '%s' does not name %s", i, ringlm_errdetail(),
                  bad_cases[i].field);
    }
    /* The edges are inside: temperature 100, top_p 1, a deadline of a year. */
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = prompt;
    r.n_prompt = 3;
    r.max_new_tokens = 4;
    r.temperature = 100.0f;
    r.top_p = 1.0f;
    r.deadline_us = RINGLM_WIRE_DEADLINE_MAX_US;
    cr_expect_eq(ringlm_request_check(&r, NULL), 0, "%s", ringlm_errdetail());
    ringlm_event ev = submit_and_finish(c, prompt, 3, 4);
    cr_expect_eq(ev.finish_reason, RINGLM_FINISH_LENGTH);
    ringlm_close(c);
    cr_expect_eq(th_daemon_stop(&d, SIGTERM, 10000), 0, "%s", th_daemon_output(&d));
    th_daemon_cleanup(&d);
}

/* A client that writes the ring itself, past the library: the daemon runs the same check and
 * answers each bad record with FINISH rejected / bad_params, and keeps serving. */
static void raw_submit_bad(th_raw *r, const bad_case *cases, uint32_t n, const int32_t *p)
{
    uint64_t cap = r->cseg->hdr.data_bytes, at = 0;
    uint8_t *data = (uint8_t *)r->cseg + r->cseg->hdr.data_off;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t rec[256];
        uint32_t len = (uint32_t)ringlm_wire_request_bytes(3);
        memset(rec, 0, sizeof rec);
        struct ringlm_wire_rec_hdr h = {.len = len, .type = RINGLM_WIRE_REC_REQUEST};
        struct ringlm_wire_request q = {.req_id = i + 1,
                                        .max_new_tokens = cases[i].max_new,
                                        .n_prompt = 3,
                                        .temperature = cases[i].temperature,
                                        .top_p = cases[i].top_p,
                                        .deadline_us = cases[i].deadline_us};
        strcpy(q.class_name, "default");
        memcpy(rec, &h, sizeof h);
        memcpy(rec + sizeof h, &q, sizeof q);
        memcpy(rec + sizeof h + sizeof q, p, 3 * sizeof(int32_t));
        for (uint32_t k = 0; k < len; k++) data[(at + k) & (cap - 1)] = rec[k];
        at += len;
    }
    __atomic_store_n(&r->cseg->submit_prod, at, __ATOMIC_RELEASE);
    __atomic_add_fetch(&r->cseg->doorbell, 1, __ATOMIC_SEQ_CST);
    futex_wake(&r->cseg->doorbell, 1, FUTEX_SCOPE_SHARED);
}

Test(daemon_rejects, a_bad_parameter_on_the_wire_is_bad_params_from_the_daemon)
{
    const int32_t prompt[3] = {1, 403, 407};
    th_daemon d;
    start(&d, NULL);
    th_raw r;
    th_raw_connect(d.sock, &r);
    raw_submit_bad(&r, bad_cases, N_BAD, prompt);
    /* Every record gets its FINISH: rejected, cause bad_params, no token. */
    const struct ringlm_wire_event *slots =
        (const struct ringlm_wire_event *)((const uint8_t *)r.dseg + r.dseg->hdr.data_off);
    uint64_t n_slots = r.dseg->hdr.data_bytes / sizeof(struct ringlm_wire_event);
    int finished[N_BAD + 1] = {0};
    uint32_t seen = 0;
    uint64_t cons = 0, deadline = th_now_ms() + 10000;
    while (seen < N_BAD) {
        uint64_t prod = __atomic_load_n(&r.dseg->ev_prod, __ATOMIC_ACQUIRE);
        if (cons == prod) {
            cr_assert_lt(th_now_ms(), deadline, "%u of %zu bad records answered", seen, N_BAD);
            th_pause_ms(2);
            continue;
        }
        struct ringlm_wire_event ev = slots[cons++ & (n_slots - 1)];
        __atomic_store_n(&r.cseg->ev_cons, cons, __ATOMIC_RELEASE);
        uint32_t kind = RINGLM_WIRE_EV_KIND(ev.meta);
        if (kind == RINGLM_WIRE_EV_FINISH_EXT) continue;
        cr_assert(ev.req_id >= 1 && ev.req_id <= N_BAD, "event for request %llu",
                  (unsigned long long)ev.req_id);
        cr_expect_eq(kind, RINGLM_WIRE_EV_FINISH, "case %llu: a token",
                     (unsigned long long)ev.req_id - 1);
        uint32_t low = RINGLM_WIRE_EV_LOW(ev.meta);
        cr_expect_eq(low >> 8, RINGLM_WIRE_R_REJECTED, "case %llu (%s): finish %s",
                     (unsigned long long)ev.req_id - 1, bad_cases[ev.req_id - 1].field,
                     ringlm_wire_reason_name(low >> 8));
        cr_expect_eq(low & 0xff, RINGLM_WIRE_R_BAD_PARAMS, "case %llu (%s): cause %s",
                     (unsigned long long)ev.req_id - 1, bad_cases[ev.req_id - 1].field,
                     ringlm_wire_reason_name(low & 0xff));
        finished[ev.req_id]++;
        seen++;
    }
    for (size_t i = 1; i <= N_BAD; i++) cr_expect_eq(finished[i], 1, "request %zu", i);
    th_raw_close(&r);
    /* The daemon still serves a good client. */
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    ringlm_event ev = submit_and_finish(c, prompt, 3, 4);
    cr_expect_eq(ev.finish_reason, RINGLM_FINISH_LENGTH);
    ringlm_close(c);
    cr_expect_eq(th_daemon_stop(&d, SIGTERM, 10000), 0, "%s", th_daemon_output(&d));
    th_daemon_cleanup(&d);
}
