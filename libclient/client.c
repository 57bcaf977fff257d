/* SPDX-License-Identifier: MIT */
/*
 * libclient/client.c — the client side of a session: handshake over the Unix socket,
 * mapping the two segments, the submit-ring producer and the event-ring consumer.
 *
 * The daemon segment is mapped read-only (and sealed against writable mappings by the
 * daemon); the client still checks what it reads there, so a confused daemon yields
 * -EPROTO rather than a crash.
 *
 * A dead daemon is noticed without waking anything on a timer: each client has a watcher
 * thread blocked in poll() on the session's socket (which carries nothing after the
 * handshake: it becomes readable only at EOF, when the daemon exits or is killed). The
 * watcher then marks the session dead and bumps `alarm`, a word of the client's own; a
 * sleeping ringlm_next_event waits on the doorbell and on `alarm` together (futex_waitv),
 * so it wakes at once, and an idle client costs no wake-up at all. Where the kernel has no
 * futex_waitv, or the thread cannot start, or after a fork (the child has no watcher), it
 * sleeps in slices of SLEEP_SLICE_NS and looks at the socket between them, as before.
 */
#include "ringlm.h"
#include "client_internal.h"
#include "common/errdetail.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "shm/ring.h"
#include "shm/wire.h"

/* ringlm.h is installed alone, so it repeats the wire's class-list bound; keep them equal. */
_Static_assert(RINGLM_MAX_CLASSES == RINGLM_WIRE_CLASSES_MAX, "classes");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "the client sleeps on the low 32 bits of ev_prod at its own address");

/* ringlm_event is filled by this library and read by programs built against any 0.x header:
 * its size and every offset are the ABI (0.2's n_cached_tokens took 0.1's padding). */
_Static_assert(sizeof(ringlm_event) == 48, "ringlm_event is 48 bytes");
_Static_assert(offsetof(ringlm_event, kind) == 0, "ringlm_event.kind");
_Static_assert(offsetof(ringlm_event, req_id) == 8, "ringlm_event.req_id");
_Static_assert(RINGLM_MAX_N == RINGLM_WIRE_MAX_N, "one bound on samples per request");
_Static_assert(offsetof(ringlm_event, token) == 16, "ringlm_event.token");
_Static_assert(offsetof(ringlm_event, index) == 20, "ringlm_event.index");
_Static_assert(offsetof(ringlm_event, finish_reason) == 24, "ringlm_event.finish_reason");
_Static_assert(offsetof(ringlm_event, reject_reason) == 28, "ringlm_event.reject_reason");
_Static_assert(offsetof(ringlm_event, n_tokens) == 32, "ringlm_event.n_tokens");
_Static_assert(offsetof(ringlm_event, n_cached_tokens) == 36, "ringlm_event.n_cached_tokens");
_Static_assert(offsetof(ringlm_event, policy_hash) == 40, "ringlm_event.policy_hash");

#define CONNECT_TIMEOUT_MS     5000
#define SLEEP_SLICE_NS         (20 * 1000 * 1000ll) /* liveness check period without a watcher */
#define WATCHER_STACK          (64 * 1024)
#define DEFAULT_SPIN_NS        (50 * 1000ll)
#define WANT_SPACE_CHECK_EVERY 1024

struct ringlm_client {
    int sock;
    int efd; /* eventfd doorbell, -1 in futex mode */
    struct ringlm_wire_cseg *cseg;
    size_t cseg_bytes;
    const struct ringlm_wire_dseg *dseg;
    size_t dseg_bytes;
    uint64_t session_id;

    /* producer side (submit/cancel) */
    struct ring_rec_prod sub;
    uint64_t next_id;
    uint64_t prod_live_check_ns; /* last socket check on the submit side */

    /* consumer side (next_event) */
    struct ring_ev_cons ev;
    int64_t spin_ns;     /* the spin before sleeping, now */
    int64_t spin_max_ns; /* its ceiling: the option, $RINGLM_SPIN_US or 50 µs */
    int spin_fixed;      /* set by the option or the environment: not adapted */
    uint32_t consumed_since_check;
    uint64_t last_live_check_ns;
    /* the log-probabilities of the last event taken (ringlm_event_logprobs) */
    bool has_lp;
    int32_t lp_token;
    struct ringlm_wire_logprobs lp;
    /* the detail of the last FINISH taken (ringlm_event_detail); "" when it carried none */
    char detail[RINGLM_WIRE_DETAIL_MAX + 1];
    int gone; /* 0, or the sticky -errno once the session ended */
    char gone_detail[160];

    /* the watcher (see the top of this file) */
    uint32_t alarm;    /* bumped (and woken) when sock_dead is set or ringlm_wake is called */
    int sock_dead;     /* the watcher saw the socket end */
    int wake_pending;  /* ringlm_wake: the next wait that would sleep returns 0 */
    int closing;       /* ringlm_close: the watcher's poll ends for this reason */
    int watching;      /* 1 while sleeps wait on alarm too (0: sliced sleeps) */
    bool has_watcher;  /* a watcher was started ... */
    unsigned fork_gen; /* ... in this process (fork_gen then): a child has none */
    pthread_t watcher;

    /* the handshake's facts, copied once at connect */
    uint32_t caps;
    uint32_t vocab_size;       /* with RINGLM_WIRE_CAP_SAMPLING, else 0 */
    uint32_t constraint_kinds; /* with RINGLM_WIRE_CAP_CONSTRAINT, else 0 */
    uint32_t max_n;            /* with RINGLM_WIRE_CAP_SAMPLES, else 1 */
    int n_classes;
    char classes[RINGLM_WIRE_CLASSES_MAX][RINGLM_WIRE_NAME_LEN];
    char served_model[RINGLM_WIRE_MODEL_LEN]; /* with RINGLM_WIRE_CAP_MODEL, else "" */
};

/* Bumped in the child at every fork(): a client's watcher is a thread of the process that
 * connected, so a forked child that goes on using the client sleeps in slices. */
static unsigned fork_gen;
static void watch_start(ringlm_client *c);

/* ---- errors --------------------------------------------------------------------------- */
ERRDETAIL_DEFINE(client_err);
#define set_err(err, ...) errdetail_set(&client_err, (err), __VA_ARGS__)

int client_seterr(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    errdetail_vset(&client_err, err, fmt, ap);
    va_end(ap);
    return err;
}

const char *ringlm_errdetail(void)
{
    return client_err.msg;
}

#define STR_(x) #x
#define STR(x)  STR_(x)
const char *ringlm_version(int *number)
{
    if (number) *number = RINGLM_VERSION_NUMBER;
    return STR(RINGLM_VERSION_MAJOR) "." STR(RINGLM_VERSION_MINOR) "." STR(RINGLM_VERSION_PATCH);
}

const char *ringlm_strerror(int err)
{
    static __thread char buf[128];
    int e = err < 0 ? -err : err;
    const char *name = strerrorname_np(e);
    char tmp[96];
    const char *msg = strerror_r(e, tmp, sizeof(tmp));
    snprintf(buf, sizeof(buf), "%s: %s", name ? name : "E?", msg);
    return buf;
}

const char *ringlm_reason_name(int code)
{
    return code < 0 ? "unknown" : ringlm_wire_reason_name((unsigned)code);
}

void ringlm_request_init(ringlm_request *r)
{
    memset(r, 0, sizeof(*r));
    r->max_new_tokens = 16;
    r->temperature = 0.0f;
    r->top_p = 1.0f;
    r->class_name = "default";
}

void ringlm_sampling_init(ringlm_sampling *smp)
{
    memset(smp, 0, sizeof(*smp));
    smp->size = sizeof(*smp);
    smp->repetition_penalty = 1.0f;
    smp->n = 1;
}

