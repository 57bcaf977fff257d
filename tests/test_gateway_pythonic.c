/* SPDX-License-Identifier: MIT */
/*
 * Pythonic tool calls (Llama 3.2 / Llama 4: [get_time(tz="UTC")]) through ringlm-gateway with
 * a real ringlmd on stories260K: the gateway serves stories260K's vocabulary as a GGUF
 * tokenizer whose chat template writes an assistant's calls as a Python list of keyword calls
 * (the shape of vLLM's Llama 3.2 pythonic template), so it picks the pythonic parser from the
 * template; under "auto" a call in the text (forced by a regex) comes back as tool_calls with
 * its keywords as a JSON object, whole and streamed alike; an answer that only looks like a
 * call stays content.
 */
#include "tests/gateway_helpers.h"

#include <criterion/criterion.h>
#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gw_text.h"

TestSuite(gateway_pythonic, .fini = gwh_stop_all, .timeout = 120);

static const char *const pythonic_jinja =
    "{%- if tools %}<|start_header_id|>system<|end_header_id|>\n\nYou may call functions: "
    "{% for t in tools %}{{ t.function.name }} {% endfor %}<|eot_id|>{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}"
    "<|eot_id|>"
    "{%- elif m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>\n\n["
    "{%- for c in m.tool_calls %}{{ c.function.name }}("
    "{%- for k, v in c.function.arguments | items %}{{ k }}={{ v | tojson }}"
    "{%- if not loop.last %}, {% endif %}{% endfor %})"
    "{%- if not loop.last %}, {% endif %}{% endfor %}]<|eot_id|>"
    "{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

static const char *const TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"tz\": {\"type\": \"string\"}, \"n\": {\"type\": "
    "\"integer\"}}}}}]";

static void start_pythonic(void)
{
    gwh_start_with_template("pythonic.gguf", pythonic_jinja, NULL);
}

Test(gateway_pythonic, the_parser_is_the_one_the_chat_template_writes)
{
    gwh_need();
    start_pythonic();
    char *log = th_read_file(gwh_gateway.log);
    cr_assert(strstr(log, "tool calls pythonic (the chat template)"), "%s", log);
    free(log);
}

