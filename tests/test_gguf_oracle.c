/* SPDX-License-Identifier: MIT */
/*
 * llama.cpp as the oracle (node-llama-cpp's prebuilt binary, tests/node/): on GGUF files
 * written by ringlm-mkmodel's exporter — stories260K converted, synthetic stories15M, GQA,
 * qwen2 and 256-aligned shapes in every supported type — ringlm's greedy tokens equal
 * llama.cpp's for 200 steps.
 *
 * Stated tolerance: the two engines round differently (llama.cpp also quantizes the
 * activations to 8 bits before a quantized matmul), so where ringlm's two best logits are
 * within NEAR_TIE of each other (relative to the largest logit) the argmax may differ; the
 * runs then diverge, so the comparison ends there and the test reports how far it got.
 * A difference at a step with a clear winner fails.
 *
 * Skips with a message when node or tests/node/node_modules is absent (`make deps`).
 */
#include "engine_test_util.h"
#include "gguf_test_util.h"
#include "llama_lib_util.h"

#include "kernels/cpu/quant.h"
#include "kernels/gguf_requant.h"
#include "model/gguf.h"

#include <dlfcn.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#define STEPS 200

typedef struct job {
    char model[512];
    int32_t prompt[192];
    int n_prompt;
    int stop; /* token that ends generation (stories260K: BOS), -1: none */
    double near_tie;
    int min_equal; /* steps that must agree before a near tie may end the comparison */
    int ctx;       /* llama.cpp's context size; 0: 256 */
    int steps;     /* greedy steps compared; 0: STEPS */
    const char *label;
    bool prompt_rows; /* the prompt marked as ringlmd marks it (eng_batch.prompt_len); else
                         every row exact float32 */
} job;

static void export_to(job *j, const char *spec, const char *tok, const char *type, const char *arch,
                      const char *name)
{
    snprintf(j->model, sizeof j->model, "%s/%s", tmpdir, name);
    export_gguf(spec, tok, type, arch, j->model);
}

/* Runs llama.cpp over every job in one node process; returns the parsed result array. */
static json_t *run_llama_cpp(const job *jobs, int n)
{
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        json_t *p = json_array();
        for (int k = 0; k < jobs[i].n_prompt; k++)
            json_array_append_new(p, json_integer(jobs[i].prompt[k]));
        json_t *o = json_pack("{s:s, s:o, s:i, s:i}", "model", jobs[i].model, "prompt", p, "n",
                              jobs[i].steps ? jobs[i].steps : STEPS, "ctx",
                              jobs[i].ctx ? jobs[i].ctx : 256);
        if (jobs[i].stop >= 0) json_object_set_new(o, "stop", json_integer(jobs[i].stop));
        json_array_append_new(arr, o);
    }
    json_t *out = node_oracle("greedy.mjs", "jobs", arr, "the llama.cpp oracle");
    cr_assert_eq((int)json_array_size(out), n);
    return out;
}

/* ringlm's greedy run compared with llama.cpp's tokens (see the tolerance above). */
static void compare(const job *j, json_t *theirs)
{
    eng_model *m;
    cr_assert_eq(eng_model_load(j->model, &m), 0, "%s", eng_errmsg());
    const eng_model_config *c = eng_model_cfg(m);
    eng *e = ts_engine(m, 40, 16, 1);
    float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
    tseq s;
    ts_seq_init(&s, j->prompt, j->n_prompt, 0);
    s.n_prompt = j->prompt_rows ? j->n_prompt : 0;
    tseq *one[1] = {&s};
    const int steps = j->steps ? j->steps : STEPS;
    int n_theirs = (int)json_array_size(theirs), k = 0;
    for (; k < steps; k++) {
        int rows = s.n_tokens - s.n_cached;
        cr_assert_eq(ts_step(e, c, one, &rows, 1, logits), 0, "%s", eng_errmsg());
        int32_t best = ts_argmax(logits, c->vocab_size);
        float top = logits[best], second = -INFINITY, scale = 1.0f;
        for (int i = 0; i < c->vocab_size; i++) {
            if (i != best && logits[i] > second) second = logits[i];
            if (fabsf(logits[i]) > scale) scale = fabsf(logits[i]);
        }
        if (k == n_theirs && best == j->stop) /* llama.cpp ends at an end-of-generation token */
            break;                            /* without returning it */
        cr_assert_lt(k, n_theirs, "%s: llama.cpp stopped after %d tokens, ringlm goes on with %d",
                     j->label, n_theirs, best);
        int32_t want = (int32_t)json_integer_value(json_array_get(theirs, (size_t)k));
        if (best != want) {
            double gap = (top - second) / scale;
            cr_assert_leq(gap, j->near_tie,
                          "%s: step %d: ringlm %d, llama.cpp %d, and ringlm's "
                          "top-2 gap %.3g (relative) is no near tie (<= %.3g)",
                          j->label, k, best, want, gap, j->near_tie);
            cr_assert_geq(k, j->min_equal,
                          "%s: step %d: ringlm %d, llama.cpp %d (a near tie, gap %.3g), before "
                          "the %d steps that must agree",
                          j->label, k, best, want, gap, j->min_equal);
            cr_log_info("%s: near tie at step %d (gap %.2g): compared %d steps", j->label, k, gap,
                        k);
            break;
        }
        if (best == j->stop) {
            k++;
            break;
        }
        s.tokens[s.n_tokens++] = best;
    }
    cr_log_info("%s: %d greedy tokens equal to llama.cpp's", j->label, k);
    if (k == steps || (j->stop >= 0 && k == n_theirs))
        cr_assert_eq(k, n_theirs, "%s: ringlm made %d tokens, llama.cpp %d", j->label, k, n_theirs);
    free(logits);
    eng_destroy(e);
    eng_model_free(m);
}

static void run_jobs(job *jobs, int n)
{
    json_t *out = run_llama_cpp(jobs, n);
    for (int i = 0; i < n; i++) compare(&jobs[i], json_array_get(out, (size_t)i));
    json_decref(out);
}

/* A synthetic model exported in one type, compared on the five-token prompt. */
typedef struct prompt5_case {
    const char *spec, *type;
    const char *arch;  /* NULL: llama */
    int head_dim;      /* 0: the preset's */
    int window;        /* sliding window of the windowed layers; 0: none */
    int min_equal;     /* steps that must agree before a near tie may end the comparison */
    int ctx;           /* llama.cpp's context size; 0: 256 */
    const char *label; /* NULL: the type */
} prompt5_case;

/* Exports each case and compares ringlm's greedy tokens with llama.cpp's from
 * {1, 300, 301, 17, 260}; stop as in job, near_tie 0: 1e-4 for F32 files, 5e-3 for the rest. */
