/* SPDX-License-Identifier: MIT */
/*
 * tools/gw_server.c — ringlm-gateway: HTTP (libmicrohttpd) in front of one ringlm session.
 *
 * A generation request's life (all fields under s->mu):
 *
 *   BODY     the http thread collects the body (over max_body_bytes: 413, nothing kept)
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
#include "tools/gw_server.h"

#include <errno.h>
#include <jansson.h>
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "ringlm.h"
#include "tools/gw_params.h"
#include "tools/gw_text.h"

#define HBUCKETS       4096
#define EVENT_BATCH    256
#define EVENT_WAIT_MS  100
#define RECONNECT_MS   200
#define SSE_BLOCK      4096

/* ---- endpoints and their counters ------------------------------------------------------ */
enum ep { EP_COMPLETIONS, EP_CHAT, EP_MODELS, EP_HEALTH, EP_TOKENIZE, EP_DETOKENIZE, EP_METRICS,
	  EP_OTHER, EP_N };
static const char *const ep_name[EP_N] = {"completions", "chat_completions", "models", "health",
					  "tokenize", "detokenize", "metrics", "other"};
static const int stat_codes[] = {200, 400, 401, 404, 405, 413, 429, 500, 503, 504, 0};
#define NSTAT ((int)(sizeof stat_codes / sizeof *stat_codes))

static int stat_slot(int status)
{
	for (int i = 0; i < NSTAT - 1; i++)
		if (stat_codes[i] == status)
			return i;
	return NSTAT - 1;
}

enum rq_state { RQ_BODY, RQ_WAIT, RQ_STREAM, RQ_ANSWERED };

typedef struct gw_req gw_req;
struct gw_req {
	gw_server *s;
	struct MHD_Connection *conn;
	uint64_t serial;
	enum ep ep;
	enum rq_state state;
	int status;                 /* HTTP status answered (metrics) */
	gw_buf body;
	bool too_big;
	const gw_key *key;

	/* generation */
	gw_params p;
	int32_t *ids;
	uint32_t n_prompt;
	ringlm_request rq;
	uint64_t req_id;
	bool queued;                /* in the retry queue: submit (or cancel) waits for ring space */
	bool need_cancel;
	bool submitted, daemon_done, http_done;
	bool suspended, gone, watched, started, out_done, failed;
	int sock_fd;
	uint32_t n_gen;
	int32_t prev;
	gw_buf raw;                 /* decoded bytes not yet whole UTF-8 */
	gw_buf pend;                /* text held back: it may begin a stop string */
	gw_buf text;                /* non-stream: the completion so far */
	gw_buf out;                 /* stream: SSE bytes not yet handed to libmicrohttpd */
	gw_buf head;                /* "data: {...,\"choices\":[" of this stream's chunks */
	const char *finish;         /* "stop" / "length" once decided */
	gw_err err;
	char id[48];
	long long created;
	uint64_t t_body_us;
	gw_req *id_next, *serial_next, *q_next;
};

struct gw_server {
	gw_cfg cfg;
	struct MHD_Daemon *mhd;
	uint16_t port;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	ringlm_client *client;
	bool stopping, draining;
	char conn_err[256];
	pthread_t ev_thread, watch_thread;
	bool ev_started, watch_started;
	int epfd, stop_efd;
	gw_req *by_id[HBUCKETS], *by_serial[HBUCKETS];
	gw_req *q_head, *q_tail;
	uint64_t next_serial, rng;
	size_t n_gen_live;          /* generation requests not yet freed */
	size_t n_inflight;          /* submitted, no FINISH yet */
	size_t n_streams;           /* SSE responses open */
	char id_prefix[12];
	char *model_json;           /* the served model name as a JSON string literal */
	/* metrics */
	uint64_t req_count[EP_N][NSTAT];
	uint64_t admit_us_sum, admit_n;
	uint64_t dispatch_ns_sum, dispatch_n;
	uint64_t tokens_out, connects, session_losses;
};

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t xorshift(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void logm(gw_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logm(gw_server *s, const char *fmt, ...)
{
	if (s->cfg.quiet)
		return;
	va_list ap;
	va_start(ap, fmt);
	fputs("ringlm-gateway: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* ---- maps (mu held) -------------------------------------------------------------------- */
static void id_put(gw_server *s, gw_req *r)
{
	gw_req **b = &s->by_id[r->req_id % HBUCKETS];
	r->id_next = *b;
	*b = r;
}

static gw_req *id_find(gw_server *s, uint64_t id)
{
	for (gw_req *r = s->by_id[id % HBUCKETS]; r; r = r->id_next)
		if (r->req_id == id)
			return r;
	return NULL;
}

static void id_del(gw_server *s, gw_req *r)
{
	for (gw_req **p = &s->by_id[r->req_id % HBUCKETS]; *p; p = &(*p)->id_next)
		if (*p == r) {
			*p = r->id_next;
			return;
		}
}

static void serial_put(gw_server *s, gw_req *r)
{
	gw_req **b = &s->by_serial[r->serial % HBUCKETS];
	r->serial_next = *b;
	*b = r;
}

static gw_req *serial_find(gw_server *s, uint64_t serial)
{
	for (gw_req *r = s->by_serial[serial % HBUCKETS]; r; r = r->serial_next)
		if (r->serial == serial)
			return r;
	return NULL;
}

static void serial_del(gw_server *s, gw_req *r)
{
	for (gw_req **p = &s->by_serial[r->serial % HBUCKETS]; *p; p = &(*p)->serial_next)
		if (*p == r) {
			*p = r->serial_next;
			return;
		}
}

static void q_push(gw_server *s, gw_req *r)
{
	if (r->queued)
		return;
	r->queued = true;
	r->q_next = NULL;
	if (s->q_tail)
		s->q_tail->q_next = r;
	else
		s->q_head = r;
	s->q_tail = r;
}

static void q_del(gw_server *s, gw_req *r)
{
	if (!r->queued)
		return;
	gw_req *prev = NULL;
	for (gw_req *x = s->q_head; x; prev = x, x = x->q_next)
		if (x == r) {
			if (prev)
				prev->q_next = r->q_next;
			else
				s->q_head = r->q_next;
			if (s->q_tail == r)
				s->q_tail = prev;
			break;
		}
	r->queued = false;
}

/* ---- request objects ------------------------------------------------------------------- */
static gw_req *req_new(gw_server *s, enum ep ep, struct MHD_Connection *c)
{
	gw_req *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	r->s = s;
	r->conn = c;
	r->ep = ep;
	r->sock_fd = -1;
	pthread_mutex_lock(&s->mu);
	r->serial = ++s->next_serial;
	serial_put(s, r);
	if (ep == EP_COMPLETIONS || ep == EP_CHAT)
		s->n_gen_live++;
	pthread_mutex_unlock(&s->mu);
	return r;
}

/* mu held */
static void req_free(gw_server *s, gw_req *r)
{
	serial_del(s, r);
	q_del(s, r);
	if (r->ep == EP_COMPLETIONS || r->ep == EP_CHAT) {
		s->n_gen_live--;
		pthread_cond_broadcast(&s->cv);
	}
	gw_params_free(&r->p);
	free(r->ids);
	gw_buf_free(&r->body);
	gw_buf_free(&r->raw);
	gw_buf_free(&r->pend);
	gw_buf_free(&r->text);
	gw_buf_free(&r->out);
	gw_buf_free(&r->head);
	free(r);
}

/* mu held: hand the connection back to libmicrohttpd when it waits for us. */
static void wake(gw_req *r)
{
	if (r->suspended && r->conn) {
		r->suspended = false;
		MHD_resume_connection(r->conn);
	}
}

/* mu held */
static void suspend(gw_req *r)
{
	r->suspended = true;
	MHD_suspend_connection(r->conn);
}

/* mu held: watch the socket for a hang-up while the request lives. */
static void watch(gw_server *s, gw_req *r)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (!ci)
		return;
	struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLHUP | EPOLLERR | EPOLLONESHOT,
				 .data.u64 = r->serial};
	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, ci->connect_fd, &ev) == 0) {
		r->sock_fd = ci->connect_fd;
		r->watched = true;
	}
}

