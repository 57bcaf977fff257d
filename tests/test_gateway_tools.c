/* SPDX-License-Identifier: MIT */
/*
 * The gateway's tool-call parsers (gateway/gw_tools.h): Hermes/Qwen <tool_call> tags, Llama 3
 * JSON, Mistral [TOOL_CALLS] lists and name[ARGS] calls, Llama 3.2/4 pythonic lists of calls
 * (their Python literals as JSON) parsed out of an answer whole, and streamed in every split
 * of the text (each byte apart, and pieces of 1..7 bytes) to exactly the same content, names
 * and arguments; text that only looks like a call stays content.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gw_params.h"
#include "gateway/gw_tools.h"
#include "libclient/ringlm.h"

/* A stream's events joined: content, and per call its name and its arguments' pieces. */
typedef struct joined {
    gw_buf content;
    char names[8][64];
    gw_buf args[8];
    int n, starts;
    bool order_ok; /* arguments only for the last call started */
} joined;

static int j_content(void *arg, const char *t, size_t n)
{
    joined *j = arg;
    return gw_buf_add(&j->content, t, n);
}

static int j_start(void *arg, int index, const char *name, size_t len)
{
    joined *j = arg;
    if (index != j->n || index >= 8) j->order_ok = false;
    if (index >= 8) return -EINVAL;
    snprintf(j->names[index], sizeof j->names[index], "%.*s", (int)len, name);
    j->n = index + 1;
    j->starts++;
    return 0;
}

static int j_args(void *arg, int index, const char *t, size_t n)
{
    joined *j = arg;
    if (index != j->n - 1) j->order_ok = false;
    if (index < 0 || index >= 8) return -EINVAL;
    return gw_buf_add(&j->args[index], t, n);
}

static void j_free(joined *j)
{
    gw_buf_free(&j->content);
    for (int i = 0; i < 8; i++) gw_buf_free(&j->args[i]);
}

/* Streams text in pieces of step bytes (0: the whole at once) and joins what comes out. */
static void stream(int parser, int max_calls, const char *text, size_t step, joined *j)
{
    memset(j, 0, sizeof *j);
    j->order_ok = true;
    gw_tool_state st;
    gw_tools_init(&st, parser, max_calls);
    gw_tool_sink k = {j_content, j_start, j_args, j};
    size_t n = strlen(text), at = 0;
    if (!step) step = n ? n : 1;
    do {
        size_t take = n - at < step ? n - at : step;
        cr_assert_eq(gw_tools_feed(&st, text + at, take, at + take == n, &k), 0);
        at += take;
    } while (at < n);
    gw_tools_free(&st);
}

typedef struct want {
    const char *content; /* NULL: none */
    int n;
    const char *name[3], *args[3];
} want;

/* The whole parse gives w, and so does every split of the stream. */
static void check(int parser, int max_calls, const char *text, const want *w)
{
    gw_tool_calls c;
    cr_assert_eq(gw_tools_parse(parser, max_calls, text, strlen(text), &c), 0);
    cr_assert_str_eq(c.content.p ? c.content.p : "", w->content ? w->content : "", "%s", text);
    cr_assert_eq(c.n, w->n, "%s: %d calls", text, c.n);
    for (int i = 0; i < w->n; i++) {
        cr_assert_str_eq(c.v[i].name, w->name[i], "%s", text);
        cr_assert_str_eq(c.v[i].args.p ? c.v[i].args.p : "", w->args[i], "%s", text);
    }
    gw_tool_calls_free(&c);
    for (size_t step = 1; step <= 8; step++) {
        joined j;
        stream(parser, max_calls, text, step == 8 ? 0 : step, &j);
        cr_assert(j.order_ok, "%s in pieces of %zu", text, step);
        cr_assert_str_eq(j.content.p ? j.content.p : "", w->content ? w->content : "",
                         "%s in pieces of %zu", text, step);
        cr_assert_eq(j.n, w->n, "%s in pieces of %zu: %d calls", text, step, j.n);
        cr_assert_eq(j.starts, w->n);
        for (int i = 0; i < w->n; i++) {
            cr_assert_str_eq(j.names[i], w->name[i]);
            cr_assert_str_eq(j.args[i].p ? j.args[i].p : "", w->args[i], "%s in pieces of %zu",
                             text, step);
        }
        j_free(&j);
    }
}

