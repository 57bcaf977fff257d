/* SPDX-License-Identifier: MIT */
/*
 * tests/test_cuda_gguf.c — GGUF models on the CUDA backend. Without a device (these run
 * everywhere): the host side of the upload (kernels/devload.h) — each file type's conversion
 * to bf16 equals the CPU backend's dequantization rounded to the nearest bf16 (an independent
 * rounding here), F16/BF16 rows are copied byte for byte, the device type chosen per file
 * (F16 files stay F16, the rest become BF16), what the kernels cannot run is refused with a
 * message naming the tensor or field (through eng_create too, with or without a GPU), and
 * the RoPE table is the CPU's. With a device (else they skip): GGUF files written by
 * ringlm-mkmodel's exporter give the CPU backend's greedy tokens and logits within the
 * stated tolerance (perf/gpu_parity.h, the code perf/gpu_bench runs on the H200).
 */
#include "gguf_test_util.h"
#include "kernels/cpu/quant.h"
#include "kernels/devload.h"
#include "model/gguf.h"
#include "perf/gpu_parity.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>
#include "tests/helpers.h"

static const int all_types[] = {ENG_W_F32,  ENG_W_F16,  ENG_W_BF16,
                                ENG_W_Q8_0, ENG_W_Q4_K, ENG_W_Q6_K};

/* The nearest bf16 to f (ties to the even one), found by comparing the two neighbours in
 * double: written apart from q_f32_to_bf16's bit trick on purpose. */
static uint16_t ref_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t lo = x & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, 4);
    memcpy(&fhi, &hi, 4);
    double dl = fabs((double)f - flo), dh = fabs((double)fhi - f);
    if (dl < dh || (dl == dh && !((lo >> 16) & 1))) return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

/* rows x k floats, varied in magnitude per row, quantized into type. */
static void *make_matrix(int type, int rows, int k, float *orig)
{
    uint64_t s = 12345;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < k; i++) {
            s = eng_splitmix64(s);
            orig[(size_t)r * k + i] = ((float)(s >> 40) / 16777216.0f - 0.5f) * (r + 1) * 0.37f;
        }
    size_t rb = q_row_bytes(type, k);
    uint8_t *data = malloc(rb * (size_t)rows);
    cr_assert_not_null(data);
    for (int r = 0; r < rows; r++)
        cr_assert_eq(q_quantize_row(type, orig + (size_t)r * k, data + (size_t)r * rb, k), rb);
    return data;
}

Test(cuda_gguf, bf16_conversion_equals_cpu_dequantization_rounded)
{
    const int rows = 9, k = 512, row0 = 3, n = 5;
    float *orig = malloc((size_t)rows * k * sizeof(float)), *deq = malloc(k * sizeof(float));
    float *tmp = malloc(k * sizeof(float)), *f32 = malloc((size_t)n * k * sizeof(float));
    uint16_t *bf = malloc((size_t)n * k * 2);
    cr_assert(orig && deq && tmp && f32 && bf);
    for (size_t ti = 0; ti < sizeof all_types / sizeof all_types[0]; ti++) {
        const int type = all_types[ti];
        void *data = make_matrix(type, rows, k, orig);
        eng_wmat w = {data, type};
        cr_assert_eq(eng_dev_convert_rows(w, k, row0, n, ENG_W_BF16, bf, tmp), 0, "%s",
                     eng_errmsg());
        cr_assert_eq(eng_dev_convert_rows(w, k, row0, n, ENG_W_F32, f32, tmp), 0, "%s",
                     eng_errmsg());
        int bad = 0;
        double worst = 0;
        for (int r = 0; r < n; r++) {
            q_dequant_row(type, (const uint8_t *)data + (size_t)(row0 + r) * q_row_bytes(type, k),
                          deq, k);
            for (int i = 0; i < k; i++) {
                const size_t at = (size_t)r * k + i;
                if (bf[at] != ref_bf16(deq[i]) && bad++ < 3)
                    cr_log_error("%s row %d col %d: bf16 0x%04x, want 0x%04x (of %.9g)",
                                 eng_wtype_name(type), row0 + r, i, bf[at], ref_bf16(deq[i]),
                                 deq[i]);
                if (memcmp(&f32[at], &deq[i], 4) != 0 && bad++ < 3)
                    cr_log_error("%s row %d col %d: f32 %.9g, dequantized %.9g",
                                 eng_wtype_name(type), row0 + r, i, f32[at], deq[i]);
                /* and the bf16 value is the original within the type's error + bf16's */
                double o = orig[(size_t)(row0 + r) * k + i];
                double got = q_bf16_to_f32(bf[at]);
                double e = fabs(got - o) / (0.37 * (row0 + r + 1));
                if (e > worst) worst = e;
            }
        }
        cr_expect_eq(bad, 0, "%s: %d elements differ", eng_wtype_name(type), bad);
        /* Q4_K's 4 bits are the coarsest: steps of about 1/15 of a sub-block's range */
        cr_expect_lt(worst,
                     type == ENG_W_Q4_K   ? 0.07
                     : type == ENG_W_Q6_K ? 0.02
                                          : 0.01,
                     "%s: worst error %.4g of the row's scale", eng_wtype_name(type), worst);
        free(data);
    }
    free(orig);
    free(deq);
    free(tmp);
    free(f32);
    free(bf);
}

