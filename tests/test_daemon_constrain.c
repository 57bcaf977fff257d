/* SPDX-License-Identifier: MIT */
/*
 * tests/test_daemon_constrain.c — structured output through a real ringlmd serving stories260K
 * (its vocabulary has byte fallback, so any text can be generated) with its tokenizer:
 * every answer that finishes with the stop token parses and validates against its JSON Schema
 * (Debian's python3-jsonschema is the validator), regex answers match their pattern, choice
 * answers are one of the choices — so the stop token was never sampled where the constraint
 * could not end; a constraint that does not compile is rejected with bad_params and the
 * compiler's words, in the client's FINISH detail and the decision log, and the daemon goes on
 * serving; a kind the daemon does not enforce, or a daemon without a tokenizer, is refused at
 * submit with -ENOTSUP. Many constrained sequences decode in one batch (their masks computed
 * on the daemon's mask thread while the forward pass runs).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "libclient/ringlm.h"
#include "tests/daemon_constrain_util.h"
#include "tests/daemon_helpers.h"
#include "tests/helpers.h"

#define MAX_REQ 48
#define MAX_OUT 400

typedef dcu_env env;

typedef struct answer {
    uint64_t id;
    int32_t toks[MAX_OUT];
    uint32_t n;
    ringlm_event fin;
    char detail[256];
    bool done;
    char text[4 * MAX_OUT + 1];
} answer;

/* Submits n requests at once (one batch: the constrained rows decode together), each with
 * its own constraint and seed, and collects every stream to its FINISH. */
static void run_batch(env *e, const uint32_t *kinds, const char *const *cons, const size_t *lens,
                      int n, float temperature, uint32_t max_new, answer *out)
{
    ringlm_request rq[MAX_REQ];
    ringlm_sampling smp[MAX_REQ];
    uint64_t ids[MAX_REQ];
    cr_assert_leq(n, MAX_REQ);
    for (int i = 0; i < n; i++) {
        ringlm_request_init(&rq[i]);
        rq[i].prompt = e->prompt;
        rq[i].n_prompt = e->n_prompt;
        rq[i].max_new_tokens = max_new;
        rq[i].temperature = temperature;
        rq[i].seed = 1000 + (uint64_t)i;
        ringlm_sampling_init(&smp[i]);
        smp[i].constraint_kind = kinds[i];
        smp[i].constraint = cons[i];
        smp[i].constraint_bytes = lens ? lens[i] : (cons[i] ? strlen(cons[i]) : 0);
        if (e->use_no_ws) {
            smp[i].logit_bias = e->no_ws;
            smp[i].n_logit_bias = e->n_no_ws;
        }
    }
    cr_assert_eq(ringlm_submit_batch_ext(e->c, rq, smp, (uint32_t)n, ids), 0, "submit: %s",
                 ringlm_errdetail());
    memset(out, 0, sizeof *out * (size_t)n);
    for (int i = 0; i < n; i++) out[i].id = ids[i];
    int left = n;
    while (left) {
        ringlm_event ev;
        int rc = ringlm_next_event(e->c, &ev, 60000);
        cr_assert_gt(rc, 0, "next_event %d: %s", rc, ringlm_errdetail());
        int k = 0;
        while (k < n && out[k].id != ev.req_id) k++;
        cr_assert_lt(k, n, "an event of an unknown request %llu", (unsigned long long)ev.req_id);
        answer *a = &out[k];
        if (ev.kind == RINGLM_EV_TOKEN) {
            cr_assert_eq(ev.index, a->n);
            cr_assert_lt(a->n, MAX_OUT);
            a->toks[a->n++] = ev.token;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            a->fin = ev;
            a->done = true;
            const char *d = ringlm_event_detail(e->c);
            snprintf(a->detail, sizeof a->detail, "%s", d ? d : "");
            left--;
        }
    }
    for (int i = 0; i < n; i++)
        dcu_answer_text(e, e->prompt[e->n_prompt - 1], out[i].toks, out[i].n, out[i].text,
                        sizeof out[i].text);
}

