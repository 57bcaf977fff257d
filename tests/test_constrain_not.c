/* SPDX-License-Identifier: MIT */
/*
 * constrain/ JSON Schema `not` of values: not {enum: [...]} and not {const: v} take the
 * strings, null and booleans they name out of what the schema allows — exactly (a string is
 * written in json.dumps's one form, so "any string but these" is a finite automaton), beside
 * a type list, an enum of the schema's own and inside objects; arrays and objects among the
 * values taken out are compile errors naming `not` — never a looser grammar (numbers, and
 * strings beside lengths or patterns: tests/test_constrain_not_validator.c). not {not: X}
 * is X.
 */
#include "constrain/cst.h"
#include "tests/constrain_test_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cst_grammar *schema(const char *s)
{
    cst_grammar *g;
    char err[512];
    int rc = cst_compile_json_schema(s, strlen(s), &g, err, sizeof err);
    cr_assert_eq(rc, 0, "schema %s: %d %s", s, rc, err);
    return g;
}

static void check(const char *s, const char *const *yes, const char *const *no)
{
    cst_grammar *g = schema(s);
    cst_vocab *v = ctu_byte_vocab(NULL, 0);
    for (; *yes; yes++) cr_expect(ctu_full_match(g, v, *yes), "%s\nshould accept %s", s, *yes);
    for (; *no; no++) cr_expect(!ctu_full_match(g, v, *no), "%s\nshould refuse %s", s, *no);
    cst_vocab_free(v);
    cst_grammar_free(g);
}

static void expect_error(const char *s, const char *says)
{
    cst_grammar *g = NULL;
    char err[512] = "";
    cr_expect_eq(cst_compile_json_schema(s, strlen(s), &g, err, sizeof err), -EINVAL, "%s: %s", s,
                 err);
    cr_expect_null(g);
    cr_expect(strstr(err, "'not'") && strstr(err, says), "%s: the error names 'not' and %s: %s", s,
              says, err);
}

#define YES(...) ((const char *[]){__VA_ARGS__, NULL})
#define NO(...)  ((const char *[]){__VA_ARGS__, NULL})

Test(constrain_not, not_enum_of_strings_is_any_other_string)
{
    check("{\"type\":\"string\",\"not\":{\"enum\":[\"a\",\"ab\",\"caf\xc3\xa9\",\"\"]}}",
          YES("\"b\"", "\"abc\"", "\"aa\"", "\"caf\"", "\"caf\xc3\xa9s\"", "\"A\"", "\" a\"",
              "\"a\\n\""),
          NO("\"a\"", "\"ab\"", "\"caf\xc3\xa9\"", "\"\"", "1", "null"));
    /* a quote or a backslash in a value: in its one escaped form */
    check("{\"type\":\"string\",\"not\":{\"const\":\"say \\\"hi\\\"\\\\\"}}",
          YES("\"say \\\"hi\\\"\"", "\"say\""), NO("\"say \\\"hi\\\"\\\\\""));
    /* no type: everything else stays */
    check("{\"not\":{\"const\":\"x\"}}", YES("\"y\"", "1", "null", "[\"x\"]", "{\"x\": 1}"),
          NO("\"x\""));
}

Test(constrain_not, not_enum_of_null_and_booleans)
{
    check("{\"type\":[\"boolean\",\"null\",\"integer\"],\"not\":{\"enum\":[true,null]}}",
          YES("false", "3"), NO("true", "null"));
    check("{\"type\":\"boolean\",\"not\":{\"const\":false}}", YES("true"), NO("false"));
    /* numbers among the values do not count where the type has no numbers */
    check("{\"type\":\"string\",\"not\":{\"enum\":[\"no\",1,[1],{\"a\":1}]}}", YES("\"yes\""),
          NO("\"no\""));
}

Test(constrain_not, not_beside_an_enum_and_in_properties)
{
    check("{\"enum\":[\"red\",\"green\",\"blue\",true],\"not\":{\"enum\":[\"green\",true]}}",
          YES("\"red\"", "\"blue\""), NO("\"green\"", "true"));
    check("{\"type\":\"object\",\"properties\":{\"mode\":{\"type\":\"string\",\"not\":{\"enum\":"
          "[\"off\"]}}},\"required\":[\"mode\"],\"additionalProperties\":false}",
          YES("{\"mode\": \"on\"}", "{\"mode\": \"offline\"}"), NO("{\"mode\": \"off\"}", "{}"));
    /* const and enum together: the const, when the enum has it */
    check("{\"type\":\"string\",\"not\":{\"const\":\"a\",\"enum\":[\"a\",\"b\"]}}", YES("\"b\""),
          NO("\"a\""));
    check("{\"type\":\"string\",\"not\":{\"const\":\"a\",\"enum\":[\"b\"]}}", YES("\"a\"", "\"b\""),
          NO("1"));
}

/* not {not: X} is X, at any depth of negation, beside other keywords */
Test(constrain_not, a_double_negation_is_the_schema_itself)
{
    check("{\"not\":{\"not\":{\"type\":\"integer\"}}}", YES("1", "-20"),
          NO("\"a\"", "1.5", "null"));
    check("{\"not\":{\"not\":{\"not\":{\"type\":\"string\"}}}}", YES("1", "null", "[\"a\"]"),
          NO("\"a\""));
    check("{\"type\":\"object\",\"not\":{\"not\":{\"required\":[\"a\"]}}}", YES("{\"a\": 1}"),
          NO("{}", "{\"b\": 1}"));
    check("{\"not\":{\"not\":{\"enum\":[\"x\",2]}}}", YES("\"x\"", "2"), NO("\"y\"", "3"));
    check("{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{\"not\":false}},\"b\":{\"not\":"
          "{\"not\":true}}}}",
          YES("{}", "{\"b\": [1]}"), NO("{\"a\": 1}"));
}

Test(constrain_not, what_cannot_be_enforced_exactly_is_an_error)
{
    expect_error("{\"type\":\"array\",\"not\":{\"const\":[]}}", "arrays or objects");
    expect_error("{\"not\":{\"enum\":[\"a\",{\"b\":1}]}}", "arrays or objects");
    expect_error("{\"type\":\"string\",\"not\":{\"enum\":\"a\"}}", "not an array");
    expect_error("{\"not\":{\"uniqueItems\":true}}", "uniqueItems");
}
