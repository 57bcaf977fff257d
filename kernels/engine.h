/* SPDX-License-Identifier: MIT */
/*
 * kernels/engine.h — the backend-neutral inference engine (DESIGN.md §4, §8).
 *
 * One interface for every backend: the CPU backend (kernels/cpu/, plain C + OpenBLAS, the
 * reference) and the CUDA backend (kernels/cuda/, a plugin build/lib/libringlm_cuda.so that
 * is dlopen()ed when the backend "cuda" is asked for). The daemon, the tests and perf/
 * speak only this header.
 *
 * Lifecycle: eng_model_load → eng_create → (eng_execute | eng_execute_sample | KV copies)* →
 * eng_destroy → eng_model_free.  An engine is used by one thread at a time (the daemon's
 * loop thread); it may run its own worker threads inside eng_execute.
 *
 * Errors: functions return 0 or a negative errno; eng_errmsg() gives a thread-local detail
 * string naming the field and the expected value ("header n_heads=0: must be >= 1").
 */
#ifndef RINGLM_KERNELS_ENGINE_H
#define RINGLM_KERNELS_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------------------- */

/* The detail of the last error on this thread ("" when none). */
const char *eng_errmsg(void);
/* Sets the detail (printf-style); returns err so callers can `return eng_seterr(-EINVAL, …)`. */
int eng_seterr(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- models ------------------------------------------------------------------------- */

/* A Llama shape, as in the llama2.c checkpoint header. */
typedef struct eng_model_config {
    int dim;        /* model width */
    int hidden_dim; /* FFN width */
    int n_layers;
    int n_heads;            /* query heads; head_size = dim / n_heads */
    int n_kv_heads;         /* K/V heads (GQA when < n_heads); n_heads % n_kv_heads == 0 */
    int vocab_size;         /* always positive here; the file's sign is in shared_classifier */
    int seq_len;            /* maximum context */
    bool shared_classifier; /* classifier = token embedding table */
} eng_model_config;

/* What a GGUF file's metadata adds to the shape; llama2.c models and presets have
 * llama2.c's values (1e-5, 10000, head_size, adjacent pairs, F32). */
/* The architecture a GGUF file names (general.architecture); llama2.c models are llama. */
typedef enum eng_arch {
    ENG_ARCH_LLAMA = 0, /* "llama" (Llama 1-3, Mistral) */
    ENG_ARCH_QWEN2,     /* "qwen2": Q/K/V biases, NEOX RoPE */
    ENG_ARCH_QWEN3,     /* "qwen3": per-head RMSNorm of Q and K before RoPE, NEOX RoPE */
    ENG_ARCH_GEMMA2,    /* "gemma2": scaled embedding, GeGLU, norms after attention and FFN,
                           attention and final logit soft-capping, every other layer windowed */
    ENG_ARCH_GEMMA3,    /* "gemma3": gemma2 with per-head Q/K norms instead of soft-capping,
                           five windowed layers of six with their own RoPE base */
    ENG_ARCH_PHI3,      /* "phi3": fused QKV and gate/up, NEOX RoPE with long-RoPE factors */
    ENG_ARCH_QWEN3MOE,  /* "qwen3moe": qwen3 attention, a mixture of experts for the FFN */
    ENG_ARCH__COUNT
} eng_arch;
/* "llama", "qwen2", ...; "?" out of range. */
const char *eng_arch_name(int arch);

typedef struct eng_model_hparams {
    int arch;         /* enum eng_arch */
    int head_dim;     /* elements per Q/K/V head; 0 means dim / n_heads (llama2.c) */
    float norm_eps;   /* RMSNorm epsilon */
    float rope_theta; /* RoPE base */
    int rope_dim;     /* leading dimensions of each head that RoPE rotates */
    bool rope_neox;   /* rotate pairs (j, j + rope_dim/2) (qwen2) instead of (2j, 2j+1) */
    int weight_type;  /* eng_wtype of the projection weights (blk.0.attn_q), for reports */
    /* What architectures past llama add; zero is llama's behaviour for each. */
    float embed_scale;    /* the embedding row is multiplied by it (gemma: sqrt(dim)); 0: none */
    float attn_scale;     /* q·k multiplier; 0: 1 / sqrt(head_dim) */
    float attn_softcap;   /* a score s becomes cap * tanh(s / cap) (gemma2); 0: off */
    float final_softcap;  /* the same on the logits (gemma2); 0: off */
    int ffn_act;          /* enum eng_ffn_act: the gate's activation */
    int swa_window;       /* a windowed layer's row at position p sees positions > p - window;
                             0: no layer is windowed */
    int swa_period;       /* layer l is windowed iff l % period < period - 1; 0: every layer */
    float rope_theta_swa; /* RoPE base of windowed layers (gemma3's local 10000); 0: rope_theta */
    float rope_scale;     /* linear RoPE scaling: positions are multiplied by it; 0: 1 */
    float rope_scale_swa; /* the same for windowed layers; 0: rope_scale */
    /* A mixture of experts (qwen3moe) in place of the FFN: a router picks n_expert_used of
     * n_expert SwiGLU experts of expert_ff per row; 0: a dense FFN */
    int n_expert, n_expert_used, expert_ff;
    float rope_attn_factor; /* RoPE's cos and sin are multiplied by it (Phi-3's long-RoPE
                               rope.scaling.attn_factor); 0 or 1: none */
} eng_model_hparams;

/* The FFN's gate activation. */
enum eng_ffn_act {
    ENG_ACT_SILU = 0, /* SwiGLU: silu(gate) * up */
    ENG_ACT_GELU,     /* GeGLU: gelu(gate) * up, GELU in its tanh form (gemma) */
};

/* Whether layer l attends through a sliding window (eng_model_hparams.swa_window). */
static inline bool eng_layer_windowed(const eng_model_hparams *hp, int l)
{
    return hp->swa_window > 0 && (hp->swa_period <= 0 || l % hp->swa_period < hp->swa_period - 1);
}

/* Elements per Q/K/V head: hp->head_dim, or dim / n_heads where it is 0. */
static inline int eng_head_dim(const eng_model_config *c, const eng_model_hparams *hp)
{
    return hp->head_dim > 0 ? hp->head_dim : c->dim / c->n_heads;
}

/* The element type of a weight matrix: ggml's numbering, as GGUF files store it. */
enum eng_wtype {
    ENG_W_F32 = 0,
    ENG_W_F16 = 1,
    ENG_W_Q4_0 = 2,
    ENG_W_Q4_1 = 3,
    ENG_W_Q5_0 = 6,
    ENG_W_Q5_1 = 7,
    ENG_W_Q8_0 = 8,
    ENG_W_Q2_K = 10,
    ENG_W_Q3_K = 11,
    ENG_W_Q4_K = 12,
    ENG_W_Q5_K = 13,
    ENG_W_Q6_K = 14,
    ENG_W_IQ4_NL = 20,
    ENG_W_IQ4_XS = 23,
    ENG_W_BF16 = 30
};
/* Name of a weight type ("Q8_0"). */
const char *eng_wtype_name(int type);

/* A weight matrix in its file type: rows of `in` elements, row-major [out][in], each row
 * eng_wrow_bytes(type, in) bytes (quantized blocks run along a row). */
typedef struct eng_wmat {
    const void *data;
    int type; /* enum eng_wtype */
} eng_wmat;
size_t eng_wrow_bytes(int type, int64_t in);

/* One layer's weights. Norms and biases are float32 in every format. With a head_dim
 * (eng_model_hparams) other than dim / n_heads, wq is [q_dim][dim] and wo [dim][q_dim],
 * q_dim = n_heads * head_dim; wk and wv are [kv_dim][dim], kv_dim = n_kv_heads * head_dim. */
typedef struct eng_layer_weights {
    const float *rms_att, *rms_ffn;      /* [dim] */
    eng_wmat wq, wk, wv, wo, w1, w2, w3; /* as eng_weights, this layer's slice */
    const float *bq, *bk, *bv;           /* [q_dim], [kv_dim], [kv_dim]; NULL: no bias */
    const float *q_norm, *k_norm;        /* [head_dim]: RMSNorm of each Q and K head (qwen3) */
    /* a mixture of experts (eng_model_hparams.n_expert): the router [n_expert][dim], and
     * each expert's gate, up [expert_ff][dim] and down [dim][expert_ff] matrices, expert e's
     * starting e * rows * eng_wrow_bytes(type, in) bytes after data; w1, w2, w3 unused */
    eng_wmat router, gate_exps, up_exps, down_exps;
    const float *post_att, *post_ffn; /* [dim]: RMSNorm of the attention's and the FFN's
                                            output before the residual add (gemma); NULL: none */
} eng_layer_weights;

/* Every model's weights as typed per-layer matrices (the CPU backend reads these). */
typedef struct eng_model_tensors {
    eng_wmat token_embedding;        /* [vocab][dim] */
    const eng_layer_weights *layers; /* [n_layers] */
    const float *rms_final;          /* [dim] */
    eng_wmat wcls;                   /* [vocab][dim] */
    const float *rope_freq_factors;  /* [rope_dim/2] (Llama 3.1 scaling) or NULL */
} eng_model_tensors;

/* Host float32 weights, laid out exactly as in the llama2.c file (row-major
 * [out][in], every layer's copy of a tensor together). Any pointer may be NULL when the
 * model is "lazy" (see eng_model_is_lazy); all are NULL for a GGUF model, whose weights are
 * per layer and in their file type (eng_model_tensors). */
typedef struct eng_weights {
    const float *token_embedding; /* [vocab][dim] */
    const float *rms_att;         /* [L][dim] */
    const float *wq;              /* [L][dim][dim] */
    const float *wk;              /* [L][kv_dim][dim] */
    const float *wv;              /* [L][kv_dim][dim] */
    const float *wo;              /* [L][dim][dim] */
    const float *rms_ffn;         /* [L][dim] */
    const float *w1;              /* [L][hidden][dim]  gate */
    const float *w2;              /* [L][dim][hidden]  down */
    const float *w3;              /* [L][hidden][dim]  up */
    const float *rms_final;       /* [dim] */
    const float *wcls;            /* [vocab][dim] (== token_embedding when shared) */
} eng_weights;

typedef struct eng_model eng_model;

/*
 * Loads a model from a spec:
 *   "PATH"                       a llama2.c checkpoint or a GGUF file (architectures llama
 *                                and qwen2; F32, F16, BF16, Q8_0, Q4_K, Q6_K weights, kept
 *                                in their type), mmap()ed read-only;
 *   "synthetic:PRESET:SEED"      weights generated from SEED for a named shape
 *                                (stories15M, stories110M, llama3-8b, gqa-test, stories260K);
 *   "synthetic:lazy:PRESET:SEED" the same shape and seed, but no host weights are built
 *                                (for backends that generate on the device, e.g. llama3-8b
 *                                on CUDA; the CPU backend refuses a lazy model).
 * Errors: -ENOENT/-EACCES (file), -EINVAL (malformed: eng_errmsg names the field and the
 * expected value), -ENOMEM.
 */
int eng_model_load(const char *spec, eng_model **out);
void eng_model_free(eng_model *m);
const eng_model_config *eng_model_cfg(const eng_model *m);
const eng_model_hparams *eng_model_hparams_of(const eng_model *m);
const eng_weights *eng_model_weights(const eng_model *m);
/* Typed per-layer view of the weights (every non-lazy model; NULL for a lazy one). */
const eng_model_tensors *eng_model_tensors_of(const eng_model *m);
/* The tokens that end generation: BOS (1) for llama2.c models, as run.c; for GGUF files the
 * vocabulary's EOS, EOT and EOM ids (tokenizer.ggml.*_token_id). Writes at most max ids to
 * out and returns how many there are. */
int eng_model_stop_tokens(const eng_model *m, int32_t *out, int max);
/* The GGUF file's path when the model came from one (the tokenizer lives in it), else NULL. */
const char *eng_model_gguf_path(const eng_model *m);
/* Whether a GGUF model's weights were read into anonymous memory advised onto 2 MiB pages
 * (the default) rather than mapped from the page cache (RINGLM_WEIGHTS_HUGEPAGES=0, or the
 * copy failed; llama2.c files and synthetic models: false). */
bool eng_model_weights_copied(const eng_model *m);
/* A GGUF model's general.name (the name its author gave it), NUL-terminated; NULL when the
 * model is not a GGUF file, or its general.name is absent, empty or not a string. */
const char *eng_model_name(const eng_model *m);
bool eng_model_is_lazy(const eng_model *m);
/* For synthetic models: the preset's seed (0 and false for files). */
bool eng_model_synthetic_seed(const eng_model *m, uint64_t *seed);
/* A short stable identity: sha256 of the file, or "synthetic:PRESET:SEED" hashed. Hex. */
const char *eng_model_hash(const eng_model *m);

/* Looks a preset up by name; -ENOENT if unknown. */
int eng_preset(const char *name, eng_model_config *out);

/*
 * Synthetic weights are a pure function of (seed, tensor, element index), so a GPU can
 * generate the very same values on the device:
 *   u   = splitmix64(seed ^ (tensor_id << 56) ^ index)         (uint64)
 *   val = ((u >> 40) * 2^-24 * 2 - 1) * scale(tensor)          (uniform in [-scale, scale))
 * tensor_id is the eng_tensor_id below; index runs over the tensor as laid out in
 * eng_weights. RMSNorm weights are 1 + val with scale 0.1; other scales are
 * 1/sqrt(fan_in) (embedding: 1.0).
 */
enum eng_tensor_id {
    ENG_T_EMBED = 1,
    ENG_T_RMS_ATT,
    ENG_T_WQ,
    ENG_T_WK,
    ENG_T_WV,
    ENG_T_WO,
    ENG_T_RMS_FFN,
    ENG_T_W1,
    ENG_T_W2,
    ENG_T_W3,
    ENG_T_RMS_FINAL,
    ENG_T_WCLS
};
uint64_t eng_splitmix64(uint64_t x);
float eng_synth_value(uint64_t seed, int tensor_id, uint64_t index, float scale, bool is_norm);
float eng_synth_scale(const eng_model_config *c, int tensor_id);

/* Writes a model in the llama2.c format (ringlm-mkmodel). Returns 0 or -errno. */
int eng_model_write(const eng_model *m, const char *path);

/* ---- engines ------------------------------------------------------------------------ */

typedef struct eng eng;

/* The CUDA backend's compute type (eng_options.cuda_dtype). */
typedef enum eng_cuda_dtype {
    ENG_CUDA_DTYPE_BF16 = 0, /* "bf16": bf16 weights, activations and KV (f16 for a GGUF file
                                whose matrices are all F16) — the serving default */
    ENG_CUDA_DTYPE_FP32,     /* "fp32": every matrix dequantized to float32, fp32 activations
                                and KV: a diagnostic that tells bf16 rounding apart from a bug */
    ENG_CUDA_DTYPE__COUNT
} eng_cuda_dtype;

/* "bf16", "fp32"; NULL out of range. */
const char *eng_cuda_dtype_name(eng_cuda_dtype d);
/* The dtype named s ("bf16" or "fp32"), or -1. */
int eng_cuda_dtype_parse(const char *s);

typedef struct eng_options {
    const char *backend;  /* "cpu" (default when NULL) or "cuda" */
    int n_threads;        /* CPU worker threads (0 = 1) */
    int numa_node;        /* node to pin workers to; -1 = none */
    int kv_blocks;        /* physical KV blocks in the pool (> 0) */
    int kv_block_size;    /* tokens per block (> 0; 16 is typical) */
    int max_batch_tokens; /* largest T eng_execute accepts (> 0) */
    int max_seqs;         /* largest S eng_execute accepts (> 0) */
    /* The CUDA backend's (the cpu backend ignores them); zero is the default of each. */
    int cuda_device;           /* device ordinal (>= 0; default 0) */
    eng_cuda_dtype cuda_dtype; /* default ENG_CUDA_DTYPE_BF16 */
    bool cuda_no_graphs;       /* decode steps run eagerly, never captured into CUDA graphs
                                  (for compute-sanitizer, debugging); graphs on by default */
    /* Window rings (the CPU backend, a model with windowed and global layers: gemma2,
     * gemma3; eng_model_mixed_window). 0: today's layout, a block holds every layer. > 0:
     * a block holds the global layers only, and the windowed layers' K/V live in kv_rings
     * rings of eng_kv_ring_blocks() blocks each, one ring per sequence (eng_batch.ring):
     * position p of a sequence lives in ring block (p / block_size) mod that count, so a
     * ring is reused in place however long the sequence grows. */
    int kv_rings;
    int kv_ring_rows; /* the most rows one sequence brings to a batch (0: max_batch_tokens);
                         a ring spans window + that many positions */
    /* The CPU backend, F32 and F16 weights: by default a batch's prompt rows (eng_batch
     * prompt_len) are multiplied in AVX-512 BF16 tiles where the CPU has them (weights and
     * activations rounded to bf16: kernels/cpu/gemm_bf16.h states the bound), generated rows
     * in exact float32; and with any weights prompt rows attend with P·V in BF16
     * (kernels/cpu/attention_bf16.c). true: every row in exact float32, as
     * RINGLM_PREFILL_GEMM=own or =blas in the environment does (the reference tests' mode). */
    bool prompt_exact;
    /* The CPU backend with AVX-512 BF16: the weights that go through the BF16 tiles (BF16
     * weights; F32 and F16 ones for prompt rows) packed once at load into the tiles' panels,
     * a copy beside the weights as they lie (as many bytes as BF16 / F16 projections, half as
     * many as F32 ones); with AVX-512 VNNI, Q4_K and Q6_K projections and classifier packed
     * for the products of up to 4 rows (decode), 16 rows side by side (1.03x their bytes; the
     * same bits). ENG_PACK_AUTO: where the copy takes at most half of the memory
     * available at load (pack_avail_bytes, or MemAvailable and the cgroup's memory.max less
     * memory.current), ENG_PACK_ON: always, ENG_PACK_OFF: never (each product packs what it
     * reads: the same bits, slower prompts). RINGLM_PACKED_WEIGHTS=0 / =1 in the environment
     * overrides it. eng_describe_paths says which was chosen and why. */
    int packed_weights;        /* eng_pack_mode */
    uint64_t pack_avail_bytes; /* ENG_PACK_AUTO's memory available; 0: read at load */
} eng_options;

typedef enum eng_pack_mode { ENG_PACK_AUTO = 0, ENG_PACK_ON = 1, ENG_PACK_OFF = 2 } eng_pack_mode;

/* Creates an engine over a model (the model must outlive it). Errors: -EINVAL (bad
 * options: a negative cuda_device, an unknown cuda_dtype), -ENOMEM, -ENODEV (backend "cuda"
 * with no usable device — cuda_device beyond the devices present included — or no plugin),
 * -ENOTSUP. */
int eng_create(const eng_model *m, const eng_options *opt, eng **out);
void eng_destroy(eng *e);
const char *eng_backend_name(const eng *e);
/* One line naming the kernels the projections take on this machine, by batch size (and for
 * the CPU backend the core OpenBLAS runs, and whether AMX and AVX512-FP16 are there, with
 * what runs in their place: kernels/cpu/cpu_features.h), for a start report; "" where the
 * backend does not say. Up to about 700 bytes. */
void eng_describe_paths(const eng *e, char *buf, size_t cap);

/* KV geometry. A block is block-major: all layers' K and V for block_size tokens in one
 * contiguous piece of kv_block_bytes, so it moves to host memory or disk as one copy (with
 * window rings: the global layers' only; eng_kv_bytes_per_token counts those). */
size_t eng_kv_bytes_per_token(const eng *e);
size_t eng_kv_block_bytes(const eng *e);
int eng_kv_blocks(const eng *e);
int eng_kv_block_size(const eng *e);
/* The attention window every layer of the model honours on this backend, in positions (a
 * row at p reads positions > p - window), or 0: some layer reads every position (no window,
 * or windows on some layers only, as gemma's), or the backend does not window (CUDA).
 * Where it is > 0 a block table may hold -1 in entries wholly behind the window of its
 * sequence's first row this batch (blocks given back; the kernels never read them). */
int eng_kv_window(const eng *e);
/* Whether a model has both windowed and global layers (gemma2, gemma3 with a window and a
 * pattern that leaves some layer global): the models window rings (eng_options.kv_rings)
 * are for. */
bool eng_model_mixed_window(const eng_model *m);
/* Blocks per ring: ceil((window + ring_rows) / block_size) + 1, enough that every position
 * a batch's rows of one sequence write or read (the window before its first row, up to its
 * last) lands in a block of its own; never more than a sequence of the model's context has
 * (ceil(context / block_size): then no two blocks share a ring block at all). */
static inline int eng_kv_ring_blocks_for(int window, int ring_rows, int block_size, int context)
{
    const int ring = (window + ring_rows + block_size - 1) / block_size + 1;
    const int whole = (context + block_size - 1) / block_size;
    return ring < whole ? ring : whole;
}
/* Window rings of the engine (eng_options.kv_rings; 0: none, every block holds every
 * layer), blocks per ring, and one ring's bytes (all its blocks, the windowed layers'
 * K and V). */
int eng_kv_rings(const eng *e);
int eng_kv_ring_blocks(const eng *e);
size_t eng_kv_ring_bytes(const eng *e);
/* Host address of ring r (host pools only; NULL otherwise or out of range). A ring is one
 * contiguous piece of eng_kv_ring_bytes, so it moves to host memory as one copy. */
void *eng_kv_ring_ptr(eng *e, int ring);
/* Copies ring src's contents to ring dst (a sample that goes on from another's prompt).
 * -EINVAL out of range or without rings. */
int eng_kv_copy_ring(eng *e, int src, int dst);
/* Bytes the engine holds (weights it owns + KV pool + scratch). */
size_t eng_memory_bytes(const eng *e);

/*
 * Host address of a KV block, for backends whose pool lives in host memory (CPU): the
 * daemon registers these with io_uring and moves blocks with reads and writes. NULL for
 * device-resident pools (CUDA), which use eng_kv_read_block/eng_kv_write_block or the
 * async transfer below.
 */
void *eng_kv_block_ptr(eng *e, int block);
/* Whole-pool base address and length (host pools only; NULL/0 otherwise). */
void *eng_kv_pool_base(eng *e, size_t *len);

/* Synchronous copies of whole blocks (byte-exact). */
int eng_kv_read_block(eng *e, int block, void *dst);        /* pool → host buffer */
int eng_kv_write_block(eng *e, int block, const void *src); /* host buffer → pool */
/* In the pool, pair by pair in order (both backends): a chain a->b, b->c copies b's old
 * contents to c only when listed b->c first. */
int eng_kv_copy_blocks(eng *e, const int32_t *src, const int32_t *dst, int n);

/*
 * Asynchronous transfer of n blocks between the pool and host buffers (dir 0: pool→host,
 * 1: host→pool). On completion the backend writes 1 to the eventfd efd (the daemon's
 * io_uring watches it). -ENOTSUP when the backend has no async path (CPU: the daemon uses
 * io_uring on eng_kv_block_ptr instead).
 */
enum { ENG_KV_OUT = 0, ENG_KV_IN = 1 };
int eng_kv_transfer_async(eng *e, int dir, const int32_t *blocks, void *const *host, int n,
                          int efd);

/*
 * One flattened batch: T token rows from S sequences; decode tokens and prefill chunks mix.
 * Sequence s owns rows [query_start[s], query_start[s+1]); its rows sit at positions
 * positions[...] (consecutive, ending at seq_len[s]-1), and row r's K/V is written to pool
 * slot slot_mapping[r] = block * block_size + offset. block_table[s * block_table_stride + j]
 * is the physical block of the sequence's j-th logical block; it must cover seq_len[s].
 * logits_rows lists the rows (indices into tokens) whose logits are wanted, in order.
 */
typedef struct eng_batch {
    int n_tokens;                /* T */
    const int32_t *tokens;       /* [T] */
    const int32_t *positions;    /* [T] */
    const int64_t *slot_mapping; /* [T] */
    int n_seqs;                  /* S */
    const int32_t *query_start;  /* [S+1], query_start[0] = 0, query_start[S] = T */
    const int32_t *seq_len;      /* [S] context length including this batch's rows */
    const int32_t *block_table;  /* [S][block_table_stride] */
    int block_table_stride;
    int n_logits;
    const int32_t *logits_rows; /* [n_logits] */
    /* [S]: each sequence's window ring (eng_options.kv_rings), two sequences of a batch never
     * the same; the windowed layers' K/V of position p go to ring block (p / block_size) mod
     * eng_kv_ring_blocks(). Ignored (may be NULL) without rings. */
    const int32_t *ring;
    /* [S] or NULL: each sequence's prompt length. Its rows at positions below it are prompt
     * rows (a recomputed sequence's generated tokens are not), which the CPU backend
     * multiplies by F32 and F16 weights in BF16 tiles (eng_options.prompt_exact); every
     * other row, and every row where this is NULL, in exact float32. A row's path depends
     * on what its token is, never on its batch, so a row gives the same bits alone or in any
     * batch and a prompt the same K/V in one chunk or many. The CUDA backend ignores it (its
     * products are bf16 for every row). */
    const int32_t *prompt_len;
} eng_batch;

/* Validates a batch against the engine (sizes, positions, slots, block tables, token ids,
 * no KV slot written by two rows); -EINVAL with a detail. eng_execute calls it; the daemon
 * may call it before. It uses scratch inside the engine: not concurrently with another call
 * on the same engine. */
int eng_batch_check(eng *e, const eng_batch *b);

/* Runs the batch; writes n_logits × vocab float32 logits. */
int eng_execute(eng *e, const eng_batch *b, float *logits);

/* ---- sampling ----------------------------------------------------------------------- */

typedef struct eng_logits_proc eng_logits_proc; /* kernels/logits.h */

typedef struct eng_sampling {
    float temperature; /* 0 = greedy (argmax, first index wins ties) */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 (or 0) = off */
    uint64_t seed;     /* per request; the rng state starts at eng_rng_init(seed) */
    /* The sequence's logits processors (bias, penalties, min-p, the constraint stage:
     * kernels/logits.h), or NULL: none, exactly the path without them. */
    eng_logits_proc *proc;
} eng_sampling;

uint64_t eng_rng_init(uint64_t seed);
/* Samples one token id from logits[vocab] through the pipeline of kernels/logits.h (bias →
 * repetition → presence/frequency → constraint → temperature → top-k → top-p → min-p);
 * advances *rng. Deterministic for equal inputs. The row is changed while the processors run
 * and restored exactly before the call returns (it is not modified when s->proc is NULL).
 * Returns -1 only when the constraint stage fails. */
int32_t eng_sample(float *logits, int vocab, const eng_sampling *s, uint64_t *rng);

/* Execute + sample per logits row (s[i], rng[i] for logits row i); out_tokens[n_logits].
 * logits may be NULL. Backends may sample on the device and copy back only the ids; a batch
 * where a row has processors (s[i].proc) is sampled on the host. A row whose constraint
 * stage fails (eng_sample -1) gets out_tokens[i] = -1 and fails nothing else: the call
 * returns 0 and the other rows are sampled (the caller ends that row's sequence). */
int eng_execute_sample(eng *e, const eng_batch *b, const eng_sampling *s, uint64_t *rng,
                       int32_t *out_tokens, float *logits);

/* ---- log-probabilities ------------------------------------------------------------------
 *
 * A row's log-probabilities: the log-softmax of its logits, log p(t) = l_t - logsumexp(l),
 * for one token (the sampled one, or a prompt's next token) and the top n of the whole
 * vocabulary (n <= ENG_TOP_LOGPROBS_MAX, OpenAI's limit). From the model's raw logits by
 * default (as vLLM); "processed" takes the distribution the sampler drew from instead:
 * the logits after the sequence's processors (bias, penalties, constraint), divided by the
 * temperature (none when greedy), with the tokens min-p, top-k and top-p leave out at -inf. Rows that ask for nothing cost nothing: no pass over their logits. */
#define ENG_TOP_LOGPROBS_MAX 20

/* What one logits row of a batch wants. */
typedef struct eng_logprob_want {
    int8_t top_n;   /* < 0: no log-probabilities; 0..ENG_TOP_LOGPROBS_MAX: the token's and
                        the top n */
    bool processed; /* from the processed distribution (above), not the raw one */
    bool no_sample; /* a prompt row: nothing is sampled (out_tokens[i] = -1, rng[i] kept) */
    int32_t target; /* no_sample rows: the token whose log-probability is wanted; < 0 for
                        none (top n only). Sampled rows: ignored (the sampled token) */
} eng_logprob_want;

/* One row's answer. top_id/top_logprob are ordered by descending log-probability, then
 * ascending id; tokens whose log-probability is -inf or NaN are never listed, so n_top may
 * be below top_n (a processed row that top-k cut to fewer tokens). */
typedef struct eng_logprobs {
    int32_t token; /* the sampled or target token; -1 when none */
    float logprob; /* its log-probability (-inf when the distribution excludes it) */
    uint32_t rank; /* 1 + the tokens of strictly higher log-probability (vLLM's rank) */
    int32_t n_top;
    int32_t top_id[ENG_TOP_LOGPROBS_MAX];
    float top_logprob[ENG_TOP_LOGPROBS_MAX];
} eng_logprobs;

/* Log-probabilities of one row of logits[vocab]: target's (target < 0: none) and the top
 * top_n (0..ENG_TOP_LOGPROBS_MAX). Two passes over the row (max; exp-sum, rank and top n
 * together). Returns 0, or -EINVAL (vocab < 1, top_n out of range, target >= vocab). */
int eng_logprobs_row(const float *logits, int vocab, int32_t target, int top_n, eng_logprobs *out);

/* The processed distribution's logits (see above) of one row into out[vocab]: what
 * eng_sample draws from, as logits. */
void eng_logits_processed(const float *logits, int vocab, const eng_sampling *s, float *out);

/*
 * eng_execute_sample with log-probabilities: want[i] says what logits row i wants, out[i]
 * receives it (rows with top_n < 0 are left untouched). want NULL is eng_execute_sample.
 * Rows marked no_sample are prompt rows: not sampled, out_tokens[i] = -1. When any row
 * wants log-probabilities the logits come to the host (a backend that samples on its device
 * copies them back for that batch only).
 */
int eng_execute_sample_lp(eng *e, const eng_batch *b, const eng_sampling *s, uint64_t *rng,
                          int32_t *out_tokens, const eng_logprob_want *want, eng_logprobs *out);

/* ---- backends (for kernels/ and plugins only) ---------------------------------------- */

typedef struct eng_backend_ops {
    const char *name;
    int (*create)(eng *e, const eng_model *m, const eng_options *opt, void **priv);
    void (*destroy)(void *priv);
    int (*execute)(void *priv, const eng_batch *b, float *logits);
    /* optional (NULL: execute + eng_sample on the host) */
    int (*execute_sample)(void *priv, const eng_batch *b, const eng_sampling *s, uint64_t *rng,
                          int32_t *out_tokens, float *logits);
    size_t (*kv_block_bytes)(void *priv);
    size_t (*memory_bytes)(void *priv);
    void *(*kv_block_ptr)(void *priv, int block);   /* optional */
    void *(*kv_pool_base)(void *priv, size_t *len); /* optional */
    int (*kv_read_block)(void *priv, int block, void *dst);
    int (*kv_write_block)(void *priv, int block, const void *src);
    int (*kv_copy_blocks)(void *priv, const int32_t *src, const int32_t *dst, int n);
    int (*kv_transfer_async)(void *priv, int dir, const int32_t *blocks, void *const *host, int n,
                             int efd); /* optional */
    /* optional (NULL: on the calling thread): runs fn(ctx, task) for every task in
     * [0, n_tasks) on the backend's host threads and returns when all have returned; the
     * per-row log-probabilities of a batch use it */
    void (*run_tasks)(void *priv, int n_tasks, void (*fn)(void *ctx, int task), void *ctx);
    /* optional: which kernels the projections take, by batch size, for a start report */
    void (*describe)(void *priv, char *buf, size_t cap);
    /* optional (NULL: the backend has no window rings; eng_create refuses kv_rings > 0):
     * host address of a ring and one ring's bytes */
    void *(*kv_ring_ptr)(void *priv, int ring);
    size_t (*kv_ring_bytes)(void *priv);
} eng_backend_ops;

/* The CPU backend's table (kernels/cpu/). */
const eng_backend_ops *eng_cpu_backend(void);
/* The CUDA plugin exports this symbol; eng_create dlopen()s $RINGLM_CUDA_LIB, else
 * libringlm_cuda.so beside the executable's ../lib/, else by soname. */
#define ENG_CUDA_ENTRY "ringlm_cuda_backend"
typedef const eng_backend_ops *(*eng_backend_entry_fn)(void);

/* ---- additions (engine helper) -------------------------------------------------------- */

/* Time spent per phase of eng_execute, cumulative since eng_create or the last reset. */
typedef struct eng_phase_stats {
    uint64_t steps;      /* eng_execute calls */
    uint64_t rows;       /* token rows processed */
    uint64_t proj_ns;    /* projections: QKV, output, FFN and classifier matmuls */
    uint64_t attn_ns;    /* paged attention (incl. RoPE and KV append) */
    uint64_t other_ns;   /* embedding, RMSNorm, everything else */
    uint64_t experts_ns; /* of proj_ns: a mixture's experts (router, choice, their products) */
    /* the CPU backend's worker pool (see its spin policy in kernels/cpu/cpu.c) */
    uint64_t regions;         /* parallel regions run on the pool */
    uint64_t wake_calls;      /* futex wake system calls made (none while peers spin) */
    uint64_t helper_waits;    /* helper threads' waits for a region */
    uint64_t helper_sleeps;   /* ... of which ended asleep (the spin budget ran out) */
    uint64_t spin_budget_ns;  /* a helper's current spin budget (not reset) */
    uint64_t wake_latency_ns; /* measured region start → sleeping helper running (not reset) */
    uint64_t straggler_waits; /* regions whose caller, its own tasks done, waited for a helper's */
    uint64_t straggler_ns; /* ... the time it waited (a helper descheduled mid-task shows here) */
    /* where a step's time on the pool goes: the caller's time from the start of each
     * parallel region to the end of its last task (the rest of a step the caller works
     * alone), its own time in tasks within them, and the helpers' time in tasks (summed);
     * a region's time not in the caller's tasks is waiting or claiming */
    uint64_t region_ns, caller_task_ns, helper_task_ns;
} eng_phase_stats;
/* Fills *out (and zeroes the counters when reset). -ENOTSUP when the backend keeps none
 * (only the CPU backend does). */
int eng_phase_stats_get(eng *e, eng_phase_stats *out, bool reset);
/* The CPU backend's implementation (priv = the backend's private state). */
int eng_cpu_phase_stats(void *priv, eng_phase_stats *out, bool reset);

#ifdef __cplusplus
}
#endif
#endif