Test(gateway_tools, hermes_calls_are_parsed_out_of_the_text)
{
    check(GW_TOOLS_HERMES, 0,
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
          "\"days\": [1, 2]}}\n</tool_call>",
          &(want){NULL, 1, {"get_weather"}, {"{\"city\": \"Paris\", \"days\": [1, 2]}"}});
    /* content before, two calls, the whitespace between dropped */
    check(GW_TOOLS_HERMES, 0,
          "Let me look.<tool_call>{\"name\":\"a\",\"arguments\":{\"s\":\"}<tool_call>\\\"\"}}"
          "</tool_call>\n<tool_call>{\"arguments\": {}, \"name\": \"b\"}</tool_call>",
          &(want){"Let me look.", 2, {"a", "b"}, {"{\"s\":\"}<tool_call>\\\"\"}", "{}"}});
    /* no arguments: {}; arguments written as a JSON string: decoded */
    check(GW_TOOLS_HERMES, 0,
          "<tool_call>{\"name\": \"now\"}</tool_call><tool_call>{\"name\": \"x\", \"arguments\": "
          "\"{\\\"a\\\": 1}\"}</tool_call>",
          &(want){NULL, 2, {"now", "x"}, {"{}", "{\"a\": 1}"}});
    /* a name with an escape */
    check(GW_TOOLS_HERMES, 0, "<tool_call>{\"name\": \"caf\\u00e9\", \"arguments\": {}}",
          &(want){NULL, 1, {"caf\xc3\xa9"}, {"{}"}});
}

Test(gateway_tools, hermes_text_that_is_not_a_call_stays_content)
{
    check(GW_TOOLS_HERMES, 0, "Once upon a time <tool <tool_cal> and a <b>",
          &(want){"Once upon a time <tool <tool_cal> and a <b>", 0, {0}, {0}});
    /* the marker, then no object */
    check(GW_TOOLS_HERMES, 0, "a<tool_call>hello", &(want){"a<tool_call>hello", 0, {0}, {0}});
    /* an object without a name */
    check(GW_TOOLS_HERMES, 0, "<tool_call>{\"arguments\": {}}</tool_call>",
          &(want){"<tool_call>{\"arguments\": {}}</tool_call>", 0, {0}, {0}});
    /* a marker cut short at the end */
    check(GW_TOOLS_HERMES, 0, "the end <tool_c", &(want){"the end <tool_c", 0, {0}, {0}});
    /* text after a call is content */
    check(GW_TOOLS_HERMES, 0,
          "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>\n\nDone.",
          &(want){"Done.", 1, {"f"}, {"{\"x\": 1}"}});
}

Test(gateway_tools, llama3_json_calls_open_the_answer)
{
    check(GW_TOOLS_LLAMA3_JSON, 0,
          "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
          &(want){NULL, 1, {"get_weather"}, {"{\"city\": \"Oslo\"}"}});
    check(GW_TOOLS_LLAMA3_JSON, 0,
          "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"n\": -1.5e3}}; {\"name\": \"b\", "
          "\"parameters\": {\"t\": true}}",
          &(want){NULL, 2, {"a", "b"}, {"{\"n\": -1.5e3}", "{\"t\": true}"}});
    /* prose, or JSON that is not a call, is content */
    check(GW_TOOLS_LLAMA3_JSON, 0, "The answer is {\"name\": \"x\"}",
          &(want){"The answer is {\"name\": \"x\"}", 0, {0}, {0}});
    check(GW_TOOLS_LLAMA3_JSON, 0, "  {\"city\": \"Oslo\"}",
          &(want){"  {\"city\": \"Oslo\"}", 0, {0}, {0}});
    check(GW_TOOLS_LLAMA3_JSON, 0, "<|python_tag|>print(1)",
          &(want){"<|python_tag|>print(1)", 0, {0}, {0}});
}

Test(gateway_tools, mistral_tool_calls_are_a_list_after_the_marker)
{
    check(GW_TOOLS_MISTRAL, 0,
          "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, "
          "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]",
          &(want){
              NULL, 2, {"get_weather", "get_time"}, {"{\"city\": \"Rome\"}", "{\"tz\": \"CET\"}"}});
    check(GW_TOOLS_MISTRAL, 0, "Sure. [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]",
          &(want){"Sure. ", 1, {"f"}, {"{}"}});
    check(GW_TOOLS_MISTRAL, 0, "[TOOL] calls [x]", &(want){"[TOOL] calls [x]", 0, {0}, {0}});
}

