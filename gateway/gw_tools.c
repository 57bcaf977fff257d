/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_tools.c — tool calls out of a chat answer's text (see gw_tools.h). The text is
 * read a byte at a time through one state machine: the phases say where the text is
 * (content, a marker, a call object, between calls), the sub-states where a call object's
 * scan is (its top-level keys and values; nested values are only counted). The syntaxes
 * follow vLLM's parsers of the same names; mistral reads both of Mistral's forms, the JSON
 * list of tokenizers before v11 ([TOOL_CALLS] [{"name": ..., "arguments": ...}]) and the
 * name-then-arguments calls of v11 and later ([TOOL_CALLS]name[ARGS]{...}, v13 with
 * [CALL_ID]id between them).
 */
#include "gateway/gw_tools.h"

#include "libclient/ringlm.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum phase {
    PH_START,   /* llama3_json: nothing decided yet (leading whitespace held) */
    PH_TAG,     /* llama3_json: matching <|python_tag|> at the start */
    PH_CONTENT, /* content; hermes and mistral look for their marker */
    PH_REST,    /* content to the end */
    PH_PRE,     /* after the marker: whitespace, then '{' (mistral: or '[') */
    PH_OBJ,     /* in a call object */
    PH_CLOSE,   /* hermes: matching </tool_call> after the object */
    PH_AFTER,   /* mistral and llama3_json: after an object, its separator */
    PH_NAMED,   /* tool_choice naming a function: all of the text is its arguments */
    PH_MNAME,   /* mistral v11+: [TOOL_CALLS]name[ARGS]{...}: the name */
    PH_MMARK,   /* mistral v11+: inside [ARGS] or [CALL_ID] after the name */
    PH_MCALLID, /* mistral v13: the call id after [CALL_ID], up to [ARGS] */
    PH_MARGS,   /* mistral v11+: the arguments object after [ARGS] */
};

enum sub { O_KEY_OR_END, O_KEY, O_COLON, O_VAL, O_NAME, O_ARGS, O_SKIP, O_AFTER_VAL };
enum key { K_OTHER, K_NAME, K_ARGS };

static const char HERMES_OPEN[] = "<tool_call>", HERMES_CLOSE[] = "</tool_call>",
                  MISTRAL_OPEN[] = "[TOOL_CALLS]", PYTHON_TAG[] = "<|python_tag|>";

int gw_tool_parser_by_name(const char *name)
{
    if (!name) return -1;
    if (!strcmp(name, "hermes")) return GW_TOOLS_HERMES;
    if (!strcmp(name, "llama3_json")) return GW_TOOLS_LLAMA3_JSON;
    if (!strcmp(name, "mistral")) return GW_TOOLS_MISTRAL;
    return -1;
}

const char *gw_tool_parser_name(int parser)
{
    switch (parser) {
    case GW_TOOLS_HERMES: return "hermes";
    case GW_TOOLS_LLAMA3_JSON: return "llama3_json";
    case GW_TOOLS_MISTRAL: return "mistral";
    default: return "none";
    }
}

const char *gw_tool_parser_marker(int parser)
{
    switch (parser) {
    case GW_TOOLS_LLAMA3_JSON: return PYTHON_TAG;
    case GW_TOOLS_MISTRAL: return MISTRAL_OPEN;
    default: return NULL;
    }
}

int gw_tool_parser_of_rendering(const char *text, const char *fn)
{
    if (!text) return GW_TOOLS_NONE;
    if (strstr(text, HERMES_OPEN)) return GW_TOOLS_HERMES;
    if (strstr(text, MISTRAL_OPEN)) return GW_TOOLS_MISTRAL;
    if (strstr(text, PYTHON_TAG)) return GW_TOOLS_LLAMA3_JSON;
    char call[160];
    if (fn && strlen(fn) < 100) {
        snprintf(call, sizeof call, "{\"name\": \"%s\"", fn);
        if (strstr(text, call)) return GW_TOOLS_LLAMA3_JSON;
    }
    return GW_TOOLS_NONE;
}

