/* SPDX-License-Identifier: MIT */
/*
 * test_daemon_window.c — a real ringlmd serving a model whose every layer attends through a
 * sliding window (a Mistral-style llama GGUF, llama.attention.sliding_window): its sequences
 * hold only the KV blocks their window still sees, so a sequence many times longer than the
 * KV pool runs to its end; swapped out and back, or recomputed, it goes on. Each greedy
 * stream equals the same model's in a pool big enough, with every block kept
 * (ringlmd-test --keep-window-blocks) — llama.cpp ignores the llama architecture's window,
 * so it cannot be the oracle here. Every run keeps --check-invariants, which holds a
 * given-back block-table entry to be behind its sequence's window, and the engine refuses a
 * batch whose -1 entries a row's window would read.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "tests/daemon_helpers.h"
#include "tests/gguf_test_util.h"
#include "tests/helpers.h"
#include "tools/prom.h"

#define WINDOW 32

/* synthetic stories260K (5 layers, context 512) as a llama GGUF, every layer windowed */
static void window_model(char *path, size_t n)
{
    snprintf(path, n, "%s/swa.gguf", tmpdir);
    export_gguf_window("synthetic:stories260K:7", NULL, "F32", NULL, 0, WINDOW, path);
}

static void prompts(px_conc_job *g, int n)
{
    memset(g, 0, sizeof *g);
    g->n = n;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 8; k++) g->prompt[i][k] = 3 + (31 * k + 57 * i) % 500;
        g->n_prompt[i] = 8;
    }
    g->max_new = 400; /* 408 positions: 26 blocks of 16, the window's 3 */
}

static const char *policy(const char *preemption)
{
    static char buf[512];
    snprintf(buf, sizeof buf,
             "[scheduler]\nmode = token_budget\ntoken_budget = 64\nmax_active_seqs = 8\n"
             "prefill_chunk = 16\npreemption = %s\nmin_residency = 0us\nmax_preemptions = 0\n",
             preemption);
    return buf;
}

/* The streams of the same requests in a pool that holds them whole, no block given back. */
static char *reference(const char *model, px_conc_job *g)
{
    const char *flags[] = {
        TH_TEST_BUILD, "--keep-window-blocks", "--kv-blocks", "128", "--kv-block-size", "16", NULL};
    dmn d;
    dmn_start_for(&d, model, policy("recompute"), flags, &g->sock, &g->out);
    dmn_run_client(&d, client_px_concurrent, g, "client (every block kept)");
    char *o = dmn_stop_output(&d);
    dmn_cleanup(&d);
    return o;
}

/* Lines of the daemon's decision log of event kind ev (and holding extra, when given). */
static int decision_count(const dmn *d, const char *ev, const char *extra)
{
    char needle[64];
    snprintf(needle, sizeof needle, "\"ev\":\"%s\"", ev);
    return extra ? count_lines2(d->declog, needle, extra) : count_lines(d->declog, needle);
}

Test(daemon_window, long_sequence_runs_in_a_pool_of_its_window, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 300)
{
    need_daemon_binary();
    char model[512];
    window_model(model, sizeof model);
    static px_conc_job g;
    prompts(&g, 1);
    char *want = reference(model, &g);
    cr_assert(strstr(want, "| length 400"), "reference: %s", want);

    /* 6 blocks of 16 = 96 positions for a sequence of 408 (its window holds 3, 4 in a
     * prefill chunk) */
    const char *flags[] = {"--kv-blocks", "6", "--kv-block-size", "16", NULL};
    dmn d;
    dmn_start_for(&d, model, policy("recompute"), flags, &g.sock, &g.out);
    cr_assert(strstr(th_daemon_output(&d.th), "attends to the last 32 positions"),
              "the daemon gives blocks back: %s", th_daemon_output(&d.th));
    dmn_run_client(&d, client_px_concurrent, &g, "client (window)");
    char *got = dmn_stop_output(&d);
    cr_assert_eq(decision_count(&d, "preempt", NULL), 0, "one sequence: never preempted");
    cr_assert_str_eq(got, want, "greedy stream in 6 blocks differs from every block kept");
    dmn_cleanup(&d);
    free(got);

    /* every block kept, the same request can never fit in 6 blocks */
    const char *keep[] = {
        TH_TEST_BUILD, "--keep-window-blocks", "--kv-blocks", "6", "--kv-block-size", "16", NULL};
    dmn k;
    dmn_start_for(&k, model, policy("recompute"), keep, &g.sock, &g.out);
    dmn_run_client(&k, client_px_concurrent, &g, "client (every block kept, 6 blocks)");
    got = dmn_stop_output(&k); /* (the decision log is complete once it stopped) */
    cr_assert_geq(decision_count(&k, "reject", "never_fits"), 1, "rejected as never_fits");
    cr_assert(!strstr(got, "| length"), "it ran anyway: %s", got);
    dmn_cleanup(&k);
    free(got);
    free(want);
}

