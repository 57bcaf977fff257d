/* SPDX-License-Identifier: MIT */
/*
 * constrain/ JSON Schema compiler: instances written as json.dumps writes them are
 * accepted, invalid ones refused (never accepted to the end), recursion through $ref, and
 * compile errors that name the keyword and the JSON pointer for what cannot be enforced,
 * for input that is not a schema, for a $ref cycle with no base case and for schemas too
 * large to build.
 */
#include "constrain/cst.h"
#include "tests/constrain_test_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cst_vocab *byte_vocab(void)
{
    return ctu_byte_vocab(NULL, 0);
}

static cst_grammar *schema(const char *s)
{
    cst_grammar *g;
    char err[512];
    int rc = cst_compile_json_schema(s, strlen(s), &g, err, sizeof err);
    cr_assert_eq(rc, 0, "schema %s: %d %s", s, rc, err);
    return g;
}

static bool full_match(const cst_grammar *g, const char *text)
{
    cst_vocab *v = byte_vocab();
    bool ok = ctu_full_match(g, v, text);
    cst_vocab_free(v);
    return ok;
}

static void check(const char *s, const char *const *yes, const char *const *no)
{
    cst_grammar *g = schema(s);
    for (; *yes; yes++) cr_expect(full_match(g, *yes), "%s\nshould accept %s", s, *yes);
    for (; *no; no++) cr_expect(!full_match(g, *no), "%s\nshould refuse %s", s, *no);
    cst_grammar_free(g);
}

#define YES(...) ((const char *[]){__VA_ARGS__, NULL})
#define NO(...)  ((const char *[]){__VA_ARGS__, NULL})

