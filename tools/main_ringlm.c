/* SPDX-License-Identifier: MIT */
/*
 * ringlm — the command-line client of ringlmd.
 *
 *   ringlm [--socket PATH] generate --prompt TEXT --tokenizer T [options]
 *   ringlm [--socket PATH] replay TRACE [options]
 *
 * generate streams decoded text exactly as llama2.c's run.c prints it (prompt pieces, then
 * generated pieces, then a newline), so a greedy run can be compared byte for byte with the
 * reference. replay drives the daemon open-loop from a recorded trace (native JSONL, Azure
 * CSV, Mooncake JSONL) from several client processes and reports latency percentiles per
 * tenant.
 *
 * Every subcommand takes --socket PATH (default $RINGLM_SOCKET, else RINGLM_DEFAULT_SOCKET,
 * the path ringlmd uses by default too).
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "formats/trace.h"
#include "libclient/ringlm.h"
#include "libclient/tokenizer.h"

#ifndef RINGLM_VERSION
#define RINGLM_VERSION "unknown"
#endif

static const char *g_socket; /* NULL: library default rule */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ringlm: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* Allocation for a command-line tool: out of memory ends the command with a message
 * instead of a NULL dereference later. */
static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p) die("out of memory");
    return p;
}
static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) die("out of memory");
    return p;
}
static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d) die("out of memory");
    return d;
}

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static long parse_long(const char *opt, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        die("%s: '%s' is not an integer in [%ld, %ld]", opt, s, lo, hi);
    return v;
}

static double parse_double(const char *opt, const char *s, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        die("%s: '%s' is not a number in [%g, %g]", opt, s, lo, hi);
    return v;
}

static ringlm_client *connect_or_die(void)
{
    ringlm_client *c;
    int rc = ringlm_connect(g_socket, &c);
    if (rc < 0) {
        const char *path = g_socket ? g_socket : getenv(RINGLM_SOCKET_ENV);
        if (!path || !*path) path = RINGLM_DEFAULT_SOCKET;
        die("cannot connect to ringlmd at %s: %s%s%s", path, ringlm_strerror(rc),
            *ringlm_errdetail() ? " — " : "", ringlm_errdetail());
    }
    return c;
}

/* ======================================================================================= */
/* generate                                                                                */
/* ======================================================================================= */

static void usage_generate(FILE *f)
{
    fprintf(f,
            "usage: ringlm [--socket PATH] generate --prompt TEXT --tokenizer FILE [options]\n"
            "  --max-tokens N     new tokens to generate (default 256)\n"
            "  --steps N          instead of --max-tokens: total positions including the prompt,\n"
            "                     as llama2.c run.c's -n (max-tokens = N - prompt tokens + 1)\n"
            "  --temperature F    0 = greedy (default 0)\n"
            "  --top-k K          0 = off;  --top-p P  1 = off;  --seed S\n"
            "  --class C          request class (default: the daemon's \"default\")\n"
            "  --tenant TAG       tenant tag (honoured only for uids the daemon trusts)\n"
            "  --deadline-ms N    give up after N ms (the daemon times the request out)\n"
            "  --stats            print the request's timing to stderr at the end\n"
            "  --prompt-ids LIST  instead of --prompt/--tokenizer: comma-separated token ids;\n"
            "                     the output is then token ids, one line per token\n"
            "Prints the prompt, then the generated text as it streams, then a newline.\n");
}

