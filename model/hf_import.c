/* SPDX-License-Identifier: MIT */
/*
 * model/hf_import.c — a Hugging Face checkpoint directory written as GGUF (see hf_import.h).
 * The metadata and the tensor table are built first, every source tensor checked against
 * config.json; the data is converted tensor by tensor while the file is written
 * (gw_tensor_fill), so an import holds one tensor in memory beside the mapped shards.
 */
#include "model/hf_import.h"
#include "common/half.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t type_size(int gguf_type)
{
    return gguf_type == GGUF_T_F32 ? 4 : 2;
}

static int gguf_type_of(int st_dtype)
{
    return st_dtype == ST_F32 ? GGUF_T_F32 : st_dtype == ST_F16 ? GGUF_T_F16 : GGUF_T_BF16;
}

/* ---- one output tensor: where its rows come from ---------------------------------------- */

enum { X_NONE, X_PERMUTE, X_PLUS1 };

typedef struct job {
    const st_tensor *src;   /* one source (2-D, or 3-D stacked), or */
    const st_tensor **srcs; /* one per stacked matrix (experts), n_src of them */
    int n_src;
    uint64_t stack;      /* matrices in the output (experts), 1 otherwise */
    uint64_t rows, cols; /* of each; a vector is rows x 1 */
    uint64_t src_rows;   /* a 3-D source: rows of each of its matrices */
    uint64_t row_off;    /* the first row taken from each */
    int xform, n_head;   /* X_PERMUTE: heads of rows / n_head rows */
    int out_type;
    float *gen; /* generated F32 values (RoPE factors), rows of them */
} job;

static void row_to_f32(int dtype, const unsigned char *in, float *out, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        uint16_t h;
        if (dtype == ST_F32) {
            memcpy(&out[i], in + 4 * i, 4);
            continue;
        }
        memcpy(&h, in + 2 * i, 2);
        out[i] = dtype == ST_F16 ? half_f16_to_f32(h) : half_bf16_to_f32(h);
    }
}

static void row_from_f32(int type, const float *in, unsigned char *out, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        if (type == GGUF_T_F32) {
            memcpy(out + 4 * i, &in[i], 4);
            continue;
        }
        uint16_t h = type == GGUF_T_F16 ? half_f32_to_f16(in[i]) : half_f32_to_bf16(in[i]);
        memcpy(out + 2 * i, &h, 2);
    }
}

static int fill(void *ctx, void *buf, size_t bytes)
{
    const job *j = ctx;
    (void)bytes;
    if (j->gen) {
        memcpy(buf, j->gen, (size_t)j->rows * sizeof(float));
        return 0;
    }
    const size_t osz = type_size(j->out_type);
    float *tmp = malloc((size_t)j->cols * sizeof *tmp);
    if (!tmp) return gw_seterr(-ENOMEM, "out of memory");
    unsigned char *out = buf;
    const uint64_t hd = j->xform == X_PERMUTE ? j->rows / (uint64_t)j->n_head : 0;
    for (uint64_t s = 0; s < j->stack; s++) {
        const st_tensor *t = j->n_src ? j->srcs[s] : j->src;
        const size_t esz = st_dtype_size(t->dtype);
        const bool same = gguf_type_of(t->dtype) == j->out_type && j->xform != X_PLUS1;
        for (uint64_t r = 0; r < j->rows; r++) {
            uint64_t sr = r;
            if (j->xform == X_PERMUTE) {
                /* GGUF's "llama" RoPE rotates adjacent pairs, Hugging Face's the two halves of
                 * each head: row 2i + half of a head comes from row half * hd / 2 + i */
                uint64_t h = r / hd, i = r % hd;
                sr = h * hd + (i % 2) * (hd / 2) + i / 2;
            }
            uint64_t idx = (j->n_src ? 0 : s * j->src_rows) + j->row_off + sr;
            const unsigned char *in = (const unsigned char *)t->data + idx * j->cols * esz;
            unsigned char *o = out + (s * j->rows + r) * j->cols * osz;
            if (same) {
                memcpy(o, in, (size_t)j->cols * osz);
                continue;
            }
            row_to_f32(t->dtype, in, tmp, j->cols);
            if (j->xform == X_PLUS1)
                for (uint64_t k = 0; k < j->cols; k++) tmp[k] += 1.0f;
            row_from_f32(j->out_type, tmp, o, j->cols);
        }
    }
    free(tmp);
    return 0;
}

/* ---- the import --------------------------------------------------------------------------- */

enum { A_LLAMA, A_QWEN2, A_QWEN3, A_QWEN3MOE, A_GEMMA2, A_GEMMA3, A_PHI3 };

static const struct {
    const char *hf;
    int id;
    const char *gguf;
} archs[] = {
    {"LlamaForCausalLM", A_LLAMA, "llama"},
    {"MistralForCausalLM", A_LLAMA, "llama"},
    {"Qwen2ForCausalLM", A_QWEN2, "qwen2"},
    {"Qwen3ForCausalLM", A_QWEN3, "qwen3"},
    {"Qwen3MoeForCausalLM", A_QWEN3MOE, "qwen3moe"},
    {"Gemma2ForCausalLM", A_GEMMA2, "gemma2"},
    {"Gemma3ForCausalLM", A_GEMMA3, "gemma3"},
    {"Phi3ForCausalLM", A_PHI3, "phi3"},
    /* Gemma 3's image-text class (4B and up): its language model, the vision tower left */
    {"Gemma3ForConditionalGeneration", A_GEMMA3, "gemma3"},
};

/* Gemma3TextConfig's defaults (transformers), which the image-text checkpoints' text_config
 * leaves out and llama.cpp's converter reads through AutoConfig. */
