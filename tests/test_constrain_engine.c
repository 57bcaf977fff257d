/* SPDX-License-Identifier: MIT */
/*
 * constrain/ engine: regular expressions, choices and JSON values accept and refuse the
 * right texts; masks agree token by token with what accepting the token does (on a
 * vocabulary of single bytes, multi-byte tokens and an end token, and on stories260K's);
 * the end token only where the grammar can end; bad and oversized input is a clear error.
 */
#include "constrain/cst.h"
#include "tests/constrain_test_util.h"
#include "model/tokenizer.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/helpers.h"

/* token 0: the end token; 1..255: bytes 1..255; then a few multi-byte tokens */
static const char *const multi[] = {"ab", "abc",  "\"a",   "\": ", "{\"",  "}}",   "12",  "true",
                                    "é",  "\xc3", "\xa9x", "null", ", \"", "aaaa", "\n\n"};
#define N_MULTI (sizeof multi / sizeof multi[0])
#define N_TOK   (256 + (int)N_MULTI)

static cst_vocab *byte_vocab(void)
{
    return ctu_byte_vocab(multi, N_MULTI);
}

static cst_grammar *regex(const char *re)
{
    cst_grammar *g;
    char err[512];
    int rc = cst_compile_regex(re, strlen(re), &g, err, sizeof err);
    cr_assert_eq(rc, 0, "regex %s: %d %s", re, rc, err);
    return g;
}

static void check_regex(const char *re, const char *const *yes, const char *const *no)
{
    cst_vocab *v = byte_vocab();
    cst_grammar *g = regex(re);
    for (; *yes; yes++) cr_expect(ctu_full_match(g, v, *yes), "/%s/ should match \"%s\"", re, *yes);
    for (; *no; no++)
        cr_expect(!ctu_full_match(g, v, *no), "/%s/ should not match \"%s\"", re, *no);
    cst_grammar_free(g);
    cst_vocab_free(v);
}

Test(constrain_regex, classes_repeats_and_alternatives)
{
    check_regex("[a-c]+x{2,3}", (const char *[]){"axx", "abcaxxx", NULL},
                (const char *[]){"x", "ax", "axxxx", "dxx", NULL});
    check_regex("\\d{3}-\\d{4}", (const char *[]){"555-1234", NULL},
                (const char *[]){"55-1234", "555-12345", "555_1234", NULL});
    check_regex("(foo|bar)*baz", (const char *[]){"baz", "foobarfoobaz", NULL},
                (const char *[]){"fooba", "foobaz!", NULL});
    check_regex("^a.c$",
                (const char *[]){"abc",
                                 "a\xc3\xa9"
                                 "c",
                                 NULL},
                (const char *[]){"a\nc", "ac", "abcc", NULL});
    check_regex("(?:x|(?P<n>y))?z", (const char *[]){"z", "xz", "yz", NULL},
                (const char *[]){"xyz", NULL});
    check_regex("[^a]", (const char *[]){"b", "\xc3\xa9", NULL}, (const char *[]){"a", "bb", NULL});
    /* \D is the ASCII complement only: Python's \D refuses other scripts' digits */
    check_regex("\\D", (const char *[]){"x", NULL}, (const char *[]){"1", "\xc3\xa9", NULL});
    check_regex("\\u00e9+|\\x41", (const char *[]){"\xc3\xa9\xc3\xa9", "A", NULL},
                (const char *[]){"e", NULL});
    check_regex("a{0}b", (const char *[]){"b", NULL}, (const char *[]){"ab", NULL});
}

Test(constrain_regex, bad_patterns_are_errors_with_a_reason)
{
    static const char *const bad[] = {"[a-\\d]", "(a",  "a)",   "a{3,2}", "\\1",  "(?=a)", "[b-a]",
                                      "\\p{L}",  "a\\", "[abc", "*a",     "\\bx", "a^b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cst_grammar *g = (cst_grammar *)1;
        char err[256] = "";
        int rc = cst_compile_regex(bad[i], strlen(bad[i]), &g, err, sizeof err);
        cr_expect_eq(rc, -EINVAL, "/%s/: %d", bad[i], rc);
        cr_expect_null(g, "/%s/: no grammar on error", bad[i]);
        cr_expect(strstr(err, "regex") != NULL, "/%s/: the reason names the regex: %s", bad[i],
                  err);
    }
}

