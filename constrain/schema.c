/* SPDX-License-Identifier: MIT */
/*
 * constrain/schema.c — JSON Schema, JSON values, regexes and choices to programs.
 *
 * The one rule: every text the program accepts validates against the schema. Where exact
 * enforcement is out of reach the compiler either refuses (a compile error naming the
 * keyword and its JSON pointer) or is stricter than the schema, in ways a generator does
 * not mind and an instance written by json.dumps mostly meets:
 *   - object properties come in the schema's order, then any additional ones;
 *   - strings are written as json.dumps(ensure_ascii=False) writes them (one form per
 *     string, which also makes "a key other than these names" exact);
 *   - integers and bounded numbers without exponent, no "-0"; integer means no fraction;
 *   - non-integer bounds are rounded inwards; maxLength / maxItems above 1000 count as 1000;
 *   - formats as conservative regular expressions (e.g. Feb 29 refused in a date).
 * Composition: allOf and a $ref with sibling keywords are merged into one schema (keyword
 * by keyword, refusing what does not merge); anyOf / oneOf distribute the sibling keywords
 * into each alternative; oneOf is accepted only where its alternatives provably exclude
 * each other (different JSON types; for objects, a required property with disjoint const /
 * enum / types, or a key one requires and the other cannot have), since a union of
 * overlapping alternatives would let "matches two" through.
 */
#include "constrain/cst.h"
#include "constrain/prog.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SC_MAX_COUNT 1000 /* maxLength / maxItems beyond this count as this */
#define SC_MAX_MIN   2000 /* minLength / minItems beyond this: too large */
#define SC_MAX_DEPTH 100  /* nested schemas, merges */
#define SC_MAX_ALTS  256  /* alternatives after distributing a merge */

typedef struct sc_sub {
    json_t *schema;
    uint32_t entry;
} sc_sub;

typedef struct sc_ctx {
    cst_prog *p;
    json_t *root;
    json_t *keep; /* merged schemas made here, kept alive until the end */
    sc_sub *subs;
    size_t nsubs, subcap;
    uint32_t any_sub, str_sub, char_sub;
    int depth;
    bool py;     /* Python literals: None, True, False for null, true, false */
    bool kwargs; /* the next object is a call's keyword arguments: (k=v, ...) */
} sc_ctx;

enum {
    T_NULL = 1,
    T_BOOL = 2,
    T_OBJ = 4,
    T_ARR = 8,
    T_STR = 16,
    T_NUM = 32,
    T_INT = 64,
    T_ALL = 127
};

static uint32_t sc_value(sc_ctx *c, json_t *s, const char *ptr, uint32_t next);

static uint32_t sc_err(sc_ctx *c, const char *ptr, const char *kw, const char *what)
{
    return prog_fail(c->p, -EINVAL, "keyword '%s' at %s: %s", kw, *ptr ? ptr : "/", what);
}

/* JSON pointer of a child: ptr + "/" + escaped key */
static void ptr_child(char *out, size_t cap, const char *ptr, const char *key)
{
    size_t u = (size_t)snprintf(out, cap, "%s/", ptr);
    for (const char *k = key; *k && u + 3 < cap; k++) {
        if (*k == '~')
            out[u++] = '~', out[u++] = '0';
        else if (*k == '/')
            out[u++] = '~', out[u++] = '1';
        else
            out[u++] = *k;
    }
    out[u < cap ? u : cap - 1] = 0;
}

static void ptr_index(char *out, size_t cap, const char *ptr, const char *key, size_t i)
{
    snprintf(out, cap, "%s/%s/%zu", ptr, key, i);
}

/* ---- keywords ------------------------------------------------------------------------ */

/* Keywords of the compiler's own, which only `not` writes into the schemas it builds (their
 * names start with a control character no real schema uses; one that did would only be
 * stricter): a number with a fraction that is not zero (not an integer), a string other than
 * the listed ones, a string that matches none of the listed patterns. */
#define KW_NONINT  "\x01nonint"
#define KW_NOTSTRS "\x01notstrs"
#define KW_NOTPATS "\x01notpats"
#define KW_NOTMULT "\x01notmult" /* an integer that is a multiple of none of these */

/* keywords that constrain instances (every draft): what is not one of these, nor handled,
 * is an annotation or unknown, which validators ignore too */
static const char *const assertions[] = {"type",
                                         "enum",
                                         "const",
                                         "multipleOf",
                                         "maximum",
                                         "exclusiveMaximum",
                                         "minimum",
                                         "exclusiveMinimum",
                                         "maxLength",
                                         "minLength",
                                         "pattern",
                                         "maxItems",
                                         "minItems",
                                         "uniqueItems",
                                         "maxContains",
                                         "minContains",
                                         "contains",
                                         "maxProperties",
                                         "minProperties",
                                         "required",
                                         "dependentRequired",
                                         "dependencies",
                                         "properties",
                                         "patternProperties",
                                         "additionalProperties",
                                         "propertyNames",
                                         "items",
                                         "prefixItems",
                                         "additionalItems",
                                         "unevaluatedItems",
                                         "unevaluatedProperties",
                                         "allOf",
                                         "anyOf",
                                         "oneOf",
                                         "not",
                                         "if",
                                         "dependentSchemas",
                                         "$ref",
                                         "$dynamicRef",
                                         "$recursiveRef",
                                         "format",
                                         "disallow",
                                         "extends",
                                         "divisibleBy",
                                         KW_NONINT,
                                         KW_NOTSTRS,
                                         KW_NOTPATS,
                                         KW_NOTMULT,
                                         NULL};

static bool in_list(const char *const *l, const char *k)
{
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

static bool is_assertion(const char *k)
{
    return in_list(assertions, k);
}

/* whether s has any assertion keyword besides the ones in except */
static bool has_assertions_besides(json_t *s, const char *const *except)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v)
    {
        if (is_assertion(k) && !(except && in_list(except, k))) return true;
    }
    return false;
}

/* ---- $ref ------------------------------------------------------------------------------ */

static json_t *sc_resolve(sc_ctx *c, const char *ref, const char *ptr)
{
    const char *frag = ref;
    if (ref[0] != '#') {
        /* "<root $id>#..." is local; anything else is remote */
        json_t *id = json_object_get(c->root, "$id");
        if (!id) id = json_object_get(c->root, "id");
        const char *hash = strchr(ref, '#');
        size_t base = hash ? (size_t)(hash - ref) : strlen(ref);
        if (!json_is_string(id) || strlen(json_string_value(id)) < base ||
            strncmp(json_string_value(id), ref, base) ||
            (json_string_value(id)[base] && strcmp(json_string_value(id) + base, "#")))
            return sc_err(c, ptr, "$ref", "only local references (#...) are supported"), NULL;
        frag = hash ? hash : "#";
    }
    frag++;
    json_t *cur = c->root;
    if (*frag && *frag != '/') return sc_err(c, ptr, "$ref", "anchors are not supported"), NULL;
    char tok[512];
    while (*frag == '/') {
        frag++;
        size_t u = 0;
        while (*frag && *frag != '/' && u + 1 < sizeof tok) {
            char ch = *frag++;
            if (ch == '~' && *frag == '0')
                ch = '~', frag++;
            else if (ch == '~' && *frag == '1')
                ch = '/', frag++;
            else if (ch == '%' && frag[0] && frag[1]) {
                int h1 = frag[0], h2 = frag[1];
                int v1 = h1 >= 'a' ? h1 - 'a' + 10 : h1 >= 'A' ? h1 - 'A' + 10 : h1 - '0';
                int v2 = h2 >= 'a' ? h2 - 'a' + 10 : h2 >= 'A' ? h2 - 'A' + 10 : h2 - '0';
                if (v1 >= 0 && v1 < 16 && v2 >= 0 && v2 < 16) ch = (char)(v1 * 16 + v2), frag += 2;
            }
            tok[u++] = ch;
        }
        tok[u] = 0;
        if (json_is_object(cur))
            cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) {
            char *end;
            long i = strtol(tok, &end, 10);
            cur = *end || i < 0 ? NULL : json_array_get(cur, (size_t)i);
        } else
            cur = NULL;
        if (!cur) return sc_err(c, ptr, "$ref", "the reference points at nothing"), NULL;
    }
    if (!json_is_object(cur) && !json_is_boolean(cur))
        return sc_err(c, ptr, "$ref", "the reference is not a schema"), NULL;
    return cur;
}

/* A CALL to the subroutine for schema s (compiled once; recursion goes through here). */
static uint32_t sc_call(sc_ctx *c, json_t *s, const char *ptr, uint32_t next)
{
    if (c->p->failed) return 0;
    for (size_t i = 0; i < c->nsubs; i++)
        if (c->subs[i].schema == s) return prog_emit(c->p, OP_CALL, c->subs[i].entry, next);
    if (c->nsubs == c->subcap) {
        size_t cap = c->subcap ? c->subcap * 2 : 16;
        sc_sub *ns = realloc(c->subs, cap * sizeof *ns);
        if (!ns) return prog_fail(c->p, -ENOMEM, "out of memory");
        c->subs = ns;
        c->subcap = cap;
    }
    uint32_t entry = prog_emit(c->p, OP_JMP, 0, 0);
    if (c->p->failed) return 0;
    c->subs[c->nsubs++] = (sc_sub){s, entry};
    uint32_t ret = prog_emit(c->p, OP_RET, 0, 0);
    uint32_t body = sc_value(c, s, ptr, ret);
    if (c->p->failed) return 0;
    prog_patch(c->p, entry, body);
    return prog_emit(c->p, OP_CALL, entry, next);
}

/* ---- literals (const, enum) ------------------------------------------------------------ */

/* Python's repr() of a float: the shortest digits that round-trip, fixed notation for
 * 1e-4 <= |x| < 1e16 (with ".0" when integral), else d.ddde[+-]XX. */
int cst_py_float_repr(double x, char *out, size_t cap)
{
    if (!isfinite(x)) return -EINVAL;
    char buf[64];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    bool neg = buf[0] == '-';
    char *m = buf + neg;
    char *e = strchr(m, 'e');
    int exp10 = atoi(e + 1);
    char digits[32];
    size_t nd = 0;
    for (char *q = m; q < e; q++)
        if (*q != '.') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    size_t u = 0;
    if (neg) out[u++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            u += (size_t)snprintf(out + u, cap - u, "0.");
            for (int k = 0; k < -exp10 - 1; k++) out[u++] = '0';
            u += (size_t)snprintf(out + u, cap - u, "%s", digits);
        } else {
            for (int k = 0; k <= exp10; k++) out[u++] = (size_t)k < nd ? digits[k] : '0';
            out[u++] = '.';
            if ((size_t)exp10 + 1 < nd)
                u += (size_t)snprintf(out + u, cap - u, "%s", digits + exp10 + 1);
            else
                out[u++] = '0';
            out[u] = 0;
        }
    } else {
        out[u++] = digits[0];
        if (nd > 1) {
            out[u++] = '.';
            u += (size_t)snprintf(out + u, cap - u, "%s", digits + 1);
        }
        snprintf(out + u, cap - u, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
    return 0;
}

static uint32_t sc_lit_str(sc_ctx *c, const char *s, size_t n, uint32_t next)
{
    char *b = NULL;
    size_t len = 0, cap = 0;
    int rc = cst_json_quote(s, n, &b, &len, &cap);
    uint32_t pc =
        rc ? prog_fail(c->p, rc, "a string that is not UTF-8") : prog_lit(c->p, b, len, next);
    free(b);
    return pc;
}

/* null, true or false (which 0, 1, 2), or Python's None, True, False */
static uint32_t lit_word(sc_ctx *c, int which, uint32_t next)
{
    static const char *const js[] = {"null", "true", "false"}, *const py[] = {"None", "True",
                                                                              "False"};
    const char *w = c->py ? py[which] : js[which];
    return prog_lit(c->p, w, strlen(w), next);
}

/* A JSON value exactly (free whitespace between its tokens). */
static uint32_t sc_literal(sc_ctx *c, json_t *v, uint32_t next)
{
    char buf[64];
    switch (json_typeof(v)) {
    case JSON_NULL: return lit_word(c, 0, next);
    case JSON_TRUE: return lit_word(c, 1, next);
    case JSON_FALSE: return lit_word(c, 2, next);
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        return prog_lit(c->p, buf, strlen(buf), next);
    case JSON_REAL:
        if (cst_py_float_repr(json_real_value(v), buf, sizeof buf))
            return prog_fail(c->p, -EINVAL, "a number that is not finite");
        return prog_lit(c->p, buf, strlen(buf), next);
    case JSON_STRING: return sc_lit_str(c, json_string_value(v), json_string_length(v), next);
    case JSON_ARRAY: {
        uint32_t pc = prog_ws(c->p, prog_lit(c->p, "]", 1, next));
        for (size_t i = json_array_size(v); i-- > 0;) {
            pc = sc_literal(c, json_array_get(v, i), pc);
            if (i) pc = prog_ws(c->p, prog_lit(c->p, ",", 1, prog_ws(c->p, pc)));
        }
        return prog_lit(c->p, "[", 1, prog_ws(c->p, pc));
    }
    case JSON_OBJECT: {
        size_t n = json_object_size(v), i = 0;
        const char **keys = calloc(n + 1, sizeof *keys);
        if (!keys) return prog_fail(c->p, -ENOMEM, "out of memory");
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) keys[i++] = k;
        uint32_t pc = prog_ws(c->p, prog_lit(c->p, "}", 1, next));
        for (size_t j = n; j-- > 0;) {
            pc = sc_literal(c, json_object_get(v, keys[j]), pc);
            pc = prog_lit(c->p, ":", 1, prog_ws(c->p, pc));
            pc = sc_lit_str(c, keys[j], strlen(keys[j]), prog_ws(c->p, pc));
            if (j) pc = prog_ws(c->p, prog_lit(c->p, ",", 1, prog_ws(c->p, pc)));
        }
        free(keys);
        return prog_lit(c->p, "{", 1, prog_ws(c->p, pc));
    }
    }
    return 0;
}

/* ---- types ----------------------------------------------------------------------------- */

static int type_bit(const char *t)
{
    static const struct {
        const char *name;
        int bit;
    } tt[] = {{"null", T_NULL},  {"boolean", T_BOOL}, {"object", T_OBJ}, {"array", T_ARR},
              {"string", T_STR}, {"number", T_NUM},   {"integer", T_INT}};
    for (size_t i = 0; i < sizeof tt / sizeof tt[0]; i++)
        if (!strcmp(tt[i].name, t)) return tt[i].bit;
    return 0;
}

/* the types a schema's `type` allows (T_ALL without one); -1 on a bad value */
static int sc_types(json_t *s)
{
    json_t *t = json_object_get(s, "type");
    if (!t) return T_ALL;
    if (json_is_string(t)) return type_bit(json_string_value(t)) ?: -1;
    if (!json_is_array(t)) return -1;
    int m = 0;
    size_t i;
    json_t *x;
    json_array_foreach(t, i, x)
    {
        if (!json_is_string(x) || !type_bit(json_string_value(x))) return -1;
        m |= type_bit(json_string_value(x));
    }
    return m;
}

static int value_type(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_NULL: return T_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return T_BOOL;
    case JSON_OBJECT: return T_OBJ;
    case JSON_ARRAY: return T_ARR;
    case JSON_STRING: return T_STR;
    case JSON_INTEGER: return T_INT | T_NUM;
    case JSON_REAL: {
        double d = json_real_value(v);
        return T_NUM | (d == floor(d) && fabs(d) < 1e18 ? T_INT : 0);
    }
    }
    return 0;
}

/* whether value v is allowed by a type mask (integer: a number with no fraction) */
static bool type_allows(int types, json_t *v)
{
    int vt = value_type(v);
    if (vt & T_NUM) return (types & T_NUM) || ((types & T_INT) && (vt & T_INT));
    return (types & vt) != 0;
}

/* ---- merging (allOf, $ref with siblings, anyOf/oneOf distribution) ---------------------- */

static json_t *sc_merge(sc_ctx *c, json_t *a, json_t *b, const char *ptr);

/* s with its $ref (when alone) resolved, and allOf / $ref-with-siblings merged away */
static json_t *sc_flatten(sc_ctx *c, json_t *s, const char *ptr)
{
    for (int hops = 0; json_is_object(s); hops++) {
        if (c->p->failed) return NULL;
        if (hops > SC_MAX_DEPTH)
            return sc_err(c, ptr, "$ref", "references nested too deeply"), NULL;
        json_t *ref = json_object_get(s, "$ref");
        json_t *all = json_object_get(s, "allOf");
        if (!ref && !all) return s;
        json_t *rest = json_object();
        json_object_update(rest, s);
        json_object_del(rest, "$ref");
        json_object_del(rest, "allOf");
        json_array_append_new(c->keep, rest);
        json_t *acc = rest;
        if (ref) {
            if (!json_is_string(ref)) return sc_err(c, ptr, "$ref", "not a string"), NULL;
            json_t *t = sc_resolve(c, json_string_value(ref), ptr);
            if (!t) return NULL;
            acc = has_assertions_besides(rest, NULL) ? sc_merge(c, t, rest, ptr) : t;
            if (!acc) return NULL;
        }
        if (all) {
            if (!json_is_array(all) || !json_array_size(all))
                return sc_err(c, ptr, "allOf", "not a non-empty array of schemas"), NULL;
            size_t i;
            json_t *x;
            json_array_foreach(all, i, x)
            {
                acc = sc_merge(c, acc, x, ptr);
                if (!acc) return NULL;
            }
        }
        s = acc;
    }
    return s;
}

static bool bool_schema_true(json_t *s)
{
    return json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0);
}

/* true, {} or a schema of annotations only */
static bool is_true_schema(json_t *s)
{
    return bool_schema_true(s) || (json_is_object(s) && !has_assertions_besides(s, NULL));
}

static json_t *merge_schema_kw(sc_ctx *c, json_t *x, json_t *y, const char *ptr)
{
    if (!x) return y;
    if (!y) return x;
    return sc_merge(c, x, y, ptr);
}

