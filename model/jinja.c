/* SPDX-License-Identifier: MIT */
/*
 * model/jinja.c — the Jinja interpreter of chat templates (see jinja.h): preprocessing,
 * lexer and parser as @huggingface/jinja has them (so both accept and refuse the same
 * templates, and bind operators the same way), then a tree-walking evaluator over values
 * allocated from one bounded arena per render.
 *
 * Values follow the oracle's runtime types: undefined, null, boolean, integer and float (both
 * doubles, as JavaScript numbers; the type decides how they print), string (UTF-8 bytes; the
 * oracle's UTF-16 indexing is read as code points), array, tuple (an array the oracle keeps
 * apart: it does not serialise), object (ordered), keyword arguments, namespace, function.
 * Strings, arrays and objects are immutable once built, except a namespace's attributes, so
 * values share their parts freely.
 */
#include "model/jinja.h"
#include "common/errdetail.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

ERRDETAIL_DEFINE(jinja_err);

const char *jinja_errmsg(void)
{
    return jinja_err.msg;
}

#define MAX_PARSE_DEPTH 200

/* ---- arena ------------------------------------------------------------------------------ */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

typedef struct arena {
    chunk *head;
    size_t total, cap; /* bytes taken from malloc; the bound */
    bool over;         /* the bound was hit (as opposed to malloc failing) */
} arena;

static void *arena_alloc(arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 32768 ? n : 32768;
        if (a->total + cap + sizeof(chunk) > a->cap) {
            a->over = true;
            return NULL;
        }
        chunk *c = malloc(sizeof(chunk) + cap);
        if (!c) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
        a->total += cap + sizeof(chunk);
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void arena_free(arena *a)
{
    for (chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    a->head = NULL;
}

/* ---- growable byte buffer (malloc) -------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap, max;
    int err; /* -ENOMEM or -E2BIG once a write failed */
} sbuf;

static void sb_addn(sbuf *b, const char *s, size_t n)
{
    if (b->err || !n) return;
    if (b->max && b->n + n > b->max) {
        b->err = -E2BIG;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->err = -ENOMEM;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_add(sbuf *b, const char *s)
{
    sb_addn(b, s, strlen(s));
}

static void sb_addc(sbuf *b, char c)
{
    sb_addn(b, &c, 1);
}

/* ---- characters (JavaScript's sets) -------------------------------------------------------- */

/* Length of the whitespace character at s (JavaScript's \s and String.trim set), 0 if none. */
static size_t ws_len(const unsigned char *s, size_t n)
{
    if (n >= 1 && (s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r'))) return 1;
    if (n >= 2 && s[0] == 0xC2 && s[1] == 0xA0) return 2; /* U+00A0 */
    if (n >= 3 && (s[0] & 0xF0) == 0xE0 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80) {
        unsigned cp = (unsigned)(s[0] & 0x0F) << 12 | (unsigned)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
        if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
            cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF)
            return 3;
    }
    return 0;
}

/* Whitespace ending at s+n (the last character), its length or 0. */
static size_t ws_len_back(const unsigned char *s, size_t n)
{
    for (size_t w = 1; w <= 3 && w <= n; w++)
        if (ws_len(s + n - w, w) == w) return w;
    return 0;
}

static void trim_span(const char **p, size_t *n, bool lead, bool trail)
{
    const unsigned char *s = (const unsigned char *)*p;
    size_t len = *n, l;
    while (lead && len && (l = ws_len(s, len))) {
        s += l;
        len -= l;
    }
    while (trail && len && (l = ws_len_back(s, len))) len -= l;
    *p = (const char *)s;
    *n = len;
}

static bool is_word(int c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_digit(int c)
{
    return c >= '0' && c <= '9';
}

/* Bytes of the UTF-8 sequence starting with c (1 for a stray byte). */
static size_t u8_len(unsigned char c)
{
    return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* The index after the code point at s[i] (never past n). */
static size_t u8_next(const char *s, size_t i, size_t n)
{
    size_t l = u8_len((unsigned char)s[i]);
    return l > n - i ? n : i + l;
}

/* Code points of s (what the oracle's Array.from splits a string into). */
static size_t u8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i = u8_next(s, i, n)) k++;
    return k;
}

/* UTF-16 code units of s (JavaScript's String.length). */
static size_t u16_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i = u8_next(s, i, n)) k += u8_len((unsigned char)s[i]) == 4 ? 2 : 1;
    return k;
}

static unsigned u8_decode(const unsigned char *s, size_t n, size_t *len)
{
    size_t l = u8_len(s[0]);
    if (l > n) l = n;
    *len = l;
    if (l == 1) return s[0];
    unsigned cp = s[0] & (0xFF >> (l + 1));
    for (size_t i = 1; i < l; i++) cp = cp << 6 | (s[i] & 0x3F);
    return cp;
}

static void u8_encode(sbuf *b, unsigned cp)
{
    char o[4];
    if (cp < 0x80) {
        sb_addc(b, (char)cp);
    } else if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        sb_addn(b, o, 2);
    } else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        sb_addn(b, o, 3);
    } else {
        o[0] = (char)(0xF0 | cp >> 18);
        o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
        o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[3] = (char)(0x80 | (cp & 0x3F));
        sb_addn(b, o, 4);
    }
}

/* ---- numbers as JavaScript prints and reads them --------------------------------------------- */

/* Number.prototype.toString(): the shortest digits that read back, placed as ECMA-262 says. */
static void js_num(sbuf *b, double x)
{
    char t[64];
    if (isnan(x)) return sb_add(b, "NaN");
    if (isinf(x)) return sb_add(b, x < 0 ? "-Infinity" : "Infinity");
    if (x == 0) return sb_add(b, "0");
    if (x < 0) {
        sb_addc(b, '-');
        x = -x;
    }
    int p = 1;
    for (; p < 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, x);
        if (strtod(t, NULL) == x) break;
    }
    snprintf(t, sizeof t, "%.*e", p - 1, x);
    char digits[32];
    int k = 0;
    char *e = strchr(t, 'e');
    for (char *c = t; c < e; c++)
        if (is_digit(*c)) digits[k++] = *c;
    while (k > 1 && digits[k - 1] == '0') k--;
    digits[k] = '\0';
    int n = atoi(e + 1) + 1; /* value = 0.DIGITS x 10^n */
    if (k <= n && n <= 21) {
        sb_addn(b, digits, (size_t)k);
        for (int i = k; i < n; i++) sb_addc(b, '0');
    } else if (0 < n && n <= 21) {
        sb_addn(b, digits, (size_t)n);
        sb_addc(b, '.');
        sb_addn(b, digits + n, (size_t)(k - n));
    } else if (-6 < n && n <= 0) {
        sb_add(b, "0.");
        for (int i = 0; i < -n; i++) sb_addc(b, '0');
        sb_addn(b, digits, (size_t)k);
    } else {
        sb_addc(b, digits[0]);
        if (k > 1) {
            sb_addc(b, '.');
            sb_addn(b, digits + 1, (size_t)(k - 1));
        }
        snprintf(t, sizeof t, "e%c%d", n - 1 < 0 ? '-' : '+', abs(n - 1));
        sb_add(b, t);
    }
}

/* The longest decimal literal at the start of s (after whitespace when ws): JavaScript's
 * parseFloat (ws) and, with whole, Number(). NaN when there is none. */
static double js_parse_float(const char *s, size_t n, bool whole)
{
    const char *p = s;
    size_t len = n;
    trim_span(&p, &len, true, whole);
    if (whole && len == 0) return 0;
    size_t i = 0;
    char buf[128];
    if (i < len && (p[i] == '+' || p[i] == '-')) i++;
    if (len - i >= 8 && !memcmp(p + i, "Infinity", 8)) {
        if (whole && i + 8 != len) return NAN;
        return p[0] == '-' ? -INFINITY : INFINITY;
    }
    size_t nd = 0;
    while (i < len && is_digit(p[i])) i++, nd++;
    if (i < len && p[i] == '.') {
        i++;
        while (i < len && is_digit(p[i])) i++, nd++;
    }
    if (!nd) return NAN;
    if (i < len && (p[i] == 'e' || p[i] == 'E')) {
        size_t j = i + 1;
        if (j < len && (p[j] == '+' || p[j] == '-')) j++;
        if (j < len && is_digit(p[j])) {
            while (j < len && is_digit(p[j])) j++;
            i = j;
        }
    }
    if (whole && i != len) return NAN;
    if (i >= sizeof buf) i = sizeof buf - 1;
    memcpy(buf, p, i);
    buf[i] = '\0';
    return strtod(buf, NULL);
}

/* parseInt(s, 10): NaN when no digits. */
static double js_parse_int(const char *s, size_t n)
{
    const char *p = s;
    size_t len = n, i = 0;
    trim_span(&p, &len, true, false);
    bool neg = false;
    if (i < len && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
    if (i >= len || !is_digit(p[i])) return NAN;
    double v = 0;
    while (i < len && is_digit(p[i])) v = v * 10 + (p[i++] - '0');
    return neg ? -v : v;
}

/* ---- preprocessing (trim_blocks, lstrip_blocks, {% generation %}) ---------------------------- */

/* Text with the template line of each byte, so errors name lines of the source. */
typedef struct ptext {
    char *s;
    int *line;
    size_t n;
} ptext;

static int pt_init(ptext *t, size_t cap)
{
    t->s = malloc(cap + 1);
    t->line = malloc((cap + 1) * sizeof *t->line);
    t->n = 0;
    if (!t->s || !t->line) {
        free(t->s);
        free(t->line);
        return -ENOMEM;
    }
    return 0;
}

static void pt_put(ptext *t, char c, int line)
{
    t->s[t->n] = c;
    t->line[t->n++] = line;
}

static void pt_free(ptext *t)
{
    free(t->s);
    free(t->line);
}

static bool at_line_start(const ptext *in, size_t i)
{
    if (i == 0) return true;
    unsigned char c = (unsigned char)in->s[i - 1];
    if (c == '\n' || c == '\r') return true;
    /* U+2028 / U+2029 end lines for JavaScript's ^ too */
    return i >= 3 && (unsigned char)in->s[i - 3] == 0xE2 && (unsigned char)in->s[i - 2] == 0x80 &&
           (c == 0xA8 || c == 0xA9);
}

/* The oracle's preprocess(): drops one final "\n", then /^[ \t]*({[#%-])/gm -> $1,
 * then /([#%-]})\n/g -> $1, then removes {% generation %} / {% endgeneration %} tags with
 * the whitespace before (when "{%-") and after (when "-%}"). */
static int preprocess(const char *src, size_t len, ptext *out)
{
    ptext a, b;
    int line = 1;
    if (len && src[len - 1] == '\n') len--;
    if (pt_init(&a, len)) return -ENOMEM;
    for (size_t i = 0; i < len; i++) {
        pt_put(&a, src[i], line);
        if (src[i] == '\n') line++;
    }
    /* lstrip_blocks */
    if (pt_init(&b, a.n)) return pt_free(&a), -ENOMEM;
    for (size_t i = 0; i < a.n;) {
        if (at_line_start(&a, i)) {
            size_t j = i;
            while (j < a.n && (a.s[j] == ' ' || a.s[j] == '\t')) j++;
            if (j + 1 < a.n && a.s[j] == '{' &&
                (a.s[j + 1] == '#' || a.s[j + 1] == '%' || a.s[j + 1] == '-'))
                i = j;
        }
        /* copy up to the next line start */
        do {
            pt_put(&b, a.s[i], a.line[i]);
            i++;
        } while (i < a.n && !at_line_start(&a, i));
    }
    pt_free(&a);
    /* trim_blocks */
    if (pt_init(&a, b.n)) return pt_free(&b), -ENOMEM;
    for (size_t i = 0; i < b.n; i++) {
        pt_put(&a, b.s[i], b.line[i]);
        if (b.s[i] == '}' && i > 0 && i + 1 < b.n && b.s[i + 1] == '\n' &&
            (b.s[i - 1] == '#' || b.s[i - 1] == '%' || b.s[i - 1] == '-'))
            i++;
    }
    pt_free(&b);
    /* {% generation %} */
    if (pt_init(out, a.n)) return pt_free(&a), -ENOMEM;
    size_t floor = 0; /* the end of the last match: a match starts no earlier */
    for (size_t i = 0; i < a.n;) {
        if (a.s[i] == '{' && i + 1 < a.n && a.s[i + 1] == '%') {
            size_t j = i + 2, l;
            bool lstrip = false, rstrip = false;
            if (j < a.n && a.s[j] == '-') lstrip = true, j++;
            while (j < a.n && (l = ws_len((const unsigned char *)a.s + j, a.n - j))) j += l;
            if (a.n - j >= 3 && !memcmp(a.s + j, "end", 3) && a.n - j >= 13 &&
                !memcmp(a.s + j + 3, "generation", 10))
                j += 13;
            else if (a.n - j >= 10 && !memcmp(a.s + j, "generation", 10))
                j += 10;
            else
                goto plain;
            while (j < a.n && (l = ws_len((const unsigned char *)a.s + j, a.n - j))) j += l;
            if (j < a.n && a.s[j] == '-') rstrip = true, j++;
            if (!(a.n - j >= 2 && a.s[j] == '%' && a.s[j + 1] == '}')) goto plain;
            j += 2;
            if (lstrip) /* drop the whitespace already copied, back to the last match */
                while (out->n > floor &&
                       (l = ws_len_back((const unsigned char *)out->s + floor, out->n - floor)))
                    out->n -= l;
            size_t k = j;
            while (k < a.n && (l = ws_len((const unsigned char *)a.s + k, a.n - k))) k += l;
            if (!rstrip)
                for (size_t m = j; m < k; m++) pt_put(out, a.s[m], a.line[m]);
            i = k;
            floor = out->n;
            continue;
        }
    plain:
        pt_put(out, a.s[i], a.line[i]);
        i++;
    }
    pt_free(&a);
    return 0;
}

/* ---- lexer -------------------------------------------------------------------------------- */

enum tok_type {
    T_EOF,
    T_TEXT,
    T_NUM,
    T_STR,
    T_IDENT,
    T_EQUALS,
    T_LPAREN,
    T_RPAREN,
    T_OPEN_STMT,
    T_CLOSE_STMT,
    T_OPEN_EXPR,
    T_CLOSE_EXPR,
    T_LSQUARE,
    T_RSQUARE,
    T_LCURLY,
    T_RCURLY,
    T_COMMA,
    T_DOT,
    T_COLON,
    T_PIPE,
    T_ADD,   /* + - ~ */
    T_MUL,   /* * / // % */
    T_POW,   /* ** */
    T_CMP,   /* < > <= >= == != */
    T_UNARY, /* - + (where a sign cannot be binary) */
    T_COMMENT,
};

static const char *const tok_names[] = {
    "end of template",
    "text",
    "number",
    "string",
    "identifier",
    "'='",
    "'('",
    "')'",
    "'{%'",
    "'%}'",
    "'{{'",
    "'}}'",
    "'['",
    "']'",
    "'{'",
    "'}'",
    "','",
    "'.'",
    "':'",
    "'|'",
    "operator",
    "operator",
    "'**'",
    "comparison",
    "sign",
    "comment",
};

typedef struct token {
    int type;
    int line;
    const char *s; /* value (strings unescaped), in the template's arena */
    size_t n;
} token;

typedef struct lexer {
    ptext src;
    size_t pos;
    token *t;
    size_t n, cap;
    arena *mem;
    int err;
} lexer;

static int lex_fail(lexer *L, int line, const char *fmt, const char *arg)
{
    char m[200];
    snprintf(m, sizeof m, fmt, arg);
    L->err = errdetail_set(&jinja_err, -EINVAL, "line %d: %s", line, m);
    return L->err;
}

static int lex_push(lexer *L, int type, const char *s, size_t n, int line)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        token *t = realloc(L->t, cap * sizeof *t);
        if (!t) return L->err = errdetail_set(&jinja_err, -ENOMEM, "out of memory");
        L->t = t;
        L->cap = cap;
    }
    char *copy = arena_alloc(L->mem, n + 1);
    if (!copy) return L->err = errdetail_set(&jinja_err, -ENOMEM, "out of memory");
    memcpy(copy, s, n);
    copy[n] = '\0';
    L->t[L->n++] = (token){type, line, copy, n};
    return 0;
}

static int last_type(const lexer *L)
{
    return L->n ? L->t[L->n - 1].type : T_EOF;
}

static int line_at(const lexer *L, size_t pos)
{
    if (!L->src.n) return 1;
    return L->src.line[pos < L->src.n ? pos : L->src.n - 1];
}

static void strip_trailing_ws(lexer *L)
{
    if (last_type(L) != T_TEXT) return;
    token *t = &L->t[L->n - 1];
    size_t l;
    while (t->n && (l = ws_len_back((const unsigned char *)t->s, t->n))) t->n -= l;
    if (!t->n) L->n--;
}

static void skip_ws(lexer *L)
{
    size_t l;
    while (L->pos < L->src.n &&
           (l = ws_len((const unsigned char *)L->src.s + L->pos, L->src.n - L->pos)))
        L->pos += l;
}

/* The oracle's consumeWhile: the characters that pass, with escapes in strings; it fails
 * when the input ends right after a character it took. */
enum { CW_WS, CW_DIGIT, CW_WORD, CW_QUOTE1, CW_QUOTE2 };

static bool cw_pass(const lexer *L, int what)
{
    if (L->pos >= L->src.n) return false;
    const char *s = L->src.s + L->pos;
    switch (what) {
    case CW_WS: return ws_len((const unsigned char *)s, L->src.n - L->pos) > 0;
    case CW_DIGIT: return is_digit(*s);
    case CW_WORD: return is_word(*s);
    case CW_QUOTE1: return *s != '\'';
    default: return *s != '"';
    }
}

static int consume_while(lexer *L, int what, sbuf *out)
{
    while (cw_pass(L, what)) {
        const char *s = L->src.s;
        int line = line_at(L, L->pos);
        if (s[L->pos] == '\\') {
            if (++L->pos >= L->src.n) return lex_fail(L, line, "%s", "unexpected end of input");
            char e = s[L->pos++];
            if (e == 'x' || e == 'u') {
                size_t k = e == 'x' ? 2 : 4;
                unsigned cp = 0;
                for (size_t i = 0; i < k; i++) {
                    char h = L->pos + i < L->src.n ? s[L->pos + i] : 0;
                    int v = is_digit(h)              ? h - '0'
                            : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                            : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                     : -1;
                    if (v < 0) return lex_fail(L, line, "%s", "invalid hexadecimal escape");
                    cp = cp << 4 | (unsigned)v;
                }
                u8_encode(out, cp);
                L->pos += k;
                continue;
            }
            static const char from[] = "ntrbfv'\"\\", to[] = "\n\t\r\b\f\v'\"\\";
            const char *f = e ? strchr(from, e) : NULL;
            if (!f) {
                char c[2] = {e, 0};
                return lex_fail(L, line, "unexpected escaped character '%s'", c);
            }
            sb_addc(out, to[f - from]);
            continue;
        }
        sb_addc(out, s[L->pos++]);
        if (L->pos >= L->src.n) return lex_fail(L, line, "%s", "unexpected end of input");
    }
    return out->err ? (L->err = errdetail_set(&jinja_err, out->err, "out of memory")) : 0;
}

