/* SPDX-License-Identifier: MIT */
/*
 * tests/test_gateway_fields.c — no request field is silently ignored: docs/gateway.md's one
 * table of fields is the gateway's own (gw_fields), and through a real ringlm-gateway and
 * ringlmd every implemented or ignored field is answered with its example value, every
 * refused one is a 400 naming it (and accepted at its neutral value), a field in no table is
 * refused; and the logits fields do what they say: a +100 bias forces its token, -100 forbids
 * it, stop_token_ids end the answer with "stop", max_completion_tokens counts as max_tokens,
 * and bad values are 400s naming the field.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gateway/gw_params.h"
#include "tests/daemon_helpers.h"
#include "tests/gateway_helpers.h"

TestSuite(gateway_fields, .fini = gwh_stop_all, .timeout = 240);

static void setup(void)
{
    gwh_need();
    gwh_need_curl();
    gwh_start_daemon(NULL);
    gwh_start_gateway(NULL);
    gwh_wait_healthy(10000);
}

/* ---- the table in the docs ------------------------------------------------------------- */

static const char *ep_name(unsigned ep)
{
    return ep == (GW_EP_COMPLETIONS | GW_EP_CHAT) ? "both"
           : ep == GW_EP_COMPLETIONS              ? "completions"
                                                  : "chat";
}

Test(gateway_fields, the_docs_table_is_the_gateways_table)
{
    gwh_doc_row rows[128];
    int n = gwh_doc_rows("fields", true, rows, 128);
    size_t nf;
    const gw_field *f = gw_fields(&nf);
    cr_expect_eq((size_t)n, nf, "docs list %d fields, the gateway %zu", n, nf);
    for (size_t i = 0; i < nf; i++) {
        const gwh_doc_row *d = NULL;
        for (int k = 0; k < n && !d; k++)
            if (!strcmp(rows[k].name, f[i].name)) d = &rows[k];
        cr_expect_not_null(d, "'%s' is not in docs/gateway.md's table", f[i].name);
        if (!d) continue;
        cr_expect_str_eq(d->status, gw_field_status_name(f[i].status), "'%s'", f[i].name);
        cr_expect_str_eq(d->endpoints, ep_name(f[i].endpoints), "'%s'", f[i].name);
        cr_expect_str_eq(d->accepted, f[i].neutral ? f[i].neutral : "", "'%s'", f[i].name);
    }
}

/* ---- every field through the gateway ---------------------------------------------------- */

static json_t *base_body(bool chat)
{
    json_error_t je;
    json_t *o = json_loads(chat ? "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                  "\"max_tokens\":3}"
                                : "{\"prompt\":[1,403],\"max_tokens\":3}",
                           0, &je);
    cr_assert_not_null(o);
    return o;
}

/* POSTs body; returns the status and, for an error, its param in param. */
static int post(bool chat, json_t *body, char *param, size_t n, char *msg, size_t mn)
{
    char *b = json_dumps(body, JSON_COMPACT);
    gwh_resp r = gwh_curl(chat ? "/v1/chat/completions" : "/v1/completions", NULL, b);
    param[0] = msg[0] = 0;
    json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
    json_t *e = json_object_get(j, "error");
    if (e) {
        snprintf(param, n, "%s", json_string_value(json_object_get(e, "param")) ?: "");
        snprintf(msg, mn, "%s", json_string_value(json_object_get(e, "message")) ?: "");
    }
    int status = r.status;
    json_decref(j);
    gwh_resp_free(&r);
    free(b);
    return status;
}

