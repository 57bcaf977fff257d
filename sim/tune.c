/* ringlm — simulator policy search: the spec (which knobs, which values) and the optimiser
 * (coordinate search, successive halving, the Pareto front); see tune.h for the method.
 * Running and ranking candidates is tune_eval.c, the reports tune_report.c.
 * SPDX-License-Identifier: MIT */
#include "sim/tune.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sim/err.h"
#include "sim/tune_internal.h"

/* below this many requests a window is too noisy to screen on: every rung runs it all */
#define WINDOW_MIN_REQUESTS 2000

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
    o->pairs = true;
    sim_options_defaults(&o->run);
    o->base_name = "default";
}

/* ---- spec ----------------------------------------------------------------------------- */

static bool class_key(const char *k)
{
    static const char *const keys[] = {"priority",    "aging_per_s",    "ttft_target",
                                       "tpot_target", "max_queue_wait", "latency_sensitive"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!strcmp(k, keys[i])) return true;
    return false;
}

static bool tenant_key(const char *k)
{
    static const char *const keys[] = {"weight", "max_queued_tokens", "max_kv_blocks",
                                       "token_rate_per_s"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!strcmp(k, keys[i])) return true;
    return false;
}

/* "1500ms" → 1500000 (µs), "512" → 512, "auto" → NAN; *unit gets the suffix. */
static double value_number(const char *v, char *unit, size_t ulen)
{
    char *e;
    double x = strtod(v, &e);
    if (e == v || !isfinite(x)) {
        if (unit) snprintf(unit, ulen, "%s", v);
        return NAN;
    }
    if (unit) snprintf(unit, ulen, "%s", e);
    if (!*e || !strcmp(e, "us")) return x;
    if (!strcmp(e, "ms")) return x * 1e3;
    if (!strcmp(e, "s")) return x * 1e6;
    return NAN;
}

static char *dup_section(const char *kind, const char *name)
{
    char buf[96];
    if (name)
        snprintf(buf, sizeof buf, "[%s %s]", kind, name);
    else
        snprintf(buf, sizeof buf, "[%s]", kind);
    return strdup(buf);
}

