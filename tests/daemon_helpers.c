/* SPDX-License-Identifier: MIT */
/* tests/daemon_helpers.c — see daemon_helpers.h. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "ringlm.h"
#include "formats/stats.h"
#include "shm/ring.h"
#include "shm/wire.h"
#include "tests/daemon_helpers.h"
#include "tests/helpers.h"
#include "tools/prom.h"

bool stories_path(char *out, size_t n)
{
    snprintf(out, n, "%s/models/stories260K.bin", th_shared_dir());
    return access(out, R_OK) == 0;
}

void model_or_synthetic(char *out, size_t n)
{
    if (!stories_path(out, n)) snprintf(out, n, "synthetic:stories260K:1");
}

void need_daemon_binary(void)
{
    char p[512];
    snprintf(p, sizeof p, "%s/ringlmd", th_bin_dir());
    if (access(p, X_OK) != 0) cr_skip_test("%s not built (set RINGLM_BIN)", p);
}

void dump_file(const char *path, const char *what)
{
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[512];
    int n = 0;
    fprintf(stderr, "---- %s (%s) ----\n", what, path);
    while (fgets(line, sizeof line, f) && n++ < 60) fputs(line, stderr);
    fclose(f);
}

void dmn_start(dmn *d, const char *model, const char *policy_text, const char *const *extra)
{
    memset(d, 0, sizeof *d);
    th_daemon_init(&d->th);
    snprintf(d->dir, sizeof d->dir, "%s", d->th.dir);
    snprintf(d->sock, sizeof d->sock, "%s", d->th.sock);
    snprintf(d->errlog, sizeof d->errlog, "%s", d->th.log);
    snprintf(d->stats, sizeof d->stats, "%s/stats.json", d->dir);
    snprintf(d->declog, sizeof d->declog, "%s/decisions.jsonl", d->dir);
    snprintf(d->reqlog, sizeof d->reqlog, "%s/requests.jsonl", d->dir);
    if (policy_text) {
        snprintf(d->policy, sizeof d->policy, "%s/policy.conf", d->dir);
        FILE *f = fopen(d->policy, "w");
        cr_assert_not_null(f);
        fputs(policy_text, f);
        fclose(f);
    }
    const char *argv[64];
    int a = 0;
    if (extra && extra[0] && !strcmp(extra[0], TH_TEST_BUILD)) argv[a++] = *extra++; /* first */
    argv[a++] = "--model";
    argv[a++] = model;
    argv[a++] = "--stats-file";
    argv[a++] = d->stats;
    argv[a++] = "--check-invariants";
    argv[a++] = "--decision-log";
    argv[a++] = d->declog;
    argv[a++] = "--request-log";
    argv[a++] = d->reqlog;
    if (policy_text) {
        argv[a++] = "--policy";
        argv[a++] = d->policy;
    }
    for (int i = 0; extra && extra[i] && a < 56; i++) argv[a++] = extra[i];
    argv[a] = NULL;
    /* The start is waited for as an event (its socket listening, or its exit); the bound
     * only stops a daemon that hangs. synthetic:stories110M (the tier tests) is synthesized
     * and warmed up before the daemon listens: 17.7 s at load 23, so 20 s failed them. */
    th_daemon_start(&d->th, argv, DMN_START_MS);
    d->pid = d->th.pid;
    uint64_t deadline = th_now_ms() + DMN_START_MS;
    while (access(d->stats, R_OK) != 0) {
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            d->pid = d->th.pid = 0;
            dump_file(d->errlog, "ringlmd stderr");
            cr_assert_fail("ringlmd exited at start (status %d)", st);
        }
        cr_assert(th_now_ms() < deadline, "ringlmd wrote no stats file within %d ms", DMN_START_MS);
        th_pause_ms(2);
    }
}

int dmn_stop(dmn *d, int sig, int timeout_ms)
{
    d->th.pid = d->pid;
    int rc = th_daemon_stop(&d->th, sig, timeout_ms);
    d->pid = 0;
    if (rc == 999) dump_file(d->errlog, "ringlmd stderr");
    return rc;
}

void dmn_cleanup(dmn *d)
{
    d->th.pid = d->pid;
    th_daemon_cleanup(&d->th);
    d->pid = 0;
}