static json_t *gemma3_text_defaults(void)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:i, s:i}",
                     "vocab_size", 262208, "hidden_size", 2304, "intermediate_size", 9216,
                     "num_hidden_layers", 26, "num_attention_heads", 8, "num_key_value_heads", 4,
                     "head_dim", 256, "max_position_embeddings", 131072, "sliding_window", 4096,
                     "rms_norm_eps", 1e-6, "rope_theta", 1e6, "rope_local_base_freq", 10000.0,
                     "sliding_window_pattern", 6, "query_pre_attn_scalar", 256);
}

typedef struct imp {
    const char *dir;
    char cfg_path[4096];
    json_t *cfg, *text; /* config.json, and its text_config when it has one */
    json_t *defaults;   /* values text_config may leave out (Gemma 3 image-text), or NULL */
    const char *pfx;    /* the language model's tensors: "model.", "language_model.model." ... */
    bool image_text;    /* Gemma3ForConditionalGeneration: its vision tower is not imported */
    st_set *st;
    bool *used; /* per st_at index */
    gguf_writer *w;
    job **jobs;
    size_t n_jobs, cap_jobs;
    int mtype; /* matrices' GGUF type; -1: as stored */
    int file_mtype;
    int arch;
    const char *arch_name;
    long d, ff, L, H, Hkv, hd, V, E, E_used, E_ff;
} imp;

static json_t *cfg_get(const imp *im, const char *key)
{
    json_t *v = im->text ? json_object_get(im->text, key) : NULL;
    if (!v && im->defaults) v = json_object_get(im->defaults, key);
    return v ? v : json_object_get(im->cfg, key);
}

/* An integer of config.json (an integral real too); def < 0: required. */
static int cfg_int(const imp *im, const char *key, long def, long *out)
{
    json_t *v = cfg_get(im, key);
    if (!v || json_is_null(v)) {
        if (def < 0) return gw_seterr(-EINVAL, "%s: \"%s\": required, absent", im->cfg_path, key);
        *out = def;
        return 0;
    }
    double x = json_is_integer(v) ? (double)json_integer_value(v) : json_real_value(v);
    if (!json_is_number(v) || x != floor(x) || x < 1 || x > (double)(1L << 30))
        return gw_seterr(-EINVAL, "%s: \"%s\": a positive integer expected", im->cfg_path, key);
    *out = (long)x;
    return 0;
}

static int cfg_num(const imp *im, const json_t *obj, const char *key, double def, double *out)
{
    json_t *v = obj ? json_object_get(obj, key) : cfg_get(im, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return gw_seterr(-EINVAL, "%s: \"%s\": a number expected", im->cfg_path, key);
    *out = json_number_value(v);
    return 0;
}

/* Looks up a source tensor, checks it against config.json (n dims of shape a, b, c; why says
 * where the shape comes from) and marks it used. optional: absent gives *out NULL. */
static int want(imp *im, const char *name, bool optional, int n, uint64_t a, uint64_t b, uint64_t c,
                const char *why, const st_tensor **out)
{
    *out = NULL;
    const st_tensor *t = st_find(im->st, name);
    if (!t) {
        if (optional) return 0;
        return gw_seterr(-EINVAL, "%s: tensor %s: required by %s, absent from %s", im->dir, name,
                         im->arch_name, st_files(im->st));
    }
    const uint64_t want_shape[3] = {a, b, c};
    bool ok = t->n_dims == n;
    for (int i = 0; ok && i < n; i++) ok = t->shape[i] == want_shape[i];
    if (!ok) {
        char found[128] = "", expect[96] = "";
        size_t u = 0;
        for (int i = 0; i < t->n_dims && u < sizeof found; i++)
            u += (size_t)snprintf(found + u, sizeof found - u, "%s%llu", i ? ", " : "",
                                  (unsigned long long)t->shape[i]);
        u = 0;
        for (int i = 0; i < n && u < sizeof expect; i++)
            u += (size_t)snprintf(expect + u, sizeof expect - u, "%s%llu", i ? ", " : "",
                                  (unsigned long long)want_shape[i]);
        return gw_seterr(-EINVAL, "%s: tensor %s: shape [%s], config.json says [%s] (%s)", t->file,
                         name, found, expect, why);
    }
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16)
        return gw_seterr(-EINVAL, "%s: tensor %s: dtype %s: only F32, F16 and BF16 are imported",
                         t->file, name, st_dtype_name(t->dtype));
    im->used[t - st_at(im->st, 0)] = true;
    *out = t;
    return 0;
}

static job *new_job(imp *im)
{
    if (im->n_jobs == im->cap_jobs) {
        size_t cap = im->cap_jobs ? im->cap_jobs * 2 : 256;
        job **nj = realloc(im->jobs, cap * sizeof *nj);
        if (!nj) return NULL;
        im->jobs = nj;
        im->cap_jobs = cap;
    }
    job *j = calloc(1, sizeof *j);
    if (j) im->jobs[im->n_jobs++] = j;
    return j;
}

/* Adds output tensor name filled by j (its shape: stack x rows x cols, or a vector). */
static int emit(imp *im, const char *name, job *j, bool vector)
{
    if (j->stack == 0) j->stack = 1;
    uint64_t ne[3] = {j->cols, j->rows, j->stack};
    int nd = j->stack > 1 ? 3 : 2;
    if (vector) {
        ne[0] = j->rows;
        nd = 1;
    }
    size_t bytes = (size_t)(j->stack * j->rows * j->cols) * type_size(j->out_type);
    gw_tensor_fill(im->w, name, nd, ne, j->out_type, bytes, fill, j);
    return 0;
}

/* A matrix [rows, cols] from source hf (or NULL when optional and absent), of which the first
 * keep rows are written. */
