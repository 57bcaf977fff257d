/* SPDX-License-Identifier: MIT */
/*
 * daemon/echo.c — the echo service: the smallest service that exercises every path of
 * the loop (requests, cancels, deadlines, finish events, backpressure, session close).
 */
#include "daemon/echo.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct echo_req {
    struct echo_req *next;
    uint64_t req_id;
    uint32_t max_new, emitted, n_prompt;
    uint32_t next_prompt;   /* emitted % n_prompt, kept without a division */
    uint64_t deadline_us;   /* absolute loop time, 0 = none */
    unsigned finish_reason; /* set when it must finish now (cancel, reject, timeout) */
    unsigned finish_cause;
    int32_t prompt[];
};

struct echo_sess {
    dsess *s;
    struct echo_req *head, **tail;
    struct echo_sess *next, *prev; /* sessions with requests */
    int listed;
};

struct echo_svc {
    dloop *loop;
    struct echo_sess *busy;
    unsigned long long finished;
};

static void busy_add(echo_svc *e, struct echo_sess *es)
{
    if (es->listed) return;
    es->listed = 1;
    es->prev = NULL;
    es->next = e->busy;
    if (e->busy) e->busy->prev = es;
    e->busy = es;
}

static void busy_del(echo_svc *e, struct echo_sess *es)
{
    if (!es->listed) return;
    es->listed = 0;
    if (es->prev)
        es->prev->next = es->next;
    else
        e->busy = es->next;
    if (es->next) es->next->prev = es->prev;
}

static int echo_on_connect(void *ctx, dsess *s)
{
    (void)ctx;
    struct echo_sess *es = calloc(1, sizeof(*es));
    if (!es) return -ENOMEM;
    es->s = s;
    es->tail = &es->head;
    dsess_set_user(s, es);
    return 0;
}

static void enqueue(echo_svc *e, struct echo_sess *es, struct echo_req *r)
{
    r->next = NULL;
    *es->tail = r;
    es->tail = &r->next;
    busy_add(e, es);
}

static void echo_on_request(void *ctx, dsess *s, const struct ringlm_wire_parsed *rec,
                            const char *tenant_tag)
{
    echo_svc *e = ctx;
    struct echo_sess *es = dsess_user(s);
    const struct ringlm_wire_request *req = rec->req;
    const int32_t *prompt = rec->prompt;
    const uint32_t n_prompt = req->n_prompt;
    char why[200];
    (void)tenant_tag;

    struct echo_req *r = malloc(sizeof(*r) + (size_t)n_prompt * sizeof(int32_t));
    if (!r) {
        dsess_end(s, "echo: out of memory");
        return;
    }
    memset(r, 0, sizeof(*r));
    r->req_id = req->req_id;
    r->max_new = req->max_new_tokens;
    r->n_prompt = n_prompt;
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof(int32_t));
    if (req->deadline_us) r->deadline_us = dloop_now_us(e->loop) + req->deadline_us;
    /* No model: the sampling extensions are refused (the session never advertised them). */
    int cause = ringlm_wire_check_request(req, why, sizeof(why));
    if (!cause && rec->smp) cause = RINGLM_WIRE_R_BAD_PARAMS;
    if (cause) {
        r->finish_reason = RINGLM_WIRE_R_REJECTED;
        r->finish_cause = (unsigned)cause;
    }
    enqueue(e, es, r);
}

static void echo_on_cancel(void *ctx, dsess *s, uint64_t req_id)
{
    (void)ctx;
    struct echo_sess *es = dsess_user(s);
    for (struct echo_req *r = es->head; r; r = r->next)
        if (r->req_id == req_id && !r->finish_reason) r->finish_reason = RINGLM_WIRE_R_CANCELLED;
}

static void echo_on_close(void *ctx, dsess *s, const char *reason)
{
    echo_svc *e = ctx;
    struct echo_sess *es = dsess_user(s);
    (void)reason;
    if (!es) return;
    busy_del(e, es);
    while (es->head) {
        struct echo_req *r = es->head;
        es->head = r->next;
        free(r);
    }
    free(es);
    dsess_set_user(s, NULL);
}

/* Emits what fits for one session. Returns 1 if it made progress. */
static int serve(echo_svc *e, struct echo_sess *es, uint64_t now_us, uint64_t *next_deadline)
{
    int progress = 0;
    while (es->head) {
        struct echo_req *r = es->head;
        if (!r->finish_reason && r->deadline_us && now_us >= r->deadline_us)
            r->finish_reason = RINGLM_WIRE_R_TIMEOUT;
        if (!r->finish_reason) {
            while (r->emitted < r->max_new) {
                int32_t tok = r->prompt[r->next_prompt];
                if (dsess_push_token(es->s, r->req_id, tok, r->emitted) < 0) return progress;
                r->emitted++;
                if (++r->next_prompt == r->n_prompt) r->next_prompt = 0;
                progress = 1;
            }
            r->finish_reason = RINGLM_WIRE_R_LENGTH;
        }
        if (dsess_push_finish(es->s, r->req_id, r->finish_reason, r->finish_cause, r->emitted, 0) <
            0)
            return progress;
        progress = 1;
        e->finished++;
        es->head = r->next;
        if (!es->head) es->tail = &es->head;
        free(r);
    }
    (void)next_deadline;
    return progress;
}

static int echo_iterate(void *ctx, uint64_t now_us)
{
    echo_svc *e = ctx;
    int progress = 0;
    uint64_t next_deadline = 0;
    struct echo_sess *es = e->busy, *next;
    for (; es; es = next) {
        next = es->next;
        progress |= serve(e, es, now_us, &next_deadline);
        if (!es->head) busy_del(e, es);
    }
    /* Requests blocked on a full event ring are not "work": the loop sleeps and the
	 * client's doorbell (want_space) wakes it.  Deadlines of blocked requests still
	 * need the clock. */
    for (es = e->busy; es; es = es->next)
        for (struct echo_req *r = es->head; r; r = r->next)
            if (r->deadline_us && !r->finish_reason)
                dloop_wake_after_us(e->loop, r->deadline_us > now_us ? r->deadline_us - now_us : 0);
    return progress;
}

const dsvc_ops echo_ops = {
    .on_connect = echo_on_connect,
    .on_request = echo_on_request,
    .on_cancel = echo_on_cancel,
    .on_close = echo_on_close,
    .iterate = echo_iterate,
};

int echo_create(echo_svc **out)
{
    *out = calloc(1, sizeof(**out));
    return *out ? 0 : -ENOMEM;
}

void echo_attach(echo_svc *e, dloop *l)
{
    e->loop = l;
    /* A fixed identity so that tests can check it travels with every FINISH. */
    dloop_set_policy_hash(l, 0xec40ec40ec40ec40ull);
}

void echo_destroy(echo_svc *e)
{
    free(e);
}

unsigned long long echo_finished(const echo_svc *e)
{
    return e->finished;
}