/* A conversion big enough to be split over threads gives the rows converted one by one. */
Test(cuda_gguf, threaded_conversion_equals_row_by_row)
{
    const int rows = 2304, k = 512; /* 1.2M elements: over the one-thread bound */
    float *orig = malloc((size_t)rows * k * sizeof(float)), tmp[512];
    uint16_t *all = malloc((size_t)rows * k * 2), *one = malloc((size_t)rows * k * 2);
    cr_assert(orig && all && one);
    const int types[3] = {ENG_W_Q6_K, ENG_W_Q8_0, ENG_W_F32};
    for (int ti = 0; ti < 3; ti++) {
        void *data = make_matrix(types[ti], rows, k, orig);
        eng_wmat w = {data, types[ti]};
        cr_assert_eq(eng_dev_convert_rows(w, k, 0, rows, ENG_W_BF16, all, tmp), 0);
        for (int r = 0; r < rows; r++)
            cr_assert_eq(eng_dev_convert_rows(w, k, r, 1, ENG_W_BF16, one + (size_t)r * k, tmp), 0);
        cr_expect_eq(memcmp(all, one, (size_t)rows * k * 2), 0, "%s", eng_wtype_name(types[ti]));
        free(data);
    }
    free(orig);
    free(all);
    free(one);
}

Test(cuda_gguf, f16_and_bf16_rows_are_uploaded_as_they_are)
{
    const int rows = 4, k = 64;
    float orig[4 * 64], tmp[64];
    uint16_t out[2 * 64];
    const int types[2] = {ENG_W_F16, ENG_W_BF16};
    for (int ti = 0; ti < 2; ti++) {
        uint16_t *data = make_matrix(types[ti], rows, k, orig);
        cr_assert_eq(
            eng_dev_convert_rows((eng_wmat){data, types[ti]}, k, 2, 2, types[ti], out, tmp), 0);
        cr_expect_eq(memcmp(out, data + 2 * k, sizeof out), 0, "%s rows are copied",
                     eng_wtype_name(types[ti]));
        free(data);
    }
    /* F16 to bf16 (an F16 matrix in a file of mixed types) goes through float: exact then
     * rounded */
    uint16_t *h = make_matrix(ENG_W_F16, rows, k, orig);
    cr_assert_eq(eng_dev_convert_rows((eng_wmat){h, ENG_W_F16}, k, 0, 2, ENG_W_BF16, out, tmp), 0);
    for (int i = 0; i < 2 * k; i++)
        cr_assert_eq(out[i], ref_bf16(q_f16_to_f32(h[i])), "element %d", i);
    free(h);
}

