/* SPDX-License-Identifier: MIT */
/* tools/replay.c — `ringlm replay`: options, the run, and its report (see replay.h). */
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
#include "tools/prom.h"

/* ======================================================================================= */
/* replay: report                                                                          */
/* ======================================================================================= */

typedef struct dstat {
    double *v;
    size_t n, cap;
} dstat;

static void dpush(dstat *d, double x)
{
    if (d->n == d->cap)
        d->v = cli_realloc(d->v, (d->cap = d->cap ? d->cap * 2 : 256) * sizeof(double));
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

static json_t *jnum(double v)
{
    return isnan(v) ? json_null() : json_real(round(v * 1000) / 1000);
}

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
    if (isnan(v))
        snprintf(buf, cap, "-");
    else if (v < 10)
        snprintf(buf, cap, "%.2f", v);
    else if (v < 1000)
        snprintf(buf, cap, "%.1f", v);
    else
        snprintf(buf, cap, "%.0f", v);
}

static void print_row(tstat *s)
{
    char a[5][16];
    printf("%-12s %6ld %6ld %5ld %5ld %4ld %4ld %8llu", s->name, s->requests, s->completed,
           s->rejected, s->cancelled, s->timeouts, s->errors + s->lost,
           (unsigned long long)s->tokens);
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
    int64_t el_us = (int64_t)(cli_now_us() - t_start); /* the start lies 20 ms ahead at first */
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
            "  --http URL          through ringlm-gateway at URL (http://HOST:PORT) instead of\n"
            "                      the socket: the same prompts, the same report\n"
            "  --api-keys FILE     with --http: the gateway's keys file (KEY TENANT [CLASS]);\n"
            "                      each request carries the key of its tenant\n"
            "  --json              print one JSON object instead of the table\n"
            "  --format native|azure|mooncake\n");
}

static void split_names(const char *s, names *ns)
{
    char *dup = cli_strdup(s), *save = NULL;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (*tok) {
            ns->v = cli_realloc(ns->v, sizeof(char *) * (size_t)(ns->n + 1));
            ns->v[ns->n++] = cli_strdup(tok); /* duplicates kept: "a,a,b" weights a twice */
        }
    free(dup);
}

