/* SPDX-License-Identifier: MIT */
/*
 * ringlm-gateway end to end: a real ringlmd serving stories260K, a real gateway, curl as the
 * HTTP client (raw sockets where a client must misbehave).
 *   - greedy completion text through the gateway equals `ringlm generate`'s output;
 *   - streamed text equals the whole answer, chunks are JSON, the usage chunk comes before
 *     [DONE]; chat streams start with the assistant role;
 *   - errors in the OpenAI shape: 400 naming the field, 401, 404, 405, 413, 429 with
 *     Retry-After from the daemon's tenant quota;
 *   - the tenant comes from the API key, never from the body;
 *   - a client that hangs up mid-stream is cancelled and its KV blocks are freed;
 *   - a client that stalls mid-header is cut off, and nobody else notices;
 *   - /health follows the daemon; SIGTERM drains the gateway (a stream in flight completes)
 *     and the daemon (health turns 503, both exit 0).
 */
#include "tests/gateway_helpers.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "model/gguf_write.h"

TestSuite(gateway_e2e, .fini = gwh_stop_all, .timeout = 180);

static void setup(const char *const *gw_extra)
{
    gwh_need();
    gwh_need_curl();
    gwh_start_daemon(NULL);
    gwh_start_gateway(gw_extra);
    gwh_wait_healthy(10000); /* ready when the gateway's session is up */
}

static json_t *parse(const char *body)
{
    json_error_t e;
    json_t *j = json_loads(body, 0, &e);
    cr_assert(j, "not JSON (%s): %s", e.text, body);
    return j;
}

static const char *jpath_str(json_t *j, const char *a, const char *b)
{
    json_t *x = json_object_get(j, a);
    return json_string_value(b ? json_object_get(x, b) : x);
}

/* An SSE body: concatenated text, finish reason, usage (or NULL), count of [DONE]. */
typedef struct sse {
    char text[65536];
    char finish[32];
    json_t *usage;
    json_t *error;
    int chunks, done, role_chunks;
    bool usage_before_done;
} sse;

static void parse_sse(const char *body, bool chat, sse *o)
{
    memset(o, 0, sizeof *o);
    const char *p = body;
    while (p && *p) {
        const char *e = strstr(p, "\n\n");
        cr_assert(e, "an SSE event without its blank line: %s", p);
        cr_assert(!strncmp(p, "data: ", 6), "an SSE line that is not 'data: ': %.80s", p);
        char *d = strndup(p + 6, (size_t)(e - p - 6));
        if (!strcmp(d, "[DONE]")) {
            o->done++;
            cr_assert_eq(e[2], 0, "something after [DONE]: %s", e + 2);
        } else {
            cr_assert_eq(o->done, 0, "an event after [DONE]");
            json_t *j = parse(d);
            if (json_object_get(j, "error")) {
                o->error = json_incref(json_object_get(j, "error"));
            } else {
                o->chunks++;
                json_t *u = json_object_get(j, "usage");
                if (u && !json_is_null(u)) {
                    o->usage = json_incref(u);
                    o->usage_before_done = true;
                }
                json_t *c = json_array_get(json_object_get(j, "choices"), 0);
                if (c) {
                    const char *t =
                        chat ? jpath_str(c, "delta", "content") : jpath_str(c, "text", NULL);
                    if (chat && jpath_str(c, "delta", "role")) o->role_chunks++;
                    if (t) strncat(o->text, t, sizeof o->text - strlen(o->text) - 1);
                    const char *f = jpath_str(c, "finish_reason", NULL);
                    if (f) snprintf(o->finish, sizeof o->finish, "%s", f);
                }
            }
            json_decref(j);
        }
        free(d);
        p = e + 2;
    }
}

/* ---- text equals ringlm generate ----------------------------------------------------- */

Test(gateway_e2e, greedy_completion_equals_ringlm_generate)
{
    setup(NULL);
    char *ringlm = th_path(th_bin_dir(), "ringlm");
    char *tok = th_path(th_shared_dir(), "models/tok512.bin");
    const char *prompts[] = {"Once upon a time", "Lily wanted to", "The cat", ""};
    const int max_tokens[] = {60, 200, 400, 30};
    for (size_t i = 0; i < sizeof prompts / sizeof *prompts; i++) {
        char mt[16];
        snprintf(mt, sizeof mt, "%d", max_tokens[i]);
        char *argv[] = {ringlm,
                        "--socket",
                        gwh_daemon.sock,
                        "generate",
                        "--prompt",
                        (char *)prompts[i],
                        "--tokenizer",
                        tok,
                        "--max-tokens",
                        mt,
                        "--temperature",
                        "0",
                        "--class",
                        "chat",
                        NULL};
        char *want, *err;
        cr_assert_eq(th_run(argv, &want, &err, 60), 0, "ringlm generate: %s", err);

        json_t *req = json_pack("{s:s, s:s, s:i, s:i}", "model", "stories", "prompt", prompts[i],
                                "max_tokens", max_tokens[i], "temperature", 0);
        char *body = json_dumps(req, 0);
        gwh_resp r = gwh_curl("/v1/completions", NULL, body);
        cr_assert_eq(r.status, 200, "%s", r.body);
        json_t *j = parse(r.body);
        json_t *c = json_array_get(json_object_get(j, "choices"), 0);
        const char *text = jpath_str(c, "text", NULL);
        const char *finish = jpath_str(c, "finish_reason", NULL);
        cr_assert(text && finish);
        /* generate prints the prompt as decoded, the text, then a newline: the prompt part is
		 * what /detokenize gives for /tokenize's ids. */
        json_t *tq = json_pack("{s:s}", "prompt", prompts[i]);
        char *tb = json_dumps(tq, 0);
        gwh_resp tr = gwh_curl("/tokenize", NULL, tb);
        cr_assert_eq(tr.status, 200, "%s", tr.body);
        json_t *tj = parse(tr.body);
        json_t *dq = json_pack("{s:O}", "tokens", json_object_get(tj, "tokens"));
        char *db = json_dumps(dq, 0);
        gwh_resp dr = gwh_curl("/detokenize", NULL, db);
        json_t *dj = parse(dr.body);
        char *expect;
        cr_assert(asprintf(&expect, "%s%s\n", jpath_str(dj, "prompt", NULL), text) > 0);
        cr_assert_str_eq(
            expect, want,
            "prompt '%s': gateway text + prompt\n  %s\ndiffers from ringlm generate\n  %s",
            prompts[i], expect, want);
        json_t *u = json_object_get(j, "usage");
        int n_prompt = (int)json_integer_value(json_object_get(tj, "count"));
        cr_assert_eq(json_integer_value(json_object_get(u, "prompt_tokens")), n_prompt);
        int gen = (int)json_integer_value(json_object_get(u, "completion_tokens"));
        if (!strcmp(finish, "length"))
            cr_assert_eq(gen, max_tokens[i]);
        else
            cr_assert(!strcmp(finish, "stop") && gen < max_tokens[i], "finish %s after %d", finish,
                      gen);

        /* The same request streamed: the same text, piece by piece. */
        json_object_set_new(req, "stream", json_true());
        char *sbody = json_dumps(req, 0);
        gwh_resp sr = gwh_curl("/v1/completions", NULL, sbody);
        cr_assert_eq(sr.status, 200, "%s", sr.body);
        cr_assert(strstr(sr.head, "text/event-stream"), "%s", sr.head);
        sse s;
        parse_sse(sr.body, false, &s);
        cr_assert_str_eq(s.text, text, "streamed text differs from the whole answer");
        cr_assert_str_eq(s.finish, finish);
        cr_assert_eq(s.done, 1);
        cr_assert_null(s.usage, "usage only when stream_options.include_usage");

        free(expect);
        json_decref(j);
        json_decref(tq);
        json_decref(tj);
        json_decref(dq);
        json_decref(dj);
        json_decref(req);
        free(body);
        free(sbody);
        free(tb);
        free(db);
        gwh_resp_free(&r);
        gwh_resp_free(&sr);
        gwh_resp_free(&tr);
        gwh_resp_free(&dr);
        free(want);
        free(err);
    }
    free(ringlm);
    free(tok);
}

