/* SPDX-License-Identifier: MIT */
/*
 * formats/trace.h — the request-trace readers: Azure LLM inference CSV, Mooncake JSON lines
 * and ringlm's native JSON lines (the request log, formats/request_log.h). Used by
 * ringlm-sim (sim/trace.c) and the ringlm CLI (replay); the only trace readers there are.
 *
 * Every format yields the request log's record, fmt_request:
 *   Azure     `TIMESTAMP,ContextTokens,GeneratedTokens` with a header line; TIMESTAMP is
 *             "YYYY-MM-DD HH:MM:SS[.f…]" (or a T between date and time), read as UTC and
 *             rounded to the nearest µs; arrival_us is µs since the epoch (callers rebase
 *             to the first row); prompt = ContextTokens >= 1, max = output =
 *             GeneratedTokens >= 1; req = the data row (0, 1, …).
 *   Mooncake  {"timestamp": ms, "input_length": n >= 1, "output_length": n >= 1,
 *             "hash_ids": [...]}; arrival_us = timestamp × 1000 rounded; req = the row;
 *             hash_ids (integers >= 0) are the prompt's 512-token blocks (hash_block_tokens).
 *   native    fmt_request_parse.
 * Tenants and classes are empty except in native traces. Blank lines are skipped; CRLF is
 * accepted.
 */
#ifndef RINGLM_FORMATS_TRACE_H
#define RINGLM_FORMATS_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/request_log.h"

#ifdef __cplusplus
extern "C" {
#endif

enum fmt_trace_format {
    FMT_TRACE_AUTO = 0, /* guess from the content (fmt_trace_guess) */
    FMT_TRACE_AZURE = 1,
    FMT_TRACE_MOONCAKE = 2,
    FMT_TRACE_NATIVE = 3,
};

/* The Azure header line. */
#define FMT_AZURE_HEADER "TIMESTAMP,ContextTokens,GeneratedTokens"

/* From the first non-blank line: `TIMESTAMP` → Azure; a JSON object with "arrival_us" →
 * native; with "input_length" → Mooncake. -1 when none fits. */
int fmt_trace_guess(const char *buf, size_t len);
/* "azure-csv", "mooncake-jsonl", "native-jsonl", or "generated" for anything else. */
const char *fmt_trace_format_name(int format);

typedef struct fmt_trace_reader {
    const char *p, *end;
    int format;    /* enum fmt_trace_format, never AUTO after open */
    uint32_t line; /* line of the record (or bad line) last returned, from 1 */
    uint64_t row;  /* records returned so far (Azure/Mooncake req ids) */
    bool fatal;    /* the last error ends the file (no Azure header) */
    uint32_t torn; /* JSON lines skipped as torn (fmt_json_line_torn: a writer that died
                      mid-line); not errors: callers say how many */
} fmt_trace_reader;

/* Starts reading buf[0..len) (not copied: it must outlive the reader). format AUTO
 * guesses. 0, or -EINVAL with why when the format is unknown. */
int fmt_trace_open(fmt_trace_reader *rd, const char *buf, size_t len, int format, char *why,
                   size_t whylen);

/*
 * The next request. Returns 1 with *out set (its strings in *text); 0 at the end;
 * -EINVAL when line rd->line is malformed, with why (without the line number). The reader
 * has moved past the bad line: a caller that skips bad lines calls again, unless rd->fatal.
 * A torn JSON line (the start of an object cut short) is skipped and counted in rd->torn.
 */
int fmt_trace_next(fmt_trace_reader *rd, fmt_request *out, fmt_request_text *text, char *why,
                   size_t whylen);

/* "YYYY-MM-DD HH:MM:SS[.f{1,9}]" in [p, end) → µs since the epoch, rounded. 0, or -1
 * with why. */
int fmt_azure_timestamp(const char *p, const char *end, int64_t *us, char *why, size_t whylen);

#ifdef __cplusplus
}
#endif
#endif
