/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_prep.c — the preparation threads (see gw_internal.h): a request's body is
 * parsed, rendered through the chat template and tokenized here, never on the HTTP thread.
 *
 * Tokenizing is the one step of a request whose time grows with what a client sends (a
 * 1 MiB prompt), and libmicrohttpd's single thread serves every connection: run inline, one
 * big prompt stalled /health and every stream of every other client until it was done. So
 * the HTTP thread queues the request and parks its connection; --tokenize-threads threads
 * take requests in order and either submit them to ringlmd (the connection then waits for
 * its first event as any other) or leave an answer that the HTTP thread queues when the
 * connection is resumed.
 *
 * Bounds: at most --tokenize-queue requests wait for a thread; the next one gets 503 with
 * Retry-After at once. A client that hangs up while its request waits is dropped without
 * being prepared (the watch thread sees the hang-up of a parked connection); one that hangs
 * up while its request is being prepared is not submitted. The threads run at a lower
 * priority (nice +PREP_NICE) than the HTTP and events threads, so that on a busy host the
 * connections and the streams get the CPU first.
 *
 * While r->in_prep, a preparation thread may hold r outside mu: the completed callback then
 * only marks r gone, and the thread frees it (prep_end).
 */
#include "gateway/gw_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PREP_NICE   5
/* At stop, how long a thread in the middle of a tokenization is waited for (a tokenizer
 * cannot be interrupted). */
#define PREP_STOP_S 2

/* mu held: the preparation of r is over (done or dropped). */
static void prep_end(gw_server *s, gw_req *r)
{
    r->in_prep = false;
    if (r->prep_resp) {
        r->ready = r->prep_resp;
        r->status = r->prep_status;
        r->state = RQ_READY;
        r->prep_resp = NULL;
    }
    if (r->http_done) {
        /* Its client left while this thread held r, so on_completed only marked it gone.
         * Submitted: nobody has cancelled it yet — cancel it now, and the daemon's end
         * frees it. Waiting for ring space: the retry queue drops it (r->gone). */
        if (r->submitted && !gw_all_done(r))
            gw_cancel_locked(s, r);
        else if (!r->queued)
            gw_req_free(s, r);
        return;
    }
    if (r->state == RQ_READY || r->gone) gw_wake(r);
}

static void prepare(gw_server *s, gw_req *r)
{
    switch (r->ep) {
    case EP_COMPLETIONS:
    case EP_CHAT:
    case EP_RESPONSES: gw_start_generation(s, r, NULL); break;
    case EP_TOKENIZE: gw_ep_tokenize(s, r, NULL); break;
    case EP_DETOKENIZE: gw_ep_detokenize(s, r, NULL); break;
    default: gw_answer_errf(r, NULL, 404, "not_found", "no such endpoint"); break;
    }
}

static void *prep_main(void *arg)
{
    gw_server *s = arg;
    /* nice applies to the calling thread alone on Linux; raising it needs no privilege */
    pid_t tid = (pid_t)syscall(SYS_gettid);
    errno = 0;
    int nice_now = getpriority(PRIO_PROCESS, (id_t)tid);
    if (!errno) setpriority(PRIO_PROCESS, (id_t)tid, nice_now + PREP_NICE);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stopping && !s->prep_head) pthread_cond_wait(&s->prep_cv, &s->mu);
        if (s->stopping) break;
        gw_req *r = s->prep_head;
        s->prep_head = r->prep_next;
        if (!s->prep_head) s->prep_tail = NULL;
        s->n_prep_queued--;
        if (r->gone) {
            s->prep_dropped++;
            prep_end(s, r);
            continue;
        }
        s->n_prep_running++;
        pthread_mutex_unlock(&s->mu);
        prepare(s, r);
        pthread_mutex_lock(&s->mu);
        s->n_prep_running--;
        prep_end(s, r);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

enum MHD_Result gw_prep_queue(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
    pthread_mutex_lock(&s->mu);
    if (s->n_prep_queued >= s->cfg.prep_queue) {
        s->prep_refused++;
        pthread_mutex_unlock(&s->mu);
        char m[160];
        snprintf(m, sizeof m,
                 "the gateway is busy: %u requests wait for a tokenizer thread; try again",
                 s->cfg.prep_queue);
        return gw_answer_errf(r, c, 503, "busy", m);
    }
    r->t_body_us = gw_now_us();
    r->state = RQ_PREP;
    r->in_prep = true;
    r->prep_next = NULL;
    if (s->prep_tail)
        s->prep_tail->prep_next = r;
    else
        s->prep_head = r;
    s->prep_tail = r;
    s->n_prep_queued++;
    gw_watch(s, r);
    gw_suspend(r);
    pthread_cond_signal(&s->prep_cv);
    pthread_mutex_unlock(&s->mu);
    return MHD_YES;
}

enum MHD_Result gw_prep_resumed(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
    if (r->gone || s->stopping) return MHD_NO;
    if (r->state == RQ_READY) {
        struct MHD_Response *resp = r->ready;
        r->ready = NULL;
        r->state = RQ_ANSWERED;
        return gw_queue(r, c, (unsigned)r->status, resp);
    }
    gw_suspend(r); /* woken before its preparation ended: wait on */
    return MHD_YES;
}

int gw_prep_start(gw_server *s)
{
    unsigned n = s->cfg.prep_threads ? s->cfg.prep_threads : 1;
    s->prep_threads = calloc(n, sizeof *s->prep_threads);
    if (!s->prep_threads) return -ENOMEM;
    for (unsigned i = 0; i < n; i++) {
        if (pthread_create(&s->prep_threads[i], NULL, prep_main, s)) return -EAGAIN;
        s->n_prep_threads++;
    }
    return 0;
}

bool gw_prep_stop(gw_server *s)
{
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->prep_cv);
    pthread_mutex_unlock(&s->mu);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += PREP_STOP_S;
    bool all = true;
    for (unsigned i = 0; i < s->n_prep_threads; i++)
        all &= pthread_timedjoin_np(s->prep_threads[i], NULL, &dl) == 0;
    if (!all) return false;
    s->n_prep_threads = 0;
    free(s->prep_threads);
    s->prep_threads = NULL;
    return true;
}