/* Two long sequences in a pool of 5 blocks (a decoding window holds 3):
 * one is preempted — swapped to the host with only its window's blocks, or dropped and
 * re-prefilled from position 0 — and both streams still equal the reference. */
static void two_in_a_small_pool(const char *mode)
{
    need_daemon_binary();
    char model[512];
    window_model(model, sizeof model);
    static px_conc_job g;
    prompts(&g, 2);
    char *want = reference(model, &g);

    const char *flags[] = {"--kv-blocks",      "5",  "--kv-block-size", "16",
                           "--host-kv-blocks", "32", "--verify-swaps",  NULL};
    dmn d;
    dmn_start_for(&d, model, policy(mode), flags, &g.sock, &g.out);
    dmn_run_client(&d, client_px_concurrent, &g, "client (window, small pool)");
    char *got = dmn_stop_output(&d); /* (the decision log is complete once it stopped) */
    char mode_kv[32];
    snprintf(mode_kv, sizeof mode_kv, "\"mode\":\"%s\"", mode);
    int preempts = decision_count(&d, "preempt", mode_kv);
    cr_log_info("%s: %d preemptions", mode, preempts);
    cr_assert_gt(preempts, 0, "5 blocks for two windows of 3: a preemption by %s", mode);
    if (!strcmp(mode, "swap")) {
        /* every swap-out moved the blocks held (at most the window's 4), not the table */
        const char *line = find_line2(d.declog, "\"ev\":\"swap_out\"", "\"blocks\"");
        cr_assert(line[0], "a swap_out event");
        double blocks = json_num_of(line, "blocks");
        cr_assert(blocks >= 1 && blocks <= 4, "swap_out of %g blocks: %s", blocks, line);
    }
    cr_assert_str_eq(got, want, "streams after %s preemption differ from every block kept", mode);
    dmn_cleanup(&d);
    free(got);
    free(want);
}

/* Two prompts of 80 tokens in a pool of 4 blocks: each is admitted with its first chunk's
 * blocks (2) and prefilled chunk by chunk; at 32 tokens each needs a third block before its
 * window gives one back, and the other holds it. A prefill preempted no one, so both waited
 * for ever (the client got no event); now one is preempted, and both streams equal the
 * reference. (No prefix cache: a prompt's cached chain would not fit 4 blocks.) */
Test(daemon_window, two_prompts_prefilling_into_the_whole_pool_both_finish, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 300)
{
    need_daemon_binary();
    char model[512];
    window_model(model, sizeof model);
    static px_conc_job g;
    prompts(&g, 2);
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 80; k++) g.prompt[i][k] = 3 + (31 * k + 57 * i) % 500;
        g.n_prompt[i] = 80;
    }
    g.max_new = 8;
    char *want = reference(model, &g);
    const char *flags[] = {"--kv-blocks", "4", "--kv-block-size", "16", "--no-prefix-cache", NULL};
    dmn d;
    dmn_start_for(&d, model, policy("recompute"), flags, &g.sock, &g.out);
    dmn_run_client(&d, client_px_concurrent, &g, "client (two prompts prefilling, 4 blocks)");
    char *got = dmn_stop_output(&d); /* (the decision log is complete once it stopped) */
    cr_assert_str_eq(got, want, "streams differ from every block kept");
    cr_assert_gt(decision_count(&d, "preempt", NULL), 0, "4 blocks for two prefills of 3");
    dmn_cleanup(&d);
    free(got);
    free(want);
}

Test(daemon_window, swapped_window_comes_back, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    two_in_a_small_pool("swap");
}