static json_t *sc_merge(sc_ctx *c, json_t *a, json_t *b, const char *ptr)
{
    if (c->p->failed) return NULL;
    if (++c->depth > SC_MAX_DEPTH) {
        c->depth--;
        return sc_err(c, ptr, "allOf", "merges nested too deeply (a recursive reference?)"), NULL;
    }
    json_t *out = NULL;
    a = sc_flatten(c, a, ptr);
    b = a ? sc_flatten(c, b, ptr) : NULL;
    if (!a || !b) goto done;
    if (json_is_false(a) || json_is_false(b)) {
        out = json_false();
        json_array_append_new(c->keep, out);
        goto done;
    }
    if (bool_schema_true(a)) {
        out = b;
        goto done;
    }
    if (bool_schema_true(b)) {
        out = a;
        goto done;
    }
    if (!json_is_object(a) || !json_is_object(b)) {
        sc_err(c, ptr, "allOf", "a schema that is not an object or a boolean");
        goto done;
    }
    out = json_object();
    json_array_append_new(c->keep, out);
    json_t *pa = json_object_get(a, "patternProperties"),
           *pb = json_object_get(b, "patternProperties");
    if ((pa && json_object_size(pa)) || (pb && json_object_size(pb))) {
        sc_err(c, ptr, "patternProperties", "not supported in a merge");
        out = NULL;
        goto done;
    }
    json_t *srcs[2] = {a, b};
    for (int side = 0; side < 2 && out; side++) {
        json_t *s = srcs[side], *o = srcs[!side];
        const char *k;
        json_t *v;
        json_object_foreach(s, k, v)
        {
            if (!is_assertion(k)) continue;
            json_t *w = json_object_get(o, k);
            if (!w) {
                if (!strcmp(k, "properties") || !strcmp(k, "additionalProperties")) continue;
                json_object_set(out, k, v);
                continue;
            }
            if (side == 1) continue; /* both sides: handled once */
            if (!strcmp(k, "properties") || !strcmp(k, "additionalProperties")) continue;
            if (!strcmp(k, "type")) {
                int ta = sc_types(a), tb = sc_types(b);
                if (ta < 0 || tb < 0) {
                    sc_err(c, ptr, "type", "not a type name or a list of them");
                    out = NULL;
                    break;
                }
                int t = ta & tb;
                if ((ta & T_INT) && (tb & T_NUM)) t |= T_INT;
                if ((tb & T_INT) && (ta & T_NUM)) t |= T_INT;
                json_t *arr = json_array();
                static const char *const names[] = {"null",   "boolean", "object", "array",
                                                    "string", "number",  "integer"};
                for (int i = 0; i < 7; i++)
                    if (t & (1 << i)) json_array_append_new(arr, json_string(names[i]));
                json_object_set_new(out, "type", arr);
            } else if (!strcmp(k, "required") || !strcmp(k, KW_NOTSTRS) || !strcmp(k, KW_NOTPATS) ||
                       !strcmp(k, KW_NOTMULT)) {
                json_t *r = json_array();
                json_array_extend(r, v);
                json_array_extend(r, w);
                json_object_set_new(out, k, r);
            } else if (!strcmp(k, "minLength") || !strcmp(k, "minItems") ||
                       !strcmp(k, "minProperties") || !strcmp(k, "maxLength") ||
                       !strcmp(k, "maxItems") || !strcmp(k, "maxProperties") ||
                       !strcmp(k, "minimum") || !strcmp(k, "maximum") ||
                       ((!strcmp(k, "exclusiveMinimum") || !strcmp(k, "exclusiveMaximum")) &&
                        json_is_number(v) && json_is_number(w))) {
                if (!json_is_number(v) || !json_is_number(w)) {
                    sc_err(c, ptr, k, "not a number");
                    out = NULL;
                    break;
                }
                bool is_min = !strncmp(k, "min", 3) || !strcmp(k, "exclusiveMinimum");
                double x = json_number_value(v), y = json_number_value(w);
                json_object_set(out, k, (is_min ? x >= y : x <= y) ? v : w);
            } else if (!strcmp(k, "enum")) {
                json_t *e = json_array();
                size_t i;
                json_t *x;
                json_array_foreach(v, i, x)
                {
                    size_t j;
                    json_t *y;
                    json_array_foreach(w, j, y) if (json_equal(x, y))
                    {
                        json_array_append(e, x);
                        break;
                    }
                }
                json_object_set_new(out, k, e);
            } else if (!strcmp(k, "const")) {
                if (!json_equal(v, w)) {
                    json_object_set_new(out, "enum", json_array()); /* nothing matches */
                } else
                    json_object_set(out, k, v);
            } else if (!strcmp(k, "items") && json_is_object(v) && json_is_object(w)) {
                json_t *m = sc_merge(c, v, w, ptr);
                if (!m) {
                    out = NULL;
                    break;
                }
                json_object_set(out, k, m);
            } else if (!strcmp(k, "anyOf")) {
                if (!json_is_array(v) || !json_is_array(w) ||
                    json_array_size(v) * json_array_size(w) > SC_MAX_ALTS) {
                    sc_err(c, ptr, "anyOf", "two anyOf in a merge with too many alternatives");
                    out = NULL;
                    break;
                }
                json_t *alts = json_array();
                size_t i, j;
                json_t *x, *y;
                json_array_foreach(v, i, x) json_array_foreach(w, j, y)
                {
                    json_t *m = sc_merge(c, x, y, ptr);
                    if (!m) break;
                    json_array_append(alts, m);
                }
                json_object_set_new(out, k, alts);
                if (c->p->failed) out = NULL;
            } else if (!strcmp(k, "not") && !json_equal(v, w)) {
                /* not A and not B: not (A or B) */
                json_object_set_new(out, k, json_pack("{s:[O,O]}", "anyOf", v, w));
            } else if (json_equal(v, w)) {
                json_object_set(out, k, v);
            } else {
                sc_err(c, ptr, k, "two different values in a merge (allOf)");
                out = NULL;
                break;
            }
        }
    }
    if (!out) goto done;
    /* properties, with each side's additionalProperties applied to the other's names */
    {
        json_t *propa = json_object_get(a, "properties"), *propb = json_object_get(b, "properties");
        json_t *adda = json_object_get(a, "additionalProperties"),
               *addb = json_object_get(b, "additionalProperties");
        if (propa || propb) {
            json_t *props = json_object();
            json_object_set_new(out, "properties", props);
            json_t *ps[2] = {propa, propb};
            for (int side = 0; side < 2; side++) {
                if (!json_is_object(ps[side])) continue;
                const char *k;
                json_t *v;
                json_object_foreach(ps[side], k, v)
                {
                    if (json_object_get(props, k)) continue;
                    json_t *x = propa ? json_object_get(propa, k) : NULL;
                    json_t *y = propb ? json_object_get(propb, k) : NULL;
                    if (!x) x = adda;
                    if (!y) y = addb;
                    json_t *m = merge_schema_kw(c, x, y, ptr);
                    if (!m) m = json_true();
                    if (c->p->failed) {
                        out = NULL;
                        goto done;
                    }
                    json_object_set(props, k, m);
                }
            }
        }
        if (adda || addb) {
            json_t *m = merge_schema_kw(c, adda, addb, ptr);
            if (!m) {
                out = NULL;
                goto done;
            }
            json_object_set(out, "additionalProperties", m);
        }
    }
done:
    c->depth--;
    return c->p->failed ? NULL : out;
}

/* ---- numbers --------------------------------------------------------------------------- */

/* the decimal digits of n (no leading zeros) */
static int u64_digits(uint64_t n, char *out)
{
    return snprintf(out, 24, "%llu", (unsigned long long)n);
}

static uint32_t digit_set(sc_ctx *c, char lo, char hi, uint32_t next)
{
    return prog_range(c->p, (uint8_t)lo, (uint8_t)hi, next);
}

/* every n-digit string between a and b (same length, a <= b) */
static uint32_t digits_between(sc_ctx *c, const char *a, const char *b, int n, uint32_t next)
{
    if (n == 0) return next;
    if (a[0] == b[0]) return digit_set(c, a[0], a[0], digits_between(c, a + 1, b + 1, n - 1, next));
    bool a_zeros = true, b_nines = true;
    for (int i = 1; i < n; i++) a_zeros &= a[i] == '0', b_nines &= b[i] == '9';
    if (a_zeros && b_nines) {
        uint32_t pc = next;
        for (int i = 1; i < n; i++) pc = digit_set(c, '0', '9', pc);
        return digit_set(c, a[0], b[0], pc);
    }
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)n);
    memset(zeros, '0', (size_t)n);
    uint32_t alts[3];
    size_t na = 0;
    alts[na++] = digit_set(c, a[0], a[0], digits_between(c, a + 1, nines, n - 1, next));
    if (b[0] - a[0] > 1) {
        uint32_t pc = next;
        for (int i = 1; i < n; i++) pc = digit_set(c, '0', '9', pc);
        alts[na++] = digit_set(c, (char)(a[0] + 1), (char)(b[0] - 1), pc);
    }
    alts[na++] = digit_set(c, b[0], b[0], digits_between(c, zeros, b + 1, n - 1, next));
    return prog_alts(c->p, alts, na);
}

/* the decimal form of every integer in [lo, hi] (hi UINT64_MAX: unbounded) */
static uint32_t uint_range(sc_ctx *c, uint64_t lo, uint64_t hi, uint32_t next)
{
    if (lo > hi) return 0;
    uint32_t alts[24];
    size_t na = 0;
    char a[24], b[24];
    int la = u64_digits(lo, a);
    int lmax = hi == UINT64_MAX ? la : u64_digits(hi, b);
    uint64_t p10 = 1;
    for (int i = 1; i < la; i++) p10 *= 10;
    for (int len = la; len <= lmax; len++, p10 *= 10) {
        uint64_t s = lo > p10 || len == 1 ? lo : p10;
        if (len > la) s = p10;
        uint64_t top = len >= 20 ? UINT64_MAX : p10 * 10 - 1;
        uint64_t e = hi < top ? hi : top;
        if (hi == UINT64_MAX) e = top;
        char x[24], y[24];
        u64_digits(s, x);
        u64_digits(e, y);
        if (s <= e && (int)strlen(x) == len && (int)strlen(y) == len)
            alts[na++] = digits_between(c, x, y, len, next);
        if (len >= 19) break;
    }
    if (hi == UINT64_MAX) { /* more digits than lo: [1-9][0-9]{la,} */
        uint32_t loop = prog_split(c->p, 0, next);
        prog_patch(c->p, loop, digit_set(c, '0', '9', loop));
        uint32_t pc = loop;
        for (int i = 0; i < la; i++) pc = digit_set(c, '0', '9', pc);
        alts[na++] = digit_set(c, '1', '9', pc);
    }
    return na ? prog_alts(c->p, alts, na) : 0;
}

typedef struct num_bounds {
    bool has_lo, has_hi;
    double lo, hi;
    bool lo_excl, hi_excl;
} num_bounds;

static int read_bounds(sc_ctx *c, json_t *s, const char *ptr, num_bounds *b)
{
    memset(b, 0, sizeof *b);
    json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
    json_t *emn = json_object_get(s, "exclusiveMinimum"),
           *emx = json_object_get(s, "exclusiveMaximum");
    if (mn && !json_is_number(mn)) return sc_err(c, ptr, "minimum", "not a number"), -1;
    if (mx && !json_is_number(mx)) return sc_err(c, ptr, "maximum", "not a number"), -1;
    if (mn) b->has_lo = true, b->lo = json_number_value(mn);
    if (mx) b->has_hi = true, b->hi = json_number_value(mx);
    if (json_is_boolean(emn))
        b->lo_excl = mn && json_is_true(emn);
    else if (json_is_number(emn)) {
        double v = json_number_value(emn);
        if (!b->has_lo || v >= b->lo) b->has_lo = true, b->lo = v, b->lo_excl = true;
    } else if (emn)
        return sc_err(c, ptr, "exclusiveMinimum", "not a number or a boolean"), -1;
    if (json_is_boolean(emx))
        b->hi_excl = mx && json_is_true(emx);
    else if (json_is_number(emx)) {
        double v = json_number_value(emx);
        if (!b->has_hi || v <= b->hi) b->has_hi = true, b->hi = v, b->hi_excl = true;
    } else if (emx)
        return sc_err(c, ptr, "exclusiveMaximum", "not a number or a boolean"), -1;
    if ((b->has_lo && fabs(b->lo) > 1e18) || (b->has_hi && fabs(b->hi) > 1e18))
        return sc_err(c, ptr, fabs(b->lo) > 1e18 ? "minimum" : "maximum",
                      "a bound beyond 1e18 is not supported"),
               -1;
    return 0;
}

/* the integers in the bounds, as [lo, hi] with INT64 limits for none; false when empty */
static bool int_bounds(const num_bounds *b, int64_t *lo, int64_t *hi)
{
    *lo = INT64_MIN;
    *hi = INT64_MAX;
    if (b->has_lo) {
        double v = ceil(b->lo);
        if (b->lo_excl && v == b->lo) v += 1;
        *lo = (int64_t)v;
    }
    if (b->has_hi) {
        double v = floor(b->hi);
        if (b->hi_excl && v == b->hi) v -= 1;
        *hi = (int64_t)v;
    }
    return *lo <= *hi;
}

static uint32_t int_range(sc_ctx *c, int64_t lo, int64_t hi, uint32_t next)
{
    uint32_t alts[2];
    size_t na = 0;
    if (hi >= 0)
        alts[na++] = uint_range(c, lo > 0 ? (uint64_t)lo : 0,
                                hi == INT64_MAX ? UINT64_MAX : (uint64_t)hi, next);
    if (lo < 0) {
        uint64_t mlo = hi >= 0 ? 1 : (uint64_t)(-(hi + 1)) + 1;
        uint64_t mhi = lo == INT64_MIN ? UINT64_MAX : (uint64_t)(-lo);
        alts[na++] = prog_lit(c->p, "-", 1, uint_range(c, mlo, mhi, next));
    }
    return na ? prog_alts(c->p, alts, na) : 0;
}

/* fractions: 0 any "(\.[0-9]+)?", 1 zero "(\.0+)?", 2 nonzero "\.[0-9]*[1-9][0-9]*" */
static uint32_t frac(sc_ctx *c, int kind, uint32_t next)
{
    cst_prog *p = c->p;
    if (kind == 2) {
        uint32_t tail = prog_split(p, 0, next);
        prog_patch(p, tail, digit_set(c, '0', '9', tail));
        uint32_t head = prog_split(p, 0, 0);
        uint32_t nz = digit_set(c, '1', '9', tail);
        {
            uint32_t d = digit_set(c, '0', '9', head);
            prog_patch(p, head, d);
            if (!p->failed) p->insts[head].b = nz;
        }
        return prog_lit(p, ".", 1, head);
    }
    char lo = kind == 1 ? '0' : '0', hi = kind == 1 ? '0' : '9';
    uint32_t loop = prog_split(p, 0, next);
    prog_patch(p, loop, digit_set(c, lo, hi, loop));
    return prog_split(p, prog_lit(p, ".", 1, digit_set(c, lo, hi, loop)), next);
}

/*
 * Non-negative decimals y (no exponent) with lo <= y <= hi, either end exclusive, hi < 0:
 * none. Stricter than exact where a bound is not an integer (rounded inwards).
 */
/*
 * A fraction that a float reading keeps clear of both integers around it: "." then digits
 * whose first six (zeros after the last) are neither all 0 nor all 9, so 1e-6 <= f <= 1 -
 * 1e-6; with an integer part below 1e9 (a double's spacing there is under 2.5e-7) the value
 * Python reads is never an integer. json.loads reads "4.99999999999999999999" as 5.0: a bound
 * exclusive at 5, or `not {type: integer}`, must not let that through.
 */
#define SC_SAFE_INT 999999999 /* the largest integer part with a fraction kept clear */
static uint32_t frac_clear(sc_ctx *c, uint32_t next)
{
    cst_prog *p = c->p;
    uint32_t tail = prog_split(p, 0, next); /* [0-9]* */
    prog_patch(p, tail, digit_set(c, '0', '9', tail));
    uint32_t e[7][2][2]; /* [digits read][a nonzero seen][all nines so far] */
    for (int nz = 0; nz < 2; nz++)
        for (int a9 = 0; a9 < 2; a9++) e[6][nz][a9] = nz && !a9 ? tail : 0;
    for (int pos = 5; pos >= 0; pos--)
        for (int nz = 0; nz < 2; nz++)
            for (int a9 = 0; a9 < 2; a9++) {
                uint32_t alts[4];
                size_t na = 0;
                alts[na++] = digit_set(c, '0', '0', e[pos + 1][nz][0]);
                alts[na++] = digit_set(c, '1', '8', e[pos + 1][1][0]);
                alts[na++] = digit_set(c, '9', '9', e[pos + 1][1][a9]);
                if (pos > 0 && nz) alts[na++] = next; /* fewer than six digits: zeros after */
                e[pos][nz][a9] = prog_alts(p, alts, na);
            }
    return prog_lit(p, ".", 1, e[0][0][1]);
}

static void nonneg_pieces(sc_ctx *c, double lo, bool lo_excl, double hi, bool has_hi, bool hi_excl,
                          uint32_t next, uint32_t *alts, size_t *na)
{
    if (lo < 0) lo = 0, lo_excl = false;
    int64_t a_any; /* smallest integer part with any fraction */
    bool lo_nonzero = false;
    if (lo != floor(lo))
        a_any = (int64_t)ceil(lo);
    else if (lo_excl)
        a_any = (int64_t)lo + 1, lo_nonzero = true;
    else
        a_any = (int64_t)lo;
    int64_t b_any = INT64_MAX, b_zero = -1;
    if (has_hi) {
        if (hi < 0) return;
        int64_t fh = (int64_t)floor(hi);
        b_any = fh - 1;
        if (!(hi == floor(hi) && hi_excl)) b_zero = fh; /* y = fh exactly is allowed */
    }
    /* below an exclusive integer bound the top integer part's fraction stays clear of it */
    bool top_clear = has_hi && hi == floor(hi) && hi_excl && a_any <= b_any;
    if (top_clear) {
        alts[(*na)++] = uint_range(c, (uint64_t)b_any, (uint64_t)b_any,
                                   b_any <= SC_SAFE_INT
                                       ? prog_split(c->p, frac(c, 1, next), frac_clear(c, next))
                                       : frac(c, 1, next));
        b_any--;
    }
    if (a_any <= b_any)
        alts[(*na)++] =
            uint_range(c, (uint64_t)a_any, b_any == INT64_MAX ? UINT64_MAX : (uint64_t)b_any,
                       frac(c, 0, next));
    if (top_clear) b_any++;
    /* above an exclusive integer bound likewise */
    if (lo_nonzero && (int64_t)lo <= b_any && lo <= SC_SAFE_INT)
        alts[(*na)++] = uint_range(c, (uint64_t)lo, (uint64_t)lo, frac_clear(c, next));
    if (b_zero >= a_any && b_zero > b_any)
        alts[(*na)++] = uint_range(c, (uint64_t)b_zero, (uint64_t)b_zero, frac(c, 1, next));
}

