/* SPDX-License-Identifier: MIT */
/*
 * kernels/gguf_requant.h — a GGUF file re-quantized into another (ringlm-mkmodel --model
 * IN.gguf --format gguf --type T --out OUT.gguf): the same metadata and tensors, each weight
 * matrix dequantized and quantized again in the type llama.cpp's quantizer (llama-quantize,
 * src/llama-quant.cpp) chooses for it under the named mix.
 *
 * Mixes, as llama.cpp names its file types: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL
 * IQ4_XS Q2_K Q2_K_S Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K; and Q3_K, Q4_K, Q5_K
 * (every matrix in that type, as llama-quantize --pure). Per tensor, as llama.cpp: vectors,
 * norms and the MoE router stay as they are; output.weight (or token_embd.weight where the
 * classifier is tied to it) Q6_K unless the mix is Q8_0; attn_v (attn_qkv) and ffn_down take
 * more bits in some layers (use_more_bits: the first and last eighth, every third between),
 * attn_output in Q2_K and Q3_K_*; models of 8 experts keep attn_k and attn_v in Q8_0; rows
 * that are not whole blocks fall back (Q2_K/Q3_K to Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K
 * to Q8_0, IQ4_XS to IQ4_NL, then F16). With an importance matrix, as llama.cpp: the first
 * eighth of ffn_down stays IQ4_NL/IQ4_XS under those mixes, and is Q4_1/Q5_1 under Q4_0/Q5_0.
 * Rules keyed on the model's shape, as llama.cpp's: 4 or more query heads per KV head give
 * attn_v Q4_K under Q2_K and Q2_K_S, Q5_K under IQ4_NL and IQ4_XS; a model llama.cpp types
 * 70B (llama with grouped-query attention, or qwen2, of 80 layers) takes Q5_K for an attn_v
 * that would be Q3_K or Q4_K. Q2_K_S needs an importance matrix for its Q2_K matrices, as
 * llama.cpp's. The IQ1/IQ2/IQ3 mixes are refused by name (their lattice types are neither
 * written nor read here).
 */
#ifndef RINGLM_KERNELS_GGUF_REQUANT_H
#define RINGLM_KERNELS_GGUF_REQUANT_H

#include <stddef.h>

/* The type (ggml's numbering) the mix gives a tensor, or -1 for an unknown mix. The model's
 * shape: layers, the ratio of query to KV heads, experts (0 or 1: none), whether the
 * classifier is tied to the embedding. Exposed for the tests. */
typedef struct gw_mix_model {
    int n_layers, n_gqa, n_experts;
    int n_attn_v; /* attn_v / attn_qkv tensors in the file */
    int tied;
    int has_imatrix; /* quantized under an importance matrix (some rules differ) */
    int is_70b;      /* llama.cpp's 70B model type: attn_v in Q3_K or Q4_K becomes Q5_K */
} gw_mix_model;
/* `index`: the tensor's rank among the file's attn_v-like (or ffn_down) tensors in llama.cpp's
 * order (by layer, then name); in_type: its type in the input; n_dims, ne0 its shape. */
int gw_mix_type(const char *mix, const gw_mix_model *m, const char *name, int n_dims, long long ne0,
                int in_type, int index);

/* Re-quantizes in_path into out_path under `mix`. note (note_len bytes) gets the types
 * written, "Q4_K x 14, Q6_K x 5, ..." and any fallback. Returns 0 or a negative errno with
 * eng_errmsg() naming the file, key or tensor. */
int gw_requantize(const char *in_path, const char *out_path, const char *mix, char *note,
                  size_t note_len);
/* The same with llama-imatrix's importance matrix (model/imatrix.h; NULL: none), read as
 * llama-quantize --imatrix reads it: each matrix it has an entry for is quantized with its
 * per-column weights (every quantized type but Q8_0, which ggml quantizes without them), the
 * others without; and the mix takes llama.cpp's rules for a quantization with an imatrix.
 * An imatrix entry that names no matrix of the file, or whose size is not the matrix's
 * columns times its experts, is refused naming the entry. */
int gw_requantize_imatrix(const char *in_path, const char *out_path, const char *mix,
                          const char *imatrix_path, char *note, size_t note_len);

#endif
