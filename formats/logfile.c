/* SPDX-License-Identifier: MIT */
#include "formats/logfile.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* How far back a fragment's length is measured (only reported, never needed). */
#define TORN_SCAN_MAX (1u << 20)

static size_t fragment_length(int fd, off_t size)
{
    char buf[4096];
    size_t n = 0;
    off_t end = size;
    while (end > 0 && n < TORN_SCAN_MAX) {
        size_t chunk = end > (off_t)sizeof buf ? sizeof buf : (size_t)end;
        ssize_t got = pread(fd, buf, chunk, end - (off_t)chunk);
        if (got != (ssize_t)chunk) break;
        const char *nl = memrchr(buf, '\n', chunk);
        if (nl) return n + (size_t)(buf + chunk - nl - 1);
        n += chunk;
        end -= (off_t)chunk;
    }
    return n;
}

int fmt_log_open(const char *path, bool truncate, size_t *torn_bytes)
{
    if (torn_bytes) *torn_bytes = 0;
    int flags = O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0);
    /* Read access only to look at the last byte; a log we may only write is appended to
     * unchecked. */
    int fd = open(path, O_RDWR | flags, 0644);
    if (fd < 0 && (errno == EACCES || errno == EISDIR)) fd = open(path, O_WRONLY | flags, 0644);
    if (fd < 0) return -errno;
    struct stat st;
    char last;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
        pread(fd, &last, 1, st.st_size - 1) == 1 && last != '\n') {
        size_t n = fragment_length(fd, st.st_size);
        if (write(fd, "\n", 1) != 1) {
            int e = errno ? errno : EIO;
            close(fd);
            return -e;
        }
        if (torn_bytes) *torn_bytes = n;
    }
    return fd;
}

bool fmt_json_line_torn(const char *line, size_t len)
{
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    if (i == len || line[i] != '{') return false;
    json_error_t err;
    json_t *v = json_loadb(line + i, len - i, 0, &err);
    if (v) {
        json_decref(v);
        return false;
    }
    return json_error_code(&err) == json_error_premature_end_of_input;
}
