/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_text.h — the text side of ringlm-gateway: a growable byte buffer, UTF-8 that is
 * emitted only at whole code points, stop strings cut on the text as the OpenAI API cuts
 * them, and JSON string escaping for the hand-formatted stream chunks.
 *
 * Why by hand: a streamed token is one chunk whose only variable part is its text, so the
 * gateway formats it around a prefix and suffix made once per request instead of building a
 * jansson tree per token (the per-token cost is what the benchmark holds to 20 µs).
 *
 * Pure functions over caller memory; no threads, no globals.
 */
#ifndef RINGLM_TOOLS_GW_TEXT_H
#define RINGLM_TOOLS_GW_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gw_buf {
    char *p; /* NUL-terminated when len > 0 or after gw_buf_add* */
    size_t len;
    size_t cap;
} gw_buf;

/* Appends; returns 0 or -ENOMEM (the buffer is unchanged then). */
int gw_buf_add(gw_buf *b, const void *p, size_t n);
int gw_buf_adds(gw_buf *b, const char *s);
__attribute__((format(printf, 2, 3))) int gw_buf_addf(gw_buf *b, const char *fmt, ...);
/* Appends s as a JSON string literal (quotes included). s must be valid UTF-8 (the
 * gateway only escapes text gw_utf8_take produced or jansson validated). */
int gw_buf_add_json_str(gw_buf *b, const char *s, size_t n);
/* Drops the first n bytes. */
void gw_buf_consume(gw_buf *b, size_t n);
void gw_buf_free(gw_buf *b);

/*
 * Moves the complete UTF-8 of in[0..n) to out: valid sequences as they are, each invalid
 * byte as U+FFFD. A valid but incomplete sequence at the end is left unconsumed unless
 * final (then it becomes U+FFFD too). Returns the number of input bytes consumed, or
 * -ENOMEM.
 */
long gw_utf8_take(const char *in, size_t n, bool final, gw_buf *out);

/* Stop strings, at most GW_MAX_STOP, each 1..GW_STOP_MAX_LEN bytes. */
#define GW_MAX_STOP     16
#define GW_STOP_MAX_LEN 256
typedef struct gw_stop {
    const char *s[GW_MAX_STOP];
    size_t len[GW_MAX_STOP];
    int n;
} gw_stop;

/*
 * Where text t[0..n) may be emitted: when a stop string occurs in it, *emit is where the
 * earliest occurrence starts and the function returns true (the text is cut there, the stop
 * string itself is not part of the output); otherwise *emit is n less the longest suffix of
 * t that begins some stop string (held back until the next token decides), and it returns
 * false. With no stop strings *emit is n.
 */
bool gw_stop_scan(const gw_stop *st, const char *t, size_t n, size_t *emit);

#endif