Test(daemon_window, recomputed_window_refills_from_the_start, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 300)
{
    two_in_a_small_pool("recompute");
}

/* The prefix cache: a windowed sequence keeps its prompt's cached blocks (the chain) while
 * its window gives back the rest, so the same prompt again finds them — 2 blocks of 16 of a
 * 40-token prompt — in a pool of 6 blocks, and both streams equal the reference. */
Test(daemon_window, prompt_chain_stays_cached, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    need_daemon_binary();
    char model[512];
    window_model(model, sizeof model);
    static px_conc_job g;
    memset(&g, 0, sizeof g);
    g.n = 1;
    for (int k = 0; k < 40; k++) g.prompt[0][k] = 3 + (23 * k) % 500;
    g.n_prompt[0] = 40;
    g.max_new = 200;
    char *want = reference(model, &g);
    cr_assert(strstr(want, "| length 200"), "reference: %s", want);

    const char *flags[] = {"--kv-blocks", "6", "--kv-block-size", "16", NULL};
    dmn d;
    dmn_start_for(&d, model, policy("recompute"), flags, &g.sock, &g.out);
    dmn_run_client(&d, client_px_concurrent, &g, "client (first)");
    char *first = slurp(g.out);
    cr_assert_not_null(first);
    dmn_run_client(&d, client_px_concurrent, &g, "client (again)");
    char *again = dmn_stop_output(&d);
    cr_assert_str_eq(first, want, "the first stream differs from every block kept");
    cr_assert_str_eq(again, want, "the stream from the cached prompt differs");
    cr_assert_eq(count_lines2(d.declog, "\"ev\":\"cache_hit\"", "\"cached_tokens\":32"), 1,
                 "the second found the prompt's 2 blocks cached");
    dmn_cleanup(&d);
    free(first);
    free(again);
    free(want);
}

/* ---- window rings: gemma's windowed and global layers ------------------------------------
 *
 * A model with windowed and global layers keeps its windowed layers' K/V in a ring per
 * running sequence (eng_options.kv_rings), its blocks the global layers' only. Each stream
 * equals the same model's with every layer in the blocks (ringlmd-test
 * --keep-window-blocks), which test_gguf_oracle holds to llama.cpp's greedy ids; the engine
 * test (test_engine_swa) holds the rings to that layout's logits bit for bit. */

/* gemma2 on synthetic stories260K (5 layers: 1 and 3 global, context 512), or gemma3 on
 * quant-gqa (16 layers: 5 and 11 global, context 256), windows of 32 */
static void mixed_model(char *path, size_t n, bool gemma3)
{
    snprintf(path, n, "%s/%s.gguf", tmpdir, gemma3 ? "g3" : "g2");
    if (gemma3)
        export_gguf_window("synthetic:quant-gqa:5", NULL, "F32", "gemma3", 32, WINDOW, path);
    else
        export_gguf_window("synthetic:stories260K:7", NULL, "F32", "gemma2", 0, WINDOW, path);
}

static char *mixed_reference(const char *model, px_conc_job *g)
{
    const char *flags[] = {
        TH_TEST_BUILD, "--keep-window-blocks", "--kv-blocks", "128", "--kv-block-size", "16", NULL};
    dmn d;
    dmn_start_for(&d, model, policy("recompute"), flags, &g->sock, &g->out);
    cr_assert_not(strstr(th_daemon_output(&d.th), "rings of"), "the reference keeps no rings: %s",
                  th_daemon_output(&d.th));
    dmn_run_client(&d, client_px_concurrent, g, "client (every layer in the blocks)");
    char *o = dmn_stop_output(&d);
    dmn_cleanup(&d);
    return o;
}

/* The daemon's streams (got) equal the reference's (want), or `what` says how they differ;
 * then the daemon's files and both outputs go. */
static void streams_equal_then_clean(dmn *d, char *got, char *want, const char *what)
{
    cr_assert_str_eq(got, want, "%s", what);
    dmn_cleanup(d);
    free(got);
    free(want);
}

/* Two tests of one body: name2 runs body(false) on the gemma2 model, name3 body(true) on
 * the gemma3 one. */
#define GEMMA2_AND_GEMMA3(body, name2, name3)                                                      \
    Test(daemon_window, name2, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)               \
    {                                                                                              \
        body(false);                                                                               \
    }                                                                                              \
    Test(daemon_window, name3, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)               \
    {                                                                                              \
        body(true);                                                                                \
    }

