/* SPDX-License-Identifier: MIT */
/*
 * formats/api_keys.c — the API keys file (format in gw_keys.h).
 */
#include "formats/api_keys.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *why, size_t len, int line, const char *msg, const char *arg)
{
    snprintf(why, len, "line %d: %s%s%s", line, msg, arg ? " " : "", arg ? arg : "");
    return -EINVAL;
}

int gw_keys_parse(const char *text, gw_keys *out, char *why, size_t why_len)
{
    gw_keys k = {0};
    size_t cap = 0;
    int line = 0, r = 0;
    const char *p = text;
    while (*p) {
        line++;
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char *l = strndup(p, n);
        if (!l) {
            r = -ENOMEM;
            break;
        }
        p += n + (e ? 1 : 0);
        char *hash = strchr(l, '#');
        if (hash) *hash = 0;
        char *save = NULL;
        char *f[4];
        int nf = 0;
        for (char *t = strtok_r(l, " \t\r", &save); t && nf < 4; t = strtok_r(NULL, " \t\r", &save))
            f[nf++] = t;
        if (nf == 0) {
            free(l);
            continue;
        }
        if (nf < 2)
            r = fail(why, why_len, line, "a key needs a tenant: KEY TENANT [CLASS]", NULL);
        else if (nf > 3)
            r = fail(why, why_len, line, "too many fields (KEY TENANT [CLASS])", NULL);
        else if (strlen(f[0]) < 8)
            r = fail(why, why_len, line, "key shorter than 8 bytes", NULL);
        else if (strlen(f[1]) >= GW_NAME_MAX)
            r = fail(why, why_len, line, "tenant name longer than 15 bytes:", f[1]);
        else if (nf == 3 && strlen(f[2]) >= GW_NAME_MAX)
            r = fail(why, why_len, line, "class name longer than 15 bytes:", f[2]);
        else if (gw_keys_find(&k, f[0], strlen(f[0])))
            r = fail(why, why_len, line, "key given twice", NULL);
        if (r) {
            free(l);
            break;
        }
        if (k.n == cap) {
            cap = cap ? cap * 2 : 16;
            gw_key *v = realloc(k.v, cap * sizeof *v);
            if (!v) {
                free(l);
                r = -ENOMEM;
                break;
            }
            k.v = v;
        }
        gw_key *e2 = &k.v[k.n];
        memset(e2, 0, sizeof *e2);
        e2->key = strdup(f[0]);
        if (!e2->key) {
            free(l);
            r = -ENOMEM;
            break;
        }
        snprintf(e2->tenant, sizeof e2->tenant, "%s", f[1]);
        if (nf == 3) snprintf(e2->class_name, sizeof e2->class_name, "%s", f[2]);
        k.n++;
        free(l);
    }
    if (!r && k.n == 0) r = fail(why, why_len, line, "no keys in the file", NULL);
    if (r) {
        gw_keys_free(&k);
        return r;
    }
    *out = k;
    return 0;
}

int gw_keys_load(const char *path, gw_keys *out, char *why, size_t why_len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        int e = errno;
        snprintf(why, why_len, "%s: %s", path, strerror(e));
        return -e;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *t = realloc(text, cap);
            if (!t) {
                free(text);
                fclose(f);
                return -ENOMEM;
            }
            text = t;
        }
        memcpy(text + len, chunk, n);
        len += n;
    }
    fclose(f);
    if (!text) {
        snprintf(why, why_len, "%s: empty file", path);
        return -EINVAL;
    }
    text[len] = 0;
    if (strlen(text) != len) {
        free(text);
        snprintf(why, why_len, "%s: a NUL byte in the file", path);
        return -EINVAL;
    }
    char inner[200];
    int r = gw_keys_parse(text, out, inner, sizeof inner);
    if (r) snprintf(why, why_len, "%s: %s", path, inner);
    free(text);
    return r;
}

const gw_key *gw_keys_find(const gw_keys *k, const char *key, size_t n)
{
    const gw_key *hit = NULL;
    for (size_t i = 0; i < k->n; i++) {
        const char *c = k->v[i].key;
        size_t m = strlen(c);
        unsigned char diff = (unsigned char)(m != n);
        for (size_t j = 0; j < m; j++) diff |= (unsigned char)(c[j] ^ (j < n ? key[j] : 0));
        if (!diff && !hit) hit = &k->v[i];
    }
    return hit;
}

void gw_keys_free(gw_keys *k)
{
    for (size_t i = 0; i < k->n; i++) free(k->v[i].key);
    free(k->v);
    *k = (gw_keys){0};
}