/* Checks each answer that finished with the stop token (dcu_py_check); *n_checked: how
 * many. Returns the failures (0: all good). */
static int py_check(env *e, const char *mode, const char *const *cons, const size_t *lens,
                    const answer *a, int n, int *n_checked)
{
    const char *texts[MAX_REQ];
    cr_assert_leq(n, MAX_REQ);
    *n_checked = 0;
    for (int i = 0; i < n; i++) { /* the others were cut by max_tokens */
        texts[i] = a[i].fin.finish_reason == RINGLM_FINISH_STOP ? a[i].text : NULL;
        *n_checked += texts[i] != NULL;
    }
    return dcu_py_check(e, mode, cons, lens, texts, n);
}

/* ---- answers follow their constraint ---------------------------------------------------- */

static const char *const schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120}},\"required\":[\"name\",\"age\"],"
    "\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"enum\":[\"cat\",\"dog\",\"bird\"]},\"minItems\":1,"
    "\"maxItems\":4}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"boolean\"},"
    "\"next\":{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#/$defs/node\"}]}},"
    "\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
    "{\"type\":\"object\",\"properties\":{\"ok\":{\"const\":true},\"n\":{\"type\":\"number\"}},"
    "\"required\":[\"ok\"]}",
};
#define N_SCHEMAS (int)(sizeof schemas / sizeof *schemas)

Test(daemon_constrain, json_schema_answers_validate, .timeout = 300)
{
    env e;
    dcu_env_start(&e, true);
    cr_assert_eq(ringlm_constraint_kinds(e.c),
                 1 << RINGLM_CONSTRAINT_JSON_SCHEMA | 1 << RINGLM_CONSTRAINT_JSON_OBJECT |
                     1 << RINGLM_CONSTRAINT_REGEX | 1 << RINGLM_CONSTRAINT_CHOICE |
                     1 << RINGLM_CONSTRAINT_GRAMMAR | 1 << RINGLM_CONSTRAINT_PYTHON_CALLS);
    /* 32 sequences at once, 8 per schema, sampled (temperature 1): the model wanders, the
     * mask keeps it inside the schema */
    enum { N = 32 };
    uint32_t kinds[N];
    const char *cons[N];
    for (int i = 0; i < N; i++) {
        kinds[i] = RINGLM_CONSTRAINT_JSON_SCHEMA;
        cons[i] = schemas[i % N_SCHEMAS];
    }
    static answer a[N];
    e.use_no_ws = true;
    run_batch(&e, kinds, cons, NULL, N, 1.0f, 300, a);
    int stopped = 0;
    for (int i = 0; i < N; i++) {
        cr_assert(a[i].fin.finish_reason == RINGLM_FINISH_STOP ||
                      a[i].fin.finish_reason == RINGLM_FINISH_LENGTH,
                  "request %d ended %s/%s: %s", i, ringlm_reason_name(a[i].fin.finish_reason),
                  ringlm_reason_name(a[i].fin.reject_reason), a[i].detail);
        stopped += a[i].fin.finish_reason == RINGLM_FINISH_STOP;
    }
    for (int i = 0; i < 8; i++)
        cr_log_info("%s %u: %s", ringlm_reason_name(a[i].fin.finish_reason), a[i].n, a[i].text);
    int checked = 0;
    cr_expect_eq(py_check(&e, "schema", cons, NULL, a, N, &checked), 0,
                 "finished answers that do not validate");
    cr_log_info("%d of %d answers finished, all validated", checked, N);
    cr_expect_geq(stopped, N / 4, "only %d of %d answers finished within 300 tokens", stopped, N);
    /* json_object: any object */
    for (int i = 0; i < 8; i++) {
        kinds[i] = RINGLM_CONSTRAINT_JSON_OBJECT;
        cons[i] = NULL;
    }
    run_batch(&e, kinds, cons, NULL, 8, 1.0f, 300, a);
    for (int i = 0; i < 8; i++) {
        cr_expect_neq(a[i].fin.finish_reason, RINGLM_FINISH_REJECTED, "%s", a[i].detail);
        cons[i] = "{\"type\":\"object\"}";
    }
    cr_expect_eq(py_check(&e, "schema", cons, NULL, a, 8, &checked), 0);
    dcu_env_stop(&e);
}

