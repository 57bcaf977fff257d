/* SPDX-License-Identifier: MIT */
/*
 * engine_bench — CPU engine throughput on a model (synthetic shapes by default):
 * decode tokens/s at 1, 4, 8, 16, 32 and 64 concurrent sequences (--seqs), prefill
 * tokens/s, and the step time split by phase, each the median over repeats with the
 * spread (lowest and highest repeat). The baseline, measured in the same run, is a naive
 * llama2.c-style forward (one row, plain loops, one thread, contiguous cache). To compare
 * two builds of the engine side by side, run both binaries alternately (perf/engine_ab.sh).
 *
 *   engine_bench --model synthetic:stories15M:1 [--threads N] [--repeats R] [--steps N]
 *                [--context N] [--seqs 1,4,8,16,32,64] [--no-naive] [--json] [--procs S]
 *
 * --procs S adds a side-by-side measurement at S sequences of sampled decode
 * (eng_execute_sample, greedy): plain, and with a logits pipeline on every sequence (16 logit
 * biases, repetition 1.1, presence 0.4, frequency 0.3, the context's tokens seen), the two
 * alternating within each repeat; the ratio of their medians is what the processors cost.
 *
 * The decode figures compared with llama.cpp (its llama-batched-bench: 32-token prompts, 128
 * generated tokens) correspond to --context 32 --steps 128.
 */
#include "kernels/cpu/blas_core.h"
#include "kernels/engine.h"
#include "kernels/logits.h"
#include "perf/bench_util.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* --clock cpu measures process CPU time instead of wall time: on a shared machine it shows
 * what the work costs when the cores are busy with others (with one thread it is the
 * wall time a dedicated core would see; with more, spinning workers count too). */
