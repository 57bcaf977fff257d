/* SPDX-License-Identifier: MIT */
/*
 * constrain/regex.c — regular expressions to programs: a recursive-descent parser to a
 * small tree, then emitted backwards (prog.h).
 *
 * Semantics chosen so that what the program accepts is always accepted by Python's re and
 * by ECMAScript (JSON Schema validators use one or the other): \d \w \s are ASCII (both
 * engines accept ASCII digits as \d); where a class is negated around one of them, its
 * non-ASCII part is dropped (Python's \D refuses the Unicode digits that an ASCII
 * complement would let through); `.` excludes \n \r U+2028 U+2029. $ matches only at the
 * very end (Python's also before a final newline: stricter is safe).
 */
#include "constrain/prog.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { N_CPS, N_CAT, N_ALT, N_REP, N_BOL, N_EOL };

typedef struct re_node {
    int kind;
    int min, max; /* N_REP; max -1 = unbounded */
    cst_cps set;  /* N_CPS */
    struct re_node **kids;
    size_t nkids, kcap;
} re_node;

typedef struct re_parser {
    const char *s;
    size_t n, i;
    cst_prog *p;
    int depth;
    re_node **all; /* every node, for freeing */
    size_t nall, allcap;
} re_parser;

#define RE_MAX_REPEAT 10000
#define RE_MAX_DEPTH  200

static re_node *node_new(re_parser *r, int kind)
{
    if (r->p->failed) return NULL;
    if (r->nall == r->allcap) {
        size_t c = r->allcap ? r->allcap * 2 : 32;
        re_node **na = realloc(r->all, c * sizeof *na);
        if (!na) return prog_fail(r->p, -ENOMEM, "out of memory"), NULL;
        r->all = na;
        r->allcap = c;
    }
    re_node *x = calloc(1, sizeof *x);
    if (!x) return prog_fail(r->p, -ENOMEM, "out of memory"), NULL;
    r->all[r->nall++] = x;
    x->kind = kind;
    return x;
}

static int kid_add(re_parser *r, re_node *x, re_node *k)
{
    if (x->nkids == x->kcap) {
        size_t c = x->kcap ? x->kcap * 2 : 4;
        re_node **nk = realloc(x->kids, c * sizeof *nk);
        if (!nk) return prog_fail(r->p, -ENOMEM, "out of memory"), -1;
        x->kids = nk;
        x->kcap = c;
    }
    x->kids[x->nkids++] = k;
    return 0;
}

static void *perr(re_parser *r, const char *what)
{
    prog_fail(r->p, -EINVAL, "regex: %s at offset %zu", what, r->i);
    return NULL;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One UTF-8 code point of the pattern itself. */
static int next_cp(re_parser *r, uint32_t *cp)
{
    const uint8_t *s = (const uint8_t *)r->s + r->i;
    size_t left = r->n - r->i;
    uint8_t c = s[0];
    size_t len = c < 0x80             ? 1
                 : (c & 0xE0) == 0xC0 ? 2
                 : (c & 0xF0) == 0xE0 ? 3
                 : (c & 0xF8) == 0xF0 ? 4
                                      : 0;
    if (!len || len > left) return perr(r, "the pattern is not UTF-8"), -1;
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return perr(r, "the pattern is not UTF-8"), -1;
        v = v << 6 | (s[k] & 63u);
    }
    r->i += len;
    *cp = v;
    return 0;
}

static int add_class(cst_cps *s, int c, bool *unicode_sensitive)
{
    int rc = 0;
    switch (c) {
    case 'd': rc = cps_add(s, '0', '9'); break;
    case 'w':
        rc = cps_add(s, '0', '9') || cps_add(s, 'A', 'Z') || cps_add(s, 'a', 'z') ||
             cps_add(s, '_', '_');
        break;
    case 's':
        rc = cps_add(s, '\t', '\r') || cps_add(s, ' ', ' '); /* \t \n \v \f \r and space */
        break;
    default: { /* D W S: the ASCII complement, nothing beyond ASCII */
        cst_cps t = {0};
        add_class(&t, c - 'A' + 'a', unicode_sensitive);
        if (cps_negate(&t) || cps_subtract(&t, 0x80, CST_MAX_CP)) rc = -ENOMEM;
        for (size_t i = 0; i < t.n && !rc; i++) rc = cps_add(s, t.r[i].lo, t.r[i].hi);
        cps_free(&t);
        break;
    }
    }
    *unicode_sensitive = true;
    return rc ? -ENOMEM : 0;
}

