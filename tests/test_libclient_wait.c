/* SPDX-License-Identifier: MIT */
/*
 * How a libringlm client waits for events against a real ringlmd: a thread asleep in
 * ringlm_next_event without a timeout wakes for nothing while the session is idle, returns
 * -EPIPE when the daemon is killed, and returns 0 when another thread calls ringlm_wake (also
 * when the wake came first).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ringlm.h"
#include "tests/daemon_helpers.h"
#include "tests/helpers.h"

static dmn g_d;

static void fini(void)
{
    dmn_cleanup(&g_d);
}

TestSuite(libclient_wait, .fini = fini, .timeout = 120);

struct waiter {
    ringlm_client *c;
    pid_t tid;
    int rc;
    ringlm_event ev;
    int done;
};

static void *wait_main(void *arg)
{
    struct waiter *w = arg;
    __atomic_store_n(&w->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    w->rc = ringlm_next_event(w->c, &w->ev, -1);
    __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* A field of /proc/self/task/TID/status ("voluntary_ctxt_switches"), or -1. */
static long task_status(pid_t tid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') v = strtol(line + n + 1, NULL, 10);
    fclose(f);
    return v;
}

/* Whether the thread sits in a blocking system call (its first field of
 * /proc/self/task/TID/syscall is a number, not "running"), in state S. */
static bool asleep_in_syscall(pid_t tid)
{
    char path[64], buf[256] = "";
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool in = fgets(buf, sizeof buf, f) && buf[0] >= '0' && buf[0] <= '9';
    fclose(f);
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    f = fopen(path, "r");
    if (!f) return false;
    char st[512] = "";
    bool ok = fgets(st, sizeof st, f) != NULL;
    fclose(f);
    const char *rp = strrchr(st, ')');
    return in && ok && rp && rp[1] == ' ' && rp[2] == 'S';
}

static void start_waiter(struct waiter *w, pthread_t *t)
{
    cr_assert_eq(pthread_create(t, NULL, wait_main, w), 0);
    uint64_t until = th_now_ms() + 20000;
    while (!__atomic_load_n(&w->tid, __ATOMIC_ACQUIRE) || !asleep_in_syscall(w->tid)) {
        cr_assert(th_now_ms() < until, "the waiting thread never went to sleep");
        th_pause_ms(2);
    }
}

static void join_within(struct waiter *w, pthread_t t, int ms, const char *what)
{
    uint64_t until = th_now_ms() + (uint64_t)ms;
    while (!__atomic_load_n(&w->done, __ATOMIC_ACQUIRE)) {
        cr_assert(th_now_ms() < until, "ringlm_next_event did not return %s", what);
        th_pause_ms(2);
    }
    pthread_join(t, NULL);
}

static ringlm_client *start_and_connect(void)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    dmn_start(&g_d, model, NULL, NULL);
    ringlm_client *c = NULL;
    int rc = ringlm_connect(g_d.sock, &c);
    cr_assert_eq(rc, 0, "connect: %s (%s)", ringlm_strerror(rc), ringlm_errdetail());
    return c;
}

/* Idle, the waiting thread stays asleep: over a 1 s window it is woken at most twice (a
 * client that looked at the socket every 20 ms was woken 50 times); then the daemon's death
 * ends its wait with -EPIPE. */
Test(libclient_wait, an_idle_wait_sleeps_until_the_daemon_dies)
{
    ringlm_client *c = start_and_connect();
    struct waiter w = {.c = c};
    pthread_t t;
    start_waiter(&w, &t);
    long before = task_status(w.tid, "voluntary_ctxt_switches");
    /* the window over which wake-ups are counted; nothing waits on it */
    struct timespec window = {.tv_sec = 1};
    nanosleep(&window, NULL);
    long after = task_status(w.tid, "voluntary_ctxt_switches");
    cr_assert(before >= 0 && after >= 0, "no /proc/self/task status");
    cr_log_info("an idle wait of 1 s: %ld wake-ups", after - before);
    cr_expect_leq(after - before, 2, "an idle wait woke %ld times in 1 s", after - before);
    cr_assert_eq(__atomic_load_n(&w.done, __ATOMIC_ACQUIRE), 0, "the wait returned %d", w.rc);

    kill(g_d.pid, SIGKILL);
    join_within(&w, t, 20000, "after the daemon was killed");
    cr_expect_eq(w.rc, -EPIPE, "the wait returned %d (%s), not -EPIPE", w.rc,
                 ringlm_strerror(w.rc));
    ringlm_event ev;
    cr_expect_eq(ringlm_next_event(c, &ev, 0), -EPIPE, "the end is not sticky");
    ringlm_close(c);
}

/* ringlm_wake ends a wait without a timeout with 0, and a wake with nobody waiting makes the
 * next wait return 0 at once; the session still works afterwards. */
Test(libclient_wait, ringlm_wake_ends_a_wait_without_a_timeout)
{
    ringlm_client *c = start_and_connect();
    struct waiter w = {.c = c};
    pthread_t t;
    start_waiter(&w, &t);
    cr_assert_eq(ringlm_wake(c), 0);
    join_within(&w, t, 20000, "after ringlm_wake");
    cr_expect_eq(w.rc, 0, "the woken wait returned %d", w.rc);

    cr_assert_eq(ringlm_wake(c), 0);
    ringlm_event ev;
    cr_expect_eq(ringlm_next_event(c, &ev, -1), 0, "a wake before the wait was lost");
    cr_expect_eq(ringlm_wake(NULL), -EINVAL);

    int32_t prompt[2] = {1, 403};
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = prompt, r.n_prompt = 2, r.max_new_tokens = 2;
    uint64_t id = 0;
    cr_assert_eq(client_submit(c, &r, &id), 0);
    uint32_t tokens = 0;
    cr_assert_eq(client_follow(c, id, NULL, NULL, &tokens, 16, &ev), 0);
    cr_expect_eq(tokens, 2);
    ringlm_close(c);
    dmn_stop(&g_d, SIGTERM, 10000);
}
