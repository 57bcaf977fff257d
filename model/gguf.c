/* SPDX-License-Identifier: MIT */
/*
 * model/gguf.c — GGUF reader: every count, length and offset is checked against what
 * is left of the file before it is used, so a truncated or corrupt file gets an error that
 * names the field, never a read past the mapping.
 */
#include "model/gguf.h"
#include "common/errdetail.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Far above any real file, low enough that a corrupt count cannot ask for absurd memory. */
#define GGUF_MAX_TENSORS (1u << 20)
#define GGUF_MAX_KV      (1u << 20)
#define GGUF_MAX_DIMS    4

struct gguf_file {
    uint32_t version;
    const unsigned char *base;
    size_t len;
    bool mapped;
    bool copied; /* gguf_open_weights read the file into anonymous memory (huge pages) */
    void *map;   /* what gguf_close unmaps (mapped): base, or the huge-page copy's mapping */
    size_t map_len;
    uint32_t alignment;
    uint64_t data_offset;
    int n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    char *names; /* arena of the NUL-terminated keys and tensor names */
};

ERRDETAIL_DEFINE(gguf_err);

const char *gguf_errmsg(void)
{
    return gguf_err.msg;
}

#define seterr(err, ...) errdetail_set(&gguf_err, (err), __VA_ARGS__)

/* ---- type tables -------------------------------------------------------------------- */

static const struct {
    uint32_t type;
    const char *name;
    uint32_t block_elems, block_bytes;
} ttypes[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},      {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},
};

const char *gguf_type_name(uint32_t type)
{
    static __thread char buf[24];
    for (size_t i = 0; i < sizeof ttypes / sizeof ttypes[0]; i++)
        if (ttypes[i].type == type) return ttypes[i].name;
    snprintf(buf, sizeof buf, "type %" PRIu32, type);
    return buf;
}

bool gguf_type_block(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes)
{
    for (size_t i = 0; i < sizeof ttypes / sizeof ttypes[0]; i++)
        if (ttypes[i].type == type) {
            *block_elems = ttypes[i].block_elems;
            *block_bytes = ttypes[i].block_bytes;
            return true;
        }
    return false;
}

