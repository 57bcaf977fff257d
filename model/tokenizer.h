/* SPDX-License-Identifier: MIT */
/*
 * model/tokenizer.h — the llama2.c tokenizer (tokenizer.bin format), encode and decode
 * exactly as llama2.c run.c does (see ../shared/models/README.md "Tokenizer format").
 *
 * File format (little-endian):
 *     int32 max_token_length
 *     vocab_size times: float32 score, int32 n, n bytes piece (not NUL-terminated)
 * The vocabulary size is not in the file; it comes from the model header. BOS is id 1,
 * EOS is id 2, byte b's fallback token is id b + 3 (piece "<0xNN>").
 *
 * Thread safety: a loaded tokenizer is immutable; any number of threads may encode and
 * decode with it concurrently. Depends only on libc (it is part of libringlm).
 *
 * Errors: functions return 0 / a count, or a negative errno; tok_errmsg() gives a
 * thread-local detail string ("token 37: piece length 900 runs past the end of the file").
 */
#ifndef RINGLM_MODEL_TOKENIZER_H
#define RINGLM_MODEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TOK_BOS 1 /* beginning of sequence (generation stops when it is sampled) */
#define TOK_EOS 2 /* end of sequence (llama2.c files; GGUF files name theirs: tok_bos/tok_eos) */

typedef struct tok_tokenizer tok_tokenizer;

/*
 * Loads a tokenizer file. vocab_size > 0: exactly that many entries are read (the model's
 * vocabulary; trailing bytes are an error). vocab_size == 0: entries are read until the end
 * of the file. Errors: -ENOENT/-EACCES (open), -EINVAL (malformed: tok_errmsg names the
 * token and field), -ENOMEM.
 */
int tok_load(const char *path, int vocab_size, tok_tokenizer **out);
/* The same from a buffer in memory (copied). */
int tok_load_mem(const void *buf, size_t len, int vocab_size, tok_tokenizer **out);
void tok_free(tok_tokenizer *t);

int tok_vocab_size(const tok_tokenizer *t);
/* The raw piece of token id ("<0x0A>" for byte tokens), NULL if id is out of range. */
const char *tok_piece(const tok_tokenizer *t, int32_t id);
float tok_score(const tok_tokenizer *t, int32_t id);

/*
 * Upper bound on the number of tokens tok_encode can produce for text
 * (3 * strlen(text) + 3: BOS, dummy prefix, EOS; an invalid byte can become the 3 bytes of
 * U+FFFD in byte-level BPE).
 */
size_t tok_encode_bound(const char *text);

/*
 * Encodes UTF-8 text as run.c's encode(): optional BOS, the dummy prefix " " when the text
 * is non-empty, one token per code point that is a whole piece (else its bytes' fallback
 * tokens), then repeated merges of the adjacent pair whose concatenation has the highest
 * score (leftmost on ties), optional EOS. Writes at most max ids to out.
 * Returns the number of tokens, or -ENOSPC (max too small), -EINVAL (text NULL, or a byte
 * fallback id outside the vocabulary).
 */
int tok_encode(const tok_tokenizer *t, const char *text, bool bos, bool eos, int32_t *out, int max);

/*
 * The text to print for token next after token prev, as run.c's decode() + safe_printf():
 * after BOS a leading space is stripped; a "<0xNN>" piece becomes the raw byte; a piece
 * that is a single non-printable, non-space byte gives "". Returns a NUL-terminated string
 * owned by the tokenizer, or NULL if next is out of range. (BOS itself is never printed by
 * the generation loop: it stops on BOS.)
 */
const char *tok_decode(const tok_tokenizer *t, int32_t prev, int32_t next);
/* The same without run.c's printing filter: a byte token, or a single-byte piece, gives its
 * byte whatever it is (U+00FC's two byte tokens give its two bytes back), so decoding a
 * sequence gives back the bytes that were encoded. What libringlm exports. */
const char *tok_decode_bytes(const tok_tokenizer *t, int32_t prev, int32_t next);

/*
 * The vocabulary of a GGUF model file: tokenizer.ggml.model "llama" (SentencePiece with
 * scores and byte fallback; U+2581 in pieces is a space) or "gpt2" (byte-level BPE with
 * tokenizer.ggml.merges and the pre-tokenizer tokenizer.ggml.pre names: "llama-bpe" (also
 * "llama3", "llama-v3") for Llama 3, "qwen2" for Qwen2/Qwen3; another is refused by name).
 * BOS, EOS, EOT and add_bos from the file; control tokens decode to "". tok_encode on a GGUF
 * vocabulary first cuts the special tokens (control, user-defined, unknown) out of the text,
 * so a chat template's "<|im_start|>" or "</s>" is its token; BPE encodes each byte that is
 * not valid UTF-8 as U+FFFD (as llama.cpp does) and decodes tokens to their raw bytes (a
 * character split across tokens prints whole once its last token is printed).
 * tok_load does this by itself when the file is GGUF. Errors as tok_load.
 */
int tok_load_gguf(const char *path, int vocab_size, tok_tokenizer **out);
/* BOS and EOS ids (TOK_BOS and TOK_EOS for llama2.c files), and whether prompts start with
 * BOS and end with EOS as llama.cpp's add_special does (tokenizer.ggml.add_bos_token and
 * add_eos_token; where a file says nothing, BOS for SentencePiece and Llama 3's pre-tokenizer
 * when the file names one, EOS never; llama2.c: BOS). */
int32_t tok_bos(const tok_tokenizer *t);
int32_t tok_eos(const tok_tokenizer *t);
/* End of turn (tokenizer.ggml.eot_token_id), -1 when the file names none. */
int32_t tok_eot(const tok_tokenizer *t);
/* Whether this is a byte-level BPE vocabulary (tokenizer.ggml.model "gpt2"). */
bool tok_is_bpe(const tok_tokenizer *t);
bool tok_add_bos(const tok_tokenizer *t);
bool tok_add_eos(const tok_tokenizer *t);
/* The model's context length in tokens, as its GGUF file states it (<arch>.context_length);
 * 0 when the file states none (llama2.c tokenizer.bin, a tokenizer-only GGUF). */
int tok_context_length(const tok_tokenizer *t);

/* The detail of the last error on this thread ("" when none). */
const char *tok_errmsg(void);

#ifdef __cplusplus
}
#endif
#endif