static void mixed_long_stream(bool gemma3)
{
    need_daemon_binary();
    char model[512];
    mixed_model(model, sizeof model, gemma3);
    static px_conc_job g;
    prompts(&g, 1);
    g.max_new = gemma3 ? 240 : 400; /* 248 or 408 positions: 8 or 13 windows */
    char *want = mixed_reference(model, &g);
    char len[32];
    snprintf(len, sizeof len, "| length %u", g.max_new);
    cr_assert(strstr(want, len), "reference: %s", want);

    const char *flags[] = {"--kv-blocks", "32", "--kv-block-size", "16", "--kv-rings", "2", NULL};
    dmn d;
    dmn_start_for(&d, model, policy("recompute"), flags, &g.sock, &g.out);
    const char *log = th_daemon_output(&d.th);
    cr_assert(strstr(log, gemma3 ? "windowed layers (14 of 16, window 32)"
                                 : "windowed layers (3 of 5, window 32)"),
              "the daemon keeps rings: %s", log);
    cr_assert(strstr(log, "in 2 rings of 4 blocks"), "rings of (32 + a chunk of 16) / 16 + 1: %s",
              log);
    dmn_run_client(&d, client_px_concurrent, &g, "client (rings)");
    char *got = dmn_stop_output(&d);
    streams_equal_then_clean(&d, got, want,
                             "greedy stream on rings differs from every layer in the blocks");
}

GEMMA2_AND_GEMMA3(mixed_long_stream, gemma2_stream_on_rings_equals_every_layer_in_blocks,
                  gemma3_stream_on_rings_equals_every_layer_in_blocks)

/* The pools ringlmd logs at start: one ring's bytes and one (global layers') block's. */
static void ring_and_block_bytes(const dmn *d, double *ring, double *block)
{
    const char *log = th_daemon_output(&d->th), *p = strstr(log, "blocks (");
    cr_assert(p, "the daemon logs its rings: %s", log);
    unsigned long long rb = 0, bb = 0;
    int nb = 0;
    cr_assert_eq(sscanf(p, "blocks (%llu bytes a ring), global layers in %d blocks of %llu bytes",
                        &rb, &nb, &bb),
                 3, "ring and block bytes in: %.200s", p);
    *ring = (double)rb;
    *block = (double)bb;
}

/* Every swap-out and swap-in the decision log records (plan and completion lines) moved its
 * device blocks and its whole ring to `pool`, nothing more: bytes = blocks × block bytes +
 * ring bytes. Returns how many swap-outs were planned. */
static int swaps_moved_blocks_and_ring(const dmn *d, const char *pool, double ring, double block)
{
    FILE *f = fopen(d->declog, "r");
    cr_assert_not_null(f, "decision log %s", d->declog);
    char *line = NULL, want_pool[48];
    size_t cap = 0;
    int outs = 0, lines = 0;
    snprintf(want_pool, sizeof want_pool, "\"pool\":\"%s\"", pool);
    while (getline(&line, &cap, f) > 0) {
        bool out = strstr(line, "\"ev\":\"swap_out\""), in = strstr(line, "\"ev\":\"swap_in\"");
        if (!out && !in) continue;
        lines++;
        if (out && !strstr(line, "\"predicted_us\"")) outs++; /* the plan's, not the done */
        double blocks = json_num_of(line, "blocks"), bytes = json_num_of(line, "bytes");
        cr_assert(strstr(line, want_pool), "swapped to the %s tier: %s", pool, line);
        cr_assert(blocks >= 1, "a swap moves blocks: %s", line);
        cr_assert_eq(bytes, blocks * block + ring,
                     "bytes = %g blocks of %g + a ring of %g (window only): %s", blocks, block,
                     ring, line);
    }
    free(line);
    fclose(f);
    cr_log_info("%d swap lines, %d swap-outs planned", lines, outs);
    return outs;
}

/* Two streams preempted under a swap policy in a pool too small for both: each swap moves
 * the sequence's global blocks and its window ring (only the ring's blocks: its last window,
 * not its length) to the host or disk tier and back into whichever ring is free, checked
 * byte for byte (--verify-swaps checksums the ring out, scrubs it, checks it back), and both
 * streams equal the reference. gemma2: 408 positions (26 blocks) each in 40 blocks, host
 * tier; gemma3: 248 (16 blocks) each in 24, disk tier. */