Test(cuda_gguf, conversion_refuses_what_it_cannot_convert)
{
    float tmp[256];
    uint16_t out[256];
    uint8_t blob[1024] = {0};
    cr_expect_eq(
        eng_dev_convert_rows((eng_wmat){blob, 16 /* IQ2_XXS */}, 256, 0, 1, ENG_W_BF16, out, tmp),
        -EINVAL);
    cr_expect(strstr(eng_errmsg(), "IQ2_XXS") != NULL, "names the type: %s", eng_errmsg());
    cr_expect_eq(
        eng_dev_convert_rows((eng_wmat){blob, ENG_W_Q4_K}, 100, 0, 1, ENG_W_BF16, out, tmp),
        -EINVAL, "100 is not a whole number of 256-blocks");
    cr_expect_eq(eng_dev_convert_rows((eng_wmat){blob, ENG_W_F32}, 8, 0, 1, ENG_W_Q8_0, out, tmp),
                 -EINVAL, "the device types are F32, F16 and BF16");
    cr_expect(strstr(eng_errmsg(), "Q8_0") != NULL, "%s", eng_errmsg());
}

/* ---- the plan of real files ------------------------------------------------------------- */

static eng_model *load(const char *path)
{
    eng_model *m = NULL;
    cr_assert_eq(eng_model_load(path, &m), 0, "%s", eng_errmsg());
    return m;
}

static void plan_of(const char *spec, const char *type, const char *arch, bool fp32,
                    eng_dev_plan *p, eng_model_config *cfg)
{
    char path[512];
    snprintf(path, sizeof path, "%s/m-%s-%s.gguf", tmpdir, type, arch ? arch : "llama");
    export_gguf(spec, NULL, type, arch, path);
    eng_model *m = load(path);
    cr_assert_eq(eng_dev_plan_model(m, fp32, p), 0, "%s %s: %s", spec, type, eng_errmsg());
    *cfg = *eng_model_cfg(m);
    cr_log_info("%s %s%s: %s", spec, type, fp32 ? " (fp32)" : "", p->summary);
    eng_model_free(m);
}

static uint64_t n_weights(const eng_model_config *c)
{
    const uint64_t d = c->dim, kv = d * c->n_kv_heads / c->n_heads, h = c->hidden_dim;
    return (uint64_t)c->vocab_size * d * (c->shared_classifier ? 1 : 2) +
           (uint64_t)c->n_layers * (d * (d + 2 * kv) + d * d + 3 * h * d);
}

Test(cuda_gguf, device_type_follows_the_file, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    eng_dev_plan p;
    eng_model_config c;
    /* quant-test: rows of whole 256-blocks, so every type applies to every matrix */
    plan_of("synthetic:quant-test:3", "F16", NULL, false, &p, &c);
    cr_expect_eq(p.dtype, ENG_W_F16, "an all-F16 file stays F16: %s", p.summary);
    cr_expect(strstr(p.summary, "uploaded as they are") != NULL, "%s", p.summary);
    cr_expect_eq(p.weight_bytes, n_weights(&c) * 2);
    cr_expect_not(p.qkv_bias);
    plan_of("synthetic:quant-test:3", "BF16", NULL, false, &p, &c);
    cr_expect_eq(p.dtype, ENG_W_BF16, "%s", p.summary);
    cr_expect(strstr(p.summary, "uploaded as they are") != NULL, "%s", p.summary);
    const char *to_bf16[] = {"F32", "Q8_0", "Q4_K", "Q6_K", "Q4_K_M"};
    for (size_t i = 0; i < sizeof to_bf16 / sizeof to_bf16[0]; i++) {
        plan_of("synthetic:quant-test:3", to_bf16[i], NULL, false, &p, &c);
        cr_expect_eq(p.dtype, ENG_W_BF16, "%s becomes BF16: %s", to_bf16[i], p.summary);
        cr_expect(strstr(p.summary, "converted on the host") != NULL, "%s", p.summary);
        cr_expect_eq(p.weight_bytes, n_weights(&c) * 2);
    }
    cr_expect_gt(p.n_mats[ENG_W_Q4_K], 0, "Q4_K_M holds Q4_K matrices");
    cr_expect_gt(p.n_mats[ENG_W_Q6_K], 0, "... and Q6_K ones");
    plan_of("synthetic:quant-test:3", "F16", NULL, true, &p, &c);
    cr_expect_eq(p.dtype, ENG_W_F32, "the fp32 diagnostic mode");
    cr_expect_eq(p.weight_bytes, n_weights(&c) * 4);
    plan_of("synthetic:gqa-test:3", "Q8_0", "qwen2", false, &p, &c);
    cr_expect(p.qkv_bias, "qwen2 files carry Q/K/V biases");
    cr_expect_lt(c.n_kv_heads, c.n_heads, "gqa-test is grouped-query");
    cr_expect_not(c.shared_classifier, "gqa-test has its own output.weight");
    /* llama2.c checkpoints and presets (float32) and lazy models */
    eng_model *m = load("synthetic:gqa-test:3");
    cr_assert_eq(eng_dev_plan_model(m, false, &p), 0);
    cr_expect_eq(p.dtype, ENG_W_BF16);
    cr_expect_eq(p.n_mats[ENG_W_F32], 2 + 7 * eng_model_cfg(m)->n_layers);
    eng_model_free(m);
    m = load("synthetic:lazy:llama3-8b:1");
    cr_assert_eq(eng_dev_plan_model(m, false, &p), 0);
    cr_expect(p.lazy);
    cr_expect_eq(p.weight_bytes, n_weights(eng_model_cfg(m)) * 2, "16 GB of bf16");
    eng_model_free(m);
}

