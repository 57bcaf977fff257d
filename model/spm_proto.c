/* SPDX-License-Identifier: MIT */
/*
 * model/spm_proto.c — a SentencePiece tokenizer.model read as untrusted input (see
 * spm_proto.h). The protobuf wire format: each field is a varint key (field number << 3 |
 * wire type) and a value — a varint (0), 8 bytes (1), a varint length and that many bytes
 * (2: strings and nested messages) or 4 bytes (5: floats). A nested message is read by a
 * reader bounded to its own bytes, so no length can reach past the message that holds it.
 */
#include "model/spm_proto.h"
#include "common/errdetail.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

ERRDETAIL_DEFINE(spm_err);

const char *spm_errmsg(void)
{
    return spm_err.msg;
}

#define SETERR(rc, ...) errdetail_set(&spm_err, (rc), __VA_ARGS__)

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

/* A reader over [p, end) of the file base (offsets in errors are from base). */
typedef struct rd {
    const uint8_t *p, *end, *base;
    const char *name; /* the file */
    const char *what; /* the message being read: "ModelProto", "pieces[12]", ... */
} rd;

static size_t off(const rd *r)
{
    return (size_t)(r->p - r->base);
}

static int bad(const rd *r, const char *why)
{
    return SETERR(-EINVAL, "%s: %s, at byte %zu: %s", r->name, r->what, off(r), why);
}

static int varint(rd *r, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (r->p == r->end) return bad(r, "truncated (a varint runs past the end)");
        uint8_t b = *r->p++;
        if (shift == 63 && b > 1) return bad(r, "a varint longer than 64 bits");
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return bad(r, "a varint longer than 10 bytes");
}

/* The next field's number and wire type; *done at the end of the message. */
static int key(rd *r, uint32_t *field, int *wt, bool *done)
{
    *done = r->p == r->end;
    if (*done) return 0;
    uint64_t k;
    int err = varint(r, &k);
    if (err) return err;
    *field = (uint32_t)(k >> 3);
    *wt = (int)(k & 7);
    if (*field == 0 || k >> 32) return bad(r, "field number 0 or beyond 2^29");
    if (*wt != WT_VARINT && *wt != WT_I64 && *wt != WT_LEN && *wt != WT_I32)
        return bad(r, "wire type 3, 4, 6 or 7 (groups or none): not a ModelProto");
    return 0;
}

/* A length-delimited value as a reader of its own bytes. */
static int sub(rd *r, rd *out, const char *what)
{
    uint64_t n;
    int err = varint(r, &n);
    if (err) return err;
    if (n > (uint64_t)(r->end - r->p)) {
        char why[96];
        snprintf(why, sizeof why, "truncated (a length of %llu bytes, %zu left)",
                 (unsigned long long)n, (size_t)(r->end - r->p));
        return bad(r, why);
    }
    *out = (rd){.p = r->p, .end = r->p + n, .base = r->base, .name = r->name, .what = what};
    r->p += n;
    return 0;
}

static int skip(rd *r, int wt)
{
    uint64_t v;
    rd s;
    switch (wt) {
    case WT_VARINT: return varint(r, &v);
    case WT_LEN: return sub(r, &s, r->what);
    default: {
        size_t n = wt == WT_I64 ? 8 : 4;
        if ((size_t)(r->end - r->p) < n) return bad(r, "truncated (a fixed-size value)");
        r->p += n;
        return 0;
    }
    }
}

static int want_wt(const rd *r, uint32_t field, int wt, int expect)
{
    if (wt == expect) return 0;
    char why[96];
    snprintf(why, sizeof why, "field %u has wire type %d, sentencepiece_model.proto says %d", field,
             wt, expect);
    return bad(r, why);
}

static int f32(rd *r, float *out)
{
    if (r->end - r->p < 4) return bad(r, "truncated (a float)");
    uint32_t u = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 |
                 (uint32_t)r->p[3] << 24;
    memcpy(out, &u, 4);
    r->p += 4;
    return 0;
}

/* ---- the three messages ------------------------------------------------------------------ */

