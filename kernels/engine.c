/* SPDX-License-Identifier: MIT */
/*
 * kernels/engine.c — backend dispatch (CPU built in, CUDA as a dlopen()ed plugin), batch
 * validation shared by every backend, and the thin wrappers of engine.h.
 */
#include "kernels/engine.h"
#include "kernels/devload.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct eng {
    const eng_backend_ops *ops;
    void *priv;
    const eng_model *model;
    eng_options opt;
    void *plugin;         /* dlopen handle of the CUDA plugin, NULL for CPU */
    float *sample_logits; /* eng_execute_sample's logits when the caller passes none */
    size_t sample_logits_rows;
    /* the batch check's per-block stamps: which batch (blk_gen) and sequence (blk_seq) last
     * wrote into each KV block, so a block written by two sequences is seen in O(T) */
    uint32_t *blk_gen;
    int32_t *blk_seq;
    uint32_t gen;
    int ring_blocks;     /* blocks per window ring (opt.kv_rings > 0) */
    uint32_t *ring_seen; /* [kv_rings]: the batch check's stamp (gen) of each ring it saw */
};

/* ---- backend lookup ----------------------------------------------------------------- */

/* $RINGLM_CUDA_LIB, else <dir of the executable>/../lib/libringlm_cuda.so, else the
 * soname through the normal library search path. */
static int load_cuda_plugin(void **handle, const eng_backend_ops **ops)
{
    char tried[1024] = "";
    char path[PATH_MAX + 32];
    const char *candidates[3];
    int n = 0;
    const char *env = getenv("RINGLM_CUDA_LIB");
    if (env && *env) candidates[n++] = env;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(path, sizeof path, "%s/../lib/libringlm_cuda.so", exe);
            candidates[n++] = path;
        }
    }
    candidates[n++] = "libringlm_cuda.so";
    for (int i = 0; i < n; i++) {
        void *h = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            size_t used = strlen(tried);
            snprintf(tried + used, sizeof tried - used, "%s%s", used ? "; " : "", dlerror());
            continue;
        }
        eng_backend_entry_fn entry = (eng_backend_entry_fn)dlsym(h, ENG_CUDA_ENTRY);
        if (!entry) {
            dlclose(h);
            return eng_seterr(-ENODEV, "%s has no symbol %s", candidates[i], ENG_CUDA_ENTRY);
        }
        const eng_backend_ops *o = entry();
        if (!o || !o->create || !o->execute) {
            dlclose(h);
            return eng_seterr(-ENODEV, "%s: %s returned no usable backend table", candidates[i],
                              ENG_CUDA_ENTRY);
        }
        *handle = h;
        *ops = o;
        return 0;
    }
    return eng_seterr(-ENODEV,
                      "backend \"cuda\": plugin libringlm_cuda.so not found (set "
                      "RINGLM_CUDA_LIB; tried: %s)",
                      tried);
}

/* ---- lifecycle ---------------------------------------------------------------------- */

const char *eng_cuda_dtype_name(eng_cuda_dtype d)
{
    return d == ENG_CUDA_DTYPE_BF16 ? "bf16" : d == ENG_CUDA_DTYPE_FP32 ? "fp32" : NULL;
}

int eng_cuda_dtype_parse(const char *s)
{
    for (int d = 0; s && d < ENG_CUDA_DTYPE__COUNT; d++)
        if (!strcmp(s, eng_cuda_dtype_name((eng_cuda_dtype)d))) return d;
    return -1;
}

