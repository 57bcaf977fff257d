/* SPDX-License-Identifier: MIT */
/*
 * kernels/gguf_write.h — writes GGUF v3 files (ringlm-mkmodel): metadata and tensors are
 * collected in memory, then written in one pass (header, key/values, tensor infos, data at
 * the default 32-byte alignment). The reader is model/gguf.h.
 *
 * Errors: gw_write returns 0 or a negative errno with eng_errmsg() set. Adding entries
 * never fails: an allocation failure is remembered and reported by gw_write.
 */
#ifndef RINGLM_KERNELS_GGUF_WRITE_H
#define RINGLM_KERNELS_GGUF_WRITE_H

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

int gw_write(gguf_writer *w, const char *path);

#endif

/* ---- exporting a model (ringlm-mkmodel --format gguf) ---- */

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
    int32_t bos, eos, eot, unk; /* -1: none */
    bool add_bos;
    char *chat_template; /* NULL: none */
} gw_vocab;

/* Reads tokenizer.json (and tokenizer_config.json when cfg_path is not NULL: BOS, EOS,
 * add_bos, chat template) into a vocabulary of exactly vocab_size tokens (unused ids padded).
 * Returns 0 or -errno with eng_errmsg(). */
int gw_vocab_from_hf(const char *tok_path, const char *cfg_path, int vocab_size, gw_vocab **out);
void gw_vocab_free(gw_vocab *v);

typedef struct gw_export_opts {
    const char *type; /* F32 F16 BF16 Q8_0 Q4_K Q6_K, or Q4_K_M (Q4_K with Q6_K for
                              * output, attn_v and ffn_down, as llama.cpp's mix) */
    const char *arch; /* "llama" (default) or "qwen2" (adds synthetic Q/K/V biases) */
    /* The vocabulary: vocab_size pieces with scores (a llama2.c tokenizer, pieces with real
     * spaces); NULL: a synthetic SentencePiece vocabulary (unk, BOS, EOS, 256 byte tokens,
     * then "tN" pieces). */
    const char *const *pieces;
    const float *scores;
    const gw_vocab *vocab; /* when not NULL: this vocabulary (pieces/scores unused) */
} gw_export_opts;

/* Writes a (non-lazy, float32) model as GGUF. A matrix whose rows the type's block does not
 * divide falls back to Q8_0, else F16 (named in *note, which the caller prints). Returns 0
 * or -errno with eng_errmsg(). */
struct eng_model;
int gw_export_model(const struct eng_model *m, const char *path, const gw_export_opts *o,
                    char *note, size_t note_len);