static void unwatch(gw_server *s, gw_req *r)
{
	if (r->watched)
		epoll_ctl(s->epfd, EPOLL_CTL_DEL, r->sock_fd, NULL);
	r->watched = false;
}

/* ---- failures -------------------------------------------------------------------------- */
static void fail_from_finish(gw_err *e, int fr, int cause)
{
	const char *cn = ringlm_reason_name(cause);
	switch (fr) {
	case RINGLM_FINISH_REJECTED:
		switch (cause) {
		case RINGLM_R_QUEUE_FULL:
			gw_err_set(e, 429, "queue_full", NULL, "ringlmd's queue is full; retry later");
			return;
		case RINGLM_R_TENANT_QUOTA:
			gw_err_set(e, 429, "tenant_quota", NULL, "this tenant's queued-token quota is spent; retry later");
			return;
		case RINGLM_R_INFEASIBLE_DEADLINE:
			gw_err_set(e, 429, "deadline_infeasible", NULL,
				   "the predicted queue wait exceeds the class's limit; retry later");
			return;
		case RINGLM_R_TOO_LONG:
			gw_err_set(e, 400, "too_long", "max_tokens",
				   "the prompt and max_tokens exceed the model's context (or a tenant's KV limit)");
			return;
		case RINGLM_R_BAD_TOKEN:
			gw_err_set(e, 400, "bad_token", "prompt", "a prompt token id is outside the model's vocabulary");
			return;
		case RINGLM_R_BAD_PARAMS:
			gw_err_set(e, 400, "bad_params", NULL, "ringlmd refused the request's parameters (or the key's tenant is not in its policy)");
			return;
		case RINGLM_R_UNKNOWN_CLASS:
			gw_err_set(e, 400, "unknown_class", "ringlm.class", "the request class is not in ringlmd's policy");
			return;
		case RINGLM_R_DRAINING:
			gw_err_set(e, 503, "draining", NULL, "ringlmd is draining: no new requests");
			return;
		default:
			gw_err_set(e, 500, "rejected", NULL, "ringlmd rejected the request: %s", cn);
			return;
		}
	case RINGLM_FINISH_TIMEOUT:
		gw_err_set(e, 504, "timeout", NULL, "the request timed out in ringlmd%s%s",
			   cause ? ": " : "", cause ? cn : "");
		return;
	case RINGLM_FINISH_CANCELLED:
		if (cause == RINGLM_R_DRAINING)
			gw_err_set(e, 503, "draining", NULL, "ringlmd cancelled the request while draining");
		else
			gw_err_set(e, 500, "cancelled", NULL, "ringlmd cancelled the request%s%s",
				   cause ? ": " : "", cause ? cn : "");
		return;
	default:
		gw_err_set(e, 500, "engine_error", NULL, "ringlmd failed the request%s%s",
			   cause ? ": " : "", cause ? cn : "");
		return;
	}
}

