/* ringlm — simulator request traces: readers and transformations. SPDX-License-Identifier: MIT */
#include "sim/trace.h"
#include "sim/err.h"
#include "sim/rng.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_BAD_LIST_MAX 1000

/* ---- container ------------------------------------------------------------------------ */

void sim_trace_init(sim_trace *t, const char *source)
{
    memset(t, 0, sizeof *t);
    snprintf(t->source, sizeof t->source, "%s", source ? source : "");
}

void sim_trace_free(sim_trace *t)
{
    free(t->reqs);
    free(t->bad);
    for (unsigned i = 0; i < t->n_tenants; i++) free(t->tenants[i]);
    for (unsigned i = 0; i < t->n_classes; i++) free(t->classes[i]);
    memset(t, 0, sizeof *t);
}

int sim_trace_push(sim_trace *t, const sim_req *r)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        sim_req *p = realloc(t->reqs, cap * sizeof *p);
        if (!p) return sim_err_setc(-ENOMEM, "out of memory for %zu requests", cap);
        t->reqs = p;
        t->cap = cap;
    }
    t->reqs[t->n++] = *r;
    return 0;
}

static int intern(char **names, unsigned *n, const char *name, const char *what)
{
    for (unsigned i = 0; i < *n; i++)
        if (strcmp(names[i], name) == 0) return (int)i;
    if (*n >= SIM_MAX_NAMES)
        return sim_err_setc(-E2BIG, "more than %d distinct %s names (at \"%s\")", SIM_MAX_NAMES,
                            what, name);
    names[*n] = strdup(name);
    if (!names[*n]) return -ENOMEM;
    return (int)(*n)++;
}

int sim_trace_tenant(sim_trace *t, const char *name) { return intern(t->tenants, &t->n_tenants, name, "tenant"); }
int sim_trace_class(sim_trace *t, const char *name) { return intern(t->classes, &t->n_classes, name, "class"); }

static int cmp_arrival(const void *a, const void *b)
{
    const sim_req *x = a, *y = b;
    if (x->arrival_us != y->arrival_us) return x->arrival_us < y->arrival_us ? -1 : 1;
    /* Ties keep the submission order: src_id is the daemon's request id in a native log
     * (ids are given in the order the loop drained requests, and requests drained in one pass
     * share arrival_us, while the lines are in finish order), the row elsewhere. src_line
     * last: qsort itself is not stable. */
    if (x->src_id != y->src_id) return x->src_id < y->src_id ? -1 : 1;
    return x->src_line < y->src_line ? -1 : x->src_line > y->src_line;
}

void sim_trace_sort(sim_trace *t)
{
    for (size_t i = 1; i < t->n; i++)
        if (t->reqs[i].arrival_us < t->reqs[i - 1].arrival_us) {
            qsort(t->reqs, t->n, sizeof *t->reqs, cmp_arrival);
            return;
        }
}

const char *sim_trace_format_name(int fmt)
{
    switch (fmt) {
    case SIM_FMT_AZURE: return "azure-csv";
    case SIM_FMT_MOONCAKE: return "mooncake-jsonl";
    case SIM_FMT_NATIVE: return "native-jsonl";
    default: return "generated";
    }
}

/* ---- bad lines -------------------------------------------------------------------------- */

/* A refused line: an error unless skipping, then listed. Returns 0 to go on, <0 to stop. */
static int bad_line(sim_trace *t, const char *name, uint32_t line, bool skip_bad, const char *reason)
{
    if (!skip_bad) return sim_err_set("%s:%u: %s", name, line, reason);
    t->n_bad_total++;
    if (t->n_bad >= SIM_BAD_LIST_MAX) return 0;
    if (t->n_bad == t->cap_bad) {
        size_t cap = t->cap_bad ? t->cap_bad * 2 : 16;
        sim_bad_line *p = realloc(t->bad, cap * sizeof *p);
        if (!p) return -ENOMEM;
        t->bad = p;
        t->cap_bad = cap;
    }
    t->bad[t->n_bad].line = line;
    snprintf(t->bad[t->n_bad].reason, sizeof t->bad[t->n_bad].reason, "%s", reason);
    t->n_bad++;
    return 0;
}

