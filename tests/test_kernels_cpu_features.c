/* SPDX-License-Identifier: MIT */
/*
 * AMX and AVX512-FP16 (kernels/cpu/cpu_features.h): each state reached from what a CPU and a
 * kernel answer — a stand-in CPU and kernel for the ones this machine is not, counting what
 * was read and asked, so that tile data is never requested where CPUID or XCR0 say no tiles,
 * nor XCR0 read where the instruction would fault — then this machine's own answer against
 * Linux's (/proc/cpuinfo lists amx_tile, amx_bf16, amx_int8 and avx512_fp16 only where the
 * CPU reports them and the OS enables their state), and the engine's start report (engine
 * and ringlmd) naming them with the path that runs instead.
 */
#include "helpers.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/engine.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a stand-in CPU and kernel --------------------------------------------------------- */

#define OSXSAVE     (1u << 27)
#define AMX_BF16    (1u << 22)
#define AVX512_FP16 (1u << 23)
#define AMX_TILE    (1u << 24)
#define AMX_INT8    (1u << 25)
#define SPR_EDX     (AMX_BF16 | AVX512_FP16 | AMX_TILE | AMX_INT8)
/* XCR0 of the Zen 4 VM (x87, SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM), and with tile state */
#define XCR0_ZEN4   0xe7ull
#define XCR0_SPR    (XCR0_ZEN4 | 1ull << 17 | 1ull << 18)

static struct {
    uint32_t max_leaf, leaf1_ecx, leaf7_edx;
    uint64_t xcr0;
    int request_err;     /* what ARCH_REQ_XCOMP_PERM returns */
    int permitted_err;   /* what ARCH_GET_XCOMP_PERM returns */
    uint64_t permitted;  /* and the features it shows */
    int beyond_max_leaf; /* leaves read above max_leaf */
    int xcr0_reads, requests, permitted_reads;
} fake;

static void fake_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t regs[4])
{
    (void)subleaf;
    memset(regs, 0, 4 * sizeof *regs);
    if (leaf > fake.max_leaf) fake.beyond_max_leaf++;
    if (leaf == 0) regs[0] = fake.max_leaf;
    /* bits set beside the ones read, as on a real CPU */
    if (leaf == 1) regs[2] = fake.leaf1_ecx | (0x7ffa3203u & ~OSXSAVE);
    if (leaf == 7) regs[3] = fake.leaf7_edx | 0x00000010u;
}
static uint64_t fake_xcr0(void)
{
    fake.xcr0_reads++;
    return fake.xcr0;
}
static int fake_request(void)
{
    fake.requests++;
    return fake.request_err;
}
static int fake_permitted(uint64_t *xfeatures)
{
    fake.permitted_reads++;
    *xfeatures = fake.permitted;
    return fake.permitted_err;
}
static const cpufeat_sys fake_sys = {fake_cpuid, fake_xcr0, fake_request, fake_permitted};

static void fake_cpu(uint32_t leaf7_edx, bool osxsave, uint64_t xcr0)
{
    memset(&fake, 0, sizeof fake);
    fake.max_leaf = 0x10;
    fake.leaf1_ecx = osxsave ? OSXSAVE : 0;
    fake.leaf7_edx = leaf7_edx;
    fake.xcr0 = xcr0;
    fake.permitted = xcr0;
}

static void assert_reason(const cpufeat_report *r, cpufeat_id f, const char *want)
{
    char got[160];
    cpufeat_reason(r, f, got, sizeof got);
    cr_assert_str_eq(got, want, "%s: \"%s\", expected \"%s\"", cpufeat_name(f), got, want);
}

static void assert_all(const cpufeat_report *r, cpufeat_state s)
{
    for (int f = 0; f < CPUFEAT_COUNT; f++)
        cr_assert_eq(r->state[f], s, "%s: state %d, expected %d", cpufeat_name(f), r->state[f], s);
}

/* ---- the states ------------------------------------------------------------------------ */

Test(kernels_cpu_features, a_cpu_without_them_is_never_asked_for_tiles)
{
    fake_cpu(0, true, XCR0_ZEN4); /* Zen 4 */
    cpufeat_report r;
    cpufeat_probe(&fake_sys, &r);
    assert_all(&r, CPUFEAT_ABSENT);
    cr_assert_eq(fake.requests + fake.permitted_reads, 0, "tile data asked for, no tiles");
    cr_assert_not(r.tiles_asked);
    for (int f = 0; f < CPUFEAT_COUNT; f++) assert_reason(&r, f, "not reported by this CPU");
    char line[512];
    cpufeat_describe(&r, "BF16 tiles in X", "F16 weights converted by Y", line, sizeof line);
    cr_assert_str_eq(line, "AMX: not reported by this CPU (instead: BF16 tiles in X); "
                           "AVX512-FP16: not reported by this CPU (instead: F16 weights "
                           "converted by Y)");
}

