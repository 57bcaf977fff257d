/* SPDX-License-Identifier: MIT */
/*
 * daemon/requests.c — the runner's requests: the id registry, each session's list, the
 * outbox of requests with output to push, output backpressure, and request ends (from the
 * scheduler's events or daemon-side cancels) down to the request log line and the free.
 *
 * A request lives from req_new (admission) until its FINISH went into its session's event
 * ring (or its session is gone) and it is ended: then req_log_and_free writes its request
 * log line, observes its latencies and frees it. Every end goes through req_end, so the
 * first reason wins and the FINISH is pushed by the same flush as the tokens.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>

#include "daemon/service_internal.h"
#include "sched/prefix.h"

/* Block keys a request log line carries at most (DECLOG_LINE_MAX: 4 KiB a line). */
#define REQLOG_HASH_IDS 160

/* ---- registry ------------------------------------------------------------------------ */

void req_set_state(svc *s, svc_req *r, req_state to)
{
    req_state_move(&s->rq.audit, r->id, &r->state, to);
}

svc_req *req_find(svc *s, uint64_t id)
{
    for (svc_req *r = s->rq.hash[id % SVC_HASH_BUCKETS]; r; r = r->h_next)
        if (r->id == id) return r;
    return NULL;
}

static void req_hash_del(svc *s, svc_req *r)
{
    svc_req **pp = &s->rq.hash[r->id % SVC_HASH_BUCKETS];
    while (*pp && *pp != r) pp = &(*pp)->h_next;
    if (*pp) *pp = r->h_next;
}

static void sess_unlink(svc_req *r)
{
    svc_sess *ss = r->sess;
    if (!ss) return;
    if (r->s_prev)
        r->s_prev->s_next = r->s_next;
    else
        ss->reqs = r->s_next;
    if (r->s_next) r->s_next->s_prev = r->s_prev;
    r->s_prev = r->s_next = NULL;
    ss->n_reqs--;
    r->sess = NULL;
}

svc_req *req_new(svc *s, svc_sess *ss, uint64_t client_id)
{
    svc_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->id = ++s->rq.next_id;
    r->client_id = client_id;
    r->series = -1;
    r->lp_top = r->plp_top = -1;
    r->sess = ss;
    r->s_next = ss->reqs;
    if (ss->reqs) ss->reqs->s_prev = r;
    ss->reqs = r;
    ss->n_reqs++;
    r->h_next = s->rq.hash[r->id % SVC_HASH_BUCKETS];
    s->rq.hash[r->id % SVC_HASH_BUCKETS] = r;
    s->rq.live++;
    svc_stats_changed(s);
    return r;
}

svc_req *req_find_client(svc_sess *ss, uint64_t client_id, const svc_req *except)
{
    for (svc_req *o = ss->reqs; o; o = o->s_next)
        if (o != except && o->client_id == client_id) return o;
    return NULL;
}

void req_free_all(svc *s)
{
    for (size_t b = 0; b < SVC_HASH_BUCKETS; b++) {
        svc_req *r = s->rq.hash[b];
        while (r) {
            svc_req *n = r->h_next;
            cn_release(s, r);
            exec_ring_copy_put(r->ring_copy);
            free(r->tokens);
            lpq_free(&r->lpq);
            eng_lp_free(r->lp);
            free(r->stop_ids);
            free(r->detail);
            free(r);
            r = n;
        }
        s->rq.hash[b] = NULL;
    }
    s->rq.out_sessions = NULL;
}

/* ---- the outbox ---------------------------------------------------------------------- */

static void out_list_add(svc *s, svc_sess *ss)
{
    if (ss->in_out_list) return;
    ss->out_prev = NULL;
    ss->out_next = s->rq.out_sessions;
    if (s->rq.out_sessions) s->rq.out_sessions->out_prev = ss;
    s->rq.out_sessions = ss;
    ss->in_out_list = true;
}

static void out_list_del(svc *s, svc_sess *ss)
{
    if (!ss->in_out_list) return;
    if (ss->out_prev)
        ss->out_prev->out_next = ss->out_next;
    else
        s->rq.out_sessions = ss->out_next;
    if (ss->out_next) ss->out_next->out_prev = ss->out_prev;
    ss->out_prev = ss->out_next = NULL;
    ss->in_out_list = false;
}

/* The scheduler stops scheduling a sequence whose output cannot go out (defer
 * output_backpressure) and takes it up again when it can (sess_flush). An ended request is
 * the scheduler's no more: it is not reported. */