Test(daemon_constrain, regex_and_choice_answers_match, .timeout = 300)
{
    env e;
    dcu_env_start(&e, true);
    static const char *const res[] = {"[a-z]+@[a-z]+\\.(com|org)", "(yes|no)! [0-9]{3}",
                                      "The (cat|dog) sat on [a-z ]{1,20}\\.",
                                      "[A-Z][a-z]*( [a-z]+){2,5}\\."};
    enum { N = 16 };
    uint32_t kinds[N];
    const char *cons[N];
    for (int i = 0; i < N; i++) {
        kinds[i] = RINGLM_CONSTRAINT_REGEX;
        cons[i] = res[i % 4];
    }
    static answer a[N];
    run_batch(&e, kinds, cons, NULL, N, 1.0f, 200, a);
    int checked = 0;
    cr_expect_eq(py_check(&e, "regex", cons, NULL, a, N, &checked), 0);
    cr_expect_geq(checked, N / 4, "only %d of %d regex answers finished", checked, N);
    /* choices, NUL-separated */
    static const char ch1[] = "red\0green\0blue", ch2[] = "a long answer\0a\0an answer";
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        kinds[i] = RINGLM_CONSTRAINT_CHOICE;
        cons[i] = i % 2 ? ch1 : ch2;
        lens[i] = i % 2 ? sizeof ch1 - 1 : sizeof ch2 - 1;
    }
    run_batch(&e, kinds, cons, lens, N, 1.0f, 50, a);
    for (int i = 0; i < N; i++) /* a choice always ends: nothing can follow a whole one */
        cr_expect_eq(a[i].fin.finish_reason, RINGLM_FINISH_STOP, "choice %d: %s (%s)", i,
                     ringlm_reason_name(a[i].fin.finish_reason), a[i].text);
    cr_expect_eq(py_check(&e, "choice", cons, lens, a, N, &checked), 0);
    cr_expect_eq(checked, N);
    dcu_env_stop(&e);
}

/* GBNF grammars (llama.cpp's format): every finished answer is a sentence of its grammar,
 * checked by Python's re against a regular expression of the same language. */
Test(daemon_constrain, gbnf_answers_are_sentences_of_their_grammar, .timeout = 300)
{
    env e;
    dcu_env_start(&e, true);
    static const char *const gbnf[] = {
        "root ::= answer \"! \" [0-9] [0-9] [0-9]\nanswer ::= \"yes\" | \"no\"\n",
        "root ::= \"The \" pet \" sat on \" [a-z ]{1,20} \".\"\npet ::= \"cat\" | \"dog\"\n",
        "# a list, right-recursive\nroot ::= item rest\nrest ::= \", \" item rest | \".\"\n"
        "item ::= [a-z]+\n",
        "root ::= [A-Z] [a-z]* (\" \" [a-z]+){2,5} \".\"\n",
    };
    static const char *const same[] = {"(yes|no)! [0-9]{3}", "The (cat|dog) sat on [a-z ]{1,20}\\.",
                                       "[a-z]+(, [a-z]+)*\\.", "[A-Z][a-z]*( [a-z]+){2,5}\\."};
    enum { N = 16 };
    uint32_t kinds[N];
    const char *cons[N], *res[N];
    for (int i = 0; i < N; i++) {
        kinds[i] = RINGLM_CONSTRAINT_GRAMMAR;
        cons[i] = gbnf[i % 4];
        res[i] = same[i % 4];
    }
    static answer a[N];
    run_batch(&e, kinds, cons, NULL, N, 1.0f, 200, a);
    int checked = 0;
    cr_expect_eq(py_check(&e, "regex", res, NULL, a, N, &checked), 0);
    cr_expect_geq(checked, N / 4, "only %d of %d grammar answers finished", checked, N);
    dcu_env_stop(&e);
}

/* With ignore_stop a request goes on after its constraint is complete: only stop tokens
 * follow (the answer is the choice, then stop tokens), never an error. */
