/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_params.c — request bodies to request parameters; OpenAI-shaped errors.
 */
#include "gateway/gw_params.h"

#include "libclient/ringlm.h"
#include "gateway/gw_tools.h"

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

json_t *gw_json_body(const char *body, size_t len, gw_err *e)
{
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        gw_err_set(e, 400, "invalid_json", NULL,
                   "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                   je.column);
    return o;
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

/* The messages as a template reads them: an assistant's tool_calls carry their arguments
 * as the JSON object the model wrote (OpenAI sends them as a string of JSON; templates
 * write `arguments | tojson`), as vLLM and Hugging Face pass them. A new reference. */
static json_t *template_messages(json_t *msgs)
{
    json_t *out = NULL;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *calls = json_object_get(json_array_get(msgs, i), "tool_calls");
        for (size_t k = 0; k < json_array_size(calls); k++) {
            json_t *args =
                json_object_get(json_object_get(json_array_get(calls, k), "function"), "arguments");
            if (!json_is_string(args)) continue;
            if (!out && !(out = json_deep_copy(msgs))) return NULL;
            json_t *fn = json_object_get(
                json_array_get(json_object_get(json_array_get(out, i), "tool_calls"), k),
                "function");
            json_t *obj = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
            if (json_is_object(obj))
                json_object_set_new(fn, "arguments", obj);
            else
                json_decref(obj);
        }
    }
    return out ? out : json_incref(msgs);
}

/* The model file's own template: the request's messages (any fields: content parts,
 * tool_calls, tool_call_id, reasoning_content), its tools, add_generation_prompt (default
 * true) and the members of chat_template_kwargs (enable_thinking, ...), as vLLM passes them.
 * As llama.cpp's server, the text leaves out a leading BOS text and a trailing EOS text where
 * the tokenizer adds the id itself (the file's add_bos_token, add_eos_token): one BOS either way. */
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
    json_t *vars = kw ? json_deep_copy(kw) : json_object(), *tm = template_messages(msgs);
    if (!vars || !tm) {
        json_decref(vars);
        json_decref(tm);
        goto oom;
    }
    json_object_set_new(vars, "messages", tm);
    if (tools) json_object_set(vars, "tools", tools);
    json_object_set_new(vars, "add_generation_prompt", agp ? json_incref(agp) : json_true());
    char *vj = json_dumps(vars, JSON_COMPACT), *text = NULL;
    json_decref(vars);
    if (!vj) goto oom;
    int rc = ringlm_chat_jinja_render(cfg->jinja, vj, cfg->jinja_strip, &text);
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

/* A function tool's parameters schema ({"type": "object"} when it has none). */
static json_t *params_schema(json_t *tool)
{
    json_t *ps = json_object_get(json_object_get(tool, "function"), "parameters");
    return json_is_object(ps) ? json_incref(ps) : json_pack("{s:s}", "type", "object");
}

/* tool_choice "required" or naming a function: the answer is constrained to calls (vLLM's
 * way): a named function's answer is its arguments (a JSON Schema of its parameters), a
 * required one a JSON list of {"name", "parameters"} objects of the tools (at least one; one
 * with parallel_tool_calls false). The gateway reads the calls out of that JSON. Under the
 * pythonic parser the answer is the model's own syntax instead, [name(k=v, ...)] (one call
 * of the named function, or at least one of the tools), its values Python literals of each
 * parameter's schema, read back by the pythonic parser. */
static int tool_constraint(json_t *tools, const char *named, bool parallel, int parser,
                           gw_params *p, gw_err *e)
{
    json_t *schema = NULL;
    if (parser == GW_TOOLS_PYTHONIC) {
        /* the model's own syntax, [name(k=v, ...), ...], read back by the pythonic parser */
        json_t *ts = json_array();
        for (size_t i = 0; i < json_array_size(tools); i++) {
            json_t *t = json_array_get(tools, i);
            json_t *name = json_object_get(json_object_get(t, "function"), "name");
            if (named && strcmp(named, json_string_value(name))) continue;
            json_array_append_new(
                ts, json_pack("{s:O, s:o}", "name", name, "parameters", params_schema(t)));
        }
        json_t *spec =
            json_pack("{s:o, s:i}", "tools", ts, "max_calls", named || !parallel ? 1 : 0);
        char *text = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
        json_decref(spec);
        if (!text) goto oom;
        p->tool_parser = GW_TOOLS_PYTHONIC;
        int rc = gw_params_set_constraint(p, RINGLM_CONSTRAINT_PYTHON_CALLS, text, strlen(text),
                                          "tool_choice", e);
        free(text);
        return rc;
    }
    if (named) {
        for (size_t i = 0; i < json_array_size(tools) && !schema; i++) {
            json_t *t = json_array_get(tools, i);
            if (!strcmp(named,
                        json_string_value(json_object_get(json_object_get(t, "function"), "name"))))
                schema = params_schema(t);
        }
        p->tool_parser = GW_TOOLS_NAMED;
        p->tool_name = strdup(named);
        if (!p->tool_name) goto oom;
    } else {
        json_t *alts = json_array();
        for (size_t i = 0; i < json_array_size(tools); i++) {
            json_t *t = json_array_get(tools, i);
            json_array_append_new(alts,
                                  json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s, s], s:b}", "type",
                                            "object", "properties", "name", "const",
                                            json_object_get(json_object_get(t, "function"), "name"),
                                            "parameters", params_schema(t), "required", "name",
                                            "parameters", "additionalProperties", 0));
        }
        json_t *items = json_array_size(alts) == 1 ? json_incref(json_array_get(alts, 0))
                                                   : json_pack("{s:O}", "anyOf", alts);
        json_decref(alts);
        schema = json_pack("{s:s, s:o, s:i}", "type", "array", "items", items, "minItems", 1);
        if (schema && !parallel) json_object_set_new(schema, "maxItems", json_integer(1));
        p->tool_parser = GW_TOOLS_JSON_LIST;
    }
    char *text = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
    json_decref(schema);
    if (!text) goto oom;
    int rc = gw_params_set_constraint(p, RINGLM_CONSTRAINT_JSON_SCHEMA, text, strlen(text),
                                      "tool_choice", e);
    free(text);
    return rc;
