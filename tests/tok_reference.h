/* SPDX-License-Identifier: MIT */
/*
 * tests/tok_reference.h — the tokenizer's encoders as they were before the merge heap: every
 * merge rescans the symbols for the best pair and memmoves the array (run.c's loop, with the
 * pair lookups cached as model/tokenizer.c and tok_bpe.c had them). Quadratic in the length
 * of a fragment (SentencePiece) or a word (BPE). Kept as the brute-force reference that
 * tests/test_tokenizer.c checks the O(n log n) merge against, id for id, and that
 * perf/tok_bench.c times beside it. Everything but the merge loops is the product's own
 * code path written out again (special tokens, NFC, pre-tokenizer, byte alphabet), so a
 * difference can only come from the merge order.
 */
#ifndef RINGLM_TESTS_TOK_REFERENCE_H
#define RINGLM_TESTS_TOK_REFERENCE_H

#include "model/tok_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static int32_t ref_pair_lookup(const tok_tokenizer *t, int32_t a, int32_t b, char *buf)
{
    size_t la = strlen(t->pieces[a]), lb = strlen(t->pieces[b]);
    memcpy(buf, t->pieces[a], la);
    memcpy(buf + la, t->pieces[b], lb + 1);
    return tok_lookup(t, buf);
}

/* SentencePiece: dummy prefix, code points or byte fallback, then the quadratic merge. */
static int ref_spm(const tok_tokenizer *t, const char *text, size_t tlen, tok_vec *v)
{
    int32_t *tokens = malloc((tlen + 3) * sizeof *tokens), *pair_id = NULL;
    char *buf = malloc((size_t)t->max_piece_len * 2 + 8);
    int n = 0, err = -ENOMEM;
    if (!tokens || !buf) goto out;
    if (tlen) {
        int32_t space = tok_lookup(t, " ");
        if (space >= 0) tokens[n++] = space;
    }
    size_t len = 0;
    for (size_t i = 0; i < tlen; i++) {
        const unsigned char *c = (const unsigned char *)text + i;
        if ((*c & 0xC0) != 0x80) len = 0;
        buf[len++] = (char)*c;
        buf[len] = '\0';
        if (i + 1 < tlen && (c[1] & 0xC0) == 0x80 && len < 4) continue;
        int32_t id = tok_lookup(t, buf);
        if (id >= 0) {
            tokens[n++] = id;
        } else {
            for (size_t k = 0; k < len; k++) {
                int32_t b = t->byte_id[(unsigned char)buf[k]];
                if (b < 0) b = t->unk;
                if (b < 0) {
                    err = -EINVAL;
                    goto out;
                }
                tokens[n++] = b;
            }
        }
        len = 0;
    }
    pair_id = malloc((tlen + 3) * sizeof *pair_id);
    if (!pair_id) goto out;
    for (int i = 0; i + 1 < n; i++) pair_id[i] = ref_pair_lookup(t, tokens[i], tokens[i + 1], buf);
    for (;;) {
        float best_score = -1e10f;
        int best_idx = -1;
        for (int i = 0; i + 1 < n; i++) {
            if (pair_id[i] >= 0 && t->scores[pair_id[i]] > best_score) {
                best_score = t->scores[pair_id[i]];
                best_idx = i;
            }
        }
        if (best_idx < 0) break;
        tokens[best_idx] = pair_id[best_idx];
        memmove(tokens + best_idx + 1, tokens + best_idx + 2,
                (size_t)(n - best_idx - 2) * sizeof *tokens);
        memmove(pair_id + best_idx + 1, pair_id + best_idx + 2,
                (size_t)(n > best_idx + 2 ? n - best_idx - 3 : 0) * sizeof *pair_id);
        n--;
        if (best_idx > 0)
            pair_id[best_idx - 1] = ref_pair_lookup(t, tokens[best_idx - 1], tokens[best_idx], buf);
        if (best_idx + 1 < n)
            pair_id[best_idx] = ref_pair_lookup(t, tokens[best_idx], tokens[best_idx + 1], buf);
    }
    err = 0;
    for (int i = 0; i < n && !err; i++) err = tok_vec_push(v, tokens[i]);
out:
    free(tokens);
    free(pair_id);
    free(buf);
    return err;
}

/* ---- byte-level BPE ---- */

static uint32_t ref_byte_cp(unsigned b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) n++;
    return 0x100 + n;
}

static size_t ref_utf8_valid(const unsigned char *s, size_t n)
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

static int32_t ref_merge_rank(const struct tok_bpe *b, int32_t l, int32_t r, int32_t *result)
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
    if (lo < b->n_merges && b->merges[lo].key == key) {
        if (result) *result = b->merges[lo].result;
        return b->merges[lo].rank;
    }
    return INT32_MAX;
}