static int cmd_generate(int argc, char **argv)
{
    const char *prompt = NULL, *tok_path = NULL, *cls = NULL, *tenant = NULL, *prompt_ids = NULL;
    long max_tokens = -1, steps = -1, top_k = 0, deadline_ms = 0;
    double temperature = 0.0, top_p = 1.0;
    unsigned long long seed = 0;
    bool stats = false;
    static const struct option opts[] = {
        {"prompt", required_argument, 0, 'p'},      {"tokenizer", required_argument, 0, 'z'},
        {"max-tokens", required_argument, 0, 'n'},  {"steps", required_argument, 0, 'S'},
        {"temperature", required_argument, 0, 't'}, {"top-k", required_argument, 0, 'k'},
        {"top-p", required_argument, 0, 'P'},       {"seed", required_argument, 0, 's'},
        {"class", required_argument, 0, 'c'},       {"tenant", required_argument, 0, 'T'},
        {"deadline-ms", required_argument, 0, 'd'}, {"socket", required_argument, 0, 'X'},
        {"stats", no_argument, 0, 'A'},             {"help", no_argument, 0, 'h'},
        {"prompt-ids", required_argument, 0, 'I'},  {0, 0, 0, 0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "p:z:n:t:k:s:c:h", opts, NULL)) != -1) {
        switch (o) {
        case 'p': prompt = optarg; break;
        case 'z': tok_path = optarg; break;
        case 'n': max_tokens = parse_long("--max-tokens", optarg, 1, 1 << 24); break;
        case 'S': steps = parse_long("--steps", optarg, 1, 1 << 24); break;
        case 't': temperature = parse_double("--temperature", optarg, 0, 100); break;
        case 'k': top_k = parse_long("--top-k", optarg, 0, 1 << 30); break;
        case 'P': top_p = parse_double("--top-p", optarg, 1e-9, 1); break;
        case 's': seed = (unsigned long long)parse_long("--seed", optarg, 0, LONG_MAX); break;
        case 'c': cls = optarg; break;
        case 'T': tenant = optarg; break;
        case 'd': deadline_ms = parse_long("--deadline-ms", optarg, 0, 1L << 40); break;
        case 'X': g_socket = optarg; break;
        case 'A': stats = true; break;
        case 'I': prompt_ids = optarg; break;
        case 'h': usage_generate(stdout); return 0;
        default: usage_generate(stderr); return 2;
        }
    }
    if (optind < argc) die("generate: unexpected argument '%s'", argv[optind]);
    if (!prompt) prompt = "";
    tok_tokenizer *tok = NULL;
    int32_t *ids;
    int n, rc;
    if (prompt_ids) {
        /* Raw ids: for models without a tokenizer (synthetic weights). */
        size_t cap = 1;
        for (const char *p = prompt_ids; *p; p++) cap += *p == ',';
        ids = malloc(cap * sizeof *ids);
        if (!ids) die("out of memory");
        n = 0;
        char *dup = xstrdup(prompt_ids), *save = NULL;
        for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save))
            ids[n++] = (int32_t)parse_long("--prompt-ids", t, 0, INT32_MAX);
        free(dup);
        if (n == 0) die("--prompt-ids: no ids");
    } else {
        if (!tok_path) {
            usage_generate(stderr);
            die("generate: --tokenizer FILE is required (e.g. ../shared/models/tok512.bin)");
        }
        rc = tok_load(tok_path, 0, &tok);
        if (rc < 0) die("tokenizer %s: %s (%s)", tok_path, strerror(-rc), tok_errmsg());
        size_t cap = tok_encode_bound(prompt);
        ids = malloc(cap * sizeof *ids);
        if (!ids) die("out of memory");
        n = tok_encode(tok, prompt, true, false, ids, (int)cap);
        if (n < 0) die("encoding the prompt: %s", tok_errmsg());
    }
    if (steps > 0) {
        /* run.c: positions 0..steps-1, the prompt forced for the first n-1 of them. */
        if (steps < n) die("--steps %ld is shorter than the prompt (%d tokens)", steps, n);
        max_tokens = steps - n + 1;
    }
    if (max_tokens < 0) max_tokens = 256;

    ringlm_client *c = connect_or_die();
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = ids;
    r.n_prompt = (uint32_t)n;
    r.max_new_tokens = (uint32_t)max_tokens;
    r.temperature = (float)temperature;
    r.top_k = (uint32_t)top_k;
    r.top_p = (float)top_p;
    r.seed = seed;
    r.deadline_us = (uint64_t)deadline_ms * 1000u;
    if (cls) r.class_name = cls;
    r.tenant_tag = tenant;
    uint64_t id;
    uint64_t t0 = mono_us(), t_first = 0;
    rc = ringlm_submit(c, &r, &id);
    if (rc < 0) die("submit: %s%s%s", ringlm_strerror(rc), *ringlm_errdetail() ? " — " : "", ringlm_errdetail());

    /* The prompt as run.c prints it: each forced token decoded after its predecessor. */
    if (tok)
        for (int i = 1; i < n; i++) fputs(tok_decode(tok, ids[i - 1], ids[i]), stdout);
    fflush(stdout);
    int32_t prev = ids[n - 1];
    uint32_t got = 0;
    bool stopped_on_bos = false;
    int exit_code = 0;
    for (;;) {
        ringlm_event ev;
        rc = ringlm_next_event(c, &ev, -1);
        if (rc == -EINTR) continue;
        if (rc < 0) {
            fputc('\n', stdout);
            fflush(stdout);
            die("the daemon went away mid-request: %s%s%s", ringlm_strerror(rc),
                *ringlm_errdetail() ? " — " : "", ringlm_errdetail());
        }
        if (ev.req_id != id) continue;
        if (ev.kind == RINGLM_EV_TOKEN) {
            if (stopped_on_bos) continue;
            if (!got++) t_first = mono_us();
            /* run.c stops when it samples BOS and prints nothing for it. */
            if (ev.token == TOK_BOS && tok) {
                stopped_on_bos = true;
                ringlm_cancel(c, id);
                continue;
            }
            if (!tok) {
                printf("%d\n", ev.token);
                fflush(stdout);
                continue;
            }
            const char *piece = tok_decode(tok, prev, ev.token);
            if (!piece) {
                fputc('\n', stdout);
                die("the daemon sent token id %d, outside the tokenizer's %d pieces", ev.token,
                    tok_vocab_size(tok));
            }
            fputs(piece, stdout);
            fflush(stdout);
            prev = ev.token;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            if (tok) fputc('\n', stdout);
            fflush(stdout);
            int fr = ev.finish_reason;
            if (fr == RINGLM_FINISH_REJECTED || fr == RINGLM_FINISH_ERROR ||
                fr == RINGLM_FINISH_TIMEOUT || (fr == RINGLM_FINISH_CANCELLED && !stopped_on_bos)) {
                fprintf(stderr, "ringlm: request %s%s%s after %u tokens\n", ringlm_reason_name(fr),
                        ev.reject_reason ? ": " : "", ev.reject_reason ? ringlm_reason_name(ev.reject_reason) : "",
                        ev.n_tokens);
                exit_code = 1;
            }
            if (stats) {
                uint64_t t_end = mono_us();
                fprintf(stderr,
                        "ringlm: %u prompt tokens, %u generated, ttft %.2f ms, %.2f ms/token, "
                        "total %.2f ms, finish %s, policy %016llx\n",
                        (unsigned)n, got, t_first ? (double)(t_first - t0) / 1e3 : 0.0,
                        got > 1 ? (double)(t_end - t_first) / 1e3 / (got - 1) : 0.0,
                        (double)(t_end - t0) / 1e3,
                        stopped_on_bos ? "stop" : ringlm_reason_name(fr),
                        (unsigned long long)ev.policy_hash);
            }
            break;
        }
    }
    ringlm_close(c);
    free(ids);
    if (tok) tok_free(tok);
    return exit_code;
}

/* ======================================================================================= */
/* replay: traces                                                                          */
/* ======================================================================================= */

typedef struct treq {
    int64_t arrival_us;     /* replay time (after window shift and rate scaling) */
    uint32_t prompt_tokens; /* after length scaling */
    uint32_t max_tokens;
    int64_t cancel_after_us; /* relative to submit; -1 none */
    int64_t deadline_us;     /* relative to submit; 0 none */
    int tenant;              /* index into tenant names; -1 = no tag */
    int cls;                 /* index into class names; -1 = default */
} treq;

typedef struct names {
    char **v;
    int n;
} names;

static int name_index(names *ns, const char *s)
{
    for (int i = 0; i < ns->n; i++)
        if (strcmp(ns->v[i], s) == 0) return i;
    ns->v = xrealloc(ns->v, sizeof(char *) * (size_t)(ns->n + 1));
    ns->v[ns->n] = xstrdup(s);
    return ns->n++;
}

static void free_names(names *ns)
{
    for (int i = 0; i < ns->n; i++) free(ns->v[i]);
    free(ns->v);
    ns->v = NULL;
    ns->n = 0;
}

typedef struct trace {
    treq *r;
    size_t n, cap;
    names tenants, classes;
} trace;

static void trace_push(trace *t, const treq *r)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 1024;
        t->r = realloc(t->r, t->cap * sizeof *t->r);
        if (!t->r) die("out of memory");
    }
    t->r[t->n++] = *r;
}

