/* SPDX-License-Identifier: MIT */
/*
 * daemon/metrics_internal.h — private to the metrics module, shared by its three files:
 *   metrics.c         the counters the loop thread updates (series, labels, gauges) and the
 *                     triple buffer that publishes them;
 *   metrics_render.c  a published snapshot → the Prometheus text exposition (any thread);
 *   metrics_http.c    the /metrics HTTP server (libmicrohttpd, its connection bounds and
 *                     their watchdog).
 * Who writes what: `live` and `back` belong to the loop thread; readers take `front` under
 * read_mu; `middle` is the one word both sides exchange (index | FRESH).
 */
#ifndef RINGLM_DAEMON_METRICS_INTERNAL_H
#define RINGLM_DAEMON_METRICS_INTERNAL_H

#include <sys/socket.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/errdetail.h"
#include "daemon/metrics.h"

struct MHD_Daemon;

/* The module's error detail (metrics_errmsg), set from all three files. */
extern _Thread_local errdetail metrics__err;
#define seterr(err, ...) errdetail_set(&metrics__err, (err), __VA_ARGS__)

/* ---- buckets ------------------------------------------------------------------------ */

/* Request latencies: 0.5 ms to 2 min. A tiny model's TPOT sits in the low buckets, an 8B
 * model's TTFT under load in the high ones; one set serves both. */
#define N_LAT 18
extern const uint64_t metrics__lat_bounds_us[N_LAT];
/* Loop iterations: 10 µs to 1 s. */
#define N_ITER 15
extern const uint64_t metrics__iter_bounds_us[N_ITER];

typedef struct hist_lat {
    uint64_t bucket[N_LAT + 1]; /* non-cumulative; the last is +Inf */
    uint64_t count, sum_us;
} hist_lat;
typedef struct hist_iter {
    uint64_t bucket[N_ITER + 1];
    uint64_t count, sum_us;
} hist_iter;

/* vLLM's histograms (metrics.c has their bounds, taken from vLLM 0.11's loggers.py; the
 * token-count ones are 1-2-5 up to the context length, as vLLM's build_1_2_5_buckets). Time
 * bounds and sums are µs, count bounds and sums are tokens. */
enum vllm_hist {
    VH_TTFT = 0,       /* vllm:time_to_first_token_seconds */
    VH_ITL,            /* vllm:inter_token_latency_seconds and time_per_output_token_seconds */
    VH_E2E,            /* vllm:e2e_request_latency_seconds */
    VH_QUEUE,          /* vllm:request_queue_time_seconds */
    VH_INFERENCE,      /* vllm:request_inference_time_seconds */
    VH_PREFILL,        /* vllm:request_prefill_time_seconds */
    VH_DECODE,         /* vllm:request_decode_time_seconds */
    VH_PROMPT_TOKENS,  /* vllm:request_prompt_tokens */
    VH_GEN_TOKENS,     /* vllm:request_generation_tokens */
    VH_MAX_GEN_TOKENS, /* vllm:request_max_num_generation_tokens */
    VH_PARAMS_N,       /* vllm:request_params_n */
    VH_PARAMS_MAX_TOK, /* vllm:request_params_max_tokens */
    VH_ITER_TOKENS,    /* vllm:iteration_tokens_total */
    VH__COUNT
};
#define VH_MAX_BOUNDS 40
typedef struct vllm_bounds {
    unsigned n;
    bool seconds; /* µs rendered as seconds; else a count */
    uint64_t v[VH_MAX_BOUNDS];
} vllm_bounds;
typedef struct hist_v {
    uint64_t bucket[VH_MAX_BOUNDS + 1]; /* non-cumulative; [n] is +Inf */
    uint64_t count, sum;
} hist_v;
/* vLLM's finished_reason values (FinishReason of vLLM 0.11: stop, length, abort). */
enum vllm_finish { VF_STOP = 0, VF_LENGTH, VF_ABORT, VF__COUNT };
typedef struct vllm_stats {
    hist_v h[VH__COUNT];
    uint64_t success[VF__COUNT];
    uint64_t prompt_tokens, generation_tokens, preemptions;
} vllm_stats;

/* ---- the counters (one copy live, three snapshots) ---------------------------------- */

#define MAX_SERIES (METRICS_MAX_TENANTS * METRICS_MAX_CLASSES)
/* Transfer directions: sched_xfer_dir indexes the per-direction arrays and dir_name. */
#define N_DIRS     2
_Static_assert(SCHED_XFER_OUT == 0 && SCHED_XFER_IN == N_DIRS - 1,
               "sched_xfer_dir indexes [N_DIRS]");

/* Counters by reason are indexed by the enum itself; the one slot past its last value
 * (N_x, "invalid" in the exposition) takes a value outside it, so no real reason is ever
 * charged for a caller's bug. Finish reasons are the end codes below the causes. */
#define N_FINISH (SCHED_END_ERROR + 1)
#define N_REJECT SCHED_REJECT__COUNT
#define N_DEFER  SCHED_DEFER__COUNT
static inline unsigned reason_slot(unsigned value, unsigned n)
{
    return value < n ? value : n;
}