static void run_prompt5_cases(const prompt5_case *cases, int n, int stop, double near_tie)
{
    static const int32_t prompt[] = {1, 300, 301, 17, 260};
    job *jobs = calloc((size_t)n, sizeof *jobs);
    cr_assert_not_null(jobs);
    for (int i = 0; i < n; i++) {
        const prompt5_case *c = &cases[i];
        snprintf(jobs[i].model, sizeof jobs[i].model, "%s/case-%d.gguf", tmpdir, i);
        export_gguf_window(c->spec, NULL, c->type, c->arch ? c->arch : "llama", c->head_dim,
                           c->window, jobs[i].model);
        memcpy(jobs[i].prompt, prompt, sizeof prompt);
        jobs[i].n_prompt = (int)(sizeof prompt / sizeof prompt[0]);
        jobs[i].stop = stop;
        jobs[i].near_tie = near_tie > 0 ? near_tie : strstr(c->type, "F32") ? 1e-4 : 5e-3;
        jobs[i].min_equal = c->min_equal;
        jobs[i].ctx = c->ctx;
        jobs[i].label = c->label ? c->label : c->type;
    }
    run_jobs(jobs, n);
    free(jobs);
}

Test(gguf_oracle, stories260k_converted_equals_llama_cpp, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 300)
{
    skip_without_node();
    char mpath[1024], tpath[1024];
    if (!ts_model_file(mpath, sizeof mpath, "stories260K.bin") ||
        !ts_model_file(tpath, sizeof tpath, "tok512.bin"))
        cr_skip_test("no stories260K.bin/tok512.bin under RINGLM_SHARED");
    static const char *const types[] = {"F32", "F16", "BF16", "Q8_0"};
    job jobs[4] = {0};
    for (int i = 0; i < 4; i++) {
        char name[64];
        snprintf(name, sizeof name, "s260k-%s.gguf", types[i]);
        export_to(&jobs[i], mpath, tpath, types[i], NULL, name);
        /* BOS, then "Once upon a time" as run.c encodes it */
        int32_t p[] = {1, 410, 403, 407, 261, 378};
        memcpy(jobs[i].prompt, p, sizeof p);
        jobs[i].n_prompt = 6;
        jobs[i].stop = 1;
        jobs[i].near_tie = i == 0 ? 1e-4 : 5e-3;
        jobs[i].label = types[i];
    }
    run_jobs(jobs, 4);
}

Test(gguf_oracle, synthetic_shapes_in_every_type_equal_llama_cpp, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 600)
{
    skip_without_node();
    static const prompt5_case cases[] = {
        {"synthetic:quant-test:3", "F32", .label = "quant-test F32"},
        {"synthetic:quant-test:3", "F16", .label = "quant-test F16"},
        {"synthetic:quant-test:3", "BF16", .label = "quant-test BF16"},
        {"synthetic:quant-test:3", "Q8_0", .label = "quant-test Q8_0"},
        {"synthetic:quant-test:3", "Q6_K", .label = "quant-test Q6_K"},
        {"synthetic:quant-test:3", "Q4_K", .label = "quant-test Q4_K"},
        {"synthetic:quant-test:3", "Q4_K_M", .label = "quant-test Q4_K_M"},
        {"synthetic:gqa-test:4", "F32", .label = "gqa-test F32"},
        {"synthetic:gqa-test:4", "Q8_0", .label = "gqa-test Q8_0"},
        {"synthetic:quant-test:5", "F32", "qwen2", .label = "qwen2 F32"},
        {"synthetic:quant-test:5", "Q8_0", "qwen2", .label = "qwen2 Q8_0"},
        {"synthetic:stories15M:6", "F32", .label = "stories15M F32"},
        {"synthetic:stories15M:6", "Q8_0", .label = "stories15M Q8_0"},
    };
    run_prompt5_cases(cases, sizeof cases / sizeof cases[0], -1, 0);
}

/* quant-test exported in each of n types, compared on one prompt of len tokens (BOS, then a
 * fixed walk through the vocabulary) prefilled in one step, for `steps` (0: STEPS) steps;
 * near tie 5e-3, 1e-2 for the K types (see below). */
static void run_long_prompt(const char *const *types, int n, int len, int steps, bool prompt_rows)
{
    job *jobs = calloc((size_t)n, sizeof *jobs);
    cr_assert_not_null(jobs);
    cr_assert_leq(len, (int)(sizeof jobs[0].prompt / sizeof jobs[0].prompt[0]));
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "p%d.gguf", i);
        export_to(&jobs[i], "synthetic:quant-test:3", NULL, types[i], "llama", name);
        jobs[i].prompt[0] = 1;
        for (int k = 1; k < len; k++) jobs[i].prompt[k] = 3 + (37 * k + 11) % 500;
        jobs[i].n_prompt = len;
        jobs[i].stop = -1;
        jobs[i].near_tie = types[i][0] == 'Q' && types[i][1] != '8' ? 1e-2 : 5e-3;
        jobs[i].steps = steps;
        jobs[i].label = types[i];
        jobs[i].prompt_rows = prompt_rows;
    }
    run_jobs(jobs, n);
    free(jobs);
}

/* A prompt of 48 tokens, prefilled in one step: above the integer dots' rows, the quantized
 * weights take the prefill tiles (kernels/cpu/quant_prefill.h: Q4_K and Q6_K in integers;
 * gemm_f32's dequantized panels for Q8_0 on AVX2), and the greedy tokens still equal
 * llama.cpp's. Near tie: 5e-3 as elsewhere, 1e-2 for the K types, whose prompt products round
 * the activations to 8 bits per 32 here and per 256 (Q8_K) in llama.cpp — two different
 * roundings of the prompt's keys and values (Q4_K_M's attn_v is Q6_K), where the float panels
 * kept them exact: Q4_K_M then parted from llama.cpp at step 54 with ringlm's gap at 0.0055
 * (with every product on the float panels, RINGLM_PREFILL_GEMM=own: a near tie at step 52,
 * gap 0.0008). */
Test(gguf_oracle, long_prompts_prefilled_in_one_step_equal_llama_cpp, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 300)
{
    skip_without_node();
    static const char *const types[] = {"Q4_K", "Q4_K_M", "Q6_K", "Q8_0"};
    run_long_prompt(types, 4, 48, 0, false);
}

/* A prompt of 150 tokens prefilled in one step: above gemm_small's rows, BF16 weights take
 * the AVX-512 BF16 tiles where the CPU has them (kernels/cpu/gemm_bf16.h: the activations
 * rounded to bf16, as llama.cpp rounds them for its BF16 dots), F16 gemm_f32's float panels,
 * F32 SGEMM (with RINGLM_PREFILL_GEMM=bf16 both through the BF16 tiles as well), and the
 * greedy tokens still equal llama.cpp's (near tie 5e-3 as for the short prompt) for the 106
 * steps the model's 256 positions leave. */
Test(gguf_oracle, long_float_prompts_prefilled_in_one_step_equal_llama_cpp, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 300)
{
    skip_without_node();
    static const char *const types[] = {"BF16", "F16", "F32"};
    run_long_prompt(types, 3, 150, 256 - 150, false);
}

/* The same prompts marked as ringlmd marks them: F16 and F32 weights then multiply the prompt
 * rows in the AVX-512 BF16 tiles where the CPU has them (weights and activations rounded to
 * bf16; cpu.c mm_rows) and the generated rows in exact float32, and the greedy tokens still
 * equal llama.cpp's (near tie 5e-3). */
