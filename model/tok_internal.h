/* SPDX-License-Identifier: MIT */
/*
 * model/tok_internal.h — the tokenizer's state, shared by the SentencePiece code
 * (tokenizer.c) and the byte-level BPE code (tok_bpe.c). Not a public header.
 */
#ifndef RINGLM_MODEL_TOK_INTERNAL_H
#define RINGLM_MODEL_TOK_INTERNAL_H

#include "model/tokenizer.h"
#include "model/gguf.h"

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

/* The largest vocabulary we accept: far above any Llama (128256), small enough that a
 * corrupt count cannot make us allocate gigabytes. */
#define TOK_MAX_VOCAB (1 << 22)
#define TOK_MAX_PIECE (1 << 16)

struct tok_tokenizer {
    int vocab_size;
    int max_piece_len; /* longest piece actually present (bytes) */
    char **pieces;     /* [vocab] NUL-terminated copies */
    float *scores;     /* [vocab] */
    int32_t *sorted;   /* ids sorted by piece (strcmp), then id: for the lookups in encode */
    int32_t *hash;     /* [hash_mask + 1] ids by piece, open addressing (-1 empty): the
                           lookups in encode; NULL (no memory) falls back to sorted */
    uint32_t hash_mask;
    const char **shown;           /* [vocab] what decode prints after a non-BOS token */
    const char **shown_after_bos; /* [vocab] the same after BOS (leading space stripped) */
    char byte_str[256][2];        /* the raw byte b as a 1-char string */
    int32_t bos, eos;             /* 1 and 2 in llama2.c; from the file in GGUF */
    bool add_bos, add_eos;
    bool no_space_prefix; /* GGUF tokenizer.ggml.add_space_prefix false (Gemma): SentencePiece
                             adds no dummy prefix, and decode keeps a leading space after BOS */
    int32_t byte_id[256]; /* "<0xNN>" token of each byte, -1 when absent */
    int32_t unk;          /* unknown token (GGUF), -1 when none */
    int32_t eot;          /* end of turn (GGUF), -1 when none */
    int context_length;   /* the model's (GGUF <arch>.context_length), 0 when unknown */
    /* ---- byte-level BPE (tokenizer.ggml.model "gpt2"); kind TOK_KIND_SPM leaves these 0 */
    int kind; /* TOK_KIND_SPM or TOK_KIND_BPE */
    /* Special tokens (GGUF control and user-defined tokens) matched in the text before it is
     * encoded, so a chat template's "<|im_start|>" is one token: longest first. */
    int32_t *special;
    int n_special;
    uint8_t special_first[32]; /* bitmap of the bytes a special token starts with */
    struct tok_bpe *bpe;
};

enum { TOK_KIND_SPM = 0, TOK_KIND_BPE = 1 };

/* ---- byte-level BPE's state (tok_bpe.c; tests/tok_reference.h reads it too) */
typedef struct tok_bpe_merge {
    uint64_t key;   /* left id << 32 | right id */
    int32_t rank;   /* position in tokenizer.ggml.merges: lower merges first */
    int32_t result; /* the id of left + right */
} tok_bpe_merge;

struct tok_bpe {
    pcre2_code *re;
    bool ignore_merges;
    bool nfc; /* the text is NFC-normalized first (Qwen's tokenizer.json: normalizer NFC) */
    tok_bpe_merge *merges;
    size_t n_merges;
    int32_t byte_tok[256]; /* the token of each byte's alphabet character */
    char *shown_arena;
};


/* The id of a piece (lowest id when a piece appears twice), or -1. */
int32_t tok_lookup(const tok_tokenizer *t, const char *s);
/* Orders t->sorted[0..n) by piece text (ties by id), the order tok_lookup searches. */
void tok_sort_pieces(tok_tokenizer *t, size_t n);
/* Sets the thread's error detail; returns err. */
int tok_seterr(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether tokens l and r merge: then *key orders the merges (higher first; ties go to the
 * leftmost pair) and *id is the token they become. */
typedef bool tok_pair_fn(void *ctx, int32_t l, int32_t r, double *key, int32_t *id);
/* Merges adjacent pairs of ids[0..*n) best first until none merges, in O(n log n) (a heap
 * of candidate merges over a linked list, tokenizer.c); *n becomes the count left.
 * Returns 0, -ENOMEM or -E2BIG. */
int tok_merge(int32_t *ids, size_t *n, tok_pair_fn *pair, void *ctx);

/* A growing list of token ids. */
typedef struct tok_vec {
    int32_t *v;
    size_t n, cap;
} tok_vec;
int tok_vec_push(tok_vec *v, int32_t id);

/* tok_bpe.c: loads tokenizer.ggml.model "gpt2" (n tokens starting at toks); encodes a
 * fragment of text holding no special token (appended to v). */
int tok_bpe_load(const gguf_file *g, uint64_t n, const void *toks, int vocab_size,
                 tok_tokenizer **out);
int tok_bpe_fragment(const tok_tokenizer *t, const char *text, size_t len, tok_vec *v);
void tok_bpe_free(struct tok_bpe *b);

#endif
