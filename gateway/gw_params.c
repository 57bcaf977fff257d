/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_params.c — request bodies to request parameters; OpenAI-shaped errors.
 */
#include "gateway/gw_params.h"

#include "libclient/ringlm.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ---------------------------------------------------------------------------- */
static const char *type_of(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    case 504: return "timeout_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

void gw_err_set(gw_err *e, int status, const char *code, const char *param, const char *fmt, ...)
{
    e->status = status;
    e->type = type_of(status);
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *gw_err_json(const gw_err *e)
{
    json_t *o = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->message, "type",
                          e->type, "param", e->param[0] ? json_string(e->param) : json_null(),
                          "code", e->code ? json_string(e->code) : json_null());
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* ---- field readers --------------------------------------------------------------------- */
/* Every reader: absent or null → leaves the default and returns 0; wrong type or value →
 * fills e and returns -1. */
static json_t *field(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) ? v : NULL;
}

static int bad(gw_err *e, const char *param, const char *fmt, const char *what)
{
    gw_err_set(e, 400, "invalid_value", param, fmt, param, what);
    return -1;
}

static int rd_bool(json_t *o, const char *k, bool *out, gw_err *e)
{
    json_t *v = field(o, k);
    if (!v) return 0;
    if (!json_is_boolean(v)) return bad(e, k, "'%s' must be %s", "a boolean");
    *out = json_is_true(v);
    return 0;
}

/* A number; its range is the one parameter check's (gw_params_check), not the parser's. */
static int rd_num(json_t *o, const char *k, double *out, gw_err *e)
{
    json_t *v = field(o, k);
    if (!v) return 0;
    if (!json_is_number(v)) return bad(e, k, "'%s' must be %s", "a number");
    *out = json_number_value(v);
    return 0;
}

static int rd_int(json_t *o, const char *k, long long lo, long long hi, long long *out, bool *set,
                  gw_err *e)
{
    json_t *v = field(o, k);
    if (!v) return 0;
    if (!json_is_integer(v)) return bad(e, k, "'%s' must be %s", "an integer");
    long long x = json_integer_value(v);
    if (x < lo || x > hi) {
        gw_err_set(e, 400, "invalid_value", k, "'%s' is %lld, outside [%lld, %lld]", k, x, lo, hi);
        return -1;
    }
    *out = x;
    if (set) *set = true;
    return 0;
}

static int unsupported(gw_err *e, const char *k, const char *why)
{
    gw_err_set(e, 400, "unsupported", k, "'%s' is not supported by ringlm: %s", k, why);
    return -1;
}

/* ---- prompt and messages --------------------------------------------------------------- */
static int rd_ids(json_t *a, const char *param, gw_params *p, gw_err *e)
{
    size_t n = json_array_size(a);
    if (n == 0) return bad(e, param, "'%s' is %s", "an empty list of token ids");
    p->prompt_ids = malloc(n * sizeof *p->prompt_ids);
    if (!p->prompt_ids) {
        gw_err_set(e, 500, "internal", NULL, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(a, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX) {
            gw_err_set(e, 400, "invalid_value", param,
                       "'%s' item %zu must be a token id (an integer >= 0)", param, i);
            return -1;
        }
        p->prompt_ids[i] = (int32_t)json_integer_value(t);
    }
    p->n_prompt_ids = (uint32_t)n;
    return 0;
}

static int rd_prompt(json_t *o, gw_params *p, gw_err *e)
{
    json_t *v = field(o, "prompt");
    if (!v) {
        gw_err_set(e, 400, "missing_field", "prompt", "'prompt' is required");
        return -1;
    }
    if (json_is_string(v)) {
        p->prompt_text = strdup(json_string_value(v));
        return p->prompt_text ? 0 : -1;
    }
    if (!json_is_array(v))
        return bad(e, "prompt", "'%s' must be %s",
                   "a string, a list of token ids, or a list of one of those");
    json_t *first = json_array_get(v, 0);
    if (first && (json_is_string(first) || json_is_array(first))) {
        if (json_array_size(v) != 1) {
            gw_err_set(e, 400, "unsupported", "prompt",
                       "'prompt' holds %zu prompts; ringlm takes one prompt per request",
                       json_array_size(v));
            return -1;
        }
        if (json_is_string(first)) {
            p->prompt_text = strdup(json_string_value(first));
            return p->prompt_text ? 0 : -1;
        }
        return rd_ids(first, "prompt", p, e);
    }
    return rd_ids(v, "prompt", p, e);
}

/* Content: a string, or a list of {"type":"text","text":...} parts (joined). */
static int rd_content(json_t *c, size_t i, gw_buf *out, gw_err *e)
{
    if (json_is_string(c)) return gw_buf_adds(out, json_string_value(c)) ? -1 : 0;
    if (!json_is_array(c)) {
        gw_err_set(e, 400, "invalid_value", "messages",
                   "'messages' item %zu: 'content' must be a string or a list of text parts", i);
        return -1;
    }
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k);
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!type || strcmp(type, "text") || !json_is_string(text)) {
            gw_err_set(e, 400, "unsupported", "messages",
                       "'messages' item %zu part %zu: only {\"type\": \"text\", \"text\": ...} "
                       "parts are supported",
                       i, k);
            return -1;
        }
        if (gw_buf_adds(out, json_string_value(text))) return -1;
    }
    return 0;
}

