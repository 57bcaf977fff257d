/* SPDX-License-Identifier: MIT */
/*
 * constrain/cst.c — vocabularies as tries, grammars, and matchers: the Pike VM with
 * hash-consed return stacks, its lazily built DFA, and masks by one walk of the trie.
 *
 * Invariants. A DFA state is a sorted, duplicate-free list of threads (pc, stack) whose pc
 * is a SET or a MATCH: the epsilon closure is taken when a state is made, so a byte step
 * only looks at SETs. State 0 is the dead state (no threads). A stack id names one
 * (return pc, parent id) pair, interned, 0 the empty stack: equal stacks are equal ids, so
 * states compare as plain arrays. Transitions are filled on first use (-1 unknown). Masks
 * are cached per state while the cache is under its byte bound.
 */
#include "constrain/cst.h"
#include "constrain/prog.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- vocabulary ---------------------------------------------------------------------- */

typedef struct trie_node {
    uint8_t byte;
    uint16_t depth;
    uint32_t end;       /* one past the last node of this subtree (preorder) */
    uint32_t tok_start; /* into sorted ids: tokens whose bytes end here */
    uint32_t tok_count;
    uint32_t tok_first;    /* into sorted ids: the first token of this node or a later one */
    uint32_t tok_end;      /* one past the subtree's tokens: sorted[tok_first .. tok_end) */
    uint8_t plain_below;   /* every token of the subtree is plain characters from here */
    uint8_t high_below;    /* a byte >= 0x80 is in the subtree, from this node on */
    uint16_t chars_before; /* characters begun on the path before this node's byte */
    uint16_t max_chars;    /* the most characters begun by a token of this subtree */
} trie_node;

/* Plain bytes: printable ASCII but the quote and the backslash, the bytes a JSON string's
 * body (and most other loops: "any character") takes without changing state. */
static bool byte_plain(uint8_t b)
{
    return b >= 0x20 && b < 0x7f && b != '"' && b != '\\';
}

struct cst_vocab {
    int n_tokens;
    uint8_t *bytes;             /* all token bytes */
    uint64_t *off;              /* [n+1] */
    int32_t *sorted;            /* ids sorted by bytes */
    uint16_t *chars;            /* [sorted index]: characters the token begins (bytes not 80..BF) */
    uint16_t *last_high;        /* [sorted index]: depth of its last byte >= 0x80, 0 if none */
    trie_node *nodes;           /* preorder; node 0 is the root */
    uint64_t (*ascii_below)[2]; /* [node]: the ASCII bytes of its subtree, from it on */
    uint32_t n_nodes;
    uint32_t max_depth;
    uint32_t max_chars; /* the most characters a token begins */
    int32_t end_tokens[CST_MAX_END_TOKENS];
    int n_end;
    /* Each token split into its plain characters and a tail: from the first byte that does
     * not begin a plain character (a quote, a backslash, a control, a byte that is not
     * UTF-8). A "pure" token has no tail (a character begun at its end counts as one). From
     * a state that takes plain characters in a chain (a string's body), a pure token is
     * allowed by its length alone, and an impure one by its tail from the chain's state
     * after its plain characters: tails are few and shared, so their walks are cached per
     * state (tail_*), not repeated under every prefix as the trie has them. */
    int32_t *pure_ids; /* pure tokens by characters, ascending */
    uint32_t *pure_at; /* [c], c <= pure_max + 1: the first of pure_ids with >= c characters */
    uint32_t n_pure, pure_max;
    uint32_t *pure_bits;  /* the pure tokens as a mask */
    uint16_t *pure_hi;    /* [as pure_ids]: characters up to its last one that is not ASCII */
    int32_t *imp_id;      /* impure tokens by plain characters, ascending */
    uint16_t *imp_plen;   /* its plain characters */
    uint16_t *imp_pbytes; /* their bytes: where the tail begins */
    uint32_t *imp_node;   /* the tail trie's node where its tail ends */
    uint32_t n_imp, imp_max;
    uint8_t *tl_byte; /* the tails' trie, preorder, node 0 the root */
    uint16_t *tl_depth;
    uint32_t *tl_end;
    uint32_t n_tl, tl_max_depth;
};

