/* SPDX-License-Identifier: MIT */
/*
 * GGUF models: stories260K converted by ringlm-mkmodel's exporter to GGUF F32 gives
 * exactly run.c's greedy tokens (reference-greedy.json) and a synthetic model the very
 * logits it has in memory; F16/BF16/Q8_0 files stay within the stated logit tolerance; a
 * qwen2 file (NEOX RoPE, Q/K/V biases) computes what the equivalent llama file computes;
 * and every malformed or unsupported file is refused with a message naming the key or the
 * tensor, never a crash or a wrong answer.
 */
#include "engine_test_util.h"
#include "gguf_test_util.h"
#include "run_c_reference.h"
#include "kernels/cpu/quant.h"
#include "model/gguf.h"

#include <errno.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

/* Exports model spec (with tok512's vocabulary when tok is given) to tmpdir/name. */
static const char *export(const char *spec, const char *tok, const char *type, const char *arch,
                          const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    export_gguf(spec, tok, type, arch, path);
    return path;
}

#define SKIP_WITHOUT_SHARED(root)                                                                  \
    do {                                                                                           \
        if (!(root))                                                                               \
            cr_skip_test("no reference data: set RINGLM_SHARED to the folder holding "             \
                         "models/reference-greedy.json, stories260K.bin and tok512.bin");          \
    } while (0)

/* stories260K.bin converted with tok512's vocabulary, in type. */
static const char *export_260k(const char *type, char *name_buf, size_t len)
{
    char mpath[1024], tpath[1024];
    cr_assert_not_null(ts_model_file(mpath, sizeof mpath, "stories260K.bin"));
    cr_assert_not_null(ts_model_file(tpath, sizeof tpath, "tok512.bin"));
    snprintf(name_buf, len, "s260k-%s.gguf", type);
    return export(mpath, tpath, type, NULL, name_buf);
}

Test(gguf_ref, f32_file_gives_run_c_greedy_tokens_of_every_case, .init = mk_tmpdir,
     .fini = rm_tmpdir)
{
    json_t *root = load_reference();
    SKIP_WITHOUT_SHARED(root);
    char name[64];
    const char *path = export_260k("F32", name, sizeof name);
    eng_model *m;
    cr_assert_eq(eng_model_load(path, &m), 0, "%s", eng_errmsg());
    cr_assert_not_null(eng_model_gguf_path(m));
    const eng_model_config *c = eng_model_cfg(m);
    cr_assert(c->shared_classifier, "no output.weight: the embedding is the classifier");
    check_run_c_greedy_cases(m, root);
    eng_model_free(m);
    json_decref(root);
}

/* The recorded logits of "Once upon a time" (positions 0-7, one prefill + decode steps),
 * per type: F32 as the llama2.c file (1e-4), the others within the stated tolerance of
 * their rounding: largest |logit - run.c's| over the 8 x 512 logits. */
Test(gguf_ref, logits_per_type_within_stated_tolerance, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    json_t *root = load_reference();
    SKIP_WITHOUT_SHARED(root);
    static const struct {
        const char *type;
        double tol;
    } cases[] = {
        {"F32", 1e-4},
        {"F16", 0.03},
        {"BF16", 0.15},
        {"Q8_0", 0.4},
    };
    json_t *positions = json_object_get(json_object_get(root, "logits_oracle"), "positions");
    cr_assert_eq(json_array_size(positions), 8);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        char name[64];
        const char *path = export_260k(cases[ci].type, name, sizeof name);
        eng_model *m;
        cr_assert_eq(eng_model_load(path, &m), 0, "%s", eng_errmsg());
        const eng_model_config *c = eng_model_cfg(m);
        eng *e = ts_engine(m, 8, 4, 2);
        int32_t toks[8];
        for (int p = 0; p < 8; p++)
            toks[p] = (int32_t)json_integer_value(
                json_object_get(json_array_get(positions, (size_t)p), "input_token"));
        tseq s;
        ts_seq_init(&s, toks, 8, 0);
        tseq *one[1] = {&s};
        float *got = malloc((size_t)c->vocab_size * sizeof *got);
        double worst = 0;
        for (int p = 0; p < 8; p++) {
            int rows = 1;
            cr_assert_eq(ts_step(e, c, one, &rows, 1, got), 0, "%s", eng_errmsg());
            json_t *want = json_object_get(json_array_get(positions, (size_t)p), "logits");
            for (int i = 0; i < c->vocab_size; i++) {
                double d = fabs(got[i] - json_real_value(json_array_get(want, (size_t)i)));
                if (d > worst) worst = d;
            }
        }
        cr_log_info("%s: largest logit difference from run.c %.3g", cases[ci].type, worst);
        cr_assert_leq(worst, cases[ci].tol, "%s: largest logit difference %.4g > %.4g",
                      cases[ci].type, worst, cases[ci].tol);
        free(got);
        eng_destroy(e);
        eng_model_free(m);
    }
    json_decref(root);
}