static void out_block(svc *s, svc_req *r)
{
    DTRACE_PROBE2(ringlmd, output_blocked, r->id, r->n_gen - r->n_pushed);
    if (r->state != REQ_RUNNING_OUT) return;
    req_set_state(s, r, REQ_RUNNING_BLOCKED);
    sched_set_output_blocked(s->sched, r->id, true, s->now_us);
}

/* Appends r (already moved to an outbox state) to its session's outbox. */
static void out_link(svc *s, svc_sess *ss, svc_req *r)
{
    r->o_next = NULL;
    if (ss->out_tail)
        ss->out_tail->o_next = r;
    else
        ss->out_head = r;
    ss->out_tail = r;
    out_list_add(s, ss);
    if (ss->blocked) out_block(s, r);
}

/* Every class and tenant a policy can name fits the wire's name field, and back. */
_Static_assert(SCHED_NAME_MAX == RINGLM_WIRE_NAME_LEN, "policy names and wire names agree");

static const char *finish_name(unsigned reason)
{
    return reason && reason <= SCHED_END_ERROR ? sched_end_name(reason) : "error";
}

/* ---- request end: request log, metrics, free ---------------------------------------- */

static void req_log_and_free(svc *s, svc_req *r)
{
    if (declog_has_requests(s->logs)) {
        declog_request lr = {
            .req = r->id,
            .arrival_us = (int64_t)r->arrival_us,
            .tenant = r->tenant_name,
            .class_name = r->class_name,
            .prompt_tokens = r->n_prompt,
            .max_tokens = r->max_new,
            .output_tokens = r->n_gen,
            .deadline_us = r->deadline_us ? (int64_t)r->deadline_us : DECLOG_NULL,
            .cancel_us = r->cancel_us ? (int64_t)r->cancel_us : DECLOG_NULL,
            .first_token_us = r->first_token_us ? (int64_t)r->first_token_us : DECLOG_NULL,
            .finish_us = (int64_t)(r->finish_us ? r->finish_us : s->now_us),
            .finish_reason = finish_name(r->fin_reason),
            .reject_reason = r->fin_reason == RINGLM_WIRE_R_REJECTED
                                 ? ringlm_wire_reason_name(r->fin_cause)
                                 : NULL,
            .cached_tokens = r->cached_tokens,
            .sched_cost = r->has_sched_cost ? &r->sched_cost : NULL,
            /* n > 1: the first sample, whose prompt it shares (the samples' ids are
             * consecutive from it) */
            .sample_of = r->sample_idx ? r->id - r->sample_idx : 0,
            .logprobs = r->lp_top >= 0,
            .top_logprobs = r->lp_top >= 0 ? (uint32_t)r->lp_top : 0,
            .processors = r->lp != NULL,
        };
        /* the block keys of the prompt and then of the answer (the blocks the prefix cache
         * keeps of both, in the request's cache domain): a replay (ringlm-sim --trace)
         * shares prefixes as this run did, a next turn's prompt hitting this answer too.  53
         * bits (a JSON integer every reader keeps exact); the first REQLOG_HASH_IDS blocks in
         * all, so the line fits the log's line size; the answer's only after all of the
         * prompt's (they continue its chain).  The answer's blocks only as far as their
         * KV was computed — what the cache can have kept: a token's KV is computed when it is
         * fed back to sample the next, so the last token delivered has its KV only when a
         * stop token (sampled, not delivered) came after it.  Always XXH3, whatever
         * --prefix-key keyed the cache with: a key here names a block's content (its whole
         * prefix), and under the constant key the cache still shared exactly the blocks
         * whose tokens were equal — the sharing XXH3 keys describe.  The constant keys
         * themselves would tell a replay (which makes tokens from keys) that every block
         * of every prompt is the same */
        uint64_t ids[REQLOG_HASH_IDS];
        uint32_t bs = (uint32_t)eng_kv_block_size(s->engine), n_seq = r->n_prompt + r->n_gen;
        if (r->n_gen && r->fin_reason != RINGLM_WIRE_R_STOP) n_seq--;
        if (r->tokens && bs && n_seq >= bs) {
            sched_prefix_key keys[REQLOG_HASH_IDS];
            uint32_t n =
                sched_prefix_keys(r->cache_salt, r->tokens, n_seq, bs, keys, REQLOG_HASH_IDS);
            uint32_t np = r->n_prompt / bs < n ? r->n_prompt / bs : n;
            for (uint32_t i = 0; i < n; i++) ids[i] = keys[i].lo & ((1ull << 53) - 1);
            lr.hash_ids = np ? ids : NULL;
            lr.n_hash_ids = np;
            lr.answer_hash_ids = n > np ? ids + np : NULL;
            lr.n_answer_hash_ids = n - np;
            lr.hash_block_tokens = bs;
        }
        declog_request_line(s->logs, &lr);
    }
    uint64_t fin = r->finish_us ? r->finish_us : s->now_us;
    if (r->series >= 0) {
        if (r->first_token_us) {
            metrics_observe(s->mx, r->series, METRICS_H_TTFT, r->first_token_us - r->arrival_us);
            if (r->n_gen > 1 && r->last_token_us > r->first_token_us)
                metrics_observe(s->mx, r->series, METRICS_H_TPOT,
                                (r->last_token_us - r->first_token_us) / (r->n_gen - 1));
        }
        if (r->fin_reason != RINGLM_WIRE_R_REJECTED)
            metrics_observe(s->mx, r->series, METRICS_H_E2E, fin - r->arrival_us);
        metrics_add_tokens(s->mx, r->series,
                           r->fin_reason == RINGLM_WIRE_R_REJECTED ? 0 : r->n_prompt, r->n_gen);
        metrics_count_finish(s->mx, r->series, (sched_end_code)r->fin_reason);
    }
    if (r->fin_reason != RINGLM_WIRE_R_REJECTED) {
        metrics_request_end e = {.finish = (sched_end_code)r->fin_reason,
                                 .prompt_tokens = r->n_prompt,
                                 .generation_tokens = r->n_gen,
                                 .max_tokens = r->max_new,
                                 .arrival_us = r->arrival_us,
                                 .scheduled_us = r->scheduled_us,
                                 .first_token_us = r->first_token_us,
                                 .last_token_us = r->last_token_us,
                                 .finish_us = fin};
        metrics_observe_request_end(s->mx, &e);
    }
    if (r->fin_reason != RINGLM_WIRE_R_REJECTED) s->rq.n_finished++;
    sess_unlink(r);
    req_hash_del(s, r);
    s->rq.live--;
    cn_release(s, r);
    exec_ring_copy_put(r->ring_copy);
    free(r->tokens);
    lpq_free(&r->lpq);
    eng_lp_free(r->lp);
    free(r->stop_ids);
    free(r->detail);
    free(r);
    svc_stats_changed(s);
}

