/* SPDX-License-Identifier: MIT */
/*
 * ringlmd end to end, robustness: bad requests are refused with reasons, a hostile client
 * disturbs no other, SIGTERM drains then exits 0, a client that stops reading is deferred
 * then cancelled without blocking others, bursts of connects to a busy daemon are all
 * answered. A real daemon process on a private socket, real client processes (fork +
 * libringlm) (tests/daemon_helpers.h); every test stops every process it starts and checks
 * that every KV block is accounted for.
 *
 * Env: RINGLM_BIN (programs, default build/bin), RINGLM_SHARED (default ../shared).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "ringlm.h"
#include "formats/stats.h"
#include "shm/ring.h"
#include "shm/wire.h"
#include "tests/daemon_helpers.h"
#include "tests/helpers.h"
#include "tools/prom.h"

TestSuite(daemon_robust, .timeout = 120);

/* ---- robustness ---------------------------------------------------------------------- */

typedef struct bad_job {
    const char *sock;
} bad_job;

/* Client process: requests that must be refused with a reason, then one good request. */
static int client_bad_inputs(void *arg)
{
    bad_job *b = arg;
    ringlm_client *c;
    int rc = ringlm_connect(b->sock, &c);
    if (rc < 0) return 2;
    static int32_t longp[600];
    for (int i = 0; i < 600; i++) longp[i] = 5 + i % 400;
    int32_t badtok[3] = {1, 9999, 7}, negtok[2] = {1, -4}, good[5] = {1, 403, 407, 261, 378};
    struct {
        const int32_t *p;
        uint32_t n;
        uint32_t max_new;
        float temp;
        const char *cls;
        int want;
    } cases[] = {
        {badtok, 3, 8, 0, NULL, RINGLM_R_BAD_TOKEN},
        {negtok, 2, 8, 0, NULL, RINGLM_R_BAD_TOKEN},
        {longp, 600, 8, 0, NULL, RINGLM_R_TOO_LONG},
        {good, 5, 100000u, 0, NULL, RINGLM_R_TOO_LONG},
        {good, 5, 8, 0, "nosuchclass", RINGLM_R_UNKNOWN_CLASS},
    };
    int n = (int)(sizeof cases / sizeof cases[0]), bad = 0;
    uint64_t ids[8];
    for (int i = 0; i < n; i++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = cases[i].p;
        r.n_prompt = cases[i].n;
        r.max_new_tokens = cases[i].max_new;
        r.temperature = cases[i].temp;
        r.class_name = cases[i].cls;
        rc = ringlm_submit(c, &r, &ids[i]);
        if (rc < 0) {
            fprintf(stderr, "bad case %d: submit refused locally: %s\n", i, ringlm_errdetail());
            ids[i] = 0;
        }
    }
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = good;
    r.n_prompt = 5;
    r.max_new_tokens = 16;
    r.tenant_tag = "mallory"; /* untrusted uid: ignored, not an error */
    uint64_t good_id;
    if (ringlm_submit(c, &r, &good_id) < 0) return 3;
    int left = n + 1, good_tokens = 0;
    for (int i = 0; i < n; i++)
        if (!ids[i]) left--;
    while (left > 0) {
        ringlm_event ev;
        rc = ringlm_next_event(c, &ev, 20000);
        if (rc <= 0) {
            fprintf(stderr, "bad inputs: next_event %d %s\n", rc, ringlm_errdetail());
            return 4;
        }
        if (ev.req_id == good_id) {
            if (ev.kind == RINGLM_EV_TOKEN)
                good_tokens++;
            else {
                left--;
                if (ev.finish_reason != RINGLM_FINISH_LENGTH &&
                    ev.finish_reason != RINGLM_FINISH_STOP) {
                    fprintf(stderr, "good request ended %s/%s\n",
                            ringlm_reason_name(ev.finish_reason),
                            ringlm_reason_name(ev.reject_reason));
                    bad++;
                }
            }
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (ids[i] != ev.req_id) continue;
            if (ev.kind != RINGLM_EV_FINISH || ev.finish_reason != RINGLM_FINISH_REJECTED ||
                ev.reject_reason != cases[i].want || ev.n_tokens != 0) {
                fprintf(stderr,
                        "bad case %d: got %s/%s (kind %d, %u tokens), expected rejected/%s\n", i,
                        ringlm_reason_name(ev.finish_reason), ringlm_reason_name(ev.reject_reason),
                        ev.kind, ev.n_tokens, ringlm_reason_name(cases[i].want));
                bad++;
            }
            left--;
        }
    }
    if (good_tokens == 0) bad++;
    ringlm_close(c);
    return bad ? 1 : 0;
}

