/* ringlm — simulator reports: metrics, verdicts, table, JSON, CSV. SPDX-License-Identifier: MIT */
#include "sim/report.h"
#include "sim/prefix_report.h"
#include "sim/err.h"
#include "formats/request_log.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- metrics ------------------------------------------------------------------------------- */

typedef struct gacc { /* per group, while collecting */
    double *wait, *ttft, *tpot, *e2e, *itl;
    size_t nw, nt, np, ne, ni;
} gacc;

static double ms(int64_t us)
{
    return (double)us / 1000.0;
}

static const sched_class_cfg *class_cfg(const sim_run *r, unsigned trace_class)
{
    int k = r->class_map[trace_class];
    return k >= 0 ? sched_policy_class(r->opt.policy, k) : NULL;
}

/* One logical request into a group. */
static void group_add(sim_group *g, gacc *a, const sim_run *r, uint32_t req)
{
    const sim_req *q = &r->trace->reqs[req];
    const sim_rec *x = &r->recs[r->final_rec[req]];
    g->requests++;
    g->offered_tokens += (uint64_t)q->prompt_tokens + q->output_tokens;
    switch (x->outcome) {
    case SIM_OUT_FINISHED: g->finished++; break;
    case SIM_OUT_REJECTED: g->rejected++; break;
    case SIM_OUT_TIMEOUT: g->timeouts++; break;
    case SIM_OUT_CANCELLED: g->cancels++; break;
    default: g->pending++; break;
    }
    if (x->first_sched_us >= 0)
        a->wait[a->nw++] = ms(x->first_sched_us - q->arrival_us);
    else if (x->outcome == SIM_OUT_TIMEOUT)
        a->wait[a->nw++] = ms(x->end_us - q->arrival_us);
    if (x->first_token_us >= 0) a->ttft[a->nt++] = ms(x->first_token_us - q->arrival_us);
    double tpot = NAN;
    if (x->outcome == SIM_OUT_FINISHED) {
        a->e2e[a->ne++] = ms(x->end_us - q->arrival_us);
        if (x->generated > 1) {
            tpot = ms(x->end_us - x->first_token_us) / (double)(x->generated - 1);
            a->tpot[a->np++] = tpot;
            a->itl[a->ni++] = ms(x->max_itl_us);
        }
    }
    if (x->outcome != SIM_OUT_CANCELLED) {
        g->slo_counted++;
        const sched_class_cfg *c = class_cfg(r, q->klass);
        bool met = x->outcome == SIM_OUT_FINISHED;
        if (met && c && c->ttft_target_us &&
            x->first_token_us - q->arrival_us > (int64_t)c->ttft_target_us)
            met = false;
        if (met && c && c->tpot_target_us && !isnan(tpot) &&
            tpot * 1000.0 > (double)c->tpot_target_us)
            met = false;
        if (met) {
            g->slo_met++;
            g->goodput_tok_s += x->generated;
        }
    }
}

/* Per-attempt counters (every attempt of every request). */
static void group_add_rec(sim_group *g, const sim_rec *x)
{
    g->attempts++;
    if (x->outcome == SIM_OUT_REJECTED)
        g->rejects[x->reason < SCHED_REJECT__COUNT ? x->reason : 0]++;
    if (x->outcome == SIM_OUT_TIMEOUT)
        g->timeouts_by[x->reason < SCHED_TIMEOUT__COUNT ? x->reason : 0]++;
    g->preempt_swap += x->preempt_swap;
    g->preempt_recompute += x->preempt_recompute;
    g->served_prefill += x->prefill_done;
    g->served_output += x->generated;
    double starve = ms(x->max_starve_us);
    if (x->live) starve = 0;
    if (starve > g->longest_starvation_ms) g->longest_starvation_ms = starve;
    if (x->cancel_us >= 0) {
        g->tokens_after_cancel += x->tokens_after_cancel;
        if (x->release_us >= 0 && ms(x->release_us - x->cancel_us) > g->release_delay_max_ms)
            g->release_delay_max_ms = ms(x->release_us - x->cancel_us);
    }
}

static void group_finish(sim_group *g, gacc *a, double sim_s)
{
    sim_dist_of(a->wait, a->nw, &g->wait);
    sim_dist_of(a->ttft, a->nt, &g->ttft);
    sim_dist_of(a->tpot, a->np, &g->tpot);
    sim_dist_of(a->e2e, a->ne, &g->e2e);
    sim_dist_of(a->itl, a->ni, &g->itl_max);
    g->slo_attainment = g->slo_counted ? (double)g->slo_met / (double)g->slo_counted : NAN;
    g->goodput_rps = sim_s > 0 ? (double)g->slo_met / sim_s : 0;
    g->goodput_tok_s = sim_s > 0 ? g->goodput_tok_s / sim_s : 0;
}

static int gacc_alloc(gacc *a, size_t n)
{
    memset(a, 0, sizeof *a);
    size_t k = n ? n : 1;
    a->wait = malloc(k * sizeof(double));
    a->ttft = malloc(k * sizeof(double));
    a->tpot = malloc(k * sizeof(double));
    a->e2e = malloc(k * sizeof(double));
    a->itl = malloc(k * sizeof(double));
    return a->wait && a->ttft && a->tpot && a->e2e && a->itl ? 0 : -ENOMEM;
}

static void gacc_free(gacc *a)
{
    free(a->wait);
    free(a->ttft);
    free(a->tpot);
    free(a->e2e);
    free(a->itl);
}

/* Burst recovery: median queue wait of requests by arrival second, against the pre-burst
 * median. Recovered at the first second after the burst from which five seconds in a row
 * stay under max(2 × baseline, baseline + 20 ms). */
static void burst_recovery(const sim_run *r, sim_summary *s, int64_t b0, int64_t b1)
{
    const sim_trace *t = r->trace;
    s->has_burst = true;
    s->burst_start_s = (double)b0 / 1e6;
    s->burst_end_s = (double)b1 / 1e6;
    s->recovery_s = NAN;
    int64_t last = t->n ? t->reqs[t->n - 1].arrival_us : 0;
    size_t nb = (size_t)(last / 1000000) + 1;
    double **bk = calloc(nb, sizeof *bk);
    size_t *bn = calloc(nb, sizeof *bn), *bc = calloc(nb, sizeof *bc);
    double *base = malloc((t->n ? t->n : 1) * sizeof *base);
    size_t nbase = 0;
    if (!bk || !bn || !bc || !base) goto out;
    for (size_t i = 0; i < t->n; i++) bc[(size_t)(t->reqs[i].arrival_us / 1000000)]++;
    for (size_t b = 0; b < nb; b++)
        if (bc[b] && !(bk[b] = malloc(bc[b] * sizeof **bk))) goto out;
    for (size_t i = 0; i < t->n; i++) {
        const sim_req *q = &t->reqs[i];
        const sim_rec *x = &r->recs[r->final_rec[i]];
        double w;
        if (x->first_sched_us >= 0)
            w = ms(x->first_sched_us - q->arrival_us);
        else if (x->outcome == SIM_OUT_TIMEOUT)
            w = ms(x->end_us - q->arrival_us);
        else
            continue; /* rejected at once: no queue wait to speak of */
        size_t b = (size_t)(q->arrival_us / 1000000);
        bk[b][bn[b]++] = w;
        if (q->arrival_us < b0) base[nbase++] = w;
    }
    if (nbase == 0) {
        snprintf(s->recovery_text, sizeof s->recovery_text,
                 "no requests before the burst: no baseline");
        goto out;
    }
    sim_dist d;
    sim_dist_of(base, nbase, &d);
    s->baseline_wait_ms = d.p50;
    double thr = fmax(2 * d.p50, d.p50 + 20);
    size_t first = (size_t)(b1 / 1000000);
    double lastmed = NAN;
    for (size_t b = first; b < nb; b++) {
        bool ok = true;
        for (size_t k = b; k < nb && k < b + 5 && ok; k++) {
            if (!bn[k]) continue;
            sim_dist dk;
            sim_dist_of(bk[k], bn[k], &dk);
            lastmed = dk.p50;
            if (dk.p50 > thr) ok = false;
        }
        if (ok && bn[b]) {
            s->recovery_s = fmax(0, (double)b - (double)b1 / 1e6);
            snprintf(s->recovery_text, sizeof s->recovery_text,
                     "queue wait back at baseline (median %.1f ms, threshold %.1f ms) %.0f s after "
                     "the burst ended",
                     d.p50, thr, s->recovery_s);
            goto out;
        }
    }
    snprintf(
        s->recovery_text, sizeof s->recovery_text,
        "queue wait never returns to its pre-burst baseline (median %.1f ms, threshold %.1f ms); "
        "the last arrivals waited %.1f ms (median)",
        d.p50, thr, lastmed);
out:
    if (bk)
        for (size_t b = 0; b < nb; b++) free(bk[b]);
    free(bk);
    free(bn);
    free(bc);
    free(base);
}

