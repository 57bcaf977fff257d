/* SPDX-License-Identifier: MIT */
/*
 * ringlm-run — run a model offline in one process through the engine, with the same
 * semantics as llama2.c's run.c generate(): steps count positions including the prompt
 * (0 or more than seq_len means seq_len), the prompt is forced, generation stops when BOS
 * is chosen, stdout is the decoded text plus a final newline, speed goes to stderr.
 *
 * Unlike run.c it goes through the paged KV cache: the prompt is prefilled as one batch,
 * then one row per step is decoded. It is a first check of a model file without a daemon
 * and the engine's profiling target.
 */
#include "kernels/engine.h"
#include "model/tokenizer.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: ringlm-run --model M [--tokenizer T] [--prompt P] [--steps N]\n"
               "                  [--temperature F] [--top-k K] [--top-p F] [--seed S]\n"
               "                  [--threads N] [--backend cpu|cuda] [--block-size N]\n"
               "                  [--cuda-device N] [--cuda-dtype bf16|fp32] [--no-cuda-graphs]\n"
               "  --model M        llama2.c checkpoint, GGUF file, or synthetic:PRESET:SEED\n"
               "  --tokenizer T    llama2.c tokenizer.bin or GGUF file (default: the model's GGUF\n"
               "                   file, else tokenizer.bin)\n"
               "  --prompt P       text to start from (default empty)\n"
               "  --steps N        positions to run, prompt included; 0 = seq_len (default 256)\n"
               "  --temperature F  0 = greedy (default 1.0); --top-p default 0.9, --top-k 0 (off)\n"
               "  --seed S         sampling seed (default: time)\n"
               "  --threads N      CPU worker threads (default 1)\n"
               "  --cuda-device N  CUDA device ordinal (default 0)\n"
               "  --cuda-dtype D   CUDA compute type: bf16 (default; f16 for an all-F16 GGUF\n"
               "                   file) or fp32 (every matrix in float32, a diagnostic)\n"
               "  --no-cuda-graphs CUDA decode steps run eagerly, not as CUDA graphs\n"
               "  --version, --help\n");
}

