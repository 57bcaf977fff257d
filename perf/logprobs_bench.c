/* SPDX-License-Identifier: MIT */
/*
 * perf/logprobs_bench.c — what log-probabilities cost a decode step: S sequences (default
 * 32) decode greedily after a context, sampled on the engine (eng_execute_sample_lp), once
 * plain (no row asks) and once with the top N log-probabilities (default 5) of every row,
 * the two alternating within each repeat (which goes first alternates too) so the load of a
 * shared machine hits both alike. Prints the median tok/s of each and their ratio.
 * --procs puts a logits pipeline on every sequence of the measured side too (16 logit-bias
 * entries, repetition 1.1, presence 0.4, frequency 0.3: the "bias + penalties +
 * top-5 log-probabilities on every request"), against the same plain decode.
 *
 *   logprobs_bench [--model SPEC] [--seqs S] [--top N] [--threads T] [--steps K]
 *                  [--context C] [--repeats R] [--processed] [--procs] [--clock wall|cpu]
 */
#include "kernels/engine.h"
#include "kernels/logits.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef struct run {
    eng *e;
    int S, bs, bps, V;
    int32_t *tokens, *positions, *qs, *len, *table, *lrows, *out;
    int64_t *slots;
    eng_sampling *samp;
    eng_sampling *samp_proc; /* --procs: the same with each sequence's pipeline */
    eng_logits_proc **lp_proc;
    uint64_t *rng;
    eng_logprob_want *want;
    eng_logprobs *lp;
} run;

/* One decode step at position pos of every sequence; want NULL: plain (no processors). */
static int step(run *r, int pos, const eng_logprob_want *want)
{
    const eng_sampling *samp = want && r->samp_proc ? r->samp_proc : r->samp;
    for (int s = 0; s < r->S; s++) {
        r->qs[s] = s;
        r->len[s] = pos + 1;
        r->tokens[s] = r->out[s];
        r->positions[s] = pos;
        r->slots[s] = (int64_t)r->table[s * r->bps + pos / r->bs] * r->bs + pos % r->bs;
        r->lrows[s] = s;
    }
    r->qs[r->S] = r->S;
    eng_batch b = {.n_tokens = r->S,
                   .tokens = r->tokens,
                   .positions = r->positions,
                   .slot_mapping = r->slots,
                   .n_seqs = r->S,
                   .query_start = r->qs,
                   .seq_len = r->len,
                   .block_table = r->table,
                   .block_table_stride = r->bps,
                   .n_logits = r->S,
                   .logits_rows = r->lrows};
    int err = eng_execute_sample_lp(r->e, &b, samp, r->rng, r->out, want, r->lp);
    if (err) fprintf(stderr, "logprobs_bench: %s\n", eng_errmsg());
    /* the penalties count what each sequence generated (the daemon does this per token) */
    for (int s = 0; !err && samp == r->samp_proc && s < r->S; s++)
        (void)eng_lp_note_output(r->lp_proc[s], r->out[s]);
    return err;
}

/* The context: one prefill row per position, all sequences at once (positions 0..ctx-1). */
static double decode(run *r, int ctx, int steps, const eng_logprob_want *want)
{
    for (int s = 0; s < r->S; s++) r->out[s] = (int32_t)((s * 7919 + 13) % r->V);
    double t0 = now_s();
    for (int k = 0; k < steps; k++)
        if (step(r, ctx + k, want)) return 0;
    return (double)r->S * steps / (now_s() - t0);
}