/* ---- stream chunks (mu held) ----------------------------------------------------------- */
static int sse_text(gw_req *r, const char *t, size_t n)
{
	int e = gw_buf_add(&r->out, r->head.p, r->head.len);
	if (r->p.kind == GW_CHAT) {
		e |= gw_buf_adds(&r->out, "{\"index\":0,\"delta\":{\"content\":");
		e |= gw_buf_add_json_str(&r->out, t, n);
		e |= gw_buf_adds(&r->out, "},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
	} else {
		e |= gw_buf_adds(&r->out, "{\"index\":0,\"text\":");
		e |= gw_buf_add_json_str(&r->out, t, n);
		e |= gw_buf_adds(&r->out, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
	}
	return e;
}

static void start_stream(gw_req *r)
{
	if (r->started)
		return;
	r->started = true;
	if (r->p.kind == GW_CHAT) {
		gw_buf_add(&r->out, r->head.p, r->head.len);
		gw_buf_adds(&r->out, "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
				     "\"logprobs\":null,\"finish_reason\":null}]}\n\n");
	}
}

static void usage_json(gw_buf *b, const gw_req *r)
{
	gw_buf_addf(b, "{\"prompt_tokens\":%u,\"completion_tokens\":%u,\"total_tokens\":%u}",
		    r->n_prompt, r->n_gen, r->n_prompt + r->n_gen);
}

static void sse_end(gw_req *r)
{
	if (r->failed) {
		char *j = gw_err_json(&r->err);
		gw_buf_adds(&r->out, "data: ");
		gw_buf_adds(&r->out, j ? j : "{\"error\":{\"message\":\"out of memory\"}}");
		gw_buf_adds(&r->out, "\n\n");
		free(j);
	} else {
		gw_buf_add(&r->out, r->head.p, r->head.len);
		if (r->p.kind == GW_CHAT)
			gw_buf_addf(&r->out, "{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"%s\"}]}\n\n",
				    r->finish);
		else
			gw_buf_addf(&r->out, "{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"%s\"}]}\n\n",
				    r->finish);
		if (r->p.include_usage) {
			gw_buf_add(&r->out, r->head.p, r->head.len);
			gw_buf_adds(&r->out, "],\"usage\":");
			usage_json(&r->out, r);
			gw_buf_adds(&r->out, "}\n\n");
		}
	}
	gw_buf_adds(&r->out, "data: [DONE]\n\n");
	r->out_done = true;
}

/* New decoded bytes are in r->raw: move whole UTF-8 into pend, cut at a stop string, emit
 * what no stop string can still claim. Returns true when a stop string was hit. */
static bool emit_text(gw_req *r, bool final)
{
	long k = gw_utf8_take(r->raw.p ? r->raw.p : "", r->raw.len, final, &r->pend);
	if (k > 0)
		gw_buf_consume(&r->raw, (size_t)k);
	size_t e = 0;
	bool hit = gw_stop_scan(&r->p.stop, r->pend.p ? r->pend.p : "", r->pend.len, &e);
	if (final && !hit)
		e = r->pend.len;
	if (e > 0) {
		if (r->p.stream) {
			start_stream(r);
			sse_text(r, r->pend.p, e);
		} else {
			gw_buf_add(&r->text, r->pend.p, e);
		}
	}
	gw_buf_consume(&r->pend, hit ? r->pend.len : e);
	return hit;
}

/* mu held: the daemon side of r is over. */
static void daemon_end(gw_server *s, gw_req *r)
{
	if (r->submitted && !r->daemon_done) {
		id_del(s, r);
		s->n_inflight--;
	}
	r->daemon_done = true;
	q_del(s, r);
	if (!r->gone && r->p.stream && r->started && !r->out_done)
		sse_end(r);
	wake(r);
	if (r->http_done)
		req_free(s, r);
}

/* mu held: r failed before or while generating. */
static void req_fail(gw_server *s, gw_req *r, const gw_err *e)
{
	if (!r->failed && !r->finish) {
		r->failed = true;
		r->err = *e;
	}
	daemon_end(s, r);
}

/* ---- the session (events thread; mu held where noted) ---------------------------------- */
static void cancel_locked(gw_server *s, gw_req *r)
{
	if (!r->submitted || r->daemon_done || !s->client)
		return;
	int rc = ringlm_cancel(s->client, r->req_id);
	if (rc == -EAGAIN) {
		r->need_cancel = true;
		q_push(s, r);
	}
}

/* mu held: submits r. 0 submitted or queued; -1 failed (r->err set, not yet answered). */
static int submit_locked(gw_server *s, gw_req *r)
{
	gw_err e;
	if (!s->client) {
		gw_err_set(&e, 503, "daemon_unavailable", NULL, "not connected to ringlmd%s%s",
			   s->conn_err[0] ? ": " : "", s->conn_err);
		r->failed = true;
		r->err = e;
		return -1;
	}
	uint64_t id;
	int rc = ringlm_submit(s->client, &r->rq, &id);
	if (rc == 0) {
		r->req_id = id;
		r->submitted = true;
		id_put(s, r);
		s->n_inflight++;
		return 0;
	}
	if (rc == -EAGAIN) {
		q_push(s, r);
		return 0;
	}
	if (rc == -ESHUTDOWN)
		gw_err_set(&e, 503, "draining", NULL, "ringlmd is draining: no new requests");
	else if (rc == -E2BIG)
		gw_err_set(&e, 400, "too_long", "prompt", "the prompt is too long for the session's submit ring: %s",
			   ringlm_errdetail());
	else if (rc == -EINVAL)
		gw_err_set(&e, 400, "bad_params", NULL, "%s", ringlm_errdetail());
	else
		gw_err_set(&e, 503, "daemon_unavailable", NULL, "ringlmd: %s (%s)", ringlm_strerror(rc),
			   ringlm_errdetail());
	r->failed = true;
	r->err = e;
	return -1;
}

/* mu held: retry what waited for ring space. */
static void retry_queue(gw_server *s)
{
	while (s->q_head) {
		gw_req *r = s->q_head;
		if (r->need_cancel) {
			if (s->client && ringlm_cancel(s->client, r->req_id) == -EAGAIN)
				return;
			r->need_cancel = false;
			q_del(s, r);
			continue;
		}
		q_del(s, r);
		if (r->gone) {
			daemon_end(s, r);
			continue;
		}
		int rc = submit_locked(s, r);
		if (rc < 0) {
			daemon_end(s, r);
			continue;
		}
		if (r->queued)
			return; /* still full */
	}
}

static void on_token(gw_server *s, const ringlm_event *ev)
{
	gw_req *r = id_find(s, ev->req_id);
	if (!r || r->finish || r->failed)
		return; /* cut at a stop string: the rest until FINISH is dropped */
	uint64_t t0 = now_ns();
	r->n_gen++;
	const char *piece = s->cfg.tok ? tok_decode(s->cfg.tok, r->prev, ev->token) : NULL;
	r->prev = ev->token;
	if (piece)
		gw_buf_adds(&r->raw, piece);
	if (emit_text(r, false)) {
		r->finish = "stop";
		cancel_locked(s, r);
	}
	if (r->p.stream) {
		start_stream(r);
		if (!r->gone)
			wake(r);
	}
	s->tokens_out++;
	s->dispatch_ns_sum += now_ns() - t0;
	s->dispatch_n++;
}

static void on_finish(gw_server *s, const ringlm_event *ev)
{
	gw_req *r = id_find(s, ev->req_id);
	if (!r)
		return;
	if (!r->finish && !r->failed && !r->gone) {
		if (ev->finish_reason == RINGLM_FINISH_STOP || ev->finish_reason == RINGLM_FINISH_LENGTH) {
			bool hit = emit_text(r, true);
			r->finish = hit || ev->finish_reason == RINGLM_FINISH_STOP ? "stop" : "length";
			if (r->p.stream)
				start_stream(r);
		} else {
			gw_err e;
			fail_from_finish(&e, ev->finish_reason, ev->reject_reason);
			r->failed = true;
			r->err = e;
		}
	}
	daemon_end(s, r);
}

/* mu held: the session ended; every request on it fails with 503. */
static void session_lost(gw_server *s, int rc)
{
	snprintf(s->conn_err, sizeof s->conn_err, "%s (%s)", ringlm_strerror(rc), ringlm_errdetail());
	logm(s, "session with ringlmd ended: %s; reconnecting", s->conn_err);
	gw_err e;
	gw_err_set(&e, 503, "daemon_unavailable", NULL, "ringlmd went away: %s", s->conn_err);
	for (int b = 0; b < HBUCKETS; b++)
		while (s->by_id[b])
			req_fail(s, s->by_id[b], &e);
	while (s->q_head)
		req_fail(s, s->q_head, &e);
	ringlm_close(s->client);
	s->client = NULL;
	s->session_losses++;
}

static void *events_main(void *arg)
{
	gw_server *s = arg;
	ringlm_event evs[EVENT_BATCH];
	char last_err[256] = "";
	for (;;) {
		pthread_mutex_lock(&s->mu);
		bool stop = s->stopping;
		ringlm_client *c = s->client;
		pthread_mutex_unlock(&s->mu);
		if (stop)
			break;
		if (!c) {
			int rc = ringlm_connect(s->cfg.socket_path, &c);
			pthread_mutex_lock(&s->mu);
			if (rc == 0) {
				s->client = c;
				s->conn_err[0] = 0;
				s->connects++;
				last_err[0] = 0;
				logm(s, "connected to ringlmd (session %llu)",
				     (unsigned long long)ringlm_session_id(c));
			} else {
				snprintf(s->conn_err, sizeof s->conn_err, "%s (%s)", ringlm_strerror(rc),
					 ringlm_errdetail());
				if (strcmp(last_err, s->conn_err)) {
					logm(s, "cannot connect to ringlmd: %s; retrying every %d ms", s->conn_err,
					     RECONNECT_MS);
					snprintf(last_err, sizeof last_err, "%s", s->conn_err);
				}
				struct timespec dl;
				clock_gettime(CLOCK_REALTIME, &dl);
				dl.tv_nsec += RECONNECT_MS * 1000000l;
				dl.tv_sec += dl.tv_nsec / 1000000000l;
				dl.tv_nsec %= 1000000000l;
				if (!s->stopping)
					pthread_cond_timedwait(&s->cv, &s->mu, &dl);
			}
			pthread_mutex_unlock(&s->mu);
			continue;
		}
		int n = 0, rc = ringlm_next_event(c, &evs[0], EVENT_WAIT_MS);
		if (rc == 1) {
			n = 1;
			while (n < EVENT_BATCH && (rc = ringlm_next_event(c, &evs[n], 0)) == 1)
				n++;
		}
		pthread_mutex_lock(&s->mu);
		for (int i = 0; i < n; i++) {
			if (evs[i].kind == RINGLM_EV_TOKEN)
				on_token(s, &evs[i]);
			else if (evs[i].kind == RINGLM_EV_FINISH)
				on_finish(s, &evs[i]);
		}
		if (rc < 0 && rc != -EINTR)
			session_lost(s, rc);
		else
			retry_queue(s);
		pthread_mutex_unlock(&s->mu);
	}
	return NULL;
}

/* ---- watch thread ---------------------------------------------------------------------- */
static void *watch_main(void *arg)
{
	gw_server *s = arg;
	struct epoll_event evs[64];
	for (;;) {
		int n = epoll_wait(s->epfd, evs, 64, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			break;
		pthread_mutex_lock(&s->mu);
		bool stop = s->stopping;
		for (int i = 0; i < n && !stop; i++) {
			gw_req *r = serial_find(s, evs[i].data.u64);
			if (!r || r->http_done)
				continue;
			r->gone = true;
			cancel_locked(s, r);
			if (!r->submitted && r->queued)
				daemon_end(s, r); /* never reached the daemon */
			else
				wake(r);
		}
		pthread_mutex_unlock(&s->mu);
		if (stop)
			break;
	}
	return NULL;
}

/* ---- HTTP answers ---------------------------------------------------------------------- */
static enum MHD_Result answer(gw_req *r, struct MHD_Connection *c, int status, const char *ctype,
			      char *body /* malloc'ed, taken */)
{
	if (!body)
		return MHD_NO;
	struct MHD_Response *resp =
		MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type", ctype);
	if (status == 429 || status == 503)
		MHD_add_response_header(resp, "Retry-After", "1");
	if (r) {
		r->status = status;
		r->state = RQ_ANSWERED;
	}
	enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
	MHD_destroy_response(resp);
	return ret;
}

static enum MHD_Result answer_json(gw_req *r, struct MHD_Connection *c, int status, json_t *o)
{
	char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return answer(r, c, status, "application/json", t);
}

static enum MHD_Result answer_err(gw_req *r, struct MHD_Connection *c, const gw_err *e)
{
	return answer(r, c, e->status, "application/json", gw_err_json(e));
}

static enum MHD_Result answer_errf(gw_req *r, struct MHD_Connection *c, int status, const char *code,
				   const char *msg)
{
	gw_err e;
	gw_err_set(&e, status, code, NULL, "%s", msg);
	return answer_err(r, c, &e);
}

/* The SSE content reader (http thread). */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	gw_req *r = cls;
	gw_server *s = r->s;
	pthread_mutex_lock(&s->mu);
	ssize_t n;
	if (r->out.len) {
		size_t k = r->out.len < max ? r->out.len : max;
		memcpy(buf, r->out.p, k);
		gw_buf_consume(&r->out, k);
		n = (ssize_t)k;
	} else if (r->out_done) {
		n = MHD_CONTENT_READER_END_OF_STREAM;
	} else if (r->gone || s->stopping) {
		n = MHD_CONTENT_READER_END_WITH_ERROR;
	} else {
		suspend(r);
		n = 0;
	}
	pthread_mutex_unlock(&s->mu);
	return n;
}

/* mu held: the whole (non-stream) answer of a finished generation. */
static enum MHD_Result answer_generation(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
	json_t *choice;
	json_t *text = json_stringn(r->text.p ? r->text.p : "", r->text.len);
	if (r->p.kind == GW_CHAT)
		choice = json_pack("{s:i, s:{s:s, s:o}, s:n, s:s}", "index", 0, "message", "role",
				   "assistant", "content", text, "logprobs", "finish_reason", r->finish);
	else
		choice = json_pack("{s:i, s:o, s:n, s:s}", "index", 0, "text", text, "logprobs",
				   "finish_reason", r->finish);
	json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:{s:i, s:i, s:i}}", "id", r->id, "object",
			      r->p.kind == GW_CHAT ? "chat.completion" : "text_completion", "created",
			      (json_int_t)r->created, "model", s->cfg.served_model, "choices", choice,
			      "usage", "prompt_tokens", (int)r->n_prompt, "completion_tokens",
			      (int)r->n_gen, "total_tokens", (int)(r->n_prompt + r->n_gen));
	return answer_json(r, c, 200, o);
}