/* A greedy chat request under "auto" whose answer a regex forces to be `text`. */
static char *body_forcing(const char *text, bool stream)
{
    json_t *b = json_pack("{s:[{s:s,s:s}], s:o, s:s, s:s, s:i, s:i, s:b}", "messages", "role",
                          "user", "content", "What time is it?", "tools",
                          json_loads(TOOLS, 0, NULL), "tool_choice", "auto", "guided_regex", "",
                          "temperature", 0, "max_tokens", 120, "stream", stream);
    /* the regex: text with every character escaped */
    gw_buf re = {0};
    for (const char *p = text; *p; p++) {
        if (strchr("\\^$.|?*+()[]{}", *p)) gw_buf_add(&re, "\\", 1);
        gw_buf_add(&re, p, 1);
    }
    json_object_set_new(b, "guided_regex", json_string(re.p));
    gw_buf_free(&re);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

/* The whole answer forced to `text`: its message (a new reference). */
static json_t *whole_answer(const char *text, char *finish, size_t fn)
{
    char *body = body_forcing(text, false);
    gwh_resp r = gwh_curl("/v1/chat/completions", NULL, body);
    cr_assert_eq(r.status, 200, "%s: %s", body, r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    cr_assert_not_null(j, "%s", r.body);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    snprintf(finish, fn, "%s", json_string_value(json_object_get(ch, "finish_reason")));
    json_t *m = json_incref(json_object_get(ch, "message"));
    json_decref(j);
    gwh_resp_free(&r);
    free(body);
    return m;
}

/* The streamed answer forced to `text`: its content, and its calls' names and arguments
 * reassembled from delta.tool_calls. */
static int streamed_answer(const char *text, gw_buf *content, char names[4][32], gw_buf args[4],
                           char *finish, size_t fn)
{
    char *body = body_forcing(text, true);
    gwh_resp r = gwh_curl("/v1/chat/completions", NULL, body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    int n = 0;
    for (char *l = strstr(r.body, "data: "); l; l = strstr(l + 1, "data: ")) {
        if (!strncmp(l, "data: [DONE]", 12)) break;
        char *end = strstr(l, "\n\n");
        json_t *j = json_loadb(l + 6, end ? (size_t)(end - l - 6) : strlen(l + 6), 0, NULL);
        cr_assert_not_null(j, "%s", l);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        json_t *d = json_object_get(ch, "delta");
        const char *c = json_string_value(json_object_get(d, "content"));
        if (c) gw_buf_adds(content, c);
        json_t *tcs = json_object_get(d, "tool_calls");
        for (size_t k = 0; k < json_array_size(tcs); k++) {
            json_t *tc = json_array_get(tcs, k), *f = json_object_get(tc, "function");
            int i = (int)json_integer_value(json_object_get(tc, "index"));
            cr_assert(i >= 0 && i < 4 && i <= n, "%s", l);
            if (i == n) {
                cr_assert(json_string_length(json_object_get(tc, "id")) > 0, "%s", l);
                snprintf(names[i], 32, "%s", json_string_value(json_object_get(f, "name")));
                n++;
            }
            const char *a = json_string_value(json_object_get(f, "arguments"));
            if (a) gw_buf_adds(&args[i], a);
        }
        if (json_is_string(json_object_get(ch, "finish_reason")))
            snprintf(finish, fn, "%s", json_string_value(json_object_get(ch, "finish_reason")));
        json_decref(j);
    }
    gwh_resp_free(&r);
    free(body);
    return n;
}

/* "auto" reads the pythonic calls out of the text: two calls, their keywords as JSON. */
Test(gateway_pythonic, auto_parses_pythonic_calls_out_of_the_text)
{
    gwh_need();
    gwh_need_curl();
    start_pythonic();
    const char *text = "[get_time(tz='UTC', n=2), get_time(tz=\"CET\")]";
    static const char *const want_args[2] = {"{\"tz\": \"UTC\", \"n\": 2}", "{\"tz\": \"CET\"}"};
    char finish[32];
    json_t *m = whole_answer(text, finish, sizeof finish);
    cr_assert_str_eq(finish, "tool_calls", "%s", json_dumps(m, 0));
    cr_assert(json_is_null(json_object_get(m, "content")), "%s", json_dumps(m, 0));
    json_t *calls = json_object_get(m, "tool_calls");
    cr_assert_eq(json_array_size(calls), 2, "%s", json_dumps(m, 0));
    for (size_t i = 0; i < 2; i++) {
        json_t *c = json_array_get(calls, i), *f = json_object_get(c, "function");
        cr_assert(!strncmp(json_string_value(json_object_get(c, "id")), "call_", 5));
        cr_assert_str_eq(json_string_value(json_object_get(c, "type")), "function");
        cr_assert_str_eq(json_string_value(json_object_get(f, "name")), "get_time");
        cr_assert_str_eq(json_string_value(json_object_get(f, "arguments")), want_args[i]);
    }
    json_decref(m);
    gw_buf content = {0}, args[4] = {{0}};
    char names[4][32] = {{0}}, sfinish[32] = "";
    int n = streamed_answer(text, &content, names, args, sfinish, sizeof sfinish);
    cr_assert_eq(n, 2);
    for (int i = 0; i < 2; i++) {
        cr_assert_str_eq(names[i], "get_time");
        cr_assert_str_eq(args[i].p ? args[i].p : "", want_args[i]);
        gw_buf_free(&args[i]);
    }
    cr_assert_eq(content.len, 0, "streamed content: %s", content.p);
    cr_assert_str_eq(sfinish, "tool_calls");
    gw_buf_free(&content);
}

/* Text that only looks like a call (a positional argument) is the answer's content, whole
 * and streamed. */
Test(gateway_pythonic, text_that_is_not_a_call_stays_content)
{
    gwh_need();
    gwh_need_curl();
    start_pythonic();
    const char *text = "[get_time(1)] is not a call";
    char finish[32];
    json_t *m = whole_answer(text, finish, sizeof finish);
    cr_assert_str_eq(json_string_value(json_object_get(m, "content")), text, "%s",
                     json_dumps(m, 0));
    cr_assert_null(json_object_get(m, "tool_calls"), "%s", json_dumps(m, 0));
    cr_assert_str_eq(finish, "stop");
    json_decref(m);
    gw_buf content = {0}, args[4] = {{0}};
    char names[4][32] = {{0}}, sfinish[32] = "";
    cr_assert_eq(streamed_answer(text, &content, names, args, sfinish, sizeof sfinish), 0);
    cr_assert_str_eq(content.p ? content.p : "", text);
    cr_assert_str_eq(sfinish, "stop");
    gw_buf_free(&content);
}

/* "required" and a named function under the pythonic parser: the answer is constrained to
 * the model's own syntax, [get_weather(city="Paris", days=2)], its arguments Python literals
 * of each function's schema, and read back as tool_calls — checked through the official
 * openai SDK, whole and streamed (tests/node/gateway_pythonic.test.mjs). */
Test(gateway_pythonic, required_and_named_calls_are_constrained_to_the_syntax)
{
    gwh_need();
    start_pythonic();
    gwh_run_node_sdk_test("gateway_pythonic.test.mjs", 3);
}
