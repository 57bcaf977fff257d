/* SPDX-License-Identifier: MIT */
/*
 * kernels/devload.c — the host side of loading a model onto a device (kernels/devload.h):
 * the type plan, the row conversion and the RoPE table, in plain C. eng_create calls the
 * plan for backend "cuda" before the plugin is looked for, so what the device cannot run is
 * refused the same way with or without a GPU; the plugin calls the plan and the conversion
 * again while it uploads (this executable exports them: -rdynamic).
 */
#include "kernels/devload.h"
#include "kernels/cpu/quant.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char convertible[] = "F32, F16, BF16, Q8_0, Q4_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, "
                                  "IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS";

static size_t dtype_bytes(int dtype)
{
    return dtype == ENG_W_F32 ? 4 : 2;
}

/* One weight matrix to check: its GGUF name, the tensor, its row length. */
static int check_mat(const char *name, eng_wmat w, int64_t cols, eng_dev_plan *p)
{
    if (!w.data) return eng_seterr(-EINVAL, "cuda: tensor %s: absent", name);
    if (!q_type_supported(w.type))
        return eng_seterr(-ENOTSUP,
                          "cuda: tensor %s: type %s cannot be loaded onto the device "
                          "(%s)",
                          name, eng_wtype_name(w.type), convertible);
    if (cols % q_block_elems(w.type))
        return eng_seterr(-EINVAL,
                          "cuda: tensor %s: rows of %" PRId64 " elements are not whole "
                          "%s blocks of %d",
                          name, cols, eng_wtype_name(w.type), q_block_elems(w.type));
    if (w.type >= 0 && w.type < (int)(sizeof p->n_mats / sizeof p->n_mats[0])) p->n_mats[w.type]++;
    return 0;
}

