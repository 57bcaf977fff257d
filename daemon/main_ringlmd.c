/* SPDX-License-Identifier: MIT */
/*
 * ringlmd — the ringlm daemon.  It serves a model (--model, the runner in daemon/service.c)
 * or, with --echo, the echo service for transport tests and benchmarks; both plug into the
 * same loop.
 *
 * Built a second time with RINGLM_TEST_KNOBS it is ringlmd-test (make tests; never
 * installed): the same daemon with the test knobs below, which ringlmd neither lists nor
 * accepts (svc_config.test).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <pwd.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/echo.h"
#include "kernels/cpu/blas_core.h"
#include "daemon/kvtier.h"
#include "daemon/loop.h"
#include "daemon/metrics.h"
#include "daemon/service.h"
#include "kernels/engine.h"
#include "numa/rnuma.h"
#include "ringlm.h"

#ifndef RINGLM_VERSION
#define RINGLM_VERSION "dev"
#endif

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: ringlmd [options]\n"
        "  --socket PATH            listen here (default $" RINGLM_SOCKET_ENV
        ", else " RINGLM_DEFAULT_SOCKET ")\n"
        "  --echo                   serve the echo service (transport tests, ipc_bench)\n"
        "  --numa-node auto|N|off   pin the loop and place session memory (default auto)\n"
        "  --max-sessions N         sessions in all (default 256; this and the half-open\n"
        "                           limits are lowered to what the open files limit holds,\n"
        "                           raised to its hard limit at start: said at start)\n"
        "  --max-sessions-per-uid N sessions per client uid (default 64)\n"
        "  --max-half-open N        connections without a handshake yet, in all (default 64)\n"
        "  --max-half-open-per-uid N  the same per client uid (default 8)\n"
        "  --connect-rate-per-uid N sessions a second per client uid, root and the daemon's\n"
        "                           own uid excepted (default 20; 0: no bound)\n"
        "  --connect-burst-per-uid N  sessions at once past that rate (default 64)\n"
        "  --socket-mode MODE       the socket file's mode, octal (default 0666: every local "
        "user)\n"
        "  --socket-group GROUP     the socket file's group (a name or a gid), e.g. with 0660\n"
        "  --spin-us N              keep polling N µs after the last work before sleeping (default "
        "50)\n"
        "  --nice N                 run at nice N (-20..19; below 0 needs CAP_SYS_NICE; default\n"
        "                           -10 where permitted): at -10 a client woken for its token\n"
        "                           no longer preempts the loop\n"
        "  --submit-ring-bytes N    per-session submit ring, power of two (default 1048576)\n"
        "  --event-ring-slots N     per-session event ring, power of two (default 65536)\n"
        "  --doorbell futex|eventfd force the client→daemon doorbell kind (default: probe)\n"
        "model serving (the default service):\n"
        "  --model M                llama2.c checkpoint path or synthetic:PRESET:SEED (required)\n"
        "  --tokenizer T            tokenizer file (tokenizer.bin or GGUF) for constraints; a "
        "GGUF\n"
        "                           model's own is used without it\n"
        "  --policy FILE            scheduling policy (default: the built-in policy)\n"
        "  --backend cpu|cuda       engine backend (default cpu)\n"
        "  --cuda-device N          CUDA device ordinal (default 0)\n"
        "  --cuda-dtype bf16|fp32   CUDA compute type (default bf16; f16 for an all-F16 GGUF\n"
        "                           file). fp32: every matrix in float32 (a diagnostic)\n"
        "  --no-cuda-graphs         CUDA decode steps run eagerly, not as CUDA graphs\n"
        "  --threads N              engine worker threads (default 1)\n"
        "  --prompt-exact           CPU, F32/F16 weights: prompt rows in exact float32 too\n"
        "                           (default: AVX-512 BF16 tiles where the CPU has them)\n"
        "  --packed-weights auto|on|off  CPU with AVX-512 BF16: a copy of the BF16 tiles'\n"
        "                           weights packed once at start (faster prompts, as many\n"
        "                           bytes as BF16/F16 projections), and with AVX-512 VNNI of\n"
        "                           Q4_K/Q6_K weights for decode (1.03x their bytes); auto\n"
        "                           (default): where it takes at most half of the memory\n"
        "                           available at start\n"
        "  --kv-blocks N            device KV pool blocks (default 1024)\n"
        "  --kv-block-size N        tokens per KV block (default 16)\n"
        "  --kv-rings N|off         a model with windowed and global layers (gemma2, gemma3;\n"
        "                           CPU backend): its windowed layers' K/V live in a ring per\n"
        "                           running sequence, N rings (default: as many as the\n"
        "                           windowed layers' share of --kv-blocks holds, 1 to\n"
        "                           max_active_seqs), its blocks hold the global layers only;\n"
        "                           a swap moves a ring (its last window) with the blocks;\n"
        "                           n > 1 samples share the prompt's blocks, each on a copy\n"
        "                           of the leader's ring; other requests hit the prefix\n"
        "                           cache at ring snapshots. off: every layer in the\n"
        "                           blocks, as other models\n"
        "  --kv-ring-snapshot-bytes SIZE|off with rings and the prefix cache: host memory\n"
        "                           for copies of cached blocks' windowed K/V, one ring block\n"
        "                           each (SIZE in bytes, or with K, M, G, T: powers of 1024;\n"
        "                           default: as many bytes as the rings), so other requests\n"
        "                           with a cached prefix hit it; count and bytes logged\n"
        "  --host-kv-blocks N       pinned host KV tier blocks (default 0: no host tier)\n"
        "  --disk-kv FILE           disk KV tier file (O_DIRECT where the filesystem allows)\n"
        "  --disk-kv-blocks N       disk KV tier blocks\n"
        "  --disk-kv-bw B           the disk tier's bandwidth in bytes/s the cost model starts\n"
        "                           from, each direction until a transfer measures it (1e9)\n"
        "  --max-batch-tokens N     engine batch limit (default: the policy's token_budget)\n"
        "  --decision-log FILE      scheduler decisions, JSON lines\n"
        "  --request-log FILE       one line per request (the simulator's native trace format)\n"
        "  --iteration-log FILE     one line per batch: its composition and measured period\n"
        "                           (ringlm-sim --iteration-log fits its step model from it)\n"
        "  --metrics ADDR:PORT      Prometheus /metrics (ADDR defaults to 127.0.0.1)\n"
        "  --kv-events ENDPOINT     publish KV-cache events in vLLM's format (ZMQ PUB, msgpack),\n"
        "                           e.g. tcp://*:5557 (bound; tcp://HOST:PORT connects)\n"
        "  --kv-events-replay ENDPOINT  ZMQ ROUTER that replays recent batches (tcp://*:5558)\n"
        "  --kv-events-encoding array|map  each event a positional array (vLLM 0.11, the\n"
        "                           default) or a map of named fields (current vLLM)\n"
        "  --kv-events-queue N      events the loop may queue for the publisher (65536); past\n"
        "                           it events are dropped and subscribers resynchronised\n"
        "  --served-model-name NAME the model name of the vllm:* metrics (label model_name;\n"
        "                           default: the GGUF's general.name, else the file's base name)\n"
        "  --stats-file FILE        JSON snapshot of pools, queues and accounting, kept current\n"
        "  --backpressure-timeout-ms N  cancel a request whose client stopped reading (default "
        "5000)\n"
        "  --backpressure-buffer-tokens N  tokens kept per blocked request (default 4096)\n"
        "  --max-n N                samples one request may ask for (ringlm_sampling.n; default\n"
        "                           16, at most 256)\n"
        "  --max-records-per-tenant N  submit records taken from one tenant's sessions per\n"
        "                           iteration (default 16; a trusted gateway session: 256)\n"
        "  --drain-grace-ms N       on SIGTERM, in-flight work gets this long (default 10000)\n"
        "  --verify-swaps           checksum KV blocks at swap-out and check them at swap-in\n"
        "  --no-prefix-cache        do not keep prompts' KV blocks for reuse by later prompts\n"
        "  --check-invariants       the stats file carries the scheduler's full invariant check\n"
        "                           (walks every block and request each write: tests, debugging)\n"
        "                           and FILE.prefix-index.json the prefix index's blocks per\n"
        "                           tier, hashed as the KV-cache events hash them\n"
        "  --quiet                  fewer start-up lines\n"
        "  --check-config           validate, print the canonical policy and its hash, say\n"
        "                           which uids may name a tenant per request ([trust]), exit;\n"
        "                           --model is optional (with it, the model is checked too)\n"
        "  --gateway-user USER      with --check-config: fail (exit 1) unless the policy\n"
        "                           trusts USER (a name or a uid), the gateway's user, so\n"
        "                           its API-key tenants are honoured\n"
        "  --version                print the version (with --model: model and policy hash) and "
        "exit\n"
        "  -h, --help\n"
#ifdef RINGLM_TEST_KNOBS
        "test knobs (ringlmd-test only):\n"
        "  --prefix-key xxh3|constant  how cached KV blocks are keyed (default xxh3). constant:\n"
        "                           every block gets one key, so only the stored token compare\n"
        "                           tells blocks apart (shows a collision never reuses a wrong\n"
        "                           block; lookups O(cached blocks); logged as a warning)\n"
        "  --fail-kv-reads host|disk|host,disk  every read from those KV tiers completes with\n"
        "                           EIO (fault injection; logged)\n"
        "  --keep-window-blocks     sequences of a model windowed on every layer keep every\n"
        "                           KV block (the scheduler gets no attention window), and a\n"
        "                           model with windowed and global layers keeps every layer\n"
        "                           in its blocks (no rings): the reference a test compares\n"
        "                           the blocks given back and the rings against\n"
#endif
    );
}

static int parse_uint(const char *opt, const char *v, unsigned long max, unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long x = strtoul(v, &end, 0);
    if (errno || !*v || *end || x > max || v[0] == '-') {
        fprintf(stderr, "ringlmd: %s '%s': expected an integer in [0, %lu]\n", opt, v, max);
        return -1;
    }
    *out = x;
    return 0;
}

/* A count of at least 1, or "off" (-1 in *out). */
static int parse_count_or_off(const char *opt, const char *v, unsigned long max, int *out)
{
    unsigned long x;
    if (!strcmp(v, "off")) {
        *out = -1;
        return 0;
    }
    if (parse_uint(opt, v, max, &x)) return -1;
    if (!x) {
        fprintf(stderr, "ringlmd: %s must be >= 1 or off\n", opt);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* A size in bytes of at least 1, with an optional K, M, G or T (powers of 1024), or "off"
 * (-1 in *out). */
static int parse_bytes_or_off(const char *opt, const char *v, int64_t *out)
{
    if (!strcmp(v, "off")) {
        *out = -1;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    int shift = 0;
    if (*end && !end[1]) {
        const char *units = "KMGT", *u = strchr(units, *end);
        if (u) {
            shift = 10 * (int)(u - units + 1);
            end++;
        }
    }
    if (errno || !*v || *end || v[0] == '-' || !x || x > (1ull << 50) >> shift) {
        fprintf(stderr,
                "ringlmd: %s '%s': expected a size in bytes >= 1 (K, M, G, T: powers of 1024, "
                "at most 1P) or off\n",
                opt, v);
        return -1;
    }
    *out = (int64_t)(x << shift);
    return 0;
}

/* The default socket lives in a directory that may not exist yet (/run/ringlm). */
static void make_parent_dir(const char *path)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return;
    *slash = 0;
    mkdir(dir, 0755);
}

/* A file the daemon will open for writing later (a log): it can be opened, or created in
 * its directory. Nothing is left behind that was not there. */
static int check_output_file(const char *what, const char *path)
{
    if (!path || !strcmp(path, "-")) return 0;
    int fd = open(path, O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) unlink(path); /* the empty file just created */
    }
    if (fd < 0) {
        fprintf(stderr, "ringlmd: %s '%s': %s\n", what, path, strerror(errno));
        return -1;
    }
    close(fd);
    return 0;
}

/* A file replaced by rename (the stats file): its directory must take new files. */
static int check_output_dir(const char *what, const char *path)
{
    if (!path) return 0;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = 0;
    else
        *slash = 0;
    struct stat st;
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || access(dir, W_OK | X_OK) < 0) {
        fprintf(stderr, "ringlmd: %s '%s': directory '%s': %s\n", what, path, dir,
                errno ? strerror(errno) : "not a directory");
        return -1;
    }
    return 0;
}