Test(constrain_schema, objects_required_and_additional_properties)
{
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{"
                    "\"type\":\"boolean\"}},"
                    "\"required\":[\"a\"],\"additionalProperties\":false}";
    check(s, YES("{\"a\": 1}", "{\"a\": -7, \"b\": true}", "{ \"a\" :1 ,\n\"b\":false }"),
          NO("{}", "{\"b\": true}", "{\"a\": 1, \"c\": 2}", "{\"a\": 1.5}", "{\"a\": \"1\"}",
             "{\"a\": 1,}", "[1]"));
    /* additional properties allowed: any key but a declared one, after the declared ones */
    const char *t = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                    "\"additionalProperties\":{\"type\":\"string\"}}";
    check(t, YES("{}", "{\"a\": 1, \"x\": \"y\"}", "{\"ab\": \"y\", \"\": \"z\"}"),
          NO("{\"x\": 1}", "{\"x\": \"y\", \"a\": 1}", "{\"a\": 1, \"a\": 2}",
             "{\"a\": 1, \"a\": \"s\"}"));
}

Test(constrain_schema, strings_lengths_patterns_and_formats)
{
    check("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
          YES("\"ab\"", "\"abc\"", "\"\xc3\xa9\xc3\xa9\"", "\"a\\n\""),
          NO("\"a\"", "\"abcd\"", "\"\xc3\xa9\"", "ab"));
    check("{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}", YES("\"abc\""),
          NO("\"aBc\"", "\"\"", "\"abc\\n\""));
    /* pattern is a search unless anchored */
    check("{\"type\":\"string\",\"pattern\":\"ab+c\"}", YES("\"xxabbcyy\"", "\"abc\""),
          NO("\"ac\"", "\"xyz\""));
    /* escapes in the one form json.dumps writes */
    check("{\"type\":\"string\"}", YES("\"a\\\"b\"", "\"\\u001f\"", "\"\xf0\x9f\x98\x80\""),
          NO("\"a\x01\"", "\"\\u0041\"", "\"\\/\"", "\"\xed\xa0\x80\"", "\"\xc0\xaf\""));
    check("{\"type\":\"string\",\"format\":\"date\"}", YES("\"2024-02-28\"", "\"1999-12-31\""),
          NO("\"2024-02-30\"", "\"2024-13-01\"", "\"24-01-01\""));
    check("{\"type\":\"string\",\"format\":\"uuid\"}",
          YES("\"123e4567-e89b-12d3-a456-426614174000\""),
          NO("\"123e4567e89b12d3a456426614174000\""));
}

static size_t grammar_size(const char *s)
{
    cst_grammar *g = schema(s);
    size_t n = cst_grammar_size(g);
    cst_grammar_free(g);
    return n;
}

/* Lengths that every string of a format, or of an anchored pattern, already has add nothing:
 * the string compiles to the format's or the pattern's own program (no product automaton,
 * whose states the compile would pay for); lengths that cut into them are one automaton. */
Test(constrain_schema, lengths_a_format_or_pattern_implies_add_no_automaton)
{
    static const char *const same[][2] = {
        {"{\"type\":\"string\",\"format\":\"uuid\"}",
         "{\"type\":\"string\",\"format\":\"uuid\",\"minLength\":1,\"maxLength\":36}"},
        {"{\"type\":\"string\",\"format\":\"email\"}",
         "{\"type\":\"string\",\"format\":\"email\",\"minLength\":1}"},
        {"{\"type\":\"string\",\"format\":\"uri\"}",
         "{\"type\":\"string\",\"format\":\"uri\",\"maxLength\":2048}"},
        {"{\"type\":\"string\",\"pattern\":\"^[a-f]{2,4}$\"}",
         "{\"type\":\"string\",\"pattern\":\"^[a-f]{2,4}$\",\"minLength\":2,\"maxLength\":4}"},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}",
         "{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"minLength\":1}"},
        {"{\"type\":\"string\",\"pattern\":\"^\\u00e9{2}$\"}",
         "{\"type\":\"string\",\"pattern\":\"^\\u00e9{2}$\",\"maxLength\":2}"},
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        cr_expect_eq(grammar_size(same[i][1]), grammar_size(same[i][0]), "%s", same[i][1]);
    check(same[5][1], YES("\"\xc3\xa9\xc3\xa9\""), NO("\"\xc3\xa9\"", "\"ee\""));
    /* lengths that cut: exact */
    check("{\"type\":\"string\",\"pattern\":\"^[a-f]{2,4}$\",\"minLength\":3}",
          YES("\"abc\"", "\"abcd\""), NO("\"ab\"", "\"abcde\"", "\"abg\""));
    check("{\"type\":\"object\",\"properties\":{\"u\":{\"type\":\"string\",\"format\":\"uuid\","
          "\"maxLength\":35}}}",
          YES("{}"), NO("{\"u\": \"123e4567-e89b-12d3-a456-426614174000\"}", "{\"u\": \"\"}"));
    check("{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"minLength\":3}", YES("\"abc\""),
          NO("\"ab\"", "\"\""));
    /* an escape counts as one character: its lengths stay a product */
    check("{\"type\":\"string\",\"pattern\":\"^a.$\",\"maxLength\":2}", YES("\"a\\\"\"", "\"ab\""),
          NO("\"abc\"", "\"a\""));
    cr_expect_neq(grammar_size("{\"type\":\"string\",\"pattern\":\"^a.$\",\"maxLength\":2}"),
                  grammar_size("{\"type\":\"string\",\"pattern\":\"^a.$\"}"));
}

Test(constrain_schema, numbers_and_bounds)
{
    check("{\"type\":\"integer\",\"minimum\":10,\"maximum\":20}", YES("10", "15", "20"),
          NO("9", "21", "100", "-15", "010", "15.0"));
    check("{\"type\":\"integer\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":3}",
          YES("-2", "0", "2"), NO("-3", "3", "-0"));
    check("{\"type\":\"number\",\"exclusiveMinimum\":0}", YES("0.5", "3", "12.25"),
          NO("0", "0.0", "-1", "-0.5"));
    check("{\"type\":\"number\",\"minimum\":-1.5,\"maximum\":2}",
          YES("-1", "0", "1.999", "2", "2.000"), NO("2.5", "-2", "3"));
    check("{\"type\":\"number\"}", YES("0", "-0.5", "1e10", "2.5E-3"),
          NO("01", ".5", "1.", "+1", "1e"));
}

