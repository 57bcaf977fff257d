/* ringlm — simulator policy search (see tune.h for the method). SPDX-License-Identifier: MIT */
#include "sim/tune.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim/err.h"
#include "sim/gen.h"
#include "sim/report.h"

#define MAX_KNOBS      24
#define MAX_VALUES     64
#define MAX_SECTIONS   (SCHED_MAX_CLASSES + SCHED_MAX_TENANTS)
/* below this many requests a window is too noisy to screen on: every rung runs it all */
#define WINDOW_MIN_REQUESTS 2000

/* A knob as the search applies it: one key in one or more sections of the canonical text. */
typedef struct knob {
    char    key[48];
    char   *sections[MAX_SECTIONS];   /* "[scheduler]", "[class x]", "[tenant y]" */
    size_t  n_sections;
    double  num[MAX_VALUES];          /* numeric value (µs for durations), NAN when a word */
} knob;

void sim_tune_opts_defaults(sim_tune_opts *o)
{
    memset(o, 0, sizeof *o);
    o->loads[0] = 1;
    o->n_loads = 1;
    o->fair_floor = 0.9;
    o->slo_min = 0;
    o->jobs = 0;
    o->max_rounds = 3;
    o->finalists = 6;
    sim_options_defaults(&o->run);
    o->base_name = "default";
}

/* ---- spec ----------------------------------------------------------------------------- */

static bool class_key(const char *k)
{
    static const char *const keys[] = {"priority", "aging_per_s", "ttft_target", "tpot_target",
                                       "max_queue_wait", "latency_sensitive"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!strcmp(k, keys[i])) return true;
    return false;
}

static bool tenant_key(const char *k)
{
    static const char *const keys[] = {"weight", "max_queued_tokens", "max_kv_blocks", "token_rate_per_s"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!strcmp(k, keys[i])) return true;
    return false;
}

/* "1500ms" → 1500000 (µs), "512" → 512, "auto" → NAN; *unit gets the suffix. */
static double value_number(const char *v, char *unit, size_t ulen)
{
    char *e;
    double x = strtod(v, &e);
    if (e == v || !isfinite(x)) { if (unit) snprintf(unit, ulen, "%s", v); return NAN; }
    if (unit) snprintf(unit, ulen, "%s", e);
    if (!*e || !strcmp(e, "us")) return x;
    if (!strcmp(e, "ms")) return x * 1e3;
    if (!strcmp(e, "s")) return x * 1e6;
    return NAN;
}

static char *dup_section(const char *kind, const char *name)
{
    char buf[96];
    if (name) snprintf(buf, sizeof buf, "[%s %s]", kind, name);
    else snprintf(buf, sizeof buf, "[%s]", kind);
    return strdup(buf);
}

static int add_value(sim_tune_knob *k, const char *v)
{
    if (k->n_values == MAX_VALUES) return sim_err_set("--tune %s: more than %d values", k->name, MAX_VALUES);
    for (size_t i = 0; i < k->n_values; i++)
        if (!strcmp(k->values[i], v)) return 0;
    if (!(k->values[k->n_values] = strdup(v))) return -ENOMEM;
    k->n_values++;
    return 0;
}

/* "LO..HI": LO doubled while it stays <= HI (HI itself added when the doubling misses it). */
static int add_range(sim_tune_knob *k, const char *item, const char *dots)
{
    char lo_s[64], hi_s[64], ulo[16], uhi[16];
    snprintf(lo_s, sizeof lo_s, "%.*s", (int)(dots - item), item);
    snprintf(hi_s, sizeof hi_s, "%s", dots + 2);
    char *e;
    double lo = strtod(lo_s, &e);
    snprintf(ulo, sizeof ulo, "%s", e);
    double hi = strtod(hi_s, &e);
    snprintf(uhi, sizeof uhi, "%s", e);
    if (!(lo > 0) || !(hi >= lo) || !isfinite(hi) || strcmp(ulo, uhi) != 0 || isnan(value_number(lo_s, NULL, 0)))
        return sim_err_set("--tune %s=%s: a range is LO..HI with 0 < LO <= HI in the same unit (list 0 explicitly)",
                           k->name, item);
    for (double x = lo; x <= hi * (1 + 1e-9); x *= 2) {
        char v[64];
        snprintf(v, sizeof v, "%.10g%s", x, ulo);
        int rc = add_value(k, v);
        if (rc) return rc;
        if (x * 2 > hi * (1 + 1e-9) && x < hi * (1 - 1e-9)) {
            snprintf(v, sizeof v, "%.10g%s", hi, ulo);
            if ((rc = add_value(k, v))) return rc;
        }
    }
    return 0;
}

/* Set key = value in the given sections of canonical text (every key is present there). */
static char *set_keys(const char *text, const knob *kn, const char *value)
{
    size_t cap = strlen(text) + (strlen(value) + 2) * kn->n_sections + 1;
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t klen = strlen(kn->key), o = 0;
    bool in = false;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (*p == '[') {
            in = false;
            for (size_t s = 0; s < kn->n_sections; s++)
                if (strlen(kn->sections[s]) == len && !memcmp(p, kn->sections[s], len)) in = true;
        }
        if (in && len > klen + 3 && !memcmp(p, kn->key, klen) && !memcmp(p + klen, " = ", 3)) {
            o += (size_t)sprintf(out + o, "%s = %s\n", kn->key, value);
        } else {
            memcpy(out + o, p, len);
            o += len;
            out[o++] = '\n';
        }
        p += len + (nl ? 1 : 0);
    }
    out[o] = 0;
    return out;
}

