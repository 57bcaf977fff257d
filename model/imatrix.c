/* SPDX-License-Identifier: MIT */
/*
 * model/imatrix.c — llama-imatrix's files, GGUF or legacy (see imatrix.h), normalized as
 * llama-quantize normalizes them before its quantizers read them.
 */
#include "model/imatrix.h"
#include "common/errdetail.h"
#include "model/gguf.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ERRDETAIL_DEFINE(imx_err);

const char *imx_errmsg(void)
{
    return imx_err.msg;
}

#define SETERR(rc, ...) errdetail_set(&imx_err, (rc), __VA_ARGS__)

static int by_name(const void *a, const void *b)
{
    return strcmp(((const imx_entry *)a)->name, ((const imx_entry *)b)->name);
}

void imx_free(imx *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) {
        free(m->e[i].name);
        free(m->e[i].weights);
    }
    free(m->e);
    free(m);
}

const imx_entry *imx_find(const imx *m, const char *name)
{
    imx_entry key = {.name = (char *)name};
    return m->n ? bsearch(&key, m->e, m->n, sizeof key, by_name) : NULL;
}

static imx_entry *add(imx *m, size_t *cap, const char *name, size_t name_len, size_t n)
{
    if (m->n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        imx_entry *e = realloc(m->e, c * sizeof *e);
        if (!e) return NULL;
        m->e = e;
        *cap = c;
    }
    imx_entry *e = &m->e[m->n];
    e->name = strndup(name, name_len);
    e->weights = malloc((n ? n : 1) * sizeof *e->weights);
    e->n = n;
    if (!e->name || !e->weights) {
        free(e->name);
        free(e->weights);
        return NULL;
    }
    m->n++;
    return e;
}

static int check_finite(const char *path, const imx_entry *e)
{
    for (size_t i = 0; i < e->n; i++)
        if (!isfinite(e->weights[i]))
            return SETERR(-EINVAL, "%s: entry %s: value %zu is not finite", path, e->name, i);
    return 0;
}

/* ---- GGUF ----------------------------------------------------------------------------- */

static int load_gguf(const char *path, const gguf_file *g, imx *m)
{
    static const char *const keys[] = {"imatrix.datasets", "imatrix.chunk_count",
                                       "imatrix.chunk_size"};
    for (size_t k = 0; k < 3; k++)
        if (!gguf_find(g, keys[k]))
            return SETERR(-EINVAL,
                          "%s: %s absent: llama-quantize refuses an imatrix without its "
                          "metadata",
                          path, keys[k]);
    size_t cap = 0;
    const int nt = gguf_n_tensors(g);
    for (int i = 0; i < nt; i++) {
        const gguf_tensor *s = gguf_tensor_at(g, i);
        const size_t len = strlen(s->name);
        const char *suffix = len > 8 ? s->name + len - 8 : "";
        if (strcmp(suffix, ".in_sum2") != 0) {
            if (len > 7 && strcmp(s->name + len - 7, ".counts") == 0) {
                char want[512];
                snprintf(want, sizeof want, "%.*s.in_sum2", (int)(len - 7), s->name);
                if (!gguf_tensor_find(g, want))
                    return SETERR(-EINVAL, "%s: tensor %s: no %s beside it", path, s->name, want);
            }
            continue;
        }
        char cname[512];
        snprintf(cname, sizeof cname, "%.*s.counts", (int)(len - 8), s->name);
        const gguf_tensor *c = gguf_tensor_find(g, cname);
        if (!c) return SETERR(-EINVAL, "%s: tensor %s: no %s beside it", path, s->name, cname);
        if (s->type != GGUF_T_F32 || c->type != GGUF_T_F32)
            return SETERR(-EINVAL, "%s: tensors %s and %s: F32 expected, found %s and %s", path,
                          s->name, cname, gguf_type_name(s->type), gguf_type_name(c->type));
        const size_t nval = (size_t)(s->bytes / 4), ncounts = (size_t)(c->bytes / 4);
        if (ncounts == 0 || nval == 0 || nval % ncounts)
            return SETERR(-EINVAL, "%s: tensor %s: %zu values for %zu counts: not whole experts",
                          path, s->name, nval, ncounts);
        imx_entry *e = add(m, &cap, s->name, len - 8, nval);
        if (!e) return SETERR(-ENOMEM, "out of memory");
        const float *sums = s->data, *counts = c->data;
        const size_t ne0 = nval / ncounts;
        for (size_t j = 0; j < ncounts; j++) {
            float cnt;
            memcpy(&cnt, &counts[j], 4);
            cnt = (float)lroundf(cnt); /* llama.cpp keeps counts as integers */
            for (size_t i = 0; i < ne0; i++) {
                float v;
                memcpy(&v, &sums[j * ne0 + i], 4);
                e->weights[j * ne0 + i] = cnt > 0.0f ? v / cnt : 1.0f;
            }
        }
        int err = check_finite(path, e);
        if (err) return err;
    }
    if (m->n == 0) return SETERR(-EINVAL, "%s: no in_sum2 tensors: not an imatrix", path);
    return 0;
}

