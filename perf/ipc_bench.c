/* SPDX-License-Identifier: MIT */
/*
 * ipc_bench — what the shared-memory transport costs, against a Unix socket measured
 * between the same two processes in the same run.
 *
 * The daemon side is a forked child running the real event loop (daemon/loop.c) with the
 * echo service (daemon/echo.c): the same code as `ringlmd --echo`.  The client side is
 * this process using libringlm.
 *
 *   shm_rtt_ns        submit a 1-token request → its TOKEN event arrives; both sides spin
 *   shm_sleep_rtt_ns  same, the client sleeps on its futex at once and the daemon sleeps
 *                     in io_uring after 1 µs idle (doorbell wakes both ways)
 *   uds_rtt_ns        16-byte SOCK_SEQPACKET message there and back (blocking recv)
 *   events_per_s      one request of --events tokens streamed daemon → client, default
 *                     spin-then-sleep on both sides (events_per_s_spinning: both spin)
 *   ring_thread_events_per_s  (--ring-threads) the bare event ring between two threads
 *                     of this process with the same futex sleep protocol; checks order,
 *                     loss and duplication (this is the mode to run under TSAN: Criterion
 *                     cannot start under ThreadSanitizer, see Snaipe/Criterion#274)
 *
 * usage: ipc_bench [--json] [--iters N] [--uds-iters N] [--sleep-iters N] [--events N]
 *                  [--no-pin] [--ring-threads N]
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

#include "daemon/echo.h"
#include "daemon/loop.h"
#include "ringlm.h"
#include "shm/ring.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void pin_cpu(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
}

static cpu_set_t all_cpus;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

struct stats {
    uint64_t p50, p90, p99, max, n;
};

static struct stats summarize(uint64_t *v, size_t n)
{
    struct stats s = {0};
    if (!n) return s;
    qsort(v, n, sizeof(*v), cmp_u64);
    s.p50 = v[n / 2];
    s.p90 = v[(size_t)(n * 0.90)];
    s.p99 = v[(size_t)(n * 0.99)];
    s.max = v[n - 1];
    s.n = n;
    return s;
}

/* ---- daemon child ------------------------------------------------------------------- */
static int run_daemon(const char *path, unsigned idle_spin_us, int uds_fd, int cpu)
{
    if (uds_fd >= 0) {
        /* The socket baseline first: plain blocking echo of each message. */
        char buf[64];
        for (;;) {
            ssize_t n = recv(uds_fd, buf, sizeof(buf), 0);
            if (n <= 1) break;
            if (send(uds_fd, buf, (size_t)n, 0) != n) break;
        }
        close(uds_fd);
    }
    /* Pinned only for the spinning phases: blocking round trips on a busy machine
	 * are faster when the scheduler may pick any idle CPU for the woken side. */
    if (cpu >= 0) pin_cpu(cpu);
    /* The loop reads SIGTERM (how the bench stops it) through its signalfd. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    echo_svc *svc;
    dloop *loop;
    dloop_config cfg;
    dloop_config_init(&cfg);
    cfg.socket_path = path;
    cfg.idle_spin_us = idle_spin_us;
    if (echo_create(&svc) < 0 || dloop_create(&cfg, &echo_ops, svc, &loop) < 0) {
        fprintf(stderr, "ipc_bench: daemon: %s\n", dloop_errmsg());
        return 1;
    }
    echo_attach(svc, loop);
    dloop_run(loop); /* until SIGTERM (signalfd) */
    dloop_destroy(loop);
    echo_destroy(svc);
    return 0;
}

static pid_t start_daemon(const char *path, unsigned idle_spin_us, int uds_fd, int other_fd,
                          int cpu)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (other_fd >= 0) close(other_fd);
        _exit(run_daemon(path, idle_spin_us, uds_fd, cpu));
    }
    return pid;
}

static int connect_retry(const char *path, ringlm_client **c)
{
    uint64_t deadline = now_ns() + 5000000000ull;
    int r;
    while ((r = ringlm_connect(path, c)) < 0 && now_ns() < deadline) usleep(1000);
    if (r < 0)
        fprintf(stderr, "ipc_bench: connect %s: %s (%s)\n", path, ringlm_strerror(r),
                ringlm_errdetail());
    return r;
}