static void mixed_preempted_swaps(bool gemma3)
{
    need_daemon_binary();
    char model[512], disk[600];
    mixed_model(model, sizeof model, gemma3);
    static px_conc_job g;
    prompts(&g, 2);
    if (gemma3) g.max_new = 240;
    char *want = mixed_reference(model, &g);

    snprintf(disk, sizeof disk, "%s/kv.disk", tmpdir);
    const char *host[] = {"--kv-blocks",      "40", "--kv-block-size", "16",
                          "--host-kv-blocks", "64", "--verify-swaps",  NULL};
    const char *dsk[] = {"--kv-blocks",      "24",  "--kv-block-size", "16", "--disk-kv", disk,
                         "--disk-kv-blocks", "128", "--verify-swaps",  NULL};
    dmn d;
    dmn_start_for(&d, model, policy("swap"), gemma3 ? dsk : host, &g.sock, &g.out);
    double ring, block;
    ring_and_block_bytes(&d, &ring, &block);
    dmn_run_client(&d, client_px_concurrent, &g, "client (rings, swapped)");
    char *got = dmn_stop_output(&d);
    int swaps = decision_count(&d, "preempt", "\"mode\":\"swap\"");
    cr_log_info("rings: %d swap preemptions", swaps);
    cr_assert_gt(swaps, 0, "%s: a preemption by swap with rings", gemma3 ? "gemma3" : "gemma2");
    cr_assert_eq(decision_count(&d, "preempt", "\"mode\":\"recompute\""), 0, "none recomputed");
    cr_assert_eq(swaps_moved_blocks_and_ring(&d, gemma3 ? "disk" : "host", ring, block), swaps,
                 "a swap-out per swap preemption");
    streams_equal_then_clean(&d, got, want,
                             "streams after swaps on rings differ from the reference");
}

GEMMA2_AND_GEMMA3(mixed_preempted_swaps, gemma2_preempted_on_rings_swaps_ring_to_host,
                  gemma3_preempted_on_rings_swaps_ring_to_disk)

/* Two gemma2 streams of 408 positions (26 blocks each) in 40 blocks under a recompute
 * policy: one is preempted and recomputed from position 0 on a ring it takes again; both
 * streams equal the reference. */
Test(daemon_window, gemma2_preempted_on_rings_recomputes, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 300)
{
    need_daemon_binary();
    char model[512];
    mixed_model(model, sizeof model, false);
    static px_conc_job g;
    prompts(&g, 2);
    char *want = mixed_reference(model, &g);

    const char *flags[] = {"--kv-blocks", "40", "--kv-block-size", "16", NULL};
    dmn d;
    dmn_start_for(&d, model, policy("recompute"), flags, &g.sock, &g.out);
    dmn_run_client(&d, client_px_concurrent, &g, "client (rings, small pool)");
    char *got = dmn_stop_output(&d);
    int recomputes = decision_count(&d, "preempt", "\"mode\":\"recompute\"");
    cr_log_info("rings: %d recompute preemptions", recomputes);
    cr_assert_gt(recomputes, 0, "40 blocks for two sequences of 26: a preemption");
    streams_equal_then_clean(&d, got, want,
                             "streams after recompute on rings differ from the reference");
}

/* The tests of several requests on a gemma-shaped file: the daemon built, the file in
 * model (512 bytes), *job emptied for n requests. */
static void mixed_job(char *model, bool gemma3, px_conc_job *job, int n)
{
    need_daemon_binary();
    mixed_model(model, 512, gemma3);
    memset(job, 0, sizeof *job);
    job->n = n;
}

/* ---- ring snapshots: prefix-cache hits of other requests on rings ----------------------
 *
 * A first request's prompt of 70 tokens leaves a snapshot of each ring block it completes
 * (the windowed layers' K/V of its blocks); a second request, whose prompt of 80 tokens
 * goes on from those 70 (a conversation's next turn), finds its first 64 tokens cached and
 * prefills 16. Its ring is one the first request wrote to position 130, so without the
 * snapshots' copy positions 32-63 of its windowed layers would be others: both streams
 * equal the reference, the same requests on every layer in the blocks. With
 * --kv-ring-snapshot-bytes off the second finds nothing. The default budget is the rings'
 * own bytes: 2 rings of 4 blocks, 8 snapshots. */
