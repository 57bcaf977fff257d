/* SPDX-License-Identifier: MIT */
/*
 * common/errdetail.h — the one error-detail mechanism of every ringlm module (STYLE.md "an
 * error explains itself").
 *
 * A function returns 0 or a negative errno, as the kernel and liburing do; the sentence that
 * explains it ("prompt token 7 is 91234, vocabulary has 32000 tokens") goes into its module's
 * detail, which the module exposes through one getter (kvtier_errmsg(), eng_errmsg(),
 * ringlm_errdetail(), ...). Each module owns one detail, so a caller that reads a module's
 * getter right after that module failed reads that failure, whatever other modules did
 * since on the thread.
 *
 * The detail is thread-local: two threads never read each other's message, and setting it
 * takes no lock. A detail may wrap the one it replaces — errdetail_set(&d, rc, "model %s:
 * %s", path, d.msg) — because the text is formatted aside before it is copied in.
 *
 * Header only and libc only, so that every folder may include it, sched/ and shm/ included
 * (scripts/check-layering.sh: common/ includes nothing of ours).
 */
#ifndef RINGLM_COMMON_ERRDETAIL_H
#define RINGLM_COMMON_ERRDETAIL_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Bytes of one detail, the terminating NUL included; longer text is truncated. */
#define ERRDETAIL_MAX 512

typedef struct errdetail {
    char msg[ERRDETAIL_MAX]; /* "" until the first error on this thread */
} errdetail;

/* Defines a module's detail: `ERRDETAIL_DEFINE(kvt_err);` at file scope. */
#define ERRDETAIL_DEFINE(name) static _Thread_local errdetail name

/* Formats the detail (vprintf style) and returns rc, so callers write
 * `return errdetail_set(&d, -EINVAL, ...)`. An argument may point into d->msg itself. */
static inline int errdetail_vset(errdetail *d, int rc, const char *fmt, va_list ap)
{
    char tmp[ERRDETAIL_MAX];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    memcpy(d->msg, tmp, sizeof tmp);
    return rc;
}

static inline int errdetail_set(errdetail *d, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int errdetail_set(errdetail *d, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    errdetail_vset(d, rc, fmt, ap);
    va_end(ap);
    return rc;
}

#endif