oom:
    gw_err_set(e, 500, "internal", NULL, "out of memory");
    return -1;
}

/* OpenAI's tools ([{"type": "function", "function": {"name", "description", "parameters",
 * "strict"}}]), tool_choice and parallel_tool_calls: which parser reads the answer, and for
 * "required" or a named function the constraint that makes the answer calls. */
static int rd_tools(json_t *o, const gw_parse_cfg *cfg, gw_params *p, gw_err *e)
{
    json_t *tools = field(o, "tools"), *tc = field(o, "tool_choice");
    if (tools && !json_is_array(tools))
        return bad(e, "tools", "'%s' must be %s", "a list of function tools");
    size_t n = tools ? json_array_size(tools) : 0;
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(tools, i), *fn = json_object_get(t, "function");
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *why = !json_is_object(t)                  ? "must be an object"
                          : !type || strcmp(type, "function") ? "'type' must be \"function\""
                          : !json_is_object(fn)               ? "'function' must be an object"
                          : !json_is_string(json_object_get(fn, "name")) ||
                                  !json_string_length(json_object_get(fn, "name"))
                              ? "'function.name' is required (a non-empty string)"
                          : json_object_get(fn, "parameters") &&
                                  !json_is_object(json_object_get(fn, "parameters")) &&
                                  !json_is_null(json_object_get(fn, "parameters"))
                              ? "'function.parameters' must be a JSON Schema (an object)"
                              : NULL;
        if (why) {
            gw_err_set(e, 400, "invalid_value", "tools", "'tools' item %zu: %s", i, why);
            return -1;
        }
        const char *name = json_string_value(json_object_get(fn, "name"));
        for (size_t k = 0; k < i; k++)
            if (!strcmp(name,
                        json_string_value(json_object_get(
                            json_object_get(json_array_get(tools, k), "function"), "name")))) {
                gw_err_set(e, 400, "invalid_value", "tools",
                           "'tools' items %zu and %zu are both named '%s'", k, i, name);
                return -1;
            }
    }
    bool parallel = true;
    if (rd_bool(o, "parallel_tool_calls", &parallel, e)) return -1;
    enum { TC_DEFAULT, TC_NONE, TC_AUTO, TC_REQUIRED, TC_NAMED } choice = TC_DEFAULT;
    const char *named = NULL;
    if (json_is_string(tc)) {
        const char *v = json_string_value(tc);
        choice = !strcmp(v, "none")       ? TC_NONE
                 : !strcmp(v, "auto")     ? TC_AUTO
                 : !strcmp(v, "required") ? TC_REQUIRED
                                          : TC_DEFAULT;
    } else if (json_is_object(tc)) {
        const char *type = json_string_value(json_object_get(tc, "type"));
        named = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
        if (type && !strcmp(type, "function") && named) choice = TC_NAMED;
    }
    if (tc && choice == TC_DEFAULT)
        return bad(e, "tool_choice", "'%s' must be %s",
                   "\"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                   "\"function\": {\"name\": NAME}}");
    if (choice != TC_DEFAULT && choice != TC_NONE && n == 0) {
        gw_err_set(e, 400, "invalid_value", "tool_choice",
                   "'tool_choice' other than \"none\" needs 'tools'");
        return -1;
    }
    if (choice == TC_NAMED) {
        bool found = false;
        for (size_t i = 0; i < n && !found; i++)
            found =
                !strcmp(named, json_string_value(json_object_get(
                                   json_object_get(json_array_get(tools, i), "function"), "name")));
        if (!found) {
            gw_err_set(e, 400, "invalid_value", "tool_choice",
                       "'tool_choice' names the function '%s', which is not in 'tools'", named);
            return -1;
        }
    }
    if ((choice == TC_REQUIRED || choice == TC_NAMED) &&
        tool_constraint(tools, named, parallel, cfg->tool_parser, p, e))
        return -1;
    if (choice == TC_AUTO && !cfg->tool_parser)
        return unsupported(e, "tool_choice",
                           "\"auto\": the gateway knows no tool-call syntax for this model's chat "
                           "template; start it with --tool-call-parser "
                           "hermes|llama3_json|mistral|pythonic");
    if (n && (choice == TC_AUTO || (choice == TC_DEFAULT && cfg->tool_parser)))
        p->tool_parser = cfg->tool_parser;
    p->max_tool_calls = parallel ? 0 : 1;
    return 0;
}

/* ---- tools in the built-in templates ---------------------------------------------------- */
/* The text of a JSON value as Hugging Face's tojson writes it (Python's json.dumps: ", " and
 * ": ", non-ASCII as it is), indented by indent spaces when indent > 0. */
static int add_tojson(gw_buf *b, json_t *v, int indent)
{
    char *t = json_dumps(v, JSON_ENCODE_ANY | (indent ? JSON_INDENT(indent) : 0));
    int rc = t ? gw_buf_adds(b, t) : -1;
    free(t);
    return rc;
}

