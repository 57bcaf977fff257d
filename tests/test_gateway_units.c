/* SPDX-License-Identifier: MIT */
/*
 * ringlm-gateway's pure parts: UTF-8 emitted only at whole code points, stop strings cut as
 * the OpenAI API cuts them, JSON escaping of stream text, the API keys file, the chat
 * templates' exact text, and request bodies to parameters (each wrong field a 400 that
 * names it).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <jansson.h>
#include <string.h>

#include "libclient/ringlm.h"
#include "formats/api_keys.h"
#include "gateway/gw_params.h"
#include "gateway/gw_reason.h"
#include "gateway/gw_text.h"

/* ---- UTF-8 ----------------------------------------------------------------------------- */

Test(gateway_units, utf8_split_sequence_waits_for_its_last_byte)
{
    const char *euro = "\xe2\x82\xac"; /* € in three bytes, fed one at a time */
    gw_buf out = {0};
    cr_assert_eq(gw_utf8_take(euro, 1, false, &out), 0);
    cr_assert_eq(gw_utf8_take(euro, 2, false, &out), 0);
    cr_assert_eq(gw_utf8_take(euro, 3, false, &out), 3);
    cr_assert_str_eq(out.p, "\xe2\x82\xac");
    gw_buf_free(&out);
}

Test(gateway_units, utf8_invalid_bytes_become_replacement_chars)
{
    gw_buf out = {0};
    /* a lone continuation byte, an overlong lead (0xc0), a surrogate (ED A0 80), then "ok" */
    const char in[] = "a\x80"
                      "b\xc0\xaf"
                      "c\xed\xa0\x80"
                      "ok";
    long k = gw_utf8_take(in, sizeof in - 1, false, &out);
    cr_assert_eq(k, (long)sizeof in - 1);
    cr_assert_str_eq(out.p, "a\xef\xbf\xbd"
                            "b\xef\xbf\xbd\xef\xbf\xbd"
                            "c\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                            "ok");
    json_t *j = json_string(out.p); /* what jansson accepts is valid UTF-8 */
    cr_assert(j);
    json_decref(j);
    gw_buf_free(&out);
}

Test(gateway_units, utf8_incomplete_tail_is_flushed_as_replacement_when_final)
{
    gw_buf out = {0};
    cr_assert_eq(gw_utf8_take("x\xf0\x9f", 3, false, &out), 1);
    cr_assert_str_eq(out.p, "x");
    cr_assert_eq(gw_utf8_take("\xf0\x9f", 2, true, &out), 2);
    cr_assert_str_eq(out.p, "x\xef\xbf\xbd\xef\xbf\xbd");
    gw_buf_free(&out);
}

/* ---- stop strings ---------------------------------------------------------------------- */

Test(gateway_units, stop_scan_holds_a_possible_prefix_and_cuts_at_the_earliest)
{
    gw_stop st = {.s = {"\n\n", "The end"}, .len = {2, 7}, .n = 2};
    size_t e;
    cr_assert_not(gw_stop_scan(&st, "Once upon The e", 15, &e));
    cr_assert_eq(e, 10, "'The e' may begin 'The end': held back, got %zu", e);
    cr_assert_not(gw_stop_scan(&st, "line\n", 5, &e));
    cr_assert_eq(e, 4);
    cr_assert(gw_stop_scan(&st, "a The end\n\nb", 12, &e));
    cr_assert_eq(e, 2, "the earliest stop string cuts");
    cr_assert(gw_stop_scan(&st, "x\n\nThe end", 10, &e));
    cr_assert_eq(e, 1);
    gw_stop none = {0};
    cr_assert_not(gw_stop_scan(&none, "abc", 3, &e));
    cr_assert_eq(e, 3);
}

/* ---- JSON escaping --------------------------------------------------------------------- */

Test(gateway_units, json_escaping_round_trips_through_jansson)
{
    const char s[] = "q\"b\\s\n\r\t\x01\x1f\x7f é";
    gw_buf b = {0};
    cr_assert_eq(gw_buf_add_json_str(&b, s, sizeof s - 1), 0);
    json_error_t e;
    json_t *j = json_loads(b.p, JSON_DECODE_ANY, &e);
    cr_assert(j, "%s: %s", b.p, e.text);
    cr_assert_str_eq(json_string_value(j), s);
    json_decref(j);
    gw_buf_free(&b);
}

/* ---- keys ------------------------------------------------------------------------------ */

Test(gateway_units, keys_file_maps_key_to_tenant_and_class)
{
    gw_keys k;
    char why[200];
    cr_assert_eq(
        gw_keys_parse("# comment\n\nsk-aaaaaaaa alice\n  sk-bbbbbbbb\tbob batch # trailing\n", &k,
                      why, sizeof why),
        0, "%s", why);
    cr_assert_eq(k.n, 2);
    const gw_key *a = gw_keys_find(&k, "sk-aaaaaaaa", 11);
    cr_assert(a);
    cr_assert_str_eq(a->tenant, "alice");
    cr_assert_str_eq(a->class_name, "");
    const gw_key *b = gw_keys_find(&k, "sk-bbbbbbbb", 11);
    cr_assert(b);
    cr_assert_str_eq(b->tenant, "bob");
    cr_assert_str_eq(b->class_name, "batch");
    cr_assert_null(gw_keys_find(&k, "sk-aaaaaaa", 10), "a prefix of a key is not the key");
    cr_assert_null(gw_keys_find(&k, "sk-aaaaaaaaX", 12));
    gw_keys_free(&k);
}

Test(gateway_units, keys_file_errors_name_the_line)
{
    gw_keys k;
    char why[200];
    cr_assert_eq(gw_keys_parse("sk-aaaaaaaa alice\nsk-aaaaaaaa bob\n", &k, why, sizeof why),
                 -EINVAL);
    cr_assert(strstr(why, "line 2") && strstr(why, "twice"), "%s", why);
    cr_assert_eq(gw_keys_parse("short alice\n", &k, why, sizeof why), -EINVAL);
    cr_assert(strstr(why, "line 1") && strstr(why, "8 bytes"), "%s", why);
    cr_assert_eq(gw_keys_parse("sk-aaaaaaaa\n", &k, why, sizeof why), -EINVAL);
    cr_assert(strstr(why, "tenant"), "%s", why);
    cr_assert_eq(gw_keys_parse("sk-aaaaaaaa a-very-long-tenant-name\n", &k, why, sizeof why),
                 -EINVAL);
    cr_assert(strstr(why, "15 bytes"), "%s", why);
    cr_assert_eq(gw_keys_parse("# nothing\n", &k, why, sizeof why), -EINVAL);
}

/* ---- request bodies -------------------------------------------------------------------- */

static gw_parse_cfg pcfg = {.served_model = "m", .tpl = RINGLM_CHAT_PLAIN};

static void expect_400(gw_kind k, const char *body, const char *param)
{
    gw_params p;
    gw_err e;
    cr_assert_eq(gw_params_parse(k, body, strlen(body), &pcfg, &p, &e), -1, "accepted: %s", body);
    cr_assert_eq(e.status, 400, "%s: status %d (%s)", body, e.status, e.message);
    cr_assert_str_eq(e.param, param, "%s: param '%s' (%s)", body, e.param, e.message);
    char *j = gw_err_json(&e);
    json_error_t je;
    json_t *o = json_loads(j, 0, &je);
    cr_assert(o && json_is_string(json_object_get(json_object_get(o, "error"), "message")), "%s",
              j);
    json_decref(o);
    free(j);
}

/* A body of the right types whose range the one check (gw_params_check, ringlm_request_check)
 * refuses: 400 naming the body's field. */
static void expect_range_400(const char *body, const char *param)
{
    gw_params p;
    gw_err e;
    cr_assert_eq(gw_params_parse(GW_COMPLETION, body, strlen(body), &pcfg, &p, &e), 0,
                 "the parser checks types only: %s (%s)", body, e.message);
    int32_t tok = 1;
    ringlm_request rq;
    ringlm_request_init(&rq);
    rq.prompt = &tok;
    rq.n_prompt = 1;
    rq.max_new_tokens = p.max_tokens < 0 ? 16 : (uint32_t)p.max_tokens;
    rq.temperature = (float)p.temperature;
    rq.top_p = (float)p.top_p;
    rq.deadline_us = p.deadline_ms * 1000u;
    ringlm_sampling smp;
    bool has_smp = gw_params_sampling(&p, &smp);
    cr_assert_eq(gw_params_check(&p, &rq, has_smp ? &smp : NULL, 512, &e), -1, "accepted: %s",
                 body);
    cr_assert_eq(e.status, 400, "%s: status %d (%s)", body, e.status, e.message);
    cr_assert_str_eq(e.param, param, "%s: param '%s' (%s)", body, e.param, e.message);
    gw_params_free(&p);
}

Test(gateway_units, out_of_range_values_are_400s_naming_the_field)
{
    expect_range_400("{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens");
    expect_range_400("{\"prompt\":\"x\",\"top_p\":0}", "top_p");
    expect_range_400("{\"prompt\":\"x\",\"top_p\":1.5}", "top_p");
    expect_range_400("{\"prompt\":\"x\",\"temperature\":-1}", "temperature");
    expect_range_400("{\"prompt\":\"x\",\"temperature\":100.5}", "temperature");
    expect_range_400("{\"prompt\":\"x\",\"ringlm\":{\"deadline_ms\":31536000001}}",
                     "ringlm.deadline_ms");
    expect_range_400("{\"prompt\":\"x\",\"logit_bias\":{\"512\":1}}", "logit_bias");
    expect_range_400("{\"prompt\":\"x\",\"logit_bias\":{\"5\":-101}}", "logit_bias");
    expect_range_400("{\"prompt\":\"x\",\"presence_penalty\":2.01}", "presence_penalty");
    expect_range_400("{\"prompt\":\"x\",\"frequency_penalty\":-2.5}", "frequency_penalty");
    expect_range_400("{\"prompt\":\"x\",\"repetition_penalty\":-1}", "repetition_penalty");
    expect_range_400("{\"prompt\":\"x\",\"min_p\":2}", "min_p");
    expect_range_400("{\"prompt\":\"x\",\"stop_token_ids\":[512]}", "stop_token_ids");
}

Test(gateway_units, wrong_types_are_400s_naming_the_field)
{
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":\"5\"}", "max_tokens");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", "temperature");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"stream\":1}", "stream");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"stop\":[1]}", "stop");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"n\":\"2\"}", "n");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"best_of\":2.5}", "best_of");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs");
    expect_400(GW_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}",
               "logprobs");
    expect_400(GW_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}",
               "top_logprobs");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"prompt_logprobs\":1,\"stream\":true}",
               "prompt_logprobs");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":\"y\"}}",
               "stream_options.include_usage");
    expect_400(GW_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt");
    expect_400(GW_COMPLETION, "{\"prompt\":[1,-2]}", "prompt");
    expect_400(GW_COMPLETION, "{\"prompt\":{}}", "prompt");
    expect_400(GW_COMPLETION, "{}", "prompt");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"ringlm\":{\"class\":7}}", "ringlm.class");
    expect_400(GW_CHAT, "{\"messages\":\"hi\"}", "messages");
    expect_400(GW_CHAT, "{\"messages\":[{\"content\":\"hi\"}]}", "messages");
    expect_400(GW_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
               "messages");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",", "");
    expect_400(GW_COMPLETION, "[1,2]", "");
}

