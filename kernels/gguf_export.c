/* SPDX-License-Identifier: MIT */
/*
 * kernels/gguf_export.c — a float32 model (synthetic or a llama2.c checkpoint) written as a
 * GGUF file in llama.cpp's layout: tensor names token_embd / blk.N.attn_q ... / output,
 * hyperparameters under the architecture's keys, a SentencePiece ("llama") vocabulary, and
 * weights quantized by kernels/cpu/quant.c. llama2.c's Q/K rows are already in the
 * adjacent-pair order llama.cpp's "llama" RoPE expects, so they are written unpermuted.
 */
#include "kernels/cpu/quant.h"
#include "kernels/engine.h"
#include "kernels/gguf_export.h"
#include "kernels/gguf_requant.h"
#include "model/gguf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int type_by_name(const char *s)
{
    static const struct {
        const char *n;
        int t;
    } types[] = {
        {"F32", Q_F32},   {"F16", Q_F16},   {"BF16", Q_BF16},     {"Q8_0", Q_Q8_0},
        {"Q4_K", Q_Q4_K}, {"Q6_K", Q_Q6_K}, {"Q4_0", Q_Q4_0},     {"Q4_1", Q_Q4_1},
        {"Q5_0", Q_Q5_0}, {"Q5_1", Q_Q5_1}, {"IQ4_NL", Q_IQ4_NL}, {"Q2_K", Q_Q2_K},
        {"Q3_K", Q_Q3_K}, {"Q5_K", Q_Q5_K}, {"IQ4_XS", Q_IQ4_XS},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(types[i].n, s) == 0) return types[i].t;
    return -1;
}

/* Quantizes rows x k floats into a new buffer (taken over by the writer); experts > 0:
 * a stack of that many matrices of rows / experts rows each (ne = {k, rows / experts,
 * experts}). */
static int add_stack(gguf_writer *w, const char *name, const float *src, int rows, int k, int type,
                     int experts, char *note, size_t note_len)
{
    int t = type;
    if (k % q_block_elems(t)) {
        t = k % 32 == 0 ? Q_Q8_0 : Q_F16;
        size_t used = strlen(note);
        if (used + 1 < note_len)
            snprintf(note + used, note_len - used,
                     "%s%s: rows of %d are not whole %s blocks, "
                     "written as %s",
                     used ? "; " : "", name, k, gguf_type_name((uint32_t)type),
                     gguf_type_name((uint32_t)t));
    }
    size_t rb = q_row_bytes(t, k);
    unsigned char *buf = malloc(rb * (size_t)rows);
    if (!buf) return eng_seterr(-ENOMEM, "%s: out of memory", name);
    for (int r = 0; r < rows; r++) q_quantize_row(t, src + (size_t)r * k, buf + (size_t)r * rb, k);
    uint64_t ne[3] = {(uint64_t)k, (uint64_t)rows, 1};
    if (experts > 0) {
        ne[1] = (uint64_t)(rows / experts);
        ne[2] = (uint64_t)experts;
    }
    gw_tensor(w, name, experts > 0 ? 3 : 2, ne, t, buf, rb * (size_t)rows);
    return 0;
}

static int add_matrix(gguf_writer *w, const char *name, const float *src, int rows, int k, int type,
                      char *note, size_t note_len)
{
    return add_stack(w, name, src, rows, k, type, 0, note, note_len);
}

/* n values of the synthetic formula for a tensor the llama2.c layout lacks (or holds in
 * another shape): tensor id, from element first on. Returns a new buffer or NULL. */
static float *synth_values(uint64_t seed, int id, uint64_t first, size_t n, float scale,
                           bool is_norm)
{
    float *b = malloc((n ? n : 1) * sizeof *b);
    if (!b) return NULL;
    for (size_t j = 0; j < n; j++) b[j] = eng_synth_value(seed, id, first + j, scale, is_norm);
    return b;
}

/* A small matrix kept in F32 whatever the type (the router, as llama.cpp's quantizer keeps
 * ffn_gate_inp). */
