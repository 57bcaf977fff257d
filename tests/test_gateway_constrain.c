/* SPDX-License-Identifier: MIT */
/*
 * tests/test_gateway_constrain.c — structured output through a real ringlm-gateway and
 * ringlmd (stories260K with its tokenizer): OpenAI's response_format (json_schema,
 * json_object), vLLM's guided_json / guided_regex / guided_choice and structured_outputs, and
 * llama.cpp's json_schema, on both endpoints: every answer that finishes with "stop" validates
 * against its schema (Debian's python3-jsonschema), matches its regex or is one of its choices;
 * a constraint that does not compile is a 400 naming the field with ringlmd's words; two
 * constraints, an unknown response_format type, a GBNF grammar that does not compile are
 * 400s naming the field.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "libclient/ringlm.h"
#include "tests/daemon_constrain_util.h"
#include "tests/daemon_helpers.h"
#include "tests/gateway_helpers.h"

TestSuite(gateway_constrain, .fini = gwh_stop_all, .timeout = 300);

static void setup(void)
{
    gwh_need();
    gwh_need_curl();
    gwh_start_daemon(NULL);
    gwh_start_gateway(NULL);
    gwh_wait_healthy(10000);
}

typedef struct result {
    int status;
    char text[2048], finish[16], param[64], msg[800];
} result;

static result post(bool chat, json_t *body)
{
    result r = {0};
    char *b = json_dumps(body, JSON_COMPACT);
    gwh_resp h = gwh_curl(chat ? "/v1/chat/completions" : "/v1/completions", NULL, b);
    r.status = h.status;
    json_t *j = json_loads(h.body ? h.body : "", 0, NULL);
    json_t *e = json_object_get(j, "error");
    if (e) {
        snprintf(r.param, sizeof r.param, "%s",
                 json_string_value(json_object_get(e, "param")) ?: "");
        snprintf(r.msg, sizeof r.msg, "%s", json_string_value(json_object_get(e, "message")) ?: "");
    }
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    const char *txt =
        chat ? json_string_value(json_object_get(json_object_get(c, "message"), "content"))
             : json_string_value(json_object_get(c, "text"));
    snprintf(r.text, sizeof r.text, "%s", txt ? txt : "");
    snprintf(r.finish, sizeof r.finish, "%s",
             json_string_value(json_object_get(c, "finish_reason")) ?: "");
    json_decref(j);
    gwh_resp_free(&h);
    free(b);
    return r;
}

static json_t *body_of(bool chat, int seed, json_t *bias)
{
    json_t *o = chat ? json_pack("{s:[{s:s, s:s}]}", "messages", "role", "user", "content",
                                 "Tell me about Lily.")
                     : json_pack("{s:s}", "prompt", "Once upon a time");
    json_object_set_new(o, "max_tokens", json_integer(250));
    json_object_set_new(o, "temperature", json_real(1.0));
    json_object_set_new(o, "seed", json_integer(seed));
    if (bias) json_object_set(o, "logit_bias", bias);
    return o;
}

typedef struct variant {
    bool chat;
    const char *field; /* the body's field */
    const char *value; /* its JSON */
    const char *mode;  /* "schema", "regex", "choice" */
    const char *check; /* JSON: the schema, the regex (a string), the choices (a list) */
} variant;

static const variant variants[] = {
    {true, "response_format",
     "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"person\",\"strict\":true,\"schema\":"
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":10},"
     "\"age\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":99}},\"required\":[\"name\","
     "\"age\"],\"additionalProperties\":false}}}",
     "schema",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":10},"
     "\"age\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":99}},\"required\":[\"name\","
     "\"age\"],\"additionalProperties\":false}"},
    {false, "response_format", "{\"type\":\"json_object\"}", "schema", "{\"type\":\"object\"}"},
    {false, "guided_json", "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":3}",
     "schema", "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":3}"},
    {true, "json_schema", "{\"enum\":[\"dog\",\"cat\",1,null]}", "schema",
     "{\"enum\":[\"dog\",\"cat\",1,null]}"},
    {false, "guided_regex", "\"[a-z]+@[a-z]+\\\\.com\"", "regex", "\"[a-z]+@[a-z]+\\\\.com\""},
    {true, "structured_outputs", "{\"regex\":\"(yes|no), [0-9]{2}\"}", "regex",
     "\"(yes|no), [0-9]{2}\""},
    {true, "guided_choice", "[\"happy\",\"sad\",\"very happy\"]", "choice",
     "[\"happy\",\"sad\",\"very happy\"]"},
    {false, "structured_outputs", "{\"choice\":[\"up\",\"down\"]}", "choice", "[\"up\",\"down\"]"},
};
#define N_VARIANTS (int)(sizeof variants / sizeof *variants)