/* ---- connect -------------------------------------------------------------------------- */
static int check_seg_header(const struct ringlm_wire_seg_header *h, uint32_t kind, size_t bytes,
                            uint64_t session_id, size_t fields_bytes, uint64_t unit,
                            const char *what)
{
    if (h->magic != RINGLM_WIRE_MAGIC)
        return set_err(-EPROTO, "%s segment magic 0x%08x, expected 0x%08x", what, h->magic,
                       RINGLM_WIRE_MAGIC);
    if (h->abi != RINGLM_WIRE_ABI)
        return set_err(-EPROTO, "%s segment has ABI %u, this library ABI %u", what, h->abi,
                       RINGLM_WIRE_ABI);
    if (h->kind != kind || h->seg_bytes != bytes || h->session_id != session_id)
        return set_err(
            -EPROTO,
            "%s segment header (kind %u, %llu bytes, session %llu) does not match the handshake",
            what, h->kind, (unsigned long long)h->seg_bytes, (unsigned long long)h->session_id);
    uint64_t n = h->data_bytes / unit;
    if (h->data_off < fields_bytes || h->data_off > bytes || h->data_bytes > bytes - h->data_off ||
        h->data_bytes % unit || n == 0 || (n & (n - 1)))
        return set_err(
            -EPROTO, "%s segment ring at %llu+%llu does not fit %zu bytes or is not a power of two",
            what, (unsigned long long)h->data_off, (unsigned long long)h->data_bytes, bytes);
    return 0;
}

static int recv_welcome(int sock, struct ringlm_wire_welcome *w, int fds[3], int *nfds)
{
    struct pollfd pfd = {.fd = sock, .events = POLLIN};
    int r = poll(&pfd, 1, CONNECT_TIMEOUT_MS);
    if (r == 0)
        return set_err(-ETIMEDOUT, "no handshake answer from the daemon within %d ms",
                       CONNECT_TIMEOUT_MS);
    if (r < 0) return set_err(-errno, "poll on the daemon socket: %s", strerror(errno));

    union {
        char buf[CMSG_SPACE(sizeof(int) * 3)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = w, .iov_len = sizeof(*w)};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) return set_err(-errno, "receiving the handshake: %s", strerror(errno));
    *nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (*nfds < 3)
                fds[(*nfds)++] = fd;
            else
                close(fd);
        }
    }
    if (n == 0)
        return set_err(-ECONNRESET, "the daemon closed the connection during the handshake");
    if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
        return set_err(-EPROTO, "handshake message truncated (another ABI?)");
    if ((size_t)n < 12) return set_err(-EPROTO, "handshake message of %zd bytes", n);
    if (w->magic != RINGLM_WIRE_MAGIC)
        return set_err(-EPROTO, "handshake magic 0x%08x, expected 0x%08x: not a ringlmd socket?",
                       w->magic, RINGLM_WIRE_MAGIC);
    if (w->abi != RINGLM_WIRE_ABI)
        return set_err(-EPROTO, "daemon speaks ABI %u, this library ABI %u: upgrade the %s", w->abi,
                       RINGLM_WIRE_ABI, w->abi > RINGLM_WIRE_ABI ? "client library" : "daemon");
    if ((size_t)n != sizeof(*w))
        return set_err(-EPROTO, "handshake message of %zd bytes, expected %zu", n, sizeof(*w));
    w->detail[sizeof(w->detail) - 1] = 0;
    if (w->status < 0) return set_err(w->status, "daemon refused the session: %s", w->detail);
    if (w->status > 0) return set_err(-EPROTO, "handshake status %d", w->status);
    return 0;
}