static const struct {
    const char *seq;
    int type;
} lex_table[] = {
    {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR},
    {"(", T_LPAREN},     {")", T_RPAREN},      {"{", T_LCURLY},     {"}", T_RCURLY},
    {"[", T_LSQUARE},    {"]", T_RSQUARE},     {",", T_COMMA},      {".", T_DOT},
    {":", T_COLON},      {"|", T_PIPE},        {"<=", T_CMP},       {">=", T_CMP},
    {"==", T_CMP},       {"!=", T_CMP},        {"<", T_CMP},        {">", T_CMP},
    {"+", T_ADD},        {"-", T_ADD},         {"~", T_ADD},        {"**", T_POW},
    {"*", T_MUL},        {"//", T_MUL},        {"/", T_MUL},        {"%", T_MUL},
    {"=", T_EQUALS},
};

static int lex(lexer *L)
{
    const char *s = L->src.s;
    const size_t n = L->src.n;
    int depth = 0;
    sbuf tmp = {0};
    while (L->pos < n && !L->err) {
        int last = last_type(L), line = line_at(L, L->pos);
        if (last == T_EOF || last == T_CLOSE_STMT || last == T_CLOSE_EXPR || last == T_COMMENT) {
            size_t start = L->pos;
            while (L->pos < n &&
                   !(s[L->pos] == '{' && L->pos + 1 < n &&
                     (s[L->pos + 1] == '%' || s[L->pos + 1] == '{' || s[L->pos + 1] == '#')))
                L->pos++;
            if (L->pos > start) {
                lex_push(L, T_TEXT, s + start, L->pos - start, line);
                continue;
            }
        }
        if (s[L->pos] == '{' && L->pos + 1 < n && s[L->pos + 1] == '#') {
            L->pos += 2;
            bool before = L->pos < n && s[L->pos] == '-';
            if (before) L->pos++;
            size_t start = L->pos;
            while (L->pos >= n || s[L->pos] != '#' || L->pos + 1 >= n || s[L->pos + 1] != '}') {
                if (L->pos + 2 >= n) {
                    lex_fail(L, line, "%s", "missing end of comment tag");
                    break;
                }
                L->pos++;
            }
            if (L->err) break;
            size_t cl = L->pos - start;
            bool after = cl && s[start + cl - 1] == '-';
            if (before) strip_trailing_ws(L);
            lex_push(L, T_COMMENT, s + start, after ? cl - 1 : cl, line);
            L->pos += 2;
            if (after) skip_ws(L);
            continue;
        }
        if (n - L->pos >= 3 && !memcmp(s + L->pos, "{%-", 3)) {
            strip_trailing_ws(L);
            lex_push(L, T_OPEN_STMT, "{%", 2, line);
            L->pos += 3;
            continue;
        }
        if (n - L->pos >= 3 && !memcmp(s + L->pos, "{{-", 3)) {
            strip_trailing_ws(L);
            lex_push(L, T_OPEN_EXPR, "{{", 2, line);
            depth = 0;
            L->pos += 3;
            continue;
        }
        tmp.n = 0;
        if (consume_while(L, CW_WS, &tmp)) break;
        if (L->pos >= n) break;
        line = line_at(L, L->pos);
        if (n - L->pos >= 3 && !memcmp(s + L->pos, "-%}", 3)) {
            lex_push(L, T_CLOSE_STMT, "%}", 2, line);
            L->pos += 3;
            skip_ws(L);
            continue;
        }
        if (n - L->pos >= 3 && !memcmp(s + L->pos, "-}}", 3)) {
            lex_push(L, T_CLOSE_EXPR, "}}", 2, line);
            L->pos += 3;
            skip_ws(L);
            continue;
        }
        char c = s[L->pos];
        if (c == '-' || c == '+') {
            last = last_type(L);
            if (last == T_TEXT || last == T_EOF) {
                char cs[2] = {c, 0};
                lex_fail(L, line, "unexpected character '%s'", cs);
                break;
            }
            if (last != T_IDENT && last != T_NUM && last != T_STR && last != T_RPAREN &&
                last != T_RSQUARE) {
                L->pos++;
                tmp.n = 0;
                sb_addc(&tmp, c);
                if (consume_while(L, CW_DIGIT, &tmp)) break;
                if (tmp.n > 1 && L->pos + 1 < n && s[L->pos] == '.' && is_digit(s[L->pos + 1])) {
                    L->pos++;
                    sb_addc(&tmp, '.');
                    if (consume_while(L, CW_DIGIT, &tmp)) break;
                }
                if (tmp.err) break;
                lex_push(L, tmp.n > 1 ? T_NUM : T_UNARY, tmp.p, tmp.n, line);
                continue;
            }
        }
        bool matched = false;
        for (size_t i = 0; i < sizeof lex_table / sizeof *lex_table; i++) {
            size_t l = strlen(lex_table[i].seq);
            if (lex_table[i].type == T_CLOSE_EXPR && depth > 0) continue;
            if (n - L->pos >= l && !memcmp(s + L->pos, lex_table[i].seq, l)) {
                lex_push(L, lex_table[i].type, lex_table[i].seq, l, line);
                if (lex_table[i].type == T_OPEN_EXPR) depth = 0;
                if (lex_table[i].type == T_LCURLY) depth++;
                if (lex_table[i].type == T_RCURLY) depth--;
                L->pos += l;
                matched = true;
                break;
            }
        }
        if (matched) continue;
        if (c == '\'' || c == '"') {
            L->pos++;
            tmp.n = 0;
            sb_addn(&tmp, "", 0);
            if (consume_while(L, c == '\'' ? CW_QUOTE1 : CW_QUOTE2, &tmp)) break;
            L->pos++;
            lex_push(L, T_STR, tmp.p ? tmp.p : "", tmp.n, line);
            continue;
        }
        if (is_digit(c)) {
            tmp.n = 0;
            if (consume_while(L, CW_DIGIT, &tmp)) break;
            if (last_type(L) != T_DOT && L->pos + 1 < n && s[L->pos] == '.' &&
                is_digit(s[L->pos + 1])) {
                L->pos++;
                sb_addc(&tmp, '.');
                if (consume_while(L, CW_DIGIT, &tmp)) break;
            }
            lex_push(L, T_NUM, tmp.p, tmp.n, line);
            continue;
        }
        if (is_word(c)) {
            tmp.n = 0;
            if (consume_while(L, CW_WORD, &tmp)) break;
            lex_push(L, T_IDENT, tmp.p, tmp.n, line);
            continue;
        }
        char cs[8] = {0};
        memcpy(cs, s + L->pos,
               u8_len((unsigned char)c) < n - L->pos ? u8_len((unsigned char)c) : 1);
        lex_fail(L, line, "unexpected character '%s'", cs);
    }
    if (!L->err && tmp.err) L->err = errdetail_set(&jinja_err, -ENOMEM, "out of memory");
    free(tmp.p);
    return L->err;
}

/* ---- syntax tree ----------------------------------------------------------------------------- */

enum node_kind {
    N_TEXT,
    N_INT,
    N_FLOAT,
    N_STR,
    N_IDENT,
    N_ARRAY,
    N_TUPLE,
    N_OBJECT,
    N_MEMBER,
    N_CALL,
    N_UNARY,
    N_BINARY,
    N_FILTER,
    N_TEST,
    N_SELECT,
    N_TERNARY,
    N_SLICE,
    N_KWARG,
    N_SPREAD,
    N_KWSPREAD,
    N_IF,
    N_FOR,
    N_SET,
    N_MACRO,
    N_CALLBLOCK,
    N_FILTERBLOCK,
    N_BREAK,
    N_CONTINUE,
    N_COMMENT,
};

enum op {
    OP_NONE,
    OP_OR,
    OP_AND,
    OP_NOT,
    OP_IN,
    OP_NOTIN,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_GT,
    OP_LE,
    OP_GE,
    OP_ADD,
    OP_SUB,
    OP_CONCAT,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
};

static const char *const op_names[] = {
    "?",  "or", "and", "not", "in", "not in", "==", "!=", "<", ">",
    "<=", ">=", "+",   "-",   "~",  "*",      "/",  "//", "%", "**"};

typedef struct node node;
typedef struct nlist {
    node **v;
    int n;
} nlist;

struct node {
    int kind, line, op;
    bool flag; /* member: computed; test: negated; call block: has caller parameters */
    double num;
    const char *s; /* text, string, identifier, test name, macro name */
    size_t n;
    node *a, *b, *c;
    nlist l1, l2; /* bodies, arguments, elements; object: keys (l1), values (l2) */
};

struct jinja_template {
    arena mem;
    nlist body;
};

typedef struct parser {
    token *t;
    size_t n, cur;
    arena *mem;
    int depth;
    int err;
} parser;

static token *peek_at(parser *p, size_t k)
{
    static token eof = {T_EOF, 0, "", 0};
    return p->cur + k < p->n ? &p->t[p->cur + k] : &eof;
}

static token *peek(parser *p)
{
    return peek_at(p, 0);
}

static int last_line(parser *p)
{
    if (p->cur < p->n) return p->t[p->cur].line;
    return p->n ? p->t[p->n - 1].line : 1;
}

static node *perr(parser *p, const char *what)
{
    if (p->err) return NULL;
    token *t = peek(p);
    p->err =
        errdetail_set(&jinja_err, -EINVAL, "line %d: %s, found %s%s%.*s%s", last_line(p), what,
                      tok_names[t->type], t->type == T_IDENT || t->type == T_STR ? " '" : "",
                      t->type == T_IDENT || t->type == T_STR ? (int)(t->n > 40 ? 40 : t->n) : 0,
                      t->s, t->type == T_IDENT || t->type == T_STR ? "'" : "");
    return NULL;
}

static node *mk(parser *p, int kind)
{
    node *x = arena_alloc(p->mem, sizeof *x);
    if (!x) {
        if (!p->err) p->err = errdetail_set(&jinja_err, -ENOMEM, "out of memory");
        return NULL;
    }
    memset(x, 0, sizeof *x);
    x->kind = kind;
    x->line = last_line(p);
    return x;
}

/* A list under construction (malloc) and its copy into the arena. */
typedef struct nvec {
    node **v;
    int n, cap;
} nvec;

static bool nv_push(parser *p, nvec *v, node *x)
{
    if (!x) return false;
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        node **nv = realloc(v->v, (size_t)cap * sizeof *nv);
        if (!nv) {
            if (!p->err) p->err = errdetail_set(&jinja_err, -ENOMEM, "out of memory");
            return false;
        }
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return true;
}

static nlist nv_done(parser *p, nvec *v)
{
    nlist l = {NULL, 0};
    if (v->n && !p->err) {
        l.v = arena_alloc(p->mem, (size_t)v->n * sizeof *l.v);
        if (!l.v)
            p->err = errdetail_set(&jinja_err, -ENOMEM, "out of memory");
        else {
            memcpy(l.v, v->v, (size_t)v->n * sizeof *l.v);
            l.n = v->n;
        }
    }
    free(v->v);
    *v = (nvec){0};
    return l;
}

static bool is_type(parser *p, int type)
{
    return peek(p)->type == type;
}

static bool is_ident(parser *p, const char *name)
{
    token *t = peek(p);
    return t->type == T_IDENT && !strcmp(t->s, name);
}

static bool is_ident2(parser *p, const char *a, const char *b)
{
    token *t = peek(p), *u = peek_at(p, 1);
    return t->type == T_IDENT && !strcmp(t->s, a) && u->type == T_IDENT && !strcmp(u->s, b);
}

/* {% NAME ... with NAME one of names (NULL-terminated) */
static bool is_statement(parser *p, const char *const *names)
{
    token *t = peek(p), *u = peek_at(p, 1);
    if (t->type != T_OPEN_STMT || u->type != T_IDENT) return false;
    for (; *names; names++)
        if (!strcmp(u->s, *names)) return true;
    return false;
}

static bool expect(parser *p, int type, const char *what)
{
    if (p->err) return false;
    if (peek(p)->type != type) {
        perr(p, what);
        return false;
    }
    p->cur++;
    return true;
}

static bool expect_ident(parser *p, const char *name)
{
    if (p->err) return false;
    if (!is_ident(p, name)) {
        char m[64];
        snprintf(m, sizeof m, "expected '%s'", name);
        perr(p, m);
        return false;
    }
    p->cur++;
    return true;
}

static bool enter(parser *p)
{
    if (p->err) return false;
    if (++p->depth > MAX_PARSE_DEPTH) {
        p->err = errdetail_set(&jinja_err, -E2BIG, "line %d: nested deeper than %d levels",
                               last_line(p), MAX_PARSE_DEPTH);
        return false;
    }
    return true;
}

static node *parse_any(parser *p);
static node *parse_expression(parser *p);
static node *parse_primary(parser *p);
static node *parse_logical_or(parser *p);
static node *parse_call(parser *p, node *callee);
static node *parse_member(parser *p, node *obj);

/* Statements until one of names starts ("{% endif", ...); fails at the end of the template. */
static nlist parse_body(parser *p, const char *const *names)
{
    nvec v = {0};
    while (!p->err && !is_statement(p, names)) {
        if (is_type(p, T_EOF)) {
            char m[80];
            const char *const *last = names;
            while (last[1]) last++;
            snprintf(m, sizeof m, "expected '{%% %s %%}'", *last);
            perr(p, m);
            break;
        }
        if (!nv_push(p, &v, parse_any(p))) break;
    }
    return nv_done(p, &v);
}

static node *parse_sequence(parser *p, bool primary)
{
    node *first = primary ? parse_primary(p) : parse_expression(p);
    if (!first || !is_type(p, T_COMMA)) return first;
    nvec v = {0};
    nv_push(p, &v, first);
    while (!p->err) {
        p->cur++;
        if (!nv_push(p, &v, primary ? parse_primary(p) : parse_expression(p))) break;
        if (!is_type(p, T_COMMA)) break;
    }
    node *t = mk(p, N_TUPLE);
    if (t)
        t->l1 = nv_done(p, &v);
    else
        free(v.v);
    return p->err ? NULL : t;
}

/* Arguments of a call (mode_params: a macro's parameters). */
static nlist parse_args(parser *p, bool params)
{
    nvec v = {0};
    bool saw_kw = false, saw_spread = false;
    if (!expect(p, T_LPAREN, "expected '('")) return (nlist){0};
    while (!p->err && !is_type(p, T_RPAREN)) {
        if (is_type(p, T_EOF)) {
            perr(p, "expected ')'");
            break;
        }
        bool kwspread = is_type(p, T_POW);
        bool spread = is_type(p, T_MUL) && !strcmp(peek(p)->s, "*");
        if (params && (kwspread || spread)) {
            perr(p, "argument unpacking in parameters");
            break;
        }
        if (kwspread) {
            p->cur++;
            node *x = mk(p, N_KWSPREAD);
            if (!x || !(x->a = parse_expression(p))) break;
            nv_push(p, &v, x);
            if (is_type(p, T_COMMA)) p->cur++;
            if (!is_type(p, T_RPAREN)) perr(p, "expected ')' after a ** argument");
            break;
        }
        node *arg;
        if (spread) {
            if (saw_spread) {
                perr(p, "a second * argument");
                break;
            }
            saw_spread = true;
            p->cur++;
            arg = mk(p, N_SPREAD);
            if (!arg || !(arg->a = parse_expression(p))) break;
        } else {
            arg = parse_expression(p);
            if (!arg) break;
            if (is_type(p, T_EQUALS)) {
                p->cur++;
                if (arg->kind != N_IDENT) {
                    perr(p, "expected an identifier before '='");
                    break;
                }
                node *kw = mk(p, N_KWARG);
                if (!kw) break;
                kw->a = arg;
                kw->s = arg->s;
                kw->n = arg->n;
                if (!(kw->b = parse_expression(p))) break;
                arg = kw;
            }
            if (params) {
                if (arg->kind != N_IDENT && arg->kind != N_KWARG) {
                    perr(p, "expected a parameter name");
                    break;
                }
                for (int i = 0; i < v.n; i++)
                    if (!strcmp(v.v[i]->s, arg->s)) {
                        perr(p, "a duplicate parameter name");
                        break;
                    }
            }
            if (arg->kind == N_KWARG)
                saw_kw = true;
            else if (saw_kw) {
                perr(p, params ? "a parameter without default after one with"
                               : "a positional argument after a keyword argument");
                break;
            } else if (saw_spread) {
                perr(p, "a positional argument after a * argument");
                break;
            }
        }
        if (p->err || !nv_push(p, &v, arg)) break;
        if (is_type(p, T_COMMA)) p->cur++;
    }
    nlist l = nv_done(p, &v);
    expect(p, T_RPAREN, "expected ')'");
    return l;
}

static node *parse_primary(parser *p)
{
    if (!enter(p)) return NULL;
    token *t = peek(p);
    node *x = NULL;
    p->cur++;
    switch (t->type) {
    case T_NUM:
        if ((x = mk(p, strchr(t->s, '.') ? N_FLOAT : N_INT))) x->num = strtod(t->s, NULL);
        break;
    case T_STR: {
        size_t total = t->n, k = p->cur;
        while (k < p->n && p->t[k].type == T_STR) total += p->t[k++].n;
        char *s = arena_alloc(p->mem, total + 1);
        if (!s || !(x = mk(p, N_STR))) {
            if (!p->err) p->err = errdetail_set(&jinja_err, -ENOMEM, "out of memory");
            break;
        }
        memcpy(s, t->s, t->n);
        size_t at = t->n;
        while (is_type(p, T_STR)) {
            memcpy(s + at, peek(p)->s, peek(p)->n);
            at += peek(p)->n;
            p->cur++;
        }
        s[at] = '\0';
        x->s = s;
        x->n = at;
        break;
    }
    case T_IDENT:
        if ((x = mk(p, N_IDENT))) {
            x->s = t->s;
            x->n = t->n;
        }
        break;
    case T_LPAREN:
        x = parse_sequence(p, false);
        if (!expect(p, T_RPAREN, "expected ')'")) x = NULL;
        break;
    case T_LSQUARE: {
        nvec v = {0};
        while (!p->err && !is_type(p, T_RSQUARE)) {
            if (is_type(p, T_EOF)) {
                perr(p, "expected ']'");
                break;
            }
            if (!nv_push(p, &v, parse_expression(p))) break;
            if (is_type(p, T_COMMA)) p->cur++;
        }
        p->cur++;
        if ((x = mk(p, N_ARRAY)))
            x->l1 = nv_done(p, &v);
        else
            free(v.v);
        break;
    }
    case T_LCURLY: {
        nvec k = {0}, v = {0};
        while (!p->err && !is_type(p, T_RCURLY)) {
            if (is_type(p, T_EOF)) {
                perr(p, "expected '}'");
                break;
            }
            if (!nv_push(p, &k, parse_expression(p))) break;
            if (!expect(p, T_COLON, "expected ':' in a dict literal")) break;
            if (!nv_push(p, &v, parse_expression(p))) break;
            if (is_type(p, T_COMMA)) p->cur++;
        }
        p->cur++;
        if ((x = mk(p, N_OBJECT))) {
            x->l1 = nv_done(p, &k);
            x->l2 = nv_done(p, &v);
        } else {
            free(k.v);
            free(v.v);
        }
        break;
    }
    default: p->cur--; perr(p, "unexpected token");
    }
    p->depth--;
    return p->err ? NULL : x;
}