void req_end(svc *s, svc_req *r, unsigned reason, unsigned cause)
{
    if (req_state_ended(r->state)) return;
    r->fin_reason = r->forced_reason ? r->forced_reason : reason;
    r->fin_cause = r->forced_reason ? r->forced_cause : cause;
    r->finish_us = s->now_us;
    if (r->n_samples > 1 && !r->forked) {
        /* its other samples wait on its prompt: they end as it ends (ringlm.h "n samples") */
        r->forked = true;
        for (uint32_t i = 1; i < r->n_samples; i++) {
            svc_req *k = req_find(s, r->id + i);
            if (!k || req_state_ended(k->state)) continue;
            if (r->fin_reason == RINGLM_WIRE_R_CANCELLED && !k->cancel_us) k->cancel_us = s->now_us;
            /* the same words (a constraint that did not compile rejects all n) */
            if (r->detail && k->want_detail && !k->detail) k->detail = strdup(r->detail);
            req_end(s, k, r->fin_reason, r->fin_cause);
        }
    }
    svc_sess *ss = r->sess;
    if (!ss || ss->closing) { /* its session is being closed: freed there */
        req_set_state(s, r, REQ_ENDED);
        return;
    }
    bool linked = req_state_in_outbox(r->state);
    req_set_state(s, r, REQ_ENDED_OUT); /* its FINISH goes out after its tokens */
    if (!linked) out_link(s, ss, r);
}

/* Pushes r's unpublished tokens, then its FINISH once ended: 0 when everything of r is
 * out, -EAGAIN when the event ring is full (r's tokens wait here, in tokens[], until the
 * client reads), -EPIPE when the session is ending (on_close frees everything of it). */
