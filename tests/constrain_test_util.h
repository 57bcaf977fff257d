/* SPDX-License-Identifier: MIT */
/*
 * tests/constrain_test_util.h — the vocabulary constrain/'s tests compile against (header
 * only, so it is not linked into every test program): token 0 is the end token, tokens
 * 1..255 the bytes 1..255, then the file's own multi-byte tokens; whether a text is
 * accepted whole; and a GBNF grammar that is small but costly to analyse.
 */
#ifndef RINGLM_TESTS_CONSTRAIN_TEST_UTIL_H
#define RINGLM_TESTS_CONSTRAIN_TEST_UTIL_H

#include "constrain/cst.h"

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