static void stop_daemon(pid_t pid)
{
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* ---- client measurements ------------------------------------------------------------ */
static int shm_rtt(ringlm_client *c, uint64_t *lat, size_t iters, size_t warmup)
{
    int32_t prompt[1] = {42};
    ringlm_request req;
    ringlm_request_init(&req);
    req.prompt = prompt;
    req.n_prompt = 1;
    req.max_new_tokens = 1;
    ringlm_event ev;
    for (size_t i = 0; i < iters + warmup; i++) {
        uint64_t id, t0 = now_ns();
        int r = ringlm_submit(c, &req, &id);
        if (r < 0) {
            fprintf(stderr, "ipc_bench: submit: %s (%s)\n", ringlm_strerror(r), ringlm_errdetail());
            return r;
        }
        do {
            r = ringlm_next_event(c, &ev, 5000);
        } while (r == 1 && ev.kind != RINGLM_EV_TOKEN);
        uint64_t t1 = now_ns();
        if (r != 1 || ev.req_id != id) {
            fprintf(stderr, "ipc_bench: next_event %d: %s\n", r, ringlm_errdetail());
            return -EIO;
        }
        if (i >= warmup) lat[i - warmup] = t1 - t0;
        r = ringlm_next_event(c, &ev, 5000); /* its FINISH, same publish */
        if (r != 1 || ev.kind != RINGLM_EV_FINISH) return -EIO;
    }
    return 0;
}

static double stream(ringlm_client *c, uint32_t n_events)
{
    int32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ringlm_request req;
    ringlm_request_init(&req);
    req.prompt = prompt;
    req.n_prompt = 8;
    req.max_new_tokens = n_events;
    ringlm_event ev;
    uint64_t id, got = 0, t0 = now_ns();
    if (ringlm_submit(c, &req, &id) < 0) return -1;
    for (;;) {
        int r = ringlm_next_event(c, &ev, 5000);
        if (r != 1) return -1;
        if (ev.kind == RINGLM_EV_TOKEN) {
            if (ev.index != got) return -1;
            got++;
        } else {
            break;
        }
    }
    uint64_t t1 = now_ns();
    return got == n_events ? (double)got * 1e9 / (double)(t1 - t0) : -1;
}

static int uds_rtt(int fd, uint64_t *lat, size_t iters, size_t warmup)
{
    char msg[16] = "0123456789abcde", back[64];
    for (size_t i = 0; i < iters + warmup; i++) {
        uint64_t t0 = now_ns();
        if (send(fd, msg, sizeof(msg), 0) != sizeof(msg) ||
            recv(fd, back, sizeof(back), 0) != sizeof(msg))
            return -EIO;
        if (i >= warmup) lat[i - warmup] = now_ns() - t0;
    }
    char quit = 'q';
    return send(fd, &quit, 1, 0) == 1 ? 0 : -EIO;
}

/* ---- the bare ring between two threads (no daemon) ------------------------------------ */
struct duo {
    struct ringlm_wire_event slots[1024];
    uint64_t prod __attribute__((aligned(128)));
    uint32_t prod_sleeping __attribute__((aligned(128)));
    uint64_t cons __attribute__((aligned(128)));
    uint32_t cons_sleeping __attribute__((aligned(128)));
    uint64_t n;
    int spin;
};

static void *duo_producer(void *arg)
{
    struct duo *d = arg;
    struct ring_ev_prod p = {
        .slots = d->slots, .mask = 1023, .prod_p = &d->prod, .cons_p = &d->cons};
    char why[128];
    for (uint64_t i = 0; i < d->n;) {
        int64_t space = ring_ev_space(&p, 1, why, sizeof(why));
        if (space <= 0) {
            for (int s = 0; s < d->spin && ring_ev_space(&p, 1, why, sizeof(why)) <= 0; s++)
                ring_cpu_relax();
            if (ring_ev_space(&p, 1, why, sizeof(why)) > 0) continue;
            ring_handshake_announce(&d->prod_sleeping);
            uint64_t c = ring_load_acquire(&d->cons);
            if (c == p.cached_cons)
                futex_wait((const uint32_t *)&d->cons, (uint32_t)c, -1, FUTEX_SCOPE_SHARED);
            ring_store32(&d->prod_sleeping, 0);
            continue;
        }
        for (int64_t k = 0; k < space && i < d->n; k++, i++) {
            struct ringlm_wire_event e = {.req_id = i,
                                          .value = (int32_t)i,
                                          .meta = RINGLM_WIRE_EV_META(RINGLM_WIRE_EV_TOKEN, i)};
            ring_ev_put(&p, &e);
        }
        ring_ev_publish(&p);
        if (ring_handshake_peer_waits(&d->cons_sleeping))
            futex_wake((const uint32_t *)&d->prod, 1, FUTEX_SCOPE_SHARED);
    }
    return NULL;
}

static void *duo_consumer(void *arg)
{
    struct duo *d = arg;
    struct ring_ev_cons c = {
        .slots = d->slots, .mask = 1023, .prod_p = &d->prod, .cons_p = &d->cons};
    char why[128];
    for (uint64_t expect = 0; expect < d->n;) {
        int64_t n = ring_ev_avail(&c, 1, why, sizeof(why));
        if (n < 0) return (void *)"impossible index";
        if (n == 0) {
            for (int s = 0; s < d->spin && ring_ev_avail(&c, 1, why, sizeof(why)) == 0; s++)
                ring_cpu_relax();
            if (ring_ev_avail(&c, 1, why, sizeof(why)) > 0) continue;
            ring_handshake_announce(&d->cons_sleeping);
            uint64_t p = ring_load_acquire(&d->prod);
            if (p == c.cons)
                futex_wait((const uint32_t *)&d->prod, (uint32_t)p, -1, FUTEX_SCOPE_SHARED);
            ring_store32(&d->cons_sleeping, 0);
            continue;
        }
        for (int64_t k = 0; k < n; k++, expect++)
            if (ring_ev_peek(&c, (uint64_t)k).req_id != expect)
                return (void *)"event lost, duplicated or out of order";
        ring_ev_consume(&c, (uint64_t)n);
        if (ring_handshake_peer_waits(&d->prod_sleeping))
            futex_wake((const uint32_t *)&d->cons, 1, FUTEX_SCOPE_SHARED);
    }
    return NULL;
}

/* Returns events/s, or -1 when the consumer saw a wrong sequence. */
static double ring_threads(uint64_t n, int spin)
{
    struct duo *d = calloc(1, sizeof(*d));
    if (!d) return -1;
    d->n = n;
    d->spin = spin;
    pthread_t tp, tc;
    void *err = NULL;
    uint64_t t0 = now_ns();
    pthread_create(&tc, NULL, duo_consumer, d);
    pthread_create(&tp, NULL, duo_producer, d);
    pthread_join(tp, NULL);
    pthread_join(tc, &err);
    uint64_t t1 = now_ns();
    int ok = !err && d->cons == n;
    if (err) fprintf(stderr, "ipc_bench: ring threads: %s\n", (const char *)err);
    free(d);
    return ok ? (double)n * 1e9 / (double)(t1 - t0) : -1;
}

int main(int argc, char **argv)
{
    int json = 0, pin = 1;
    size_t iters = 200000, uds_iters = 20000, sleep_iters = 5000;
    uint32_t events = 20000000;
    uint64_t ring_thread_events = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--ring-threads") && i + 1 < argc)
            ring_thread_events = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--no-pin"))
            pin = 0;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--uds-iters") && i + 1 < argc)
            uds_iters = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--sleep-iters") && i + 1 < argc)
            sleep_iters = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--events") && i + 1 < argc)
            events = (uint32_t)strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: ipc_bench [--json] [--iters N] [--uds-iters N] [--sleep-iters "
                            "N] [--events N] [--no-pin]\n"
                            "       ipc_bench --ring-threads N [--json]   (in-process ring check, "
                            "e.g. under TSAN)\n");
            return 2;
        }
    }
    if (!iters || !uds_iters || !sleep_iters || !events || events > RINGLM_WIRE_INDEX_MAX) {
        fprintf(stderr, "ipc_bench: counts must be >= 1 (events <= %u)\n", RINGLM_WIRE_INDEX_MAX);
        return 2;
    }
    if (ring_thread_events) {
        /* Sleep-heavy (no spinning) then spinning; both verify every event. */
        double sleeping = ring_threads(ring_thread_events, 0);
        double spinning = ring_threads(ring_thread_events, 4000);
        if (sleeping < 0 || spinning < 0) return 1;
        if (json)
            printf(
                "{\"ring_thread_events_per_s\":{\"sleeping\":%.0f,\"spinning\":%.0f},\"n\":%llu}\n",
                sleeping, spinning, (unsigned long long)ring_thread_events);
        else
            printf("bare ring, two threads: %.1f M events/s sleeping, %.1f M events/s spinning "
                   "(%llu events each, verified)\n",
                   sleeping / 1e6, spinning / 1e6, (unsigned long long)ring_thread_events);
        return 0;
    }
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int cpu_d = -1, cpu_c = -1;
    if (pin && ncpu >= 2) {
        cpu_d = 0;
        cpu_c = 1;
    }
    char dir[] = "/tmp/ipc_bench.XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char spin_path[64], sleep_path[64];
    snprintf(spin_path, sizeof(spin_path), "%s/spin.sock", dir);
    snprintf(sleep_path, sizeof(sleep_path), "%s/sleep.sock", dir);
    uint64_t *lat_shm = calloc(iters, 8), *lat_uds = calloc(uds_iters, 8),
             *lat_sleep = calloc(sleep_iters, 8);
    if (!lat_shm || !lat_uds || !lat_sleep) return 1;

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        perror("socketpair");
        return 1;
    }
    /* Spinning daemon (idle spin 10 s: it never sleeps during the run). */
    sched_getaffinity(0, sizeof(all_cpus), &all_cpus);
    pid_t d1 = start_daemon(spin_path, 10u * 1000 * 1000, sv[1], sv[0], cpu_d);
    close(sv[1]);
    int rc = 1;
    double eps = -1, eps_spin = -1;
    struct stats s_uds, s_shm, s_sleep;
    ringlm_client *c = NULL;

    if (uds_rtt(sv[0], lat_uds, uds_iters, uds_iters / 10) < 0) {
        fprintf(stderr, "ipc_bench: unix socket round trips failed\n");
        goto out1;
    }
    close(sv[0]);
    if (cpu_c >= 0) pin_cpu(cpu_c);
    if (connect_retry(spin_path, &c) < 0) goto out1;
    ringlm_set_option(c, RINGLM_OPT_SPIN_US, 60L * 1000 * 1000);
    if (shm_rtt(c, lat_shm, iters, iters / 10) < 0) goto out1;
    eps_spin = stream(c, events);
    if (eps_spin < 0) {
        fprintf(stderr, "ipc_bench: streaming failed: %s\n", ringlm_errdetail());
        goto out1;
    }
    ringlm_close(c);
    c = NULL;
    stop_daemon(d1);
    d1 = -1;

    /* Streaming with the defaults (daemon and client spin 50 µs, then sleep): when the
	 * CPUs are shared, sleeping lets the other side run and batches grow to the ring
	 * size, which beats two spinners taking turns on a busy machine. */
    sched_setaffinity(0, sizeof(all_cpus), &all_cpus);
    char dflt_path[80];
    snprintf(dflt_path, sizeof(dflt_path), "%s/default.sock", dir);
    pid_t d3 = start_daemon(dflt_path, 0, -1, -1, -1);
    if (connect_retry(dflt_path, &c) < 0) {
        stop_daemon(d3);
        goto out1;
    }
    eps = stream(c, events);
    ringlm_close(c);
    c = NULL;
    stop_daemon(d3);
    if (eps < 0) {
        fprintf(stderr, "ipc_bench: streaming (defaults) failed\n");
        goto out1;
    }

    /* Sleeping daemon and client, unpinned (see run_daemon). */
    pid_t d2 = start_daemon(sleep_path, 1, -1, -1, -1);
    if (connect_retry(sleep_path, &c) < 0) {
        stop_daemon(d2);
        goto out1;
    }
    ringlm_set_option(c, RINGLM_OPT_SPIN_US, 0);
    int r = shm_rtt(c, lat_sleep, sleep_iters, sleep_iters / 10);
    ringlm_close(c);
    c = NULL;
    stop_daemon(d2);
    if (r < 0) goto out1;

    s_uds = summarize(lat_uds, uds_iters);
    s_shm = summarize(lat_shm, iters);
    s_sleep = summarize(lat_sleep, sleep_iters);
    double ratio = s_shm.p50 ? (double)s_uds.p50 / (double)s_shm.p50 : 0;
    if (json) {
        printf(
            "{\"shm_rtt_ns\":{\"p50\":%llu,\"p90\":%llu,\"p99\":%llu,\"max\":%llu,\"n\":%llu},"
            "\"uds_rtt_ns\":{\"p50\":%llu,\"p90\":%llu,\"p99\":%llu,\"max\":%llu,\"n\":%llu},"
            "\"shm_sleep_rtt_ns\":{\"p50\":%llu,\"p90\":%llu,\"p99\":%llu,\"max\":%llu,\"n\":%llu},"
            "\"events_per_s\":%.0f,\"events_per_s_spinning\":%.0f,\"uds_over_shm_p50\":%.2f,"
            "\"pinned_spinning_phases\":%s,"
            "\"daemon\":\"forked child running daemon/loop.c + daemon/echo.c\"}\n",
            (unsigned long long)s_shm.p50, (unsigned long long)s_shm.p90,
            (unsigned long long)s_shm.p99, (unsigned long long)s_shm.max,
            (unsigned long long)s_shm.n, (unsigned long long)s_uds.p50,
            (unsigned long long)s_uds.p90, (unsigned long long)s_uds.p99,
            (unsigned long long)s_uds.max, (unsigned long long)s_uds.n,
            (unsigned long long)s_sleep.p50, (unsigned long long)s_sleep.p90,
            (unsigned long long)s_sleep.p99, (unsigned long long)s_sleep.max,
            (unsigned long long)s_sleep.n, eps, eps_spin, ratio, cpu_c >= 0 ? "true" : "false");
    } else {
        printf("round trip (ns)          p50      p90      p99      max        n\n");
        printf("shm, spinning      %8llu %8llu %8llu %8llu %8llu\n", (unsigned long long)s_shm.p50,
               (unsigned long long)s_shm.p90, (unsigned long long)s_shm.p99,
               (unsigned long long)s_shm.max, (unsigned long long)s_shm.n);
        printf("shm, sleeping      %8llu %8llu %8llu %8llu %8llu\n",
               (unsigned long long)s_sleep.p50, (unsigned long long)s_sleep.p90,
               (unsigned long long)s_sleep.p99, (unsigned long long)s_sleep.max,
               (unsigned long long)s_sleep.n);
        printf("unix seqpacket     %8llu %8llu %8llu %8llu %8llu\n", (unsigned long long)s_uds.p50,
               (unsigned long long)s_uds.p90, (unsigned long long)s_uds.p99,
               (unsigned long long)s_uds.max, (unsigned long long)s_uds.n);
        printf("unix / shm (p50)   %.1fx\n", ratio);
        printf("streaming          %.1f M token events/s with default spin/sleep, %.1f M both "
               "spinning (%u events, one client)\n",
               eps / 1e6, eps_spin / 1e6, events);
        printf("(daemon: forked child running the real loop + echo service; %s)\n",
               cpu_c >= 0
                   ? "spinning phases: daemon on cpu 0, client on cpu 1; blocking phases unpinned"
                   : "not pinned");
    }
    rc = 0;
out1:
    if (c) ringlm_close(c);
    if (d1 > 0) stop_daemon(d1);
    rmdir(dir);
    free(lat_shm);
    free(lat_uds);
    free(lat_sleep);
    return rc;
}
