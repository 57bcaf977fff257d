/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/cuda_kernels.cuh — the device kernels of the CUDA backend and their host
 * launchers (kernels/cuda/cuda_kernels.cu). Internal to the plugin.
 *
 * Every launcher returns the cudaError_t of cudaGetLastError() right after the launch, so
 * the caller can name the kernel that failed. Activations that feed a GEMM ("act") have the
 * weights' device type (act_type: bf16 by default, f16 for a GGUF file whose matrices are
 * all F16, fp32 in fp32 mode); the KV pool is bf16 (fp32 in fp32 mode); the residual stream,
 * the GEMM outputs, the softmax and every reduction are fp32.
 */
#ifndef RINGLM_KERNELS_CUDA_KERNELS_CUH
#define RINGLM_KERNELS_CUDA_KERNELS_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* Attention tiling: a thread block handles one tile of consecutive query rows of one
 * sequence for one KV head (all query heads of the group), walking the keys in chunks of
 * CK_ATT_BK through shared memory. At most CK_ATT_MAXP (row, head) pairs per tile. */
#define CK_ATT_THREADS 128
#define CK_ATT_WARPS (CK_ATT_THREADS / 32)
#define CK_ATT_BK 32
#define CK_ATT_MAXP 32
/* Split-K for one-row (decode) tiles: a row's keys are cut into at most CK_MAX_SPLIT
 * chunks of at least CK_SPLIT_MIN_KEYS keys. The cut depends only on the row's context
 * length, never on the batch, so a sequence gets the same arithmetic alone or batched. */
#define CK_MAX_SPLIT 32
#define CK_SPLIT_MIN_KEYS 64
/* Largest head_size the attention kernel supports (8 fp32 accumulators per lane). */
#define CK_MAX_HEAD_SIZE 256

/* Host and device: the split a one-row tile with ctx keys uses. */
static inline __host__ __device__ int ck_split_chunk(int ctx)
{
    int per = (ctx + CK_MAX_SPLIT - 1) / CK_MAX_SPLIT;
    per = (per + CK_ATT_BK - 1) / CK_ATT_BK * CK_ATT_BK;
    return per < CK_SPLIT_MIN_KEYS ? CK_SPLIT_MIN_KEYS : per;
}
static inline __host__ __device__ int ck_split_count(int ctx)
{
    if (ctx <= 0)
        return 1;
    int chunk = ck_split_chunk(ctx);
    return (ctx + chunk - 1) / chunk;
}

/* splitmix64 and the synthetic-weight formula of kernels/engine.h, usable on both sides
 * (the host copy lets a test compare it with eng_synth_value without a device). */
