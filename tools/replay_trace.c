/* SPDX-License-Identifier: MIT */
/* tools/replay_trace.c — `ringlm replay`: loading a trace and the client processes that
 * replay it (see replay.h). */
#include "tools/replay.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "formats/trace.h"
#include "libclient/ringlm.h"
#include "tools/cli.h"

/* ======================================================================================= */
/* replay: traces                                                                          */
/* ======================================================================================= */

int replay_name_index(names *ns, const char *s)
{
    for (int i = 0; i < ns->n; i++)
        if (strcmp(ns->v[i], s) == 0) return i;
    ns->v = cli_realloc(ns->v, sizeof(char *) * (size_t)(ns->n + 1));
    ns->v[ns->n] = cli_strdup(s);
    return ns->n++;
}

void replay_free_names(names *ns)
{
    for (int i = 0; i < ns->n; i++) free(ns->v[i]);
    free(ns->v);
    ns->v = NULL;
    ns->n = 0;
}

static void trace_push(trace *t, const treq *r)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 1024;
        t->r = realloc(t->r, t->cap * sizeof *t->r);
        if (!t->r) cli_die("out of memory");
    }
    t->r[t->n++] = *r;
}

static uint32_t scale_len(int64_t v, double s)
{
    double x = floor((double)v * s + 0.5);
    if (x < 1) x = 1;
    if (x > 1e9) x = 1e9;
    return (uint32_t)x;
}

void replay_load_trace(const char *path, const load_opts *lo, trace *t)
{
    char why[256];
    char *buf;
    size_t len;
    if (fmt_read_file(path, SIZE_MAX, &buf, &len, why, sizeof why) < 0) cli_die("trace %s", why);
    fmt_trace_reader rd;
    if (fmt_trace_open(&rd, buf, len, lo->fmt, why, sizeof why) < 0)
        cli_die("trace %s: %s", path, why);
    /* raw records first (trace time), then window/scale below */
    typedef struct raw {
        int64_t t_us, cancel_us, deadline_us;
        int64_t prompt, out;
        int tenant, cls;
    } raw;
    raw *rs = NULL;
    size_t nr = 0, rcap = 0;
    fmt_request q;
    fmt_request_text text;
    int rc;
    while ((rc = fmt_trace_next(&rd, &q, &text, why, sizeof why)) != 0) {
        if (rc < 0) cli_die("%s:%u: %s", path, rd.line, why);
        raw r = {.t_us = q.arrival_us,
                 .prompt = q.prompt_tokens,
                 .out = q.output_tokens,
                 .cancel_us = -1,
                 .deadline_us = -1,
                 .tenant = -1,
                 .cls = -1};
        if (q.cancel_us != FMT_NULL) r.cancel_us = q.cancel_us - q.arrival_us;
        if (q.deadline_us != FMT_NULL) r.deadline_us = q.deadline_us - q.arrival_us;
        if (q.tenant && *q.tenant) r.tenant = replay_name_index(&t->tenants, q.tenant);
        if (q.class_name && *q.class_name) r.cls = replay_name_index(&t->classes, q.class_name);
        if (r.out < 1) r.out = 1; /* the daemon needs max_new_tokens >= 1 */
        if (nr == rcap) {
            rcap = rcap ? rcap * 2 : 4096;
            rs = realloc(rs, rcap * sizeof *rs);
            if (!rs) cli_die("out of memory");
        }
        rs[nr++] = r;
    }
    free(buf);
    if (rd.torn)
        fprintf(stderr,
                "ringlm: skipped %u torn line(s) of %s (the start of a line cut short: its "
                "writer died mid-write)\n",
                rd.torn, path);
    if (nr == 0) cli_die("trace %s has no requests", path);
    /* Native traces are in finish order; every format is replayed in arrival order. */
    for (size_t i = 1; i < nr; i++) { /* insertion sort: traces are nearly sorted */
        raw x = rs[i];
        size_t j = i;
        while (j > 0 && rs[j - 1].t_us > x.t_us) {
            rs[j] = rs[j - 1];
            j--;
        }
        rs[j] = x;
    }
    int64_t t0 = rs[0].t_us + (int64_t)(lo->window_start_s * 1e6);
    int64_t t1 = lo->window_len_s > 0 ? t0 + (int64_t)(lo->window_len_s * 1e6) : INT64_MAX;
    int cls_forced = lo->force_class ? replay_name_index(&t->classes, lo->force_class) : -1;
    size_t k = 0;
    for (size_t i = 0; i < nr; i++) {
        if (rs[i].t_us < t0 || rs[i].t_us >= t1) continue;
        if (lo->limit && (long)t->n >= lo->limit) break;
        treq q = {0};
        q.arrival_us = (int64_t)((double)(rs[i].t_us - t0) / lo->rate);
        q.prompt_tokens = scale_len(rs[i].prompt, lo->length_scale);
        q.max_tokens = scale_len(rs[i].out, lo->length_scale);
        if (lo->max_context > 1 && (long)q.prompt_tokens + (long)q.max_tokens > lo->max_context) {
            /* keep the prompt/output mix, fit in the context */
            double f = (double)lo->max_context / ((double)q.prompt_tokens + (double)q.max_tokens);
            q.prompt_tokens = (uint32_t)fmax(1, floor(q.prompt_tokens * f));
            q.max_tokens = (uint32_t)fmax(1, (double)lo->max_context - q.prompt_tokens);
            if ((long)q.prompt_tokens + (long)q.max_tokens > lo->max_context)
                q.prompt_tokens = (uint32_t)(lo->max_context - q.max_tokens);
        }
        q.cancel_after_us =
            rs[i].cancel_us >= 0 ? (int64_t)((double)rs[i].cancel_us / lo->rate) : -1;
        q.deadline_us = rs[i].deadline_us > 0 ? rs[i].deadline_us : 0;
        q.tenant = rs[i].tenant;
        q.cls = cls_forced >= 0 ? cls_forced : rs[i].cls;
        if (lo->force_tenants && lo->force_tenants->n)
            q.tenant = replay_name_index(&t->tenants,
                                         lo->force_tenants->v[k % (size_t)lo->force_tenants->n]);
        k++;
        trace_push(t, &q);
    }
    free(rs);
    if (t->n == 0) cli_die("trace %s: no request falls in the window", path);
}