/* A call's arguments as the object they hold (a string that is no JSON: the string). */
static json_t *call_args(json_t *call)
{
    json_t *a = json_object_get(json_object_get(call, "function"), "arguments");
    if (!json_is_string(a)) return json_incref(a ? a : json_null());
    json_t *o = json_loads(json_string_value(a), JSON_DECODE_ANY, NULL);
    return o ? o : json_incref(a);
}

static const char *content_str(json_t *m)
{
    const char *c = json_string_value(json_object_get(m, "content"));
    return c ? c : "";
}

/*
 * A conversation with tools, tool calls or tool results, for a built-in template that has no
 * place for them, as its family's reference template writes them (a new list of {"role",
 * "content"} messages; NULL with *e set when the template has no tool format):
 *   chatml  Hermes/Qwen 2.5-3: the tools in the system message under "# Tools" (one JSON a
 *           line in <tools></tools>, then how to call), an assistant's calls as
 *           <tool_call>\n{"name": N, "arguments": ARGS}\n</tool_call> after its content, a run
 *           of tool results as one user turn of <tool_response>\nRESULT\n</tool_response>
 *   llama3  Llama 3.1-3.3's JSON tool calling: "Environment: ipython" in the system message,
 *           the tools (indented JSON) and how to call in the first user message, a call as
 *           {"name": N, "parameters": ARGS}, a tool result as an ipython turn (its JSON text)
 */
static json_t *builtin_tool_messages(int tpl, json_t *msgs, json_t *tools, gw_err *e)
{
    if (tpl != RINGLM_CHAT_CHATML && tpl != RINGLM_CHAT_LLAMA3) {
        unsupported(e, json_array_size(tools) ? "tools" : "messages",
                    "the built-in chat template has no format for tools, tool calls or tool "
                    "results (chatml and llama3 have); serve the model file's own template (a "
                    "GGUF tokenizer's chat_template)");
        return NULL;
    }
    bool chatml = tpl == RINGLM_CHAT_CHATML;
    json_t *out = json_array();
    gw_buf b = {0};
    size_t n = json_array_size(msgs), i = 0;
    size_t ntools = json_array_size(tools);
    /* the system message */
    json_t *first = json_array_get(msgs, 0);
    bool has_sys = !strcmp(json_string_value(json_object_get(first, "role")) ?: "", "system");
    if (ntools || !chatml) {
        b.len = 0;
        gw_buf_add(&b, "", 0);
        if (chatml) {
            if (has_sys) gw_buf_addf(&b, "%s\n\n", content_str(first));
            gw_buf_adds(&b, "# Tools\n\nYou may call one or more functions to assist with the user "
                            "query.\n\nYou are provided with function signatures within "
                            "<tools></tools> XML tags:\n<tools>");
            for (size_t k = 0; k < ntools; k++) {
                gw_buf_adds(&b, "\n");
                add_tojson(&b, json_array_get(tools, k), 0);
            }
            gw_buf_adds(&b, "\n</tools>\n\nFor each function call, return a json object with "
                            "function name and arguments within <tool_call></tool_call> XML "
                            "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                            "<args-json-object>}\n</tool_call>");
        } else {
            if (ntools) gw_buf_adds(&b, "Environment: ipython\n\n");
            if (has_sys) gw_buf_adds(&b, content_str(first));
        }
        if (b.len)
            json_array_append_new(
                out, json_pack("{s:s, s:s%}", "role", "system", "content", b.p, b.len));
        if (has_sys) i = 1;
    }
    bool tools_placed = chatml || !ntools;
    for (; i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role")) ?: "";
        json_t *calls = json_object_get(m, "tool_calls");
        b.len = 0;
        gw_buf_add(&b, "", 0);
        if (!strcmp(role, "tool")) {
            if (chatml) { /* a run of results is one user turn */
                for (; i < n; i++) {
                    json_t *t = json_array_get(msgs, i);
                    if (strcmp(json_string_value(json_object_get(t, "role")) ?: "", "tool")) break;
                    gw_buf_addf(&b, "%s<tool_response>\n%s\n</tool_response>", b.len ? "\n" : "",
                                content_str(t));
                }
                i--;
                json_array_append_new(
                    out, json_pack("{s:s, s:s%}", "role", "user", "content", b.p, b.len));
            } else {
                add_tojson(&b, json_object_get(m, "content"), 0);
                json_array_append_new(
                    out, json_pack("{s:s, s:s%}", "role", "ipython", "content", b.p, b.len));
            }
            continue;
        }
        if (!strcmp(role, "assistant") && json_array_size(calls)) {
            if (chatml) {
                const char *c = content_str(m);
                if (*c) gw_buf_addf(&b, "%s\n", c);
                for (size_t k = 0; k < json_array_size(calls); k++) {
                    json_t *call = json_array_get(calls, k), *args = call_args(call);
                    gw_buf_addf(&b,
                                "%s<tool_call>\n{\"name\": \"%s\", \"arguments\": ", k ? "\n" : "",
                                json_string_value(
                                    json_object_get(json_object_get(call, "function"), "name"))
                                    ?: "");
                    add_tojson(&b, args, 0);
                    gw_buf_adds(&b, "}\n</tool_call>");
                    json_decref(args);
                }
            } else { /* Llama 3.1 writes one call a turn */
                if (json_array_size(calls) > 1) {
                    gw_err_set(e, 400, "invalid_value", "messages",
                               "'messages' item %zu: the llama3 template writes one tool call a "
                               "turn, not %zu",
                               i, json_array_size(calls));
                    json_decref(out);
                    gw_buf_free(&b);
                    return NULL;
                }
                json_t *call = json_array_get(calls, 0), *args = call_args(call);
                gw_buf_addf(
                    &b, "{\"name\": \"%s\", \"parameters\": ",
                    json_string_value(json_object_get(json_object_get(call, "function"), "name"))
                        ?: "");
                add_tojson(&b, args, 0);
                gw_buf_adds(&b, "}");
                json_decref(args);
            }
            json_array_append_new(
                out, json_pack("{s:s, s:s%}", "role", "assistant", "content", b.p, b.len));
            continue;
        }
        if (!tools_placed && !strcmp(role, "user")) { /* llama3: the tools come with it */
            gw_buf_adds(&b, "Given the following functions, please respond with a JSON for a "
                            "function call with its proper arguments that best answers the given "
                            "prompt.\n\nRespond in the format {\"name\": function name, "
                            "\"parameters\": dictionary of argument name and its value}.Do not use "
                            "variables.\n\n");
            for (size_t k = 0; k < ntools; k++) {
                add_tojson(&b, json_array_get(tools, k), 4);
                gw_buf_adds(&b, "\n\n");
            }
            gw_buf_adds(&b, content_str(m));
            json_array_append_new(out,
                                  json_pack("{s:s, s:s%}", "role", "user", "content", b.p, b.len));
            tools_placed = true;
            continue;
        }
        json_array_append(out, m);
    }
    gw_buf_free(&b);
    return out;
}