/*
 * The numbers with a fraction that is not zero (what `not {type: integer}` leaves) within the
 * bounds: k.f or -k.f, v in (k, k + 1) wholly inside [lo, hi] (integer bounds exact, others
 * rounded inwards: 5.5 < v from 6 on), k below 1e9 and f clear of 0 and 1 (frac_clear), so
 * that Python's float of the text is no integer either.
 */
static uint32_t nonint_number(sc_ctx *c, const num_bounds *b, uint32_t next)
{
    int64_t lo = b->has_lo ? (int64_t)ceil(b->lo) : INT64_MIN;
    int64_t hi = b->has_hi ? (int64_t)floor(b->hi) : INT64_MAX;
    uint32_t alts[2];
    size_t na = 0;
    /* v = k.f >= 0: k >= lo, k + 1 <= hi */
    int64_t klo = lo > 0 ? lo : 0, khi = hi == INT64_MAX ? INT64_MAX : hi - 1;
    if (khi > SC_SAFE_INT) khi = SC_SAFE_INT; /* a float reading must not be an integer */
    if (klo <= khi) alts[na++] = uint_range(c, (uint64_t)klo, (uint64_t)khi, frac_clear(c, next));
    /* v = -k.f < 0: -(k + 1) >= lo, -k <= hi */
    klo = hi == INT64_MAX || hi >= 0 ? 0 : -hi;
    khi = lo == INT64_MIN ? INT64_MAX : -lo - 1;
    if (khi > SC_SAFE_INT) khi = SC_SAFE_INT;
    if (klo <= khi)
        alts[na++] = prog_lit(c->p, "-", 1,
                              uint_range(c, (uint64_t)klo, (uint64_t)khi, frac_clear(c, next)));
    return na ? prog_alts(c->p, alts, na) : 0;
}

static uint32_t multiple_number(sc_ctx *c, json_t *s, const char *ptr, const num_bounds *b,
                                uint32_t next);

static uint32_t sc_number(sc_ctx *c, json_t *s, const char *ptr, bool integer, uint32_t next)
{
    json_t *mo = json_object_get(s, "multipleOf");
    num_bounds b;
    if (read_bounds(c, s, ptr, &b)) return 0;
    if (json_is_true(json_object_get(s, KW_NONINT))) {
        if (integer) return 0;
        /* a number with a fraction is a multiple of no integer */
        if (mo && json_is_number(mo) && json_number_value(mo) == floor(json_number_value(mo)))
            return 0;
        if (mo) return sc_err(c, ptr, "multipleOf", "not supported beside a fraction");
        return nonint_number(c, &b, next);
    }
    if ((mo && !(json_is_number(mo) && json_number_value(mo) == 1 && integer)) ||
        json_object_get(s, KW_NOTMULT))
        return multiple_number(c, s, ptr, &b, next);
    if (integer) {
        int64_t lo, hi;
        if (!int_bounds(&b, &lo, &hi)) return 0;
        return int_range(c, lo, hi, next);
    }
    cst_prog *p = c->p;
    if (!b.has_lo && !b.has_hi) {
        /* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
        uint32_t exp_loop = prog_split(p, 0, next);
        prog_patch(p, exp_loop, digit_set(c, '0', '9', exp_loop));
        uint32_t exp_digits = digit_set(c, '0', '9', exp_loop);
        uint32_t sign = prog_split(p, prog_range(p, '+', '+', exp_digits),
                                   prog_split(p, prog_range(p, '-', '-', exp_digits), exp_digits));
        uint32_t e = prog_range(p, 'E', 'E', sign), ee = prog_range(p, 'e', 'e', sign);
        uint32_t after = prog_split(p, prog_split(p, e, ee), next);
        uint32_t body = uint_range(c, 0, UINT64_MAX, frac(c, 0, after));
        return prog_split(p, prog_lit(p, "-", 1, body), body);
    }
    uint32_t alts[8];
    size_t na = 0;
    /* y >= 0 part */
    if (!b.has_hi || b.hi >= 0)
        nonneg_pieces(c, b.has_lo ? b.lo : 0, b.has_lo && b.lo_excl, b.hi, b.has_hi, b.hi_excl,
                      next, alts, &na);
    /* x < 0: x = -y, y > 0, -hi <= y <= -lo */
    if (!b.has_lo || b.lo < 0) {
        uint32_t neg[4];
        size_t nn = 0;
        double ylo = b.has_hi ? -b.hi : 0;
        bool ylo_excl = b.has_hi ? b.hi_excl : true;
        if (ylo <= 0) ylo = 0, ylo_excl = true;
        nonneg_pieces(c, ylo, ylo_excl, b.has_lo ? -b.lo : 0, b.has_lo, b.lo_excl, next, neg, &nn);
        if (nn) alts[na++] = prog_lit(p, "-", 1, prog_alts(p, neg, nn));
    }
    return na ? prog_alts(p, alts, na) : 0;
}

/* ---- strings --------------------------------------------------------------------------- */

static uint32_t any_char_sub(sc_ctx *c)
{
    if (c->char_sub) return c->char_sub;
    cst_cps all = {0};
    cps_add(&all, 0, 0xD7FF);
    cps_add(&all, 0xE000, CST_MAX_CP);
    uint32_t ret = prog_emit(c->p, OP_RET, 0, 0);
    c->char_sub = prog_cps(c->p, &all, true, ret);
    cps_free(&all);
    return c->char_sub;
}

static uint32_t any_string(sc_ctx *c, uint32_t next)
{
    cst_cps all = {0};
    cps_add(&all, 0, 0xD7FF);
    cps_add(&all, 0xE000, CST_MAX_CP);
    uint32_t close = prog_lit(c->p, "\"", 1, next);
    uint32_t loop = prog_split(c->p, 0, close);
    prog_patch(c->p, loop, prog_cps(c->p, &all, true, loop));
    cps_free(&all);
    return prog_lit(c->p, "\"", 1, loop);
}

static const struct {
    const char *name, *re;
} formats[] = {
    {"date", "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|["
             "12][0-9]|30)|"
             "02-(?:0[1-9]|1[0-9]|2[0-8]))"},
    {"time", "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2["
             "0-3]):[0-5][0-9])"},
    {"date-time",
     "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|"
     "30)|"
     "02-(?:0[1-9]|1[0-9]|2[0-8]))T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?"
     "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"email", "[A-Za-z0-9_+-]{1,64}(?:\\.[A-Za-z0-9_+-]{1,64}){0,3}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,"
              "30}[A-Za-z0-9])?"
              "(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,30}[A-Za-z0-9])?){0,3}\\.[A-Za-z]{2,12}"},
    {"ipv4", "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(?:\\.(?:25[0-5]|2[0-4][0-9]|1[0-9][0-"
             "9]|[1-9]?[0-9])){3}"},
    {"hostname", "[A-Za-z0-9](?:[A-Za-z0-9-]{0,30}[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,"
                 "30}[A-Za-z0-9])?){0,3}"},
    {"uri",
     "[a-z][a-z0-9+.-]{0,15}://[A-Za-z0-9](?:[A-Za-z0-9.-]{0,60}[A-Za-z0-9])?(?::[0-9]{1,4})?"
     "(?:/[A-Za-z0-9._~!$&'()*+,;=:@-]{0,64}){0,8}(?:\\?[A-Za-z0-9._~!$&'()*+,;=:@/?-]{0,64})?"},
};

/* formats validators check that are not above: refused rather than ignored */
static const char *const formats_refused[] = {
    "ipv6",         "idn-email",     "idn-hostname",
    "iri",          "iri-reference", "uri-reference",
    "uri-template", "json-pointer",  "relative-json-pointer",
    "regex",        "duration",      NULL};

static uint32_t string_auto(sc_ctx *c, json_t *s, const char *ptr, const char *fre, long long lo,
                            long long hi, uint32_t next);

static uint32_t sc_string(sc_ctx *c, json_t *s, const char *ptr, uint32_t next)
{
    json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)))
        return sc_err(c, ptr, mn && !json_is_integer(mn) ? "minLength" : "maxLength",
                      "not an integer");
    long long lo = mn ? json_integer_value(mn) : 0, hi = mx ? json_integer_value(mx) : -1;
    if (lo < 0) lo = 0;
    if (hi >= 0 && hi < lo) return 0; /* no string */
    const char *fre = NULL;
    if (fmt) {
        if (!json_is_string(fmt)) return sc_err(c, ptr, "format", "not a string");
        for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
            if (!strcmp(formats[i].name, json_string_value(fmt))) fre = formats[i].re;
        if (!fre && in_list(formats_refused, json_string_value(fmt)))
            return sc_err(c, ptr, "format", "this format is not supported");
    }
    bool lengths = lo > 0 || hi >= 0;
    /* several of them: one automaton of all */
    if (json_object_get(s, KW_NOTSTRS) || json_object_get(s, KW_NOTPATS) || (fre && pat) ||
        ((fre || pat) && lengths))
        return string_auto(c, s, ptr, fre, lo, hi, next);
    uint32_t close = prog_lit(c->p, "\"", 1, next);
    if (fre)
        return prog_lit(c->p, "\"", 1,
                        cst_regex_emit(c->p, fre, strlen(fre), RE_JSON_STRING, close));
    if (pat) {
        if (!json_is_string(pat)) return sc_err(c, ptr, "pattern", "not a string");
        uint32_t body = cst_regex_emit(c->p, json_string_value(pat), json_string_length(pat),
                                       RE_SEARCH | RE_JSON_STRING, close);
        if (c->p->failed && strncmp(c->p->err, "keyword", 7)) {
            char e[sizeof c->p->err];
            snprintf(e, sizeof e, "%s", c->p->err);
            snprintf(c->p->err, sizeof c->p->err, "keyword 'pattern' at %.200s: %.280s",
                     *ptr ? ptr : "/", e);
        }
        return prog_lit(c->p, "\"", 1, body);
    }
    if (!lengths) return any_string(c, next);
    if (lo > SC_MAX_MIN)
        return prog_fail(c->p, -E2BIG, "keyword 'minLength' at %s: above %d", *ptr ? ptr : "/",
                         SC_MAX_MIN);
    if (hi > SC_MAX_COUNT) hi = SC_MAX_COUNT; /* stricter */
    if (hi >= 0 && hi < lo) hi = lo;
    uint32_t ch = any_char_sub(c), pc = close;
    if (hi < 0) {
        uint32_t loop = prog_split(c->p, 0, close);
        prog_patch(c->p, loop, prog_emit(c->p, OP_CALL, ch, loop));
        pc = loop;
    } else
        for (long long k = lo; k < hi; k++)
            pc = prog_split(c->p, prog_emit(c->p, OP_CALL, ch, pc), close);
    for (long long k = 0; k < lo; k++) pc = prog_emit(c->p, OP_CALL, ch, pc);
    return prog_lit(c->p, "\"", 1, pc);
}

/* ---- any JSON value -------------------------------------------------------------------- */

static uint32_t any_value_sub(sc_ctx *c);

static uint32_t any_value_call(sc_ctx *c, uint32_t next)
{
    return prog_emit(c->p, OP_CALL, any_value_sub(c), next);
}

static uint32_t any_value_sub(sc_ctx *c)
{
    if (c->any_sub) return c->any_sub;
    cst_prog *p = c->p;
    uint32_t entry = prog_emit(p, OP_JMP, 0, 0);
    c->any_sub = entry;
    uint32_t ret = prog_emit(p, OP_RET, 0, 0);
    uint32_t alts[7];
    /* object */
    {
        uint32_t close = prog_ws(p, prog_lit(p, "}", 1, ret));
        uint32_t loop = prog_split(p, 0, close);
        uint32_t member_tail = any_value_call(c, loop);
        uint32_t rest = prog_ws(
            p, prog_lit(p, ",", 1,
                        prog_ws(p, any_string(c, prog_ws(p, prog_lit(p, ":", 1,
                                                                     prog_ws(p, member_tail)))))));
        prog_patch(p, loop, rest);
        uint32_t first =
            any_string(c, prog_ws(p, prog_lit(p, ":", 1, prog_ws(p, any_value_call(c, loop)))));
        alts[0] = prog_lit(p, "{", 1, prog_ws(p, prog_split(p, first, close)));
    }
    /* array */
    {
        uint32_t close = prog_ws(p, prog_lit(p, "]", 1, ret));
        uint32_t loop = prog_split(p, 0, close);
        uint32_t rest = prog_ws(p, prog_lit(p, ",", 1, prog_ws(p, any_value_call(c, loop))));
        prog_patch(p, loop, rest);
        uint32_t first = any_value_call(c, loop);
        alts[1] = prog_lit(p, "[", 1, prog_ws(p, prog_split(p, first, close)));
    }
    alts[2] = any_string(c, ret);
    json_t *empty = json_object();
    json_array_append_new(c->keep, empty);
    alts[3] = sc_number(c, empty, "", false, ret);
    alts[4] = lit_word(c, 1, ret);
    alts[5] = lit_word(c, 2, ret);
    alts[6] = lit_word(c, 0, ret);
    prog_patch(p, entry, prog_alts(p, alts, 7));
    return entry;
}

/* ---- objects --------------------------------------------------------------------------- */

typedef struct sc_prop {
    const char *name;
    json_t *schema;
    bool required;
    bool from_addl; /* required but not in properties */
    char ptr[512];
} sc_prop;

/* names as code point arrays for the "a key other than these" automaton */
typedef struct sc_name {
    uint32_t *cp;
    size_t n;
} sc_name;

