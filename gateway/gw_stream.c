/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_stream.c — a generation's answer (see gw_internal.h): decoded bytes cut at UTF-8
 * boundaries and stop strings into SSE chunks (choices[0].text or delta.content, the final
 * chunk with finish_reason, the usage chunk, [DONE]) or one whole JSON answer; a failure
 * from ringlmd as the OpenAI error (and HTTP status) it maps to.
 */
#include "gateway/gw_internal.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SSE_BLOCK 4096

/* ---- failures -------------------------------------------------------------------------- */
void gw_fail_from_finish(gw_err *e, int fr, int cause)
{
    const char *cn = ringlm_reason_name(cause);
    switch (fr) {
    case RINGLM_FINISH_REJECTED:
        switch (cause) {
        case RINGLM_R_QUEUE_FULL:
            gw_err_set(e, 429, "queue_full", NULL, "ringlmd's queue is full; retry later");
            return;
        case RINGLM_R_TENANT_QUOTA:
            gw_err_set(e, 429, "tenant_quota", NULL,
                       "this tenant's queued-token quota is spent; retry later");
            return;
        case RINGLM_R_INFEASIBLE_DEADLINE:
            gw_err_set(e, 429, "deadline_infeasible", NULL,
                       "the predicted queue wait exceeds the class's limit; retry later");
            return;
        case RINGLM_R_TOO_LONG:
            gw_err_set(e, 400, "too_long", "max_tokens",
                       "the prompt and max_tokens exceed the model's context");
            return;
        case RINGLM_R_NEVER_FITS:
            gw_err_set(e, 400, "never_fits", "max_tokens",
                       "the prompt and max_tokens fit the model's context but need more KV cache "
                       "than ringlmd's pool (or this tenant's share of it) can ever hold");
            return;
        case RINGLM_R_BAD_TOKEN:
            gw_err_set(e, 400, "bad_token", "prompt",
                       "a prompt token id is outside the model's vocabulary");
            return;
        case RINGLM_R_BAD_PARAMS:
            gw_err_set(e, 400, "bad_params", NULL,
                       "ringlmd refused the request's parameters (or the key's tenant is not in "
                       "its policy)");
            return;
        case RINGLM_R_UNKNOWN_CLASS:
            gw_err_set(e, 400, "unknown_class", "ringlm.class",
                       "the request class is not in ringlmd's policy");
            return;
        case RINGLM_R_DRAINING:
            gw_err_set(e, 503, "draining", NULL, "ringlmd is draining: no new requests");
            return;
        default:
            gw_err_set(e, 500, "rejected", NULL, "ringlmd rejected the request: %s", cn);
            return;
        }
    case RINGLM_FINISH_TIMEOUT:
        gw_err_set(e, 504, "timeout", NULL, "the request timed out in ringlmd%s%s",
                   cause ? ": " : "", cause ? cn : "");
        return;
    case RINGLM_FINISH_CANCELLED:
        if (cause == RINGLM_R_DRAINING)
            gw_err_set(e, 503, "draining", NULL, "ringlmd cancelled the request while draining");
        else
            gw_err_set(e, 500, "cancelled", NULL, "ringlmd cancelled the request%s%s",
                       cause ? ": " : "", cause ? cn : "");
        return;
    default:
        gw_err_set(e, 500, "engine_error", NULL, "ringlmd failed the request%s%s",
                   cause ? ": " : "", cause ? cn : "");
        return;
    }
}

/* ---- stream chunks (mu held) ----------------------------------------------------------- */
/* ,"logprobs":... of a chunk: the entries of the tokens that arrived since the last chunk
 * (a token whose text is held back for a stop string is listed with the text before it),
 * or null. Only a request that asked builds any JSON here. */
static int sse_logprobs(gw_req *r)
{
    gw_buf *out = &gw_top(r)->out;
    int e = gw_buf_adds(out, ",\"logprobs\":");
    if (r->p.logprobs == GW_LP_NONE || r->lps_sent >= r->lps.n) return e | gw_buf_adds(out, "null");
    const ringlm_tokenizer *tok = r->s->cfg.tok;
    json_t *j = r->p.kind == GW_CHAT
                    ? gw_lp_chat(tok, r->lps.v + r->lps_sent, r->lps.n - r->lps_sent)
                    : gw_lp_completion(tok, r->lps.v + r->lps_sent, r->lps.n - r->lps_sent,
                                       &r->text_offset);
    r->lps_sent = r->lps.n;
    char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    e |= gw_buf_adds(out, t ? t : "null");
    free(t);
    return e;
}