typedef struct load_opts {
    int fmt;              /* enum fmt_trace_format */
    double rate;          /* arrival-rate multiplier */
    double length_scale;  /* multiplier on prompt and output lengths */
    double window_start_s, window_len_s; /* trace-time window; len <= 0: to the end */
    long limit;           /* max requests (0 = all) */
    long max_context;     /* clip prompt + output to this (0 = no clipping) */
    names *force_tenants; /* round-robin tenants (overrides the trace's) */
    const char *force_class;
} load_opts;

static uint32_t scale_len(int64_t v, double s)
{
    double x = floor((double)v * s + 0.5);
    if (x < 1) x = 1;
    if (x > 1e9) x = 1e9;
    return (uint32_t)x;
}

static void load_trace(const char *path, const load_opts *lo, trace *t)
{
    char why[256];
    char *buf;
    size_t len;
    if (fmt_read_file(path, SIZE_MAX, &buf, &len, why, sizeof why) < 0) die("trace %s", why);
    fmt_trace_reader rd;
    if (fmt_trace_open(&rd, buf, len, lo->fmt, why, sizeof why) < 0) die("trace %s: %s", path, why);
    /* raw records first (trace time), then window/scale below */
    typedef struct raw { int64_t t_us, cancel_us, deadline_us; int64_t prompt, out; int tenant, cls; } raw;
    raw *rs = NULL;
    size_t nr = 0, rcap = 0;
    fmt_request q;
    fmt_request_text text;
    int rc;
    while ((rc = fmt_trace_next(&rd, &q, &text, why, sizeof why)) != 0) {
        if (rc < 0) die("%s:%u: %s", path, rd.line, why);
        raw r = {.t_us = q.arrival_us, .prompt = q.prompt_tokens, .out = q.output_tokens,
                 .cancel_us = -1, .deadline_us = -1, .tenant = -1, .cls = -1};
        if (q.cancel_us != FMT_NULL) r.cancel_us = q.cancel_us - q.arrival_us;
        if (q.deadline_us != FMT_NULL) r.deadline_us = q.deadline_us - q.arrival_us;
        if (q.tenant && *q.tenant) r.tenant = name_index(&t->tenants, q.tenant);
        if (q.class_name && *q.class_name) r.cls = name_index(&t->classes, q.class_name);
        if (r.out < 1) r.out = 1; /* the daemon needs max_new_tokens >= 1 */
        if (nr == rcap) {
            rcap = rcap ? rcap * 2 : 4096;
            rs = realloc(rs, rcap * sizeof *rs);
            if (!rs) die("out of memory");
        }
        rs[nr++] = r;
    }
    free(buf);
    if (nr == 0) die("trace %s has no requests", path);
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
    int cls_forced = lo->force_class ? name_index(&t->classes, lo->force_class) : -1;
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
            if ((long)q.prompt_tokens + (long)q.max_tokens > lo->max_context) q.prompt_tokens = (uint32_t)(lo->max_context - q.max_tokens);
        }
        q.cancel_after_us = rs[i].cancel_us >= 0 ? (int64_t)((double)rs[i].cancel_us / lo->rate) : -1;
        q.deadline_us = rs[i].deadline_us > 0 ? rs[i].deadline_us : 0;
        q.tenant = rs[i].tenant;
        q.cls = cls_forced >= 0 ? cls_forced : rs[i].cls;
        if (lo->force_tenants && lo->force_tenants->n)
            q.tenant = name_index(&t->tenants, lo->force_tenants->v[k % (size_t)lo->force_tenants->n]);
        k++;
        trace_push(t, &q);
    }
    free(rs);
    if (t->n == 0) die("trace %s: no request falls in the window", path);
}

/* ======================================================================================= */
/* replay: client processes                                                                */
/* ======================================================================================= */

/* One result, child → parent through a pipe (well under PIPE_BUF: written atomically). */
typedef struct rrec {
    uint32_t idx;            /* trace index; UINT32_MAX = the child could not connect */
    int32_t status;          /* 0, or the -errno of submit / the session */
    int64_t submit_us, first_us, finish_us; /* since the common start; -1 = never */
    uint32_t n_tokens;
    int32_t finish_reason, reject_reason;
} rrec;

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

typedef struct replay_opts {
    int clients;
    int vocab;              /* synthetic prompt ids are drawn from [3, vocab) */
    double drain_timeout_s; /* after the last arrival */
    float temperature;
    uint64_t seed;
} replay_opts;

static void put_rec(int fd, const rrec *r)
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

