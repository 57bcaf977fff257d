/* SPDX-License-Identifier: MIT */
/* tools/cli.c — what every subcommand of the ringlm CLI shares (see cli.h). */
#include "tools/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *cli_socket; /* NULL: library default rule */

void cli_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ringlm: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* Allocation for a command-line tool: out of memory ends the command with a message
 * instead of a NULL dereference later. */
void *cli_realloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p) cli_die("out of memory");
    return p;
}
void *cli_calloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) cli_die("out of memory");
    return p;
}
char *cli_strdup(const char *s)
{
    char *d = strdup(s);
    if (!d) cli_die("out of memory");
    return d;
}

uint64_t cli_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

long cli_parse_long(const char *opt, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        cli_die("%s: '%s' is not an integer in [%ld, %ld]", opt, s, lo, hi);
    return v;
}

double cli_parse_double(const char *opt, const char *s, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        cli_die("%s: '%s' is not a number in [%g, %g]", opt, s, lo, hi);
    return v;
}

ringlm_client *cli_connect(void)
{
    ringlm_client *c;
    int rc = ringlm_connect(cli_socket, &c);
    if (rc < 0) {
        const char *path = cli_socket ? cli_socket : getenv(RINGLM_SOCKET_ENV);
        if (!path || !*path) path = RINGLM_DEFAULT_SOCKET;
        cli_die("cannot connect to ringlmd at %s: %s%s%s", path, ringlm_strerror(rc),
                *ringlm_errdetail() ? " — " : "", ringlm_errdetail());
    }
    return c;
}
