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
#include "tests/helpers.h"

static int run(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

Test(perf_calibrate, writes_the_formats_md_calibration_file, .timeout = 180)
{
    const char *shared = th_shared_dir();
    const char *bin = th_bin_dir();
    char model[512], calib[600], out[64], cmd[2048];
    snprintf(model, sizeof model, "%s/models/stories260K.bin", shared);
    if (access(model, R_OK) != 0) cr_skip_test("%s not found (set RINGLM_SHARED)", model);
    /* perf programs live beside bin/: <build>/perf/calibrate */
    snprintf(calib, sizeof calib, "%s/../perf/calibrate", bin);
    if (access(calib, X_OK) != 0) cr_skip_test("%s not built", calib);
    snprintf(out, sizeof out, "/tmp/ringlm-tt-calib-%d.json", getpid());
    snprintf(cmd, sizeof cmd, "%s --model %s --reps 2 --no-disk -o %s > %s.log 2>&1", calib, model,
             out, out);
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
    const char *ints[] = {"threads", "kv_block_size", "kv_blocks_device", "kv_blocks_host",
                          "max_batch_tokens"};
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
    const char *sk[] = {
        "base_us", "per_prefill_token_us", "per_decode_seq_us", "per_context_token_us",
        "r2",      "median_rel_err"};
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
        snprintf(cmd, sizeof cmd, "%s --workload poisson --calibration %s --json > %s.sim 2>&1",
                 sim, out, out);
        rc = run(cmd);
        cr_assert_eq(rc, 0, "ringlm-sim rejected the calibration (see %s.sim)", out);
        snprintf(cmd, sizeof cmd, "%s.sim", out);
        unlink(cmd);
    }
    unlink(out);
    unlink(log);
}

/* The serving-loop probe: --write-probe writes requests that run one at a time; --daemon-log
 * turns a ringlmd request log into decode-period points, keeping only requests that ran
 * alone and skipping unfinished ones; a malformed line is named by file and line. */
Test(perf_calibrate, daemon_log_becomes_serving_loop_points, .timeout = 180)
{
    const char *shared = th_shared_dir();
    const char *bin = th_bin_dir();
    char model[512], calib[600], base[64], cmd[3072], path[128];
    snprintf(model, sizeof model, "%s/models/stories260K.bin", shared);
    if (access(model, R_OK) != 0) cr_skip_test("%s not found (set RINGLM_SHARED)", model);
    snprintf(calib, sizeof calib, "%s/../perf/calibrate", bin);
    if (access(calib, X_OK) != 0) cr_skip_test("%s not built", calib);
    snprintf(base, sizeof base, "/tmp/ringlm-tt-probe-%d", getpid());

    snprintf(path, sizeof path, "%s.probe", base);
    snprintf(cmd, sizeof cmd, "%s --write-probe %s > /dev/null", calib, path);
    cr_assert_eq(run(cmd), 0, "--write-probe failed");
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s not written", path);
    char line[1024];
    int n = 0;
    double last = -1;
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        cr_assert(o, "probe line %d not JSON: %s", n + 1, e.text);
        double at = json_number_value(json_object_get(o, "arrival_us"));
        cr_assert_geq(at - last, 200000, "probe requests must be far apart (line %d)", n + 1);
        cr_assert_leq(json_integer_value(json_object_get(o, "prompt_tokens")) +
                          json_integer_value(json_object_get(o, "output_tokens")),
                      512);
        last = at;
        json_decref(o);
        n++;
    }
    fclose(f);
    unlink(path);
    cr_assert_geq(n, 8, "probe of %d requests", n);

    /* req 1 alone (period 100 us at context 100 + 24); 2 and 3 overlap; 4 was rejected */
    snprintf(path, sizeof path, "%s.log", base);
    f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"req\":1,\"arrival_us\":0,\"prompt_tokens\":100,\"output_tokens\":48,\"first_token_"
          "us\":3000,\"finish_us\":7700,\"finish_reason\":\"length\"}\n"
          "{\"req\":2,\"arrival_us\":100000,\"prompt_tokens\":64,\"output_tokens\":48,\"first_"
          "token_us\":101000,\"finish_us\":110000,\"finish_reason\":\"length\"}\n"
          "{\"req\":3,\"arrival_us\":105000,\"prompt_tokens\":64,\"output_tokens\":48,\"first_"
          "token_us\":111000,\"finish_us\":120000,\"finish_reason\":\"length\"}\n"
          "{\"req\":4,\"arrival_us\":300000,\"prompt_tokens\":64,\"output_tokens\":0,\"first_token_"
          "us\":null,\"finish_us\":null,\"finish_reason\":null,\"reject_reason\":\"queue_full\"}\n",
          f);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "%s --model %s --reps 1 --no-transfer --daemon-log %s -o %s.json > %s.out 2>&1", calib,
             model, path, base, base);
    cr_assert_eq(run(cmd), 0, "calibrate --daemon-log failed (see %s.out)", base);
    char out[128];
    snprintf(out, sizeof out, "%s.json", base);
    json_error_t e;
    json_t *j = json_load_file(out, 0, &e);
    cr_assert(j, "%s: %s", out, e.text);
    json_t *pts = json_object_get(json_object_get(j, "serving_loop"), "points");
    cr_assert_eq(json_array_size(pts), 1, "only the request that ran alone: %zu points",
                 json_array_size(pts));
    json_t *p0 = json_array_get(pts, 0);
    cr_expect_float_eq(json_number_value(json_object_get(p0, "context")), 124, 1e-9);
    cr_expect_float_eq(json_number_value(json_object_get(p0, "period_us")), 100, 1e-9);
    json_decref(j);
    unlink(out);

    /* malformed: named by file and line */
    f = fopen(path, "a");
    cr_assert(f);
    fputs("{\"req\":5,\"arrival_us\":\"soon\"}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s --model %s --reps 1 --no-transfer --daemon-log %s > %s.out 2>&1",
             calib, model, path, base);
    cr_expect_neq(run(cmd), 0, "a malformed request log must fail");
    snprintf(cmd, sizeof cmd, "grep -q '%s:5: \"arrival_us\"' %s.out", path, base);
    cr_expect_eq(run(cmd), 0, "the error names file:line and the field (see %s.out)", base);
    unlink(path);
    snprintf(path, sizeof path, "%s.out", base);
    unlink(path);
}