/* Mistral's tokenizers from v11 (Mistral Small 3.1 and later) write each call as
 * [TOOL_CALLS]name[ARGS]{...}; v13 puts [CALL_ID]id between the name and [ARGS]. */
Test(gateway_tools, mistral_v11_calls_are_a_name_then_its_arguments)
{
    check(GW_TOOLS_MISTRAL, 0, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\", \"d\": [1]}",
          &(want){NULL, 1, {"get_weather"}, {"{\"city\": \"Rome\", \"d\": [1]}"}});
    /* two calls, content before them, a brace inside a string */
    check(GW_TOOLS_MISTRAL, 0,
          "Checking. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"}{\"}[TOOL_CALLS]get_time[ARGS]"
          "{\"tz\": \"CET\"}",
          &(want){"Checking. ",
                  2,
                  {"get_weather", "get_time"},
                  {"{\"city\": \"}{\"}", "{\"tz\": \"CET\"}"}});
    /* v13: the call id is read past */
    check(GW_TOOLS_MISTRAL, 0, "[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e[ARGS]{}",
          &(want){NULL, 1, {"get_time"}, {"{}"}});
    /* arguments cut short (max_tokens): what there is */
    check(GW_TOOLS_MISTRAL, 0, "[TOOL_CALLS]f[ARGS]{\"a\": 1",
          &(want){NULL, 1, {"f"}, {"{\"a\": 1"}});
    /* a name with no marker after it, or a marker that is not one: content */
    check(GW_TOOLS_MISTRAL, 0, "[TOOL_CALLS]hello world",
          &(want){"[TOOL_CALLS]hello world", 0, {0}, {0}});
    check(GW_TOOLS_MISTRAL, 0, "[TOOL_CALLS]f[ARG]{}",
          &(want){"[TOOL_CALLS]f[ARG]{}", 0, {0}, {0}});
    check(GW_TOOLS_MISTRAL, 0, "[TOOL_CALLS]f", &(want){"[TOOL_CALLS]f", 0, {0}, {0}});
    /* parallel_tool_calls false: the first call only */
    check(GW_TOOLS_MISTRAL, 1, "[TOOL_CALLS]a[ARGS]{\"i\": 1}[TOOL_CALLS]b[ARGS]{\"i\": 2}",
          &(want){NULL, 1, {"a"}, {"{\"i\": 1}"}});
}

/* Llama 3.2 / Llama 4: the answer is a Python list of calls with keyword arguments; each
 * call's keywords come back as a JSON object, written as Python's json.dumps writes it. */
Test(gateway_tools, pythonic_calls_are_a_python_list_of_keyword_calls)
{
    check(GW_TOOLS_PYTHONIC, 0, "[get_weather(city=\"Paris\", days=[1, 2])]",
          &(want){NULL, 1, {"get_weather"}, {"{\"city\": \"Paris\", \"days\": [1, 2]}"}});
    /* two calls, single quotes, no arguments, whitespace anywhere Python allows it */
    check(GW_TOOLS_PYTHONIC, 0, "  [ get_weather(city = 'Oslo' ) ,now( ),f(x=1,)]",
          &(want){
              NULL, 3, {"get_weather", "now", "f"}, {"{\"city\": \"Oslo\"}", "{}", "{\"x\": 1}"}});
    /* Python's literals: escapes, numbers, True/False/None, lists, tuples, dicts */
    check(GW_TOOLS_PYTHONIC, 0,
          "[f(s='it\\'s \"x\"\\n\\t\\u00e9\\x41\\\\', n=-1.5e3, i=007, big=1_000, e=.5, d=2., "
          "t=True, u=False, z=None, l=[1, 'a', (2, 3), ()], m={'k': {\"n\": [None]}, 1: 2,})]",
          &(want){NULL,
                  1,
                  {"f"},
                  {"{\"s\": \"it's \\\"x\\\"\\n\\t\xc3\xa9"
                   "A\\\\\", \"n\": -1.5e3, \"i\": 7, "
                   "\"big\": 1000, \"e\": 0.5, \"d\": 2.0, \"t\": true, \"u\": false, \"z\": null, "
                   "\"l\": [1, \"a\", [2, 3], []], \"m\": {\"k\": {\"n\": [null]}, \"1\": 2}}"}});
    /* non-ASCII text as it is; a comma or a parenthesis inside a string or a list */
    check(GW_TOOLS_PYTHONIC, 0, "[f(city=\"Z\xc3\xbcrich, (CH)\", l=[\")\", \",\"])]",
          &(want){NULL, 1, {"f"}, {"{\"city\": \"Z\xc3\xbcrich, (CH)\", \"l\": [\")\", \",\"]}"}});
    /* Llama 4 opens with <|python_start|>; text after the list is content */
    check(GW_TOOLS_PYTHONIC, 0, "<|python_start|>[f(a=1)]\n\nDone.",
          &(want){"Done.", 1, {"f"}, {"{\"a\": 1}"}});
    /* parallel_tool_calls false: the first call only */
    check(GW_TOOLS_PYTHONIC, 1, "[a(i=1), b(i=2)]", &(want){NULL, 1, {"a"}, {"{\"i\": 1}"}});
}

