/* SPDX-License-Identifier: MIT */
/*
 * perf/bench_util.h — what the benchmarks share (header only: perf programs are single
 * files). The statistics every benchmark reports — one median, so "median" means the same
 * figure in every bench — and, for the benches that run a real ringlmd (and gateway):
 * starting the processes they measure with their output in a log, stopping them, reading a
 * port from a log, fetching /metrics, reading one Prometheus sample, a private temporary
 * directory removed at the end, dying with everything cleaned up, and printing the JSON
 * result (jansson).
 *
 * Processes: bench_spawn registers the child; bench_die and bench_cleanup stop every
 * registered child still running (SIGTERM, then SIGKILL after 15 s) and remove the
 * directory bench_mkdtemp made. The children also get SIGKILL if the bench itself dies
 * (PR_SET_PDEATHSIG), so nothing outlives a run.
 */
#ifndef RINGLM_PERF_BENCH_UTIL_H
#define RINGLM_PERF_BENCH_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- statistics -------------------------------------------------------------------------- */

/* Ascending order of doubles, for qsort. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Percentile q in [0, 1] of v[0..n) (sorts v in place), interpolating linearly between
 * ranks (numpy's default); 0 when n <= 0. */
static inline double bench_percentile(double *v, int n, double q)
{
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    double pos = q * (double)(n - 1);
    int lo = (int)pos;
    if (lo >= n - 1) return v[n - 1];
    return v[lo] + (pos - (double)lo) * (v[lo + 1] - v[lo]);
}

/* Median of v[0..n) (sorts v in place); the mean of the middle two when n is even, 0 when
 * n <= 0. */
static inline double bench_median(double *v, int n)
{
    return bench_percentile(v, n, 0.5);
}

/* ---- time -------------------------------------------------------------------------------- */

static inline uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t bench_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t bench_now_us(void)
{
    return bench_now_ns() / 1000;
}

/* ---- dying cleanly ----------------------------------------------------------------------- */

#define BENCH_MAX_CHILDREN 8
static const char *bench_prog __attribute__((unused)) = "bench"; /* set from main */
static pid_t bench_children[BENCH_MAX_CHILDREN] __attribute__((unused));
static char bench_dir[128] __attribute__((unused));

/* SIGTERM, up to 15 s for it to exit, then SIGKILL; *pid = -1 after.  Nothing when
 * *pid <= 0.  Returns its wait status (-1 if none). */
static inline int bench_stop(pid_t *pid)
{
    int st = -1;
    if (*pid <= 0) return -1;
    kill(*pid, SIGTERM);
    for (int i = 0; i < 1500; i++) {
        if (waitpid(*pid, &st, WNOHANG) == *pid) goto done;
        usleep(10000);
    }
    kill(*pid, SIGKILL);
    waitpid(*pid, &st, 0);
done:
    for (int i = 0; i < BENCH_MAX_CHILDREN; i++)
        if (bench_children[i] == *pid) bench_children[i] = 0;
    *pid = -1;
    return st;
}

static inline int bench_rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    remove(path); /* best effort: keep going */
    return 0;
}

/* Stop every child bench_spawn started, the last started first (a gateway before the daemon
 * it talks to), and remove bench_mkdtemp's directory. */
static inline void bench_cleanup(void)
{
    for (int i = BENCH_MAX_CHILDREN - 1; i >= 0; i--)
        if (bench_children[i] > 0) {
            pid_t p = bench_children[i];
            bench_stop(&p);
        }
    if (bench_dir[0]) {
        nftw(bench_dir, bench_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        bench_dir[0] = 0;
    }
}

static inline void bench_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static inline void bench_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", bench_prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    bench_cleanup();
    exit(1);
}

/* A private directory /tmp/ringlm-TAG-XXXXXX (bench_dir), removed by bench_cleanup. */
static inline const char *bench_mkdtemp(const char *tag)
{
    snprintf(bench_dir, sizeof bench_dir, "/tmp/ringlm-%s-XXXXXX", tag);
    if (!mkdtemp(bench_dir)) {
        bench_dir[0] = 0;
        bench_die("mkdtemp: %s", strerror(errno));
    }
    return bench_dir;
}

/* ---- what a gateway bench runs ----------------------------------------------------------- */

/* Fills what the command line left NULL: *model and *tok with stories260K and tok512 from
 * $RINGLM_SHARED/models (../shared when unset), *bin with the bin/ beside the folder argv0
 * is in (build/perf/gateway_bench → build/perf/../bin). Dies when the model or the
 * tokenizer is not readable. */
static inline void bench_default_files(const char *argv0, const char **model, const char **tok,
                                       const char **bin)
{
    static char mbuf[512], tbuf[512], bbuf[512];
    const char *shared = getenv("RINGLM_SHARED");
    if (!shared || !*shared) shared = "../shared";
    if (!*model) snprintf(mbuf, sizeof mbuf, "%s/models/stories260K.bin", shared), *model = mbuf;
    if (!*tok) snprintf(tbuf, sizeof tbuf, "%s/models/tok512.bin", shared), *tok = tbuf;
    if (!*bin) {
        snprintf(bbuf, sizeof bbuf, "%s", argv0);
        char *sl = strrchr(bbuf, '/');
        if (sl)
            *sl = 0;
        else
            snprintf(bbuf, sizeof bbuf, ".");
        strncat(bbuf, "/../bin", sizeof bbuf - strlen(bbuf) - 1);
        *bin = bbuf;
    }
    if (access(*model, R_OK) || access(*tok, R_OK))
        bench_die("model %s / tokenizer %s not readable (set RINGLM_SHARED)", *model, *tok);
}