Test(daemon_robust, bad_requests_rejected_with_reasons)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    /* This uid is tenant alice; nobody is trusted, so a tenant tag changes nothing. */
    char policy[256];
    snprintf(policy, sizeof policy,
             "[scheduler]\ndefault_tenant = other\n[tenant alice]\nuids = %u\n"
             "[tenant other]\n[tenant mallory]\n",
             (unsigned)getuid());
    dmn d;
    dmn_start(&d, model, policy, NULL);
    bad_job b = {d.sock};
    cr_expect_eq(reap(spawn(client_bad_inputs, &b), 30000), 0, "see the client's stderr above");
    assert_back_to_baseline(&d, 5000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    /* every bad case reaches the daemon and is rejected there (a parameter out of range
     * never does: ringlm_submit refuses it, see test_daemon_rejects.c) */
    cr_expect_geq(count_lines(d.declog, "\"ev\":\"reject\""), 5,
                  "rejects missing from the decision log");
    cr_expect_geq(count_lines(d.reqlog, "\"finish_reason\":\"rejected\""), 5,
                  "rejects missing from the request log");
    cr_expect_eq(count_lines(d.reqlog, "\"tenant\":\"mallory\""), 0,
                 "an untrusted uid's tenant tag was honoured");
    cr_expect_eq(count_lines(d.reqlog, "\"tenant\":\"alice\""), 6,
                 "requests not attributed to the uid's tenant");
    dmn_cleanup(&d);
}

/* A hostile client scribbles over its own segment (random indices, bad lengths, garbage
 * records) while a good client streams; the daemon ends the hostile sessions, stays up,
 * and the good stream is exactly the reference. */
static int raw_session(const char *path, struct ringlm_wire_cseg **cseg, size_t *len, int *sock)
{
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) < 0) return -1;
    struct ringlm_wire_hello h = {.magic = RINGLM_WIRE_MAGIC, .abi = RINGLM_WIRE_ABI};
    if (send(s, &h, sizeof h, MSG_NOSIGNAL) != sizeof h) return -1;
    struct ringlm_wire_welcome w;
    union {
        char buf[CMSG_SPACE(sizeof(int) * 3)];
        struct cmsghdr a;
    } ctl;
    struct iovec iov = {&w, sizeof w};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    if (recvmsg(s, &m, 0) != (ssize_t)sizeof w || w.status != 0) return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    void *p = mmap(NULL, w.cseg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return -1;
    *cseg = p;
    *len = w.cseg_bytes;
    *sock = s;
    return 0;
}

