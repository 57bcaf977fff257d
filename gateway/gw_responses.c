/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_responses.c — POST /v1/responses (see gw_responses.h): the body to a chat
 * request, and the answer's text to output items, whole or as response.* events. Events
 * and items follow OpenAI's shapes as the openai SDKs type them (and vLLM serves them):
 *
 *   response.created, response.in_progress          the response, status in_progress
 *   per item: response.output_item.added
 *     message:  response.content_part.added, response.output_text.delta ...,
 *               response.output_text.done, response.content_part.done
 *     function_call: response.function_call_arguments.delta ..., ...arguments.done
 *     reasoning (--reasoning-parser): response.reasoning_text.delta ..., ...text.done
 *   response.output_item.done
 *   response.completed (status completed, or incomplete at max_output_tokens), with output
 *   and usage; a failure after the start: error, then response.failed
 *
 * Each event carries sequence_number, from 0. The whole answer is the same machinery run
 * without the events, so the two agree.
 */
#include "gateway/gw_responses.h"

#include "gateway/gw_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the fields ------------------------------------------------------------------------ */
#define R    GW_EP_RESPONSES
#define IMPL GW_FIELD_IMPLEMENTED
#define IGN  GW_FIELD_IGNORED
#define REF  GW_FIELD_REFUSED
static const gw_field fields[] = {
    {"model", R, IMPL, NULL, NULL},
    {"input", R, IMPL, NULL, NULL},
    {"instructions", R, IMPL, NULL, NULL},
    {"max_output_tokens", R, IMPL, NULL, NULL},
    {"temperature", R, IMPL, NULL, NULL},
    {"top_p", R, IMPL, NULL, NULL},
    {"stream", R, IMPL, NULL, NULL},
    {"tools", R, IMPL, NULL, NULL},
    {"tool_choice", R, IMPL, NULL, NULL},
    {"parallel_tool_calls", R, IMPL, NULL, NULL},
    {"max_tool_calls", R, IMPL, NULL, NULL},
    {"text", R, IMPL, NULL, NULL},
    {"metadata", R, IMPL, NULL, NULL},
    {"ringlm", R, IMPL, NULL, NULL},
    {"user", R, IGN, NULL, NULL},
    {"safety_identifier", R, IGN, NULL, NULL},
    {"prompt_cache_key", R, IGN, NULL, NULL},
    {"stream_options", R, IGN, NULL, NULL},
    {"store", R, REF, "false", "nothing is stored"},
    {"previous_response_id", R, REF, NULL,
     "nothing is stored: send the whole conversation in 'input'"},
    {"conversation", R, REF, NULL, "nothing is stored: send the whole conversation in 'input'"},
    {"background", R, REF, "false", "a response is answered on its own connection"},
    {"include", R, REF, "[]", "no extra output data"},
    {"reasoning", R, REF, NULL, "no reasoning controls"},
    {"truncation", R, REF, "\"disabled\"", "inputs are never truncated"},
    {"service_tier", R, REF, NULL, "the API key's class decides (or ringlm.class)"},
    {"top_logprobs", R, REF, "0", "not implemented for responses (chat completions have it)"},
    {"prompt", R, REF, NULL, "no stored prompt templates"},
};
#undef R
#undef IMPL
#undef IGN
#undef REF

const gw_field *gw_responses_fields(size_t *n)
{
    *n = sizeof fields / sizeof fields[0];
    return fields;
}

static int check_fields(json_t *o, gw_err *e)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        const gw_field *f = NULL;
        for (size_t i = 0; i < sizeof fields / sizeof fields[0] && !f; i++)
            if (!strcmp(fields[i].name, k)) f = &fields[i];
        if (!f) {
            gw_err_set(e, 400, "unsupported", k,
                       "'%s' is not a field ringlm's responses endpoint knows; docs/gateway.md "
                       "lists every field it implements, ignores or refuses",
                       k);
            return -1;
        }
        if (f->status != GW_FIELD_REFUSED || json_is_null(v)) continue;
        if (f->neutral) {
            json_t *n = json_loads(f->neutral, JSON_DECODE_ANY, NULL);
            bool same = n && json_equal(n, v);
            json_decref(n);
            if (same) continue;
        }
        gw_err_set(e, 400, "unsupported", k, "'%s' is not supported by ringlm: %s", k, f->why);
        return -1;
    }
    return 0;
}

