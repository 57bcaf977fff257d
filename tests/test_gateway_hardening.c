/* SPDX-License-Identifier: MIT */
/*
 * ringlm-gateway under hostile HTTP clients: a real ringlmd and a real gateway, the hostile
 * clients raw sockets of this test process (a process of its own).
 *   - a request whose body length is ambiguous (Content-Length and Transfer-Encoding) gets
 *     400 and its connection is closed: the bytes after it never run as a second request;
 *     HTTP/1.1 without Host gets 400;
 *   - slowloris: a head or a body trickled byte by byte is cut at its deadline although the
 *     connection is never idle; at the connection limit, clients slow to send their heads
 *     make room for newcomers, so /health is answered; one address holds at most
 *     --max-connections-per-addr connections;
 *   - a big prompt is tokenized off the HTTP thread: /health answers meanwhile; a full
 *     tokenizer queue answers 503 with Retry-After; a request whose client left before a
 *     tokenizer thread took it is never prepared;
 *   - trust: API keys in front of a daemon that would ignore the gateway's tenant tags (the
 *     built-in policy), or a key whose class the policy lacks, refuse the start, saying what
 *     to change; a daemon that comes later with such a policy keeps /health 503 with why;
 *     uids sharing a tenant share its cached prefixes unless the tenant has cache_per_uid.
 */
#include "tests/gateway_helpers.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ringlm.h"

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

/* ---- slow clients ------------------------------------------------------------------- */

/* GET /health from 127.0.0.1 on a fresh connection, all of it within timeout_ms: its status,
 * or 0 when no answer came in time. */
static int health_within(int timeout_ms)
{
    uint64_t end = th_now_ms() + (uint64_t)timeout_ms;
    int fd = th_tcp_connect_from("127.0.0.1", gwh_port, true);
    cr_assert_geq(fd, 0, "connect: %s", strerror(-fd));
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int st = 0;
    if (poll(&p, 1, timeout_ms) == 1) {
        static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)sizeof req - 1) {
            uint64_t now = th_now_ms();
            bool eof;
            char *got = th_read_until(fd, "\r\n", now < end ? (int)(end - now) : 1, &eof);
            sscanf(got, "HTTP/1.%*d %d", &st);
            free(got);
        }
    }
    close(fd);
    return st;
}

/* A connection from src that sends the first bytes of a head and then nothing. */
static int slow_head_from(const char *src)
{
    int fd = th_tcp_connect_from(src, gwh_port, true);
    cr_assert_geq(fd, 0, "connect from %s: %s", src, strerror(-fd));
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    cr_assert_eq(poll(&p, 1, 5000), 1, "connect from %s did not complete", src);
    static const char part[] = "GET /health HTTP/1.1\r\nHo";
    cr_assert_eq(send(fd, part, sizeof part - 1, MSG_NOSIGNAL), (ssize_t)sizeof part - 1);
    return fd;
}

/* true when the gateway closed fd within timeout_ms. */
static bool closed_within(int fd, int timeout_ms)
{
    bool eof;
    free(th_read_until(fd, NULL, timeout_ms, &eof));
    return eof;
}

/* Sends text one byte every period_ms until the gateway closes the connection or limit_ms
 * passes; how long the connection lived (ms), or -1 when it outlived limit_ms. */
static long trickle(int fd, const char *text, int period_ms, int limit_ms)
{
    uint64_t t0 = th_now_ms();
    for (size_t i = 0; th_now_ms() - t0 < (uint64_t)limit_ms; i++) {
        char ch = text[i % strlen(text)];
        if (send(fd, &ch, 1, MSG_NOSIGNAL) != 1) return (long)(th_now_ms() - t0);
        /* the pause between two bytes is the slow client itself; it also looks for the end */
        if (closed_within(fd, period_ms)) return (long)(th_now_ms() - t0);
    }
    return -1;
}

Test(gateway_hardening, a_head_trickled_byte_by_byte_is_cut_at_the_default_head_deadline)
{
    /* The idle timeout is 30 s; one byte every 500 ms never leaves the connection idle. */
    const char *extra[] = {"--http-timeout-s", "30", NULL};
    setup(extra);
    int fd = gwh_connect();
    long lived = trickle(fd, "GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ", 500, 25000);
    close(fd);
    cr_assert_neq(lived, -1, "a head trickled for 25 s is still being read");
    cr_assert(lived >= 9000 && lived < 15000, "cut after %ld ms; the head deadline is 10 s", lived);
    char *m = gwh_gateway_metrics();
    cr_assert_eq(gwh_metric(m, "ringlm_gateway_connections_cut_total{reason=\"head_timeout\"}"), 1,
                 "%s", m);
    free(m);
}