static inline __host__ __device__ uint64_t ck_splitmix64(uint64_t x)
{
    uint64_t z = x + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline __host__ __device__ float ck_synth_value(uint64_t seed, int tensor_id,
                                                       uint64_t index, float scale, bool is_norm)
{
    uint64_t u = ck_splitmix64(seed ^ ((uint64_t)tensor_id << 56) ^ index);
    float unit = (float)(u >> 40) * (1.0f / 16777216.0f); /* [0, 1), 24 bits: exact */
#ifdef __CUDA_ARCH__
    /* The _rn intrinsics are never contracted into an fma, so the bits equal the host's
     * eng_synth_value (whose volatile keeps gcc from contracting too). */
    float val = __fmul_rn(__fsub_rn(__fmul_rn(unit, 2.0f), 1.0f), scale);
    return is_norm ? __fadd_rn(1.0f, val) : val;
#else
    volatile float val = (unit * 2.0f - 1.0f) * scale;
    return is_norm ? 1.0f + val : val;
#endif
}

/* Element types of weights and GEMM-input activations (act_type). */
enum { CK_F32 = 0, CK_BF16 = 1, CK_F16 = 2 };

/* Geometry the kernels need. */
typedef struct ck_geom {
    int dim, hidden, n_layers, n_heads, n_kv_heads, head_size, kv_dim, vocab;
    int block_size;        /* tokens per KV block */
    int bt_stride;         /* device block-table row length */
    long long block_elems; /* elements per KV block (all layers, K and V) */
    int act_type;          /* CK_BF16, CK_F16 or CK_F32: weights and GEMM inputs */
    int kv_bf16;           /* 1: the KV pool is bf16; 0: fp32 */
    float norm_eps;        /* RMSNorm epsilon */
    int rope_dim;          /* leading dimensions of each head that RoPE rotates (even) */
    int rope_neox;         /* 1: pairs (j, j + rope_dim/2) (qwen2); 0: (2j, 2j+1) */
    const float *rope_freq; /* device [rope_dim/2]: eng_dev_rope_freqs */
} ck_geom;

/* Device metadata of one batch (fixed device addresses, so CUDA graphs can replay). */
typedef struct ck_meta {
    const int32_t *tokens;      /* [T] */
    const int32_t *positions;   /* [T] (-1 for graph padding rows) */
    const int64_t *slots;       /* [T] (-1: do not write K/V) */
    const int32_t *block_table; /* [S][bt_stride] */
    const int32_t *logits_rows; /* [n_logits] */
    const int32_t *tile_seq;    /* [n_tiles] */
    const int32_t *tile_row0;   /* [n_tiles] */
    const int32_t *tile_nrows;  /* [n_tiles] */
    const int32_t *tile_dslot;  /* [n_tiles] split slot (< max_seqs) or -1: no split */
} ck_meta;

cudaError_t ck_synth_fill(cudaStream_t st, void *dst, int dst_bf16, uint64_t n, uint64_t seed,
                          int tensor_id, uint64_t index0, float scale, bool is_norm);
cudaError_t ck_convert_f32(cudaStream_t st, void *dst, int dst_bf16, const float *src,
                           uint64_t n);
cudaError_t ck_fill_pattern(cudaStream_t st, void *dst, uint64_t n_bytes, uint32_t seed);
cudaError_t ck_embed(cudaStream_t st, const ck_geom *g, const void *emb, const ck_meta *m,
                     float *x, int T);
/* out[r] = act(w * x[rows ? rows[r] : r] / rms); rows may be NULL. */
cudaError_t ck_rmsnorm(cudaStream_t st, const ck_geom *g, const float *x, const int32_t *rows,
                       const float *w, void *out, int n_rows);
/* Adds bias (this layer's [dim + 2 kv_dim], or NULL) to q, k, v, rotates q and k, writes q
 * (fp32) and K, V into the pool at each row's slot. */
cudaError_t ck_rope_append(cudaStream_t st, const ck_geom *g, const ck_meta *m,
                           const float *qkv, const float *bias, float *q, void *kv_pool,
                           int layer, int T);
cudaError_t ck_attention(cudaStream_t st, const ck_geom *g, const ck_meta *m, const float *q,
                         const void *kv_pool, void *att, float *part_acc, float *part_ml,
                         int layer, int n_tiles, int z_splits);
cudaError_t ck_attention_combine(cudaStream_t st, const ck_geom *g, const ck_meta *m,
                                 const float *part_acc, const float *part_ml, void *att,
                                 int n_tiles);
cudaError_t ck_swiglu(cudaStream_t st, const ck_geom *g, const float *gu, void *hb, int T);
/* Shared memory the attention kernel asks for; the backend raises the kernel's limit. */
size_t ck_attention_smem_bytes(int head_size);
cudaError_t ck_attention_prepare(int head_size, int kv_bf16);

/* Skinny GEMM for decode (T <= CK_GEMV_MAX_T rows, bf16 W [N][K] and X [T][K], K % 8 == 0):
 * Y[T][N] = X · W^T + beta · Y in fp32, one warp per output column n, 16-byte weight loads.
 * An alternative to cuBLAS for batch-1..8 decode (RINGLM_CUDA_GEMV=1 / the bench's A/B). */
#define CK_GEMV_MAX_T 8
cudaError_t ck_gemv_bf16(cudaStream_t st, const void *W, const void *X, float *Y, int N, int T,
                         int K, float beta);

/* Sampling (semantics of eng_sample), one row per block. Per row: temperature (<= 0 or NaN:
 * greedy), top_k (0 off), top_p (<= 0 or >= 1 off), rng state (advanced once per sampled
 * token). ck_sample_prepare writes the ids of greedy and untruncated rows, and probs, ids
 * and the coin of every sampled row; ck_sample_sorted sorts (prob desc, id asc) per row and
 * picks the top-k / top-p rows. offsets[i] = i * vocab for i <= n_rows. */
cudaError_t ck_sample_prepare(cudaStream_t st, const float *logits, int vocab, int n_rows,
                              const float *temperature, const int32_t *top_k, const float *top_p,
                              uint64_t *rng, float *probs, int32_t *ids, float *coins,
                              int32_t *out_tokens);
cudaError_t ck_sort_bytes(int vocab, int n_rows, const int32_t *offsets, size_t *bytes);
cudaError_t ck_sample_sorted(cudaStream_t st, void *tmp, size_t tmp_bytes,
                             const int32_t *offsets, float *probs, int32_t *ids,
                             float *probs_sorted, int32_t *ids_sorted, int vocab, int n_rows,
                             const float *temperature, const int32_t *top_k, const float *top_p,
                             const float *coins, int32_t *out_tokens);

#endif