Test(constrain_schema, enum_const_anyof_oneof_allof)
{
    check("{\"enum\":[\"red\",1,null,{\"a\":[true]}]}",
          YES("\"red\"", "1", "null", "{\"a\": [true]}", "{\"a\":[ true ]}"),
          NO("\"blue\"", "2", "{\"a\": [false]}", "{}"));
    check("{\"type\":\"string\",\"enum\":[\"x\",2]}", YES("\"x\""), NO("2"));
    check("{\"const\":3.5}", YES("3.5"), NO("3.50", "3"));
    check("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}",
          YES("5", "\"a\""), NO("\"ab\"", "true"));
    /* oneOf with alternatives of different types, or told apart by a const */
    check("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}", YES("5", "\"a\""),
          NO("null"));
    check("{\"type\":\"object\",\"oneOf\":[{\"properties\":{\"k\":{\"const\":\"a\"},\"x\":{"
          "\"type\":\"integer\"}},"
          "\"required\":[\"k\"],\"additionalProperties\":false},{\"properties\":{\"k\":{\"const\":"
          "\"b\"}},"
          "\"required\":[\"k\"],\"additionalProperties\":false}]}",
          YES("{\"k\": \"a\", \"x\": 1}", "{\"k\": \"b\"}"),
          NO("{\"k\": \"b\", \"x\": 1}", "{\"k\": \"c\"}"));
    /* oneOf told apart by a key one alternative requires and the other cannot have */
    check("{\"type\":\"object\",\"oneOf\":[{\"properties\":{\"url\":{\"type\":\"string\"}},"
          "\"required\":[\"url\"],\"additionalProperties\":false},{\"properties\":{\"path\":{"
          "\"type\":\"string\"}},\"required\":[\"path\"],\"additionalProperties\":false}]}",
          YES("{\"url\": \"u\"}", "{\"path\": \"p\"}"),
          NO("{}", "{\"url\": \"u\", \"path\": \"p\"}", "{\"path\": \"p\", \"url\": \"u\"}"));
    /* allOf merges: the second part's additionalProperties applies to the first's names */
    check("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
          "\"required\":[\"a\"]},"
          "{\"properties\":{\"a\":{\"minimum\":5},\"b\":{\"type\":\"string\"}},"
          "\"additionalProperties\":false}]}",
          YES("{\"a\": 5}", "{\"a\": 9, \"b\": \"x\"}"),
          NO("{\"a\": 4}", "{\"a\": 5, \"c\": 1}", "{\"b\": \"x\"}"));
}

Test(constrain_schema, arrays_items_prefix_and_counts)
{
    check("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
          YES("[1]", "[1, 2, 3]", "[ 1,2 ]"), NO("[]", "[1, 2, 3, 4]", "[1, \"a\"]", "[1,]"));
    check("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
          "\"items\":false}",
          YES("[]", "[\"a\"]", "[\"a\", 1]"), NO("[1]", "[\"a\", 1, 2]"));
    check("{\"type\":\"array\",\"items\":[{\"type\":\"string\"}],\"additionalItems\":{\"type\":"
          "\"boolean\"}}",
          YES("[\"a\", true, false]"), NO("[\"a\", 1]"));
}

Test(constrain_schema, recursion_through_ref)
{
    const char *s =
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
        "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],"
        "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";
    check(s,
          YES("{\"v\": 1}", "{\"v\": 1, \"kids\": [{\"v\": 2, \"kids\": [{\"v\": 3, \"kids\": "
                            "[{\"v\": 4}]}]}, {\"v\": 5}]}"),
          NO("{\"v\": 1, \"kids\": [{\"v\": 2, \"kids\": [{\"w\": 3}]}]}", "{\"kids\": []}"));
    /* any JSON value, nested */
    cst_grammar *g;
    char err[128];
    cr_assert_eq(cst_compile_json_value(false, &g, err, sizeof err), 0);
    cr_expect(full_match(g, "[{\"a\": [1, {\"b\": null}], \"c\": \"d\"}, -2.5e3, true]"));
    cr_expect(!full_match(g, "[{\"a\": [1, {\"b\": nul}]}]"));
    cst_grammar_free(g);
    cr_assert_eq(cst_compile_json_value(true, &g, err, sizeof err), 0);
    cr_expect(full_match(g, "{\"x\": [1]}"));
    cr_expect(!full_match(g, "[1]"));
    cst_grammar_free(g);
}