static int add_value(sim_tune_knob *k, const char *v)
{
    if (k->n_values == MAX_VALUES)
        return sim_err_set("--tune %s: more than %d values", k->name, MAX_VALUES);
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
    if (!(lo > 0) || !(hi >= lo) || !isfinite(hi) || strcmp(ulo, uhi) != 0 ||
        isnan(value_number(lo_s, NULL, 0)))
        return sim_err_set("--tune %s=%s: a range is LO..HI with 0 < LO <= HI in the same unit "
                           "(list 0 explicitly)",
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
        if (!eq || eq == item) {
            rc = sim_err_set("--tune %s: expected KNOB=VALUES", item);
            break;
        }
        if (r->n_knobs == MAX_KNOBS) {
            rc = sim_err_set("--tune: at most %d knobs", MAX_KNOBS);
            break;
        }
        *eq = 0;
        sim_tune_knob *k = &r->knobs[r->n_knobs];
        knob *q = &kn[r->n_knobs];
        memset(k, 0, sizeof *k);
        memset(q, 0, sizeof *q);
        r->n_knobs++;
        snprintf(k->name, sizeof k->name, "%s", item);
        for (size_t i = 0; i < r->n_knobs - 1; i++)
            if (!strcmp(r->knobs[i].name, k->name)) {
                rc = sim_err_set("--tune: %s named twice", k->name);
                goto out;
            }
        if (!(k->values = calloc(MAX_VALUES, sizeof *k->values))) {
            rc = -ENOMEM;
            break;
        }
        char *dot = strrchr(item, '.');
        const char *key = dot ? dot + 1 : item;
        snprintf(q->key, sizeof q->key, "%s", key);
        if (!dot) {
            if (class_key(key) || tenant_key(key)) {
                rc = sim_err_set(
                    "--tune %s: a class or tenant key needs its section (NAME.%s or *.%s)", item,
                    key, key);
                break;
            }
            q->sections[q->n_sections++] = dup_section("scheduler", NULL);
        } else {
            *dot = 0;
            bool ck = class_key(key), tk = tenant_key(key);
            if (!ck && !tk) {
                rc = sim_err_set("--tune %s.%s: %s is not a class or tenant key", item, key, key);
                break;
            }
            if (!strcmp(item, "*")) {
                int n = ck ? sched_policy_n_classes(base) : sched_policy_n_tenants(base);
                for (int i = 0; i < n; i++)
                    q->sections[q->n_sections++] = dup_section(
                        ck ? "class" : "tenant", ck ? sched_policy_class(base, i)->name
                                                    : sched_policy_tenant(base, i)->name);
                if (!n) {
                    rc = sim_err_set("--tune *.%s: the base policy has no %s", key,
                                     ck ? "class" : "tenant");
                    break;
                }
            } else if (ck && sched_policy_class_index(base, item) >= 0) {
                q->sections[q->n_sections++] = dup_section("class", item);
            } else if (tk && sched_policy_tenant_index(base, item) >= 0) {
                q->sections[q->n_sections++] = dup_section("tenant", item);
            } else {
                rc = sim_err_set("--tune %s.%s: the base policy has no %s \"%s\"", item, key,
                                 ck ? "class" : "tenant", item);
                break;
            }
        }
        for (size_t s = 0; s < q->n_sections; s++)
            if (!q->sections[s]) {
                rc = -ENOMEM;
                goto out;
            }
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
        if (!k->n_values) {
            rc = sim_err_set("--tune %s: no values", k->name);
            break;
        }
        /* every value must make a valid policy on its own */
        for (size_t i = 0; i < k->n_values; i++) {
            q->num[i] = value_number(k->values[i], NULL, 0);
            char *t = set_keys(sched_policy_canonical(base), q, k->values[i]);
            if (!t) {
                rc = -ENOMEM;
                goto out;
            }
            sched_policy *p = NULL;
            sched_policy_error pe = {0};
            int prc = sched_policy_parse(t, &p, &pe);
            free(t);
            sched_policy_free(p);
            if (prc < 0) {
                rc = sim_err_set("--tune %s=%s: %s", k->name, k->values[i], pe.reason);
                goto out;
            }
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
    int n =
        snprintf(buf, len,
                 "token_budget=512..16384;prefill_chunk=256..8192;decode_reserve_tokens=0,64,256;"
                 "max_active_seqs=64..512");
    for (int i = 0; i < sched_policy_n_classes(base) && n >= 0 && (size_t)n < len; i++) {
        const sched_class_cfg *c = sched_policy_class(base, i);
        if (!c->ttft_target_us || !used[i]) continue;
        double ms = (double)c->ttft_target_us / 1000.0;
        /* up to a little past the target: admission keeps 15% headroom under the bound */
        n += snprintf(buf + n, len - (size_t)n,
                      ";%s.max_queue_wait=0,%.0fms,%.0fms,%.0fms,%.0fms,%.0fms", c->name, ms / 4,
                      ms / 2, 3 * ms / 4, ms, 9 * ms / 8);
    }
    if (n >= 0 && (size_t)n < len && sched_policy_n_tenants(base) > 0)
        n += snprintf(buf + n, len - (size_t)n, ";*.max_queued_tokens=0,12500..400000");
    return n < 0 || (size_t)n >= len ? sim_err_set("--tune default: spec too long") : 0;
}

/* The candidate with these value indices (made when new). Returns its index or -errno. */
static long candidate(search *S, const int *idx)
{
    sim_tune_result *r = S->r;
    for (size_t i = 0; i < r->n_cands; i++)
        if (r->cands[i].idx && !memcmp(r->cands[i].idx, idx, r->n_knobs * sizeof *idx))
            return (long)i;
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
        int w = snprintf(values + vlen, sizeof values - vlen, "%s%s=%s", k ? " " : "",
                         r->knobs[k].name, v);
        if (w > 0 && vlen + (size_t)w < sizeof values) vlen += (size_t)w;
    }
    sim_tune_cand c = {0};
    sched_policy_error pe = {0};
    int rc = sched_policy_parse(text, &c.policy, &pe);
    free(text);
    if (rc < 0) return sim_err_setc(rc, "--tune %s: %s (line %d)", values, pe.reason, pe.line);
    c.idx = malloc(r->n_knobs * sizeof *idx);
    c.values = strdup(values);
    if (!c.idx || !c.values) {
        free(c.idx);
        free(c.values);
        sched_policy_free(c.policy);
        return -ENOMEM;
    }
    memcpy(c.idx, idx, r->n_knobs * sizeof *idx);
    snprintf(c.hash, sizeof c.hash, "%s", sched_policy_hash_hex(c.policy));
    sim_tune_cand *nc = realloc(r->cands, (r->n_cands + 1) * sizeof *nc);
    if (!nc) {
        free(c.idx);
        free(c.values);
        sched_policy_free(c.policy);
        return -ENOMEM;
    }
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
            double d = isnan(x) || isnan(q->num[v]) ? (strcmp(val, kk->values[v]) ? INFINITY : 0)
                                                    : fabs(q->num[v] - x);
            if (d < best) {
                best = d;
                idx[k] = (int)v;
            }
        }
    }
}

