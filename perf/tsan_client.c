/* SPDX-License-Identifier: MIT */
/*
 * perf/tsan_client — libringlm's one documented threading exception under ThreadSanitizer
 * (make tsan): one thread submits and cancels while another calls ringlm_next_event on
 * the same client (ringlm.h, THREAD-SAFETY), against a real ringlmd --echo.
 *
 * Criterion can not start under TSAN (Snaipe/Criterion#274), so this is a plain program.
 * It starts DAEMON (a TSAN build of ringlmd, so the daemon's side runs instrumented too)
 * on a private socket with small rings (both wrap many times, the submitter meets
 * -EAGAIN), runs two rounds (default spin-then-sleep, then spin 0: every wait sleeps on
 * the futex doorbell), and checks that every request gets its tokens in order and exactly
 * one FINISH. Then it stops the daemon with SIGTERM and fails unless it exits 0 (a TSAN
 * report in the daemon makes it exit non-zero).
 *
 *   tsan_client --daemon PATH [--requests N]
 */
#include "ringlm.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct round {
    ringlm_client *c;
    uint64_t n;
    int submit_err; /* read by the main thread after join */
    _Atomic uint64_t submitted;
} round_t;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *submitter(void *arg)
{
    round_t *r = arg;
    ringlm_request q;
    ringlm_request_init(&q);
    q.n_prompt = 1;
    q.max_new_tokens = 2;
    uint64_t deadline = now_ms() + 60000;
    for (uint64_t i = 0; i < r->n;) {
        int32_t tok = (int32_t)(1 + i % 200);
        q.prompt = &tok;
        uint64_t id = 0;
        int rc = ringlm_submit(r->c, &q, &id);
        if (rc == -EAGAIN) {
            if (now_ms() > deadline) {
                r->submit_err = -ETIMEDOUT;
                return NULL;
            }
            sched_yield();
            continue;
        }
        if (rc < 0) {
            r->submit_err = rc;
            return NULL;
        }
        i++;
        atomic_store(&r->submitted, i);
        /* Every 16th request is cancelled at once (it may already be done: harmless). */
        if (i % 16 == 0)
            while ((rc = ringlm_cancel(r->c, id)) == -EAGAIN && now_ms() < deadline) sched_yield();
        if (rc < 0 && rc != -EAGAIN) {
            r->submit_err = rc;
            return NULL;
        }
    }
    return NULL;
}

