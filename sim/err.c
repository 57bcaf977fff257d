/* ringlm — simulator error detail. SPDX-License-Identifier: MIT */
#include "sim/err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

static __thread char sim_err_buf[512];

static void sim_err_vset(const char *fmt, va_list ap)
{
    vsnprintf(sim_err_buf, sizeof sim_err_buf, fmt, ap);
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

const char *sim_err(void) { return sim_err_buf; }