static int cmp_name(const void *a, const void *b)
{
    const sc_name *x = a, *y = b;
    for (size_t i = 0; i < x->n && i < y->n; i++)
        if (x->cp[i] != y->cp[i]) return x->cp[i] < y->cp[i] ? -1 : 1;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* the rest of a key's content (names[lo..hi) share their first d code points) then `"` */
static uint32_t key_excl(sc_ctx *c, sc_name *names, size_t lo, size_t hi, size_t d, uint32_t freed,
                         uint32_t next)
{
    cst_prog *p = c->p;
    uint32_t *alts = malloc((hi - lo + 3) * sizeof *alts);
    if (!alts) return prog_fail(p, -ENOMEM, "out of memory");
    size_t na = 0;
    bool terminal = false;
    cst_cps others = {0};
    cps_add(&others, 0, 0xD7FF);
    cps_add(&others, 0xE000, CST_MAX_CP);
    size_t i = lo;
    while (i < hi && !p->failed) {
        if (names[i].n == d) {
            terminal = true;
            i++;
            continue;
        }
        uint32_t cp = names[i].cp[d];
        size_t j = i;
        while (j < hi && names[j].n > d && names[j].cp[d] == cp) j++;
        uint8_t e[6];
        size_t el = cst_encode_cp(cp, true, e);
        alts[na++] = prog_lit(p, e, el, key_excl(c, names, i, j, d + 1, freed, next));
        cps_subtract(&others, cp, cp);
        i = j;
    }
    if (!cps_empty(&others)) alts[na++] = prog_cps(p, &others, true, freed);
    if (!terminal) alts[na++] = prog_lit(p, "\"", 1, next);
    cps_free(&others);
    uint32_t pc = na ? prog_alts(p, alts, na) : 0;
    free(alts);
    return pc;
}

/* `"` + any key not among names + `"` */
static uint32_t key_other_than(sc_ctx *c, const sc_prop *props, size_t n, uint32_t next)
{
    if (n == 0) return any_string(c, next);
    sc_name *names = calloc(n, sizeof *names);
    if (!names) return prog_fail(c->p, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const uint8_t *s = (const uint8_t *)props[i].name;
        size_t len = strlen(props[i].name);
        names[i].cp = malloc((len + 1) * sizeof *names[i].cp);
        if (!names[i].cp) break;
        for (size_t k = 0; k < len;) {
            uint32_t cp = s[k];
            size_t l = cp < 0x80 ? 1 : cp < 0xE0 ? 2 : cp < 0xF0 ? 3 : 4;
            if (l > 1) cp &= l == 2 ? 0x1F : l == 3 ? 0x0F : 0x07;
            for (size_t q = 1; q < l && k + q < len; q++) cp = cp << 6 | (s[k + q] & 63);
            names[i].cp[names[i].n++] = cp;
            k += l;
        }
    }
    qsort(names, n, sizeof *names, cmp_name);
    /* free: any characters then `"` */
    cst_cps all = {0};
    cps_add(&all, 0, 0xD7FF);
    cps_add(&all, 0xE000, CST_MAX_CP);
    uint32_t close = prog_lit(c->p, "\"", 1, next);
    uint32_t freed = prog_split(c->p, 0, close);
    prog_patch(c->p, freed, prog_cps(c->p, &all, true, freed));
    cps_free(&all);
    uint32_t pc = prog_lit(c->p, "\"", 1, key_excl(c, names, 0, n, 0, freed, next));
    for (size_t i = 0; i < n; i++) free(names[i].cp);
    free(names);
    return pc;
}

/* ---- patternProperties ------------------------------------------------------------------ */

#define SC_MAX_PATTERNS   16   /* patterns in one patternProperties */
#define SC_MAX_KEY_STATES 4096 /* states of the automaton over a key's bytes */

/*
 * The keys of an object with patternProperties, as one automaton over the key's bytes (its
 * content as json.dumps writes it, then the closing quote): the product of one DFA per
 * pattern (the regex found anywhere in the key, as JSON Schema's `pattern`), one for "a
 * well-formed string" and one for "one of the names in properties". Where a key ends, the
 * patterns it matches are known, so its value is the schema of all of them together, or
 * additionalProperties when it matches none; a key named in properties is not taken here
 * (the named members are). Exact: no key is let through with a looser value schema.
 */
typedef struct sc_keys {
    int ncomp; /* 0: any string, 1..npat: the patterns, npat + 1: the names */
    int npat;
    bool names;
    cst_grammar *g[SC_MAX_PATTERNS + 2];
    cst_matcher *m[SC_MAX_PATTERNS + 2];
    json_t *schema[SC_MAX_PATTERNS]; /* the patterns' schemas */
    const char *re[SC_MAX_PATTERNS];
} sc_keys;

static void keys_release(sc_keys *k)
{
    for (int i = 0; i < k->ncomp; i++) {
        cst_dfa_close(k->m[i]);
        cst_grammar_free(k->g[i]);
    }
    k->ncomp = 0;
}

/* One component from a program whose body the caller emitted into p (p.start set). */
static int keys_add(sc_ctx *c, sc_keys *k, cst_prog *p, const char *ptr)
{
    char err[300];
    int rc = cst_grammar_finish(p, &k->g[k->ncomp], err, sizeof err);
    if (!rc) rc = cst_dfa_open(k->g[k->ncomp], &k->m[k->ncomp]);
    if (rc) {
        if (k->g[k->ncomp]) cst_grammar_free(k->g[k->ncomp]);
        sc_err(c, ptr, "patternProperties", rc == -ENOMEM ? "out of memory" : err);
        return rc;
    }
    k->ncomp++;
    return 0;
}

static int keys_build(sc_ctx *c, sc_keys *k, json_t *pp, const sc_prop *pr, size_t n,
                      const char *ptr)
{
    memset(k, 0, sizeof *k);
    if (json_object_size(pp) > SC_MAX_PATTERNS)
        return sc_err(c, ptr, "patternProperties", "more than 16 patterns"), -EINVAL;
    cst_prog p;
    /* any well-formed key */
    if (prog_init(&p)) return prog_fail(c->p, -ENOMEM, "out of memory"), -ENOMEM;
    {
        cst_cps all = {0};
        cps_add(&all, 0, 0xD7FF);
        cps_add(&all, 0xE000, CST_MAX_CP);
        uint32_t close = prog_lit(&p, "\"", 1, prog_emit(&p, OP_MATCH, 0, 0));
        uint32_t loop = prog_split(&p, 0, close);
        prog_patch(&p, loop, prog_cps(&p, &all, true, loop));
        cps_free(&all);
        p.start = loop;
    }
    if (keys_add(c, k, &p, ptr)) return -EINVAL;
    const char *re;
    json_t *sub;
    json_object_foreach(pp, re, sub)
    {
        char pp_ptr[512], sptr[512];
        ptr_child(pp_ptr, sizeof pp_ptr, ptr, "patternProperties");
        ptr_child(sptr, sizeof sptr, pp_ptr, re);
        if (prog_init(&p)) return prog_fail(c->p, -ENOMEM, "out of memory"), -ENOMEM;
        uint32_t close = prog_lit(&p, "\"", 1, prog_emit(&p, OP_MATCH, 0, 0));
        p.start = cst_regex_emit(&p, re, strlen(re), RE_SEARCH | RE_JSON_STRING, close);
        if (p.failed) {
            char m[400];
            snprintf(m, sizeof m, "the pattern does not compile: %.280s", p.err);
            prog_release(&p);
            return sc_err(c, sptr, "patternProperties", m), -EINVAL;
        }
        if (keys_add(c, k, &p, ptr)) return -EINVAL;
        k->re[k->npat] = re;
        k->schema[k->npat++] = sub;
    }
    if (n) {
        if (prog_init(&p)) return prog_fail(c->p, -ENOMEM, "out of memory"), -ENOMEM;
        uint32_t match = prog_emit(&p, OP_MATCH, 0, 0);
        uint32_t *e = calloc(n, sizeof *e);
        size_t ne = 0;
        for (size_t i = 0; e && i < n; i++) {
            char *q = NULL;
            size_t ql = 0, qc = 0;
            if (cst_json_quote(pr[i].name, strlen(pr[i].name), &q, &ql, &qc) == 0 && ql >= 2)
                e[ne++] = prog_lit(&p, q + 1, ql - 1, match);
            free(q);
        }
        p.start = ne ? prog_alts(&p, e, ne) : 0;
        free(e);
        if (!ne) {
            prog_release(&p);
        } else {
            if (keys_add(c, k, &p, ptr)) return -EINVAL;
            k->names = true;
        }
    }
    return 0;
}

/* The patterns a key matches (bit i: pattern i), -1 if it is not a well-formed key. */
static long keys_match(sc_keys *k, const char *key)
{
    char *q = NULL;
    size_t ql = 0, qc = 0;
    if (cst_json_quote(key, strlen(key), &q, &ql, &qc) || ql < 2) {
        free(q);
        return -1;
    }
    long bits = 0;
    for (int i = 0; i <= k->npat; i++) {
        int32_t s = (int32_t)cst_dfa_start(k->m[i]);
        for (size_t b = 1; b < ql && s > 0; b++)
            s = cst_dfa_step(k->m[i], (uint32_t)s, (uint8_t)q[b]);
        bool acc = s > 0 && cst_dfa_accepting(k->m[i], (uint32_t)s);
        if (i == 0 && !acc) {
            bits = -1;
            break;
        }
        if (i > 0 && acc) bits |= 1L << (i - 1);
    }
    free(q);
    return bits;
}

/* The schema of a key that matches the patterns in bits (none: addl, or NULL: no such key),
 * together with base (a named property's schema) when base is not NULL. */
static json_t *keys_schema(sc_ctx *c, sc_keys *k, long bits, json_t *base, json_t *addl,
                           const char *ptr)
{
    json_t *s = base;
    if (!bits && !base) return addl;
    for (int i = 0; i < k->npat && !c->p->failed; i++)
        if (bits >> i & 1) s = s ? sc_merge(c, s, k->schema[i], ptr) : k->schema[i];
    return c->p->failed ? NULL : s;
}

/* The product automaton's states while it is built: tuples of component states. */
typedef struct key_auto {
    int nc;
    const char *kw;  /* the keyword its errors name (NULL: patternProperties) */
    uint32_t *tup;   /* [state * nc + component] */
    uint32_t *entry; /* each state's JMP, patched once its transitions are emitted */
    uint32_t *hash;  /* state + 1, open addressing over tuples */
    size_t n, cap, hcap;
} key_auto;

static size_t ka_slot(const key_auto *a, const uint32_t *t, size_t hcap)
{
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < a->nc; i++) h = (h ^ t[i]) * 0x100000001B3ull;
    return (size_t)(h ^ h >> 29) & (hcap - 1);
}

/* The state of tuple t (made, with its JMP emitted, if new); -1 after an error. */
static int64_t ka_intern(sc_ctx *c, key_auto *a, const uint32_t *t, const char *ptr)
{
    size_t nc = (size_t)a->nc, j = ka_slot(a, t, a->hcap);
    for (; a->hash[j]; j = (j + 1) & (a->hcap - 1))
        if (!memcmp(a->tup + (a->hash[j] - 1) * nc, t, nc * sizeof *t)) return a->hash[j] - 1;
    if (a->n == SC_MAX_KEY_STATES)
        return sc_err(c, ptr, a->kw ? a->kw : "patternProperties",
                      a->kw ? "the automaton of the value needs too many states"
                            : "the key patterns need too many states"),
               -1;
    if (a->n == a->cap) {
        size_t cap = a->cap * 2;
        uint32_t *t2 = realloc(a->tup, cap * nc * sizeof *t2);
        if (t2) a->tup = t2;
        uint32_t *e2 = realloc(a->entry, cap * sizeof *e2);
        if (e2) a->entry = e2;
        if (!t2 || !e2) return prog_fail(c->p, -ENOMEM, "out of memory"), -1;
        a->cap = cap;
    }
    memcpy(a->tup + a->n * nc, t, nc * sizeof *t);
    a->entry[a->n] = prog_emit(c->p, OP_JMP, 0, 0);
    a->hash[j] = (uint32_t)a->n + 1;
    int64_t id = (int64_t)a->n++;
    if (a->n * 2 >= a->hcap) {
        size_t hcap = a->hcap * 2;
        uint32_t *h2 = calloc(hcap, sizeof *h2);
        if (!h2) return prog_fail(c->p, -ENOMEM, "out of memory"), -1;
        for (size_t s = 0; s < a->n; s++) {
            size_t q = ka_slot(a, a->tup + s * nc, hcap);
            while (h2[q]) q = (q + 1) & (hcap - 1);
            h2[q] = (uint32_t)s + 1;
        }
        free(a->hash);
        a->hash = h2;
        a->hcap = hcap;
    }
    return c->p->failed ? -1 : id;
}

/*
 * The bytes that none of the n components' grammars g tells apart (their byte classes,
 * refined by one another): a product steps one byte of each class (rep[0..count)), every byte
 * of class k (set[k]) going where rep[k] goes. Returns the count (1 to 256).
 */
static int product_classes(cst_grammar *const *g, int n, uint8_t rep[256], cst_byteset set[256])
{
    int count = 0;
    for (int b = 0; b < 256; b++) {
        int k = 0;
        for (; k < count; k++) {
            int i = 0;
            while (i < n && g[i]->byte_class[rep[k]] == g[i]->byte_class[b]) i++;
            if (i == n) break;
        }
        if (k == count) {
            rep[count] = (uint8_t)b;
            memset(&set[count], 0, sizeof set[count]);
            count++;
        }
        set[k].w[b >> 6] |= 1ull << (b & 63);
    }
    return count;
}

/*
 * `"` + a key other than the named ones + `"` + `:` + its value, then next. addl: the
 * schema of a key no pattern matches (NULL: no such key).
 */
static uint32_t keys_member(sc_ctx *c, sc_keys *k, json_t *addl, const char *ptr, uint32_t next)
{
    cst_prog *p = c->p;
    int nc = k->ncomp;
    key_auto a = {.nc = nc, .cap = 64, .hcap = 256};
    a.tup = malloc(a.cap * (size_t)nc * sizeof *a.tup);
    a.entry = malloc(a.cap * sizeof *a.entry);
    a.hash = calloc(a.hcap, sizeof *a.hash);
    /* the value entries by the set of patterns the key matched */
    long vbits[64];
    uint32_t vpc[64];
    int nv = 0;
    uint32_t cur[SC_MAX_PATTERNS + 2], grp_target[256], alts[256];
    cst_byteset grp_set[256], cls_set[256];
    uint8_t rep[256];
    uint32_t result = 0;
    if (!a.tup || !a.entry || !a.hash) {
        prog_fail(p, -ENOMEM, "out of memory");
        goto out;
    }
    int ncls = product_classes(k->g, nc, rep, cls_set);
    for (int i = 0; i < nc; i++) cur[i] = cst_dfa_start(k->m[i]);
    int64_t start = ka_intern(c, &a, cur, ptr);
    if (start < 0) goto out;
    for (size_t t = 0; t < a.n && !p->failed; t++) {
        int ng = 0;
        for (int ci = 0; ci < ncls; ci++) {
            uint32_t target;
            for (int i = 0; i < nc; i++) {
                int32_t s = cst_dfa_step(k->m[i], a.tup[t * (size_t)nc + (size_t)i], rep[ci]);
                if (s < 0) {
                    sc_err(c, ptr, "patternProperties",
                           s == -ENOMEM ? "out of memory" : "a pattern too complex");
                    goto out;
                }
                cur[i] = (uint32_t)s;
            }
            if (!cur[0]) continue;                    /* not a well-formed key */
            if (cst_dfa_accepting(k->m[0], cur[0])) { /* the closing quote */
                if (k->names && cst_dfa_accepting(k->m[nc - 1], cur[nc - 1]))
                    continue; /* a named property: the named members take it */
                long bits = 0;
                for (int i = 0; i < k->npat; i++)
                    if (cst_dfa_accepting(k->m[1 + i], cur[1 + i])) bits |= 1L << i;
                int v = 0;
                while (v < nv && vbits[v] != bits) v++;
                if (v == nv) {
                    if (nv == 64) {
                        sc_err(c, ptr, "patternProperties", "too many overlapping patterns");
                        goto out;
                    }
                    json_t *vs = keys_schema(c, k, bits, NULL, addl, ptr);
                    uint32_t val = vs ? sc_call(c, vs, ptr, next) : 0;
                    vbits[nv] = bits;
                    vpc[nv++] = val ? prog_ws(p, prog_lit(p, ":", 1, prog_ws(p, val))) : 0;
                }
                if (!vpc[v]) continue;
                target = vpc[v];
            } else {
                int64_t id = ka_intern(c, &a, cur, ptr);
                if (id < 0) goto out;
                target = a.entry[id];
            }
            int gi = 0;
            while (gi < ng && grp_target[gi] != target) gi++;
            if (gi == ng) {
                grp_target[ng] = target;
                memset(&grp_set[ng], 0, sizeof grp_set[ng]);
                ng++;
            }
            for (int w = 0; w < 4; w++) grp_set[gi].w[w] |= cls_set[ci].w[w];
        }
        for (int gi = 0; gi < ng; gi++) alts[gi] = prog_set(p, &grp_set[gi], grp_target[gi]);
        prog_patch(p, a.entry[t], ng ? prog_alts(p, alts, (size_t)ng) : 0);
    }
    result = p->failed ? 0 : prog_lit(p, "\"", 1, a.entry[start]);
out:
    free(a.tup);
    free(a.entry);
    free(a.hash);
    return p->failed ? 0 : result;
}

/* ---- strings as one automaton ------------------------------------------------------- */

#define SC_STR_COMPS 24 /* components of a string's automaton */

enum { SR_ANY, SR_MUST, SR_MUST_NOT };

typedef struct str_auto {
    int n;
    int role[SC_STR_COMPS];
    cst_grammar *g[SC_STR_COMPS];
    cst_matcher *m[SC_STR_COMPS];
} str_auto;

static void str_auto_release(str_auto *a)
{
    for (int i = 0; i < a->n; i++) {
        cst_dfa_close(a->m[i]);
        cst_grammar_free(a->g[i]);
    }
    a->n = 0;
}

/* One component: the program p holds (its start set; taken over), with its role. */
static int str_auto_add(sc_ctx *c, str_auto *a, cst_prog *p, int role, const char *ptr,
                        const char *kw)
{
    char err[300];
    if (p->failed) {
        snprintf(err, sizeof err, "%.280s", p->err);
        prog_release(p);
        return sc_err(c, ptr, kw, err), -EINVAL;
    }
    if (a->n == SC_STR_COMPS) {
        prog_release(p);
        return sc_err(c, ptr, kw, "too many patterns and strings on one string"), -EINVAL;
    }
    int rc = cst_grammar_finish(p, &a->g[a->n], err, sizeof err);
    if (!rc) rc = cst_dfa_open(a->g[a->n], &a->m[a->n]);
    if (rc) {
        if (a->g[a->n]) cst_grammar_free(a->g[a->n]);
        return sc_err(c, ptr, kw, rc == -ENOMEM ? "out of memory" : err), rc;
    }
    a->role[a->n++] = role;
    return 0;
}

/* A program of a string's content then its closing quote: the regex re (RE_* flags). */
static int str_auto_regex(sc_ctx *c, str_auto *a, const char *re, int flags, int role,
                          const char *ptr, const char *kw)
{
    cst_prog p;
    if (prog_init(&p)) return prog_fail(c->p, -ENOMEM, "out of memory"), -ENOMEM;
    uint32_t close = prog_lit(&p, "\"", 1, prog_emit(&p, OP_MATCH, 0, 0));
    p.start = cst_regex_emit(&p, re, strlen(re), flags | RE_JSON_STRING, close);
    return str_auto_add(c, a, &p, role, ptr, kw);
}

/*
 * The fewest and the most characters (code points) in the strings of component k before its
 * closing quote, *max -1 where there is no most. False where they are not cheaply known: its
 * strings may hold an escape (the automaton reads a backslash), or a byte class mixes a
 * character's first bytes with continuation bytes, or it has over SC_MAX_KEY_STATES states.
 */
static bool comp_char_bounds(str_auto *a, int k, long long *min, long long *max)
{
    cst_matcher *m = a->m[k];
    uint8_t rep[256];
    cst_byteset set[256];
    int ncls = product_classes(&a->g[k], 1, rep, set);
    int wt[256]; /* each class's characters: 0 (continuation, the closing quote) or 1 */
    for (int ci = 0; ci < ncls; ci++) {
        int cont = 0, other = 0;
        for (int b = 0; b < 256; b++)
            if (set[ci].w[b >> 6] >> (b & 63) & 1) {
                if ((b & 0xC0) == 0x80 || b == '"')
                    cont++;
                else
                    other++;
            }
        wt[ci] = cont && other ? -1 : other ? 1 : 0;
    }
    /* the states reachable from the start, numbered in the order found, and their edges */
    uint32_t cap = 64, n = 0, idcap;
    uint32_t *state = malloc(cap * sizeof *state), *num; /* num: state id -> index + 1 */
    uint32_t *edge = malloc((size_t)cap * (size_t)ncls * sizeof *edge); /* index + 1, 0 dead */
    uint32_t start = cst_dfa_start(m);
    idcap = start * 2 + 64;
    num = calloc(idcap, sizeof *num);
    bool ok = state && edge && num;
    if (ok) state[n++] = start, num[start] = 1;
    for (uint32_t i = 0; i < n && ok; i++) {
        for (int ci = 0; ci < ncls && ok; ci++) {
            int32_t t = cst_dfa_step(m, state[i], rep[ci]);
            edge[(size_t)i * (size_t)ncls + (size_t)ci] = 0;
            if (t <= 0) {
                ok = t == 0;
                continue;
            }
            if ((set[ci].w['\\' >> 6] >> ('\\' & 63) & 1) || wt[ci] < 0) {
                ok = false; /* an escape, or a class of mixed bytes: not counted here */
                break;
            }
            if ((uint32_t)t >= idcap) {
                uint32_t nc = (uint32_t)t * 2 + 64;
                uint32_t *n2 = realloc(num, nc * sizeof *n2);
                if (!n2) {
                    ok = false;
                    break;
                }
                memset(n2 + idcap, 0, (nc - idcap) * sizeof *n2);
                num = n2;
                idcap = nc;
            }
            if (!num[t]) {
                if (n == SC_MAX_KEY_STATES) {
                    ok = false;
                    break;
                }
                if (n == cap) {
                    cap *= 2;
                    uint32_t *s2 = realloc(state, cap * sizeof *s2);
                    if (s2) state = s2;
                    uint32_t *e2 = realloc(edge, (size_t)cap * (size_t)ncls * sizeof *e2);
                    if (e2) edge = e2;
                    if (!s2 || !e2) {
                        ok = false;
                        break;
                    }
                }
                state[n] = (uint32_t)t;
                num[t] = ++n;
            }
            edge[(size_t)i * (size_t)ncls + (size_t)ci] = num[t];
        }
    }
    /* the states from which an accepting one is reached (live); over them the fewest
     * characters from the start (rounds of relaxation in the order found: the weights are 0
     * and 1) and the most (a longest path in topological order; a cycle: no most) */
    long long *lo = NULL, *hi = NULL;
    uint32_t *indeg = NULL, *queue = NULL;
    bool *live = NULL;
    if (ok) {
        lo = malloc(n * sizeof *lo);
        hi = malloc(n * sizeof *hi);
        indeg = calloc(n, sizeof *indeg);
        queue = malloc(n * sizeof *queue);
        live = calloc(n, sizeof *live);
        ok = lo && hi && indeg && queue && live;
    }
    for (bool changed = ok; changed;) {
        changed = false;
        for (uint32_t i = n; i-- > 0;)
            for (int ci = 0; ci < ncls && !live[i]; ci++) {
                uint32_t t = edge[(size_t)i * (size_t)ncls + (size_t)ci];
                if (cst_dfa_accepting(m, state[i]) || (t && live[t - 1])) live[i] = changed = true;
            }
    }
    if (ok && !live[0]) ok = false;
    if (ok) {
        for (uint32_t i = 0; i < n; i++) lo[i] = i ? LLONG_MAX : 0;
        for (bool changed = true; changed;) {
            changed = false;
            for (uint32_t i = 0; i < n; i++)
                for (int ci = 0; ci < ncls && lo[i] != LLONG_MAX; ci++) {
                    uint32_t t = edge[(size_t)i * (size_t)ncls + (size_t)ci];
                    if (t && live[t - 1] && lo[i] + wt[ci] < lo[t - 1])
                        lo[t - 1] = lo[i] + wt[ci], changed = true;
                }
        }
        /* Kahn's order over the live states, the longest path along it */
        uint32_t qh = 0, qt = 0, nlive = 0;
        for (uint32_t i = 0; i < n; i++)
            for (int ci = 0; ci < ncls; ci++) {
                uint32_t t = edge[(size_t)i * (size_t)ncls + (size_t)ci];
                if (live[i] && t && live[t - 1]) indeg[t - 1]++;
            }
        for (uint32_t i = 0; i < n; i++) {
            hi[i] = i ? LLONG_MIN : 0;
            nlive += live[i];
            if (live[i] && !indeg[i]) queue[qt++] = i;
        }
        while (qh < qt) {
            uint32_t i = queue[qh++];
            for (int ci = 0; ci < ncls; ci++) {
                uint32_t t = edge[(size_t)i * (size_t)ncls + (size_t)ci];
                if (!t || !live[t - 1]) continue;
                if (hi[i] != LLONG_MIN && hi[i] + wt[ci] > hi[t - 1]) hi[t - 1] = hi[i] + wt[ci];
                if (!--indeg[t - 1]) queue[qt++] = t - 1;
            }
        }
        *min = LLONG_MAX;
        *max = -1;
        for (uint32_t i = 0; i < n; i++)
            if (live[i] && cst_dfa_accepting(m, state[i])) {
                if (lo[i] < *min) *min = lo[i];
                if (hi[i] > *max) *max = hi[i];
            }
        if (qt != nlive) *max = -1; /* a cycle: no most */
    }
    free(lo);
    free(hi);
    free(indeg);
    free(queue);
    free(live);
    free(state);
    free(num);
    free(edge);
    return ok;
}