/* Logits of a fixed prompt: one prefill chunk of 5 and 6 decode steps. */
static void run_prompt(const eng_model *m, float *out /* [7][vocab] */)
{
    const eng_model_config *c = eng_model_cfg(m);
    eng *e = ts_engine(m, 16, 8, 2);
    int32_t prompt[5] = {1, 300, 301, 17, 260};
    tseq s;
    ts_seq_init(&s, prompt, 5, 3);
    ts_generate(e, c, &s, 0, 7, out);
    eng_destroy(e);
}

Test(gguf_model, synthetic_gqa_f32_file_gives_the_in_memory_logits_bit_for_bit, .init = mk_tmpdir,
     .fini = rm_tmpdir)
{
    /* gqa-test: grouped-query attention and a classifier of its own (output.weight) */
    const char *path = export("synthetic:gqa-test:5", NULL, "F32", NULL, "gqa.gguf");
    eng_model *mem, *file;
    cr_assert_eq(eng_model_load("synthetic:gqa-test:5", &mem), 0, "%s", eng_errmsg());
    cr_assert_eq(eng_model_load(path, &file), 0, "%s", eng_errmsg());
    const eng_model_config *a = eng_model_cfg(mem), *b = eng_model_cfg(file);
    cr_assert(a->dim == b->dim && a->hidden_dim == b->hidden_dim && a->n_layers == b->n_layers &&
              a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
              a->vocab_size == b->vocab_size && a->seq_len == b->seq_len);
    cr_assert_not(b->shared_classifier);
    size_t n = (size_t)7 * a->vocab_size;
    float *la = malloc(n * sizeof *la), *lb = malloc(n * sizeof *lb);
    run_prompt(mem, la);
    run_prompt(file, lb);
    cr_assert_eq(memcmp(la, lb, n * sizeof *la), 0, "GGUF F32 logits differ from the model's");
    free(la);
    free(lb);
    eng_model_free(mem);
    eng_model_free(file);
}

/* A GGUF model's weights are read into anonymous memory (2 MiB pages) by default, mapped from
 * the file with RINGLM_WEIGHTS_HUGEPAGES=0: the same tensors either way, so the same logits to
 * the bit, and a file cut short is still refused by name. */