static int req_push(svc *s, svc_req *r)
{
    dsess *ds = r->sess->ds;
    int rc = 0;
    /* a prompt's log-probabilities come before its first token */
    const svc_lp_item *it;
    while ((it = lpq_peek(&r->lpq)) && it->prompt) {
        rc = dsess_push_logprobs(ds, r->client_id, true, it->token, it->index, &it->lp);
        if (rc < 0) return rc;
        lpq_pop(&r->lpq);
    }
    while (r->n_pushed < r->n_gen) {
        int32_t tok = r->tokens[r->n_prompt + r->n_pushed];
        it = r->lp_top >= 0 ? lpq_peek(&r->lpq) : NULL;
        if (it && !it->prompt && it->index == r->n_pushed)
            rc = dsess_push_logprobs(ds, r->client_id, false, tok, r->n_pushed, &it->lp);
        else
            rc = dsess_push_token(ds, r->client_id, tok, r->n_pushed);
        if (rc < 0) return rc;
        if (it && !it->prompt && it->index == r->n_pushed) lpq_pop(&r->lpq);
        r->n_pushed++;
    }
    if (r->state == REQ_ENDED_OUT) {
        rc = dsess_push_finish_detail(ds, r->client_id, r->fin_reason, r->fin_cause, r->n_gen,
                                      r->cached_tokens, r->want_detail ? r->detail : NULL);
        if (rc < 0) return rc;
        req_set_state(s, r, REQ_FINISHED);
    }
    return 0;
}

/* The session's event ring is full: everything in its outbox waits (reported to the
 * scheduler once, here, not per iteration). A session that cannot take its own
 * requests' events and holds the most requests a session may has nothing more to gain:
 * it ends with the reason. */
static void sess_block(svc *s, svc_sess *ss)
{
    if (ss->blocked) return;
    ss->blocked = true;
    ss->blocked_since_us = s->now_us;
    for (svc_req *r = ss->out_head; r; r = r->o_next) out_block(s, r);
    if (ss->n_reqs >= SVC_MAX_REQS_PER_SESSION) {
        char why[160];
        snprintf(why, sizeof why,
                 "output backlog: %d requests whose events the client does not "
                 "read (limit %d per session)",
                 ss->n_reqs, SVC_MAX_REQS_PER_SESSION);
        svc_log("session %llu (uid %u): %s", (unsigned long long)dsess_id(ss->ds), ss->uid, why);
        dsess_end(ss->ds, why);
    }
}

/* Pushes the session's outbox in order until its ring is full. A blocked session is looked
 * at once (its ring's free space) and left alone until its client reads. */
static void sess_flush(svc *s, svc_sess *ss)
{
    if (ss->blocked && dsess_event_space(ss->ds) < 2) return;
    while (ss->out_head) {
        svc_req *r = ss->out_head;
        int rc = req_push(s, r);
        if (rc == -EPIPE) return;
        if (rc == -EAGAIN) {
            sess_block(s, ss);
            return;
        }
        ss->out_head = r->o_next;
        if (!ss->out_head) ss->out_tail = NULL;
        r->o_next = NULL;
        if (r->state == REQ_FINISHED) {
            req_log_and_free(s, r);
            continue;
        }
        if (r->state == REQ_RUNNING_BLOCKED)
            sched_set_output_blocked(s->sched, r->id, false, s->now_us);
        req_set_state(s, r, REQ_RUNNING);
    }
    ss->blocked = ss->bp_cancelled = false;
    out_list_del(s, ss);
}

void req_output_ready(svc *s, svc_req *r)
{
    svc_sess *ss = r->sess;
    if (!ss || ss->closing) return;        /* its session is being closed: freed there */
    if (req_state_ended(r->state)) return; /* req_end queued its FINISH */
    /* The bounded buffer: past its size the tokens would have nowhere to go. */
    if (r->n_gen - r->n_pushed > s->cfg.backpressure_buffer_tokens) {
        req_cancel(s, r, SCHED_CANCEL_BACKPRESSURE, RINGLM_WIRE_R_CANCELLED,
                   RINGLM_WIRE_R_OUTPUT_BACKPRESSURE);
        return; /* req_end queued it */
    }
    if (req_state_in_outbox(r->state)) return;
    req_set_state(s, r, REQ_RUNNING_OUT);
    out_link(s, ss, r);
    /* its client has not read for longer than the timeout already */
    if (ss->blocked && ss->bp_cancelled)
        req_cancel(s, r, SCHED_CANCEL_BACKPRESSURE, RINGLM_WIRE_R_CANCELLED,
                   RINGLM_WIRE_R_OUTPUT_BACKPRESSURE);
}

