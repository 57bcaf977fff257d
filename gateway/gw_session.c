/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_session.c — the gateway's shared-memory session with ringlmd (see gw_internal.h):
 * the registry of requests (by the session's request id, by HTTP serial), submit and cancel
 * with a retry queue for a full submit ring, the events thread that turns TOKEN/FINISH
 * events into text and wakes connections, reconnects when the daemon goes away; and the
 * watch thread that cancels the request of a client that hangs up.
 */
#include "gateway/gw_internal.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define EVENT_BATCH   256
#define EVENT_WAIT_MS 100 /* the retry period of a queue waiting for ring space */
#define RECONNECT_MS  200

/* ---- maps (mu held) -------------------------------------------------------------------- */
static void id_put(gw_sess *ss, gw_req *r)
{
    gw_req **b = &ss->by_id[r->req_id % GW_HBUCKETS];
    r->id_next = *b;
    *b = r;
}

static gw_req *id_find(gw_sess *ss, uint64_t id)
{
    for (gw_req *r = ss->by_id[id % GW_HBUCKETS]; r; r = r->id_next)
        if (r->req_id == id) return r;
    return NULL;
}

static void id_del(gw_sess *ss, gw_req *r)
{
    for (gw_req **p = &ss->by_id[r->req_id % GW_HBUCKETS]; *p; p = &(*p)->id_next)
        if (*p == r) {
            *p = r->id_next;
            return;
        }
}

static void serial_put(gw_server *s, gw_req *r)
{
    gw_req **b = &s->by_serial[r->serial % GW_HBUCKETS];
    r->serial_next = *b;
    *b = r;
}

static gw_req *serial_find(gw_server *s, uint64_t serial)
{
    for (gw_req *r = s->by_serial[serial % GW_HBUCKETS]; r; r = r->serial_next)
        if (r->serial == serial) return r;
    return NULL;
}

static void serial_del(gw_server *s, gw_req *r)
{
    for (gw_req **p = &s->by_serial[r->serial % GW_HBUCKETS]; *p; p = &(*p)->serial_next)
        if (*p == r) {
            *p = r->serial_next;
            return;
        }
}

/* The queue of r's session (r->sess is set before a request is queued). */
static void q_push(gw_req *r)
{
    gw_sess *ss = r->sess;
    if (r->queued) return;
    r->queued = true;
    r->q_next = NULL;
    if (ss->q_tail)
        ss->q_tail->q_next = r;
    else
        ss->q_head = r;
    ss->q_tail = r;
    ss->n_queued++;
    /* An events thread asleep without a timeout must come and retry it. */
    if (ss->waits_for_ever && ss->client) {
        ss->waits_for_ever = false;
        ringlm_wake(ss->client);
    }
}

static void q_del(gw_req *r)
{
    if (!r->queued) return;
    gw_sess *ss = r->sess;
    gw_req *prev = NULL;
    for (gw_req *x = ss->q_head; x; prev = x, x = x->q_next)
        if (x == r) {
            if (prev)
                prev->q_next = r->q_next;
            else
                ss->q_head = r->q_next;
            if (ss->q_tail == r) ss->q_tail = prev;
            break;
        }
    r->queued = false;
    ss->n_queued--;
}

/* ---- request objects ------------------------------------------------------------------- */
gw_req *gw_req_new(gw_server *s, enum ep ep, struct MHD_Connection *c)
{
    gw_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->s = s;
    r->conn = c;
    r->ep = ep;
    r->sock_fd = -1;
    pthread_mutex_lock(&s->mu);
    r->serial = ++s->next_serial;
    serial_put(s, r);
    if (ep == EP_COMPLETIONS || ep == EP_CHAT || ep == EP_RESPONSES) s->n_gen_live++;
    pthread_mutex_unlock(&s->mu);
    return r;
}

int gw_choices_new(gw_server *s, gw_req *r, uint32_t n)
{
    r->choices = calloc(n, sizeof *r->choices);
    if (!r->choices) return -ENOMEM;
    r->choices[0] = r;
    r->n_choices = 1;
    for (uint32_t i = 1; i < n; i++) {
        gw_req *c = calloc(1, sizeof *c);
        if (!c) return -ENOMEM; /* the ones made are freed with r */
        c->s = s;
        c->owner = r;
        c->choice = i;
        c->ep = EP_OTHER; /* not a generation of its own: counted with its owner */
        c->sock_fd = -1;
        c->p = r->p;     /* shared, owned by r (never freed through c) */
        c->ids = r->ids; /* the same */
        c->n_prompt = r->n_prompt;
        c->prev = r->prev;
        gw_stream_tools_init(r, &c->tools);
        r->choices[r->n_choices++] = c;
    }
    return 0;
}

static void id_del(gw_sess *ss, gw_req *r);

/* mu held */
void gw_req_free(gw_server *s, gw_req *r)
{
    if (r->owner) { /* a further choice: its own buffers only */
        q_del(r);
        if (r->submitted && !r->daemon_done && r->sess) id_del(r->sess, r);
        gw_buf_free(&r->raw);
        gw_buf_free(&r->pend);
        gw_buf_free(&r->text);
        gw_tools_free(&r->tools);
        gw_lps_free(&r->lps);
        free(r);
        return;
    }
    for (uint32_t i = 1; r->choices && i < r->n_choices; i++) gw_req_free(s, r->choices[i]);
    free(r->choices);
    serial_del(s, r);
    q_del(r);
    if (r->ep == EP_COMPLETIONS || r->ep == EP_CHAT || r->ep == EP_RESPONSES) {
        s->n_gen_live--;
        pthread_cond_broadcast(&s->cv);
    }
    gw_params_free(&r->p);
    free(r->ids);
    gw_buf_free(&r->body);
    gw_buf_free(&r->raw);
    gw_buf_free(&r->pend);
    gw_buf_free(&r->text);
    gw_tools_free(&r->tools);
    gw_resp_free(&r->rs);
    gw_lps_free(&r->lps);
    gw_lps_free(&r->plps);
    gw_buf_free(&r->out);
    gw_buf_free(&r->head);
    if (r->prep_resp) MHD_destroy_response(r->prep_resp);
    if (r->ready) MHD_destroy_response(r->ready);
    free(r);
}

/* mu held: hand the connection back to libmicrohttpd when it waits for us. */
void gw_wake(gw_req *r)
{
    if (r->suspended && r->conn) {
        r->suspended = false;
        MHD_resume_connection(r->conn);
    }
}

/* mu held */
void gw_suspend(gw_req *r)
{
    r->suspended = true;
    MHD_suspend_connection(r->conn);
}

/* mu held: watch the socket for a hang-up while the request lives. */
void gw_watch(gw_server *s, gw_req *r)
{
    if (r->watched) return;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return;
    struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLHUP | EPOLLERR | EPOLLONESHOT,
                             .data.u64 = r->serial};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, ci->connect_fd, &ev) == 0) {
        r->sock_fd = ci->connect_fd;
        r->watched = true;
    }
}