static int add_vector_matrix(gguf_writer *w, const char *name, const float *src, int rows, int k)
{
    const size_t n = (size_t)rows * (size_t)k;
    float *buf = malloc(n * sizeof *buf);
    if (!buf) return eng_seterr(-ENOMEM, "%s: out of memory", name);
    memcpy(buf, src, n * sizeof *buf);
    uint64_t ne[2] = {(uint64_t)k, (uint64_t)rows};
    gw_tensor(w, name, 2, ne, Q_F32, buf, n * sizeof *buf);
    return 0;
}

static int add_vector(gguf_writer *w, const char *name, const float *src, int n)
{
    float *buf = malloc((size_t)n * sizeof *buf);
    if (!buf) return eng_seterr(-ENOMEM, "%s: out of memory", name);
    memcpy(buf, src, (size_t)n * sizeof *buf);
    uint64_t ne[1] = {(uint64_t)n};
    gw_tensor(w, name, 1, ne, Q_F32, buf, (size_t)n * sizeof *buf);
    return 0;
}

/* SentencePiece writes a space as U+2581 ("▁"). */
static char *sp_piece(const char *p, size_t *len)
{
    size_t n = 0;
    for (const char *q = p; *q; q++) n += *q == ' ' ? 3 : 1;
    char *out = malloc(n + 1), *o = out;
    if (!out) return NULL;
    for (const char *q = p; *q; q++) {
        if (*q == ' ') {
            memcpy(o, "\xe2\x96\x81", 3);
            o += 3;
        } else {
            *o++ = *q;
        }
    }
    *o = '\0';
    *len = n;
    return out;
}

/* llama.cpp's token types. */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_BYTE = 6 };

static int add_vocab(gguf_writer *w, int vocab, const gw_export_opts *o)
{
    char **pieces = calloc((size_t)vocab, sizeof *pieces);
    size_t *lens = calloc((size_t)vocab, sizeof *lens);
    float *scores = calloc((size_t)vocab, sizeof *scores);
    int32_t *types = calloc((size_t)vocab, sizeof *types);
    int err = 0;
    if (!pieces || !lens || !scores || !types) {
        err = eng_seterr(-ENOMEM, "vocabulary: out of memory");
        goto out;
    }
    for (int i = 0; i < vocab; i++) {
        char tmp[32];
        const char *p;
        if (i <= 2) { /* unk, BOS, EOS: SentencePiece's names (llama2.c stores "\n<s>\n") */
            static const char *const special[] = {"<unk>", "<s>", "</s>"};
            p = special[i];
            types[i] = i == 0 ? TT_UNKNOWN : TT_CONTROL;
        } else if (i < 259) {
            snprintf(tmp, sizeof tmp, "<0x%02X>", i - 3);
            p = tmp;
            types[i] = TT_BYTE;
            if (o->pieces && strcmp(o->pieces[i], tmp) != 0) {
                err = eng_seterr(-EINVAL,
                                 "vocabulary: token %d is \"%s\", expected the byte "
                                 "token \"%s\" (llama2.c layout)",
                                 i, o->pieces[i], tmp);
                goto out;
            }
        } else {
            snprintf(tmp, sizeof tmp, " t%d", i);
            p = o->pieces ? o->pieces[i] : tmp;
            types[i] = TT_NORMAL;
        }
        scores[i] = o->scores ? o->scores[i] : (i < 259 ? 0.0f : -(float)(i - 259));
        if (!(pieces[i] = sp_piece(p, &lens[i]))) {
            err = eng_seterr(-ENOMEM, "vocabulary: out of memory");
            goto out;
        }
    }
    gw_str(w, "tokenizer.ggml.model", "llama");
    gw_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)pieces, lens, (size_t)vocab);
    gw_f32_arr(w, "tokenizer.ggml.scores", scores, (size_t)vocab);
    gw_i32_arr(w, "tokenizer.ggml.token_type", types, (size_t)vocab);
    gw_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gw_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gw_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gw_bool(w, "tokenizer.ggml.add_bos_token", true);
    gw_bool(w, "tokenizer.ggml.add_eos_token", false);
out:
    for (int i = 0; pieces && i < vocab; i++) free(pieces[i]);
    free(pieces);
    free(lens);
    free(scores);
    free(types);
    return err;
}

/* qwen3moe's router (tensor id 22, its logits spread by 4 so that no two experts tie) and
 * experts (gate 23, up 24, down 25) of layer l, from the synthetic formula. */