static int cmp_idx(const void *a, const void *b, void *ctx)
{
    const sim_tune_result *r = ((const void **)ctx)[0];
    int k = *(const int *)((const void **)ctx)[1];
    return tune_rank_cmp(r, &r->cands[*(const size_t *)a], &r->cands[*(const size_t *)b], k);
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
        if (c->rung[k].done && !c->is_base && (!b || tune_rank_cmp(S->r, c, b, k) < 0)) b = c;
    }
    if (!b) return;
    fprintf(S->o->progress, "tune: %s: %zu candidates run, best %s goodput %.2f req/s%s (%s)\n",
            phase, S->r->evaluated[k], b->hash, b->rung[k].goodput_rps,
            b->rung[k].feasible ? "" : " (infeasible)", b->values);
}

/* Evaluate the candidates in which[0..n) on rung 0 and move to the best of them when it ranks
 * above the candidate at `*at`.  Returns 1 when it moved, 0 when not, or -errno. */
static int move_to_best(search *S, int *cur, long *at, const size_t *which, size_t n)
{
    sim_tune_result *r = S->r;
    int rc = tune_evaluate(S, which, n, 0);
    if (rc) return rc;
    long best = *at;
    for (size_t i = 0; i < n; i++)
        if (tune_rank_cmp(r, &r->cands[which[i]], &r->cands[best], 0) < 0) best = (long)which[i];
    if (best == *at) return 0;
    *at = best;
    memcpy(cur, r->cands[best].idx, r->n_knobs * sizeof *cur);
    return 1;
}

/* Pairwise moves from cur: every pair of knobs, each one value up or down its list, together
 * (4 per pair).  Coordinate search stops on a ridge — two knobs that only pay off moved
 * together, such as a larger token budget that needs a longer queue-wait bound to be fed — and
 * these are the moves that climb it. */
static int pairwise_moves(search *S, int *cur, long *at)
{
    sim_tune_result *r = S->r;
    size_t nk = r->n_knobs, n = 0, cap = nk * (nk - 1) * 2 + 1;
    size_t *which = malloc(cap * sizeof *which);
    int *trial = malloc(nk * sizeof *trial);
    int rc = which && trial ? 0 : -ENOMEM;
    for (size_t a = 0; !rc && a < nk; a++)
        for (size_t b = a + 1; !rc && b < nk; b++)
            for (int da = -1; !rc && da <= 1; da += 2)
                for (int db = -1; !rc && db <= 1; db += 2) {
                    int va = cur[a] + da, vb = cur[b] + db;
                    if (va < 0 || vb < 0 || va >= (int)r->knobs[a].n_values ||
                        vb >= (int)r->knobs[b].n_values)
                        continue;
                    memcpy(trial, cur, nk * sizeof *trial);
                    trial[a] = va;
                    trial[b] = vb;
                    long ci = candidate(S, trial);
                    if (ci < 0)
                        rc = (int)ci;
                    else
                        which[n++] = (size_t)ci;
                }
    if (!rc && n) {
        size_t before = r->evaluated[0];
        rc = move_to_best(S, cur, at, which, n);
        r->pair_evaluated += r->evaluated[0] - before;
        if (rc == 1) r->pair_moves++;
    }
    free(which);
    free(trial);
    return rc;
}

