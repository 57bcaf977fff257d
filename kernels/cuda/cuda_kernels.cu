/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/cuda_kernels.cu — device kernels of the CUDA backend: weight generation and
 * conversion, embedding, RMSNorm, RoPE + KV append, paged attention (decode and prefill
 * tiles, split-K), SwiGLU, and on-device sampling. The math mirrors the CPU backend and
 * llama2.c's run.c step by step (the RoPE frequencies of the CPU's table, the model's
 * RMSNorm epsilon, softmax after the max); only the storage of weights, activations and KV
 * (bf16, or f16 weights and activations for all-F16 GGUF files) differs.
 */
#include "kernels/cuda/cuda_kernels.cuh"

#include <cub/device/device_segmented_sort.cuh>
#include <limits.h>
#include <math.h>

#define FULL_MASK 0xffffffffu

/* ---- small helpers ------------------------------------------------------------------- */

/* t: CK_F32, CK_BF16 or CK_F16 (a 0/1 "bf16" flag reads the same). */
static __device__ __forceinline__ float ld_act(const void *p, size_t i, int t)
{
    if (t == CK_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (t == CK_F16)
        return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

static __device__ __forceinline__ void st_act(void *p, size_t i, float v, int t)
{
    if (t == CK_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
    else if (t == CK_F16)
        ((__half *)p)[i] = __float2half_rn(v);
    else
        ((float *)p)[i] = v;
}

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. */
static __device__ float block_sum(float v)
{
    __shared__ float part[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* an earlier call may still be reading part/total */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nwarps ? part[lane] : 0.0f;
        w = warp_sum(w);
        if (lane == 0)
            total = w;
    }
    __syncthreads();
    return total;
}

static __device__ double block_sum_d(double v)
{
    __shared__ double part[32];
    __shared__ double total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, o);
    __syncthreads();
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double w = lane < nwarps ? part[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1)
            w += __shfl_xor_sync(FULL_MASK, w, o);
        if (lane == 0)
            total = w;
    }
    __syncthreads();
    return total;
}

/* Inclusive scan of one double per thread over the block, plus the block total. */
static __device__ double block_scan_d(double v, double *total_out)
{
    __shared__ double part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        double n = __shfl_up_sync(FULL_MASK, v, o);
        if (lane >= o)
            v += n;
    }
    __syncthreads();
    if (lane == 31)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double w = lane < nwarps ? part[lane] : 0.0;
        for (int o = 1; o < 32; o <<= 1) {
            double n = __shfl_up_sync(FULL_MASK, w, o);
            if (lane >= o)
                w += n;
        }
        part[lane] = w; /* inclusive prefix of warp totals */
    }
    __syncthreads();
    if (warp > 0)
        v += part[warp - 1];
    *total_out = part[nwarps - 1];
    return v;
}

/* ---- weights ------------------------------------------------------------------------- */

static __global__ void synth_fill_kernel(void *dst, int dst_bf16, uint64_t n, uint64_t seed,
                                         int tensor_id, uint64_t index0, float scale, bool is_norm)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        st_act(dst, i, ck_synth_value(seed, tensor_id, index0 + i, scale, is_norm), dst_bf16);
}

cudaError_t ck_synth_fill(cudaStream_t st, void *dst, int dst_bf16, uint64_t n, uint64_t seed,
                          int tensor_id, uint64_t index0, float scale, bool is_norm)
{
    if (n == 0)
        return cudaSuccess;
    uint64_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    synth_fill_kernel<<<(unsigned)blocks, 256, 0, st>>>(dst, dst_bf16, n, seed, tensor_id, index0,
                                                         scale, is_norm);
    return cudaGetLastError();
}

static __global__ void convert_kernel(void *dst, int dst_bf16, const float *src, uint64_t n)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        st_act(dst, i, src[i], dst_bf16);
}

cudaError_t ck_convert_f32(cudaStream_t st, void *dst, int dst_bf16, const float *src, uint64_t n)
{
    if (n == 0)
        return cudaSuccess;
    uint64_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    convert_kernel<<<(unsigned)blocks, 256, 0, st>>>(dst, dst_bf16, src, n);
    return cudaGetLastError();
}

static __global__ void fill_pattern_kernel(uint32_t *dst, uint64_t n_words, uint32_t seed)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n_words;
         i += (uint64_t)gridDim.x * blockDim.x)
        dst[i] = (uint32_t)ck_splitmix64(seed ^ i) | 1u; /* never all-zero words */
}