void gw_unwatch(gw_server *s, gw_req *r)
{
    if (r->watched) epoll_ctl(s->epfd, EPOLL_CTL_DEL, r->sock_fd, NULL);
    r->watched = false;
}

static void cancel_one(gw_req *r);

void gw_daemon_end(gw_server *s, gw_req *r)
{
    if (r->submitted && !r->daemon_done) {
        id_del(r->sess, r);
        r->sess->n_inflight--;
        s->n_inflight--;
    }
    r->daemon_done = true;
    q_del(r);
    gw_req *o = gw_top(r);
    if (r == o && !r->submitted) /* it never reached the daemon: nor did its other choices */
        for (uint32_t i = 1; r->choices && i < r->n_choices; i++) r->choices[i]->daemon_done = true;
    if (r != o && r->failed && !o->failed && !o->out_done) { /* one choice fails them all */
        o->failed = true;
        o->err = r->err;
    }
    if (!gw_all_done(o)) {
        /* the others go on; a failure ends them (its answer is the error) */
        if (o->failed)
            for (uint32_t i = 0; i < o->n_choices; i++) cancel_one(o->choices[i]);
        else if (!o->gone && o->p.stream && o->started && r->finish)
            gw_sse_choice_end(r);
        gw_wake(o);
        return;
    }
    if (!o->gone && o->p.stream && o->started && !o->out_done) gw_sse_end(o);
    gw_wake(o);
    if (o->http_done && !o->in_prep) gw_req_free(s, o);
}

/* mu held: r failed before or while generating. */
static void req_fail(gw_server *s, gw_req *r, const gw_err *e)
{
    if (!r->failed && !r->finish) {
        r->failed = true;
        r->err = *e;
    }
    gw_daemon_end(s, r);
}

