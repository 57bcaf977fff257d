/* SPDX-License-Identifier: MIT */
/* kernels/errors.c — the engine's thread-local error detail (see engine.h "errors"). */
#include "kernels/engine.h"
#include "common/errdetail.h"

#include <stdarg.h>
#include <stdio.h>

ERRDETAIL_DEFINE(eng_err);

const char *eng_errmsg(void)
{
    return eng_err.msg;
}

int eng_seterr(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    /* callers may pass eng_errmsg() itself as an argument to add context: errdetail allows it */
    errdetail_vset(&eng_err, err, fmt, ap);
    va_end(ap);
    return err;
}
