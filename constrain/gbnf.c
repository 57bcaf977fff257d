/* SPDX-License-Identifier: MIT */
/*
 * constrain/gbnf.c — llama.cpp's GBNF grammars to programs (prog.h).
 *
 * The syntax is llama.cpp's (src/llama-grammar.cpp, grammars/README.md), parsed the same
 * way: rules `name ::= alternatives`, names of [a-zA-Z0-9-], `|`, sequences, `( )`, string
 * literals and character classes with the escapes \xHH \uHHHH \UHHHHHHHH \t \r \n \\ \" \[
 * \] \-, `[^...]`, `.` (any code point), `* + ? {m} {m,} {m,n}`, `#` comments to the end of
 * the line. A newline ends a rule except inside parentheses and after `|` or `::=`. The
 * start is the rule `root`. Terminals are code points; the program matches their UTF-8.
 *
 * Every rule is a subroutine (CALL/RET), so recursion is exact; a reference in tail position
 * is a jump (no stack growth for right recursion such as `list ::= item list | ""`). A
 * repeat copies its item (a rule reference is one instruction; a large repeated group counts
 * against the program bound, -E2BIG, which also stops nested repeats of nullable groups
 * such as llama.cpp's (((a?){0,99}){0,99}){0,99} from blowing up the matcher's states).
 *
 * Where this engine and llama.cpp differ, it refuses rather than guesses: left recursion
 * (llama.cpp refuses it too), token references `<...>` / `!<...>` (the engine matches text,
 * not token ids), a rule defined twice (llama.cpp keeps the last), an empty class `[]`, a
 * reversed range, a repeat count above 65535 (llama.cpp turns a maximum above 2000 into "no
 * maximum": looser), a root that matches no finite text. Text is matched as valid UTF-8.
 */
#include "constrain/cst.h"
#include "constrain/prog.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { G_CPS, G_LIT, G_SEQ, G_ALT, G_REP, G_REF };

#define G_NONE      UINT32_MAX
#define G_UNBOUNDED UINT32_MAX
#define G_MAX_REP   65535u
#define G_MAX_DEPTH 200 /* nested groups and stacked quantifiers */

typedef struct g_node {
    int kind;
    uint32_t min, max; /* G_REP */
    uint32_t rule;     /* G_REF */
    cst_cps set;       /* G_CPS */
    uint8_t *lit;      /* G_LIT: UTF-8 */
    size_t nlit;
    uint32_t *kids; /* node indices */
    size_t nkids, kcap;
} g_node;

typedef struct g_rule {
    const char *name; /* into the source */
    size_t nlen;
    uint32_t body;     /* node, G_NONE until defined */
    uint32_t line_def; /* line of the definition */
    uint32_t line_ref; /* line of the first reference */
    bool nullable, productive, reachable;
    uint32_t entry; /* pc */
    uint32_t *left; /* rules reachable before a byte is consumed (direct) */
    size_t nleft, leftcap;
} g_rule;

typedef struct g_parser {
    const char *s;
    size_t n, i;
    g_node *nodes;
    size_t nn, ncap;
    g_rule *rules;
    size_t nr, rcap;
    uint32_t *rhash; /* open addressing: rule index + 1, 0 empty */
    size_t rhcap;
    uint32_t cur; /* the rule being parsed */
    int depth;
    int err;
    char msg[512];
    size_t line_pos; /* line_at's last answer: line line_no begins before line_pos */
    uint32_t line_no;
} g_parser;

/* The line of offset at, counted on from the last answer when at is past it (the parser
 * asks in order: a grammar of many rules is not read again for each). */
static uint32_t line_at(const g_parser *g, size_t at)
{
    g_parser *m = (g_parser *)g;
    size_t k = 0;
    uint32_t line = 1;
    if (m->line_no && at >= m->line_pos) k = m->line_pos, line = m->line_no;
    for (; k < at && k < g->n; k++)
        if (g->s[k] == '\n' || (g->s[k] == '\r' && (k + 1 >= g->n || g->s[k + 1] != '\n'))) line++;
    m->line_pos = k;
    m->line_no = line;
    return line;
}