static int add_experts(gguf_writer *w, int l, uint64_t seed, const eng_model_config *c, int n_exp,
                       int exp_ff, int type, char *note, size_t note_len)
{
    const int d = c->dim;
    const size_t L = (size_t)l, big = (size_t)n_exp * (size_t)exp_ff * (size_t)d;
    char name[96];
    float *v = synth_values(seed, 22, L * (size_t)n_exp * d, (size_t)n_exp * d,
                            4.0f / sqrtf((float)d), false);
    if (!v) return eng_seterr(-ENOMEM, "out of memory");
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
    int err = add_vector_matrix(w, name, v, n_exp, d);
    free(v);
    static const char *const en[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int i = 0; i < 3 && !err; i++) {
        const bool down = i == 2;
        v = synth_values(seed, 23 + i, L * big, big, 1.0f / sqrtf((float)(down ? exp_ff : d)),
                         false);
        if (!v) return eng_seterr(-ENOMEM, "out of memory");
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, en[i]);
        err = add_stack(w, name, v, n_exp * (down ? d : exp_ff), down ? exp_ff : d, type, n_exp,
                        note, note_len);
        free(v);
    }
    return err;
}

/* A mix of llama.cpp's (Q4_K_M, Q3_K_M, ...): the model written in F32 beside `path`, then
 * re-quantized from it by gguf_requant, whose table is the one that says which type each
 * tensor takes under a mix; the F32 file is removed either way. */
static int export_mix(const eng_model *m, const char *path, const gw_export_opts *o,
                      const char *mix, char *note, size_t note_len)
{
    const gw_mix_model probe = {.n_layers = 1, .n_gqa = 1, .n_attn_v = 1};
    if (gw_mix_type(mix, &probe, "blk.0.ffn_up.weight", 2, 256, Q_F32, 0) < 0)
        return eng_seterr(-EINVAL,
                          "--type %s: not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
                          "Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K as every matrix's "
                          "type, or one of llama.cpp's mixes: Q2_K_S, Q3_K_S, Q3_K_M, Q3_K_L, "
                          "Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M)",
                          mix);
    const size_t n = strlen(path) + sizeof ".f32-XXXXXX";
    char *tmp = malloc(n);
    if (!tmp) return eng_seterr(-ENOMEM, "out of memory");
    snprintf(tmp, n, "%s.f32-XXXXXX", path);
    const int fd = mkstemp(tmp);
    if (fd < 0) {
        const int e = errno;
        free(tmp);
        return eng_seterr(-e, "%s: cannot create the F32 file to re-quantize from: %s", path,
                          strerror(e));
    }
    close(fd);
    gw_export_opts f32 = *o;
    f32.type = "F32";
    int err = gw_export_model(m, tmp, &f32, note, note_len);
    if (!err) err = gw_requantize(tmp, path, mix, note, note_len);
    unlink(tmp);
    free(tmp);
    return err;
}