static void mixed_snapshot_hit(bool gemma3)
{
    char model[512];
    static px_conc_job both, first, second;
    mixed_job(model, gemma3, &both, 2);
    for (int k = 0; k < 80; k++) both.prompt[0][k] = both.prompt[1][k] = 3 + (37 * k) % 250;
    both.n_prompt[0] = 70;
    both.n_prompt[1] = 80;
    both.max_new = 60;
    char *want = mixed_reference(model, &both);
    first = second = both;
    first.n = second.n = 1;
    memcpy(second.prompt[0], both.prompt[1], sizeof second.prompt[0]);
    second.n_prompt[0] = 80;

    for (int off = 0; off < 2; off++) {
        const char *on[] = {"--kv-blocks", "32",        "--kv-block-size", "16", "--kv-rings",
                            "2",           "--metrics", "127.0.0.1:0",     NULL};
        const char *no[] = {"--kv-blocks",
                            "32",
                            "--kv-block-size",
                            "16",
                            "--kv-rings",
                            "2",
                            "--kv-ring-snapshot-bytes",
                            "off",
                            "--metrics",
                            "127.0.0.1:0",
                            NULL};
        dmn d;
        dmn_start_for(&d, model, policy("recompute"), off ? no : on, &first.sock, &first.out);
        second.sock = first.sock;
        second.out = first.out;
        const char *log = th_daemon_output(&d.th);
        cr_assert(strstr(log, off ? "0 ring snapshots" : "8 ring snapshots of one ring block"),
                  "the daemon logs its snapshots: %s", log);
        /* its warm-up fits the rings: chunks of 16 rows (a ring's), one a ring */
        cr_assert(strstr(log, "warm-up: 32-token prefill (2 sequences)"), "warm-up: %s", log);
        dmn_run_client(&d, client_px_concurrent, &first, "client (first turn)");
        char *a = slurp(first.out);
        cr_assert_not_null(a);
        dmn_run_client(&d, client_px_concurrent, &second, "client (second turn)");
        /* the hit in the metrics: 64 tokens found cached, through one snapshot */
        double hit = -1, used = -1, want_hit = off ? 0 : 64, want_used = off ? 0 : 1;
        for (uint64_t deadline = th_now_ms() + 5000;;) { /* published every few ms */
            int status = 0;
            char *body = th_http_get(dmn_metrics_port(&d), "/metrics", &status, NULL, 0);
            if (body && status == 200) {
                hit = prom_value(body, "vllm:prefix_cache_hits_total");
                used = prom_value(body, "ringlm_prefix_cache_ring_snapshots_total{event=\"hit\"}");
            }
            free(body);
            if ((hit == want_hit && used == want_used) || th_now_ms() > deadline) break;
            th_pause_ms(2);
        }
        cr_assert_eq(hit, want_hit, "vllm:prefix_cache_hits_total %g", hit);
        cr_assert_eq(used, want_used, "snapshot hits %g", used);
        char *b = dmn_stop_output(&d);
        char got[2 * 4096 + 2];
        snprintf(got, sizeof got, "%s%s", a, b);
        int hits = count_lines2(d.declog, "\"ev\":\"cache_hit\"", "\"cached_tokens\":64");
        cr_log_info("%s, snapshots %s: %d hits of 64 tokens", gemma3 ? "gemma3" : "gemma2",
                    off ? "off" : "on", hits);
        cr_assert_eq(hits, off ? 0 : 1, "the second turn found 64 tokens cached: %d hits", hits);
        cr_assert_str_eq(got, want, "snapshots %s: streams differ from every layer in the blocks",
                         off ? "off" : "on");
        dmn_cleanup(&d);
        free(a);
        free(b);
    }
    free(want);
}

GEMMA2_AND_GEMMA3(mixed_snapshot_hit, gemma2_prompt_hits_cache_through_ring_snapshot,
                  gemma3_prompt_hits_cache_through_ring_snapshot)

/* The snapshots' budget is bytes (--kv-ring-snapshot-bytes): as many whole ring blocks as
 * fit, their count and bytes logged; a budget under one ring block, 0, a negative or an
 * unknown unit are refused, naming the flag. */
