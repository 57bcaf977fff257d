/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_tools.c — tool calls out of a chat answer's text (see gw_tools.h). The text is
 * read a byte at a time through one state machine: the phases say where the text is
 * (content, a marker, a call object, between calls), the sub-states where a call object's
 * scan is (its top-level keys and values; nested values are only counted). The syntaxes
 * follow vLLM's parsers of the same names; mistral reads both of Mistral's forms, the JSON
 * list of tokenizers before v11 ([TOOL_CALLS] [{"name": ..., "arguments": ...}]) and the
 * name-then-arguments calls of v11 and later ([TOOL_CALLS]name[ARGS]{...}, v13 with
 * [CALL_ID]id between them). pythonic reads a Python list of keyword calls and writes each
 * call's keywords as a JSON object, a keyword at a time, as vLLM's pythonic parser does (it
 * evaluates the literals with Python's ast and writes them with json.dumps).
 */
#include "gateway/gw_tools.h"

#include "libclient/ringlm.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
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
    PH_PY_OPEN, /* pythonic: after <|python_start|>, whitespace then '[' */
    PH_PY_CALL, /* pythonic: after '[' or ',': whitespace, then a call's name */
    PH_PY_NAME, /* pythonic: the name, up to '(' */
    PH_PY_ARGS, /* pythonic: the keyword arguments, up to ')' (sub: enum py_sub) */
    PH_PY_AFTER /* pythonic: after a call: ',' and the next, or ']' */
};

enum sub { O_KEY_OR_END, O_KEY, O_COLON, O_VAL, O_NAME, O_ARGS, O_SKIP, O_AFTER_VAL };
enum key { K_OTHER, K_NAME, K_ARGS };
enum py_sub { A_KEY_OR_END, A_KEY, A_EQ, A_VAL0, A_VAL };

static const char HERMES_OPEN[] = "<tool_call>", HERMES_CLOSE[] = "</tool_call>",
                  MISTRAL_OPEN[] = "[TOOL_CALLS]", PYTHON_TAG[] = "<|python_tag|>",
                  PYTHON_START[] = "<|python_start|>";

int gw_tool_parser_by_name(const char *name)
{
    if (!name) return -1;
    if (!strcmp(name, "hermes")) return GW_TOOLS_HERMES;
    if (!strcmp(name, "llama3_json")) return GW_TOOLS_LLAMA3_JSON;
    if (!strcmp(name, "mistral")) return GW_TOOLS_MISTRAL;
    if (!strcmp(name, "pythonic") || !strcmp(name, "llama4_pythonic")) return GW_TOOLS_PYTHONIC;
    return -1;
}

const char *gw_tool_parser_name(int parser)
{
    switch (parser) {
    case GW_TOOLS_HERMES: return "hermes";
    case GW_TOOLS_LLAMA3_JSON: return "llama3_json";
    case GW_TOOLS_MISTRAL: return "mistral";
    case GW_TOOLS_PYTHONIC: return "pythonic";
    default: return "none";
    }
}

const char *gw_tool_parser_marker(int parser)
{
    switch (parser) {
    case GW_TOOLS_LLAMA3_JSON: return PYTHON_TAG;
    case GW_TOOLS_MISTRAL: return MISTRAL_OPEN;
    case GW_TOOLS_PYTHONIC: return PYTHON_START;
    default: return NULL;
    }
}

