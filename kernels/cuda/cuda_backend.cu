/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/cuda_backend.cu — the CUDA backend of kernels/engine.h, built as the plugin
 * build/lib/libringlm_cuda.so and found by eng_create through ringlm_cuda_backend().
 *
 * Weights live on the device in bf16 (f16 for a GGUF file whose matrices are all F16; fp32
 * with eng_options.cuda_dtype fp32, a diagnostic mode): converted on the host from the model's
 * tensors in their file type (llama2.c float32, GGUF F32/F16/BF16/Q8_0/Q4_K/Q6_K; the plan
 * and the conversion are kernels/devload.c's) or, for lazy synthetic models, generated on
 * the device from the seed with the very formula of eng_synth_value. The projections are
 * cublasGemmEx (bf16/f16 in, fp32 accumulate) over the whole flattened batch [T, dim] with fused
 * QKV and gate/up weights; the residual adds ride on the GEMMs (beta = 1 into the fp32
 * residual stream). The KV pool is block-major and bf16 (fp32 in fp32 mode): one block is
 * [layer][K|V][kv_head][block_size][head_size].
 *
 * Pure-decode batches replay a CUDA graph per (batch-size bucket, split bucket); their
 * metadata lives in fixed device buffers that are refreshed before each replay. KV blocks
 * move to and from host memory on a separate copy stream; completion is a host function
 * that writes 1 to the caller's eventfd.
 *
 * Every CUDA and cuBLAS call is checked; a failure returns -EIO (or -ENOMEM, -ENODEV) with
 * eng_seterr naming the call and the runtime's status string. Nothing here aborts.
 *
 * Options (eng_options; ringlmd and ringlm-run --cuda-device, --cuda-dtype, --no-cuda-graphs):
 * cuda_device (ordinal, default 0), cuda_dtype (bf16 | fp32), cuda_no_graphs (no graph
 * replay). Environment: RINGLM_CUDA_GEMV (1: decode batches of <= 8 rows use the
 * skinny-GEMM kernel instead of cuBLAS; an A/B switch of gpu_bench, off by default).
 */
#include "kernels/engine.h"
#include "kernels/devload.h"
#include "kernels/cuda/cuda_kernels.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static_assert(CK_MAX_HEAD_SIZE == ENG_CUDA_MAX_HEAD_SIZE, "devload.h's head-size limit");
static_assert(CK_ATT_MAXP == ENG_CUDA_MAX_GROUP, "devload.h's group limit");

/* ---- error plumbing -------------------------------------------------------------------- */

#define CU_CHECK(call)                                                                        \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            rc = eng_seterr(e_ == cudaErrorMemoryAllocation ? -ENOMEM : -EIO,                 \
                            "cuda: %s: %s (%s) at %s:%d", #call, cudaGetErrorString(e_),      \
                            cudaGetErrorName(e_), __FILE__, __LINE__);                        \
            goto fail;                                                                        \
        }                                                                                     \
    } while (0)

#define BLAS_CHECK(call)                                                                      \
    do {                                                                                      \
        cublasStatus_t s_ = (call);                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            rc = eng_seterr(s_ == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO,                \
                            "cublas: %s: %s at %s:%d", #call, cublasGetStatusString(s_),      \
                            __FILE__, __LINE__);                                              \
            goto fail;                                                                        \
        }                                                                                     \
    } while (0)

/* Error path of a function that has nothing to unwind. */
#define TRY(call)                                                                             \
    do {                                                                                      \
        int r_ = (call);                                                                      \
        if (r_)                                                                               \
            return r_;                                                                        \
    } while (0)

/* ---- the engine ------------------------------------------------------------------------ */

/* Decode graphs: batch-size buckets (powers of two up to the cap, then the cap) times the
 * split-grid buckets 1, 2, 4, 8, 16, 32. */
#define CU_MAX_BUCKETS 24
#define CU_Z_BUCKETS 6

typedef struct cu cu;

/* One asynchronous KV transfer in flight. */
typedef struct cu_xfer {
    cu *c;
    int efd;
    int dir;
    int n;
    size_t block_bytes;
    void *staging;   /* pinned bounce buffer when the host memory is not registered */
    void **host_dst; /* ENG_KV_OUT through staging: where each block goes */
    int done; /* set (release) by the host function */
    struct cu_xfer *next;
} cu_xfer;

/* A host range this backend registered with cudaHostRegister (memfd host tiers). */
typedef struct cu_hostreg {
    uintptr_t start, end;
    bool owned; /* registered by us (else by someone else before us) */
    struct cu_hostreg *next;
} cu_hostreg;

struct cu {
    eng_model_config cfg;
    eng_options opt;
    ck_geom g;
    int device, sm_count;
    eng_dev_plan plan; /* device types (kernels/devload.h) */
    int act_type;      /* CK_BF16, CK_F16 or CK_F32: weights and GEMM inputs */
    int kv_bf16;       /* KV pool in bf16 (else fp32) */
    size_t elt;        /* bytes per weight / act element */
    size_t kv_elt;     /* bytes per KV element */
    cudaStream_t st, copy_st;
    cudaEvent_t ev_start, ev_stop, ev_compute;
    cublasHandle_t blas;
    void *blas_ws;
    size_t mem_bytes;

    /* weights (device) */
    void *emb, *wqkv, *wo, *wgu, *w2, *wcls;
    float *rms_att, *rms_ffn, *rms_final;
    float *bqkv;      /* [L][dim + 2 kv_dim] Q/K/V biases, or NULL */
    float *rope_freq; /* [rope_dim / 2] */

    /* KV pool */
    void *pool;
    size_t block_bytes;

    /* activations */
    int t_max, s_max, logits_cap;
    float *x, *qkv, *q, *gu, *logits, *part_acc, *part_ml;
    void *xb, *att, *hb, *xf;

    /* batch metadata: the same layout in pinned host memory and on the device */
    uint8_t *meta_h, *meta_d;
    size_t meta_bytes;
    size_t off_tokens, off_positions, off_slots, off_logits_rows, off_tile_seq, off_tile_row0,
        off_tile_nrows, off_tile_dslot, off_temp, off_topk, off_topp, off_rng, off_out_tok,
        off_block_table;
    ck_meta dm;

    /* sampling scratch (allocated on first sampled top-k/top-p row) */
    float *probs, *probs_sorted, *coins;
    int32_t *ids, *ids_sorted, *offsets;
    void *sort_tmp;
    size_t sort_tmp_bytes;

    /* CUDA graphs for pure-decode batches */
    bool graphs_on;
    int n_buckets;
    int bucket_size[CU_MAX_BUCKETS];
    cudaGraphExec_t graph[CU_MAX_BUCKETS][CU_Z_BUCKETS];
    int graph_gemv[CU_MAX_BUCKETS][CU_Z_BUCKETS]; /* g_gemv when captured */

    /* async KV transfers */
    pthread_mutex_t xfer_lock;
    cu_xfer *xfers;
    cu_hostreg *hostregs;

    float last_exec_ms;
};

/* Skinny-GEMM mode for decode (RINGLM_CUDA_GEMV=1 or ringlm_cuda_set_gemv): projections of
 * batches of <= CK_GEMV_MAX_T rows use ck_gemv_bf16 instead of cuBLAS. Process-wide. */
static int g_gemv = -1; /* -1: not read from the environment yet */

/* Device time of the last execute on this process (for perf/gpu_bench). */
static float g_last_exec_ms = -1.0f;
static int g_last_used_graph = 0;

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static int dev_alloc(cu *c, void **p, size_t bytes, const char *what)
{
    int rc = 0;
    *p = NULL;
    if (bytes == 0)
        bytes = 256;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        *p = NULL;
        (void)cudaGetLastError(); /* clear the sticky-free allocation error */
        return eng_seterr(e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO,
                          "cuda: cudaMalloc(%s, %zu MiB): %s (%s)", what, bytes >> 20,
                          cudaGetErrorString(e), cudaGetErrorName(e));
    }
    c->mem_bytes += bytes;
    return rc;
}

static void dev_free(void *p)
{
    if (p)
        (void)cudaFree(p);
}

/* ---- weights --------------------------------------------------------------------------- */

static bool is_norm_id(int id)
{
    return id == ENG_T_RMS_ATT || id == ENG_T_RMS_FFN || id == ENG_T_RMS_FINAL;
}

/* Generates n elements at dst (bf16 or fp32) of synthetic tensor `id`, elements
 * [index0, index0 + n), on the device (lazy models: no host weights). */