static void req_defaults(sim_req *r)
{
    memset(r, 0, sizeof *r);
    r->deadline_us = r->cancel_us = SIM_NO_TIME;
    r->real_first_token_us = r->real_finish_us = SIM_NO_TIME;
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

/* "YYYY-MM-DD HH:MM:SS[.f{1,9}]" → µs since the epoch (naive wall clock, no zone). */
static int parse_timestamp(const char *p, const char *end, int64_t *us, const char **why)
{
    int Y, M, D, h, m, s;
    if (digits(&p, end, 4, &Y) || p >= end || *p++ != '-' || digits(&p, end, 2, &M) || p >= end ||
        *p++ != '-' || digits(&p, end, 2, &D) || p >= end || (*p != ' ' && *p != 'T') ||
        (p++, digits(&p, end, 2, &h)) || p >= end || *p++ != ':' || digits(&p, end, 2, &m) ||
        p >= end || *p++ != ':' || digits(&p, end, 2, &s)) {
        *why = "TIMESTAMP is not YYYY-MM-DD HH:MM:SS.fffffff";
        return -1;
    }
    if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || s > 60) {
        *why = "TIMESTAMP has a field out of range";
        return -1;
    }
    int64_t ns = 0;
    if (p < end && *p == '.') {
        p++;
        int nd = 0;
        while (p < end && isdigit((unsigned char)*p)) {
            if (nd < 9) { ns = ns * 10 + (*p - '0'); nd++; }
            p++;
        }
        if (nd == 0) { *why = "TIMESTAMP has a '.' without digits"; return -1; }
        for (; nd < 9; nd++) ns *= 10;
    }
    if (p != end) { *why = "TIMESTAMP has trailing characters"; return -1; }
    int64_t secs = days_from_civil(Y, (unsigned)M, (unsigned)D) * 86400 + h * 3600 + m * 60 + s;
    /* 7 fractional digits are 100 ns; round to the nearest µs rather than truncating. */
    *us = secs * 1000000 + (ns + 500) / 1000;
    return 0;
}

/* A positive decimal integer field in [p, end). */
static int parse_count(const char *p, const char *end, uint32_t *out)
{
    while (p < end && *p == ' ') p++;
    while (end > p && end[-1] == ' ') end--;
    if (p == end) return -1;
    uint64_t v = 0;
    for (; p < end; p++) {
        if (!isdigit((unsigned char)*p)) return -1;
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > 0x7fffffff) return -2;
    }
    *out = (uint32_t)v;
    return 0;
}

