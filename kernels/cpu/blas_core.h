/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/blas_core.h — which kernels OpenBLAS runs on this CPU, checked and corrected.
 *
 * Debian's OpenBLAS (0.3.21, built DYNAMIC_ARCH) picks its kernels once, in a constructor that
 * runs when the library is loaded, from cpuid. On a CPU it does not know (newer Xeons, some
 * VMs) it falls back to its Prescott (SSE3) kernels: SGEMM, and so the prefill of float
 * weights, then runs at a quarter of what the CPU does with its AVX-512 kernels (60 against
 * 245 GFLOP/s on 2 threads of an AVX-512 Xeon VM). The constructor reads OPENBLAS_CORETYPE,
 * so a choice made in main() is too late: blas_core_fix() re-executes the program with
 * OPENBLAS_CORETYPE set when OpenBLAS chose a core of a lower instruction level than this CPU
 * runs — SkylakeX for AVX-512 (F, BW, VL, DQ, CD), Haswell for AVX2 with FMA — so the next
 * load picks the right kernels. RINGLM_BLAS_CORE=keep in the environment leaves OpenBLAS's
 * choice (or an OPENBLAS_CORETYPE the operator set) alone; by default ("auto") a lesser core
 * is replaced, whether OpenBLAS guessed it or OPENBLAS_CORETYPE named it.
 */
#ifndef RINGLM_KERNELS_CPU_BLAS_CORE_H
#define RINGLM_KERNELS_CPU_BLAS_CORE_H

#include <stddef.h>

/* Instruction levels of OpenBLAS's x86-64 kernels. */
enum { BLAS_LEVEL_OLD = 0, BLAS_LEVEL_AVX2 = 1, BLAS_LEVEL_AVX512 = 2 };

/* The level of an OpenBLAS core name (openblas_get_corename(), any case): AVX512 for
 * SkylakeX, Cooperlake, SapphireRapids; AVX2 for Haswell, Zen; OLD for the others. */
int blas_core_level(const char *core);
/* The level this CPU runs (OLD off x86-64). */
int blas_cpu_level(void);
/* The core to load OpenBLAS with on a CPU of `cpu_level` where it chose `core`, or NULL
 * when `core` is already at that level (or above). */
const char *blas_core_wanted(const char *core, int cpu_level);

/* First thing in main(), before any thread or file is opened: re-executes /proc/self/exe
 * with argv and OPENBLAS_CORETYPE set where blas_core_wanted() names a core (at most once:
 * the new process does not re-execute itself again). Returns when there is nothing to do,
 * or when the re-execution failed (a note on stderr: the program runs on, slower). */
void blas_core_fix(char **argv);

/* One line for a start report: the core OpenBLAS runs, this CPU's level, and what
 * blas_core_fix did, e.g. "OpenBLAS core Haswell (AVX2 kernels; OpenBLAS chose Prescott:
 * re-executed with OPENBLAS_CORETYPE=Haswell)". */
void blas_core_describe(char *buf, size_t cap);

#endif
