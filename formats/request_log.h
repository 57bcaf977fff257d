/* SPDX-License-Identifier: MIT */
/*
 * formats/request_log.h — the request log, also the simulator's native trace
 * (sim/FORMATS.md "Native request trace"): one JSON object per line, one line per request.
 *
 * Written by ringlmd (--request-log) and ringlm-sim (--request-log); read by ringlm-sim
 * (--trace), the ringlm CLI (replay), perf/calibrate (--daemon-log) and the tests. This is
 * the only writer and the only reader: what one writes the other reads back field for
 * field (tests/test_formats.c).
 *
 * The rules a line must keep (the reader enforces them; the writer is given what it is
 * given):
 *   req, arrival_us, prompt_tokens           required integers >= 0
 *   output_tokens, max_tokens                integers >= 0; at least one; a missing one is
 *                                            the other's value
 *   deadline_us, cancel_us, first_token_us,  integers >= 0 or null (missing = null)
 *   finish_us
 *   tenant, class                            strings (missing = ""), < FMT_NAME_MAX bytes
 *   finish_reason, reject_reason             names of the one reason vocabulary
 *                                            (sched_end_name; missing = NULL); the
 *                                            format keeps them as text, its users map them
 *   hash_ids, hash_block_tokens              optional: the prompt's block hashes (integers
 *                                            >= 0, at most FMT_HASH_IDS_MAX), block i
 *                                            covering prompt tokens [i×n, (i+1)×n) with n =
 *                                            hash_block_tokens (>= 1; required with
 *                                            hash_ids).  Equal hashes at the same position
 *                                            after equal hashes mean equal tokens: a replay
 *                                            shares prefixes as the recorded run did (the
 *                                            prefix cache's chained keys, DESIGN §10)
 *   answer_hash_ids                          optional: the keys of the full blocks the
 *                                            answer completed, continuing hash_ids' chain:
 *                                            entry i is block n_hash_ids + i of the sequence
 *                                            (prompt then output tokens), covering its
 *                                            tokens [(n_hash_ids+i)×n, (n_hash_ids+i+1)×n)
 *                                            — the first may hold the prompt's last tokens.
 *                                            Only blocks whose KV was computed (what a
 *                                            cache can keep): the last output token is
 *                                            fed back only when a stop token (sampled,
 *                                            not counted in output_tokens) followed it.
 *                                            Integers >= 0, at most FMT_HASH_IDS_MAX;
 *                                            hash_block_tokens is required with it.  A
 *                                            reader that ignores it replays the prompts alone
 *   cached_tokens                            optional: prompt tokens the request's first
 *                                            admission found in the prefix cache (0: none,
 *                                            or the cache off); integer >= 0 or null
 *                                            (missing = null: not recorded).  The writer
 *                                            leaves the key out for FMT_NULL
 *   sched_cost                               optional: the writer's scheduler cost model
 *                                            as it stood when the request was first
 *                                            scheduled (its admission: where its cached
 *                                            prefix was found and reloaded or recomputed,
 *                                            and blocks evicted for it demoted or
 *                                            dropped): {"at_us": integer >= 0 (the same
 *                                            clock as arrival_us), "correction": > 0,
 *                                            "step": {"base_us", "prefill_token_us" (> 0),
 *                                            "decode_seq_us", "context_token_us",
 *                                            "prefill_pair_us"}, "host" / "disk" (each
 *                                            optional: a tier the writer had):
 *                                            {"out_bytes_per_s", "in_bytes_per_s" (> 0),
 *                                            "latency_us", "out_measured" / "in_measured"
 *                                            (booleans, missing = false: that direction's
 *                                            bandwidth is measured from completed copies,
 *                                            not the configured guess)}}, numbers >= 0
 *                                            unless said.
 *                                            A replay sets it at that time, so it weighs
 *                                            costs as the recorded run did (its measured
 *                                            step-time correction and tier bandwidths,
 *                                            which no model of the machine predicts)
 *   sample_of                                optional: a further sample of a request of n
 *                                            samples (ringlm_sampling.n): the req of its
 *                                            first sample, which computed the prompt it
 *                                            shares (integer >= 1; missing: none). A replay
 *                                            holds it until that one's first token
 *   logprobs                                 optional: the top log-probabilities per
 *                                            generated token it asked for (integer in
 *                                            [0, 20]; missing: none) — what its sampling
 *                                            rows cost beyond a plain one
 *   processors                               optional: true when logit bias or penalties
 *                                            ran on its rows (missing: false)
 * Unknown keys are ignored. A real where an integer belongs is rounded to the nearest.
 */