static int parse_azure(sim_trace *t, const char *name, const char *buf, size_t len, bool skip_bad)
{
    const char *p = buf, *end = buf + len;
    uint32_t line = 0;
    int64_t t0 = 0;
    bool have_t0 = false;
    uint64_t row = 0;
    int tenant = sim_trace_tenant(t, "default"), klass = sim_trace_class(t, "default");
    if (tenant < 0 || klass < 0) return -ENOMEM;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;        /* no trailing newline after the last row */
        const char *next = nl ? nl + 1 : end;
        if (le > p && le[-1] == '\r') le--;    /* CRLF */
        line++;
        if (line == 1) {
            static const char hdr[] = "TIMESTAMP,ContextTokens,GeneratedTokens";
            if ((size_t)(le - p) != sizeof hdr - 1 || memcmp(p, hdr, sizeof hdr - 1) != 0)
                return sim_err_set("%s:1: expected the header \"%s\"", name, hdr);
            p = next;
            continue;
        }
        if (le == p) { p = next; continue; }   /* a blank line carries nothing */
        const char *c1 = memchr(p, ',', (size_t)(le - p));
        const char *c2 = c1 ? memchr(c1 + 1, ',', (size_t)(le - c1 - 1)) : NULL;
        char why[120];
        sim_req r;
        req_defaults(&r);
        int64_t ts;
        const char *w = NULL;
        int rc;
        if (!c1 || !c2 || memchr(c2 + 1, ',', (size_t)(le - c2 - 1))) {
            snprintf(why, sizeof why, "expected 3 comma-separated fields");
        } else if (parse_timestamp(p, c1, &ts, &w) < 0) {
            snprintf(why, sizeof why, "%s", w);
        } else if ((rc = parse_count(c1 + 1, c2, &r.prompt_tokens)) < 0 || r.prompt_tokens == 0) {
            snprintf(why, sizeof why, "ContextTokens %s", rc == -2 ? "is too large" :
                     rc < 0 ? "is not a positive integer" : "is 0, must be positive");
        } else if ((rc = parse_count(c2 + 1, le, &r.output_tokens)) < 0 || r.output_tokens == 0) {
            snprintf(why, sizeof why, "GeneratedTokens %s", rc == -2 ? "is too large" :
                     rc < 0 ? "is not a positive integer" : "is 0, must be positive");
        } else {
            if (!have_t0) { t0 = ts; have_t0 = true; }
            /* Timestamps are relative to the first data row. */
            r.arrival_us = ts - t0;
            r.max_tokens = r.output_tokens;
            r.tenant = (uint16_t)tenant;
            r.klass = (uint16_t)klass;
            r.src_id = row++;
            r.src_line = line;
            if ((rc = sim_trace_push(t, &r)) < 0) return rc;
            p = next;
            continue;
        }
        if ((rc = bad_line(t, name, line, skip_bad, why)) < 0) return rc;
        p = next;
    }
    if (line == 0) return sim_err_set("%s: empty file", name);
    /* Rows are sorted in the published files; a row before the first one would be negative. */
    int64_t min = 0;
    for (size_t i = 0; i < t->n; i++) if (t->reqs[i].arrival_us < min) min = t->reqs[i].arrival_us;
    for (size_t i = 0; min < 0 && i < t->n; i++) t->reqs[i].arrival_us -= min;
    return 0;
}

/* ---- JSON lines ------------------------------------------------------------------------- */

/* Integer field: required → error when missing; optional → *out untouched when null/missing. */
static int json_int(json_t *o, const char *key, bool required, int64_t lo, int64_t hi,
                    int64_t *out, char *why, size_t whylen)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) { snprintf(why, whylen, "missing \"%s\"", key); return -1; }
        return 0;
    }
    double d;
    if (json_is_integer(v)) d = (double)json_integer_value(v);
    else if (json_is_real(v)) d = json_real_value(v);
    else { snprintf(why, whylen, "\"%s\" is not a number", key); return -1; }
    if (!(d >= (double)lo && d <= (double)hi)) {
        snprintf(why, whylen, "\"%s\" is %.17g, must be in [%lld, %lld]", key, d, (long long)lo,
                 (long long)hi);
        return -1;
    }
    *out = json_is_integer(v) ? json_integer_value(v) : (int64_t)llround(d);
    return 0;
}

static int json_str(json_t *o, const char *key, const char **out, char *why, size_t whylen)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 63) {
        snprintf(why, whylen, "\"%s\" must be a string of 1..63 characters", key);
        return -1;
    }
    *out = json_string_value(v);
    return 0;
}

