/* SPDX-License-Identifier: MIT */
/*
 * common/futex.h — the one futex wrapper of the tree: the session doorbells (a word in a segment
 * two processes map), the decision-log writer's wake word and the CPU engine's worker pool
 * all sleep and wake through it; a libringlm client sleeps on its doorbell and on a word of
 * its own at once (futex_wait_either). The handshake that decides when to call it (set a flag,
 * full fence, look again) is ring_handshake_announce / ring_handshake_peer_waits in
 * shm/ring.h.
 *
 * Header only (static inline, libc and the kernel's uapi), so kernels/ may include it
 * without linking anything of shm/ (scripts/check-layering.sh declares this one file).
 */
#ifndef RINGLM_SHM_FUTEX_H
#define RINGLM_SHM_FUTEX_H

#include <errno.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef enum futex_scope {
    /* The word lies in memory that other processes map (a session segment): the kernel keys
     * the futex by the backing page, so a waiter in one process is woken from another. */
    FUTEX_SCOPE_SHARED = 0,
    /* The word is this process's own: FUTEX_PRIVATE_FLAG, keyed by address alone (no page
     * lookup), and no other process can wake or be woken through it. */
    FUTEX_SCOPE_PROCESS,
} futex_scope;

/* Sleeps while *word == expected, at most timeout_ns (< 0: no limit). Returns 0 when woken
 * or when the value already differed, -ETIMEDOUT, -EINTR (a signal), or another -errno. */
static inline int futex_wait(const uint32_t *word, uint32_t expected, int64_t timeout_ns,
                             futex_scope scope)
{
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000);
        ts.tv_nsec = (long)(timeout_ns % 1000000000);
        tsp = &ts;
    }
    int op = scope == FUTEX_SCOPE_PROCESS ? FUTEX_WAIT_PRIVATE : FUTEX_WAIT;
    if (syscall(SYS_futex, word, op, expected, tsp, NULL, 0) == 0 || errno == EAGAIN) return 0;
    return -errno;
}

/* Sleeps while *a == va and *b == vb (each word in its own scope), at most timeout_ns (< 0:
 * no limit): futex_waitv, so a wake on either word ends the wait, and a change of either
 * before the call makes it return at once. Returns 0 (woken, or a value already differed),
 * -ETIMEDOUT, -EINTR, or -ENOSYS / -EPERM where the kernel (before Linux 5.16) or a seccomp
 * filter has no futex_waitv: the caller then waits on one word. */
static inline int futex_wait_either(const uint32_t *a, uint32_t va, futex_scope sa,
                                    const uint32_t *b, uint32_t vb, futex_scope sb,
                                    int64_t timeout_ns)
{
#ifdef SYS_futex_waitv
#ifndef FUTEX_32
#define FUTEX_32 2 /* the word's size in futex_waitv's flags (uapi headers before 5.16) */
#endif
    struct futex_waitv w[2] = {
        {.val = va,
         .uaddr = (uintptr_t)a,
         .flags = FUTEX_32 | (sa == FUTEX_SCOPE_PROCESS ? FUTEX_PRIVATE_FLAG : 0)},
        {.val = vb,
         .uaddr = (uintptr_t)b,
         .flags = FUTEX_32 | (sb == FUTEX_SCOPE_PROCESS ? FUTEX_PRIVATE_FLAG : 0)},
    };
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) { /* futex_waitv takes an absolute time */
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t ns = (int64_t)ts.tv_nsec + timeout_ns % 1000000000;
        ts.tv_sec += (time_t)(timeout_ns / 1000000000 + ns / 1000000000);
        ts.tv_nsec = (long)(ns % 1000000000);
        tsp = &ts;
    }
    if (syscall(SYS_futex_waitv, w, 2, 0, tsp, CLOCK_MONOTONIC) >= 0 || errno == EAGAIN) return 0;
    return -errno;
#else
    (void)a, (void)va, (void)sa, (void)b, (void)vb, (void)sb, (void)timeout_ns;
    return -ENOSYS;
#endif
}

/* Wakes up to n waiters on word (INT32_MAX: all). Returns the number woken or -errno. */
static inline int futex_wake(const uint32_t *word, int n, futex_scope scope)
{
    int op = scope == FUTEX_SCOPE_PROCESS ? FUTEX_WAKE_PRIVATE : FUTEX_WAKE;
    long r = syscall(SYS_futex, word, op, n, NULL, NULL, 0);
    return r < 0 ? -errno : (int)r;
}

#endif