/* mu held: the first event of r arrived (or it failed): answer or start the stream. */
static enum MHD_Result resumed(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
	if (r->gone || s->stopping)
		return MHD_NO;
	if (r->p.stream && r->started) {
		struct MHD_Response *resp =
			MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, sse_read, r, NULL);
		if (!resp)
			return MHD_NO;
		MHD_add_response_header(resp, "Content-Type", "text/event-stream");
		MHD_add_response_header(resp, "Cache-Control", "no-cache");
		r->state = RQ_STREAM;
		r->status = 200;
		s->n_streams++;
		enum MHD_Result ret = MHD_queue_response(c, 200, resp);
		MHD_destroy_response(resp);
		return ret;
	}
	if (r->failed)
		return answer_err(r, c, &r->err);
	if (r->daemon_done)
		return answer_generation(s, r, c);
	suspend(r); /* woken early: wait on */
	return MHD_YES;
}

/* ---- generation requests --------------------------------------------------------------- */
static int encode_text(const tok_tokenizer *t, const char *text, int32_t **ids, uint32_t *n)
{
	size_t cap = tok_encode_bound(text);
	*ids = malloc(cap * sizeof **ids);
	if (!*ids)
		return -ENOMEM;
	int k = tok_encode(t, text, true, false, *ids, (int)cap);
	if (k < 0)
		return k;
	*n = (uint32_t)k;
	return 0;
}