/* ---- what the daemon says at the handshake ---------------------------------------------- */
int gw_check_daemon(const gw_cfg *cfg, const ringlm_client *c, char *why, size_t n)
{
    if (!cfg->keys) return 0;
    unsigned uid = (unsigned)getuid();
    if (ringlm_tenant_tags_honoured(c) == 0) {
        snprintf(why, n,
                 "ringlmd ignores this gateway's tenant tags: its policy does not trust uid %u "
                 "(the built-in policy trusts none), so the requests of every API key would be "
                 "one tenant, with one prefix cache and one fair share. Add this uid to the "
                 "policy ('[trust]' section, 'uids = %u') and restart ringlmd, or run the "
                 "gateway without --api-keys",
                 uid, uid);
        return -1;
    }
    const char *names[RINGLM_MAX_CLASSES];
    int nc = ringlm_policy_classes(c, names, RINGLM_MAX_CLASSES);
    if (nc < 0) return 0; /* a daemon that does not say: nothing to check against */
    for (size_t k = 0; k < cfg->keys->n; k++) {
        const char *cls = cfg->keys->v[k].class_name;
        bool known = !cls[0];
        for (int i = 0; i < nc && !known; i++) known = !strcmp(names[i], cls);
        if (known) continue;
        int w = snprintf(why, n,
                         "--api-keys: the key of tenant '%s' names class '%s', which ringlmd's "
                         "policy lacks (every request of that key would fail); its classes:",
                         cfg->keys->v[k].tenant, cls);
        for (int i = 0; i < nc && w > 0 && (size_t)w < n; i++)
            w += snprintf(why + w, n - (size_t)w, " %s", names[i]);
        return -1;
    }
    return 0;
}

const char *gw_model(gw_server *s)
{
    return __atomic_load_n(&s->model, __ATOMIC_ACQUIRE);
}

/* mu held: the served model name daemon c says. The first name said is the daemons' (and the
 * gateway's, without --served-model-name); a daemon that says another one serves another
 * model, which one gateway cannot front: -1 with why. */
static int check_model(gw_server *s, gw_sess *ss, const ringlm_client *c, char *why, size_t n)
{
    const char *name = ringlm_served_model(c);
    if (!name) return 0; /* a daemon that does not say */
    if (!s->model_learned) {
        char *copy = strdup(name);
        json_t *mj = json_string(name);
        char *js = mj ? json_dumps(mj, JSON_ENCODE_ANY) : NULL;
        json_decref(mj);
        if (!copy || !js) {
            free(copy);
            free(js);
            return 0; /* out of memory: the name stays as it was */
        }
        s->model_learned = copy;
        if (!s->cfg.served_model) {
            free(s->model_json);
            s->model_json = js;
            __atomic_store_n(&s->model, s->model_learned, __ATOMIC_RELEASE);
            gw_log(s, "serving model '%s', the name ringlmd serves it by", name);
        } else {
            free(js);
        }
    } else if (strcmp(name, s->model_learned)) {
        snprintf(why, n,
                 "ringlmd at %s serves model '%s', the gateway's other daemons '%s': one gateway "
                 "fronts one model (give every ringlmd the same --served-model-name and model)",
                 ss->socket_path ? ss->socket_path : "the default socket", name, s->model_learned);
        return -1;
    }
    if (s->cfg.served_model && strcmp(name, s->cfg.served_model) && !s->model_warned) {
        s->model_warned = true;
        gw_log(s,
               "ringlmd serves the model as '%s'; clients, /v1/models and the relayed vllm:* "
               "metrics see --served-model-name '%s'",
               name, s->cfg.served_model);
    }
    return 0;
}

/* ---- the session (events thread; mu held where noted) ---------------------------------- */
/* Cancels one choice (a request of its own: the request). */
static void cancel_one(gw_req *r)
{
    if (!r->submitted || r->daemon_done || !r->sess->client) return;
    int rc = ringlm_cancel(r->sess->client, r->req_id);
    if (rc == -EAGAIN) {
        r->need_cancel = true;
        q_push(r);
    }
}

void gw_cancel_locked(gw_server *s, gw_req *r)
{
    (void)s;
    r = gw_top(r);
    for (uint32_t i = 1; r->choices && i < r->n_choices; i++) cancel_one(r->choices[i]);
    cancel_one(r);
}

