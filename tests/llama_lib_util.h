/* SPDX-License-Identifier: MIT */
/*
 * tests/llama_lib_util.h — llama.cpp's own libraries as oracles (header only, like
 * gguf_test_util.h, which it needs): node-llama-cpp's prebuilt ggml (its quantize_* and
 * dequantize_row_* functions), and llama.cpp's quantizer (llama_model_quantize, the call
 * llama-quantize makes), with or without an importance matrix; and the check that two GGUF
 * files hold the same tensors, types and bytes. Each skips the test where the library is
 * absent or not built for this machine.
 */
#ifndef RINGLM_TESTS_LLAMA_LIB_UTIL_H
#define RINGLM_TESTS_LLAMA_LIB_UTIL_H

#include "gguf_test_util.h"
#include "kernels/cpu/quant.h"
#include "model/gguf.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* node-llama-cpp's libggml-base.so (the ggml its llama.cpp runs on), opened. */
static inline void *ggml_base_or_skip(void)
{
    if (system("uname -m | grep -q x86_64") != 0)
        cr_skip_test("node-llama-cpp's x86-64 build only");
    char p[600];
    snprintf(p, sizeof p,
             "%s/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so",
             node_dir());
    void *lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    if (!lib) cr_skip_test("node-llama-cpp's libggml-base.so absent (`make deps`): %s", dlerror());
    return lib;
}

/* ggml's quantize_* of every type ringlm-mkmodel quantizes to, and whether it reads
 * quant_weights (an importance matrix's row): quantize_q8_0 ignores them. */
static const struct ggml_quantizer {
    int type;
    const char *fn;
    bool weighted;
} ggml_quantizers[] = {
    {Q_Q8_0, "quantize_q8_0", false}, {Q_Q4_0, "quantize_q4_0", true},
    {Q_Q4_1, "quantize_q4_1", true},  {Q_Q5_0, "quantize_q5_0", true},
    {Q_Q5_1, "quantize_q5_1", true},  {Q_IQ4_NL, "quantize_iq4_nl", true},
    {Q_Q2_K, "quantize_q2_K", true},  {Q_Q3_K, "quantize_q3_K", true},
    {Q_Q4_K, "quantize_q4_K", true},  {Q_Q5_K, "quantize_q5_K", true},
    {Q_Q6_K, "quantize_q6_K", true},  {Q_IQ4_XS, "quantize_iq4_xs", true},
};
#define GGML_N_QUANTIZERS (sizeof ggml_quantizers / sizeof ggml_quantizers[0])

typedef size_t (*ggml_quantize_fn)(const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                                   const float *quant_weights);

/* q's function in ggml (lib from ggml_base_or_skip); fails the test where it is absent. */
static inline ggml_quantize_fn ggml_quantizer_fn(void *lib, const struct ggml_quantizer *q)
{
    ggml_quantize_fn f = (ggml_quantize_fn)dlsym(lib, q->fn);
    cr_assert_not_null(f, "%s: %s", q->fn, dlerror());
    return f;
}

/* llama_model_quantize_params of the llama.cpp node-llama-cpp pins (include/llama.h). */
typedef struct llq_params {
    int32_t nthread;
    int ftype, output_tensor_type, token_embedding_type;
    bool allow_requantize, quantize_output_tensor, only_copy, pure, keep_split, dry_run;
    const void *imatrix, *kv_overrides, *tt_overrides;
    const int32_t *prune_layers;
    size_t max_buf_size;
} llq_params;

/* llama_model_imatrix_data: one matrix's per-column weights; an array of them ends with a
 * NULL name. */
typedef struct llq_imatrix_data {
    const char *name;
    const float *data;
    size_t size;
} llq_imatrix_data;

static inline void llq_quiet(int level, const char *text, void *user)
{
    (void)level;
    (void)text;
    (void)user;
}

typedef struct llq {
    void *lib;
    llq_params (*defaults)(void);
    uint32_t (*quantize)(const char *, const char *, const llq_params *);
} llq;

