/* SPDX-License-Identifier: MIT */
/*
 * model/spm_proto.h — a SentencePiece tokenizer.model (the serialized ModelProto of
 * sentencepiece_model.proto, proto2) read as untrusted input: what llama.cpp's converter
 * takes from it (convert_hf_to_gguf.py, _create_vocab_sentencepiece) and what decides
 * whether ringlm's SentencePiece tokenizer can run it.
 *
 *   ModelProto      pieces = 1 (repeated SentencePiece), trainer_spec = 2,
 *                   normalizer_spec = 3
 *   SentencePiece   piece = 1 (string), score = 2 (float), type = 3 (enum, default NORMAL:
 *                   NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6)
 *   TrainerSpec     model_type = 3 (UNIGRAM 1 default, BPE 2, WORD 3, CHAR 4),
 *                   treat_whitespace_as_suffix = 24, byte_fallback = 35, unk_id = 40 (0),
 *                   bos_id = 41 (1), eos_id = 42 (2), pad_id = 43 (-1)
 *   NormalizerSpec  name = 1, precompiled_charsmap = 2, add_dummy_prefix = 3 (true),
 *                   remove_extra_whitespaces = 4 (true), escape_whitespaces = 5 (true)
 *
 * Other fields are skipped by their wire type. A small reader rather than protoc-c's
 * generated code: ten fields of three messages, every length checked against what is left
 * of its enclosing message, and no code generator in the build (it is fuzzed:
 * fuzz/fuzz_spm_proto.c).
 *
 * Errors: 0 or a negative errno (-EINVAL for a malformed or truncated file, -ENOMEM,
 * -errno of open/read) with spm_errmsg() naming the file, the field and the byte offset.
 */
#ifndef RINGLM_MODEL_SPM_PROTO_H
#define RINGLM_MODEL_SPM_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* SentencePiece's piece types (the same numbers as llama.cpp's token types) */
enum {
    SPM_NORMAL = 1,
    SPM_UNKNOWN = 2,
    SPM_CONTROL = 3,
    SPM_USER_DEFINED = 4,
    SPM_UNUSED = 5,
    SPM_BYTE = 6
};
/* TrainerSpec.model_type */
enum { SPM_UNIGRAM = 1, SPM_BPE = 2, SPM_WORD = 3, SPM_CHAR = 4 };

/* At most this many pieces (the GGUF vocabulary's bound) and bytes per piece. */
#define SPM_MAX_PIECES      (1 << 22)
#define SPM_MAX_PIECE_BYTES 1024

typedef struct spm_model {
    size_t n_pieces;
    char **pieces; /* NUL-terminated copies ("▁" for spaces), none empty */
    size_t *lens;
    float *scores;
    int32_t *types; /* SPM_NORMAL ... SPM_BYTE */
    /* TrainerSpec (its defaults where the file leaves a field out) */
    int model_type;
    bool byte_fallback, treat_whitespace_as_suffix;
    int32_t unk_id, bos_id, eos_id, pad_id; /* -1: none */
    /* NormalizerSpec */
    char normalizer[64]; /* its name ("identity", "nmt_nfkc", ...); "" when absent */
    bool has_charsmap;   /* a precompiled normalization map is present */
    bool add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces;
} spm_model;

/* Parses len bytes of a ModelProto; name is the file named in errors. */
int spm_parse(const void *buf, size_t len, const char *name, spm_model **out);
/* Reads and parses the file path. */
int spm_load(const char *path, spm_model **out);
void spm_free(spm_model *m);

/* The detail of the last error on this thread. */
const char *spm_errmsg(void);

#endif