Test(gguf_model, weights_read_onto_huge_pages_give_the_mapped_files_logits_bit_for_bit,
     .init = mk_tmpdir, .fini = rm_tmpdir)
{
    const char *path = export("synthetic:gqa-test:5", NULL, "F16", NULL, "gqa16.gguf");
    eng_model *mapped, *copied;
    cr_assert_eq(setenv("RINGLM_WEIGHTS_HUGEPAGES", "0", 1), 0);
    cr_assert_eq(eng_model_load(path, &mapped), 0, "%s", eng_errmsg());
    cr_assert_not(eng_model_weights_copied(mapped), "RINGLM_WEIGHTS_HUGEPAGES=0 copied the file");
    cr_assert_eq(unsetenv("RINGLM_WEIGHTS_HUGEPAGES"), 0);
    cr_assert_eq(eng_model_load(path, &copied), 0, "%s", eng_errmsg());
    cr_assert(eng_model_weights_copied(copied), "the weights were not copied by default");
    const size_t n = (size_t)7 * eng_model_cfg(mapped)->vocab_size;
    float *la = malloc(n * sizeof *la), *lb = malloc(n * sizeof *lb);
    run_prompt(mapped, la);
    run_prompt(copied, lb);
    cr_assert_eq(memcmp(la, lb, n * sizeof *la), 0, "logits differ with the weights copied");
    free(la);
    free(lb);
    eng_model_free(mapped);
    eng_model_free(copied);

    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(truncate(path, st.st_size / 2), 0);
    eng_model *cut;
    cr_assert_lt(eng_model_load(path, &cut), 0);
    cr_assert(strstr(eng_errmsg(), "gqa16.gguf"), "%s", eng_errmsg());
}

/* The logits of the prompt and of 6 steps that append the given tokens (not the model's own
 * choices: two files compared on the same text, whatever either would pick). */
static void run_tokens(const eng_model *m, const int32_t *next /* [6] */, float *out)
{
    const eng_model_config *c = eng_model_cfg(m);
    eng *e = ts_engine(m, 16, 8, 2);
    int32_t prompt[5] = {1, 300, 301, 17, 260};
    tseq s, *one[1] = {&s};
    ts_seq_init(&s, prompt, 5, 3);
    for (int k = 0; k < 7; k++) {
        if (k > 0) s.tokens[s.n_tokens++] = next[k - 1];
        int rows = s.n_tokens - s.n_cached;
        cr_assert_eq(ts_step(e, c, one, &rows, 1, out + (size_t)k * c->vocab_size), 0, "%s",
                     eng_errmsg());
    }
    eng_destroy(e);
}

/* Every type on a shape whose rows are whole 256-element blocks: the logits of a prompt and
 * the F32 file's greedy continuation stay within the stated distance of the F32 file's
 * (relative to its largest logit). (The continuation is forced: a type that picks another
 * token at a near tie would otherwise be compared on another text.) */
Test(gguf_model, every_type_stays_within_its_tolerance_of_f32, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    static const struct {
        const char *type;
        int wtype;
        double tol;
    } cases[] = {
        {"F16", ENG_W_F16, 2e-3},   {"BF16", ENG_W_BF16, 2e-2}, {"Q8_0", ENG_W_Q8_0, 2e-2},
        {"Q6_K", ENG_W_Q6_K, 4e-2}, {"Q4_K", ENG_W_Q4_K, 0.15}, {"Q4_K_M", ENG_W_Q4_K, 0.15},
    };
    char f32[512];
    snprintf(f32, sizeof f32, "%s", export("synthetic:quant-test:3", NULL, "F32", NULL, "f.gguf"));
    eng_model *ref;
    cr_assert_eq(eng_model_load(f32, &ref), 0, "%s", eng_errmsg());
    size_t n = (size_t)7 * eng_model_cfg(ref)->vocab_size;
    float *la = malloc(n * sizeof *la), *lb = malloc(n * sizeof *lb);
    run_prompt(ref, la);
    int32_t next[6];
    for (int k = 0; k < 6; k++)
        next[k] = ts_argmax(la + (size_t)k * eng_model_cfg(ref)->vocab_size,
                            eng_model_cfg(ref)->vocab_size);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = export("synthetic:quant-test:3", NULL, cases[i].type, NULL, "q.gguf");
        eng_model *m;
        cr_assert_eq(eng_model_load(path, &m), 0, "%s", eng_errmsg());
        cr_assert_eq(eng_model_hparams_of(m)->weight_type, cases[i].wtype, "%s: weight type %s",
                     cases[i].type, eng_wtype_name(eng_model_hparams_of(m)->weight_type));
        run_tokens(m, next, lb);
        double rel = ts_rel_diff(la, lb, (int)n);
        cr_log_info("%s: logits within %.3g of F32 (relative to the largest)", cases[i].type, rel);
        cr_assert_leq(rel, cases[i].tol, "%s: logits differ from F32 by %.3g > %.3g", cases[i].type,
                      rel, cases[i].tol);
        cr_assert_gt(rel, 0.0, "%s: exactly the F32 logits: the type was not used", cases[i].type);
        eng_model_free(m);
    }
    free(la);
    free(lb);
    eng_model_free(ref);
}

