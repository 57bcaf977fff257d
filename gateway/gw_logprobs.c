/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_logprobs.c — log-probabilities in the shapes clients read: OpenAI's chat
 * (choices[].logprobs.content[]: token, logprob, bytes, top_logprobs[]), OpenAI's
 * completions (choices[].logprobs: tokens, token_logprobs, top_logprobs as {text: logprob},
 * text_offset) and vLLM's prompt_logprobs ([null, {"id": {logprob, rank, decoded_token}}]).
 *
 * A token's text depends on the token before it (SentencePiece drops the space after BOS),
 * so each entry keeps its predecessor; texts are the bytes ringlm_token_text gives, as JSON
 * strings with each invalid UTF-8 byte as U+FFFD (a character split over byte tokens shows
 * in `bytes`, as OpenAI's does). Built only for requests that asked: none of this runs for
 * the others.
 */
#include "gateway/gw_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int gw_lps_add(gw_lps *l, int32_t prev, int32_t token, const ringlm_logprobs *lp)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        gw_lp *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    gw_lp *x = &l->v[l->n++];
    memset(x, 0, sizeof *x);
    x->prev = prev;
    x->has = lp != NULL;
    if (lp) x->lp = *lp;
    x->lp.token = token;
    return 0;
}

void gw_lps_free(gw_lps *l)
{
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* The raw bytes of id after prev ("" when there is no tokenizer or no text). */
static const char *piece_of(const ringlm_tokenizer *tok, int32_t prev, int32_t id)
{
    const char *p = NULL;
    if (!tok || ringlm_token_text(tok, prev, id, &p) < 0 || !p) return "";
    return p;
}

/* A JSON string of raw bytes, invalid UTF-8 as U+FFFD. */
static json_t *text_json(const char *raw)
{
    gw_buf b = {0};
    if (gw_utf8_take(raw, strlen(raw), true, &b) < 0) return json_string("");
    json_t *s = json_stringn(b.p ? b.p : "", b.len);
    gw_buf_free(&b);
    return s ? s : json_string("");
}

static json_t *bytes_json(const char *raw)
{
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)raw; *p; p++)
        json_array_append_new(a, json_integer(*p));
    return a;
}

/* JSON has no -inf: OpenAI's -9999.0 stands for it (a token the distribution excludes). */
static json_t *lp_json(float x)
{
    return json_real(isfinite(x) ? (double)x : -9999.0);
}

json_t *gw_lp_chat(const ringlm_tokenizer *tok, const gw_lp *v, size_t n)
{
    json_t *content = json_array();
    for (size_t i = 0; i < n; i++) {
        const gw_lp *e = &v[i];
        const char *raw = piece_of(tok, e->prev, e->lp.token);
        json_t *top = json_array();
        for (uint32_t j = 0; j < e->lp.n_top; j++) {
            const char *t = piece_of(tok, e->prev, e->lp.top_token[j]);
            json_array_append_new(top,
                                  json_pack("{s:o, s:o, s:o}", "token", text_json(t), "logprob",
                                            lp_json(e->lp.top_logprob[j]), "bytes", bytes_json(t)));
        }
        json_array_append_new(content, json_pack("{s:o, s:o, s:o, s:o}", "token", text_json(raw),
                                                 "logprob", lp_json(e->lp.logprob), "bytes",
                                                 bytes_json(raw), "top_logprobs", top));
    }
    return json_pack("{s:o, s:n}", "content", content, "refusal");
}

json_t *gw_lp_completion(const ringlm_tokenizer *tok, const gw_lp *v, size_t n, size_t *offset)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (size_t i = 0; i < n; i++) {
        const gw_lp *e = &v[i];
        const char *raw = piece_of(tok, e->prev, e->lp.token);
        json_t *t = text_json(raw);
        json_array_append_new(offs, json_integer((json_int_t)*offset));
        *offset += strlen(json_string_value(t));
        json_array_append_new(tokens, t);
        if (!e->has) { /* the prompt's first token: nothing predicts it */
            json_array_append_new(lps, json_null());
            json_array_append_new(tops, json_null());
            continue;
        }
        json_array_append_new(lps, lp_json(e->lp.logprob));
        json_t *top = json_object();
        for (uint32_t j = 0; j < e->lp.n_top; j++) {
            json_t *k = text_json(piece_of(tok, e->prev, e->lp.top_token[j]));
            /* equal texts share a key, as in OpenAI's answers; the first (likeliest) stays */
            if (!json_object_get(top, json_string_value(k)))
                json_object_set_new(top, json_string_value(k), lp_json(e->lp.top_logprob[j]));
            json_decref(k);
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

json_t *gw_lp_prompt_vllm(const ringlm_tokenizer *tok, const gw_lp *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        const gw_lp *e = &v[i];
        if (!e->has) {
            json_array_append_new(a, json_null());
            continue;
        }
        json_t *d = json_object();
        char key[16];
        for (uint32_t j = 0; j < e->lp.n_top; j++) {
            snprintf(key, sizeof key, "%d", e->lp.top_token[j]);
            json_object_set_new(d, key,
                                json_pack("{s:o, s:i, s:o}", "logprob",
                                          lp_json(e->lp.top_logprob[j]), "rank", (int)(j + 1),
                                          "decoded_token",
                                          text_json(piece_of(tok, e->prev, e->lp.top_token[j]))));
        }
        snprintf(key, sizeof key, "%d", e->lp.token);
        if (!json_object_get(d, key))
            json_object_set_new(d, key,
                                json_pack("{s:o, s:I, s:o}", "logprob", lp_json(e->lp.logprob),
                                          "rank", (json_int_t)e->lp.rank, "decoded_token",
                                          text_json(piece_of(tok, e->prev, e->lp.token))));
        json_array_append_new(a, d);
    }
    return a;
}
