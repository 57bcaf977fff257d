/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/cpu.h — what the CPU backend's files share: its state (struct cpu), the
 * 8-float vector type and the AVX2/AVX-512 clone attribute of its hot loops, the KV pool
 * addressing, and the entry point of paged attention (attention.c) for the forward pass
 * (cpu.c). Private to kernels/cpu/: the engine reaches the backend through engine.h.
 */
#ifndef RINGLM_KERNELS_CPU_CPU_H
#define RINGLM_KERNELS_CPU_CPU_H

#include "kernels/cpu/pool.h"
#include "kernels/engine.h"

#include <stddef.h>
#include <stdint.h>

/* ---- backend state ------------------------------------------------------------------ */

/* Prefill rows of one sequence are attended in tiles: each K/V block is read (and K
 * transposed) once per tile rather than once per row. */
#define TILE_ROWS 32

typedef struct cpu {
    eng_model_config c;
    const eng_model_tensors *t;   /* typed per-layer weights (F32 or a GGUF file's types) */
    eng_model_hparams hp;         /* RMSNorm epsilon, RoPE base/dimension/pairing */
    int head_size, kv_dim, group; /* group = query heads per KV head */
    int q_dim;                    /* n_heads * head_size (dim unless the file says) */
    int block_size, n_blocks, max_rows;
    size_t block_floats; /* one block: L * 2 * block_size * kv_dim (global layers' only with
                            rings) */
    float *kv_pool;
    size_t kv_pool_bytes;
    /* Window rings (eng_options.kv_rings): the windowed layers' K/V, ring after ring, each
     * of ring_blocks blocks of ring_block_floats (W * 2 * block_size * kv_dim, W windowed
     * layers); layer_ring[l] says where layer l's K/V live, layer_idx[l] its index among
     * its kind (l itself without rings). Per batch, each sequence's ring as a block table
     * (ring_tables, [max_seqs][ring_stride]: logical block j → ring * ring_blocks + j mod
     * ring_blocks) and each row's slot in it (ring_slots). */
    int n_rings, ring_blocks, ring_stride;
    size_t ring_block_floats;
    float *ring_pool;
    size_t ring_pool_bytes;
    uint8_t *layer_ring;
    int *layer_idx;
    int32_t *ring_tables;
    int64_t *ring_slots;
    int numa_node;
    float *rope_cos, *rope_sin; /* [seq_len][head_size/2], computed exactly as run.c */
    /* windowed layers' own table where their RoPE base or scaling differs (gemma3), else
     * the same pointers as above */
    float *rope_cos_swa, *rope_sin_swa;
    float att_div; /* q·k is divided by it: sqrt(head_size), or 1 / the file's scale */
    /* a mixture of experts: router logits [rows][n_expert]; the rows routed to each expert
     * gathered expert after expert [rows * n_expert_used][dim], their SwiGLU
     * [rows * n_expert_used][expert_ff] twice, their outputs [rows * n_expert_used][dim];
     * each row's chosen experts and weights [rows][n_expert_used]; the gathered rows' (row,
     * slot)s as row * n_expert_used + slot; rows per expert [n_expert]; the experts' region
     * (cpu.c) */
    float *moe_logits, *moe_x, *moe_h1, *moe_h3, *moe_out, *moe_w;
    int *moe_e, *moe_rows, *moe_count;
    struct moe_work *moe;
    int window; /* the current layer's sliding window (0: none), set per layer */
    /* activations for up to max_rows rows */
    float *x, *xb, *q, *k, *v, *att, *h1, *h3, *xf;
    struct tile {
        int seq, row0, row1;
    } * tiles; /* attention work: runs of one sequence's rows */
    int n_tiles;
    int att_items, att_tasks; /* (tile, KV head) items of the attention region, its tasks */
    float *scores;            /* [n_workers][scores_per_worker] attention scratch */
    size_t scores_per_worker; /* cpu_attention_scratch */
    size_t scratch_bytes;
    /* the rows a region's matmuls read, quantized once for quantized weights (matmul_jobs):
     * one slot per distinct input of a region, grown as needed */
#define CPU_XQ_SLOTS 4
    void *xq_mem[CPU_XQ_SLOTS];
    size_t xq_cap[CPU_XQ_SLOTS];
    /* the same rows rounded to bf16 once for gemm_bf16's tiles, as many slots */
    uint16_t *xr_mem[CPU_XQ_SLOTS];
    size_t xr_cap[CPU_XQ_SLOTS];
    /* Rows rounded to bf16 by the pass that made them (a norm, the SwiGLU), for the next
     * region's products (cpu.c, xr_made): the first `rows` rows of x (k floats each) at xr,
     * or x NULL; matmul_jobs takes them and clears it. Two buffers: the gated product reads
     * the one its norm filled while it fills the other. */
    struct {
        const float *x;
        int k, rows;
        const uint16_t *xr;
    } xr_pre;
    uint16_t *xr_pre_mem[2];
    size_t xr_pre_cap[2];
    pool workers;
    eng_phase_stats stats;
    /* Prompt rows in BF16 tiles (eng_batch.prompt_len, eng_options.prompt_exact): whether
     * this engine takes them, and the batch reordered so that they come first, each part of
     * a sequence (its prompt rows, its generated rows) a sequence of its own (cpu.c,
     * order_prompt_rows); grown as batches need. */
    bool prompt_bf16;
    /* Prompt rows' attention with P·V in AVX-512 BF16 (attention_bf16.c), any weight type:
     * where the CPU has it, unless eng_options.prompt_exact or RINGLM_PREFILL_GEMM=own /
     * =blas; and how many first rows of the batch in c->b are prompt rows (order_prompt_rows
     * puts them first), set per batch */
    bool attn_bf16;
    int att_prompt_rows;
    struct {
        eng_batch b;
        int32_t *tokens, *positions, *query_start, *seq_len, *ring, *logits_rows, *block_table;
        int64_t *slots;
        int *where; /* [max_rows]: the reordered row of each row of the batch */
        size_t table_cap;
    } ord;
    /* Each layer's dense projections (wq, wk, wv, wo, w1, w2, w3: CPU_PACKED_MATS) that take
     * gemm_bf16's tiles, packed once at load into its panels (gemm_bf16_pack; NULL: not
     * packed, the product packs them itself), in one allocation of packed_bytes. */
#define CPU_PACKED_MATS 7
    const void *(*packed)[CPU_PACKED_MATS];
    /* Q4_K and Q6_K projections and classifier are packed instead for the products of up to
     * Q_PACKED_MAX_ROWS rows, 16 rows side by side (q_pack; decode); the classifier's here. */
    const void *packed_cls;
    void *packed_mem;
    size_t packed_bytes;
    size_t packed_k_bytes; /* of packed_bytes, the K types' (the report) */
    int packed_k_mats;     /* how many matrices those are, the classifier included */
    char pack_why[320];    /* where nothing was packed though it could be: why (the report) */
    /* the batch being executed (read by the tasks) */
    const eng_batch *b;
    int layer;
    /* the last layer's rows after its attention are the logits rows alone, every product in
     * gemm_bf16's tiles as the whole batch's would be (cpu.c, last_layer_tail) */
    bool tail_tiles;
} cpu;

