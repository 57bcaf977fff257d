/* SPDX-License-Identifier: MIT */
/*
 * Re-quantization under an importance matrix (ringlm-mkmodel --imatrix FILE: model/imatrix.c,
 * kernels/gguf_requant.c, the weighted searches of kernels/cpu/quant_search.c).
 *
 * Oracles, both from node-llama-cpp's prebuilt library (the llama.cpp it runs): ggml's
 * quantize_* of every type that reads quant_weights (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0, Q4_1,
 * Q5_0, Q5_1, IQ4_NL, IQ4_XS) write the bytes ringlm writes for the same rows and weights;
 * and llama.cpp's quantizer (llama_model_quantize, the call llama-quantize --imatrix makes,
 * fed the weights llama-quantize derives from the file) writes the same file as
 * ringlm-mkmodel --imatrix under every mix of those types, from an imatrix in the GGUF form
 * and in the legacy .dat form, with the types llama.cpp chooses differently under an imatrix
 * (16 layers). An imatrix that does not fit the model is refused naming the entry.
 */
#include "engine_test_util.h"
#include "gguf_test_util.h"
#include "helpers.h"
#include "llama_lib_util.h"
#include "kernels/cpu/quant.h"
#include "kernels/gguf_requant.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/imatrix.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

static float uniform(void)
{
    return (float)(next_u32() % 100001) * 1e-5f;
}

/* ggml's quantize_* of every type that reads quant_weights (an importance matrix's row)
 * write ringlm's bytes: Gaussian rows at three scales, with an offset, with outliers, tiny
 * values; weights spread over four orders of magnitude, some zero. Without the weights the
 * bytes differ (else this could not fail). */
Test(gguf_imatrix, weighted_quantization_equals_ggml_byte_for_byte)
{
    void *lib = ggml_base_or_skip();
    const int k = 1024, rows = 24;
    float *x = malloc((size_t)k * sizeof *x), *qw = malloc((size_t)k * sizeof *qw);
    unsigned char *ours = malloc((size_t)k * 4), *theirs = malloc((size_t)k * 4),
                  *plain = malloc((size_t)k * 4);
    for (size_t t = 0; t < GGML_N_QUANTIZERS; t++) {
        const struct ggml_quantizer *q = &ggml_quantizers[t];
        if (!q->weighted) continue;
        const ggml_quantize_fn quant = ggml_quantizer_fn(lib, q);
        const size_t rb = q_row_bytes(q->type, k);
        rng = 0x9e3779b97f4a7c15ull;
        int differ = 0;
        for (int r = 0; r < rows; r++) {
            const float scale = r % 3 == 0 ? 0.02f : r % 3 == 1 ? 1.0f : 30.0f;
            for (int i = 0; i < k; i++) {
                float g = 0.0f;
                for (int u = 0; u < 4; u++) g += 2.0f * uniform() - 1.0f;
                x[i] = g * scale + (r % 4 == 1 ? 0.5f * scale : 0.0f);
                if (r % 5 == 2 && i % 97 == 0) x[i] *= 40.0f;
                if (r == 8) x[i] *= 1e-6f;
                qw[i] = powf(10.0f, 4.0f * uniform() - 2.0f);
                if (r % 7 == 3 && i % 13 == 0) qw[i] = 0.0f;
            }
            memset(ours, 0xa5, rb);
            memset(theirs, 0x5a, rb);
            cr_assert_eq(q_quantize_row_weighted(q->type, x, ours, k, qw), rb,
                         "%s: ringlm's row under the weights", q->fn);
            cr_assert_eq(quant(x, theirs, 1, k, qw), rb, "%s: row bytes", q->fn);
            for (size_t i = 0; i < rb; i++)
                cr_assert(ours[i] == theirs[i],
                          "%s row %d: byte %zu of %zu: ringlm 0x%02x, ggml 0x%02x", q->fn, r, i, rb,
                          ours[i], theirs[i]);
            q_quantize_row(q->type, x, plain, k);
            differ += memcmp(plain, ours, rb) != 0;
        }
        cr_assert_geq(differ, rows / 2, "%s: the weights change %d rows of %d", q->fn, differ,
                      rows);
    }
    free(x);
    free(qw);
    free(ours);
    free(theirs);
    free(plain);
    dlclose(lib);
}

/* ---- importance matrices as llama-imatrix writes them ------------------------------------ */

/* One entry per 2-D weight of the model file but token_embd (a lookup, not a product: the
 * collector sees no activations for it): column sums of squares over `calls` rows. */
