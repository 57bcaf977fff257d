/* SPDX-License-Identifier: MIT */
/*
 * Tool calls through ringlm-gateway with a real ringlmd on stories260K: the gateway serves
 * stories260K's vocabulary as a GGUF tokenizer whose chat template is Hermes-style (Qwen's
 * <tool_call> tags), so it picks the hermes parser from the template; tools and an
 * assistant's tool calls reach the template; an answer without a call is the same content
 * under "auto" as under "none", whole and streamed; a call in the text (forced by a regex)
 * comes back as tool_calls under "auto"; "required" and a named function constrain the
 * answer to calls whose arguments fit the function's schema, whole and streamed alike; bad
 * tools and tool choices are 400s that name the field.
 */
#include "tests/gateway_helpers.h"

#include <criterion/criterion.h>
#include <jansson.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gw_text.h"

TestSuite(gateway_toolcalls, .fini = gwh_stop_all, .timeout = 120);

/* A Hermes-style template (the shape of Qwen 2.5's): the tools in a system turn, an
 * assistant's calls as <tool_call> tags with their arguments as JSON, tool results as user
 * turns. */
static const char *const hermes_jinja =
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t.function.name }}"
    "{% endfor %}</tools><|im_end|>{{ '\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response>"
    "<|im_end|>{{ '\\n' }}"
    "{%- elif m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}<tool_call>"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "</tool_call>{% endfor %}<|im_end|>{{ '\\n' }}"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{{ '\\n' }}{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/* ringlmd and a gateway on the Hermes-template tokenizer (extra: more gateway options). */
static void start_hermes(const char *const *extra)
{
    gwh_start_with_template("hermes.gguf", hermes_jinja, extra);
}

static json_t *post_json(const char *path, const char *body, int want_status)
{
    gwh_resp r = gwh_curl(path, NULL, body);
    cr_assert_eq(r.status, want_status, "%s %s: %d %s", path, body, r.status, r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    cr_assert_not_null(j, "%s", r.body);
    gwh_resp_free(&r);
    return j;
}

static const char *const TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"description\": \"The "
    "time\", \"parameters\": {\"type\": \"object\", \"properties\": {\"tz\": {\"type\": "
    "\"string\"}}}}}]";

/* The start line says which syntax is parsed and where that came from. */
static void want_start_line(const char *says)
{
    char *log = th_read_file(gwh_gateway.log);
    cr_assert(strstr(log, says), "%s", log);
    free(log);
}

Test(gateway_toolcalls, the_parser_is_the_one_the_chat_template_writes)
{
    gwh_need();
    start_hermes(NULL);
    want_start_line("tool calls hermes (the chat template)");
}

Test(gateway_toolcalls, the_parser_named_by_the_option_wins)
{
    gwh_need();
    const char *none[] = {"--tool-call-parser", "none", NULL};
    start_hermes(none);
    want_start_line("tool calls none (--tool-call-parser)");
}

Test(gateway_toolcalls, a_template_that_writes_no_known_call_syntax_parses_none)
{
    gwh_need();
    char *plain = gwh_stories_gguf("plain.gguf", "{% for m in messages %}{{ m.content }}\n"
                                                 "{% endfor %}");
    const char *p[] = {"--tokenizer", plain, NULL};
    gwh_start_gateway(p);
    want_start_line("tool calls none (the chat template)");
    free(plain);
}

/* An assistant's tool_calls reach the template with their arguments as the object the
 * client's JSON string holds, and the tools with them: the ids of the messages are the ids of
 * the text the template gives for that. */
Test(gateway_toolcalls, an_assistants_tool_calls_reach_the_template_with_their_arguments)
{
    gwh_need();
    gwh_need_curl();
    start_hermes(NULL);
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"time?\"}, {\"role\": "
             "\"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": "
             "\"function\", \"function\": {\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": "
             "\\\"UTC\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": "
             "\"noon\"}], \"tools\": %s}",
             TOOLS);
    json_t *got = post_json("/tokenize", body, 200);
    json_t *want = post_json(
        "/tokenize",
        "{\"prompt\": \"<|im_start|>system\\n<tools>get_time</tools><|im_end|>\\n<|im_start|>user"
        "\\ntime?<|im_end|>\\n<|im_start|>assistant\\n<tool_call>{\\\"name\\\": \\\"get_time\\\", "
        "\\\"arguments\\\": {\\\"tz\\\": \\\"UTC\\\"}}</tool_call><|im_end|>\\n<|im_start|>user\\n"
        "<tool_response>noon</tool_response><|im_end|>\\n<|im_start|>assistant\\n\"}",
        200);
    cr_assert(json_equal(json_object_get(got, "tokens"), json_object_get(want, "tokens")),
              "the rendered conversation is not the expected text: %s vs %s",
              json_dumps(json_object_get(got, "tokens"), JSON_COMPACT),
              json_dumps(json_object_get(want, "tokens"), JSON_COMPACT));
    json_decref(got);
    json_decref(want);
}

/* The content of a streamed chat answer (its deltas joined), its finish reason, and whether
 * any chunk carried tool_calls. */
static char *stream_content(const char *body, char *finish, size_t fn, bool *calls)
{
    gwh_resp r = gwh_curl("/v1/chat/completions", NULL, body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    gw_buf all = {0};
    gw_buf_add(&all, "", 0);
    *calls = false;
    finish[0] = 0;
    for (char *l = strstr(r.body, "data: "); l; l = strstr(l + 1, "data: ")) {
        if (!strncmp(l, "data: [DONE]", 12)) break;
        char *end = strstr(l, "\n\n");
        json_t *j = json_loadb(l + 6, end ? (size_t)(end - l - 6) : strlen(l + 6), 0, NULL);
        cr_assert_not_null(j, "%s", l);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        json_t *d = json_object_get(ch, "delta");
        if (json_is_string(json_object_get(d, "content")))
            gw_buf_adds(&all, json_string_value(json_object_get(d, "content")));
        if (json_object_get(d, "tool_calls")) *calls = true;
        if (json_is_string(json_object_get(ch, "finish_reason")))
            snprintf(finish, fn, "%s", json_string_value(json_object_get(ch, "finish_reason")));
        json_decref(j);
    }
    gwh_resp_free(&r);
    return all.p;
}

Test(gateway_toolcalls, an_answer_without_a_call_is_the_same_content_under_auto)
{
    gwh_need();
    gwh_need_curl();
    start_hermes(NULL);
    char body[2048];
    const char *choice[] = {"\"none\"", "\"auto\""};
    json_t *ans[2];
    for (int i = 0; i < 2; i++) {
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"Lily and Tom\"}], \"tools\": "
                 "%s, \"tool_choice\": %s, \"max_tokens\": 24, \"temperature\": 0}",
                 TOOLS, choice[i]);
        ans[i] = post_json("/v1/chat/completions", body, 200);
    }
    json_t *m0 = json_object_get(json_array_get(json_object_get(ans[0], "choices"), 0), "message");
    json_t *m1 = json_object_get(json_array_get(json_object_get(ans[1], "choices"), 0), "message");
    const char *c0 = json_string_value(json_object_get(m0, "content"));
    cr_assert(c0 && strlen(c0) > 10, "%s", json_dumps(ans[0], 0));
    cr_assert_str_eq(json_string_value(json_object_get(m1, "content")), c0);
    cr_assert_null(json_object_get(m1, "tool_calls"), "%s", json_dumps(ans[1], 0));
    cr_assert_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(ans[1], "choices"), 0), "finish_reason")),
                     "length");
    /* streamed under auto: the same content, no tool_calls delta */
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Lily and Tom\"}], \"tools\": %s, "
             "\"max_tokens\": 24, \"temperature\": 0, \"stream\": true}",
             TOOLS);
    char finish[32];
    bool calls;
    char *text = stream_content(body, finish, sizeof finish, &calls);
    cr_assert_str_eq(text, c0);
    cr_assert_str_eq(finish, "length");
    cr_assert_not(calls);
    free(text);
    json_decref(ans[0]);
    json_decref(ans[1]);
}