/* Coordinate search on rung 0: each knob over all its values, the others held, pass after
 * pass; when a pass moves nothing, or after the last pass (and opts.pairs), the pairwise
 * moves, and coordinate search again from where one of them leads.  Every step moves to a strictly better-ranked candidate
 * of a finite set, so it ends; max_rounds bounds the passes. */
static int coordinate_search(search *S, int *cur)
{
    sim_tune_result *r = S->r;
    size_t which[MAX_VALUES];
    int *trial = malloc(r->n_knobs * sizeof *trial);
    if (!trial) return -ENOMEM;
    long c0 = candidate(S, cur);
    int rc = c0 < 0 ? (int)c0 : tune_evaluate(S, (size_t[]){(size_t)c0}, 1, 0);
    long at = c0;
    for (int round = 0; !rc && round < S->o->max_rounds; round++) {
        bool moved = false;
        for (size_t k = 0; !rc && k < r->n_knobs; k++) {
            size_t n = 0;
            memcpy(trial, cur, r->n_knobs * sizeof *trial);
            for (size_t v = 0; v < r->knobs[k].n_values && !rc; v++) {
                trial[k] = (int)v;
                long ci = candidate(S, trial);
                if (ci < 0)
                    rc = (int)ci;
                else
                    which[n++] = (size_t)ci;
            }
            if (rc) break;
            int m = move_to_best(S, cur, &at, which, n);
            if (m < 0)
                rc = m;
            else if (m)
                moved = true;
        }
        r->rounds = round + 1;
        /* a pass that moved nothing is a local optimum of single moves; so is where the last
         * pass leaves off, as far as this search will look */
        if (!rc && (!moved || round + 1 == S->o->max_rounds) && S->o->pairs && r->n_knobs > 1) {
            int m = pairwise_moves(S, cur, &at);
            if (m < 0)
                rc = m;
            else
                moved = m;
        }
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
            dominated = ge && (gt || tune_rank_cmp(r, b, a, k) < 0);
        }
        a->pareto = !dominated;
    }
}

