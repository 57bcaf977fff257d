/* SPDX-License-Identifier: MIT */
/*
 * tests/test_daemon_nseq_constrain.c — n samples of one prompt with a constraint, through a
 * real ringlmd serving stories260K with its tokenizer: each sample carries its own matcher,
 * so each of the n answers follows the constraint on its own (a JSON Schema answer validates
 * with Debian's python3-jsonschema, a choice answer is one of the choices), the stop token
 * ends a sample only where its own text is complete, the samples differ at temperature 1, and
 * sample i is token for token the single constrained request with seed + i — whether the
 * samples draw their first token from the leader's row (a prompt of two tokens or more) or
 * compute the prompt's last row themselves (a one-token prompt). A constraint that does not
 * compile rejects all n, each FINISH with the compiler's words.
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

#define MAX_N   8
#define MAX_OUT 200

/* Every request here carries the env's no_ws bias: a 260K-parameter model at temperature 1
 * would wander in the whitespace JSON allows. */
typedef dcu_env env;

/* The daemon with its tokenizer, and room for MAX_N samples of one request. */
static void env_start(env *e)
{
    dcu_env_start(e, true);
    cr_assert_geq(ringlm_max_samples(e->c), MAX_N);
}

typedef struct answer {
    int32_t toks[MAX_OUT];
    uint32_t n;
    ringlm_event fin;
    char detail[256];
    char text[4 * MAX_OUT + 1];
} answer;

/* What one request asks: its constraint, seed, prompt and n. */
typedef struct ask {
    uint32_t kind;
    const char *cons;
    size_t bytes;
    uint64_t seed;
    uint32_t n;
    const int32_t *prompt;
    uint32_t n_prompt;
} ask;

/* Submits the requests at once (one batch) and collects every sample's stream to its
 * FINISH: the answers of request i's samples follow each other in out. Returns the answers. */
static int run(env *e, const ask *asks, int n_asks, answer *out, int max_out)
{
    ringlm_request rq[MAX_N];
    ringlm_sampling smp[MAX_N];
    uint64_t ids[MAX_N];
    uint32_t first[MAX_N + 1];
    cr_assert_leq(n_asks, MAX_N);
    first[0] = 0;
    for (int i = 0; i < n_asks; i++) {
        ringlm_request_init(&rq[i]);
        rq[i].prompt = asks[i].prompt ? asks[i].prompt : e->prompt;
        rq[i].n_prompt = asks[i].prompt ? asks[i].n_prompt : e->n_prompt;
        rq[i].max_new_tokens = MAX_OUT;
        rq[i].temperature = 1.0f;
        rq[i].seed = asks[i].seed;
        ringlm_sampling_init(&smp[i]);
        smp[i].n = asks[i].n;
        smp[i].constraint_kind = asks[i].kind;
        smp[i].constraint = asks[i].cons;
        smp[i].constraint_bytes = asks[i].bytes ? asks[i].bytes : strlen(asks[i].cons);
        smp[i].logit_bias = e->no_ws;
        smp[i].n_logit_bias = e->n_no_ws;
        first[i + 1] = first[i] + (asks[i].n ? asks[i].n : 1);
    }
    int total = (int)first[n_asks];
    cr_assert_leq(total, max_out);
    cr_assert_eq(ringlm_submit_batch_ext(e->c, rq, smp, (uint32_t)n_asks, ids), 0, "submit: %s",
                 ringlm_errdetail());
    memset(out, 0, sizeof *out * (size_t)total);
    int left = total;
    while (left) {
        ringlm_event ev;
        int rc = ringlm_next_event(e->c, &ev, 60000);
        cr_assert_gt(rc, 0, "next_event %d: %s", rc, ringlm_errdetail());
        int k = -1;
        for (int i = 0; i < n_asks && k < 0; i++)
            if (ev.req_id >= ids[i] && ev.req_id < ids[i] + (first[i + 1] - first[i]))
                k = (int)(first[i] + (ev.req_id - ids[i]));
        cr_assert_geq(k, 0, "an event of an unknown request %llu", (unsigned long long)ev.req_id);
        answer *a = &out[k];
        if (ev.kind == RINGLM_EV_TOKEN) {
            cr_assert_eq(ev.index, a->n);
            cr_assert_lt(a->n, MAX_OUT);
            a->toks[a->n++] = ev.token;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            a->fin = ev;
            const char *d = ringlm_event_detail(e->c);
            snprintf(a->detail, sizeof a->detail, "%s", d ? d : "");
            left--;
        }
    }
    /* the text as the matcher saw it */
    for (int i = 0; i < n_asks; i++) {
        const int32_t prev =
            asks[i].prompt ? asks[i].prompt[asks[i].n_prompt - 1] : e->prompt[e->n_prompt - 1];
        for (uint32_t s = first[i]; s < first[i + 1]; s++)
            dcu_answer_text(e, prev, out[s].toks, out[s].n, out[s].text, sizeof out[s].text);
    }
    return total;
}