typedef struct series_stats {
    uint16_t tenant, cls;
    hist_lat h[METRICS_N_HIST];
    uint64_t prompt_tokens, generated_tokens;
    uint64_t finish[N_FINISH + 1];
    uint64_t reject[N_REJECT + 1];
    uint64_t defer[N_DEFER + 1];
    uint64_t preempt[METRICS_N_MODES][N_DEFER + 1];
    uint64_t cancels, timeouts;
    uint32_t waiting, running;
} series_stats;

typedef struct info_labels {
    char version[METRICS_LABEL_MAX], policy_hash[80], policy_name[METRICS_LABEL_MAX];
    char model_hash[80], model_name[128], model_path[METRICS_LABEL_MAX], backend[16];
    uint32_t kv_block_size; /* vllm:cache_config_info */
    bool prefix_cache;
} info_labels;

/* Everything a scrape shows. The series array is last so that publishing copies only the
 * series in use (head + n_series entries). */
typedef struct snap {
    uint64_t generation;
    info_labels info;
    int n_tenants, n_classes, n_series;
    char tenants[METRICS_MAX_TENANTS][METRICS_LABEL_MAX];
    char classes[METRICS_MAX_CLASSES][METRICS_LABEL_MAX];
    uint32_t waiting, running;
    uint64_t kv_used[SCHED_POOL__COUNT], kv_total[SCHED_POOL__COUNT];
    metrics_prefix prefix;
    hist_iter iter;
    uint64_t iter_tokens;
    double bw_bytes_per_s[SCHED_POOL__COUNT][N_DIRS];
    uint64_t xfer_bytes[SCHED_POOL__COUNT][N_DIRS], xfers[SCHED_POOL__COUNT][N_DIRS];
    uint64_t tier_read_failures[SCHED_POOL__COUNT][KVTIER_READ__COUNT];
    uint64_t log_dropped[2];
    bool kv_events_on;
    uint64_t kv_events_dropped, kv_events_resyncs;
    vllm_stats vllm;
    double published_wall_s; /* wall clock of the publish: vllm:lora_requests_info's value */
    series_stats series[MAX_SERIES];
} snap;

#define SNAP_HEAD_BYTES offsetof(snap, series)
#define FRESH           4u

/* /metrics connections: at most this many at once, this many from one address, each idle at
 * most HTTP_IDLE_S and alive at most HTTP_LIFETIME_MS (a scrape takes milliseconds; a
 * client that trickles its headers a byte at a time is cut), and never with a body. A new
 * connection past a bound is not refused: the oldest connection of its address (or of all,
 * for the global bound) is cut for it. Refusing would let whoever reconnects fastest hold
 * the slots for good — on loopback every local user is one address, so a user could keep a
 * local scraper out for as long as it liked; cutting the oldest lets every newcomer in, and
 * to cut a scrape (milliseconds) an attacker must open a bound's worth of connections
 * during it. The table has room for the connections cut but not yet closed. */
#define HTTP_MAX_CONNS   64
#define HTTP_PER_ADDR    16
#define HTTP_IDLE_S      3
#define HTTP_LIFETIME_MS 3000
#define HTTP_TABLE       (2 * HTTP_MAX_CONNS)

struct metrics {
    snap live;                      /* loop thread only */
    vllm_bounds vbounds[VH__COUNT]; /* set at create, read-only after */
    int16_t series_of[METRICS_MAX_TENANTS][METRICS_MAX_CLASSES]; /* -1: none yet */
    uint64_t publish_interval_us, last_publish_us;
    bool published_once;

    snap *buf[3];            /* triple buffer */
    unsigned back;           /* loop thread's spare */
    _Atomic unsigned middle; /* index | FRESH when newer than front */
    unsigned front;          /* reader side, under read_mu */
    pthread_mutex_t read_mu; /* readers only: the loop never takes it */
    size_t render_cap;       /* exposition size to expect (under read_mu) */

    struct MHD_Daemon *httpd;
    int listen_fd, port;

    /* Bounds on /metrics connections (see http_notify): libmicrohttpd's timeout is an idle
     * timeout that every trickled byte resets, so each connection also has a lifetime, cut
     * by a watchdog thread. The table is written by the HTTP thread (connect, close) and
     * read by the watchdog, under guard_mu; a slot's fd is cleared at libmicrohttpd's
     * CLOSED notification, which comes before it closes the socket, so the watchdog never
     * shuts down a descriptor that was reused. */
    pthread_mutex_t guard_mu;
    pthread_cond_t guard_cv;
    pthread_t guard_thread;
    bool guard_started, guard_stop;
    struct http_conn {
        int fd;   /* -1: free */
        bool cut; /* shut down (lifetime, or made room): closing */
        uint64_t t0_ms;
        struct sockaddr_storage peer;
    } conns[HTTP_TABLE];
};

/* metrics_http.c: starts the server on spec ("ADDR:PORT", see metrics_config.listen) and
 * sets m->port; stops it (and its watchdog) in metrics__http_stop. 0 or -errno. */
int metrics__http_start(metrics *m, const char *spec);
void metrics__http_stop(metrics *m);

#endif
