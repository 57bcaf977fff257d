/* SPDX-License-Identifier: MIT */
/* formats/json.c — the escaping JSON writer and the field readers (see json.h). */
#include "formats/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- writer ------------------------------------------------------------------------------ */

static void put(fmt_json *j, char c)
{
    if (j->len + 1 < j->cap) j->buf[j->len] = c;
    j->len++;
}

static void put_n(fmt_json *j, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) put(j, s[i]);
}

__attribute__((format(printf, 2, 3))) static void put_fmt(fmt_json *j, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) put_n(j, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Length of the well-formed UTF-8 sequence at s[0..n), or 0 when s[0] does not start one
 * (RFC 3629, table 3-7 of the Unicode standard). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c == 0xE0) {
        len = 3;
        lo = 0xA0;
    } else if (c >= 0xE1 && c <= 0xEC)
        len = 3;
    else if (c == 0xED) {
        len = 3;
        hi = 0x9F;
    } /* no UTF-16 surrogates */
    else if (c >= 0xEE && c <= 0xEF)
        len = 3;
    else if (c == 0xF0) {
        len = 4;
        lo = 0x90;
    } /* no overlong 4-byte forms */
    else if (c >= 0xF1 && c <= 0xF3)
        len = 4;
    else if (c == 0xF4) {
        len = 4;
        hi = 0x8F;
    } /* nothing above U+10FFFF */
    else
        return 0;
    if (n < len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

void fmt_json_escape(char *dst, size_t cap, size_t *pos, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    fmt_json j = {.buf = dst, .cap = cap, .len = *pos};
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            put(&j, '\\');
            put(&j, (char)c);
            i++;
        } else if (c < 0x20) {
            put(&j, '\\');
            switch (c) {
            case '\n': put(&j, 'n'); break;
            case '\r': put(&j, 'r'); break;
            case '\t': put(&j, 't'); break;
            default:
                put_n(&j, "u00", 3);
                put(&j, hex[c >> 4]);
                put(&j, hex[c & 15]);
            }
            i++;
        } else {
            size_t k = utf8_seq(p + i, n - i);
            if (k == 0) {
                put_n(&j, "\xEF\xBF\xBD", 3); /* U+FFFD for the byte that broke the sequence */
                i++;
            } else {
                put_n(&j, (const char *)p + i, k);
                i += k;
            }
        }
    }
    *pos = j.len;
}

static void put_str(fmt_json *j, const char *s, size_t n)
{
    put(j, '"');
    size_t pos = j->len;
    fmt_json_escape(j->buf, j->cap, &pos, s, n);
    j->len = pos;
    put(j, '"');
}

/* The separator and the key of the next member. */
static void member(fmt_json *j, const char *key)
{
    int d = j->depth - 1;
    if (d < 0) return;
    if (!j->first[d]) put(j, ',');
    j->first[d] = false;
    if (key) {
        put_str(j, key, strlen(key));
        put(j, ':');
    }
}

void fmt_json_init(fmt_json *j, char *buf, size_t cap)
{
    memset(j, 0, sizeof *j);
    j->buf = buf;
    j->cap = cap;
    if (cap) buf[0] = 0;
    put(j, '{');
    j->depth = 1;
    j->first[0] = true;
    j->closer[0] = '}';
}

void fmt_json_int(fmt_json *j, const char *key, int64_t v)
{
    member(j, key);
    if (v == FMT_NULL)
        put_n(j, "null", 4);
    else
        put_fmt(j, "%lld", (long long)v);
}

void fmt_json_uint(fmt_json *j, const char *key, uint64_t v)
{
    member(j, key);
    put_fmt(j, "%llu", (unsigned long long)v);
}

void fmt_json_double(fmt_json *j, const char *key, double v, int decimals)
{
    member(j, key);
    if (!isfinite(v))
        put_n(j, "null", 4);
    else if (decimals >= 0)
        put_fmt(j, "%.*f", decimals > 17 ? 17 : decimals, v);
    else
        put_fmt(j, "%.17g", v);
}

void fmt_json_strn(fmt_json *j, const char *key, const char *s, size_t n)
{
    member(j, key);
    if (!s)
        put_n(j, "null", 4);
    else
        put_str(j, s, n);
}

void fmt_json_str(fmt_json *j, const char *key, const char *s)
{
    fmt_json_strn(j, key, s, s ? strlen(s) : 0);
}

void fmt_json_bool(fmt_json *j, const char *key, bool v)
{
    member(j, key);
    if (v)
        put_n(j, "true", 4);
    else
        put_n(j, "false", 5);
}

void fmt_json_null(fmt_json *j, const char *key)
{
    member(j, key);
    put_n(j, "null", 4);
}

static void open_level(fmt_json *j, const char *key, char c)
{
    member(j, key);
    put(j, c);
    if (j->depth >= FMT_JSON_DEPTH) {
        j->too_deep = true;
        return;
    }
    j->closer[j->depth] = c == '{' ? '}' : ']';
    j->first[j->depth++] = true;
}

void fmt_json_object(fmt_json *j, const char *key)
{
    open_level(j, key, '{');
}
void fmt_json_array(fmt_json *j, const char *key)
{
    open_level(j, key, '[');
}

void fmt_json_close(fmt_json *j)
{
    if (j->depth <= 1) return; /* the top level closes in fmt_json_end */
    put(j, j->closer[j->depth - 1]);
    j->depth--;
}

