/* SPDX-License-Identifier: MIT */
/* cost.c — the cost model: the step-time prediction over sched_plan_work, prefill and swap
 * costs, the predicted queue wait, and every observe_* update (measured step time, prefill
 * rate under backlog, transfer bandwidth). */
#include "sched/internal.h"

/* ---- the step model ---------------------------------------------------------------------- */

void sched_step_model_default(sched_step_model *m)
{
    /* Llama-3-8B, bf16, one H200 (4.8 TB/s HBM, ~990 TFLOP/s dense bf16):
     *  base: every step streams the 16.06 GB of weights once → 3.35 ms at full bandwidth;
     *  prefill token: 2 × 8.03 GFLOP = 16 GFLOP → 16.2 µs at peak; at a realistic 55% MFU 29 µs;
     *  decode sequence: the same FLOPs, but batched decode is still bandwidth-bound, so add
     *        the per-sequence sampling/activation overhead seen in vLLM traces: 30 µs;
     *  context token: KV read per token per step = 32 layers × 8 KV heads × 128 × 2 (K,V)
     *        × 2 bytes = 128 KiB → 0.027 µs at 4.8 TB/s;
     *  prefill attention: inside the context term at this level of detail (0). */
    *m = (sched_step_model){.base_us = 3350,
                            .prefill_token_us = 29,
                            .decode_seq_us = 30,
                            .context_token_us = 0.027,
                            .prefill_pair_us = 0};
}

void sched_plan_work_terms(const sched_plan_work *w, double x[SCHED_STEP_TERMS])
{
    x[0] = 1;
    x[1] = (double)w->prefill_tokens;
    x[2] = (double)w->decode_seqs;
    x[3] = (double)w->context_tokens;
    x[4] = w->prefill_pairs;
}

double sched_step_model_us(const sched_step_model *m, const sched_plan_work *w)
{
    return m->base_us + m->prefill_token_us * (double)w->prefill_tokens +
           m->decode_seq_us * (double)w->decode_seqs +
           m->context_token_us * (double)w->context_tokens + m->prefill_pair_us * w->prefill_pairs;
}

/* The scheduler's prediction for a batch of that shape (prefill attention as given: 0 where
 * the batch is hypothetical), times the measured correction. */
double sc_predict_step_us(const sched *s, uint64_t prefill, uint64_t decode, uint64_t ctx,
                          double pairs)
{
    sched_plan_work w = {.prefill_tokens = prefill,
                         .decode_seqs = (uint32_t)decode,
                         .context_tokens = ctx,
                         .prefill_pairs = pairs};
    return sched_step_model_us(&s->conf.step, &w) * s->corr;
}

uint64_t sc_context_charge(const sched *s, uint64_t ctx)
{
    if (!s->win || ctx <= s->win) return ctx;
    const uint64_t global = s->win_of - s->win_layers;
    return (ctx * global + (uint64_t)s->win * s->win_layers + s->win_of / 2) / s->win_of;
}

/* Σ min(p, w) over p in [a, b): what rows at positions a..b-1 read on a windowed layer */
static double sum_min(double a, double b, double w)
{
    if (b <= a) return 0;
    if (b <= w) return (a + b - 1) * (b - a) / 2;
    if (a >= w) return w * (b - a);
    return (a + w - 1) * (w - a) / 2 + w * (b - w);
}

double sc_pairs_charge(const sched *s, double start, double n)
{
    const double all = n * start + n * (n - 1) / 2; /* each row attends to those before it */
    if (!s->win || start + n <= s->win) return all;
    const double global = s->win_of - s->win_layers;
    return (all * global + sum_min(start, start + n, s->win) * s->win_layers) / s->win_of;
}

/* Prefill time for a context of n tokens, from the step model: the marginal per-token cost
 * plus the attention over the growing context, chunk by chunk. */
