/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the GGUF reader (model/gguf.c), a model file's header, metadata and
 * tensor table as untrusted input.
 * fuzz-sources: model/gguf.c
 *
 * The input is a whole file. Whatever opens must describe only bytes inside it: every
 * key's value and every string of a string array is read end to end, every tensor's data too
 * (so ASan sees what the checks let run past the buffer), a tensor's bytes are its elements
 * in whole blocks of its type, and each name finds itself.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a copy of exactly size bytes, so reading one past the end is caught */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    gguf_file *g;
    if (gguf_open_mem(buf, size, &g) == 0) {
        volatile unsigned sum = 0;
        for (int i = 0; i < gguf_n_kv(g); i++) {
            const gguf_kv *kv = gguf_kv_at(g, i);
            if (gguf_find(g, kv->key) == NULL) abort();
            if (kv->type == GGUF_V_STRING) {
                for (uint64_t k = 0; k < kv->count; k++) sum += kv->value[k];
            } else if (kv->type == GGUF_V_ARRAY && kv->elem_type == GGUF_V_STRING) {
                const void *p = kv->value;
                for (uint64_t e = 0; e < kv->count; e++) {
                    const char *s;
                    size_t len;
                    gguf_str_next(&p, &s, &len);
                    for (size_t k = 0; k < len; k++) sum += (unsigned char)s[k];
                }
            } else if (kv->type == GGUF_V_ARRAY) {
                const uint64_t n = kv->count * gguf_vtype_bytes(kv->elem_type);
                for (uint64_t k = 0; k < n; k++) sum += kv->value[k];
            } else {
                for (size_t k = 0; k < gguf_vtype_bytes(kv->type); k++) sum += kv->value[k];
            }
        }
        for (int i = 0; i < gguf_n_tensors(g); i++) {
            const gguf_tensor *t = gguf_tensor_at(g, i);
            if (gguf_tensor_find(g, t->name) == NULL) abort();
            uint32_t be, bb;
            if (gguf_type_block(t->type, &be, &bb)) {
                uint64_t n = 1;
                for (uint32_t d = 0; d < 4; d++) n *= t->ne[d];
                if (n % be || t->bytes != n / be * bb) abort();
            }
            const uint8_t *p = t->data;
            for (uint64_t k = 0; k < t->bytes; k++) sum += p[k];
        }
        (void)sum;
        gguf_close(g);
    }
    free(buf);
    return 0;
}
