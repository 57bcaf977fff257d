/* SPDX-License-Identifier: MIT */
/*
 * tests/test_cuda_backend.c — the CUDA backend (kernels/cuda/, the plugin
 * libringlm_cuda.so). Without a device: the plugin loads, eng_create says -ENODEV with a
 * clear message, and the device's synthetic-weight formula (run on the host) equals
 * eng_synth_value bit for bit. With a device: the parity and invariance checks of
 * perf/gpu_parity.h (the same code perf/gpu_bench runs on the H200); otherwise they skip
 * with "no CUDA device: ...".
 */
#include "kernels/engine.h"
#include "perf/gpu_parity.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <limits.h>
#include "tests/helpers.h"

/* The plugin as eng_create finds it: $RINGLM_CUDA_LIB, else <exe>/../lib/. */
static void *open_plugin(char *why, size_t len)
{
    const char *env = getenv("RINGLM_CUDA_LIB");
    char path[PATH_MAX + 64];
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else {
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n <= 0) {
            snprintf(why, len, "readlink /proc/self/exe failed");
            return NULL;
        }
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        snprintf(path, sizeof path, "%s/../lib/libringlm_cuda.so", exe);
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(why, len, "%s", dlerror());
    return h;
}

/* $RINGLM_SHARED/models/NAME (default ../shared), or NULL when it is not there. */
static const char *ts_model_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/models/%s", th_shared_dir(), name);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

static const char *strip_prefix(const char *msg)
{
    const char *p = "no CUDA device: ";
    return strncmp(msg, p, strlen(p)) == 0 ? msg + strlen(p) : msg;
}

/* A CUDA engine over m, or the test skips saying why. */
static eng *cuda_or_skip(const eng_model *m, int blocks)
{
    eng *e;
    int err = gp_engine_create(m, "cuda", blocks, 16, &e);
    if (err == -ENODEV && strstr(eng_errmsg(), "plugin"))
        cr_skip_test("CUDA plugin not available (CUDA=0 or no nvcc): %s", eng_errmsg());
    if (err == -ENODEV) cr_skip_test("no CUDA device: %s", strip_prefix(eng_errmsg()));
    cr_assert_eq(err, 0, "eng_create(cuda): %d %s", err, eng_errmsg());
    return e;
}

static eng_model *load_or_fail(const char *spec)
{
    eng_model *m = NULL;
    int err = eng_model_load(spec, &m);
    cr_assert_eq(err, 0, "eng_model_load(%s): %d %s", spec, err, eng_errmsg());
    return m;
}

static void expect(const gp_result *r)
{
    cr_log_info("%s: %s (value %.4g)", r->name, r->detail, r->value);
    if (r->pass < 0) cr_skip_test("%s: %s", r->name, r->detail);
    cr_expect_eq(r->pass, 1, "%s failed: %s (value %.6g)", r->name, r->detail, r->value);
}

/* ---- no device needed ------------------------------------------------------------------ */

Test(cuda, create_without_device_is_enodev_with_a_reason)
{
    char why[512];
    void *h = open_plugin(why, sizeof why);
    if (!h) cr_skip_test("CUDA plugin not built (CUDA=0 or no nvcc): %s", why);
    dlclose(h);
    eng_model *m = load_or_fail("synthetic:gqa-test:1");
    eng *e;
    int err = gp_engine_create(m, "cuda", 8, 16, &e);
    if (err == 0) {
        /* a device is present: the engine must be usable and say what it is */
        cr_expect_str_eq(eng_backend_name(e), "cuda");
        cr_expect_gt(eng_kv_block_bytes(e), 0);
        cr_expect_null(eng_kv_block_ptr(e, 0), "device pools have no host address");
        eng_destroy(e);
    } else {
        cr_expect_eq(err, -ENODEV, "eng_create(cuda) without a device: %d %s", err, eng_errmsg());
        cr_expect(strstr(eng_errmsg(), "CUDA") != NULL || strstr(eng_errmsg(), "cuda") != NULL,
                  "the reason names CUDA: \"%s\"", eng_errmsg());
        cr_log_info("eng_create(cuda): %s", eng_errmsg());
    }
    eng_model_free(m);
}