/* Everything that can be checked without the model, checked before it loads: a real model
 * takes seconds to minutes to load and warm up, and an operator must not wait that long to
 * learn that the socket is taken or a directory is missing. */
static int preflight(const svc_config *sc, const char *socket_path, const char *numa_spec)
{
    if (dloop_check_socket(socket_path) < 0) {
        fprintf(stderr, "ringlmd: %s\n", dloop_errmsg());
        return -1;
    }
    if (sc->metrics_listen && metrics_check_listen(sc->metrics_listen) < 0) {
        fprintf(stderr, "ringlmd: --metrics %s\n", metrics_errmsg());
        return -1;
    }
    if (sc->disk_kv_path && kvtier_check_disk_path(sc->disk_kv_path) < 0) {
        fprintf(stderr, "ringlmd: %s\n", kvtier_errmsg());
        return -1;
    }
    if (check_output_file("--decision-log", sc->decision_log) < 0 ||
        check_output_file("--request-log", sc->request_log) < 0 ||
        check_output_file("--iteration-log", sc->iteration_log) < 0 ||
        check_output_dir("--stats-file", sc->stats_file) < 0)
        return -1;
    if (rnuma_resolve(numa_spec ? numa_spec : "auto") < -1) {
        fprintf(stderr, "ringlmd: --numa-node %s: %s\n", numa_spec, rnuma_errmsg());
        return -1;
    }
    return 0;
}