json_t *dmn_stats(dmn *d)
{
    for (int i = 0; i < 50; i++) {
        json_error_t e;
        json_t *j = json_load_file(d->stats, 0, &e);
        if (j) return j;
        th_pause_ms(2);
    }
    return NULL;
}

int dmn_metrics_port(const dmn *d)
{
    int port = 0;
    FILE *f = fopen(d->errlog, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "ringlmd: metrics on port %d", &port) == 1) break;
    if (f) fclose(f);
    return port;
}

long long jint(json_t *o, const char *path)
{
    /* "a.b.c" */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = json_object_get(cur, tok);
    return cur && json_is_integer(cur) ? (long long)json_integer_value(cur) : -1;
}

void assert_back_to_baseline(dmn *d, int timeout_ms)
{
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    char last[1024] = "";
    for (;;) {
        /* the stats file is read by formats/stats.h, its one reader: a file it cannot read
         * is a broken writer, not a retry (the file is renamed into place whole) */
        fmt_stats st;
        char why[200];
        int rc = fmt_stats_read(d->stats, &st, why, sizeof why);
        cr_assert_eq(rc, 0, "stats file %s: %s", d->stats, why);
        snprintf(last, sizeof last,
                 "live %llu, device %llu/%llu/%llu, host %llu/%llu/%llu, disk %llu/%llu/%llu, "
                 "transfers %llu, invariants %s",
                 (unsigned long long)st.live_requests, (unsigned long long)st.kv[0].used,
                 (unsigned long long)st.kv[0].free, (unsigned long long)st.kv[0].total,
                 (unsigned long long)st.kv[1].used, (unsigned long long)st.kv[1].free,
                 (unsigned long long)st.kv[1].total, (unsigned long long)st.kv[2].used,
                 (unsigned long long)st.kv[2].free, (unsigned long long)st.kv[2].total,
                 (unsigned long long)st.transfers_inflight, st.invariants);
        for (int p = 0; p < FMT_STATS_POOLS; p++)
            cr_assert_eq(st.kv[p].used + st.kv[p].free, st.kv[p].total,
                         "pool %s: used + free != total: %s", fmt_stats_pool_names[p], last);
        cr_assert_str_eq(st.invariants, "ok", "scheduler invariants: %s", last);
        cr_assert_eq(st.swap_verify_errors, 0, "swap-in not byte-exact: %s", last);
        cr_assert_eq(st.transfer_overlap_errors, 0, "a block was in two transfers at once: %s",
                     last);
        bool idle = st.live_requests == 0 && st.kv[0].used == 0 && st.kv[1].used == 0 &&
                    st.kv[2].used == 0 && st.transfers_inflight == 0;
        if (idle) return;
        if (th_now_ms() > deadline) {
            dump_file(d->errlog, "ringlmd stderr");
            cr_assert_fail("daemon did not return to baseline within %d ms: %s", timeout_ms, last);
        }
        th_pause_ms(2);
    }
}

pid_t spawn(int (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t p = fork();
    cr_assert_geq(p, 0);
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* nor its clients */
        _exit(fn(arg));
    }
    return p;
}

int reap(pid_t p, int timeout_ms)
{
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    int st;
    for (;;) {
        pid_t w = waitpid(p, &st, WNOHANG);
        if (w == p) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (th_now_ms() > deadline) {
            kill(p, SIGKILL);
            waitpid(p, &st, 0);
            return 999;
        }
        th_pause_ms(2);
    }
}

int load_refs(ref_case *out, int max)
{
    char p[512];
    snprintf(p, sizeof p, "%s/models/reference-greedy.json", th_shared_dir());
    json_error_t e;
    json_t *j = json_load_file(p, 0, &e);
    if (!j) return 0;
    json_t *cases = json_object_get(j, "cases");
    int n = 0;
    for (size_t i = 0; i < json_array_size(cases) && n < max; i++) {
        json_t *c = json_array_get(cases, i);
        ref_case *r = &out[n];
        memset(r, 0, sizeof *r);
        json_t *pt = json_object_get(c, "prompt_tokens"),
               *gt = json_object_get(c, "generated_tokens");
        if (json_array_size(pt) > 16 || json_array_size(gt) > 600) continue;
        for (size_t k = 0; k < json_array_size(pt); k++)
            r->prompt[r->n_prompt++] = (int32_t)json_integer_value(json_array_get(pt, k));
        for (size_t k = 0; k < json_array_size(gt); k++)
            r->gen[r->n_gen++] = (int32_t)json_integer_value(json_array_get(gt, k));
        r->stops = json_is_true(json_object_get(c, "stopped_on_bos"));
        int steps = (int)json_integer_value(json_object_get(c, "effective_steps"));
        /* steps positions including the prompt: the last one samples token steps+1. */
        r->max_new = (uint32_t)(steps - (int)r->n_prompt + 1);
        n++;
    }
    json_decref(j);
    return n;
}