/* ---- the body to a chat request -------------------------------------------------------- */
static json_t *field(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) ? v : NULL;
}

static int bad_item(gw_err *e, size_t i, const char *fmt, const char *what)
{
    char m[300];
    snprintf(m, sizeof m, fmt, what);
    gw_err_set(e, 400, "invalid_value", "input", "'input' item %zu: %s", i, m);
    return -1;
}

/* A content: a string, or a list of text parts (input_text, output_text) joined. */
static json_t *content_text(json_t *c, size_t i, gw_err *e)
{
    if (json_is_string(c)) return json_incref(c);
    if (!json_is_array(c)) {
        bad_item(e, i, "%s", "'content' must be a string or a list of text parts");
        return NULL;
    }
    gw_buf b = {0};
    gw_buf_add(&b, "", 0);
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k);
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text")) ||
            !json_is_string(text)) {
            char m[160];
            snprintf(m, sizeof m,
                     "part %zu: type '%.40s' is not supported (input_text, output_text)", k,
                     type ? type : "(none)");
            bad_item(e, i, "%s", m);
            gw_buf_free(&b);
            return NULL;
        }
        gw_buf_adds(&b, json_string_value(text));
    }
    json_t *s = json_stringn(b.p ? b.p : "", b.len);
    gw_buf_free(&b);
    return s;
}

/* Input items to chat messages: message, function_call (the assistant's calls: joined to the
 * assistant message before them), function_call_output (a tool message); reasoning items
 * are dropped (templates drop a past turn's reasoning). */
static int input_messages(json_t *input, json_t *msgs, gw_err *e)
{
    if (json_is_string(input)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", input));
        return 0;
    }
    if (!json_is_array(input) || json_array_size(input) == 0) {
        gw_err_set(e, 400, "invalid_value", "input",
                   "'input' must be a string or a non-empty list of input items");
        return -1;
    }
    for (size_t i = 0; i < json_array_size(input); i++) {
        json_t *it = json_array_get(input, i);
        if (!json_is_object(it)) return bad_item(e, i, "%s", "must be an object");
        const char *type = json_string_value(json_object_get(it, "type"));
        if (!type && json_is_string(json_object_get(it, "role"))) type = "message";
        if (!type) return bad_item(e, i, "%s", "has no 'type'");
        json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
        if (!strcmp(type, "message")) {
            const char *role = json_string_value(json_object_get(it, "role"));
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") &&
                          strcmp(role, "system") && strcmp(role, "developer")))
                return bad_item(e, i, "%s", "'role' must be user, assistant, system or developer");
            json_t *c = content_text(json_object_get(it, "content"), i, e);
            if (!c) return -1;
            json_array_append_new(msgs, json_pack("{s:s, s:o}", "role",
                                                  strcmp(role, "developer") ? role : "system",
                                                  "content", c));
        } else if (!strcmp(type, "function_call")) {
            json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name"),
                   *args = json_object_get(it, "arguments");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
                return bad_item(
                    e, i, "%s",
                    "a function_call needs 'call_id', 'name' and 'arguments' (strings)");
            json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function",
                                     "function", "name", name, "arguments", args);
            const char *lr = json_string_value(json_object_get(last, "role"));
            if (!lr || strcmp(lr, "assistant")) {
                last = json_pack("{s:s, s:n}", "role", "assistant", "content");
                json_array_append_new(msgs, last);
            }
            json_t *calls = json_object_get(last, "tool_calls");
            if (!calls) json_object_set_new(last, "tool_calls", calls = json_array());
            json_array_append_new(calls, call);
        } else if (!strcmp(type, "function_call_output")) {
            json_t *id = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
            if (!json_is_string(id)) return bad_item(e, i, "%s", "'call_id' must be a string");
            json_t *c = out ? content_text(out, i, e) : NULL;
            if (!c) return out ? -1 : bad_item(e, i, "%s", "'output' is required");
            json_array_append_new(msgs, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id",
                                                  id, "content", c));
        } else if (strcmp(type, "reasoning")) {
            char m[200];
            snprintf(m, sizeof m,
                     "type '%.40s' is not supported (message, function_call, "
                     "function_call_output, reasoning)",
                     type);
            return bad_item(e, i, "%s", m);
        }
    }
    return 0;
}