Test(daemon_constrain, ignore_stop_goes_on_with_stop_tokens_after_the_end, .timeout = 120)
{
    env e;
    dcu_env_start(&e, true);
    ringlm_request rq;
    ringlm_request_init(&rq);
    rq.prompt = e.prompt;
    rq.n_prompt = e.n_prompt;
    rq.max_new_tokens = 12;
    rq.ignore_stop = true;
    ringlm_sampling smp;
    ringlm_sampling_init(&smp);
    smp.constraint_kind = RINGLM_CONSTRAINT_CHOICE;
    smp.constraint = "no\0yes";
    smp.constraint_bytes = 6;
    uint64_t id;
    cr_assert_eq(ringlm_submit_ext(e.c, &rq, &smp, &id), 0, "%s", ringlm_errdetail());
    int32_t toks[32];
    uint32_t n = 0;
    ringlm_event ev;
    for (;;) {
        cr_assert_gt(ringlm_next_event(e.c, &ev, 30000), 0, "%s", ringlm_errdetail());
        if (ev.kind == RINGLM_EV_TOKEN && n < 32) toks[n++] = ev.token;
        if (ev.kind == RINGLM_EV_FINISH) break;
    }
    const char *d = ringlm_event_detail(e.c);
    cr_assert_eq(ev.finish_reason, RINGLM_FINISH_LENGTH, "ended %s: %s",
                 ringlm_reason_name(ev.finish_reason), d ? d : "");
    cr_assert_eq(n, 12u);
    /* the choice's tokens, then only the model's stop token (BOS for a llama2.c model) */
    char text[64] = "";
    uint32_t k = 0;
    int32_t prev = e.prompt[e.n_prompt - 1];
    for (; k < n && toks[k] != 1; k++) {
        const char *p;
        cr_assert_eq(ringlm_token_text(e.t, prev, toks[k], &p), 0);
        strncat(text, p, sizeof text - strlen(text) - 1);
        prev = toks[k];
    }
    cr_expect(!strcmp(text, "no") || !strcmp(text, "yes"), "answer '%s'", text);
    cr_expect_lt(k, n, "no stop token after the answer");
    for (; k < n; k++) cr_expect_eq(toks[k], 1, "token %u after the end is %d", k, toks[k]);
    dcu_env_stop(&e);
}

/* ---- bad constraints ------------------------------------------------------------------ */

