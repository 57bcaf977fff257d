/* SPDX-License-Identifier: MIT */
/*
 * Transport end to end with real processes: `$RINGLM_BIN/ringlmd --echo` on a private
 * socket, clients in forked processes, hostile clients that speak the wire format by
 * hand (shm/wire.h) to scribble into their own segment.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <stddef.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ringlm.h"
#include "common/futex.h"
#include "shm/wire.h"
#include "tests/helpers.h"

#if defined(__SANITIZE_ADDRESS__)
/* Criterion's parallel runner (--jobs 2) leaks 48 bytes of its own bookkeeping on some
 * runs; that is not ours to report.  LSan asks the executable for suppressions here. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libcriterion.so\n";
}
#endif

/* ---- helpers ---------------------------------------------------------------------------- */
/* The daemon of a test: tests/helpers.c starts and stops it. */
struct daemon {
    th_daemon th;
    pid_t pid;
    char sock[100];
};

/* Starts ringlmd --echo with extra args on a private socket; waits until it accepts. */
/* Socket fds the daemon holds: its listener plus one per live session. */
static int daemon_socket_fds(struct daemon *d)
{
    char dirp[64], linkp[320], target[128];
    snprintf(dirp, sizeof(dirp), "/proc/%d/fd", (int)d->pid);
    DIR *dir = opendir(dirp);
    if (!dir) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.') continue;
        snprintf(linkp, sizeof(linkp), "%s/%s", dirp, e->d_name);
        ssize_t len = readlink(linkp, target, sizeof(target) - 1);
        if (len > 0 && !strncmp(target, "socket:", 7)) n++;
    }
    closedir(dir);
    return n;
}

static void daemon_start(struct daemon *d, const char *const *extra)
{
    const char *args[32] = {"--echo"};
    int n = 1;
    for (int i = 0; extra && extra[i] && n < 31; i++) args[n++] = extra[i];
    args[n] = NULL;
    th_daemon_init(&d->th);
    chmod(d->th.dir, 0755); /* other-uid tests connect through it */
    th_daemon_start(&d->th, args, 5000);
    d->pid = d->th.pid;
    snprintf(d->sock, sizeof(d->sock), "%s", d->th.sock);
    /* The probe connection of the start is torn down by the daemon asynchronously; tests
	 * take fd baselines, so wait until the listener is its only socket again. */
    uint64_t deadline = th_now_ms() + 5000;
    int sockets;
    while ((sockets = daemon_socket_fds(d)) != 1) {
        cr_assert(th_now_ms() < deadline, "ringlmd still holds %d sockets after the start probe",
                  sockets);
        usleep(2000);
    }
}

static int daemon_alive(struct daemon *d)
{
    int st;
    return waitpid(d->pid, &st, WNOHANG) == 0;
}

static void daemon_stop(struct daemon *d)
{
    if (d->pid <= 0) d->th.pid = 0; /* the test stopped and reaped it */
    th_daemon_stop(&d->th, SIGTERM, 5000);
    d->pid = -1;
    th_daemon_cleanup(&d->th);
}

static int count_dir(const char *path, const char *prefix)
{
    DIR *dir = opendir(path);
    if (!dir) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)))
        if (e->d_name[0] != '.' && (!prefix || !strncmp(e->d_name, prefix, strlen(prefix)))) n++;
    closedir(dir);
    return n;
}

/* ringlm entries of /dev/shm other than the KV tier's (ringlm-kvtier-* lives there on
 * purpose; other processes on the machine, Criterion among them, come and go there too);
 * and whether the daemon holds any /dev/shm file open or mapped (sessions are memfds). */
static int shm_entries(void)
{
    DIR *dir = opendir("/dev/shm");
    if (!dir) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)))
        if (!strncmp(e->d_name, "ringlm", 6) && !strstr(e->d_name, "kvtier")) n++;
    closedir(dir);
    return n;
}

static char shm_culprit[1024];