Test(gguf_oracle, long_float_prompts_in_bf16_prompt_rows_equal_llama_cpp, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 300)
{
    skip_without_node();
    static const char *const types[] = {"F16", "F32"};
    run_long_prompt(types, 2, 150, 256 - 150, true);
}

/* Qwen3: per-head RMSNorm of Q and K before NEOX RoPE, heads of attention.key_length (128
 * over a width of 256 and 4 heads: Qwen3-0.6B's 16 x 128 over 1024 in small), no biases. */
Test(gguf_oracle, qwen3_equals_llama_cpp, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    skip_without_node();
    static const prompt5_case cases[] = {
        {"synthetic:quant-test:7", "F32", "qwen3", 128, .min_equal = STEPS,
         .label = "qwen3 F32 head_dim 128"},
        {"synthetic:quant-test:10", "Q8_0", "qwen3", 128, .min_equal = 100,
         .label = "qwen3 Q8_0 head_dim 128"},
        {"synthetic:gqa-test:8", "F32", "qwen3", .min_equal = STEPS, .label = "qwen3 F32 gqa-test"},
    };
    run_prompt5_cases(cases, sizeof cases / sizeof cases[0], -1, 0);
}

/* Gemma 2 and 3: the embedding times sqrt(dim), GeGLU, norms after attention and FFN, the
 * classifier tied to the embedding; gemma2 soft-caps attention scores (50) and logits (30),
 * and windows every other layer; gemma3 normalises each Q and K head, windows five layers of
 * six at RoPE base 10000 and runs the sixth at 1e6 with linear scaling by 8. The window is
 * 32 positions here, so 200 steps cross it many times; heads of 128 and 64 over narrower
 * widths, as Gemma's 256 over 2304.
 *
 * Tolerance: llama.cpp's CPU GELU rounds its input to f16 and looks the result up in an f16
 * table (GGML_GELU_FP16); ringlm computes the tanh form in float, so logits differ by about
 * 1e-3 relative even for F32 weights: the near-tie bound is 5e-3 for every type here. F32
 * files agree for all 200 steps; Q8_0 ones (llama.cpp also rounds the activations to 8 bits)
 * reach a near tie within 20 to 90 steps, since the tied classifier's logits are small and
 * close together: each case states the steps that must agree first (seen with AVX2: 90,
 * 26, 52; the 6-layer gemma3 file meets a near tie (gap 1.7e-4) at step 12 with AVX-512 VNNI,
 * whose Q8_0 sums run in another order). */
Test(gguf_oracle, gemma2_and_gemma3_equal_llama_cpp, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 600)
{
    skip_without_node();
    static const prompt5_case cases[] = {
        {"synthetic:quant-test:9", "F32", "gemma2", 128, 32, STEPS,
         .label = "gemma2 F32 head_dim 128"},
        {"synthetic:quant-test:9", "Q8_0", "gemma2", 128, 32, 80,
         .label = "gemma2 Q8_0 head_dim 128"},
        {"synthetic:stories15M:9", "F32", "gemma3", 64, 32, STEPS,
         .label = "gemma3 F32 6 layers head_dim 64"},
        {"synthetic:stories15M:15", "Q8_0", "gemma3", 64, 32, 10,
         .label = "gemma3 Q8_0 6 layers head_dim 64"},
        {"synthetic:quant-test:9", "Q8_0", "gemma3", 128, 32, 30,
         .label = "gemma3 Q8_0 head_dim 128"},
    };
    run_prompt5_cases(cases, sizeof cases / sizeof cases[0], -1, 5e-3);
}

/* Phi-3: Q, K and V fused in attn_qkv, gate and up in ffn_up, NEOX RoPE with long-RoPE
 * factors (the long ones: the file's context is twice its original_context_length, and
 * llama.cpp runs with the file's context, as ringlm serves it) and the attention factor on Q
 * and K. */
Test(gguf_oracle, phi3_equals_llama_cpp, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    skip_without_node();
    static const prompt5_case cases[] = {
        /* ctx: the preset's */
        {"synthetic:quant-test:13", "F32", "phi3", .min_equal = STEPS, .ctx = 256,
         .label = "phi3 F32"},
        {"synthetic:quant-test:13", "Q8_0", "phi3", .min_equal = 40, .ctx = 256,
         .label = "phi3 Q8_0"},
        {"synthetic:gqa-test:14", "F32", "phi3", .min_equal = STEPS, .ctx = 512,
         .label = "phi3 F32 gqa-test"},
    };
    run_prompt5_cases(cases, sizeof cases / sizeof cases[0], 2 /* EOS: llama.cpp ends there */, 0);
}

/* qwen3moe: qwen3's attention, and a mixture of 8 SwiGLU experts of half the FFN width in
 * place of the FFN, 2 per token: softmax of the router's logits, the top 2, renormalised. */
Test(gguf_oracle, qwen3moe_equals_llama_cpp, .init = mk_tmpdir, .fini = rm_tmpdir, .timeout = 300)
{
    skip_without_node();
    static const prompt5_case cases[] = {
        {"synthetic:quant-test:15", "F32", "qwen3moe", 128, .min_equal = STEPS,
         .label = "qwen3moe F32 head_dim 128"},
        {"synthetic:quant-test:15", "Q8_0", "qwen3moe", 128, .min_equal = 15,
         .label = "qwen3moe Q8_0 head_dim 128"},
        {"synthetic:gqa-test:16", "F32", "qwen3moe", .min_equal = STEPS,
         .label = "qwen3moe F32 gqa-test"},
    };
    run_prompt5_cases(cases, sizeof cases / sizeof cases[0], 2, 0);
}

/* Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL weights (ggml's layouts, written by ringlm-mkmodel's
 * reference quantizers) loaded by both engines. Both round the activations to 8 bits per 32
 * inside these products; what still differs (llama.cpp keeps its KV cache in f16, sums in
 * another order) moves log-probabilities by up to ~0.01 (every_type_logprobs_equal_llama_cpp),
 * so the near-tie bound is 0.01 here, and quant-test, whose logits are nearly flat, parts at
 * such ties early: each case states the steps that must agree first (seen: Q4_0 6, Q4_1 2,
 * Q5_0 34, Q5_1 149, IQ4_NL 14; on stories15M all 200; since the AVX2 kernels meet the zero
 * points and minimums as offsets, which sums in another order: Q5_0 70, Q5_1 92, at a tie of
 * relative gap 0.00095). */
Test(gguf_oracle, legacy_types_equal_llama_cpp, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 600)
{
    skip_without_node();
    static const prompt5_case cases[] = {
        {"synthetic:quant-test:17", "Q4_0", .min_equal = 5},
        {"synthetic:quant-test:17", "Q4_1", .min_equal = 1},
        {"synthetic:quant-test:17", "Q5_0", .min_equal = 30},
        {"synthetic:quant-test:17", "Q5_1", .min_equal = 80},
        {"synthetic:quant-test:17", "IQ4_NL", .min_equal = 10},
        {"synthetic:stories15M:18", "Q4_0", .min_equal = STEPS},
        {"synthetic:stories15M:18", "Q4_1", .min_equal = STEPS},
        {"synthetic:stories15M:18", "IQ4_NL", .min_equal = STEPS},
    };
    run_prompt5_cases(cases, sizeof cases / sizeof cases[0], 2, 0.01);
}

