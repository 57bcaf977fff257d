/* SPDX-License-Identifier: MIT */
/*
 * tests/sim_test_util.h — what the simulator suites (tests/test_sim_*.c) share (header only,
 * like engine_test_util.h): a policy from its text, a service model whose numbers add up by
 * hand, ringlm-sim run as a program and its JSON report, a shell command's output.
 */
#ifndef RINGLM_TESTS_SIM_TEST_UTIL_H
#define RINGLM_TESTS_SIM_TEST_UTIL_H

#include "sched/sched.h"
#include "sim/service.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "tests/helpers.h"

/* The policy written in text; the test fails, naming the line, when it does not parse. */
static inline sched_policy *policy_text(const char *text)
{
    sched_policy *p = NULL;
    sched_policy_error e = {0};
    cr_assert_eq(sched_policy_parse(text, &p, &e), 0, "policy line %d: %s", e.line, e.reason);
    return p;
}

/* A service model whose numbers are easy to add up by hand: 1 ms a step, 10 µs a prefill
 * token, 100 µs a decoding sequence, nothing per context token; 1000 device blocks of 16
 * tokens, no host tier. The rest as sim_service_default. */
static inline void toy_service(sim_service *s)
{
    sim_service_default(s);
    s->builtin = false;
    s->base_us = 1000;
    s->per_prefill_token_us = 10;
    s->per_decode_seq_us = 100;
    s->per_context_token_us = 0;
    s->kv_block_size = 16;
    s->kv_blocks_device = 1000;
    s->kv_blocks_host = 0;
    s->host.present = false;
}

/* ringlm-sim with args and --json: its one JSON object (json_decref it); the test fails
 * unless it exits 0 and prints one. */
static inline json_t *sim_json(const char *args)
{
    char *sim = th_program("ringlm-sim");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s --json", sim, args);
    free(sim);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f, "%s", cmd);
    json_error_t e;
    json_t *j = json_loadf(f, 0, &e);
    int st = pclose(f);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: exit status %#x", cmd, st);
    cr_assert_not_null(j, "%s: not one JSON object (%s at line %d)", cmd, e.text, e.line);
    return j;
}

/* The shell command cmd run to its end: its stdout to *out (malloc'd, free it); returns its
 * exit status (-1: it did not exit). */
static inline int run_shell(const char *cmd, char **out)
{
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t cap = 1 << 16, len = 0, got;
    char *b = malloc(cap);
    cr_assert_not_null(b);
    while ((got = fread(b + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 1024) {
            cap *= 2;
            b = realloc(b, cap);
            cr_assert_not_null(b);
        }
    }
    b[len] = 0;
    *out = b;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