int ringlm_connect(const char *socket_path, ringlm_client **out)
{
    struct ringlm_wire_welcome w;
    int fds[3] = {-1, -1, -1}, nfds = 0, r;
    ringlm_client *c;

    *out = NULL;
    if (!socket_path || !*socket_path) socket_path = getenv(RINGLM_SOCKET_ENV);
    if (!socket_path || !*socket_path) socket_path = RINGLM_DEFAULT_SOCKET;

    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof(sa.sun_path))
        return set_err(-ENAMETOOLONG, "socket path '%s' is longer than %zu bytes", socket_path,
                       sizeof(sa.sun_path) - 1);
    strcpy(sa.sun_path, socket_path);

    c = calloc(1, sizeof(*c));
    if (!c) return set_err(-ENOMEM, "out of memory");
    c->efd = -1;
    c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (c->sock < 0) {
        r = set_err(-errno, "socket: %s", strerror(errno));
        goto fail_free;
    }
    if (connect(c->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        if (e == EACCES || e == EPERM)
            /* ringlmd is there; this user may not reach it (the socket's mode and group,
             * ringlmd --socket-mode/--socket-group, or a directory on the way). */
            r = set_err(-e,
                        "connect to '%s': permission denied for uid %u (the socket's or its "
                        "directory's owner, group and mode decide who may connect)",
                        socket_path, (unsigned)geteuid());
        else
            r = set_err(-e, "connect to '%s': %s (is ringlmd running? set %s or pass a path)",
                        socket_path, strerror(e), RINGLM_SOCKET_ENV);
        goto fail_sock;
    }
    struct ringlm_wire_hello hello = {.magic = RINGLM_WIRE_MAGIC, .abi = RINGLM_WIRE_ABI};
    if (send(c->sock, &hello, sizeof(hello), MSG_NOSIGNAL) != sizeof(hello)) {
        r = set_err(-errno, "sending the handshake: %s", strerror(errno));
        goto fail_sock;
    }
    memset(&w, 0, sizeof(w));
    r = recv_welcome(c->sock, &w, fds, &nfds);
    if (r < 0) goto fail_fds;
    int want = w.doorbell_mode == RINGLM_WIRE_DB_EVENTFD ? 3 : 2;
    if ((w.doorbell_mode != RINGLM_WIRE_DB_FUTEX && w.doorbell_mode != RINGLM_WIRE_DB_EVENTFD) ||
        nfds != want) {
        r = set_err(-EPROTO, "handshake: doorbell mode %u with %d fds", w.doorbell_mode, nfds);
        goto fail_fds;
    }
    struct stat st0, st1;
    if (fstat(fds[0], &st0) || fstat(fds[1], &st1) || (uint64_t)st0.st_size != w.cseg_bytes ||
        (uint64_t)st1.st_size != w.dseg_bytes || w.cseg_bytes < RINGLM_WIRE_HEADER_AREA ||
        w.dseg_bytes < RINGLM_WIRE_HEADER_AREA) {
        r = set_err(-EPROTO, "handshake: segment sizes %llu/%llu do not match the fds",
                    (unsigned long long)w.cseg_bytes, (unsigned long long)w.dseg_bytes);
        goto fail_fds;
    }
    c->cseg_bytes = w.cseg_bytes;
    c->dseg_bytes = w.dseg_bytes;
    c->cseg = mmap(NULL, c->cseg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    if (c->cseg == MAP_FAILED) {
        c->cseg = NULL;
        r = set_err(-errno, "mapping the client segment: %s", strerror(errno));
        goto fail_fds;
    }
    c->dseg = mmap(NULL, c->dseg_bytes, PROT_READ, MAP_SHARED, fds[1], 0);
    if (c->dseg == MAP_FAILED) {
        c->dseg = NULL;
        r = set_err(-errno, "mapping the daemon segment: %s", strerror(errno));
        goto fail_map;
    }
    c->session_id = w.session_id;
    r = check_seg_header(&c->cseg->hdr, RINGLM_WIRE_SEG_CLIENT, c->cseg_bytes, c->session_id,
                         sizeof(struct ringlm_wire_cseg), 1, "client");
    if (r < 0) goto fail_map;
    r = check_seg_header(&c->dseg->hdr, RINGLM_WIRE_SEG_DAEMON, c->dseg_bytes, c->session_id,
                         sizeof(struct ringlm_wire_dseg), sizeof(struct ringlm_wire_event),
                         "daemon");
    if (r < 0) goto fail_map;
    close(fds[0]);
    close(fds[1]);
    if (want == 3) c->efd = fds[2];
    /* The facts, copied once: each name bounded and NUL-terminated here whatever the
     * segment holds. */
    c->caps = __atomic_load_n(&c->dseg->caps, __ATOMIC_ACQUIRE);
    if (c->caps & RINGLM_WIRE_CAP_SAMPLING)
        c->vocab_size = __atomic_load_n(&c->dseg->vocab_size, __ATOMIC_RELAXED);
    c->max_n = 1;
    if (c->caps & RINGLM_WIRE_CAP_SAMPLES) {
        uint32_t mn = __atomic_load_n(&c->dseg->max_n, __ATOMIC_RELAXED);
        c->max_n = mn < 1 ? 1 : mn > RINGLM_WIRE_MAX_N ? RINGLM_WIRE_MAX_N : mn;
    }
    if (c->caps & RINGLM_WIRE_CAP_CONSTRAINT)
        c->constraint_kinds = __atomic_load_n(&c->dseg->constraint_kinds, __ATOMIC_RELAXED);
    if (c->caps & RINGLM_WIRE_CAP_FACTS) {
        uint32_t n = __atomic_load_n(&c->dseg->n_classes, __ATOMIC_RELAXED);
        c->n_classes = (int)(n < RINGLM_WIRE_CLASSES_MAX ? n : RINGLM_WIRE_CLASSES_MAX);
        for (int i = 0; i < c->n_classes; i++) {
            memcpy(c->classes[i], c->dseg->classes[i], RINGLM_WIRE_NAME_LEN);
            c->classes[i][RINGLM_WIRE_NAME_LEN - 1] = 0;
        }
    }
    if (c->caps & RINGLM_WIRE_CAP_MODEL) {
        memcpy(c->served_model, c->dseg->served_model, RINGLM_WIRE_MODEL_LEN);
        c->served_model[RINGLM_WIRE_MODEL_LEN - 1] = 0;
    }

    c->sub = (struct ring_rec_prod){
        .data = (uint8_t *)c->cseg + c->cseg->hdr.data_off,
        .cap = c->cseg->hdr.data_bytes,
        .prod = 0,
        .cached_cons = 0,
        .prod_p = &c->cseg->submit_prod,
        .cons_p = &c->dseg->submit_cons,
    };
    c->ev = (struct ring_ev_cons){
        .slots =
            (const struct ringlm_wire_event *)((const uint8_t *)c->dseg + c->dseg->hdr.data_off),
        .mask = c->dseg->hdr.data_bytes / sizeof(struct ringlm_wire_event) - 1,
        .prod_p = &c->dseg->ev_prod,
        .cons_p = &c->cseg->ev_cons,
    };
    c->next_id = 1;
    c->spin_ns = c->spin_max_ns = DEFAULT_SPIN_NS;
    const char *spin = getenv("RINGLM_SPIN_US");
    if (spin && *spin) {
        /* Clamped like ringlm_set_option: a huge value must not overflow into a
		 * negative spin time (signed overflow, and no spinning at all). */
        long long us = strtoll(spin, NULL, 10);
        c->spin_ns = us <= 0 ? 0 : us > INT64_MAX / 1000 ? INT64_MAX : (int64_t)us * 1000;
        c->spin_max_ns = c->spin_ns;
        c->spin_fixed = 1;
    }
    watch_start(c);
    *out = c;
    return 0;

fail_map:
    if (c->dseg) munmap((void *)c->dseg, c->dseg_bytes);
    if (c->cseg) munmap(c->cseg, c->cseg_bytes);
fail_fds:
    for (int i = 0; i < nfds; i++) close(fds[i]);
fail_sock:
    close(c->sock);
fail_free:
    free(c);
    return r;
}

void ringlm_close(ringlm_client *c)
{
    if (!c) return;
    /* Closing the socket is the goodbye: the daemon sees EOF and ends the session. The
     * shutdown also ends the watcher's poll. */
    if (c->has_watcher && c->fork_gen == __atomic_load_n(&fork_gen, __ATOMIC_RELAXED)) {
        __atomic_store_n(&c->closing, 1, __ATOMIC_RELEASE);
        shutdown(c->sock, SHUT_RDWR);
        pthread_join(c->watcher, NULL);
    }
    close(c->sock);
    if (c->efd >= 0) close(c->efd);
    munmap((void *)c->dseg, c->dseg_bytes);
    munmap(c->cseg, c->cseg_bytes);
    free(c);
}

uint64_t ringlm_session_id(const ringlm_client *c)
{
    return c->session_id;
}

uint64_t ringlm_policy_hash(const ringlm_client *c)
{
    return __atomic_load_n(&c->dseg->policy_hash, __ATOMIC_RELAXED);
}

int ringlm_tenant_tags_honoured(const ringlm_client *c)
{
    if (!(c->caps & RINGLM_WIRE_CAP_FACTS)) return -ENOTSUP;
    return (c->caps & RINGLM_WIRE_CAP_TENANT_TAGS) ? 1 : 0;
}

int ringlm_vocab_size(const ringlm_client *c)
{
    if (!c) return -EINVAL;
    if (!(c->caps & RINGLM_WIRE_CAP_SAMPLING) || !c->vocab_size || c->vocab_size > INT32_MAX)
        return -ENOTSUP;
    return (int)c->vocab_size;
}

int ringlm_max_samples(const ringlm_client *c)
{
    if (!c) return -EINVAL;
    return (int)c->max_n;
}

int ringlm_samples_constrained(const ringlm_client *c)
{
    if (!c) return -EINVAL;
    return (c->caps & RINGLM_WIRE_CAP_SAMPLES_CONSTRAINED) && c->max_n > 1 ? 1 : 0;
}

int ringlm_policy_classes(const ringlm_client *c, const char **names, int max)
{
    if (!(c->caps & RINGLM_WIRE_CAP_FACTS)) return -ENOTSUP;
    for (int i = 0; names && i < c->n_classes && i < max; i++) names[i] = c->classes[i];
    return c->n_classes;
}

const char *ringlm_served_model(const ringlm_client *c)
{
    return c && (c->caps & RINGLM_WIRE_CAP_MODEL) && c->served_model[0] ? c->served_model : NULL;
}

int ringlm_daemon_load(const ringlm_client *c, ringlm_load *out)
{
    if (!c || !out) return set_err(-EINVAL, "NULL argument");
    if (!(c->caps & RINGLM_WIRE_CAP_LOAD))
        return set_err(-ENOTSUP, "this ringlmd does not publish its load (older than 0.5)");
    const struct ringlm_wire_load *w = &c->dseg->load;
    /* The writer is the daemon's loop, a few stores an iteration: a torn read retries. */
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t s1 = __atomic_load_n(&w->seq, __ATOMIC_ACQUIRE);
        if (s1 & 1) continue;
        /* acquire loads: the seq re-read below cannot move above them (no fence, which
         * ThreadSanitizer builds reject) */
        ringlm_load l = {
            .waiting = __atomic_load_n(&w->waiting, __ATOMIC_ACQUIRE),
            .running = __atomic_load_n(&w->running, __ATOMIC_ACQUIRE),
            .kv_used_blocks = __atomic_load_n(&w->kv_used, __ATOMIC_ACQUIRE),
            .kv_total_blocks = __atomic_load_n(&w->kv_total, __ATOMIC_ACQUIRE),
            .iterations = __atomic_load_n(&w->iterations, __ATOMIC_ACQUIRE),
        };
        if (__atomic_load_n(&w->seq, __ATOMIC_RELAXED) != s1) continue;
        *out = l;
        return 0;
    }
    return set_err(-EAGAIN, "the daemon's load kept changing while read");
}

int ringlm_draining(const ringlm_client *c)
{
    return ring_load32(&c->dseg->state) == RINGLM_WIRE_ST_DRAINING;
}