Test(kernels_cpu_features, a_cpu_without_leaf_7_has_none_of_them)
{
    fake_cpu(SPR_EDX, true, XCR0_SPR);
    fake.max_leaf = 6;
    cpufeat_report r;
    cpufeat_probe(&fake_sys, &r);
    assert_all(&r, CPUFEAT_ABSENT);
    cr_assert_eq(fake.beyond_max_leaf, 0, "a leaf above the highest one was read");
    cr_assert_eq(fake.xcr0_reads + fake.requests, 0);
}

Test(kernels_cpu_features, amx_products_without_tiles_are_not_reported)
{
    fake_cpu(AMX_BF16 | AMX_INT8, true, XCR0_SPR);
    cpufeat_report r;
    cpufeat_probe(&fake_sys, &r);
    assert_all(&r, CPUFEAT_ABSENT);
    cr_assert_eq(fake.requests, 0);
}

/* xgetbv faults where the OS has not enabled XSAVE (CPUID.1:ECX.OSXSAVE clear) */
Test(kernels_cpu_features, xcr0_is_not_read_where_the_os_has_no_xsave)
{
    fake_cpu(SPR_EDX, false, XCR0_SPR);
    cpufeat_report r;
    cpufeat_probe(&fake_sys, &r);
    cr_assert_eq(fake.xcr0_reads, 0, "xgetbv executed without OSXSAVE");
    cr_assert_eq(fake.requests, 0);
    assert_all(&r, CPUFEAT_NO_OS);
    assert_reason(&r, CPUFEAT_AMX_TILE, "reported, the OS does not enable its state (XCR0)");
    assert_reason(&r, CPUFEAT_AVX512_FP16, "reported, the OS does not enable its state (XCR0)");
}

Test(kernels_cpu_features, tiles_the_os_does_not_save_are_not_asked_for)
{
    /* neither tile state, then the configuration without the data */
    const uint64_t xcr0[] = {XCR0_ZEN4, XCR0_ZEN4 | 1ull << 17};
    for (int i = 0; i < 2; i++) {
        fake_cpu(SPR_EDX, true, xcr0[i]);
        cpufeat_report r;
        cpufeat_probe(&fake_sys, &r);
        cr_assert_eq(fake.requests, 0, "XCR0 %#llx: tile data asked for",
                     (unsigned long long)xcr0[i]);
        cr_assert_not(r.tiles_asked);
        cr_assert_eq(r.state[CPUFEAT_AMX_TILE], CPUFEAT_NO_OS);
        cr_assert_eq(r.state[CPUFEAT_AMX_BF16], CPUFEAT_NO_OS);
        cr_assert_eq(r.state[CPUFEAT_AMX_INT8], CPUFEAT_NO_OS);
        cr_assert_eq(r.state[CPUFEAT_AVX512_FP16], CPUFEAT_GRANTED, "its state is in XCR0");
    }
}

Test(kernels_cpu_features, avx512_fp16_needs_every_avx512_state)
{
    fake_cpu(AVX512_FP16, true, XCR0_ZEN4 & ~(1ull << 7)); /* no Hi16_ZMM */
    cpufeat_report r;
    cpufeat_probe(&fake_sys, &r);
    cr_assert_eq(r.state[CPUFEAT_AVX512_FP16], CPUFEAT_NO_OS);
    cr_assert_eq(r.state[CPUFEAT_AMX_TILE], CPUFEAT_ABSENT);
    cr_assert_eq(fake.requests, 0);
}

Test(kernels_cpu_features, a_refused_request_says_why)
{
    fake_cpu(SPR_EDX, true, XCR0_SPR);
    fake.request_err = -EPERM;
    cpufeat_report r;
    cpufeat_probe(&fake_sys, &r);
    cr_assert_eq(fake.requests, 1);
    cr_assert(r.tiles_asked);
    cr_assert_eq(r.state[CPUFEAT_AMX_TILE], CPUFEAT_REFUSED);
    cr_assert_eq(r.state[CPUFEAT_AMX_BF16], CPUFEAT_REFUSED);
    cr_assert_eq(r.state[CPUFEAT_AMX_INT8], CPUFEAT_REFUSED);
    cr_assert_eq(r.state[CPUFEAT_AVX512_FP16], CPUFEAT_GRANTED);
    assert_reason(&r, CPUFEAT_AMX_TILE, "the kernel refused tile data: Operation not permitted");
    char line[512];
    cpufeat_describe(&r, "A", "F", line, sizeof line);
    cr_assert_str_eq(line, "AMX (tiles, BF16, INT8): the kernel refused tile data: Operation not "
                           "permitted (instead: A); AVX512-FP16: usable, but this build has no "
                           "AVX512-FP16 kernel (instead: F)");
}