/* Validates every answer against the schema (dcu_py_check); prints each failure. Returns
 * the failures. */
static int py_validate(env *e, const char *schema, const answer *a, int n)
{
    const char *cons[2 * MAX_N], *texts[2 * MAX_N];
    cr_assert_leq(n, 2 * MAX_N);
    for (int i = 0; i < n; i++) {
        cons[i] = schema;
        texts[i] = a[i].text;
    }
    return dcu_py_check(e, "schema", cons, NULL, texts, n);
}

static bool same_tokens(const answer *a, const answer *b)
{
    return a->n == b->n && !memcmp(a->toks, b->toks, sizeof(int32_t) * a->n);
}

/* Bounded: every answer ends within its budget (a name of at most 8 characters, an age of at
 * most 3 digits, no whitespace), so every one of the 4 must validate. */
static const char person[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120}},\"required\":[\"name\",\"age\"],"
    "\"additionalProperties\":false}";

Test(daemon_nseq_constrain, n4_json_schema_answers_each_validate_and_differ, .timeout = 300)
{
    env e;
    env_start(&e);
    enum { N = 4 };
    const uint64_t seed = 4242;
    ask group = {.kind = RINGLM_CONSTRAINT_JSON_SCHEMA, .cons = person, .seed = seed, .n = N};
    static answer a[N], single[N];
    cr_assert_eq(run(&e, &group, 1, a, N), N);
    for (int i = 0; i < N; i++) {
        cr_log_info("sample %d (%u tokens): %s", i, a[i].n, a[i].text);
        cr_assert_eq(a[i].fin.finish_reason, RINGLM_FINISH_STOP,
                     "sample %d ended %s/%s after %u tokens: %s (%s)", i,
                     ringlm_reason_name(a[i].fin.finish_reason),
                     ringlm_reason_name(a[i].fin.reject_reason), a[i].n, a[i].detail, a[i].text);
    }
    cr_expect_eq(py_validate(&e, person, a, N), 0, "answers that do not validate");
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            cr_expect(strcmp(a[i].text, a[j].text) != 0,
                      "samples %d and %d gave the same answer at temperature 1: %s", i, j,
                      a[i].text);
    /* each sample is the single constrained request with seed + i */
    ask one[N];
    for (int i = 0; i < N; i++)
        one[i] = (ask){.kind = group.kind, .cons = person, .seed = seed + (uint64_t)i, .n = 1};
    cr_assert_eq(run(&e, one, N, single, N), N);
    for (int i = 0; i < N; i++)
        cr_expect(same_tokens(&a[i], &single[i]),
                  "sample %d (%s) is not the single request with seed + %d (%s)", i, a[i].text, i,
                  single[i].text);
    dcu_env_stop(&e);
}

/* Choices, n 8: every sample's answer is a choice and ends with the stop token — with the
 * first token drawn from the leader's row (the story prompt), and with each sample
 * computing the prompt's last row itself (a one-token prompt: nothing to fork from). (That
 * the samples differ is the JSON test's: here stories260K puts almost all of its weight on
 * one choice's first token.) */
Test(daemon_nseq_constrain, n8_choice_answers_are_each_a_choice, .timeout = 300)
{
    env e;
    env_start(&e);
    static const char ch[] = "red\0green\0blue\0a yellow one";
    static const int32_t bos[1] = {1};
    static answer a[2 * MAX_N], single[MAX_N];
    for (int round = 0; round < 2; round++) {
        ask group = {.kind = RINGLM_CONSTRAINT_CHOICE,
                     .cons = ch,
                     .bytes = sizeof ch - 1,
                     .seed = 77,
                     .n = MAX_N,
                     .prompt = round ? bos : NULL,
                     .n_prompt = round ? 1 : 0};
        cr_assert_eq(run(&e, &group, 1, a, 2 * MAX_N), MAX_N);
        for (int i = 0; i < MAX_N; i++) {
            cr_expect_eq(a[i].fin.finish_reason, RINGLM_FINISH_STOP, "round %d sample %d: %s (%s)",
                         round, i, ringlm_reason_name(a[i].fin.finish_reason), a[i].detail);
            cr_expect(!strcmp(a[i].text, "red") || !strcmp(a[i].text, "green") ||
                          !strcmp(a[i].text, "blue") || !strcmp(a[i].text, "a yellow one"),
                      "round %d sample %d: '%s' is not a choice", round, i, a[i].text);
        }
        ask one[MAX_N];
        for (int i = 0; i < MAX_N; i++) {
            one[i] = group;
            one[i].n = 1;
            one[i].seed = group.seed + (uint64_t)i;
        }
        cr_assert_eq(run(&e, one, MAX_N, single, MAX_N), MAX_N);
        for (int i = 0; i < MAX_N; i++)
            cr_expect(same_tokens(&a[i], &single[i]),
                      "round %d: sample %d (%s) is not the single request with seed + %d (%s)",
                      round, i, a[i].text, i, single[i].text);
    }
    dcu_env_stop(&e);
}