/*
 * An escape after the backslash: a code point (*cp, returns 1), a class added to cls
 * (returns 2; cls NULL: not allowed here), or -1 on error.
 */
static int parse_escape(re_parser *r, uint32_t *cp, cst_cps *cls, bool *usens)
{
    if (r->i >= r->n) return perr(r, "a trailing backslash"), -1;
    char c = r->s[r->i++];
    switch (c) {
    case 'd':
    case 'w':
    case 's':
    case 'D':
    case 'W':
    case 'S':
        if (add_class(cls, c, usens)) return prog_fail(r->p, -ENOMEM, "out of memory"), -1;
        return 2;
    case 't': *cp = '\t'; return 1;
    case 'n': *cp = '\n'; return 1;
    case 'r': *cp = '\r'; return 1;
    case 'f': *cp = '\f'; return 1;
    case 'v': *cp = '\v'; return 1;
    case '0':
        if (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9')
            return perr(r, "octal escapes are not supported"), -1;
        *cp = 0;
        return 1;
    case 'x': {
        if (r->i + 2 > r->n || hexval(r->s[r->i]) < 0 || hexval(r->s[r->i + 1]) < 0)
            return perr(r, "\\x needs two hex digits"), -1;
        *cp = (uint32_t)(hexval(r->s[r->i]) * 16 + hexval(r->s[r->i + 1]));
        r->i += 2;
        return 1;
    }
    case 'u': {
        if (r->i < r->n && r->s[r->i] == '{') {
            uint32_t v = 0;
            size_t k = r->i + 1, nd = 0;
            while (k < r->n && hexval(r->s[k]) >= 0 && nd < 7)
                v = v * 16 + (uint32_t)hexval(r->s[k++]), nd++;
            if (k >= r->n || r->s[k] != '}' || !nd || v > CST_MAX_CP)
                return perr(r, "a bad \\u{...} escape"), -1;
            r->i = k + 1;
            *cp = v;
        } else {
            if (r->i + 4 > r->n) return perr(r, "\\u needs four hex digits"), -1;
            uint32_t v = 0;
            for (int k = 0; k < 4; k++) {
                int h = hexval(r->s[r->i + k]);
                if (h < 0) return perr(r, "\\u needs four hex digits"), -1;
                v = v * 16 + (uint32_t)h;
            }
            r->i += 4;
            if (v >= 0xD800 && v <= 0xDBFF && r->i + 6 <= r->n && r->s[r->i] == '\\' &&
                r->s[r->i + 1] == 'u') {
                uint32_t lo = 0;
                bool ok = true;
                for (int k = 0; k < 4; k++) {
                    int h = hexval(r->s[r->i + 2 + k]);
                    if (h < 0) ok = false;
                    lo = lo * 16 + (uint32_t)(h < 0 ? 0 : h);
                }
                if (ok && lo >= 0xDC00 && lo <= 0xDFFF) {
                    r->i += 6;
                    v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                }
            }
            if (v >= 0xD800 && v <= 0xDFFF) return perr(r, "a lone surrogate escape"), -1;
            *cp = v;
        }
        return 1;
    }
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
            r->i--;
            return perr(r, "unsupported escape (back-references, \\b, \\p{..} and the like)"), -1;
        }
        if ((unsigned char)c >= 0x80) {
            r->i--;
            return next_cp(r, cp) ? -1 : 1;
        }
        *cp = (uint32_t)(unsigned char)c;
        return 1;
    }
}