/*
 * The product of the components' automata, emitted as one: a state is a tuple of their states,
 * built breadth first as patternProperties' keys are. at_quote: the components end with a
 * string's closing quote, and where the first one (SR_ANY) has read it the roles decide
 * whether the text ends there (then next); else a state where every SR_MUST component accepts
 * and no SR_MUST_NOT one does may end (then next) or go on. lo, hi (at_quote only; 0, -1:
 * none): the string's length bounds, kept as one more member of the tuple, the characters
 * read so far (each return of the first component to its start state is one character, an
 * escape included; past lo the count stops where there is no hi), rather than as a
 * component of its own whose automaton would copy every character's bytes hi times.
 */
static uint32_t auto_product(sc_ctx *c, str_auto *sa, const char *ptr, const char *kw,
                             bool at_quote, long long lo, long long hi, uint32_t next)
{
    cst_prog *p = c->p;
    int nc = sa->n;
    bool counted = lo > 0 || hi >= 0; /* the count is cur[nc] */
    uint32_t loop = cst_dfa_start(sa->m[0]);
    key_auto a = {.nc = nc + counted, .kw = kw, .cap = 64, .hcap = 256};
    uint32_t result = 0;
    a.tup = malloc(a.cap * (size_t)a.nc * sizeof *a.tup);
    a.entry = malloc(a.cap * sizeof *a.entry);
    a.hash = calloc(a.hcap, sizeof *a.hash);
    if (!a.tup || !a.entry || !a.hash) {
        prog_fail(p, -ENOMEM, "out of memory");
        goto out;
    }
    uint32_t cur[SC_STR_COMPS + 1], grp_target[257], alts[257];
    cst_byteset grp_set[256], cls_set[256];
    uint8_t rep[256];
    int ncls = product_classes(sa->g, nc, rep, cls_set);
    for (int k = 0; k < nc; k++) cur[k] = cst_dfa_start(sa->m[k]);
    if (counted) cur[nc] = 0;
    int64_t start = ka_intern(c, &a, cur, ptr);
    if (start < 0) goto out;
    for (size_t t = 0; t < a.n && !p->failed; t++) {
        int ng = 0;
        const uint32_t *from = a.tup + t * (size_t)a.nc;
        for (int ci = 0; ci < ncls; ci++) {
            uint32_t target;
            for (int k = 0; k < nc; k++) {
                int32_t st = from[k] ? cst_dfa_step(sa->m[k], from[k], rep[ci]) : 0;
                if (st < 0) {
                    sc_err(c, ptr, kw, st == -ENOMEM ? "out of memory" : "a pattern too complex");
                    goto out;
                }
                cur[k] = (uint32_t)st;
            }
            if (!cur[0]) continue;                                 /* outside the universe */
            if (at_quote && cst_dfa_accepting(sa->m[0], cur[0])) { /* the closing quote */
                bool ok = !counted || from[nc] >= lo;
                for (int k = 1; k < nc && ok; k++) {
                    bool acc = cur[k] && cst_dfa_accepting(sa->m[k], cur[k]);
                    ok = sa->role[k] == SR_MUST ? acc : !acc;
                }
                if (!ok) continue;
                target = next;
            } else {
                bool dead = false; /* a component that must match can no longer */
                for (int k = 1; k < nc && !dead; k++) dead = sa->role[k] == SR_MUST && !cur[k];
                if (counted) { /* a character ends where the universe is back at its loop */
                    long long n = (long long)from[nc] + (cur[0] == loop);
                    if (hi >= 0 && n > hi) dead = true;
                    cur[nc] = (uint32_t)(hi < 0 && n > lo ? lo : n);
                }
                if (dead) continue;
                int64_t id = ka_intern(c, &a, cur, ptr);
                if (id < 0) goto out;
                target = a.entry[id];
                from = a.tup + t * (size_t)a.nc; /* interning may move the tuples */
            }
            int gi = 0;
            while (gi < ng && grp_target[gi] != target) gi++;
            if (gi == ng) {
                grp_target[ng] = target;
                memset(&grp_set[ng], 0, sizeof grp_set[ng]);
                ng++;
            }
            for (int w = 0; w < 4; w++) grp_set[gi].w[w] |= cls_set[ci].w[w];
        }
        for (int gi = 0; gi < ng; gi++) alts[gi] = prog_set(p, &grp_set[gi], grp_target[gi]);
        if (!at_quote) {
            bool ok = cst_dfa_accepting(sa->m[0], from[0]);
            for (int k = 1; k < nc && ok; k++) {
                bool acc = from[k] && cst_dfa_accepting(sa->m[k], from[k]);
                ok = sa->role[k] == SR_MUST ? acc : !acc;
            }
            if (ok) alts[ng++] = next;
        }
        prog_patch(p, a.entry[t], ng ? prog_alts(p, alts, (size_t)ng) : 0);
    }
    result = p->failed ? 0 : a.entry[start];
out:
    free(a.tup);
    free(a.entry);
    free(a.hash);
    return p->failed ? 0 : result;
}

/*
 * A string of schema s — its content as json.dumps writes it — as the product of automata
 * over its bytes: any well-formed string, and each of format, pattern and the length bounds
 * that it must match, and each pattern (KW_NOTPATS) and string (KW_NOTSTRS) it must not:
 * exact, since a string has one written form. Where the closing quote is read the roles
 * decide whether the string ends there.
 */
static uint32_t string_auto(sc_ctx *c, json_t *s, const char *ptr, const char *fre, long long lo,
                            long long hi, uint32_t next)
{
    cst_prog *p = c->p;
    json_t *pat = json_object_get(s, "pattern"), *notpats = json_object_get(s, KW_NOTPATS);
    json_t *notstrs = json_object_get(s, KW_NOTSTRS);
    str_auto sa = {0};
    uint32_t result = 0;
    cst_prog q;
    cst_cps all = {0};
    cps_add(&all, 0, 0xD7FF);
    cps_add(&all, 0xE000, CST_MAX_CP);
    /* any well-formed string */
    if (prog_init(&q)) goto oom;
    {
        uint32_t close = prog_lit(&q, "\"", 1, prog_emit(&q, OP_MATCH, 0, 0));
        uint32_t loop = prog_split(&q, 0, close);
        prog_patch(&q, loop, prog_cps(&q, &all, true, loop));
        q.start = loop;
    }
    if (str_auto_add(c, &sa, &q, SR_ANY, ptr, "not")) goto out;
    if (fre && str_auto_regex(c, &sa, fre, RE_WHOLE, SR_MUST, ptr, "format")) goto out;
    if (pat) {
        if (!json_is_string(pat)) {
            sc_err(c, ptr, "pattern", "not a string");
            goto out;
        }
        if (str_auto_regex(c, &sa, json_string_value(pat), RE_SEARCH, SR_MUST, ptr, "pattern"))
            goto out;
    }
    /* the lengths hold for every string the format or the pattern allows: no product with
     * them (a format's strings are of bounded length; an anchored pattern's may be) */
    bool lengths = lo > 0 || hi >= 0;
    for (int k = 1; k < sa.n && lengths; k++) {
        long long mn, mx;
        if (comp_char_bounds(&sa, k, &mn, &mx) && mn >= lo && (hi < 0 || (mx >= 0 && mx <= hi)))
            lengths = false;
    }
    if (lengths) {
        if (lo > SC_MAX_MIN) {
            prog_fail(p, -E2BIG, "keyword 'minLength' at %s: above %d", *ptr ? ptr : "/",
                      SC_MAX_MIN);
            goto out;
        }
        if (hi > SC_MAX_COUNT) hi = SC_MAX_COUNT; /* stricter */
    } else
        lo = 0, hi = -1;
    size_t i;
    json_t *x;
    json_array_foreach(notpats, i, x)
    {
        if (!json_is_string(x)) {
            sc_err(c, ptr, "not", "a pattern that is not a string");
            goto out;
        }
        if (str_auto_regex(c, &sa, json_string_value(x), RE_SEARCH, SR_MUST_NOT, ptr, "not"))
            goto out;
    }
    if (json_array_size(notstrs)) {
        if (prog_init(&q)) goto oom;
        uint32_t match = prog_emit(&q, OP_MATCH, 0, 0);
        size_t n = json_array_size(notstrs), ne = 0;
        uint32_t *e = calloc(n, sizeof *e);
        json_array_foreach(notstrs, i, x)
        {
            char *b = NULL;
            size_t bl = 0, bc = 0;
            if (e && json_is_string(x) &&
                !cst_json_quote(json_string_value(x), json_string_length(x), &b, &bl, &bc) &&
                bl >= 2)
                e[ne++] = prog_lit(&q, b + 1, bl - 1, match);
            free(b);
        }
        q.start = ne ? prog_alts(&q, e, ne) : 0;
        free(e);
        if (!ne)
            prog_release(&q);
        else if (str_auto_add(c, &sa, &q, SR_MUST_NOT, ptr, "not"))
            goto out;
    }
    if (sa.n == 2 && sa.role[1] == SR_MUST && !lengths) {
        /* one format or pattern alone after all: its own program, as without lengths */
        const char *re = fre ? fre : json_string_value(pat);
        size_t len = fre ? strlen(fre) : json_string_length(pat);
        uint32_t close = prog_lit(p, "\"", 1, next);
        result = prog_lit(
            p, "\"", 1,
            cst_regex_emit(p, re, len, (fre ? RE_WHOLE : RE_SEARCH) | RE_JSON_STRING, close));
        goto out;
    }
    /* the keyword an automaton too large is named by */
    const char *kw = notpats || json_array_size(notstrs) ? "not"
                     : lengths                           ? (lo > 0 ? "minLength" : "maxLength")
                     : pat                               ? "pattern"
                                                         : "format";
    result = prog_lit(p, "\"", 1, auto_product(c, &sa, ptr, kw, true, lo, hi, next));
    goto out;
oom:
    prog_fail(p, -ENOMEM, "out of memory");
out:
    cps_free(&all);
    str_auto_release(&sa);
    return p->failed ? 0 : result;
}

/* ---- multipleOf --------------------------------------------------------------------- */

#define SC_MAX_MODULUS 1000

/* A component: an optional minus and digits whose value is a multiple of m (the remainder
 * digit by digit: r -> (10 r + d) mod m). */
static int auto_mod(sc_ctx *c, str_auto *a, uint64_t m, int role, const char *ptr)
{
    cst_prog q;
    if (prog_init(&q)) return prog_fail(c->p, -ENOMEM, "out of memory"), -ENOMEM;
    uint32_t match = prog_emit(&q, OP_MATCH, 0, 0);
    uint32_t *st = malloc(m * sizeof *st);
    if (!st) {
        prog_release(&q);
        return prog_fail(c->p, -ENOMEM, "out of memory"), -ENOMEM;
    }
    for (uint64_t r = 0; r < m; r++) st[r] = prog_emit(&q, OP_JMP, 0, 0);
    for (uint64_t r = 0; r < m && !q.failed; r++) {
        uint32_t alts[11];
        size_t na = 0;
        for (uint64_t d = 0; d < 10; d++)
            alts[na++] =
                prog_range(&q, (uint8_t)('0' + d), (uint8_t)('0' + d), st[(10 * r + d) % m]);
        if (r == 0) alts[na++] = match;
        prog_patch(&q, st[r], prog_alts(&q, alts, na));
    }
    q.start = prog_split(&q, prog_lit(&q, "-", 1, st[0]), st[0]);
    free(st);
    return str_auto_add(c, a, &q, role, ptr, "multipleOf");
}

/* The integer value of a multipleOf (here or in not's list), 0 after an error. */
static uint64_t modulus(sc_ctx *c, json_t *v, const char *ptr, const char *kw)
{
    double m = json_is_number(v) ? json_number_value(v) : 0;
    if (!(m > 0)) return sc_err(c, ptr, kw, "not a positive number"), 0;
    if (m != floor(m) || m > SC_MAX_MODULUS)
        return sc_err(c, ptr, kw, "multipleOf supported only as an integer up to 1000"), 0;
    return (uint64_t)m;
}

/*
 * Integers within the bounds that are multiples of multipleOf and of none of KW_NOTMULT's
 * (a number schema too: integers only, stricter): the product of the range's automaton and
 * one remainder automaton per modulus. Exact for the integers it writes.
 */
static uint32_t multiple_number(sc_ctx *c, json_t *s, const char *ptr, const num_bounds *b,
                                uint32_t next)
{
    json_t *mo = json_object_get(s, "multipleOf"), *nm = json_object_get(s, KW_NOTMULT);
    uint64_t mods[SC_STR_COMPS];
    int roles[SC_STR_COMPS], n = 0;
    if (mo) {
        if (!(mods[n] = modulus(c, mo, ptr, "multipleOf"))) return 0;
        roles[n++] = SR_MUST;
    }
    size_t i;
    json_t *x;
    json_array_foreach(nm, i, x)
    {
        if (n == SC_STR_COMPS - 1) return sc_err(c, ptr, "not", "too many multipleOf");
        if (!(mods[n] = modulus(c, x, ptr, "not"))) return 0;
        if (mods[n] == 1) return 0; /* every integer is a multiple of 1 */
        roles[n++] = SR_MUST_NOT;
    }
    int64_t lo, hi;
    if (!int_bounds(b, &lo, &hi)) return 0;
    cst_prog q;
    if (prog_init(&q)) return prog_fail(c->p, -ENOMEM, "out of memory");
    sc_ctx tc = {.p = &q};
    q.start = int_range(&tc, lo, hi, prog_emit(&q, OP_MATCH, 0, 0));
    if (!q.failed && !q.start) {
        prog_release(&q);
        return 0;
    }
    str_auto sa = {0};
    uint32_t pc = 0;
    if (!str_auto_add(c, &sa, &q, SR_ANY, ptr, "multipleOf")) {
        int k;
        for (k = 0; k < n; k++)
            if (mods[k] > 1 && auto_mod(c, &sa, mods[k], roles[k], ptr)) break;
        if (k == n) pc = auto_product(c, &sa, ptr, "multipleOf", false, 0, -1, next);
    }
    str_auto_release(&sa);
    return c->p->failed ? 0 : pc;
}

/* "name": value, or name=value (kw: a call's keyword argument) */
static uint32_t member(sc_ctx *c, const sc_prop *pr, bool call, bool kw, uint32_t next)
{
    uint32_t val =
        call ? sc_call(c, pr->schema, pr->ptr, next) : sc_value(c, pr->schema, pr->ptr, next);
    if (kw)
        return prog_lit(c->p, pr->name, strlen(pr->name),
                        prog_ws(c->p, prog_lit(c->p, "=", 1, prog_ws(c->p, val))));
    return sc_lit_str(c, pr->name, strlen(pr->name),
                      prog_ws(c->p, prog_lit(c->p, ":", 1, prog_ws(c->p, val))));
}

/* whether name is a Python identifier (ASCII) */
static bool py_identifier(const char *name)
{
    if (!*name || (*name >= '0' && *name <= '9')) return false;
    for (const char *q = name; *q; q++)
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
              *q == '_'))
            return false;
    return true;
}