Test(kernels_cpu_features, a_request_the_kernel_does_not_confirm_is_a_refusal)
{
    fake_cpu(AMX_TILE | AMX_INT8, true, XCR0_SPR);
    fake.permitted = XCR0_ZEN4 | 1ull << 17; /* the request returned 0, no tile data */
    cpufeat_report r;
    cpufeat_probe(&fake_sys, &r);
    cr_assert_eq(fake.permitted_reads, 1);
    cr_assert_eq(r.state[CPUFEAT_AMX_TILE], CPUFEAT_REFUSED);
    cr_assert_eq(r.state[CPUFEAT_AMX_BF16], CPUFEAT_ABSENT, "not reported");
    assert_reason(&r, CPUFEAT_AMX_TILE,
                  "the kernel refused tile data: not in ARCH_GET_XCOMP_PERM after the request");

    fake_cpu(AMX_TILE, true, XCR0_SPR);
    fake.permitted_err = -EINVAL;
    cpufeat_probe(&fake_sys, &r);
    assert_reason(&r, CPUFEAT_AMX_TILE,
                  "the kernel refused tile data: ARCH_GET_XCOMP_PERM: Invalid argument");
}

Test(kernels_cpu_features, a_grant_says_that_another_path_runs)
{
    fake_cpu(SPR_EDX, true, XCR0_SPR);
    cpufeat_report r;
    cpufeat_probe(&fake_sys, &r);
    cr_assert_eq(fake.requests, 1);
    assert_all(&r, CPUFEAT_GRANTED);
    assert_reason(&r, CPUFEAT_AMX_TILE, "granted");
    assert_reason(&r, CPUFEAT_AVX512_FP16, "usable");
    char line[512];
    cpufeat_describe(&r, "A", "F", line, sizeof line);
    cr_assert_str_eq(line, "AMX (tiles, BF16, INT8): granted, but this build has no AMX kernel "
                           "(instead: A); AVX512-FP16: usable, but this build has no "
                           "AVX512-FP16 kernel (instead: F)");
    cpufeat_describe(&r, "A", "F", line, 20);
    cr_assert_eq(strlen(line), 19, "cut at its buffer: \"%s\"", line);
}

/* ---- this machine ---------------------------------------------------------------------- */

/* /proc/cpuinfo's first "flags" line, with a space either side; false where there is none
 * (off x86). */
static bool cpuinfo_flags(char *buf, size_t cap)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char *line = NULL;
    size_t n = 0;
    bool found = false;
    while (!found && getline(&line, &n, f) > 0)
        if (strncmp(line, "flags", 5) == 0 && strchr(line, ':')) {
            snprintf(buf, cap, " %s", strchr(line, ':') + 1);
            buf[strcspn(buf, "\n")] = ' ';
            found = true;
        }
    free(line);
    fclose(f);
    return found;
}

static bool has_flag(const char *flags, const char *name)
{
    char word[32];
    snprintf(word, sizeof word, " %s ", name);
    return strstr(flags, word) != NULL;
}

