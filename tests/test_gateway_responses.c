/* SPDX-License-Identifier: MIT */
/*
 * POST /v1/responses through a real ringlm-gateway and ringlmd (stories260K): docs/gateway.md's
 * Responses table is the gateway's own and every field in it is answered or refused by name;
 * a response whole and streamed says the same (the events in order, sequence numbers from 0,
 * the deltas joining to the whole's text); input items are the chat messages they mean (the
 * same prompt through the chat template); bad input is a 400 naming the field.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gateway/gw_responses.h"
#include "tests/gateway_helpers.h"

TestSuite(gateway_responses, .fini = gwh_stop_all, .timeout = 180);

static void setup(const char *const *extra)
{
    gwh_need();
    gwh_need_curl();
    gwh_start_daemon(NULL);
    gwh_start_gateway(extra);
    gwh_wait_healthy(10000);
}

/* POSTs body to /v1/responses: the status, the body parsed (NULL: not JSON). */
static int post(const char *body, json_t **out, char **raw)
{
    gwh_resp r = gwh_curl("/v1/responses", NULL, body);
    *out = json_loads(r.body ? r.body : "", 0, NULL);
    int st = r.status;
    if (raw) *raw = strdup(r.body ? r.body : "");
    gwh_resp_free(&r);
    return st;
}

static void want_400(const char *body, const char *param, const char *says)
{
    json_t *j;
    char *raw;
    int st = post(body, &j, &raw);
    cr_assert_eq(st, 400, "%s: %d %s", body, st, raw);
    json_t *e = json_object_get(j, "error");
    cr_assert_str_eq(json_string_value(json_object_get(e, "param")) ?: "(null)", param, "%s: %s",
                     body, raw);
    cr_assert(strstr(json_string_value(json_object_get(e, "message")) ?: "", says), "%s: %s", body,
              raw);
    json_decref(j);
    free(raw);
}

/* ---- the table ---------------------------------------------------------------------------- */
Test(gateway_responses, the_docs_table_is_the_gateways_table)
{
    gwh_doc_row rows[64];
    int n = gwh_doc_rows("responses", false, rows, 64);
    size_t nf;
    const gw_field *f = gw_responses_fields(&nf);
    cr_expect_eq((size_t)n, nf, "docs list %d fields, the gateway %zu", n, nf);
    for (size_t i = 0; i < nf; i++) {
        const gwh_doc_row *d = NULL;
        for (int k = 0; k < n && !d; k++)
            if (!strcmp(rows[k].name, f[i].name)) d = &rows[k];
        cr_expect_not_null(d, "'%s' is not in docs/gateway.md's responses table", f[i].name);
        if (!d) continue;
        cr_expect_str_eq(d->status, gw_field_status_name(f[i].status), "'%s'", f[i].name);
        cr_expect_str_eq(d->accepted, f[i].neutral ? f[i].neutral : "", "'%s'", f[i].name);
    }
}

/* Every row's example: implemented and ignored ones answered, refused ones a 400 naming the
 * field (and answered at the accepted value); a field in no row refused by name. */
Test(gateway_responses, every_field_is_answered_or_refused_by_name)
{
    setup(NULL);
    gwh_doc_row rows[64];
    int n = gwh_doc_rows("responses", false, rows, 64);
    for (int i = 0; i < n; i++) {
        for (int pass = 0; pass < 2; pass++) {
            const char *v = pass ? rows[i].accepted : rows[i].example;
            if (!v[0]) continue;
            json_t *body = json_pack("{s:s, s:s, s:i}", "model", "stories", "input",
                                     "Once upon a time", "max_output_tokens", 2);
            json_t *val = json_loads(v, JSON_DECODE_ANY, NULL);
            cr_assert_not_null(val, "'%s' example %s is not JSON", rows[i].name, v);
            json_object_set_new(body, rows[i].name, val);
            char *b = json_dumps(body, JSON_COMPACT);
            json_decref(body);
            json_t *j;
            char *raw;
            int st = post(b, &j, &raw);
            bool refused = !strcmp(rows[i].status, "refused") && !pass;
            if (refused) {
                cr_expect_eq(st, 400, "%s: %d %s", b, st, raw);
                cr_expect_str_eq(
                    json_string_value(json_object_get(json_object_get(j, "error"), "param")) ?: "",
                    rows[i].name, "%s: %s", b, raw);
            } else {
                cr_expect_eq(st, 200, "%s: %d %s", b, st, raw);
                cr_expect_str_eq(json_string_value(json_object_get(j, "object")) ?: "", "response",
                                 "%s: %s", b, raw);
            }
            json_decref(j);
            free(raw);
            free(b);
        }
    }
    want_400("{\"input\": \"hi\", \"frequency_penalty\": 0.5}", "frequency_penalty",
             "not a field ringlm's responses endpoint knows");
}