static int matrix_keep(imp *im, const char *hf, const char *gguf_name, bool optional, uint64_t rows,
                       uint64_t keep, uint64_t cols, int xform, int n_head, bool force_f32,
                       const char *why)
{
    const st_tensor *t;
    int err = want(im, hf, optional, 2, rows, cols, 0, why, &t);
    if (err || !t) return err;
    job *j = new_job(im);
    if (!j) return gw_seterr(-ENOMEM, "out of memory");
    *j = (job){.src = t, .rows = keep, .cols = cols, .xform = xform, .n_head = n_head};
    j->out_type = force_f32 ? GGUF_T_F32 : im->mtype >= 0 ? im->mtype : gguf_type_of(t->dtype);
    if (!force_f32 && im->file_mtype < 0) im->file_mtype = j->out_type;
    return emit(im, gguf_name, j, false);
}

static int matrix(imp *im, const char *hf, const char *gguf_name, bool optional, uint64_t rows,
                  uint64_t cols, int xform, int n_head, bool force_f32, const char *why)
{
    return matrix_keep(im, hf, gguf_name, optional, rows, rows, cols, xform, n_head, force_f32,
                       why);
}

/* A vector of n (norms, biases), written F32. */
static int vector(imp *im, const char *hf, const char *gguf_name, bool optional, uint64_t n,
                  int xform, int n_head, const char *why)
{
    const st_tensor *t;
    int err = want(im, hf, optional, 1, n, 0, 0, why, &t);
    if (err || !t) return err;
    job *j = new_job(im);
    if (!j) return gw_seterr(-ENOMEM, "out of memory");
    *j = (job){
        .src = t, .rows = n, .cols = 1, .xform = xform, .n_head = n_head, .out_type = GGUF_T_F32};
    return emit(im, gguf_name, j, true);
}

static int generated(imp *im, const char *gguf_name, float *v, uint64_t n)
{
    job *j = new_job(im);
    if (!j) {
        free(v);
        return gw_seterr(-ENOMEM, "out of memory");
    }
    *j = (job){.gen = v, .rows = n, .cols = 1, .out_type = GGUF_T_F32};
    return emit(im, gguf_name, j, true);
}

/* qwen3moe's experts of layer l: per-expert matrices (mlp.experts.E.gate_proj ...) or the
 * fused 3-D form (mlp.experts.gate_up_proj [E, 2 ff, d], mlp.experts.down_proj [E, d, ff]),
 * stacked into ffn_{gate,up,down}_exps. */