static const char *vtype_names[GGUF_V_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
static const uint8_t vtype_size[GGUF_V_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

size_t gguf_vtype_bytes(uint32_t vtype)
{
    return vtype < GGUF_V_COUNT ? vtype_size[vtype] : 0;
}

const char *gguf_vtype_name(uint32_t vtype)
{
    return vtype < GGUF_V_COUNT ? vtype_names[vtype] : "unknown type";
}

/* ---- parsing ------------------------------------------------------------------------ */

typedef struct cursor {
    const unsigned char *p, *end, *base;
} cursor;

static uint64_t rd_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static size_t cur_off(const cursor *c)
{
    return (size_t)(c->p - c->base);
}
static size_t cur_left(const cursor *c)
{
    return (size_t)(c->end - c->p);
}

/* Reads n bytes as a little-endian integer; what names the field for the error. */
static int rd(cursor *c, int n, uint64_t *v, const char *what, const char *who)
{
    *v = 0;
    if (cur_left(c) < (size_t)n)
        return seterr(-EINVAL,
                      "%s%s%s: file ends at byte %zu, %d more needed at offset %zu "
                      "(truncated file)",
                      who ? who : "", who ? ": " : "", what, (size_t)(c->end - c->base), n,
                      cur_off(c));
    *v = rd_le(c->p, n);
    c->p += n;
    return 0;
}

/* A GGUF string: u64 length, bytes. */
static int rd_str(cursor *c, const unsigned char **s, uint64_t *len, const char *what,
                  const char *who)
{
    *s = NULL;
    int err = rd(c, 8, len, what, who);
    if (err) return err;
    if (*len > cur_left(c))
        return seterr(-EINVAL,
                      "%s%s%s: string length %" PRIu64 " runs past the end of the "
                      "file (%zu bytes left at offset %zu)",
                      who ? who : "", who ? ": " : "", what, *len, cur_left(c), cur_off(c));
    *s = c->p;
    c->p += *len;
    return 0;
}

/* Skips one value of type t (not an array), validating string lengths. */
static int skip_value(cursor *c, uint32_t t, const char *key, uint64_t index)
{
    char what[48];
    snprintf(what, sizeof what, "element %" PRIu64, index);
    if (t == GGUF_V_STRING) {
        const unsigned char *s;
        uint64_t n;
        return rd_str(c, &s, &n, what, key);
    }
    uint64_t v;
    return rd(c, vtype_size[t], &v, what, key);
}

static int parse_kv(cursor *c, gguf_kv *kv, char **arena, int index)
{
    const unsigned char *s;
    uint64_t n, t;
    char who[32];
    snprintf(who, sizeof who, "metadata entry %d", index);
    int err = rd_str(c, &s, &n, "key", who);
    if (err) return err;
    if (n == 0 || memchr(s, 0, n))
        return seterr(-EINVAL, "metadata entry %d: key is empty or holds a NUL byte", index);
    memcpy(*arena, s, n);
    (*arena)[n] = '\0';
    kv->key = *arena;
    *arena += n + 1;
    if ((err = rd(c, 4, &t, "value type", kv->key))) return err;
    if (t >= GGUF_V_COUNT)
        return seterr(-EINVAL, "%s: value type %" PRIu64 " is not a GGUF type (0..%d)", kv->key, t,
                      GGUF_V_COUNT - 1);
    kv->type = (uint32_t)t;
    kv->count = 1;
    if (t == GGUF_V_STRING) {
        uint64_t len;
        if ((err = rd_str(c, &kv->value, &len, "string value", kv->key))) return err;
        kv->count = len;
        return 0;
    }
    if (t != GGUF_V_ARRAY) {
        kv->value = c->p;
        uint64_t v;
        if ((err = rd(c, vtype_size[t], &v, "value", kv->key))) return err;
        if (t == GGUF_V_BOOL && v > 1)
            return seterr(-EINVAL, "%s: bool value %" PRIu64 ": must be 0 or 1", kv->key, v);
        return 0;
    }
    uint64_t et, count;
    if ((err = rd(c, 4, &et, "array element type", kv->key)) ||
        (err = rd(c, 8, &count, "array length", kv->key)))
        return err;
    if (et >= GGUF_V_COUNT || et == GGUF_V_ARRAY)
        return seterr(-EINVAL,
                      "%s: array element type %" PRIu64 " (%s) is not supported "
                      "(scalars and strings only)",
                      kv->key, et, gguf_vtype_name((uint32_t)et));
    kv->elem_type = (uint32_t)et;
    kv->count = count;
    kv->value = c->p;
    if (et != GGUF_V_STRING) {
        if (count > cur_left(c) / vtype_size[et])
            return seterr(-EINVAL,
                          "%s: array of %" PRIu64 " %s runs past the end of the file "
                          "(%zu bytes left at offset %zu)",
                          kv->key, count, gguf_vtype_name((uint32_t)et), cur_left(c), cur_off(c));
        c->p += count * vtype_size[et];
        return 0;
    }
    if (count > cur_left(c) / 8)
        return seterr(-EINVAL,
                      "%s: array of %" PRIu64 " strings cannot fit in the %zu bytes "
                      "left",
                      kv->key, count, cur_left(c));
    for (uint64_t i = 0; i < count; i++)
        if ((err = skip_value(c, GGUF_V_STRING, kv->key, i))) return err;
    return 0;
}

static int parse_tensor(cursor *c, gguf_tensor *t, char **arena, int index)
{
    const unsigned char *s;
    uint64_t n, v;
    char who[32];
    snprintf(who, sizeof who, "tensor %d", index);
    int err = rd_str(c, &s, &n, "name", who);
    if (err) return err;
    if (n == 0 || memchr(s, 0, n))
        return seterr(-EINVAL, "tensor %d: name is empty or holds a NUL byte", index);
    memcpy(*arena, s, n);
    (*arena)[n] = '\0';
    t->name = *arena;
    *arena += n + 1;
    if ((err = rd(c, 4, &v, "n_dims", t->name))) return err;
    if (v < 1 || v > GGUF_MAX_DIMS)
        return seterr(-EINVAL, "tensor %s: n_dims %" PRIu64 ": must be 1..%d", t->name, v,
                      GGUF_MAX_DIMS);
    t->n_dims = (uint32_t)v;
    uint64_t elems = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if ((uint32_t)d >= t->n_dims) continue;
        if ((err = rd(c, 8, &t->ne[d], "dimension", t->name))) return err;
        if (t->ne[d] == 0 || t->ne[d] > ((uint64_t)1 << 40) ||
            elems > ((uint64_t)1 << 50) / t->ne[d])
            return seterr(-EINVAL,
                          "tensor %s: dimension %d is %" PRIu64 ": must be 1..2^40 and "
                          "the tensor under 2^50 elements",
                          t->name, d, t->ne[d]);
        elems *= t->ne[d];
    }
    if ((err = rd(c, 4, &v, "type", t->name))) return err;
    t->type = (uint32_t)v;
    uint32_t be, bb;
    if (!gguf_type_block(t->type, &be, &bb))
        return seterr(-EINVAL, "tensor %s: tensor type %" PRIu64 " is unknown", t->name, v);
    if (t->ne[0] % be)
        return seterr(-EINVAL,
                      "tensor %s: type %s stores blocks of %u elements, but its row "
                      "(ne[0]) has %" PRIu64,
                      t->name, gguf_type_name(t->type), be, t->ne[0]);
    t->bytes = elems / be * bb;
    return rd(c, 8, &t->offset, "offset", t->name);
}

static int parse(gguf_file *g)
{
    cursor c = {g->base, g->base + g->len, g->base};
    uint64_t magic, version, nt, nkv;
    int err;
    if (g->len < 4 || (rd(&c, 4, &magic, "magic", NULL), magic != GGUF_MAGIC))
        return seterr(-EINVAL, "not a GGUF file: the magic is not \"GGUF\"");
    if ((err = rd(&c, 4, &version, "version", "header"))) return err;
    if (version != 2 && version != 3)
        return seterr(-EINVAL, "header: GGUF version %" PRIu64 " is not supported (2 and 3 are)",
                      version);
    g->version = (uint32_t)version;
    if ((err = rd(&c, 8, &nt, "tensor count", "header")) ||
        (err = rd(&c, 8, &nkv, "metadata count", "header")))
        return err;
    if (nt > GGUF_MAX_TENSORS || nkv > GGUF_MAX_KV)
        return seterr(-EINVAL,
                      "header: %" PRIu64 " tensors and %" PRIu64 " metadata entries: at "
                      "most %u of each",
                      nt, nkv, GGUF_MAX_TENSORS);
    /* Keys and names are strings inside the file, so the file's size bounds the arena. */
    g->names = malloc(g->len + nt + nkv + 1);
    g->kv = calloc(nkv ? nkv : 1, sizeof *g->kv);
    g->tensors = calloc(nt ? nt : 1, sizeof *g->tensors);
    if (!g->names || !g->kv || !g->tensors) return seterr(-ENOMEM, "out of memory");
    char *arena = g->names;
    for (uint64_t i = 0; i < nkv; i++) {
        if ((err = parse_kv(&c, &g->kv[i], &arena, (int)i))) return err;
        g->n_kv = (int)i + 1;
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(g->kv[j].key, g->kv[i].key) == 0)
                return seterr(-EINVAL,
                              "%s: the key appears twice (entries %" PRIu64 " and %" PRIu64 ")",
                              g->kv[i].key, j, i);
    }
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = gguf_find(g, "general.alignment");
    if (al) {
        if (al->type != GGUF_V_U32)
            return seterr(-EINVAL, "general.alignment: expected u32, found %s",
                          gguf_vtype_name(al->type));
        uint32_t a = (uint32_t)rd_le(al->value, 4);
        if (a == 0 || (a & (a - 1)) || a > 65536)
            return seterr(-EINVAL,
                          "general.alignment: %" PRIu32 " is not a power of two in "
                          "1..65536",
                          a);
        g->alignment = a;
    }
    for (uint64_t i = 0; i < nt; i++) {
        if ((err = parse_tensor(&c, &g->tensors[i], &arena, (int)i))) return err;
        g->n_tensors = (int)i + 1;
    }
    uint64_t off = cur_off(&c);
    g->data_offset = (off + g->alignment - 1) / g->alignment * g->alignment;
    if (nt && g->data_offset > g->len)
        return seterr(-EINVAL,
                      "tensor data: would start at byte %" PRIu64 ", past the end of the "
                      "file (%zu bytes; truncated file)",
                      g->data_offset, g->len);
    uint64_t data_len = g->len - (nt ? g->data_offset : g->len);
    for (int i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment)
            return seterr(-EINVAL,
                          "tensor %s: offset %" PRIu64 " is not a multiple of the "
                          "alignment %" PRIu32,
                          t->name, t->offset, g->alignment);
        if (t->offset > data_len || t->bytes > data_len - t->offset)
            return seterr(-EINVAL,
                          "tensor %s: bytes [%" PRIu64 ", %" PRIu64 ") of the data "
                          "section, which has %" PRIu64 " (truncated file)",
                          t->name, t->offset, t->offset + t->bytes, data_len);
        t->data = g->base + g->data_offset + t->offset;
        for (int j = 0; j < i; j++)
            if (strcmp(g->tensors[j].name, t->name) == 0)
                return seterr(-EINVAL, "tensor %s: the name appears twice", t->name);
    }
    return 0;
}