static int parse_spec(const char *spec, const sched_policy *base, sim_tune_result *r, knob *kn)
{
    char *copy = strdup(spec), *save = NULL;
    if (!copy) return -ENOMEM;
    int rc = 0;
    for (char *item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save)) {
        while (*item == ' ') item++;
        if (!*item) continue;
        char *eq = strchr(item, '=');
        if (!eq || eq == item) { rc = sim_err_set("--tune %s: expected KNOB=VALUES", item); break; }
        if (r->n_knobs == MAX_KNOBS) { rc = sim_err_set("--tune: at most %d knobs", MAX_KNOBS); break; }
        *eq = 0;
        sim_tune_knob *k = &r->knobs[r->n_knobs];
        knob *q = &kn[r->n_knobs];
        memset(k, 0, sizeof *k);
        memset(q, 0, sizeof *q);
        r->n_knobs++;
        snprintf(k->name, sizeof k->name, "%s", item);
        for (size_t i = 0; i < r->n_knobs - 1; i++)
            if (!strcmp(r->knobs[i].name, k->name)) { rc = sim_err_set("--tune: %s named twice", k->name); goto out; }
        if (!(k->values = calloc(MAX_VALUES, sizeof *k->values))) { rc = -ENOMEM; break; }
        char *dot = strrchr(item, '.');
        const char *key = dot ? dot + 1 : item;
        snprintf(q->key, sizeof q->key, "%s", key);
        if (!dot) {
            if (class_key(key) || tenant_key(key)) {
                rc = sim_err_set("--tune %s: a class or tenant key needs its section (NAME.%s or *.%s)", item, key, key);
                break;
            }
            q->sections[q->n_sections++] = dup_section("scheduler", NULL);
        } else {
            *dot = 0;
            bool ck = class_key(key), tk = tenant_key(key);
            if (!ck && !tk) { rc = sim_err_set("--tune %s.%s: %s is not a class or tenant key", item, key, key); break; }
            if (!strcmp(item, "*")) {
                int n = ck ? sched_policy_n_classes(base) : sched_policy_n_tenants(base);
                for (int i = 0; i < n; i++)
                    q->sections[q->n_sections++] = dup_section(ck ? "class" : "tenant",
                                                               ck ? sched_policy_class(base, i)->name
                                                                  : sched_policy_tenant(base, i)->name);
                if (!n) { rc = sim_err_set("--tune *.%s: the base policy has no %s", key, ck ? "class" : "tenant"); break; }
            } else if (ck && sched_policy_class_index(base, item) >= 0) {
                q->sections[q->n_sections++] = dup_section("class", item);
            } else if (tk && sched_policy_tenant_index(base, item) >= 0) {
                q->sections[q->n_sections++] = dup_section("tenant", item);
            } else {
                rc = sim_err_set("--tune %s.%s: the base policy has no %s \"%s\"", item, key, ck ? "class" : "tenant", item);
                break;
            }
        }
        for (size_t s = 0; s < q->n_sections; s++)
            if (!q->sections[s]) { rc = -ENOMEM; goto out; }
        char *vsave = NULL;
        for (char *v = strtok_r(eq + 1, ",", &vsave); v; v = strtok_r(NULL, ",", &vsave)) {
            while (*v == ' ') v++;
            char *end = v + strlen(v);
            while (end > v && end[-1] == ' ') *--end = 0;
            if (!*v) continue;
            char *dots = strstr(v, "..");
            rc = dots ? add_range(k, v, dots) : add_value(k, v);
            if (rc) goto out;
        }
        if (!k->n_values) { rc = sim_err_set("--tune %s: no values", k->name); break; }
        /* every value must make a valid policy on its own */
        for (size_t i = 0; i < k->n_values; i++) {
            q->num[i] = value_number(k->values[i], NULL, 0);
            char *t = set_keys(sched_policy_canonical(base), q, k->values[i]);
            if (!t) { rc = -ENOMEM; goto out; }
            sched_policy *p = NULL;
            sched_policy_error pe = {0};
            int prc = sched_policy_parse(t, &p, &pe);
            free(t);
            sched_policy_free(p);
            if (prc < 0) { rc = sim_err_set("--tune %s=%s: %s", k->name, k->values[i], pe.reason); goto out; }
        }
    }
    if (!rc && !r->n_knobs) rc = sim_err_set("--tune: the spec names no knob");
out:
    free(copy);
    return rc;
}

int sim_tune_default_spec(const sched_policy *base, const sim_trace *t, char *buf, size_t len)
{
    bool used[SCHED_MAX_CLASSES] = {false};
    for (unsigned i = 0; i < t->n_classes; i++) {
        bool any = false;
        for (size_t j = 0; j < t->n && !any; j++) any = t->reqs[j].klass == i;
        int k = sched_policy_class_index(base, t->classes[i]);
        if (k < 0) k = sched_policy_class_index(base, NULL);
        if (any && k >= 0 && k < SCHED_MAX_CLASSES) used[k] = true;
    }
    int n = snprintf(buf, len, "token_budget=512..16384;prefill_chunk=256..8192;decode_reserve_tokens=0,64,256;"
                               "max_active_seqs=64..512");
    for (int i = 0; i < sched_policy_n_classes(base) && n >= 0 && (size_t)n < len; i++) {
        const sched_class_cfg *c = sched_policy_class(base, i);
        if (!c->ttft_target_us || !used[i]) continue;
        double ms = (double)c->ttft_target_us / 1000.0;
        n += snprintf(buf + n, len - (size_t)n, ";%s.max_queue_wait=0,%.0fms,%.0fms,%.0fms,%.0fms", c->name, ms / 4,
                      ms / 2, 3 * ms / 4, ms);
    }
    if (n >= 0 && (size_t)n < len && sched_policy_n_tenants(base) > 0)
        n += snprintf(buf + n, len - (size_t)n, ";*.max_queued_tokens=0,12500..400000");
    return n < 0 || (size_t)n >= len ? sim_err_set("--tune default: spec too long") : 0;
}

