/* SPDX-License-Identifier: MIT */
/*
 * tests/test_daemon_rejects.c — how a real ringlmd refuses a request, as its client sees it:
 * each cause under its own code and name, so a client can tell a request that is too long for
 * the model from one the daemon's KV pool can never hold.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include "common/end_codes.h"
#include "libclient/ringlm.h"
#include "sched/sched.h"
#include "shm/wire.h"
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
