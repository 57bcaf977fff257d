/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_tools.h — a chat answer's tool calls, parsed out of the model's own syntax
 * (vLLM's --tool-call-parser and its names), whole and streamed:
 *
 *   hermes       <tool_call>{"name": N, "arguments": {...}}</tool_call>, any number, anywhere
 *                in the text (Hermes 2/3, Qwen 2.5/3: their chat templates spell it)
 *   llama3_json  the answer opens with {"name": N, "parameters": {...}} (optionally after
 *                <|python_tag|>), several separated by ';' (Llama 3.1/3.2/3.3)
 *   mistral      [TOOL_CALLS][{"name": N, "arguments": {...}}, ...] (Mistral 7B v0.3, Nemo,
 *                Large, Small)
 *   pythonic     the answer is a Python list of calls with keyword arguments,
 *                [get_weather(city="Paris", days=[1, 2]), now()] (optionally after
 *                <|python_start|>): Llama 3.2 and Llama 4 as vLLM's pythonic templates prompt
 *                them. Each call's arguments come back as the JSON object of its keywords
 *                (Python's strings, numbers, True/False/None, lists, tuples and dicts as
 *                JSON, written as Python's json.dumps writes them: ", " and ": ", non-ASCII
 *                as it is), handed on an argument at a time as each value is whole.
 *
 * Each call's "arguments" (or "parameters") comes back as the text the model wrote for the
 * value (a JSON object's text: OpenAI's `function.arguments` string), or, when the model wrote
 * a JSON string there, that string decoded. The text outside the calls is the answer's
 * content (the whitespace right after a call dropped).
 *
 * One state machine serves both ways, so a streamed answer's deltas join to exactly what the
 * whole answer says: text goes in as it is generated (any split), and out come content
 * pieces, a call's start (index, name) once its name is whole, and its arguments in pieces
 * as they arrive. Only the bytes that may still turn out to be a call's syntax are held back.
 * A call whose syntax breaks before its name is whole comes back as content; one that breaks
 * after that ends there (what was said of it stands), and the rest is content.
 *
 * Pure: no I/O, no globals.
 */
#ifndef RINGLM_GATEWAY_GW_TOOLS_H
#define RINGLM_GATEWAY_GW_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

#include "gateway/gw_text.h"

enum gw_tool_parser {
    GW_TOOLS_NONE = 0,
    GW_TOOLS_HERMES = 1,
    GW_TOOLS_LLAMA3_JSON = 2,
    GW_TOOLS_MISTRAL = 3,
    /* not a model's syntax: the answer is a JSON list of {"name", "parameters"} objects,
     * as the gateway constrains it for tool_choice "required" */
    GW_TOOLS_JSON_LIST = 4,
    /* the answer is the arguments of one call whose name is known (tool_choice naming a
     * function): gw_tools_init_named */
    GW_TOOLS_NAMED = 5,
    GW_TOOLS_PYTHONIC = 6,
};

/* By vLLM's name ("hermes", "llama3_json", "mistral", "pythonic"; "llama4_pythonic" is
 * pythonic too); -1 when unknown. */
int gw_tool_parser_by_name(const char *name);
/* Its name ("none" for GW_TOOLS_NONE). */
const char *gw_tool_parser_name(int parser);
/* The parser whose syntax a chat template's rendering of a tool call spells (the markers
 * <tool_call>, [TOOL_CALLS], <|python_tag|>, {"name": "<fn>" as Llama 3.1 writes a call, or
 * [<fn>( as a pythonic template does), GW_TOOLS_NONE when none. fn: the function name the
 * rendered call used. */
int gw_tool_parser_of_rendering(const char *text, const char *fn);
/* The parser of a model file's own chat template: the one whose syntax the template writes
 * for an assistant's tool call (rendered with a made-up tool and call); GW_TOOLS_NONE when
 * it writes none the parsers know, or cannot render one. */
struct ringlm_chat_jinja;
int gw_tool_parser_of_template(const struct ringlm_chat_jinja *t);
/* The parser of a built-in template (RINGLM_CHAT_*): chatml hermes, llama3 llama3_json,
 * mistral-v3/v3-tekken/v7 mistral, others none. */
int gw_tool_parser_of_builtin(int tpl);
/* The text of the special token that opens the parser's calls when the model's vocabulary
 * has it as a control token (which decodes to no text): "[TOOL_CALLS]", "<|python_tag|>",
 * "<|python_start|>"; NULL for hermes (its tags are text). */
const char *gw_tool_parser_marker(int parser);

/* What the parser finds, handed on as it goes. Each returns 0, or a negative errno to stop
 * (gw_tools_feed returns it). */
typedef struct gw_tool_sink {
    int (*content)(void *arg, const char *t, size_t n);
    int (*call_start)(void *arg, int index, const char *name, size_t name_len);
    int (*call_args)(void *arg, int index, const char *t, size_t n);
    void *arg;
} gw_tool_sink;

typedef struct gw_tool_state {
    int parser;
    int max_calls;     /* calls handed on (parallel_tool_calls false: 1); later ones dropped */
    int n_calls;       /* calls started so far */
    int phase;         /* private: where the text is */
    int sub;           /* private: where a call object is */
    size_t mk;         /* bytes of a marker matched */
    bool trim;         /* drop whitespace (right after a call) */
    bool in_array;     /* mistral: the calls are a JSON list */
    bool started;      /* this call's start was handed on */
    bool in_str, esc;  /* a JSON string in a value */
    int key;           /* the top-level key whose value is read */
    int nest;          /* nesting of the value being read */
    bool args_str;     /* the arguments value is a JSON string */
    bool have_args;    /* the arguments value was read whole */
    bool args_seen;    /* the arguments value has begun */
    char py_quote;     /* pythonic: the quote of the string a value is in (0: none) */
    int py_nargs;      /* pythonic: keyword arguments of this call handed on */
    gw_buf held;       /* text that may still be syntax (handed on as content if not) */
    gw_buf keyb, name; /* the key read; the name (as JSON string text, quotes included) */
    gw_buf args;       /* arguments not yet handed on (no name yet, or a JSON string) */
    gw_buf out;        /* content to hand on */
    gw_buf aout;       /* arguments to hand on */
} gw_tool_state;

/* A state for parser (not GW_TOOLS_NONE nor GW_TOOLS_NAMED); max_calls <= 0: no bound. */
void gw_tools_init(gw_tool_state *st, int parser, int max_calls);
/* A state for an answer that is the arguments of one call of function name (copied): the
 * call starts with the first byte, all of the text is its arguments. -ENOMEM or 0. */
int gw_tools_init_named(gw_tool_state *st, const char *name);
/* Takes the next n bytes of the answer (valid UTF-8; final: the answer ends after them).
 * Returns 0, the first error a sink function returned, or -ENOMEM. */
int gw_tools_feed(gw_tool_state *st, const char *t, size_t n, bool final, const gw_tool_sink *sink);
void gw_tools_free(gw_tool_state *st);

/* A whole answer's calls (a sink that collects). */
typedef struct gw_tool_call {
    char *name;
    gw_buf args;
} gw_tool_call;
typedef struct gw_tool_calls {
    gw_buf content;
    gw_tool_call *v;
    int n, cap;
} gw_tool_calls;
/* Parses text[0..n) whole into *out (free with gw_tool_calls_free): 0 or -ENOMEM. */
int gw_tools_parse(int parser, int max_calls, const char *text, size_t n, gw_tool_calls *out);
/* The same with a state made by gw_tools_init or gw_tools_init_named (fed nothing yet; the
 * caller frees it). */
int gw_tools_parse_with(gw_tool_state *st, const char *text, size_t n, gw_tool_calls *out);
void gw_tool_calls_free(gw_tool_calls *c);

#endif
