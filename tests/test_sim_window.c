/* SPDX-License-Identifier: MIT */
/*
 * test_sim_window.c — ringlm-sim's what-if of a model windowed on every layer
 * (--attention-window, the service file's attention_window): its sequences hold only their
 * window's KV blocks, as the daemon's do, so sequences far longer than the device pool run
 * where without the window they are refused as never fitting.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "tests/helpers.h"
#include "tests/sim_test_util.h"

static json_int_t all_int(json_t *j, const char *key)
{
    json_t *all = json_object_get(j, "all");
    cr_assert_not_null(all, "no \"all\" in the report");
    return json_integer_value(json_object_get(all, key));
}

/* 8 requests of 100 + 2000 tokens (132 blocks of 16 each) in a device pool of 64 blocks */
#define LONG_RUN                                                                                   \
    "--workload poisson --param n=8 --param prompt=100 --param output=2000 --kv-blocks 64 "        \
    "--seed 3"

Test(sim_window, long_sequences_fit_in_the_pool_of_their_window)
{
    json_t *off = sim_json(LONG_RUN);
    cr_assert_eq(all_int(off, "finished"), 0, "without a window none fits");
    cr_assert_eq(all_int(off, "rejected"), 8);
    json_decref(off);

    json_t *on = sim_json(LONG_RUN " --attention-window 256");
    cr_assert_eq(all_int(on, "finished"), 8, "a window of 256 (17 blocks) holds each");
    cr_assert_eq(all_int(on, "rejected"), 0);
    cr_assert_eq(all_int(on, "served_output_tokens"), 8 * 2000);
    cr_assert_eq(
        json_integer_value(json_object_get(json_object_get(on, "service"), "attention_window")),
        256, "the report names the window");
    json_decref(on);
}