/* ---- traces for each rung and load ---------------------------------------------------- */

static int derive_trace(const sim_trace *src, double w0, double w1, double rate, uint64_t seed, sim_trace *dst)
{
    sim_trace_init(dst, src->source);
    for (unsigned i = 0; i < src->n_tenants; i++)
        if (sim_trace_tenant(dst, src->tenants[i]) < 0) return -ENOMEM;
    for (unsigned i = 0; i < src->n_classes; i++)
        if (sim_trace_class(dst, src->classes[i]) < 0) return -ENOMEM;
    dst->labelled = src->labelled;
    dst->has_real = src->has_real;
    dst->format = src->format;
    for (size_t i = 0; i < src->n; i++)
        if (sim_trace_push(dst, &src->reqs[i]) < 0) return -ENOMEM;
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
static void busiest_window(const sim_trace *t, double frac, double *w0, double *w1)
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
        if (sum > best) { best = sum; best_lo = lo; }
    }
    int64_t start = t->reqs[best_lo].arrival_us;
    if (start + w > last) start = last - w;
    *w0 = (double)start / 1e6;
    *w1 = (double)(start + w) / 1e6;
}

/* ---- evaluation ----------------------------------------------------------------------- */

typedef struct task {
    sim_tune_cand   *cand;
    const sim_trace *trace;
    sim_tune_load   *out;
    const sim_scenario *scn;     /* a scenario run: its verdict, not the load metrics */
    int              verdict;
    char             verdict_text[700];
    int              rc;
    char             err[256];
} task;

typedef struct pool {
    task            *tasks;
    size_t           n, next;
    pthread_mutex_t  mu;
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
            snprintf(t->verdict_text, sizeof t->verdict_text, "%s: %s", s.verdict_name, s.verdict_text);
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

typedef struct search {
    const sim_tune_opts *o;
    sim_tune_result     *r;
    knob                *kn;
    sim_trace            traces[SIM_TUNE_RUNGS][SIM_TUNE_MAX_LOADS];
    int                  same_as[SIM_TUNE_RUNGS];   /* rung whose traces this rung reuses */
    int                  jobs;
    const char          *base_text;
} search;

static double rel_close(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1, fmax(fabs(a), fabs(b))); }

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
        if (o->slo_min > 0 && m->accepted_slo < o->slo_min) sc->violation += o->slo_min - m->accepted_slo;
        /* work still queued when the run stopped never met anything: the run did not settle */
        if (m->pending) sc->violation += (double)m->pending / (double)(m->requests ? m->requests : 1);
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
static int rank_cmp(const sim_tune_result *r, const sim_tune_cand *a, const sim_tune_cand *b, int k)
{
    const sim_tune_score *x = &a->rung[k], *y = &b->rung[k];
    if (x->feasible != y->feasible) return x->feasible ? -1 : 1;
    if (!x->feasible && !rel_close(x->violation, y->violation)) return x->violation < y->violation ? -1 : 1;
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
static int judge_scenarios(search *S)
{
    static const char *const names[SIM_TUNE_SCENARIOS] = {"long-prompt", "two-tenants", "disconnects", "burst",
                                                          "overload", "overload"};
    sim_tune_result *r = S->r;
    sim_trace tr[SIM_TUNE_SCENARIOS];
    sim_scenario scn[SIM_TUNE_SCENARIOS];
    memset(tr, 0, sizeof tr);
    int rc = 0;
    for (int i = 0; i < SIM_TUNE_SCENARIOS && !rc; i++) {
        const char *params[] = {"load=4"};
        rc = sim_gen_workload(&tr[i], names[i], params, i == SIM_TUNE_SCENARIOS - 1 ? 1 : 0, S->o->run.svc,
                              S->o->run.seed, &scn[i]);
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
        if (tasks[i].rc < 0) rc = sim_err_setc(tasks[i].rc, "candidate %s: scenario: %s", tasks[i].cand->hash, tasks[i].err);
    for (size_t i = 0; !rc && i < nt; i++) {
        sim_tune_cand *c = tasks[i].cand;
        if (tasks[i].verdict == 1) { c->scenarios_passed++; continue; }
        if (!c->scenario_failed[0])
            snprintf(c->scenario_failed, sizeof c->scenario_failed, "%s%s", i % SIM_TUNE_SCENARIOS == SIM_TUNE_SCENARIOS - 1 ? "(load 4) " : "",
                     tasks[i].verdict_text);
        c->rung[2].violation += 1;
        c->rung[2].feasible = false;
    }
    free(tasks);
    for (int i = 0; i < SIM_TUNE_SCENARIOS; i++) sim_trace_free(&tr[i]);
    return rc;
}

/* Run every listed candidate not yet done on rung k, all loads, on the pool. */
static int evaluate(search *S, const size_t *which, size_t n, int k)
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
        if (S->same_as[k] != k && c->rung[S->same_as[k]].done) {   /* same traces: same result */
            c->rung[k] = c->rung[S->same_as[k]];
            continue;
        }
        for (size_t l = 0; l < nl; l++)
            tasks[nt++] = (task){.cand = c, .trace = &S->traces[S->same_as[k]][l], .out = &c->rung[k].load[l]};
    }
    run_pool(S, tasks, nt);
    int rc = 0;
    for (size_t i = 0; i < nt && !rc; i++)
        if (tasks[i].rc < 0) rc = sim_err_setc(tasks[i].rc, "candidate %s: %s", tasks[i].cand->hash, tasks[i].err);
    for (size_t i = 0; i < n && !rc; i++) {
        sim_tune_cand *c = &r->cands[which[i]];
        if (!c->rung[k].done) score(S, &c->rung[k]);
    }
    free(tasks);
    return rc;
}

