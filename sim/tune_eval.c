/* ringlm — simulator policy search: running candidates (each on every load of a rung, on a
 * thread pool, each result in its own slot), scoring them against the objective and the
 * constraints, and ranking them.  SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sim/err.h"
#include "sim/gen.h"
#include "sim/report.h"
#include "sim/tune_internal.h"

/* ---- traces for each rung and load ---------------------------------------------------- */

int tune_derive_trace(const sim_trace *src, double w0, double w1, double rate, uint64_t seed,
                      sim_trace *dst)
{
    sim_trace_init(dst, src->source);
    for (unsigned i = 0; i < src->n_tenants; i++)
        if (sim_trace_tenant(dst, src->tenants[i]) < 0) return -ENOMEM;
    for (unsigned i = 0; i < src->n_classes; i++)
        if (sim_trace_class(dst, src->classes[i]) < 0) return -ENOMEM;
    dst->labelled = src->labelled;
    dst->has_real = src->has_real;
    dst->format = src->format;
    /* a request's block hashes (a native log's, Mooncake's) index src's hash array: copy them
     * into dst's, or the prefix cache reads past dst's */
    for (size_t i = 0; i < src->n; i++) {
        const sim_req *q = &src->reqs[i];
        int rc = q->n_hash || q->n_ahash
                     ? sim_trace_push_hashed(dst, q, &src->hashes[q->hash_off], q->n_hash,
                                             &src->hashes[q->hash_off + q->n_hash], q->n_ahash,
                                             q->hash_block_tokens)
                     : sim_trace_push(dst, q);
        if (rc < 0) return rc;
    }
    sim_transform x;
    sim_transform_defaults(&x);
    x.window_start_s = w0;
    x.window_end_s = w1;
    x.rate = rate;
    x.seed = seed;
    return sim_trace_transform(dst, &x);
}

/* The window of `frac` of the trace's span holding the most offered tokens (where policies
 * differ most), as [*w0, *w1) seconds of the source axis. */
void tune_busiest_window(const sim_trace *t, double frac, double *w0, double *w1)
{
    int64_t first = t->reqs[0].arrival_us, last = t->reqs[t->n - 1].arrival_us;
    int64_t w = (int64_t)((double)(last - first) * frac);
    uint64_t sum = 0, best = 0;
    size_t lo = 0, best_lo = 0;
    for (size_t hi = 0; hi < t->n; hi++) {
        sum += (uint64_t)t->reqs[hi].prompt_tokens + t->reqs[hi].output_tokens;
        while (t->reqs[hi].arrival_us - t->reqs[lo].arrival_us >= w) {
            sum -= (uint64_t)t->reqs[lo].prompt_tokens + t->reqs[lo].output_tokens;
            lo++;
        }
        if (sum > best) {
            best = sum;
            best_lo = lo;
        }
    }
    int64_t start = t->reqs[best_lo].arrival_us;
    if (start + w > last) start = last - w;
    *w0 = (double)start / 1e6;
    *w1 = (double)(start + w) / 1e6;
}

/* ---- evaluation ----------------------------------------------------------------------- */

typedef struct task {
    sim_tune_cand *cand;
    const sim_trace *trace;
    sim_tune_load *out;
    const sim_scenario *scn; /* a scenario run: its verdict, not the load metrics */
    int verdict;
    char verdict_text[700];
    int rc;
    char err[256];
} task;

typedef struct pool {
    task *tasks;
    size_t n, next;
    pthread_mutex_t mu;
    const sim_tune_opts *o;
} pool;

static void measure(const sim_summary *s, sim_tune_load *m)
{
    memset(m, 0, sizeof *m);
    const sim_group *g = &s->all;
    m->requests = g->requests;
    m->offered_rps = s->span_s > 0 ? (double)g->requests / s->span_s : 0;
    m->goodput_rps = g->goodput_rps;
    m->slo_attainment = isnan(g->slo_attainment) ? 0 : g->slo_attainment;
    m->refused = g->rejected + g->timeouts;
    m->pending = g->pending;
    size_t accepted = g->slo_counted > g->rejected ? g->slo_counted - g->rejected : 0;
    m->accepted_slo = accepted ? (double)g->slo_met / (double)accepted : 1;
    m->ttft_p99_ms = g->ttft.n ? g->ttft.p99 : 0;
    m->tpot_p99_ms = g->tpot.n ? g->tpot.p99 : 0;
    m->min_fair = INFINITY;
    for (size_t i = 0; i < s->n_tenants; i++) {
        const sim_group *t = &s->tenants[i];
        if (!t->requests) continue;
        if (t->normalised_service < m->min_fair) {
            m->min_fair = t->normalised_service;
            snprintf(m->min_fair_tenant, sizeof m->min_fair_tenant, "%s", t->name);
        }
    }
    if (isinf(m->min_fair)) m->min_fair = 1;
}

