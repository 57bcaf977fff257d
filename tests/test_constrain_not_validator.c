/* SPDX-License-Identifier: MIT */
/*
 * constrain/ JSON Schema `not` beyond values, checked against a validator (Debian's
 * python3-jsonschema): not of types (integer among numbers: a number with a fraction), of
 * bounds, of numbers in enum/const (the open intervals between them), of multipleOf (a
 * remainder automaton over the digits), of patterns and lengths (the complement of the
 * string's automaton), of required keys and of properties, and not of anyOf / allOf / $ref /
 * not, as schemas any of which the instance matches. For each schema: every instance the
 * validator calls valid is accepted byte by byte, every one it calls invalid is refused, and
 * texts drawn at random from the matcher's own masks (whatever it allows) all validate — the
 * compiler is never looser than the schema. What has no exact form is still an error naming
 * `not`.
 */
#include "constrain/cst.h"
#include "tests/constrain_test_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct ncase {
    const char *schema;
    const char *inst[12]; /* canonical texts (json.dumps's form), NULL-terminated */
} ncase;

static const ncase cases[] = {
    {"{\"not\":{\"type\":\"integer\"}}",
     {"1.5", "-0.25", "\"a\"", "null", "1", "1.0", "-3", "[1]", "0.0", NULL}},
    {"{\"type\":\"number\",\"not\":{\"minimum\":5}}",
     {"4", "4.99", "5", "5.0", "7", "-100", "5.01", NULL}},
    {"{\"type\":\"integer\",\"not\":{\"minimum\":-3,\"maximum\":3}}",
     {"-4", "-3", "0", "3", "4", "10", "-10", NULL}},
    {"{\"not\":{\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}}",
     {"0", "10", "5", "\"x\"", "-1", "10.5", "9.5", "0.5", NULL}},
    {"{\"type\":\"number\",\"not\":{\"const\":5}}", {"5", "5.0", "5.00", "4", "6", "5.5", NULL}},
    {"{\"not\":{\"enum\":[1,2.5,\"a\",null]}}",
     {"1", "1.0", "2.5", "2", "3", "\"a\"", "\"b\"", "null", "true", "{}", "[]", NULL}},
    {"{\"type\":\"integer\",\"not\":{\"multipleOf\":3}}",
     {"3", "-6", "0", "4", "-7", "1000", "999", NULL}},
    {"{\"type\":\"number\",\"not\":{\"multipleOf\":2}}",
     {"2", "2.5", "3", "4.0", "-1.5", "0", "-3", NULL}},
    {"{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":0,\"maximum\":100}",
     {"0", "5", "100", "105", "7", "-5", "55", NULL}},
    {"{\"type\":\"string\",\"not\":{\"pattern\":\"^a\"}}",
     {"\"abc\"", "\"bac\"", "\"\"", "\"A\"", "\"a\"", NULL}},
    {"{\"type\":\"string\",\"not\":{\"pattern\":\"[0-9]\"}}",
     {"\"abc\"", "\"a1\"", "\"9\"", "\"x y\"", NULL}},
    {"{\"type\":\"string\",\"maxLength\":3,\"not\":{\"enum\":[\"a\",\"bc\"]}}",
     {"\"a\"", "\"bc\"", "\"b\"", "\"abcd\"", "\"\"", "\"abc\"", NULL}},
    {"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"minLength\":2,\"maxLength\":4}",
     {"\"ab\"", "\"a\"", "\"abcde\"", "\"aB\"", "\"abcd\"", NULL}},
    {"{\"type\":\"object\",\"not\":{\"required\":[\"a\",\"b\"]}}",
     {"{}", "{\"a\": 1}", "{\"b\": 1}", "{\"a\": 1, \"b\": 2}", NULL}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
     "\"not\":{\"properties\":{\"a\":{\"minimum\":10}}}}",
     {"{}", "{\"a\": 5}", "{\"a\": 10}", "{\"a\": 15}", NULL}},
    {"{\"not\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\",\"minimum\":0}]}}",
     {"\"a\"", "1", "-1", "1.5", "null", "0", NULL}},
    {"{\"type\":\"array\",\"not\":{\"minItems\":2}}", {"[]", "[1]", "[1, 2]", NULL}},
    {"{\"not\":{\"type\":\"string\",\"minLength\":2}}", {"\"a\"", "\"ab\"", "1", "\"\"", NULL}},
    {"{\"not\":{\"allOf\":[{\"type\":\"integer\"},{\"maximum\":0}]}}",
     {"0", "-1", "1", "1.5", "\"x\"", NULL}},
    {"{\"not\":{\"type\":\"string\",\"not\":{\"const\":\"x\"}}}", {"\"x\"", "\"y\"", "1", NULL}},
    {"{\"$defs\":{\"pos\":{\"type\":\"integer\",\"minimum\":1}},\"type\":\"integer\","
     "\"not\":{\"$ref\":\"#/$defs/pos\"}}",
     {"0", "-5", "1", "7", NULL}},
    {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"not\":{\"enum\":[0,7]}},"
     "\"s\":{\"type\":\"string\",\"not\":{\"pattern\":\"x$\"}}},\"required\":[\"n\",\"s\"],"
     "\"additionalProperties\":false}",
     {"{\"n\": 1, \"s\": \"ab\"}", "{\"n\": 0, \"s\": \"ab\"}", "{\"n\": 7, \"s\": \"a\"}",
      "{\"n\": 3, \"s\": \"ax\"}", NULL}},
    /* two of them merged (allOf): not (A or B) */
    {"{\"allOf\":[{\"not\":{\"minimum\":10}},{\"not\":{\"type\":\"string\"}}]}",
     {"9", "10", "\"a\"", "null", "-3.5", NULL}},
    /* an enum beside them: its values filtered */
    {"{\"enum\":[1,2,3,\"a\",\"b\"],\"not\":{\"enum\":[2,\"b\"]}}",
     {"1", "2", "3", "\"a\"", "\"b\"", NULL}},
    {"{\"enum\":[1,5,10,\"abc\"],\"minimum\":3,\"maxLength\":2}",
     {"1", "5", "10", "\"abc\"", NULL}},
    {"{\"type\":\"integer\",\"enum\":[3,4,6,7],\"not\":{\"multipleOf\":3}}",
     {"3", "4", "6", "7", NULL}},
    /* lengths beside an anchored pattern: implied (no product), or cutting into it */
    {"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"minLength\":1}",
     {"\"a\"", "\"\"", "\"abc\"", "\"aB\"", NULL}},
    {"{\"type\":\"string\",\"pattern\":\"^[a-f]{2,4}$\",\"minLength\":3,\"maxLength\":9}",
     {"\"ab\"", "\"abc\"", "\"abcd\"", "\"abcde\"", NULL}},
    /* not oneOf: none of them, or two or more */
    {"{\"not\":{\"oneOf\":[{\"type\":\"integer\"},{\"minimum\":5}]}}",
     {"1", "7", "5.5", "2.5", "\"x\"", "null", "5", NULL}},
    {"{\"type\":\"object\",\"not\":{\"oneOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]},"
     "{\"properties\":{\"a\":{\"const\":1}},\"required\":[\"a\"]}]}}",
     {"{}", "{\"a\": 1}", "{\"a\": 2}", "{\"b\": 0}", "{\"a\": 2, \"b\": 0}", NULL}},
    {"{\"type\":\"string\",\"not\":{\"oneOf\":[{\"const\":\"a\"},{\"const\":\"b\"}],"
     "\"maxLength\":3}}",
     {"\"a\"", "\"b\"", "\"c\"", "\"abcd\"", NULL}},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", (unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

Test(constrain_not_validator, accepted_exactly_what_the_validator_says, .timeout = 120)
{
    if (access("/usr/bin/python3", X_OK) != 0) cr_skip_test("/usr/bin/python3 not installed");
    char dir[] = "/tmp/ringlm-notv-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256], out[256], cmd[4096];
    snprintf(path, sizeof path, "%s/cases.jsonl", dir);
    snprintf(out, sizeof out, "%s/bad.txt", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cst_vocab *v = ctu_byte_vocab(NULL, 0);
    unsigned seed = 12345;
    int n_lines = 0, n_drawn = 0;
    for (size_t i = 0; i < N_CASES; i++) {
        cst_grammar *g;
        char err[512];
        int rc =
            cst_compile_json_schema(cases[i].schema, strlen(cases[i].schema), &g, err, sizeof err);
        cr_assert_eq(rc, 0, "%s: %d %s", cases[i].schema, rc, err);
        /* given: whether accepted, for the validator to agree */
        for (const char *const *t = cases[i].inst; *t; t++) {
            fprintf(f, "{\"schema\": %s, \"text\": ", cases[i].schema);
            put_json_string(f, *t);
            fprintf(f, ", \"accepted\": %s, \"drawn\": false}\n",
                    ctu_full_match(g, v, *t) ? "true" : "false");
            n_lines++;
        }
        /* drawn: must validate */
        for (int k = 0; k < 40; k++) {
            char *t = ctu_draw(g, v, &seed, 48, "\"]},");
            if (!t) continue;
            fprintf(f, "{\"schema\": %s, \"text\": ", cases[i].schema);
            put_json_string(f, t);
            fprintf(f, ", \"accepted\": true, \"drawn\": true}\n");
            free(t);
            n_lines++;
            n_drawn++;
        }
        cst_grammar_free(g);
    }
    cst_vocab_free(v);
    fclose(f);
    cr_log_info("%d texts, %d drawn from the masks", n_lines, n_drawn);
    cr_assert_gt(n_drawn, (int)N_CASES * 20, "too few texts drawn: %d", n_drawn);
    snprintf(cmd, sizeof cmd,
             "python3 -c '\n"
             "import json, sys, jsonschema\n"
             "bad = 0\n"
             "for line in open(sys.argv[1]):\n"
             "    r = json.loads(line)\n"
             "    try:\n"
             "        inst = json.loads(r[\"text\"])\n"
             "        ok = jsonschema.validators.validator_for(r[\"schema\"])(r[\"schema\"])"
             ".is_valid(inst)\n"
             "    except ValueError:\n"
             "        ok = False\n"
             "    if ok != r[\"accepted\"]:\n"
             "        bad += 1\n"
             "        print(\"valid\" if ok else \"invalid\", \"but\", \"accepted\" if "
             "r[\"accepted\"] else \"refused\", \"(drawn)\" if r[\"drawn\"] else \"\", "
             "json.dumps(r[\"schema\"]), r[\"text\"])\n"
             "sys.exit(1 if bad else 0)\n"
             "' %s > %s 2>&1",
             path, out);
    int st = system(cmd);
    char buf[8192] = "";
    FILE *o = fopen(out, "r");
    if (o) {
        size_t r = fread(buf, 1, sizeof buf - 1, o);
        buf[r] = 0;
        fclose(o);
    }
    cr_expect_eq(st, 0, "the validator disagrees:\n%s", buf);
    unlink(path);
    unlink(out);
    rmdir(dir);
}

static void expect_not_error(const char *s)
{
    cst_grammar *g = NULL;
    char err[512] = "";
    cr_expect_eq(cst_compile_json_schema(s, strlen(s), &g, err, sizeof err), -EINVAL, "%s: %s", s,
                 err);
    cr_expect_null(g);
    cr_expect(strstr(err, "'not'") != NULL, "%s: the error names 'not': %s", s, err);
}

/* Where no exact complement is built the schema is refused, naming `not` and its pointer. */
Test(constrain_not_validator, what_has_no_exact_complement_is_an_error)
{
    expect_not_error("{\"type\":\"number\",\"not\":{\"multipleOf\":0.5}}");
    expect_not_error("{\"not\":{\"items\":{\"type\":\"string\"}}}");
    expect_not_error("{\"not\":{\"additionalProperties\":false}}");
    expect_not_error("{\"not\":{\"format\":\"date\"}}");
    expect_not_error("{\"type\":\"array\",\"not\":{\"const\":[]}}");
    cst_grammar *g = NULL;
    char err[512] = "";
    const char *s = "{\"properties\":{\"x\":{\"not\":{\"uniqueItems\":true}}}}";
    cr_expect_eq(cst_compile_json_schema(s, strlen(s), &g, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "keyword 'not' at /properties/x"), "the pointer: %s", err);
}
