/* SPDX-License-Identifier: MIT */
/*
 * kernels/model.c — models: llama2.c checkpoints and GGUF files (mmap, validated as
 * untrusted input), synthetic models from a seed (presets), the llama2.c writer, and the
 * model identity.
 */
#include "kernels/engine.h"
#include "kernels/cpu/quant.h"
#include "kernels/sha256.h"
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Limits far above any real Llama, low enough that sizes computed from a corrupt header
 * cannot overflow 64 bits or ask for absurd memory. */
#define MAX_DIM      (1 << 16)
#define MAX_HIDDEN   (1 << 20)
#define MAX_LAYERS   1024
#define MAX_HEADS    1024
#define MAX_VOCAB    (1 << 22)
#define MAX_SEQ      (1 << 20)
#define HEADER_BYTES 28 /* seven int32 */

struct eng_model {
    eng_model_config cfg;
    eng_weights w;
    bool lazy;
    bool synthetic;
    uint64_t seed;
    char preset[32];
    char path[256];
    char name[128]; /* GGUF general.name, "" when none */
    void *map;      /* file mapping (files) */
    size_t map_len;
    float *owned; /* generated weights (synthetic) */
    size_t owned_floats;
    float *yarn_factors;       /* YaRN's per-frequency divisors [rope_dim/2] (GGUF), or NULL */
    eng_layer_weights *layers; /* the typed per-layer view (every non-lazy model) */
    eng_model_tensors t;
    eng_model_hparams hp;
    gguf_file *gguf; /* GGUF models: the open file (owns the mapping) */
    int32_t stop[3]; /* tokens that end generation */
    int n_stop;
    pthread_mutex_t hash_lock; /* the file hash is computed on first use: it reads every byte */
    char hash[65];
};

/* ---- presets ------------------------------------------------------------------------ */

static const struct preset {
    const char *name;
    eng_model_config cfg;
} presets[] = {
    /* name          dim   hidden layers heads kv  vocab   seq   shared */
    {"stories15M", {288, 768, 6, 6, 6, 32000, 256, true}},
    {"stories110M", {768, 2048, 12, 12, 12, 32000, 1024, true}},
    {"llama3-8b", {4096, 14336, 32, 32, 8, 128256, 8192, false}},
    /* small grouped-query shape with its own classifier: exercises both GQA and wcls */
    {"gqa-test", {128, 344, 4, 8, 2, 512, 512, false}},
    {"stories260K", {64, 172, 5, 8, 4, 512, 512, true}},
    /* rows that are whole 256-element blocks, so every GGUF type applies to every matrix */
    {"quant-test", {256, 768, 2, 4, 2, 512, 256, false}},
    /* the same rows, 16 layers, 4 query heads per KV head: the layer- and GQA-dependent rules
     * of llama.cpp's quantization mixes */
    {"quant-gqa", {256, 256, 16, 8, 2, 512, 256, false}},
    /* the same rows, 80 layers, 8 query heads per KV head: the shape llama.cpp's mixes treat
     * as a 70B model */
    {"quant-70b", {256, 256, 80, 8, 1, 512, 256, false}},
    /* tiny bodies for real vocabularies (ringlm-mkmodel --vocab): Llama 3's 128256 tokens,
     * Qwen3's tokenizer.json's 151669, Llama 2's 32000 */
    {"vocab-llama3", {64, 128, 2, 4, 2, 128256, 256, true}},
    {"vocab-qwen3", {64, 128, 2, 4, 2, 151669, 256, true}},
    {"vocab-llama2", {64, 128, 2, 4, 2, 32000, 256, true}},
};

int eng_preset(const char *name, eng_model_config *out)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) == 0) {
            *out = presets[i].cfg;
            return 0;
        }
    }
    return eng_seterr(-ENOENT,
                      "unknown preset \"%s\" (stories15M, stories110M, llama3-8b, "
                      "gqa-test, stories260K, quant-test, quant-gqa, quant-70b, vocab-llama3, "
                      "vocab-qwen3, "
                      "vocab-llama2)",
                      name);
}

/* ---- shape validation and tensor layout --------------------------------------------- */

static int check_range(const char *field, int v, int lo, int hi)
{
    if (v < lo || v > hi)
        return eng_seterr(-EINVAL, "header %s=%d: must be %d..%d", field, v, lo, hi);
    return 0;
}

/* Every rule a shape must satisfy for the forward pass to be well defined. */
static int config_check(const eng_model_config *c, int head_dim)
{
    int err;
    if ((err = check_range("dim", c->dim, 1, MAX_DIM)) ||
        (err = check_range("hidden_dim", c->hidden_dim, 1, MAX_HIDDEN)) ||
        (err = check_range("n_layers", c->n_layers, 1, MAX_LAYERS)) ||
        (err = check_range("n_heads", c->n_heads, 1, MAX_HEADS)) ||
        (err = check_range("n_kv_heads", c->n_kv_heads, 1, MAX_HEADS)) ||
        (err = check_range("vocab_size", c->vocab_size, 1, MAX_VOCAB)) ||
        (err = check_range("seq_len", c->seq_len, 1, MAX_SEQ)))
        return err;
    if (!head_dim && c->dim % c->n_heads)
        return eng_seterr(-EINVAL,
                          "header n_heads=%d does not divide dim=%d: head size must be "
                          "a whole number",
                          c->n_heads, c->dim);
    int head_size = head_dim ? head_dim : c->dim / c->n_heads;
    if (head_size % 2)
        return eng_seterr(-EINVAL,
                          "head size dim/n_heads=%d is odd: RoPE rotates pairs, it must "
                          "be even",
                          head_size);
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads)
        return eng_seterr(-EINVAL, "header n_kv_heads=%d: must divide n_heads=%d", c->n_kv_heads,
                          c->n_heads);
    return 0;
}

/* Float counts of each tensor in file order (freq_cis = the two legacy RoPE tables). */
struct layout {
    uint64_t embed, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis, wcls;
    uint64_t total;
};

static struct layout layout_of(const eng_model_config *c)
{
    uint64_t d = (uint64_t)c->dim, h = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t kv = d * (uint64_t)c->n_kv_heads / (uint64_t)c->n_heads;
    uint64_t hs = d / (uint64_t)c->n_heads;
    struct layout l = {
        .embed = (uint64_t)c->vocab_size * d,
        .rms_att = L * d,
        .wq = L * d * d,
        .wk = L * kv * d,
        .wv = L * kv * d,
        .wo = L * d * d,
        .rms_ffn = L * d,
        .w1 = L * h * d,
        .w2 = L * d * h,
        .w3 = L * h * d,
        .rms_final = d,
        .freq_cis = 2 * (uint64_t)c->seq_len * (hs / 2),
        .wcls = c->shared_classifier ? 0 : (uint64_t)c->vocab_size * d,
    };
    l.total = l.embed + l.rms_att + l.wq + l.wk + l.wv + l.wo + l.rms_ffn + l.w1 + l.w2 + l.w3 +
              l.rms_final + l.freq_cis + l.wcls;
    return l;
}