void req_flush_pending(svc *s)
{
    svc_sess *next;
    for (svc_sess *ss = s->rq.out_sessions; ss; ss = next) {
        next = ss->out_next;
        sess_flush(s, ss);
    }
}

void req_cancel(svc *s, svc_req *r, sched_cancel_reason why, unsigned reason, unsigned cause)
{
    if (req_state_ended(r->state)) return;
    r->forced_reason = reason;
    r->forced_cause = cause;
    if (!r->cancel_us) r->cancel_us = s->now_us;
    sched_cancel(s->sched, r->id, s->now_us, why); /* -ENOENT: not live there; ends here too */
    req_end(s, r, reason, cause);
}

void req_cancel_all(svc *s, sched_cancel_reason why, unsigned reason, unsigned cause)
{
    for (size_t b = 0; b < SVC_HASH_BUCKETS; b++)
        for (svc_req *r = s->rq.hash[b]; r; r = r->h_next)
            if (!req_state_ended(r->state)) req_cancel(s, r, why, reason, cause);
}

/* A session blocked longer than the timeout has its requests with output cancelled
 * (once; their FINISH waits in the outbox like their tokens did, and requests that produce
 * output later are cancelled as they do). O(blocked sessions) per iteration. */
uint64_t req_check_backpressure(svc *s, uint64_t now_us)
{
    uint64_t bp_us = s->cfg.backpressure_timeout_ms * 1000;
    uint64_t next_wake = 0;
    for (svc_sess *ss = s->rq.out_sessions; ss; ss = ss->out_next) {
        if (!ss->blocked || ss->bp_cancelled) continue;
        uint64_t dl = ss->blocked_since_us + bp_us;
        if (now_us >= dl) {
            ss->bp_cancelled = true;
            for (svc_req *r = ss->out_head; r; r = r->o_next)
                if (!req_state_ended(r->state))
                    req_cancel(s, r, SCHED_CANCEL_BACKPRESSURE, RINGLM_WIRE_R_CANCELLED,
                               RINGLM_WIRE_R_OUTPUT_BACKPRESSURE);
        } else if (!next_wake || dl - now_us < next_wake) {
            next_wake = dl - now_us;
        }
    }
    return next_wake;
}

/* Records the loop may take from a session this iteration; -1: none until something
 * changes (the loop sleeps over its submit ring). A blocked session is still read up to the
 * session bound: what its client submitted before it stopped reading is answered like what
 * the loop happened to read first (deferred, then cancelled output_backpressure), not left
 * in its ring to run only once the client reads again; at the bound it costs nothing per
 * iteration. */
int req_drain_budget(svc *s, dsess *ds)
{
    svc_sess *ss = dsess_user(ds);
    if (!ss) return SVC_RECORDS_PER_SESSION_ITER;
    int room = SVC_RECORDS_PER_SESSION_ITER;
    if (ss->blocked) {
        if (ss->n_reqs >= SVC_MAX_REQS_PER_SESSION) return -1;
        room = SVC_MAX_REQS_PER_SESSION - ss->n_reqs;
        if (room > SVC_RECORDS_PER_SESSION_ITER) room = SVC_RECORDS_PER_SESSION_ITER;
    }
    /* A trusted session (a gateway) carries many tenants' requests: its own bound only. */
    if (ss->trusted || ss->tenant < 0 || ss->tenant >= s->n_tenants) return room;
    uint32_t used = s->tenant_records[ss->tenant], cap = s->cfg.max_records_per_tenant_iter;
    uint32_t left = used < cap ? cap - used : 0;
    return (int)(left < (uint32_t)room ? left : (uint32_t)room);
}

/* ---- sessions ------------------------------------------------------------------------ */

