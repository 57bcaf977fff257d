/* SPDX-License-Identifier: MIT */
/*
 * model/tokenizer.c — llama2.c tokenizer.bin: load (untrusted file), encode, decode.
 * The algorithms follow llama2.c run.c step for step so that ids and printed text are
 * byte-identical to the reference; the file is validated field by field first.
 */
#include "model/tokenizer.h"
#include "model/gguf.h"
#include "model/tok_internal.h"
#include "common/errdetail.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ------------------------------------------------------------------------ */

ERRDETAIL_DEFINE(tok_err);

const char *tok_errmsg(void)
{
    return tok_err.msg;
}

/* A function, not errdetail_set's macro: tok_bpe.c reports through it too. */
int tok_seterr(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    errdetail_vset(&tok_err, err, fmt, ap);
    va_end(ap);
    return err;
}

/* ---- loading ------------------------------------------------------------------------ */

/* qsort_r (glibc): a context argument instead of a global, so loads may run in parallel. */
static int cmp_piece_id(const void *a, const void *b, void *ctx)
{
    const tok_tokenizer *t = ctx;
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    int c = strcmp(t->pieces[ia], t->pieces[ib]);
    if (c) return c;
    return (ia > ib) - (ia < ib);
}

static uint32_t piece_hash(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* Also builds the hash index of the pieces: encoding looks up a piece for every candidate
 * merge, and the binary search's ~15 strcmps a lookup made a 1 KB prompt with Llama 2's
 * 32,000 pieces cost the gateway over 1 ms (perf/gw_prep_bench: 60% of it in the lookups). */
void tok_sort_pieces(tok_tokenizer *t, size_t n)
{
    qsort_r(t->sorted, n, sizeof *t->sorted, cmp_piece_id, t);
    free(t->hash);
    t->hash = NULL;
    size_t cap = 64;
    while (cap < 2 * n) cap *= 2;
    int32_t *h = malloc(cap * sizeof *h);
    if (!h) return; /* tok_lookup searches sorted */
    memset(h, 0xff, cap * sizeof *h);
    const uint32_t mask = (uint32_t)(cap - 1);
    for (size_t id = 0; id < n; id++) { /* ascending: a repeated piece keeps its lowest id */
        uint32_t i = piece_hash(t->pieces[id]) & mask;
        while (h[i] >= 0 && strcmp(t->pieces[h[i]], t->pieces[id]) != 0) i = (i + 1) & mask;
        if (h[i] < 0) h[i] = (int32_t)id;
    }
    t->hash = h;
    t->hash_mask = mask;
}

/* run.c's safe_printf: a single byte that is neither printable nor whitespace prints
 * nothing. Written with explicit ranges (the "C" locale's isprint/isspace) so a process
 * locale cannot change what is printed. */
static const char *printable(const char *p)
{
    unsigned char c = (unsigned char)p[0];
    if (c != 0 && p[1] == '\0') {
        bool is_print = c >= 0x20 && c <= 0x7e;
        bool is_space = c == ' ' || (c >= '\t' && c <= '\r');
        if (!is_print && !is_space) return "";
    }
    return p;
}

/* run.c's decode() for one piece (after the BOS strip): "<0xNN>" becomes the raw byte. */
static const char *shown_piece(tok_tokenizer *t, const char *piece)
{
    unsigned char byte_val;
    if (sscanf(piece, "<0x%02hhX>", &byte_val) == 1) piece = t->byte_str[byte_val];
    return printable(piece);
}

static uint32_t rd_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int tok_load_mem(const void *buf, size_t len, int vocab_size, tok_tokenizer **out)
{
    const unsigned char *p = buf, *end = p + len;
    int err = -ENOMEM;
    *out = NULL;
    if (!buf && len) return tok_seterr(-EINVAL, "tokenizer buffer is NULL");
    if (vocab_size < 0 || vocab_size > TOK_MAX_VOCAB)
        return tok_seterr(-EINVAL, "vocab_size=%d: must be 0 (read to end) or 1..%d", vocab_size,
                          TOK_MAX_VOCAB);
    if (len < 4)
        return tok_seterr(-EINVAL,
                          "tokenizer file is %zu bytes: the max_token_length header "
                          "needs 4",
                          len);
    int32_t max_token_length = (int32_t)rd_u32(p);
    p += 4;
    if (max_token_length <= 0 || max_token_length > TOK_MAX_PIECE)
        return tok_seterr(-EINVAL, "header max_token_length=%d: must be 1..%d", max_token_length,
                          TOK_MAX_PIECE);

    /* First pass: count and validate entries, so allocation sizes come from checked data. */
    int n = 0;
    size_t piece_bytes = 0;
    for (const unsigned char *q = p; vocab_size ? n < vocab_size : q < end; n++) {
        if (n >= TOK_MAX_VOCAB)
            return tok_seterr(-EINVAL, "more than %d tokens in the file", TOK_MAX_VOCAB);
        if ((size_t)(end - q) < 8)
            return tok_seterr(-EINVAL,
                              "token %d: file ends inside its score/length (need 8 "
                              "bytes at offset %zu, file is %zu bytes)",
                              n, (size_t)(q - (const unsigned char *)buf), len);
        int32_t plen = (int32_t)rd_u32(q + 4);
        q += 8;
        if (plen < 0 || plen > TOK_MAX_PIECE)
            return tok_seterr(-EINVAL, "token %d: piece length %d: must be 0..%d", n, plen,
                              TOK_MAX_PIECE);
        if ((size_t)(end - q) < (size_t)plen)
            return tok_seterr(-EINVAL,
                              "token %d: piece length %d runs past the end of the file "
                              "(%zu bytes left)",
                              n, plen, (size_t)(end - q));
        q += plen;
        piece_bytes += (size_t)plen + 1;
        if (vocab_size && n + 1 == vocab_size && q != end)
            return tok_seterr(-EINVAL,
                              "%zu bytes after token %d: the model's vocabulary has %d "
                              "tokens (wrong tokenizer for this model?)",
                              (size_t)(end - q), n, vocab_size);
    }
    if (n == 0) return tok_seterr(-EINVAL, "tokenizer has no tokens");
    if (n <= TOK_EOS)
        return tok_seterr(-EINVAL, "tokenizer has %d tokens: needs at least 3 (unk, BOS, EOS)", n);

    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return tok_seterr(-ENOMEM, "out of memory");
    t->vocab_size = n;
    t->pieces = calloc((size_t)n, sizeof *t->pieces);
    t->scores = calloc((size_t)n, sizeof *t->scores);
    t->sorted = calloc((size_t)n, sizeof *t->sorted);
    t->shown = calloc((size_t)n, sizeof *t->shown);
    t->shown_after_bos = calloc((size_t)n, sizeof *t->shown_after_bos);
    char *arena = malloc(piece_bytes);
    if (!t->pieces || !t->scores || !t->sorted || !t->shown || !t->shown_after_bos || !arena) {
        free(arena);
        goto fail;
    }
    for (int b = 0; b < 256; b++) {
        t->byte_str[b][0] = (char)b;
        t->byte_str[b][1] = '\0';
    }
    for (int i = 0; i < n; i++) {
        uint32_t bits = rd_u32(p);
        memcpy(&t->scores[i], &bits, 4);
        int32_t plen = (int32_t)rd_u32(p + 4);
        p += 8;
        memcpy(arena, p, (size_t)plen);
        arena[plen] = '\0'; /* run.c treats pieces as C strings: an embedded NUL ends it */
        t->pieces[i] = arena;
        arena += plen + 1;
        p += plen;
        int slen = (int)strlen(t->pieces[i]);
        if (slen > t->max_piece_len) t->max_piece_len = slen;
        t->sorted[i] = i;
    }
    for (int i = 0; i < n; i++) {
        const char *piece = t->pieces[i];
        t->shown[i] = shown_piece(t, piece);
        t->shown_after_bos[i] = shown_piece(t, piece[0] == ' ' ? piece + 1 : piece);
    }
    tok_sort_pieces(t, (size_t)n);
    t->bos = TOK_BOS;
    t->eos = TOK_EOS;
    t->add_bos = true;
    t->unk = -1;
    t->eot = -1;
    for (int b = 0; b < 256; b++) { /* run.c's byte b + 3, when that is what the vocab holds */
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        t->byte_id[b] = tok_lookup(t, piece);
    }
    *out = t;
    return 0;
fail:
    tok_free(t);
    return tok_seterr(err, "out of memory");
}

int tok_load(const char *path, int vocab_size, tok_tokenizer **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return tok_seterr(-errno, "%s: %s", path, strerror(errno));
    unsigned char magic[4];
    if (fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0) {
        fclose(f);
        return tok_load_gguf(path, vocab_size, out);
    }
    rewind(f);
    int err = 0;
    unsigned char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 1 << 16;
            if (cap > ((size_t)TOK_MAX_VOCAB * 64 + 8)) {
                err = tok_seterr(-EINVAL, "%s: larger than any tokenizer we accept", path);
                goto out;
            }
            unsigned char *nb = realloc(buf, cap);
            if (!nb) {
                err = tok_seterr(-ENOMEM, "out of memory");
                goto out;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                err = tok_seterr(-EIO, "%s: read error", path);
                goto out;
            }
            break;
        }
    }
    err = tok_load_mem(buf, len, vocab_size, out);
    if (err) {
        tok_seterr(err, "%s: %s", path, tok_err.msg); /* errdetail: may wrap itself */
    }
