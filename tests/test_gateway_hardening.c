/* SPDX-License-Identifier: MIT */
/*
 * ringlm-gateway under hostile HTTP clients: a real ringlmd and a real gateway, the hostile
 * clients raw sockets of this test process (a process of its own).
 *   - a request whose body length is ambiguous (Content-Length and Transfer-Encoding) gets
 *     400 and its connection is closed: the bytes after it never run as a second request;
 *     HTTP/1.1 without Host gets 400.
 */
#include "tests/gateway_helpers.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(gateway_hardening, .fini = gwh_stop_all, .timeout = 180);

static void setup(const char *const *gw_extra)
{
    gwh_need();
    gwh_start_daemon(NULL);
    gwh_start_gateway(gw_extra);
    gwh_wait_healthy(10000);
}

/* Writes req on a new connection and reads until the gateway closes it (or 5 s pass). */
static char *exchange(const char *req, bool *eof)
{
    int fd = gwh_connect();
    th_send_all(fd, req, strlen(req));
    char *got = th_read_until(fd, NULL, 5000, eof);
    close(fd);
    return got;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* ---- request framing ---------------------------------------------------------------- */

Test(gateway_hardening, an_ambiguous_body_length_is_refused_and_nothing_after_it_runs)
{
    setup(NULL);
    /* A proxy that goes by Content-Length sees one POST; a server that goes by the chunked
     * encoding would see its end at "0\r\n\r\n" and run the GET after it. */
    static const char tail[] = "0\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
    char req[512];
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n"
             "Transfer-Encoding: chunked\r\n\r\n%s",
             strlen(tail), tail);
    bool eof;
    char *got = exchange(req, &eof);
    cr_assert(!strncmp(got, "HTTP/1.1 400", 12), "answered: %s", got);
    cr_assert_eq(count(got, "HTTP/1.1 "), 1, "a second request ran on the connection: %s", got);
    cr_assert(!strstr(got, "\"object\":\"list\""), "the smuggled GET was answered: %s", got);
    cr_assert(eof, "the connection stays open after an ambiguous request: %s", got);
    free(got);

    /* Two Content-Lengths are ambiguous the same way. */
    got = exchange("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                   "Content-Length: 40\r\n\r\n{}",
                   &eof);
    cr_assert(!strncmp(got, "HTTP/1.1 400", 12) && eof, "answered (eof %d): %s", eof, got);
    free(got);
}

Test(gateway_hardening, http_1_1_without_host_is_refused)
{
    setup(NULL);
    bool eof;
    char *got = exchange("GET /v1/models HTTP/1.1\r\n\r\n", &eof);
    cr_assert(!strncmp(got, "HTTP/1.1 400", 12), "answered: %s", got);
    cr_assert(strstr(got, "Host"), "the error does not say what is missing: %s", got);
    free(got);
    /* HTTP/1.0 has no Host requirement; a well-formed 1.1 request is served. */
    got = exchange("GET /v1/models HTTP/1.0\r\n\r\n", &eof);
    cr_assert(strstr(got, " 200 ") && strstr(got, "\"object\":\"list\""), "answered: %s", got);
    free(got);
    got = exchange("GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &eof);
    cr_assert(strstr(got, " 200 ") && strstr(got, "\"object\":\"list\""), "answered: %s", got);
    free(got);
}
