/* SPDX-License-Identifier: MIT */
/*
 * tests/test_context_length.c — the model file's context length is used everywhere: the
 * tokenizer API reports a GGUF model file's <arch>.context_length, `ringlm generate`'s
 * default max_tokens stays within it (the daemon refuses a request whose prompt and
 * max_tokens do not fit), and ringlm-run says when a run stops there. The model: synthetic
 * stories260K weights exported to GGUF, its context_length rewritten to 128.
 */
#include "gguf_test_util.h"
#include "tests/helpers.h"
#include "ringlm.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static th_daemon g_d;

static void cleanup(void)
{
    th_daemon_cleanup(&g_d);
    rm_tmpdir();
}

TestSuite(context_length, .init = mk_tmpdir, .fini = cleanup, .timeout = 240);

/* A GGUF model of stories260K's shape whose file states a context of ctx tokens (the export
 * writes the preset's 512; the u32 after the key is rewritten). */
static char *write_model(int ctx)
{
    char *path = malloc(600);
    snprintf(path, 600, "%s/ctx%d.gguf", tmpdir, ctx);
    export_gguf("synthetic:stories260K:1", NULL, "F32", NULL, path);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    char *buf = malloc((size_t)size);
    rewind(f);
    cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
    const char *key = "llama.context_length";
    char *at = memmem(buf, (size_t)size, key, strlen(key));
    cr_assert_not_null(at, "%s has no %s", path, key);
    uint32_t type, value = (uint32_t)ctx;
    memcpy(&type, at + strlen(key), 4);
    cr_assert_eq(type, 4, "%s is not a u32", key);
    fseek(f, (long)(at - buf) + (long)strlen(key) + 4, SEEK_SET);
    cr_assert_eq(fwrite(&value, 4, 1, f), 1u);
    fclose(f);
    free(buf);
    return path;
}

Test(context_length, the_tokenizer_reports_the_model_files_context)
{
    char *model = write_model(128);
    ringlm_tokenizer *tok;
    cr_assert_eq(ringlm_tokenizer_load(model, 0, &tok), 0, "%s", ringlm_errdetail());
    cr_assert_eq(ringlm_tokenizer_context_length(tok), 128);
    ringlm_tokenizer_free(tok);
    cr_assert_eq(ringlm_tokenizer_context_length(NULL), -EINVAL);
    free(model);
}

Test(context_length, ringlm_run_says_when_it_stops_at_the_context)
{
    char *run = th_path(th_bin_dir(), "ringlm-run");
    if (!th_exists(run)) cr_skip_test("ringlm-run not built in %s", th_bin_dir());
    char *model = write_model(128);
    /* a prompt longer than the context: its first 128 tokens are run, and the run ends there
     * (no stop token can end it first: the prompt is forced) */
    char prompt[2048] = "";
    for (int i = 0; i < 60; i++) strcat(prompt, "Once upon a time ");
    char *argv[] = {run, "--model", model, "--prompt", prompt, "--steps", "0", NULL};
    char *out, *err;
    cr_assert_eq(th_run(argv, &out, &err, 120), 0, "ringlm-run: %s", err);
    cr_assert(strstr(err, "only the first 128 are run (the model's context length)"), "%s", err);
    cr_assert(strstr(err, "stopped at the model's context length, 128 tokens"), "%s", err);
    free(out);
    free(err);
    /* a run that --steps ends is not the context's */
    char *argv2[] = {run, "--model", model, "--prompt", "Once", "--steps", "4", NULL};
    cr_assert_eq(th_run(argv2, &out, &err, 120), 0, "ringlm-run: %s", err);
    cr_assert_null(strstr(err, "context length"), "%s", err);
    free(out);
    free(err);
    free(model);
    free(run);
}

/* The daemon serves the file's context (128): `ringlm generate` without --max-tokens used
 * to ask for 256 tokens, which the daemon refuses; now its default fits the context. */
Test(context_length, generate_defaults_within_the_model_files_context)
{
    char *ringlm = th_path(th_bin_dir(), "ringlm");
    if (!th_exists(ringlm)) cr_skip_test("ringlm not built in %s", th_bin_dir());
    char *model = write_model(128);
    const char *args[] = {"--model", model, NULL};
    th_daemon_init(&g_d);
    th_daemon_start(&g_d, args, 30000);
    char *argv[] = {ringlm, "--socket", g_d.sock,           "generate", "--tokenizer",
                    model,  "--prompt", "Once upon a time", NULL};
    char *out, *err;
    int rc = th_run(argv, &out, &err, 120);
    cr_assert_eq(rc, 0, "ringlm generate: %s\n%s", err, th_daemon_output(&g_d));
    cr_assert_null(strstr(err, "too_long"), "%s", err);
    free(out);
    free(err);
    th_daemon_stop(&g_d, SIGTERM, 15000);
    free(model);
    free(ringlm);
}
