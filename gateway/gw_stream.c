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
static int sse_text(gw_req *r, const char *t, size_t n)
{
    int e = gw_buf_add(&r->out, r->head.p, r->head.len);
    if (r->p.kind == GW_CHAT) {
        e |= gw_buf_adds(&r->out, "{\"index\":0,\"delta\":{\"content\":");
        e |= gw_buf_add_json_str(&r->out, t, n);
        e |= gw_buf_adds(&r->out, "},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    } else {
        e |= gw_buf_adds(&r->out, "{\"index\":0,\"text\":");
        e |= gw_buf_add_json_str(&r->out, t, n);
        e |= gw_buf_adds(&r->out, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    }
    return e;
}

void gw_start_stream(gw_req *r)
{
    if (r->started) return;
    r->started = true;
    if (r->p.kind == GW_CHAT) {
        gw_buf_add(&r->out, r->head.p, r->head.len);
        gw_buf_adds(&r->out, "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                             "\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    }
}

/* OpenAI's usage, with its prompt_tokens_details.cached_tokens (what the openai SDKs type
 * and vLLM fills): the prompt tokens ringlmd's prefix cache served. */
static void usage_json(gw_buf *b, const gw_req *r)
{
    gw_buf_addf(b,
                "{\"prompt_tokens\":%u,\"completion_tokens\":%u,\"total_tokens\":%u,"
                "\"prompt_tokens_details\":{\"cached_tokens\":%u}}",
                r->n_prompt, r->n_gen, r->n_prompt + r->n_gen, r->n_cached);
}

void gw_sse_end(gw_req *r)
{
    if (r->failed) {
        char *j = gw_err_json(&r->err);
        gw_buf_adds(&r->out, "data: ");
        gw_buf_adds(&r->out, j ? j : "{\"error\":{\"message\":\"out of memory\"}}");
        gw_buf_adds(&r->out, "\n\n");
        free(j);
    } else {
        gw_buf_add(&r->out, r->head.p, r->head.len);
        if (r->p.kind == GW_CHAT)
            gw_buf_addf(
                &r->out,
                "{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"%s\"}]}\n\n",
                r->finish);
        else
            gw_buf_addf(
                &r->out,
                "{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"%s\"}]}\n\n",
                r->finish);
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
    if (e > 0) {
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

/* mu held: the whole (non-stream) answer of a finished generation. */
static enum MHD_Result answer_generation(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
    json_t *choice;
    json_t *text = json_stringn(r->text.p ? r->text.p : "", r->text.len);
    if (r->p.kind == GW_CHAT)
        choice = json_pack("{s:i, s:{s:s, s:o}, s:n, s:s}", "index", 0, "message", "role",
                           "assistant", "content", text, "logprobs", "finish_reason", r->finish);
    else
        choice = json_pack("{s:i, s:o, s:n, s:s}", "index", 0, "text", text, "logprobs",
                           "finish_reason", r->finish);
    json_t *o =
        json_pack("{s:s, s:s, s:I, s:s, s:[o], s:{s:i, s:i, s:i, s:{s:I}}}", "id", r->id, "object",
                  r->p.kind == GW_CHAT ? "chat.completion" : "text_completion", "created",
                  (json_int_t)r->created, "model", s->cfg.served_model, "choices", choice, "usage",
                  "prompt_tokens", (int)r->n_prompt, "completion_tokens", (int)r->n_gen,
                  "total_tokens", (int)(r->n_prompt + r->n_gen), "prompt_tokens_details",
                  "cached_tokens", (json_int_t)r->n_cached);
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
    if (r->daemon_done) return answer_generation(s, r, c);
    gw_suspend(r); /* woken early: wait on */
    return MHD_YES;
}