Test(gateway_fields, every_field_of_the_table_is_answered_as_the_table_says)
{
    gwh_doc_row rows[128];
    int n = gwh_doc_rows("fields", true, rows, 128);
    setup();
    int checked = 0;
    for (int i = 0; i < n; i++) {
        const gwh_doc_row *d = &rows[i];
        for (int chat = 0; chat < 2; chat++) {
            const char *ep = chat ? "chat" : "completions";
            bool here = !strcmp(d->endpoints, "both") || !strcmp(d->endpoints, ep);
            json_t *body = base_body(chat);
            json_error_t je;
            /* An example that differs per endpoint is written "completions: X; chat: Y". */
            char ex[128];
            snprintf(ex, sizeof ex, "%s", d->example);
            if (!strncmp(ex, "completions: ", 13)) {
                char *c = strstr(ex, "; chat: ");
                cr_assert_not_null(c, "'%s': example %s has no chat part", d->name, d->example);
                if (chat)
                    memmove(ex, c + 8, strlen(c + 8) + 1);
                else
                    *c = 0, memmove(ex, ex + 13, strlen(ex + 13) + 1);
            }
            /* top_logprobs asks for nothing without "logprobs": true beside it (OpenAI's) */
            if (!strcmp(d->name, "top_logprobs") && chat)
                json_object_set_new(body, "logprobs", json_true());
            json_t *v = json_loads(ex, JSON_DECODE_ANY, &je);
            cr_assert_not_null(v, "'%s': example %s is not JSON: %s", d->name, d->example, je.text);
            if (!strcmp(d->name, "model")) {
                json_decref(v);
                v = json_string("stories"); /* the served name of this gateway */
            }
            json_object_set_new(body, d->name, v);
            char param[64], msg[512];
            int st = post(chat, body, param, sizeof param, msg, sizeof msg);
            if (!here || !strcmp(d->status, "refused")) {
                cr_expect_eq(st, 400, "%s on %s: %d, not refused", d->name, ep, st);
                cr_expect_str_eq(param, d->name, "%s on %s: param '%s' (%s)", d->name, ep, param,
                                 msg);
            } else {
                cr_expect_eq(st, 200, "%s (%s) on %s: %d %s", d->name, d->status, ep, st, msg);
            }
            if (here && d->accepted[0]) { /* the neutral value is accepted */
                json_t *nv = json_loads(d->accepted, JSON_DECODE_ANY, &je);
                cr_assert_not_null(nv, "'%s': accepted %s is not JSON", d->name, d->accepted);
                json_object_set_new(body, d->name, nv);
                st = post(chat, body, param, sizeof param, msg, sizeof msg);
                cr_expect_eq(st, 200, "%s: %s on %s: %d %s", d->name, d->accepted, ep, st, msg);
            }
            json_decref(body);
            checked++;
        }
    }
    /* Fields in no table: refused, named; ringlm's extension object likewise. */
    static const char *const unknown[] = {"frobnicate", "temprature", "ringlm"};
    for (int i = 0; i < 3; i++) {
        json_t *body = base_body(false);
        json_object_set_new(body, unknown[i],
                            i < 2 ? json_integer(1) : json_pack("{s:s}", "tenant", "tiny"));
        char param[64], msg[512];
        cr_expect_eq(post(false, body, param, sizeof param, msg, sizeof msg), 400, "%s",
                     unknown[i]);
        cr_expect_str_eq(param, unknown[i], "%s", msg);
        json_decref(body);
    }
    cr_expect_geq(checked, 2 * n);
}

/* ---- what the logits fields do ---------------------------------------------------------- */

typedef struct answer {
    int status;
    char text[2048];
    char finish[32];
    long long completion_tokens;
    char param[64];
} answer;

static answer complete(const char *body)
{
    answer a = {0};
    gwh_resp r = gwh_curl("/v1/completions", NULL, body);
    a.status = r.status;
    json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    snprintf(a.text, sizeof a.text, "%s", json_string_value(json_object_get(c0, "text")) ?: "");
    snprintf(a.finish, sizeof a.finish, "%s",
             json_string_value(json_object_get(c0, "finish_reason")) ?: "");
    a.completion_tokens =
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
    snprintf(a.param, sizeof a.param, "%s",
             json_string_value(json_object_get(json_object_get(j, "error"), "param")) ?: "");
    cr_assert(a.status != 200 || c0, "no choice: %s", r.body);
    json_decref(j);
    gwh_resp_free(&r);
    return a;
}

