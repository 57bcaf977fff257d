/* SPDX-License-Identifier: MIT */
/*
 * ringlmd end to end, log-probabilities: a real daemon, this process as its client
 * (libringlm). The prompt log-probabilities of stories260K's reference prompt equal the
 * log-softmax of llama2.c's logits (reference-greedy.json) within 1e-4, with max_tokens 0
 * too (lm-evaluation-harness's echo scoring); each generated token's log-probability and
 * top n equal the log-softmax of the logits the engine computes for that sequence here, raw
 * and processed; a prompt whose log-probabilities are wanted is computed whole, even when
 * the prefix cache holds it; a request that asks for nothing gets nothing extra; bad counts
 * are refused at submit.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ringlm.h"
#include "engine_test_util.h"
#include "tests/daemon_helpers.h"
#include "tests/helpers.h"

TestSuite(daemon_logprobs, .timeout = 120);

/* ---- references ------------------------------------------------------------------------ */

static double lse_of(const float *v, int n)
{
    double max = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > max) max = v[i];
    for (int i = 0; i < n; i++) sum += exp((double)v[i] - max);
    return max + log(sum);
}

/* ids of the top n of v (descending, lower id first on ties) */
static void top_of(const float *v, int V, int n, int32_t *ids)
{
    for (int k = 0; k < n; k++) {
        int best = -1;
        for (int i = 0; i < V; i++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= ids[j] == i;
            if (!taken && (best < 0 || v[i] > v[best])) best = i;
        }
        ids[k] = best;
    }
}

/* The logits oracle: 8 input tokens and run.c's logits at each position. */
typedef struct oracle {
    int32_t toks[8];
    float *logits; /* [8][V] */
    int V;
} oracle;

static bool oracle_load(oracle *o)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/models/reference-greedy.json", th_shared_dir());
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) return false;
    json_t *pos = json_object_get(json_object_get(root, "logits_oracle"), "positions");
    cr_assert_eq(json_array_size(pos), 8);
    o->V = (int)json_array_size(json_object_get(json_array_get(pos, 0), "logits"));
    o->logits = malloc(sizeof(float) * 8 * (size_t)o->V);
    for (int p = 0; p < 8; p++) {
        json_t *pp = json_array_get(pos, (size_t)p);
        o->toks[p] = (int32_t)json_integer_value(json_object_get(pp, "input_token"));
        json_t *l = json_object_get(pp, "logits");
        for (int i = 0; i < o->V; i++)
            o->logits[(size_t)p * o->V + i] =
                (float)json_number_value(json_array_get(l, (size_t)i));
    }
    json_decref(root);
    return true;
}

/* Logits of every row of tokens[0..n) through the engine in this process: the reference
 * for generated tokens (run.c recorded none for them). */
static float *engine_logits(const char *model, const int32_t *tokens, int n, int *V_out)
{
    eng_model *m;
    cr_assert_eq(eng_model_load(model, &m), 0, "%s", eng_errmsg());
    int V = eng_model_cfg(m)->vocab_size;
    eng *e = ts_engine(m, 64, 16, 1);
    eng_batch_builder bb;
    cr_assert_eq(eng_bb_init(&bb, 1024, 1, 64, 16), 0);
    int32_t blocks[64];
    for (int j = 0; j < 64; j++) blocks[j] = j;
    cr_assert_eq(eng_bb_add_logits(&bb, tokens, 0, (uint32_t)n, blocks, 64, (uint32_t)n), 0, "%s",
                 eng_errmsg());
    float *out = malloc(sizeof(float) * (size_t)n * (size_t)V);
    cr_assert_eq(eng_execute(e, eng_bb_batch(&bb), out), 0, "%s", eng_errmsg());
    eng_bb_free(&bb);
    eng_destroy(e);
    eng_model_free(m);
    *V_out = V;
    return out;
}

/* ---- a request and what came back ------------------------------------------------------ */

typedef struct got {
    int n_prompt_ev, n_tok;
    int32_t prompt_tok[600], tok[600];
    uint32_t prompt_idx[600];
    ringlm_logprobs prompt_lp[600], lp[600];
    bool tok_has_lp[600];
    ringlm_event fin;
} got;

static dmn *g_dmn; /* the daemon of the running test, for its log on a failure */