static const sim_group *find_group(const sim_group *g, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(g[i].name, name) == 0) return &g[i];
    return NULL;
}

/* The served tokens per tenant at time t (from the time series). */
static const double *ts_row_at(const sim_run *r, double t_s)
{
    if (!r->ts_rows) return NULL;
    size_t i = 0;
    while (i + 1 < r->ts_rows && r->ts[(i + 1) * r->ts_cols + SIM_TS_T_S] <= t_s) i++;
    return &r->ts[i * r->ts_cols];
}

static void verdict(const sim_run *r, const sim_scenario *scn, sim_summary *s)
{
    const sim_trace *t = r->trace;
    s->verdict = -1;
    if (!scn || scn->kind == SIM_SCN_NONE) return;
    char *v = s->verdict_text;
    size_t vl = sizeof s->verdict_text;
    switch (scn->kind) {
    case SIM_SCN_LONG_PROMPT: {
        snprintf(s->verdict_name, sizeof s->verdict_name, "long-prompt");
        const sim_group *g = find_group(s->classes, s->n_classes, t->classes[scn->short_class]);
        if (!g) {
            snprintf(v, vl, "no short chats");
            s->verdict = 0;
            break;
        }
        bool ok = g->ttft.n && g->ttft.p99 <= scn->ttft_limit_ms &&
                  (isnan(g->itl_max.max) || g->itl_max.max <= scn->stall_limit_ms);
        s->verdict = ok;
        snprintf(v, vl,
                 "short chats: TTFT p99 %.1f ms (limit %.0f), longest inter-token gap %.1f ms "
                 "(limit %.0f); longest step %.1f ms",
                 g->ttft.p99, scn->ttft_limit_ms, g->itl_max.max, scn->stall_limit_ms,
                 s->max_step_ms);
        break;
    }
    case SIM_SCN_TWO_TENANTS: {
        snprintf(s->verdict_name, sizeof s->verdict_name, "two-tenants");
        double end_s = (double)scn->duration_us / 1e6;
        const double *row = ts_row_at(r, end_s);
        const sim_group *gq = find_group(s->tenants, s->n_tenants, t->tenants[scn->quiet_tenant]);
        const sim_group *gl = find_group(s->tenants, s->n_tenants, t->tenants[scn->loud_tenant]);
        if (!row || !gq || !gl) {
            s->verdict = 0;
            snprintf(v, vl, "missing tenants or samples");
            break;
        }
        double served_q = row[SIM_TS_FIXED_COLS + scn->quiet_tenant];
        double served_l = row[SIM_TS_FIXED_COLS + scn->loud_tenant];
        double dem[2] = {0, 0}, w[2] = {gq->weight, gl->weight}, share[2];
        for (size_t i = 0; i < t->n; i++) {
            const sim_req *q = &t->reqs[i];
            if (q->arrival_us >= scn->duration_us) continue;
            if (q->tenant == scn->quiet_tenant) dem[0] += q->prompt_tokens + q->output_tokens;
            if (q->tenant == scn->loud_tenant) dem[1] += q->prompt_tokens + q->output_tokens;
        }
        sim_fair_share(served_q + served_l, w, dem, 2, share);
        double frac = share[0] > 0 ? served_q / share[0] : 1;
        s->verdict = frac >= scn->share_min;
        snprintf(v, vl,
                 "quiet tenant served %.0f tokens in the first %.0f s = %.0f%% of its weighted "
                 "fair share %.0f (minimum %.0f%%); loud served %.0f",
                 served_q, end_s, 100 * frac, share[0], 100 * scn->share_min, served_l);
        break;
    }
    case SIM_SCN_DISCONNECTS: {
        snprintf(s->verdict_name, sizeof s->verdict_name, "disconnects");
        size_t n = 0, unreleased = 0;
        for (size_t i = 0; i < r->n_recs; i++) {
            const sim_rec *x = &r->recs[i];
            if (x->cancel_us < 0) continue;
            n++;
            if (x->release_us < 0 && x->first_sched_us >= 0) unreleased++;
        }
        double step_ms = s->max_step_ms;
        bool ok = s->all.tokens_after_cancel == 0 && unreleased == 0 &&
                  s->all.release_delay_max_ms <= step_ms + 0.001 && r->final_counts.kv_used[0] == 0;
        s->verdict = ok;
        snprintf(v, vl,
                 "%zu disconnects: tokens computed after a cancel %llu, blocks never released %zu, "
                 "longest cancel→release %.2f ms (one step is at most %.2f ms), device blocks "
                 "still used at the end %u",
                 n, (unsigned long long)s->all.tokens_after_cancel, unreleased,
                 s->all.release_delay_max_ms, step_ms, r->final_counts.kv_used[0]);
        break;
    }
    case SIM_SCN_BURST: {
        snprintf(s->verdict_name, sizeof s->verdict_name, "burst");
        s->verdict = !isnan(s->recovery_s) && s->recovery_s <= scn->recover_limit_s;
        snprintf(v, vl, "%s (limit %.0f s); retry amplification %.2f", s->recovery_text,
                 scn->recover_limit_s, s->retry_amplification);
        break;
    }
    case SIM_SCN_OVERLOAD: {
        snprintf(s->verdict_name, sizeof s->verdict_name, "overload");
        double half = (double)scn->duration_us / 2e6, m1 = 0, m2 = 0;
        for (size_t i = 0; i < r->ts_rows; i++) {
            const double *row = &r->ts[i * r->ts_cols];
            if (row[SIM_TS_T_S] > 2 * half) break;
            double q = row[SIM_TS_WAITING];
            if (row[SIM_TS_T_S] < half)
                m1 = fmax(m1, q);
            else
                m2 = fmax(m2, q);
        }
        bool bounded = m2 <= 1.25 * m1 + 16;
        size_t refused = s->all.rejected + s->all.timeouts;
        double refused_share = s->all.requests ? (double)refused / (double)s->all.requests : 0;
        double fin_met = NAN;
        size_t met = 0, fin = 0;
        for (size_t i = 0; i < t->n; i++) {
            const sim_rec *x = &r->recs[r->final_rec[i]];
            if (x->outcome != SIM_OUT_FINISHED) continue;
            fin++;
            const sim_req *q = &t->reqs[i];
            const sched_class_cfg *c = class_cfg(r, q->klass);
            bool ok = true;
            if (c && c->ttft_target_us &&
                x->first_token_us - q->arrival_us > (int64_t)c->ttft_target_us)
                ok = false;
            if (c && c->tpot_target_us && x->generated > 1 &&
                (double)(x->end_us - x->first_token_us) / (x->generated - 1) >
                    (double)c->tpot_target_us)
                ok = false;
            met += ok;
        }
        if (fin) fin_met = (double)met / (double)fin;
        bool ok = bounded && s->all.pending == 0 && (scn->load <= 1 || refused > 0) && fin &&
                  fin_met >= scn->slo_min;
        s->verdict = ok;
        snprintf(v, vl,
                 "queue depth max %.0f in the first half, %.0f in the second (%s); refused %.0f%% "
                 "(rejected %zu, timed out %zu; excess at load %.1f is %.0f%%); accepted requests "
                 "meeting "
                 "their targets %.0f%% (minimum %.0f%%); still waiting at the end %zu",
                 m1, m2, bounded ? "bounded" : "growing", 100 * refused_share, s->all.rejected,
                 s->all.timeouts, scn->load, scn->load > 1 ? 100 * (1 - 1 / scn->load) : 0,
                 100 * fin_met, 100 * scn->slo_min, s->all.pending);
        break;
    }
    }
}