static void child_main(int k, const trace *t, const replay_opts *ro, uint64_t t0, int fd)
{
    ringlm_client *c;
    int rc = ringlm_connect(g_socket, &c);
    if (rc < 0) {
        rrec e = {.idx = UINT32_MAX, .status = rc};
        put_rec(fd, &e);
        fprintf(stderr, "ringlm replay: client %d: connect: %s %s\n", k, ringlm_strerror(rc), ringlm_errdetail());
        _exit(2);
    }
    uint32_t max_prompt = 1;
    for (size_t i = (size_t)k; i < t->n; i += (size_t)ro->clients)
        if (t->r[i].prompt_tokens > max_prompt) max_prompt = t->r[i].prompt_tokens;
    int32_t *ids = xrealloc(NULL, sizeof(int32_t) * max_prompt);
    size_t fl_cap = 64, fl_n = 0;
    inflight *fl = xrealloc(NULL, fl_cap * sizeof *fl);
    size_t next = (size_t)k;
    int64_t last_arrival = t->n ? t->r[t->n - 1].arrival_us : 0;
    int64_t give_up_us = last_arrival + (int64_t)(ro->drain_timeout_s * 1e6);
    int session_err = 0;
    for (;;) {
        int64_t now = (int64_t)(mono_us() - t0);
        /* submit what is due (open loop: completions do not pace arrivals) */
        while (!session_err && next < t->n && t->r[next].arrival_us <= now) {
            const treq *q = &t->r[next];
            uint64_t s = ro->seed ^ ((uint64_t)next * 0x100000001b3ull);
            ids[0] = TOK_BOS;
            int span = ro->vocab > 4 ? ro->vocab - 3 : 1;
            for (uint32_t j = 1; j < q->prompt_tokens; j++) ids[j] = 3 + (int32_t)(splitmix(&s) % (uint64_t)span);
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
            int64_t sub = (int64_t)(mono_us() - t0);
            rc = ringlm_submit(c, &r, &id);
            if (rc == -EAGAIN) break; /* ring full: read events, come back */
            if (rc < 0) {
                rrec e = {.idx = (uint32_t)next, .status = rc, .submit_us = sub, .first_us = -1,
                          .finish_us = sub};
                put_rec(fd, &e);
                if (rc == -EPIPE || rc == -ECONNRESET) session_err = rc;
            } else {
                if (fl_n == fl_cap) fl = xrealloc(fl, (fl_cap *= 2) * sizeof *fl);
                fl[fl_n++] = (inflight){.id = id, .idx = (uint32_t)next, .submit_us = sub, .first_us = -1,
                                        .cancel_at_us = q->cancel_after_us >= 0 ? sub + q->cancel_after_us : -1};
            }
            next += (size_t)ro->clients;
        }
        if (session_err) break;
        if (next >= t->n && fl_n == 0) break;
        now = (int64_t)(mono_us() - t0);
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
        int64_t tev = (int64_t)(mono_us() - t0);
        size_t i;
        for (i = 0; i < fl_n && fl[i].id != ev.req_id; i++) {}
        if (i == fl_n) continue;
        if (ev.kind == RINGLM_EV_TOKEN) {
            if (fl[i].first_us < 0) fl[i].first_us = tev;
            fl[i].n_tokens++;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            rrec e = {.idx = fl[i].idx, .submit_us = fl[i].submit_us, .first_us = fl[i].first_us,
                      .finish_us = tev, .n_tokens = ev.n_tokens ? ev.n_tokens : fl[i].n_tokens,
                      .finish_reason = ev.finish_reason, .reject_reason = ev.reject_reason};
            put_rec(fd, &e);
            fl[i] = fl[--fl_n];
        }
    }
    /* whatever is left never finished: the session died or the drain timed out */
    for (size_t i = 0; i < fl_n; i++) {
        rrec e = {.idx = fl[i].idx, .status = session_err ? session_err : -ETIMEDOUT,
                  .submit_us = fl[i].submit_us, .first_us = fl[i].first_us,
                  .finish_us = (int64_t)(mono_us() - t0), .n_tokens = fl[i].n_tokens};
        put_rec(fd, &e);
    }
    for (; next < t->n; next += (size_t)ro->clients) {
        rrec e = {.idx = (uint32_t)next, .status = session_err ? session_err : -ETIMEDOUT, .first_us = -1};
        put_rec(fd, &e);
    }
    ringlm_close(c);
    free(ids);
    free(fl);
    close(fd);
    _exit(session_err ? 1 : 0);
}

/* ======================================================================================= */
/* replay: queue wait from the daemon's /metrics                                           */
/* ======================================================================================= */

#define QW_MAX_LE 64
typedef struct qw_hist {
    char tenant[64];
    int n;
    double le[QW_MAX_LE];
    double cum[QW_MAX_LE];
} qw_hist;

typedef struct qw_set {
    qw_hist *h;
    int n;
} qw_set;

static char *http_get_metrics(const char *spec, char *err, size_t errlen)
{
    char host[128] = "127.0.0.1", port[16];
    const char *colon = strrchr(spec, ':');
    if (!colon) snprintf(port, sizeof port, "%s", spec);
    else {
        if (colon != spec) snprintf(host, sizeof host, "%.*s", (int)(colon - spec), spec);
        snprintf(port, sizeof port, "%s", colon + 1);
    }
    if (host[0] == '[') { /* [v6] */
        memmove(host, host + 1, strlen(host));
        char *rb = strchr(host, ']');
        if (rb) *rb = 0;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, port, &hints, &ai) != 0) {
        snprintf(err, errlen, "metrics address '%s' does not resolve", spec);
        return NULL;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        snprintf(err, errlen, "metrics at %s: %s", spec, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return NULL;
    }
    freeaddrinfo(ai);
    char req[256];
    int n = snprintf(req, sizeof req, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", host);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        snprintf(err, errlen, "metrics at %s: write failed", spec);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = xrealloc(NULL, cap);
    for (;;) {
        if (len + 4096 >= cap) buf = xrealloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = 0;
    char *body = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.", 7) != 0 || !body || atoi(buf + 9) != 200) {
        snprintf(err, errlen, "metrics at %s: not an HTTP 200 answer", spec);
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

/* Unescapes a label value starting after the opening quote; returns the char after the
 * closing quote. */
static const char *label_value(const char *p, char *out, size_t cap)
{
    size_t n = 0;
    while (*p && *p != '"') {
        char c = *p++;
        if (c == '\\' && *p) {
            c = *p++;
            if (c == 'n') c = '\n';
        }
        if (n + 1 < cap) out[n++] = c;
    }
    out[n] = 0;
    return *p == '"' ? p + 1 : p;
}

/* Sums ringlm_queue_wait_seconds buckets over classes, per tenant. */
static void parse_qw(const char *text, qw_set *s)
{
    static const char pfx[] = "ringlm_queue_wait_seconds_bucket{";
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, pfx, sizeof pfx - 1) != 0) continue;
        const char *q = p + sizeof pfx - 1;
        char tenant[64] = "", le[64] = "", key[32], val[64];
        while (*q && *q != '}') {
            size_t k = strcspn(q, "=");
            snprintf(key, sizeof key, "%.*s", (int)k, q);
            q += k;
            if (strncmp(q, "=\"", 2) != 0) break;
            q = label_value(q + 2, val, sizeof val);
            if (!strcmp(key, "tenant")) snprintf(tenant, sizeof tenant, "%s", val);
            else if (!strcmp(key, "le")) snprintf(le, sizeof le, "%s", val);
            if (*q == ',') q++;
        }
        if (*q != '}') continue;
        double v = strtod(q + 1, NULL);
        double lev = strcmp(le, "+Inf") == 0 ? INFINITY : strtod(le, NULL);
        qw_hist *h = NULL;
        for (int i = 0; i < s->n; i++)
            if (!strcmp(s->h[i].tenant, tenant)) h = &s->h[i];
        if (!h) {
            s->h = xrealloc(s->h, sizeof *s->h * (size_t)(s->n + 1));
            h = &s->h[s->n++];
            memset(h, 0, sizeof *h);
            snprintf(h->tenant, sizeof h->tenant, "%s", tenant);
        }
        int j;
        for (j = 0; j < h->n && h->le[j] != lev; j++) {}
        if (j == h->n) {
            if (h->n == QW_MAX_LE) continue;
            h->le[h->n] = lev;
            h->cum[h->n++] = 0;
        }
        h->cum[j] += v;
    }
}

