/* SPDX-License-Identifier: MIT */
/* kernels/errors.c — the engine's thread-local error detail (see engine.h "errors"). */
#include "kernels/engine.h"

#include <stdarg.h>
#include <stdio.h>

static __thread char eng_err[512];

const char *eng_errmsg(void) { return eng_err; }

int eng_seterr(int err, const char *fmt, ...)
{
    char tmp[sizeof eng_err];
    va_list ap;
    va_start(ap, fmt);
    /* via tmp: callers may pass eng_errmsg() itself as an argument to add context */
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    snprintf(eng_err, sizeof eng_err, "%s", tmp);
    return err;
}
