/* SPDX-License-Identifier: MIT */
/*
 * Models: every malformed checkpoint gets -EINVAL naming the field (never a crash);
 * synthetic presets follow the documented formula; a written synthetic model loads back
 * to the same weights and logits; model identities.
 */
#include "engine_test_util.h"

#include <errno.h>
#include <unistd.h>

static char tmpdir[256];

static bool cfg_eq(const eng_model_config *a, const eng_model_config *b)
{
    return a->dim == b->dim && a->hidden_dim == b->hidden_dim && a->n_layers == b->n_layers &&
           a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
           a->vocab_size == b->vocab_size && a->seq_len == b->seq_len &&
           a->shared_classifier == b->shared_classifier;
}

static void mk_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ringlm-model-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void rm_tmpdir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

/* Writes a file: header, then `floats` float32 zeros... (plus `extra` bytes). */
static const char *write_model(const char *name, const int32_t hdr[7], size_t floats,
                               size_t extra_bytes)
{
    static char path[400];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    if (hdr) cr_assert_eq(fwrite(hdr, 4, 7, f), 7);
    float one = 1.0f;
    for (size_t i = 0; i < floats; i++) fwrite(&one, 4, 1, f);
    for (size_t i = 0; i < extra_bytes; i++) fputc(0, f);
    fclose(f);
    return path;
}

/* Float count of a valid legacy file for this header (shared classifier when vocab > 0). */
static size_t floats_for(const int32_t h[7])
{
    size_t dim = (size_t)h[0], hid = (size_t)h[1], L = (size_t)h[2], nh = (size_t)h[3];
    size_t kv = dim * (size_t)h[4] / nh, vocab = (size_t)(h[5] < 0 ? -h[5] : h[5]);
    size_t hs = dim / nh, seq = (size_t)h[6];
    size_t n = vocab * dim + L * dim * 2 + L * dim * dim * 2 + L * kv * dim * 2 +
               L * hid * dim * 3 + dim + seq * hs;
    if (h[5] < 0) n += vocab * dim;
    return n;
}

static void expect_einval(const char *path, const char *what, const char *needle)
{
    eng_model *m = (eng_model *)0x1;
    int err = eng_model_load(path, &m);
    cr_assert_eq(err, -EINVAL, "%s: got %d (%s)", what, err, eng_errmsg());
    cr_assert_null(m, "%s: no model on error", what);
    cr_assert(strstr(eng_errmsg(), needle), "%s: message \"%s\" lacks \"%s\"", what, eng_errmsg(),
              needle);
}