static uint32_t sc_object(sc_ctx *c, json_t *s, const char *ptr, uint32_t next)
{
    cst_prog *p = c->p;
    bool kw = c->kwargs; /* a call's keyword arguments: only the named ones, as name=value */
    c->kwargs = false;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    json_t *uneval = json_object_get(s, "unevaluatedProperties");
    json_t *pp = json_object_get(s, "patternProperties"), *pn = json_object_get(s, "propertyNames");
    if (pp && !json_is_object(pp)) return sc_err(c, ptr, "patternProperties", "not an object");
    if (pn && !bool_schema_true(pn) &&
        !(json_is_object(pn) && sc_types(pn) == T_STR && json_object_size(pn) == 1))
        return sc_err(c, ptr, "propertyNames", "not supported");
    static const char *const deps[] = {"dependentRequired", "dependencies", "dependentSchemas",
                                       NULL};
    for (int i = 0; deps[i]; i++) {
        json_t *d = json_object_get(s, deps[i]);
        if (d && !(json_is_object(d) && json_object_size(d) == 0))
            return sc_err(c, ptr, deps[i], "not supported");
    }
    if (props && !json_is_object(props)) return sc_err(c, ptr, "properties", "not an object");
    if (req && !json_is_array(req)) return sc_err(c, ptr, "required", "not an array");
    if (!addl && uneval)
        addl = uneval;
    else if (addl && uneval && !bool_schema_true(uneval) && !json_equal(addl, uneval))
        return sc_err(c, ptr, "unevaluatedProperties", "not supported beside additionalProperties");
    bool addl_allowed = !json_is_false(addl) && !kw;
    if (kw && pp && json_object_size(pp))
        return sc_err(c, ptr, "patternProperties", "not supported in a call's arguments");
    /* patternProperties: where every pattern's schema allows anything and so do the
     * additional properties, they change nothing */
    bool has_pp = false;
    if (pp && json_object_size(pp)) {
        const char *k;
        json_t *v;
        has_pp = !(addl_allowed && (!addl || is_true_schema(addl)));
        json_object_foreach(pp, k, v) has_pp |= !is_true_schema(v);
    }
    sc_keys keys = {0};
    size_t np = props ? json_object_size(props) : 0, nr = req ? json_array_size(req) : 0;
    sc_prop *pr = calloc(np + nr + 1, sizeof *pr);
    if (!pr) return prog_fail(p, -ENOMEM, "out of memory");
    size_t n = 0, nreq = 0;
    char pbuf[512];
    ptr_child(pbuf, sizeof pbuf, ptr, "properties");
    if (props) {
        const char *k;
        json_t *v;
        json_object_foreach(props, k, v)
        {
            pr[n].name = k;
            pr[n].schema = v;
            ptr_child(pr[n].ptr, sizeof pr[n].ptr, pbuf, k);
            n++;
        }
    }
    for (size_t i = 0; i < nr; i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) {
            free(pr);
            return sc_err(c, ptr, "required", "not an array of strings");
        }
        size_t j;
        for (j = 0; j < n; j++)
            if (!strcmp(pr[j].name, json_string_value(r))) break;
        if (j == n) { /* required but not in properties: its schema is additionalProperties
                       * (or its patterns', below) */
            if (!addl_allowed && !has_pp) {
                free(pr);
                return 0; /* no object can have it */
            }
            pr[n].name = json_string_value(r);
            pr[n].from_addl = true;
            pr[n].schema = !addl_allowed ? json_false() : addl ? addl : json_true();
            snprintf(pr[n].ptr, sizeof pr[n].ptr, "%s/additionalProperties", ptr);
            n++;
        }
        if (!pr[j].required) nreq++;
        pr[j].required = true;
    }
    for (size_t i = 0; kw && i < n; i++)
        if (!py_identifier(pr[i].name)) {
            free(pr);
            return sc_err(c, ptr, "properties",
                          "a parameter whose name is not a Python identifier cannot be a keyword "
                          "argument");
        }
    /* a named property that a pattern matches: both schemas */
    if (has_pp) {
        if (keys_build(c, &keys, pp, pr, n, ptr)) {
            keys_release(&keys);
            free(pr);
            return 0;
        }
        for (size_t i = 0; i < n && !p->failed; i++) {
            long bits = keys_match(&keys, pr[i].name);
            if (bits <= 0) continue;
            pr[i].schema =
                keys_schema(c, &keys, bits, pr[i].from_addl ? NULL : pr[i].schema, NULL, pr[i].ptr);
        }
        if (p->failed) {
            keys_release(&keys);
            free(pr);
            return 0;
        }
    }
    /* a property whose schema is false cannot appear */
    for (size_t i = 0; i < n; i++)
        if (json_is_false(pr[i].schema)) {
            if (pr[i].required) {
                keys_release(&keys);
                free(pr);
                return 0;
            }
        }
    json_t *minp = json_object_get(s, "minProperties"), *maxp = json_object_get(s, "maxProperties");
    if (minp && (!json_is_integer(minp) || json_integer_value(minp) > (json_int_t)nreq)) {
        keys_release(&keys);
        free(pr);
        return sc_err(c, ptr, "minProperties",
                      "not supported beyond the number of required properties");
    }
    if (maxp && (!json_is_integer(maxp) || addl_allowed || has_pp ||
                 json_integer_value(maxp) < (json_int_t)n)) {
        keys_release(&keys);
        free(pr);
        return sc_err(c, ptr, "maxProperties",
                      "not supported below the number of possible properties");
    }
    /* first required index: the "nothing emitted yet" chain ends there */
    size_t first_req = n;
    for (size_t i = 0; i < n; i++)
        if (pr[i].required) {
            first_req = i;
            break;
        }
    uint32_t close = prog_ws(p, prog_lit(p, kw ? ")" : "}", 1, next));
    uint32_t rest_addl = close, first_addl = close;
    if (addl_allowed || has_pp) {
        json_t *as = addl ? addl : json_true();
        char aptr[512];
        snprintf(aptr, sizeof aptr, "%s/additionalProperties", ptr);
        uint32_t loop = prog_split(p, 0, close), m1, m0 = 0;
        if (has_pp) {
            m1 = m0 = keys_member(c, &keys, addl_allowed ? as : NULL, aptr, loop);
        } else {
            uint32_t v1 = sc_call(c, as, aptr, loop);
            m1 = key_other_than(c, pr, n, prog_ws(p, prog_lit(p, ":", 1, prog_ws(p, v1))));
            if (first_req == n) {
                uint32_t v0 = sc_call(c, as, aptr, loop);
                m0 = key_other_than(c, pr, n, prog_ws(p, prog_lit(p, ":", 1, prog_ws(p, v0))));
            }
        }
        prog_patch(p, loop, prog_ws(p, prog_lit(p, ",", 1, prog_ws(p, m1))));
        rest_addl = loop;
        if (first_req == n) first_addl = prog_split(p, m0, close);
    }
    keys_release(&keys);
    uint32_t rest_next = rest_addl, first_next = first_addl;
    for (size_t i = n; i-- > 0 && !p->failed;) {
        if (json_is_false(pr[i].schema)) continue; /* never present */
        bool twice = i <= first_req;
        uint32_t r =
            prog_ws(p, prog_lit(p, ",", 1, prog_ws(p, member(c, &pr[i], twice, kw, rest_next))));
        uint32_t new_rest = pr[i].required ? r : prog_split(p, r, rest_next);
        if (twice) {
            uint32_t f = member(c, &pr[i], true, kw, rest_next);
            first_next = pr[i].required ? f : prog_split(p, f, first_next);
        }
        rest_next = new_rest;
    }
    free(pr);
    return prog_lit(p, kw ? "(" : "{", 1, prog_ws(p, first_next));
}

/* ---- arrays ---------------------------------------------------------------------------- */

static uint32_t sc_array(sc_ctx *c, json_t *s, const char *ptr, uint32_t next)
{
    cst_prog *p = c->p;
    json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    json_t *addi = json_object_get(s, "additionalItems");
    json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    json_t *uniq = json_object_get(s, "uniqueItems"), *contains = json_object_get(s, "contains");
    json_t *unev = json_object_get(s, "unevaluatedItems");
    if (contains) return sc_err(c, ptr, "contains", "not supported");
    if (unev && !bool_schema_true(unev)) return sc_err(c, ptr, "unevaluatedItems", "not supported");
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)))
        return sc_err(c, ptr, mn && !json_is_integer(mn) ? "minItems" : "maxItems",
                      "not an integer");
    long long lo = mn ? json_integer_value(mn) : 0, hi = mx ? json_integer_value(mx) : -1;
    if (lo < 0) lo = 0;
    if (hi >= 0 && hi < lo) return 0;
    const char *prefix_kw = "prefixItems";
    json_t *rest = items;
    if (json_is_array(items)) { /* draft 4-2019: items as a tuple, additionalItems after it */
        if (prefix) return sc_err(c, ptr, "items", "an array beside prefixItems");
        prefix = items;
        prefix_kw = "items";
        rest = addi;
    }
    if (prefix && !json_is_array(prefix)) return sc_err(c, ptr, "prefixItems", "not an array");
    if (!rest) rest = json_true();
    size_t np = prefix ? json_array_size(prefix) : 0;
    long long maxc = json_is_false(rest) ? (long long)np : -1;
    if (hi >= 0 && (maxc < 0 || hi < maxc)) maxc = hi;
    if (maxc >= 0 && maxc < lo) return 0;
    if (json_is_true(uniq) && maxc != 0 && maxc != 1)
        return sc_err(c, ptr, "uniqueItems", "not supported");
    if (lo > SC_MAX_MIN)
        return prog_fail(p, -E2BIG, "keyword 'minItems' at %s: above %d", *ptr ? ptr : "/",
                         SC_MAX_MIN);
    if (maxc > SC_MAX_COUNT) maxc = SC_MAX_COUNT; /* stricter */
    if (maxc >= 0 && maxc < lo) maxc = lo;
    if ((long long)np > SC_MAX_COUNT)
        return prog_fail(p, -E2BIG, "keyword 'prefixItems' at %s: too many", *ptr ? ptr : "/");
    char rptr[512];
    snprintf(rptr, sizeof rptr, "%s/%s", ptr, json_is_array(items) ? "additionalItems" : "items");
    uint32_t close = prog_ws(p, prog_lit(p, "]", 1, next));
    /* after[i]: i items written */
    long long K = (long long)np > lo ? (long long)np : lo; /* first position of the open tail */
    uint32_t after;
    long long top;
    if (maxc < 0) {
        uint32_t loop = prog_split(p, 0, close);
        prog_patch(p, loop,
                   prog_ws(p, prog_lit(p, ",", 1, prog_ws(p, sc_call(c, rest, rptr, loop)))));
        after = loop;
        top = K;
        if (K == 0) {
            uint32_t first = sc_call(c, rest, rptr, loop);
            return prog_lit(p, "[", 1, prog_ws(p, prog_split(p, first, close)));
        }
    } else {
        after = close;
        top = maxc;
    }
    for (long long i = top - 1; i >= 0 && !p->failed; i--) {
        char iptr[512];
        json_t *is;
        uint32_t it;
        if (i < (long long)np) {
            ptr_index(iptr, sizeof iptr, ptr, prefix_kw, (size_t)i);
            is = json_array_get(prefix, (size_t)i);
            it = sc_value(c, is, iptr, after);
        } else
            it = sc_call(c, rest, rptr, after);
        uint32_t elem = i ? prog_ws(p, prog_lit(p, ",", 1, prog_ws(p, it))) : it;
        after = i >= lo ? prog_split(p, elem, close) : elem;
    }
    if (top == 0) after = close;
    return prog_lit(p, "[", 1, prog_ws(p, after));
}

/* ---- one schema ------------------------------------------------------------------------ */

static const char *const unsupported[] = {
    "if", "$dynamicRef", "$recursiveRef", "disallow", "extends", "divisibleBy", NULL};

/* x is {required: [k]} (one key, nothing else asserted): *key = k */
static bool one_required(json_t *x, const char **key)
{
    if (!json_is_object(x) || has_assertions_besides(x, (const char *const[]){"required", NULL}))
        return false;
    json_t *r = json_object_get(x, "required");
    if (!json_is_array(r) || json_array_size(r) != 1 || !json_is_string(json_array_get(r, 0)))
        return false;
    *key = json_string_value(json_array_get(r, 0));
    return true;
}

/*
 * not {enum: [...]} / not {const: v}: the values of the kinds *types allows are taken out —
 * null and booleans from *types and *bools (bit 0: true taken out, bit 1: false), strings
 * into *strs (a new array: sc_value writes "any string but these", exact because a string is
 * written in json.dumps's one form). Numbers (1, 1.0 and 1e0 are one value), arrays and
 * objects among the values of a kind *types allows are refused.
 */
static int not_values(sc_ctx *c, json_t *nt, const char *ptr, int *types, json_t **strs, int *bools)
{
    json_t *cv = json_object_get(nt, "const"), *ev = json_object_get(nt, "enum");
    if (ev && !json_is_array(ev)) return sc_err(c, ptr, "not", "its enum is not an array"), 0;
    size_t n = cv ? 1 : json_array_size(ev);
    for (size_t i = 0; i < n; i++) {
        json_t *v = cv ? cv : json_array_get(ev, i);
        if (cv && ev) { /* const and enum: the const is taken out if the enum has it */
            size_t j;
            json_t *y;
            bool found = false;
            json_array_foreach(ev, j, y) found |= json_equal(y, cv);
            if (!found) break;
        }
        if (!type_allows(*types, v)) continue; /* not a value this schema could give */
        int vt = value_type(v);
        if (vt == T_NULL) {
            *types &= ~T_NULL;
        } else if (vt == T_BOOL) {
            *bools |= json_is_true(v) ? 1 : 2;
            if (*bools == 3) *types &= ~T_BOOL;
        } else if (vt == T_STR) {
            if (!*strs) {
                *strs = json_array();
                if (!*strs) return prog_fail(c->p, -ENOMEM, "out of memory"), 0;
                json_array_append_new(c->keep, *strs);
            }
            if (memchr(json_string_value(v), 0, json_string_length(v)))
                return sc_err(c, ptr, "not", "of a string holding U+0000 is not supported"), 0;
            json_array_append(*strs, v);
        } else {
            return sc_err(c, ptr, "not",
                          vt & T_NUM ? "of enum/const numbers is not supported"
                                     : "of enum/const arrays or objects is not supported"),
                   0;
        }
    }
    return *types ? 0 : -1;
}

/*
 * `not` in the forms that remove whole JSON types: not {} / not true (nothing validates),
 * not false (no constraint), not {"type": ...}; in the forms that forbid properties:
 * not {required: [k]} and not {anyOf: [{required: [k1]}, {required: [k2]}, ...]} (only an
 * object without those keys validates: *s becomes a copy whose properties make them false);
 * and not {enum} / not {const} of strings, null and booleans (not_values). (not {not: X} is
 * X, merged by sc_value before this.)
 * Narrows *types; returns -1 when nothing may validate, 0 otherwise (errors recorded).
 */
static int sc_not(sc_ctx *c, json_t **sp, const char *ptr, int *types, json_t **strs, int *bools)
{
    json_t *s = *sp, *nt = json_object_get(s, "not");
    if (!nt || json_is_false(nt)) return 0;
    if (bool_schema_true(nt)) return -1;
    if (json_is_object(nt) && (json_object_get(nt, "enum") || json_object_get(nt, "const")) &&
        !has_assertions_besides(nt, (const char *const[]){"enum", "const", NULL}))
        return not_values(c, nt, ptr, types, strs, bools);
    const char *key;
    json_t *alts = json_is_object(nt) ? json_object_get(nt, "anyOf") : NULL;
    bool forbid = one_required(nt, &key);
    if (!forbid && json_is_array(alts) && json_array_size(alts) &&
        !has_assertions_besides(nt, (const char *const[]){"anyOf", NULL})) {
        forbid = true;
        for (size_t i = 0; i < json_array_size(alts) && forbid; i++)
            forbid = one_required(json_array_get(alts, i), &key);
    }
    if (forbid) {
        *types &= T_OBJ; /* `required` holds for anything else: `not` of it fails */
        if (!*types) return -1;
        json_t *cp = json_object(), *props = json_object();
        json_array_append_new(c->keep, cp);
        json_object_update(cp, s);
        json_object_del(cp, "not");
        json_t *old = json_object_get(s, "properties");
        if (json_is_object(old)) json_object_update(props, old);
        if (one_required(nt, &key))
            json_object_set(props, key, json_false());
        else
            for (size_t i = 0; i < json_array_size(alts); i++)
                if (one_required(json_array_get(alts, i), &key))
                    json_object_set(props, key, json_false());
        json_object_set_new(cp, "properties", props);
        *sp = cp;
        return 0;
    }
    if (!json_is_object(nt) || has_assertions_besides(nt, (const char *const[]){"type", NULL}))
        return sc_err(c, ptr, "not",
                      "supported only as not {}, not true/false, not {type}, not {enum/const} "
                      "and not of required properties"),
               0;
    int tn = sc_types(nt);
    if (tn < 0) return sc_err(c, ptr, "not", "not a type name or a list of them"), 0;
    if (tn & T_NUM) tn |= T_INT;
    /* not integer, where numbers are allowed: the numbers with a fraction; not supported */
    if ((tn & T_INT) && !(tn & T_NUM) && (*types & T_NUM))
        return sc_err(c, ptr, "not", "not {type: integer} beside numbers is not supported"), 0;
    *types &= ~tn;
    return *types ? 0 : -1;
}

/*
 * Whether sc_not (above) and sc_value take `not` nt of schema s (types: its types) in the
 * forms they always have: what is left goes through neg_pieces below.
 */
static bool not_basic(json_t *s, json_t *nt, int types)
{
    if (!nt || !json_is_object(nt) || bool_schema_true(nt)) return true;
    json_t *cv = json_object_get(nt, "const"), *ev = json_object_get(nt, "enum");
    if ((cv || ev) && !has_assertions_besides(nt, (const char *const[]){"enum", "const", NULL})) {
        if (ev && !json_is_array(ev)) return true; /* its error */
        size_t n = cv ? 1 : json_array_size(ev);
        for (size_t i = 0; i < n; i++) {
            json_t *v = cv ? cv : json_array_get(ev, i);
            if (!type_allows(types, v)) continue;
            int vt = value_type(v);
            if (vt & (T_NUM | T_OBJ | T_ARR)) return false;
            if (vt == T_STR) {
                static const char *const other[] = {"minLength", "maxLength", "pattern", "format",
                                                    NULL};
                if (memchr(json_string_value(v), 0, json_string_length(v))) return false;
                for (int k = 0; other[k]; k++)
                    if (json_object_get(s, other[k])) return false;
            }
        }
        return true;
    }
    const char *key;
    if (one_required(nt, &key)) return true;
    json_t *alts = json_object_get(nt, "anyOf");
    if (json_is_array(alts) && json_array_size(alts) &&
        !has_assertions_besides(nt, (const char *const[]){"anyOf", NULL})) {
        bool all = true;
        for (size_t i = 0; i < json_array_size(alts) && all; i++)
            all = one_required(json_array_get(alts, i), &key);
        if (all) return true;
    }
    if (has_assertions_besides(nt, (const char *const[]){"type", NULL})) return false;
    int tn = sc_types(nt);
    if (tn < 0) return true; /* its error */
    if (tn & T_NUM) tn |= T_INT;
    return !((tn & T_INT) && !(tn & T_NUM) && (types & T_NUM));
}

/* ---- not: the complement as a union of schemas ----------------------------------------- */

static json_t *type_list(int t)
{
    static const char *const names[] = {"null",   "boolean", "object", "array",
                                        "string", "number",  "integer"};
    json_t *a = json_array();
    for (int i = 0; i < 7; i++)
        if (t & (1 << i)) json_array_append_new(a, json_string(names[i]));
    return a;
}

