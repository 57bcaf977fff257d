/* SPDX-License-Identifier: MIT */
/*
 * model/gguf_write.c — the GGUF writer (see gguf_write.h). The metadata is serialised as
 * it is added into one growing buffer; tensors keep their data until gw_write.
 */
#include "model/gguf_write.h"
#include "model/gguf.h"
#include "common/errdetail.h"

#include <errno.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- errors ------------------------------------------------------------------------ */

ERRDETAIL_DEFINE(gw_err);

const char *gw_errmsg(void)
{
    return gw_err.msg;
}

/* A function: gguf_vocab.c reports through it too. */
int gw_seterr(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    errdetail_vset(&gw_err, err, fmt, ap);
    va_end(ap);
    return err;
}

typedef struct gw_tensor_rec {
    char *name;
    int n_dims;
    uint64_t ne[4];
    int type;
    void *data;
    size_t bytes;
    gw_fill_fn fill; /* data NULL: written by fill at gw_write */
    void *fill_ctx;
} gw_tensor_rec;

struct gguf_writer {
    unsigned char *kv; /* serialised key/value pairs */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    gw_tensor_rec *t;
    size_t n_t, cap_t;
    bool oom;
};

gguf_writer *gw_new(void)
{
    return calloc(1, sizeof(gguf_writer));
}

void gw_free(gguf_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    free(w->kv);
    free(w);
}

static void put(gguf_writer *w, const void *p, size_t n)
{
    if (w->oom) return;
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 4096;
        while (cap < w->kv_len + n) cap *= 2;
        unsigned char *b = realloc(w->kv, cap);
        if (!b) {
            w->oom = true;
            return;
        }
        w->kv = b;
        w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
}

/* Little-endian integers (x86 is; written byte by byte to say so). */
static void put_le(gguf_writer *w, uint64_t v, int n)
{
    unsigned char b[8];
    for (int i = 0; i < n; i++) b[i] = (unsigned char)(v >> (8 * i));
    put(w, b, (size_t)n);
}

static void put_str(gguf_writer *w, const char *s, size_t len)
{
    put_le(w, len, 8);
    put(w, s, len);
}