static node *parse_member_args(parser *p)
{
    node *sl[4] = {0};
    int n = 0;
    bool slice = false;
    while (!p->err && !is_type(p, T_RSQUARE)) {
        if (is_type(p, T_EOF) || n == 4) {
            perr(p, "expected ']'");
            return NULL;
        }
        if (is_type(p, T_COLON)) {
            sl[n++] = NULL;
            p->cur++;
            slice = true;
        } else {
            if (!(sl[n++] = parse_expression(p))) return NULL;
            if (is_type(p, T_COLON)) {
                p->cur++;
                slice = true;
            }
        }
    }
    if (p->err) return NULL;
    if (!n) return perr(p, "expected an index");
    if (!slice) return sl[0];
    if (n > 3) return perr(p, "a slice takes at most 3 parts");
    node *x = mk(p, N_SLICE);
    if (x) {
        x->a = sl[0];
        x->b = sl[1];
        x->c = sl[2];
    }
    return x;
}

static node *parse_member(parser *p, node *obj)
{
    while (obj && !p->err && (is_type(p, T_DOT) || is_type(p, T_LSQUARE))) {
        bool computed = is_type(p, T_LSQUARE);
        p->cur++;
        node *m = mk(p, N_MEMBER);
        if (!m) return NULL;
        m->a = obj;
        m->flag = computed;
        if (computed) {
            m->b = parse_member_args(p);
            if (!m->b || !expect(p, T_RSQUARE, "expected ']'")) return NULL;
        } else {
            m->b = parse_primary(p);
            if (!m->b) return NULL;
            if (m->b->kind != N_IDENT && m->b->kind != N_INT)
                return perr(p, "expected a name or an integer after '.'");
        }
        obj = m;
    }
    return p->err ? NULL : obj;
}

static node *parse_call(parser *p, node *callee)
{
    if (!enter(p)) return NULL;
    node *x = mk(p, N_CALL);
    if (x) {
        x->a = callee;
        x->l1 = parse_args(p, false);
        x = parse_member(p, x);
        if (x && is_type(p, T_LPAREN)) x = parse_call(p, x);
    }
    p->depth--;
    return p->err ? NULL : x;
}

static node *parse_call_member(parser *p)
{
    node *m = parse_member(p, parse_primary(p));
    if (m && is_type(p, T_LPAREN)) return parse_call(p, m);
    return m;
}

static node *parse_unary_sign(parser *p)
{
    token *t = peek(p);
    if ((t->type == T_UNARY || t->type == T_ADD) && (!strcmp(t->s, "-") || !strcmp(t->s, "+"))) {
        if (!enter(p)) return NULL;
        p->cur++;
        node *x = mk(p, N_UNARY);
        if (x) {
            x->op = t->s[0] == '-' ? OP_SUB : OP_ADD;
            x->a = parse_unary_sign(p);
        }
        p->depth--;
        return p->err || !x || !x->a ? NULL : x;
    }
    return parse_call_member(p);
}

static node *parse_filter_expr(parser *p)
{
    node *operand = parse_unary_sign(p);
    while (operand && !p->err && is_type(p, T_PIPE)) {
        p->cur++;
        node *f = parse_primary(p);
        if (!f) return NULL;
        if (f->kind != N_IDENT) return perr(p, "expected a filter name");
        if (is_type(p, T_LPAREN)) f = parse_call(p, f);
        if (!f) return NULL;
        node *x = mk(p, N_FILTER);
        if (!x) return NULL;
        x->a = operand;
        x->b = f;
        operand = x;
    }
    return p->err ? NULL : operand;
}

static node *parse_test_expr(parser *p)
{
    node *operand = parse_filter_expr(p);
    while (operand && !p->err && is_ident(p, "is")) {
        p->cur++;
        bool neg = is_ident(p, "not");
        if (neg) p->cur++;
        node *t = parse_primary(p);
        if (!t) return NULL;
        if (t->kind != N_IDENT) return perr(p, "expected a test name");
        node *x = mk(p, N_TEST);
        if (!x) return NULL;
        x->a = operand;
        x->flag = neg;
        x->s = t->s;
        x->n = t->n;
        operand = x;
    }
    return p->err ? NULL : operand;
}

static node *binary(parser *p, int op, node *l, node *r)
{
    if (!l || !r) return NULL;
    node *x = mk(p, N_BINARY);
    if (x) {
        x->op = op;
        x->a = l;
        x->b = r;
    }
    return x;
}

static node *parse_power(parser *p)
{
    node *l = parse_test_expr(p);
    while (l && is_type(p, T_POW)) {
        p->cur++;
        l = binary(p, OP_POW, l, parse_test_expr(p));
    }
    return l;
}

static node *parse_multiplicative(parser *p)
{
    node *l = parse_power(p);
    while (l && is_type(p, T_MUL)) {
        const char *o = peek(p)->s;
        int op = !strcmp(o, "*")    ? OP_MUL
                 : !strcmp(o, "/")  ? OP_DIV
                 : !strcmp(o, "//") ? OP_FLOORDIV
                                    : OP_MOD;
        p->cur++;
        l = binary(p, op, l, parse_power(p));
    }
    return l;
}

static node *parse_additive(parser *p)
{
    node *l = parse_multiplicative(p);
    while (l && is_type(p, T_ADD)) {
        const char *o = peek(p)->s;
        int op = o[0] == '+' ? OP_ADD : o[0] == '-' ? OP_SUB : OP_CONCAT;
        p->cur++;
        l = binary(p, op, l, parse_multiplicative(p));
    }
    return l;
}

static node *parse_comparison(parser *p)
{
    node *l = parse_additive(p);
    while (l && !p->err) {
        int op;
        if (is_ident2(p, "not", "in")) {
            op = OP_NOTIN;
            p->cur += 2;
        } else if (is_ident(p, "in")) {
            op = OP_IN;
            p->cur++;
        } else if (is_type(p, T_CMP)) {
            const char *o = peek(p)->s;
            op = !strcmp(o, "==")   ? OP_EQ
                 : !strcmp(o, "!=") ? OP_NE
                 : !strcmp(o, "<=") ? OP_LE
                 : !strcmp(o, ">=") ? OP_GE
                 : !strcmp(o, "<")  ? OP_LT
                                    : OP_GT;
            p->cur++;
        } else {
            break;
        }
        l = binary(p, op, l, parse_additive(p));
    }
    return l;
}

static node *parse_not(parser *p)
{
    node *r = NULL;
    while (!p->err && is_ident(p, "not")) {
        if (!enter(p)) return NULL;
        p->cur++;
        node *x = mk(p, N_UNARY);
        if (!x) return NULL;
        x->op = OP_NOT;
        x->a = parse_not(p);
        p->depth--;
        if (!x->a) return NULL;
        r = x;
    }
    return r ? r : parse_comparison(p);
}

static node *parse_and(parser *p)
{
    node *l = parse_not(p);
    while (l && is_ident(p, "and")) {
        p->cur++;
        l = binary(p, OP_AND, l, parse_not(p));
    }
    return l;
}

static node *parse_logical_or(parser *p)
{
    node *l = parse_and(p);
    while (l && is_ident(p, "or")) {
        p->cur++;
        l = binary(p, OP_OR, l, parse_and(p));
    }
    return l;
}

static node *parse_if_expr(parser *p)
{
    node *a = parse_logical_or(p);
    if (a && is_ident(p, "if")) {
        p->cur++;
        node *test = parse_logical_or(p);
        if (!test) return NULL;
        if (is_ident(p, "else")) {
            p->cur++;
            if (!enter(p)) return NULL;
            node *f = parse_if_expr(p);
            p->depth--;
            node *x = f ? mk(p, N_TERNARY) : NULL;
            if (!x) return NULL;
            x->a = test;
            x->b = a;
            x->c = f;
            return x;
        }
        node *x = mk(p, N_SELECT);
        if (!x) return NULL;
        x->a = a;
        x->b = test;
        return x;
    }
    return a;
}

static node *parse_expression(parser *p)
{
    if (!enter(p)) return NULL;
    node *x = parse_if_expr(p);
    p->depth--;
    return p->err ? NULL : x;
}

static node *parse_if_stmt(parser *p)
{
    static const char *const stop[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    if (!enter(p)) return NULL;
    node *x = mk(p, N_IF);
    if (!x || !(x->a = parse_expression(p)) || !expect(p, T_CLOSE_STMT, "expected '%}'"))
        return NULL;
    x->l1 = parse_body(p, stop);
    if (p->err) return NULL;
    if (is_statement(p, (const char *const[]){"elif", NULL})) {
        p->cur += 2;
        nvec v = {0};
        nv_push(p, &v, parse_if_stmt(p));
        x->l2 = nv_done(p, &v);
    } else if (is_statement(p, (const char *const[]){"else", NULL})) {
        p->cur += 2;
        if (!expect(p, T_CLOSE_STMT, "expected '%}'")) return NULL;
        x->l2 = parse_body(p, endif);
    }
    p->depth--;
    return p->err ? NULL : x;
}

static bool end_tag(parser *p, const char *name)
{
    return expect(p, T_OPEN_STMT, "expected '{%'") && expect_ident(p, name) &&
           expect(p, T_CLOSE_STMT, "expected '%}'");
}

static node *parse_statement(parser *p)
{
    if (!expect(p, T_OPEN_STMT, "expected '{%'")) return NULL;
    token *t = peek(p);
    if (t->type != T_IDENT) return perr(p, "expected a statement name");
    const char *name = t->s;
    node *x = NULL;
    p->cur++;
    if (!strcmp(name, "set")) {
        if (!(x = mk(p, N_SET)) || !(x->a = parse_sequence(p, false))) return NULL;
        if (is_type(p, T_EQUALS)) {
            p->cur++;
            if (!(x->b = parse_sequence(p, false))) return NULL;
        } else {
            if (!expect(p, T_CLOSE_STMT, "expected '=' or '%}'")) return NULL;
            x->l1 = parse_body(p, (const char *const[]){"endset", NULL});
            if (!expect(p, T_OPEN_STMT, "expected '{%'") || !expect_ident(p, "endset")) return NULL;
        }
        if (!expect(p, T_CLOSE_STMT, "expected '%}'")) return NULL;
    } else if (!strcmp(name, "if")) {
        if (!(x = parse_if_stmt(p)) || !end_tag(p, "endif")) return NULL;
    } else if (!strcmp(name, "macro")) {
        node *nm = parse_primary(p);
        if (!nm) return NULL;
        if (nm->kind != N_IDENT) return perr(p, "expected a macro name");
        if (!(x = mk(p, N_MACRO))) return NULL;
        x->s = nm->s;
        x->n = nm->n;
        x->l1 = parse_args(p, true);
        if (!expect(p, T_CLOSE_STMT, "expected '%}'")) return NULL;
        x->l2 = parse_body(p, (const char *const[]){"endmacro", NULL});
        if (!end_tag(p, "endmacro")) return NULL;
    } else if (!strcmp(name, "for")) {
        if (!(x = mk(p, N_FOR)) || !(x->a = parse_sequence(p, true))) return NULL;
        if (x->a->kind != N_IDENT && x->a->kind != N_TUPLE)
            return perr(p, "expected a name or a tuple of names after 'for'");
        if (!expect_ident(p, "in") || !(x->b = parse_expression(p)) ||
            !expect(p, T_CLOSE_STMT, "expected '%}'"))
            return NULL;
        x->l1 = parse_body(p, (const char *const[]){"endfor", "else", NULL});
        if (p->err) return NULL;
        if (is_statement(p, (const char *const[]){"else", NULL})) {
            p->cur += 2;
            if (!expect(p, T_CLOSE_STMT, "expected '%}'")) return NULL;
            x->l2 = parse_body(p, (const char *const[]){"endfor", NULL});
        }
        if (!end_tag(p, "endfor")) return NULL;
    } else if (!strcmp(name, "call")) {
        if (!(x = mk(p, N_CALLBLOCK))) return NULL;
        if (is_type(p, T_LPAREN)) {
            x->flag = true;
            x->l1 = parse_args(p, true);
        }
        node *callee = parse_primary(p);
        if (!callee) return NULL;
        if (callee->kind != N_IDENT) return perr(p, "expected a macro name after 'call'");
        node *c = mk(p, N_CALL);
        if (!c) return NULL;
        c->a = callee;
        c->l1 = parse_args(p, false);
        x->a = c;
        if (!expect(p, T_CLOSE_STMT, "expected '%}'")) return NULL;
        x->l2 = parse_body(p, (const char *const[]){"endcall", NULL});
        if (!end_tag(p, "endcall")) return NULL;
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        if (!(x = mk(p, name[0] == 'b' ? N_BREAK : N_CONTINUE))) return NULL;
        if (!expect(p, T_CLOSE_STMT, "expected '%}'")) return NULL;
    } else if (!strcmp(name, "filter")) {
        node *f = parse_primary(p);
        if (f && f->kind == N_IDENT && is_type(p, T_LPAREN)) f = parse_call(p, f);
        if (!f || !(x = mk(p, N_FILTERBLOCK))) return NULL;
        x->a = f;
        if (!expect(p, T_CLOSE_STMT, "expected '%}'")) return NULL;
        x->l1 = parse_body(p, (const char *const[]){"endfilter", NULL});
        if (!end_tag(p, "endfilter")) return NULL;
    } else {
        p->cur--;
        return perr(p, "unknown statement");
    }
    return p->err ? NULL : x;
}

static node *parse_any(parser *p)
{
    if (!enter(p)) return NULL;
    token *t = peek(p);
    node *x = NULL;
    switch (t->type) {
    case T_COMMENT:
        p->cur++;
        x = mk(p, N_COMMENT);
        break;
    case T_TEXT:
        p->cur++;
        if ((x = mk(p, N_TEXT))) {
            x->s = t->s;
            x->n = t->n;
        }
        break;
    case T_OPEN_STMT: x = parse_statement(p); break;
    case T_OPEN_EXPR:
        p->cur++;
        x = parse_expression(p);
        if (!expect(p, T_CLOSE_EXPR, "expected '}}'")) x = NULL;
        break;
    default: perr(p, "unexpected token");
    }
    p->depth--;
    return p->err ? NULL : x;
}

int jinja_parse(const char *src, size_t len, jinja_template **out)
{
    *out = NULL;
    if (!src) return errdetail_set(&jinja_err, -EINVAL, "template: NULL");
    jinja_template *t = calloc(1, sizeof *t);
    if (!t) return errdetail_set(&jinja_err, -ENOMEM, "out of memory");
    t->mem.cap = SIZE_MAX;
    lexer L = {.mem = &t->mem};
    int err = preprocess(src, len, &L.src);
    if (err) {
        free(t);
        return errdetail_set(&jinja_err, err, "out of memory");
    }
    err = lex(&L);
    pt_free(&L.src);
    if (!err) {
        parser P = {.t = L.t, .n = L.n, .mem = &t->mem};
        nvec body = {0};
        while (!P.err && P.cur < P.n)
            if (!nv_push(&P, &body, parse_any(&P))) break;
        t->body = nv_done(&P, &body);
        err = P.err;
    }
    free(L.t);
    if (err) {
        jinja_free(t);
        return err;
    }
    *out = t;
    return 0;
}

void jinja_free(jinja_template *t)
{
    if (!t) return;
    arena_free(&t->mem);
    free(t);
}

/* ---- values ---------------------------------------------------------------------------------- */

enum vtype {
    V_UNDEF,
    V_NULL,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,
    V_ARRAY,
    V_TUPLE,
    V_OBJECT,
    V_KWARGS,
    V_NS,
    V_FUNC
};

static const char *const vtype_names[] = {
    "UndefinedValue", "NullValue",    "BooleanValue", "IntegerValue", "FloatValue",
    "StringValue",    "ArrayValue",   "TupleValue",   "ObjectValue",  "KeywordArgumentsValue",
    "NamespaceValue", "FunctionValue"};

typedef struct jv jv;
typedef struct jarr {
    size_t n;
    jv *v;
} jarr;
typedef struct jobj jobj;
typedef struct jfn jfn;

struct jv {
    int t;
    union {
        bool b;
        double n;
        struct {
            const char *p;
            size_t n;
        } s;
        jarr *a;
        jobj *o;
        jfn *f;
    };
};

struct jobj {
    size_t n, cap;
    const char **kp;
    size_t *kn;
    jv *v;
};

typedef struct scope scope;

enum fn_kind {
    F_NAMESPACE,
    F_RAISE,
    F_RANGE,
    F_STRFTIME,
    F_MACRO,
    F_CALLER,
    /* methods (self bound) */
    F_UPPER,
    F_LOWER,
    F_STRIP,
    F_TITLE,
    F_CAPITALIZE,
    F_RSTRIP,
    F_LSTRIP,
    F_STARTSWITH,
    F_ENDSWITH,
    F_SPLIT,
    F_REPLACE,
    F_GET,
    F_ITEMS,
    F_KEYS,
    F_VALUES,
    F_DICTSORT,
};

struct jfn {
    int kind;
    jv self;
    const node *def; /* macro or call block */
    scope *env;      /* a call block's defining scope */
    bool kwargs, varargs;
};

struct scope {
    scope *parent;
    size_t n, cap;
    const char **name;
    size_t *nlen;
    jv *val;
};

typedef struct ctx {
    arena mem;
    sbuf *out;
    jinja_limits lim;
    uint64_t steps;
    int depth;
    int err;
    int line;
} ctx;

enum { R_OK = 0, R_ERR = -1, R_BREAK = 1, R_CONTINUE = 2 };

static const jv UNDEF = {.t = V_UNDEF};
static const jv JNULL = {.t = V_NULL};

static int fail(ctx *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(ctx *c, int rc, const char *fmt, ...)
{
    if (c->err) return R_ERR;
    char m[ERRDETAIL_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    c->err = errdetail_set(&jinja_err, rc, "line %d: %s", c->line, m);
    return R_ERR;
}

static int oom(ctx *c)
{
    if (c->mem.over)
        return fail(c, -E2BIG, "the template needs more than %zu bytes of memory",
                    c->lim.max_memory_bytes);
    return fail(c, -ENOMEM, "out of memory");
}

static void *cmalloc(ctx *c, size_t n)
{
    void *p = arena_alloc(&c->mem, n ? n : 1);
    if (!p) oom(c);
    return p;
}

static bool is_num(const jv *v)
{
    return v->t == V_INT || v->t == V_FLOAT;
}

static bool is_arr(const jv *v)
{
    return v->t == V_ARRAY || v->t == V_TUPLE;
}

static bool is_obj(const jv *v)
{
    return v->t == V_OBJECT || v->t == V_KWARGS;
}

static jv mk_bool(bool b)
{
    jv v = {.t = V_BOOL};
    v.b = b;
    return v;
}

static jv mk_num(int t, double n)
{
    jv v = {.t = t};
    v.n = n;
    return v;
}

static jv mk_str(const char *p, size_t n)
{
    jv v = {.t = V_STR};
    v.s.p = p;
    v.s.n = n;
    return v;
}

/* A string value from a buffer (copied into the arena; the buffer is freed). */
static int str_from_sbuf(ctx *c, sbuf *b, jv *out)
{
    if (b->err) {
        int e = b->err;
        free(b->p);
        *b = (sbuf){0};
        if (e == -E2BIG)
            return fail(c, -E2BIG, "a string grows past %zu bytes", c->lim.max_output_bytes);
        return fail(c, -ENOMEM, "out of memory");
    }
    char *p = cmalloc(c, b->n + 1);
    if (p) {
        memcpy(p, b->p ? b->p : "", b->n);
        p[b->n] = '\0';
        *out = mk_str(p, b->n);
    }
    free(b->p);
    *b = (sbuf){0};
    return p ? R_OK : R_ERR;
}

static sbuf new_sbuf(ctx *c)
{
    return (sbuf){.max = c->lim.max_output_bytes};
}

static jv mk_arr(ctx *c, int t, size_t n)
{
    jarr *a = cmalloc(c, sizeof *a);
    jv *v = cmalloc(c, n * sizeof *v);
    jv r = {.t = V_UNDEF};
    if (!a || !v) return r;
    a->n = n;
    a->v = v;
    for (size_t i = 0; i < n; i++) v[i] = UNDEF;
    r.t = t;
    r.a = a;
    return r;
}

static jobj *obj_new(ctx *c, size_t cap)
{
    jobj *o = cmalloc(c, sizeof *o);
    if (!o) return NULL;
    o->n = 0;
    o->cap = cap ? cap : 4;
    o->kp = cmalloc(c, o->cap * sizeof *o->kp);
    o->kn = cmalloc(c, o->cap * sizeof *o->kn);
    o->v = cmalloc(c, o->cap * sizeof *o->v);
    return o->kp && o->kn && o->v ? o : NULL;
}

static jv *obj_find(const jobj *o, const char *k, size_t kn)
{
    for (size_t i = 0; i < o->n; i++)
        if (o->kn[i] == kn && !memcmp(o->kp[i], k, kn)) return &o->v[i];
    return NULL;
}

static int obj_set(ctx *c, jobj *o, const char *k, size_t kn, jv v)
{
    jv *at = obj_find(o, k, kn);
    if (at) {
        *at = v;
        return R_OK;
    }
    if (o->n == o->cap) {
        size_t cap = o->cap * 2;
        const char **kp = cmalloc(c, cap * sizeof *kp);
        size_t *knn = cmalloc(c, cap * sizeof *knn);
        jv *vv = cmalloc(c, cap * sizeof *vv);
        if (!kp || !knn || !vv) return R_ERR;
        memcpy(kp, o->kp, o->n * sizeof *kp);
        memcpy(knn, o->kn, o->n * sizeof *knn);
        memcpy(vv, o->v, o->n * sizeof *vv);
        o->kp = kp;
        o->kn = knn;
        o->v = vv;
        o->cap = cap;
    }
    o->kp[o->n] = k;
    o->kn[o->n] = kn;
    o->v[o->n++] = v;
    return R_OK;
}

static jv mk_obj(int t, jobj *o)
{
    jv v = {.t = o ? t : V_UNDEF};
    v.o = o;
    return v;
}

static jv mk_fn(ctx *c, int kind, jv self)
{
    jfn *f = cmalloc(c, sizeof *f);
    jv v = {.t = V_UNDEF};
    if (!f) return v;
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->self = self;
    v.t = V_FUNC;
    v.f = f;
    return v;
}

static bool truthy(const jv *v)
{
    switch (v->t) {
    case V_BOOL: return v->b;
    case V_INT:
    case V_FLOAT: return v->n != 0 && !isnan(v->n);
    case V_STR: return v->s.n > 0;
    case V_ARRAY:
    case V_TUPLE: return v->a->n > 0;
    case V_OBJECT:
    case V_KWARGS: return v->o->n > 0;
    case V_NS:
    case V_FUNC: return true;
    default: return false;
    }
}

/* ---- scopes ----------------------------------------------------------------------------------- */

static scope *scope_new(ctx *c, scope *parent)
{
    scope *s = cmalloc(c, sizeof *s);
    if (s) memset(s, 0, sizeof *s), s->parent = parent;
    return s;
}

static int scope_set(ctx *c, scope *s, const char *name, size_t n, jv v)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->nlen[i] == n && !memcmp(s->name[i], name, n)) {
            s->val[i] = v;
            return R_OK;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        const char **nm = cmalloc(c, cap * sizeof *nm);
        size_t *nl = cmalloc(c, cap * sizeof *nl);
        jv *vv = cmalloc(c, cap * sizeof *vv);
        if (!nm || !nl || !vv) return R_ERR;
        if (s->n) {
            memcpy(nm, s->name, s->n * sizeof *nm);
            memcpy(nl, s->nlen, s->n * sizeof *nl);
            memcpy(vv, s->val, s->n * sizeof *vv);
        }
        s->name = nm;
        s->nlen = nl;
        s->val = vv;
        s->cap = cap;
    }
    s->name[s->n] = name;
    s->nlen[s->n] = n;
    s->val[s->n++] = v;
    return R_OK;
}

static jv scope_get(const scope *s, const char *name, size_t n)
{
    for (; s; s = s->parent)
        for (size_t i = 0; i < s->n; i++)
            if (s->nlen[i] == n && !memcmp(s->name[i], name, n)) return s->val[i];
    return UNDEF;
}

/* ---- printing ----------------------------------------------------------------------------------- */

typedef struct json_opts {
    int indent; /* 0: none */
    bool ensure_ascii, sort_keys;
    const char *item_sep, *key_sep;
    size_t item_n, key_n;
} json_opts;

static void json_quote(sbuf *b, const char *s, size_t n, bool ascii)
{
    sb_addc(b, '"');
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)s[i];
        char e[16];
        if (ch == '"' || ch == '\\') {
            sb_addc(b, '\\');
            sb_addc(b, (char)ch);
            i++;
        } else if (ch < 0x20) {
            const char *m = ch == '\b'   ? "\\b"
                            : ch == '\f' ? "\\f"
                            : ch == '\n' ? "\\n"
                            : ch == '\r' ? "\\r"
                            : ch == '\t' ? "\\t"
                                         : NULL;
            if (m)
                sb_add(b, m);
            else {
                snprintf(e, sizeof e, "\\u%04x", ch);
                sb_add(b, e);
            }
            i++;
        } else if (ascii && ch >= 0x7F) {
            size_t l;
            unsigned cp = u8_decode((const unsigned char *)s + i, n - i, &l);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(e, sizeof e, "\\u%04x", cp);
            }
            sb_add(b, e);
            i += l;
        } else {
            sb_addc(b, (char)ch);
            i++;
        }
    }
    sb_addc(b, '"');
}