int client_greedy(void *arg)
{
    gen_job *g = arg;
    ringlm_client *c;
    int rc = ringlm_connect(g->sock, &c);
    if (rc < 0) {
        fprintf(stderr, "connect: %s %s\n", ringlm_strerror(rc), ringlm_errdetail());
        return 2;
    }
    uint64_t ids[32];
    static int32_t got[32][600];
    uint32_t n_got[32] = {0};
    for (int i = 0; i < g->n_cases; i++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = g->cases[i].prompt;
        r.n_prompt = g->cases[i].n_prompt;
        r.max_new_tokens = g->cases[i].max_new;
        r.class_name = g->class_name;
        r.tenant_tag = g->tenant;
        rc = ringlm_submit(c, &r, &ids[i]);
        if (rc < 0) {
            fprintf(stderr, "submit %d: %s %s\n", i, ringlm_strerror(rc), ringlm_errdetail());
            return 3;
        }
    }
    int left = g->n_cases, bad = 0;
    while (left > 0) {
        ringlm_event ev;
        rc = ringlm_next_event(c, &ev, 60000);
        if (rc <= 0) {
            fprintf(stderr, "next_event: %d %s %s\n", rc, ringlm_strerror(rc), ringlm_errdetail());
            return 4;
        }
        int i = 0;
        while (i < g->n_cases && ids[i] != ev.req_id) i++;
        if (i == g->n_cases) {
            fprintf(stderr, "event for unknown id %llu\n", (unsigned long long)ev.req_id);
            return 5;
        }
        if (ev.kind == RINGLM_EV_TOKEN) {
            if (ev.index != n_got[i]) {
                fprintf(stderr, "case %d: token index %u, expected %u\n", i, ev.index, n_got[i]);
                bad++;
            }
            if (n_got[i] < 600) got[i][n_got[i]++] = ev.token;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            left--;
            const ref_case *rc_ = &g->cases[i];
            int want_reason = rc_->stops ? RINGLM_FINISH_STOP : RINGLM_FINISH_LENGTH;
            if (ev.finish_reason != want_reason || ev.n_tokens != rc_->n_gen ||
                n_got[i] != rc_->n_gen) {
                fprintf(stderr,
                        "case %d: finish %s/%s n_tokens %u got %u, expected %s with %u tokens\n", i,
                        ringlm_reason_name(ev.finish_reason), ringlm_reason_name(ev.reject_reason),
                        ev.n_tokens, n_got[i], ringlm_reason_name(want_reason), rc_->n_gen);
                bad++;
            }
            for (uint32_t k = 0; k < n_got[i] && k < rc_->n_gen; k++) {
                if (got[i][k] != rc_->gen[k]) {
                    fprintf(stderr, "case %d: token %u is %d, reference %d\n", i, k, got[i][k],
                            rc_->gen[k]);
                    bad++;
                    break;
                }
            }
            if (ev.policy_hash == 0) {
                fprintf(stderr, "case %d: finish without policy hash\n", i);
                bad++;
            }
        }
    }
    ringlm_close(c);
    return bad ? 1 : 0;
}

int count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle)) n++;
    fclose(f);
    return n;
}