int gw_tool_parser_of_template(const struct ringlm_chat_jinja *t)
{
    static const char probe[] =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"What time is it?\"}, "
        "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": "
        "\"call_0\", \"type\": \"function\", \"function\": {\"name\": \"ringlm_probe_fn\", "
        "\"arguments\": {\"tz\": \"UTC\"}}}]}], \"tools\": [{\"type\": \"function\", "
        "\"function\": {\"name\": \"ringlm_probe_fn\", \"description\": \"The time.\", "
        "\"parameters\": {\"type\": \"object\", \"properties\": {\"tz\": {\"type\": "
        "\"string\"}}}}}], \"add_generation_prompt\": false}";
    char *text = NULL;
    if (!t || ringlm_chat_jinja_render(t, probe, 0, &text) < 0) return GW_TOOLS_NONE;
    /* the call as the template writes it, after the tools' own description */
    const char *call = strstr(text, "ringlm_probe_fn");
    const char *last = call;
    while (call && (call = strstr(call + 1, "ringlm_probe_fn"))) last = call;
    int parser = GW_TOOLS_NONE;
    if (last) {
        size_t from = (size_t)(last - text) > 200 ? (size_t)(last - text) - 200 : 0;
        parser = gw_tool_parser_of_rendering(text + from, "ringlm_probe_fn");
    }
    free(text);
    return parser;
}

int gw_tool_parser_of_builtin(int tpl)
{
    switch (tpl) {
    case RINGLM_CHAT_CHATML: return GW_TOOLS_HERMES;
    case RINGLM_CHAT_LLAMA3: return GW_TOOLS_LLAMA3_JSON;
    case RINGLM_CHAT_MISTRAL_V3:
    case RINGLM_CHAT_MISTRAL_V3_TEKKEN:
    case RINGLM_CHAT_MISTRAL_V7: return GW_TOOLS_MISTRAL;
    default: return GW_TOOLS_NONE;
    }
}

void gw_tools_init(gw_tool_state *st, int parser, int max_calls)
{
    memset(st, 0, sizeof *st);
    st->parser = parser;
    st->max_calls = max_calls;
    st->phase = parser == GW_TOOLS_LLAMA3_JSON ? PH_START
                : parser == GW_TOOLS_JSON_LIST ? PH_PRE
                                               : PH_CONTENT;
}

int gw_tools_init_named(gw_tool_state *st, const char *name)
{
    gw_tools_init(st, GW_TOOLS_NAMED, 1);
    st->phase = PH_NAMED;
    return gw_buf_adds(&st->name, name);
}

/* tool_choice naming a function: its call starts with the answer. */
static int flush(gw_tool_state *st, const gw_tool_sink *k);
static int named_start(gw_tool_state *st, const gw_tool_sink *k)
{
    int rc = flush(st, k);
    st->n_calls = 1;
    st->started = true;
    return rc ? rc : k->call_start(k->arg, 0, st->name.p ? st->name.p : "", st->name.len);
}

