/* SPDX-License-Identifier: MIT */
/*
 * ringlm-mkmodel — writes a model file, usually from a synthetic model, so that every tool
 * (and llama2.c's run.c, or llama.cpp) can load the very same weights:
 *
 *   ringlm-mkmodel --model synthetic:stories15M:7 --out s15m.bin
 *   ringlm-mkmodel --model stories260K.bin --tokenizer tok512.bin --format gguf --type Q8_0 \
 *                  --out s260k-q8.gguf
 *
 * llama2c (default): the legacy checkpoint; loading it gives the same logits as the
 * in-memory synthetic model; a lazy spec (synthetic:lazy:...) is generated tensor by tensor
 * while writing. gguf: llama.cpp's layout with every matrix in --type (F32 F16 BF16 Q8_0
 * Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL IQ4_XS Q2_K Q3_K Q4_K Q5_K Q6_K), or in the types one of
 * llama.cpp's mixes (Q4_K_M, Q3_K_M, Q5_K_M, ...: written in F32, then re-quantized as
 * below) gives each tensor, --arch llama, qwen2, qwen3, gemma2, gemma3, phi3 or qwen3moe (8 synthetic
 * experts of half the FFN width, 2 per token) (--head-dim N: a synthetic
 * model's attention in heads of N, as Qwen3's 128 over a narrower width; --sliding-window N:
 * the attention window of the layers that have one), and the vocabulary of --tokenizer (a llama2.c
 * tokenizer.bin) or --vocab (a Hugging Face tokenizer.json); --placeholder-vocab writes a
 * synthetic SentencePiece one ("t5", "t6", ...: the file loads, but no text means anything),
 * and only when asked: a model file whose vocabulary is made up must not be written by
 * leaving an option out.
 *
 *   ringlm-mkmodel --model in-f16.gguf --format gguf --type Q4_K_M --out out-q4km.gguf
 *
 * re-quantizes a GGUF file under one of llama.cpp's type mixes (kernels/gguf_requant.h): its
 * vocabulary, architecture and metadata are its own.
 */
#include "kernels/engine.h"
#include "kernels/gguf_export.h"
#include "kernels/mkmodel_hf.h"
#include "kernels/gguf_requant.h"
#include "model/tokenizer.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: ringlm-mkmodel --model SPEC --out FILE [--format llama2c|gguf]\n"
    "                      [--type TYPE|MIX]\n"
    "                      [--arch llama|qwen2|qwen3|gemma2|gemma3|phi3|qwen3moe]\n"
    "                      [--head-dim N] [--sliding-window N]\n"
    "                      (--tokenizer TOKENIZER.bin | --vocab tokenizer.json\n"
    "                       [--vocab-config tokenizer_config.json] | --placeholder-vocab)\n"
    "       ringlm-mkmodel --from-hf DIR --out FILE.gguf [--type F32|F16|BF16]\n"
    "       ringlm-mkmodel --model IN.gguf --format gguf --type MIX [--imatrix FILE]\n"
    "                      --out OUT.gguf\n"
    "       ringlm-mkmodel --version | --help\n"
    "  SPEC: synthetic:PRESET:SEED (presets: stories15M stories110M llama3-8b gqa-test\n"
    "        stories260K quant-test quant-gqa quant-70b vocab-llama3 vocab-qwen3\n"
    "        vocab-llama2) or a llama2.c checkpoint\n"
    "  --vocab: a Hugging Face tokenizer.json (byte-level BPE of Llama 3 or Qwen2, or\n"
    "        SentencePiece-like BPE of Llama 2); the model's vocabulary must hold it\n"
    "  --head-dim N: attention heads of N elements (synthetic models: Q/K/V/O generated\n"
    "        in that shape), where a real model's heads are not dim / n_heads\n"
    "  --sliding-window N: the window of gemma's local layers (every layer's for llama)\n"
    "  --placeholder-vocab: a synthetic vocabulary (byte tokens, then \"tN\" pieces), for\n"
    "        weights-only work (benchmarks, engine comparisons) where no text is encoded\n"
    "  --format gguf needs one of --tokenizer, --vocab and --placeholder-vocab\n"
    "  TYPE: every matrix in F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL IQ4_XS Q2_K\n"
    "        Q3_K Q4_K Q5_K Q6_K; MIX (Q2_K_S Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S\n"
    "        Q5_K_M): each tensor in the type llama.cpp's mix gives it (as below)\n"
    "  IN.gguf re-quantized under llama.cpp's mix MIX: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0\n"
    "        Q5_1 IQ4_NL IQ4_XS Q2_K Q2_K_S (needs --imatrix) Q3_K_S Q3_K_M Q3_K_L Q4_K_S\n"
    "        Q4_K_M Q5_K_S Q5_K_M Q6_K, or Q3_K Q4_K Q5_K (every matrix in that type); not\n"
    "        the IQ1/IQ2/IQ3 mixes\n"
    "  --imatrix FILE: llama-imatrix's importance matrix (GGUF or legacy .dat), as\n"
    "        llama-quantize --imatrix reads it\n";

