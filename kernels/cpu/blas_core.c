/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/blas_core.c — OpenBLAS's kernels for this CPU: see blas_core.h.
 */
#include "kernels/cpu/blas_core.h"

#include "kernels/cpu/blas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#if defined(RINGLM_PORTABLE_CHECK) && !__has_include(<cblas.h>)
char *openblas_get_corename(void);
#endif

/* Set by blas_core_fix() in the process it re-executes: the core OpenBLAS had chosen. */
#define WAS_ENV "RINGLM_BLAS_CORE_WAS"

static char was_core[32]; /* what OpenBLAS chose before the re-execution, or "" */
static int fix_state;     /* 0: nothing to do; 1: re-executed; 2: kept (keep); 3: exec failed */
static char wanted_core[32];

int blas_core_level(const char *core)
{
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Zen"};
    if (!core) return BLAS_LEVEL_OLD;
    for (size_t i = 0; i < sizeof avx512 / sizeof avx512[0]; i++)
        if (strcasecmp(core, avx512[i]) == 0) return BLAS_LEVEL_AVX512;
    for (size_t i = 0; i < sizeof avx2 / sizeof avx2[0]; i++)
        if (strcasecmp(core, avx2[i]) == 0) return BLAS_LEVEL_AVX2;
    return BLAS_LEVEL_OLD;
}

int blas_cpu_level(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    /* what OpenBLAS's own SkylakeX check asks for (GCC's checks include the OS saving the
     * registers: XCR0) */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd"))
        return BLAS_LEVEL_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return BLAS_LEVEL_AVX2;
#endif
    return BLAS_LEVEL_OLD;
}

const char *blas_core_wanted(const char *core, int cpu_level)
{
    if (blas_core_level(core) >= cpu_level) return NULL;
    return cpu_level == BLAS_LEVEL_AVX512 ? "SkylakeX"
           : cpu_level == BLAS_LEVEL_AVX2 ? "Haswell"
                                          : NULL;
}

void blas_core_fix(char **argv)
{
    const char *was = getenv(WAS_ENV);
    if (was) { /* this is the re-executed process */
        snprintf(was_core, sizeof was_core, "%s", was);
        unsetenv(WAS_ENV); /* not for the programs this one starts */
        fix_state = 1;
        return;
    }
    const char *core = openblas_get_corename();
    const char *want = blas_core_wanted(core, blas_cpu_level());
    if (!want) return;
    snprintf(was_core, sizeof was_core, "%s", core ? core : "?");
    snprintf(wanted_core, sizeof wanted_core, "%s", want);
    const char *mode = getenv("RINGLM_BLAS_CORE");
    if (mode && strcmp(mode, "keep") == 0) {
        fix_state = 2;
        return;
    }
    if (setenv("OPENBLAS_CORETYPE", want, 1) == 0 && setenv(WAS_ENV, was_core, 1) == 0)
        execv("/proc/self/exe", argv);
    /* still here: the exec failed; run on with OpenBLAS's choice */
    unsetenv(WAS_ENV);
    fix_state = 3;
    fprintf(stderr,
            "note: OpenBLAS runs its %s kernels on a CPU that runs %s ones, and re-executing "
            "with OPENBLAS_CORETYPE=%s failed: float prefill runs slower\n",
            was_core, want, want);
}

void blas_core_describe(char *buf, size_t cap)
{
    const char *core = openblas_get_corename();
    const int lv = blas_cpu_level();
    const char *cpu = lv == BLAS_LEVEL_AVX512 ? "AVX-512"
                      : lv == BLAS_LEVEL_AVX2 ? "AVX2+FMA"
                                              : "SSE";
    switch (fix_state) {
    case 1:
        snprintf(buf, cap,
                 "OpenBLAS core %s (this CPU: %s; OpenBLAS chose %s: re-executed with "
                 "OPENBLAS_CORETYPE=%s)",
                 core ? core : "?", cpu, was_core, core ? core : "?");
        break;
    case 2:
        snprintf(buf, cap,
                 "OpenBLAS core %s (this CPU: %s; kept by RINGLM_BLAS_CORE=keep: %s kernels "
                 "would run float prefill faster)",
                 core ? core : "?", cpu, wanted_core);
        break;
    case 3:
        snprintf(buf, cap, "OpenBLAS core %s (this CPU: %s; re-executing with %s failed)",
                 core ? core : "?", cpu, wanted_core);
        break;
    default: snprintf(buf, cap, "OpenBLAS core %s (this CPU: %s)", core ? core : "?", cpu);
    }
}