static void fidelity(const sim_run *r, sim_summary *s)
{
    const sim_trace *t = r->trace;
    if (!t->has_real) return;
    size_t cap = t->n ? t->n : 1;
    double *te = malloc(cap * sizeof *te), *ee = malloc(cap * sizeof *ee);
    double *tr = malloc(cap * sizeof *tr), *er = malloc(cap * sizeof *er);
    size_t nt = 0, ne = 0;
    if (!te || !ee || !tr || !er) {
        free(te);
        free(ee);
        free(tr);
        free(er);
        return;
    }
    for (size_t i = 0; i < t->n; i++) {
        const sim_req *q = &t->reqs[i];
        const sim_rec *x = &r->recs[r->final_rec[i]];
        if (q->real_reason != SIM_REAL_LENGTH && q->real_reason != SIM_REAL_STOP) continue;
        if (x->outcome != SIM_OUT_FINISHED) continue;
        /* The daemon stamps arrival_us when its loop drains the request, between iterations:
         * its latencies start there. The simulated loop sees the request at the start of the
         * first step at or after arrival_us (a step in progress is waited for, up to a whole
         * prefill chunk); compare from that moment, as the daemon measures. */
        int64_t seen = x->seen_us > q->arrival_us ? x->seen_us : q->arrival_us;
        if (q->real_first_token_us != SIM_NO_TIME && q->real_first_token_us > q->arrival_us) {
            double real = (double)(q->real_first_token_us - q->arrival_us),
                   sim = (double)(x->first_token_us - seen);
            tr[nt] = sim / real;
            te[nt++] = fabs(sim - real) / real;
        }
        if (q->real_finish_us != SIM_NO_TIME && q->real_finish_us > q->arrival_us) {
            double real = (double)(q->real_finish_us - q->arrival_us),
                   sim = (double)(x->end_us - seen);
            er[ne] = sim / real;
            ee[ne++] = fabs(sim - real) / real;
        }
    }
    s->has_fidelity = nt + ne > 0;
    sim_dist_of(te, nt, &s->ttft_rel_err);
    sim_dist_of(ee, ne, &s->e2e_rel_err);
    sim_dist_of(tr, nt, &s->ttft_ratio);
    sim_dist_of(er, ne, &s->e2e_ratio);
    free(te);
    free(ee);
    free(tr);
    free(er);
}

int sim_summarise(const sim_run *r, const sim_scenario *scn, int64_t b0, int64_t b1, sim_summary *s)
{
    const sim_trace *t = r->trace;
    memset(s, 0, sizeof *s);
    s->tenants = calloc(t->n_tenants ? t->n_tenants : 1, sizeof *s->tenants);
    s->classes = calloc(t->n_classes ? t->n_classes : 1, sizeof *s->classes);
    s->n_tenants = t->n_tenants;
    s->n_classes = t->n_classes;
    gacc *ta = calloc(t->n_tenants + 1, sizeof *ta), *ca = calloc(t->n_classes + 1, sizeof *ca),
         all;
    size_t *tcount = calloc(t->n_tenants + 1, sizeof *tcount),
           *ccount = calloc(t->n_classes + 1, sizeof *ccount);
    int rc = -ENOMEM;
    if (!s->tenants || !s->classes || !ta || !ca || !tcount || !ccount) goto out;
    for (size_t i = 0; i < t->n; i++) {
        tcount[t->reqs[i].tenant]++;
        ccount[t->reqs[i].klass]++;
    }
    for (unsigned i = 0; i < t->n_tenants; i++)
        if (gacc_alloc(&ta[i], tcount[i])) goto out;
    for (unsigned i = 0; i < t->n_classes; i++)
        if (gacc_alloc(&ca[i], ccount[i])) goto out;
    if (gacc_alloc(&all, t->n)) goto out;
    s->sim_s = (double)r->sim_end_us / 1e6;
    s->wall_s = r->wall_s;
    s->speedup = r->wall_s > 0 ? s->sim_s / r->wall_s : 0;
    s->span_s = t->n ? (double)(t->reqs[t->n - 1].arrival_us - t->reqs[0].arrival_us) / 1e6 : 0;
    snprintf(s->all.name, sizeof s->all.name, "all");
    for (unsigned i = 0; i < t->n_tenants; i++) {
        snprintf(s->tenants[i].name, sizeof s->tenants[i].name, "%s", t->tenants[i]);
        const sched_tenant_cfg *c =
            r->tenant_map[i] >= 0 ? sched_policy_tenant(r->opt.policy, r->tenant_map[i]) : NULL;
        s->tenants[i].weight = c ? c->weight : 1;
    }
    for (unsigned i = 0; i < t->n_classes; i++)
        snprintf(s->classes[i].name, sizeof s->classes[i].name, "%s", t->classes[i]);
    for (size_t i = 0; i < t->n; i++) {
        if (r->final_rec[i] == UINT32_MAX) continue;
        const sim_req *q = &t->reqs[i];
        group_add(&s->tenants[q->tenant], &ta[q->tenant], r, (uint32_t)i);
        group_add(&s->classes[q->klass], &ca[q->klass], r, (uint32_t)i);
        group_add(&s->all, &all, r, (uint32_t)i);
    }
    for (size_t i = 0; i < r->n_recs; i++) {
        const sim_rec *x = &r->recs[i];
        const sim_req *q = &t->reqs[x->req];
        group_add_rec(&s->tenants[q->tenant], x);
        group_add_rec(&s->classes[q->klass], x);
        group_add_rec(&s->all, x);
    }
    for (unsigned i = 0; i < t->n_tenants; i++) group_finish(&s->tenants[i], &ta[i], s->sim_s);
    for (unsigned i = 0; i < t->n_classes; i++) group_finish(&s->classes[i], &ca[i], s->sim_s);
    group_finish(&s->all, &all, s->sim_s);
    gacc_free(&all);
    /* shares, fair shares and Jain's index over tenants that sent anything */
    double total = (double)(s->all.served_prefill + s->all.served_output);
    double w[SIM_MAX_NAMES], dem[SIM_MAX_NAMES], share[SIM_MAX_NAMES], x[SIM_MAX_NAMES];
    size_t k = 0;
    unsigned idx[SIM_MAX_NAMES];
    for (unsigned i = 0; i < t->n_tenants; i++) {
        sim_group *g = &s->tenants[i];
        g->token_share = total > 0 ? (double)(g->served_prefill + g->served_output) / total : 0;
        if (!g->requests) continue;
        w[k] = g->weight;
        dem[k] = (double)g->offered_tokens;
        idx[k++] = i;
    }
    for (unsigned i = 0; i < t->n_classes; i++) {
        sim_group *g = &s->classes[i];
        g->token_share = total > 0 ? (double)(g->served_prefill + g->served_output) / total : 0;
    }
    s->all.token_share = 1;
    sim_fair_share(total, w, dem, k, share);
    for (size_t j = 0; j < k; j++) {
        sim_group *g = &s->tenants[idx[j]];
        g->fair_share_tokens = share[j];
        g->normalised_service =
            share[j] > 0 ? (double)(g->served_prefill + g->served_output) / share[j] : 1;
        x[j] = g->normalised_service;
    }
    s->jain = sim_jain(x, k);
    s->tokens_per_s = s->sim_s > 0 ? total / s->sim_s : 0;
    s->output_tokens_per_s = s->sim_s > 0 ? (double)s->all.served_output / s->sim_s : 0;
    s->requests_per_s = s->sim_s > 0 ? (double)s->all.finished / s->sim_s : 0;
    double computed = (double)(r->prefill_tokens + r->decode_tokens + r->pad_tokens);
    s->pad_share = computed > 0 ? (double)r->pad_tokens / computed : 0;
    s->occupancy = r->steps && r->slot_capacity
                       ? (double)r->entries / ((double)r->steps * (double)r->slot_capacity)
                       : 0;
    s->busy_share = r->sim_end_us > 0 ? r->busy_us / (double)r->sim_end_us : 0;
    s->max_step_ms = r->max_step_us / 1000.0;
    s->attempts = r->n_recs;
    s->retry_amplification = t->n ? (double)r->n_recs / (double)t->n : 1;
    if (scn && scn->kind == SIM_SCN_BURST && b0 < 0) {
        b0 = scn->burst_start_us;
        b1 = scn->burst_end_us;
    }
    if (b0 >= 0 && b1 > b0) burst_recovery(r, s, b0, b1);
    verdict(r, scn, s);
    fidelity(r, s);
    rc = 0;
out:
    if (ta)
        for (unsigned i = 0; i < t->n_tenants; i++) gacc_free(&ta[i]);
    if (ca)
        for (unsigned i = 0; i < t->n_classes; i++) gacc_free(&ca[i]);
    free(ta);
    free(ca);
    free(tcount);
    free(ccount);
    return rc;
}