void gw_tools_free(gw_tool_state *st)
{
    gw_buf_free(&st->held);
    gw_buf_free(&st->keyb);
    gw_buf_free(&st->name);
    gw_buf_free(&st->args);
    gw_buf_free(&st->out);
    gw_buf_free(&st->aout);
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* A byte of a function name in Mistral's v11+ syntax. */
static bool is_name_byte(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
}

/* The current call is handed on (not past max_calls). */
static bool kept(const gw_tool_state *st)
{
    return st->max_calls <= 0 || st->n_calls <= st->max_calls;
}

/* Hands on the content and the current call's arguments gathered so far. */
static int flush(gw_tool_state *st, const gw_tool_sink *k)
{
    int rc = 0;
    if (st->out.len) {
        rc = k->content(k->arg, st->out.p, st->out.len);
        st->out.len = 0;
        if (rc) return rc;
    }
    if (st->aout.len) {
        if (kept(st)) rc = k->call_args(k->arg, st->n_calls - 1, st->aout.p, st->aout.len);
        st->aout.len = 0;
    }
    return rc;
}

static int add_content(gw_tool_state *st, const char *t, size_t n)
{
    if (st->trim) {
        while (n && is_ws(*t)) t++, n--;
        if (!n) return 0;
        st->trim = false;
    }
    return gw_buf_add(&st->out, t, n);
}

/* A call object begins (its '{' is read). */
static void obj_begin(gw_tool_state *st)
{
    st->phase = PH_OBJ;
    st->sub = O_KEY_OR_END;
    st->started = st->have_args = st->args_seen = st->args_str = st->in_str = st->esc = false;
    st->nest = 0;
    st->key = K_OTHER;
    st->keyb.len = st->name.len = st->args.len = 0;
}

/* The syntax broke at byte c: a call not started comes back as content; the rest of the
 * text is content. */
static int fail(gw_tool_state *st, char c)
{
    if (!st->started && st->held.len && gw_buf_add(&st->out, st->held.p, st->held.len))
        return -ENOMEM;
    st->held.len = 0;
    st->phase = PH_REST;
    st->trim = false;
    return gw_buf_add(&st->out, &c, 1);
}

/* Arguments the model wrote as a JSON string: decoded. */
static int args_decoded(gw_tool_state *st, gw_buf *to)
{
    json_t *s = json_loadb(st->args.p, st->args.len, JSON_DECODE_ANY, NULL);
    int rc = json_is_string(s) ? gw_buf_add(to, json_string_value(s), json_string_length(s))
                               : gw_buf_add(to, st->args.p, st->args.len);
    json_decref(s);
    return rc;
}

/* The name is whole: the call starts (and arguments read before it follow). */
static int call_start(gw_tool_state *st, const gw_tool_sink *k)
{
    json_t *s = json_loadb(st->name.p, st->name.len, JSON_DECODE_ANY, NULL);
    if (!json_is_string(s) || json_string_length(s) == 0) {
        json_decref(s);
        return 1; /* not a call: the caller fails */
    }
    int rc = flush(st, k);
    st->n_calls++;
    if (!rc && kept(st))
        rc = k->call_start(k->arg, st->n_calls - 1, json_string_value(s), json_string_length(s));
    json_decref(s);
    if (rc) return rc;
    st->started = true;
    st->held.len = 0;
    if (st->args.len && !st->args_str) {
        rc = gw_buf_add(&st->aout, st->args.p, st->args.len);
        st->args.len = 0;
    } else if (st->args.len && st->have_args) {
        rc = args_decoded(st, &st->aout);
        st->args.len = 0;
    }
    return rc;
}

/* The object's '}' is read: a call when it had a name. */
static int obj_end(gw_tool_state *st, const gw_tool_sink *k)
{
    if (!st->started) return 1;
    int rc = 0;
    if (!st->have_args) rc = gw_buf_adds(&st->aout, "{}"); /* no arguments given */
    if (!rc) rc = flush(st, k);
    st->held.len = 0;
    st->phase = st->parser == GW_TOOLS_HERMES ? PH_CLOSE : PH_AFTER;
    st->mk = 0;
    return rc;
}

/* A value's byte that goes to the arguments. */
static int args_byte(gw_tool_state *st, char c)
{
    if (st->args_str || !st->started) return gw_buf_add(&st->args, &c, 1);
    return kept(st) ? gw_buf_add(&st->aout, &c, 1) : 0;
}

/* Tracks a nested value (or string) byte c; true when the value ended with c. */
static bool value_byte(gw_tool_state *st, char c)
{
    if (st->in_str) {
        if (st->esc)
            st->esc = false;
        else if (c == '\\')
            st->esc = true;
        else if (c == '"') {
            st->in_str = false;
            return st->nest == 0;
        }
        return false;
    }
    if (c == '"')
        st->in_str = true;
    else if (c == '{' || c == '[')
        st->nest++;
    else if (c == '}' || c == ']')
        return --st->nest == 0;
    return false;
}

/* One byte of a call object. Returns 0, 1 (the syntax broke), or a sink's / -ENOMEM. */
static int obj_byte(gw_tool_state *st, char c, const gw_tool_sink *k)
{
    switch (st->sub) {
    case O_KEY_OR_END:
        if (is_ws(c) || c == ',') return 0;
        if (c == '}') return obj_end(st, k);
        if (c != '"') return 1;
        st->keyb.len = 0;
        st->sub = O_KEY;
        st->esc = false;
        return 0;
    case O_KEY:
        if (st->esc)
            st->esc = false;
        else if (c == '\\')
            st->esc = true;
        else if (c == '"') {
            /* the first "name", the first "arguments" (llama3_json: "parameters") */
            const char *kb = st->keyb.p ? st->keyb.p : "";
            size_t kn = st->keyb.len;
            bool is_args = (kn == 9 && !memcmp(kb, "arguments", 9)) ||
                           (kn == 10 && !memcmp(kb, "parameters", 10));
            st->key = kn == 4 && !memcmp(kb, "name", 4) && !st->name.len ? K_NAME
                      : is_args && !st->args_seen                        ? K_ARGS
                                                                         : K_OTHER;
            st->sub = O_COLON;
            return 0;
        }
        return gw_buf_add(&st->keyb, &c, 1);
    case O_COLON:
        if (is_ws(c)) return 0;
        if (c != ':') return 1;
        st->sub = O_VAL;
        return 0;
    case O_VAL:
        if (is_ws(c)) return 0;
        st->in_str = st->esc = false;
        st->nest = 0;
        if (st->key == K_NAME) {
            if (c != '"') return 1;
            st->sub = O_NAME;
            return gw_buf_add(&st->name, &c, 1);
        }
        if (st->key == K_ARGS) {
            st->sub = O_ARGS;
            st->args_seen = true;
            st->args_str = c == '"';
            if (c == '"')
                st->in_str = true;
            else if (c == '{' || c == '[')
                st->nest = 1;
            else
                st->nest = -1; /* a scalar */
            return args_byte(st, c);
        }
        st->sub = O_SKIP;
        if (c == '"')
            st->in_str = true;
        else if (c == '{' || c == '[')
            st->nest = 1;
        else
            st->nest = -1;
        return 0;
    case O_NAME: {
        int rc = gw_buf_add(&st->name, &c, 1);
        if (rc) return rc;
        if (st->esc)
            st->esc = false;
        else if (c == '\\')
            st->esc = true;
        else if (c == '"') {
            st->sub = O_AFTER_VAL;
            return call_start(st, k);
        }
        return 0;
    }
    case O_ARGS:
    case O_SKIP: {
        bool args = st->sub == O_ARGS;
        if (st->nest < 0) { /* a scalar ends at a delimiter, which is read after it */
            if (is_ws(c) || c == ',' || c == '}') {
                st->sub = O_AFTER_VAL;
                if (args) st->have_args = true;
                return obj_byte(st, c, k);
            }
            return args ? args_byte(st, c) : 0;
        }
        bool end = value_byte(st, c);
        int rc = args ? args_byte(st, c) : 0;
        if (end) {
            st->sub = O_AFTER_VAL;
            if (args) {
                st->have_args = true;
                if (st->args_str && st->started) {
                    rc = rc ? rc : args_decoded(st, &st->aout);
                    st->args.len = 0;
                }
            }
        }
        return rc;
    }
    case O_AFTER_VAL:
        if (is_ws(c)) return 0;
        if (c == ',') {
            st->sub = O_KEY_OR_END;
            return 0;
        }
        if (c == '}') return obj_end(st, k);
        return 1;
    }
    return 1;
}

/* Matches marker m byte by byte (its first byte occurs nowhere else in it): 1 when whole,
 * 0 while it may still be, -1 when c breaks it. */
static int match(gw_tool_state *st, const char *m, char c)
{
    if (c != m[st->mk]) return -1;
    st->mk++;
    if (!m[st->mk]) {
        st->mk = 0;
        return 1;
    }
    return 0;
}

/* A started v11+ call whose syntax broke before its arguments: it ends with arguments {}
 * and the rest of the text is content. */
static int mistral_cut(gw_tool_state *st, const gw_tool_sink *k)
{
    if (!st->have_args && kept(st) && gw_buf_adds(&st->aout, "{}")) return -ENOMEM;
    st->have_args = true;
    st->phase = PH_REST;
    return flush(st, k);
}

static int byte(gw_tool_state *st, char c, const gw_tool_sink *k)
{
    int rc;
    switch (st->phase) {
    case PH_START:
        if (is_ws(c)) return gw_buf_add(&st->held, &c, 1);
        if (c == '{') {
            if (gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
            obj_begin(st);
            return 0;
        }
        if (c == PYTHON_TAG[0]) {
            st->phase = PH_TAG;
            st->mk = 1;
            return gw_buf_add(&st->held, &c, 1);
        }
        return fail(st, c);
    case PH_TAG:
        rc = match(st, PYTHON_TAG, c);
        if (rc < 0) return fail(st, c);
        if (gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
        if (rc == 1) st->phase = PH_PRE;
        return 0;
    case PH_CONTENT: {
        const char *m = st->parser == GW_TOOLS_HERMES ? HERMES_OPEN : MISTRAL_OPEN;
        if (st->mk == 0 && c != m[0]) return add_content(st, &c, 1);
        rc = match(st, m, c);
        if (rc < 0) { /* not the marker: what was held is content, c is read again */
            if (add_content(st, st->held.p, st->held.len)) return -ENOMEM;
            st->held.len = 0;
            st->mk = 0;
            return byte(st, c, k);
        }
        if (gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
        if (rc == 1) {
            st->phase = PH_PRE;
            st->in_array = false;
        }
        return 0;
    }
    case PH_REST: return add_content(st, &c, 1);
    case PH_NAMED:
        if (!st->started && (rc = named_start(st, k))) return rc;
        return gw_buf_add(&st->aout, &c, 1);
    case PH_PRE:
        if (gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
        if (is_ws(c)) return 0;
        if (c == '{') {
            obj_begin(st);
            return 0;
        }
        if (c == '[' && (st->parser == GW_TOOLS_MISTRAL || st->parser == GW_TOOLS_JSON_LIST) &&
            !st->in_array) {
            st->in_array = true;
            return 0;
        }
        if (st->parser == GW_TOOLS_MISTRAL && !st->in_array && is_name_byte(c)) {
            obj_begin(st); /* the call's fields reset; its name written as a JSON string */
            st->phase = PH_MNAME;
            return gw_buf_add(&st->name, "\"", 1) || gw_buf_add(&st->name, &c, 1) ? -ENOMEM : 0;
        }
        st->held.len--;
        return fail(st, c);
    case PH_MNAME:
        if (is_name_byte(c) && st->name.len < 200) {
            if (gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
            return gw_buf_add(&st->name, &c, 1);
        }
        if (c != '[') return fail(st, c);
        if (gw_buf_add(&st->held, &c, 1) || gw_buf_add(&st->name, "\"", 1)) return -ENOMEM;
        st->phase = PH_MMARK;
        st->keyb.len = 0;
        return 0;
    case PH_MMARK:
        if (c != ']') {
            if (st->keyb.len >= 8 || ((c < 'A' || c > 'Z') && c != '_')) {
                if (!st->started) return fail(st, c);
                return (rc = mistral_cut(st, k)) ? rc : add_content(st, &c, 1);
            }
            if (!st->started && gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
            return gw_buf_add(&st->keyb, &c, 1);
        }
        if (!st->started && gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
        bool args = st->keyb.len == 4 && !memcmp(st->keyb.p, "ARGS", 4);
        bool call_id = st->keyb.len == 7 && !memcmp(st->keyb.p, "CALL_ID", 7) && !st->started;
        if (!args && !call_id) {
            if (st->started) return mistral_cut(st, k);
            st->held.len--;
            return fail(st, c);
        }
        /* the call starts at its first marker (streamed clients see the name at once) */
        if (!st->started && (rc = call_start(st, k))) {
            if (rc != 1) return rc;
            st->held.len--;
            return fail(st, c);
        }
        st->phase = call_id ? PH_MCALLID : PH_MARGS;
        st->args_seen = args;
        st->nest = 0;
        st->in_str = st->esc = false;
        return 0;
    case PH_MCALLID:
        if (c != '[') return 0; /* the id: not an OpenAI field (ours are made per call) */
        st->phase = PH_MMARK;
        st->keyb.len = 0;
        return 0;
    case PH_MARGS:
        if (st->nest == 0 && !st->in_str && is_ws(c)) return 0;
        if (st->nest == 0 && !st->in_str && c != '{') /* not an object: the call ends */
            return (rc = mistral_cut(st, k)) ? rc : add_content(st, &c, 1);
        bool end = value_byte(st, c);
        if ((rc = args_byte(st, c))) return rc;
        if (!end) return 0;
        st->have_args = true;
        if ((rc = flush(st, k))) return rc;
        st->phase = PH_CONTENT; /* a further [TOOL_CALLS] starts the next call */
        st->trim = true;
        st->mk = 0;
        st->held.len = 0;
        return 0;
    case PH_OBJ:
        if (!st->started && gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
        rc = obj_byte(st, c, k);
        if (rc == 1) {
            if (!st->started) st->held.len--;
            return fail(st, c);
        }
        return rc;
    case PH_CLOSE:
        if (st->mk == 0 && is_ws(c)) return 0;
        rc = match(st, HERMES_CLOSE, c);
        if (rc < 0) { /* no closing tag: content again (the tag's start with it) */
            size_t had = st->mk;
            st->mk = 0;
            st->phase = PH_CONTENT;
            st->trim = true;
            if (had && add_content(st, HERMES_CLOSE, had)) return -ENOMEM;
            return byte(st, c, k);
        }
        if (rc == 1) {
            st->phase = PH_CONTENT;
            st->trim = true;
        }
        return 0;
    case PH_AFTER:
        if (is_ws(c)) return 0;
        if ((c == ',' && st->in_array) || (c == ';' && st->parser == GW_TOOLS_LLAMA3_JSON)) {
            st->held.len = 0;
            if (gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
            st->phase = PH_PRE;
            return 0;
        }
        st->phase = PH_REST;
        st->trim = true;
        if (c == ']' && st->in_array) return 0;
        return add_content(st, &c, 1);
    }
    return 0;
}

int gw_tools_feed(gw_tool_state *st, const char *t, size_t n, bool final, const gw_tool_sink *sink)
{
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) rc = byte(st, t[i], sink);
    if (rc) return rc;
    if (final && st->phase == PH_NAMED) {
        if (!st->started && (rc = named_start(st, sink))) return rc;
        return flush(st, sink);
    }
    if (final) {
        /* what is held could still have been syntax: it is content after all, unless the
         * call it belongs to has started (then it is the call's, cut short) */
        bool open = st->phase == PH_START || st->phase == PH_TAG || st->phase == PH_CONTENT ||
                    st->phase == PH_PRE || st->phase == PH_MNAME ||
                    ((st->phase == PH_OBJ || st->phase == PH_MMARK) && !st->started);
        /* a v11+ call cut before or in its arguments: what it has, at least an object */
        if ((st->phase == PH_MCALLID || st->phase == PH_MMARK || st->phase == PH_MARGS) &&
            st->started && !st->have_args && !st->nest && gw_buf_adds(&st->aout, "{}"))
            return -ENOMEM;
        /* a constrained list cut short (max_tokens) has no content: the call it was
         * beginning is dropped */
        if (st->parser == GW_TOOLS_JSON_LIST) open = false;
        if (open && st->held.len && add_content(st, st->held.p, st->held.len)) return -ENOMEM;
        st->held.len = 0;
        if (st->phase == PH_OBJ && st->started && st->args.len && st->args_str)
            st->args.len = 0; /* a string cut short: not handed on */
        st->phase = PH_REST;
    }
    return flush(st, sink);
}

/* ---- whole answers ------------------------------------------------------------------ */
static int col_content(void *arg, const char *t, size_t n)
{
    gw_tool_calls *c = arg;
    return gw_buf_add(&c->content, t, n);
}

static int col_start(void *arg, int index, const char *name, size_t len)
{
    gw_tool_calls *c = arg;
    if (index != c->n) return -EINVAL;
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 4;
        gw_tool_call *v = realloc(c->v, (size_t)cap * sizeof *v);
        if (!v) return -ENOMEM;
        c->v = v;
        c->cap = cap;
    }
    gw_tool_call *tc = &c->v[c->n];
    memset(tc, 0, sizeof *tc);
    tc->name = strndup(name, len);
    if (!tc->name) return -ENOMEM;
    c->n++;
    return 0;
}

static int col_args(void *arg, int index, const char *t, size_t n)
{
    gw_tool_calls *c = arg;
    if (index < 0 || index >= c->n) return -EINVAL;
    return gw_buf_add(&c->v[index].args, t, n);
}

int gw_tools_parse_with(gw_tool_state *st, const char *text, size_t n, gw_tool_calls *out)
{
    memset(out, 0, sizeof *out);
    gw_tool_sink k = {col_content, col_start, col_args, out};
    int rc = gw_tools_feed(st, text, n, true, &k);
    if (rc) gw_tool_calls_free(out);
    return rc < 0 ? rc : rc ? -EINVAL : 0;
}

int gw_tools_parse(int parser, int max_calls, const char *text, size_t n, gw_tool_calls *out)
{
    gw_tool_state st;
    gw_tools_init(&st, parser, max_calls);
    int rc = gw_tools_parse_with(&st, text, n, out);
    gw_tools_free(&st);
    return rc;
}

void gw_tool_calls_free(gw_tool_calls *c)
{
    for (int i = 0; i < c->n; i++) {
        free(c->v[i].name);
        gw_buf_free(&c->v[i].args);
    }
    free(c->v);
    gw_buf_free(&c->content);
    memset(c, 0, sizeof *c);
}