static enum MHD_Result start_generation(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
	gw_err e;
	uint64_t t0 = now_us();
	gw_parse_cfg pc = {.served_model = s->cfg.served_model, .tpl = s->cfg.tpl};
	if (gw_params_parse(r->ep == EP_CHAT ? GW_CHAT : GW_COMPLETION, r->body.p ? r->body.p : "",
			    r->body.len, &pc, &r->p, &e))
		return answer_err(r, c, &e);
	if (r->p.ignore_eos)
		return answer_errf(r, c, 400, "unsupported",
				   "'ignore_eos' is not supported: this ringlmd has no fixed-length requests");
	if (r->p.prompt_text) {
		if (!s->cfg.tok)
			return answer_errf(r, c, 400, "unsupported",
					   "the gateway has no tokenizer: send 'prompt' as token ids");
		int rc = encode_text(s->cfg.tok, r->p.prompt_text, &r->ids, &r->n_prompt);
		if (rc < 0) {
			gw_err_set(&e, 400, "bad_prompt", "prompt", "the prompt cannot be tokenized: %s",
				   tok_errmsg());
			return answer_err(r, c, &e);
		}
	} else {
		r->ids = r->p.prompt_ids;
		r->n_prompt = r->p.n_prompt_ids;
		r->p.prompt_ids = NULL;
		int vocab = s->cfg.tok ? tok_vocab_size(s->cfg.tok) : 0;
		for (uint32_t i = 0; vocab && i < r->n_prompt; i++)
			if (r->ids[i] >= vocab) {
				gw_err_set(&e, 400, "bad_token", "prompt",
					   "prompt token %u is %d; the vocabulary has %d tokens", i, r->ids[i], vocab);
				return answer_err(r, c, &e);
			}
	}
	long max_new = r->p.max_tokens;
	if (max_new < 0) {
		if (r->p.kind == GW_COMPLETION)
			max_new = 16;
		else if (s->cfg.max_model_len > r->n_prompt)
			max_new = (long)(s->cfg.max_model_len + 1 - r->n_prompt);
		else
			max_new = 256;
	}
	ringlm_request_init(&r->rq);
	r->rq.prompt = r->ids;
	r->rq.n_prompt = r->n_prompt;
	r->rq.max_new_tokens = (uint32_t)max_new;
	r->rq.temperature = (float)r->p.temperature;
	r->rq.top_p = (float)r->p.top_p;
	r->rq.top_k = r->p.top_k;
	r->rq.deadline_us = r->p.deadline_ms * 1000u;
	const char *cls = r->p.class_name[0] ? r->p.class_name
			  : r->key && r->key->class_name[0] ? r->key->class_name : "";
	r->rq.class_name = cls;
	r->rq.tenant_tag = r->key ? r->key->tenant : NULL;
	r->prev = r->n_prompt ? r->ids[r->n_prompt - 1] : 0;

	pthread_mutex_lock(&s->mu);
	r->rq.seed = r->p.has_seed ? r->p.seed : xorshift(&s->rng);
	snprintf(r->id, sizeof r->id, "%s-%s%llx", r->p.kind == GW_CHAT ? "chatcmpl" : "cmpl", s->id_prefix,
		 (unsigned long long)r->serial);
	r->created = (long long)time(NULL);
	gw_buf_addf(&r->head, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":%s,\"choices\":[",
		    r->id, r->p.kind == GW_CHAT ? "chat.completion.chunk" : "text_completion", r->created,
		    s->model_json);
	if (s->draining) {
		pthread_mutex_unlock(&s->mu);
		return answer_errf(r, c, 503, "draining", "the gateway is shutting down");
	}
	if (submit_locked(s, r) < 0) {
		enum MHD_Result ret = answer_err(r, c, &r->err);
		pthread_mutex_unlock(&s->mu);
		return ret;
	}
	r->state = RQ_WAIT;
	s->admit_us_sum += now_us() - t0;
	s->admit_n++;
	watch(s, r);
	suspend(r);
	pthread_mutex_unlock(&s->mu);
	return MHD_YES;
}

