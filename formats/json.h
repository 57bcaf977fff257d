/* SPDX-License-Identifier: MIT */
/*
 * formats/json.h — the one JSON writer of ringlm's files, and the field readers every
 * format's parser uses.
 *
 * Every JSON line or file ringlm writes (request log, iteration log, decision-log lines, the
 * stats file) goes through fmt_json: a bounded writer into a caller's buffer that escapes
 * every string (RFC 8259) and replaces invalid UTF-8 with U+FFFD. Clients choose class
 * names, tenant tags and the text in reject details; without the escaping a quote or a
 * newline in one of them would forge a field or a whole line of a log, and without the
 * UTF-8 repair a reader (jansson refuses invalid UTF-8) would lose the line.
 *
 * The writer never fails half-way: it counts what it would have written, so fmt_json_end
 * says -EMSGSIZE when the buffer was too small (the buffer then holds a NUL-terminated
 * prefix that must not be used as a line). Pure; any thread; no allocation.
 *
 * Usage:
 *     char line[512];
 *     fmt_json j;
 *     fmt_json_init(&j, line, sizeof line);        // writes "{"
 *     fmt_json_uint(&j, "t_us", now);
 *     fmt_json_str(&j, "class", class_name);       // escaped; NULL → null
 *     fmt_json_object(&j, "kv");                   // nested: "kv":{
 *     fmt_json_uint(&j, "used", 3);
 *     fmt_json_close(&j);                          // }
 *     int n = fmt_json_end(&j);                    // closes "{", returns the length or -EMSGSIZE
 */
#ifndef RINGLM_FORMATS_JSON_H
#define RINGLM_FORMATS_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An optional integer field that is absent: written as JSON null, read back from null or
 * from a missing key. */
#define FMT_NULL INT64_MIN

/* Nesting depth of objects and arrays the writer tracks (the top-level object included). */
#define FMT_JSON_DEPTH 8

typedef struct fmt_json {
    char *buf;
    size_t cap;
    size_t len;                  /* bytes the output needs so far (may exceed cap) */
    int depth;                   /* open objects/arrays; 1 after init */
    bool first[FMT_JSON_DEPTH];  /* no member written yet at this level */
    char closer[FMT_JSON_DEPTH]; /* '}' or ']' */
    bool too_deep;
} fmt_json;

/* Starts an object in buf[cap] (writes "{"). */
void fmt_json_init(fmt_json *j, char *buf, size_t cap);

/* Members. key is the member name inside an object; NULL inside an array (an element). */
void fmt_json_int(fmt_json *j, const char *key, int64_t v); /* FMT_NULL → null */
void fmt_json_uint(fmt_json *j, const char *key, uint64_t v);
/* decimals >= 0: fixed with that many decimals; < 0: shortest exact ("%.17g"). NaN and
 * infinities are not JSON: null. */
void fmt_json_double(fmt_json *j, const char *key, double v, int decimals);
void fmt_json_str(fmt_json *j, const char *key, const char *s); /* NULL → null */
/* The first n bytes of s (which need not be NUL-terminated). */
void fmt_json_strn(fmt_json *j, const char *key, const char *s, size_t n);
void fmt_json_bool(fmt_json *j, const char *key, bool v);
void fmt_json_null(fmt_json *j, const char *key);
/* Opens a nested object / array as member key; fmt_json_close closes the innermost. */
void fmt_json_object(fmt_json *j, const char *key);
void fmt_json_array(fmt_json *j, const char *key);
void fmt_json_close(fmt_json *j);

/* Closes every open level, NUL-terminates, and returns the length (without the NUL), or
 * -EMSGSIZE when buf was too small (or nesting went past FMT_JSON_DEPTH). */
int fmt_json_end(fmt_json *j);

/*
 * Writes s[0..n) as a JSON string body (no quotes) into dst at *pos, never past cap
 * (*pos still advances by what it needed): quote and backslash escaped, control characters
 * as \n \r \t or \u00XX, and every byte that does not start a well-formed UTF-8 sequence
 * (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF) as U+FFFD.
 */
void fmt_json_escape(char *dst, size_t cap, size_t *pos, const char *s, size_t n);

/* ---- readers' field access (jansson) ---------------------------------------------------- */

/* Flags of fmt_get_int / fmt_get_num / fmt_get_str. */
#define FMT_REQUIRED 1u /* missing or null is an error */
#define FMT_NULLABLE                                                                               \
    2u /* missing or null sets FMT_NULL (NaN for numbers, NULL for strings);
                             without it, missing leaves *out as the caller set it */

/*
 * An integer field in [lo, hi]. A real is accepted and rounded to the nearest integer (a
 * trace written by another tool may have 12.0); anything else is an error. Returns 0, or -1
 * with why ("\"prompt_tokens\" is -3, must be in [0, 2147483647]").
 */
int fmt_get_int(json_t *o, const char *key, unsigned flags, int64_t lo, int64_t hi, int64_t *out,
                char *why, size_t whylen);
/* A finite number >= lo. Same returns. */
int fmt_get_num(json_t *o, const char *key, unsigned flags, double lo, double *out, char *why,
                size_t whylen);
/* A string of at most cap-1 bytes copied into out[cap]. */
int fmt_get_str(json_t *o, const char *key, unsigned flags, char *out, size_t cap, char *why,
                size_t whylen);

/* An optional array of integers in [0, 2^63) (block hashes): up to cap of them into out,
 * *n their count (0 when missing or null).  -1 with why when it is not such an array or holds
 * more than cap. */
int fmt_get_u64_array(json_t *o, const char *key, uint64_t *out, uint32_t cap, uint32_t *n,
                      char *why, size_t whylen);

/* Parses one line as a JSON object (duplicate keys refused). NULL with why when it is not. */
json_t *fmt_load_object(const char *line, size_t len, char *why, size_t whylen);

/* True when [p, p+len) holds only blanks (space, tab, CR, LF). */
bool fmt_blank(const char *p, size_t len);

/*
 * Reads a whole file into a NUL-terminated buffer (*out, the caller frees it; *out_len
 * without the NUL), at most max_bytes. Returns 0 or -errno (-EFBIG over max_bytes) with why.
 */
int fmt_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len, char *why,
                  size_t whylen);

#ifdef __cplusplus
}
#endif
#endif
