/* SPDX-License-Identifier: MIT */
/*
 * tests/gguf_test_util.h — the set-up the GGUF suites share (header only, like
 * engine_test_util.h): a private temporary directory per test (mk_tmpdir / rm_tmpdir, a
 * test's or a suite's .init / .fini), where the node oracles live (tests/node, or
 * $RINGLM_NODE_DIR) and how one runs on a job (node_oracle), and a model exported to a GGUF
 * file by ringlm-mkmodel's exporter.
 */
#ifndef RINGLM_TESTS_GGUF_TEST_UTIL_H
#define RINGLM_TESTS_GGUF_TEST_UTIL_H

#include "kernels/engine.h"
#include "kernels/gguf_export.h"
#include "model/tokenizer.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char tmpdir[256];

/* A test that skips (cr_skip_test: no device, no node) ends without its .fini: the test
 * process's exit removes the directory then (each test runs in its own process). */
static inline void rm_tmpdir_at_exit(void)
{
    if (!tmpdir[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

static inline void mk_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ringlm-gguf-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
    atexit(rm_tmpdir_at_exit);
}

static inline void rm_tmpdir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

/* The node oracles' folder (tests/node unless $RINGLM_NODE_DIR says). */
static inline const char *node_dir(void)
{
    const char *d = getenv("RINGLM_NODE_DIR");
    return d && *d ? d : "tests/node";
}

/* Skips the test where node or the pinned node-llama-cpp (the llama.cpp oracle) is absent. */
static inline void skip_without_node(void)
{
    char p[512];
    snprintf(p, sizeof p, "%s/node_modules/node-llama-cpp/package.json", node_dir());
    if (system("command -v node >/dev/null 2>&1") != 0)
        cr_skip_test("node is not installed: the llama.cpp oracle cannot run");
    if (access(p, R_OK) != 0)
        cr_skip_test("%s absent: run `make deps` to install the pinned node-llama-cpp", p);
}

/* Runs the node oracle `script` (in node_dir()) on job, written to <tmpdir>/<name>.json (job
 * is taken), and returns what it printed, parsed; `what` names the oracle when it fails. */
static inline json_t *node_oracle(const char *script, const char *name, json_t *job,
                                  const char *what)
{
    char jpath[600], opath[600], cmd[2000];
    snprintf(jpath, sizeof jpath, "%s/%s.json", tmpdir, name);
    snprintf(opath, sizeof opath, "%s/%s-out.json", tmpdir, name);
    cr_assert_eq(json_dump_file(job, jpath, 0), 0, "%s", jpath);
    json_decref(job);
    snprintf(cmd, sizeof cmd, "node '%s/%s' '%s' > '%s'", node_dir(), script, jpath, opath);
    int rc = system(cmd);
    cr_assert_eq(rc, 0, "%s failed (%d): %s", what, rc, cmd);
    json_error_t je;
    json_t *out = json_load_file(opath, 0, &je);
    cr_assert_not_null(out, "%s: %s", opath, je.text);
    return out;
}

/* Exports model spec to the GGUF file path as type (arch NULL: llama), with the pieces and
 * scores of the tokenizer file tok when it is given, in heads of head_dim (0: the model's),
 * with a sliding window of window positions (0: the architecture's default). */
static inline void export_gguf_window(const char *spec, const char *tok, const char *type,
                                      const char *arch, int head_dim, int window, const char *path)
{
    eng_model *m;
    cr_assert_eq(eng_model_load(spec, &m), 0, "%s", eng_errmsg());
    int V = eng_model_cfg(m)->vocab_size;
    tok_tokenizer *t = NULL;
    const char **pieces = NULL;
    float *scores = NULL;
    if (tok) {
        cr_assert_eq(tok_load(tok, V, &t), 0, "%s", tok_errmsg());
        pieces = calloc((size_t)V, sizeof *pieces);
        scores = calloc((size_t)V, sizeof *scores);
        for (int i = 0; i < V; i++) {
            pieces[i] = tok_piece(t, i);
            scores[i] = tok_score(t, i);
        }
    }
    gw_export_opts o = {
        .type = type,
        .arch = arch,
        .head_dim = head_dim,
        .sliding_window = window,
        .pieces = pieces,
        .scores = scores,
    };
    char note[4096];
    cr_assert_eq(gw_export_model(m, path, &o, note, sizeof note), 0, "%s", eng_errmsg());
    free(pieces);
    free(scores);
    tok_free(t);
    eng_model_free(m);
}

static inline void export_gguf_heads(const char *spec, const char *tok, const char *type,
                                     const char *arch, int head_dim, const char *path)
{
    export_gguf_window(spec, tok, type, arch, head_dim, 0, path);
}

static inline void export_gguf(const char *spec, const char *tok, const char *type,
                               const char *arch, const char *path)
{
    export_gguf_heads(spec, tok, type, arch, 0, path);
}

#endif