int gw_tool_parser_of_rendering(const char *text, const char *fn)
{
    if (!text) return GW_TOOLS_NONE;
    if (strstr(text, HERMES_OPEN)) return GW_TOOLS_HERMES;
    if (strstr(text, MISTRAL_OPEN)) return GW_TOOLS_MISTRAL;
    char call[160];
    if (fn && strlen(fn) < 100) { /* a list of Python calls */
        snprintf(call, sizeof call, "[%s(", fn);
        if (strstr(text, call)) return GW_TOOLS_PYTHONIC;
    }
    if (strstr(text, PYTHON_TAG)) return GW_TOOLS_LLAMA3_JSON;
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
    st->phase = parser == GW_TOOLS_LLAMA3_JSON || parser == GW_TOOLS_PYTHONIC ? PH_START
                : parser == GW_TOOLS_JSON_LIST                                ? PH_PRE
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

/* ---- pythonic: Python literals as JSON ------------------------------------------------ */

static bool is_ident_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_ident_byte(char c)
{
    return is_ident_start(c) || (c >= '0' && c <= '9');
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static void py_ws(const char **p, const char *e)
{
    while (*p < e && is_ws(**p)) (*p)++;
}

/* Code point cp into a JSON string as json.dumps(ensure_ascii=False) writes it. 0, 1 (not a
 * character), -ENOMEM. */
static int json_cp(gw_buf *o, uint32_t cp)
{
    char b[8];
    size_t n = 0;
    switch (cp) {
    case '"': return gw_buf_adds(o, "\\\"");
    case '\\': return gw_buf_adds(o, "\\\\");
    case '\n': return gw_buf_adds(o, "\\n");
    case '\r': return gw_buf_adds(o, "\\r");
    case '\t': return gw_buf_adds(o, "\\t");
    case '\b': return gw_buf_adds(o, "\\b");
    case '\f': return gw_buf_adds(o, "\\f");
    }
    if (cp < 0x20) {
        snprintf(b, sizeof b, "\\u%04x", (unsigned)cp);
        return gw_buf_adds(o, b);
    }
    if ((cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) return 1;
    if (cp < 0x80) {
        b[n++] = (char)cp;
    } else if (cp < 0x800) {
        b[n++] = (char)(0xc0 | cp >> 6);
        b[n++] = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        b[n++] = (char)(0xe0 | cp >> 12);
        b[n++] = (char)(0x80 | (cp >> 6 & 0x3f));
        b[n++] = (char)(0x80 | (cp & 0x3f));
    } else {
        b[n++] = (char)(0xf0 | cp >> 18);
        b[n++] = (char)(0x80 | (cp >> 12 & 0x3f));
        b[n++] = (char)(0x80 | (cp >> 6 & 0x3f));
        b[n++] = (char)(0x80 | (cp & 0x3f));
    }
    return gw_buf_add(o, b, n);
}

/* n digits of base 16 (or 8, at most n) at *p as a number; -1 when there are too few. */
static long py_digits(const char **p, const char *e, int n, int base)
{
    long v = 0;
    int k = 0;
    for (; k < n && *p < e; k++, (*p)++) {
        char c = **p;
        int d = is_digit(c)                              ? c - '0'
                : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10
                                                         : 99;
        if (d >= base) break;
        v = v * base + d;
    }
    return base == 8 ? (k ? v : -1) : (k == n ? v : -1);
}

/* A Python string literal ('...' or "...", no prefix, not triple-quoted) as a JSON string. */
static int py_string(const char **p, const char *e, gw_buf *o)
{
    char q = **p;
    const char *s = *p + 1;
    int rc = gw_buf_add(o, "\"", 1);
    while (!rc && s < e && *s != q) {
        unsigned char c = (unsigned char)*s++;
        if (c == '\n' || c == '\r') return 1; /* a line break ends no such string */
        if (c != '\\') {
            rc = c < 0x80 ? json_cp(o, c) : gw_buf_add(o, &c, 1); /* UTF-8 as it is */
            continue;
        }
        if (s >= e) return 1;
        char x = *s++;
        long cp;
        switch (x) {
        case 'n': cp = '\n'; break;
        case 't': cp = '\t'; break;
        case 'r': cp = '\r'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'v': cp = '\v'; break;
        case 'a': cp = '\a'; break;
        case '\\':
        case '\'':
        case '"': cp = (unsigned char)x; break;
        case '\n': continue; /* a continued line */
        case 'x': cp = py_digits(&s, e, 2, 16); break;
        case 'u': cp = py_digits(&s, e, 4, 16); break;
        case 'U': cp = py_digits(&s, e, 8, 16); break;
        default:
            if (x >= '0' && x <= '7') {
                s--;
                cp = py_digits(&s, e, 3, 8);
                break;
            }
            /* an escape Python does not know keeps its backslash */
            rc = json_cp(o, '\\');
            s--;
            continue;
        }
        if (cp < 0) return 1;
        rc = json_cp(o, (uint32_t)cp);
    }
    if (rc) return rc;
    if (s >= e) return 1;
    *p = s + 1;
    return gw_buf_add(o, "\"", 1);
}

/* A Python int or float literal (signed) as a JSON number: underscores dropped, leading
 * zeros dropped, "1." and ".5" completed to "1.0" and "0.5". */
static int py_number(const char **p, const char *e, gw_buf *o)
{
    const char *s = *p;
    char b[128];
    size_t n = 0;
    if (s < e && (*s == '-' || *s == '+')) {
        if (*s == '-') b[n++] = '-';
        s++;
        py_ws(&s, e);
    }
    size_t int_at = n;
    bool digits = false;
    while (s < e && (is_digit(*s) || (*s == '_' && digits))) {
        if (*s != '_') {
            if (n >= 100) return 1;
            if (!(n == int_at + 1 && b[int_at] == '0')) n++; /* a leading zero is replaced */
            b[n - 1] = *s;
            digits = true;
        }
        s++;
    }
    if (s < e && *s == '.') {
        if (!digits) b[n++] = '0';
        b[n++] = '.';
        s++;
        bool frac = false;
        while (s < e && n < 120 && (is_digit(*s) || (*s == '_' && frac))) {
            if (*s != '_') {
                b[n++] = *s;
                frac = true;
            }
            s++;
        }
        if (!frac && !digits) return 1;
        if (!frac) b[n++] = '0';
        digits = true;
    }
    if (!digits) return 1;
    if (s < e && (*s == 'e' || *s == 'E')) {
        b[n++] = 'e';
        s++;
        if (s < e && (*s == '-' || *s == '+')) b[n++] = *s++;
        bool exp = false;
        while (s < e && n < 126 && is_digit(*s)) {
            b[n++] = *s++;
            exp = true;
        }
        if (!exp) return 1;
    }
    if (s < e && (is_ident_byte(*s) || *s == '.')) return 1; /* 0x1f, 1j, 1.2.3 */
    *p = s;
    return gw_buf_add(o, b, n);
}

/* A Python literal — a string, a number, True/False/None, a list, a tuple, a dict with string
 * or number keys — as JSON. 0, 1 (not such a literal), -ENOMEM. */
static int py_value(const char **p, const char *e, gw_buf *o, int depth)
{
    py_ws(p, e);
    if (*p >= e || depth > 64) return 1;
    char c = **p;
    if (c == '\'' || c == '"') return py_string(p, e, o);
    if (c == '[' || c == '(' || c == '{') {
        char close = c == '[' ? ']' : c == '(' ? ')' : '}';
        bool dict = c == '{';
        (*p)++;
        int rc = gw_buf_add(o, dict ? "{" : "[", 1);
        for (int n = 0; !rc; n++) {
            py_ws(p, e);
            if (*p >= e) return 1;
            if (**p == close) break;
            if (n) { /* a comma, which may also close the list */
                if (**p != ',') return 1;
                (*p)++;
                py_ws(p, e);
                if (*p < e && **p == close) break;
                if ((rc = gw_buf_adds(o, ", "))) return rc;
            }
            if (dict) {
                py_ws(p, e);
                if (*p >= e) return 1;
                if (**p == '\'' || **p == '"') {
                    rc = py_string(p, e, o);
                } else {
                    rc = gw_buf_add(o, "\"", 1);
                    if (!rc) rc = py_number(p, e, o);
                    if (!rc) rc = gw_buf_add(o, "\"", 1);
                }
                if (rc) return rc;
                py_ws(p, e);
                if (*p >= e || **p != ':') return 1;
                (*p)++;
                if ((rc = gw_buf_adds(o, ": "))) return rc;
            }
            rc = py_value(p, e, o, depth + 1);
        }
        if (rc) return rc;
        (*p)++;
        return gw_buf_add(o, dict ? "}" : "]", 1);
    }
    if (is_ident_start(c)) {
        const char *w = *p;
        while (*p < e && is_ident_byte(**p)) (*p)++;
        size_t l = (size_t)(*p - w);
        if (l == 4 && !memcmp(w, "True", 4)) return gw_buf_adds(o, "true");
        if (l == 5 && !memcmp(w, "False", 5)) return gw_buf_adds(o, "false");
        if (l == 4 && !memcmp(w, "None", 4)) return gw_buf_adds(o, "null");
        return 1; /* a name: not a literal */
    }
    return py_number(p, e, o);
}

/* The call starts once its first keyword's value is a literal (or at its ')' without one):
 * text that only looks like a call up to there stays content. */
static int py_start(gw_tool_state *st, const gw_tool_sink *k)
{
    if (st->started) return 0;
    int rc = call_start(st, k);
    if (rc) return rc;
    return kept(st) && gw_buf_adds(&st->aout, "{") ? -ENOMEM : 0;
}

/* The current call's object is closed: '}' after the arguments handed on. */
static int py_call_end(gw_tool_state *st, const gw_tool_sink *k)
{
    int rc = py_start(st, k);
    if (rc) return rc;
    if (kept(st) && gw_buf_adds(&st->aout, "}")) return -ENOMEM;
    st->have_args = true;
    st->phase = PH_PY_AFTER;
    return flush(st, k);
}

/* A keyword's value is whole (in st->args): "key": value handed on. 1 when it is not a
 * literal. */
static int py_arg_end(gw_tool_state *st, const gw_tool_sink *k)
{
    gw_buf v = {0};
    const char *p = st->args.p ? st->args.p : "", *e = p + st->args.len;
    int rc = py_value(&p, e, &v, 0);
    py_ws(&p, e);
    if (!rc && p != e) rc = 1;
    st->args.len = 0; /* the Python text: not the arguments call_start would hand on */
    if (!rc) rc = py_start(st, k);
    if (!rc && kept(st))
        rc = gw_buf_adds(&st->aout, st->py_nargs ? ", \"" : "\"") ||
                     gw_buf_add(&st->aout, st->keyb.p, st->keyb.len) ||
                     gw_buf_adds(&st->aout, "\": ") || gw_buf_add(&st->aout, v.p, v.len)
                 ? -ENOMEM
                 : 0;
    gw_buf_free(&v);
    st->py_nargs++;
    return rc ? rc : flush(st, k);
}

/* One byte of a call's keyword arguments. 0, 1 (the syntax broke), or a sink's / -ENOMEM. */
static int py_arg_byte(gw_tool_state *st, char c, const gw_tool_sink *k)
{
    switch (st->sub) {
    case A_KEY_OR_END:
        if (is_ws(c)) return 0;
        if (c == ')') return py_call_end(st, k);
        if (!is_ident_start(c)) return 1; /* a positional argument: not a tool call */
        st->keyb.len = 0;
        st->sub = A_KEY;
        return gw_buf_add(&st->keyb, &c, 1);
    case A_KEY:
        if (is_ident_byte(c)) return st->keyb.len < 200 ? gw_buf_add(&st->keyb, &c, 1) : 1;
        if (is_ws(c)) {
            st->sub = A_EQ;
            return 0;
        }
        if (c != '=') return 1;
        st->sub = A_VAL0;
        return 0;
    case A_EQ:
        if (is_ws(c)) return 0;
        if (c != '=') return 1;
        st->sub = A_VAL0;
        return 0;
    case A_VAL0:
        if (is_ws(c)) return 0;
        st->args.len = 0;
        st->nest = 0;
        st->py_quote = 0;
        st->esc = false;
        st->sub = A_VAL;
        return py_arg_byte(st, c, k); /* c is the value's first byte */
    case A_VAL:
        if (st->py_quote) {
            if (st->esc)
                st->esc = false;
            else if (c == '\\')
                st->esc = true;
            else if (c == st->py_quote)
                st->py_quote = 0;
            return gw_buf_add(&st->args, &c, 1);
        }
        if (st->nest == 0 && (c == ',' || c == ')')) {
            int rc = py_arg_end(st, k);
            if (rc) return rc;
            if (c == ')') return py_call_end(st, k);
            st->sub = A_KEY_OR_END;
            return 0;
        }
        if (c == '\'' || c == '"')
            st->py_quote = c;
        else if (c == '(' || c == '[' || c == '{')
            st->nest++;
        else if ((c == ')' || c == ']' || c == '}') && --st->nest < 0)
            return 1;
        return gw_buf_add(&st->args, &c, 1);
    }
    return 1;
}

/* A started call whose syntax broke: it ends with the arguments handed on so far, and the
 * rest of the text is content. */
static int py_cut(gw_tool_state *st, const gw_tool_sink *k)
{
    if (kept(st) && gw_buf_adds(&st->aout, "}")) return -ENOMEM;
    st->have_args = true;
    st->args.len = 0;
    st->phase = PH_REST;
    st->trim = false;
    return flush(st, k);
}

static int byte(gw_tool_state *st, char c, const gw_tool_sink *k)
{
    int rc;
    switch (st->phase) {
    case PH_START: {
        bool py = st->parser == GW_TOOLS_PYTHONIC;
        if (is_ws(c)) return gw_buf_add(&st->held, &c, 1);
        if (c == (py ? '[' : '{')) {
            if (gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
            if (py)
                st->phase = PH_PY_CALL;
            else
                obj_begin(st);
            return 0;
        }
        if (c == PYTHON_TAG[0]) { /* <|python_tag|> (llama3_json), <|python_start|> (pythonic) */
            st->phase = PH_TAG;
            st->mk = 1;
            return gw_buf_add(&st->held, &c, 1);
        }
        return fail(st, c);
    }
    case PH_TAG: {
        bool py = st->parser == GW_TOOLS_PYTHONIC;
        rc = match(st, py ? PYTHON_START : PYTHON_TAG, c);
        if (rc < 0) return fail(st, c);
        if (gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
        if (rc == 1) st->phase = py ? PH_PY_OPEN : PH_PRE;
        return 0;
    }
    case PH_PY_OPEN:
        if (gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
        if (is_ws(c)) return 0;
        if (c == '[') {
            st->phase = PH_PY_CALL;
            return 0;
        }
        st->held.len--;
        return fail(st, c);
    case PH_PY_CALL:
        if (gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
        if (is_ws(c)) return 0;
        if (is_ident_start(c)) {
            obj_begin(st); /* the call's fields reset; its name written as a JSON string */
            st->phase = PH_PY_NAME;
            return gw_buf_add(&st->name, "\"", 1) || gw_buf_add(&st->name, &c, 1) ? -ENOMEM : 0;
        }
        st->held.len--;
        return fail(st, c);
    case PH_PY_NAME:
        if (is_ident_byte(c) && st->name.len < 200) {
            if (gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
            return gw_buf_add(&st->name, &c, 1);
        }
        if (c != '(') return fail(st, c);
        if (gw_buf_add(&st->held, &c, 1) || gw_buf_add(&st->name, "\"", 1)) return -ENOMEM;
        st->phase = PH_PY_ARGS;
        st->sub = A_KEY_OR_END;
        st->py_nargs = 0;
        return 0;
    case PH_PY_ARGS:
        if (!st->started && gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
        rc = py_arg_byte(st, c, k);
        if (rc != 1) return rc;
        if (!st->started) {
            st->held.len--;
            return fail(st, c);
        }
        return (rc = py_cut(st, k)) ? rc : add_content(st, &c, 1);
    case PH_PY_AFTER:
        if (is_ws(c)) return 0;
        if (c == ',') { /* the next call: content again if it is none */
            st->held.len = 0;
            st->started = false;
            if (gw_buf_add(&st->held, &c, 1)) return -ENOMEM;
            st->phase = PH_PY_CALL;
            return 0;
        }
        st->phase = PH_REST;
        st->trim = true;
        if (c == ']') return 0;
        return add_content(st, &c, 1);
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
                    st->phase == PH_PRE || st->phase == PH_MNAME || st->phase == PH_PY_OPEN ||
                    st->phase == PH_PY_CALL || st->phase == PH_PY_NAME ||
                    (st->phase == PH_PY_ARGS && !st->started) ||
                    ((st->phase == PH_OBJ || st->phase == PH_MMARK) && !st->started);
        /* a v11+ call cut before or in its arguments: what it has, at least an object */
        if ((st->phase == PH_MCALLID || st->phase == PH_MMARK || st->phase == PH_MARGS) &&
            st->started && !st->have_args && !st->nest && gw_buf_adds(&st->aout, "{}"))
            return -ENOMEM;
        /* a pythonic call cut short: the keywords whole so far, a value cut short dropped */
        if (st->phase == PH_PY_ARGS && st->started && kept(st) && gw_buf_adds(&st->aout, "}"))
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