/* ---- streaming shapes ---------------------------------------------------------------- */

Test(gateway_e2e, stream_usage_chunk_comes_before_done)
{
    setup(NULL);
    gwh_resp r = gwh_curl(
        "/v1/completions", NULL,
        "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0,\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true}}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    sse s;
    parse_sse(r.body, false, &s);
    cr_assert_eq(s.done, 1);
    cr_assert_str_eq(s.finish, "length");
    cr_assert(s.usage_before_done && s.usage, "no usage chunk: %s", r.body);
    cr_assert_eq(json_integer_value(json_object_get(s.usage, "prompt_tokens")), 5);
    cr_assert_eq(json_integer_value(json_object_get(s.usage, "completion_tokens")), 12);
    cr_assert_eq(json_integer_value(json_object_get(s.usage, "total_tokens")), 17);
    /* The usage chunk has no choices. */
    const char *last = strstr(r.body, "\"usage\"");
    cr_assert(last && strstr(r.body, "\"choices\":[],\"usage\""), "%s", r.body);
    json_decref(s.usage);
    gwh_resp_free(&r);
}

/* usage.prompt_tokens_details.cached_tokens (OpenAI's field, which vLLM fills): the prompt
 * tokens ringlmd's prefix cache served, whole and streamed, completions and chat. The same
 * prompt sent again finds its full 16-token blocks; each count is what the daemon's request
 * log says for that request. */
static long long usage_cached(json_t *usage)
{
    json_t *d = json_object_get(usage, "prompt_tokens_details");
    cr_assert(json_is_object(d), "usage without prompt_tokens_details");
    json_t *c = json_object_get(d, "cached_tokens");
    cr_assert(json_is_integer(c), "prompt_tokens_details without cached_tokens");
    return (long long)json_integer_value(c);
}

Test(gateway_e2e, usage_reports_the_prompt_tokens_the_prefix_cache_served)
{
    gwh_need();
    gwh_need_curl();
    char *reqlog = th_path(gwh_dir(), "requests.jsonl");
    const char *dextra[] = {"--request-log", reqlog, NULL};
    gwh_start_daemon(dextra);
    gwh_start_gateway(NULL);
    gwh_wait_healthy(10000);

    char ids[256] = "1";
    for (int k = 1; k < 40; k++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), ",%d", 3 + (17 * k) % 400);
    char completion[512], chat[512];
    snprintf(completion, sizeof completion, "{\"prompt\":[%s],\"max_tokens\":4,\"temperature\":0",
             ids);
    snprintf(
        chat, sizeof chat,
        "{\"messages\":[{\"role\":\"system\",\"content\":\"Once upon a time there was a little "
        "girl named "
        "Lily. She loved to play outside in the sunshine with her big brown dog.\"},"
        "{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"max_tokens\":4,\"temperature\":0");
    static const char *const stream_tail =
        ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
    struct {
        const char *path, *body;
        bool chat, stream;
    } calls[] = {
        {"/v1/completions", completion, false, false},
        {"/v1/completions", completion, false, false},
        {"/v1/completions", completion, false, true},
        {"/v1/chat/completions", chat, true, false},
        {"/v1/chat/completions", chat, true, true},
    };
    enum { N = sizeof calls / sizeof *calls };
    long long cached[N], prompt_tokens[N];
    for (int i = 0; i < N; i++) {
        char body[1024];
        snprintf(body, sizeof body, "%s%s", calls[i].body, calls[i].stream ? stream_tail : "}");
        gwh_resp r = gwh_curl(calls[i].path, NULL, body);
        cr_assert_eq(r.status, 200, "call %d: %s", i, r.body);
        json_t *usage;
        if (calls[i].stream) {
            sse s;
            parse_sse(r.body, calls[i].chat, &s);
            cr_assert(s.usage, "call %d: no usage chunk: %s", i, r.body);
            usage = s.usage;
        } else {
            json_t *j = parse(r.body);
            usage = json_incref(json_object_get(j, "usage"));
            json_decref(j);
        }
        cached[i] = usage_cached(usage);
        prompt_tokens[i] = (long long)json_integer_value(json_object_get(usage, "prompt_tokens"));
        json_decref(usage);
        gwh_resp_free(&r);
    }
    /* the first of each prompt finds nothing; again, its full blocks (16 tokens each) */
    cr_expect_eq(cached[0], 0, "first completion: %lld cached", cached[0]);
    cr_expect_eq(cached[3], 0, "first chat: %lld cached", cached[3]);
    for (int i = 1; i < N; i++) {
        if (i == 3) continue;
        cr_expect_eq(cached[i], prompt_tokens[i] / 16 * 16,
                     "call %d: %lld of %lld prompt tokens cached", i, cached[i], prompt_tokens[i]);
        cr_expect_gt(cached[i], 0, "call %d", i);
    }

    /* the daemon's own count, request by request (its log is complete once it exited) */
    cr_assert_eq(th_proc_stop(&gwh_gateway, SIGTERM, 10000), 0);
    cr_assert_eq(th_daemon_stop(&gwh_daemon, SIGTERM, 15000), 0);
    char *log = th_read_file(reqlog);
    long long req[N], logged[N];
    int n = 0;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        cr_assert_lt(n, N, "more request log lines than requests:\n%s", line);
        json_t *j = parse(line);
        req[n] = (long long)json_integer_value(json_object_get(j, "req"));
        logged[n] = (long long)json_integer_value(json_object_get(j, "cached_tokens"));
        json_decref(j);
        n++;
    }
    cr_assert_eq(n, N, "request log lines: %d", n);
    for (int i = 0; i < N; i++) {
        int rank = 0; /* sent one after another: the daemon's ids ascend in that order */
        for (int k = 0; k < N; k++) rank += req[k] < req[i];
        cr_expect_eq(logged[i], cached[rank],
                     "call %d: the daemon logged %lld cached tokens, the usage said %lld", rank,
                     logged[i], cached[rank]);
    }
    free(log);
    free(reqlog);
}

Test(gateway_e2e, chat_streams_role_then_content_and_matches_the_whole_answer)
{
    setup(NULL);
    const char *req = "{\"model\":\"stories\",\"messages\":[{\"role\":\"user\",\"content\":\"Once "
                      "upon a time\"}],"
                      "\"max_tokens\":40,\"temperature\":0%s}";
    char whole_b[512], stream_b[512], compl_b[256];
    snprintf(whole_b, sizeof whole_b, req, "");
    snprintf(stream_b, sizeof stream_b, req, ",\"stream\":true");
    gwh_resp w = gwh_curl("/v1/chat/completions", NULL, whole_b);
    cr_assert_eq(w.status, 200, "%s", w.body);
    json_t *j = parse(w.body);
    cr_assert_str_eq(jpath_str(j, "object", NULL), "chat.completion");
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(c, "message");
    cr_assert_str_eq(jpath_str(msg, "role", NULL), "assistant");
    const char *content = jpath_str(msg, "content", NULL);
    cr_assert(content && strlen(content) > 10, "%s", w.body);

    gwh_resp s = gwh_curl("/v1/chat/completions", NULL, stream_b);
    cr_assert_eq(s.status, 200, "%s", s.body);
    sse e;
    parse_sse(s.body, true, &e);
    cr_assert_eq(e.role_chunks, 1, "one role chunk first");
    cr_assert(strstr(s.body, "chat.completion.chunk"));
    cr_assert_str_eq(e.text, content);
    cr_assert_str_eq(e.finish, jpath_str(c, "finish_reason", NULL));
    cr_assert_eq(e.done, 1);

    /* With the plain template the chat is the completion of the message's text. */
    snprintf(compl_b, sizeof compl_b,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0}");
    gwh_resp p = gwh_curl("/v1/completions", NULL, compl_b);
    json_t *pj = parse(p.body);
    cr_assert_str_eq(jpath_str(json_array_get(json_object_get(pj, "choices"), 0), "text", NULL),
                     content);
    json_decref(j);
    json_decref(pj);
    gwh_resp_free(&w);
    gwh_resp_free(&s);
    gwh_resp_free(&p);
}