#ifndef RINGLM_FORMATS_REQUEST_LOG_H
#define RINGLM_FORMATS_REQUEST_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "formats/json.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest tenant or class name a line may carry, plus the NUL. */
#define FMT_NAME_MAX     64
/* Longest finish / reject reason name, plus the NUL. */
#define FMT_REASON_MAX   32
/* Most block hashes a line may carry (Mooncake: 512-token blocks, so 1M tokens). */
#define FMT_HASH_IDS_MAX 2048

/* A scheduler's cost model at one moment (the "sched_cost" field): sched_cost_state's
 * numbers, the format keeping no dependency on sched/. */
typedef struct fmt_tier_cost {
    double out_bytes_per_s, in_bytes_per_s, latency_us; /* all 0: no such tier */
    bool out_measured, in_measured; /* measured from completed copies, not the guess */
} fmt_tier_cost;

typedef struct fmt_sched_cost {
    int64_t at_us;
    double correction;
    double base_us, prefill_token_us, decode_seq_us, context_token_us, prefill_pair_us;
    fmt_tier_cost host, disk;
} fmt_sched_cost;

typedef struct fmt_request {
    uint64_t req;
    int64_t arrival_us;
    const char *tenant;     /* NULL → "" */
    const char *class_name; /* NULL → "" */
    int64_t prompt_tokens;
    int64_t max_tokens;
    int64_t output_tokens;
    int64_t deadline_us;       /* or FMT_NULL */
    int64_t cancel_us;         /* or FMT_NULL */
    int64_t first_token_us;    /* or FMT_NULL */
    int64_t finish_us;         /* or FMT_NULL (a request the simulation never ended) */
    const char *finish_reason; /* "length", "stop", ... (sched_end_name); NULL → "error" */
    const char *reject_reason; /* NULL → null */
    const uint64_t *hash_ids;  /* n_hash_ids block hashes of the prompt, or NULL */
    uint32_t n_hash_ids;
    uint32_t hash_block_tokens;      /* tokens per hash (0 when none) */
    const uint64_t *answer_hash_ids; /* n_answer_hash_ids keys of the answer's full blocks
                                       * (blocks n_hash_ids.. of prompt + output), or NULL */
    uint32_t n_answer_hash_ids;
    int64_t cached_tokens;            /* prompt tokens found in the prefix cache, or FMT_NULL */
    const fmt_sched_cost *sched_cost; /* the cost model at its admission, or NULL */
    uint64_t sample_of;               /* the req of its first sample (n > 1), 0: none */
    bool logprobs;                    /* it asked for log-probabilities: top_logprobs of them */
    uint32_t top_logprobs;
    bool processors; /* logit bias or penalties ran on its rows */
} fmt_request;

/* Storage for the strings of a parsed line (fmt_request's pointers point into it). */
typedef struct fmt_request_text {
    char tenant[FMT_NAME_MAX];
    char class_name[FMT_NAME_MAX];
    char finish_reason[FMT_REASON_MAX];
    char reject_reason[FMT_REASON_MAX];
    uint64_t hash_ids[FMT_HASH_IDS_MAX];
    uint64_t answer_hash_ids[FMT_HASH_IDS_MAX];
    fmt_sched_cost sched_cost;
} fmt_request_text;

/* Formats r as one JSON object (no newline) into buf[cap]; returns the length, or -EMSGSIZE
 * when it does not fit. Strings are escaped (fmt_json). Pure; any thread. */
int fmt_request_format(const fmt_request *r, char *buf, size_t cap);

/* Parses one line (the inverse of fmt_request_format). The strings of *out point into
 * *text. Returns 0, or -EINVAL with why naming the field. */
int fmt_request_parse(const char *line, size_t len, fmt_request *out, fmt_request_text *text,
                      char *why, size_t whylen);

#ifdef __cplusplus
}
#endif
#endif
