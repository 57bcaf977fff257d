/* SPDX-License-Identifier: MIT */
/*
 * daemon/service.h — the runner: ringlmd's continuous-batching service (DESIGN.md §2).
 *
 * It plugs into the event loop (daemon/loop.h) as a dsvc_ops service. One iteration:
 *   drain completions (KV transfers arrive through on_cqe)
 *   requests arrive via on_request: validated (wire checks, token ids against the
 *     vocabulary, prompt vs context, parameters) → rejected at once with a reason, or
 *     submitted to the scheduler
 *   sched step → start the plan's transfers (kvtier) → one flattened eng_batch (decode
 *     tokens + prefill chunks; recompute re-prefills the kept prompt + generated ids)
 *   → eng_execute_sample → push token events (a full event ring defers the sequence with
 *     reason output_backpressure; its tokens wait in a bounded buffer; it is cancelled after
 *     backpressure_timeout_ms) → sched commit (finished sequences release their KV in the
 *     same iteration) → decision events to the decision log and metrics.
 * SIGTERM drains: no new requests (reject reason "draining"), in-flight work finishes or is
 * cancelled after drain_grace_ms, then the loop stops.
 *
 * Lifecycle: svc_config_init → svc_create (model, engine, policy, logs, metrics; no socket)
 * → svc_run (creates the loop on the socket and the KV tiers, runs until drained/stopped)
 * → svc_destroy. svc_create alone is enough for --check-config / --version.
 *
 * Threading: everything runs on the loop thread; the metrics HTTP server and the log
 * writer have their own threads behind their modules.
 * Errors: 0 or -errno; svc_errmsg() has the detail.
 */
#ifndef RINGLM_DAEMON_SERVICE_H
#define RINGLM_DAEMON_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/loop.h"
#include "sched/sched.h"

typedef struct svc_config {
    const char *model;        /* path or synthetic:PRESET:SEED (required) */
    const char *tokenizer;    /* optional: the vocabulary constraints are enforced over (a GGUF
                                 model's own when NULL; none: constraints are refused) */
    const char *policy_path;  /* NULL: the built-in policy */
    const char *backend;      /* "cpu" (default) or "cuda" */
    int cuda_device;          /* --cuda-device (eng_options.cuda_device) */
    int cuda_dtype;           /* --cuda-dtype: eng_cuda_dtype (0: bf16) */
    bool cuda_no_graphs;      /* --no-cuda-graphs */
    bool prompt_exact;        /* --prompt-exact (eng_options.prompt_exact) */
    int packed_weights;       /* --packed-weights: eng_pack_mode (0: auto) */
    int threads;              /* engine worker threads (0: 1) */
    const char *numa;         /* --numa-node: "auto", "off" or N (NULL: auto) */
    int kv_blocks;            /* device pool blocks (0: default 1024) */
    int kv_block_size;        /* tokens per block (0: 16) */
    int kv_rings;             /* --kv-rings: window rings (0: sized by kv_blocks; < 0: off) */
    int64_t kv_snap_bytes;    /* --kv-ring-snapshot-bytes (0: the rings' bytes; < 0: none) */
    int host_kv_blocks;       /* host tier blocks (0: none; default 2 × kv_blocks) */
    const char *disk_kv_path; /* disk tier file (NULL: none) */
    int disk_kv_blocks;
    double disk_kv_bw;          /* disk tier bytes/s the cost model starts from (0: 1e9) */
    int max_batch_tokens;       /* engine batch limit (0: from the policy, else 512) */
    int max_seqs;               /* engine sequence limit (0: 256) */
    const char *decision_log;   /* NULL: none */
    const char *request_log;    /* NULL: none */
    const char *iteration_log;  /* one line per batch (sim/FORMATS.md); NULL: none */
    const char *metrics_listen; /* ADDR:PORT; NULL: no HTTP server */
    /* the metrics' model_name (NULL: the GGUF's general.name, else the model file's base
     * name, extension dropped) */
    const char *served_model_name;
    const char *kv_events;            /* ZMQ PUB endpoint of the KV-cache events (NULL: none) */
    const char *kv_events_replay;     /* ZMQ ROUTER endpoint of their replay (NULL: none) */
    uint32_t kv_events_queue;         /* events the loop may queue for the publisher (0: 65536) */
    bool kv_events_map;               /* events as maps (current vLLM), not arrays (kvevents.h) */
    const char *stats_file;           /* JSON snapshot of pools/queues, rewritten on change */
    uint64_t backpressure_timeout_ms; /* 0: 5000 */
    uint32_t backpressure_buffer_tokens;  /* per sequence (0: 4096) */
    uint32_t max_n;                       /* --max-n: samples one request may ask for (0: 16) */
    uint32_t max_records_per_tenant_iter; /* records taken from one tenant's sessions per
                                             iteration, so one tenant's flood cannot fill
                                             the loop's iteration (0: 16) */
    uint64_t drain_grace_ms;              /* 0: 10000 */
    bool quiet;                           /* fewer start-up lines on stderr */
    bool verify_swaps;     /* checksum blocks at swap-out, compare at swap-in (tests) */
    bool no_prefix_cache;  /* --no-prefix-cache: prompts' KV blocks are not kept for reuse */
    bool check_invariants; /* the stats file runs the scheduler's O(state) invariant
                                     check (tests); otherwise it says "unchecked" */
    bool identity_only;    /* --check-config/--version: policy + model only, no engine,
                                     pools, logs or metrics (svc_run is then refused); the
                                     model may be NULL then (--check-config of a policy) */
    /* Test knobs: set only by ringlmd-test (main_ringlmd.c built with RINGLM_TEST_KNOBS);
     * zero in ringlmd, which has no flag or variable that reaches them. */
    struct svc_test_knobs {
        bool constant_prefix_key; /* --prefix-key constant: every cached block one key
                                     (sched_testing.h) */
        unsigned fail_kv_reads;   /* --fail-kv-reads: 1 << sched_pool per tier whose reads
                                     fail (kvtier_config.fail_reads) */
        bool keep_window_blocks;  /* --keep-window-blocks: no sched_config.attention_window,
                                     so windowed sequences keep every block; no window
                                     rings (every layer in the blocks) */
    } test;
} svc_config;

typedef struct svc svc;

void svc_config_init(svc_config *c);

/* Loads the model, creates the engine and the scheduler from the policy, opens the logs,
 * starts metrics. Errors: -EINVAL (config/policy/model: the detail names the field),
 * -ENOENT, -ENOMEM, -ENODEV (backend). */
int svc_create(const svc_config *c, svc **out);
/* Canonical policy text, its hash (hex), the model hash (hex). Valid until svc_destroy. */
const char *svc_policy_text(const svc *s);
const char *svc_policy_hash_hex(const svc *s);
uint64_t svc_policy_hash(const svc *s);
const char *svc_model_hash(const svc *s); /* "none" without a model */
const sched_policy *svc_policy(const svc *s);
/* Runs the service on a loop configured by lc (socket path, limits). Returns when the loop
 * stopped (SIGTERM drain completed, SIGINT, or a fatal error): 0 or -errno. */
int svc_run(svc *s, const dloop_config *lc);
void svc_destroy(svc *s);
const char *svc_errmsg(void);

#endif