int ringlm_set_option(ringlm_client *c, int option, long value)
{
    switch (option) {
    case RINGLM_OPT_SPIN_US:
        if (value < 0) return set_err(-EINVAL, "spin time %ld µs is negative", value);
        c->spin_ns = value > INT64_MAX / 1000 ? INT64_MAX : (int64_t)value * 1000;
        c->spin_max_ns = c->spin_ns;
        c->spin_fixed = 1;
        return 0;
    default: return set_err(-EINVAL, "unknown option %d", option);
    }
}

/* ---- liveness ------------------------------------------------------------------------- */
/* The socket carries nothing after the handshake; readable means EOF (daemon gone). */
static int daemon_gone(ringlm_client *c)
{
    struct pollfd pfd = {.fd = c->sock, .events = POLLIN | POLLRDHUP};
    if (poll(&pfd, 1, 0) <= 0) return 0;
    if (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR)) return 1;
    char b[64];
    ssize_t n = recv(c->sock, b, sizeof(b), MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
}

/* The watcher: one poll() on the socket for the session's life, then one store and one
 * wake. Started with every signal blocked, so signals go to the program's own threads. */
static void *watch_main(void *arg)
{
    ringlm_client *c = arg;
    for (;;) {
        struct pollfd pfd = {.fd = c->sock, .events = POLLIN | POLLRDHUP};
        int n = poll(&pfd, 1, -1);
        if (__atomic_load_n(&c->closing, __ATOMIC_ACQUIRE)) return NULL;
        if (n < 0 && errno == EINTR) continue;
        if (n > 0 && !daemon_gone(c)) continue; /* a stray datagram, read and dropped */
        /* The daemon is gone (or poll failed: then the sleeps look for themselves). */
        if (n > 0)
            __atomic_store_n(&c->sock_dead, 1, __ATOMIC_SEQ_CST);
        else
            __atomic_store_n(&c->watching, 0, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&c->alarm, 1, __ATOMIC_SEQ_CST);
        futex_wake(&c->alarm, INT32_MAX, FUTEX_SCOPE_PROCESS);
        return NULL;
    }
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void on_fork_child(void)
{
    __atomic_add_fetch(&fork_gen, 1, __ATOMIC_RELAXED);
}
static void fork_hook(void)
{
    pthread_atfork(NULL, NULL, on_fork_child);
}

static void watch_start(ringlm_client *c)
{
    pthread_attr_t attr;
    sigset_t all, old;
    pthread_once(&fork_once, fork_hook);
    if (pthread_attr_init(&attr)) return;
    pthread_attr_setstacksize(&attr, WATCHER_STACK);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    c->watching = 1;
    c->fork_gen = __atomic_load_n(&fork_gen, __ATOMIC_RELAXED);
    c->has_watcher = pthread_create(&c->watcher, &attr, watch_main, c) == 0;
    /* a process whose static TLS does not fit beside a small stack (sanitizer builds:
     * EINVAL) gets the default size rather than sliced sleeps */
    if (!c->has_watcher) c->has_watcher = pthread_create(&c->watcher, NULL, watch_main, c) == 0;
    if (!c->has_watcher) c->watching = 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
}

/* Whether a watcher of this process watches c's socket (a sleep may wait on alarm). */
static bool watched(ringlm_client *c)
{
    return __atomic_load_n(&c->watching, __ATOMIC_SEQ_CST) &&
           c->fork_gen == __atomic_load_n(&fork_gen, __ATOMIC_RELAXED);
}

int ringlm_wake(ringlm_client *c)
{
    if (!c) return set_err(-EINVAL, "ringlm_wake: c is NULL");
    __atomic_store_n(&c->wake_pending, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&c->alarm, 1, __ATOMIC_SEQ_CST);
    futex_wake(&c->alarm, INT32_MAX, FUTEX_SCOPE_PROCESS);
    /* a sliced sleep (no watcher) waits on the doorbell alone: wake it there */
    futex_wake((const uint32_t *)c->ev.prod_p, INT32_MAX, FUTEX_SCOPE_SHARED);
    return 0;
}

/* Sticky end-of-session error, decided from the daemon's status (it says why when it
 * ended the session) or from the socket (the daemon process is gone). */
static int session_end_error(ringlm_client *c, int check_socket)
{
    if (c->gone) return set_err(c->gone, "%s", c->gone_detail);
    uint32_t st = ring_load32(&c->dseg->state);
    if (st == RINGLM_WIRE_ST_CLOSED) {
        char reason[sizeof(c->dseg->end_reason)];
        memcpy(reason, (const char *)c->dseg->end_reason, sizeof(reason));
        reason[sizeof(reason) - 1] = 0;
        snprintf(c->gone_detail, sizeof(c->gone_detail), "the daemon ended the session: %s",
                 reason);
        __atomic_store_n(&c->gone, -ECONNRESET, __ATOMIC_RELEASE);
    } else if (check_socket && daemon_gone(c)) {
        snprintf(c->gone_detail, sizeof(c->gone_detail),
                 "the daemon closed the connection (it exited or was killed)");
        __atomic_store_n(&c->gone, -EPIPE, __ATOMIC_RELEASE);
    } else {
        return 0;
    }
    return set_err(c->gone, "%s", c->gone_detail);
}

/* The submit side keeps no sticky state of its own (it may run in another thread than
 * next_event): the status word says CLOSED, or the socket says EOF (checked at most
 * once per SLEEP_SLICE_NS, so a full ring polled in a loop costs few syscalls). */
static int closed_error(ringlm_client *c)
{
    char reason[sizeof(c->dseg->end_reason)];
    memcpy(reason, (const char *)c->dseg->end_reason, sizeof(reason));
    reason[sizeof(reason) - 1] = 0;
    return set_err(-ECONNRESET, "the daemon ended the session: %s", reason);
}

static int submit_side_gone(ringlm_client *c)
{
    if (ring_load32(&c->dseg->state) == RINGLM_WIRE_ST_CLOSED) return closed_error(c);
    uint64_t now = ring_now_ns();
    if (c->prod_live_check_ns && now - c->prod_live_check_ns < (uint64_t)SLEEP_SLICE_NS) return 0;
    c->prod_live_check_ns = now;
    if (__atomic_load_n(&c->sock_dead, __ATOMIC_ACQUIRE) || daemon_gone(c))
        return set_err(-EPIPE, "the daemon closed the connection (it exited or was killed)");
    return 0;
}

static void ring_daemon(ringlm_client *c)
{
    if (c->efd >= 0) {
        uint64_t one = 1;
        ssize_t n = write(c->efd, &one, sizeof(one));
        (void)n; /* a full eventfd counter already means "wake up" */
        return;
    }
    __atomic_add_fetch(&c->cseg->doorbell, 1, __ATOMIC_RELEASE);
    futex_wake(&c->cseg->doorbell, 1, FUTEX_SCOPE_SHARED);
}

/* ---- submit side ---------------------------------------------------------------------- */
/* May a record of this type go in now?  0, or the session's error. */
static int submit_open(ringlm_client *c, uint32_t type)
{
    uint32_t st = ring_load32(&c->dseg->state);
    if (st == RINGLM_WIRE_ST_CLOSED) return closed_error(c);
    /* What next_event already learned (it may run in another thread: atomic read). */
    if (__atomic_load_n(&c->gone, __ATOMIC_ACQUIRE) == -EPIPE)
        return set_err(-EPIPE, "the daemon closed the connection (it exited or was killed)");
    if (st == RINGLM_WIRE_ST_DRAINING && type == RINGLM_WIRE_REC_REQUEST)
        return set_err(-ESHUTDOWN, "the daemon is draining: no new requests");
    return 0;
}

/* ring_rec_reserve's failure r for len bytes, explained. */
static int reserve_error(ringlm_client *c, int r, uint32_t len)
{
    if (r == -E2BIG)
        return set_err(-E2BIG, "record of %u bytes is larger than the %llu-byte submit ring", len,
                       (unsigned long long)c->sub.cap);
    if (r == -EBADMSG)
        return set_err(-EPROTO, "the daemon's submit-ring consumer index is impossible");
    r = submit_side_gone(c);
    if (r < 0) return r;
    return set_err(-EAGAIN, "submit ring full (%llu bytes); read events and retry",
                   (unsigned long long)c->sub.cap);
}

/* Writes one record of len bytes (header, body, prompt, zero padding) at ring index pos. */
static void write_record(ringlm_client *c, uint64_t pos, uint32_t len,
                         const struct ringlm_wire_rec_hdr *h, const void *body, size_t body_len,
                         const int32_t *prompt, uint32_t n_prompt)
{
    ring_rec_write(&c->sub, pos, 0, h, sizeof(*h));
    ring_rec_write(&c->sub, pos, sizeof(*h), body, body_len);
    size_t off = sizeof(*h) + body_len;
    if (n_prompt) {
        ring_rec_write(&c->sub, pos, off, prompt, (size_t)n_prompt * 4);
        off += (size_t)n_prompt * 4;
    }
    static const uint8_t zero[8];
    if (off < len) ring_rec_write(&c->sub, pos, off, zero, len - off);
}

static int put_record(ringlm_client *c, uint32_t len, const struct ringlm_wire_rec_hdr *h,
                      const void *body, size_t body_len)
{
    uint64_t pos;
    int r = submit_open(c, h->type);
    if (r < 0) return r;
    r = ring_rec_reserve(&c->sub, len, &pos);
    if (r < 0) return reserve_error(c, r, len);
    write_record(c, pos, len, h, body, body_len, NULL, 0);
    ring_rec_commit(&c->sub, len);
    /* The handshake with the daemon's sleep: our index is published, now its flag. */
    if (ring_handshake_peer_waits(&c->dseg->daemon_sleeping)) ring_daemon(c);
    return 0;
}

/* One request's record as the library builds it: the wire structs and where its lists are
 * (the caller's memory, copied into the ring once). */
typedef struct wire_req {
    struct ringlm_wire_request w;
    struct ringlm_wire_sampling sm;
    bool ext; /* a REQUEST_EXT record (sm and the lists follow w) */
    const int32_t *prompt;
    const ringlm_logit_bias *bias;
    const int32_t *stop_ids;
    const void *constraint;
    uint64_t len;
} wire_req;

/* ringlm_logit_bias is what the wire carries, so a program's list is copied as it is. */
_Static_assert(sizeof(ringlm_logit_bias) == sizeof(struct ringlm_wire_bias), "bias pair");
_Static_assert(offsetof(ringlm_logit_bias, bias) == offsetof(struct ringlm_wire_bias, bias),
               "bias pair");
_Static_assert(RINGLM_MAX_LOGIT_BIAS == RINGLM_WIRE_MAX_LOGIT_BIAS, "bias bound");
_Static_assert(RINGLM_MAX_STOP_TOKEN_IDS == RINGLM_WIRE_MAX_STOP_IDS, "stop bound");
_Static_assert(RINGLM_MAX_LOGPROBS == RINGLM_WIRE_MAX_LOGPROBS, "logprobs bound");
_Static_assert(RINGLM_MAX_CONSTRAINT_BYTES == RINGLM_WIRE_MAX_CONSTRAINT_BYTES, "constraint");
_Static_assert(RINGLM_SAMPLING_LOGPROBS == RINGLM_WIRE_SMP_F_LOGPROBS &&
                   RINGLM_SAMPLING_LOGPROBS_PROCESSED == RINGLM_WIRE_SMP_F_LOGPROBS_PROCESSED &&
                   RINGLM_SAMPLING_PROMPT_LOGPROBS == RINGLM_WIRE_SMP_F_PROMPT_LOGPROBS,
               "flags");

/* Writes one request record at ring index pos: header, structs, the lists, zero padding. */
static void write_request(ringlm_client *c, uint64_t pos, const wire_req *q)
{
    struct ringlm_wire_rec_hdr h = {.len = (uint32_t)q->len,
                                    .type = q->ext ? RINGLM_WIRE_REC_REQUEST_EXT
                                                   : RINGLM_WIRE_REC_REQUEST};
    size_t off = 0;
#define PUT(p, n)                                                                                  \
    do {                                                                                           \
        size_t n_ = (n);                                                                           \
        if (n_ > 0) ring_rec_write(&c->sub, pos, off, (p), n_);                                    \
        off += n_;                                                                                 \
    } while (0)
    PUT(&h, sizeof(h));
    PUT(&q->w, sizeof(q->w));
    if (q->ext) PUT(&q->sm, sizeof(q->sm));
    PUT(q->prompt, (size_t)q->w.n_prompt * 4);
    if (q->ext) {
        PUT(q->bias, (size_t)q->sm.n_logit_bias * sizeof(ringlm_logit_bias));
        PUT(q->stop_ids, (size_t)q->sm.n_stop_ids * 4);
        PUT(q->constraint, (size_t)q->sm.constraint_bytes);
    }
#undef PUT
    static const uint8_t zero[8];
    if (off < q->len) ring_rec_write(&c->sub, pos, off, zero, q->len - off);
}

/* The requests' records, written one after another and published together (one release
 * store of the producer index): the daemon reads all of them or none. */
static int put_requests(ringlm_client *c, const wire_req *q, uint32_t n, uint64_t total)
{
    uint64_t pos;
    int r = submit_open(c, RINGLM_WIRE_REC_REQUEST);
    if (r < 0) return r;
    r = ring_rec_reserve(&c->sub, (uint32_t)total, &pos);
    if (r < 0) return reserve_error(c, r, (uint32_t)total);
    uint64_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        write_request(c, pos + off, &q[i]);
        off += q[i].len;
    }
    ring_rec_commit(&c->sub, (uint32_t)total);
    if (ring_handshake_peer_waits(&c->dseg->daemon_sleeping)) ring_daemon(c);
    return 0;
}