static void newline_pad(sbuf *b, const json_opts *o, int depth)
{
    sb_addc(b, '\n');
    for (int i = 0; i < depth * o->indent; i++) sb_addc(b, ' ');
}

/* ICU-like order for sort_keys: punctuation, digits, letters (case folded), then case. */
static int key_rank(unsigned char c)
{
    if (c >= '0' && c <= '9') return 1000 + c;
    if (c >= 'a' && c <= 'z') return 2000 + (c - 'a') * 2;
    if (c >= 'A' && c <= 'Z') return 2000 + (c - 'A') * 2;
    return c;
}

static int key_cmp(const char *a, size_t an, const char *b, size_t bn)
{
    for (size_t i = 0; i < an && i < bn; i++) {
        int d = key_rank((unsigned char)a[i]) - key_rank((unsigned char)b[i]);
        if (d) return d;
    }
    if (an != bn) return an < bn ? -1 : 1;
    for (size_t i = 0; i < an; i++)
        if (a[i] != b[i]) return (a[i] >= 'a') ? -1 : 1; /* lower case first */
    return 0;
}

static int to_json(ctx *c, sbuf *b, const jv *v, const json_opts *o, int depth, bool undef_null)
{
    if (++c->depth > c->lim.max_depth) {
        c->depth--;
        return fail(c, -E2BIG, "values nest deeper than %d levels", c->lim.max_depth);
    }
    int rc = R_OK;
    switch (v->t) {
    case V_NULL: sb_add(b, "null"); break;
    case V_UNDEF: sb_add(b, undef_null ? "null" : "undefined"); break;
    case V_BOOL: sb_add(b, v->b ? "true" : "false"); break;
    case V_INT:
    case V_FLOAT:
        if (isnan(v->n) || isinf(v->n))
            sb_add(b, "null");
        else
            js_num(b, v->n);
        break;
    case V_STR: json_quote(b, v->s.p, v->s.n, o->ensure_ascii); break;
    case V_ARRAY:
        sb_addc(b, '[');
        for (size_t i = 0; i < v->a->n && rc == R_OK; i++) {
            if (i) sb_addn(b, o->item_sep, o->item_n);
            if (o->indent) newline_pad(b, o, depth + 1);
            rc = to_json(c, b, &v->a->v[i], o, depth + 1, undef_null);
        }
        if (o->indent && v->a->n) newline_pad(b, o, depth);
        sb_addc(b, ']');
        break;
    case V_OBJECT:
    case V_NS: {
        size_t n = v->o->n, *ord = malloc((n ? n : 1) * sizeof *ord);
        if (!ord) return fail(c, -ENOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) ord[i] = i;
        if (o->sort_keys) /* insertion sort: stable, objects are small */
            for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0 && key_cmp(v->o->kp[ord[j - 1]], v->o->kn[ord[j - 1]],
                                                    v->o->kp[ord[j]], v->o->kn[ord[j]]) > 0;
                     j--) {
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
        sb_addc(b, '{');
        for (size_t k = 0; k < n && rc == R_OK; k++) {
            size_t i = ord[k];
            if (k) sb_addn(b, o->item_sep, o->item_n);
            if (o->indent) newline_pad(b, o, depth + 1);
            json_quote(b, v->o->kp[i], v->o->kn[i], o->ensure_ascii);
            sb_addn(b, o->key_sep, o->key_n);
            rc = to_json(c, b, &v->o->v[i], o, depth + 1, undef_null);
        }
        if (o->indent && n) newline_pad(b, o, depth);
        sb_addc(b, '}');
        free(ord);
        break;
    }
    default: rc = fail(c, -EINVAL, "cannot convert a %s to JSON", vtype_names[v->t]);
    }
    c->depth--;
    return rc;
}

static const json_opts JSON_DEFAULT = {0, false, false, ", ", ": ", 2, 2};

/* The oracle's RuntimeValue.toString(): what {{ x }} prints. */
static int print_value(ctx *c, sbuf *b, const jv *v)
{
    char t[64];
    switch (v->t) {
    case V_UNDEF: sb_add(b, "undefined"); return R_OK;
    case V_NULL: sb_add(b, "null"); return R_OK;
    case V_BOOL: sb_add(b, v->b ? "true" : "false"); return R_OK;
    case V_INT: js_num(b, v->n); return R_OK;
    case V_FLOAT:
        if (v->n == 0 && signbit(v->n))
            sb_add(b, "-0.0");
        else if (isfinite(v->n) && v->n == floor(v->n) && fabs(v->n) < 1e21) {
            snprintf(t, sizeof t, "%.1f", v->n);
            sb_add(b, t);
        } else
            js_num(b, v->n);
        return R_OK;
    case V_STR: sb_addn(b, v->s.p, v->s.n); return R_OK;
    case V_FUNC: return fail(c, -EINVAL, "cannot print a function");
    default: return to_json(c, b, v, &JSON_DEFAULT, 0, false);
    }
}

/* JavaScript's String(x.value): how '+', '~' and join turn a value into text. */
static int raw_string(ctx *c, sbuf *b, const jv *v)
{
    switch (v->t) {
    case V_INT:
    case V_FLOAT: js_num(b, v->n); return R_OK;
    case V_ARRAY:
    case V_TUPLE:
        for (size_t i = 0; i < v->a->n; i++) {
            if (i) sb_addc(b, ',');
            if (print_value(c, b, &v->a->v[i])) return R_ERR;
        }
        return R_OK;
    case V_OBJECT:
    case V_KWARGS:
    case V_NS: sb_add(b, "[object Map]"); return R_OK;
    default: return print_value(c, b, v);
    }
}

/* ---- evaluation ------------------------------------------------------------------------------- */

static int eval(ctx *c, const node *n, scope *s, jv *out);
static int exec_block(ctx *c, const nlist *body, scope *s);

static int step(ctx *c, const node *n)
{
    c->line = n->line;
    if (++c->steps > c->lim.max_steps)
        return fail(c, -E2BIG, "the template runs past %llu steps (a loop that does not end?)",
                    (unsigned long long)c->lim.max_steps);
    return R_OK;
}

static int str_eq(const jv *a, const jv *b)
{
    return a->s.n == b->s.n && !memcmp(a->s.p, b->s.p, a->s.n);
}

/* JavaScript's ===, on the values the oracle compares (x.value === y.value). */
static bool strict_eq(const jv *a, const jv *b)
{
    if (is_num(a) && is_num(b)) return a->n == b->n;
    if (a->t != b->t) return false;
    switch (a->t) {
    case V_UNDEF:
    case V_NULL: return true;
    case V_BOOL: return a->b == b->b;
    case V_STR: return str_eq(a, b);
    case V_ARRAY:
    case V_TUPLE: return a->a == b->a;
    case V_OBJECT:
    case V_KWARGS:
    case V_NS: return a->o == b->o;
    default: return a->f == b->f;
    }
}

static double to_number(const jv *v)
{
    if (v->t == V_BOOL) return v->b;
    if (is_num(v)) return v->n;
    if (v->t == V_STR) return js_parse_float(v->s.p, v->s.n, true);
    return NAN;
}

/* JavaScript's == between the values' JavaScript forms. */
static int loose_eq(ctx *c, const jv *a, const jv *b, bool *eq)
{
    bool an = a->t == V_UNDEF || a->t == V_NULL, bn = b->t == V_UNDEF || b->t == V_NULL;
    if (an || bn) {
        *eq = an && bn;
        return R_OK;
    }
    bool ac = a->t >= V_ARRAY, bc = b->t >= V_ARRAY; /* objects of JavaScript */
    if (ac && bc) {
        *eq = strict_eq(a, b) && (is_arr(a) == is_arr(b));
        return R_OK;
    }
    if (ac || bc) { /* an object against a primitive: its string form */
        sbuf t = new_sbuf(c);
        if (raw_string(c, &t, ac ? a : b)) return free(t.p), R_ERR;
        jv sv;
        if (str_from_sbuf(c, &t, &sv)) return R_ERR;
        return loose_eq(c, ac ? &sv : a, ac ? b : &sv, eq);
    }
    if (a->t == V_STR && b->t == V_STR)
        *eq = str_eq(a, b);
    else if (a->t == V_BOOL && b->t == V_BOOL)
        *eq = a->b == b->b;
    else
        *eq = to_number(a) == to_number(b);
    return R_OK;
}

static int concat(ctx *c, const jv *a, const jv *b, jv *out)
{
    sbuf t = new_sbuf(c);
    if (raw_string(c, &t, a) || raw_string(c, &t, b)) {
        free(t.p);
        return R_ERR;
    }
    return str_from_sbuf(c, &t, out);
}

static int binary_op(ctx *c, const node *n, scope *s, jv *out)
{
    jv l, r;
    if (eval(c, n->a, s, &l)) return R_ERR;
    if (n->op == OP_AND) return truthy(&l) ? eval(c, n->b, s, out) : (*out = l, R_OK);
    if (n->op == OP_OR) return truthy(&l) ? (*out = l, R_OK) : eval(c, n->b, s, out);
    if (eval(c, n->b, s, &r)) return R_ERR;
    int op = n->op;
    if (op == OP_EQ || op == OP_NE) {
        bool eq;
        if (loose_eq(c, &l, &r, &eq)) return R_ERR;
        *out = mk_bool(op == OP_EQ ? eq : !eq);
        return R_OK;
    }
    if (l.t == V_UNDEF || r.t == V_UNDEF) {
        if (r.t == V_UNDEF && (op == OP_IN || op == OP_NOTIN)) {
            *out = mk_bool(op == OP_NOTIN);
            return R_OK;
        }
        return fail(c, -EINVAL, "cannot apply '%s' to an undefined value", op_names[op]);
    }
    if (l.t == V_NULL || r.t == V_NULL)
        return fail(c, -EINVAL, "cannot apply '%s' to none", op_names[op]);
    if (op == OP_CONCAT) return concat(c, &l, &r, out);
    bool lnum = is_num(&l) || l.t == V_BOOL, rnum = is_num(&r) || r.t == V_BOOL;
    if (op == OP_POW && lnum && rnum) {
        double a = to_number(&l), b = to_number(&r);
        if (a == 0 && b < 0) return fail(c, -EINVAL, "0.0 cannot be raised to a negative power");
        double res = pow(a, b);
        if (!isfinite(res)) return fail(c, -EINVAL, "'**' gives a number that is not finite");
        *out = mk_num(l.t == V_FLOAT || r.t == V_FLOAT || b < 0 ? V_FLOAT : V_INT, res);
        return R_OK;
    }
    if (is_num(&l) && is_num(&r)) {
        double a = l.n, b = r.n;
        int ft = l.t == V_FLOAT || r.t == V_FLOAT ? V_FLOAT : V_INT;
        switch (op) {
        case OP_ADD: *out = mk_num(ft, a + b); return R_OK;
        case OP_SUB: *out = mk_num(ft, a - b); return R_OK;
        case OP_MUL: *out = mk_num(ft, a * b); return R_OK;
        case OP_DIV: *out = mk_num(V_FLOAT, a / b); return R_OK;
        case OP_FLOORDIV: *out = mk_num(ft, floor(a / b)); return R_OK;
        case OP_MOD: *out = mk_num(ft, fmod(a, b)); return R_OK;
        case OP_LT: *out = mk_bool(a < b); return R_OK;
        case OP_GT: *out = mk_bool(a > b); return R_OK;
        case OP_LE: *out = mk_bool(a <= b); return R_OK;
        case OP_GE: *out = mk_bool(a >= b); return R_OK;
        default: break;
        }
    } else if (is_arr(&l) && is_arr(&r)) {
        if (op == OP_ADD) {
            jv a = mk_arr(c, V_ARRAY, l.a->n + r.a->n);
            if (c->err) return R_ERR;
            memcpy(a.a->v, l.a->v, l.a->n * sizeof(jv));
            memcpy(a.a->v + l.a->n, r.a->v, r.a->n * sizeof(jv));
            *out = a;
            return R_OK;
        }
    } else if (is_arr(&r)) {
        if (op == OP_IN || op == OP_NOTIN) {
            bool found = false;
            for (size_t i = 0; i < r.a->n && !found; i++) found = strict_eq(&r.a->v[i], &l);
            *out = mk_bool(op == OP_IN ? found : !found);
            return R_OK;
        }
    }
    if ((l.t == V_STR || r.t == V_STR) && op == OP_ADD) return concat(c, &l, &r, out);
    if (l.t == V_STR && r.t == V_STR && (op == OP_IN || op == OP_NOTIN)) {
        bool found = l.s.n == 0 || (r.s.n >= l.s.n && memmem(r.s.p, r.s.n, l.s.p, l.s.n));
        *out = mk_bool(op == OP_IN ? found : !found);
        return R_OK;
    }
    if (l.t == V_STR && is_obj(&r) && (op == OP_IN || op == OP_NOTIN)) {
        bool found = obj_find(r.o, l.s.p, l.s.n) != NULL;
        *out = mk_bool(op == OP_IN ? found : !found);
        return R_OK;
    }
    return fail(c, -EINVAL, "unknown operator '%s' between %s and %s", op_names[op],
                vtype_names[l.t], vtype_names[r.t]);
}