Test(constrain_regex, oversized_is_refused_not_built)
{
    const char *re = "((a{1000}){1000}){10}";
    cst_grammar *g;
    char err[256];
    cr_assert_eq(cst_compile_regex(re, strlen(re), &g, err, sizeof err), -E2BIG, "%s", err);
    cr_expect(strstr(err, "too large") != NULL, "%s", err);
}

Test(constrain_choice, exactly_one_of_the_strings)
{
    const char *c[] = {"yes", "no", "not sure"};
    size_t l[] = {3, 2, 8};
    cst_grammar *g;
    char err[128];
    cr_assert_eq(cst_compile_choice(c, l, 3, &g, err, sizeof err), 0, "%s", err);
    cst_vocab *v = byte_vocab();
    cr_expect(ctu_full_match(g, v, "yes"));
    cr_expect(ctu_full_match(g, v, "no"));
    cr_expect(ctu_full_match(g, v, "not sure"));
    cr_expect(!ctu_full_match(g, v, "not"));
    cr_expect(!ctu_full_match(g, v, "yess"));
    cr_expect(!ctu_full_match(g, v, "maybe"));
    cst_grammar_free(g);
    cst_vocab_free(v);
    cr_expect_eq(cst_compile_choice(c, l, 0, &g, err, sizeof err), -EINVAL);
}

/* Every token's mask bit equals whether accepting it succeeds, along a path of texts. */
static void masks_agree(const cst_grammar *g, const cst_vocab *v, const char *path)
{
    size_t words = cst_mask_words(v);
    uint32_t *mask = calloc(words, sizeof *mask);
    cst_matcher *m;
    cr_assert_eq(cst_matcher_create(g, v, &m), 0);
    size_t len = strlen(path);
    for (size_t at = 0; at <= len; at++) {
        cr_assert_eq(cst_matcher_mask(m, mask), 0);
        for (int t = 0; t < cst_vocab_size(v); t++) {
            cst_matcher *probe;
            cr_assert_eq(cst_matcher_create(g, v, &probe), 0);
            cr_assert_eq(cst_matcher_feed(probe, path, at), 0, "the path is accepted up to %zu",
                         at);
            bool ok = cst_matcher_accept(probe, t) == 0;
            bool bit = mask[t >> 5] >> (t & 31) & 1;
            cr_assert_eq(bit, ok, "after %zu bytes of %s: token %d mask %d accept %d", at, path, t,
                         bit, ok);
            cst_matcher_free(probe);
        }
        /* the end token exactly where the text so far is complete */
        cr_assert_eq((bool)(mask[0] & 1), cst_matcher_can_end(m), "end token after %zu bytes", at);
        if (at < len) cr_assert_eq(cst_matcher_feed(m, path + at, 1), 0);
    }
    cst_matcher_free(m);
    free(mask);
}

Test(constrain_mask, agrees_with_accept_token_by_token)
{
    cst_vocab *v = byte_vocab();
    cst_grammar *g;
    char err[256];
    cr_assert_eq(cst_compile_json_value(false, &g, err, sizeof err), 0, "%s", err);
    masks_agree(g, v, "{\"ab\": [12, true, null, \"\xc3\xa9\"], \"c\": {}}");
    cst_grammar_free(g);
    g = regex("(ab|abc)+x?");
    masks_agree(g, v, "ababcx");
    cst_grammar_free(g);
    cst_vocab_free(v);
}

/* Strings with a length bound: each position is its own state, and a token of plain
 * characters is allowed by its length alone where the state takes any character in a row */
Test(constrain_mask, bounded_strings_agree_with_accept)
{
    cst_vocab *v = byte_vocab();
    cst_grammar *g;
    char err[256];
    const char *schema = "{\"type\":\"string\",\"minLength\":2,\"maxLength\":6}";
    cr_assert_eq(cst_compile_json_schema(schema, strlen(schema), &g, err, sizeof err), 0, "%s",
                 err);
    masks_agree(g, v,
                "\"ab\xc3\xa9"
                "c\\nd\"");
    cst_grammar_free(g);
    g = regex(".{0,5}\n");
    masks_agree(g, v, "aaab\xc3\xa9\n");
    cst_grammar_free(g);
    cst_vocab_free(v);
}

