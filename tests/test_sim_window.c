/* SPDX-License-Identifier: MIT */
/*
 * test_sim_window.c — ringlm-sim's what-if of a model windowed on every layer
 * (--attention-window, the service file's attention_window): its sequences hold only their
 * window's KV blocks, as the daemon's do, so sequences far longer than the device pool run
 * where without the window they are refused as never fitting.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "tests/helpers.h"
#include "sim/engine.h"
#include "sim/err.h"
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

/* ---- --window-pattern: windowed and global layers, as ringlmd keeps them in rings ------- */

/* The layout of the real daemon's gemma-shaped files (docs/results/2026-12-06-swa-mixed.md:
 * 6 layers, 13,824 K/V bytes a position, window 32, prefill chunk 64, --kv-blocks 64), which
 * ringlmd logged as "9 rings of 7 blocks (774144 bytes a ring), global layers in 64 blocks of
 * 110592 bytes" (gemma2) and "... (1290240 bytes a ring), ... 36864 bytes" (gemma3): the same
 * rings, and the global blocks in the bytes they leave — 65, ringlmd leaves that one unused. */
Test(sim_window, pattern_layout_is_ringlmds)
{
    sched_policy *p = policy_text("[scheduler]\nmode = token_budget\ntoken_budget = 256\n"
                                  "prefill_chunk = 64\nmax_active_seqs = 16\n");
    const sched_policy_cfg *pc = sched_policy_get(p);
    sim_window_layout l;
    sim_window_pattern g2 = {.window = 32, .windowed = 1, .period = 2};
    cr_assert_eq(sim_window_layout_of(&g2, pc, 64, 16, 13824, 256, &l), 0, "%s", sim_err());
    cr_assert_eq(l.ring_rows, 64, "a ring spans the prefill chunk");
    cr_assert_eq(l.ring_blocks, 7, "ceil((32 + 64) / 16) + 1");
    cr_assert_eq(l.rings, 9, "64 / 7 rings");
    cr_assert_eq(l.ring_bytes, 774144);
    cr_assert_eq(l.bytes_per_token * 16, 110592, "a global block: half the layers");
    cr_assert_eq(l.blocks, 65);

    sim_window_pattern g3 = {.window = 32, .windowed = 5, .period = 6};
    cr_assert_eq(sim_window_layout_of(&g3, pc, 64, 16, 13824, 256, &l), 0, "%s", sim_err());
    cr_assert_eq(l.ring_bytes, 1290240);
    cr_assert_eq(l.bytes_per_token * 16, 36864);
    cr_assert_eq(l.rings, 9);
    /* 64 x 221184 bytes less 9 rings, in blocks of 36864 */
    cr_assert_eq(l.blocks, (64 * 221184 - 9 * 1290240) / 36864);

    /* rings given: the global blocks get what they leave; the ring never outgrows a context
     * (here 4 blocks), and ringlmd's default count stops at max_active_seqs */
    g3.rings = 2;
    cr_assert_eq(sim_window_layout_of(&g3, pc, 64, 16, 13824, 48, &l), 0, "%s", sim_err());
    cr_assert_eq(l.ring_blocks, 3, "a context of 48 positions is 3 blocks");
    cr_assert_eq(l.blocks, (64 * 221184 - 2 * 3 * 16 * 11520) / 36864);
    g3.rings = 0;
    cr_assert_eq(sim_window_layout_of(&g3, pc, 6400, 16, 13824, 4096, &l), 0, "%s", sim_err());
    cr_assert_eq(l.rings, 16, "6400 / 7 rings, capped at max_active_seqs");

    /* refused: rings that leave no global block, a pattern without a global layer */
    g3.rings = 12;
    cr_assert_eq(sim_window_layout_of(&g3, pc, 64, 16, 13824, 256, &l), -EINVAL);
    cr_assert(strstr(sim_err(), "no block left"), "%s", sim_err());
    sim_window_pattern all = {.window = 32, .windowed = 2, .period = 2};
    cr_assert_eq(sim_window_layout_of(&all, pc, 64, 16, 13824, 256, &l), -EINVAL);
    cr_assert(strstr(sim_err(), "--attention-window"), "%s", sim_err());
    sched_policy_free(p);
}

/* 24 requests of 1,000 + 3,000 tokens (250 blocks of 16 each) at once in 2,000 device
 * blocks under the default policy (prefill chunk 256): every layer global, eight fit and the
 * rest wait or are preempted; with gemma3's pattern (a window of 1,024 on 5 of 6 layers) a
 * sequence holds 250 blocks of the global layer and one ring of 81 blocks of the windowed
 * ones, so more run at once in the same memory: fewer preemptions, more tokens a second,
 * the same tokens served. */
#define CROWD                                                                                      \
    "--workload poisson --param n=24 --param rate=1000 --param prompt=1000 --param output=3000 "   \
    "--kv-blocks 2000 --seed 5 --window-pattern gemma3"

static json_t *run_of(json_t *j, size_t i)
{
    json_t *r = json_array_get(json_object_get(j, "runs"), i);
    cr_assert_not_null(r, "run %zu in the report", i);
    return r;
}

static json_int_t kv_int(json_t *run, const char *key)
{
    return json_integer_value(json_object_get(json_object_get(run, "kv"), key));
}

static double kv_num(json_t *run, const char *key)
{
    return json_number_value(json_object_get(json_object_get(run, "kv"), key));
}

static json_int_t preemptions(json_t *run)
{
    json_t *p = json_object_get(json_object_get(run, "all"), "preemptions");
    return json_integer_value(json_object_get(p, "swap")) +
           json_integer_value(json_object_get(p, "recompute"));
}