Test(daemon_window, ring_snapshot_budget_is_bytes, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 120)
{
    need_daemon_binary();
    char model[512];
    mixed_model(model, sizeof model, false);
    const char *flags[] = {"--kv-blocks", "32", "--kv-block-size",          "16",
                           "--kv-rings",  "2",  "--kv-ring-snapshot-bytes", "64K",
                           NULL};
    dmn d;
    const char *sock, *out;
    dmn_start_for(&d, model, policy("recompute"), flags, &sock, &out);
    const char *log = th_daemon_output(&d.th);
    const char *at = strstr(log, "rings of ");
    int R = 0;
    size_t ring_bytes = 0;
    cr_assert(at && sscanf(at, "rings of %d blocks (%zu bytes a ring)", &R, &ring_bytes) == 2 &&
                  R > 0,
              "the rings logged: %s", log);
    const size_t rbb = ring_bytes / (size_t)R, n = 65536 / rbb;
    char want[128];
    snprintf(want, sizeof want, "%zu ring snapshots of one ring block (%zu bytes", n, n * rbb);
    cr_log_info("64K: %s", want);
    cr_assert(n > 0 && strstr(log, want), "64 KiB is %zu ring blocks of %zu bytes: %s", n, rbb,
              log);
    cr_assert_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);

    char *ringlmd = th_program("ringlmd"), sockp[300], one[32];
    snprintf(sockp, sizeof sockp, "%s/refused.sock", tmpdir);
    snprintf(one, sizeof one, "%zu", rbb - 1);
    static const char *const says[] = {"less than one ring block", "expected a size",
                                       "expected a size", "expected a size"};
    const char *bad[] = {one, "0", "-5", "12Q"};
    for (int i = 0; i < 4; i++) {
        char *argv[] = {ringlmd,        "--model",     model, "--socket",
                        sockp,          "--kv-blocks", "32",  "--kv-block-size",
                        "16",           "--kv-rings",  "2",   "--kv-ring-snapshot-bytes",
                        (char *)bad[i], NULL};
        char *o = NULL, *e = NULL;
        int st = th_run(argv, &o, &e, 60);
        cr_assert(st != 0, "--kv-ring-snapshot-bytes %s: exit 0", bad[i]);
        cr_assert(strstr(e, "--kv-ring-snapshot-bytes") && strstr(e, says[i]),
                  "--kv-ring-snapshot-bytes %s: says \"%s\", not \"%s\"", bad[i], e, says[i]);
        free(o);
        free(e);
    }
    free(ringlmd);
}

/* A system prompt of 40 tokens shared by three requests with different messages of 30, one
 * after another, prefill chunks of 24 (rings of 5 blocks; block boundaries fall inside the
 * chunks): the first leaves the snapshots of its blocks; the second finds the shared 32
 * tokens' blocks cached and the window before them (blocks 0 and 1) in the first one's
 * snapshots, and so does the third. The three streams equal the reference's. */
Test(daemon_window, gemma2_shared_system_prompt_hits_from_the_second_request, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 300)
{
    char model[512];
    static px_conc_job all, one;
    mixed_job(model, false, &all, 3);
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 70; k++)
            all.prompt[i][k] = 3 + (k < 40 ? 37 * k : 41 * k + 59 * i) % 250;
        all.n_prompt[i] = 70;
    }
    all.max_new = 40;
    char *want = mixed_reference(model, &all);
    static const char *const chunked =
        "[scheduler]\nmode = token_budget\ntoken_budget = 64\nmax_active_seqs = 8\n"
        "prefill_chunk = 24\npreemption = recompute\nmin_residency = 0us\nmax_preemptions = 0\n";
    const char *flags[] = {"--kv-blocks", "32", "--kv-block-size", "16", "--kv-rings", "2", NULL};
    dmn d;
    dmn_start_for(&d, model, chunked, flags, &all.sock, &all.out);
    const char *log = th_daemon_output(&d.th);
    cr_assert(strstr(log, "in 2 rings of 5 blocks"), "rings of (32 + 24) / 16 + 1: %s", log);
    char got[3 * 4096 + 3] = "";
    for (int i = 0; i < 3; i++) {
        one = all;
        one.n = 1;
        memcpy(one.prompt[0], all.prompt[i], sizeof one.prompt[0]);
        one.n_prompt[0] = 70;
        dmn_run_client(&d, client_px_concurrent, &one, "client (one request)");
        char *o = slurp(one.out);
        cr_assert_not_null(o);
        strncat(got, o, sizeof got - strlen(got) - 1);
        free(o);
    }
    char *last = dmn_stop_output(&d);
    free(last);
    int hits = count_lines2(d.declog, "\"ev\":\"cache_hit\"", "\"cached_tokens\":32");
    cr_assert_eq(hits, 2, "the second and third found the system prompt's 32 tokens: %d hits",
                 hits);
    cr_assert_eq(count_lines(d.declog, "\"ev\":\"cache_hit\""), 2, "and no other hit");
    streams_equal_then_clean(
        &d, strdup(got), want,
        "streams through a shared prompt's snapshot differ from the reference");
}