/* Appends {type: t, k: v} (k NULL: the type alone) to out; v is taken over. */
static json_t *piece(json_t *out, int t, const char *k, json_t *v)
{
    json_t *o = json_object();
    json_object_set_new(o, "type", type_list(t));
    if (k) json_object_set_new(o, k, v);
    json_array_append_new(out, o);
    return o;
}

/* The type a piece about numbers takes within types T (integer where T has no number). */
static int num_type(int T)
{
    return (T & T_NUM) ? T_NUM : (T & T_INT) ? T_INT : 0;
}

static json_t *num_json(double v)
{
    if (v == floor(v) && fabs(v) < 9007199254740992.0) return json_integer((json_int_t)v);
    return json_real(v);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The instances of types T that are none of the values vals (an array). */
static int neg_values(sc_ctx *c, json_t *vals, int T, const char *ptr, json_t *out)
{
    size_t n = json_array_size(vals), i, nn = 0;
    json_t *v;
    double *nums = calloc(n + 1, sizeof *nums);
    json_t *strs = json_array(), *rest = json_array();
    int composite = 0;
    if (!nums || !strs || !rest) {
        free(nums);
        json_decref(strs);
        json_decref(rest);
        return prog_fail(c->p, -ENOMEM, "out of memory"), -1;
    }
    json_array_foreach(vals, i, v)
    {
        int vt = value_type(v);
        if (vt == T_STR)
            json_array_append(strs, v);
        else if (vt & T_NUM) {
            double d = json_number_value(v);
            if (fabs(d) >= 9007199254740992.0) {
                free(nums);
                json_decref(strs);
                json_decref(rest);
                return sc_err(c, ptr, "not", "of enum/const numbers beyond 2^53 is not supported"),
                       -1;
            }
            nums[nn++] = d;
        } else if (vt & (T_OBJ | T_ARR))
            composite |= vt;
    }
    /* null and the booleans */
    for (int k = 0; k < 3; k++) {
        json_t *l = k == 0 ? json_null() : k == 1 ? json_true() : json_false();
        bool in = false;
        json_array_foreach(vals, i, v) in |= json_equal(v, l);
        if (!in && (T & (k == 0 ? T_NULL : T_BOOL))) json_array_append(rest, l);
    }
    if (json_array_size(rest)) {
        json_t *o = json_object();
        json_object_set_new(o, "enum", rest);
        json_array_append_new(out, o);
    } else
        json_decref(rest);
    if (T & T_STR) {
        if (json_array_size(strs))
            piece(out, T_STR, KW_NOTSTRS, strs);
        else {
            piece(out, T_STR, NULL, NULL);
            json_decref(strs);
        }
    } else
        json_decref(strs);
    int nt = num_type(T);
    if (nt) { /* the open intervals between the values */
        qsort(nums, nn, sizeof *nums, cmp_double);
        if (!nn) piece(out, nt, NULL, NULL);
        for (size_t k = 0; k <= nn && nn; k++) {
            if (k > 0 && k < nn && nums[k] == nums[k - 1]) continue;
            json_t *o = piece(out, nt, NULL, NULL);
            if (k > 0) json_object_set_new(o, "exclusiveMinimum", num_json(nums[k - 1]));
            if (k < nn) json_object_set_new(o, "exclusiveMaximum", num_json(nums[k]));
        }
    }
    free(nums);
    int comp = T & (T_OBJ | T_ARR);
    if (composite & comp)
        return sc_err(c, ptr, "not", "of enum/const arrays or objects is not supported"), -1;
    if (comp) piece(out, comp, NULL, NULL);
    return 0;
}

static int neg_pieces(sc_ctx *c, json_t *x, const char *ptr, json_t *out);
static bool provably_disjoint(sc_ctx *c, json_t *a, json_t *b);

/* The instances that match two or more of oneOf's alternatives (alts): each pair that can
 * both match, merged, appended to out. */
static int one_pairs(sc_ctx *c, json_t *alts, const char *ptr, json_t *out)
{
    size_t n = json_array_size(alts), added = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            json_t *a = sc_flatten(c, json_array_get(alts, i), ptr);
            json_t *b = a ? sc_flatten(c, json_array_get(alts, j), ptr) : NULL;
            if (!b) return -1;
            if (provably_disjoint(c, a, b)) continue;
            if (++added > SC_MAX_ALTS) return sc_err(c, ptr, "not", "of oneOf: too many pairs"), -1;
            json_t *m = sc_merge(c, a, b, ptr);
            if (!m) return -1;
            json_array_append(out, m);
        }
    return 0;
}

/*
 * not x as schemas any of which an instance matches exactly when it does not match x (a
 * union: they may overlap), appended to out. not (A and B) is not A or not B: x's keywords
 * are taken one by one, each the instances of its own kind that it refuses (a keyword about
 * numbers refuses no string), within x's types; the types x does not allow are one more
 * piece. not {anyOf: [A, B]} is not A and not B (each pair of their pieces merged); not
 * {not: Z} beside other keywords Y is not Y or Z. What has no exact piece is an error.
 */
static int neg_pieces_1(sc_ctx *c, json_t *x, const char *ptr, json_t *out)
{
    x = sc_flatten(c, x, ptr);
    if (!x) return -1;
    if (json_is_false(x)) return json_array_append_new(out, json_true()), 0;
    if (is_true_schema(x)) return 0;
    if (!json_is_object(x)) return sc_err(c, ptr, "not", "not a schema"), -1;
    json_t *z = json_object_get(x, "not"), *any = json_object_get(x, "anyOf");
    json_t *one = json_object_get(x, "oneOf");
    if (z || any || one) {
        const char *kw = z ? "not" : any ? "anyOf" : "oneOf";
        json_t *y = json_object();
        json_array_append_new(c->keep, y);
        json_object_update(y, x);
        json_object_del(y, kw);
        if (z) {
            json_array_append(out, z);
            return neg_pieces(c, y, ptr, out);
        }
        if (neg_pieces(c, y, ptr, out) < 0) return -1;
        if (!any) any = one;
        if (!json_is_array(any) || !json_array_size(any))
            return sc_err(c, ptr, kw, "not a non-empty array"), -1;
        json_t *acc = json_array();
        json_array_append_new(c->keep, acc);
        json_array_append_new(acc, json_object());
        size_t i, j, k;
        json_t *alt, *a, *b;
        json_array_foreach(any, i, alt)
        {
            json_t *ni = json_array(), *next = json_array();
            json_array_append_new(c->keep, ni);
            json_array_append_new(c->keep, next);
            if (neg_pieces(c, alt, ptr, ni) < 0) return -1;
            if (json_array_size(acc) * json_array_size(ni) > SC_MAX_ALTS)
                return sc_err(c, ptr, "not", "of anyOf: too many alternatives"), -1;
            json_array_foreach(acc, j, a) json_array_foreach(ni, k, b)
            {
                json_t *m = sc_merge(c, a, b, ptr);
                if (!m) return -1;
                json_array_append(next, m);
            }
            acc = next;
        }
        json_array_extend(out, acc); /* none of them */
        /* oneOf: two or more of them */
        if (one && one_pairs(c, one, ptr, out)) return -1;
        return 0;
    }
    int T = sc_types(x);
    if (T < 0) return sc_err(c, ptr, "type", "not a type name or a list of them"), -1;
    /* the types x does not allow */
    int oth = (T_NULL | T_BOOL | T_OBJ | T_ARR | T_STR) & ~T;
    if (!(T & (T_NUM | T_INT))) oth |= T_NUM;
    if (oth) piece(out, oth, NULL, NULL);
    if ((T & T_INT) && !(T & T_NUM)) piece(out, T_NUM, KW_NONINT, json_true());
    bool bounds_done = false;
    const char *k;
    json_t *v;
    json_object_foreach(x, k, v)
    {
        if (!is_assertion(k) || !strcmp(k, "type")) continue;
        char what[160];
        snprintf(what, sizeof what, "of '%.80s' is not supported", k);
        if (!strcmp(k, "enum") || !strcmp(k, "const")) {
            if (!strcmp(k, "enum") && !json_is_array(v))
                return sc_err(c, ptr, "not", "its enum is not an array"), -1;
            json_t *vals = v;
            if (!strcmp(k, "const")) {
                vals = json_array();
                json_array_append_new(c->keep, vals);
                json_array_append(vals, v);
            }
            if (neg_values(c, vals, T, ptr, out) < 0) return -1;
        } else if (!strcmp(k, "minimum") || !strcmp(k, "maximum") ||
                   !strcmp(k, "exclusiveMinimum") || !strcmp(k, "exclusiveMaximum")) {
            num_bounds b;
            int nt = num_type(T);
            if (bounds_done || !nt) continue;
            bounds_done = true;
            if (read_bounds(c, x, ptr, &b)) return -1;
            if (b.has_lo)
                piece(out, nt, b.lo_excl ? "maximum" : "exclusiveMaximum", num_json(b.lo));
            if (b.has_hi)
                piece(out, nt, b.hi_excl ? "minimum" : "exclusiveMinimum", num_json(b.hi));
        } else if (!strcmp(k, "minLength") || !strcmp(k, "maxLength") || !strcmp(k, "minItems") ||
                   !strcmp(k, "maxItems")) {
            int t = k[3] == 'L' ? T_STR : T_ARR;
            if (!json_is_integer(v) || json_integer_value(v) < 0)
                return sc_err(c, ptr, k, "not a non-negative integer"), -1;
            json_int_t n = json_integer_value(v);
            if (!(T & t) || (k[1] == 'i' && n == 0)) continue;
            bool is_min = k[1] == 'i';
            char other[16];
            snprintf(other, sizeof other, "%s%s", is_min ? "max" : "min", k + 3);
            piece(out, t, other, json_integer(is_min ? n - 1 : n + 1));
        } else if (!strcmp(k, "multipleOf")) {
            uint64_t m = modulus(c, v, ptr, "not");
            if (!m) return -1;
            if (T & T_NUM) piece(out, T_NUM, KW_NONINT, json_true()); /* no multiple */
            if (m > 1 && (T & (T_NUM | T_INT))) {
                json_t *l = json_array();
                json_array_append_new(l, json_integer((json_int_t)m));
                piece(out, T_INT, KW_NOTMULT, l);
            }
        } else if (!strcmp(k, "pattern")) {
            if (!json_is_string(v)) return sc_err(c, ptr, "pattern", "not a string"), -1;
            if (!(T & T_STR)) continue;
            json_t *l = json_array();
            json_array_append(l, v);
            piece(out, T_STR, KW_NOTPATS, l);
        } else if (!strcmp(k, "required")) {
            if (!json_is_array(v)) return sc_err(c, ptr, "required", "not an array"), -1;
            if (!(T & T_OBJ)) continue;
            size_t i;
            json_t *r;
            json_array_foreach(v, i, r)
            {
                if (!json_is_string(r))
                    return sc_err(c, ptr, "required", "not an array of strings"), -1;
                json_t *pr = json_object();
                json_object_set(pr, json_string_value(r), json_false());
                piece(out, T_OBJ, "properties", pr);
            }
        } else if (!strcmp(k, "properties")) {
            if (!json_is_object(v)) return sc_err(c, ptr, "properties", "not an object"), -1;
            if (!(T & T_OBJ)) continue;
            const char *name;
            json_t *ps;
            json_object_foreach(v, name, ps)
            {
                if (is_true_schema(ps)) continue;
                json_t *req = json_array(), *pr = json_object(), *n = json_object();
                json_array_append_new(req, json_string(name));
                json_object_set(n, "not", ps);
                json_object_set_new(pr, name, n);
                json_t *o = piece(out, T_OBJ, "required", req);
                json_object_set_new(o, "properties", pr);
            }
        } else if ((!strcmp(k, "items") || !strcmp(k, "additionalProperties") ||
                    !strcmp(k, "additionalItems") || !strcmp(k, "propertyNames") ||
                    !strcmp(k, "unevaluatedProperties") || !strcmp(k, "unevaluatedItems")) &&
                   is_true_schema(v)) {
            continue; /* allows everything */
        } else if (!strcmp(k, "uniqueItems") && json_is_false(v)) {
            continue;
        } else if (!strcmp(k, "patternProperties") && json_is_object(v)) {
            const char *pk;
            json_t *pv;
            bool trivial = true;
            json_object_foreach(v, pk, pv) trivial &= is_true_schema(pv);
            if (!trivial) return sc_err(c, ptr, "not", what), -1;
        } else {
            return sc_err(c, ptr, "not", what), -1;
        }
    }
    return 0;
}

static int neg_pieces(sc_ctx *c, json_t *x, const char *ptr, json_t *out)
{
    if (c->p->failed) return -1;
    if (++c->depth > SC_MAX_DEPTH) {
        c->depth--;
        return sc_err(c, ptr, "not", "nested too deeply"), -1;
    }
    int rc = neg_pieces_1(c, x, ptr, out);
    c->depth--;
    return c->p->failed ? -1 : rc;
}

static int kinds_of(json_t *s)
{
    /* JSON kinds an instance may have: integer counts as number */
    if (json_is_false(s)) return 0;
    if (!json_is_object(s)) return T_ALL & ~T_INT;
    json_t *cv = json_object_get(s, "const"), *ev = json_object_get(s, "enum");
    int k = 0;
    if (cv)
        k = value_type(cv);
    else if (json_is_array(ev)) {
        size_t i;
        json_t *x;
        json_array_foreach(ev, i, x) k |= value_type(x);
    } else {
        int t = sc_types(s);
        k = t < 0 ? T_ALL : t;
    }
    if (k & T_INT) k |= T_NUM;
    return k & ~T_INT;
}

static bool values_disjoint(json_t *a, json_t *b)
{
    /* a, b: const values or enum arrays */
    json_t *aa = json_is_array(a) ? a : NULL, *bb = json_is_array(b) ? b : NULL;
    size_t na = aa ? json_array_size(aa) : 1, nb = bb ? json_array_size(bb) : 1;
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < nb; j++)
            if (json_equal(aa ? json_array_get(aa, i) : a, bb ? json_array_get(bb, j) : b))
                return false;
    return true;
}

static json_t *values_of(json_t *s)
{
    if (!json_is_object(s)) return NULL;
    json_t *cv = json_object_get(s, "const");
    if (cv) return cv;
    json_t *ev = json_object_get(s, "enum");
    return json_is_array(ev) ? ev : NULL;
}

static bool required_has(json_t *s, const char *k)
{
    json_t *r = json_object_get(s, "required");
    size_t i;
    json_t *x;
    json_array_foreach(r, i,
                       x) if (json_is_string(x) && !strcmp(json_string_value(x), k)) return true;
    return false;
}

/* whether an object valid against s can never have key k (s flattened) */
static bool forbids_key(json_t *s, const char *k)
{
    json_t *props = json_object_get(s, "properties"), *pp = json_object_get(s, "patternProperties");
    json_t *x = json_object_get(props, k);
    if (x) return json_is_false(x);
    if (pp && json_object_size(pp)) return false;
    json_t *addl = json_object_get(s, "additionalProperties");
    if (!addl) addl = json_object_get(s, "unevaluatedProperties");
    return json_is_false(addl);
}

/* whether no instance can match both a and b (a sufficient test) */
static bool provably_disjoint(sc_ctx *c, json_t *a, json_t *b)
{
    int shared = kinds_of(a) & kinds_of(b);
    if (!shared) return true;
    json_t *va = values_of(a), *vb = values_of(b);
    if (va && vb && values_disjoint(va, vb)) return true;
    if (!json_is_object(a) || !json_is_object(b)) return false;
    /* the arguments below are about objects: any other kind both allow could match both */
    if (shared != T_OBJ) return false;
    /* a key one requires and the other forbids */
    json_t *ra = json_object_get(a, "required"), *rb = json_object_get(b, "required");
    size_t i;
    json_t *r;
    json_array_foreach(ra, i, r) if (json_is_string(r) &&
                                     forbids_key(b, json_string_value(r))) return true;
    json_array_foreach(rb, i, r) if (json_is_string(r) &&
                                     forbids_key(a, json_string_value(r))) return true;
    json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
    const char *k;
    json_t *x;
    json_object_foreach(pa, k, x)
    {
        json_t *y = json_object_get(pb, k);
        if (!y || !required_has(a, k) || !required_has(b, k)) continue;
        json_t *fx = sc_flatten(c, x, ""), *fy = sc_flatten(c, y, "");
        if (!fx || !fy) return false;
        json_t *vx = values_of(fx), *vy = values_of(fy);
        if (vx && vy && values_disjoint(vx, vy)) return true;
        if (!(kinds_of(fx) & kinds_of(fy))) return true;
    }
    return false;
}