static void key(gguf_writer *w, const char *k, uint32_t type)
{
    put_str(w, k, strlen(k));
    put_le(w, type, 4);
    w->n_kv++;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

void gw_kv_copy(gguf_writer *w, const gguf_kv *kv)
{
    if (kv->type == GGUF_V_STRING) {
        key(w, kv->key, GGUF_V_STRING);
        put_str(w, (const char *)kv->value, (size_t)kv->count);
        return;
    }
    if (kv->type != GGUF_V_ARRAY) {
        const size_t n = gguf_vtype_bytes(kv->type);
        if (!n) return;
        key(w, kv->key, kv->type);
        put(w, kv->value, n); /* little-endian in the file and here */
        return;
    }
    if (kv->elem_type == GGUF_V_STRING) {
        key(w, kv->key, GGUF_V_ARRAY);
        put_le(w, GGUF_V_STRING, 4);
        put_le(w, kv->count, 8);
        const void *p = kv->value;
        for (uint64_t i = 0; i < kv->count; i++) {
            const char *s;
            size_t len;
            gguf_str_next(&p, &s, &len);
            put_str(w, s, len);
        }
        return;
    }
    const size_t n = gguf_vtype_bytes(kv->elem_type);
    if (!n) return;
    key(w, kv->key, GGUF_V_ARRAY);
    put_le(w, kv->elem_type, 4);
    put_le(w, kv->count, 8);
    put(w, kv->value, n * (size_t)kv->count);
}

void gw_str(gguf_writer *w, const char *k, const char *value)
{
    key(w, k, GGUF_V_STRING);
    put_str(w, value, strlen(value));
}

void gw_u32(gguf_writer *w, const char *k, uint32_t value)
{
    key(w, k, GGUF_V_U32);
    put_le(w, value, 4);
}

void gw_i32(gguf_writer *w, const char *k, int32_t value)
{
    key(w, k, GGUF_V_I32);
    put_le(w, (uint32_t)value, 4);
}

void gw_f32(gguf_writer *w, const char *k, float value)
{
    key(w, k, GGUF_V_F32);
    put_le(w, f32_bits(value), 4);
}

void gw_bool(gguf_writer *w, const char *k, bool value)
{
    key(w, k, GGUF_V_BOOL);
    put_le(w, value ? 1 : 0, 1);
}

void gw_str_arr(gguf_writer *w, const char *k, const char *const *s, const size_t *len, size_t n)
{
    key(w, k, GGUF_V_ARRAY);
    put_le(w, GGUF_V_STRING, 4);
    put_le(w, n, 8);
    for (size_t i = 0; i < n; i++) put_str(w, s[i], len[i]);
}

void gw_f32_arr(gguf_writer *w, const char *k, const float *v, size_t n)
{
    key(w, k, GGUF_V_ARRAY);
    put_le(w, GGUF_V_F32, 4);
    put_le(w, n, 8);
    for (size_t i = 0; i < n; i++) put_le(w, f32_bits(v[i]), 4);
}

void gw_i32_arr(gguf_writer *w, const char *k, const int32_t *v, size_t n)
{
    key(w, k, GGUF_V_ARRAY);
    put_le(w, GGUF_V_I32, 4);
    put_le(w, n, 8);
    for (size_t i = 0; i < n; i++) put_le(w, (uint32_t)v[i], 4);
}

static gw_tensor_rec *add_rec(gguf_writer *w, const char *name, int n_dims, const uint64_t *ne,
                              int type, size_t bytes)
{
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 64;
        gw_tensor_rec *t = realloc(w->t, cap * sizeof *t);
        if (!t) {
            w->oom = true;
            return NULL;
        }
        w->t = t;
        w->cap_t = cap;
    }
    gw_tensor_rec *r = &w->t[w->n_t];
    *r = (gw_tensor_rec){.name = strdup(name), .n_dims = n_dims, .type = type, .bytes = bytes};
    for (int d = 0; d < 4; d++) r->ne[d] = d < n_dims ? ne[d] : 1;
    w->n_t++;
    if (!r->name) w->oom = true;
    return r;
}

void gw_tensor(gguf_writer *w, const char *name, int n_dims, const uint64_t *ne, int type,
               void *data, size_t bytes)
{
    gw_tensor_rec *r = add_rec(w, name, n_dims, ne, type, bytes);
    if (!r) {
        free(data);
        return;
    }
    r->data = data;
    if (!data) w->oom = true;
}

void gw_tensor_fill(gguf_writer *w, const char *name, int n_dims, const uint64_t *ne, int type,
                    size_t bytes, gw_fill_fn fill, void *ctx)
{
    gw_tensor_rec *r = add_rec(w, name, n_dims, ne, type, bytes);
    if (!r) return;
    r->fill = fill;
    r->fill_ctx = ctx;
}

static size_t pad_to(size_t n)
{
    return (n + GGUF_DEFAULT_ALIGNMENT - 1) / GGUF_DEFAULT_ALIGNMENT * GGUF_DEFAULT_ALIGNMENT;
}