/* The candidate with these value indices (made when new). Returns its index or -errno. */
static long candidate(search *S, const int *idx)
{
    sim_tune_result *r = S->r;
    for (size_t i = 0; i < r->n_cands; i++)
        if (r->cands[i].idx && !memcmp(r->cands[i].idx, idx, r->n_knobs * sizeof *idx)) return (long)i;
    char *text = strdup(S->base_text);
    if (!text) return -ENOMEM;
    size_t vlen = 0;
    char values[2048];
    values[0] = 0;
    for (size_t k = 0; k < r->n_knobs; k++) {
        const char *v = r->knobs[k].values[idx[k]];
        char *t = set_keys(text, &S->kn[k], v);
        free(text);
        if (!(text = t)) return -ENOMEM;
        int w = snprintf(values + vlen, sizeof values - vlen, "%s%s=%s", k ? " " : "", r->knobs[k].name, v);
        if (w > 0 && vlen + (size_t)w < sizeof values) vlen += (size_t)w;
    }
    sim_tune_cand c = {0};
    sched_policy_error pe = {0};
    int rc = sched_policy_parse(text, &c.policy, &pe);
    free(text);
    if (rc < 0) return sim_err_setc(rc, "--tune %s: %s (line %d)", values, pe.reason, pe.line);
    c.idx = malloc(r->n_knobs * sizeof *idx);
    c.values = strdup(values);
    if (!c.idx || !c.values) { free(c.idx); free(c.values); sched_policy_free(c.policy); return -ENOMEM; }
    memcpy(c.idx, idx, r->n_knobs * sizeof *idx);
    snprintf(c.hash, sizeof c.hash, "%s", sched_policy_hash_hex(c.policy));
    sim_tune_cand *nc = realloc(r->cands, (r->n_cands + 1) * sizeof *nc);
    if (!nc) { free(c.idx); free(c.values); sched_policy_free(c.policy); return -ENOMEM; }
    r->cands = nc;
    r->cands[r->n_cands] = c;
    return (long)r->n_cands++;
}

/* The base's own value of each knob, or the nearest listed one: where the search starts. */
static void start_point(const search *S, const sched_policy *base, int *idx)
{
    const char *text = sched_policy_canonical(base);
    for (size_t k = 0; k < S->r->n_knobs; k++) {
        const knob *q = &S->kn[k];
        const sim_tune_knob *kk = &S->r->knobs[k];
        idx[k] = 0;
        /* the base's value: the key's line in the first section */
        const char *sec = strstr(text, q->sections[0]);
        char line[64];
        snprintf(line, sizeof line, "\n%s = ", q->key);
        const char *at = sec ? strstr(sec, line) : NULL;
        if (!at) continue;
        char val[64];
        snprintf(val, sizeof val, "%s", at + strlen(line));
        char *nl = strchr(val, '\n');
        if (nl) *nl = 0;
        double x = value_number(val, NULL, 0);
        double best = INFINITY;
        for (size_t v = 0; v < kk->n_values; v++) {
            double d = isnan(x) || isnan(q->num[v]) ? (strcmp(val, kk->values[v]) ? INFINITY : 0) : fabs(q->num[v] - x);
            if (d < best) { best = d; idx[k] = (int)v; }
        }
    }
}

static int cmp_idx(const void *a, const void *b, void *ctx)
{
    const sim_tune_result *r = ((const void **)ctx)[0];
    int k = *(const int *)((const void **)ctx)[1];
    return rank_cmp(r, &r->cands[*(const size_t *)a], &r->cands[*(const size_t *)b], k);
}

/* Indices of the candidates done on rung k, best first (the base policy is not one). */
static size_t ranked(const sim_tune_result *r, int k, size_t *out)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n_cands; i++)
        if (r->cands[i].rung[k].done && !r->cands[i].is_base) out[n++] = i;
    const void *ctx[2] = {r, &k};
    qsort_r(out, n, sizeof *out, cmp_idx, ctx);
    return n;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void progress(const search *S, const char *phase, int k)
{
    if (!S->o->progress) return;
    const sim_tune_cand *b = NULL;
    for (size_t i = 0; i < S->r->n_cands; i++) {
        const sim_tune_cand *c = &S->r->cands[i];
        if (c->rung[k].done && !c->is_base && (!b || rank_cmp(S->r, c, b, k) < 0)) b = c;
    }
    if (!b) return;
    fprintf(S->o->progress, "tune: %s: %zu candidates run, best %s goodput %.2f req/s%s (%s)\n", phase, S->r->evaluated[k],
            b->hash, b->rung[k].goodput_rps, b->rung[k].feasible ? "" : " (infeasible)", b->values);
}

/* Coordinate search on rung 0: each knob over all its values, the others held. */
static int coordinate_search(search *S, int *cur)
{
    sim_tune_result *r = S->r;
    size_t which[MAX_VALUES];
    int *trial = malloc(r->n_knobs * sizeof *trial);
    if (!trial) return -ENOMEM;
    long c0 = candidate(S, cur);
    int rc = c0 < 0 ? (int)c0 : evaluate(S, (size_t[]){(size_t)c0}, 1, 0);
    long at = c0;
    for (int round = 0; !rc && round < S->o->max_rounds; round++) {
        bool moved = false;
        for (size_t k = 0; !rc && k < r->n_knobs; k++) {
            size_t n = 0;
            memcpy(trial, cur, r->n_knobs * sizeof *trial);
            for (size_t v = 0; v < r->knobs[k].n_values && !rc; v++) {
                trial[k] = (int)v;
                long ci = candidate(S, trial);
                if (ci < 0) rc = (int)ci;
                else which[n++] = (size_t)ci;
            }
            if (rc || (rc = evaluate(S, which, n, 0))) break;
            long best = at;
            for (size_t i = 0; i < n; i++)
                if (rank_cmp(r, &r->cands[which[i]], &r->cands[best], 0) < 0) best = (long)which[i];
            if (best != at) {
                at = best;
                memcpy(cur, r->cands[best].idx, r->n_knobs * sizeof *cur);
                moved = true;
            }
        }
        r->rounds = round + 1;
        if (!moved) break;
    }
    free(trial);
    return rc;
}

