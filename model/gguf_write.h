/* SPDX-License-Identifier: MIT */
/*
 * model/gguf_write.h — writes GGUF v3 files (ringlm-mkmodel): metadata and tensors are
 * collected in memory, then written in one pass (header, key/values, tensor infos, data at
 * the default 32-byte alignment). The reader is model/gguf.h. Also the vocabulary of a
 * Hugging Face tokenizer.json as GGUF stores it (gw_vocab_from_hf, model/gguf_vocab.c).
 * The engine's model export (kernels/gguf_export.h) writes through this writer.
 *
 * Errors: gw_write and gw_vocab_from_hf return 0 or a negative errno with gw_errmsg() set.
 * Adding entries never fails: an allocation failure is remembered and reported by gw_write.
 */
#ifndef RINGLM_MODEL_GGUF_WRITE_H
#define RINGLM_MODEL_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gguf_writer gguf_writer;

gguf_writer *gw_new(void);
void gw_free(gguf_writer *w);

void gw_str(gguf_writer *w, const char *key, const char *value);
void gw_u32(gguf_writer *w, const char *key, uint32_t value);
void gw_i32(gguf_writer *w, const char *key, int32_t value);
void gw_f32(gguf_writer *w, const char *key, float value);
void gw_bool(gguf_writer *w, const char *key, bool value);
/* Arrays: strings given with their lengths (may hold any bytes), f32 and i32 values. */
void gw_str_arr(gguf_writer *w, const char *key, const char *const *s, const size_t *len, size_t n);
void gw_f32_arr(gguf_writer *w, const char *key, const float *v, size_t n);
void gw_i32_arr(gguf_writer *w, const char *key, const int32_t *v, size_t n);

/* A tensor of n_dims dimensions (ne[0] fastest) and ggml type; data is `bytes` long and
 * taken over (freed by gw_free). */
void gw_tensor(gguf_writer *w, const char *name, int n_dims, const uint64_t *ne, int type,
               void *data, size_t bytes);

/* A tensor whose `bytes` of data fill(ctx, buf, bytes) writes when gw_write reaches it, so
 * an import holds one tensor in memory at a time (ctx stays the caller's). fill returns 0 or
 * a negative errno with gw_errmsg() set, which gw_write returns. */
typedef int (*gw_fill_fn)(void *ctx, void *buf, size_t bytes);
void gw_tensor_fill(gguf_writer *w, const char *name, int n_dims, const uint64_t *ne, int type,
                    size_t bytes, gw_fill_fn fill, void *ctx);
/* A key/value pair as a file holds it (model/gguf.h's reader: scalars, strings, arrays of
 * scalars or strings), copied as it is; arrays of arrays are skipped. */
struct gguf_kv;
void gw_kv_copy(gguf_writer *w, const struct gguf_kv *kv);

int gw_write(gguf_writer *w, const char *path);

/* A vocabulary as GGUF stores it (tokenizer.ggml.*), e.g. read from a Hugging Face
 * tokenizer.json by gw_vocab_from_hf. */
typedef struct gw_vocab {
    const char *model; /* "llama" (SentencePiece) or "gpt2" (byte-level BPE) */
    const char *pre;   /* gpt2: tokenizer.ggml.pre ("llama-bpe", "qwen2") */
    size_t n;          /* = the model's vocab_size */
    char **tokens;     /* pieces as the file stores them ("▁" for SentencePiece spaces) */
    size_t *lens;
    float *scores;
    int32_t *types; /* llama.cpp's token types */
    char **merges;  /* gpt2: "LEFT RIGHT" */
    size_t n_merges;
    int32_t bos, eos, eot, eom, unk, sep, pad, cls, mask; /* -1: none */
    int8_t add_bos, add_eos, add_sep; /* 1, 0, or -1: no key (the loader's default) */
    bool no_space_prefix; /* writes tokenizer.ggml.add_space_prefix false (absent: true) */
    size_t n_listed;      /* tokenizer.json: model.vocab's entries + added_tokens' */
    char *chat_template;  /* NULL: none */
} gw_vocab;