/* The conversation names tools, tool calls or tool results. */
static bool has_tool_parts(json_t *o, json_t *msgs)
{
    if (json_array_size(field(o, "tools"))) return true;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (json_array_size(json_object_get(m, "tool_calls")) ||
            !strcmp(json_string_value(json_object_get(m, "role")) ?: "", "tool"))
            return true;
    }
    return false;
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
    json_t *converted = NULL;
    if (has_tool_parts(o, v)) {
        for (size_t i = 0; i < json_array_size(v); i++) /* the types the conversion reads */
            if (!json_is_object(json_array_get(v, i)) ||
                !json_is_string(json_object_get(json_array_get(v, i), "role"))) {
                gw_err_set(e, 400, "invalid_value", "messages",
                           "'messages' item %zu must be an object with a string 'role'", i);
                return -1;
            }
        if (!(converted = builtin_tool_messages(cfg->tpl, v, field(o, "tools"), e))) return -1;
        v = converted;
    }
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
    json_decref(converted);
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

/* ---- the fields ------------------------------------------------------------------------ */
#define BOTH GW_EP_COMPLETIONS | GW_EP_CHAT
#define CMPL GW_EP_COMPLETIONS
#define CHAT GW_EP_CHAT
#define IMPL GW_FIELD_IMPLEMENTED
#define IGN  GW_FIELD_IGNORED
#define REF  GW_FIELD_REFUSED
/* The one table of fields; docs/gateway.md's "Fields" table says the same (a test compares
 * them and sends each field). */
static const gw_field fields[] = {
    {"model", BOTH, IMPL, NULL, NULL},
    {"prompt", CMPL, IMPL, NULL, NULL},
    {"messages", CHAT, IMPL, NULL, NULL},
    {"max_tokens", BOTH, IMPL, NULL, NULL},
    {"max_completion_tokens", BOTH, IMPL, NULL, NULL},
    {"temperature", BOTH, IMPL, NULL, NULL},
    {"top_p", BOTH, IMPL, NULL, NULL},
    {"top_k", BOTH, IMPL, NULL, NULL},
    {"min_p", BOTH, IMPL, NULL, NULL},
    {"seed", BOTH, IMPL, NULL, NULL},
    {"stop", BOTH, IMPL, NULL, NULL},
    {"stop_token_ids", BOTH, IMPL, NULL, NULL},
    {"ignore_eos", BOTH, IMPL, NULL, NULL},
    {"logit_bias", BOTH, IMPL, NULL, NULL},
    {"presence_penalty", BOTH, IMPL, NULL, NULL},
    {"frequency_penalty", BOTH, IMPL, NULL, NULL},
    {"repetition_penalty", BOTH, IMPL, NULL, NULL},
    {"stream", BOTH, IMPL, NULL, NULL},
    {"stream_options", BOTH, IMPL, NULL, NULL},
    {"ringlm", BOTH, IMPL, NULL, NULL},
    {"user", BOTH, IGN, NULL, NULL},
    {"n", BOTH, IMPL, NULL, NULL},
    {"best_of", CMPL, IMPL, NULL, NULL},
    {"logprobs", BOTH, IMPL, NULL, NULL},
    {"top_logprobs", CHAT, IMPL, NULL, NULL},
    {"prompt_logprobs", BOTH, IMPL, NULL, NULL},
    {"echo", CMPL, IMPL, NULL, NULL},
    {"suffix", CMPL, REF, "\"\"", "no insertion mode"},
    {"response_format", BOTH, IMPL, NULL, NULL},
    {"guided_json", BOTH, IMPL, NULL, NULL},
    {"guided_regex", BOTH, IMPL, NULL, NULL},
    {"guided_choice", BOTH, IMPL, NULL, NULL},
    {"guided_grammar", BOTH, IMPL, NULL, NULL},
    {"structured_outputs", BOTH, IMPL, NULL, NULL},
    {"grammar", BOTH, IMPL, NULL, NULL},
    {"json_schema", BOTH, IMPL, NULL, NULL},
    {"tools", CHAT, IMPL, NULL, NULL},
    {"tool_choice", CHAT, IMPL, NULL, NULL},
    {"parallel_tool_calls", CHAT, IMPL, NULL, NULL},
    {"functions", CHAT, REF, NULL, "the deprecated form of 'tools'; send 'tools'"},
    {"function_call", CHAT, REF, NULL, "the deprecated form of 'tool_choice'; send 'tool_choice'"},
    {"min_tokens", BOTH, REF, "0", "no minimum length"},
    {"bad_words", BOTH, REF, NULL, "not implemented; logit_bias -100 forbids a token"},
    {"allowed_token_ids", BOTH, REF, NULL, "not implemented; logit_bias restricts tokens"},
    {"use_beam_search", BOTH, REF, "false", "no beam search"},
    {"length_penalty", BOTH, REF, "1", "no beam search"},
    {"include_stop_str_in_output", BOTH, REF, "false", "stop strings are never emitted"},
    {"skip_special_tokens", BOTH, REF, "true", "special tokens are never emitted as text"},
    {"spaces_between_special_tokens", BOTH, REF, "true", "special tokens are never emitted"},
    {"truncate_prompt_tokens", BOTH, REF, NULL, "prompts are never truncated"},
    {"add_special_tokens", BOTH, REF, NULL, "BOS and EOS are added as the model file says"},
    {"add_generation_prompt", CHAT, IMPL, NULL, NULL},
    {"continue_final_message", CHAT, REF, "false", "the assistant's turn is always new"},
    {"chat_template", CHAT, REF, NULL, "the gateway's --chat-template decides"},
    {"chat_template_kwargs", CHAT, IMPL, NULL, NULL},
    {"reasoning_effort", CHAT, REF, NULL, "no reasoning controls"},
    {"modalities", CHAT, REF, NULL, "text only"},
    {"audio", CHAT, REF, NULL, "text only"},
    {"prediction", CHAT, REF, NULL, "no predicted outputs"},
    {"store", BOTH, REF, "false", "nothing is stored"},
    {"metadata", BOTH, REF, NULL, "nothing is stored"},
    {"service_tier", BOTH, REF, NULL, "the API key's class decides (or ringlm.class)"},
    {"priority", BOTH, REF, NULL, "the API key's class decides (or ringlm.class)"},
    {"tenant", BOTH, REF, NULL, "the API key decides the tenant"},
};
#undef BOTH
#undef CMPL
#undef CHAT
#undef IMPL
#undef IGN
#undef REF