/* The start of a chunk of choice r: the request's head and {"index":i, */
static int sse_open(gw_req *r)
{
    gw_req *o = gw_top(r);
    int e = gw_buf_add(&o->out, o->head.p, o->head.len);
    return e | gw_buf_addf(&o->out, "{\"index\":%u,", r->choice);
}

static int sse_text(gw_req *r, const char *t, size_t n)
{
    if (r->ep == EP_RESPONSES) return gw_resp_text(r, false, t, n) ? -1 : 0;
    gw_buf *out = &gw_top(r)->out;
    int e = sse_open(r);
    if (r->p.kind == GW_CHAT) {
        e |= gw_buf_adds(out, "\"delta\":{\"content\":");
        e |= gw_buf_add_json_str(out, t, n);
        e |= gw_buf_adds(out, "}");
    } else {
        e |= gw_buf_adds(out, "\"text\":");
        e |= gw_buf_add_json_str(out, t, n);
    }
    e |= sse_logprobs(r);
    e |= gw_buf_adds(out, ",\"finish_reason\":null}]}\n\n");
    return e;
}

/* ---- tool calls ------------------------------------------------------------------------- */
/* A call's id: the answer's id, the choice's index past the first, and the call's index. */
static int call_id(gw_buf *b, const gw_req *r, int index)
{
    const gw_req *o = r->owner ? r->owner : r;
    const char *dash = strchr(o->id, '-');
    if (r->choice)
        return gw_buf_addf(b, "call_%s_%u_%d", dash ? dash + 1 : o->id, r->choice, index);
    return gw_buf_addf(b, "call_%s_%d", dash ? dash + 1 : o->id, index);
}

static int tc_end_chunk(gw_req *r)
{
    int e = sse_logprobs(r);
    return e | gw_buf_adds(&gw_top(r)->out, ",\"finish_reason\":null}]}\n\n");
}

static int tc_content(void *arg, const char *t, size_t n)
{
    return sse_text(arg, t, n) ? -ENOMEM : 0;
}

/* delta.tool_calls[0]: the call's index, id, type and name, its arguments "" so far */
static int tc_start(void *arg, int index, const char *name, size_t len)
{
    gw_req *r = arg;
    gw_buf *out = &gw_top(r)->out;
    r->n_calls = index + 1;
    if (r->ep == EP_RESPONSES) return gw_resp_call(r, index, name, len);
    int e = sse_open(r);
    e |= gw_buf_addf(out, "\"delta\":{\"tool_calls\":[{\"index\":%d,\"id\":\"", index);
    e |= call_id(out, r, index);
    e |= gw_buf_adds(out, "\",\"type\":\"function\",\"function\":{\"name\":");
    e |= gw_buf_add_json_str(out, name, len);
    e |= gw_buf_adds(out, ",\"arguments\":\"\"}}]}");
    return e | tc_end_chunk(r) ? -ENOMEM : 0;
}

/* delta.tool_calls[0]: the next piece of the call's arguments */
static int tc_args(void *arg, int index, const char *t, size_t n)
{
    gw_req *r = arg;
    if (r->ep == EP_RESPONSES) return gw_resp_args(r, index, t, n);
    gw_buf *out = &gw_top(r)->out;
    int e = sse_open(r);
    e |= gw_buf_addf(
        out, "\"delta\":{\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", index);
    e |= gw_buf_add_json_str(out, t, n);
    e |= gw_buf_adds(out, "}}]}");
    return e | tc_end_chunk(r) ? -ENOMEM : 0;
}

/* Streamed content of a chat answer whose tool calls are parsed (p.tool_parser). */
static int tools_feed(gw_req *r, const char *t, size_t n, bool final)
{
    gw_tool_sink k = {tc_content, tc_start, tc_args, r};
    return gw_tools_feed(&r->tools, t, n, final, &k);
}