/* Submits one request and collects its events until FINISH. */
static void run_one(ringlm_client *c, const ringlm_request *rq, const ringlm_sampling *smp, got *g)
{
    memset(g, 0, sizeof *g);
    uint64_t id;
    int rc = ringlm_submit_ext(c, rq, smp, &id);
    cr_assert_eq(rc, 0, "submit: %s (%s)", ringlm_strerror(rc), ringlm_errdetail());
    for (;;) {
        ringlm_event ev;
        rc = ringlm_next_event(c, &ev, 20000);
        if (rc != 1 && g_dmn) {
            dump_file(g_dmn->errlog, "ringlmd's stderr");
            dump_file(g_dmn->declog, "ringlmd's decision log");
        }
        cr_assert_eq(rc, 1, "next_event: %d %s", rc, ringlm_errdetail());
        cr_assert_eq(ev.req_id, id);
        ringlm_logprobs lp;
        int has = ringlm_event_logprobs(c, &lp);
        cr_assert_geq(has, 0);
        if (ev.kind == RINGLM_EV_PROMPT_TOKEN) {
            cr_assert_eq(g->n_tok, 0, "a prompt event after a generated token");
            cr_assert_eq(has, 1, "a PROMPT_TOKEN event without log-probabilities");
            cr_assert_eq(lp.token, ev.token);
            g->prompt_tok[g->n_prompt_ev] = ev.token;
            g->prompt_idx[g->n_prompt_ev] = ev.index;
            g->prompt_lp[g->n_prompt_ev++] = lp;
        } else if (ev.kind == RINGLM_EV_TOKEN) {
            cr_assert_eq(ev.index, (uint32_t)g->n_tok);
            g->tok[g->n_tok] = ev.token;
            g->tok_has_lp[g->n_tok] = has == 1;
            if (has) cr_assert_eq(lp.token, ev.token);
            g->lp[g->n_tok++] = lp;
        } else {
            cr_assert_eq(ev.kind, RINGLM_EV_FINISH);
            cr_assert_eq(has, 0, "a FINISH carries no log-probabilities");
            g->fin = ev;
            return;
        }
    }
}

static void start(dmn *d, char *model, size_t n)
{
    need_daemon_binary();
    if (!stories_path(model, n)) cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    /* exact float32 prompts: the log-probabilities are checked within 1e-4 of float32 logits
     * (by default prompt rows take the BF16 tiles, within 2e-2) */
    static const char *const exact[] = {"--prompt-exact", NULL};
    dmn_start(d, model, NULL, exact);
    g_dmn = d;
}

static void stop(dmn *d, ringlm_client *c)
{
    ringlm_close(c);
    assert_back_to_baseline(d, 5000);
    cr_expect_eq(dmn_stop(d, SIGTERM, 10000), 0);
}

/* ---- tests ------------------------------------------------------------------------------ */

/* The reference prompt's tokens as the prompt: 7 PROMPT_TOKEN events (positions 1..7), each
 * log p = log-softmax of run.c's logits at the position before, within 1e-4, top 5 in
 * run.c's order; the one generated token (greedy) likewise from position 7. */
