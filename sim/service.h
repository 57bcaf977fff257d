/* ringlm — simulator service model: how long a step and a transfer take. SPDX-License-Identifier: MIT */
#ifndef RINGLM_SIM_SERVICE_H
#define RINGLM_SIM_SERVICE_H

#include "sched/sched.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A tier's link: KV bytes out of and back into device memory, plus a fixed cost per transfer. */
typedef struct sim_link {
    double out_bytes_per_s, in_bytes_per_s, latency_us;
    bool present;
} sim_link;

/* step_us = base_us + per_prefill_token_us * prefill_tokens + per_decode_seq_us * decode_seqs
 *         + per_context_token_us * (sum of context over the batch's sequences)      (FORMATS.md)
 *         + per_prefill_pair_us * (sum over prefill rows of their position)
 * The last term is prefill attention (each prompt row attends to every row before it); the
 * FORMATS.md linear model leaves it out (0), the simulator can refit it from the grid. */
enum sim_fit {
    SIM_FIT_AUTO = 0,  /* of the file's model and the two refits, the best on the grid */
    SIM_FIT_FILE,      /* the file's step_model as written (refit linear if absent) */
    SIM_FIT_LINEAR,    /* refit the four-term model from the grid */
    SIM_FIT_ATTENTION, /* refit with the prefill-attention term */
};

typedef struct sim_service {
    double base_us, per_prefill_token_us, per_decode_seq_us, per_context_token_us;
    double per_prefill_pair_us;
    /* fit quality over the calibration grid (NAN when there was no grid) */
    double r2, median_rel_err, max_rel_err;
    unsigned grid_points;
    bool refit;                 /* the model was fitted here from the grid */
    char fit[32];               /* "builtin", "file", "linear-refit", "attention-refit" */
    double file_median_rel_err; /* the file's own model on the grid (NAN if none) */
    bool builtin;               /* the documented built-in default, not a measurement */
    uint32_t kv_block_size;     /* tokens per KV block */
    uint32_t kv_blocks_device, kv_blocks_host;
    uint32_t kv_blocks_disk; /* disk KV tier blocks (0: none; the built-in has none) */
    uint32_t kv_bytes_per_token;
    uint32_t max_batch_tokens;
    /* every layer of the model attends to the last attention_window positions (0: none):
     * sequences hold only their window's blocks (sched_config.attention_window). Service
     * file key "attention_window" (optional), or --attention-window */
    uint32_t attention_window;
    /* The logits pipeline's cost per sampling row beyond a plain one (a request's
     * log-probabilities; its logit bias and penalties), charged per row of a request that
     * asked (sim_req.logprobs, processors): perf/logprobs_bench's difference to plain decode
     * (docs/results/2026-12-06-nseq.md). Service file keys "logprobs_row_us",
     * "processors_row_us"; defaults are those measurements. */
    double logprobs_row_us, processors_row_us;
    /* The serving loop's own cost per step, beyond the engine's (FORMATS.md "serving_loop"):
     * fitted from decode periods a real ringlmd recorded for requests running alone, as
     * loop_step_us + loop_context_us * (sum of the decode sequences' context). The engine
     * grid times eng_execute back to back; the daemon also plans, samples, pushes events,
     * wakes clients and polls its sessions every iteration, and its caches are colder. */
    double loop_step_us, loop_context_us;
    unsigned loop_points;              /* observations the loop terms were fitted from (0: none) */
    double loop_median_rel_err;        /* engine model + loop terms vs the observed periods */
    double loop_engine_median_rel_err; /* the engine model alone vs the same periods */
    /* The step model fitted from the iterations a real ringlmd ran (--iteration-log; fit
     * "iterations-fit", FORMATS.md "Iteration log"): it_points > 0 when it applies. r2,
     * median_rel_err and max_rel_err then describe the fit on the points it kept. */
    char it_source[256]; /* the log file(s), ", "-separated */
    unsigned it_files;
    size_t it_lines;     /* iteration lines read */
    size_t it_points;    /* lines the fit kept */
    size_t it_dropped;   /* left out by the robust pass (relative residual > 4× median) */
    size_t it_idle;      /* period_us null (the loop went idle, or the last line) */
    size_t it_transfers; /* transfers > 0 (a KV copy shared the iteration) */
    size_t it_torn;      /* torn lines skipped (the log's writer died mid-line) */
    unsigned it_terms;   /* terms fitted: bit 0 base, 1 prefill, 2 decode, 3 context, 4 pairs */
    double it_p90_rel_err;
    double
        it_prior_median_rel_err; /* the model it replaced (engine + loop terms) on the same points */
    /* Speed trace (ringlm-sim --speed-trace): set speed_window_us > 0 before
     * sim_service_fit_iterations and it measures, per window of the first log's timeline,
     * Σ observed periods / Σ periods the fitted model predicts; the simulator multiplies each
     * step by the factor of the window it starts in (1 where a window had fewer than
     * SIM_SPEED_MIN_POINTS iterations). It replays the machine's speed drift during the
     * recorded run; it is a diagnostic for fidelity, not a prediction. */
    int64_t speed_window_us;
    double *speed; /* malloc()ed, n_speed windows from t = 0 (sim_service_free) */
    size_t n_speed, speed_windows_measured;
    double speed_min, speed_max;
    /* The first log's iterations as (t_us, observed period, modelled period) triples, in log
     * order (sim_service_noise_floor; freed by sim_service_free). */
    double *it_obs;
    size_t n_it_obs;
    sim_link host, disk;
    char backend[32], model[128], source[256];
} sim_service;

