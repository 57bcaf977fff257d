/* SPDX-License-Identifier: MIT */
/*
 * constrain/ tool calls in the pythonic syntax (cst_compile_python_calls): the text is a
 * Python list of keyword calls of the given tools, [get_weather(city="Paris", days=3)], each
 * argument a Python literal of its parameter's schema. Checked both ways: texts accepted and
 * refused byte by byte, and texts drawn at random from the matcher's own masks read back by
 * the gateway's pythonic parser (gateway/gw_tools.c, what serves them) into calls whose
 * arguments all validate against their function's parameters (Debian's python3-jsonschema).
 */
#include "constrain/cst.h"
#include "gateway/gw_tools.h"
#include "tests/constrain_test_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WEATHER                                                                                    \
    "{\"type\":\"object\",\"properties\":{\"city\":{\"enum\":[\"Paris\",\"Oslo\"]},"               \
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7},\"metric\":{\"type\":"            \
    "\"boolean\"},\"note\":{\"type\":[\"string\",\"null\"],\"maxLength\":8},\"tags\":{\"type\":"   \
    "\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"},\"maxItems\":2},"          \
    "\"where\":{\"type\":\"object\",\"properties\":{\"lat\":{\"type\":\"number\"}},"               \
    "\"required\":[\"lat\"],\"additionalProperties\":false}},\"required\":[\"city\"]}"
#define NOW "{\"type\":\"object\",\"properties\":{}}"

static const char *const spec_any =
    "{\"tools\":[{\"name\":\"get_weather\",\"parameters\":" WEATHER "},{\"name\":\"now\","
    "\"parameters\":" NOW "}],\"max_calls\":0}";
static const char *const spec_one =
    "{\"tools\":[{\"name\":\"get_weather\",\"parameters\":" WEATHER "}],\"max_calls\":1}";

static cst_grammar *compile(const char *spec)
{
    cst_grammar *g;
    char err[512];
    int rc = cst_compile_python_calls(spec, strlen(spec), &g, err, sizeof err);
    cr_assert_eq(rc, 0, "%s: %d %s", spec, rc, err);
    return g;
}

Test(constrain_pycalls, python_lists_of_keyword_calls)
{
    cst_grammar *g = compile(spec_any), *one = compile(spec_one);
    cst_vocab *v = ctu_byte_vocab(NULL, 0);
    static const char *const yes[] = {
        "[get_weather(city=\"Paris\")]",
        "[get_weather(city=\"Oslo\", days=3, metric=True, note=None)]",
        "[ get_weather( city = \"Paris\" , note=\"a\\nb\" ), now() ]",
        "[now(), now()]",
        "[get_weather(city=\"Paris\", tags=[\"ab\", \"c\"], where={\"lat\": -1.5})]",
        NULL};
    static const char *const no[] = {
        "[]",                                         /* at least one call */
        "[get_weather()]",                            /* city is required */
        "[get_weather(city=\"Rome\")]",               /* not in its enum */
        "[get_weather(city='Paris')]",                /* one string form: double quotes */
        "[get_weather(city=\"Paris\", days=8)]",      /* above its maximum */
        "[get_weather(city=\"Paris\", metric=true)]", /* JSON's true is no Python literal */
        "[get_weather(city=\"Paris\", x=1)]",         /* no such parameter */
        "[get_weather (city=\"Paris\")]",             /* the name then its parenthesis */
        "[now(a=1)]",
        "[tomorrow()]",
        "get_weather(city=\"Paris\")",
        "[get_weather(city=\"Paris\", where={\"lat\": 1, \"x\": 2})]",
        "[get_weather(city=\"Paris\", note=\"123456789\")]",
        NULL};
    for (const char *const *t = yes; *t; t++)
        cr_expect(ctu_full_match(g, v, *t), "should accept %s", *t);
    for (const char *const *t = no; *t; t++)
        cr_expect(!ctu_full_match(g, v, *t), "should refuse %s", *t);
    cr_expect(ctu_full_match(one, v, "[get_weather(city=\"Oslo\")]"));
    cr_expect(!ctu_full_match(one, v, "[get_weather(city=\"Oslo\"), get_weather(city=\"Oslo\")]"),
              "max_calls 1: one call");
    cr_expect(!ctu_full_match(one, v, "[now()]"), "only the tools given");
    cst_vocab_free(v);
    cst_grammar_free(g);
    cst_grammar_free(one);
}