cudaError_t ck_fill_pattern(cudaStream_t st, void *dst, uint64_t n_bytes, uint32_t seed)
{
    uint64_t n = n_bytes / 4;
    if (n == 0)
        return cudaSuccess;
    uint64_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    fill_pattern_kernel<<<(unsigned)blocks, 256, 0, st>>>((uint32_t *)dst, n, seed);
    return cudaGetLastError();
}

/* ---- embedding, RMSNorm, SwiGLU ------------------------------------------------------ */

static __global__ void embed_kernel(const void *emb, int act, const int32_t *tokens, float *x,
                                    int dim)
{
    const int row = blockIdx.x;
    const size_t src = (size_t)tokens[row] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        x[(size_t)row * dim + i] = ld_act(emb, src + i, act);
}

cudaError_t ck_embed(cudaStream_t st, const ck_geom *g, const void *emb, const ck_meta *m,
                     float *x, int T)
{
    embed_kernel<<<T, 256, 0, st>>>(emb, g->act_type, m->tokens, x, g->dim);
    return cudaGetLastError();
}

/* As run.c: ss = mean(x^2) + eps (1e-5, or the file's); out = w * (x / sqrt(ss)). */
static __global__ void __launch_bounds__(1024) rmsnorm_kernel(const float *x, const int32_t *rows, const float *w,
                                      void *out, int act, int dim, float eps)
{
    const int row = blockIdx.x;
    const float *xr = x + (size_t)(rows ? rows[row] : row) * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_sum(ss);
    ss = ss / (float)dim + eps;
    const float inv = 1.0f / sqrtf(ss);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        st_act(out, (size_t)row * dim + i, w[i] * (inv * xr[i]), act);
}

cudaError_t ck_rmsnorm(cudaStream_t st, const ck_geom *g, const float *x, const int32_t *rows,
                       const float *w, void *out, int n_rows)
{
    if (n_rows <= 0)
        return cudaSuccess;
    int threads = g->dim >= 1024 ? 1024 : (g->dim + 31) / 32 * 32;
    rmsnorm_kernel<<<n_rows, threads, 0, st>>>(x, rows, w, out, g->act_type, g->dim,
                                               g->norm_eps);
    return cudaGetLastError();
}

/* gu rows are [gate (hidden) | up (hidden)] (the fused w1/w3 GEMM). */
static __global__ void swiglu_kernel(const float *gu, void *hb, int act, int hidden,
                                     uint64_t n)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / (uint64_t)hidden, j = i % (uint64_t)hidden;
        float gate = gu[r * 2 * hidden + j], up = gu[r * 2 * hidden + hidden + j];
        float val = gate * (1.0f / (1.0f + expf(-gate)));
        st_act(hb, i, val * up, act);
    }
}

cudaError_t ck_swiglu(cudaStream_t st, const ck_geom *g, const float *gu, void *hb, int T)
{
    uint64_t n = (uint64_t)T * (uint64_t)g->hidden;
    uint64_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    swiglu_kernel<<<(unsigned)blocks, 256, 0, st>>>(gu, hb, g->act_type, g->hidden, n);
    return cudaGetLastError();
}

/* ---- RoPE + KV append ---------------------------------------------------------------- */

/* KV block layout (elements): [layer][K=0|V=1][kv_head][block_size][head_size], so one
 * (layer, head) of a block is a contiguous block_size*head_size run the attention kernel
 * reads in one sweep. */
static __device__ __forceinline__ size_t kv_index(const ck_geom &g, int64_t slot, int layer,
                                                  int which, int kvh, int d)
{
    const int64_t blk = slot / g.block_size;
    const int off = (int)(slot - blk * g.block_size);
    return (size_t)blk * (size_t)g.block_elems +
           ((((size_t)layer * 2 + which) * g.n_kv_heads + kvh) * g.block_size + off) *
               (size_t)g.head_size +
           d;
}

/* Adds the Q/K/V bias (when given), rotates q (all dim entries) and k (kv_dim entries) as
 * the CPU backend does: in each head, the first rope_dim dimensions in pairs (2j, 2j+1), or
 * (j, j + rope_dim/2) for NEOX (qwen2), by angle = pos * rope_freq[j]; the dimensions past
 * rope_dim unchanged. Writes q (fp32) and K, V into the pool at the row's slot. One thread
 * per element: it reads its pair partner and computes its own half of the rotation. */