typedef struct imx_case {
    char name[128][96];
    float *sums[128];
    int ne0[128], n;
    int calls;
} imx_case;

static void imx_case_make(const char *model, imx_case *c)
{
    gguf_file *g;
    cr_assert_eq(gguf_open(model, &g), 0, "%s", gguf_errmsg());
    memset(c, 0, sizeof *c);
    c->calls = 37;
    rng = 0x1234567887654321ull;
    for (int i = 0; i < gguf_n_tensors(g) && c->n < 128; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (t->n_dims != 2 || strcmp(t->name, "token_embd.weight") == 0) continue;
        snprintf(c->name[c->n], sizeof c->name[c->n], "%s", t->name);
        c->ne0[c->n] = (int)t->ne[0];
        c->sums[c->n] = malloc(t->ne[0] * sizeof(float));
        for (uint64_t k = 0; k < t->ne[0]; k++) /* a few hot columns, as real activations */
            c->sums[c->n][k] = (float)c->calls * (0.01f + uniform()) * (k % 31 == 5 ? 50.0f : 1.0f);
        c->n++;
    }
    gguf_close(g);
}

static void imx_case_free(imx_case *c)
{
    for (int i = 0; i < c->n; i++) free(c->sums[i]);
}

/* The GGUF form: <name>.in_sum2 and <name>.counts, and the metadata llama-quantize asks for. */
static void write_imatrix_gguf(const char *path, const imx_case *c, bool metadata)
{
    gguf_writer *w = gw_new();
    gw_str(w, "general.type", "imatrix");
    if (metadata) {
        const char *ds[1] = {"test.txt"};
        const size_t dl[1] = {8};
        gw_str_arr(w, "imatrix.datasets", ds, dl, 1);
        gw_u32(w, "imatrix.chunk_count", 4);
        gw_u32(w, "imatrix.chunk_size", 512);
    }
    for (int i = 0; i < c->n; i++) {
        char n[128];
        uint64_t ne[2] = {(uint64_t)c->ne0[i], 1};
        float *s = malloc((size_t)c->ne0[i] * sizeof *s), *cnt = malloc(sizeof *cnt);
        memcpy(s, c->sums[i], (size_t)c->ne0[i] * sizeof *s);
        *cnt = (float)c->calls;
        snprintf(n, sizeof n, "%s.in_sum2", c->name[i]);
        gw_tensor(w, n, 2, ne, GGUF_T_F32, s, (size_t)c->ne0[i] * sizeof *s);
        snprintf(n, sizeof n, "%s.counts", c->name[i]);
        uint64_t ne1[2] = {1, 1};
        gw_tensor(w, n, 2, ne1, GGUF_T_F32, cnt, sizeof *cnt);
    }
    cr_assert_eq(gw_write(w, path), 0, "%s", gw_errmsg());
    gw_free(w);
}

/* The legacy .dat: the same weights (sums / count) times ncall. */
static void write_imatrix_dat(const char *path, const imx_case *c)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    int32_t n = c->n;
    fwrite(&n, 4, 1, f);
    for (int i = 0; i < c->n; i++) {
        int32_t len = (int32_t)strlen(c->name[i]), ncall = c->calls, nval = c->ne0[i];
        fwrite(&len, 4, 1, f);
        fwrite(c->name[i], 1, (size_t)len, f);
        fwrite(&ncall, 4, 1, f);
        fwrite(&nval, 4, 1, f);
        fwrite(c->sums[i], 4, (size_t)nval, f);
    }
    int32_t chunks = 4, dlen = 8;
    fwrite(&chunks, 4, 1, f);
    fwrite(&dlen, 4, 1, f);
    fwrite("test.txt", 1, 8, f);
    cr_assert_eq(fclose(f), 0);
}

/* ---- llama.cpp's quantizer with an importance matrix ------------------------------------ */

/* llama_model_quantize(in, out, mix) with the weights llama-quantize's load_imatrix makes of
 * c's file (sums / count). */
static void llama_quantize(const llq *q, const char *in, const char *out, const char *mix,
                           const imx_case *c)
{
    llq_imatrix_data *im = calloc((size_t)c->n + 1, sizeof *im);
    float **w = calloc((size_t)c->n, sizeof *w);
    for (int i = 0; i < c->n; i++) {
        w[i] = malloc((size_t)c->ne0[i] * sizeof **w);
        const float count = (float)c->calls;
        for (int k = 0; k < c->ne0[i]; k++) w[i][k] = c->sums[i][k] / count;
        im[i] = (llq_imatrix_data){c->name[i], w[i], (size_t)c->ne0[i]};
    }
    cr_assert_geq(llq_ftype(mix), 0, "%s", mix);
    llq_run(q, in, out, llq_ftype(mix), im);
    for (int i = 0; i < c->n; i++) free(w[i]);
    free(w);
    free(im);
}