double sc_prefill_us(const sched *s, uint64_t n)
{
    const sched_config *c = &s->conf;
    double chunk = s->cfg.mode == SCHED_MODE_TOKEN_BUDGET ? s->cfg.prefill_chunk : (double)n;
    if (chunk < 1) chunk = 1;
    double steps = ceil((double)n / chunk);
    /* chunk j (1-based) ends at context j × chunk, the last one at n: the step model charges
     * each step for the context of the sequences in it */
    double ctx = steps > 0 ? chunk * (steps - 1) * steps / 2 + (double)n : 0;
    if (s->win && n > s->win) {
        /* a windowed layer reads min(j × chunk, window) in chunk j */
        double k = floor((double)s->win / chunk);
        if (k > steps - 1) k = steps - 1;
        double win = chunk * k * (k + 1) / 2 + (steps - 1 - k) * s->win + s->win;
        double global = s->win_of - s->win_layers;
        ctx = (ctx * global + win * s->win_layers) / s->win_of;
    }
    /* the chunks' attention pairs add up to the whole prompt's, n(n-1)/2 */
    double pairs = sc_pairs_charge(s, 0, (double)n);
    double us = c->step.prefill_token_us * (double)n + c->step.context_token_us * ctx +
                c->step.prefill_pair_us * pairs;
    return us * s->corr;
}

/* A step was committed: its measured duration corrects the model (EWMA of measured /
 * predicted), and the prompt tokens it prefilled while work waited feed the measured prefill
 * rate admission predicts waits from (exponentially decayed sums, ~0.5 s memory).  The rate
 * is over wall time: a waiting request waits through the caller's work between two steps
 * (its loop's I/O, token delivery) and any time the host gives the CPU to others, not only
 * through the steps — counting the steps alone, a loaded ringlmd under ASan measured 1.3-1.7x
 * the rate its queue drained at, and admitted requests that then waited up to 3.4x the
 * prediction.  So when the step before was backlogged too and this one followed it directly,
 * the interval runs from that step's commit. */
void sc_observe_step(sched *s, uint64_t now, uint64_t prefilled, uint64_t step_us)
{
    if (s->plan_backlogged && now > s->plan.now_us) {
        uint64_t from =
            s->rate_mark_us && s->rate_mark_us <= s->plan.now_us ? s->rate_mark_us : s->plan.now_us;
        double dt = (double)(now - from);
        double decay = exp(-dt / 5e5);
        s->rate_tok = s->rate_tok * decay + (double)prefilled;
        s->rate_us = s->rate_us * decay + dt;
        s->plan_backlogged = false;
        s->rate_mark_us = now;
    } else {
        s->rate_mark_us = 0;
    }
    if (step_us && s->last_pred_us > 0) {
        double ratio = (double)step_us / s->last_pred_us * s->corr;
        if (ratio < 0.01) ratio = 0.01;
        if (ratio > 100) ratio = 100;
        s->corr = 0.8 * s->corr + 0.2 * ratio;
        s->last_pred_us = 0;
    }
}

/* A transfer completed: realised vs predicted, and the measured bandwidth for its tier and
 * direction (the first measurement replaces the configured guess, later ones are averaged;
 * latency stays configured). */
void sc_observe_transfer(sched *s, const xfer_rec *x, uint64_t bytes, uint64_t dur_us, int status)
{
    tier_est *te = &s->tiers[x->tier];
    if (status == 0 && dur_us) {
        s->xfer_measured++;
        s->xfer_pred_sum += x->pred_us;
        s->xfer_real_sum += (double)dur_us;
    }
    if (status == 0 && bytes && dur_us) {
        double bps = (double)bytes / ((double)dur_us / 1e6);
        bool out = x->dir == SCHED_XFER_OUT;
        double *est = out ? &te->out_bps : &te->in_bps;
        bool *seen = out ? &te->out_measured : &te->in_measured;
        *est = *seen ? 0.7 * *est + 0.3 * bps : bps;
        *seen = true;
    }
}

/* Predicted wait before the first token for a request of tenant `tenant` in class cls with
 * `prompt` tokens: the queued prompt work that will be served before it, at the measured
 * prefill rate of a step that also carries today's decoders.  Classes of higher priority go
 * first whole; within classes of its own priority the fair share interleaves the tenants, so
 * another tenant's backlog counts only up to the weighted size of this tenant's own (its
 * queued tokens plus this prompt): a light tenant is not told to wait behind a flood it will
 * be served ahead of, and a queue-wait bound refuses the tenant that floods, not every one. */
