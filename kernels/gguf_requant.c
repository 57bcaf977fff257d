/* SPDX-License-Identifier: MIT */
/*
 * kernels/gguf_requant.c — GGUF → GGUF re-quantization under llama.cpp's type mixes (see
 * gguf_requant.h): the metadata copied (general.file_type and the quantization version set as
 * llama-quantize sets them), the tensors in llama.cpp's order (by layer, then name), each
 * weight matrix dequantized row by row and quantized again by kernels/cpu/quant.c.
 */
#include "kernels/gguf_requant.h"
#include "kernels/cpu/quant.h"
#include "kernels/engine.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/imatrix.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* llama.cpp's file types (llama_ftype) this writes. */
enum {
    FT_F32 = 0,
    FT_F16 = 1,
    FT_Q4_0 = 2,
    FT_Q4_1 = 3,
    FT_Q8_0 = 7,
    FT_Q5_0 = 8,
    FT_Q5_1 = 9,
    FT_Q2_K = 10,
    FT_Q3_K_S = 11,
    FT_Q3_K_M = 12,
    FT_Q3_K_L = 13,
    FT_Q4_K_S = 14,
    FT_Q4_K_M = 15,
    FT_Q5_K_S = 16,
    FT_Q5_K_M = 17,
    FT_Q6_K = 18,
    FT_Q2_K_S = 21,
    FT_IQ4_NL = 25,
    FT_IQ4_XS = 30,
    FT_BF16 = 32
};

static const struct mix {
    const char *name;
    int ftype, base;
    bool pure;
} mixes[] = {
    {"F32", FT_F32, Q_F32, false},          {"F16", FT_F16, Q_F16, false},
    {"BF16", FT_BF16, Q_BF16, false},       {"Q8_0", FT_Q8_0, Q_Q8_0, false},
    {"Q4_0", FT_Q4_0, Q_Q4_0, false},       {"Q4_1", FT_Q4_1, Q_Q4_1, false},
    {"Q5_0", FT_Q5_0, Q_Q5_0, false},       {"Q5_1", FT_Q5_1, Q_Q5_1, false},
    {"IQ4_NL", FT_IQ4_NL, Q_IQ4_NL, false}, {"IQ4_XS", FT_IQ4_XS, Q_IQ4_XS, false},
    {"Q2_K", FT_Q2_K, Q_Q2_K, false},       {"Q2_K_S", FT_Q2_K_S, Q_Q2_K, false},
    {"Q3_K_S", FT_Q3_K_S, Q_Q3_K, false},   {"Q3_K_M", FT_Q3_K_M, Q_Q3_K, false},
    {"Q3_K_L", FT_Q3_K_L, Q_Q3_K, false},   {"Q4_K_S", FT_Q4_K_S, Q_Q4_K, false},
    {"Q4_K_M", FT_Q4_K_M, Q_Q4_K, false},   {"Q5_K_S", FT_Q5_K_S, Q_Q5_K, false},
    {"Q5_K_M", FT_Q5_K_M, Q_Q5_K, false},   {"Q6_K", FT_Q6_K, Q_Q6_K, false},
    {"Q3_K", FT_Q3_K_M, Q_Q3_K, true},      {"Q4_K", FT_Q4_K_M, Q_Q4_K, true},
    {"Q5_K", FT_Q5_K_M, Q_Q5_K, true},
};

#define MIX_NAMES                                                                                  \
    "F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL IQ4_XS Q2_K Q2_K_S (with --imatrix) Q3_K_S "     \
    "Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K, or Q3_K Q4_K Q5_K for every matrix"

/* llama-quantize's other mixes of the types ringlm reads and writes: those with the 1- to
 * 3-bit lattice types (IQ1_S, IQ2_XXS, IQ3_S, ...) */
static bool unbuilt_mix(const char *name)
{
    static const char *const names[] = {"IQ1_S", "IQ1_M",   "IQ2_XXS", "IQ2_XS", "IQ2_S",
                                        "IQ2_M", "IQ3_XXS", "IQ3_XS",  "IQ3_S",  "IQ3_M"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(names[i], name) == 0) return true;
    return false;
}

static const struct mix *mix_find(const char *name)
{
    for (size_t i = 0; i < sizeof mixes / sizeof mixes[0]; i++)
        if (strcmp(mixes[i].name, name) == 0) return &mixes[i];
    return NULL;
}

enum cat { C_OTHER, C_TOKEN_EMBD, C_OUTPUT, C_ATTN_Q, C_ATTN_K, C_ATTN_V, C_ATTN_OUT, C_FFN_DOWN };