int req_session_open(svc *s, dsess *ds)
{
    uint32_t uid = (uint32_t)dsess_uid(ds);
    int tenant = s->per_uid ? ut_acquire(s, uid) : sched_policy_tenant_for_uid(s->policy, uid);
    if (tenant < 0) {
        svc_log("refusing uid %u: not mapped to a tenant and the policy has no default tenant",
                uid);
        return -EPERM;
    }
    svc_sess *ss = calloc(1, sizeof *ss);
    if (!ss) {
        ut_release(s, tenant);
        return -ENOMEM;
    }
    ss->ds = ds;
    ss->uid = uid;
    ss->tenant = tenant;
    ss->trusted = sched_policy_uid_trusted(s->policy, uid);
    dsess_set_user(ds, ss);
    const char *classes[SCHED_MAX_CLASSES];
    int n_classes = sched_policy_n_classes(s->policy);
    if (n_classes > SCHED_MAX_CLASSES) n_classes = SCHED_MAX_CLASSES;
    for (int i = 0; i < n_classes; i++) classes[i] = sched_policy_class(s->policy, i)->name;
    dsess_set_facts(ds, ss->trusted, classes, n_classes, (uint32_t)s->mcfg->vocab_size,
                    s->cfg.max_n, s->served_model_name);
    dsess_set_constraint_kinds(ds, cn_kinds(s));
    svc_stats_changed(s);
    return 0;
}

void req_session_cancel(svc *s, dsess *ds, uint64_t client_id)
{
    svc_sess *ss = dsess_user(ds);
    if (!ss) return;
    for (svc_req *r = ss->reqs; r; r = r->s_next) {
        if (r->client_id == client_id && !req_state_ended(r->state)) {
            r->cancel_us = s->now_us;
            req_cancel(s, r, SCHED_CANCEL_CLIENT, RINGLM_WIRE_R_CANCELLED, 0);
            return;
        }
    }
}

void req_session_close(svc *s, dsess *ds)
{
    svc_sess *ss = dsess_user(ds);
    if (!ss) return;
    /* Nothing of it can be delivered any more: the cancels below queue no output, and its
     * outbox goes (its requests are all freed below). */
    ss->closing = true;
    out_list_del(s, ss);
    ss->out_head = ss->out_tail = NULL;
    /* Cancel in the scheduler now: the next sched_step (this iteration) releases the
     * blocks in every tier and no further compute is spent on these sequences. */
    while (ss->reqs) {
        svc_req *r = ss->reqs;
        if (!req_state_ended(r->state)) {
            r->cancel_us = s->now_us;
            req_cancel(s, r, SCHED_CANCEL_DISCONNECT, RINGLM_WIRE_R_CANCELLED,
                       RINGLM_WIRE_R_CLIENT_GONE);
        }
        /* its FINISH, if it waited in the outbox, will never go out */
        if (r->state == REQ_ENDED_OUT) req_set_state(s, r, REQ_ENDED);
        sess_unlink(r);
        if (req_state_ended(r->state)) req_log_and_free(s, r);
    }
    dsess_set_user(ds, NULL);
    ut_release(s, ss->tenant);
    free(ss);
    svc_stats_changed(s);
}

/* ---- scheduler events → logs, metrics, probes ------------------------------------------ */

/* The cost model the scheduler started r with — the costs its cached prefix was reloaded
 * or recomputed by, and the blocks evicted for it demoted or dropped by (this step's: the
 * model changes only at a commit or a completed copy) — for the request log, so a replay
 * decides as this run did rather than with its own model of the machine. */
static void record_sched_cost(svc *s, svc_req *r, uint64_t t_us)
{
    if (!declog_has_requests(s->logs)) return;
    sched_cost_state c;
    sched_get_cost_state(s->sched, &c);
    const sched_tier_cost *h = &c.tier[SCHED_POOL_HOST], *d = &c.tier[SCHED_POOL_DISK];
    r->sched_cost = (fmt_sched_cost){
        .at_us = (int64_t)t_us,
        .correction = c.correction,
        .base_us = c.step.base_us,
        .prefill_token_us = c.step.prefill_token_us,
        .decode_seq_us = c.step.decode_seq_us,
        .context_token_us = c.step.context_token_us,
        .prefill_pair_us = c.step.prefill_pair_us,
        .host = {h->out_bytes_per_s, h->in_bytes_per_s, h->latency_us,
                 c.out_measured[SCHED_POOL_HOST], c.in_measured[SCHED_POOL_HOST]},
        .disk = {d->out_bytes_per_s, d->in_bytes_per_s, d->latency_us,
                 c.out_measured[SCHED_POOL_DISK], c.in_measured[SCHED_POOL_DISK]},
    };
    r->has_sched_cost = true;
}

/* The events explain decisions; they end nothing.  Requests end from sched_cancel's return
 * (req_cancel), the plan's `ended` (req_plan_ended) and the commit results
 * (req_commit_ended), so the daemon serves the same with or without an event sink. */