static int client_hostile(void *arg)
{
    const char *path = arg;
    srand((unsigned)getpid());
    for (int round = 0; round < 6; round++) {
        struct ringlm_wire_cseg *cs;
        size_t len;
        int sock;
        if (raw_session(path, &cs, &len, &sock) < 0) continue;
        unsigned char *data = (unsigned char *)cs + cs->hdr.data_off;
        size_t dbytes = cs->hdr.data_bytes < len - cs->hdr.data_off ? cs->hdr.data_bytes
                                                                    : len - cs->hdr.data_off;
        switch (round % 3) {
        case 0: /* an index far beyond the ring */
            __atomic_store_n(&cs->submit_prod, (uint64_t)rand() << 32 | 77, __ATOMIC_RELEASE);
            break;
        case 1: { /* a record whose length is not a multiple of 8 and bigger than written */
            struct ringlm_wire_rec_hdr h = {.len = 13, .type = RINGLM_WIRE_REC_REQUEST};
            memcpy(data, &h, sizeof h);
            __atomic_store_n(&cs->submit_prod, 16, __ATOMIC_RELEASE);
            break;
        }
        default: /* garbage records */
            for (size_t i = 0; i < 4096 && i < dbytes; i++) data[i] = (unsigned char)rand();
            __atomic_store_n(&cs->submit_prod, 4096, __ATOMIC_RELEASE);
            __atomic_store_n(&cs->ev_cons, (uint64_t)rand(), __ATOMIC_RELEASE);
            break;
        }
        __atomic_add_fetch(&cs->doorbell, 1, __ATOMIC_SEQ_CST);
        futex_wake(&cs->doorbell, 1, FUTEX_SCOPE_SHARED);
        /* The daemon ends the session: the socket reaches EOF. */
        char b;
        struct timeval tv = {5, 0};
        setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ssize_t r = recv(sock, &b, 1, 0);
        munmap(cs, len);
        close(sock);
        if (r != 0) {
            fprintf(stderr, "hostile round %d: session not ended (recv %zd)\n", round, r);
            return 1;
        }
    }
    return 0;
}

Test(daemon_robust, hostile_client_does_not_disturb_others)
{
    char model[512];
    static ref_case cases[12];
    int n = need_stories_refs(model, sizeof model, cases, 12, 1);
    dmn d;
    dmn_start(&d, model, NULL, NULL);
    gen_job g = {.sock = d.sock, .cases = cases, .n_cases = n};
    pid_t good = spawn(client_greedy, &g);
    pid_t evil = spawn(client_hostile, d.sock);
    cr_expect_eq(reap(evil, 60000), 0, "hostile sessions were not ended by the daemon");
    cr_expect_eq(reap(good, 60000), 0, "the good client's stream was disturbed");
    /* Still serving. */
    pid_t again = spawn(client_greedy, &g);
    cr_expect_eq(reap(again, 60000), 0);
    assert_back_to_baseline(&d, 5000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}

/* SIGTERM drains: in-flight requests finish or are cancelled (reason draining) within the
 * grace period, new work is refused, clients see a clear end, the daemon exits 0. */
typedef struct drain_job {
    const char *sock;
    int ready_fd;
    const char *out;
} drain_job;

static int client_drain(void *arg)
{
    drain_job *dj = arg;
    ringlm_client *c;
    if (ringlm_connect(dj->sock, &c) < 0) return 2;
    int32_t p[4] = {1, 403, 407, 261};
    enum { N = 32 };
    uint64_t ids[N];
    for (int i = 0; i < N; i++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = p;
        r.n_prompt = 4;
        r.max_new_tokens = 500;
        r.temperature = 0.8f;
        r.seed = (uint64_t)i + 1;
        if (ringlm_submit(c, &r, &ids[i]) < 0) return 3;
    }
    int finished = 0, cancelled = 0, completed = 0, other = 0;
    bool ready = false;
    int end_rc = 0;
    uint64_t t_last_finish = 0;
    for (;;) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 15000);
        if (rc == 0) {
            end_rc = -ETIMEDOUT;
            break;
        }
        if (rc < 0) {
            end_rc = rc;
            break;
        }
        if (ev.kind == RINGLM_EV_TOKEN && !ready) {
            if (write(dj->ready_fd, "r", 1) != 1) { /* parent gone */
            }
            ready = true;
        }
        if (ev.kind == RINGLM_EV_FINISH) {
            finished++;
            t_last_finish = th_now_ms();
            /* Cancelled by the drain, or (read from the ring only after the drain began)
             * refused by it: both say "draining". */
            if ((ev.finish_reason == RINGLM_FINISH_CANCELLED ||
                 ev.finish_reason == RINGLM_FINISH_REJECTED) &&
                ev.reject_reason == RINGLM_R_DRAINING)
                cancelled++;
            else if (ev.finish_reason == RINGLM_FINISH_LENGTH ||
                     ev.finish_reason == RINGLM_FINISH_STOP)
                completed++;
            else
                other++;
        }
    }
    uint64_t end_after = th_now_ms() - t_last_finish;
    /* A submit after the end is refused, never hangs. */
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = p;
    r.n_prompt = 4;
    int sub = ringlm_submit(c, &r, NULL);
    FILE *f = fopen(dj->out, "w");
    if (f) {
        fprintf(f, "%d %d %d %d %d %d %llu\n", finished, completed, cancelled, other, end_rc, sub,
                (unsigned long long)end_after);
        fclose(f);
    }
    ringlm_close(c);
    return 0;
}