/* ---- refusals ---------------------------------------------------------------------- */

/* A minimal llama file (dim 32, hidden 64, 1 layer, 2 heads, vocab 16) with one thing
 * changed: arch, a tensor left out, a tensor's type or shape, an extra key. */
typedef struct tiny {
    const char *arch;     /* NULL: no general.architecture */
    const char *omit;     /* tensor name not written */
    const char *odd_name; /* tensor written with odd_type / odd_ne0 */
    int odd_type;
    uint64_t odd_ne0;
    const char *str_key, *str_val; /* an extra string key */
    const char *extra;             /* an extra F32 vector of 32 (a bias, say) */
    bool no_eps;
    bool head_norms; /* blk.0.attn_q_norm / attn_k_norm of the head size, 16 (qwen3) */
} tiny;

static const char *write_tiny(const char *name, const tiny *o)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    gguf_writer *w = gw_new();
    if (o->arch) gw_str(w, "general.architecture", o->arch);
    const char *a = o->arch ? o->arch : "llama";
    char k[96];
#define U(s, v) (snprintf(k, sizeof k, "%s." s, a), gw_u32(w, k, v))
    U("context_length", 64);
    U("embedding_length", 32);
    U("feed_forward_length", 64);
    U("block_count", 1);
    U("attention.head_count", 2);
    U("attention.head_count_kv", 2);
#undef U
    if (!o->no_eps) {
        snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", a);
        gw_f32(w, k, 1e-5f);
    }
    if (o->str_key) gw_str(w, o->str_key, o->str_val);
    static const struct {
        const char *n;
        uint64_t ne0, ne1;
    } t[] = {
        {"token_embd.weight", 32, 16},     {"output_norm.weight", 32, 0},
        {"blk.0.attn_norm.weight", 32, 0}, {"blk.0.ffn_norm.weight", 32, 0},
        {"blk.0.attn_q.weight", 32, 32},   {"blk.0.attn_k.weight", 32, 32},
        {"blk.0.attn_v.weight", 32, 32},   {"blk.0.attn_output.weight", 32, 32},
        {"blk.0.ffn_gate.weight", 32, 64}, {"blk.0.ffn_down.weight", 64, 32},
        {"blk.0.ffn_up.weight", 32, 64},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (o->omit && strcmp(o->omit, t[i].n) == 0) continue;
        bool odd = o->odd_name && strcmp(o->odd_name, t[i].n) == 0;
        int type = odd ? o->odd_type : 0;
        uint64_t ne[2] = {odd && o->odd_ne0 ? o->odd_ne0 : t[i].ne0, t[i].ne1};
        uint32_t be, bb;
        cr_assert(gguf_type_block((uint32_t)type, &be, &bb));
        size_t bytes = (size_t)(ne[0] / be * bb) * (t[i].ne1 ? t[i].ne1 : 1);
        void *data = calloc(1, bytes);
        if (type == GGUF_T_F32)
            for (size_t j = 0; j < bytes / 4; j++) ((float *)data)[j] = 0.01f * (float)(j % 7);
        gw_tensor(w, t[i].n, t[i].ne1 ? 2 : 1, ne, type, data, bytes);
    }
    for (int i = 0; o->head_norms && i < 2; i++)
        gw_tensor(w, i ? "blk.0.attn_k_norm.weight" : "blk.0.attn_q_norm.weight", 1,
                  (uint64_t[2]){16, 0}, GGUF_T_F32, calloc(16, sizeof(float)), 16 * sizeof(float));
    if (o->extra) /* the writer owns and frees the data, as above */
        gw_tensor(w, o->extra, 1, (uint64_t[2]){32, 0}, GGUF_T_F32, calloc(32, sizeof(float)),
                  32 * sizeof(float));
    cr_assert_eq(gw_write(w, path), 0, "%s", gw_errmsg());
    gw_free(w);
    return path;
}

