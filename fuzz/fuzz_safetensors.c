/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the safetensors reader (model/safetensors.c), a checkpoint file's header
 * and offsets as untrusted input.
 * fuzz-sources: model/safetensors.c
 * fuzz-libs: -ljansson
 *
 * The input is a whole file. Whatever opens must describe only bytes inside it: every
 * tensor's data is read end to end (so ASan sees a tensor the checks let run past the
 * buffer), and the size each one claims is its shape times its dtype.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a copy of exactly size bytes, so reading one past the end is caught */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    st_set *s;
    if (st_open_mem(buf, size, "fuzz.safetensors", &s) == 0) {
        volatile unsigned sum = 0;
        for (size_t i = 0; i < st_count(s); i++) {
            const st_tensor *t = st_at(s, i);
            if (t->bytes != t->n_elems * st_dtype_size(t->dtype)) abort();
            if (st_find(s, t->name) != t) abort();
            const uint8_t *p = t->data;
            for (uint64_t k = 0; k < t->bytes; k++) sum += p[k];
        }
        (void)sum;
        st_close(s);
    }
    free(buf);
    return 0;
}
