/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_endpoints.c — the gateway's endpoints (see gw_internal.h): an OpenAI completions
 * or chat request → tokens → one ringlm request submitted (its answer: gw_stream.c);
 * /v1/models, /health, /tokenize, /detokenize and the gateway's own /metrics.
 */
#include "gateway/gw_internal.h"
#include "gateway/gw_responses.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- endpoints and their counters ------------------------------------------------------ */
const char *const gw_ep_name[EP_N] = {"completions", "chat_completions", "responses",
                                      "models",      "health",           "tokenize",
                                      "detokenize",  "metrics",          "other"};
const int gw_stat_codes[GW_NSTAT] = {200, 400, 401, 404, 405, 413, 429, 500, 503, 504, 0};

int gw_stat_slot(int status)
{
    for (int i = 0; i < GW_NSTAT - 1; i++)
        if (gw_stat_codes[i] == status) return i;
    return GW_NSTAT - 1;
}

/* ---- generation requests --------------------------------------------------------------- */
/* What the model file's template leaves out: the BOS and EOS texts the tokenizer adds as ids. */
static unsigned jinja_strip(const gw_server *s)
{
    int add = s->cfg.tok ? ringlm_tokenizer_add_special(s->cfg.tok) : 0;
    return add > 0 ? (unsigned)add : 0;
}

/* A prompt's ids as llama.cpp's server gives them (add_special: BOS and EOS where the file
 * asks for them); an empty prompt is then [BOS] where the file adds BOS, as there. */
#define PROMPT_FLAGS RINGLM_TOKENIZE_SPECIAL

static int encode_text(const ringlm_tokenizer *t, const char *text, int32_t **ids, uint32_t *n)
{
    size_t cap = ringlm_tokenize_bound(text);
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return -ENOMEM;
    int k = ringlm_tokenize(t, text, PROMPT_FLAGS, *ids, cap);
    if (k < 0) return k;
    *n = (uint32_t)k;
    return 0;
}