static re_node *parse_class(re_parser *r)
{
    /* after '[' */
    bool neg = false, usens = false;
    re_node *x = node_new(r, N_CPS);
    if (!x) return NULL;
    if (r->i < r->n && r->s[r->i] == '^') neg = true, r->i++;
    if (r->i < r->n && r->s[r->i] == ']')
        return perr(r, "a class that starts with ']' (ambiguous)");
    for (;;) {
        if (r->i >= r->n) return perr(r, "an unterminated character class");
        char c = r->s[r->i];
        if (c == ']') {
            r->i++;
            break;
        }
        if (c == '[' && r->i + 1 < r->n &&
            (r->s[r->i + 1] == ':' || r->s[r->i + 1] == '=' || r->s[r->i + 1] == '.'))
            return perr(r, "POSIX classes are not supported");
        if (c == '&' && r->i + 1 < r->n && r->s[r->i + 1] == '&')
            return perr(r, "class intersection is not supported");
        uint32_t lo;
        int kind;
        if (c == '\\') {
            r->i++;
            if (r->i < r->n && r->s[r->i] == 'b') { /* [\b] is backspace */
                r->i++;
                lo = 8, kind = 1;
            } else
                kind = parse_escape(r, &lo, &x->set, &usens);
            if (kind < 0) return NULL;
        } else {
            if (next_cp(r, &lo)) return NULL;
            kind = 1;
        }
        if (kind == 2) continue;
        uint32_t hi = lo;
        if (r->i + 1 < r->n && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
            r->i++;
            if (r->s[r->i] == '\\') {
                r->i++;
                int k2 = parse_escape(r, &hi, NULL, &usens);
                if (k2 != 1) return k2 < 0 ? NULL : perr(r, "a class shorthand as a range end");
            } else if (next_cp(r, &hi))
                return NULL;
            if (hi < lo) return perr(r, "a reversed range in a class");
        }
        if (cps_add(&x->set, lo, hi)) return prog_fail(r->p, -ENOMEM, "out of memory"), NULL;
    }
    if (neg) {
        if (cps_negate(&x->set)) return prog_fail(r->p, -ENOMEM, "out of memory"), NULL;
        if (usens && cps_subtract(&x->set, 0x80, CST_MAX_CP))
            return prog_fail(r->p, -ENOMEM, "out of memory"), NULL;
    }
    if (cps_subtract(&x->set, 0xD800, 0xDFFF))
        return prog_fail(r->p, -ENOMEM, "out of memory"), NULL;
    return x;
}

static re_node *parse_alt(re_parser *r);

static re_node *parse_atom(re_parser *r)
{
    char c = r->s[r->i];
    re_node *x;
    switch (c) {
    case '(': {
        r->i++;
        if (r->i < r->n && r->s[r->i] == '?') {
            r->i++;
            if (r->i < r->n && r->s[r->i] == ':')
                r->i++;
            else if (r->i + 1 < r->n && r->s[r->i] == 'P' && r->s[r->i + 1] == '<') {
                r->i += 2;
                while (r->i < r->n && r->s[r->i] != '>') r->i++;
                if (r->i >= r->n) return perr(r, "an unterminated group name");
                r->i++;
            } else if (r->i + 1 < r->n && r->s[r->i] == '<' && r->s[r->i + 1] != '=' &&
                       r->s[r->i + 1] != '!') {
                r->i++;
                while (r->i < r->n && r->s[r->i] != '>') r->i++;
                if (r->i >= r->n) return perr(r, "an unterminated group name");
                r->i++;
            } else
                return perr(r,
                            "look-around, inline flags and other (?...) groups are not supported");
        }
        if (++r->depth > RE_MAX_DEPTH) return perr(r, "groups nested too deeply");
        x = parse_alt(r);
        r->depth--;
        if (!x) return NULL;
        if (r->i >= r->n || r->s[r->i] != ')') return perr(r, "a missing ')'");
        r->i++;
        return x;
    }
    case '[': r->i++; return parse_class(r);
    case '.':
        r->i++;
        x = node_new(r, N_CPS);
        if (!x) return NULL;
        if (cps_add(&x->set, 0, CST_MAX_CP) || cps_subtract(&x->set, '\n', '\n') ||
            cps_subtract(&x->set, '\r', '\r') || cps_subtract(&x->set, 0x2028, 0x2029) ||
            cps_subtract(&x->set, 0xD800, 0xDFFF))
            return prog_fail(r->p, -ENOMEM, "out of memory"), NULL;
        return x;
    case '^': r->i++; return node_new(r, N_BOL);
    case '$': r->i++; return node_new(r, N_EOL);
    case '*':
    case '+':
    case '?': return perr(r, "a quantifier with nothing to repeat");
    case '\\': {
        r->i++;
        x = node_new(r, N_CPS);
        if (!x) return NULL;
        uint32_t cp;
        bool usens = false;
        int k = parse_escape(r, &cp, &x->set, &usens);
        if (k < 0) return NULL;
        if (k == 1 && cps_add(&x->set, cp, cp))
            return prog_fail(r->p, -ENOMEM, "out of memory"), NULL;
        return x;
    }
    default: {
        uint32_t cp;
        if (next_cp(r, &cp)) return NULL;
        x = node_new(r, N_CPS);
        if (x && cps_add(&x->set, cp, cp)) return prog_fail(r->p, -ENOMEM, "out of memory"), NULL;
        return x;
    }
    }
}