static int open_common(gguf_file *g, gguf_file **out)
{
    int err = parse(g);
    if (err) {
        gguf_close(g);
        return err;
    }
    *out = g;
    return 0;
}

int gguf_open_mem(const void *buf, size_t len, gguf_file **out)
{
    *out = NULL;
    gguf_file *g = calloc(1, sizeof *g);
    if (!g) return seterr(-ENOMEM, "out of memory");
    g->base = buf;
    g->len = len;
    return open_common(g, out);
}

/*
 * gguf_open_weights: the file read into anonymous memory on 2 MiB pages (madvise
 * MADV_HUGEPAGE, where transparent huge pages are `always` or `madvise`), not mapped from the
 * page cache on 4 KiB pages. A decode step streams every weight once; on 4 KiB pages each
 * stream enters a new page every 4 KiB, and the pages of a model outnumber the TLB's entries
 * many times over. One Zen 4 thread, one sequence (engine_bench, either way alternated):
 * Q8_0 1.45-1.50x, Q4_K_M 1.2x, F32 1.17x, F16 1.07-1.15x
 * (docs/results/2026-12-07-float-decode-prefetch-zen4-s12.md). The copy costs the read at load
 * (132 ms for a 438 MB file from the page cache) and the page cache's sharing of one file
 * between processes; RINGLM_WEIGHTS_HUGEPAGES=0 maps the file instead.
 * Returns the copy's first byte (the mapping in *map, *map_len), or NULL where it is not asked
 * for or fails (the caller maps the file).
 */