/* Evaluated arguments: positional ones, then keyword ones (an object, NULL when none). */
typedef struct args {
    jv *pos;
    size_t n;
    jobj *kw;
} args;

static int eval_args(ctx *c, const nlist *l, scope *s, args *a)
{
    a->pos = cmalloc(c, (size_t)(l->n + 1) * sizeof *a->pos);
    a->n = 0;
    a->kw = NULL;
    if (!a->pos) return R_ERR;
    size_t cap = (size_t)l->n + 1;
    for (int i = 0; i < l->n; i++) {
        const node *x = l->v[i];
        jv v;
        if (x->kind == N_SPREAD) {
            if (eval(c, x->a, s, &v)) return R_ERR;
            if (!is_arr(&v)) return fail(c, -EINVAL, "cannot unpack a %s", vtype_names[v.t]);
            jv *p = cmalloc(c, (cap + v.a->n) * sizeof *p);
            if (!p) return R_ERR;
            memcpy(p, a->pos, a->n * sizeof *p);
            a->pos = p;
            cap += v.a->n;
            for (size_t j = 0; j < v.a->n; j++) a->pos[a->n++] = v.a->v[j];
        } else if (x->kind != N_KWARG && x->kind != N_KWSPREAD) {
            if (eval(c, x, s, &v)) return R_ERR;
            a->pos[a->n++] = v;
        }
    }
    for (int i = 0; i < l->n; i++) {
        const node *x = l->v[i];
        jv v;
        if (x->kind != N_KWARG && x->kind != N_KWSPREAD) continue;
        if (!a->kw && !(a->kw = obj_new(c, 4))) return R_ERR;
        if (eval(c, x->kind == N_KWARG ? x->b : x->a, s, &v)) return R_ERR;
        if (x->kind == N_KWARG) {
            if (obj_find(a->kw, x->s, x->n))
                return fail(c, -EINVAL, "keyword argument '%s' given twice", x->s);
            if (obj_set(c, a->kw, x->s, x->n, v)) return R_ERR;
        } else {
            if (!is_obj(&v))
                return fail(c, -EINVAL, "** needs a mapping, not a %s", vtype_names[v.t]);
            for (size_t j = 0; j < v.o->n; j++) {
                if (obj_find(a->kw, v.o->kp[j], v.o->kn[j]))
                    return fail(c, -EINVAL, "keyword argument '%.*s' given twice", (int)v.o->kn[j],
                                v.o->kp[j]);
                if (obj_set(c, a->kw, v.o->kp[j], v.o->kn[j], v.o->v[j])) return R_ERR;
            }
        }
    }
    return R_OK;
}

/* Positional argument i, else keyword name, else NULL. */
static const jv *arg_get(const args *a, size_t i, const char *name)
{
    if (i < a->n) return &a->pos[i];
    if (name && a->kw) return obj_find(a->kw, name, strlen(name));
    return NULL;
}

/* The argument list as the oracle's functions see it: keywords as one last object. */
static void args_fold_kw(ctx *c, args *a)
{
    if (!a->kw) return;
    jv *p = cmalloc(c, (a->n + 1) * sizeof *p);
    if (!p) return;
    memcpy(p, a->pos, a->n * sizeof *p);
    p[a->n++] = mk_obj(V_KWARGS, a->kw);
    a->pos = p;
    a->kw = NULL;
}

static int call_fn(ctx *c, const jv *fn, args *a, scope *caller, jv *out);

/* ---- strings -------------------------------------------------------------------------- */

static int str_case(ctx *c, const jv *v, int kind, jv *out)
{
    char *p = cmalloc(c, v->s.n + 1);
    if (!p) return R_ERR;
    memcpy(p, v->s.p, v->s.n);
    p[v->s.n] = '\0';
    for (size_t i = 0; i < v->s.n; i++) {
        char ch = p[i];
        if (kind == F_UPPER && ch >= 'a' && ch <= 'z') p[i] = (char)(ch - 32);
        if (kind == F_LOWER && ch >= 'A' && ch <= 'Z') p[i] = (char)(ch + 32);
        /* titleCase: /\b\w/g upper-cased, the rest kept */
        if (kind == F_TITLE && ch >= 'a' && ch <= 'z' && (i == 0 || !is_word(v->s.p[i - 1])))
            p[i] = (char)(ch - 32);
    }
    if (kind == F_CAPITALIZE && v->s.n && p[0] >= 'a' && p[0] <= 'z') p[0] = (char)(p[0] - 32);
    *out = mk_str(p, v->s.n);
    return R_OK;
}

static int str_strip(const jv *v, bool lead, bool trail, jv *out)
{
    const char *p = v->s.p;
    size_t n = v->s.n;
    trim_span(&p, &n, lead, trail);
    *out = mk_str(p, n);
    return R_OK;
}

static bool has_prefix(const jv *s, const jv *p, bool suffix)
{
    if (p->s.n > s->s.n) return false;
    return !memcmp(s->s.p + (suffix ? s->s.n - p->s.n : 0), p->s.p, p->s.n);
}

static int str_affix(ctx *c, const jv *self, args *a, bool suffix, jv *out)
{
    const char *nm = suffix ? "endswith" : "startswith";
    if (a->n == 0) return fail(c, -EINVAL, "%s() requires at least one argument", nm);
    const jv *pat = &a->pos[0];
    if (pat->t == V_STR) {
        *out = mk_bool(has_prefix(self, pat, suffix));
        return R_OK;
    }
    if (is_arr(pat)) {
        for (size_t i = 0; i < pat->a->n; i++) {
            if (pat->a->v[i].t != V_STR)
                return fail(c, -EINVAL, "%s() tuple elements must be strings", nm);
            if (has_prefix(self, &pat->a->v[i], suffix)) {
                *out = mk_bool(true);
                return R_OK;
            }
        }
        *out = mk_bool(false);
        return R_OK;
    }
    return fail(c, -EINVAL, "%s() argument must be a string or tuple of strings", nm);
}

/* A growable list of values, then an array value. */
typedef struct vvec {
    jv *v;
    size_t n, cap;
} vvec;

static int vv_push(ctx *c, vvec *vv, jv x)
{
    if (vv->n == vv->cap) {
        size_t cap = vv->cap ? vv->cap * 2 : 8;
        jv *p = cmalloc(c, cap * sizeof *p);
        if (!p) return R_ERR;
        if (vv->n) memcpy(p, vv->v, vv->n * sizeof *p);
        vv->v = p;
        vv->cap = cap;
    }
    vv->v[vv->n++] = x;
    return R_OK;
}

static jv vv_array(ctx *c, vvec *vv)
{
    jarr *a = cmalloc(c, sizeof *a);
    jv r = {.t = V_UNDEF};
    if (!a) return r;
    a->n = vv->n;
    a->v = vv->v;
    r.t = V_ARRAY;
    r.a = a;
    return r;
}

static int str_split(ctx *c, const jv *self, args *a, jv *out)
{
    const jv *sep = a->n > 0 ? &a->pos[0] : &JNULL;
    if (sep->t != V_STR && sep->t != V_NULL)
        return fail(c, -EINVAL, "sep argument must be a string or null");
    double maxsplit = -1;
    if (a->n > 1) {
        if (a->pos[1].t != V_INT) return fail(c, -EINVAL, "maxsplit argument must be a number");
        maxsplit = a->pos[1].n;
    }
    vvec vv = {0};
    const char *p = self->s.p;
    size_t n = self->s.n;
    if (sep->t == V_NULL) {
        trim_span(&p, &n, true, false);
        size_t i = 0, l;
        while (i < n) {
            size_t st = i;
            while (i < n && !ws_len((const unsigned char *)p + i, n - i)) i = u8_next(p, i, n);
            if (maxsplit != -1 && (double)vv.n >= maxsplit) {
                if (vv_push(c, &vv, mk_str(p + st, n - st))) return R_ERR;
                break;
            }
            if (vv_push(c, &vv, mk_str(p + st, i - st))) return R_ERR;
            while (i < n && (l = ws_len((const unsigned char *)p + i, n - i))) i += l;
        }
    } else {
        if (sep->s.n == 0) return fail(c, -EINVAL, "empty separator");
        size_t st = 0;
        for (;;) {
            const char *hit = NULL;
            if (maxsplit == -1 || (double)vv.n < maxsplit)
                hit = st <= n ? memmem(p + st, n - st, sep->s.p, sep->s.n) : NULL;
            if (!hit) {
                if (vv_push(c, &vv, mk_str(p + st, n - st))) return R_ERR;
                break;
            }
            if (vv_push(c, &vv, mk_str(p + st, (size_t)(hit - (p + st))))) return R_ERR;
            st = (size_t)(hit - p) + sep->s.n;
        }
    }
    *out = vv_array(c, &vv);
    return c->err ? R_ERR : R_OK;
}

static int str_replace(ctx *c, const jv *self, args *a, jv *out)
{
    if (a->n < 2) return fail(c, -EINVAL, "replace() requires at least two arguments");
    const jv *o = &a->pos[0], *nw = &a->pos[1];
    if (o->t != V_STR || nw->t != V_STR)
        return fail(c, -EINVAL, "replace() arguments must be strings");
    const jv *cnt = &JNULL;
    if (a->n > 2) {
        cnt = &a->pos[2];
        if (cnt->t == V_KWARGS) {
            const jv *k = obj_find(cnt->o, "count", 5);
            cnt = k ? k : &JNULL;
        }
    }
    if (cnt->t != V_INT && cnt->t != V_NULL)
        return fail(c, -EINVAL, "replace() count argument must be a number or null");
    double left = cnt->t == V_INT ? (cnt->n < 0 ? INFINITY : cnt->n) : INFINITY;
    sbuf b = new_sbuf(c);
    const char *p = self->s.p;
    size_t n = self->s.n, i = 0;
    if (o->s.n == 0) { /* every position between code points, both ends included */
        for (;;) {
            if (left > 0) {
                sb_addn(&b, nw->s.p, nw->s.n);
                left--;
            }
            if (i >= n) break;
            size_t l = u8_len((unsigned char)p[i]);
            if (l > n - i) l = n - i;
            sb_addn(&b, p + i, l);
            i += l;
        }
    } else {
        while (i < n) {
            const char *hit = left > 0 ? memmem(p + i, n - i, o->s.p, o->s.n) : NULL;
            if (!hit) break;
            sb_addn(&b, p + i, (size_t)(hit - (p + i)));
            sb_addn(&b, nw->s.p, nw->s.n);
            i = (size_t)(hit - p) + o->s.n;
            left--;
        }
        sb_addn(&b, p + i, n - i);
    }
    return str_from_sbuf(c, &b, out);
}

/* ---- member access -------------------------------------------------------------------- */

static const struct {
    const char *name;
    int kind;
} str_methods[] =
    {
        {"upper", F_UPPER},   {"lower", F_LOWER},           {"strip", F_STRIP},
        {"title", F_TITLE},   {"capitalize", F_CAPITALIZE}, {"rstrip", F_RSTRIP},
        {"lstrip", F_LSTRIP}, {"startswith", F_STARTSWITH}, {"endswith", F_ENDSWITH},
        {"split", F_SPLIT},   {"replace", F_REPLACE},
},
  obj_methods[] = {
      {"get", F_GET},       {"items", F_ITEMS},       {"keys", F_KEYS},
      {"values", F_VALUES}, {"dictsort", F_DICTSORT},
};

/* s[i] for a code point index (negative counts from the end): undefined when outside. */
static jv str_index(const jv *s, double idx)
{
    size_t cnt = u8_count(s->s.p, s->s.n);
    if (idx < 0) idx += (double)cnt;
    if (idx < 0 || idx >= (double)cnt || idx != floor(idx)) return UNDEF;
    size_t k = 0, i = 0;
    while (k < (size_t)idx) i = u8_next(s->s.p, i, s->s.n), k++;
    return mk_str(s->s.p + i, u8_next(s->s.p, i, s->s.n) - i);
}

static int get_attr(ctx *c, const jv *obj, const jv *prop, jv *out)
{
    *out = UNDEF;
    if (is_obj(obj) || obj->t == V_NS) {
        if (prop->t != V_STR)
            return fail(c, -EINVAL, "cannot access a property with a %s", vtype_names[prop->t]);
        const jv *v = obj_find(obj->o, prop->s.p, prop->s.n);
        if (v) {
            *out = *v;
            return R_OK;
        }
        if (obj->t == V_NS) return R_OK;
        for (size_t i = 0; i < sizeof obj_methods / sizeof *obj_methods; i++)
            if (strlen(obj_methods[i].name) == prop->s.n &&
                !memcmp(obj_methods[i].name, prop->s.p, prop->s.n))
                *out = mk_fn(c, obj_methods[i].kind, *obj);
        return c->err ? R_ERR : R_OK;
    }
    if (is_arr(obj) || obj->t == V_STR) {
        if (prop->t == V_INT) {
            if (obj->t == V_STR) {
                *out = str_index(obj, prop->n);
            } else {
                double i = prop->n < 0 ? prop->n + (double)obj->a->n : prop->n;
                if (i >= 0 && i < (double)obj->a->n) *out = obj->a->v[(size_t)i];
            }
            return R_OK;
        }
        if (prop->t != V_STR)
            return fail(c, -EINVAL, "cannot access a property with a %s", vtype_names[prop->t]);
        if (prop->s.n == 6 && !memcmp(prop->s.p, "length", 6)) {
            *out = mk_num(V_INT,
                          (double)(obj->t == V_STR ? u16_count(obj->s.p, obj->s.n) : obj->a->n));
            return R_OK;
        }
        if (obj->t == V_STR)
            for (size_t i = 0; i < sizeof str_methods / sizeof *str_methods; i++)
                if (strlen(str_methods[i].name) == prop->s.n &&
                    !memcmp(str_methods[i].name, prop->s.p, prop->s.n))
                    *out = mk_fn(c, str_methods[i].kind, *obj);
        return c->err ? R_ERR : R_OK;
    }
    if (prop->t != V_STR)
        return fail(c, -EINVAL, "cannot access a property with a %s", vtype_names[prop->t]);
    return R_OK;
}

/* The oracle's slice(): Python's rules for start, stop and step. */
static int slice_bounds(double len, const jv *st, const jv *sp, const jv *sc, double *start,
                        double *stop, double *stp)
{
    double step = sc->t == V_INT ? sc->n : 1;
    if (step == 0) return -1;
    double a, b;
    if (step > 0) {
        a = st->t == V_INT ? st->n : 0;
        a = a < 0 ? fmax(len + a, 0) : fmin(a, len);
        b = sp->t == V_INT ? sp->n : len;
        b = b < 0 ? fmax(len + b, 0) : fmin(b, len);
    } else {
        a = st->t == V_INT ? st->n : len - 1;
        a = a < 0 ? fmax(len + a, -1) : fmin(a, len - 1);
        b = sp->t == V_INT ? sp->n : -1;
        b = b < -1 ? fmax(len + b, -1) : fmin(b, len - 1);
    }
    *start = a;
    *stop = b;
    *stp = step;
    return 0;
}

static int eval_slice(ctx *c, const jv *obj, const node *sl, scope *s, jv *out)
{
    if (!is_arr(obj) && obj->t != V_STR)
        return fail(c, -EINVAL, "only a list or a string can be sliced");
    jv st = UNDEF, sp = UNDEF, sc = UNDEF;
    if ((sl->a && eval(c, sl->a, s, &st)) || (sl->b && eval(c, sl->b, s, &sp)) ||
        (sl->c && eval(c, sl->c, s, &sc)))
        return R_ERR;
    if ((st.t != V_INT && st.t != V_UNDEF) || (sp.t != V_INT && sp.t != V_UNDEF) ||
        (sc.t != V_INT && sc.t != V_UNDEF))
        return fail(c, -EINVAL, "slice bounds must be integers");
    size_t len = obj->t == V_STR ? u8_count(obj->s.p, obj->s.n) : obj->a->n;
    double a, b, stp;
    if (slice_bounds((double)len, &st, &sp, &sc, &a, &b, &stp))
        return fail(c, -EINVAL, "slice step cannot be zero");
    if (obj->t == V_STR) {
        /* code point offsets */
        size_t *off = malloc((len + 1) * sizeof *off);
        if (!off) return fail(c, -ENOMEM, "out of memory");
        for (size_t i = 0, k = 0; k <= len; k++) {
            off[k] = i;
            if (k < len) i = u8_next(obj->s.p, i, obj->s.n);
        }
        sbuf t = new_sbuf(c);
        double sgn = stp > 0 ? 1 : -1;
        for (double i = a; sgn * i < sgn * b; i += stp) {
            if (++c->steps > c->lim.max_steps) break;
            size_t k = (size_t)i;
            sb_addn(&t, obj->s.p + off[k], off[k + 1] - off[k]);
        }
        free(off);
        if (c->steps > c->lim.max_steps) {
            free(t.p);
            return step(c, sl);
        }
        return str_from_sbuf(c, &t, out);
    }
    vvec vv = {0};
    double sgn = stp > 0 ? 1 : -1;
    for (double i = a; sgn * i < sgn * b; i += stp)
        if (vv_push(c, &vv, obj->a->v[(size_t)i])) return R_ERR;
    *out = vv_array(c, &vv);
    return c->err ? R_ERR : R_OK;
}