Test(gateway_tools, pythonic_text_that_is_not_a_call_stays_content)
{
    static const char *const prose[] = {
        "The answer is [f(x=1)]", /* not opening the answer */
        "[Hello world]",          /* no call */
        "[1, 2, 3]",
        "[]",
        "[f(1, 2)]", /* positional arguments: not a tool call */
        "[f(x=y)]",  /* a name, not a literal */
        "[f(x=1 2)]",
        "[f(x='a' 'b')]", /* no concatenation of literals */
        "[f(x=0x1f)]",
        "[f(x=\"open)]", /* cut short before its first value is whole */
        "[f(x",
        "<|python_start|>print(1)",
    };
    for (size_t i = 0; i < sizeof prose / sizeof *prose; i++)
        check(GW_TOOLS_PYTHONIC, 0, prose[i], &(want){prose[i], 0, {0}, {0}});
    /* a call whose syntax breaks after its first keyword ends there; the rest is content */
    check(GW_TOOLS_PYTHONIC, 0, "[f(a=1, b=oops), g()]",
          &(want){"), g()]", 1, {"f"}, {"{\"a\": 1}"}});
    /* a second call that is none: content after the first */
    check(GW_TOOLS_PYTHONIC, 0, "[f(a=1), 42]", &(want){", 42]", 1, {"f"}, {"{\"a\": 1}"}});
    /* cut short (max_tokens) after a whole keyword: what there is, as an object */
    check(GW_TOOLS_PYTHONIC, 0, "[f(a=1, b=[2", &(want){NULL, 1, {"f"}, {"{\"a\": 1}"}});
}

Test(gateway_tools, parallel_tool_calls_false_keeps_the_first_call)
{
    check(
        GW_TOOLS_HERMES, 1,
        "<tool_call>{\"name\": \"a\", \"arguments\": {\"i\": 1}}</tool_call><tool_call>{\"name\": "
        "\"b\", \"arguments\": {\"i\": 2}}</tool_call>",
        &(want){NULL, 1, {"a"}, {"{\"i\": 1}"}});
}

/* The arguments come out as they arrive, not at the end of the call: a client sees them
 * grow (what OpenAI's streamed deltas are for). */
Test(gateway_tools, streamed_arguments_are_handed_on_before_the_call_ends)
{
    joined j = {0};
    j.order_ok = true;
    gw_tool_state st;
    gw_tools_init(&st, GW_TOOLS_HERMES, 0);
    gw_tool_sink k = {j_content, j_start, j_args, &j};
    const char *a = "<tool_call>{\"name\": \"f\", \"arguments\": {\"text\": \"abc";
    cr_assert_eq(gw_tools_feed(&st, a, strlen(a), false, &k), 0);
    cr_assert_eq(j.n, 1);
    cr_assert_str_eq(j.names[0], "f");
    cr_assert_str_eq(j.args[0].p, "{\"text\": \"abc");
    cr_assert_null(j.content.p);
    const char *b = "def\"}}</tool_call>";
    cr_assert_eq(gw_tools_feed(&st, b, strlen(b), true, &k), 0);
    cr_assert_str_eq(j.args[0].p, "{\"text\": \"abcdef\"}");
    gw_tools_free(&st);
    j_free(&j);
}