int eng_dev_plan_make(const eng_model_config *c, const eng_model_hparams *hp,
                      const eng_model_tensors *t, bool fp32, eng_dev_plan *out)
{
    memset(out, 0, sizeof *out);
    if (c->dim < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->n_layers < 1 || c->hidden_dim < 1 ||
        c->vocab_size < 1 || c->dim % c->n_heads || c->n_heads % c->n_kv_heads)
        return eng_seterr(-EINVAL, "cuda: dim=%d n_heads=%d n_kv_heads=%d: heads must divide",
                          c->dim, c->n_heads, c->n_kv_heads);
    /* The CUDA kernels run the llama and qwen2 graphs with heads of dim / n_heads; other
     * architectures (their extra norms, soft-capping, windows, experts) run on the CPU. */
    if (hp->arch != ENG_ARCH_LLAMA && hp->arch != ENG_ARCH_QWEN2)
        return eng_seterr(-ENOTSUP,
                          "cuda: architecture %s is not supported by the CUDA backend (llama, "
                          "qwen2); run it on backend cpu",
                          eng_arch_name(hp->arch));
    if (hp->head_dim && hp->head_dim * c->n_heads != c->dim)
        return eng_seterr(-ENOTSUP,
                          "cuda: head size %d x %d heads != dim %d (attention.key_length): not "
                          "supported by the CUDA backend; run it on backend cpu",
                          hp->head_dim, c->n_heads, c->dim);
    const int hs = c->dim / c->n_heads, group = c->n_heads / c->n_kv_heads;
    if (hs % 2 || hs > ENG_CUDA_MAX_HEAD_SIZE)
        return eng_seterr(-ENOTSUP,
                          "cuda: head_size=%d (dim %d / n_heads %d): the CUDA "
                          "attention kernel supports even sizes up to %d",
                          hs, c->dim, c->n_heads, ENG_CUDA_MAX_HEAD_SIZE);
    if (group > ENG_CUDA_MAX_GROUP)
        return eng_seterr(-ENOTSUP,
                          "cuda: %d query heads per KV head (n_heads %d, n_kv_heads "
                          "%d): the CUDA attention kernel supports at most %d",
                          group, c->n_heads, c->n_kv_heads, ENG_CUDA_MAX_GROUP);
    if (hp->rope_dim < 2 || hp->rope_dim > hs || hp->rope_dim % 2)
        return eng_seterr(-ENOTSUP, "cuda: rope_dim=%d: must be even and 2..head_size=%d",
                          hp->rope_dim, hs);
    if (!(hp->norm_eps > 0.0f) || !isfinite(hp->norm_eps) || !(hp->rope_theta > 0.0f) ||
        !isfinite(hp->rope_theta))
        return eng_seterr(-EINVAL, "cuda: norm_eps=%g rope_theta=%g: must be positive and finite",
                          (double)hp->norm_eps, (double)hp->rope_theta);
    out->lazy = t == NULL;
    const uint64_t d = (uint64_t)c->dim, kv = (uint64_t)hs * (uint64_t)c->n_kv_heads;
    const uint64_t h = (uint64_t)c->hidden_dim, V = (uint64_t)c->vocab_size;
    const uint64_t L = (uint64_t)c->n_layers;
    const uint64_t elems =
        V * d * (c->shared_classifier ? 1 : 2) + L * (d * (d + 2 * kv) + d * d + 3 * h * d);
    if (!t) { /* lazy: generated on the device in the engine's type */
        out->dtype = fp32 ? ENG_W_F32 : ENG_W_BF16;
        out->weight_bytes = elems * dtype_bytes(out->dtype);
        snprintf(out->summary, sizeof out->summary, "generated on the device -> %s",
                 eng_wtype_name(out->dtype));
        return 0;
    }
    int err;
    if ((err = check_mat("token_embd.weight", t->token_embedding, c->dim, out))) return err;
    if (!c->shared_classifier && (err = check_mat("output.weight", t->wcls, c->dim, out)))
        return err;
    if (!t->rms_final) return eng_seterr(-EINVAL, "cuda: tensor output_norm.weight: absent");
    if (!t->layers) return eng_seterr(-EINVAL, "cuda: the model has no layer weights");
    for (int l = 0; l < c->n_layers; l++) {
        const eng_layer_weights *lw = &t->layers[l];
        const struct {
            const char *name;
            eng_wmat w;
            uint64_t cols;
        } mats[] = {
            {"attn_q", lw->wq, d},      {"attn_k", lw->wk, d},   {"attn_v", lw->wv, d},
            {"attn_output", lw->wo, d}, {"ffn_gate", lw->w1, d}, {"ffn_down", lw->w2, h},
            {"ffn_up", lw->w3, d},
        };
        char name[64];
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, mats[i].name);
            if ((err = check_mat(name, mats[i].w, (int64_t)mats[i].cols, out))) return err;
        }
        if (!lw->rms_att || !lw->rms_ffn)
            return eng_seterr(-EINVAL, "cuda: tensor blk.%d.%s: absent", l,
                              lw->rms_att ? "ffn_norm.weight" : "attn_norm.weight");
        const int nb = !!lw->bq + !!lw->bk + !!lw->bv;
        if (nb != 0 && nb != 3)
            return eng_seterr(-ENOTSUP,
                              "cuda: blk.%d: attn_q.bias %s, attn_k.bias %s, "
                              "attn_v.bias %s: Q/K/V biases are supported all three "
                              "or none",
                              l, lw->bq ? "present" : "absent", lw->bk ? "present" : "absent",
                              lw->bv ? "present" : "absent");
        out->qkv_bias |= nb == 3;
    }
    int total = 0;
    for (size_t i = 0; i < sizeof out->n_mats / sizeof out->n_mats[0]; i++) total += out->n_mats[i];
    out->dtype = fp32 ? ENG_W_F32 : out->n_mats[ENG_W_F16] == total ? ENG_W_F16 : ENG_W_BF16;
    out->weight_bytes = elems * dtype_bytes(out->dtype);
    size_t used = 0;
    for (size_t i = 0; i < sizeof out->n_mats / sizeof out->n_mats[0]; i++)
        if (out->n_mats[i] && used < sizeof out->summary)
            used += (size_t)snprintf(out->summary + used, sizeof out->summary - used, "%s%s x %d",
                                     used ? ", " : "", eng_wtype_name((int)i), out->n_mats[i]);
    bool as_is = out->n_mats[out->dtype] == total;
    if (used < sizeof out->summary)
        snprintf(out->summary + used, sizeof out->summary - used, " -> %s (%s)",
                 eng_wtype_name(out->dtype),
                 as_is ? "uploaded as they are" : "converted on the host at load");
    return 0;
}

int eng_dev_plan_model(const eng_model *m, bool fp32, eng_dev_plan *out)
{
    const eng_model_tensors *t = eng_model_tensors_of(m);
    if (!t && !eng_model_is_lazy(m)) return eng_seterr(-EINVAL, "cuda: the model has no weights");
    return eng_dev_plan_make(eng_model_cfg(m), eng_model_hparams_of(m), t, fp32, out);
}