/* --reasoning-parser deepseek_r1: a chat answer comes back as reasoning_content up to
 * </think> (a story model never writes one, so all of it is reasoning and content is null),
 * and streamed as delta.reasoning_content; the text is the answer the plain chat gives. */
Test(gateway_e2e, reasoning_parser_returns_reasoning_content)
{
    const char *extra[] = {"--reasoning-parser", "deepseek_r1", NULL};
    setup(extra);
    const char *req = "{\"model\":\"stories\",\"messages\":[{\"role\":\"user\",\"content\":\"Once "
                      "upon a time\"}],\"max_tokens\":24,\"temperature\":0%s}";
    char whole_b[512], stream_b[512];
    snprintf(whole_b, sizeof whole_b, req, "");
    snprintf(stream_b, sizeof stream_b, req, ",\"stream\":true");
    gwh_resp w = gwh_curl("/v1/chat/completions", NULL, whole_b);
    cr_assert_eq(w.status, 200, "%s", w.body);
    json_t *j = parse(w.body);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    const char *reasoning = jpath_str(msg, "reasoning_content", NULL);
    cr_assert(reasoning && strlen(reasoning) > 10, "%s", w.body);
    cr_assert(json_is_null(json_object_get(msg, "content")), "%s", w.body);
    gwh_resp s = gwh_curl("/v1/chat/completions", NULL, stream_b);
    cr_assert_eq(s.status, 200, "%s", s.body);
    /* every piece of the streamed text is a delta.reasoning_content; joined, the answer */
    json_t *joined = json_string("");
    for (const char *p = strstr(s.body, "data: {"); p; p = strstr(p + 1, "data: {")) {
        json_t *chunk = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        cr_assert_not_null(chunk, "%s", p);
        json_t *d = json_object_get(json_array_get(json_object_get(chunk, "choices"), 0), "delta");
        const char *c = json_string_value(json_object_get(d, "content"));
        cr_assert(!c || !*c, "content in a reasoning stream: %s", p);
        const char *r = json_string_value(json_object_get(d, "reasoning_content"));
        if (r) {
            char *cat = NULL;
            cr_assert(asprintf(&cat, "%s%s", json_string_value(joined), r) > 0);
            json_string_set(joined, cat);
            free(cat);
        }
        json_decref(chunk);
    }
    cr_assert_str_eq(json_string_value(joined), reasoning);
    json_decref(joined);
    json_decref(j);
    gwh_resp_free(&w);
    gwh_resp_free(&s);
}

Test(gateway_e2e, stop_strings_cut_the_text_in_both_modes)
{
    setup(NULL);
    gwh_resp full =
        gwh_curl("/v1/completions", NULL,
                 "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0}");
    json_t *fj = parse(full.body);
    const char *ft = jpath_str(json_array_get(json_object_get(fj, "choices"), 0), "text", NULL);
    const char *cut = strstr(ft, "Lily");
    cr_assert(cut, "the greedy text has no 'Lily' to stop at: %s", ft);
    size_t keep = (size_t)(cut - ft);
    for (int stream = 0; stream < 2; stream++) {
        char b[256];
        snprintf(b, sizeof b,
                 "{\"prompt\":\"Once upon a "
                 "time\",\"max_tokens\":60,\"temperature\":0,\"stop\":[\"zzz\",\"Lily\"],"
                 "\"stream\":%s}",
                 stream ? "true" : "false");
        gwh_resp r = gwh_curl("/v1/completions", NULL, b);
        cr_assert_eq(r.status, 200, "%s", r.body);
        const char *text, *finish;
        sse s;
        json_t *j = NULL;
        if (stream) {
            parse_sse(r.body, false, &s);
            text = s.text;
            finish = s.finish;
        } else {
            j = parse(r.body);
            json_t *c = json_array_get(json_object_get(j, "choices"), 0);
            text = jpath_str(c, "text", NULL);
            finish = jpath_str(c, "finish_reason", NULL);
        }
        cr_assert_eq(strlen(text), keep, "stream=%d: '%s' is not the text before 'Lily'", stream,
                     text);
        cr_assert(!strncmp(text, ft, keep));
        cr_assert_str_eq(finish, "stop");
        json_decref(j);
        gwh_resp_free(&r);
    }
    json_decref(fj);
    gwh_resp_free(&full);
}

/* ---- errors ------------------------------------------------------------------------- */

static void expect_error(const char *path, const char *key, const char *body, int status,
                         const char *param, const char *code)
{
    gwh_resp r = gwh_curl(path, key, body);
    cr_assert_eq(r.status, status, "%s %s: %d %s", path, body ? body : "(GET)", r.status, r.body);
    json_t *j = parse(r.body);
    json_t *e = json_object_get(j, "error");
    cr_assert(json_is_string(json_object_get(e, "message")) &&
                  json_is_string(json_object_get(e, "type")),
              "not an OpenAI error: %s", r.body);
    cr_assert(json_object_get(e, "param") && json_object_get(e, "code"), "%s", r.body);
    if (param) cr_assert_str_eq(jpath_str(e, "param", NULL), param, "%s", r.body);
    if (code) cr_assert_str_eq(jpath_str(e, "code", NULL), code, "%s", r.body);
    if (status == 429)
        cr_assert(strstr(r.head, "Retry-After: "), "429 without Retry-After: %s", r.head);
    json_decref(j);
    gwh_resp_free(&r);
}

Test(gateway_e2e, bad_requests_get_openai_errors)
{
    setup(NULL);
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\",\"n\":0}", 400, "n", "invalid_value");
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\",\"n\":300}", 400, "n",
                 "invalid_value");
    /* past the daemon's --max-n (16): the library knows it from the handshake */
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\",\"n\":17}", 400, "n", "invalid_value");
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\",\"n\":3,\"best_of\":2}", 400,
                 "best_of", "invalid_value");
    expect_error("/v1/completions", NULL,
                 "{\"prompt\":\"x\",\"n\":1,\"best_of\":2,\"stream\":true}", 400, "best_of", NULL);
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\",\"top_k\":\"big\"}", 400, "top_k",
                 NULL);
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\",\"max_tokens\":", 400, NULL,
                 "invalid_json");
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\",\"logprobs\":21}", 400, "logprobs",
                 "invalid_value");
    expect_error("/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
                 "\"top_logprobs\":21}",
                 400, "top_logprobs", "invalid_value");
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens",
                 "invalid_value");
    expect_error("/v1/completions", NULL, "{\"prompt\":[1,2,4096]}", 400, "prompt", "bad_token");
    expect_error("/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"user\"}],\"stream\":\"yes\"}", 400, "stream", NULL);
    /* The daemon's own rejects: too long for the context, a class not in its policy. */
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\",\"max_tokens\":600}", 400, NULL,
                 "too_long");
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\",\"ringlm\":{\"class\":\"gold\"}}", 400,
                 NULL, "unknown_class");
    /* ... also when streaming was asked: the failure comes before any token. */
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\",\"max_tokens\":600,\"stream\":true}",
                 400, NULL, "too_long");
    expect_error("/v1/completions", NULL, "{\"model\":\"gpt-4o\",\"prompt\":\"x\"}", 404, "model",
                 "model_not_found");
    expect_error("/v1/nothing", NULL, NULL, 404, NULL, NULL);
    expect_error("/v1/completions", NULL, NULL, 405, NULL, NULL);
    /* And the gateway still serves. */
    gwh_resp ok = gwh_curl("/v1/completions", NULL, "{\"prompt\":\"x\",\"max_tokens\":2}");
    cr_assert_eq(ok.status, 200, "%s", ok.body);
    gwh_resp_free(&ok);
}