/* The built-in default (documented in sim/FORMATS.md): a Llama-3-8B shape in bf16 on one
 * H200, derived from spec numbers (DESIGN.md §4 anchors), not measured. */
void sim_service_default(sim_service *s);
/* Read a calibration JSON file (FORMATS.md). When "step_model" is absent the model is refit
 * from "grid"; either way fit quality over the grid is computed here. Returns 0 or -errno
 * (-EINVAL with the field named in sim_err()). */
int sim_service_load(sim_service *s, const char *path, int fit);
int sim_service_parse(sim_service *s, const char *name, const char *json_text, int fit);

/* Fit the step model to the periods of a real ringlmd's iterations (`ringlmd --iteration-log`,
 * FORMATS.md "Iteration log"), pooling the points of all n files: weighted least squares
 * (1/period²) over the five terms, non-negative coefficients (a term that cannot be fitted —
 * no variance, too few points, or a negative slope — is left out, 0), then one robust pass
 * that drops points whose relative residual exceeds 4× the median and refits. Replaces the
 * step model of s and zeroes its serving-loop terms (real periods already include the loop);
 * KV and transfer figures stay as s has them. Returns 0 or -errno; a malformed line is
 * -EINVAL with "FILE:LINE: the field" in sim_err(). */
int sim_service_fit_iterations(sim_service *s, const char *const *paths, size_t n);
#define SIM_SPEED_MIN_POINTS 20
/* The speed factor at time t (1 without a speed trace). */
static inline double sim_service_speed_at(const sim_service *s, int64_t t_us)
{
    if (!s->speed || t_us < 0 || s->speed_window_us <= 0) return 1.0;
    size_t w = (size_t)(t_us / s->speed_window_us);
    return w < s->n_speed ? s->speed[w] : 1.0;
}
/* Frees what sim_service_fit_iterations allocated (the speed trace, the iterations). */
void sim_service_free(sim_service *s);
/* The noise floor of fidelity, when the first --iteration-log is the recorded run's own: each
 * request's real iterations (those that started between its arrival and its finish) summed
 * as observed and as the fitted model has them. Its relative error is what the model misses
 * with the real schedule given, i.e. the per-iteration noise the model cannot know (a
 * simulation's error per request is of that order, give or take what cancels). errs gets n values at most (sorted);
 * -ENOENT without iterations, -EINVAL when the log's t_us go backwards. */
struct sim_req;
int sim_service_noise_floor(const sim_service *s, const struct sim_req *reqs, size_t n,
                            double *errs, size_t *n_out);
/* Name of term i of the step model (bit i of it_terms): base, prefill_tokens, decode_seqs,
 * context_tokens, prefill_pairs. */
const char *sim_service_term_name(int i);

/* The step model of s as the scheduler's one definition (sched_step_model). */
static inline void sim_service_step_model(const sim_service *s, sched_step_model *m)
{
    *m = (sched_step_model){.base_us = s->base_us,
                            .prefill_token_us = s->per_prefill_token_us,
                            .decode_seq_us = s->per_decode_seq_us,
                            .context_token_us = s->per_context_token_us,
                            .prefill_pair_us = s->per_prefill_pair_us};
}

/* Step time in µs for one batch: sched_step_model_us of the model. */
static inline double sim_service_step_us(const sim_service *s, uint64_t prefill_tokens,
                                         uint64_t decode_seqs, uint64_t context_tokens,
                                         double prefill_pairs)
{
    sched_step_model m;
    sim_service_step_model(s, &m);
    sched_plan_work w = {.prefill_tokens = prefill_tokens,
                         .decode_seqs = (uint32_t)decode_seqs,
                         .context_tokens = context_tokens,
                         .prefill_pairs = prefill_pairs};
    return sched_step_model_us(&m, &w);
}

/* The link to a tier (SCHED_POOL_HOST or SCHED_POOL_DISK); an absent disk link falls back to
 * the host's. */
const sim_link *sim_service_link(const sim_service *s, sched_pool tier);
/* Transfer time in µs for `tokens` of KV to a tier (SCHED_POOL_HOST or _DISK), direction out/in. */
double sim_service_transfer_us(const sim_service *s, sched_pool tier, bool out, uint64_t tokens);

/* The tier what-ifs (ringlmd's --host-kv-blocks, --disk-kv-blocks, --host-kv-bw, --disk-kv-bw):
 * a block count < 0 or a bandwidth <= 0 keeps the model's.  A host tier of > 0 blocks, or a
 * host bandwidth, makes the host link present; a disk of > 0 blocks without a link of its own
 * gets a copy of the host's (then the given disk bandwidth). */
void sim_service_set_tiers(sim_service *s, long long host_blocks, long long disk_blocks,
                           double host_bw, double disk_bw);

/* Rough capacity for requests of mean prompt P and output O at a decode batch of `batch`
 * sequences: requests per second. Used to size scenario workloads relative to the machine. */
double sim_service_capacity_rps(const sim_service *s, double prompt, double output, double batch);

#endif