static void want_400(const char *body, const char *param, const char *says)
{
    gwh_resp r = gwh_curl("/v1/chat/completions", NULL, body);
    cr_assert_eq(r.status, 400, "%s: %d %s", body, r.status, r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *e = json_object_get(j, "error");
    cr_assert_str_eq(json_string_value(json_object_get(e, "param")), param, "%s", r.body);
    cr_assert(strstr(json_string_value(json_object_get(e, "message")), says), "%s", r.body);
    json_decref(j);
    gwh_resp_free(&r);
}

Test(gateway_toolcalls, bad_tools_and_tool_choices_are_400s_naming_the_field)
{
    gwh_need();
    gwh_need_curl();
    start_hermes(NULL);
    const char *msgs = "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]";
    char body[2048];
    snprintf(body, sizeof body,
             "{%s, \"tools\": [{\"type\": \"function\", \"function\": {\"description\": \"x\"}}]}",
             msgs);
    want_400(body, "tools", "'tools' item 0: 'function.name' is required");
    snprintf(body, sizeof body, "{%s, \"tools\": [{\"type\": \"retrieval\"}]}", msgs);
    want_400(body, "tools", "'type' must be \"function\"");
    snprintf(body, sizeof body,
             "{%s, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, "
             "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
             msgs);
    want_400(body, "tools", "both named 'f'");
    snprintf(body, sizeof body,
             "{%s, \"tools\": %s, \"tool_choice\": {\"type\": \"function\", \"function\": "
             "{\"name\": \"get_weather\"}}}",
             msgs, TOOLS);
    want_400(body, "tool_choice", "'get_weather', which is not in 'tools'");
    snprintf(body, sizeof body, "{%s, \"tools\": %s, \"tool_choice\": \"sometimes\"}", msgs, TOOLS);
    want_400(body, "tool_choice", "must be \"none\", \"auto\", \"required\"");
    snprintf(body, sizeof body, "{%s, \"tool_choice\": \"auto\"}", msgs);
    want_400(body, "tool_choice", "needs 'tools'");
}

Test(gateway_toolcalls, auto_is_a_400_where_no_call_syntax_is_known)
{
    gwh_need();
    gwh_need_curl();
    const char *none[] = {"--tool-call-parser", "none", NULL};
    start_hermes(none);
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": %s, "
             "\"tool_choice\": \"auto\"}",
             TOOLS);
    want_400(body, "tool_choice", "--tool-call-parser");
}