void sim_summary_free(sim_summary *s)
{
    free(s->tenants);
    free(s->classes);
    memset(s, 0, sizeof *s);
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static json_t *jnum(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}
/* Round to a fixed number of decimals so reports are stable and readable. */
static json_t *jr(double v, int dec)
{
    if (!isfinite(v)) return json_null();
    double f = pow(10, dec);
    return json_real(round(v * f) / f);
}

static json_t *jdist(const sim_dist *d)
{
    return json_pack("{s:I,s:o,s:o,s:o,s:o,s:o}", "n", (json_int_t)d->n, "mean", jr(d->mean, 3),
                     "p50", jr(d->p50, 3), "p90", jr(d->p90, 3), "p99", jr(d->p99, 3), "max",
                     jr(d->max, 3));
}

static json_t *jgroup(const sim_group *g)
{
    json_t *rej = json_object(), *to = json_object();
    for (int i = 1; i < SCHED_REJECT__COUNT; i++)
        if (g->rejects[i])
            json_object_set_new(rej, sched_reject_name(i), json_integer((json_int_t)g->rejects[i]));
    for (int i = 0; i < SCHED_TIMEOUT__COUNT; i++)
        if (g->timeouts_by[i])
            json_object_set_new(to, sched_timeout_name(i),
                                json_integer((json_int_t)g->timeouts_by[i]));
    json_t *o = json_object();
    json_object_set_new(o, "requests", json_integer((json_int_t)g->requests));
    json_object_set_new(o, "attempts", json_integer((json_int_t)g->attempts));
    json_object_set_new(o, "finished", json_integer((json_int_t)g->finished));
    json_object_set_new(o, "rejected", json_integer((json_int_t)g->rejected));
    json_object_set_new(o, "rejects_by_reason", rej);
    json_object_set_new(o, "timeouts", json_integer((json_int_t)g->timeouts));
    json_object_set_new(o, "timeouts_by_reason", to);
    json_object_set_new(o, "cancels", json_integer((json_int_t)g->cancels));
    json_object_set_new(o, "pending", json_integer((json_int_t)g->pending));
    json_object_set_new(o, "preemptions",
                        json_pack("{s:I,s:I}", "swap", (json_int_t)g->preempt_swap, "recompute",
                                  (json_int_t)g->preempt_recompute));
    json_object_set_new(o, "queue_wait_ms", jdist(&g->wait));
    json_object_set_new(o, "ttft_ms", jdist(&g->ttft));
    json_object_set_new(o, "tpot_ms", jdist(&g->tpot));
    json_object_set_new(o, "e2e_ms", jdist(&g->e2e));
    json_object_set_new(o, "max_itl_ms", jdist(&g->itl_max));
    json_object_set_new(o, "longest_starvation_ms", jr(g->longest_starvation_ms, 3));
    json_object_set_new(o, "served_prefill_tokens", json_integer((json_int_t)g->served_prefill));
    json_object_set_new(o, "served_output_tokens", json_integer((json_int_t)g->served_output));
    json_object_set_new(o, "offered_tokens", json_integer((json_int_t)g->offered_tokens));
    json_object_set_new(o, "token_share", jr(g->token_share, 6));
    json_object_set_new(o, "slo_attainment", jr(g->slo_attainment, 6));
    json_object_set_new(o, "goodput_rps", jr(g->goodput_rps, 4));
    json_object_set_new(o, "goodput_tokens_per_s", jr(g->goodput_tok_s, 2));
    json_object_set_new(o, "weight", jnum(g->weight));
    json_object_set_new(o, "fair_share_tokens", jr(g->fair_share_tokens, 1));
    json_object_set_new(o, "normalised_service", jr(g->normalised_service, 6));
    json_object_set_new(o, "tokens_after_cancel", json_integer((json_int_t)g->tokens_after_cancel));
    json_object_set_new(o, "release_delay_max_ms", jr(g->release_delay_max_ms, 3));
    return o;
}

json_t *sim_report_json(const sim_run *r, const sim_summary *s, const sim_service *svc)
{
    const sim_trace *t = r->trace;
    json_t *o = json_object();
    json_t *tr = json_object();
    json_object_set_new(tr, "source", json_string(t->source));
    json_object_set_new(tr, "format", json_string(sim_trace_format_name(t->format)));
    json_object_set_new(tr, "requests", json_integer((json_int_t)t->n));
    json_object_set_new(tr, "span_s", jr(s->span_s, 6));
    json_object_set_new(tr, "bad_lines", json_integer((json_int_t)t->n_bad_total));
    json_object_set_new(tr, "torn_lines", json_integer((json_int_t)t->n_torn));
    json_object_set_new(o, "trace", tr);
    json_object_set_new(o, "policy", json_string(r->policy_name));
    json_object_set_new(o, "policy_hash", json_string(r->policy_hash));
    if (r->final_counts.prefix_query_tokens) { /* the prefix cache took part */
        sim_prefix_figures pf;
        sim_prefix_figures_of(r, &pf);
        json_object_set_new(o, "prefix_cache", sim_prefix_json(&pf));
    }
    json_object_set_new(o, "mode", json_string(r->mode));
    json_t *sv = json_object();
    json_object_set_new(sv, "source", json_string(svc->source));
    json_object_set_new(sv, "builtin", json_boolean(svc->builtin));
    json_object_set_new(sv, "model", json_string(svc->model));
    json_object_set_new(sv, "base_us", jnum(svc->base_us));
    json_object_set_new(sv, "per_prefill_token_us", jnum(svc->per_prefill_token_us));
    json_object_set_new(sv, "per_decode_seq_us", jnum(svc->per_decode_seq_us));
    json_object_set_new(sv, "per_context_token_us", jnum(svc->per_context_token_us));
    json_object_set_new(sv, "per_prefill_pair_us", jnum(svc->per_prefill_pair_us));
    json_object_set_new(sv, "fit", json_string(svc->fit));
    json_object_set_new(sv, "file_median_rel_err", jr(svc->file_median_rel_err, 6));
    json_object_set_new(sv, "refit", json_boolean(svc->refit));
    json_object_set_new(sv, "grid_points", json_integer(svc->grid_points));
    json_object_set_new(sv, "r2", jr(svc->r2, 6));
    json_object_set_new(sv, "median_rel_err", jr(svc->median_rel_err, 6));
    json_object_set_new(sv, "max_rel_err", jr(svc->max_rel_err, 6));
    if (svc->loop_points) {
        json_t *lp = json_object();
        json_object_set_new(lp, "points", json_integer(svc->loop_points));
        json_object_set_new(lp, "step_us", jnum(svc->loop_step_us));
        json_object_set_new(lp, "context_us", jnum(svc->loop_context_us));
        json_object_set_new(lp, "engine_only_median_rel_err",
                            jr(svc->loop_engine_median_rel_err, 6));
        json_object_set_new(lp, "median_rel_err", jr(svc->loop_median_rel_err, 6));
        json_object_set_new(sv, "serving_loop", lp);
    }
    if (svc->it_points) {
        /* the step model was fitted to a real ringlmd's iterations (--iteration-log) */
        json_t *it = json_object(), *terms = json_array();
        json_object_set_new(it, "model", json_string("iterations-fit"));
        json_object_set_new(it, "source", json_string(svc->it_source));
        json_object_set_new(it, "files", json_integer(svc->it_files));
        json_object_set_new(it, "lines", json_integer((json_int_t)svc->it_lines));
        json_object_set_new(it, "points", json_integer((json_int_t)svc->it_points));
        json_object_set_new(it, "dropped", json_integer((json_int_t)svc->it_dropped));
        json_object_set_new(it, "ignored_no_period", json_integer((json_int_t)svc->it_idle));
        json_object_set_new(it, "torn_lines", json_integer((json_int_t)svc->it_torn));
        json_object_set_new(it, "ignored_transfers", json_integer((json_int_t)svc->it_transfers));
        for (int i = 0; i < 5; i++)
            if (svc->it_terms >> i & 1)
                json_array_append_new(terms, json_string(sim_service_term_name(i)));
        json_object_set_new(it, "terms", terms);
        if (svc->speed) {
            json_t *sp = json_array();
            for (size_t w = 0; w < svc->n_speed; w++)
                json_array_append_new(sp, jr(svc->speed[w], 4));
            json_object_set_new(it, "speed_window_ms", jnum((double)svc->speed_window_us / 1000));
            json_object_set_new(it, "speed", sp);
        }
        json_object_set_new(it, "r2", jr(svc->r2, 6));
        json_object_set_new(it, "median_rel_err", jr(svc->median_rel_err, 6));
        json_object_set_new(it, "p90_rel_err", jr(svc->it_p90_rel_err, 6));
        json_object_set_new(it, "max_rel_err", jr(svc->max_rel_err, 6));
        json_object_set_new(it, "replaced_model_median_rel_err",
                            jr(svc->it_prior_median_rel_err, 6));
        json_object_set_new(sv, "iterations", it);
    }
    json_object_set_new(sv, "kv_blocks_device", json_integer(svc->kv_blocks_device));
    json_object_set_new(sv, "kv_blocks_host", json_integer(svc->kv_blocks_host));
    if (svc->kv_blocks_disk)
        json_object_set_new(sv, "kv_blocks_disk", json_integer(svc->kv_blocks_disk));
    json_object_set_new(sv, "kv_block_size", json_integer(svc->kv_block_size));
    if (svc->attention_window)
        json_object_set_new(sv, "attention_window", json_integer(svc->attention_window));
    json_object_set_new(o, "service", sv);
    /* the device pools the scheduler ran with: the model's blocks, or a window pattern's
     * global blocks and rings (--window-pattern) */
    json_t *kv =
        json_pack("{s:I,s:o}", "device_blocks", (json_int_t)r->kv_blocks_device, "mean_batch_seqs",
                  jr(r->steps ? (double)r->entries / (double)r->steps : 0, 3));
    if (r->window.rings) {
        const sim_window_pattern *wp = &r->opt.window_pattern;
        json_object_set_new(kv, "window_pattern",
                            json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "window",
                                      (json_int_t)wp->window, "windowed", (json_int_t)wp->windowed,
                                      "period", (json_int_t)wp->period, "rings",
                                      (json_int_t)r->window.rings, "ring_blocks",
                                      (json_int_t)r->window.ring_blocks, "ring_rows",
                                      (json_int_t)r->window.ring_rows, "ring_bytes",
                                      (json_int_t)r->window.ring_bytes, "global_bytes_per_token",
                                      (json_int_t)r->window.bytes_per_token));
    }
    json_object_set_new(o, "kv", kv);
    json_object_set_new(o, "sim_s", jr(s->sim_s, 6));
    json_object_set_new(o, "wall_s", jr(s->wall_s, 6));
    json_object_set_new(o, "speedup", jr(s->speedup, 1));
    json_object_set_new(o, "steps", json_integer((json_int_t)r->steps));
    json_object_set_new(o, "throughput",
                        json_pack("{s:o,s:o,s:o}", "tokens_per_s", jr(s->tokens_per_s, 2),
                                  "output_tokens_per_s", jr(s->output_tokens_per_s, 2),
                                  "requests_per_s", jr(s->requests_per_s, 4)));
    json_object_set_new(o, "jain_index", jr(s->jain, 6));
    json_t *tn = json_object(), *cl = json_object();
    for (size_t i = 0; i < t->n_tenants; i++)
        if (s->tenants[i].requests)
            json_object_set_new(tn, s->tenants[i].name, jgroup(&s->tenants[i]));
    for (size_t i = 0; i < t->n_classes; i++)
        if (s->classes[i].requests)
            json_object_set_new(cl, s->classes[i].name, jgroup(&s->classes[i]));
    json_object_set_new(o, "tenants", tn);
    json_object_set_new(o, "classes", cl);
    json_object_set_new(o, "all", jgroup(&s->all));
    json_object_set_new(o, "batching",
                        json_pack("{s:I,s:I,s:I,s:o,s:o,s:o,s:o}", "prefill_tokens",
                                  (json_int_t)r->prefill_tokens, "decode_tokens",
                                  (json_int_t)r->decode_tokens, "pad_tokens",
                                  (json_int_t)r->pad_tokens, "pad_share", jr(s->pad_share, 6),
                                  "slot_occupancy", jr(s->occupancy, 6), "busy_share",
                                  jr(s->busy_share, 6), "max_step_ms", jr(s->max_step_ms, 3)));
    json_object_set_new(o, "transfers",
                        json_pack("{s:I,s:I,s:I,s:I,s:I,s:f}", "out", (json_int_t)r->transfers_out,
                                  "in", (json_int_t)r->transfers_in, "bytes_out",
                                  (json_int_t)r->bytes_out, "bytes_in", (json_int_t)r->bytes_in,
                                  "cache_copies_waited", (json_int_t)r->cache_copies_waited,
                                  "cache_copy_wait_ms", r->cache_copy_wait_us / 1000));
    json_object_set_new(o, "retries",
                        json_pack("{s:s,s:I,s:o}", "mode",
                                  r->opt.retry == SIM_RETRY_NONE        ? "none"
                                  : r->opt.retry == SIM_RETRY_IMMEDIATE ? "immediate"
                                                                        : "backoff",
                                  "attempts", (json_int_t)s->attempts, "amplification",
                                  jr(s->retry_amplification, 6)));
    if (s->has_burst)
        json_object_set_new(o, "burst",
                            json_pack("{s:o,s:o,s:o,s:o,s:s}", "start_s", jr(s->burst_start_s, 3),
                                      "end_s", jr(s->burst_end_s, 3), "baseline_wait_ms",
                                      jr(s->baseline_wait_ms, 3), "recovery_s",
                                      jr(s->recovery_s, 3), "text", s->recovery_text));
    if (s->verdict >= 0)
        json_object_set_new(o, "verdict",
                            json_pack("{s:s,s:b,s:s}", "scenario", s->verdict_name, "pass",
                                      s->verdict, "text", s->verdict_text));
    if (s->has_fidelity)
        json_object_set_new(o, "fidelity",
                            json_pack("{s:o,s:o,s:o,s:o}", "ttft_rel_err", jdist(&s->ttft_rel_err),
                                      "e2e_rel_err", jdist(&s->e2e_rel_err), "ttft_sim_over_real",
                                      jdist(&s->ttft_ratio), "e2e_sim_over_real",
                                      jdist(&s->e2e_ratio)));
    json_t *w = json_array();
    if (r->warnings[0]) {
        char buf[sizeof r->warnings];
        snprintf(buf, sizeof buf, "%s", r->warnings);
        for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
            json_array_append_new(w, json_string(line));
    }
    json_object_set_new(o, "warnings", w);
    return o;
}

