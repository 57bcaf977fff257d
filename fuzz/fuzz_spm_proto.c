/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the SentencePiece tokenizer.model reader (model/spm_proto.c), the
 * protobuf wire format of an untrusted file.
 * fuzz-sources: model/spm_proto.c
 *
 * The input is a whole file. Whatever parses must hold only what the reader checks: every
 * piece non-empty, NUL-free, at most SPM_MAX_PIECE_BYTES, of a known type, and the special
 * ids inside the pieces (each piece is read end to end, so ASan sees a bad copy).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/spm_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a copy of exactly size bytes, so reading one past the end is caught */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    spm_model *m;
    if (spm_parse(buf, size, "fuzz.model", &m) == 0) {
        if (m->n_pieces == 0) abort();
        for (size_t i = 0; i < m->n_pieces; i++) {
            size_t n = strlen(m->pieces[i]);
            if (n == 0 || n != m->lens[i] || n > SPM_MAX_PIECE_BYTES) abort();
            if (m->types[i] < SPM_NORMAL || m->types[i] > SPM_BYTE) abort();
        }
        const int32_t ids[4] = {m->unk_id, m->bos_id, m->eos_id, m->pad_id};
        for (int i = 0; i < 4; i++)
            if (ids[i] < -1 || ids[i] >= (int64_t)m->n_pieces) abort();
        spm_free(m);
    }
    free(buf);
    return 0;
}