int gw_export_model(const eng_model *m, const char *path, const gw_export_opts *o, char *note,
                    size_t note_len)
{
    const eng_model_config *c = eng_model_cfg(m);
    const eng_weights *wt = eng_model_weights(m);
    note[0] = '\0';
    if (eng_model_is_lazy(m) || !wt->wq)
        return eng_seterr(-EINVAL, "only float32 models (synthetic, llama2.c) can be exported");
    const char *tname = o->type ? o->type : "F32";
    int type = type_by_name(tname);
    if (type < 0) return export_mix(m, path, o, tname, note, note_len);
    const char *arch = o->arch ? o->arch : "llama";
    const bool qwen2 = strcmp(arch, "qwen2") == 0, qwen3 = strcmp(arch, "qwen3") == 0;
    const bool gemma2 = strcmp(arch, "gemma2") == 0, gemma3 = strcmp(arch, "gemma3") == 0;
    const bool gemma = gemma2 || gemma3, phi3 = strcmp(arch, "phi3") == 0;
    const bool moe = strcmp(arch, "qwen3moe") == 0;
    if (strcmp(arch, "llama") != 0 && !qwen2 && !qwen3 && !gemma && !phi3 && !moe)
        return eng_seterr(-EINVAL,
                          "--arch %s: not supported (llama, qwen2, qwen3, gemma2, gemma3, phi3, "
                          "qwen3moe)",
                          arch);
    /* qwen3moe: 8 experts of half the FFN width, 2 per token (Qwen3-30B-A3B: 128 of 768, 8) */
    const int n_exp = 8, n_used = 2, exp_ff = c->hidden_dim / 2;
    if (o->sliding_window < 0)
        return eng_seterr(-EINVAL, "--sliding-window %d: must be positive", o->sliding_window);
    uint64_t seed = 1;
    const bool synthetic = eng_model_synthetic_seed(m, &seed);
    if (!seed) seed = 1;
    /* heads of another size than dim / n_heads (Qwen3, Gemma): the attention matrices are
     * generated in that shape from the synthetic formula, so only a synthetic model can */
    const int head_dim = o->head_dim > 0 ? o->head_dim : c->dim / c->n_heads;
    const bool reshape = head_dim != c->dim / c->n_heads;
    if (reshape && !synthetic)
        return eng_seterr(-EINVAL,
                          "--head-dim %d: only a synthetic model's attention can be generated "
                          "in another head size (this one has %d)",
                          head_dim, c->dim / c->n_heads);
    if (head_dim % 2 || head_dim < 2)
        return eng_seterr(-EINVAL, "--head-dim %d: must be even and positive", head_dim);
    gguf_writer *w = gw_new();
    if (!w) return eng_seterr(-ENOMEM, "out of memory");
    int err = 0;
    const int d = c->dim, h = c->hidden_dim, hs = head_dim, kv = hs * c->n_kv_heads;
    const int qd = hs * c->n_heads, kv0 = d / c->n_heads * c->n_kv_heads; /* kv0: the model's */
    const int V = c->vocab_size;
    char key[128], name[96];
    gw_str(w, "general.architecture", arch);
    gw_str(w, "general.name", "ringlm-mkmodel");
#define ARCH_U32(suffix, v)                                                                        \
    (snprintf(key, sizeof key, "%s." suffix, arch), gw_u32(w, key, (uint32_t)(v)))
    ARCH_U32("context_length", c->seq_len);
    ARCH_U32("embedding_length", d);
    ARCH_U32("feed_forward_length", h);
    ARCH_U32("block_count", c->n_layers);
    ARCH_U32("attention.head_count", c->n_heads);
    ARCH_U32("attention.head_count_kv", c->n_kv_heads);
    ARCH_U32("rope.dimension_count", hs);
    ARCH_U32("vocab_size", V);
    if (moe) {
        ARCH_U32("expert_count", n_exp);
        ARCH_U32("expert_used_count", n_used);
        ARCH_U32("expert_feed_forward_length", exp_ff);
    }
    if (reshape || qwen3 || moe ||
        gemma) { /* as llama.cpp's converter, from config.json's head_dim */
        ARCH_U32("attention.key_length", hs);
        ARCH_U32("attention.value_length", hs);
    }
    /* gemma: the window its local layers see (Gemma 2's 4096, Gemma 3's 512 or 1024 unless
     * asked), on every other layer (gemma2) or five of six (gemma3); llama (Mistral): every
     * layer, and only when asked */
    if (o->sliding_window || gemma)
        ARCH_U32("attention.sliding_window", o->sliding_window ? o->sliding_window
                                             : gemma2          ? 4096
                                                               : 1024);
#undef ARCH_U32
#define ARCH_F32(suffix, v) (snprintf(key, sizeof key, "%s." suffix, arch), gw_f32(w, key, (v)))
    ARCH_F32("attention.layer_norm_rms_epsilon", gemma ? 1e-6f : 1e-5f);
    /* Gemma 3 4B and larger: global layers at base 1e6 with linear scaling by 8, local
     * layers at 10000 unscaled */
    ARCH_F32("rope.freq_base", gemma3 ? 1e6f : 10000.0f);
    if (gemma2) {
        ARCH_F32("attn_logit_softcapping", 50.0f);
        ARCH_F32("final_logit_softcapping", 30.0f);
    }
    if (phi3) { /* long-RoPE as Phi-3-128k: trained at half the context without scaling */
        const int orig = c->seq_len / 2 > 0 ? c->seq_len / 2 : 1;
        snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", arch);
        gw_u32(w, key, (uint32_t)orig);
        ARCH_F32("rope.scaling.attn_factor",
                 orig > 1 ? sqrtf(1.0f + logf((float)c->seq_len / (float)orig) / logf((float)orig))
                          : 1.0f);
    }
    if (gemma3) {
        ARCH_F32("rope.freq_base_swa", 10000.0f);
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        gw_str(w, key, "linear");
        ARCH_F32("rope.scaling.factor", 8.0f);
    }
#undef ARCH_F32
    if (o->vocab && o->vocab->n != (size_t)V) {
        err = eng_seterr(-EINVAL, "vocabulary: %zu tokens, the model has %d", o->vocab->n, V);
        goto out;
    }
    if (o->vocab)
        gw_vocab_add(w, o->vocab); /* a failure to allocate is reported by gw_write */
    else if ((err = add_vocab(w, V, o)))
        goto out;

    if (gemma) {
        /* gemma multiplies the embedding by sqrt(dim) and ties the classifier to it: a
         * synthetic embedding of unit scale would swamp every layer's output and the model
         * would only repeat its input (the classifier finds the input token in the residual),
         * so it is written divided by dim: the first layer's norm restores its scale */
        const size_t n = (size_t)V * (size_t)d;
        float *e = malloc(n * sizeof *e);
        if (!e) {
            err = eng_seterr(-ENOMEM, "out of memory");
            goto out;
        }
        const float k = 1.0f / (float)d;
        for (size_t i = 0; i < n; i++) e[i] = wt->token_embedding[i] * k;
        err = add_matrix(w, "token_embd.weight", e, V, d, type, note, note_len);
        free(e);
    } else {
        err = add_matrix(w, "token_embd.weight", wt->token_embedding, V, d, type, note, note_len);
    }
    if (err) goto out;
    float *fused_qkv = NULL, *fused_ffn = NULL; /* phi3's fused matrices, one layer's */
    if (phi3) {
        fused_qkv = malloc((size_t)(qd + 2 * kv) * (size_t)d * sizeof(float));
        fused_ffn = malloc(2 * (size_t)h * (size_t)d * sizeof(float));
        if (!fused_qkv || !fused_ffn) err = eng_seterr(-ENOMEM, "out of memory");
    }
    for (int l = 0; l < c->n_layers && !err; l++) {
        const size_t L = (size_t)l;
        struct {
            const char *n;
            const float *p;
            int rows, k, type, id;
        } mats[] = {
            {"attn_q", wt->wq + L * d * d, qd, d, type, ENG_T_WQ},
            {"attn_k", wt->wk + L * kv0 * d, kv, d, type, ENG_T_WK},
            {"attn_v", wt->wv + L * kv0 * d, kv, d, type, ENG_T_WV},
            {"attn_output", wt->wo + L * d * d, d, qd, type, ENG_T_WO},
            {"ffn_gate", wt->w1 + L * h * d, h, d, type, ENG_T_W1},
            {"ffn_down", wt->w2 + L * d * h, d, h, type, ENG_T_W2},
            {"ffn_up", wt->w3 + L * h * d, h, d, type, ENG_T_W3},
        };
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        err = add_vector(w, name, wt->rms_att + L * d, d);
        for (size_t i = 0; i < sizeof mats / sizeof mats[0] && !err; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, mats[i].n);
            float *gen = NULL; /* the attention in another head size: generated */
            if (reshape && i < 4) {
                size_t n = (size_t)mats[i].rows * (size_t)mats[i].k;
                gen =
                    synth_values(seed, mats[i].id, L * n, n, eng_synth_scale(c, mats[i].id), false);
                if (!gen) {
                    err = eng_seterr(-ENOMEM, "out of memory");
                    break;
                }
            }
            const float *src = gen ? gen : mats[i].p;
            const size_t n = (size_t)mats[i].rows * (size_t)mats[i].k;
            if (phi3 && (i <= 2 || i == 4 || i == 6)) {
                /* phi3: Q, K, V rows in one attn_qkv; gate then up rows in one ffn_up */
                float *f = i <= 2 ? fused_qkv : fused_ffn;
                memcpy(f + (i == 1   ? (size_t)qd * d
                            : i == 2 ? (size_t)(qd + kv) * d
                            : i == 6 ? (size_t)h * d
                                     : 0),
                       src, n * sizeof(float));
                if (i == 2) {
                    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", l);
                    err = add_matrix(w, name, fused_qkv, qd + 2 * kv, d, type, note, note_len);
                } else if (i == 6) {
                    err = add_matrix(w, name, fused_ffn, 2 * h, d, type, note, note_len);
                }
            } else if (moe && i >= 4) {
                if (i == 4) err = add_experts(w, l, seed, c, n_exp, exp_ff, type, note, note_len);
            } else {
                err =
                    add_matrix(w, name, src, mats[i].rows, mats[i].k, mats[i].type, note, note_len);
            }
            free(gen);
        }
        if (gemma && !err) { /* norms after attention and FFN: tensor ids 18 and 19 */
            static const char *const pn[2] = {"post_attention_norm", "post_ffw_norm"};
            for (int i = 0; i < 2 && !err; i++) {
                float *b = synth_values(seed, 18 + i, L * (size_t)d, (size_t)d, 0.1f, true);
                if (!b) {
                    err = eng_seterr(-ENOMEM, "out of memory");
                    break;
                }
                snprintf(name, sizeof name, "blk.%d.%s.weight", l, pn[i]);
                err = add_vector(w, name, b, d);
                free(b);
            }
        }
        if ((qwen3 || moe || gemma3) &&
            !err) { /* per-head Q/K norms: norm-like, tensor ids 16, 17 */
            static const char *const nn[2] = {"attn_q_norm", "attn_k_norm"};
            for (int i = 0; i < 2 && !err; i++) {
                float *b = synth_values(seed, 16 + i, L * (size_t)hs, (size_t)hs, 0.1f, true);
                if (!b) {
                    err = eng_seterr(-ENOMEM, "out of memory");
                    break;
                }
                snprintf(name, sizeof name, "blk.%d.%s.weight", l, nn[i]);
                err = add_vector(w, name, b, hs);
                free(b);
            }
        }
        if (!err) {
            snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
            err = add_vector(w, name, wt->rms_ffn + L * d, d);
        }
        if (qwen2 && !err) { /* biases from the synthetic formula, tensor ids past the preset's */
            static const char *const bn[3] = {"attn_q", "attn_k", "attn_v"};
            for (int i = 0; i < 3 && !err; i++) {
                int n = i == 0 ? qd : kv;
                float *b = synth_values(seed, 13 + i, L * (size_t)n, (size_t)n, 0.1f, false);
                if (!b) {
                    err = eng_seterr(-ENOMEM, "out of memory");
                    break;
                }
                snprintf(name, sizeof name, "blk.%d.%s.bias", l, bn[i]);
                err = add_vector(w, name, b, n);
                free(b);
            }
        }
    }
    free(fused_qkv);
    free(fused_ffn);
    if (err) goto out;
    if (phi3) { /* long-RoPE factors: short ones near 1, long ones rising to about 8 */
        const int half = hs / 2;
        for (int i = 0; i < 2 && !err; i++) {
            float *f = synth_values(seed, 20 + i, 0, (size_t)half, 0.1f, true);
            if (!f) {
                err = eng_seterr(-ENOMEM, "out of memory");
                break;
            }
            for (int j = 0; i == 1 && j < half; j++)
                f[j] += 7.0f * (float)j / (float)(half > 1 ? half - 1 : 1);
            err = add_vector(w, i ? "rope_factors_long.weight" : "rope_factors_short.weight", f,
                             half);
            free(f);
        }
        if (err) goto out;
    }
    if ((err = add_vector(w, "output_norm.weight", wt->rms_final, d))) goto out;
    if (!c->shared_classifier && !gemma && /* gemma ties its classifier to the embedding */
        (err = add_matrix(w, "output.weight", wt->wcls, V, d, type, note, note_len)))
        goto out;
    if ((err = gw_write(w, path))) eng_seterr(err, "%s", gw_errmsg());
out:
    gw_free(w);
    return err;
}