/* ---- terminal table --------------------------------------------------------------------------- */

static void fmt_ms(char *b, size_t n, double v)
{
    if (isnan(v))
        snprintf(b, n, "-");
    else if (v >= 100000)
        snprintf(b, n, "%.0fs", v / 1000);
    else if (v >= 10000)
        snprintf(b, n, "%.1fs", v / 1000);
    else if (v >= 100)
        snprintf(b, n, "%.0f", v);
    else
        snprintf(b, n, "%.1f", v);
}

static void table_row(FILE *f, const char *kind, const sim_group *g)
{
    char a[8][16];
    fmt_ms(a[0], 16, g->wait.p50);
    fmt_ms(a[1], 16, g->wait.p99);
    fmt_ms(a[2], 16, g->ttft.p50);
    fmt_ms(a[3], 16, g->ttft.p99);
    fmt_ms(a[4], 16, g->tpot.p50);
    fmt_ms(a[5], 16, g->tpot.p99);
    fmt_ms(a[6], 16, g->e2e.p50);
    fmt_ms(a[7], 16, g->e2e.p99);
    char st[16];
    fmt_ms(st, sizeof st, g->longest_starvation_ms);
    char slo[16];
    if (isnan(g->slo_attainment))
        snprintf(slo, sizeof slo, "-");
    else
        snprintf(slo, sizeof slo, "%.1f%%", 100 * g->slo_attainment);
    fprintf(f,
            "%-6s %-14.14s %7zu %7zu %6zu %5zu %5zu %7s %7s %7s %7s %6s %6s %7s %7s %7s %6.1f%% "
            "%6s %5llu/%-5llu\n",
            kind, g->name, g->requests, g->finished, g->rejected, g->timeouts, g->cancels, a[0],
            a[1], a[2], a[3], a[4], a[5], a[6], a[7], st, 100 * g->token_share, slo,
            (unsigned long long)g->preempt_swap, (unsigned long long)g->preempt_recompute);
}

