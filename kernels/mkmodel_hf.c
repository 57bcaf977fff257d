/* SPDX-License-Identifier: MIT */
/*
 * kernels/mkmodel_hf.c — ringlm-mkmodel --from-hf DIR --out FILE [--type F32|F16|BF16]: a
 * Hugging Face checkpoint (config.json, *.safetensors, tokenizer.json or tokenizer.model,
 * tokenizer_config.json) written as GGUF in llama.cpp's layout (model/hf_import.h).
 */
#include "kernels/mkmodel_hf.h"
#include "model/gguf_write.h"
#include "model/hf_import.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: ringlm-mkmodel --from-hf DIR --out FILE.gguf [--type F32|F16|BF16]\n"
    "  DIR: a Hugging Face checkpoint: config.json, model.safetensors (or shards and\n"
    "       model.safetensors.index.json), tokenizer.json (or SentencePiece's\n"
    "       tokenizer.model), tokenizer_config.json\n"
    "  --type: the matrices' type (default: as the checkpoint stores them); norms, biases\n"
    "       and routers are F32\n";

bool mkmodel_wants_hf(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--from-hf") == 0 || strncmp(argv[i], "--from-hf=", 10) == 0)
            return true;
    return false;
}

int mkmodel_from_hf(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL, *type = NULL;
    static const struct option opts[] = {{"from-hf", required_argument, 0, 'F'},
                                         {"out", required_argument, 0, 'o'},
                                         {"type", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "o:t:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'F': dir = optarg; break;
        case 'o': out = optarg; break;
        case 't': type = optarg; break;
        default: fputs(usage, ch == 'h' ? stdout : stderr); return ch == 'h' ? 0 : 2;
        }
    }
    if (!dir || !out || optind != argc) {
        fputs(usage, stderr);
        fputs("  (--from-hf takes --out and --type only)\n", stderr);
        return 2;
    }
    hf_import_opts o = {.type = type};
    char note[512];
    if (hf_import(dir, out, &o, note, sizeof note)) {
        fprintf(stderr, "ringlm-mkmodel: %s\n", gw_errmsg());
        return 1;
    }
    fprintf(stderr, "ringlm-mkmodel: wrote %s from %s: %s\n", out, dir, note);
    return 0;
}
