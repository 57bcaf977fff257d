/* SPDX-License-Identifier: MIT */
/*
 * tools/prom.h — the one Prometheus scraper: fetches a daemon's /metrics over HTTP and reads
 * the text exposition format. Used by `ringlm replay --metrics` and by the tests (the
 * daemon's metrics endpoint, the CLI's replay), so both read metrics the same way.
 */
#ifndef RINGLM_TOOLS_PROM_H
#define RINGLM_TOOLS_PROM_H

#include <stddef.h>

/*
 * GET path from spec ("HOST:PORT", "[V6]:PORT" or "PORT" for 127.0.0.1) over HTTP/1.0.
 * Returns the body (malloc()ed, NUL-terminated; the caller frees it) with *status the HTTP
 * status and, when content_type is not NULL, the Content-Type header in it ("" when none);
 * or NULL with err when the address does not resolve, the connection fails or the answer
 * is not HTTP.
 */
char *prom_http_get(const char *spec, const char *path, int *status, char *content_type,
                    size_t ct_cap, char *err, size_t errlen);
/* prom_http_get of /metrics that also requires status 200. */
char *prom_get_metrics(const char *spec, char *err, size_t errlen);

/* Value of the first sample whose line starts with series (a metric name with its labels, or
 * without them: then any label set matches). NAN when there is none. */
double prom_value(const char *text, const char *series);

/* Unescapes a label value starting after its opening quote into out[cap]; returns the
 * character after the closing quote. */
const char *prom_label_value(const char *p, char *out, size_t cap);

/* A histogram's cumulative buckets (le → count), summed over the label sets of one group. */
#define PROM_HIST_MAX_LE 64
typedef struct prom_hist {
    char tenant[64]; /* the group: the value of the tenant label */
    int n;
    double le[PROM_HIST_MAX_LE];
    double cum[PROM_HIST_MAX_LE];
} prom_hist;

typedef struct prom_hist_set {
    prom_hist *h;
    int n;
} prom_hist_set;

/* Sums ringlm_queue_wait_seconds buckets over classes, per tenant, into s. */
void prom_parse_queue_wait(const char *text, prom_hist_set *s);
/* Percentile q (0..1) of the counts between two scrapes (a - b; b may be NULL), linear
 * inside a bucket, in ms; NAN when empty. */
double prom_hist_percentile(const prom_hist *a, const prom_hist *b, double q);

#endif