/* ---- answers constrained to calls ------------------------------------------------------- */
/* Tools whose arguments have one possible value each but for a choice, so that stories260K's
 * greedy answer finishes: the constraint leaves it the names, the keys and the choices. */
static const char *const TIGHT_TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"tz\": {\"enum\": [\"UTC\", \"CET\"]}}, \"required\": "
    "[\"tz\"], \"additionalProperties\": false}}}, {\"type\": \"function\", \"function\": "
    "{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", \"properties\": "
    "{\"city\": {\"enum\": [\"Paris\", \"Oslo\"]}}, \"required\": [\"city\"], "
    "\"additionalProperties\": false}}}]";

/* A chat request with TIGHT_TOOLS, greedy, whitespace tokens forbidden (a JSON answer may put
 * whitespace anywhere, and greedy stories260K would stay there). */
static char *tight_body(const char *more)
{
    json_t *bias = gwh_whitespace_bias();
    char *b = json_dumps(bias, JSON_COMPACT);
    json_decref(bias);
    size_t n = strlen(b) + strlen(TIGHT_TOOLS) + strlen(more) + 512;
    char *body = malloc(n);
    snprintf(body, n,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"What time is it?\"}], \"tools\": "
             "%s, \"temperature\": 0, \"max_tokens\": 160, \"logit_bias\": %s%s}",
             TIGHT_TOOLS, b, more);
    free(b);
    return body;
}