int gw_sessions_up(gw_server *s, const char **why)
{
    int up = 0;
    if (why) *why = "";
    for (int i = 0; i < s->n_sess; i++) {
        if (s->sess[i].client)
            up++;
        else if (why && !(*why)[0])
            *why = s->sess[i].conn_err;
    }
    return up;
}

/* mu held: submits r on ss (its session from now on). 0 submitted or queued; -1 failed
 * (r->err set, not yet answered). */
static int submit_on(gw_sess *ss, gw_req *r)
{
    gw_server *s = ss->s;
    gw_err e;
    r->sess = ss;
    uint64_t id;
    int rc = ringlm_submit_ext(ss->client, &r->rq, r->has_smp ? &r->smp : NULL, &id);
    if (rc == 0) {
        r->req_id = id;
        r->submitted = true;
        id_put(ss, r);
        ss->n_inflight++;
        s->n_inflight++;
        /* its other choices are the daemon's next ids (ringlm.h "n samples") */
        for (uint32_t i = 1; r->choices && i < r->n_choices; i++) {
            gw_req *c = r->choices[i];
            c->sess = ss;
            c->req_id = id + i;
            c->submitted = true;
            id_put(ss, c);
            ss->n_inflight++;
            s->n_inflight++;
        }
        return 0;
    }
    if (rc == -EAGAIN) {
        q_push(r);
        return 0;
    }
    if (rc == -ESHUTDOWN)
        gw_err_set(&e, 503, "draining", NULL, "ringlmd is draining: no new requests");
    else if (rc == -E2BIG)
        gw_err_set(&e, 400, "too_long", "prompt",
                   "the prompt is too long for the session's submit ring: %s", ringlm_errdetail());
    else if (rc == -EINVAL && !strncmp(ringlm_errdetail(), "n ", 2))
        gw_err_set(&e, 400, "invalid_value", r->p.best_of > r->p.n ? "best_of" : "n", "%s",
                   ringlm_errdetail()); /* past the daemon's --max-n */
    else if (rc == -EINVAL)
        gw_err_set(&e, 400, "bad_params", NULL, "%s", ringlm_errdetail());
    else if (rc == -ENOTSUP) /* an older ringlmd, or a constraint it does not enforce */
        gw_err_set(&e, 400, "unsupported",
                   r->has_smp && r->smp.constraint_kind &&
                           !strncmp(ringlm_errdetail(), "constraint", 10)
                       ? r->p.constraint_param
                       : NULL,
                   "%s", ringlm_errdetail());
    else
        gw_err_set(&e, 503, "daemon_unavailable", NULL, "ringlmd: %s (%s)", ringlm_strerror(rc),
                   ringlm_errdetail());
    r->failed = true;
    r->err = e;
    return -1;
}

void gw_daemon_loads_locked(gw_server *s, gw_daemon_load *dl, bool *up)
{
    for (int d = 0; d < s->n_daemons; d++) {
        dl[d] = (gw_daemon_load){0};
        up[d] = false;
    }
    for (int i = 0; i < s->n_sess; i++) {
        gw_sess *ss = &s->sess[i];
        gw_daemon_load *l = &dl[ss->daemon];
        l->sent += ss->n_inflight + ss->n_queued;
        if (!ss->client) continue;
        up[ss->daemon] = true;
        ringlm_load ld; /* every session of a daemon maps the same figures: read one */
        if (!l->published && ringlm_daemon_load(ss->client, &ld) == 0)
            *l = (gw_daemon_load){.sent = l->sent,
                                  .published = true,
                                  .waiting = ld.waiting,
                                  .running = ld.running,
                                  .kv_used = ld.kv_used_blocks,
                                  .kv_total = ld.kv_total_blocks};
    }
}

