/* SPDX-License-Identifier: MIT */
/*
 * The gateway's pick between daemons (gateway/gw_route.h), alone: a daemon's load is its own
 * queue and running count (or what the gateway sent it, when more) plus its device KV use,
 * a repeated prefix goes where it went unless that daemon is loaded past the slack, unique
 * prompts go to the least loaded, equal ones in turn, and a daemon that is down gets nothing.
 */
#include <criterion/criterion.h>

#include <stdint.h>

#include "gateway/gw_route.h"

TestSuite(gateway_route);

static int32_t g_prompt[64];

static void prompt_of(int seed)
{
    for (int i = 0; i < 64; i++) g_prompt[i] = (int32_t)(seed * 1000 + i);
}

Test(gateway_route, load_is_the_daemons_queue_or_what_was_sent_plus_kv_use)
{
    gw_daemon_load l = {.sent = 3};
    cr_assert_eq(gw_route_load(&l), 3, "a daemon that publishes nothing: what was sent");
    l = (gw_daemon_load){.sent = 3, .published = true, .waiting = 5, .running = 2};
    cr_assert_eq(gw_route_load(&l), 7, "the daemon counts other clients' requests too");
    l = (gw_daemon_load){.sent = 9, .published = true, .waiting = 5, .running = 2};
    cr_assert_eq(gw_route_load(&l), 9, "a submit the daemon has not counted yet");
    l = (gw_daemon_load){.published = true, .kv_used = 40, .kv_total = 40};
    cr_assert_eq(gw_route_load(&l), GW_ROUTE_KV_WEIGHT, "a full pool");
    l = (gw_daemon_load){.published = true, .running = 1, .kv_used = 17, .kv_total = 40};
    cr_assert_eq(gw_route_load(&l), 1 + 17 * GW_ROUTE_KV_WEIGHT / 40, "rounded down");
}

Test(gateway_route, kv_use_steers_unique_prompts_away_from_a_full_daemon)
{
    gw_route *rt = gw_route_new(16);
    cr_assert_not_null(rt);
    /* daemon 0: one request running that holds most of the pool; daemon 1: two queued */
    gw_daemon_load dl[2] = {
        {.published = true, .running = 1, .kv_used = 34, .kv_total = 40},
        {.published = true, .waiting = 2, .kv_total = 40},
    };
    size_t load[2] = {gw_route_load(&dl[0]), gw_route_load(&dl[1])};
    bool up[2] = {true, true};
    for (int i = 0; i < 4; i++) {
        prompt_of(i);
        cr_assert_eq(gw_route_pick(rt, g_prompt, 64, load, up, 2, NULL), 1,
                     "loads %zu and %zu: the full pool's daemon was picked", load[0], load[1]);
    }
    gw_route_free(rt);
}

Test(gateway_route, a_prefix_goes_where_it_went_until_that_daemon_is_loaded_past_the_slack)
{
    gw_route *rt = gw_route_new(16);
    size_t load[2] = {0, 0};
    bool up[2] = {true, true};
    prompt_of(7);
    int first = gw_route_pick(rt, g_prompt, 64, load, up, 2, NULL);
    cr_assert(first == 0 || first == 1);
    gw_route_record(rt, g_prompt, 64, first);
    uint32_t aff = 0;
    load[first] = GW_ROUTE_SLACK;
    cr_assert_eq(gw_route_pick(rt, g_prompt, 64, load, up, 2, &aff), first);
    cr_assert_eq(aff, 4, "four full blocks of 16 matched");
    load[first] = GW_ROUTE_SLACK + 1;
    cr_assert_eq(gw_route_pick(rt, g_prompt, 64, load, up, 2, &aff), 1 - first,
                 "a cached prefix is not worth waiting behind a crowd");
    /* a prompt that shares only the first two blocks: affinity two */
    load[first] = 0;
    g_prompt[40] = -5;
    cr_assert_eq(gw_route_pick(rt, g_prompt, 64, load, up, 2, &aff), first);
    cr_assert_eq(aff, 2);
    gw_route_free(rt);
}

Test(gateway_route, unique_prompts_take_equal_daemons_in_turn_and_skip_one_that_is_down)
{
    gw_route *rt = gw_route_new(16);
    size_t load[3] = {0, 0, 0};
    bool up[3] = {true, true, true};
    int n[3] = {0};
    for (int i = 0; i < 30; i++) {
        prompt_of(100 + i);
        n[gw_route_pick(rt, g_prompt, 64, load, up, 3, NULL)]++;
    }
    cr_assert(n[0] == 10 && n[1] == 10 && n[2] == 10, "split %d/%d/%d", n[0], n[1], n[2]);
    up[1] = false;
    for (int i = 0; i < 10; i++) {
        prompt_of(200 + i);
        cr_assert_neq(gw_route_pick(rt, g_prompt, 64, load, up, 3, NULL), 1);
    }
    /* a prefix recorded on the daemon that went down goes elsewhere */
    prompt_of(300);
    gw_route_record(rt, g_prompt, 64, 1);
    cr_assert_neq(gw_route_pick(rt, g_prompt, 64, load, up, 3, NULL), 1);
    up[0] = up[2] = false;
    cr_assert_eq(gw_route_pick(rt, g_prompt, 64, load, up, 3, NULL), -1, "none up");
    gw_route_free(rt);
}