/* llama.cpp's tensor_get_category, for the tensors these architectures have (attn_qkv is
 * attn_v-like there). */
static enum cat category(const char *name)
{
    if (strcmp(name, "output.weight") == 0) return C_OUTPUT;
    if (strcmp(name, "token_embd.weight") == 0) return C_TOKEN_EMBD;
    if (strstr(name, "attn_qkv.weight") || strstr(name, "attn_v.weight")) return C_ATTN_V;
    if (strstr(name, "attn_k.weight")) return C_ATTN_K;
    if (strstr(name, "attn_q.weight")) return C_ATTN_Q;
    if (strstr(name, "attn_output.weight")) return C_ATTN_OUT;
    if (strstr(name, "ffn_up") || strstr(name, "ffn_gate")) return C_OTHER;
    if (strstr(name, "ffn_down")) return C_FFN_DOWN;
    return C_OTHER;
}

static bool is_quantized(int t)
{
    return t != Q_F32 && t != Q_F16 && t != Q_BF16;
}

static bool use_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* llama_tensor_get_type_impl for the file types above; with an importance matrix the first
 * eighth of ffn_down stays IQ4_NL/IQ4_XS (not Q5_K) and becomes Q4_1/Q5_1 under Q4_0/Q5_0. */
static int mix_rule(const struct mix *mx, const gw_mix_model *m, enum cat c, long long ne0,
                    int index, int t)
{
    const int ft = mx->ftype, n = m->n_layers;
    if (c == C_OUTPUT || (m->tied && c == C_TOKEN_EMBD)) {
        if (ne0 % q_block_elems(t)) return Q_Q8_0;
        return t != Q_Q8_0 ? Q_Q6_K : t;
    }
    if (c == C_TOKEN_EMBD) return t;
    if (c == C_ATTN_V) {
        const int i = index, nv = m->n_attn_v;
        if (ft == FT_Q2_K)
            t = m->n_gqa >= 4 ? Q_Q4_K : Q_Q3_K;
        else if (ft == FT_Q2_K_S && m->n_gqa >= 4)
            t = Q_Q4_K;
        else if (ft == FT_Q3_K_M)
            t = i < 2 ? Q_Q5_K : Q_Q4_K;
        else if (ft == FT_Q3_K_L)
            t = Q_Q5_K;
        else if ((ft == FT_IQ4_NL || ft == FT_IQ4_XS) && m->n_gqa >= 4)
            t = Q_Q5_K;
        else if ((ft == FT_Q4_K_M || ft == FT_Q5_K_M) && use_more_bits(i, nv))
            t = Q_Q6_K;
        else if (ft == FT_Q4_K_S && i < 4)
            t = Q_Q5_K;
        /* a 70B model's attn_v is 8x smaller than attn_q: more bits cost little */
        if (m->is_70b && (t == Q_Q3_K || t == Q_Q4_K)) t = Q_Q5_K;
        if (m->n_experts == 8) t = Q_Q8_0;
        return t;
    }
    if (c == C_ATTN_K) return m->n_experts == 8 ? Q_Q8_0 : t;
    if (c == C_FFN_DOWN) {
        const int i = index;
        if (ft == FT_Q2_K)
            t = Q_Q3_K;
        else if (ft == FT_Q2_K_S) {
            if (i < n / 8) t = Q_Q4_K;
        } else if (ft == FT_Q3_K_M)
            t = i < n / 16 ? Q_Q5_K : Q_Q4_K;
        else if (ft == FT_Q3_K_L)
            t = Q_Q5_K;
        else if (ft == FT_Q4_K_M) {
            if (use_more_bits(i, n)) t = Q_Q6_K;
        } else if (i < n / 8 && (ft == FT_IQ4_NL || ft == FT_IQ4_XS) && !m->has_imatrix)
            t = Q_Q5_K;
        else if (ft == FT_Q5_K_M && use_more_bits(i, n))
            t = Q_Q6_K;
        else if (ft == FT_Q4_K_S && i < n / 8)
            t = Q_Q5_K;
        else if ((ft == FT_Q4_0 || ft == FT_Q5_0) && m->has_imatrix && i < n / 8)
            t = ft == FT_Q4_0 ? Q_Q4_1 : Q_Q5_1; /* llama.cpp's guard for the first layers */
        return t;
    }
    if (c == C_ATTN_OUT) {
        if (m->n_experts == 8) {
            if (ft == FT_Q2_K || ft == FT_Q3_K_S || ft == FT_Q3_K_M || ft == FT_IQ4_NL ||
                ft == FT_Q4_K_S || ft == FT_Q4_K_M || ft == FT_IQ4_XS)
                t = Q_Q5_K;
        } else if (ft == FT_Q2_K)
            t = Q_Q3_K;
        else if (ft == FT_Q3_K_M)
            t = Q_Q4_K;
        else if (ft == FT_Q3_K_L)
            t = Q_Q5_K;
        return t;
    }
    return t;
}