const gw_field *gw_fields(size_t *n)
{
    *n = sizeof fields / sizeof fields[0];
    return fields;
}

const char *gw_field_status_name(gw_field_status s)
{
    switch (s) {
    case GW_FIELD_IMPLEMENTED: return "implemented";
    case GW_FIELD_IGNORED: return "ignored";
    case GW_FIELD_REFUSED: return "refused";
    }
    return "?";
}

/* Every field of the body is in the table, for this endpoint, and not refused (unless null
 * or at its neutral value). 0, or -1 with a 400 naming it. */
static int check_fields(gw_kind kind, json_t *o, gw_err *e)
{
    unsigned ep = kind == GW_CHAT ? GW_EP_CHAT : GW_EP_COMPLETIONS;
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        const gw_field *f = NULL;
        for (size_t i = 0; i < sizeof fields / sizeof fields[0] && !f; i++)
            if (!strcmp(fields[i].name, k)) f = &fields[i];
        if (!f || !(f->endpoints & ep)) {
            gw_err_set(e, 400, "unsupported", k,
                       "'%s' is not a field ringlm's %s endpoint knows; docs/gateway.md lists "
                       "every field it implements, ignores or refuses",
                       k, kind == GW_CHAT ? "chat completions" : "completions");
            return -1;
        }
        if (f->status != GW_FIELD_REFUSED || json_is_null(v)) continue;
        if (f->neutral) {
            json_t *n = json_loads(f->neutral, JSON_DECODE_ANY, NULL);
            bool same = n && json_equal(n, v);
            json_decref(n);
            if (same) continue;
        }
        return unsupported(e, k, f->why);
    }
    return 0;
}

/* ---- sampling extensions --------------------------------------------------------------- */
static int rd_float(json_t *o, const char *k, float *out, gw_err *e)
{
    double d = *out;
    if (rd_num(o, k, &d, e)) return -1;
    *out = (float)d;
    return 0;
}

/* OpenAI's {"token id": bias}. */
static int rd_logit_bias(json_t *o, gw_params *p, gw_err *e)
{
    json_t *v = field(o, "logit_bias");
    if (!v) return 0;
    if (!json_is_object(v))
        return bad(e, "logit_bias", "'%s' must be %s", "an object of token id: bias");
    size_t n = json_object_size(v);
    if (n == 0) return 0;
    p->bias = calloc(n, sizeof *p->bias);
    if (!p->bias) {
        gw_err_set(e, 500, "internal", NULL, "out of memory");
        return -1;
    }
    const char *k;
    json_t *b;
    uint32_t i = 0;
    json_object_foreach(v, k, b)
    {
        char *end;
        errno = 0;
        long long id = strtoll(k, &end, 10);
        if (!*k || *end || errno || id < 0 || id > INT32_MAX) {
            gw_err_set(e, 400, "invalid_value", "logit_bias",
                       "'logit_bias' key \"%s\" is not a token id", k);
            return -1;
        }
        if (!json_is_number(b)) {
            gw_err_set(e, 400, "invalid_value", "logit_bias",
                       "'logit_bias' value of token %lld must be a number", id);
            return -1;
        }
        p->bias[i].token = (int32_t)id;
        p->bias[i].bias = (float)json_number_value(b);
        i++;
    }
    p->smp.logit_bias = p->bias;
    p->smp.n_logit_bias = i;
    return 0;
}