/* Points w at the tensors of a file-ordered float array. */
static void point_weights(const eng_model_config *c, const float *base, eng_weights *w)
{
    struct layout l = layout_of(c);
    const float *p = base;
    w->token_embedding = p;
    p += l.embed;
    w->rms_att = p;
    p += l.rms_att;
    w->wq = p;
    p += l.wq;
    w->wk = p;
    p += l.wk;
    w->wv = p;
    p += l.wv;
    w->wo = p;
    p += l.wo;
    w->rms_ffn = p;
    p += l.rms_ffn;
    w->w1 = p;
    p += l.w1;
    w->w2 = p;
    p += l.w2;
    w->w3 = p;
    p += l.w3;
    w->rms_final = p;
    p += l.rms_final;
    p += l.freq_cis; /* unused: RoPE is computed, as run.c does */
    w->wcls = c->shared_classifier ? w->token_embedding : p;
}

/* llama2.c's values (run.c hard-codes them); GGUF files replace them. */
static void hparams_llama2c(eng_model *m)
{
    m->hp = (eng_model_hparams){.arch = ENG_ARCH_LLAMA,
                                .head_dim = m->cfg.dim / m->cfg.n_heads,
                                .norm_eps = 1e-5f,
                                .rope_theta = 10000.0f,
                                .rope_dim = m->cfg.dim / m->cfg.n_heads,
                                .rope_neox = false,
                                .weight_type = ENG_W_F32};
}

/* The typed per-layer view of llama2.c-layout float32 weights. */
static int build_tensors(eng_model *m)
{
    const eng_model_config *c = &m->cfg;
    const eng_weights *w = &m->w;
    const size_t d = (size_t)c->dim, h = (size_t)c->hidden_dim;
    const size_t kv = d * (size_t)c->n_kv_heads / (size_t)c->n_heads;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return eng_seterr(-ENOMEM, "out of memory");
    for (size_t l = 0; l < (size_t)c->n_layers; l++) {
        eng_layer_weights *lw = &m->layers[l];
        lw->rms_att = w->rms_att + l * d;
        lw->rms_ffn = w->rms_ffn + l * d;
        lw->wq = (eng_wmat){w->wq + l * d * d, ENG_W_F32};
        lw->wk = (eng_wmat){w->wk + l * kv * d, ENG_W_F32};
        lw->wv = (eng_wmat){w->wv + l * kv * d, ENG_W_F32};
        lw->wo = (eng_wmat){w->wo + l * d * d, ENG_W_F32};
        lw->w1 = (eng_wmat){w->w1 + l * h * d, ENG_W_F32};
        lw->w2 = (eng_wmat){w->w2 + l * d * h, ENG_W_F32};
        lw->w3 = (eng_wmat){w->w3 + l * h * d, ENG_W_F32};
    }
    m->t = (eng_model_tensors){
        .token_embedding = {w->token_embedding, ENG_W_F32},
        .layers = m->layers,
        .rms_final = w->rms_final,
        .wcls = {w->wcls, ENG_W_F32},
    };
    return 0;
}

const char *eng_wtype_name(int type)
{
    return gguf_type_name((uint32_t)type);
}
size_t eng_wrow_bytes(int type, int64_t in)
{
    return q_row_bytes(type, in);
}

/* ---- synthetic weights -------------------------------------------------------------- */

uint64_t eng_splitmix64(uint64_t x)
{
    uint64_t z = x + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Exactly the documented formula; every step is exact in float except the final multiply
 * by scale (and the separate + 1 for norms), so a device regenerating it with IEEE float
 * math (no fused multiply-add across the two steps) gets the same bits. */
float eng_synth_value(uint64_t seed, int tensor_id, uint64_t index, float scale, bool is_norm)
{
    uint64_t u = eng_splitmix64(seed ^ ((uint64_t)tensor_id << 56) ^ index);
    float unit = (float)(u >> 40) * (1.0f / 16777216.0f); /* [0, 1), 24 bits: exact */
    volatile float val = (unit * 2.0f - 1.0f) * scale;    /* volatile: no contraction into +1 */
    return is_norm ? 1.0f + val : val;
}

static bool is_norm_tensor(int id)
{
    return id == ENG_T_RMS_ATT || id == ENG_T_RMS_FFN || id == ENG_T_RMS_FINAL;
}

float eng_synth_scale(const eng_model_config *c, int tensor_id)
{
    switch (tensor_id) {
    case ENG_T_EMBED: return 1.0f;
    case ENG_T_RMS_ATT:
    case ENG_T_RMS_FFN:
    case ENG_T_RMS_FINAL: return 0.1f;
    case ENG_T_W2: return 1.0f / sqrtf((float)c->hidden_dim);
    default: return 1.0f / sqrtf((float)c->dim); /* wq wk wv wo w1 w3 wcls: fan-in dim */
    }
}

static void synth_fill(float *dst, uint64_t n, uint64_t seed, const eng_model_config *c, int id,
                       uint64_t first_index)
{
    float scale = eng_synth_scale(c, id);
    bool norm = is_norm_tensor(id);
    for (uint64_t i = 0; i < n; i++)
        dst[i] = eng_synth_value(seed, id, first_index + i, scale, norm);
}

/* llama2.c's legacy RoPE tables (written for format compatibility, never read). */
static void freq_cis_fill(float *dst, const eng_model_config *c, bool imag, uint64_t first,
                          uint64_t n)
{
    int hs = c->dim / c->n_heads, half = hs / 2;
    for (uint64_t k = 0; k < n; k++) {
        uint64_t i = first + k;
        int pos = (int)(i / (uint64_t)half), j = (int)(i % (uint64_t)half);
        double freq = 1.0 / pow(10000.0, (double)(2 * j) / hs);
        dst[k] = (float)(imag ? sin(pos * freq) : cos(pos * freq));
    }
}

/* ---- loading ------------------------------------------------------------------------ */

static eng_model *model_new(void)
{
    eng_model *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->hash_lock, NULL);
    return m;
}