int client_load(void *arg)
{
    load_job *L = arg;
    ringlm_client *c;
    int rc = ringlm_connect(L->sock, &c);
    if (rc < 0) {
        fprintf(stderr, "load connect: %s %s\n", ringlm_strerror(rc), ringlm_errdetail());
        return 2;
    }
    int cap = L->n_requests > 0 ? L->n_requests : 100000;
    req_rec *recs = calloc((size_t)cap, sizeof *recs);
    int32_t *prompt = malloc(sizeof(int32_t) * (L->prompt_len ? L->prompt_len : 1));
    int submitted = 0, finished = 0, inflight = 0;
    if (L->start_at_us)
        while (th_now_us() < L->start_at_us) th_pause_ms(2);
    uint64_t t0 = th_now_us(), next_submit = t0;
    bool ready_sent = false;
    for (;;) {
        uint64_t t = th_now_us();
        bool may_submit = submitted < cap && (!L->duration_ms || t - t0 < L->duration_ms * 1000);
        while (may_submit && (L->interval_us ? t >= next_submit : inflight < L->concurrency)) {
            for (uint32_t k = 0; k < L->prompt_len; k++)
                prompt[k] =
                    L->fixed_prompt
                        ? L->fixed_prompt[k]
                        : (int32_t)((L->token_base + 7 * submitted + 3 * (int)k) % (L->vocab - 3) +
                                    3);
            ringlm_request r;
            ringlm_request_init(&r);
            r.prompt = prompt;
            r.n_prompt = L->prompt_len;
            r.max_new_tokens = L->max_new;
            r.class_name = L->class_name;
            r.tenant_tag = L->tenant;
            r.deadline_us = L->deadline_us;
            req_rec *q = &recs[submitted];
            q->submit_us = th_now_us();
            rc = ringlm_submit(c, &r, &q->id);
            if (rc == -EAGAIN) break;
            if (rc < 0) {
                fprintf(stderr, "load submit: %s %s\n", ringlm_strerror(rc), ringlm_errdetail());
                goto out;
            }
            submitted++;
            inflight++;
            if (L->gate_after && submitted == L->gate_after) {
                char b;
                if (read(L->gate_fd, &b, 1) != 1) { /* parent gone */
                }
            }
            next_submit += L->interval_us;
            may_submit = submitted < cap && (!L->duration_ms || t - t0 < L->duration_ms * 1000);
        }
        if (!may_submit && inflight == 0) break;
        if (L->never_read) {
            if (!may_submit) {
                char b;
                if (read(L->wait_fd, &b, 1) != 1) { /* parent gone */
                }
                L->never_read = false;
            } else {
                continue;
            }
        }
        int to = L->interval_us ? 1 : 200;
        ringlm_event ev;
        rc = ringlm_next_event(c, &ev, to);
        if (rc < 0) {
            fprintf(stderr, "load next_event: %s %s\n", ringlm_strerror(rc), ringlm_errdetail());
            goto out;
        }
        if (rc == 0) continue;
        int i = submitted - 1;
        while (i >= 0 && recs[i].id != ev.req_id) i--;
        if (i < 0) continue;
        req_rec *q = &recs[i];
        if (ev.kind == RINGLM_EV_TOKEN) {
            if (!q->first_us) q->first_us = th_now_us();
            if (ev.index != q->next_index) q->index_error = true;
            q->next_index = ev.index + 1;
            q->n_tokens++;
            if (!ready_sent && L->ready_fd >= 0) {
                if (write(L->ready_fd, "r", 1) != 1) { /* parent gone */
                }
                ready_sent = true;
            }
        } else {
            q->end_us = th_now_us();
            q->reason = ev.finish_reason;
            q->cause = ev.reject_reason;
            q->done = true;
            if (ev.n_tokens != q->n_tokens) q->index_error = true;
            finished++;
            inflight--;
        }
    }
out:;
    FILE *f = L->out_path ? fopen(L->out_path, "w") : NULL;
    for (int i = 0; f && i < submitted; i++) {
        req_rec *q = &recs[i];
        fprintf(f, "%d %d %u %lld %lld %llu %d %d\n", q->reason, q->cause, q->n_tokens,
                q->first_us ? (long long)(q->first_us - q->submit_us) : -1LL,
                q->done ? (long long)(q->end_us - q->submit_us) : -1LL,
                (unsigned long long)(q->submit_us - t0), q->index_error, q->done);
    }
    if (f) fclose(f);
    ringlm_close(c);
    free(recs);
    free(prompt);
    return rc < 0 ? 6 : 0;
}