/* No field is silently ignored: one in no table, a tenant in the body (the key decides), and
 * an unknown member of the ringlm extension are 400s naming them. */
Test(gateway_units, unknown_fields_are_refused_by_name)
{
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"frobnicate\":[1]}", "frobnicate");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"tenant\":\"evil\"}", "tenant");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"ringlm\":{\"tenant\":\"evil\"}}", "ringlm");
    expect_400(GW_COMPLETION, "{\"prompt\":\"x\",\"messages\":[]}", "messages");
    expect_400(GW_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":true}",
               "echo");
}

Test(gateway_units, a_good_body_fills_the_parameters)
{
    const char *b =
        "{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":7,\"temperature\":0,\"top_p\":0.5,"
        "\"top_k\":-1,\"seed\":42,\"stop\":[\"a\",\"bc\"],\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"user\":\"u\",\"n\":1,"
        "\"logit_bias\":{\"7\":-100,\"9\":2.5},\"presence_penalty\":0.5,"
        "\"frequency_penalty\":0.25,\"repetition_penalty\":1.5,\"min_p\":0.1,"
        "\"stop_token_ids\":[2,3],\"ringlm\":{\"class\":\"batch\",\"deadline_ms\":500}}";
    gw_params p;
    gw_err e;
    cr_assert_eq(gw_params_parse(GW_COMPLETION, b, strlen(b), &pcfg, &p, &e), 0, "%s", e.message);
    cr_assert_str_eq(p.prompt_text, "Once");
    cr_assert_eq(p.max_tokens, 7);
    cr_assert_float_eq(p.temperature, 0.0, 1e-9);
    cr_assert_float_eq(p.top_p, 0.5, 1e-9);
    cr_assert_eq(p.top_k, 0);
    cr_assert(p.has_seed && p.seed == 42);
    cr_assert_eq(p.stop.n, 2);
    cr_assert_str_eq(p.stop.s[1], "bc");
    cr_assert(p.stream && p.include_usage);
    cr_assert_str_eq(p.class_name, "batch");
    cr_assert_eq(p.deadline_ms, 500);
    cr_assert_eq(p.smp.n_logit_bias, 2);
    cr_assert(p.smp.logit_bias[0].token + p.smp.logit_bias[1].token == 16);
    cr_assert_float_eq(p.smp.presence_penalty, 0.5f, 1e-6);
    cr_assert_float_eq(p.smp.frequency_penalty, 0.25f, 1e-6);
    cr_assert_float_eq(p.smp.repetition_penalty, 1.5f, 1e-6);
    cr_assert_float_eq(p.smp.min_p, 0.1f, 1e-6);
    cr_assert_eq(p.smp.n_stop_token_ids, 2);
    cr_assert_eq(p.smp.stop_token_ids[1], 3);
    gw_params_free(&p);

    const char *ids = "{\"prompt\":[[1,403,407]],\"max_tokens\":null}";
    cr_assert_eq(gw_params_parse(GW_COMPLETION, ids, strlen(ids), &pcfg, &p, &e), 0, "%s",
                 e.message);
    cr_assert_null(p.prompt_text);
    cr_assert_eq(p.n_prompt_ids, 3);
    cr_assert_eq(p.prompt_ids[2], 407);
    cr_assert_eq(p.max_tokens, -1, "null is absent: the endpoint's default");
    cr_assert_float_eq(p.temperature, 1.0, 1e-9);
    gw_params_free(&p);
}

