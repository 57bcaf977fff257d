/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_internal.h — ringlm-gateway's state and the seams between its files. Private to
 * the gateway (gw_*.c below); main_ringlm-gateway.c sees gw_server.h.
 *
 *   gw_server.c     life (start, drain, stop), HTTP plumbing: routing, methods, API keys,
 *                   body limits, answers, the request callbacks of libmicrohttpd
 *   gw_endpoints.c  each endpoint: an OpenAI request → one ringlm request (generation);
 *                   /v1/models, /health, /tokenize, /detokenize, the gateway's /metrics
 *   gw_stream.c     tokens → text → the answer: UTF-8 boundaries, stop strings, SSE chunks,
 *                   the whole (non-stream) answer, daemon failures → OpenAI errors
 *   gw_session.c    the shared-memory sessions with ringlmd: request registry, submit,
 *                   cancel, the retry queue, the events threads; the watch thread (hang-ups)
 *   gw_relay.c      --daemon-metrics: the daemons' vllm:* families on /metrics (gw_agg.c
 *                   sums several daemons' as one server's)
 *   gw_prep.c       the preparation threads: parse, chat template, tokenize, submit — never
 *                   on the HTTP thread; a bounded queue in front of them
 *   gw_guard.c      bounds on connections: per address, head and body deadlines, eviction
 *                   of slow heads at the connection limit (slowloris)
 *
 * A generation request's life (all fields under s->mu):
 *
 *   BODY     the http thread collects the body (over max_body_bytes: 413, nothing kept)
 *   PREP     queued for (or taken by) a preparation thread, the connection suspended; an
 *            answer it leaves (an error, /tokenize's result) makes it READY, and the HTTP
 *            thread queues that answer when the connection is resumed
 *   WAIT     parsed, tokenized, submitted (or queued when the submit ring was full: the
 *            events thread retries); the connection is suspended until the first event.
 *            Its first token (stream) or its FINISH decides the answer: a stream that has
 *            started is a 200 SSE response whatever follows; a request that failed before
 *            any token gets the HTTP status of its failure (429, 400, 503, 504).
 *   STREAM   SSE: the events thread appends chunks to r->out and resumes the connection;
 *            the content reader hands them to libmicrohttpd and suspends when out is empty.
 *   ANSWERED a whole response was queued.
 *
 * The request object is freed when both ends are done: the HTTP side (the completed
 * callback) and the daemon side (its FINISH, or the session's end). A client that goes
 * away before the daemon is done cancels the request (ringlm_cancel); the watch thread sees
 * that even while the connection is suspended.
 */
#ifndef RINGLM_TOOLS_GW_INTERNAL_H
#define RINGLM_TOOLS_GW_INTERNAL_H

#include "gateway/gw_reason.h"
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "ringlm.h"
#include "gateway/gw_params.h"
#include "gateway/gw_route.h"
#include "gateway/gw_server.h"
#include "gateway/gw_text.h"
#include "gateway/gw_tools.h"

#define GW_HBUCKETS 4096

/* ---- endpoints and their counters ------------------------------------------------------ */
enum ep {
    EP_COMPLETIONS,
    EP_CHAT,
    EP_RESPONSES,
    EP_MODELS,
    EP_HEALTH,
    EP_TOKENIZE,
    EP_DETOKENIZE,
    EP_METRICS,
    EP_OTHER,
    EP_N
};
/* HTTP statuses counted by /metrics; the last slot (0) counts every other one. */
#define GW_NSTAT 11
extern const int gw_stat_codes[GW_NSTAT];
extern const char *const gw_ep_name[EP_N];
int gw_stat_slot(int status);

enum rq_state { RQ_BODY, RQ_PREP, RQ_READY, RQ_WAIT, RQ_STREAM, RQ_ANSWERED };

/* log-probabilities kept for an answer (gw_logprobs.c) */
typedef struct gw_lp {
    int32_t prev; /* the token before it: its text depends on it */
    bool has;     /* false: the prompt's first token, which nothing predicts */
    ringlm_logprobs lp;
} gw_lp;
typedef struct gw_lps {
    gw_lp *v;
    size_t n, cap;
} gw_lps;
/* Appends token (after prev) with lp (NULL: none). 0 or -ENOMEM. */
int gw_lps_add(gw_lps *l, int32_t prev, int32_t token, const ringlm_logprobs *lp);
void gw_lps_free(gw_lps *l);
/* Chat's choices[].logprobs ({"content": [...], "refusal": null}) of v[0..n). */
json_t *gw_lp_chat(const ringlm_tokenizer *tok, const gw_lp *v, size_t n);
/* Completions' choices[].logprobs of v[0..n); *offset is the text_offset of v[0] and
 * comes back past the last. */
json_t *gw_lp_completion(const ringlm_tokenizer *tok, const gw_lp *v, size_t n, size_t *offset);
/* vLLM's prompt_logprobs of v[0..n). */
json_t *gw_lp_prompt_vllm(const ringlm_tokenizer *tok, const gw_lp *v, size_t n);

/* A Responses answer being built (gw_responses.c): the response object, its output items. */
typedef struct gw_resp_state {
    json_t *base;   /* the response's fields that echo the request (id, model, tools, ...) */
    json_t *output; /* the items done */
    int seq;        /* the next event's sequence_number */
    int open;       /* the item open: none, message, function_call, reasoning */
    int index;      /* its output_index */
    char item_id[64], call_id[64];
    char *name; /* an open function_call's name */
    gw_buf acc; /* its text or arguments so far */
} gw_resp_state;

typedef struct gw_req gw_req;
typedef struct gw_sess gw_sess;
typedef struct gw_conn gw_conn; /* gw_guard.c: one open HTTP connection */

/* What a connection is waiting for (gw_guard.c gives the first two a deadline). */
enum gw_conn_phase { GW_CONN_HEAD, GW_CONN_BODY, GW_CONN_SERVED };
struct gw_req {
    gw_server *s;
    gw_sess *sess; /* the session it was submitted (or queued) on */
    struct MHD_Connection *conn;
    uint64_t serial;
    enum ep ep;
    enum rq_state state;
    int status; /* HTTP status answered (metrics) */
    gw_buf body;
    bool too_big;
    bool close_after; /* the answer closes the connection (ambiguous framing) */
    bool body_done;   /* the HTTP thread has the whole body (its own flag) */

    /* preparation (gw_prep.c) */
    bool in_prep;                   /* queued or being prepared: a prep thread frees it */
    gw_req *prep_next;              /* the preparation queue */
    struct MHD_Response *prep_resp; /* the answer it left (the prep thread's alone) */
    int prep_status;
    struct MHD_Response *ready; /* READY: the answer to queue on resume */
    /* An answer made while mu is held (a resumed request) is queued after mu is released:
     * libmicrohttpd holds a response's own lock while it calls sse_read, which takes mu,
     * so queueing (which takes that lock) under mu would order the two locks both ways. */
    bool defer_queue;
    struct MHD_Response *q_resp;
    unsigned q_status;
    const gw_key *key;

    /* generation */
    gw_params p;
    int32_t *ids;
    uint32_t n_prompt;
    ringlm_request rq;
    ringlm_sampling smp; /* its sampling extensions (gw_params_sampling) */
    bool has_smp;
    uint64_t req_id;
    bool queued; /* in the retry queue: submit (or cancel) waits for ring space */
    bool need_cancel;
    bool submitted, daemon_done, http_done;
    bool suspended, gone, watched, started, out_done, failed;
    int sock_fd;
    uint32_t n_gen;
    uint32_t n_cached; /* prompt tokens ringlmd's prefix cache served (its FINISH) */
    int32_t prev;
    gw_buf raw;            /* decoded bytes not yet whole UTF-8 */
    gw_buf pend;           /* text held back: it may begin a stop string */
    gw_buf text;           /* non-stream: the completion so far */
    gw_reason_state think; /* stream, --reasoning-parser: reasoning or content so far */
    gw_tool_state tools;   /* stream, p.tool_parser: tool calls out of the content */
    int n_calls;           /* stream: tool calls started (their deltas sent) */
    gw_resp_state rs;      /* /v1/responses: the response being built */
    gw_buf out;            /* stream: SSE bytes not yet handed to libmicrohttpd */
    gw_buf head;           /* "data: {...,\"choices\":[" of this stream's chunks */
    const char *finish;    /* "stop" / "length" once decided */
    /* log-probabilities, for a request that asked (p.logprobs, p.echo, p.prompt_logprobs) */
    gw_lps lps;         /* generated tokens, in order */
    gw_lps plps;        /* prompt tokens, from the first (which has none) */
    size_t lps_sent;    /* stream: entries already written in a chunk */
    size_t text_offset; /* completions: text bytes before the next entry */
    bool echo_sent;     /* stream: the echoed prompt's chunk is out */
    /* n choices (n or best_of > 1: one ringlm request with ringlm_sampling.n): this request
     * is choice 0 and answers for all; choices 1.. are objects of their own (owner = this
     * request, the daemon's ids req_id + i) with their own text, stop scan,
     * log-probabilities and finish; their chunks go into the owner's out */
    gw_req *owner;      /* a further choice: the request it belongs to; NULL otherwise */
    gw_req **choices;   /* the owner's: [n_choices], choices[0] is itself (NULL: one) */
    uint32_t n_choices; /* the owner's: samples asked of ringlmd (n, or best_of) */
    uint32_t choice;    /* its index among them */
    bool role_sent;     /* stream: its first chunk (chat's role) is out */
    bool end_sent;      /* stream: its last chunk (finish_reason) is out */
    double cum_lp;      /* the sum of its tokens' log-probabilities (best_of ranks by it) */
    gw_err err;
    char id[48];
    long long created;
    uint64_t t_body_us;
    gw_req *id_next, *serial_next, *q_next;
};

/* One shared-memory session with ringlmd and its events thread. A request lives on the
 * session it was submitted on (request ids are the session's); a new request goes to the
 * connected session with the fewest requests in flight, so N sessions carry N times the
 * daemon's per-session limit (1,024 requests in flight). */
struct gw_sess {
    gw_server *s;
    int idx;
    int daemon;              /* which of the daemons (cfg.sockets; 0 with one) */
    const char *socket_path; /* its socket */
    ringlm_client *client;   /* NULL while (re)connecting */
    char conn_err[768];      /* why the last connect failed / the session ended */
    pthread_t thread;
    bool started;
    gw_req *by_id[GW_HBUCKETS];
    gw_req *q_head, *q_tail; /* waiting for ring space: submits and cancels */
    bool waits_for_ever;     /* the events thread sleeps for events alone (queue empty) */
    size_t n_inflight;       /* submitted, no FINISH yet */
    size_t n_queued;
    uint64_t connects, losses;
};

struct gw_server {
    gw_cfg cfg;
    struct MHD_Daemon *mhd;
    uint16_t port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    gw_sess *sess;
    int n_sess;
    int n_daemons;   /* sessions [d * sessions, (d + 1) * sessions) are daemon d's */
    gw_route *route; /* NULL with one daemon */
    uint64_t daemon_picks[GW_MAX_DAEMONS], affinity_picks;
    bool stopping, draining;
    pthread_t watch_thread, relay_thread;
    bool watch_started, relay_started;
    struct addrinfo *relay_ai[GW_MAX_DAEMONS]; /* --daemon-metrics, each */
    int n_relay;
    char *relay_text;              /* their vllm:* lines as one server's (gw_agg.h) */
    int relay_up;                  /* daemons whose last scrape answered */
    bool relay_ok[GW_MAX_DAEMONS]; /* which */
    int epfd, stop_efd;
    gw_req *by_serial[GW_HBUCKETS];
    uint64_t next_serial, rng;
    size_t n_gen_live; /* generation requests not yet freed */
    size_t n_inflight; /* submitted, no FINISH yet (all sessions) */
    size_t n_streams;  /* SSE responses open */
    char id_prefix[12];
    char *model_json;    /* the served model name as a JSON string literal (mu) */
    const char *model;   /* gw_model: atomic; set at start, or once when learned */
    char *model_learned; /* the name the daemons said (the first one to say it; mu) */
    bool model_warned;   /* the daemons' name differs from --served-model-name: said once */
    /* the token that opens the model's tool calls when it is a control token, which
     * decodes to no text ([TOOL_CALLS], <|python_tag|>): its text is put back (-1: none) */
    int32_t tool_marker;
    /* preparation (gw_prep.c; under mu) */
    pthread_cond_t prep_cv;
    gw_req *prep_head, *prep_tail;
    unsigned n_prep_queued, n_prep_running;
    pthread_t *prep_threads;
    unsigned n_prep_threads;
    uint64_t prep_dropped, prep_refused;
    /* connections (gw_guard.c; under conn_mu, never taken with mu held) */
    pthread_mutex_t conn_mu;
    pthread_cond_t guard_cv;
    gw_conn *conns;
    unsigned n_conns, n_conns_cut; /* open; of them cut and not yet closed */
    uint64_t conns_timed_out[2];   /* by phase: head, body */
    uint64_t conns_evicted, conns_refused;
    pthread_t guard_thread;
    bool guard_started, guard_stop;
    uint64_t guard_until_ms; /* when the guard thread wakes next (UINT64_MAX: when told) */
    /* metrics */
    uint64_t req_count[EP_N][GW_NSTAT];
    uint64_t admit_us_sum, admit_n;
    uint64_t dispatch_ns_sum, dispatch_n;
    uint64_t tokens_out;
};

static inline uint64_t gw_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static inline uint64_t gw_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t gw_xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A log line on stderr ("ringlm-gateway: ..."), unless --quiet. */
void gw_log(gw_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The request a choice belongs to (itself for a request of its own or choice 0). */
static inline gw_req *gw_top(gw_req *r)
{
    return r->owner ? r->owner : r;
}
/* Whether the daemon is done with every choice of the request o. */
static inline bool gw_all_done(const gw_req *o)
{
    if (!o->daemon_done) return false;
    for (uint32_t i = 1; o->choices && i < o->n_choices; i++)
        if (!o->choices[i]->daemon_done) return false;
    return true;
}

/* ---- gw_session.c (mu held unless said) ------------------------------------------------ */
/* A request object for a new HTTP request (takes mu). NULL when out of memory. */
gw_req *gw_req_new(gw_server *s, enum ep ep, struct MHD_Connection *c);
void gw_req_free(gw_server *s, gw_req *r);
/* Hand the connection back to libmicrohttpd when it waits for us / park it. */
void gw_wake(gw_req *r);
void gw_suspend(gw_req *r);
/* Watch r's socket for a hang-up while the request lives (the watch thread cancels it). */
void gw_watch(gw_server *s, gw_req *r);
void gw_unwatch(gw_server *s, gw_req *r);
/* Submits r on the connected session with the fewest requests: 0 submitted or queued for
 * ring space; -1 failed (r->err set, not answered). */
int gw_submit_locked(gw_server *s, gw_req *r);
/* Each daemon's load as the router weighs it (gw_route.h), and whether it has a session up. */
void gw_daemon_loads_locked(gw_server *s, gw_daemon_load *dl, bool *up);
/* The served model name: --served-model-name, else the one the daemons said, else "ringlm"
 * (any thread; fixed once learned). */
const char *gw_model(gw_server *s);
/* Cancels r in ringlmd, every choice of it (queued for ring space when the ring is full). */
void gw_cancel_locked(gw_server *s, gw_req *r);
/* The n - 1 further choices of r (r->p.n or best_of > 1), before it is submitted: 0 or
 * -ENOMEM. */
int gw_choices_new(gw_server *s, gw_req *r, uint32_t n);
/* Cancels every request submitted and not finished (drain after its grace). */
void gw_cancel_all_locked(gw_server *s);
/* Stop: every events thread asleep in ringlm_next_event returns (stopping set). */
void gw_sessions_wake_all_locked(gw_server *s);
/* The daemon side of r is over: ends its stream, wakes its connection, frees r when the
 * HTTP side is done too. */
void gw_daemon_end(gw_server *s, gw_req *r);
/* Frees every request left (stop, after the threads are gone). */
void gw_free_all_locked(gw_server *s);
void *gw_events_main(void *arg); /* arg: its gw_sess */
/* The daemon's handshake facts against cfg (API keys need tenant tags honoured and their
 * classes in the policy): 0, or -1 with why (what to change, for the operator). */
int gw_check_daemon(const gw_cfg *cfg, const ringlm_client *c, char *why, size_t n);
/* Sessions connected now; the first connect error when none is (msg may be NULL). */
int gw_sessions_up(gw_server *s, const char **why);
void *gw_watch_main(void *arg);

/* ---- gw_prep.c ----------------------------------------------------------------------------- */
/* The whole body is in: queue r for a preparation thread and park its connection (takes
 * mu), or 503 when the queue is full. */
enum MHD_Result gw_prep_queue(gw_server *s, gw_req *r, struct MHD_Connection *c);
/* mu held: r's connection was resumed while PREP or READY. */
enum MHD_Result gw_prep_resumed(gw_server *s, gw_req *r, struct MHD_Connection *c);
int gw_prep_start(gw_server *s);
/* Sets stopping and joins the threads; false when one was still tokenizing after a while:
 * the server must then be left as it is (the process is about to exit). */
bool gw_prep_stop(gw_server *s);

/* ---- gw_guard.c (takes conn_mu) ---------------------------------------------------------- */
/* libmicrohttpd's accept policy, connection notifications; the watchdog thread. */
enum MHD_Result gw_guard_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);
void gw_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode toe);
/* c's request moved on: its head arrived (BODY), its body arrived (SERVED), its answer
 * ended and a kept-alive connection waits for the next head (HEAD). */
void gw_guard_phase(gw_server *s, struct MHD_Connection *c, enum gw_conn_phase phase);
int gw_guard_start(gw_server *s);
void gw_guard_stop(gw_server *s);

/* ---- gw_relay.c -------------------------------------------------------------------------- */
/* "ADDR:PORT" or "PORT" (127.0.0.1) → an address (freeaddrinfo); -EINVAL when it is not. */
struct addrinfo;
int gw_relay_resolve(const char *spec, struct addrinfo **out);
void *gw_relay_main(void *arg);

/* ---- gw_stream.c (mu held) ------------------------------------------------------------- */
/* A FINISH that is not stop/length → the OpenAI error it answers. */
void gw_fail_from_finish(gw_err *e, int finish_reason, int cause);
void gw_start_stream(gw_req *r);
/* Stream with echo (completions): the prompt's chunk, with its log-probabilities, once. */
void gw_stream_echo(gw_req *r);
/* A choice's last chunk (its finish_reason), once. */
void gw_sse_choice_end(gw_req *c);
/* The last chunks of a stream (o: the request): each choice's finish reason not yet out, or
 * the error event; usage; [DONE]. */
void gw_sse_end(gw_req *o);
/* New decoded bytes are in r->raw: emits what is whole UTF-8 and no stop string can still
 * claim. Returns true when a stop string was hit. */
bool gw_emit_text(gw_req *r, bool final);
/* The parser state of r's answer (p.tool_parser, p.tool_name), fed nothing yet. */
void gw_stream_tools_init(const gw_req *r, gw_tool_state *st);
/* The first event of r arrived (or it failed): answer or start the stream. */
enum MHD_Result gw_resumed(gw_server *s, gw_req *r, struct MHD_Connection *c);

/* ---- gw_responses.c (mu held) ------------------------------------------------------------ */
/* A Responses answer: its start (stream: response.created, response.in_progress), its text
 * (reasoning: a reasoning item's), a tool call's start and arguments, its end (stream:
 * response.completed, or error and response.failed). */
void gw_resp_begin(gw_req *r);
int gw_resp_text(gw_req *r, bool reasoning, const char *t, size_t n);
int gw_resp_call(gw_req *r, int index, const char *name, size_t n);
int gw_resp_args(gw_req *r, int index, const char *t, size_t n);
void gw_resp_end(gw_req *r);
/* The whole response object once the text went through (a new reference). */
json_t *gw_resp_whole(gw_req *r);
void gw_resp_free(gw_resp_state *st);
/* A chat parameter's error under the Responses field's name (max_tokens: max_output_tokens). */
void gw_responses_err(gw_err *e);

/* ---- gw_server.c: answers (r may be NULL; body malloc'ed and taken) -------------------- */
/* c NULL (a preparation thread): the answer is left in r for the HTTP thread to queue. */
/* Queues resp (the caller's reference is taken) on c, or keeps it for the caller that set
 * r->defer_queue (gw_server.c queues it once mu is released). */
enum MHD_Result gw_queue(gw_req *r, struct MHD_Connection *c, unsigned status,
                         struct MHD_Response *resp);
enum MHD_Result gw_answer(gw_req *r, struct MHD_Connection *c, int status, const char *ctype,
                          char *body);
enum MHD_Result gw_answer_json(gw_req *r, struct MHD_Connection *c, int status, json_t *o);
enum MHD_Result gw_answer_err(gw_req *r, struct MHD_Connection *c, const gw_err *e);
enum MHD_Result gw_answer_errf(gw_req *r, struct MHD_Connection *c, int status, const char *code,
                               const char *msg);

/* ---- gw_endpoints.c (the whole body is in r->body) ------------------------------------- */
/* Generation, /tokenize and /detokenize run on a preparation thread: c is NULL there and
 * their answer is left in r (gw_answer with c NULL). */
enum MHD_Result gw_start_generation(gw_server *s, gw_req *r, struct MHD_Connection *c);
enum MHD_Result gw_ep_models(gw_server *s, gw_req *r, struct MHD_Connection *c);
enum MHD_Result gw_ep_health(gw_server *s, gw_req *r, struct MHD_Connection *c);
enum MHD_Result gw_ep_tokenize(gw_server *s, gw_req *r, struct MHD_Connection *c);
enum MHD_Result gw_ep_detokenize(gw_server *s, gw_req *r, struct MHD_Connection *c);
enum MHD_Result gw_ep_metrics(gw_server *s, gw_req *r, struct MHD_Connection *c);

#endif