/* Rows [0, n) of src (src_row bytes each) to dst (dst_row bytes each), one after another. */
static void convert_serial(int type, const uint8_t *src, size_t src_row, int64_t k, int64_t n,
                           int dtype, uint8_t *out, size_t dst_row, float *tmp)
{
    for (int64_t r = 0; r < n; r++, src += src_row, out += dst_row) {
        if (dtype == ENG_W_F32) {
            q_dequant_row(type, src, (float *)(void *)out, k);
            continue;
        }
        q_dequant_row(type, src, tmp, k);
        uint16_t *o = (uint16_t *)(void *)out;
        if (dtype == ENG_W_BF16)
            for (int64_t i = 0; i < k; i++) o[i] = q_f32_to_bf16(tmp[i]);
        else
            for (int64_t i = 0; i < k; i++) o[i] = q_f32_to_f16(tmp[i]);
    }
}

typedef struct conv_part {
    int type, dtype;
    const uint8_t *src;
    size_t src_row, dst_row;
    int64_t k, n;
    uint8_t *out;
    float *tmp;
} conv_part;

static void *conv_thread(void *arg)
{
    conv_part *p = arg;
    convert_serial(p->type, p->src, p->src_row, p->k, p->n, p->dtype, p->out, p->dst_row, p->tmp);
    return NULL;
}

#define CONV_MAX_THREADS 8
#define CONV_MT_ELEMS    (1 << 20) /* below this, one thread */

int eng_dev_convert_rows(eng_wmat w, int64_t k, int64_t row0, int64_t n, int dtype, void *dst,
                         float *tmp)
{
    if (dtype != ENG_W_F32 && dtype != ENG_W_F16 && dtype != ENG_W_BF16)
        return eng_seterr(-EINVAL, "cuda: device type %s: must be F32, F16 or BF16",
                          eng_wtype_name(dtype));
    if (!q_type_supported(w.type) || k < 1 || k % q_block_elems(w.type) || row0 < 0 || n < 0)
        return eng_seterr(-EINVAL, "cuda: cannot convert %s rows of %" PRId64 " elements",
                          eng_wtype_name(w.type), k);
    const size_t src_row = eng_wrow_bytes(w.type, k), dst_row = (size_t)k * dtype_bytes(dtype);
    const uint8_t *src = (const uint8_t *)w.data + (size_t)row0 * src_row;
    uint8_t *out = dst;
    if (w.type == dtype) {
        memcpy(out, src, (size_t)n * src_row);
        return 0;
    }
    /* A load converts gigabytes on one host thread otherwise: split the rows over up to 8
     * threads (each with its own row of scratch); any that cannot start runs inline. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = ncpu > CONV_MAX_THREADS ? CONV_MAX_THREADS : ncpu < 1 ? 1 : (int)ncpu;
    if ((uint64_t)n * (uint64_t)k < CONV_MT_ELEMS) nt = 1;
    if (nt > n) nt = n > 0 ? (int)n : 1;
    conv_part parts[CONV_MAX_THREADS];
    pthread_t tid[CONV_MAX_THREADS];
    bool started[CONV_MAX_THREADS] = {false};
    float *scratch = nt > 1 ? malloc((size_t)(nt - 1) * (size_t)k * sizeof(float)) : NULL;
    if (!scratch) nt = 1;
    const int64_t per = (n + nt - 1) / nt;
    for (int i = 0; i < nt; i++) {
        const int64_t r0 = (int64_t)i * per, rn = n - r0 < per ? n - r0 : per;
        parts[i] = (conv_part){w.type,
                               dtype,
                               src + (size_t)r0 * src_row,
                               src_row,
                               dst_row,
                               k,
                               rn > 0 ? rn : 0,
                               out + (size_t)r0 * dst_row,
                               i ? scratch + (size_t)(i - 1) * (size_t)k : tmp};
        if (i > 0) started[i] = pthread_create(&tid[i], NULL, conv_thread, &parts[i]) == 0;
    }
    conv_thread(&parts[0]);
    for (int i = 1; i < nt; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            conv_thread(&parts[i]);
    }
    free(scratch);
    return 0;
}

void eng_dev_rope_freqs(const eng_model_hparams *hp, const float *freq_factors, float *freq)
{
    /* the very expressions of kernels/cpu/cpu.c's table */
    const float theta = hp->rope_theta;
    for (int i = 0; i < hp->rope_dim; i += 2) {
        float f = 1.0f / powf(theta, i / (float)hp->rope_dim);
        if (freq_factors) f /= freq_factors[i / 2];
        freq[i / 2] = f;
    }
}