/* A test's files: the model in F32, its importance matrix in both forms (c), and where the
 * two quantizers write. */
typedef struct imx_files {
    char f32[512], gg[512], dat[512], theirs[512], ours[512], plain[512];
} imx_files;

static void imx_files_make(imx_files *p, const char *spec, imx_case *c)
{
    snprintf(p->f32, sizeof p->f32, "%s/f32.gguf", tmpdir);
    snprintf(p->gg, sizeof p->gg, "%s/imatrix.gguf", tmpdir);
    snprintf(p->dat, sizeof p->dat, "%s/imatrix.dat", tmpdir);
    snprintf(p->theirs, sizeof p->theirs, "%s/theirs.gguf", tmpdir);
    snprintf(p->ours, sizeof p->ours, "%s/ours.gguf", tmpdir);
    snprintf(p->plain, sizeof p->plain, "%s/plain.gguf", tmpdir);
    export_gguf(spec, NULL, "F32", "llama", p->f32);
    imx_case_make(p->f32, c);
    write_imatrix_gguf(p->gg, c, true);
    write_imatrix_dat(p->dat, c);
}

TestSuite(gguf_imatrix, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300);

/* ringlm-mkmodel --imatrix writes llama.cpp's file, from either form of the imatrix, under
 * every mix whose types read it (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
 * IQ4_XS) on quant-test (every matrix whole 256-blocks); and the weights change the file
 * (without them it differs). */
Test(gguf_imatrix, requantized_with_an_imatrix_equal_llama_quantize)
{
    char note[4096];
    llq q;
    llq_open(&q);
    static imx_case c;
    imx_files p;
    imx_files_make(&p, "synthetic:quant-test:17", &c);
    cr_assert_geq(c.n, 15, "entries for every matrix but the embedding");
    static const char *const mixes[] = {"Q4_K_M", "Q5_K_M", "Q6_K",   "Q2_K",   "Q3_K_S",
                                        "Q3_K_M", "Q3_K_L", "Q4_0",   "Q4_1",   "Q5_0",
                                        "Q5_1",   "IQ4_NL", "IQ4_XS", "Q4_K_S", "Q5_K_S"};
    int compared = 0;
    for (size_t x = 0; x < sizeof mixes / sizeof mixes[0]; x++) {
        const char *mix = mixes[x];
        llama_quantize(&q, p.f32, p.theirs, mix, &c);
        const char *forms[2] = {p.gg, p.dat};
        for (int f = 0; f < 2; f++) {
            cr_assert_eq(gw_requantize_imatrix(p.f32, p.ours, mix, forms[f], note, sizeof note), 0,
                         "%s", eng_errmsg());
            char what[96];
            snprintf(what, sizeof what, "%s, %s imatrix", mix, f ? "legacy" : "GGUF");
            compared += llq_assert_same_tensors(what, p.theirs, p.ours);
        }
        cr_assert_eq(gw_requantize(p.f32, p.plain, mix, note, sizeof note), 0, "%s", eng_errmsg());
        gguf_file *a, *b;
        cr_assert_eq(gguf_open(p.plain, &a), 0);
        cr_assert_eq(gguf_open(p.ours, &b), 0);
        const gguf_tensor *ta = gguf_tensor_find(a, "blk.0.attn_q.weight"),
                          *tb = gguf_tensor_find(b, "blk.0.attn_q.weight");
        cr_assert(ta && tb && memcmp(ta->data, tb->data, ta->bytes) != 0,
                  "%s: the importance matrix changes blk.0.attn_q.weight", mix);
        gguf_close(a);
        gguf_close(b);
    }
    cr_log_info("--imatrix: %d tensors written as llama.cpp's quantizer writes them", compared);

    /* the command line */
    char *mk = th_program("ringlm-mkmodel"), *so = NULL, *err = NULL;
    char *argv[] = {mk,       "--model",   p.f32, "--format", "gguf", "--type",
                    "IQ4_XS", "--imatrix", p.gg,  "--out",    p.ours, NULL};
    int rc = th_run(argv, &so, &err, 120);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(err, "with the importance matrix"), "%s", err);
    free(so);
    free(err);
    free(mk);
    imx_case_free(&c);
    dlclose(q.lib);
}