/* The finish reason: "tool_calls" when the answer called tools and ended by itself (as
 * OpenAI's, "stop" for a function named by tool_choice). */
static const char *finish_of(const gw_req *r, int n_calls)
{
    const char *f = r->finish ? r->finish : "stop";
    return n_calls && !strcmp(f, "stop") && r->p.tool_parser != GW_TOOLS_NAMED ? "tool_calls" : f;
}

void gw_stream_tools_init(const gw_req *r, gw_tool_state *st)
{
    if (r->p.tool_parser == GW_TOOLS_NAMED)
        gw_tools_init_named(st, r->p.tool_name);
    else if (r->p.tool_parser)
        gw_tools_init(st, r->p.tool_parser, r->p.max_tool_calls);
}

/* A piece of a chat answer as delta.reasoning_content or delta.content (--reasoning-parser). */
static int sse_piece(void *arg, bool reasoning, const char *t, size_t n)
{
    gw_req *r = arg;
    if (!reasoning && r->p.tool_parser) return tools_feed(r, t, n, false);
    if (r->ep == EP_RESPONSES) return gw_resp_text(r, reasoning, t, n);
    gw_buf *out = &gw_top(r)->out;
    int e = sse_open(r);
    e |= gw_buf_adds(out,
                     reasoning ? "\"delta\":{\"reasoning_content\":" : "\"delta\":{\"content\":");
    e |= gw_buf_add_json_str(out, t, n);
    e |= gw_buf_adds(out, "}");
    e |= sse_logprobs(r);
    e |= gw_buf_adds(out, ",\"finish_reason\":null}]}\n\n");
    return e;
}

/* The prompt as the answer echoes it: the text the client sent, or its token ids' text. */
static char *echo_text(const gw_req *r)
{
    if (r->p.prompt_text) return strdup(r->p.prompt_text);
    const ringlm_tokenizer *tok = r->s->cfg.tok;
    int n = tok ? ringlm_detokenize(tok, r->ids, r->n_prompt, NULL, 0) : -1;
    char *t = malloc(n > 0 ? (size_t)n + 1 : 1);
    if (!t) return NULL;
    t[0] = 0;
    if (n > 0 && ringlm_detokenize(tok, r->ids, r->n_prompt, t, (size_t)n + 1) < 0) t[0] = 0;
    return t;
}

/* Completions' logprobs with the prompt's entries first (echo), text_offset counted over
 * the echoed text. */
static json_t *completion_logprobs(gw_req *r, const char *echoed, bool all)
{
    const ringlm_tokenizer *tok = r->s->cfg.tok;
    size_t off = 0;
    json_t *j = NULL;
    if (echoed) {
        /* the prompt's: computed once, with the first choice (ringlm.h "n samples") */
        const gw_lps *plps = r->owner ? &r->owner->plps : &r->plps;
        j = gw_lp_completion(tok, plps->v, plps->n, &off);
        off = strlen(echoed);
    }
    if (all) {
        json_t *g = gw_lp_completion(tok, r->lps.v, r->lps.n, &off);
        if (!j) return g;
        const char *keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
        for (int k = 0; k < 4; k++)
            json_array_extend(json_object_get(j, keys[k]), json_object_get(g, keys[k]));
        json_decref(g);
    }
    r->text_offset = off;
    return j;
}

void gw_stream_echo(gw_req *r)
{
    if (r->echo_sent || r->p.kind != GW_COMPLETION) return;
    r->echo_sent = true;
    char *t = echo_text(r);
    if (!t) return;
    gw_buf *out = &gw_top(r)->out;
    sse_open(r);
    gw_buf_adds(out, "\"text\":");
    gw_buf_add_json_str(out, t, strlen(t)); /* validated: the body's JSON, or repaired */
    gw_buf_adds(out, ",\"logprobs\":");
    json_t *j = r->p.logprobs != GW_LP_NONE ? completion_logprobs(r, t, false) : NULL;
    char *d = j ? json_dumps(j, JSON_COMPACT) : NULL;
    gw_buf_adds(out, d ? d : "null");
    gw_buf_adds(out, ",\"finish_reason\":null}]}\n\n");
    r->text_offset = strlen(t);
    free(d);
    json_decref(j);
    free(t);
}

