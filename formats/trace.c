/* SPDX-License-Identifier: MIT */
/* formats/trace.c — Azure CSV, Mooncake and native trace readers (see trace.h). */
#include "formats/trace.h"
#include "formats/logfile.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

const char *fmt_trace_format_name(int format)
{
    switch (format) {
    case FMT_TRACE_AZURE: return "azure-csv";
    case FMT_TRACE_MOONCAKE: return "mooncake-jsonl";
    case FMT_TRACE_NATIVE: return "native-jsonl";
    default: return "generated";
    }
}

int fmt_trace_guess(const char *buf, size_t len)
{
    const char *p = buf, *end = buf + len;
    while (p < end && isspace((unsigned char)*p)) p++;
    if (p < end && *p == '{') {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl : end) - p);
        if (memmem(p, n, "\"arrival_us\"", 12)) return FMT_TRACE_NATIVE;
        if (memmem(p, n, "\"input_length\"", 14)) return FMT_TRACE_MOONCAKE;
        return -1;
    }
    if ((size_t)(end - p) >= 9 && memcmp(p, "TIMESTAMP", 9) == 0) return FMT_TRACE_AZURE;
    return -1;
}

int fmt_trace_open(fmt_trace_reader *rd, const char *buf, size_t len, int format, char *why,
                   size_t whylen)
{
    memset(rd, 0, sizeof *rd);
    rd->p = buf;
    rd->end = buf + len;
    if (format == FMT_TRACE_AUTO) format = fmt_trace_guess(buf, len);
    if (format != FMT_TRACE_AZURE && format != FMT_TRACE_MOONCAKE && format != FMT_TRACE_NATIVE) {
        snprintf(why, whylen,
                 "unknown trace format (expected an Azure CSV header \"%s\", or JSON "
                 "lines with \"arrival_us\" (native) or \"input_length\" (Mooncake))",
                 FMT_AZURE_HEADER);
        return -EINVAL;
    }
    rd->format = format;
    return 0;
}

/* ---- Azure CSV ---------------------------------------------------------------------------- */

/* days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static int digits(const char **p, const char *end, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++, (*p)++) {
        if (*p >= end || !isdigit((unsigned char)**p)) return -1;
        v = v * 10 + (**p - '0');
    }
    *out = v;
    return 0;
}

int fmt_azure_timestamp(const char *p, const char *end, int64_t *us, char *why, size_t whylen)
{
    int Y, M, D, h, m, s;
    if (digits(&p, end, 4, &Y) || p >= end || *p++ != '-' || digits(&p, end, 2, &M) || p >= end ||
        *p++ != '-' || digits(&p, end, 2, &D) || p >= end || (*p != ' ' && *p != 'T') ||
        (p++, digits(&p, end, 2, &h)) || p >= end || *p++ != ':' || digits(&p, end, 2, &m) ||
        p >= end || *p++ != ':' || digits(&p, end, 2, &s)) {
        snprintf(why, whylen, "TIMESTAMP is not YYYY-MM-DD HH:MM:SS.fffffff");
        return -1;
    }
    if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || s > 60) {
        snprintf(why, whylen, "TIMESTAMP has a field out of range");
        return -1;
    }
    int64_t ns = 0;
    if (p < end && *p == '.') {
        p++;
        int nd = 0;
        while (p < end && isdigit((unsigned char)*p)) {
            if (nd < 9) {
                ns = ns * 10 + (*p - '0');
                nd++;
            }
            p++;
        }
        if (nd == 0) {
            snprintf(why, whylen, "TIMESTAMP has a '.' without digits");
            return -1;
        }
        for (; nd < 9; nd++) ns *= 10;
    }
    if (p != end) {
        snprintf(why, whylen, "TIMESTAMP has trailing characters");
        return -1;
    }
    int64_t secs = days_from_civil(Y, (unsigned)M, (unsigned)D) * 86400 + h * 3600 + m * 60 + s;
    /* 7 fractional digits are 100 ns; round to the nearest µs rather than truncating. */
    *us = secs * 1000000 + (ns + 500) / 1000;
    return 0;
}

/* A positive decimal integer field in [p, end): 0, -1 not a number, -2 too large. */
static int parse_count(const char *p, const char *end, int64_t *out)
{
    while (p < end && *p == ' ') p++;
    while (end > p && end[-1] == ' ') end--;
    if (p == end) return -1;
    int64_t v = 0;
    for (; p < end; p++) {
        if (!isdigit((unsigned char)*p)) return -1;
        v = v * 10 + (*p - '0');
        if (v > 0x7fffffff) return -2;
    }
    *out = v;
    return 0;
}