int gw_write(gguf_writer *w, const char *path)
{
    if (w->oom) return gw_seterr(-ENOMEM, "%s: out of memory while building the GGUF file", path);
    /* The header and tensor infos go into the same buffer after the key/values. */
    size_t kv_end = w->kv_len;
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        gw_tensor_rec *r = &w->t[i];
        put_str(w, r->name, strlen(r->name));
        put_le(w, (uint64_t)r->n_dims, 4);
        for (int d = 0; d < r->n_dims; d++) put_le(w, r->ne[d], 8);
        put_le(w, (uint64_t)r->type, 4);
        put_le(w, offset, 8);
        offset = pad_to(offset + r->bytes);
    }
    if (w->oom) return gw_seterr(-ENOMEM, "%s: out of memory while building the GGUF file", path);
    FILE *f = fopen(path, "wb");
    if (!f) return gw_seterr(-errno, "%s: %s", path, strerror(errno));
    unsigned char hdr[24];
    const uint64_t fields[4] = {GGUF_MAGIC, 3, w->n_t, w->n_kv};
    const int widths[4] = {4, 4, 8, 8};
    size_t h = 0;
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < widths[i]; b++) hdr[h++] = (unsigned char)(fields[i] >> (8 * b));
    static const unsigned char zeros[GGUF_DEFAULT_ALIGNMENT];
    bool ok = fwrite(hdr, 1, h, f) == h && fwrite(w->kv, 1, w->kv_len, f) == w->kv_len;
    size_t pos = h + w->kv_len;
    ok = ok && fwrite(zeros, 1, pad_to(pos) - pos, f) == pad_to(pos) - pos;
    int err = 0;
    for (size_t i = 0; ok && !err && i < w->n_t; i++) {
        const gw_tensor_rec *r = &w->t[i];
        size_t padded = pad_to(r->bytes);
        void *data = r->data;
        if (r->fill) {
            if (!(data = malloc(r->bytes ? r->bytes : 1))) {
                err = gw_seterr(-ENOMEM, "%s: tensor %s: out of memory (%zu bytes)", path, r->name,
                                r->bytes);
                break;
            }
            if ((err = r->fill(r->fill_ctx, data, r->bytes))) {
                free(data);
                break;
            }
        }
        ok = fwrite(data, 1, r->bytes, f) == r->bytes &&
             fwrite(zeros, 1, padded - r->bytes, f) == padded - r->bytes;
        if (r->fill) free(data);
    }
    w->kv_len = kv_end; /* the infos are rebuilt by another gw_write */
    if (!ok && !err) err = gw_seterr(-EIO, "%s: write: %s", path, strerror(errno));
    if (fclose(f) != 0 && !err) err = gw_seterr(-EIO, "%s: close: %s", path, strerror(errno));
    if (err) unlink(path);
    return err;
}

void gw_vocab_add(gguf_writer *w, const gw_vocab *v)
{
    gw_str(w, "tokenizer.ggml.model", v->model);
    if (v->pre) gw_str(w, "tokenizer.ggml.pre", v->pre);
    gw_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, v->lens, v->n);
    gw_f32_arr(w, "tokenizer.ggml.scores", v->scores, v->n);
    gw_i32_arr(w, "tokenizer.ggml.token_type", v->types, v->n);
    if (v->n_merges) {
        size_t *ml = malloc(v->n_merges * sizeof *ml);
        if (!ml) {
            w->oom = true;
            return;
        }
        for (size_t i = 0; i < v->n_merges; i++) ml[i] = strlen(v->merges[i]);
        gw_str_arr(w, "tokenizer.ggml.merges", (const char *const *)v->merges, ml, v->n_merges);
        free(ml);
    }
    /* llama.cpp's keys, "seperator" as it spells it; a CLS id has none (gguf-py's writer
     * skips it too) */
    static const struct {
        const char *key;
        size_t off;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", offsetof(gw_vocab, bos)},
        {"tokenizer.ggml.eos_token_id", offsetof(gw_vocab, eos)},
        {"tokenizer.ggml.eot_token_id", offsetof(gw_vocab, eot)},
        {"tokenizer.ggml.eom_token_id", offsetof(gw_vocab, eom)},
        {"tokenizer.ggml.unknown_token_id", offsetof(gw_vocab, unk)},
        {"tokenizer.ggml.seperator_token_id", offsetof(gw_vocab, sep)},
        {"tokenizer.ggml.padding_token_id", offsetof(gw_vocab, pad)},
        {"tokenizer.ggml.mask_token_id", offsetof(gw_vocab, mask)},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        int32_t id;
        memcpy(&id, (const char *)v + ids[i].off, sizeof id);
        if (id >= 0) gw_u32(w, ids[i].key, (uint32_t)id);
    }
    if (v->add_bos >= 0) gw_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
    if (v->add_eos >= 0) gw_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos);
    if (v->add_sep >= 0) gw_bool(w, "tokenizer.ggml.add_sep_token", v->add_sep);
    if (v->no_space_prefix) gw_bool(w, "tokenizer.ggml.add_space_prefix", false);
    if (v->chat_template) gw_str(w, "tokenizer.chat_template", v->chat_template);
}