static int load_synthetic(const char *spec, eng_model **out)
{
    const char *rest = spec + strlen("synthetic:");
    bool lazy = false;
    if (strncmp(rest, "lazy:", 5) == 0) {
        lazy = true;
        rest += 5;
    }
    char name[32];
    const char *colon = strchr(rest, ':');
    size_t nlen = colon ? (size_t)(colon - rest) : strlen(rest);
    if (nlen == 0 || nlen >= sizeof name)
        return eng_seterr(-EINVAL, "model spec \"%s\": expected synthetic:PRESET:SEED", spec);
    memcpy(name, rest, nlen);
    name[nlen] = '\0';
    uint64_t seed = 1; /* "synthetic:PRESET" alone means seed 1 */
    if (colon) {
        char *end;
        errno = 0;
        seed = strtoull(colon + 1, &end, 0);
        if (errno || end == colon + 1 || *end)
            return eng_seterr(-EINVAL,
                              "model spec \"%s\": SEED \"%s\" is not an unsigned "
                              "integer",
                              spec, colon + 1);
    }
    eng_model_config cfg;
    int err = eng_preset(name, &cfg);
    if (err) return eng_seterr(-EINVAL, "model spec \"%s\": %s", spec, eng_errmsg());
    eng_model *m = model_new();
    if (!m) return eng_seterr(-ENOMEM, "out of memory");
    m->cfg = cfg;
    hparams_llama2c(m);
    m->lazy = lazy;
    m->synthetic = true;
    m->seed = seed;
    snprintf(m->preset, sizeof m->preset, "%s", name);
    char ident[96];
    snprintf(ident, sizeof ident, "synthetic:%s:%" PRIu64, name, seed);
    sha256_hex(ident, strlen(ident), m->hash);
    if (!lazy) {
        /* The same layout as a file (minus the unused RoPE tables), so both paths share
         * point_weights and the writer. */
        struct layout l = layout_of(&cfg);
        m->owned_floats = l.total;
        m->owned = malloc(l.total * sizeof(float));
        if (!m->owned) {
            eng_model_free(m);
            return eng_seterr(-ENOMEM, "synthetic %s: cannot allocate %" PRIu64 " MiB of weights",
                              name, l.total * 4 >> 20);
        }
        point_weights(&cfg, m->owned, &m->w);
        static const int ids[] = {ENG_T_EMBED, ENG_T_RMS_ATT, ENG_T_WQ,       ENG_T_WK,
                                  ENG_T_WV,    ENG_T_WO,      ENG_T_RMS_FFN,  ENG_T_W1,
                                  ENG_T_W2,    ENG_T_W3,      ENG_T_RMS_FINAL};
        const float *ptrs[] = {
            m->w.token_embedding, m->w.rms_att, m->w.wq, m->w.wk, m->w.wv,       m->w.wo,
            m->w.rms_ffn,         m->w.w1,      m->w.w2, m->w.w3, m->w.rms_final};
        const uint64_t counts[] = {l.embed,   l.rms_att, l.wq, l.wk, l.wv,       l.wo,
                                   l.rms_ffn, l.w1,      l.w2, l.w3, l.rms_final};
        for (int i = 0; i < 11; i++) synth_fill((float *)ptrs[i], counts[i], seed, &cfg, ids[i], 0);
        float *fc = (float *)m->w.rms_final + l.rms_final;
        freq_cis_fill(fc, &cfg, false, 0, l.freq_cis / 2);
        freq_cis_fill(fc + l.freq_cis / 2, &cfg, true, 0, l.freq_cis / 2);
        if (!cfg.shared_classifier)
            synth_fill((float *)m->w.wcls, l.wcls, seed, &cfg, ENG_T_WCLS, 0);
        if ((err = build_tensors(m))) {
            eng_model_free(m);
            return err;
        }
    }
    *out = m;
    return 0;
}

/* ---- GGUF --------------------------------------------------------------------------- */

/* Reads "ARCH.suffix" as an int in lo..hi; required unless dflt >= 0 (then the default when
 * absent). */
static int meta_int(const gguf_file *g, const char *arch, const char *suffix, int lo, int hi,
                    int dflt, int *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint64_t v;
    int err = gguf_get_u64(g, key, &v);
    if (err == -ENOENT) {
        if (dflt < 0) return eng_seterr(-EINVAL, "metadata %s: required, absent", key);
        *out = dflt;
        return 0;
    }
    if (err) return eng_seterr(err, "metadata %s", gguf_errmsg());
    if (v < (uint64_t)lo || v > (uint64_t)hi)
        return eng_seterr(-EINVAL, "metadata %s=%" PRIu64 ": must be %d..%d", key, v, lo, hi);
    *out = (int)v;
    return 0;
}

static int meta_f32(const gguf_file *g, const char *arch, const char *suffix, float dflt,
                    bool required, float *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int err = gguf_get_f32(g, key, out);
    if (err == -ENOENT) {
        if (required) return eng_seterr(-EINVAL, "metadata %s: required, absent", key);
        *out = dflt;
        return 0;
    }
    if (err) return eng_seterr(err, "metadata %s", gguf_errmsg());
    if (!(*out > 0.0f) || !isfinite(*out))
        return eng_seterr(-EINVAL, "metadata %s=%g: must be a positive finite number", key,
                          (double)*out);
    return 0;
}

/* A non-negative f32 of the file (YaRN's extrapolation factor may be 0). */
static int meta_f32_nonneg(const gguf_file *g, const char *arch, const char *suffix, float dflt,
                           float *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int err = gguf_get_f32(g, key, out);
    if (err == -ENOENT) {
        *out = dflt;
        return 0;
    }
    if (err) return eng_seterr(err, "metadata %s", gguf_errmsg());
    if (!(*out >= 0.0f) || !isfinite(*out))
        return eng_seterr(-EINVAL, "metadata %s=%g: must be a non-negative finite number", key,
                          (double)*out);
    return 0;
}

/* YaRN (rope.scaling.type "yarn"), as ggml's rope_yarn computes it: each frequency's angle
 * is the interpolated one (divided by the factor) blended with the original by a ramp over
 * the dimensions between the corrections for beta_fast and beta_slow rotations in the
 * original context, i.e. the frequency divided by 1 / (s (1 - r) + r) with s = 1 / factor; and
 * cos and sin multiplied by 1 + 0.1 ln(factor) (times rope.scaling.attn_factor), the
 * magnitude llama.cpp ends with. The divisors go where Llama 3.1's would. */
static int yarn_factors(const gguf_file *g, const char *arch, const eng_model_config *c,
                        float factor, eng_model_hparams *hp, float **out)
{
    float beta_fast, beta_slow, ext, yarn_attn, log_mul;
    int orig, err;
    if ((err = meta_int(g, arch, "rope.scaling.original_context_length", 1, MAX_SEQ, c->seq_len,
                        &orig)) ||
        (err = meta_f32(g, arch, "rope.scaling.yarn_beta_fast", 32.0f, false, &beta_fast)) ||
        (err = meta_f32(g, arch, "rope.scaling.yarn_beta_slow", 1.0f, false, &beta_slow)) ||
        (err = meta_f32_nonneg(g, arch, "rope.scaling.yarn_ext_factor", 1.0f, &ext)) ||
        (err = meta_f32(g, arch, "rope.scaling.yarn_attn_factor", 1.0f, false, &yarn_attn)) ||
        (err = meta_f32_nonneg(g, arch, "rope.scaling.yarn_log_multiplier", 0.0f, &log_mul)))
        return err;
    if (log_mul != 0.0f)
        return eng_seterr(-EINVAL,
                          "metadata %s.rope.scaling.yarn_log_multiplier=%g: not supported "
                          "(DeepSeek's YaRN)",
                          arch, (double)log_mul);
    const int n_dims = hp->rope_dim, half = n_dims / 2;
    float *f = malloc((size_t)half * sizeof *f);
    if (!f) return eng_seterr(-ENOMEM, "out of memory");
    const float base = hp->rope_theta, fs = 1.0f / factor;
#define CORR_DIM(n_rot)                                                                            \
    ((float)n_dims * logf((float)orig / ((n_rot)*2 * (float)M_PI)) / (2 * logf(base)))
    float lo = floorf(CORR_DIM(beta_fast)), hi = ceilf(CORR_DIM(beta_slow));
#undef CORR_DIM
    if (lo < 0) lo = 0;
    if (hi > (float)(n_dims - 1)) hi = (float)(n_dims - 1);
    for (int i = 0; i < half; i++) {
        float y = ((float)i - lo) / fmaxf(0.001f, hi - lo);
        float ramp = (1 - fminf(1, fmaxf(0, y))) * ext;
        f[i] = 1.0f / (fs * (1 - ramp) + ramp);
    }
    float mscale = hp->rope_attn_factor > 0.0f ? hp->rope_attn_factor : 1.0f;
    if (ext != 0.0f)
        mscale *= factor <= 1.0f ? 1.0f : 0.1f * logf(factor) + 1.0f;
    else
        mscale *= yarn_attn;
    hp->rope_attn_factor = mscale;
    *out = f;
    return 0;
}

