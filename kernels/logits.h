/* SPDX-License-Identifier: MIT */
/*
 * kernels/logits.h — one sequence's logits processors, the stages of the sampling pipeline
 * that come before temperature (DESIGN.md §13). eng_sample (engine.h) runs, in this order
 * (vLLM's):
 *
 *   1. logit bias          logit[t] += bias[t] for each listed token
 *   2. repetition penalty  r, for each token in the prompt or the output so far (CTRL, vLLM):
 *                          logit > 0 → logit / r, else logit * r
 *   3. presence/frequency  for each token generated c > 0 times (OpenAI):
 *                          logit -= presence + c * frequency
 *   4. constraint          eng_logits_proc.constrain(ctx, logits, vocab), when set: the slot
 *                          of structured output (a grammar's mask); empty until then
 *   5. temperature → top-k → top-p → min-p → sample (kernels/sample.c)
 *
 * Stages 1–3 touch only the listed and the seen tokens: a step costs O(bias entries +
 * distinct tokens seen), never O(vocab). The token counts live in an open-addressing table
 * grown as tokens arrive (eng_lp_note_*). The logits row is changed in place while the token
 * is sampled and restored exactly before eng_sample returns, so the caller's row stays the
 * model's raw logits (a log-probability computed from it after sampling is the raw one).
 *
 * One eng_logits_proc per sequence, owned by its request; not thread-safe (the engine
 * samples a batch's rows on one thread).
 */
#ifndef RINGLM_KERNELS_LOGITS_H
#define RINGLM_KERNELS_LOGITS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct eng_logit_bias {
    int32_t token;
    float bias;
} eng_logit_bias;

/* A request's processor parameters (ranges are the caller's: shm/wire.c checks them). */
typedef struct eng_logits_params {
    const eng_logit_bias *bias; /* n_bias entries, each token once, ids < vocab */
    int n_bias;
    float repetition_penalty; /* > 0; 1 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    float min_p;              /* [0, 1]; 0 = off (applied by the sampler, after top-p) */
} eng_logits_params;

/*
 * The constraint stage's slot (structured output): called with the row after the penalties,
 * it may lower logits (to -INFINITY to forbid a token). Whatever it changes must be undone by
 * itself after sampling (or the caller's row is no longer raw): `undo` is called after the
 * token is picked, with the picked id. Returns 0, or < 0 to fail the sampling of this row
 * (eng_execute_sample gives that row -1; the batch's other rows are sampled). mask may be
 * called once more per step without undo, on a copy of the row (processed log-probabilities).
 * The daemon sets it for a request with a constraint (daemon/constrain.c).
 */
typedef struct eng_constraint_ops {
    int (*mask)(void *ctx, float *logits, int vocab);
    void (*undo)(void *ctx, float *logits, int vocab, int32_t picked);
} eng_constraint_ops;

typedef struct eng_logits_proc eng_logits_proc;

/* A processor for one sequence (copies p's list). NULL when out of memory. */
eng_logits_proc *eng_lp_create(const eng_logits_params *p);
void eng_lp_free(eng_logits_proc *lp);
/* Whether params are all neutral (no processor is needed: the sampler's old path runs). */
bool eng_lp_params_neutral(const eng_logits_params *p);

/* Room for n distinct tokens, so eng_lp_note_* never allocate below that. 0 or -ENOMEM. */
int eng_lp_reserve(eng_logits_proc *lp, uint32_t n);
/* The prompt's tokens (seen by the repetition penalty only). 0 or -ENOMEM. */
int eng_lp_note_prompt(eng_logits_proc *lp, const int32_t *tokens, uint32_t n);
/* One generated token (all three penalties). 0 or -ENOMEM. */
int eng_lp_note_output(eng_logits_proc *lp, int32_t token);
/* Distinct tokens the table holds (for tests and the cost model). */
uint32_t eng_lp_distinct(const eng_logits_proc *lp);
float eng_lp_min_p(const eng_logits_proc *lp);

/* The constraint stage: ops (NULL clears it) and its context. */
void eng_lp_set_constraint(eng_logits_proc *lp, const eng_constraint_ops *ops, void *ctx);

/*
 * Stages 1–4 on logits[vocab], in place; eng_lp_restore puts back every value changed (call
 * it with the picked token once sampled). 0, or < 0 when the constraint stage failed (the
 * row is restored already).
 */
int eng_lp_apply(eng_logits_proc *lp, float *logits, int vocab);
void eng_lp_restore(eng_logits_proc *lp, float *logits, int vocab, int32_t picked);

#endif