Test(daemon_logprobs, echo_logprobs_equal_llama2c_log_softmax)
{
    dmn d;
    char model[512];
    start(&d, model, sizeof model);
    oracle o;
    if (!oracle_load(&o)) cr_skip_test("reference-greedy.json not found");
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    for (int max_new = 1; max_new >= 0; max_new--) {
        ringlm_request rq;
        ringlm_request_init(&rq);
        rq.prompt = o.toks;
        rq.n_prompt = 8;
        rq.max_new_tokens = (uint32_t)max_new;
        ringlm_sampling smp;
        ringlm_sampling_init(&smp);
        smp.flags = RINGLM_SAMPLING_PROMPT_LOGPROBS | RINGLM_SAMPLING_LOGPROBS;
        smp.prompt_logprobs = 5;
        smp.top_logprobs = 5;
        got g;
        run_one(c, &rq, &smp, &g);
        cr_assert_eq(g.fin.finish_reason, RINGLM_FINISH_LENGTH, "max_new %d: finish %d cause %d",
                     max_new, g.fin.finish_reason, g.fin.reject_reason);
        cr_assert_eq(g.n_prompt_ev, 7, "max_new %d: %d prompt events", max_new, g.n_prompt_ev);
        cr_assert_eq(g.n_tok, max_new);
        cr_assert_eq(g.fin.n_tokens, (uint32_t)max_new);
        for (int k = 0; k < 7; k++) {
            int pos = k + 1;
            cr_assert_eq(g.prompt_idx[k], (uint32_t)pos);
            cr_assert_eq(g.prompt_tok[k], o.toks[pos]);
            const float *row = o.logits + (size_t)(pos - 1) * o.V;
            double want = row[o.toks[pos]] - lse_of(row, o.V);
            cr_assert(fabs(g.prompt_lp[k].logprob - want) < 1e-4,
                      "position %d: log p(%d) %.6f, run.c's logits give %.6f", pos, o.toks[pos],
                      g.prompt_lp[k].logprob, want);
            cr_assert_eq(g.prompt_lp[k].n_top, 5);
            cr_assert(!g.prompt_lp[k].processed);
            int32_t ids[5];
            top_of(row, o.V, 5, ids);
            for (int j = 0; j < 5; j++) {
                cr_assert_eq(g.prompt_lp[k].top_token[j], ids[j], "position %d top %d", pos, j);
                cr_assert(fabs(g.prompt_lp[k].top_logprob[j] - (row[ids[j]] - lse_of(row, o.V))) <
                          1e-4);
            }
        }
        if (max_new == 1) {
            const float *row = o.logits + (size_t)7 * o.V;
            int32_t ids[1];
            top_of(row, o.V, 1, ids);
            cr_assert_eq(g.tok[0], ids[0]);
            cr_assert(g.tok_has_lp[0]);
            cr_assert(fabs(g.lp[0].logprob - (row[ids[0]] - lse_of(row, o.V))) < 1e-4);
            cr_assert_eq(g.lp[0].rank, 1);
        }
    }
    free(o.logits);
    stop(&d, c);
}

/* Generated tokens, raw and processed, against the log-softmax of the engine's logits of
 * the same sequence computed here. */
Test(daemon_logprobs, generated_logprobs_equal_log_softmax_of_the_logits)
{
    dmn d;
    char model[512];
    start(&d, model, sizeof model);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    int32_t prompt[5] = {1, 403, 407, 261, 378};
    for (int mode = 0; mode < 3; mode++) {
        ringlm_request rq;
        ringlm_request_init(&rq);
        rq.prompt = prompt;
        rq.n_prompt = 5;
        rq.max_new_tokens = 40;
        rq.ignore_stop = true;
        ringlm_sampling smp;
        ringlm_sampling_init(&smp);
        smp.flags = RINGLM_SAMPLING_LOGPROBS;
        smp.top_logprobs = mode == 0 ? 20 : 4;
        if (mode >= 1) { /* sampled */
            rq.temperature = 0.7f;
            rq.seed = 99;
        }
        if (mode == 2) { /* processed: logits / 0.7 over the top 3 */
            rq.top_k = 3;
            smp.flags |= RINGLM_SAMPLING_LOGPROBS_PROCESSED;
        }
        got g;
        run_one(c, &rq, &smp, &g);
        cr_assert_eq(g.n_tok, 40);
        int32_t seq[64];
        memcpy(seq, prompt, sizeof prompt);
        memcpy(seq + 5, g.tok, sizeof(int32_t) * 40);
        int V;
        float *L = engine_logits(model, seq, 45, &V);
        float *row = malloc(sizeof(float) * (size_t)V);
        for (int t = 0; t < 40; t++) {
            cr_assert(g.tok_has_lp[t], "mode %d token %d without log-probabilities", mode, t);
            memcpy(row, L + (size_t)(4 + t) * V, sizeof(float) * (size_t)V);
            int n_ok = V;
            if (mode == 2) {
                int32_t keep[3];
                top_of(row, V, 3, keep);
                for (int i = 0; i < V; i++) {
                    bool k = i == keep[0] || i == keep[1] || i == keep[2];
                    row[i] = k ? row[i] / 0.7f : -INFINITY;
                }
                n_ok = 3;
            }
            double lse = lse_of(row, V);
            cr_assert(fabs(g.lp[t].logprob - (row[g.tok[t]] - lse)) < 1e-4,
                      "mode %d token %d (%d): %.6f, log-softmax %.6f", mode, t, g.tok[t],
                      g.lp[t].logprob, row[g.tok[t]] - lse);
            uint32_t want_n = (uint32_t)(mode == 0 ? 20 : (n_ok < 4 ? n_ok : 4));
            cr_assert_eq(g.lp[t].n_top, want_n, "mode %d token %d: %u alternatives", mode, t,
                         g.lp[t].n_top);
            cr_assert_eq(g.lp[t].processed, mode == 2);
            int32_t ids[20];
            top_of(row, V, (int)want_n, ids);
            for (uint32_t j = 0; j < want_n; j++) {
                cr_assert_eq(g.lp[t].top_token[j], ids[j], "mode %d token %d top %u", mode, t, j);
                cr_assert(fabs(g.lp[t].top_logprob[j] - (row[ids[j]] - lse)) < 1e-4);
            }
            if (mode == 0) cr_assert_eq(g.tok[t], ids[0], "greedy picks the top token");
        }
        free(row);
        free(L);
    }
    stop(&d, c);
}