Test(kernels_cpu_features, this_cpu_agrees_with_linux)
{
    const cpufeat_report *r = cpufeat_get();
    char flags[8192];
    if (!cpuinfo_flags(flags, sizeof flags)) {
        assert_all(r, CPUFEAT_ABSENT);
        cr_skip_test("no flags in /proc/cpuinfo (not x86): every feature absent");
    }
    static const struct {
        cpufeat_id f;
        const char *flag;
    } pairs[] = {{CPUFEAT_AMX_TILE, "amx_tile"},
                 {CPUFEAT_AMX_BF16, "amx_bf16"},
                 {CPUFEAT_AMX_INT8, "amx_int8"},
                 {CPUFEAT_AVX512_FP16, "avx512_fp16"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const cpufeat_state s = r->state[pairs[i].f];
        /* Linux lists a feature where CPUID reports it and XCR0 has its state; AMX may then
         * still be refused to this process */
        const bool usable = pairs[i].f == CPUFEAT_AVX512_FP16
                                ? s == CPUFEAT_GRANTED
                                : s == CPUFEAT_GRANTED || s == CPUFEAT_REFUSED;
        cr_assert_eq(usable, has_flag(flags, pairs[i].flag), "%s: state %d, /proc/cpuinfo %s %s",
                     cpufeat_name(pairs[i].f), s,
                     has_flag(flags, pairs[i].flag) ? "lists" : "does not list", pairs[i].flag);
    }
    cr_assert_eq(r->tiles_asked, has_flag(flags, "amx_tile"),
                 "tile data %s asked for, /proc/cpuinfo %s amx_tile",
                 r->tiles_asked ? "was" : "was not",
                 has_flag(flags, "amx_tile") ? "lists" : "lacks");
    cr_assert_eq(cpufeat_get(), r, "one report per process");
}

/* "AMX…: <reason>" and "AVX512-FP16: <reason>" as this machine's report words them */
static void expected_words(char *amx, char *fp16, size_t cap)
{
    const cpufeat_report *r = cpufeat_get();
    char why[160];
    cpufeat_reason(r, CPUFEAT_AMX_TILE, why, sizeof why);
    if (r->state[CPUFEAT_AMX_TILE] == CPUFEAT_ABSENT)
        snprintf(amx, cap, "AMX: %s", why);
    else
        snprintf(amx, cap, "AMX (tiles%s%s): %s",
                 r->state[CPUFEAT_AMX_BF16] != CPUFEAT_ABSENT ? ", BF16" : "",
                 r->state[CPUFEAT_AMX_INT8] != CPUFEAT_ABSENT ? ", INT8" : "", why);
    cpufeat_reason(r, CPUFEAT_AVX512_FP16, why, sizeof why);
    snprintf(fp16, cap, "AVX512-FP16: %s", why);
}

static void assert_report_names_them(const char *report)
{
    char amx[200], fp16[200];
    expected_words(amx, fp16, sizeof amx);
    cr_assert(strstr(report, amx), "no \"%s\" in the report: %s", amx, report);
    cr_assert(strstr(report, fp16), "no \"%s\" in the report: %s", fp16, report);
    /* what runs instead, this build having no kernel for either */
    const char *instead = strstr(report, "(instead: ");
    cr_assert(instead && strstr(instead + 1, "(instead: F16 weights converted by "),
              "the report names no path run instead: %s", report);
    const cpufeat_report *r = cpufeat_get();
    if (r->state[CPUFEAT_AMX_TILE] == CPUFEAT_GRANTED)
        cr_assert(strstr(report, "but this build has no AMX kernel"), "%s", report);
    if (r->state[CPUFEAT_AVX512_FP16] == CPUFEAT_GRANTED)
        cr_assert(strstr(report, "but this build has no AVX512-FP16 kernel"), "%s", report);
}

Test(kernels_cpu_features, an_engine_starts_and_its_report_names_them)
{
    eng_model *m = NULL;
    cr_assert_eq(eng_model_load("synthetic:stories260K:1", &m), 0, "%s", eng_errmsg());
    eng_options o = {.backend = "cpu",
                     .n_threads = 1,
                     .numa_node = -1,
                     .kv_blocks = 8,
                     .kv_block_size = 16,
                     .max_batch_tokens = 64,
                     .max_seqs = 4};
    eng *e = NULL;
    cr_assert_eq(eng_create(m, &o, &e), 0, "eng_create: %s", eng_errmsg());
    char report[1024];
    eng_describe_paths(e, report, sizeof report);
    assert_report_names_them(report);
    eng_destroy(e);
    eng_model_free(m);
}

Test(kernels_cpu_features, ringlmd_says_it_at_start)
{
    th_daemon d;
    th_daemon_init(&d);
    const char *args[] = {"--model", "synthetic:stories260K:1", NULL};
    th_daemon_start(&d, args, 20000);
    const char *log = th_daemon_output(&d);
    const char *line = strstr(log, "OpenBLAS core"); /* the paths line */
    cr_assert_not_null(line, "ringlmd's start report has no paths line:\n%s", log);
    char report[1024];
    snprintf(report, sizeof report, "%.*s", (int)strcspn(line, "\n"), line);
    assert_report_names_them(report);
    cr_assert_eq(th_daemon_stop(&d, SIGTERM, 10000), 0, "ringlmd did not stop cleanly:\n%s", log);
    th_daemon_cleanup(&d);
}