/* Q2_K, Q3_K, Q5_K and IQ4_XS weights (ggml's layouts, written by ringlm-mkmodel's
 * quantizers) loaded by both engines. Both round the activations to 8 bits per 256 elements
 * inside these products (Q8_K, with AVX2 or portable kernels; k_type_dots_equal_ggmls); what
 * still differs (llama.cpp's f16 KV cache, the order of float sums) moves log-probabilities by
 * up to ~0.015, so the near-tie bound is 0.01 as for the 32-element types, and each case states
 * the steps that must agree first (seen on quant-test with Q8_K activations: Q2_K 172, Q3_K
 * 84, Q5_K 194, IQ4_XS 45; with AVX-512 VNNI's exact integer sums per 256 and one float step,
 * kernels/cpu/quant_k23.c: Q2_K and Q5_K 200, IQ4_XS 123, Q3_K 54, at a tie of relative gap
 * 4e-5; quant-test:17's Q2_K parts at step 9, where the two best tokens are 0.002 apart in
 * ringlm's logits and 0.004 the other way in llama.cpp's; on stories15M, whose rows of 288
 * leave only ffn_down in these types, 200). */
Test(gguf_oracle, low_bit_k_types_equal_llama_cpp, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 600)
{
    skip_without_node();
    prompt5_case cases[] = {
        {"synthetic:quant-test:22", "Q2_K", .min_equal = 150},
        {"synthetic:quant-test:17", "Q3_K", .min_equal = 50},
        {"synthetic:quant-test:22", "Q5_K", .min_equal = 170},
        {"synthetic:quant-test:22", "IQ4_XS", .min_equal = 30},
        {"synthetic:stories15M:18", "Q5_K", .min_equal = STEPS},
        {"synthetic:stories15M:18", "Q2_K", .min_equal = STEPS},
        {"synthetic:stories15M:18", "Q3_K", .min_equal = STEPS},
        {"synthetic:stories15M:18", "IQ4_XS", .min_equal = STEPS},
    };
    enum { N = sizeof cases / sizeof cases[0] };
    /* with AVX-512 VNNI these types keep 8 bits per 32 (q_int_act_elems): on quant-test the
     * near ties then come early (seen so on AVX2 before Q8_K: Q2_K 36, Q3_K 2, Q5_K 81, IQ4_XS
     * 34), and only the near-tie bound is held there */
    if (q_int_act_elems(Q_Q2_K, 1) != 256)
        for (int i = 0; i < N; i++)
            if (cases[i].min_equal != STEPS) cases[i].min_equal = 1;
    run_prompt5_cases(cases, N, 2, 0.01);
}

/* ---- log-probabilities on the same tokens ------------------------------------------------- */

#define LP_POS  48 /* positions compared per file */
#define LP_FROM 4  /* the first position (the prompt before it) */
#define LP_TOP  5  /* llama.cpp's most likely tokens compared at each */

typedef struct lp_case {
    const char *spec, *type;
    double tol; /* |log p ringlm - log p llama.cpp| allowed */
} lp_case;

/* The tokens every file is fed (a fixed pseudo-random text over the vocabulary). */
static void lp_tokens(int32_t *t, int n, int vocab)
{
    uint64_t r = 0x9e3779b97f4a7c15ull;
    t[0] = 1;
    for (int i = 1; i < n; i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        t[i] = 3 + (int32_t)(r % (uint64_t)(vocab - 3));
    }
}

/* Each file fed the same tokens by both engines: at each position from LP_FROM, the
 * log-probabilities of llama.cpp's LP_TOP most likely next tokens agree within tol[i]. */
static void logprobs_equal_files(char (*paths)[512], const char *const *labels, const double *tol,
                                 int n)
{
    json_t *arr = json_array();
    int32_t tok[LP_FROM + LP_POS];
    for (int i = 0; i < n; i++) {
        eng_model *m;
        cr_assert_eq(eng_model_load(paths[i], &m), 0, "%s", eng_errmsg());
        lp_tokens(tok, LP_FROM + LP_POS, eng_model_cfg(m)->vocab_size);
        eng_model_free(m);
        json_t *t = json_array();
        for (int k = 0; k < LP_FROM + LP_POS; k++) json_array_append_new(t, json_integer(tok[k]));
        json_array_append_new(arr,
                              json_pack("{s:s, s:o, s:i, s:i, s:i}", "model", paths[i], "tokens", t,
                                        "from", LP_FROM - 1, "top", LP_TOP, "ctx", 256));
    }
    json_t *out = node_oracle("logprobs.mjs", "logprobs", arr, "the llama.cpp oracle");
    cr_assert_eq((int)json_array_size(out), n);
    for (int i = 0; i < n; i++) {
        eng_model *m;
        cr_assert_eq(eng_model_load(paths[i], &m), 0, "%s", eng_errmsg());
        const eng_model_config *c = eng_model_cfg(m);
        lp_tokens(tok, LP_FROM + LP_POS, c->vocab_size);
        eng *e = ts_engine(m, 40, 16, 1);
        float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
        tseq s;
        ts_seq_init(&s, tok, LP_FROM, 0);
        tseq *one[1] = {&s};
        json_t *theirs = json_array_get(out, (size_t)i);
        double worst = 0;
        for (int p = 0; p < LP_POS; p++) {
            int rows = s.n_tokens - s.n_cached;
            cr_assert_eq(ts_step(e, c, one, &rows, 1, logits), 0, "%s", eng_errmsg());
            double mx = -INFINITY, z = 0;
            for (int v = 0; v < c->vocab_size; v++) mx = fmax(mx, logits[v]);
            for (int v = 0; v < c->vocab_size; v++) z += exp(logits[v] - mx);
            const double lz = mx + log(z);
            json_t *top = json_array_get(theirs, (size_t)p);
            cr_assert_eq((int)json_array_size(top), LP_TOP, "%s: position %d", labels[i], p);
            for (int j = 0; j < LP_TOP; j++) {
                json_t *pair = json_array_get(top, (size_t)j);
                const int id = (int)json_integer_value(json_array_get(pair, 0));
                const double want = json_real_value(json_array_get(pair, 1));
                const double got = logits[id] - lz, d = fabs(got - want);
                worst = fmax(worst, d);
                cr_assert_leq(d, tol[i], "%s: position %d, token %d: log p %.5f, llama.cpp %.5f",
                              labels[i], LP_FROM - 1 + p, id, got, want);
            }
            s.tokens[s.n_tokens++] = tok[LP_FROM + p];
        }
        cr_log_info("%s: log-probabilities within %.2g of llama.cpp's (tolerance %.2g)", labels[i],
                    worst, tol[i]);
        free(logits);
        eng_destroy(e);
        eng_model_free(m);
    }
    json_decref(out);
}