static int synth_tensor(cu *c, const eng_model *m, void *dst, int dst_bf16, uint64_t n, int id,
                        uint64_t index0)
{
    int rc = 0;
    uint64_t seed = 0;
    if (!eng_model_synthetic_seed(m, &seed))
        return eng_seterr(-EINVAL, "cuda: tensor %d has no host weights and the model is not "
                                   "synthetic", id);
    CU_CHECK(ck_synth_fill(c->st, dst, dst_bf16, n, seed, id, index0,
                           eng_synth_scale(&c->cfg, id), is_norm_id(id)));
    return 0;
fail:
    return rc;
}

/* Host-to-device upload of weight matrices: rows are converted to the device type on the
 * host (eng_dev_convert_rows) into one of two pinned buffers while the other one's copy
 * runs. */
typedef struct uploader {
    uint8_t *buf[2];
    cudaEvent_t ev[2];
    size_t bytes; /* per buffer */
    int next;
    float *tmp; /* one row of floats */
} uploader;

static void uploader_free(uploader *u)
{
    for (int i = 0; i < 2; i++) {
        if (u->ev[i]) {
            (void)cudaEventSynchronize(u->ev[i]);
            (void)cudaEventDestroy(u->ev[i]);
        }
        if (u->buf[i])
            (void)cudaFreeHost(u->buf[i]);
    }
    free(u->tmp);
}

static int uploader_init(cu *c, uploader *u)
{
    int rc = 0;
    memset(u, 0, sizeof *u);
    const size_t widest = (size_t)(c->cfg.dim > c->cfg.hidden_dim ? c->cfg.dim
                                                                   : c->cfg.hidden_dim);
    u->bytes = (size_t)32 << 20;
    if (u->bytes < widest * 4)
        u->bytes = widest * 4;
    u->tmp = (float *)malloc(widest * sizeof(float));
    if (!u->tmp)
        return eng_seterr(-ENOMEM, "cuda: out of memory for the weight upload");
    for (int i = 0; i < 2; i++) {
        CU_CHECK(cudaHostAlloc((void **)&u->buf[i], u->bytes, cudaHostAllocDefault));
        CU_CHECK(cudaEventCreateWithFlags(&u->ev[i], cudaEventDisableTiming));
    }
    return 0;
fail:
    return rc;
}

/* Uploads a [rows][cols] matrix in its file type to dst in the device type. name: for
 * errors. */
static int upload_mat(cu *c, uploader *u, void *dst, eng_wmat w, uint64_t rows, uint64_t cols,
                      const char *name)
{
    int rc = 0;
    const size_t row_bytes = (size_t)cols * c->elt;
    const uint64_t chunk = u->bytes / row_bytes;
    for (uint64_t r = 0; r < rows; r += chunk) {
        const uint64_t n = rows - r < chunk ? rows - r : chunk;
        const int b = u->next;
        u->next ^= 1;
        CU_CHECK(cudaEventSynchronize(u->ev[b])); /* its previous copy is done */
        if ((rc = eng_dev_convert_rows(w, (int64_t)cols, (int64_t)r, (int64_t)n, c->plan.dtype,
                                       u->buf[b], u->tmp))) {
            char why[256];
            snprintf(why, sizeof why, "%s", eng_errmsg());
            return eng_seterr(rc, "cuda: tensor %s: %s", name, why);
        }
        CU_CHECK(cudaMemcpyAsync((uint8_t *)dst + r * row_bytes, u->buf[b], n * row_bytes,
                                 cudaMemcpyHostToDevice, c->st));
        CU_CHECK(cudaEventRecord(u->ev[b], c->st));
    }
    return 0;
fail:
    return rc;
}

/* n float32 values to the device (norms, biases: small, pageable). */
static int upload_f32(cu *c, float *dst, const float *src, size_t n, const char *name)
{
    int rc = 0;
    if (!src)
        return eng_seterr(-EINVAL, "cuda: tensor %s: absent", name);
    /* pageable source: the call returns once the bytes are staged */
    CU_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, c->st));
    return 0;
fail:
    return rc;
}

/* Compares a few device-generated values with eng_synth_value, so a formula drift between
 * host and device is a clear error at create rather than silently different weights. */
static int check_synth(cu *c, const eng_model *m)
{
    int rc = 0;
    uint64_t seed = 0;
    (void)eng_model_synthetic_seed(m, &seed);
    const int L = c->cfg.n_layers, dim = c->cfg.dim;
    struct {
        const void *base;
        int bf16;
        int id;
        uint64_t dev_index, index;
    } probes[] = {
        {c->rms_att, 0, ENG_T_RMS_ATT, 0, 0},
        {c->rms_ffn, 0, ENG_T_RMS_FFN, (uint64_t)L * dim - 1, (uint64_t)L * dim - 1},
        {c->emb, c->act_type == CK_BF16, ENG_T_EMBED, 12345 % ((uint64_t)c->cfg.vocab_size * dim),
         12345 % ((uint64_t)c->cfg.vocab_size * dim)},
        {c->wo, c->act_type == CK_BF16, ENG_T_WO, (uint64_t)L * dim * dim - 1, (uint64_t)L * dim * dim - 1},
        /* wq of layer 0, element 7: the fused qkv row 0 col 7 */
        {c->wqkv, c->act_type == CK_BF16, ENG_T_WQ, 7 % ((uint64_t)dim * dim), 7 % ((uint64_t)dim * dim)},
    };
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        float want = eng_synth_value(seed, probes[i].id, probes[i].index,
                                     eng_synth_scale(&c->cfg, probes[i].id),
                                     is_norm_id(probes[i].id));
        float got;
        if (probes[i].bf16) {
            __nv_bfloat16 h;
            CU_CHECK(cudaMemcpy(&h, (const __nv_bfloat16 *)probes[i].base + probes[i].dev_index,
                                sizeof h, cudaMemcpyDeviceToHost));
            got = __bfloat162float(h);
            want = __bfloat162float(__float2bfloat16(want));
        } else {
            CU_CHECK(cudaMemcpy(&got, (const float *)probes[i].base + probes[i].dev_index,
                                sizeof got, cudaMemcpyDeviceToHost));
        }
        if (memcmp(&got, &want, sizeof got) != 0)
            return eng_seterr(-EIO, "cuda: device-generated weight of tensor %d index %" PRIu64
                                    " is %.9g, eng_synth_value gives %.9g",
                              probes[i].id, probes[i].index, got, want);
    }
    return 0;
fail:
    return rc;
}

/* Lazy synthetic models: every tensor generated on the device, then spot-checked. */
static int generate_weights(cu *c, const eng_model *m)
{
    int rc = 0;
    const eng_model_config *k = &c->cfg;
    const uint64_t L = k->n_layers, dim = k->dim, kv = c->g.kv_dim, h = k->hidden_dim,
                   V = k->vocab_size, qkv_rows = dim + 2 * kv;
    const size_t e = c->elt;
    const int bf = c->act_type == CK_BF16;
#define GEN(dst, dbf, n, id, idx0) TRY(synth_tensor(c, m, (dst), (dbf), (n), (id), (idx0)))
    GEN(c->emb, bf, V * dim, ENG_T_EMBED, 0);
    GEN(c->rms_att, 0, L * dim, ENG_T_RMS_ATT, 0);
    GEN(c->rms_ffn, 0, L * dim, ENG_T_RMS_FFN, 0);
    GEN(c->rms_final, 0, dim, ENG_T_RMS_FINAL, 0);
    GEN(c->wo, bf, L * dim * dim, ENG_T_WO, 0);
    GEN(c->w2, bf, L * dim * h, ENG_T_W2, 0);
    for (uint64_t l = 0; l < L; l++) {
        uint8_t *qkv = (uint8_t *)c->wqkv + l * qkv_rows * dim * e;
        GEN(qkv, bf, dim * dim, ENG_T_WQ, l * dim * dim);
        GEN(qkv + dim * dim * e, bf, kv * dim, ENG_T_WK, l * kv * dim);
        GEN(qkv + (dim + kv) * dim * e, bf, kv * dim, ENG_T_WV, l * kv * dim);
        uint8_t *gu = (uint8_t *)c->wgu + l * 2 * h * dim * e;
        GEN(gu, bf, h * dim, ENG_T_W1, l * h * dim);
        GEN(gu + h * dim * e, bf, h * dim, ENG_T_W3, l * h * dim);
    }
    if (!k->shared_classifier)
        GEN(c->wcls, bf, V * dim, ENG_T_WCLS, 0);
#undef GEN
    CU_CHECK(cudaStreamSynchronize(c->st));
    return check_synth(c, m);
fail:
    return rc;
}