/* ---- filters and tests ------------------------------------------------------------------ */

/* compareRuntimeValues */
static int compare(ctx *c, const jv *a, const jv *b, bool case_sensitive, int *res)
{
    if (a->t == V_NULL && b->t == V_NULL) return *res = 0, R_OK;
    if (a->t == V_NULL || b->t == V_NULL || ((a->t == V_UNDEF) != (b->t == V_UNDEF)))
        return fail(c, -EINVAL, "cannot compare %s with %s", vtype_names[a->t], vtype_names[b->t]);
    if (a->t == V_UNDEF) return *res = 0, R_OK;
    bool an = is_num(a) || a->t == V_BOOL, bn = is_num(b) || b->t == V_BOOL;
    if (an && bn) {
        double x = to_number(a), y = to_number(b);
        *res = x < y ? -1 : x > y ? 1 : 0;
        return R_OK;
    }
    if (a->t != b->t)
        return fail(c, -EINVAL, "cannot compare different types: %s and %s", vtype_names[a->t],
                    vtype_names[b->t]);
    if (a->t != V_STR) return fail(c, -EINVAL, "cannot compare type: %s", vtype_names[a->t]);
    size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
    for (size_t i = 0; i < n; i++) {
        int x = (unsigned char)a->s.p[i], y = (unsigned char)b->s.p[i];
        if (!case_sensitive) {
            if (x >= 'A' && x <= 'Z') x += 32;
            if (y >= 'A' && y <= 'Z') y += 32;
        }
        if (x != y) return *res = x < y ? -1 : 1, R_OK;
    }
    *res = a->s.n < b->s.n ? -1 : a->s.n > b->s.n ? 1 : 0;
    return R_OK;
}

/* getAttributeValue: a dotted path into objects and lists. */
static jv attr_path(const jv *item, const char *path, size_t pn)
{
    jv v = *item;
    size_t i = 0;
    while (i <= pn) {
        size_t j = i;
        while (j < pn && path[j] != '.') j++;
        if (is_obj(&v) || v.t == V_NS) {
            const jv *x = obj_find(v.o, path + i, j - i);
            v = x ? *x : UNDEF;
        } else if (is_arr(&v)) {
            char num[32];
            snprintf(num, sizeof num, "%.*s", (int)(j - i < 31 ? j - i : 31), path + i);
            double idx = js_parse_int(num, strlen(num));
            if (isnan(idx) || idx < 0 || idx >= (double)v.a->n) return UNDEF;
            v = v.a->v[(size_t)idx];
        } else {
            return UNDEF;
        }
        i = j + 1;
    }
    return v;
}

typedef struct sort_key {
    jv item, key;
} sort_key;

/* A stable merge sort that stops at the first comparison that fails. */
static int merge_sort(ctx *c, sort_key *v, sort_key *tmp, size_t n, bool cs, bool reverse)
{
    if (n < 2) return R_OK;
    size_t h = n / 2;
    if (merge_sort(c, v, tmp, h, cs, reverse) || merge_sort(c, v + h, tmp, n - h, cs, reverse))
        return R_ERR;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = 0;
        if (compare(c, &v[j].key, &v[i].key, cs, &r)) return R_ERR;
        if (reverse) r = -r;
        tmp[k++] = r < 0 ? v[j++] : v[i++];
    }
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
    return R_OK;
}

