/* SPDX-License-Identifier: MIT */
/* tests/helpers.c — shared by every test program (see helpers.h). */
#include "tests/helpers.h"

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "libclient/ringlm.h"
#include "tools/prom.h"

const char *th_bin_dir(void)
{
    const char *b = getenv("RINGLM_BIN");
    return b && *b ? b : "build/bin";
}

const char *th_shared_dir(void)
{
    const char *s = getenv("RINGLM_SHARED");
    return s && *s ? s : "../shared";
}

char *th_path(const char *dir, const char *name)
{
    char *p;
    cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
    return p;
}

bool th_exists(const char *path)
{
    return access(path, R_OK) == 0;
}

char *th_program(const char *name)
{
    char *p = th_path(th_bin_dir(), name);
    if (access(p, X_OK) != 0) cr_skip_test("%s not built (set RINGLM_BIN)", p);
    return p;
}

char *th_shared_file(const char *relative)
{
    char *p = th_path(th_shared_dir(), relative);
    if (!th_exists(p)) cr_skip_test("%s not found (set RINGLM_SHARED)", p);
    return p;
}

uint64_t th_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t th_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

void th_pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void th_daemon_init(th_daemon *d)
{
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "/tmp/ringlmd-test-XXXXXX");
    cr_assert_not_null(mkdtemp(d->dir), "mkdtemp: %s", strerror(errno));
    snprintf(d->sock, sizeof d->sock, "%s/s.sock", d->dir);
    snprintf(d->log, sizeof d->log, "%s/ringlmd.log", d->dir);
}

const char *th_daemon_output(const th_daemon *d)
{
    static char buf[8192];
    buf[0] = 0;
    FILE *f = fopen(d->log, "r");
    if (f) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
    }
    return buf;
}

/* Does the daemon answer on its socket? A whole handshake, not a bare connect: once it is
 * answered the daemon has accepted this connection, so a test that waits for the probe's
 * socket to go and then takes an fd baseline cannot see it accepted later from the listen
 * backlog. A refusal (a policy that maps no tenant to this uid) is an answer too. */
static bool listening(const char *sock)
{
    ringlm_client *c = NULL;
    int r = ringlm_connect(sock, &c);
    if (r == 0) {
        ringlm_close(c);
        return true;
    }
    return r != -ECONNREFUSED && r != -ENOENT && r != -ETIMEDOUT;
}

void th_daemon_start(th_daemon *d, const char *const *args, int timeout_ms)
{
    if (!d->dir[0]) th_daemon_init(d);
    bool test_build = args && args[0] && !strcmp(args[0], TH_TEST_BUILD);
    if (test_build) args++;
    char *prog = th_program(test_build ? "ringlmd-test" : "ringlmd");
    const char *argv[64];
    int a = 0;
    argv[a++] = prog;
    argv[a++] = "--socket";
    argv[a++] = d->sock;
    argv[a++] = "--numa-node";
    argv[a++] = "off";
    for (int i = 0; args && args[i]; i++) {
        cr_assert_lt(a, 63, "too many ringlmd arguments");
        argv[a++] = args[i];
    }
    argv[a] = NULL;
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        /* A test that fails (or times out) half-way must not leave its daemon behind. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        /* Nothing of the test harness's (Criterion keeps its arena open) leaks in. */
        close_range(3, ~0u, 0);
        execv(prog, (char *const *)argv);
        _exit(127);
    }
    free(prog);
    d->pid = pid;
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            d->pid = 0;
            cr_assert_fail("ringlmd exited at start (status 0x%x): %s", st, th_daemon_output(d));
        }
        if (listening(d->sock)) return;
        if (th_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            d->pid = 0;
            cr_assert_fail("ringlmd did not listen on %s within %d ms: %s", d->sock, timeout_ms,
                           th_daemon_output(d));
        }
        th_pause_ms(2);
    }
}

