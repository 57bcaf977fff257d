/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_reason.h — a reasoning model's answer split into reasoning_content and content
 * (vLLM's --reasoning-parser and fields): the text between <think> and </think> is the
 * reasoning, the rest the answer.
 *
 *   deepseek_r1  the reasoning runs from the start (the template opened <think> in the
 *                prompt; a <think> the model writes is dropped) to </think>; without
 *                </think> the whole text is reasoning.
 *   qwen3        only a text that opens <think> and closes it has reasoning; any other text
 *                is all content.
 *
 * Both whole (a finished answer) and streamed: gw_reason_feed takes the text as it comes and
 * hands each piece on as reasoning or content, holding back only what may be the start of a
 * tag, so the pieces join to what gw_reason_split gives the whole text.
 */
#ifndef RINGLM_GATEWAY_GW_REASON_H
#define RINGLM_GATEWAY_GW_REASON_H

#include <stdbool.h>
#include <stddef.h>

enum gw_reason_parser { GW_REASON_NONE = 0, GW_REASON_DEEPSEEK_R1 = 1, GW_REASON_QWEN3 = 2 };

/* The parser by vLLM's name ("deepseek_r1", "qwen3"); -1 when unknown. */
int gw_reason_by_name(const char *name);

/* Splits text[0..n): the reasoning (*rn bytes at *r; *r NULL when there is none) and the
 * content (*cn bytes at *c; *c NULL when there is none), both inside text. */
void gw_reason_split(int parser, const char *text, size_t n, const char **r, size_t *rn,
                     const char **c, size_t *cn);

/* Streaming state of one answer (zero it, then set parser). */
typedef struct gw_reason_state {
    int parser;
    int phase;     /* 0: nothing decided yet, 1: in the reasoning, 2: in the content */
    char hold[16]; /* text that may begin a tag */
    size_t n_hold;
} gw_reason_state;

/* Takes the next n bytes of the answer (final: the answer ends after them) and calls emit
 * for each piece (reasoning true: it belongs to reasoning_content). Returns the first
 * non-zero emit result, else 0. */
int gw_reason_feed(gw_reason_state *st, const char *t, size_t n, bool final,
                   int (*emit)(void *arg, bool reasoning, const char *t, size_t n), void *arg);

#endif