/* Loading fails with -EINVAL and every fragment appears in the message. */
static void refused(const char *path, const char *frag1, const char *frag2)
{
    eng_model *m = NULL;
    int err = eng_model_load(path, &m);
    cr_assert_eq(err, -EINVAL, "loaded (%d), expected a refusal naming \"%s\"", err, frag1);
    cr_assert_null(m);
    cr_assert_not_null(strstr(eng_errmsg(), frag1), "message \"%s\" lacks \"%s\"", eng_errmsg(),
                       frag1);
    if (frag2)
        cr_assert_not_null(strstr(eng_errmsg(), frag2), "message \"%s\" lacks \"%s\"", eng_errmsg(),
                           frag2);
}

Test(gguf_reader, the_tiny_file_loads, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    eng_model *m;
    cr_assert_eq(eng_model_load(write_tiny("ok.gguf", &(tiny){.arch = "llama"}), &m), 0, "%s",
                 eng_errmsg());
    cr_assert_eq(eng_model_cfg(m)->vocab_size, 16);
    cr_assert(eng_model_cfg(m)->shared_classifier);
    eng_model_free(m);
}

Test(gguf_reader, unsupported_or_missing_metadata_is_named, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    refused(write_tiny("a.gguf", &(tiny){.arch = NULL}), "general.architecture", "absent");
    refused(write_tiny("b.gguf", &(tiny){.arch = "gemma"}), "general.architecture=\"gemma\"",
            "llama, qwen2");
    refused(write_tiny("c.gguf", &(tiny){.arch = "llama", .no_eps = true}),
            "llama.attention.layer_norm_rms_epsilon", "absent");
    refused(write_tiny("d.gguf", &(tiny){.arch = "llama",
                                         .str_key = "llama.rope.scaling.type",
                                         .str_val = "longrope"}),
            "llama.rope.scaling.type=\"longrope\"", "not supported");
    refused(write_tiny("e.gguf",
                       &(tiny){.arch = "llama", .str_key = "llama.block_count", .str_val = "x"}),
            "llama.block_count", "appears twice");
}