static void gfail(g_parser *g, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void gfail(g_parser *g, int err, const char *fmt, ...)
{
    if (g->err) return;
    g->err = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->msg, sizeof g->msg, fmt, ap);
    va_end(ap);
}

/* A syntax error at the current position, in the current rule. */
static void gsyntax(g_parser *g, const char *what)
{
    if (g->err) return;
    char near[24] = "the end";
    if (g->i < g->n) {
        unsigned char c = (unsigned char)g->s[g->i];
        if (c >= 0x20 && c < 0x7f)
            snprintf(near, sizeof near, "'%c'", c);
        else
            snprintf(near, sizeof near, "byte 0x%02x", c);
    }
    if (g->cur != G_NONE && g->cur < g->nr)
        gfail(g, -EINVAL, "gbnf: line %u: rule '%.*s': %s (at %s)", line_at(g, g->i),
              (int)g->rules[g->cur].nlen, g->rules[g->cur].name, what, near);
    else
        gfail(g, -EINVAL, "gbnf: line %u: %s (at %s)", line_at(g, g->i), what, near);
}

static void nomem(g_parser *g)
{
    gfail(g, -ENOMEM, "out of memory");
}

static uint32_t node_new(g_parser *g, int kind)
{
    if (g->err) return G_NONE;
    if (g->nn == g->ncap) {
        size_t c = g->ncap ? g->ncap * 2 : 64;
        g_node *nn = realloc(g->nodes, c * sizeof *nn);
        if (!nn) return nomem(g), G_NONE;
        g->nodes = nn;
        g->ncap = c;
    }
    memset(&g->nodes[g->nn], 0, sizeof g->nodes[g->nn]);
    g->nodes[g->nn].kind = kind;
    g->nodes[g->nn].rule = G_NONE;
    return (uint32_t)g->nn++;
}

static int kid_add(g_parser *g, uint32_t x, uint32_t k)
{
    if (g->err || x == G_NONE || k == G_NONE) return -1;
    g_node *p = &g->nodes[x];
    if (p->nkids == p->kcap) {
        size_t c = p->kcap ? p->kcap * 2 : 4;
        uint32_t *nk = realloc(p->kids, c * sizeof *nk);
        if (!nk) return nomem(g), -1;
        p->kids = nk;
        p->kcap = c;
    }
    p->kids[p->nkids++] = k;
    return 0;
}

static uint64_t name_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* The rule of that name, made (undefined) on first sight. */
static uint32_t rule_get(g_parser *g, const char *name, size_t len)
{
    if (g->err) return G_NONE;
    if ((g->nr + 1) * 2 > g->rhcap) {
        size_t cap = g->rhcap ? g->rhcap * 2 : 64;
        uint32_t *h = calloc(cap, sizeof *h);
        if (!h) return nomem(g), G_NONE;
        for (size_t r = 0; r < g->nr; r++) {
            size_t j = name_hash(g->rules[r].name, g->rules[r].nlen) & (cap - 1);
            while (h[j]) j = (j + 1) & (cap - 1);
            h[j] = (uint32_t)r + 1;
        }
        free(g->rhash);
        g->rhash = h;
        g->rhcap = cap;
    }
    size_t j = name_hash(name, len) & (g->rhcap - 1);
    while (g->rhash[j]) {
        g_rule *r = &g->rules[g->rhash[j] - 1];
        if (r->nlen == len && !memcmp(r->name, name, len)) return g->rhash[j] - 1;
        j = (j + 1) & (g->rhcap - 1);
    }
    if (g->nr == g->rcap) {
        size_t c = g->rcap ? g->rcap * 2 : 32;
        g_rule *nr = realloc(g->rules, c * sizeof *nr);
        if (!nr) return nomem(g), G_NONE;
        g->rules = nr;
        g->rcap = c;
    }
    g_rule *r = &g->rules[g->nr];
    memset(r, 0, sizeof *r);
    r->name = name;
    r->nlen = len;
    r->body = G_NONE;
    g->rhash[j] = (uint32_t)g->nr + 1;
    return (uint32_t)g->nr++;
}