int eng_create(const eng_model *m, const eng_options *opt, eng **out)
{
    *out = NULL;
    if (!m || !opt) return eng_seterr(-EINVAL, "eng_create: model and options are required");
    if (opt->kv_blocks <= 0)
        return eng_seterr(-EINVAL, "kv_blocks=%d: must be >= 1", opt->kv_blocks);
    if (opt->kv_block_size <= 0 || opt->kv_block_size > 4096)
        return eng_seterr(-EINVAL, "kv_block_size=%d: must be 1..4096", opt->kv_block_size);
    if (opt->max_batch_tokens <= 0)
        return eng_seterr(-EINVAL, "max_batch_tokens=%d: must be >= 1", opt->max_batch_tokens);
    if (opt->max_seqs <= 0) return eng_seterr(-EINVAL, "max_seqs=%d: must be >= 1", opt->max_seqs);
    if (opt->n_threads < 0 || opt->n_threads > 1024)
        return eng_seterr(-EINVAL, "n_threads=%d: must be 0..1024", opt->n_threads);
    if (opt->cuda_device < 0)
        return eng_seterr(-EINVAL, "cuda_device=%d: must be >= 0", opt->cuda_device);
    if ((unsigned)opt->cuda_dtype >= ENG_CUDA_DTYPE__COUNT)
        return eng_seterr(-EINVAL, "cuda_dtype=%d: not an eng_cuda_dtype", (int)opt->cuda_dtype);
    if ((long long)opt->kv_blocks * opt->kv_block_size > INT32_MAX)
        return eng_seterr(-EINVAL, "kv_blocks*kv_block_size=%lld: more slots than int32 holds",
                          (long long)opt->kv_blocks * opt->kv_block_size);
    if (opt->kv_rings < 0 || opt->kv_ring_rows < 0)
        return eng_seterr(-EINVAL, "kv_rings=%d, kv_ring_rows=%d: must be >= 0", opt->kv_rings,
                          opt->kv_ring_rows);
    if (opt->kv_rings > 0 && !eng_model_mixed_window(m))
        return eng_seterr(-EINVAL,
                          "kv_rings=%d: window rings are for a model with windowed and global "
                          "layers (gemma2, gemma3); this one has %s",
                          opt->kv_rings,
                          eng_model_hparams_of(m)->swa_window > 0 ? "every layer windowed"
                                                                  : "no windowed layer");
    eng *e = calloc(1, sizeof *e);
    if (!e) return eng_seterr(-ENOMEM, "out of memory");
    e->model = m;
    e->opt = *opt;
    if (e->opt.kv_rings > 0) {
        if (!e->opt.kv_ring_rows || e->opt.kv_ring_rows > opt->max_batch_tokens)
            e->opt.kv_ring_rows = opt->max_batch_tokens;
        e->ring_blocks =
            eng_kv_ring_blocks_for(eng_model_hparams_of(m)->swa_window, e->opt.kv_ring_rows,
                                   opt->kv_block_size, eng_model_cfg(m)->seq_len);
        e->ring_seen = calloc((size_t)opt->kv_rings, sizeof *e->ring_seen);
        if (!e->ring_seen) {
            free(e);
            return eng_seterr(-ENOMEM, "out of memory");
        }
    }
    e->blk_gen = calloc((size_t)opt->kv_blocks, sizeof *e->blk_gen);
    e->blk_seq = calloc((size_t)opt->kv_blocks, sizeof *e->blk_seq);
    if (!e->blk_gen || !e->blk_seq) {
        free(e->blk_gen);
        free(e->blk_seq);
        free(e);
        return eng_seterr(-ENOMEM, "out of memory");
    }
    const char *backend = opt->backend ? opt->backend : "cpu";
    e->opt.backend = NULL; /* the caller's string need not outlive us */
    int err;
    if (strcmp(backend, "cpu") == 0) {
        e->ops = eng_cpu_backend();
    } else if (strcmp(backend, "cuda") == 0) {
        /* What the device kernels cannot run (a head size, a tensor type, ...) is refused
         * here, before a plugin or a device is looked for (kernels/devload.h). */
        eng_dev_plan plan;
        if ((err = eng_dev_plan_model(m, false, &plan))) goto fail;
        if ((err = load_cuda_plugin(&e->plugin, &e->ops))) goto fail;
    } else {
        err = eng_seterr(-EINVAL, "backend \"%s\": must be \"cpu\" or \"cuda\"", backend);
        goto fail;
    }
    if (e->opt.kv_rings > 0 && (!e->ops->kv_ring_ptr || !e->ops->kv_ring_bytes)) {
        err = eng_seterr(-ENOTSUP,
                         "kv_rings=%d: backend %s keeps every layer's K/V in its blocks (no "
                         "window rings); run mixed-window models there without rings",
                         e->opt.kv_rings, e->ops->name);
        goto fail;
    }
    if ((err = e->ops->create(e, m, &e->opt, &e->priv))) goto fail;
    *out = e;
    return 0;
fail:
    if (e->plugin) dlclose(e->plugin);
    free(e->ring_seen);
    free(e->blk_gen);
    free(e->blk_seq);
    free(e);
    return err;
}