static void run_task(const sim_tune_opts *o, task *t)
{
    sim_options so = o->run;
    so.policy = t->cand->policy;
    so.policy_name = t->cand->hash;
    so.decision_log = NULL;
    sim_run run;
    memset(&run, 0, sizeof run);
    t->rc = sim_run_trace(t->trace, &so, &run);
    if (t->rc == 0) {
        sim_summary s;
        memset(&s, 0, sizeof s);
        t->rc = sim_summarise(&run, t->scn, -1, -1, &s);
        if (t->rc == 0 && t->scn) {
            t->verdict = s.verdict;
            snprintf(t->verdict_text, sizeof t->verdict_text, "%s: %s", s.verdict_name,
                     s.verdict_text);
        } else if (t->rc == 0) {
            measure(&s, t->out);
        } else {
            snprintf(t->err, sizeof t->err, "out of memory");
        }
        sim_summary_free(&s);
    } else {
        snprintf(t->err, sizeof t->err, "%s", sim_err());
    }
    sim_run_free(&run);
}

static void *worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        size_t i = p->next < p->n ? p->next++ : p->n;
        pthread_mutex_unlock(&p->mu);
        if (i == p->n) return NULL;
        run_task(p->o, &p->tasks[i]);
    }
}

static double rel_close(double a, double b)
{
    return fabs(a - b) <= 1e-9 * fmax(1, fmax(fabs(a), fabs(b)));
}

static void score(const search *S, sim_tune_score *sc)
{
    const sim_tune_opts *o = S->o;
    sc->goodput_rps = sc->violation = sc->ttft_p99_ms = sc->tpot_p99_ms = 0;
    sc->refused = sc->requests = 0;
    sc->min_fair = INFINITY;
    for (size_t l = 0; l < o->n_loads; l++) {
        const sim_tune_load *m = &sc->load[l];
        sc->goodput_rps += m->goodput_rps;
        sc->ttft_p99_ms = fmax(sc->ttft_p99_ms, m->ttft_p99_ms);
        sc->tpot_p99_ms = fmax(sc->tpot_p99_ms, m->tpot_p99_ms);
        sc->refused += m->refused;
        sc->requests += m->requests;
        sc->min_fair = fmin(sc->min_fair, m->min_fair);
        if (m->min_fair < o->fair_floor) sc->violation += o->fair_floor - m->min_fair;
        if (o->slo_min > 0 && m->accepted_slo < o->slo_min)
            sc->violation += o->slo_min - m->accepted_slo;
        /* work still queued when the run stopped never met anything: the run did not settle */
        if (m->pending)
            sc->violation += (double)m->pending / (double)(m->requests ? m->requests : 1);
    }
    sc->feasible = sc->violation == 0;
    sc->done = true;
}

static size_t moved(const sim_tune_result *r, const sim_tune_cand *c)
{
    size_t n = 0;
    for (size_t k = 0; c->idx && r->start && k < r->n_knobs; k++) n += c->idx[k] != r->start[k];
    return n;
}

/* < 0: a better than b on rung k. */
int tune_rank_cmp(const sim_tune_result *r, const sim_tune_cand *a, const sim_tune_cand *b, int k)
{
    const sim_tune_score *x = &a->rung[k], *y = &b->rung[k];
    if (x->feasible != y->feasible) return x->feasible ? -1 : 1;
    if (!x->feasible && !rel_close(x->violation, y->violation))
        return x->violation < y->violation ? -1 : 1;
    if (!rel_close(x->goodput_rps, y->goodput_rps)) return x->goodput_rps > y->goodput_rps ? -1 : 1;
    if (!rel_close(x->ttft_p99_ms, y->ttft_p99_ms)) return x->ttft_p99_ms < y->ttft_p99_ms ? -1 : 1;
    if (x->refused != y->refused) return x->refused < y->refused ? -1 : 1;
    size_t ma = moved(r, a), mb = moved(r, b);
    if (ma != mb) return ma < mb ? -1 : 1;
    return strcmp(sched_policy_canonical(a->policy), sched_policy_canonical(b->policy));
}