/* Every case's file written by ringlm-mkmodel, compared as logprobs_equal_files does. */
static void logprobs_equal(const lp_case *cases, int n)
{
    char(*paths)[512] = calloc((size_t)n, sizeof *paths);
    const char **labels = calloc((size_t)n, sizeof *labels);
    double *tol = calloc((size_t)n, sizeof *tol);
    char(*lab)[128] = calloc((size_t)n, sizeof *lab);
    for (int i = 0; i < n; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/lp-%d.gguf", tmpdir, i);
        export_gguf(cases[i].spec, NULL, cases[i].type, "llama", paths[i]);
        snprintf(lab[i], sizeof lab[i], "%s %s", cases[i].spec, cases[i].type);
        labels[i] = lab[i];
        tol[i] = cases[i].tol;
    }
    logprobs_equal_files(paths, labels, tol, n);
    free(paths);
    free(labels);
    free(tol);
    free(lab);
}

/* Every type's log-probabilities beside llama.cpp's on the same file and tokens. The
 * tolerances are what each type's rounding of the activations allows: F32 none; the 32-element
 * types round them as llama.cpp does (8 bits per 32, Q8_0/Q8_1); the K types and IQ4_XS per
 * 256 as llama.cpp does (Q8_K) below AVX-512, per 32 with AVX-512 VNNI (seen with Q8_K: within
 * 0.011-0.015). */
Test(gguf_oracle, every_type_logprobs_equal_llama_cpp, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 600)
{
    skip_without_node();
    static const lp_case cases[] = {
        {"synthetic:quant-test:17", "F32", 1e-3},    {"synthetic:quant-test:17", "Q8_0", 0.02},
        {"synthetic:quant-test:17", "Q4_0", 0.02},   {"synthetic:quant-test:17", "Q4_1", 0.02},
        {"synthetic:quant-test:17", "Q5_0", 0.02},   {"synthetic:quant-test:17", "Q5_1", 0.02},
        {"synthetic:quant-test:17", "IQ4_NL", 0.02}, {"synthetic:quant-test:17", "Q2_K", 0.03},
        {"synthetic:quant-test:17", "Q3_K", 0.03},   {"synthetic:quant-test:17", "Q4_K", 0.03},
        {"synthetic:quant-test:17", "Q5_K", 0.03},   {"synthetic:quant-test:17", "Q6_K", 0.03},
        {"synthetic:quant-test:17", "IQ4_XS", 0.03},
    };
    logprobs_equal(cases, (int)(sizeof cases / sizeof cases[0]));
}

/* ---- ggml's own dequantization ------------------------------------------------------------ */

static uint64_t dq_rng = 0x2545f4914f6cdd1dull;
static uint32_t dq_next(void)
{
    dq_rng ^= dq_rng << 13;
    dq_rng ^= dq_rng >> 7;
    dq_rng ^= dq_rng << 17;
    return (uint32_t)(dq_rng >> 32);
}

/* Every quantized type ringlm reads, dequantized by ringlm and by ggml's dequantize_row_*
 * (in the library llama.cpp runs on), gives the same floats bit for bit: rows written by
 * ringlm's quantizers and rows of random bytes (every code a block may hold, finite f16
 * scales). This is what says ringlm reads each block layout as llama.cpp does. */
Test(gguf_oracle, dequantization_equals_ggml_bit_for_bit)
{
    void *lib = ggml_base_or_skip();
    static const struct {
        int type;
        const char *fn;
        int d_at, dmin_at; /* offsets of the f16 scales in a block (-1: none) */
    } types[] = {
        {Q_Q8_0, "dequantize_row_q8_0", 0, -1},   {Q_Q4_0, "dequantize_row_q4_0", 0, -1},
        {Q_Q4_1, "dequantize_row_q4_1", 0, 2},    {Q_Q5_0, "dequantize_row_q5_0", 0, -1},
        {Q_Q5_1, "dequantize_row_q5_1", 0, 2},    {Q_IQ4_NL, "dequantize_row_iq4_nl", 0, -1},
        {Q_Q2_K, "dequantize_row_q2_K", 80, 82},  {Q_Q3_K, "dequantize_row_q3_K", 108, -1},
        {Q_Q4_K, "dequantize_row_q4_K", 0, 2},    {Q_Q5_K, "dequantize_row_q5_K", 0, 2},
        {Q_Q6_K, "dequantize_row_q6_K", 208, -1}, {Q_IQ4_XS, "dequantize_row_iq4_xs", 0, -1},
    };
    const int k = 1024, rows = 16;
    float *x = malloc((size_t)k * rows * sizeof *x), *ours = malloc((size_t)k * sizeof *ours);
    float *theirs = malloc((size_t)k * sizeof *theirs);
    unsigned char *q = malloc(q_row_bytes(Q_F32, k) * rows);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        void (*deq)(const void *, float *, int64_t) =
            (void (*)(const void *, float *, int64_t))dlsym(lib, types[t].fn);
        cr_assert_not_null(deq, "%s: %s", types[t].fn, dlerror());
        const size_t rb = q_row_bytes(types[t].type, k),
                     bb = q_row_bytes(types[t].type, q_block_elems(types[t].type));
        for (int r = 0; r < rows; r++) {
            unsigned char *row = q + (size_t)r * rb;
            if (r < rows / 2) { /* ringlm's quantizer */
                for (int i = 0; i < k; i++)
                    x[i] = ((float)(dq_next() % 20001) / 10000.0f - 1.0f) *
                           (i % 61 == 0 ? 5.0f : 1.0f);
                q_quantize_row(types[t].type, x, row, k);
            } else { /* random bytes, finite scales */
                for (size_t i = 0; i < rb; i++) row[i] = (unsigned char)dq_next();
                for (size_t b = 0; b < rb / bb; b++) {
                    uint16_t d = q_f32_to_f16((float)(dq_next() % 1000) * 1e-4f - 0.05f);
                    memcpy(row + b * bb + (size_t)types[t].d_at, &d, 2);
                    if (types[t].dmin_at >= 0) {
                        d = q_f32_to_f16((float)(dq_next() % 1000) * 1e-4f - 0.05f);
                        memcpy(row + b * bb + (size_t)types[t].dmin_at, &d, 2);
                    }
                }
            }
            q_dequant_row(types[t].type, row, ours, k);
            deq(row, theirs, k);
            for (int i = 0; i < k; i++)
                cr_assert(memcmp(&ours[i], &theirs[i], sizeof(float)) == 0,
                          "%s row %d (%s) element %d: ringlm %.9g, ggml %.9g", types[t].fn, r,
                          r < rows / 2 ? "quantized" : "random bytes", i, (double)ours[i],
                          (double)theirs[i]);
        }
    }
    free(x);
    free(ours);
    free(theirs);
    free(q);
    dlclose(lib);
}

/* Every quantizer ringlm-mkmodel writes with gives the bytes ggml's gives the same floats,
 * block for block: the functions llama.cpp's quantizer calls for a tensor without an
 * importance matrix (quantize_q4_K and the rest: the reference rounding for the 32-element
 * types, the scale searches for the K and IQ4 types). Rows: Gaussian at three scales, with an
 * offset (the minimums), with outliers, a row of zeros, a row with zero and constant blocks,
 * tiny values (f16 subnormal scales). */
