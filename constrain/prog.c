/* SPDX-License-Identifier: MIT */
/*
 * constrain/prog.c — building programs (see prog.h): instructions, deduplicated byte sets,
 * code point sets and their UTF-8 encodings, JSON string encoding.
 */
#include "constrain/prog.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int prog_init(cst_prog *p)
{
    memset(p, 0, sizeof *p);
    p->max_insts = 1u << 21;
    /* pc 0 is FAIL: what an emitter returns after an error */
    if (!prog_emit(p, OP_FAIL, 0, 0) && p->failed) return p->failed;
    return 0;
}

void prog_release(cst_prog *p)
{
    free(p->insts);
    free(p->sets);
    free(p->set_hash);
    memset(p, 0, sizeof *p);
}

uint32_t prog_fail(cst_prog *p, int err, const char *fmt, ...)
{
    if (p->failed) return 0;
    p->failed = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
    return 0;
}

uint32_t prog_emit(cst_prog *p, uint32_t op, uint32_t a, uint32_t b)
{
    if (p->failed && p->n) return 0;
    if (p->n >= p->max_insts)
        return prog_fail(p, -E2BIG, "grammar too large: more than %u instructions", p->max_insts);
    if (p->n == p->cap) {
        uint32_t cap = p->cap ? p->cap * 2 : 256;
        cst_inst *ni = realloc(p->insts, cap * sizeof *ni);
        if (!ni) return prog_fail(p, -ENOMEM, "out of memory");
        p->insts = ni;
        p->cap = cap;
    }
    p->insts[p->n] = (cst_inst){op, a, b};
    return p->n++;
}

static uint32_t set_hashv(const cst_byteset *s)
{
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 4; i++) h = (h ^ s->w[i]) * 0xff51afd7ed558ccdull;
    return (uint32_t)(h >> 32);
}

static uint32_t set_intern(cst_prog *p, const cst_byteset *s)
{
    if (p->nsets * 2 >= p->set_hash_cap) {
        uint32_t cap = p->set_hash_cap ? p->set_hash_cap * 2 : 64;
        uint32_t *h = malloc(cap * sizeof *h);
        if (!h) return prog_fail(p, -ENOMEM, "out of memory"), UINT32_MAX;
        memset(h, 0xff, cap * sizeof *h);
        for (uint32_t i = 0; i < p->nsets; i++) {
            uint32_t j = set_hashv(&p->sets[i]) & (cap - 1);
            while (h[j] != UINT32_MAX) j = (j + 1) & (cap - 1);
            h[j] = i;
        }
        free(p->set_hash);
        p->set_hash = h;
        p->set_hash_cap = cap;
    }
    uint32_t j = set_hashv(s) & (p->set_hash_cap - 1);
    while (p->set_hash[j] != UINT32_MAX) {
        if (!memcmp(&p->sets[p->set_hash[j]], s, sizeof *s)) return p->set_hash[j];
        j = (j + 1) & (p->set_hash_cap - 1);
    }
    if (p->nsets == p->setcap) {
        uint32_t cap = p->setcap ? p->setcap * 2 : 64;
        cst_byteset *ns = realloc(p->sets, cap * sizeof *ns);
        if (!ns) return prog_fail(p, -ENOMEM, "out of memory"), UINT32_MAX;
        p->sets = ns;
        p->setcap = cap;
    }
    p->sets[p->nsets] = *s;
    p->set_hash[j] = p->nsets;
    return p->nsets++;
}

uint32_t prog_set(cst_prog *p, const cst_byteset *s, uint32_t next)
{
    if (p->failed) return 0;
    uint32_t id = set_intern(p, s);
    if (id == UINT32_MAX) return 0;
    return prog_emit(p, OP_SET, id, next);
}

uint32_t prog_range(cst_prog *p, uint8_t lo, uint8_t hi, uint32_t next)
{
    cst_byteset s = {{0}};
    for (unsigned c = lo; c <= hi; c++) s.w[c >> 6] |= 1ull << (c & 63);
    return prog_set(p, &s, next);
}

uint32_t prog_lit(cst_prog *p, const void *bytes, size_t n, uint32_t next)
{
    const uint8_t *b = bytes;
    for (size_t i = n; i-- > 0;) next = prog_range(p, b[i], b[i], next);
    return next;
}

uint32_t prog_split(cst_prog *p, uint32_t a, uint32_t b)
{
    return prog_emit(p, OP_SPLIT, a, b);
}

void prog_patch(cst_prog *p, uint32_t pc, uint32_t target)
{
    if (!p->failed && pc < p->n) p->insts[pc].a = target;
}

uint32_t prog_alts(cst_prog *p, const uint32_t *entries, size_t n)
{
    if (n == 0) return 0;
    uint32_t pc = entries[n - 1];
    for (size_t i = n - 1; i-- > 0;) pc = prog_split(p, entries[i], pc);
    return pc;
}