/* One native line → r. Returns 0, or -1 with why. */
static int native_line(sim_trace *t, json_t *o, sim_req *r, char *why, size_t wl)
{
    int64_t v;
    const char *tenant = "default", *klass = "default", *reason = NULL;
    if (json_int(o, "req", true, 0, INT64_MAX, &v, why, wl)) return -1;
    r->src_id = (uint64_t)v;
    if (json_int(o, "arrival_us", true, 0, INT64_MAX / 4, &r->arrival_us, why, wl)) return -1;
    if (json_int(o, "prompt_tokens", true, 1, 0x7fffffff, &v, why, wl)) return -1;
    r->prompt_tokens = (uint32_t)v;
    v = 0;
    if (json_int(o, "output_tokens", false, 0, 0x7fffffff, &v, why, wl)) return -1;
    r->output_tokens = (uint32_t)v;
    v = r->output_tokens;
    if (json_int(o, "max_tokens", false, 0, 0x7fffffff, &v, why, wl)) return -1;
    r->max_tokens = (uint32_t)v;
    if (json_int(o, "deadline_us", false, 0, INT64_MAX / 4, &r->deadline_us, why, wl)) return -1;
    if (json_int(o, "cancel_us", false, 0, INT64_MAX / 4, &r->cancel_us, why, wl)) return -1;
    if (json_int(o, "first_token_us", false, 0, INT64_MAX / 4, &r->real_first_token_us, why, wl)) return -1;
    if (json_int(o, "finish_us", false, 0, INT64_MAX / 4, &r->real_finish_us, why, wl)) return -1;
    if (json_str(o, "tenant", &tenant, why, wl) || json_str(o, "class", &klass, why, wl) ||
        json_str(o, "finish_reason", &reason, why, wl))
        return -1;
    if (reason) {
        for (unsigned c = SCHED_END_LENGTH; c <= SCHED_END_ERROR; c++)
            if (strcmp(reason, sched_end_name(c)) == 0) r->real_reason = (uint8_t)c;
        if (!r->real_reason) { snprintf(why, wl, "unknown \"finish_reason\" \"%s\"", reason); return -1; }
    }
    /* Only a request that ran to its natural end tells how long its output is; for the others
     * (cancelled, timed out, rejected) replay the length the client asked for, and let the
     * recorded cancel time or the policy cut it short again. */
    if (r->real_reason != SIM_REAL_LENGTH && r->real_reason != SIM_REAL_STOP && r->max_tokens > 0)
        r->output_tokens = r->max_tokens;
    if (r->output_tokens == 0) { snprintf(why, wl, "\"output_tokens\" and \"max_tokens\" are 0"); return -1; }
    if (r->max_tokens < r->output_tokens) r->max_tokens = r->output_tokens;
    int ti = sim_trace_tenant(t, tenant), ci = sim_trace_class(t, klass);
    if (ti < 0 || ci < 0) { snprintf(why, wl, "%s", sim_err()); return -1; }
    r->tenant = (uint16_t)ti;
    r->klass = (uint16_t)ci;
    return 0;
}

static int mooncake_line(sim_trace *t, json_t *o, sim_req *r, char *why, size_t wl)
{
    int64_t v;
    if (json_int(o, "timestamp", true, 0, INT64_MAX / 4000, &v, why, wl)) return -1;
    r->arrival_us = v * 1000;   /* milliseconds */
    if (json_int(o, "input_length", true, 1, 0x7fffffff, &v, why, wl)) return -1;
    r->prompt_tokens = (uint32_t)v;
    if (json_int(o, "output_length", true, 1, 0x7fffffff, &v, why, wl)) return -1;
    r->output_tokens = r->max_tokens = (uint32_t)v;
    json_t *h = json_object_get(o, "hash_ids");
    if (h && !json_is_array(h) && !json_is_null(h)) { snprintf(why, wl, "\"hash_ids\" is not an array"); return -1; }
    (void)t;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int parse_jsonl(sim_trace *t, const char *name, const char *buf, size_t len, int fmt,
                       bool skip_bad)
{
    const char *p = buf, *end = buf + len;
    uint32_t line = 0;
    uint64_t row = 0;
    if (fmt == SIM_FMT_MOONCAKE) {
        int a = sim_trace_tenant(t, "default"), b = sim_trace_class(t, "default");
        if (a < 0 || b < 0) return -ENOMEM;
    } else {
        t->labelled = true;
        t->has_real = true;
    }
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end, *next = nl ? nl + 1 : end;
        if (le > p && le[-1] == '\r') le--;
        line++;
        const char *q = p;
        while (q < le && isspace((unsigned char)*q)) q++;
        if (q == le) { p = next; continue; }
        char why[120] = "";
        json_error_t jerr;
        json_t *o = json_loadb(p, (size_t)(le - p), JSON_REJECT_DUPLICATES, &jerr);
        sim_req r;
        req_defaults(&r);
        int rc = -1;
        if (!o) snprintf(why, sizeof why, "not JSON: %.100s", jerr.text);
        else if (!json_is_object(o)) snprintf(why, sizeof why, "not a JSON object");
        else rc = fmt == SIM_FMT_NATIVE ? native_line(t, o, &r, why, sizeof why)
                                        : mooncake_line(t, o, &r, why, sizeof why);
        json_decref(o);
        if (rc == 0) {
            r.src_line = line;
            if (fmt != SIM_FMT_NATIVE) r.src_id = row;
            row++;
            if ((rc = sim_trace_push(t, &r)) < 0) return rc;
        } else if ((rc = bad_line(t, name, line, skip_bad, why)) < 0) {
            return rc;
        }
        p = next;
    }
    if (fmt == SIM_FMT_NATIVE) {
        /* ids must be unique: fidelity mode matches requests by them */
        for (size_t i = 1; i < t->n; i++)
            if (t->reqs[i].src_id <= t->reqs[i - 1].src_id) {
                /* not sorted by id (finish order): check with a sort of a copy */
                uint64_t *ids = malloc(t->n * sizeof *ids);
                if (!ids) return -ENOMEM;
                for (size_t j = 0; j < t->n; j++) ids[j] = t->reqs[j].src_id;
                qsort(ids, t->n, sizeof *ids, cmp_u64);
                for (size_t j = 1; j < t->n; j++)
                    if (ids[j] == ids[j - 1]) {
                        unsigned long long dup = (unsigned long long)ids[j];
                        free(ids);
                        return sim_err_set("%s: request id %llu appears twice", name, dup);
                    }
                free(ids);
                break;
            }
    }
    sim_trace_sort(t);
    return 0;
}

