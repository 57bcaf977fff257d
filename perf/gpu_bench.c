/* SPDX-License-Identifier: MIT */
/*
 * gpu_bench — the CUDA backend's check on a GPU machine (perf/gpu-check.sh runs it):
 *
 *   parity      CUDA vs CPU on identical batches (stories260K and the synthetic gqa-test
 *               shape): greedy tokens vs reference-greedy.json, logits vs run.c's oracle,
 *               relative L2, DESIGN.md §8 invariances, swap out/in byte-exact, recompute,
 *               device sampling vs eng_sample, device-generated vs host-converted weights;
 *   throughput  synthetic llama3-8b (weights generated on the device): batch-1 decode tok/s
 *               and GB/s against a device-to-device copy measured in the same run; decode at
 *               16/64/256 sequences; prefill tok/s and TFLOP/s against a large cuBLAS GEMM
 *               in the same run; KV swap bandwidth against a large pinned cudaMemcpy.
 *   gguf        GGUF files written by ringlm-mkmodel's exporter (stories260K converted to
 *               F16/BF16/Q8_0/Q4_K_M; synthetic GQA and qwen2 shapes with real Q4_K/Q6_K
 *               rows): greedy tokens equal to the CPU backend's, logits within the per-type
 *               tolerance, invariances (with parity); load time and decode tok/s of the
 *               stories110M shape in F16/BF16/Q8_0/Q4_K_M beside the same shape loaded from
 *               float32 (with perf).
 *
 * Every figure is a median over CUDA-event timed runs after a warm-up (the engine's own
 * events, ringlm_cuda_last_execute_ms); wall-clock medians are printed beside them.
 *
 *   gpu_bench [--data DIR] [--json FILE] [--only parity|perf] [--quick] [--no-cuda-graphs]
 *
 * DIR holds stories260K.bin and reference-greedy.json (default gpu-data, then
 * $RINGLM_SHARED/models). Exit status: 0 all checks passed, 1 a check failed, 2 no device.
 */
#include "kernels/engine.h"
#include "kernels/gguf_export.h"
#include "perf/bench_util.h"
#include "perf/gpu_parity.h"

#include <dlfcn.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>

/* ---- the plugin's extra symbols ------------------------------------------------------- */

typedef struct probes {
    int (*device_info)(char *, size_t);
    int (*d2d)(size_t, int, double *);
    int (*gemm)(int, int, double *);
    int (*memcpy_bw)(size_t, size_t, int, double *, double *);
    int (*host_alloc)(size_t, void **);
    void (*host_free)(void *);
    double (*last_ms)(void);
    int (*last_graph)(void);
    int (*set_gemv)(int);
} probes;

static void *open_plugin(void)
{
    const char *env = getenv("RINGLM_CUDA_LIB");
    if (env && *env) return dlopen(env, RTLD_NOW | RTLD_LOCAL);
    char exe[PATH_MAX], path[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(path, sizeof path, "%s/../lib/libringlm_cuda.so", exe);
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h) return h;
        }
    }
    return dlopen("libringlm_cuda.so", RTLD_NOW | RTLD_LOCAL);
}

static int load_probes(probes *p)
{
    void *h = open_plugin();
    if (!h) {
        fprintf(stderr, "gpu_bench: cannot load libringlm_cuda.so: %s\n", dlerror());
        return -ENODEV;
    }
#define SYM(field, name)                                                                           \
    do {                                                                                           \
        *(void **)&p->field = dlsym(h, name);                                                      \
        if (!p->field) {                                                                           \
            fprintf(stderr, "gpu_bench: plugin lacks %s\n", name);                                 \
            return -ENODEV;                                                                        \
        }                                                                                          \
    } while (0)
    SYM(device_info, "ringlm_cuda_device_info");
    SYM(d2d, "ringlm_cuda_probe_d2d");
    SYM(gemm, "ringlm_cuda_probe_gemm");
    SYM(memcpy_bw, "ringlm_cuda_probe_memcpy");
    SYM(host_alloc, "ringlm_cuda_host_alloc");
    SYM(host_free, "ringlm_cuda_host_free");
    SYM(last_ms, "ringlm_cuda_last_execute_ms");
    SYM(last_graph, "ringlm_cuda_last_used_graph");
    SYM(set_gemv, "ringlm_cuda_set_gemv");
#undef SYM
    return 0;
}

/* ---- results --------------------------------------------------------------------------- */

#define MAX_RESULTS 224
static gp_result results[MAX_RESULTS];
static char units[MAX_RESULTS][16];
static int n_results;

static gp_result *next_result(void)
{
    if (n_results >= MAX_RESULTS) n_results = MAX_RESULTS - 1;
    units[n_results][0] = '\0';
    return &results[n_results++];
}

static void print_result(const gp_result *r)
{
    printf("%-4s %-30s %12.4g  %s\n",
           r->pass > 0    ? "PASS"
           : r->pass == 0 ? "FAIL"
                          : "SKIP",
           r->name, r->value, r->detail);
    fflush(stdout);
}

static void add(const gp_result *r, const char *unit)
{
    gp_result *d = next_result();
    *d = *r;
    snprintf(units[d - results], sizeof units[0], "%s", unit ? unit : "");
    print_result(d);
}

