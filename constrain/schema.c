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

/* A JSON value exactly (free whitespace between its tokens). */
static uint32_t sc_literal(sc_ctx *c, json_t *v, uint32_t next)
{
    char buf[64];
    switch (json_typeof(v)) {
    case JSON_NULL: return prog_lit(c->p, "null", 4, next);
    case JSON_TRUE: return prog_lit(c->p, "true", 4, next);
    case JSON_FALSE: return prog_lit(c->p, "false", 5, next);
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
            } else if (!strcmp(k, "required")) {
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
    if (a_any <= b_any)
        alts[(*na)++] =
            uint_range(c, (uint64_t)a_any, b_any == INT64_MAX ? UINT64_MAX : (uint64_t)b_any,
                       frac(c, 0, next));
    if (lo_nonzero && (int64_t)lo <= b_any)
        alts[(*na)++] = uint_range(c, (uint64_t)lo, (uint64_t)lo, frac(c, 2, next));
    if (b_zero >= a_any && b_zero > b_any)
        alts[(*na)++] = uint_range(c, (uint64_t)b_zero, (uint64_t)b_zero, frac(c, 1, next));
}

static uint32_t sc_number(sc_ctx *c, json_t *s, const char *ptr, bool integer, uint32_t next)
{
    json_t *mo = json_object_get(s, "multipleOf");
    if (mo && !(json_is_number(mo) && json_number_value(mo) == 1 && integer))
        return sc_err(c, ptr, "multipleOf", "not supported (except 1 on integers)");
    num_bounds b;
    if (read_bounds(c, s, ptr, &b)) return 0;
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
    if ((fre && pat) || ((fre || pat) && lengths))
        return sc_err(c, ptr, pat ? "pattern" : "format",
                      "pattern, format and minLength/maxLength together are not supported");
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
    alts[4] = prog_lit(p, "true", 4, ret);
    alts[5] = prog_lit(p, "false", 5, ret);
    alts[6] = prog_lit(p, "null", 4, ret);
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
        return sc_err(c, ptr, "patternProperties", "the key patterns need too many states"), -1;
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
    cst_byteset grp_set[256];
    uint32_t result = 0;
    if (!a.tup || !a.entry || !a.hash) {
        prog_fail(p, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < nc; i++) cur[i] = cst_dfa_start(k->m[i]);
    int64_t start = ka_intern(c, &a, cur, ptr);
    if (start < 0) goto out;
    for (size_t t = 0; t < a.n && !p->failed; t++) {
        int ng = 0;
        for (int b = 0; b < 256; b++) {
            uint32_t target;
            for (int i = 0; i < nc; i++) {
                int32_t s = cst_dfa_step(k->m[i], a.tup[t * (size_t)nc + (size_t)i], (uint8_t)b);
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
            grp_set[gi].w[b >> 6] |= 1ull << (b & 63);
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

static uint32_t member(sc_ctx *c, const sc_prop *pr, bool call, uint32_t next)
{
    uint32_t val =
        call ? sc_call(c, pr->schema, pr->ptr, next) : sc_value(c, pr->schema, pr->ptr, next);
    return sc_lit_str(c, pr->name, strlen(pr->name),
                      prog_ws(c->p, prog_lit(c->p, ":", 1, prog_ws(c->p, val))));
}

static uint32_t sc_object(sc_ctx *c, json_t *s, const char *ptr, uint32_t next)
{
    cst_prog *p = c->p;
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
    bool addl_allowed = !json_is_false(addl);
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
    uint32_t close = prog_ws(p, prog_lit(p, "}", 1, next));
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
            prog_ws(p, prog_lit(p, ",", 1, prog_ws(p, member(c, &pr[i], twice, rest_next))));
        uint32_t new_rest = pr[i].required ? r : prog_split(p, r, rest_next);
        if (twice) {
            uint32_t f = member(c, &pr[i], true, rest_next);
            first_next = pr[i].required ? f : prog_split(p, f, first_next);
        }
        rest_next = new_rest;
    }
    free(pr);
    return prog_lit(p, "{", 1, prog_ws(p, first_next));
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
    json_t *not_strs = NULL; /* strings `not` takes out */
    int not_bools = 0;       /* booleans `not` takes out: bit 0 true, bit 1 false */
    if (sc_not(c, &s, ptr, &types, &not_strs, &not_bools) < 0 || p->failed)
        goto out; /* nothing validates */
    json_t *cv = json_object_get(s, "const"), *ev = json_object_get(s, "enum");
    if (cv || ev) {
        static const char *const ok[] = {"const", "enum", "type", "not", NULL};
        if (has_assertions_besides(s, ok)) {
            const char *k;
            json_t *v;
            json_object_foreach(s, k, v) if (is_assertion(k) && !in_list(ok, k)) break;
            sc_err(c, ptr, k ? k : "enum", "beside enum/const is not supported");
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
            if (!type_allows(types, v) || not_taken_out(v, not_strs, not_bools)) continue;
            e[ne++] = sc_literal(c, v, next);
        }
        pc = ne ? prog_alts(p, e, ne) : 0;
        free(e);
        goto out;
    }
    uint32_t alts[7];
    size_t na = 0;
    if (types & T_NULL) alts[na++] = prog_lit(p, "null", 4, next);
    if ((types & T_BOOL) && !not_bools)
        alts[na++] = prog_split(p, prog_lit(p, "true", 4, next), prog_lit(p, "false", 5, next));
    else if (types & T_BOOL)
        alts[na++] = not_bools & 1 ? prog_lit(p, "false", 5, next) : prog_lit(p, "true", 4, next);
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

int cst_compile_json_schema(const char *schema, size_t len, cst_grammar **out, char *err,
                            size_t errlen)
{
    char dummy[8];
    if (!err) err = dummy, errlen = sizeof dummy;
    *out = NULL;
    if (len > CST_MAX_SOURCE_BYTES) {
        snprintf(err, errlen, "schema too large: %zu bytes (at most %u)", len,
                 CST_MAX_SOURCE_BYTES);
        return -E2BIG;
    }
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
    int rc = prog_init(&p);
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
    if (!p.failed && p.start == 0) {
        snprintf(err, errlen, "the schema matches no instance");
        prog_release(&p);
        return -EINVAL;
    }
    return cst_grammar_finish(&p, out, err, errlen);
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
    if (len > CST_MAX_SOURCE_BYTES) {
        snprintf(err, errlen, "regex too large: %zu bytes", len);
        return -E2BIG;
    }
    cst_prog p;
    int rc = prog_init(&p);
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
    if (total > CST_MAX_SOURCE_BYTES) {
        snprintf(err, errlen, "choices too large: %zu bytes", total);
        return -E2BIG;
    }
    cst_prog p;
    int rc = prog_init(&p);
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