Test(cuda, device_synth_formula_equals_eng_synth_value)
{
    char why[512];
    void *h = open_plugin(why, sizeof why);
    if (!h) cr_skip_test("CUDA plugin not built (CUDA=0 or no nvcc): %s", why);
    float (*dev_formula)(uint64_t, int, uint64_t, float, int);
    *(void **)&dev_formula = dlsym(h, "ringlm_cuda_synth_value_host");
    cr_assert_not_null(dev_formula, "plugin exports ringlm_cuda_synth_value_host");
    eng_model_config c;
    cr_assert_eq(eng_preset("llama3-8b", &c), 0);
    int mismatches = 0;
    for (int id = ENG_T_EMBED; id <= ENG_T_WCLS; id++) {
        bool norm = id == ENG_T_RMS_ATT || id == ENG_T_RMS_FFN || id == ENG_T_RMS_FINAL;
        float scale = eng_synth_scale(&c, id);
        for (uint64_t k = 0; k < 4000; k++) {
            uint64_t idx = k * 2654435761ull + (uint64_t)id * 977;
            uint64_t seed = k % 3 ? 1 : 0xdeadbeefcafeull;
            float a = dev_formula(seed, id, idx, scale, norm);
            float b = eng_synth_value(seed, id, idx, scale, norm);
            if (memcmp(&a, &b, sizeof a) != 0 && mismatches++ < 5)
                cr_log_error("tensor %d index %llu: device formula %.9g, host %.9g", id,
                             (unsigned long long)idx, a, b);
        }
    }
    cr_expect_eq(mismatches, 0, "%d values differ", mismatches);
    int (*split)(int);
    *(void **)&split = dlsym(h, "ringlm_cuda_split_count");
    cr_assert_not_null(split);
    /* every decode row gets 1..32 splits of >= 64 keys each (the partial buffers hold 32) */
    for (int ctx = 1; ctx <= 8192; ctx++) {
        int s = split(ctx);
        cr_assert(s >= 1 && s <= 32 && (s == 1 || ctx > 64 * (s - 1)), "split_count(%d)=%d", ctx,
                  s);
    }
    dlclose(h);
}

/* ---- with a device ----------------------------------------------------------------------- */

Test(cuda, stories260k_greedy_reference, .timeout = 300)
{
    char path[1024], ref[1024];
    const char *mp = ts_model_path(path, sizeof path, "stories260K.bin");
    const char *rp = ts_model_path(ref, sizeof ref, "reference-greedy.json");
    if (!mp || !rp)
        cr_skip_test("stories260K.bin / reference-greedy.json not under $RINGLM_SHARED/models");
    eng_model *m = load_or_fail(mp);
    eng *e = cuda_or_skip(m, 160);
    gp_result tok, lo;
    gp_check_reference(e, m, rp, &tok, &lo);
    expect(&lo);
    expect(&tok);
    eng_destroy(e);
    eng_model_free(m);
}

static void parity_suite(const char *spec)
{
    eng_model *m = load_or_fail(spec);
    eng *gpu = cuda_or_skip(m, 160);
    eng *cpu = gp_engine(m, "cpu", 160, 16);
    cr_assert_not_null(cpu, "CPU engine: %s", eng_errmsg());
    gp_result r, inv[4];
    gp_check_cpu_parity(cpu, gpu, m, &r);
    expect(&r);
    gp_check_invariance(gpu, m, inv);
    for (int i = 0; i < 4; i++) expect(&inv[i]);
    for (int kind = 0; kind < 2; kind++) {
        gp_check_swap(gpu, m, kind, &r);
        expect(&r);
    }
    gp_check_recompute(gpu, m, &r);
    expect(&r);
    gp_check_sampling(gpu, m, &r);
    expect(&r);
    eng_destroy(cpu);
    eng_destroy(gpu);
    eng_model_free(m);
}

Test(cuda, gqa_test_parity_and_invariances, .timeout = 300)
{
    parity_suite("synthetic:gqa-test:1");
}

Test(cuda, stories260k_parity_and_invariances, .timeout = 300)
{
    char path[1024];
    const char *mp = ts_model_path(path, sizeof path, "stories260K.bin");
    if (!mp) cr_skip_test("stories260K.bin not under $RINGLM_SHARED/models");
    parity_suite(mp);
}

Test(cuda, device_generated_weights_equal_host_converted, .timeout = 300)
{
    eng_model *a = load_or_fail("synthetic:gqa-test:5");
    eng_model *b = load_or_fail("synthetic:lazy:gqa-test:5");
    eng *x = cuda_or_skip(a, 160);
    eng *y = cuda_or_skip(b, 160);
    gp_result r;
    gp_check_identical(x, y, a, "device_weights", &r);
    expect(&r);
    eng_destroy(x);
    eng_destroy(y);
    eng_model_free(a);
    eng_model_free(b);
}