static bool is_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

static void skip_space(g_parser *g, bool newline_ok)
{
    while (g->i < g->n) {
        char c = g->s[g->i];
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
            g->i++;
        } else if (c == '#') {
            while (g->i < g->n && g->s[g->i] != '\r' && g->s[g->i] != '\n') g->i++;
        } else
            break;
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One UTF-8 code point of the source (strict). */
static int next_cp(g_parser *g, uint32_t *cp)
{
    const uint8_t *s = (const uint8_t *)g->s + g->i;
    size_t n = g->n - g->i;
    uint8_t c = s[0];
    size_t len;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        g->i++;
        return 0;
    }
    if ((c & 0xE0) == 0xC0)
        len = 2, v = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
        len = 3, v = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
        len = 4, v = c & 0x07, min = 0x10000;
    else
        return gsyntax(g, "invalid UTF-8"), -1;
    if (n < len) return gsyntax(g, "invalid UTF-8"), -1;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return gsyntax(g, "invalid UTF-8"), -1;
        v = v << 6 | (s[k] & 63);
    }
    if (v < min || v > CST_MAX_CP || (v >= 0xD800 && v <= 0xDFFF))
        return gsyntax(g, "invalid UTF-8"), -1;
    g->i += len;
    *cp = v;
    return 0;
}

/* A character of a literal or a class: an escape or one code point. */
static int parse_char(g_parser *g, uint32_t *cp)
{
    if (g->i >= g->n) return gsyntax(g, "unexpected end of the grammar"), -1;
    if (g->s[g->i] != '\\') return next_cp(g, cp);
    if (g->i + 1 >= g->n) return gsyntax(g, "a backslash at the end of the grammar"), -1;
    char c = g->s[g->i + 1];
    int digits = 0;
    switch (c) {
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    case 't': *cp = '\t'; break;
    case 'r': *cp = '\r'; break;
    case 'n': *cp = '\n'; break;
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-': *cp = (uint8_t)c; break;
    default: {
        char what[64];
        if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7f)
            snprintf(what, sizeof what, "unknown escape '\\%c'", c);
        else
            snprintf(what, sizeof what, "unknown escape (a backslash before byte 0x%02x)",
                     (unsigned char)c);
        return gsyntax(g, what), -1;
    }
    }
    if (!digits) {
        g->i += 2;
        return 0;
    }
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        size_t at = g->i + 2 + (size_t)k;
        int h = at < g->n ? hexval(g->s[at]) : -1;
        if (h < 0) {
            char what[64];
            snprintf(what, sizeof what, "bad escape: '\\%c' needs %d hex digits", c, digits);
            return gsyntax(g, what), -1;
        }
        v = v << 4 | (uint32_t)h;
    }
    if (v > CST_MAX_CP || (v >= 0xD800 && v <= 0xDFFF))
        return gsyntax(g, "bad escape: not a Unicode scalar value"), -1;
    g->i += 2 + (size_t)digits;
    *cp = v;
    return 0;
}

static uint32_t parse_alts(g_parser *g, bool nested);