static int sort_values(ctx *c, const jv *arr, const jv *attr, bool cs, bool reverse, jv *out)
{
    size_t n = arr->a->n;
    sort_key *v = malloc((n + 1) * sizeof *v), *tmp = malloc((n + 1) * sizeof *tmp);
    if (!v || !tmp) {
        free(v);
        free(tmp);
        return fail(c, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        v[i].item = arr->a->v[i];
        v[i].key = v[i].item;
        if (attr && attr->t == V_STR) v[i].key = attr_path(&v[i].item, attr->s.p, attr->s.n);
        if (attr && attr->t == V_INT) {
            char num[32];
            snprintf(num, sizeof num, "%.0f", attr->n);
            v[i].key = attr_path(&v[i].item, num, strlen(num));
        }
    }
    int rc = merge_sort(c, v, tmp, n, cs, reverse);
    if (rc == R_OK) {
        jv r = mk_arr(c, V_ARRAY, n);
        if (!c->err) {
            for (size_t i = 0; i < n; i++) r.a->v[i] = v[i].item;
            *out = r;
        }
        rc = c->err ? R_ERR : R_OK;
    }
    free(v);
    free(tmp);
    return rc;
}

static int obj_items(ctx *c, const jv *o, int which, jv *out)
{
    jv r = mk_arr(c, V_ARRAY, o->o->n);
    if (c->err) return R_ERR;
    for (size_t i = 0; i < o->o->n; i++) {
        jv k = mk_str(o->o->kp[i], o->o->kn[i]);
        if (which == F_KEYS)
            r.a->v[i] = k;
        else if (which == F_VALUES)
            r.a->v[i] = o->o->v[i];
        else {
            jv pair = mk_arr(c, V_ARRAY, 2);
            if (c->err) return R_ERR;
            pair.a->v[0] = k;
            pair.a->v[1] = o->o->v[i];
            r.a->v[i] = pair;
        }
    }
    *out = r;
    return R_OK;
}

static bool name_is(const node *n, const char *s)
{
    return n->n == strlen(s) && !memcmp(n->s, s, n->n);
}

static int run_test(ctx *c, const char *name, size_t nl, const jv *v, const jv *arg, bool *res)
{
#define T(s) (nl == sizeof(s) - 1 && !memcmp(name, s, nl))
    if (T("boolean"))
        *res = v->t == V_BOOL;
    else if (T("callable"))
        *res = v->t == V_FUNC;
    else if (T("odd") || T("even")) {
        if (v->t != V_INT)
            return fail(c, -EINVAL, "cannot %.*s on %s", (int)nl, name, vtype_names[v->t]);
        bool odd = fmod(v->n, 2) != 0;
        *res = T("odd") ? odd : !odd;
    } else if (T("false"))
        *res = v->t == V_BOOL && !v->b;
    else if (T("true"))
        *res = v->t == V_BOOL && v->b;
    else if (T("none"))
        *res = v->t == V_NULL;
    else if (T("string"))
        *res = v->t == V_STR;
    else if (T("number"))
        *res = is_num(v);
    else if (T("integer"))
        *res = v->t == V_INT;
    else if (T("iterable"))
        *res = v->t == V_ARRAY || v->t == V_STR;
    else if (T("mapping"))
        *res = is_obj(v);
    else if (T("sequence"))
        *res = is_arr(v) || is_obj(v) || v->t == V_STR;
    else if (T("lower") || T("upper")) {
        *res = false;
        if (v->t == V_STR) {
            *res = true;
            for (size_t i = 0; i < v->s.n; i++) {
                char ch = v->s.p[i];
                if (T("lower") ? (ch >= 'A' && ch <= 'Z') : (ch >= 'a' && ch <= 'z')) *res = false;
            }
        }
    } else if (T("defined"))
        *res = v->t != V_UNDEF;
    else if (T("undefined"))
        *res = v->t == V_UNDEF;
    else if (T("equalto") || T("eq")) {
        if (!arg) return fail(c, -EINVAL, "test '%.*s' needs a value", (int)nl, name);
        *res = strict_eq(v, arg);
    } else
        return fail(c, -EINVAL, "unknown test '%.*s'", (int)nl, name);
    return R_OK;
#undef T
}

static int apply_filter(ctx *c, const jv *in, const node *f, scope *s, jv *out);

static int filter_plain(ctx *c, const jv *v, const node *f, jv *out)
{
#define F(s) name_is(f, s)
    if (F("safe")) return *out = *v, R_OK;
    if (F("tojson")) {
        sbuf b = new_sbuf(c);
        if (to_json(c, &b, v, &JSON_DEFAULT, 0, true)) return free(b.p), R_ERR;
        return str_from_sbuf(c, &b, out);
    }
    if (is_arr(v)) {
        size_t n = v->a->n;
        if (F("list")) return *out = *v, R_OK;
        if (F("first")) return *out = n ? v->a->v[0] : UNDEF, R_OK;
        if (F("last")) return *out = n ? v->a->v[n - 1] : UNDEF, R_OK;
        if (F("length")) return *out = mk_num(V_INT, (double)n), R_OK;
        if (F("reverse")) {
            jv r = mk_arr(c, V_ARRAY, n);
            if (c->err) return R_ERR;
            for (size_t i = 0; i < n; i++) r.a->v[i] = v->a->v[n - 1 - i];
            return *out = r, R_OK;
        }
        if (F("sort")) return sort_values(c, v, NULL, false, false, out);
        if (F("join")) {
            sbuf b = new_sbuf(c);
            for (size_t i = 0; i < n; i++)
                if (v->a->v[i].t != V_NULL && v->a->v[i].t != V_UNDEF &&
                    raw_string(c, &b, &v->a->v[i]))
                    return free(b.p), R_ERR;
            return str_from_sbuf(c, &b, out);
        }
        if (F("string")) {
            sbuf b = new_sbuf(c);
            if (to_json(c, &b, v, &JSON_DEFAULT, 0, false)) return free(b.p), R_ERR;
            return str_from_sbuf(c, &b, out);
        }
        if (F("unique")) {
            vvec vv = {0};
            for (size_t i = 0; i < n; i++) {
                bool seen = false;
                for (size_t j = 0; j < vv.n && !seen; j++) seen = strict_eq(&vv.v[j], &v->a->v[i]);
                if (!seen && vv_push(c, &vv, v->a->v[i])) return R_ERR;
            }
            *out = vv_array(c, &vv);
            return c->err ? R_ERR : R_OK;
        }
        return fail(c, -EINVAL, "unknown list filter '%.*s'", (int)f->n, f->s);
    }
    if (v->t == V_STR) {
        if (F("length")) return *out = mk_num(V_INT, (double)u16_count(v->s.p, v->s.n)), R_OK;
        if (F("upper")) return str_case(c, v, F_UPPER, out);
        if (F("lower")) return str_case(c, v, F_LOWER, out);
        if (F("title")) return str_case(c, v, F_TITLE, out);
        if (F("capitalize")) return str_case(c, v, F_CAPITALIZE, out);
        if (F("trim")) return str_strip(v, true, true, out);
        if (F("indent")) {
            sbuf b = new_sbuf(c);
            for (size_t i = 0, line = 0; i <= v->s.n; line++) {
                const char *nl = memchr(v->s.p + i, '\n', v->s.n - i);
                size_t e = nl ? (size_t)(nl - v->s.p) : v->s.n;
                if (line) sb_addc(&b, '\n');
                if (line && e > i) sb_add(&b, "    ");
                sb_addn(&b, v->s.p + i, e - i);
                i = e + 1;
                if (!nl) break;
            }
            return str_from_sbuf(c, &b, out);
        }
        if (F("join") || F("string")) return *out = *v, R_OK;
        if (F("int")) {
            double x = js_parse_int(v->s.p, v->s.n);
            return *out = mk_num(V_INT, isnan(x) ? 0 : x), R_OK;
        }
        if (F("float")) {
            double x = js_parse_float(v->s.p, v->s.n, false);
            return *out = mk_num(V_FLOAT, isnan(x) ? 0 : x), R_OK;
        }
        return fail(c, -EINVAL, "unknown string filter '%.*s'", (int)f->n, f->s);
    }
    if (is_num(v)) {
        if (F("abs")) return *out = mk_num(v->t, fabs(v->n)), R_OK;
        if (F("int")) return *out = mk_num(V_INT, floor(v->n)), R_OK;
        if (F("float")) return *out = mk_num(V_FLOAT, v->n), R_OK;
        if (F("string")) {
            sbuf b = new_sbuf(c);
            print_value(c, &b, v);
            return str_from_sbuf(c, &b, out);
        }
        return fail(c, -EINVAL, "unknown number filter '%.*s'", (int)f->n, f->s);
    }
    if (is_obj(v)) {
        if (F("items")) return obj_items(c, v, F_ITEMS, out);
        if (F("length")) return *out = mk_num(V_INT, (double)v->o->n), R_OK;
        for (size_t i = 0; i < sizeof obj_methods / sizeof *obj_methods; i++)
            if (F(obj_methods[i].name)) {
                jv fn = mk_fn(c, obj_methods[i].kind, *v);
                args a = {0};
                return c->err ? R_ERR : call_fn(c, &fn, &a, NULL, out);
            }
        return fail(c, -EINVAL, "unknown mapping filter '%.*s'", (int)f->n, f->s);
    }
    if (v->t == V_BOOL) {
        if (F("bool")) return *out = *v, R_OK;
        if (F("int")) return *out = mk_num(V_INT, v->b), R_OK;
        if (F("float")) return *out = mk_num(V_FLOAT, v->b), R_OK;
        if (F("string")) return *out = mk_str(v->b ? "true" : "false", v->b ? 4 : 5), R_OK;
        return fail(c, -EINVAL, "unknown boolean filter '%.*s'", (int)f->n, f->s);
    }
    return fail(c, -EINVAL, "cannot apply filter '%.*s' to a %s", (int)f->n, f->s,
                vtype_names[v->t]);
#undef F
}

static int filter_call(ctx *c, const jv *v, const node *call, scope *s, jv *out)
{
    const node *f = call->a;
    if (f->kind != N_IDENT) return fail(c, -EINVAL, "a filter must be a name");
#define F(x) name_is(f, x)
    args a;
    if (F("tojson")) {
        if (eval_args(c, &call->l1, s, &a)) return R_ERR;
        const jv *ind = arg_get(&a, 99, "indent"), *ea = arg_get(&a, 99, "ensure_ascii"),
                 *sk = arg_get(&a, 99, "sort_keys"), *sep = arg_get(&a, 99, "separators");
        json_opts o = JSON_DEFAULT;
        if (ind && ind->t != V_INT && ind->t != V_NULL)
            return fail(c, -EINVAL, "if set, indent must be a number");
        if (ea && ea->t != V_BOOL)
            return fail(c, -EINVAL, "if set, ensure_ascii must be a boolean");
        if (sk && sk->t != V_BOOL) return fail(c, -EINVAL, "if set, sort_keys must be a boolean");
        if (ind && ind->t == V_INT && ind->n > 0) {
            if (ind->n > 64) return fail(c, -EINVAL, "indent %g is too wide", ind->n);
            o.indent = (int)ind->n;
            o.item_sep = ",";
            o.item_n = 1;
        }
        o.ensure_ascii = ea && ea->b;
        o.sort_keys = sk && sk->b;
        if (sep && sep->t != V_NULL) {
            if (!is_arr(sep) || sep->a->n != 2 || sep->a->v[0].t != V_STR ||
                sep->a->v[1].t != V_STR)
                return fail(c, -EINVAL, "separators must be a tuple of two strings");
            o.item_sep = sep->a->v[0].s.p;
            o.item_n = sep->a->v[0].s.n;
            o.key_sep = sep->a->v[1].s.p;
            o.key_n = sep->a->v[1].s.n;
        }
        sbuf b = new_sbuf(c);
        if (to_json(c, &b, v, &o, 0, true)) return free(b.p), R_ERR;
        return str_from_sbuf(c, &b, out);
    }
    if (F("join")) {
        if (v->t != V_STR && !is_arr(v))
            return fail(c, -EINVAL, "cannot apply filter 'join' to a %s", vtype_names[v->t]);
        if (eval_args(c, &call->l1, s, &a)) return R_ERR;
        const jv *sep = arg_get(&a, 0, "separator");
        if (sep && sep->t != V_STR) return fail(c, -EINVAL, "separator must be a string");
        sbuf b = new_sbuf(c);
        if (v->t == V_STR) {
            for (size_t i = 0; i < v->s.n;) {
                size_t l = u8_len((unsigned char)v->s.p[i]);
                if (l > v->s.n - i) l = v->s.n - i;
                if (i && sep) sb_addn(&b, sep->s.p, sep->s.n);
                sb_addn(&b, v->s.p + i, l);
                i += l;
            }
        } else {
            for (size_t i = 0; i < v->a->n; i++) {
                if (i && sep) sb_addn(&b, sep->s.p, sep->s.n);
                const jv *e = &v->a->v[i];
                if (e->t != V_NULL && e->t != V_UNDEF && raw_string(c, &b, e))
                    return free(b.p), R_ERR;
            }
        }
        return str_from_sbuf(c, &b, out);
    }
    if (F("int") || F("float")) {
        bool isint = F("int");
        if (eval_args(c, &call->l1, s, &a)) return R_ERR;
        const jv *def = arg_get(&a, 0, "default");
        jv d = def ? *def : mk_num(isint ? V_INT : V_FLOAT, 0);
        if (v->t == V_STR) {
            double x = isint ? js_parse_int(v->s.p, v->s.n) : js_parse_float(v->s.p, v->s.n, false);
            *out = isnan(x) ? d : mk_num(isint ? V_INT : V_FLOAT, x);
            return R_OK;
        }
        if (is_num(v)) return *out = *v, R_OK;
        if (v->t == V_BOOL) return *out = mk_num(isint ? V_INT : V_FLOAT, v->b), R_OK;
        return fail(c, -EINVAL, "cannot apply filter '%s' to a %s", isint ? "int" : "float",
                    vtype_names[v->t]);
    }
    if (F("default")) {
        if (eval_args(c, &call->l1, s, &a)) return R_ERR;
        jv d = a.n > 0 ? a.pos[0] : mk_str("", 0);
        const jv *bl = arg_get(&a, 1, "boolean");
        if (bl && bl->t != V_BOOL)
            return fail(c, -EINVAL, "the default filter's flag must be a boolean");
        *out = v->t == V_UNDEF || (bl && bl->b && !truthy(v)) ? d : *v;
        return R_OK;
    }
    if (is_arr(v)) {
        if (F("sort")) {
            if (eval_args(c, &call->l1, s, &a)) return R_ERR;
            const jv *rev = arg_get(&a, 0, "reverse"), *cs = arg_get(&a, 1, "case_sensitive"),
                     *at = arg_get(&a, 2, "attribute");
            if (rev && rev->t != V_BOOL) return fail(c, -EINVAL, "reverse must be a boolean");
            if (cs && cs->t != V_BOOL) return fail(c, -EINVAL, "case_sensitive must be a boolean");
            if (at && at->t != V_STR && at->t != V_INT && at->t != V_NULL)
                return fail(c, -EINVAL, "attribute must be a string, integer, or null");
            return sort_values(c, v, at && at->t != V_NULL ? at : NULL, cs && cs->b, rev && rev->b,
                               out);
        }
        if (F("selectattr") || F("rejectattr")) {
            bool sel = F("selectattr");
            for (size_t i = 0; i < v->a->n; i++)
                if (!is_obj(&v->a->v[i]) && v->a->v[i].t != V_NS)
                    return fail(c, -EINVAL, "%s applies to a list of objects only",
                                sel ? "selectattr" : "rejectattr");
            for (int i = 0; i < call->l1.n; i++)
                if (call->l1.v[i]->kind != N_STR)
                    return fail(c, -EINVAL, "the arguments of %s must be strings",
                                sel ? "selectattr" : "rejectattr");
            if (call->l1.n < 1)
                return fail(c, -EINVAL, "%s needs an attribute", sel ? "selectattr" : "rejectattr");
            const node *attr = call->l1.v[0], *test = call->l1.n > 1 ? call->l1.v[1] : NULL;
            jv tv = UNDEF;
            if (call->l1.n > 2 && eval(c, call->l1.v[2], s, &tv)) return R_ERR;
            vvec vv = {0};
            for (size_t i = 0; i < v->a->n; i++) {
                const jv *x = obj_find(v->a->v[i].o, attr->s, attr->n);
                bool r = false;
                if (x) {
                    if (test) {
                        if (run_test(c, test->s, test->n, x, call->l1.n > 2 ? &tv : NULL, &r))
                            return R_ERR;
                    } else
                        r = truthy(x);
                }
                if (r == sel && vv_push(c, &vv, v->a->v[i])) return R_ERR;
            }
            *out = vv_array(c, &vv);
            return c->err ? R_ERR : R_OK;
        }
        if (F("map")) {
            if (eval_args(c, &call->l1, s, &a)) return R_ERR;
            const jv *attr = a.kw ? obj_find(a.kw, "attribute", 9) : NULL;
            if (!attr) return fail(c, -EINVAL, "map without attribute= is not supported");
            if (attr->t != V_STR) return fail(c, -EINVAL, "attribute must be a string");
            const jv *def = obj_find(a.kw, "default", 7);
            jv r = mk_arr(c, V_ARRAY, v->a->n);
            if (c->err) return R_ERR;
            for (size_t i = 0; i < v->a->n; i++) {
                if (!is_obj(&v->a->v[i]) && v->a->v[i].t != V_NS)
                    return fail(c, -EINVAL, "items in map must be objects");
                jv x = attr_path(&v->a->v[i], attr->s.p, attr->s.n);
                r.a->v[i] = x.t == V_UNDEF && def ? *def : x;
            }
            *out = r;
            return R_OK;
        }
        return fail(c, -EINVAL, "unknown list filter '%.*s'", (int)f->n, f->s);
    }
    if (v->t == V_STR) {
        if (F("indent")) {
            if (eval_args(c, &call->l1, s, &a)) return R_ERR;
            const jv *w = arg_get(&a, 0, "width"), *first = arg_get(&a, 1, "first"),
                     *blank = arg_get(&a, 2, "blank");
            if (w && w->t != V_INT) return fail(c, -EINVAL, "width must be a number");
            double width = w ? w->n : 4;
            if (width > 1024) return fail(c, -EINVAL, "indent width %g is too wide", width);
            bool fst = first && truthy(first), blk = blank && truthy(blank);
            sbuf b = new_sbuf(c);
            for (size_t i = 0, line = 0;; line++) {
                const char *nl = memchr(v->s.p + i, '\n', v->s.n - i);
                size_t e = nl ? (size_t)(nl - v->s.p) : v->s.n;
                if (line) sb_addc(&b, '\n');
                if (!((!fst && line == 0) || (!blk && e == i)))
                    for (int k = 0; k < (int)width; k++) sb_addc(&b, ' ');
                sb_addn(&b, v->s.p + i, e - i);
                if (!nl) break;
                i = e + 1;
            }
            return str_from_sbuf(c, &b, out);
        }
        if (F("replace")) {
            if (eval_args(c, &call->l1, s, &a)) return R_ERR;
            jobj *kw = a.kw;
            if (!kw && !(kw = obj_new(c, 1))) return R_ERR;
            a.kw = kw;
            args_fold_kw(c, &a);
            return c->err ? R_ERR : str_replace(c, v, &a, out);
        }
        return fail(c, -EINVAL, "unknown string filter '%.*s'", (int)f->n, f->s);
    }
    if (is_obj(v)) {
        for (size_t i = 0; i < sizeof obj_methods / sizeof *obj_methods; i++)
            if (F(obj_methods[i].name)) {
                if (eval_args(c, &call->l1, s, &a)) return R_ERR;
                args_fold_kw(c, &a);
                jv fn = mk_fn(c, obj_methods[i].kind, *v);
                return c->err ? R_ERR : call_fn(c, &fn, &a, NULL, out);
            }
        return fail(c, -EINVAL, "unknown mapping filter '%.*s'", (int)f->n, f->s);
    }
    return fail(c, -EINVAL, "cannot apply filter '%.*s' to a %s", (int)f->n, f->s,
                vtype_names[v->t]);
#undef F
}

static int apply_filter(ctx *c, const jv *in, const node *f, scope *s, jv *out)
{
    if (f->kind == N_IDENT) return filter_plain(c, in, f, out);
    return filter_call(c, in, f, s, out);
}

/* ---- functions and macros ----------------------------------------------------------------- */

/* Whether a macro body reads `kwargs` / `varargs` (then they are bound). */
static void find_special(const node *n, bool *kw, bool *va)
{
    if (!n) return;
    if (n->kind == N_IDENT) {
        if (name_is(n, "kwargs")) *kw = true;
        if (name_is(n, "varargs")) *va = true;
        return;
    }
    if (n->kind == N_MEMBER && !n->flag) {
        find_special(n->a, kw, va);
        return;
    }
    find_special(n->a, kw, va);
    find_special(n->b, kw, va);
    find_special(n->c, kw, va);
    for (int i = 0; i < n->l1.n; i++) find_special(n->l1.v[i], kw, va);
    for (int i = 0; i < n->l2.n; i++) find_special(n->l2.v[i], kw, va);
}

static int bind_params(ctx *c, const char *who, const nlist *params, bool kwargs, bool varargs,
                       args *a, scope *sc)
{
    jobj *kw = obj_new(c, 4);
    if (!kw) return R_ERR;
    size_t npos = a->n;
    if (npos && a->pos[npos - 1].t == V_KWARGS) {
        npos--;
        jobj *src = a->pos[npos].o;
        for (size_t i = 0; i < src->n; i++)
            if (obj_set(c, kw, src->kp[i], src->kn[i], src->v[i])) return R_ERR;
    }
    if (a->kw)
        for (size_t i = 0; i < a->kw->n; i++)
            if (obj_set(c, kw, a->kw->kp[i], a->kw->kn[i], a->kw->v[i])) return R_ERR;
    const node *pending[64];
    const node *pending_def[64];
    int np = 0;
    for (int i = 0; i < params->n; i++) {
        const node *p = params->v[i];
        const char *name = p->s;
        size_t nl = p->n;
        jv v = UNDEF;
        bool have = false;
        if ((size_t)i < npos) {
            v = a->pos[i];
            have = true;
        } else {
            jv *k = obj_find(kw, name, nl);
            if (k) {
                v = *k;
                have = true;
                /* remove it */
                size_t at = (size_t)(k - kw->v);
                memmove(&kw->kp[at], &kw->kp[at + 1], (kw->n - at - 1) * sizeof *kw->kp);
                memmove(&kw->kn[at], &kw->kn[at + 1], (kw->n - at - 1) * sizeof *kw->kn);
                memmove(&kw->v[at], &kw->v[at + 1], (kw->n - at - 1) * sizeof *kw->v);
                kw->n--;
            }
        }
        if (!have && p->kind == N_KWARG) {
            if (np == 64) return fail(c, -EINVAL, "%s: too many parameters with defaults", who);
            pending[np] = p;
            pending_def[np++] = p->b;
        }
        if (scope_set(c, sc, name, nl, v)) return R_ERR;
    }
    if (kwargs) {
        if (scope_set(c, sc, "kwargs", 6, mk_obj(V_OBJECT, kw))) return R_ERR;
    } else if (kw->n)
        return fail(c, -EINVAL, "macro %s takes no keyword argument '%.*s'", who, (int)kw->kn[0],
                    kw->kp[0]);
    if (varargs) {
        size_t extra = npos > (size_t)params->n ? npos - (size_t)params->n : 0;
        jv va = mk_arr(c, V_ARRAY, extra);
        if (c->err) return R_ERR;
        for (size_t i = 0; i < extra; i++) va.a->v[i] = a->pos[(size_t)params->n + i];
        if (scope_set(c, sc, "varargs", 7, va)) return R_ERR;
    } else if (npos > (size_t)params->n)
        return fail(c, -EINVAL, "macro %s takes not more than %d argument(s)", who, params->n);
    for (int i = 0; i < np; i++) {
        jv v;
        if (eval(c, pending_def[i], sc, &v)) return R_ERR;
        if (scope_set(c, sc, pending[i]->s, pending[i]->n, v)) return R_ERR;
    }
    return R_OK;
}

/* Renders body into a fresh string (a macro's result, a block set, a filter block). */
static int capture(ctx *c, const nlist *body, scope *s, jv *out)
{
    sbuf buf = new_sbuf(c), *saved = c->out;
    c->out = &buf;
    int rc = exec_block(c, body, s);
    c->out = saved;
    if (rc == R_BREAK || rc == R_CONTINUE)
        rc = fail(c, -EINVAL, "break or continue outside a loop");
    if (rc) {
        free(buf.p);
        return R_ERR;
    }
    return str_from_sbuf(c, &buf, out);
}

static int call_fn(ctx *c, const jv *fnv, args *a, scope *caller, jv *out)
{
    const jfn *f = fnv->f;
    const jv *self = &f->self;
    *out = UNDEF;
    switch (f->kind) {
    case F_NAMESPACE: {
        jobj *o = obj_new(c, 8);
        if (!o) return R_ERR;
        size_t npos = a->n;
        if (npos && a->pos[npos - 1].t == V_KWARGS) npos--;
        if (npos > 1)
            return fail(c, -EINVAL, "namespace expected at most 1 argument, got %zu", npos);
        if (npos == 1) {
            const jv *src = &a->pos[0];
            if (is_obj(src)) {
                for (size_t i = 0; i < src->o->n; i++)
                    if (obj_set(c, o, src->o->kp[i], src->o->kn[i], src->o->v[i])) return R_ERR;
            } else if (is_arr(src)) {
                for (size_t i = 0; i < src->a->n; i++) {
                    const jv *pr = &src->a->v[i];
                    if (!is_arr(pr) || pr->a->n != 2 || pr->a->v[0].t != V_STR)
                        return fail(c, -EINVAL,
                                    "namespace expected an object or [key, value] pairs");
                    if (obj_set(c, o, pr->a->v[0].s.p, pr->a->v[0].s.n, pr->a->v[1])) return R_ERR;
                }
            } else
                return fail(c, -EINVAL, "a %s is not iterable", vtype_names[src->t]);
        }
        const jobj *kw = a->kw ? a->kw : (npos < a->n ? a->pos[npos].o : NULL);
        for (size_t i = 0; kw && i < kw->n; i++)
            if (obj_set(c, o, kw->kp[i], kw->kn[i], kw->v[i])) return R_ERR;
        *out = mk_obj(V_NS, o);
        return R_OK;
    }
    case F_RAISE: {
        sbuf b = new_sbuf(c);
        if (a->n) raw_string(c, &b, &a->pos[0]);
        c->err = errdetail_set(&jinja_err, -EINVAL, "raise_exception: %s",
                               b.p && !b.err ? b.p : (a->n ? "?" : "undefined"));
        free(b.p);
        return R_ERR;
    }
    case F_RANGE: {
        double st = 0, stop, sp = 1;
        if (a->n < 1 || !is_num(&a->pos[0])) return fail(c, -EINVAL, "range() needs numbers");
        for (size_t i = 0; i < a->n && i < 3; i++)
            if (!is_num(&a->pos[i])) return fail(c, -EINVAL, "range() needs numbers");
        if (a->n == 1)
            stop = a->pos[0].n;
        else {
            st = a->pos[0].n;
            stop = a->pos[1].n;
            if (a->n > 2) sp = a->pos[2].n;
        }
        if (sp == 0) return fail(c, -EINVAL, "range() step must not be zero");
        double cnt = sp > 0 ? ceil((stop - st) / sp) : ceil((st - stop) / -sp);
        if (cnt < 0) cnt = 0;
        if (cnt > (double)(c->lim.max_steps - c->steps))
            return fail(c, -E2BIG, "range() of %g numbers runs past the step limit", cnt);
        c->steps += (uint64_t)cnt;
        jv r = mk_arr(c, V_ARRAY, (size_t)cnt);
        if (c->err) return R_ERR;
        for (size_t i = 0; i < (size_t)cnt; i++) {
            double x = st + (double)i * sp;
            r.a->v[i] = mk_num(x == floor(x) ? V_INT : V_FLOAT, x);
        }
        *out = r;
        return R_OK;
    }
    case F_STRFTIME: {
        if (a->n < 1 || a->pos[0].t != V_STR)
            return fail(c, -EINVAL, "strftime_now() needs a format");
        static const char *const mon[] = {"January",   "February", "March",    "April",
                                          "May",       "June",     "July",     "August",
                                          "September", "October",  "November", "December"};
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        sbuf b = new_sbuf(c);
        const char *p = a->pos[0].s.p;
        size_t n = a->pos[0].s.n;
        char t[32];
        for (size_t i = 0; i < n; i++) {
            if (p[i] == '%' && i + 1 < n && strchr("YmdbBHM%", p[i + 1])) {
                char k = p[++i];
                if (k == 'Y') snprintf(t, sizeof t, "%d", tm.tm_year + 1900);
                if (k == 'm') snprintf(t, sizeof t, "%02d", tm.tm_mon + 1);
                if (k == 'd') snprintf(t, sizeof t, "%02d", tm.tm_mday);
                if (k == 'H') snprintf(t, sizeof t, "%02d", tm.tm_hour);
                if (k == 'M') snprintf(t, sizeof t, "%02d", tm.tm_min);
                if (k == 'b') snprintf(t, sizeof t, "%.3s", mon[tm.tm_mon]);
                if (k == 'B') snprintf(t, sizeof t, "%s", mon[tm.tm_mon]);
                if (k == '%') snprintf(t, sizeof t, "%%");
                sb_add(&b, t);
            } else
                sb_addc(&b, p[i]);
        }
        return str_from_sbuf(c, &b, out);
    }
    case F_MACRO:
    case F_CALLER: {
        const node *def = f->def;
        if (++c->depth > c->lim.max_depth) {
            c->depth--;
            return fail(c, -E2BIG, "macro calls nest deeper than %d levels", c->lim.max_depth);
        }
        scope *ms = scope_new(c, f->kind == F_CALLER ? f->env : caller);
        char who[80];
        snprintf(who, sizeof who, f->kind == F_MACRO ? "'%.60s'" : "None", def->s ? def->s : "");
        int rc = !ms ? R_ERR : bind_params(c, who, &def->l1, f->kwargs, f->varargs, a, ms);
        if (rc == R_OK) rc = capture(c, &def->l2, ms, out);
        c->depth--;
        return rc;
    }
    case F_UPPER:
    case F_LOWER:
    case F_TITLE:
    case F_CAPITALIZE: return str_case(c, self, f->kind, out);
    case F_STRIP: return str_strip(self, true, true, out);
    case F_LSTRIP: return str_strip(self, true, false, out);
    case F_RSTRIP: return str_strip(self, false, true, out);
    case F_STARTSWITH: return str_affix(c, self, a, false, out);
    case F_ENDSWITH: return str_affix(c, self, a, true, out);
    case F_SPLIT: return str_split(c, self, a, out);
    case F_REPLACE: return str_replace(c, self, a, out);
    case F_GET: {
        if (a->n < 1 || a->pos[0].t != V_STR)
            return fail(c, -EINVAL, "object key must be a string: got %s",
                        vtype_names[a->n ? a->pos[0].t : V_UNDEF]);
        const jv *v = obj_find(self->o, a->pos[0].s.p, a->pos[0].s.n);
        *out = v ? *v : a->n > 1 ? a->pos[1] : JNULL;
        return R_OK;
    }
    case F_ITEMS:
    case F_KEYS:
    case F_VALUES: return obj_items(c, self, f->kind, out);
    case F_DICTSORT: {
        jobj *kw = NULL;
        size_t npos = a->n;
        if (npos && a->pos[npos - 1].t == V_KWARGS) kw = a->pos[--npos].o;
        const jv *cs = npos > 0 ? &a->pos[0] : kw ? obj_find(kw, "case_sensitive", 14) : NULL;
        const jv *by = npos > 1 ? &a->pos[1] : kw ? obj_find(kw, "by", 2) : NULL;
        const jv *rev = npos > 2 ? &a->pos[2] : kw ? obj_find(kw, "reverse", 7) : NULL;
        if (cs && cs->t != V_BOOL) return fail(c, -EINVAL, "case_sensitive must be a boolean");
        if (by && by->t != V_STR) return fail(c, -EINVAL, "by must be a string");
        bool byval = by && by->s.n == 5 && !memcmp(by->s.p, "value", 5);
        if (by && !byval && !(by->s.n == 3 && !memcmp(by->s.p, "key", 3)))
            return fail(c, -EINVAL, "by must be either 'key' or 'value'");
        if (rev && rev->t != V_BOOL) return fail(c, -EINVAL, "reverse must be a boolean");
        jv items;
        if (obj_items(c, self, F_ITEMS, &items)) return R_ERR;
        jv key = mk_str(byval ? "1" : "0", 1);
        return sort_values(c, &items, &key, cs && cs->b, rev && rev->b, out);
    }
    }
    return fail(c, -EINVAL, "cannot call this");
}

/* ---- statements ----------------------------------------------------------------------------- */

static int emit(ctx *c, const jv *v)
{
    if (v->t == V_NULL || v->t == V_UNDEF) return R_OK;
    if (print_value(c, c->out, v)) return R_ERR;
    if (c->out->err == -E2BIG)
        return fail(c, -E2BIG, "the output grows past %zu bytes", c->lim.max_output_bytes);
    if (c->out->err) return fail(c, -ENOMEM, "out of memory");
    return R_OK;
}

static int assign(ctx *c, const node *target, const jv *v, scope *s)
{
    if (target->kind == N_IDENT) return scope_set(c, s, target->s, target->n, *v);
    if (target->kind == N_TUPLE) {
        if (!is_arr(v)) return fail(c, -EINVAL, "cannot unpack a %s", vtype_names[v->t]);
        if (v->a->n != (size_t)target->l1.n)
            return fail(c, -EINVAL, "too %s items to unpack",
                        (size_t)target->l1.n > v->a->n ? "few" : "many");
        for (int i = 0; i < target->l1.n; i++) {
            if (target->l1.v[i]->kind != N_IDENT)
                return fail(c, -EINVAL, "cannot unpack to a non-name");
            if (scope_set(c, s, target->l1.v[i]->s, target->l1.v[i]->n, v->a->v[i])) return R_ERR;
        }
        return R_OK;
    }
    if (target->kind == N_MEMBER) {
        jv obj;
        if (eval(c, target->a, s, &obj)) return R_ERR;
        if (obj.t != V_NS)
            return fail(c, -EINVAL, "cannot assign an attribute of a non-namespace object");
        if (target->b->kind != N_IDENT || target->flag)
            return fail(c, -EINVAL, "cannot assign to a member with a non-name property");
        return obj_set(c, obj.o, target->b->s, target->b->n, *v);
    }
    return fail(c, -EINVAL, "cannot assign to this expression");
}

static int exec_for(ctx *c, const node *n, scope *s)
{
    scope *sc = scope_new(c, s);
    if (!sc) return R_ERR;
    const node *it = n->b, *test = NULL;
    if (it->kind == N_SELECT) {
        test = it->b;
        it = it->a;
    }
    jv iter;
    if (eval(c, it, sc, &iter)) return R_ERR;
    if (is_obj(&iter)) {
        if (obj_items(c, &iter, F_KEYS, &iter)) return R_ERR;
    } else if (!is_arr(&iter))
        return fail(c, -EINVAL, "cannot loop over a %s", vtype_names[iter.t]);
    const node *lv = n->a;
    vvec items = {0};
    for (size_t i = 0; i < iter.a->n; i++) {
        const jv *cur = &iter.a->v[i];
        if (lv->kind == N_TUPLE) {
            if (cur->t != V_ARRAY)
                return fail(c, -EINVAL, "cannot unpack a %s", vtype_names[cur->t]);
            if (cur->a->n != (size_t)lv->l1.n)
                return fail(c, -EINVAL, "too %s items to unpack",
                            (size_t)lv->l1.n > cur->a->n ? "few" : "many");
        }
        if (test) {
            scope *ls = scope_new(c, sc);
            jv t;
            if (!ls || assign(c, lv, cur, ls) || eval(c, test, ls, &t)) return R_ERR;
            if (!truthy(&t)) continue;
        }
        if (vv_push(c, &items, *cur)) return R_ERR;
    }
    bool none = true;
    for (size_t i = 0; i < items.n; i++) {
        if (step(c, n)) return R_ERR;
        jobj *lo = obj_new(c, 9);
        if (!lo) return R_ERR;
        double len = (double)items.n, k = (double)i;
        obj_set(c, lo, "index", 5, mk_num(V_INT, k + 1));
        obj_set(c, lo, "index0", 6, mk_num(V_INT, k));
        obj_set(c, lo, "revindex", 8, mk_num(V_INT, len - k));
        obj_set(c, lo, "revindex0", 9, mk_num(V_INT, len - k - 1));
        obj_set(c, lo, "first", 5, mk_bool(i == 0));
        obj_set(c, lo, "last", 4, mk_bool(i == items.n - 1));
        obj_set(c, lo, "length", 6, mk_num(V_INT, len));
        obj_set(c, lo, "previtem", 8, i > 0 ? items.v[i - 1] : UNDEF);
        obj_set(c, lo, "nextitem", 8, i + 1 < items.n ? items.v[i + 1] : UNDEF);
        if (c->err || scope_set(c, sc, "loop", 4, mk_obj(V_OBJECT, lo)) ||
            assign(c, lv, &items.v[i], sc))
            return R_ERR;
        /* an iteration that breaks or continues keeps none of its output (the oracle's
         * block result is lost with the exception) */
        size_t mark = c->out->n;
        int rc = exec_block(c, &n->l1, sc);
        if (rc == R_ERR) return R_ERR;
        if (rc == R_CONTINUE || rc == R_BREAK) {
            c->out->n = mark;
            if (c->out->p) c->out->p[mark] = '\0';
            if (rc == R_BREAK) break;
            continue;
        }
        none = false;
    }
    if (none) return exec_block(c, &n->l2, sc);
    return R_OK;
}

static int exec_stmt(ctx *c, const node *n, scope *s)
{
    jv v;
    switch (n->kind) {
    case N_TEXT: sb_addn(c->out, n->s, n->n); return emit(c, &UNDEF);
    case N_COMMENT: return R_OK;
    case N_BREAK: return R_BREAK;
    case N_CONTINUE: return R_CONTINUE;
    case N_IF:
        if (eval(c, n->a, s, &v)) return R_ERR;
        return exec_block(c, truthy(&v) ? &n->l1 : &n->l2, s);
    case N_FOR: return exec_for(c, n, s);
    case N_SET:
        if (n->b) {
            if (eval(c, n->b, s, &v)) return R_ERR;
        } else if (capture(c, &n->l1, s, &v))
            return R_ERR;
        return assign(c, n->a, &v, s);
    case N_MACRO: {
        jv fn = mk_fn(c, F_MACRO, UNDEF);
        if (c->err) return R_ERR;
        fn.f->def = n;
        find_special(n, &fn.f->kwargs, &fn.f->varargs);
        for (int i = 0; i < n->l1.n; i++) {
            if (name_is(n->l1.v[i], "kwargs")) fn.f->kwargs = false;
            if (name_is(n->l1.v[i], "varargs")) fn.f->varargs = false;
        }
        return scope_set(c, s, n->s, n->n, fn);
    }
    case N_CALLBLOCK: {
        jv caller = mk_fn(c, F_CALLER, UNDEF);
        if (c->err) return R_ERR;
        caller.f->def = n;
        caller.f->env = s;
        for (int i = 0; i < n->l2.n; i++)
            find_special(n->l2.v[i], &caller.f->kwargs, &caller.f->varargs);
        args a;
        if (eval_args(c, &n->a->l1, s, &a)) return R_ERR;
        if (!a.kw && !(a.kw = obj_new(c, 1))) return R_ERR;
        args_fold_kw(c, &a);
        jv fn;
        if (c->err || eval(c, n->a->a, s, &fn)) return R_ERR;
        if (fn.t != V_FUNC) return fail(c, -EINVAL, "cannot call a %s", vtype_names[fn.t]);
        scope *ns = scope_new(c, s);
        if (!ns || scope_set(c, ns, "caller", 6, caller)) return R_ERR;
        if (call_fn(c, &fn, &a, ns, &v)) return R_ERR;
        return emit(c, &v);
    }
    case N_FILTERBLOCK:
        if (capture(c, &n->l1, s, &v)) return R_ERR;
        if (apply_filter(c, &v, n->a, s, &v)) return R_ERR;
        return emit(c, &v);
    default:
        if (eval(c, n, s, &v)) return R_ERR;
        return emit(c, &v);
    }
}

static int exec_block(ctx *c, const nlist *body, scope *s)
{
    if (++c->depth > c->lim.max_depth) {
        c->depth--;
        return fail(c, -E2BIG, "the template nests deeper than %d levels", c->lim.max_depth);
    }
    int rc = R_OK;
    for (int i = 0; i < body->n && rc == R_OK; i++) {
        if (step(c, body->v[i])) {
            rc = R_ERR;
            break;
        }
        rc = exec_stmt(c, body->v[i], s);
    }
    c->depth--;
    return rc;
}

static int eval(ctx *c, const node *n, scope *s, jv *out)
{
    if (step(c, n)) return R_ERR;
    if (++c->depth > c->lim.max_depth) {
        c->depth--;
        return fail(c, -E2BIG, "the template nests deeper than %d levels", c->lim.max_depth);
    }
    int rc = R_OK;
    jv v, w;
    *out = UNDEF;
    switch (n->kind) {
    case N_TEXT:
    case N_STR: *out = mk_str(n->s, n->n); break;
    case N_INT: *out = mk_num(V_INT, n->num); break;
    case N_FLOAT: *out = mk_num(V_FLOAT, n->num); break;
    case N_IDENT: *out = scope_get(s, n->s, n->n); break;
    case N_ARRAY:
    case N_TUPLE: {
        jv a = mk_arr(c, n->kind == N_ARRAY ? V_ARRAY : V_TUPLE, (size_t)n->l1.n);
        if (c->err) {
            rc = R_ERR;
            break;
        }
        for (int i = 0; i < n->l1.n && rc == R_OK; i++) rc = eval(c, n->l1.v[i], s, &a.a->v[i]);
        *out = a;
        break;
    }
    case N_OBJECT: {
        jobj *o = obj_new(c, (size_t)n->l1.n);
        if (!o) {
            rc = R_ERR;
            break;
        }
        for (int i = 0; i < n->l1.n && rc == R_OK; i++) {
            if ((rc = eval(c, n->l1.v[i], s, &v))) break;
            if (v.t != V_STR) {
                rc = fail(c, -EINVAL, "dict keys must be strings, not %s", vtype_names[v.t]);
                break;
            }
            if ((rc = eval(c, n->l2.v[i], s, &w))) break;
            rc = obj_set(c, o, v.s.p, v.s.n, w);
        }
        *out = mk_obj(V_OBJECT, o);
        break;
    }
    case N_MEMBER:
        if ((rc = eval(c, n->a, s, &v))) break;
        if (n->flag && n->b->kind == N_SLICE) {
            rc = eval_slice(c, &v, n->b, s, out);
            break;
        }
        if (n->flag)
            rc = eval(c, n->b, s, &w);
        else if (n->b->kind == N_INT)
            w = mk_num(V_INT, n->b->num);
        else
            w = mk_str(n->b->s, n->b->n);
        if (rc == R_OK) rc = get_attr(c, &v, &w, out);
        break;
    case N_CALL: {
        args a;
        if ((rc = eval_args(c, &n->l1, s, &a))) break;
        args_fold_kw(c, &a);
        if (c->err || (rc = eval(c, n->a, s, &v))) {
            rc = R_ERR;
            break;
        }
        if (v.t != V_FUNC) {
            rc = fail(c, -EINVAL, "cannot call a %s%s%.*s", vtype_names[v.t],
                      n->a->kind == N_IDENT || n->a->kind == N_MEMBER ? ": " : "",
                      n->a->kind == N_IDENT                                ? (int)n->a->n
                      : n->a->kind == N_MEMBER && n->a->b->kind == N_IDENT ? (int)n->a->b->n
                                                                           : 0,
                      n->a->kind == N_IDENT    ? n->a->s
                      : n->a->kind == N_MEMBER ? n->a->b->s
                                               : "");
            break;
        }
        c->line = n->line;
        rc = call_fn(c, &v, &a, s, out);
        break;
    }
    case N_UNARY:
        if ((rc = eval(c, n->a, s, &v))) break;
        if (n->op == OP_NOT) {
            *out = mk_bool(!truthy(&v));
        } else if (is_num(&v) || v.t == V_BOOL) {
            double x = (n->op == OP_SUB ? -1 : 1) * to_number(&v);
            *out = mk_num(v.t == V_FLOAT ? V_FLOAT : V_INT, x);
        } else
            rc =
                fail(c, -EINVAL, "unknown operator '%s' for %s", op_names[n->op], vtype_names[v.t]);
        break;
    case N_BINARY: rc = binary_op(c, n, s, out); break;
    case N_FILTER:
        if ((rc = eval(c, n->a, s, &v))) break;
        c->line = n->line;
        rc = apply_filter(c, &v, n->b, s, out);
        break;
    case N_TEST: {
        if ((rc = eval(c, n->a, s, &v))) break;
        bool r;
        if ((rc = run_test(c, n->s, n->n, &v, NULL, &r))) break;
        *out = mk_bool(n->flag ? !r : r);
        break;
    }
    case N_SELECT:
        if ((rc = eval(c, n->b, s, &v))) break;
        if (truthy(&v)) rc = eval(c, n->a, s, out);
        break;
    case N_TERNARY:
        if ((rc = eval(c, n->a, s, &v))) break;
        rc = eval(c, truthy(&v) ? n->b : n->c, s, out);
        break;
    case N_SLICE: rc = fail(c, -EINVAL, "a slice outside []"); break;
    default: rc = fail(c, -EINVAL, "a statement where an expression belongs");
    }
    c->depth--;
    return c->err ? R_ERR : rc;
}

/* ---- input ---------------------------------------------------------------------------------- */

/* A key that JavaScript orders first in an object: a canonical array index. */
static bool index_key(const char *k, double *idx)
{
    size_t n = strlen(k);
    if (!n || n > 10 || (n > 1 && k[0] == '0')) return false;
    double v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_digit(k[i])) return false;
        v = v * 10 + (k[i] - '0');
    }
    if (v >= 4294967295.0) return false;
    *idx = v;
    return true;
}