/* ---- whole and streamed ----------------------------------------------------------------- */
static const char *item_text(json_t *resp)
{
    json_t *out = json_object_get(resp, "output");
    for (size_t i = 0; i < json_array_size(out); i++) {
        json_t *it = json_array_get(out, i);
        if (strcmp(json_string_value(json_object_get(it, "type")) ?: "", "message")) continue;
        json_t *part = json_array_get(json_object_get(it, "content"), 0);
        cr_assert_str_eq(json_string_value(json_object_get(part, "type")), "output_text");
        return json_string_value(json_object_get(part, "text"));
    }
    return NULL;
}

/* The next server-sent event of a Responses stream after *at (NULL at the end): its type in
 * type, its data parsed; its type field and sequence_number (seq) checked. */
static json_t *next_event(const char **at, char type[64], int seq)
{
    const char *l = strstr(*at, "event: ");
    if (!l) return NULL;
    cr_assert_eq(sscanf(l, "event: %63s", type), 1);
    const char *d = strstr(l, "\ndata: ");
    cr_assert_not_null(d, "%s", l);
    const char *end = strstr(d, "\n\n");
    cr_assert_not_null(end, "%s", d);
    json_t *ev = json_loadb(d + 7, (size_t)(end - d - 7), 0, NULL);
    cr_assert_not_null(ev, "%.*s", (int)(end - d), d);
    cr_assert_str_eq(json_string_value(json_object_get(ev, "type")), type);
    cr_assert_eq(json_integer_value(json_object_get(ev, "sequence_number")), seq,
                 "event %s has sequence_number %lld, not %d", type,
                 (long long)json_integer_value(json_object_get(ev, "sequence_number")), seq);
    *at = end;
    return ev;
}