int fmt_json_end(fmt_json *j)
{
    while (j->depth > 0) put(j, j->closer[--j->depth]);
    if (j->len >= j->cap || j->too_deep) {
        if (j->cap) j->buf[j->len < j->cap ? j->len : j->cap - 1] = 0;
        return -EMSGSIZE;
    }
    j->buf[j->len] = 0;
    return (int)j->len;
}

/* ---- readers' field access ------------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static int why_set(char *why, size_t whylen, const char *fmt,
                                                         ...)
{
    if (why && whylen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* 1: absent (handled), 0: present, -1: error. */
static int absent(json_t *v, const char *key, unsigned flags, char *why, size_t whylen)
{
    if (v && !json_is_null(v)) return 0;
    if (flags & FMT_REQUIRED) return why_set(why, whylen, "missing \"%s\"", key);
    return 1;
}

int fmt_get_int(json_t *o, const char *key, unsigned flags, int64_t lo, int64_t hi, int64_t *out,
                char *why, size_t whylen)
{
    json_t *v = json_object_get(o, key);
    int a = absent(v, key, flags, why, whylen);
    if (a) {
        if (a > 0 && (flags & FMT_NULLABLE)) *out = FMT_NULL;
        return a < 0 ? -1 : 0;
    }
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
        if (x < lo || x > hi)
            return why_set(why, whylen, "\"%s\" is %lld, must be in [%lld, %lld]", key,
                           (long long)x, (long long)lo, (long long)hi);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!(d >= (double)lo - 0.5 && d <= (double)hi + 0.5 && fabs(d) < 9e18))
            return why_set(why, whylen, "\"%s\" is %.17g, must be in [%lld, %lld]", key, d,
                           (long long)lo, (long long)hi);
        x = (int64_t)llround(d);
        if (x < lo) x = lo;
        if (x > hi) x = hi;
    } else {
        return why_set(why, whylen, "\"%s\" is not a number", key);
    }
    *out = x;
    return 0;
}

int fmt_get_u64_array(json_t *o, const char *key, uint64_t *out, uint32_t cap, uint32_t *n,
                      char *why, size_t whylen)
{
    *n = 0;
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return why_set(why, whylen, "\"%s\" is not an array", key);
    size_t len = json_array_size(v);
    if (len > cap) return why_set(why, whylen, "\"%s\" has %zu entries, at most %u", key, len, cap);
    for (size_t i = 0; i < len; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return why_set(why, whylen, "\"%s\"[%zu] is not an integer >= 0", key, i);
        out[i] = (uint64_t)json_integer_value(x);
    }
    *n = (uint32_t)len;
    return 0;
}

int fmt_get_num(json_t *o, const char *key, unsigned flags, double lo, double *out, char *why,
                size_t whylen)
{
    json_t *v = json_object_get(o, key);
    int a = absent(v, key, flags, why, whylen);
    if (a) {
        if (a > 0 && (flags & FMT_NULLABLE)) *out = NAN;
        return a < 0 ? -1 : 0;
    }
    if (!json_is_number(v)) return why_set(why, whylen, "\"%s\" is not a number", key);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo)
        return why_set(why, whylen, "\"%s\" is %g, must be >= %g", key, d, lo);
    *out = d;
    return 0;
}

int fmt_get_str(json_t *o, const char *key, unsigned flags, char *out, size_t cap, char *why,
                size_t whylen)
{
    json_t *v = json_object_get(o, key);
    int a = absent(v, key, flags, why, whylen);
    if (a) {
        if (a > 0 && (flags & FMT_NULLABLE) && cap) out[0] = 0;
        return a < 0 ? -1 : 0;
    }
    if (!json_is_string(v)) return why_set(why, whylen, "\"%s\" is not a string", key);
    size_t n = json_string_length(v);
    if (n >= cap)
        return why_set(why, whylen, "\"%s\" is a string of %zu bytes, longer than %zu", key, n,
                       cap - 1);
    if (memchr(json_string_value(v), 0, n))
        return why_set(why, whylen, "\"%s\" holds a NUL character", key);
    memcpy(out, json_string_value(v), n + 1);
    return 0;
}

json_t *fmt_load_object(const char *line, size_t len, char *why, size_t whylen)
{
    json_error_t jerr;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o) {
        why_set(why, whylen, "not JSON: %.100s (column %d)", jerr.text, jerr.column);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        why_set(why, whylen, "not a JSON object");
        return NULL;
    }
    return o;
}

bool fmt_blank(const char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r' && p[i] != '\n') return false;
    return true;
}

int fmt_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len, char *why,
                  size_t whylen)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        why_set(why, whylen, "%s: %s", path, strerror(e));
        return -e;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (cap - len < 65536) {
            size_t ncap = cap ? cap * 2 : 1 << 20;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                why_set(why, whylen, "%s: out of memory", path);
                rc = -ENOMEM;
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (len > max_bytes) {
            why_set(why, whylen, "%s: larger than %zu MiB", path, max_bytes >> 20);
            rc = -EFBIG;
            goto out;
        }
        if (got == 0) break;
    }
    if (ferror(f)) {
        why_set(why, whylen, "%s: read error", path);
        rc = -EIO;
        goto out;
    }
    buf[len] = 0;
    *out = buf;
    if (out_len) *out_len = len;
    buf = NULL;
out:
    free(buf);
    fclose(f);
    return rc;
}