Test(daemon_robust, sigterm_drains_then_exits_zero)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    const char *extra[] = {"--drain-grace-ms", "300", NULL};
    dmn d;
    dmn_start(&d, model, NULL, extra);
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    char out[160];
    snprintf(out, sizeof out, "%s/drain.txt", d.dir);
    drain_job dj = {d.sock, pfd[1], out};
    pid_t c = spawn(client_drain, &dj);
    close(pfd[1]);
    char b;
    cr_assert_eq(read(pfd[0], &b, 1), 1, "client never got a token");
    close(pfd[0]);
    uint64_t t0 = th_now_ms();
    kill(d.pid, SIGTERM);
    /* The signal lands asynchronously: wait until the daemon says it is draining. */
    uint64_t dl = th_now_ms() + 3000;
    for (;;) {
        json_t *st = dmn_stats(&d);
        bool draining = st && json_is_true(json_object_get(st, "draining"));
        json_decref(st);
        if (draining || th_now_ms() > dl) break;
        th_pause_ms(2);
    }
    /* While draining, a new client is refused at once (or finds the daemon gone). */
    ringlm_client *late;
    int rc = ringlm_connect(d.sock, &late);
    if (rc == 0) {
        int32_t p[2] = {1, 403};
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = p;
        r.n_prompt = 2;
        uint64_t id;
        int s = ringlm_submit(late, &r, &id);
        if (s == 0) {
            ringlm_event ev;
            int e = ringlm_next_event(late, &ev, 5000);
            cr_expect(e < 0 ||
                          (ev.kind == RINGLM_EV_FINISH && ev.reject_reason == RINGLM_R_DRAINING),
                      "a request during the drain was not refused (rc %d, reason %d/%d)", e,
                      ev.finish_reason, ev.reject_reason);
        } else {
            cr_expect(s == -ESHUTDOWN || s == -EPIPE || s == -ECONNRESET,
                      "submit while draining: %d", s);
        }
        ringlm_close(late);
    } else {
        /* Refused by the draining daemon (ESHUTDOWN), or it finished its drain and exited while
         * this connect was under way: before it (ENOENT, ECONNREFUSED), after accepting it and
         * before the hello was sent (its exit closes the accepted socket: the hello's send gets
         * EPIPE; seen at load 15, this process having lost the CPU between the two calls) or
         * before answering (ECONNRESET). */
        cr_expect(rc == -ESHUTDOWN || rc == -ECONNREFUSED || rc == -ENOENT || rc == -ECONNRESET ||
                      rc == -EPIPE,
                  "connect while draining: %d %s (%s)", rc, ringlm_strerror(rc),
                  ringlm_errdetail());
    }
    int ex = dmn_stop(&d, 0, 5000); /* signal 0: just wait for the exit */
    uint64_t took = th_now_ms() - t0;
    cr_expect_eq(ex, 0, "ringlmd exit status %d after SIGTERM", ex);
    cr_expect_leq(took, 3000, "drain took %llu ms with a 300 ms grace", (unsigned long long)took);
    cr_expect_eq(reap(c, 20000), 0);
    int fin = 0, comp = 0, canc = 0, oth = 0, end_rc = 0, sub = 0;
    unsigned long long end_after = 0;
    FILE *f = fopen(out, "r");
    cr_assert_not_null(f);
    cr_assert_eq(
        fscanf(f, "%d %d %d %d %d %d %llu", &fin, &comp, &canc, &oth, &end_rc, &sub, &end_after),
        7);
    fclose(f);
    cr_log_info("drain: %d finished (%d completed, %d cancelled: draining), client saw %s %llu ms "
                "after its last event; daemon gone %llu ms after SIGTERM",
                fin, comp, canc, ringlm_strerror(end_rc), end_after, (unsigned long long)took);
    cr_expect_eq(fin, 32, "every request must get its FINISH before the session ends");
    cr_expect_eq(oth, 0);
    cr_expect(end_rc == -EPIPE || end_rc == -ECONNRESET, "the client saw %s, not a clear end",
              ringlm_strerror(end_rc));
    cr_expect_lt(sub, 0, "submit after the daemon left returned %d", sub);
    dmn_cleanup(&d);
}