uint32_t prog_ws(cst_prog *p, uint32_t next)
{
    /* loop: SPLIT(ws byte -> loop, next) */
    uint32_t loop = prog_emit(p, OP_SPLIT, 0, next);
    if (p->failed) return 0;
    cst_byteset s = {{0}};
    s.w[0] = (1ull << ' ') | (1ull << '\t') | (1ull << '\n') | (1ull << '\r');
    prog_patch(p, loop, prog_set(p, &s, loop));
    return loop;
}

/* ---- code point sets ------------------------------------------------------------------ */

void cps_free(cst_cps *s)
{
    free(s->r);
    memset(s, 0, sizeof *s);
}

int cps_add(cst_cps *s, uint32_t lo, uint32_t hi)
{
    if (lo > hi) return 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        cps_range *nr = realloc(s->r, cap * sizeof *nr);
        if (!nr) return -ENOMEM;
        s->r = nr;
        s->cap = cap;
    }
    s->r[s->n++] = (cps_range){lo, hi};
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const cps_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

void cps_normalize(cst_cps *s)
{
    if (s->n < 2) return;
    qsort(s->r, s->n, sizeof *s->r, cmp_range);
    size_t w = 0;
    for (size_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[w].hi + 1) {
            if (s->r[i].hi > s->r[w].hi) s->r[w].hi = s->r[i].hi;
        } else
            s->r[++w] = s->r[i];
    }
    s->n = w + 1;
}

int cps_negate(cst_cps *s)
{
    cps_normalize(s);
    cst_cps o = {0};
    uint32_t at = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[i].lo > at && cps_add(&o, at, s->r[i].lo - 1)) goto nomem;
        at = s->r[i].hi + 1;
    }
    if (at <= CST_MAX_CP && cps_add(&o, at, CST_MAX_CP)) goto nomem;
    cps_free(s);
    *s = o;
    return 0;
nomem:
    cps_free(&o);
    return -ENOMEM;
}

int cps_subtract(cst_cps *s, uint32_t lo, uint32_t hi)
{
    cps_normalize(s);
    cst_cps o = {0};
    for (size_t i = 0; i < s->n; i++) {
        cps_range r = s->r[i];
        if (r.hi < lo || r.lo > hi) {
            if (cps_add(&o, r.lo, r.hi)) goto nomem;
            continue;
        }
        if (r.lo < lo && cps_add(&o, r.lo, lo - 1)) goto nomem;
        if (r.hi > hi && cps_add(&o, hi + 1, r.hi)) goto nomem;
    }
    cps_free(s);
    *s = o;
    return 0;
nomem:
    cps_free(&o);
    return -ENOMEM;
}

bool cps_empty(cst_cps *s)
{
    return s->n == 0;
}

size_t cst_encode_cp(uint32_t c, bool json_string, uint8_t *out)
{
    if (json_string && (c < 0x20 || c == '"' || c == '\\')) {
        out[0] = '\\';
        switch (c) {
        case '"': out[1] = '"'; return 2;
        case '\\': out[1] = '\\'; return 2;
        case '\b': out[1] = 'b'; return 2;
        case '\f': out[1] = 'f'; return 2;
        case '\n': out[1] = 'n'; return 2;
        case '\r': out[1] = 'r'; return 2;
        case '\t': out[1] = 't'; return 2;
        default: {
            static const char hex[] = "0123456789abcdef";
            memcpy(out + 1, "u00", 3);
            out[4] = (uint8_t)hex[c >> 4];
            out[5] = (uint8_t)hex[c & 15];
            return 6;
        }
        }
    }
    if (c < 0x80) {
        out[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (uint8_t)(0xC0 | (c >> 6));
        out[1] = (uint8_t)(0x80 | (c & 63));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (c >> 12));
        out[1] = (uint8_t)(0x80 | ((c >> 6) & 63));
        out[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (c >> 18));
    out[1] = (uint8_t)(0x80 | ((c >> 12) & 63));
    out[2] = (uint8_t)(0x80 | ((c >> 6) & 63));
    out[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

/*
 * One code point range [lo, hi] of equal UTF-8 length as byte-range sequences (the split of
 * Rust's regex-syntax Utf8Sequences): split until every position's bytes form one range.
 */
static uint32_t emit_utf8_range(cst_prog *p, uint32_t lo, uint32_t hi, uint32_t next,
                                uint32_t *alts, size_t *nalts, size_t maxalts)
{
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                emit_utf8_range(p, lo, lo | m, next, alts, nalts, maxalts);
                return emit_utf8_range(p, (lo | m) + 1, hi, next, alts, nalts, maxalts);
            }
            if ((hi & m) != m) {
                emit_utf8_range(p, lo, (hi & ~m) - 1, next, alts, nalts, maxalts);
                return emit_utf8_range(p, hi & ~m, hi, next, alts, nalts, maxalts);
            }
        }
    }
    uint8_t a[4], b[4];
    size_t n = cst_encode_cp(lo, false, a);
    cst_encode_cp(hi, false, b);
    uint32_t pc = next;
    for (size_t i = n; i-- > 0;) pc = prog_range(p, a[i], b[i], pc);
    if (*nalts >= maxalts) return prog_fail(p, -E2BIG, "character class too large");
    alts[(*nalts)++] = pc;
    return pc;
}