/* --check-config: who may name a tenant per request. A gateway with API keys sends each
 * request's tenant as a tag, honoured only from a uid the policy lists in [trust]; from any
 * other uid the tags are ignored and every key's requests share the gateway uid's tenant,
 * its fair share and its prefix cache. Returns 1 when gateway_uid (>= 0) is not trusted. */
static int report_trust(const sched_policy *p, long gateway_uid, const char *gateway_user)
{
    const uint32_t *uids;
    uint32_t n = sched_policy_trusted_uids(p, &uids);
    if (!n) {
        fprintf(stderr, "ringlmd: note: [trust] lists no uid: no client may name a tenant per "
                        "request, so a gateway's API-key tenants would all collapse into the "
                        "gateway uid's tenant (tags ignored)\n");
    } else {
        fprintf(stderr, "ringlmd: [trust] uids");
        for (uint32_t i = 0; i < n; i++) fprintf(stderr, " %u", uids[i]);
        fprintf(stderr, " may name a tenant per request (a gateway's API-key tenants)\n");
    }
    if (gateway_uid < 0) return 0;
    if (sched_policy_uid_trusted(p, (uint32_t)gateway_uid)) {
        fprintf(stderr, "ringlmd: the gateway user %s (uid %ld) is trusted\n", gateway_user,
                gateway_uid);
        return 0;
    }
    fprintf(stderr,
            "ringlmd: the gateway user %s (uid %ld) is not in [trust]: its requests' tenant "
            "tags would be ignored and every API key would share one tenant; add uid %ld "
            "to the policy's [trust] uids\n",
            gateway_user, gateway_uid, gateway_uid);
    return 1;
}

/* The model service: --check-config and --version build it (model, policy) and exit.
 * --check-config needs no model: the policy is checked on its own. */