static int rd_stop_ids(json_t *o, gw_params *p, gw_err *e)
{
    json_t *v = field(o, "stop_token_ids");
    if (!v) return 0;
    if (!json_is_array(v))
        return bad(e, "stop_token_ids", "'%s' must be %s", "a list of token ids");
    size_t n = json_array_size(v);
    if (n == 0) return 0;
    p->stop_ids = calloc(n, sizeof *p->stop_ids);
    if (!p->stop_ids) {
        gw_err_set(e, 500, "internal", NULL, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(v, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX) {
            gw_err_set(e, 400, "invalid_value", "stop_token_ids",
                       "'stop_token_ids' item %zu must be a token id (an integer >= 0)", i);
            return -1;
        }
        p->stop_ids[i] = (int32_t)json_integer_value(t);
    }
    p->smp.stop_token_ids = p->stop_ids;
    p->smp.n_stop_token_ids = (uint32_t)n;
    return 0;
}

static int rd_sampling(json_t *o, gw_params *p, gw_err *e)
{
    if (rd_float(o, "presence_penalty", &p->smp.presence_penalty, e) ||
        rd_float(o, "frequency_penalty", &p->smp.frequency_penalty, e) ||
        rd_float(o, "repetition_penalty", &p->smp.repetition_penalty, e) ||
        rd_float(o, "min_p", &p->smp.min_p, e))
        return -1;
    return rd_logit_bias(o, p, e) || rd_stop_ids(o, p, e) ? -1 : 0;
}

/* ---- structured output ----------------------------------------------------------------- */
int gw_params_set_constraint(gw_params *p, uint32_t kind, const char *text, size_t len,
                             const char *param, gw_err *e)
{
    if (p->smp.constraint_kind) {
        gw_err_set(e, 400, "invalid_value", param,
                   "'%s' and '%s' both constrain the output: give one of them", param,
                   p->constraint_param ? p->constraint_param : "?");
        return -1;
    }
    if (len) {
        if (!(p->constraint = malloc(len))) {
            gw_err_set(e, 500, "internal", NULL, "out of memory");
            return -1;
        }
        memcpy(p->constraint, text, len);
    }
    p->smp.constraint_kind = kind;
    p->smp.constraint = p->constraint;
    p->smp.constraint_bytes = len;
    p->constraint_param = param;
    return 0;
}

/* A JSON Schema given as an object (or, as vLLM takes guided_json, as its text). */
static int set_schema(gw_params *p, json_t *schema, const char *param, gw_err *e)
{
    if (json_is_string(schema))
        return gw_params_set_constraint(p, RINGLM_CONSTRAINT_JSON_SCHEMA, json_string_value(schema),
                                        json_string_length(schema), param, e);
    if (!json_is_object(schema) && !json_is_boolean(schema))
        return bad(e, param, "'%s' must be %s", "a JSON Schema (an object)");
    /* jansson keeps the members' order: the answer's properties come in the schema's */
    char *t = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) {
        gw_err_set(e, 500, "internal", NULL, "out of memory");
        return -1;
    }
    int rc = gw_params_set_constraint(p, RINGLM_CONSTRAINT_JSON_SCHEMA, t, strlen(t), param, e);
    free(t);
    return rc;
}

static int set_string(gw_params *p, uint32_t kind, json_t *v, const char *param, const char *what,
                      gw_err *e)
{
    if (!json_is_string(v) || json_string_length(v) == 0)
        return bad(e, param, "'%s' must be %s", what);
    return gw_params_set_constraint(p, kind, json_string_value(v), json_string_length(v), param, e);
}

/* A list of strings: the answer is exactly one of them. */
static int set_choice(gw_params *p, json_t *v, const char *param, gw_err *e)
{
    if (!json_is_array(v) || json_array_size(v) == 0)
        return bad(e, param, "'%s' must be %s", "a non-empty list of strings");
    gw_buf b = {0};
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *c = json_array_get(v, i);
        if (!json_is_string(c) || memchr(json_string_value(c), 0, json_string_length(c))) {
            gw_buf_free(&b);
            gw_err_set(e, 400, "invalid_value", param,
                       "'%s' item %zu must be a string (without NUL characters)", param, i);
            return -1;
        }
        if ((i && gw_buf_add(&b, "", 1)) ||
            gw_buf_add(&b, json_string_value(c), json_string_length(c))) {
            gw_buf_free(&b);
            gw_err_set(e, 500, "internal", NULL, "out of memory");
            return -1;
        }
    }
    /* an empty single choice is text of 0 bytes: the one check refuses a kind without text */
    int rc = gw_params_set_constraint(p, RINGLM_CONSTRAINT_CHOICE, b.p ? b.p : "", b.len, param, e);
    gw_buf_free(&b);
    return rc;
}

/* OpenAI's response_format: {"type": "text" | "json_object" | "json_schema", "json_schema":
 * {"name", "schema", "strict", "description"}}; llama.cpp's {"type": "json_object" |
 * "json_schema", "schema": {...}} too. The schema is enforced exactly whether strict is true
 * or not (the constraint is never looser than the schema). */