double sc_predict_wait_us(const sched *s, int cls, int tenant, uint32_t prompt, uint64_t now)
{
    uint64_t ahead = prompt, same = 0;
    uint64_t head_age = 0;
    int prio = s->cls[cls]->priority;
    /* this tenant's backlog in its own priority's classes, at most what those classes hold */
    for (int c = 0; c < s->n_classes; c++)
        if (s->cls[c]->priority == prio) same += s->cs[c].queued_tokens;
    uint64_t own = s->ts[tenant].st.queued_tokens < same ? s->ts[tenant].st.queued_tokens : same;
    double mine = ((double)own + prompt) / s->ten[tenant]->weight; /* in virtual tokens */
    double fair = 0;
    for (int u = 0; u < s->n_tenants; u++) {
        double q = (double)s->ts[u].st.queued_tokens;
        fair += u == tenant ? (double)own : fmin(q, mine * s->ten[u]->weight);
    }
    ahead += (uint64_t)fmin(fair, (double)same);
    for (int c = 0; c < s->n_classes; c++) {
        if (s->cls[c]->priority < prio) continue;
        if (s->cls[c]->priority > prio) ahead += s->cs[c].queued_tokens;
        if (!s->cs[c].n_waiting) continue;
        const heap *row = &s->wait[(size_t)c * (size_t)s->n_tenants];
        for (int t = 0; t < s->n_tenants; t++) {
            if (!row[t].n) continue;
            /* a head waits as long as the queue of its tenant takes: only heads of tenants
             * served no later than this one (higher classes, or a backlog no larger) say how
             * long this request will wait */
            if (s->cls[c]->priority == prio && t != tenant &&
                (double)s->ts[t].st.queued_tokens / s->ten[t]->weight > mine)
                continue;
            const req *h = &s->reqs[row[t].a[0].slot];
            if (!h->started && now > h->arrival_us && now - h->arrival_us > head_age)
                head_age = now - h->arrival_us;
        }
    }
    if (s->rate_us >= 200000) {
        /* measured: prompt tokens actually prefilled per µs while work was waiting.  This
         * sees what the model cannot — max_active_seqs binding, KV blocks short, decodes
         * crowding the budget — so it is preferred once there is enough history.  When
         * admissions come in clumps (KV freed by bursts of finishing sequences) the rate
         * lags; the age of the oldest request still waiting is then the better witness of
         * how long the queue takes to drain, so the larger of the two is used. */
        double rate = s->rate_tok / s->rate_us;
        if (rate < 1e-6) rate = 1e-6;
        double w = (double)ahead / rate;
        return w > (double)head_age ? w : (double)head_age;
    }
    uint64_t dec = s->run.n;
    uint64_t budget = s->cfg.token_budget;
    uint64_t per_step = budget > dec ? budget - dec : 1;
    double step = sc_predict_step_us(s, per_step, dec, s->plan.context_tokens, 0);
    return ceil((double)ahead / (double)per_step) * step;
}

double sc_swap_cost_us(const sched *s, sched_pool tier, uint64_t bytes)
{
    const tier_est *t = &s->tiers[tier];
    /* transfers already queued on the link delay this one: swapping can become the second
     * bottleneck, and then recompute wins even for long contexts */
    return ((double)t->queued_out + (double)bytes) / t->out_bps * 1e6 +
           ((double)t->queued_in + (double)bytes) / t->in_bps * 1e6 + 2.0 * t->lat_us;
}

void sched_plan_work_of(const sched_plan *p, sched_plan_work *w)
{
    memset(w, 0, sizeof *w);
    if (!p) return;
    w->prefill_tokens = (uint64_t)p->prefill_tokens + p->pad_tokens;
    w->decode_seqs = p->n_decode;
    w->context_tokens = p->context_tokens;
    w->prefill_pairs = p->prefill_pairs;
    for (uint32_t i = 0; i < p->n_entries; i++) {
        const sched_entry *e = &p->entries[i];
        if (e->prefill)
            w->prefill_seqs++;
        else
            w->decode_context += (double)e->start_pos + e->n_tokens;
    }
}

int sched_get_tier_cost(const sched *s, sched_pool pool, sched_tier_cost *out, bool *measured_out,
                        bool *measured_in)
{
    if (!s || (pool != SCHED_POOL_HOST && pool != SCHED_POOL_DISK)) return -EINVAL;
    const tier_est *te = &s->tiers[pool];
    *out = (sched_tier_cost){
        .out_bytes_per_s = te->out_bps, .in_bytes_per_s = te->in_bps, .latency_us = te->lat_us};
    if (measured_out) *measured_out = te->out_measured;
    if (measured_in) *measured_in = te->in_measured;
    return 0;
}