void sim_report_table(FILE *f, const sim_run *r, const sim_summary *s, const sim_service *svc)
{
    const sim_trace *t = r->trace;
    fprintf(f, "trace    %s (%s): %zu requests over %.1f s", t->source,
            sim_trace_format_name(t->format), t->n, s->span_s);
    if (t->n_bad_total) fprintf(f, ", %zu bad lines skipped", t->n_bad_total);
    if (t->n_torn) fprintf(f, ", %zu torn lines skipped", t->n_torn);
    fprintf(f, "\npolicy   %s  mode %s  hash %s\n", r->policy_name, r->mode, r->policy_hash);
    if (svc->it_points)
        fprintf(f,
                "service  iterations of %s: step_us = %.2f + %.4f*prefill + %.3f*decode_seqs + "
                "%.5f*context",
                svc->it_source, svc->base_us, svc->per_prefill_token_us, svc->per_decode_seq_us,
                svc->per_context_token_us);
    else
        fprintf(f, "service  %s%s: step_us = %.1f + %.3f*prefill + %.2f*decode_seqs + %.4f*context",
                svc->source, svc->builtin ? " (spec-derived, not measured)" : "", svc->base_us,
                svc->per_prefill_token_us, svc->per_decode_seq_us, svc->per_context_token_us);
    if (svc->per_prefill_pair_us != 0)
        fprintf(f, " + %.5f*prefill_pairs", svc->per_prefill_pair_us);
    if (svc->it_points) {
        fprintf(f,
                "\n         model iterations-fit from %s: %zu points used of %zu lines, %zu "
                "dropped as outliers "
                "(%zu without a period, %zu with KV transfers ignored); R² %.4f, median rel. error "
                "%.1f%%, p90 %.1f%%, max %.1f%%",
                svc->it_source, svc->it_points, svc->it_lines, svc->it_dropped, svc->it_idle,
                svc->it_transfers, svc->r2, 100 * svc->median_rel_err, 100 * svc->it_p90_rel_err,
                100 * svc->max_rel_err);
        if (svc->it_torn)
            fprintf(f, "; %zu torn lines skipped (the log's writer died mid-line)", svc->it_torn);
        if (!isnan(svc->it_prior_median_rel_err))
            fprintf(f, "; the %s model on these points: %.1f%%",
                    svc->builtin ? "built-in" : "calibration's",
                    100 * svc->it_prior_median_rel_err);
        fprintf(f, "\n         terms");
        for (int i = 0; i < 5; i++)
            if (svc->it_terms >> i & 1) fprintf(f, " %s", sim_service_term_name(i));
        fprintf(f, "; KV and transfers from %s%s", svc->source,
                svc->builtin ? " (spec-derived, not measured)" : "");
        if (svc->speed)
            fprintf(f,
                    "\n         speed trace (diagnostic: the recorded run's own drift): %zu "
                    "windows of %.0f ms, "
                    "%zu measured, factor %.2f..%.2f",
                    svc->n_speed, (double)svc->speed_window_us / 1000, svc->speed_windows_measured,
                    svc->speed_windows_measured ? svc->speed_min : 1.0,
                    svc->speed_windows_measured ? svc->speed_max : 1.0);
    } else if (svc->grid_points) {
        fprintf(f,
                "\n         model %s; on the %u grid points: R² %.4f, median rel. error %.1f%%, "
                "max %.1f%%",
                svc->fit, svc->grid_points, svc->r2, 100 * svc->median_rel_err,
                100 * svc->max_rel_err);
        if (svc->refit && !isnan(svc->file_median_rel_err))
            fprintf(f, " (the file's model: %.1f%%)", 100 * svc->file_median_rel_err);
    }
    if (svc->loop_points)
        fprintf(f,
                "\n         serving loop (ringlmd's decode periods, %u points): + %.1f + "
                "%.4f*decode_context per step; "
                "median rel. error %.1f%% (engine model alone %.1f%%)",
                svc->loop_points, svc->loop_step_us, svc->loop_context_us,
                100 * svc->loop_median_rel_err, 100 * svc->loop_engine_median_rel_err);
    fprintf(f, "\n         KV %u device + %u host + %u disk blocks of %u tokens\n",
            svc->kv_blocks_device, svc->kv_blocks_host, svc->kv_blocks_disk, svc->kv_block_size);
    fprintf(f,
            "run      %.1f s simulated in %.3f s wall (%.0fx real time), %llu steps, busy %.0f%%, "
            "longest step %.1f ms\n",
            s->sim_s, s->wall_s, s->speedup, (unsigned long long)r->steps, 100 * s->busy_share,
            s->max_step_ms);
    fprintf(f,
            "         throughput %.0f tok/s (%.0f output tok/s, %.2f req/s); Jain %.3f; slot "
            "occupancy %.0f%%; padding %.1f%%\n",
            s->tokens_per_s, s->output_tokens_per_s, s->requests_per_s, s->jain, 100 * s->occupancy,
            100 * s->pad_share);
    if (r->opt.retry != SIM_RETRY_NONE)
        fprintf(f, "retries  %zu attempts for %zu requests: amplification %.2fx\n", s->attempts,
                t->n, s->retry_amplification);
    fprintf(
        f, "\n%-6s %-14s %7s %7s %6s %5s %5s %7s %7s %7s %7s %6s %6s %7s %7s %7s %7s %6s %11s\n",
        "", "name", "reqs", "done", "rej", "t/o", "canc", "wait50", "wait99", "ttft50", "ttft99",
        "tpot50", "tpot99", "e2e50", "e2e99", "starve", "share", "SLO", "preempt s/r");
    for (size_t i = 0; i < t->n_tenants; i++)
        if (s->tenants[i].requests) table_row(f, "tenant", &s->tenants[i]);
    for (size_t i = 0; i < t->n_classes; i++)
        if (s->classes[i].requests) table_row(f, "class", &s->classes[i]);
    table_row(f, "", &s->all);
    fprintf(f, "(latencies in ms unless marked s; percentiles interpolate between ranks)\n");
    bool any = false;
    for (int i = 1; i < SCHED_REJECT__COUNT; i++)
        if (s->all.rejects[i]) {
            fprintf(f, "%s %s %llu", any ? "," : "\nrejects by reason:", sched_reject_name(i),
                    (unsigned long long)s->all.rejects[i]);
            any = true;
        }
    for (int i = 0; i < SCHED_TIMEOUT__COUNT; i++)
        if (s->all.timeouts_by[i]) {
            fprintf(f, "%s timeout:%s %llu",
                    any ? "," : "\nrejects by reason:", sched_timeout_name(i),
                    (unsigned long long)s->all.timeouts_by[i]);
            any = true;
        }
    if (any) fprintf(f, "\n");
    if (s->has_burst)
        fprintf(f, "\nburst    %.1f–%.1f s: %s\n", s->burst_start_s, s->burst_end_s,
                s->recovery_text);
    if (s->has_fidelity)
        fprintf(f,
                "\nfidelity relative error vs the recorded run: TTFT median %.1f%% p99 %.1f%% (n "
                "%zu); E2E median %.1f%% p99 %.1f%% (n %zu)\n",
                100 * s->ttft_rel_err.p50, 100 * s->ttft_rel_err.p99, s->ttft_rel_err.n,
                100 * s->e2e_rel_err.p50, 100 * s->e2e_rel_err.p99, s->e2e_rel_err.n);
    if (s->has_fidelity)
        fprintf(f,
                "         simulated / recorded, median: TTFT %.2f, E2E %.2f (below 1: the "
                "simulation is faster than the real run)\n",
                s->ttft_ratio.p50, s->e2e_ratio.p50);
    if (s->verdict >= 0)
        fprintf(f, "\nverdict  %s: %s — %s\n", s->verdict_name, s->verdict ? "PASS" : "FAIL",
                s->verdict_text);
    if (r->warnings[0]) fprintf(f, "\nwarning  %s\n", r->warnings);
}

