/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/cpu_features.c — AMX and AVX512-FP16: reported, enabled, granted; see
 * cpu_features.h.
 */
#include "kernels/cpu/cpu_features.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
#include <asm/prctl.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* CPUID leaf 7 sub-leaf 0 EDX */
#define EDX_AMX_BF16       (1u << 22)
#define EDX_AVX512_FP16    (1u << 23)
#define EDX_AMX_TILE       (1u << 24)
#define EDX_AMX_INT8       (1u << 25)
/* CPUID leaf 1 ECX: the OS has enabled XSAVE, so xgetbv exists */
#define ECX_OSXSAVE        (1u << 27)
/* XCR0: SSE (1), AVX (2), opmask (5), ZMM_Hi256 (6), Hi16_ZMM (7); XTILECFG (17), XTILEDATA
 * (18) */
#define XCR0_AVX512        ((1ull << 1) | (1ull << 2) | (1ull << 5) | (1ull << 6) | (1ull << 7))
#define XCR0_TILES         ((1ull << 17) | (1ull << 18))
#define XFEATURE_XTILEDATA 18

/* ---- the checks ------------------------------------------------------------------------ */

/* Tiles exist (CPUID, XCR0): ask for tile data, and look that it was given. */
static cpufeat_state ask_for_tiles(const cpufeat_sys *sys, cpufeat_report *out)
{
    out->tiles_asked = true;
    int err = sys->request_tile_data();
    if (err) {
        snprintf(out->refused, sizeof out->refused, "%s", strerror(-err));
        return CPUFEAT_REFUSED;
    }
    uint64_t xfeatures = 0;
    err = sys->permitted(&xfeatures);
    if (err) {
        snprintf(out->refused, sizeof out->refused, "ARCH_GET_XCOMP_PERM: %s", strerror(-err));
        return CPUFEAT_REFUSED;
    }
    if (!(xfeatures >> XFEATURE_XTILEDATA & 1)) {
        snprintf(out->refused, sizeof out->refused, "not in ARCH_GET_XCOMP_PERM after the request");
        return CPUFEAT_REFUSED;
    }
    return CPUFEAT_GRANTED;
}

void cpufeat_probe(const cpufeat_sys *sys, cpufeat_report *out)
{
    memset(out, 0, sizeof *out); /* every feature CPUFEAT_ABSENT */
    uint32_t r[4];
    sys->cpuid(0, 0, r);
    if (r[0] < 7) return; /* no leaf 7: nothing past AVX2 is reported */
    sys->cpuid(1, 0, r);
    const bool osxsave = r[2] & ECX_OSXSAVE;
    sys->cpuid(7, 0, r);
    const uint32_t edx = r[3];
    const bool tiles = edx & EDX_AMX_TILE, fp16 = edx & EDX_AVX512_FP16;
    if (!tiles && !fp16) return;
    const uint64_t xcr0 = osxsave ? sys->xcr0() : 0;
    if (fp16)
        out->state[CPUFEAT_AVX512_FP16] =
            (xcr0 & XCR0_AVX512) == XCR0_AVX512 ? CPUFEAT_GRANTED : CPUFEAT_NO_OS;
    if (tiles) {
        const cpufeat_state s =
            (xcr0 & XCR0_TILES) == XCR0_TILES ? ask_for_tiles(sys, out) : CPUFEAT_NO_OS;
        out->state[CPUFEAT_AMX_TILE] = s;
        if (edx & EDX_AMX_BF16) out->state[CPUFEAT_AMX_BF16] = s;
        if (edx & EDX_AMX_INT8) out->state[CPUFEAT_AMX_INT8] = s;
    }
}

/* ---- this process ---------------------------------------------------------------------- */

#if defined(__x86_64__)
static void sys_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t regs[4])
{
    __cpuid_count(leaf, subleaf, regs[0], regs[1], regs[2], regs[3]);
}

static uint64_t sys_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

static int sys_request_tile_data(void)
{
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) ? -errno : 0;
}

static int sys_permitted(uint64_t *xfeatures)
{
    return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, xfeatures) ? -errno : 0;
}
#endif

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static cpufeat_report this_process; /* written once, under probe_once */

static void probe_this_process(void)
{
#if defined(__x86_64__)
    static const cpufeat_sys sys = {sys_cpuid, sys_xcr0, sys_request_tile_data, sys_permitted};
    cpufeat_probe(&sys, &this_process);
#endif
}

const cpufeat_report *cpufeat_get(void)
{
    pthread_once(&probe_once, probe_this_process);
    return &this_process;
}

/* ---- words ----------------------------------------------------------------------------- */

const char *cpufeat_name(cpufeat_id f)
{
    static const char *const names[CPUFEAT_COUNT] = {
        [CPUFEAT_AMX_TILE] = "AMX-TILE",
        [CPUFEAT_AMX_BF16] = "AMX-BF16",
        [CPUFEAT_AMX_INT8] = "AMX-INT8",
        [CPUFEAT_AVX512_FP16] = "AVX512-FP16",
    };
    return (unsigned)f < CPUFEAT_COUNT ? names[f] : "?";
}

void cpufeat_reason(const cpufeat_report *r, cpufeat_id f, char *buf, size_t cap)
{
    if (!cap) return;
    switch ((unsigned)f < CPUFEAT_COUNT ? r->state[f] : CPUFEAT_ABSENT) {
    case CPUFEAT_ABSENT: snprintf(buf, cap, "not reported by this CPU"); break;
    case CPUFEAT_NO_OS:
        snprintf(buf, cap, "reported, the OS does not enable its state (XCR0)");
        break;
    case CPUFEAT_REFUSED: snprintf(buf, cap, "the kernel refused tile data: %s", r->refused); break;
    case CPUFEAT_GRANTED:
        snprintf(buf, cap, f == CPUFEAT_AVX512_FP16 ? "usable" : "granted");
        break;
    }
}

void cpufeat_describe(const cpufeat_report *r, const char *amx_instead, const char *fp16_instead,
                      char *buf, size_t cap)
{
    if (!cap) return;
    char amx[128], fp16[128];
    cpufeat_reason(r, CPUFEAT_AMX_TILE, amx, sizeof amx);
    cpufeat_reason(r, CPUFEAT_AVX512_FP16, fp16, sizeof fp16);
    const bool has_tiles = r->state[CPUFEAT_AMX_TILE] != CPUFEAT_ABSENT;
    snprintf(buf, cap, "AMX%s%s%s: %s%s (instead: %s); AVX512-FP16: %s%s (instead: %s)",
             has_tiles ? " (tiles" : "",
             has_tiles && r->state[CPUFEAT_AMX_BF16] != CPUFEAT_ABSENT ? ", BF16" : "",
             has_tiles ? r->state[CPUFEAT_AMX_INT8] != CPUFEAT_ABSENT ? ", INT8)" : ")" : "", amx,
             r->state[CPUFEAT_AMX_TILE] == CPUFEAT_GRANTED ? ", but this build has no AMX kernel"
                                                           : "",
             amx_instead, fp16,
             r->state[CPUFEAT_AVX512_FP16] == CPUFEAT_GRANTED
                 ? ", but this build has no AVX512-FP16 kernel"
                 : "",
             fp16_instead);
}