static int copy_name(char dst[RINGLM_WIRE_NAME_LEN], const char *src, const char *what)
{
    memset(dst, 0, RINGLM_WIRE_NAME_LEN);
    if (!src) return 0;
    size_t n = strlen(src);
    if (n >= RINGLM_WIRE_NAME_LEN)
        return set_err(-EINVAL, "%s '%s' is %zu bytes, at most %d", what, src, n,
                       RINGLM_WIRE_NAME_LEN - 1);
    memcpy(dst, src, n);
    return 0;
}

/* The program's ringlm_sampling as this library knows it (its size checked), into *out. */
static int read_sampling(const ringlm_sampling *smp, ringlm_sampling *out, const char **field)
{
    *field = "size";
    if (smp->size < sizeof(*out))
        return set_err(-EINVAL,
                       "size %u is smaller than ringlm_sampling of library %d.%d (%zu "
                       "bytes): call ringlm_sampling_init",
                       smp->size, RINGLM_VERSION_MAJOR, RINGLM_VERSION_MINOR, sizeof(*out));
    const unsigned char *b = (const unsigned char *)smp;
    for (size_t i = sizeof(*out); i < smp->size; i++)
        if (b[i])
            return set_err(-ENOTSUP,
                           "size %u: the field at byte %zu is set, unknown to library "
                           "%d.%d (%zu bytes)",
                           smp->size, i, RINGLM_VERSION_MAJOR, RINGLM_VERSION_MINOR, sizeof(*out));
    memcpy(out, smp, sizeof(*out));
    *field = NULL;
    return 0;
}

static bool sampling_neutral(const struct ringlm_wire_sampling *sm)
{
    return sm->flags == 0 && sm->repetition_penalty == 1.0f && sm->presence_penalty == 0.0f &&
           sm->frequency_penalty == 0.0f && sm->min_p == 0.0f && sm->n_logit_bias == 0 &&
           sm->n_stop_ids == 0 && sm->top_logprobs == 0 && sm->prompt_logprobs == 0 && sm->n <= 1 &&
           sm->constraint_kind == 0 && sm->constraint_bytes == 0;
}

