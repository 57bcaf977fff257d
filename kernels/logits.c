/* SPDX-License-Identifier: MIT */
/*
 * kernels/logits.c — one sequence's logit bias, repetition, presence and frequency
 * penalties over a table of the distinct tokens seen (logits.h).
 */
#include "kernels/logits.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct eng_logits_proc {
    eng_logits_params p;
    eng_logit_bias *bias; /* the copy of p.bias */
    float *bias_orig;     /* [n_bias]: the raw values, for the restore */
    bool penalties;       /* any penalty is on: tokens are counted */
    /* The distinct tokens seen, in arrival order, and an open-addressing index over them. */
    int32_t *tok;       /* [cap_ent] */
    uint32_t *n_out;    /* [cap_ent] times generated */
    uint8_t *in_prompt; /* [cap_ent] */
    float *orig;        /* [cap_ent] the value before stages 2–3, for the restore */
    uint32_t n_ent, cap_ent;
    int32_t *index; /* [cap_idx] entry number or -1; cap_idx a power of two >= 2 * cap_ent */
    uint32_t cap_idx;
    const eng_constraint_ops *cops;
    void *cctx;
};

bool eng_lp_params_neutral(const eng_logits_params *p)
{
    return !p || (p->n_bias == 0 && p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f &&
                  p->frequency_penalty == 0.0f && p->min_p == 0.0f);
}

eng_logits_proc *eng_lp_create(const eng_logits_params *p)
{
    eng_logits_proc *lp = calloc(1, sizeof(*lp));
    if (!lp) return NULL;
    lp->p = *p;
    lp->p.bias = NULL;
    if (p->n_bias > 0) {
        lp->bias = malloc(sizeof(*lp->bias) * (size_t)p->n_bias);
        lp->bias_orig = malloc(sizeof(float) * (size_t)p->n_bias);
        if (!lp->bias || !lp->bias_orig) {
            eng_lp_free(lp);
            return NULL;
        }
        memcpy(lp->bias, p->bias, sizeof(*lp->bias) * (size_t)p->n_bias);
    } else {
        lp->p.n_bias = 0;
    }
    lp->penalties = p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
                    p->frequency_penalty != 0.0f;
    return lp;
}

void eng_lp_free(eng_logits_proc *lp)
{
    if (!lp) return;
    free(lp->bias);
    free(lp->bias_orig);
    free(lp->tok);
    free(lp->n_out);
    free(lp->in_prompt);
    free(lp->orig);
    free(lp->index);
    free(lp);
}

static uint32_t slot_of(const eng_logits_proc *lp, int32_t t)
{
    return ((uint32_t)t * 0x9E3779B1u) & (lp->cap_idx - 1);
}

static int grow_to(eng_logits_proc *lp, uint32_t cap)
{
    int32_t *tok = realloc(lp->tok, sizeof(*tok) * cap);
    if (tok) lp->tok = tok;
    uint32_t *n_out = realloc(lp->n_out, sizeof(*n_out) * cap);
    if (n_out) lp->n_out = n_out;
    uint8_t *inp = realloc(lp->in_prompt, cap);
    if (inp) lp->in_prompt = inp;
    float *orig = realloc(lp->orig, sizeof(*orig) * cap);
    if (orig) lp->orig = orig;
    int32_t *index = malloc(sizeof(*index) * cap * 2);
    if (!tok || !n_out || !inp || !orig || !index) {
        free(index);
        return -ENOMEM;
    }
    free(lp->index);
    lp->index = index;
    lp->cap_idx = cap * 2;
    lp->cap_ent = cap;
    memset(index, 0xff, sizeof(*index) * lp->cap_idx);
    for (uint32_t e = 0; e < lp->n_ent; e++) {
        uint32_t s = slot_of(lp, lp->tok[e]);
        while (index[s] >= 0) s = (s + 1) & (lp->cap_idx - 1);
        index[s] = (int32_t)e;
    }
    return 0;
}

static int grow(eng_logits_proc *lp)
{
    return grow_to(lp, lp->cap_ent ? lp->cap_ent * 2 : 64);
}

int eng_lp_reserve(eng_logits_proc *lp, uint32_t n)
{
    if (!lp->penalties || n <= lp->cap_ent) return 0;
    uint32_t cap = 64;
    while (cap < n) cap *= 2;
    return grow_to(lp, cap);
}

