/* SPDX-License-Identifier: MIT */
/*
 * tools/cli.h — what the subcommands of the ringlm CLI share: the socket option, fatal
 * errors, allocation that ends the command on out-of-memory, option parsing, the clock.
 * A command-line tool may end the process on a bad argument; library code (formats/,
 * libclient/) never does.
 */
#ifndef RINGLM_TOOLS_CLI_H
#define RINGLM_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "libclient/ringlm.h"

/* --socket PATH; NULL: the library's default rule ($RINGLM_SOCKET, then the default path). */
extern const char *cli_socket;

/* Prints "ringlm: <message>" on stderr and exits 1. */
void cli_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* realloc / calloc / strdup that end the command with a message when memory runs out. */
void *cli_realloc(void *p, size_t n);
void *cli_calloc(size_t n, size_t size);
char *cli_strdup(const char *s);
/* CLOCK_MONOTONIC in µs. */
uint64_t cli_now_us(void);
/* An option's value in [lo, hi], or the command ends naming the option. */
long cli_parse_long(const char *opt, const char *s, long lo, long hi);
double cli_parse_double(const char *opt, const char *s, double lo, double hi);
/* Connects to the daemon at cli_socket, or ends the command with the path and the reason. */
ringlm_client *cli_connect(void);

#endif
