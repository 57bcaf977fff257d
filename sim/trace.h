/* ringlm — simulator request traces: readers and transformations. SPDX-License-Identifier: MIT */
#ifndef RINGLM_SIM_TRACE_H
#define RINGLM_SIM_TRACE_H

#include "sched/sched.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Up to this many distinct tenant and class names per trace. */
#define SIM_MAX_NAMES 64
/* "no such time" for optional times (deadline, cancel, recorded outcome). */
#define SIM_NO_TIME   (-1)

/* Recorded outcome of a request in a native (daemon) trace; used by fidelity mode.  The
 * finish reasons of the one vocabulary (sched_end_code), spelt by sched_end_name. */
enum sim_real_reason {
    SIM_REAL_NONE = SCHED_END_NONE,
    SIM_REAL_LENGTH = SCHED_END_LENGTH,
    SIM_REAL_STOP = SCHED_END_STOP,
    SIM_REAL_CANCELLED = SCHED_END_CANCELLED,
    SIM_REAL_TIMEOUT = SCHED_END_TIMEOUT,
    SIM_REAL_REJECTED = SCHED_END_REJECTED,
    SIM_REAL_ERROR = SCHED_END_ERROR,
};

/* One request as the simulator replays it. Times are µs since the start of the trace. */
typedef struct sim_req {
    int64_t arrival_us;
    int64_t deadline_us; /* absolute, SIM_NO_TIME when none */
    int64_t cancel_us;   /* absolute time the client cancels/dies, or SIM_NO_TIME */
    uint32_t prompt_tokens;
    uint32_t output_tokens; /* tokens the request generates before it stops */
    uint32_t max_tokens;    /* asked for; >= output_tokens */
    uint16_t tenant;        /* index into sim_trace.tenants */
    uint16_t klass;         /* index into sim_trace.classes */
    uint64_t src_id;        /* `req` of a native trace, else the data row number */
    uint32_t src_line;      /* line in the source file (0 for generated requests) */
    uint8_t real_reason;    /* enum sim_real_reason */
    /* A reject the daemon decided before its scheduler saw the request (bad_token,
     * bad_params, draining, internal: what a trace cannot show the simulator), recorded in
     * a native trace's reject_reason: the simulator replays it as that reject
     * (sched_note_reject). SCHED_REJECT_NONE: none. */
    uint8_t daemon_reject;       /* sched_reject_reason */
    int64_t real_first_token_us; /* recorded outcome, SIM_NO_TIME when absent */
    int64_t real_finish_us;
    /* the prompt's block hashes (prefix cache, DESIGN §10): sim_trace.hashes[hash_off ..
     * hash_off + n_hash), each covering hash_block_tokens prompt tokens; n_hash 0: none.
     * Then n_ahash hashes of the answer's full blocks (a native log's answer_hash_ids):
     * blocks n_hash.. of the sequence, prompt then generated tokens */
    uint32_t hash_off, n_hash, hash_block_tokens, n_ahash;
    int64_t real_cached_tokens; /* recorded: prompt tokens the run found cached, or -1 */
    /* recorded: the scheduler's cost model when the run first scheduled it (a native log's
     * sched_cost), sim_trace.costs[cost_idx - 1] from cost_at_us on; cost_idx 0: none */
    uint32_t cost_idx;
    int64_t cost_at_us;
    /* n > 1 samples of one prompt (a native trace's sample_of, or a generator's samples): 1 +
     * the src_id of the request's first sample, whose prompt it shares and whose first token
     * it waits for, as ringlmd runs them; 0: none */
    uint64_t sample_of;
    /* what its sampling rows cost beyond a plain one (a native trace's "logprobs" and
     * "processors"): sim_service.logprobs_row_us, processors_row_us per row */
    bool logprobs, processors;
} sim_req;

/* A line the reader refused, kept when the caller asked to skip bad lines. */
typedef struct sim_bad_line {
    uint32_t line;
    char reason[160];
} sim_bad_line;

enum sim_trace_format { SIM_FMT_AUTO = 0, SIM_FMT_AZURE, SIM_FMT_MOONCAKE, SIM_FMT_NATIVE };

typedef struct sim_trace {
    sim_req *reqs;
    size_t n, cap;
    char *tenants[SIM_MAX_NAMES];
    unsigned n_tenants;
    char *classes[SIM_MAX_NAMES];
    unsigned n_classes;
    bool labelled;     /* tenants/classes came from the file (native traces) */
    bool has_real;     /* recorded outcomes present (native traces) */
    int format;        /* enum sim_trace_format actually read */
    char source[256];  /* file name or workload description */
    sim_bad_line *bad; /* skipped lines (only with skip_bad) */
    size_t n_bad, cap_bad;
    size_t n_bad_total; /* bad lines seen, including those not listed */
    size_t n_torn;      /* torn lines skipped: a log whose writer died mid-line */
    uint64_t *hashes;   /* block hashes of every request (sim_req.hash_off) */
    size_t n_hashes, cap_hashes;
    sched_cost_state *costs; /* recorded cost models (sim_req.cost_idx) */
    size_t n_costs, cap_costs;
} sim_trace;

