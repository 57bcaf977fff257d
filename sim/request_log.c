/* ringlm — the simulated run as a native request log (formats/request_log.h writes each
 * line). SPDX-License-Identifier: MIT */
#include "sim/report.h"
#include "sim/err.h"
#include "formats/request_log.h"

/* a line with every block hash a line may carry (FMT_HASH_IDS_MAX, up to 20 digits each) */
#define LINE_MAX_BYTES (2048 + 21 * FMT_HASH_IDS_MAX)

#include <errno.h>
#include <stdlib.h>

/* ---- native request log ------------------------------------------------------------------ */

static int cmp_finish(const void *a, const void *b, void *ctx)
{
    const sim_run *r = ctx;
    const sim_rec *x = &r->recs[r->final_rec[*(const uint32_t *)a]],
                  *y = &r->recs[r->final_rec[*(const uint32_t *)b]];
    if (x->end_us != y->end_us) return x->end_us < y->end_us ? -1 : 1;
    return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

/* The names the scheduler resolved (as the daemon's log records them): an unlabelled
 * trace's "default" becomes the policy's default class, and a replay keeps it. */
static const char *run_tenant_name(const sim_run *r, unsigned trace_tenant)
{
    int k = r->tenant_map[trace_tenant];
    const sched_tenant_cfg *c = k >= 0 ? sched_policy_tenant(r->opt.policy, k) : NULL;
    return c ? c->name : r->trace->tenants[trace_tenant];
}

static const char *run_class_name(const sim_run *r, unsigned trace_class)
{
    int k = r->class_map[trace_class];
    const sched_class_cfg *c = k >= 0 ? sched_policy_class(r->opt.policy, k) : NULL;
    return c ? c->name : r->trace->classes[trace_class];
}

/* arrival_us is written as the daemon writes it: when the (simulated) loop saw the request,
 * at the start of the step at or after its arrival (the final attempt's, for a retried one). */
int sim_report_request_log(FILE *f, const sim_run *r)
{
    const sim_trace *t = r->trace;
    uint32_t *order = malloc((t->n ? t->n : 1) * sizeof *order);
    if (!order) return -ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++)
        if (r->final_rec[i] != UINT32_MAX) order[n++] = (uint32_t)i;
    qsort_r(order, n, sizeof *order, cmp_finish, (void *)r);
    char *line = malloc(LINE_MAX_BYTES);
    if (!line) {
        free(order);
        return -ENOMEM;
    }
    for (size_t k = 0; k < n; k++) {
        const sim_req *q = &t->reqs[order[k]];
        const sim_rec *x = &r->recs[r->final_rec[order[k]]];
        /* the daemon's vocabulary (sched_end_code): what a client of the replayed run saw */
        sched_end_code fc = SCHED_END_ERROR, cause = SCHED_END_NONE;
        switch (x->outcome) {
        case SIM_OUT_FINISHED:
            fc = x->reason == SCHED_FINISH_LENGTH ? SCHED_END_LENGTH : SCHED_END_STOP;
            break;
        case SIM_OUT_REJECTED:
            fc = SCHED_END_REJECTED;
            cause = sched_reject_cause(x->reason);
            break;
        case SIM_OUT_TIMEOUT: fc = SCHED_END_TIMEOUT; break;
        case SIM_OUT_CANCELLED: fc = SCHED_END_CANCELLED; break;
        }
        const char *fr = sched_end_name(fc),
                   *rr = fc == SCHED_END_REJECTED ? sched_end_name(cause) : NULL;
        /* the answer's block hashes as far as this run's answer went: the full blocks of
         * prompt + generated past the prompt's hashes whose KV was computed — the last
         * token generated is fed back only when a recorded stop token was sampled after it
         * (engine.c), as ringlmd writes them */
        uint32_t hb = q->hash_block_tokens ? q->hash_block_tokens : 1, n_ans = 0;
        bool fed = x->outcome == SIM_OUT_FINISHED && q->real_reason == SIM_REAL_STOP &&
                   x->generated < q->max_tokens;
        uint64_t full =
            ((uint64_t)q->prompt_tokens + x->generated - (x->generated && !fed ? 1 : 0)) / hb;
        if (q->n_ahash && full > q->n_hash)
            n_ans = full - q->n_hash < q->n_ahash ? (uint32_t)(full - q->n_hash) : q->n_ahash;
        fmt_sched_cost cost;
        if (x->cost_idx) {
            const sched_cost_state *c = &r->costs[x->cost_idx - 1];
            const sched_tier_cost *h = &c->tier[SCHED_POOL_HOST], *d = &c->tier[SCHED_POOL_DISK];
            cost = (fmt_sched_cost){
                .at_us = x->first_sched_us,
                .correction = c->correction,
                .base_us = c->step.base_us,
                .prefill_token_us = c->step.prefill_token_us,
                .decode_seq_us = c->step.decode_seq_us,
                .context_token_us = c->step.context_token_us,
                .prefill_pair_us = c->step.prefill_pair_us,
                .host = {h->out_bytes_per_s, h->in_bytes_per_s, h->latency_us,
                         c->out_measured[SCHED_POOL_HOST], c->in_measured[SCHED_POOL_HOST]},
                .disk = {d->out_bytes_per_s, d->in_bytes_per_s, d->latency_us,
                         c->out_measured[SCHED_POOL_DISK], c->in_measured[SCHED_POOL_DISK]},
            };
        }
        fmt_request lr = {
            .req = order[k],
            .arrival_us = x->seen_us > q->arrival_us ? x->seen_us : q->arrival_us,
            .tenant = run_tenant_name(r, q->tenant),
            .class_name = run_class_name(r, q->klass),
            .prompt_tokens = q->prompt_tokens,
            .max_tokens = q->max_tokens,
            .output_tokens = x->generated,
            .deadline_us = q->deadline_us != SIM_NO_TIME ? q->deadline_us : FMT_NULL,
            .cancel_us = x->cancel_us >= 0 ? x->cancel_us : FMT_NULL,
            .first_token_us = x->first_token_us >= 0 ? x->first_token_us : FMT_NULL,
            .finish_us = x->end_us >= 0 ? x->end_us : r->sim_end_us,
            .finish_reason = fr,
            .reject_reason = rr,
            /* its block hashes, so a replay of the simulated run shares as this one did */
            .hash_ids = q->n_hash ? t->hashes + q->hash_off : NULL,
            .n_hash_ids = q->n_hash,
            .answer_hash_ids = n_ans ? t->hashes + q->hash_off + q->n_hash : NULL,
            .n_answer_hash_ids = n_ans,
            .hash_block_tokens = q->hash_block_tokens,
            .cached_tokens = x->cached_tokens,
            .sched_cost =
                x->cost_idx ? &cost : NULL, /* so a replay of this run decides as it did */
        };
        int len = fmt_request_format(&lr, line, LINE_MAX_BYTES);
        if (len < 0) {
            unsigned id = order[k];
            free(order);
            free(line);
            return sim_err_setc(len, "request log: the line of request %u is longer than %d bytes",
                                id, LINE_MAX_BYTES);
        }
        fputs(line, f);
        fputc('\n', f);
    }
    free(order);
    free(line);
    return ferror(f) ? sim_err_setc(-EIO, "request log: write error") : 0;
}