static uint32_t sc_alternatives(sc_ctx *c, json_t *s, const char *ptr, uint32_t next)
{
    json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    if (any && one) return sc_err(c, ptr, "oneOf", "beside anyOf is not supported");
    const char *kw = any ? "anyOf" : "oneOf";
    json_t *alts = any ? any : one;
    if (!json_is_array(alts) || !json_array_size(alts))
        return sc_err(c, ptr, kw, "not a non-empty array");
    size_t n = json_array_size(alts);
    if (n > SC_MAX_ALTS) return sc_err(c, ptr, kw, "too many alternatives");
    json_t *base = json_object();
    json_array_append_new(c->keep, base);
    json_object_update(base, s);
    json_object_del(base, kw);
    bool plain = !has_assertions_besides(base, NULL);
    json_t **ms = calloc(n, sizeof *ms);
    uint32_t *e = calloc(n, sizeof *e);
    if (!ms || !e) {
        free(ms);
        free(e);
        return prog_fail(c->p, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n && !c->p->failed; i++) {
        char aptr[512];
        ptr_index(aptr, sizeof aptr, ptr, kw, i);
        json_t *a = json_array_get(alts, i);
        ms[i] = plain ? a : sc_merge(c, base, a, aptr);
    }
    if (one && !c->p->failed) {
        /* compare the flattened alternatives */
        json_t **fl = calloc(n, sizeof *fl);
        for (size_t i = 0; fl && i < n && !c->p->failed; i++) fl[i] = sc_flatten(c, ms[i], ptr);
        for (size_t i = 0; fl && i < n && !c->p->failed; i++)
            for (size_t j = i + 1; j < n && !c->p->failed; j++)
                if (!provably_disjoint(c, fl[i], fl[j])) {
                    char m[160];
                    snprintf(m, sizeof m,
                             "alternatives %zu and %zu may both match (only provably exclusive "
                             "ones are supported)",
                             i, j);
                    sc_err(c, ptr, "oneOf", m);
                }
        free(fl);
    }
    for (size_t i = 0; i < n && !c->p->failed; i++) {
        char aptr[512];
        ptr_index(aptr, sizeof aptr, ptr, kw, i);
        e[i] = plain ? sc_call(c, ms[i], aptr, next) : sc_value(c, ms[i], aptr, next);
    }
    uint32_t pc = c->p->failed ? 0 : prog_alts(c->p, e, n);
    free(ms);
    free(e);
    return pc;
}

/* whether `not` took value v out */
static bool not_taken_out(json_t *v, json_t *strs, int bools)
{
    if (json_is_boolean(v)) return bools & (json_is_true(v) ? 1 : 2);
    size_t i;
    json_t *x;
    if (json_is_string(v)) json_array_foreach(strs, i, x) if (json_equal(x, v)) return true;
    return false;
}

/* A string of schema s other than the strings in strs: "any string but these" (the automaton
 * of keys other than an object's names), for a string schema that asserts nothing else. */
static uint32_t string_other_than(sc_ctx *c, json_t *s, const char *ptr, json_t *strs,
                                  uint32_t next)
{
    static const char *const other[] = {"minLength", "maxLength", "pattern", "format", NULL};
    for (int i = 0; other[i]; i++)
        if (json_object_get(s, other[i]))
            return sc_err(c, ptr, "not",
                          "of enum/const strings beside minLength, maxLength, pattern or format "
                          "is not supported");
    size_t n = json_array_size(strs);
    sc_prop *props = calloc(n, sizeof *props);
    if (!props) return prog_fail(c->p, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) props[i].name = json_string_value(json_array_get(strs, i));
    uint32_t pc = key_other_than(c, props, n, next);
    free(props);
    return pc;
}

/* Whether value v of an enum passes s's keywords about its own kind (the ones sc_value lets
 * beside an enum: bounds, multipleOf, lengths and `not`'s own); errors recorded in c. */
static bool value_passes(sc_ctx *c, json_t *s, json_t *v, const char *ptr)
{
    if (json_is_number(v)) {
        double d = json_number_value(v);
        num_bounds b;
        if (read_bounds(c, s, ptr, &b)) return false;
        if (b.has_lo && (d < b.lo || (b.lo_excl && d == b.lo))) return false;
        if (b.has_hi && (d > b.hi || (b.hi_excl && d == b.hi))) return false;
        bool integral = d == floor(d) && fabs(d) < 9007199254740992.0;
        if (fabs(d) >= 9007199254740992.0 &&
            has_assertions_besides(s, (const char *const[]){"const", "enum", "type", "not",
                                                            "minLength", "maxLength", KW_NOTSTRS,
                                                            NULL}))
            return false; /* beyond exact arithmetic: left out */
        if (json_is_true(json_object_get(s, KW_NONINT)) && integral) return false;
        json_t *mo = json_object_get(s, "multipleOf"), *nm = json_object_get(s, KW_NOTMULT);
        if (mo) {
            uint64_t m = modulus(c, mo, ptr, "multipleOf");
            if (!m || !integral || (uint64_t)llabs((long long)d) % m) return false;
        }
        size_t i;
        json_t *x;
        json_array_foreach(nm, i, x)
        {
            uint64_t m = modulus(c, x, ptr, "not");
            if (!m || (integral && (uint64_t)llabs((long long)d) % m == 0)) return false;
        }
    }
    if (json_is_string(v)) {
        json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
        size_t n = 0;
        for (const unsigned char *q = (const unsigned char *)json_string_value(v);
             q < (const unsigned char *)json_string_value(v) + json_string_length(v); q++)
            n += (*q & 0xC0) != 0x80; /* code points */
        if (json_is_integer(mn) && (json_int_t)n < json_integer_value(mn)) return false;
        if (json_is_integer(mx) && (json_int_t)n > json_integer_value(mx)) return false;
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(s, KW_NOTSTRS), i, x) if (json_equal(x, v)) return false;
    }
    return !c->p->failed;
}

static uint32_t sc_value(sc_ctx *c, json_t *s, const char *ptr, uint32_t next)
{
    cst_prog *p = c->p;
    if (p->failed) return 0;
    if (json_is_true(s)) return any_value_call(c, next);
    if (json_is_false(s)) return 0;
    if (!json_is_object(s))
        return sc_err(c, ptr, "type", "a schema must be an object or a boolean");
    if (++c->depth > SC_MAX_DEPTH) {
        c->depth--;
        return sc_err(c, ptr, "properties", "schemas nested too deeply");
    }
    uint32_t pc = 0;
    /* not {not: X} is X: merged in as allOf [X] (exact, whatever X is) */
    json_t *nt = json_object_get(s, "not");
    if (json_is_object(nt) && json_object_get(nt, "not") &&
        !has_assertions_besides(nt, (const char *const[]){"not", NULL})) {
        json_t *cp = json_object(), *all = json_array(), *old = json_object_get(s, "allOf");
        json_array_append_new(c->keep, cp);
        json_object_update(cp, s);
        json_object_del(cp, "not");
        if (json_is_array(old)) json_array_extend(all, old);
        json_array_append(all, json_object_get(nt, "not"));
        json_object_set_new(cp, "allOf", all);
        s = cp;
    }
    json_t *ref = json_object_get(s, "$ref");
    if (json_object_get(s, "allOf") ||
        (ref && has_assertions_besides(s, (const char *const[]){"$ref", NULL}))) {
        json_t *f = sc_flatten(c, s, ptr);
        if (f) pc = sc_value(c, f, ptr, next);
        goto out;
    }
    if (ref) {
        if (!json_is_string(ref)) {
            sc_err(c, ptr, "$ref", "not a string");
            goto out;
        }
        json_t *t = sc_resolve(c, json_string_value(ref), ptr);
        if (t) pc = sc_call(c, t, json_string_value(ref), next);
        goto out;
    }
    if (json_object_get(s, "anyOf") || json_object_get(s, "oneOf")) {
        pc = sc_alternatives(c, s, ptr, next);
        goto out;
    }
    for (int i = 0; unsupported[i]; i++)
        if (json_object_get(s, unsupported[i])) {
            sc_err(c, ptr, unsupported[i], "not supported");
            goto out;
        }
    int types = sc_types(s);
    if (types < 0) {
        sc_err(c, ptr, "type", "not a type name or a list of them");
        goto out;
    }
    /* `not` beyond sc_not's forms: s and the union of not's pieces */
    nt = json_object_get(s, "not");
    if (nt && !not_basic(s, nt, types)) {
        json_t *pieces = json_array(), *cp = json_object(), *alt = json_object();
        json_array_append_new(c->keep, pieces);
        json_array_append_new(c->keep, cp);
        json_array_append_new(c->keep, alt);
        json_object_update(cp, s);
        json_object_del(cp, "not");
        if (neg_pieces(c, nt, ptr, pieces) < 0 || !json_array_size(pieces))
            goto out; /* an error, or nothing validates */
        json_object_set(alt, "anyOf", pieces);
        json_t *w = json_pack("{s:[O,O]}", "allOf", cp, alt);
        json_array_append_new(c->keep, w);
        pc = sc_value(c, w, ptr, next);
        goto out;
    }
    if (json_is_true(json_object_get(s, KW_NONINT)) && !(types & T_NUM))
        types &= ~T_INT;     /* integers have no fraction */
    json_t *not_strs = NULL; /* strings `not` takes out */
    int not_bools = 0;       /* booleans `not` takes out: bit 0 true, bit 1 false */
    if (sc_not(c, &s, ptr, &types, &not_strs, &not_bools) < 0 || p->failed)
        goto out; /* nothing validates */
    json_t *cv = json_object_get(s, "const"), *ev = json_object_get(s, "enum");
    if (cv || ev) {
        static const char *const ok[] = {"const",
                                         "enum",
                                         "type",
                                         "not",
                                         "minimum",
                                         "maximum",
                                         "exclusiveMinimum",
                                         "exclusiveMaximum",
                                         "multipleOf",
                                         "minLength",
                                         "maxLength",
                                         KW_NONINT,
                                         KW_NOTSTRS,
                                         KW_NOTMULT,
                                         NULL};
        if (has_assertions_besides(s, ok)) {
            const char *k;
            json_t *v;
            json_object_foreach(s, k, v) if (is_assertion(k) && !in_list(ok, k)) break;
            sc_err(c, ptr,
                   !k               ? "enum"
                   : k[0] == '\x01' ? "not"
                                    : k,
                   "beside enum/const is not supported");
            goto out;
        }
        if (ev && !json_is_array(ev)) {
            sc_err(c, ptr, "enum", "not an array");
            goto out;
        }
        size_t n = cv ? 1 : json_array_size(ev);
        uint32_t *e = calloc(n + 1, sizeof *e);
        size_t ne = 0;
        if (!e) {
            prog_fail(p, -ENOMEM, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            json_t *v = cv ? cv : json_array_get(ev, i);
            if (cv && ev) { /* const and enum: the const if the enum has it */
                size_t j;
                json_t *y;
                bool found = false;
                json_array_foreach(ev, j, y) found |= json_equal(y, cv);
                if (!found) continue;
            }
            if (!type_allows(types, v) || not_taken_out(v, not_strs, not_bools) ||
                !value_passes(c, s, v, ptr))
                continue;
            e[ne++] = sc_literal(c, v, next);
        }
        pc = ne ? prog_alts(p, e, ne) : 0;
        free(e);
        goto out;
    }
    uint32_t alts[7];
    size_t na = 0;
    if (types & T_NULL) alts[na++] = lit_word(c, 0, next);
    if ((types & T_BOOL) && !not_bools)
        alts[na++] = prog_split(p, lit_word(c, 1, next), lit_word(c, 2, next));
    else if (types & T_BOOL)
        alts[na++] = not_bools & 1 ? lit_word(c, 2, next) : lit_word(c, 1, next);
    if (types & T_OBJ) alts[na++] = sc_object(c, s, ptr, next);
    if (types & T_ARR) alts[na++] = sc_array(c, s, ptr, next);
    if ((types & T_STR) && not_strs)
        alts[na++] = string_other_than(c, s, ptr, not_strs, next);
    else if (types & T_STR)
        alts[na++] = sc_string(c, s, ptr, next);
    if (types & T_NUM)
        alts[na++] = sc_number(c, s, ptr, false, next);
    else if (types & T_INT)
        alts[na++] = sc_number(c, s, ptr, true, next);
    pc = na ? prog_alts(p, alts, na) : 0;
out:
    c->depth--;
    return p->failed ? 0 : pc;
}

/* ---- entry points ---------------------------------------------------------------------- */

static void ctx_release(sc_ctx *c)
{
    json_decref(c->keep);
    free(c->subs);
}

/* A source over CST_MAX_SOURCE_BYTES: -E2BIG with the error naming what it is; else 0. */
static int source_size(const char *what, size_t len, char *err, size_t errlen)
{
    if (len <= CST_MAX_SOURCE_BYTES) return 0;
    snprintf(err, errlen, "%s too large: %zu bytes (at most %u)", what, len, CST_MAX_SOURCE_BYTES);
    return -E2BIG;
}

/* The program's grammar into *out; a program that matches nothing is -EINVAL with the
 * error `nothing`. */
static int finish(cst_prog *p, const char *nothing, cst_grammar **out, char *err, size_t errlen)
{
    if (!p->failed && p->start == 0) {
        snprintf(err, errlen, "%s", nothing);
        prog_release(p);
        return -EINVAL;
    }
    return cst_grammar_finish(p, out, err, errlen);
}

int cst_compile_json_schema(const char *schema, size_t len, cst_grammar **out, char *err,
                            size_t errlen)
{
    char dummy[8];
    if (!err) err = dummy, errlen = sizeof dummy;
    *out = NULL;
    int rc = source_size("schema", len, err, errlen);
    if (rc) return rc;
    json_error_t je;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!root) {
        snprintf(err, errlen, "the schema is not JSON: %s (line %d, column %d)", je.text, je.line,
                 je.column);
        return -EINVAL;
    }
    if (!json_is_object(root) && !json_is_boolean(root)) {
        json_decref(root);
        snprintf(err, errlen, "the schema is not an object or a boolean");
        return -EINVAL;
    }
    cst_prog p;
    rc = prog_init(&p);
    if (rc) {
        json_decref(root);
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    sc_ctx c = {.p = &p, .root = root, .keep = json_array()};
    uint32_t match = prog_emit(&p, OP_MATCH, 0, 0);
    p.start = sc_value(&c, root, "", match);
    ctx_release(&c);
    json_decref(root);
    return finish(&p, "the schema matches no instance", out, err, errlen);
}

/*
 * Python calls: spec {"tools": [{"name": N, "parameters": SCHEMA}, ...], "max_calls": K} ->
 * "[" call ("," call)* "]" (at most K calls; K 0: any number), each call N(k=v, ...) of one
 * of the tools, its keyword arguments the properties of its parameters (an object schema;
 * only the named ones), each value a Python literal that, read as JSON (None, True, False as
 * null, true, false), validates against the property's schema.
 */
int cst_compile_python_calls(const char *spec, size_t len, cst_grammar **out, char *err,
                             size_t errlen)
{
    char dummy[8];
    if (!err) err = dummy, errlen = sizeof dummy;
    *out = NULL;
    int rc = source_size("tool calls", len, err, errlen);
    if (rc) return rc;
    json_error_t je;
    json_t *root = json_loadb(spec, len, 0, &je);
    json_t *tools = json_object_get(root, "tools"), *mc = json_object_get(root, "max_calls");
    if (!json_is_array(tools) || !json_array_size(tools) || json_array_size(tools) > SC_MAX_ALTS ||
        (mc && !json_is_integer(mc))) {
        json_decref(root);
        snprintf(err, errlen,
                 "tool calls: not {\"tools\": [{\"name\", \"parameters\"}, ...] "
                 "(1 to 256), \"max_calls\": N}");
        return -EINVAL;
    }
    cst_prog p;
    rc = prog_init(&p);
    if (rc) {
        json_decref(root);
        return rc;
    }
    uint32_t match = prog_emit(&p, OP_MATCH, 0, 0);
    uint32_t call = prog_emit(&p, OP_JMP, 0, 0), ret = prog_emit(&p, OP_RET, 0, 0);
    size_t n = json_array_size(tools);
    uint32_t *alts = calloc(n, sizeof *alts);
    if (!alts) prog_fail(&p, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n && !p.failed; i++) {
        json_t *t = json_array_get(tools, i), *ps = json_object_get(t, "parameters");
        const char *name = json_string_value(json_object_get(t, "name"));
        char ptr[64];
        snprintf(ptr, sizeof ptr, "/tools/%zu/parameters", i);
        if (!name || !py_identifier(name)) {
            prog_fail(&p, -EINVAL, "tool %zu: a name that is not a Python identifier", i);
            break;
        }
        if (json_is_null(ps)) ps = NULL;
        json_t *empty = ps ? NULL : json_pack("{s:s}", "type", "object");
        sc_ctx c = {.p = &p, .root = ps ? ps : empty, .keep = json_array(), .py = true};
        json_t *s = sc_flatten(&c, c.root, ptr);
        if (s && (!json_is_object(s) || !(sc_types(s) & T_OBJ) || json_object_get(s, "anyOf") ||
                  json_object_get(s, "oneOf") || json_object_get(s, "not")))
            sc_err(&c, ptr, "parameters", "a call's parameters must be one object schema");
        else if (s) {
            c.kwargs = true;
            alts[i] = prog_lit(&p, name, strlen(name), sc_object(&c, s, ptr, ret));
        }
        ctx_release(&c);
        json_decref(empty);
    }
    if (!p.failed) {
        prog_patch(&p, call, prog_alts(&p, alts, n));
        uint32_t close = prog_ws(&p, prog_lit(&p, "]", 1, match)), body;
        if (mc && json_integer_value(mc) == 1)
            body = prog_emit(&p, OP_CALL, call, close);
        else {
            uint32_t loop = prog_split(&p, 0, close);
            prog_patch(
                &p, loop,
                prog_ws(&p, prog_lit(&p, ",", 1, prog_ws(&p, prog_emit(&p, OP_CALL, call, loop)))));
            body = prog_emit(&p, OP_CALL, call, loop);
        }
        p.start = prog_lit(&p, "[", 1, prog_ws(&p, body));
    }
    free(alts);
    json_decref(root);
    return finish(&p, "the tool calls match no text", out, err, errlen);
}

int cst_compile_json_value(bool object_only, cst_grammar **out, char *err, size_t errlen)
{
    cst_prog p;
    int rc = prog_init(&p);
    if (rc) return rc;
    sc_ctx c = {.p = &p, .keep = json_array()};
    uint32_t match = prog_emit(&p, OP_MATCH, 0, 0);
    if (object_only) {
        json_t *s = json_pack("{s:s}", "type", "object");
        c.root = s;
        p.start = sc_value(&c, s, "", match);
        json_decref(s);
    } else
        p.start = any_value_call(&c, match);
    ctx_release(&c);
    return cst_grammar_finish(&p, out, err, errlen);
}

int cst_compile_regex(const char *re, size_t len, cst_grammar **out, char *err, size_t errlen)
{
    char dummy[8];
    if (!err) err = dummy, errlen = sizeof dummy;
    *out = NULL;
    int rc = source_size("regex", len, err, errlen);
    if (rc) return rc;
    cst_prog p;
    rc = prog_init(&p);
    if (rc) return rc;
    uint32_t match = prog_emit(&p, OP_MATCH, 0, 0);
    p.start = cst_regex_emit(&p, re, len, RE_WHOLE, match);
    return cst_grammar_finish(&p, out, err, errlen);
}

int cst_compile_choice(const char *const *choices, const size_t *lens, int n, cst_grammar **out,
                       char *err, size_t errlen)
{
    char dummy[8];
    if (!err) err = dummy, errlen = sizeof dummy;
    *out = NULL;
    if (n <= 0) {
        snprintf(err, errlen, "a choice needs at least one string");
        return -EINVAL;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) total += lens[i];
    int rc = source_size("choices", total, err, errlen);
    if (rc) return rc;
    cst_prog p;
    rc = prog_init(&p);
    if (rc) return rc;
    uint32_t match = prog_emit(&p, OP_MATCH, 0, 0);
    uint32_t *e = malloc((size_t)n * sizeof *e);
    if (!e) {
        prog_release(&p);
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++) e[i] = lens[i] ? prog_lit(&p, choices[i], lens[i], match) : match;
    p.start = prog_alts(&p, e, (size_t)n);
    free(e);
    return cst_grammar_finish(&p, out, err, errlen);
}