/* ---- refusals ------------------------------------------------------------------------- */

typedef struct fake {
    eng_model_config c;
    eng_model_hparams hp;
    eng_layer_weights layers[2];
    eng_model_tensors t;
    float norm[64];
    float bias[64];
    uint8_t blob[1 << 16];
} fake;

/* A consistent little model (dim 64, 4 heads of 16, 2 KV heads) that each test then spoils
 * in one way. */
static void fake_init(fake *f)
{
    memset(f, 0, sizeof *f);
    f->c = (eng_model_config){.dim = 64,
                              .hidden_dim = 64,
                              .n_layers = 2,
                              .n_heads = 4,
                              .n_kv_heads = 2,
                              .vocab_size = 32,
                              .seq_len = 64,
                              .shared_classifier = true};
    f->hp = (eng_model_hparams){.norm_eps = 1e-6f,
                                .rope_theta = 1e6f,
                                .rope_dim = 16,
                                .rope_neox = true,
                                .weight_type = ENG_W_Q8_0};
    for (int l = 0; l < 2; l++) {
        eng_layer_weights *lw = &f->layers[l];
        eng_wmat w = {f->blob, ENG_W_Q8_0};
        lw->wq = lw->wk = lw->wv = lw->wo = lw->w1 = lw->w2 = lw->w3 = w;
        lw->rms_att = lw->rms_ffn = f->norm;
    }
    f->t = (eng_model_tensors){.token_embedding = {f->blob, ENG_W_Q8_0},
                               .layers = f->layers,
                               .rms_final = f->norm,
                               .wcls = {f->blob, ENG_W_Q8_0}};
}

/* fake_init, then an attention shape: the width, query heads and KV heads. */
static void fake_shape(fake *f, int dim, int n_heads, int n_kv_heads)
{
    fake_init(f);
    f->c.dim = dim;
    f->c.n_heads = n_heads;
    f->c.n_kv_heads = n_kv_heads;
}

static int fake_plan(fake *f, eng_dev_plan *p)
{
    return eng_dev_plan_make(&f->c, &f->hp, &f->t, false, p);
}

#define EXPECT_REFUSED(f, want_err, ...)                                                           \
    do {                                                                                           \
        eng_dev_plan p_;                                                                           \
        int e_ = fake_plan(f, &p_);                                                                \
        cr_expect_eq(e_, want_err, "refused: %d %s", e_, eng_errmsg());                            \
        const char *needles_[] = {__VA_ARGS__};                                                    \
        for (size_t i_ = 0; i_ < sizeof needles_ / sizeof needles_[0]; i_++)                       \
            cr_expect(strstr(eng_errmsg(), needles_[i_]) != NULL, "\"%s\" names \"%s\"",           \
                      eng_errmsg(), needles_[i_]);                                                 \
    } while (0)