uint32_t prog_cps(cst_prog *p, cst_cps *s, bool json_string, uint32_t next)
{
    cps_normalize(s);
    size_t maxalts = 64 + s->n * 8 + 40;
    uint32_t *alts = malloc(maxalts * sizeof *alts);
    if (!alts) return prog_fail(p, -ENOMEM, "out of memory");
    size_t nalts = 0;
    /* single-byte code points share one byte set */
    cst_byteset ascii = {{0}};
    bool any_ascii = false;
    /* the escaped ones (json_string) share their prefix: a backslash, then one letter of
     * `letters`, or u00 and two hex digits (hex[hi] the low digits after hi = 0 or 1) */
    cst_byteset letters = {{0}}, hexlo[2] = {{{0}}, {{0}}};
    bool any_esc = false;
    for (size_t i = 0; i < s->n && !p->failed; i++) {
        uint32_t lo = s->r[i].lo, hi = s->r[i].hi > CST_MAX_CP ? CST_MAX_CP : s->r[i].hi;
        for (uint32_t c = lo; c <= hi && c < 0x80; c++) {
            if (json_string && (c < 0x20 || c == '"' || c == '\\')) {
                uint8_t e[6];
                size_t n = cst_encode_cp(c, true, e);
                if (n == 2)
                    letters.w[e[1] >> 6] |= 1ull << (e[1] & 63);
                else
                    hexlo[e[4] - '0'].w[e[5] >> 6] |= 1ull << (e[5] & 63);
                any_esc = true;
                continue;
            }
            ascii.w[c >> 6] |= 1ull << (c & 63);
            any_ascii = true;
        }
        if (hi < 0x80) continue;
        if (lo < 0x80) lo = 0x80;
        /* split at the UTF-8 length boundaries and around the surrogates */
        static const uint32_t bounds[][2] = {
            {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
        for (int k = 0; k < 4; k++) {
            uint32_t a = lo > bounds[k][0] ? lo : bounds[k][0];
            uint32_t b = hi < bounds[k][1] ? hi : bounds[k][1];
            if (a <= b) emit_utf8_range(p, a, b, next, alts, &nalts, maxalts);
        }
    }
    if (any_esc && !p->failed) {
        uint32_t after[3], na = 0;
        static const cst_byteset none = {{0}};
        if (memcmp(&letters, &none, sizeof none)) after[na++] = prog_set(p, &letters, next);
        uint32_t u[2], nu = 0;
        for (int h = 0; h < 2; h++)
            if (memcmp(&hexlo[h], &none, sizeof none))
                u[nu++] = prog_range(p, (uint8_t)('0' + h), (uint8_t)('0' + h),
                                     prog_set(p, &hexlo[h], next));
        if (nu) after[na++] = prog_lit(p, "u00", 3, prog_alts(p, u, nu));
        if (nalts >= maxalts)
            prog_fail(p, -E2BIG, "character class too large");
        else
            alts[nalts++] = prog_range(p, '\\', '\\', prog_alts(p, after, na));
    }
    if (any_ascii && !p->failed) {
        if (nalts >= maxalts)
            prog_fail(p, -E2BIG, "character class too large");
        else
            alts[nalts++] = prog_set(p, &ascii, next);
    }
    uint32_t pc = p->failed ? 0 : nalts ? prog_alts(p, alts, nalts) : 0;
    free(alts);
    return pc;
}

/* ---- JSON string encoding ----------------------------------------------------------- */

static int buf_put(char **buf, size_t *len, size_t *cap, const void *b, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 64;
        while (*len + n + 1 > nc) nc *= 2;
        char *nb = realloc(*buf, nc);
        if (!nb) return -ENOMEM;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, b, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

/* Decodes one UTF-8 code point (strict); returns its length, 0 when invalid. */
static size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (n == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) return *cp = c, 1;
    size_t len;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0)
        len = 2, v = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
        len = 3, v = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
        len = 4, v = c & 0x07, min = 0x10000;
    else
        return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 63);
    }
    if (v < min || v > CST_MAX_CP || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

int cst_json_quote(const char *s, size_t n, char **buf, size_t *len, size_t *cap)
{
    int rc = buf_put(buf, len, cap, "\"", 1);
    for (size_t i = 0; i < n && !rc;) {
        uint32_t cp;
        size_t l = utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (!l) return -EINVAL;
        uint8_t e[6];
        size_t el = cst_encode_cp(cp, true, e);
        rc = buf_put(buf, len, cap, e, el);
        i += l;
    }
    return rc ? rc : buf_put(buf, len, cap, "\"", 1);
}
