/* SPDX-License-Identifier: MIT */
/*
 * model/tok_bpe.c — byte-level BPE vocabularies of GGUF files (tokenizer.ggml.model
 * "gpt2": Llama 3, Qwen2/Qwen3 and their kin), encoded as llama.cpp and Hugging Face's
 * tokenizers do:
 *
 *   1. special tokens are cut out of the text first (tokenizer.c, shared with SentencePiece);
 *   2. every byte that is not part of valid UTF-8 becomes U+FFFD (as llama.cpp does);
 *   3. the pre-tokenizer the file names (tokenizer.ggml.pre) splits the text into words
 *      with its regular expression — Llama 3's and Qwen2's, run by PCRE2 with Unicode
 *      properties, so no Unicode tables are written here;
 *   4. each word's bytes are mapped to GPT-2's printable byte alphabet, then the adjacent
 *      pair with the lowest merge rank (tokenizer.ggml.merges order; leftmost on ties) is
 *      merged until no pair has a rank; Llama 3 first takes the whole word when it is a
 *      token (Hugging Face's ignore_merges).
 *
 * Qwen's vocabularies (pre-tokenizer qwen2) normalize the text to NFC between 2 and 3, as
 * their tokenizer.json's "normalizer" says and Hugging Face's tokenizers do (utf8proc,
 * Unicode's composition tables); llama.cpp skips that step, so for text that is not already
 * NFC ringlm's ids are Hugging Face's, not llama.cpp's.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/tok_internal.h"

#include <errno.h>
#include <pcre2.h>
#include <utf8proc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PRE_LLAMA3, PRE_QWEN2 };

/* The pre-tokenizers' expressions, as their tokenizer.json files spell them. */
static const char re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_qwen2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                               " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const struct {
    const char *name;
    int pre;
} pre_names[] = {
    {"llama-bpe", PRE_LLAMA3},
    {"llama3", PRE_LLAMA3},
    {"llama-v3", PRE_LLAMA3},
    {"qwen2", PRE_QWEN2},
};

/* ---- GPT-2's byte alphabet ---------------------------------------------------------- */

/* Bytes that print as themselves keep their code point; the others (controls, space,
 * 0x7F..0xA0, 0xAD) take U+0100 upwards in byte order. */
static uint32_t byte_cp(unsigned b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) n++;
    return 0x100 + n;
}

