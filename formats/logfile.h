/* SPDX-License-Identifier: MIT */
/*
 * formats/logfile.h — JSON-lines logs (request, iteration and decision logs) as files: the
 * one way a writer opens one, and the one test a reader applies to a line left torn.
 *
 * A writer that dies mid-line (kill -9, power loss) leaves a fragment without a newline at
 * the end of its log. Appending to it as it is would glue the next run's first line to the
 * fragment: one invalid line, and a good line lost. fmt_log_open ends such a fragment with
 * a newline before anything is appended, so the fragment stays a line of its own, which a
 * reader recognises (fmt_json_line_torn: a prefix of a JSON object), skips and counts.
 */
#ifndef RINGLM_FORMATS_LOGFILE_H
#define RINGLM_FORMATS_LOGFILE_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Opens path for appending (created 0644 when absent; emptied first when truncate), and
 * when it is a regular file whose last byte is not a newline, appends one. *torn_bytes (may
 * be NULL) gets the length of the fragment so ended (0: none). The descriptor (O_CLOEXEC,
 * O_APPEND), or -errno.
 */
int fmt_log_open(const char *path, bool truncate, size_t *torn_bytes);

/* Whether line[0..len) (no newline) is what a writer that died mid-line leaves: the start
 * of a JSON object cut short. Such a line is not an error in the file: readers skip it and
 * count it. */
bool fmt_json_line_torn(const char *line, size_t len);

#ifdef __cplusplus
}
#endif
#endif