/* Host weights (llama2.c float32, GGUF in any supported type), per layer, into the fused
 * device layout: wqkv [L][dim + 2 kv][dim], w1||w3 [L][2 hidden][dim]. */
static int upload_weights(cu *c, const eng_model *m)
{
    int rc = 0;
    const eng_model_tensors *t = eng_model_tensors_of(m);
    const eng_model_config *k = &c->cfg;
    const uint64_t L = k->n_layers, dim = k->dim, kv = c->g.kv_dim, h = k->hidden_dim,
                   V = k->vocab_size, qkv_rows = dim + 2 * kv;
    const size_t e = c->elt;
    char name[64];
    uploader u;
    if ((rc = uploader_init(c, &u)))
        goto out;
#define UP(dst, w, rows, cols, nm)                                                            \
    do {                                                                                      \
        if ((rc = upload_mat(c, &u, (dst), (w), (rows), (cols), (nm))))                       \
            goto out;                                                                         \
    } while (0)
    UP(c->emb, t->token_embedding, V, dim, "token_embd.weight");
    if (!k->shared_classifier)
        UP(c->wcls, t->wcls, V, dim, "output.weight");
    if ((rc = upload_f32(c, c->rms_final, t->rms_final, dim, "output_norm.weight")))
        goto out;
    for (uint64_t l = 0; l < L; l++) {
        const eng_layer_weights *lw = &t->layers[l];
        uint8_t *qkv = (uint8_t *)c->wqkv + l * qkv_rows * dim * e;
        uint8_t *gu = (uint8_t *)c->wgu + l * 2 * h * dim * e;
        const struct {
            void *dst;
            eng_wmat w;
            uint64_t rows, cols;
            const char *nm;
        } mats[] = {
            {qkv, lw->wq, dim, dim, "attn_q"},
            {qkv + dim * dim * e, lw->wk, kv, dim, "attn_k"},
            {qkv + (dim + kv) * dim * e, lw->wv, kv, dim, "attn_v"},
            {(uint8_t *)c->wo + l * dim * dim * e, lw->wo, dim, dim, "attn_output"},
            {gu, lw->w1, h, dim, "ffn_gate"},
            {gu + h * dim * e, lw->w3, h, dim, "ffn_up"},
            {(uint8_t *)c->w2 + l * dim * h * e, lw->w2, dim, h, "ffn_down"},
        };
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", (int)l, mats[i].nm);
            UP(mats[i].dst, mats[i].w, mats[i].rows, mats[i].cols, name);
        }
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", (int)l);
        if ((rc = upload_f32(c, c->rms_att + l * dim, lw->rms_att, dim, name)))
            goto out;
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", (int)l);
        if ((rc = upload_f32(c, c->rms_ffn + l * dim, lw->rms_ffn, dim, name)))
            goto out;
        if (c->bqkv) { /* the plan has checked: all three or none per layer */
            float *b = c->bqkv + l * qkv_rows;
            if (lw->bq) {
                snprintf(name, sizeof name, "blk.%d.attn_qkv.bias", (int)l);
                if ((rc = upload_f32(c, b, lw->bq, dim, name)) ||
                    (rc = upload_f32(c, b + dim, lw->bk, kv, name)) ||
                    (rc = upload_f32(c, b + dim + kv, lw->bv, kv, name)))
                    goto out;
            } else {
                CU_CHECK(cudaMemset(b, 0, qkv_rows * sizeof(float)));
            }
        }
    }
#undef UP
    CU_CHECK(cudaStreamSynchronize(c->st));
out:
    uploader_free(&u);
    return rc;
fail:
    goto out;
}

static int load_weights(cu *c, const eng_model *m)
{
    const eng_model_config *k = &c->cfg;
    const uint64_t L = k->n_layers, dim = k->dim, kv = c->g.kv_dim, h = k->hidden_dim,
                   V = k->vocab_size, qkv_rows = dim + 2 * kv;
    const size_t e = c->elt;
    TRY(dev_alloc(c, &c->emb, V * dim * e, "embedding"));
    TRY(dev_alloc(c, &c->wqkv, L * qkv_rows * dim * e, "wqkv"));
    TRY(dev_alloc(c, &c->wo, L * dim * dim * e, "wo"));
    TRY(dev_alloc(c, &c->wgu, L * 2 * h * dim * e, "w1/w3"));
    TRY(dev_alloc(c, &c->w2, L * dim * h * e, "w2"));
    if (k->shared_classifier)
        c->wcls = c->emb;
    else
        TRY(dev_alloc(c, &c->wcls, V * dim * e, "wcls"));
    TRY(dev_alloc(c, (void **)&c->rms_att, L * dim * 4, "rms_att"));
    TRY(dev_alloc(c, (void **)&c->rms_ffn, L * dim * 4, "rms_ffn"));
    TRY(dev_alloc(c, (void **)&c->rms_final, dim * 4, "rms_final"));
    if (c->plan.qkv_bias)
        TRY(dev_alloc(c, (void **)&c->bqkv, L * qkv_rows * 4, "q/k/v biases"));
    return c->plan.lazy ? generate_weights(c, m) : upload_weights(c, m);
}

/* ---- metadata ---------------------------------------------------------------------------- */

static int meta_alloc(cu *c)
{
    int rc = 0;
    size_t o = 0;
    const size_t T = (size_t)c->t_max, LC = (size_t)c->logits_cap;
#define SLOT(field, bytes)                                                                    \
    do {                                                                                      \
        c->field = o;                                                                         \
        o = align_up(o + (bytes), 256);                                                       \
    } while (0)
    SLOT(off_tokens, T * 4);
    SLOT(off_positions, T * 4);
    SLOT(off_slots, T * 8);
    SLOT(off_logits_rows, T * 4);
    SLOT(off_tile_seq, T * 4);
    SLOT(off_tile_row0, T * 4);
    SLOT(off_tile_nrows, T * 4);
    SLOT(off_tile_dslot, T * 4);
    SLOT(off_temp, LC * 4);
    SLOT(off_topk, LC * 4);
    SLOT(off_topp, LC * 4);
    SLOT(off_rng, LC * 8);
    SLOT(off_out_tok, LC * 4);
    SLOT(off_block_table, (size_t)c->s_max * c->g.bt_stride * 4);
#undef SLOT
    c->meta_bytes = o;
    CU_CHECK(cudaHostAlloc((void **)&c->meta_h, o, cudaHostAllocDefault));
    memset(c->meta_h, 0, o);
    TRY(dev_alloc(c, (void **)&c->meta_d, o, "batch metadata"));
    c->dm.tokens = (const int32_t *)(c->meta_d + c->off_tokens);
    c->dm.positions = (const int32_t *)(c->meta_d + c->off_positions);
    c->dm.slots = (const int64_t *)(c->meta_d + c->off_slots);
    c->dm.block_table = (const int32_t *)(c->meta_d + c->off_block_table);
    c->dm.logits_rows = (const int32_t *)(c->meta_d + c->off_logits_rows);
    c->dm.tile_seq = (const int32_t *)(c->meta_d + c->off_tile_seq);
    c->dm.tile_row0 = (const int32_t *)(c->meta_d + c->off_tile_row0);
    c->dm.tile_nrows = (const int32_t *)(c->meta_d + c->off_tile_nrows);
    c->dm.tile_dslot = (const int32_t *)(c->meta_d + c->off_tile_dslot);
    return 0;
fail:
    return rc;
}

#define MH(c, off, type) ((type *)((c)->meta_h + (c)->off))
#define MD(c, off, type) ((type *)((c)->meta_d + (c)->off))

/* Copies the first `bytes` of one metadata array to the device (stream-ordered). */
static int meta_put(cu *c, size_t off, size_t bytes)
{
    int rc = 0;
    if (bytes)
        CU_CHECK(cudaMemcpyAsync(c->meta_d + off, c->meta_h + off, bytes, cudaMemcpyHostToDevice,
                                 c->st));
    return 0;
fail:
    return rc;
}

/* ---- forward ------------------------------------------------------------------------------ */

/* C[T][N] (fp32) = A[T][K] · W[N][K]^T + beta · C, all row-major: in cuBLAS's column-major
 * view that is C^T = op_T(W) · A^T with leading dimensions K, K, N. */