Test(constrain_mask, end_token_only_after_the_end_and_nothing_after_it)
{
    cst_vocab *v = byte_vocab();
    cst_grammar *g = regex("ab");
    cst_matcher *m;
    cr_assert_eq(cst_matcher_create(g, v, &m), 0);
    cr_expect_eq(cst_matcher_accept(m, 0), -EINVAL, "EOS before the text is complete");
    cr_assert_eq(cst_matcher_accept(m, 256), 0, "token \"ab\"");
    cr_expect(cst_matcher_is_dead_end(m));
    cr_assert_eq(cst_matcher_accept(m, 0), 0);
    cr_expect(cst_matcher_ended(m));
    uint32_t mask[(N_TOK + 31) / 32];
    cr_assert_eq(cst_matcher_mask(m, mask), 0);
    for (size_t i = 0; i < sizeof mask / sizeof mask[0]; i++) cr_expect_eq(mask[i], 0u);
    cr_expect_eq(cst_matcher_accept(m, 'a'), -EINVAL);
    cst_matcher_free(m);
    cst_grammar_free(g);
    cst_vocab_free(v);
}

/* stories260K's SentencePiece vocabulary: JSON through real pieces and byte fallback */
Test(constrain_mask, stories260k_vocabulary_generates_json_by_masks)
{
    char *path = th_shared_file("models/tok512.bin");
    tok_tokenizer *t;
    cr_assert_eq(tok_load(path, 512, &t), 0, "%s", tok_errmsg());
    free(path);
    cst_vocab *v;
    cr_assert_eq(cst_vocab_from_tokenizer(t, &v), 0);
    cst_grammar *g;
    char err[256];
    const char *schema =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
        "\"integer\",\"minimum\":0}},\"required\":[\"name\",\"age\"],\"additionalProperties\":"
        "false}";
    cr_assert_eq(cst_compile_json_schema(schema, strlen(schema), &g, err, sizeof err), 0, "%s",
                 err);
    const char *text = "{\"name\": \"Lily \xc3\xa9\", \"age\": 3}";
    cst_matcher *m;
    cr_assert_eq(cst_matcher_create(g, v, &m), 0);
    uint32_t *mask = calloc(cst_mask_words(v), sizeof *mask);
    /* generate the text by masks: each step the longest allowed token that continues it */
    size_t at = 0, len = strlen(text);
    while (at < len) {
        cr_assert_eq(cst_matcher_mask(m, mask), 0);
        cr_assert(!(mask[tok_eos(t) >> 5] >> (tok_eos(t) & 31) & 1),
                  "no EOS inside the object (at %zu)", at);
        int best = -1;
        uint32_t best_len = 0;
        for (int id = 0; id < cst_vocab_size(v); id++) {
            uint32_t l;
            const uint8_t *b = cst_vocab_token(v, id, &l);
            if (!(mask[id >> 5] >> (id & 31) & 1) || l == 0 || l > len - at ||
                memcmp(b, text + at, l))
                continue;
            if (l > best_len) best = id, best_len = l;
        }
        cr_assert_geq(best, 0, "some allowed token continues the text at %zu", at);
        cr_assert_eq(cst_matcher_accept(m, best), 0);
        at += best_len;
    }
    cr_assert_eq(cst_matcher_mask(m, mask), 0);
    cr_expect(mask[tok_eos(t) >> 5] >> (tok_eos(t) & 31) & 1, "EOS once the object is closed");
    cr_expect(!(mask[tok_bos(t) >> 5] >> (tok_bos(t) & 31) & 1), "BOS never");
    free(mask);
    cst_matcher_free(m);
    cst_grammar_free(g);
    cst_vocab_free(v);
    tok_free(t);
}

Test(constrain_matcher, a_state_over_the_closure_bound_is_an_error_not_a_stall)
{
    /* 300,000 nested optional copies, all reachable before the first byte */
    cst_grammar *g = regex("((a?){0,1000}){0,300}b");
    cst_vocab *v = byte_vocab();
    cst_matcher *m = NULL;
    cr_expect_eq(cst_matcher_create(g, v, &m), -E2BIG);
    cr_expect_null(m);
    cst_grammar_free(g);
    cst_vocab_free(v);
}