/* Function tools ({"type": "function", "name", "description", "parameters", "strict"}) as
 * chat's ({"type": "function", "function": {...}}). */
static json_t *chat_tools(json_t *tools, gw_err *e)
{
    if (!json_is_array(tools)) {
        gw_err_set(e, 400, "invalid_value", "tools", "'tools' must be a list of function tools");
        return NULL;
    }
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *t = json_array_get(tools, i);
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(t) || !type || strcmp(type, "function")) {
            gw_err_set(e, 400, "unsupported", "tools",
                       "'tools' item %zu: type '%s' is not supported (function tools only)", i,
                       type ? type : "(none)");
            json_decref(out);
            return NULL;
        }
        json_t *name = json_object_get(t, "name");
        if (!json_is_string(name) || !json_string_length(name)) {
            gw_err_set(e, 400, "invalid_value", "tools",
                       "'tools' item %zu: 'name' is required (a non-empty string)", i);
            json_decref(out);
            return NULL;
        }
        json_t *fn = json_deep_copy(t);
        json_object_del(fn, "type");
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    return out;
}

static json_t *chat_tool_choice(json_t *tc, gw_err *e)
{
    if (json_is_string(tc)) return json_incref(tc);
    const char *type = json_string_value(json_object_get(tc, "type"));
    json_t *name = json_object_get(tc, "name");
    if (json_is_object(tc) && type && !strcmp(type, "function") && json_is_string(name))
        return json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    gw_err_set(e, 400, "invalid_value", "tool_choice",
               "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
               "\"function\", \"name\": NAME}");
    return NULL;
}

void gw_responses_err(gw_err *e)
{
    static const struct {
        const char *chat, *resp;
    } names[] = {{"max_tokens", "max_output_tokens"},
                 {"messages", "input"},
                 {"response_format", "text.format"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(e->param, names[i].chat)) continue;
        snprintf(e->param, sizeof e->param, "%s", names[i].resp);
        char q[64], *at, m[sizeof e->message];
        snprintf(q, sizeof q, "'%s'", names[i].chat);
        if ((at = strstr(e->message, q))) {
            snprintf(m, sizeof m, "%.*s'%s'%s", (int)(at - e->message), e->message, names[i].resp,
                     at + strlen(q));
            snprintf(e->message, sizeof e->message, "%s", m);
        }
    }
}