/* One round; 0 or -1 (why on stderr). */
static int one_round(const char *sock, uint64_t n, long spin_us)
{
    round_t r = {.n = n};
    int rc = ringlm_connect(sock, &r.c);
    if (rc < 0) {
        fprintf(stderr, "tsan_client: connect %s: %s %s\n", sock, ringlm_strerror(rc),
                ringlm_errdetail());
        return -1;
    }
    if (spin_us >= 0 && (rc = ringlm_set_option(r.c, RINGLM_OPT_SPIN_US, spin_us)) < 0) {
        fprintf(stderr, "tsan_client: set_option: %s\n", ringlm_strerror(rc));
        ringlm_close(r.c);
        return -1;
    }
    uint32_t *ntok = calloc(n + 1, sizeof *ntok);
    uint8_t *done = calloc(n + 1, 1);
    pthread_t th;
    if (!ntok || !done || pthread_create(&th, NULL, submitter, &r)) {
        fprintf(stderr, "tsan_client: out of memory or threads\n");
        free(ntok);
        free(done);
        ringlm_close(r.c);
        return -1;
    }
    uint64_t fin = 0, tokens = 0, cancelled = 0;
    int bad = 0;
    while (fin < n && !bad) {
        ringlm_event ev;
        rc = ringlm_next_event(r.c, &ev, 10000);
        if (rc != 1) {
            fprintf(stderr,
                    "tsan_client: next_event after %llu finishes (%llu submitted): %d %s %s\n",
                    (unsigned long long)fin, (unsigned long long)atomic_load(&r.submitted), rc,
                    ringlm_strerror(rc), ringlm_errdetail());
            bad = 1;
            break;
        }
        if (ev.req_id == 0 || ev.req_id > n || done[ev.req_id]) {
            fprintf(stderr, "tsan_client: event for request %llu (%s)\n",
                    (unsigned long long)ev.req_id,
                    ev.req_id == 0 || ev.req_id > n ? "no such request" : "already finished");
            bad = 1;
        } else if (ev.kind == RINGLM_EV_TOKEN) {
            if (ev.index != ntok[ev.req_id]) {
                fprintf(stderr, "tsan_client: request %llu: token index %u, expected %u\n",
                        (unsigned long long)ev.req_id, ev.index, ntok[ev.req_id]);
                bad = 1;
            }
            ntok[ev.req_id]++;
            tokens++;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            if (ev.n_tokens != ntok[ev.req_id] || (ev.finish_reason != RINGLM_FINISH_LENGTH &&
                                                   ev.finish_reason != RINGLM_FINISH_CANCELLED)) {
                fprintf(stderr,
                        "tsan_client: request %llu: finish %s with n_tokens %u after %u tokens\n",
                        (unsigned long long)ev.req_id, ringlm_reason_name(ev.finish_reason),
                        ev.n_tokens, ntok[ev.req_id]);
                bad = 1;
            }
            cancelled += ev.finish_reason == RINGLM_FINISH_CANCELLED;
            done[ev.req_id] = 1;
            fin++;
        } else {
            fprintf(stderr, "tsan_client: unknown event kind %d\n", ev.kind);
            bad = 1;
        }
    }
    pthread_join(th, NULL);
    if (!bad && r.submit_err) {
        fprintf(stderr, "tsan_client: submit/cancel: %s\n", ringlm_strerror(r.submit_err));
        bad = 1;
    }
    ringlm_close(r.c);
    free(ntok);
    free(done);
    if (!bad)
        printf("tsan_client: spin %ld us: %llu requests submitted/cancelled by one thread, %llu "
               "tokens and %llu finishes (%llu cancelled) read by another, in order\n",
               spin_us < 0 ? 50 : spin_us, (unsigned long long)n, (unsigned long long)tokens,
               (unsigned long long)fin, (unsigned long long)cancelled);
    return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
    const char *daemon = NULL;
    uint64_t n = 20000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--daemon") && i + 1 < argc)
            daemon = argv[++i];
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc)
            n = strtoull(argv[++i], NULL, 10);
        else
            daemon = NULL, n = 0, i = argc;
    }
    if (!daemon || !n) {
        fprintf(stderr, "usage: tsan_client --daemon PATH/TO/ringlmd [--requests N]\n");
        return 2;
    }
    char dir[] = "/tmp/tsan_client.XXXXXX";
    if (!mkdtemp(dir)) {
        perror("tsan_client: mkdtemp");
        return 1;
    }
    char sock[64];
    snprintf(sock, sizeof sock, "%s/ringlmd.sock", dir);
    pid_t pid = fork();
    if (pid < 0) {
        perror("tsan_client: fork");
        return 1;
    }
    if (pid == 0) {
        execl(daemon, daemon, "--echo", "--socket", sock, "--submit-ring-bytes", "4096",
              "--event-ring-slots", "128", (char *)NULL);
        fprintf(stderr, "tsan_client: exec %s: %s\n", daemon, strerror(errno));
        _exit(127);
    }
    /* Wait for the socket (connect polls: no sleep stands in for the daemon's start). */
    int bad = 0;
    uint64_t deadline = now_ms() + 30000;
    for (;;) {
        if (access(sock, F_OK) == 0) break;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "tsan_client: ringlmd exited at start (status 0x%x)\n", st);
            rmdir(dir);
            return 1;
        }
        if (now_ms() > deadline) {
            fprintf(stderr, "tsan_client: ringlmd did not listen on %s within 30 s\n", sock);
            bad = 1;
            break;
        }
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    if (!bad) bad |= one_round(sock, n, -1) != 0;
    if (!bad) bad |= one_round(sock, n / 4 ? n / 4 : 1, 0) != 0;
    kill(pid, SIGTERM);
    int st = 0;
    deadline = now_ms() + 30000;
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (now_ms() > deadline) {
            fprintf(stderr,
                    "tsan_client: ringlmd did not stop within 30 s of SIGTERM; killing it\n");
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            bad = 1;
            break;
        }
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "tsan_client: ringlmd --echo ended with status 0x%x (exit %d%s)\n", st,
                WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                WIFEXITED(st) && WEXITSTATUS(st) == 66 ? ": ThreadSanitizer's exit code" : "");
        bad = 1;
    }
    unlink(sock);
    rmdir(dir);
    return bad;
}