static int rd_response_format(json_t *v, gw_params *p, gw_err *e)
{
    const char *P = "response_format";
    if (!json_is_object(v)) return bad(e, P, "'%s' must be %s", "an object with a 'type'");
    const char *type = json_string_value(json_object_get(v, "type"));
    if (!type)
        return bad(e, P, "'%s' must be %s",
                   "an object with a 'type' (text, json_object, json_schema)");
    json_t *schema = field(v, "schema"); /* llama.cpp's */
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object"))
        return schema ? set_schema(p, schema, P, e)
                      : gw_params_set_constraint(p, RINGLM_CONSTRAINT_JSON_OBJECT, NULL, 0, P, e);
    if (strcmp(type, "json_schema")) {
        gw_err_set(e, 400, "invalid_value", P,
                   "'response_format' type '%s' is not one of text, json_object, json_schema",
                   type);
        return -1;
    }
    json_t *js = field(v, "json_schema");
    if (js) {
        if (!json_is_object(js))
            return bad(e, "response_format.json_schema", "'%s' must be %s", "an object");
        json_t *strict = field(js, "strict"), *name = field(js, "name");
        if (strict && !json_is_boolean(strict))
            return bad(e, "response_format.json_schema.strict", "'%s' must be %s", "a boolean");
        if (name && !json_is_string(name))
            return bad(e, "response_format.json_schema.name", "'%s' must be %s", "a string");
        schema = field(js, "schema");
    }
    if (!schema) {
        gw_err_set(e, 400, "invalid_value", P,
                   "'response_format' of type json_schema needs its schema "
                   "(json_schema.schema)");
        return -1;
    }
    return set_schema(p, schema, P, e);
}

/* vLLM's structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object": ...},
 * one of them. */
static int rd_structured_outputs(json_t *v, gw_params *p, gw_err *e)
{
    const char *P = "structured_outputs";
    if (!json_is_object(v)) return bad(e, P, "'%s' must be %s", "an object");
    const char *k;
    json_t *u;
    json_object_foreach(v, k, u)
    {
        if (json_is_null(u)) continue;
        int rc;
        if (!strcmp(k, "json"))
            rc = set_schema(p, u, P, e);
        else if (!strcmp(k, "regex"))
            rc = set_string(p, RINGLM_CONSTRAINT_REGEX, u, P, "a regular expression", e);
        else if (!strcmp(k, "choice"))
            rc = set_choice(p, u, P, e);
        else if (!strcmp(k, "grammar"))
            rc = set_string(p, RINGLM_CONSTRAINT_GRAMMAR, u, P, "a grammar", e);
        else if (!strcmp(k, "json_object"))
            rc = json_is_true(u)
                     ? gw_params_set_constraint(p, RINGLM_CONSTRAINT_JSON_OBJECT, NULL, 0, P, e)
                     : 0;
        else {
            gw_err_set(e, 400, "unsupported", P,
                       "'structured_outputs.%s' is not supported by ringlm (json, regex, "
                       "choice, grammar, json_object)",
                       k);
            return -1;
        }
        if (rc) {
            if (e->status == 400 && strstr(e->message, "both constrain"))
                snprintf(e->message, sizeof e->message,
                         "'structured_outputs' holds more than one constraint: give one of "
                         "json, regex, choice, grammar, json_object");
            return -1;
        }
    }
    return 0;
}

/* Every field that asks for an output constraint; at most one may. */
static int rd_constraints(json_t *o, gw_params *p, gw_err *e)
{
    json_t *v;
    if ((v = field(o, "response_format")) && rd_response_format(v, p, e)) return -1;
    if ((v = field(o, "guided_json")) && set_schema(p, v, "guided_json", e)) return -1;
    if ((v = field(o, "guided_regex")) &&
        set_string(p, RINGLM_CONSTRAINT_REGEX, v, "guided_regex", "a regular expression", e))
        return -1;
    if ((v = field(o, "guided_choice")) && set_choice(p, v, "guided_choice", e)) return -1;
    if ((v = field(o, "guided_grammar")) &&
        set_string(p, RINGLM_CONSTRAINT_GRAMMAR, v, "guided_grammar", "a GBNF grammar", e))
        return -1;
    if ((v = field(o, "structured_outputs")) && rd_structured_outputs(v, p, e)) return -1;
    if ((v = field(o, "grammar")) &&
        set_string(p, RINGLM_CONSTRAINT_GRAMMAR, v, "grammar", "a GBNF grammar", e))
        return -1;
    if ((v = field(o, "json_schema")) && set_schema(p, v, "json_schema", e)) return -1;
    return 0;
}