int main(int argc, char **argv)
{
    if (mkmodel_wants_hf(argc, argv)) return mkmodel_from_hf(argc, argv);
    const char *spec = NULL, *out = NULL, *format = "llama2c", *type = NULL, *arch = NULL;
    const char *tok_path = NULL, *vocab_path = NULL, *vocab_cfg = NULL, *imatrix = NULL;
    int placeholder = 0, head_dim = 0, window = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"out", required_argument, 0, 'o'},
                                         {"format", required_argument, 0, 'f'},
                                         {"type", required_argument, 0, 't'},
                                         {"arch", required_argument, 0, 'a'},
                                         {"tokenizer", required_argument, 0, 'z'},
                                         {"vocab", required_argument, 0, 'v'},
                                         {"vocab-config", required_argument, 0, 'c'},
                                         {"placeholder-vocab", no_argument, 0, 'P'},
                                         {"head-dim", required_argument, 0, 'H'},
                                         {"sliding-window", required_argument, 0, 'W'},
                                         {"imatrix", required_argument, 0, 'I'},
                                         {"help", no_argument, 0, 'h'},
                                         {"version", no_argument, 0, 'V'},
                                         {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "m:o:f:t:a:z:v:c:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': spec = optarg; break;
        case 'o': out = optarg; break;
        case 'f': format = optarg; break;
        case 't': type = optarg; break;
        case 'a': arch = optarg; break;
        case 'z': tok_path = optarg; break;
        case 'v': vocab_path = optarg; break;
        case 'c': vocab_cfg = optarg; break;
        case 'P': placeholder = 1; break;
        case 'I': imatrix = optarg; break;
        case 'H': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 2 || v > 65536) {
                fprintf(stderr, "ringlm-mkmodel: --head-dim %s: expected an even count\n", optarg);
                return 2;
            }
            head_dim = (int)v;
            break;
        }
        case 'W': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 1 || v > (1 << 20)) {
                fprintf(stderr, "ringlm-mkmodel: --sliding-window %s: expected a count\n", optarg);
                return 2;
            }
            window = (int)v;
            break;
        }
        case 'V': printf("ringlm-mkmodel %s\n", RINGLM_VERSION); return 0;
        default: fputs(usage, ch == 'h' ? stdout : stderr); return ch == 'h' ? 0 : 2;
        }
    }
    bool gguf = strcmp(format, "gguf") == 0;
    bool gguf_only =
        type || arch || head_dim || window || tok_path || vocab_path || vocab_cfg || placeholder;
    int vocabs = !!tok_path + !!vocab_path + placeholder;
    if (!spec || !out || optind != argc || (!gguf && strcmp(format, "llama2c") != 0) ||
        (!gguf && gguf_only) || vocabs > 1 || (vocab_cfg && !vocab_path)) {
        fputs(usage, stderr);
        if (!gguf && gguf_only)
            fputs("  (--type, --arch, --head-dim, --tokenizer, --vocab and --placeholder-vocab go "
                  "with "
                  "--format gguf)\n",
                  stderr);
        if (vocabs > 1)
            fputs("  (--tokenizer, --vocab and --placeholder-vocab are alternatives)\n", stderr);
        return 2;
    }
    const size_t spec_len = strlen(spec);
    if (gguf && spec_len > 5 && strcmp(spec + spec_len - 5, ".gguf") == 0) {
        if (vocabs || arch || head_dim || window || vocab_cfg || !type) {
            fprintf(stderr,
                    "ringlm-mkmodel: --model %s: a GGUF file is re-quantized: give "
                    "--type MIX; its vocabulary and architecture are its own\n",
                    spec);
            return 2;
        }
        char note[4096];
        if (gw_requantize_imatrix(spec, out, type, imatrix, note, sizeof note)) {
            fprintf(stderr, "ringlm-mkmodel: %s\n", eng_errmsg());
            return 1;
        }
        fprintf(stderr, "ringlm-mkmodel: wrote %s (%s re-quantized %s%s%s: %s)\n", out, spec, type,
                imatrix ? " with the importance matrix " : "", imatrix ? imatrix : "", note);
        return 0;
    }
    if (imatrix) {
        fprintf(stderr, "ringlm-mkmodel: --imatrix goes with re-quantizing a GGUF file "
                        "(--model IN.gguf --format gguf --type MIX)\n");
        return 2;
    }
    if (gguf && vocabs == 0) {
        fprintf(stderr,
                "ringlm-mkmodel: --format gguf: no vocabulary given; name the model's with "
                "--tokenizer TOKENIZER.bin or --vocab tokenizer.json, or ask for a synthetic "
                "one with --placeholder-vocab (no text encodes meaningfully with it)\n");
        return 2;
    }
    eng_model *m;
    if (eng_model_load(spec, &m)) {
        fprintf(stderr, "ringlm-mkmodel: %s\n", eng_errmsg());
        return 1;
    }
    const eng_model_config *c = eng_model_cfg(m);
    int err;
    char note[1024] = "";
    if (gguf) {
        tok_tokenizer *tok = NULL;
        const char **pieces = NULL;
        float *scores = NULL;
        if (tok_path) {
            if (tok_load(tok_path, c->vocab_size, &tok)) {
                fprintf(stderr, "ringlm-mkmodel: %s\n", tok_errmsg());
                eng_model_free(m);
                return 1;
            }
            pieces = calloc((size_t)c->vocab_size, sizeof *pieces);
            scores = calloc((size_t)c->vocab_size, sizeof *scores);
            for (int i = 0; pieces && scores && i < c->vocab_size; i++) {
                pieces[i] = tok_piece(tok, i);
                scores[i] = tok_score(tok, i);
            }
        }
        gw_vocab *vocab = NULL;
        gw_export_opts o = {.type = type,
                            .arch = arch,
                            .head_dim = head_dim,
                            .sliding_window = window,
                            .pieces = pieces,
                            .scores = scores};
        if (tok_path && (!pieces || !scores))
            err = eng_seterr(-12, "out of memory");
        else if (vocab_path &&
                 (err = gw_vocab_from_hf(vocab_path, vocab_cfg, c->vocab_size, &vocab)))
            eng_seterr(err, "%s", gw_errmsg());
        else {
            o.vocab = vocab;
            err = gw_export_model(m, out, &o, note, sizeof note);
        }
        gw_vocab_free(vocab);
        free(pieces);
        free(scores);
        tok_free(tok);
    } else {
        err = eng_model_write(m, out);
    }
    if (err)
        fprintf(stderr, "ringlm-mkmodel: %s\n", eng_errmsg());
    else {
        fprintf(stderr,
                "ringlm-mkmodel: wrote %s (%s%s%s, dim %d, hidden %d, %d layers, %d heads, "
                "%d kv heads, vocab %d, seq %d, %s classifier)\n",
                out, format, gguf ? " " : "", gguf ? (type ? type : "F32") : "", c->dim,
                c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len,
                c->shared_classifier ? "shared" : "unshared");
        if (note[0]) fprintf(stderr, "ringlm-mkmodel: note: %s\n", note);
    }
    eng_model_free(m);
    return err ? 1 : 0;
}