/* Raises the open-file limit to its hard limit (a bench holding thousands of sockets);
 * returns that limit (0 when it cannot be read). */
static inline rlim_t bench_raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    return rl.rlim_cur;
}

/* ---- the processes measured --------------------------------------------------------------- */

/* Start argv[0] with stdout and stderr in `log` (truncated); registered for bench_cleanup. */
static inline pid_t bench_spawn(char *const argv[], const char *log)
{
    int slot = 0;
    while (slot < BENCH_MAX_CHILDREN && bench_children[slot] > 0) slot++;
    if (slot == BENCH_MAX_CHILDREN) bench_die("more than %d processes at once", BENCH_MAX_CHILDREN);
    pid_t pid = fork();
    if (pid < 0) bench_die("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    bench_children[slot] = pid;
    return pid;
}

/* The number after `marker` in `log` (e.g. "metrics on port "), polled for up to 30 s;
 * dies when it never appears or `pid` (when > 0) exits first. */
static inline int bench_port_from_log(const char *log, const char *marker, pid_t pid)
{
    for (int i = 0; i < 3000; i++) {
        if (pid > 0 && waitpid(pid, NULL, WNOHANG) == pid) {
            for (int k = 0; k < BENCH_MAX_CHILDREN; k++)
                if (bench_children[k] == pid) bench_children[k] = 0;
            bench_die("%s exited at start (see %s)", log, log);
        }
        FILE *f = fopen(log, "r");
        if (f) {
            char buf[8192];
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            buf[n] = 0;
            fclose(f);
            char *m = strstr(buf, marker);
            if (m) return atoi(m + strlen(marker));
        }
        usleep(10000);
    }
    bench_die("no '%s' in %s after 30 s", marker, log);
}

/* Wait up to 30 s for `path` (a socket) to exist; dies otherwise. */
static inline void bench_wait_path(const char *path)
{
    struct stat sb;
    for (int i = 0; stat(path, &sb) != 0; i++) {
        if (i > 3000) bench_die("%s did not appear in 30 s", path);
        usleep(10000);
    }
}

/* A TCP connection to host:port (dotted IPv4), blocking, TCP_NODELAY; dies on an error. */
static inline int bench_tcp_connect(const char *host, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) bench_die("socket: %s", strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) bench_die("bad address %s", host);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        bench_die("connect %s:%d: %s", host, port, strerror(errno));
    return fd;
}

/* GET path from 127.0.0.1:port, HTTP/1.1, Connection: close: the whole response (status
 * line, headers, body), malloc()ed; dies on a connection error. */
static inline char *bench_http_get(int port, const char *path)
{
    int fd = bench_tcp_connect("127.0.0.1", port);
    char req[256];
    int n =
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n)
        bench_die("write to 127.0.0.1:%d: %s", port, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    ssize_t r;
    while (b && (r = read(fd, b + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (len + 1024 > cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) free(b);
            b = nb;
        }
    }
    close(fd);
    if (!b) bench_die("out of memory");
    b[len] = 0;
    return b;
}

/* The value of the first sample of metric `name` in a Prometheus text exposition (labels,
 * if any, skipped); 0 when absent. */
static inline double bench_metric(const char *text, const char *name)
{
    size_t l = strlen(name);
    for (const char *p = strstr(text, name); p; p = strstr(p + 1, name))
        if ((p == text || p[-1] == '\n') && (p[l] == ' ' || p[l] == '{')) {
            const char *v = p[l] == '{' ? strchr(p, '}') : p + l;
            return v ? strtod(v + 1, NULL) : 0;
        }
    return 0;
}

/* ---- request text -------------------------------------------------------------------------- */

/* len bytes of seeded story prose (lower-case words, a comma now and then; nothing JSON must
 * escape), malloc()ed: the 1 KB prompt the gateway's benches send and prepare. */
static inline char *bench_prose(size_t len, unsigned seed)
{
    static const char *const words[] = {
        "the",  "a",   "once",    "upon",   "time",  "there", "was",   "little",  "girl",   "named",
        "Lily", "she", "liked",   "to",     "play",  "in",    "park",  "with",    "her",    "dog",
        "sun",  "was", "shining", "and",    "birds", "sang",  "happy", "because", "friend", "tree",
        "big",  "red", "ball",    "jumped", "over",  "river", "mom",   "said",    "let's",  "go"};
    const size_t nw = sizeof words / sizeof words[0];
    char *s = malloc(len + 64);
    if (!s) bench_die("out of memory");
    size_t n = 0;
    while (n < len) {
        seed = seed * 1103515245u + 12345u;
        const char *w = words[(seed >> 16) % nw];
        if (n) s[n++] = (seed >> 8) % 16 == 0 ? ',' : ' ';
        memcpy(s + n, w, strlen(w));
        n += strlen(w);
    }
    s[len] = '\0';
    return s;
}

/* ---- output -------------------------------------------------------------------------------- */

/* Print a JSON result on one line of stdout (keys in insertion order) and free it. */
static inline void bench_json_print(json_t *o)
{
    if (!o) bench_die("out of memory building the JSON result");
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
    if (!s) bench_die("out of memory writing the JSON result");
    puts(s);
    free(s);
    json_decref(o);
}

#endif