Test(constrain_pycalls, bad_specs_are_errors)
{
    static const char *const bad[] = {
        "{\"tools\":[]}",
        "not json",
        "{\"tools\":[{\"name\":\"get-weather\",\"parameters\":{}}]}",
        "{\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"a b\":{}}}}]}",
        "{\"tools\":[{\"name\":\"f\",\"parameters\":{\"anyOf\":[{\"type\":\"object\"}]}}]}",
        "{\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"a\":{\"if\":{}}}}}]}",
        NULL};
    for (const char *const *s = bad; *s; s++) {
        cst_grammar *g = NULL;
        char err[512] = "";
        int rc = cst_compile_python_calls(*s, strlen(*s), &g, err, sizeof err);
        cr_expect_eq(rc, -EINVAL, "%s: %d %s", *s, rc, err);
        cr_expect_null(g);
        cr_expect(err[0], "%s: no detail", *s);
    }
}

/* Whatever the masks let through is read back by the gateway's parser as calls (no content)
 * whose arguments validate against their function's parameters. */
Test(constrain_pycalls, drawn_calls_parse_and_validate, .timeout = 120)
{
    if (access("/usr/bin/python3", X_OK) != 0) cr_skip_test("/usr/bin/python3 not installed");
    cst_grammar *g = compile(spec_any);
    cst_vocab *v = ctu_byte_vocab(NULL, 0);
    char dir[] = "/tmp/ringlm-pycalls-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256], out[256], cmd[4096];
    snprintf(path, sizeof path, "%s/calls.jsonl", dir);
    snprintf(out, sizeof out, "%s/bad.txt", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    unsigned seed = 7;
    int n_calls = 0, n_texts = 0;
    for (int k = 0; k < 200 && n_texts < 60; k++) {
        char *t = ctu_draw(g, v, &seed, 160, "\"]}),");
        if (!t) continue;
        n_texts++;
        gw_tool_calls calls = {0};
        cr_assert_eq(gw_tools_parse(GW_TOOLS_PYTHONIC, 0, t, strlen(t), &calls), 0);
        cr_expect_eq(calls.content.len, 0, "content in %s: %.*s", t, (int)calls.content.len,
                     calls.content.p);
        cr_expect_geq(calls.n, 1, "no call in %s", t);
        for (int i = 0; i < calls.n; i++) {
            fprintf(f, "{\"name\": \"%s\", \"args\": %.*s}\n", calls.v[i].name,
                    (int)calls.v[i].args.len, calls.v[i].args.p ? calls.v[i].args.p : "");
            n_calls++;
        }
        gw_tool_calls_free(&calls);
        free(t);
    }
    fclose(f);
    cst_vocab_free(v);
    cst_grammar_free(g);
    cr_log_info("%d texts drawn, %d calls", n_texts, n_calls);
    cr_assert_geq(n_texts, 30);
    snprintf(
        cmd, sizeof cmd,
        "python3 -c '\n"
        "import json, sys, jsonschema\n"
        "schemas = {\"get_weather\": json.loads(sys.argv[2]), \"now\": json.loads(sys.argv[3])}\n"
        "bad = 0\n"
        "for line in open(sys.argv[1]):\n"
        "    try:\n"
        "        r = json.loads(line)\n"
        "        ok = jsonschema.Draft202012Validator(schemas[r[\"name\"]]).is_valid(r[\"args\"])\n"
        "    except ValueError:\n"
        "        ok = False\n"
        "    if not ok:\n"
        "        bad += 1\n"
        "        print(\"invalid:\", line.strip())\n"
        "sys.exit(1 if bad else 0)\n"
        "' %s '%s' '%s' > %s 2>&1",
        path, WEATHER, NOW, out);
    int st = system(cmd);
    char buf[8192] = "";
    FILE *o = fopen(out, "r");
    if (o) {
        size_t r = fread(buf, 1, sizeof buf - 1, o);
        buf[r] = 0;
        fclose(o);
    }
    cr_expect_eq(st, 0, "arguments that do not validate:\n%s", buf);
    unlink(path);
    unlink(out);
    rmdir(dir);
}