static __global__ void rope_append_kernel(ck_geom g, const int32_t *positions,
                                          const int64_t *slots, const float *qkv,
                                          const float *bias, float *q, void *pool, int layer)
{
    const int row = blockIdx.x;
    const int pos = positions[row];
    const int64_t slot = slots[row];
    const int n_out = g.dim + 2 * g.kv_dim;
    const float *src = qkv + (size_t)row * n_out;
    const int rh = g.rope_dim / 2;
    for (int i = threadIdx.x; i < g.dim + g.kv_dim; i += blockDim.x) {
        const bool is_q = i < g.dim;
        const int e = is_q ? i : i - g.dim; /* within q or k */
        const int head_dim = e % g.head_size, h0 = e - head_dim;
        float out = src[i] + (bias ? bias[i] : 0.0f);
        if (head_dim < g.rope_dim) {
            int j, partner;
            bool first;
            if (g.rope_neox) {
                first = head_dim < rh;
                j = first ? head_dim : head_dim - rh;
                partner = first ? head_dim + rh : head_dim - rh;
            } else {
                first = head_dim % 2 == 0;
                j = head_dim / 2;
                partner = first ? head_dim + 1 : head_dim - 1;
            }
            const int pi = (is_q ? 0 : g.dim) + h0 + partner;
            const float other = src[pi] + (bias ? bias[pi] : 0.0f);
            const float val = pos * g.rope_freq[j];
            const float fcr = cosf(val), fci = sinf(val);
            /* the CPU's v[a] = v0 cos - v1 sin, v[b] = v0 sin + v1 cos (v0 = v[a], v1 = v[b]) */
            out = first ? out * fcr - other * fci : other * fci + out * fcr;
        }
        if (is_q) {
            q[(size_t)row * g.dim + e] = out;
        } else if (slot >= 0) {
            const int kvh = e / g.head_size;
            st_act(pool, kv_index(g, slot, layer, 0, kvh, head_dim), out, g.kv_bf16);
        }
    }
    if (slot < 0)
        return;
    for (int i = threadIdx.x; i < g.kv_dim; i += blockDim.x) {
        const int kvh = i / g.head_size, d = i % g.head_size;
        const int at = g.dim + g.kv_dim + i;
        st_act(pool, kv_index(g, slot, layer, 1, kvh, d), src[at] + (bias ? bias[at] : 0.0f),
               g.kv_bf16);
    }
}

cudaError_t ck_rope_append(cudaStream_t st, const ck_geom *g, const ck_meta *m,
                           const float *qkv, const float *bias, float *q, void *kv_pool,
                           int layer, int T)
{
    rope_append_kernel<<<T, 128, 0, st>>>(*g, m->positions, m->slots, qkv, bias, q, kv_pool,
                                          layer);
    return cudaGetLastError();
}

/* ---- paged attention ------------------------------------------------------------------ */

struct attn_args {
    ck_geom g;
    ck_meta m;
    const float *q;
    const void *pool;
    void *att;
    float *part_acc; /* [max_seqs][n_heads][CK_MAX_SPLIT][head_size] */
    float *part_ml;  /* [max_seqs][n_heads][CK_MAX_SPLIT][2] (running max, sum) */
    int layer;
    float sqrt_hs;
};

#define ATT_PPW (CK_ATT_MAXP / CK_ATT_WARPS) /* (row, head) pairs per warp */

size_t ck_attention_smem_bytes(int head_size)
{
    return sizeof(float) * ((size_t)CK_ATT_MAXP * head_size +
                            (size_t)CK_ATT_BK * (head_size + 1) + (size_t)CK_ATT_BK * head_size);
}

template <typename KVT> static __device__ __forceinline__ float2 ld2(const void *p, size_t i);
template <> __device__ __forceinline__ float2 ld2<__nv_bfloat16>(const void *p, size_t i)
{
    return __bfloat1622float2(*(const __nv_bfloat162 *)((const __nv_bfloat16 *)p + i));
}
template <> __device__ __forceinline__ float2 ld2<float>(const void *p, size_t i)
{
    return *(const float2 *)((const float *)p + i);
}

/*
 * One thread block = one tile (consecutive query rows of one sequence) x one KV head x one
 * split of the keys. Each warp owns up to ATT_PPW (row, query head) pairs of the tile and
 * keeps an online softmax (running max m, sum l, accumulator acc) for each in fp32. Keys
 * stream through shared memory CK_ATT_BK at a time, so every K/V byte is read once per
 * block for all query heads of the group. Causal: a row at position p sees keys 0..p.
 * NC = ceil(head_size / 32) accumulators per lane.
 */