/* ---- vector helpers ------------------------------------------------------------------ */

/* GCC vector types: the build targets baseline x86-64, and the hot loops are compiled
 * again for AVX2 and AVX-512 with target_clones (picked at load time). Vectors never cross
 * a function boundary outside those clones (that would change the ABI): helpers take
 * pointers and are always inlined. */
typedef float v8f __attribute__((vector_size(32), aligned(4))); /* unaligned loads allowed */
typedef int v8i __attribute__((vector_size(32)));

/* ThreadSanitizer builds get the baseline copy only: GCC instruments the ifunc resolver
 * target_clones generates, and it runs while the loader relocates, before the TSAN runtime
 * is up, so every program linking this file died before main (GCC 12). */
#if defined(__SANITIZE_THREAD__) || !(defined(__x86_64__) || defined(__i386__))
#define CPU_CLONES /* and off x86, where these arch names do not exist */
#else
#define CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

/*
 * x[0..8) = exp(x[0..8)), the Cephes single-precision exp: range reduction by ln 2, a
 * degree-5 polynomial, the power of two built in the exponent bits. Within ~1e-7 relative
 * of expf; arguments are clamped to [-87.3, 88.3] (no denormals, no overflow).
 */
static inline __attribute__((always_inline)) void exp8(float *xp)
{
    const v8f lo = {-87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f};
    const v8f hi = {88.3f, 88.3f, 88.3f, 88.3f, 88.3f, 88.3f, 88.3f, 88.3f};
    const v8f one = {1, 1, 1, 1, 1, 1, 1, 1};
    v8f x = *(const v8f *)xp;
    v8i below = x<lo, above = x> hi;
    x = (v8f)(((v8i)x & ~below) | ((v8i)lo & below));
    x = (v8f)(((v8i)x & ~above) | ((v8i)hi & above));
    v8f fx = x * 1.44269504088896341f + 0.5f;
    v8f fl = __builtin_convertvector(__builtin_convertvector(fx, v8i), v8f);
    fl -= (v8f)((v8i)(fl > fx) & (v8i)one); /* truncation → floor */
    x -= fl * 0.693359375f;
    x -= fl * -2.12194440e-4f;
    v8f y = x * 1.9875691500e-4f + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * (x * x) + x + 1.0f;
    *(v8f *)xp = y * (v8f)((__builtin_convertvector(fl, v8i) + 127) << 23);
}