/* ---- small endpoints ------------------------------------------------------------------- */
static enum MHD_Result ep_models(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
	json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", s->cfg.served_model, "object", "model",
			      "created", (json_int_t)time(NULL), "owned_by", "ringlm", "root",
			      s->cfg.served_model);
	if (m && s->cfg.max_model_len)
		json_object_set_new(m, "max_model_len", json_integer(s->cfg.max_model_len));
	return answer_json(r, c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}

static enum MHD_Result ep_health(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
	pthread_mutex_lock(&s->mu);
	const char *why = s->draining ? "the gateway is draining"
			: !s->client ? "not connected to ringlmd"
			: ringlm_draining(s->client) ? "ringlmd is draining" : NULL;
	char msg[320];
	snprintf(msg, sizeof msg, "%s%s%s", why ? why : "", why && s->conn_err[0] && !s->client ? ": " : "",
		 why && !s->client ? s->conn_err : "");
	pthread_mutex_unlock(&s->mu);
	if (why)
		return answer_errf(r, c, 503, "unavailable", msg);
	return answer(r, c, 200, "application/json", strdup("{\"status\":\"ok\"}"));
}

static enum MHD_Result ep_tokenize(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
	json_error_t je;
	gw_err e;
	if (!s->cfg.tok)
		return answer_errf(r, c, 400, "unsupported", "the gateway has no tokenizer");
	json_t *o = json_loadb(r->body.p ? r->body.p : "", r->body.len, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(o)) {
		json_decref(o);
		return answer_errf(r, c, 400, "invalid_json", "the body must be a JSON object");
	}
	json_t *add = json_object_get(o, "add_special_tokens");
	if (add && !json_is_boolean(add) && !json_is_null(add)) {
		json_decref(o);
		gw_err_set(&e, 400, "invalid_value", "add_special_tokens", "'add_special_tokens' must be a boolean");
		return answer_err(r, c, &e);
	}
	bool bos = !add || !json_is_false(add);
	char *text = NULL;
	if (json_object_get(o, "messages")) {
		gw_parse_cfg pc = {.served_model = NULL, .tpl = s->cfg.tpl};
		gw_params p;
		char *body = json_dumps(o, JSON_COMPACT);
		int rc = body ? gw_params_parse(GW_CHAT, body, strlen(body), &pc, &p, &e) : -1;
		free(body);
		if (rc) {
			json_decref(o);
			return answer_err(r, c, &e);
		}
		text = p.prompt_text;
		p.prompt_text = NULL;
		gw_params_free(&p);
	} else {
		json_t *pr = json_object_get(o, "prompt");
		if (!json_is_string(pr)) {
			json_decref(o);
			gw_err_set(&e, 400, "invalid_value", "prompt", "'prompt' must be a string (or give 'messages')");
			return answer_err(r, c, &e);
		}
		text = strdup(json_string_value(pr));
	}
	json_decref(o);
	if (!text)
		return MHD_NO;
	size_t cap = tok_encode_bound(text);
	int32_t *ids = malloc(cap * sizeof *ids);
	int n = ids ? tok_encode(s->cfg.tok, text, bos, false, ids, (int)cap) : -ENOMEM;
	free(text);
	if (n < 0) {
		free(ids);
		return answer_errf(r, c, 400, "bad_prompt", "the prompt cannot be tokenized");
	}
	json_t *arr = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(arr, json_integer(ids[i]));
	free(ids);
	json_t *res = json_pack("{s:i, s:o}", "count", n, "tokens", arr);
	if (res && s->cfg.max_model_len)
		json_object_set_new(res, "max_model_len", json_integer(s->cfg.max_model_len));
	return answer_json(r, c, 200, res);
}

static enum MHD_Result ep_detokenize(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
	json_error_t je;
	gw_err e;
	if (!s->cfg.tok)
		return answer_errf(r, c, 400, "unsupported", "the gateway has no tokenizer");
	json_t *o = json_loadb(r->body.p ? r->body.p : "", r->body.len, JSON_REJECT_DUPLICATES, &je);
	json_t *t = json_object_get(o, "tokens");
	if (!json_is_object(o) || !json_is_array(t)) {
		json_decref(o);
		gw_err_set(&e, 400, "invalid_value", "tokens", "'tokens' must be a list of token ids");
		return answer_err(r, c, &e);
	}
	gw_buf raw = {0}, clean = {0};
	int32_t prev = -1;
	int vocab = tok_vocab_size(s->cfg.tok);
	for (size_t i = 0; i < json_array_size(t); i++) {
		json_t *v = json_array_get(t, i);
		json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
		if (id < 0 || id >= vocab) {
			json_decref(o);
			gw_buf_free(&raw);
			gw_err_set(&e, 400, "bad_token", "tokens", "'tokens' item %zu is not a token id below %d", i,
				   vocab);
			return answer_err(r, c, &e);
		}
		if (id != TOK_BOS && id != TOK_EOS)
			gw_buf_adds(&raw, tok_decode(s->cfg.tok, prev, (int32_t)id));
		prev = (int32_t)id;
	}
	json_decref(o);
	gw_utf8_take(raw.p ? raw.p : "", raw.len, true, &clean);
	json_t *res = json_pack("{s:s%}", "prompt", clean.p ? clean.p : "", clean.len);
	gw_buf_free(&raw);
	gw_buf_free(&clean);
	return answer_json(r, c, 200, res);
}