/* The mixes llama.cpp chooses differently under an importance matrix, on quant-gqa (16
 * layers, 4 query heads per KV head): every tensor's type and bytes equal llama.cpp's, and
 * the first eighth of ffn_down shows the rules that differ from the p.plain mix — IQ4_NL and
 * IQ4_XS keep their type there (Q5_K without an imatrix), Q4_0 and Q5_0 take Q4_1 and Q5_1. */
Test(gguf_imatrix, imatrix_mixes_on_sixteen_layers_equal_llama_quantize, .timeout = 600)
{
    char note[4096];
    llq q;
    llq_open(&q);
    static imx_case c;
    imx_files p;
    imx_files_make(&p, "synthetic:quant-gqa:19", &c);
    static const struct {
        const char *mix;
        int with, without; /* blk.0.ffn_down.weight's type with and without the imatrix */
    } differ[] = {{"IQ4_NL", Q_IQ4_NL, Q_Q5_K},
                  {"IQ4_XS", Q_IQ4_XS, Q_Q5_K},
                  {"Q4_0", Q_Q4_1, Q_Q4_0},
                  {"Q5_0", Q_Q5_1, Q_Q5_0}};
    /* those four, and the mixes whose layer-dependent rules need 16 layers (Q2_K_S: attn_v
     * Q4_K with 4 query heads per KV head, the first eighth of ffn_down Q4_K) */
    static const char *const mixes[] = {"IQ4_NL", "IQ4_XS", "Q4_0",   "Q5_0",
                                        "Q2_K",   "Q3_K_M", "Q4_K_M", "Q2_K_S"};
    int compared = 0;
    for (size_t x = 0; x < sizeof mixes / sizeof mixes[0]; x++) {
        const char *mix = mixes[x];
        llama_quantize(&q, p.f32, p.theirs, mix, &c);
        cr_assert_eq(gw_requantize_imatrix(p.f32, p.ours, mix, p.gg, note, sizeof note), 0, "%s",
                     eng_errmsg());
        char what[96];
        snprintf(what, sizeof what, "quant-gqa %s with an imatrix", mix);
        compared += llq_assert_same_tensors(what, p.theirs, p.ours);
        for (size_t d = 0; d < sizeof differ / sizeof differ[0]; d++) {
            if (strcmp(differ[d].mix, mix) != 0) continue;
            cr_assert_eq(gw_requantize(p.f32, p.plain, mix, note, sizeof note), 0, "%s",
                         eng_errmsg());
            const char *paths[2] = {p.ours, p.plain};
            const int want[2] = {differ[d].with, differ[d].without};
            for (int i = 0; i < 2; i++) {
                gguf_file *g;
                cr_assert_eq(gguf_open(paths[i], &g), 0, "%s", gguf_errmsg());
                const gguf_tensor *t = gguf_tensor_find(g, "blk.0.ffn_down.weight");
                cr_assert(
                    t && (int)t->type == want[i], "%s %s: blk.0.ffn_down.weight is %s, not %s", mix,
                    i ? "without an imatrix" : "with an imatrix",
                    t ? gguf_type_name(t->type) : "absent", gguf_type_name((uint32_t)want[i]));
                gguf_close(g);
            }
        }
    }
    cr_log_info("--imatrix on 16 layers: %d tensors typed and written as llama.cpp's", compared);
    imx_case_free(&c);
    dlclose(q.lib);
}

/* Q2_K_S without an importance matrix, or with one that leaves out a matrix the mix writes
 * in Q2_K, is refused naming the tensor and nothing is written, as llama.cpp's quantizer
 * refuses both; the embedding, which no imatrix covers, needs none. */
