/* SPDX-License-Identifier: MIT */
/*
 * kernels/devload.h — what a device backend (the CUDA plugin, kernels/cuda/) takes from a
 * model, in plain C that the CPU test suite runs (tests/test_cuda_gguf.c): the element type
 * each weight matrix gets on the device, the conversion of a matrix's rows from its file type
 * to that type, the RoPE frequency table, and the refusal at load, with a message naming the
 * tensor or the field, of what the device kernels cannot run.
 *
 * Device types (eng_dev_plan.dtype), for every weight matrix (embedding, classifier, each
 * layer's projections) and so for the GEMM inputs:
 *   F16   when every weight matrix of the file is F16: uploaded as it is, GEMMs in F16;
 *   BF16  otherwise: BF16 matrices uploaded as they are; F32, F16 (in a file that mixes
 *         types), Q8_0, Q4_K and Q6_K dequantized on the host with the CPU backend's own
 *         routine (q_dequant_row) and rounded to the nearest bf16 (ties to even);
 *   F32   the diagnostic mode (eng_options.cuda_dtype fp32): every matrix dequantized to float32.
 * Norm weights, Q/K/V biases and the RoPE factors stay float32.
 */
#ifndef RINGLM_KERNELS_DEVLOAD_H
#define RINGLM_KERNELS_DEVLOAD_H

#include "kernels/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Limits of the CUDA kernels (kernels/cuda/cuda_kernels.cuh checks that they agree). */
#define ENG_CUDA_MAX_HEAD_SIZE 256 /* attention: 8 fp32 accumulators per lane */
#define ENG_CUDA_MAX_GROUP     32  /* query heads per KV head in one attention tile */

typedef struct eng_dev_plan {
    int dtype;             /* ENG_W_BF16, ENG_W_F16 or ENG_W_F32 */
    bool lazy;             /* no host weights: generated on the device (synthetic:lazy:) */
    bool qkv_bias;         /* the layers carry Q/K/V biases (qwen2) */
    int n_mats[32];        /* weight matrices per file type (index: enum eng_wtype) */
    uint64_t weight_bytes; /* device bytes of the weight matrices (a tied classifier once) */
    char summary[192];     /* "Q4_K x 29, Q6_K x 7 -> BF16 (dequantized on the host at load)" */
} eng_dev_plan;

/*
 * Decides the device types and checks everything the CUDA kernels need: head size (even,
 * <= ENG_CUDA_MAX_HEAD_SIZE), query heads per KV head (<= ENG_CUDA_MAX_GROUP), RoPE
 * dimension (even, <= head size), RMSNorm epsilon and RoPE base (positive, finite), every
 * matrix present in a type it can convert (F32, F16, BF16, Q8_0, Q4_K, Q6_K) with rows of
 * whole blocks, norms present, Q/K/V biases all three or none per layer. t == NULL: a lazy
 * model (no host weights). fp32: the diagnostic mode. Errors: -ENOTSUP (a shape or type the
 * device cannot run) or -EINVAL (an inconsistent model), with eng_errmsg() naming the tensor
 * or field, what was found and what is supported.
 */
int eng_dev_plan_make(const eng_model_config *c, const eng_model_hparams *hp,
                      const eng_model_tensors *t, bool fp32, eng_dev_plan *out);
/* The same for a loaded model. */
int eng_dev_plan_model(const eng_model *m, bool fp32, eng_dev_plan *out);

/*
 * Converts rows [row0, row0 + n) of a weight matrix (k elements per row, in its file type
 * w.type) to dtype (ENG_W_F32, ENG_W_F16 or ENG_W_BF16) at dst, n * k elements: a copy of
 * the bytes when the types are equal, else q_dequant_row (the CPU backend's dequantization)
 * rounded to nearest even; a large conversion is split over up to 8 threads. tmp: scratch
 * for k floats. -EINVAL for another dtype, a type that cannot be converted or k not a whole
 * number of blocks.
 */
int eng_dev_convert_rows(eng_wmat w, int64_t k, int64_t row0, int64_t n, int dtype, void *dst,
                         float *tmp);

/* freq[j], j < rope_dim / 2: the rotation frequency of pair j exactly as the CPU backend
 * computes it (1 / theta^(2j / rope_dim), divided by freq_factors[j] when the file has Llama
 * 3.1's rope_freqs.weight); angle = position * freq[j] in float. */
void eng_dev_rope_freqs(const eng_model_hparams *hp, const float *freq_factors, float *freq);

#ifdef __cplusplus
}
#endif
#endif