Test(gateway_hardening, a_body_trickled_byte_by_byte_is_cut_at_the_body_deadline)
{
    const char *extra[] = {"--http-body-timeout-s", "2", NULL};
    setup(extra);
    int fd = gwh_connect();
    static const char head[] =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n";
    th_send_all(fd, head, sizeof head - 1);
    long lived = trickle(fd, "{\"prompt\": \"Once upon a time\"    ", 200, 20000);
    close(fd);
    cr_assert_neq(lived, -1, "a body trickled for 20 s is still being read");
    cr_assert(lived >= 1500 && lived < 6000, "cut after %ld ms; the body deadline is 2 s", lived);
    /* the connection that sends its request at once is served */
    gwh_resp r = gwh_curl("/v1/completions", NULL, "{\"prompt\":\"Once\",\"max_tokens\":2}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    gwh_resp_free(&r);
}

Test(gateway_hardening, slow_heads_make_room_at_the_connection_limit_and_health_is_answered)
{
    gwh_need_curl();
    const char *extra[] = {"--max-connections", "32", NULL};
    setup(extra);
    /* Twice the limit, from 8 addresses (8 each, under any per-address bound). */
    enum { N_SLOW = 64 };
    int slow[N_SLOW];
    for (int i = 0; i < N_SLOW; i++) {
        char src[32];
        snprintf(src, sizeof src, "127.0.0.%d", 2 + i / 8);
        slow[i] = slow_head_from(src);
    }
    for (int k = 0; k < 10; k++) {
        int st = health_within(3000);
        cr_assert_eq(st, 200, "/health %d of 10: %s with 64 slow heads at a 32-connection limit",
                     k + 1, st ? "not 200" : "no answer within 3 s");
    }
    /* the oldest slow heads were closed to make that room */
    int closed = 0;
    for (int i = 0; i < N_SLOW; i++) closed += closed_within(slow[i], 1);
    for (int i = 0; i < N_SLOW; i++) close(slow[i]);
    cr_assert_geq(closed, N_SLOW - 32, "%d of %d slow heads were closed", closed, N_SLOW);
    char *m = gwh_gateway_metrics();
    cr_assert_geq(gwh_metric(m, "ringlm_gateway_connections_cut_total{reason=\"evicted\"}"),
                  N_SLOW - 32, "%s", m);
    free(m);
}

Test(gateway_hardening, one_address_holds_at_most_its_connection_bound)
{
    const char *extra[] = {"--max-connections-per-addr", "4", NULL};
    setup(extra);
    int fd[8];
    for (int i = 0; i < 8; i++) fd[i] = slow_head_from("127.0.0.2");
    int open_n = 0;
    for (int i = 0; i < 8; i++) open_n += !closed_within(fd[i], i < 4 ? 300 : 2000);
    cr_assert_eq(open_n, 4, "%d connections from one address are open; the bound is 4", open_n);
    /* other addresses are not affected */
    int other = slow_head_from("127.0.0.3");
    cr_assert(!closed_within(other, 300), "a connection from a second address was closed");
    cr_assert_eq(health_within(3000), 200);
    close(other);
    for (int i = 0; i < 8; i++) close(fd[i]);
}

/* ---- preparation off the HTTP thread -------------------------------------------------- */

/* A completions body whose prompt is about kb KB of text (malloc()ed). */
static char *big_prompt_body(int kb)
{
    static const char line[] = "Once upon a time there was a little girl who liked to play. ";
    size_t n = (size_t)kb * 1024 / (sizeof line - 1) + 1;
    char *b = malloc(n * (sizeof line - 1) + 64);
    char *p = b + sprintf(b, "{\"prompt\":\"");
    for (size_t i = 0; i < n; i++) p += sprintf(p, "%s", line);
    sprintf(p, "\",\"max_tokens\":4}");
    return b;
}

/* The status of the answer on fd, waiting up to timeout_ms (0: none came). */
static int answer_status(int fd, int timeout_ms, char **text)
{
    bool eof;
    char *got = th_read_until(fd, "\r\n\r\n", timeout_ms, &eof);
    int st = 0;
    sscanf(got, "HTTP/1.%*d %d", &st);
    if (text)
        *text = got;
    else
        free(got);
    return st;
}

Test(gateway_hardening, health_answers_while_a_big_prompt_is_tokenized)
{
    setup(NULL);
    char *body = big_prompt_body(48);
    int fd = gwh_connect();
    gwh_send_post(fd, "/v1/completions", NULL, body);
    uint64_t t0 = th_now_ms();
    int probes = 0, during = 0;
    /* until the big request is answered (a prompt beyond the context: 400), /health is
     * answered within 500 ms each time */
    while (!th_readable(fd, 0) && th_now_ms() - t0 < 120000) {
        uint64_t p0 = th_now_ms();
        int st = health_within(500);
        cr_assert_eq(st, 200, "/health probe %d, %llu ms after the big prompt: %s", probes + 1,
                     (unsigned long long)(p0 - t0), st ? "not 200" : "no answer within 500 ms");
        probes++;
        during += !th_readable(fd, 0);
        th_pause_ms(20); /* a client that asks every 20 ms, not a flood */
    }
    int st = answer_status(fd, 1000, NULL);
    cr_assert(st == 400 || st == 200, "the big prompt was answered %d", st);
    cr_log_info("%d /health probes answered, %d of them while the prompt was tokenized", probes,
                during);
    close(fd);
    free(body);
}

Test(gateway_hardening, a_full_tokenizer_queue_answers_503_with_retry_after)
{
    const char *extra[] = {"--tokenize-threads", "1", "--tokenize-queue", "1", NULL};
    setup(extra);
    char *body = big_prompt_body(32);
    enum { N = 16 };
    int fd[N];
    for (int i = 0; i < N; i++) {
        fd[i] = gwh_connect();
        gwh_send_post(fd[i], "/v1/completions", NULL, body);
    }
    /* One is tokenized, one waits, the rest are refused at once; the refusals come first. */
    int busy = 0;
    for (int i = 0; i < N; i++) {
        char *got;
        int st = answer_status(fd[i], 300, &got);
        if (st == 503) {
            cr_assert(strstr(got, "Retry-After:"), "a 503 without Retry-After: %s", got);
            if (!strstr(got, "}}")) {
                bool eof;
                char *rest = th_read_until(fd[i], "}}", 2000, &eof);
                got = realloc(got, strlen(got) + strlen(rest) + 1);
                strcat(got, rest);
                free(rest);
            }
            cr_assert(strstr(got, "\"busy\""), "503 for another reason: %s", got);
            busy++;
        } else {
            cr_assert(st == 0 || st == 400 || st == 200, "answered %d: %s", st, got);
        }
        free(got);
    }
    cr_assert_geq(busy, 1,
                  "none of %d bodies sent at once to 1 thread and a queue of 1 was "
                  "refused",
                  N);
    char *m = gwh_gateway_metrics();
    cr_assert_eq(gwh_metric(m, "ringlm_gateway_prep_refused_total"), busy, "%s", m);
    free(m);
    for (int i = 0; i < N; i++) close(fd[i]);
    free(body);
}

Test(gateway_hardening, a_request_whose_client_left_is_never_prepared)
{
    const char *extra[] = {"--tokenize-threads", "1", NULL};
    setup(extra);
    /* A occupies the one tokenizer thread; B, C and D wait behind it and hang up. */
    char *body = big_prompt_body(32);
    int a = gwh_connect();
    gwh_send_post(a, "/v1/completions", NULL, body);
    for (int i = 0; i < 3; i++) {
        int fd = gwh_connect();
        gwh_send_post(fd, "/v1/completions", NULL,
                      "{\"prompt\":\"Once upon a time\",\"max_tokens\":200}");
        close(fd);
    }
    uint64_t left = th_now_ms();
    char *m = NULL;
    /* their hang-ups are seen while A is still tokenized (the HTTP thread is free) ... */
    int st = answer_status(a, 120000, NULL);
    cr_assert(st == 400 || st == 200, "A was answered %d", st);
    bool a_outlasted = th_now_ms() - left > 300;
    m = gwh_gateway_metrics();
    double dropped = gwh_metric(m, "ringlm_gateway_prep_dropped_total");
    /* ... and when A outlasted them, not one of them was prepared, let alone submitted */
    if (a_outlasted)
        cr_assert_eq(dropped, 3, "%g of 3 requests whose clients left were dropped:\n%s", dropped,
                     m);
    else
        cr_log_info("A was tokenized in under 300 ms: the drop was not exercised");
    free(m);
    m = gwh_daemon_metrics();
    cr_assert_eq(gwh_metric(m, "ringlm_requests_finished_total{tenant=\"shared\",class=\"chat\","
                               "reason=\"length\"}"),
                 0, "a request whose client left generated to its length:\n%s", m);
    free(m);
    close(a);
    free(body);
}

/* ---- trust: what the daemon says at the handshake --------------------------------------- */

/* ringlmd on stories260K with policy text (NULL: the built-in policy), in gwh_dir(). */
static void start_daemon_with(const char *policy_text)
{
    gwh_dir();
    char *model = th_shared_file("models/stories260K.bin");
    char *policy = th_path(gwh_dir(), "trust.policy");
    if (policy_text) {
        FILE *f = fopen(policy, "w");
        cr_assert_not_null(f);
        fputs(policy_text, f);
        fclose(f);
    }
    const char *argv[] = {"--model", model, "--policy", policy, NULL};
    if (!policy_text) argv[2] = NULL;
    th_daemon_start(&gwh_daemon, argv, 20000);
    free(model);
    free(policy);
}

/* Starts the gateway with extra options and waits for it to exit (it must, within 10 s):
 * its exit status and its log (malloc()ed). */
static int gateway_start_fails(const char *const *extra, char **log)
{
    char *gw = th_path(th_bin_dir(), "ringlm-gateway");
    char *tok = th_shared_file("models/tok512.bin");
    char *logp = th_path(gwh_dir(), "gateway.log");
    const char *argv[16] = {
        gw, "--listen", "127.0.0.1:0", "--socket", gwh_daemon.sock, "--tokenizer", tok};
    int n = 7;
    for (int i = 0; extra[i] && n < 15; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    th_proc_start(&gwh_gateway, argv, logp);
    int st = th_proc_wait(&gwh_gateway, 10000);
    *log = th_read_file(logp);
    free(gw);
    free(tok);
    free(logp);
    return st;
}

Test(gateway_hardening, api_keys_are_refused_at_start_when_the_daemon_ignores_tenant_tags)
{
    gwh_need();
    start_daemon_with(NULL); /* the built-in policy trusts no uid */
    /* the daemon says so at the handshake */
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(gwh_daemon.sock, &c), 0, "%s", ringlm_errdetail());
    cr_assert_eq(ringlm_tenant_tags_honoured(c), 0);
    const char *names[RINGLM_MAX_CLASSES];
    cr_assert_gt(ringlm_policy_classes(c, names, RINGLM_MAX_CLASSES), 0);
    ringlm_close(c);
    char *keys = gwh_keys(), *log;
    const char *extra[] = {"--api-keys", keys, NULL};
    int st = gateway_start_fails(extra, &log);
    cr_assert_eq(st, 1,
                 "the gateway with API keys in front of a daemon that ignores its tenant "
                 "tags did not refuse to start (status %d): %s",
                 st, log);
    char want[64];
    snprintf(want, sizeof want, "'uids = %u'", (unsigned)getuid());
    cr_assert(strstr(log, "[trust]") && strstr(log, want),
              "the refusal does not say what to "
              "put in the policy's [trust]: %s",
              log);
    free(log);
    /* without keys every request is the gateway's own tenant: that is served */
    const char *none[] = {NULL};
    gwh_start_gateway(none);
    gwh_wait_healthy(10000);
    free(keys);
}

Test(gateway_hardening, a_key_naming_a_class_the_policy_lacks_is_refused_at_start)
{
    gwh_need();
    char text[256];
    snprintf(text, sizeof text,
             "[scheduler]\ndefault_class = chat\ndefault_tenant = shared\n[class chat]\n"
             "priority = 1\n[class batch]\npriority = 0\n[tenant shared]\n[tenant carol]\n"
             "[trust]\nuids = %u\n",
             (unsigned)getuid());
    start_daemon_with(text);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(gwh_daemon.sock, &c), 0, "%s", ringlm_errdetail());
    cr_assert_eq(ringlm_tenant_tags_honoured(c), 1);
    const char *names[RINGLM_MAX_CLASSES];
    int n = ringlm_policy_classes(c, names, RINGLM_MAX_CLASSES);
    cr_assert(n == 2 && ((!strcmp(names[0], "chat") && !strcmp(names[1], "batch")) ||
                         (!strcmp(names[0], "batch") && !strcmp(names[1], "chat"))),
              "%d classes: %s %s", n, n > 0 ? names[0] : "", n > 1 ? names[1] : "");
    ringlm_close(c);
    char *keys = th_path(gwh_dir(), "keys.bad");
    FILE *f = fopen(keys, "w");
    fputs("sk-carol-00001 carol interactive\n", f);
    fclose(f);
    char *log;
    const char *extra[] = {"--api-keys", keys, NULL};
    int st = gateway_start_fails(extra, &log);
    cr_assert_eq(st, 1, "a key of class 'interactive' was accepted (status %d): %s", st, log);
    cr_assert(strstr(log, "'interactive'") && strstr(log, " chat") && strstr(log, " batch"),
              "the refusal does not name the class and the policy's classes: %s", log);
    free(log);
    free(keys);
}