/* Checks one request with the one parameter check (ringlm_wire_check_request_field and
 * ringlm_wire_check_sampling) and fills its wire record (req_id left 0) and its length;
 * *field names the member at fault. vocab: 0 = unknown. */
static int wire_request(const ringlm_request *req, const ringlm_sampling *smp, uint32_t vocab,
                        wire_req *q, const char **field)
{
    char why[200];
    int r;

    *field = NULL;
    memset(q, 0, sizeof(*q));
    if (!req) return set_err(-EINVAL, "NULL request");
    if (!req->prompt && req->n_prompt) {
        *field = "prompt";
        return set_err(-EINVAL, "prompt is NULL but n_prompt is %u", req->n_prompt);
    }
    struct ringlm_wire_request *w = &q->w;
    w->seed = req->seed;
    w->deadline_us = req->deadline_us;
    w->submit_mono_us = ring_now_ns() / 1000;
    w->max_new_tokens = req->max_new_tokens;
    w->n_prompt = req->n_prompt;
    w->temperature = req->temperature;
    w->top_p = req->top_p;
    w->top_k = req->top_k;
    q->prompt = req->prompt;
    /* max_new_tokens 0 is in range for a prompt's log-probabilities (the extension's flags) */
    uint32_t smp_flags =
        smp && smp->size >= offsetof(ringlm_sampling, flags) + sizeof smp->flags ? smp->flags : 0;
    if (ringlm_wire_check_request_smp(w, smp_flags, field, why, sizeof(why)))
        return set_err(-EINVAL, "%s", why);
    *field = "class_name";
    if ((r = copy_name(w->class_name, req->class_name ? req->class_name : "default",
                       "class_name")) < 0)
        return r;
    if (req->tenant_tag && *req->tenant_tag) {
        *field = "tenant_tag";
        if ((r = copy_name(w->tenant_tag, req->tenant_tag, "tenant_tag")) < 0) return r;
        w->flags |= RINGLM_WIRE_REQ_F_TENANT;
    }
    *field = NULL;
    if (req->ignore_stop) w->flags |= RINGLM_WIRE_REQ_F_IGNORE_STOP;
    q->len = ringlm_wire_request_bytes(req->n_prompt);
    if (!smp) return 0;

    ringlm_sampling x;
    if ((r = read_sampling(smp, &x, field)) < 0) return r;
    struct ringlm_wire_sampling *sm = &q->sm;
    sm->flags = x.flags;
    sm->repetition_penalty = x.repetition_penalty;
    sm->presence_penalty = x.presence_penalty;
    sm->frequency_penalty = x.frequency_penalty;
    sm->min_p = x.min_p;
    sm->top_logprobs = x.top_logprobs;
    sm->prompt_logprobs = x.prompt_logprobs;
    sm->n = x.n;
    sm->constraint_kind = x.constraint_kind;
    /* Counts past the bounds are refused before a list is read. */
    sm->n_logit_bias =
        x.n_logit_bias > RINGLM_MAX_LOGIT_BIAS ? RINGLM_MAX_LOGIT_BIAS + 1u : x.n_logit_bias;
    sm->n_stop_ids = x.n_stop_token_ids > RINGLM_MAX_STOP_TOKEN_IDS ? RINGLM_MAX_STOP_TOKEN_IDS + 1u
                                                                    : x.n_stop_token_ids;
    sm->constraint_bytes = x.constraint_bytes > RINGLM_MAX_CONSTRAINT_BYTES
                               ? RINGLM_MAX_CONSTRAINT_BYTES + 1u
                               : (uint32_t)x.constraint_bytes;
    if (x.n_logit_bias && !x.logit_bias) {
        *field = "logit_bias";
        return set_err(-EINVAL, "logit_bias is NULL but n_logit_bias is %u", x.n_logit_bias);
    }
    if (x.n_stop_token_ids && !x.stop_token_ids) {
        *field = "stop_token_ids";
        return set_err(-EINVAL, "stop_token_ids is NULL but n_stop_token_ids is %u",
                       x.n_stop_token_ids);
    }
    if (x.constraint_bytes && !x.constraint) {
        *field = "constraint";
        return set_err(-EINVAL, "constraint is NULL but constraint_bytes is %zu",
                       x.constraint_bytes);
    }
    struct ringlm_wire_parsed view = {.type = RINGLM_WIRE_REC_REQUEST_EXT,
                                      .req = w,
                                      .prompt = req->prompt,
                                      .smp = sm,
                                      .bias = (const struct ringlm_wire_bias *)x.logit_bias,
                                      .stop_ids = x.stop_token_ids,
                                      .constraint = x.constraint};
    bool unsup = false;
    if (ringlm_wire_check_sampling(&view, vocab, field, &unsup, why, sizeof(why)))
        return set_err(unsup ? -ENOTSUP : -EINVAL, "%s", why);
    if (sampling_neutral(sm)) return 0; /* a plain request: any daemon takes it */
    q->ext = true;
    q->bias = x.logit_bias;
    q->stop_ids = x.stop_token_ids;
    q->constraint = x.constraint;
    q->len = ringlm_wire_request_ext_bytes(req->n_prompt, sm->n_logit_bias, sm->n_stop_ids,
                                           sm->constraint_bytes);
    return 0;
}

int ringlm_request_check(const ringlm_request *req, const char **field)
{
    return ringlm_request_check_ext(req, NULL, 0, field);
}

int ringlm_request_check_ext(const ringlm_request *req, const ringlm_sampling *smp, int vocab_size,
                             const char **field)
{
    wire_req q;
    const char *f;
    int rc = wire_request(req, smp, vocab_size > 0 ? (uint32_t)vocab_size : 0, &q, &f);
    if (field) *field = f;
    return rc;
}

int ringlm_submit(ringlm_client *c, const ringlm_request *req, uint64_t *id)
{
    if (!c || !req) return set_err(-EINVAL, "NULL client or request");
    return ringlm_submit_batch_ext(c, req, NULL, 1, id);
}

int ringlm_submit_ext(ringlm_client *c, const ringlm_request *req, const ringlm_sampling *smp,
                      uint64_t *id)
{
    if (!c || !req) return set_err(-EINVAL, "NULL client or request");
    return ringlm_submit_batch_ext(c, req, smp, 1, id);
}

int ringlm_submit_batch(ringlm_client *c, const ringlm_request *reqs, uint32_t n, uint64_t *ids)
{
    return ringlm_submit_batch_ext(c, reqs, NULL, n, ids);
}