int th_daemon_stop(th_daemon *d, int sig, int timeout_ms)
{
    if (!d->pid) return -1;
    kill(d->pid, sig);
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    int st = 0;
    for (;;) {
        pid_t w = waitpid(d->pid, &st, WNOHANG);
        if (w == d->pid) break;
        if (w < 0 && errno == ECHILD) { /* the test reaped it itself */
            d->pid = 0;
            return -1;
        }
        if (th_now_ms() > deadline) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &st, 0);
            d->pid = 0;
            return 999;
        }
        th_pause_ms(2);
    }
    d->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void th_daemon_cleanup(th_daemon *d)
{
    if (d->pid) th_daemon_stop(d, SIGKILL, 2000);
    /* Whatever the test was about, the daemon moved no request through a state change its
     * table forbids (daemon/reqstate.h: such a move is only counted and logged). */
    FILE *log = d->dir[0] ? fopen(d->log, "r") : NULL;
    if (log) {
        char line[512];
        while (fgets(line, sizeof line, log))
            cr_expect_null(strstr(line, "internal error: request"), "ringlmd said: %s", line);
        fclose(log);
    }
    if (!d->dir[0] || getenv("RINGLM_KEEP_TEST_DIRS")) return;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
    if (system(cmd) != 0) { /* best effort */
    }
    d->dir[0] = 0;
}

char *th_http_get(int port, const char *path, int *status, char *content_type, size_t ct_cap)
{
    char spec[32], err[256];
    snprintf(spec, sizeof spec, "127.0.0.1:%d", port);
    return prom_http_get(spec, path, status, content_type, ct_cap, err, sizeof err);
}

/* ---- misbehaving clients ---------------------------------------------------------------- */

int th_unix_connect(const char *path, bool nonblock)
{
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) return -errno;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

int th_tcp_connect_from(const char *src, int port, bool nonblock)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) return -errno;
    struct sockaddr_in me = {.sin_family = AF_INET};
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (inet_pton(AF_INET, src, &me.sin_addr) != 1 ||
        bind(fd, (struct sockaddr *)&me, sizeof me) < 0 ||
        (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS)) {
        int e = errno ? errno : EINVAL;
        close(fd);
        return -e;
    }
    return fd;
}

bool th_readable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, timeout_ms) == 1;
}

/* Whether every thread of pid is stopped: each /proc/PID/task/TID/stat's state (the field
 * after the command name, which may hold spaces and parentheses) is 'T'. */
static bool all_threads_stopped(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    if (!d) return false;
    bool all = true, any = false;
    struct dirent *e;
    while (all && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[sizeof dir + sizeof e->d_name + 8], line[512];
        snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* a thread that has just exited */
        size_t n = fread(line, 1, sizeof line - 1, f);
        fclose(f);
        line[n] = '\0';
        const char *close_paren = strrchr(line, ')');
        any = true;
        all = close_paren && close_paren[1] == ' ' && close_paren[2] == 'T';
    }
    closedir(d);
    return all && any;
}

void th_suspend(pid_t pid, int timeout_ms)
{
    cr_assert_eq(kill(pid, SIGSTOP), 0, "SIGSTOP to %d: %s", (int)pid, strerror(errno));
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    while (!all_threads_stopped(pid)) {
        if (th_now_ms() > deadline) {
            kill(pid, SIGCONT);
            cr_assert_fail("process %d not stopped %d ms after SIGSTOP", (int)pid, timeout_ms);
        }
        th_pause_ms(1);
    }
}

void th_resume(pid_t pid)
{
    cr_assert_eq(kill(pid, SIGCONT), 0, "SIGCONT to %d: %s", (int)pid, strerror(errno));
}

int th_reap(pid_t pid, int timeout_ms)
{
    int st = 0;
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (th_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        usleep(2000);
    }
    return st;
}

/* ---- processes and sockets ----------------------------------------------------------- */