/* The prefix cache holds the prompt's blocks (a plain request put them there); a request for
 * its log-probabilities still computes every row and gets every position. A plain request
 * after it gets no log-probabilities at all. */
Test(daemon_logprobs, prompt_logprobs_bypass_the_prefix_cache_and_plain_requests_get_none)
{
    dmn d;
    char model[512];
    start(&d, model, sizeof model);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    int32_t prompt[40];
    prompt[0] = 1;
    for (int i = 1; i < 40; i++) prompt[i] = 260 + (i * 7) % 200;
    ringlm_request rq;
    ringlm_request_init(&rq);
    rq.prompt = prompt;
    rq.n_prompt = 40;
    rq.max_new_tokens = 2;
    got g;
    run_one(c, &rq, NULL, &g);
    run_one(c, &rq, NULL, &g);
    cr_assert_eq(g.fin.n_cached_tokens, 32, "the cache holds the prompt's 2 full blocks");
    for (int t = 0; t < g.n_tok; t++) cr_assert(!g.tok_has_lp[t]);
    cr_assert_eq(g.n_prompt_ev, 0);
    ringlm_sampling smp;
    ringlm_sampling_init(&smp);
    smp.flags = RINGLM_SAMPLING_PROMPT_LOGPROBS;
    smp.prompt_logprobs = 1;
    rq.max_new_tokens = 0;
    run_one(c, &rq, &smp, &g);
    cr_assert_eq(g.fin.n_cached_tokens, 0, "prompt log-probabilities use no cached block");
    cr_assert_eq(g.n_prompt_ev, 39);
    int V;
    float *L = engine_logits(model, prompt, 40, &V);
    for (int k = 0; k < 39; k++) {
        const float *row = L + (size_t)k * V;
        cr_assert_eq(g.prompt_idx[k], (uint32_t)(k + 1));
        cr_assert(fabs(g.prompt_lp[k].logprob - (row[prompt[k + 1]] - lse_of(row, V))) < 1e-4,
                  "position %d", k + 1);
        cr_assert_eq(g.prompt_lp[k].n_top, 1);
    }
    free(L);
    stop(&d, c);
}

/* Out of range counts are refused at submit, naming the field; nothing reaches the daemon. */
Test(daemon_logprobs, bad_counts_are_refused_at_submit)
{
    dmn d;
    char model[512];
    start(&d, model, sizeof model);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    int32_t prompt[2] = {1, 300};
    ringlm_request rq;
    ringlm_request_init(&rq);
    rq.prompt = prompt;
    rq.n_prompt = 2;
    ringlm_sampling smp;
    ringlm_sampling_init(&smp);
    smp.flags = RINGLM_SAMPLING_LOGPROBS;
    smp.top_logprobs = 21;
    const char *field = NULL;
    cr_assert_eq(ringlm_request_check_ext(&rq, &smp, 0, &field), -EINVAL);
    cr_assert_str_eq(field, "top_logprobs");
    cr_assert_eq(ringlm_submit_ext(c, &rq, &smp, NULL), -EINVAL);
    smp.top_logprobs = 0;
    smp.flags = RINGLM_SAMPLING_PROMPT_LOGPROBS;
    smp.prompt_logprobs = 21;
    cr_assert_eq(ringlm_request_check_ext(&rq, &smp, 0, &field), -EINVAL);
    cr_assert_str_eq(field, "prompt_logprobs");
    /* max_new_tokens 0 only for a prompt's log-probabilities */
    smp.prompt_logprobs = 0;
    rq.max_new_tokens = 0;
    cr_assert_eq(ringlm_request_check_ext(&rq, &smp, 0, &field), 0, "%s", ringlm_errdetail());
    smp.flags = 0;
    cr_assert_eq(ringlm_request_check_ext(&rq, &smp, 0, &field), -EINVAL);
    cr_assert_str_eq(field, "max_new_tokens");
    stop(&d, c);
}