static bool is_stop(const int32_t *stop, int n, int token)
{
    for (int i = 0; i < n; i++)
        if (stop[i] == token) return true;
    return false;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_int(const char *name, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "ringlm-run: --%s \"%s\": expected an integer %ld..%ld\n", name, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *name, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= 0.0f)) {
        fprintf(stderr, "ringlm-run: --%s \"%s\": expected a number >= 0\n", name, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* One forward pass over rows [0, n) at positions pos0.. of the single sequence, logits of
 * the last row if want_logits. */
/* Rows pos0 .. pos0 + n - 1 of the one sequence, whose prompt is n_prompt tokens long: its
 * rows below that are prompt rows (eng_batch.prompt_len), as ringlmd marks them, so both give
 * the same tokens for a seed (RINGLM_PREFILL_GEMM=own: every row in exact float32). */
static int forward(eng *e, const int32_t *tokens, int n, int pos0, int32_t n_prompt,
                   const int32_t *table, int table_len, int block_size, int32_t *positions,
                   int64_t *slots, bool want_logits, float *logits)
{
    for (int i = 0; i < n; i++) {
        int pos = pos0 + i;
        positions[i] = pos;
        slots[i] = (int64_t)table[pos / block_size] * block_size + pos % block_size;
    }
    int32_t query_start[2] = {0, n}, seq_len = pos0 + n, last = n - 1;
    eng_batch b = {
        .n_tokens = n,
        .tokens = tokens,
        .positions = positions,
        .slot_mapping = slots,
        .n_seqs = 1,
        .query_start = query_start,
        .seq_len = &seq_len,
        .block_table = table,
        .block_table_stride = table_len,
        .n_logits = want_logits ? 1 : 0,
        .logits_rows = &last,
        .prompt_len = &n_prompt,
    };
    return eng_execute(e, &b, logits);
}

int main(int argc, char **argv)
{
    const char *model_spec = NULL, *tok_path = NULL, *prompt = "";
    const char *backend = "cpu";
    long steps = 256, threads = 1, block_size = 16, top_k = 0, cuda_device = 0;
    int cuda_dtype = ENG_CUDA_DTYPE_BF16;
    bool cuda_no_graphs = false;
    float temperature = 1.0f, top_p = 0.9f;
    unsigned long long seed = (unsigned long long)time(NULL);
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"tokenizer", required_argument, 0, 'z'},
                                         {"prompt", required_argument, 0, 'i'},
                                         {"steps", required_argument, 0, 'n'},
                                         {"temperature", required_argument, 0, 't'},
                                         {"top-p", required_argument, 0, 'p'},
                                         {"top-k", required_argument, 0, 'k'},
                                         {"seed", required_argument, 0, 's'},
                                         {"threads", required_argument, 0, 'j'},
                                         {"backend", required_argument, 0, 'b'},
                                         {"block-size", required_argument, 0, 'B'},
                                         {"cuda-device", required_argument, 0, 'D'},
                                         {"cuda-dtype", required_argument, 0, 'T'},
                                         {"no-cuda-graphs", no_argument, 0, 'G'},
                                         {"help", no_argument, 0, 'h'},
                                         {"version", no_argument, 0, 'V'},
                                         {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "m:z:i:n:t:p:k:s:j:b:B:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': model_spec = optarg; break;
        case 'z': tok_path = optarg; break;
        case 'i': prompt = optarg; break;
        case 'n':
            if (parse_int("steps", optarg, 0, 1 << 30, &steps)) return 2;
            break;
        case 't':
            if (parse_float("temperature", optarg, &temperature)) return 2;
            break;
        case 'p':
            if (parse_float("top-p", optarg, &top_p)) return 2;
            break;
        case 'k':
            if (parse_int("top-k", optarg, 0, 1 << 30, &top_k)) return 2;
            break;
        case 's': {
            char *end;
            errno = 0;
            seed = strtoull(optarg, &end, 0);
            if (errno || end == optarg || *end) {
                fprintf(stderr, "ringlm-run: --seed \"%s\": expected an unsigned integer\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'j':
            if (parse_int("threads", optarg, 1, 1024, &threads)) return 2;
            break;
        case 'b': backend = optarg; break;
        case 'B':
            if (parse_int("block-size", optarg, 1, 4096, &block_size)) return 2;
            break;
        case 'D':
            if (parse_int("cuda-device", optarg, 0, 1024, &cuda_device)) return 2;
            break;
        case 'T':
            if ((cuda_dtype = eng_cuda_dtype_parse(optarg)) < 0) {
                fprintf(stderr, "ringlm-run: --cuda-dtype \"%s\": expected bf16 or fp32\n", optarg);
                return 2;
            }
            break;
        case 'G': cuda_no_graphs = true; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("ringlm-run %s\n", RINGLM_VERSION); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!model_spec || optind != argc) {
        usage(stderr);
        return 2;
    }

    int rc = 1, err;
    eng_model *model = NULL;
    tok_tokenizer *tok = NULL;
    eng *e = NULL;
    int32_t *prompt_tokens = NULL, *table = NULL, *positions = NULL;
    int64_t *slots = NULL;
    float *logits = NULL;
    if ((err = eng_model_load(model_spec, &model))) {
        fprintf(stderr, "ringlm-run: model: %s\n", eng_errmsg());
        goto out;
    }
    const eng_model_config *cfg = eng_model_cfg(model);
    /* A GGUF file carries its vocabulary; a llama2.c checkpoint needs tokenizer.bin. */
    if (!tok_path)
        tok_path = eng_model_gguf_path(model) ? eng_model_gguf_path(model) : "tokenizer.bin";
    int32_t stop[4];
    int n_stop = eng_model_stop_tokens(model, stop, 4);
    n_stop = n_stop > 4 ? 4 : n_stop;
    if ((err = tok_load(tok_path, cfg->vocab_size, &tok))) {
        fprintf(stderr, "ringlm-run: tokenizer: %s\n", tok_errmsg());
        goto out;
    }
    /* steps end at the model's context: said when the run ends there */
    const bool to_context = steps == 0 || steps >= cfg->seq_len;
    if (steps == 0 || steps > cfg->seq_len) steps = cfg->seq_len;

    size_t bound = tok_encode_bound(prompt);
    prompt_tokens = malloc(bound * sizeof *prompt_tokens);
    if (!prompt_tokens) goto oom;
    int n_prompt = tok_encode(tok, prompt, tok_add_bos(tok) || !*prompt, tok_add_eos(tok),
                              prompt_tokens, (int)bound);
    if (n_prompt < 1) {
        fprintf(stderr, "ringlm-run: prompt: %s\n", tok_errmsg());
        goto out;
    }

    int table_len = (cfg->seq_len + (int)block_size - 1) / (int)block_size;
    eng_options opt = {
        .backend = backend,
        .n_threads = (int)threads,
        .numa_node = -1,
        .kv_blocks = table_len,
        .kv_block_size = (int)block_size,
        .max_batch_tokens = cfg->seq_len,
        .max_seqs = 1,
        .cuda_device = (int)cuda_device,
        .cuda_dtype = (eng_cuda_dtype)cuda_dtype,
        .cuda_no_graphs = cuda_no_graphs,
    };
    if ((err = eng_create(model, &opt, &e))) {
        fprintf(stderr, "ringlm-run: engine: %s\n", eng_errmsg());
        goto out;
    }
    table = malloc((size_t)table_len * sizeof *table);
    positions = malloc((size_t)cfg->seq_len * sizeof *positions);
    slots = malloc((size_t)cfg->seq_len * sizeof *slots);
    logits = malloc((size_t)cfg->vocab_size * sizeof *logits);
    if (!table || !positions || !slots || !logits) goto oom;
    for (int j = 0; j < table_len; j++) table[j] = j;
    eng_sampling sampling = {
        .temperature = temperature, .top_k = (int)top_k, .top_p = top_p, .seed = seed};
    uint64_t rng = eng_rng_init(seed);

    /* Prefill: the prompt tokens whose positions fall inside steps, as one batch; the last
     * one's logits are needed only when a token is sampled after the prompt. */
    int n_prefill = n_prompt < steps ? n_prompt : (int)steps;
    if (n_prompt > steps)
        fprintf(stderr, "ringlm-run: the prompt is %d tokens: only the first %ld are run (%s)\n",
                n_prompt, steps, to_context ? "the model's context length" : "--steps");
    bool sample_after = n_prompt <= steps;
    double t0 = now_s();
    if ((err = forward(e, prompt_tokens, n_prefill, 0, n_prompt, table, table_len, (int)block_size,
                       positions, slots, sample_after, logits))) {
        fprintf(stderr, "ringlm-run: prefill: %s\n", eng_errmsg());
        goto out;
    }
    double t_prefill = now_s() - t0;

    int token = prompt_tokens[0], pos = 0, decoded = 0;
    bool hit_context = false; /* the run ended at the model's context, not at a stop token */
    double t_decode0 = now_s();
    for (; pos < n_prefill - (sample_after ? 1 : 0); pos++) { /* forced prompt tokens */
        int next = prompt_tokens[pos + 1];
        if (is_stop(stop, n_stop, next)) goto done;
        fputs(tok_decode(tok, token, next), stdout);
        token = next;
    }
    fflush(stdout);
    t_decode0 = now_s();
    while (pos < steps) {
        if (pos >= n_prefill) { /* logits of pos come from one more decode step */
            int32_t in = token;
            if ((err = forward(e, &in, 1, pos, n_prompt, table, table_len, (int)block_size,
                               positions, slots, true, logits))) {
                fprintf(stderr, "ringlm-run: decode at position %d: %s\n", pos, eng_errmsg());
                goto out;
            }
            decoded++;
        }
        int next = eng_sample(logits, cfg->vocab_size, &sampling, &rng);
        pos++;
        if (is_stop(stop, n_stop, next)) break;
        fputs(tok_decode(tok, token, next), stdout);
        fflush(stdout);
        token = next;
    }
    hit_context = pos >= steps && to_context;
done:
    printf("\n");
    fflush(stdout);
    if (hit_context)
        fprintf(stderr,
                "ringlm-run: stopped at the model's context length, %d tokens (%s): the model "
                "sees no further\n",
                cfg->seq_len, model_spec);
    double t_decode = now_s() - t_decode0;
    fprintf(stderr, "prefill: %d tokens in %.1f ms (%.0f tok/s); ", n_prefill, t_prefill * 1e3,
            t_prefill > 0 ? n_prefill / t_prefill : 0.0);
    if (decoded > 0 && t_decode > 0)
        fprintf(stderr, "achieved tok/s: %f (decode, %d steps)\n", decoded / t_decode, decoded);
    else
        fprintf(stderr, "no decode steps\n");
    eng_phase_stats ps;
    if (eng_phase_stats_get(e, &ps, false) == 0 && ps.steps)
        fprintf(
            stderr, "engine: %llu steps, projections %.1f ms, attention %.1f ms, other %.1f ms\n",
            (unsigned long long)ps.steps, ps.proj_ns / 1e6, ps.attn_ns / 1e6, ps.other_ns / 1e6);
    rc = 0;
    goto out;
oom:
    fprintf(stderr, "ringlm-run: out of memory\n");
out:
    free(prompt_tokens);
    free(table);
    free(positions);
    free(slots);
    free(logits);
    eng_destroy(e);
    tok_free(tok);
    eng_model_free(model);
    return rc;
}