Test(gateway_hardening, a_daemon_that_comes_later_and_ignores_tags_keeps_health_503)
{
    gwh_need();
    gwh_dir();
    char *keys = gwh_keys();
    const char *extra[] = {"--api-keys", keys, NULL};
    gwh_start_gateway(extra); /* no daemon yet: it starts and waits */
    start_daemon_with(NULL);
    uint64_t dl = th_now_ms() + 10000;
    char *body = NULL;
    int st = 0;
    while (th_now_ms() < dl) {
        free(body);
        body = th_http_get(gwh_port, "/health", &st, NULL, 0);
        if (body && strstr(body, "[trust]")) break;
        th_pause_ms(50);
    }
    cr_assert(st == 503 && body && strstr(body, "[trust]"),
              "/health %d, not 503 saying what to put in [trust]: %s", st, body ? body : "");
    free(body);
    free(keys);
}

/* ---- per-uid cache salting within a shared tenant ------------------------------------- */

/* A client of uid runs a 64-token prompt (the same every time) to its end; the prompt
 * tokens the daemon's prefix cache served it, or -1. */
static int cached_for_uid(uint32_t uid)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        if (setgid(uid) != 0 || setuid(uid) != 0) _exit(3);
        ringlm_client *c;
        int cached = -1;
        if (ringlm_connect(gwh_daemon.sock, &c) == 0) {
            int32_t prompt[64];
            for (int i = 0; i < 64; i++) prompt[i] = 5 + (i * 7) % 400;
            ringlm_request q;
            ringlm_request_init(&q);
            q.prompt = prompt;
            q.n_prompt = 64;
            q.max_new_tokens = 2;
            q.class_name = "";
            uint64_t id;
            ringlm_event ev;
            if (ringlm_submit(c, &q, &id) == 0)
                while (ringlm_next_event(c, &ev, 20000) == 1)
                    if (ev.kind == RINGLM_EV_FINISH && ev.req_id == id) {
                        cached = (int)ev.n_cached_tokens;
                        break;
                    }
            ringlm_close(c);
        }
        if (write(p[1], &cached, sizeof cached) != sizeof cached) _exit(4);
        _exit(0);
    }
    close(p[1]);
    int cached = -2;
    cr_assert(th_readable(p[0], 30000) && read(p[0], &cached, sizeof cached) == sizeof cached,
              "the client of uid %u did not answer", uid);
    close(p[0]);
    th_reap(pid, 10000);
    return cached;
}

