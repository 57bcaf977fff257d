/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_agg.c — several daemons' vllm:* families as one server's (gw_agg.h).
 */
#include "gateway/gw_agg.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gw_text.h"

enum agg { AGG_SUM, AGG_GAUGE_SUM, AGG_KV_USE, AGG_CACHE_CONFIG, AGG_MAX };

typedef struct sample {
    char *key;        /* name{labels}, model_name rewritten */
    double v, w;      /* the aggregate; AGG_KV_USE: Σ use × blocks, and Σ blocks in w */
    double blocks[3]; /* AGG_CACHE_CONFIG: num_gpu/cpu/disk_blocks summed */
    bool any;
} sample;

typedef struct family {
    char *name, *help, *type;
    enum agg agg;
    sample *s;
    size_t n, cap;
} family;

typedef struct agg_state {
    family *f;
    size_t n, cap;
    bool oom;
} agg_state;

static const char *const block_labels[3] = {"num_gpu_blocks", "num_cpu_blocks", "num_disk_blocks"};

/* The value of label in key (name{a="x",...}) into out; false when absent. */
static bool label_value(const char *key, const char *label, char *out, size_t cap)
{
    size_t ln = strlen(label);
    const char *p = strchr(key, '{');
    while (p && *p && *p != '}') {
        p++; /* past '{' or ',' */
        if (!strncmp(p, label, ln) && p[ln] == '=' && p[ln + 1] == '"') {
            const char *v = p + ln + 2;
            size_t n = 0;
            while (v[n] && v[n] != '"') n += v[n] == '\\' && v[n + 1] ? 2 : 1;
            if (n >= cap) return false;
            memcpy(out, v, n);
            out[n] = 0;
            return true;
        }
        /* to the next label: past this value's closing quote */
        const char *q = strchr(p, '"');
        if (!q) return false;
        q++;
        while (*q && *q != '"') q += *q == '\\' && q[1] ? 2 : 1;
        if (!*q) return false;
        p = q + 1;
    }
    return false;
}

/* key with label's value replaced by value (escaped); malloc()ed, NULL when out of memory.
 * A key without the label comes back as a copy. */
static char *with_label(const char *key, const char *label, const char *value)
{
    size_t ln = strlen(label);
    const char *p = strchr(key, '{'), *at = NULL, *end = NULL;
    while (p && *p && *p != '}') {
        p++;
        const char *q = strchr(p, '"');
        if (!q) break;
        const char *v = q + 1, *e = v;
        while (*e && *e != '"') e += *e == '\\' && e[1] ? 2 : 1;
        if (!*e) break;
        if (!strncmp(p, label, ln) && p[ln] == '=' && q == p + ln + 1) {
            at = v;
            end = e;
            break;
        }
        p = e + 1;
    }
    if (!at) return strdup(key);
    gw_buf b = {0};
    gw_buf_add(&b, key, (size_t)(at - key));
    for (const char *c = value; *c; c++) {
        if (*c == '"' || *c == '\\')
            gw_buf_addf(&b, "\\%c", *c);
        else if (*c == '\n')
            gw_buf_adds(&b, "\\n");
        else
            gw_buf_add(&b, c, 1);
    }
    gw_buf_adds(&b, end);
    return b.p;
}

static family *family_get(agg_state *st, const char *name, size_t nlen)
{
    for (size_t i = 0; i < st->n; i++)
        if (strlen(st->f[i].name) == nlen && !strncmp(st->f[i].name, name, nlen)) return &st->f[i];
    if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 64;
        family *f = realloc(st->f, cap * sizeof *f);
        if (!f) return NULL;
        st->f = f;
        st->cap = cap;
    }
    family *f = &st->f[st->n];
    *f = (family){.name = strndup(name, nlen)};
    if (!f->name) return NULL;
    st->n++;
    if (!strcmp(f->name, "vllm:kv_cache_usage_perc"))
        f->agg = AGG_KV_USE;
    else if (!strcmp(f->name, "vllm:cache_config_info"))
        f->agg = AGG_CACHE_CONFIG;
    else if (nlen > 5 && !strcmp(f->name + nlen - 5, "_info"))
        f->agg = AGG_MAX;
    return f;
}

static sample *sample_get(family *f, const char *key)
{
    if (f->agg == AGG_CACHE_CONFIG && f->n) return &f->s[0]; /* one series */
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->s[i].key, key)) return &f->s[i];
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        sample *s = realloc(f->s, cap * sizeof *s);
        if (!s) return NULL;
        f->s = s;
        f->cap = cap;
    }
    sample *s = &f->s[f->n];
    *s = (sample){.key = strdup(key)};
    if (!s->key) return NULL;
    f->n++;
    return s;
}

/* Daemon i's device blocks: num_gpu_blocks of its vllm:cache_config_info (0: not said). */
static double gpu_blocks(const char *text)
{
    const char *p = strstr(text, "\nvllm:cache_config_info{");
    if (!p && !strncmp(text, "vllm:cache_config_info{", 23)) p = text - 1;
    if (!p) return 0;
    const char *nl = strchr(p + 1, '\n');
    char line[1024], v[64];
    size_t n = nl ? (size_t)(nl - p - 1) : strlen(p + 1);
    if (n >= sizeof line) return 0;
    memcpy(line, p + 1, n);
    line[n] = 0;
    return label_value(line, "num_gpu_blocks", v, sizeof v) ? strtod(v, NULL) : 0;
}