int th_run(char *const argv[], char **out, char **err, int timeout_s)
{
    int po[2], pe[2];
    cr_assert(pipe2(po, O_CLOEXEC) == 0 && pipe2(pe, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    size_t cap[2] = {4096, 4096}, len[2] = {0, 0};
    char *buf[2] = {malloc(4096), malloc(4096)};
    int fds[2] = {po[0], pe[0]}, open_n = 2;
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_s * 1000;
    while (open_n > 0) {
        struct pollfd p[2];
        int n = 0, map[2];
        for (int i = 0; i < 2; i++)
            if (fds[i] >= 0) {
                p[n] = (struct pollfd){.fd = fds[i], .events = POLLIN};
                map[n++] = i;
            }
        uint64_t now = th_now_ms();
        if (now >= deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            cr_assert_fail("%s did not finish within %d s; stdout so far: %.*s", argv[0], timeout_s,
                           (int)len[0], buf[0]);
        }
        if (poll(p, (nfds_t)n, (int)(deadline - now)) <= 0) continue;
        for (int j = 0; j < n; j++) {
            if (!p[j].revents) continue;
            int i = map[j];
            if (len[i] + 1024 >= cap[i]) buf[i] = realloc(buf[i], cap[i] *= 2);
            ssize_t r = read(fds[i], buf[i] + len[i], cap[i] - len[i] - 1);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                close(fds[i]);
                fds[i] = -1;
                open_n--;
            } else {
                len[i] += (size_t)r;
            }
        }
    }
    buf[0][len[0]] = 0;
    buf[1][len[1]] = 0;
    int st;
    waitpid(pid, &st, 0);
    *out = buf[0];
    if (err)
        *err = buf[1];
    else
        free(buf[1]);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

char *th_read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return strdup("");
    size_t cap = 4096, len = 0, n;
    char *b = malloc(cap);
    while ((n = fread(b + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len + 1 >= cap) b = realloc(b, cap *= 2);
    }
    b[len] = 0;
    fclose(f);
    return b;
}

void th_proc_start(th_proc *p, const char *const *argv, const char *log)
{
    snprintf(p->log, sizeof p->log, "%s", log);
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        close_range(3, ~0u, 0);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    p->pid = pid;
}

static int exit_code(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int th_proc_wait(th_proc *p, int timeout_ms)
{
    if (!p->pid) return -1;
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    int st;
    for (;;) {
        pid_t w = waitpid(p->pid, &st, WNOHANG);
        if (w == p->pid) {
            p->pid = 0;
            return exit_code(st);
        }
        if (w < 0 || th_now_ms() > deadline) return -1;
        th_pause_ms(5);
    }
}

int th_proc_stop(th_proc *p, int sig, int timeout_ms)
{
    if (!p->pid) return -1;
    kill(p->pid, sig);
    int rc = th_proc_wait(p, timeout_ms);
    if (rc >= 0 || !p->pid) return rc;
    int st;
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    p->pid = 0;
    return 999;
}

int th_proc_log_int(th_proc *p, const char *marker, int timeout_ms)
{
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        char *log = th_read_file(p->log);
        char *m = strstr(log, marker);
        if (m) {
            int v = atoi(m + strlen(marker));
            free(log);
            return v;
        }
        int st;
        if (p->pid && waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = 0;
            cr_assert_fail("%s exited (status %d) before writing '%s': %s", p->log, exit_code(st),
                           marker, log);
        }
        if (th_now_ms() > deadline)
            cr_assert_fail("no '%s' in %s within %d ms: %s", marker, p->log, timeout_ms, log);
        free(log);
        th_pause_ms(5);
    }
}

int th_tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0, "socket: %s", strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    cr_assert(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect to port %d: %s", port,
              strerror(errno));
    return fd;
}

void th_send_all(int fd, const void *buf, size_t n)
{
    const char *s = buf;
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        cr_assert(w > 0, "send: %s", strerror(errno));
        s += w;
        n -= (size_t)w;
    }
}

char *th_read_until(int fd, const char *until, int timeout_ms, bool *eof)
{
    size_t cap = 8192, len = 0;
    char *b = malloc(cap);
    b[0] = 0;
    *eof = false;
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    while (!(until && strstr(b, until))) {
        uint64_t now = th_now_ms();
        if (now >= deadline) break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(deadline - now)) <= 0) continue;
        if (len + 4096 >= cap) b = realloc(b, cap *= 2);
        ssize_t r = recv(fd, b + len, cap - len - 1, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            *eof = true;
            break;
        }
        len += (size_t)r;
        b[len] = 0;
    }
    return b;
}