static int from_json(ctx *c, const json_t *j, jv *out, int depth)
{
    if (depth > c->lim.max_depth)
        return fail(c, -E2BIG, "the variables nest deeper than %d levels", c->lim.max_depth);
    switch (json_typeof(j)) {
    case JSON_NULL: *out = JNULL; return R_OK;
    case JSON_TRUE: *out = mk_bool(true); return R_OK;
    case JSON_FALSE: *out = mk_bool(false); return R_OK;
    case JSON_INTEGER: *out = mk_num(V_INT, (double)json_integer_value(j)); return R_OK;
    case JSON_REAL: {
        double x = json_real_value(j);
        *out = mk_num(x == floor(x) && isfinite(x) ? V_INT : V_FLOAT, x); /* Number.isInteger */
        return R_OK;
    }
    case JSON_STRING: *out = mk_str(json_string_value(j), json_string_length(j)); return R_OK;
    case JSON_ARRAY: {
        jv a = mk_arr(c, V_ARRAY, json_array_size(j));
        if (c->err) return R_ERR;
        for (size_t i = 0; i < a.a->n; i++)
            if (from_json(c, json_array_get(j, i), &a.a->v[i], depth + 1)) return R_ERR;
        *out = a;
        return R_OK;
    }
    case JSON_OBJECT: {
        jobj *o = obj_new(c, json_object_size(j));
        if (!o) return R_ERR;
        const char *k;
        json_t *v;
        double idx, prev = -1;
        /* index keys first in ascending order (as Object.entries), then the rest in order */
        for (;;) {
            double best = INFINITY;
            const char *bk = NULL;
            json_t *bv = NULL;
            json_object_foreach((json_t *)j, k, v)
            {
                if (index_key(k, &idx) && idx > prev && idx < best) {
                    best = idx;
                    bk = k;
                    bv = v;
                }
            }
            if (!bk) break;
            jv x;
            if (from_json(c, bv, &x, depth + 1) || obj_set(c, o, bk, strlen(bk), x)) return R_ERR;
            prev = best;
        }
        json_object_foreach((json_t *)j, k, v)
        {
            if (index_key(k, &idx)) continue;
            jv x;
            if (from_json(c, v, &x, depth + 1) || obj_set(c, o, k, strlen(k), x)) return R_ERR;
        }
        *out = mk_obj(V_OBJECT, o);
        return R_OK;
    }
    }
    return fail(c, -EINVAL, "an unknown JSON type");
}

int jinja_render(const jinja_template *t, const json_t *vars, const jinja_limits *lim, char **text,
                 size_t *len)
{
    *text = NULL;
    if (len) *len = 0;
    if (!t) return errdetail_set(&jinja_err, -EINVAL, "template: NULL");
    if (vars && !json_is_object(vars))
        return errdetail_set(&jinja_err, -EINVAL, "the template's variables must be a JSON object");
    ctx c = {0};
    c.lim = lim ? *lim : (jinja_limits){0};
    if (!c.lim.max_output_bytes) c.lim.max_output_bytes = 16u << 20;
    if (!c.lim.max_memory_bytes) c.lim.max_memory_bytes = 128u << 20;
    if (!c.lim.max_steps) c.lim.max_steps = 5000000;
    if (!c.lim.max_depth) c.lim.max_depth = 400;
    c.mem.cap = c.lim.max_memory_bytes;
    c.line = 1;
    sbuf out = new_sbuf(&c);
    c.out = &out;
    scope *g = scope_new(&c, NULL);
    int rc = g ? R_OK : R_ERR;
    static const struct {
        const char *name;
        int kind;
    } fns[] = {{"namespace", F_NAMESPACE},
               {"raise_exception", F_RAISE},
               {"range", F_RANGE},
               {"strftime_now", F_STRFTIME}};
    for (size_t i = 0; rc == R_OK && i < sizeof fns / sizeof *fns; i++) {
        jv f = mk_fn(&c, fns[i].kind, UNDEF);
        rc = c.err ? R_ERR : scope_set(&c, g, fns[i].name, strlen(fns[i].name), f);
    }
    static const struct {
        const char *name;
        int v; /* 0 false, 1 true, 2 none */
    } consts[] = {{"false", 0}, {"true", 1}, {"none", 2}, {"True", 1}, {"False", 0}, {"None", 2}};
    for (size_t i = 0; rc == R_OK && i < sizeof consts / sizeof *consts; i++)
        rc = scope_set(&c, g, consts[i].name, strlen(consts[i].name),
                       consts[i].v == 2 ? JNULL : mk_bool(consts[i].v));
    if (rc == R_OK && vars) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)vars, k, v)
        {
            jv x;
            if ((rc = from_json(&c, v, &x, 0)) || (rc = scope_set(&c, g, k, strlen(k), x))) break;
        }
    }
    if (rc == R_OK) rc = exec_block(&c, &t->body, g);
    if (rc == R_BREAK || rc == R_CONTINUE)
        rc = fail(&c, -EINVAL, "break or continue outside a loop");
    if (rc == R_OK && out.err)
        rc = out.err == -E2BIG
                 ? fail(&c, -E2BIG, "the output grows past %zu bytes", c.lim.max_output_bytes)
                 : fail(&c, -ENOMEM, "out of memory");
    arena_free(&c.mem);
    if (rc) {
        free(out.p);
        return c.err ? c.err : errdetail_set(&jinja_err, -EINVAL, "render failed");
    }
    if (!out.p) {
        out.p = calloc(1, 1);
        if (!out.p) return errdetail_set(&jinja_err, -ENOMEM, "out of memory");
    }
    *text = out.p;
    if (len) *len = out.n;
    return 0;
}
