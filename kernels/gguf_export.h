/* SPDX-License-Identifier: MIT */
/*
 * kernels/gguf_export.h — an engine model (float32: synthetic or llama2.c) written as a GGUF
 * file with the quantization kernels (ringlm-mkmodel --format gguf), through model/'s writer.
 *
 * Errors: gw_export_model returns 0 or a negative errno with eng_errmsg() set (a failure of
 * the writer is wrapped into it).
 */
#ifndef RINGLM_KERNELS_GGUF_EXPORT_H
#define RINGLM_KERNELS_GGUF_EXPORT_H

#include "model/gguf_write.h"

#include <stddef.h>

typedef struct gw_export_opts {
    const char *type;   /* every matrix in one type (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1
                         * IQ4_NL IQ4_XS Q2_K Q3_K Q4_K Q5_K Q6_K), or one of llama.cpp's
                         * mixes (Q4_K_M, Q3_K_M, ...: written in F32, then re-quantized by
                         * gguf_requant, whose table gives each tensor its type) */
    const char *arch;   /* "llama" (default), "qwen2" (adds synthetic Q/K/V biases), "qwen3"
                       * (synthetic per-head Q/K norms), "gemma2" (synthetic norms after
                       * attention and FFN, tied classifier) or "gemma3" (both) */
    int sliding_window; /* attention.sliding_window to write (gemma: its local layers'; llama:
                         * every layer's, as Mistral 7B v0.1); 0: gemma2's 4096, gemma3's
                         * 1024, none for the others */
    int head_dim;       /* Q/K/V head size; 0: dim / n_heads. Another size (Qwen3's 128 over a
                       * width of 1024 and 16 heads) generates the attention matrices in that
                       * shape from the synthetic formula: synthetic models only */
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

#endif