Test(cuda_gguf, what_the_kernels_cannot_run_is_refused_by_name)
{
    fake *f = malloc(sizeof *f);
    cr_assert_not_null(f);
    eng_dev_plan p;
    fake_init(f);
    cr_assert_eq(fake_plan(f, &p), 0, "the unspoilt model passes: %s", eng_errmsg());
    cr_expect_eq(p.dtype, ENG_W_BF16);

    fake_init(f);
    f->layers[1].w3.type = 19; /* IQ1_S */
    EXPECT_REFUSED(f, -ENOTSUP, "blk.1.ffn_up.weight", "IQ1_S", "Q4_K");
    fake_init(f);
    f->t.wcls.type = 16; /* IQ2_XXS, in a file with its own classifier */
    f->c.shared_classifier = false;
    EXPECT_REFUSED(f, -ENOTSUP, "output.weight", "IQ2_XXS");
    fake_init(f);
    f->t.token_embedding.type = ENG_W_Q4_K; /* rows of 64: not whole 256-blocks */
    EXPECT_REFUSED(f, -EINVAL, "token_embd.weight", "Q4_K", "256");
    fake_shape(f, 1024, 2, 1);
    EXPECT_REFUSED(f, -ENOTSUP, "head_size=512", "256");
    fake_shape(f, 128, 64, 1);
    f->hp.rope_dim = 2;
    EXPECT_REFUSED(f, -ENOTSUP, "64 query heads per KV head", "32");
    fake_init(f);
    f->hp.rope_dim = 18;
    EXPECT_REFUSED(f, -ENOTSUP, "rope_dim=18", "16");
    fake_init(f);
    f->layers[0].bq = f->layers[0].bv = f->bias;
    EXPECT_REFUSED(f, -ENOTSUP, "blk.0", "attn_k.bias absent");
    fake_init(f);
    f->layers[1].rms_ffn = NULL;
    EXPECT_REFUSED(f, -EINVAL, "blk.1.ffn_norm.weight");
    fake_init(f);
    f->hp.norm_eps = 0.0f;
    EXPECT_REFUSED(f, -EINVAL, "norm_eps");
    fake_init(f);
    f->hp.arch = ENG_ARCH_QWEN3; /* the CPU backend runs it; the CUDA kernels do not */
    EXPECT_REFUSED(f, -ENOTSUP, "architecture qwen3", "backend cpu");
    fake_init(f);
    f->hp.head_dim = 2 * f->c.dim / f->c.n_heads;
    EXPECT_REFUSED(f, -ENOTSUP, "attention.key_length", "backend cpu");

    /* biases all three: accepted */
    fake_init(f);
    for (int l = 0; l < 2; l++) f->layers[l].bq = f->layers[l].bk = f->layers[l].bv = f->bias;
    cr_expect_eq(fake_plan(f, &p), 0, "%s", eng_errmsg());
    cr_expect(p.qkv_bias);
    free(f);
}

/* A llama2.c checkpoint with 512-wide heads (dim 512, one head): eng_create refuses it for
 * "cuda" by name whether or not a GPU or the plugin is there. */
Test(cuda_gguf, eng_create_refuses_before_looking_for_a_device, .init = mk_tmpdir,
     .fini = rm_tmpdir)
{
    const int32_t hdr[7] = {512, 8, 1, 1, 1, 8, 4}; /* dim hidden layers heads kv vocab seq */
    const size_t floats = 8 * 512 + 512 + 4 * 512 * 512 + 512 + 3 * 8 * 512 + 512 + 2 * 4 * 256;
    char path[512];
    snprintf(path, sizeof path, "%s/wide.bin", tmpdir);
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp);
    cr_assert_eq(fwrite(hdr, sizeof hdr, 1, fp), 1);
    float *w = calloc(floats, sizeof(float));
    cr_assert_not_null(w);
    for (size_t i = 0; i < floats; i++) w[i] = 0.01f;
    cr_assert_eq(fwrite(w, sizeof(float), floats, fp), floats);
    free(w);
    cr_assert_eq(fclose(fp), 0);
    eng_model *m = load(path);
    eng *e;
    cr_expect_eq(gp_engine_create(m, "cuda", 4, 16, &e), -ENOTSUP);
    cr_expect(strstr(eng_errmsg(), "head_size=512") != NULL, "%s", eng_errmsg());
    cr_expect_null(e);
    /* the CPU backend runs it */
    cr_expect_eq(gp_engine_create(m, "cpu", 4, 16, &e), 0, "%s", eng_errmsg());
    eng_destroy(e);
    eng_model_free(m);
}