void req_init(svc *s)
{
    for (int c = 0; c <= SCHED_MAX_CLASSES; c++) s->rq.class_mlabel[c] = -1;
}

int req_series(svc *s, int tenant, int class_idx)
{
    const sched_class_cfg *cc = class_idx >= 0 ? sched_policy_class(s->policy, class_idx) : NULL;
    int c = cc && class_idx < SCHED_MAX_CLASSES ? class_idx : SCHED_MAX_CLASSES;
    if (s->rq.class_mlabel[c] < 0)
        s->rq.class_mlabel[c] = (int16_t)metrics_class_label(s->mx, cc ? cc->name : "other");
    return metrics_series(s->mx, ut_metrics_label(s, tenant), s->rq.class_mlabel[c]);
}

void req_on_sched_event(void *ctx, const sched_event *ev)
{
    svc *s = ctx;
    const char *reason = sched_event_reason_name(ev);
    DTRACE_PROBE3(ringlmd, decision, (int)ev->kind, ev->req, reason);
    svc_req *r = req_find(s, ev->req);
    if (s->logs && declog_has_decisions(s->logs)) {
        if (s->per_uid && ev->tenant) {
            /* the scheduler knows the slot; the log names the uid that holds it */
            sched_event named = *ev;
            named.tenant = r ? r->tenant_name : ut_label(s, ev->tenant_idx);
            declog_decision(s->logs, &named);
        } else {
            declog_decision(s->logs, ev);
        }
    }
    int series = r ? r->series : req_series(s, ev->tenant_idx, ev->class_idx);
    switch (ev->kind) {
    case SCHED_EV_REJECT: metrics_count_reject(s->mx, series, ev->reject); break;
    case SCHED_EV_DEFER: metrics_count_defer(s->mx, series, ev->defer); break;
    case SCHED_EV_SCHEDULE:
        if (ev->outcome == SCHED_OUTCOME_START)
            metrics_observe(s->mx, series, METRICS_H_QUEUE_WAIT, ev->wait_us);
        if (r && ev->outcome == SCHED_OUTCOME_START) r->sample_starting = false;
        /* its first start: QUEUED → RUNNING (a resume finds it started) */
        if (r && r->state == REQ_QUEUED) {
            r->scheduled_us = ev->t_us;
            record_sched_cost(s, r, ev->t_us);
            req_set_state(s, r, REQ_RUNNING);
        }
        break;
    case SCHED_EV_CACHE_HIT:
        /* the first admission's hit, for the request log (a resumed sequence's own blocks
         * found again after a recompute are not the request's cached prompt) */
        if (r && (r->state <= REQ_QUEUED || r->sample_starting))
            r->cached_tokens = ev->cached_tokens;
        break;
    case SCHED_EV_PREEMPT:
        metrics_count_preempt(
            s->mx, series,
            ev->mode == SCHED_PREEMPT_SWAP ? METRICS_MODE_SWAP : METRICS_MODE_RECOMPUTE, ev->defer);
        break;
    case SCHED_EV_CANCEL: metrics_count_cancel(s->mx, series); break;
    case SCHED_EV_TIMEOUT: metrics_count_timeout(s->mx, series); break;
    default: break;
    }
    svc_stats_changed(s);
}

void req_plan_ended(svc *s, const sched_plan *p)
{
    for (uint32_t i = 0; i < p->n_ended; i++) {
        const sched_ended *e = &p->ended[i];
        svc_req *r = req_find(s, e->req);
        if (!r) continue;
        if (e->kind == SCHED_EV_TIMEOUT) {
            req_end(s, r, RINGLM_WIRE_R_TIMEOUT, sched_timeout_cause(e->timeout));
        } else {
            if (!r->cancel_us) r->cancel_us = s->now_us;
            req_end(s, r, RINGLM_WIRE_R_CANCELLED, sched_cancel_cause(e->cancel));
        }
    }
}

void req_commit_ended(svc *s, const sched_result *res, int n)
{
    for (int i = 0; i < n; i++) {
        if (res[i].finished == SCHED_FINISH_NONE) continue;
        svc_req *r = req_find(s, res[i].req);
        if (r)
            req_end(s, r,
                    res[i].finished == SCHED_FINISH_STOP ? RINGLM_WIRE_R_STOP
                                                         : RINGLM_WIRE_R_LENGTH,
                    0);
    }
}
