/* SPDX-License-Identifier: MIT */
/* formats/stats.c — the stats file's writer and reader (see stats.h). */
#include "formats/stats.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const fmt_stats_pool_names[FMT_STATS_POOLS] = {"device", "host", "disk"};

/* The counters after the pools, in file order. */
// clang-format off
#define COUNTERS(X) \
    X(transfers_inflight) X(swap_verified) X(swap_verify_errors) X(transfer_overlap_errors) \
    X(engine_errors) X(finished) X(rejects)
// clang-format on

int fmt_stats_format(const fmt_stats *s, char *buf, size_t cap)
{
    fmt_json j;
    fmt_json_init(&j, buf, cap);
    fmt_json_uint(&j, "t_us", s->t_us);
    fmt_json_uint(&j, "iterations", s->iterations);
    fmt_json_uint(&j, "sessions", s->sessions);
    fmt_json_uint(&j, "live_requests", s->live_requests);
    fmt_json_uint(&j, "waiting", s->waiting);
    fmt_json_uint(&j, "running", s->running);
    fmt_json_uint(&j, "swapped", s->swapped);
    fmt_json_uint(&j, "in_transit", s->in_transit);
    fmt_json_uint(&j, "blocked", s->blocked);
    fmt_json_object(&j, "kv");
    for (int p = 0; p < FMT_STATS_POOLS; p++) {
        fmt_json_object(&j, fmt_stats_pool_names[p]);
        fmt_json_uint(&j, "used", s->kv[p].used);
        fmt_json_uint(&j, "free", s->kv[p].free);
        fmt_json_uint(&j, "total", s->kv[p].total);
        fmt_json_close(&j);
    }
    fmt_json_close(&j);
    fmt_json_str(&j, "invariants", s->invariants);
#define W(f) fmt_json_uint(&j, #f, s->f);
    COUNTERS(W)
#undef W
    fmt_json_bool(&j, "draining", s->draining);
    fmt_json_uint(&j, "steps", s->steps);
    fmt_json_str(&j, "policy", s->policy);
    int n = fmt_json_end(&j);
    if (n < 0 || (size_t)n + 2 > cap) return -EMSGSIZE;
    buf[n++] = '\n';
    buf[n] = 0;
    return n;
}

int fmt_stats_write(const char *path, const fmt_stats *s, char *why, size_t whylen)
{
    char line[4096], tmp[4096];
    int n = fmt_stats_format(s, line, sizeof line);
    if (n < 0) {
        snprintf(why, whylen, "stats line longer than %zu bytes", sizeof line);
        return n;
    }
    /* A name of our own beside the file (so the rename is atomic): never a fixed name, which
     * could be a file of someone else's that O_TRUNC would empty. */
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= sizeof tmp) {
        snprintf(why, whylen, "stats file path too long");
        return -ENAMETOOLONG;
    }
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(why, whylen, "%s: %s", tmp, strerror(e));
        return -e;
    }
    fchmod(fd, 0644);
    ssize_t w = write(fd, line, (size_t)n);
    int e = w < 0 ? errno : (w != n ? EIO : 0);
    if (close(fd) != 0 && !e) e = errno;
    if (!e && rename(tmp, path) != 0) e = errno;
    if (e) {
        unlink(tmp);
        snprintf(why, whylen, "%s: %s", path, strerror(e));
        return -e;
    }
    return 0;
}

static int get_u(json_t *o, const char *key, uint64_t *out, char *why, size_t wl)
{
    int64_t v = 0;
    if (fmt_get_int(o, key, FMT_REQUIRED, 0, INT64_MAX, &v, why, wl)) return -1;
    *out = (uint64_t)v;
    return 0;
}

int fmt_stats_parse(const char *text, size_t len, fmt_stats *out, char *why, size_t whylen)
{
    memset(out, 0, sizeof *out);
    json_t *o = fmt_load_object(text, len, why, whylen);
    if (!o) return -EINVAL;
    int bad = get_u(o, "t_us", &out->t_us, why, whylen) ||
              get_u(o, "iterations", &out->iterations, why, whylen) ||
              get_u(o, "sessions", &out->sessions, why, whylen) ||
              get_u(o, "live_requests", &out->live_requests, why, whylen) ||
              get_u(o, "waiting", &out->waiting, why, whylen) ||
              get_u(o, "running", &out->running, why, whylen) ||
              get_u(o, "swapped", &out->swapped, why, whylen) ||
              get_u(o, "in_transit", &out->in_transit, why, whylen) ||
              get_u(o, "blocked", &out->blocked, why, whylen) ||
              fmt_get_str(o, "invariants", FMT_REQUIRED, out->invariants, sizeof out->invariants,
                          why, whylen) ||
              get_u(o, "steps", &out->steps, why, whylen) ||
              fmt_get_str(o, "policy", FMT_REQUIRED, out->policy, sizeof out->policy, why, whylen);
#define R(f) bad = bad || get_u(o, #f, &out->f, why, whylen);
    COUNTERS(R)
#undef R
    json_t *kv = json_object_get(o, "kv");
    if (!bad && !json_is_object(kv)) {
        snprintf(why, whylen, "\"kv\" is missing or not an object");
        bad = 1;
    }
    for (int p = 0; !bad && p < FMT_STATS_POOLS; p++) {
        json_t *pool = json_object_get(kv, fmt_stats_pool_names[p]);
        if (!json_is_object(pool)) {
            snprintf(why, whylen, "\"kv.%s\" is missing or not an object", fmt_stats_pool_names[p]);
            bad = 1;
            break;
        }
        bad = get_u(pool, "used", &out->kv[p].used, why, whylen) ||
              get_u(pool, "free", &out->kv[p].free, why, whylen) ||
              get_u(pool, "total", &out->kv[p].total, why, whylen);
    }
    json_t *dr = json_object_get(o, "draining");
    if (!bad && !json_is_boolean(dr)) {
        snprintf(why, whylen, "\"draining\" is missing or not true/false");
        bad = 1;
    }
    out->draining = json_is_true(dr);
    json_decref(o);
    return bad ? -EINVAL : 0;
}

int fmt_stats_read(const char *path, fmt_stats *out, char *why, size_t whylen)
{
    char *buf;
    size_t len;
    int rc = fmt_read_file(path, 1 << 20, &buf, &len, why, whylen);
    if (rc < 0) return rc;
    rc = fmt_stats_parse(buf, len, out, why, whylen);
    free(buf);
    return rc;
}