static const char *supported_types = "F32, F16, BF16, Q8_0, Q4_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, "
                                     "IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS";
static const char *supported_archs = "llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe";

const char *eng_arch_name(int arch)
{
    static const char *const names[ENG_ARCH__COUNT] = {
        [ENG_ARCH_LLAMA] = "llama",       [ENG_ARCH_QWEN2] = "qwen2",   [ENG_ARCH_QWEN3] = "qwen3",
        [ENG_ARCH_GEMMA2] = "gemma2",     [ENG_ARCH_GEMMA3] = "gemma3", [ENG_ARCH_PHI3] = "phi3",
        [ENG_ARCH_QWEN3MOE] = "qwen3moe",
    };
    return arch >= 0 && arch < ENG_ARCH__COUNT && names[arch] ? names[arch] : "?";
}

/* Finds a tensor and checks its shape: ne = {ne0, ne1} (ne1 == 0: a vector). A matrix
 * must have a supported type; a vector (norm, bias, RoPE factors) must be F32. */
static int find_tensor(const gguf_file *g, const char *name, uint64_t ne0, uint64_t ne1,
                       bool optional, const gguf_tensor **out)
{
    const gguf_tensor *t = gguf_tensor_find(g, name);
    *out = t;
    if (!t) return optional ? 0 : eng_seterr(-EINVAL, "tensor %s: required, absent", name);
    uint32_t want_dims = ne1 ? 2 : 1;
    if (t->n_dims != want_dims || t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1)) {
        char found[96] = "";
        for (uint32_t d = 0; d < t->n_dims; d++)
            snprintf(found + strlen(found), sizeof found - strlen(found), "%s%" PRIu64,
                     d ? ", " : "", t->ne[d]);
        if (ne1)
            return eng_seterr(-EINVAL,
                              "tensor %s: expected shape [%" PRIu64 ", %" PRIu64 "] "
                              "(ne0 = inputs, ne1 = outputs), found [%s]",
                              name, ne0, ne1, found);
        return eng_seterr(-EINVAL, "tensor %s: expected shape [%" PRIu64 "], found [%s]", name, ne0,
                          found);
    }
    if (ne1 && !q_type_supported((int)t->type))
        return eng_seterr(-EINVAL, "tensor %s: type %s is not supported (%s)", name,
                          gguf_type_name(t->type), supported_types);
    if (!ne1 && t->type != GGUF_T_F32)
        return eng_seterr(-EINVAL,
                          "tensor %s: type %s: norms, biases and RoPE factors must be "
                          "F32",
                          name, gguf_type_name(t->type));
    return 0;
}

/* The hyperparameters past llama's, under the architecture's keys with llama.cpp's defaults:
 * sliding windows (Mistral's where a llama file states one, gemma's alternating layers),
 * gemma's embedding scale, GeGLU, attention scale and soft-capping, gemma3's local RoPE. */
static int arch_hparams(const gguf_file *g, const char *arch, int arch_id,
                        const eng_model_config *c, eng_model_hparams *hp)
{
    const bool gemma2 = arch_id == ENG_ARCH_GEMMA2, gemma3 = arch_id == ENG_ARCH_GEMMA3;
    int err, window = 0, period = 0;
    /* Q and K scaled by it in RoPE (Phi-3's long-RoPE attention factor) */
    if ((err = meta_f32(g, arch, "rope.scaling.attn_factor", 1.0f, false, &hp->rope_attn_factor)))
        return err;
    /* Phi-3 files state a window that llama.cpp switches off (its converters got it wrong):
     * ignored here too */
    if (arch_id == ENG_ARCH_PHI3) return 0;
    if (arch_id == ENG_ARCH_QWEN3MOE) {
        if ((err = meta_int(g, arch, "expert_count", 1, 4096, -1, &hp->n_expert)) ||
            (err =
                 meta_int(g, arch, "expert_used_count", 1, hp->n_expert, -1, &hp->n_expert_used)) ||
            (err = meta_int(g, arch, "expert_feed_forward_length", 1, MAX_HIDDEN,
                            c->hidden_dim / hp->n_expert_used, &hp->expert_ff)))
            return err;
        return 0;
    }
    if ((err = meta_int(g, arch, "attention.sliding_window", 0, MAX_SEQ, gemma2 ? 4096 : 0,
                        &window)) ||
        (err = meta_int(g, arch, "attention.sliding_window_pattern", 0, MAX_LAYERS,
                        gemma2   ? 2
                        : gemma3 ? 6
                                 : 0,
                        &period)))
        return err;
    hp->swa_window = window;
    hp->swa_period = window ? period : 0;
    if (!gemma2 && !gemma3) return 0;
    hp->rope_neox = true;
    hp->embed_scale = sqrtf((float)c->dim);
    hp->ffn_act = ENG_ACT_GELU;
    /* gemma's 27B scales q·k by 1/sqrt(dim / n_heads) (query_pre_attn_scalar), the others by
     * 1/sqrt(head_dim); llama.cpp tells the 27B by its layer count, and so does this */
    if (c->n_layers == (gemma2 ? 46 : 62))
        hp->attn_scale = 1.0f / sqrtf((float)(c->dim / c->n_heads));
    if (gemma2) {
        if ((err = meta_f32(g, arch, "attn_logit_softcapping", 50.0f, false, &hp->attn_softcap)) ||
            (err = meta_f32(g, arch, "final_logit_softcapping", 30.0f, false, &hp->final_softcap)))
            return err;
        return 0;
    }
    if ((err = meta_f32(g, arch, "final_logit_softcapping", 0.0f, false, &hp->final_softcap)) ||
        (err = meta_f32(g, arch, "rope.freq_base_swa", 10000.0f, false, &hp->rope_theta_swa)))
        return err;
    hp->rope_scale_swa = 1.0f; /* the local layers are not scaled (llama.cpp's freq_scale_swa) */
    return 0;
}

/* An expert tensor: ne = {ne0, ne1, n_expert}, a supported type. */
static int find_experts(const gguf_file *g, const char *name, uint64_t ne0, uint64_t ne1,
                        uint64_t ne2, const gguf_tensor **out)
{
    const gguf_tensor *t = gguf_tensor_find(g, name);
    *out = t;
    if (!t) return eng_seterr(-EINVAL, "tensor %s: required, absent", name);
    if (t->n_dims != 3 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2)
        return eng_seterr(-EINVAL,
                          "tensor %s: expected shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64
                          "] (inputs, outputs, experts), found %" PRIu32 " dimensions [%" PRIu64
                          ", %" PRIu64 ", %" PRIu64 "]",
                          name, ne0, ne1, ne2, t->n_dims, t->ne[0], t->ne[1], t->ne[2]);
    if (!q_type_supported((int)t->type))
        return eng_seterr(-EINVAL, "tensor %s: type %s is not supported (%s)", name,
                          gguf_type_name(t->type), supported_types);
    return 0;
}