/* The chat body of a Responses body o, and the response's echoed fields. */
static int to_chat(json_t *o, json_t *chat, json_t *resp, int *max_calls, gw_err *e)
{
    json_t *msgs = json_array(), *v;
    json_object_set_new(chat, "messages", msgs);
    json_object_set_new(resp, "instructions", json_null());
    if ((v = field(o, "instructions"))) {
        if (!json_is_string(v)) {
            gw_err_set(e, 400, "invalid_value", "instructions", "'instructions' must be a string");
            return -1;
        }
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", v));
        json_object_set(resp, "instructions", v);
    }
    if (!(v = field(o, "input"))) {
        gw_err_set(e, 400, "missing_field", "input", "'input' is required");
        return -1;
    }
    if (input_messages(v, msgs, e)) return -1;
    static const char *const same[] = {
        "model", "temperature", "top_p", "stream", "parallel_tool_calls", "user", "ringlm"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if ((v = field(o, same[i]))) json_object_set(chat, same[i], v);
    if ((v = field(o, "max_output_tokens"))) json_object_set(chat, "max_tokens", v);
    json_t *tools = field(o, "tools"), *tc = field(o, "tool_choice");
    if (tools) {
        json_t *t = chat_tools(tools, e);
        if (!t) return -1;
        json_object_set_new(chat, "tools", t);
    }
    if (tc) {
        json_t *t = chat_tool_choice(tc, e);
        if (!t) return -1;
        json_object_set_new(chat, "tool_choice", t);
    }
    if ((v = field(o, "text"))) {
        json_t *fmt = json_object_get(v, "format");
        const char *type = json_string_value(json_object_get(fmt, "type"));
        if (!json_is_object(v) || (fmt && !type) ||
            (json_object_size(v) > (fmt ? 1u : 0u) && !json_object_get(v, "verbosity"))) {
            gw_err_set(e, 400, "invalid_value", "text",
                       "'text' must be {\"format\": {\"type\": \"text\"}}");
            return -1;
        }
        if (type && !strcmp(type, "json_object")) {
            json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
        } else if (type && !strcmp(type, "json_schema")) {
            /* chat's response_format: {"type": "json_schema", "json_schema": {"name", "schema",
             * "strict", "description"}} */
            json_t *js = json_deep_copy(fmt);
            json_object_del(js, "type");
            json_object_set_new(chat, "response_format",
                                json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
        } else if (type && strcmp(type, "text")) {
            gw_err_set(e, 400, "invalid_value", "text.format",
                       "'text.format' type '%s' is not one of text, json_object, json_schema",
                       type);
            return -1;
        }
        if (json_object_get(v, "verbosity") && !json_is_null(json_object_get(v, "verbosity"))) {
            gw_err_set(e, 400, "unsupported", "text.verbosity",
                       "'text.verbosity' is not supported by ringlm: no verbosity control");
            return -1;
        }
    }
    if ((v = field(o, "metadata")) && !json_is_object(v)) {
        gw_err_set(e, 400, "invalid_value", "metadata", "'metadata' must be an object");
        return -1;
    }
    if ((v = field(o, "max_tool_calls"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1024) {
            gw_err_set(e, 400, "invalid_value", "max_tool_calls",
                       "'max_tool_calls' must be an integer in [1, 1024]");
            return -1;
        }
        *max_calls = (int)json_integer_value(v);
    }
    for (const char *k = "user"; k; k = NULL)
        if ((v = field(o, k)) && !json_is_string(v)) {
            gw_err_set(e, 400, "invalid_value", k, "'%s' must be a string", k);
            return -1;
        }
    /* what the response echoes */
    json_t *ptc = field(o, "parallel_tool_calls");
    json_object_set_new(
        resp, "max_output_tokens",
        json_incref(field(o, "max_output_tokens") ? field(o, "max_output_tokens") : json_null()));
    json_object_set_new(
        resp, "max_tool_calls",
        json_incref(field(o, "max_tool_calls") ? field(o, "max_tool_calls") : json_null()));
    json_object_set_new(resp, "metadata",
                        field(o, "metadata") ? json_incref(field(o, "metadata")) : json_object());
    json_object_set_new(resp, "parallel_tool_calls", ptc ? json_incref(ptc) : json_true());
    json_object_set_new(resp, "previous_response_id", json_null());
    json_object_set_new(resp, "reasoning", json_pack("{s:n, s:n}", "effort", "summary"));
    json_object_set_new(resp, "store", json_false());
    json_object_set_new(resp, "background", json_false());
    json_object_set_new(resp, "temperature",
                        field(o, "temperature") ? json_incref(field(o, "temperature"))
                                                : json_real(1.0));
    json_object_set_new(resp, "top_p",
                        field(o, "top_p") ? json_incref(field(o, "top_p")) : json_real(1.0));
    json_t *text = field(o, "text");
    json_object_set_new(resp, "text",
                        json_object_get(text, "format")
                            ? json_pack("{s:O}", "format", json_object_get(text, "format"))
                            : json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(resp, "tool_choice", tc ? json_incref(tc) : json_string("auto"));
    json_object_set_new(resp, "tools", tools ? json_incref(tools) : json_array());
    json_object_set_new(resp, "truncation", json_string("disabled"));
    json_object_set_new(resp, "user",
                        field(o, "user") ? json_incref(field(o, "user")) : json_null());
    return 0;
}

int gw_responses_parse(const char *body, size_t len, const gw_parse_cfg *cfg, gw_params *p,
                       json_t **resp, gw_err *e)
{
    memset(p, 0, sizeof *p);
    memset(e, 0, sizeof *e);
    *resp = NULL;
    json_t *o = gw_json_body(body, len, e);
    if (!o) return -1;
    int rc = -1, max_calls = 0;
    json_t *chat = json_object(), *r = json_object();
    char *text = NULL;
    if (!json_is_object(o)) {
        gw_err_set(e, 400, "invalid_json", NULL, "the body must be a JSON object");
        goto out;
    }
    if (check_fields(o, e) || to_chat(o, chat, r, &max_calls, e)) goto out;
    text = json_dumps(chat, JSON_COMPACT);
    if (!text) {
        gw_err_set(e, 500, "internal", NULL, "out of memory");
        goto out;
    }
    if (gw_params_parse(GW_CHAT, text, strlen(text), cfg, p, e)) {
        gw_responses_err(e);
        goto out;
    }
    if (max_calls && (!p->max_tool_calls || max_calls < p->max_tool_calls))
        p->max_tool_calls = max_calls;
    json_object_set_new(r, "object", json_string("response"));
    *resp = json_incref(r);
    rc = 0;
out:
    free(text);
    json_decref(chat);
    json_decref(r);
    json_decref(o);
    return rc;
}

/* ---- the answer: output items, events ------------------------------------------------- */
enum { ITEM_NONE, ITEM_MESSAGE, ITEM_CALL, ITEM_REASONING };

/* An event: "event: TYPE\ndata: {...}\n\n" with its sequence number (stream only). */
static void event(gw_req *r, const char *type, json_t *o)
{
    gw_resp_state *st = &r->rs;
    if (!r->p.stream) {
        json_decref(o);
        return;
    }
    json_object_set_new(o, "type", json_string(type));
    json_object_set_new(o, "sequence_number", json_integer(st->seq++));
    char *d = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    gw_buf_addf(&r->out, "event: %s\ndata: %s\n\n", type, d ? d : "{}");
    free(d);
}

/* The response object now: status, output so far. */
static json_t *response_now(gw_req *r, const char *status)
{
    json_t *o = json_deep_copy(r->rs.base);
    if (!o) return json_object();
    json_object_set_new(o, "status", json_string(status));
    json_object_set_new(o, "output", json_deep_copy(r->rs.output));
    return o;
}

static json_t *item_now(gw_req *r, const char *status)
{
    gw_resp_state *st = &r->rs;
    const char *acc = st->acc.p ? st->acc.p : "";
    switch (st->open) {
    case ITEM_MESSAGE:
        return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s%, s:[], s:[]}]}", "id", st->item_id,
                         "type", "message", "status", status, "role", "assistant", "content",
                         "type", "output_text", "text", acc, st->acc.len, "annotations",
                         "logprobs");
    case ITEM_CALL:
        return json_pack("{s:s, s:s, s:s, s:s, s:s%, s:s}", "id", st->item_id, "type",
                         "function_call", "call_id", st->call_id, "name", st->name ? st->name : "",
                         "arguments", acc, st->acc.len, "status", status);
    case ITEM_REASONING:
        return json_pack("{s:s, s:s, s:[], s:[{s:s, s:s%}], s:s}", "id", st->item_id, "type",
                         "reasoning", "summary", "content", "type", "reasoning_text", "text", acc,
                         st->acc.len, "status", status);
    }
    return json_object();
}