int ringlm_submit_batch_ext(ringlm_client *c, const ringlm_request *reqs,
                            const ringlm_sampling *smps, uint32_t n, uint64_t *ids)
{
    wire_req one, *q = &one;
    uint64_t total = 0, span = 0;
    int r;

    if (!c || !reqs) return set_err(-EINVAL, "NULL client or request");
    if (n == 0) return set_err(-EINVAL, "a batch of no requests");
    if (n > 1 && !(q = calloc(n, sizeof(*q)))) return set_err(-ENOMEM, "a batch of %u requests", n);
    for (uint32_t i = 0; i < n; i++) {
        const char *field;
        if ((r = wire_request(&reqs[i], smps ? &smps[i] : NULL, c->vocab_size, &q[i], &field)) <
            0) {
            if (n > 1) {
                char detail[256];
                snprintf(detail, sizeof(detail), "%s", ringlm_errdetail());
                set_err(r, "request %u of the batch: %s", i, detail);
            }
            goto out;
        }
        if (q[i].ext && !(c->caps & RINGLM_WIRE_CAP_SAMPLING)) {
            r = set_err(-ENOTSUP,
                        "%sthe daemon does not take sampling extensions (it is older "
                        "than library 0.4)",
                        n > 1 ? "a request of the batch: " : "");
            goto out;
        }
        if (q[i].ext &&
            (q[i].sm.flags & (RINGLM_WIRE_SMP_F_LOGPROBS | RINGLM_WIRE_SMP_F_PROMPT_LOGPROBS)) &&
            !(c->caps & RINGLM_WIRE_CAP_LOGPROBS)) {
            r = set_err(-ENOTSUP, "%sthe daemon does not send log-probabilities",
                        n > 1 ? "a request of the batch: " : "");
            goto out;
        }
        uint32_t ns = q[i].ext && q[i].sm.n > 1 ? q[i].sm.n : 1;
        if (ns > 1 && !(c->caps & RINGLM_WIRE_CAP_SAMPLES)) {
            r = set_err(-ENOTSUP,
                        "%sn %u: the daemon does not run more than one sample per request",
                        n > 1 ? "a request of the batch: " : "", ns);
            goto out;
        }
        if (ns > c->max_n) {
            r = set_err(-EINVAL, "%sn %u outside [1, %u], the daemon's maximum (ringlmd --max-n)",
                        n > 1 ? "a request of the batch: " : "", ns, c->max_n);
            goto out;
        }
        uint32_t kind = q[i].sm.constraint_kind;
        if (ns > 1 && kind && !(c->caps & RINGLM_WIRE_CAP_SAMPLES_CONSTRAINED)) {
            r = set_err(-ENOTSUP,
                        "%sn %u with a constraint: the daemon does not run constrained samples "
                        "(it is older than this library)",
                        n > 1 ? "a request of the batch: " : "", ns);
            goto out;
        }
        if (q[i].ext && kind && !(c->constraint_kinds & (1u << kind))) {
            static const char *const names[] = {"none",    "json_schema", "json_object", "regex",
                                                "grammar", "choice",      "python_calls"};
            r = set_err(-ENOTSUP, "%sconstraint: the daemon does not enforce kind %s%s",
                        n > 1 ? "a request of the batch: " : "",
                        kind < sizeof names / sizeof *names ? names[kind] : "?",
                        c->constraint_kinds ? ""
                                            : " (it enforces none: it is older than this "
                                              "library, or has no tokenizer)");
            goto out;
        }
        uint64_t len = q[i].len;
        if (len > c->sub.cap) {
            r = set_err(-E2BIG,
                        "a prompt of %u tokens (with its lists) needs a %llu-byte record, the "
                        "submit ring holds %llu",
                        reqs[i].n_prompt, (unsigned long long)len, (unsigned long long)c->sub.cap);
            goto out;
        }
        q[i].w.req_id = c->next_id + span; /* sample k of it is req_id + k */
        span += ns;
        total += len;
    }
    if (total > c->sub.cap) {
        r = set_err(-E2BIG, "the %u requests need %llu bytes together, the submit ring holds %llu",
                    n, (unsigned long long)total, (unsigned long long)c->sub.cap);
        goto out;
    }
    if ((r = put_requests(c, q, n, total)) < 0) goto out;
    for (uint32_t i = 0; i < n; i++)
        if (ids) ids[i] = q[i].w.req_id;
    c->next_id += span;
out:
    if (q != &one) free(q);
    return r;
}

int ringlm_cancel(ringlm_client *c, uint64_t req_id)
{
    if (!c || req_id == 0) return set_err(-EINVAL, "cancel of request id 0");
    struct ringlm_wire_cancel body = {.req_id = req_id};
    struct ringlm_wire_rec_hdr h = {.len = RINGLM_WIRE_CANCEL_BYTES,
                                    .type = RINGLM_WIRE_REC_CANCEL};
    return put_record(c, RINGLM_WIRE_CANCEL_BYTES, &h, &body, sizeof(body));
}

/* ---- event side ----------------------------------------------------------------------- */
/* After consuming: if the daemon waits for space in our event ring, tell it. Checked when
 * the ring runs empty and every WANT_SPACE_CHECK_EVERY events, not after every event, so
 * a fast reader pays one fence per batch. */
static void maybe_wake_for_space(ringlm_client *c, int force)
{
    if (!force && c->consumed_since_check < WANT_SPACE_CHECK_EVERY) return;
    c->consumed_since_check = 0;
    /* The handshake with the daemon's wait for space: our consumer index is published. */
    if (ring_handshake_peer_waits(&c->dseg->want_space) && ring_load32(&c->dseg->daemon_sleeping))
        ring_daemon(c);
}

/* 1 with *ev, 0 nothing (complete) available, <0 protocol error. */
static int take_event(ringlm_client *c, ringlm_event *out)
{
    char why[128];
    int64_t n = ring_ev_avail(&c->ev, 1, why, sizeof(why));
    if (n < 0) return set_err(-EPROTO, "%s", why);
    if (n == 0) return 0;
    struct ringlm_wire_event e = ring_ev_peek(&c->ev, 0);
    unsigned kind = RINGLM_WIRE_EV_KIND(e.meta);
    memset(out, 0, sizeof(*out));
    out->req_id = e.req_id;
    c->has_lp = false;
    c->detail[0] = 0;
    if (kind == RINGLM_WIRE_EV_TOKEN || kind == RINGLM_WIRE_EV_PROMPT) {
        /* Its log-probabilities, when it has any, were published with it: the producer
         * index seen (n) covers the whole group, so no reload is needed, and an event
         * without any costs one look at the slot after it. */
        unsigned used = 1;
        struct ringlm_wire_event group[RINGLM_WIRE_LP_SLOTS(RINGLM_WIRE_TOP_LOGPROBS_MAX)];
        if (n >= 2) group[1] = ring_ev_peek(&c->ev, 1);
        if (n >= 2 && RINGLM_WIRE_EV_KIND(group[1].meta) == RINGLM_WIRE_EV_LOGPROB) {
            int64_t have = n < (int64_t)(sizeof group / sizeof *group)
                               ? n
                               : (int64_t)(sizeof group / sizeof *group);
            for (int64_t k = 2; k < have; k++) group[k] = ring_ev_peek(&c->ev, (uint64_t)k);
            int top = ringlm_wire_lp_decode(&group[1], &group[2], (unsigned)(have - 2), &c->lp, why,
                                            sizeof(why));
            if (top < 0)
                return set_err(-EPROTO, "request %llu: %s", (unsigned long long)e.req_id, why);
            used = 2 + (unsigned)top;
            c->has_lp = true;
            c->lp_token = e.value;
        } else if (kind == RINGLM_WIRE_EV_PROMPT) {
            return set_err(-EPROTO, "PROMPT event of request %llu without its LOGPROB",
                           (unsigned long long)e.req_id);
        }
        out->kind = kind == RINGLM_WIRE_EV_TOKEN ? RINGLM_EV_TOKEN : RINGLM_EV_PROMPT_TOKEN;
        out->token = e.value;
        out->index = RINGLM_WIRE_EV_LOW(e.meta);
        ring_ev_consume(&c->ev, used);
        c->consumed_since_check += used;
        return 1;
    }
    if (kind != RINGLM_WIRE_EV_FINISH)
        return set_err(-EPROTO, "event kind %u at index %llu unknown", kind,
                       (unsigned long long)c->ev.cons);
    /* The FINISH_EXT is published together with its FINISH. */
    n = ring_ev_avail(&c->ev, 2, why, sizeof(why));
    if (n < 0) return set_err(-EPROTO, "%s", why);
    if (n < 2) return 0;
    struct ringlm_wire_event x = ring_ev_peek(&c->ev, 1);
    if (RINGLM_WIRE_EV_KIND(x.meta) != RINGLM_WIRE_EV_FINISH_EXT ||
        (uint32_t)x.value != (uint32_t)e.req_id)
        return set_err(-EPROTO, "FINISH of request %llu not followed by its FINISH_EXT",
                       (unsigned long long)e.req_id);
    /* a detail, when the daemon sent one, follows in the same publish */
    unsigned used = 2;
    c->detail[0] = 0;
    if (n >= 3) {
        struct ringlm_wire_event d = ring_ev_peek(&c->ev, 2);
        if (RINGLM_WIRE_EV_KIND(d.meta) == RINGLM_WIRE_EV_DETAIL && d.req_id == e.req_id) {
            struct ringlm_wire_event txt[RINGLM_WIRE_DETAIL_SLOTS(RINGLM_WIRE_DETAIL_MAX)];
            int64_t have = n - 3 < (int64_t)(sizeof txt / sizeof *txt)
                               ? n - 3
                               : (int64_t)(sizeof txt / sizeof *txt);
            for (int64_t k = 0; k < have; k++) txt[k] = ring_ev_peek(&c->ev, (uint64_t)(3 + k));
            int got =
                ringlm_wire_detail_decode(&d, txt, (unsigned)have, c->detail, why, sizeof(why));
            if (got < 0) return set_err(-EPROTO, "%s", why);
            used = 3 + (unsigned)got;
        }
    }
    uint32_t low = RINGLM_WIRE_EV_LOW(e.meta);
    out->kind = RINGLM_EV_FINISH;
    out->finish_reason = (int)((low >> 8) & 0xff);
    out->reject_reason = (int)(low & 0xff);
    out->n_tokens = (uint32_t)e.value;
    out->n_cached_tokens = RINGLM_WIRE_EV_LOW(x.meta);
    out->policy_hash = x.req_id;
    ring_ev_consume(&c->ev, used);
    c->consumed_since_check += used;
    return 1;
}