static int gguf_to_model(eng_model *m, const gguf_file *g)
{
    const char *arch_s;
    size_t arch_len;
    int err = gguf_get_str(g, "general.architecture", &arch_s, &arch_len);
    if (err == -ENOENT)
        return eng_seterr(-EINVAL, "metadata general.architecture: required, absent");
    if (err) return eng_seterr(err, "metadata %s", gguf_errmsg());
    char arch[16];
    int arch_id = -1;
    for (int a = 0; a < ENG_ARCH__COUNT; a++) {
        const char *n = eng_arch_name(a);
        if (strlen(n) == arch_len && memcmp(n, arch_s, arch_len) == 0) arch_id = a;
    }
    if (arch_id < 0)
        return eng_seterr(-EINVAL,
                          "metadata general.architecture=\"%.*s\": not supported "
                          "(%s)",
                          (int)(arch_len > 64 ? 64 : arch_len), arch_s, supported_archs);
    snprintf(arch, sizeof arch, "%s", eng_arch_name(arch_id));
    eng_model_config c = {0};
    if ((err = meta_int(g, arch, "context_length", 1, MAX_SEQ, -1, &c.seq_len)) ||
        (err = meta_int(g, arch, "embedding_length", 1, MAX_DIM, -1, &c.dim)) ||
        (err = meta_int(g, arch, "feed_forward_length", 1, MAX_HIDDEN, -1, &c.hidden_dim)) ||
        (err = meta_int(g, arch, "block_count", 1, MAX_LAYERS, -1, &c.n_layers)) ||
        (err = meta_int(g, arch, "attention.head_count", 1, MAX_HEADS, -1, &c.n_heads)) ||
        (err =
             meta_int(g, arch, "attention.head_count_kv", 1, MAX_HEADS, c.n_heads, &c.n_kv_heads)))
        return err;
    /* The head size is key_length where the file states it (Qwen3, Gemma, Mistral Nemo:
     * n_heads * head_dim need not be embedding_length), else embedding_length / head_count. */
    int key_len, val_len;
    if ((err = meta_int(g, arch, "attention.key_length", 1, MAX_DIM, 0, &key_len)) ||
        (err = meta_int(g, arch, "attention.value_length", 1, MAX_DIM, key_len, &val_len)))
        return err;
    if (key_len == 0 && c.dim % c.n_heads)
        return eng_seterr(-EINVAL,
                          "metadata %s.attention.head_count=%d does not divide %s."
                          "embedding_length=%d (and %s.attention.key_length is absent)",
                          arch, c.n_heads, arch, c.dim, arch);
    const int hs = key_len ? key_len : c.dim / c.n_heads;
    if ((val_len ? val_len : hs) != hs)
        return eng_seterr(-EINVAL,
                          "metadata %s.attention.key_length=%d value_length=%d: only "
                          "equal key and value head sizes are supported",
                          arch, hs, val_len);
    if (hs % 2 || (uint64_t)hs * (uint64_t)c.n_heads > MAX_DIM)
        return eng_seterr(-EINVAL,
                          "metadata %s.attention.key_length=%d: must be even, and times "
                          "head_count=%d at most %d",
                          arch, hs, c.n_heads, MAX_DIM);
    eng_model_hparams hp = {
        .arch = arch_id,
        .head_dim = hs,
        .rope_neox = arch_id == ENG_ARCH_QWEN2 || arch_id == ENG_ARCH_QWEN3 ||
                     arch_id == ENG_ARCH_PHI3 || arch_id == ENG_ARCH_QWEN3MOE,
    };
    if ((err = meta_f32(g, arch, "attention.layer_norm_rms_epsilon", 1e-5f, true, &hp.norm_eps)) ||
        (err = meta_f32(g, arch, "rope.freq_base", 10000.0f, false, &hp.rope_theta)) ||
        (err = meta_int(g, arch, "rope.dimension_count", 2, hs, hs, &hp.rope_dim)))
        return err;
    if (hp.rope_dim % 2)
        return eng_seterr(-EINVAL, "metadata %s.rope.dimension_count=%d: must be even", arch,
                          hp.rope_dim);
    char key[128];
    const char *st;
    size_t st_len;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    err = gguf_get_str(g, key, &st, &st_len);
    if (err && err != -ENOENT) return eng_seterr(err, "metadata %s", gguf_errmsg());
    float yarn_factor = 0.0f; /* YaRN's factor when the file asks for it */
    if (!err && !(st_len == 4 && memcmp(st, "none", 4) == 0)) {
        float factor = 1.0f;
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        if (gguf_get_f32(g, key, &factor) == -EINVAL)
            return eng_seterr(-EINVAL, "metadata %s", gguf_errmsg());
        const bool linear = st_len == 6 && memcmp(st, "linear", 6) == 0;
        const bool yarn = st_len == 4 && memcmp(st, "yarn", 4) == 0;
        if ((!linear && !yarn) || !(factor > 0.0f) || !isfinite(factor))
            return eng_seterr(-EINVAL,
                              "metadata %s.rope.scaling.type=\"%.*s\" (factor %g): not "
                              "supported (none, linear, yarn; Llama 3.1 scaling is read from the "
                              "rope_freqs.weight tensor)",
                              arch, (int)(st_len > 32 ? 32 : st_len), st, (double)factor);
        if (yarn)
            yarn_factor = factor;
        else if (factor != 1.0f)
            hp.rope_scale = 1.0f / factor; /* positions divided, as llama.cpp */
    }
    if ((err = arch_hparams(g, arch, arch_id, &c, &hp))) return err;
    const gguf_tensor *emb;
    const gguf_tensor *probe = gguf_tensor_find(g, "token_embd.weight");
    if (!probe) return eng_seterr(-EINVAL, "tensor token_embd.weight: required, absent");
    if (probe->n_dims != 2 || probe->ne[1] > MAX_VOCAB)
        return eng_seterr(-EINVAL,
                          "tensor token_embd.weight: expected [%d, vocab <= %d], found "
                          "%" PRIu32 " dimensions, ne1=%" PRIu64,
                          c.dim, MAX_VOCAB, probe->n_dims, probe->ne[1]);
    c.vocab_size = (int)probe->ne[1];
    if ((err = config_check(&c, hs))) return err;
    const uint64_t d = (uint64_t)c.dim, kv = (uint64_t)(hs * c.n_kv_heads);
    const uint64_t qd = (uint64_t)hs * (uint64_t)c.n_heads;
    const bool phi3 = arch_id == ENG_ARCH_PHI3, moe = arch_id == ENG_ARCH_QWEN3MOE;
    const uint64_t h = (uint64_t)c.hidden_dim, vocab = (uint64_t)c.vocab_size;
    if ((err = find_tensor(g, "token_embd.weight", d, vocab, false, &emb))) return err;
    const gguf_tensor *out_norm, *out_w, *rope_f;
    if ((err = find_tensor(g, "output_norm.weight", d, 0, false, &out_norm)) ||
        (err = find_tensor(g, "output.weight", d, vocab, true, &out_w)) ||
        (err = find_tensor(g, "rope_freqs.weight", (uint64_t)hp.rope_dim / 2, 0, true, &rope_f)))
        return err;
    if (phi3 && !rope_f) {
        /* Phi-3's long-RoPE: the long factors when the context served is longer than the one
         * trained without scaling (rope.scaling.original_context_length), else the short
         * ones, as llama.cpp picks them for its context */
        const gguf_tensor *f_long, *f_short;
        int orig_ctx;
        if ((err = find_tensor(g, "rope_factors_long.weight", (uint64_t)hp.rope_dim / 2, 0, true,
                               &f_long)) ||
            (err = find_tensor(g, "rope_factors_short.weight", (uint64_t)hp.rope_dim / 2, 0, true,
                               &f_short)) ||
            (err = meta_int(g, arch, "rope.scaling.original_context_length", 1, MAX_SEQ, c.seq_len,
                            &orig_ctx)))
            return err;
        if (!f_long != !f_short)
            return eng_seterr(-EINVAL,
                              "tensor rope_factors_long.weight %s, rope_factors_short.weight "
                              "%s: long-RoPE needs both",
                              f_long ? "present" : "absent", f_short ? "present" : "absent");
        rope_f = c.seq_len > orig_ctx ? f_long : f_short;
    }
    const float *freq_factors = rope_f ? rope_f->data : NULL;
    if (yarn_factor > 0.0f) {
        if (rope_f)
            return eng_seterr(-EINVAL,
                              "metadata %s.rope.scaling.type=yarn beside a RoPE factor "
                              "tensor: not supported",
                              arch);
        if ((err = yarn_factors(g, arch, &c, yarn_factor, &hp, &m->yarn_factors))) return err;
        freq_factors = m->yarn_factors;
    }
    if (arch_id == ENG_ARCH_GEMMA2) out_w = NULL; /* gemma2's classifier is the embedding */
    c.shared_classifier = out_w == NULL;
    m->layers = calloc((size_t)c.n_layers, sizeof *m->layers);
    if (!m->layers) return eng_seterr(-ENOMEM, "out of memory");
    for (int l = 0; l < c.n_layers; l++) {
        eng_layer_weights *lw = &m->layers[l];
        static const struct {
            const char *name;
            int rows; /* 0: dim, 1: kv_dim, 2: hidden, 3: q_dim */
            int cols;
            size_t off; /* into eng_layer_weights */
        } mats[] = {
            {"attn_q", 3, 0, offsetof(eng_layer_weights, wq)},
            {"attn_k", 1, 0, offsetof(eng_layer_weights, wk)},
            {"attn_v", 1, 0, offsetof(eng_layer_weights, wv)},
            {"attn_output", 0, 3, offsetof(eng_layer_weights, wo)},
            {"ffn_gate", 2, 0, offsetof(eng_layer_weights, w1)},
            {"ffn_down", 0, 2, offsetof(eng_layer_weights, w2)},
            {"ffn_up", 2, 0, offsetof(eng_layer_weights, w3)},
        };
        const uint64_t sizes[5] = {d, kv, h, qd, (uint64_t)hs};
        char name[96];
        const gguf_tensor *t;
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            /* phi3 fuses Q, K and V into attn_qkv, and gate and up into ffn_up (gate first):
             * the parts are runs of its rows, so each is a view of the fused matrix */
            if (phi3 && i <= 2) {
                if (i == 0) {
                    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", l);
                    if ((err = find_tensor(g, name, d, qd + 2 * kv, false, &t))) return err;
                    const size_t rb = q_row_bytes((int)t->type, (int64_t)d);
                    const char *base = t->data;
                    lw->wq = (eng_wmat){base, (int)t->type};
                    lw->wk = (eng_wmat){base + qd * rb, (int)t->type};
                    lw->wv = (eng_wmat){base + (qd + kv) * rb, (int)t->type};
                }
                continue;
            }
            if (moe && (mats[i].off == offsetof(eng_layer_weights, w1) ||
                        mats[i].off == offsetof(eng_layer_weights, w2) ||
                        mats[i].off == offsetof(eng_layer_weights, w3))) {
                if (mats[i].off != offsetof(eng_layer_weights, w1)) continue;
                /* the router and the experts, in place of the dense FFN */
                const uint64_t ne = (uint64_t)hp.n_expert, ef = (uint64_t)hp.expert_ff;
                snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
                if ((err = find_tensor(g, name, d, ne, false, &t))) return err;
                lw->router = (eng_wmat){t->data, (int)t->type};
                static const struct {
                    const char *n;
                    int down;
                    size_t off;
                } ex[] = {{"ffn_gate_exps", 0, offsetof(eng_layer_weights, gate_exps)},
                          {"ffn_up_exps", 0, offsetof(eng_layer_weights, up_exps)},
                          {"ffn_down_exps", 1, offsetof(eng_layer_weights, down_exps)}};
                for (size_t x = 0; x < 3; x++) {
                    snprintf(name, sizeof name, "blk.%d.%s.weight", l, ex[x].n);
                    if ((err = find_experts(g, name, ex[x].down ? ef : d, ex[x].down ? d : ef, ne,
                                            &t)))
                        return err;
                    *(eng_wmat *)((char *)lw + ex[x].off) = (eng_wmat){t->data, (int)t->type};
                }
                continue;
            }
            if (phi3 && (mats[i].off == offsetof(eng_layer_weights, w1) ||
                         mats[i].off == offsetof(eng_layer_weights, w3))) {
                if (mats[i].off == offsetof(eng_layer_weights, w1)) continue;
                snprintf(name, sizeof name, "blk.%d.ffn_up.weight", l);
                if ((err = find_tensor(g, name, d, 2 * h, false, &t))) return err;
                const size_t rb = q_row_bytes((int)t->type, (int64_t)d);
                lw->w1 = (eng_wmat){t->data, (int)t->type};
                lw->w3 = (eng_wmat){(const char *)t->data + h * rb, (int)t->type};
                continue;
            }
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, mats[i].name);
            if ((err = find_tensor(g, name, sizes[mats[i].cols], sizes[mats[i].rows], false, &t)))
                return err;
            *(eng_wmat *)((char *)lw + mats[i].off) = (eng_wmat){t->data, (int)t->type};
        }
        static const struct {
            const char *name;
            int len; /* as rows above; 4: head_dim */
            /* which architectures need it, read it if present, or ignore it (as llama.cpp) */
            unsigned need, read;
            size_t off;
        } vecs[] = {
            {"attn_norm.weight", 0, ~0u, ~0u, offsetof(eng_layer_weights, rms_att)},
            {"ffn_norm.weight", 0, ~0u, ~0u, offsetof(eng_layer_weights, rms_ffn)},
            /* qwen2 has Q/K/V biases; llama files may carry them too */
            {"attn_q.bias", 3, 1u << ENG_ARCH_QWEN2, 1u << ENG_ARCH_LLAMA,
             offsetof(eng_layer_weights, bq)},
            {"attn_k.bias", 1, 1u << ENG_ARCH_QWEN2, 1u << ENG_ARCH_LLAMA,
             offsetof(eng_layer_weights, bk)},
            {"attn_v.bias", 1, 1u << ENG_ARCH_QWEN2, 1u << ENG_ARCH_LLAMA,
             offsetof(eng_layer_weights, bv)},
            {"attn_q_norm.weight", 4,
             1u << ENG_ARCH_QWEN3 | 1u << ENG_ARCH_GEMMA3 | 1u << ENG_ARCH_QWEN3MOE, 0,
             offsetof(eng_layer_weights, q_norm)},
            {"attn_k_norm.weight", 4,
             1u << ENG_ARCH_QWEN3 | 1u << ENG_ARCH_GEMMA3 | 1u << ENG_ARCH_QWEN3MOE, 0,
             offsetof(eng_layer_weights, k_norm)},
            {"post_attention_norm.weight", 0, 1u << ENG_ARCH_GEMMA2 | 1u << ENG_ARCH_GEMMA3, 0,
             offsetof(eng_layer_weights, post_att)},
            {"post_ffw_norm.weight", 0, 1u << ENG_ARCH_GEMMA2 | 1u << ENG_ARCH_GEMMA3, 0,
             offsetof(eng_layer_weights, post_ffn)},
        };
        for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) {
            const bool need = vecs[i].need >> arch_id & 1, read = vecs[i].read >> arch_id & 1;
            if (!need && !read) continue;
            snprintf(name, sizeof name, "blk.%d.%s", l, vecs[i].name);
            if ((err = find_tensor(g, name, sizes[vecs[i].len], 0, !need, &t))) return err;
            *(const float **)((char *)lw + vecs[i].off) = t ? t->data : NULL;
        }
        /* the kernels add the three biases together: some without the others is refused */
        const int n_bias = !!lw->bq + !!lw->bk + !!lw->bv;
        if (n_bias != 0 && n_bias != 3)
            return eng_seterr(-EINVAL,
                              "blk.%d: attn_q.bias %s, attn_k.bias %s, attn_v.bias %s: "
                              "Q/K/V biases are supported all three or none",
                              l, lw->bq ? "present" : "absent", lw->bk ? "present" : "absent",
                              lw->bv ? "present" : "absent");
    }
    hp.weight_type = m->layers[0].wq.type;
    /* Stop tokens: EOS (2, SentencePiece's, when the file names none), EOT, EOM. */
    static const char *const stop_keys[] = {"tokenizer.ggml.eos_token_id",
                                            "tokenizer.ggml.eot_token_id",
                                            "tokenizer.ggml.eom_token_id"};
    m->n_stop = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t id;
        err = gguf_get_u64(g, stop_keys[i], &id);
        if (err == -ENOENT) {
            if (i > 0) continue;
            id = 2;
        } else if (err) {
            return eng_seterr(err, "metadata %s", gguf_errmsg());
        }
        if (id >= (uint64_t)c.vocab_size)
            return eng_seterr(-EINVAL,
                              "metadata %s=%" PRIu64 ": outside the vocabulary of %d "
                              "tokens",
                              stop_keys[i], id, c.vocab_size);
        bool dup = false;
        for (int k = 0; k < m->n_stop; k++) dup |= m->stop[k] == (int32_t)id;
        if (!dup) m->stop[m->n_stop++] = (int32_t)id;
    }
    m->cfg = c;
    m->hp = hp;
    m->t = (eng_model_tensors){
        .token_embedding = {emb->data, (int)emb->type},
        .layers = m->layers,
        .rms_final = out_norm->data,
        .wcls = out_w ? (eng_wmat){out_w->data, (int)out_w->type}
                      : (eng_wmat){emb->data, (int)emb->type},
        .rope_freq_factors = freq_factors,
    };
    return 0;
}