Test(model, malformed_checkpoints_name_the_field, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    const int32_t good[7] = {16, 40, 2, 4, 2, 32, 8};
    size_t n = floats_for(good);
    eng_model *m;
    cr_assert_eq(eng_model_load(write_model("good.bin", good, n, 0), &m), 0, "%s", eng_errmsg());
    cr_assert_eq(eng_model_cfg(m)->n_kv_heads, 2);
    cr_assert(eng_model_cfg(m)->shared_classifier);
    eng_model_free(m);
    int32_t uns[7] = {16, 40, 2, 4, 2, -32, 8};
    cr_assert_eq(eng_model_load(write_model("unshared.bin", uns, floats_for(uns), 0), &m), 0, "%s",
                 eng_errmsg());
    cr_assert_not(eng_model_cfg(m)->shared_classifier);
    cr_assert_eq(eng_model_cfg(m)->vocab_size, 32);
    cr_assert_neq(eng_model_weights(m)->wcls, eng_model_weights(m)->token_embedding);
    eng_model_free(m);

    expect_einval(write_model("empty.bin", NULL, 0, 0), "empty file", "truncated");
    expect_einval(write_model("short.bin", NULL, 0, 10), "10-byte file", "header");
    expect_einval(write_model("trunc.bin", good, n - 1, 0), "one float short", "truncated");
    expect_einval(write_model("trail.bin", good, n, 3), "3 bytes too many", "size mismatch");
    expect_einval(write_model("unsh_short.bin", uns, floats_for(good), 0),
                  "unshared classifier missing", "truncated");

    struct {
        int field;
        int32_t value;
        const char *needle;
    } bad[] = {
        {0, 0, "dim=0"},
        {0, -16, "dim=-16"},
        {0, 1 << 30, "dim=1073741824"},
        {1, 0, "hidden_dim=0"},
        {1, -1, "hidden_dim=-1"},
        {2, 0, "n_layers=0"},
        {2, 100000, "n_layers=100000"},
        {3, 0, "n_heads=0"},
        {3, -4, "n_heads=-4"},
        {3, 3, "n_heads=3 does not divide dim=16"},
        {3, 16, "odd"}, /* head size 1 */
        {4, 0, "n_kv_heads=0"},
        {4, 3, "n_kv_heads=3: must divide n_heads=4"},
        {4, 8, "n_kv_heads=8"},
        {5, 0, "vocab_size=0"},
        {5, 1 << 30, "vocab_size="},
        {5, INT32_MIN, "vocab_size="},
        {6, 0, "seq_len=0"},
        {6, -5, "seq_len=-5"},
        {0, 0x616b3432, "ak42"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t h[7];
        memcpy(h, good, sizeof h);
        h[bad[i].field] = bad[i].value;
        char what[64];
        snprintf(what, sizeof what, "header field %d = %d", bad[i].field, bad[i].value);
        /* the body matches the good header: only the header field is wrong */
        expect_einval(write_model("bad.bin", h, n, 0), what, bad[i].needle);
    }
    cr_assert_eq(eng_model_load("/nonexistent/model.bin", &m), -ENOENT);
    expect_einval(tmpdir, "a directory", "not a regular file");
    expect_einval("synthetic:nosuch:1", "unknown preset", "nosuch");
    expect_einval("synthetic:stories15M:x1", "bad seed", "SEED");
}

Test(model, real_file_identity)
{
    char path[1024];
    if (!ts_model_file(path, sizeof path, "stories260K.bin"))
        cr_skip_test("no stories260K.bin: set RINGLM_SHARED to the folder holding models/");
    eng_model *m;
    cr_assert_eq(eng_model_load(path, &m), 0, "%s", eng_errmsg());
    const eng_model_config *c = eng_model_cfg(m);
    cr_assert(c->dim == 64 && c->hidden_dim == 172 && c->n_layers == 5 && c->n_heads == 8 &&
              c->n_kv_heads == 4 && c->vocab_size == 512 && c->seq_len == 512 &&
              c->shared_classifier);
    cr_assert_str_eq(eng_model_hash(m),
                     "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696");
    cr_assert_not(eng_model_synthetic_seed(m, NULL));
    eng_model_free(m);
}

Test(model, presets_and_synthetic_formula)
{
    struct {
        const char *name;
        eng_model_config c;
    } want[] = {
        {"stories15M", {288, 768, 6, 6, 6, 32000, 256, true}},
        {"stories110M", {768, 2048, 12, 12, 12, 32000, 1024, true}},
        {"llama3-8b", {4096, 14336, 32, 32, 8, 128256, 8192, false}},
    };
    for (size_t i = 0; i < 3; i++) {
        eng_model_config c;
        cr_assert_eq(eng_preset(want[i].name, &c), 0);
        cr_assert(cfg_eq(&c, &want[i].c), "preset %s", want[i].name);
    }
    eng_model_config g;
    cr_assert_eq(eng_preset("gqa-test", &g), 0);
    cr_assert_lt(g.n_kv_heads, g.n_heads, "gqa-test is grouped-query");
    cr_assert_eq(eng_preset("nope", &g), -ENOENT);

    /* the documented formula, computed here independently */
    uint64_t seed = 42, idx = 12345;
    uint64_t z = (seed ^ ((uint64_t)ENG_T_WQ << 56) ^ idx) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float scale = 1.0f / sqrtf(288.0f);
    float expect = ((float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
    cr_assert_eq(eng_synth_value(seed, ENG_T_WQ, idx, scale, false), expect);
    cr_assert_eq(eng_synth_scale(&want[0].c, ENG_T_WQ), scale);
    cr_assert_eq(eng_synth_scale(&want[0].c, ENG_T_W2), 1.0f / sqrtf(768.0f));
    cr_assert_eq(eng_synth_scale(&want[0].c, ENG_T_EMBED), 1.0f);

    eng_model *m;
    cr_assert_eq(eng_model_load("synthetic:gqa-test:42", &m), 0, "%s", eng_errmsg());
    const eng_weights *w = eng_model_weights(m);
    const eng_model_config *c = eng_model_cfg(m);
    int kv_dim = c->dim / c->n_heads * c->n_kv_heads;
    cr_assert_eq(w->wq[idx],
                 eng_synth_value(42, ENG_T_WQ, idx, eng_synth_scale(c, ENG_T_WQ), false));
    cr_assert_eq(w->wk[(size_t)kv_dim * c->dim - 1],
                 eng_synth_value(42, ENG_T_WK, (uint64_t)kv_dim * c->dim - 1,
                                 eng_synth_scale(c, ENG_T_WK), false));
    cr_assert_eq(w->rms_ffn[7], 1.0f + eng_synth_value(42, ENG_T_RMS_FFN, 7, 0.1f, false));
    cr_assert_eq(w->wcls[3],
                 eng_synth_value(42, ENG_T_WCLS, 3, eng_synth_scale(c, ENG_T_WCLS), false));
    uint64_t s;
    cr_assert(eng_model_synthetic_seed(m, &s) && s == 42);
    cr_assert_eq(strlen(eng_model_hash(m)), 64);
    eng_model_free(m);

    cr_assert_eq(eng_model_load("synthetic:lazy:llama3-8b:7", &m), 0, "%s", eng_errmsg());
    cr_assert(eng_model_is_lazy(m));
    cr_assert_null(eng_model_weights(m)->wq);
    cr_assert_eq(eng_model_cfg(m)->vocab_size, 128256);
    eng_options o = {.n_threads = 1,
                     .numa_node = -1,
                     .kv_blocks = 4,
                     .kv_block_size = 16,
                     .max_batch_tokens = 16,
                     .max_seqs = 1};
    eng *e;
    cr_assert_eq(eng_create(m, &o, &e), -ENOTSUP, "the CPU backend refuses a lazy model");
    eng_model_free(m);
}

/* ringlm-mkmodel's writer: the file loads back to the same bytes and the same logits. */
Test(model, written_synthetic_model_is_the_same_model, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    const char *specs[] = {"synthetic:gqa-test:9", "synthetic:stories260K:3"};
    for (int i = 0; i < 2; i++) {
        eng_model *mem, *file;
        cr_assert_eq(eng_model_load(specs[i], &mem), 0, "%s", eng_errmsg());
        char path[400];
        snprintf(path, sizeof path, "%s/m%d.bin", tmpdir, i);
        cr_assert_eq(eng_model_write(mem, path), 0, "%s", eng_errmsg());
        cr_assert_eq(eng_model_load(path, &file), 0, "%s", eng_errmsg());
        const eng_model_config *a = eng_model_cfg(mem), *b = eng_model_cfg(file);
        cr_assert(cfg_eq(a, b), "%s: config differs after the round trip", specs[i]);
        size_t nq = (size_t)a->n_layers * a->dim * a->dim;
        cr_assert(memcmp(eng_model_weights(mem)->wq, eng_model_weights(file)->wq, nq * 4) == 0);
        cr_assert(memcmp(eng_model_weights(mem)->wcls, eng_model_weights(file)->wcls,
                         (size_t)a->vocab_size * a->dim * 4) == 0);
        /* same logits through the engine */
        float *la = malloc((size_t)a->vocab_size * 4), *lb = malloc((size_t)a->vocab_size * 4);
        int32_t prompt[5] = {1, 20, 30, 40, 50};
        eng_model *ms[2] = {mem, file};
        float *ls[2] = {la, lb};
        for (int k = 0; k < 2; k++) {
            eng *e = ts_engine(ms[k], 4, 16, 1);
            tseq sq;
            ts_seq_init(&sq, prompt, 5, 0);
            tseq *one[1] = {&sq};
            int rows = 5;
            cr_assert_eq(ts_step(e, a, one, &rows, 1, ls[k]), 0, "%s", eng_errmsg());
            eng_destroy(e);
        }
        cr_assert(memcmp(la, lb, (size_t)a->vocab_size * 4) == 0, "%s: logits differ", specs[i]);
        free(la);
        free(lb);
        eng_model_free(mem);
        eng_model_free(file);
    }
    /* a lazy model is generated while writing: identical bytes to the eager one */
    eng_model *lazy, *eager;
    char p1[400], p2[400];
    snprintf(p1, sizeof p1, "%s/lazy.bin", tmpdir);
    snprintf(p2, sizeof p2, "%s/eager.bin", tmpdir);
    cr_assert_eq(eng_model_load("synthetic:lazy:gqa-test:5", &lazy), 0);
    cr_assert_eq(eng_model_load("synthetic:gqa-test:5", &eager), 0);
    cr_assert_eq(eng_model_write(lazy, p1), 0, "%s", eng_errmsg());
    cr_assert_eq(eng_model_write(eager, p2), 0, "%s", eng_errmsg());
    eng_model *f1, *f2;
    cr_assert_eq(eng_model_load(p1, &f1), 0);
    cr_assert_eq(eng_model_load(p2, &f2), 0);
    cr_assert_str_eq(eng_model_hash(f1), eng_model_hash(f2));
    cr_assert_str_eq(eng_model_hash(lazy), eng_model_hash(eager),
                     "lazy and eager are the same model");
    eng_model_free(f1);
    eng_model_free(f2);
    eng_model_free(lazy);
    eng_model_free(eager);
}

/* Random headers and every truncation of a valid file: an error or a valid model, never a
 * crash (each load runs in this test's process, so a crash fails the test). */
Test(model, random_headers_and_truncations_never_crash, .init = mk_tmpdir, .fini = rm_tmpdir)
{
    const int32_t good[7] = {16, 40, 2, 4, 2, -32, 8};
    size_t n = floats_for(good);
    uint64_t x = 0x1234567;
    for (int iter = 0; iter < 300; iter++) {
        int32_t h[7];
        memcpy(h, good, sizeof h);
        for (int f = 0; f < 7; f++) {
            x = eng_splitmix64(x);
            if (x % 3 == 0) /* mutate about a third of the fields */
                h[f] = (int32_t)(x >> 32) >> (int)((x >> 8) % 31);
        }
        eng_model *m = NULL;
        int err = eng_model_load(write_model("rnd.bin", h, n, 0), &m);
        cr_assert(err == 0 || err == -EINVAL, "header %d %d %d %d %d %d %d: %d (%s)", h[0], h[1],
                  h[2], h[3], h[4], h[5], h[6], err, eng_errmsg());
        if (err == 0)
            eng_model_free(m);
        else
            cr_assert_neq(eng_errmsg()[0], '\0', "an error explains itself");
    }
    const char *full = write_model("full.bin", good, n, 0);
    char cmd[600];
    for (size_t cut = 0; cut < 28 + n * 4; cut += 97) {
        snprintf(cmd, sizeof cmd, "head -c %zu '%s' > '%s/cut.bin'", cut, full, tmpdir);
        cr_assert_eq(system(cmd), 0);
        char path[400];
        snprintf(path, sizeof path, "%s/cut.bin", tmpdir);
        expect_einval(path, "truncated file", "truncated");
    }
}