static int gemm(cu *c, const void *W, const void *A, float *C, int N, int T, int K, float beta,
                const char *what)
{
    const float alpha = 1.0f;
    if (g_gemv > 0 && c->act_type == CK_BF16 && T <= CK_GEMV_MAX_T && K % 8 == 0) {
        cudaError_t e = ck_gemv_bf16(c->st, W, A, C, N, T, K, beta);
        if (e != cudaSuccess)
            return eng_seterr(-EIO, "cuda: kernel gemv_bf16(%s, N=%d T=%d K=%d): %s (%s)", what,
                              N, T, K, cudaGetErrorString(e), cudaGetErrorName(e));
        return 0;
    }
    const cudaDataType_t t = c->act_type == CK_BF16  ? CUDA_R_16BF
                             : c->act_type == CK_F16 ? CUDA_R_16F
                                                     : CUDA_R_32F;
    cublasStatus_t s = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, t, K,
                                    A, t, K, &beta, C, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return eng_seterr(-EIO, "cublas: cublasGemmEx(%s, N=%d T=%d K=%d): %s", what, N, T, K,
                          cublasGetStatusString(s));
    return 0;
}

#define K_CHECK(call, name)                                                                   \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess)                                                                \
            return eng_seterr(-EIO, "cuda: kernel %s (layer %d): %s (%s)", name, layer,       \
                              cudaGetErrorString(e_), cudaGetErrorName(e_));                  \
    } while (0)

/* Every layer over T rows with n_tiles attention tiles and a split grid of z. */
static int forward_layers(cu *c, int T, int n_tiles, int z)
{
    const ck_geom *g = &c->g;
    const size_t e = c->elt, dim = g->dim, kv = g->kv_dim, h = g->hidden;
    const int qkv_n = (int)(dim + 2 * kv);
    int layer = -1;
    K_CHECK(ck_embed(c->st, g, c->emb, &c->dm, c->x, T), "embed");
    for (layer = 0; layer < g->n_layers; layer++) {
        const size_t l = (size_t)layer;
        K_CHECK(ck_rmsnorm(c->st, g, c->x, NULL, c->rms_att + l * dim, c->xb, T), "rmsnorm_att");
        TRY(gemm(c, (uint8_t *)c->wqkv + l * qkv_n * dim * e, c->xb, c->qkv, qkv_n, T, (int)dim,
                 0.0f, "qkv"));
        K_CHECK(ck_rope_append(c->st, g, &c->dm, c->qkv, c->bqkv ? c->bqkv + l * qkv_n : NULL,
                               c->q, c->pool, layer, T),
                "rope_append");
        K_CHECK(ck_attention(c->st, g, &c->dm, c->q, c->pool, c->att, c->part_acc, c->part_ml,
                             layer, n_tiles, z),
                "attention");
        if (z > 1)
            K_CHECK(ck_attention_combine(c->st, g, &c->dm, c->part_acc, c->part_ml, c->att,
                                         n_tiles),
                    "attention_combine");
        TRY(gemm(c, (uint8_t *)c->wo + l * dim * dim * e, c->att, c->x, (int)dim, T, (int)dim,
                 1.0f, "wo"));
        K_CHECK(ck_rmsnorm(c->st, g, c->x, NULL, c->rms_ffn + l * dim, c->xb, T), "rmsnorm_ffn");
        TRY(gemm(c, (uint8_t *)c->wgu + l * 2 * h * dim * e, c->xb, c->gu, (int)(2 * h), T,
                 (int)dim, 0.0f, "w1/w3"));
        K_CHECK(ck_swiglu(c->st, g, c->gu, c->hb, T), "swiglu");
        TRY(gemm(c, (uint8_t *)c->w2 + l * dim * h * e, c->hb, c->x, (int)dim, T, (int)h, 1.0f,
                 "w2"));
    }
    return 0;
}

/* Final RMSNorm of the n rows listed at rows (device) and the classifier into c->logits. */
static int classify(cu *c, const int32_t *rows, int n)
{
    const int layer = c->g.n_layers;
    if (n <= 0)
        return 0;
    K_CHECK(ck_rmsnorm(c->st, &c->g, c->x, rows, c->rms_final, c->xf, n), "rmsnorm_final");
    return gemm(c, c->wcls, c->xf, c->logits, c->g.vocab, n, c->g.dim, 0.0f, "classifier");
}

/* ---- CUDA graphs ----------------------------------------------------------------------- */

static int bucket_for(const cu *c, int S)
{
    for (int i = 0; i < c->n_buckets; i++)
        if (c->bucket_size[i] >= S)
            return i;
    return -1;
}

static int z_index(int z)
{
    int i = 0;
    while ((1 << i) < z)
        i++;
    return i;
}

/* Captures the forward of a pure-decode batch of B rows (B tiles, split grid z) plus its
 * classifier over B logits rows. Returns 0 or an error (the caller then runs eagerly). */
static int capture_graph(cu *c, int bi, int zi)
{
    int rc = 0;
    const int B = c->bucket_size[bi], z = 1 << zi;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CU_CHECK(cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal));
    rc = forward_layers(c, B, B, z);
    if (!rc)
        rc = classify(c, c->dm.logits_rows, B);
    {
        /* always end the capture, so the stream is usable again */
        cudaError_t e = cudaStreamEndCapture(c->st, &graph);
        if (!rc && e != cudaSuccess) {
            rc = eng_seterr(-EIO, "cuda: cudaStreamEndCapture: %s", cudaGetErrorString(e));
            goto fail;
        }
    }
    if (rc)
        goto fail;
    CU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CU_CHECK(cudaGraphDestroy(graph));
    c->graph[bi][zi] = exec;
    c->graph_gemv[bi][zi] = g_gemv;
    return 0;
fail:
    if (graph)
        (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return rc;
}

/* ---- execute ----------------------------------------------------------------------------- */

/* Copies the batch into the pinned metadata. Returns 0 or -EINVAL for anything the kernels
 * would otherwise read out of bounds with (eng_batch_check has normally caught it). */
static int stage_batch(cu *c, const eng_batch *b, int *n_tiles, int *zmax, bool *pure_decode)
{
    const int T = b->n_tokens, S = b->n_seqs, bs = c->opt.kv_block_size;
    const int G = c->cfg.n_heads / c->cfg.n_kv_heads;
    if (T < 1 || T > c->t_max || S < 1 || S > c->s_max || S > T)
        return eng_seterr(-EINVAL, "cuda: batch n_tokens=%d n_seqs=%d: limits %d and %d", T, S,
                          c->t_max, c->s_max);
    const int64_t n_slots = (int64_t)c->opt.kv_blocks * bs;
    int32_t *tok = MH(c, off_tokens, int32_t), *pos = MH(c, off_positions, int32_t);
    int64_t *slot = MH(c, off_slots, int64_t);
    for (int r = 0; r < T; r++) {
        if (b->tokens[r] < 0 || b->tokens[r] >= c->cfg.vocab_size)
            return eng_seterr(-EINVAL, "cuda: batch token %d is %d (vocab %d)", r, b->tokens[r],
                              c->cfg.vocab_size);
        if (b->slot_mapping[r] < 0 || b->slot_mapping[r] >= n_slots)
            return eng_seterr(-EINVAL, "cuda: batch slot_mapping[%d]=%lld: pool has %lld slots",
                              r, (long long)b->slot_mapping[r], (long long)n_slots);
        tok[r] = b->tokens[r];
        pos[r] = b->positions[r];
        slot[r] = b->slot_mapping[r];
    }
    int32_t *bt = MH(c, off_block_table, int32_t);
    int32_t *ts = MH(c, off_tile_seq, int32_t), *tr = MH(c, off_tile_row0, int32_t),
            *tn = MH(c, off_tile_nrows, int32_t), *td = MH(c, off_tile_dslot, int32_t);
    const int rows_per_tile = CK_ATT_MAXP / G > 0 ? CK_ATT_MAXP / G : 1;
    int nt = 0, z = 1;
    bool decode = true;
    for (int s = 0; s < S; s++) {
        const int q0 = b->query_start[s], q1 = b->query_start[s + 1], len = b->seq_len[s];
        if (q0 < 0 || q1 <= q0 || q1 > T || len < q1 - q0 || len > c->cfg.seq_len)
            return eng_seterr(-EINVAL, "cuda: batch sequence %d: query_start %d..%d, seq_len %d",
                              s, q0, q1, len);
        const int nblk = (len + bs - 1) / bs;
        if (nblk > c->g.bt_stride || nblk > b->block_table_stride)
            return eng_seterr(-EINVAL, "cuda: batch sequence %d: seq_len %d needs %d blocks", s,
                              len, nblk);
        for (int j = 0; j < nblk; j++) {
            int32_t v = b->block_table[(size_t)s * b->block_table_stride + j];
            if (v < 0 || v >= c->opt.kv_blocks)
                return eng_seterr(-EINVAL, "cuda: batch block_table[%d][%d]=%d: pool has %d "
                                           "blocks", s, j, v, c->opt.kv_blocks);
            bt[(size_t)s * c->g.bt_stride + j] = v;
        }
        for (int r = q0; r < q1; r++)
            if (pos[r] != len - (q1 - r))
                return eng_seterr(-EINVAL, "cuda: batch positions[%d]=%d: want %d", r, pos[r],
                                  len - (q1 - r));
        if (q1 - q0 == 1) {
            ts[nt] = s;
            tr[nt] = q0;
            tn[nt] = 1;
            td[nt] = s; /* split slot: one per sequence, s < max_seqs */
            nt++;
            int ns = ck_split_count(len);
            if (ns > z)
                z = ns;
        } else {
            decode = false;
            for (int r = q0; r < q1; r += rows_per_tile) {
                ts[nt] = s;
                tr[nt] = r;
                tn[nt] = q1 - r < rows_per_tile ? q1 - r : rows_per_tile;
                td[nt] = -1;
                nt++;
            }
        }
    }
    *n_tiles = nt;
    *zmax = z;
    *pure_decode = decode && S == T;
    return 0;
}

