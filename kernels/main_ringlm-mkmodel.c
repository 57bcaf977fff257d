/* SPDX-License-Identifier: MIT */
/*
 * ringlm-mkmodel — writes a model to a llama2.c (legacy, version 0) checkpoint, usually a
 * synthetic one, so that every tool (and llama2.c's run.c) can load the very same weights:
 *
 *   ringlm-mkmodel --model synthetic:stories15M:7 --out s15m.bin
 *
 * Loading the file gives the same logits as the in-memory synthetic model. A lazy spec
 * (synthetic:lazy:...) is generated tensor by tensor while writing, without holding it.
 */
#include "kernels/engine.h"

#include <getopt.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    const char *spec = NULL, *out = NULL;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"out", required_argument, 0, 'o'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "m:o:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': spec = optarg; break;
        case 'o': out = optarg; break;
        default:
            fprintf(ch == 'h' ? stdout : stderr,
                    "usage: ringlm-mkmodel --model synthetic:PRESET:SEED --out FILE\n"
                    "  presets: stories15M stories110M llama3-8b gqa-test stories260K\n");
            return ch == 'h' ? 0 : 2;
        }
    }
    if (!spec || !out || optind != argc) {
        fprintf(stderr, "usage: ringlm-mkmodel --model synthetic:PRESET:SEED --out FILE\n");
        return 2;
    }
    eng_model *m;
    if (eng_model_load(spec, &m)) {
        fprintf(stderr, "ringlm-mkmodel: %s\n", eng_errmsg());
        return 1;
    }
    int err = eng_model_write(m, out);
    if (err)
        fprintf(stderr, "ringlm-mkmodel: %s\n", eng_errmsg());
    else {
        const eng_model_config *c = eng_model_cfg(m);
        fprintf(stderr, "ringlm-mkmodel: wrote %s (dim %d, hidden %d, %d layers, %d heads, %d kv "
                        "heads, vocab %d, seq %d, %s classifier)\n", out, c->dim, c->hidden_dim,
                c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len,
                c->shared_classifier ? "shared" : "unshared");
    }
    eng_model_free(m);
    return err ? 1 : 0;
}