Test(gguf_imatrix, q2_k_s_needs_an_imatrix_as_llama_quantize_does)
{
    char note[4096];
    llq q;
    llq_open(&q);
    static imx_case c;
    imx_files p;
    imx_files_make(&p, "synthetic:quant-test:17", &c);
    llq_params lp = q.defaults();
    lp.ftype = llq_ftype("Q2_K_S");
    lp.nthread = 1;
    cr_assert_neq(q.quantize(p.f32, p.theirs, &lp), 0, "llama.cpp refuses Q2_K_S without one");
    cr_assert_lt(gw_requantize(p.f32, p.ours, "Q2_K_S", note, sizeof note), 0);
    cr_assert(strstr(eng_errmsg(), "--type Q2_K_S: tensor blk.0.attn_k.weight: its Q2_K needs "
                                   "an importance matrix"),
              "%s", eng_errmsg());
    cr_assert_neq(access(p.ours, F_OK), 0, "nothing written");

    /* an imatrix without blk.1.ffn_up.weight */
    int drop = -1;
    for (int i = 0; i < c.n; i++)
        if (strcmp(c.name[i], "blk.1.ffn_up.weight") == 0) drop = i;
    cr_assert_geq(drop, 0);
    if (drop != c.n - 1) { /* the last entry takes its place */
        memcpy(c.name[drop], c.name[c.n - 1], sizeof c.name[drop]);
        c.ne0[drop] = c.ne0[c.n - 1];
        float *sums = c.sums[drop];
        c.sums[drop] = c.sums[c.n - 1];
        c.sums[c.n - 1] = sums;
    }
    c.n--;
    write_imatrix_gguf(p.gg, &c, true);
    llq_imatrix_data *im = calloc((size_t)c.n + 1, sizeof *im);
    for (int i = 0; i < c.n; i++)
        im[i] = (llq_imatrix_data){c.name[i], c.sums[i], (size_t)c.ne0[i]};
    lp.imatrix = im;
    cr_assert_neq(q.quantize(p.f32, p.theirs, &lp), 0, "llama.cpp refuses the missing entry");
    free(im);
    cr_assert_lt(gw_requantize_imatrix(p.f32, p.ours, "Q2_K_S", p.gg, note, sizeof note), 0);
    cr_assert(strstr(eng_errmsg(), "tensor blk.1.ffn_up.weight: its Q2_K needs"), "%s",
              eng_errmsg());
    cr_assert_neq(access(p.ours, F_OK), 0, "nothing written");
    c.n++;
    imx_case_free(&c);
    dlclose(q.lib);
}

/* An imatrix that does not fit: refused naming the file and the entry, no file written. */
Test(gguf_imatrix, imatrices_that_do_not_fit_are_refused)
{
    char f32[512], gg[512], out[512], note[4096];
    snprintf(f32, sizeof f32, "%s/f32.gguf", tmpdir);
    snprintf(gg, sizeof gg, "%s/imatrix.gguf", tmpdir);
    snprintf(out, sizeof out, "%s/out.gguf", tmpdir);
    export_gguf("synthetic:quant-test:17", NULL, "F32", "llama", f32);
    static imx_case c;
    imx_case_make(f32, &c);

    snprintf(c.name[0], sizeof c.name[0], "blk.9.attn_q.weight"); /* no such layer */
    write_imatrix_gguf(gg, &c, true);
    cr_assert_lt(gw_requantize_imatrix(f32, out, "Q4_K_M", gg, note, sizeof note), 0);
    cr_assert(strstr(eng_errmsg(), "imatrix.gguf: entry blk.9.attn_q.weight: ") &&
                  strstr(eng_errmsg(), "has no such matrix"),
              "%s", eng_errmsg());
    cr_assert_neq(access(out, F_OK), 0, "nothing written");

    imx_case_free(&c);
    imx_case_make(f32, &c);
    c.ne0[1] = 128; /* half the columns */
    write_imatrix_gguf(gg, &c, true);
    cr_assert_lt(gw_requantize_imatrix(f32, out, "Q4_K_M", gg, note, sizeof note), 0);
    cr_assert(strstr(eng_errmsg(), ": 128 weights, the tensor has 256 columns x 1 matrices"), "%s",
              eng_errmsg());

    imx_case_free(&c);
    imx_case_make(f32, &c);
    write_imatrix_gguf(gg, &c, false);
    cr_assert_lt(gw_requantize_imatrix(f32, out, "Q4_K_M", gg, note, sizeof note), 0);
    cr_assert(strstr(eng_errmsg(), "imatrix.datasets absent"), "%s", eng_errmsg());

    write_imatrix_gguf(gg, &c, true);
    /* a truncated legacy file */
    char dat[512];
    snprintf(dat, sizeof dat, "%s/imatrix.dat", tmpdir);
    write_imatrix_dat(dat, &c);
    cr_assert_eq(truncate(dat, 300), 0);
    cr_assert_lt(gw_requantize_imatrix(f32, out, "Q4_K_M", dat, note, sizeof note), 0);
    cr_assert(strstr(eng_errmsg(), "imatrix.dat: entry ") && strstr(eng_errmsg(), "truncated"),
              "%s", eng_errmsg());
    cr_assert_neq(access(out, F_OK), 0, "nothing written");
    imx_case_free(&c);
}