int read_results(const char *path, result_line *out, int max)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0;
    while (n < max && fscanf(f, "%d %d %u %lld %lld %llu %d %d", &out[n].reason, &out[n].cause,
                             &out[n].n_tokens, &out[n].ttft_us, &out[n].e2e_us, &out[n].submit_us,
                             &out[n].index_error, &out[n].done) == 8)
        n++;
    fclose(f);
    return n;
}

ringlm_client *client_connect(const char *sock)
{
    ringlm_client *c;
    if (ringlm_connect(sock, &c) < 0) {
        fprintf(stderr, "connect: %s\n", ringlm_errdetail());
        return NULL;
    }
    return c;
}

int client_submit(ringlm_client *c, const ringlm_request *r, uint64_t *id)
{
    if (ringlm_submit(c, r, id) < 0) {
        fprintf(stderr, "submit: %s\n", ringlm_errdetail());
        return 4;
    }
    return 0;
}

int client_follow(ringlm_client *c, uint64_t id, FILE *f, int32_t *conv, uint32_t *n, uint32_t cap,
                  ringlm_event *fin)
{
    for (;;) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 60000);
        if (rc <= 0) {
            fprintf(stderr, "next_event: %s\n", ringlm_errdetail());
            return 5;
        }
        if (ev.req_id != id) continue;
        if (ev.kind == RINGLM_EV_TOKEN) {
            if (f) fprintf(f, "%d ", ev.token);
            if (n && *n < cap) {
                if (conv) conv[*n] = ev.token;
                ++*n;
            }
        }
        if (ev.kind == RINGLM_EV_FINISH) {
            if (f) fprintf(f, "| %s %u\n", ringlm_reason_name(ev.finish_reason), ev.n_tokens);
            if (fin) *fin = ev;
            return 0;
        }
    }
}

int client_sequential(void *arg)
{
    seq_job *g = arg;
    ringlm_client *c = client_connect(g->sock);
    if (!c) return 2;
    FILE *f = fopen(g->out, "w");
    if (!f) return 3;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < (g->repeat[i] ? g->repeat[i] : 1); k++) {
            ringlm_request r;
            ringlm_request_init(&r);
            r.prompt = g->prompt[i];
            r.n_prompt = g->n_prompt[i];
            r.max_new_tokens = g->max_new_of[i] ? g->max_new_of[i] : g->max_new;
            uint64_t id;
            int rc = client_submit(c, &r, &id);
            if (!rc) rc = client_follow(c, id, f, NULL, NULL, 0, NULL);
            if (rc) return rc;
        }
    fclose(f);
    ringlm_close(c);
    return 0;
}

char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return strdup(buf);
}

void dmn_start_for(dmn *d, const char *model, const char *policy, const char *const *flags,
                   const char **sock, const char **out)
{
    dmn_start(d, model, policy, flags);
    snprintf(d->out, sizeof d->out, "%s/out.txt", d->dir);
    *sock = d->sock;
    *out = d->out;
}

void dmn_run_client(dmn *d, int (*fn)(void *), void *job, const char *what)
{
    int st = reap(spawn(fn, job), 60000);
    cr_assert_eq(st, 0, "%s: exit %d", what, st);
    assert_back_to_baseline(d, 5000);
}

char *dmn_stop_output(dmn *d)
{
    cr_assert_eq(dmn_stop(d, SIGTERM, 10000), 0);
    char *o = slurp(d->out);
    cr_assert_not_null(o, "no client output in %s", d->out);
    return o;
}

json_t *sim_replay(const char *reqlog, const char *args, json_t **pc)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/ringlm-sim --trace %s --json %s", th_bin_dir(), reqlog,
             args ? args : "");
    FILE *sp = popen(cmd, "r");
    cr_assert_not_null(sp);
    static char simout[1 << 16];
    size_t sn = fread(simout, 1, sizeof simout - 1, sp);
    simout[sn] = 0;
    cr_assert_eq(pclose(sp), 0, "%s failed:\n%s", cmd, simout);
    json_error_t je;
    json_t *sj = json_loads(simout, 0, &je);
    cr_assert_not_null(sj, "ringlm-sim output is not JSON: %s", je.text);
    *pc = json_object_get(sj, "prefix_cache");
    cr_assert_not_null(*pc, "no prefix_cache figures in the replay");
    return sj;
}

