/* SPDX-License-Identifier: MIT */
/*
 * model/safetensors.c — the safetensors reader (see safetensors.h): each file mmap()ed, its
 * JSON header parsed with jansson and checked, the tensors of every shard in one table
 * sorted by name.
 */
#include "model/safetensors.h"
#include "common/errdetail.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

ERRDETAIL_DEFINE(st_err);

const char *st_errmsg(void)
{
    return st_err.msg;
}

#define SETERR(rc, ...) errdetail_set(&st_err, (rc), __VA_ARGS__)

/* The format's own bound on the header (the reference implementation's). */
#define ST_MAX_HEADER (100u << 20)

static const struct {
    const char *name;
    size_t size;
} dtypes[ST_DTYPE_COUNT] = {
    [ST_F32] = {"F32", 4},   [ST_F16] = {"F16", 2},         [ST_BF16] = {"BF16", 2},
    [ST_F64] = {"F64", 8},   [ST_I64] = {"I64", 8},         [ST_I32] = {"I32", 4},
    [ST_I16] = {"I16", 2},   [ST_I8] = {"I8", 1},           [ST_U8] = {"U8", 1},
    [ST_BOOL] = {"BOOL", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *st_dtype_name(int dtype)
{
    return dtype >= 0 && dtype < ST_DTYPE_COUNT ? dtypes[dtype].name : "?";
}

size_t st_dtype_size(int dtype)
{
    return dtype >= 0 && dtype < ST_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

typedef struct st_file {
    char *path;
    const unsigned char *bytes; /* the file's bytes */
    void *map;                  /* the mapping to unmap; NULL for st_open_mem */
    size_t len;
} st_file;

struct st_set {
    st_file *files;
    size_t n_files;
    st_tensor *t;
    size_t n_t, cap_t;
};

void st_close(st_set *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n_t; i++) free((char *)s->t[i].name);
    for (size_t i = 0; i < s->n_files; i++) {
        if (s->files[i].map) munmap(s->files[i].map, s->files[i].len);
        free(s->files[i].path);
    }
    free(s->files);
    free(s->t);
    free(s);
}

size_t st_count(const st_set *s)
{
    return s->n_t;
}

const st_tensor *st_at(const st_set *s, size_t i)
{
    return i < s->n_t ? &s->t[i] : NULL;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

const st_tensor *st_find(const st_set *s, const char *name)
{
    st_tensor key = {.name = name};
    return s->n_t ? bsearch(&key, s->t, s->n_t, sizeof key, by_name) : NULL;
}

const char *st_files(const st_set *s)
{
    static _Thread_local char buf[512];
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < s->n_files && used + 1 < sizeof buf; i++) {
        const char *base = strrchr(s->files[i].path, '/');
        base = base ? base + 1 : s->files[i].path;
        int n = snprintf(buf + used, sizeof buf - used, "%s%s", i ? ", " : "", base);
        if (n < 0) break;
        used += (size_t)n;
    }
    return buf;
}

typedef struct span {
    uint64_t begin, end;
    const char *name;
} span;

static int by_begin(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Parses file f (already in s->files[fi]) and appends its tensors. */
static int parse_file(st_set *s, size_t fi)
{
    const st_file *f = &s->files[fi];
    const unsigned char *p = f->bytes;
    const char *path = f->path;
    if (f->len < 8)
        return SETERR(-EINVAL,
                      "%s: %zu bytes: too short for a safetensors header (8 bytes of "
                      "length, then JSON)",
                      path, f->len);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)p[i] << (8 * i);
    if (n > ST_MAX_HEADER || n > f->len - 8)
        return SETERR(-EINVAL,
                      "%s: header length %llu: %s (the file is %zu bytes; truncated, or not "
                      "safetensors)",
                      path, (unsigned long long)n,
                      n > ST_MAX_HEADER ? "over the format's 100 MiB" : "runs past the end",
                      f->len);
    json_error_t je;
    json_t *root = json_loadb((const char *)p + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return SETERR(-EINVAL, "%s: header: %s (at byte %d of the JSON)", path, je.text,
                      je.position);
    int err = 0;
    const uint64_t data_len = f->len - 8 - n;
    const unsigned char *data = p + 8 + n;
    span *spans = NULL;
    size_t n_spans = 0;
    if (!json_is_object(root)) {
        err = SETERR(-EINVAL, "%s: header: a JSON object expected", path);
        goto out;
    }
    spans = calloc(json_object_size(root) + 1, sizeof *spans);
    if (!spans) {
        err = SETERR(-ENOMEM, "out of memory");
        goto out;
    }
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v)
    {
        if (strcmp(name, "__metadata__") == 0) continue;
        const char *dt = json_string_value(json_object_get(v, "dtype"));
        json_t *shape = json_object_get(v, "shape"), *offs = json_object_get(v, "data_offsets");
        if (!json_is_object(v) || !dt || !json_is_array(shape) || !json_is_array(offs) ||
            json_array_size(offs) != 2) {
            err = SETERR(-EINVAL,
                         "%s: tensor %s: needs \"dtype\" (a string), \"shape\" (an array) and "
                         "\"data_offsets\" ([begin, end])",
                         path, name);
            goto out;
        }
        int dtype = -1;
        for (int d = 0; d < ST_DTYPE_COUNT; d++)
            if (strcmp(dt, dtypes[d].name) == 0) dtype = d;
        if (dtype < 0) {
            err = SETERR(-EINVAL, "%s: tensor %s: dtype \"%.32s\": unknown", path, name, dt);
            goto out;
        }
        if (json_array_size(shape) > ST_MAX_DIMS) {
            err = SETERR(-EINVAL, "%s: tensor %s: %zu dimensions, at most %d", path, name,
                         json_array_size(shape), ST_MAX_DIMS);
            goto out;
        }
        st_tensor t = {.dtype = dtype, .n_dims = (int)json_array_size(shape), .file = path};
        uint64_t elems = 1;
        bool overflow = false;
        for (int d = 0; d < t.n_dims; d++) {
            json_t *e = json_array_get(shape, (size_t)d);
            if (!json_is_integer(e) || json_integer_value(e) < 0) {
                err = SETERR(-EINVAL,
                             "%s: tensor %s: shape[%d]: a non-negative integer "
                             "expected",
                             path, name, d);
                goto out;
            }
            t.shape[d] = (uint64_t)json_integer_value(e);
            if (t.shape[d] && elems > UINT64_MAX / t.shape[d]) overflow = true;
            elems *= t.shape[d];
        }
        json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
        if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
            json_integer_value(e) < json_integer_value(b)) {
            err = SETERR(-EINVAL,
                         "%s: tensor %s: data_offsets: [begin, end] with 0 <= begin "
                         "<= end expected",
                         path, name);
            goto out;
        }
        uint64_t begin = (uint64_t)json_integer_value(b), end = (uint64_t)json_integer_value(e);
        if (overflow || elems > UINT64_MAX / dtypes[dtype].size ||
            elems * dtypes[dtype].size != end - begin) {
            err = SETERR(-EINVAL,
                         "%s: tensor %s: data_offsets [%llu, %llu] hold %llu bytes, its shape "
                         "and dtype %s need %llu%s",
                         path, name, (unsigned long long)begin, (unsigned long long)end,
                         (unsigned long long)(end - begin), dt,
                         (unsigned long long)(elems * dtypes[dtype].size),
                         overflow ? " (overflows)" : "");
            goto out;
        }
        if (end > data_len) {
            err = SETERR(-EINVAL,
                         "%s: tensor %s: ends at byte %llu of the data, the file holds %llu: "
                         "truncated",
                         path, name, (unsigned long long)end, (unsigned long long)data_len);
            goto out;
        }
        t.n_elems = elems;
        t.bytes = end - begin;
        t.data = data + begin;
        if (s->n_t == s->cap_t) {
            size_t cap = s->cap_t ? s->cap_t * 2 : 256;
            st_tensor *nt = realloc(s->t, cap * sizeof *nt);
            if (!nt) {
                err = SETERR(-ENOMEM, "out of memory");
                goto out;
            }
            s->t = nt;
            s->cap_t = cap;
        }
        if (!(t.name = strdup(name))) {
            err = SETERR(-ENOMEM, "out of memory");
            goto out;
        }
        s->t[s->n_t++] = t;
        spans[n_spans++] = (span){begin, end, s->t[s->n_t - 1].name};
    }
    qsort(spans, n_spans, sizeof *spans, by_begin);
    for (size_t i = 1; i < n_spans; i++)
        if (spans[i].begin < spans[i - 1].end) {
            err = SETERR(-EINVAL,
                         "%s: tensor %s: data_offsets begin at %llu, inside tensor %s (ends at "
                         "%llu): the header's offsets overlap",
                         path, spans[i].name, (unsigned long long)spans[i].begin, spans[i - 1].name,
                         (unsigned long long)spans[i - 1].end);
            goto out;
        }
out:
    free(spans);
    json_decref(root);
    return err;
}

static int add_file(st_set *s, const char *path, const void *buf, size_t len)
{
    st_file *nf = realloc(s->files, (s->n_files + 1) * sizeof *nf);
    if (!nf) return SETERR(-ENOMEM, "out of memory");
    s->files = nf;
    st_file *f = &s->files[s->n_files];
    *f = (st_file){.path = strdup(path)};
    if (!f->path) return SETERR(-ENOMEM, "out of memory");
    s->n_files++;
    if (buf) { /* st_open_mem: the caller's bytes, not unmapped by st_close */
        f->bytes = buf;
        f->len = len;
        return parse_file(s, s->n_files - 1);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return SETERR(-errno, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return SETERR(-e, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return SETERR(-EINVAL, "%s: not a regular file", path);
    }
    f->len = (size_t)st.st_size;
    if (f->len >= 8) {
        void *m = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return SETERR(-e, "%s: mmap: %s", path, strerror(e));
        }
        f->map = m;
        f->bytes = m;
    }
    close(fd);
    return parse_file(s, s->n_files - 1);
}

/* Sorts the table and refuses a name two shards both hold. */
static int finish(st_set *s)
{
    if (s->n_t) qsort(s->t, s->n_t, sizeof *s->t, by_name);
    for (size_t i = 1; i < s->n_t; i++)
        if (strcmp(s->t[i].name, s->t[i - 1].name) == 0)
            return SETERR(-EINVAL, "tensor %s: in both %s and %s", s->t[i].name, s->t[i - 1].file,
                          s->t[i].file);
    return 0;
}

int st_open_mem(const void *buf, size_t len, const char *name, st_set **out)
{
    *out = NULL;
    st_set *s = calloc(1, sizeof *s);
    if (!s) return SETERR(-ENOMEM, "out of memory");
    int err = add_file(s, name, buf ? buf : "", buf ? len : 0);
    if (!err) err = finish(s);
    if (err) {
        st_close(s);
        return err;
    }
    *out = s;
    return 0;
}

int st_open(const char *path, st_set **out)
{
    *out = NULL;
    st_set *s = calloc(1, sizeof *s);
    if (!s) return SETERR(-ENOMEM, "out of memory");
    int err = add_file(s, path, NULL, 0);
    if (!err) err = finish(s);
    if (err) {
        st_close(s);
        return err;
    }
    *out = s;
    return 0;
}

static int by_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The shards a directory holds, without an index: every *.safetensors, in name order. */
static int list_shards(const char *dir, char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return SETERR(-errno, "%s: %s", dir, strerror(errno));
    struct dirent *e;
    int err = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l <= 12 || strcmp(e->d_name + l - 12, ".safetensors") != 0) continue;
        char **nn = realloc(*names, (*n + 1) * sizeof *nn);
        if (!nn || !(nn[*n] = strdup(e->d_name))) {
            if (nn) *names = nn;
            err = SETERR(-ENOMEM, "out of memory");
            break;
        }
        *names = nn;
        (*n)++;
    }
    closedir(d);
    if (!err && *n) qsort(*names, *n, sizeof **names, by_str);
    return err;
}