static const cst_vocab *sort_vocab; /* qsort has no context argument in C11 */
static int cmp_tok(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const cst_vocab *v = sort_vocab;
    uint64_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int build_trie(cst_vocab *v)
{
    int n = v->n_tokens, m = 0;
    v->sorted = malloc(((size_t)n + 1) * sizeof *v->sorted);
    if (!v->sorted) return -ENOMEM;
    for (int i = 0; i < n; i++)
        if (v->off[i + 1] > v->off[i]) v->sorted[m++] = i;
    sort_vocab = v;
    qsort(v->sorted, (size_t)m, sizeof *v->sorted, cmp_tok);
    /* nodes: at most total bytes + 1 */
    size_t cap = (size_t)(v->off[n]) + 2; /* + root + sentinel */
    v->nodes = calloc(cap, sizeof *v->nodes);
    uint32_t *path = calloc((size_t)(v->off[n]) + 2, sizeof *path); /* node index per depth */
    uint32_t *parent = calloc(cap, sizeof *parent);
    v->chars = calloc((size_t)m + 1, sizeof *v->chars);
    v->last_high = calloc((size_t)m + 1, sizeof *v->last_high);
    if (!v->nodes || !path || !parent || !v->chars || !v->last_high) {
        free(path);
        free(parent);
        return -ENOMEM;
    }
    uint32_t nn = 1, depth = 0;
    v->nodes[0] = (trie_node){.end = 0};
    path[0] = 0;
    const uint8_t *prev = NULL;
    uint64_t prevlen = 0;
    for (int k = 0; k < m; k++) {
        int id = v->sorted[k];
        const uint8_t *b = v->bytes + v->off[id];
        uint64_t len = v->off[id + 1] - v->off[id];
        uint64_t common = 0;
        while (prev && common < prevlen && common < len && prev[common] == b[common]) common++;
        /* close the nodes deeper than the common prefix */
        while (depth > common) {
            v->nodes[path[depth]].end = nn;
            depth--;
        }
        for (uint64_t d = common; d < len; d++) {
            trie_node *t = &v->nodes[nn];
            *t = (trie_node){.byte = b[d], .depth = (uint16_t)(d + 1 > 65535 ? 65535 : d + 1)};
            parent[nn] = path[depth];
            path[++depth] = nn++;
        }
        trie_node *leaf = &v->nodes[path[depth]];
        uint32_t nch = 0;
        for (uint64_t d = 0; d < len; d++) {
            nch += (b[d] & 0xC0) != 0x80;
            if (b[d] >= 0x80) v->last_high[k] = (uint16_t)(d + 1 > 65535 ? 65535 : d + 1);
        }
        v->chars[k] = (uint16_t)(nch > 65535 ? 65535 : nch);
        if (leaf->tok_count == 0) leaf->tok_start = (uint32_t)k;
        leaf->tok_count++;
        if (len > v->max_depth) v->max_depth = (uint32_t)len;
        prev = b;
        prevlen = len;
    }
    while (depth > 0) {
        v->nodes[path[depth]].end = nn;
        depth--;
    }
    v->nodes[0].end = nn;
    v->n_nodes = nn;
    /* per node: the first token at or after it (a subtree's tokens are sorted[first(i) ..
     * first(end))); node nn is the sentinel */
    v->nodes[nn].tok_first = (uint32_t)m;
    for (uint32_t i = nn; i-- > 0;)
        v->nodes[i].tok_first =
            v->nodes[i].tok_count ? v->nodes[i].tok_start : v->nodes[i + 1].tok_first;
    for (uint32_t i = 0; i < nn; i++) v->nodes[i].tok_end = v->nodes[v->nodes[i].end].tok_first;
    /* plain_below: from this node's byte on, every token of the subtree is plain characters
     * (valid UTF-8, or a prefix of it, of characters other than the controls, the quote and
     * the backslash). Found by parsing each path as UTF-8 from the root, and again from
     * depths 2, 3 and 4 (after 1 to 3 continuation bytes: the tokens that finish a
     * character a state has begun); a node is "impure" when its path so far does not parse,
     * and a subtree is plain below from where a parse begins a character at its root and
     * meets no impure node in it. */
    typedef struct utf8_at {
        uint8_t pend, lo, hi, bad;
    } utf8_at;
    uint32_t *cum = malloc(((size_t)nn + 1) * sizeof *cum);
    uint8_t *pend = malloc((size_t)nn + 1);
    if (!cum || !pend) {
        free(cum);
        free(pend);
        free(path);
        free(parent);
        return -ENOMEM;
    }
    for (uint32_t skip = 0; skip <= 3; skip++) {
        utf8_at at[258] = {{0, 0x80, 0xBF, 0}};
        uint32_t c = 0;
        for (uint32_t i = 1; i < nn; i++) {
            cum[i] = c;
            trie_node *t = &v->nodes[i];
            uint32_t d = t->depth < 257 ? t->depth : 257;
            uint8_t b = t->byte;
            utf8_at p = at[d - 1], q = {0, 0x80, 0xBF, p.bad};
            pend[i] = p.pend;
            if (d <= skip) { /* the continuation bytes before the parse begins */
                pend[i] = 1; /* no character begins here */
                if (b < 0x80 || b > 0xBF) q.bad = 1;
            } else if (p.pend) {
                if (b < p.lo || b > p.hi)
                    q.bad = 1;
                else
                    q.pend = (uint8_t)(p.pend - 1);
            } else if (byte_plain(b)) {
                /* one character */
            } else if (b >= 0xC2 && b <= 0xDF) {
                q.pend = 1;
            } else if (b >= 0xE0 && b <= 0xEF) {
                q.pend = 2, q.lo = b == 0xE0 ? 0xA0 : 0x80, q.hi = b == 0xED ? 0x9F : 0xBF;
            } else if (b >= 0xF0 && b <= 0xF4) {
                q.pend = 3, q.lo = b == 0xF0 ? 0x90 : 0x80, q.hi = b == 0xF4 ? 0x8F : 0xBF;
            } else
                q.bad = 1;
            if (d > 256) q.bad = 1;
            at[d] = q;
            if (q.bad) c++;
        }
        cum[nn] = c;
        for (uint32_t i = 1; i < nn; i++)
            if (pend[i] == 0 && cum[v->nodes[i].end] == cum[i]) v->nodes[i].plain_below = 1;
    }
    free(cum);
    free(pend);
    /* characters begun before each node (a node's byte begins one unless it is a
     * continuation byte), and the most any token of its subtree begins */
    for (uint32_t i = 1; i < nn; i++) {
        trie_node *t = &v->nodes[i], *p = &v->nodes[parent[i]];
        uint32_t c = p->chars_before + (parent[i] != 0 ? (p->byte & 0xC0) != 0x80 : 0);
        t->chars_before = (uint16_t)(c > 65535 ? 65535 : c);
    }
    for (uint32_t i = nn; i-- > 1;) {
        trie_node *t = &v->nodes[i];
        for (uint32_t k = 0; k < t->tok_count; k++)
            if (v->chars[t->tok_start + k] > t->max_chars)
                t->max_chars = v->chars[t->tok_start + k];
        trie_node *p = &v->nodes[parent[i]];
        if (t->max_chars > p->max_chars) p->max_chars = t->max_chars;
        if (v->max_chars < t->max_chars) v->max_chars = t->max_chars;
    }
    /* the bytes of each subtree, from its root on: children after parents in preorder */
    v->ascii_below = calloc((size_t)nn + 1, sizeof *v->ascii_below);
    if (!v->ascii_below) {
        free(path);
        free(parent);
        return -ENOMEM;
    }
    for (uint32_t i = nn; i-- > 1;) {
        trie_node *t = &v->nodes[i], *p = &v->nodes[parent[i]];
        if (t->byte >= 0x80)
            t->high_below = 1;
        else
            v->ascii_below[i][t->byte >> 6] |= 1ull << (t->byte & 63);
        if (parent[i]) {
            p->high_below |= t->high_below;
            v->ascii_below[parent[i]][0] |= v->ascii_below[i][0];
            v->ascii_below[parent[i]][1] |= v->ascii_below[i][1];
        }
    }
    free(path);
    free(parent);
    return 0;
}

/* Where a token's plain characters end (bytes), how many there are, and whether the rest
 * is only a character begun (then the token is pure, that character counted). */
static uint32_t plain_prefix(const uint8_t *b, uint32_t len, uint32_t *chars, bool *pure)
{
    uint32_t i = 0, c = 0;
    while (i < len) {
        uint8_t x = b[i];
        if (byte_plain(x)) {
            i++, c++;
            continue;
        }
        uint32_t n = x >= 0xC2 && x <= 0xDF   ? 2
                     : x >= 0xE0 && x <= 0xEF ? 3
                     : x >= 0xF0 && x <= 0xF4 ? 4
                                              : 0;
        if (!n) break;
        uint8_t lo = x == 0xE0 ? 0xA0 : x == 0xF0 ? 0x90 : 0x80;
        uint8_t hi = x == 0xED ? 0x9F : x == 0xF4 ? 0x8F : 0xBF;
        bool ok = true;
        for (uint32_t k = 1; k < n && i + k < len && ok; k++)
            ok = k == 1 ? b[i + k] >= lo && b[i + k] <= hi : b[i + k] >= 0x80 && b[i + k] <= 0xBF;
        if (!ok) break;
        if (i + n > len) { /* a character begun at the end */
            *chars = c + 1;
            *pure = true;
            return len;
        }
        i += n, c++;
    }
    *chars = c;
    *pure = i == len;
    return i;
}

static const cst_vocab *tail_vocab;
static int cmp_tail(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const cst_vocab *v = tail_vocab;
    uint32_t px = v->imp_pbytes[x], py = v->imp_pbytes[y];
    int32_t ix = v->imp_id[x], iy = v->imp_id[y];
    uint64_t lx = v->off[ix + 1] - v->off[ix] - px, ly = v->off[iy + 1] - v->off[iy] - py;
    int c = memcmp(v->bytes + v->off[ix] + px, v->bytes + v->off[iy] + py, lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* The split of every token into plain characters and a tail, and the tails' trie. */
static int build_tails(cst_vocab *v)
{
    int n = v->n_tokens;
    size_t words = ((size_t)n + 31) / 32;
    uint32_t *chars = malloc(((size_t)n + 1) * sizeof *chars);
    uint32_t *pb = malloc(((size_t)n + 1) * sizeof *pb);
    uint8_t *pure = malloc((size_t)n + 1);
    v->pure_bits = calloc(words + 1, sizeof *v->pure_bits);
    v->pure_ids = malloc(((size_t)n + 1) * sizeof *v->pure_ids);
    v->pure_hi = calloc((size_t)n + 1, sizeof *v->pure_hi);
    v->imp_id = malloc(((size_t)n + 1) * sizeof *v->imp_id);
    v->imp_plen = malloc(((size_t)n + 1) * sizeof *v->imp_plen);
    v->imp_pbytes = malloc(((size_t)n + 1) * sizeof *v->imp_pbytes);
    v->imp_node = malloc(((size_t)n + 1) * sizeof *v->imp_node);
    int32_t *order = malloc(((size_t)n + 1) * sizeof *order);
    int rc = -ENOMEM;
    if (!chars || !pb || !pure || !v->pure_bits || !v->pure_ids || !v->pure_hi || !v->imp_id ||
        !v->imp_plen || !v->imp_pbytes || !v->imp_node || !order)
        goto out;
    uint32_t maxc = 0, maxp = 0, np = 0, ni = 0;
    uint64_t tail_bytes = 0;
    for (int i = 0; i < n; i++) {
        uint32_t len = (uint32_t)(v->off[i + 1] - v->off[i]);
        bool pu = false;
        chars[i] = 0;
        pb[i] = len ? plain_prefix(v->bytes + v->off[i], len, &chars[i], &pu) : 0;
        pure[i] = len && pu;
        if (chars[i] > 65535 || pb[i] > 65535) pure[i] = 0, chars[i] = 0, pb[i] = 0;
        if (!len) continue;
        if (pure[i]) {
            np++;
            if (chars[i] > maxc) maxc = chars[i];
        } else {
            ni++;
            if (chars[i] > maxp) maxp = chars[i];
            tail_bytes += len - pb[i];
        }
    }
    v->pure_max = maxc;
    v->imp_max = maxp;
    v->pure_at = calloc((size_t)maxc + 3, sizeof *v->pure_at);
    uint32_t *at = calloc((size_t)(maxc > maxp ? maxc : maxp) + 3, sizeof *at);
    if (!v->pure_at || !at) {
        free(at);
        goto out;
    }
    /* counting sorts by characters */
    for (int i = 0; i < n; i++)
        if (pure[i]) v->pure_at[chars[i] + 1]++;
    for (uint32_t c = 0; c <= maxc; c++) v->pure_at[c + 1] += v->pure_at[c];
    v->pure_at[maxc + 2] = np;
    memcpy(at, v->pure_at, ((size_t)maxc + 2) * sizeof *at);
    for (int i = 0; i < n; i++)
        if (pure[i]) {
            uint32_t q = at[chars[i]]++, c = 0, hi = 0;
            v->pure_ids[q] = i;
            v->pure_bits[i >> 5] |= 1u << (i & 31);
            for (uint64_t d = v->off[i]; d < v->off[i + 1]; d++) {
                uint8_t b = v->bytes[d];
                c += (b & 0xC0) != 0x80;
                if (b >= 0x80) hi = c;
            }
            v->pure_hi[q] = (uint16_t)hi;
        }
    v->n_pure = np;
    memset(at, 0, ((size_t)(maxc > maxp ? maxc : maxp) + 3) * sizeof *at);
    for (int i = 0; i < n; i++)
        if (v->off[i + 1] > v->off[i] && !pure[i]) at[chars[i] + 1]++;
    for (uint32_t c = 0; c <= maxp; c++) at[c + 1] += at[c];
    for (int i = 0; i < n; i++)
        if (v->off[i + 1] > v->off[i] && !pure[i]) {
            uint32_t k = at[chars[i]]++;
            v->imp_id[k] = i;
            v->imp_plen[k] = (uint16_t)chars[i];
            v->imp_pbytes[k] = (uint16_t)pb[i];
        }
    free(at);
    v->n_imp = ni;
    /* the tails' trie: impure tokens sorted by tail, nodes as build_trie makes them */
    for (uint32_t k = 0; k < ni; k++) order[k] = (int32_t)k;
    tail_vocab = v;
    qsort(order, ni, sizeof *order, cmp_tail);
    size_t cap = tail_bytes + 2;
    v->tl_byte = calloc(cap, 1);
    v->tl_depth = calloc(cap, sizeof *v->tl_depth);
    v->tl_end = calloc(cap, sizeof *v->tl_end);
    uint32_t *path = calloc(cap + 1, sizeof *path);
    if (!v->tl_byte || !v->tl_depth || !v->tl_end || !path) {
        free(path);
        goto out;
    }
    uint32_t nn = 1, depth = 0;
    const uint8_t *prev = NULL;
    uint32_t prevlen = 0;
    for (uint32_t r = 0; r < ni; r++) {
        uint32_t k = (uint32_t)order[r];
        int32_t id = v->imp_id[k];
        const uint8_t *b = v->bytes + v->off[id] + v->imp_pbytes[k];
        uint32_t len = (uint32_t)(v->off[id + 1] - v->off[id]) - v->imp_pbytes[k];
        uint32_t common = 0;
        while (prev && common < prevlen && common < len && prev[common] == b[common]) common++;
        while (depth > common) v->tl_end[path[depth--]] = nn;
        for (uint32_t d = common; d < len; d++) {
            v->tl_byte[nn] = b[d];
            v->tl_depth[nn] = (uint16_t)(d + 1 > 65535 ? 65535 : d + 1);
            path[++depth] = nn++;
        }
        v->imp_node[k] = path[depth];
        if (len > v->tl_max_depth) v->tl_max_depth = len;
        prev = b;
        prevlen = len;
    }
    while (depth > 0) v->tl_end[path[depth--]] = nn;
    v->tl_end[0] = nn;
    v->n_tl = nn;
    free(path);
    rc = 0;
out:
    free(chars);
    free(pb);
    free(pure);
    free(order);
    return rc;
}

int cst_vocab_from_bytes(const uint8_t *const *bytes, const uint32_t *lens, int n_tokens,
                         const int32_t *end_tokens, int n_end, cst_vocab **out)
{
    *out = NULL;
    if (n_tokens < 0 || n_end < 0 || n_end > CST_MAX_END_TOKENS) return -EINVAL;
    for (int i = 0; i < n_end; i++)
        if (end_tokens[i] < 0 || end_tokens[i] >= n_tokens) return -EINVAL;
    cst_vocab *v = calloc(1, sizeof *v);
    if (!v) return -ENOMEM;
    v->n_tokens = n_tokens;
    v->off = calloc((size_t)n_tokens + 1, sizeof *v->off);
    uint64_t total = 0;
    for (int i = 0; i < n_tokens; i++) total += lens[i];
    v->bytes = malloc(total + 1);
    if (!v->off || !v->bytes) goto nomem;
    for (int i = 0; i < n_tokens; i++) {
        bool is_end = false;
        for (int e = 0; e < n_end; e++) is_end |= end_tokens[e] == i;
        uint32_t l = is_end ? 0 : lens[i]; /* an end token is never text */
        if (l) memcpy(v->bytes + v->off[i], bytes[i], l);
        v->off[i + 1] = v->off[i] + l;
    }
    memcpy(v->end_tokens, end_tokens, (size_t)n_end * sizeof *end_tokens);
    v->n_end = n_end;
    if (build_trie(v) || build_tails(v)) goto nomem;
    *out = v;
    return 0;
nomem:
    cst_vocab_free(v);
    return -ENOMEM;
}

int cst_vocab_from_tokenizer_ends(const tok_tokenizer *t, int n_tokens, const int32_t *end_tokens,
                                  int n_end, cst_vocab **out)
{
    *out = NULL;
    if (n_end < 0 || n_end > CST_MAX_END_TOKENS) return -EINVAL;
    const int n = n_tokens < tok_vocab_size(t) ? n_tokens : tok_vocab_size(t);
    if (n < 0) return -EINVAL;
    int32_t ends[CST_MAX_END_TOKENS];
    int ne = 0;
    for (int e = 0; e < n_end; e++)
        if (end_tokens[e] >= 0 && end_tokens[e] < n) ends[ne++] = end_tokens[e];
    const uint8_t **b = calloc((size_t)n + 1, sizeof *b);
    uint32_t *l = calloc((size_t)n + 1, sizeof *l);
    int rc = -ENOMEM;
    if (!b || !l) goto out;
    /* decode after a token that is neither BOS nor a control token, so a SentencePiece
     * piece keeps its leading space */
    int32_t prev = tok_bos(t) == 0 ? 1 : 0;
    for (int i = 0; i < n; i++) {
        bool is_end = false;
        for (int e = 0; e < ne; e++) is_end |= ends[e] == i;
        const char *s = is_end ? NULL : tok_decode_bytes(t, prev, i); /* an end is never text */
        b[i] = (const uint8_t *)(s ? s : "");
        l[i] = s ? (uint32_t)strlen(s) : 0; /* control tokens decode to "": never allowed */
    }
    rc = cst_vocab_from_bytes(b, l, n, ends, ne, out);
out:
    free(b);
    free(l);
    return rc;
}

int cst_vocab_from_tokenizer(const tok_tokenizer *t, cst_vocab **out)
{
    const int32_t ends[2] = {tok_eos(t), tok_eot(t) != tok_eos(t) ? tok_eot(t) : -1};
    return cst_vocab_from_tokenizer_ends(t, tok_vocab_size(t), ends, 2, out);
}

void cst_vocab_free(cst_vocab *v)
{
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->sorted);
    free(v->chars);
    free(v->last_high);
    free(v->nodes);
    free(v->ascii_below);
    free(v->pure_ids);
    free(v->pure_at);
    free(v->pure_bits);
    free(v->pure_hi);
    free(v->imp_id);
    free(v->imp_plen);
    free(v->imp_pbytes);
    free(v->imp_node);
    free(v->tl_byte);
    free(v->tl_depth);
    free(v->tl_end);
    free(v);
}

int cst_vocab_size(const cst_vocab *v)
{
    return v->n_tokens;
}

size_t cst_mask_words(const cst_vocab *v)
{
    return ((size_t)v->n_tokens + 31) / 32;
}

const uint8_t *cst_vocab_token(const cst_vocab *v, int32_t id, uint32_t *len)
{
    if (id < 0 || id >= v->n_tokens) {
        *len = 0;
        return NULL;
    }
    *len = (uint32_t)(v->off[id + 1] - v->off[id]);
    return v->bytes + v->off[id];
}

/* ---- grammar ------------------------------------------------------------------------- */

/* A depth-first search over a program's instructions, stamped so that each search sees a pc
 * once; `work` counts the instructions taken from the stack over every search of one
 * compile (the bound CST_MAX_COMPILE_WORK). */
typedef struct pc_search {
    const cst_prog *p;
    uint32_t *seen, stamp, *stack;
    uint64_t work;
} pc_search;

/* What a search from entry e is looking for. */
enum { REACH_RET, REACH_MATCH, REACH_CALL_OF_ENTRY };

/*
 * Whether pc e reaches `goal` (a RET, the MATCH, a CALL of e itself) without consuming
 * (through_sets false: the epsilon edges) or on any path (through_sets: a SET's next pc
 * too). JMP and both sides of a SPLIT are followed; a CALL's return pc only when
 * passable[callee] (the callee can be passed: it is nullable, or productive), and with
 * into_calls the callee's entry as well. Returns 1 (reached), 0 (not), or -E2BIG past the
 * work bound.
 */
static int pc_reaches(pc_search *s, uint32_t e, int goal, bool through_sets, bool into_calls,
                      const uint8_t *passable)
{
    const uint32_t n = s->p->n;
    uint32_t sp = 0;
    s->stamp++;
    s->stack[sp++] = e;
    s->seen[e] = s->stamp;
    while (sp) {
        if (++s->work > CST_MAX_COMPILE_WORK) return -E2BIG;
        cst_inst in = s->p->insts[s->stack[--sp]];
        uint32_t nx[2];
        int nn = 0;
        switch (in.op) {
        case OP_RET:
            if (goal == REACH_RET) return 1;
            break;
        case OP_MATCH:
            if (goal == REACH_MATCH) return 1;
            break;
        case OP_SET:
            if (through_sets) nx[nn++] = in.b;
            break;
        case OP_JMP: nx[nn++] = in.a; break;
        case OP_SPLIT: nx[nn++] = in.a, nx[nn++] = in.b; break;
        case OP_CALL:
            if (goal == REACH_CALL_OF_ENTRY && in.a == e) return 1;
            if (into_calls) nx[nn++] = in.a;
            if (passable[in.a]) nx[nn++] = in.b;
            break;
        default: break;
        }
        for (int j = 0; j < nn; j++)
            if (nx[j] < n && s->seen[nx[j]] != s->stamp)
                s->seen[nx[j]] = s->stamp, s->stack[sp++] = nx[j];
    }
    return 0;
}

/*
 * Left recursion: a subroutine that can reach a CALL of itself (directly or through other
 * subroutines) before consuming a byte would make the closure grow a stack forever. Found
 * by a search over the epsilon edges from each subroutine entry; a CALL's return pc is
 * followed only when the callee can match the empty string (a fixpoint first).
 */
static int check_left_recursion(cst_prog *p, char *err, size_t errlen)
{
    uint32_t n = p->n;
    /* subroutine entries: targets of CALL */
    uint8_t *is_entry = calloc(n, 1), *nullable = calloc(n, 1);
    pc_search s = {.p = p,
                   .seen = calloc(n, sizeof *s.seen), /* seen[i] == stamp: this search's */
                   .stack = malloc((size_t)n * sizeof *s.stack)};
    uint8_t *prod = NULL;
    uint32_t *entries = malloc((size_t)n * sizeof *entries);
    int rc = -ENOMEM, r;
    if (!is_entry || !nullable || !s.seen || !s.stack || !entries) goto out;
    uint32_t ne = 0;
    for (uint32_t i = 0; i < n; i++)
        if (p->insts[i].op == OP_CALL && p->insts[i].a < n && !is_entry[p->insts[i].a]) {
            is_entry[p->insts[i].a] = 1;
            entries[ne++] = p->insts[i].a;
        }
    /* nullable[e]: from e, a RET is reachable through epsilon edges (fixpoint over calls) */
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t k = 0; k < ne; k++) {
            uint32_t e = entries[k];
            if (nullable[e]) continue;
            if ((r = pc_reaches(&s, e, REACH_RET, false, false, nullable)) < 0) goto costly;
            if (r) nullable[e] = 1, changed = true;
        }
    }
    /* productive: the start can reach MATCH, and each CALL's callee can reach its RET, on
     * some path (a rule that only recurses, such as a required property whose schema is
     * the whole schema, matches no finite text) */
    {
        if (!(prod = calloc(n, 1))) goto out;
        for (bool changed = true; changed;) {
            changed = false;
            for (uint32_t k = 0; k <= ne; k++) {
                uint32_t e = k < ne ? entries[k] : p->start;
                if (prod[e]) continue;
                r = pc_reaches(&s, e, k < ne ? REACH_RET : REACH_MATCH, true, false, prod);
                if (r < 0) goto costly;
                if (r) prod[e] = 1, changed = true;
            }
        }
        if (!prod[p->start]) {
            snprintf(err, errlen,
                     "the constraint matches no finite text (a $ref cycle with no base case?)");
            rc = -EINVAL;
            goto out;
        }
    }
    /* from each entry: can it reach CALL e without consuming? (through calls into
     * other subroutines' entries as well) */
    for (uint32_t k = 0; k < ne; k++) {
        if ((r = pc_reaches(&s, entries[k], REACH_CALL_OF_ENTRY, false, true, nullable)) < 0)
            goto costly;
        if (r) {
            snprintf(err, errlen,
                     "left recursion: a rule can reach itself before consuming any "
                     "input (a $ref cycle with no base case?)");
            rc = -EINVAL;
            goto out;
        }
    }
    rc = 0;
    goto out;
costly:
    snprintf(err, errlen,
             "the grammar is too costly to analyse: over %u steps checking its rules (%u "
             "rules); refused rather than compiled without bound",
             CST_MAX_COMPILE_WORK, ne);
    rc = -E2BIG;
out:
    free(prod);
    free(is_entry);
    free(nullable);
    free(s.seen);
    free(s.stack);
    free(entries);
    return rc;
}