static int serve_model(svc_config *sc, dloop_config *cfg, const char *socket_path,
                       const char *numa_spec, int want_version, int check_config, long gateway_uid,
                       const char *gateway_user)
{
    if (!sc->model && !check_config) {
        fprintf(stderr, "ringlmd: --model is required (a path or synthetic:PRESET:SEED), or "
                        "pass --echo\n");
        return 2;
    }
    if (sc->disk_kv_path && !sc->disk_kv_blocks) {
        fprintf(stderr, "ringlmd: --disk-kv needs --disk-kv-blocks N\n");
        return 2;
    }
    sc->numa = numa_spec;
    /* Checking a config must not allocate the KV pools of the daemon it guards. */
    sc->identity_only = check_config || want_version;
    if (!sc->identity_only) {
        if (!socket_path || !*socket_path) socket_path = getenv(RINGLM_SOCKET_ENV);
        if (!socket_path || !*socket_path) {
            socket_path = RINGLM_DEFAULT_SOCKET;
            make_parent_dir(socket_path);
        }
        if (preflight(sc, socket_path, numa_spec) < 0) return 1;
    }
    svc *s;
    int r = svc_create(sc, &s);
    if (r < 0) {
        fprintf(stderr, "ringlmd: %s\n", svc_errmsg());
        return 1;
    }
    if (check_config || want_version) {
        int rc = 0;
        if (want_version)
            printf("ringlmd %s (wire ABI %u)\nmodel %s %s\npolicy %s %s\n", RINGLM_VERSION,
                   RINGLM_WIRE_ABI, sc->model, svc_model_hash(s),
                   sc->policy_path ? sc->policy_path : "built-in", svc_policy_hash_hex(s));
        else {
            printf("%s# policy hash %s\n", svc_policy_text(s), svc_policy_hash_hex(s));
            rc = report_trust(svc_policy(s), gateway_uid, gateway_user);
        }
        svc_destroy(s);
        return rc;
    }
    cfg->socket_path = socket_path;
    cfg->numa_node = -1; /* the service resolves --numa-node and pins the loop thread */
    r = svc_run(s, cfg);
    if (r < 0)
        fprintf(stderr, "ringlmd: %s\n", svc_errmsg());
    else
        fprintf(stderr, "ringlmd: stopped\n");
    svc_destroy(s);
    return r < 0 ? 1 : 0;
}

/* Threads started before main (a BLAS library's pool, from its constructor) keep their own
 * nice: set theirs too. Best effort. */
#define DEFAULT_NICE (-10)

static void renice_threads(int n)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9')
            setpriority(PRIO_PROCESS, (id_t)atoi(e->d_name), n);
    closedir(d);
}

/* With autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled, the default of many
 * distributions) every session is one scheduling group, and a thread's nice ranks it only
 * within its group: against another session's threads the daemon competes as one group of
 * nice 0 whatever its own nice. A daemon that leads its own session (`setsid ringlmd`, a
 * supervisor that starts it so) gives that group its nice too, so the nice it runs at means
 * the same against every other session (measured under a load of 11-15 from other sessions:
 * one sequence of stories110M in the engine alone at 37 tok/s with its group at -10, 9-11 at
 * 0). Not a session leader: the group is also its parent's, whose priority is not ours to
 * change. Under systemd the service's cgroup ranks it instead (CPUWeight=), and autogroups
 * play no part. Best effort: without /proc/self/autogroup nothing changes. */