static double out_tok_s(json_t *run)
{
    return json_number_value(
        json_object_get(json_object_get(run, "throughput"), "output_tokens_per_s"));
}

Test(sim_window, gemma3_pattern_runs_more_sequences_in_the_same_memory)
{
    json_t *j = sim_json(CROWD);
    json_t *g = run_of(j, 0), *w = run_of(j, 1);
    cr_assert_str_eq(json_string_value(json_object_get(g, "policy")), "all-global");
    cr_assert_str_eq(json_string_value(json_object_get(w, "policy")), "window 1024:5/6");
    cr_assert_eq(kv_int(g, "device_blocks"), 2000);
    json_t *wp = json_object_get(json_object_get(w, "kv"), "window_pattern");
    cr_assert_not_null(wp, "the windowed run names its pools");
    const json_int_t rings = json_integer_value(json_object_get(wp, "rings")),
                     rb = json_integer_value(json_object_get(wp, "ring_blocks"));
    cr_assert_eq(rb, (1024 + 256) / 16 + 1, "a ring spans the window and a chunk");
    cr_assert_eq(rings, 2000 / rb, "ringlmd's default count");
    /* the built-in model's 131,072 bytes a position: 21,845 the global layer's, the rest the
     * windowed layers' */
    cr_assert_eq(kv_int(w, "device_blocks"),
                 (2000ll * 131072 - rings * rb * (131072 - 21845)) / 21845);
    cr_assert_eq(all_int(g, "served_output_tokens"), 24 * 3000);
    cr_assert_eq(all_int(w, "served_output_tokens"), 24 * 3000);
    cr_log_info("all-global: %.2f sequences a step, %lld preemptions, %.0f tok/s; gemma3: "
                "%.2f, %lld, %.0f",
                kv_num(g, "mean_batch_seqs"), (long long)preemptions(g), out_tok_s(g),
                kv_num(w, "mean_batch_seqs"), (long long)preemptions(w), out_tok_s(w));
    cr_assert_gt(kv_num(w, "mean_batch_seqs"), kv_num(g, "mean_batch_seqs"));
    cr_assert_lt(preemptions(w), preemptions(g));
    cr_assert_gt(out_tok_s(w), out_tok_s(g));
    /* a sequence of 4,000 positions costs 250 / 6 + 81 x 5 / 6 blocks of every layer */
    cr_assert_eq(json_integer_value(json_object_get(j, "window_balanced_rings")), 18);
    json_decref(j);

    /* 18 rings, as the report suggests: none preempted */
    j = sim_json(CROWD " --window-rings 18");
    w = run_of(j, 1);
    cr_assert_eq(preemptions(w), 0);
    cr_assert_eq(all_int(w, "served_output_tokens"), 24 * 3000);
    json_decref(j);
}

/* Two sequences of 1,000 + 3,000 positions that fit either way run the same steps in both
 * runs; gemma3's windowed layers (5 of 6) read at most 1,024 positions, so each decode step
 * is charged 5/6 × (context − 1,024) context tokens less a sequence: at the built-in model's
 * 0.027 µs a token, ~66 µs less a step for a mean context of ~2,500. */
Test(sim_window, windowed_layers_cost_their_window_in_a_step)
{
    json_t *j = sim_json("--workload poisson --param n=2 --param rate=1000 --param prompt=1000 "
                         "--param output=3000 --kv-blocks 2000 --seed 5 --window-pattern gemma3");
    json_t *g = run_of(j, 0), *w = run_of(j, 1);
    double tg = json_number_value(
               json_object_get(json_object_get(json_object_get(g, "all"), "tpot_ms"), "mean")),
           tw = json_number_value(
               json_object_get(json_object_get(json_object_get(w, "all"), "tpot_ms"), "mean"));
    cr_assert_eq(preemptions(g) + preemptions(w), 0);
    const double saved_us = 2 * 5.0 / 6 * (2500 - 1024) * 0.027;
    cr_log_info("TPOT all-global %.3f ms, gemma3 %.3f ms (expected %.1f us less)", tg, tw,
                saved_us);
    cr_assert_gt((tg - tw) * 1000, saved_us * 0.9, "%.3f vs %.3f ms", tg, tw);
    cr_assert_lt((tg - tw) * 1000, saved_us * 1.1, "%.3f vs %.3f ms", tg, tw);
    json_decref(j);
}

/* What the options refuse, each naming itself; and a pattern whose rings leave no block
 * for the global layers stops before the run. */
Test(sim_window, bad_patterns_are_refused)
{
    char *sim = th_program("ringlm-sim");
    static const struct {
        const char *args, *says;
    } bad[] = {
        {"--window-pattern 0:1", "--window-pattern 0:1: expected W:N"},
        {"--window-pattern 32:0", "expected W:N"},
        {"--window-pattern 32", "expected W:N"},
        {"--window-pattern 32:1:2", "expected W:N"},
        {"--window-pattern gemma4", "expected W:N"},
        {"--window-pattern gemma2:", "expected W:N"},
        {"--window-rings 4", "--window-rings needs --window-pattern"},
        {"--window-pattern 32:1 --attention-window 64", "exclude each other"},
        {"--window-pattern 32:1 --policy sim/policies/fcfs.policy --policy "
         "sim/policies/token-budget.policy",
         "compares one --policy"},
        {"--window-pattern gemma3 --window-rings 1000 --kv-blocks 2000", "no block left"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[1024], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s --workload poisson --param n=4 %s 2>&1", sim, bad[i].args);
        int st = run_shell(cmd, &out);
        cr_assert(st != 0, "%s: exit 0", bad[i].args);
        cr_assert(strstr(out, bad[i].says), "%s: says \"%s\", not \"%s\"", bad[i].args, out,
                  bad[i].says);
        free(out);
    }
    free(sim);
}