void gw_start_stream(gw_req *r)
{
    gw_top(r)->started = true; /* the response is a stream from now on */
    if (r->role_sent) return;
    r->role_sent = true;
    if (r->ep == EP_RESPONSES) {
        gw_resp_begin(r);
    } else if (r->p.kind == GW_CHAT) {
        sse_open(r);
        gw_buf_adds(&gw_top(r)->out, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                                     "\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    }
}

/* OpenAI's usage, with its prompt_tokens_details.cached_tokens (what the openai SDKs type
 * and vLLM fills): the prompt tokens ringlmd's prefix cache served. */
/* The completion tokens of every choice of o. */
static uint32_t completion_tokens(const gw_req *o)
{
    uint32_t n = o->n_gen;
    for (uint32_t i = 1; o->choices && i < o->n_choices; i++) n += o->choices[i]->n_gen;
    return n;
}

/* The prompt is computed once however many choices (ringlmd shares it): counted once. */
static void usage_json(gw_buf *b, const gw_req *r)
{
    uint32_t gen = completion_tokens(r);
    gw_buf_addf(b,
                "{\"prompt_tokens\":%u,\"completion_tokens\":%u,\"total_tokens\":%u,"
                "\"prompt_tokens_details\":{\"cached_tokens\":%u}}",
                r->n_prompt, gen, r->n_prompt + gen, r->n_cached);
}

void gw_sse_choice_end(gw_req *c)
{
    if (c->end_sent) return;
    c->end_sent = true;
    gw_buf *out = &gw_top(c)->out;
    sse_open(c);
    /* entries of tokens that brought no text of their own come with the last chunk */
    gw_buf_adds(out, c->p.kind == GW_CHAT ? "\"delta\":{}" : "\"text\":\"\"");
    sse_logprobs(c);
    gw_buf_addf(out, ",\"finish_reason\":\"%s\"}]}\n\n", finish_of(c, c->n_calls));
}

void gw_sse_end(gw_req *r)
{
    if (r->ep == EP_RESPONSES) { /* its last event is response.completed: no [DONE] */
        gw_resp_end(r);
        return;
    }
    if (r->failed) {
        char *j = gw_err_json(&r->err);
        gw_buf_adds(&r->out, "data: ");
        gw_buf_adds(&r->out, j ? j : "{\"error\":{\"message\":\"out of memory\"}}");
        gw_buf_adds(&r->out, "\n\n");
        free(j);
    } else {
        for (uint32_t i = 0; i < (r->choices ? r->n_choices : 1); i++)
            gw_sse_choice_end(r->choices ? r->choices[i] : r);
        if (r->p.include_usage) {
            gw_buf_add(&r->out, r->head.p, r->head.len);
            gw_buf_adds(&r->out, "],\"usage\":");
            usage_json(&r->out, r);
            gw_buf_adds(&r->out, "}\n\n");
        }
    }
    gw_buf_adds(&r->out, "data: [DONE]\n\n");
    r->out_done = true;
}

/* New decoded bytes are in r->raw: move whole UTF-8 into pend, cut at a stop string, emit
 * what no stop string can still claim. Returns true when a stop string was hit. */
bool gw_emit_text(gw_req *r, bool final)
{
    long k = gw_utf8_take(r->raw.p ? r->raw.p : "", r->raw.len, final, &r->pend);
    if (k > 0) gw_buf_consume(&r->raw, (size_t)k);
    size_t e = 0;
    bool hit = gw_stop_scan(&r->p.stop, r->pend.p ? r->pend.p : "", r->pend.len, &e);
    if (final && !hit) e = r->pend.len;
    bool reason = r->p.stream && r->p.kind == GW_CHAT && r->s->cfg.reasoning;
    bool tools = r->p.stream && r->p.kind == GW_CHAT && r->p.tool_parser;
    if (reason && (e > 0 || final || hit)) { /* the splitter may hold back a tag's start */
        gw_start_stream(r);
        r->think.parser = r->s->cfg.reasoning;
        gw_reason_feed(&r->think, r->pend.p ? r->pend.p : "", e, final || hit, sse_piece, r);
        if (tools && (final || hit)) tools_feed(r, "", 0, true);
    } else if (tools && (e > 0 || final || hit)) { /* the parser may hold back a call's start */
        gw_start_stream(r);
        tools_feed(r, r->pend.p ? r->pend.p : "", e, final || hit);
    } else if (e > 0) {
        if (r->p.stream) {
            gw_start_stream(r);
            sse_text(r, r->pend.p, e);
        } else {
            gw_buf_add(&r->text, r->pend.p, e);
        }
    }
    gw_buf_consume(&r->pend, hit ? r->pend.len : e);
    return hit;
}


/* The SSE content reader (http thread). */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    gw_req *r = cls;
    gw_server *s = r->s;
    pthread_mutex_lock(&s->mu);
    ssize_t n;
    if (r->out.len) {
        size_t k = r->out.len < max ? r->out.len : max;
        memcpy(buf, r->out.p, k);
        gw_buf_consume(&r->out, k);
        n = (ssize_t)k;
    } else if (r->out_done) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (r->gone || s->stopping) {
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else {
        gw_suspend(r);
        n = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* One choice of a whole answer: its text (after the echoed prompt), log-probabilities and
 * finish reason, as choices[index]. */
static json_t *choice_json(gw_server *s, gw_req *r, int index)
{
    json_t *choice;
    char *echoed = r->p.echo ? echo_text(r) : NULL;
    gw_buf all = {0};
    if (echoed) gw_buf_adds(&all, echoed);
    gw_buf_add(&all, r->text.p ? r->text.p : "", r->text.len);
    json_t *text = json_stringn(all.p ? all.p : "", all.len);
    gw_buf_free(&all);
    json_t *lps = json_null();
    if (r->p.logprobs != GW_LP_NONE) {
        json_decref(lps);
        lps = r->p.kind == GW_CHAT ? gw_lp_chat(s->cfg.tok, r->lps.v, r->lps.n)
                                   : completion_logprobs(r, echoed, true);
        if (!lps) lps = json_null();
    }
    const char *finish = r->finish ? r->finish : "stop";
    if (r->p.kind == GW_CHAT) {
        /* --reasoning-parser: reasoning_content beside content (null where there is none) */
        const char *rs = NULL, *cs = r->text.p ? r->text.p : "";
        size_t rn = 0, cn = r->text.len;
        if (s->cfg.reasoning) gw_reason_split(s->cfg.reasoning, cs, cn, &rs, &rn, &cs, &cn);
        json_decref(text);
        json_t *msg = json_pack("{s:s}", "role", "assistant"), *calls = NULL;
        int n_calls = 0;
        if (r->p.tool_parser) { /* the tool calls out of the content */
            gw_tool_calls tc;
            gw_tool_state st;
            gw_stream_tools_init(r, &st);
            int prc = gw_tools_parse_with(&st, cs ? cs : "", cs ? cn : 0, &tc);
            gw_tools_free(&st);
            if (prc == 0) {
                n_calls = tc.n;
                calls = json_array();
                for (int i = 0; i < tc.n; i++) {
                    gw_buf id = {0};
                    call_id(&id, r, i);
                    json_array_append_new(
                        calls,
                        json_pack("{s:s, s:s, s:{s:s, s:s%}}", "id", id.p ? id.p : "", "type",
                                  "function", "function", "name", tc.v[i].name, "arguments",
                                  tc.v[i].args.p ? tc.v[i].args.p : "", tc.v[i].args.len));
                    gw_buf_free(&id);
                }
                json_object_set_new(
                    msg, "content",
                    tc.content.len || !tc.n
                        ? json_stringn(tc.content.p ? tc.content.p : "", tc.content.len)
                        : json_null());
                gw_tool_calls_free(&tc);
            }
        }
        if (!json_object_get(msg, "content"))
            json_object_set_new(msg, "content", cs ? json_stringn(cs, cn) : json_null());
        if (s->cfg.reasoning)
            json_object_set_new(msg, "reasoning_content", rs ? json_stringn(rs, rn) : json_null());
        if (n_calls)
            json_object_set_new(msg, "tool_calls", calls);
        else
            json_decref(calls);
        choice = json_pack("{s:i, s:o, s:o, s:s}", "index", index, "message", msg, "logprobs", lps,
                           "finish_reason", finish_of(r, n_calls));
    } else
        choice = json_pack("{s:i, s:o, s:o, s:s}", "index", index, "text", text, "logprobs", lps,
                           "finish_reason", finish);
    free(echoed);
    return choice;
}

/* best_of: the choices in order of their cumulative log-probability, highest first (vLLM). */
static int by_cum_lp(const void *a, const void *b)
{
    const gw_req *x = *(gw_req *const *)a, *y = *(gw_req *const *)b;
    if (x->cum_lp != y->cum_lp) return x->cum_lp > y->cum_lp ? -1 : 1;
    return (x->choice > y->choice) - (x->choice < y->choice);
}

/* mu held: a whole Responses answer: the text through the same items as a stream's. */
static enum MHD_Result answer_response(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
    const char *rs = NULL, *cs = r->text.p ? r->text.p : "";
    size_t rn = 0, cn = r->text.len;
    if (s->cfg.reasoning) gw_reason_split(s->cfg.reasoning, cs, cn, &rs, &rn, &cs, &cn);
    gw_resp_begin(r);
    if (rs) gw_resp_text(r, true, rs, rn);
    if (cs && r->p.tool_parser)
        tools_feed(r, cs, cn, true);
    else if (cs)
        gw_resp_text(r, false, cs, cn);
    return gw_answer_json(r, c, 200, gw_resp_whole(r));
}

/* mu held: the whole (non-stream) answer of a finished generation. */
/* mu held: the whole (non-stream) answer of a finished generation. */
static enum MHD_Result answer_generation(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
    if (r->ep == EP_RESPONSES) return answer_response(s, r, c);
    json_t *choices = json_array();
    if (!r->choices) {
        json_array_append_new(choices, choice_json(s, r, 0));
    } else {
        /* n choices; with best_of the n of the highest cumulative log-probability */
        gw_req **order = malloc(sizeof *order * r->n_choices);
        if (order) {
            memcpy(order, r->choices, sizeof *order * r->n_choices);
            uint32_t keep = r->p.n < r->n_choices ? r->p.n : r->n_choices;
            if (keep < r->n_choices) qsort(order, r->n_choices, sizeof *order, by_cum_lp);
            for (uint32_t i = 0; i < keep; i++)
                json_array_append_new(choices, choice_json(s, order[i], (int)i));
            free(order);
        }
    }
    json_t *plp = r->p.prompt_logprobs != GW_LP_NONE
                      ? gw_lp_prompt_vllm(s->cfg.tok, r->plps.v, r->plps.n)
                      : NULL;
    /* vLLM's places: each choice's for completions (the same for all: the prompt is computed
     * once), the response's for chat */
    for (size_t i = 0; plp && r->p.kind == GW_COMPLETION && i < json_array_size(choices); i++)
        json_object_set(json_array_get(choices, i), "prompt_logprobs", plp);
    uint32_t gen = completion_tokens(r);
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:{s:i, s:i, s:i, s:{s:I}}}", "id", r->id,
                          "object", r->p.kind == GW_CHAT ? "chat.completion" : "text_completion",
                          "created", (json_int_t)r->created, "model", gw_model(s), "choices",
                          choices, "usage", "prompt_tokens", (int)r->n_prompt, "completion_tokens",
                          (int)gen, "total_tokens", (int)(r->n_prompt + gen),
                          "prompt_tokens_details", "cached_tokens", (json_int_t)r->n_cached);
    if (plp && r->p.kind == GW_CHAT) json_object_set(o, "prompt_logprobs", plp);
    json_decref(plp);
    return gw_answer_json(r, c, 200, o);
}

/* mu held: the first event of r arrived (or it failed): answer or start the stream. */
enum MHD_Result gw_resumed(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
    if (r->gone || s->stopping) return MHD_NO;
    if (r->p.stream && r->started) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, sse_read, r, NULL);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        r->state = RQ_STREAM;
        r->status = 200;
        s->n_streams++;
        return gw_queue(r, c, 200, resp);
    }
    if (r->failed) return gw_answer_err(r, c, &r->err);
    if (gw_all_done(r)) return answer_generation(s, r, c);
    gw_suspend(r); /* woken early: wait on */
    return MHD_YES;
}