int replay_main(int argc, char **argv)
{
    load_opts lo = {.fmt = FMT_TRACE_AUTO, .rate = 1, .length_scale = 1};
    replay_opts ro = {.clients = 4, .vocab = 259, .drain_timeout_s = 120, .seed = 1};
    names force = {0};
    const char *metrics_addr = NULL;
    bool as_json = false;
    static const struct option opts[] = {{"clients", required_argument, 0, 'c'},
                                         {"rate", required_argument, 0, 'r'},
                                         {"length-scale", required_argument, 0, 'L'},
                                         {"max-context", required_argument, 0, 'C'},
                                         {"window", required_argument, 0, 'w'},
                                         {"limit", required_argument, 0, 'n'},
                                         {"tenants", required_argument, 0, 'T'},
                                         {"class", required_argument, 0, 'K'},
                                         {"vocab", required_argument, 0, 'V'},
                                         {"temperature", required_argument, 0, 't'},
                                         {"seed", required_argument, 0, 's'},
                                         {"drain-timeout", required_argument, 0, 'D'},
                                         {"metrics", required_argument, 0, 'M'},
                                         {"json", no_argument, 0, 'j'},
                                         {"format", required_argument, 0, 'f'},
                                         {"socket", required_argument, 0, 'X'},
                                         {"http", required_argument, 0, 'H'},
                                         {"api-keys", required_argument, 0, 'A'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "c:r:n:jh", opts, NULL)) != -1) {
        switch (o) {
        case 'c': ro.clients = (int)cli_parse_long("--clients", optarg, 1, 256); break;
        case 'r': lo.rate = cli_parse_double("--rate", optarg, 1e-6, 1e6); break;
        case 'L': lo.length_scale = cli_parse_double("--length-scale", optarg, 1e-6, 1e6); break;
        case 'C': lo.max_context = cli_parse_long("--max-context", optarg, 2, 1L << 30); break;
        case 'w': {
            const char *colon = strchr(optarg, ':');
            if (colon) {
                char tmp[64];
                snprintf(tmp, sizeof tmp, "%.*s", (int)(colon - optarg), optarg);
                lo.window_start_s = cli_parse_double("--window START", tmp, 0, 1e9);
                lo.window_len_s = cli_parse_double("--window DUR", colon + 1, 1e-6, 1e9);
            } else {
                lo.window_len_s = cli_parse_double("--window", optarg, 1e-6, 1e9);
            }
            break;
        }
        case 'n': lo.limit = cli_parse_long("--limit", optarg, 1, 1L << 40); break;
        case 'T': split_names(optarg, &force); break;
        case 'K': lo.force_class = optarg; break;
        case 'V': ro.vocab = (int)cli_parse_long("--vocab", optarg, 4, 1 << 30); break;
        case 't': ro.temperature = (float)cli_parse_double("--temperature", optarg, 0, 100); break;
        case 's': ro.seed = (uint64_t)cli_parse_long("--seed", optarg, 0, LONG_MAX); break;
        case 'D': ro.drain_timeout_s = cli_parse_double("--drain-timeout", optarg, 0, 1e7); break;
        case 'M': metrics_addr = optarg; break;
        case 'j': as_json = true; break;
        case 'f':
            if (!strcmp(optarg, "native"))
                lo.fmt = FMT_TRACE_NATIVE;
            else if (!strcmp(optarg, "azure"))
                lo.fmt = FMT_TRACE_AZURE;
            else if (!strcmp(optarg, "mooncake"))
                lo.fmt = FMT_TRACE_MOONCAKE;
            else
                cli_die("--format: '%s' is not native, azure or mooncake", optarg);
            break;
        case 'X': cli_socket = optarg; break;
        case 'H': ro.http_url = optarg; break;
        case 'A': ro.api_keys = optarg; break;
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
    replay_load_trace(argv[optind], &lo, &t);
    if ((size_t)ro.clients > t.n) ro.clients = (int)t.n;

    char err[256];
    prom_hist_set qw_before = {0}, qw_after = {0};
    if (metrics_addr) {
        char *m = prom_get_metrics(metrics_addr, err, sizeof err);
        if (!m) cli_die("%s", err);
        prom_parse_queue_wait(m, &qw_before);
        free(m);
    }

    if (ro.api_keys && !ro.http_url) cli_die("--api-keys goes with --http");
    /* One probe connection first: a missing daemon (or gateway) is one clear message, not N. */
    if (ro.http_url)
        replay_http_check(&ro, &t);
    else
        ringlm_close(cli_connect());
    bool tty = !as_json && isatty(STDOUT_FILENO);
    signal(SIGPIPE, SIG_IGN);
    /* Children start together: each sleeps until its first arrival from this origin. */
    uint64_t t0 = cli_now_us() + 20000;
    pid_t *pids = cli_calloc((unsigned)ro.clients, sizeof *pids);
    int *fds = cli_calloc((unsigned)ro.clients, sizeof *fds);
    fflush(NULL);
    for (int k = 0; k < ro.clients; k++) {
        int p[2];
        if (pipe(p) < 0) cli_die("pipe: %s", strerror(errno));
        pid_t pid = fork();
        if (pid < 0) cli_die("fork: %s", strerror(errno));
        if (pid == 0) {
            close(p[0]);
            for (int j = 0; j < k; j++) close(fds[j]);
            if (ro.http_url) replay_http_child_main(k, &t, &ro, t0, p[1]);
            replay_child_main(k, &t, &ro, t0, p[1]);
        }
        close(p[1]);
        pids[k] = pid;
        fds[k] = p[0];
    }
    rrec *res = cli_calloc(t.n, sizeof *res);
    bool *have = cli_calloc(t.n, sizeof *have);
    size_t done = 0;
    int open_fds = ro.clients, connect_failures = 0, first_connect_err = 0;
    struct pollfd *pfd = cli_calloc((unsigned)ro.clients, sizeof *pfd);
    uint64_t last_bar = 0;
    while (open_fds > 0) {
        int np = 0;
        for (int k = 0; k < ro.clients; k++)
            if (fds[k] >= 0) pfd[np++] = (struct pollfd){.fd = fds[k], .events = POLLIN};
        if (poll(pfd, (nfds_t)np, 200) < 0 && errno != EINTR) cli_die("poll: %s", strerror(errno));
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
        if (tty && cli_now_us() - last_bar > 100000) {
            progress(done, t.n, t0);
            last_bar = cli_now_us();
        }
    }
    int child_fail = 0;
    for (int k = 0; k < ro.clients; k++) {
        int st;
        if (waitpid(pids[k], &st, 0) > 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) child_fail++;
    }
    uint64_t t_end = cli_now_us();
    if (tty) {
        progress(done, t.n, t0);
        printf("\n");
    }
    if (connect_failures == ro.clients)
        cli_die("no client could connect to ringlmd: %s", ringlm_strerror(first_connect_err));

    if (metrics_addr) {
        char *m = prom_get_metrics(metrics_addr, err, sizeof err);
        if (m) {
            prom_parse_queue_wait(m, &qw_after);
            free(m);
        } else {
            fprintf(stderr, "ringlm replay: %s (no queue-wait figures)\n", err);
        }
    }

    /* ---- aggregate per tenant ---- */
    int nt = t.tenants.n + 1;                           /* last: requests without a tag */
    tstat *ts = cli_calloc((size_t)nt + 1, sizeof *ts); /* + "all" */
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
                s->rejects_by[r->reject_reason >= 0 && r->reject_reason < N_REASON
                                  ? r->reject_reason
                                  : 0]++;
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
        prom_hist sum = {0}, base = {0};
        /* "all" sums every tenant; the untagged row has no daemon-side name: skipped */
        for (int a = 0; a < qw_after.n; a++) {
            if (!(i == nt || (want && !strcmp(qw_after.h[a].tenant, want)))) continue;
            for (int j = 0; j < qw_after.h[a].n; j++) {
                int x;
                for (x = 0; x < sum.n && sum.le[x] != qw_after.h[a].le[j]; x++) {}
                if (x == sum.n && sum.n < PROM_HIST_MAX_LE) {
                    sum.le[x] = qw_after.h[a].le[j];
                    sum.cum[x] = 0;
                    sum.n++;
                }
                if (x < PROM_HIST_MAX_LE) sum.cum[x] += qw_after.h[a].cum[j];
            }
        }
        for (int a = 0; a < qw_before.n; a++) {
            if (!(i == nt || (want && !strcmp(qw_before.h[a].tenant, want)))) continue;
            for (int j = 0; j < qw_before.h[a].n; j++) {
                int x;
                for (x = 0; x < base.n && base.le[x] != qw_before.h[a].le[j]; x++) {}
                if (x == base.n && base.n < PROM_HIST_MAX_LE) {
                    base.le[x] = qw_before.h[a].le[j];
                    base.cum[x] = 0;
                    base.n++;
                }
                if (x < PROM_HIST_MAX_LE) base.cum[x] += qw_before.h[a].cum[j];
            }
        }
        ts[i].qw[0] = prom_hist_percentile(&sum, &base, 0.50);
        ts[i].qw[1] = prom_hist_percentile(&sum, &base, 0.90);
        ts[i].qw[2] = prom_hist_percentile(&sum, &base, 0.99);
    }
    double dur_s =
        last_fin > first_sub ? (double)(last_fin - first_sub) / 1e6 : (double)(t_end - t0) / 1e6;

    if (as_json) {
        json_t *root = json_object();
        json_object_set_new(root, "trace", json_string(argv[optind]));
        json_object_set_new(root, "transport", json_string(ro.http_url ? "http" : "shm"));
        json_object_set_new(root, "requests", json_integer((json_int_t)t.n));
        json_object_set_new(root, "clients", json_integer(ro.clients));
        json_object_set_new(root, "rate", json_real(lo.rate));
        json_object_set_new(root, "length_scale", json_real(lo.length_scale));
        json_object_set_new(root, "duration_s", jnum(dur_s));
        json_object_set_new(root, "output_tokens_per_s",
                            jnum(dur_s > 0 ? (double)ts[nt].tokens / dur_s : NAN));
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
                if (s->rejects_by[r])
                    json_object_set_new(rb, ringlm_reason_name(r), json_integer(s->rejects_by[r]));
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
        char *out =
            json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        puts(out);
        free(out);
        json_decref(root);
    } else {
        printf(
            "replayed %zu requests from %s with %d clients%s%s in %.2f s (rate x%g, lengths x%g): "
            "%.1f output tokens/s\n",
            t.n, argv[optind], ro.clients, ro.http_url ? " through " : "",
            ro.http_url ? ro.http_url : "", dur_s, lo.rate, lo.length_scale,
            dur_s > 0 ? (double)ts[nt].tokens / dur_s : 0.0);
        printf("%-12s %6s %6s %5s %5s %4s %4s %8s %20s %20s %20s %20s\n", "tenant", "reqs", "done",
               "rej", "canc", "tmo", "err", "tokens", "TTFT ms p50/90/99", "TPOT ms p50/90/99",
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
        if (ts[nt].lost)
            printf("%ld requests did not finish (session ended or --drain-timeout)\n", ts[nt].lost);
    }
    if (connect_failures)
        fprintf(stderr, "ringlm replay: %d of %d clients could not connect\n", connect_failures,
                ro.clients);
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
    replay_free_names(&force);
    replay_free_names(&t.tenants);
    replay_free_names(&t.classes);
    free(t.r);
    return rc;
}
