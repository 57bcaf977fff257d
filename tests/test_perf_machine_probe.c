/* SPDX-License-Identifier: MIT */
/*
 * perf/machine_probe's read bandwidth as perf/llama_compare.sh reads it: --read --json has
 * the simple figure of older results and the fastest of 12 layouts, named, with its median,
 * lowest and highest, and that layout is the one whose median is the highest of the layouts
 * it lists (every combination of 1/4/8 streams, prefetch or none, contiguous or interleaved
 * shares); the full probe's JSON carries the same members beside the others; the text
 * names every layout; and llama_compare.sh --help prints its whole header, the probes
 * around each decode block included. No figure is asserted beyond being positive: the
 * machine's bandwidth is what it is.
 */
#include "tests/helpers.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *probe_path(void)
{
    char *p = th_path(th_bin_dir(), "../perf/machine_probe");
    if (!th_exists(p)) cr_skip_test("%s not built", p);
    return p;
}

/* {"median", "lowest", "highest"}, all positive, in order */
static void expect_spread(json_t *s, const char *what)
{
    const double med = json_number_value(json_object_get(s, "median")),
                 lo = json_number_value(json_object_get(s, "lowest")),
                 hi = json_number_value(json_object_get(s, "highest"));
    cr_expect(lo > 0 && lo <= med && med <= hi, "%s: median %g, lowest %g, highest %g", what, med,
              lo, hi);
}

/* The read members of one probe's JSON (--read or the full probe). */
static void expect_read_members(json_t *r, const char *out)
{
    cr_expect_eq(json_integer_value(json_object_get(r, "read_mib")), 64, "%s", out);
    cr_expect_str_eq(json_string_value(json_object_get(r, "read_pages")), "2MiB");
    const double huge = json_number_value(json_object_get(r, "read_huge_page_share"));
    cr_expect(huge == -1 || (huge >= 0 && huge <= 1), "read_huge_page_share %g", huge);
    expect_spread(json_object_get(r, "read_gb_s"), "read_gb_s (the simple reader)");

    json_t *best = json_object_get(r, "read_best");
    cr_assert(json_is_object(best), "no read_best: %s", out);
    const char *name = json_string_value(json_object_get(best, "layout"));
    cr_assert(name && *name, "read_best names no layout: %s", out);
    expect_spread(json_object_get(best, "gb_s"), "read_best.gb_s");
    const char *isa = json_string_value(json_object_get(best, "isa"));
    cr_assert(isa, "%s", out);
    const char *features = json_string_value(json_object_get(r, "cpu_features"));
    if (features && strstr(features, "avx512f"))
        cr_expect_str_eq(isa, "avx512", "a CPU with AVX-512 reads with it");

    /* every combination once; the best is the one with the highest median, and says so in
     * its fields as in its name */
    json_t *layouts = json_object_get(r, "read_layouts");
    cr_assert_eq(json_array_size(layouts), 12, "%s", out);
    int seen[3][2][2] = {{{0}}};
    double top = 0;
    json_t *named = NULL;
    for (size_t i = 0; i < json_array_size(layouts); i++) {
        json_t *l = json_array_get(layouts, i);
        const json_int_t streams = json_integer_value(json_object_get(l, "streams")),
                         pf = json_integer_value(json_object_get(l, "prefetch_bytes"));
        const char *share = json_string_value(json_object_get(l, "share"));
        cr_assert(share, "%s", out);
        const int si = streams == 1 ? 0 : streams == 4 ? 1 : streams == 8 ? 2 : -1;
        const int ii = !strcmp(share, "interleaved") ? 1 : !strcmp(share, "contiguous") ? 0 : -1;
        cr_assert(si >= 0 && ii >= 0 && pf >= 0, "layout %zu: %lld streams, %s", i,
                  (long long)streams, share);
        seen[si][pf > 0][ii]++;
        char what[160];
        snprintf(what, sizeof what, "layout %s", json_string_value(json_object_get(l, "layout")));
        expect_spread(json_object_get(l, "gb_s"), what);
        const double med = json_number_value(json_object_get(json_object_get(l, "gb_s"), "median"));
        top = med > top ? med : top;
        if (!strcmp(json_string_value(json_object_get(l, "layout")), name)) named = l;
    }
    for (int s = 0; s < 3; s++)
        for (int p = 0; p < 2; p++)
            for (int i = 0; i < 2; i++)
                cr_expect_eq(seen[s][p][i], 1, "streams #%d, prefetch %d, interleaved %d: %d", s, p,
                             i, seen[s][p][i]);
    cr_assert_not_null(named, "read_best's layout \"%s\" is not among read_layouts", name);
    cr_expect_eq(json_number_value(json_object_get(json_object_get(best, "gb_s"), "median")), top,
                 "read_best is not the fastest layout: %s", out);
    cr_expect_eq(json_integer_value(json_object_get(best, "streams")),
                 json_integer_value(json_object_get(named, "streams")));
    cr_expect_eq(json_integer_value(json_object_get(best, "prefetch_bytes")),
                 json_integer_value(json_object_get(named, "prefetch_bytes")));
    cr_expect_str_eq(json_string_value(json_object_get(best, "share")),
                     json_string_value(json_object_get(named, "share")));
}

