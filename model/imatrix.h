/* SPDX-License-Identifier: MIT */
/*
 * model/imatrix.h — an importance matrix as llama-imatrix writes it, read as llama-quantize
 * --imatrix reads it (tools/quantize: load_imatrix): for each weight matrix, the mean of its
 * input's squared activations per column, which the quantizers weight their errors by.
 *
 *   GGUF form (llama.cpp since mid-2025): tensors "<weight>.in_sum2" (F32, ne0 columns x
 *     experts) and "<weight>.counts" (F32, one per expert), keys imatrix.datasets,
 *     imatrix.chunk_count, imatrix.chunk_size (llama-quantize refuses a file without them);
 *     a column's weight is in_sum2 / count of its expert, 1 where the count is 0.
 *   legacy .dat: i32 entries, then per entry i32 name length, the name, i32 ncall, i32 nval,
 *     nval f32 (sums already divided by their count, times ncall); then optionally i32 chunk
 *     count, i32 length and the dataset name. A weight is the value / ncall (ncall > 0).
 *
 * Refused naming the file and the entry: a truncated file, an in_sum2 without its counts (or
 * the reverse), a size that is not whole experts, a value that is not finite.
 * Errors: 0 or a negative errno with imx_errmsg().
 */
#ifndef RINGLM_MODEL_IMATRIX_H
#define RINGLM_MODEL_IMATRIX_H

#include <stddef.h>

typedef struct imx_entry {
    char *name;     /* the weight's tensor name ("blk.0.attn_q.weight") */
    float *weights; /* n of them: ne0 per expert, experts one after another */
    size_t n;
} imx_entry;

typedef struct imx {
    imx_entry *e; /* sorted by name */
    size_t n;
} imx;

int imx_load(const char *path, imx **out);
/* The entry of tensor name, or NULL. */
const imx_entry *imx_find(const imx *m, const char *name);
void imx_free(imx *m);
const char *imx_errmsg(void);

#endif