template <int NC, typename KVT>
static __global__ void __launch_bounds__(CK_ATT_THREADS) attention_kernel(attn_args a)
{
    extern __shared__ float smem[];
    const ck_geom &g = a.g;
    const int hs = g.head_size;
    float *qs = smem;                             /* [MAXP][hs] */
    float *ks = qs + CK_ATT_MAXP * hs;            /* [BK][hs + 1], padded: lane-per-key reads */
    float *vs = ks + CK_ATT_BK * (hs + 1);        /* [BK][hs] */
    const int tile = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = g.n_heads / g.n_kv_heads;
    const int nrows = a.m.tile_nrows[tile], row0 = a.m.tile_row0[tile];
    const int seq = a.m.tile_seq[tile], dslot = a.m.tile_dslot[tile];
    const int ctx = a.m.positions[row0 + nrows - 1] + 1; /* 0 for graph padding rows */
    const int nsplit = dslot >= 0 ? ck_split_count(ctx) : 1;
    if (sp >= nsplit)
        return; /* whole block: this row needs fewer splits than the grid has */
    int kbeg = 0, kend = ctx;
    if (nsplit > 1) {
        const int chunk = ck_split_chunk(ctx);
        kbeg = sp * chunk;
        kend = min(ctx, kbeg + chunk);
    }
    const int npairs = nrows * G; /* <= CK_ATT_MAXP: the host cuts tiles so */
    for (int i = threadIdx.x; i < npairs * hs; i += blockDim.x) {
        const int p = i / hs, d = i - p * hs;
        const int row = row0 + p / G, h = kvh * G + p % G;
        qs[i] = a.q[(size_t)row * g.dim + (size_t)h * hs + d];
    }
    float acc[ATT_PPW][NC], m[ATT_PPW], l[ATT_PPW];
    int rpos[ATT_PPW];
#pragma unroll
    for (int pp = 0; pp < ATT_PPW; pp++) {
        m[pp] = -INFINITY;
        l[pp] = 0.0f;
        const int p = warp + pp * CK_ATT_WARPS;
        rpos[pp] = p < npairs ? a.m.positions[row0 + p / G] : -1;
#pragma unroll
        for (int c = 0; c < NC; c++)
            acc[pp][c] = 0.0f;
    }
    /* pairs of this warp: warp, warp + WARPS, ... below npairs */
    const int my_np = npairs > warp ? (npairs - warp + CK_ATT_WARPS - 1) / CK_ATT_WARPS : 0;
    const int32_t *bt = a.m.block_table + (size_t)seq * g.bt_stride;
    const size_t k_off = ((size_t)a.layer * 2 * g.n_kv_heads + kvh) * g.block_size * (size_t)hs;
    const size_t v_delta = (size_t)g.n_kv_heads * g.block_size * hs;
    for (int kt = kbeg; kt < kend; kt += CK_ATT_BK) {
        const int nk = min(CK_ATT_BK, kend - kt);
        __syncthreads(); /* the previous tile is consumed (and q is in place) */
        if (sizeof(KVT) == 2 && hs % 8 == 0) {
            /* 16-byte loads of 8 bf16 (aligned: every offset below is a multiple of 8) */
            for (int i = threadIdx.x; i < CK_ATT_BK * hs / 8; i += blockDim.x) {
                const int j = (8 * i) / hs, d = 8 * i - j * hs;
                uint4 kr = make_uint4(0, 0, 0, 0), vr = make_uint4(0, 0, 0, 0);
                if (j < nk) {
                    const int kp = kt + j;
                    const size_t blk = (size_t)bt[kp / g.block_size];
                    const size_t at = blk * (size_t)g.block_elems + k_off +
                                      (size_t)(kp % g.block_size) * hs + d;
                    kr = *(const uint4 *)((const __nv_bfloat16 *)a.pool + at);
                    vr = *(const uint4 *)((const __nv_bfloat16 *)a.pool + at + v_delta);
                }
                const __nv_bfloat162 *k2 = (const __nv_bfloat162 *)&kr;
                const __nv_bfloat162 *v2 = (const __nv_bfloat162 *)&vr;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 kf = __bfloat1622float2(k2[e]), vf = __bfloat1622float2(v2[e]);
                    ks[j * (hs + 1) + d + 2 * e] = kf.x;
                    ks[j * (hs + 1) + d + 2 * e + 1] = kf.y;
                    vs[j * hs + d + 2 * e] = vf.x;
                    vs[j * hs + d + 2 * e + 1] = vf.y;
                }
            }
        } else /* fp32 pool, or head_size not a multiple of 8: pairs */
        for (int i = threadIdx.x; i < CK_ATT_BK * hs / 2; i += blockDim.x) {
            const int j = (2 * i) / hs, d = 2 * i - j * hs; /* hs is even */
            float2 kk = make_float2(0.0f, 0.0f), vv = make_float2(0.0f, 0.0f);
            if (j < nk) {
                const int kp = kt + j;
                const size_t blk = (size_t)bt[kp / g.block_size];
                const size_t at = blk * (size_t)g.block_elems + k_off +
                                  (size_t)(kp % g.block_size) * hs + d;
                kk = ld2<KVT>(a.pool, at);
                vv = ld2<KVT>(a.pool, at + v_delta);
            }
            ks[j * (hs + 1) + d] = kk.x;
            ks[j * (hs + 1) + d + 1] = kk.y;
            vs[j * hs + d] = vv.x;
            vs[j * hs + d + 1] = vv.y;
        }
        __syncthreads();
        /* Scores of all this warp's pairs in one sweep over d: lane = key, so each K value
         * read from shared memory serves every pair (q reads are broadcasts). */
        float sc[ATT_PPW];
#pragma unroll
        for (int pp = 0; pp < ATT_PPW; pp++)
            sc[pp] = 0.0f;
        {
            const float *kr = ks + lane * (hs + 1);
            for (int d = 0; d < hs; d++) {
                const float kd = kr[d];
#pragma unroll
                for (int pp = 0; pp < ATT_PPW; pp++)
                    if (pp < my_np) /* uniform across the warp */
                        sc[pp] += qs[(warp + pp * CK_ATT_WARPS) * hs + d] * kd;
            }
        }
        /* Online softmax update per pair; pj = this lane's key weight (0 when masked). */
        float pj[ATT_PPW];
#pragma unroll
        for (int pp = 0; pp < ATT_PPW; pp++) {
            pj[pp] = 0.0f;
            if (pp < my_np) {
                const bool valid = lane < nk && kt + lane <= rpos[pp];
                const float s = valid ? sc[pp] / a.sqrt_hs : -INFINITY;
                const float mnew = fmaxf(m[pp], warp_max(s));
                if (mnew != -INFINITY) { /* uniform: a warp-wide max */
                    const float alpha = expf(m[pp] - mnew); /* 0 when m was -inf */
                    pj[pp] = valid ? expf(s - mnew) : 0.0f;
                    l[pp] = l[pp] * alpha + warp_sum(pj[pp]);
#pragma unroll
                    for (int c = 0; c < NC; c++)
                        acc[pp][c] *= alpha;
                    m[pp] = mnew;
                }
            }
        }
        /* acc += sum_j p_j v_j: each V value read once for all pairs. */
        for (int j = 0; j < nk; j++) {
            float v[NC];
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = lane + 32 * c;
                v[c] = d < hs ? vs[j * hs + d] : 0.0f;
            }
#pragma unroll
            for (int pp = 0; pp < ATT_PPW; pp++) {
                if (pp < my_np) {
                    const float pv = __shfl_sync(FULL_MASK, pj[pp], j);
#pragma unroll
                    for (int c = 0; c < NC; c++)
                        acc[pp][c] += pv * v[c];
                }
            }
        }
    }
