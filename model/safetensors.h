/* SPDX-License-Identifier: MIT */
/*
 * model/safetensors.h — a reader for Hugging Face safetensors checkpoints: one file, or a
 * directory of shards named by model.safetensors.index.json. Each file is mmap()ed
 * read-only and its header validated as untrusted input before any tensor is handed out.
 *
 * File layout: u64 (little-endian) N, then N bytes of JSON, then the data:
 *   {"NAME": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"format": "pt"}}
 * offsets are relative to the start of the data and end - begin is the tensor's bytes; the
 * shape is row-major (the last dimension fastest).
 *
 * Checked at open, each refusal naming the file and the tensor: the header length fits the
 * file, the header is a JSON object, each dtype is known, each shape's element count times
 * the dtype's size equals end - begin, no tensor runs past the end of the file (a truncated
 * shard) and no two tensors overlap. A shard directory: every tensor the index names is in
 * the file the index names.
 *
 * Errors: functions return 0 or a negative errno; st_errmsg() gives a thread-local detail.
 * Internal to ringlm (the HF importer, model/hf_import.c).
 */
#ifndef RINGLM_MODEL_SAFETENSORS_H
#define RINGLM_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* dtypes: the three weights come in are read; the others are named so a refusal can say
 * what the checkpoint holds. */
enum st_dtype {
    ST_F32,
    ST_F16,
    ST_BF16,
    ST_F64,
    ST_I64,
    ST_I32,
    ST_I16,
    ST_I8,
    ST_U8,
    ST_BOOL,
    ST_F8_E4M3,
    ST_F8_E5M2,
    ST_DTYPE_COUNT
};

#define ST_MAX_DIMS 8

typedef struct st_tensor {
    const char *name; /* NUL-terminated copy */
    const char *file; /* the shard it lies in (its path as opened) */
    int dtype;        /* enum st_dtype */
    int n_dims;       /* 0 (a scalar) .. ST_MAX_DIMS */
    uint64_t shape[ST_MAX_DIMS];
    uint64_t n_elems;
    uint64_t bytes;
    const void *data; /* inside the mapping */
} st_tensor;

typedef struct st_set st_set;

/* One safetensors file. */
int st_open(const char *path, st_set **out);
/* A checkpoint directory: model.safetensors.index.json and its shards when the index is
 * there, else model.safetensors, else every *.safetensors file in the directory. */
int st_open_dir(const char *dir, st_set **out);
/* A file's bytes the caller keeps alive while the set is open (not copied); name is used in
 * messages. */
int st_open_mem(const void *buf, size_t len, const char *name, st_set **out);
void st_close(st_set *s);

size_t st_count(const st_set *s);
const st_tensor *st_at(const st_set *s, size_t i);
const st_tensor *st_find(const st_set *s, const char *name); /* NULL when absent */
/* The files of the set, ", "-separated (for messages; a thread-local buffer). */
const char *st_files(const st_set *s);

const char *st_dtype_name(int dtype);
size_t st_dtype_size(int dtype);

const char *st_errmsg(void);

#endif