static enum MHD_Result ep_metrics(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
	gw_buf b = {0};
	pthread_mutex_lock(&s->mu);
	gw_buf_adds(&b, "# HELP ringlm_gateway_requests_total HTTP requests answered, by endpoint and status.\n"
			"# TYPE ringlm_gateway_requests_total counter\n");
	for (int e = 0; e < EP_N; e++)
		for (int k = 0; k < NSTAT; k++)
			if (s->req_count[e][k])
			{
				char st[16];
				if (stat_codes[k])
					snprintf(st, sizeof st, "%d", stat_codes[k]);
				else
					snprintf(st, sizeof st, "other");
				gw_buf_addf(&b, "ringlm_gateway_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n",
					    ep_name[e], st, (unsigned long long)s->req_count[e][k]);
			}
	gw_buf_addf(&b,
		    "# HELP ringlm_gateway_requests_in_flight Generation requests submitted to ringlmd and not finished.\n"
		    "# TYPE ringlm_gateway_requests_in_flight gauge\nringlm_gateway_requests_in_flight %zu\n"
		    "# HELP ringlm_gateway_streams_open SSE responses open.\n"
		    "# TYPE ringlm_gateway_streams_open gauge\nringlm_gateway_streams_open %zu\n"
		    "# HELP ringlm_gateway_daemon_connected 1 while a session with ringlmd is up.\n"
		    "# TYPE ringlm_gateway_daemon_connected gauge\nringlm_gateway_daemon_connected %d\n"
		    "# HELP ringlm_gateway_admission_seconds Time in the gateway from a whole body to the submit (parse, tokenize, submit).\n"
		    "# TYPE ringlm_gateway_admission_seconds summary\n"
		    "ringlm_gateway_admission_seconds_sum %.6f\nringlm_gateway_admission_seconds_count %llu\n"
		    "# HELP ringlm_gateway_token_seconds Time in the gateway per generated token (decode, UTF-8, stop strings, chunk).\n"
		    "# TYPE ringlm_gateway_token_seconds summary\n"
		    "ringlm_gateway_token_seconds_sum %.9f\nringlm_gateway_token_seconds_count %llu\n"
		    "# HELP ringlm_gateway_session_connects_total Sessions opened with ringlmd.\n"
		    "# TYPE ringlm_gateway_session_connects_total counter\nringlm_gateway_session_connects_total %llu\n"
		    "# HELP ringlm_gateway_session_losses_total Sessions that ended under the gateway (daemon exit).\n"
		    "# TYPE ringlm_gateway_session_losses_total counter\nringlm_gateway_session_losses_total %llu\n",
		    s->n_inflight, s->n_streams, s->client ? 1 : 0, (double)s->admit_us_sum / 1e6,
		    (unsigned long long)s->admit_n, (double)s->dispatch_ns_sum / 1e9,
		    (unsigned long long)s->dispatch_n, (unsigned long long)s->connects,
		    (unsigned long long)s->session_losses);
	pthread_mutex_unlock(&s->mu);
	if (!b.p)
		return MHD_NO;
	return answer(r, c, 200, "text/plain; version=0.0.4", b.p);
}

/* ---- routing --------------------------------------------------------------------------- */
static enum ep route(const char *url)
{
	if (!strcmp(url, "/v1/completions")) return EP_COMPLETIONS;
	if (!strcmp(url, "/v1/chat/completions")) return EP_CHAT;
	if (!strcmp(url, "/v1/models")) return EP_MODELS;
	if (!strcmp(url, "/health")) return EP_HEALTH;
	if (!strcmp(url, "/tokenize")) return EP_TOKENIZE;
	if (!strcmp(url, "/detokenize")) return EP_DETOKENIZE;
	if (!strcmp(url, "/metrics")) return EP_METRICS;
	return EP_OTHER;
}

static bool ep_is_post(enum ep e)
{
	return e == EP_COMPLETIONS || e == EP_CHAT || e == EP_TOKENIZE || e == EP_DETOKENIZE;
}

/* The key of "Authorization: Bearer KEY"; -1 when keys are configured and it is missing or
 * unknown. */
static int authenticate(gw_server *s, struct MHD_Connection *c, const gw_key **key)
{
	*key = NULL;
	if (!s->cfg.keys)
		return 0;
	const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
	if (!h || strncasecmp(h, "Bearer ", 7))
		return -1;
	h += 7;
	while (*h == ' ')
		h++;
	size_t n = strlen(h);
	while (n && h[n - 1] == ' ')
		n--;
	*key = gw_keys_find(s->cfg.keys, h, n);
	return *key ? 0 : -1;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	(void)version;
	gw_server *s = cls;
	gw_req *r = *con_cls;
	if (!r) {
		enum ep ep = route(url);
		r = req_new(s, ep, c);
		if (!r)
			return MHD_NO;
		*con_cls = r;
		if (ep == EP_OTHER)
			return answer_errf(r, c, 404, "not_found", "no such endpoint");
		bool post = !strcmp(method, "POST");
		if (ep_is_post(ep) != post || (!post && strcmp(method, "GET") && strcmp(method, "HEAD")))
			return answer_errf(r, c, 405, "method_not_allowed",
					   ep_is_post(ep) ? "use POST" : "use GET");
		if (ep != EP_HEALTH && ep != EP_METRICS && authenticate(s, c, &r->key) < 0) {
			gw_err e;
			gw_err_set(&e, 401, "invalid_api_key", NULL,
				   "missing or unknown API key (send 'Authorization: Bearer KEY')");
			return answer_err(r, c, &e);
		}
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
		if (post && cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) {
			char m[128];
			snprintf(m, sizeof m, "the body is larger than %zu bytes", s->cfg.max_body_bytes);
			return answer_errf(r, c, 413, "body_too_large", m);
		}
		return MHD_YES;
	}
	if (r->state == RQ_BODY && *upload_size) {
		if (!r->too_big && r->body.len + *upload_size > s->cfg.max_body_bytes) {
			r->too_big = true;
			gw_buf_free(&r->body);
		}
		if (!r->too_big && gw_buf_add(&r->body, upload, *upload_size))
			return MHD_NO;
		*upload_size = 0;
		return MHD_YES;
	}
	if (r->state == RQ_BODY) {
		if (r->too_big) {
			char m[128];
			snprintf(m, sizeof m, "the body is larger than %zu bytes", s->cfg.max_body_bytes);
			return answer_errf(r, c, 413, "body_too_large", m);
		}
		switch (r->ep) {
		case EP_COMPLETIONS:
		case EP_CHAT: return start_generation(s, r, c);
		case EP_MODELS: return ep_models(s, r, c);
		case EP_HEALTH: return ep_health(s, r, c);
		case EP_TOKENIZE: return ep_tokenize(s, r, c);
		case EP_DETOKENIZE: return ep_detokenize(s, r, c);
		case EP_METRICS: return ep_metrics(s, r, c);
		default: return answer_errf(r, c, 404, "not_found", "no such endpoint");
		}
	}
	if (*upload_size) {
		*upload_size = 0; /* answered early (401, 413): the rest of the body is dropped */
		return MHD_YES;
	}
	if (r->state == RQ_WAIT) {
		pthread_mutex_lock(&s->mu);
		enum MHD_Result ret = resumed(s, r, c);
		pthread_mutex_unlock(&s->mu);
		return ret;
	}
	return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	(void)c;
	(void)toe;
	gw_server *s = cls;
	gw_req *r = *con_cls;
	if (!r)
		return;
	*con_cls = NULL;
	pthread_mutex_lock(&s->mu);
	s->req_count[r->ep][stat_slot(r->status ? r->status : 500)]++;
	unwatch(s, r);
	if (r->state == RQ_STREAM)
		s->n_streams--;
	r->http_done = true;
	r->conn = NULL;
	r->suspended = false;
	if (!r->daemon_done && (r->submitted || r->queued)) {
		r->gone = true;
		if (r->submitted)
			cancel_locked(s, r);
		else
			daemon_end(s, r); /* never reached the daemon: frees r */
	} else {
		req_free(s, r);
	}
	pthread_mutex_unlock(&s->mu);
}