/* The backpressure tests' stuck client: its three requests are cancelled for backpressure
 * in the decision log (within 10 s). */
static void await_backpressure_cancels(dmn *d)
{
    uint64_t deadline = th_now_ms() + 10000;
    int bp = 0;
    while ((bp = count_lines(d->declog, "\"reason\":\"backpressure\"")) < 3 &&
           th_now_ms() < deadline)
        th_pause_ms(2);
    cr_expect_eq(bp, 3, "expected 3 backpressure cancels in the decision log, got %d", bp);
}

/* Lets the stuck client read (go_fd), then checks what it got: all three requests
 * cancelled output_backpressure with their tokens whole and in order; the daemon back to
 * its baseline and stopped. */
static void release_stuck_client_expect_cancelled(dmn *d, pid_t ps, int go_fd, const char *out)
{
    if (write(go_fd, "go", 1) != 1) cr_assert_fail("stuck client gone");
    close(go_fd);
    cr_expect_eq(reap(ps, 30000), 0);
    static result_line R[8];
    int k = read_results(out, R, 8);
    cr_assert_eq(k, 3);
    for (int i = 0; i < k; i++) {
        cr_expect_eq(R[i].reason, RINGLM_FINISH_CANCELLED, "stuck request %d ended %d/%d", i,
                     R[i].reason, R[i].cause);
        cr_expect_eq(R[i].cause, RINGLM_R_OUTPUT_BACKPRESSURE, "stuck request %d cause %d", i,
                     R[i].cause);
        cr_expect_eq(R[i].index_error, 0, "stuck request %d: tokens lost or out of order (got %u)",
                     i, R[i].n_tokens);
        cr_expect_gt(R[i].n_tokens, 0);
    }
    assert_back_to_baseline(d, 5000);
    cr_expect_eq(dmn_stop(d, SIGTERM, 10000), 0);
    dmn_cleanup(d);
}

/* A client that stops reading: its requests are deferred (output_backpressure) then
 * cancelled after the timeout, nothing it was sent is lost, and others are not blocked. */
Test(daemon_robust, backpressure_defers_then_cancels_without_blocking_others)
{
    char model[512];
    static ref_case cases[12];
    need_stories_refs(model, sizeof model, cases, 12, 4);
    const char *extra[] = {"--event-ring-slots", "64", "--backpressure-timeout-ms", "300", NULL};
    dmn d;
    dmn_start(&d, model, NULL, extra);
    int wfd[2];
    cr_assert_eq(pipe(wfd), 0);
    char out[160];
    snprintf(out, sizeof out, "%s/stuck.txt", d.dir);
    load_job stuck = {.sock = d.sock,
                      .n_requests = 3,
                      .concurrency = 3,
                      .prompt_len = 8,
                      .max_new = 400,
                      .token_base = 9,
                      .vocab = 512,
                      .out_path = out,
                      .ready_fd = -1,
                      .never_read = true,
                      .wait_fd = wfd[0]};
    pid_t ps = spawn(client_load, &stuck);
    close(wfd[0]);
    gen_job g = {.sock = d.sock, .cases = cases, .n_cases = 4};
    uint64_t t0 = th_now_ms();
    cr_expect_eq(reap(spawn(client_greedy, &g), 60000), 0, "the reading client was disturbed");
    cr_log_info("reading client done in %llu ms", (unsigned long long)(th_now_ms() - t0));
    /* Wait for the three backpressure cancels in the decision log. */
    await_backpressure_cancels(&d);
    int defers = count_lines(d.declog, "output_backpressure");
    cr_expect_geq(defers, 1, "no defer with reason output_backpressure");
    release_stuck_client_expect_cancelled(&d, ps, wfd[1], out);
}