/* UTF-8 of a code point below U+0800 (all this alphabet needs); returns the length. */
static int put_cp(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    o[0] = (char)(0xC0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 when invalid. */
static size_t utf8_valid(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

/* ---- loading -------------------------------------------------------------------------- */

static int cmp_merge(const void *a, const void *b)
{
    const tok_bpe_merge *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

void tok_bpe_free(struct tok_bpe *b)
{
    if (!b) return;
    pcre2_code_free(b->re);
    free(b->merges);
    free(b->shown_arena);
    free(b);
}

/* llama.cpp's token types */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

static int load_pre(const gguf_file *g, struct tok_bpe *b)
{
    const char *pre;
    size_t len;
    int err = gguf_get_str(g, "tokenizer.ggml.pre", &pre, &len);
    if (err == -ENOENT)
        return tok_seterr(-EINVAL, "tokenizer.ggml.pre: absent; a byte-level BPE (gpt2) "
                                   "vocabulary needs its pre-tokenizer named (supported: "
                                   "llama-bpe, llama3, llama-v3 (Llama 3), qwen2)");
    if (err) return tok_seterr(err, "%s", gguf_errmsg());
    int kind = -1;
    for (size_t i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++)
        if (strlen(pre_names[i].name) == len && memcmp(pre_names[i].name, pre, len) == 0)
            kind = pre_names[i].pre;
    if (kind < 0)
        return tok_seterr(-EINVAL,
                          "tokenizer.ggml.pre=\"%.*s\": pre-tokenizer not supported "
                          "(llama-bpe, llama3, llama-v3 (Llama 3), qwen2)",
                          (int)(len > 40 ? 40 : len), pre);
    int ecode;
    PCRE2_SIZE eoff;
    const char *src = kind == PRE_LLAMA3 ? re_llama3 : re_qwen2;
    b->re = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &ecode, &eoff, NULL);
    if (!b->re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        return tok_seterr(-EINVAL,
                          "pre-tokenizer %.*s: PCRE2 cannot compile its expression at "
                          "%zu: %s",
                          (int)len, pre, (size_t)eoff, (const char *)msg);
    }
    (void)pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE); /* faster when there; same result */
    b->ignore_merges = kind == PRE_LLAMA3;
    b->nfc = kind == PRE_QWEN2;
    return 0;
}

static int load_merges(const gguf_file *g, tok_tokenizer *t, struct tok_bpe *b)
{
    uint32_t et;
    uint64_t n;
    const void *p;
    int err = gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, &p);
    if (err == -ENOENT)
        return tok_seterr(-EINVAL, "tokenizer.ggml.merges: absent (a gpt2 vocabulary needs "
                                   "its merges)");
    if (err) return tok_seterr(err, "%s", gguf_errmsg());
    if (et != GGUF_V_STRING || n > (uint64_t)INT32_MAX)
        return tok_seterr(-EINVAL, "tokenizer.ggml.merges: expected strings, found %llu %s",
                          (unsigned long long)n, gguf_vtype_name(et));
    b->merges = malloc((n ? n : 1) * sizeof *b->merges);
    char *buf = malloc((size_t)t->max_piece_len * 2 + 2);
    if (!b->merges || !buf) {
        free(buf);
        return tok_seterr(-ENOMEM, "out of memory");
    }
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        gguf_str_next(&p, &s, &len);
        /* "LEFT RIGHT": the first space after the first byte separates them */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        size_t ll = sp ? (size_t)(sp - s) : 0, rl = sp ? len - ll - 1 : 0;
        if (!sp || rl == 0) {
            free(buf);
            return tok_seterr(-EINVAL,
                              "tokenizer.ggml.merges[%llu] \"%.*s\": expected two "
                              "tokens separated by a space",
                              (unsigned long long)i, (int)(len > 40 ? 40 : len), s);
        }
        int32_t id[3] = {-1, -1, -1};
        if (ll + rl > (size_t)t->max_piece_len * 2) goto not_found; /* longer than any two tokens */
        memcpy(buf, s, ll);
        buf[ll] = '\0';
        id[0] = tok_lookup(t, buf);
        memcpy(buf, sp + 1, rl);
        buf[rl] = '\0';
        id[1] = tok_lookup(t, buf);
        memcpy(buf, s, ll);
        memcpy(buf + ll, sp + 1, rl);
        buf[ll + rl] = '\0';
        id[2] = tok_lookup(t, buf);
    not_found:
        if (id[0] < 0 || id[1] < 0 || id[2] < 0) {
            free(buf);
            return tok_seterr(-EINVAL,
                              "tokenizer.ggml.merges[%llu] \"%.*s\": %s is not in the "
                              "vocabulary",
                              (unsigned long long)i, (int)(len > 40 ? 40 : len), s,
                              id[0] < 0   ? "the left token"
                              : id[1] < 0 ? "the right token"
                                          : "the merged token");
        }
        b->merges[i] = (tok_bpe_merge){(uint64_t)id[0] << 32 | (uint32_t)id[1], (int32_t)i, id[2]};
    }
    free(buf);
    b->n_merges = (size_t)n;
    qsort(b->merges, b->n_merges, sizeof *b->merges, cmp_merge);
    return 0;
}

/* What decode prints for each token: the bytes behind GPT-2's alphabet; user-defined tokens
 * as written; control tokens nothing. */
static int build_shown(tok_tokenizer *t, struct tok_bpe *b, const int32_t *types)
{
    size_t bytes = 0;
    for (int i = 0; i < t->vocab_size; i++) bytes += strlen(t->pieces[i]) + 1;
    char *o = b->shown_arena = malloc(bytes);
    if (!o) return tok_seterr(-ENOMEM, "out of memory");
    int16_t inv[0x144];
    for (int c = 0; c < 0x144; c++) inv[c] = -1;
    for (unsigned by = 0; by < 256; by++) inv[byte_cp(by)] = (int16_t)by;
    for (int i = 0; i < t->vocab_size; i++) {
        const unsigned char *s = (const unsigned char *)t->pieces[i];
        int32_t type = types ? types[i] : TT_NORMAL;
        t->shown[i] = t->shown_after_bos[i] = o;
        if (type == TT_CONTROL || type == TT_UNUSED) {
            *o++ = '\0';
            continue;
        }
        size_t n = strlen((const char *)s);
        for (size_t k = 0; k < n;) {
            size_t l = utf8_valid(s + k, n - k);
            uint32_t cp = 0x7FFFFFFF;
            if (l == 1)
                cp = s[k];
            else if (l == 2)
                cp = (uint32_t)(s[k] & 0x1F) << 6 | (s[k + 1] & 0x3F);
            if (l == 0) l = 1;
            if (type != TT_USER && cp < 0x144 && inv[cp] >= 0) {
                *o++ = (char)inv[cp];
            } else {
                memcpy(o, s + k, l);
                o += l;
            }
            k += l;
        }
        *o++ = '\0';
    }
    return 0;
}