static int load_gguf(const char *path, eng_model **out)
{
    gguf_file *g;
    int err = gguf_open_weights(path, &g);
    if (err) return eng_seterr(err, "%s", gguf_errmsg());
    eng_model *m = model_new();
    if (!m) {
        gguf_close(g);
        return eng_seterr(-ENOMEM, "out of memory");
    }
    m->gguf = g;
    snprintf(m->path, sizeof m->path, "%s", path);
    const char *gname;
    size_t gname_len;
    if (gguf_get_str(g, "general.name", &gname, &gname_len) == 0 && gname_len &&
        !memchr(gname, 0, gname_len))
        snprintf(m->name, sizeof m->name, "%.*s",
                 (int)(gname_len < sizeof m->name ? gname_len : sizeof m->name - 1), gname);
    size_t len;
    m->map = (void *)gguf_bytes(g, &len);
    m->map_len = len;
    if ((err = gguf_to_model(m, g))) {
        char detail[512];
        snprintf(detail, sizeof detail, "%s", eng_errmsg());
        eng_model_free(m);
        return eng_seterr(err, "%s: %s", path, detail);
    }
    *out = m;
    return 0;
}

static int load_file(const char *path, eng_model **out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return eng_seterr(-errno, "%s: %s", path, strerror(errno));
    int err;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        err = eng_seterr(-errno, "%s: %s", path, strerror(errno));
        goto fail_fd;
    }
    if (!S_ISREG(st.st_mode)) {
        err = eng_seterr(-EINVAL, "%s: not a regular file", path);
        goto fail_fd;
    }
    uint64_t size = (uint64_t)st.st_size;
    int32_t hdr[7];
    uint32_t magic = 0;
    if (size >= 4 && pread(fd, &magic, 4, 0) == 4 && magic == GGUF_MAGIC) {
        close(fd);
        return load_gguf(path, out);
    }
    if (size < HEADER_BYTES) {
        err = eng_seterr(-EINVAL, "%s: truncated: %" PRIu64 " bytes, the header alone needs %d",
                         path, size, HEADER_BYTES);
        goto fail_fd;
    }
    if (pread(fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr) {
        err = eng_seterr(-EIO, "%s: cannot read the header", path);
        goto fail_fd;
    }

    if ((uint32_t)hdr[0] == 0x616b3432u) { /* "ak42": llama2.c's version 1/2 export */
        err = eng_seterr(-EINVAL,
                         "%s: llama2.c version-1/2 export (magic ak42); only the legacy "
                         "(version 0) format is supported",
                         path);
        goto fail_fd;
    }
    eng_model_config c = {
        .dim = hdr[0],
        .hidden_dim = hdr[1],
        .n_layers = hdr[2],
        .n_heads = hdr[3],
        .n_kv_heads = hdr[4],
        .vocab_size = hdr[5],
        .seq_len = hdr[6],
    };
    /* A negative vocab_size means "unshared classifier follows" (llama2.c export). */
    c.shared_classifier = c.vocab_size > 0;
    if (c.vocab_size < 0) c.vocab_size = c.vocab_size == INT32_MIN ? 0 : -c.vocab_size;
    if ((err = config_check(&c, 0))) {
        eng_seterr(err, "%s: %s", path, eng_errmsg());
        goto fail_fd;
    }
    struct layout l = layout_of(&c);
    uint64_t want = HEADER_BYTES + l.total * 4;
    if (size != want) {
        err = eng_seterr(-EINVAL,
                         "%s: %s: file is %" PRIu64 " bytes, the header (dim=%d hidden_dim=%d "
                         "n_layers=%d n_heads=%d n_kv_heads=%d vocab_size=%d%s seq_len=%d) needs "
                         "exactly %" PRIu64 " bytes",
                         path, size < want ? "truncated" : "size mismatch", size, c.dim,
                         c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
                         c.shared_classifier ? " shared" : " unshared", c.seq_len, want);
        goto fail_fd;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        err = eng_seterr(-errno, "%s: mmap: %s", path, strerror(errno));
        goto fail_fd;
    }
    close(fd);
    eng_model *m = model_new();
    if (!m) {
        munmap(map, size);
        return eng_seterr(-ENOMEM, "out of memory");
    }
    m->cfg = c;
    hparams_llama2c(m);
    m->map = map;
    m->map_len = size;
    snprintf(m->path, sizeof m->path, "%s", path);
    point_weights(&c, (const float *)((const char *)map + HEADER_BYTES), &m->w);
    if ((err = build_tensors(m))) {
        eng_model_free(m);
        return err;
    }
    *out = m;
    return 0;
fail_fd:
    close(fd);
    return err;
}