/* {n}, {n,}, {n,m} at r->i; returns 1 and sets min/max, 0 when it is not a quantifier. */
static int parse_braces(re_parser *r, int *min, int *max)
{
    size_t k = r->i + 1;
    long a = 0, b;
    size_t nd = 0;
    while (k < r->n && r->s[k] >= '0' && r->s[k] <= '9' && nd < 9)
        a = a * 10 + (r->s[k++] - '0'), nd++;
    if (!nd) return 0;
    if (k < r->n && r->s[k] == '}') {
        b = a;
    } else if (k < r->n && r->s[k] == ',') {
        k++;
        size_t nd2 = 0;
        b = 0;
        while (k < r->n && r->s[k] >= '0' && r->s[k] <= '9' && nd2 < 9)
            b = b * 10 + (r->s[k++] - '0'), nd2++;
        if (!nd2) b = -1;
        if (k >= r->n || r->s[k] != '}') return 0;
    } else
        return 0;
    r->i = k + 1;
    *min = (int)a;
    *max = (int)b;
    return 1;
}

static re_node *parse_concat(re_parser *r)
{
    re_node *cat = node_new(r, N_CAT);
    if (!cat) return NULL;
    while (r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')') {
        re_node *a = parse_atom(r);
        if (!a) return NULL;
        for (;;) {
            if (r->i >= r->n) break;
            char c = r->s[r->i];
            int min, max;
            if (c == '*')
                min = 0, max = -1, r->i++;
            else if (c == '+')
                min = 1, max = -1, r->i++;
            else if (c == '?')
                min = 0, max = 1, r->i++;
            else if (c == '{') {
                if (!parse_braces(r, &min, &max)) break;
            } else
                break;
            if (max != -1 && max < min)
                return perr(r, "a repeat whose maximum is below its minimum");
            if (min > RE_MAX_REPEAT || max > RE_MAX_REPEAT)
                return perr(r, "a repeat count above 10000");
            if (a->kind == N_BOL || a->kind == N_EOL) return perr(r, "a repeated anchor");
            if (r->i < r->n && r->s[r->i] == '?')
                r->i++; /* lazy: same language */
            else if (r->i < r->n && r->s[r->i] == '+')
                return perr(r, "possessive quantifiers are not supported");
            re_node *rep = node_new(r, N_REP);
            if (!rep || kid_add(r, rep, a)) return NULL;
            rep->min = min;
            rep->max = max;
            a = rep;
        }
        if (kid_add(r, cat, a)) return NULL;
    }
    return cat;
}

static re_node *parse_alt(re_parser *r)
{
    re_node *alt = node_new(r, N_ALT);
    if (!alt) return NULL;
    for (;;) {
        re_node *c = parse_concat(r);
        if (!c || kid_add(r, alt, c)) return NULL;
        if (r->i < r->n && r->s[r->i] == '|') {
            r->i++;
            continue;
        }
        return alt;
    }
}

static bool has_anchor(const re_node *x)
{
    if (x->kind == N_BOL || x->kind == N_EOL) return true;
    for (size_t i = 0; i < x->nkids; i++)
        if (has_anchor(x->kids[i])) return true;
    return false;
}