int gw_submit_locked(gw_server *s, gw_req *r)
{
    gw_sess *best = NULL;
    int daemon = -1; /* with several daemons, the one gw_route picks; then its sessions */
    if (s->route) {
        gw_daemon_load dl[GW_MAX_DAEMONS];
        size_t load[GW_MAX_DAEMONS] = {0};
        bool up[GW_MAX_DAEMONS] = {0};
        gw_daemon_loads_locked(s, dl, up);
        for (int d = 0; d < s->n_daemons; d++) load[d] = gw_route_load(&dl[d]);
        uint32_t affinity = 0;
        daemon = gw_route_pick(s->route, r->rq.prompt, r->rq.n_prompt, load, up, s->n_daemons,
                               &affinity);
        if (daemon >= 0) {
            gw_route_record(s->route, r->rq.prompt, r->rq.n_prompt, daemon);
            s->daemon_picks[daemon]++;
            s->affinity_picks += affinity > 0;
        }
    }
    for (int i = 0; i < s->n_sess; i++) {
        gw_sess *ss = &s->sess[i];
        if (daemon >= 0 && ss->daemon != daemon) continue;
        if (ss->client &&
            (!best || ss->n_inflight + ss->n_queued < best->n_inflight + best->n_queued))
            best = ss;
    }
    if (!best) {
        const char *why;
        gw_sessions_up(s, &why);
        gw_err_set(&r->err, 503, "daemon_unavailable", NULL, "not connected to ringlmd%s%s",
                   why[0] ? ": " : "", why);
        r->failed = true;
        return -1;
    }
    return submit_on(best, r);
}

/* mu held: retry what waited for ring space on ss. */
static void retry_queue(gw_sess *ss)
{
    gw_server *s = ss->s;
    while (ss->q_head) {
        gw_req *r = ss->q_head;
        if (r->need_cancel) {
            if (ss->client && ringlm_cancel(ss->client, r->req_id) == -EAGAIN) return;
            r->need_cancel = false;
            q_del(r);
            continue;
        }
        q_del(r);
        if (r->gone) {
            gw_daemon_end(s, r);
            continue;
        }
        int rc = submit_on(ss, r);
        if (rc < 0) {
            gw_daemon_end(s, r);
            continue;
        }
        if (r->queued) return; /* still full */
    }
}

/* A prompt token's log-probabilities (echo, prompt_logprobs): all come before the first
 * generated token. The prompt's first token has none; it is listed first. */
static void on_prompt_token(gw_sess *ss, const ringlm_event *ev, const ringlm_logprobs *lp)
{
    gw_req *r = id_find(ss, ev->req_id);
    if (!r || r->finish || r->failed || !lp || ev->index == 0 || ev->index >= r->n_prompt) return;
    if (r->plps.n == 0 && gw_lps_add(&r->plps, -1, r->ids[0], NULL) < 0) return;
    (void)gw_lps_add(&r->plps, r->ids[ev->index - 1], ev->token, lp);
}

static void on_token(gw_sess *ss, const ringlm_event *ev, const ringlm_logprobs *lp)
{
    gw_server *s = ss->s;
    gw_req *r = id_find(ss, ev->req_id);
    if (!r || r->finish || r->failed || gw_top(r)->failed)
        return; /* cut at a stop string: the rest until FINISH is dropped */
    gw_req *o = gw_top(r);
    uint64_t t0 = gw_now_ns();
    r->n_gen++;
    if (lp) r->cum_lp += lp->logprob;
    /* out of memory: the answer lists fewer entries than tokens, it is not refused */
    if (r->p.logprobs != GW_LP_NONE && lp) (void)gw_lps_add(&r->lps, r->prev, ev->token, lp);
    if (r->p.stream && r->p.echo) gw_stream_echo(r);
    const char *piece = NULL;
    if (s->cfg.tok && ringlm_token_text(s->cfg.tok, r->prev, ev->token, &piece) < 0) piece = NULL;
    if (r->p.tool_parser && ev->token == s->tool_marker)
        piece = gw_tool_parser_marker(r->p.tool_parser); /* a control token: its text */
    r->prev = ev->token;
    if (piece) gw_buf_adds(&r->raw, piece);
    if (gw_emit_text(r, false)) {
        r->finish = "stop";
        cancel_one(r); /* this choice only */
    }
    if (r->p.stream) {
        gw_start_stream(r);
        if (!o->gone) gw_wake(o);
    }
    s->tokens_out++;
    s->dispatch_ns_sum += gw_now_ns() - t0;
    s->dispatch_n++;
}