/* ---- the one parameter check, and ignore_eos ----------------------------------------- */

/* Every range is the one check's (ringlm_request_check, which the library and ringlmd apply
 * too): just outside each bound is a 400 invalid_value naming the body's field. */
Test(gateway_e2e, each_parameter_bound_is_a_400_naming_its_field)
{
    setup(NULL);
    static const struct {
        const char *body, *param;
    } cases[] = {
        {"{\"prompt\":\"x\",\"temperature\":-0.5}", "temperature"},
        {"{\"prompt\":\"x\",\"temperature\":100.5}", "temperature"},
        {"{\"prompt\":\"x\",\"top_p\":0}", "top_p"},
        {"{\"prompt\":\"x\",\"top_p\":1.01}", "top_p"},
        {"{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens"},
        {"{\"prompt\":\"x\",\"max_tokens\":268435456}", "max_tokens"},
        {"{\"prompt\":\"x\",\"ringlm\":{\"deadline_ms\":31536000001}}", "ringlm.deadline_ms"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":101}",
         "temperature"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path =
            strstr(cases[i].body, "messages") ? "/v1/chat/completions" : "/v1/completions";
        expect_error(path, NULL, cases[i].body, 400, cases[i].param, "invalid_value");
    }
    /* The edges are inside the ranges: served. */
    gwh_resp ok = gwh_curl("/v1/completions", NULL,
                           "{\"prompt\":\"x\",\"max_tokens\":2,\"temperature\":100,\"top_p\":1,"
                           "\"ringlm\":{\"deadline_ms\":31536000000}}");
    cr_assert_eq(ok.status, 200, "%s", ok.body);
    gwh_resp_free(&ok);
}

/* ignore_eos (vLLM's): a greedy completion that stops on the stop token before max_tokens
 * runs to exactly max_tokens with it, finish_reason "length", its text starting with the
 * stopped one. */
Test(gateway_e2e, ignore_eos_runs_to_max_tokens_past_the_stop_token)
{
    setup(NULL);
    const char *prompts[] = {"The cat", "Once upon a time", "Lily wanted to", "Tom had a"};
    char body[256];
    for (size_t i = 0; i < sizeof prompts / sizeof *prompts; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":300,\"temperature\":0}",
                 prompts[i]);
        gwh_resp plain = gwh_curl("/v1/completions", NULL, body);
        cr_assert_eq(plain.status, 200, "%s", plain.body);
        json_t *pj = parse(plain.body);
        json_t *pc = json_array_get(json_object_get(pj, "choices"), 0);
        long long plain_tokens =
            json_integer_value(json_object_get(json_object_get(pj, "usage"), "completion_tokens"));
        if (strcmp(jpath_str(pc, "finish_reason", NULL), "stop") || plain_tokens >= 300) {
            json_decref(pj);
            gwh_resp_free(&plain);
            continue; /* this prompt does not stop early: try the next */
        }
        snprintf(body, sizeof body,
                 "{\"prompt\":\"%s\",\"max_tokens\":300,\"temperature\":0,\"ignore_eos\":true}",
                 prompts[i]);
        gwh_resp fixed = gwh_curl("/v1/completions", NULL, body);
        cr_assert_eq(fixed.status, 200, "ignore_eos: %s", fixed.body);
        json_t *fj = parse(fixed.body);
        json_t *fc = json_array_get(json_object_get(fj, "choices"), 0);
        cr_expect_str_eq(jpath_str(fc, "finish_reason", NULL), "length", "%s", fixed.body);
        cr_expect_eq(
            json_integer_value(json_object_get(json_object_get(fj, "usage"), "completion_tokens")),
            300, "%s", fixed.body);
        const char *pt = jpath_str(pc, "text", NULL), *ft = jpath_str(fc, "text", NULL);
        cr_expect(!strncmp(ft, pt, strlen(pt)), "'%s' does not start with the stopped '%s'", ft,
                  pt);
        cr_expect_gt(strlen(ft), strlen(pt));
        json_decref(fj);
        json_decref(pj);
        gwh_resp_free(&fixed);
        gwh_resp_free(&plain);
        return;
    }
    cr_assert_fail("no prompt's greedy completion stops before 300 tokens");
}

/* A 64 KiB body limit: over it 413 (the whole body is refused, nothing kept), under it served. */
static const char *const small_body[] = {"--max-body-bytes", "65536", NULL};

Test(gateway_e2e, body_limit_is_configurable)
{
    setup(small_body);
    char *b = malloc(70100);
    int k = snprintf(b, 64, "{\"prompt\":\"");
    memset(b + k, 'a', 70000);
    strcpy(b + k + 70000, "\"}");
    expect_error("/v1/completions", NULL, b, 413, NULL, "body_too_large");
    b[k + 1000] = 0;
    strcat(b, "\",\"max_tokens\":1}");
    gwh_resp r = gwh_curl("/tokenize", NULL, b);
    cr_assert_eq(r.status, 200, "a 1 KiB body passes the limit: %s", r.body);
    gwh_resp_free(&r);
    free(b);
    /* A chunked body announces no length: it is refused as it grows past the limit. */
    int fd = gwh_connect();
    const char *head =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    th_send_all(fd, head, strlen(head));
    static char chunk[8192 + 16];
    int n = snprintf(chunk, sizeof chunk, "2000\r\n");
    memset(chunk + n, 'a', 8192);
    memcpy(chunk + n + 8192, "\r\n", 2);
    for (int i = 0; i < 10; i++) th_send_all(fd, chunk, (size_t)n + 8192 + 2); /* 80 KiB */
    th_send_all(fd, "0\r\n\r\n", 5);
    bool eof;
    char *got = th_read_until(fd, "body_too_large", 20000, &eof);
    cr_assert(!strncmp(got, "HTTP/1.1 413", 12) && strstr(got, "body_too_large"),
              "a chunked 80 KiB body: %s", got);
    free(got);
    close(fd);
}

/* ---- keys and tenants --------------------------------------------------------------- */

Test(gateway_e2e, api_keys_decide_the_tenant_never_the_body)
{
    char *keys = gwh_keys();
    const char *extra[] = {"--api-keys", keys, NULL};
    setup(extra);
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\"}", 401, NULL, "invalid_api_key");
    expect_error("/v1/completions", "sk-mallory-01", "{\"prompt\":\"x\"}", 401, NULL,
                 "invalid_api_key");
    expect_error("/v1/models", "sk-mallory-01", NULL, 401, NULL, NULL);
    gwh_resp h = gwh_curl("/health", NULL, NULL);
    cr_assert_eq(h.status, 200, "health needs no key");
    gwh_resp_free(&h);
    gwh_resp m = gwh_curl("/v1/models", "sk-alice-0001", NULL);
    cr_assert_eq(m.status, 200, "%s", m.body);
    json_t *mj = parse(m.body);
    cr_assert_str_eq(jpath_str(json_array_get(json_object_get(mj, "data"), 0), "id", NULL),
                     "stories");
    json_decref(mj);
    gwh_resp_free(&m);

    /* tiny's quota (4 queued prompt tokens) refuses a 7-token prompt: 429 + Retry-After. */
    expect_error("/v1/completions", "sk-tiny-00001", "{\"prompt\":\"Once upon a time there was\"}",
                 429, NULL, "tenant_quota");
    /* alice names tiny in the body: refused, naming the field; as "user" (which is not
     * read): she is served as alice. */
    expect_error("/v1/completions", "sk-alice-0001",
                 "{\"prompt\":\"Once upon a time there was\",\"max_tokens\":3,\"tenant\":\"tiny\"}",
                 400, "tenant", "unsupported");
    expect_error("/v1/completions", "sk-alice-0001",
                 "{\"prompt\":\"Once upon a time there was\",\"max_tokens\":3,"
                 "\"ringlm\":{\"tenant\":\"tiny\"}}",
                 400, "ringlm", "unsupported");
    for (int i = 0; i < 3; i++) {
        gwh_resp r = gwh_curl("/v1/completions", "sk-alice-0001",
                              "{\"prompt\":\"Once upon a time there was\",\"max_tokens\":3,"
                              "\"user\":\"tiny\"}");
        cr_assert_eq(r.status, 200, "%s", r.body);
        gwh_resp_free(&r);
    }
    /* bob's key carries class batch. */
    gwh_resp b =
        gwh_curl("/v1/completions", "sk-bob-00001", "{\"prompt\":\"Once\",\"max_tokens\":2}");
    cr_assert_eq(b.status, 200, "%s", b.body);
    gwh_resp_free(&b);
    char *mx = gwh_daemon_metrics();
    cr_assert_eq(
        gwh_metric(
            mx,
            "ringlm_requests_finished_total{tenant=\"alice\",class=\"chat\",reason=\"length\"}"),
        3, "%s", mx);
    cr_assert_eq(
        gwh_metric(
            mx,
            "ringlm_requests_finished_total{tenant=\"tiny\",class=\"chat\",reason=\"rejected\"}"),
        1, "only the tiny key's own request counts under tiny");
    cr_assert_eq(
        gwh_metric(
            mx, "ringlm_requests_finished_total{tenant=\"tiny\",class=\"chat\",reason=\"length\"}"),
        0);
    cr_assert_eq(
        gwh_metric(
            mx, "ringlm_requests_finished_total{tenant=\"bob\",class=\"batch\",reason=\"length\"}"),
        1);
    free(mx);
    free(keys);
}