Test(gateway_fields, logit_bias_penalties_and_stop_ids_change_the_answer)
{
    setup();
    /* stories260K's greedy story from BOS: 403 407 261 378 432 ... (reference-greedy.json);
     * after the prompt 1 403 407 it goes on with 261, 378. */
    ref_case refs[12];
    cr_assert_geq(load_refs(refs, 12), 1);
    cr_assert(refs[0].n_prompt == 1 && refs[0].gen[0] == 403 && refs[0].gen[1] == 407);
    const int32_t t1 = refs[0].gen[2], t2 = refs[0].gen[3];
    char body[512];

    /* The plain answer stops at once on its first token when that is a stop id. */
    snprintf(body, sizeof body,
             "{\"prompt\":[1,403,407],\"max_tokens\":12,\"temperature\":0,"
             "\"stop_token_ids\":[%d]}",
             t1);
    answer a = complete(body);
    cr_expect_eq(a.status, 200);
    cr_expect_str_eq(a.finish, "stop");
    cr_expect_eq(a.completion_tokens, 0, "'%s'", a.text);
    /* ... on its second: one token. */
    snprintf(body, sizeof body,
             "{\"prompt\":[1,403,407],\"max_tokens\":12,\"temperature\":0,"
             "\"stop_token_ids\":[%d]}",
             t2);
    a = complete(body);
    cr_expect_str_eq(a.finish, "stop");
    cr_expect_eq(a.completion_tokens, 1, "'%s'", a.text);

    /* -100 on the first token: it never comes (it would stop the answer), the answer runs to
     * its length. */
    snprintf(body, sizeof body,
             "{\"prompt\":[1,403,407],\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true,"
             "\"logit_bias\":{\"%d\":-100},\"stop_token_ids\":[%d]}",
             t1, t1);
    a = complete(body);
    cr_expect_eq(a.status, 200);
    cr_expect_str_eq(a.finish, "length", "token %d came: '%s'", t1, a.text);
    cr_expect_eq(a.completion_tokens, 40);

    /* +100 on a token the story never starts with: it comes first; max_completion_tokens is
     * max_tokens. */
    snprintf(body, sizeof body,
             "{\"prompt\":[1,403,407],\"max_completion_tokens\":5,\"temperature\":0,"
             "\"logit_bias\":{\"300\":100}}");
    a = complete(body);
    cr_expect_eq(a.status, 200);
    cr_expect_eq(a.completion_tokens, 5, "max_completion_tokens is max_tokens");
    snprintf(body, sizeof body,
             "{\"prompt\":[1,403,407],\"max_completion_tokens\":5,\"temperature\":0,"
             "\"logit_bias\":{\"300\":100},\"stop_token_ids\":[300]}");
    a = complete(body);
    cr_expect_str_eq(a.finish, "stop");
    cr_expect_eq(a.completion_tokens, 0, "token 300 did not come first: '%s'", a.text);

    /* Penalties change a greedy answer that repeats itself. */
    snprintf(body, sizeof body, "{\"prompt\":[1,403,407],\"max_tokens\":60,\"temperature\":0%s}",
             "");
    answer p0 = complete(body);
    snprintf(body, sizeof body,
             "{\"prompt\":[1,403,407],\"max_tokens\":60,\"temperature\":0,"
             "\"presence_penalty\":1.5,\"frequency_penalty\":1.0,\"repetition_penalty\":1.3}");
    answer p1 = complete(body);
    cr_expect_eq(p1.status, 200);
    cr_expect_str_neq(p0.text, p1.text, "penalties changed nothing");

    /* Bad values: 400 naming the field. */
    static const struct {
        const char *extra, *param;
    } bad[] = {
        {"\"logit_bias\":{\"512\":1}", "logit_bias"},
        {"\"logit_bias\":{\"5\":101}", "logit_bias"},
        {"\"logit_bias\":{\"x\":1}", "logit_bias"},
        {"\"logit_bias\":[1]", "logit_bias"},
        {"\"presence_penalty\":2.5", "presence_penalty"},
        {"\"frequency_penalty\":-3", "frequency_penalty"},
        {"\"repetition_penalty\":0", "repetition_penalty"},
        {"\"min_p\":1.5", "min_p"},
        {"\"stop_token_ids\":[600]", "stop_token_ids"},
        {"\"stop_token_ids\":[-1]", "stop_token_ids"},
        {"\"max_tokens\":3,\"max_completion_tokens\":4", "max_completion_tokens"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\":[1,403,407],%s}", bad[i].extra);
        a = complete(body);
        cr_expect_eq(a.status, 400, "%s: %d", bad[i].extra, a.status);
        cr_expect_str_eq(a.param, bad[i].param, "%s", bad[i].extra);
    }
}