/* ---- life ------------------------------------------------------------------------------ */
int gw_server_start(const gw_cfg *cfg, gw_server **out)
{
	gw_server *s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	s->cfg = *cfg;
	s->epfd = -1;
	s->stop_efd = -1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	s->rng = now_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;
	snprintf(s->id_prefix, sizeof s->id_prefix, "%06llx", (unsigned long long)(xorshift(&s->rng) & 0xffffff));
	json_t *mj = json_string(cfg->served_model);
	s->model_json = mj ? json_dumps(mj, JSON_ENCODE_ANY) : NULL;
	json_decref(mj);
	int rc = -ENOMEM;
	if (!s->model_json)
		goto fail;

	s->epfd = epoll_create1(EPOLL_CLOEXEC);
	s->stop_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->epfd < 0 || s->stop_efd < 0) {
		rc = -errno;
		goto fail;
	}
	struct epoll_event sev = {.events = EPOLLIN, .data.u64 = 0};
	epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->stop_efd, &sev);

	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss);
	const char *addr = cfg->listen_addr ? cfg->listen_addr : "127.0.0.1";
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
			 MHD_USE_ERROR_LOG;
	struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
	if (inet_pton(AF_INET, addr, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		a4->sin_port = htons(cfg->port);
	} else if (inet_pton(AF_INET6, addr, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons(cfg->port);
		flags |= MHD_USE_IPv6;
	} else {
		fprintf(stderr, "ringlm-gateway: --listen address '%s' is not an IPv4 or IPv6 literal\n", addr);
		rc = -EINVAL;
		goto fail;
	}
	s->mhd = MHD_start_daemon(flags, cfg->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &ss,
				  MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_TIMEOUT,
				  (unsigned)cfg->http_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
				  (unsigned)cfg->max_connections, MHD_OPTION_END);
	if (!s->mhd) {
		fprintf(stderr, "ringlm-gateway: cannot listen on %s:%u (in use? no permission?)\n", addr,
			(unsigned)cfg->port);
		rc = -EADDRINUSE;
		goto fail;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
	s->port = di ? di->port : cfg->port;
	if (pthread_create(&s->ev_thread, NULL, events_main, s)) {
		rc = -EAGAIN;
		goto fail;
	}
	s->ev_started = true;
	if (pthread_create(&s->watch_thread, NULL, watch_main, s)) {
		rc = -EAGAIN;
		goto fail;
	}
	s->watch_started = true;
	*out = s;
	return 0;
fail:
	gw_server_stop(s);
	return rc;
}

uint16_t gw_server_port(const gw_server *s)
{
	return s->port;
}

static void deadline_in(struct timespec *dl, unsigned ms)
{
	clock_gettime(CLOCK_REALTIME, dl);
	dl->tv_sec += ms / 1000;
	dl->tv_nsec += (long)(ms % 1000) * 1000000l;
	dl->tv_sec += dl->tv_nsec / 1000000000l;
	dl->tv_nsec %= 1000000000l;
}

void gw_server_drain(gw_server *s, unsigned grace_ms)
{
	pthread_mutex_lock(&s->mu);
	s->draining = true;
	pthread_mutex_unlock(&s->mu);
	MHD_socket lfd = MHD_quiesce_daemon(s->mhd);
	if (lfd != MHD_INVALID_SOCKET)
		close(lfd);
	struct timespec dl;
	deadline_in(&dl, grace_ms);
	pthread_mutex_lock(&s->mu);
	logm(s, "draining: %zu requests in flight, %u ms to finish", s->n_gen_live, grace_ms);
	while (s->n_gen_live && pthread_cond_timedwait(&s->cv, &s->mu, &dl) != ETIMEDOUT)
		;
	if (s->n_gen_live) {
		logm(s, "drain: cancelling %zu requests after the grace period", s->n_gen_live);
		for (int b = 0; b < HBUCKETS; b++)
			for (gw_req *r = s->by_id[b]; r; r = r->id_next)
				cancel_locked(s, r);
		deadline_in(&dl, 3000);
		while (s->n_gen_live && pthread_cond_timedwait(&s->cv, &s->mu, &dl) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&s->mu);
}

void gw_server_stop(gw_server *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stopping = true;
	pthread_cond_broadcast(&s->cv);
	/* libmicrohttpd must not be stopped with suspended connections. */
	for (int b = 0; b < HBUCKETS; b++)
		for (gw_req *r = s->by_serial[b]; r; r = r->serial_next) {
			r->gone = true;
			wake(r);
		}
	pthread_mutex_unlock(&s->mu);
	if (s->mhd)
		MHD_stop_daemon(s->mhd);
	if (s->ev_started)
		pthread_join(s->ev_thread, NULL);
	if (s->watch_started) {
		uint64_t one = 1;
		ssize_t w = write(s->stop_efd, &one, sizeof one);
		(void)w;
		pthread_join(s->watch_thread, NULL);
	}
	pthread_mutex_lock(&s->mu);
	for (int b = 0; b < HBUCKETS; b++)
		while (s->by_serial[b]) {
			gw_req *r = s->by_serial[b];
			if (r->submitted && !r->daemon_done) {
				id_del(s, r);
				r->daemon_done = true;
			}
			req_free(s, r);
		}
	pthread_mutex_unlock(&s->mu);
	if (s->client)
		ringlm_close(s->client);
	if (s->epfd >= 0)
		close(s->epfd);
	if (s->stop_efd >= 0)
		close(s->stop_efd);
	free(s->model_json);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
}