out:
    free(buf);
    fclose(f);
    return err;
}

void tok_free(tok_tokenizer *t)
{
    if (!t) return;
    if (t->pieces) free(t->pieces[0]); /* the arena */
    free(t->pieces);
    free(t->scores);
    free(t->sorted);
    free(t->hash);
    free(t->shown);
    free(t->shown_after_bos);
    free(t->special);
    tok_bpe_free(t->bpe);
    free(t);
}

int tok_vocab_size(const tok_tokenizer *t)
{
    return t->vocab_size;
}

const char *tok_piece(const tok_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->vocab_size ? t->pieces[id] : NULL;
}

float tok_score(const tok_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->vocab_size ? t->scores[id] : 0.0f;
}

/* ---- encode ------------------------------------------------------------------------- */

/* The id of piece s (lowest id when a piece appears twice), or -1. */
int32_t tok_lookup(const tok_tokenizer *t, const char *s)
{
    if (t->hash) {
        for (uint32_t i = piece_hash(s) & t->hash_mask;; i = (i + 1) & t->hash_mask) {
            const int32_t id = t->hash[i];
            if (id < 0 || strcmp(t->pieces[id], s) == 0) return id;
        }
    }
    int lo = 0, hi = t->vocab_size; /* first index whose piece >= s */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (strcmp(t->pieces[t->sorted[mid]], s) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < t->vocab_size && strcmp(t->pieces[t->sorted[lo]], s) == 0) return t->sorted[lo];
    return -1;
}

