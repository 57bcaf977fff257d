/* SPDX-License-Identifier: MIT */
/* tools/prom.c — the one Prometheus scraper of ringlm: HTTP GET of the daemon's /metrics,
 * sample values, histogram buckets and their percentiles (see prom.h). */
#include "tools/prom.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tools/cli.h"

/* ---- HTTP ------------------------------------------------------------------------------ */

char *prom_http_get(const char *spec, const char *path, int *status, char *content_type,
                    size_t ct_cap, char *err, size_t errlen)
{
    char host[128] = "127.0.0.1", port[16];
    const char *colon = strrchr(spec, ':');
    if (!colon)
        snprintf(port, sizeof port, "%s", spec);
    else {
        if (colon != spec) snprintf(host, sizeof host, "%.*s", (int)(colon - spec), spec);
        snprintf(port, sizeof port, "%s", colon + 1);
    }
    if (host[0] == '[') { /* [v6] */
        memmove(host, host + 1, strlen(host));
        char *rb = strchr(host, ']');
        if (rb) *rb = 0;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, port, &hints, &ai) != 0) {
        snprintf(err, errlen, "metrics address '%s' does not resolve", spec);
        return NULL;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        snprintf(err, errlen, "%s at %s: %s", path, spec, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return NULL;
    }
    freeaddrinfo(ai);
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, host);
    if (n < 0 || (size_t)n >= sizeof req || write(fd, req, (size_t)n) != n) {
        close(fd);
        snprintf(err, errlen, "%s at %s: write failed", path, spec);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = cli_realloc(NULL, cap);
    for (;;) {
        if (len + 4096 >= cap) buf = cli_realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = 0;
    char *body = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.", 7) != 0 || !body || len < 12) {
        snprintf(err, errlen, "%s at %s: not an HTTP answer", path, spec);
        free(buf);
        return NULL;
    }
    *status = atoi(buf + 9);
    if (content_type && ct_cap) {
        content_type[0] = 0;
        *body = 0; /* the headers end here */
        for (char *h = strstr(buf, "\r\n"); h; h = strstr(h + 2, "\r\n"))
            if (strncasecmp(h + 2, "Content-Type:", 13) == 0) {
                const char *v = h + 15;
                while (*v == ' ') v++;
                snprintf(content_type, ct_cap, "%.*s", (int)strcspn(v, "\r\n"), v);
                break;
            }
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

char *prom_get_metrics(const char *spec, char *err, size_t errlen)
{
    int status = 0;
    char *body = prom_http_get(spec, "/metrics", &status, NULL, 0, err, errlen);
    if (body && status != 200) {
        snprintf(err, errlen, "metrics at %s: HTTP status %d", spec, status);
        free(body);
        return NULL;
    }
    return body;
}

/* ---- the text format ------------------------------------------------------------------- */

double prom_value(const char *text, const char *series)
{
    const char *p = text;
    size_t n = strlen(series);
    while ((p = strstr(p, series))) {
        if ((p == text || p[-1] == '\n') &&
            (p[n] == ' ' || (p[n] == '{' && !strchr(series, '{')))) {
            /* the value is the last space-separated field before the newline (a timestamp
             * is not written by ringlmd) */
            const char *eol = strchr(p, '\n');
            const char *sp = p + n;
            for (const char *q = p + n; *q && q != eol; q++)
                if (*q == ' ') sp = q;
            return strtod(sp + 1, NULL);
        }
        p += n;
    }
    return NAN;
}

/* Unescapes a label value starting after the opening quote; returns the char after the
 * closing quote. */
const char *prom_label_value(const char *p, char *out, size_t cap)
{
    size_t n = 0;
    while (*p && *p != '"') {
        char c = *p++;
        if (c == '\\' && *p) {
            c = *p++;
            if (c == 'n') c = '\n';
        }
        if (n + 1 < cap) out[n++] = c;
    }
    out[n] = 0;
    return *p == '"' ? p + 1 : p;
}

/* Sums ringlm_queue_wait_seconds buckets over classes, per tenant. */
void prom_parse_queue_wait(const char *text, prom_hist_set *s)
{
    static const char pfx[] = "ringlm_queue_wait_seconds_bucket{";
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, pfx, sizeof pfx - 1) != 0) continue;
        const char *q = p + sizeof pfx - 1;
        char tenant[64] = "", le[64] = "", key[32], val[64];
        while (*q && *q != '}') {
            size_t k = strcspn(q, "=");
            snprintf(key, sizeof key, "%.*s", (int)k, q);
            q += k;
            if (strncmp(q, "=\"", 2) != 0) break;
            q = prom_label_value(q + 2, val, sizeof val);
            if (!strcmp(key, "tenant"))
                snprintf(tenant, sizeof tenant, "%s", val);
            else if (!strcmp(key, "le"))
                snprintf(le, sizeof le, "%s", val);
            if (*q == ',') q++;
        }
        if (*q != '}') continue;
        double v = strtod(q + 1, NULL);
        double lev = strcmp(le, "+Inf") == 0 ? INFINITY : strtod(le, NULL);
        prom_hist *h = NULL;
        for (int i = 0; i < s->n; i++)
            if (!strcmp(s->h[i].tenant, tenant)) h = &s->h[i];
        if (!h) {
            s->h = cli_realloc(s->h, sizeof *s->h * (size_t)(s->n + 1));
            h = &s->h[s->n++];
            memset(h, 0, sizeof *h);
            snprintf(h->tenant, sizeof h->tenant, "%s", tenant);
        }
        int j;
        for (j = 0; j < h->n && h->le[j] != lev; j++) {}
        if (j == h->n) {
            if (h->n == PROM_HIST_MAX_LE) continue;
            h->le[h->n] = lev;
            h->cum[h->n++] = 0;
        }
        h->cum[j] += v;
    }
}

/* Percentile (0..1) from cumulative buckets (after - before), linear inside a bucket, in
 * ms; NAN when empty. */
double prom_hist_percentile(const prom_hist *a, const prom_hist *b, double q)
{
    double le[PROM_HIST_MAX_LE] = {0}, cum[PROM_HIST_MAX_LE] = {0};
    int n = a->n;
    for (int i = 0; i < n; i++) {
        le[i] = a->le[i];
        cum[i] = a->cum[i];
        if (b)
            for (int j = 0; j < b->n; j++)
                if (b->le[j] == le[i]) cum[i] -= b->cum[j];
    }
    /* sort by le (they come sorted, but do not rely on it) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && le[j - 1] > le[j]; j--) {
            double t = le[j];
            le[j] = le[j - 1];
            le[j - 1] = t;
            t = cum[j];
            cum[j] = cum[j - 1];
            cum[j - 1] = t;
        }
    if (n == 0 || cum[n - 1] <= 0) return NAN;
    double target = q * cum[n - 1];
    double prev_le = 0, prev_cum = 0;
    for (int i = 0; i < n; i++) {
        if (cum[i] >= target) {
            if (isinf(le[i])) return prev_le * 1e3; /* beyond the last finite bound */
            double in = cum[i] - prev_cum;
            double f = in > 0 ? (target - prev_cum) / in : 1;
            return (prev_le + f * (le[i] - prev_le)) * 1e3;
        }
        prev_le = le[i];
        prev_cum = cum[i];
    }
    return prev_le * 1e3;
}