static void pareto(sim_tune_result *r, int k)
{
    for (size_t i = 0; i < r->n_cands; i++) {
        sim_tune_cand *a = &r->cands[i];
        a->pareto = false;
        if (!a->rung[k].done || !a->rung[k].feasible) continue;
        bool dominated = false;
        for (size_t j = 0; j < r->n_cands && !dominated; j++) {
            const sim_tune_cand *b = &r->cands[j];
            if (j == i || !b->rung[k].done || !b->rung[k].feasible) continue;
            const sim_tune_score *x = &a->rung[k], *y = &b->rung[k];
            bool ge = y->goodput_rps >= x->goodput_rps && y->ttft_p99_ms <= x->ttft_p99_ms &&
                      y->tpot_p99_ms <= x->tpot_p99_ms && y->refused <= x->refused;
            bool gt = y->goodput_rps > x->goodput_rps || y->ttft_p99_ms < x->ttft_p99_ms ||
                      y->tpot_p99_ms < x->tpot_p99_ms || y->refused < x->refused;
            /* equal on all four: one of them stands for both (the better ranked) */
            dominated = ge && (gt || rank_cmp(r, b, a, k) < 0);
        }
        a->pareto = !dominated;
    }
}

int sim_tune(const sim_trace *t, const sched_policy *base, const sim_tune_opts *o, sim_tune_result *r)
{
    memset(r, 0, sizeof *r);
    double t0 = now_s();
    if (!o->n_loads || o->n_loads > SIM_TUNE_MAX_LOADS) return sim_err_set("--tune: 1 to %d loads", SIM_TUNE_MAX_LOADS);
    for (size_t l = 0; l < o->n_loads; l++)
        if (!(o->loads[l] > 0) || !isfinite(o->loads[l])) return sim_err_set("--tune: load %g must be > 0", o->loads[l]);
    if (!t->n) return sim_err_set("--tune: the trace has no requests");
    search S = {.o = o, .r = r, .base_text = sched_policy_canonical(base)};
    int rc = 0;
    char spec[1024];
    if (!strcmp(o->spec, "default")) {
        if ((rc = sim_tune_default_spec(base, t, spec, sizeof spec))) return rc;
    } else {
        snprintf(spec, sizeof spec, "%s", o->spec);
    }
    snprintf(r->spec, sizeof r->spec, "%s", spec);
    snprintf(r->trace, sizeof r->trace, "%s", t->source);
    snprintf(r->service, sizeof r->service, "%s", o->run.svc ? o->run.svc->source : "?");
    snprintf(r->base_name, sizeof r->base_name, "%s", o->base_name ? o->base_name : "default");
    memcpy(r->loads, o->loads, sizeof r->loads);
    r->n_loads = o->n_loads;
    r->fair_floor = o->fair_floor;
    r->scenarios = o->scenarios;
    r->slo_min = o->slo_min;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    S.jobs = o->jobs > 0 ? o->jobs : (int)(ncpu > 0 ? ncpu : 1);
    if (S.jobs > 256) S.jobs = 256;
    r->jobs = S.jobs;
    r->knobs = calloc(MAX_KNOBS, sizeof *r->knobs);
    S.kn = calloc(MAX_KNOBS, sizeof *S.kn);
    int *cur = NULL;
    if (!r->knobs || !S.kn) { rc = -ENOMEM; goto out; }
    if ((rc = parse_spec(spec, base, r, S.kn))) goto out;

    /* rungs: the busiest eighth, the busiest quarter, everything (small traces: everything) */
    static const double frac[SIM_TUNE_RUNGS] = {0.125, 0.25, 1};
    for (int k = 0; k < SIM_TUNE_RUNGS; k++) {
        S.same_as[k] = k;
        r->window_s[k][0] = 0;
        r->window_s[k][1] = -1;
        if (frac[k] < 1 && t->n >= WINDOW_MIN_REQUESTS) busiest_window(t, frac[k], &r->window_s[k][0], &r->window_s[k][1]);
        else if (k > 0 && r->window_s[k - 1][1] < 0) { S.same_as[k] = S.same_as[k - 1]; continue; }
        for (size_t l = 0; l < o->n_loads; l++)
            if ((rc = derive_trace(t, r->window_s[k][0], r->window_s[k][1], o->loads[l], o->run.seed, &S.traces[k][l]))) goto out;
    }
    for (int k = 0; k < SIM_TUNE_RUNGS; k++)
        if (S.same_as[k] != k) { r->window_s[k][0] = r->window_s[S.same_as[k]][0]; r->window_s[k][1] = r->window_s[S.same_as[k]][1]; }

    /* the base policy itself, judged on the whole trace beside the finalists */
    sim_tune_cand bc = {.is_base = true};
    sched_policy_error pe = {0};
    if (sched_policy_parse(S.base_text, &bc.policy, &pe) < 0 || !(bc.values = strdup("(base policy)"))) {
        sched_policy_free(bc.policy);
        rc = -ENOMEM;
        goto out;
    }
    snprintf(bc.hash, sizeof bc.hash, "%s", sched_policy_hash_hex(bc.policy));
    if (!(r->cands = malloc(sizeof *r->cands))) { sched_policy_free(bc.policy); free(bc.values); rc = -ENOMEM; goto out; }
    r->cands[0] = bc;
    r->n_cands = 1;
    r->base = 0;

    if (!(cur = malloc(r->n_knobs * sizeof *cur))) { rc = -ENOMEM; goto out; }
    start_point(&S, base, cur);
    if (!(r->start = malloc(r->n_knobs * sizeof *r->start))) { rc = -ENOMEM; goto out; }
    memcpy(r->start, cur, r->n_knobs * sizeof *cur);
    if ((rc = coordinate_search(&S, cur))) goto out;
    progress(&S, "coordinate search on the screening window", 0);

    /* successive halving: the best third (at least 2 × finalists) on the longer window, then
     * the best `finalists` of those on the whole trace */
    size_t *order = malloc((r->n_cands + 1) * sizeof *order);
    if (!order) { rc = -ENOMEM; goto out; }
    size_t n = ranked(r, 0, order);
    size_t keep = n / 3 > 2 * o->finalists ? n / 3 : 2 * o->finalists;
    if (keep > n) keep = n;
    if (!(rc = evaluate(&S, order, keep, 1))) {
        progress(&S, "halving on the longer window", 1);
        n = ranked(r, 1, order);
        /* the base first (it is judged beside the finalists), then `finalists` at a time down
         * the longer window's ranking until one is feasible on the whole trace: a window can
         * hide what only the whole trace shows (a quota a burst overruns), and then the next
         * ones in line are the candidates worth the whole trace */
        size_t from = 0;
        rc = evaluate(&S, &r->base, 1, 2);
        while (!rc && from < n) {
            keep = o->finalists < n - from ? o->finalists : n - from;
            if (!(rc = evaluate(&S, order + from, keep, 2)) && o->scenarios) rc = judge_scenarios(&S);
            from += keep;
            bool any = false;
            for (size_t i = 0; i < from && !any; i++) any = r->cands[order[i]].rung[2].feasible;
            if (any) break;
        }
    }
    if (!rc) {
        n = ranked(r, 2, order);
        r->best = order[0];
        progress(&S, "finalists on the whole trace", 2);
        pareto(r, 2);
    }
    free(order);
out:
    r->wall_s = now_s() - t0;
    for (int k = 0; k < SIM_TUNE_RUNGS; k++)
        for (size_t l = 0; l < SIM_TUNE_MAX_LOADS; l++)
            sim_trace_free(&S.traces[k][l]);
    if (S.kn)
        for (size_t k = 0; k < MAX_KNOBS; k++)
            for (size_t s = 0; s < S.kn[k].n_sections; s++) free(S.kn[k].sections[s]);
    free(S.kn);
    free(cur);
    if (rc) sim_tune_result_free(r);
    return rc;
}