/* The id of the concatenation of two tokens' pieces, or -1. buf holds 2 pieces + NUL. */
static int32_t pair_lookup(const tok_tokenizer *t, int32_t a, int32_t b, char *buf)
{
    const char *pa = t->pieces[a], *pb = t->pieces[b];
    size_t la = strlen(pa), lb = strlen(pb);
    memcpy(buf, pa, la);
    memcpy(buf + la, pb, lb + 1);
    return tok_lookup(t, buf);
}

size_t tok_encode_bound(const char *text)
{
    return (text ? strlen(text) : 0) * 3 + 3;
}

/*
 * Merging pairs of adjacent symbols, best first, until none merges: SentencePiece (run.c)
 * takes the pair whose concatenation is the piece with the highest score, byte-level BPE
 * the pair of the lowest merge rank; both take the leftmost pair on ties. Rescanning and
 * memmoving the whole array per merge, as run.c does, is quadratic (a 256 KB prompt took
 * 37 s). The same order in O(n log n), as SentencePiece and llama.cpp's llm_tokenizer_spm
 * do: the symbols form a linked list and the candidate merges a heap ordered by (key, index
 * of the left symbol). A symbol keeps the index of its leftmost original token, so list
 * order is index order and "leftmost" is "lowest left index". A merge changes only the
 * pairs touching the merged symbol: stale heap entries are recognised by the symbols'
 * generation counts and skipped, the two new pairs pushed.
 */
typedef struct merge_sym {
    int32_t id;
    int prev, next; /* -1 at the ends */
    uint32_t gen;   /* bumped whenever the symbol changes or dies */
} merge_sym;

typedef struct merge_pair {
    double key; /* higher merges first: a score, or minus a rank */
    int left, right;
    uint32_t gen_left, gen_right;
    int32_t id; /* the token left + right becomes */
} merge_pair;