/* The same, with the order fixed that the test above leaves to chance: the client submits
 * one request, stops reading, and submits two more only once the daemon has deferred the
 * first (its session blocked). All three are answered alike — cancelled
 * output_backpressure with their tokens in order — not the two later ones left unread in
 * the submit ring to run to their length once the client reads again. */
Test(daemon_robust, backpressure_answers_requests_submitted_after_the_client_stopped_reading)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    const char *extra[] = {"--event-ring-slots", "64", "--backpressure-timeout-ms", "300", NULL};
    dmn d;
    dmn_start(&d, model, NULL, extra);
    int wfd[2], gfd[2];
    cr_assert_eq(pipe(wfd), 0);
    cr_assert_eq(pipe(gfd), 0);
    char out[160];
    snprintf(out, sizeof out, "%s/stuck.txt", d.dir);
    load_job stuck = {.sock = d.sock,
                      .n_requests = 3,
                      .concurrency = 3,
                      .prompt_len = 8,
                      .max_new = 400,
                      .token_base = 9,
                      .vocab = 512,
                      .out_path = out,
                      .ready_fd = -1,
                      .never_read = true,
                      .wait_fd = wfd[0],
                      .gate_after = 1,
                      .gate_fd = gfd[0]};
    pid_t ps = spawn(client_load, &stuck);
    close(wfd[0]);
    close(gfd[0]);
    uint64_t deadline = th_now_ms() + 10000;
    while (count_lines(d.declog, "output_backpressure") < 1 && th_now_ms() < deadline)
        th_pause_ms(2);
    cr_assert_geq(count_lines(d.declog, "output_backpressure"), 1,
                  "the first request was never deferred");
    if (write(gfd[1], "g", 1) != 1) cr_assert_fail("stuck client gone");
    close(gfd[1]);
    await_backpressure_cancels(&d);
    release_stuck_client_expect_cancelled(&d, ps, wfd[1], out);
}

/* ---- connects to a busy daemon -------------------------------------------------------- */

typedef struct burst_rec {
    int rc;    /* 0: connected and a request answered; else the failing -errno */
    int stage; /* 1 connect, 2 submit, 3 event */
    double connect_ms;
} burst_rec;

typedef struct burst_job {
    const char *sock;
    int ready_fd, gate_fd, out_fd;
} burst_job;

/* Says ready, waits at the gate (its EOF releases every client at once), connects (timed)
 * and has one short request answered on the new session. */