void eng_destroy(eng *e)
{
    if (!e) return;
    if (e->ops && e->priv) e->ops->destroy(e->priv);
    if (e->plugin) dlclose(e->plugin);
    free(e->sample_logits);
    free(e->ring_seen);
    free(e->blk_gen);
    free(e->blk_seq);
    free(e);
}

const char *eng_backend_name(const eng *e)
{
    return e->ops->name;
}

void eng_describe_paths(const eng *e, char *buf, size_t cap)
{
    if (cap) *buf = 0;
    if (e->ops->describe && cap) e->ops->describe(e->priv, buf, cap);
}

/* ---- KV geometry and copies --------------------------------------------------------- */

size_t eng_kv_bytes_per_token(const eng *e)
{
    return e->ops->kv_block_bytes(e->priv) / (size_t)e->opt.kv_block_size;
}
size_t eng_kv_block_bytes(const eng *e)
{
    return e->ops->kv_block_bytes(e->priv);
}
int eng_kv_blocks(const eng *e)
{
    return e->opt.kv_blocks;
}
int eng_kv_block_size(const eng *e)
{
    return e->opt.kv_block_size;
}
int eng_kv_window(const eng *e)
{
    const eng_model_hparams *hp = eng_model_hparams_of(e->model);
    /* the CPU backend windows every layer eng_layer_windowed names; CUDA none */
    if (!hp || hp->swa_window <= 0 || hp->swa_period > 0 || strcmp(e->ops->name, "cpu")) return 0;
    return hp->swa_window;
}
bool eng_model_mixed_window(const eng_model *m)
{
    const eng_model_hparams *hp = eng_model_hparams_of(m);
    if (!hp) return false;
    const int L = eng_model_cfg(m)->n_layers;
    int windowed = 0;
    for (int l = 0; l < L; l++) windowed += eng_layer_windowed(hp, l);
    return windowed > 0 && windowed < L;
}
int eng_kv_rings(const eng *e)
{
    return e->opt.kv_rings;
}
int eng_kv_ring_blocks(const eng *e)
{
    return e->opt.kv_rings ? e->ring_blocks : 0;
}
size_t eng_kv_ring_bytes(const eng *e)
{
    return e->opt.kv_rings ? e->ops->kv_ring_bytes(e->priv) : 0;
}
void *eng_kv_ring_ptr(eng *e, int ring)
{
    if (ring < 0 || ring >= e->opt.kv_rings) return NULL;
    return e->ops->kv_ring_ptr(e->priv, ring);
}
int eng_kv_copy_ring(eng *e, int src, int dst)
{
    void *s = eng_kv_ring_ptr(e, src), *d = eng_kv_ring_ptr(e, dst);
    if (!s || !d)
        return eng_seterr(-EINVAL, "copy ring %d to %d: the engine has rings 0..%d", src, dst,
                          e->opt.kv_rings - 1);
    if (s != d) memcpy(d, s, eng_kv_ring_bytes(e));
    return 0;
}
size_t eng_memory_bytes(const eng *e)
{
    return e->ops->memory_bytes(e->priv);
}

void *eng_kv_block_ptr(eng *e, int block)
{
    if (!e->ops->kv_block_ptr || block < 0 || block >= e->opt.kv_blocks) return NULL;
    return e->ops->kv_block_ptr(e->priv, block);
}

void *eng_kv_pool_base(eng *e, size_t *len)
{
    if (!e->ops->kv_pool_base) {
        if (len) *len = 0;
        return NULL;
    }
    return e->ops->kv_pool_base(e->priv, len);
}