/* Percentile (0..1) from cumulative buckets (after - before), linear inside a bucket, in
 * ms; NAN when empty. */
static double qw_percentile(const qw_hist *a, const qw_hist *b, double q)
{
    double le[QW_MAX_LE] = {0}, cum[QW_MAX_LE] = {0};
    int n = a->n;
    for (int i = 0; i < n; i++) {
        le[i] = a->le[i];
        cum[i] = a->cum[i];
        if (b)
            for (int j = 0; j < b->n; j++)
                if (b->le[j] == le[i]) cum[i] -= b->cum[j];
    }
    /* sort by le (they come sorted, but do not rely on it) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && le[j - 1] > le[j]; j--) {
            double t = le[j]; le[j] = le[j - 1]; le[j - 1] = t;
            t = cum[j]; cum[j] = cum[j - 1]; cum[j - 1] = t;
        }
    if (n == 0 || cum[n - 1] <= 0) return NAN;
    double target = q * cum[n - 1];
    double prev_le = 0, prev_cum = 0;
    for (int i = 0; i < n; i++) {
        if (cum[i] >= target) {
            if (isinf(le[i])) return prev_le * 1e3; /* beyond the last finite bound */
            double in = cum[i] - prev_cum;
            double f = in > 0 ? (target - prev_cum) / in : 1;
            return (prev_le + f * (le[i] - prev_le)) * 1e3;
        }
        prev_le = le[i];
        prev_cum = cum[i];
    }
    return prev_le * 1e3;
}

/* ======================================================================================= */
/* replay: report                                                                          */
/* ======================================================================================= */

typedef struct dstat {
    double *v;
    size_t n, cap;
} dstat;

