/* ringlm — an upper bound on goodput at SLO that no policy can pass on a trace under a service
 * model (sim/tune.h, sim_tune_goodput_bound).  SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim/err.h"
#include "sim/tune.h"

/*
 * A request meets its TTFT target only if its whole prompt is prefilled within the target of
 * its arrival: the step that computes its last prompt token emits the first one.  Steps run one
 * after another, and under the service model a prompt of L tokens costs at least
 *     per_prefill_token × L + per_prefill_pair × L(L−1)/2
 * of step time however it is chunked or batched (the chunks' attention pairs add up to the
 * whole prompt's; the step base, decode rows, context reads and the serving loop only add).
 * So for the requests arriving in [a_i, a_j], the prompts of those that meet their target fit
 * in [a_i, max(a_k + ttft_k)]: at most the k cheapest of them, for the largest k whose cheapest
 * k prompts fit.  Windows with disjoint request sets add their shortfalls; the bound is the
 * largest sum over disjoint windows (a dynamic programme over windows of at most window_s),
 * and goodput ≤ (requests − that sum) / the trace's arrival span.
 *
 * Each window's "cheapest k that fit" is a Fenwick-tree descent over the requests' prompt
 * costs in rank order (count and cost per rank), so a window costs O(log n).
 */

typedef struct fen {
    size_t n;
    double *sum;
    uint32_t *cnt;
} fen;

static void fen_add(fen *f, size_t i, double v)
{
    for (i++; i <= f->n; i += i & (~i + 1)) {
        f->sum[i] += v;
        f->cnt[i]++;
    }
}

/* Empty every node item i touched (exactly: no rounding left behind by subtracting). */
static void fen_clear(fen *f, size_t i)
{
    for (i++; i <= f->n; i += i & (~i + 1)) {
        f->sum[i] = 0;
        f->cnt[i] = 0;
    }
}

/* The most items, cheapest first, whose costs add up to at most cap. */
static size_t fen_fit(const fen *f, double cap)
{
    size_t pos = 0, k = 0, step = 1;
    double s = 0;
    while (step * 2 <= f->n) step *= 2;
    for (; step; step /= 2) {
        size_t nx = pos + step;
        if (nx <= f->n && s + f->sum[nx] <= cap) {
            pos = nx;
            s += f->sum[nx];
            k += f->cnt[nx];
        }
    }
    /* every rank is one request: the first pos ranks fit, rank pos does not */
    return k;
}

typedef struct item {
    double cost;
    size_t idx;
} item;

static int item_cmp(const void *a, const void *b)
{
    const item *x = a, *y = b;
    if (x->cost != y->cost) return x->cost < y->cost ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

int sim_tune_goodput_bound(const sim_trace *t, const sim_service *svc, const sched_policy *p,
                           double window_s, sim_tune_bound *out)
{
    memset(out, 0, sizeof *out);
    if (!t->n) return 0;
    double tok = svc->per_prefill_token_us, pair = svc->per_prefill_pair_us;
    if (tok < 0 || pair < 0 || (tok == 0 && pair == 0))
        return sim_err_set(
            "goodput bound: the service model's prefill terms (%g µs a token, %g µs a pair) "
            "are not a lower bound on prefill time",
            tok, pair);
    const sched_policy_cfg *pc = sched_policy_get(p);
    uint64_t ttft_of[SIM_MAX_NAMES];
    for (unsigned c = 0; c < t->n_classes && c < SIM_MAX_NAMES; c++) {
        int k = sched_policy_class_index(p, t->classes[c]);
        if (k < 0) k = pc->default_class;
        const sched_class_cfg *cc = k >= 0 ? sched_policy_class(p, k) : NULL;
        ttft_of[c] = cc ? cc->ttft_target_us : 0;
    }
    size_t n = t->n;
    item *it = calloc(n, sizeof *it);
    size_t *rank = calloc(n, sizeof *rank);
    double *cost = calloc(n, sizeof *cost), *deadline = calloc(n, sizeof *deadline);
    double *arrival = calloc(n, sizeof *arrival);
    double *best = calloc(n + 1, sizeof *best), *cand = calloc(n + 1, sizeof *cand);
    fen f = {.n = n, .sum = calloc(n + 1, sizeof(double)), .cnt = calloc(n + 1, sizeof(uint32_t))};
    int rc = 0;
    if (!it || !rank || !cost || !deadline || !arrival || !best || !cand || !f.sum || !f.cnt) {
        rc = -ENOMEM;
        goto out;
    }
    /* only requests of a class with a TTFT target can miss it */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const sim_req *q = &t->reqs[i];
        uint64_t d = q->klass < SIM_MAX_NAMES ? ttft_of[q->klass] : 0;
        if (!d) continue;
        double L = q->prompt_tokens;
        cost[m] = (tok * L + pair * L * (L - 1) / 2) / 1e6;
        arrival[m] = (double)q->arrival_us / 1e6;
        deadline[m] = arrival[m] + (double)d / 1e6;
        it[m] = (item){.cost = cost[m], .idx = m};
        m++;
    }
    qsort(it, m, sizeof *it, item_cmp);
    for (size_t r = 0; r < m; r++) rank[it[r].idx] = r;
    f.n = m;
    /* the trace is in arrival order, and so are the constrained requests */
    for (size_t k = 0; k <= m; k++) cand[k] = 0;
    for (size_t i = 0; i < m; i++) {
        double sum = 0, dl = 0;
        size_t j;
        for (j = i; j < m && arrival[j] - arrival[i] <= window_s; j++) {
            fen_add(&f, rank[j], cost[j]);
            sum += cost[j];
            if (deadline[j] > dl) dl = deadline[j];
            double cap = dl - arrival[i];
            double miss = 0;
            if (sum > cap) miss = (double)(j - i + 1) - (double)fen_fit(&f, cap);
            if (best[i] + miss > cand[j + 1]) cand[j + 1] = best[i] + miss;
        }
        for (size_t k = i; k < j; k++) fen_clear(&f, rank[k]);
        /* every window ending at i starts at or before i: best[i + 1] is final */
        best[i + 1] = fmax(best[i], cand[i + 1]);
    }
    out->requests = n;
    out->min_misses = (size_t)best[m];
    out->span_s = n > 1 ? (double)(t->reqs[n - 1].arrival_us - t->reqs[0].arrival_us) / 1e6 : 0;
    out->goodput_rps = out->span_s > 0 ? (double)(n - out->min_misses) / out->span_s : 0;
    out->window_s = window_s;
out:
    free(it);
    free(rank);
    free(cost);
    free(deadline);
    free(arrival);
    free(best);
    free(cand);
    free(f.sum);
    free(f.cnt);
    return rc ? sim_err_setc(rc, "goodput bound: out of memory") : 0;
}