Test(gguf_oracle, quantization_equals_ggml_byte_for_byte)
{
    void *lib = ggml_base_or_skip();
    const int k = 1024, rows = 24;
    float *x = malloc((size_t)k * sizeof *x);
    unsigned char *ours = malloc(q_row_bytes(Q_F32, k)), *theirs = malloc(q_row_bytes(Q_F32, k));
    for (size_t t = 0; t < GGML_N_QUANTIZERS; t++) {
        const struct ggml_quantizer *q = &ggml_quantizers[t];
        const ggml_quantize_fn quant = ggml_quantizer_fn(lib, q);
        const size_t rb = q_row_bytes(q->type, k);
        dq_rng = 0x9e3779b97f4a7c15ull;
        for (int r = 0; r < rows; r++) {
            const float scale = r % 3 == 0 ? 0.02f : r % 3 == 1 ? 1.0f : 30.0f;
            for (int i = 0; i < k; i++) {
                /* a sum of uniforms: near-Gaussian */
                float g = 0.0f;
                for (int u = 0; u < 4; u++) g += (float)(dq_next() % 20001) * 1e-4f - 1.0f;
                x[i] = g * scale + (r % 4 == 1 ? 0.5f * scale : 0.0f);
                if (r % 5 == 2 && i % 97 == 0) x[i] *= 40.0f;
            }
            if (r == 6) memset(x, 0, (size_t)k * sizeof *x);
            if (r == 7) { /* a zero block of 256, then a constant one */
                memset(x, 0, 256 * sizeof *x);
                for (int i = 256; i < 512; i++) x[i] = 0.25f;
            }
            if (r == 8)
                for (int i = 0; i < k; i++) x[i] *= 1e-6f;
            memset(ours, 0xa5, rb);
            memset(theirs, 0x5a, rb);
            cr_assert_eq(q_quantize_row(q->type, x, ours, k), rb);
            cr_assert_eq(quant(x, theirs, 1, k, NULL), rb, "%s: row bytes", q->fn);
            for (size_t i = 0; i < rb; i++)
                cr_assert(ours[i] == theirs[i],
                          "%s row %d: byte %zu of %zu: ringlm 0x%02x, ggml 0x%02x", q->fn, r, i, rb,
                          ours[i], theirs[i]);
        }
    }
    free(x);
    free(ours);
    free(theirs);
    dlclose(lib);
}

/* ---- ggml's own dots with Q8_K activations ------------------------------------------------ */

/* The CPU backend llama.cpp runs here (node-llama-cpp loads the variant the CPU supports:
 * haswell with AVX2, FMA and BMI2, else the baseline x64 build). */
static void *ggml_cpu_or_skip(const char **variant)
{
    if (system("uname -m | grep -q x86_64") != 0)
        cr_skip_test("node-llama-cpp's x86-64 build only");
    __builtin_cpu_init();
    const bool hsw = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                     __builtin_cpu_supports("bmi2");
    *variant = hsw ? "haswell" : "x64";
    char p[600];
    snprintf(p, sizeof p,
             "%s/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-cpu-%s.so",
             node_dir(), *variant);
    void *lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    if (!lib) cr_skip_test("node-llama-cpp's libggml-cpu-%s.so absent: %s", *variant, dlerror());
    void (*init)(void) = (void (*)(void))dlsym(lib, "ggml_cpu_init");
    cr_assert_not_null(init, "ggml_cpu_init: %s", dlerror());
    init();
    return lib;
}

/* ggml's block_q8_K: d, 256 int8 values, their sums per 16. */
typedef struct ggml_q8k_blk {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
} ggml_q8k_blk;

/* Each K type's row times activations in ringlm's decode path (q_matmul, one activation row)
 * and in ggml's (quantize_row_q8_K, then ggml_vec_dot_<type>_q8_K, what llama.cpp computes
 * for one token): with weights of d = dmin = 1 and activations whose 256s quantize to a scale
 * of 1 (integers with -127 first) both give the exact integer sum, so they are equal to the
 * bit; with quantized Gaussian weights and float activations they agree within float
 * rounding (1e-6 sum |w x|): the same Q8_K rounding, the same integer sums per superblock. */
Test(gguf_oracle, k_type_dots_equal_ggmls)
{
    const char *variant;
    void *lib = ggml_cpu_or_skip(&variant);
    static const struct {
        int type;
        const char *fn;
        int d_at, dmin_at;
    } types[] = {
        {Q_Q2_K, "ggml_vec_dot_q2_K_q8_K", 80, 82},  {Q_Q3_K, "ggml_vec_dot_q3_K_q8_K", 108, -1},
        {Q_Q4_K, "ggml_vec_dot_q4_K_q8_K", 0, 2},    {Q_Q5_K, "ggml_vec_dot_q5_K_q8_K", 0, 2},
        {Q_Q6_K, "ggml_vec_dot_q6_K_q8_K", 208, -1}, {Q_IQ4_XS, "ggml_vec_dot_iq4_xs_q8_K", 0, -1},
    };
    typedef void dot_fn(int, float *, size_t, const void *, size_t, const void *, size_t, int);
    void (*quant)(const float *, void *, int64_t) =
        (void (*)(const float *, void *, int64_t))dlsym(lib, "quantize_row_q8_K");
    cr_assert_not_null(quant, "quantize_row_q8_K: %s", dlerror());
    enum { K = 512, ROWS = 64 };
    float *x = malloc(K * sizeof *x), *wf = malloc(K * sizeof *wf), *dq = malloc(K * sizeof *dq);
    unsigned char *w = malloc(q_row_bytes(Q_F32, K));
    ggml_q8k_blk *xq = malloc(K / 256 * sizeof *xq);
    const uint16_t one = q_f32_to_f16(1.0f);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        dot_fn *dot = (dot_fn *)dlsym(lib, types[t].fn);
        cr_assert_not_null(dot, "%s: %s", types[t].fn, dlerror());
        const size_t rb = q_row_bytes(types[t].type, K), bb = q_row_bytes(types[t].type, 256);
        double worst = 0;
        dq_rng = 0x9e3779b97f4a7c15ull;
        for (int r = 0; r < ROWS; r++) {
            const bool exact = r % 2 == 0;
            if (exact) { /* every code and scale a block may hold; d = dmin = 1 */
                for (size_t i = 0; i < rb; i++) w[i] = (unsigned char)dq_next();
                for (size_t b = 0; b < K / 256; b++) {
                    memcpy(w + b * bb + (size_t)types[t].d_at, &one, 2);
                    if (types[t].dmin_at >= 0)
                        memcpy(w + b * bb + (size_t)types[t].dmin_at, &one, 2);
                }
                for (int i = 0; i < K; i++)
                    x[i] = i % 256 == 0 ? -127.0f : (float)((int)(dq_next() % 9) - 4);
            } else {
                for (int i = 0; i < K; i++) {
                    float g = 0.0f;
                    for (int u = 0; u < 4; u++) g += (float)(dq_next() % 20001) * 1e-4f - 1.0f;
                    wf[i] = g * 0.05f + (r % 4 == 1 ? 0.02f : 0.0f);
                    x[i] = (float)(dq_next() % 20001) * 1e-4f - 1.0f;
                    if (i % 97 == 5) x[i] *= 6.0f;
                }
                q_quantize_row(types[t].type, wf, w, K);
            }
            float ours = 0.0f, theirs = 0.0f;
            /* with AVX-512 VNNI Q4_K and Q6_K take its blocks of 32: their Q8_K rows are the
             * AVX2 ones */
            const bool q8k = q_int_act_elems(types[t].type, 1) == 256;
            const int was = q8k ? 0 : q_isa_cap(Q_ISA_AVX2);
            q_matmul(types[t].type, w, 1, K, x, 1, 0.0f, &ours, 1);
            if (!q8k) q_isa_cap(was);
            quant(x, xq, K);
            dot(K, &theirs, 0, w, 0, xq, 0, 1);
            if (exact) {
                cr_assert(ours == theirs && theirs == rintf(theirs),
                          "%s row %d (integer sums): ringlm %.9g, ggml (%s) %.9g", types[t].fn, r,
                          (double)ours, variant, (double)theirs);
                continue;
            }
            q_dequant_row(types[t].type, w, dq, K);
            double mag = 0;
            for (int i = 0; i < K; i++) mag += fabs((double)dq[i] * x[i]);
            const double rel = fabs((double)ours - theirs) / mag;
            worst = fmax(worst, rel);
            cr_assert_leq(rel, 1e-6, "%s row %d: ringlm %.9g, ggml (%s) %.9g (sum |w x| %.4g)",
                          types[t].fn, r, (double)ours, variant, (double)theirs, mag);
        }
        cr_log_info("%s: ringlm's decode dots equal ggml's (%s): integer sums to the bit, "
                    "within %.2g sum |w x| on quantized rows",
                    types[t].fn, variant, worst);
    }
    free(x);
    free(wf);
    free(dq);
    free(w);
    free(xq);
    dlclose(lib);
}