Test(gateway_tools, the_parser_is_known_by_its_name_and_its_templates_rendering)
{
    cr_assert_eq(gw_tool_parser_by_name("hermes"), GW_TOOLS_HERMES);
    cr_assert_eq(gw_tool_parser_by_name("llama3_json"), GW_TOOLS_LLAMA3_JSON);
    cr_assert_eq(gw_tool_parser_by_name("mistral"), GW_TOOLS_MISTRAL);
    cr_assert_eq(gw_tool_parser_by_name("pythonic"), GW_TOOLS_PYTHONIC);
    cr_assert_eq(gw_tool_parser_by_name("llama4_pythonic"), GW_TOOLS_PYTHONIC);
    cr_assert_str_eq(gw_tool_parser_name(GW_TOOLS_PYTHONIC), "pythonic");
    cr_assert_eq(gw_tool_parser_by_name("python"), -1);
    cr_assert_eq(gw_tool_parser_of_rendering("<|start_header_id|>assistant<|end_header_id|>\n\n"
                                             "[probe(tz=\"UTC\")]<|eot_id|>",
                                             "probe"),
                 GW_TOOLS_PYTHONIC);
    cr_assert_eq(gw_tool_parser_of_rendering("<|header_start|>assistant<|header_end|>\n\n"
                                             "<|python_start|>[probe(tz='UTC')]<|python_end|>",
                                             "probe"),
                 GW_TOOLS_PYTHONIC);
    cr_assert_eq(gw_tool_parser_of_rendering("<|im_start|>assistant\n<tool_call>\n{...}", "f"),
                 GW_TOOLS_HERMES);
    cr_assert_eq(gw_tool_parser_of_rendering("[INST]x[/INST][TOOL_CALLS][{...}]", "f"),
                 GW_TOOLS_MISTRAL);
    cr_assert_eq(gw_tool_parser_of_rendering("[INST]x[/INST][TOOL_CALLS]f[ARGS]{}</s>", "f"),
                 GW_TOOLS_MISTRAL);
    cr_assert_eq(gw_tool_parser_of_rendering("<|start_header_id|>assistant<|end_header_id|>\n\n"
                                             "{\"name\": \"probe\", \"parameters\": {}}",
                                             "probe"),
                 GW_TOOLS_LLAMA3_JSON);
    cr_assert_eq(gw_tool_parser_of_rendering("<user>x\n<assistant>[call probe]", "probe"),
                 GW_TOOLS_NONE);
}

/* tool_choice "required": the answer is constrained to a JSON list of {"name", "parameters"};
 * tool_choice naming a function: all of it is that function's arguments. */
Test(gateway_tools, constrained_answers_are_read_as_calls)
{
    check(GW_TOOLS_JSON_LIST, 0,
          "[{\"name\": \"a\", \"parameters\": {\"x\": [1, {\"y\": \"]\"}]}}, {\"name\": \"b\", "
          "\"parameters\": {}}]",
          &(want){NULL, 2, {"a", "b"}, {"{\"x\": [1, {\"y\": \"]\"}]}", "{}"}});
    check(GW_TOOLS_JSON_LIST, 1,
          " [ {\"name\":\"a\",\"parameters\":{\"i\":1}} , {\"name\":\"b\",\"parameters\":{}} ]",
          &(want){NULL, 1, {"a"}, {"{\"i\":1}"}});
    /* cut short at max_tokens: the call it was beginning is dropped, not content */
    check(GW_TOOLS_JSON_LIST, 0, "[{\"name\": \"a\", \"parameters\": {}}, {\"na",
          &(want){NULL, 1, {"a"}, {"{}"}});
    const char *args = "{\"city\": \"Paris\", \"days\": 3}";
    for (size_t step = 1; step <= 8; step++) {
        joined j;
        memset(&j, 0, sizeof j);
        j.order_ok = true;
        gw_tool_state st;
        cr_assert_eq(gw_tools_init_named(&st, "get_weather"), 0);
        gw_tool_sink k = {j_content, j_start, j_args, &j};
        size_t n = strlen(args);
        for (size_t at = 0; at < n; at += step) {
            size_t take = n - at < step ? n - at : step;
            cr_assert_eq(gw_tools_feed(&st, args + at, take, at + take == n, &k), 0);
            if (at == 0) cr_assert_eq(j.n, 1, "the call starts with the answer's first bytes");
        }
        gw_tools_free(&st);
        cr_assert(j.order_ok);
        cr_assert_eq(j.n, 1);
        cr_assert_str_eq(j.names[0], "get_weather");
        cr_assert_str_eq(j.args[0].p, args);
        cr_assert_null(j.content.p);
        j_free(&j);
    }
}

