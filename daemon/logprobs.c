/* SPDX-License-Identifier: MIT */
/*
 * daemon/logprobs.c — the log-probabilities a request waits to push: computed with the
 * batch (eng_execute_sample_lp), kept in order until the session's event ring takes the
 * token they belong to. Bounded like the tokens: a request whose client does not read is
 * cancelled once backpressure_buffer_tokens wait (requests.c), so the ring holds at most
 * that many generated items, plus the prompt's.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon/service_internal.h"

int lpq_push(svc_lpq *q, bool prompt, int32_t token, uint32_t index, const eng_logprobs *lp,
             bool processed)
{
    if (q->n == q->cap) {
        uint32_t cap = q->cap ? q->cap * 2 : 16;
        svc_lp_item *it = malloc(sizeof *it * cap);
        if (!it) return -ENOMEM;
        for (uint32_t k = 0; k < q->n; k++) it[k] = q->items[(q->head + k) % q->cap];
        free(q->items);
        q->items = it;
        q->head = 0;
        q->cap = cap;
    }
    svc_lp_item *x = &q->items[(q->head + q->n) % q->cap];
    memset(x, 0, sizeof *x);
    x->prompt = prompt;
    x->token = token;
    x->index = index;
    x->lp.logprob = lp->logprob;
    x->lp.rank = lp->rank;
    x->lp.flags = processed ? RINGLM_WIRE_LP_F_PROCESSED : 0;
    x->lp.n_top = lp->n_top > 0 ? (uint32_t)lp->n_top : 0;
    for (uint32_t j = 0; j < x->lp.n_top; j++) {
        x->lp.top_token[j] = lp->top_id[j];
        x->lp.top_logprob[j] = lp->top_logprob[j];
    }
    q->n++;
    return 0;
}

const svc_lp_item *lpq_peek(const svc_lpq *q)
{
    return q->n ? &q->items[q->head] : NULL;
}

void lpq_pop(svc_lpq *q)
{
    if (!q->n) return;
    q->head = (q->head + 1) % q->cap;
    q->n--;
}

void lpq_free(svc_lpq *q)
{
    free(q->items);
    memset(q, 0, sizeof *q);
}