int tok_bpe_load(const gguf_file *g, uint64_t n, const void *toks, int vocab_size,
                 tok_tokenizer **out)
{
    (void)vocab_size;
    *out = NULL;
    uint32_t et;
    uint64_t nt;
    const void *types_p = NULL;
    int err = gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &nt, &types_p);
    if (err && err != -ENOENT) return tok_seterr(err, "%s", gguf_errmsg());
    if (!err && (et != GGUF_V_I32 || nt != n))
        return tok_seterr(-EINVAL, "tokenizer.ggml.token_type: expected %llu i32, found %llu %s",
                          (unsigned long long)n, (unsigned long long)nt, gguf_vtype_name(et));
    tok_tokenizer *t = calloc(1, sizeof *t);
    struct tok_bpe *b = calloc(1, sizeof *b);
    int32_t *types = types_p ? malloc(n * sizeof *types) : NULL;
    if (!t || !b || (types_p && !types)) {
        free(t);
        free(b);
        free(types);
        return tok_seterr(-ENOMEM, "out of memory");
    }
    if (types) memcpy(types, types_p, n * sizeof *types);
    t->kind = TOK_KIND_BPE;
    t->bpe = b;
    t->vocab_size = (int)n;
    t->unk = t->eot = -1;
    size_t bytes = 0;
    const void *p = toks;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        gguf_str_next(&p, &s, &len);
        if (len == 0 || len > TOK_MAX_PIECE || memchr(s, 0, len)) {
            err = tok_seterr(-EINVAL, "tokenizer.ggml.tokens[%llu]: %zu bytes%s (1..%d, no NUL)",
                             (unsigned long long)i, len,
                             len && memchr(s, 0, len) ? " holding a NUL" : "", TOK_MAX_PIECE);
            goto fail;
        }
        bytes += len + 1;
    }
    t->pieces = calloc(n, sizeof *t->pieces);
    t->scores = calloc(n, sizeof *t->scores);
    t->sorted = calloc(n, sizeof *t->sorted);
    t->shown = calloc(n, sizeof *t->shown);
    t->shown_after_bos = calloc(n, sizeof *t->shown_after_bos);
    char *arena = malloc(bytes);
    if (!t->pieces || !t->scores || !t->sorted || !t->shown || !t->shown_after_bos || !arena) {
        free(arena);
        err = tok_seterr(-ENOMEM, "out of memory");
        goto fail;
    }
    p = toks;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        gguf_str_next(&p, &s, &len);
        memcpy(arena, s, len);
        arena[len] = '\0';
        t->pieces[i] = arena;
        arena += len + 1;
        if ((int)len > t->max_piece_len) t->max_piece_len = (int)len;
        t->sorted[i] = (int32_t)i;
    }
    tok_sort_pieces(t, n);
    for (unsigned by = 0; by < 256; by++) {
        char c[4];
        c[put_cp(c, byte_cp(by))] = '\0';
        b->byte_tok[by] = tok_lookup(t, c);
    }
    if ((err = load_pre(g, b)) || (err = load_merges(g, t, b)) || (err = build_shown(t, b, types)))
        goto fail;
    for (int by = 0; by < 256; by++)
        t->byte_id[by] = -1; /* no "<0xNN>" fallback: the alphabet covers every byte */
    *out = t;
    free(types);
    return 0;
fail:
    free(types);
    tok_free(t);
    return err;
}

/* ---- encoding ------------------------------------------------------------------------ */

static int vec_push(tok_vec *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *nv = realloc(v->v, cap * sizeof *nv);
        if (!nv) return tok_seterr(-ENOMEM, "out of memory");
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = id;
    return 0;
}

int tok_vec_push(tok_vec *v, int32_t id)
{
    return vec_push(v, id);
}