/* The entry of token t, added when new. -1 when out of memory. */
static int32_t entry(eng_logits_proc *lp, int32_t t)
{
    if (lp->cap_idx) {
        uint32_t s = slot_of(lp, t);
        for (; lp->index[s] >= 0; s = (s + 1) & (lp->cap_idx - 1))
            if (lp->tok[lp->index[s]] == t) return lp->index[s];
    }
    if (lp->n_ent == lp->cap_ent && grow(lp) < 0) return -1;
    uint32_t s = slot_of(lp, t);
    while (lp->index[s] >= 0) s = (s + 1) & (lp->cap_idx - 1);
    uint32_t e = lp->n_ent++;
    lp->index[s] = (int32_t)e;
    lp->tok[e] = t;
    lp->n_out[e] = 0;
    lp->in_prompt[e] = 0;
    return (int32_t)e;
}

int eng_lp_note_prompt(eng_logits_proc *lp, const int32_t *tokens, uint32_t n)
{
    /* Only the repetition penalty looks at the prompt. */
    if (!lp || lp->p.repetition_penalty == 1.0f) return 0;
    for (uint32_t i = 0; i < n; i++) {
        int32_t e = entry(lp, tokens[i]);
        if (e < 0) return -ENOMEM;
        lp->in_prompt[e] = 1;
    }
    return 0;
}

int eng_lp_note_output(eng_logits_proc *lp, int32_t token)
{
    if (!lp || !lp->penalties) return 0;
    int32_t e = entry(lp, token);
    if (e < 0) return -ENOMEM;
    lp->n_out[e]++;
    return 0;
}

uint32_t eng_lp_distinct(const eng_logits_proc *lp)
{
    return lp ? lp->n_ent : 0;
}

float eng_lp_min_p(const eng_logits_proc *lp)
{
    return lp ? lp->p.min_p : 0.0f;
}

void eng_lp_set_constraint(eng_logits_proc *lp, const eng_constraint_ops *ops, void *ctx)
{
    lp->cops = ops;
    lp->cctx = ctx;
}

int eng_lp_apply(eng_logits_proc *lp, float *logits, int vocab)
{
    /* 1. logit bias (ids were checked against the vocabulary; the bound is kept anyway) */
    for (int i = 0; i < lp->p.n_bias; i++) {
        int32_t t = lp->bias[i].token;
        if (t < 0 || t >= vocab) continue;
        lp->bias_orig[i] = logits[t];
        logits[t] += lp->bias[i].bias;
    }
    /* 2–3. penalties over the tokens seen */
    const float r = lp->p.repetition_penalty, pres = lp->p.presence_penalty,
                freq = lp->p.frequency_penalty;
    for (uint32_t e = 0; e < lp->n_ent; e++) {
        int32_t t = lp->tok[e];
        if (t < 0 || t >= vocab) continue;
        float l = logits[t];
        lp->orig[e] = l;
        if (r != 1.0f) l = l > 0.0f ? l / r : l * r;
        if (lp->n_out[e]) { /* as vLLM: the frequency term, then the presence term */
            l -= (float)lp->n_out[e] * freq;
            l -= pres;
        }
        logits[t] = l;
    }
    /* 4. the constraint stage */
    if (lp->cops && lp->cops->mask) {
        int rc = lp->cops->mask(lp->cctx, logits, vocab);
        if (rc < 0) {
            eng_lp_restore(lp, logits, vocab, -1);
            return rc;
        }
    }
    return 0;
}

void eng_lp_restore(eng_logits_proc *lp, float *logits, int vocab, int32_t picked)
{
    if (lp->cops && lp->cops->undo) lp->cops->undo(lp->cctx, logits, vocab, picked);
    /* In the reverse order of eng_lp_apply: a token both biased and seen gets its raw value. */
    for (uint32_t e = lp->n_ent; e-- > 0;) {
        int32_t t = lp->tok[e];
        if (t >= 0 && t < vocab) logits[t] = lp->orig[e];
    }
    for (int i = lp->p.n_bias; i-- > 0;) {
        int32_t t = lp->bias[i].token;
        if (t >= 0 && t < vocab) logits[t] = lp->bias_orig[i];
    }
}