static int parse_count(g_parser *g, uint32_t *out)
{
    if (g->i >= g->n || g->s[g->i] < '0' || g->s[g->i] > '9')
        return gsyntax(g, "expecting a number in { }"), -1;
    uint64_t v = 0;
    while (g->i < g->n && g->s[g->i] >= '0' && g->s[g->i] <= '9') {
        v = v * 10 + (uint64_t)(g->s[g->i++] - '0');
        if (v > G_MAX_REP) return gsyntax(g, "a repeat count above 65535"), -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static uint32_t parse_seq(g_parser *g, bool nested)
{
    uint32_t seq = node_new(g, G_SEQ);
    int reps = 0; /* quantifiers stacked on the last item */
    while (!g->err && g->i < g->n) {
        char c = g->s[g->i];
        uint32_t item = G_NONE;
        uint32_t min = 0, max = G_UNBOUNDED;
        bool rep = false;
        if (c == '"') {
            g->i++;
            item = node_new(g, G_LIT);
            size_t cap = 0;
            for (;;) {
                if (g->i >= g->n) {
                    gsyntax(g, "an unterminated string literal");
                    break;
                }
                if (g->s[g->i] == '"') {
                    g->i++;
                    break;
                }
                uint32_t cp;
                if (parse_char(g, &cp)) break;
                g_node *x = &g->nodes[item];
                if (x->nlit + 4 > cap) {
                    cap = cap ? cap * 2 : 16;
                    uint8_t *nl = realloc(x->lit, cap);
                    if (!nl) {
                        nomem(g);
                        break;
                    }
                    x->lit = nl;
                }
                x->nlit += cst_encode_cp(cp, false, x->lit + x->nlit);
            }
            skip_space(g, nested);
        } else if (c == '[') {
            size_t open = g->i++;
            item = node_new(g, G_CPS);
            bool neg = false;
            if (g->i < g->n && g->s[g->i] == '^') neg = true, g->i++;
            size_t nelem = 0;
            for (;;) {
                if (g->i >= g->n) {
                    g->i = open;
                    gsyntax(g, "an unterminated character class");
                    break;
                }
                if (g->s[g->i] == ']') {
                    g->i++;
                    break;
                }
                uint32_t lo, hi;
                if (parse_char(g, &lo)) break;
                hi = lo;
                if (g->i + 1 < g->n && g->s[g->i] == '-' && g->s[g->i + 1] != ']') {
                    g->i++;
                    if (parse_char(g, &hi)) break;
                    if (hi < lo) {
                        gsyntax(g, "a reversed range in a character class");
                        break;
                    }
                }
                nelem++;
                if (cps_add(&g->nodes[item].set, lo, hi)) nomem(g);
            }
            if (!g->err && nelem == 0) {
                g->i = open;
                gsyntax(g, "an empty character class");
            }
            if (!g->err && neg && cps_negate(&g->nodes[item].set)) nomem(g);
            if (!g->err && cps_subtract(&g->nodes[item].set, 0xD800, 0xDFFF)) nomem(g);
            skip_space(g, nested);
        } else if (c == '<' || c == '!') {
            gsyntax(g, "token references (<...>, !<...>) are not supported: the grammar must "
                       "describe text");
        } else if (is_word(c)) {
            size_t at = g->i;
            while (g->i < g->n && is_word(g->s[g->i])) g->i++;
            uint32_t r = rule_get(g, g->s + at, g->i - at);
            item = node_new(g, G_REF);
            if (!g->err) {
                g->nodes[item].rule = r;
                if (!g->rules[r].line_ref) g->rules[r].line_ref = line_at(g, at);
            }
            skip_space(g, nested);
        } else if (c == '(') {
            g->i++;
            skip_space(g, true);
            if (++g->depth > G_MAX_DEPTH) {
                gsyntax(g, "groups nested too deeply");
                break;
            }
            item = parse_alts(g, true);
            g->depth--;
            if (g->err) break;
            if (g->i >= g->n || g->s[g->i] != ')') {
                gsyntax(g, "expecting ')'");
                break;
            }
            g->i++;
            skip_space(g, nested);
        } else if (c == '.') {
            g->i++;
            item = node_new(g, G_CPS);
            if (!g->err && (cps_add(&g->nodes[item].set, 0, 0xD7FF) ||
                            cps_add(&g->nodes[item].set, 0xE000, CST_MAX_CP)))
                nomem(g);
            skip_space(g, nested);
        } else if (c == '*' || c == '+' || c == '?') {
            g->i++;
            skip_space(g, nested);
            rep = true;
            min = c == '+';
            max = c == '?' ? 1 : G_UNBOUNDED;
        } else if (c == '{') {
            g->i++;
            skip_space(g, nested);
            rep = true;
            if (parse_count(g, &min)) break;
            skip_space(g, nested);
            if (g->i < g->n && g->s[g->i] == '}') {
                max = min;
            } else if (g->i < g->n && g->s[g->i] == ',') {
                g->i++;
                skip_space(g, nested);
                if (g->i < g->n && g->s[g->i] >= '0' && g->s[g->i] <= '9') {
                    if (parse_count(g, &max)) break;
                    skip_space(g, nested);
                }
                if (g->i >= g->n || g->s[g->i] != '}') {
                    gsyntax(g, "expecting '}'");
                    break;
                }
            } else {
                gsyntax(g, "expecting ',' or '}'");
                break;
            }
            g->i++;
            skip_space(g, nested);
            if (max != G_UNBOUNDED && max < min) {
                gsyntax(g, "a repeat whose maximum is below its minimum");
                break;
            }
        } else
            break;
        if (g->err) break;
        if (!rep) {
            reps = 0;
            kid_add(g, seq, item);
            continue;
        }
        g_node *s = &g->nodes[seq];
        if (s->nkids == 0) {
            gsyntax(g, "a repeat with nothing before it to repeat");
            break;
        }
        if (++reps > G_MAX_DEPTH) {
            gsyntax(g, "too many stacked repeats");
            break;
        }
        uint32_t last = s->kids[s->nkids - 1];
        uint32_t r = node_new(g, G_REP);
        if (g->err) break;
        g->nodes[r].min = min;
        g->nodes[r].max = max;
        kid_add(g, r, last);
        g->nodes[seq].kids[g->nodes[seq].nkids - 1] = r;
    }
    return g->err ? G_NONE : seq;
}

static uint32_t parse_alts(g_parser *g, bool nested)
{
    uint32_t alt = node_new(g, G_ALT);
    kid_add(g, alt, parse_seq(g, nested));
    while (!g->err && g->i < g->n && g->s[g->i] == '|') {
        g->i++;
        skip_space(g, true);
        kid_add(g, alt, parse_seq(g, nested));
    }
    return g->err ? G_NONE : alt;
}

static void parse_rule(g_parser *g)
{
    size_t at = g->i;
    g->cur = G_NONE;
    while (g->i < g->n && is_word(g->s[g->i])) g->i++;
    if (g->i == at) return gsyntax(g, "expecting a rule name");
    uint32_t r = rule_get(g, g->s + at, g->i - at);
    if (g->err) return;
    skip_space(g, false);
    if (g->i + 3 > g->n || memcmp(g->s + g->i, "::=", 3)) {
        g->cur = r;
        return gsyntax(g, "expecting '::=' after the rule name");
    }
    if (g->rules[r].body != G_NONE)
        return gfail(g, -EINVAL, "gbnf: line %u: rule '%.*s' is defined twice (first at line %u)",
                     line_at(g, at), (int)g->rules[r].nlen, g->rules[r].name, g->rules[r].line_def);
    g->rules[r].line_def = line_at(g, at);
    g->i += 3;
    skip_space(g, true);
    g->cur = r;
    uint32_t body = parse_alts(g, false);
    if (g->err) return;
    g->rules[r].body = body;
    if (g->i < g->n) {
        if (g->s[g->i] == '\r')
            g->i += g->i + 1 < g->n && g->s[g->i + 1] == '\n' ? 2 : 1;
        else if (g->s[g->i] == '\n')
            g->i++;
        else if (g->s[g->i] == ')')
            return gsyntax(g, "an unmatched ')'");
        else
            return gsyntax(g, "expecting a newline or the end after the rule");
    }
    skip_space(g, true);
}

/* ---- analysis -------------------------------------------------------------------------- */

static bool node_nullable(const g_parser *g, uint32_t x)
{
    const g_node *d = &g->nodes[x];
    switch (d->kind) {
    case G_CPS: return false;
    case G_LIT: return d->nlit == 0;
    case G_SEQ:
        for (size_t k = 0; k < d->nkids; k++)
            if (!node_nullable(g, d->kids[k])) return false;
        return true;
    case G_ALT:
        for (size_t k = 0; k < d->nkids; k++)
            if (node_nullable(g, d->kids[k])) return true;
        return false;
    case G_REP: return d->min == 0 || node_nullable(g, d->kids[0]);
    default: return g->rules[d->rule].nullable;
    }
}

static bool node_productive(g_parser *g, uint32_t x)
{
    const g_node *d = &g->nodes[x];
    switch (d->kind) {
    case G_CPS: return d->set.n > 0;
    case G_LIT: return true;
    case G_SEQ:
        for (size_t k = 0; k < d->nkids; k++)
            if (!node_productive(g, d->kids[k])) return false;
        return true;
    case G_ALT:
        for (size_t k = 0; k < d->nkids; k++)
            if (node_productive(g, d->kids[k])) return true;
        return false;
    case G_REP: return d->min == 0 || node_productive(g, d->kids[0]);
    default: return g->rules[d->rule].productive;
    }
}

static void left_refs(g_parser *g, g_rule *r, uint32_t x)
{
    const g_node *d = &g->nodes[x];
    switch (d->kind) {
    case G_SEQ:
        for (size_t k = 0; k < d->nkids; k++) {
            left_refs(g, r, d->kids[k]);
            if (!node_nullable(g, d->kids[k])) break;
        }
        break;
    case G_ALT:
        for (size_t k = 0; k < d->nkids; k++) left_refs(g, r, d->kids[k]);
        break;
    case G_REP: left_refs(g, r, d->kids[0]); break;
    case G_REF:
        if (r->nleft == r->leftcap) {
            size_t c = r->leftcap ? r->leftcap * 2 : 4;
            uint32_t *nl = realloc(r->left, c * sizeof *nl);
            if (!nl) return nomem(g);
            r->left = nl;
            r->leftcap = c;
        }
        r->left[r->nleft++] = d->rule;
        break;
    default: break;
    }
}

static void mark_reachable(g_parser *g, uint32_t x, uint32_t *stack, size_t *sp)
{
    const g_node *d = &g->nodes[x];
    if (d->kind == G_REF) {
        if (!g->rules[d->rule].reachable) {
            g->rules[d->rule].reachable = true;
            stack[(*sp)++] = d->rule;
        }
        return;
    }
    for (size_t k = 0; k < d->nkids; k++) mark_reachable(g, d->kids[k], stack, sp);
}

/* Left recursion: a cycle of "left" edges, found by one iterative depth-first search. */
static void check_left_recursion(g_parser *g)
{
    size_t nr = g->nr;
    uint8_t *color = calloc(nr, 1); /* 0 new, 1 on the path, 2 done */
    uint32_t *path = malloc(nr * sizeof *path);
    size_t *at = malloc(nr * sizeof *at);
    if (!color || !path || !at) {
        nomem(g);
        goto out;
    }
    for (size_t s = 0; s < nr && !g->err; s++) {
        if (color[s]) continue;
        size_t sp = 0;
        path[sp] = (uint32_t)s, at[sp++] = 0, color[s] = 1;
        while (sp && !g->err) {
            g_rule *r = &g->rules[path[sp - 1]];
            if (at[sp - 1] == r->nleft) {
                color[path[--sp]] = 2;
                continue;
            }
            uint32_t t = r->left[at[sp - 1]++];
            if (color[t] == 0) {
                path[sp] = t, at[sp++] = 0, color[t] = 1;
            } else if (color[t] == 1) {
                /* the cycle is path[k..sp), path[k] == t */
                size_t k = sp;
                while (k > 0 && path[k - 1] != t) k--;
                k = k ? k - 1 : 0;
                g_rule *x = &g->rules[path[k]];
                gfail(g, -EINVAL,
                      "gbnf: line %u: left recursion: rule '%.*s' can reach itself before "
                      "consuming any input (not supported, as in llama.cpp; write it with a "
                      "repeat, e.g. expr ::= term (\"+\" term)*)",
                      x->line_def, (int)x->nlen, x->name);
            }
        }
    }
out:
    free(color);
    free(path);
    free(at);
}

static void analyse(g_parser *g, uint32_t root)
{
    for (size_t r = 0; r < g->nr && !g->err; r++)
        if (g->rules[r].body == G_NONE)
            gfail(g, -EINVAL, "gbnf: line %u: undefined rule '%.*s'", g->rules[r].line_ref,
                  (int)g->rules[r].nlen, g->rules[r].name);
    if (g->err) return;
    uint64_t work = 0;
    for (bool changed = true; changed;) {
        changed = false;
        /* a round visits every rule's body: a grammar whose rules resolve one per round
         * (a long chain in the wrong order) costs rules x nodes; bounded */
        if ((work += g->nn + g->nr) > CST_MAX_COMPILE_WORK)
            return gfail(g, -E2BIG,
                         "gbnf: the grammar is too costly to analyse: over %u steps finding "
                         "its nullable and productive rules (%zu rules); refused rather than "
                         "compiled without bound",
                         CST_MAX_COMPILE_WORK, g->nr);
        for (size_t r = 0; r < g->nr; r++) {
            g_rule *x = &g->rules[r];
            if (!x->nullable && node_nullable(g, x->body)) x->nullable = changed = true;
            if (!x->productive && node_productive(g, x->body)) x->productive = changed = true;
        }
    }
    for (size_t r = 0; r < g->nr && !g->err; r++) left_refs(g, &g->rules[r], g->rules[r].body);
    check_left_recursion(g);
    if (g->err) return;
    if (!g->rules[root].productive)
        return gfail(g, -EINVAL,
                     "gbnf: line %u: rule 'root' matches no finite text (a recursion with no "
                     "base case?)",
                     g->rules[root].line_def);
    uint32_t *stack = malloc(g->nr * sizeof *stack);
    if (!stack) return nomem(g);
    size_t sp = 0;
    g->rules[root].reachable = true;
    stack[sp++] = root;
    while (sp) {
        uint32_t r = stack[--sp];
        mark_reachable(g, g->rules[r].body, stack, &sp);
    }
    free(stack);
}

/* ---- emission -------------------------------------------------------------------------- */

static uint32_t emit(g_parser *g, cst_prog *p, uint32_t x, uint32_t ret_pc, uint32_t next)
{
    if (p->failed) return 0;
    g_node *d = &g->nodes[x];
    switch (d->kind) {
    case G_CPS:
        if (cps_empty(&d->set)) return 0;
        return prog_cps(p, &d->set, false, next);
    case G_LIT: return prog_lit(p, d->lit, d->nlit, next);
    case G_SEQ:
        for (size_t k = d->nkids; k-- > 0;) next = emit(g, p, d->kids[k], ret_pc, next);
        return next;
    case G_ALT: {
        if (d->nkids == 1) return emit(g, p, d->kids[0], ret_pc, next);
        uint32_t *e = malloc(d->nkids * sizeof *e);
        if (!e) return prog_fail(p, -ENOMEM, "out of memory");
        for (size_t k = 0; k < d->nkids; k++) e[k] = emit(g, p, d->kids[k], ret_pc, next);
        uint32_t pc = prog_alts(p, e, d->nkids);
        free(e);
        return pc;
    }
    case G_REF: {
        uint32_t entry = g->rules[d->rule].entry;
        /* a call in tail position returns straight to the caller's caller: a jump */
        if (next == ret_pc) return prog_emit(p, OP_JMP, entry, 0);
        return prog_emit(p, OP_CALL, entry, next);
    }
    default: { /* G_REP */
        uint32_t kid = d->kids[0], min = d->min, max = d->max;
        if (max == G_UNBOUNDED) {
            uint32_t loop = prog_split(p, 0, next);
            if (p->failed) return 0;
            uint32_t body = emit(g, p, kid, ret_pc, loop);
            prog_patch(p, loop, body);
            uint32_t pc = min ? body : loop; /* S{m,} is S^(m-1) S+ */
            for (uint32_t k = 1; k < min && !p->failed; k++) pc = emit(g, p, kid, ret_pc, pc);
            return pc;
        }
        uint32_t pc = next;
        for (uint32_t k = min; k < max && !p->failed; k++)
            pc = prog_split(p, emit(g, p, kid, ret_pc, pc), next);
        for (uint32_t k = 0; k < min && !p->failed; k++) pc = emit(g, p, kid, ret_pc, pc);
        return pc;
    }
    }
}

int cst_compile_gbnf(const char *src, size_t len, cst_grammar **out, char *err, size_t errlen)
{
    char dummy[8];
    if (!err) err = dummy, errlen = sizeof dummy;
    *out = NULL;
    if (errlen) err[0] = 0;
    if (len > CST_MAX_SOURCE_BYTES) {
        snprintf(err, errlen, "gbnf: grammar too large: %zu bytes (at most %u)", len,
                 CST_MAX_SOURCE_BYTES);
        return -E2BIG;
    }
    if (len && memchr(src, 0, len)) {
        snprintf(err, errlen, "gbnf: the grammar contains a NUL byte");
        return -EINVAL;
    }
    g_parser g = {.s = src ? src : "", .n = src ? len : 0, .cur = G_NONE};
    cst_prog p;
    bool have_prog = false;
    skip_space(&g, true);
    while (!g.err && g.i < g.n) parse_rule(&g);
    uint32_t root = G_NONE;
    if (!g.err) {
        g.cur = G_NONE;
        for (size_t r = 0; r < g.nr; r++)
            if (g.rules[r].nlen == 4 && !memcmp(g.rules[r].name, "root", 4) &&
                g.rules[r].body != G_NONE)
                root = (uint32_t)r;
        if (root == G_NONE && g.nr == 0)
            gfail(&g, -EINVAL, "gbnf: the grammar has no rules (it needs a rule named 'root')");
        else if (root == G_NONE)
            gfail(&g, -EINVAL, "gbnf: no rule named 'root' (the start of the grammar)");
    }
    if (!g.err) analyse(&g, root);
    int rc = g.err;
    if (!rc) {
        rc = prog_init(&p);
        have_prog = rc == 0;
    }
    if (!rc) {
        for (size_t r = 0; r < g.nr; r++)
            if (g.rules[r].reachable) g.rules[r].entry = prog_emit(&p, OP_JMP, 0, 0);
        uint32_t ret_pc = prog_emit(&p, OP_RET, 0, 0);
        uint32_t match_pc = prog_emit(&p, OP_MATCH, 0, 0);
        p.start = prog_emit(&p, OP_CALL, g.rules[root].entry, match_pc);
        for (size_t r = 0; r < g.nr && !p.failed; r++)
            if (g.rules[r].reachable)
                prog_patch(&p, g.rules[r].entry, emit(&g, &p, g.rules[r].body, ret_pc, ret_pc));
        have_prog = false;
        rc = cst_grammar_finish(&p, out, err, errlen);
    } else {
        snprintf(err, errlen, "%s", g.msg[0] ? g.msg : "gbnf: out of memory");
    }
    if (have_prog) prog_release(&p);
    for (size_t k = 0; k < g.nn; k++) {
        cps_free(&g.nodes[k].set);
        free(g.nodes[k].lit);
        free(g.nodes[k].kids);
    }
    free(g.nodes);
    for (size_t r = 0; r < g.nr; r++) {
        free(g.rules[r].left);
    }
    free(g.rules);
    free(g.rhash);
    return rc;
}