Test(gateway_responses, a_response_whole_and_streamed_says_the_same)
{
    setup(NULL);
    const char *req = "\"model\": \"stories\", \"instructions\": \"Tell a story.\", \"input\": "
                      "\"Once upon a time\", \"max_output_tokens\": 20, \"temperature\": 0";
    char body[512];
    snprintf(body, sizeof body, "{%s}", req);
    json_t *whole;
    char *raw;
    cr_assert_eq(post(body, &whole, &raw), 200, "%s", raw);
    free(raw);
    cr_assert_str_eq(json_string_value(json_object_get(whole, "object")), "response");
    cr_assert_str_eq(json_string_value(json_object_get(whole, "status")), "incomplete");
    cr_assert_str_eq(
        json_string_value(json_object_get(json_object_get(whole, "incomplete_details"), "reason")),
        "max_output_tokens");
    const char *text = item_text(whole);
    cr_assert(text && strlen(text) > 10, "%s", json_dumps(whole, 0));
    json_t *usage = json_object_get(whole, "usage");
    cr_assert_eq(json_integer_value(json_object_get(usage, "output_tokens")), 20);
    cr_assert_gt(json_integer_value(json_object_get(usage, "input_tokens")), 3);
    cr_assert_str_eq(json_string_value(json_object_get(whole, "instructions")), "Tell a story.");
    const char *id = json_string_value(json_object_get(whole, "id"));
    cr_assert(id && !strncmp(id, "resp_", 5), "%s", id);

    snprintf(body, sizeof body, "{%s, \"stream\": true}", req);
    gwh_resp r = gwh_curl("/v1/responses", NULL, body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert(strstr(r.head, "text/event-stream"), "%s", r.head);
    cr_assert_null(strstr(r.body, "[DONE]"), "a Responses stream has no [DONE]: %s", r.body);
    static const char *const order[] = {"response.created",           "response.in_progress",
                                        "response.output_item.added", "response.content_part.added",
                                        "response.output_text.delta", "response.output_text.done",
                                        "response.content_part.done", "response.output_item.done",
                                        "response.completed"};
    size_t at = 0;
    int seq = 0;
    gw_buf joined = {0};
    gw_buf_add(&joined, "", 0);
    json_t *completed = NULL;
    const char *l = r.body;
    char type[64];
    json_t *ev;
    while ((ev = next_event(&l, type, seq))) {
        seq++;
        /* the order: deltas repeat, the rest once each */
        if (strcmp(type, order[at])) {
            at++;
            cr_assert_lt(at, sizeof order / sizeof *order, "unexpected event %s", type);
            cr_assert_str_eq(type, order[at], "event %d", seq - 1);
        }
        if (!strcmp(type, "response.output_text.delta"))
            gw_buf_adds(&joined, json_string_value(json_object_get(ev, "delta")));
        if (!strcmp(type, "response.output_text.done"))
            cr_assert_str_eq(json_string_value(json_object_get(ev, "text")), text);
        if (!strcmp(type, "response.completed"))
            completed = json_incref(json_object_get(ev, "response"));
        json_decref(ev);
    }
    cr_assert_eq(at, sizeof order / sizeof *order - 1, "the stream stopped after %s", order[at]);
    cr_assert_str_eq(joined.p, text);
    cr_assert_str_eq(item_text(completed), text);
    cr_assert_str_eq(json_string_value(json_object_get(completed, "status")), "incomplete");
    cr_assert(json_equal(json_object_get(completed, "usage"), usage), "%s vs %s",
              json_dumps(json_object_get(completed, "usage"), 0), json_dumps(usage, 0));
    gw_buf_free(&joined);
    json_decref(completed);
    json_decref(whole);
    gwh_resp_free(&r);
}

/* Input items are the chat messages they mean: a Responses request's prompt is the one
 * /tokenize gives for those messages through the model file's template. */
static const char *const hermes_jinja =
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t.function.name }}"
    "{% endfor %}</tools><|im_end|>{{ '\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response>"
    "<|im_end|>{{ '\\n' }}"
    "{%- elif m.tool_calls %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{% for c in m.tool_calls %}<tool_call>"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "</tool_call>{% endfor %}<|im_end|>{{ '\\n' }}"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{{ '\\n' }}{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/* A daemon and a gateway whose tokenizer file carries hermes_jinja; the file's path. */
static char *setup_hermes(void)
{
    gwh_need();
    gwh_need_curl();
    char *tok = gwh_stories_gguf("hermes.gguf", hermes_jinja);
    const char *extra[] = {"--tokenizer", tok, NULL};
    setup(extra);
    return tok;
}

Test(gateway_responses, input_items_are_the_chat_messages_they_mean)
{
    char *tok = setup_hermes();
    json_t *resp;
    char *raw;
    int st = post(
        "{\"instructions\": \"Be brief.\", \"input\": [{\"role\": \"user\", \"content\": "
        "\"time?\"}, {\"type\": \"message\", \"role\": \"assistant\", \"content\": "
        "[{\"type\": \"output_text\", \"text\": \"Let me look.\"}]}, {\"type\": "
        "\"function_call\", \"call_id\": \"c1\", \"name\": \"get_time\", \"arguments\": "
        "\"{\\\"tz\\\": \\\"UTC\\\"}\"}, {\"type\": \"function_call_output\", \"call_id\": "
        "\"c1\", \"output\": \"noon\"}, {\"type\": \"reasoning\", \"summary\": []}, {\"type\": "
        "\"message\", \"role\": \"developer\", \"content\": [{\"type\": \"input_text\", "
        "\"text\": \"Answer now.\"}]}], \"tools\": [{\"type\": \"function\", \"name\": "
        "\"get_time\", \"parameters\": {\"type\": \"object\"}}], \"tool_choice\": \"none\", "
        "\"max_output_tokens\": 1}",
        &resp, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    free(raw);
    json_int_t n =
        json_integer_value(json_object_get(json_object_get(resp, "usage"), "input_tokens"));
    json_decref(resp);
    gwh_resp t = gwh_curl(
        "/tokenize", NULL,
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
        "\"content\": \"time?\"}, {\"role\": \"assistant\", \"content\": \"Let me look.\", "
        "\"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": "
        "\"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}}]}, {\"role\": \"tool\", "
        "\"tool_call_id\": \"c1\", \"content\": \"noon\"}, {\"role\": \"system\", \"content\": "
        "\"Answer now.\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
        "\"get_time\", \"parameters\": {\"type\": \"object\"}}}]}");
    cr_assert_eq(t.status, 200, "%s", t.body);
    json_t *tj = json_loads(t.body, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(tj, "count")), n,
                 "the response's prompt has %lld tokens, the chat messages' %lld", (long long)n,
                 (long long)json_integer_value(json_object_get(tj, "count")));
    cr_assert_gt(n, 60);
    json_decref(tj);
    gwh_resp_free(&t);
    free(tok);
}

Test(gateway_responses, bad_input_is_a_400_naming_the_field)
{
    setup(NULL);
    want_400("{\"model\": \"stories\"}", "input", "'input' is required");
    want_400("{\"input\": [{\"type\": \"image_generation_call\", \"id\": \"x\"}]}", "input",
             "'input' item 0: type 'image_generation_call' is not supported");
    want_400("{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_image\", "
             "\"image_url\": \"http://x\"}]}]}",
             "input", "part 0: type 'input_image' is not supported");
    want_400("{\"input\": [{\"type\": \"function_call\", \"name\": \"f\"}]}", "input",
             "needs 'call_id', 'name' and 'arguments'");
    want_400("{\"input\": \"hi\", \"tools\": [{\"type\": \"web_search\"}]}", "tools",
             "type 'web_search' is not supported");
    want_400("{\"input\": \"hi\", \"tools\": [{\"type\": \"function\", \"parameters\": {}}]}",
             "tools", "'tools' item 0: 'name' is required");
    want_400("{\"input\": \"hi\", \"tools\": [{\"type\": \"function\", \"name\": \"f\"}], "
             "\"tool_choice\": {\"type\": \"function\", \"name\": \"g\"}}",
             "tool_choice", "'g', which is not in 'tools'");
    want_400("{\"input\": \"hi\", \"store\": true}", "store", "nothing is stored");
    want_400("{\"input\": \"hi\", \"previous_response_id\": \"resp_1\"}", "previous_response_id",
             "send the whole conversation");
    want_400("{\"input\": \"hi\", \"text\": {\"format\": {\"type\": \"xml\"}}}", "text.format",
             "'xml' is not one of text, json_object, json_schema");
    want_400("{\"input\": \"hi\", \"text\": {\"format\": {\"type\": \"json_schema\", \"name\": "
             "\"x\"}}}",
             "text.format", "needs its schema");
    want_400("{\"input\": \"hi\", \"max_output_tokens\": 0}", "max_output_tokens",
             "max_output_tokens");
}

/* Through the official OpenAI SDK for Node (tests/node/gateway_responses.test.mjs): chat
 * with tools and a tool conversation, typed tool_calls for a named function and "required"
 * (whole, and streamed through the SDK's helper), responses.create whole and streamed (and
 * the SDK's stream helper), input items, function_call items, the errors as
 * BadRequestError naming the field. */
Test(gateway_responses, through_the_openai_sdk)
{
    gwh_need();
    char *out, *err;
    char *ver[] = {"node", "--version", NULL};
    if (th_run(ver, &out, &err, 20) != 0)
        cr_skip_test("node is not installed: the OpenAI SDK test skips");
    free(out);
    free(err);
    if (!th_exists("tests/node/node_modules/openai/package.json"))
        cr_skip_test("tests/node/node_modules/openai is absent (run `make deps`): the OpenAI SDK "
                     "test skips");
    char *tok = gwh_stories_gguf("hermes.gguf", hermes_jinja);
    const char *extra[] = {"--tokenizer", tok, NULL};
    setup(extra);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", gwh_port);
    setenv("GATEWAY_URL", url, 1);
    json_t *bias = gwh_whitespace_bias();
    char *b = json_dumps(bias, JSON_COMPACT);
    setenv("GATEWAY_WS_BIAS", b, 1);
    free(b);
    json_decref(bias);
    char *argv[] = {"node", "--test", "--test-reporter=tap",
                    "tests/node/gateway_responses.test.mjs", NULL};
    int rc = th_run(argv, &out, &err, 120);
    cr_assert_eq(rc, 0, "the SDK checks failed (exit %d):\n%s\n%s\ngateway log:\n%s", rc, out, err,
                 th_read_file(gwh_gateway.log));
    cr_assert(strstr(out, "# pass 8"), "expected 8 passing checks:\n%s", out);
    free(out);
    free(err);
    free(tok);
}

/* text.format json_schema constrains the answer (chat's response_format), and tool_choice
 * naming a function makes it that function_call item, its arguments the function's schema's
 * JSON (whole when the answer completes: stories260K, greedy, may wander in the whitespace
 * JSON allows until max_output_tokens, and a Responses request has no logit_bias to stop it). */
Test(gateway_responses, text_format_and_required_tools_constrain_the_answer)
{
    char *tok = setup_hermes();
    json_t *bias = gwh_whitespace_bias();
    char *b = json_dumps(bias, JSON_COMPACT), body[16384];
    json_decref(bias);
    snprintf(body, sizeof body,
             "{\"input\": \"Pick a color.\", \"temperature\": 0, \"max_output_tokens\": 60, "
             "\"logit_bias\": %s, \"text\": {\"format\": {\"type\": \"json_schema\", \"name\": "
             "\"color\", \"schema\": {\"type\": \"object\", \"properties\": {\"color\": {\"enum\": "
             "[\"red\", \"blue\"]}}, \"required\": [\"color\"], \"additionalProperties\": false}, "
             "\"strict\": true}}}",
             b);
    /* logit_bias is chat's, not a Responses field: refused by name */
    want_400(body, "logit_bias", "not a field");
    snprintf(body, sizeof body,
             "{\"input\": \"Pick a color.\", \"temperature\": 0, \"max_output_tokens\": 60, "
             "\"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"color\", \"schema\": "
             "{\"type\": \"object\", \"properties\": {\"color\": {\"enum\": [\"red\", "
             "\"blue\"]}}, \"required\": [\"color\"], \"additionalProperties\": false}, "
             "\"strict\": true}}}");
    json_t *r;
    char *raw;
    cr_assert_eq(post(body, &r, &raw), 200, "%s", raw);
    free(raw);
    cr_assert_str_eq(json_string_value(json_object_get(
                         json_object_get(json_object_get(r, "text"), "format"), "type")),
                     "json_schema");
    const char *text = item_text(r);
    cr_assert_not_null(text, "%s", json_dumps(r, 0));
    if (!strcmp(json_string_value(json_object_get(r, "status")), "completed")) {
        json_t *v = json_loads(text, 0, NULL);
        cr_assert(json_is_object(v), "%s", text);
        const char *c = json_string_value(json_object_get(v, "color"));
        cr_assert(c && (!strcmp(c, "red") || !strcmp(c, "blue")), "%s", text);
        json_decref(v);
    } else { /* cut at max_output_tokens: what there is begins the schema's JSON */
        cr_assert_eq(text[0], '{', "%s", text);
    }
    json_decref(r);
    snprintf(body, sizeof body,
             "{\"input\": \"What time is it?\", \"temperature\": 0, \"max_output_tokens\": 120, "
             "\"tools\": [{\"type\": \"function\", \"name\": \"get_time\", \"parameters\": "
             "{\"type\": \"object\", \"properties\": {\"tz\": {\"enum\": [\"UTC\", \"CET\"]}}, "
             "\"required\": [\"tz\"], \"additionalProperties\": false}}], \"tool_choice\": "
             "{\"type\": \"function\", \"name\": \"get_time\"}}");
    cr_assert_eq(post(body, &r, &raw), 200, "%s", raw);
    free(raw);
    json_t *out = json_object_get(r, "output");
    cr_assert_eq(json_array_size(out), 1, "%s", json_dumps(r, 0));
    json_t *fc = json_array_get(out, 0);
    cr_assert_str_eq(json_string_value(json_object_get(fc, "type")), "function_call");
    cr_assert_str_eq(json_string_value(json_object_get(fc, "name")), "get_time");
    cr_assert(!strncmp(json_string_value(json_object_get(fc, "call_id")), "call_", 5));
    const char *a = json_string_value(json_object_get(fc, "arguments"));
    if (!strcmp(json_string_value(json_object_get(r, "status")), "completed")) {
        json_t *args = json_loads(a, 0, NULL);
        const char *tz = json_string_value(json_object_get(args, "tz"));
        cr_assert(tz && (!strcmp(tz, "UTC") || !strcmp(tz, "CET")), "%s", json_dumps(r, 0));
        json_decref(args);
    } else { /* stories260K may wander in the whitespace JSON allows, to max_output_tokens */
        cr_assert_eq(a[0], '{', "%s", a);
    }
    json_decref(r);
    free(b);
    free(tok);
}

/* A named tool's call streamed: the function_call item's events in order, the argument deltas
 * joining to the done event's arguments, and the same call as the whole response (greedy). */
Test(gateway_responses, a_function_call_whole_and_streamed_says_the_same)
{
    char *tok = setup_hermes();
    const char *req =
        "\"input\": \"What time is it?\", \"temperature\": 0, \"max_output_tokens\": 40, "
        "\"tools\": [{\"type\": \"function\", \"name\": \"get_time\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"tz\": {\"enum\": [\"UTC\", \"CET\"]}}, "
        "\"required\": [\"tz\"], \"additionalProperties\": false}}], \"tool_choice\": "
        "{\"type\": \"function\", \"name\": \"get_time\"}";
    char body[2048];
    snprintf(body, sizeof body, "{%s}", req);
    json_t *whole;
    char *raw;
    cr_assert_eq(post(body, &whole, &raw), 200, "%s", raw);
    free(raw);
    json_t *call = json_array_get(json_object_get(whole, "output"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(call, "type")), "function_call");
    const char *args = json_string_value(json_object_get(call, "arguments"));
    cr_assert(args && args[0] == '{', "%s", json_dumps(whole, 0));

    snprintf(body, sizeof body, "{%s, \"stream\": true}", req);
    gwh_resp r = gwh_curl("/v1/responses", NULL, body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    static const char *const order[] = {"response.created",
                                        "response.in_progress",
                                        "response.output_item.added",
                                        "response.function_call_arguments.delta",
                                        "response.function_call_arguments.done",
                                        "response.output_item.done",
                                        "response.completed"};
    size_t at = 0;
    int seq = 0, deltas = 0;
    gw_buf joined = {0};
    gw_buf_add(&joined, "", 0);
    json_t *completed = NULL, *ev;
    const char *l = r.body;
    char type[64];
    while ((ev = next_event(&l, type, seq))) {
        seq++;
        if (strcmp(type, order[at])) {
            at++;
            cr_assert_lt(at, sizeof order / sizeof *order, "unexpected event %s", type);
            cr_assert_str_eq(type, order[at], "event %d", seq - 1);
        }
        json_t *item = json_object_get(ev, "item");
        if (!strcmp(type, "response.output_item.added")) {
            cr_assert_str_eq(json_string_value(json_object_get(item, "type")), "function_call");
            cr_assert_str_eq(json_string_value(json_object_get(item, "name")), "get_time");
        }
        if (!strcmp(type, "response.function_call_arguments.delta")) {
            deltas++;
            gw_buf_adds(&joined, json_string_value(json_object_get(ev, "delta")));
        }
        if (!strcmp(type, "response.function_call_arguments.done"))
            cr_assert_str_eq(json_string_value(json_object_get(ev, "arguments")), args);
        if (!strcmp(type, "response.output_item.done"))
            cr_assert_str_eq(json_string_value(json_object_get(item, "arguments")), args);
        if (!strcmp(type, "response.completed"))
            completed = json_incref(json_object_get(ev, "response"));
        json_decref(ev);
    }
    cr_assert_eq(at, sizeof order / sizeof *order - 1, "the stream stopped after %s", order[at]);
    cr_assert_gt(deltas, 0);
    cr_assert_str_eq(joined.p, args);
    json_t *c = json_array_get(json_object_get(completed, "output"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(c, "arguments")), args);
    cr_assert_str_eq(json_string_value(json_object_get(c, "name")), "get_time");
    cr_assert_str_eq(json_string_value(json_object_get(completed, "status")),
                     json_string_value(json_object_get(whole, "status")));
    gw_buf_free(&joined);
    json_decref(completed);
    json_decref(whole);
    gwh_resp_free(&r);
    free(tok);
}
