/* SPDX-License-Identifier: MIT */
/*
 * OpenBLAS's kernels for this CPU (kernels/cpu/blas_core.h): which core names rank where,
 * which core replaces a lesser one, and ringlmd itself started on a lesser core (named by
 * OPENBLAS_CORETYPE, as OpenBLAS's own fallback on an unknown CPU would leave it) re-executing
 * with this CPU's kernels and saying so at start, or keeping them with RINGLM_BLAS_CORE=keep.
 */
#include "helpers.h"
#include "kernels/cpu/blas_core.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(kernels_blas_core, core_names_rank_by_instruction_level)
{
    cr_assert_eq(blas_core_level("Prescott"), BLAS_LEVEL_OLD);
    cr_assert_eq(blas_core_level("Sandybridge"), BLAS_LEVEL_OLD);
    cr_assert_eq(blas_core_level("Unknown"), BLAS_LEVEL_OLD);
    cr_assert_eq(blas_core_level(NULL), BLAS_LEVEL_OLD);
    cr_assert_eq(blas_core_level("Haswell"), BLAS_LEVEL_AVX2);
    cr_assert_eq(blas_core_level("zen"), BLAS_LEVEL_AVX2, "names compare in any case");
    cr_assert_eq(blas_core_level("SkylakeX"), BLAS_LEVEL_AVX512);
    cr_assert_eq(blas_core_level("COOPERLAKE"), BLAS_LEVEL_AVX512);
    cr_assert_eq(blas_core_level("SapphireRapids"), BLAS_LEVEL_AVX512);
}

Test(kernels_blas_core, a_lesser_core_is_replaced_by_the_cpus_level_and_no_other)
{
    /* the case seen on an AVX-512 Xeon VM: OpenBLAS 0.3.21 fell back to Prescott */
    cr_assert_str_eq(blas_core_wanted("Prescott", BLAS_LEVEL_AVX512), "SkylakeX");
    cr_assert_str_eq(blas_core_wanted("Haswell", BLAS_LEVEL_AVX512), "SkylakeX");
    cr_assert_str_eq(blas_core_wanted("Prescott", BLAS_LEVEL_AVX2), "Haswell");
    cr_assert_str_eq(blas_core_wanted("Sandybridge", BLAS_LEVEL_AVX2), "Haswell");
    /* already right, or above what the CPU runs (never asked for here): left alone */
    cr_assert_null(blas_core_wanted("Zen", BLAS_LEVEL_AVX2));
    cr_assert_null(blas_core_wanted("SkylakeX", BLAS_LEVEL_AVX512));
    cr_assert_null(blas_core_wanted("Cooperlake", BLAS_LEVEL_AVX2));
    cr_assert_null(blas_core_wanted("Prescott", BLAS_LEVEL_OLD), "nothing better to load");
}

/* ringlmd with OPENBLAS_CORETYPE=Prescott: its start report, and the core it ran. */
static void daemon_report(const char *keep, char *out, size_t cap)
{
    setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    if (keep)
        setenv("RINGLM_BLAS_CORE", keep, 1);
    else
        unsetenv("RINGLM_BLAS_CORE");
    th_daemon d;
    th_daemon_init(&d);
    const char *args[] = {"--model", "synthetic:stories260K:1", NULL};
    th_daemon_start(&d, args, 20000);
    const char *log = th_daemon_output(&d);
    const char *line = strstr(log, "OpenBLAS core");
    cr_assert_not_null(line, "ringlmd's start report names no OpenBLAS core:\n%s", log);
    size_t n = strcspn(line, "\n");
    snprintf(out, cap, "%.*s", (int)n, line);
    cr_assert_eq(th_daemon_stop(&d, SIGTERM, 10000), 0, "ringlmd did not stop cleanly:\n%s", log);
    th_daemon_cleanup(&d);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("RINGLM_BLAS_CORE");
}

Test(kernels_blas_core, ringlmd_on_a_lesser_core_restarts_on_the_cpus_kernels_and_says_so)
{
    const char *want = blas_core_wanted("Prescott", blas_cpu_level());
    if (!want) {
        cr_log_info("this CPU runs no kernels above Prescott: nothing to replace");
        return;
    }
    char line[512];
    daemon_report(NULL, line, sizeof line);
    char expect[64];
    snprintf(expect, sizeof expect, "OpenBLAS core %s ", want);
    cr_assert(strstr(line, expect), "expected '%s' in: %s", expect, line);
    cr_assert(strstr(line, "OpenBLAS chose Prescott: re-executed"), "%s", line);

    /* the operator's choice stands with RINGLM_BLAS_CORE=keep, and the report says so */
    daemon_report("keep", line, sizeof line);
    cr_assert(strstr(line, "OpenBLAS core Prescott "), "%s", line);
    cr_assert(strstr(line, "kept by RINGLM_BLAS_CORE=keep"), "%s", line);
}