int st_open_dir(const char *dir, st_set **out)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_t *index = NULL, *wmap = NULL;
    char **names = NULL;
    size_t n_names = 0;
    int err = 0;
    st_set *s = calloc(1, sizeof *s);
    if (!s) return SETERR(-ENOMEM, "out of memory");
    if (access(path, F_OK) == 0) {
        json_error_t je;
        if (!(index = json_load_file(path, 0, &je))) {
            err = SETERR(-EINVAL, "%s:%d: %s", path, je.line, je.text);
            goto out;
        }
        wmap = json_object_get(index, "weight_map");
        if (!json_is_object(wmap)) {
            err = SETERR(-EINVAL,
                         "%s: \"weight_map\": an object (tensor name: shard file) "
                         "expected",
                         path);
            goto out;
        }
        const char *k;
        json_t *v;
        json_object_foreach(wmap, k, v)
        {
            const char *file = json_string_value(v);
            if (!file || !*file || strchr(file, '/')) {
                err =
                    SETERR(-EINVAL, "%s: weight_map[\"%s\"]: a file name in the directory expected",
                           path, k);
                goto out;
            }
            bool seen = false;
            for (size_t i = 0; i < n_names && !seen; i++) seen = strcmp(names[i], file) == 0;
            if (seen) continue;
            char **nn = realloc(names, (n_names + 1) * sizeof *nn);
            if (!nn) {
                err = SETERR(-ENOMEM, "out of memory");
                goto out;
            }
            names = nn;
            if (!(names[n_names] = strdup(file))) {
                err = SETERR(-ENOMEM, "out of memory");
                goto out;
            }
            n_names++;
        }
        if (n_names) qsort(names, n_names, sizeof *names, by_str);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (access(path, F_OK) == 0) {
            names = malloc(sizeof *names);
            if (!names || !(names[0] = strdup("model.safetensors"))) {
                err = SETERR(-ENOMEM, "out of memory");
                goto out;
            }
            n_names = 1;
        } else if ((err = list_shards(dir, &names, &n_names))) {
            goto out;
        }
    }
    if (!n_names) {
        err = SETERR(-ENOENT, "%s: no *.safetensors files (nor model.safetensors.index.json)", dir);
        goto out;
    }
    for (size_t i = 0; i < n_names && !err; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        err = add_file(s, path, NULL, 0);
    }
    if (!err) err = finish(s);
    if (!err && wmap) {
        const char *k;
        json_t *v;
        json_object_foreach(wmap, k, v)
        {
            const st_tensor *t = st_find(s, k);
            const char *file = json_string_value(v);
            const char *base = t ? strrchr(t->file, '/') : NULL;
            if (!t) {
                err = SETERR(-EINVAL,
                             "%s/model.safetensors.index.json names tensor %s in %s, which does "
                             "not hold it",
                             dir, k, file);
                break;
            }
            if (strcmp(base ? base + 1 : t->file, file) != 0) {
                err = SETERR(-EINVAL,
                             "%s/model.safetensors.index.json names tensor %s in %s; it is in "
                             "%s",
                             dir, k, file, t->file);
                break;
            }
        }
    }
out:
    for (size_t i = 0; i < n_names; i++) free(names[i]);
    free(names);
    json_decref(index);
    if (err) {
        st_close(s);
        return err;
    }
    *out = s;
    return 0;
}