static void run_pool(search *S, task *tasks, size_t nt)
{
    pool p = {.tasks = tasks, .n = nt, .o = S->o};
    pthread_mutex_init(&p.mu, NULL);
    int nth = S->jobs < (int)nt ? S->jobs : (int)nt;
    pthread_t th[256];
    int started = 0;
    for (int i = 1; i < nth && i < 256; i++)
        if (pthread_create(&th[started], NULL, worker, &p) == 0) started++;
    worker(&p);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&p.mu);
    S->r->runs += nt;
}

/* The DESIGN §7 scenarios (and overload at 4× capacity) for every whole-trace candidate: one
 * that fails any becomes infeasible — a default must not buy goodput with a scenario. */
int tune_judge_scenarios(search *S)
{
    static const char *const names[SIM_TUNE_SCENARIOS] = {
        "long-prompt", "two-tenants", "disconnects", "burst", "overload", "overload"};
    sim_tune_result *r = S->r;
    sim_trace tr[SIM_TUNE_SCENARIOS];
    sim_scenario scn[SIM_TUNE_SCENARIOS];
    memset(tr, 0, sizeof tr);
    int rc = 0;
    for (int i = 0; i < SIM_TUNE_SCENARIOS && !rc; i++) {
        const char *params[] = {"load=4"};
        rc = sim_gen_workload(&tr[i], names[i], params, i == SIM_TUNE_SCENARIOS - 1 ? 1 : 0,
                              S->o->run.svc, S->o->run.seed, &scn[i]);
    }
    task *tasks = rc ? NULL : calloc(r->n_cands * SIM_TUNE_SCENARIOS + 1, sizeof *tasks);
    if (!rc && !tasks) rc = -ENOMEM;
    size_t nt = 0;
    for (size_t c = 0; !rc && c < r->n_cands; c++) {
        if (!r->cands[c].rung[2].done || r->cands[c].scenarios_judged) continue;
        r->cands[c].scenarios_judged = true;
        r->cands[c].scenarios_passed = 0;
        for (int i = 0; i < SIM_TUNE_SCENARIOS; i++)
            tasks[nt++] = (task){.cand = &r->cands[c], .trace = &tr[i], .scn = &scn[i]};
    }
    if (!rc) run_pool(S, tasks, nt);
    for (size_t i = 0; !rc && i < nt; i++)
        if (tasks[i].rc < 0)
            rc = sim_err_setc(tasks[i].rc, "candidate %s: scenario: %s", tasks[i].cand->hash,
                              tasks[i].err);
    for (size_t i = 0; !rc && i < nt; i++) {
        sim_tune_cand *c = tasks[i].cand;
        if (tasks[i].verdict == 1) {
            c->scenarios_passed++;
            continue;
        }
        if (!c->scenario_failed[0])
            snprintf(c->scenario_failed, sizeof c->scenario_failed, "%s%s",
                     i % SIM_TUNE_SCENARIOS == SIM_TUNE_SCENARIOS - 1 ? "(load 4) " : "",
                     tasks[i].verdict_text);
        c->rung[2].violation += 1;
        c->rung[2].feasible = false;
    }
    free(tasks);
    for (int i = 0; i < SIM_TUNE_SCENARIOS; i++) sim_trace_free(&tr[i]);
    return rc;
}

/* Run every listed candidate not yet done on rung k, all loads, on the pool. */
int tune_evaluate(search *S, const size_t *which, size_t n, int k)
{
    sim_tune_result *r = S->r;
    size_t nl = S->o->n_loads;
    task *tasks = calloc(n * nl + 1, sizeof *tasks);
    if (!tasks) return -ENOMEM;
    size_t nt = 0;
    for (size_t i = 0; i < n; i++) {
        sim_tune_cand *c = &r->cands[which[i]];
        if (c->rung[k].done) continue;
        r->evaluated[k]++;
        if (S->same_as[k] != k && c->rung[S->same_as[k]].done) { /* same traces: same result */
            c->rung[k] = c->rung[S->same_as[k]];
            continue;
        }
        for (size_t l = 0; l < nl; l++)
            tasks[nt++] = (task){
                .cand = c, .trace = &S->traces[S->same_as[k]][l], .out = &c->rung[k].load[l]};
    }
    run_pool(S, tasks, nt);
    int rc = 0;
    for (size_t i = 0; i < nt && !rc; i++)
        if (tasks[i].rc < 0)
            rc = sim_err_setc(tasks[i].rc, "candidate %s: %s", tasks[i].cand->hash, tasks[i].err);
    for (size_t i = 0; i < n && !rc; i++) {
        sim_tune_cand *c = &r->cands[which[i]];
        if (!c->rung[k].done) score(S, &c->rung[k]);
    }
    free(tasks);
    return rc;
}