static int daemon_uses_dev_shm(pid_t pid)
{
    char p[64], line[512];
    snprintf(p, sizeof(p), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(p, "r");
    if (f) {
        while (fgets(line, sizeof(line), f))
            if (strstr(line, "/dev/shm/")) {
                snprintf(shm_culprit, sizeof(shm_culprit), "%s", line);
                fclose(f);
                return 1;
            }
        fclose(f);
    }
    snprintf(p, sizeof(p), "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(p);
    if (!dir) return 0;
    struct dirent *e;
    int found = 0;
    while ((e = readdir(dir))) {
        char fp[384], target[512];
        if (atoi(e->d_name) <= 2) continue; /* stdio: the test harness's business */
        snprintf(fp, sizeof(fp), "%s/%s", p, e->d_name);
        ssize_t n = readlink(fp, target, sizeof(target) - 1);
        if (n > 0) {
            target[n] = 0;
            if (strstr(target, "/dev/shm/")) {
                snprintf(shm_culprit, sizeof(shm_culprit), "fd %s -> %s", e->d_name, target);
                found = 1;
            }
        }
    }
    closedir(dir);
    return found;
}

static int daemon_fds(struct daemon *d)
{
    char p[64];
    snprintf(p, sizeof(p), "/proc/%d/fd", (int)d->pid);
    return count_dir(p, NULL);
}

/* Lines of /proc/<pid>/maps that map a ringlm memfd. */
static int daemon_memfd_maps(struct daemon *d)
{
    char p[64], line[512];
    snprintf(p, sizeof(p), "/proc/%d/maps", (int)d->pid);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    int n = 0;
    while (fgets(line, sizeof(line), f))
        if (strstr(line, "memfd:ringlm")) n++;
    fclose(f);
    return n;
}

/* Polls until f(d) == want or 3 s pass; returns the last value. */
static int wait_value(struct daemon *d, int (*f)(struct daemon *), int want)
{
    uint64_t deadline = th_now_ms() + 3000;
    int v;
    while ((v = f(d)) != want && th_now_ms() < deadline) usleep(2000);
    return v;
}

static ringlm_client *must_connect(struct daemon *d)
{
    ringlm_client *c = NULL;
    int r = ringlm_connect(d->sock, &c);
    cr_assert_eq(r, 0, "connect %s: %s (%s)", d->sock, ringlm_strerror(r), ringlm_errdetail());
    return c;
}

static uint64_t submit_simple(ringlm_client *c, const int32_t *prompt, uint32_t n, uint32_t max_new)
{
    ringlm_request q;
    ringlm_request_init(&q);
    q.prompt = prompt;
    q.n_prompt = n;
    q.max_new_tokens = max_new;
    uint64_t id = 0;
    int r = ringlm_submit(c, &q, &id);
    cr_assert_eq(r, 0, "submit: %s (%s)", ringlm_strerror(r), ringlm_errdetail());
    return id;
}

/* One request round trip; returns 0 or a description of what was wrong. */
static const char *roundtrip(ringlm_client *c, int32_t tok, uint32_t max_new)
{
    ringlm_request q;
    ringlm_request_init(&q);
    q.prompt = &tok;
    q.n_prompt = 1;
    q.max_new_tokens = max_new;
    uint64_t id;
    if (ringlm_submit(c, &q, &id) < 0) return "submit failed";
    for (uint32_t i = 0; i < max_new; i++) {
        ringlm_event ev;
        if (ringlm_next_event(c, &ev, 5000) != 1) return "no token event";
        if (ev.kind != RINGLM_EV_TOKEN || ev.req_id != id || ev.token != tok || ev.index != i)
            return "wrong token event";
    }
    ringlm_event ev;
    if (ringlm_next_event(c, &ev, 5000) != 1 || ev.kind != RINGLM_EV_FINISH || ev.req_id != id ||
        ev.finish_reason != RINGLM_FINISH_LENGTH || ev.n_tokens != max_new)
        return "wrong finish event";
    return NULL;
}

TestSuite(transport, .timeout = 60);

/* ---- basic -------------------------------------------------------------------------- */
Test(transport, echo_roundtrip_finish_carries_policy_hash)
{
    struct daemon d;
    daemon_start(&d, NULL);
    ringlm_client *c = must_connect(&d);
    int32_t p[3] = {11, 22, 33};
    uint64_t id = submit_simple(c, p, 3, 7);
    cr_assert_eq(id, 1);
    ringlm_event ev;
    for (uint32_t i = 0; i < 7; i++) {
        cr_assert_eq(ringlm_next_event(c, &ev, 5000), 1, "event %u: %s", i, ringlm_errdetail());
        cr_assert_eq(ev.kind, RINGLM_EV_TOKEN);
        cr_assert_eq(ev.token, p[i % 3], "token %u is %d", i, ev.token);
        cr_assert_eq(ev.index, i);
    }
    cr_assert_eq(ringlm_next_event(c, &ev, 5000), 1);
    cr_assert_eq(ev.kind, RINGLM_EV_FINISH);
    cr_assert_eq(ev.finish_reason, RINGLM_FINISH_LENGTH, "reason %s",
                 ringlm_reason_name(ev.finish_reason));
    cr_assert_eq(ev.n_tokens, 7);
    cr_assert_eq(ev.policy_hash, 0xec40ec40ec40ec40ull, "policy hash %llx",
                 (unsigned long long)ev.policy_hash);
    cr_assert_eq(ringlm_policy_hash(c), 0xec40ec40ec40ec40ull);
    cr_assert_eq(ringlm_next_event(c, &ev, 0), 0, "no more events");
    cr_assert_str_eq(ringlm_reason_name(RINGLM_R_QUEUE_FULL), "queue_full");
    ringlm_close(c);
    daemon_stop(&d);
}

Test(transport, cancel_and_invalid_requests)
{
    struct daemon d;
    daemon_start(&d, (const char *const[]){"--event-ring-slots", "64", NULL});
    ringlm_client *c = must_connect(&d);
    int32_t p[1] = {5};
    ringlm_request q;
    ringlm_request_init(&q);
    q.prompt = p;
    q.n_prompt = 1;
    q.temperature = -1;
    uint64_t id;
    cr_assert_eq(ringlm_submit(c, &q, &id), -EINVAL);
    cr_assert(strstr(ringlm_errdetail(), "temperature"), "detail: %s", ringlm_errdetail());
    q.temperature = 0;
    q.class_name = "a-class-name-far-too-long";
    cr_assert_eq(ringlm_submit(c, &q, &id), -EINVAL);
    cr_assert(strstr(ringlm_errdetail(), "class_name"), "detail: %s", ringlm_errdetail());
    cr_assert_eq(ringlm_cancel(c, 0), -EINVAL);

    /* A long request fills the 64-slot ring; cancel it, then drain: FINISH(cancelled). */
    id = submit_simple(c, p, 1, 100000000);
    cr_assert_eq(ringlm_cancel(c, id), 0);
    ringlm_event ev;
    uint32_t tokens = 0;
    for (;;) {
        cr_assert_eq(ringlm_next_event(c, &ev, 5000), 1, "%s", ringlm_errdetail());
        if (ev.kind == RINGLM_EV_FINISH) break;
        tokens++;
    }
    cr_assert_eq(ev.finish_reason, RINGLM_FINISH_CANCELLED, "reason %s after %u tokens",
                 ringlm_reason_name(ev.finish_reason), tokens);
    cr_assert_eq(ev.n_tokens, tokens);
    cr_assert_null(roundtrip(c, 9, 3));
    ringlm_close(c);
    daemon_stop(&d);
}

Test(transport, deadline_times_out)
{
    struct daemon d;
    daemon_start(&d, (const char *const[]){"--event-ring-slots", "64", NULL});
    ringlm_client *c = must_connect(&d);
    int32_t p[1] = {5};
    ringlm_request q;
    ringlm_request_init(&q);
    q.prompt = p;
    q.n_prompt = 1;
    q.max_new_tokens = 1000;
    q.deadline_us = 20000;
    uint64_t id;
    cr_assert_eq(ringlm_submit(c, &q, &id), 0);
    /* Do not read for 100 ms: the ring holds 62 tokens, the deadline passes. */
    usleep(100000);
    ringlm_event ev;
    do cr_assert_eq(ringlm_next_event(c, &ev, 5000), 1, "%s", ringlm_errdetail());
    while (ev.kind != RINGLM_EV_FINISH);
    cr_assert_eq(ev.finish_reason, RINGLM_FINISH_TIMEOUT, "reason %s",
                 ringlm_reason_name(ev.finish_reason));
    cr_assert_lt(ev.n_tokens, 1000);
    ringlm_close(c);
    daemon_stop(&d);
}

/* ---- many clients ------------------------------------------------------------------- */
Test(transport, many_clients_at_once)
{
    struct daemon d;
    daemon_start(&d, NULL);
    enum { NCLIENTS = 16, REQS = 300 };
    pid_t kids[NCLIENTS];
    for (int k = 0; k < NCLIENTS; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            ringlm_client *c;
            if (ringlm_connect(d.sock, &c) < 0) _exit(10);
            for (int i = 0; i < REQS; i++)
                if (roundtrip(c, k * 1000 + i, 1 + (i % 5))) _exit(11);
            ringlm_close(c);
            _exit(0);
        }
    }
    for (int k = 0; k < NCLIENTS; k++) {
        int st;
        waitpid(kids[k], &st, 0);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client %d: status 0x%x", k, st);
    }
    cr_assert(daemon_alive(&d));
    daemon_stop(&d);
}

/* ---- one submitting thread, one reading thread (the documented exception) ----------- */
struct two_threads {
    ringlm_client *c;
    uint64_t n;
    int submit_err;
};

static void *submitter(void *arg)
{
    struct two_threads *t = arg;
    ringlm_request q;
    ringlm_request_init(&q);
    q.n_prompt = 1;
    q.max_new_tokens = 2;
    for (uint64_t i = 0; i < t->n;) {
        int32_t tok = (int32_t)(i + 1);
        q.prompt = &tok;
        int r = ringlm_submit(t->c, &q, NULL);
        if (r == -EAGAIN) {
            sched_yield();
            continue;
        }
        if (r < 0) {
            t->submit_err = r;
            return NULL;
        }
        i++;
    }
    return NULL;
}

Test(transport, submit_thread_and_reader_thread)
{
    struct daemon d;
    daemon_start(&d, (const char *const[]){"--submit-ring-bytes", "4096", "--event-ring-slots",
                                           "128", NULL});
    struct two_threads t = {.c = must_connect(&d), .n = 100000};
    pthread_t th;
    pthread_create(&th, NULL, submitter, &t);
    uint64_t fin = 0, tok = 0;
    ringlm_event ev;
    while (fin < t.n) {
        int r = ringlm_next_event(t.c, &ev, 5000);
        cr_assert_eq(r, 1, "after %llu finishes: %d %s", (unsigned long long)fin, r,
                     ringlm_errdetail());
        if (ev.kind == RINGLM_EV_TOKEN) {
            cr_assert_eq(ev.req_id, fin + 1);
            cr_assert_eq(ev.token, (int32_t)(fin + 1));
            tok++;
        } else {
            cr_assert_eq(ev.req_id, fin + 1);
            fin++;
        }
    }
    pthread_join(th, NULL);
    cr_assert_eq(t.submit_err, 0, "submit: %s", ringlm_strerror(t.submit_err));
    cr_assert_eq(tok, 2 * t.n);
    ringlm_close(t.c);
    daemon_stop(&d);
}

/* ---- 10^6 each way ------------------------------------------------------------------ */
Test(transport, million_messages_each_way_in_order, .timeout = 120)
{
    /* Small rings so that both wrap thousands of times. */
    struct daemon d;
    daemon_start(&d, (const char *const[]){"--submit-ring-bytes", "4096", "--event-ring-slots",
                                           "256", NULL});
    ringlm_client *c = must_connect(&d);
    enum { N = 1000000 };
    uint64_t sent = 0, tokens = 0, finishes = 0;
    ringlm_request q;
    ringlm_request_init(&q);
    q.n_prompt = 1;
    q.max_new_tokens = 1;
    int32_t tok;
    q.prompt = &tok;
    ringlm_event ev;
    while (finishes < N) {
        /* Submit as much as the ring takes (pipelined), then read what arrived. */
        while (sent < N && sent - finishes < 2000) {
            tok = (int32_t)((sent + 1) * 2654435761u & 0x7fffffff);
            uint64_t id;
            int r = ringlm_submit(c, &q, &id);
            if (r == -EAGAIN) break;
            cr_assert_eq(r, 0, "submit %llu: %s", (unsigned long long)sent, ringlm_errdetail());
            cr_assert_eq(id, sent + 1);
            sent++;
        }
        /* Then everything that arrived: the first event waiting, the rest polled. */
        int r = ringlm_next_event(c, &ev, 5000);
        cr_assert_eq(r, 1, "after %llu finishes: %d %s", (unsigned long long)finishes, r,
                     ringlm_errdetail());
        for (; r == 1; r = ringlm_next_event(c, &ev, 0)) {
            if (ev.kind == RINGLM_EV_TOKEN) {
                cr_assert_eq(ev.req_id, tokens + 1, "token for %llu, expected %llu",
                             (unsigned long long)ev.req_id, (unsigned long long)tokens + 1);
                cr_assert_eq(ev.token, (int32_t)((tokens + 1) * 2654435761u & 0x7fffffff));
                tokens++;
            } else {
                cr_assert_eq(ev.req_id, finishes + 1, "finish for %llu, expected %llu",
                             (unsigned long long)ev.req_id, (unsigned long long)finishes + 1);
                cr_assert_eq(ev.req_id, tokens, "finish before its token");
                finishes++;
            }
        }
        cr_assert_geq(r, 0, "%s", ringlm_errdetail());
    }
    cr_assert_eq(tokens, N);
    cr_assert_eq(ringlm_next_event(c, &ev, 0), 0);
    ringlm_close(c);
    daemon_stop(&d);
}

/* ---- both rings full ---------------------------------------------------------------- */
Test(transport, both_rings_full_then_everything_arrives)
{
    struct daemon d;
    daemon_start(
        &d, (const char *const[]){"--submit-ring-bytes", "4096", "--event-ring-slots", "64", NULL});
    ringlm_client *c = must_connect(&d);
    int32_t p[4] = {1, 2, 3, 4};
    ringlm_request q;
    ringlm_request_init(&q);
    q.prompt = p;
    q.n_prompt = 4;
    q.max_new_tokens = 50;
    uint64_t n = 0, id;
    int r;
    /* Without reading: submit until the 4 KiB submit ring says -EAGAIN (36 records of
	 * 112 bytes); their 1800 token events overflow the 64-slot event ring, so the
	 * daemon holds tokens back (backpressure) while it keeps serving others. */
    uint64_t deadline = th_now_ms() + 3000;
    int saw_eagain = 0;
    while (n < 100000 && th_now_ms() < deadline) {
        r = ringlm_submit(c, &q, &id);
        if (r == -EAGAIN) {
            saw_eagain = 1;
            break;
        }
        cr_assert_eq(r, 0, "%s", ringlm_errdetail());
        n++;
    }
    cr_assert(saw_eagain, "the submit ring never filled (%llu records)", (unsigned long long)n);
    cr_assert_gt(n * 50, 64, "not enough events to fill the event ring");
    /* Another client is served meanwhile: the stuck one blocks nobody. */
    ringlm_client *c2 = must_connect(&d);
    cr_assert_null(roundtrip(c2, 77, 10));
    ringlm_close(c2);
    /* Now read everything: n requests × 50 tokens, in order, each finished. */
    ringlm_event ev;
    uint64_t fin = 0, tok = 0;
    while (fin < n) {
        r = ringlm_next_event(c, &ev, 5000);
        cr_assert_eq(r, 1, "after %llu of %llu finishes: %d %s", (unsigned long long)fin,
                     (unsigned long long)n, r, ringlm_errdetail());
        if (ev.kind == RINGLM_EV_TOKEN) {
            cr_assert_eq(ev.req_id, fin + 1);
            cr_assert_eq(ev.token, p[ev.index % 4]);
            tok++;
        } else {
            cr_assert_eq(ev.req_id, fin + 1);
            cr_assert_eq(ev.n_tokens, 50);
            fin++;
        }
    }
    cr_assert_eq(tok, n * 50);
    cr_log_info("submitted %llu requests before the rings were full", (unsigned long long)n);
    ringlm_close(c);
    daemon_stop(&d);
}

/* Submit ring really full: the echo service keeps accepting records, so fill it with one
 * request whose prompt fills the ring: the next submit must say -EAGAIN or -E2BIG. */
Test(transport, submit_ring_limits)
{
    struct daemon d;
    daemon_start(&d, (const char *const[]){"--submit-ring-bytes", "4096", NULL});
    ringlm_client *c = must_connect(&d);
    static int32_t big[2000];
    ringlm_request q;
    ringlm_request_init(&q);
    q.prompt = big;
    q.n_prompt = 2000; /* 8 KiB > 4 KiB ring */
    uint64_t id;
    cr_assert_eq(ringlm_submit(c, &q, &id), -E2BIG, "%s", ringlm_errdetail());
    q.n_prompt = 1000; /* fits */
    cr_assert_eq(ringlm_submit(c, &q, &id), 0, "%s", ringlm_errdetail());
    ringlm_event ev;
    do cr_assert_eq(ringlm_next_event(c, &ev, 5000), 1);
    while (ev.kind != RINGLM_EV_FINISH);
    ringlm_close(c);
    daemon_stop(&d);
}

/* A batch is all or nothing: one bad request, or records that cannot fit the ring together,
 * queue none of them (no event ever comes, the ids are not used up); a good batch gets
 * consecutive ids and every request is answered. */
Test(transport, submit_batch_is_all_or_nothing)
{
    struct daemon d;
    daemon_start(&d, (const char *const[]){"--submit-ring-bytes", "4096", NULL});
    ringlm_client *c = must_connect(&d);
    static int32_t p[700];
    for (int i = 0; i < 700; i++) p[i] = 5 + i;
    ringlm_request q[3];
    for (int i = 0; i < 3; i++) {
        ringlm_request_init(&q[i]);
        q[i].prompt = p;
        q[i].n_prompt = 3;
        q[i].max_new_tokens = 2;
    }
    uint64_t ids[3] = {0, 0, 0};
    q[1].n_prompt = 0;
    cr_assert_eq(ringlm_submit_batch(c, q, 3, ids), -EINVAL);
    cr_assert(strstr(ringlm_errdetail(), "request 1"), "detail does not name the request: %s",
              ringlm_errdetail());
    q[1].n_prompt = 700; /* each fits the 4 KiB ring alone, the three do not together */
    q[2].n_prompt = 700;
    cr_assert_eq(ringlm_submit_batch(c, q, 3, ids), -E2BIG, "%s", ringlm_errdetail());
    cr_assert_eq(ringlm_submit_batch(c, q, 0, ids), -EINVAL);
    ringlm_event ev;
    q[1].n_prompt = q[2].n_prompt = 3;
    cr_assert_eq(ringlm_submit_batch(c, q, 3, ids), 0, "%s", ringlm_errdetail());
    cr_assert_eq(ids[0], 1);
    cr_assert_eq(ids[1], 2);
    cr_assert_eq(ids[2], 3);
    /* a refused batch, had it been queued, would have come first under the same ids: its
	 * 3-token echoes, or a duplicate-id rejection of the good batch */
    int finished = 0, tokens = 0;
    while (finished < 3) {
        cr_assert_eq(ringlm_next_event(c, &ev, 5000), 1, "%s", ringlm_errdetail());
        cr_assert(ev.req_id >= 1 && ev.req_id <= 3, "event for request %llu",
                  (unsigned long long)ev.req_id);
        tokens += ev.kind == RINGLM_EV_TOKEN;
        if (ev.kind == RINGLM_EV_FINISH) {
            finished++;
            cr_assert_eq(ev.finish_reason, RINGLM_FINISH_LENGTH, "request %llu: %s %s",
                         (unsigned long long)ev.req_id, ringlm_reason_name(ev.finish_reason),
                         ringlm_reason_name(ev.reject_reason));
        }
    }
    cr_assert_eq(tokens, 6, "%d tokens for three 2-token requests", tokens);
    ringlm_close(c);
    daemon_stop(&d);
}

/* ---- sleep / wake ------------------------------------------------------------------- */
static void sleep_wake_stress(const char *doorbell)
{
    struct daemon d;
    daemon_start(&d, (const char *const[]){"--spin-us", "1", "--doorbell", doorbell, NULL});
    ringlm_client *c = must_connect(&d);
    ringlm_set_option(c, RINGLM_OPT_SPIN_US, 0);
    /* Both sides sleep on every round trip.  A lost wakeup would cost at least the
	 * client's liveness slice (20 ms) or the daemon's housekeeping tick (200 ms). */
    enum { N = 4000 };
    uint64_t worst = 0, slow = 0;
    unsigned seed = 1;
    for (int i = 0; i < N; i++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        const char *err = roundtrip(c, i, 1 + (i % 3));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        cr_assert_null(err, "round trip %d: %s (%s)", i, err, ringlm_errdetail());
        uint64_t us = (uint64_t)(((int64_t)t1.tv_sec - t0.tv_sec) * 1000000 +
                                 ((int64_t)t1.tv_nsec - t0.tv_nsec) / 1000);
        if (us > worst) worst = us;
        if (us > 19000) slow++;
        /* Random short pauses put the daemon to sleep at varying points. */
        seed = seed * 1103515245 + 12345;
        if ((seed >> 16) % 4 == 0) usleep((seed >> 8) % 200);
    }
    cr_log_info("%s doorbell: %d round trips, worst %llu us, %llu over 19 ms", doorbell, N,
                (unsigned long long)worst, (unsigned long long)slow);
    cr_expect_lt(slow, N / 100,
                 "%llu of %d round trips took > 19 ms (lost wakeups?), worst %llu us",
                 (unsigned long long)slow, N, (unsigned long long)worst);
    cr_assert_lt(worst, 150000, "a round trip took %llu us: lost wakeup",
                 (unsigned long long)worst);
    ringlm_close(c);
    daemon_stop(&d);
}

Test(transport, sleep_wake_stress_futex, .timeout = 120)
{
    sleep_wake_stress("futex");
}

Test(transport, sleep_wake_stress_eventfd, .timeout = 120)
{
    sleep_wake_stress("eventfd");
}

/* ---- kill -9 ------------------------------------------------------------------------ */
Test(transport, kill9_client_mid_stream_frees_everything)
{
    struct daemon d;
    daemon_start(&d, (const char *const[]){"--event-ring-slots", "1024", NULL});
    int shm_before = shm_entries();
    ringlm_client *other = must_connect(&d);
    cr_assert_null(roundtrip(other, 1, 2));
    int fds0 = daemon_fds(&d), maps0 = daemon_memfd_maps(&d);

    for (int round = 0; round < 3; round++) {
        int pfd[2];
        cr_assert_eq(pipe(pfd), 0);
        pid_t kid = fork();
        if (kid == 0) {
            close(pfd[0]);
            ringlm_client *c;
            if (ringlm_connect(d.sock, &c) < 0) _exit(10);
            int32_t p = 3;
            ringlm_request q;
            ringlm_request_init(&q);
            q.prompt = &p;
            q.n_prompt = 1;
            q.max_new_tokens = 200000000;
            for (int i = 0; i < 4; i++) ringlm_submit(c, &q, NULL);
            ringlm_event ev;
            for (int i = 0;; i++) {
                if (ringlm_next_event(c, &ev, 5000) != 1) _exit(11);
                if (i == 10000 && write(pfd[1], "x", 1) != 1) _exit(12);
            }
        }
        close(pfd[1]);
        char x;
        cr_assert_eq(read(pfd[0], &x, 1), 1, "streaming client did not start");
        close(pfd[0]);
        cr_assert_gt(daemon_fds(&d), fds0, "the session should hold fds");
        cr_assert_not(daemon_uses_dev_shm(d.pid),
                      "the daemon has a /dev/shm file open or mapped: %s", shm_culprit);
        kill(kid, SIGKILL);
        int st;
        waitpid(kid, &st, 0);
        int fds = wait_value(&d, daemon_fds, fds0);
        cr_assert_eq(fds, fds0, "daemon fds %d after kill -9, %d before", fds, fds0);
        int maps = wait_value(&d, daemon_memfd_maps, maps0);
        cr_assert_eq(maps, maps0, "daemon memfd mappings %d after kill -9, %d before", maps, maps0);
        /* The other client is unaffected. */
        cr_assert_null(roundtrip(other, 100 + round, 3));
    }
    cr_assert_eq(shm_entries(), shm_before, "something appeared in /dev/shm");
    cr_assert(daemon_alive(&d));
    ringlm_close(other);
    daemon_stop(&d);
}

/* The second liveness signal: the client process exits while a child it forked keeps the
 * session socket open, so no EOF arrives — the pidfd must end the session. */
Test(transport, pidfd_notices_exit_while_socket_lives_on)
{
    struct daemon d;
    daemon_start(&d, NULL);
    int fds0 = daemon_fds(&d);
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    pid_t kid = fork();
    if (kid == 0) {
        ringlm_client *c;
        if (ringlm_connect(d.sock, &c) < 0) _exit(10);
        if (roundtrip(c, 1, 1)) _exit(11);
        pid_t holder = fork();
        if (holder == 0) {
            /* Holds the inherited socket and segments until the test is done. */
            close(pfd[1]);
            char x;
            if (read(pfd[0], &x, 1) < 0) _exit(1);
            _exit(0);
        }
        _exit(0);
    }
    close(pfd[0]);
    int st;
    waitpid(kid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client status 0x%x", st);
    int fds = wait_value(&d, daemon_fds, fds0);
    cr_assert_eq(fds, fds0,
                 "daemon fds %d after the client exited (socket still open elsewhere), %d before",
                 fds, fds0);
    close(pfd[1]); /* lets the holder go */
    cr_assert(daemon_alive(&d));
    daemon_stop(&d);
}

/* ---- daemon dies -------------------------------------------------------------------- */
Test(transport, daemon_killed_client_gets_error_not_hang)
{
    struct daemon d;
    daemon_start(&d, NULL);
    ringlm_client *c = must_connect(&d);
    cr_assert_null(roundtrip(c, 1, 1));
    kill(d.pid, SIGKILL);
    waitpid(d.pid, NULL, 0);
    d.pid = -1;
    ringlm_event ev;
    uint64_t t0 = th_now_ms();
    int r = ringlm_next_event(c, &ev, -1);
    uint64_t ms = th_now_ms() - t0;
    cr_assert_eq(r, -EPIPE, "next_event after kill -9 of the daemon: %d (%s)", r,
                 ringlm_errdetail());
    cr_assert_lt(ms, 1000, "took %llu ms to notice", (unsigned long long)ms);
    /* Submissions fail too (once the ring is full at the latest; the end is sticky). */
    int32_t p = 1;
    ringlm_request q;
    ringlm_request_init(&q);
    q.prompt = &p;
    q.n_prompt = 1;
    cr_assert_eq(ringlm_submit(c, &q, NULL), -EPIPE, "%s", ringlm_errdetail());
    ringlm_close(c);
    daemon_stop(&d);
}

Test(transport, daemon_sigterm_ends_sessions_with_reason)
{
    struct daemon d;
    daemon_start(&d, NULL);
    ringlm_client *c = must_connect(&d);
    cr_assert_null(roundtrip(c, 1, 1));
    kill(d.pid, SIGTERM);
    int st;
    waitpid(d.pid, &st, 0);
    d.pid = -1;
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "ringlmd exit status 0x%x", st);
    ringlm_event ev;
    int r = ringlm_next_event(c, &ev, 2000);
    cr_assert_eq(r, -ECONNRESET, "%d %s", r, ringlm_errdetail());
    cr_assert(strstr(ringlm_errdetail(), "shutdown"), "detail: %s", ringlm_errdetail());
    cr_assert_neq(access(d.sock, F_OK), 0, "socket file left behind");
    ringlm_close(c);
    daemon_stop(&d);
}

/* ---- session limits ----------------------------------------------------------------- */
Test(transport, session_limits)
{
    struct daemon d;
    daemon_start(&d, (const char *const[]){"--max-sessions-per-uid", "2", NULL});
    ringlm_client *a = must_connect(&d), *b = must_connect(&d), *c = NULL;
    int r = ringlm_connect(d.sock, &c);
    cr_assert_eq(r, -EUSERS, "third session: %d %s", r, ringlm_errdetail());
    cr_assert(strstr(ringlm_errdetail(), "limit"), "detail: %s", ringlm_errdetail());
    ringlm_close(a);
    /* The freed slot becomes available once the daemon noticed the close. */
    uint64_t deadline = th_now_ms() + 3000;
    while ((r = ringlm_connect(d.sock, &c)) == -EUSERS && th_now_ms() < deadline) usleep(2000);
    cr_assert_eq(r, 0, "%s", ringlm_errdetail());
    cr_assert_neq(ringlm_session_id(c), ringlm_session_id(b));
    ringlm_close(b);
    ringlm_close(c);
    daemon_stop(&d);
}

/* ---- raw wire clients: ABI, hostile writers ----------------------------------------- */
struct raw {
    int sock;
    struct ringlm_wire_welcome w;
    struct ringlm_wire_cseg *cseg;
    const struct ringlm_wire_dseg *dseg;
    int dfd;
};

static int raw_connect(const char *path, uint32_t abi, struct raw *r)
{
    memset(r, 0, sizeof(*r));
    r->dfd = -1;
    r->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if (connect(r->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) return -errno;
    struct ringlm_wire_hello h = {.magic = RINGLM_WIRE_MAGIC, .abi = abi};
    if (send(r->sock, &h, sizeof(h), 0) != sizeof(h)) return -errno;
    char ctl[CMSG_SPACE(sizeof(int) * 3)];
    struct iovec iov = {.iov_base = &r->w, .iov_len = sizeof(r->w)};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    struct pollfd pfd = {.fd = r->sock, .events = POLLIN};
    if (poll(&pfd, 1, 5000) != 1) return -ETIMEDOUT;
    ssize_t n = recvmsg(r->sock, &msg, 0);
    if (n != sizeof(r->w)) return -EPROTO;
    if (r->w.status) return r->w.status;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (!c) return -EPROTO;
    int fds[3];
    memcpy(fds, CMSG_DATA(c), sizeof(int) * 2);
    r->cseg = mmap(NULL, r->w.cseg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    r->dseg = mmap(NULL, r->w.dseg_bytes, PROT_READ, MAP_SHARED, fds[1], 0);
    close(fds[0]);
    r->dfd = fds[1];
    return (r->cseg == MAP_FAILED || r->dseg == MAP_FAILED) ? -ENOMEM : 0;
}

static void raw_close(struct raw *r)
{
    if (r->cseg && r->cseg != MAP_FAILED) munmap(r->cseg, r->w.cseg_bytes);
    if (r->dseg && r->dseg != MAP_FAILED) munmap((void *)r->dseg, r->w.dseg_bytes);
    if (r->dfd >= 0) close(r->dfd);
    close(r->sock);
}

/* Waits for the daemon to mark the raw session CLOSED and hang up. */
static int raw_wait_closed(struct raw *r, char *reason, size_t len)
{
    uint64_t deadline = th_now_ms() + 3000;
    while (__atomic_load_n(&r->dseg->state, __ATOMIC_ACQUIRE) != RINGLM_WIRE_ST_CLOSED) {
        if (th_now_ms() > deadline) return 0;
        usleep(1000);
    }
    snprintf(reason, len, "%s", r->dseg->end_reason);
    struct pollfd pfd = {.fd = r->sock, .events = POLLIN | POLLRDHUP};
    return poll(&pfd, 1, 3000) == 1;
}

Test(transport, abi_mismatch_daemon_side)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct raw r;
    int e = raw_connect(d.sock, RINGLM_WIRE_ABI + 7, &r);
    cr_assert_eq(e, -EPROTO, "status %d", e);
    cr_assert(strstr(r.w.detail, "ABI"), "detail: %s", r.w.detail);
    cr_assert_eq(r.w.abi, RINGLM_WIRE_ABI);
    raw_close(&r);
    ringlm_client *c = must_connect(&d);
    cr_assert_null(roundtrip(c, 1, 1));
    ringlm_close(c);
    daemon_stop(&d);
}

Test(transport, abi_mismatch_client_side)
{
    /* A fake daemon that answers with another ABI. */
    char dir[] = "/tmp/ringlm-abi.XXXXXX", path[100];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/s", dir);
    int ls = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    cr_assert_eq(bind(ls, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(listen(ls, 4), 0);
    pid_t kid = fork();
    if (kid == 0) {
        int s = accept(ls, NULL, NULL);
        struct ringlm_wire_hello h;
        if (recv(s, &h, sizeof(h), 0) < 0) _exit(1);
        struct ringlm_wire_welcome w = {.magic = RINGLM_WIRE_MAGIC, .abi = RINGLM_WIRE_ABI + 1};
        if (send(s, &w, sizeof(w), 0) < 0) _exit(1);
        char b;
        if (recv(s, &b, 1, 0) < 0) _exit(1);
        _exit(0);
    }
    ringlm_client *c = NULL;
    int r = ringlm_connect(path, &c);
    cr_assert_eq(r, -EPROTO, "connect: %d", r);
    cr_assert(strstr(ringlm_errdetail(), "ABI"), "detail: %s", ringlm_errdetail());
    cr_assert_null(c);
    waitpid(kid, NULL, 0);
    close(ls);
    unlink(path);
    rmdir(dir);
}

Test(transport, missing_daemon_is_a_clear_error)
{
    ringlm_client *c = NULL;
    int r = ringlm_connect("/tmp/ringlm-no-such-dir/s", &c);
    cr_assert_eq(r, -ENOENT, "%d", r);
    cr_assert(strstr(ringlm_errdetail(), "ringlmd"), "detail: %s", ringlm_errdetail());
}

/* Writes a well-formed request record at the producer index (no publish). */
static uint32_t raw_put_request_n(struct raw *r, uint64_t at, uint64_t id, const int32_t *p,
                                  uint32_t n, uint32_t max_new)
{
    uint64_t cap = r->cseg->hdr.data_bytes; /* our own header: fine for a test */
    uint8_t *data = (uint8_t *)r->cseg + RINGLM_WIRE_HEADER_AREA;
    uint8_t rec[4096];
    uint32_t len = (uint32_t)ringlm_wire_request_bytes(n);
    memset(rec, 0, len);
    struct ringlm_wire_rec_hdr h = {.len = len, .type = RINGLM_WIRE_REC_REQUEST};
    struct ringlm_wire_request q = {
        .req_id = id, .max_new_tokens = max_new, .n_prompt = n, .top_p = 1};
    strcpy(q.class_name, "default");
    memcpy(rec, &h, sizeof(h));
    memcpy(rec + sizeof(h), &q, sizeof(q));
    memcpy(rec + sizeof(h) + sizeof(q), p, n * 4);
    for (uint32_t i = 0; i < len; i++) data[(at + i) & (cap - 1)] = rec[i];
    return len;
}

static uint32_t raw_put_request(struct raw *r, uint64_t at, uint64_t id, const int32_t *p,
                                uint32_t n)
{
    return raw_put_request_n(r, at, id, p, n, 2);
}

static void publish_prod(struct raw *r, uint64_t prod)
{
    __atomic_store_n(&r->cseg->submit_prod, prod, __ATOMIC_RELEASE);
    __atomic_add_fetch(&r->cseg->doorbell, 1, __ATOMIC_RELEASE);
    futex_wake(&r->cseg->doorbell, 1, FUTEX_SCOPE_SHARED);
}

enum hostile_kind {
    H_RANDOM,
    H_BAD_LEN,
    H_HUGE_LEN,
    H_PROD_AHEAD,
    H_PROD_BACK,
    H_TYPE,
    H_FLAGS,
    H_EVCONS,
    H_NAME,
    H_SHORT,
    H_NKINDS
};

static const char *hostile_names[H_NKINDS] = {"random",    "bad_len", "huge_len", "prod_ahead",
                                              "prod_back", "type",    "flags",    "ev_cons",
                                              "name",      "short"};

Test(transport, hostile_writer_ends_only_its_session)
{
    struct daemon d;
    daemon_start(
        &d, (const char *const[]){"--submit-ring-bytes", "4096", "--event-ring-slots", "64", NULL});
    ringlm_client *good = must_connect(&d);
    int fds0 = daemon_fds(&d);
    unsigned seed = 12345;
    for (int round = 0; round < 3 * H_NKINDS; round++) {
        int kind = round % H_NKINDS;
        struct raw r;
        int e = raw_connect(d.sock, RINGLM_WIRE_ABI, &r);
        cr_assert_eq(e, 0, "raw connect: %d", e);
        uint8_t *data = (uint8_t *)r.cseg + RINGLM_WIRE_HEADER_AREA;
        int32_t p[3] = {1, 2, 3};
        /* One good request first, so some rounds start from a non-zero index. */
        uint64_t prod = 0;
        if (round % 2) {
            prod += raw_put_request(&r, prod, 1, p, 3);
            publish_prod(&r, prod);
        }
        switch (kind) {
        case H_RANDOM:
            for (size_t i = 0; i < r.w.cseg_bytes; i++) {
                seed = seed * 1103515245 + 12345;
                ((uint8_t *)r.cseg)[i] = (uint8_t)(seed >> 16);
            }
            publish_prod(&r, r.cseg->submit_prod | 1);
            break;
        case H_BAD_LEN: {
            uint32_t len = raw_put_request(&r, prod, 7, p, 3);
            struct ringlm_wire_rec_hdr h = {.len = len + 3, .type = RINGLM_WIRE_REC_REQUEST};
            memcpy(data + (prod & 4095), &h, sizeof(h));
            publish_prod(&r, prod + len + 8);
            break;
        }
        case H_HUGE_LEN: {
            struct ringlm_wire_rec_hdr h = {.len = 0xfffffff8u, .type = RINGLM_WIRE_REC_REQUEST};
            memcpy(data + (prod & 4095), &h, sizeof(h));
            publish_prod(&r, prod + 64);
            break;
        }
        case H_PROD_AHEAD: publish_prod(&r, prod + 4096 + 8); break;
        case H_PROD_BACK: publish_prod(&r, prod - 8); break;
        case H_TYPE: {
            uint32_t len = raw_put_request(&r, prod, 7, p, 3);
            struct ringlm_wire_rec_hdr h = {.len = len, .type = 99};
            memcpy(data + (prod & 4095), &h, sizeof(h));
            publish_prod(&r, prod + len);
            break;
        }
        case H_FLAGS: {
            uint32_t len = raw_put_request(&r, prod, 7, p, 3);
            struct ringlm_wire_rec_hdr h = {
                .len = len, .type = RINGLM_WIRE_REC_REQUEST, .flags = 4};
            memcpy(data + (prod & 4095), &h, sizeof(h));
            publish_prod(&r, prod + len);
            break;
        }
        case H_EVCONS:
            /* Claim to have consumed events the daemon never wrote, then make it
			 * write more than the 64-slot ring holds, so that it looks at ev_cons. */
            __atomic_store_n(&r.cseg->ev_cons, 1000000, __ATOMIC_RELEASE);
            prod += raw_put_request_n(&r, prod, 9, p, 3, 200);
            publish_prod(&r, prod);
            break;
        case H_NAME: {
            uint32_t len = raw_put_request(&r, prod, 7, p, 3);
            /* class_name without a terminating NUL */
            size_t off = sizeof(struct ringlm_wire_rec_hdr) +
                         offsetof(struct ringlm_wire_request, class_name);
            for (int i = 0; i < RINGLM_WIRE_NAME_LEN; i++) data[(prod + off + i) & 4095] = 'A';
            publish_prod(&r, prod + len);
            break;
        }
        case H_SHORT: publish_prod(&r, prod + 4); break;
        }
        char reason[128] = "";
        int closed = raw_wait_closed(&r, reason, sizeof(reason));
        cr_assert(closed, "round %d (%s): session not ended (state %u)", round, hostile_names[kind],
                  r.dseg->state);
        cr_assert(strstr(reason, "hostile"), "round %d (%s): reason '%s'", round,
                  hostile_names[kind], reason);
        cr_log_info("%s: %s", hostile_names[kind], reason);
        raw_close(&r);
        cr_assert(daemon_alive(&d), "daemon died in round %d (%s)", round, hostile_names[kind]);
        cr_assert_null(roundtrip(good, round, 2), "good client after round %d (%s)", round,
                       hostile_names[kind]);
    }
    int fds = wait_value(&d, daemon_fds, fds0);
    cr_assert_eq(fds, fds0, "daemon fds %d, %d before", fds, fds0);
    ringlm_close(good);
    daemon_stop(&d);
}

/* The client cannot get a writable mapping of the daemon segment, nor resize its own. */
Test(transport, segments_are_sealed)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct raw r;
    cr_assert_eq(raw_connect(d.sock, RINGLM_WIRE_ABI, &r), 0);
    void *w = mmap(NULL, r.w.dseg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.dfd, 0);
    cr_assert_eq(w, MAP_FAILED, "writable mapping of the daemon segment succeeded");
    cr_assert_eq(ftruncate(r.dfd, 4096), -1, "shrinking the daemon segment succeeded");
    cr_assert(fcntl(r.dfd, F_GET_SEALS) & F_SEAL_SHRINK);
    raw_close(&r);
    daemon_stop(&d);
}

/* ---- another uid -------------------------------------------------------------------- */
Test(transport, other_uid_gets_own_session_and_cannot_open_others)
{
    if (geteuid() != 0) cr_skip_test("needs root to setuid a client to another uid");
    struct daemon d;
    daemon_start(&d, NULL);
    ringlm_client *mine = must_connect(&d);
    cr_assert_null(roundtrip(mine, 1, 1));
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    pid_t kid = fork();
    if (kid == 0) {
        close(pfd[0]);
        if (setgid(65534) || setuid(65534)) _exit(20);
        ringlm_client *c;
        if (ringlm_connect(d.sock, &c) < 0) _exit(21);
        if (roundtrip(c, 5, 3)) _exit(22);
        if (ringlm_session_id(c) == ringlm_session_id(mine)) _exit(23);
        /* Neither the daemon's fds nor the other client's can be opened. */
        const pid_t victims[2] = {d.pid, getppid()};
        for (int v = 0; v < 2; v++) {
            char dp[64];
            snprintf(dp, sizeof(dp), "/proc/%d/fd", (int)victims[v]);
            DIR *dir = opendir(dp);
            if (dir) {
                struct dirent *e;
                while ((e = readdir(dir))) {
                    char fp[384];
                    snprintf(fp, sizeof(fp), "%s/%s", dp, e->d_name);
                    int fd = open(fp, O_RDONLY);
                    if (fd >= 0) _exit(24);
                }
                closedir(dir);
            }
            snprintf(dp, sizeof(dp), "/proc/%d/map_files", (int)victims[v]);
            dir = opendir(dp);
            if (dir) {
                struct dirent *e;
                while ((e = readdir(dir))) {
                    char fp[384];
                    snprintf(fp, sizeof(fp), "%s/%s", dp, e->d_name);
                    int fd = open(fp, O_RDONLY);
                    if (fd >= 0) _exit(25);
                }
                closedir(dir);
            }
        }
        ringlm_close(c);
        _exit(0);
    }
    close(pfd[1]);
    int st;
    waitpid(kid, &st, 0);
    close(pfd[0]);
    cr_assert(WIFEXITED(st), "status 0x%x", st);
    cr_assert_eq(WEXITSTATUS(st), 0,
                 "other-uid client failed with %d (20 setuid, 21 connect, 22 round trip, 23 same "
                 "session, 24/25 opened another process's fd/mapping)",
                 WEXITSTATUS(st));
    cr_assert_null(roundtrip(mine, 2, 2));
    ringlm_close(mine);
    daemon_stop(&d);
}