#pragma unroll
    for (int pp = 0; pp < ATT_PPW; pp++) {
        const int p = warp + pp * CK_ATT_WARPS;
        if (p >= npairs)
            continue;
        const int row = row0 + p / G, h = kvh * G + p % G;
        if (nsplit == 1) {
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = lane + 32 * c;
                if (d < hs)
                    st_act(a.att, (size_t)row * g.dim + (size_t)h * hs + d,
                           l[pp] > 0.0f ? acc[pp][c] / l[pp] : 0.0f, g.act_type);
            }
        } else {
            const size_t idx = ((size_t)dslot * g.n_heads + h) * CK_MAX_SPLIT + sp;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = lane + 32 * c;
                if (d < hs)
                    a.part_acc[idx * hs + d] = acc[pp][c];
            }
            if (lane == 0) {
                a.part_ml[idx * 2] = m[pp];
                a.part_ml[idx * 2 + 1] = l[pp];
            }
        }
    }
}

template <int NC, typename KVT> static void *attention_fn(void)
{
    return (void *)attention_kernel<NC, KVT>;
}

static void *pick_attention(int head_size, int kv_bf16)
{
    const int nc = (head_size + 31) / 32;
    if (kv_bf16) {
        if (nc <= 1) return attention_fn<1, __nv_bfloat16>();
        if (nc <= 2) return attention_fn<2, __nv_bfloat16>();
        if (nc <= 4) return attention_fn<4, __nv_bfloat16>();
        return attention_fn<8, __nv_bfloat16>();
    }
    if (nc <= 1) return attention_fn<1, float>();
    if (nc <= 2) return attention_fn<2, float>();
    if (nc <= 4) return attention_fn<4, float>();
    return attention_fn<8, float>();
}

cudaError_t ck_attention_prepare(int head_size, int kv_bf16)
{
    if (head_size < 2 || head_size > CK_MAX_HEAD_SIZE || head_size % 2)
        return cudaErrorInvalidValue;
    return cudaFuncSetAttribute(pick_attention(head_size, kv_bf16),
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)ck_attention_smem_bytes(head_size));
}