Test(gguf_reader, unsupported_or_misshapen_tensors_are_named, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    refused(write_tiny("a.gguf", &(tiny){.arch = "llama", .omit = "blk.0.ffn_up.weight"}),
            "blk.0.ffn_up.weight", "absent");
    refused(write_tiny("b.gguf", &(tiny){.arch = "llama",
                                         .odd_name = "blk.0.attn_k.weight",
                                         .odd_type = GGUF_T_Q5_K,
                                         .odd_ne0 = 256}),
            "blk.0.attn_k.weight", "[32, 32]");
    refused(write_tiny("c.gguf", &(tiny){.arch = "llama",
                                         .odd_name = "blk.0.attn_k.weight",
                                         .odd_type = GGUF_T_Q8_1}),
            "blk.0.attn_k.weight: type Q8_1 is not supported", "Q8_0");
    refused(write_tiny(
                "d.gguf",
                &(tiny){.arch = "llama", .odd_name = "output_norm.weight", .odd_type = GGUF_T_F16}),
            "output_norm.weight: type F16", "must be F32");
    refused(write_tiny("e.gguf", &(tiny){.arch = "qwen2"}), "blk.0.attn_q.bias", "absent");
    /* a llama file may carry Q/K/V biases, but all three: the kernels add them together */
    refused(write_tiny("f.gguf", &(tiny){.arch = "llama", .extra = "blk.0.attn_q.bias"}),
            "attn_k.bias absent", "all three or none");
    /* qwen3 needs its per-head Q/K norms, each of the head size */
    refused(write_tiny("g.gguf", &(tiny){.arch = "qwen3"}), "blk.0.attn_q_norm.weight", "absent");
    refused(write_tiny("h.gguf", &(tiny){.arch = "qwen3", .extra = "blk.0.attn_q_norm.weight"}),
            "blk.0.attn_q_norm.weight", "expected shape [16]");
    /* qwen3moe needs its expert keys, then its router and experts */
    refused(write_tiny("m.gguf", &(tiny){.arch = "qwen3moe", .head_norms = true}),
            "qwen3moe.expert_count", "absent");
    refused(write_tiny("n.gguf", &(tiny){.arch = "qwen3moe",
                                         .head_norms = true,
                                         .str_key = "qwen3moe.expert_count",
                                         .str_val = "8"}),
            "qwen3moe.expert_count", NULL);
    /* phi3 reads its fused Q/K/V */
    refused(write_tiny("l.gguf", &(tiny){.arch = "phi3"}), "blk.0.attn_qkv.weight", "absent");
    /* gemma needs its norms after attention and FFN; gemma3 its Q/K norms too */
    refused(write_tiny("i.gguf", &(tiny){.arch = "gemma2"}), "blk.0.post_attention_norm.weight",
            "absent");
    refused(write_tiny("j.gguf",
                       &(tiny){.arch = "gemma3", .extra = "blk.0.post_attention_norm.weight"}),
            "blk.0.attn_q_norm.weight", "absent");
    refused(write_tiny("k.gguf", &(tiny){.arch = "gemma2",
                                         .str_key = "gemma2.attention.sliding_window",
                                         .str_val = "4096"}),
            "gemma2.attention.sliding_window", NULL);
}

/* A qwen3 file loads with its norms and NEOX RoPE; the CUDA backend refuses it by name
 * before it looks for a device. */
Test(gguf_reader, qwen3_loads_and_cuda_refuses_it_by_name, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    eng_model *m;
    cr_assert_eq(
        eng_model_load(write_tiny("q3.gguf", &(tiny){.arch = "qwen3", .head_norms = true}), &m), 0,
        "%s", eng_errmsg());
    const eng_model_hparams *hp = eng_model_hparams_of(m);
    cr_expect_eq(hp->arch, ENG_ARCH_QWEN3);
    cr_expect(hp->rope_neox);
    cr_expect_eq(eng_head_dim(eng_model_cfg(m), hp), 16);
    cr_expect_not_null(eng_model_tensors_of(m)->layers[0].q_norm);
    eng_options o = {.backend = "cuda",
                     .n_threads = 1,
                     .kv_blocks = 4,
                     .kv_block_size = 16,
                     .max_batch_tokens = 8,
                     .max_seqs = 1};
    eng *e = NULL;
    cr_expect_eq(eng_create(m, &o, &e), -ENOTSUP, "%s", eng_errmsg());
    cr_expect_not_null(strstr(eng_errmsg(), "architecture qwen3"), "%s", eng_errmsg());
    cr_expect_null(e);
    o.backend = "cpu";
    cr_expect_eq(eng_create(m, &o, &e), 0, "%s", eng_errmsg());
    eng_destroy(e);
    eng_model_free(m);
}

/* Every prefix of a valid file is refused with -EINVAL (never a crash, never a load). */
Test(gguf_reader, every_truncation_is_refused, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    const char *path = write_tiny("ok.gguf", &(tiny){.arch = "llama"});
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    static unsigned char buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert_lt(len, sizeof buf);
    char cut[600];
    snprintf(cut, sizeof cut, "%s/cut.gguf", tmpdir);
    for (size_t n = 1; n < len; n += n < 2048 ? 1 : 97) {
        f = fopen(cut, "wb");
        cr_assert_eq(fwrite(buf, 1, n, f), n);
        fclose(f);
        eng_model *m = NULL;
        int err = eng_model_load(cut, &m);
        cr_assert_eq(err, -EINVAL, "%zu of %zu bytes: %d (%s)", n, len, err, eng_errmsg());
        cr_assert_null(m);
        cr_assert_gt(strlen(eng_errmsg()), 0);
    }
}