static int ref_bpe_word(const tok_tokenizer *t, const unsigned char *w, size_t n, tok_vec *v)
{
    const struct tok_bpe *b = t->bpe;
    int32_t *sym = malloc((n + 1) * sizeof *sym), *rank = malloc((n + 1) * sizeof *rank);
    char *mapped = malloc(n * 2 + 1);
    int err = -ENOMEM;
    if (!sym || !rank || !mapped) goto out;
    if (b->ignore_merges) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t cp = ref_byte_cp(w[i]);
            if (cp < 0x80) {
                mapped[m++] = (char)cp;
            } else {
                mapped[m++] = (char)(0xC0 | cp >> 6);
                mapped[m++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        mapped[m] = '\0';
        int32_t id = tok_lookup(t, mapped);
        if (id >= 0) {
            err = tok_vec_push(v, id);
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++)
        if ((sym[i] = b->byte_tok[w[i]]) < 0) {
            err = -EINVAL;
            goto out;
        }
    size_t k = n;
    for (size_t i = 0; i + 1 < k; i++) rank[i] = ref_merge_rank(b, sym[i], sym[i + 1], NULL);
    for (;;) {
        int32_t best = INT32_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < k; i++)
            if (rank[i] < best) best = rank[i], at = i;
        if (best == INT32_MAX) break;
        ref_merge_rank(b, sym[at], sym[at + 1], &sym[at]);
        memmove(sym + at + 1, sym + at + 2, (k - at - 2) * sizeof *sym);
        if (at + 2 < k) memmove(rank + at + 1, rank + at + 2, (k - at - 2 - 1) * sizeof *rank);
        k--;
        if (at > 0) rank[at - 1] = ref_merge_rank(b, sym[at - 1], sym[at], NULL);
        if (at + 1 < k) rank[at] = ref_merge_rank(b, sym[at], sym[at + 1], NULL);
    }
    err = 0;
    for (size_t i = 0; i < k && !err; i++) err = tok_vec_push(v, sym[i]);
out:
    free(sym);
    free(rank);
    free(mapped);
    return err;
}

static int ref_bpe(const tok_tokenizer *t, const char *text, size_t len, tok_vec *v)
{
    unsigned char *s = malloc(len * 3 + 1);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int err = -ENOMEM;
    if (!s || !md) goto out;
    size_t n = 0;
    const unsigned char *in = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t l = ref_utf8_valid(in + i, len - i);
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
    err = 0;
    if (t->bpe->nfc) { /* Qwen: the text in NFC first */
        utf8proc_uint8_t *nf;
        utf8proc_ssize_t nl =
            utf8proc_map(s, (utf8proc_ssize_t)n, &nf, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (nl < 0) {
            err = -EINVAL;
            goto out;
        }
        free(s);
        s = nf;
        n = (size_t)nl;
    }
    for (size_t at = 0; at < n && !err;) {
        int rc = pcre2_match(t->bpe->re, s, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
        size_t mb = n, me = n;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            mb = ov[0];
            me = ov[1];
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            err = -EINVAL;
            break;
        }
        if (mb > at) err = ref_bpe_word(t, s + at, mb - at, v);
        if (!err && me > mb) err = ref_bpe_word(t, s + mb, me - mb, v);
        if (!err && me == mb && mb < n) {
            size_t l = ref_utf8_valid(s + mb, n - mb);
            err = ref_bpe_word(t, s + mb, l, v);
            me = mb + l;
        }
        at = me;
    }
out:
    pcre2_match_data_free(md);
    free(s);
    return err;
}

/* tok_encode's whole path: BOS, special tokens cut out (leftmost, longest), each fragment
 * encoded alone, EOS. Returns the count written to out, or a negative errno. */
static int ref_encode(const tok_tokenizer *t, const char *text, bool bos, bool eos, int32_t *out,
                      int max)
{
    tok_vec v = {0};
    size_t len = strlen(text), frag = 0;
    int err = 0;
    if (bos && t->bos >= 0) err = tok_vec_push(&v, t->bos);
    for (size_t i = 0; i <= len && !err;) {
        int32_t sp = -1;
        size_t sl = 0;
        for (int k = 0; i < len && k < t->n_special; k++) { /* longest first */
            const char *p = t->pieces[t->special[k]];
            size_t l = strlen(p);
            if (l <= len - i && memcmp(text + i, p, l) == 0) {
                sp = t->special[k];
                sl = l;
                break;
            }
        }
        if (i < len && sp < 0) {
            i++;
            continue;
        }
        if (i > frag)
            err = t->kind == TOK_KIND_BPE ? ref_bpe(t, text + frag, i - frag, &v)
                                          : ref_spm(t, text + frag, i - frag, &v);
        if (err || i == len) break;
        err = tok_vec_push(&v, sp);
        i += sl;
        frag = i;
    }
    if (!err && eos) err = tok_vec_push(&v, t->eos);
    if (!err && v.n > (size_t)max) err = -ENOSPC;
    if (!err) {
        memcpy(out, v.v, v.n * sizeof *out);
        err = (int)v.n;
    }
    free(v.v);
    return err;
}

#endif