/* Pads a pure-decode batch of S rows to the bucket size B: padding rows sit at position -1
 * (no keys, zero attention output) with no KV slot. */
static void pad_decode(cu *c, int S, int B, int n_logits)
{
    int32_t *tok = MH(c, off_tokens, int32_t), *pos = MH(c, off_positions, int32_t);
    int64_t *slot = MH(c, off_slots, int64_t);
    int32_t *ts = MH(c, off_tile_seq, int32_t), *tr = MH(c, off_tile_row0, int32_t),
            *tn = MH(c, off_tile_nrows, int32_t), *td = MH(c, off_tile_dslot, int32_t);
    int32_t *lr = MH(c, off_logits_rows, int32_t);
    for (int r = S; r < B; r++) {
        tok[r] = 0;
        pos[r] = -1;
        slot[r] = -1;
        ts[r] = 0;
        tr[r] = r;
        tn[r] = 1;
        td[r] = -1;
    }
    for (int i = n_logits; i < B; i++)
        lr[i] = i < S ? i : 0;
}

static int upload_batch(cu *c, int T, int n_tiles, int S)
{
    TRY(meta_put(c, c->off_tokens, (size_t)T * 4));
    TRY(meta_put(c, c->off_positions, (size_t)T * 4));
    TRY(meta_put(c, c->off_slots, (size_t)T * 8));
    TRY(meta_put(c, c->off_tile_seq, (size_t)n_tiles * 4));
    TRY(meta_put(c, c->off_tile_row0, (size_t)n_tiles * 4));
    TRY(meta_put(c, c->off_tile_nrows, (size_t)n_tiles * 4));
    TRY(meta_put(c, c->off_tile_dslot, (size_t)n_tiles * 4));
    TRY(meta_put(c, c->off_block_table, (size_t)S * c->g.bt_stride * 4));
    return 0;
}

static int ensure_sort_buffers(cu *c)
{
    int rc = 0;
    if (c->sort_tmp)
        return 0;
    const size_t n = (size_t)c->logits_cap * c->g.vocab;
    TRY(dev_alloc(c, (void **)&c->probs, n * 4, "sampling probs"));
    TRY(dev_alloc(c, (void **)&c->probs_sorted, n * 4, "sampling probs (sorted)"));
    TRY(dev_alloc(c, (void **)&c->ids, n * 4, "sampling ids"));
    TRY(dev_alloc(c, (void **)&c->ids_sorted, n * 4, "sampling ids (sorted)"));
    TRY(dev_alloc(c, (void **)&c->offsets, ((size_t)c->logits_cap + 1) * 4, "sampling offsets"));
    {
        int32_t *h = (int32_t *)malloc(((size_t)c->logits_cap + 1) * 4);
        if (!h)
            return eng_seterr(-ENOMEM, "cuda: out of memory for sampling offsets");
        for (int i = 0; i <= c->logits_cap; i++)
            h[i] = i * c->g.vocab;
        cudaError_t e = cudaMemcpy(c->offsets, h, ((size_t)c->logits_cap + 1) * 4,
                                   cudaMemcpyHostToDevice);
        free(h);
        CU_CHECK(e);
    }
    CU_CHECK(ck_sort_bytes(c->g.vocab, c->logits_cap, c->offsets, &c->sort_tmp_bytes));
    TRY(dev_alloc(c, &c->sort_tmp, c->sort_tmp_bytes, "sampling sort scratch"));
    return 0;
fail:
    return rc;
}

/* Samples logits rows [0, n) of c->logits with s[base..], rng[base..] on the device; copies
 * back only the token ids (and the advanced rng states). Synchronizes. */
static int sample_rows(cu *c, int n, const eng_sampling *s, uint64_t *rng, int32_t *out)
{
    int rc = 0;
    float *temp = MH(c, off_temp, float), *topp = MH(c, off_topp, float);
    int32_t *topk = MH(c, off_topk, int32_t);
    uint64_t *rs = MH(c, off_rng, uint64_t);
    bool sort = false, sampled = false;
    for (int i = 0; i < n; i++) {
        temp[i] = s[i].temperature;
        topk[i] = s[i].top_k;
        topp[i] = s[i].top_p;
        rs[i] = rng[i];
        if (s[i].temperature > 0.0f)
            sampled = true;
        if (s[i].temperature > 0.0f &&
            ((s[i].top_k > 0 && s[i].top_k < c->g.vocab) ||
             (s[i].top_p > 0.0f && s[i].top_p < 1.0f)))
            sort = true;
    }
    if (sampled) /* probabilities are staged per row even when no sort follows */
        TRY(ensure_sort_buffers(c));
    TRY(meta_put(c, c->off_temp, (size_t)n * 4));
    TRY(meta_put(c, c->off_topk, (size_t)n * 4));
    TRY(meta_put(c, c->off_topp, (size_t)n * 4));
    TRY(meta_put(c, c->off_rng, (size_t)n * 8));
    {
        float *coins = c->coins;
        CU_CHECK(ck_sample_prepare(c->st, c->logits, c->g.vocab, n, MD(c, off_temp, float),
                                   MD(c, off_topk, int32_t), MD(c, off_topp, float),
                                   MD(c, off_rng, uint64_t), c->probs,
                                   c->ids, coins, MD(c, off_out_tok, int32_t)));
        if (sort)
            CU_CHECK(ck_sample_sorted(c->st, c->sort_tmp, c->sort_tmp_bytes, c->offsets,
                                      c->probs, c->ids, c->probs_sorted, c->ids_sorted,
                                      c->g.vocab, n, MD(c, off_temp, float),
                                      MD(c, off_topk, int32_t), MD(c, off_topp, float), coins,
                                      MD(c, off_out_tok, int32_t)));
    }
    CU_CHECK(cudaMemcpyAsync(MH(c, off_out_tok, int32_t), MD(c, off_out_tok, int32_t),
                             (size_t)n * 4, cudaMemcpyDeviceToHost, c->st));
    CU_CHECK(cudaMemcpyAsync(rs, MD(c, off_rng, uint64_t), (size_t)n * 8, cudaMemcpyDeviceToHost,
                             c->st));
    CU_CHECK(cudaStreamSynchronize(c->st));
    memcpy(out, MH(c, off_out_tok, int32_t), (size_t)n * 4);
    memcpy(rng, rs, (size_t)n * 8);
    return 0;
fail:
    return rc;
}