static int experts(imp *im, long l)
{
    char name[256], gname[96], why[160];
    const uint64_t E = (uint64_t)im->E, ff = (uint64_t)im->E_ff, d = (uint64_t)im->d;
    static const char *const part[3] = {"gate_proj", "up_proj", "down_proj"};
    static const char *const gg[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    snprintf(why, sizeof why, "num_experts %ld, moe_intermediate_size %ld, hidden_size %ld", im->E,
             im->E_ff, im->d);
    snprintf(name, sizeof name, "%slayers.%ld.mlp.experts.gate_up_proj", im->pfx, l);
    const st_tensor *fused = st_find(im->st, name);
    if (!fused) {
        snprintf(name, sizeof name, "%slayers.%ld.mlp.experts.gate_up_proj.weight", im->pfx, l);
        fused = st_find(im->st, name);
    }
    for (int p = 0; p < 3; p++) {
        const bool down = p == 2;
        const uint64_t rows = down ? d : ff, cols = down ? ff : d;
        job *j = new_job(im);
        if (!j) return gw_seterr(-ENOMEM, "out of memory");
        *j = (job){.stack = E, .rows = rows, .cols = cols};
        int err;
        const st_tensor *t;
        if (fused) {
            if (down) {
                snprintf(name, sizeof name, "%slayers.%ld.mlp.experts.down_proj", im->pfx, l);
                if (!st_find(im->st, name))
                    snprintf(name, sizeof name, "%slayers.%ld.mlp.experts.down_proj.weight",
                             im->pfx, l);
                err = want(im, name, false, 3, E, d, ff, why, &t);
                j->src_rows = d;
            } else {
                err = want(im, fused->name, false, 3, E, 2 * ff, d, why, &t);
                j->src_rows = 2 * ff;
                j->row_off = p == 1 ? ff : 0;
            }
            if (err) return err;
            j->src = t;
        } else {
            if (!(j->srcs = calloc(E, sizeof *j->srcs))) return gw_seterr(-ENOMEM, "out of memory");
            j->n_src = (int)E;
            for (uint64_t e = 0; e < E; e++) {
                snprintf(name, sizeof name, "%slayers.%ld.mlp.experts.%llu.%s.weight", im->pfx, l,
                         (unsigned long long)e, part[p]);
                if ((err = want(im, name, false, 2, rows, cols, 0, why, &t))) return err;
                j->srcs[e] = t;
            }
            t = j->srcs[0];
        }
        j->out_type = im->mtype >= 0 ? im->mtype : gguf_type_of(t->dtype);
        snprintf(gname, sizeof gname, "blk.%ld.%s.weight", l, gg[p]);
        if ((err = emit(im, gname, j, false))) return err;
    }
    return 0;
}

static int layer(imp *im, long l)
{
    char hf[256], gg[96], why[3][160];
    const int a = im->arch;
    const bool gemma = a == A_GEMMA2 || a == A_GEMMA3, phi3 = a == A_PHI3;
    const bool moe = a == A_QWEN3MOE;
    const uint64_t d = (uint64_t)im->d, ff = (uint64_t)im->ff, qd = (uint64_t)(im->H * im->hd),
                   kv = (uint64_t)(im->Hkv * im->hd), hd = (uint64_t)im->hd;
    snprintf(why[0], sizeof why[0], "num_attention_heads %ld x head_dim %ld, hidden_size %ld",
             im->H, im->hd, im->d);
    snprintf(why[1], sizeof why[1], "num_key_value_heads %ld x head_dim %ld, hidden_size %ld",
             im->Hkv, im->hd, im->d);
    snprintf(why[2], sizeof why[2], "intermediate_size %ld, hidden_size %ld", im->ff, im->d);
    const int norm_x = gemma ? X_PLUS1 : X_NONE;
    int err = 0;
#define HF(suffix) (snprintf(hf, sizeof hf, "%slayers.%ld.%s", im->pfx, l, suffix), hf)
#define GG(suffix) (snprintf(gg, sizeof gg, "blk.%ld.%s", l, suffix), gg)
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        if ((err = (expr))) return err;                                                            \
    } while (0)
    TRY(vector(im, HF("input_layernorm.weight"), GG("attn_norm.weight"), false, d, norm_x, 0,
               "hidden_size"));
    if (phi3) {
        TRY(matrix(im, HF("self_attn.qkv_proj.weight"), GG("attn_qkv.weight"), false, qd + 2 * kv,
                   d, X_NONE, 0, false, "num_attention_heads + 2 num_key_value_heads, x head_dim"));
    } else {
        const bool perm = a == A_LLAMA;
        TRY(matrix(im, HF("self_attn.q_proj.weight"), GG("attn_q.weight"), false, qd, d,
                   perm ? X_PERMUTE : X_NONE, (int)im->H, false, why[0]));
        TRY(matrix(im, HF("self_attn.k_proj.weight"), GG("attn_k.weight"), false, kv, d,
                   perm ? X_PERMUTE : X_NONE, (int)im->Hkv, false, why[1]));
        TRY(matrix(im, HF("self_attn.v_proj.weight"), GG("attn_v.weight"), false, kv, d, X_NONE, 0,
                   false, why[1]));
        /* biases: qwen2's Q/K/V (required), a llama's attention_bias (optional) */
        const bool need_bias = a == A_QWEN2, may_bias = a == A_LLAMA || need_bias;
        if (may_bias) {
            TRY(vector(im, HF("self_attn.q_proj.bias"), GG("attn_q.bias"), !need_bias, qd,
                       perm ? X_PERMUTE : X_NONE, (int)im->H, why[0]));
            TRY(vector(im, HF("self_attn.k_proj.bias"), GG("attn_k.bias"), !need_bias, kv,
                       perm ? X_PERMUTE : X_NONE, (int)im->Hkv, why[1]));
            TRY(vector(im, HF("self_attn.v_proj.bias"), GG("attn_v.bias"), !need_bias, kv, X_NONE,
                       0, why[1]));
        }
    }
    TRY(matrix(im, HF("self_attn.o_proj.weight"), GG("attn_output.weight"), false, d, qd, X_NONE, 0,
               false, why[0]));
    if (a == A_QWEN3 || moe || a == A_GEMMA3) {
        TRY(vector(im, HF("self_attn.q_norm.weight"), GG("attn_q_norm.weight"), false, hd, norm_x,
                   0, "head_dim"));
        TRY(vector(im, HF("self_attn.k_norm.weight"), GG("attn_k_norm.weight"), false, hd, norm_x,
                   0, "head_dim"));
    }
    if (gemma) {
        TRY(vector(im, HF("post_attention_layernorm.weight"), GG("post_attention_norm.weight"),
                   false, d, norm_x, 0, "hidden_size"));
        TRY(vector(im, HF("pre_feedforward_layernorm.weight"), GG("ffn_norm.weight"), false, d,
                   norm_x, 0, "hidden_size"));
        TRY(vector(im, HF("post_feedforward_layernorm.weight"), GG("post_ffw_norm.weight"), false,
                   d, norm_x, 0, "hidden_size"));
    } else {
        TRY(vector(im, HF("post_attention_layernorm.weight"), GG("ffn_norm.weight"), false, d,
                   X_NONE, 0, "hidden_size"));
    }
    if (moe) {
        char w2[160];
        snprintf(w2, sizeof w2, "num_experts %ld, hidden_size %ld", im->E, im->d);
        TRY(matrix(im, HF("mlp.gate.weight"), GG("ffn_gate_inp.weight"), false, (uint64_t)im->E, d,
                   X_NONE, 0, true, w2));
        TRY(experts(im, l));
    } else if (phi3) {
        TRY(matrix(im, HF("mlp.gate_up_proj.weight"), GG("ffn_up.weight"), false, 2 * ff, d, X_NONE,
                   0, false, why[2]));
        TRY(matrix(im, HF("mlp.down_proj.weight"), GG("ffn_down.weight"), false, d, ff, X_NONE, 0,
                   false, why[2]));
    } else {
        TRY(matrix(im, HF("mlp.gate_proj.weight"), GG("ffn_gate.weight"), false, ff, d, X_NONE, 0,
                   false, why[2]));
        TRY(matrix(im, HF("mlp.down_proj.weight"), GG("ffn_down.weight"), false, d, ff, X_NONE, 0,
                   false, why[2]));
        TRY(matrix(im, HF("mlp.up_proj.weight"), GG("ffn_up.weight"), false, ff, d, X_NONE, 0,
                   false, why[2]));
    }
    return 0;
#undef HF
#undef GG
}

/* The RoPE scaling config.json states: rope_scaling (or transformers 5's rope_parameters). */
static json_t *rope_cfg(const imp *im)
{
    json_t *r = cfg_get(im, "rope_scaling");
    if (!json_is_object(r)) r = cfg_get(im, "rope_parameters");
    if (json_is_object(r) && json_is_object(json_object_get(r, "full_attention")))
        r = json_object_get(r, "full_attention");
    return json_is_object(r) ? r : NULL;
}