void sim_tune_result_free(sim_tune_result *r)
{
    if (r->knobs)
        for (size_t k = 0; k < MAX_KNOBS; k++) {
            if (r->knobs[k].values)
                for (size_t v = 0; v < r->knobs[k].n_values; v++) free(r->knobs[k].values[v]);
            free(r->knobs[k].values);
        }
    free(r->knobs);
    for (size_t i = 0; i < r->n_cands; i++) {
        free(r->cands[i].idx);
        free(r->cands[i].values);
        sched_policy_free(r->cands[i].policy);
    }
    free(r->cands);
    free(r->start);
    memset(r, 0, sizeof *r);
}

/* ---- reports -------------------------------------------------------------------------- */

static void loads_text(const sim_tune_result *r, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (size_t l = 0; l < r->n_loads && o < len; l++)
        o += (size_t)snprintf(buf + o, len - o, "%s×%g", l ? "," : "", r->loads[l]);
}

static void window_text(const sim_tune_result *r, int k, char *buf, size_t len)
{
    if (r->window_s[k][1] < 0) snprintf(buf, len, "whole trace");
    else snprintf(buf, len, "[%.0f s, %.0f s)", r->window_s[k][0], r->window_s[k][1]);
}

void sim_tune_table(FILE *f, const sim_tune_result *r)
{
    char lt[128], w0[64], w1[64];
    loads_text(r, lt, sizeof lt);
    window_text(r, 0, w0, sizeof w0);
    window_text(r, 1, w1, sizeof w1);
    fprintf(f, "tune %s at loads %s, service %s, base policy %s\n", r->trace, lt, r->service, r->base_name);
    fprintf(f, "spec %s\n", r->spec);
    fprintf(f, "coordinate search: %d pass(es), %zu candidates on %s; %zu on %s; %zu on the whole trace; "
               "%zu simulations on %d threads in %.1f s\n",
            r->rounds, r->evaluated[0], w0, r->evaluated[1], w1, r->evaluated[2], r->runs, r->jobs, r->wall_s);
    fprintf(f, "objective: goodput at SLO summed over the loads; constraint: every tenant >= %.2f of its fair share%s%s\n\n",
            r->fair_floor, r->slo_min > 0 ? ", accepted requests meeting their targets" : "",
            r->scenarios ? ", the DESIGN §7 scenarios and overload at ×4 PASS" : "");
    if (r->slo_min > 0) fprintf(f, "  (accepted-SLO floor %.2f)\n\n", r->slo_min);
    fprintf(f, "%-4s %-16s %12s %12s %12s %9s %9s  %s\n", "", "policy hash", "goodput r/s", "TTFT p99 ms", "TPOT p99 ms",
            "refused", "min fair", "knobs");
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < r->n_cands; i++) {
            const sim_tune_cand *c = &r->cands[i];
            const sim_tune_score *s = &c->rung[2];
            if (!s->done) continue;
            bool front = c->pareto || i == r->best;
            if (pass == 0 ? !front : (front || !c->is_base)) continue;
            const char *tag = i == r->best ? "best" : c->is_base ? "base" : c->pareto ? "pf" : "";
            fprintf(f, "%-4s %-16s %12.2f %12.1f %12.2f %8.1f%% %9.3f  %s%s\n", tag, c->hash, s->goodput_rps, s->ttft_p99_ms,
                    s->tpot_p99_ms, s->requests ? 100.0 * (double)s->refused / (double)s->requests : 0, s->min_fair,
                    c->values, s->feasible ? "" : " [infeasible]");
            if (c->scenario_failed[0]) fprintf(f, "     scenario failed: %s\n", c->scenario_failed);
        }
    fprintf(f, "\n(pf: on the Pareto front of goodput, TTFT p99, TPOT p99 and refusals among the whole-trace runs; "
               "figures summed or worst over the loads)\n\nbest per load:\n");
    const sim_tune_cand *b = &r->cands[r->best], *base = &r->cands[r->base];
    fprintf(f, "%-6s %10s %14s %10s %12s %12s %9s %9s\n", "load", "offered", "goodput best", "base", "SLO best",
            "TTFT99 best", "refused", "min fair");
    for (size_t l = 0; l < r->n_loads; l++) {
        const sim_tune_load *m = &b->rung[2].load[l], *mb = &base->rung[2].load[l];
        fprintf(f, "×%-5g %10.2f %14.2f %10.2f %11.1f%% %12.1f %8.1f%% %9.3f\n", r->loads[l], m->offered_rps,
                m->goodput_rps, mb->goodput_rps, 100 * m->slo_attainment, m->ttft_p99_ms,
                m->requests ? 100.0 * (double)m->refused / (double)m->requests : 0, m->min_fair);
    }
}