Test(gguf_reader, corrupt_headers_and_counts_are_refused_by_name, .init = mk_tmpdir,
     .fini = rm_tmpdir)
{
    const char *path = write_tiny("ok.gguf", &(tiny){.arch = "llama"});
    FILE *f = fopen(path, "rb");
    static unsigned char buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    gguf_file *g;
    unsigned char bad[sizeof buf];
    memcpy(bad, buf, len);
    bad[4] = 1; /* version 1 */
    cr_assert_eq(gguf_open_mem(bad, len, &g), -EINVAL);
    cr_assert_not_null(strstr(gguf_errmsg(), "version 1"), "%s", gguf_errmsg());
    memcpy(bad, buf, len);
    bad[0] = 'X';
    cr_assert_eq(gguf_open_mem(bad, len, &g), -EINVAL);
    cr_assert_not_null(strstr(gguf_errmsg(), "magic"), "%s", gguf_errmsg());
    memcpy(bad, buf, len);
    bad[8 + 7] = 0x40; /* tensor count with a high byte set */
    cr_assert_eq(gguf_open_mem(bad, len, &g), -EINVAL);
    cr_assert_not_null(strstr(gguf_errmsg(), "tensors"), "%s", gguf_errmsg());
    memcpy(bad, buf, len);
    bad[24 + 7] = 0x7f; /* the first key's length: far past the end */
    cr_assert_eq(gguf_open_mem(bad, len, &g), -EINVAL);
    cr_assert_not_null(strstr(gguf_errmsg(), "runs past the end"), "%s", gguf_errmsg());
    cr_assert_eq(gguf_open_mem(buf, len, &g), 0, "%s", gguf_errmsg());
    cr_assert_eq(gguf_version(g), 3);
    const gguf_tensor *t = gguf_tensor_find(g, "blk.0.ffn_down.weight");
    cr_assert_not_null(t);
    cr_assert(t->ne[0] == 64 && t->ne[1] == 32 && t->type == GGUF_T_F32 && t->bytes == 64 * 32 * 4);
    gguf_close(g);
}

/* ---- the tokenizer in the file ---------------------------------------------------- */

Test(gguf_tokenizer, sentencepiece_vocab_from_the_file_encodes_as_run_c, .init = mk_tmpdir,
     .fini = rm_tmpdir)
{
    json_t *root = load_reference();
    SKIP_WITHOUT_SHARED(root);
    char name[64], tpath[1024];
    const char *path = export_260k("Q8_0", name, sizeof name);
    cr_assert_not_null(ts_model_file(tpath, sizeof tpath, "tok512.bin"));
    tok_tokenizer *g, *ref;
    cr_assert_eq(tok_load(path, 512, &g), 0, "%s", tok_errmsg()); /* detected as GGUF */
    cr_assert_eq(tok_load(tpath, 512, &ref), 0, "%s", tok_errmsg());
    cr_assert_eq(tok_bos(g), 1);
    cr_assert_eq(tok_eos(g), 2);
    cr_assert(tok_add_bos(g));
    json_t *cases = json_object_get(json_object_get(root, "tokenizer_encode_oracle"), "cases");
    cr_assert_gt(json_array_size(cases), 5);
    int32_t got[512], want[512];
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *text = json_string_value(json_object_get(c, "text"));
        int n = tok_encode(g, text, true, false, got, 512);
        int nw = ints_of(json_object_get(c, "tokens"), want, 512);
        cr_assert_eq(n, nw, "\"%s\": %d tokens, run.c %d", text, n, nw);
        cr_assert_eq(memcmp(got, want, (size_t)n * sizeof *got), 0, "\"%s\": ids differ", text);
    }
    /* decoding: the same text as the llama2.c tokenizer, except that control tokens (BOS,
     * EOS) print nothing */
    for (int32_t id = 0; id < 512; id++) {
        const char *a = tok_decode(g, 300, id), *b = tok_decode(ref, 300, id);
        if (id == 1 || id == 2)
            cr_assert_str_empty(a, "control token %d printed \"%s\"", id, a);
        else
            cr_assert_str_eq(a, b, "token %d", id);
        cr_assert_str_eq(tok_decode(g, 1, 403), tok_decode(ref, 1, 403));
    }
    tok_free(g);
    tok_free(ref);
    json_decref(root);
}