static void addf(const char *name, int pass, double value, const char *unit, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void addf(const char *name, int pass, double value, const char *unit, const char *fmt, ...)
{
    gp_result r;
    snprintf(r.name, sizeof r.name, "%s", name);
    r.pass = pass;
    r.value = value;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.detail, sizeof r.detail, fmt, ap);
    va_end(ap);
    add(&r, unit);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- parity ---------------------------------------------------------------------------- */

/* The backend under test: "cuda", or "cpu" with --harness-on-cpu (checks this harness on a
 * machine without a GPU: the CPU against itself must pass everything but the swap). */
static const char *dut_backend = "cuda";

/* "label.name", cut to the field (the return value is checked so gcc sees it handled). */
static void prefix_name(gp_result *r, const char *label)
{
    char n2[sizeof r->name];
    int k = snprintf(n2, sizeof n2, "%s.%s", label, r->name);
    if (k < 0) return;
    memcpy(r->name, n2, sizeof n2);
}

static void parity_model(const char *spec, const char *ref_json, const char *label)
{
    char name[64];
    eng_model *m = NULL;
    int err = eng_model_load(spec, &m);
    if (err) {
        snprintf(name, sizeof name, "%s_load", label);
        addf(name, -1, 0, "", "model %s: %s", spec, eng_errmsg());
        return;
    }
    eng *cpu = gp_engine(m, "cpu", 160, 16), *gpu = gp_engine(m, dut_backend, 160, 16);
    gp_result r, inv[4];
#define PREFIXED(res) prefix_name(&(res), label)
    if (!gpu) {
        snprintf(name, sizeof name, "%s.create_cuda", label);
        addf(name, 0, 0, "", "eng_create(cuda): %s", eng_errmsg());
        goto out;
    }
    if (ref_json) {
        gp_result lo;
        gp_check_reference(gpu, m, ref_json, &r, &lo);
        PREFIXED(r);
        PREFIXED(lo);
        add(&r, "cases");
        add(&lo, "relL2");
        /* The same in fp32 mode: tells bf16 rounding apart from a bug when greedy diverges. */
        eng_cuda_dtype dt = gp_cuda.dtype;
        gp_cuda.dtype = ENG_CUDA_DTYPE_FP32;
        eng *g32 = gp_engine(m, dut_backend, 160, 16);
        gp_cuda.dtype = dt;
        if (g32) {
            gp_check_reference(g32, m, ref_json, &r, &lo);
            snprintf(r.name, sizeof r.name, "%s.fp32.greedy_reference", label);
            snprintf(lo.name, sizeof lo.name, "%s.fp32.logits_oracle", label);
            add(&r, "cases");
            add(&lo, "relL2");
            eng_destroy(g32);
        }
    }
    if (cpu) {
        gp_check_cpu_parity(cpu, gpu, m, &r);
        PREFIXED(r);
        add(&r, "relL2");
    } else {
        snprintf(name, sizeof name, "%s.cpu_parity", label);
        addf(name, -1, 0, "", "no CPU engine: %s", eng_errmsg());
    }
    gp_check_invariance(gpu, m, inv);
    for (int i = 0; i < 4; i++) {
        PREFIXED(inv[i]);
        add(&inv[i], "relL2");
    }
    for (int kind = 0; kind < 2; kind++) {
        gp_check_swap(gpu, m, kind, &r);
        PREFIXED(r);
        add(&r, "relL2");
    }
    gp_check_recompute(gpu, m, &r);
    PREFIXED(r);
    add(&r, "tokens");
    gp_check_sampling(gpu, m, &r);
    PREFIXED(r);
    add(&r, "tokens");
out:
    eng_destroy(cpu);
    eng_destroy(gpu);
    eng_model_free(m);
}

/* Device-generated weights (lazy model) against the host-converted copy of the same seed. */
static void parity_lazy(const char *preset)
{
    char a[96], b[96], name[64];
    snprintf(a, sizeof a, "synthetic:%s:5", preset);
    snprintf(b, sizeof b, "synthetic:lazy:%s:5", preset);
    snprintf(name, sizeof name, "%s.device_weights", preset);
    eng_model *ma = NULL, *mb = NULL;
    if (eng_model_load(a, &ma) || eng_model_load(b, &mb)) {
        addf(name, 0, 0, "", "load: %s", eng_errmsg());
        eng_model_free(ma);
        return;
    }
    eng *x = gp_engine(ma, "cuda", 160, 16), *y = gp_engine(mb, "cuda", 160, 16);
    if (x && y) {
        gp_result r;
        gp_check_identical(x, y, ma, name, &r);
        add(&r, "relL2");
    } else {
        addf(name, 0, 0, "", "eng_create: %s", eng_errmsg());
    }
    eng_destroy(x);
    eng_destroy(y);
    eng_model_free(ma);
    eng_model_free(mb);
}

/* ---- throughput ------------------------------------------------------------------------ */

typedef struct tp {
    eng *e;
    const eng_model_config *cfg;
    probes *p;
    int bs, bps; /* block size, blocks per sequence */
    int32_t *tokens, *positions, *qs, *lens, *table, *lrows;
    int64_t *slots;
    int32_t *out;
    uint64_t *rng;
    eng_sampling *samp;
} tp;

/* The batch arrays of t: rows tokens (and positions, slots), seqs sequences, table_len block
 * table entries, filled with the identity (sequence s owns blocks [s*bps, (s+1)*bps)).
 * Returns 0, or -ENOMEM with whatever was allocated left for tp_free. */
static int tp_alloc(tp *t, size_t rows, size_t seqs, size_t table_len)
{
    t->tokens = calloc(rows, 4);
    t->positions = calloc(rows, 4);
    t->slots = calloc(rows, 8);
    t->qs = calloc(seqs + 1, 4);
    t->lens = calloc(seqs, 4);
    t->lrows = calloc(seqs, 4);
    t->out = calloc(seqs, 4);
    t->rng = calloc(seqs, 8);
    t->samp = calloc(seqs, sizeof *t->samp);
    t->table = calloc(table_len, 4);
    if (!t->tokens || !t->positions || !t->slots || !t->qs || !t->lens || !t->lrows || !t->out ||
        !t->rng || !t->samp || !t->table)
        return -ENOMEM;
    for (size_t i = 0; i < table_len; i++) t->table[i] = (int32_t)i;
    return 0;
}

static void tp_free(tp *t)
{
    free(t->tokens);
    free(t->positions);
    free(t->slots);
    free(t->qs);
    free(t->lens);
    free(t->lrows);
    free(t->out);
    free(t->rng);
    free(t->samp);
    free(t->table);
}

/* n_seqs sequences (sequence s owns blocks [s*bps, (s+1)*bps)), each adding `rows` rows
 * after ctx tokens; greedy-sampled on the device. Returns 0 and the device ms, wall ms. */
static int tp_step_l(tp *t, int n_seqs, int rows, int ctx, double *dev_ms, double *wall_ms,
                     float *logits)
{
    int T = 0;
    for (int s = 0; s < n_seqs; s++) {
        t->qs[s] = T;
        t->lens[s] = ctx + rows;
        for (int i = 0; i < rows; i++, T++) {
            int pos = ctx + i;
            t->tokens[T] = (int32_t)(1 + ((uint64_t)s * 7919 + (uint64_t)pos * 104729) %
                                             (uint64_t)(t->cfg->vocab_size - 1));
            t->positions[T] = pos;
            t->slots[T] = (int64_t)t->table[s * t->bps + pos / t->bs] * t->bs + pos % t->bs;
        }
        t->lrows[s] = T - 1;
    }
    t->qs[n_seqs] = T;
    eng_batch b = {.n_tokens = T,
                   .tokens = t->tokens,
                   .positions = t->positions,
                   .slot_mapping = t->slots,
                   .n_seqs = n_seqs,
                   .query_start = t->qs,
                   .seq_len = t->lens,
                   .block_table = t->table,
                   .block_table_stride = t->bps,
                   .n_logits = n_seqs,
                   .logits_rows = t->lrows};
    double t0 = now_s();
    int err = eng_execute_sample(t->e, &b, t->samp, t->rng, t->out, logits);
    double t1 = now_s();
    if (err) {
        fprintf(stderr, "gpu_bench: execute (%d seqs x %d rows at %d): %s\n", n_seqs, rows, ctx,
                eng_errmsg());
        return err;
    }
    *dev_ms = t->p->last_ms();
    *wall_ms = (t1 - t0) * 1e3;
    return 0;
}

static int tp_step(tp *t, int n_seqs, int rows, int ctx, double *dev_ms, double *wall_ms)
{
    return tp_step_l(t, n_seqs, rows, ctx, dev_ms, wall_ms, NULL);
}

/* Batch-B decode with the skinny-GEMM path against cuBLAS (ringlm_cuda_set_gemv): logits of
 * one step compared, then the same timing loop. Leaves the path off. */
static void gemv_ab(tp *t, int B, int ctx0, int warm, int steps, double bytes_per_step,
                    double cublas_ms, double d2d)
{
    const int V = t->cfg->vocab_size;
    float *la = malloc((size_t)B * V * sizeof(float)), *lb = malloc((size_t)B * V * sizeof(float));
    double d, w, dev[64], wall[64];
    int n = 0, err = 0;
    char name[48];
    if (!la || !lb) {
        free(la);
        free(lb);
        return;
    }
    t->p->set_gemv(0);
    err = tp_step_l(t, B, 1, ctx0, &d, &w, la);
    t->p->set_gemv(1);
    if (!err) err = tp_step_l(t, B, 1, ctx0, &d, &w, lb);
    snprintf(name, sizeof name, "llama3.gemv_b%d_parity", B);
    if (err) {
        addf(name, 0, 0, "", "%s", eng_errmsg());
        goto out;
    }
    double rel = gp_rel_l2(lb, la, B * V);
    addf(name, rel <= GP_INV_TOL, rel, "relL2",
         "skinny GEMM vs cuBLAS logits, one decode step "
         "(tol %.0e)",
         GP_INV_TOL);
    for (int i = 0; i < warm + steps && !err; i++) {
        if ((err = tp_step(t, B, 1, ctx0 + i, &d, &w))) break;
        if (i >= warm && n < 64) {
            dev[n] = d;
            wall[n++] = w;
        }
    }
    snprintf(name, sizeof name, "llama3.decode_b%d_gemv_tok_s", B);
    if (err) {
        addf(name, 0, 0, "", "%s", eng_errmsg());
        goto out;
    }
    double md = bench_median(dev, n), mw = bench_median(wall, n);
    double gbs = bytes_per_step / (md * 1e-3) / 1e9;
    addf(name, 1, B * 1000.0 / md, "tok/s",
         "skinny GEMM path: %.3f ms device, %.3f ms wall, "
         "%.0f GB/s (%.0f%% of D2D); cuBLAS path %.3f ms",
         md, mw, gbs, d2d > 0 ? 100.0 * gbs / (d2d / 1e9) : 0.0, cublas_ms);
out:
    t->p->set_gemv(0);
    free(la);
    free(lb);
}

/* ---- GGUF files ---------------------------------------------------------------------- */

/* A private folder for the exported files (removed by gguf_dir_done). */
static char gguf_dir[64];

static int gguf_dir_make(void)
{
    snprintf(gguf_dir, sizeof gguf_dir, "/tmp/ringlm-gpu-gguf-XXXXXX");
    return mkdtemp(gguf_dir) ? 0 : -errno;
}

static void gguf_dir_done(void)
{
    if (gguf_dir[0]) nftw(gguf_dir, bench_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    gguf_dir[0] = '\0';
}

/* Exports spec as a GGUF file of type (arch NULL: llama) with a synthetic vocabulary into
 * gguf_dir/name; path gets the file's path. 0 or -errno with eng_errmsg(). */
static int gguf_export(const char *spec, const char *type, const char *arch, const char *name,
                       char *path, size_t len)
{
    eng_model *m = NULL;
    int err = eng_model_load(spec, &m);
    if (err) return err;
    snprintf(path, len, "%s/%s", gguf_dir, name);
    gw_export_opts o = {.type = type, .arch = arch};
    char note[1024] = "";
    err = gw_export_model(m, path, &o, note, sizeof note);
    eng_model_free(m);
    return err;
}

/* CUDA against the CPU on one exported file: greedy tokens (64 steps, each backend fed its
 * own picks), logits within the per-type tolerance, and the invariances. */
static void parity_gguf_file(const char *spec, const char *type, const char *arch,
                             const char *label)
{
    char path[PATH_MAX], name[64], fname[96];
    snprintf(fname, sizeof fname, "%s.gguf", label);
    snprintf(name, sizeof name, "%s.export", label);
    if (gguf_export(spec, type, arch, fname, path, sizeof path)) {
        addf(name, 0, 0, "", "%s as %s: %s", spec, type, eng_errmsg());
        return;
    }
    eng_model *m = NULL;
    if (eng_model_load(path, &m)) {
        snprintf(name, sizeof name, "%s.load", label);
        addf(name, 0, 0, "", "%s", eng_errmsg());
        return;
    }
    eng *cpu = gp_engine(m, "cpu", 160, 16), *gpu = gp_engine(m, dut_backend, 160, 16);
    gp_result r, inv[4];
    if (!cpu || !gpu) {
        snprintf(name, sizeof name, "%s.create", label);
        addf(name, 0, 0, "", "eng_create(%s): %s", cpu ? dut_backend : "cpu", eng_errmsg());
        goto out;
    }
    gp_check_greedy_match(cpu, gpu, m, 64, &r);
    prefix_name(&r, label);
    add(&r, "tokens");
    const int wt = eng_model_hparams_of(m)->weight_type;
    gp_check_cpu_parity_tol(cpu, gpu, m, gp_gguf_tol(wt), &r);
    prefix_name(&r, label);
    add(&r, "relL2");
    gp_check_invariance(gpu, m, inv);
    for (int i = 0; i < 4; i++) {
        prefix_name(&inv[i], label);
        add(&inv[i], "relL2");
    }
out:
    eng_destroy(cpu);
    eng_destroy(gpu);
    eng_model_free(m);
    unlink(path);
}

static void parity_gguf(const char *s260k)
{
    if (gguf_dir_make()) {
        addf("gguf", 0, 0, "", "cannot make a temporary folder: %s", strerror(errno));
        return;
    }
    static const char *const s260k_types[] = {"F16", "BF16", "Q8_0", "Q4_K_M"};
    char label[48];
    for (size_t i = 0; i < sizeof s260k_types / sizeof s260k_types[0]; i++) {
        snprintf(label, sizeof label, "gguf.s260k-%s", s260k_types[i]);
        if (s260k)
            parity_gguf_file(s260k, s260k_types[i], NULL, label);
        else
            addf(label, -1, 0, "", "stories260K.bin not found");
    }
    /* rows of whole 256-blocks: real Q4_K and Q6_K; qwen2: NEOX RoPE and Q/K/V biases; GQA */
    parity_gguf_file("synthetic:quant-test:4", "Q4_K_M", "qwen2", "gguf.qt-qwen2-Q4_K_M");
    parity_gguf_file("synthetic:quant-test:4", "Q6_K", NULL, "gguf.qt-Q6_K");
    parity_gguf_file("synthetic:gqa-test:4", "F16", NULL, "gguf.gqa-F16");
    parity_gguf_file("synthetic:gqa-test:4", "Q8_0", "qwen2", "gguf.gqa-qwen2-Q8_0");
    gguf_dir_done();
}

static void throughput(probes *p, int quick)
{
    char info[256] = "";
    if (p->device_info(info, sizeof info) == 0) addf("device", 1, 0, "", "%s", info);
    /* same-run baselines */
    double d2d = 0, gemm = 0, h2d = 0, d2h = 0;
    int err = p->d2d((size_t)2 << 30, quick ? 5 : 20, &d2d);
    addf("baseline.d2d_copy", err ? 0 : 1, d2d / 1e9, "GB/s", "%s",
         err ? eng_errmsg() : "2 GiB cudaMemcpy D2D, read+write bytes, median");
    err = p->gemm(8192, quick ? 5 : 20, &gemm);
    addf("baseline.gemm_bf16", err ? 0 : 1, gemm / 1e12, "TFLOP/s", "%s",
         err ? eng_errmsg() : "cublasGemmEx 8192^3 bf16 in, fp32 accumulate, median");
    err = p->memcpy_bw((size_t)1 << 30, 0, quick ? 3 : 10, &h2d, &d2h);
    addf("baseline.pinned_h2d", err ? 0 : 1, h2d / 1e9, "GB/s", "%s",
         err ? eng_errmsg() : "1 GiB pinned cudaMemcpyAsync host->device");
    addf("baseline.pinned_d2h", err ? 0 : 1, d2h / 1e9, "GB/s", "%s",
         err ? eng_errmsg() : "1 GiB pinned cudaMemcpyAsync device->host");

    eng_model *m = NULL;
    const char *spec = "synthetic:lazy:llama3-8b:1";
    if (eng_model_load(spec, &m)) {
        addf("llama3.load", 0, 0, "", "%s: %s", spec, eng_errmsg());
        return;
    }
    const eng_model_config *c = eng_model_cfg(m);
    const int ctx0 = 512, max_seqs = 256, steps = quick ? 8 : 24, warm = 3;
    tp t = {0};
    int memfd = -1;
    void *mfd_map = MAP_FAILED;
    size_t mfd_len = 0;
    t.cfg = c;
    t.p = p;
    t.bs = 16;
    t.bps = (ctx0 + 64 + t.bs - 1) / t.bs;
    const int blocks = max_seqs * t.bps;
    eng_options o = {.backend = "cuda",
                     .numa_node = -1,
                     .kv_blocks = blocks,
                     .kv_block_size = t.bs,
                     .max_batch_tokens = 4096,
                     .max_seqs = max_seqs,
                     .cuda_dtype = gp_cuda.dtype,
                     .cuda_no_graphs = gp_cuda.no_graphs};
    double t0 = now_s();
    err = eng_create(m, &o, &t.e);
    if (err) {
        addf("llama3.create", 0, 0, "", "%s", eng_errmsg());
        eng_model_free(m);
        return;
    }
    addf("llama3.create", 1, now_s() - t0, "s",
         "weights generated on the device; engine "
         "holds %.1f GiB (%d KV blocks of %zu bytes)",
         (double)eng_memory_bytes(t.e) / (1 << 30), blocks, eng_kv_block_bytes(t.e));
    const size_t T = 4096;
    if (tp_alloc(&t, T, (size_t)max_seqs, (size_t)blocks)) {
        addf("llama3.alloc", 0, 0, "", "out of memory");
        goto out;
    }
    const double L = c->n_layers, dim = c->dim, h = c->hidden_dim, V = c->vocab_size;
    const double kv = dim * c->n_kv_heads / c->n_heads;
    const double layer_params = dim * (dim + 2 * kv) + dim * dim + 3 * dim * h;
    const double elt = (double)eng_kv_block_bytes(t.e) / (L * 2 * kv * t.bs);
    const double kv_per_tok = (double)eng_kv_bytes_per_token(t.e);

    /* prefill: 4 sequences x 512 rows per batch (T = 2048) */
    {
        double dev[16], wall[16];
        int n = 0;
        const int seqs = 4, rows = 512;
        for (int i = 0; i < warm + (quick ? 4 : 10) && !err; i++) {
            double d, w;
            if ((err = tp_step(&t, seqs, rows, 0, &d, &w))) break;
            if (i >= warm) {
                dev[n] = d;
                wall[n++] = w;
            }
        }
        if (!err) {
            double md = bench_median(dev, n), mw = bench_median(wall, n);
            double flop = 2.0 * seqs * rows * L * layer_params + 2.0 * seqs * V * dim +
                          4.0 * L * dim * seqs * (rows * (rows + 1) / 2.0);
            double tflops = flop / (md * 1e-3) / 1e12;
            addf("llama3.prefill_tok_s", 1, seqs * rows / (md * 1e-3), "tok/s",
                 "4x512 rows per batch: %.2f ms device, %.2f ms wall (median of %d)", md, mw, n);
            addf("llama3.prefill_tflops", gemm > 0 && tflops >= 0.5 * gemm / 1e12, tflops,
                 "TFLOP/s", "%.0f%% of the same-run GEMM (goal >= 50%%)",
                 gemm > 0 ? 100.0 * tflops / (gemm / 1e12) : 0.0);
        } else {
            addf("llama3.prefill_tok_s", 0, 0, "", "%s", eng_errmsg());
        }
    }
    /* decode at 1, 16, 64, 256 sequences, each after a 512-token prefill */
    static const int batch[] = {1, 16, 64, 256};
    for (int bi = 0; bi < 4 && !err; bi++) {
        const int B = batch[bi];
        double d, w;
        for (int s0 = 0; s0 < B && !err; s0 += 4) {
            /* prefill 4 at a time through the shared table (sequence s0.. own their blocks) */
            int n = B - s0 < 4 ? B - s0 : 4;
            int32_t *saved = t.table;
            t.table = saved + (size_t)s0 * t.bps;
            err = tp_step(&t, n, ctx0, 0, &d, &w);
            t.table = saved;
        }
        if (err) break;
        double dev[64], wall[64];
        int n = 0, graphs = 0;
        for (int i = 0; i < warm + steps && !err; i++) {
            if ((err = tp_step(&t, B, 1, ctx0 + i, &d, &w))) break;
            if (i >= warm) {
                dev[n] = d;
                wall[n++] = w;
                graphs += p->last_graph();
            }
        }
        if (err) break;
        double md = bench_median(dev, n), mw = bench_median(wall, n);
        double ctx_avg = ctx0 + warm + steps / 2.0;
        double bytes = elt * (L * layer_params + V * dim) + B * ctx_avg * kv_per_tok;
        double gbs = bytes / (md * 1e-3) / 1e9;
        char name[48];
        snprintf(name, sizeof name, "llama3.decode_b%d_tok_s", B);
        if (B == 1) {
            addf(name, 1000.0 / md >= 240.0, 1000.0 / md, "tok/s",
                 "%.3f ms device, %.3f ms wall per step; graphs %d/%d (goal >= 240 tok/s)", md, mw,
                 graphs, n);
            addf("llama3.decode_b1_bw", d2d > 0 && gbs >= 0.75 * d2d / 1e9, gbs, "GB/s",
                 "%.0f%% of the same-run D2D copy (goal >= 75%%); %.2f GB read per step",
                 d2d > 0 ? 100.0 * gbs / (d2d / 1e9) : 0.0, bytes / 1e9);
            gemv_ab(&t, 1, ctx0, warm, steps, bytes, md, d2d);
        } else {
            addf(name, 1, B * 1000.0 / md, "tok/s",
                 "%.3f ms device, %.3f ms wall per step, "
                 "%.0f GB/s; graphs %d/%d",
                 md, mw, gbs, graphs, n);
        }
    }
    if (err) addf("llama3.decode", 0, 0, "", "%s", eng_errmsg());

    /* KV swap: 64 blocks out and in through eng_kv_transfer_async, pinned and memfd hosts */
    {
        const int nb = 64;
        const size_t bb = eng_kv_block_bytes(t.e);
        void *pinned = NULL;
        int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        memfd = memfd_create("gpu_bench_kv", MFD_CLOEXEC);
        if (memfd >= 0 && ftruncate(memfd, (off_t)(nb * bb)) == 0)
            mfd_map = mmap(NULL, nb * bb, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
        double sb_h2d = 0, sb_d2h = 0;
        (void)p->memcpy_bw(nb * bb, 0, 5, &sb_h2d, &sb_d2h);
        if (efd >= 0 && p->host_alloc(nb * bb, &pinned) == 0) {
            for (int kind = 0; kind < 2; kind++) {
                uint8_t *host = kind == 0 ? pinned : (mfd_map != MAP_FAILED ? mfd_map : NULL);
                if (!host) continue;
                int32_t blk[64];
                void *ptrs[64];
                for (int i = 0; i < nb; i++) {
                    blk[i] = 2 * i; /* every other block: one copy per block */
                    ptrs[i] = host + (size_t)i * bb;
                }
                for (int dir = 0; dir < 2; dir++) {
                    double v[16];
                    int n = 0;
                    for (int i = 0; i < 12; i++) {
                        double s0 = now_s();
                        if ((err = eng_kv_transfer_async(t.e, dir, blk, ptrs, nb, efd)) ||
                            (err = gp_wait_efd(efd, 1)))
                            break;
                        if (i >= 2) v[n++] = now_s() - s0;
                    }
                    char name[48];
                    snprintf(name, sizeof name, "swap.%s_%s", dir ? "in" : "out",
                             kind ? "memfd" : "pinned");
                    if (err) {
                        addf(name, 0, 0, "", "%s", eng_errmsg());
                        continue;
                    }
                    double bw = nb * bb / bench_median(v, n) / 1e9;
                    double ref = (dir ? sb_h2d : sb_d2h) / 1e9;
                    addf(name, ref > 0 && bw >= 0.8 * ref, bw, "GB/s",
                         "%d blocks of %zu bytes, submit to eventfd; %.0f%% of one %zu MiB "
                         "pinned cudaMemcpy (goal >= 80%%)",
                         nb, bb, ref > 0 ? 100.0 * bw / ref : 0.0, nb * bb >> 20);
                }
            }
            p->host_free(pinned);
        } else {
            addf("swap", 0, 0, "", "pinned allocation failed: %s", eng_errmsg());
        }
        /* per block size: one copy per block of 8/16/32/64 tokens */
        for (int tokens = 8; tokens <= 64; tokens *= 2) {
            size_t chunk = (size_t)(kv_per_tok * tokens);
            double a = 0, b = 0;
            if (p->memcpy_bw(nb * bb, chunk, 5, &a, &b) == 0) {
                char name[48];
                snprintf(name, sizeof name, "swap.block%d_h2d_d2h", tokens);
                addf(name, sb_h2d > 0 && a >= 0.8 * sb_h2d && b >= 0.8 * sb_d2h, a / 1e9, "GB/s",
                     "block of %d tokens = %zu bytes: h2d %.1f GB/s, d2h %.1f GB/s per-block "
                     "copies (%.0f%%, %.0f%% of one big copy)",
                     tokens, chunk, a / 1e9, b / 1e9, 100.0 * a / sb_h2d, 100.0 * b / sb_d2h);
            }
        }
        mfd_len = nb * bb;
        if (efd >= 0) close(efd);
    }
out:
    eng_destroy(t.e); /* unregisters the memfd mapping: unmap only after */
    if (mfd_map != MAP_FAILED) munmap(mfd_map, mfd_len);
    if (memfd >= 0) close(memfd);
    tp_free(&t);
    eng_model_free(m);
}

/* Decode tok/s of a GGUF (or any) model on the device at B sequences after ctx0 tokens:
 * the median of `steps` CUDA-event timed steps after 3 warm-ups. */
static int gguf_decode_rate(eng *e, const eng_model_config *c, probes *p, int B, int ctx0,
                            int steps, double *tok_s, double *ms)
{
    tp t = {0};
    t.e = e;
    t.cfg = c;
    t.p = p;
    t.bs = eng_kv_block_size(e);
    t.bps = (ctx0 + steps + 3 + t.bs - 1) / t.bs;
    const size_t T =
        (size_t)B * (size_t)ctx0 > 4 * (size_t)ctx0 ? 4 * (size_t)ctx0 : (size_t)B * ctx0;
    int err = tp_alloc(&t, T + (size_t)B, (size_t)B, (size_t)B * t.bps);
    if (!err) {
        double d, w, dev[64];
        int n = 0;
        for (int s0 = 0; s0 < B && !err; s0 += 4) { /* prefill 4 sequences at a time */
            int32_t *saved = t.table;
            t.table = saved + (size_t)s0 * t.bps;
            err = tp_step(&t, B - s0 < 4 ? B - s0 : 4, ctx0, 0, &d, &w);
            t.table = saved;
        }
        for (int i = 0; i < 3 + steps && !err; i++)
            if (!(err = tp_step(&t, B, 1, ctx0 + i, &d, &w)) && i >= 3 && n < 64) dev[n++] = d;
        if (!err) {
            *ms = bench_median(dev, n);
            *tok_s = B * 1000.0 / *ms;
        }
    }
    tp_free(&t);
    return err;
}

/* Load time and decode tok/s at 1 and 32 sequences of the stories110M shape (rows of whole
 * 256-blocks) from GGUF files of each type, beside the same weights loaded from float32. The
 * files that become bf16 on the device run the very computation of the float32 load, so
 * they must decode as fast (within 10%); F16 files run f16 GEMMs (reported). */
static void gguf_throughput(probes *p, int quick)
{
    const char *spec = "synthetic:stories110M:1";
    static const char *const types[] = {NULL /* float32 baseline */, "F16", "BF16", "Q8_0",
                                        "Q4_K_M"};
    const int Bs[2] = {1, 32}, ctx0 = 128, steps = quick ? 8 : 24;
    double base[2] = {0, 0};
    if (gguf_dir_make()) {
        addf("gguf.perf", 0, 0, "", "cannot make a temporary folder: %s", strerror(errno));
        return;
    }
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        char path[PATH_MAX], name[64], label[48];
        const char *type = types[ti];
        snprintf(label, sizeof label, "gguf.s110m-%s", type ? type : "f32bin");
        if (type) {
            char fname[64];
            snprintf(fname, sizeof fname, "s110m-%s.gguf", type);
            double t0 = now_s();
            if (gguf_export(spec, type, NULL, fname, path, sizeof path)) {
                snprintf(name, sizeof name, "%s.export", label);
                addf(name, 0, 0, "", "%s", eng_errmsg());
                continue;
            }
            printf("(exported %s in %.1f s)\n", fname, now_s() - t0);
        }
        eng_model *m = NULL;
        if (eng_model_load(type ? path : spec, &m)) {
            snprintf(name, sizeof name, "%s.load", label);
            addf(name, 0, 0, "", "%s", eng_errmsg());
            continue;
        }
        eng_options o = {.backend = "cuda",
                         .numa_node = -1,
                         .kv_blocks = 32 * 12,
                         .kv_block_size = 16,
                         .max_batch_tokens = 4 * ctx0,
                         .max_seqs = 32,
                         .cuda_dtype = gp_cuda.dtype,
                         .cuda_no_graphs = gp_cuda.no_graphs};
        eng *e = NULL;
        double t0 = now_s();
        int err = eng_create(m, &o, &e);
        double load_s = now_s() - t0;
        snprintf(name, sizeof name, "%s.create", label);
        if (err) {
            addf(name, 0, 0, "", "%s", eng_errmsg());
            eng_model_free(m);
            continue;
        }
        addf(name, 1, load_s, "s", "eng_create (upload%s), engine holds %.0f MiB",
             type && strcmp(type, "F16") && strcmp(type, "BF16") ? ", dequantized to bf16 on "
                                                                   "the host"
                                                                 : "",
             (double)eng_memory_bytes(e) / (1 << 20));
        for (int bi = 0; bi < 2; bi++) {
            double tok_s = 0, ms = 0;
            snprintf(name, sizeof name, "%s.decode_b%d_tok_s", label, Bs[bi]);
            if ((err =
                     gguf_decode_rate(e, eng_model_cfg(m), p, Bs[bi], ctx0, steps, &tok_s, &ms))) {
                addf(name, 0, 0, "", "%s", eng_errmsg());
                continue;
            }
            if (!type) {
                base[bi] = tok_s;
                addf(name, 1, tok_s, "tok/s", "%.3f ms per step; the float32-loaded baseline", ms);
                continue;
            }
            const bool bf16_dev = strcmp(type, "F16") != 0;
            const double ratio = base[bi] > 0 ? tok_s / base[bi] : 0;
            addf(name, bf16_dev ? ratio >= 0.9 : 1, tok_s, "tok/s",
                 "%.3f ms per step; %.2fx the float32-loaded shape%s", ms, ratio,
                 bf16_dev ? " (bf16 on the device either way: goal >= 0.9x)"
                          : " (f16 GEMMs; reported)");
        }
        eng_destroy(e);
        eng_model_free(m);
        if (type) unlink(path);
    }
    gguf_dir_done();
}

/* ---- main -------------------------------------------------------------------------------- */

static const char *find_file(const char *data, const char *name, char *buf, size_t len)
{
    const char *dirs[3] = {data, "gpu-data", NULL};
    char shared[PATH_MAX];
    const char *sh = getenv("RINGLM_SHARED");
    snprintf(shared, sizeof shared, "%s/models", sh && *sh ? sh : "../shared");
    dirs[2] = shared;
    for (int i = 0; i < 3; i++) {
        if (!dirs[i]) continue;
        snprintf(buf, len, "%s/%s", dirs[i], name);
        if (access(buf, R_OK) == 0) return buf;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const char *data = NULL, *json_path = NULL, *only = NULL;
    int quick = 0, ch;
    static const struct option opts[] = {
        {"data", required_argument, 0, 'd'},     {"json", required_argument, 0, 'j'},
        {"only", required_argument, 0, 'o'},     {"quick", no_argument, 0, 'q'},
        {"harness-on-cpu", no_argument, 0, 'C'}, {"no-cuda-graphs", no_argument, 0, 'G'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    while ((ch = getopt_long(argc, argv, "d:j:o:qh", opts, NULL)) != -1) {
        switch (ch) {
        case 'd': data = optarg; break;
        case 'j': json_path = optarg; break;
        case 'o': only = optarg; break;
        case 'q': quick = 1; break;
        case 'C':
            dut_backend = "cpu";
            only = "parity";
            break;
        case 'G': gp_cuda.no_graphs = true; break;
        default:
            fprintf(stderr, "usage: gpu_bench [--data DIR] [--json FILE] [--only parity|perf|gguf] "
                            "[--quick] [--harness-on-cpu] [--no-cuda-graphs]\n");
            return ch == 'h' ? 0 : 2;
        }
    }
    probes p;
    char info[256] = "cpu (--harness-on-cpu)";
    if (strcmp(dut_backend, "cuda") == 0 && load_probes(&p)) return 2;
    if (strcmp(dut_backend, "cuda") == 0 && p.device_info(info, sizeof info)) {
        fprintf(stderr, "gpu_bench: %s\n", eng_errmsg());
        return 2;
    }
    printf("gpu_bench on %s\n", info);
    if (!only || strcmp(only, "parity") == 0) {
        char model[PATH_MAX], ref[PATH_MAX];
        const char *mp = find_file(data, "stories260K.bin", model, sizeof model);
        const char *rp = find_file(data, "reference-greedy.json", ref, sizeof ref);
        if (mp)
            parity_model(mp, rp, "stories260K");
        else
            addf("stories260K", -1, 0, "",
                 "stories260K.bin not found (--data, gpu-data/, "
                 "$RINGLM_SHARED/models)");
        parity_model("synthetic:gqa-test:1", NULL, "gqa-test");
        if (strcmp(dut_backend, "cuda") == 0) parity_lazy("gqa-test");
    }
    if (!only || strcmp(only, "parity") == 0 || strcmp(only, "gguf") == 0) {
        char model[PATH_MAX];
        parity_gguf(find_file(data, "stories260K.bin", model, sizeof model));
    }
    if (!only || strcmp(only, "perf") == 0) throughput(&p, quick);
    if (strcmp(dut_backend, "cuda") == 0 &&
        (!only || strcmp(only, "perf") == 0 || strcmp(only, "gguf") == 0))
        gguf_throughput(&p, quick);

    int failed = 0, passed = 0, skipped = 0;
    for (int i = 0; i < n_results; i++) {
        failed += results[i].pass == 0;
        passed += results[i].pass > 0;
        skipped += results[i].pass < 0;
    }
    printf("\n== summary ==\n");
    for (int i = 0; i < n_results; i++)
        printf("%-4s %-36s %12.4g %s\n",
               results[i].pass > 0    ? "PASS"
               : results[i].pass == 0 ? "FAIL"
                                      : "SKIP",
               results[i].name, results[i].value, units[i]);
    printf("\n%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (json_path) {
        json_t *root = json_object(), *arr = json_array();
        json_object_set_new(root, "device", json_string(info));
        for (int i = 0; i < n_results; i++) {
            json_t *o = json_object();
            json_object_set_new(o, "name", json_string(results[i].name));
            json_object_set_new(o, "status",
                                json_string(results[i].pass > 0    ? "pass"
                                            : results[i].pass == 0 ? "fail"
                                                                   : "skip"));
            json_object_set_new(o, "value", json_real(results[i].value));
            json_object_set_new(o, "unit", json_string(units[i]));
            json_object_set_new(o, "detail", json_string(results[i].detail));
            json_array_append_new(arr, o);
        }
        json_object_set_new(root, "results", arr);
        json_object_set_new(root, "passed", json_integer(passed));
        json_object_set_new(root, "failed", json_integer(failed));
        if (json_dump_file(root, json_path, JSON_INDENT(1)))
            fprintf(stderr, "gpu_bench: cannot write %s\n", json_path);
        json_decref(root);
    }
    return failed ? 1 : 0;
}