static const tok_bpe_merge *find_merge(const struct tok_bpe *b, int32_t l, int32_t r)
{
    uint64_t key = (uint64_t)l << 32 | (uint32_t)r;
    size_t lo = 0, hi = b->n_merges;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (b->merges[mid].key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < b->n_merges && b->merges[lo].key == key ? &b->merges[lo] : NULL;
}

static bool bpe_pair(void *ctx, int32_t l, int32_t r, double *key, int32_t *id)
{
    const tok_bpe_merge *m = find_merge(ctx, l, r);
    if (!m) return false;
    *key = -(double)m->rank;
    *id = m->result;
    return true;
}

/* One pre-tokenized word (raw bytes) to tokens. */
static int bpe_word(const tok_tokenizer *t, const unsigned char *w, size_t n, tok_vec *v,
                    char *mapped, int32_t *sym)
{
    const struct tok_bpe *b = t->bpe;
    if (b->ignore_merges) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) m += (size_t)put_cp(mapped + m, byte_cp(w[i]));
        mapped[m] = '\0';
        int32_t id = tok_lookup(t, mapped);
        if (id >= 0) return vec_push(v, id);
    }
    for (size_t i = 0; i < n; i++) {
        sym[i] = b->byte_tok[w[i]];
        if (sym[i] < 0)
            return tok_seterr(-EINVAL, "byte 0x%02X has no token in this vocabulary", w[i]);
    }
    /* the pair of the lowest rank first, leftmost on ties (tok_merge: O(n log n); a long
     * run of spaces or punctuation is one word) */
    size_t k = n;
    int err = tok_merge(sym, &k, bpe_pair, (void *)b);
    if (err) return err;
    for (size_t i = 0; i < k; i++)
        if (vec_push(v, sym[i])) return -ENOMEM;
    return 0;
}

int tok_bpe_fragment(const tok_tokenizer *t, const char *text, size_t len, tok_vec *v)
{
    /* invalid UTF-8: each such byte becomes U+FFFD */
    size_t cap = len * 3 + 1;
    unsigned char *s = malloc(cap);
    char *mapped = malloc(cap * 2 + 1);
    int32_t *sym = malloc(cap * sizeof *sym);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int err = 0;
    if (!s || !mapped || !sym || !md) {
        err = tok_seterr(-ENOMEM, "out of memory");
        goto out;
    }
    size_t n = 0;
    const unsigned char *in = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t l = utf8_valid(in + i, len - i);
        if (l == 0) {
            memcpy(s + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i++;
        } else {
            memcpy(s + n, in + i, l);
            n += l;
            i += l;
        }
    }
    bool ascii = true;
    for (size_t i = 0; i < n && ascii; i++) ascii = s[i] < 0x80;
    if (t->bpe->nfc && !ascii) { /* ASCII is NFC already */
        utf8proc_uint8_t *nf;
        utf8proc_ssize_t nl =
            utf8proc_map(s, (utf8proc_ssize_t)n, &nf, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (nl < 0) {
            err = tok_seterr(nl == UTF8PROC_ERROR_NOMEM ? -ENOMEM : -EINVAL, "NFC: %s",
                             utf8proc_errmsg(nl));
            goto out;
        }
        free(s);
        s = nf;
        n = (size_t)nl;
        if (n + 1 > cap) { /* a few characters decompose under NFC: the words may be longer */
            cap = n + 1;
            char *m2 = realloc(mapped, cap * 2 + 1);
            if (m2) mapped = m2;
            int32_t *s2 = realloc(sym, cap * sizeof *sym);
            if (s2) sym = s2;
            if (!m2 || !s2) {
                err = tok_seterr(-ENOMEM, "out of memory");
                goto out;
            }
        }
    }
    size_t at = 0;
    while (at < n) {
        int rc = pcre2_match(t->bpe->re, s, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
        size_t mb = n, me = n;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            mb = ov[0];
            me = ov[1];
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            err = tok_seterr(-EINVAL, "pre-tokenizer: PCRE2 match error %d", rc);
            goto out;
        }
        if (mb > at && (err = bpe_word(t, s + at, mb - at, v, mapped, sym)))
            goto out; /* text the expression skipped is a word of its own */
        if (me > mb && (err = bpe_word(t, s + mb, me - mb, v, mapped, sym))) goto out;
        if (me == mb && mb < n) { /* an empty match: step over one character */
            size_t l = utf8_valid(s + mb, n - mb);
            if ((err = bpe_word(t, s + mb, l, v, mapped, sym))) goto out;
            me = mb + l;
        }
        at = me;
    }
out:
    pcre2_match_data_free(md);
    free(s);
    free(mapped);
    free(sym);
    return err;
}