static int run_batch_on_stream(cu *c, const eng_batch *b, const eng_sampling *s,
                               uint64_t *rng, int32_t *out_tokens, float *logits)
{
    int rc = 0, n_tiles = 0, z = 1;
    bool decode = false;
    TRY(stage_batch(c, b, &n_tiles, &z, &decode));
    const int T = b->n_tokens, S = b->n_seqs, nl = b->n_logits;
    int32_t *lr = MH(c, off_logits_rows, int32_t);
    for (int i = 0; i < nl; i++) {
        if (b->logits_rows[i] < 0 || b->logits_rows[i] >= T)
            return eng_seterr(-EINVAL, "cuda: batch logits_rows[%d]=%d: must be 0..%d", i,
                              b->logits_rows[i], T - 1);
        lr[i] = b->logits_rows[i];
    }
    int bi = -1, zi = 0;
    if (decode && c->graphs_on && nl <= c->logits_cap) {
        bi = bucket_for(c, S);
        zi = z_index(z);
    }
    CU_CHECK(cudaEventRecord(c->ev_start, c->st));
    if (bi >= 0) {
        const int B = c->bucket_size[bi];
        pad_decode(c, S, B, nl);
        TRY(upload_batch(c, B, B, S));
        TRY(meta_put(c, c->off_logits_rows, (size_t)B * 4));
        if (c->graph[bi][zi] && c->graph_gemv[bi][zi] != g_gemv) {
            /* captured with the other GEMM path: capture again */
            CU_CHECK(cudaGraphExecDestroy(c->graph[bi][zi]));
            c->graph[bi][zi] = NULL;
        }
        if (!c->graph[bi][zi]) {
            /* Warm-up: the same forward once eagerly, so cuBLAS picks and loads its kernels
             * for these shapes (and lazily loaded modules load) outside the capture. It
             * writes the very K/V the replay writes again, so running it twice is harmless. */
            TRY(forward_layers(c, B, B, 1 << zi));
            TRY(classify(c, c->dm.logits_rows, B));
        }
        if (!c->graph[bi][zi] && capture_graph(c, bi, zi)) {
            /* Graphs are an optimization: say why once, then run eagerly for good. */
            fprintf(stderr, "ringlm cuda: CUDA graph capture failed (%s); running eagerly\n",
                    eng_errmsg());
            c->graphs_on = false;
            bi = -1;
            /* restage for the eager path once the queued uploads have read the buffer */
            CU_CHECK(cudaStreamSynchronize(c->st));
            TRY(stage_batch(c, b, &n_tiles, &z, &decode));
        }
    }
    if (bi >= 0) {
        CU_CHECK(cudaGraphLaunch(c->graph[bi][zi], c->st));
        g_last_used_graph = 1;
    } else {
        g_last_used_graph = 0;
        TRY(upload_batch(c, T, n_tiles, S));
        TRY(meta_put(c, c->off_logits_rows, (size_t)nl * 4));
        TRY(forward_layers(c, T, n_tiles, z));
    }
    for (int off = 0; off < nl; off += c->logits_cap) {
        const int n = nl - off < c->logits_cap ? nl - off : c->logits_cap;
        if (bi < 0)
            TRY(classify(c, MD(c, off_logits_rows, int32_t) + off, n));
        if (logits)
            CU_CHECK(cudaMemcpyAsync(logits + (size_t)off * c->g.vocab, c->logits,
                                     (size_t)n * c->g.vocab * sizeof(float),
                                     cudaMemcpyDeviceToHost, c->st));
        if (out_tokens)
            TRY(sample_rows(c, n, s + off, rng + off, out_tokens + off));
        else
            CU_CHECK(cudaStreamSynchronize(c->st)); /* c->logits is reused by the next chunk */
    }
    CU_CHECK(cudaEventRecord(c->ev_stop, c->st));
    CU_CHECK(cudaEventSynchronize(c->ev_stop));
    CU_CHECK(cudaEventElapsedTime(&c->last_exec_ms, c->ev_start, c->ev_stop));
    g_last_exec_ms = c->last_exec_ms;
    return 0;
fail:
    return rc;
}

/* A failed batch may leave copies from the pinned metadata queued: drain the stream before
 * the next batch rewrites it (after a sticky device error every later call fails too). */
static int run_batch(cu *c, const eng_batch *b, const eng_sampling *s, uint64_t *rng,
                     int32_t *out_tokens, float *logits)
{
    int rc = run_batch_on_stream(c, b, s, rng, out_tokens, logits);
    if (rc) {
        (void)cudaStreamSynchronize(c->st);
        (void)cudaGetLastError();
    }
    return rc;
}

/* ---- ops ------------------------------------------------------------------------------------ */

static int cu_execute(void *priv, const eng_batch *b, float *logits)
{
    return run_batch((cu *)priv, b, NULL, NULL, NULL, logits);
}

static int cu_execute_sample(void *priv, const eng_batch *b, const eng_sampling *s, uint64_t *rng,
                             int32_t *out_tokens, float *logits)
{
    if (b->n_logits > 0 && (!s || !rng || !out_tokens))
        return eng_seterr(-EINVAL, "cuda: execute_sample needs sampling, rng and out_tokens");
    return run_batch((cu *)priv, b, s, rng, b->n_logits > 0 ? out_tokens : NULL, logits);
}

static size_t cu_kv_block_bytes(void *priv) { return ((cu *)priv)->block_bytes; }
static size_t cu_memory_bytes(void *priv) { return ((cu *)priv)->mem_bytes; }

static int cu_kv_read_block(void *priv, int block, void *dst)
{
    cu *c = (cu *)priv;
    int rc = 0;
    if (block < 0 || block >= c->opt.kv_blocks || !dst)
        return eng_seterr(-EINVAL, "cuda: kv_read_block %d: pool has %d blocks", block,
                          c->opt.kv_blocks);
    CU_CHECK(cudaMemcpyAsync(dst, (uint8_t *)c->pool + (size_t)block * c->block_bytes,
                             c->block_bytes, cudaMemcpyDeviceToHost, c->st));
    CU_CHECK(cudaStreamSynchronize(c->st));
    return 0;
fail:
    return rc;
}

static int cu_kv_write_block(void *priv, int block, const void *src)
{
    cu *c = (cu *)priv;
    int rc = 0;
    if (block < 0 || block >= c->opt.kv_blocks || !src)
        return eng_seterr(-EINVAL, "cuda: kv_write_block %d: pool has %d blocks", block,
                          c->opt.kv_blocks);
    CU_CHECK(cudaMemcpyAsync((uint8_t *)c->pool + (size_t)block * c->block_bytes, src,
                             c->block_bytes, cudaMemcpyHostToDevice, c->st));
    CU_CHECK(cudaStreamSynchronize(c->st));
    return 0;
fail:
    return rc;
}

static int cu_kv_copy_blocks(void *priv, const int32_t *src, const int32_t *dst, int n)
{
    cu *c = (cu *)priv;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= c->opt.kv_blocks || dst[i] < 0 || dst[i] >= c->opt.kv_blocks)
            return eng_seterr(-EINVAL, "cuda: kv_copy_blocks pair %d: %d -> %d, pool has %d "
                                       "blocks", i, src[i], dst[i], c->opt.kv_blocks);
        /* in order on one stream: a chain a->b, b->c behaves as written */
        CU_CHECK(cudaMemcpyAsync((uint8_t *)c->pool + (size_t)dst[i] * c->block_bytes,
                                 (uint8_t *)c->pool + (size_t)src[i] * c->block_bytes,
                                 c->block_bytes, cudaMemcpyDeviceToDevice, c->st));
    }
    CU_CHECK(cudaStreamSynchronize(c->st));
    return 0;
fail:
    return rc;
}

/* ---- async transfers -------------------------------------------------------------------- */

/* Frees finished transfers (their staging buffers); all when wait_all (after a sync). */
static void reap_xfers(cu *c, bool all)
{
    pthread_mutex_lock(&c->xfer_lock);
    cu_xfer **pp = &c->xfers;
    while (*pp) {
        cu_xfer *x = *pp;
        if (all || __atomic_load_n(&x->done, __ATOMIC_ACQUIRE)) {
            *pp = x->next;
            if (x->staging)
                (void)cudaFreeHost(x->staging);
            free(x->host_dst);
            free(x);
        } else {
            pp = &x->next;
        }
    }
    pthread_mutex_unlock(&c->xfer_lock);
}

/* Runs on a CUDA runtime thread when the copies are done: no CUDA calls allowed here. */
static void CUDART_CB xfer_done(void *arg)
{
    cu_xfer *x = (cu_xfer *)arg;
    if (x->dir == ENG_KV_OUT && x->staging)
        for (int i = 0; i < x->n; i++)
            memcpy(x->host_dst[i], (uint8_t *)x->staging + (size_t)i * x->block_bytes,
                   x->block_bytes);
    uint64_t one = 1;
    ssize_t w = write(x->efd, &one, sizeof one);
    (void)w; /* an eventfd write fails only on counter overflow; the daemon reads it anyway */
    __atomic_store_n(&x->done, 1, __ATOMIC_RELEASE);
}

/* Whether [p, p + len) lies in host memory the device can DMA from directly. A memfd
 * mapping (the daemon's host KV tier) is registered whole on first sight; other pageable
 * memory goes through a pinned bounce buffer. */