/* ---- paged attention (attention.c) ------------------------------------------------- */

/* Where K (which 0) or V (1) of a token at offset of a block, for a layer, starts: a block
 * of the pool, or for a windowed layer with rings a block of the ring storage. */
static inline float *kv_at(const cpu *c, int block, int layer, int which, int offset)
{
    /* (a state without the layer maps, as the attention tests build: every layer in the
     * blocks) */
    const bool ring = c->layer_ring && c->layer_ring[layer];
    const size_t li = c->layer_idx ? (size_t)c->layer_idx[layer] : (size_t)layer;
    return (ring ? c->ring_pool : c->kv_pool) +
           (size_t)block * (ring ? c->ring_block_floats : c->block_floats) +
           ((li * 2 + (size_t)which) * (size_t)c->block_size + (size_t)offset) * (size_t)c->kv_dim;
}

/* Sequence seq's block table for the current layer: the batch's, or its ring's. */
static inline const int32_t *kv_table(const cpu *c, int seq)
{
    if (c->layer_ring && c->layer_ring[c->layer])
        return c->ring_tables + (size_t)seq * (size_t)c->ring_stride;
    return c->b->block_table + (size_t)seq * (size_t)c->b->block_table_stride;
}

/* Paged attention of the batch c->b at layer c->layer, for every tile of c->tiles and KV
 * head, on the pool: writes c->att. Prompt rows (the first c->att_prompt_rows rows of c->b,
 * and the rows below c->b->prompt_len) go through attention_bf16.c where c->attn_bf16. */
void cpu_attention(cpu *c);
/* Floats of scratch (c->scores) cpu_attention needs per worker, for c's shape (head_size,
 * group, block_size, c.seq_len). */
size_t cpu_attention_scratch(const cpu *c);

/* attention_bf16.c: query vectors qi0 .. qi0 + cpu_attention_bf16_lanes() - 1 of KV head kvh
 * of a tile of prompt rows (its rows times the group's query heads, row-major), P·V in
 * AVX-512 BF16 (x86-64 with gemm_bf16_supported() only, heads up to 512); scratch:
 * cpu_attention_bf16_scratch floats. */
void cpu_attend_block_bf16(const cpu *c, const struct tile *tl, int kvh, int qi0, float *scratch);
int cpu_attention_bf16_lanes(void);
size_t cpu_attention_bf16_scratch(int head_size);

#endif