static void expect_error(const char *s, int want, const char *const *needles)
{
    cst_grammar *g = (cst_grammar *)1;
    char err[512] = "";
    int rc = cst_compile_json_schema(s, strlen(s), &g, err, sizeof err);
    cr_expect_eq(rc, want, "%s: %d (%s)", s, rc, err);
    cr_expect_null(g);
    for (; *needles; needles++)
        cr_expect(strstr(err, *needles) != NULL, "%s: the error names '%s': %s", s, *needles, err);
}

Test(constrain_schema, what_cannot_be_enforced_is_an_error_naming_keyword_and_pointer)
{
    expect_error("{\"type\":\"object\",\"properties\":{\"x\":{\"if\":{\"type\":\"string\"}}}}",
                 -EINVAL, YES("'if'", "/properties/x"));
    expect_error("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"uniqueItems\":true}",
                 -EINVAL, YES("'uniqueItems'"));
    expect_error("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", -EINVAL,
                 YES("'oneOf'", "may both match"));
    /* ... but only where both are objects: without a type, 5 matches both (required holds
     * vacuously), so a union would accept what oneOf refuses */
    expect_error("{\"oneOf\":[{\"properties\":{\"k\":{\"const\":1}},\"required\":[\"k\"]},"
                 "{\"properties\":{\"k\":{\"const\":2}},\"required\":[\"k\"]}]}",
                 -EINVAL, YES("'oneOf'", "may both match"));
    expect_error("{\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(a\"}}}", -EINVAL,
                 YES("'pattern'", "/properties/a", "regex"));
    expect_error("{\"$ref\":\"http://example.com/s.json\"}", -EINVAL, YES("'$ref'", "local"));
    expect_error("{\"type\":\"string\",\"format\":\"ipv6\"}", -EINVAL, YES("'format'"));
    expect_error("{\"type\":\"number\",\"multipleOf\":0.5}", -EINVAL, YES("'multipleOf'"));
}

/* A string's automaton too large to build is refused naming the keyword that made it so. */
Test(constrain_schema, a_string_automaton_too_large_names_its_keyword)
{
    expect_error("{\"type\":\"object\",\"properties\":{\"e\":{\"type\":\"string\","
                 "\"format\":\"email\",\"maxLength\":254}}}",
                 -EINVAL, YES("'maxLength'", "/properties/e", "too many states"));
}

Test(constrain_schema, bad_input_is_a_clear_error)
{
    expect_error("{\"type\": ", -EINVAL, YES("not JSON"));
    expect_error("[1, 2]", -EINVAL, YES("not an object"));
    expect_error("{\"type\":\"strin\"}", -EINVAL, YES("'type'"));
    /* a $ref cycle with no base case: left recursion, and a required self-reference */
    expect_error("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", -EINVAL,
                 YES("$ref cycle"));
    expect_error(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}",
        -EINVAL, YES("$ref cycle"));
    expect_error("{\"$ref\":\"#/definitions/missing\"}", -EINVAL, YES("points at nothing"));
    expect_error("{\"type\":\"string\",\"minLength\":100000}", -E2BIG, YES("'minLength'"));
    expect_error("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", -EINVAL, YES("no instance"));
    /* a schema of 9 MB is refused before it is parsed */
    size_t n = 9u << 20;
    char *big = malloc(n + 1);
    memset(big, ' ', n);
    big[0] = '{';
    big[n - 1] = '}';
    big[n] = 0;
    expect_error(big, -E2BIG, YES("too large"));
    free(big);
}

Test(constrain_schema, not_in_the_forms_that_remove_types)
{
    check("{\"not\":{\"type\":[\"string\",\"null\"]}}", YES("12", "true", "[1]"),
          NO("\"x\"", "null"));
    check("{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}},\"b\":{\"not\":false}}}",
          YES("{}", "{\"b\": 1}"), NO("{\"a\": 1}"));
    check("{\"not\":{\"enum\":[1]}}", YES("2", "1.5", "\"a\"", "null"), NO("1", "1.0"));
    /* not of required properties: an object without them (anything else has them
     * vacuously, so it is refused) */
    check("{\"type\":\"object\",\"not\":{\"required\":[\"a\"]}}", YES("{}", "{\"b\": 1}"),
          NO("{\"a\": 1}", "{\"b\": 1, \"a\": 2}"));
    check("{\"properties\":{\"a\":{\"type\":\"string\"}},\"not\":{\"anyOf\":[{\"required\":"
          "[\"a\"]},{\"required\":[\"b\"]}]}}",
          YES("{}", "{\"c\": 1}"),
          NO("{\"a\": \"s\"}", "{\"b\": 2}", "{\"c\": 1, \"b\": 2}", "3", "null"));
    check("{\"not\":{\"required\":[\"a\",\"b\"]}}", YES("{}", "{\"a\": 1}", "{\"b\": 1}"),
          NO("{\"a\": 1, \"b\": 2}", "1", "null"));
    expect_error("{\"not\":{}}", -EINVAL, YES("no instance"));
}

