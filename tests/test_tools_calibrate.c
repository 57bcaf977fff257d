/* SPDX-License-Identifier: MIT */
/*
 * perf/calibrate on stories260K writes the calibration file of sim/FORMATS.md (keys, types,
 * sane values), and ringlm-sim accepts it.
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *env_or(const char *k, const char *d)
{
    const char *s = getenv(k);
    return s && *s ? s : d;
}

static int run(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

Test(tools_calibrate, writes_the_formats_md_calibration_file, .timeout = 180)
{
    const char *shared = env_or("RINGLM_SHARED", "../shared");
    const char *bin = env_or("RINGLM_BIN", "build/bin");
    char model[512], calib[600], out[64], cmd[2048];
    snprintf(model, sizeof model, "%s/models/stories260K.bin", shared);
    if (access(model, R_OK) != 0) cr_skip_test("%s not found (set RINGLM_SHARED)", model);
    /* perf programs live beside bin/: <build>/perf/calibrate */
    snprintf(calib, sizeof calib, "%s/../perf/calibrate", bin);
    if (access(calib, X_OK) != 0) cr_skip_test("%s not built", calib);
    snprintf(out, sizeof out, "/tmp/ringlm-tt-calib-%d.json", getpid());
    snprintf(cmd, sizeof cmd, "%s --model %s --reps 2 --no-disk -o %s > %s.log 2>&1", calib, model, out, out);
    int rc = run(cmd);
    char log[700];
    snprintf(log, sizeof log, "%s.log", out);
    cr_assert_eq(rc, 0, "calibrate exit %d (log %s)", rc, log);

    json_error_t e;
    json_t *j = json_load_file(out, 0, &e);
    cr_assert(j, "%s is not JSON: %s", out, e.text);
    cr_assert_eq(json_integer_value(json_object_get(j, "version")), 1);
    cr_assert_str_eq(json_string_value(json_object_get(j, "backend")), "cpu");
    cr_assert_str_eq(json_string_value(json_object_get(j, "model")), "stories260K.bin");
    cr_assert_str_eq(json_string_value(json_object_get(j, "model_hash")),
                     "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696");
    /* 5 layers × (K+V) × kv_dim 32 × 4 bytes */
    cr_assert_eq(json_integer_value(json_object_get(j, "kv_bytes_per_token")), 1280);
    const char *ints[] = {"threads", "kv_block_size", "kv_blocks_device", "kv_blocks_host", "max_batch_tokens"};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        cr_assert(json_integer_value(json_object_get(j, ints[i])) > 0, "%s", ints[i]);
    json_t *grid = json_object_get(j, "grid");
    cr_assert(json_array_size(grid) >= 20, "grid of %zu rows", json_array_size(grid));
    bool varied[3] = {0};
    for (size_t i = 0; i < json_array_size(grid); i++) {
        json_t *g = json_array_get(grid, i);
        cr_assert(json_is_integer(json_object_get(g, "prefill_tokens")));
        cr_assert(json_is_integer(json_object_get(g, "decode_seqs")));
        cr_assert(json_integer_value(json_object_get(g, "context")) > 0);
        double st = json_number_value(json_object_get(g, "step_us"));
        cr_assert(st > 0 && st < 10e6, "row %zu step_us %g", i, st);
        varied[0] |= json_integer_value(json_object_get(g, "prefill_tokens")) > 0;
        varied[1] |= json_integer_value(json_object_get(g, "decode_seqs")) > 1;
        varied[2] |= json_integer_value(json_object_get(g, "context")) > 128;
    }
    cr_assert(varied[0] && varied[1] && varied[2], "the grid must vary every regressor");
    json_t *sm = json_object_get(j, "step_model");
    const char *sk[] = {"base_us", "per_prefill_token_us", "per_decode_seq_us", "per_context_token_us", "r2",
                        "median_rel_err"};
    for (size_t i = 0; i < sizeof sk / sizeof *sk; i++)
        cr_assert(json_is_number(json_object_get(sm, sk[i])), "step_model.%s", sk[i]);
    cr_assert(json_number_value(json_object_get(sm, "per_prefill_token_us")) > 0);
    json_t *host = json_object_get(json_object_get(j, "transfer"), "host");
    cr_assert(host, "transfer.host missing");
    cr_assert(json_number_value(json_object_get(host, "out_bytes_per_s")) > 1e6);
    cr_assert(json_number_value(json_object_get(host, "in_bytes_per_s")) > 1e6);
    cr_assert(json_number_value(json_object_get(host, "latency_us")) >= 0);
    json_decref(j);

    /* The simulator reads it. */
    char sim[600];
    snprintf(sim, sizeof sim, "%s/ringlm-sim", bin);
    if (access(sim, X_OK) == 0) {
        snprintf(cmd, sizeof cmd, "%s --workload poisson --calibration %s --json > %s.sim 2>&1", sim, out, out);
        rc = run(cmd);
        cr_assert_eq(rc, 0, "ringlm-sim rejected the calibration (see %s.sim)", out);
        snprintf(cmd, sizeof cmd, "%s.sim", out);
        unlink(cmd);
    }
    unlink(out);
    unlink(log);
}