/* A constraint that does not compile rejects the n samples together, each FINISH with the
 * compiler's words; the daemon goes on serving n > 1 with a good one. */
Test(daemon_nseq_constrain, a_constraint_that_does_not_compile_rejects_all_n, .timeout = 120)
{
    env e;
    env_start(&e);
    static answer a[MAX_N];
    for (int round = 0; round < 2; round++) { /* the second from the cache of failed compiles */
        ask bad = {.kind = RINGLM_CONSTRAINT_REGEX, .cons = "a(b", .seed = 1, .n = 3};
        cr_assert_eq(run(&e, &bad, 1, a, MAX_N), 3);
        for (int i = 0; i < 3; i++) {
            cr_expect_eq(a[i].fin.finish_reason, RINGLM_FINISH_REJECTED, "round %d sample %d: %s",
                         round, i, ringlm_reason_name(a[i].fin.finish_reason));
            cr_expect_eq(a[i].fin.reject_reason, RINGLM_R_BAD_PARAMS);
            cr_expect_eq(a[i].n, 0u);
            cr_expect(!strncmp(a[i].detail, "constraint: ", 12),
                      "round %d sample %d: detail \"%s\"", round, i, a[i].detail);
        }
    }
    static const char ch[] = "yes\0no";
    ask ok = {
        .kind = RINGLM_CONSTRAINT_CHOICE, .cons = ch, .bytes = sizeof ch - 1, .seed = 5, .n = 2};
    cr_assert_eq(run(&e, &ok, 1, a, MAX_N), 2);
    for (int i = 0; i < 2; i++)
        cr_expect(a[i].fin.finish_reason == RINGLM_FINISH_STOP &&
                      (!strcmp(a[i].text, "yes") || !strcmp(a[i].text, "no")),
                  "sample %d: %s '%s' %s", i, ringlm_reason_name(a[i].fin.finish_reason), a[i].text,
                  a[i].detail);
    dcu_env_stop(&e);
}

/* The capability a client reads before asking for n samples with a constraint: a daemon with
 * a tokenizer and --max-n above 1 says it runs them; one that runs a single sample (--max-n 1)
 * says it does not, and the library refuses such a request before sending it. */
Test(daemon_nseq_constrain, a_client_sees_whether_constrained_samples_run, .timeout = 120)
{
    env e;
    env_start(&e);
    cr_expect_eq(ringlm_samples_constrained(e.c), 1);
    cr_expect_eq(ringlm_samples_constrained(NULL), -EINVAL);
    dcu_env_stop(&e);

    dmn d;
    char model[512], tok[512];
    cr_assert(stories_path(model, sizeof model));
    snprintf(tok, sizeof tok, "%s/models/tok512.bin", th_shared_dir());
    const char *extra[] = {"--tokenizer", tok, "--max-n", "1", NULL};
    dmn_start(&d, model, NULL, extra);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    cr_expect_eq(ringlm_samples_constrained(c), 0);
    cr_expect_neq(ringlm_constraint_kinds(c), 0, "it still enforces constraints");
    int32_t prompt[1] = {1};
    ringlm_request rq;
    ringlm_request_init(&rq);
    rq.prompt = prompt;
    rq.n_prompt = 1;
    rq.max_new_tokens = 4;
    ringlm_sampling smp;
    ringlm_sampling_init(&smp);
    smp.n = 2;
    smp.constraint_kind = RINGLM_CONSTRAINT_REGEX;
    smp.constraint = "a+";
    smp.constraint_bytes = 2;
    uint64_t id;
    int rc = ringlm_submit_ext(c, &rq, &smp, &id);
    cr_expect(rc == -ENOTSUP || rc == -EINVAL, "n 2 with a constraint: %d %s", rc,
              ringlm_errdetail());
    ringlm_close(c);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}