/* ---- entry points ----------------------------------------------------------------------- */

static int guess_format(const char *buf, size_t len)
{
    const char *p = buf, *end = buf + len;
    while (p < end && isspace((unsigned char)*p)) p++;
    if (p < end && *p == '{') {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl : end) - p);
        if (memmem(p, n, "\"arrival_us\"", 12)) return SIM_FMT_NATIVE;
        if (memmem(p, n, "\"input_length\"", 14)) return SIM_FMT_MOONCAKE;
        return -1;
    }
    if ((size_t)(end - p) >= 9 && memcmp(p, "TIMESTAMP", 9) == 0) return SIM_FMT_AZURE;
    return -1;
}

int sim_trace_parse(sim_trace *t, const char *name, const char *buf, size_t len, int fmt,
                    bool skip_bad)
{
    if (fmt == SIM_FMT_AUTO) {
        fmt = guess_format(buf, len);
        if (fmt < 0)
            return sim_err_set("%s: unknown trace format (expected an Azure CSV header "
                               "\"TIMESTAMP,ContextTokens,GeneratedTokens\", or JSON lines with "
                               "\"arrival_us\" (native) or \"input_length\" (Mooncake))", name);
    }
    t->format = fmt;
    snprintf(t->source, sizeof t->source, "%s", name);
    if (fmt == SIM_FMT_AZURE) return parse_azure(t, name, buf, len, skip_bad);
    return parse_jsonl(t, name, buf, len, fmt, skip_bad);
}

int sim_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (cap - len < 65536) {
            size_t ncap = cap ? cap * 2 : 1 << 20;
            char *nb = realloc(buf, ncap);
            if (!nb) { rc = sim_err_setc(-ENOMEM, "%s: out of memory", path); goto out; }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (len > max_bytes) { rc = sim_err_setc(-EFBIG, "%s: larger than %zu MiB", path, max_bytes >> 20); goto out; }
        if (got == 0) break;
    }
    if (ferror(f)) { rc = sim_err_setc(-EIO, "%s: read error", path); goto out; }
    buf[len] = 0;
    *out = buf;
    if (out_len) *out_len = len;
    buf = NULL;
out:
    free(buf);
    fclose(f);
    return rc;
}