/* ---- re-quantization beside llama.cpp's quantizer ---------------------------------------- */

/* ringlm-mkmodel's re-quantizer gives every tensor the type llama.cpp's quantizer gives it,
 * and the same bytes (no importance matrix on either side):
 * under every mix on quant-gqa (16 layers, 4 query heads per KV head: the layer- and
 * GQA-dependent rules), and under six on quant-test (2 layers), stories15M (rows of 288: the
 * fallbacks) and a qwen3moe of 8 experts (its own rules). */
Test(gguf_oracle, requantized_types_equal_llama_quantize, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 600)
{
    llq q;
    llq_open(&q);
    static const struct {
        const char *spec, *arch;
        int head_dim;
        bool all; /* every mix (else those with their own rules for it) */
    } shapes[] = {
        {"synthetic:quant-gqa:19", "llama", 0, true},
        {"synthetic:quant-test:17", "llama", 0, false},
        {"synthetic:stories15M:18", "llama", 0, false},
        {"synthetic:quant-test:15", "qwen3moe", 128, false},
    };
    static const char *const some[] = {"Q4_K_M", "Q3_K_M", "Q2_K", "Q4_0", "IQ4_XS", "Q5_K_S"};
    int compared = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        char f32[512];
        snprintf(f32, sizeof f32, "%s/shape-%zu-f32.gguf", tmpdir, s);
        export_gguf_heads(shapes[s].spec, NULL, "F32", shapes[s].arch, shapes[s].head_dim, f32);
        for (size_t x = 0; x < sizeof llq_mixes / sizeof llq_mixes[0]; x++) {
            bool run = shapes[s].all;
            for (size_t j = 0; j < sizeof some / sizeof some[0]; j++)
                run = run || strcmp(some[j], llq_mixes[x].mix) == 0;
            if (!run) continue;
            char theirs[512], ours[512], note[4096];
            snprintf(theirs, sizeof theirs, "%s/theirs.gguf", tmpdir);
            snprintf(ours, sizeof ours, "%s/ours.gguf", tmpdir);
            llq_run(&q, f32, theirs, llq_mixes[x].ftype, NULL);
            cr_assert_eq(gw_requantize(f32, ours, llq_mixes[x].mix, note, sizeof note), 0, "%s",
                         eng_errmsg());
            char what[160];
            snprintf(what, sizeof what, "%s %s %s", shapes[s].spec, shapes[s].arch,
                     llq_mixes[x].mix);
            /* the same types, and the same bytes: the quantizers run llama.cpp's searches */
            compared += llq_assert_same_tensors(what, theirs, ours);
        }
    }
    cr_log_info("re-quantizer: %d tensors typed and written as llama.cpp's quantizer writes them",
                compared);
    dlclose(q.lib);
}

/* A model written straight into one of llama.cpp's mixes (ringlm-mkmodel --model
 * synthetic:... --type Q3_K_M) is what llama.cpp's quantizer makes of the same model in F32:
 * every tensor the type the mix gives it and the same bytes, on a llama and a qwen3moe shape;
 * the F32 file it goes through is not left behind; a name that is neither a type nor a mix
 * is refused naming both lists. */
Test(gguf_oracle, models_written_in_a_mix_equal_llama_quantize, .init = mk_tmpdir,
     .fini = rm_tmpdir, .timeout = 600)
{
    llq q;
    llq_open(&q);
    static const struct {
        const char *spec, *arch;
        int head_dim;
    } shapes[] = {
        {"synthetic:quant-gqa:19", "llama", 0},
        {"synthetic:quant-test:15", "qwen3moe", 128},
    };
    static const char *const mixes[] = {"Q4_K_M", "Q3_K_M", "Q5_K_M", "Q4_K_S", "Q3_K_L"};
    int compared = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        char f32[512];
        snprintf(f32, sizeof f32, "%s/shape-%zu-f32.gguf", tmpdir, s);
        export_gguf_heads(shapes[s].spec, NULL, "F32", shapes[s].arch, shapes[s].head_dim, f32);
        for (size_t x = 0; x < sizeof mixes / sizeof mixes[0]; x++) {
            char theirs[512], ours[512], what[160];
            snprintf(theirs, sizeof theirs, "%s/theirs.gguf", tmpdir);
            snprintf(ours, sizeof ours, "%s/ours.gguf", tmpdir);
            llq_run(&q, f32, theirs, llq_ftype(mixes[x]), NULL);
            export_gguf_heads(shapes[s].spec, NULL, mixes[x], shapes[s].arch, shapes[s].head_dim,
                              ours);
            snprintf(what, sizeof what, "%s %s written as %s", shapes[s].spec, shapes[s].arch,
                     mixes[x]);
            compared += llq_assert_same_tensors(what, theirs, ours);
        }
    }
    /* nothing but the files above in the directory: the F32 go-betweens are gone */
    DIR *d = opendir(tmpdir);
    cr_assert_not_null(d);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        cr_assert(!strstr(e->d_name, ".f32-"), "left behind: %s", e->d_name);
        files++;
    }
    closedir(d);
    cr_assert_eq(files, 4, "%d files in the test directory", files);
    eng_model *m;
    cr_assert_eq(eng_model_load("synthetic:quant-test:15", &m), 0, "%s", eng_errmsg());
    char out[512], note[256];
    snprintf(out, sizeof out, "%s/q7.gguf", tmpdir);
    const gw_export_opts o = {.type = "Q7_K"};
    cr_assert_eq(gw_export_model(m, out, &o, note, sizeof note), -EINVAL);
    cr_assert(strstr(eng_errmsg(), "--type Q7_K: not supported (F32") &&
                  strstr(eng_errmsg(), "Q5_K_M)"),
              "%s", eng_errmsg());
    cr_assert_neq(access(out, F_OK), 0, "nothing written");
    eng_model_free(m);
    cr_log_info("models written in a mix: %d tensors typed and written as llama.cpp's", compared);
    dlclose(q.lib);
}