enum MHD_Result gw_start_generation(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
    gw_err e;
    gw_parse_cfg pc = {.served_model = gw_model(s),
                       .tpl = s->cfg.tpl,
                       .jinja = s->cfg.jinja,
                       .jinja_strip = jinja_strip(s),
                       .tool_parser = s->cfg.tool_parser};
    int prc = r->ep == EP_RESPONSES
                  ? gw_responses_parse(r->body.p ? r->body.p : "", r->body.len, &pc, &r->p,
                                       &r->rs.base, &e)
                  : gw_params_parse(r->ep == EP_CHAT ? GW_CHAT : GW_COMPLETION,
                                    r->body.p ? r->body.p : "", r->body.len, &pc, &r->p, &e);
    if (prc) return gw_answer_err(r, c, &e);
    gw_stream_tools_init(r, &r->tools);
    if (r->p.prompt_text) {
        if (!s->cfg.tok)
            return gw_answer_errf(r, c, 400, "unsupported",
                                  "the gateway has no tokenizer: send 'prompt' as token ids");
        int rc = encode_text(s->cfg.tok, r->p.prompt_text, &r->ids, &r->n_prompt);
        if (rc < 0) {
            gw_err_set(&e, 400, "bad_prompt", "prompt", "the prompt cannot be tokenized: %s",
                       ringlm_errdetail());
            return gw_answer_err(r, c, &e);
        }
        if (!r->n_prompt) { /* llama.cpp's server answers nothing generated then */
            gw_err_set(&e, 400, "bad_prompt", "prompt",
                       "the prompt is empty and the model's tokenizer adds no BOS or EOS "
                       "token to it: there is nothing to continue from");
            return gw_answer_err(r, c, &e);
        }
    } else {
        r->ids = r->p.prompt_ids;
        r->n_prompt = r->p.n_prompt_ids;
        r->p.prompt_ids = NULL;
        int vocab = s->cfg.tok ? ringlm_tokenizer_vocab_size(s->cfg.tok) : 0;
        for (uint32_t i = 0; vocab && i < r->n_prompt; i++)
            if (r->ids[i] >= vocab) {
                gw_err_set(&e, 400, "bad_token", "prompt",
                           "prompt token %u is %d; the vocabulary has %d tokens", i, r->ids[i],
                           vocab);
                return gw_answer_err(r, c, &e);
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
    /* vLLM's ignore_eos: the stop token does not end it; it runs to max_tokens (stop
     * strings still cut it). */
    r->rq.ignore_stop = r->p.ignore_eos;
    const char *cls = r->p.class_name[0]                ? r->p.class_name
                      : r->key && r->key->class_name[0] ? r->key->class_name
                                                        : "";
    r->rq.class_name = cls;
    r->rq.tenant_tag = r->key ? r->key->tenant : NULL;
    r->prev = r->n_prompt ? r->ids[r->n_prompt - 1] : 0;
    r->has_smp = gw_params_sampling(&r->p, &r->smp);
    if (gw_params_check(&r->p, &r->rq, r->has_smp ? &r->smp : NULL,
                        s->cfg.tok ? ringlm_tokenizer_vocab_size(s->cfg.tok) : 0, &e)) {
        if (r->ep == EP_RESPONSES) gw_responses_err(&e);
        return gw_answer_err(r, c, &e);
    }
    /* n choices (or best_of samples): one ringlm request of that many samples */
    if (r->has_smp && r->smp.n > 1 && gw_choices_new(s, r, r->smp.n) < 0)
        return gw_answer_errf(r, c, 500, "internal", "out of memory");

    pthread_mutex_lock(&s->mu);
    r->rq.seed = r->p.has_seed ? r->p.seed : gw_xorshift(&s->rng);
    snprintf(r->id, sizeof r->id, "%s-%s%llx",
             r->ep == EP_RESPONSES  ? "resp"
             : r->p.kind == GW_CHAT ? "chatcmpl"
                                    : "cmpl",
             s->id_prefix, (unsigned long long)r->serial);
    if (r->ep == EP_RESPONSES) r->id[4] = '_'; /* OpenAI's resp_... */
    r->created = (long long)time(NULL);
    gw_buf_addf(
        &r->head,
        "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":%s,\"choices\":[", r->id,
        r->p.kind == GW_CHAT ? "chat.completion.chunk" : "text_completion", r->created,
        s->model_json);
    if (r->gone || s->stopping) { /* its client left while it was prepared */
        pthread_mutex_unlock(&s->mu);
        return MHD_NO;
    }
    if (s->draining) {
        pthread_mutex_unlock(&s->mu);
        return gw_answer_errf(r, c, 503, "draining", "the gateway is shutting down");
    }
    if (gw_submit_locked(s, r) < 0) {
        enum MHD_Result ret = gw_answer_err(r, c, &r->err);
        pthread_mutex_unlock(&s->mu);
        return ret;
    }
    r->state = RQ_WAIT; /* its connection is parked since it was queued (gw_prep.c) */
    s->admit_us_sum += gw_now_us() - r->t_body_us;
    s->admit_n++;
    pthread_mutex_unlock(&s->mu);
    return MHD_YES;
}

/* ---- small endpoints ------------------------------------------------------------------- */
enum MHD_Result gw_ep_models(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
    const char *name = gw_model(s);
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", name, "object", "model", "created",
                          (json_int_t)time(NULL), "owned_by", "ringlm", "root", name);
    if (m && s->cfg.max_model_len)
        json_object_set_new(m, "max_model_len", json_integer(s->cfg.max_model_len));
    return gw_answer_json(r, c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}

enum MHD_Result gw_ep_health(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
    pthread_mutex_lock(&s->mu);
    const char *conn_err;
    bool up = gw_sessions_up(s, &conn_err) > 0, daemon_draining = false;
    for (int i = 0; i < s->n_sess; i++)
        daemon_draining |= s->sess[i].client && ringlm_draining(s->sess[i].client);
    const char *why = s->draining       ? "the gateway is draining"
                      : !up             ? "not connected to ringlmd"
                      : daemon_draining ? "ringlmd is draining"
                                        : NULL;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s%s%s", why ? why : "", why && !up && conn_err[0] ? ": " : "",
             why && !up ? conn_err : "");
    pthread_mutex_unlock(&s->mu);
    if (why) return gw_answer_errf(r, c, 503, "unavailable", msg);
    return gw_answer(r, c, 200, "application/json", strdup("{\"status\":\"ok\"}"));
}

enum MHD_Result gw_ep_tokenize(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
    json_error_t je;
    gw_err e;
    if (!s->cfg.tok)
        return gw_answer_errf(r, c, 400, "unsupported", "the gateway has no tokenizer");
    json_t *o = json_loadb(r->body.p ? r->body.p : "", r->body.len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return gw_answer_errf(r, c, 400, "invalid_json", "the body must be a JSON object");
    }
    json_t *add = json_object_get(o, "add_special_tokens");
    if (add && !json_is_boolean(add) && !json_is_null(add)) {
        json_decref(o);
        gw_err_set(&e, 400, "invalid_value", "add_special_tokens",
                   "'add_special_tokens' must be a boolean");
        return gw_answer_err(r, c, &e);
    }
    bool bos = !add || !json_is_false(add);
    char *text = NULL;
    if (json_object_get(o, "messages")) {
        gw_parse_cfg pc = {.served_model = NULL,
                           .tpl = s->cfg.tpl,
                           .jinja = s->cfg.jinja,
                           .jinja_strip = jinja_strip(s),
                           .tool_parser = s->cfg.tool_parser};
        gw_params p;
        char *body = json_dumps(o, JSON_COMPACT);
        int rc = body ? gw_params_parse(GW_CHAT, body, strlen(body), &pc, &p, &e) : -1;
        free(body);
        if (rc) {
            json_decref(o);
            return gw_answer_err(r, c, &e);
        }
        text = p.prompt_text;
        p.prompt_text = NULL;
        gw_params_free(&p);
    } else {
        json_t *pr = json_object_get(o, "prompt");
        if (!json_is_string(pr)) {
            json_decref(o);
            gw_err_set(&e, 400, "invalid_value", "prompt",
                       "'prompt' must be a string (or give 'messages')");
            return gw_answer_err(r, c, &e);
        }
        text = strdup(json_string_value(pr));
    }
    json_decref(o);
    if (!text) return MHD_NO;
    size_t cap = ringlm_tokenize_bound(text);
    int32_t *ids = malloc(cap * sizeof *ids);
    int n = ids ? ringlm_tokenize(s->cfg.tok, text, bos ? PROMPT_FLAGS : 0, ids, cap) : -ENOMEM;
    free(text);
    if (n < 0) {
        free(ids);
        return gw_answer_errf(r, c, 400, "bad_prompt", "the prompt cannot be tokenized");
    }
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    json_t *res = json_pack("{s:i, s:o}", "count", n, "tokens", arr);
    if (res && s->cfg.max_model_len)
        json_object_set_new(res, "max_model_len", json_integer(s->cfg.max_model_len));
    return gw_answer_json(r, c, 200, res);
}

enum MHD_Result gw_ep_detokenize(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
    json_error_t je;
    gw_err e;
    if (!s->cfg.tok)
        return gw_answer_errf(r, c, 400, "unsupported", "the gateway has no tokenizer");
    json_t *o = json_loadb(r->body.p ? r->body.p : "", r->body.len, JSON_REJECT_DUPLICATES, &je);
    json_t *t = json_object_get(o, "tokens");
    if (!json_is_object(o) || !json_is_array(t)) {
        json_decref(o);
        gw_err_set(&e, 400, "invalid_value", "tokens", "'tokens' must be a list of token ids");
        return gw_answer_err(r, c, &e);
    }
    gw_buf raw = {0}, clean = {0};
    int32_t prev = -1;
    int vocab = ringlm_tokenizer_vocab_size(s->cfg.tok);
    const int32_t bos = ringlm_tokenizer_bos(s->cfg.tok), eos = ringlm_tokenizer_eos(s->cfg.tok);
    for (size_t i = 0; i < json_array_size(t); i++) {
        json_t *v = json_array_get(t, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= vocab) {
            json_decref(o);
            gw_buf_free(&raw);
            gw_err_set(&e, 400, "bad_token", "tokens",
                       "'tokens' item %zu is not a token id below %d", i, vocab);
            return gw_answer_err(r, c, &e);
        }
        const char *piece;
        if (id != bos && id != eos && ringlm_token_text(s->cfg.tok, prev, (int32_t)id, &piece) == 0)
            gw_buf_adds(&raw, piece);
        prev = (int32_t)id;
    }
    json_decref(o);
    gw_utf8_take(raw.p ? raw.p : "", raw.len, true, &clean);
    json_t *res = json_pack("{s:s%}", "prompt", clean.p ? clean.p : "", clean.len);
    gw_buf_free(&raw);
    gw_buf_free(&clean);
    return gw_answer_json(r, c, 200, res);
}

enum MHD_Result gw_ep_metrics(gw_server *s, gw_req *r, struct MHD_Connection *c)
{
    gw_buf b = {0};
    pthread_mutex_lock(&s->conn_mu);
    gw_buf_addf(&b,
                "# HELP ringlm_gateway_connections_open HTTP connections open.\n"
                "# TYPE ringlm_gateway_connections_open gauge\n"
                "ringlm_gateway_connections_open %u\n"
                "# HELP ringlm_gateway_connections_cut_total Connections closed by the gateway: "
                "no whole head or body in time (--http-head-timeout-s, --http-body-timeout-s), "
                "or evicted at --max-connections while sending their head.\n"
                "# TYPE ringlm_gateway_connections_cut_total counter\n"
                "ringlm_gateway_connections_cut_total{reason=\"head_timeout\"} %llu\n"
                "ringlm_gateway_connections_cut_total{reason=\"body_timeout\"} %llu\n"
                "ringlm_gateway_connections_cut_total{reason=\"evicted\"} %llu\n"
                "# HELP ringlm_gateway_connections_refused_total Connections refused at "
                "--max-connections (none sending its head to evict).\n"
                "# TYPE ringlm_gateway_connections_refused_total counter\n"
                "ringlm_gateway_connections_refused_total %llu\n",
                s->n_conns - s->n_conns_cut, (unsigned long long)s->conns_timed_out[GW_CONN_HEAD],
                (unsigned long long)s->conns_timed_out[GW_CONN_BODY],
                (unsigned long long)s->conns_evicted, (unsigned long long)s->conns_refused);
    pthread_mutex_unlock(&s->conn_mu);
    pthread_mutex_lock(&s->mu);
    int up = gw_sessions_up(s, NULL);
    uint64_t connects = 0, losses = 0;
    for (int i = 0; i < s->n_sess; i++) {
        connects += s->sess[i].connects;
        losses += s->sess[i].losses;
    }
    gw_buf_adds(
        &b, "# HELP ringlm_gateway_requests_total HTTP requests answered, by endpoint and status.\n"
            "# TYPE ringlm_gateway_requests_total counter\n");
    for (int e = 0; e < EP_N; e++)
        for (int k = 0; k < GW_NSTAT; k++)
            if (s->req_count[e][k]) {
                char st[16];
                if (gw_stat_codes[k])
                    snprintf(st, sizeof st, "%d", gw_stat_codes[k]);
                else
                    snprintf(st, sizeof st, "other");
                gw_buf_addf(&b,
                            "ringlm_gateway_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n",
                            gw_ep_name[e], st, (unsigned long long)s->req_count[e][k]);
            }
    gw_buf_addf(
        &b,
        "# HELP ringlm_gateway_requests_in_flight Generation requests submitted to ringlmd and not "
        "finished.\n"
        "# TYPE ringlm_gateway_requests_in_flight gauge\nringlm_gateway_requests_in_flight %zu\n"
        "# HELP ringlm_gateway_streams_open SSE responses open.\n"
        "# TYPE ringlm_gateway_streams_open gauge\nringlm_gateway_streams_open %zu\n"
        "# HELP ringlm_gateway_daemon_connected 1 while a session with ringlmd is up.\n"
        "# TYPE ringlm_gateway_daemon_connected gauge\nringlm_gateway_daemon_connected %d\n"
        "# HELP ringlm_gateway_sessions_connected Shared-memory sessions with ringlmd up (of "
        "--sessions).\n"
        "# TYPE ringlm_gateway_sessions_connected gauge\nringlm_gateway_sessions_connected %d\n"
        "# HELP ringlm_gateway_admission_seconds Time in the gateway from a whole body to the "
        "submit (parse, tokenize, submit).\n"
        "# TYPE ringlm_gateway_admission_seconds summary\n"
        "ringlm_gateway_admission_seconds_sum %.6f\nringlm_gateway_admission_seconds_count %llu\n"
        "# HELP ringlm_gateway_token_seconds Time in the gateway per generated token (decode, "
        "UTF-8, stop strings, chunk).\n"
        "# TYPE ringlm_gateway_token_seconds summary\n"
        "ringlm_gateway_token_seconds_sum %.9f\nringlm_gateway_token_seconds_count %llu\n"
        "# HELP ringlm_gateway_prep_queued Requests waiting for a tokenizer thread.\n"
        "# TYPE ringlm_gateway_prep_queued gauge\nringlm_gateway_prep_queued %u\n"
        "# HELP ringlm_gateway_prep_running Requests being parsed and tokenized.\n"
        "# TYPE ringlm_gateway_prep_running gauge\nringlm_gateway_prep_running %u\n"
        "# HELP ringlm_gateway_prep_dropped_total Requests whose client left before a tokenizer "
        "thread took them (never prepared).\n"
        "# TYPE ringlm_gateway_prep_dropped_total counter\nringlm_gateway_prep_dropped_total "
        "%llu\n"
        "# HELP ringlm_gateway_prep_refused_total Requests answered 503 busy: --tokenize-queue "
        "was full.\n"
        "# TYPE ringlm_gateway_prep_refused_total counter\nringlm_gateway_prep_refused_total "
        "%llu\n"
        "# HELP ringlm_gateway_session_connects_total Sessions opened with ringlmd.\n"
        "# TYPE ringlm_gateway_session_connects_total "
        "counter\nringlm_gateway_session_connects_total %llu\n"
        "# HELP ringlm_gateway_session_losses_total Sessions that ended under the gateway (daemon "
        "exit).\n"
        "# TYPE ringlm_gateway_session_losses_total counter\nringlm_gateway_session_losses_total "
        "%llu\n",
        s->n_inflight, s->n_streams, up > 0, up, (double)s->admit_us_sum / 1e6,
        (unsigned long long)s->admit_n, (double)s->dispatch_ns_sum / 1e9,
        (unsigned long long)s->dispatch_n, s->n_prep_queued, s->n_prep_running,
        (unsigned long long)s->prep_dropped, (unsigned long long)s->prep_refused,
        (unsigned long long)connects, (unsigned long long)losses);
    if (s->relay_started) {
        gw_buf_addf(
            &b,
            "# HELP ringlm_gateway_daemon_metrics_up Daemons whose last scrape of /metrics "
            "(--daemon-metrics) answered; their vllm:* lines follow then, as one server's.\n"
            "# TYPE ringlm_gateway_daemon_metrics_up gauge\nringlm_gateway_daemon_metrics_up %d\n",
            s->relay_up);
        if (s->n_relay > 1) {
            gw_buf_adds(&b, "# HELP ringlm_gateway_daemon_metrics_target_up 1 when the last "
                            "scrape of this --daemon-metrics (in order) answered.\n"
                            "# TYPE ringlm_gateway_daemon_metrics_target_up gauge\n");
            for (int i = 0; i < s->n_relay; i++)
                gw_buf_addf(&b, "ringlm_gateway_daemon_metrics_target_up{target=\"%d\"} %d\n", i,
                            s->relay_ok[i]);
        }
    }
    if (s->relay_up && s->relay_text) gw_buf_adds(&b, s->relay_text);
    if (s->route) {
        gw_buf_adds(&b, "# HELP ringlm_gateway_daemon_requests_total Requests sent to each daemon "
                        "(--socket, in order).\n"
                        "# TYPE ringlm_gateway_daemon_requests_total counter\n");
        for (int d = 0; d < s->n_daemons; d++)
            gw_buf_addf(&b, "ringlm_gateway_daemon_requests_total{daemon=\"%d\"} %llu\n", d,
                        (unsigned long long)s->daemon_picks[d]);
        gw_buf_addf(&b,
                    "# HELP ringlm_gateway_affinity_requests_total Requests sent to a daemon that "
                    "was given their prefix before.\n"
                    "# TYPE ringlm_gateway_affinity_requests_total counter\n"
                    "ringlm_gateway_affinity_requests_total %llu\n",
                    (unsigned long long)s->affinity_picks);
        gw_daemon_load dl[GW_MAX_DAEMONS];
        bool dup[GW_MAX_DAEMONS];
        gw_daemon_loads_locked(s, dl, dup);
        gw_buf_adds(&b, "# HELP ringlm_gateway_daemon_load Each daemon's load as the gateway "
                        "weighs it when it picks one, in requests: queued and running (the "
                        "daemon's count, or the gateway's requests there when more) plus its "
                        "device KV use (a full pool weighs 16).\n"
                        "# TYPE ringlm_gateway_daemon_load gauge\n");
        for (int d = 0; d < s->n_daemons; d++)
            gw_buf_addf(&b, "ringlm_gateway_daemon_load{daemon=\"%d\"} %zu\n", d,
                        gw_route_load(&dl[d]));
        gw_buf_adds(&b, "# HELP ringlm_gateway_daemon_kv_usage_perc Each daemon's device KV use "
                        "as it publishes it to its sessions (0..1).\n"
                        "# TYPE ringlm_gateway_daemon_kv_usage_perc gauge\n");
        for (int d = 0; d < s->n_daemons; d++)
            gw_buf_addf(&b, "ringlm_gateway_daemon_kv_usage_perc{daemon=\"%d\"} %.6f\n", d,
                        dl[d].kv_total ? (double)dl[d].kv_used / dl[d].kv_total : 0.0);
    }
    gw_buf_adds(&b, "# HELP ringlm_gateway_session_requests_in_flight Requests submitted on a "
                    "session and not finished.\n"
                    "# TYPE ringlm_gateway_session_requests_in_flight gauge\n");
    for (int i = 0; i < s->n_sess; i++)
        gw_buf_addf(&b, "ringlm_gateway_session_requests_in_flight{session=\"%d\"} %zu\n", i,
                    s->sess[i].n_inflight);
    pthread_mutex_unlock(&s->mu);
    if (!b.p) return MHD_NO;
    return gw_answer(r, c, 200, "text/plain; version=0.0.4", b.p);
}