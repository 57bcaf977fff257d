/* SPDX-License-Identifier: MIT */
/*
 * The shared body of the constrain/ compiler fuzz targets: compile arbitrary bytes with one
 * of the compilers; an error must say why; what compiles gets a matcher on a vocabulary of
 * every byte plus a few multi-byte tokens, fed the input's own bytes, mask before each, and
 * the mask must agree with what accepting the token does. Nothing may crash, leak or loop.
 */
#ifndef RINGLM_FUZZ_CONSTRAIN_H
#define RINGLM_FUZZ_CONSTRAIN_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/cst.h"

typedef int (*fuzz_compile_fn)(const char *src, size_t len, cst_grammar **out, char *err,
                               size_t errlen);

#define FUZZ_N_MULTI 8
#define FUZZ_N_TOK   (256 + FUZZ_N_MULTI)

static cst_vocab *fuzz_vocab(void)
{
    static cst_vocab *v;
    if (v) return v;
    static uint8_t bytes[256];
    static const char *multi[FUZZ_N_MULTI] = {"{\"",  "\": ", ", \"", "\"}",
                                              "true", "null", "12",   "\xc3\xa9"};
    const uint8_t *b[FUZZ_N_TOK];
    uint32_t l[FUZZ_N_TOK];
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i, b[i] = &bytes[i], l[i] = 1;
    for (int k = 0; k < FUZZ_N_MULTI; k++)
        b[256 + k] = (const uint8_t *)multi[k], l[256 + k] = (uint32_t)strlen(multi[k]);
    int32_t end = 0;
    if (cst_vocab_from_bytes(b, l, FUZZ_N_TOK, &end, 1, &v)) abort();
    return v;
}

static int fuzz_constrain_run(fuzz_compile_fn compile, const uint8_t *data, size_t size)
{
    cst_grammar *g;
    char err[256];
    err[0] = 0;
    if (compile((const char *)data, size, &g, err, sizeof err)) {
        if (!err[0]) abort(); /* an error always says why */
        return 0;
    }
    cst_vocab *v = fuzz_vocab();
    cst_matcher *m;
    int rc = cst_matcher_create(g, v, &m);
    if (rc == -E2BIG) { /* the start state is over the closure bound: refused, not a stall */
        cst_grammar_free(g);
        return 0;
    }
    if (rc) abort();
    uint32_t mask[(FUZZ_N_TOK + 31) / 32];
    for (size_t i = 0; i < size && i < 64; i++) {
        if (cst_matcher_mask(m, mask)) break;
        bool ok = mask[data[i] >> 5] >> (data[i] & 31) & 1;
        rc = cst_matcher_accept(m, data[i]);
        if (rc && rc != -EINVAL) break; /* over a bound: an error, not a refusal */
        if ((rc == 0) != ok) abort();   /* the mask and accepting disagree */
        if (rc) break;
    }
    cst_matcher_free(m);
    cst_grammar_free(g);
    return 0;
}

#endif