/* ======================================================================================= */
/* replay: client processes                                                                */
/* ======================================================================================= */

/* One result, child → parent through a pipe (well under PIPE_BUF: written atomically). */

typedef struct inflight {
    uint64_t id;
    uint32_t idx;
    int64_t submit_us, first_us, cancel_at_us;
    uint32_t n_tokens;
    bool cancel_sent;
} inflight;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Synthetic prompts start as a llama2.c model's do: BOS (id 1), then ids from 3 up, past
 * BOS and EOS. */
#define REPLAY_BOS 1

uint64_t replay_prompt(const replay_opts *ro, size_t idx, uint32_t n, int32_t *ids)
{
    uint64_t s = ro->seed ^ ((uint64_t)idx * 0x100000001b3ull);
    ids[0] = REPLAY_BOS;
    int span = ro->vocab > 4 ? ro->vocab - 3 : 1;
    for (uint32_t j = 1; j < n; j++) ids[j] = 3 + (int32_t)(splitmix(&s) % (uint64_t)span);
    return s;
}

void replay_put_rec(int fd, const rrec *r)
{
    const char *p = (const char *)r;
    size_t left = sizeof *r;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) _exit(3); /* the parent is gone */
        p += w;
        left -= (size_t)w;
    }
}

void replay_child_main(int k, const trace *t, const replay_opts *ro, uint64_t t0, int fd)
{
    ringlm_client *c;
    int rc = ringlm_connect(cli_socket, &c);
    if (rc < 0) {
        rrec e = {.idx = UINT32_MAX, .status = rc};
        replay_put_rec(fd, &e);
        fprintf(stderr, "ringlm replay: client %d: connect: %s %s\n", k, ringlm_strerror(rc),
                ringlm_errdetail());
        _exit(2);
    }
    uint32_t max_prompt = 1;
    for (size_t i = (size_t)k; i < t->n; i += (size_t)ro->clients)
        if (t->r[i].prompt_tokens > max_prompt) max_prompt = t->r[i].prompt_tokens;
    int32_t *ids = cli_realloc(NULL, sizeof(int32_t) * max_prompt);
    size_t fl_cap = 64, fl_n = 0;
    inflight *fl = cli_realloc(NULL, fl_cap * sizeof *fl);
    size_t next = (size_t)k;
    int64_t last_arrival = t->n ? t->r[t->n - 1].arrival_us : 0;
    int64_t give_up_us = last_arrival + (int64_t)(ro->drain_timeout_s * 1e6);
    int session_err = 0;
    for (;;) {
        int64_t now = (int64_t)(cli_now_us() - t0);
        /* submit what is due (open loop: completions do not pace arrivals) */
        while (!session_err && next < t->n && t->r[next].arrival_us <= now) {
            const treq *q = &t->r[next];
            uint64_t s = replay_prompt(ro, next, q->prompt_tokens, ids);
            ringlm_request r;
            ringlm_request_init(&r);
            r.prompt = ids;
            r.n_prompt = q->prompt_tokens;
            r.max_new_tokens = q->max_tokens;
            r.temperature = ro->temperature;
            r.seed = s;
            r.deadline_us = (uint64_t)q->deadline_us;
            if (q->cls >= 0) r.class_name = t->classes.v[q->cls];
            if (q->tenant >= 0) r.tenant_tag = t->tenants.v[q->tenant];
            uint64_t id;
            int64_t sub = (int64_t)(cli_now_us() - t0);
            rc = ringlm_submit(c, &r, &id);
            if (rc == -EAGAIN) break; /* ring full: read events, come back */
            if (rc < 0) {
                rrec e = {.idx = (uint32_t)next,
                          .status = rc,
                          .submit_us = sub,
                          .first_us = -1,
                          .finish_us = sub};
                replay_put_rec(fd, &e);
                if (rc == -EPIPE || rc == -ECONNRESET) session_err = rc;
            } else {
                if (fl_n == fl_cap) fl = cli_realloc(fl, (fl_cap *= 2) * sizeof *fl);
                fl[fl_n++] = (inflight){
                    .id = id,
                    .idx = (uint32_t)next,
                    .submit_us = sub,
                    .first_us = -1,
                    .cancel_at_us = q->cancel_after_us >= 0 ? sub + q->cancel_after_us : -1};
            }
            next += (size_t)ro->clients;
        }
        if (session_err) break;
        if (next >= t->n && fl_n == 0) break;
        now = (int64_t)(cli_now_us() - t0);
        if (now > give_up_us) break;
        /* cancels due */
        int64_t wake = next < t->n ? t->r[next].arrival_us : now + 50000;
        for (size_t i = 0; i < fl_n; i++) {
            if (fl[i].cancel_at_us < 0 || fl[i].cancel_sent) continue;
            if (fl[i].cancel_at_us <= now) {
                if (ringlm_cancel(c, fl[i].id) == 0) fl[i].cancel_sent = true;
            } else if (fl[i].cancel_at_us < wake) {
                wake = fl[i].cancel_at_us;
            }
        }
        int timeout_ms = wake <= now ? 0 : (int)((wake - now + 999) / 1000);
        if (timeout_ms > 50) timeout_ms = 50;
        ringlm_event ev;
        rc = ringlm_next_event(c, &ev, timeout_ms);
        if (rc == 0 || rc == -EINTR) continue;
        if (rc < 0) {
            session_err = rc;
            break;
        }
        int64_t tev = (int64_t)(cli_now_us() - t0);
        size_t i;
        for (i = 0; i < fl_n && fl[i].id != ev.req_id; i++) {}
        if (i == fl_n) continue;
        if (ev.kind == RINGLM_EV_TOKEN) {
            if (fl[i].first_us < 0) fl[i].first_us = tev;
            fl[i].n_tokens++;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            rrec e = {.idx = fl[i].idx,
                      .submit_us = fl[i].submit_us,
                      .first_us = fl[i].first_us,
                      .finish_us = tev,
                      .n_tokens = ev.n_tokens ? ev.n_tokens : fl[i].n_tokens,
                      .finish_reason = ev.finish_reason,
                      .reject_reason = ev.reject_reason};
            replay_put_rec(fd, &e);
            fl[i] = fl[--fl_n];
        }
    }
    /* whatever is left never finished: the session died or the drain timed out */
    for (size_t i = 0; i < fl_n; i++) {
        rrec e = {.idx = fl[i].idx,
                  .status = session_err ? session_err : -ETIMEDOUT,
                  .submit_us = fl[i].submit_us,
                  .first_us = fl[i].first_us,
                  .finish_us = (int64_t)(cli_now_us() - t0),
                  .n_tokens = fl[i].n_tokens};
        replay_put_rec(fd, &e);
    }
    for (; next < t->n; next += (size_t)ro->clients) {
        rrec e = {.idx = (uint32_t)next,
                  .status = session_err ? session_err : -ETIMEDOUT,
                  .first_us = -1};
        replay_put_rec(fd, &e);
    }
    ringlm_close(c);
    free(ids);
    free(fl);
    close(fd);
    _exit(session_err ? 1 : 0);
}
