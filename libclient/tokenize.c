/* SPDX-License-Identifier: MIT */
/*
 * libclient/tokenize.c — the exported tokenizer API (ringlm_tokenizer_*, ringlm_tokenize,
 * ringlm_token_text, ringlm_detokenize; ringlm.h is the manual): a thin layer over
 * model/tokenizer.h that checks its arguments and turns model/'s error detail into
 * ringlm_errdetail().
 */
#include "ringlm.h"
#include "model/tokenizer.h"
#include "client_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

struct ringlm_tokenizer {
    tok_tokenizer *t;
};

#define NEED_TOK(tok)                                                                              \
    do {                                                                                           \
        if (!(tok)) return client_seterr(-EINVAL, "%s: the tokenizer is NULL", __func__);          \
    } while (0)

int ringlm_tokenizer_load(const char *path, int vocab_size, ringlm_tokenizer **out)
{
    if (out) *out = NULL;
    if (!path || !out) return client_seterr(-EINVAL, "ringlm_tokenizer_load: path or out is NULL");
    if (vocab_size < 0)
        return client_seterr(-EINVAL,
                             "ringlm_tokenizer_load: vocab_size %d (0: what the file "
                             "holds, or the model's vocabulary size)",
                             vocab_size);
    ringlm_tokenizer *tok = malloc(sizeof *tok);
    if (!tok) return client_seterr(-ENOMEM, "out of memory");
    int err = tok_load(path, vocab_size, &tok->t);
    if (err) {
        free(tok);
        return client_seterr(err, "%s", tok_errmsg());
    }
    *out = tok;
    return 0;
}

void ringlm_tokenizer_free(ringlm_tokenizer *tok)
{
    if (!tok) return;
    tok_free(tok->t);
    free(tok);
}

int ringlm_tokenizer_vocab_size(const ringlm_tokenizer *tok)
{
    NEED_TOK(tok);
    return tok_vocab_size(tok->t);
}

int32_t ringlm_tokenizer_bos(const ringlm_tokenizer *tok)
{
    NEED_TOK(tok);
    return tok_bos(tok->t);
}

int32_t ringlm_tokenizer_eos(const ringlm_tokenizer *tok)
{
    NEED_TOK(tok);
    return tok_eos(tok->t);
}

int32_t ringlm_tokenizer_eot(const ringlm_tokenizer *tok)
{
    NEED_TOK(tok);
    return tok_eot(tok->t);
}

int ringlm_tokenizer_context_length(const ringlm_tokenizer *tok)
{
    NEED_TOK(tok);
    return tok_context_length(tok->t);
}

int ringlm_tokenizer_add_special(const ringlm_tokenizer *tok)
{
    NEED_TOK(tok);
    return (tok_add_bos(tok->t) ? (int)RINGLM_TOKENIZE_BOS : 0) |
           (tok_add_eos(tok->t) ? (int)RINGLM_TOKENIZE_EOS : 0);
}

size_t ringlm_tokenize_bound(const char *text)
{
    return tok_encode_bound(text);
}

int ringlm_tokenize(const ringlm_tokenizer *tok, const char *text, unsigned flags, int32_t *ids,
                    size_t max_ids)
{
    NEED_TOK(tok);
    if (!text) return client_seterr(-EINVAL, "ringlm_tokenize: text is NULL");
    if (!ids && max_ids) return client_seterr(-EINVAL, "ringlm_tokenize: ids is NULL");
    if (flags & ~(RINGLM_TOKENIZE_BOS | RINGLM_TOKENIZE_EOS | RINGLM_TOKENIZE_SPECIAL))
        return client_seterr(-EINVAL, "ringlm_tokenize: unknown flags 0x%x", flags);
    size_t len = strlen(text);
    if (len > ((size_t)INT_MAX - 3) / 3)
        return client_seterr(-E2BIG, "ringlm_tokenize: %zu bytes of text: at most %d", len,
                             (INT_MAX - 3) / 3);
    int32_t none;
    const bool special = flags & RINGLM_TOKENIZE_SPECIAL;
    const bool bos = (flags & RINGLM_TOKENIZE_BOS) || (special && tok_add_bos(tok->t));
    const bool eos = (flags & RINGLM_TOKENIZE_EOS) || (special && tok_add_eos(tok->t));
    int n = tok_encode(tok->t, text, bos, eos, ids ? ids : &none,
                       max_ids > INT_MAX ? INT_MAX : (int)max_ids);
    return n < 0 ? client_seterr(n, "%s", tok_errmsg()) : n;
}

int ringlm_token_text(const ringlm_tokenizer *tok, int32_t prev, int32_t id, const char **text)
{
    NEED_TOK(tok);
    if (!text) return client_seterr(-EINVAL, "ringlm_token_text: text is NULL");
    *text = tok_decode_bytes(tok->t, prev, id);
    if (!*text)
        return client_seterr(-EINVAL, "token id %d: the vocabulary has %d tokens", id,
                             tok_vocab_size(tok->t));
    return 0;
}

int ringlm_detokenize(const ringlm_tokenizer *tok, const int32_t *ids, size_t n, char *buf,
                      size_t size)
{
    NEED_TOK(tok);
    if (!ids && n) return client_seterr(-EINVAL, "ringlm_detokenize: ids is NULL");
    if (!buf && size) return client_seterr(-EINVAL, "ringlm_detokenize: buf is NULL");
    const tok_tokenizer *t = tok->t;
    const int32_t bos = tok_bos(t), eos = tok_eos(t);
    int32_t prev = bos;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = tok_decode_bytes(t, prev, ids[i]);
        if (!s)
            return client_seterr(-EINVAL, "ids[%zu] is %d: the vocabulary has %d tokens", i, ids[i],
                                 tok_vocab_size(t));
        prev = ids[i];
        if (ids[i] == bos || ids[i] == eos) continue;
        size_t l = strlen(s);
        if (l > (size_t)INT_MAX - len)
            return client_seterr(-E2BIG, "ringlm_detokenize: the text exceeds %d bytes", INT_MAX);
        if (len + l < size)
            memcpy(buf + len, s, l);
        else if (len < size)
            memcpy(buf + len, s, size - 1 - len);
        len += l;
    }
    if (size) buf[len < size ? len : size - 1] = '\0';
    if (size && len >= size)
        return client_seterr(-ENOSPC,
                             "ringlm_detokenize: the text is %zu bytes, the buffer "
                             "holds %zu with its NUL (needs %zu)",
                             len, size, len + 1);
    return (int)len;
}