/* llama.cpp's quantizer (llama-quantize's library call) from node-llama-cpp's build. */
static inline void llq_open(llq *q)
{
    char p[600];
    if (system("uname -m | grep -q x86_64") != 0)
        cr_skip_test("node-llama-cpp's x86-64 build only");
    snprintf(p, sizeof p,
             "%s/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.4.0.so",
             node_dir());
    q->lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    if (!q->lib) cr_skip_test("node-llama-cpp's libllama absent (`make deps`): %s", dlerror());
    q->defaults = (llq_params(*)(void))dlsym(q->lib, "llama_model_quantize_default_params");
    q->quantize = (uint32_t(*)(const char *, const char *, const llq_params *))dlsym(
        q->lib, "llama_model_quantize");
    void (*log_set)(void (*)(int, const char *, void *), void *) =
        (void (*)(void (*)(int, const char *, void *), void *))dlsym(q->lib, "llama_log_set");
    cr_assert(q->defaults && q->quantize && log_set, "llama.cpp's quantizer: %s", dlerror());
    log_set(llq_quiet, NULL);
    const llq_params d = q->defaults();
    /* the layout above, checked on the defaults llama.cpp documents */
    cr_assert(d.ftype == 7 && d.quantize_output_tensor && !d.allow_requantize && !d.pure &&
                  !d.imatrix,
              "llama_model_quantize_params: not the layout of the pinned llama.cpp");
}

/* ringlm-mkmodel's mixes and llama.cpp's file types (llama_ftype) for them. */
static const struct {
    const char *mix;
    int ftype;
} llq_mixes[] = {
    {"Q4_K_M", 15}, {"Q5_K_M", 17}, {"Q3_K_M", 12}, {"Q3_K_S", 11}, {"Q3_K_L", 13}, {"Q4_K_S", 14},
    {"Q5_K_S", 16}, {"Q2_K", 10},   {"Q4_0", 2},    {"Q4_1", 3},    {"Q5_0", 8},    {"Q5_1", 9},
    {"Q8_0", 7},    {"Q6_K", 18},   {"IQ4_NL", 25}, {"IQ4_XS", 30}, {"F16", 1},     {"BF16", 32},
};

/* llama.cpp's file type for mix (-1: none). */
static inline int llq_ftype(const char *mix)
{
    /* Q2_K_S needs an importance matrix (llq_mixes' runs have none) */
    if (strcmp(mix, "Q2_K_S") == 0) return 21;
    for (size_t i = 0; i < sizeof llq_mixes / sizeof llq_mixes[0]; i++)
        if (strcmp(llq_mixes[i].mix, mix) == 0) return llq_mixes[i].ftype;
    return -1;
}

/* llama_model_quantize(in, out) under file type ftype, one thread, with the importance
 * matrix im (NULL: none) as llama-quantize --imatrix hands it over. */
static inline void llq_run(const llq *q, const char *in, const char *out, int ftype,
                           const llq_imatrix_data *im)
{
    llq_params p = q->defaults();
    p.ftype = ftype;
    p.nthread = 1;
    p.imatrix = im;
    cr_assert_eq(q->quantize(in, out, &p), 0, "llama.cpp's quantizer on %s (ftype %d)", in, ftype);
}

/* llama.cpp's file (theirs) and ringlm's (ours) hold the same tensors, types and bytes, and
 * the same general.file_type; `what` heads each failure. Returns how many tensors. */
static inline int llq_assert_same_tensors(const char *what, const char *theirs, const char *ours)
{
    gguf_file *a, *b;
    cr_assert_eq(gguf_open(theirs, &a), 0, "%s", gguf_errmsg());
    cr_assert_eq(gguf_open(ours, &b), 0, "%s", gguf_errmsg());
    cr_assert_eq(gguf_n_tensors(a), gguf_n_tensors(b), "%s: tensor counts", what);
    const int n = gguf_n_tensors(a);
    for (int i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(a, i), *u = gguf_tensor_find(b, t->name);
        cr_assert_not_null(u, "%s: %s absent", what, t->name);
        cr_assert(u->type == t->type && u->bytes == t->bytes, "%s: %s: ringlm %s, llama.cpp %s",
                  what, t->name, gguf_type_name(u->type), gguf_type_name(t->type));
        if (memcmp(u->data, t->data, t->bytes) != 0) {
            uint64_t at = 0;
            while (((const unsigned char *)u->data)[at] == ((const unsigned char *)t->data)[at])
                at++;
            cr_assert_fail("%s: %s (%s): bytes differ from llama.cpp's from byte %llu of %llu",
                           what, t->name, gguf_type_name(t->type), (unsigned long long)at,
                           (unsigned long long)t->bytes);
        }
    }
    uint64_t ft_a = 0, ft_b = 1;
    gguf_get_u64(a, "general.file_type", &ft_a);
    gguf_get_u64(b, "general.file_type", &ft_b);
    cr_assert_eq(ft_a, ft_b, "%s: general.file_type", what);
    gguf_close(a);
    gguf_close(b);
    return n;
}

#endif