static void autogroup_follow_nice(int n)
{
    if (getsid(0) != getpid()) return;
    int fd = open("/proc/self/autogroup", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[16];
    int len = snprintf(buf, sizeof buf, "%d", n);
    if (write(fd, buf, (size_t)len) != len)
        fprintf(stderr, "ringlmd: autogroup nice %d: %s (its session's group stays as it was)\n", n,
                strerror(errno));
    close(fd);
}

/* Signals, once for the whole process.  SIGTERM/SIGINT/SIGHUP are blocked in this thread
 * before any thread is started from here (engine workers, metrics, log writer, all of which
 * inherit the block) and reach the loop through its signalfd, so their default action can
 * never kill the daemon on a worker thread before the drain runs.  Threads that exist
 * before main (OpenBLAS starts its pool in a constructor; CUDA) do not block them: a
 * handler there forwards them to this thread, the loop's.  SIGPIPE: a peer that went away
 * is an error return, not a signal. */
static pthread_t signal_target;

static void forward_signal(int signo)
{
    int saved = errno;
    pthread_kill(signal_target, signo);
    errno = saved;
}

static void install_signals(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal_target = pthread_self();
    struct sigaction sa = {.sa_handler = forward_signal, .sa_flags = SA_RESTART};
    sigfillset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int main(int argc, char **argv)
{
    /* OpenBLAS chose its kernels when it was loaded: where it chose ones below this CPU's
     * (kernels/cpu/blas_core.h), start again with the right ones, before anything is open. */
    blas_core_fix(argv);
    enum {
        O_SOCKET = 256,
        O_ECHO,
        O_NUMA,
        O_MAXS,
        O_MAXU,
        O_SPIN,
        O_SUBMIT,
        O_EVSLOTS,
        O_DOORBELL,
        O_VERSION,
        O_HELP,
        O_MODEL,
        O_TOKENIZER,
        O_POLICY,
        O_BACKEND,
        O_THREADS,
        O_KVB,
        O_KVBS,
        O_HKVB,
        O_DKV,
        O_DKVB,
        O_MAXBT,
        O_DECLOG,
        O_REQLOG,
        O_ITLOG,
        O_METRICS,
        O_SERVED,
        O_KVEV,
        O_KVEVR,
        O_KVEVQ,
        O_KVEVE,
        O_STATS,
        O_BPT,
        O_BPB,
        O_MAXN,
        O_DRAIN,
        O_VERIFY,
        O_QUIET,
        O_CHECK,
        O_NICE,
        O_HALF,
        O_HALFU,
        O_CRATE,
        O_CBURST,
        O_SMODE,
        O_SGROUP,
        O_RECT,
        O_INVARIANTS,
        O_NOPREFIX,
        O_DKVBW,
        O_PREFIXKEY,
        O_FAILREADS,
        O_KEEPWIN,
        O_KVRINGS,
        O_KVSNAPS,
        O_CUDADEV,
        O_CUDADTYPE,
        O_NOGRAPHS,
        O_PROMPTEXACT,
        O_PACKED,
        O_GWUSER
    };
    static const struct option opts[] = {
        {"socket", required_argument, 0, O_SOCKET},
        {"echo", no_argument, 0, O_ECHO},
        {"numa-node", required_argument, 0, O_NUMA},
        {"max-sessions", required_argument, 0, O_MAXS},
        {"max-sessions-per-uid", required_argument, 0, O_MAXU},
        {"max-half-open", required_argument, 0, O_HALF},
        {"max-half-open-per-uid", required_argument, 0, O_HALFU},
        {"connect-rate-per-uid", required_argument, 0, O_CRATE},
        {"connect-burst-per-uid", required_argument, 0, O_CBURST},
        {"socket-mode", required_argument, 0, O_SMODE},
        {"socket-group", required_argument, 0, O_SGROUP},
        {"spin-us", required_argument, 0, O_SPIN},
        {"nice", required_argument, 0, O_NICE},
        {"submit-ring-bytes", required_argument, 0, O_SUBMIT},
        {"event-ring-slots", required_argument, 0, O_EVSLOTS},
        {"doorbell", required_argument, 0, O_DOORBELL},
        {"version", no_argument, 0, O_VERSION},
        {"help", no_argument, 0, O_HELP},
        {"model", required_argument, 0, O_MODEL},
        {"tokenizer", required_argument, 0, O_TOKENIZER},
        {"policy", required_argument, 0, O_POLICY},
        {"backend", required_argument, 0, O_BACKEND},
        {"threads", required_argument, 0, O_THREADS},
        {"cuda-device", required_argument, 0, O_CUDADEV},
        {"cuda-dtype", required_argument, 0, O_CUDADTYPE},
        {"no-cuda-graphs", no_argument, 0, O_NOGRAPHS},
        {"prompt-exact", no_argument, 0, O_PROMPTEXACT},
        {"packed-weights", required_argument, 0, O_PACKED},
        {"kv-blocks", required_argument, 0, O_KVB},
        {"kv-rings", required_argument, 0, O_KVRINGS},
        {"kv-ring-snapshot-bytes", required_argument, 0, O_KVSNAPS},
        {"kv-block-size", required_argument, 0, O_KVBS},
        {"host-kv-blocks", required_argument, 0, O_HKVB},
        {"disk-kv", required_argument, 0, O_DKV},
        {"disk-kv-blocks", required_argument, 0, O_DKVB},
        {"disk-kv-bw", required_argument, 0, O_DKVBW},
        {"max-batch-tokens", required_argument, 0, O_MAXBT},
        {"decision-log", required_argument, 0, O_DECLOG},
        {"request-log", required_argument, 0, O_REQLOG},
        {"iteration-log", required_argument, 0, O_ITLOG},
        {"metrics", required_argument, 0, O_METRICS},
        {"served-model-name", required_argument, 0, O_SERVED},
        {"kv-events", required_argument, 0, O_KVEV},
        {"kv-events-replay", required_argument, 0, O_KVEVR},
        {"kv-events-queue", required_argument, 0, O_KVEVQ},
        {"kv-events-encoding", required_argument, 0, O_KVEVE},
        {"stats-file", required_argument, 0, O_STATS},
        {"backpressure-timeout-ms", required_argument, 0, O_BPT},
        {"backpressure-buffer-tokens", required_argument, 0, O_BPB},
        {"max-n", required_argument, 0, O_MAXN},
        {"drain-grace-ms", required_argument, 0, O_DRAIN},
        {"max-records-per-tenant", required_argument, 0, O_RECT},
        {"verify-swaps", no_argument, 0, O_VERIFY},
        {"check-invariants", no_argument, 0, O_INVARIANTS},
        {"no-prefix-cache", no_argument, 0, O_NOPREFIX},
#ifdef RINGLM_TEST_KNOBS
        {"prefix-key", required_argument, 0, O_PREFIXKEY},
        {"fail-kv-reads", required_argument, 0, O_FAILREADS},
        {"keep-window-blocks", no_argument, 0, O_KEEPWIN},
#endif
        {"quiet", no_argument, 0, O_QUIET},
        {"check-config", no_argument, 0, O_CHECK},
        {"gateway-user", required_argument, 0, O_GWUSER},
        {0, 0, 0, 0},
    };
    dloop_config cfg;
    dloop_config_init(&cfg);
    const char *socket_path = NULL, *numa_spec = "auto";
    int echo = 0, want_version = 0, check_config = 0, want_nice = 0, nice_val = 0;
    long gateway_uid = -1;
    const char *gateway_user = NULL;
    svc_config sc;
    svc_config_init(&sc);
    unsigned long v;

    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_SOCKET: socket_path = optarg; break;
        case O_ECHO: echo = 1; break;
        case O_NUMA: numa_spec = optarg; break;
        case O_MAXS:
            if (parse_uint("--max-sessions", optarg, 1 << 20, &v)) return 2;
            cfg.max_sessions = (int)v;
            break;
        case O_MAXU:
            if (parse_uint("--max-sessions-per-uid", optarg, 1 << 20, &v)) return 2;
            cfg.max_sessions_per_uid = (int)v;
            break;
        case O_HALF:
            if (parse_uint("--max-half-open", optarg, 1 << 20, &v)) return 2;
            cfg.max_half_open = (int)v;
            break;
        case O_HALFU:
            if (parse_uint("--max-half-open-per-uid", optarg, 1 << 20, &v)) return 2;
            cfg.max_half_open_per_uid = (int)v;
            break;
        case O_CRATE:
            if (parse_uint("--connect-rate-per-uid", optarg, 1 << 20, &v)) return 2;
            cfg.connect_rate_per_uid = v ? (int)v : -1; /* 0: no bound */
            break;
        case O_CBURST:
            if (parse_uint("--connect-burst-per-uid", optarg, 1 << 20, &v)) return 2;
            cfg.connect_burst_per_uid = (int)v;
            break;
        case O_SMODE: {
            char *end;
            errno = 0;
            unsigned long m = strtoul(optarg, &end, 8);
            if (errno || *end || end == optarg || optarg[0] == '-' || m > 0777 || !m) {
                fprintf(stderr,
                        "ringlmd: --socket-mode '%s': expected an octal mode in "
                        "[1, 0777], e.g. 0660\n",
                        optarg);
                return 2;
            }
            cfg.socket_mode = (unsigned)m;
            break;
        }
        case O_SGROUP: {
            struct group *g = getgrnam(optarg);
            if (g) {
                cfg.socket_gid = (int)g->gr_gid;
            } else if (parse_uint("--socket-group", optarg, INT_MAX, &v) == 0) {
                cfg.socket_gid = (int)v;
            } else {
                fprintf(stderr, "ringlmd: --socket-group '%s': no such group\n", optarg);
                return 2;
            }
            break;
        }
        case O_SPIN:
            if (parse_uint("--spin-us", optarg, 60u * 1000 * 1000, &v)) return 2;
            cfg.idle_spin_us = (unsigned)v;
            break;
        case O_SUBMIT:
            if (parse_uint("--submit-ring-bytes", optarg, RINGLM_WIRE_SUBMIT_MAX, &v)) return 2;
            cfg.submit_ring_bytes = (unsigned)v;
            break;
        case O_EVSLOTS:
            if (parse_uint("--event-ring-slots", optarg, RINGLM_WIRE_EVSLOTS_MAX, &v)) return 2;
            cfg.event_ring_slots = (unsigned)v;
            break;
        case O_DOORBELL:
            if (!strcmp(optarg, "eventfd")) {
                cfg.force_eventfd = 1;
            } else if (strcmp(optarg, "futex")) {
                fprintf(stderr, "ringlmd: --doorbell '%s': expected futex or eventfd\n", optarg);
                return 2;
            }
            break;
        case O_VERSION: want_version = 1; break;
        case O_MODEL: sc.model = optarg; break;
        case O_TOKENIZER: sc.tokenizer = optarg; break;
        case O_POLICY: sc.policy_path = optarg; break;
        case O_BACKEND:
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) {
                fprintf(stderr, "ringlmd: --backend '%s': expected cpu or cuda\n", optarg);
                return 2;
            }
            sc.backend = optarg;
            break;
        case O_THREADS:
            if (parse_uint("--threads", optarg, 1024, &v)) return 2;
            sc.threads = (int)v;
            break;
        case O_CUDADEV:
            if (parse_uint("--cuda-device", optarg, 1024, &v)) return 2;
            sc.cuda_device = (int)v;
            break;
        case O_CUDADTYPE:
            if ((sc.cuda_dtype = eng_cuda_dtype_parse(optarg)) < 0) {
                fprintf(stderr, "ringlmd: --cuda-dtype '%s': expected bf16 or fp32\n", optarg);
                return 2;
            }
            break;
        case O_NOGRAPHS: sc.cuda_no_graphs = true; break;
        case O_PROMPTEXACT: sc.prompt_exact = true; break;
        case O_PACKED:
            if (!strcmp(optarg, "auto"))
                sc.packed_weights = ENG_PACK_AUTO;
            else if (!strcmp(optarg, "on"))
                sc.packed_weights = ENG_PACK_ON;
            else if (!strcmp(optarg, "off"))
                sc.packed_weights = ENG_PACK_OFF;
            else {
                fprintf(stderr, "ringlmd: --packed-weights '%s': expected auto, on or off\n",
                        optarg);
                return 2;
            }
            break;
        case O_KVB:
            if (parse_uint("--kv-blocks", optarg, 1u << 24, &v)) return 2;
            if (!v) {
                fprintf(stderr, "ringlmd: --kv-blocks must be >= 1\n");
                return 2;
            }
            sc.kv_blocks = (int)v;
            break;
        case O_KVRINGS:
            if (parse_count_or_off("--kv-rings", optarg, 1u << 20, &sc.kv_rings)) return 2;
            break;
        case O_KVSNAPS:
            if (parse_bytes_or_off("--kv-ring-snapshot-bytes", optarg, &sc.kv_snap_bytes)) return 2;
            break;
        case O_KVBS:
            if (parse_uint("--kv-block-size", optarg, 4096, &v)) return 2;
            if (!v) {
                fprintf(stderr, "ringlmd: --kv-block-size must be in [1, 4096]\n");
                return 2;
            }
            sc.kv_block_size = (int)v;
            break;
        case O_HKVB:
            if (parse_uint("--host-kv-blocks", optarg, 1u << 26, &v)) return 2;
            sc.host_kv_blocks = (int)v;
            break;
        case O_DKV: sc.disk_kv_path = optarg; break;
        case O_DKVB:
            if (parse_uint("--disk-kv-blocks", optarg, 1u << 28, &v)) return 2;
            sc.disk_kv_blocks = (int)v;
            break;
        case O_DKVBW: {
            char *end = NULL;
            errno = 0;
            double bw = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(bw >= 1 && bw <= 1e15)) {
                fprintf(
                    stderr,
                    "ringlmd: --disk-kv-bw: expected bytes per second in [1, 1e15], got \"%s\"\n",
                    optarg);
                return 2;
            }
            sc.disk_kv_bw = bw;
            break;
        }
        case O_MAXBT:
            if (parse_uint("--max-batch-tokens", optarg, 1u << 20, &v)) return 2;
            sc.max_batch_tokens = (int)v;
            break;
        case O_DECLOG: sc.decision_log = optarg; break;
        case O_REQLOG: sc.request_log = optarg; break;
        case O_ITLOG: sc.iteration_log = optarg; break;
        case O_METRICS: sc.metrics_listen = optarg; break;
        case O_SERVED:
            if (!*optarg) {
                fprintf(stderr, "ringlmd: --served-model-name is empty\n");
                return 2;
            }
            sc.served_model_name = optarg;
            break;
        case O_KVEV: sc.kv_events = optarg; break;
        case O_KVEVR: sc.kv_events_replay = optarg; break;
        case O_KVEVE:
            if (strcmp(optarg, "array") && strcmp(optarg, "map")) {
                fprintf(stderr, "ringlmd: --kv-events-encoding '%s': array or map\n", optarg);
                return 2;
            }
            sc.kv_events_map = !strcmp(optarg, "map");
            break;
        case O_KVEVQ:
            if (parse_uint("--kv-events-queue", optarg, 1u << 24, &v)) return 2;
            sc.kv_events_queue = (uint32_t)v;
            break;
        case O_STATS: sc.stats_file = optarg; break;
        case O_BPT:
            if (parse_uint("--backpressure-timeout-ms", optarg, 86400000ul, &v)) return 2;
            sc.backpressure_timeout_ms = v;
            break;
        case O_MAXN:
            if (parse_uint("--max-n", optarg, RINGLM_WIRE_MAX_N, &v)) return 2;
            if (!v) {
                fprintf(stderr, "ringlmd: --max-n must be >= 1\n");
                return 2;
            }
            sc.max_n = (uint32_t)v;
            break;
        case O_BPB:
            if (parse_uint("--backpressure-buffer-tokens", optarg, 1u << 24, &v)) return 2;
            sc.backpressure_buffer_tokens = (uint32_t)v;
            break;
        case O_RECT:
            if (parse_uint("--max-records-per-tenant", optarg, 1u << 20, &v)) return 2;
            if (!v) {
                fprintf(stderr, "ringlmd: --max-records-per-tenant must be >= 1\n");
                return 2;
            }
            sc.max_records_per_tenant_iter = (uint32_t)v;
            break;
        case O_DRAIN:
            if (parse_uint("--drain-grace-ms", optarg, 86400000ul, &v)) return 2;
            sc.drain_grace_ms = v;
            break;
        case O_VERIFY: sc.verify_swaps = true; break;
        case O_INVARIANTS: sc.check_invariants = true; break;
        case O_NOPREFIX: sc.no_prefix_cache = true; break;
#ifdef RINGLM_TEST_KNOBS
        case O_PREFIXKEY:
            if (strcmp(optarg, "xxh3") && strcmp(optarg, "constant")) {
                fprintf(stderr, "ringlmd: --prefix-key '%s': expected xxh3 or constant\n", optarg);
                return 2;
            }
            sc.test.constant_prefix_key = !strcmp(optarg, "constant");
            break;
        case O_FAILREADS: {
            char spec[32];
            snprintf(spec, sizeof spec, "%s", optarg);
            sc.test.fail_kv_reads = 0;
            for (char *save = NULL, *t = strtok_r(spec, ",", &save); t;
                 t = strtok_r(NULL, ",", &save)) {
                if (!strcmp(t, "host"))
                    sc.test.fail_kv_reads |= 1u << SCHED_POOL_HOST;
                else if (!strcmp(t, "disk"))
                    sc.test.fail_kv_reads |= 1u << SCHED_POOL_DISK;
                else {
                    fprintf(stderr,
                            "ringlmd: --fail-kv-reads '%s': expected host, disk or host,disk\n",
                            optarg);
                    return 2;
                }
            }
            break;
        }
        case O_KEEPWIN: sc.test.keep_window_blocks = true; break;
#endif
        case O_QUIET: sc.quiet = true; break;
        case O_CHECK: check_config = 1; break;
        case O_GWUSER: {
            struct passwd *pw = getpwnam(optarg);
            if (pw) {
                gateway_uid = (long)pw->pw_uid;
            } else if (parse_uint("--gateway-user", optarg, UINT32_MAX - 1, &v) == 0) {
                gateway_uid = (long)v;
            } else {
                fprintf(stderr, "ringlmd: --gateway-user '%s': no such user\n", optarg);
                return 2;
            }
            gateway_user = optarg;
            break;
        }
        case O_NICE: {
            char *end;
            errno = 0;
            long n = strtol(optarg, &end, 10);
            if (errno || *end || end == optarg || n < -20 || n > 19) {
                fprintf(stderr, "ringlmd: --nice '%s': expected an integer in -20..19\n", optarg);
                return 2;
            }
            nice_val = (int)n;
            want_nice = 1;
            break;
        }
        case 'h':
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    /* Before any thread exists: Linux keeps nice per thread, and every thread made later (the
	 * loop is this one; engine workers, log writer, metrics) inherits it. A client woken with
	 * a futex for its token is often placed on the waker's CPU; at equal priority it preempts
	 * the loop there (measured: 29-67 µs per woken client), at -10 it waits or goes elsewhere
	 * (5-6 µs). Not permitted: say so and go on at the inherited priority. */
    install_signals();
    /* 256 sessions of 4 descriptors and their handshakes need more than the usual soft
     * limit of 1024: take what the hard limit allows (the loop fits its limits to it). */
    dloop_raise_fd_limit();
    if (want_nice && setpriority(PRIO_PROCESS, 0, nice_val) != 0) {
        fprintf(stderr, "ringlmd: --nice %d: %s (continuing at nice %d)\n", nice_val,
                strerror(errno), getpriority(PRIO_PROCESS, 0));
    } else if (want_nice) {
        renice_threads(nice_val);
        autogroup_follow_nice(nice_val);
    } else if (!echo && !want_version && !check_config) {
        /* The default is the measured one, not a flag an operator must know: -10 where
		 * permitted (root, CAP_SYS_NICE, RLIMIT_NICE), never raised above what we got. */
        errno = 0;
        int cur = getpriority(PRIO_PROCESS, 0);
        if (errno == 0 && cur > DEFAULT_NICE) {
            if (setpriority(PRIO_PROCESS, 0, DEFAULT_NICE) == 0) {
                renice_threads(DEFAULT_NICE);
                autogroup_follow_nice(DEFAULT_NICE);
            } else
                fprintf(stderr,
                        "ringlmd: running at nice %d: nice %d needs CAP_SYS_NICE or "
                        "RLIMIT_NICE (LimitNICE=); woken clients may preempt the loop\n",
                        cur, DEFAULT_NICE);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ringlmd: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (want_version && !sc.model && !echo) {
        printf("ringlmd %s (wire ABI %u)\n", RINGLM_VERSION, RINGLM_WIRE_ABI);
        return 0;
    }
    if (!echo)
        return serve_model(&sc, &cfg, socket_path, numa_spec, want_version, check_config,
                           gateway_uid, gateway_user);
    if (!socket_path || !*socket_path) socket_path = getenv(RINGLM_SOCKET_ENV);
    if (!socket_path || !*socket_path) {
        socket_path = RINGLM_DEFAULT_SOCKET;
        make_parent_dir(socket_path);
    }
    cfg.socket_path = socket_path;

    int node = rnuma_resolve(numa_spec);
    if (node < -1) {
        fprintf(stderr, "ringlmd: --numa-node %s: %s\n", numa_spec, rnuma_errmsg());
        return 2;
    }
    if (node >= 0 && rnuma_pin_self(node) < 0)
        fprintf(stderr, "ringlmd: pinning to node %d failed: %s (continuing unpinned)\n", node,
                rnuma_errmsg());
    cfg.numa_node = node;
    char desc[256];
    rnuma_describe(node, desc, sizeof(desc));

    echo_svc *svc;
    if (echo_create(&svc) < 0) {
        fprintf(stderr, "ringlmd: out of memory\n");
        return 1;
    }
    dloop *loop;
    int r = dloop_create(&cfg, &echo_ops, svc, &loop);
    if (r < 0) {
        fprintf(stderr, "ringlmd: %s\n", dloop_errmsg());
        echo_destroy(svc);
        return 1;
    }
    echo_attach(svc, loop);
    fprintf(stderr, "ringlmd %s: echo service on %s, doorbell %s, %s\n", RINGLM_VERSION,
            socket_path, dloop_doorbell_mode(loop), desc);
    r = dloop_run(loop);
    dloop_destroy(loop);
    fprintf(stderr, "ringlmd: stopped (%llu requests answered)\n", echo_finished(svc));
    echo_destroy(svc);
    return r < 0 ? 1 : 0;
}