Test(cuda_gguf, eng_create_takes_gguf_files, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/q.gguf", tmpdir);
    export_gguf("synthetic:gqa-test:2", NULL, "Q8_0", "qwen2", path);
    eng_model *m = load(path);
    eng *e;
    int err = gp_engine_create(m, "cuda", 8, 16, &e);
    if (err == 0) {
        cr_expect_str_eq(eng_backend_name(e), "cuda");
        eng_destroy(e);
    } else {
        /* no GPU or no plugin here: the only acceptable refusal */
        cr_expect_eq(err, -ENODEV, "%d %s", err, eng_errmsg());
        cr_expect(strstr(eng_errmsg(), "GGUF") == NULL, "not refused for being GGUF: %s",
                  eng_errmsg());
        cr_log_info("eng_create(cuda, GGUF): %s", eng_errmsg());
    }
    eng_model_free(m);
}

Test(cuda_gguf, rope_table_is_the_cpu_formula)
{
    eng_model_hparams hp = {.norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_dim = 48};
    float f[64], ff[64];
    eng_dev_rope_freqs(&hp, NULL, f);
    for (int j = 0; j < 24; j++)
        cr_expect_float_eq(f[j], (float)pow(10000.0, -2.0 * j / 48), 2e-6f * f[j] + 1e-12f,
                           "pair %d: %.9g", j, f[j]);
    cr_expect_eq(f[0], 1.0f);
    /* Llama 3.1's factors divide the frequencies (500000 base, 128-dim heads) */
    hp.rope_theta = 500000.0f;
    hp.rope_dim = 128;
    for (int j = 0; j < 64; j++)
        ff[j] = j < 16 ? 1.0f : j < 48 ? 1.0f + (float)(j - 16) / 4.0f : 8.0f;
    float plain[64];
    eng_dev_rope_freqs(&hp, NULL, plain);
    eng_dev_rope_freqs(&hp, ff, f);
    for (int j = 0; j < 64; j++) {
        cr_expect_float_eq(plain[j], (float)pow(500000.0, -2.0 * j / 128), 2e-6f * plain[j],
                           "pair %d", j);
        cr_expect_eq(f[j], plain[j] / ff[j], "pair %d: divided by its factor", j);
    }
}

/* ---- with a device ---------------------------------------------------------------------- */

static eng *cuda_or_skip(const eng_model *m)
{
    eng *e;
    int err = gp_engine_create(m, "cuda", 160, 16, &e);
    if (err == -ENODEV) cr_skip_test("no CUDA device or plugin: %s", eng_errmsg());
    cr_assert_eq(err, 0, "eng_create(cuda): %d %s", err, eng_errmsg());
    return e;
}

static void expect(const gp_result *r)
{
    cr_log_info("%s: %s (value %.4g)", r->name, r->detail, r->value);
    cr_expect_eq(r->pass, 1, "%s failed: %s (value %.6g)", r->name, r->detail, r->value);
}

/* CUDA against the CPU on one GGUF file: greedy tokens, logits, invariances. */
static void gguf_parity(const char *path)
{
    eng_model *m = load(path);
    eng *gpu = cuda_or_skip(m);
    eng *cpu = gp_engine(m, "cpu", 160, 16);
    cr_assert_not_null(cpu, "CPU engine: %s", eng_errmsg());
    gp_result r, inv[4];
    gp_check_greedy_match(cpu, gpu, m, 64, &r);
    expect(&r);
    gp_check_cpu_parity_tol(cpu, gpu, m, gp_gguf_tol(eng_model_hparams_of(m)->weight_type), &r);
    expect(&r);
    gp_check_invariance(gpu, m, inv);
    for (int i = 0; i < 4; i++) expect(&inv[i]);
    eng_destroy(cpu);
    eng_destroy(gpu);
    eng_model_free(m);
}