static void on_finish(gw_sess *ss, const ringlm_event *ev, const char *detail)
{
    gw_server *s = ss->s;
    gw_req *r = id_find(ss, ev->req_id);
    if (!r) return;
    /* also when a stop string ended it first: the usage is written at the daemon's end */
    if (!r->owner) r->n_cached = ev->n_cached_tokens; /* the prompt's: the first choice's */
    if (!r->finish && !r->failed && !gw_top(r)->gone) {
        if (ev->finish_reason == RINGLM_FINISH_STOP || ev->finish_reason == RINGLM_FINISH_LENGTH) {
            if (r->p.stream && r->p.echo) gw_stream_echo(r);
            bool hit = gw_emit_text(r, true);
            r->finish = hit || ev->finish_reason == RINGLM_FINISH_STOP ? "stop" : "length";
            if (r->p.stream) gw_start_stream(r);
        } else {
            gw_err e;
            gw_fail_from_finish(&e, ev->finish_reason, ev->reject_reason);
            /* ringlmd's words for a constraint it could not compile (or that failed) */
            if (detail && detail[0] && r->p.constraint_param &&
                !strncmp(detail, "constraint", 10)) {
                bool bad = ev->finish_reason == RINGLM_FINISH_REJECTED &&
                           ev->reject_reason == RINGLM_R_BAD_PARAMS;
                gw_err_set(&e, bad ? 400 : e.status, bad ? "invalid_value" : e.code,
                           r->p.constraint_param, "'%s': %s", r->p.constraint_param, detail);
            }
            r->failed = true;
            r->err = e;
        }
    }
    gw_daemon_end(s, r);
}

/* The detail of the event just read (ringlm_event_detail is valid until the next read). */
static void keep_detail(const ringlm_client *c, char *out)
{
    const char *d = ringlm_event_detail(c);
    snprintf(out, 256, "%s", d ? d : "");
}

/* mu held: the session ended; every request on it fails with 503. */
static void session_lost(gw_sess *ss, int rc)
{
    gw_server *s = ss->s;
    snprintf(ss->conn_err, sizeof ss->conn_err, "%s (%s)", ringlm_strerror(rc), ringlm_errdetail());
    gw_log(s, "session %d with ringlmd (%s) ended: %s; reconnecting", ss->idx,
           ss->socket_path ? ss->socket_path : "default socket", ss->conn_err);
    gw_err e;
    gw_err_set(&e, 503, "daemon_unavailable", NULL, "ringlmd went away: %s", ss->conn_err);
    for (int b = 0; b < GW_HBUCKETS; b++)
        while (ss->by_id[b]) req_fail(s, ss->by_id[b], &e);
    while (ss->q_head) req_fail(s, ss->q_head, &e);
    ringlm_close(ss->client);
    ss->client = NULL;
    ss->losses++;
}