/* A property that can never validate is never started: no state where nothing is allowed. */
Test(constrain_schema, no_dead_ends_after_a_key_that_cannot_validate)
{
    cst_grammar *g =
        schema("{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}},\"b\":{\"type\":"
               "\"integer\"}},\"additionalProperties\":false}");
    cst_vocab *v = byte_vocab();
    cst_matcher *m;
    cr_assert_eq(cst_matcher_create(g, v, &m), 0);
    cr_assert_eq(cst_matcher_feed(m, "{\"", 2), 0);
    uint32_t mask[8];
    cr_assert_eq(cst_matcher_mask(m, mask), 0);
    cr_expect(!(mask['a' >> 5] >> ('a' & 31) & 1), "key \"a\" leads nowhere: not allowed");
    cr_expect(mask['b' >> 5] >> ('b' & 31) & 1, "key \"b\" allowed");
    cst_matcher_free(m);
    cst_vocab_free(v);
    cst_grammar_free(g);
}

/* patternProperties: a key a pattern matches takes that pattern's schema (every matching
 * pattern's, and its own when it is named too); other keys take additionalProperties. */
Test(constrain_schema, pattern_properties_give_matching_keys_their_schema)
{
    /* additionalProperties false: only named keys and keys that match */
    check("{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},"
          "\"patternProperties\":{\"^x-\":{\"type\":\"string\"}},\"additionalProperties\":false}",
          YES("{}", "{\"id\": 1}", "{\"x-a\": \"s\"}", "{\"id\": 2, \"x-\": \"\", \"x-b\": \"t\"}"),
          NO("{\"y\": \"s\"}", "{\"x-a\": 1}", "{\"ax-\": \"s\"}", "{\"id\": \"1\"}",
             "{\"id\": 1, \"id\": \"s\"}"));
    /* other keys free (any value), matching keys held to the pattern's schema */
    check("{\"type\":\"object\",\"patternProperties\":{\"^[0-9]+$\":{\"type\":\"boolean\"}}}",
          YES("{}", "{\"1\": true}", "{\"a\": 1, \"12\": false}", "{\"1a\": 3}"),
          NO("{\"1\": 1}", "{\"a\": 1, \"99\": null}"));
    /* two patterns: a key matching both must satisfy both; a named key matching one too */
    check("{\"type\":\"object\",\"properties\":{\"ab\":{\"maximum\":5}},"
          "\"patternProperties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"minimum\":3}},"
          "\"additionalProperties\":{\"type\":\"null\"}}",
          YES("{\"ab\": 4}", "{\"a\": -1}", "{\"b\": 3.5}", "{\"xaby\": 3}", "{\"c\": null}"),
          NO("{\"ab\": 6}", "{\"ab\": 2}", "{\"ab\": 4.5}", "{\"a\": 1.5}", "{\"b\": 2}",
             "{\"xaby\": 2}", "{\"xaby\": 3.5}", "{\"c\": 1}"));
    /* a required key no property names: its pattern's schema */
    check("{\"type\":\"object\",\"required\":[\"n1\"],\"patternProperties\":{\"^n\":{\"type\":"
          "\"integer\"}},\"additionalProperties\":false}",
          YES("{\"n1\": 1}", "{\"n1\": 1, \"n2\": 2}"), NO("{}", "{\"n1\": \"s\"}", "{\"n2\": 2}"));
    /* a pattern that does not compile names the keyword */
    expect_error("{\"patternProperties\":{\"(a\":{\"type\":\"string\"}}}", -EINVAL,
                 YES("'patternProperties'", "(a"));
}