/* a is merged before b */
static bool pair_first(const merge_pair *a, const merge_pair *b)
{
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

typedef struct merge_heap {
    merge_pair *v;
    size_t n;
} merge_heap;

static void heap_push(merge_heap *h, merge_pair p)
{
    size_t i = h->n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pair_first(&p, &h->v[up])) break;
        h->v[i] = h->v[up];
        i = up;
    }
    h->v[i] = p;
}

static merge_pair heap_pop(merge_heap *h)
{
    merge_pair top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && pair_first(&h->v[c + 1], &h->v[c])) c++;
        if (!pair_first(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

static void push_pair(merge_heap *h, const merge_sym *s, int l, int r, tok_pair_fn *pair, void *ctx)
{
    double key;
    int32_t id;
    if (l < 0 || r < 0 || !pair(ctx, s[l].id, s[r].id, &key, &id)) return;
    heap_push(h, (merge_pair){key, l, r, s[l].gen, s[r].gen, id});
}

int tok_merge(int32_t *ids, size_t *n_io, tok_pair_fn *pair, void *ctx)
{
    const size_t n = *n_io;
    if (n < 2) return 0;
    if (n > INT_MAX / 4) return tok_seterr(-E2BIG, "%zu symbols to merge: too many", n);
    merge_sym *s = malloc(n * sizeof *s);
    /* at most n - 1 pairs at first, then 2 per merge and at most n - 1 merges */
    merge_heap h = {malloc(3 * n * sizeof *h.v), 0};
    if (!s || !h.v) {
        free(s);
        free(h.v);
        return tok_seterr(-ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        s[i] = (merge_sym){ids[i], (int)i - 1, i + 1 < n ? (int)i + 1 : -1, 0};
    for (size_t i = 0; i + 1 < n; i++) push_pair(&h, s, (int)i, (int)i + 1, pair, ctx);
    while (h.n) {
        merge_pair p = heap_pop(&h);
        merge_sym *l = &s[p.left], *r = &s[p.right];
        if (l->gen != p.gen_left || r->gen != p.gen_right)
            continue; /* one of the two changed since this pair was pushed */
        l->id = p.id;
        l->gen++;
        r->gen++; /* dead: no entry naming it is valid any more */
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = p.left;
        push_pair(&h, s, l->prev, p.left, pair, ctx);
        push_pair(&h, s, p.left, l->next, pair, ctx);
    }
    size_t k = 0;
    for (int i = 0; i >= 0; i = s[i].next) ids[k++] = s[i].id;
    *n_io = k;
    free(s);
    free(h.v);
    return 0;
}

/* SentencePiece's pairs: the concatenation must be a piece scoring above -1e10 (run.c's
 * starting best; NaN never merges). */
typedef struct spm_ctx {
    const tok_tokenizer *t;
    char *buf;
} spm_ctx;

static bool spm_pair(void *ctx, int32_t l, int32_t r, double *key, int32_t *id)
{
    const spm_ctx *c = ctx;
    *id = pair_lookup(c->t, l, r, c->buf);
    if (*id < 0 || !(c->t->scores[*id] > -1e10f)) return false;
    *key = c->t->scores[*id];
    return true;
}

static int spm_encode(const tok_tokenizer *t, const char *text, bool bos, bool eos, int32_t *out,
                      int max)
{
    if (!text) return tok_seterr(-EINVAL, "cannot encode NULL text");
    size_t bound = strlen(text) + 3;
    int32_t *tokens = malloc(bound * sizeof *tokens);
    char *buf = malloc((size_t)t->max_piece_len * 2 + 8);
    int n = 0, err = 0;
    if (!tokens || !buf) {
        err = tok_seterr(-ENOMEM, "out of memory");
        goto out;
    }
    if (bos) tokens[n++] = t->bos;
    /* SentencePiece's dummy prefix: the text is encoded as if it started with a space (not
     * where the file says its normalizer adds none, as Gemma's). */
    if (text[0] != '\0' && !t->no_space_prefix) {
        int32_t space = tok_lookup(t, " ");
        if (space >= 0) tokens[n++] = space;
    }
    /* One token per UTF-8 code point, or its bytes' fallback tokens. Like run.c, a
     * continuation byte run is cut at 4 bytes. */
    size_t len = 0;
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if ((*c & 0xC0) != 0x80) len = 0;
        buf[len++] = (char)*c;
        buf[len] = '\0';
        if ((c[1] & 0xC0) == 0x80 && len < 4) continue;
        int32_t id = tok_lookup(t, buf);
        if (id >= 0) {
            tokens[n++] = id;
        } else {
            for (size_t i = 0; i < len; i++) {
                int32_t b = t->byte_id[(unsigned char)buf[i]];
                if (b < 0) b = t->unk;
                if (b < 0) {
                    err = tok_seterr(-EINVAL,
                                     "byte 0x%02X has no fallback token (no \"<0x%02X>\" "
                                     "piece and no unknown token in the vocabulary)",
                                     (unsigned char)buf[i], (unsigned char)buf[i]);
                    goto out;
                }
                tokens[n++] = b;
            }
        }
        len = 0;
    }
    size_t merged = (size_t)n;
    if ((err = tok_merge(tokens, &merged, spm_pair, &(spm_ctx){t, buf}))) goto out;
    n = (int)merged;
    if (eos) tokens[n++] = t->eos;
    if (n > max) {
        err = tok_seterr(-ENOSPC, "text encodes to %d tokens, the buffer holds %d", n, max);
        goto out;
    }
    memcpy(out, tokens, (size_t)n * sizeof *tokens);
    err = n;
out:
    free(tokens);
    free(buf);
    return err;
}

/* The longest special token at s (n bytes left), or -1. */
static int32_t special_at(const tok_tokenizer *t, const char *s, size_t n, size_t *len)
{
    unsigned char c = (unsigned char)s[0];
    if (!(t->special_first[c >> 3] & (1u << (c & 7)))) return -1;
    for (int i = 0; i < t->n_special; i++) { /* longest first */
        const char *p = t->pieces[t->special[i]];
        size_t l = strlen(p);
        if (l <= n && memcmp(s, p, l) == 0) {
            *len = l;
            return t->special[i];
        }
    }
    return -1;
}

/* A fragment of text between special tokens. */
static int encode_fragment(const tok_tokenizer *t, const char *s, size_t len, tok_vec *v)
{
    if (t->kind == TOK_KIND_BPE) return tok_bpe_fragment(t, s, len, v);
    char *copy = strndup(s, len);
    int32_t *ids = malloc((len + 3) * sizeof *ids);
    int n = copy && ids ? spm_encode(t, copy, false, false, ids, (int)len + 3)
                        : tok_seterr(-ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        if (tok_vec_push(v, ids[i])) n = -ENOMEM;
    free(copy);
    free(ids);
    return n < 0 ? n : 0;
}

/*
 * GGUF vocabularies: the special tokens (control, user-defined, unknown) are cut out of the
 * text first — leftmost, longest at a position — as llama.cpp and Hugging Face do, so a chat
 * template's markers become their tokens; each piece of text between them is encoded alone
 * (SentencePiece gives each its dummy prefix, as llama.cpp does).
 */
int tok_encode(const tok_tokenizer *t, const char *text, bool bos, bool eos, int32_t *out, int max)
{
    if (!text) return tok_seterr(-EINVAL, "cannot encode NULL text");
    if (t->kind == TOK_KIND_SPM && t->n_special == 0)
        return spm_encode(t, text, bos, eos, out, max);
    tok_vec v = {0};
    int err = 0;
    size_t len = strlen(text), frag = 0;
    if (bos && t->bos >= 0 && (err = tok_vec_push(&v, t->bos))) /* BPE files may name none */
        goto out;
    for (size_t i = 0; i <= len;) {
        size_t sl = 0;
        int32_t sp = i < len ? special_at(t, text + i, len - i, &sl) : -1;
        if (i < len && sp < 0) {
            i++;
            continue;
        }
        if (i > frag && (err = encode_fragment(t, text + frag, i - frag, &v))) goto out;
        if (i == len) break;
        if ((err = tok_vec_push(&v, sp))) goto out;
        i += sl;
        frag = i;
    }
    if (eos && t->eos >= 0 && (err = tok_vec_push(&v, t->eos))) goto out;
    if (v.n > (size_t)max) {
        err = tok_seterr(-ENOSPC, "text encodes to %zu tokens, the buffer holds %d", v.n, max);
        goto out;
    }
    if (v.n) memcpy(out, v.v, v.n * sizeof *out);
    err = (int)v.n;
out:
    free(v.v);
    return err;
}

/* ---- decode ------------------------------------------------------------------------- */

const char *tok_decode(const tok_tokenizer *t, int32_t prev, int32_t next)
{
    if (next < 0 || next >= t->vocab_size) return NULL;
    return prev == t->bos ? t->shown_after_bos[next] : t->shown[next];
}

const char *tok_decode_bytes(const tok_tokenizer *t, int32_t prev, int32_t next)
{
    const char *s = tok_decode(t, prev, next);
    if (!s || s[0] != '\0' || t->kind != TOK_KIND_SPM) return s;
    /* "" is a control token, or a byte that printable() hid: give the byte back */
    const char *p = t->pieces[next];
    if (prev == t->bos && p[0] == ' ') p++;
    unsigned char byte_val;
    if (sscanf(p, "<0x%02hhX>", &byte_val) == 1) return t->byte_str[byte_val];
    return p[0] && !p[1] ? p : s;
}

int32_t tok_bos(const tok_tokenizer *t)
{
    return t->bos;
}
int32_t tok_eos(const tok_tokenizer *t)
{
    return t->eos;
}
int32_t tok_eot(const tok_tokenizer *t)
{
    return t->eot;
}
bool tok_is_bpe(const tok_tokenizer *t)
{
    return t->kind == TOK_KIND_BPE;
}
int tok_context_length(const tok_tokenizer *t)
{
    return t->context_length;
}

bool tok_add_bos(const tok_tokenizer *t)
{
    return t->add_bos;
}

bool tok_add_eos(const tok_tokenizer *t)
{
    return t->add_eos;
}

/* ---- GGUF vocabularies ------------------------------------------------------------- */

/* llama.cpp's token types */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

static int gguf_token_id(const gguf_file *g, const char *key, int vocab, int32_t dflt, int32_t *out)
{
    uint64_t v;
    int err = gguf_get_u64(g, key, &v);
    if (err == -ENOENT) {
        *out = dflt;
        return 0;
    }
    if (err) return tok_seterr(err, "%s", gguf_errmsg());
    if (v >= (uint64_t)vocab)
        return tok_seterr(-EINVAL, "%s=%llu: outside the vocabulary of %d tokens", key,
                          (unsigned long long)v, vocab);
    *out = (int32_t)v;
    return 0;
}

static int cmp_len_desc(const void *a, const void *b, void *ctx)
{
    const tok_tokenizer *t = ctx;
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    size_t la = strlen(t->pieces[ia]), lb = strlen(t->pieces[ib]);
    if (la != lb) return la < lb ? 1 : -1;
    return (ia > ib) - (ia < ib);
}

/* tokenizer.ggml.add_<what>_token into *v, which holds the default for a file without the
 * key (kept only where the file names the token, id >= 0); true without the token is refused. */
static int gguf_add_flag(const gguf_file *g, const char *what, int32_t id, bool *v)
{
    char key[64];
    snprintf(key, sizeof key, "tokenizer.ggml.add_%s_token", what);
    int err = gguf_get_bool(g, key, v);
    if (err == -ENOENT) {
        *v = *v && id >= 0;
        return 0;
    }
    if (err) return tok_seterr(err, "%s", gguf_errmsg());
    if (*v && id < 0)
        return tok_seterr(-EINVAL, "%s is true but the file names no tokenizer.ggml.%s_token_id",
                          key, what);
    return 0;
}

/* What every GGUF vocabulary reads besides its pieces: BOS, EOS, EOT and unknown ids,
 * add_bos, and the special tokens (control tokens print nothing). Frees t on error. */
static int gguf_vocab_common(const gguf_file *g, tok_tokenizer *t, int n)
{
    int32_t unk;
    /* llama.cpp's defaults where the file says nothing: BOS for SentencePiece and for Llama
     * 3's byte-level BPE, EOS for neither */
    const char *pre = NULL;
    size_t pre_len = 0;
    if (t->kind == TOK_KIND_BPE) gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pre_len);
    bool add_bos =
        t->kind == TOK_KIND_SPM || (pre && ((pre_len == 9 && !memcmp(pre, "llama-bpe", 9)) ||
                                            (pre_len == 6 && !memcmp(pre, "llama3", 6)) ||
                                            (pre_len == 8 && !memcmp(pre, "llama-v3", 8))));
    bool add_eos = false;
    uint32_t et;
    uint64_t nt;
    const void *types = NULL;
    int err;
    if ((err = gguf_token_id(g, "tokenizer.ggml.bos_token_id", n, t->kind ? -1 : 1, &t->bos)) ||
        (err = gguf_token_id(g, "tokenizer.ggml.eos_token_id", n, t->kind ? -1 : 2, &t->eos)) ||
        (err = gguf_token_id(g, "tokenizer.ggml.eot_token_id", n, -1, &t->eot)) ||
        (err = gguf_token_id(g, "tokenizer.ggml.unknown_token_id", n, -1, &unk)))
        goto fail;
    t->unk = unk;
    if ((err = gguf_add_flag(g, "bos", t->bos, &add_bos)) ||
        (err = gguf_add_flag(g, "eos", t->eos, &add_eos)))
        goto fail;
    t->add_bos = add_bos;
    t->add_eos = add_eos;
    bool space_prefix = true;
    err = gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &space_prefix);
    if (err && err != -ENOENT) {
        err = tok_seterr(err, "%s", gguf_errmsg());
        goto fail;
    }
    err = 0;
    if (!space_prefix && t->kind == TOK_KIND_SPM) {
        /* no dummy prefix to take off after BOS either: a leading space is the text's own */
        t->no_space_prefix = true;
        for (int i = 0; i < n; i++) t->shown_after_bos[i] = t->shown[i];
    }
    /* a model file's context (a tokenizer-only file states none) */
    const char *arch;
    size_t alen;
    uint64_t ctx;
    char key[96];
    if (gguf_get_str(g, "general.architecture", &arch, &alen) == 0 && alen < 64) {
        snprintf(key, sizeof key, "%.*s.context_length", (int)alen, arch);
        if (gguf_get_u64(g, key, &ctx) == 0 && ctx > 0 && ctx <= INT_MAX)
            t->context_length = (int)ctx;
    }
    if (gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &nt, &types) == 0) {
        /* validated by the loaders: n i32 */
        t->special = malloc((size_t)n * sizeof *t->special);
        if (!t->special) {
            err = tok_seterr(-ENOMEM, "out of memory");
            goto fail;
        }
        for (int i = 0; i < n; i++) {
            int32_t type;
            memcpy(&type, (const unsigned char *)types + 4 * (size_t)i, 4);
            if (type == TT_CONTROL || type == TT_UNUSED) t->shown[i] = t->shown_after_bos[i] = "";
            if ((type == TT_CONTROL || type == TT_USER || type == TT_UNKNOWN) &&
                t->pieces[i][0] != '\0') {
                unsigned char c = (unsigned char)t->pieces[i][0];
                t->special[t->n_special++] = i;
                t->special_first[c >> 3] |= (uint8_t)(1u << (c & 7));
            }
        }
        qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, cmp_len_desc, t);
    }
    return 0;
fail:
    tok_free(t);
    return err;
}