static json_t *score_json(const sim_tune_result *r, const sim_tune_score *s)
{
    json_t *loads = json_array();
    for (size_t l = 0; l < r->n_loads; l++) {
        const sim_tune_load *m = &s->load[l];
        json_array_append_new(loads, json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:f,s:s}", "load", r->loads[l],
                                               "offered_rps", m->offered_rps, "goodput_rps", m->goodput_rps,
                                               "slo_attainment", m->slo_attainment, "accepted_slo", m->accepted_slo,
                                               "ttft_p99_ms", m->ttft_p99_ms, "tpot_p99_ms", m->tpot_p99_ms,
                                               "requests", (json_int_t)m->requests, "refused", (json_int_t)m->refused,
                                               "pending", (json_int_t)m->pending, "min_fair_share", m->min_fair,
                                               "min_fair_tenant", m->min_fair_tenant));
    }
    return json_pack("{s:b,s:f,s:f,s:f,s:f,s:I,s:f,s:o}", "feasible", s->feasible, "violation", s->violation,
                     "goodput_rps", s->goodput_rps, "ttft_p99_ms", s->ttft_p99_ms, "tpot_p99_ms", s->tpot_p99_ms,
                     "refused", (json_int_t)s->refused, "min_fair_share", s->min_fair, "loads", loads);
}

static json_t *cand_json(const sim_tune_result *r, const sim_tune_cand *c)
{
    json_t *o = json_pack("{s:s,s:b,s:b}", "hash", c->hash, "base", c->is_base, "pareto", c->pareto);
    if (c->scenarios_judged) {
        json_object_set_new(o, "scenarios_passed", json_integer(c->scenarios_passed));
        if (c->scenario_failed[0]) json_object_set_new(o, "scenario_failed", json_string(c->scenario_failed));
    }
    json_t *vals = json_object();
    if (c->idx)
        for (size_t k = 0; k < r->n_knobs; k++)
            json_object_set_new(vals, r->knobs[k].name, json_string(r->knobs[k].values[c->idx[k]]));
    json_object_set_new(o, "values", vals);
    static const char *const names[SIM_TUNE_RUNGS] = {"screen", "window", "full"};
    for (int k = 0; k < SIM_TUNE_RUNGS; k++)
        if (c->rung[k].done) json_object_set_new(o, names[k], score_json(r, &c->rung[k]));
    return o;
}

json_t *sim_tune_json(const sim_tune_result *r)
{
    json_t *loads = json_array(), *knobs = json_array(), *cands = json_array(), *front = json_array();
    for (size_t l = 0; l < r->n_loads; l++) json_array_append_new(loads, json_real(r->loads[l]));
    for (size_t k = 0; k < r->n_knobs; k++) {
        json_t *v = json_array();
        for (size_t i = 0; i < r->knobs[k].n_values; i++) json_array_append_new(v, json_string(r->knobs[k].values[i]));
        json_array_append_new(knobs, json_pack("{s:s,s:o}", "name", r->knobs[k].name, "values", v));
    }
    for (size_t i = 0; i < r->n_cands; i++) {
        json_array_append_new(cands, cand_json(r, &r->cands[i]));
        if (r->cands[i].pareto) json_array_append_new(front, json_string(r->cands[i].hash));
    }
    json_t *windows = json_array();
    for (int k = 0; k < SIM_TUNE_RUNGS; k++)
        json_array_append_new(windows, json_pack("[f,f]", r->window_s[k][0], r->window_s[k][1]));
    const sim_tune_cand *b = &r->cands[r->best];
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:f,s:f,s:o,s:o,s:{s:I,s:I,s:I},s:I,s:i,s:s,s:s,s:s,s:O,s:o,s:o}",
                     "trace", r->trace, "service", r->service, "base_policy", r->base_name, "spec", r->spec, "loads", loads,
                     "fair_floor", r->fair_floor, "slo_min", r->slo_min, "knobs", knobs, "windows_s", windows,
                     "evaluated", "screen", (json_int_t)r->evaluated[0], "window", (json_int_t)r->evaluated[1], "full",
                     (json_int_t)r->evaluated[2], "simulations", (json_int_t)r->runs, "rounds", r->rounds,
                     "best_hash", b->hash, "best_values", b->values, "best_policy", sched_policy_canonical(b->policy),
                     "best", json_array_get(cands, r->best), "pareto", front,
                     "candidates", cands);
}