static void stories260k(const char *type)
{
    char mp[1024], tp[1024], path[512];
    snprintf(mp, sizeof mp, "%s/models/stories260K.bin", th_shared_dir());
    snprintf(tp, sizeof tp, "%s/models/tok512.bin", th_shared_dir());
    if (access(mp, R_OK) || access(tp, R_OK))
        cr_skip_test("stories260K.bin / tok512.bin not under $RINGLM_SHARED/models");
    snprintf(path, sizeof path, "%s/s260k-%s.gguf", tmpdir, type);
    export_gguf(mp, tp, type, NULL, path);
    gguf_parity(path);
}

Test(cuda_gguf, stories260k_f16, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    stories260k("F16");
}
Test(cuda_gguf, stories260k_bf16, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    stories260k("BF16");
}
Test(cuda_gguf, stories260k_q8_0, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    stories260k("Q8_0");
}
Test(cuda_gguf, stories260k_q4_k_m, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    stories260k("Q4_K_M");
}

/* Overwrites the value of a 4-byte metadata key of a GGUF file in place (the exporter
 * writes llama2.c's epsilon, base and full-head RoPE; real files have others). */
static void patch_meta(const char *path, const char *key, const void *val4)
{
    FILE *fp = fopen(path, "r+b");
    cr_assert_not_null(fp);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, fp);
    const size_t kl = strlen(key);
    char *at = NULL;
    for (size_t i = 8; i + kl + 8 <= n && !at; i++)
        if (memcmp(buf + i, key, kl) == 0 && memcmp(buf + i - 8, &(uint64_t){kl}, 8) == 0)
            at = buf + i + kl + 4; /* past the u32 value type */
    cr_assert_not_null(at, "%s: key %s not in the first 64 KiB", path, key);
    cr_assert_eq(fseek(fp, at - buf, SEEK_SET), 0);
    cr_assert_eq(fwrite(val4, 4, 1, fp), 1);
    cr_assert_eq(fclose(fp), 0);
}

/* qwen2 (NEOX RoPE, Q/K/V biases) with GQA, real Q4_K/Q6_K rows, and the hyperparameters
 * patched to Qwen2's epsilon 1e-6 and base 1e6 with RoPE on half of each 64-wide head */
Test(cuda_gguf, quant_test_qwen2_q4_k_m, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    char path[512];
    snprintf(path, sizeof path, "%s/qt.gguf", tmpdir);
    export_gguf("synthetic:quant-test:4", NULL, "Q4_K_M", "qwen2", path);
    const float eps = 1e-6f, base = 1e6f;
    const uint32_t rope_dim = 32;
    patch_meta(path, "qwen2.attention.layer_norm_rms_epsilon", &eps);
    patch_meta(path, "qwen2.rope.freq_base", &base);
    patch_meta(path, "qwen2.rope.dimension_count", &rope_dim);
    eng_model *m = load(path);
    const eng_model_hparams *hp = eng_model_hparams_of(m);
    cr_assert(hp->norm_eps == eps && hp->rope_theta == base && hp->rope_dim == 32 && hp->rope_neox,
              "the patched file reads back");
    eng_model_free(m);
    gguf_parity(path);
}

/* Copies the GGUF file src to dst with the tensor rope_freqs.weight (F32, n values) added:
 * Llama 3.1's RoPE scaling, which the exporter does not write. Metadata of the types the
 * exporter writes (u32, i32, f32, bool, string; arrays of strings, f32, i32). */