cudaError_t ck_attention(cudaStream_t st, const ck_geom *g, const ck_meta *m, const float *q,
                         const void *kv_pool, void *att, float *part_acc, float *part_ml,
                         int layer, int n_tiles, int z_splits)
{
    attn_args a;
    a.g = *g;
    a.m = *m;
    a.q = q;
    a.pool = kv_pool;
    a.att = att;
    a.part_acc = part_acc;
    a.part_ml = part_ml;
    a.layer = layer;
    a.sqrt_hs = sqrtf((float)g->head_size);
    dim3 grid((unsigned)n_tiles, (unsigned)g->n_kv_heads, (unsigned)z_splits);
    void *args[] = {&a};
    return cudaLaunchKernel(pick_attention(g->head_size, g->kv_bf16), grid,
                            dim3(CK_ATT_THREADS), args, ck_attention_smem_bytes(g->head_size), st);
}

/* Merges the splits of one-row tiles: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s. */
static __global__ void attention_combine_kernel(ck_geom g, ck_meta m, const float *part_acc,
                                                const float *part_ml, void *att)
{
    const int tile = blockIdx.x, h = blockIdx.y;
    const int dslot = m.tile_dslot[tile];
    if (dslot < 0)
        return;
    const int row = m.tile_row0[tile];
    const int ns = ck_split_count(m.positions[row] + 1);
    if (ns <= 1)
        return;
    const size_t idx0 = ((size_t)dslot * g.n_heads + h) * CK_MAX_SPLIT;
    float M = -INFINITY;
    for (int s = 0; s < ns; s++)
        M = fmaxf(M, part_ml[(idx0 + s) * 2]);
    float L = 0.0f;
    for (int s = 0; s < ns; s++) {
        const float ms = part_ml[(idx0 + s) * 2];
        L += (ms == -INFINITY ? 0.0f : expf(ms - M)) * part_ml[(idx0 + s) * 2 + 1];
    }
    for (int d = threadIdx.x; d < g.head_size; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < ns; s++) {
            const float ms = part_ml[(idx0 + s) * 2];
            if (ms != -INFINITY)
                o += expf(ms - M) * part_acc[(idx0 + s) * g.head_size + d];
        }
        st_act(att, (size_t)row * g.dim + (size_t)h * g.head_size + d, L > 0.0f ? o / L : 0.0f,
               g.act_type);
    }
}

cudaError_t ck_attention_combine(cudaStream_t st, const ck_geom *g, const ck_meta *m,
                                 const float *part_acc, const float *part_ml, void *att,
                                 int n_tiles)
{
    dim3 grid((unsigned)n_tiles, (unsigned)g->n_heads);
    attention_combine_kernel<<<grid, 64, 0, st>>>(*g, *m, part_acc, part_ml, att);
    return cudaGetLastError();
}

/* ---- skinny GEMM (decode) --------------------------------------------------------------- */

template <int TT>
static __global__ void __launch_bounds__(256) gemv_bf16_kernel(const __nv_bfloat16 *W,
                                                               const __nv_bfloat16 *X, float *Y,
                                                               int N, int K, float beta)
{
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (n >= N)
        return; /* whole warp */
    const __nv_bfloat16 *w = W + (size_t)n * K;
    float dot[TT];
#pragma unroll
    for (int t = 0; t < TT; t++)
        dot[t] = 0.0f;
#pragma unroll 4
    for (int k = lane * 8; k < K; k += 32 * 8) {
        const uint4 wv = *(const uint4 *)(w + k); /* K % 8 == 0: 16-byte aligned */
        const __nv_bfloat162 *w2 = (const __nv_bfloat162 *)&wv;
        float wf[8];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 f = __bfloat1622float2(w2[e]);
            wf[2 * e] = f.x;
            wf[2 * e + 1] = f.y;
        }
#pragma unroll
        for (int t = 0; t < TT; t++) {
            const uint4 xv = *(const uint4 *)(X + (size_t)t * K + k);
            const __nv_bfloat162 *x2 = (const __nv_bfloat162 *)&xv;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 f = __bfloat1622float2(x2[e]);
                dot[t] += wf[2 * e] * f.x + wf[2 * e + 1] * f.y;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        const float v = warp_sum(dot[t]);
        if (lane == 0) {
            float *y = Y + (size_t)t * N + n;
            *y = beta != 0.0f ? v + beta * *y : v;
        }
    }
}