int sim_tune_plot(const char *dir, const sim_tune_result *r, FILE *note)
{
    if (mkdir(dir, 0777) < 0 && errno != EEXIST) return sim_err_setc(-errno, "%s: %s", dir, strerror(errno));
    char path[1024], gp[1024];
    snprintf(path, sizeof path, "%s/tune.dat", dir);
    FILE *f = fopen(path, "w");
    if (!f) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
    /* index 0: whole-trace candidates off the front; 1: the front; 2: the best; 3: the base */
    for (int blk = 0; blk < 4; blk++) {
        fprintf(f, "# %s: goodput_rps ttft_p99_ms tpot_p99_ms refused hash\n",
                blk == 0 ? "dominated" : blk == 1 ? "pareto" : blk == 2 ? "best" : "base");
        bool any = false;
        for (size_t i = 0; i < r->n_cands; i++) {
            const sim_tune_cand *c = &r->cands[i];
            const sim_tune_score *s = &c->rung[2];
            if (!s->done) continue;
            bool in = blk == 0 ? !c->pareto && !c->is_base : blk == 1 ? c->pareto : blk == 2 ? i == r->best : c->is_base;
            if (!in) continue;
            fprintf(f, "%.4f %.3f %.3f %zu %s\n", s->goodput_rps, s->ttft_p99_ms, s->tpot_p99_ms, s->refused, c->hash);
            any = true;
        }
        if (!any) fprintf(f, "nan nan nan nan -\n");
        fprintf(f, "\n\n");
    }
    fclose(f);
    snprintf(gp, sizeof gp, "%s/plots-tune.gp", dir);
    if (!(f = fopen(gp, "w"))) return sim_err_setc(-errno, "%s: %s", gp, strerror(errno));
    char lt[128];
    loads_text(r, lt, sizeof lt);
    fprintf(f, "# ringlm-sim --tune: whole-trace candidates; run: gnuplot %s\ncd '%s'\nset grid\nset key top left\n", gp, dir);
    const char *terms[2][2] = {{"pngcairo size 1000,600 noenhanced", "png"}, {"svg size 1000,600 noenhanced", "svg"}};
    for (int k = 0; k < 2; k++)
        fprintf(f, "set terminal %s\nset output 'tune-pareto.%s'\nset title 'Policy search on %s at loads %s'\n"
                   "set xlabel 'TTFT p99, worst load (ms)'\nset ylabel 'goodput at SLO, summed over loads (req/s)'\n"
                   "set logscale x\nplot 'tune.dat' index 0 using 2:1 with points pt 6 ps 1.5 title 'candidate', "
                   "'' index 1 using 2:1 with linespoints pt 7 ps 1.5 lw 2 title 'Pareto front', "
                   "'' index 2 using 2:1 with points pt 3 ps 3 lw 2 title 'best', "
                   "'' index 3 using 2:1 with points pt 5 ps 2 title 'base policy'\nunset logscale x\n",
                terms[k][0], terms[k][1], r->trace, lt);
    fclose(f);
    return sim_report_gnuplot(dir, gp, "tune", note);
}

int sim_tune_write_policy(const char *path, const sim_tune_result *r)
{
    const sim_tune_cand *b = &r->cands[r->best];
    FILE *f = fopen(path, "w");
    if (!f) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
    char lt[128];
    loads_text(r, lt, sizeof lt);
    fprintf(f, "# tuned by ringlm-sim --tune on %s at loads %s (service: %s), base policy %s\n", r->trace, lt, r->service,
            r->base_name);
    fprintf(f, "# searched: %s\n", r->spec);
    fprintf(f, "# chosen: %s\n", b->values);
    fprintf(f, "# goodput at SLO %.2f req/s summed over the loads (base policy: %.2f); every tenant >= %.2f of its fair share%s\n",
            b->rung[2].goodput_rps, r->cands[r->base].rung[2].goodput_rps, r->fair_floor,
            r->scenarios ? b->rung[2].feasible ? "; the DESIGN §7 scenarios and overload at ×4 PASS" : "; NOT feasible" : "");
    fprintf(f, "# policy hash %s\n%s", b->hash, sched_policy_canonical(b->policy));
    if (fclose(f) != 0) return sim_err_setc(-EIO, "%s: write error", path);
    return 0;
}

int sim_tune_cli(const sim_trace *t, const sched_policy *base, const sim_tune_opts *o, bool json, const char *plot_dir,
                 const char *out_path)
{
    sim_tune_result r;
    int rc = sim_tune(t, base, o, &r);
    if (rc < 0) { fprintf(stderr, "ringlm-sim: %s\n", sim_err()); return 1; }
    int status = 0;
    if (json) {
        json_t *j = sim_tune_json(&r);
        json_object_set_new(j, "policy_file", json_string(out_path));
        char *s = j ? json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) : NULL;
        if (s) { fputs(s, stdout); fputc('\n', stdout); free(s); }
        else status = 1;
        json_decref(j);
    } else {
        sim_tune_table(stdout, &r);
    }
    if (plot_dir && (rc = sim_tune_plot(plot_dir, &r, stderr)) < 0 && rc != -ENOENT) {
        fprintf(stderr, "ringlm-sim: %s\n", sim_err());
        status = 1;
    }
    if ((rc = sim_tune_write_policy(out_path, &r)) < 0) {
        fprintf(stderr, "ringlm-sim: %s\n", sim_err());
        status = 1;
    } else if (!json) {
        printf("\nbest policy written to %s (hash %s)\n", out_path, r.cands[r.best].hash);
    }
    sim_tune_result_free(&r);
    return status;
}