static uint32_t emit(cst_prog *p, re_node *x, bool js, uint32_t next)
{
    if (p->failed) return 0;
    switch (x->kind) {
    case N_CPS:
        if (cps_empty(&x->set)) return 0; /* matches nothing */
        return prog_cps(p, &x->set, js, next);
    case N_CAT:
        for (size_t i = x->nkids; i-- > 0;) next = emit(p, x->kids[i], js, next);
        return next;
    case N_ALT: {
        if (x->nkids == 1) return emit(p, x->kids[0], js, next);
        uint32_t *e = malloc(x->nkids * sizeof *e);
        if (!e) return prog_fail(p, -ENOMEM, "out of memory");
        for (size_t i = 0; i < x->nkids; i++) e[i] = emit(p, x->kids[i], js, next);
        uint32_t pc = prog_alts(p, e, x->nkids);
        free(e);
        return pc;
    }
    case N_REP: {
        uint32_t pc = next;
        if (x->max < 0) {
            uint32_t loop = prog_split(p, 0, next);
            if (p->failed) return 0;
            uint32_t body = emit(p, x->kids[0], js, loop);
            prog_patch(p, loop, body);
            pc = loop;
        } else {
            for (int k = x->min; k < x->max && !p->failed; k++)
                pc = prog_split(p, emit(p, x->kids[0], js, pc), next);
        }
        for (int k = 0; k < x->min && !p->failed; k++) pc = emit(p, x->kids[0], js, pc);
        return pc;
    }
    default: return prog_fail(p, -EINVAL, "regex: ^ and $ are supported only at the ends");
    }
}

/* any code point, * */
static uint32_t emit_any_star(cst_prog *p, bool js, uint32_t next)
{
    cst_cps all = {0};
    if (cps_add(&all, 0, 0xD7FF) || cps_add(&all, 0xE000, CST_MAX_CP)) {
        cps_free(&all);
        return prog_fail(p, -ENOMEM, "out of memory");
    }
    uint32_t loop = prog_split(p, 0, next);
    prog_patch(p, loop, prog_cps(p, &all, js, loop));
    cps_free(&all);
    return loop;
}

uint32_t cst_regex_emit(cst_prog *p, const char *re, size_t len, int flags, uint32_t next)
{
    re_parser r = {.s = re, .n = len, .p = p};
    bool js = flags & RE_JSON_STRING, search = flags & RE_SEARCH;
    uint32_t pc = 0;
    re_node *top = parse_alt(&r);
    if (!top) goto out;
    if (r.i < r.n) {
        perr(&r, "an unmatched ')'");
        goto out;
    }
    /* anchors: only a leading ^ and a trailing $ of a top-level branch */
    uint32_t *e = malloc((top->nkids + 1) * sizeof *e);
    if (!e) {
        prog_fail(p, -ENOMEM, "out of memory");
        goto out;
    }
    for (size_t b = 0; b < top->nkids && !p->failed; b++) {
        re_node *cat = top->kids[b];
        bool at_start = false, at_end = false;
        size_t lo = 0, hi = cat->nkids;
        /* a group that is the whole branch, e.g. ^(a|b)$ written as (^a|^b)? no: keep it simple */
        while (lo < hi && cat->kids[lo]->kind == N_BOL) at_start = true, lo++;
        while (hi > lo && cat->kids[hi - 1]->kind == N_EOL) at_end = true, hi--;
        uint32_t q = next;
        if (search && !at_end) q = emit_any_star(p, js, q);
        for (size_t i = hi; i-- > lo;) {
            if (has_anchor(cat->kids[i])) {
                prog_fail(p, -EINVAL,
                          "regex: ^ and $ are supported only at the ends of the pattern");
                break;
            }
            q = emit(p, cat->kids[i], js, q);
        }
        if (search && !at_start) q = emit_any_star(p, js, q);
        e[b] = q;
    }
    if (!p->failed) pc = prog_alts(p, e, top->nkids);
    free(e);
out:
    for (size_t i = 0; i < r.nall; i++) {
        cps_free(&r.all[i]->set);
        free(r.all[i]->kids);
        free(r.all[i]);
    }
    free(r.all);
    return p->failed ? 0 : pc;
}