void sim_report_compare(FILE *f, const sim_run *const *runs, const sim_summary *const *sums,
                        size_t n)
{
    fprintf(f, "%-26s", "policy");
    for (size_t i = 0; i < n; i++) fprintf(f, " %18.18s", runs[i]->policy_name);
    fprintf(f, "\n");
#define ROW(label, fmt, expr)                                                                      \
    do {                                                                                           \
        fprintf(f, "%-26s", label);                                                                \
        for (size_t i = 0; i < n; i++) {                                                           \
            const sim_run *r = runs[i];                                                            \
            const sim_summary *s = sums[i];                                                        \
            (void)r;                                                                               \
            (void)s;                                                                               \
            fprintf(f, " %18" fmt, expr);                                                          \
        }                                                                                          \
        fprintf(f, "\n");                                                                          \
    } while (0)
    ROW("mode", "s", r->mode);
    ROW("hash", "s", r->policy_hash);
    ROW("ttft p50 / p99 ms", "s", ({
            static char b[64];
            snprintf(b, sizeof b, "%.1f / %.1f", s->all.ttft.p50, s->all.ttft.p99);
            b;
        }));
    ROW("tpot p50 / p99 ms", "s", ({
            static char b[64];
            snprintf(b, sizeof b, "%.2f / %.2f", s->all.tpot.p50, s->all.tpot.p99);
            b;
        }));
    ROW("e2e p50 / p99 ms", "s", ({
            static char b[64];
            snprintf(b, sizeof b, "%.0f / %.0f", s->all.e2e.p50, s->all.e2e.p99);
            b;
        }));
    ROW("queue wait p99 ms", ".1f", s->all.wait.p99);
    ROW("longest starvation ms", ".1f", s->all.longest_starvation_ms);
    ROW("longest inter-token ms", ".1f", s->all.itl_max.max);
    ROW("finished", "zu", s->all.finished);
    ROW("rejected", "zu", s->all.rejected);
    ROW("timed out", "zu", s->all.timeouts);
    ROW("cancelled", "zu", s->all.cancels);
    ROW("preempt swap / recompute", "s", ({
            static char b[64];
            snprintf(b, sizeof b, "%llu / %llu", (unsigned long long)s->all.preempt_swap,
                     (unsigned long long)s->all.preempt_recompute);
            b;
        }));
    ROW("SLO attainment %", ".1f", 100 * s->all.slo_attainment);
    ROW("goodput req/s", ".2f", s->all.goodput_rps);
    ROW("throughput tok/s", ".0f", s->tokens_per_s);
    ROW("output tok/s", ".0f", s->output_tokens_per_s);
    ROW("KV device blocks / rings", "s", ({
            static char b[64];
            if (r->window.rings)
                snprintf(b, sizeof b, "%u / %u", r->kv_blocks_device, r->window.rings);
            else
                snprintf(b, sizeof b, "%u / -", r->kv_blocks_device);
            b;
        }));
    ROW("sequences a step (mean)", ".2f", r->steps ? (double)r->entries / (double)r->steps : 0);
    ROW("Jain index", ".3f", s->jain);
    ROW("slot occupancy %", ".1f", 100 * s->occupancy);
    ROW("padding %", ".2f", 100 * s->pad_share);
    ROW("longest step ms", ".1f", s->max_step_ms);
    ROW("sim s / wall s", "s", ({
            static char b[64];
            snprintf(b, sizeof b, "%.0f / %.2f", s->sim_s, s->wall_s);
            b;
        }));
    ROW("verdict", "s", s->verdict < 0 ? "-" : s->verdict ? "PASS" : "FAIL");
    /* per tenant: the first run's tenants (every run replays the same trace) */
    for (size_t k = 0; k < sums[0]->n_tenants && k < 16; k++) {
        if (!sums[0]->tenants[k].requests) continue;
        char label[64];
        snprintf(label, sizeof label, "%.12s ttft99 ms / share", sums[0]->tenants[k].name);
        ROW(label, "s", ({
                static char b[64];
                snprintf(b, sizeof b, "%.0f / %.1f%%", s->tenants[k].ttft.p99,
                         100 * s->tenants[k].token_share);
                b;
            }));
    }
    for (size_t k = 0; k < sums[0]->n_classes && k < 16; k++) {
        if (!sums[0]->classes[k].requests) continue;
        char label[64];
        snprintf(label, sizeof label, "%.12s ttft99 / starve ms", sums[0]->classes[k].name);
        ROW(label, "s", ({
                static char b[64];
                snprintf(b, sizeof b, "%.0f / %.0f", s->classes[k].ttft.p99,
                         s->classes[k].longest_starvation_ms);
                b;
            }));
    }
#undef ROW
    for (size_t i = 0; i < n; i++)
        if (sums[i]->verdict >= 0)
            fprintf(f, "  %s: %s\n", runs[i]->policy_name, sums[i]->verdict_text);
        else if (sums[i]->has_burst)
            fprintf(f, "  %s: %s\n", runs[i]->policy_name, sums[i]->recovery_text);
}