/* ---- tools in the built-in templates ----------------------------------------------------- */
static char *render(int tpl, const char *body, gw_err *e)
{
    gw_parse_cfg cfg = {.served_model = NULL, .tpl = tpl, .jinja = NULL, .tool_parser = 0};
    gw_params p;
    if (gw_params_parse(GW_CHAT, body, strlen(body), &cfg, &p, e)) return NULL;
    char *t = p.prompt_text;
    p.prompt_text = NULL;
    gw_params_free(&p);
    return t;
}

static const char *const TOOL_CHAT =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
    "\"content\": \"time?\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
    "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_time\", "
    "\"arguments\": \"{\\\"tz\\\":\\\"UTC\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": "
    "\"c1\", \"content\": \"noon\"}, {\"role\": \"tool\", \"tool_call_id\": \"c2\", \"content\": "
    "\"sunny\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_time\", "
    "\"parameters\": {\"type\": \"object\"}}}]}";

/* chatml writes Hermes/Qwen's tool format: the tools in the system message, calls as
 * <tool_call> tags, a run of results as one user turn of <tool_response> tags. */
Test(gateway_tools, chatml_writes_the_hermes_tool_format)
{
    gw_err e;
    char *t = render(RINGLM_CHAT_CHATML, TOOL_CHAT, &e);
    cr_assert_not_null(t, "%s", e.message);
    cr_assert_str_eq(
        t, "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to "
           "assist with the user query.\n\nYou are provided with function signatures within "
           "<tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
           "\"get_time\", \"parameters\": {\"type\": \"object\"}}}\n</tools>\n\nFor each function "
           "call, return a json object with function name and arguments within "
           "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
           "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\ntime?"
           "<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_time\", "
           "\"arguments\": {\"tz\": \"UTC\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n"
           "<tool_response>\nnoon\n</tool_response>\n<tool_response>\nsunny\n</tool_response>"
           "<|im_end|>\n<|im_start|>assistant\n");
    free(t);
}

/* llama3 writes Llama 3.1's JSON tool calling: the tools in the first user message, a call
 * as {"name", "parameters"}, a result as an ipython turn. */
Test(gateway_tools, llama3_writes_its_json_tool_format)
{
    gw_err e;
    char *t = render(RINGLM_CHAT_LLAMA3, TOOL_CHAT, &e);
    cr_assert_not_null(t, "%s", e.message);
    cr_assert_str_eq(
        t, "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n\nBe brief."
           "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, "
           "please respond with a JSON for a function call with its proper arguments that best "
           "answers the given prompt.\n\nRespond in the format {\"name\": function name, "
           "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n"
           "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_time\",\n"
           "        \"parameters\": {\n            \"type\": \"object\"\n        }\n    }\n}\n\n"
           "time?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": "
           "\"get_time\", \"parameters\": {\"tz\": \"UTC\"}}<|eot_id|><|start_header_id|>ipython"
           "<|end_header_id|>\n\n\"noon\"<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"
           "\"sunny\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    free(t);
}

/* The other built-in templates have no tool format: tools, calls or results are a 400. */
Test(gateway_tools, other_builtin_templates_refuse_tools_by_name)
{
    gw_err e;
    cr_assert_null(render(RINGLM_CHAT_MISTRAL_V3, TOOL_CHAT, &e));
    cr_assert_eq(e.status, 400);
    cr_assert_str_eq(e.param, "tools");
    cr_assert(strstr(e.message, "no format for tools"), "%s", e.message);
    cr_assert_null(render(RINGLM_CHAT_PLAIN,
                          "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", &e));
    cr_assert_str_eq(e.param, "messages");
    /* without tools the conversation is as before */
    char *t = render(RINGLM_CHAT_CHATML,
                     "{\"messages\": [{\"role\": \"user\", \"content\": "
                     "\"hi\"}]}",
                     &e);
    cr_assert_str_eq(t, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    free(t);
}