/* ---- misbehaving clients ------------------------------------------------------------ */

Test(gateway_e2e, disconnect_mid_stream_cancels_and_frees_blocks)
{
    char *keys = gwh_keys();
    const char *extra[] = {"--api-keys", keys, NULL};
    char *declog = th_path(gwh_dir(), "decisions.jsonl");
    const char *dextra[] = {"--decision-log", declog, GWH_DAEMON_BELOW_CLIENTS, NULL};
    gwh_need();
    gwh_need_curl();
    gwh_start_daemon(dextra);
    gwh_start_gateway(extra);
    gwh_wait_healthy(10000);
    for (int round = 0; round < 3; round++) {
        int fd = gwh_connect();
        gwh_send_post(fd, "/v1/completions", "sk-bob-00001",
                      "{\"prompt\":\"Once upon a "
                      "time\",\"max_tokens\":500,\"temperature\":0.8,\"seed\":1,\"stream\":true}");
        bool eof;
        char *got = th_read_until(fd, "data: {", 20000, &eof);
        cr_assert(strstr(got, "data: {"), "no first chunk: %s", got);
        free(got);
        close(fd); /* hang up mid-stream */
    }
    /* Each request is cancelled by the daemon (not finished at its length) and its blocks
	 * return to the pool. */
    uint64_t dl = th_now_ms() + 20000;
    char *mx = NULL;
    for (;;) {
        free(mx);
        mx = gwh_daemon_metrics();
        double fin =
            gwh_metric(mx, "ringlm_requests_finished_total{tenant=\"bob\",class=\"batch\",reason="
                           "\"cancelled\"}") +
            gwh_metric(mx, "ringlm_requests_finished_total{tenant=\"bob\",class=\"batch\",reason="
                           "\"length\"}") +
            gwh_metric(
                mx,
                "ringlm_requests_finished_total{tenant=\"bob\",class=\"batch\",reason=\"stop\"}");
        if (fin >= 3 && gwh_metric(mx, "ringlm_kv_blocks_used{tier=\"device\"}") == 0) break;
        cr_assert(th_now_ms() < dl, "requests not ended / blocks not freed after 20 s:\n%s", mx);
        th_pause_ms(10);
    }
    cr_assert_eq(
        gwh_metric(
            mx,
            "ringlm_requests_finished_total{tenant=\"bob\",class=\"batch\",reason=\"cancelled\"}"),
        3, "every hung-up stream is cancelled, none runs to its length:\n%s", mx);
    free(mx);
    /* Within one iteration: in the decision log (written when the daemon drains at SIGTERM),
	 * each cancelled request's blocks are released at the cancel's own t_us (the loop reads
	 * its clock once per iteration), and no decision gives it work afterwards. */
    cr_assert_eq(th_daemon_stop(&gwh_daemon, SIGTERM, 15000), 0);
    char *log = th_read_file(declog);
    static long long cancel_t[4096];
    int n_cancel = 0, n_release = 0, late = 0, after = 0;
    for (char *line = log; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        const char *rq = strstr(line, "\"req\":"), *tq = strstr(line, "\"t_us\":");
        long id = rq ? strtol(rq + 6, NULL, 10) : -1;
        long long ts = tq ? strtoll(tq + 7, NULL, 10) : -1;
        if (id > 0 && id < 4096) {
            if (strstr(line, "\"ev\":\"cancel\"")) {
                cancel_t[id] = ts;
                n_cancel++;
            } else if (cancel_t[id] && strstr(line, "\"ev\":\"release\"")) {
                n_release++;
                late += ts != cancel_t[id];
            } else if (cancel_t[id] && strstr(line, "\"ev\":\"schedule\"")) {
                after++;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    cr_assert_eq(n_cancel, 3, "%d cancels in the decision log:\n%.2000s", n_cancel, log);
    cr_assert_geq(n_release, 3, "%d releases of the 3 cancelled requests", n_release);
    cr_assert_eq(late, 0, "%d releases came in a later iteration than their cancel", late);
    cr_assert_eq(after, 0, "%d decisions gave work to a cancelled request", after);
    free(log);
    free(declog);
    free(keys);
}

Test(gateway_e2e, a_client_stalling_mid_header_is_cut_off_and_others_are_served)
{
    const char *extra[] = {"--http-timeout-s", "1", NULL};
    setup(extra);
    int fd = gwh_connect();
    const char *partial = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le";
    th_send_all(fd, partial, strlen(partial));
    uint64_t t0 = th_now_ms();
    /* Meanwhile a well-behaved client is served. */
    gwh_resp r = gwh_curl("/v1/completions", NULL, "{\"prompt\":\"Once\",\"max_tokens\":4}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    gwh_resp_free(&r);
    bool eof;
    char *got = th_read_until(fd, NULL, 10000, &eof);
    uint64_t dt = th_now_ms() - t0;
    cr_assert(eof, "the stalled connection is still open after 10 s");
    cr_assert(dt >= 500, "closed after %llu ms, before the 1 s timeout", (unsigned long long)dt);
    free(got);
    close(fd);

    /* A body that stops halfway is cut off the same way. */
    fd = gwh_connect();
    const char *head =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":";
    th_send_all(fd, head, strlen(head));
    got = th_read_until(fd, NULL, 10000, &eof);
    cr_assert(eof, "a half body is still waited for after 10 s");
    free(got);
    close(fd);
}

/* ---- health and drain --------------------------------------------------------------- */

Test(gateway_e2e, health_waits_for_the_daemon)
{
    gwh_need();
    gwh_need_curl();
    gwh_dir();
    gwh_start_gateway(NULL); /* no daemon yet */
    gwh_resp h = gwh_curl("/health", NULL, NULL);
    cr_assert_eq(h.status, 503, "%s", h.body);
    gwh_resp_free(&h);
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\"}", 503, NULL, "daemon_unavailable");
    gwh_start_daemon(NULL);
    uint64_t dl = th_now_ms() + 10000;
    for (;;) {
        h = gwh_curl("/health", NULL, NULL);
        int st = h.status;
        gwh_resp_free(&h);
        if (st == 200) break;
        cr_assert(th_now_ms() < dl, "/health not 200 10 s after the daemon started");
        th_pause_ms(20);
    }
    gwh_resp r = gwh_curl("/v1/completions", NULL, "{\"prompt\":\"Once\",\"max_tokens\":3}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    gwh_resp_free(&r);
}

Test(gateway_e2e, sigterm_drains_the_gateway_and_a_stream_in_flight_completes)
{
    setup(NULL);
    int fd = gwh_connect();
    gwh_send_post(fd, "/v1/completions", NULL,
                  "{\"prompt\":\"Once upon a "
                  "time\",\"max_tokens\":400,\"temperature\":0.8,\"seed\":3,\"stream\":true}");
    bool eof;
    char *got = th_read_until(fd, "data: {", 20000, &eof);
    cr_assert(strstr(got, "data: {"), "%s", got);
    kill(gwh_gateway.pid, SIGTERM);
    char *rest = th_read_until(fd, "data: [DONE]", 30000, &eof);
    cr_assert(strstr(rest, "data: [DONE]") || strstr(got, "data: [DONE]"),
              "the stream did not complete: %s", rest);
    cr_assert_null(strstr(rest, "\"error\""), "%s", rest);
    int rc = th_proc_wait(&gwh_gateway, 15000);
    cr_assert_eq(rc, 0, "the gateway exited %d after SIGTERM: %s", rc,
                 th_read_file(gwh_gateway.log));
    char *log = th_read_file(gwh_gateway.log);
    cr_assert(strstr(log, "drained"), "%s", log);
    free(log);
    free(got);
    free(rest);
    close(fd);
}

Test(gateway_e2e, daemon_sigterm_turns_health_503_and_both_exit_cleanly)
{
    setup(NULL);
    /* A stream in flight when ringlmd is told to stop: the daemon drains it (its grace is
	 * 5 s), the gateway delivers it whole. */
    int fd = gwh_connect();
    gwh_send_post(fd, "/v1/completions", NULL,
                  "{\"prompt\":\"Once upon a "
                  "time\",\"max_tokens\":200,\"temperature\":0.8,\"seed\":5,\"stream\":true}");
    bool eof;
    char *got = th_read_until(fd, "data: {", 20000, &eof);
    cr_assert(strstr(got, "data: {"), "no first chunk: %s", got);
    cr_assert_eq(kill(gwh_daemon.pid, SIGTERM), 0);
    char *rest = th_read_until(fd, "data: [DONE]", 30000, &eof);
    cr_assert(strstr(rest, "data: [DONE]") || strstr(got, "data: [DONE]"),
              "the stream did not complete: %s", rest);
    cr_assert_null(strstr(rest, "\"error\""),
                   "the stream in flight failed at the daemon's drain: %s", rest);
    cr_assert(strstr(rest, "\"finish_reason\":\"length\"") ||
                  strstr(rest, "\"finish_reason\":\"stop\""),
              "%s", rest);
    free(got);
    free(rest);
    close(fd);
    int rc = th_daemon_stop(&gwh_daemon, SIGTERM, 15000);
    cr_assert_eq(rc, 0, "ringlmd exited %d after SIGTERM", rc);
    uint64_t dl = th_now_ms() + 5000;
    for (;;) {
        gwh_resp h = gwh_curl("/health", NULL, NULL);
        int st = h.status;
        gwh_resp_free(&h);
        if (st == 503) break;
        cr_assert(th_now_ms() < dl, "/health still %d 5 s after ringlmd exited", st);
        th_pause_ms(20);
    }
    expect_error("/v1/completions", NULL, "{\"prompt\":\"x\"}", 503, NULL, NULL);
    cr_assert_eq(th_proc_stop(&gwh_gateway, SIGTERM, 10000), 0,
                 "the gateway did not exit 0 on SIGTERM");
}

/* ---- several sessions ----------------------------------------------------------------- */

/* N streams at once while ringlmd is stopped (SIGSTOP), so every one is in flight in the
 * daemon when it resumes: more than one session's limit (1,024 requests in flight). */
#define FLOOD 1100

static void flood(const char *sessions, int *ok, int *rejected_429)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < FLOOD + 256) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < FLOOD + 256)
        cr_skip_test("RLIMIT_NOFILE %llu is too low for %d sockets",
                     (unsigned long long)rl.rlim_cur, FLOOD);
    const char *extra[] = {"--sessions", sessions, NULL};
    setup(extra);
    int n_sess = atoi(sessions);
    /* /health is 200 once one session is up; the others follow */
    uint64_t up_dl = th_now_ms() + 10000;
    for (;;) {
        char *m = gwh_gateway_metrics();
        double up = gwh_metric(m, "ringlm_gateway_sessions_connected");
        free(m);
        if (up == n_sess) break;
        cr_assert(th_now_ms() < up_dl, "%g of %d sessions up after 10 s", up, n_sess);
        th_pause_ms(10);
    }
    cr_assert_eq(kill(gwh_daemon.pid, SIGSTOP), 0);
    static int fds[FLOOD];
    for (int i = 0; i < FLOOD; i++) {
        fds[i] = gwh_connect();
        gwh_send_post(fds[i], "/v1/completions", NULL,
                      "{\"prompt\":\"Once upon a time\",\"max_tokens\":2,\"stream\":true}");
    }
    /* Every request submitted (the daemon is stopped: none can finish), spread over the
	 * sessions, none above one session's limit. */
    uint64_t dl = th_now_ms() + 60000;
    char *mx = NULL;
    for (;;) {
        free(mx);
        mx = gwh_gateway_metrics();
        if (gwh_metric(mx, "ringlm_gateway_requests_in_flight") == FLOOD) break;
        if (th_now_ms() > dl) {
            kill(gwh_daemon.pid, SIGCONT);
            cr_assert_fail("not all %d requests submitted after 60 s:\n%s", FLOOD, mx);
        }
        th_pause_ms(20);
    }
    double sum = 0;
    for (int i = 0; i < n_sess; i++) {
        char series[96];
        snprintf(series, sizeof series, "ringlm_gateway_session_requests_in_flight{session=\"%d\"}",
                 i);
        double v = gwh_metric(mx, series);
        if (n_sess > 1)
            cr_assert(v > 0 && v <= 1024, "session %d holds %g requests:\n%s", i, v, mx);
        sum += v;
    }
    cr_assert_eq(sum, FLOOD, "%s", mx);
    cr_assert_eq(gwh_metric(mx, "ringlm_gateway_sessions_connected"), n_sess, "%s", mx);
    free(mx);
    cr_assert_eq(kill(gwh_daemon.pid, SIGCONT), 0);
    *ok = *rejected_429 = 0;
    for (int i = 0; i < FLOOD; i++) {
        bool eof;
        char *got = th_read_until(fds[i], "data: [DONE]", 60000, &eof);
        if (!strncmp(got, "HTTP/1.1 200", 12) && strstr(got, "data: [DONE]") &&
            !strstr(got, "\"error\""))
            (*ok)++;
        else if (!strncmp(got, "HTTP/1.1 429", 12) && strstr(got, "queue_full"))
            (*rejected_429)++;
        else
            cr_assert_fail("stream %d: neither a whole stream nor a 429 queue_full:\n%s", i, got);
        free(got);
        close(fds[i]);
    }
}

Test(gateway_e2e, streams_beyond_one_sessions_request_limit_succeed_over_two_sessions)
{
    int ok, rejected;
    flood("2", &ok, &rejected);
    cr_assert_eq(ok, FLOOD, "%d of %d streams completed, %d refused queue_full", ok, FLOOD,
                 rejected);
}

/* The control: the same flood over one session meets the daemon's per-session limit. */
Test(gateway_e2e, one_session_refuses_beyond_its_request_limit)
{
    int ok, rejected;
    flood("1", &ok, &rejected);
    cr_assert_eq(ok + rejected, FLOOD);
    cr_assert_gt(rejected, 0,
                 "all %d streams completed on one session: the limit this test relies on is gone",
                 FLOOD);
    cr_assert_geq(ok, 1024, "only %d streams completed on one session", ok);
}

/* ---- chat templates from the model file ----------------------------------------------- */

/* A GGUF file holding a SentencePiece vocabulary (unk, BOS, EOS, the 256 byte tokens, a-z)
 * and, when template is not NULL, tokenizer.chat_template. */
static char *write_gguf_tokenizer_ctx(const char *name, const char *template, uint32_t ctx);
static char *write_gguf_tokenizer(const char *name, const char *template)
{
    return write_gguf_tokenizer_ctx(name, template, 0);
}

/* The same, stating a context of ctx tokens (llama.context_length) when ctx > 0. */
static char *write_gguf_tokenizer_ctx(const char *name, const char *template, uint32_t ctx)
{
    char *path = th_path(gwh_dir(), name);
    enum { NTOK = 3 + 256 + 26 };
    static char names[NTOK][8];
    const char *toks[NTOK];
    size_t lens[NTOK];
    float scores[NTOK];
    int32_t types[NTOK];
    for (int i = 0; i < NTOK; i++) {
        if (i < 3)
            snprintf(names[i], sizeof names[i], "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259)
            snprintf(names[i], sizeof names[i], "<0x%02X>", i - 3);
        else
            snprintf(names[i], sizeof names[i], "%c", 'a' + (i - 259));
        toks[i] = names[i];
        lens[i] = strlen(names[i]);
        scores[i] = i < 259 ? 0.0f : -(float)(i - 259);
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    gguf_writer *w = gw_new();
    gw_str(w, "general.architecture", "llama");
    gw_str(w, "tokenizer.ggml.model", "llama");
    gw_str_arr(w, "tokenizer.ggml.tokens", toks, lens, NTOK);
    gw_f32_arr(w, "tokenizer.ggml.scores", scores, NTOK);
    gw_i32_arr(w, "tokenizer.ggml.token_type", types, NTOK);
    gw_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gw_u32(w, "tokenizer.ggml.eos_token_id", 2);
    if (template) gw_str(w, "tokenizer.chat_template", template);
    if (ctx) gw_u32(w, "llama.context_length", ctx);
    cr_assert_eq(gw_write(w, path), 0, "writing %s", path);
    gw_free(w);
    return path;
}

static const char *const chatml_jinja =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";

/* Starts the gateway on tokenizer tok (no daemon needed); returns its exit status when it
 * exits at start (with its log in *log), or -1 once it listens. */
static int start_with_tokenizer(const char *tok, const char *const *extra, char **log)
{
    char *gw = th_path(th_bin_dir(), "ringlm-gateway");
    char *sock = th_path(gwh_dir(), "none.sock");
    const char *argv[16] = {gw, "--listen", "127.0.0.1:0", "--socket", sock, "--tokenizer", tok};
    int n = 7;
    for (int i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    static int starts;
    char name[32];
    snprintf(name, sizeof name, "gateway-tpl-%d.log", ++starts); /* a fresh log each start */
    char *logp = th_path(gwh_dir(), name);
    th_proc_start(&gwh_gateway, argv, logp);
    int rc = -1;
    uint64_t dl = th_now_ms() + 10000;
    for (;;) {
        *log = th_read_file(logp);
        if (strstr(*log, "listening on")) break;
        rc = th_proc_wait(&gwh_gateway, 0);
        if (rc >= 0) {
            free(*log);
            *log = th_read_file(logp);
            break;
        }
        cr_assert(th_now_ms() < dl, "the gateway neither listens nor exits: %s", *log);
        free(*log);
        th_pause_ms(10);
    }
    free(gw);
    free(sock);
    free(logp);
    return rc;
}

Test(gateway_e2e, the_model_files_chat_template_is_used_unless_one_is_named)
{
    gwh_need();
    char *tok = write_gguf_tokenizer("chatml.gguf", chatml_jinja), *log;
    cr_assert_eq(start_with_tokenizer(tok, NULL, &log), -1, "%s", log);
    cr_assert(strstr(log, "template jinja (the model file's chat_template)"), "%s", log);
    free(log);
    th_proc_stop(&gwh_gateway, SIGTERM, 10000);
    /* --chat-template still decides, and a disagreement is said */
    const char *explicit_plain[] = {"--chat-template", "plain", NULL};
    cr_assert_eq(start_with_tokenizer(tok, explicit_plain, &log), -1, "%s", log);
    cr_assert(strstr(log, "template plain (--chat-template)"), "%s", log);
    cr_assert(strstr(log, "note: --chat-template plain, but"), "%s", log);
    free(log);
    th_proc_stop(&gwh_gateway, SIGTERM, 10000);
    /* no template in the file: plain */
    char *bare = write_gguf_tokenizer("bare.gguf", NULL);
    cr_assert_eq(start_with_tokenizer(bare, NULL, &log), -1, "%s", log);
    cr_assert(strstr(log, "template plain (default)"), "%s", log);
    free(log);
    free(tok);
    free(bare);
}

/* The model file's own template renders chat requests (Jinja): the text of a request's messages
 * is the template's output, with everything the request carries (tools, tool_calls,
 * add_generation_prompt, chat_template_kwargs) and its BOS left to the tokenizer; a template
 * that raises answers 400 with its message (the newline after a block tag is trimmed, as
 * Hugging Face renders templates, hence {{ '\n' }}). Seen through /tokenize, which renders messages
 * as /v1/chat/completions does (the same parser): the ids of the messages equal the ids of
 * the text the template gives. */
static const char *const custom_jinja =
    "{{ bos_token }}{% if messages[0].role == 'tool' %}"
    "{{ raise_exception('a tool message cannot come first') }}{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content|trim if m.content is string else '' }}"
    "{% for c in m.tool_calls or [] %}[call {{ c.function.name }}]{% endfor %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if tools %}tools {{ tools|map(attribute='function')|map(attribute='name')|join(',') }}\n"
    "{% endif %}{% if add_generation_prompt %}<assistant>{% if think %}think{% endif %}{% endif %}";

static void use_started_gateway(const char *log)
{
    const char *at = strstr(log, "127.0.0.1:");
    cr_assert_not_null(at, "%s", log);
    gwh_port = atoi(at + strlen("127.0.0.1:"));
}

/* /tokenize's ids for body, as a JSON text */
static char *tokenize_ids(const char *body, int want_status, char **err_body)
{
    gwh_resp r = gwh_curl("/tokenize", NULL, body);
    cr_assert_eq(r.status, want_status, "/tokenize %s: %d %s", body, r.status, r.body);
    char *ids = NULL;
    if (r.status == 200) {
        json_t *j = json_loads(r.body, 0, NULL);
        cr_assert_not_null(j, "%s", r.body);
        ids = json_dumps(json_object_get(j, "tokens"), JSON_COMPACT);
        json_decref(j);
    } else if (err_body) {
        *err_body = strdup(r.body);
    }
    gwh_resp_free(&r);
    return ids;
}

Test(gateway_e2e, the_model_files_own_template_renders_chat_requests)
{
    gwh_need();
    gwh_need_curl();
    char *tok = write_gguf_tokenizer("custom.gguf", custom_jinja), *log;
    cr_assert_eq(start_with_tokenizer(tok, NULL, &log), -1, "%s", log);
    cr_assert(strstr(log, "template jinja (the model file's chat_template)"), "%s", log);
    use_started_gateway(log);
    free(log);
    const char *msgs =
        "[{\"role\": \"system\", \"content\": \" Be brief. \"}, {\"role\": \"user\", \"content\": "
        "\"hi\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", "
        "\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"arguments\": \"{}\"}}]}, "
        "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"noon\"}, {\"role\": "
        "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"thanks\"}]}]";
    const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"get_time\", "
                        "\"parameters\": {\"type\": \"object\", \"properties\": {}}}}]";
    static const struct {
        const char *extra, *text;
    } cases[] = {
        {", \"chat_template_kwargs\": {\"think\": true}",
         "<system>Be brief.\\n<user>hi\\n<assistant>[call get_time]\\n<tool>noon\\n<user>\\n"
         "tools get_time\\n<assistant>think"},
        {", \"add_generation_prompt\": false",
         "<system>Be brief.\\n<user>hi\\n<assistant>[call get_time]\\n<tool>noon\\n<user>\\n"
         "tools get_time\\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[4096];
        snprintf(body, sizeof body, "{\"messages\": %s, \"tools\": %s%s}", msgs, tools,
                 cases[i].extra);
        char *got = tokenize_ids(body, 200, NULL);
        snprintf(body, sizeof body, "{\"prompt\": \"%s\"}", cases[i].text);
        char *want = tokenize_ids(body, 200, NULL);
        cr_assert_str_eq(got, want, "case %zu: the messages' ids are not the template's text's", i);
        cr_assert_gt(strlen(want), 40, "case %zu: %s", i, want);
        free(got);
        free(want);
    }
    /* the template's own refusal */
    char *err = NULL;
    cr_assert_null(
        tokenize_ids("{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", 400, &err));
    cr_assert(strstr(err, "a tool message cannot come first"), "%s", err);
    free(err);
    free(tok);
}

Test(gateway_e2e, a_chat_template_that_does_not_parse_is_an_error_at_start)
{
    gwh_need();
    char *tok = write_gguf_tokenizer("unparsable.gguf", "{% for m in messages %}{{ m.content }"),
         *log;
    int rc = start_with_tokenizer(tok, NULL, &log);
    cr_assert_eq(rc, 1, "the gateway started on a template that does not parse (%d): %s", rc, log);
    cr_assert(strstr(log, "unparsable.gguf: tokenizer.chat_template does not parse: line 1"),
              "the message names the file and the line: %s", log);
    free(log);
    /* naming a built-in one is the way out */
    const char *explicit_chatml[] = {"--chat-template", "chatml", NULL};
    cr_assert_eq(start_with_tokenizer(tok, explicit_chatml, &log), -1, "%s", log);
    free(log);
    free(tok);
}

/* The context length comes from the model file when --max-model-len does not say: the
 * tokenizer file is the model's GGUF, whose llama.context_length (96 here) /v1/models and
 * /tokenize report, and which bounds chat's default max_tokens (it used to be unknown, and
 * chat asked for 256 tokens, more than such a model can hold). */
Test(gateway_e2e, the_context_length_comes_from_the_model_file)
{
    gwh_need();
    gwh_need_curl();
    char *tok = write_gguf_tokenizer_ctx("ctx96.gguf", NULL, 96), *log;
    cr_assert_eq(start_with_tokenizer(tok, NULL, &log), -1, "%s", log);
    use_started_gateway(log);
    free(log);
    gwh_resp r = gwh_curl("/v1/models", NULL, NULL);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert(strstr(r.body, "\"max_model_len\":96") || strstr(r.body, "\"max_model_len\": 96"),
              "%s", r.body);
    gwh_resp_free(&r);
    th_proc_stop(&gwh_gateway, SIGTERM, 10000);
    /* --max-model-len still decides */
    const char *explicit_len[] = {"--max-model-len", "64", NULL};
    cr_assert_eq(start_with_tokenizer(tok, explicit_len, &log), -1, "%s", log);
    use_started_gateway(log);
    free(log);
    r = gwh_curl("/v1/models", NULL, NULL);
    cr_assert(strstr(r.body, "\"max_model_len\":64") || strstr(r.body, "\"max_model_len\": 64"),
              "%s", r.body);
    gwh_resp_free(&r);
    free(tok);
}

/* ---- what fleet routers read ---------------------------------------------------------- */

/* A router reads the model server's vllm:* gauges where it sends requests, its /v1/models and
 * /health: with --daemon-metrics the gateway's /metrics carries the daemon's vllm:* lines; a
 * daemon that stops answering leaves them out (and never stalls the gateway's /metrics). */
Test(gateway_e2e, routers_find_the_vllm_gauges_models_and_health_on_the_gateway)
{
    gwh_need();
    gwh_need_curl();
    gwh_start_daemon(NULL);
    char spec[32];
    snprintf(spec, sizeof spec, "127.0.0.1:%d", gwh_metrics_port);
    const char *extra[] = {"--daemon-metrics", spec, NULL};
    gwh_start_gateway(extra);
    gwh_wait_healthy(10000);
    static const char *const want[] = {"vllm:num_requests_waiting{", "vllm:num_requests_running{",
                                       "vllm:kv_cache_usage_perc{",
                                       "# TYPE vllm:num_requests_waiting gauge"};
    uint64_t dl = th_now_ms() + 10000;
    char *mx = NULL;
    for (;;) {
        free(mx);
        mx = gwh_gateway_metrics();
        bool all = gwh_metric(mx, "ringlm_gateway_daemon_metrics_up") == 1;
        for (size_t i = 0; i < sizeof want / sizeof *want; i++) all = all && strstr(mx, want[i]);
        if (all) break;
        cr_assert(th_now_ms() < dl,
                  "the daemon's vllm:* lines are not on the gateway's /metrics:\n%s", mx);
        th_pause_ms(20);
    }
    cr_assert_eq(gwh_metric(mx, "vllm:num_requests_running"), 0, "%s", mx);
    free(mx);
    gwh_resp m = gwh_curl("/v1/models", NULL, NULL);
    cr_assert_eq(m.status, 200, "%s", m.body);
    cr_assert(strstr(m.body, "\"id\":\"stories\""), "%s", m.body);
    gwh_resp_free(&m);

    /* The daemon stops answering: the lines go, the gateway's /metrics does not wait. */
    cr_assert_eq(kill(gwh_daemon.pid, SIGSTOP), 0);
    dl = th_now_ms() + 10000;
    for (;;) {
        mx = gwh_gateway_metrics();
        bool gone =
            gwh_metric(mx, "ringlm_gateway_daemon_metrics_up") == 0 && !strstr(mx, "\nvllm:");
        free(mx);
        if (gone) break;
        if (th_now_ms() > dl) {
            kill(gwh_daemon.pid, SIGCONT);
            cr_assert_fail("the vllm:* lines of a stopped daemon are still relayed after 10 s");
        }
        th_pause_ms(20);
    }
    cr_assert_eq(kill(gwh_daemon.pid, SIGCONT), 0);
}

/* ---- an idle gateway sleeps ------------------------------------------------------------ */

/* The wake-ups of every thread of process pid so far (voluntary context switches: each is
 * a sleep that ended). */
static long process_wakeups(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    cr_assert(d, "no %s", dir);
    long sum = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[384], line[256];
        snprintf(path, sizeof path, "%s/%.256s/status", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* a thread that ended meanwhile */
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "voluntary_ctxt_switches:", 24)) sum += strtol(line + 24, NULL, 10);
        fclose(f);
    }
    closedir(d);
    return sum;
}

/* A gateway with its sessions up and no request wakes (nearly) never: every thread waits for
 * something to do — an event, the daemon's end, a connection's deadline — not on a timer.
 * Before, each session's events thread woke every 20 ms (libringlm's liveness check) and the
 * connection guard every 100 ms: 210 wake-ups a second with four sessions. */
Test(gateway_e2e, an_idle_gateway_does_not_wake)
{
    setup(NULL);
    gwh_resp r = gwh_curl("/v1/completions", NULL,
                          "{\"model\":\"stories\",\"prompt\":\"Once\",\"max_tokens\":4}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    gwh_resp_free(&r);
    uint64_t until = th_now_ms() + 20000;
    for (;;) {
        char *m = gwh_gateway_metrics();
        double up = gwh_metric(m, "ringlm_gateway_sessions_connected");
        free(m);
        if (up >= 4) break;
        cr_assert(th_now_ms() < until, "the gateway's sessions did not come up (%g)", up);
        th_pause_ms(20);
    }
    long before = process_wakeups(gwh_gateway.pid);
    /* the window over which wake-ups are counted; nothing waits on it */
    struct timespec window = {.tv_sec = 2};
    nanosleep(&window, NULL);
    long woke = process_wakeups(gwh_gateway.pid) - before;
    cr_log_info("an idle gateway over 2 s: %ld wake-ups", woke);
    cr_expect_leq(woke, 10, "an idle gateway woke %ld times in 2 s", woke);
}