static int azure_line(const char *p, const char *le, fmt_request *r, char *why, size_t wl)
{
    const char *c1 = memchr(p, ',', (size_t)(le - p));
    const char *c2 = c1 ? memchr(c1 + 1, ',', (size_t)(le - c1 - 1)) : NULL;
    int rc;
    if (!c1 || !c2 || memchr(c2 + 1, ',', (size_t)(le - c2 - 1))) {
        snprintf(why, wl, "expected 3 comma-separated fields");
        return -1;
    }
    if (fmt_azure_timestamp(p, c1, &r->arrival_us, why, wl) < 0) return -1;
    if ((rc = parse_count(c1 + 1, c2, &r->prompt_tokens)) < 0 || r->prompt_tokens == 0) {
        snprintf(why, wl, "ContextTokens %s",
                 rc == -2 ? "is too large"
                 : rc < 0 ? "is not a positive integer"
                          : "is 0, must be positive");
        return -1;
    }
    if ((rc = parse_count(c2 + 1, le, &r->output_tokens)) < 0 || r->output_tokens == 0) {
        snprintf(why, wl, "GeneratedTokens %s",
                 rc == -2 ? "is too large"
                 : rc < 0 ? "is not a positive integer"
                          : "is 0, must be positive");
        return -1;
    }
    r->max_tokens = r->output_tokens;
    return 0;
}

/* ---- Mooncake ------------------------------------------------------------------------------ */

static int mooncake_line(const char *p, size_t n, fmt_request *r, fmt_request_text *text, char *why,
                         size_t wl)
{
    json_t *o = fmt_load_object(p, n, why, wl);
    if (!o) return -1;
    double ms = 0;
    int bad =
        fmt_get_num(o, "timestamp", FMT_REQUIRED, 0, &ms, why, wl) ||
        fmt_get_int(o, "input_length", FMT_REQUIRED, 1, 0x7fffffff, &r->prompt_tokens, why, wl) ||
        fmt_get_int(o, "output_length", FMT_REQUIRED, 1, 0x7fffffff, &r->output_tokens, why, wl);
    if (!bad)
        bad = fmt_get_u64_array(o, "hash_ids", text->hash_ids, FMT_HASH_IDS_MAX, &r->n_hash_ids,
                                why, wl);
    if (r->n_hash_ids) { /* 512-token blocks (the published traces' block size) */
        r->hash_ids = text->hash_ids;
        r->hash_block_tokens = 512;
    }
    if (!bad && ms > (double)(INT64_MAX / 4000)) {
        snprintf(why, wl, "\"timestamp\" is %g, too large", ms);
        bad = 1;
    }
    json_decref(o);
    if (bad) return -1;
    r->arrival_us = (int64_t)llround(ms * 1000.0); /* milliseconds */
    r->max_tokens = r->output_tokens;
    return 0;
}

/* ---- the reader ---------------------------------------------------------------------------- */

int fmt_trace_next(fmt_trace_reader *rd, fmt_request *out, fmt_request_text *text, char *why,
                   size_t whylen)
{
    while (rd->p < rd->end) {
        const char *p = rd->p;
        const char *nl = memchr(p, '\n', (size_t)(rd->end - p));
        const char *le = nl ? nl : rd->end; /* no newline after the last line */
        rd->p = nl ? nl + 1 : rd->end;
        if (le > p && le[-1] == '\r') le--; /* CRLF */
        rd->line++;
        if (rd->format == FMT_TRACE_AZURE && rd->line == 1) {
            static const char hdr[] = FMT_AZURE_HEADER;
            if ((size_t)(le - p) != sizeof hdr - 1 || memcmp(p, hdr, sizeof hdr - 1) != 0) {
                snprintf(why, whylen, "expected the header \"%s\"", hdr);
                rd->fatal = true;
                rd->p = rd->end;
                return -EINVAL;
            }
            continue;
        }
        if (fmt_blank(p, (size_t)(le - p))) continue;
        memset(out, 0, sizeof *out);
        memset(text, 0, sizeof *text);
        out->deadline_us = out->cancel_us = out->first_token_us = out->finish_us =
            out->cached_tokens = FMT_NULL;
        out->tenant = out->class_name = "";
        int rc;
        if (rd->format == FMT_TRACE_NATIVE)
            rc = fmt_request_parse(p, (size_t)(le - p), out, text, why, whylen);
        else if (rd->format == FMT_TRACE_AZURE)
            rc = azure_line(p, le, out, why, whylen);
        else
            rc = mooncake_line(p, (size_t)(le - p), out, text, why, whylen);
        if (rc < 0 && rd->format != FMT_TRACE_AZURE && fmt_json_line_torn(p, (size_t)(le - p))) {
            rd->torn++;
            continue;
        }
        if (rc < 0) return -EINVAL;
        if (rd->format != FMT_TRACE_NATIVE) out->req = rd->row;
        rd->row++;
        return 1;
    }
    return 0;
}