Test(perf_machine_probe, read_json_names_the_fastest_layout, .timeout = 180)
{
    char *probe = probe_path(), *out = NULL, *err = NULL;
    char *const args[] = {probe,       "--read", "--json", "--threads", "2",
                          "--repeats", "2",      "--mib",  "64",        NULL};
    cr_assert_eq(th_run(args, &out, &err, 150), 0, "machine_probe --read: %s", err);
    json_error_t je;
    json_t *r = json_loads(out, 0, &je);
    cr_assert_not_null(r, "machine_probe --read --json: %s\n%s", je.text, out);
    cr_expect_eq(json_integer_value(json_object_get(r, "threads")), 2);
    cr_expect_eq(json_integer_value(json_object_get(r, "repeats")), 2);
    expect_read_members(r, out);
    /* --read measures nothing else */
    cr_expect_null(json_object_get(r, "fma_f32_gflop_s"), "%s", out);
    json_decref(r);
    free(out);
    free(err);
    free(probe);
}

Test(perf_machine_probe, the_full_probe_carries_the_read_members, .timeout = 240)
{
    char *probe = probe_path(), *out = NULL, *err = NULL;
    char *const args[] = {probe, "--json", "--threads", "2", "--repeats", "1", "--mib", "64", NULL};
    cr_assert_eq(th_run(args, &out, &err, 200), 0, "machine_probe: %s", err);
    json_error_t je;
    json_t *r = json_loads(out, 0, &je);
    cr_assert_not_null(r, "machine_probe --json: %s\n%s", je.text, out);
    expect_read_members(r, out);
    expect_spread(json_object_get(r, "fma_f32_gflop_s"), "fma_f32_gflop_s");
    expect_spread(json_object_get(r, "sgemm_1024_gflop_s"), "sgemm_1024_gflop_s");
    cr_expect(json_is_object(json_object_get(r, "mul_probe")), "%s", out);
    json_decref(r);
    free(out);
    free(err);
    free(probe);
}

Test(perf_machine_probe, the_text_names_every_layout_and_the_simple_figure, .timeout = 180)
{
    char *probe = probe_path(), *out = NULL, *err = NULL;
    char *const args[] = {probe, "--read", "--repeats", "1", "--mib", "64", NULL};
    cr_assert_eq(th_run(args, &out, &err, 150), 0, "machine_probe --read: %s", err);
    cr_expect(strstr(out, "the best of 12 layouts") != NULL, "%s", out);
    cr_expect(strstr(out, "read bandwidth, simple") != NULL, "%s", out);
    static const char *const names[] = {
        "1 stream, contiguous, no prefetch",
        "8 streams, contiguous, prefetch 256 B",
        "4 streams, interleaved 2 MiB, no prefetch",
        "8 streams, interleaved 2 MiB, prefetch 256 B",
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        cr_expect(strstr(out, names[i]) != NULL, "no \"%s\" in:\n%s", names[i], out);
    free(out);
    free(err);
    free(probe);
}

Test(perf_machine_probe, refuses_mul_with_read_and_a_buffer_below_64_mib, .timeout = 60)
{
    char *probe = probe_path(), *out = NULL, *err = NULL;
    char *const both[] = {probe, "--mul", "--read", NULL};
    cr_expect_eq(th_run(both, &out, &err, 30), 2, "--mul --read: %s", out);
    free(out);
    free(err);
    char *const small[] = {probe, "--read", "--mib", "32", NULL};
    cr_expect_eq(th_run(small, &out, &err, 30), 2, "--mib 32: %s", out);
    free(out);
    free(err);
    free(probe);
}

Test(perf_machine_probe, llama_compare_help_prints_the_whole_header, .timeout = 60)
{
    const char *script = "perf/llama_compare.sh";
    if (!th_exists(script)) cr_skip_test("%s not found (run from the repository root)", script);
    char *out = NULL, *err = NULL;
    char *const args[] = {"bash", (char *)script, "--help", NULL};
    cr_expect_eq(th_run(args, &out, &err, 30), 2, "%s", err);
    /* the first line, the block probes and the share's rule, and the last lines */
    cr_expect(strstr(err, "llama_compare.sh — ringlm's engine against llama.cpp") != NULL, "%s",
              err);
    cr_expect(strstr(err, "machine_probe --read runs just before and just after each") != NULL,
              "%s", err);
    cr_expect(strstr(err, "higher of its block's two probes") != NULL, "%s", err);
    cr_expect(strstr(err, "and this tree built (make).") != NULL, "%s", err);
    cr_expect(strstr(err, "set -eu") == NULL, "the header ends before the code: %s", err);
    free(out);
    free(err);
}