int eng_model_load(const char *spec, eng_model **out)
{
    *out = NULL;
    if (!spec || !*spec) return eng_seterr(-EINVAL, "empty model spec");
    if (strncmp(spec, "synthetic:", 10) == 0) return load_synthetic(spec, out);
    return load_file(spec, out);
}

void eng_model_free(eng_model *m)
{
    if (!m) return;
    if (m->gguf)
        gguf_close(m->gguf); /* it owns the mapping */
    else if (m->map)
        munmap(m->map, m->map_len);
    free(m->owned);
    free(m->yarn_factors);
    free(m->layers);
    pthread_mutex_destroy(&m->hash_lock);
    free(m);
}

const eng_model_config *eng_model_cfg(const eng_model *m)
{
    return &m->cfg;
}
const eng_model_hparams *eng_model_hparams_of(const eng_model *m)
{
    return &m->hp;
}
const eng_weights *eng_model_weights(const eng_model *m)
{
    return &m->w;
}
bool eng_model_is_lazy(const eng_model *m)
{
    return m->lazy;
}
const eng_model_tensors *eng_model_tensors_of(const eng_model *m)
{
    return m->layers ? &m->t : NULL;
}
const char *eng_model_gguf_path(const eng_model *m)
{
    return m->gguf ? m->path : NULL;
}