static void add_text(agg_state *st, const char *text, bool up, const char *model)
{
    double blocks = gpu_blocks(text);
    family *cur = NULL;
    for (const char *p = text; *p && !st->oom;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        char *line = strndup(p, n);
        p += n + (nl ? 1 : 0);
        if (!line) {
            st->oom = true;
            break;
        }
        if (!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7)) {
            const char *name = line + 7, *sp = strchr(name, ' ');
            size_t nn = sp ? (size_t)(sp - name) : strlen(name);
            cur = family_get(st, name, nn);
            if (!cur) {
                st->oom = true;
            } else {
                char **slot = line[2] == 'H' ? &cur->help : &cur->type;
                if (!*slot && !(*slot = strdup(sp ? sp + 1 : ""))) st->oom = true;
                if (line[2] == 'T' && *slot && cur->agg == AGG_SUM && !strcmp(*slot, "gauge"))
                    cur->agg = AGG_GAUGE_SUM;
            }
            free(line);
            continue;
        }
        /* a sample: key, a space, the value (no timestamps in ringlmd's text) */
        char *sp = strrchr(line, ' ');
        if (line[0] == '#' || !sp || !cur) {
            free(line);
            continue;
        }
        *sp = 0;
        double v = strtod(sp + 1, NULL);
        bool counts = up || cur->agg == AGG_SUM; /* a lost daemon's counters stay */
        char *key = with_label(line, "model_name", model);
        sample *s = key && counts ? sample_get(cur, key) : NULL;
        if (!key || (counts && !s)) st->oom = true;
        if (s) {
            switch (cur->agg) {
            case AGG_SUM:
            case AGG_GAUGE_SUM: s->v += v; break;
            case AGG_KV_USE:
                s->v += v * (blocks > 0 ? blocks : 1);
                s->w += blocks > 0 ? blocks : 1;
                break;
            case AGG_CACHE_CONFIG:
                for (int b = 0; b < 3; b++) {
                    char val[64];
                    if (label_value(line, block_labels[b], val, sizeof val))
                        s->blocks[b] += strtod(val, NULL);
                }
                s->v = 1;
                break;
            case AGG_MAX:
                if (!s->any || v > s->v) s->v = v;
                break;
            }
            s->any = true;
        }
        free(key);
        free(line);
    }
}

static void put_value(gw_buf *b, double v)
{
    if (isnan(v)) {
        gw_buf_adds(b, "NaN");
        return;
    }
    if (isinf(v)) {
        gw_buf_adds(b, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    char t[40];
    for (int prec = 15; prec <= 17; prec++) { /* the shortest that reads back the same */
        snprintf(t, sizeof t, "%.*g", prec, v);
        if (strtod(t, NULL) == v) break;
    }
    gw_buf_adds(b, t);
}

char *gw_agg_vllm(const char *const *texts, const bool *up, int n, const char *model)
{
    agg_state st = {0};
    bool any_up = false;
    for (int i = 0; i < n; i++) any_up |= up[i] && texts[i];
    if (!any_up) return strdup("");
    for (int i = 0; i < n && !st.oom; i++)
        if (texts[i]) add_text(&st, texts[i], up[i], model);
    gw_buf b = {0};
    for (size_t i = 0; i < st.n && !st.oom; i++) {
        family *f = &st.f[i];
        if (!f->n) continue; /* only a lost daemon's gauges */
        if (f->help) gw_buf_addf(&b, "# HELP %s %s\n", f->name, f->help);
        if (f->type) gw_buf_addf(&b, "# TYPE %s %s\n", f->name, f->type);
        for (size_t k = 0; k < f->n; k++) {
            sample *s = &f->s[k];
            char *key = s->key;
            if (f->agg == AGG_CACHE_CONFIG) {
                for (int j = 0; j < 3 && key; j++) {
                    char val[32];
                    snprintf(val, sizeof val, "%.0f", s->blocks[j]);
                    char *nk = with_label(key, block_labels[j], val);
                    if (key != s->key) free(key);
                    key = nk;
                }
                if (!key) {
                    st.oom = true;
                    break;
                }
            }
            gw_buf_adds(&b, key);
            gw_buf_adds(&b, " ");
            put_value(&b, f->agg == AGG_KV_USE ? (s->w > 0 ? s->v / s->w : 0) : s->v);
            gw_buf_adds(&b, "\n");
            if (key != s->key) free(key);
        }
    }
    for (size_t i = 0; i < st.n; i++) {
        for (size_t k = 0; k < st.f[i].n; k++) free(st.f[i].s[k].key);
        free(st.f[i].s);
        free(st.f[i].name);
        free(st.f[i].help);
        free(st.f[i].type);
    }
    free(st.f);
    if (st.oom) {
        gw_buf_free(&b);
        return NULL;
    }
    return b.p ? b.p : strdup("");
}