Test(gguf_tokenizer, a_file_without_a_supported_tokenizer_is_refused_by_name, .init = mk_tmpdir,
     .fini = rm_tmpdir)
{
    tok_tokenizer *t;
    const char *path = write_tiny("t.gguf", &(tiny){.arch = "llama"});
    cr_assert_eq(tok_load(path, 0, &t), -EINVAL);
    cr_assert_not_null(strstr(tok_errmsg(), "tokenizer.ggml.model: absent"), "%s", tok_errmsg());
    path = write_tiny(
        "u.gguf", &(tiny){.arch = "llama", .str_key = "tokenizer.ggml.model", .str_val = "bert"});
    cr_assert_eq(tok_load(path, 0, &t), -EINVAL);
    cr_assert_not_null(strstr(tok_errmsg(), "tokenizer.ggml.model=\"bert\": not supported"), "%s",
                       tok_errmsg());
}

Test(gguf_model, stop_tokens_come_from_the_file, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    eng_model *m;
    int32_t stop[4];
    cr_assert_eq(eng_model_load("synthetic:gqa-test:1", &m), 0);
    cr_assert_eq(eng_model_stop_tokens(m, stop, 4), 1);
    cr_assert_eq(stop[0], 1, "llama2.c models stop on BOS, as run.c");
    eng_model_free(m);
    cr_assert_eq(eng_model_load(export("synthetic:gqa-test:1", NULL, "Q8_0", NULL, "s.gguf"), &m),
                 0, "%s", eng_errmsg());
    cr_assert_eq(eng_model_stop_tokens(m, stop, 4), 1);
    cr_assert_eq(stop[0], 2, "the file's EOS");
    eng_model_free(m);
}

/* ringlm-mkmodel --format gguf writes a made-up vocabulary only when asked: without a
 * vocabulary option it refuses, names the options and writes nothing. */
Test(gguf_mkmodel, a_placeholder_vocabulary_only_when_asked, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    char *mk = th_program("ringlm-mkmodel");
    char out[400];
    snprintf(out, sizeof out, "%s/m.gguf", tmpdir);
    char *no_vocab[] = {mk,  "--model", "synthetic:gqa-test:1", "--format", "gguf", "--out",
                        out, NULL};
    char *so = NULL, *se = NULL;
    int rc = th_run(no_vocab, &so, &se, 60);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, se);
    cr_assert(strstr(se, "no vocabulary given") && strstr(se, "--placeholder-vocab") &&
                  strstr(se, "--tokenizer"),
              "%s", se);
    cr_assert_not(th_exists(out), "nothing is written without a vocabulary");
    free(so);
    free(se);
    char *asked[] = {mk,      "--model", "synthetic:gqa-test:1", "--format", "gguf",
                     "--out", out,       "--placeholder-vocab",  NULL};
    rc = th_run(asked, &so, &se, 60);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, se);
    tok_tokenizer *t;
    cr_assert_eq(tok_load(out, 0, &t), 0, "%s", tok_errmsg());
    cr_assert_str_eq(tok_piece(t, 300), " t300", "the synthetic vocabulary");
    tok_free(t);
    free(so);
    free(se);
    char *both[] = {mk,      "--model", "synthetic:gqa-test:1", "--format", "gguf",
                    "--out", out,       "--placeholder-vocab",  "--vocab",  "x.json",
                    NULL};
    rc = th_run(both, &so, &se, 60);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, se);
    cr_assert(strstr(se, "alternatives"), "%s", se);
    free(so);
    free(se);
    free(mk);
}