static void two_uids_one_tenant(bool per_uid, int *first, int *other, int *again)
{
    gwh_need();
    if (geteuid() != 0) cr_skip_test("needs root to run clients as other uids");
    char text[256];
    snprintf(text, sizeof text,
             "[scheduler]\ndefault_class = chat\ndefault_tenant = shared\n[class chat]\n"
             "[tenant shared]\n%s",
             per_uid ? "cache_per_uid = yes\n" : "");
    start_daemon_with(text);
    cr_assert_eq(chmod(gwh_dir(), 0755), 0); /* other uids reach the socket */
    *first = cached_for_uid(30101);
    *other = cached_for_uid(30102);
    *again = cached_for_uid(30101);
}

Test(gateway_hardening, uids_sharing_a_default_tenant_share_its_cached_prefixes)
{
    int first, other, again;
    two_uids_one_tenant(false, &first, &other, &again);
    cr_assert_eq(first, 0);
    cr_assert_geq(other, 48, "a second uid of the shared tenant got %d cached tokens", other);
}

Test(gateway_hardening, cache_per_uid_gives_each_uid_of_a_tenant_its_own_cached_prefixes)
{
    int first, other, again;
    two_uids_one_tenant(true, &first, &other, &again);
    cr_assert_eq(first, 0);
    cr_assert_eq(other, 0, "uid 30102 was served %d tokens cached by uid 30101", other);
    cr_assert_geq(again, 48, "uid 30101's own prompt again: %d cached tokens", again);
}