static const char *rope_type(const json_t *r)
{
    const char *t = json_string_value(json_object_get(r, "rope_type"));
    if (!t) t = json_string_value(json_object_get(r, "type"));
    return t ? t : "default";
}

/* Llama 3.x: the frequencies' divisors, as convert_hf_to_gguf.py computes them. */
static int llama3_factors(imp *im, const json_t *r, double theta, float **out)
{
    double factor, lo, hi, old_ctx;
    int err;
    if ((err = cfg_num(im, r, "factor", 8.0, &factor)) ||
        (err = cfg_num(im, r, "low_freq_factor", 1.0, &lo)) ||
        (err = cfg_num(im, r, "high_freq_factor", 4.0, &hi)) ||
        (err = cfg_num(im, r, "original_max_position_embeddings", 8192, &old_ctx)))
        return err;
    if (!(factor > 0) || !(hi > lo) || !(old_ctx > 0))
        return gw_seterr(-EINVAL,
                         "%s: rope_scaling (llama3): factor %g, low_freq_factor %g, "
                         "high_freq_factor %g, original_max_position_embeddings %g: need factor "
                         "> 0, high > low and a positive context",
                         im->cfg_path, factor, lo, hi, old_ctx);
    const long half = im->hd / 2;
    float *f = malloc((size_t)half * sizeof *f);
    if (!f) return gw_seterr(-ENOMEM, "out of memory");
    const double lo_wl = old_ctx / lo, hi_wl = old_ctx / hi;
    for (long i = 0; i < half; i++) {
        float freq = 1.0f / powf((float)theta, (float)(2 * i) / (float)im->hd);
        double wl = 2 * M_PI / (double)freq;
        if (wl < hi_wl)
            f[i] = 1.0f;
        else if (wl > lo_wl)
            f[i] = (float)factor;
        else {
            double smooth = (old_ctx / wl - lo) / (hi - lo);
            f[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
    *out = f;
    return 0;
}

/* Phi-3's long-RoPE factors: config.json's list of rope_dim / 2 numbers. */
static int factor_list(imp *im, const json_t *r, const char *key, long n, float **out)
{
    json_t *a = json_object_get(r, key);
    if (!json_is_array(a) || (long)json_array_size(a) != n)
        return gw_seterr(-EINVAL,
                         "%s: rope_scaling.%s: a list of %ld numbers (head_dim / 2) "
                         "expected",
                         im->cfg_path, key, n);
    float *f = malloc((size_t)n * sizeof *f);
    if (!f) return gw_seterr(-ENOMEM, "out of memory");
    for (long i = 0; i < n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_number(v)) {
            free(f);
            return gw_seterr(-EINVAL, "%s: rope_scaling.%s[%ld]: a number expected", im->cfg_path,
                             key, i);
        }
        f[i] = (float)json_number_value(v);
    }
    *out = f;
    return 0;
}

/* Where a checkpoint ships both tokenizer.model and tokenizer.json, which one llama.cpp's
 * convert_hf_to_gguf.py reads for the architecture: SentencePiece's model for llama (and
 * Mistral), qwen2, qwen3 and gemma3 (their set_vocab tries _set_vocab_sentencepiece before
 * the tokenizer.json readers), gemma2 (SentencePiece only) and phi3 unless
 * tokenizer_config.json's tokenizer_class is GPT2Tokenizer (Phi-4); tokenizer.json for
 * qwen3moe (Qwen2MoeModel's set_vocab is the GPT-2 reader). */
static bool spm_first(int a, const char *tok_cfg_path)
{
    if (a == A_QWEN3MOE) return false;
    if (a != A_PHI3) return true;
    json_t *cfg = json_load_file(tok_cfg_path, 0, NULL);
    const char *cls = json_string_value(json_object_get(cfg, "tokenizer_class"));
    const bool gpt2 = cls && strcmp(cls, "GPT2Tokenizer") == 0;
    json_decref(cfg);
    return !gpt2;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, 4096, f);
        len += n;
        if (n < 4096) break;
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

static int import(imp *im, const char *out, char *note, size_t note_len)
{
    int err;
    char path[4096], key[160];
    snprintf(im->cfg_path, sizeof im->cfg_path, "%s/config.json", im->dir);
    json_error_t je;
    if (!(im->cfg = json_load_file(im->cfg_path, 0, &je)))
        return gw_seterr(access(im->cfg_path, F_OK) ? -ENOENT : -EINVAL, "%s:%d: %s", im->cfg_path,
                         je.line, je.text);
    im->text = json_object_get(im->cfg, "text_config");
    if (!json_is_object(im->text)) im->text = NULL;
    const char *hf_arch =
        json_string_value(json_array_get(json_object_get(im->cfg, "architectures"), 0));
    im->arch = -1;
    for (size_t i = 0; hf_arch && i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(archs[i].hf, hf_arch) == 0) {
            im->arch = archs[i].id;
            im->arch_name = archs[i].gguf;
        }
    im->image_text = hf_arch && strcmp(hf_arch, "Gemma3ForConditionalGeneration") == 0;
    if (im->image_text && !(im->defaults = gemma3_text_defaults()))
        return gw_seterr(-ENOMEM, "out of memory");
    if (im->arch < 0)
        return gw_seterr(-EINVAL,
                         "%s: architectures[0] \"%.64s\": not supported (LlamaForCausalLM, "
                         "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                         "Qwen3MoeForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, "
                         "Gemma3ForConditionalGeneration, Phi3ForCausalLM)",
                         im->cfg_path, hf_arch ? hf_arch : "(absent)");
    const int a = im->arch;
    const bool gemma = a == A_GEMMA2 || a == A_GEMMA3, moe = a == A_QWEN3MOE, phi3 = a == A_PHI3;
    long ctx;
    if ((err = cfg_int(im, "hidden_size", -1, &im->d)) ||
        (err = cfg_int(im, "intermediate_size", -1, &im->ff)) ||
        (err = cfg_int(im, "num_hidden_layers", -1, &im->L)) ||
        (err = cfg_int(im, "num_attention_heads", -1, &im->H)) ||
        (err = cfg_int(im, "num_key_value_heads", im->H, &im->Hkv)) ||
        (err = cfg_int(im, "vocab_size", -1, &im->V)) ||
        (err = cfg_int(im, "max_position_embeddings", gemma ? 131072 : 4096, &ctx)))
        return err;
    if (im->d % im->H || im->H % im->Hkv)
        return gw_seterr(-EINVAL,
                         "%s: hidden_size %ld, num_attention_heads %ld, num_key_value_heads "
                         "%ld: the heads must divide",
                         im->cfg_path, im->d, im->H, im->Hkv);
    if ((err = cfg_int(im, "head_dim", im->d / im->H, &im->hd))) return err;
    if (im->hd % 2)
        return gw_seterr(-EINVAL, "%s: head_dim %ld: must be even", im->cfg_path, im->hd);
    if (moe) {
        long step = 1;
        json_t *mlp_only = cfg_get(im, "mlp_only_layers");
        if ((err = cfg_int(im, "num_experts", -1, &im->E)) ||
            (err = cfg_int(im, "num_experts_per_tok", -1, &im->E_used)) ||
            (err = cfg_int(im, "moe_intermediate_size", -1, &im->E_ff)) ||
            (err = cfg_int(im, "decoder_sparse_step", 1, &step)))
            return err;
        if (step != 1 || json_array_size(mlp_only) > 0)
            return gw_seterr(-EINVAL,
                             "%s: decoder_sparse_step %ld / mlp_only_layers: dense layers among "
                             "the experts are not supported",
                             im->cfg_path, step);
    }
    double eps, theta;
    if ((err = cfg_num(im, NULL, "rms_norm_eps", gemma ? 1e-6 : 1e-5, &eps))) return err;
    json_t *rs = rope_cfg(im);
    json_t *theta_v = cfg_get(im, "rope_theta");
    if (!theta_v && rs) theta_v = json_object_get(rs, "rope_theta");
    theta = json_is_number(theta_v) ? json_number_value(theta_v) : a == A_GEMMA3 ? 1e6 : 10000.0;
    const char *rtype = rs ? rope_type(rs) : "default";
    const bool llama3 = strcmp(rtype, "llama3") == 0;
    const bool longrope = strcmp(rtype, "longrope") == 0 || strcmp(rtype, "su") == 0;
    if (strcmp(rtype, "default") && strcmp(rtype, "linear") && strcmp(rtype, "yarn") &&
        strcmp(rtype, "dynamic") && !(llama3 && a == A_LLAMA) && !(longrope && phi3))
        return gw_seterr(-EINVAL, "%s: rope_scaling type \"%.32s\": not supported for %s",
                         im->cfg_path, rtype, im->arch_name);
    if (phi3 && !longrope && rs && strcmp(rtype, "default"))
        return gw_seterr(-EINVAL, "%s: rope_scaling type \"%.32s\": phi3 takes longrope",
                         im->cfg_path, rtype);

    if ((err = st_open_dir(im->dir, &im->st))) return gw_seterr(err, "%s", st_errmsg());
    if (!(im->used = calloc(st_count(im->st) + 1, sizeof *im->used)))
        return gw_seterr(-ENOMEM, "out of memory");
    /* where the language model's tensors are: transformers before 4.52 saved an image-text
     * model's as language_model.model.*, later ones as model.language_model.* */
    im->pfx = "model.";
    if (im->image_text) {
        static const char *const pfx[] = {"language_model.model.", "model.language_model."};
        for (size_t i = 0; i < sizeof pfx / sizeof pfx[0]; i++) {
            snprintf(path, sizeof path, "%sembed_tokens.weight", pfx[i]);
            if (st_find(im->st, path)) im->pfx = pfx[i];
        }
    }

    gw_vocab *vocab = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", im->dir);
    char cfg2[4096];
    snprintf(cfg2, sizeof cfg2, "%s/tokenizer_config.json", im->dir);
    char spm_path[4096];
    snprintf(spm_path, sizeof spm_path, "%s/tokenizer.model", im->dir);
    const bool has_spm = access(spm_path, F_OK) == 0;
    const bool spm = has_spm && (access(path, F_OK) != 0 || spm_first(a, cfg2));
    if (spm) {
        /* Llama 2, Mistral v0.1 and Gemma checkpoints may ship only SentencePiece's model;
         * many ship both */
        if ((err = gw_vocab_from_spm(im->dir, (int)im->V, &vocab))) return err;
        if (gemma) vocab->no_space_prefix = true; /* as the converter writes Gemma's */
    } else if (access(path, F_OK) != 0) {
        return gw_seterr(-ENOENT,
                         "%s: absent, and no tokenizer.model (the vocabulary is read "
                         "from one of them)",
                         path);
    } else if ((err = gw_vocab_from_hf_config(path, access(cfg2, F_OK) == 0 ? cfg2 : NULL,
                                              im->cfg_path, (int)im->V, &vocab))) {
        return err;
    }
    if (!vocab->chat_template) { /* newer checkpoints keep it beside the config */
        snprintf(path, sizeof path, "%s/chat_template.jinja", im->dir);
        vocab->chat_template = read_text(path);
    }

    /* Gemma 3: the embedding keeps the tokenizer's rows, as the converter's Gemma3Model
     * trims token_embd to tokenizer.json's model.vocab + added_tokens (a checkpoint may pad
     * vocab_size past them); where a tokenizer.model is there, the converter's count is
     * vocab_size and nothing is trimmed */
    uint64_t embd_rows = (uint64_t)im->V;
    if (a == A_GEMMA3 && !has_spm && vocab->n_listed < vocab->n) {
        embd_rows = vocab->n_listed;
        if ((err = gw_vocab_trim(vocab, vocab->n_listed, path))) {
            gw_vocab_free(vocab);
            return err;
        }
    }

    gguf_writer *w = im->w = gw_new();
    if (!w) {
        gw_vocab_free(vocab);
        return gw_seterr(-ENOMEM, "out of memory");
    }
    const char *an = im->arch_name;
    const char *base = strrchr(im->dir, '/');
    base = base && base[1] ? base + 1 : im->dir;
    gw_str(w, "general.architecture", an);
    gw_str(w, "general.name", base);
#define U32(suffix, v) (snprintf(key, sizeof key, "%s." suffix, an), gw_u32(w, key, (uint32_t)(v)))
#define F32(suffix, v) (snprintf(key, sizeof key, "%s." suffix, an), gw_f32(w, key, (float)(v)))
    U32("block_count", im->L);
    U32("context_length", ctx);
    U32("embedding_length", im->d);
    U32("feed_forward_length", im->ff);
    U32("attention.head_count", im->H);
    U32("attention.head_count_kv", im->Hkv);
    if (a != A_GEMMA2) F32("rope.freq_base", theta);
    F32("attention.layer_norm_rms_epsilon", eps);
    if (cfg_get(im, "head_dim") || gemma) {
        U32("attention.key_length", im->hd);
        U32("attention.value_length", im->hd);
    }
    if (a == A_LLAMA || phi3) U32("rope.dimension_count", im->hd);
    if (a == A_LLAMA) U32("vocab_size", im->V);
    if (moe) {
        U32("expert_count", im->E);
        U32("expert_used_count", im->E_used);
        U32("expert_feed_forward_length", im->E_ff);
    }
    long window = 0;
    json_t *sw = cfg_get(im, "sliding_window");
    if (json_is_integer(sw) && json_integer_value(sw) > 0 && json_integer_value(sw) < (1L << 30))
        window = (long)json_integer_value(sw);
    if (a == A_GEMMA2) {
        double softcap, final_cap;
        if ((err = cfg_num(im, NULL, "attn_logit_softcapping", 50.0, &softcap)) ||
            (err = cfg_num(im, NULL, "final_logit_softcapping", 30.0, &final_cap)))
            goto out;
        F32("attn_logit_softcapping", softcap);
        F32("final_logit_softcapping", final_cap);
        U32("attention.sliding_window", window ? window : 4096);
    }
    if (a == A_GEMMA3) {
        double local_theta, final_cap;
        long pattern = 6;
        if ((err = cfg_num(im, NULL, "rope_local_base_freq", 10000.0, &local_theta)) ||
            (err = cfg_num(im, NULL, "final_logit_softcapping", 0.0, &final_cap)) ||
            (err = cfg_int(im, "sliding_window_pattern", 6, &pattern)))
            goto out;
        F32("rope.freq_base_swa", local_theta);
        if (final_cap > 0) F32("final_logit_softcapping", final_cap);
        if (pattern != 1 && window) U32("attention.sliding_window", window);
        if (pattern != 6 && pattern != 1) {
            err = gw_seterr(-EINVAL,
                            "%s: sliding_window_pattern %ld: gemma3 files carry none (llama.cpp "
                            "takes 6)",
                            im->cfg_path, pattern);
            goto out;
        }
    }
    /* Mistral's window (llama files): every layer's */
    if (a == A_LLAMA && window && window < ctx) U32("attention.sliding_window", window);
    if (!strcmp(rtype, "linear") || !strcmp(rtype, "yarn")) {
        double factor, orig;
        if ((err = cfg_num(im, rs, "factor", 1.0, &factor))) goto out;
        snprintf(key, sizeof key, "%s.rope.scaling.type", an);
        gw_str(w, key, rtype);
        F32("rope.scaling.factor", factor);
        if (!strcmp(rtype, "yarn")) {
            if ((err = cfg_num(im, rs, "original_max_position_embeddings", 0, &orig))) goto out;
            if (!(orig >= 1)) {
                err = gw_seterr(-EINVAL,
                                "%s: rope_scaling (yarn): original_max_position_embeddings "
                                "required",
                                im->cfg_path);
                goto out;
            }
            U32("rope.scaling.original_context_length", (long)orig);
            static const char *const yk[][3] = {
                {"extrapolation_factor", NULL, "rope.scaling.yarn_ext_factor"},
                {"attention_factor", "attn_factor", "rope.scaling.yarn_attn_factor"},
                {"beta_fast", NULL, "rope.scaling.yarn_beta_fast"},
                {"beta_slow", NULL, "rope.scaling.yarn_beta_slow"},
            };
            for (size_t i = 0; i < sizeof yk / sizeof yk[0]; i++) {
                json_t *v = json_object_get(rs, yk[i][0]);
                if (!v && yk[i][1]) v = json_object_get(rs, yk[i][1]);
                if (!json_is_number(v)) continue;
                snprintf(key, sizeof key, "%s.%s", an, yk[i][2]);
                gw_f32(w, key, (float)json_number_value(v));
            }
        }
    }
    if (phi3) {
        long orig;
        json_t *o = rs ? json_object_get(rs, "original_max_position_embeddings") : NULL;
        if (json_is_integer(o))
            orig = (long)json_integer_value(o);
        else if ((err = cfg_int(im, "original_max_position_embeddings", ctx, &orig)))
            goto out;
        U32("rope.scaling.original_context_length", orig);
        U32("attention.sliding_window", window);
        if (longrope) {
            double scale = (double)ctx / (double)orig;
            F32("rope.scaling.attn_factor",
                scale > 1.0 ? sqrt(1 + log(scale) / log((double)orig)) : 1.0);
        }
    }
#undef U32
#undef F32
    gw_vocab_add(w, vocab);

    /* tensors */
    char why[128];
    snprintf(why, sizeof why, "vocab_size %ld, hidden_size %ld", im->V, im->d);
    const uint64_t d = (uint64_t)im->d, V = (uint64_t)im->V;
    snprintf(path, sizeof path, "%sembed_tokens.weight", im->pfx);
    if ((err = matrix_keep(im, path, "token_embd.weight", false, V, embd_rows, d, X_NONE, 0, false,
                           why)))
        goto out;
    for (long l = 0; l < im->L && !err; l++) err = layer(im, l);
    if (err) goto out;
    if (llama3) {
        float *f = NULL;
        if ((err = llama3_factors(im, rs, theta, &f)) ||
            (err = generated(im, "rope_freqs.weight", f, (uint64_t)im->hd / 2)))
            goto out;
    }
    if (phi3 && longrope) {
        float *fl = NULL, *fs = NULL;
        if ((err = factor_list(im, rs, "long_factor", im->hd / 2, &fl))) goto out;
        if ((err = generated(im, "rope_factors_long.weight", fl, (uint64_t)im->hd / 2)) ||
            (err = factor_list(im, rs, "short_factor", im->hd / 2, &fs)) ||
            (err = generated(im, "rope_factors_short.weight", fs, (uint64_t)im->hd / 2)))
            goto out;
    }
    snprintf(path, sizeof path, "%snorm.weight", im->pfx);
    if ((err = vector(im, path, "output_norm.weight", false, d, gemma ? X_PLUS1 : X_NONE, 0,
                      "hidden_size")))
        goto out;
    /* the classifier: absent when tied to the embedding; gemma's is always the embedding */
    if (gemma) {
        static const char *const heads[] = {"lm_head.weight", "language_model.lm_head.weight"};
        for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
            const st_tensor *t = st_find(im->st, heads[i]);
            if (t) im->used[t - st_at(im->st, 0)] = true;
        }
    } else if ((err = matrix(im, "lm_head.weight", "output.weight", true, V, d, X_NONE, 0, false,
                             why))) {
        goto out;
    }
    long vision = 0; /* an image-text model's vision tower and projector: not imported */
    for (size_t i = 0; i < st_count(im->st); i++) {
        const st_tensor *t = st_at(im->st, i);
        size_t n = strlen(t->name);
        if (im->used[i] || (n >= 20 && strcmp(t->name + n - 20, "rotary_emb.inv_freq") == 0))
            continue;
        static const char *const tower[] = {"vision_tower.", "multi_modal_projector.",
                                            "model.vision_tower.", "model.multi_modal_projector."};
        bool skip = false;
        for (size_t k = 0; im->image_text && k < sizeof tower / sizeof tower[0]; k++)
            skip = skip || strncmp(t->name, tower[k], strlen(tower[k])) == 0;
        if (skip) {
            vision++;
            continue;
        }
        err = gw_seterr(-EINVAL,
                        "%s: tensor %s: not part of a %s model as ringlm imports it (not "
                        "supported)",
                        t->file, t->name, an);
        goto out;
    }
    gw_u32(w, "general.file_type",
           im->file_mtype == GGUF_T_F32   ? 0
           : im->file_mtype == GGUF_T_F16 ? 1
                                          : 32);
    if ((err = gw_write(w, out))) goto out;
    if (note)
        snprintf(note, note_len, "%s (%s), %ld layers, %s matrices%s%s%s%s%s", an, hf_arch, im->L,
                 gguf_type_name((uint32_t)im->file_mtype), llama3 ? ", Llama 3 RoPE factors" : "",
                 spm ? ", vocabulary from tokenizer.model" : "",
                 embd_rows < V ? ", embedding trimmed to the tokenizer's rows" : "",
                 vocab->chat_template ? ", chat template" : "",
                 vision ? ", the language model only (the vision tower is not imported)" : "");
out:
    gw_vocab_free(vocab);
    return err;
}

int hf_import(const char *dir, const char *out, const hf_import_opts *o, char *note,
              size_t note_len)
{
    if (note && note_len) note[0] = '\0';
    imp im = {.dir = dir, .mtype = -1, .file_mtype = -1};
    if (o && o->type) {
        if (!strcmp(o->type, "F32"))
            im.mtype = GGUF_T_F32;
        else if (!strcmp(o->type, "F16"))
            im.mtype = GGUF_T_F16;
        else if (!strcmp(o->type, "BF16"))
            im.mtype = GGUF_T_BF16;
        else
            return gw_seterr(-EINVAL,
                             "--type %s: an import writes F32, F16 or BF16 (quantize the "
                             "result with --type afterwards)",
                             o->type);
    }
    int err = import(&im, out, note, note_len);
    for (size_t i = 0; i < im.n_jobs; i++) {
        free(im.jobs[i]->srcs);
        free(im.jobs[i]->gen);
        free(im.jobs[i]);
    }
    free(im.jobs);
    free(im.used);
    gw_free(im.w);
    st_close(im.st);
    json_decref(im.cfg);
    json_decref(im.defaults);
    return err;
}