/*
 * A GGUF file's SentencePiece vocabulary (tokenizer.ggml.model "llama"): the pieces with
 * U+2581 turned back into spaces, their scores, BOS/EOS/unknown ids and add_bos. It is
 * handed to the llama2.c loader as a tokenizer.bin image, so both share one validation and
 * one encoder; control tokens print nothing. Other tokenizer models are refused by name.
 */
static int load_gguf_vocab(const gguf_file *g, int vocab_size, tok_tokenizer **out)
{
    const char *model;
    size_t model_len;
    int err = gguf_get_str(g, "tokenizer.ggml.model", &model, &model_len);
    if (err == -ENOENT)
        return tok_seterr(-EINVAL, "tokenizer.ggml.model: absent (the file holds no tokenizer)");
    if (err) return tok_seterr(err, "%s", gguf_errmsg());
    const bool bpe = model_len == 4 && memcmp(model, "gpt2", 4) == 0;
    if (!(model_len == 5 && memcmp(model, "llama", 5) == 0) && !bpe)
        return tok_seterr(-EINVAL,
                          "tokenizer.ggml.model=\"%.*s\": not supported (llama, i.e. "
                          "SentencePiece; gpt2, i.e. byte-level BPE)",
                          (int)(model_len > 32 ? 32 : model_len), model);
    uint32_t et;
    uint64_t n;
    const void *toks, *scores = NULL, *types = NULL;
    if ((err = gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &toks)))
        return tok_seterr(err == -ENOENT ? -EINVAL : err, "tokenizer.ggml.tokens: %s",
                          err == -ENOENT ? "absent" : gguf_errmsg());
    if (et != GGUF_V_STRING || n == 0 || n > TOK_MAX_VOCAB)
        return tok_seterr(-EINVAL, "tokenizer.ggml.tokens: expected 1..%d strings, found %llu %s",
                          TOK_MAX_VOCAB, (unsigned long long)n, gguf_vtype_name(et));
    if (vocab_size && n != (uint64_t)vocab_size)
        return tok_seterr(-EINVAL, "tokenizer.ggml.tokens: %llu tokens, the model has %d",
                          (unsigned long long)n, vocab_size);
    if (bpe) {
        if ((err = tok_bpe_load(g, n, toks, vocab_size, out))) return err;
        if ((err = gguf_vocab_common(g, *out, (int)n))) *out = NULL;
        return err;
    }
    uint64_t ns;
    err = gguf_get_arr(g, "tokenizer.ggml.scores", &et, &ns, &scores);
    if (err && err != -ENOENT) return tok_seterr(err, "%s", gguf_errmsg());
    if (!err && (et != GGUF_V_F32 || ns != n))
        return tok_seterr(-EINVAL, "tokenizer.ggml.scores: expected %llu f32, found %llu %s",
                          (unsigned long long)n, (unsigned long long)ns, gguf_vtype_name(et));
    err = gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &ns, &types);
    if (err && err != -ENOENT) return tok_seterr(err, "%s", gguf_errmsg());
    if (!err && (et != GGUF_V_I32 || ns != n))
        return tok_seterr(-EINVAL, "tokenizer.ggml.token_type: expected %llu i32, found %llu %s",
                          (unsigned long long)n, (unsigned long long)ns, gguf_vtype_name(et));
    /* the tokenizer.bin image: max_token_length, then score, length, piece per token */
    size_t bytes = 4;
    const void *p = toks;
    for (uint64_t i = 0; i < n; i++) {
        const char *sp;
        size_t len;
        gguf_str_next(&p, &sp, &len);
        if (len > TOK_MAX_PIECE)
            return tok_seterr(-EINVAL, "tokenizer.ggml.tokens[%llu]: %zu bytes (at most %d)",
                              (unsigned long long)i, len, TOK_MAX_PIECE);
        bytes += 8 + len; /* "▁" (3 bytes) becomes " " (1): never longer */
    }
    unsigned char *img = malloc(bytes), *w = img + 4;
    if (!img) return tok_seterr(-ENOMEM, "out of memory");
    int32_t max_len = 1;
    p = toks;
    for (uint64_t i = 0; i < n; i++) {
        const char *sp;
        size_t len;
        gguf_str_next(&p, &sp, &len);
        float score = 0.0f;
        if (scores) memcpy(&score, (const unsigned char *)scores + 4 * i, 4);
        memcpy(w, &score, 4);
        unsigned char *lenp = w + 4;
        w += 8;
        int32_t out_len = 0;
        for (size_t k = 0; k < len; k++) {
            if (k + 2 < len && (unsigned char)sp[k] == 0xe2 && (unsigned char)sp[k + 1] == 0x96 &&
                (unsigned char)sp[k + 2] == 0x81) {
                w[out_len++] = ' ';
                k += 2;
            } else {
                w[out_len++] = (unsigned char)sp[k];
            }
        }
        memcpy(lenp, &out_len, 4);
        w += out_len;
        if (out_len > max_len) max_len = out_len;
    }
    memcpy(img, &max_len, 4);
    err = tok_load_mem(img, (size_t)(w - img), (int)n, out);
    free(img);
    if (err) return err;
    if ((err = gguf_vocab_common(g, *out, (int)n))) *out = NULL;
    return err;
}

int tok_load_gguf(const char *path, int vocab_size, tok_tokenizer **out)
{
    *out = NULL;
    gguf_file *g;
    int err = gguf_open(path, &g);
    if (err) return tok_seterr(err, "%s", gguf_errmsg());
    err = load_gguf_vocab(g, vocab_size, out);
    if (err) {
        tok_seterr(err, "%s: %s", path, tok_err.msg); /* errdetail: may wrap itself */
    }
    gguf_close(g);
    return err;
}