/* Ends the open item: its closing events, and it joins the output. */
static void close_item(gw_req *r)
{
    gw_resp_state *st = &r->rs;
    if (st->open == ITEM_NONE) return;
    const char *acc = st->acc.p ? st->acc.p : "";
    if (st->open == ITEM_MESSAGE) {
        event(r, "response.output_text.done",
              json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", st->item_id, "output_index",
                        st->index, "content_index", 0, "text", acc, st->acc.len, "logprobs"));
        event(r, "response.content_part.done",
              json_pack("{s:s, s:i, s:i, s:{s:s, s:s%, s:[], s:[]}}", "item_id", st->item_id,
                        "output_index", st->index, "content_index", 0, "part", "type",
                        "output_text", "text", acc, st->acc.len, "annotations", "logprobs"));
    } else if (st->open == ITEM_CALL) {
        event(r, "response.function_call_arguments.done",
              json_pack("{s:s, s:i, s:s, s:s%}", "item_id", st->item_id, "output_index", st->index,
                        "name", st->name ? st->name : "", "arguments", acc, st->acc.len));
    } else {
        event(r, "response.reasoning_text.done",
              json_pack("{s:s, s:i, s:i, s:s%}", "item_id", st->item_id, "output_index", st->index,
                        "content_index", 0, "text", acc, st->acc.len));
    }
    json_t *item = item_now(r, "completed");
    event(r, "response.output_item.done",
          json_pack("{s:i, s:O}", "output_index", st->index, "item", item));
    json_array_append_new(st->output, item);
    st->open = ITEM_NONE;
    st->acc.len = 0;
    free(st->name);
    st->name = NULL;
}