/* The rules llama.cpp keys on a 70B model (a llama file of 80 layers with grouped-query
 * attention, a qwen2 file of 80 layers): attn_v that a mix puts in Q3_K or Q4_K is Q5_K, on
 * top of the 4-query-heads-per-KV-head rules (attn_v Q4_K under Q2_K, Q5_K under IQ4_XS).
 * quant-70b (80 layers of 256-wide rows, 8 query heads per KV head) re-quantized by both
 * quantizers: the same types and bytes; and the rule shows in the types. */
Test(gguf_oracle, requantized_70b_shapes_equal_llama_quantize, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 600)
{
    llq q;
    llq_open(&q);
    static const struct {
        const char *arch, *mix;
        int attn_v; /* blk.40.attn_v.weight's type */
    } cases[] = {
        {"llama", "Q2_K", Q_Q5_K},   {"llama", "Q3_K_S", Q_Q5_K}, {"llama", "Q4_K_M", Q_Q5_K},
        {"llama", "IQ4_XS", Q_Q5_K}, {"qwen2", "Q3_K_M", Q_Q5_K},
    };
    char f32[512], theirs[512], ours[512], note[4096];
    snprintf(theirs, sizeof theirs, "%s/theirs.gguf", tmpdir);
    snprintf(ours, sizeof ours, "%s/ours.gguf", tmpdir);
    const char *made = "";
    int compared = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(f32, sizeof f32, "%s/70b-%s-f32.gguf", tmpdir, cases[i].arch);
        if (strcmp(made, cases[i].arch) != 0) {
            export_gguf("synthetic:quant-70b:23", NULL, "F32", cases[i].arch, f32);
            made = cases[i].arch;
        }
        llq_run(&q, f32, theirs, llq_ftype(cases[i].mix), NULL);
        cr_assert_eq(gw_requantize(f32, ours, cases[i].mix, note, sizeof note), 0, "%s",
                     eng_errmsg());
        char what[96];
        snprintf(what, sizeof what, "quant-70b %s %s", cases[i].arch, cases[i].mix);
        compared += llq_assert_same_tensors(what, theirs, ours);
        gguf_file *g;
        cr_assert_eq(gguf_open(ours, &g), 0, "%s", gguf_errmsg());
        const gguf_tensor *t = gguf_tensor_find(g, "blk.40.attn_v.weight");
        cr_assert(t && (int)t->type == cases[i].attn_v, "%s: blk.40.attn_v.weight is %s", what,
                  t ? gguf_type_name(t->type) : "absent");
        gguf_close(g);
    }
    cr_log_info("re-quantizer, 70B shape: %d tensors typed and written as llama.cpp's", compared);
    dlclose(q.lib);
}

/* llama.cpp's IQ1/IQ2/IQ3 mixes are refused naming what is built, nothing written. */
Test(gguf_oracle, iq1_iq2_iq3_mixes_are_refused_by_name, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    char f32[512], out[512], note[4096];
    snprintf(f32, sizeof f32, "%s/f32.gguf", tmpdir);
    snprintf(out, sizeof out, "%s/out.gguf", tmpdir);
    export_gguf("synthetic:quant-test:17", NULL, "F32", "llama", f32);
    static const char *const iq[] = {"IQ1_S", "IQ1_M",   "IQ2_XXS", "IQ2_XS", "IQ2_S",
                                     "IQ2_M", "IQ3_XXS", "IQ3_XS",  "IQ3_S",  "IQ3_M"};
    for (size_t i = 0; i < sizeof iq / sizeof iq[0]; i++) {
        cr_assert_eq(gw_requantize(f32, out, iq[i], note, sizeof note), -EINVAL, "%s", iq[i]);
        cr_assert(strstr(eng_errmsg(), "IQ1, IQ2 and IQ3 mixes are not built here") &&
                      strstr(eng_errmsg(), "Q4_K_M") && strstr(eng_errmsg(), "IQ4_XS"),
                  "%s: %s", iq[i], eng_errmsg());
        cr_assert_neq(access(out, F_OK), 0, "%s: nothing written", iq[i]);
    }
    cr_assert_eq(gw_requantize(f32, out, "Q7_K", note, sizeof note), -EINVAL);
    cr_assert(strstr(eng_errmsg(), "--type Q7_K: not a re-quantization mix (the mixes: F32"), "%s",
              eng_errmsg());
}

/* The files of both quantizers, each mix, in both engines: llama.cpp's quantizer's output
 * (its own quantizers' rounding) loads in ringlm and ringlm-mkmodel's in llama.cpp, and the
 * log-probabilities agree as every_type_logprobs_equal_llama_cpp's do. */
Test(gguf_oracle, requantized_files_load_in_both_engines, .init = mk_tmpdir, .fini = rm_tmpdir,
     .timeout = 600)
{
    skip_without_node();
    llq q;
    llq_open(&q);
    static const char *const mixes[] = {"Q4_K_M", "Q5_K_M", "Q3_K_M", "Q2_K", "Q4_0", "IQ4_XS"};
    enum { NM = sizeof mixes / sizeof mixes[0], N = 2 * NM };
    char f32[512];
    snprintf(f32, sizeof f32, "%s/f32.gguf", tmpdir);
    export_gguf("synthetic:quant-test:17", NULL, "F32", "llama", f32);
    char(*paths)[512] = calloc(N, sizeof *paths);
    char lab[N][64];
    const char *labels[N];
    double tol[N];
    for (int i = 0; i < NM; i++) {
        int ft = -1;
        for (size_t x = 0; x < sizeof llq_mixes / sizeof llq_mixes[0]; x++)
            if (strcmp(llq_mixes[x].mix, mixes[i]) == 0) ft = llq_mixes[x].ftype;
        snprintf(paths[2 * i], sizeof paths[0], "%s/llama-%s.gguf", tmpdir, mixes[i]);
        llq_run(&q, f32, paths[2 * i], ft, NULL);
        snprintf(lab[2 * i], sizeof lab[0], "llama.cpp's %s", mixes[i]);
        snprintf(paths[2 * i + 1], sizeof paths[0], "%s/ringlm-%s.gguf", tmpdir, mixes[i]);
        char note[4096];
        cr_assert_eq(gw_requantize(f32, paths[2 * i + 1], mixes[i], note, sizeof note), 0, "%s",
                     eng_errmsg());
        snprintf(lab[2 * i + 1], sizeof lab[0], "ringlm's %s", mixes[i]);
        for (int j = 0; j < 2; j++) {
            labels[2 * i + j] = lab[2 * i + j];
            tol[2 * i + j] = 0.03; /* each mix holds K types (Q4_0: its Q6_K classifier) */
        }
    }
    logprobs_equal_files(paths, labels, tol, N);
    free(paths);
    dlclose(q.lib);
}