/* The model file's own template: the request's messages as they are (any fields: content
 * parts, tool_calls, tool_call_id, reasoning_content), its tools, add_generation_prompt
 * (default true) and the members of chat_template_kwargs (enable_thinking, ...), as vLLM
 * passes them. The text leaves out a leading BOS: the gateway's tokenizer adds the id. */
static int rd_messages_jinja(json_t *o, json_t *msgs, const gw_parse_cfg *cfg, gw_params *p,
                             gw_err *e)
{
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *msg = json_array_get(msgs, i);
        if (!json_is_object(msg) || !json_is_string(json_object_get(msg, "role"))) {
            gw_err_set(e, 400, "invalid_value", "messages",
                       "'messages' item %zu must be an object with a string 'role'", i);
            return -1;
        }
    }
    json_t *kw = field(o, "chat_template_kwargs"), *tools = field(o, "tools"),
           *agp = field(o, "add_generation_prompt");
    if (kw && !json_is_object(kw))
        return bad(e, "chat_template_kwargs", "'%s' must be %s", "an object");
    if (tools && !json_is_array(tools)) return bad(e, "tools", "'%s' must be %s", "a list");
    if (agp && !json_is_boolean(agp))
        return bad(e, "add_generation_prompt", "'%s' must be %s", "a boolean");
    json_t *vars = kw ? json_deep_copy(kw) : json_object();
    if (!vars) goto oom;
    json_object_set(vars, "messages", msgs);
    if (tools) json_object_set(vars, "tools", tools);
    json_object_set_new(vars, "add_generation_prompt", agp ? json_incref(agp) : json_true());
    char *vj = json_dumps(vars, JSON_COMPACT), *text = NULL;
    json_decref(vars);
    if (!vj) goto oom;
    int rc = ringlm_chat_jinja_render(cfg->jinja, vj, RINGLM_CHAT_JINJA_STRIP_BOS, &text);
    free(vj);
    if (rc == -ENOMEM) goto oom;
    if (rc) {
        gw_err_set(e, 400, "invalid_value", "messages", "'messages': the model's %s",
                   ringlm_errdetail());
        return -1;
    }
    p->prompt_text = text;
    return 0;
oom:
    gw_err_set(e, 500, "internal", NULL, "out of memory");
    return -1;
}