static bool host_pinned(cu *c, const void *p, size_t len)
{
    const uintptr_t a = (uintptr_t)p;
    for (cu_hostreg *r = c->hostregs; r; r = r->next)
        if (a >= r->start && a + len <= r->end)
            return true;
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) == cudaSuccess && attr.type == cudaMemoryTypeHost)
        return true; /* cudaHostAlloc'd or registered by someone else */
    (void)cudaGetLastError();
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return false;
    char line[512];
    bool ok = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char path[256] = "";
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %255s", &lo, &hi, path) < 2)
            continue;
        if (a < lo || a >= hi)
            continue;
        if (a + len <= hi && strncmp(path, "/memfd:", 7) == 0) {
            cudaError_t e = cudaHostRegister((void *)lo, hi - lo, cudaHostRegisterDefault);
            if (e == cudaSuccess || e == cudaErrorHostMemoryAlreadyRegistered) {
                cu_hostreg *r = (cu_hostreg *)malloc(sizeof *r);
                if (r) {
                    r->start = lo;
                    r->end = hi;
                    r->owned = e == cudaSuccess;
                    r->next = c->hostregs;
                    c->hostregs = r;
                } else if (e == cudaSuccess) {
                    (void)cudaHostUnregister((void *)lo); /* cannot track it: undo */
                    e = cudaErrorMemoryAllocation;
                }
                ok = r != NULL;
            }
            (void)cudaGetLastError();
        }
        break;
    }
    fclose(f);
    return ok;
}

static int cu_kv_transfer_async(void *priv, int dir, const int32_t *blocks, void *const *host,
                                int n, int efd)
{
    cu *c = (cu *)priv;
    int rc = 0;
    cu_xfer *x = NULL;
    if (efd < 0)
        return eng_seterr(-EINVAL, "cuda: kv_transfer_async efd=%d: an eventfd is required", efd);
    if (dir != ENG_KV_OUT && dir != ENG_KV_IN)
        return eng_seterr(-EINVAL, "cuda: kv_transfer_async dir=%d", dir);
    for (int i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= c->opt.kv_blocks || !host[i])
            return eng_seterr(-EINVAL, "cuda: kv_transfer_async block[%d]=%d (pool has %d) or "
                                       "NULL host buffer", i, blocks[i], c->opt.kv_blocks);
    reap_xfers(c, false);
    x = (cu_xfer *)calloc(1, sizeof *x);
    if (!x)
        return eng_seterr(-ENOMEM, "cuda: out of memory for a transfer");
    x->c = c;
    x->efd = efd;
    x->dir = dir;
    x->n = n;
    x->block_bytes = c->block_bytes;
    bool pinned = true;
    for (int i = 0; i < n && pinned; i++)
        pinned = host_pinned(c, host[i], c->block_bytes);
    if (!pinned && n > 0) {
        CU_CHECK(cudaHostAlloc(&x->staging, (size_t)n * c->block_bytes, cudaHostAllocDefault));
        if (dir == ENG_KV_IN) {
            for (int i = 0; i < n; i++)
                memcpy((uint8_t *)x->staging + (size_t)i * c->block_bytes, host[i],
                       c->block_bytes);
        } else {
            x->host_dst = (void **)malloc(sizeof(void *) * (size_t)n);
            if (!x->host_dst) {
                rc = eng_seterr(-ENOMEM, "cuda: out of memory for a transfer");
                goto fail;
            }
            for (int i = 0; i < n; i++)
                x->host_dst[i] = host[i];
        }
    }
    /* The copy stream waits for everything the compute stream has queued so far, so a block
     * swapped out holds the K/V of every batch executed before. */
    CU_CHECK(cudaEventRecord(c->ev_compute, c->st));
    CU_CHECK(cudaStreamWaitEvent(c->copy_st, c->ev_compute, 0));
    for (int i = 0; i < n;) {
        /* Merge runs that are contiguous on both sides into one copy. */
        int run = 1;
        uint8_t *h0 = x->staging ? (uint8_t *)x->staging + (size_t)i * c->block_bytes
                                 : (uint8_t *)host[i];
        while (i + run < n && blocks[i + run] == blocks[i] + run &&
               (x->staging || (uint8_t *)host[i + run] == h0 + (size_t)run * c->block_bytes))
            run++;
        uint8_t *d0 = (uint8_t *)c->pool + (size_t)blocks[i] * c->block_bytes;
        const size_t bytes = (size_t)run * c->block_bytes;
        if (dir == ENG_KV_OUT)
            CU_CHECK(cudaMemcpyAsync(h0, d0, bytes, cudaMemcpyDeviceToHost, c->copy_st));
        else
            CU_CHECK(cudaMemcpyAsync(d0, h0, bytes, cudaMemcpyHostToDevice, c->copy_st));
        i += run;
    }
    CU_CHECK(cudaLaunchHostFunc(c->copy_st, xfer_done, x));
    pthread_mutex_lock(&c->xfer_lock);
    x->next = c->xfers;
    c->xfers = x;
    pthread_mutex_unlock(&c->xfer_lock);
    return 0;
fail:
    /* Copies may already be queued on the copy stream: let them finish before freeing. */
    (void)cudaStreamSynchronize(c->copy_st);
    (void)cudaGetLastError();
    if (x) {
        if (x->staging)
            (void)cudaFreeHost(x->staging);
        free(x->host_dst);
        free(x);
    }
    return rc;
}

/* ---- create / destroy ---------------------------------------------------------------------- */