/* Initialise an empty trace (named source); free with sim_trace_free. */
void sim_trace_init(sim_trace *t, const char *source);
void sim_trace_free(sim_trace *t);
/* Append a request; returns 0 or -ENOMEM. */
int sim_trace_push(sim_trace *t, const sim_req *r);
/* Append a request with its prompt's block hashes (ids[0..n), each block_tokens tokens) and
 * the hashes of its answer's full blocks (answer[0..n_answer): blocks n.. of the sequence;
 * NULL, 0 when none). */
int sim_trace_push_hashed(sim_trace *t, const sim_req *r, const uint64_t *ids, uint32_t n,
                          const uint64_t *answer, uint32_t n_answer, uint32_t block_tokens);
/* Give the last request pushed the scheduler cost model the recorded run had at at_us (its
 * admission).  Returns 0 or -ENOMEM. */
int sim_trace_set_cost(sim_trace *t, const sched_cost_state *c, int64_t at_us);
/* Tokens standing for a request's recorded block hashes, for the prefix cache: the token at
 * position pos of the sequence (the prompt, then generated tokens) in hash block b (prompt
 * hashes, then answer hashes) is a function of (hash b, pos mod block tokens) alone, so
 * sequences whose hashes agree share exactly those tokens and the scheduler's chained keys
 * find the sharing the trace recorded — a next turn's prompt the last answer's blocks too;
 * tokens past the hashes are unique to `uniq` (the request). */
int32_t sim_req_token(const sim_trace *t, const sim_req *r, uint64_t uniq, uint32_t pos);
/* The prompt's tokens, sim_req_token for pos 0..prompt_tokens-1, into out. */
void sim_req_tokens(const sim_trace *t, const sim_req *r, uint64_t uniq, int32_t *out);
/* Index of a tenant / class name, added when new. Returns >= 0, or -E2BIG past SIM_MAX_NAMES. */
int sim_trace_tenant(sim_trace *t, const char *name);
int sim_trace_class(sim_trace *t, const char *name);
/* Stable sort by arrival time (ties keep file order). */
void sim_trace_sort(sim_trace *t);

/* Read a trace file. fmt SIM_FMT_AUTO guesses from the content: a CSV header
 * `TIMESTAMP,ContextTokens,GeneratedTokens` → Azure; JSON lines with `input_length` →
 * Mooncake; with `arrival_us` → native. Unlabelled traces get tenant "default" and class
 * "default" (change them with sim_trace_assign).
 * A malformed line is an error naming file:line and the reason (-EINVAL), unless skip_bad:
 * then it is counted in n_bad_total and listed in bad[] (the first 1000).
 * Returns 0, -errno for I/O errors (detail in sim_err()). */
int sim_trace_load(sim_trace *t, const char *path, int fmt, bool skip_bad);
/* Reads a whole file into a NUL-terminated buffer (*out, the caller frees it; *out_len
 * without the NUL when not NULL), at most max_bytes. The one reader behind the trace,
 * service and policy loaders. Returns 0 or -errno (-EFBIG over max_bytes) with sim_err(). */
int sim_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len);
/* The same from a memory buffer (name is used in messages). */
int sim_trace_parse(sim_trace *t, const char *name, const char *buf, size_t len, int fmt,
                    bool skip_bad);

/* Transformations, applied in this order by sim_trace_transform:
 *   window  — keep arrivals in [start_s, end_s) of the source time axis, rebased to 0;
 *   rate    — multiply the arrival rate: every time (arrival, cancel, deadline, recorded
 *             outcome) is divided by rate;
 *   lengths — prompt, output and max tokens multiplied by length_scale (rounded, at least 1);
 *   tenants / classes — assign names by a rule (see sim_trace_assign). */
typedef struct sim_transform {
    double window_start_s;   /* 0 */
    double window_end_s;     /* < 0: to the end */
    double rate;             /* 1 */
    double length_scale;     /* 1 */
    const char *tenant_rule; /* NULL: keep */
    const char *class_rule;  /* NULL: keep */
    uint64_t seed;
} sim_transform;

void sim_transform_defaults(sim_transform *x);
int sim_trace_transform(sim_trace *t, const sim_transform *x);

/* Assign tenants (which=0) or classes (which=1) by a rule:
 *   "a:3,b:1"          smooth weighted round robin: in every 4 requests, 3 go to a and 1 to b,
 *                      interleaved (a a b a ...), deterministic;
 *   "rr:a,b,c"         plain round robin;
 *   "random:a:3,b:1"   independent draws with those odds from the seeded generator;
 *   "prompt>N:x,y"     by prompt length: prompts longer than N tokens → x, others → y.
 * A bad rule is -EINVAL with the detail. */
int sim_trace_assign(sim_trace *t, int which, const char *rule, uint64_t seed);

/* Summary numbers used by reports and generators. */
typedef struct sim_trace_summary {
    size_t n;
    double span_s;
    double rate_per_s;
    double prompt_mean, output_mean;
    uint64_t prompt_total, output_total;
    uint32_t prompt_max, output_max;
} sim_trace_summary;
void sim_trace_summarise(const sim_trace *t, sim_trace_summary *s);

const char *sim_trace_format_name(int fmt);

#endif