void *gw_events_main(void *arg)
{
    gw_sess *ss = arg;
    gw_server *s = ss->s;
    ringlm_event evs[EVENT_BATCH];
    /* each event's log-probabilities, taken before the next event replaces them */
    ringlm_logprobs lps[EVENT_BATCH];
    bool has_lp[EVENT_BATCH];
    char det[EVENT_BATCH][256]; /* a FINISH's detail (ringlm_event_detail) */
    char last_err[768] = "";
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool stop = s->stopping;
        ringlm_client *c = ss->client;
        /* Idle, it sleeps until an event, the daemon's end, a request queued for ring
         * space (q_push) or the stop (gw_sessions_wake_all) wakes it: no timer. */
        int wait_ms = ss->q_head ? EVENT_WAIT_MS : -1;
        ss->waits_for_ever = c && wait_ms < 0;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        if (!c) {
            char bad[768] = "";
            int rc = ringlm_connect(ss->socket_path, &c);
            if (rc == 0 && gw_check_daemon(&s->cfg, c, bad, sizeof bad) < 0) {
                /* a daemon whose policy does not fit the keys: no session, said loudly */
                ringlm_close(c);
                c = NULL;
                rc = -EPERM;
            }
            pthread_mutex_lock(&s->mu);
            if (rc == 0 && check_model(s, ss, c, bad, sizeof bad) < 0) {
                ringlm_close(c);
                c = NULL;
                rc = -EPERM;
            }
            if (rc == -EPERM && !c && bad[0]) {
                snprintf(ss->conn_err, sizeof ss->conn_err, "%s", bad);
                if (strcmp(last_err, ss->conn_err)) {
                    fprintf(stderr, "ringlm-gateway: session %d refused: %s\n", ss->idx, bad);
                    snprintf(last_err, sizeof last_err, "%s", ss->conn_err);
                }
                struct timespec dl;
                clock_gettime(CLOCK_REALTIME, &dl);
                dl.tv_sec += 1;
                if (!s->stopping) pthread_cond_timedwait(&s->cv, &s->mu, &dl);
            } else if (rc == 0) {
                ss->client = c;
                ss->conn_err[0] = 0;
                ss->connects++;
                last_err[0] = 0;
                gw_log(s, "session %d connected to ringlmd (session id %llu)", ss->idx,
                       (unsigned long long)ringlm_session_id(c));
            } else {
                snprintf(ss->conn_err, sizeof ss->conn_err, "%s (%s)", ringlm_strerror(rc),
                         ringlm_errdetail());
                if (strcmp(last_err, ss->conn_err)) {
                    gw_log(s, "session %d cannot connect to ringlmd: %s; retrying every %d ms",
                           ss->idx, ss->conn_err, RECONNECT_MS);
                    snprintf(last_err, sizeof last_err, "%s", ss->conn_err);
                }
                struct timespec dl;
                clock_gettime(CLOCK_REALTIME, &dl);
                dl.tv_nsec += RECONNECT_MS * 1000000l;
                dl.tv_sec += dl.tv_nsec / 1000000000l;
                dl.tv_nsec %= 1000000000l;
                if (!s->stopping) pthread_cond_timedwait(&s->cv, &s->mu, &dl);
            }
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        int n = 0, rc = ringlm_next_event(c, &evs[0], wait_ms);
        if (rc == 1) {
            has_lp[0] = ringlm_event_logprobs(c, &lps[0]) == 1;
            keep_detail(c, det[0]);
            n = 1;
            while (n < EVENT_BATCH && (rc = ringlm_next_event(c, &evs[n], 0)) == 1) {
                has_lp[n] = ringlm_event_logprobs(c, &lps[n]) == 1;
                keep_detail(c, det[n]);
                n++;
            }
        }
        pthread_mutex_lock(&s->mu);
        ss->waits_for_ever = false;
        for (int i = 0; i < n; i++) {
            if (evs[i].kind == RINGLM_EV_TOKEN)
                on_token(ss, &evs[i], has_lp[i] ? &lps[i] : NULL);
            else if (evs[i].kind == RINGLM_EV_PROMPT_TOKEN)
                on_prompt_token(ss, &evs[i], has_lp[i] ? &lps[i] : NULL);
            else if (evs[i].kind == RINGLM_EV_FINISH)
                on_finish(ss, &evs[i], det[i]);
        }
        if (rc < 0 && rc != -EINTR)
            session_lost(ss, rc);
        else
            retry_queue(ss);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* ---- watch thread ---------------------------------------------------------------------- */
void *gw_watch_main(void *arg)
{
    gw_server *s = arg;
    struct epoll_event evs[64];
    for (;;) {
        int n = epoll_wait(s->epfd, evs, 64, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        pthread_mutex_lock(&s->mu);
        bool stop = s->stopping;
        for (int i = 0; i < n && !stop; i++) {
            gw_req *r = serial_find(s, evs[i].data.u64);
            if (!r || r->http_done) continue;
            r->gone = true;
            gw_cancel_locked(s, r);
            if (!r->submitted && r->queued)
                gw_daemon_end(s, r); /* never reached the daemon */
            else
                gw_wake(r);
        }
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
    }
    return NULL;
}
/* mu held, stopping set: every events thread asleep in ringlm_next_event returns. */
void gw_sessions_wake_all_locked(gw_server *s)
{
    for (int i = 0; s->sess && i < s->n_sess; i++)
        if (s->sess[i].client) ringlm_wake(s->sess[i].client);
}

/* mu held */
void gw_cancel_all_locked(gw_server *s)
{
    for (int i = 0; i < s->n_sess; i++)
        for (int b = 0; b < GW_HBUCKETS; b++)
            for (gw_req *r = s->sess[i].by_id[b]; r; r = r->id_next) cancel_one(r);
}

/* mu held; the threads are gone */
void gw_free_all_locked(gw_server *s)
{
    for (int b = 0; b < GW_HBUCKETS; b++)
        while (s->by_serial[b]) {
            gw_req *r = s->by_serial[b];
            if (r->submitted && !r->daemon_done) {
                id_del(r->sess, r);
                r->daemon_done = true;
            }
            gw_req_free(s, r); /* its other choices with it */
        }
}