/* The default spin adapts to how long this client waits: a wait that the full spin would
 * have covered (a request/response peer, a fast stream) restores it; a longer one (a
 * stream of one token per batch, milliseconds apart) halves it, so a waiting client stops
 * burning a CPU the daemon and its workers need and sleeps at once — the daemon's futex
 * wake then costs what the spin would have, once per batch. */
static void adapt_spin(ringlm_client *c, uint64_t waited_ns)
{
    if (c->spin_fixed) return;
    if ((int64_t)waited_ns <= c->spin_max_ns)
        c->spin_ns = c->spin_max_ns;
    else
        c->spin_ns /= 2;
}

int ringlm_next_event(ringlm_client *c, ringlm_event *ev, int timeout_ms)
{
    uint64_t start = 0, deadline = UINT64_MAX, last_now = 0;
    bool slept = false;
    int r;

    for (int round = 0;; round++) {
        r = take_event(c, ev);
        if (r != 0) {
            if (r > 0) {
                maybe_wake_for_space(c, 0);
                /* A spinning wait takes the spin loop's last clock reading (at most one
				 * 64-poll batch old): a clock read more per event was 10-15% of a
				 * spinning round trip (ipc_bench shm_rtt 261-271 -> 301-310 ns). */
                if (round > 0) adapt_spin(c, (slept ? ring_now_ns() : last_now) - start);
            }
            return r;
        }
        maybe_wake_for_space(c, 1);
        r = session_end_error(c, 0);
        if (r < 0) return r;
        if (timeout_ms == 0) {
            /* Pollers learn of a dead daemon too: from the watcher, or at a bounded
             * syscall cost. */
            if (__atomic_load_n(&c->sock_dead, __ATOMIC_ACQUIRE)) return session_end_error(c, 1);
            if (watched(c)) return 0;
            uint64_t now = ring_now_ns();
            if (now - c->last_live_check_ns < (uint64_t)SLEEP_SLICE_NS) return 0;
            c->last_live_check_ns = now;
            return session_end_error(c, 1);
        }
        if (round == 0) {
            start = ring_now_ns();
            if (timeout_ms > 0) deadline = start + (uint64_t)timeout_ms * 1000000ull;
        }
        uint64_t now = ring_now_ns();
        last_now = now;
        if (now >= deadline) return 0;
        if ((int64_t)(now - start) < c->spin_ns) {
            /* The slot at cons is where the next event lands: keep its line
			 * coming while polling the index, so the miss on the slot runs
			 * alongside the miss on ev_prod rather than after it. */
            const void *next_slot = &c->ev.slots[c->ev.cons & c->ev.mask];
            for (int i = 0; i < 64; i++) {
                __builtin_prefetch(next_slot);
                if (ring_load_relaxed(c->ev.prod_p) != c->ev.cons) break;
                ring_cpu_relax();
            }
            continue;
        }
        /* Sleep: announce, look again, then wait on the low word of ev_prod with the
		 * value we saw — a publish in between makes the wait return — and on alarm
		 * with the value read before looking at what it reports. */
        ring_handshake_announce(&c->cseg->client_sleeping);
        uint32_t alarm = __atomic_load_n(&c->alarm, __ATOMIC_SEQ_CST);
        uint64_t prod = ring_load_acquire(c->ev.prod_p);
        int dead = __atomic_load_n(&c->sock_dead, __ATOMIC_SEQ_CST);
        if (__atomic_exchange_n(&c->wake_pending, 0, __ATOMIC_SEQ_CST)) {
            ring_store32(&c->cseg->client_sleeping, 0);
            return 0;
        }
        if (prod != c->ev.cons || dead || ring_load32(&c->dseg->state) == RINGLM_WIRE_ST_CLOSED) {
            ring_store32(&c->cseg->client_sleeping, 0);
            if (dead) (void)session_end_error(c, 1);
            continue;
        }
        bool both = watched(c);
        int64_t slice = both ? -1 : SLEEP_SLICE_NS;
        if (deadline != UINT64_MAX && (slice < 0 || (int64_t)(deadline - now) < slice))
            slice = (int64_t)(deadline - now);
        if (both) {
            r = futex_wait_either((const uint32_t *)c->ev.prod_p, (uint32_t)prod,
                                  FUTEX_SCOPE_SHARED, &c->alarm, alarm, FUTEX_SCOPE_PROCESS, slice);
            if (r == -ENOSYS || r == -EPERM) { /* no futex_waitv here: sliced sleeps */
                __atomic_store_n(&c->watching, 0, __ATOMIC_SEQ_CST);
                ring_store32(&c->cseg->client_sleeping, 0);
                continue;
            }
        } else {
            r = futex_wait((const uint32_t *)c->ev.prod_p, (uint32_t)prod, slice,
                           FUTEX_SCOPE_SHARED);
        }
        slept = true;
        ring_store32(&c->cseg->client_sleeping, 0);
        if (r == -EINTR) return set_err(-EINTR, "interrupted while waiting for events");
        if (r == -ETIMEDOUT && !both) {
            /* The end is sticky but reported only once every published event
			 * has been taken (take_event runs first in each round). */
            (void)session_end_error(c, 1);
        }
    }
}

int ringlm_constraint_kinds(const ringlm_client *c)
{
    if (!c) return -EINVAL;
    return (int)(c->constraint_kinds & 0x7fffffffu);
}

const char *ringlm_event_detail(const ringlm_client *c)
{
    return c && c->detail[0] ? c->detail : NULL;
}

int ringlm_event_logprobs(const ringlm_client *c, ringlm_logprobs *out)
{
    if (!c || !out) return set_err(-EINVAL, "ringlm_event_logprobs: %s is NULL", c ? "out" : "c");
    if (!c->has_lp) return 0;
    memset(out, 0, sizeof *out);
    out->token = c->lp_token;
    out->logprob = c->lp.logprob;
    out->rank = c->lp.rank;
    out->n_top = c->lp.n_top < RINGLM_MAX_LOGPROBS ? c->lp.n_top : RINGLM_MAX_LOGPROBS;
    out->processed = c->lp.flags & RINGLM_WIRE_LP_F_PROCESSED;
    for (uint32_t i = 0; i < out->n_top; i++) {
        out->top_token[i] = c->lp.top_token[i];
        out->top_logprob[i] = c->lp.top_logprob[i];
    }
    return 1;
}