static int rd_messages(json_t *o, const gw_parse_cfg *cfg, gw_params *p, gw_err *e)
{
    json_t *v = field(o, "messages");
    if (!v) {
        gw_err_set(e, 400, "missing_field", "messages", "'messages' is required");
        return -1;
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return bad(e, "messages", "'%s' must be %s", "a non-empty list of messages");
    if (cfg->jinja) return rd_messages_jinja(o, v, cfg, p, e);
    size_t n = json_array_size(v);
    ringlm_chat_msg *m = calloc(n, sizeof *m);
    gw_buf *texts = calloc(n, sizeof *texts);
    int r = -1;
    if (!m || !texts) {
        gw_err_set(e, 500, "internal", NULL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(v, i);
        const char *role = json_string_value(json_object_get(msg, "role"));
        if (!json_is_object(msg) || !role) {
            gw_err_set(e, 400, "invalid_value", "messages",
                       "'messages' item %zu must be an object with a string 'role'", i);
            goto out;
        }
        json_t *c = json_object_get(msg, "content");
        if (c && !json_is_null(c) && rd_content(c, i, &texts[i], e)) goto out;
        if (gw_buf_add(&texts[i], "", 0)) {
            gw_err_set(e, 500, "internal", NULL, "out of memory");
            goto out;
        }
        m[i].role = role;
        m[i].content = texts[i].p;
    }
    char *text = NULL;
    int rr = ringlm_chat_format(cfg->tpl, m, (int)n, &text);
    if (rr == -EINVAL) {
        gw_err_set(e, 400, "invalid_value", "messages", "'messages': %s (chat template %s)",
                   ringlm_errdetail(), ringlm_chat_template_name(cfg->tpl));
        goto out;
    }
    if (rr) {
        gw_err_set(e, 500, "internal", NULL, "out of memory");
        goto out;
    }
    p->prompt_text = text;
    r = 0;
out:
    if (texts)
        for (size_t i = 0; i < n; i++) gw_buf_free(&texts[i]);
    free(texts);
    free(m);
    return r;
}

static int add_stop(gw_params *p, const char *s, size_t n, gw_err *e)
{
    if (p->stop.n >= GW_MAX_STOP) {
        gw_err_set(e, 400, "invalid_value", "stop", "'stop' holds more than %d strings",
                   GW_MAX_STOP);
        return -1;
    }
    if (n == 0 || n > GW_STOP_MAX_LEN) {
        gw_err_set(e, 400, "invalid_value", "stop",
                   "'stop' strings must be 1 to %d bytes (got %zu)", GW_STOP_MAX_LEN, n);
        return -1;
    }
    char *c = strndup(s, n);
    if (!c) {
        gw_err_set(e, 500, "internal", NULL, "out of memory");
        return -1;
    }
    p->stop.s[p->stop.n] = c;
    p->stop.len[p->stop.n++] = n;
    return 0;
}

static int rd_stop(json_t *o, gw_params *p, gw_err *e)
{
    json_t *v = field(o, "stop");
    if (!v) return 0;
    if (json_is_string(v)) return add_stop(p, json_string_value(v), json_string_length(v), e);
    if (!json_is_array(v))
        return bad(e, "stop", "'%s' must be %s", "a string or a list of strings");
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *s = json_array_get(v, i);
        if (!json_is_string(s))
            return bad(e, "stop", "'%s' must be %s", "a string or a list of strings");
        if (add_stop(p, json_string_value(s), json_string_length(s), e)) return -1;
    }
    return 0;
}

/* ---- the body -------------------------------------------------------------------------- */
static int parse_obj(gw_kind kind, json_t *o, const gw_parse_cfg *cfg, gw_params *p, gw_err *e)
{
    json_t *v;
    long long x;
    bool set = false;

    if ((v = field(o, "model"))) {
        if (!json_is_string(v)) return bad(e, "model", "'%s' must be %s", "a string");
        if (cfg->served_model && strcmp(json_string_value(v), cfg->served_model)) {
            gw_err_set(e, 404, "model_not_found", "model",
                       "The model '%s' does not exist; this server serves '%s'",
                       json_string_value(v), cfg->served_model);
            return -1;
        }
    }
    if (kind == GW_COMPLETION ? rd_prompt(o, p, e) : rd_messages(o, cfg, p, e)) {
        if (!e->status) gw_err_set(e, 500, "internal", NULL, "out of memory");
        return -1;
    }
    const char *mt = kind == GW_CHAT && field(o, "max_completion_tokens") ? "max_completion_tokens"
                                                                          : "max_tokens";
    /* What fits the request's field; the range is the one check's (gw_params_check). */
    if (rd_int(o, mt, 0, UINT32_MAX, &x, &set, e)) return -1;
    if (set) p->max_tokens = (long)x;
    if (rd_num(o, "temperature", &p->temperature, e) || rd_num(o, "top_p", &p->top_p, e)) return -1;
    set = false;
    if (rd_int(o, "top_k", -1, 1 << 20, &x, &set, e)) return -1;
    if (set) p->top_k = x < 0 ? 0 : (uint32_t)x;
    set = false;
    if (rd_int(o, "seed", INT64_MIN, INT64_MAX, &x, &set, e)) return -1;
    if (set) {
        p->seed = (uint64_t)x;
        p->has_seed = true;
    }
    if (rd_stop(o, p, e) || rd_bool(o, "stream", &p->stream, e) ||
        rd_bool(o, "ignore_eos", &p->ignore_eos, e))
        return -1;
    if ((v = field(o, "stream_options"))) {
        if (!json_is_object(v)) return bad(e, "stream_options", "'%s' must be %s", "an object");
        json_t *u = field(v, "include_usage");
        if (u && !json_is_boolean(u))
            return bad(e, "stream_options.include_usage", "'%s' must be %s", "a boolean");
        p->include_usage = u && json_is_true(u);
    }
    if ((v = field(o, "user")) && !json_is_string(v))
        return bad(e, "user", "'%s' must be %s", "a string");
    set = false;
    if (rd_int(o, "n", LLONG_MIN, LLONG_MAX, &x, &set, e)) return -1;
    if (set && x != 1) {
        gw_err_set(e, 400, "unsupported", "n",
                   "'n' is %lld; ringlm returns one choice per request (n = 1)", x);
        return -1;
    }
    set = false;
    if (rd_int(o, "best_of", LLONG_MIN, LLONG_MAX, &x, &set, e)) return -1;
    if (set && x != 1) return unsupported(e, "best_of", "one choice per request");
    /* Log-probabilities: the types here, the ranges in the one check (gw_params_check). Chat
     * asks with "logprobs": true and "top_logprobs": N; completions with "logprobs": N. */
    if (kind == GW_CHAT) {
        bool want = false;
        if (rd_bool(o, "logprobs", &want, e)) return -1;
        set = false;
        if (rd_int(o, "top_logprobs", INT32_MIN, INT32_MAX, &x, &set, e)) return -1;
        if (set && !want)
            return bad(e, "top_logprobs", "'%s' needs %s", "\"logprobs\": true (as OpenAI's)");
        if (want) p->logprobs = set ? (int)x : 0;
        if ((v = field(o, "echo")) && !json_is_false(v))
            return unsupported(e, "echo", "chat completions do not echo the conversation");
    } else {
        set = false;
        if (rd_int(o, "logprobs", INT32_MIN, INT32_MAX, &x, &set, e)) return -1;
        if (set) p->logprobs = (int)x;
        if (field(o, "top_logprobs"))
            return bad(e, "top_logprobs", "'%s' is %s", "chat's; completions take \"logprobs\": N");
        if (rd_bool(o, "echo", &p->echo, e)) return -1;
    }
    set = false;
    if (rd_int(o, "prompt_logprobs", INT32_MIN, INT32_MAX, &x, &set, e)) return -1;
    if (set) p->prompt_logprobs = (int)x;
    if (set && p->stream)
        return bad(e, "prompt_logprobs", "'%s' is %s",
                   "not available with \"stream\": true (as vLLM's)");
    if ((v = field(o, "suffix")) && !(json_is_string(v) && json_string_length(v) == 0))
        return unsupported(e, "suffix", "no insertion mode");

    /* The ringlm extension: the request class and a deadline. A "tenant" here, or
	 * anywhere in the body, is not read: the API key decides the tenant. */
    if ((v = field(o, "ringlm"))) {
        if (!json_is_object(v)) return bad(e, "ringlm", "'%s' must be %s", "an object");
        json_t *c = field(v, "class");
        if (c) {
            if (!json_is_string(c) || json_string_length(c) == 0 ||
                json_string_length(c) >= GW_NAME_MAX)
                return bad(e, "ringlm.class", "'%s' must be %s", "a class name of 1 to 15 bytes");
            snprintf(p->class_name, sizeof p->class_name, "%s", json_string_value(c));
        }
        set = false;
        if (rd_int(v, "deadline_ms", 1, (long long)(UINT64_MAX / 1000 / 2), &x, &set, e)) {
            snprintf(e->param, sizeof e->param, "ringlm.deadline_ms");
            return -1;
        }
        if (set) p->deadline_ms = (uint64_t)x;
    }
    return 0;
}

int gw_params_parse(gw_kind kind, const char *body, size_t len, const gw_parse_cfg *cfg,
                    gw_params *p, gw_err *e)
{
    memset(p, 0, sizeof *p);
    memset(e, 0, sizeof *e);
    p->kind = kind;
    p->max_tokens = -1;
    p->logprobs = p->prompt_logprobs = GW_LP_NONE;
    p->temperature = 1.0;
    p->top_p = 1.0;
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        gw_err_set(e, 400, "invalid_json", NULL,
                   "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                   je.column);
        return -1;
    }
    int r = 0;
    if (!json_is_object(o)) {
        gw_err_set(e, 400, "invalid_json", NULL, "the body must be a JSON object");
        r = -1;
    } else {
        r = parse_obj(kind, o, cfg, p, e);
    }
    json_decref(o);
    if (r) gw_params_free(p);
    return r;
}

void gw_params_free(gw_params *p)
{
    free(p->prompt_text);
    free(p->prompt_ids);
    for (int i = 0; i < p->stop.n; i++) free((char *)p->stop.s[i]);
    memset(p, 0, sizeof *p);
}

/* The OpenAI name of a ringlm_request member that ringlm_request_check named. */
static const char *openai_param(const char *field, gw_kind kind)
{
    if (!field) return NULL;
    if (!strcmp(field, "max_new_tokens")) return "max_tokens";
    if (!strcmp(field, "deadline_us")) return "ringlm.deadline_ms";
    if (!strcmp(field, "class_name")) return "ringlm.class";
    if (!strcmp(field, "prompt") || !strcmp(field, "n_prompt"))
        return kind == GW_CHAT ? "messages" : "prompt";
    if (!strcmp(field, "tenant_tag")) return NULL; /* the key's, not the body's */
    return field;                                  /* temperature, top_p */
}

bool gw_params_sampling(const gw_params *p, ringlm_sampling *smp)
{
    ringlm_sampling_init(smp);
    if (p->logprobs != GW_LP_NONE) {
        smp->flags |= RINGLM_SAMPLING_LOGPROBS;
        smp->top_logprobs = (uint32_t)p->logprobs; /* a negative one is refused by the check */
    }
    /* the prompt's: vLLM's prompt_logprobs, or OpenAI's echo with logprobs (the echoed
     * prompt's tokens are listed with theirs), or echo with max_tokens 0 (nothing to
     * generate: a request that only computes its prompt) */
    int plp = p->prompt_logprobs;
    if (p->echo && p->logprobs != GW_LP_NONE && (plp == GW_LP_NONE || p->logprobs > plp))
        plp = p->logprobs;
    if (p->echo && p->max_tokens == 0 && plp == GW_LP_NONE) plp = 0;
    if (plp != GW_LP_NONE) {
        smp->flags |= RINGLM_SAMPLING_PROMPT_LOGPROBS;
        smp->prompt_logprobs = (uint32_t)plp;
    }
    return smp->flags != 0;
}

int gw_params_check(const gw_params *p, const ringlm_request *rq, const ringlm_sampling *smp,
                    gw_err *e)
{
    const char *field;
    int rc = ringlm_request_check_ext(rq, smp, 0, &field);
    if (rc == 0) return 0;
    const char *param = openai_param(field, p->kind);
    /* the sampling members under the body's names */
    if (field && !strcmp(field, "top_logprobs"))
        param = p->kind == GW_CHAT ? "top_logprobs" : "logprobs";
    if (field && !strcmp(field, "prompt_logprobs") && p->prompt_logprobs == GW_LP_NONE)
        param = "logprobs"; /* asked through echo */
    const char *code = rc == -ENOTSUP ? "unsupported" : "invalid_value";
    if (param)
        gw_err_set(e, 400, code, param, "'%s': %s", param, ringlm_errdetail());
    else
        gw_err_set(e, 400, code, NULL, "%s", ringlm_errdetail());
    return -1;
}