/* Opens an item of kind k (closing the one open). */
static void open_item(gw_req *r, int k)
{
    gw_resp_state *st = &r->rs;
    close_item(r);
    st->open = k;
    st->index = (int)json_array_size(st->output);
    const char *dash = strchr(r->id, '-');
    const char *tail = dash ? dash + 1 : r->id;
    snprintf(st->item_id, sizeof st->item_id, "%s_%s_%d",
             k == ITEM_MESSAGE ? "msg"
             : k == ITEM_CALL  ? "fc"
                               : "rs",
             tail, st->index);
    json_t *item = item_now(r, "in_progress");
    if (k == ITEM_MESSAGE) json_object_set_new(item, "content", json_array());
    if (k == ITEM_REASONING) json_object_set_new(item, "content", json_array());
    event(r, "response.output_item.added",
          json_pack("{s:i, s:o}", "output_index", st->index, "item", item));
    if (k == ITEM_MESSAGE)
        event(r, "response.content_part.added",
              json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[], s:[]}}", "item_id", st->item_id,
                        "output_index", st->index, "content_index", 0, "part", "type",
                        "output_text", "text", "", "annotations", "logprobs"));
}

void gw_resp_begin(gw_req *r)
{
    gw_resp_state *st = &r->rs;
    if (!st->output) st->output = json_array();
    json_object_set_new(st->base, "id", json_string(r->id));
    json_object_set_new(st->base, "created_at", json_integer(r->created));
    json_object_set_new(st->base, "model", json_string(gw_model(r->s)));
    json_object_set_new(st->base, "error", json_null());
    json_object_set_new(st->base, "incomplete_details", json_null());
    json_object_set_new(st->base, "usage", json_null());
    event(r, "response.created", json_pack("{s:o}", "response", response_now(r, "in_progress")));
    event(r, "response.in_progress",
          json_pack("{s:o}", "response", response_now(r, "in_progress")));
}