#define HUGE_PAGE ((size_t)2 << 20)

static const unsigned char *huge_copy(int fd, size_t size, void **map, size_t *map_len)
{
    const char *e = getenv("RINGLM_WEIGHTS_HUGEPAGES");
    if (e && strcmp(e, "0") == 0) return NULL;
    const size_t len = ((size + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)) + HUGE_PAGE;
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    unsigned char *p =
        (unsigned char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    (void)madvise(p, size, MADV_HUGEPAGE); /* advice: where THP is off, 4 KiB pages as before */
    size_t got = 0;
    while (got < size) {
        const ssize_t r = pread(fd, p + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            munmap(m, len);
            return NULL;
        }
        got += (size_t)r;
    }
    if (mprotect(m, len, PROT_READ) != 0) {
        munmap(m, len);
        return NULL;
    }
    *map = m;
    *map_len = len;
    return p;
}

static int open_path(const char *path, bool weights, gguf_file **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return seterr(-errno, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
        int err = errno;
        close(fd);
        return seterr(-EINVAL, "%s: %s", path,
                      err && st.st_size ? strerror(err) : "not a regular, non-empty file");
    }
    size_t map_len = (size_t)st.st_size;
    void *map = NULL;
    const unsigned char *base = weights ? huge_copy(fd, map_len, &map, &map_len) : NULL;
    const bool copied = base != NULL;
    int merr = 0;
    if (!base) {
        map = mmap(NULL, map_len, PROT_READ, MAP_PRIVATE, fd, 0);
        merr = errno;
        base = map;
    }
    close(fd);
    if (map == MAP_FAILED) return seterr(-merr, "%s: mmap: %s", path, strerror(merr));
    gguf_file *g = calloc(1, sizeof *g);
    if (!g) {
        munmap(map, map_len);
        return seterr(-ENOMEM, "out of memory");
    }
    g->base = base;
    g->len = (size_t)st.st_size;
    g->mapped = true;
    g->copied = copied;
    g->map = map;
    g->map_len = map_len;
    int err = open_common(g, out);
    if (err) {
        seterr(err, "%s: %s", path, gguf_err.msg); /* errdetail: may wrap itself */
    }
    return err;
}

int gguf_open(const char *path, gguf_file **out)
{
    return open_path(path, false, out);
}

int gguf_open_weights(const char *path, gguf_file **out)
{
    return open_path(path, true, out);
}

bool gguf_weights_copied(const gguf_file *g)
{
    return g->copied;
}

void gguf_close(gguf_file *g)
{
    if (!g) return;
    if (g->mapped) munmap(g->map, g->map_len);
    free(g->names);
    free(g->kv);
    free(g->tensors);
    free(g);
}

uint32_t gguf_version(const gguf_file *g)
{
    return g->version;
}

const void *gguf_bytes(const gguf_file *g, size_t *len)
{
    *len = g->len;
    return g->base;
}

/* ---- metadata ----------------------------------------------------------------------- */

int gguf_n_kv(const gguf_file *g)
{
    return g->n_kv;
}
const gguf_kv *gguf_kv_at(const gguf_file *g, int i)
{
    return &g->kv[i];
}

const gguf_kv *gguf_find(const gguf_file *g, const char *key)
{
    for (int i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0) return &g->kv[i];
    return NULL;
}

int gguf_get_u64(const gguf_file *g, const char *key, uint64_t *out)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return -ENOENT;
    uint64_t v;
    int64_t sv;
    switch (kv->type) {
    case GGUF_V_U8:
    case GGUF_V_U16:
    case GGUF_V_U32:
    case GGUF_V_U64: *out = rd_le(kv->value, vtype_size[kv->type]); return 0;
    case GGUF_V_I8:
    case GGUF_V_I16:
    case GGUF_V_I32:
    case GGUF_V_I64: {
        int bits = vtype_size[kv->type] * 8;
        v = rd_le(kv->value, vtype_size[kv->type]);
        sv = bits == 64 ? (int64_t)v : (int64_t)(v << (64 - bits)) >> (64 - bits);
        if (sv < 0) return seterr(-EINVAL, "%s: %" PRId64 ": must not be negative", key, sv);
        *out = (uint64_t)sv;
        return 0;
    }
    default:
        return seterr(-EINVAL, "%s: expected an integer, found %s", key, gguf_vtype_name(kv->type));
    }
}