static void dpush(dstat *d, double x)
{
    if (d->n == d->cap) d->v = xrealloc(d->v, (d->cap = d->cap ? d->cap * 2 : 256) * sizeof(double));
    d->v[d->n++] = x;
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Linear interpolation between closest ranks (numpy's default). */
static double pct(dstat *d, double q)
{
    if (d->n == 0) return NAN;
    qsort(d->v, d->n, sizeof(double), dcmp);
    double pos = q * (double)(d->n - 1);
    size_t i = (size_t)pos;
    if (i + 1 >= d->n) return d->v[d->n - 1];
    return d->v[i] + (pos - (double)i) * (d->v[i + 1] - d->v[i]);
}

#define N_REASON 64
typedef struct tstat {
    const char *name;
    long requests, completed, rejected, cancelled, timeouts, errors, lost;
    long rejects_by[N_REASON];
    uint64_t tokens, prompt_tokens;
    dstat ttft, tpot, e2e;
    double qw[3]; /* p50 p90 p99 ms, NAN = unknown */
} tstat;

static json_t *jnum(double v) { return isnan(v) ? json_null() : json_real(round(v * 1000) / 1000); }

static json_t *jpcts(dstat *d)
{
    json_t *o = json_object();
    json_object_set_new(o, "p50", jnum(pct(d, 0.50)));
    json_object_set_new(o, "p90", jnum(pct(d, 0.90)));
    json_object_set_new(o, "p99", jnum(pct(d, 0.99)));
    json_object_set_new(o, "max", jnum(pct(d, 1.0)));
    json_object_set_new(o, "n", json_integer((json_int_t)d->n));
    return o;
}

static void fmt_ms(char *buf, size_t cap, double v)
{
    if (isnan(v)) snprintf(buf, cap, "-");
    else if (v < 10) snprintf(buf, cap, "%.2f", v);
    else if (v < 1000) snprintf(buf, cap, "%.1f", v);
    else snprintf(buf, cap, "%.0f", v);
}

static void print_row(tstat *s)
{
    char a[5][16];
    printf("%-12s %6ld %6ld %5ld %5ld %4ld %4ld %8llu", s->name, s->requests, s->completed,
           s->rejected, s->cancelled, s->timeouts, s->errors + s->lost, (unsigned long long)s->tokens);
    double v[][3] = {{pct(&s->ttft, .5), pct(&s->ttft, .9), pct(&s->ttft, .99)},
                     {pct(&s->tpot, .5), pct(&s->tpot, .9), pct(&s->tpot, .99)},
                     {pct(&s->e2e, .5), pct(&s->e2e, .9), pct(&s->e2e, .99)},
                     {s->qw[0], s->qw[1], s->qw[2]}};
    for (int m = 0; m < 4; m++) {
        fmt_ms(a[0], 16, v[m][0]);
        fmt_ms(a[1], 16, v[m][1]);
        fmt_ms(a[2], 16, v[m][2]);
        char cell[64];
        snprintf(cell, sizeof cell, "%s/%s/%s", a[0], a[1], a[2]);
        printf(" %20s", cell);
    }
    putchar('\n');
}

static void progress(size_t done, size_t total, uint64_t t_start)
{
    int width = 40;
    int fill = total ? (int)((double)done / (double)total * width) : width;
    int64_t el_us = (int64_t)(mono_us() - t_start); /* the start lies 20 ms ahead at first */
    double el = el_us > 0 ? (double)el_us / 1e6 : 0.0;
    printf("\r[");
    for (int i = 0; i < width; i++) putchar(i < fill ? '#' : '.');
    printf("] %zu/%zu  %.1fs ", done, total, el);
    fflush(stdout);
}

static void usage_replay(FILE *f)
{
    fprintf(f,
            "usage: ringlm [--socket PATH] replay TRACE [options]\n"
            "TRACE is ringlm's native JSONL (ringlmd --request-log), an Azure LLM inference CSV\n"
            "(TIMESTAMP,ContextTokens,GeneratedTokens) or Mooncake JSONL (timestamp ms,\n"
            "input_length, output_length); the format is detected, or given with --format.\n"
            "  --clients N         client processes (default 4); request i goes to client i %% N\n"
            "  --rate X            arrival-rate multiplier (2 = twice as fast; default 1)\n"
            "  --length-scale X    multiply prompt and output lengths (default 1)\n"
            "  --max-context N     clip prompt+output to N tokens keeping their ratio (e.g. 512)\n"
            "  --window START:DUR  only the requests in [START, START+DUR) s of trace time\n"
            "                      (DUR alone = from the start)\n"
            "  --limit N           at most N requests\n"
            "  --tenants A,B,...   tag requests with these tenants round-robin (the daemon must\n"
            "                      trust this uid); native traces carry their own tenants\n"
            "  --class C           request class for every request\n"
            "  --vocab V           synthetic prompt ids are drawn from [3, V) (default 259)\n"
            "  --temperature F     sampling temperature (default 0)\n"
            "  --seed S            seed of the synthetic prompts (default 1)\n"
            "  --drain-timeout S   wait at most S s after the last arrival (default 120)\n"
            "  --metrics ADDR:PORT the daemon's /metrics: queue-wait percentiles per tenant\n"
            "  --json              print one JSON object instead of the table\n"
            "  --format native|azure|mooncake\n");
}

static void split_names(const char *s, names *ns)
{
    char *dup = xstrdup(s), *save = NULL;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (*tok) {
            ns->v = xrealloc(ns->v, sizeof(char *) * (size_t)(ns->n + 1));
            ns->v[ns->n++] = xstrdup(tok); /* duplicates kept: "a,a,b" weights a twice */
        }
    free(dup);
}

static int cmd_replay(int argc, char **argv)
{
    load_opts lo = {.fmt = FMT_TRACE_AUTO, .rate = 1, .length_scale = 1};
    replay_opts ro = {.clients = 4, .vocab = 259, .drain_timeout_s = 120, .seed = 1};
    names force = {0};
    const char *metrics_addr = NULL;
    bool as_json = false;
    static const struct option opts[] = {
        {"clients", required_argument, 0, 'c'},      {"rate", required_argument, 0, 'r'},
        {"length-scale", required_argument, 0, 'L'}, {"max-context", required_argument, 0, 'C'},
        {"window", required_argument, 0, 'w'},       {"limit", required_argument, 0, 'n'},
        {"tenants", required_argument, 0, 'T'},      {"class", required_argument, 0, 'K'},
        {"vocab", required_argument, 0, 'V'},        {"temperature", required_argument, 0, 't'},
        {"seed", required_argument, 0, 's'},         {"drain-timeout", required_argument, 0, 'D'},
        {"metrics", required_argument, 0, 'M'},      {"json", no_argument, 0, 'j'},
        {"format", required_argument, 0, 'f'},       {"socket", required_argument, 0, 'X'},
        {"help", no_argument, 0, 'h'},               {0, 0, 0, 0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "c:r:n:jh", opts, NULL)) != -1) {
        switch (o) {
        case 'c': ro.clients = (int)parse_long("--clients", optarg, 1, 256); break;
        case 'r': lo.rate = parse_double("--rate", optarg, 1e-6, 1e6); break;
        case 'L': lo.length_scale = parse_double("--length-scale", optarg, 1e-6, 1e6); break;
        case 'C': lo.max_context = parse_long("--max-context", optarg, 2, 1L << 30); break;
        case 'w': {
            const char *colon = strchr(optarg, ':');
            if (colon) {
                char tmp[64];
                snprintf(tmp, sizeof tmp, "%.*s", (int)(colon - optarg), optarg);
                lo.window_start_s = parse_double("--window START", tmp, 0, 1e9);
                lo.window_len_s = parse_double("--window DUR", colon + 1, 1e-6, 1e9);
            } else {
                lo.window_len_s = parse_double("--window", optarg, 1e-6, 1e9);
            }
            break;
        }
        case 'n': lo.limit = parse_long("--limit", optarg, 1, 1L << 40); break;
        case 'T': split_names(optarg, &force); break;
        case 'K': lo.force_class = optarg; break;
        case 'V': ro.vocab = (int)parse_long("--vocab", optarg, 4, 1 << 30); break;
        case 't': ro.temperature = (float)parse_double("--temperature", optarg, 0, 100); break;
        case 's': ro.seed = (uint64_t)parse_long("--seed", optarg, 0, LONG_MAX); break;
        case 'D': ro.drain_timeout_s = parse_double("--drain-timeout", optarg, 0, 1e7); break;
        case 'M': metrics_addr = optarg; break;
        case 'j': as_json = true; break;
        case 'f':
            if (!strcmp(optarg, "native")) lo.fmt = FMT_TRACE_NATIVE;
            else if (!strcmp(optarg, "azure")) lo.fmt = FMT_TRACE_AZURE;
            else if (!strcmp(optarg, "mooncake")) lo.fmt = FMT_TRACE_MOONCAKE;
            else die("--format: '%s' is not native, azure or mooncake", optarg);
            break;
        case 'X': g_socket = optarg; break;
        case 'h': usage_replay(stdout); return 0;
        default: usage_replay(stderr); return 2;
        }
    }
    if (optind != argc - 1) {
        usage_replay(stderr);
        return 2;
    }
    lo.force_tenants = &force;
    trace t = {0};
    load_trace(argv[optind], &lo, &t);
    if ((size_t)ro.clients > t.n) ro.clients = (int)t.n;

    char err[256];
    qw_set qw_before = {0}, qw_after = {0};
    if (metrics_addr) {
        char *m = http_get_metrics(metrics_addr, err, sizeof err);
        if (!m) die("%s", err);
        parse_qw(m, &qw_before);
        free(m);
    }

    /* One probe connection first: a missing daemon is one clear message, not N. */
    ringlm_close(connect_or_die());
    bool tty = !as_json && isatty(STDOUT_FILENO);
    signal(SIGPIPE, SIG_IGN);
    /* Children start together: each sleeps until its first arrival from this origin. */
    uint64_t t0 = mono_us() + 20000;
    pid_t *pids = xcalloc((unsigned)ro.clients, sizeof *pids);
    int *fds = xcalloc((unsigned)ro.clients, sizeof *fds);
    fflush(NULL);
    for (int k = 0; k < ro.clients; k++) {
        int p[2];
        if (pipe(p) < 0) die("pipe: %s", strerror(errno));
        pid_t pid = fork();
        if (pid < 0) die("fork: %s", strerror(errno));
        if (pid == 0) {
            close(p[0]);
            for (int j = 0; j < k; j++) close(fds[j]);
            child_main(k, &t, &ro, t0, p[1]);
        }
        close(p[1]);
        pids[k] = pid;
        fds[k] = p[0];
    }
    rrec *res = xcalloc(t.n, sizeof *res);
    bool *have = xcalloc(t.n, sizeof *have);
    size_t done = 0;
    int open_fds = ro.clients, connect_failures = 0, first_connect_err = 0;
    struct pollfd *pfd = xcalloc((unsigned)ro.clients, sizeof *pfd);
    uint64_t last_bar = 0;
    while (open_fds > 0) {
        int np = 0;
        for (int k = 0; k < ro.clients; k++)
            if (fds[k] >= 0) pfd[np++] = (struct pollfd){.fd = fds[k], .events = POLLIN};
        if (poll(pfd, (nfds_t)np, 200) < 0 && errno != EINTR) die("poll: %s", strerror(errno));
        for (int i = 0; i < np; i++) {
            if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            rrec r;
            ssize_t n = read(pfd[i].fd, &r, sizeof r);
            if (n == (ssize_t)sizeof r) {
                if (r.idx == UINT32_MAX) {
                    connect_failures++;
                    if (!first_connect_err) first_connect_err = r.status;
                } else if (r.idx < t.n && !have[r.idx]) {
                    res[r.idx] = r;
                    have[r.idx] = true;
                    done++;
                }
                continue;
            }
            if (n < 0 && errno == EINTR) continue;
            /* EOF (or a torn record from a dying child): this client is done */
            for (int k = 0; k < ro.clients; k++)
                if (fds[k] == pfd[i].fd) {
                    close(fds[k]);
                    fds[k] = -1;
                }
            open_fds--;
        }
        if (tty && mono_us() - last_bar > 100000) {
            progress(done, t.n, t0);
            last_bar = mono_us();
        }
    }
    int child_fail = 0;
    for (int k = 0; k < ro.clients; k++) {
        int st;
        if (waitpid(pids[k], &st, 0) > 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) child_fail++;
    }
    uint64_t t_end = mono_us();
    if (tty) {
        progress(done, t.n, t0);
        printf("\n");
    }
    if (connect_failures == ro.clients)
        die("no client could connect to ringlmd: %s", ringlm_strerror(first_connect_err));

    if (metrics_addr) {
        char *m = http_get_metrics(metrics_addr, err, sizeof err);
        if (m) {
            parse_qw(m, &qw_after);
            free(m);
        } else {
            fprintf(stderr, "ringlm replay: %s (no queue-wait figures)\n", err);
        }
    }

    /* ---- aggregate per tenant ---- */
    int nt = t.tenants.n + 1; /* last: requests without a tag */
    tstat *ts = xcalloc((size_t)nt + 1, sizeof *ts); /* + "all" */
    for (int i = 0; i < t.tenants.n; i++) ts[i].name = t.tenants.v[i];
    ts[nt - 1].name = "(by uid)";
    ts[nt].name = "all";
    uint64_t first_sub = UINT64_MAX, last_fin = 0;
    for (size_t i = 0; i < t.n; i++) {
        int ti = t.r[i].tenant >= 0 ? t.r[i].tenant : nt - 1;
        for (int pass = 0; pass < 2; pass++) {
            tstat *s = pass ? &ts[nt] : &ts[ti];
            s->requests++;
            if (!have[i]) {
                s->lost++;
                continue;
            }
            const rrec *r = &res[i];
            if (pass == 0 && r->submit_us >= 0 && r->finish_us > 0) {
                if ((uint64_t)r->submit_us < first_sub) first_sub = (uint64_t)r->submit_us;
                if ((uint64_t)r->finish_us > last_fin) last_fin = (uint64_t)r->finish_us;
            }
            if (r->status == -ETIMEDOUT && r->finish_reason == 0) {
                s->lost++;
                continue;
            }
            if (r->status < 0) {
                s->errors++;
                continue;
            }
            s->tokens += r->n_tokens;
            switch (r->finish_reason) {
            case RINGLM_FINISH_LENGTH:
            case RINGLM_FINISH_STOP:
                s->completed++;
                s->prompt_tokens += t.r[i].prompt_tokens;
                if (r->first_us >= 0) dpush(&s->ttft, (double)(r->first_us - r->submit_us) / 1e3);
                if (r->n_tokens > 1 && r->first_us >= 0)
                    dpush(&s->tpot, (double)(r->finish_us - r->first_us) / 1e3 / (r->n_tokens - 1));
                dpush(&s->e2e, (double)(r->finish_us - r->submit_us) / 1e3);
                break;
            case RINGLM_FINISH_REJECTED:
                s->rejected++;
                s->rejects_by[r->reject_reason >= 0 && r->reject_reason < N_REASON ? r->reject_reason : 0]++;
                break;
            case RINGLM_FINISH_CANCELLED: s->cancelled++; break;
            case RINGLM_FINISH_TIMEOUT: s->timeouts++; break;
            default: s->errors++; break;
            }
        }
    }
    for (int i = 0; i <= nt; i++) {
        ts[i].qw[0] = ts[i].qw[1] = ts[i].qw[2] = NAN;
        if (!metrics_addr) continue;
        const char *want = i == nt - 1 ? NULL : ts[i].name;
        qw_hist sum = {0}, base = {0};
        /* "all" sums every tenant; the untagged row has no daemon-side name: skipped */
        for (int a = 0; a < qw_after.n; a++) {
            if (!(i == nt || (want && !strcmp(qw_after.h[a].tenant, want)))) continue;
            for (int j = 0; j < qw_after.h[a].n; j++) {
                int x;
                for (x = 0; x < sum.n && sum.le[x] != qw_after.h[a].le[j]; x++) {}
                if (x == sum.n && sum.n < QW_MAX_LE) { sum.le[x] = qw_after.h[a].le[j]; sum.cum[x] = 0; sum.n++; }
                if (x < QW_MAX_LE) sum.cum[x] += qw_after.h[a].cum[j];
            }
        }
        for (int a = 0; a < qw_before.n; a++) {
            if (!(i == nt || (want && !strcmp(qw_before.h[a].tenant, want)))) continue;
            for (int j = 0; j < qw_before.h[a].n; j++) {
                int x;
                for (x = 0; x < base.n && base.le[x] != qw_before.h[a].le[j]; x++) {}
                if (x == base.n && base.n < QW_MAX_LE) { base.le[x] = qw_before.h[a].le[j]; base.cum[x] = 0; base.n++; }
                if (x < QW_MAX_LE) base.cum[x] += qw_before.h[a].cum[j];
            }
        }
        ts[i].qw[0] = qw_percentile(&sum, &base, 0.50);
        ts[i].qw[1] = qw_percentile(&sum, &base, 0.90);
        ts[i].qw[2] = qw_percentile(&sum, &base, 0.99);
    }
    double dur_s = last_fin > first_sub ? (double)(last_fin - first_sub) / 1e6 : (double)(t_end - t0) / 1e6;

    if (as_json) {
        json_t *root = json_object();
        json_object_set_new(root, "trace", json_string(argv[optind]));
        json_object_set_new(root, "requests", json_integer((json_int_t)t.n));
        json_object_set_new(root, "clients", json_integer(ro.clients));
        json_object_set_new(root, "rate", json_real(lo.rate));
        json_object_set_new(root, "length_scale", json_real(lo.length_scale));
        json_object_set_new(root, "duration_s", jnum(dur_s));
        json_object_set_new(root, "output_tokens_per_s", jnum(dur_s > 0 ? (double)ts[nt].tokens / dur_s : NAN));
        json_t *tj = json_object();
        for (int i = 0; i <= nt; i++) {
            tstat *s = &ts[i];
            if (s->requests == 0) continue;
            json_t *o = json_object();
            json_object_set_new(o, "requests", json_integer(s->requests));
            json_object_set_new(o, "completed", json_integer(s->completed));
            json_object_set_new(o, "rejected", json_integer(s->rejected));
            json_t *rb = json_object();
            for (int r = 0; r < N_REASON; r++)
                if (s->rejects_by[r]) json_object_set_new(rb, ringlm_reason_name(r), json_integer(s->rejects_by[r]));
            json_object_set_new(o, "rejects_by_reason", rb);
            json_object_set_new(o, "cancelled", json_integer(s->cancelled));
            json_object_set_new(o, "timeouts", json_integer(s->timeouts));
            json_object_set_new(o, "errors", json_integer(s->errors));
            json_object_set_new(o, "unfinished", json_integer(s->lost));
            json_object_set_new(o, "output_tokens", json_integer((json_int_t)s->tokens));
            json_object_set_new(o, "ttft_ms", jpcts(&s->ttft));
            json_object_set_new(o, "tpot_ms", jpcts(&s->tpot));
            json_object_set_new(o, "e2e_ms", jpcts(&s->e2e));
            if (metrics_addr && i != nt - 1) {
                json_t *q = json_object();
                json_object_set_new(q, "p50", jnum(s->qw[0]));
                json_object_set_new(q, "p90", jnum(s->qw[1]));
                json_object_set_new(q, "p99", jnum(s->qw[2]));
                json_object_set_new(o, "queue_wait_ms", q);
            } else {
                json_object_set_new(o, "queue_wait_ms", json_null());
            }
            json_object_set_new(tj, s->name, o);
        }
        json_object_set_new(root, "tenants", tj);
        char *out = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        puts(out);
        free(out);
        json_decref(root);
    } else {
        printf("replayed %zu requests from %s with %d clients in %.2f s (rate x%g, lengths x%g): "
               "%.1f output tokens/s\n",
               t.n, argv[optind], ro.clients, dur_s, lo.rate, lo.length_scale,
               dur_s > 0 ? (double)ts[nt].tokens / dur_s : 0.0);
        printf("%-12s %6s %6s %5s %5s %4s %4s %8s %20s %20s %20s %20s\n", "tenant", "reqs", "done", "rej",
               "canc", "tmo", "err", "tokens", "TTFT ms p50/90/99", "TPOT ms p50/90/99",
               "E2E ms p50/90/99", "QWAIT ms p50/90/99");
        for (int i = 0; i <= nt; i++)
            if (ts[i].requests && (i != nt || nt > 2)) print_row(&ts[i]);
        for (int i = 0; i < nt; i++) {
            bool any = false;
            for (int r = 0; r < N_REASON; r++)
                if (ts[i].rejects_by[r]) {
                    if (!any) printf("rejects of %s:", ts[i].name);
                    printf(" %s=%ld", ringlm_reason_name(r), ts[i].rejects_by[r]);
                    any = true;
                }
            if (any) putchar('\n');
        }
        if (!metrics_addr) printf("(queue wait: pass --metrics ADDR:PORT of the daemon)\n");
        if (ts[nt].lost) printf("%ld requests did not finish (session ended or --drain-timeout)\n", ts[nt].lost);
    }
    if (connect_failures) fprintf(stderr, "ringlm replay: %d of %d clients could not connect\n", connect_failures, ro.clients);
    (void)child_fail;
    int rc = ts[nt].lost || ts[nt].errors ? 1 : 0;
    for (int i = 0; i <= nt; i++) {
        free(ts[i].ttft.v);
        free(ts[i].tpot.v);
        free(ts[i].e2e.v);
    }
    free(ts);
    free(res);
    free(have);
    free(pids);
    free(fds);
    free(pfd);
    free(qw_before.h);
    free(qw_after.h);
    free_names(&force);
    free_names(&t.tenants);
    free_names(&t.classes);
    free(t.r);
    return rc;
}

/* ======================================================================================= */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ringlm [--socket PATH] COMMAND [options]\n"
            "  generate   stream text for a prompt (ringlm generate --help)\n"
            "  replay     open-loop replay of a trace against the daemon (ringlm replay --help)\n"
            "  version    print the client version\n"
            "--socket PATH: the daemon's socket (default $%s, else %s)\n",
            RINGLM_SOCKET_ENV, RINGLM_DEFAULT_SOCKET);
}

int main(int argc, char **argv)
{
    int i = 1;
    while (i < argc && argv[i][0] == '-') {
        if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
            g_socket = argv[i + 1];
            i += 2;
        } else if (!strncmp(argv[i], "--socket=", 9)) {
            g_socket = argv[i] + 9;
            i++;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--version")) {
            printf("ringlm %s\n", RINGLM_VERSION);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[i];
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - i, argv + i);
    if (!strcmp(cmd, "replay")) return cmd_replay(argc - i, argv + i);
    if (!strcmp(cmd, "version")) {
        printf("ringlm %s\n", RINGLM_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "ringlm: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