int gw_resp_text(gw_req *r, bool reasoning, const char *t, size_t n)
{
    gw_resp_state *st = &r->rs;
    if (!n) return 0;
    int k = reasoning ? ITEM_REASONING : ITEM_MESSAGE;
    if (st->open != k) open_item(r, k);
    if (gw_buf_add(&st->acc, t, n)) return -ENOMEM;
    if (!r->p.stream) return 0;
    int e =
        gw_buf_addf(&r->out,
                    "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%d,\"item_id\":\"%s\","
                    "\"output_index\":%d,\"content_index\":0,\"delta\":",
                    reasoning ? "response.reasoning_text.delta" : "response.output_text.delta",
                    reasoning ? "response.reasoning_text.delta" : "response.output_text.delta",
                    st->seq++, st->item_id, st->index);
    e |= gw_buf_add_json_str(&r->out, t, n);
    e |= gw_buf_adds(&r->out, reasoning ? "}\n\n" : ",\"logprobs\":[]}\n\n");
    return e ? -ENOMEM : 0;
}

int gw_resp_call(gw_req *r, int index, const char *name, size_t n)
{
    gw_resp_state *st = &r->rs;
    close_item(r);
    st->name = strndup(name, n);
    const char *dash = strchr(r->id, '-');
    snprintf(st->call_id, sizeof st->call_id, "call_%s_%d", dash ? dash + 1 : r->id, index);
    open_item(r, ITEM_CALL);
    return st->name ? 0 : -ENOMEM;
}

int gw_resp_args(gw_req *r, int index, const char *t, size_t n)
{
    (void)index;
    gw_resp_state *st = &r->rs;
    if (st->open != ITEM_CALL || !n) return 0;
    if (gw_buf_add(&st->acc, t, n)) return -ENOMEM;
    if (!r->p.stream) return 0;
    int e = gw_buf_addf(&r->out,
                        "event: response.function_call_arguments.delta\ndata: {\"type\":\"response."
                        "function_call_arguments.delta\",\"sequence_number\":%d,\"item_id\":\"%s\","
                        "\"output_index\":%d,\"delta\":",
                        st->seq++, st->item_id, st->index);
    e |= gw_buf_add_json_str(&r->out, t, n);
    e |= gw_buf_adds(&r->out, "}\n\n");
    return e ? -ENOMEM : 0;
}

/* The finished response: status, output, usage. */
static json_t *finished(gw_req *r)
{
    gw_resp_state *st = &r->rs;
    close_item(r);
    bool incomplete = r->finish && !strcmp(r->finish, "length");
    json_t *o = response_now(r, incomplete ? "incomplete" : "completed");
    if (incomplete)
        json_object_set_new(o, "incomplete_details",
                            json_pack("{s:s}", "reason", "max_output_tokens"));
    json_object_set_new(o, "usage",
                        json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens",
                                  (int)r->n_prompt, "input_tokens_details", "cached_tokens",
                                  (int)r->n_cached, "output_tokens", (int)r->n_gen,
                                  "output_tokens_details", "reasoning_tokens", 0, "total_tokens",
                                  (int)(r->n_prompt + r->n_gen)));
    (void)st;
    return o;
}

void gw_resp_end(gw_req *r)
{
    if (r->failed) {
        event(r, "error",
              json_pack("{s:s?, s:s, s:s?}", "code", r->err.code, "message", r->err.message,
                        "param", r->err.param[0] ? r->err.param : NULL));
        json_t *o = response_now(r, "failed");
        json_object_set_new(o, "error",
                            json_pack("{s:s, s:s}", "code",
                                      r->err.code ? r->err.code : "server_error", "message",
                                      r->err.message));
        event(r, "response.failed", json_pack("{s:o}", "response", o));
    } else {
        json_t *o = finished(r);
        event(r, "response.completed", json_pack("{s:o}", "response", o));
    }
    r->out_done = true;
}

json_t *gw_resp_whole(gw_req *r)
{
    return finished(r);
}

void gw_resp_free(gw_resp_state *st)
{
    json_decref(st->base);
    json_decref(st->output);
    gw_buf_free(&st->acc);
    free(st->name);
    memset(st, 0, sizeof *st);
}