static void cu_destroy(void *priv)
{
    cu *c = (cu *)priv;
    if (!c)
        return;
    if (c->st)
        (void)cudaStreamSynchronize(c->st);
    if (c->copy_st)
        (void)cudaStreamSynchronize(c->copy_st);
    reap_xfers(c, true);
    for (int i = 0; i < CU_MAX_BUCKETS; i++)
        for (int j = 0; j < CU_Z_BUCKETS; j++)
            if (c->graph[i][j])
                (void)cudaGraphExecDestroy(c->graph[i][j]);
    while (c->hostregs) {
        cu_hostreg *r = c->hostregs;
        c->hostregs = r->next;
        if (r->owned)
            (void)cudaHostUnregister((void *)r->start);
        free(r);
    }
    if (c->blas)
        (void)cublasDestroy(c->blas);
    void *bufs[] = {c->blas_ws, c->emb, c->wqkv, c->wo, c->wgu, c->w2,
                    c->wcls != c->emb ? c->wcls : NULL, c->rms_att, c->rms_ffn, c->rms_final,
                    c->bqkv, c->rope_freq,
                    c->pool, c->x, c->qkv, c->q, c->gu, c->logits, c->part_acc, c->part_ml,
                    c->xb, c->att, c->hb, c->xf, c->meta_d, c->probs, c->probs_sorted, c->coins,
                    c->ids, c->ids_sorted, c->offsets, c->sort_tmp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        dev_free(bufs[i]);
    if (c->meta_h)
        (void)cudaFreeHost(c->meta_h);
    if (c->ev_start)
        (void)cudaEventDestroy(c->ev_start);
    if (c->ev_stop)
        (void)cudaEventDestroy(c->ev_stop);
    if (c->ev_compute)
        (void)cudaEventDestroy(c->ev_compute);
    if (c->st)
        (void)cudaStreamDestroy(c->st);
    if (c->copy_st)
        (void)cudaStreamDestroy(c->copy_st);
    (void)cudaGetLastError();
    pthread_mutex_destroy(&c->xfer_lock);
    free(c);
}

static int cu_create(eng *e, const eng_model *m, const eng_options *opt, void **out)
{
    (void)e;
    int rc = 0, ndev = 0;
    cu *c = NULL;
    *out = NULL;
    const eng_model_config *k = eng_model_cfg(m);
    const eng_model_hparams *hp = eng_model_hparams_of(m);
    eng_dev_plan plan;
    {
        /* what the kernels cannot run is refused before a device is looked for */
        if ((rc = eng_dev_plan_model(m, opt->cuda_dtype == ENG_CUDA_DTYPE_FP32, &plan)))
            return rc;
    }
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev <= 0) {
        (void)cudaGetLastError();
        return eng_seterr(-ENODEV, "no CUDA device: cudaGetDeviceCount: %s",
                          ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    }
    const int hs = k->dim / k->n_heads; /* the plan checked the head geometry */

    c = (cu *)calloc(1, sizeof *c);
    if (!c)
        return eng_seterr(-ENOMEM, "cuda: out of memory");
    pthread_mutex_init(&c->xfer_lock, NULL);
    c->cfg = *k;
    c->opt = *opt;
    c->plan = plan;
    c->act_type = plan.dtype == ENG_W_F32 ? CK_F32 : plan.dtype == ENG_W_F16 ? CK_F16 : CK_BF16;
    c->kv_bf16 = plan.dtype != ENG_W_F32;
    {
        c->device = opt->cuda_device;
        if (c->device < 0 || c->device >= ndev) {
            rc = eng_seterr(-ENODEV, "cuda: device %d (cuda_device): %d device(s)", c->device,
                            ndev);
            goto fail;
        }
        c->graphs_on = !opt->cuda_no_graphs;
        if (g_gemv < 0) {
            const char *gv = getenv("RINGLM_CUDA_GEMV");
            g_gemv = gv && strcmp(gv, "1") == 0;
        }
    }
    c->elt = c->act_type == CK_F32 ? 4 : 2;
    c->kv_elt = c->kv_bf16 ? 2 : 4;
    CU_CHECK(cudaSetDevice(c->device));
    CU_CHECK(cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, c->device));
    CU_CHECK(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
    CU_CHECK(cudaStreamCreateWithFlags(&c->copy_st, cudaStreamNonBlocking));
    CU_CHECK(cudaEventCreate(&c->ev_start));
    CU_CHECK(cudaEventCreate(&c->ev_stop));
    CU_CHECK(cudaEventCreateWithFlags(&c->ev_compute, cudaEventDisableTiming));
    {
        /* A one-word kernel proves the binary has code for this device (sm_90 builds do not
         * run on other architectures) before gigabytes are allocated. */
        void *probe = NULL;
        CU_CHECK(cudaMalloc(&probe, 256));
        cudaError_t pe = ck_fill_pattern(c->st, probe, 256, 1);
        if (pe == cudaSuccess)
            pe = cudaStreamSynchronize(c->st);
        (void)cudaFree(probe);
        if (pe != cudaSuccess) {
            int major = 0, minor = 0;
            (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device);
            (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device);
            rc = eng_seterr(-ENODEV, "cuda: device %d (compute %d.%d) cannot run this build's "
                                     "kernels: %s", c->device, major, minor,
                            cudaGetErrorString(pe));
            (void)cudaGetLastError();
            goto fail;
        }
    }
    BLAS_CHECK(cublasCreate(&c->blas));
    BLAS_CHECK(cublasSetStream(c->blas, c->st));
    {
        /* A fixed workspace keeps cuBLAS from allocating inside graph capture. */
        const size_t ws = (size_t)32 << 20;
        if ((rc = dev_alloc(c, &c->blas_ws, ws, "cublas workspace")))
            goto fail;
        BLAS_CHECK(cublasSetWorkspace(c->blas, c->blas_ws, ws));
    }
    BLAS_CHECK(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));

    c->g.dim = k->dim;
    c->g.hidden = k->hidden_dim;
    c->g.n_layers = k->n_layers;
    c->g.n_heads = k->n_heads;
    c->g.n_kv_heads = k->n_kv_heads;
    c->g.head_size = hs;
    c->g.kv_dim = hs * k->n_kv_heads;
    c->g.vocab = k->vocab_size;
    c->g.block_size = opt->kv_block_size;
    c->g.bt_stride = (k->seq_len + opt->kv_block_size - 1) / opt->kv_block_size;
    c->g.block_elems = (long long)k->n_layers * 2 * c->g.kv_dim * opt->kv_block_size;
    c->g.act_type = c->act_type;
    c->g.kv_bf16 = c->kv_bf16;
    c->g.norm_eps = hp->norm_eps;
    c->g.rope_dim = hp->rope_dim;
    c->g.rope_neox = hp->rope_neox;
    c->block_bytes = (size_t)c->g.block_elems * c->kv_elt;
    c->t_max = opt->max_batch_tokens;
    c->s_max = opt->max_seqs;
    c->logits_cap = c->s_max > 64 ? c->s_max : 64;
    if (c->logits_cap > c->t_max)
        c->logits_cap = c->t_max;
    CU_CHECK(ck_attention_prepare(hs, c->kv_bf16));
    {
        /* the CPU backend's RoPE frequencies (base, dimension, Llama 3.1 factors) */
        const eng_model_tensors *t = eng_model_tensors_of(m);
        const int n = hp->rope_dim / 2;
        float *freq = (float *)malloc((size_t)n * sizeof(float));
        if (!freq) {
            rc = eng_seterr(-ENOMEM, "cuda: out of memory");
            goto fail;
        }
        eng_dev_rope_freqs(hp, t ? t->rope_freq_factors : NULL, freq);
        rc = dev_alloc(c, (void **)&c->rope_freq, (size_t)n * sizeof(float), "RoPE frequencies");
        cudaError_t fe = rc ? cudaSuccess
                            : cudaMemcpy(c->rope_freq, freq, (size_t)n * sizeof(float),
                                         cudaMemcpyHostToDevice);
        free(freq);
        if (rc)
            goto fail;
        CU_CHECK(fe);
        c->g.rope_freq = c->rope_freq;
    }

    if ((rc = load_weights(c, m)))
        goto fail;
    {
        const size_t T = (size_t)c->t_max, dim = k->dim, e2 = c->elt;
        const size_t qkv_n = dim + 2 * (size_t)c->g.kv_dim, h = k->hidden_dim;
        const size_t LC = (size_t)c->logits_cap;
        struct {
            void **p;
            size_t bytes;
            const char *what;
        } a[] = {
            {&c->pool, (size_t)opt->kv_blocks * c->block_bytes, "KV pool"},
            {(void **)&c->x, T * dim * 4, "residual"},
            {&c->xb, T * dim * e2, "normed activations"},
            {(void **)&c->qkv, T * qkv_n * 4, "qkv"},
            {(void **)&c->q, T * dim * 4, "rotated q"},
            {&c->att, T * dim * e2, "attention output"},
            {(void **)&c->gu, T * 2 * h * 4, "gate/up"},
            {&c->hb, T * h * e2, "swiglu output"},
            {&c->xf, LC * dim * e2, "final norm"},
            {(void **)&c->logits, LC * (size_t)k->vocab_size * 4, "logits"},
            {(void **)&c->part_acc, (size_t)c->s_max * dim * CK_MAX_SPLIT * 4, "split partials"},
            {(void **)&c->part_ml, (size_t)c->s_max * k->n_heads * CK_MAX_SPLIT * 2 * 4,
             "split maxima"},
            {(void **)&c->coins, LC * 4, "sampling coins"},
        };
        for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
            if ((rc = dev_alloc(c, a[i].p, a[i].bytes, a[i].what)))
                goto fail;
        /* A pool that starts zeroed makes block dumps of never-written slots deterministic. */
        CU_CHECK(cudaMemsetAsync(c->pool, 0, (size_t)opt->kv_blocks * c->block_bytes, c->st));
    }
    if ((rc = meta_alloc(c)))
        goto fail;
    {
        const int cap = c->s_max < c->t_max ? c->s_max : c->t_max;
        int n = 0;
        for (int b = 1; b < cap && n < CU_MAX_BUCKETS - 1; b *= 2)
            c->bucket_size[n++] = b;
        c->bucket_size[n++] = cap > c->logits_cap ? c->logits_cap : cap;
        c->n_buckets = n;
    }
    CU_CHECK(cudaStreamSynchronize(c->st));
    *out = c;
    return 0;
fail:
    cu_destroy(c);
    return rc;
}

static const eng_backend_ops cuda_ops = {
    "cuda",
    cu_create,
    cu_destroy,
    cu_execute,
    cu_execute_sample,
    cu_kv_block_bytes,
    cu_memory_bytes,
    NULL, /* kv_block_ptr: the pool is device memory */
    NULL, /* kv_pool_base */
    cu_kv_read_block,
    cu_kv_write_block,
    cu_kv_copy_blocks,
    cu_kv_transfer_async,
    NULL, /* run_tasks: log-probability rows run on the calling thread */
    NULL, /* describe */
    NULL, /* kv_ring_ptr: no window rings, every layer's K/V in the blocks (and gemma, */
    NULL, /* kv_ring_bytes: whose windows they are for, is refused at eng_create) */
};

extern "C" __attribute__((visibility("default"))) const eng_backend_ops *ringlm_cuda_backend(void)
{
    return &cuda_ops;
}

/* Device milliseconds (CUDA events) of the last execute in this process, -1 before any. */
extern "C" __attribute__((visibility("default"))) double ringlm_cuda_last_execute_ms(void)
{
    return g_last_exec_ms;
}

/* Switches the skinny-GEMM decode path on (1) or off (0) for every engine of the process;
 * graphs captured with the other path are recaptured on next use. Returns the old value. */
extern "C" __attribute__((visibility("default"))) int ringlm_cuda_set_gemv(int on)
{
    int old = g_gemv > 0;
    g_gemv = on ? 1 : 0;
    return old;
}

/* 1 if the last execute replayed a CUDA graph. */
extern "C" __attribute__((visibility("default"))) int ringlm_cuda_last_used_graph(void)
{
    return g_last_used_graph;
}
