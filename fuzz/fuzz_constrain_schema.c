/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the JSON Schema compiler on arbitrary bytes, then a matcher of what
 * compiled fed the input's own bytes (a byte vocabulary), masks included. Any input either
 * compiles or is a clear error; nothing crashes, leaks or loops.
 * fuzz-sources: constrain/*.c model/*.c
 * fuzz-libs: -ljansson -lpcre2-8
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/cst.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static cst_vocab *vocab(void)
{
    static cst_vocab *v;
    if (v) return v;
    static uint8_t bytes[256];
    static const char *multi[] = {"{\"", "\": ", ", \"", "\"}", "true", "null", "12", "\xc3\xa9"};
    const uint8_t *b[264];
    uint32_t l[264];
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i, b[i] = &bytes[i], l[i] = 1;
    for (int k = 0; k < 8; k++)
        b[256 + k] = (const uint8_t *)multi[k], l[256 + k] = (uint32_t)strlen(multi[k]);
    int32_t end = 0;
    if (cst_vocab_from_bytes(b, l, 264, &end, 1, &v)) abort();
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cst_grammar *g;
    char err[256];
    if (cst_compile_json_schema((const char *)data, size, &g, err, sizeof err)) {
        if (!err[0]) abort(); /* an error always says why */
        return 0;
    }
    cst_vocab *v = vocab();
    cst_matcher *m;
    if (cst_matcher_create(g, v, &m)) abort();
    uint32_t mask[(264 + 31) / 32];
    for (size_t i = 0; i < size && i < 64; i++) {
        if (cst_matcher_mask(m, mask)) break;
        bool ok = mask[data[i] >> 5] >> (data[i] & 31) & 1;
        int rc = cst_matcher_accept(m, data[i]);
        if ((rc == 0) != ok) abort(); /* the mask and accepting disagree */
        if (rc) break;
    }
    cst_matcher_free(m);
    cst_grammar_free(g);
    return 0;
}
