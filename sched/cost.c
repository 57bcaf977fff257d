/* SPDX-License-Identifier: MIT */
/* cost.c — the cost model: the step-time prediction over sched_plan_work, prefill and swap
 * costs, the predicted queue wait, and every observe_* update (measured step time, prefill
 * rate under backlog, transfer bandwidth). */
#include "sched/internal.h"

double sc_predict_step_us(const sched *s, uint64_t prefill, uint64_t decode, uint64_t ctx)
{
    const sched_config *c = &s->conf;
    double us = c->step_base_us + c->prefill_us_per_token * (double)prefill +
                c->decode_us_per_seq * (double)decode + c->context_us_per_token * (double)ctx;
    return us * s->corr;
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
    double us = c->prefill_us_per_token * (double)n + c->context_us_per_token * ctx;
    return us * s->corr;
}

/* A step was committed: its measured duration corrects the model (EWMA of measured /
 * predicted), and the prompt tokens it prefilled while work waited feed the measured prefill
 * rate admission predicts waits from (exponentially decayed sums, ~2 s memory). */
void sc_observe_step(sched *s, uint64_t now, uint64_t prefilled, uint64_t step_us)
{
    if (s->plan_backlogged && now > s->plan.now_us) {
        double dt = (double)(now - s->plan.now_us);
        double decay = exp(-dt / 5e5);
        s->rate_tok = s->rate_tok * decay + (double)prefilled;
        s->rate_us = s->rate_us * decay + dt;
        s->plan_backlogged = false;
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

/* Predicted wait before the first token for a request of class cls with `prompt` tokens:
 * the queued prompt work of classes at least as important, at the measured prefill rate of a
 * step that also carries today's decoders. */
double sc_predict_wait_us(const sched *s, int cls, uint32_t prompt, uint64_t now)
{
    uint64_t ahead = prompt;
    uint64_t head_age = 0;
    for (int c = 0; c < s->n_classes; c++) {
        if (s->cls[c]->priority < s->cls[cls]->priority) continue;
        ahead += s->cs[c].queued_tokens;
        if (!s->cs[c].n_waiting) continue;
        const heap *row = &s->wait[(size_t)c * (size_t)s->n_tenants];
        for (int t = 0; t < s->n_tenants; t++) {
            if (!row[t].n) continue;
            const req *h = &s->reqs[row[t].a[0].slot];
            if (!h->started && now > h->arrival_us && now - h->arrival_us > head_age) head_age = now - h->arrival_us;
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
    double step = sc_predict_step_us(s, per_step, dec, s->plan.context_tokens);
    return ceil((double)ahead / (double)per_step) * step;
}

double sc_swap_cost_us(const sched *s, int tier, uint64_t bytes)
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
    for (uint32_t i = 0; i < p->n_entries; i++) {
        const sched_entry *e = &p->entries[i];
        double n = e->n_tokens;
        if (!e->prefill) {
            w->decode_context += (double)e->start_pos + n;
            continue;
        }
        w->prefill_seqs++;
        w->prefill_pairs += n * e->start_pos + n * (n - 1) / 2; /* each row attends to those before it */
    }
}

int sched_get_tier_cost(const sched *s, sched_pool pool, sched_tier_cost *out,
                        bool *measured_out, bool *measured_in)
{
    if (!s || (pool != SCHED_POOL_HOST && pool != SCHED_POOL_DISK)) return -EINVAL;
    const tier_est *te = &s->tiers[pool];
    *out = (sched_tier_cost){.out_bytes_per_s = te->out_bps, .in_bytes_per_s = te->in_bps,
                             .latency_us = te->lat_us};
    if (measured_out) *measured_out = te->out_measured;
    if (measured_in) *measured_in = te->in_measured;
    return 0;
}