cudaError_t ck_gemv_bf16(cudaStream_t st, const void *W, const void *X, float *Y, int N, int T,
                         int K, float beta)
{
    if (T < 1 || T > CK_GEMV_MAX_T || K % 8 != 0)
        return cudaErrorInvalidValue;
    const dim3 grid((unsigned)((N + 7) / 8)), block(256); /* 8 warps = 8 columns per block */
    const __nv_bfloat16 *w = (const __nv_bfloat16 *)W, *x = (const __nv_bfloat16 *)X;
    switch (T) { /* one instantiation per row count: the weights are read exactly once */
    case 1: gemv_bf16_kernel<1><<<grid, block, 0, st>>>(w, x, Y, N, K, beta); break;
    case 2: gemv_bf16_kernel<2><<<grid, block, 0, st>>>(w, x, Y, N, K, beta); break;
    case 3: gemv_bf16_kernel<3><<<grid, block, 0, st>>>(w, x, Y, N, K, beta); break;
    case 4: gemv_bf16_kernel<4><<<grid, block, 0, st>>>(w, x, Y, N, K, beta); break;
    case 5: gemv_bf16_kernel<5><<<grid, block, 0, st>>>(w, x, Y, N, K, beta); break;
    case 6: gemv_bf16_kernel<6><<<grid, block, 0, st>>>(w, x, Y, N, K, beta); break;
    case 7: gemv_bf16_kernel<7><<<grid, block, 0, st>>>(w, x, Y, N, K, beta); break;
    default: gemv_bf16_kernel<8><<<grid, block, 0, st>>>(w, x, Y, N, K, beta); break;
    }
    return cudaGetLastError();
}

/* ---- sampling -------------------------------------------------------------------------- */

/* The same semantics as eng_sample (kernels/sample.c): greedy = argmax, first index wins
 * ties; otherwise one xorshift64* draw per sampled token, probabilities exp((l - max) / T),
 * top-k then top-p on the (prob desc, id asc) order, and the pick is the first token whose
 * cumulative probability exceeds coin * kept mass. Sums are in double (summed in a tree
 * here, in sequence on the host: equal up to the last bits). */
#define SAMPLE_THREADS 1024

static __device__ __forceinline__ bool needs_sort(int vocab, int top_k, float top_p)
{
    return (top_k > 0 && top_k < vocab) || (top_p > 0.0f && top_p < 1.0f);
}

static __device__ __forceinline__ bool is_greedy(float t)
{
    return !(t > 0.0f); /* <= 0 or NaN */
}

/* First index i < n (in the given order) whose inclusive cumulative sum exceeds target;
 * -1 if none. *cum_out gets the cumulative sum at that index (or the total). */
static __device__ int block_first_exceed(const float *p, int n, double target, double *cum_out)
{
    __shared__ int found;
    __shared__ double found_cum;
    double base = 0.0;
    for (int c0 = 0; c0 < n; c0 += blockDim.x) {
        const int j = c0 + threadIdx.x;
        double total;
        const double cum = base + block_scan_d(j < n ? (double)p[j] : 0.0, &total);
        if (threadIdx.x == 0)
            found = INT_MAX;
        __syncthreads();
        if (j < n && cum > target)
            atomicMin(&found, j);
        __syncthreads();
        const int f = found;
        if (f != INT_MAX) {
            if (j == f)
                found_cum = cum;
            __syncthreads();
            *cum_out = found_cum;
            return f;
        }
        base += total;
        __syncthreads();
    }
    *cum_out = base;
    return -1;
}

static __global__ void __launch_bounds__(SAMPLE_THREADS) sample_prepare_kernel(const float *logits, int vocab,
                                             const float *temperature, const int32_t *top_k,
                                             const float *top_p, uint64_t *rng, float *probs,
                                             int32_t *ids, float *coins, int32_t *out_tokens)
{
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    __shared__ float coin_sh;
    const int row = blockIdx.x;
    const float *lg = logits + (size_t)row * vocab;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (bi == INT_MAX || lg[i] > bv) { /* ascending i: strict > keeps the first max */
            bv = lg[i];
            bi = i;
        }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
        const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
        if (ov > bv || (ov == bv && oi < bi) || (bi == INT_MAX && oi != INT_MAX)) {
            bv = ov;
            bi = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < nwarps ? best_v[lane] : -INFINITY;
        bi = lane < nwarps ? best_i[lane] : INT_MAX;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
            const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
            if (ov > bv || (ov == bv && oi < bi) || (bi == INT_MAX && oi != INT_MAX)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            best_v[0] = bv;
            best_i[0] = bi == INT_MAX ? 0 : bi;
        }
    }
    __syncthreads();
    const float max = best_v[0];
    const int argmax = best_i[0];
    const float t = temperature[row];
    if (is_greedy(t)) {
        if (threadIdx.x == 0)
            out_tokens[row] = argmax;
        return;
    }
    if (threadIdx.x == 0) {
        uint64_t x = rng[row];
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        rng[row] = x;
        coin_sh = (float)((x * 0x2545F4914F6CDD1Dull) >> 40) * (1.0f / 16777216.0f);
        coins[row] = coin_sh;
    }
    __syncthreads();
    const float coin = coin_sh;
    float *pr = probs + (size_t)row * vocab;
    int32_t *ir = ids + (size_t)row * vocab;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        pr[i] = expf((lg[i] - max) / t);
        ir[i] = i;
    }
    __syncthreads();
    if (needs_sort(vocab, top_k[row], top_p[row]))
        return; /* picked by sample_sorted_kernel after the segmented sort */
    double sum = 0.0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        sum += pr[i];
    sum = block_sum_d(sum);
    double cum;
    const int f = block_first_exceed(pr, vocab, (double)coin * sum, &cum);
    if (threadIdx.x == 0)
        out_tokens[row] = f >= 0 ? f : vocab - 1;
}