/* A call's arguments are a JSON object of its function's schema. */
static void want_valid_call(const char *name, const char *args)
{
    json_t *a = json_loads(args, 0, NULL);
    cr_assert(json_is_object(a), "%s's arguments are not a JSON object: %s", name, args);
    const char *v;
    if (!strcmp(name, "get_time")) {
        v = json_string_value(json_object_get(a, "tz"));
        cr_assert(v && (!strcmp(v, "UTC") || !strcmp(v, "CET")), "%s", args);
    } else {
        cr_assert_str_eq(name, "get_weather");
        v = json_string_value(json_object_get(a, "city"));
        cr_assert(v && (!strcmp(v, "Paris") || !strcmp(v, "Oslo")), "%s", args);
    }
    cr_assert_eq(json_object_size(a), 1, "%s", args);
    json_decref(a);
}

/* The calls of a streamed chat answer, reassembled from delta.tool_calls: names[i], args[i]. */
static int stream_calls(const char *body, char names[4][32], gw_buf args[4], char *finish,
                        size_t fn, bool *content)
{
    gwh_resp r = gwh_curl("/v1/chat/completions", NULL, body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    int n = 0;
    *content = false;
    for (char *l = strstr(r.body, "data: "); l; l = strstr(l + 1, "data: ")) {
        if (!strncmp(l, "data: [DONE]", 12)) break;
        char *end = strstr(l, "\n\n");
        json_t *j = json_loadb(l + 6, (size_t)(end - l - 6), 0, NULL);
        cr_assert_not_null(j, "%s", l);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0), *d;
        d = json_object_get(ch, "delta");
        const char *c = json_string_value(json_object_get(d, "content"));
        if (c && *c) *content = true;
        json_t *tcs = json_object_get(d, "tool_calls");
        for (size_t k = 0; k < json_array_size(tcs); k++) {
            json_t *tc = json_array_get(tcs, k);
            int i = (int)json_integer_value(json_object_get(tc, "index"));
            cr_assert(i >= 0 && i < 4 && i <= n, "%s", l);
            json_t *f = json_object_get(tc, "function");
            if (i == n) { /* a call's first delta: id, type, name */
                cr_assert(json_string_length(json_object_get(tc, "id")) > 0, "%s", l);
                cr_assert_str_eq(json_string_value(json_object_get(tc, "type")), "function");
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
    return n;
}

/* The whole answer's tool_calls against the streamed one's. */
static void want_same_calls(const char *more, const char *finish_want, int n_want)
{
    char *b = tight_body(more);
    json_t *whole = post_json("/v1/chat/completions", b, 200);
    json_t *ch = json_array_get(json_object_get(whole, "choices"), 0);
    json_t *msg = json_object_get(ch, "message"), *calls = json_object_get(msg, "tool_calls");
    cr_assert(json_is_null(json_object_get(msg, "content")), "%s", json_dumps(whole, 0));
    const char *fin = json_string_value(json_object_get(ch, "finish_reason"));
    if (finish_want)
        cr_assert_str_eq(fin, finish_want, "%s", json_dumps(whole, 0));
    else /* as many calls as the model writes: it may run to max_tokens */
        cr_assert(!strcmp(fin, "tool_calls") || !strcmp(fin, "length"), "%s", fin);
    int n = (int)json_array_size(calls);
    cr_assert(n_want ? n == n_want : n >= 1, "%d calls: %s", n, json_dumps(whole, 0));
    for (int i = 0; i < n; i++) {
        json_t *f = json_object_get(json_array_get(calls, (size_t)i), "function");
        want_valid_call(json_string_value(json_object_get(f, "name")),
                        json_string_value(json_object_get(f, "arguments")));
    }
    free(b);
    size_t len = strlen(more) + 32;
    char *smore = malloc(len);
    snprintf(smore, len, "%s, \"stream\": true", more);
    b = tight_body(smore);
    char names[4][32] = {{0}}, finish[32] = "";
    gw_buf args[4] = {{0}};
    bool content;
    int sn = stream_calls(b, names, args, finish, sizeof finish, &content);
    cr_assert_eq(sn, n, "streamed %d calls, whole %d", sn, n);
    for (int i = 0; i < n; i++) {
        json_t *f = json_object_get(json_array_get(calls, (size_t)i), "function");
        cr_assert_str_eq(names[i], json_string_value(json_object_get(f, "name")));
        cr_assert_str_eq(args[i].p ? args[i].p : "",
                         json_string_value(json_object_get(f, "arguments")));
        gw_buf_free(&args[i]);
    }
    cr_assert_str_eq(finish, fin);
    cr_assert_not(content, "a constrained answer has no content");
    free(b);
    free(smore);
    json_decref(whole);
}

Test(gateway_toolcalls, required_answers_are_calls_of_the_tools)
{
    gwh_need();
    gwh_need_curl();
    start_hermes(NULL);
    want_same_calls(", \"tool_choice\": \"required\"", NULL, 0);
    want_same_calls(", \"tool_choice\": \"required\", \"parallel_tool_calls\": false", "tool_calls",
                    1);
}

Test(gateway_toolcalls, a_named_function_is_the_one_called)
{
    gwh_need();
    gwh_need_curl();
    start_hermes(NULL);
    want_same_calls(", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                    "\"get_weather\"}}",
                    "stop", 1);
    char *b = tight_body(", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                         "\"get_weather\"}}");
    json_t *whole = post_json("/v1/chat/completions", b, 200);
    json_t *f = json_object_get(
        json_array_get(
            json_object_get(
                json_object_get(json_array_get(json_object_get(whole, "choices"), 0), "message"),
                "tool_calls"),
            0),
        "function");
    cr_assert_str_eq(json_string_value(json_object_get(f, "name")), "get_weather");
    json_decref(whole);
    free(b);
    /* with another constraint: a 400 naming both */
    b = tight_body(", \"tool_choice\": \"required\", \"guided_regex\": \"a+\"");
    want_400(b, "guided_regex", "'tool_choice'");
    free(b);
}

/* "auto" reads the model's own syntax out of its text: here the text is forced (a regex) to
 * be one Hermes call, which comes back as tool_calls, whole and streamed. */
Test(gateway_toolcalls, auto_parses_a_call_out_of_the_text)
{
    gwh_need();
    gwh_need_curl();
    start_hermes(NULL);
    const char *more =
        ", \"tool_choice\": \"auto\", \"guided_regex\": \"<tool_call>\\\\{\\\"name\\\": "
        "\\\"get_time\\\", \\\"arguments\\\": \\\\{\\\"tz\\\": "
        "\\\"UTC\\\"\\\\}\\\\}</tool_call>\"";
    want_same_calls(more, "tool_calls", 1);
    char *b = tight_body(more);
    json_t *whole = post_json("/v1/chat/completions", b, 200);
    json_t *call = json_array_get(
        json_object_get(
            json_object_get(json_array_get(json_object_get(whole, "choices"), 0), "message"),
            "tool_calls"),
        0);
    json_t *f = json_object_get(call, "function");
    cr_assert_str_eq(json_string_value(json_object_get(f, "name")), "get_time");
    cr_assert_str_eq(json_string_value(json_object_get(f, "arguments")), "{\"tz\": \"UTC\"}");
    cr_assert(!strncmp(json_string_value(json_object_get(call, "id")), "call_", 5));
    json_decref(whole);
    free(b);
}