/* ---- CSV -------------------------------------------------------------------------------------- */

static int open_in(const char *dir, const char *stem, const char *tag, const char *ext, FILE **f,
                   char *path, size_t pl)
{
    if (mkdir(dir, 0777) < 0 && errno != EEXIST)
        return sim_err_setc(-errno, "%s: %s", dir, strerror(errno));
    snprintf(path, pl, "%s/%s%s%s.%s", dir, stem, tag && *tag ? "-" : "", tag ? tag : "", ext);
    *f = fopen(path, "w");
    if (!*f) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
    return 0;
}

int sim_report_csv(const char *dir, const char *tag, const sim_run *r)
{
    const sim_trace *t = r->trace;
    char path[1024];
    FILE *f;
    int rc = open_in(dir, "timeseries", tag, "csv", &f, path, sizeof path);
    if (rc) return rc;
    fprintf(f, "t_s,waiting,running,swapped,in_transit,kv_device_blocks,kv_host_blocks,kv_disk_"
               "blocks,kv_device_pct,steps,tokens_per_step");
    for (unsigned i = 0; i < t->n_tenants; i++) fprintf(f, ",served_tok_per_s_%s", t->tenants[i]);
    fprintf(f, "\n");
    for (size_t i = 0; i < r->ts_rows; i++) {
        const double *row = &r->ts[i * r->ts_cols];
        fprintf(f, "%.3f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.3f,%.0f,%.2f", row[0], row[1], row[2],
                row[3], row[4], row[5], row[6], row[7], row[8], row[9], row[10]);
        double dt = i ? row[0] - r->ts[(i - 1) * r->ts_cols] : 0;
        for (unsigned k = 0; k < t->n_tenants; k++) {
            double prev = i ? r->ts[(i - 1) * r->ts_cols + SIM_TS_FIXED_COLS + k] : 0;
            fprintf(f, ",%.1f", dt > 0 ? (row[SIM_TS_FIXED_COLS + k] - prev) / dt : 0);
        }
        fprintf(f, "\n");
    }
    if (fclose(f)) return sim_err_setc(-EIO, "%s: write error", path);
    if ((rc = open_in(dir, "requests", tag, "csv", &f, path, sizeof path))) return rc;
    fprintf(f,
            "req,src_id,attempts,tenant,class,arrival_s,prompt_tokens,output_tokens,outcome,reason,"
            "queue_wait_ms,ttft_ms,e2e_ms,generated,preempt_swap,preempt_recompute,max_starvation_"
            "ms%s\n",
            t->has_real ? ",real_ttft_ms,real_e2e_ms" : "");
    static const char *out_names[] = {"pending", "finished", "rejected", "timeout", "cancelled"};
    for (size_t i = 0; i < t->n; i++) {
        if (r->final_rec[i] == UINT32_MAX) continue;
        const sim_req *q = &t->reqs[i];
        const sim_rec *x = &r->recs[r->final_rec[i]];
        const char *reason = "";
        if (x->outcome == SIM_OUT_REJECTED)
            reason = sched_reject_name(x->reason);
        else if (x->outcome == SIM_OUT_TIMEOUT)
            reason = sched_timeout_name(x->reason);
        else if (x->outcome == SIM_OUT_CANCELLED)
            reason = sched_cancel_name(x->reason);
        else if (x->outcome == SIM_OUT_FINISHED)
            reason = sched_finish_name(x->reason);
        fprintf(f, "%zu,%llu,%u,%s,%s,%.6f,%u,%u,%s,%s,", i, (unsigned long long)q->src_id,
                x->attempt, t->tenants[q->tenant], t->classes[q->klass],
                (double)q->arrival_us / 1e6, q->prompt_tokens, q->output_tokens,
                out_names[x->outcome < 5 ? x->outcome : 0], reason);
        if (x->first_sched_us >= 0) fprintf(f, "%.3f", ms(x->first_sched_us - q->arrival_us));
        fprintf(f, ",");
        if (x->first_token_us >= 0) fprintf(f, "%.3f", ms(x->first_token_us - q->arrival_us));
        fprintf(f, ",");
        if (x->outcome == SIM_OUT_FINISHED) fprintf(f, "%.3f", ms(x->end_us - q->arrival_us));
        fprintf(f, ",%u,%u,%u,%.3f", x->generated, x->preempt_swap, x->preempt_recompute,
                ms(x->max_starve_us));
        if (t->has_real) { /* the recorded run, for per-request fidelity plots */
            fputc(',', f);
            if (q->real_first_token_us != SIM_NO_TIME)
                fprintf(f, "%.3f", ms(q->real_first_token_us - q->arrival_us));
            fputc(',', f);
            if (q->real_finish_us != SIM_NO_TIME &&
                (q->real_reason == SIM_REAL_LENGTH || q->real_reason == SIM_REAL_STOP))
                fprintf(f, "%.3f", ms(q->real_finish_us - q->arrival_us));
        }
        fputc('\n', f);
    }
    if (fclose(f)) return sim_err_setc(-EIO, "%s: write error", path);
    return 0;
}