static __global__ void __launch_bounds__(SAMPLE_THREADS) sample_sorted_kernel(const float *probs_sorted, const int32_t *ids_sorted,
                                            int vocab, const float *temperature,
                                            const int32_t *top_k, const float *top_p,
                                            const float *coins, int32_t *out_tokens)
{
    const int row = blockIdx.x;
    if (is_greedy(temperature[row]) || !needs_sort(vocab, top_k[row], top_p[row]))
        return;
    const float *ps = probs_sorted + (size_t)row * vocab;
    const int32_t *is = ids_sorted + (size_t)row * vocab;
    const int k = top_k[row];
    const float p = top_p[row];
    int n = (k > 0 && k < vocab) ? k : vocab;
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        sum += ps[i];
    sum = block_sum_d(sum);
    if (p > 0.0f && p < 1.0f) {
        double cum;
        const int f = block_first_exceed(ps, n, (double)p * sum, &cum);
        if (f >= 0) {
            n = f + 1;
            sum = cum;
        }
    }
    double cum;
    const int f = block_first_exceed(ps, n, (double)coins[row] * sum, &cum);
    if (threadIdx.x == 0)
        out_tokens[row] = is[f >= 0 ? f : n - 1];
}

cudaError_t ck_sample_prepare(cudaStream_t st, const float *logits, int vocab, int n_rows,
                              const float *temperature, const int32_t *top_k, const float *top_p,
                              uint64_t *rng, float *probs, int32_t *ids, float *coins,
                              int32_t *out_tokens)
{
    if (n_rows <= 0)
        return cudaSuccess;
    sample_prepare_kernel<<<n_rows, SAMPLE_THREADS, 0, st>>>(
        logits, vocab, temperature, top_k, top_p, rng, probs, ids, coins, out_tokens);
    return cudaGetLastError();
}

cudaError_t ck_sort_bytes(int vocab, int n_rows, const int32_t *offsets, size_t *bytes)
{
    *bytes = 0;
    return cub::DeviceSegmentedSort::StableSortPairsDescending(
        (void *)NULL, *bytes, (const float *)NULL, (float *)NULL, (const int32_t *)NULL,
        (int32_t *)NULL, (int64_t)vocab * n_rows, (int64_t)n_rows, offsets, offsets + 1);
}

cudaError_t ck_sample_sorted(cudaStream_t st, void *tmp, size_t tmp_bytes,
                             const int32_t *offsets, float *probs, int32_t *ids,
                             float *probs_sorted, int32_t *ids_sorted, int vocab, int n_rows,
                             const float *temperature, const int32_t *top_k, const float *top_p,
                             const float *coins, int32_t *out_tokens)
{
    if (n_rows <= 0)
        return cudaSuccess;
    size_t need = 0;
    cudaError_t err = ck_sort_bytes(vocab, n_rows, offsets, &need);
    if (err != cudaSuccess)
        return err;
    if (need > tmp_bytes)
        return cudaErrorInvalidValue; /* scratch was sized for logits_cap rows */
    err = cub::DeviceSegmentedSort::StableSortPairsDescending(
        tmp, tmp_bytes, probs, probs_sorted, ids, ids_sorted, (int64_t)vocab * n_rows,
        (int64_t)n_rows, offsets, offsets + 1, st);
    if (err != cudaSuccess)
        return err;
    sample_sorted_kernel<<<n_rows, SAMPLE_THREADS, 0, st>>>(probs_sorted, ids_sorted, vocab,
                                                            temperature, top_k, top_p, coins,
                                                            out_tokens);
    return cudaGetLastError();
}