static int client_burst(void *arg)
{
    burst_job *b = arg;
    if (write(b->ready_fd, "r", 1) != 1) return 1;
    char ch;
    while (read(b->gate_fd, &ch, 1) > 0) {}
    burst_rec rec = {0, 1, 0};
    ringlm_client *c = NULL;
    uint64_t t0 = th_now_us();
    rec.rc = ringlm_connect(b->sock, &c);
    rec.connect_ms = (double)(th_now_us() - t0) / 1000.0;
    if (rec.rc == 0) {
        int32_t p[2] = {1, 403};
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = p;
        r.n_prompt = 2;
        r.max_new_tokens = 2;
        rec.stage = 2;
        rec.rc = ringlm_submit(c, &r, NULL);
        ringlm_event ev = {0};
        if (rec.rc == 0) {
            rec.stage = 3;
            while ((rec.rc = ringlm_next_event(c, &ev, 30000)) == 1 &&
                   ev.kind != RINGLM_EV_FINISH) {}
            rec.rc = rec.rc == 1 ? 0 : rec.rc == 0 ? -ETIMEDOUT : rec.rc;
        }
        ringlm_close(c);
    }
    if (rec.rc)
        fprintf(stderr, "burst client: stage %d: %s %s\n", rec.stage, ringlm_strerror(rec.rc),
                ringlm_errdetail());
    return write(b->out_fd, &rec, sizeof rec) == (ssize_t)sizeof rec ? 0 : 1;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* 64 client processes connect at once while the daemon runs 16 streams: every one gets its
 * session and an answer (a handshake waits for no engine step, and the half-open budget is
 * not spent by clients whose hello is on its way). The connect latency is reported, not
 * asserted (speed is perf/serve_bench's). */
Test(daemon_robust, connect_burst_of_64_to_a_busy_daemon_all_succeed)
{
    need_daemon_binary();
    char model[512];
    if (!stories_path(model, sizeof model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    /* 64 burst sessions and the streams' one, all of this uid; all 64 may be half-open at
     * once (their hellos late on a loaded machine): past the per-uid grace bound (default 8,
     * 0f3c78a) a late hello's connection is refused, by design — 58 of 64 connected at load 18 */
    const char *extra[] = {"--max-sessions-per-uid", "80", "--max-half-open-per-uid", "64", NULL};
    dmn d;
    dmn_start(&d, model, NULL, extra);
    int rfd[2];
    cr_assert_eq(pipe(rfd), 0);
    load_job busy = {.sock = d.sock,
                     .n_requests = 0,
                     .concurrency = 16,
                     .prompt_len = 8,
                     .max_new = 400,
                     .token_base = 5,
                     .vocab = 512,
                     .duration_ms = 120000,
                     .ready_fd = rfd[1]};
    pid_t pb = spawn(client_load, &busy);
    close(rfd[1]);
    char ch;
    cr_assert_eq(read(rfd[0], &ch, 1), 1, "the streams never produced a token");
    close(rfd[0]);

    enum { N = 64 };
    int ready[2], gate[2], out[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(gate), 0);
    cr_assert_eq(pipe(out), 0);
    burst_job bj = {.sock = d.sock, .ready_fd = ready[1], .gate_fd = gate[0], .out_fd = out[1]};
    pid_t pids[N];
    for (int i = 0; i < N; i++) {
        /* the children must not hold the gate open themselves */
        fflush(NULL);
        pids[i] = fork();
        cr_assert_geq(pids[i], 0);
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(gate[1]);
            close(ready[0]);
            close(out[0]);
            _exit(client_burst(&bj));
        }
    }
    close(ready[1]);
    close(gate[0]);
    close(out[1]);
    int n_ready = 0;
    while (n_ready < N && read(ready[0], &ch, 1) == 1) n_ready++;
    cr_assert_eq(n_ready, N);
    close(gate[1]); /* all at once */
    burst_rec rec;
    double lat[N];
    int n = 0, ok = 0;
    while (n < N && read(out[0], &rec, sizeof rec) == (ssize_t)sizeof rec) {
        lat[n++] = rec.connect_ms;
        ok += rec.rc == 0;
    }
    close(ready[0]);
    close(out[0]);
    for (int i = 0; i < N; i++) cr_expect_eq(reap(pids[i], 30000), 0, "burst client %d", i);
    kill(pb, SIGKILL);
    reap(pb, 10000);
    cr_expect_eq(n, N, "%d burst clients reported", n);
    cr_expect_eq(ok, N, "%d of %d burst clients connected and were answered", ok, N);
    if (n > 0) {
        qsort(lat, (size_t)n, sizeof lat[0], cmp_dbl);
        int k99 = (int)(0.99 * (n - 1) + 0.999);
        cr_log_info(
            "64 connects to a daemon busy with 16 streams: %d connected; connect p50 %.2f ms, "
            "p99 %.2f ms, max %.2f ms",
            ok, lat[n / 2], lat[k99 < n ? k99 : n - 1], lat[n - 1]);
    }
    assert_back_to_baseline(&d, 10000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}

/* Clients connecting while the engine runs one long step (a prefill of 16 prompts of 240
 * tokens on the stories15M shape: seconds on this VM) get their sessions within it — the
 * loop's handshake thread answers them — instead of after it: without it the first connect
 * of the step returns only after the step's tokens are published.  The sessions opened
 * during the step work. */
Test(daemon_robust, connects_during_a_long_engine_step_are_answered_within_it, .timeout = 240)
{
    need_daemon_binary();
    /* nice 0, not the default -10: seconds of a step at -10 on both vCPUs would starve the
     * clients of a test running beside this one */
    const char *extra[] = {"--max-sessions-per-uid", "80", "--nice", "0", NULL};
    dmn d;
    dmn_start(&d, "synthetic:stories15M:1", NULL, extra);
    enum { A = 16, PROMPT = 240, B = 24 };
    ringlm_client *a;
    cr_assert_eq(ringlm_connect(d.sock, &a), 0, "%s", ringlm_errdetail());
    static int32_t prompt[A][PROMPT];
    for (int i = 0; i < A; i++) {
        for (int k = 0; k < PROMPT; k++) prompt[i][k] = 3 + (i * 7919 + k * 104729) % 4000;
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = prompt[i];
        r.n_prompt = PROMPT;
        r.max_new_tokens = 1;
        cr_assert_eq(ringlm_submit(a, &r, NULL), 0, "%s", ringlm_errdetail());
    }
    ringlm_client *b[B];
    int opened = 0, first_event_seen = 0;
    ringlm_event ev;
    while (opened < B) {
        int r = ringlm_connect(d.sock, &b[opened]);
        cr_assert_eq(r, 0, "connect %d during the step: %s", opened, ringlm_errdetail());
        opened++;
        r = ringlm_next_event(a, &ev, 0);
        cr_assert_geq(r, 0, "%s", ringlm_errdetail());
        if (r == 1) {
            first_event_seen = 1;
            break;
        }
    }
    cr_log_info("%d connects answered before the long step's first token (%s)",
                opened - first_event_seen, first_event_seen ? "then it came" : "all of them");
    /* Without the handshake thread the first connect made while the step runs returns only
     * after it, so at most the one connect made before the loop took up the submits is
     * answered first.  The bound is 3, not more: a loaded host slows each connect as much
     * as the step (5 of them in a full make test at load 15, 24 when quiet). */
    cr_expect_geq(opened - first_event_seen, 3,
                  "only %d of the connects made during the step were answered before it ended",
                  opened - first_event_seen);
    /* the step's requests all finish; a session opened during it is served */
    int finished = first_event_seen && ev.kind == RINGLM_EV_FINISH;
    while (finished < A) {
        int r = ringlm_next_event(a, &ev, 60000);
        cr_assert_eq(r, 1, "the long step's requests did not finish: %s", ringlm_errdetail());
        finished += ev.kind == RINGLM_EV_FINISH;
    }
    int32_t p2[2] = {1, 403};
    ringlm_request r2;
    ringlm_request_init(&r2);
    r2.prompt = p2;
    r2.n_prompt = 2;
    r2.max_new_tokens = 2;
    cr_assert_eq(ringlm_submit(b[0], &r2, NULL), 0, "%s", ringlm_errdetail());
    int rc;
    while ((rc = ringlm_next_event(b[0], &ev, 30000)) == 1 && ev.kind != RINGLM_EV_FINISH) {}
    cr_expect_eq(rc, 1, "a session opened during the step got no answer: %s", ringlm_errdetail());
    for (int i = 0; i < opened; i++) ringlm_close(b[i]);
    ringlm_close(a);
    assert_back_to_baseline(&d, 10000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}