static int piece(spm_model *m, rd *r)
{
    const size_t i = m->n_pieces;
    const uint8_t *text = NULL;
    size_t len = 0;
    float score = 0.0f;
    int32_t type = SPM_NORMAL;
    uint32_t field;
    int wt, err;
    bool done;
    while (!(err = key(r, &field, &wt, &done)) && !done) {
        if (field == 1) {
            rd s;
            if ((err = want_wt(r, field, wt, WT_LEN)) || (err = sub(r, &s, r->what))) return err;
            text = s.p;
            len = (size_t)(s.end - s.p);
        } else if (field == 2) {
            if ((err = want_wt(r, field, wt, WT_I32)) || (err = f32(r, &score))) return err;
        } else if (field == 3) {
            uint64_t v;
            if ((err = want_wt(r, field, wt, WT_VARINT)) || (err = varint(r, &v))) return err;
            if (v < SPM_NORMAL || v > SPM_BYTE) return bad(r, "type is not 1..6");
            type = (int32_t)v;
        } else if ((err = skip(r, wt))) {
            return err;
        }
    }
    if (err) return err;
    if (!text || len == 0) return bad(r, "an empty piece");
    if (len > SPM_MAX_PIECE_BYTES) return bad(r, "a piece longer than 1024 bytes");
    if (memchr(text, 0, len)) return bad(r, "a piece holds a NUL byte");
    if (!(m->pieces[i] = malloc(len + 1))) return SETERR(-ENOMEM, "out of memory");
    memcpy(m->pieces[i], text, len);
    m->pieces[i][len] = '\0';
    m->lens[i] = len;
    m->scores[i] = score;
    m->types[i] = type;
    m->n_pieces++;
    return 0;
}

static int trainer(spm_model *m, rd *r)
{
    uint32_t field;
    int wt, err;
    bool done;
    while (!(err = key(r, &field, &wt, &done)) && !done) {
        const bool known = field == 3 || field == 24 || field == 35 || (field >= 40 && field <= 43);
        if (!known) {
            if ((err = skip(r, wt))) return err;
            continue;
        }
        uint64_t v;
        if ((err = want_wt(r, field, wt, WT_VARINT)) || (err = varint(r, &v))) return err;
        /* int32 fields: negative values are sign-extended to 64 bits on the wire */
        const int32_t i32 = (int32_t)(uint32_t)v;
        switch (field) {
        case 3: m->model_type = i32; break;
        case 24: m->treat_whitespace_as_suffix = v != 0; break;
        case 35: m->byte_fallback = v != 0; break;
        case 40: m->unk_id = i32; break;
        case 41: m->bos_id = i32; break;
        case 42: m->eos_id = i32; break;
        default: m->pad_id = i32; break;
        }
    }
    return err;
}

static int normalizer(spm_model *m, rd *r)
{
    uint32_t field;
    int wt, err;
    bool done;
    while (!(err = key(r, &field, &wt, &done)) && !done) {
        if (field == 1 || field == 2) {
            rd s;
            if ((err = want_wt(r, field, wt, WT_LEN)) || (err = sub(r, &s, r->what))) return err;
            size_t n = (size_t)(s.end - s.p);
            if (field == 2) {
                m->has_charsmap = n > 0;
                continue;
            }
            if (n >= sizeof m->normalizer || memchr(s.p, 0, n))
                return bad(r, "name: longer than 63 bytes or holds a NUL");
            memcpy(m->normalizer, s.p, n);
            m->normalizer[n] = '\0';
        } else if (field >= 3 && field <= 5) {
            uint64_t v;
            if ((err = want_wt(r, field, wt, WT_VARINT)) || (err = varint(r, &v))) return err;
            bool *b = field == 3   ? &m->add_dummy_prefix
                      : field == 4 ? &m->remove_extra_whitespaces
                                   : &m->escape_whitespaces;
            *b = v != 0;
        } else if ((err = skip(r, wt))) {
            return err;
        }
    }
    return err;
}