int sim_trace_load(sim_trace *t, const char *path, int fmt, bool skip_bad)
{
    char *buf;
    size_t len;
    int rc = sim_read_file(path, SIZE_MAX, &buf, &len);
    if (rc < 0) return rc;
    const char *base = strrchr(path, '/');
    rc = sim_trace_parse(t, base ? base + 1 : path, buf, len, fmt, skip_bad);
    free(buf);
    return rc;
}

/* ---- transformations --------------------------------------------------------------------- */

void sim_transform_defaults(sim_transform *x)
{
    memset(x, 0, sizeof *x);
    x->window_end_s = -1;
    x->rate = 1;
    x->length_scale = 1;
    x->seed = 1;
}

static int64_t scale_time(int64_t us, double rate)
{
    return us == SIM_NO_TIME ? us : (int64_t)llround((double)us / rate);
}

static uint32_t scale_len(uint32_t n, double s)
{
    double v = round((double)n * s);
    return v < 1 ? 1 : v > 0x7fffffff ? 0x7fffffff : (uint32_t)v;
}

int sim_trace_transform(sim_trace *t, const sim_transform *x)
{
    if (!(x->rate > 0) || !isfinite(x->rate)) return sim_err_set("--rate must be > 0 (is %g)", x->rate);
    if (!(x->length_scale > 0) || !isfinite(x->length_scale))
        return sim_err_set("--length-scale must be > 0 (is %g)", x->length_scale);
    if (x->window_start_s > 0 || x->window_end_s >= 0) {
        if (x->window_end_s >= 0 && x->window_end_s <= x->window_start_s)
            return sim_err_set("--window END (%g) must be after START (%g)", x->window_end_s,
                               x->window_start_s);
        int64_t lo = (int64_t)llround(x->window_start_s * 1e6);
        int64_t hi = x->window_end_s < 0 ? INT64_MAX : (int64_t)llround(x->window_end_s * 1e6);
        size_t k = 0;
        for (size_t i = 0; i < t->n; i++) {
            sim_req r = t->reqs[i];
            if (r.arrival_us < lo || r.arrival_us >= hi) continue;
            r.arrival_us -= lo;
            if (r.cancel_us != SIM_NO_TIME) r.cancel_us -= lo;
            if (r.deadline_us != SIM_NO_TIME) r.deadline_us -= lo;
            if (r.real_first_token_us != SIM_NO_TIME) r.real_first_token_us -= lo;
            if (r.real_finish_us != SIM_NO_TIME) r.real_finish_us -= lo;
            t->reqs[k++] = r;
        }
        t->n = k;
    }
    if (x->rate != 1)
        for (size_t i = 0; i < t->n; i++) {
            sim_req *r = &t->reqs[i];
            r->arrival_us = scale_time(r->arrival_us, x->rate);
            r->cancel_us = scale_time(r->cancel_us, x->rate);
            r->deadline_us = scale_time(r->deadline_us, x->rate);
            r->real_first_token_us = scale_time(r->real_first_token_us, x->rate);
            r->real_finish_us = scale_time(r->real_finish_us, x->rate);
        }
    if (x->length_scale != 1)
        for (size_t i = 0; i < t->n; i++) {
            sim_req *r = &t->reqs[i];
            r->prompt_tokens = scale_len(r->prompt_tokens, x->length_scale);
            r->output_tokens = scale_len(r->output_tokens, x->length_scale);
            r->max_tokens = scale_len(r->max_tokens, x->length_scale);
        }
    int rc;
    if (x->tenant_rule && (rc = sim_trace_assign(t, 0, x->tenant_rule, x->seed)) < 0) return rc;
    if (x->class_rule && (rc = sim_trace_assign(t, 1, x->class_rule, x->seed ^ 0x5bd1e995)) < 0)
        return rc;
    return 0;
}

/* ---- assignment rules ------------------------------------------------------------------- */

#define RULE_MAX 32

