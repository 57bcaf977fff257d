/* SPDX-License-Identifier: MIT */
/*
 * tests/test_daemon_constrain_bounds.c — a constraint whose compile is past the engine's
 * bounds, submitted beside ordinary constrained requests to a real ringlmd (stories260K and
 * its tokenizer): a GBNF grammar too costly to analyse (a chain of 6,000 rules: hours of
 * analysis before the step bound) and a JSON Schema whose program is too large (a pattern
 * of nested counted repeats) are each refused with bad_params, the detail naming the
 * bound (in the FINISH detail and in the decision log), while the ordinary requests in the
 * same batch compile and finish, and the daemon serves on.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "libclient/ringlm.h"
#include "tests/constrain_test_util.h"
#include "tests/daemon_helpers.h"
#include "tests/helpers.h"

#define N_REQ   6
#define MAX_OUT 64

typedef struct answer {
    uint64_t id;
    uint32_t n;
    ringlm_event fin;
    char detail[256];
} answer;

Test(daemon_constrain_bounds, a_compile_past_its_bounds_is_refused_beside_ordinary_ones,
     .timeout = 180)
{
    need_daemon_binary();
    char model[512], tok[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    snprintf(tok, sizeof tok, "%s/models/tok512.bin", th_shared_dir());
    if (access(tok, R_OK)) cr_skip_test("tok512.bin not in %s/models", th_shared_dir());
    dmn d;
    const char *extra[] = {"--tokenizer", tok, NULL};
    dmn_start(&d, model, NULL, extra);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    int32_t prompt[2] = {1, 403};

    size_t chain_len;
    char *chain = ctu_rule_chain(6000, &chain_len);
    static const char big_schema[] =
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":"
        "\"^((x{1,200}){1,200}){1,200}$\"}}}";
    static const struct {
        uint32_t kind;
        const char *text; /* NULL: the chain */
        size_t len;
        const char *says; /* NULL: an ordinary request that must finish */
    } req[N_REQ] = {
        {RINGLM_CONSTRAINT_GRAMMAR, NULL, 0, "too costly to analyse"},
        {RINGLM_CONSTRAINT_CHOICE, "yes\0no", 6, NULL},
        {RINGLM_CONSTRAINT_JSON_SCHEMA, big_schema, sizeof big_schema - 1, "too large"},
        {RINGLM_CONSTRAINT_REGEX, "[a-c]{2,5}", 10, NULL},
        {RINGLM_CONSTRAINT_JSON_SCHEMA, "{\"enum\":[1,2,3]}", 16, NULL},
        {RINGLM_CONSTRAINT_GRAMMAR, "root ::= \"ok\" | \"no\"\n", 21, NULL},
    };
    ringlm_request rq[N_REQ];
    ringlm_sampling smp[N_REQ];
    uint64_t ids[N_REQ];
    answer a[N_REQ];
    memset(a, 0, sizeof a);
    for (int i = 0; i < N_REQ; i++) {
        ringlm_request_init(&rq[i]);
        rq[i].prompt = prompt;
        rq[i].n_prompt = 2;
        rq[i].max_new_tokens = MAX_OUT;
        rq[i].temperature = 0.0f;
        ringlm_sampling_init(&smp[i]);
        smp[i].constraint_kind = req[i].kind;
        smp[i].constraint = req[i].text ? req[i].text : chain;
        smp[i].constraint_bytes = req[i].text ? req[i].len : chain_len;
    }
    cr_assert_eq(ringlm_submit_batch_ext(c, rq, smp, N_REQ, ids), 0, "submit: %s",
                 ringlm_errdetail());
    for (int i = 0; i < N_REQ; i++) a[i].id = ids[i];
    for (int left = N_REQ; left;) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 60000);
        cr_assert_gt(rc, 0, "next_event %d: %s", rc, ringlm_errdetail());
        int k = 0;
        while (k < N_REQ && a[k].id != ev.req_id) k++;
        cr_assert_lt(k, N_REQ);
        if (ev.kind == RINGLM_EV_TOKEN) a[k].n++;
        if (ev.kind != RINGLM_EV_FINISH) continue;
        a[k].fin = ev;
        const char *dt = ringlm_event_detail(c);
        snprintf(a[k].detail, sizeof a[k].detail, "%s", dt ? dt : "");
        left--;
    }
    for (int i = 0; i < N_REQ; i++) {
        if (req[i].says) {
            cr_expect_eq(a[i].fin.finish_reason, RINGLM_FINISH_REJECTED, "request %d: %s", i,
                         ringlm_reason_name(a[i].fin.finish_reason));
            cr_expect_eq(a[i].fin.reject_reason, RINGLM_R_BAD_PARAMS, "request %d", i);
            cr_expect_eq(a[i].n, 0u);
            cr_expect(strstr(a[i].detail, req[i].says) != NULL,
                      "request %d: detail \"%s\" does not say %s", i, a[i].detail, req[i].says);
        } else {
            /* greedy decoding may fill the budget (JSON lets whitespace in after a value) */
            cr_expect(a[i].fin.finish_reason == RINGLM_FINISH_STOP ||
                          a[i].fin.finish_reason == RINGLM_FINISH_LENGTH,
                      "request %d: %s (%s)", i, ringlm_reason_name(a[i].fin.finish_reason),
                      a[i].detail);
            cr_expect_gt(a[i].n, 0u, "request %d", i);
        }
    }
    /* and it serves on: the same ordinary constraint again (from the cache) */
    ringlm_request_init(&rq[0]);
    rq[0].prompt = prompt;
    rq[0].n_prompt = 2;
    rq[0].max_new_tokens = MAX_OUT;
    ringlm_sampling_init(&smp[0]);
    smp[0].constraint_kind = RINGLM_CONSTRAINT_CHOICE;
    smp[0].constraint = "yes\0no";
    smp[0].constraint_bytes = 6;
    cr_assert_eq(ringlm_submit_ext(c, &rq[0], &smp[0], &ids[0]), 0, "%s", ringlm_errdetail());
    for (;;) {
        ringlm_event ev;
        cr_assert_gt(ringlm_next_event(c, &ev, 60000), 0, "%s", ringlm_errdetail());
        if (ev.kind != RINGLM_EV_FINISH) continue;
        cr_expect_eq(ev.finish_reason, RINGLM_FINISH_STOP);
        break;
    }
    ringlm_close(c);
    assert_back_to_baseline(&d, 10000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    /* the decision log names each refusal's bound */
    cr_expect_geq(count_lines2(d.declog, "\"bad_params\"", "too costly to analyse"), 1);
    cr_expect_geq(count_lines2(d.declog, "\"bad_params\"", "too large"), 1);
    free(chain);
    dmn_cleanup(&d);
}