int gguf_get_f32(const gguf_file *g, const char *key, float *out)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return -ENOENT;
    if (kv->type == GGUF_V_F32) {
        uint32_t b = (uint32_t)rd_le(kv->value, 4);
        memcpy(out, &b, 4);
        return 0;
    }
    if (kv->type == GGUF_V_F64) {
        uint64_t b = rd_le(kv->value, 8);
        double d;
        memcpy(&d, &b, 8);
        *out = (float)d;
        return 0;
    }
    return seterr(-EINVAL, "%s: expected f32, found %s", key, gguf_vtype_name(kv->type));
}

int gguf_get_bool(const gguf_file *g, const char *key, bool *out)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return -ENOENT;
    if (kv->type != GGUF_V_BOOL)
        return seterr(-EINVAL, "%s: expected bool, found %s", key, gguf_vtype_name(kv->type));
    *out = kv->value[0] != 0;
    return 0;
}

int gguf_get_str(const gguf_file *g, const char *key, const char **s, size_t *len)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return -ENOENT;
    if (kv->type != GGUF_V_STRING)
        return seterr(-EINVAL, "%s: expected string, found %s", key, gguf_vtype_name(kv->type));
    *s = (const char *)kv->value;
    *len = (size_t)kv->count;
    return 0;
}

int gguf_get_arr(const gguf_file *g, const char *key, uint32_t *elem_type, uint64_t *count,
                 const void **data)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return -ENOENT;
    if (kv->type != GGUF_V_ARRAY)
        return seterr(-EINVAL, "%s: expected array, found %s", key, gguf_vtype_name(kv->type));
    *elem_type = kv->elem_type;
    *count = kv->count;
    *data = kv->value;
    return 0;
}

void gguf_str_next(const void **p, const char **s, size_t *len)
{
    const unsigned char *q = *p;
    *len = (size_t)rd_le(q, 8);
    *s = (const char *)q + 8;
    *p = q + 8 + *len;
}

/* ---- tensors ------------------------------------------------------------------------ */

int gguf_n_tensors(const gguf_file *g)
{
    return g->n_tensors;
}
const gguf_tensor *gguf_tensor_at(const gguf_file *g, int i)
{
    return &g->tensors[i];
}

const gguf_tensor *gguf_tensor_find(const gguf_file *g, const char *name)
{
    for (int i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    return NULL;
}