int sim_trace_assign(sim_trace *t, int which, const char *rule, uint64_t seed)
{
    const char *what = which ? "--classes" : "--tenants";
    char buf[512];
    if (strlen(rule) >= sizeof buf) return sim_err_set("%s rule is too long", what);
    snprintf(buf, sizeof buf, "%s", rule);
    enum { SWRR, RR, RANDOM, BYLEN } kind = SWRR;
    char *s = buf;
    uint64_t threshold = 0;
    if (strncmp(s, "rr:", 3) == 0) { kind = RR; s += 3; }
    else if (strncmp(s, "random:", 7) == 0) { kind = RANDOM; s += 7; }
    else if (strncmp(s, "prompt>", 7) == 0) {
        kind = BYLEN;
        char *e;
        threshold = strtoull(s + 7, &e, 10);
        if (e == s + 7 || *e != ':') return sim_err_set("%s \"%s\": expected prompt>N:long,short", what, rule);
        s = e + 1;
    }
    char *names[RULE_MAX];
    double weights[RULE_MAX];
    int n = 0;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
        if (n == RULE_MAX) return sim_err_set("%s \"%s\": more than %d names", what, rule, RULE_MAX);
        char *colon = strchr(tok, ':');
        weights[n] = 1;
        if (colon) {
            if (kind == RR || kind == BYLEN)
                return sim_err_set("%s \"%s\": weights are not allowed in this rule", what, rule);
            *colon = 0;
            char *e;
            weights[n] = strtod(colon + 1, &e);
            if (e == colon + 1 || *e || !(weights[n] > 0) || !isfinite(weights[n]))
                return sim_err_set("%s \"%s\": weight of \"%s\" must be a positive number", what, rule, tok);
        }
        if (!*tok || strlen(tok) > 63) return sim_err_set("%s \"%s\": empty or too long name", what, rule);
        names[n++] = tok;
    }
    if (n == 0) return sim_err_set("%s \"%s\": no names", what, rule);
    if (kind == BYLEN && n != 2) return sim_err_set("%s \"%s\": prompt>N takes two names", what, rule);
    int idx[RULE_MAX];
    for (int i = 0; i < n; i++) {
        idx[i] = which ? sim_trace_class(t, names[i]) : sim_trace_tenant(t, names[i]);
        if (idx[i] < 0) return idx[i];
    }
    double total = 0, current[RULE_MAX] = {0};
    for (int i = 0; i < n; i++) total += weights[i];
    sim_rng rng;
    sim_rng_seed(&rng, seed);
    for (size_t k = 0; k < t->n; k++) {
        int pick = 0;
        switch (kind) {
        case RR: pick = (int)(k % (size_t)n); break;
        case BYLEN: pick = t->reqs[k].prompt_tokens > threshold ? 0 : 1; break;
        case RANDOM: {
            double u = sim_rng_unif(&rng) * total, acc = 0;
            for (pick = 0; pick < n - 1; pick++) { acc += weights[pick]; if (u < acc) break; }
            break;
        }
        case SWRR:   /* nginx's smooth weighted round robin: evenly interleaved */
            for (int i = 0; i < n; i++) current[i] += weights[i];
            for (int i = 1; i < n; i++) if (current[i] > current[pick]) pick = i;
            current[pick] -= total;
            break;
        }
        if (which) t->reqs[k].klass = (uint16_t)idx[pick];
        else t->reqs[k].tenant = (uint16_t)idx[pick];
    }
    return 0;
}

void sim_trace_summarise(const sim_trace *t, sim_trace_summary *s)
{
    memset(s, 0, sizeof *s);
    s->n = t->n;
    if (!t->n) return;
    for (size_t i = 0; i < t->n; i++) {
        const sim_req *r = &t->reqs[i];
        s->prompt_total += r->prompt_tokens;
        s->output_total += r->output_tokens;
        if (r->prompt_tokens > s->prompt_max) s->prompt_max = r->prompt_tokens;
        if (r->output_tokens > s->output_max) s->output_max = r->output_tokens;
    }
    s->span_s = (double)(t->reqs[t->n - 1].arrival_us - t->reqs[0].arrival_us) / 1e6;
    s->rate_per_s = s->span_s > 0 ? (double)(t->n - 1) / s->span_s : 0;
    s->prompt_mean = (double)s->prompt_total / (double)t->n;
    s->output_mean = (double)s->output_total / (double)t->n;
}
