/* ringlm — simulator error detail. SPDX-License-Identifier: MIT */
#include "sim/err.h"
#include "common/errdetail.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

ERRDETAIL_DEFINE(sim_err_buf);

static void sim_err_vset(const char *fmt, va_list ap)
{
    errdetail_vset(&sim_err_buf, 0, fmt, ap);
}

int sim_err_set(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sim_err_vset(fmt, ap);
    va_end(ap);
    return -EINVAL;
}

int sim_err_setc(int neg_errno, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sim_err_vset(fmt, ap);
    va_end(ap);
    return neg_errno;
}

const char *sim_err(void)
{
    return sim_err_buf.msg;
}