Test(daemon_constrain, a_constraint_that_does_not_compile_is_rejected_with_its_reason,
     .timeout = 120)
{
    env e;
    dcu_env_start(&e, true);
    static const struct {
        uint32_t kind;
        const char *text, *says;
    } bad[] = {
        {RINGLM_CONSTRAINT_JSON_SCHEMA, "{\"type\": \"object\", ", "JSON"},
        {RINGLM_CONSTRAINT_JSON_SCHEMA,
         "{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},"
         "\"$ref\":\"#/$defs/a\"}",
         "$ref"},
        {RINGLM_CONSTRAINT_JSON_SCHEMA, "{\"not\": {\"uniqueItems\": true}}", "not"},
        {RINGLM_CONSTRAINT_REGEX, "a(b", "offset"},
        {RINGLM_CONSTRAINT_REGEX, "(a)\\1", "back"},
        {RINGLM_CONSTRAINT_GRAMMAR, "root ::= \"a\" itme\n", "undefined rule 'itme'"},
        {RINGLM_CONSTRAINT_GRAMMAR, "root ::= root \"a\" | \"b\"\n", "left"},
    };
    enum { N = sizeof bad / sizeof bad[0] };
    char details[N][256];
    /* twice each: the second answer comes from the cache of failed compiles */
    for (int round = 0; round < 2; round++) {
        uint32_t kinds[N];
        const char *cons[N];
        for (int i = 0; i < N; i++) {
            kinds[i] = bad[i].kind;
            cons[i] = bad[i].text;
        }
        static answer a[N];
        run_batch(&e, kinds, cons, NULL, N, 0.0f, 20, a);
        for (int i = 0; i < N; i++) {
            cr_expect_eq(a[i].fin.finish_reason, RINGLM_FINISH_REJECTED, "%s: %s", bad[i].text,
                         ringlm_reason_name(a[i].fin.finish_reason));
            cr_expect_eq(a[i].fin.reject_reason, RINGLM_R_BAD_PARAMS);
            cr_expect_eq(a[i].n, 0u);
            cr_expect(strncmp(a[i].detail, "constraint: ", 12) == 0 &&
                          strcasestr(a[i].detail, bad[i].says),
                      "%s: detail \"%s\" does not say %s", bad[i].text, a[i].detail, bad[i].says);
            snprintf(details[i], sizeof details[i], "%s", a[i].detail);
        }
    }
    /* the daemon goes on serving constrained requests */
    uint32_t k = RINGLM_CONSTRAINT_CHOICE;
    const char *c = "yes\0no";
    size_t l = 6;
    answer ok;
    run_batch(&e, &k, &c, &l, 1, 0.0f, 20, &ok);
    cr_expect_eq(ok.fin.finish_reason, RINGLM_FINISH_STOP, "%s", ok.detail);
    cr_expect(!strcmp(ok.text, "yes") || !strcmp(ok.text, "no"), "%s", ok.text);
    /* the decision log has each reject with the same words (quoted as JSON: the detail's
     * words up to its first character JSON escapes) */
    dcu_env_halt(&e);
    for (int i = 0; i < N; i++) {
        char words[64];
        size_t wl = strlen(details[i]) < sizeof words - 1 ? strlen(details[i]) : sizeof words - 1;
        memcpy(words, details[i], wl);
        words[wl] = 0;
        words[strcspn(words, "\"\\")] = 0;
        cr_expect_geq(count_lines2(e.d.declog, "\"bad_params\"", words), 2,
                      "decision log has no two bad_params rejects saying \"%s\"", words);
    }
    dmn_cleanup(&e.d);
}

Test(daemon_constrain, what_is_not_enforced_is_refused_at_submit, .timeout = 120)
{
    env e;
    dcu_env_start(&e, true);
    ringlm_request rq;
    ringlm_request_init(&rq);
    rq.prompt = e.prompt;
    rq.n_prompt = e.n_prompt;
    ringlm_sampling smp;
    ringlm_sampling_init(&smp);
    uint64_t id;
    /* structural errors are -EINVAL naming the member, whatever the daemon */
    const char *field = NULL;
    smp.constraint_kind = 9;
    cr_expect_eq(ringlm_request_check_ext(&rq, &smp, 0, &field), -EINVAL);
    cr_expect_str_eq(field ? field : "", "constraint");
    smp.constraint_kind = RINGLM_CONSTRAINT_JSON_OBJECT; /* takes no bytes */
    smp.constraint = "{}";
    smp.constraint_bytes = 2;
    cr_expect_eq(ringlm_request_check_ext(&rq, &smp, 0, &field), -EINVAL);
    smp.constraint_kind = RINGLM_CONSTRAINT_REGEX;
    smp.constraint_bytes = 0; /* needs its text */
    cr_expect_eq(ringlm_request_check_ext(&rq, &smp, 0, &field), -EINVAL);
    ringlm_close(e.c);
    e.c = NULL;
    ringlm_tokenizer_free(e.t);
    cr_expect_eq(dmn_stop(&e.d, SIGTERM, 10000), 0);
    dmn_cleanup(&e.d);

    /* a daemon without a tokenizer enforces nothing, and says so */
    dcu_env_start(&e, false);
    cr_expect_eq(ringlm_constraint_kinds(e.c), 0);
    smp.constraint_kind = RINGLM_CONSTRAINT_JSON_OBJECT;
    smp.constraint = NULL;
    smp.constraint_bytes = 0;
    cr_expect_eq(ringlm_submit_ext(e.c, &rq, &smp, &id), -ENOTSUP);
    cr_expect(strstr(ringlm_errdetail(), "enforces none"), "%s", ringlm_errdetail());
    dcu_env_stop(&e);
}