/* ---- the body -------------------------------------------------------------------------- */
static int parse_obj(gw_kind kind, json_t *o, const gw_parse_cfg *cfg, gw_params *p, gw_err *e)
{
    json_t *v;
    long long x;
    bool set = false;

    if (check_fields(kind, o, e)) return -1;
    if ((v = field(o, "model"))) {
        if (!json_is_string(v)) return bad(e, "model", "'%s' must be %s", "a string");
        if (cfg->served_model && strcmp(json_string_value(v), cfg->served_model)) {
            gw_err_set(e, 404, "model_not_found", "model",
                       "The model '%s' does not exist; this server serves '%s'",
                       json_string_value(v), cfg->served_model);
            return -1;
        }
    }
    if (kind == GW_CHAT && rd_tools(o, cfg, p, e)) return -1;
    if (kind == GW_COMPLETION ? rd_prompt(o, p, e) : rd_messages(o, cfg, p, e)) {
        if (!e->status) gw_err_set(e, 500, "internal", NULL, "out of memory");
        return -1;
    }
    /* max_completion_tokens wherever max_tokens is (OpenAI's newer name); both must agree.
     * What fits the request's field; the range is the one check's (gw_params_check). */
    long long x2 = 0;
    bool set2 = false;
    if (rd_int(o, "max_tokens", 0, UINT32_MAX, &x, &set, e) ||
        rd_int(o, "max_completion_tokens", 0, UINT32_MAX, &x2, &set2, e))
        return -1;
    if (set && set2 && x != x2) {
        gw_err_set(e, 400, "invalid_value", "max_completion_tokens",
                   "'max_completion_tokens' is %lld and 'max_tokens' %lld: give one of them", x2,
                   x);
        return -1;
    }
    if (set2) x = x2;
    if (set || set2) p->max_tokens = (long)x;
    set = false;
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
    /* n choices of one prompt (ringlmd computes the prompt once); best_of (completions, as
     * vLLM): best_of samples, the n of the highest cumulative log-probability answered.
     * The upper bound is the one check's (ringlm_sampling.n) and the daemon's --max-n. */
    set = false;
    if (rd_int(o, "n", LLONG_MIN, LLONG_MAX, &x, &set, e)) return -1;
    if (set && (x < 1 || x > (long long)RINGLM_MAX_N)) {
        gw_err_set(e, 400, "invalid_value", "n", "'n' is %lld; it must be in [1, %u]", x,
                   RINGLM_MAX_N);
        return -1;
    }
    if (set) p->n = (uint32_t)x;
    set = false;
    if (kind == GW_COMPLETION) {
        if (rd_int(o, "best_of", LLONG_MIN, LLONG_MAX, &x, &set, e)) return -1;
        if (set && (x < (long long)p->n || x > (long long)RINGLM_MAX_N)) {
            gw_err_set(e, 400, "invalid_value", "best_of",
                       "'best_of' is %lld; it must be in [n = %u, %u]", x, p->n, RINGLM_MAX_N);
            return -1;
        }
        if (set) p->best_of = (uint32_t)x;
        if (p->best_of > p->n && p->stream)
            return bad(e, "best_of", "'%s' is %s",
                       "above n: not available with \"stream\": true (as vLLM's)");
    }
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
    if (rd_sampling(o, p, e) || rd_constraints(o, p, e)) return -1;

    /* The ringlm extension: the request class and a deadline. A "tenant" here, or
	 * anywhere in the body, is refused: the API key decides the tenant. */
    if ((v = field(o, "ringlm"))) {
        if (!json_is_object(v)) return bad(e, "ringlm", "'%s' must be %s", "an object");
        const char *k;
        json_t *u;
        json_object_foreach(v, k, u)
        {
            if (strcmp(k, "class") && strcmp(k, "deadline_ms")) {
                gw_err_set(e, 400, "unsupported", "ringlm",
                           "'ringlm.%s' is not a field of the ringlm extension (class, "
                           "deadline_ms)%s",
                           k, strcmp(k, "tenant") ? "" : ": the API key decides the tenant");
                return -1;
            }
        }
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
    p->n = 1;
    ringlm_sampling_init(&p->smp);
    p->temperature = 1.0;
    p->top_p = 1.0;
    json_t *o = gw_json_body(body, len, e);
    if (!o) return -1;
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
    free(p->bias);
    free(p->stop_ids);
    free(p->constraint);
    free(p->tool_name);
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
    if (!strcmp(field, "size") || !strcmp(field, "flags")) return NULL; /* the gateway's own */
    return field;                                                       /* temperature, top_p */
}

bool gw_params_sampling(const gw_params *p, ringlm_sampling *smp)
{
    *smp = p->smp; /* logit_bias, the penalties, min_p, stop ids (lists owned by p) */
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
    smp->n = p->best_of > p->n ? p->best_of : p->n;
    if (p->best_of > p->n && !(smp->flags & RINGLM_SAMPLING_LOGPROBS)) {
        /* ranked by each sample's cumulative log-probability: every token's (raw: vLLM's) */
        smp->flags |= RINGLM_SAMPLING_LOGPROBS;
        smp->top_logprobs = 0;
    }
    ringlm_sampling plain;
    ringlm_sampling_init(&plain);
    return smp->flags != 0 || smp->n > 1 || smp->n_logit_bias || smp->n_stop_token_ids ||
           smp->constraint_kind || smp->repetition_penalty != plain.repetition_penalty ||
           smp->presence_penalty != plain.presence_penalty ||
           smp->frequency_penalty != plain.frequency_penalty || smp->min_p != plain.min_p;
}

int gw_params_check(const gw_params *p, const ringlm_request *rq, const ringlm_sampling *smp,
                    int vocab, gw_err *e)
{
    const char *field;
    int rc = ringlm_request_check_ext(rq, smp, vocab, &field);
    if (rc == 0) return 0;
    const char *param = openai_param(field, p->kind);
    /* the sampling members under the body's names */
    if (field && !strcmp(field, "top_logprobs"))
        param = p->kind == GW_CHAT ? "top_logprobs" : "logprobs";
    if (field && !strcmp(field, "prompt_logprobs") && p->prompt_logprobs == GW_LP_NONE)
        param = "logprobs"; /* asked through echo */
    if (field && !strcmp(field, "n") && p->best_of > p->n) param = "best_of";
    if (field && !strcmp(field, "constraint")) param = p->constraint_param;
    const char *code = rc == -ENOTSUP ? "unsupported" : "invalid_value";
    if (param)
        gw_err_set(e, 400, code, param, "'%s': %s", param, ringlm_errdetail());
    else
        gw_err_set(e, 400, code, NULL, "%s", ringlm_errdetail());
    return -1;
}