static int check_block(const eng *e, int block, const char *what)
{
    if (block < 0 || block >= e->opt.kv_blocks)
        return eng_seterr(-EINVAL, "%s block %d: pool has blocks 0..%d", what, block,
                          e->opt.kv_blocks - 1);
    return 0;
}

int eng_kv_read_block(eng *e, int block, void *dst)
{
    int err = check_block(e, block, "read");
    return err ? err : e->ops->kv_read_block(e->priv, block, dst);
}

int eng_kv_write_block(eng *e, int block, const void *src)
{
    int err = check_block(e, block, "write");
    return err ? err : e->ops->kv_write_block(e->priv, block, src);
}

int eng_kv_copy_blocks(eng *e, const int32_t *src, const int32_t *dst, int n)
{
    if (n < 0 || (n && (!src || !dst)))
        return eng_seterr(-EINVAL, "kv_copy_blocks: n=%d with %s", n, "NULL arrays");
    for (int i = 0; i < n; i++) {
        int err = check_block(e, src[i], "copy source");
        if (!err) err = check_block(e, dst[i], "copy destination");
        if (err) return err;
    }
    return n ? e->ops->kv_copy_blocks(e->priv, src, dst, n) : 0;
}

int eng_kv_transfer_async(eng *e, int dir, const int32_t *blocks, void *const *host, int n, int efd)
{
    if (!e->ops->kv_transfer_async)
        return eng_seterr(-ENOTSUP, "backend %s has no async KV transfer (use eng_kv_block_ptr)",
                          e->ops->name);
    if (dir != ENG_KV_OUT && dir != ENG_KV_IN)
        return eng_seterr(-EINVAL, "transfer dir=%d: must be ENG_KV_OUT or ENG_KV_IN", dir);
    if (n < 0 || (n && (!blocks || !host)))
        return eng_seterr(-EINVAL, "transfer n=%d with NULL arrays", n);
    for (int i = 0; i < n; i++) {
        int err = check_block(e, blocks[i], "transfer");
        if (err) return err;
    }
    return e->ops->kv_transfer_async(e->priv, dir, blocks, host, n, efd);
}

/* ---- batches ------------------------------------------------------------------------ */