/* llama.cpp's model type LLM_TYPE_70B, the one its mixes key on: a llama file of 80 layers
 * with grouped-query attention (80 layers and one KV head per query head are 65B; 8 experts
 * are a mixture, 8x7B or 8x22B), a qwen2 file of 80 layers. */
static bool is_70b(const char *arch, int n_layers, int heads, int kv_heads, int n_experts)
{
    if (n_layers != 80) return false;
    if (strcmp(arch, "llama") == 0) return n_experts != 8 && heads != kv_heads;
    return strcmp(arch, "qwen2") == 0;
}

/* llama.cpp's tensor_type_fallback: a type whose blocks fit rows of ne0. */
static int fallback(int t, long long ne0)
{
    if (ne0 % q_block_elems(t) == 0) return t;
    switch (t) {
    case Q_Q2_K:
    case Q_Q3_K: t = Q_Q4_0; break;
    case Q_Q4_K: t = Q_Q5_0; break;
    case Q_Q5_K: t = Q_Q5_1; break;
    case Q_Q6_K: t = Q_Q8_0; break;
    case Q_IQ4_XS: t = Q_IQ4_NL; break;
    default: break;
    }
    return ne0 % q_block_elems(t) ? Q_F16 : t;
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

int gw_mix_type(const char *mix, const gw_mix_model *m, const char *name, int n_dims, long long ne0,
                int in_type, int index)
{
    const struct mix *mx = mix_find(mix);
    if (!mx) return -1;
    /* llama.cpp's tensor_allows_quantization */
    if (n_dims < 2 || !ends_with(name, "weight") || strstr(name, "_norm.weight") ||
        strstr(name, "ffn_gate_inp.weight"))
        return in_type;
    int t = mx->base;
    if (!is_quantized(t)) return t;
    if (!mx->pure) t = mix_rule(mx, m, category(name), ne0, index, t);
    return fallback(t, ne0);
}

/* llama.cpp's tensor_requires_imatrix for the mixes here: Q2_K_S's Q2_K matrices but the
 * embedding and the classifier (llama.cpp refuses to write them without one). */
static bool needs_imatrix(const struct mix *mx, const char *name, int type)
{
    return mx->ftype == FT_Q2_K_S && type == Q_Q2_K && strcmp(name, "token_embd.weight") != 0 &&
           strcmp(name, "output.weight") != 0;
}

/* ---- the file ----------------------------------------------------------------------- */

static int layer_of(const char *name)
{
    int l = -1;
    if (sscanf(name, "blk.%d.", &l) != 1) return -1;
    return l;
}

/* llama.cpp's order of tensors (its weight_name_comparer): by layer (none first), then name. */
static int by_layer_then_name(const void *a, const void *b)
{
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    const int lx = layer_of(x->name), ly = layer_of(y->name);
    if (lx != ly) return lx < ly ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int get_int(const gguf_file *g, const char *arch, const char *key, int dflt, int *out)
{
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    uint64_t v;
    int err = gguf_get_u64(g, k, &v);
    if (err == -ENOENT) {
        *out = dflt;
        return 0;
    }
    if (err) return eng_seterr(err, "%s", gguf_errmsg());
    *out = v > 1u << 30 ? 1 << 30 : (int)v;
    return 0;
}

/* One tensor in type t: its bytes, converted from the input's type row by row (each
 * expert's rows weighted by its slice of the importance matrix entry im, when given). */
static int convert(const gguf_tensor *src, int t, const imx_entry *im, void **out, size_t *bytes)
{
    const long long k = (long long)src->ne[0];
    uint64_t rows = 1;
    for (uint32_t d = 1; d < src->n_dims; d++) rows *= src->ne[d];
    if ((int)src->type == t) {
        *bytes = (size_t)src->bytes;
        *out = malloc(*bytes ? *bytes : 1);
        if (!*out) return eng_seterr(-ENOMEM, "%s: out of memory", src->name);
        memcpy(*out, src->data, *bytes);
        return 0;
    }
    if (!q_type_supported((int)src->type) || k % q_block_elems((int)src->type))
        return eng_seterr(-EINVAL, "tensor %s: type %s cannot be re-quantized here", src->name,
                          gguf_type_name(src->type));
    const size_t rb_in = q_row_bytes((int)src->type, k), rb = q_row_bytes(t, k);
    *bytes = rb * (size_t)rows;
    *out = malloc(*bytes ? *bytes : 1);
    float *row = malloc((size_t)k * sizeof *row);
    if (!*out || !row) {
        free(*out);
        free(row);
        return eng_seterr(-ENOMEM, "%s: out of memory", src->name);
    }
    int err = 0;
    for (uint64_t r = 0; r < rows && !err; r++) {
        q_dequant_row((int)src->type, (const char *)src->data + r * rb_in, row, k);
        const float *qw = im ? im->weights + (size_t)(r / src->ne[1]) * (size_t)k : NULL;
        if (!q_quantize_row_weighted(t, row, (char *)*out + r * rb, k, qw))
            err = eng_seterr(-EINVAL, "tensor %s: %s cannot be written under an importance matrix",
                             src->name, gguf_type_name((uint32_t)t));
    }
    free(row);
    if (err) free(*out);
    return err;
}

/* Every entry of the importance matrix names a tensor of the file, with one weight per
 * column of each of its matrices (experts). */
static int imatrix_fits(const imx *im, const gguf_file *g, const char *in_path, const char *im_path)
{
    for (size_t i = 0; i < im->n; i++) {
        const imx_entry *e = &im->e[i];
        const gguf_tensor *t = gguf_tensor_find(g, e->name);
        if (!t || t->n_dims < 2)
            return eng_seterr(-EINVAL,
                              "%s: entry %s: %s has no such matrix (an imatrix of "
                              "another model?)",
                              im_path, e->name, in_path);
        const uint64_t want = t->ne[0] * (t->n_dims >= 3 ? t->ne[2] : 1);
        if (e->n != want)
            return eng_seterr(-EINVAL,
                              "%s: entry %s: %zu weights, the tensor has %llu columns x %llu "
                              "matrices = %llu",
                              im_path, e->name, e->n, (unsigned long long)t->ne[0],
                              (unsigned long long)(t->n_dims >= 3 ? t->ne[2] : 1),
                              (unsigned long long)want);
    }
    return 0;
}

int gw_requantize(const char *in_path, const char *out_path, const char *mix, char *note,
                  size_t note_len)
{
    return gw_requantize_imatrix(in_path, out_path, mix, NULL, note, note_len);
}

int gw_requantize_imatrix(const char *in_path, const char *out_path, const char *mix,
                          const char *imatrix_path, char *note, size_t note_len)
{
    note[0] = '\0';
    const struct mix *mx = mix_find(mix);
    if (!mx)
        return eng_seterr(-EINVAL, "--type %s: %s (the mixes: " MIX_NAMES ")", mix,
                          unbuilt_mix(mix) ? "llama.cpp's IQ1, IQ2 and IQ3 mixes are not "
                                             "built here: ringlm neither writes nor "
                                             "reads their lattice types"
                                           : "not a re-quantization mix");
    gguf_file *g;
    imx *im = NULL;
    int err = gguf_open(in_path, &g);
    if (err) return eng_seterr(err, "%s: %s", in_path, gguf_errmsg());
    if (imatrix_path) {
        if ((err = imx_load(imatrix_path, &im)))
            eng_seterr(err, "%s", imx_errmsg());
        else
            err = imatrix_fits(im, g, in_path, imatrix_path);
        if (err) {
            imx_free(im);
            gguf_close(g);
            return err;
        }
    }
    const char *arch_s;
    size_t arch_len;
    char arch[64];
    if ((err = gguf_get_str(g, "general.architecture", &arch_s, &arch_len)) || arch_len >= 64) {
        gguf_close(g);
        return eng_seterr(err ? err : -EINVAL, "%s: general.architecture %s", in_path,
                          err == -ENOENT ? "absent" : "unreadable");
    }
    memcpy(arch, arch_s, arch_len);
    arch[arch_len] = '\0';
    gw_mix_model m = {.tied = 1, .has_imatrix = im != NULL};
    int heads, kv_heads;
    if ((err = get_int(g, arch, "block_count", 0, &m.n_layers)) ||
        (err = get_int(g, arch, "attention.head_count", 1, &heads)) ||
        (err = get_int(g, arch, "attention.head_count_kv", heads, &kv_heads)) ||
        (err = get_int(g, arch, "expert_count", 0, &m.n_experts))) {
        gguf_close(g);
        return err;
    }
    m.n_gqa = kv_heads > 0 ? heads / kv_heads : 0;
    m.is_70b = is_70b(arch, m.n_layers, heads, kv_heads, m.n_experts);
    const int nt = gguf_n_tensors(g);
    const gguf_tensor **order = malloc((size_t)(nt ? nt : 1) * sizeof *order);
    gguf_writer *w = gw_new();
    if (!order || !w) {
        free(order);
        gw_free(w);
        gguf_close(g);
        return eng_seterr(-ENOMEM, "out of memory");
    }
    for (int i = 0; i < nt; i++) {
        order[i] = gguf_tensor_at(g, i);
        if (strcmp(order[i]->name, "output.weight") == 0) m.tied = 0;
        if (category(order[i]->name) == C_ATTN_V) m.n_attn_v++;
    }
    qsort(order, (size_t)nt, sizeof *order, by_layer_then_name);
    /* the metadata, but the file type and the alignment (this writer's is the default) */
    for (int i = 0; i < gguf_n_kv(g) && !err; i++) {
        const gguf_kv *kv = gguf_kv_at(g, i);
        if (strcmp(kv->key, "general.file_type") == 0 ||
            strcmp(kv->key, "general.quantization_version") == 0 ||
            strcmp(kv->key, "general.alignment") == 0)
            continue;
        if (kv->type == GGUF_V_ARRAY && kv->elem_type == GGUF_V_ARRAY)
            err = eng_seterr(-EINVAL, "%s: key %s: arrays of arrays are not copied", in_path,
                             kv->key);
        else
            gw_kv_copy(w, kv);
    }
    gw_u32(w, "general.quantization_version", 2);
    gw_u32(w, "general.file_type", (uint32_t)mx->ftype);
    int n_type[64] = {0}, i_v = 0, i_down = 0;
    for (int i = 0; i < nt && !err; i++) {
        const gguf_tensor *t = order[i];
        const enum cat c = category(t->name);
        int index = c == C_ATTN_V ? i_v++ : c == C_FFN_DOWN ? i_down++ : 0;
        if (c == C_FFN_DOWN && m.n_experts > 1) index = layer_of(t->name);
        const int type =
            gw_mix_type(mix, &m, t->name, (int)t->n_dims, (long long)t->ne[0], (int)t->type, index);
        const bool allowed = type != (int)t->type || mx->base == (int)t->type;
        const int pre = !allowed || !is_quantized(mx->base) ? type
                        : mx->pure                          ? mx->base
                                   : mix_rule(mx, &m, c, (long long)t->ne[0], index, mx->base);
        size_t used = strlen(note);
        if (type != pre && used + 1 < note_len)
            snprintf(note + used, note_len - used,
                     "%s%s: rows of %lld are not whole %s blocks, written as %s", used ? "; " : "",
                     t->name, (long long)t->ne[0], gguf_type_name((uint32_t)pre),
                     gguf_type_name((uint32_t)type));
        void *data = NULL;
        size_t bytes = 0;
        const imx_entry *e = im && (int)t->type != type ? imx_find(im, t->name) : NULL;
        if ((int)t->type != type && !e && needs_imatrix(mx, t->name, type)) {
            err = eng_seterr(-EINVAL,
                             "--type %s: tensor %s: its Q2_K needs an importance matrix "
                             "(--imatrix FILE with an entry for it), as llama-quantize's does",
                             mix, t->name);
            break;
        }
        if ((err = convert(t, type, e, &data, &bytes))) break;
        gw_tensor(w, t->name, (int)t->n_dims, t->ne, type, data, bytes);
        if (type >= 0 && type < 64) n_type[type]++;
    }
    if (!err && (err = gw_write(w, out_path))) eng_seterr(err, "%s: %s", out_path, gw_errmsg());
    if (!err) {
        char part[64];
        size_t used = strlen(note);
        for (int t = 0; t < 64; t++) {
            if (!n_type[t]) continue;
            snprintf(part, sizeof part, "%s%s x %d", used ? "; " : "", gguf_type_name((uint32_t)t),
                     n_type[t]);
            if (used + strlen(part) + 1 < note_len) {
                memcpy(note + used, part, strlen(part) + 1);
                used += strlen(part);
            }
        }
    }
    gw_free(w);
    free(order);
    imx_free(im);
    gguf_close(g);
    return err;
}