/* The first turn's answer as prompt ids: the tokens of the first line of out (a
 * client_px_concurrent line: ids, then "| reason n"). Returns how many. */
static uint32_t answer_ids(const char *out, int32_t *ids, uint32_t cap)
{
    uint32_t n = 0;
    const char *p = out;
    char *end;
    while (n < cap && *p && *p != '|' && *p != '\n') {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
    }
    return n;
}

/* A conversation's next turn past the answer: a first turn of 20 tokens answered with 40
 * (59 positions computed) leaves snapshots of its answer's blocks too, up to 48; the next
 * turn — those 20, the 40 answered, 10 new — finds 48 tokens cached (past the first
 * prompt's own blocks) and prefills 22. Both turns equal every layer in the blocks (the reference runs the
 * same two turns, its first answer the same). */
static void mixed_answer_snapshot(bool gemma3)
{
    char model[512];
    static px_conc_job t1, t2;
    mixed_job(model, gemma3, &t1, 1);
    for (int k = 0; k < 20; k++) t1.prompt[0][k] = 3 + (43 * k) % 250;
    t1.n_prompt[0] = 20;
    t1.max_new = 40;
    t2 = t1;
    char *turns[2][2]; /* [reference, rings][turn] */
    for (int rings = 0; rings < 2; rings++) {
        const char *ref[] = {TH_TEST_BUILD, "--keep-window-blocks", "--kv-blocks",
                             "128",         "--kv-block-size",      "16",
                             NULL};
        const char *on[] = {"--kv-blocks", "32", "--kv-block-size", "16", "--kv-rings", "2", NULL};
        dmn d;
        dmn_start_for(&d, model, policy("recompute"), rings ? on : ref, &t1.sock, &t1.out);
        dmn_run_client(&d, client_px_concurrent, &t1, "client (first turn)");
        turns[rings][0] = slurp(t1.out);
        cr_assert_not_null(turns[rings][0]);
        uint32_t n = answer_ids(turns[rings][0], t2.prompt[0] + 20, 40);
        cr_assert_eq(n, 40, "the first turn answered 40 tokens: %s", turns[rings][0]);
        for (int k = 60; k < 70; k++) t2.prompt[0][k] = 3 + (47 * k) % 250;
        t2.n_prompt[0] = 70;
        t2.sock = t1.sock;
        t2.out = t1.out;
        dmn_run_client(&d, client_px_concurrent, &t2, "client (next turn)");
        turns[rings][1] = dmn_stop_output(&d);
        if (rings) {
            int hits = count_lines2(d.declog, "\"ev\":\"cache_hit\"", "\"cached_tokens\":48");
            cr_log_info("%s: %d hits of 48 tokens", gemma3 ? "gemma3" : "gemma2", hits);
            cr_assert_eq(hits, 1, "the next turn found 48 tokens cached: %d hits", hits);
        }
        dmn_cleanup(&d);
    }
    for (int t = 0; t < 2; t++) {
        cr_assert_str_eq(turns[1][t], turns[0][t], "turn %d on rings differs from the reference",
                         t + 1);
        free(turns[0][t]);
        free(turns[1][t]);
    }
}

GEMMA2_AND_GEMMA3(mixed_answer_snapshot, gemma2_next_turn_hits_past_the_answer,
                  gemma3_next_turn_hits_past_the_answer)