void sched_get_cost_state(const sched *s, sched_cost_state *out)
{
    memset(out, 0, sizeof *out);
    out->step = s->conf.step;
    out->correction = s->corr;
    for (int p = SCHED_POOL_HOST; p < SCHED_POOL__COUNT; p++)
        if (s->pools[p].total) {
            out->tier[p] = (sched_tier_cost){.out_bytes_per_s = s->tiers[p].out_bps,
                                             .in_bytes_per_s = s->tiers[p].in_bps,
                                             .latency_us = s->tiers[p].lat_us};
            out->out_measured[p] = s->tiers[p].out_measured;
            out->in_measured[p] = s->tiers[p].in_measured;
        }
}

const char *sc_step_model_fault(const sched_step_model *m, const char **why)
{
    if (!(m->prefill_token_us > 0) || !isfinite(m->prefill_token_us)) {
        *why = "must be a number > 0";
        return "step.prefill_token_us";
    }
    double nums[] = {m->base_us, m->decode_seq_us, m->context_token_us, m->prefill_pair_us};
    for (int i = 0; i < 4; i++)
        if (!(nums[i] >= 0) || !isfinite(nums[i])) {
            *why = "must be a finite number >= 0";
            return "step model coefficient";
        }
    return NULL;
}

static int bad_state(const char *field, const char *why)
{
    sched__set_error("sched_set_cost_state: %s %s", field, why);
    return -EINVAL;
}

int sched_set_cost_state(sched *s, const sched_cost_state *in)
{
    const sched_step_model *m = &in->step;
    const char *why, *field = sc_step_model_fault(m, &why);
    if (field) return bad_state(field, why);
    if (!(in->correction > 0) || !isfinite(in->correction))
        return bad_state("correction", "must be a finite number > 0");
    for (int p = SCHED_POOL_HOST; p < SCHED_POOL__COUNT; p++) {
        const sched_tier_cost *t = &in->tier[p];
        if (!t->out_bytes_per_s && !t->in_bytes_per_s && !t->latency_us) continue;
        if (!(t->out_bytes_per_s > 0) || !isfinite(t->out_bytes_per_s) ||
            !(t->in_bytes_per_s > 0) || !isfinite(t->in_bytes_per_s) || !(t->latency_us >= 0) ||
            !isfinite(t->latency_us))
            return bad_state(sched_pool_name((sched_pool)p),
                             "tier needs bandwidths > 0 and latency >= 0");
    }
    s->conf.step = *m;
    s->corr = in->correction;
    for (int p = SCHED_POOL_HOST; p < SCHED_POOL__COUNT; p++) {
        const sched_tier_cost *t = &in->tier[p];
        if (!s->pools[p].total || (!t->out_bytes_per_s && !t->in_bytes_per_s && !t->latency_us))
            continue;
        tier_est *te = &s->tiers[p];
        te->out_bps = t->out_bytes_per_s;
        te->in_bps = t->in_bytes_per_s;
        te->lat_us = t->latency_us;
        te->out_measured = in->out_measured[p];
        te->in_measured = in->in_measured[p];
    }
    return 0;
}

/* ---- least squares ----------------------------------------------------------------------- */

/* Solve the normal equations of the terms in mask from the weighted Gram matrix g of the rows
 * [x, y] (index k is y).  Columns are scaled to a unit diagonal first, so a pivot below the
 * threshold means that term is (nearly) a combination of the ones before it — no variance of
 * its own to fit.  Returns 0 with beta (terms outside mask 0) and the weighted residual sum of
 * squares, or -1. */