int eng_batch_check(eng *e, const eng_batch *b)
{
    const eng_model_config *c = eng_model_cfg(e->model);
    const int T = b->n_tokens, S = b->n_seqs, bs = e->opt.kv_block_size;
    if (T < 1 || T > e->opt.max_batch_tokens)
        return eng_seterr(-EINVAL, "batch n_tokens=%d: must be 1..%d (max_batch_tokens)", T,
                          e->opt.max_batch_tokens);
    if (S < 1 || S > e->opt.max_seqs || S > T)
        return eng_seterr(-EINVAL, "batch n_seqs=%d: must be 1..%d (max_seqs) and <= n_tokens=%d",
                          S, e->opt.max_seqs, T);
    if (!b->tokens || !b->positions || !b->slot_mapping || !b->query_start || !b->seq_len ||
        !b->block_table)
        return eng_seterr(-EINVAL, "batch: tokens, positions, slot_mapping, query_start, seq_len "
                                   "and block_table are required");
    if (b->n_logits < 0 || b->n_logits > T || (b->n_logits && !b->logits_rows))
        return eng_seterr(-EINVAL, "batch n_logits=%d: must be 0..n_tokens=%d with logits_rows",
                          b->n_logits, T);
    if (b->query_start[0] != 0 || b->query_start[S] != T)
        return eng_seterr(-EINVAL,
                          "batch query_start[0]=%d, query_start[%d]=%d: must be 0 and "
                          "n_tokens=%d",
                          b->query_start[0], S, b->query_start[S], T);
    for (int r = 0; r < T; r++)
        if (b->tokens[r] < 0 || b->tokens[r] >= c->vocab_size)
            return eng_seterr(-EINVAL, "batch token %d is %d: vocabulary has %d tokens", r,
                              b->tokens[r], c->vocab_size);
    int need_stride = 0;
    for (int s = 0; s < S; s++) {
        int q0 = b->query_start[s], q1 = b->query_start[s + 1];
        if (q1 <= q0 || q1 > T)
            return eng_seterr(-EINVAL,
                              "batch query_start[%d]=%d, [%d]=%d: each sequence needs "
                              ">= 1 row within n_tokens=%d",
                              s, q0, s + 1, q1, T);
        int len = b->seq_len[s];
        if (len < q1 - q0 || len > c->seq_len)
            return eng_seterr(-EINVAL,
                              "batch seq_len[%d]=%d: must be %d..%d (its rows .. model "
                              "seq_len)",
                              s, len, q1 - q0, c->seq_len);
        if (b->prompt_len && b->prompt_len[s] < 0)
            return eng_seterr(-EINVAL, "batch prompt_len[%d]=%d: must be >= 0", s,
                              b->prompt_len[s]);
        int blocks = (len + bs - 1) / bs;
        if (blocks > need_stride) need_stride = blocks;
    }
    if (b->block_table_stride < need_stride)
        return eng_seterr(-EINVAL,
                          "batch block_table_stride=%d: seq_len needs %d blocks of %d "
                          "tokens",
                          b->block_table_stride, need_stride, bs);
    const int window = eng_kv_window(e);
    for (int s = 0; s < S; s++) {
        int q0 = b->query_start[s], q1 = b->query_start[s + 1], len = b->seq_len[s];
        const int32_t *bt = b->block_table + (size_t)s * (size_t)b->block_table_stride;
        /* with every layer windowed, the blocks wholly before the first row's window are not
         * read (attention.c starts at the block of position first + 1 - window): those
         * entries may be -1, given back */
        int first = len - (q1 - q0),
            unread = window && first + 1 > window ? (first + 1 - window) / bs : 0;
        for (int j = 0; j < (len + bs - 1) / bs; j++)
            if (bt[j] == -1 && j < unread)
                continue;
            else if (bt[j] < 0 || bt[j] >= e->opt.kv_blocks)
                return eng_seterr(-EINVAL, "batch block_table[%d][%d]=%d: pool has blocks 0..%d", s,
                                  j, bt[j], e->opt.kv_blocks - 1);
        for (int r = q0; r < q1; r++) {
            int want_pos = len - (q1 - r);
            if (b->positions[r] != want_pos)
                return eng_seterr(-EINVAL,
                                  "batch positions[%d]=%d: sequence %d's rows must sit "
                                  "at consecutive positions ending at seq_len-1=%d, so "
                                  "%d",
                                  r, b->positions[r], s, len - 1, want_pos);
            int64_t want_slot = (int64_t)bt[want_pos / bs] * bs + want_pos % bs;
            if (b->slot_mapping[r] != want_slot)
                return eng_seterr(-EINVAL,
                                  "batch slot_mapping[%d]=%lld: position %d of sequence "
                                  "%d lives in slot %lld per its block table",
                                  r, (long long)b->slot_mapping[r], want_pos, s,
                                  (long long)want_slot);
        }
    }
    /* Two rows writing one KV slot (two sequences whose block tables share a block, both
     * computing a position in it) would leave which K/V survives to the kernel's schedule:
     * refuse the batch. Rows of one sequence sit at distinct positions, so only a block that
     * a second sequence writes into needs a look at the rows before it (a rare path). */
    if (++e->gen == 0) {
        if (e->ring_seen) memset(e->ring_seen, 0, (size_t)e->opt.kv_rings * sizeof *e->ring_seen);
        memset(e->blk_gen, 0, (size_t)e->opt.kv_blocks * sizeof *e->blk_gen);
        e->gen = 1;
    }
    for (int s = 0; s < S; s++)
        for (int r = b->query_start[s]; r < b->query_start[s + 1]; r++) {
            int64_t blk = b->slot_mapping[r] / bs;
            if (e->blk_gen[blk] == e->gen && e->blk_seq[blk] != s)
                for (int q = 0; q < b->query_start[s]; q++)
                    if (b->slot_mapping[q] == b->slot_mapping[r])
                        return eng_seterr(-EINVAL,
                                          "batch slot_mapping[%d] and [%d] are both slot "
                                          "%lld: two rows would write one KV slot (block "
                                          "tables share block %lld)",
                                          q, r, (long long)b->slot_mapping[r], (long long)blk);
            e->blk_gen[blk] = e->gen;
            e->blk_seq[blk] = s;
        }
    /* Window rings: each sequence its own ring (two writing one ring would overwrite each
     * other's window), and no more rows than a ring spans beside the window. */
    for (int s = 0; e->opt.kv_rings && s < S; s++) {
        const int rows = b->query_start[s + 1] - b->query_start[s];
        if (!b->ring || b->ring[s] < 0 || b->ring[s] >= e->opt.kv_rings)
            return eng_seterr(-EINVAL, "batch ring[%d]=%d: the engine has window rings 0..%d", s,
                              b->ring ? b->ring[s] : -1, e->opt.kv_rings - 1);
        if (rows > e->opt.kv_ring_rows)
            return eng_seterr(-EINVAL,
                              "batch sequence %d: %d rows, a window ring spans %d rows beside "
                              "the window",
                              s, rows, e->opt.kv_ring_rows);
        if (e->ring_seen[b->ring[s]] == e->gen)
            return eng_seterr(-EINVAL, "batch ring[%d]=%d: another sequence of the batch has it", s,
                              b->ring[s]);
        e->ring_seen[b->ring[s]] = e->gen;
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logits_rows[i] < 0 || b->logits_rows[i] >= T)
            return eng_seterr(-EINVAL, "batch logits_rows[%d]=%d: must be 0..%d", i,
                              b->logits_rows[i], T - 1);
    return 0;
}