static int grow(spm_model *m, size_t *cap, const char *name)
{
    if (m->n_pieces < *cap) return 0;
    if (*cap >= SPM_MAX_PIECES)
        return SETERR(-EINVAL, "%s: more than %d pieces", name, SPM_MAX_PIECES);
    size_t n = *cap ? *cap * 2 : 1024;
    char **p = realloc(m->pieces, n * sizeof *p);
    if (p) m->pieces = p;
    size_t *l = realloc(m->lens, n * sizeof *l);
    if (l) m->lens = l;
    float *s = realloc(m->scores, n * sizeof *s);
    if (s) m->scores = s;
    int32_t *t = realloc(m->types, n * sizeof *t);
    if (t) m->types = t;
    if (!p || !l || !s || !t) return SETERR(-ENOMEM, "out of memory");
    *cap = n;
    return 0;
}

int spm_parse(const void *buf, size_t len, const char *name, spm_model **out)
{
    *out = NULL;
    spm_model *m = calloc(1, sizeof *m);
    if (!m) return SETERR(-ENOMEM, "out of memory");
    *m = (spm_model){.model_type = SPM_UNIGRAM,
                     .unk_id = 0,
                     .bos_id = 1,
                     .eos_id = 2,
                     .pad_id = -1,
                     .add_dummy_prefix = true,
                     .remove_extra_whitespaces = true,
                     .escape_whitespaces = true};
    rd r = {.p = buf,
            .end = (const uint8_t *)buf + len,
            .base = buf,
            .name = name,
            .what = "ModelProto"};
    size_t cap = 0;
    uint32_t field;
    int wt, err;
    bool done;
    char what[48];
    while (!(err = key(&r, &field, &wt, &done)) && !done) {
        rd s;
        if (field < 1 || field > 3) {
            if ((err = skip(&r, wt))) break;
            continue;
        }
        if ((err = want_wt(&r, field, wt, WT_LEN))) break;
        if (field == 1) {
            snprintf(what, sizeof what, "pieces[%zu]", m->n_pieces);
            if ((err = sub(&r, &s, what)) || (err = grow(m, &cap, name)) || (err = piece(m, &s)))
                break;
        } else if (field == 2) {
            if ((err = sub(&r, &s, "trainer_spec")) || (err = trainer(m, &s))) break;
        } else if ((err = sub(&r, &s, "normalizer_spec")) || (err = normalizer(m, &s))) {
            break;
        }
    }
    if (!err && m->n_pieces == 0)
        err = SETERR(-EINVAL, "%s: no pieces: not a SentencePiece model", name);
    const int32_t ids[4] = {m->unk_id, m->bos_id, m->eos_id, m->pad_id};
    static const char *const id_name[4] = {"unk_id", "bos_id", "eos_id", "pad_id"};
    for (int i = 0; !err && i < 4; i++)
        if (ids[i] < -1 || ids[i] >= (int64_t)m->n_pieces)
            err = SETERR(-EINVAL, "%s: trainer_spec.%s %d: outside the %zu pieces", name,
                         id_name[i], ids[i], m->n_pieces);
    if (err) {
        spm_free(m);
        return err;
    }
    *out = m;
    return 0;
}

int spm_load(const char *path, spm_model **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return SETERR(-errno, "%s: %s", path, strerror(errno));
    struct stat st;
    int err = 0;
    unsigned char *buf = NULL;
    if (fstat(fd, &st) != 0) {
        err = SETERR(-errno, "%s: %s", path, strerror(errno));
        goto out;
    }
    /* real models are a few MB (Gemma's 262,144 pieces: 4.2 MB) */
    if (st.st_size > (off_t)1 << 30) {
        err = SETERR(-EINVAL, "%s: %lld bytes: larger than a tokenizer.model can be", path,
                     (long long)st.st_size);
        goto out;
    }
    const size_t n = (size_t)st.st_size;
    if (!(buf = malloc(n ? n : 1))) {
        err = SETERR(-ENOMEM, "out of memory");
        goto out;
    }
    for (size_t got = 0; got < n;) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            err = SETERR(k < 0 ? -errno : -EIO, "%s: read: %s", path,
                         k < 0 ? strerror(errno) : "short file");
            goto out;
        }
        got += (size_t)k;
    }
    err = spm_parse(buf, n, path, out);
out:
    free(buf);
    close(fd);
    return err;
}

void spm_free(spm_model *m)
{
    if (!m) return;
    for (size_t i = 0; m->pieces && i < m->n_pieces; i++) free(m->pieces[i]);
    free(m->pieces);
    free(m->lens);
    free(m->scores);
    free(m->types);
    free(m);
}