static int lsq_solve(long double g[SCHED_LSQ_MAX_TERMS + 1][SCHED_LSQ_MAX_TERMS + 1], int k,
                     unsigned mask, double *beta, long double *sse)
{
    int idx[SCHED_LSQ_MAX_TERMS], m_k = 0;
    long double m[SCHED_LSQ_MAX_TERMS][SCHED_LSQ_MAX_TERMS + 1], d[SCHED_LSQ_MAX_TERMS],
        x[SCHED_LSQ_MAX_TERMS];
    for (int j = 0; j < k; j++) {
        beta[j] = 0;
        if (!(mask >> j & 1)) continue;
        if (!(g[j][j] > 0)) return -1; /* the column is all zero */
        idx[m_k++] = j;
    }
    for (int r = 0; r < m_k; r++) d[r] = 1 / sqrtl(g[idx[r]][idx[r]]);
    for (int r = 0; r < m_k; r++) {
        for (int c = 0; c < m_k; c++) m[r][c] = g[idx[r]][idx[c]] * d[r] * d[c];
        m[r][m_k] = g[idx[r]][k] * d[r];
    }
    /* symmetric positive (semi)definite: elimination without pivoting; the pivot is
     * 1 − R² of the column against those before it */
    for (int c = 0; c < m_k; c++) {
        if (!(m[c][c] > 1e-11L)) return -1;
        for (int r = c + 1; r < m_k; r++) {
            long double f = m[r][c] / m[c][c];
            for (int j = c; j <= m_k; j++) m[r][j] -= f * m[c][j];
        }
    }
    for (int c = m_k - 1; c >= 0; c--) {
        long double v = m[c][m_k];
        for (int j = c + 1; j < m_k; j++) v -= m[c][j] * x[j];
        x[c] = v / m[c][c];
    }
    long double fit = 0;
    for (int r = 0; r < m_k; r++) {
        long double b = x[r] * d[r];
        if (!isfinite((double)b)) return -1;
        beta[idx[r]] = (double)b;
        fit += b * g[idx[r]][k];
    }
    *sse = g[k][k] - fit;
    return 0;
}

int sched_lsq(const double *x, const double *y, const double *w, size_t n, int k, unsigned fit_mask,
              unsigned nonneg_mask, double *beta, unsigned *used, double *wsse)
{
    if (k < 1 || k > SCHED_LSQ_MAX_TERMS || !x || !y || !beta) return -1;
    long double g[SCHED_LSQ_MAX_TERMS + 1][SCHED_LSQ_MAX_TERMS + 1] = {{0}};
    for (size_t i = 0; i < n; i++) {
        long double wi = w ? w[i] : 1.0L;
        if (wi == 0) continue;
        long double a[SCHED_LSQ_MAX_TERMS + 1];
        for (int j = 0; j < k; j++) a[j] = x[i * (size_t)k + (size_t)j];
        a[k] = y[i];
        for (int r = 0; r <= k; r++)
            for (int c = 0; c <= r; c++) g[r][c] += wi * a[r] * a[c];
    }
    for (int r = 0; r <= k; r++)
        for (int c = r + 1; c <= k; c++) g[r][c] = g[c][r];
    fit_mask &= (1u << k) - 1;
    for (int j = 0; j < k; j++)
        if (!(g[j][j] > 0)) fit_mask &= ~(1u << j); /* nothing to fit it from */
    for (int j = 0; j < k; j++) beta[j] = 0;
    double b[SCHED_LSQ_MAX_TERMS];
    long double sse;
    if (!(nonneg_mask & fit_mask)) {
        if (!fit_mask || lsq_solve(g, k, fit_mask, b, &sse) < 0) return -1;
        memcpy(beta, b, (size_t)k * sizeof *b);
        if (used) *used = fit_mask;
        if (wsse) *wsse = (double)sse;
        return 0;
    }
    /* g[y][y] = Σ w y²: the tolerance of a tie is relative to it */
    long double tol = 1e-12L * g[k][k], best = 0;
    int found = 0;
    for (int pc = 1; pc <= k; pc++) {
        for (unsigned mask = 1; mask < 1u << k; mask++) {
            if ((mask & ~fit_mask) || __builtin_popcount(mask) != pc) continue;
            if (lsq_solve(g, k, mask, b, &sse) < 0) continue;
            bool neg = false;
            for (int j = 0; j < k; j++) neg |= (nonneg_mask >> j & 1) && b[j] < 0;
            if (neg) continue;
            if (found && !(sse < best - tol)) continue;
            found = 1;
            best = sse;
            if (used) *used = mask;
            memcpy(beta, b, (size_t)k * sizeof *b);
        }
    }
    if (found && wsse) *wsse = (double)best;
    return found ? 0 : -1;
}
