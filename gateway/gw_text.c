/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_text.c — buffers, UTF-8 boundaries, stop strings, JSON string escaping.
 */
#include "gateway/gw_text.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- buffer ---------------------------------------------------------------------------- */
static int grow(gw_buf *b, size_t need)
{
    if (b->len + need + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + need + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int gw_buf_add(gw_buf *b, const void *p, size_t n)
{
    if (grow(b, n)) return -ENOMEM;
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int gw_buf_adds(gw_buf *b, const char *s)
{
    return gw_buf_add(b, s, strlen(s));
}

int gw_buf_addf(gw_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || grow(b, (size_t)n)) return -ENOMEM;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

int gw_buf_add_json_str(gw_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    /* Worst case every byte becomes \u00XX. */
    if (grow(b, n * 6 + 2)) return -ENOMEM;
    char *o = b->p + b->len;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"':
            *o++ = '\\';
            *o++ = '"';
            break;
        case '\\':
            *o++ = '\\';
            *o++ = '\\';
            break;
        case '\n':
            *o++ = '\\';
            *o++ = 'n';
            break;
        case '\r':
            *o++ = '\\';
            *o++ = 'r';
            break;
        case '\t':
            *o++ = '\\';
            *o++ = 't';
            break;
        case '\b':
            *o++ = '\\';
            *o++ = 'b';
            break;
        case '\f':
            *o++ = '\\';
            *o++ = 'f';
            break;
        default:
            if (c < 0x20 || c == 0x7f) {
                memcpy(o, "\\u00", 4);
                o[4] = hex[c >> 4];
                o[5] = hex[c & 15];
                o += 6;
            } else {
                *o++ = (char)c;
            }
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
    b->p[b->len] = 0;
    return 0;
}

void gw_buf_consume(gw_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->p, b->p + n, b->len - n);
        b->len -= n;
    }
    if (b->p) b->p[b->len] = 0;
}

void gw_buf_free(gw_buf *b)
{
    free(b->p);
    *b = (gw_buf){0};
}

/* ---- UTF-8 ----------------------------------------------------------------------------- */
/* Length of the sequence led by c (0 for a byte that cannot lead), and the allowed range of
 * its second byte (which rules out overlongs, surrogates and code points above U+10FFFF). */
static int lead_len(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xbf;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) return 2;
    if (c == 0xe0) {
        *lo = 0xa0;
        return 3;
    }
    if (c >= 0xe1 && c <= 0xec) return 3;
    if (c == 0xed) {
        *hi = 0x9f;
        return 3;
    }
    if (c >= 0xee && c <= 0xef) return 3;
    if (c == 0xf0) {
        *lo = 0x90;
        return 4;
    }
    if (c >= 0xf1 && c <= 0xf3) return 4;
    if (c == 0xf4) {
        *hi = 0x8f;
        return 4;
    }
    return 0;
}

long gw_utf8_take(const char *in, size_t n, bool final, gw_buf *out)
{
    static const char repl[] = "\xef\xbf\xbd";
    const unsigned char *s = (const unsigned char *)in;
    size_t i = 0, run = 0; /* s[run..i) is valid and not yet copied */
    while (i < n) {
        unsigned char lo, hi;
        int k = lead_len(s[i], &lo, &hi);
        int ok = k > 0;
        size_t j = 1;
        for (; ok && j < (size_t)k && i + j < n; j++) {
            unsigned char c = s[i + j];
            if (j == 1 ? c < lo || c > hi : c < 0x80 || c > 0xbf) ok = 0;
        }
        if (ok && i + (size_t)k <= n) {
            i += (size_t)k;
            continue;
        }
        if (ok && !final) break; /* a valid start of a sequence the next bytes complete */
        /* Invalid (or incomplete at the very end): the valid run so far, then U+FFFD
		 * for the one bad byte; resume at the next byte. */
        if (gw_buf_add(out, s + run, i - run) || gw_buf_add(out, repl, 3)) return -ENOMEM;
        i++;
        run = i;
    }
    if (gw_buf_add(out, s + run, i - run)) return -ENOMEM;
    return (long)i;
}

/* ---- stop strings ---------------------------------------------------------------------- */
bool gw_stop_scan(const gw_stop *st, const char *t, size_t n, size_t *emit)
{
    size_t best = n;
    bool hit = false;
    for (int k = 0; k < st->n; k++) {
        const char *f = memmem(t, n, st->s[k], st->len[k]);
        if (f && (size_t)(f - t) < best) {
            best = (size_t)(f - t);
            hit = true;
        }
    }
    if (hit) {
        *emit = best;
        return true;
    }
    /* Hold back the longest suffix that is a proper prefix of some stop string. */
    size_t hold = 0;
    for (int k = 0; k < st->n; k++) {
        size_t m = st->len[k] - 1 < n ? st->len[k] - 1 : n;
        for (size_t l = m; l > hold; l--)
            if (!memcmp(t + n - l, st->s[k], l)) {
                hold = l;
                break;
            }
    }
    *emit = n - hold;
    return false;
}