Test(gateway_units, another_model_name_is_404_and_chat_renders_the_template)
{
    gw_params p;
    gw_err e;
    const char *b = "{\"model\":\"gpt-4\",\"prompt\":\"x\"}";
    cr_assert_eq(gw_params_parse(GW_COMPLETION, b, strlen(b), &pcfg, &p, &e), -1);
    cr_assert_eq(e.status, 404);
    cr_assert_str_eq(e.code, "model_not_found");
    gw_parse_cfg chatml = {.served_model = NULL, .tpl = RINGLM_CHAT_CHATML};
    const char *c =
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi \"},"
        "{\"type\":\"text\",\"text\":\"there\"}]}],\"max_completion_tokens\":3}";
    cr_assert_eq(gw_params_parse(GW_CHAT, c, strlen(c), &chatml, &p, &e), 0, "%s", e.message);
    cr_assert_str_eq(p.prompt_text,
                     "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
    cr_assert_eq(p.max_tokens, 3);
    gw_params_free(&p);
}

/* The chat templates are libclient's (ringlm_chat_format, tested against the models' Jinja in
 * test_gguf_vocab); what the gateway adds is the answer: messages a template cannot place
 * are a 400 naming 'messages' and the template. */
Test(gateway_units, messages_a_template_cannot_place_are_a_400_naming_them)
{
    gw_parse_cfg llama2 = {.served_model = NULL, .tpl = RINGLM_CHAT_LLAMA2};
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
                    "\"content\":\"b\"}]}";
    gw_params p;
    gw_err e;
    cr_assert_eq(gw_params_parse(GW_CHAT, b, strlen(b), &llama2, &p, &e), -1);
    cr_assert_eq(e.status, 400);
    cr_assert_str_eq(e.param, "messages");
    cr_assert(strstr(e.message, "alternate") && strstr(e.message, "llama2"), "%s", e.message);
}

/* ---- --reasoning-parser: reasoning_content split off an answer ------------------------- */

typedef struct pieces {
    char r[512], c[512];
    size_t rn, cn;
} pieces;

static int collect(void *arg, bool reasoning, const char *t, size_t n)
{
    pieces *p = arg;
    char *dst = reasoning ? p->r + p->rn : p->c + p->cn;
    memcpy(dst, t, n);
    *(reasoning ? &p->rn : &p->cn) += n;
    return 0;
}

Test(gateway_units, reasoning_is_split_off_whole_and_streamed_alike)
{
    static const struct {
        int parser;
        const char *text, *reasoning, *content; /* NULL: none */
    } cases[] = {
        {GW_REASON_DEEPSEEK_R1, "<think>\nsteps\n</think>\n\nThe answer.", "\nsteps\n",
         "\n\nThe answer."},
        {GW_REASON_DEEPSEEK_R1, "steps (the prompt opened the tag)</think>42",
         "steps (the prompt opened the tag)", "42"},
        {GW_REASON_DEEPSEEK_R1, "still thinking when it stopped", "still thinking when it stopped",
         NULL},
        {GW_REASON_DEEPSEEK_R1, "<think>a</think>", "a", NULL},
        {GW_REASON_DEEPSEEK_R1, "a</think>b</think>c", "a", "b</think>c"},
        {GW_REASON_QWEN3, "<think>\nx < y\n</think>\n\nyes", "\nx < y\n", "\n\nyes"},
        {GW_REASON_QWEN3, "plain answer </thi", NULL, "plain answer </thi"},
        {GW_REASON_QWEN3, "<thinking is not a tag", NULL, "<thinking is not a tag"},
        {GW_REASON_QWEN3, "<think></think>", "", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *t = cases[i].text, *r, *c;
        size_t n = strlen(t), rn, cn;
        gw_reason_split(cases[i].parser, t, n, &r, &rn, &c, &cn);
        cr_assert_eq(!r, !cases[i].reasoning, "case %zu: reasoning %s", i, r ? "found" : "none");
        cr_assert_eq(!c, !cases[i].content, "case %zu: content %s", i, c ? "found" : "none");
        if (r)
            cr_assert(rn == strlen(cases[i].reasoning) && !memcmp(r, cases[i].reasoning, rn),
                      "case %zu: reasoning \"%.*s\"", i, (int)rn, r);
        if (c)
            cr_assert(cn == strlen(cases[i].content) && !memcmp(c, cases[i].content, cn),
                      "case %zu: content \"%.*s\"", i, (int)cn, c);
        /* streamed in every chunk size: the same pieces, joined */
        for (size_t chunk = 1; chunk <= n; chunk++) {
            gw_reason_state st = {.parser = cases[i].parser};
            pieces p = {0};
            for (size_t k = 0; k < n; k += chunk)
                gw_reason_feed(&st, t + k, k + chunk > n ? n - k : chunk, k + chunk >= n, collect,
                               &p);
            cr_assert(p.rn == rn && !memcmp(p.r, r ? r : "", rn) && p.cn == cn &&
                          !memcmp(p.c, c ? c : "", cn),
                      "case %zu in chunks of %zu: reasoning \"%.*s\", content \"%.*s\"", i, chunk,
                      (int)p.rn, p.r, (int)p.cn, p.c);
        }
    }
    cr_assert_eq(gw_reason_by_name("deepseek_r1"), GW_REASON_DEEPSEEK_R1);
    cr_assert_eq(gw_reason_by_name("qwen3"), GW_REASON_QWEN3);
    cr_assert_eq(gw_reason_by_name("granite"), -1);
}