static void add_rope_freqs(const char *src, const char *dst, const float *ff, int n)
{
    gguf_file *g = NULL;
    cr_assert_eq(gguf_open(src, &g), 0, "%s", gguf_errmsg());
    gguf_writer *w = gw_new();
    for (int i = 0; i < gguf_n_kv(g); i++) {
        const gguf_kv *kv = gguf_kv_at(g, i);
        uint32_t u;
        float f;
        switch (kv->type) {
        case GGUF_V_U32:
            memcpy(&u, kv->value, 4);
            gw_u32(w, kv->key, u);
            break;
        case GGUF_V_I32:
            memcpy(&u, kv->value, 4);
            gw_i32(w, kv->key, (int32_t)u);
            break;
        case GGUF_V_F32:
            memcpy(&f, kv->value, 4);
            gw_f32(w, kv->key, f);
            break;
        case GGUF_V_BOOL: gw_bool(w, kv->key, kv->value[0] != 0); break;
        case GGUF_V_STRING: {
            char *str = strndup((const char *)kv->value, kv->count);
            gw_str(w, kv->key, str);
            free(str);
            break;
        }
        case GGUF_V_ARRAY: {
            const size_t cnt = kv->count;
            if (kv->elem_type == GGUF_V_STRING) {
                const char **ss = malloc(cnt * sizeof *ss);
                size_t *ls = malloc(cnt * sizeof *ls);
                const void *p = kv->value;
                for (size_t j = 0; j < cnt; j++) gguf_str_next(&p, &ss[j], &ls[j]);
                gw_str_arr(w, kv->key, ss, ls, cnt);
                free(ss);
                free(ls);
            } else if (kv->elem_type == GGUF_V_F32 || kv->elem_type == GGUF_V_I32) {
                void *v = malloc(cnt * 4);
                memcpy(v, kv->value, cnt * 4);
                if (kv->elem_type == GGUF_V_F32)
                    gw_f32_arr(w, kv->key, v, cnt);
                else
                    gw_i32_arr(w, kv->key, v, cnt);
                free(v);
            } else {
                cr_assert_fail("%s: array of %s not copied", kv->key,
                               gguf_vtype_name(kv->elem_type));
            }
            break;
        }
        default: cr_assert_fail("%s: %s not copied", kv->key, gguf_vtype_name(kv->type));
        }
    }
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        void *copy = malloc(t->bytes);
        cr_assert_not_null(copy);
        memcpy(copy, t->data, t->bytes);
        gw_tensor(w, t->name, (int)t->n_dims, t->ne, (int)t->type, copy, t->bytes);
    }
    float *fc = malloc((size_t)n * sizeof *fc);
    memcpy(fc, ff, (size_t)n * sizeof *fc);
    gw_tensor(w, "rope_freqs.weight", 1, (const uint64_t[]){(uint64_t)n}, 0 /* F32 */, fc,
              (size_t)n * sizeof *fc);
    cr_assert_eq(gw_write(w, dst), 0, "%s", gw_errmsg());
    gw_free(w);
    gguf_close(g);
}

/* Llama 3.1's RoPE scaling (rope_freqs.weight): the low frequencies divided by up to 8. The
 * CPU itself must compute something else with the factors than without (so the check below
 * has teeth), and CUDA must match the CPU on the file that has them. */
Test(cuda_gguf, llama31_rope_factors, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    char plain[512], scaled[512];
    snprintf(plain, sizeof plain, "%s/plain.gguf", tmpdir);
    snprintf(scaled, sizeof scaled, "%s/scaled.gguf", tmpdir);
    export_gguf("synthetic:quant-test:5", NULL, "Q8_0", NULL, plain);
    float ff[32]; /* quant-test: 64-wide heads */
    for (int j = 0; j < 32; j++)
        ff[j] = j < 8 ? 1.0f : j < 24 ? 1.0f + 7.0f * (float)(j - 8) / 16.0f : 8.0f;
    add_rope_freqs(plain, scaled, ff, 32);
    eng_model *mp = load(plain), *ms = load(scaled);
    cr_assert_not_null(eng_model_tensors_of(ms)->rope_freq_factors, "the factors are read");
    eng *a = gp_engine(mp, "cpu", 160, 16), *b = gp_engine(ms, "cpu", 160, 16);
    cr_assert(a && b, "%s", eng_errmsg());
    gp_result r;
    gp_check_cpu_parity(a, b, ms, &r); /* the CPU with and without the factors */
    cr_log_info("CPU with vs without factors: %s", r.detail);
    cr_expect_gt(r.value, 1e-3, "the factors change the CPU's logits: %s", r.detail);
    eng_destroy(a);
    eng_destroy(b);
    eng_model_free(mp);
    eng_model_free(ms);
    gguf_parity(scaled);
}

/* GQA with a separate classifier, all F16: the F16 device path */
Test(cuda_gguf, gqa_test_f16, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    char path[512];
    snprintf(path, sizeof path, "%s/gqa.gguf", tmpdir);
    export_gguf("synthetic:gqa-test:4", NULL, "F16", NULL, path);
    gguf_parity(path);
}