int eng_execute(eng *e, const eng_batch *b, float *logits)
{
    int err = eng_batch_check(e, b);
    if (err) return err;
    if (b->n_logits && !logits)
        return eng_seterr(-EINVAL, "eng_execute: n_logits=%d but logits is NULL", b->n_logits);
    return e->ops->execute(e->priv, b, logits);
}

/* The engine's own logits buffer for n rows, kept across calls: a step's logits are
 * megabytes, too big to map afresh each time. NULL with the error set when out of memory. */
static float *sample_buf(eng *e, int n, int vocab)
{
    if (e->sample_logits_rows < (size_t)n) {
        free(e->sample_logits);
        e->sample_logits_rows = 0;
        e->sample_logits = malloc((size_t)n * (size_t)vocab * sizeof(float));
        if (!e->sample_logits) {
            eng_seterr(-ENOMEM, "out of memory for %d logits rows", n);
            return NULL;
        }
        e->sample_logits_rows = (size_t)n;
    }
    return e->sample_logits;
}

int eng_execute_sample(eng *e, const eng_batch *b, const eng_sampling *s, uint64_t *rng,
                       int32_t *out_tokens, float *logits)
{
    int err = eng_batch_check(e, b);
    if (err) return err;
    if (b->n_logits && (!s || !rng || !out_tokens))
        return eng_seterr(-EINVAL, "eng_execute_sample: sampling, rng and out_tokens required");
    bool host = false; /* a row with processors is sampled here (kernels/logits.h) */
    for (int i = 0; i < b->n_logits && !host; i++) host = s[i].proc != NULL;
    if (e->ops->execute_sample && !host)
        return e->ops->execute_sample(e->priv, b, s, rng, out_tokens, logits);
    const int vocab = eng_model_cfg(e->model)->vocab_size;
    float *buf = logits;
    if (!buf && b->n_logits && !(buf = sample_buf(e, b->n_logits, vocab))) return -ENOMEM;
    err = e->ops->execute(e->priv, b, buf);
    /* A row whose constraint stage fails gets -1; the other rows are sampled as usual. */
    for (int i = 0; !err && i < b->n_logits; i++)
        out_tokens[i] = eng_sample(buf + (size_t)i * (size_t)vocab, vocab, &s[i], &rng[i]);
    return err;
}

/* One row's log-probabilities: a task of eng_execute_sample_lp, on the backend's threads. */
typedef struct lp_job {
    const float *logits;
    int vocab;
    const eng_logprob_want *want;
    const eng_sampling *s;
    const int32_t *targets;
    const int32_t *rows; /* the logits rows that want log-probabilities */
    eng_logprobs *out;
    _Atomic int err;
} lp_job;