/* Reads tokenizer.json (and tokenizer_config.json when cfg_path is not NULL) into a
 * vocabulary of exactly vocab_size tokens (unused ids padded), with the special tokens as
 * llama.cpp's converter (gguf-py's SpecialVocab) finds them:
 *   - BOS, EOS, UNK, SEP, PAD, CLS, MASK: tokenizer_config.json's <typ>_token (a string or
 *     {"content": ...}) as the id of the first of tokenizer.json's added_tokens with that
 *     content, else config.json's <typ>_token_id (or its text_config's); a CLS token stands in
 *     for a missing BOS, a SEP token for a missing EOS; CLS is found but, as there, not
 *     written;
 *   - add_bos_token / add_eos_token / add_sep_token: tokenizer.json's post_processor
 *     (TemplateProcessing: a special token leading `single` adds BOS, one trailing it adds EOS
 *     — one that is not the configured EOS becomes EOS and the old one EOT —, one between A
 *     and B in `pair` adds SEP; RobertaProcessing adds all three), then tokenizer_config.json's
 *     add_<typ>_token where it is a boolean; left unset (no key: the loader's default) where
 *     neither says;
 *   - EOT: as above, else the first of <|eot_id|>, <|im_end|>, <|end|> present;
 * and the chat template. Only ids inside the vocabulary are taken. Returns 0 or -errno with
 * gw_errmsg(). */
int gw_vocab_from_hf(const char *tok_path, const char *cfg_path, int vocab_size, gw_vocab **out);
/* The same with a checkpoint's config.json (config_path; NULL: none) for the ids the
 * tokenizer's files leave out. */
int gw_vocab_from_hf_config(const char *tok_path, const char *cfg_path, const char *config_path,
                            int vocab_size, gw_vocab **out);
/* The vocabulary of a checkpoint directory's SentencePiece tokenizer.model (Llama 2, Mistral
 * v0.1, Gemma; where tokenizer.json is there too, the converter reads this one for most
 * architectures: model/hf_import.c), as llama.cpp's converter writes it
 * (_set_vocab_sentencepiece): vocab_size tokens, "[PAD<id>]" where the model has no piece;
 * each piece's score, and its type (USER_DEFINED pieces become NORMAL, as the converter
 * does); added_tokens.json's tokens USER_DEFINED, tokenizer_config.json's
 * added_tokens_decoder CONTROL when special or special-looking ("<|...|>", "<unused...>",
 * "<pad>", "<mask>"), else USER_DEFINED with "▁" written as " ", both scored -1000;
 * the special ids and add_bos/add_eos/add_sep as gw_vocab_from_hf finds them (tokenizer.json
 * where it is there too), BOS/EOS/UNK/PAD else the model's trainer_spec;
 * add_space_prefix false where the normalizer adds no dummy prefix. Refused naming the
 * file: a model that is not BPE, whitespace as a suffix, a normalizer other than identity,
 * extra whitespace removal (neither ringlm nor llama.cpp runs those as SentencePiece does). */
int gw_vocab_from_spm(const char *dir, int vocab_size, gw_vocab **out);
void gw_vocab_free(gw_vocab *v);
/* Keeps the first n tokens (n <= v->n); refused (-EINVAL, naming src) when a token past them
 * is a real one, not a "[PAD<id>]" filler. */
int gw_vocab_trim(gw_vocab *v, size_t n, const char *src);
/* Adds a vocabulary's tokenizer.* keys (a GGUF holding only these is a tokenizer file that
 * tok_load reads). Never fails, as the other adders. */
void gw_vocab_add(gguf_writer *w, const gw_vocab *v);


/* The detail of the writer's (and gw_vocab_from_hf's) last error on this thread. */
const char *gw_errmsg(void);
/* Sets that detail (printf style; an argument may be the detail itself); returns err. */
int gw_seterr(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