static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Resident set size (mmap()ed weights count once touched). */
static double bench_rss_mib(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

/* ---- what a decode row reads ----------------------------------------------------------- */

/* Bytes of weight matrices one decode row reads: every projection and the classifier whole,
 * one row of the token embedding, and of a mixture of experts the router and the
 * n_expert_used experts it picks (each expert's gate, up and down matrices), not the others;
 * norms and biases left out. Batch-1 decode at memory speed runs at the read bandwidth over
 * this; for a dense model it is about the file's size. 0 when the model has no typed view. */
static double active_weight_bytes(const eng_model *m)
{
    const eng_model_tensors *t = eng_model_tensors_of(m);
    const eng_model_config *c = eng_model_cfg(m);
    const eng_model_hparams *hp = eng_model_hparams_of(m);
    if (!t || !t->layers) return 0;
    const int64_t d = c->dim, hd = eng_head_dim(c, hp), ff = c->hidden_dim;
    const int64_t qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    double bytes = (double)eng_wrow_bytes(t->token_embedding.type, d) +
                   (double)c->vocab_size * (double)eng_wrow_bytes(t->wcls.type, d);
    for (int l = 0; l < c->n_layers; l++) {
        const eng_layer_weights *lw = &t->layers[l];
        bytes += (double)qd * eng_wrow_bytes(lw->wq.type, d) +
                 (double)kvd * (eng_wrow_bytes(lw->wk.type, d) + eng_wrow_bytes(lw->wv.type, d)) +
                 (double)d * eng_wrow_bytes(lw->wo.type, qd);
        if (lw->router.data) {
            const int64_t ef = hp->expert_ff;
            bytes +=
                (double)hp->n_expert * eng_wrow_bytes(lw->router.type, d) +
                (double)hp->n_expert_used * ((double)ef * (eng_wrow_bytes(lw->gate_exps.type, d) +
                                                           eng_wrow_bytes(lw->up_exps.type, d)) +
                                             (double)d * eng_wrow_bytes(lw->down_exps.type, ef));
        } else {
            bytes +=
                (double)ff * (eng_wrow_bytes(lw->w1.type, d) + eng_wrow_bytes(lw->w3.type, d)) +
                (double)d * eng_wrow_bytes(lw->w2.type, ff);
        }
    }
    return bytes;
}

/* ---- the engine side ---------------------------------------------------------------- */

typedef struct bench {
    eng *e;
    const eng_model_config *cfg;
    int block_size, blocks_per_seq;
    int32_t *tokens, *positions, *query_start, *seq_len, *table, *logits_rows, *prompt_len;
    int64_t *slots;
    float *logits;
} bench;

/* One step: n_seqs sequences, each adding `rows` rows after `ctx` tokens of context, as the
 * daemon sends them: a prefill (ctx 0: the context, the prefill) is a prompt's rows, a decode
 * step's are generated rows (eng_batch.prompt_len); logits for each sequence's last row.
 * Sequence s owns blocks [s*bps, (s+1)*bps). */
static int step(bench *b, int n_seqs, int rows, int ctx, int want_logits)
{
    int T = 0;
    for (int s = 0; s < n_seqs; s++) {
        b->query_start[s] = T;
        b->seq_len[s] = ctx + rows;
        b->prompt_len[s] = ctx == 0 ? rows : 0;
        for (int i = 0; i < rows; i++, T++) {
            int pos = ctx + i;
            b->tokens[T] = (int32_t)((s * 7919 + pos * 104729) % b->cfg->vocab_size);
            b->positions[T] = pos;
            b->slots[T] =
                (int64_t)b->table[s * b->blocks_per_seq + pos / b->block_size] * b->block_size +
                pos % b->block_size;
        }
        b->logits_rows[s] = T - 1;
    }
    b->query_start[n_seqs] = T;
    eng_batch batch = {
        .n_tokens = T,
        .tokens = b->tokens,
        .positions = b->positions,
        .slot_mapping = b->slots,
        .n_seqs = n_seqs,
        .query_start = b->query_start,
        .seq_len = b->seq_len,
        .block_table = b->table,
        .block_table_stride = b->blocks_per_seq,
        .n_logits = want_logits ? n_seqs : 0,
        .logits_rows = b->logits_rows,
        .prompt_len = b->prompt_len,
    };
    int err = eng_execute(b->e, &batch, b->logits);
    if (err) fprintf(stderr, "engine_bench: execute: %s\n", eng_errmsg());
    return err;
}

/* One sampled decode step of n_seqs sequences after ctx tokens: each sequence's next token is
 * the one it sampled (out[s]), fed back to its processors when it has them. */
static int step_sample(bench *b, int n_seqs, int ctx, const eng_sampling *samp, uint64_t *rng,
                       int32_t *out)
{
    for (int s = 0; s < n_seqs; s++) {
        b->query_start[s] = s;
        b->seq_len[s] = ctx + 1;
        b->tokens[s] = out[s];
        b->positions[s] = ctx;
        b->slots[s] =
            (int64_t)b->table[s * b->blocks_per_seq + ctx / b->block_size] * b->block_size +
            ctx % b->block_size;
        b->logits_rows[s] = s;
    }
    b->query_start[n_seqs] = n_seqs;
    eng_batch batch = {.n_tokens = n_seqs,
                       .tokens = b->tokens,
                       .positions = b->positions,
                       .slot_mapping = b->slots,
                       .n_seqs = n_seqs,
                       .query_start = b->query_start,
                       .seq_len = b->seq_len,
                       .block_table = b->table,
                       .block_table_stride = b->blocks_per_seq,
                       .n_logits = n_seqs,
                       .logits_rows = b->logits_rows,
                       .prompt_len = b->prompt_len};
    int err = eng_execute_sample(b->e, &batch, samp, rng, out, NULL);
    if (err) fprintf(stderr, "engine_bench: execute_sample: %s\n", eng_errmsg());
    for (int s = 0; !err && s < n_seqs; s++) eng_lp_note_output(samp[s].proc, out[s]);
    return err;
}

/* decode_steps sampled steps of S sequences after ctx0 (procs: with processors); tok/s. */
static double run_sampled(bench *b, int S, int ctx0, int steps, bool procs, eng_sampling *samp,
                          eng_logits_proc **lp)
{
    uint64_t rng[1024];
    int32_t out[1024];
    for (int s = 0; s < S; s++) {
        samp[s] = (eng_sampling){.temperature = 0, .top_p = 1, .proc = procs ? lp[s] : NULL};
        rng[s] = eng_rng_init((uint64_t)s + 1);
        out[s] = (int32_t)((s * 7919 + ctx0 * 104729) % b->cfg->vocab_size);
    }
    double t0 = now_s();
    for (int k = 0; k < steps; k++)
        if (step_sample(b, S, ctx0 + k, samp, rng, out)) return 0;
    return (double)S * steps / (now_s() - t0);
}

static double min_of(const double *v, int n);
static double max_of(const double *v, int n);

/* --procs: sampled decode at S sequences, plain and with a logits pipeline on every sequence,
 * alternating (which goes first alternates too) so load hits both alike. */
static int run_procs(bench *b, int S, int ctx0, int steps, int repeats, int json)
{
    eng_logit_bias bias[16];
    for (int i = 0; i < 16; i++)
        bias[i] = (eng_logit_bias){(int32_t)((i * 997 + 13) % b->cfg->vocab_size),
                                   i % 2 ? -100.0f : 1.5f};
    const eng_logits_params p = {.bias = bias,
                                 .n_bias = 16,
                                 .repetition_penalty = 1.1f,
                                 .presence_penalty = 0.4f,
                                 .frequency_penalty = 0.3f};
    eng_logits_proc **lp = calloc((size_t)S, sizeof *lp);
    eng_sampling *samp = calloc((size_t)S, sizeof *samp);
    double *plain = calloc((size_t)repeats, sizeof(double));
    double *with = calloc((size_t)repeats, sizeof(double));
    int32_t ctx_tokens[4096];
    int n_ctx = ctx0 < 4096 ? ctx0 : 4096;
    if (!lp || !samp || !plain || !with) return 1;
    for (int s = 0; s < S; s++) {
        if (!(lp[s] = eng_lp_create(&p)) || eng_lp_reserve(lp[s], (uint32_t)(ctx0 + steps)) < 0)
            return 1;
        /* the context's tokens, as step() wrote them, are the "prompt" the penalty sees */
        for (int i = 0; i < n_ctx; i++)
            ctx_tokens[i] = (int32_t)((s * 7919 + i * 104729) % b->cfg->vocab_size);
        eng_lp_note_prompt(lp[s], ctx_tokens, (uint32_t)n_ctx);
    }
    for (int r = 0; r < repeats; r++) {
        for (int k = 0; k < 2; k++) {
            bool on = (k + r) % 2 == 1;
            double t = run_sampled(b, S, ctx0, steps, on, samp, lp);
            if (t <= 0) return 1;
            (on ? with : plain)[r] = t;
        }
    }
    double pm = bench_median(plain, repeats), wm = bench_median(with, repeats);
    if (json)
        printf("{\"procs\":{\"seqs\":%d,\"steps\":%d,\"plain_tok_s\":%.1f,\"procs_tok_s\":%.1f,"
               "\"ratio\":%.3f,\"distinct_tokens\":%u}}\n",
               S, steps, pm, wm, wm / pm, eng_lp_distinct(lp[0]));
    else
        printf("  sampled decode %d seqs: plain %.1f tok/s [%.1f, %.1f], with bias + penalties "
               "%.1f tok/s [%.1f, %.1f]: %.3fx (%u distinct tokens per sequence at the end)\n",
               S, pm, min_of(plain, repeats), max_of(plain, repeats), wm, min_of(with, repeats),
               max_of(with, repeats), wm / pm, eng_lp_distinct(lp[0]));
    for (int s = 0; s < S; s++) eng_lp_free(lp[s]);
    free(lp);
    free(samp);
    free(plain);
    free(with);
    return 0;
}

/* ---- the baseline: llama2.c run.c's forward, single row, single thread --------------- */

static void naive_matmul(float *xout, const float *x, const float *w, int n, int d)
{
    for (int i = 0; i < d; i++) {
        float val = 0.0f;
        for (int j = 0; j < n; j++) val += w[(size_t)i * n + j] * x[j];
        xout[i] = val;
    }
}

static void naive_rmsnorm(float *o, const float *x, const float *weight, int size)
{
    float ss = 0.0f;
    for (int j = 0; j < size; j++) ss += x[j] * x[j];
    ss = 1.0f / sqrtf(ss / size + 1e-5f);
    for (int j = 0; j < size; j++) o[j] = weight[j] * (ss * x[j]);
}

typedef struct naive {
    const eng_model_config *c;
    const eng_weights *w;
    float *x, *xb, *xb2, *hb, *hb2, *q, *att, *logits, *key_cache, *value_cache;
} naive;

static void naive_forward(naive *n, int token, int pos)
{
    const eng_model_config *p = n->c;
    const eng_weights *w = n->w;
    int dim = p->dim, kv_dim = dim * p->n_kv_heads / p->n_heads, hs = dim / p->n_heads;
    int kv_mul = p->n_heads / p->n_kv_heads, hidden = p->hidden_dim;
    memcpy(n->x, w->token_embedding + (size_t)token * dim, (size_t)dim * sizeof(float));
    for (int l = 0; l < p->n_layers; l++) {
        naive_rmsnorm(n->xb, n->x, w->rms_att + (size_t)l * dim, dim);
        size_t loff = (size_t)l * p->seq_len * kv_dim;
        float *k = n->key_cache + loff + (size_t)pos * kv_dim;
        float *v = n->value_cache + loff + (size_t)pos * kv_dim;
        naive_matmul(n->q, n->xb, w->wq + (size_t)l * dim * dim, dim, dim);
        naive_matmul(k, n->xb, w->wk + (size_t)l * dim * kv_dim, dim, kv_dim);
        naive_matmul(v, n->xb, w->wv + (size_t)l * dim * kv_dim, dim, kv_dim);
        for (int i = 0; i < dim; i += 2) {
            float freq = 1.0f / powf(10000.0f, (i % hs) / (float)hs), val = pos * freq;
            float fcr = cosf(val), fci = sinf(val);
            for (int r = 0; r < (i < kv_dim ? 2 : 1); r++) {
                float *vec = r == 0 ? n->q : k;
                float v0 = vec[i], v1 = vec[i + 1];
                vec[i] = v0 * fcr - v1 * fci;
                vec[i + 1] = v0 * fci + v1 * fcr;
            }
        }
        for (int h = 0; h < p->n_heads; h++) {
            float *q = n->q + h * hs, *att = n->att + (size_t)h * p->seq_len;
            float max = -INFINITY, sum = 0;
            for (int t = 0; t <= pos; t++) {
                const float *kt = n->key_cache + loff + (size_t)t * kv_dim + (h / kv_mul) * hs;
                float s = 0;
                for (int i = 0; i < hs; i++) s += q[i] * kt[i];
                att[t] = s / sqrtf((float)hs);
                max = att[t] > max ? att[t] : max;
            }
            for (int t = 0; t <= pos; t++) {
                att[t] = expf(att[t] - max);
                sum += att[t];
            }
            float *xb = n->xb + h * hs;
            memset(xb, 0, (size_t)hs * sizeof(float));
            for (int t = 0; t <= pos; t++) {
                const float *vt = n->value_cache + loff + (size_t)t * kv_dim + (h / kv_mul) * hs;
                for (int i = 0; i < hs; i++) xb[i] += att[t] / sum * vt[i];
            }
        }
        naive_matmul(n->xb2, n->xb, w->wo + (size_t)l * dim * dim, dim, dim);
        for (int i = 0; i < dim; i++) n->x[i] += n->xb2[i];
        naive_rmsnorm(n->xb, n->x, w->rms_ffn + (size_t)l * dim, dim);
        naive_matmul(n->hb, n->xb, w->w1 + (size_t)l * dim * hidden, dim, hidden);
        naive_matmul(n->hb2, n->xb, w->w3 + (size_t)l * dim * hidden, dim, hidden);
        for (int i = 0; i < hidden; i++) n->hb[i] = n->hb[i] / (1.0f + expf(-n->hb[i])) * n->hb2[i];
        naive_matmul(n->xb, n->hb, w->w2 + (size_t)l * dim * hidden, hidden, dim);
        for (int i = 0; i < dim; i++) n->x[i] += n->xb[i];
    }
    naive_rmsnorm(n->x, n->x, w->rms_final, dim);
    naive_matmul(n->logits, n->x, w->wcls, dim, p->vocab_size);
}

/* ---- main --------------------------------------------------------------------------- */

/* ---- main --------------------------------------------------------------------------- */

#define MAX_SIZES 16

static int parse_seqs(const char *arg, int *sizes)
{
    int n = 0;
    for (const char *p = arg; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1024 || n == MAX_SIZES || (*end && *end != ',')) return -1;
        sizes[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

static double min_of(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

static double max_of(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

int main(int argc, char **argv)
{
    blas_core_fix(argv); /* the kernels ringlmd runs (kernels/cpu/blas_core.h) */
    const char *spec = "synthetic:stories15M:1";
    int threads = 2, repeats = 5, json = 0, decode_steps = 16, ctx0 = 32, prefill_len = 256;
    int batch_sizes[MAX_SIZES] = {1, 4, 8, 16, 32, 64}, n_sizes = 6, naive_runs = 1;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"threads", required_argument, 0, 't'},
        {"repeats", required_argument, 0, 'r'}, {"json", no_argument, 0, 'j'},
        {"steps", required_argument, 0, 's'},   {"prefill", required_argument, 0, 'p'},
        {"clock", required_argument, 0, 'c'},   {"context", required_argument, 0, 'x'},
        {"seqs", required_argument, 0, 'n'},    {"no-naive", no_argument, 0, 'N'},
        {"procs", required_argument, 0, 'L'},   {0, 0, 0, 0}};
    int procs_seqs = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "m:t:r:js:p:c:x:n:N", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': spec = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        case 'j': json = 1; break;
        case 's': decode_steps = atoi(optarg); break;
        case 'p': prefill_len = atoi(optarg); break;
        case 'x': ctx0 = atoi(optarg); break;
        case 'N': naive_runs = 0; break;
        case 'L': procs_seqs = atoi(optarg); break;
        case 'n':
            if ((n_sizes = parse_seqs(optarg, batch_sizes)) < 0) {
                fprintf(stderr,
                        "engine_bench: --seqs: a comma-separated list of at most %d "
                        "counts in 1..1024\n",
                        MAX_SIZES);
                return 2;
            }
            break;
        case 'c':
            bench_clock = strcmp(optarg, "cpu") == 0 ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC;
            break;
        default:
            fprintf(stderr, "usage: engine_bench --model SPEC [--threads N] [--repeats R] "
                            "[--steps N] [--context N] [--seqs 1,4,8,...] [--prefill N] "
                            "[--clock wall|cpu] [--no-naive] [--json] [--procs S]\n");
            return 2;
        }
    }
    if (threads < 1 || repeats < 1 || decode_steps < 1 || prefill_len < 1 || ctx0 < 0) {
        fprintf(stderr, "engine_bench: --threads, --repeats, --steps, --prefill must be >= 1, "
                        "--context >= 0\n");
        return 2;
    }
    eng_model *m;
    double t_load = now_s();
    if (eng_model_load(spec, &m)) {
        fprintf(stderr, "engine_bench: %s\n", eng_errmsg());
        return 1;
    }
    t_load = now_s() - t_load;
    /* A GGUF model keeps its weights in the file's types: no float32 arrays for the naive
     * baseline, which is then skipped. */
    /* the naive baseline needs float32 host weights; --no-naive skips it */
    const bool have_naive = naive_runs && eng_model_weights(m)->wq != NULL;
    const eng_model_config *cfg = eng_model_cfg(m);
    if (prefill_len > cfg->seq_len) prefill_len = cfg->seq_len;
    if (decode_steps > cfg->seq_len) decode_steps = cfg->seq_len;
    if (ctx0 + decode_steps > cfg->seq_len) ctx0 = cfg->seq_len - decode_steps;
    if (procs_seqs < 0 || procs_seqs > 1024) {
        fprintf(stderr, "engine_bench: --procs: 1..1024 sequences\n");
        return 2;
    }
    int max_seqs = procs_seqs > 1 ? procs_seqs : 1;
    for (int bi = 0; bi < n_sizes; bi++)
        max_seqs = batch_sizes[bi] > max_seqs ? batch_sizes[bi] : max_seqs;
    const int block_size = 16;
    int per_seq = ctx0 + decode_steps > prefill_len ? ctx0 + decode_steps : prefill_len;
    bench b = {.cfg = cfg,
               .block_size = block_size,
               .blocks_per_seq = (per_seq + block_size - 1) / block_size};
    int max_rows = max_seqs * ctx0 > prefill_len ? max_seqs * ctx0 : prefill_len;
    eng_options opt = {.backend = "cpu",
                       .n_threads = threads,
                       .numa_node = -1,
                       .kv_blocks = max_seqs * b.blocks_per_seq,
                       .kv_block_size = block_size,
                       .max_batch_tokens = max_rows,
                       .max_seqs = max_seqs};
    if (eng_create(m, &opt, &b.e)) {
        fprintf(stderr, "engine_bench: %s\n", eng_errmsg());
        return 1;
    }
    b.tokens = malloc(sizeof(int32_t) * (size_t)max_rows);
    b.positions = malloc(sizeof(int32_t) * (size_t)max_rows);
    b.slots = malloc(sizeof(int64_t) * (size_t)max_rows);
    b.query_start = malloc(sizeof(int32_t) * (max_seqs + 1));
    b.seq_len = malloc(sizeof(int32_t) * max_seqs);
    b.prompt_len = calloc((size_t)max_seqs, sizeof(int32_t));
    b.logits_rows = malloc(sizeof(int32_t) * max_seqs);
    b.table = malloc(sizeof(int32_t) * (size_t)max_seqs * (size_t)b.blocks_per_seq);
    b.logits = malloc(sizeof(float) * (size_t)max_seqs * (size_t)cfg->vocab_size);
    for (int i = 0; i < max_seqs * b.blocks_per_seq; i++) b.table[i] = i;

    /* The baseline: naive single-row forward, same model, same number of decode steps. */
    naive n = {.c = cfg, .w = eng_model_weights(m)};
    int kv_dim = cfg->dim * cfg->n_kv_heads / cfg->n_heads;
    n.x = calloc((size_t)cfg->dim, 4);
    n.xb = calloc((size_t)cfg->dim, 4);
    n.xb2 = calloc((size_t)cfg->dim, 4);
    n.q = calloc((size_t)cfg->dim, 4);
    n.hb = calloc((size_t)cfg->hidden_dim, 4);
    n.hb2 = calloc((size_t)cfg->hidden_dim, 4);
    n.att = calloc((size_t)cfg->n_heads * cfg->seq_len, 4);
    n.logits = calloc((size_t)cfg->vocab_size, 4);
    size_t cache = (size_t)cfg->n_layers * cfg->seq_len * kv_dim;
    n.key_cache = calloc(cache, 4);
    n.value_cache = calloc(cache, 4);
    for (int pos = 0; pos < ctx0 && have_naive; pos++)
        naive_forward(&n, pos % cfg->vocab_size, pos);

    /* Warm-up, and every sequence's ctx0 tokens of context. */
    if (ctx0 > 0 && step(&b, max_seqs, ctx0, 0, 0)) return 1;
    for (int bi = 0; bi < n_sizes; bi++) step(&b, batch_sizes[bi], 1, ctx0, 1);
    step(&b, 1, prefill_len, 0, 1);

    /* Each repeat measures everything once, so load from other users of the machine hits
     * the engine and the baseline alike; medians over repeats. Decode re-runs decode_steps
     * steps after the same ctx0-token context; prefill is one sequence of prefill_len rows
     * in one batch with the last row's logits. The phase split is of the largest batch. */
    double *dec[MAX_SIZES], *pre = calloc((size_t)repeats, sizeof(double));
    double *base = calloc((size_t)repeats, sizeof(double));
    for (int bi = 0; bi < n_sizes; bi++) dec[bi] = calloc((size_t)repeats, sizeof(double));
    eng_phase_stats phd = {0}, php = {0}, tmp, pool[MAX_SIZES];
    memset(pool, 0, sizeof pool);
    for (int r = 0; r < repeats; r++) {
        for (int bi = 0; bi < n_sizes; bi++) {
            int S = batch_sizes[bi];
            eng_phase_stats_get(b.e, NULL, true);
            double t0 = now_s();
            for (int k = 0; k < decode_steps; k++)
                if (step(&b, S, 1, ctx0 + k, 1)) return 1;
            dec[bi][r] = (double)S * decode_steps / (now_s() - t0);
            eng_phase_stats_get(b.e, &tmp, true);
            pool[bi].steps += tmp.steps;
            pool[bi].regions += tmp.regions;
            pool[bi].wake_calls += tmp.wake_calls;
            pool[bi].helper_waits += tmp.helper_waits;
            pool[bi].helper_sleeps += tmp.helper_sleeps;
            if (S == max_seqs) {
                phd.steps += tmp.steps;
                phd.proj_ns += tmp.proj_ns;
                phd.attn_ns += tmp.attn_ns;
                phd.other_ns += tmp.other_ns;
                phd.experts_ns += tmp.experts_ns;
                phd.regions += tmp.regions;
                phd.region_ns += tmp.region_ns;
                phd.caller_task_ns += tmp.caller_task_ns;
                phd.helper_task_ns += tmp.helper_task_ns;
                phd.straggler_ns += tmp.straggler_ns;
            }
        }
        eng_phase_stats_get(b.e, NULL, true);
        double t0 = now_s();
        if (step(&b, 1, prefill_len, 0, 1)) return 1;
        pre[r] = prefill_len / (now_s() - t0);
        eng_phase_stats_get(b.e, &tmp, true);
        php.steps += tmp.steps;
        php.proj_ns += tmp.proj_ns;
        php.attn_ns += tmp.attn_ns;
        php.other_ns += tmp.other_ns;
        php.experts_ns += tmp.experts_ns;
        php.regions += tmp.regions;
        php.region_ns += tmp.region_ns;
        php.caller_task_ns += tmp.caller_task_ns;
        php.helper_task_ns += tmp.helper_task_ns;
        php.straggler_waits += tmp.straggler_waits;
        php.straggler_ns += tmp.straggler_ns;
        php.helper_waits += tmp.helper_waits;
        php.helper_sleeps += tmp.helper_sleeps;
        php.wake_calls += tmp.wake_calls;
        t0 = now_s();
        for (int k = 0; k < decode_steps && have_naive; k++)
            naive_forward(&n, (k * 31) % cfg->vocab_size, ctx0 + k);
        base[r] = have_naive ? decode_steps / (now_s() - t0) : 0;
    }
    double decode_tok_s[MAX_SIZES], lo[MAX_SIZES], hi[MAX_SIZES];
    for (int bi = 0; bi < n_sizes; bi++) {
        lo[bi] = min_of(dec[bi], repeats);
        hi[bi] = max_of(dec[bi], repeats);
        decode_tok_s[bi] = bench_median(dec[bi], repeats);
        free(dec[bi]);
    }
    double prefill_tok_s = bench_median(pre, repeats), naive_tok_s = bench_median(base, repeats);
    free(pre);
    free(base);

    double msd = phd.steps ? 1e-6 / (double)phd.steps : 0;
    double msp = php.steps ? 1e-6 / (double)php.steps : 0;
    /* shares of the step (wall clock inside the engine): comparable across --clock modes */
    double totd = (double)(phd.proj_ns + phd.attn_ns + phd.other_ns) + 1e-9;
    double totp = (double)(php.proj_ns + php.attn_ns + php.other_ns) + 1e-9;
    if (json) {
        printf(
            "{\"model\":\"%s\",\"clock\":\"%s\",\"threads\":%d,\"repeats\":%d,\"decode_steps\":%d,"
            "\"context\":%d,\"prefill_len\":%d,\"decode_tok_s\":{",
            spec, bench_clock == CLOCK_MONOTONIC ? "wall" : "cpu", threads, repeats, decode_steps,
            ctx0, prefill_len);
        for (int bi = 0; bi < n_sizes; bi++)
            printf("%s\"%d\":%.1f", bi ? "," : "", batch_sizes[bi], decode_tok_s[bi]);
        printf("},\"decode_tok_s_range\":{");
        for (int bi = 0; bi < n_sizes; bi++)
            printf("%s\"%d\":[%.1f,%.1f]", bi ? "," : "", batch_sizes[bi], lo[bi], hi[bi]);
        printf("},\"decode_vs_decode1\":{");
        for (int bi = 0; bi < n_sizes; bi++)
            printf("%s\"%d\":%.2f", bi ? "," : "", batch_sizes[bi],
                   decode_tok_s[bi] / decode_tok_s[0]);
        /* the worker pool: parallel regions and futex wake calls per step, the share of
         * helper waits that ended asleep; its spin budget and measured wake latency */
        printf("},\"pool\":{");
        for (int bi = 0; bi < n_sizes; bi++) {
            const eng_phase_stats *ps = &pool[bi];
            const double st = ps->steps ? (double)ps->steps : 1;
            printf("%s\"%d\":{\"regions_per_step\":%.1f,\"wake_calls_per_step\":%.2f,"
                   "\"helper_sleep_share\":%.3f}",
                   bi ? "," : "", batch_sizes[bi], ps->regions / st, ps->wake_calls / st,
                   ps->helper_waits ? (double)ps->helper_sleeps / ps->helper_waits : 0);
        }
        eng_phase_stats_get(b.e, &tmp, false);
        printf(",\"spin_budget_us\":%.1f,\"wake_latency_us\":%.1f", tmp.spin_budget_ns * 1e-3,
               tmp.wake_latency_ns * 1e-3);
        /* a prefill step on the pool (as the text's "prefill on the pool" line) */
        printf(",\"prefill\":{\"regions_per_step\":%.1f,\"alone_ms\":%.3f,\"region_ms\":%.3f,"
               "\"caller_task_ms\":%.3f,\"helper_task_ms\":%.3f,\"straggler_ms\":%.3f,"
               "\"helper_sleeps\":%.1f,\"wake_calls\":%.1f}",
               php.regions * msp * 1e6, (totp - (double)php.region_ns) * msp, php.region_ns * msp,
               php.caller_task_ns * msp, php.helper_task_ns * msp, php.straggler_ns * msp,
               php.helper_sleeps * msp * 1e6, php.wake_calls * msp * 1e6);
        printf("},\"prefill_tok_s\":%.1f,"
               "\"phase_ms_per_step\":{\"decode%d\":{\"projections\":%.3f,\"attention\":%.3f,"
               "\"other\":%.3f},\"prefill\":{\"projections\":%.3f,\"attention\":%.3f,"
               "\"other\":%.3f}},"
               "\"phase_share\":{\"decode%d\":{\"projections\":%.3f,\"attention\":%.3f,"
               "\"other\":%.3f},\"prefill\":{\"projections\":%.3f,\"attention\":%.3f,"
               "\"other\":%.3f}},"
               "\"baseline\":{\"name\":\"naive llama2.c-style forward, 1 row, 1 thread\","
               "\"decode_tok_s\":%.1f},"
               "\"ratios\":{\"decode1_vs_baseline\":%.2f,\"prefill_vs_baseline\":%.2f},"
               "\"load_ms\":%.1f,\"rss_mib\":%.1f,\"weights\":\"%s\","
               "\"active_weight_bytes\":%.0f,\"n_expert\":%d,\"n_expert_used\":%d,"
               "\"experts_ms_per_step\":{\"decode%d\":%.3f,\"prefill\":%.3f}}\n",
               prefill_tok_s, max_seqs, phd.proj_ns * msd, phd.attn_ns * msd, phd.other_ns * msd,
               php.proj_ns * msp, php.attn_ns * msp, php.other_ns * msp, max_seqs,
               phd.proj_ns / totd, phd.attn_ns / totd, phd.other_ns / totd, php.proj_ns / totp,
               php.attn_ns / totp, php.other_ns / totp, naive_tok_s,
               have_naive ? decode_tok_s[0] / naive_tok_s : 0,
               have_naive ? prefill_tok_s / naive_tok_s : 0, t_load * 1e3, bench_rss_mib(),
               eng_wtype_name(eng_model_hparams_of(m)->weight_type), active_weight_bytes(m),
               eng_model_hparams_of(m)->n_expert, eng_model_hparams_of(m)->n_expert_used, max_seqs,
               phd.experts_ns * msd, php.experts_ns * msp);
    } else {
        printf("engine_bench %s, %d threads, medians of %d repeats [lowest, highest] (%d decode "
               "steps after %d tokens of context)\n",
               spec, threads, repeats, decode_steps, ctx0);
        for (int bi = 0; bi < n_sizes; bi++) {
            const eng_phase_stats *ps = &pool[bi];
            const double st = ps->steps ? (double)ps->steps : 1;
            printf("  decode  %2d seqs: %9.1f tok/s [%.1f, %.1f]  (%.2fx batch-1)  pool: %.0f "
                   "regions, %.2f wake calls per step, %.1f%% of helper waits asleep\n",
                   batch_sizes[bi], decode_tok_s[bi], lo[bi], hi[bi],
                   decode_tok_s[bi] / decode_tok_s[0], ps->regions / st, ps->wake_calls / st,
                   ps->helper_waits ? 100.0 * ps->helper_sleeps / ps->helper_waits : 0);
        }
        eng_phase_stats_get(b.e, &tmp, false);
        printf("  pool spin budget %.1f us, measured wake latency %.1f us\n",
               tmp.spin_budget_ns * 1e-3, tmp.wake_latency_ns * 1e-3);
        printf("  prefill %d rows: %9.1f tok/s\n", prefill_len, prefill_tok_s);
        char paths[1024];
        eng_describe_paths(b.e, paths, sizeof paths);
        printf("  paths: %s\n", paths);
        printf("  step split decode-%d: projections %.2f ms, attention %.2f ms, other %.2f ms\n",
               max_seqs, phd.proj_ns * msd, phd.attn_ns * msd, phd.other_ns * msd);
        printf("  step split prefill:   projections %.2f ms, attention %.2f ms, other %.2f ms\n",
               php.proj_ns * msp, php.attn_ns * msp, php.other_ns * msp);
        if (eng_model_hparams_of(m)->n_expert)
            printf("  of the projections, the experts (router, choice, their products): "
                   "decode-%d %.3f ms, prefill %.3f ms\n",
                   max_seqs, phd.experts_ns * msd, php.experts_ns * msp);
        if (threads > 1)
            printf("  decode-%d on the pool: %.0f regions; caller alone %.3f ms, in regions %.3f "
                   "ms (its tasks %.3f ms, the helpers' %.3f ms, waiting for a helper's %.3f "
                   "ms)\n",
                   max_seqs, phd.regions * msd * 1e6, (totd - (double)phd.region_ns) * msd,
                   phd.region_ns * msd, phd.caller_task_ns * msd, phd.helper_task_ns * msd,
                   phd.straggler_ns * msd);
        if (threads > 1)
            printf("  prefill on the pool:  %.0f regions; caller alone %.2f ms, in regions %.2f "
                   "ms (its tasks %.2f ms, the helpers' %.2f ms, waiting for a helper's %.2f "
                   "ms); %.0f helper sleeps, %.0f wake calls\n",
                   php.regions * msp * 1e6, (totp - (double)php.region_ns) * msp,
                   php.region_ns * msp, php.caller_task_ns * msp, php.helper_task_ns * msp,
                   php.straggler_ns * msp, php.helper_sleeps * msp * 1e6,
                   php.wake_calls * msp * 1e6);
        if (have_naive)
            printf("  baseline (naive 1-row 1-thread forward): %.1f tok/s; engine batch-1 = "
                   "%.2fx\n",
                   naive_tok_s, decode_tok_s[0] / naive_tok_s);
        else if (!naive_runs)
            printf("  baseline: not run (--no-naive)\n");
        else
            printf("  baseline: none (a GGUF model's weights, %s, are per-layer file tensors)\n",
                   eng_wtype_name(eng_model_hparams_of(m)->weight_type));
        printf("  model load %.1f ms, resident %.1f MiB after the run (weights %s)\n", t_load * 1e3,
               bench_rss_mib(), eng_wtype_name(eng_model_hparams_of(m)->weight_type));
        const eng_model_hparams *hp = eng_model_hparams_of(m);
        printf("  a decode row reads %.1f MB of weights", active_weight_bytes(m) * 1e-6);
        if (hp->n_expert) printf(" (%d of %d experts a row)", hp->n_expert_used, hp->n_expert);
        for (int bi = 0; bi < n_sizes; bi++)
            if (batch_sizes[bi] == 1)
                printf(": batch-1 decode reads them at %.2f GB/s",
                       active_weight_bytes(m) * decode_tok_s[bi] * 1e-9);
        printf("\n");
    }
    if (procs_seqs > 0 && run_procs(&b, procs_seqs, ctx0, decode_steps, repeats, json)) return 1;
    free(n.x);
    free(n.xb);
    free(n.xb2);
    free(n.q);
    free(n.hb);
    free(n.hb2);
    free(n.att);
    free(n.logits);
    free(n.key_cache);
    free(n.value_cache);
    free(b.tokens);
    free(b.positions);
    free(b.slots);
    free(b.query_start);
    free(b.seq_len);
    free(b.logits_rows);
    free(b.table);
    free(b.logits);
    eng_destroy(b.e);
    eng_model_free(m);
    return 0;
}