static void lp_task(void *ctx, int task)
{
    lp_job *j = ctx;
    int i = j->rows[task];
    const float *row = j->logits + (size_t)i * (size_t)j->vocab;
    float *proc = NULL;
    if (j->want[i].processed) {
        /* opt-in and rare: a vocabulary's row of its own */
        if (!(proc = malloc((size_t)j->vocab * sizeof(float)))) {
            j->err = -ENOMEM;
            return;
        }
        eng_logits_processed(row, j->vocab, &j->s[i], proc);
        row = proc;
    }
    if (eng_logprobs_row(row, j->vocab, j->targets[i], j->want[i].top_n, &j->out[i]) < 0)
        j->err = -EINVAL;
    free(proc);
}

int eng_execute_sample_lp(eng *e, const eng_batch *b, const eng_sampling *s, uint64_t *rng,
                          int32_t *out_tokens, const eng_logprob_want *want, eng_logprobs *out)
{
    bool any = false;
    for (int i = 0; want && i < b->n_logits && !any; i++)
        any = want[i].top_n >= 0 || want[i].no_sample;
    if (!any) return eng_execute_sample(e, b, s, rng, out_tokens, NULL);
    int err = eng_batch_check(e, b);
    if (err) return err;
    if (!s || !rng || !out_tokens || !out)
        return eng_seterr(-EINVAL, "eng_execute_sample_lp: sampling, rng, out_tokens and out "
                                   "required");
    const int vocab = eng_model_cfg(e->model)->vocab_size;
    for (int i = 0; i < b->n_logits; i++)
        if (want[i].top_n > ENG_TOP_LOGPROBS_MAX || want[i].target >= vocab)
            return eng_seterr(-EINVAL, "logits row %d: top_n %d (at most %d), target %d (vocab %d)",
                              i, want[i].top_n, ENG_TOP_LOGPROBS_MAX, want[i].target, vocab);
    float *buf = sample_buf(e, b->n_logits, vocab);
    int32_t *scratch = malloc(2 * (size_t)b->n_logits * sizeof(int32_t));
    if (!buf || !scratch) {
        free(scratch);
        return eng_seterr(-ENOMEM, "out of memory for %d logits rows", b->n_logits);
    }
    int32_t *targets = scratch, *rows = scratch + b->n_logits;
    err = e->ops->execute(e->priv, b, buf);
    int n_rows = 0;
    for (int i = 0; !err && i < b->n_logits; i++) {
        targets[i] = want[i].target;
        if (want[i].no_sample) {
            out_tokens[i] = -1;
        } else {
            out_tokens[i] = eng_sample(buf + (size_t)i * (size_t)vocab, vocab, &s[i], &rng[i]);
            /* its constraint stage failed: -1 for this row alone, no log-probabilities */
            if (out_tokens[i] < 0) continue;
            targets[i] = out_tokens[i];
        }
        if (want[i].top_n >= 0) rows[n_rows++] = i;
    }
    /* The rows are independent: on the backend's threads (the CPU pool), not the caller's
     * alone, so a batch of 32 sequences that ask costs a fraction of a step, not a step. */
    lp_job job = {.logits = buf,
                  .vocab = vocab,
                  .want = want,
                  .s = s,
                  .targets = targets,
                  .rows = rows,
                  .out = out,
                  .err = 0};
    if (!err && n_rows > 1 && e->ops->run_tasks)
        e->ops->run_tasks(e->priv, n_rows, lp_task, &job);
    else
        for (int k = 0; !err && k < n_rows; k++) lp_task(&job, k);
    if (!err && job.err)
        err = eng_seterr(job.err, "log-probabilities: %s",
                         job.err == -ENOMEM ? "out of memory for a processed row" : "bad row");
    free(scratch);
    return err;
}

int eng_phase_stats_get(eng *e, eng_phase_stats *out, bool reset)
{
    if (e->ops != eng_cpu_backend())
        return eng_seterr(-ENOTSUP, "backend %s keeps no phase times", e->ops->name);
    return eng_cpu_phase_stats(e->priv, out, reset);
}
