/* SPDX-License-Identifier: MIT */
/*
 * model/gguf.h — a reader for GGUF files (versions 2 and 3): the metadata key/value
 * table and the tensor table, validated field by field as untrusted input, the file
 * mmap()ed read-only. It lives in model/ with the writer (gguf_write.h), because clients read
 * the tokenizer and the chat template out of the same file the engine (kernels/model.c)
 * reads the weights from; it depends on libc only. Internal to ringlm (not part of the
 * public ringlm.h API).
 *
 * File layout (little-endian):
 *   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv
 *   n_kv times:      string key, u32 value type, value
 *   n_tensors times: string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset
 *   padding to general.alignment (default 32), then the tensor data; offsets are relative to
 *   the start of the data and multiples of the alignment.
 *   string = u64 length + bytes (no NUL); array = u32 element type + u64 count + elements.
 * ne[0] is the fastest-moving dimension: a matrix [out][in] has ne = {in, out}, and
 * quantized blocks run along ne[0].
 *
 * Errors: functions return 0 or a negative errno; gguf_errmsg() gives a thread-local detail
 * naming the key or the tensor, what was expected and what was found.
 */
#ifndef RINGLM_MODEL_GGUF_H
#define RINGLM_MODEL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GGUF_MAGIC             0x46554747u /* "GGUF" read as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32

/* Metadata value types. */
enum gguf_vtype {
    GGUF_V_U8 = 0,
    GGUF_V_I8 = 1,
    GGUF_V_U16 = 2,
    GGUF_V_I16 = 3,
    GGUF_V_U32 = 4,
    GGUF_V_I32 = 5,
    GGUF_V_F32 = 6,
    GGUF_V_BOOL = 7,
    GGUF_V_STRING = 8,
    GGUF_V_ARRAY = 9,
    GGUF_V_U64 = 10,
    GGUF_V_I64 = 11,
    GGUF_V_F64 = 12,
    GGUF_V_COUNT
};

/* Tensor types (ggml's numbering). The engine computes on the first six; the others are
 * named so a refusal can say what the file holds. */
enum gguf_ttype {
    GGUF_T_F32 = 0,
    GGUF_T_F16 = 1,
    GGUF_T_Q4_0 = 2,
    GGUF_T_Q4_1 = 3,
    GGUF_T_Q5_0 = 6,
    GGUF_T_Q5_1 = 7,
    GGUF_T_Q8_0 = 8,
    GGUF_T_Q8_1 = 9,
    GGUF_T_Q2_K = 10,
    GGUF_T_Q3_K = 11,
    GGUF_T_Q4_K = 12,
    GGUF_T_Q5_K = 13,
    GGUF_T_Q6_K = 14,
    GGUF_T_Q8_K = 15,
    GGUF_T_BF16 = 30,
};

/* Name of a tensor type ("Q4_K", "type 77" when unknown; the buffer is thread-local). */
const char *gguf_type_name(uint32_t type);
/* Elements per block and bytes per block; false when the type is unknown to us. */
bool gguf_type_block(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);
const char *gguf_vtype_name(uint32_t vtype);
/* Bytes of one scalar of a value type; 0 for strings, arrays and unknown types. */
size_t gguf_vtype_bytes(uint32_t vtype);

typedef struct gguf_tensor {
    const char *name; /* NUL-terminated copy */
    uint32_t n_dims;  /* 1..4 */
    uint64_t ne[4];   /* unused dimensions are 1 */
    uint32_t type;
    uint64_t offset; /* from the start of the data section */
    uint64_t bytes;
    const void *data; /* inside the mapping */
} gguf_tensor;

typedef struct gguf_kv {
    const char *key;            /* NUL-terminated copy */
    uint32_t type;              /* enum gguf_vtype */
    uint32_t elem_type;         /* arrays: the element type */
    uint64_t count;             /* arrays: elements; strings: bytes; scalars: 1 */
    const unsigned char *value; /* scalars: the value; strings: the bytes; arrays: element 0 */
} gguf_kv;

typedef struct gguf_file gguf_file;

/* Opens and validates a file (mmap, read-only). Errors: -ENOENT/-EACCES (open), -EINVAL
 * (not GGUF, unsupported version, malformed: the detail names the field), -ENOMEM. */
int gguf_open(const char *path, gguf_file **out);
/* The same for a file whose weights will be computed on: read into anonymous memory advised
 * onto 2 MiB pages (MADV_HUGEPAGE) instead of mapped from the page cache on 4 KiB pages, unless
 * RINGLM_WEIGHTS_HUGEPAGES=0 is in the environment or the copy fails (then mapped, as
 * gguf_open). gguf_open serves readers of metadata (tokenizer, template), which need no copy. */
int gguf_open_weights(const char *path, gguf_file **out);
/* Whether gguf_open_weights copied the file (true) or mapped it (false). */
bool gguf_weights_copied(const gguf_file *g);
/* The same over a buffer the caller keeps alive while the file is open (not copied). */
int gguf_open_mem(const void *buf, size_t len, gguf_file **out);
void gguf_close(gguf_file *g);

uint32_t gguf_version(const gguf_file *g);
/* The whole mapping (for hashing the file). */
const void *gguf_bytes(const gguf_file *g, size_t *len);

/* ---- metadata ---- */
int gguf_n_kv(const gguf_file *g);
const gguf_kv *gguf_kv_at(const gguf_file *g, int i);
const gguf_kv *gguf_find(const gguf_file *g, const char *key); /* NULL when absent */

/*
 * Typed reads. Each returns 0, -ENOENT when the key is absent (*out untouched, no detail
 * set), or -EINVAL with a detail naming the key when it has another type or a value that
 * does not fit ("llama.block_count: expected an unsigned integer, found string").
 */
int gguf_get_u64(const gguf_file *g, const char *key, uint64_t *out); /* any integer >= 0 */
int gguf_get_f32(const gguf_file *g, const char *key, float *out);    /* f32 or f64 */
int gguf_get_bool(const gguf_file *g, const char *key, bool *out);
/* A string value: its bytes (not NUL-terminated) and length. */
int gguf_get_str(const gguf_file *g, const char *key, const char **s, size_t *len);
/* An array: element type, count, first element. */
int gguf_get_arr(const gguf_file *g, const char *key, uint32_t *elem_type, uint64_t *count,
                 const void **data);
/* Walks a string array: *p starts at the array's first element; each call gives one string
 * and advances. The array was validated at open, so this cannot run past it. */
void gguf_str_next(const void **p, const char **s, size_t *len);

/* ---- tensors ---- */
int gguf_n_tensors(const gguf_file *g);
const gguf_tensor *gguf_tensor_at(const gguf_file *g, int i);
const gguf_tensor *gguf_tensor_find(const gguf_file *g, const char *name); /* NULL if absent */

const char *gguf_errmsg(void);

#ifdef __cplusplus
}
#endif
#endif