/* ---- legacy .dat ---------------------------------------------------------------------- */

static int rd_i32(const unsigned char **p, const unsigned char *end, int32_t *v)
{
    if (end - *p < 4) return -1;
    memcpy(v, *p, 4);
    *p += 4;
    return 0;
}

static int load_legacy(const char *path, const unsigned char *buf, size_t len, imx *m)
{
    const unsigned char *p = buf, *end = buf + len;
    int32_t n_entries;
    size_t cap = 0;
    if (rd_i32(&p, end, &n_entries) || n_entries < 1)
        return SETERR(-EINVAL, "%s: neither GGUF nor a legacy imatrix (no entry count)", path);
    for (int32_t i = 0; i < n_entries; i++) {
        int32_t name_len, ncall, nval;
        if (rd_i32(&p, end, &name_len) || name_len < 1 || name_len > 511 || end - p < name_len)
            return SETERR(-EINVAL, "%s: entry %d of %d: truncated or bad name length at byte %td",
                          path, i, n_entries, p - buf);
        const char *name = (const char *)p;
        p += name_len;
        if (rd_i32(&p, end, &ncall) || rd_i32(&p, end, &nval) || nval < 1 ||
            (size_t)(end - p) / 4 < (size_t)nval)
            return SETERR(-EINVAL, "%s: entry %.*s: truncated at byte %td", path, (int)name_len,
                          name, p - buf);
        imx_entry *e = add(m, &cap, name, (size_t)name_len, (size_t)nval);
        if (!e) return SETERR(-ENOMEM, "out of memory");
        for (int32_t k = 0; k < nval; k++) {
            float v;
            memcpy(&v, p + 4 * (size_t)k, 4);
            e->weights[k] = ncall > 0 ? v / (float)ncall : v;
        }
        p += 4 * (size_t)nval;
        int err = check_finite(path, e);
        if (err) return err;
    }
    return 0; /* the chunk count and dataset name that may follow are not needed */
}

int imx_load(const char *path, imx **out)
{
    *out = NULL;
    imx *m = calloc(1, sizeof *m);
    if (!m) return SETERR(-ENOMEM, "out of memory");
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        free(m);
        return SETERR(-e, "%s: %s", path, strerror(e));
    }
    unsigned char magic[4] = {0};
    const size_t got = fread(magic, 1, 4, f);
    int err = 0;
    if (got == 4 && !memcmp(magic, "GGUF", 4)) {
        fclose(f);
        gguf_file *g;
        if ((err = gguf_open(path, &g))) {
            err = SETERR(err, "%s: %s", path, gguf_errmsg());
        } else {
            err = load_gguf(path, g, m);
            gguf_close(g);
        }
    } else {
        unsigned char *buf = NULL;
        long size = -1;
        if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
        if (size < 0 || size > (1L << 31) || fseek(f, 0, SEEK_SET) != 0 ||
            !(buf = malloc((size_t)size + 1)) || fread(buf, 1, (size_t)size, f) != (size_t)size)
            err = SETERR(size < 0 || size > (1L << 31) ? -EINVAL : -EIO, "%s: unreadable", path);
        else
            err = load_legacy(path, buf, (size_t)size, m);
        free(buf);
        fclose(f);
    }
    if (err) {
        imx_free(m);
        return err;
    }
    qsort(m->e, m->n, sizeof *m->e, by_name);
    for (size_t i = 1; i < m->n; i++)
        if (!strcmp(m->e[i].name, m->e[i - 1].name)) {
            err = SETERR(-EINVAL, "%s: entry %s appears twice", path, m->e[i].name);
            imx_free(m);
            return err;
        }
    *out = m;
    return 0;
}
