/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the regex compiler on arbitrary bytes, then a matcher of what
 * compiled fed the input's own bytes, masks included (fuzz/fuzz_constrain.h).
 * fuzz-sources: constrain/*.c model/*.c
 * fuzz-libs: -ljansson -lpcre2-8
 */
#include "fuzz/fuzz_constrain.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_constrain_run(cst_compile_regex, data, size);
}