int main(int argc, char **argv)
{
    const char *spec = "synthetic:stories15M:1";
    int S = 32, top = 5, threads = 2, steps = 32, ctx = 32, repeats = 5;
    bool processed = false, procs = false;
    static const struct option opts[] = {{"procs", no_argument, 0, 'L'},
                                         {"model", required_argument, 0, 'm'},
                                         {"seqs", required_argument, 0, 's'},
                                         {"top", required_argument, 0, 'n'},
                                         {"threads", required_argument, 0, 't'},
                                         {"steps", required_argument, 0, 'k'},
                                         {"context", required_argument, 0, 'x'},
                                         {"repeats", required_argument, 0, 'r'},
                                         {"processed", no_argument, 0, 'p'},
                                         {"clock", required_argument, 0, 'c'},
                                         {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "m:s:n:t:k:x:r:pc:", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': spec = optarg; break;
        case 's': S = atoi(optarg); break;
        case 'n': top = atoi(optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'k': steps = atoi(optarg); break;
        case 'x': ctx = atoi(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        case 'p': processed = true; break;
        case 'L': procs = true; break;
        case 'c':
            bench_clock = strcmp(optarg, "cpu") == 0 ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC;
            break;
        default:
            fprintf(stderr, "usage: logprobs_bench [--model SPEC] [--seqs S] [--top N] "
                            "[--threads T] [--steps K] [--context C] [--repeats R] "
                            "[--processed] [--procs] [--clock wall|cpu]\n");
            return 2;
        }
    }
    if (S < 1 || S > 1024 || top < 0 || top > ENG_TOP_LOGPROBS_MAX || threads < 1 || steps < 1 ||
        ctx < 0 || repeats < 1) {
        fprintf(stderr, "logprobs_bench: --seqs 1..1024, --top 0..%d, the rest >= 1\n",
                ENG_TOP_LOGPROBS_MAX);
        return 2;
    }
    eng_model *m;
    if (eng_model_load(spec, &m)) {
        fprintf(stderr, "logprobs_bench: %s\n", eng_errmsg());
        return 1;
    }
    const eng_model_config *cfg = eng_model_cfg(m);
    if (ctx + steps > cfg->seq_len) ctx = cfg->seq_len - steps;
    run r = {.S = S, .bs = 16, .V = cfg->vocab_size};
    r.bps = (ctx + steps + r.bs - 1) / r.bs;
    eng_options opt = {.backend = "cpu",
                       .n_threads = threads,
                       .numa_node = -1,
                       .kv_blocks = S * r.bps,
                       .kv_block_size = r.bs,
                       .max_batch_tokens = S > ctx ? S : ctx,
                       .max_seqs = S};
    if (eng_create(m, &opt, &r.e)) {
        fprintf(stderr, "logprobs_bench: %s\n", eng_errmsg());
        return 1;
    }
    r.tokens = calloc((size_t)S, 4);
    r.positions = calloc((size_t)S, 4);
    r.qs = calloc((size_t)S + 1, 4);
    r.len = calloc((size_t)S, 4);
    r.lrows = calloc((size_t)S, 4);
    r.out = calloc((size_t)S, 4);
    r.slots = calloc((size_t)S, 8);
    r.table = calloc((size_t)S * (size_t)r.bps, 4);
    r.samp = calloc((size_t)S, sizeof *r.samp);
    r.rng = calloc((size_t)S, 8);
    r.want = calloc((size_t)S, sizeof *r.want);
    r.lp = calloc((size_t)S, sizeof *r.lp);
    for (int i = 0; i < S * r.bps; i++) r.table[i] = i;
    for (int s = 0; s < S; s++) {
        r.samp[s] = (eng_sampling){.temperature = 0, .top_p = 1};
        r.rng[s] = eng_rng_init((uint64_t)s + 1);
        r.want[s] = (eng_logprob_want){.top_n = (int8_t)top, .processed = processed, .target = -1};
    }
    if (procs) {
        eng_logit_bias bias[16];
        for (int i = 0; i < 16; i++)
            bias[i] = (eng_logit_bias){(int32_t)((i * 997 + 13) % r.V), i % 2 ? -100.0f : 1.5f};
        const eng_logits_params p = {.bias = bias,
                                     .n_bias = 16,
                                     .repetition_penalty = 1.1f,
                                     .presence_penalty = 0.4f,
                                     .frequency_penalty = 0.3f};
        r.samp_proc = calloc((size_t)S, sizeof *r.samp_proc);
        r.lp_proc = calloc((size_t)S, sizeof *r.lp_proc);
        if (!r.samp_proc || !r.lp_proc) return 1;
        for (int s = 0; s < S; s++) {
            r.lp_proc[s] = eng_lp_create(&p);
            /* every token a sequence sees, context and all repeats of the decode */
            if (!r.lp_proc[s] ||
                eng_lp_reserve(r.lp_proc[s], (uint32_t)(ctx + steps * (repeats + 1) + 1)) < 0)
                return 1;
            r.samp_proc[s] = r.samp[s];
            r.samp_proc[s].proc = r.lp_proc[s];
        }
    }
    /* the context, as decode steps (the KV is what matters, not how it got there) */
    for (int s = 0; s < S; s++) r.out[s] = (int32_t)((s * 7919 + 13) % r.V);
    for (int pos = 0; pos < ctx; pos++)
        if (step(&r, pos, NULL)) return 1;
    decode(&r, ctx, steps, NULL); /* warm-up */
    double *plain = calloc((size_t)repeats, sizeof(double)),
           *with = calloc((size_t)repeats, sizeof(double));
    for (int k = 0; k < repeats; k++)
        for (int j = 0; j < 2; j++) {
            bool on = (j + k) % 2 == 1;
            double t = decode(&r, ctx, steps, on ? r.want : NULL);
            if (t <= 0) return 1;
            (on ? with : plain)[k] = t;
        }
    double pm = median(plain, repeats), wm = median(with, repeats);
    printf("logprobs_bench %s, %d threads, %d sequences, %d decode steps after %d tokens, "
           "medians of %d (%s clock)\n",
           spec, threads, S, steps, ctx, repeats, bench_clock == CLOCK_MONOTONIC ? "wall" : "cpu");
    printf("  plain decode:               %9.1f tok/s\n", pm);
    printf("  %stop-%d %s log-probabilities: %9.1f tok/s  (%.3fx plain)\n",
           procs ? "bias + penalties + " : "", top, processed ? "processed" : "raw", wm, wm / pm);
    eng_destroy(r.e);
    eng_model_free(m);
    return 0;
}
