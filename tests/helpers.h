/* SPDX-License-Identifier: MIT */
/*
 * tests/helpers.h — what the test suites share (linked into every test program): where the
 * built programs and the shared data are, one launcher of a real ringlmd on a private
 * socket, one HTTP getter. Functions that cannot go on fail or skip the calling test
 * (Criterion), so a suite reads as the behaviour it checks.
 */
#ifndef RINGLM_TESTS_HELPERS_H
#define RINGLM_TESTS_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* $RINGLM_BIN, else build/bin (scripts/run-tests.sh sets it for the build in use). */
const char *th_bin_dir(void);
/* $RINGLM_SHARED, else ../shared (models, traces, reference outputs). */
const char *th_shared_dir(void);
/* dir/name, malloc()ed. */
char *th_path(const char *dir, const char *name);
/* The path of a built program (malloc()ed); skips the test when it is not built. */
char *th_program(const char *name);
/* The path of a file under the shared dir (malloc()ed); skips the test, naming it, when
 * it is absent. */
char *th_shared_file(const char *relative);
bool th_exists(const char *path);
/* CLOCK_MONOTONIC in ms, and in µs: the one clock of the tests. */
uint64_t th_now_ms(void);
uint64_t th_now_us(void);

/* A ringlmd started by a test: a private directory holds its socket and its output. */
typedef struct th_daemon {
    pid_t pid;      /* 0 when not running */
    char dir[64];   /* private, mkdtemp'ed */
    char sock[100]; /* dir/s.sock (a sun_path holds 108 bytes) */
    char log[128];  /* dir/ringlmd.log: its stdout and stderr */
} th_daemon;

/* Creates the private directory (files a test wants to pass, such as a policy, go there
 * before th_daemon_start). */
void th_daemon_init(th_daemon *d);
/*
 * Starts `ringlmd --socket SOCK --numa-node off ARGS...` (args NULL-terminated, may be
 * NULL); the daemon dies with the test process. Returns once the socket accepts a
 * connection. Skips the test when ringlmd is not built; fails it, quoting the daemon's
 * output, when it exits or does not listen within timeout_ms.
 */
void th_daemon_start(th_daemon *d, const char *const *args, int timeout_ms);
/* As the first of th_daemon_start's args: start ringlmd-test (ringlmd built with its test
 * knobs, RINGLM_TEST_KNOBS: --prefix-key, --fail-kv-reads) instead of ringlmd. The marker is
 * not passed on. */
#define TH_TEST_BUILD "(ringlmd-test)"
/* Sends sig and waits up to timeout_ms for the exit, SIGKILL after. Returns the exit status,
 * 128+signal, 999 when it had to be killed, -1 when it was not running. */
int th_daemon_stop(th_daemon *d, int sig, int timeout_ms);
/* Kills a daemon still running and removes the directory (kept with RINGLM_KEEP_TEST_DIRS). */
void th_daemon_cleanup(th_daemon *d);
/* The first 8 KiB of its output (static buffer), for failure messages. */
const char *th_daemon_output(const th_daemon *d);

/* GET path from 127.0.0.1:port (tools/prom's getter). The body (malloc()ed) with *status
 * and, when content_type is not NULL, its Content-Type; NULL when nothing answers. */
char *th_http_get(int port, const char *path, int *status, char *content_type, size_t ct_cap);

/* ---- misbehaving clients speak to the daemon directly ------------------------------------ */

/* A SOCK_SEQPACKET connection to a Unix socket, as a client that never sends its hello (or
 * sends garbage) makes it. The descriptor, or -errno. */
int th_unix_connect(const char *path, bool nonblock);
/* A TCP connection to 127.0.0.1:port from source address src (any of 127/8 on loopback).
 * A nonblocking one may still be connecting. The descriptor, or -errno. */
int th_tcp_connect_from(const char *src, int port, bool nonblock);
/* true when fd became readable (or hung up) within timeout_ms (0: just look): for a child
 * process told to stop by the closing of a pipe. */
bool th_readable(int fd, int timeout_ms);
/* Waits up to timeout_ms for a child to exit, SIGKILL after. Its wait status. */
int th_reap(pid_t pid, int timeout_ms);
/* Stops pid (SIGSTOP) and returns once every thread of it is stopped: what is sent to it
 * meanwhile waits, unread, until th_resume — how a test makes several clients' requests
 * reach a daemon together, without guessing how long they take. Fails the test (after
 * resuming pid) when it is not stopped within timeout_ms. */
void th_suspend(pid_t pid, int timeout_ms);
/* SIGCONT to a process th_suspend stopped. */
void th_resume(pid_t pid);

/* ---- processes and sockets ----------------------------------------------------------- */

/* Runs argv (a path, or a name looked up in PATH) to its end, at most timeout_s (then it is
 * killed and the test fails, quoting its output). Returns its exit status (128+signal when
 * a signal ended it); *out gets its stdout and *err (when not NULL) its stderr, malloc()ed. */
int th_run(char *const argv[], char **out, char **err, int timeout_s);
/* A whole file (malloc()ed); "" when it cannot be read. */
char *th_read_file(const char *path);
/* Sleeps ms: only between two looks at a condition that has a deadline, never in place of
 * waiting for the condition itself. */
void th_pause_ms(long ms);

/* A program started by a test, its stdout and stderr in a log file; it dies with the test. */
typedef struct th_proc {
    pid_t pid; /* 0 when not running */
    char log[160];
} th_proc;
/* Starts argv[0] (a path) with its output to log. */
void th_proc_start(th_proc *p, const char *const *argv, const char *log);
/* Sends sig and waits up to timeout_ms, SIGKILL after. The exit status, 128+signal, 999 when
 * it had to be killed, -1 when it was not running. */
int th_proc_stop(th_proc *p, int sig, int timeout_ms);
/* Waits up to timeout_ms for p to exit by itself: its exit status (128+signal), or -1. */
int th_proc_wait(th_proc *p, int timeout_ms);
/* Waits until p's log holds marker and returns the integer written right after it (a port
 * it chose); fails the test, quoting the log, when p exits first or timeout_ms passes. */
int th_proc_log_int(th_proc *p, const char *marker, int timeout_ms);

/* A TCP connection to 127.0.0.1:port (fails the test when refused). */
int th_tcp_connect(int port);
/* Writes all n bytes (fails the test on an error). */
void th_send_all(int fd, const void *buf, size_t n);
/* Reads until `until` appears in what was read (NULL: until EOF) or timeout_ms passes.
 * Returns what was read (malloc()ed, NUL-terminated); *eof tells whether the peer closed. */
char *th_read_until(int fd, const char *until, int timeout_ms, bool *eof);

#endif