int client_px_concurrent(void *arg)
{
    px_conc_job *g = arg;
    int n = g->n ? g->n : 4;
    ringlm_client *c = client_connect(g->sock);
    if (!c) return 2;
    uint64_t ids[4];
    static char out[4][4096];
    size_t len[4] = {0};
    ringlm_request r[4];
    for (int i = 0; i < n; i++) {
        ringlm_request_init(&r[i]);
        r[i].prompt = g->prompt[i];
        r[i].n_prompt = g->n_prompt[i];
        r[i].max_new_tokens = g->max_new ? g->max_new : 200;
        r[i].ignore_stop = true;
    }
    /* one batch: the daemon finds them together, so none runs alone however long this
     * process is descheduled between building the requests */
    if (ringlm_submit_batch(c, r, (uint32_t)n, ids) < 0) {
        fprintf(stderr, "submit: %s\n", ringlm_errdetail());
        return 4;
    }
    for (int done = 0; done < n;) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 60000);
        if (rc <= 0) {
            fprintf(stderr, "next_event: %s\n", ringlm_errdetail());
            return 5;
        }
        int i = 0;
        while (i < n && ids[i] != ev.req_id) i++;
        if (i == n) continue;
        if (ev.kind == RINGLM_EV_TOKEN && len[i] < sizeof out[i] - 16)
            len[i] += (size_t)snprintf(out[i] + len[i], sizeof out[i] - len[i], "%d ", ev.token);
        if (ev.kind == RINGLM_EV_FINISH) {
            snprintf(out[i] + len[i], sizeof out[i] - len[i], "| %s %u",
                     ringlm_reason_name(ev.finish_reason), ev.n_tokens);
            done++;
        }
    }
    FILE *f = fopen(g->out, "w");
    if (!f) return 3;
    for (int i = 0; i < n; i++) fprintf(f, "%s\n", out[i]);
    fclose(f);
    ringlm_close(c);
    return 0;
}

int count_lines2(const char *path, const char *a, const char *b)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, a) && strstr(line, b);
    fclose(f);
    return n;
}

const char *find_line2(const char *path, const char *a, const char *b)
{
    static char line[4096];
    FILE *f = fopen(path, "r");
    if (!f) return "";
    while (fgets(line, sizeof line, f))
        if (strstr(line, a) && strstr(line, b)) {
            fclose(f);
            return line;
        }
    fclose(f);
    return "";
}

double json_num_of(const char *line, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    return p ? strtod(p + strlen(k), NULL) : -1;
}

/* ---- a raw session ---------------------------------------------------------------------- */
void th_raw_connect(const char *path, th_raw *r)
{
    memset(r, 0, sizeof *r);
    r->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    cr_assert_eq(connect(r->sock, (struct sockaddr *)&sa, sizeof sa), 0, "connect: %m");
    struct ringlm_wire_hello h = {.magic = RINGLM_WIRE_MAGIC, .abi = RINGLM_WIRE_ABI};
    cr_assert_eq(send(r->sock, &h, sizeof h, 0), (ssize_t)sizeof h);
    char ctl[CMSG_SPACE(sizeof(int) * 3)];
    struct iovec iov = {.iov_base = &r->w, .iov_len = sizeof r->w};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    struct pollfd pfd = {.fd = r->sock, .events = POLLIN};
    cr_assert_eq(poll(&pfd, 1, 5000), 1, "no welcome");
    cr_assert_eq(recvmsg(r->sock, &msg, 0), (ssize_t)sizeof r->w);
    cr_assert_eq(r->w.status, 0, "welcome status %d: %s", r->w.status, r->w.detail);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cr_assert_not_null(cm);
    int fds[2];
    memcpy(fds, CMSG_DATA(cm), sizeof fds);
    r->cseg = mmap(NULL, r->w.cseg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    r->dseg = mmap(NULL, r->w.dseg_bytes, PROT_READ, MAP_SHARED, fds[1], 0);
    close(fds[0]);
    r->dfd = fds[1];
    cr_assert(r->cseg != MAP_FAILED && r->dseg != MAP_FAILED);
}

void th_raw_close(th_raw *r)
{
    munmap(r->cseg, r->w.cseg_bytes);
    munmap((void *)r->dseg, r->w.dseg_bytes);
    close(r->dfd);
    close(r->sock);
}

/* Writes the request records of cases[0..n) (ids 1..n) into the ring and publishes them. */