/*
 * Dead ends out: an instruction from which no path reaches the end (MATCH, or its
 * subroutine's RET) becomes FAIL, and a split keeps only its live side. A matcher's threads
 * then always have a way to finish, so a sequence can never reach a state where no token
 * (not even the end) is allowed — e.g. after the key of a property whose schema is `false`.
 */
static int prune_dead(cst_prog *p)
{
    uint32_t n = p->n;
    uint8_t *live = calloc(n, 1);
    if (!live) return -ENOMEM;
    uint64_t work = 0;
    for (bool changed = true; changed;) {
        changed = false;
        if ((work += n) > CST_MAX_COMPILE_WORK) {
            free(live);
            return -E2BIG;
        }
        for (uint32_t i = 0; i < n; i++) {
            if (live[i]) continue;
            cst_inst in = p->insts[i];
            bool l = false;
            switch (in.op) {
            case OP_MATCH:
            case OP_RET: l = true; break;
            case OP_SET: l = live[in.b]; break;
            case OP_JMP: l = live[in.a]; break;
            case OP_SPLIT: l = live[in.a] || live[in.b]; break;
            case OP_CALL: l = live[in.a] && live[in.b]; break;
            default: break;
            }
            if (l) live[i] = 1, changed = true;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        cst_inst *in = &p->insts[i];
        if (!live[i]) {
            *in = (cst_inst){OP_FAIL, 0, 0};
            continue;
        }
        if (in->op == OP_SPLIT && !live[in->a])
            *in = (cst_inst){OP_JMP, in->b, 0};
        else if (in->op == OP_SPLIT && !live[in->b])
            *in = (cst_inst){OP_JMP, in->a, 0};
    }
    free(live);
    return 0;
}

/* Classes of bytes no byte set of the program tells apart (partition refinement). */
static void byte_classes(const cst_prog *p, uint8_t cls[256], uint16_t start[257],
                         uint8_t bytes[256])
{
    uint16_t c[256] = {0}, n = 1;
    for (uint32_t k = 0; k < p->nsets && n < 256; k++) {
        uint16_t map[256][2];
        memset(map, 0xff, sizeof map);
        uint16_t nn = 0;
        for (int b = 0; b < 256; b++) {
            int in = p->sets[k].w[b >> 6] >> (b & 63) & 1;
            if (map[c[b]][in] == 0xffff) map[c[b]][in] = nn++;
            c[b] = map[c[b]][in];
        }
        n = nn;
    }
    if (n >= 256) /* every byte its own class: fine, just more checks */
        for (int b = 0; b < 256; b++) c[b] = (uint16_t)b;
    for (int b = 0; b < 256; b++) cls[b] = (uint8_t)c[b];
    /* the bytes of each class, class by class */
    memset(start, 0, 257 * sizeof *start);
    for (int b = 0; b < 256; b++) start[cls[b] + 1]++;
    for (int k = 0; k < 256; k++) start[k + 1] += start[k];
    uint16_t at[256];
    memcpy(at, start, sizeof at);
    for (int b = 0; b < 256; b++) bytes[at[cls[b]]++] = (uint8_t)b;
}

int cst_grammar_finish(cst_prog *p, cst_grammar **out, char *err, size_t errlen)
{
    char dummy[8];
    if (!err) err = dummy, errlen = sizeof dummy;
    *out = NULL;
    int rc = p->failed;
    if (rc) {
        snprintf(err, errlen, "%s", p->err);
        prog_release(p);
        return rc;
    }
    if (p->start == 0) {
        snprintf(err, errlen, "the constraint matches nothing");
        prog_release(p);
        return -EINVAL;
    }
    if ((rc = check_left_recursion(p, err, errlen)) == 0 && (rc = prune_dead(p)) == -E2BIG)
        snprintf(err, errlen,
                 "the grammar is too costly to analyse: over %u steps pruning its dead "
                 "ends; refused rather than compiled without bound",
                 CST_MAX_COMPILE_WORK);
    if (rc) {
        if (rc == -ENOMEM) snprintf(err, errlen, "out of memory");
        prog_release(p);
        return rc;
    }
    cst_grammar *g = calloc(1, sizeof *g);
    if (g) byte_classes(p, g->byte_class, g->class_start, g->class_bytes);
    if (!g) {
        prog_release(p);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    /* the sentinel: emitted after the analyses (nothing reaches it), a set of no byte (it
     * splits no byte class) */
    static const cst_byteset none = {{0}};
    uint32_t sent = prog_set(p, &none, 0);
    if (p->failed) p->failed = 0, sent = 0; /* at the size bound: no sentinel, no shortcut */
    g->sentinel = sent;
    g->prog = *p;
    memset(p, 0, sizeof *p);
    *out = g;
    return 0;
}

void cst_grammar_free(cst_grammar *g)
{
    if (!g) return;
    prog_release(&g->prog);
    free(g);
}

size_t cst_grammar_size(const cst_grammar *g)
{
    return g->prog.n;
}

/* ---- matcher ------------------------------------------------------------------------- */

#define MAX_STACK_DEPTH  4096       /* deeper threads die: stricter, never looser */
#define MAX_DFA_STATES   (1u << 15) /* flushed above this */
#define MASK_CACHE_BYTES (64u << 20)
/* Threads one closure may visit: nested nullable repeats behind calls multiply them (a
 * grammar such as ((a?){0,99}){0,99} called through rules); past this the step fails with
 * -E2BIG instead of stalling. */
#define MAX_CLOSURE      (1u << 18)
/* st_chain: the characters a state takes in a row, each leading every character to one
 * same next state (char_chain) */
#define CHAIN_UNKNOWN    0xFFFFu
#define CHAIN_INF        0x3FFFu /* a loop: any number */
#define CHAIN_DEAD_TAIL  0x4000u /* after the chain no character at all is taken */
#define CHAIN_AT_LEAST   0x8000u /* the chain was followed this far only */
#define CHAIN_LIMIT      16      /* characters followed from one state */
#define CLS_CHAIN_LIMIT  128     /* class steps followed from one state (Llama 3: 128) */

/* st_cls: how many times in a row a state takes every byte of its class set (st_cset: the
 * largest set of ASCII bytes it takes to one same state) to one same state, each step with
 * the same set (a character class under a repeat: [A-Za-z0-9_]+, a format's characters);
 * CHAIN_INF: a loop */
#define CNEXT_UNKNOWN  0xFFFFFFFEu
#define CLS_UNKNOWN    0xFFFFu
#define CLS_NONE       0xFFFEu
#define CLS_MIN_BYTES  8  /* smaller sets are not worth the check */
#define CLS_MIN_TOKENS 64 /* subtrees with fewer tokens are stepped */
/* the plain ASCII bytes: 0x20..0x7E but the quote and the backslash */
#define PLAIN_ASCII_LO (0xFFFFFFFF00000000ull & ~(1ull << '"'))
#define PLAIN_ASCII_HI (0x7FFFFFFFFFFFFFFFull & ~(1ull << ('\\' - 64)))

#define CLASS_SPLITS      8  /* class_mask's vocabulary splits kept per matcher */
#define CLASS_SPLIT_BYTES 16 /* smaller classes are walked (few tokens begin in them) */
/* class_mask checks this many steps of a class's chain (each step every byte of the class):
 * the rare longer tokens (Llama 3's runs of dashes) are stepped on, one byte a state */
#define CLASS_MASK_CHAIN  16

#define TRANS_BLOCK 256 /* states per block of transition rows (256 KiB) */

typedef struct stack_node {
    uint32_t ret, parent, depth;
} stack_node;

struct cst_matcher {
    const cst_grammar *g;
    const cst_prog *p;
    const cst_vocab *v;
    /* stacks */
    stack_node *stk;
    uint32_t nstk, stkcap;
    uint32_t *stk_hash;
    uint32_t stk_hash_cap;
    /* DFA states */
    uint64_t *threads; /* (pc << 32 | stack) */
    size_t nthreads, thcap;
    uint64_t *st_off; /* [state] start in threads; count = next start - start */
    uint32_t *st_len;
    uint8_t *st_accept;     /* MATCH with an empty stack is among the threads */
    uint16_t *st_chain;     /* CHAIN_UNKNOWN, or char_chain()'s answer */
    uint16_t *st_cls;       /* CLS_UNKNOWN, CLS_NONE or class_chain()'s count */
    uint64_t (*st_cset)[2]; /* [state]: its class set, where st_cls is a count */
    uint32_t *st_cnext;     /* CNEXT_UNKNOWN, or uniform_next()'s answer */
    uint32_t *st_anext;     /* CNEXT_UNKNOWN, or ascii_next()'s answer */
    uint64_t **st_tail;     /* [state]: the tails' trie nodes live from it (bits), or NULL */
    uint32_t *chain;        /* scratch: a chain's states (split_mask) */
    /* uniform_next's verdicts per thread group (the program counters of a state's threads
     * on one same stack): open addressing over gm, the pcs in gm_pcs */
    struct grp_memo *gm;
    uint32_t gm_cap, gm_n;
    uint32_t *gm_pcs;
    size_t gm_npcs, gm_pcscap;
    /* transitions: state s's row of 256 is trans[s / TRANS_BLOCK][s % TRANS_BLOCK * 256 ..]:
     * blocks, so that growing the DFA never copies (nor faults in) the rows it has */
    int32_t **trans;
    uint32_t ntrans;
    uint32_t **st_mask;
    size_t mask_bytes;
    uint32_t nstates, stcap;
    uint32_t *st_hash;
    uint32_t *st_hv; /* [state]: its threads' hash (a rehash does not recompute it) */
    uint32_t st_hash_cap;
    /* scratch for closures */
    uint64_t *work;
    size_t nwork, workcap;
    uint64_t *todo;
    size_t todocap;
    uint64_t *vis;
    uint32_t vis_cap;  /* power of two; entries (key + 1), 0 empty */
    uint32_t vis_last; /* threads the last closure visited (the next one's size hint) */
    int32_t *walk;     /* per trie depth */
    uint32_t start;
    uint32_t cur;
    bool ended;
    int oom;
    /* what the last mask cost (cst_matcher_describe) */
    uint64_t made;        /* states interned since creation */
    uint32_t last_state;  /* the state the last mask was for */
    uint32_t last_nodes;  /* trie nodes the last walk stepped (0: from the cache) */
    uint32_t last_made;   /* states the last walk made */
    uint32_t last_visits; /* trie nodes the last walk looked at */
    bool last_cached;
    uint8_t last_split; /* the last mask was split_mask's (1), part_mask's (2) or
                           class_mask's (3) */
    uint64_t *part;     /* scratch: part_mask's threads */
    size_t partcap;
    uint32_t *pmask; /* scratch: part_mask's two masks */
    /* class_mask's splits of the vocabulary by a class of ASCII bytes, least recently used
     * out */
    struct cls_split {
        uint64_t set[2]; /* the class; {0, 0}: an empty slot */
        int32_t *id;     /* the tokens whose first byte is in the class, by id */
        uint32_t *pre;   /* their leading bytes in the class */
        uint32_t *len;   /* their bytes */
        uint32_t n;
        uint64_t used;
    } cls[CLASS_SPLITS];
    uint64_t cls_clock;
    cst_vocab *own_vocab; /* cst_dfa_open's empty vocabulary */
};

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static inline int32_t *trans_row(const cst_matcher *m, uint32_t s)
{
    return m->trans[s / TRANS_BLOCK] + (size_t)(s % TRANS_BLOCK) * 256;
}

static uint32_t stk_push(cst_matcher *m, uint32_t parent, uint32_t ret)
{
    uint32_t depth = m->stk[parent].depth + 1;
    if (depth > MAX_STACK_DEPTH) return UINT32_MAX;
    if ((m->nstk + 1) * 2 >= m->stk_hash_cap) {
        uint32_t cap = m->stk_hash_cap ? m->stk_hash_cap * 2 : 1024;
        uint32_t *h = calloc(cap, sizeof *h);
        if (!h) return m->oom = -ENOMEM, UINT32_MAX;
        for (uint32_t i = 1; i < m->nstk; i++) {
            uint32_t j =
                (uint32_t)mix64((uint64_t)m->stk[i].ret << 32 | m->stk[i].parent) & (cap - 1);
            while (h[j]) j = (j + 1) & (cap - 1);
            h[j] = i;
        }
        free(m->stk_hash);
        m->stk_hash = h;
        m->stk_hash_cap = cap;
    }
    uint32_t j = (uint32_t)mix64((uint64_t)ret << 32 | parent) & (m->stk_hash_cap - 1);
    while (m->stk_hash[j]) {
        stack_node *s = &m->stk[m->stk_hash[j]];
        if (s->ret == ret && s->parent == parent) return m->stk_hash[j];
        j = (j + 1) & (m->stk_hash_cap - 1);
    }
    if (m->nstk == m->stkcap) {
        uint32_t cap = m->stkcap * 2;
        stack_node *ns = realloc(m->stk, cap * sizeof *ns);
        if (!ns) return m->oom = -ENOMEM, UINT32_MAX;
        m->stk = ns;
        m->stkcap = cap;
    }
    m->stk[m->nstk] = (stack_node){ret, parent, depth};
    m->stk_hash[j] = m->nstk;
    return m->nstk++;
}

static bool vis_insert(cst_matcher *m, uint64_t key)
{
    uint64_t k = key + 1;
    uint32_t j = (uint32_t)mix64(key) & (m->vis_cap - 1);
    while (m->vis[j]) {
        if (m->vis[j] == k) return false;
        j = (j + 1) & (m->vis_cap - 1);
    }
    m->vis[j] = k;
    return true;
}

static int grow(void **ptr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *np = realloc(*ptr, nc * elem);
    if (!np) return -ENOMEM;
    *ptr = np;
    *cap = nc;
    return 0;
}

/* The epsilon closure of the seeds in m->todo[0..nseeds) into m->work (unsorted). */
static int closure(cst_matcher *m, size_t nseeds)
{
    const cst_inst *in = m->p->insts;
    size_t ntodo = nseeds;
    m->nwork = 0;
    /* the visited set must hold every (pc, stack) reached: sized from the seeds and
     * grown when half full */
    size_t want = 64;
    while (want < nseeds * 8 || want < (size_t)m->vis_last * 2) want *= 2;
    /* a table far larger than this closure needs costs its clearing and its cache misses
     * on every closure after one large one: shrink it */
    if (m->vis_cap < want || m->vis_cap > want * 4) {
        free(m->vis);
        m->vis = calloc(want, sizeof *m->vis);
        if (!m->vis) return m->vis_cap = 0, -ENOMEM;
        m->vis_cap = (uint32_t)want;
    } else
        memset(m->vis, 0, m->vis_cap * sizeof *m->vis);
    size_t nvis = 0;
    while (ntodo) {
        uint64_t t = m->todo[--ntodo];
        if (nvis * 2 >= m->vis_cap) { /* rehash bigger */
            uint32_t oc = m->vis_cap;
            uint64_t *old = m->vis;
            m->vis = calloc((size_t)oc * 2, sizeof *m->vis);
            if (!m->vis) return m->vis = old, -ENOMEM;
            m->vis_cap = oc * 2;
            for (uint32_t i = 0; i < oc; i++)
                if (old[i]) vis_insert(m, old[i] - 1);
            free(old);
        }
        if (!vis_insert(m, t)) continue;
        if (++nvis > MAX_CLOSURE) return -E2BIG;
        uint32_t pc = (uint32_t)(t >> 32), sk = (uint32_t)t;
        uint64_t nx[2];
        int nn = 0;
        switch (in[pc].op) {
        case OP_SET:
        case OP_MATCH:
            if (in[pc].op == OP_MATCH && sk != 0) break;
            if (grow((void **)&m->work, &m->workcap, m->nwork + 1, sizeof *m->work)) return -ENOMEM;
            m->work[m->nwork++] = t;
            break;
        case OP_JMP: nx[nn++] = (uint64_t)in[pc].a << 32 | sk; break;
        case OP_SPLIT:
            nx[nn++] = (uint64_t)in[pc].b << 32 | sk;
            nx[nn++] = (uint64_t)in[pc].a << 32 | sk;
            break;
        case OP_CALL: {
            uint32_t ns = stk_push(m, sk, in[pc].b);
            if (ns != UINT32_MAX)
                nx[nn++] = (uint64_t)in[pc].a << 32 | ns;
            else if (m->oom)
                return m->oom;
            break;
        }
        case OP_RET:
            if (sk) nx[nn++] = (uint64_t)m->stk[sk].ret << 32 | m->stk[sk].parent;
            break;
        default: break;
        }
        if (grow((void **)&m->todo, &m->todocap, ntodo + 2, sizeof *m->todo)) return -ENOMEM;
        for (int j = 0; j < nn; j++) m->todo[ntodo++] = nx[j];
    }
    m->vis_last = (uint32_t)nvis;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t hash_threads(const uint64_t *t, size_t n)
{
    uint64_t h = 0x243F6A8885A308D3ull ^ n;
    for (size_t i = 0; i < n; i++) h = mix64(h ^ t[i]);
    return h;
}

/* Interns m->work (sorted here) as a state; returns its id or -1 on ENOMEM. */
static int32_t intern_state(cst_matcher *m)
{
    qsort(m->work, m->nwork, sizeof *m->work, cmp_u64);
    size_t n = 0;
    for (size_t i = 0; i < m->nwork; i++)
        if (!n || m->work[i] != m->work[n - 1]) m->work[n++] = m->work[i];
    m->nwork = n;
    if (n == 0) return 0;
    uint64_t h = hash_threads(m->work, n);
    uint32_t j = (uint32_t)h & (m->st_hash_cap - 1);
    while (m->st_hash[j]) {
        uint32_t s = m->st_hash[j];
        if (m->st_len[s] == n && !memcmp(m->threads + m->st_off[s], m->work, n * sizeof *m->work))
            return (int32_t)s;
        j = (j + 1) & (m->st_hash_cap - 1);
    }
    if (m->nstates == m->stcap) {
        uint32_t cap = m->stcap * 2;
        void *a = realloc(m->st_off, cap * sizeof *m->st_off);
        if (a) m->st_off = a;
        void *b = realloc(m->st_len, cap * sizeof *m->st_len);
        if (b) m->st_len = b;
        void *c = realloc(m->st_accept, cap);
        if (c) m->st_accept = c;
        void *d = realloc(m->trans, ((size_t)cap / TRANS_BLOCK + 1) * sizeof *m->trans);
        if (d) m->trans = d;
        void *e = realloc(m->st_mask, cap * sizeof *m->st_mask);
        if (e) m->st_mask = e;
        void *f = realloc(m->st_chain, cap * sizeof *m->st_chain);
        if (f) m->st_chain = f;
        void *g = realloc(m->st_cls, cap * sizeof *m->st_cls);
        if (g) m->st_cls = g;
        void *h = realloc(m->st_cset, cap * sizeof *m->st_cset);
        if (h) m->st_cset = h;
        void *i = realloc(m->st_cnext, cap * sizeof *m->st_cnext);
        if (i) m->st_cnext = i;
        void *k = realloc(m->st_tail, cap * sizeof *m->st_tail);
        if (k) m->st_tail = k;
        void *l = realloc(m->st_anext, cap * sizeof *m->st_anext);
        if (l) m->st_anext = l;
        void *hv = realloc(m->st_hv, cap * sizeof *m->st_hv);
        if (hv) m->st_hv = hv;
        if (!a || !b || !c || !d || !e || !f || !g || !h || !i || !k || !l || !hv) return -1;
        m->stcap = cap;
    }
    if (grow((void **)&m->threads, &m->thcap, m->nthreads + n, sizeof *m->threads)) return -1;
    if (m->nstates / TRANS_BLOCK >= m->ntrans) {
        int32_t *blk = malloc((size_t)TRANS_BLOCK * 256 * sizeof *blk);
        if (!blk) return -1;
        m->trans[m->ntrans++] = blk;
    }
    uint32_t s = m->nstates++;
    m->made++;
    m->st_off[s] = m->nthreads;
    m->st_len[s] = (uint32_t)n;
    memcpy(m->threads + m->nthreads, m->work, n * sizeof *m->work);
    m->nthreads += n;
    bool acc = false;
    for (size_t i = 0; i < n; i++)
        if (m->p->insts[m->work[i] >> 32].op == OP_MATCH) acc = true;
    m->st_accept[s] = acc;
    m->st_chain[s] = CHAIN_UNKNOWN;
    m->st_cls[s] = CLS_UNKNOWN;
    m->st_cnext[s] = CNEXT_UNKNOWN;
    m->st_anext[s] = CNEXT_UNKNOWN;
    m->st_tail[s] = NULL;
    m->st_hv[s] = (uint32_t)h;
    memset(trans_row(m, s), 0xff, 256 * sizeof(int32_t));
    m->st_mask[s] = NULL;
    m->st_hash[j] = s;
    if (m->nstates * 2 >= m->st_hash_cap) {
        uint32_t cap = m->st_hash_cap * 2;
        uint32_t *nh = calloc(cap, sizeof *nh);
        if (!nh) return -1;
        for (uint32_t k = 1; k < m->nstates; k++) {
            uint32_t q = m->st_hv[k] & (cap - 1);
            while (nh[q]) q = (q + 1) & (cap - 1);
            nh[q] = k;
        }
        free(m->st_hash);
        m->st_hash = nh;
        m->st_hash_cap = cap;
    }
    return (int32_t)s;
}

static int32_t compute_step(cst_matcher *m, uint32_t s, uint8_t byte)
{
    const cst_prog *p = m->p;
    size_t n = m->st_len[s], ns = 0;
    if (grow((void **)&m->todo, &m->todocap, n + 2, sizeof *m->todo)) return -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t t = m->threads[m->st_off[s] + i];
        const cst_inst *in = &p->insts[t >> 32];
        if (in->op != OP_SET) continue;
        const cst_byteset *bs = &p->sets[in->a];
        if (bs->w[byte >> 6] >> (byte & 63) & 1)
            m->todo[ns++] = (uint64_t)in->b << 32 | (uint32_t)t;
    }
    /* no thread takes the byte: the dead state, without a closure (most of a walk's misses
     * are this: a tail's first byte after a string, a byte out of a pattern's class) */
    if (ns == 0) return 0;
    int rc = closure(m, ns);
    if (rc) return rc;
    int32_t t = intern_state(m);
    return t < 0 ? -ENOMEM : t;
}

static inline int32_t step(cst_matcher *m, uint32_t s, uint8_t byte)
{
    int32_t t = trans_row(m, s)[byte];
    if (t >= 0) return t;
    t = compute_step(m, s, byte);
    if (t < 0) {
        m->oom = t;
        return 0;
    }
    /* the bytes no byte set tells apart step alike: fill the whole class */
    int32_t *row = trans_row(m, s);
    const cst_grammar *g = m->g;
    uint8_t c = g->byte_class[byte];
    for (uint32_t k = g->class_start[c]; k < g->class_start[c + 1]; k++) row[g->class_bytes[k]] = t;
    return t;
}

static void free_states(cst_matcher *m)
{
    for (uint32_t s = 0; s < m->nstates; s++) {
        free(m->st_mask[s]);
        free(m->st_tail[s]);
    }
    m->nstates = 0;
    m->nthreads = 0;
    m->mask_bytes = 0;
    if (m->st_hash) memset(m->st_hash, 0, m->st_hash_cap * sizeof *m->st_hash);
}

/* State 0 (dead) and the start state, interned afresh. */
static int init_states(cst_matcher *m)
{
    free_states(m);
    /* the dead state: no threads, every byte goes to itself */
    m->st_off[0] = 0;
    m->st_len[0] = 0;
    m->st_accept[0] = 0;
    m->st_chain[0] = CHAIN_DEAD_TAIL; /* no character: a chain of 0, nothing after */
    m->st_cls[0] = CLS_NONE;
    m->st_cnext[0] = 0;
    m->st_anext[0] = 0;
    m->st_tail[0] = NULL;
    m->st_mask[0] = NULL;
    for (int b = 0; b < 256; b++) trans_row(m, 0)[b] = 0;
    m->nstates = 1;
    m->todo[0] = (uint64_t)m->p->start << 32;
    int rc = closure(m, 1);
    if (rc) return rc;
    int32_t s = intern_state(m);
    if (s < 0) return -ENOMEM;
    m->start = (uint32_t)s;
    return 0;
}

int cst_matcher_create(const cst_grammar *g, const cst_vocab *v, cst_matcher **out)
{
    *out = NULL;
    cst_matcher *m = calloc(1, sizeof *m);
    if (!m) return -ENOMEM;
    m->g = g;
    m->p = &g->prog;
    m->v = v;
    m->stkcap = 1024;
    m->stk = calloc(m->stkcap, sizeof *m->stk);
    m->nstk = 1; /* 0: the empty stack */
    m->stcap = 64;
    m->st_off = calloc(m->stcap, sizeof *m->st_off);
    m->st_len = calloc(m->stcap, sizeof *m->st_len);
    m->st_accept = calloc(m->stcap, 1);
    m->st_chain = calloc(m->stcap, sizeof *m->st_chain);
    m->st_cls = calloc(m->stcap, sizeof *m->st_cls);
    m->st_cset = calloc(m->stcap, sizeof *m->st_cset);
    m->st_cnext = calloc(m->stcap, sizeof *m->st_cnext);
    m->st_anext = calloc(m->stcap, sizeof *m->st_anext);
    m->st_tail = calloc(m->stcap, sizeof *m->st_tail);
    m->st_hv = calloc(m->stcap, sizeof *m->st_hv);
    m->chain = malloc(((size_t)v->max_depth + 2) * sizeof *m->chain);
    m->trans = calloc((size_t)m->stcap / TRANS_BLOCK + 1, sizeof *m->trans);
    if (m->trans && (m->trans[0] = malloc((size_t)TRANS_BLOCK * 256 * sizeof **m->trans)))
        m->ntrans = 1;
    m->st_mask = calloc(m->stcap, sizeof *m->st_mask);
    m->st_hash_cap = 256;
    m->st_hash = calloc(m->st_hash_cap, sizeof *m->st_hash);
    m->todocap = 64;
    m->todo = malloc(m->todocap * sizeof *m->todo);
    m->walk = malloc(((size_t)v->max_depth + 2) * sizeof *m->walk);
    if (!m->stk || !m->st_off || !m->st_len || !m->st_accept || !m->st_chain || !m->st_cls ||
        !m->st_cset || !m->st_cnext || !m->st_anext || !m->st_tail || !m->st_hv || !m->chain ||
        !m->trans || !m->ntrans || !m->st_mask || !m->st_hash || !m->todo || !m->walk) {
        cst_matcher_free(m);
        return -ENOMEM;
    }
    int rc = init_states(m);
    if (rc) {
        cst_matcher_free(m);
        return rc;
    }
    m->cur = m->start;
    *out = m;
    return 0;
}

void cst_matcher_free(cst_matcher *m)
{
    if (!m) return;
    if (m->st_mask)
        for (uint32_t s = 0; s < m->nstates; s++) free(m->st_mask[s]);
    if (m->st_tail)
        for (uint32_t s = 0; s < m->nstates; s++) free(m->st_tail[s]);
    free(m->stk);
    free(m->stk_hash);
    free(m->threads);
    free(m->st_off);
    free(m->st_len);
    free(m->st_accept);
    free(m->st_chain);
    free(m->st_cls);
    free(m->st_cset);
    free(m->st_cnext);
    free(m->st_anext);
    free(m->st_tail);
    free(m->st_hv);
    free(m->chain);
    free(m->gm);
    free(m->gm_pcs);
    free(m->part);
    free(m->pmask);
    for (int i = 0; i < CLASS_SPLITS; i++) {
        free(m->cls[i].id);
        free(m->cls[i].pre);
        free(m->cls[i].len);
    }
    for (uint32_t i = 0; i < m->ntrans; i++) free(m->trans[i]);
    free(m->trans);
    free(m->st_mask);
    free(m->st_hash);
    free(m->work);
    free(m->todo);
    free(m->vis);
    free(m->walk);
    free(m);
}

void cst_matcher_reset(cst_matcher *m)
{
    m->cur = m->start;
    m->ended = false;
}

/* Above the state bound, forget the DFA but keep the current state (re-interned). */
static int maybe_flush(cst_matcher *m)
{
    if (m->nstates < MAX_DFA_STATES) return 0;
    size_t n = m->st_len[m->cur];
    uint64_t *keep = malloc((n + 1) * sizeof *keep);
    if (!keep) return -ENOMEM;
    memcpy(keep, m->threads + m->st_off[m->cur], n * sizeof *keep);
    bool was_dead = m->cur == 0;
    if (init_states(m)) {
        free(keep);
        return -ENOMEM;
    }
    if (was_dead) {
        m->cur = 0;
    } else {
        if (grow((void **)&m->work, &m->workcap, n, sizeof *m->work)) {
            free(keep);
            return -ENOMEM;
        }
        memcpy(m->work, keep, n * sizeof *keep);
        m->nwork = n;
        int32_t s = intern_state(m);
        if (s < 0) {
            free(keep);
            return -ENOMEM;
        }
        m->cur = (uint32_t)s;
    }
    free(keep);
    return 0;
}

static void set_end_bits(const cst_vocab *v, uint32_t *mask)
{
    for (int e = 0; e < v->n_end; e++) mask[v->end_tokens[e] >> 5] |= 1u << (v->end_tokens[e] & 31);
}

#define UNIFORM_MIXED UINT32_MAX

/*
 * Where state s takes a "plain" character (any but the controls, the quote and the
 * backslash: what a JSON string's body takes without an escape), when every such character
 * leads to one same state n: n (0 when none is taken, not even a lead byte). Otherwise
 * UNIFORM_MIXED. Checked on every plain byte, and on one byte per class of bytes the
 * program does not tell apart (cst_grammar.byte_class) for multi-byte characters.
 */
static bool multibyte_to(cst_matcher *m, uint32_t s, uint32_t n);

static uint32_t uniform_next(cst_matcher *m, uint32_t s)
{
    uint32_t n = (uint32_t)step(m, s, ' ');
    for (unsigned b = 0x21; b < 0x7f; b++)
        if (byte_plain((uint8_t)b) && (uint32_t)step(m, s, (uint8_t)b) != n) return UNIFORM_MIXED;
    if (n == 0) {
        for (unsigned lead = 0xC2; lead <= 0xF4; lead++)
            if (step(m, s, (uint8_t)lead)) return UNIFORM_MIXED;
        return 0;
    }
    return multibyte_to(m, s, n) ? n : UNIFORM_MIXED;
}

/* Whether every plain character of two to four bytes leads state s to state n (n live),
 * checked on one byte per class of bytes the program does not tell apart. */
static bool multibyte_to(cst_matcher *m, uint32_t s, uint32_t n)
{
    const uint8_t *cls = m->g->byte_class;
    /* continuation classes: one representative byte each, in 80..BF */
    uint8_t rep[64];
    int nrep = 0;
    for (unsigned b = 0x80; b <= 0xBF; b++) {
        bool seen = false;
        for (int k = 0; k < nrep && !seen; k++) seen = cls[rep[k]] == cls[b];
        if (!seen) rep[nrep++] = (uint8_t)b;
    }
    if (nrep > 6) return false; /* too many to check cheaply (the walk is exact) */
    uint16_t done[64];          /* (lead class, lead kind) pairs checked */
    int ndone = 0;
    bool ok = true;
    for (unsigned lead = 0xC2; lead <= 0xF4 && ok; lead++) {
        int len = lead <= 0xDF ? 2 : lead <= 0xEF ? 3 : 4;
        unsigned lo = lead == 0xE0 ? 0xA0 : lead == 0xF0 ? 0x90 : 0x80;
        unsigned hi = lead == 0xED ? 0x9F : lead == 0xF4 ? 0x8F : 0xBF;
        uint16_t key = (uint16_t)(cls[lead] << 4 | (lead == 0xE0) | (lead == 0xED) << 1 |
                                  (lead == 0xF0) << 2 | (lead == 0xF4) << 3);
        bool seen = false;
        for (int k = 0; k < ndone && !seen; k++) seen = done[k] == key;
        if (seen) continue;
        if (ndone < 64) done[ndone++] = key;
        uint32_t s1 = (uint32_t)step(m, s, (uint8_t)lead);
        if (!s1) return false;
        /* second byte: every class met in [lo, hi] */
        for (unsigned b2 = lo; b2 <= hi && ok; b2++) {
            bool first = true;
            for (unsigned x = lo; x < b2 && first; x++) first = cls[x] != cls[b2];
            if (!first) continue;
            uint32_t s2 = (uint32_t)step(m, s1, (uint8_t)b2);
            if (len == 2) {
                ok = s2 == n;
                continue;
            }
            for (int k3 = 0; k3 < nrep && ok; k3++) {
                uint32_t s3 = (uint32_t)step(m, s2, rep[k3]);
                if (len == 3) {
                    ok = s3 == n;
                    continue;
                }
                for (int k4 = 0; k4 < nrep && ok; k4++) ok = (uint32_t)step(m, s3, rep[k4]) == n;
            }
        }
    }
    return ok;
}

#define EXCEPT_MAX 32 /* plain ASCII bytes uniform_except lets lead elsewhere */

/*
 * As uniform_next where a few plain ASCII bytes (at most EXCEPT_MAX, set in ex) lead
 * elsewhere: the live state every other plain character leads to, or UNIFORM_MIXED. A key
 * beside additionalProperties starts so: the names' first letters lead into the names,
 * every other character into "any string but these".
 */
static uint32_t uniform_except(cst_matcher *m, uint32_t s, uint64_t ex[2])
{
    int32_t tgt[128] = {0};
    for (unsigned b = 0x20; b < 0x7f; b++)
        if (byte_plain((uint8_t)b)) tgt[b] = step(m, s, (uint8_t)b);
    if (m->oom) return UNIFORM_MIXED;
    int32_t seen[EXCEPT_MAX + 2], n = 0;
    int cnt[EXCEPT_MAX + 2], ns = 0, best = 0;
    for (unsigned b = 0x20; b < 0x7f; b++) {
        if (!byte_plain((uint8_t)b) || !tgt[b]) continue;
        int k = 0;
        while (k < ns && seen[k] != tgt[b]) k++;
        if (k == ns) {
            if (ns == EXCEPT_MAX + 2) return UNIFORM_MIXED; /* too many targets */
            seen[ns] = tgt[b], cnt[ns++] = 0;
        }
        if (++cnt[k] > best) best = cnt[k], n = tgt[b];
    }
    if (!n || (uint32_t)n == s) return UNIFORM_MIXED; /* none, or a loop with exceptions */
    int ne = 0;
    ex[0] = ex[1] = 0;
    for (unsigned b = 0x20; b < 0x7f; b++)
        if (byte_plain((uint8_t)b) && tgt[b] != n) {
            ex[b >> 6] |= 1ull << (b & 63);
            ne++;
        }
    if (ne > EXCEPT_MAX || !multibyte_to(m, s, (uint32_t)n) || m->oom) return UNIFORM_MIXED;
    return (uint32_t)n;
}

/*
 * uniform_next by thread groups. A state's threads on one same stack f (a group) step
 * alike whatever f holds: a character either leaves them inside f's frame (threads on
 * stacks above f, the same whatever f is) or pops it. So whether every plain character
 * takes the group to one same set of threads is a property of the group's program counters
 * alone, found once by uniform_next on the group as a state of its own and kept by its
 * pcs: a bounded string's next position (its character subroutine's threads on a new
 * frame, and the closing quote's on the frame below) then costs no multi-byte state. A
 * state whose groups are each uniform (or take no plain character and no lead byte) is
 * uniform, its next state the one a space leads to; otherwise uniform_next decides.
 */
enum { GV_UNKNOWN = 0, GV_MIXED, GV_DEAD, GV_LIVE };
struct grp_memo {
    uint64_t hash;
    uint32_t off, n; /* the pcs: gm_pcs[off .. off + n) */
    uint8_t top;     /* the group was on the empty stack: nothing to pop */
    uint8_t verdict;
};

static bool set_takes_plain(const cst_byteset *b)
{
    /* plain ASCII, or a lead byte 0xC2..0xF4 (bits 2..52 of the last word) */
    return (b->w[0] & PLAIN_ASCII_LO) || (b->w[1] & PLAIN_ASCII_HI) ||
           (b->w[3] & (((1ull << 53) - 1) & ~3ull));
}

static uint8_t *grp_verdict(cst_matcher *m, const uint32_t *pcs, uint32_t n, bool top)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n ^ (uint64_t)top << 40;
    for (uint32_t i = 0; i < n; i++) h = mix64(h ^ pcs[i]);
    if ((m->gm_n + 1) * 2 >= m->gm_cap) {
        uint32_t cap = m->gm_cap ? m->gm_cap * 2 : 64;
        struct grp_memo *t = calloc(cap, sizeof *t);
        if (!t) return NULL;
        for (uint32_t i = 0; i < m->gm_cap; i++)
            if (m->gm[i].verdict) {
                uint32_t j = (uint32_t)m->gm[i].hash & (cap - 1);
                while (t[j].verdict) j = (j + 1) & (cap - 1);
                t[j] = m->gm[i];
            }
        free(m->gm);
        m->gm = t;
        m->gm_cap = cap;
    }
    uint32_t j = (uint32_t)h & (m->gm_cap - 1);
    for (; m->gm[j].verdict; j = (j + 1) & (m->gm_cap - 1)) {
        struct grp_memo *e = &m->gm[j];
        if (e->hash == h && e->n == n && e->top == top &&
            !memcmp(m->gm_pcs + e->off, pcs, n * sizeof *pcs))
            return &e->verdict;
    }
    if (grow((void **)&m->gm_pcs, &m->gm_pcscap, m->gm_npcs + n, sizeof *m->gm_pcs)) return NULL;
    memcpy(m->gm_pcs + m->gm_npcs, pcs, n * sizeof *pcs);
    m->gm[j] = (struct grp_memo){h, (uint32_t)m->gm_npcs, n, top, GV_UNKNOWN};
    m->gm_npcs += n;
    m->gm_n++;
    return &m->gm[j].verdict;
}

#define GROUP_MAX_THREADS 256

/* known_only: answer only from the groups' verdicts already known (one step, no
 * multi-byte state), else CNEXT_UNKNOWN */
static uint32_t uniform_next_fast(cst_matcher *m, uint32_t s, bool known_only)
{
    size_t n = m->st_len[s];
    if (n == 0 || n > GROUP_MAX_THREADS) return known_only ? CNEXT_UNKNOWN : uniform_next(m, s);
    uint64_t t[GROUP_MAX_THREADS]; /* (stack << 32 | pc), sorted */
    for (size_t i = 0; i < n; i++) {
        uint64_t x = m->threads[m->st_off[s] + i];
        t[i] = (x & 0xFFFFFFFFull) << 32 | x >> 32;
    }
    for (size_t i = 1; i < n; i++) /* insertion sort: a state has few threads */
        for (size_t k = i; k > 0 && t[k - 1] > t[k]; k--) {
            uint64_t y = t[k];
            t[k] = t[k - 1];
            t[k - 1] = y;
        }
    const cst_inst *in = m->p->insts;
    for (size_t a = 0; a < n;) {
        uint32_t f = (uint32_t)(t[a] >> 32);
        size_t b = a;
        bool takes = false;
        uint32_t pcs[GROUP_MAX_THREADS];
        while (b < n && (uint32_t)(t[b] >> 32) == f) {
            uint32_t pc = (uint32_t)t[b];
            pcs[b - a] = pc;
            if (in[pc].op == OP_SET && set_takes_plain(&m->p->sets[in[pc].a])) takes = true;
            b++;
        }
        uint32_t ng = (uint32_t)(b - a);
        a = b;
        if (!takes) continue; /* no plain character, no lead byte: dead for all alike */
        if (f && m->stk[f].depth > MAX_STACK_DEPTH / 2)
            return known_only ? CNEXT_UNKNOWN : uniform_next(m, s);
        uint8_t *v = grp_verdict(m, pcs, ng, f == 0);
        if (!v) return m->oom = -ENOMEM, UNIFORM_MIXED;
        if (*v == GV_UNKNOWN && known_only) return CNEXT_UNKNOWN;
        if (*v == GV_UNKNOWN) {
            /* the group as a state of its own, decided the slow way once: on a frame of its
             * own whose return is the sentinel (a pc no code reaches), so that a character
             * that pops the frame is told from one that does not */
            uint32_t fs = 0;
            if (f) {
                if (!m->g->sentinel) return uniform_next(m, s);
                fs = stk_push(m, 0, m->g->sentinel);
                if (fs == UINT32_MAX) return m->oom = m->oom ? m->oom : -ENOMEM, UNIFORM_MIXED;
            }
            if (grow((void **)&m->work, &m->workcap, ng, sizeof *m->work))
                return m->oom = -ENOMEM, UNIFORM_MIXED;
            for (uint32_t i = 0; i < ng; i++) m->work[i] = (uint64_t)pcs[i] << 32 | fs;
            m->nwork = ng;
            int32_t gs = intern_state(m);
            if (gs < 0) return m->oom = -ENOMEM, UNIFORM_MIXED;
            uint32_t r = uniform_next(m, (uint32_t)gs);
            if (m->oom) return UNIFORM_MIXED;
            v = grp_verdict(m, pcs, ng, f == 0); /* the table may have moved */
            if (!v) return m->oom = -ENOMEM, UNIFORM_MIXED;
            *v = r == UNIFORM_MIXED ? GV_MIXED : r == 0 ? GV_DEAD : GV_LIVE;
            if (gs == (int32_t)s) return r; /* s was that group */
        }
        if (*v == GV_MIXED) return known_only ? CNEXT_UNKNOWN : uniform_next(m, s);
    }
    return (uint32_t)step(m, s, ' ');
}

/*
 * How many plain characters state s takes in a row, each step taking every plain
 * character to one same state (a string's body: CHAIN_INF, it loops; a string with
 * maxLength: the characters left), and whether after them no character is taken at all
 * (CHAIN_DEAD_TAIL). A token made of plain characters only is then allowed exactly when it
 * begins no more characters than the chain is long, or, when the tail is not dead, when it
 * begins no more than that and ... (the walk decides those). Cached per state, and for the
 * states along the chain.
 */
static uint16_t char_chain(cst_matcher *m, uint32_t s)
{
    if (m->st_chain[s] != CHAIN_UNKNOWN) return m->st_chain[s];
    uint32_t path[CHAIN_LIMIT];
    size_t np = 0;
    uint16_t tail;
    uint32_t x = s;
    for (;;) {
        if (m->st_chain[x] != CHAIN_UNKNOWN) {
            tail = m->st_chain[x];
            break;
        }
        uint32_t n = m->st_cnext[x];
        if (n == CNEXT_UNKNOWN) {
            n = uniform_next_fast(m, x, false);
            if (m->oom) return 0; /* no answer: the caller sees m->oom */
            m->st_cnext[x] = n;
        }
        if (n == UNIFORM_MIXED) {
            tail = m->st_chain[x] = 0;
            break;
        }
        if (n == 0) {
            tail = m->st_chain[x] = CHAIN_DEAD_TAIL;
            break;
        }
        if (n == x) {
            tail = m->st_chain[x] = CHAIN_INF;
            break;
        }
        if (np == CHAIN_LIMIT) { /* far enough: the walk steps the longer tokens */
            tail = CHAIN_AT_LEAST;
            break;
        }
        path[np++] = x;
        x = n;
    }
    /* the states on the path: one more character each, back to s */
    while (np) {
        uint32_t k = tail & CHAIN_INF;
        if (k != CHAIN_INF) k = k + 1 >= CHAIN_INF ? CHAIN_INF - 1 : k + 1;
        tail = (uint16_t)((tail & ~CHAIN_INF) | k);
        m->st_chain[path[--np]] = tail;
    }
    return m->st_chain[s];
}

/*
 * The largest set of ASCII bytes state s takes to one same state (st_cset), and how many
 * times in a row such a step repeats with the same set (each step from the state before
 * taking every byte of the set to one same, live state), followed at most limit times: a
 * token whose bytes are all in the set is allowed when it is no longer than that. Cached per
 * state (a count found under a smaller limit is still a true count, only shorter).
 */
static uint16_t class_chain(cst_matcher *m, uint32_t s, uint16_t limit)
{
    if (m->st_cls[s] != CLS_UNKNOWN) return m->st_cls[s];
    int32_t tgt[128];
    for (int b = 0; b < 128; b++) tgt[b] = step(m, s, (uint8_t)b);
    if (m->oom) return CLS_NONE;
    int32_t best = 0;
    int nbest = 0;
    for (int b = 0; b < 128; b++) {
        if (!tgt[b] || tgt[b] == best) continue;
        int n = 0;
        for (int c = b; c < 128; c++) n += tgt[c] == tgt[b];
        if (n > nbest) nbest = n, best = tgt[b];
    }
    if (nbest < CLS_MIN_BYTES) return m->st_cls[s] = CLS_NONE;
    uint64_t set[2] = {0, 0};
    uint8_t first = 0;
    for (int b = 127; b >= 0; b--)
        if (tgt[b] == best) set[b >> 6] |= 1ull << (b & 63), first = (uint8_t)b;
    uint16_t k = 1;
    uint32_t x = (uint32_t)best;
    while (k < limit) {
        int32_t y = step(m, x, first);
        bool same = y != 0;
        for (int b = first + 1; b < 128 && same; b++)
            if (set[b >> 6] >> (b & 63) & 1) same = step(m, x, (uint8_t)b) == y;
        if (m->oom) return CLS_NONE;
        if (!same) break;
        if ((uint32_t)y == x) {
            k = CHAIN_INF;
            break;
        }
        x = (uint32_t)y;
        k++;
    }
    m->st_cset[s][0] = set[0];
    m->st_cset[s][1] = set[1];
    return m->st_cls[s] = k;
}

/* The tails' trie nodes live from state x, as bits, cached per state. NULL when over the
 * cache's bound or on ENOMEM (m->oom). */
static const uint64_t *tail_live(cst_matcher *m, uint32_t x, uint32_t *nsteps)
{
    if (m->st_tail[x]) return m->st_tail[x];
    const cst_vocab *v = m->v;
    size_t words = ((size_t)v->n_tl + 63) / 64 + 1;
    if (m->mask_bytes + words * 8 > MASK_CACHE_BYTES) return NULL;
    uint64_t *bits = calloc(words, sizeof *bits);
    if (!bits) {
        m->oom = -ENOMEM;
        return NULL;
    }
    int32_t *walk = m->walk;
    walk[0] = (int32_t)x;
    uint32_t n = 0;
    for (uint32_t i = 1; i < v->n_tl;) {
        int32_t s = step(m, (uint32_t)walk[v->tl_depth[i] - 1], v->tl_byte[i]);
        n++;
        if (s == 0) {
            i = v->tl_end[i];
            continue;
        }
        walk[v->tl_depth[i]] = s;
        bits[i >> 6] |= 1ull << (i & 63);
        i++;
    }
    *nsteps += n;
    if (m->oom) {
        free(bits);
        return NULL;
    }
    m->st_tail[x] = bits;
    m->mask_bytes += words * 8;
    return bits;
}

/* Where character c (from 0) of a token begins: its c-th byte that is not a continuation. */
static uint32_t char_offset(const uint8_t *b, uint32_t len, uint32_t c)
{
    for (uint32_t d = 0; d < len; d++)
        if ((b[d] & 0xC0) != 0x80 && c-- == 0) return d;
    return len;
}

/* Whether token id's bytes from character c on are live from state x. */
static bool step_from_char(cst_matcher *m, uint32_t x, int32_t id, uint32_t c, uint32_t *nsteps)
{
    const cst_vocab *v = m->v;
    const uint8_t *b = v->bytes + v->off[id];
    uint32_t len = (uint32_t)(v->off[id + 1] - v->off[id]);
    for (uint32_t d = char_offset(b, len, c); d < len && x; d++, (*nsteps)++)
        x = (uint32_t)step(m, x, b[d]);
    return x != 0;
}

/* As uniform_next, for the plain ASCII bytes only (no multi-byte state is made). */
static uint32_t ascii_next(cst_matcher *m, uint32_t x)
{
    if (m->st_anext[x] != CNEXT_UNKNOWN) return m->st_anext[x];
    uint32_t n = (uint32_t)step(m, x, ' ');
    for (unsigned b = 0x21; b < 0x7f && n != UNIFORM_MIXED; b++)
        if (byte_plain((uint8_t)b) && (uint32_t)step(m, x, (uint8_t)b) != n) n = UNIFORM_MIXED;
    if (m->oom) return UNIFORM_MIXED;
    return m->st_anext[x] = n;
}

static void walk_range(cst_matcher *m, uint32_t s0, uint32_t lo, uint32_t hi, uint32_t *mask,
                       uint32_t *nsteps_out, uint32_t *visits_out);

#define SPLIT_MIN_CHAIN 16 /* a chain this long is followed, and enough for split_mask */
/* impure tokens with more plain characters than this (Llama 3: 1,850 of 6,176) have their
 * tails stepped one by one from a bounded chain's state; those with fewer by the tails'
 * walk, cached per state */
#define TAIL_WALK_MAX   1

/*
 * The mask of a state inside a chain of plain characters (a string's body, bounded or
 * not) without walking the trie: the pure tokens by their length, the impure ones by
 * their tail from the chain's state after their plain characters (cached per state, so a
 * bounded string's next position walks the tails of one new state). Tokens longer than a
 * chain followed only so far (or that ends in a state taking characters unevenly) are
 * stepped from its last state. Returns 1 (mask written), 0 (not such a state, or the
 * tails' cache is full: the caller walks; mask undefined) or a negative errno.
 */
static int split_mask(cst_matcher *m, uint32_t s0, uint32_t *mask, uint32_t *nsteps)
{
    const cst_vocab *v = m->v;
    uint32_t need = v->pure_max > v->imp_max ? v->pure_max : v->imp_max;
    uint32_t *cn = m->chain, J = 0, x = s0;
    enum { C_FAR, C_MIXED, C_DEAD, C_LOOP } why = C_FAR;
    uint64_t ex[2] = {0, 0}; /* the first character's exceptions (uniform_except) */
    bool except = false;
    cn[0] = s0;
    while (J < need) {
        uint32_t n = m->st_cnext[x];
        if (n == CNEXT_UNKNOWN) {
            /* past SPLIT_MIN_CHAIN only where the groups' verdicts are known (a bounded
             * string's positions: one step each); otherwise far enough, the longer tokens
             * are stepped */
            n = uniform_next_fast(m, x, J >= SPLIT_MIN_CHAIN);
            if (m->oom) return m->oom;
            if (n == CNEXT_UNKNOWN) break;
            m->st_cnext[x] = n;
        }
        if (n == UNIFORM_MIXED && J == 0) {
            /* uniform but for a few ASCII bytes: the chain from where the others lead, and
             * the tokens that begin with an exception walked from s0 (below) */
            n = uniform_except(m, x, ex);
            if (m->oom) return m->oom;
            except = n != UNIFORM_MIXED;
        }
        if (n == UNIFORM_MIXED) {
            why = C_MIXED;
            break;
        }
        if (n == 0) {
            why = C_DEAD;
            break;
        }
        if (n == x) {
            why = C_LOOP;
            break;
        }
        cn[++J] = n;
        x = n;
    }
    if (J == 0 && why != C_LOOP) return 0;
    if ((why == C_FAR || why == C_MIXED) && J < SPLIT_MIN_CHAIN && J < need) return 0;
    bool stepped = why == C_FAR || why == C_MIXED; /* longer tokens: step from cn[J] */
    /* pure tokens: allowed up to J characters (any number in a loop) */
    uint32_t nle = why == C_LOOP || J >= v->pure_max ? v->n_pure : v->pure_at[J + 1];
    if ((uint64_t)nle * 2 >= v->n_pure) {
        memcpy(mask, v->pure_bits, cst_mask_words(v) * sizeof *mask);
        for (uint32_t q = nle; q < v->n_pure; q++)
            mask[v->pure_ids[q] >> 5] &= ~(1u << (v->pure_ids[q] & 31));
    } else
        for (uint32_t q = 0; q < nle; q++) mask[v->pure_ids[q] >> 5] |= 1u << (v->pure_ids[q] & 31);
    if (stepped && nle < v->n_pure) {
        /* the longer tokens: those of ASCII characters after the J-th by the states
         * that take plain ASCII bytes in a row after cn[J] (cheap to follow: no
         * multi-byte state), the others stepped */
        uint32_t A = J;
        bool loop = false, dead = false;
        while (A < v->pure_max) {
            uint32_t n = ascii_next(m, cn[A]);
            if (n == UNIFORM_MIXED) break;
            if (n == 0) {
                dead = true;
                break;
            }
            if (n == cn[A]) {
                loop = true;
                break;
            }
            cn[++A] = n;
        }
        if (m->oom) return m->oom;
        for (uint32_t c = J + 1; c <= v->pure_max; c++)
            for (uint32_t q = v->pure_at[c]; q < v->pure_at[c + 1]; q++) {
                int32_t id = v->pure_ids[q];
                bool ok;
                if (v->pure_hi[q] > J) /* a character that is not ASCII after cn[J] */
                    ok = step_from_char(m, cn[J], id, J, nsteps);
                else if (loop || c <= A)
                    ok = true;
                else
                    ok = !dead && step_from_char(m, cn[A], id, A, nsteps);
                if (ok) mask[id >> 5] |= 1u << (id & 31);
            }
        if (m->oom) return m->oom;
    }
    /* impure tokens: their tails from the state after their plain characters */
    for (uint32_t k = 0; k < v->n_imp; k++) {
        uint32_t pl = v->imp_plen[k];
        int32_t id = v->imp_id[k];
        if (pl > J && why != C_LOOP) {
            if (!stepped)
                break; /* a dead tail: no character after cn[J], and the
                                  * tokens are by plain characters ascending */
            if (step_from_char(m, cn[J], id, J, nsteps)) mask[id >> 5] |= 1u << (id & 31);
            if (m->oom) return m->oom;
            continue;
        }
        if (pl > TAIL_WALK_MAX && why != C_LOOP) {
            /* few tokens: their tails stepped, not the tails' trie walked from one more
             * chain state (a bounded string's every position makes its escapes' states) */
            if (step_from_char(m, cn[pl], id, pl, nsteps)) mask[id >> 5] |= 1u << (id & 31);
            if (m->oom) return m->oom;
            continue;
        }
        uint32_t st = cn[pl > J ? J : pl];
        const uint64_t *tl = m->st_tail[st];
        if (!tl && !(tl = tail_live(m, st, nsteps))) return m->oom ? m->oom : 0;
        uint32_t node = v->imp_node[k];
        if (tl[node >> 6] >> (node & 63) & 1) mask[id >> 5] |= 1u << (id & 31);
    }
    if (except) {
        /* the tokens that begin with an exception byte: their subtree (one child of the
         * root) cleared and walked from s0 */
        const trie_node *nodes = v->nodes;
        uint32_t visits = 0;
        for (uint32_t i = 1; i < v->n_nodes; i = nodes[i].end) {
            uint8_t b = nodes[i].byte;
            if (b >= 0x80 || !(ex[b >> 6] >> (b & 63) & 1)) continue;
            for (uint32_t q = nodes[i].tok_first; q < nodes[i].tok_end; q++)
                mask[v->sorted[q] >> 5] &= ~(1u << (v->sorted[q] & 31));
            walk_range(m, s0, i, nodes[i].end, mask, nsteps, &visits);
            if (m->oom) return m->oom;
        }
    }
    return 1;
}

/* The tokens of the trie's nodes [lo, hi) (whole subtrees of the root's children) allowed
 * from state s0 (not dead), by one walk (bits or'ed into mask; errors in m->oom). */
static void walk_range(cst_matcher *m, uint32_t s0, uint32_t lo, uint32_t hi, uint32_t *mask,
                       uint32_t *nsteps_out, uint32_t *visits_out)
{
    const cst_vocab *v = m->v;
    const trie_node *nodes = v->nodes;
    int32_t *walk = m->walk;
    uint32_t nsteps = 0, visits = 0;
    walk[0] = (int32_t)s0;
    uint32_t no_new_chain = 0, no_new_cls = 0;
    for (uint32_t i = lo; i < hi;) {
        const trie_node *t = &nodes[i];
        visits++;
        uint32_t ps = (uint32_t)walk[t->depth - 1];
        /* a subtree of plain characters only, from a state that takes them in a
         * chain: each token is allowed by its length alone, without a step (the inside
         * of a string, of a string with maxLength) */
        if (t->plain_below && (i >= no_new_chain || m->st_chain[ps] != CHAIN_UNKNOWN)) {
            uint16_t ch = char_chain(m, ps);
            uint32_t k = ch & CHAIN_INF, base = t->chars_before;
            if (k == CHAIN_INF || (uint32_t)t->max_chars - base <= k) {
                for (uint32_t q = t->tok_first; q < t->tok_end; q++) {
                    int32_t id = v->sorted[q];
                    mask[id >> 5] |= 1u << (id & 31);
                }
                i = t->end;
                continue;
            }
            if ((ch & (CHAIN_DEAD_TAIL | CHAIN_AT_LEAST)) == CHAIN_DEAD_TAIL) {
                for (uint32_t q = t->tok_first; q < t->tok_end; q++) {
                    if ((uint32_t)v->chars[q] - base > k) continue;
                    int32_t id = v->sorted[q];
                    mask[id >> 5] |= 1u << (id & 31);
                }
                i = t->end;
                continue;
            }
            /* the chain was followed so far only (a long bounded string): the longer
             * tokens of ASCII bytes by the state's class chain, which is followed
             * further and costs no multi-byte states, and the few others one by one */
            uint16_t kc = (ch & CHAIN_AT_LEAST) ? class_chain(m, ps, CLS_CHAIN_LIMIT) : CLS_NONE;
            if (kc != CLS_NONE && !(PLAIN_ASCII_LO & ~m->st_cset[ps][0]) &&
                !(PLAIN_ASCII_HI & ~m->st_cset[ps][1])) {
                for (uint32_t q = t->tok_first; q < t->tok_end; q++) {
                    uint32_t c = (uint32_t)v->chars[q] - base;
                    int32_t id = v->sorted[q];
                    if (c > k && (v->last_high[q] >= t->depth || (kc != CHAIN_INF && c > kc))) {
                        /* step it from here */
                        const uint8_t *b = v->bytes + v->off[id];
                        uint32_t len = (uint32_t)(v->off[id + 1] - v->off[id]);
                        int32_t x = (int32_t)ps;
                        for (uint32_t d = t->depth - 1u; d < len && x; d++)
                            x = step(m, (uint32_t)x, b[d]);
                        nsteps += len;
                        if (!x) continue;
                    }
                    mask[id >> 5] |= 1u << (id & 31);
                }
                if (m->oom) break;
                i = t->end;
                continue;
            }
            /* the chain is too short for this subtree's longest tokens: step them, and
             * follow no new chains below (they would only lengthen this one) */
            if (t->end > no_new_chain) no_new_chain = t->end;
        }
        /* a subtree of bytes of one class, from a state that takes them in a chain:
         * allowed by length alone (a pattern's or a format's characters) */
        if (t->byte < 0x80 && t->tok_end - t->tok_first >= CLS_MIN_TOKENS &&
            (i >= no_new_cls || m->st_cls[ps] != CLS_UNKNOWN)) {
            uint16_t k = class_chain(m, ps, CLS_CHAIN_LIMIT);
            if (k != CLS_NONE && !t->high_below && !(v->ascii_below[i][0] & ~m->st_cset[ps][0]) &&
                !(v->ascii_below[i][1] & ~m->st_cset[ps][1])) {
                if (k == CHAIN_INF || (uint32_t)t->max_chars - t->chars_before <= k) {
                    for (uint32_t q = t->tok_first; q < t->tok_end; q++) {
                        int32_t id = v->sorted[q];
                        mask[id >> 5] |= 1u << (id & 31);
                    }
                    i = t->end;
                    continue;
                }
                if (t->end > no_new_cls) no_new_cls = t->end;
            }
        }
        int32_t s = step(m, ps, t->byte);
        nsteps++;
        if (s == 0) {
            i = t->end;
            continue;
        }
        walk[t->depth] = s;
        for (uint32_t k = 0; k < t->tok_count; k++) {
            int32_t id = v->sorted[t->tok_start + k];
            mask[id >> 5] |= 1u << (id & 31);
        }
        i++;
    }
    *nsteps_out += nsteps;
    *visits_out += visits;
}

/* The mask of state s0 (not dead) by one walk of the trie (mask zeroed by the caller;
 * errors in m->oom). */
static void walk_mask(cst_matcher *m, uint32_t s0, uint32_t *mask, uint32_t *nsteps_out,
                      uint32_t *visits_out)
{
    walk_range(m, s0, 1, m->v->n_nodes, mask, nsteps_out, visits_out);
}

/* Caches mask as state s's (while the cache is under its bound). */
static void cache_mask(cst_matcher *m, uint32_t s, const uint32_t *mask)
{
    size_t words = cst_mask_words(m->v);
    if (m->st_mask[s] || m->mask_bytes + words * 4 > MASK_CACHE_BYTES || s >= m->nstates) return;
    uint32_t *c = malloc(words * sizeof *c);
    if (!c) return;
    memcpy(c, mask, words * sizeof *c);
    m->st_mask[s] = c;
    m->mask_bytes += words * 4;
}

#define NARROW_ASCII 32 /* a thread taking fewer plain ASCII bytes is "narrow" (part_mask) */

/*
 * The mask of a state that is a run of plain characters beside a few narrow threads (a key
 * that is one of the properties' names or any string, a value that is a string or a
 * number): a token is allowed from a state when it is from one of its parts (the threads
 * run independently), so the mask is the broad part's split mask (split_mask) or'ed with
 * the narrow part's walk, which the literals prune at once. Each part is a DFA state of its
 * own, its mask cached. Returns 1 (mask written), 0 (no such split: the caller walks; mask
 * undefined) or a negative errno.
 */
static int part_mask(cst_matcher *m, uint32_t s0, uint32_t *mask, uint32_t *nsteps,
                     uint32_t *visits)
{
    const cst_vocab *v = m->v;
    size_t n = m->st_len[s0], words = cst_mask_words(v);
    if (n < 2) return 0;
    if (grow((void **)&m->part, &m->partcap, n, sizeof *m->part) ||
        grow((void **)&m->work, &m->workcap, n, sizeof *m->work))
        return -ENOMEM;
    const cst_inst *in = m->p->insts;
    size_t n1 = 0, n2 = n; /* broad ones in part[0, n1), narrow ones in part[n2, n) */
    for (size_t i = 0; i < n; i++) {
        uint64_t t = m->threads[m->st_off[s0] + i];
        const cst_inst *x = &in[t >> 32];
        bool narrow = false;
        if (x->op == OP_SET) {
            const cst_byteset *b = &m->p->sets[x->a];
            int c = __builtin_popcountll(b->w[0] & PLAIN_ASCII_LO) +
                    __builtin_popcountll(b->w[1] & PLAIN_ASCII_HI);
            narrow = c > 0 && c < NARROW_ASCII;
        }
        if (narrow)
            m->part[--n2] = t;
        else
            m->part[n1++] = t;
    }
    if (n1 == 0 || n2 == n) return 0;
    memcpy(m->work, m->part, n1 * sizeof *m->work);
    m->nwork = n1;
    int32_t s1 = intern_state(m);
    if (s1 < 0) return -ENOMEM;
    memcpy(m->work, m->part + n2, (n - n2) * sizeof *m->work);
    m->nwork = n - n2;
    int32_t s2 = intern_state(m);
    if (s2 < 0) return -ENOMEM;
    if (!m->pmask && !(m->pmask = malloc(2 * words * sizeof *m->pmask))) return -ENOMEM;
    const uint32_t *a = m->st_mask[s1], *b;
    if (!a) {
        uint32_t *t = m->pmask;
        memset(t, 0, words * sizeof *t);
        int r = split_mask(m, (uint32_t)s1, t, nsteps);
        if (r <= 0) return r; /* not a run: the whole state is walked */
        if (m->st_accept[s1]) set_end_bits(v, t);
        cache_mask(m, (uint32_t)s1, t);
        a = t;
    }
    if (!(b = m->st_mask[s2])) {
        uint32_t *t = m->pmask + words;
        memset(t, 0, words * sizeof *t);
        walk_mask(m, (uint32_t)s2, t, nsteps, visits);
        if (m->oom) return m->oom;
        if (m->st_accept[s2]) set_end_bits(v, t);
        cache_mask(m, (uint32_t)s2, t);
        b = t;
    }
    for (size_t w = 0; w < words; w++) mask[w] = a[w] | b[w];
    return 1;
}

/* The split of the vocabulary by class set (built on first use, kept per matcher): the
 * tokens whose first byte is in the set, each with its leading bytes in the set. */
static const struct cls_split *class_split(cst_matcher *m, const uint64_t set[2])
{
    const cst_vocab *v = m->v;
    struct cls_split *c = NULL;
    m->cls_clock++;
    for (int i = 0; i < CLASS_SPLITS; i++) {
        struct cls_split *x = &m->cls[i];
        if (x->set[0] == set[0] && x->set[1] == set[1] && x->id) {
            x->used = m->cls_clock;
            return x;
        }
        if (!c || x->used < c->used) c = x;
    }
    free(c->id);
    free(c->pre);
    free(c->len);
    *c = (struct cls_split){{0, 0}, NULL, NULL, NULL, 0, 0};
    uint32_t n = 0;
    for (int id = 0; id < v->n_tokens; id++) {
        if (v->off[id + 1] == v->off[id]) continue;
        uint8_t b = v->bytes[v->off[id]];
        n += b < 0x80 && (set[b >> 6] >> (b & 63) & 1);
    }
    c->id = malloc(((size_t)n + 1) * sizeof *c->id);
    c->pre = malloc(((size_t)n + 1) * sizeof *c->pre);
    c->len = malloc(((size_t)n + 1) * sizeof *c->len);
    if (!c->id || !c->pre || !c->len) {
        free(c->id);
        free(c->pre);
        free(c->len);
        c->id = NULL, c->pre = c->len = NULL;
        m->oom = -ENOMEM;
        return NULL;
    }
    for (int id = 0; id < v->n_tokens; id++) {
        const uint8_t *b = v->bytes + v->off[id];
        uint64_t len = v->off[id + 1] - v->off[id];
        if (!len || b[0] >= 0x80 || !(set[b[0] >> 6] >> (b[0] & 63) & 1)) continue;
        uint32_t p = 1;
        while (p < len && b[p] < 0x80 && (set[b[p] >> 6] >> (b[p] & 63) & 1)) p++;
        c->id[c->n] = id;
        c->pre[c->n] = p;
        c->len[c->n++] = (uint32_t)len;
    }
    c->set[0] = set[0], c->set[1] = set[1];
    c->used = m->cls_clock;
    return c;
}

/* Whether bytes b[from, len) are live from state x. */
static bool step_bytes(cst_matcher *m, uint32_t x, const uint8_t *b, uint32_t from, uint32_t len,
                       uint32_t *nsteps)
{
    for (uint32_t d = from; d < len && x; d++, (*nsteps)++) x = (uint32_t)step(m, x, b[d]);
    return x != 0;
}

/*
 * The mask of a state that takes a class of ASCII bytes in a chain (class_chain: a
 * pattern's or a format's characters under a repeat), without walking the trie: a token
 * that begins in the class is its leading bytes in the class, which lead along the chain
 * (x_1 .. x_K, or a loop), then the rest stepped from there (most die at their first byte);
 * the tokens that begin outside the class are walked from s0 (most at once dead). Returns
 * 1 (mask written), 0 (no such class: the caller walks; mask undefined) or a negative
 * errno.
 */
static int class_mask(cst_matcher *m, uint32_t s0, uint32_t *mask, uint32_t *nsteps,
                      uint32_t *visits)
{
    const cst_vocab *v = m->v;
    uint16_t k = class_chain(m, s0, CLASS_MASK_CHAIN);
    if (m->oom) return m->oom;
    if (k == CLS_NONE) return 0;
    uint64_t set[2] = {m->st_cset[s0][0], m->st_cset[s0][1]};
    if (__builtin_popcountll(set[0]) + __builtin_popcountll(set[1]) < CLASS_SPLIT_BYTES) return 0;
    uint8_t first = 0;
    while (!(set[first >> 6] >> (first & 63) & 1)) first++;
    /* the chain's states: x[i] after i bytes of the class (K of them, then a loop or
     * stepped) */
    uint32_t *x = m->chain, K = 0, lim = v->max_depth;
    bool loop = false;
    x[0] = s0;
    while (K < lim && (k == CHAIN_INF || K < k)) {
        uint32_t y = (uint32_t)step(m, x[K], first);
        (*nsteps)++;
        if (y == x[K] && K > 0) {
            loop = true;
            break;
        }
        x[++K] = y;
    }
    if (m->oom) return m->oom;
    const struct cls_split *c = class_split(m, set);
    if (!c) return m->oom ? m->oom : -ENOMEM;
    /* the chain's states that take every plain character back to themselves (an
     * unanchored pattern once matched): a token of plain characters only is allowed from
     * them whatever follows its leading bytes in the class */
    uint8_t *ploop = (uint8_t *)m->walk; /* scratch: [K + 1], 0 unknown, 1 no, 2 yes */
    memset(ploop, 0, K + 1);
    for (uint32_t i = 0; i < c->n; i++) {
        int32_t id = c->id[i];
        uint32_t p = c->pre[i], len = c->len[i];
        uint32_t q = p <= K ? p : K, from = loop && p > K ? p : q;
        bool ok = p == len && (loop || len <= K);
        if (!ok && v->pure_bits[id >> 5] >> (id & 31) & 1) {
            if (!ploop[q]) ploop[q] = (char_chain(m, x[q]) & CHAIN_INF) == CHAIN_INF ? 2 : 1;
            ok = ploop[q] == 2;
        }
        if (!ok) ok = step_bytes(m, x[q], v->bytes + v->off[id], from, len, nsteps);
        if (ok) mask[id >> 5] |= 1u << (id & 31);
        if (m->oom) return m->oom;
    }
    /* the tokens that begin outside the class */
    const trie_node *nodes = v->nodes;
    for (uint32_t i = 1; i < v->n_nodes; i = nodes[i].end) {
        uint8_t b = nodes[i].byte;
        if (b < 0x80 && (set[b >> 6] >> (b & 63) & 1)) continue;
        walk_range(m, s0, i, nodes[i].end, mask, nsteps, visits);
        if (m->oom) return m->oom;
    }
    return 1;
}

int cst_matcher_mask(cst_matcher *m, uint32_t *mask)
{
    const cst_vocab *v = m->v;
    size_t words = cst_mask_words(v);
    memset(mask, 0, words * sizeof *mask);
    if (m->ended) return 0;
    if (maybe_flush(m)) return -ENOMEM;
    uint32_t s0 = m->cur;
    m->last_state = s0;
    if (m->st_mask[s0]) {
        memcpy(mask, m->st_mask[s0], words * sizeof *mask);
        m->last_cached = true;
        return 0;
    }
    m->last_cached = false;
    uint64_t made0 = m->made;
    uint32_t nsteps = 0, visits = 0;
    m->oom = 0;
    int how = 0; /* 1: split, 2: parted, 3: classed, 0: walked */
    if (s0 != 0) {
        int r = split_mask(m, s0, mask, &nsteps);
        if (r > 0) how = 1;
        if (r == 0) {
            memset(mask, 0, words * sizeof *mask);
            r = part_mask(m, s0, mask, &nsteps, &visits);
            if (r > 0) how = 2;
        }
        if (r == 0) {
            memset(mask, 0, words * sizeof *mask);
            r = class_mask(m, s0, mask, &nsteps, &visits);
            if (r > 0) how = 3;
        }
        if (r < 0) m->oom = r;
        if (r == 0) {
            memset(mask, 0, words * sizeof *mask);
            walk_mask(m, s0, mask, &nsteps, &visits);
        }
    }
    m->last_split = how;
    m->last_nodes = nsteps;
    m->last_made = (uint32_t)(m->made - made0);
    m->last_visits = visits;
    if (m->oom) {
        memset(mask, 0, words * sizeof *mask);
        return m->oom;
    }
    if (m->st_accept[s0]) set_end_bits(v, mask);
    cache_mask(m, s0, mask);
    return 0;
}

static bool is_end_token(const cst_vocab *v, int32_t t)
{
    for (int e = 0; e < v->n_end; e++)
        if (v->end_tokens[e] == t) return true;
    return false;
}

int cst_matcher_feed(cst_matcher *m, const void *bytes, size_t len)
{
    if (m->ended) return -EINVAL;
    if (maybe_flush(m)) return -ENOMEM;
    const uint8_t *b = bytes;
    uint32_t s = m->cur;
    m->oom = 0;
    for (size_t i = 0; i < len && s; i++) s = (uint32_t)step(m, s, b[i]);
    if (m->oom) return m->oom;
    if (s == 0) return -EINVAL;
    m->cur = s;
    return 0;
}

int cst_matcher_accept(cst_matcher *m, int32_t token)
{
    const cst_vocab *v = m->v;
    if (token < 0 || token >= v->n_tokens || m->ended) return -EINVAL;
    if (is_end_token(v, token)) {
        if (!m->st_accept[m->cur]) return -EINVAL;
        m->ended = true;
        return 0;
    }
    uint32_t len;
    const uint8_t *b = cst_vocab_token(v, token, &len);
    if (len == 0) return -EINVAL;
    return cst_matcher_feed(m, b, len);
}

bool cst_matcher_can_end(const cst_matcher *m)
{
    return m->ended || m->st_accept[m->cur];
}

bool cst_matcher_ended(const cst_matcher *m)
{
    return m->ended;
}

long cst_matcher_forced(cst_matcher *m, uint8_t *out, size_t cap)
{
    if (m->ended) return 0;
    const cst_grammar *g = m->g;
    uint32_t s = m->cur;
    size_t n = 0;
    m->oom = 0;
    while (n < cap && s && !m->st_accept[s]) {
        /* one byte of each class: a class with a live step and more than one byte is a
         * choice already */
        int live = 0;
        uint8_t only = 0;
        uint32_t next = 0;
        for (uint32_t c = 0; c < 256 && g->class_start[c] < 256 && live < 2; c++) {
            if (g->class_start[c + 1] == g->class_start[c]) break;
            uint8_t b = g->class_bytes[g->class_start[c]];
            int32_t t = step(m, s, b);
            if (m->oom) return m->oom;
            if (!t) continue;
            live += g->class_start[c + 1] - g->class_start[c];
            only = b;
            next = (uint32_t)t;
        }
        if (live != 1) break;
        out[n++] = only;
        s = next;
    }
    return (long)n;
}

int cst_dfa_open(const cst_grammar *g, cst_matcher **out)
{
    cst_vocab *v;
    static const uint8_t *const no_bytes[1] = {NULL};
    static const uint32_t no_lens[1] = {0};
    static const int32_t no_ends[1] = {0};
    *out = NULL;
    int rc = cst_vocab_from_bytes(no_bytes, no_lens, 0, no_ends, 0, &v);
    if (rc) return rc;
    rc = cst_matcher_create(g, v, out);
    if (rc) {
        cst_vocab_free(v);
        return rc;
    }
    (*out)->own_vocab = v;
    return 0;
}

void cst_dfa_close(cst_matcher *m)
{
    if (!m) return;
    cst_vocab *v = m->own_vocab;
    cst_matcher_free(m);
    cst_vocab_free(v);
}

uint32_t cst_dfa_start(const cst_matcher *m)
{
    return m->start;
}

int32_t cst_dfa_step(cst_matcher *m, uint32_t s, uint8_t byte)
{
    m->oom = 0;
    int32_t t = step(m, s, byte);
    return m->oom ? m->oom : t;
}

bool cst_dfa_accepting(const cst_matcher *m, uint32_t s)
{
    return m->st_accept[s];
}

uint32_t cst_dfa_states(const cst_matcher *m)
{
    return m->nstates;
}

void cst_matcher_describe(const cst_matcher *m, char *buf, size_t cap)
{
    uint32_t s = m->last_state, depth = 0;
    if (s >= m->nstates) {
        snprintf(buf, cap, "state flushed since the last mask (%u states)", m->nstates);
        return;
    }
    for (uint32_t i = 0; i < m->st_len[s]; i++) {
        uint32_t sk = (uint32_t)m->threads[m->st_off[s] + i];
        if (m->stk[sk].depth > depth) depth = m->stk[sk].depth;
    }
    uint16_t ch = m->st_chain[s];
    char chain[32];
    if (ch == CHAIN_UNKNOWN)
        snprintf(chain, sizeof chain, "?");
    else if ((ch & CHAIN_INF) == CHAIN_INF)
        snprintf(chain, sizeof chain, "loop");
    else
        snprintf(chain, sizeof chain, "%u%s%s", ch & CHAIN_INF,
                 ch & CHAIN_DEAD_TAIL ? " dead-tail" : "", ch & CHAIN_AT_LEAST ? "+" : "");
    snprintf(buf, cap,
             "state %u of %u: %u threads, stack depth %u, chain %s; last mask %s (%u nodes, %u "
             "steps, %u new states)",
             s, m->nstates, m->st_len[s], depth, chain,
             m->last_cached       ? "cached"
             : m->last_split == 1 ? "split"
             : m->last_split == 2 ? "parted"
             : m->last_split == 3 ? "classed"
                                  : "walked",
             m->last_cached ? 0 : m->last_visits, m->last_cached ? 0 : m->last_nodes,
             m->last_cached ? 0 : m->last_made);
}

bool cst_matcher_is_dead_end(cst_matcher *m)
{
    if (m->ended) return true;
    const cst_inst *in = m->p->insts;
    for (uint32_t i = 0; i < m->st_len[m->cur]; i++)
        if (in[m->threads[m->st_off[m->cur] + i] >> 32].op == OP_SET) return false;
    return true;
}