Test(gateway_constrain, every_field_constrains_the_answer)
{
    setup();
    json_t *bias = gwh_whitespace_bias();
    char *lines = NULL;
    size_t cap = 0;
    FILE *mem = open_memstream(&lines, &cap);
    int stopped = 0, total = 0;
    for (int v = 0; v < N_VARIANTS; v++) {
        const variant *x = &variants[v];
        for (int seed = 1; seed <= 3; seed++) {
            json_t *body = body_of(x->chat, seed, bias);
            json_error_t je;
            json_t *val = json_loads(x->value, JSON_DECODE_ANY, &je);
            cr_assert_not_null(val, "%s: %s", x->value, je.text);
            json_object_set_new(body, x->field, val);
            result r = post(x->chat, body);
            json_decref(body);
            cr_assert_eq(r.status, 200, "%s %s: %d %s", x->field, x->value, r.status, r.msg);
            cr_expect(!strcmp(r.finish, "stop") || !strcmp(r.finish, "length"), "%s: %s", x->field,
                      r.finish);
            total++;
            if (strcmp(r.finish, "stop")) continue;
            stopped++;
            json_t *line = json_pack("{s:s, s:o, s:s}", "mode", x->mode, "c",
                                     json_loads(x->check, JSON_DECODE_ANY, NULL), "text", r.text);
            char *t = json_dumps(line, JSON_COMPACT);
            fprintf(mem, "%s\n", t);
            free(t);
            json_decref(line);
        }
    }
    fclose(mem);
    int checked = 0;
    cr_expect_eq(dcu_py_check_lines(gwh_dir(), lines ? lines : "", &checked), 0,
                 "answers that break their constraint");
    cr_expect_eq(checked, stopped);
    cr_expect_geq(stopped, total / 2, "only %d of %d answers finished", stopped, total);
    free(lines);
    json_decref(bias);
}

Test(gateway_constrain, a_bad_constraint_is_a_400_naming_its_field)
{
    setup();
    static const struct {
        bool chat;
        const char *field, *value, *says;
    } bad[] = {
        /* ringlmd's compiler, through the daemon's FINISH detail */
        {true, "response_format",
         "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":"
         "\"object\",\"not\":{\"minProperties\":2}}}}",
         "'not'"},
        {false, "guided_regex", "\"a(b\"", "constraint: "},
        {false, "guided_json", "\"{\\\"type\\\": \"", "constraint: "},
        {true, "json_schema", "{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}",
         "constraint: "},
        {false, "structured_outputs", "{\"json\":{\"type\":\"string\",\"format\":\"ipv6\"}}",
         "format"},
        /* the gateway's own */
        {true, "response_format", "{\"type\":\"xml\"}", "xml"},
        {true, "response_format", "{\"type\":\"json_schema\"}", "schema"},
        {false, "guided_choice", "[]", "non-empty"},
        {false, "structured_outputs", "{\"regex\":\"a\",\"choice\":[\"b\"]}", "more than one"},
        {false, "structured_outputs", "{\"structural_tag\":\"x\"}", "structural_tag"},
        {true, "guided_grammar", "\"root ::= \\\"a\\\" itme\"", "itme"},
        {false, "grammar", "\"root ::= root \\\"a\\\"\"", "left"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *body = body_of(bad[i].chat, 1, NULL);
        json_object_set_new(body, bad[i].field, json_loads(bad[i].value, JSON_DECODE_ANY, NULL));
        result r = post(bad[i].chat, body);
        json_decref(body);
        cr_expect_eq(r.status, 400, "%s %s: %d", bad[i].field, bad[i].value, r.status);
        cr_expect_str_eq(r.param, bad[i].field, "%s: param '%s' (%s)", bad[i].value, r.param,
                         r.msg);
        cr_expect(strstr(r.msg, bad[i].says), "%s %s: message '%s' does not say %s", bad[i].field,
                  bad[i].value, r.msg, bad[i].says);
    }
    /* two fields that each constrain the answer */
    json_t *body = body_of(false, 1, NULL);
    json_object_set_new(body, "guided_regex", json_string("a+"));
    json_object_set_new(body, "response_format", json_pack("{s:s}", "type", "json_object"));
    result r = post(false, body);
    json_decref(body);
    cr_expect_eq(r.status, 400);
    cr_expect(strstr(r.msg, "guided_regex") && strstr(r.msg, "response_format"), "%s", r.msg);
    /* the gateway still serves: a good one after the bad ones */
    body = body_of(true, 1, NULL);
    json_object_set_new(body, "guided_choice", json_pack("[s,s]", "yes", "no"));
    r = post(true, body);
    json_decref(body);
    cr_expect_eq(r.status, 200, "%s", r.msg);
    cr_expect(!strcmp(r.text, "yes") || !strcmp(r.text, "no"), "'%s'", r.text);
}