int sim_tune(const sim_trace *t, const sched_policy *base, const sim_tune_opts *o,
             sim_tune_result *r)
{
    memset(r, 0, sizeof *r);
    double t0 = now_s();
    if (!o->n_loads || o->n_loads > SIM_TUNE_MAX_LOADS)
        return sim_err_set("--tune: 1 to %d loads", SIM_TUNE_MAX_LOADS);
    for (size_t l = 0; l < o->n_loads; l++)
        if (!(o->loads[l] > 0) || !isfinite(o->loads[l]))
            return sim_err_set("--tune: load %g must be > 0", o->loads[l]);
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
    if (!r->knobs || !S.kn) {
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = parse_spec(spec, base, r, S.kn))) goto out;

    /* rungs: the busiest eighth, the busiest quarter, everything (small traces: everything) */
    static const double frac[SIM_TUNE_RUNGS] = {0.125, 0.25, 1};
    for (int k = 0; k < SIM_TUNE_RUNGS; k++) {
        S.same_as[k] = k;
        r->window_s[k][0] = 0;
        r->window_s[k][1] = -1;
        if (frac[k] < 1 && t->n >= WINDOW_MIN_REQUESTS)
            tune_busiest_window(t, frac[k], &r->window_s[k][0], &r->window_s[k][1]);
        else if (k > 0 && r->window_s[k - 1][1] < 0) {
            S.same_as[k] = S.same_as[k - 1];
            continue;
        }
        for (size_t l = 0; l < o->n_loads; l++)
            if ((rc = tune_derive_trace(t, r->window_s[k][0], r->window_s[k][1], o->loads[l],
                                        o->run.seed, &S.traces[k][l])))
                goto out;
    }
    /* what no candidate can pass at each load: tells a search that found little from one that
     * had little to find */
    for (size_t l = 0; l < o->n_loads; l++) {
        sim_tune_bound tb;
        r->bound_rps[l] = NAN;
        if (o->run.svc &&
            sim_tune_goodput_bound(&S.traces[S.same_as[2]][l], o->run.svc, base, 60, &tb) == 0)
            r->bound_rps[l] = tb.goodput_rps;
    }
    for (int k = 0; k < SIM_TUNE_RUNGS; k++)
        if (S.same_as[k] != k) {
            r->window_s[k][0] = r->window_s[S.same_as[k]][0];
            r->window_s[k][1] = r->window_s[S.same_as[k]][1];
        }

    /* the base policy itself, judged on the whole trace beside the finalists */
    sim_tune_cand bc = {.is_base = true};
    sched_policy_error pe = {0};
    if (sched_policy_parse(S.base_text, &bc.policy, &pe) < 0 ||
        !(bc.values = strdup("(base policy)"))) {
        sched_policy_free(bc.policy);
        rc = -ENOMEM;
        goto out;
    }
    snprintf(bc.hash, sizeof bc.hash, "%s", sched_policy_hash_hex(bc.policy));
    if (!(r->cands = malloc(sizeof *r->cands))) {
        sched_policy_free(bc.policy);
        free(bc.values);
        rc = -ENOMEM;
        goto out;
    }
    r->cands[0] = bc;
    r->n_cands = 1;
    r->base = 0;

    if (!(cur = malloc(r->n_knobs * sizeof *cur))) {
        rc = -ENOMEM;
        goto out;
    }
    start_point(&S, base, cur);
    if (!(r->start = malloc(r->n_knobs * sizeof *r->start))) {
        rc = -ENOMEM;
        goto out;
    }
    memcpy(r->start, cur, r->n_knobs * sizeof *cur);
    if ((rc = coordinate_search(&S, cur))) goto out;
    progress(&S, "coordinate search on the screening window", 0);

    /* successive halving: the best third (at least 2 × finalists) on the longer window, then
     * the best `finalists` of those on the whole trace */
    size_t *order = malloc((r->n_cands + 1) * sizeof *order);
    if (!order) {
        rc = -ENOMEM;
        goto out;
    }
    size_t n = ranked(r, 0, order);
    size_t keep = n / 3 > 2 * o->finalists ? n / 3 : 2 * o->finalists;
    if (keep > n) keep = n;
    if (!(rc = tune_evaluate(&S, order, keep, 1))) {
        progress(&S, "halving on the longer window", 1);
        n = ranked(r, 1, order);
        /* the base first (it is judged beside the finalists), then `finalists` at a time down
         * the longer window's ranking until one is feasible on the whole trace: a window can
         * hide what only the whole trace shows (a quota a burst overruns), and then the next
         * ones in line are the candidates worth the whole trace */
        size_t from = 0;
        rc = tune_evaluate(&S, &r->base, 1, 2);
        while (!rc && from < n) {
            keep = o->finalists < n - from ? o->finalists : n - from;
            if (!(rc = tune_evaluate(&S, order + from, keep, 2)) && o->scenarios)
                rc = tune_judge_scenarios(&S);
            from += keep;
            bool any = false;
            for (size_t i = 0; i < from && !any; i++) any = r->cands[order[i]].rung[2].feasible;
            if (any) break;
        }
    }
    if (!rc) {
        n = ranked(r, 2, order);
        r->best = order[0];
        /* the base itself when no candidate beats it on the whole trace: the windows that
         * screened the candidates can rank them otherwise than the whole trace does, and a
         * search must never hand back a policy worse than the one it started from */
        if (!n || tune_rank_cmp(r, &r->cands[r->base], &r->cands[r->best], 2) < 0)
            r->best = r->base;
        progress(&S, "finalists on the whole trace", 2);
        pareto(r, 2);
    }
    free(order);
out:
    r->wall_s = now_s() - t0;
    for (int k = 0; k < SIM_TUNE_RUNGS; k++)
        for (size_t l = 0; l < SIM_TUNE_MAX_LOADS; l++) sim_trace_free(&S.traces[k][l]);
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