bool eng_model_weights_copied(const eng_model *m)
{
    return m->gguf && gguf_weights_copied(m->gguf);
}

const char *eng_model_name(const eng_model *m)
{
    return m->name[0] ? m->name : NULL;
}

int eng_model_stop_tokens(const eng_model *m, int32_t *out, int max)
{
    if (!m->gguf) { /* run.c stops on BOS */
        if (max > 0) out[0] = 1;
        return 1;
    }
    for (int i = 0; i < m->n_stop && i < max; i++) out[i] = m->stop[i];
    return m->n_stop;
}

bool eng_model_synthetic_seed(const eng_model *m, uint64_t *seed)
{
    if (seed) *seed = m->synthetic ? m->seed : 0;
    return m->synthetic;
}

const char *eng_model_hash(const eng_model *m)
{
    eng_model *mm = (eng_model *)m; /* the cache is logically const */
    pthread_mutex_lock(&mm->hash_lock);
    if (!mm->hash[0] && mm->map) sha256_hex(mm->map, mm->map_len, mm->hash);
    pthread_mutex_unlock(&mm->hash_lock);
    return mm->hash;
}

/* ---- writer ------------------------------------------------------------------------- */

static int write_all(FILE *f, const void *p, size_t n, const char *path)
{
    if (n && fwrite(p, 1, n, f) != n)
        return eng_seterr(-EIO, "%s: write: %s", path, strerror(errno));
    return 0;
}

/* Writes one tensor: from memory when the model has it, else generated chunk by chunk
 * (a lazy synthetic model can be written without holding it). */
static int write_tensor(FILE *f, const eng_model *m, const float *src, int id, uint64_t n,
                        float *chunk, uint64_t chunk_floats, const char *path)
{
    for (uint64_t off = 0; off < n; off += chunk_floats) {
        uint64_t k = n - off < chunk_floats ? n - off : chunk_floats;
        const float *p = src ? src + off : chunk;
        if (!src) {
            if (id > 0)
                synth_fill(chunk, k, m->seed, &m->cfg, id, off);
            else /* -1: freq_cis real, -2: imag */
                freq_cis_fill(chunk, &m->cfg, id == -2, off, k);
        }
        int err = write_all(f, p, k * 4, path);
        if (err) return err;
    }
    return 0;
}

int eng_model_write(const eng_model *m, const char *path)
{
    const eng_model_config *c = &m->cfg;
    if (m->lazy && !m->synthetic) return eng_seterr(-EINVAL, "model has no weights to write");
    if (m->gguf)
        return eng_seterr(-ENOTSUP, "%s: a GGUF model cannot be written as a llama2.c checkpoint",
                          m->path);
    FILE *f = fopen(path, "wb");
    if (!f) return eng_seterr(-errno, "%s: %s", path, strerror(errno));
    const uint64_t chunk_floats = 1 << 20;
    float *chunk = malloc(chunk_floats * sizeof(float));
    int err = 0;
    if (!chunk) {
        err = eng_seterr(-ENOMEM, "out of memory");
        goto out;
    }
    int32_t hdr[7] = {c->dim,        c->hidden_dim,
                      c->n_layers,   c->n_heads,
                      c->n_kv_heads, c->shared_classifier ? c->vocab_size : -c->vocab_size,
                      c->seq_len};
    if ((err = write_all(f, hdr, sizeof hdr, path))) goto out;
    struct layout l = layout_of(c);
    const eng_weights *w = &m->w;
    bool have = !m->lazy;
    /* The legacy RoPE tables sit right after rms_final, in a mapped file as in owned
     * weights (the same layout); a lazy model regenerates them. */
    const float *fc = have ? w->rms_final + l.rms_final : NULL;
    struct {
        const float *p;
        int id;
        uint64_t n;
    } t[] = {
        {have ? w->token_embedding : NULL, ENG_T_EMBED, l.embed},
        {have ? w->rms_att : NULL, ENG_T_RMS_ATT, l.rms_att},
        {have ? w->wq : NULL, ENG_T_WQ, l.wq},
        {have ? w->wk : NULL, ENG_T_WK, l.wk},
        {have ? w->wv : NULL, ENG_T_WV, l.wv},
        {have ? w->wo : NULL, ENG_T_WO, l.wo},
        {have ? w->rms_ffn : NULL, ENG_T_RMS_FFN, l.rms_ffn},
        {have ? w->w1 : NULL, ENG_T_W1, l.w1},
        {have ? w->w2 : NULL, ENG_T_W2, l.w2},
        {have ? w->w3 : NULL, ENG_T_W3, l.w3},
        {have ? w->rms_final : NULL, ENG_T_RMS_FINAL, l.rms_final},
        {fc, -1, l.freq_cis / 2},
        {fc ? fc + l.freq_cis / 2 : NULL, -2, l.freq_cis / 2},
        {have ? w->wcls : NULL, ENG_T_WCLS, l.wcls},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if ((err = write_tensor(f, m, t[i].p, t[i].id, t[i].n, chunk, chunk_floats, path)))
            goto out;
out:
    free(chunk);
    if (fclose(f) != 0 && !err) err = eng_seterr(-EIO, "%s: close: %s", path, strerror(errno));
    if (err) unlink(path);
    return err;
}
