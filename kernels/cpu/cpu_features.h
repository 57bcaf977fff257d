/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/cpu_features.h — the x86 features past AVX-512 BF16 that a CPU backend could
 * use, AMX (tiles, BF16 and INT8 products) and AVX512-FP16: does this CPU report them, does
 * the OS save their registers, and, for AMX, does the kernel let this process use tile data.
 *
 * No kernel of this build uses them. The machines the project is built and tested on have
 * neither (a Zen 4 VM), no emulator there runs them, and a kernel that never ran does not
 * land. What is here is what such a kernel will need first — the detection, done once per
 * process and never by executing an AMX or AVX512-FP16 instruction — and the words the start
 * report says about it, so that an operator on a host that has them reads that this build
 * runs another path, and which.
 *
 * The checks, in order (Intel SDM vol. 1 ch. 13 and 18; Linux's x86 xstate documentation):
 * 1. CPUID leaf 7 sub-leaf 0 EDX: AMX-BF16 (bit 22), AVX512-FP16 (23), AMX-TILE (24),
 *    AMX-INT8 (25). AMX-BF16 and AMX-INT8 count as reported only with AMX-TILE: they are
 *    products on its tiles.
 * 2. XCR0, which the OS sets: read (xgetbv) only where CPUID leaf 1 ECX bit 27 (OSXSAVE)
 *    says the instruction exists, as it faults otherwise. AVX512-FP16 needs the SSE, AVX,
 *    opmask, ZMM_Hi256 and Hi16_ZMM state (bits 1, 2, 5, 6, 7); AMX needs XTILECFG (17) and
 *    XTILEDATA (18).
 * 3. AMX only: Linux gives a process tile data only when it asks,
 *    arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), and ARCH_GET_XCOMP_PERM then shows
 *    the bit. Asked only where 1 and 2 say tiles exist. A grant lasts as long as the process:
 *    from then on Linux refuses (ENOMEM) an alternate signal stack too small for the tile
 *    state; nothing in ringlm installs one.
 *
 * Each feature ends in one state, and the report says it in words (cpufeat_reason).
 */
#ifndef RINGLM_KERNELS_CPU_CPU_FEATURES_H
#define RINGLM_KERNELS_CPU_CPU_FEATURES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum cpufeat_id {
    CPUFEAT_AMX_TILE,
    CPUFEAT_AMX_BF16,
    CPUFEAT_AMX_INT8,
    CPUFEAT_AVX512_FP16,
    CPUFEAT_COUNT
} cpufeat_id;

typedef enum cpufeat_state {
    CPUFEAT_ABSENT,  /* "not reported by this CPU" (every feature off x86-64) */
    CPUFEAT_NO_OS,   /* "reported, the OS does not enable its state (XCR0)" */
    CPUFEAT_REFUSED, /* AMX: "the kernel refused tile data: <why>" */
    CPUFEAT_GRANTED, /* usable by this process: AMX "granted", AVX512-FP16 "usable" */
} cpufeat_state;

typedef struct cpufeat_report {
    cpufeat_state state[CPUFEAT_COUNT];
    bool tiles_asked; /* whether the permission for tile data was requested */
    char refused[96]; /* CPUFEAT_REFUSED: why (the request's strerror, or what it lacked) */
} cpufeat_report;

/* What the checks read and ask, as functions, so that a test can stand in for a CPU and a
 * kernel this machine is not (and count what was asked). Each returns what the instruction
 * or system call does: cpuid fills eax, ebx, ecx, edx; the two permission calls return 0
 * or a negative errno. */
typedef struct cpufeat_sys {
    void (*cpuid)(uint32_t leaf, uint32_t subleaf, uint32_t regs[4]);
    uint64_t (*xcr0)(void);
    int (*request_tile_data)(void);
    int (*permitted)(uint64_t *xfeatures);
} cpufeat_sys;

/* This process's features: probed on the first call (the permission asked then, where
 * tiles exist), the same report after. Never fails; off x86-64 everything is ABSENT.
 * Thread-safe. */
const cpufeat_report *cpufeat_get(void);

/* The checks above through `sys` into *out (cpufeat_get passes the real instructions and
 * system calls). */
void cpufeat_probe(const cpufeat_sys *sys, cpufeat_report *out);

/* "AMX-TILE", "AMX-BF16", "AMX-INT8", "AVX512-FP16". */
const char *cpufeat_name(cpufeat_id f);

/* Feature f's state in words, e.g. "not reported by this CPU", "the kernel refused tile
 * data: Operation not permitted", into buf (cap bytes, always terminated where cap > 0). */
void cpufeat_reason(const cpufeat_report *r, cpufeat_id f, char *buf, size_t cap);

/* The start report's clause about these features: each one's state and what runs instead,
 * given by the backend (amx_instead: its BF16 tiles and integer dots; fp16_instead: its F16
 * weights), e.g. "AMX: not reported by this CPU; BF16 tiles in AVX-512 BF16, integer dots in
 * AVX-512 VNNI; AVX512-FP16: not reported by this CPU; F16 weights converted by F16C". Where
 * a feature is usable it says that this build has no kernel for it. */
void cpufeat_describe(const cpufeat_report *r, const char *amx_instead, const char *fp16_instead,
                      char *buf, size_t cap);

#endif
